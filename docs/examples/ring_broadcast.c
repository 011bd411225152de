/*
 * ring_broadcast — the example collective of docs/collectives.md: rank 0's tile travels once
 * around a one-directional ring (0 -> 1 -> ... -> ws-1) and every rank stores it. It runs in
 * the legacy rank = PE world through kb_ccl_job_prepare / kb_ccl_job_launch with its own
 * kernel, so it needs no entry in the library's algorithm registry (it is not registered).
 *
 * Every tile starts with kb_ccl_inputs' seeded values, and the result is checked as the bench
 * checks a library algorithm: the host reference (every rank gets rank 0's tile) through
 * kb_ccl_verify, bit for bit.
 * The main build makes it build/examples/ring_broadcast; CTest's example_ring_broadcast checks
 * that it prints what docs/collectives.md §7 quotes. By hand, from the repository root after
 * `cmake --build build` (it uses the kb_ccl layer and the three below it):
 *   gcc -I sched -I cl -I host -I host/config -I host/hw -I host/mem -I ccl \
 *       docs/examples/ring_broadcast.c build/libkb_ccl.a build/libkb_host.a build/libkb_cl.a \
 *       build/libkb_sched.a -lcjson -lyaml -lOpenCL -lm -o /tmp/ring_broadcast
 * Against an installed kbcl (docs/plugins.md "Installing kbcl"): docs/examples/CMakeLists.txt,
 * or cc docs/examples/ring_broadcast.c $(pkg-config --cflags --libs kbcl) -o /tmp/ring_broadcast
 * Limits: an example; a tile must fit one IPCQ slot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kbcl_ccl.h"

#define WS 8      /* ranks = PEs 0..7 of cube 0 */
#define N 32      /* f16 elements per tile */

/* The kernel: rank 0 sends E; every other rank receives from W, forwards E (except the last
 * rank) and stores. Rank 0 never receives, so the last rank sends nothing back to it. */
static void ring_broadcast(kb_tl *tl, const kb_kargs *a)
{
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS];
    int r = kb_ccl_rank(tl);
    kb_va mine = kb_ccl_my_tile(tl, a);

    if (ws < 2)
        return;
    if (r == 0) {
        tl_send(tl, KB_DIR_E, tl_load(tl, mine, KB_SHAPE1(n), KB_F16));
        return;
    }
    kb_val v = tl_recv(tl, KB_DIR_W, KB_SHAPE1(n), KB_F16);
    if (r + 1 < ws)
        tl_send(tl, KB_DIR_E, v);   /* forward first: the next hop starts sooner */
    tl_store(tl, mine, v);
}

static uint64_t bcast_msg(int64_t n, int ws) { (void)ws; return (uint64_t)n * 2u; }

/* The host reference: every rank ends with rank 0's tile. */
static void bcast_ref(const float *in, int ws, int64_t n, double *out)
{
    for (int r = 0; r < ws; r++)
        for (int64_t i = 0; i < n; i++)
            out[(size_t)r * (size_t)n + (size_t)i] = in[i];
}

/* What a registry entry would hold (kb_ccl_algos.c); here it only feeds kb_ccl_job_prepare. */
static const kb_ccl_algo_impl impl = {
    .module = "ring_broadcast",
    .summary = "rank 0's tile forwarded once around a one-directional ring",
    .kind = KB_COLL_BROADCAST,
    .topology = "ring_1d_unidir",
    .kernel = ring_broadcast,
    .max_msg_bytes = bcast_msg,
    .reference = bcast_ref,
};

typedef struct run {
    kb_ccl_job *job;
    double ns;
} run;

static int host(kb_ctx *ctx, void *arg)
{
    run *st = arg;
    kb_ipcq_cfg icfg = { 4, 4096, KB_MEM_TCM, 1, 1 };   /* n_slots, slot_size, buffer_kind, backpressure, posted */
    int rc = kb_ccl_job_create(ctx, &impl, impl.module, "ring_1d_unidir", WS, N, &icfg,
                               NULL, &st->job);       /* NULL: kb_ccl_inputs' seeded values */
    if (rc)
        return rc;
    kb_time t0 = kb_ctx_now(ctx);
    if ((rc = kb_ccl_job_launch(ctx, st->job, NULL, NULL)) != 0)
        return rc;
    st->ns = kb_time_to_ns(kb_ctx_now(ctx) - t0);
    return 0;
}

int main(void)
{
    static run st;
    static uint16_t out[WS * N];
    static float in[WS * N];
    static double ref[WS * N];
    kb_ccl_verdict v;
    kb_config *cfg = NULL;
    kb_ctx_opts opts = { .device = KB_DEV_REF };
    kb_ctx *ctx = NULL;
    kb_errbuf eb;
    int rc;

    if ((rc = kb_config_create(&cfg, &eb)) != 0 ||
        (rc = kb_ctx_create(cfg, &opts, &ctx, &eb)) != 0) {
        fprintf(stderr, "kb_ctx_create: %s\n", eb.msg);
        kb_config_destroy(cfg);
        return 1;
    }
    kb_config_destroy(cfg);
    rc = kb_ctx_run_host(ctx, host, &st);
    if (rc == 0)
        rc = kb_ccl_job_read(ctx, st.job, NULL, out);   /* replays the op log (Phase 2) */
    if (rc) {
        fprintf(stderr, "%s: %s\n", kb_strerror(rc), kb_ctx_errmsg(ctx));
        kb_ccl_job_destroy(st.job);
        kb_ctx_destroy(ctx);
        return 1;
    }
    kb_ccl_inputs(in, KB_CCL_INPUT_SEED, 0, WS, N);  /* what kb_ccl_job_prepare wrote */
    impl.reference(in, WS, N, ref);
    int pass = kb_ccl_verify(KB_F16, out, ref, WS, N, 0.0, &v);
    printf("  ring_broadcast (ws=%d): %d OK, %.3f ns, busbw factor %g\n", WS, v.ok_tiles, st.ns,
           kb_coll_busbw_factor(impl.kind, WS));
    kb_ccl_job_destroy(st.job);
    kb_ctx_destroy(ctx);
    return pass ? 0 : 1;
}
