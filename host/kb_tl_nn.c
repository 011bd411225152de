/*
 * kb_tl_nn — the neural-network kernel ops (kb_tl_nn.h). Single-record ops reserve PE_MATH
 * (or a DMA for tl_embedding) like kb_tl.c's elementwise ops and append their record only when
 * the context records (timing-only runs build no record); compositions call the kb_tl ops, plus
 * ew_into for results written straight into a view of the output (tl_rope's halves).
 */
#include "kb_runtime_int.h"
#include "kb_tl_nn.h"

#include <assert.h>
#include <math.h>
#include <string.h>

static kb_time issue_time(kb_tl *tl) { return kb_sim_now(tl->sim) + tl->cpu_ovh; }

static kb_opnd val_opnd(kb_val v) { return kb_tl_opnd(v); }

static void need_local(kb_tl *tl, kb_val v, const char *op)
{
    char buf[96];
    if (!kb_pa_in_pe_window(v.pa, kb_pa_pe_window(tl->pe->gsip, tl->pe->cube, tl->pe->pe)))
        tl_fail(tl, KB_ERR_INVAL,
                "%s: operand at %s is not in this PE's TCM/scratch (tl_load it first)", op,
                kb_pa_format(v.pa, buf, sizeof buf));
}

/*
 * One record of `kind` writing dst from nsrc sources, occupying PE_MATH for passes x elems
 * from the issue time; `offset` is ATTN_SOFTMAX's causal offset (kept in src[1].addr).
 */
static void math_record(kb_tl *tl, kb_rec_kind kind, int op, kb_val dst, const kb_val *src,
                        int nsrc, float imm0, float imm1, uint64_t elems, unsigned passes,
                        int64_t offset)
{
    kb_time t_start = issue_time(tl);
    kb_time t_end = kb_res_hop(&tl->pe->math, t_start, elems * passes);

    /* ATTN_SOFTMAX's offset rides in src[1].addr: that slot must be no operand */
    assert(kind != KB_REC_ATTN_SOFTMAX || nsrc == 1);
    if (kb_ctx_records(tl->ctx)) {
        kb_rec r;
        kb_tl_rec_fill(&r, kind, op, dst, src, nsrc, imm0, imm1, t_start, t_end);
        if (kind == KB_REC_ATTN_SOFTMAX)
            r.src[1].addr = (uint64_t)offset; /* not an operand: nsrc is 1 */
        kb_tl_record(tl, &r);
    }
    kb_tl_wait_until(tl, t_end);
}

/* dst (a local value or view) = op(src...) elementwise, 1 pass; sources broadcast. */
static void ew_into(kb_tl *tl, kb_rec_kind kind, int op, kb_val dst, const kb_val *src, int nsrc,
                    const char *name)
{
    need_local(tl, dst, name);
    for (int i = 0; i < nsrc; i++) {
        need_local(tl, src[i], name);
        if ((src[i].rows != dst.rows && src[i].rows != 1) ||
            (src[i].cols != dst.cols && src[i].cols != 1))
            tl_fail(tl, KB_ERR_INVAL, "%s: a %ux%u operand does not fit a %ux%u result", name,
                    src[i].rows, src[i].cols, dst.rows, dst.cols);
    }
    math_record(tl, kind, op, dst, src, nsrc, 0.0f, 0.0f, (uint64_t)dst.rows * dst.cols, 1, 0);
}

static kb_val unary(kb_tl *tl, kb_val a, int op, float imm0, const char *name)
{
    kb_val v;
    need_local(tl, a, name);
    v = kb_tl_scratch_val(tl, a.rows, a.cols, KB_F32, name);
    math_record(tl, KB_REC_MATH1, op, v, &a, 1, imm0, 0.0f, (uint64_t)a.rows * a.cols, 1, 0);
    return v;
}

kb_val tl_tanh(kb_tl *tl, kb_val a) { return unary(tl, a, KB_M1_TANH, 0.0f, "tl_tanh"); }
kb_val tl_silu(kb_tl *tl, kb_val a) { return unary(tl, a, KB_M1_SILU, 0.0f, "tl_silu"); }

/* KB_M1_GELU is already the tanh approximation (kb_mathfn.h). */
kb_val tl_gelu_tanh(kb_tl *tl, kb_val a) { return unary(tl, a, KB_M1_GELU, 0.0f, "tl_gelu_tanh"); }

kb_val tl_softcap(kb_tl *tl, kb_val a, float cap)
{
    if (!(cap > 0.0f) || isinf(cap))
        tl_fail(tl, KB_ERR_INVAL, "tl_softcap: cap %g must be positive and finite", (double)cap);
    return unary(tl, a, KB_M1_SOFTCAP, cap, "tl_softcap");
}

kb_val tl_attn_softmax(kb_tl *tl, kb_val a, float scale, float cap, int causal, int64_t offset)
{
    unsigned passes = KB_ATTN_SOFTMAX_PASSES + (cap > 0.0f ? 1u : 0u);
    kb_val v;

    need_local(tl, a, "tl_attn_softmax");
    if (isnan(scale) || isinf(scale) || isnan(cap) || isinf(cap))
        tl_fail(tl, KB_ERR_INVAL, "tl_attn_softmax: scale %g and cap %g must be finite",
                (double)scale, (double)cap);
    v = kb_tl_scratch_val(tl, a.rows, a.cols, KB_F32, "tl_attn_softmax");
    math_record(tl, KB_REC_ATTN_SOFTMAX, causal ? 1 : 0, v, &a, 1, scale, cap > 0.0f ? cap : 0.0f,
                (uint64_t)a.rows * a.cols, passes, causal ? offset : 0);
    return v;
}

/* A 1 x cols parameter row for a rows x cols input. */
static void need_row(kb_tl *tl, kb_val w, kb_val x, const char *what, const char *op)
{
    if (w.rows != 1 || w.cols != x.cols)
        tl_fail(tl, KB_ERR_INVAL, "%s: %s is %ux%u, needs 1x%u", op, what, w.rows, w.cols, x.cols);
}

/*
 * sq = x*x; s = sum_row(sq); ms = fma(1/cols, s, eps); r = rsqrt(ms); y = x*r;
 * out = y * (w + unit_offset). 4 passes over x plus small ones (docs/timing-model.md).
 */
kb_val tl_rmsnorm(kb_tl *tl, kb_val x, kb_val w, float eps, float unit_offset)
{
    kb_val sq, s, ms, r, y, wo, out;

    need_row(tl, w, x, "the weight", "tl_rmsnorm");
    sq = tl_mul(tl, x, x);
    s = tl_sum(tl, sq, 1);
    tl_free(tl, sq);
    ms = tl_scale(tl, s, 1.0f / (float)x.cols, eps);
    tl_free(tl, s);
    r = tl_rsqrt(tl, ms);
    tl_free(tl, ms);
    y = tl_mul(tl, x, r);
    tl_free(tl, r);
    wo = unit_offset != 0.0f ? tl_scale(tl, w, 1.0f, unit_offset) : w;
    out = tl_mul(tl, y, wo);
    tl_free(tl, y);
    if (unit_offset != 0.0f)
        tl_free(tl, wo);
    return out;
}

/*
 * mu = sum_row(x) / cols; xc = x - mu; var = fma(1/cols, sum_row(xc*xc), eps);
 * out = fma(xc * rsqrt(var), w, b). 6 passes over x plus small ones.
 */
kb_val tl_layernorm(kb_tl *tl, kb_val x, kb_val w, kb_val b, float eps)
{
    float inv = 1.0f / (float)x.cols;
    kb_val s, mu, xc, sq, ss, var, r, y, out;

    need_row(tl, w, x, "the weight", "tl_layernorm");
    need_row(tl, b, x, "the bias", "tl_layernorm");
    s = tl_sum(tl, x, 1);
    mu = tl_scale(tl, s, inv, 0.0f);
    tl_free(tl, s);
    xc = tl_sub(tl, x, mu);
    tl_free(tl, mu);
    sq = tl_mul(tl, xc, xc);
    ss = tl_sum(tl, sq, 1);
    tl_free(tl, sq);
    var = tl_scale(tl, ss, inv, eps);
    tl_free(tl, ss);
    r = tl_rsqrt(tl, var);
    tl_free(tl, var);
    y = tl_mul(tl, xc, r);
    tl_free(tl, xc);
    tl_free(tl, r);
    out = tl_fma(tl, y, w, b);
    tl_free(tl, y);
    return out;
}

/*
 * Each half of the output from two products and a sum, the rounding sequence of PyTorch's
 * x * cos + rotate_half(x) * sin in f32: 6 records over rows x hd/2 = 3 passes over x.
 */
kb_val tl_rope(kb_tl *tl, kb_val x, kb_val cos, kb_val sin)
{
    uint32_t h = x.cols / 2;
    kb_val x1, x2, out, o1, o2, p, q, s[2];

    if (x.cols % 2 != 0 || cos.rows != x.rows || cos.cols != h || sin.rows != x.rows ||
        sin.cols != h)
        tl_fail(tl, KB_ERR_INVAL, "tl_rope: x %ux%u (even columns) needs cos and sin of %ux%u, "
                "got %ux%u and %ux%u", x.rows, x.cols, x.rows, h, cos.rows, cos.cols, sin.rows,
                sin.cols);
    x1 = tl_view(tl, x, 0, 0, x.rows, h);
    x2 = tl_view(tl, x, 0, h, x.rows, h);
    out = kb_tl_scratch_val(tl, x.rows, x.cols, KB_F32, "tl_rope");
    o1 = tl_view(tl, out, 0, 0, x.rows, h);
    o2 = tl_view(tl, out, 0, h, x.rows, h);
    p = tl_mul(tl, x1, cos);
    q = tl_mul(tl, x2, sin);
    s[0] = p;
    s[1] = q;
    ew_into(tl, KB_REC_MATH2, KB_M2_SUB, o1, s, 2, "tl_rope");
    tl_free(tl, q);
    tl_free(tl, p);
    p = tl_mul(tl, x2, cos);
    q = tl_mul(tl, x1, sin);
    s[0] = p;
    s[1] = q;
    ew_into(tl, KB_REC_MATH2, KB_M2_ADD, o2, s, 2, "tl_rope");
    tl_free(tl, q);
    tl_free(tl, p);
    return out;
}

void kb_rope_tables(const int64_t *pos, int64_t n, int hd, double theta, float *cos_out,
                    float *sin_out)
{
    int h = hd / 2;
    for (int k = 0; k < h; k++) {
        double inv_freq = pow(theta, -2.0 * k / hd);
        for (int64_t i = 0; i < n; i++) {
            double ang = (double)pos[i] * inv_freq;
            cos_out[i * h + k] = (float)cos(ang);
            sin_out[i * h + k] = (float)sin(ang);
        }
    }
}

kb_val tl_transpose(kb_tl *tl, kb_val a)
{
    kb_val v;
    need_local(tl, a, "tl_transpose");
    v = kb_tl_scratch_val(tl, a.cols, a.rows, KB_F32, "tl_transpose");
    math_record(tl, KB_REC_TRANSPOSE, 0, v, &a, 1, 0.0f, 0.0f, (uint64_t)a.rows * a.cols, 1, 0);
    return v;
}

/* Two tl_copy into views of the result: 1 pass over the output. */
kb_val tl_concat(kb_tl *tl, kb_val a, kb_val b, int axis)
{
    kb_val out;
    if (axis != 0 && axis != 1)
        tl_fail(tl, KB_ERR_INVAL, "tl_concat: axis %d (0 = rows, 1 = columns)", axis);
    if (axis == 0 ? a.cols != b.cols : a.rows != b.rows)
        tl_fail(tl, KB_ERR_INVAL, "tl_concat: %ux%u and %ux%u do not concatenate along axis %d",
                a.rows, a.cols, b.rows, b.cols, axis);
    if (axis == 0 ? (uint64_t)a.rows + b.rows > UINT32_MAX : (uint64_t)a.cols + b.cols > UINT32_MAX)
        tl_fail(tl, KB_ERR_INVAL, "tl_concat: result too large");
    if (axis == 0) {
        out = kb_tl_scratch_val(tl, a.rows + b.rows, a.cols, KB_F32, "tl_concat");
        tl_copy(tl, tl_view(tl, out, 0, 0, a.rows, a.cols), a);
        tl_copy(tl, tl_view(tl, out, a.rows, 0, b.rows, b.cols), b);
    } else {
        out = kb_tl_scratch_val(tl, a.rows, a.cols + b.cols, KB_F32, "tl_concat");
        tl_copy(tl, tl_view(tl, out, 0, 0, a.rows, a.cols), a);
        tl_copy(tl, tl_view(tl, out, 0, a.cols, b.rows, b.cols), b);
    }
    return out;
}

/* nkv * n_rep tl_copy of rows x hd: 1 pass over the output. */
kb_val tl_repeat_kv(kb_tl *tl, kb_val kv, int nkv, int hd, int n_rep)
{
    kb_val out;
    if (nkv <= 0 || hd <= 0 || n_rep <= 0 || (uint64_t)nkv * (uint64_t)hd != kv.cols ||
        (uint64_t)kv.cols * (uint64_t)n_rep > UINT32_MAX)
        tl_fail(tl, KB_ERR_INVAL, "tl_repeat_kv: %ux%u value is not %d heads of %d (n_rep %d)",
                kv.rows, kv.cols, nkv, hd, n_rep);
    out = kb_tl_scratch_val(tl, kv.rows, kv.cols * (uint32_t)n_rep, KB_F32, "tl_repeat_kv");
    for (int g = 0; g < nkv; g++) {
        kb_val src = tl_view(tl, kv, 0, (uint32_t)(g * hd), kv.rows, (uint32_t)hd);
        for (int r = 0; r < n_rep; r++)
            tl_copy(tl, tl_view(tl, out, 0, (uint32_t)((g * n_rep + r) * hd), kv.rows,
                                (uint32_t)hd), src);
    }
    return out;
}

/* act(gate) then the product: 2 passes. */
kb_val tl_gated(kb_tl *tl, kb_val gate, kb_val up, int act)
{
    kb_val a, out;
    if (act != 0 && act != 1)
        tl_fail(tl, KB_ERR_INVAL, "tl_gated: act %d (0 = silu, 1 = gelu_tanh)", act);
    if (gate.rows != up.rows || gate.cols != up.cols)
        tl_fail(tl, KB_ERR_INVAL, "tl_gated: gate %ux%u and up %ux%u differ", gate.rows,
                gate.cols, up.rows, up.cols);
    a = act == 0 ? tl_silu(tl, gate) : tl_gelu_tanh(tl, gate);
    out = tl_mul(tl, a, up);
    tl_free(tl, a);
    return out;
}

/*
 * One GATHER record; its time is a DMA of n * d elements from the table's first row into the
 * result (the route and byte count of the real row reads; which rows is data Phase 1 never
 * reads).
 */
kb_val tl_embedding(kb_tl *tl, kb_va table, int64_t vocab, int64_t d, kb_dtype dt, kb_val ids)
{
    uint32_t n;
    size_t es;
    kb_tensor *t;
    kb_pa pa;
    kb_val v;
    kb_rec r;
    kb_errbuf eb;

    need_local(tl, ids, "tl_embedding");
    if (ids.rows != 1 && ids.cols != 1)
        tl_fail(tl, KB_ERR_INVAL, "tl_embedding: ids are %ux%u, need 1 x n or n x 1", ids.rows,
                ids.cols);
    if (vocab <= 0 || d <= 0 || vocab > UINT32_MAX || d > UINT32_MAX ||
        (unsigned)dt >= KB_NDTYPES)
        tl_fail(tl, KB_ERR_INVAL, "tl_embedding: bad table shape %lldx%lld or dtype",
                (long long)vocab, (long long)d);
    n = ids.rows == 1 ? ids.cols : ids.rows;
    es = kb_dtype_size(dt);
    pa = kb_tl_translate(tl, table, (uint64_t)vocab * (uint64_t)d * es, "tl_embedding", &t);
    if (t && t->dtype != dt)
        tl_fail(tl, KB_ERR_INVAL, "tl_embedding: asked for %s but tensor '%s' holds %s",
                kb_dtype_name(dt), t->name, kb_dtype_name(t->dtype));
    v = kb_tl_scratch_val(tl, n, (uint32_t)d, KB_F32, "tl_embedding");
    memset(&r, 0, sizeof r);
    if (kb_machine_dma(tl->ctx->m, tl->pe, pa, v.pa, (uint64_t)n * (uint64_t)d * es,
                       issue_time(tl), &r.t_start, &r.t_end, &eb) != 0)
        tl_fail(tl, KB_ERR_RANGE, "tl_embedding: %s", eb.msg);
    if (kb_ctx_records(tl->ctx)) {
        r.kind = KB_REC_GATHER;
        r.nsrc = 2;
        r.dst = val_opnd(v);
        r.src[0] = kb_opnd_make(pa, (uint32_t)vocab, (uint32_t)d, dt);
        r.src[1] = val_opnd(ids);
        kb_tl_record(tl, &r);
    }
    kb_tl_wait_until(tl, r.t_end);
    return v;
}
