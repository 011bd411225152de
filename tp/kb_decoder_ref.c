/*
 * kb_decoder_ref — the decoder layer's host f64 reference (kb_decoder.h describes what it
 * rounds and quantizes where the device does) and the device's weight values it takes (part
 * of the decoder; kb_decoder.c plans and creates, kb_decoder_fwd.c runs). Plain C over whole
 * matrices: the projections are blocked loops on every online CPU, everything else one thread.
 * Limits: memory for the layer's activations at T tokens in double (a few times T x max(d,
 * Hq*hd, F) x 8 bytes).
 */
#include "kb_decoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kb_par.h"

/* Rows of out per pass over a column range of w: their partial rows stay in L1 while w's
 * rows stream past once per block instead of once per row. */
#define MM_ROW_BLOCK 16
/* Columns per work item at least (a cache line of out or more per row). */
#define MM_MIN_COLS 64

typedef struct mm_job {
    const double *a;
    const float *w;
    double *out;
    int64_t M, K, N, n0, n1;
} mm_job;

/* Four doubles as one value (GCC/Clang vector extension): a multiply and an add per lane,
 * never fused, so each lane rounds as the scalar loop does. */
typedef double mm_v4d __attribute__((vector_size(32)));

/* o[n0, n1) += x * w[n0, n1) */
static inline void mm_axpy(double *o, const float *w, double x, int64_t n0, int64_t n1)
{
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        mm_v4d ov, wv = { w[n], w[n + 1], w[n + 2], w[n + 3] };
        memcpy(&ov, o + n, sizeof ov);
        ov += x * wv;
        memcpy(o + n, &ov, sizeof ov);
    }
    for (; n < n1; n++)
        o[n] += x * (double)w[n];
}

/* out[:, n0:n1) = a @ w[:, n0:n1): for every out element the products are added in k order
 * (zero activations skipped), as the plain i-k-j loop adds them, so the values do not depend
 * on the blocking, the vector width or the number of threads. */
KB_VECTOR_CLONES
static void *mm_cols(void *p)
{
    const mm_job *j = p;
    int64_t K = j->K, N = j->N, n0 = j->n0, n1 = j->n1;
    for (int64_t i0 = 0; i0 < j->M; i0 += MM_ROW_BLOCK) {
        int64_t i1 = i0 + MM_ROW_BLOCK < j->M ? i0 + MM_ROW_BLOCK : j->M;
        for (int64_t i = i0; i < i1; i++)
            for (int64_t n = n0; n < n1; n++)
                j->out[i * N + n] = 0.0;
        for (int64_t k = 0; k < K; k++)
            for (int64_t i = i0; i < i1; i++) {
                double x = j->a[i * K + k];
                if (x != 0.0)
                    mm_axpy(j->out + i * N, j->w + k * N, x, n0, n1);
            }
    }
    return NULL;
}

/* out (M x N) = a (M x K) @ w (K x N), column ranges of w on every online CPU (the
 * reference of a Gemma-2 layer at seq 128 is ~10 G multiply-adds; of a Mistral layer at
 * seq 2048, ~400 G). */
static void ref_mm(const double *a, const float *w, double *out, int64_t M, int64_t K, int64_t N)
{
    mm_job jobs[KB_PAR_MAX];
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t nj = (double)M * (double)K * (double)N < 1e7 || cpus < 1 ? 1 : cpus;
    if (nj > KB_PAR_MAX)
        nj = KB_PAR_MAX;
    if (nj > (N + MM_MIN_COLS - 1) / MM_MIN_COLS)
        nj = (N + MM_MIN_COLS - 1) / MM_MIN_COLS;
    if (nj < 1)
        nj = 1;
    for (int64_t t = 0; t < nj; t++)
        jobs[t] = (mm_job){ .a = a, .w = w, .out = out, .M = M, .K = K, .N = N,
                            .n0 = N * t / nj, .n1 = N * (t + 1) / nj };
    kb_par_run(mm_cols, jobs, sizeof jobs[0], (size_t)nj);
}

/* x rounded to what a store of dtype dt keeps */
static void ref_round(double *x, int64_t n, kb_dtype dt)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = dt == KB_BF16 ? kb_bf16_to_f32(kb_f32_to_bf16((float)x[i]))
             : dt == KB_F16  ? kb_f16_to_f32(kb_f32_to_f16((float)x[i]))
                             : (double)(float)x[i];
}

/* The distance from v (a value of dtype dt) to its next representable neighbour away from 0. */
static double act_step(kb_dtype dt, double v)
{
    if (dt == KB_F32) {
        float f = (float)fabs(v);
        return (double)nextafterf(f, INFINITY) - (double)f;
    }
    uint16_t b = 0;
    kb_dtype_store(dt, &b, 0, (float)fabs(v));
    if ((b & 0x7fffu) >= (dt == KB_F16 ? 0x7bffu : 0x7f7fu)) /* the largest finite: no next */
        return INFINITY;
    uint16_t nb = (uint16_t)(b + 1u);
    return (double)kb_dtype_load(dt, &nb, 0) - (double)kb_dtype_load(dt, &b, 0);
}

/* Continues from the device's activations dev where they are within tol * (|n| + rms(n)) (or
 * one step of dt) of n (see kb_decoder_ref_in.n_dev); records the first element further
 * away in *far. */
static void ref_take(double *n, const float *dev, int64_t cnt, kb_dtype dt, double tol,
                     int64_t *far)
{
    double ss = 0, rms;
    if (!dev)
        return;
    for (int64_t i = 0; i < cnt; i++)
        ss += n[i] * n[i];
    rms = cnt > 0 ? sqrt(ss / (double)cnt) : 0;
    for (int64_t i = 0; i < cnt; i++) {
        double e = fabs((double)dev[i] - n[i]);
        if (e <= act_step(dt, n[i]) || e <= tol * (fabs(n[i]) + rms))
            n[i] = dev[i];
        else if (far && *far < 0)
            *far = i;
    }
}

/* tl_dot_q's activation quantization of x (M x K), per row over each seg columns; tmp holds
 * 2 * M * seg floats */
static int ref_quant(kb_qfmt fmt, double *x, int64_t M, int64_t K, int64_t seg, float *tmp)
{
    if (fmt == KB_QF_F16 || fmt == KB_QF_BF16)
        return 0;
    for (int64_t c0 = 0; c0 < K; c0 += seg) {
        float *in = tmp, *q = tmp + M * seg;
        for (int64_t i = 0; i < M; i++)
            for (int64_t c = 0; c < seg; c++)
                in[i * seg + c] = (float)x[i * K + c0 + c];
        int rc = kb_qact_host_values(fmt, M, seg, in, q);
        if (rc)
            return rc;
        for (int64_t i = 0; i < M; i++)
            for (int64_t c = 0; c < seg; c++)
                x[i * K + c0 + c] = q[i * seg + c];
    }
    return 0;
}

static void ref_rmsnorm(const double *x, const float *w, double *out, int64_t M, int64_t d,
                        double eps, double off)
{
    for (int64_t i = 0; i < M; i++) {
        double s = 0;
        for (int64_t k = 0; k < d; k++)
            s += x[i * d + k] * x[i * d + k];
        double r = 1.0 / sqrt(s / (double)d + eps);
        for (int64_t k = 0; k < d; k++)
            out[i * d + k] = x[i * d + k] * r * (off + (double)w[k]);
    }
}

/* rotate-half RoPE of one head's hd values at position pos */
static void ref_rope(double *v, int64_t hd, int64_t pos, double theta)
{
    int64_t h = hd / 2;
    for (int64_t i = 0; i < h; i++) {
        double ang = (double)pos * pow(theta, -2.0 * (double)i / (double)hd);
        double c = cos(ang), s = sin(ang), x1 = v[i], x2 = v[i + h];
        v[i] = x1 * c - x2 * s;
        v[i + h] = x2 * c + x1 * s;
    }
}

/* RoPE of every token's query and key heads at its position (decode: kv_len). */
static void ref_rope_qk(const kb_model_cfg *mc, const kb_decoder_opts *o, double *q, double *k,
                        int64_t T)
{
    int64_t hd = mc->head_dim, Hq = mc->n_heads, Hkv = mc->n_kv_heads;
    int64_t nq = Hq * hd, nk = Hkv * hd;
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = o->decode ? o->kv_len : t % o->seq;
        for (int64_t hh = 0; hh < Hq; hh++)
            ref_rope(q + t * nq + hh * hd, hd, pos, mc->rope_theta);
        for (int64_t hh = 0; hh < Hkv; hh++)
            ref_rope(k + t * nk + hh * hd, hd, pos, mc->rope_theta);
    }
}

/* Causal GQA attention of every token's query heads into att (T x Hq*hd): scaled, soft-capped
 * softmax over keys 0 .. s of its sequence (decode: the cache in, then the new token), then
 * P V. p: scratch for one row of scores (L doubles). */
static void ref_attention(const kb_model_cfg *mc, const kb_decoder_opts *o,
                          const kb_decoder_ref_in *in, const double *q, const double *k,
                          const double *v, double *att, double *p, int64_t T)
{
    int64_t hd = mc->head_dim, Hq = mc->n_heads, Hkv = mc->n_kv_heads;
    int64_t nq = Hq * hd, nk = Hkv * hd, rep = Hq / Hkv;
    double scale = kb_model_qscale(mc), cap = mc->attn_softcap;
    for (int64_t t = 0; t < T; t++) {
        int64_t b = o->decode ? t : t / o->seq, s = o->decode ? o->kv_len : t % o->seq;
        for (int64_t hh = 0; hh < Hq; hh++) {
            int64_t gk = hh / rep;
            const double *qv = q + t * nq + hh * hd;
            double mx = -INFINITY, sum = 0;
            /* keys 0 .. s (causal); decode: the cache then the new token */
            for (int64_t j = 0; j <= s; j++) {
                double dot = 0;
                if (o->decode && j < o->kv_len) {
                    const float *kr = in->kc + ((b * Hkv + gk) * o->kv_len + j) * hd;
                    for (int64_t c = 0; c < hd; c++)
                        dot += qv[c] * (double)kr[c];
                } else {
                    const double *kr = k + (o->decode ? t : b * o->seq + j) * nk + gk * hd;
                    for (int64_t c = 0; c < hd; c++)
                        dot += qv[c] * kr[c];
                }
                dot *= scale;
                if (cap > 0)
                    dot = cap * tanh(dot / cap);
                p[j] = dot;
                mx = dot > mx ? dot : mx;
            }
            for (int64_t j = 0; j <= s; j++)
                sum += (p[j] = exp(p[j] - mx));
            double *ov = att + t * nq + hh * hd;
            for (int64_t c = 0; c < hd; c++)
                ov[c] = 0;
            for (int64_t j = 0; j <= s; j++) {
                double w = p[j] / sum;
                if (o->decode && j < o->kv_len) {
                    const float *vr = in->vc + ((b * Hkv + gk) * o->kv_len + j) * hd;
                    for (int64_t c = 0; c < hd; c++)
                        ov[c] += w * (double)vr[c];
                } else {
                    const double *vr = v + (o->decode ? t : b * o->seq + j) * nk + gk * hd;
                    for (int64_t c = 0; c < hd; c++)
                        ov[c] += w * vr[c];
                }
            }
        }
    }
}

/* g = act(g) * u over n values: the MLP's gated activation (SiLU, or GELU's tanh form). */
static void ref_gated(const kb_model_cfg *mc, double *g, const double *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double z = g[i];
        double a = kb_model_act(mc) == KB_ACT_SILU
                       ? z / (1.0 + exp(-z))
                       : 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
        g[i] = a * u[i];
    }
}

int kb_decoder_reference(const kb_model_cfg *mc, const kb_decoder_opts *o,
                         const kb_decoder_ref_in *in, double *out, kb_errbuf *eb)
{
    int64_t d = mc->d_model, hd = mc->head_dim, Hq = mc->n_heads, Hkv = mc->n_kv_heads;
    int64_t F = mc->mlp_hidden, T = o->decode ? o->batch : o->batch * o->seq;
    int64_t nq = Hq * hd, nk = Hkv * hd;
    int64_t L = o->decode ? o->kv_len + 1 : o->seq; /* keys per sequence */
    double off = mc->norm_unit_offset;
    double *x = malloc(sizeof(double) * (size_t)(T * d)), *n = malloc(sizeof(double) * (size_t)(T * d));
    double *q = malloc(sizeof(double) * (size_t)(T * nq)), *k = malloc(sizeof(double) * (size_t)(T * nk));
    double *v = malloc(sizeof(double) * (size_t)(T * nk)), *att = malloc(sizeof(double) * (size_t)(T * nq));
    double *t1 = malloc(sizeof(double) * (size_t)(T * d)), *h = malloc(sizeof(double) * (size_t)(T * d));
    double *g = malloc(sizeof(double) * (size_t)(T * F)), *u = malloc(sizeof(double) * (size_t)(T * F));
    double *p = malloc(sizeof(double) * (size_t)L);
    int64_t segmax = d > nq ? d : nq;
    float *qt = malloc(sizeof(float) * 2 * (size_t)(T * (segmax > F ? segmax : F)));
    kb_qfmt fmt = o->fmt;
    int rc = 0;
    if (in->o_seg < 1 || nq % in->o_seg || in->mlp_seg < 1 || F % in->mlp_seg) {
        rc = kb_err_set(eb, KB_ERR_INVAL, "decoder reference: segments %lld / %lld do not "
                        "split %lld / %lld", (long long)in->o_seg, (long long)in->mlp_seg,
                        (long long)nq, (long long)F);
        goto out;
    }
    if (!x || !n || !q || !k || !v || !att || !t1 || !h || !g || !u || !p || !qt) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "decoder reference: out of memory");
        goto out;
    }
    for (int64_t i = 0; i < T * d; i++)
        x[i] = in->x[i];
    if (in->n_far)
        *in->n_far = -1;
    ref_rmsnorm(x, in->ln[0], n, T, d, mc->norm_eps, off);
    ref_round(n, T * d, in->act);
    ref_take(n, in->n_dev[0], T * d, in->act, in->n_tol, in->n_far);
    if ((rc = ref_quant(fmt, n, T, d, d, qt)) != 0)
        goto qfail;
    ref_mm(n, in->wq, q, T, d, nq);
    ref_mm(n, in->wk, k, T, d, nk);
    ref_mm(n, in->wv, v, T, d, nk);
    ref_rope_qk(mc, o, q, k, T);
    ref_round(q, T * nq, in->act);
    ref_round(k, T * nk, in->act);
    ref_round(v, T * nk, in->act);
    ref_attention(mc, o, in, q, k, v, att, p, T);
    if ((rc = ref_quant(fmt, att, T, nq, in->o_seg, qt)) != 0)
        goto qfail;
    ref_mm(att, in->wo, t1, T, nq, d);
    if (mc->post_norms) {
        ref_rmsnorm(t1, in->ln[1], n, T, d, mc->norm_eps, off);
        memcpy(t1, n, sizeof(double) * (size_t)(T * d));
    }
    for (int64_t i = 0; i < T * d; i++)
        h[i] = x[i] + t1[i];
    ref_rmsnorm(h, in->ln[2], n, T, d, mc->norm_eps, off);
    ref_round(n, T * d, in->act);
    ref_take(n, in->n_dev[1], T * d, in->act, in->n_tol, in->n_far);
    if ((rc = ref_quant(fmt, n, T, d, d, qt)) != 0)
        goto qfail;
    ref_mm(n, in->wg, g, T, d, F);
    ref_mm(n, in->wu, u, T, d, F);
    ref_gated(mc, g, u, T * F);
    if ((rc = ref_quant(fmt, g, T, F, in->mlp_seg, qt)) != 0)
        goto qfail;
    ref_mm(g, in->wd, t1, T, F, d);
    if (mc->post_norms) {
        ref_rmsnorm(t1, in->ln[3], n, T, d, mc->norm_eps, off);
        memcpy(t1, n, sizeof(double) * (size_t)(T * d));
    }
    for (int64_t i = 0; i < T * d; i++)
        out[i] = h[i] + t1[i];
    goto out;
qfail:
    rc = kb_err_set(eb, rc, "decoder reference: activation quantization failed");
out:
    free(qt);
    free(x), free(n), free(q), free(k), free(v), free(att), free(t1), free(h), free(g), free(u);
    free(p);
    return rc;
}

int kb_decoder_ref_weight(kb_qfmt fmt, int sparse, int64_t k, int64_t n, int ws,
                          int row_parallel, const kb_fill *w, float *out)
{
    if (!row_parallel)
        return kb_qweight_host_values(fmt, sparse, k, n, w, out);
    for (int r = 0; r < ws; r++) {
        kb_fill s = kb_fill_at(*w, (int64_t)r * (k / ws), 0);
        int rc = kb_qweight_host_values(fmt, sparse, k / ws, n, &s, out + (size_t)r * (size_t)(k / ws) * (size_t)n);
        if (rc)
            return rc;
    }
    return 0;
}
