/*
 * gemm bench — f16 gemm C = A @ B of any size with tl_gemm: output tiles whose f32
 * accumulator fits the PE's scratch, each streamed from HBM through TCM by SchedulerV2 while
 * PE_GEMM computes, rounded once into C. With --param pes=P (default 1) the output tiles are
 * dealt round-robin to P PEs of SIP 0 (PEs 0..P-1 of cube 0 for P <= the PEs per cube, else
 * whole cubes: P a multiple of them). Operand placement: with one PE, A, B and C lie in that
 * PE's HBM slice (as they always have); with several, A and B are replicated into every
 * participating PE's own HBM slice (each PE streams its tiles' operands from its own slice,
 * as a data-parallel layout with local operand copies would) and C is one tensor in PE 0's
 * slice, so the other PEs' stores cross the NoC (and the UCIe links from other cubes).
 * Checked element-wise against an exact host product; C's bits do not depend on P.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_hostgemm.h"
#include "kb_machine.h"
#include "kb_tl.h"
#include "kb_tl_gemm.h"

enum { P_M, P_K, P_N, P_PES };

/* A and B: kb_bench_pattern values, written through fills (built only when recording) */
static const kb_bench_pat pat_a = { .seed = 1, .range = 8, .den = 16.0f },
                          pat_b = { .seed = 2, .range = 8, .den = 16.0f };

typedef struct gemm_state {
    kb_tensor *c;
} gemm_state;

typedef struct gemm_args {
    kb_va a, b, c;
    int64_t m, k, n;
    int64_t a_stride, b_stride; /* bytes between A's / B's replicas */
    int pes;
} gemm_args;

static void gemm_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const gemm_args *g = KB_KARGS_GET(ka, gemm_args);
    int64_t M = g->m, K = g->k, N = g->n;
    int part = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    kb_va va = g->a + (kb_va)(part * g->a_stride), vb = g->b + (kb_va)(part * g->b_stride);
    tl_gemm(tl, &(kb_gemm_op){ .c = g->c, .ldc = (uint32_t)N, .a = va, .lda = (uint32_t)K,
                               .b = vb, .ldb = (uint32_t)N, .m = (uint32_t)M, .n = (uint32_t)N,
                               .k = (uint32_t)K, .da = KB_F16, .db = KB_F16, .part = part,
                               .nparts = g->pes });
}

/* The gemm's roofline in this layout: the flops over the P PEs, A and B read once from their
 * slices, C written into PE 0's (kb_roofline_gemm). */
static int gemm_roofline(kb_ctx *ctx, int64_t M, int64_t N, int64_t K, int pes,
                         kb_bench_result *res)
{
    kb_roofline_acc *acc;
    kb_roofline rl;
    int rc = kb_roofline_acc_create(kb_ctx_machine(ctx), &acc, kb_ctx_err(ctx));
    if (rc)
        return rc;
    kb_roofline_gemm(acc, (uint64_t)M, (uint64_t)N, (uint64_t)K, 2, pes, 0);
    kb_roofline_result(acc, &rl);
    kb_roofline_acc_destroy(acc);
    kb_bench_set_roofline(res, &rl);
    return 0;
}

static int gemm_run(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    gemm_state *st = state;
    int64_t M = args->p[P_M], K = args->p[P_K], N = args->p[P_N];
    int pes = (int)args->p[P_PES];
    const kb_machine *mach = kb_ctx_machine(ctx);
    int per_cube = mach->npes, cubes = pes <= per_cube ? 1 : pes / per_cube;
    int grid_pes = pes <= per_cube ? pes : per_cube;
    kb_dp_policy one = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1);
    kb_dp_policy each = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, cubes, grid_pes);
    kb_tensor_desc da = { "a", M, K, KB_F16, each, KB_MEM_HBM };
    kb_tensor_desc db = { "b", K, N, KB_F16, each, KB_MEM_HBM };
    kb_tensor_desc dc = { "c", M, N, KB_F16, one, KB_MEM_HBM };
    kb_tensor *ta, *tb;
    kb_kargs ka;
    kb_grid g = { grid_pes, cubes, 1, -1 };
    kb_bench_pat pa = pat_a, pb = pat_b;
    int rc;

    if (pes > per_cube && (pes % per_cube != 0 || cubes > mach->ncubes))
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_USAGE,
                          "gemm: pes=%d: at most %d PEs of one cube, or whole cubes (a multiple "
                          "of %d, at most %d)", pes, per_cube, per_cube,
                          per_cube * mach->ncubes);
    pa.ld = K;
    pb.ld = N;
    kb_fill fa = kb_bench_pattern_fill(&pa), fb = kb_bench_pattern_fill(&pb);
    if ((rc = kb_tensor_from_fill(ctx, &da, &fa, &ta)) != 0 ||
        (rc = kb_tensor_from_fill(ctx, &db, &fb, &tb)) != 0 ||
        (rc = kb_tensor_empty(ctx, &dc, &st->c)) != 0)
        return rc;
    /* replica p (cube-major, then PE) is program p's: its own HBM slice */
    memset(&ka, 0, sizeof ka);
    KB_KARGS_PUT(&ka, (gemm_args){ .a = kb_tensor_va(ta), .b = kb_tensor_va(tb),
                                   .c = kb_tensor_va(st->c), .m = M, .k = K, .n = N, .pes = pes,
                                   .a_stride = (int64_t)kb_tensor_shard(ta, 0)->nbytes,
                                   .b_stride = (int64_t)kb_tensor_shard(tb, 0)->nbytes });
    kb_bench_mark_begin(ctx, res);
    if ((rc = kb_launch(ctx, "gemm", gemm_kernel, &ka, &g)) != 0)
        return rc;
    kb_bench_mark_end(ctx, res);
    if ((rc = gemm_roofline(ctx, M, N, K, pes, res)) != 0)
        return rc;
    double flops = 2.0 * (double)M * (double)N * (double)K;
    kb_bench_add_extra(res, "gflops_simulated", flops / kb_time_to_ns(res->t_end - res->t_begin));
    snprintf(res->line, sizeof res->line, "  gemm (%lldx%lldx%lld f16, %d PE%s)", (long long)M,
             (long long)K, (long long)N, pes, pes == 1 ? "" : "s");
    return 0;
}

static int gemm_verify(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    gemm_state *st = state;
    size_t M = (size_t)args->p[P_M], K = (size_t)args->p[P_K], N = (size_t)args->p[P_N];
    float *got = malloc(sizeof(float) * M * N);
    uint16_t *raw = malloc(2 * M * N);
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    int rc = KB_ERR_NOMEM, ok;

    if (!got || !raw || !a || !b) {
        kb_err_set(kb_ctx_err(ctx), rc, "out of memory");
        goto out;
    }
    kb_bench_pattern(a, M * K, pat_a.seed, pat_a.range, pat_a.den);
    kb_bench_pattern(b, K * N, pat_b.seed, pat_b.range, pat_b.den);
    if ((rc = kb_tensor_read_raw(st->c, raw)) != 0)
        goto out;
    for (size_t i = 0; i < M * N; i++)
        got[i] = kb_f16_to_f32(raw[i]);
    /* every element against the f64 product, row blocks on the host's cores */
    if ((ok = kb_hostgemm_check(res, KB_F16, got, a, b, M, N, K, "c")) < 0) {
        rc = kb_err_set(kb_ctx_err(ctx), ok, "out of memory");
        goto out;
    }
    res->verified = ok;
    res->digest = kb_fnv1a64(raw, 2 * M * N, KB_FNV1A64_INIT);
    res->have_digest = 1;
out:
    free(got);
    free(raw);
    free(a);
    free(b);
    return rc;
}

const kb_bench kb_bench_gemm = {
    .name = "gemm",
    .summary = "f16 gemm C = A @ B of any size (tl_gemm: scratch-sized output tiles streamed from "
               "HBM by SchedulerV2); pes > 1 deals the tiles to that many PEs of SIP 0, each with "
               "its own copy of A and B in its HBM slice, C in PE 0's",
    .params = {
        { "m", 256, 1, 65536, "rows of A and C" },
        { "k", 256, 1, 65536, "columns of A, rows of B" },
        { "n", 256, 1, 65536, "columns of B and C" },
        { "pes", 1, 1, 4096, "PEs of SIP 0 sharing the output tiles (<= a cube's PEs, or whole cubes)" },
    },
    .nparams = 4,
    .state_size = sizeof(gemm_state),
    .run = gemm_run,
    .verify = gemm_verify,
};
