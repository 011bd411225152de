/*
 * va_offset bench — Triton-style addressing over a sharded tensor: src and dst are (M, K)
 * f16 tensors split column-wise over the cubes and then the PEs of one SIP; every PE computes
 * its shard's address as base + shard_index * shard_bytes, loads that block and stores it to
 * the same place in dst. dst must equal src bit for bit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_tl.h"

enum { P_M, P_K };

/* src: kb_bench_pattern values, written through a fill (built only when recording) */
static const kb_bench_pat pat_src = { .seed = 3, .range = 1000, .den = 64.0f };

typedef struct va_state {
    float *src; /* verify only */
    kb_tensor *tsrc, *tdst;
} va_state;

typedef struct copy_args {
    kb_va src, dst;
    int64_t m, cols; /* a shard: m x cols */
} copy_args;

static void copy_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const copy_args *a = KB_KARGS_GET(ka, copy_args);
    int64_t M = a->m, cols = a->cols;
    int shard = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    kb_va off = (kb_va)shard * (kb_va)(M * cols * 2);
    kb_val v = tl_load(tl, a->src + off, KB_SHAPE2(M, cols), KB_F16);
    tl_store(tl, a->dst + off, v);
}

/* The roofline: a copy, every PE reading its M x cols block from its HBM slice and writing it
 * back there; nothing to compute, nothing crosses a link. */
static int va_roofline(kb_ctx *ctx, int64_t M, int64_t cols, int64_t parts, kb_bench_result *res)
{
    kb_roofline_acc *acc;
    kb_roofline rl;
    int rc = kb_roofline_acc_create(kb_ctx_machine(ctx), &acc, kb_ctx_err(ctx));
    if (rc)
        return rc;
    for (int64_t j = 0; j < parts; j++)
        kb_roofline_mem_pe(acc, (int)j, 2.0 * (double)(M * cols), 2.0 * (double)(M * cols));
    kb_roofline_result(acc, &rl);
    kb_roofline_acc_destroy(acc);
    kb_bench_set_roofline(res, &rl);
    return 0;
}

static int va_run(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    va_state *st = state;
    const kb_machine *m = kb_ctx_machine(ctx);
    int64_t M = args->p[P_M], K = args->p[P_K];
    int64_t parts = (int64_t)m->npes * m->ncubes;
    kb_dp_policy dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, 0);
    kb_tensor_desc ds = { "src", M, K, KB_F16, dp, KB_MEM_HBM };
    kb_tensor_desc dd = { "dst", M, K, KB_F16, dp, KB_MEM_HBM };
    kb_kargs ka;
    int rc;

    if (K % parts != 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_USAGE,
                          "va_offset: k=%lld must be a multiple of the SIP's %lld PEs", (long long)K,
                          (long long)parts);
    kb_bench_pat ps = pat_src;
    ps.ld = K;
    kb_fill fs = kb_bench_pattern_fill(&ps);
    if ((rc = kb_tensor_from_fill(ctx, &ds, &fs, &st->tsrc)) != 0 ||
        (rc = kb_tensor_empty(ctx, &dd, &st->tdst)) != 0)
        return rc;
    memset(&ka, 0, sizeof ka);
    KB_KARGS_PUT(&ka, (copy_args){ .src = kb_tensor_va(st->tsrc), .dst = kb_tensor_va(st->tdst),
                                   .m = M, .cols = K / parts });
    kb_bench_mark_begin(ctx, res);
    kb_grid g = kb_grid_of(st->tdst);
    if ((rc = kb_launch(ctx, "va_offset_copy", copy_kernel, &ka, &g)) != 0)
        return rc;
    kb_bench_mark_end(ctx, res);
    if ((rc = va_roofline(ctx, M, K / parts, parts, res)) != 0)
        return rc;
    snprintf(res->line, sizeof res->line, "  va_offset (%lldx%lld f16 over %lld PEs)",
             (long long)M, (long long)K, (long long)parts);
    return 0;
}

static int va_verify(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    va_state *st = state;
    size_t n = (size_t)(args->p[P_M] * args->p[P_K]);
    uint16_t *got = malloc(2 * n), *want = malloc(2 * n);
    int rc = 0;

    st->src = malloc(sizeof(float) * (n ? n : 1));
    if (!got || !want || !st->src) {
        rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    kb_bench_pattern(st->src, n, pat_src.seed, pat_src.range, pat_src.den);
    if ((rc = kb_tensor_read_raw(st->tdst, got)) != 0)
        goto out;
    for (size_t i = 0; i < n; i++)
        want[i] = kb_f32_to_f16(st->src[i]);
    res->verified = 1;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            snprintf(res->detail, sizeof res->detail,
                     "dst[%zu] = 0x%04x, expected 0x%04x (row %zu, column %zu)", i, got[i],
                     want[i], i / (size_t)args->p[P_K], i % (size_t)args->p[P_K]);
            res->verified = 0;
            break;
        }
    }
    res->have_err = 1;
    res->max_abs_err = res->verified ? 0.0 : 1.0 / 0.0;
    res->err_bound = 0.0;
    res->digest = kb_fnv1a64(got, 2 * n, KB_FNV1A64_INIT);
    res->have_digest = 1;
out:
    free(got);
    free(want);
    return rc;
}

static void va_cleanup(void *state)
{
    free(((va_state *)state)->src);
}

const kb_bench kb_bench_va_offset = {
    .name = "va_offset",
    .summary = "each PE copies its column shard via base + pid * stride addressing (cube/pe column_wise)",
    .params = {
        { "m", 64, 1, 1 << 20, "rows" },
        { "k", 1024, 1, 1 << 24, "columns (a multiple of the SIP's PE count)" },
    },
    .nparams = 2,
    .state_size = sizeof(va_state),
    .run = va_run,
    .verify = va_verify,
    .cleanup = va_cleanup,
};
