/*
 * ccl_allreduce bench — runs the collective chosen in ccl.yaml (ccl.defaults.algorithm, or
 * kbcl run --algorithm) in the legacy rank = PE world: rank r's tile of n_elem f16 values is
 * filled with r + 1, IPCQ is installed for the algorithm's topology, the kernel runs on every
 * rank, and every rank must then hold the expected value (sum(1..ws) for the all-reduces).
 * Reports algbw = tile bytes / time and the nccl-tests busbw = algbw * 2(ws-1)/ws.
 *
 * ipcq_deadlock bench — the same install on a ring of 8 PEs, with a kernel in which every PE
 * only receives: the run must end in a deadlock report with every queue pair's pointers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_ccl.h"
#include "kb_tl.h"

#define KB_CCL_DEFAULT_N 32

typedef struct ccl_state {
    const kb_ccl_algo_impl *impl;
    char name[KB_CFG_NAME_MAX];
    kb_ccl_layout layout;
    int64_t n;
    kb_tensor *tiles[KB_MAX_GSIPS];
} ccl_state;

static int parse_kind(const char *s, kb_mem_kind *out)
{
    if (!strcmp(s, "tcm"))
        *out = KB_MEM_TCM;
    else if (!strcmp(s, "hbm"))
        *out = KB_MEM_HBM;
    else if (!strcmp(s, "sram"))
        *out = KB_MEM_SRAM;
    else
        return -1;
    return 0;
}

/* Resolves the algorithm entry, its parameters and the layout; installs IPCQ. */
static int ccl_setup(kb_ctx *ctx, ccl_state *st, const char *force_algo, int force_ws,
                     const char *force_topo)
{
    const kb_config *cfg = kb_ctx_config(ctx);
    kb_machine *m = kb_ctx_machine(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    const char *name = force_algo ? force_algo : cfg->ccl.defaults.algorithm;
    const kb_ccl_algo *entry = kb_config_find_algo(cfg, name);
    kb_ccl_params p;
    kb_ipcq_cfg icfg;
    const char *topo;
    int rc;

    if (!entry && !force_algo)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s' is not defined in ccl.yaml", name);
    p = kb_config_algo_params(cfg, entry);
    snprintf(st->name, sizeof st->name, "%s", name);
    st->impl = kb_ccl_algo_find(entry ? entry->module : name);
    if (!st->impl)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': unknown module '%s'", name,
                          entry ? entry->module : name);
    topo = force_topo ? force_topo : entry->topology;
    int ws = force_ws ? force_ws : p.world_size;
    if (ws == 0)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED,
                          "algorithm '%s' has no world_size: rank = SIP mode (one rank per SIP "
                          "through spawn) is not available yet; set ccl.algorithms.%s.world_size "
                          "or use --world-size for rank = PE mode", name, name);
    st->n = p.n_elem > 0 ? p.n_elem : KB_CCL_DEFAULT_N;
    if ((rc = kb_ccl_layout_legacy(m, ws, &st->layout, eb)) != 0)
        return rc;
    kb_ccl_geom g = { m->npes, st->layout.cubes };
    if (st->impl->check_ws && (rc = st->impl->check_ws(ws, &g, eb)) != 0)
        return rc;
    memset(&icfg, 0, sizeof icfg);
    icfg.n_slots = p.n_slots;
    icfg.slot_size = p.slot_size;
    icfg.backpressure = p.backpressure != 0;
    if (parse_kind(p.buffer_kind, &icfg.buffer_kind) != 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "buffer_kind '%s' (tcm, hbm, sram)", p.buffer_kind);
    uint64_t need = st->impl->max_msg_bytes(st->n, ws);
    if (need > icfg.slot_size)
        return kb_err_set(eb, KB_ERR_CONFIG,
                          "%s with n_elem=%lld sends messages of %llu bytes but slot_size is %llu "
                          "(raise ccl.defaults.slot_size)", name, (long long)st->n,
                          (unsigned long long)need, (unsigned long long)icfg.slot_size);

    /* one tile tensor per SIP: n f16 elements on each rank's PE (single_shard_per_rank) */
    for (int s = 0; s < st->layout.sips; s++) {
        kb_tensor_desc d = { "tiles", 1, st->n * st->layout.ranks_per_sip, KB_F16,
                             kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, st->layout.cubes,
                                   st->layout.pes), KB_MEM_HBM };
        float *data = malloc(sizeof(float) * (size_t)(st->n * st->layout.ranks_per_sip));
        if (!data)
            return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        for (int lr = 0; lr < st->layout.ranks_per_sip; lr++)
            for (int64_t i = 0; i < st->n; i++)
                data[(size_t)(lr * st->n + i)] = (float)(s * st->layout.ranks_per_sip + lr + 1);
        if ((rc = kb_ctx_set_device(ctx, s)) == 0)
            rc = kb_tensor_from_host(ctx, &d, data, &st->tiles[s]);
        free(data);
        if (rc)
            return rc;
        /* validator single_shard_per_rank: each rank's PE holds exactly its tile */
        for (size_t i = 0; i < kb_tensor_nshards(st->tiles[s]); i++) {
            const kb_shard_spec *sh = kb_tensor_shard(st->tiles[s], i);
            int rank = s * st->layout.ranks_per_sip + (int)(sh->cube * (unsigned)st->layout.pes + sh->pe);
            if (sh->nbytes != (uint64_t)st->n * 2 || kb_ccl_rank_pe(m, &st->layout, rank) !=
                                                          kb_machine_pe(m, sh->sip, sh->cube, sh->pe))
                return kb_err_set(eb, KB_ERR_STATE,
                                  "validator single_shard_per_rank: shard %zu of SIP %d is not "
                                  "rank %d's tile", i, s, rank);
        }
    }
    if ((rc = kb_ctx_set_device(ctx, 0)) != 0)
        return rc;
    return kb_ccl_install(ctx, topo, &st->layout, &icfg);
}

static int ccl_launch(kb_ctx *ctx, ccl_state *st, kb_kernel_fn kernel, const char *name)
{
    kb_kargs args[KB_MAX_GSIPS];
    kb_grid g = { st->layout.pes, st->layout.cubes, st->layout.sips, 0 };
    memset(args, 0, sizeof(kb_kargs) * (size_t)st->layout.sips);
    for (int s = 0; s < st->layout.sips; s++) {
        args[s].ptr[0] = kb_tensor_va(st->tiles[s]);
        args[s].i[KB_CCL_ARG_N] = st->n;
        args[s].i[KB_CCL_ARG_WS] = st->layout.ws;
        args[s].i[KB_CCL_ARG_PES] = st->layout.pes;
        args[s].i[KB_CCL_ARG_CUBES] = st->layout.cubes;
        args[s].i[KB_CCL_ARG_SIPS] = st->layout.sips;
    }
    return kb_launch_per_sip(ctx, name, kernel, args, &g);
}

static int ccl_run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    ccl_state *st = state;
    int rc;
    (void)a;
    if ((rc = ccl_setup(ctx, st, NULL, 0, NULL)) != 0)
        return rc;
    snprintf(res->line, sizeof res->line, "  %s (ws=%d)", st->name, st->layout.ws);
    kb_bench_mark_begin(ctx, res);
    if ((rc = ccl_launch(ctx, st, st->impl->kernel, st->name)) != 0)
        return rc;
    kb_bench_mark_end(ctx, res);
    double ns = kb_time_to_ns(res->t_end - res->t_begin), bytes = (double)st->n * 2.0;
    double algbw = bytes / ns; /* bytes per ns = GB/s */
    kb_bench_add_extra(res, "world_size", st->layout.ws);
    kb_bench_add_extra(res, "n_elem", (double)st->n);
    kb_bench_add_extra(res, "bytes_per_rank", bytes);
    kb_bench_add_extra(res, "algbw_gbps", algbw);
    kb_bench_add_extra(res, "busbw_gbps",
                       algbw * 2.0 * (st->layout.ws - 1) / (double)st->layout.ws);
    return 0;
}

static int ccl_verify(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    ccl_state *st = state;
    int ws = st->layout.ws, ok_ranks = 0, bad = -1;
    size_t per = (size_t)st->n * (size_t)st->layout.ranks_per_sip;
    uint16_t *raw = malloc(per * 2);
    double sum = 0.0, want_sum = 0.0;
    uint64_t h = KB_FNV1A64_INIT;
    int rc = 0;
    (void)a;

    if (!raw)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    for (int s = 0; s < st->layout.sips; s++) {
        if ((rc = kb_tensor_read_raw(st->tiles[s], raw)) != 0)
            goto out;
        h = kb_fnv1a64(raw, per * 2, h);
        for (int lr = 0; lr < st->layout.ranks_per_sip; lr++) {
            int r = s * st->layout.ranks_per_sip + lr, good = 1;
            double want = st->impl->expected(r, ws);
            uint16_t want_bits = kb_f32_to_f16((float)want);
            for (int64_t i = 0; i < st->n; i++) {
                uint16_t got = raw[(size_t)lr * (size_t)st->n + (size_t)i];
                sum += kb_f16_to_f32(got);
                want_sum += kb_f16_to_f32(want_bits);
                good &= got == want_bits;
            }
            if (good)
                ok_ranks++;
            else if (bad < 0)
                bad = r;
        }
    }
    res->digest = h;
    res->have_digest = 1;
    res->verified = ok_ranks == ws;
    snprintf(res->ok_text, sizeof res->ok_text, "%d OK", ok_ranks);
    if (!res->verified) {
        double total = (double)ws * (double)st->n;
        snprintf(res->detail, sizeof res->detail,
                 "got mean=%.6g, expected=%.6g (%d of %d ranks wrong, first: rank %d)",
                 sum / total, want_sum / total, ws - ok_ranks, ws, bad);
    }
out:
    free(raw);
    return rc;
}

const kb_bench kb_bench_ccl_allreduce = {
    "ccl_allreduce",
    "the collective of ccl.yaml (--algorithm/--world-size/--n-elem/--buffer-kind), verified",
    { { NULL, 0, 0, 0, NULL } },
    0,
    sizeof(ccl_state),
    ccl_run,
    ccl_verify,
    NULL,
};

/* ---- ipcq_deadlock ---- */

static void recv_only(kb_tl *tl, const kb_kargs *a)
{
    kb_val v = tl_recv(tl, KB_DIR_W, KB_SHAPE1(a->i[KB_CCL_ARG_N]), KB_F16);
    tl_store(tl, kb_ccl_my_tile(tl, a), v);
}

static int deadlock_run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    ccl_state *st = state;
    int rc;
    if ((rc = ccl_setup(ctx, st, "ring_allreduce", (int)a->p[0], "ring_1d")) != 0)
        return rc;
    snprintf(res->line, sizeof res->line, "  ipcq_deadlock (ws=%d)", st->layout.ws);
    kb_bench_mark_begin(ctx, res);
    return ccl_launch(ctx, st, recv_only, "recv_only");
}

const kb_bench kb_bench_ipcq_deadlock = {
    "ipcq_deadlock",
    "every PE of a ring only receives: must end in a deadlock report (exit 3)",
    { { "world_size", 8, 2, 8192, "ranks (PEs) in the ring" } },
    1,
    sizeof(ccl_state),
    deadlock_run,
    NULL,
    NULL,
};
