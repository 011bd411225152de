/*
 * gpt3_qkv bench — the QKV projection of a GPT-3 layer on one SIP: X (M, d_model) is
 * replicated on every PE, W_Q/W_K/W_V (d_model, d_model) are split column-wise over all PEs
 * (cube then PE), and each PE computes its column blocks of Q, K and V = X @ W_* with its own
 * replica of X (loaded to scratch) and its weight shard streamed from HBM by SchedulerV2.
 * GPT-3's d_model is 12288; the default is reduced to 1536 so the data check stays quick.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_tl.h"

enum { P_M, P_D };

/* X and W_Q/W_K/W_V: kb_bench_pattern values, written through fills (built only when
 * recording) */
static const kb_bench_pat pat_x = { .seed = 10, .range = 16, .den = 16.0f };
static const kb_bench_pat pat_w[3] = { { .seed = 11, .range = 32, .den = 64.0f },
                                       { .seed = 12, .range = 32, .den = 64.0f },
                                       { .seed = 13, .range = 32, .den = 64.0f } };

typedef struct qkv_state {
    float *x, *w[3]; /* verify only */
    kb_tensor *out[3];
} qkv_state;

/* [j]: Q, K, V */
typedef struct qkv_args {
    kb_va x, w[3], out[3];
    int64_t m, d;
    int64_t cols; /* of each weight and output per PE */
} qkv_args;

static void qkv_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const qkv_args *a = KB_KARGS_GET(ka, qkv_args);
    int64_t M = a->m, D = a->d, cols = a->cols;
    int shard = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    kb_val x = tl_load(tl, a->x + (kb_va)shard * (kb_va)(M * D * 2), KB_SHAPE2(M, D), KB_F16);
    for (int j = 0; j < 3; j++) {
        kb_val w = tl_ref(tl, a->w[j] + (kb_va)shard * (kb_va)(D * cols * 2),
                          KB_SHAPE2(D, cols), KB_F16);
        kb_val y = tl_dot(tl, x, w);
        tl_store(tl, a->out[j] + (kb_va)shard * (kb_va)(M * cols * 2), y);
        tl_free(tl, y);
    }
}

/* The roofline: 3 · 2·M·D² flops over the SIP's PEs; each PE reads its replica of X and its
 * column blocks of the three weights and writes its blocks of Q, K and V. */
static int qkv_roofline(kb_ctx *ctx, int64_t M, int64_t D, int64_t parts, kb_bench_result *res)
{
    kb_roofline_acc *acc;
    kb_roofline rl;
    double cols = (double)(D / parts);
    int rc = kb_roofline_acc_create(kb_ctx_machine(ctx), &acc, kb_ctx_err(ctx));
    if (rc)
        return rc;
    kb_roofline_flops(acc, KB_QF_F16, 0, 3.0 * 2.0 * (double)M * (double)D * (double)D,
                      (int)parts);
    for (int64_t j = 0; j < parts; j++)
        kb_roofline_mem_pe(acc, (int)j, 2.0 * ((double)(M * D) + 3.0 * (double)D * cols),
                           2.0 * 3.0 * (double)M * cols);
    kb_roofline_result(acc, &rl);
    kb_roofline_acc_destroy(acc);
    kb_bench_set_roofline(res, &rl);
    return 0;
}

static int qkv_run(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    static const char *wn[3] = { "w_q", "w_k", "w_v" }, *on[3] = { "q", "k", "v" };
    qkv_state *st = state;
    const kb_machine *m = kb_ctx_machine(ctx);
    int64_t M = args->p[P_M], D = args->p[P_D], parts = (int64_t)m->npes * m->ncubes;
    kb_dp_policy rep = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 0, 0);
    kb_dp_policy col = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, 0);
    kb_tensor_desc dx = { "x", M, D, KB_F16, rep, KB_MEM_HBM };
    qkv_args qa = { .m = M, .d = D, .cols = D / parts };
    kb_kargs ka;
    kb_tensor *tx, *tw;
    int rc;

    if (D % parts != 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_USAGE,
                          "gpt3_qkv: d_model=%lld must be a multiple of the SIP's %lld PEs",
                          (long long)D, (long long)parts);
    kb_bench_pat px = pat_x;
    px.ld = D;
    kb_fill fx = kb_bench_pattern_fill(&px);
    if ((rc = kb_tensor_from_fill(ctx, &dx, &fx, &tx)) != 0)
        return rc;
    qa.x = kb_tensor_va(tx);
    for (int j = 0; j < 3; j++) {
        kb_tensor_desc dw = { wn[j], D, D, KB_F16, col, KB_MEM_HBM };
        kb_tensor_desc dout = { on[j], M, D, KB_F16, col, KB_MEM_HBM };
        kb_bench_pat pw = pat_w[j];
        pw.ld = D;
        kb_fill fw = kb_bench_pattern_fill(&pw);
        if ((rc = kb_tensor_from_fill(ctx, &dw, &fw, &tw)) != 0 ||
            (rc = kb_tensor_empty(ctx, &dout, &st->out[j])) != 0)
            return rc;
        qa.w[j] = kb_tensor_va(tw);
        qa.out[j] = kb_tensor_va(st->out[j]);
    }
    memset(&ka, 0, sizeof ka);
    KB_KARGS_PUT(&ka, qa);
    kb_bench_mark_begin(ctx, res);
    kb_grid g = kb_grid_of(st->out[0]);
    if ((rc = kb_launch(ctx, "gpt3_qkv", qkv_kernel, &ka, &g)) != 0)
        return rc;
    kb_bench_mark_end(ctx, res);
    if ((rc = qkv_roofline(ctx, M, D, parts, res)) != 0)
        return rc;
    double flops = 3.0 * 2.0 * (double)M * (double)D * (double)D;
    kb_bench_add_extra(res, "gflops_simulated", flops / kb_time_to_ns(res->t_end - res->t_begin));
    snprintf(res->line, sizeof res->line, "  gpt3_qkv (M=%lld d_model=%lld f16 over %lld PEs)",
             (long long)M, (long long)D, (long long)parts);
    return 0;
}

static int qkv_verify(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    static const char *on[3] = { "q", "k", "v" };
    qkv_state *st = state;
    size_t M = (size_t)args->p[P_M], D = (size_t)args->p[P_D], n = M * D;
    uint16_t *raw = malloc(2 * n);
    float *got = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n), *bound = malloc(sizeof(double) * n);
    uint64_t h = KB_FNV1A64_INIT;
    int rc = 0;

    st->x = malloc(sizeof(float) * n);
    for (int j = 0; j < 3; j++)
        st->w[j] = malloc(sizeof(float) * D * D);
    if (!raw || !got || !ref || !bound || !st->x || !st->w[0] || !st->w[1] || !st->w[2]) {
        rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    kb_bench_pattern(st->x, n, pat_x.seed, pat_x.range, pat_x.den);
    for (int j = 0; j < 3; j++)
        kb_bench_pattern(st->w[j], D * D, pat_w[j].seed, pat_w[j].range, pat_w[j].den);
    res->verified = 1;
    for (int j = 0; j < 3; j++) {
        if ((rc = kb_tensor_read_raw(st->out[j], raw)) != 0)
            goto out;
        for (size_t i = 0; i < n; i++)
            got[i] = kb_f16_to_f32(raw[i]);
        kb_bench_ref_gemm(st->x, st->w[j], M, D, D, ref, bound);
        if (!kb_bench_check(res, KB_F16, got, ref, bound, n, on[j]))
            res->verified = 0;
        h = kb_fnv1a64(raw, 2 * n, h);
    }
    res->digest = h;
    res->have_digest = 1;
out:
    free(raw);
    free(got);
    free(ref);
    free(bound);
    return rc;
}

static void qkv_cleanup(void *state)
{
    qkv_state *st = state;
    free(st->x);
    for (int j = 0; j < 3; j++)
        free(st->w[j]);
}

const kb_bench kb_bench_gpt3_qkv = {
    .name = "gpt3_qkv",
    .summary = "GPT-3 QKV projection: X replicated, W_Q/W_K/W_V column-wise over all PEs of one SIP",
    .params = {
        { "m", 4, 1, 4096, "tokens (rows of X)" },
        { "d_model", 1536, 1, 12288, "model width (GPT-3: 12288; a multiple of the SIP's PEs)" },
    },
    .nparams = 2,
    .state_size = sizeof(qkv_state),
    .run = qkv_run,
    .verify = qkv_verify,
    .cleanup = qkv_cleanup,
};
