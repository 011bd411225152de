/*
 * ccl_allreduce bench — runs the collective chosen in ccl.yaml (ccl.defaults.algorithm, or
 * kbcl run --algorithm) in the legacy rank = PE world: rank r's tile of n_elem f16 values is
 * filled with r + 1, IPCQ is installed for the algorithm's topology, the kernel runs on every
 * rank, and every rank must then hold the expected value (sum(1..ws) for the all-reduces).
 * Reports algbw = tile bytes / time and the nccl-tests busbw = algbw * 2(ws-1)/ws.
 *
 * ipcq_deadlock bench — the same install on a ring, with a kernel in which every PE only
 * receives: the run must end in a deadlock report with every queue pair's pointers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_ccl.h"
#include "kb_dist.h"
#include "kb_tl.h"

#define KB_CCL_DEFAULT_N 32

typedef struct ccl_state {
    kb_ccl_job job;
    /* rank = SIP mode */
    int dist;
    int ws;
    int64_t n;
    char name[KB_CFG_NAME_MAX];
    kb_tensor *t[KB_MAX_GSIPS];
    kb_bench_result *res;
} ccl_state;

/* Resolves the algorithm entry and its parameters (algorithm > defaults) and prepares. */
static int ccl_setup(kb_ctx *ctx, ccl_state *st, const char *force_module, int force_ws,
                     const char *force_topo)
{
    const kb_ccl_cfg *cfg = kb_ccl_config_of(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    const char *name;
    const kb_ccl_algo *entry;
    const kb_ccl_algo_impl *impl;
    kb_ccl_params p;
    kb_ipcq_cfg icfg;

    if (!cfg)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    name = force_module ? force_module : cfg->defaults.algorithm;
    entry = force_module ? NULL : kb_ccl_config_find(cfg, name);

    if (!entry && !force_module)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s' is not defined in ccl.yaml", name);
    p = kb_ccl_config_params(cfg, entry);
    if (!force_module && entry && !strcmp(entry->module, "intercube_allreduce") && p.world_size)
        return kb_err_set(eb, KB_ERR_CONFIG, "intercube_allreduce runs one rank per SIP: it takes "
                          "no world_size (got %d)", p.world_size);
    if (!force_module && (p.world_size == 0 || !strcmp(entry->module, "intercube_allreduce"))) {
        /* rank = SIP: run through spawn + the process group (dist_run) */
        st->dist = 1;
        st->n = p.n_elem > 0 ? p.n_elem : KB_CCL_DEFAULT_N;
        snprintf(st->name, sizeof st->name, "%s", name);
        return 0;
    }
    impl = kb_ccl_algo_find(entry ? entry->module : name);
    if (!impl)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': unknown module '%s'", name,
                          entry ? entry->module : name);
    int ws = force_ws ? force_ws : p.world_size;
    memset(&icfg, 0, sizeof icfg);
    icfg.n_slots = p.n_slots;
    icfg.slot_size = p.slot_size;
    icfg.backpressure = p.backpressure != 0;
    if (!strcmp(p.buffer_kind, "tcm"))
        icfg.buffer_kind = KB_MEM_TCM;
    else if (!strcmp(p.buffer_kind, "hbm"))
        icfg.buffer_kind = KB_MEM_HBM;
    else if (!strcmp(p.buffer_kind, "sram"))
        icfg.buffer_kind = KB_MEM_SRAM;
    else
        return kb_err_set(eb, KB_ERR_CONFIG, "buffer_kind '%s' (tcm, hbm, sram)", p.buffer_kind);
    return kb_ccl_job_prepare(ctx, &st->job, impl, name,
                              force_topo ? force_topo : entry->topology, ws,
                              p.n_elem > 0 ? p.n_elem : KB_CCL_DEFAULT_N, &icfg, NULL);
}

/* One rank of the rank = SIP run: bind, join, fill with rank + 1, all-reduce. */
static int dist_worker(kb_ctx *ctx, int rank, void *arg)
{
    ccl_state *st = arg;
    int rc, shards;
    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||
        (rc = kb_dist_init_process_group(ctx, "ahbm", st->name)) != 0)
        return rc;
    shards = kb_dist_shards_per_rank(ctx);
    kb_tensor_desc d = { "tiles", shards, st->n, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
    float *data = malloc(sizeof(float) * (size_t)(shards * st->n));
    if (!data)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < shards * st->n; i++)
        data[i] = (float)(rank + 1);
    rc = kb_tensor_from_host(ctx, &d, data, &st->t[rank]);
    free(data);
    if (rc == 0)
        rc = kb_dist_barrier(ctx);
    if (rc)
        return rc;
    if (rank == 0)
        kb_bench_mark_begin(ctx, st->res);
    rc = kb_dist_all_reduce(ctx, st->t[rank], KB_DIST_SUM);
    if (rc == 0 && rank == 0)
        kb_bench_mark_end(ctx, st->res);
    return rc;
}

static void add_bw(kb_bench_result *res, int ws, int64_t n)
{
    double ns = kb_time_to_ns(res->t_end - res->t_begin), bytes = (double)n * 2.0;
    double algbw = bytes / ns; /* bytes per ns = GB/s */
    kb_bench_add_extra(res, "world_size", ws);
    kb_bench_add_extra(res, "n_elem", (double)n);
    kb_bench_add_extra(res, "bytes_per_rank", bytes);
    kb_bench_add_extra(res, "algbw_gbps", algbw);
    kb_bench_add_extra(res, "busbw_gbps", algbw * 2.0 * (ws - 1) / (double)ws);
}

static int ccl_run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    ccl_state *st = state;
    kb_ccl_job *job = &st->job;
    int rc;
    (void)a;
    if ((rc = ccl_setup(ctx, st, NULL, 0, NULL)) != 0)
        return rc;
    if (st->dist) {
        st->ws = kb_ctx_machine(ctx)->nsips;
        st->res = res;
        snprintf(res->line, sizeof res->line, "  %s (ws=%d)", st->name, st->ws);
        if ((rc = kb_spawn(ctx, dist_worker, st, st->ws)) != 0)
            return rc;
        /* bytes per rank: the whole tensor of the rank */
        add_bw(res, st->ws, st->n * kb_dist_shards_per_rank(ctx));
        return 0;
    }
    snprintf(res->line, sizeof res->line, "  %s (ws=%d)", job->name, job->layout.ws);
    kb_bench_mark_begin(ctx, res);
    if ((rc = kb_ccl_job_launch(ctx, job, NULL, NULL)) != 0)
        return rc;
    kb_bench_mark_end(ctx, res);
    add_bw(res, job->layout.ws, job->n);
    return 0;
}

/* rank = SIP: every shard of every rank must hold (shards per rank) * sum(1..ws). */
static int dist_verify(kb_ctx *ctx, ccl_state *st, kb_bench_result *res)
{
    size_t per = (size_t)kb_tensor_rows(st->t[0]) * (size_t)st->n;
    int shards = (int)kb_tensor_rows(st->t[0]), ok = 0, total = st->ws * shards;
    uint16_t want = kb_f32_to_f16((float)((double)shards * st->ws * (st->ws + 1) / 2.0));
    uint16_t *raw = malloc(per * 2);
    uint64_t h = KB_FNV1A64_INIT;
    double sum = 0.0;
    int rc = 0;
    if (!raw)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    for (int r = 0; r < st->ws && rc == 0; r++) {
        if ((rc = kb_tensor_read_raw(st->t[r], raw)) != 0)
            break;
        h = kb_fnv1a64(raw, per * 2, h);
        for (int s = 0; s < shards; s++) {
            int good = 1;
            for (int64_t i = 0; i < st->n; i++) {
                uint16_t got = raw[(size_t)s * (size_t)st->n + (size_t)i];
                sum += kb_f16_to_f32(got);
                good &= got == want;
            }
            ok += good;
        }
    }
    if (rc == 0) {
        res->digest = h;
        res->have_digest = 1;
        res->verified = ok == total;
        snprintf(res->ok_text, sizeof res->ok_text, "%d OK", ok);
        if (!res->verified)
            snprintf(res->detail, sizeof res->detail,
                     "got mean=%.6g, expected=%.6g (%d of %d shards wrong)",
                     sum / ((double)total * (double)st->n), (double)kb_f16_to_f32(want),
                     total - ok, total);
    }
    free(raw);
    return rc;
}

static int ccl_verify(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    ccl_state *st = state;
    kb_ccl_job *job = &st->job;
    if (st->dist)
        return dist_verify(ctx, st, res);
    int ws = job->layout.ws, ok_ranks = 0, bad = -1;
    size_t total = (size_t)ws * (size_t)job->n;
    uint16_t *raw = malloc(total * 2);
    double sum = 0.0, want_sum = 0.0;
    int rc;
    (void)a;

    if (!raw)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    if ((rc = kb_ccl_job_read(ctx, job, NULL, raw)) != 0)
        goto out;
    for (int r = 0; r < ws; r++) {
        uint16_t want = kb_f32_to_f16((float)job->impl->expected(r, ws));
        int good = 1;
        for (int64_t i = 0; i < job->n; i++) {
            uint16_t got = raw[(size_t)r * (size_t)job->n + (size_t)i];
            sum += kb_f16_to_f32(got);
            want_sum += kb_f16_to_f32(want);
            good &= got == want;
        }
        if (good)
            ok_ranks++;
        else if (bad < 0)
            bad = r;
    }
    res->digest = kb_fnv1a64(raw, total * 2, KB_FNV1A64_INIT);
    res->have_digest = 1;
    res->verified = ok_ranks == ws;
    snprintf(res->ok_text, sizeof res->ok_text, "%d OK", ok_ranks);
    if (!res->verified)
        snprintf(res->detail, sizeof res->detail,
                 "got mean=%.6g, expected=%.6g (%d of %d ranks wrong, first: rank %d)",
                 sum / (double)total, want_sum / (double)total, ws - ok_ranks, ws, bad);
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
    snprintf(res->line, sizeof res->line, "  ipcq_deadlock (ws=%d)", st->job.layout.ws);
    kb_bench_mark_begin(ctx, res);
    return kb_ccl_job_launch(ctx, &st->job, recv_only, "recv_only");
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
