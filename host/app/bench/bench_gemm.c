/*
 * gemm bench — one PE multiplies two HBM-resident f16 matrices (C = A @ B): the operands are
 * tl_ref handles, so SchedulerV2 streams them through TCM in tiles while PE_GEMM computes;
 * the f32 result is rounded once into C. Checked element-wise against an exact host product.
 */
#include <stdlib.h>
#include <stdio.h>

#include "kb_bench.h"
#include "kb_tl.h"

enum { P_M, P_K, P_N };

/* A and B: kb_bench_pattern values, written through fills (built only when recording) */
static const kb_bench_pat pat_a = { 1, 8, 16.0f, 0, 0 }, pat_b = { 2, 8, 16.0f, 0, 0 };

typedef struct gemm_state {
    float *a, *b; /* verify only */
    kb_tensor *c;
} gemm_state;

static void gemm_kernel(kb_tl *tl, const kb_kargs *a)
{
    int64_t M = a->i[0], K = a->i[1], N = a->i[2];
    kb_val va = tl_ref(tl, a->ptr[0], KB_SHAPE2(M, K), KB_F16);
    kb_val vb = tl_ref(tl, a->ptr[1], KB_SHAPE2(K, N), KB_F16);
    kb_val vc = tl_dot(tl, va, vb);
    tl_store(tl, a->ptr[2], vc);
}

static int gemm_run(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    gemm_state *st = state;
    int64_t M = args->p[P_M], K = args->p[P_K], N = args->p[P_N];
    kb_dp_policy one = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1);
    kb_tensor_desc da = { "a", M, K, KB_F16, one, KB_MEM_HBM };
    kb_tensor_desc db = { "b", K, N, KB_F16, one, KB_MEM_HBM };
    kb_tensor_desc dc = { "c", M, N, KB_F16, one, KB_MEM_HBM };
    kb_tensor *ta, *tb;
    kb_kargs ka = { { 0 }, { M, K, N }, { 0 } };
    kb_bench_pat pa = pat_a, pb = pat_b;
    int rc;

    pa.ld = K;
    pb.ld = N;
    kb_fill fa = kb_bench_pattern_fill(&pa), fb = kb_bench_pattern_fill(&pb);
    if ((rc = kb_tensor_from_fill(ctx, &da, &fa, &ta)) != 0 ||
        (rc = kb_tensor_from_fill(ctx, &db, &fb, &tb)) != 0 ||
        (rc = kb_tensor_empty(ctx, &dc, &st->c)) != 0)
        return rc;
    ka.ptr[0] = kb_tensor_va(ta);
    ka.ptr[1] = kb_tensor_va(tb);
    ka.ptr[2] = kb_tensor_va(st->c);
    kb_bench_mark_begin(ctx, res);
    kb_grid g = kb_grid_of(st->c);
    if ((rc = kb_launch(ctx, "gemm", gemm_kernel, &ka, &g)) != 0)
        return rc;
    kb_bench_mark_end(ctx, res);
    double flops = 2.0 * (double)M * (double)N * (double)K;
    kb_bench_add_extra(res, "gflops_simulated", flops / kb_time_to_ns(res->t_end - res->t_begin));
    snprintf(res->line, sizeof res->line, "  gemm (%lldx%lldx%lld f16, 1 PE)", (long long)M,
             (long long)K, (long long)N);
    return 0;
}

static int gemm_verify(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    gemm_state *st = state;
    size_t M = (size_t)args->p[P_M], K = (size_t)args->p[P_K], N = (size_t)args->p[P_N];
    float *got = malloc(sizeof(float) * M * N);
    uint16_t *raw = malloc(2 * M * N);
    double *ref = malloc(sizeof(double) * M * N), *bound = malloc(sizeof(double) * M * N);
    int rc = KB_ERR_NOMEM;

    st->a = malloc(sizeof(float) * M * K);
    st->b = malloc(sizeof(float) * K * N);
    if (!got || !raw || !ref || !bound || !st->a || !st->b) {
        kb_err_set(kb_ctx_err(ctx), rc, "out of memory");
        goto out;
    }
    kb_bench_pattern(st->a, M * K, pat_a.seed, pat_a.range, pat_a.den);
    kb_bench_pattern(st->b, K * N, pat_b.seed, pat_b.range, pat_b.den);
    if ((rc = kb_tensor_read_raw(st->c, raw)) != 0)
        goto out;
    for (size_t i = 0; i < M * N; i++)
        got[i] = kb_f16_to_f32(raw[i]);
    kb_bench_ref_gemm(st->a, st->b, M, N, K, ref, bound);
    res->verified = kb_bench_check(res, KB_F16, got, ref, bound, M * N, "c");
    res->digest = kb_fnv1a64(raw, 2 * M * N, KB_FNV1A64_INIT);
    res->have_digest = 1;
out:
    free(got);
    free(raw);
    free(ref);
    free(bound);
    return rc;
}

static void gemm_cleanup(void *state)
{
    gemm_state *st = state;
    free(st->a);
    free(st->b);
}

const kb_bench kb_bench_gemm = {
    "gemm",
    "single-PE f16 gemm C = A @ B, HBM operands streamed by SchedulerV2",
    {
        { "m", 256, 1, 65536, "rows of A and C" },
        { "k", 256, 1, 65536, "columns of A, rows of B" },
        { "n", 256, 1, 65536, "columns of B and C" },
    },
    3,
    sizeof(gemm_state),
    gemm_run,
    gemm_verify,
    gemm_cleanup,
    0, /* takes no --size */
};
