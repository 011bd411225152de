/*
 * plugin_test — the plugins tests/test_plugin.c loads, one shared object per variant (the
 * build compiles this file once per PT_* macro, tests/CMakeLists.txt):
 *   PT_NOINIT      exports kbcl_plugin_abi but no kbcl_plugin_init (not a kbcl plugin)
 *   PT_NOABI       exports kbcl_plugin_init but no kbcl_plugin_abi
 *   PT_ABI99       built for another ABI version (kbcl_plugin_abi = 99)
 *   PT_CLASH       registers a rank = PE algorithm named ring_rsag_allreduce (a built-in)
 *   PT_BENCHCLASH  registers a bench named gemm (a built-in)
 *   PT_DUP         registers my_ring (the example plugin's algorithm)
 *   PT_REFUSE      its init refuses with a message
 *   PT_SIP         a good plugin: my_sip, the built-in intercube form under another name (an
 *                  entry with a rank = SIP form only)
 *   PT_OLD         a good plugin built before `ordered` was appended to kb_ccl_algo_impl: its
 *                  entry's head says the shorter size (loads; `ordered` reads NULL)
 *   PT_NEWER       an entry of a version this kbcl does not know yet (refused by name)
 *   PT_NOHEAD      an entry without a head (refused by name)
 *   PT_BADSIZE     an entry whose head's size is no version's (refused by name)
 */
#include <stddef.h>
#include <stdio.h>

#include "kbcl_plugin.h"

#if defined(PT_ABI99)
KB_PLUGIN_EXPORT const int kbcl_plugin_abi = 99;
#elif !defined(PT_NOABI)
KB_PLUGIN_DECLARE_ABI;
#endif

#if defined(PT_CLASH) || defined(PT_DUP) || defined(PT_ABI99) || defined(PT_NOABI) || \
    defined(PT_OLD) || defined(PT_NEWER) || defined(PT_NOHEAD) || defined(PT_BADSIZE)
static void nothing(kb_tl *tl, const kb_kargs *a)
{
    (void)tl;
    (void)a;
}

static uint64_t msg(int64_t n, int ws)
{
    (void)ws;
    return (uint64_t)n * 2;
}

static const kb_ccl_algo_impl algo = {
#if defined(PT_OLD)
    /* what a plugin compiled before `ordered` existed carries: the size up to it */
    .head = { (uint32_t)offsetof(kb_ccl_algo_impl, ordered), KB_CCL_ALGO_VERSION },
    .module = "my_old",
#elif defined(PT_NEWER)
    .head = { (uint32_t)sizeof(kb_ccl_algo_impl), KB_CCL_ALGO_VERSION + 1 },
    .module = "my_newer",
#elif defined(PT_NOHEAD)
    .module = "my_headless",
#elif defined(PT_BADSIZE)
    .head = { 40, KB_CCL_ALGO_VERSION },
    .module = "my_badsize",
#else
    .head = KB_CCL_ALGO_HEAD,
#if defined(PT_CLASH)
    .module = "ring_rsag_allreduce",
#elif defined(PT_DUP)
    .module = "my_ring",
#else
    .module = "never_registered",
#endif
#endif
    .summary = "test entry",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "ring_1d",
    .kernel = nothing,
    .max_msg_bytes = msg,
    .reference = kb_ccl_ref_allreduce,
};
#endif

#if defined(PT_BENCHCLASH)
static int run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    (void)ctx;
    (void)a;
    (void)state;
    (void)res;
    return 0;
}

static const kb_bench bench = {
    .head = KB_BENCH_HEAD,
    .name = "gemm",
    .summary = "test entry",
    .run = run,
};
#endif

#if defined(PT_SIP)
/* the built-in intercube form under another name: an entry with a rank = SIP form only */
static const kb_ccl_algo_impl sip = {
    .head = KB_CCL_ALGO_HEAD,
    .module = "my_sip",
    .summary = "the intercube all-reduce, registered by a plugin",
    .kind = KB_COLL_ALLREDUCE,
    .sip = &kb_ccl_sip_intercube,
};
#endif

#if !defined(PT_NOINIT)
int kbcl_plugin_init(kb_plugin_reg *reg, int abi_version)
{
    (void)abi_version;
#if defined(PT_REFUSE)
    kb_err_set(reg->err, KB_ERR_CONFIG, "plugin_refuse wants a GPU it cannot find");
    return -1;
#elif defined(PT_BENCHCLASH)
    return reg->add_bench(reg, &bench);
#elif defined(PT_SIP)
    reg->describe(reg, "plugin_sip", "test: a rank = SIP algorithm");
    return reg->add_ccl_algo(reg, &sip);
#else
    /* PT_CLASH, PT_DUP, PT_NEWER, PT_NOHEAD and PT_BADSIZE ignore the refusal on purpose: the
     * loader must refuse anyway */
    reg->add_ccl_algo(reg, &algo);
    return 0;
#endif
}
#endif
