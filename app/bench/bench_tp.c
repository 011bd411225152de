/*
 * Tensor-parallel benches (rank = SIP, one worker per SIP, process group on
 * hierarchical_allreduce):
 *  tp_mlp        x -> ColumnParallelLinear(d, hidden) + bias -> GeLU -> RowParallelLinear(hidden,
 *                d) + bias (all-reduce); every rank's output is checked against a host
 *                reference and all ranks' outputs must be identical.
 *  tp_attention  multi-head self-attention: heads split over the ranks (column-parallel
 *                Q/K/V: rank r owns heads [r*H/ws, (r+1)*H/ws)), one head per PE: q = x Wq_h,
 *                k^T = Wk_h^T x^T, v = x Wv_h, softmax(q k^T / sqrt(dh)) v, then the
 *                row-parallel output projection o_h Wo_h summed over heads and ranks by the
 *                all-reduce, plus bias. Checked against a host reference.
 * Both report the simulated time split into compute and communication (time inside
 * collectives) and, per collective (all_reduce, all_gather, reduce_scatter), the bytes each
 * rank sent over inter-SIP links in the measured region (kb_dist_traffic / ws).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_dist.h"
#include "kb_tl.h"
#include "kb_tp.h"
#include "kb_tp_roofline.h"

/* The benches' inputs: kb_bench_pattern(seed, range, den) matrices. The runs write them
 * through fills (nothing is built unless the run records); verify builds the arrays the host
 * reference needs. */
enum { MLP_X, MLP_W1, MLP_B1, MLP_W2, MLP_B2, ATT_X, ATT_WQ, ATT_WK, ATT_WV, ATT_WO, ATT_BO, NPAT };
static const struct { uint32_t seed; int range; float den; } pats[NPAT] = {
    [MLP_X] = { 21, 16, 16.0f }, [MLP_W1] = { 22, 8, 64.0f }, [MLP_B1] = { 23, 8, 16.0f },
    [MLP_W2] = { 24, 8, 64.0f }, [MLP_B2] = { 25, 8, 16.0f },
    [ATT_X] = { 31, 16, 16.0f }, [ATT_WQ] = { 32, 8, 64.0f }, [ATT_WK] = { 33, 8, 64.0f },
    [ATT_WV] = { 34, 8, 64.0f }, [ATT_WO] = { 35, 8, 64.0f }, [ATT_BO] = { 36, 8, 16.0f },
};

typedef struct tp_state {
    int ws;
    int64_t m, d, hid, heads;
    /* verify only: */
    float *x, *w1, *b1, *w2, *b2;          /* mlp (w1: d x hid, w2: hid x d) */
    float *wq, *wk, *wv, *wo, *bo;        /* attention (d x d each, bo: d) */
    kb_tensor *y[KB_MAX_GSIPS];
    kb_bench_result *res;
    kb_time comm;
    /* inter-SIP bytes of all_reduce, all_gather, reduce_scatter (all ranks) in the region */
    uint64_t sip_bytes[3];
} tp_state;

static const kb_coll_kind tp_colls[3] = { KB_COLL_ALLREDUCE, KB_COLL_ALLGATHER,
                                          KB_COLL_REDUCE_SCATTER };

static void tp_cleanup(void *p)
{
    tp_state *st = p;
    float *all[] = { st->x, st->w1, st->b1, st->w2, st->b2, st->wq, st->wk, st->wv, st->wo, st->bo };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static float *pattern(size_t n, int which)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    if (p)
        kb_bench_pattern(p, n, pats[which].seed, pats[which].range, pats[which].den);
    return p;
}

/* Pattern `which` as a rows x ld matrix (transposed view with transpose). */
static kb_bench_pat pat(int which, int64_t ld, int transpose)
{
    kb_bench_pat p = { .seed = pats[which].seed, .range = pats[which].range,
                       .den = pats[which].den, .ld = ld, .transpose = transpose };
    return p;
}

/* The rank = SIP entry of ccl.yaml, or the bare module when no ccl.yaml is loaded. */
static const char *tp_algorithm(kb_ctx *ctx)
{
    return kb_ccl_config_find(kb_ccl_config_of(ctx), "hierarchical_allreduce_sip")
               ? "hierarchical_allreduce_sip" : "hierarchical_allreduce";
}

static int tp_begin(kb_ctx *ctx, tp_state *st, int rank)
{
    int rc;
    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||
        (rc = kb_dist_init_process_group(ctx, "ahbm", tp_algorithm(ctx))) != 0 ||
        (rc = kb_tp_initialize_model_parallel(ctx, st->ws)) != 0)
        return rc;
    return 0;
}

static int tp_mark(kb_ctx *ctx, tp_state *st, int rank, int end)
{
    int rc = kb_dist_barrier(ctx);
    if (rc == 0 && rank == 0) {
        if (end)
            kb_bench_mark_end(ctx, st->res);
        else
            kb_bench_mark_begin(ctx, st->res);
        for (int i = 0; i < 3; i++) {
            uint64_t calls, bytes;
            kb_dist_traffic(ctx, tp_colls[i], &calls, &bytes);
            st->sip_bytes[i] = end ? bytes - st->sip_bytes[i] : bytes;
        }
    }
    return rc;
}

/* ---- tp_mlp ---- */

static int mlp_worker(kb_ctx *ctx, int rank, void *arg)
{
    tp_state *st = arg;
    kb_tp_linear fc1, fc2;
    kb_tensor *x, *h;
    kb_bench_pat px = pat(MLP_X, st->d, 0), pw1 = pat(MLP_W1, st->hid, 0),
                 pb1 = pat(MLP_B1, st->hid, 0), pw2 = pat(MLP_W2, st->d, 0),
                 pb2 = pat(MLP_B2, st->d, 0);
    kb_fill fx = kb_bench_pattern_fill(&px), fw1 = kb_bench_pattern_fill(&pw1),
            fb1 = kb_bench_pattern_fill(&pb1), fw2 = kb_bench_pattern_fill(&pw2),
            fb2 = kb_bench_pattern_fill(&pb2);
    int rc;
    if ((rc = tp_begin(ctx, st, rank)) != 0 ||
        (rc = kb_tp_column_linear_fill(ctx, st->d, st->hid, &fw1, &fb1, &fc1)) != 0 ||
        (rc = kb_tp_row_linear_fill(ctx, st->hid, st->d, &fw2, &fb2, &fc2)) != 0 ||
        (rc = kb_tp_input_fill(ctx, &fc1, st->m, &fx, &x)) != 0 ||
        (rc = tp_mark(ctx, st, rank, 0)) != 0)
        return rc;
    kb_time c0 = kb_dist_comm_time(ctx);
    if ((rc = kb_tp_column_forward(ctx, &fc1, x, 1, &h)) != 0 ||
        (rc = kb_tp_row_forward(ctx, &fc2, h, &st->y[rank])) != 0)
        return rc;
    if (rank == 0)
        st->comm = kb_dist_comm_time(ctx) - c0;
    return tp_mark(ctx, st, rank, 1);
}

static int check_common(kb_ctx *ctx, tp_state *st, const double *ref, const double *bound,
                        kb_bench_result *res)
{
    kb_machine *m = kb_ctx_machine(ctx);
    size_t S = (size_t)m->ncubes * (size_t)m->npes, blk = (size_t)(st->m * st->d);
    uint16_t *raw = malloc(S * blk * 2), *first = malloc(blk * 2);
    float *got = malloc(sizeof(float) * blk);
    uint64_t h = KB_FNV1A64_INIT;
    int rc = 0;
    if (!raw || !first || !got) {
        rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    res->verified = 1;
    for (int r = 0; r < st->ws; r++) {
        if ((rc = kb_tensor_read_raw(st->y[r], raw)) != 0)
            goto out;
        if (r == 0) {
            memcpy(first, raw, blk * 2);
            for (size_t i = 0; i < blk; i++)
                got[i] = kb_f16_to_f32(raw[i]);
            if (!kb_bench_check(res, KB_F16, got, ref, bound, blk, "y"))
                res->verified = 0;
            h = kb_fnv1a64(raw, blk * 2, h);
        }
        /* every PE of every rank holds the same output */
        for (size_t s = 0; s < S && res->verified; s++) {
            if (memcmp(raw + s * blk, first, blk * 2) != 0) {
                snprintf(res->detail, sizeof res->detail,
                         "rank %d PE block %zu differs from rank 0's output", r, s);
                res->verified = 0;
            }
        }
    }
    res->digest = h;
    res->have_digest = 1;
    snprintf(res->ok_text, sizeof res->ok_text, "%d ranks OK", st->ws);
out:
    free(raw);
    free(first);
    free(got);
    return rc;
}

static double gelu_d(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static void split_time(kb_ctx *ctx, tp_state *st, kb_bench_result *res)
{
    (void)ctx;
    double total = kb_time_to_ns(res->t_end - res->t_begin), comm = kb_time_to_ns(st->comm);
    kb_bench_add_extra(res, "world_size", st->ws);
    kb_bench_add_extra(res, "compute_ns", total - comm);
    kb_bench_add_extra(res, "comm_ns", comm);
    /* bytes each rank sent over inter-SIP links, per collective (kb_dist_traffic / ws) */
    kb_bench_add_extra(res, "all_reduce_sip_bytes", (double)st->sip_bytes[0] / st->ws);
    kb_bench_add_extra(res, "all_gather_sip_bytes", (double)st->sip_bytes[1] / st->ws);
    kb_bench_add_extra(res, "reduce_scatter_sip_bytes", (double)st->sip_bytes[2] / st->ws);
}

static int mlp_run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    tp_state *st = state;
    kb_roofline rl;
    int rc;
    st->ws = kb_ctx_machine(ctx)->nsips;
    st->m = a->p[0];
    st->d = a->p[1];
    st->hid = a->p[2];
    st->res = res;
    snprintf(res->line, sizeof res->line, "  tp_mlp (tp=%d, m=%lld d=%lld hidden=%lld)", st->ws,
             (long long)st->m, (long long)st->d, (long long)st->hid);
    if ((rc = kb_spawn(ctx, mlp_worker, st, st->ws)) != 0 ||
        (rc = kb_tp_roofline_mlp(kb_ctx_machine(ctx), st->m, st->d, st->hid, &rl,
                                 kb_ctx_err(ctx))) != 0)
        return rc;
    kb_bench_set_roofline(res, &rl);
    split_time(ctx, st, res);
    return 0;
}

static int mlp_verify(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    tp_state *st = state;
    size_t M = (size_t)st->m, D = (size_t)st->d, H = (size_t)st->hid;
    double *h = malloc(sizeof(double) * M * H), *ref = malloc(sizeof(double) * M * D),
           *bound = malloc(sizeof(double) * M * D);
    int rc;
    (void)a;
    st->x = pattern(M * D, MLP_X);
    st->w1 = pattern(D * H, MLP_W1);
    st->b1 = pattern(H, MLP_B1);
    st->w2 = pattern(H * D, MLP_W2);
    st->b2 = pattern(D, MLP_B2);
    if (!h || !ref || !bound || !st->x || !st->w1 || !st->b1 || !st->w2 || !st->b2) {
        free(h), free(ref), free(bound);
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < H; j++) {
            double s = st->b1[j];
            for (size_t k = 0; k < D; k++)
                s += (double)st->x[i * D + k] * st->w1[k * H + j];
            /* the device keeps h in f16 between the layers */
            h[i * H + j] = kb_f16_to_f32(kb_f32_to_f16((float)gelu_d(s)));
        }
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < D; j++) {
            double s = st->b2[j], sa = 0.0;
            for (size_t k = 0; k < H; k++) {
                s += h[i * H + k] * st->w2[k * D + j];
                sa += fabs(h[i * H + k] * st->w2[k * D + j]);
            }
            ref[i * D + j] = s;
            /* h may differ from the reference by one f16 ulp (f32 vs double before its
             * rounding): 2^-10 relative per term, plus f32 accumulation */
            bound[i * D + j] = sa * (ldexp(1.0, -10) + (double)H * ldexp(1.0, -24)) + 1e-6;
        }
    rc = check_common(ctx, st, ref, bound, res);
    free(h);
    free(ref);
    free(bound);
    return rc;
}

/* ---- tp_attention ---- */

/* the rank's heads, per PE: x (S x d), its transpose xT (d x S), the PE's columns of Wq and
 * Wv, its rows of Wk^T and Wo; partial: the PE's S x d f32 block */
typedef struct attn_args {
    kb_va x, xT, wq, wkT, wv, wo, partial;
    int64_t S, d, dh;
    double scale; /* 1/sqrt(dh) */
} attn_args;

static void attn_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const attn_args *a = KB_KARGS_GET(ka, attn_args);
    int64_t S = a->S, d = a->d, dh = a->dh;
    int j = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    kb_va xo = (kb_va)j * (kb_va)(S * d * 2), wo = (kb_va)j * (kb_va)(d * dh * 2);
    kb_val x = tl_load(tl, a->x + xo, KB_SHAPE2(S, d), KB_F16);
    kb_val xT = tl_load(tl, a->xT + xo, KB_SHAPE2(d, S), KB_F16);
    kb_val q = tl_dot(tl, x, tl_ref(tl, a->wq + wo, KB_SHAPE2(d, dh), KB_F16));
    kb_val kT = tl_dot(tl, tl_ref(tl, a->wkT + wo, KB_SHAPE2(dh, d), KB_F16), xT);
    kb_val v = tl_dot(tl, x, tl_ref(tl, a->wv + wo, KB_SHAPE2(d, dh), KB_F16));
    kb_val s = tl_dot(tl, q, kT);
    kb_val ss = tl_scale(tl, s, (float)a->scale, 0.0f);
    kb_val p = tl_softmax(tl, ss, 1);
    kb_val o = tl_dot(tl, p, v);
    kb_val part = tl_dot(tl, o, tl_ref(tl, a->wo + wo, KB_SHAPE2(dh, d), KB_F16));
    tl_store(tl, a->partial + (kb_va)j * (kb_va)(S * d * 4), part);
}

static int attn_worker(kb_ctx *ctx, int rank, void *arg)
{
    tp_state *st = arg;
    kb_machine *m = kb_ctx_machine(ctx);
    int64_t S = st->m, d = st->d, H = st->heads, dh = d / H, Hr = H / st->ws;
    int cubes, pes, rc;
    kb_tensor *x, *xT, *wq, *wk, *wv, *wo, *bo, *partial;
    kb_tp_pick_pes(m, Hr, &cubes, &pes);
    if ((rc = tp_begin(ctx, st, rank)) != 0)
        goto out;
    kb_dp_policy rep = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, cubes, pes);
    kb_dp_policy col = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, cubes, pes);
    kb_dp_policy row = kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, cubes, pes);
    int64_t c0 = (int64_t)rank * Hr * dh, lc = Hr * dh;
    /* x and its transpose; the rank's heads: columns [c0, c0 + lc) of Wq and Wv, the same
     * columns of Wk as rows of Wk^T, rows [c0, c0 + lc) of Wo */
    kb_bench_pat px = pat(ATT_X, d, 0), pxT = pat(ATT_X, d, 1), pq = pat(ATT_WQ, d, 0),
                 pv = pat(ATT_WV, d, 0), pkT = pat(ATT_WK, d, 1), po = pat(ATT_WO, d, 0),
                 pbo = pat(ATT_BO, d, 0);
    kb_fill fx = kb_bench_pattern_fill(&px), fxT = kb_bench_pattern_fill(&pxT),
            fq = kb_fill_at(kb_bench_pattern_fill(&pq), 0, c0),
            fv = kb_fill_at(kb_bench_pattern_fill(&pv), 0, c0),
            fkT = kb_fill_at(kb_bench_pattern_fill(&pkT), c0, 0),
            fo = kb_fill_at(kb_bench_pattern_fill(&po), c0, 0), fbo = kb_bench_pattern_fill(&pbo);
#define MAKE(name, r, c, dp, src, dst)                                                    \
    do {                                                                                  \
        kb_tensor_desc desc_ = { name, r, c, KB_F16, dp, KB_MEM_HBM };                     \
        if ((rc = kb_tensor_from_fill(ctx, &desc_, src, dst)) != 0)                       \
            goto out;                                                                     \
    } while (0)
    MAKE("x", S, d, rep, &fx, &x);
    MAKE("xT", d, S, rep, &fxT, &xT);
    MAKE("wq", d, lc, col, &fq, &wq);
    MAKE("wv", d, lc, col, &fv, &wv);
    MAKE("wkT", lc, d, row, &fkT, &wk);
    MAKE("wo", lc, d, row, &fo, &wo);
    MAKE("bo", 1, d, kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 0, 0), &fbo, &bo);
#undef MAKE
    {
        kb_tensor_desc dp = { "partial", (int64_t)m->ncubes * m->npes * S, d, KB_F32,
                              kb_dist_policy(ctx), KB_MEM_HBM };
        if ((rc = kb_tensor_zeros(ctx, &dp, &partial)) != 0 ||
            (rc = tp_mark(ctx, st, rank, 0)) != 0)
            goto out;
    }
    kb_time t_comm0 = kb_dist_comm_time(ctx);
    kb_kargs a;
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, (attn_args){ .x = kb_tensor_va(x), .xT = kb_tensor_va(xT),
                                  .wq = kb_tensor_va(wq), .wkT = kb_tensor_va(wk),
                                  .wv = kb_tensor_va(wv), .wo = kb_tensor_va(wo),
                                  .partial = kb_tensor_va(partial), .S = S, .d = d, .dh = dh,
                                  .scale = 1.0 / sqrt((double)dh) });
    kb_grid g = { pes, cubes, 1, -1 };
    if ((rc = kb_launch(ctx, "tp_attention", attn_kernel, &a, &g)) != 0 ||
        (rc = kb_tp_reduce_blocks(ctx, partial, bo, &st->y[rank])) != 0)
        goto out;
    if (rank == 0)
        st->comm = kb_dist_comm_time(ctx) - t_comm0;
    rc = tp_mark(ctx, st, rank, 1);
out:
    return rc;
}

static int attn_run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    tp_state *st = state;
    kb_machine *m = kb_ctx_machine(ctx);
    kb_roofline rl;
    int rc;
    st->ws = m->nsips;
    st->m = a->p[0];
    st->d = a->p[1];
    st->heads = a->p[2];
    st->res = res;
    if (st->d % st->heads || st->heads % st->ws || st->heads / st->ws > m->npes * m->ncubes)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_USAGE,
                          "tp_attention: d=%lld must split into %lld heads, and the heads evenly "
                          "over %d ranks with at most one head per PE", (long long)st->d,
                          (long long)st->heads, st->ws);
    snprintf(res->line, sizeof res->line, "  tp_attention (tp=%d, seq=%lld d=%lld heads=%lld)",
             st->ws, (long long)st->m, (long long)st->d, (long long)st->heads);
    if ((rc = kb_spawn(ctx, attn_worker, st, st->ws)) != 0 ||
        (rc = kb_tp_roofline_attention(m, st->m, st->d, st->heads, &rl, kb_ctx_err(ctx))) != 0)
        return rc;
    kb_bench_set_roofline(res, &rl);
    split_time(ctx, st, res);
    return 0;
}

static int attn_verify(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    tp_state *st = state;
    size_t S = (size_t)st->m, D = (size_t)st->d, H = (size_t)st->heads, dh = D / H;
    double *q = malloc(sizeof(double) * S * D), *k = malloc(sizeof(double) * S * D),
           *v = malloc(sizeof(double) * S * D), *o = malloc(sizeof(double) * S * D),
           *ref = malloc(sizeof(double) * S * D), *bound = malloc(sizeof(double) * S * D),
           *p = malloc(sizeof(double) * S);
    int rc = KB_ERR_NOMEM;
    (void)a;
    st->x = pattern(S * D, ATT_X);
    st->wq = pattern(D * D, ATT_WQ);
    st->wk = pattern(D * D, ATT_WK);
    st->wv = pattern(D * D, ATT_WV);
    st->wo = pattern(D * D, ATT_WO);
    st->bo = pattern(D, ATT_BO);
    if (!q || !k || !v || !o || !ref || !bound || !p || !st->x || !st->wq || !st->wk ||
        !st->wv || !st->wo || !st->bo) {
        kb_err_set(kb_ctx_err(ctx), rc, "out of memory");
        goto out;
    }
    for (size_t t = 0; t < S; t++)
        for (size_t c = 0; c < D; c++) {
            double sq = 0, sk = 0, sv = 0;
            for (size_t i = 0; i < D; i++) {
                sq += (double)st->x[t * D + i] * st->wq[i * D + c];
                sk += (double)st->x[t * D + i] * st->wk[i * D + c];
                sv += (double)st->x[t * D + i] * st->wv[i * D + c];
            }
            q[t * D + c] = sq;
            k[t * D + c] = sk;
            v[t * D + c] = sv;
        }
    for (size_t hh = 0; hh < H; hh++)
        for (size_t t = 0; t < S; t++) {
            double mx = -INFINITY, sum = 0;
            for (size_t u = 0; u < S; u++) {
                double s = 0;
                for (size_t c = 0; c < dh; c++)
                    s += q[t * D + hh * dh + c] * k[u * D + hh * dh + c];
                p[u] = s / sqrt((double)dh);
                mx = p[u] > mx ? p[u] : mx;
            }
            for (size_t u = 0; u < S; u++)
                sum += (p[u] = exp(p[u] - mx));
            for (size_t c = 0; c < dh; c++) {
                double s = 0;
                for (size_t u = 0; u < S; u++)
                    s += p[u] / sum * v[u * D + hh * dh + c];
                o[t * D + hh * dh + c] = s;
            }
        }
    for (size_t t = 0; t < S; t++)
        for (size_t c = 0; c < D; c++) {
            double s = st->bo[c], sa = fabs(st->bo[c]);
            for (size_t i = 0; i < D; i++) {
                s += o[t * D + i] * st->wo[i * D + c];
                sa += fabs(o[t * D + i] * st->wo[i * D + c]);
            }
            ref[t * D + c] = s;
            /* f32 intermediates (gemms, exp, softmax) against a double reference */
            bound[t * D + c] = sa * 1e-5 + 1e-6;
        }
    rc = check_common(ctx, st, ref, bound, res);
out:
    free(q), free(k), free(v), free(o), free(ref), free(bound), free(p);
    return rc;
}

const kb_bench kb_bench_tp_mlp = {
    .name = "tp_mlp",
    .summary = "tensor-parallel MLP: column-parallel fc1 + GeLU, row-parallel fc2 + all-reduce (rank = SIP)",
    .params = {
        { "m", 4, 1, 256, "tokens (rows of x)" },
        { "d", 64, 1, 4096, "model width (fc1 input, fc2 output)" },
        { "hidden", 256, 1, 16384, "fc1 output / fc2 input (divisible by the TP size)" },
    },
    .nparams = 3,
    .state_size = sizeof(tp_state),
    .run = mlp_run,
    .verify = mlp_verify,
    .cleanup = tp_cleanup,
};

const kb_bench kb_bench_tp_attention = {
    .name = "tp_attention",
    .summary = "tensor-parallel attention: column-parallel QKV (heads per rank), SDPA, row-parallel output",
    .params = {
        { "seq", 16, 1, 256, "tokens" },
        { "d", 64, 1, 1024, "model width" },
        { "heads", 8, 1, 256, "attention heads (d / heads per head; heads / TP size per rank)" },
    },
    .nparams = 3,
    .state_size = sizeof(tp_state),
    .run = attn_run,
    .verify = attn_verify,
    .cleanup = tp_cleanup,
};
