/*
 * kb_decoder_kernels — the decoder layer's kernels (part of the decoder, kb_decoder.h, which
 * describes the placement they implement; their argument structs are in kb_decoder_int.h): the
 * row owners' norms and residual adds, QKV with RoPE, prefill attention with its W_o rows,
 * decode's split-KV attention and its combination, and the MLP. Each PE finds its work from
 * its index in the launch's grid; weights go through tl_dot_q in their number format.
 * Limits: the shapes are the plan's (kb_decoder_plan_make), which the kernels do not check.
 */
#include "kb_decoder_int.h"

#include "kb_tl_nn.h"

static int pe_index(kb_tl *tl)
{
    return tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
}

/* Base VA of shard j of the tensor at base (0 stays 0: an absent part). */
static kb_va shard_va(kb_tl *tl, kb_va base, int j)
{
    if (!base)
        return 0;
    kb_tensor *t = kb_ctx_tensor_at(tl_ctx(tl), tl_pe(tl)->gsip, base);
    if (!t || (size_t)j >= kb_tensor_nshards(t))
        tl_fail(tl, KB_ERR_RANGE, "decoder: no shard %d of the tensor at 0x%llx", j,
                (unsigned long long)base);
    return base + kb_tensor_shard(t, (size_t)j)->offset_bytes;
}

/* x (m x k) @ shard j (k x n) of the weight w (kb_qweight). */
static kb_val wdot(kb_tl *tl, kb_val x, const kb_dec_wva *w, int j, uint32_t k, uint32_t n,
                   int64_t flags)
{
    kb_qref q = tl_qref(tl, shard_va(tl, w->q, j), shard_va(tl, w->scale, j),
                        shard_va(tl, w->meta, j), k, n, F_FMT(flags), F_SPARSE(flags));
    return tl_dot_q(tl, x, q);
}

/* Rows [r0, r0 + n) (d columns) of a flattened 1 x Tl*d tensor split column-wise into pieces
 * of L elements (seq_parallel's collective layout), loaded into / stored from v (n x d):
 * one DMA per (piece, row) segment, whole rows at once where a piece holds several. */
static void pieces_io(kb_tl *tl, kb_val v, kb_va va, int64_t r0, int64_t n, int64_t d,
                      int64_t L, size_t es, int store)
{
    int64_t a = r0 * d, end = (r0 + n) * d;
    while (a < end) {
        int64_t lim = (a / L + 1) * L, b;
        kb_val part;
        if (lim > end)
            lim = end;
        if (a % d == 0 && lim - a >= d) {
            int64_t k = (lim - a) / d;
            b = a + k * d;
            part = tl_view(tl, v, (uint32_t)(a / d - r0), 0, (uint32_t)k, (uint32_t)d);
        } else {
            b = (a / d + 1) * d;
            if (b > lim)
                b = lim;
            part = tl_view(tl, v, (uint32_t)(a / d - r0), (uint32_t)(a % d), 1, (uint32_t)(b - a));
        }
        if (store)
            tl_store2d(tl, va + (kb_va)a * es, part.cols, part);
        else
            tl_load_into(tl, part, va + (kb_va)a * es, part.cols);
        a = b;
    }
}

/* ---- row owners: norms and residual adds ---- */

void kb_decoder_rows_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_rows_args *a = KB_KARGS_GET(ka, kb_dec_rows_args);
    int mode = a->mode, sp = a->sp, post = a->post;
    int64_t rc = a->rc, d = a->d, piece = a->piece, T = a->T;
    kb_dtype act = a->act;
    float eps = (float)a->eps, off = (float)a->off;
    int j = pe_index(tl);
    int64_t r0 = (int64_t)j * rc;
    kb_val h;
    if (mode == 0) {
        h = tl_load(tl, a->x + (kb_va)(r0 * d) * kb_dtype_size(act), KB_SHAPE2(rc, d),
                    act);
    } else {
        /* the summed partials: an all-reduced block (any block holds the sum; j's is local)
         * or the rank's reduce-scatter pieces */
        kb_val s;
        if (sp) {
            s = tl_full(tl, KB_SHAPE2(rc, d), 0.0f);
            pieces_io(tl, s, a->sum, r0, rc, d, piece, 4, 0);
        } else {
            s = tl_load(tl, a->sum + (kb_va)(((int64_t)j * T + r0) * d) * 4,
                        KB_SHAPE2(rc, d), KB_F32);
        }
        if (post) {
            kb_val w = tl_load(tl, shard_va(tl, a->lna, j), KB_SHAPE2(1, d), KB_F32);
            kb_val n = tl_rmsnorm(tl, s, w, eps, off);
            tl_free(tl, s);
            tl_free(tl, w);
            s = n;
        }
        kb_dtype rdt = mode == 1 ? act : KB_F32;
        kb_val r = tl_load(tl, a->x + (kb_va)(r0 * d) * kb_dtype_size(rdt),
                           KB_SHAPE2(rc, d), rdt);
        h = tl_add(tl, r, s);
        tl_free(tl, r);
        tl_free(tl, s);
        tl_store(tl, a->out + (kb_va)(r0 * d) * 4, h);
        if (mode == 2)
            return;
    }
    kb_val w = tl_load(tl, shard_va(tl, a->lnb, j), KB_SHAPE2(1, d), KB_F32);
    kb_val n = tl_rmsnorm(tl, h, w, eps, off);
    if (sp)
        pieces_io(tl, n, a->norm, r0, rc, d, piece, kb_dtype_size(act), 1);
    else /* into every gemm PE's copy of the T x d activations (gemm_input) */
        for (int64_t k = 0; k < a->ncopy; k++)
            tl_store(tl, shard_va(tl, a->norm, (int)k) +
                             (kb_va)(r0 * d) * kb_dtype_size(act), n);
}

/* The gemm input rows [r0, r0 + n) of the T x d normalized activations: this PE's own copy,
 * block j of the all-gathered tensor (seq_parallel) or of the copies the row owners wrote. */
static kb_val gemm_input(kb_tl *tl, kb_va va, int j, int64_t r0, int64_t n, int64_t d,
                         kb_dtype act)
{
    return tl_load(tl, shard_va(tl, va, j) + (kb_va)(r0 * d) * kb_dtype_size(act),
                   KB_SHAPE2(n, d), act);
}

/* ---- QKV ---- */

void kb_decoder_qkv_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_qkv_args *a = KB_KARGS_GET(ka, kb_dec_qkv_args);
    int64_t T = a->T, d = a->d, c = a->c, p = a->p, hd = a->hd;
    int64_t tb = a->tb, flags = a->flags;
    kb_dtype act = F_ACT(flags);
    int j = pe_index(tl);
    int64_t u = j / p, pi = j % p;
    int rope = u < a->nrope;
    kb_va out = shard_va(tl, a->out, j);
    for (int64_t r0 = 0; r0 < T; r0 += tb) {
        int64_t n = T - r0 < tb ? T - r0 : tb;
        kb_val x = gemm_input(tl, a->in, j, r0, n, d, act);
        kb_val y = wdot(tl, x, &a->w, j, (uint32_t)d, (uint32_t)c, flags);
        tl_free(tl, x);
        if (rope) {
            kb_va co = (kb_va)(r0 * (hd / 2) + pi * (c / 2)) * 4;
            kb_val cs = tl_load2d(tl, shard_va(tl, a->cos, j) + co,
                                  KB_SHAPE2(n, c / 2), (uint32_t)(hd / 2), KB_F32);
            kb_val sn = tl_load2d(tl, shard_va(tl, a->sin, j) + co,
                                  KB_SHAPE2(n, c / 2), (uint32_t)(hd / 2), KB_F32);
            kb_val ry = tl_rope(tl, y, cs, sn);
            tl_free(tl, y);
            tl_free(tl, cs);
            tl_free(tl, sn);
            y = ry;
        }
        tl_store(tl, out + (kb_va)(r0 * c) * kb_dtype_size(act), y);
        tl_free(tl, y);
    }
}

/* Rows [r0, r0 + n) of head unit u (hd columns over p QKV blocks of T x c) into dst's
 * columns (n x hd f32): one DMA per block. */
static void head_rows(kb_tl *tl, kb_val dst, kb_va qkv, int64_t u, int64_t p, int64_t c,
                      int64_t T, int64_t r0, int64_t n, kb_dtype act)
{
    size_t es = kb_dtype_size(act);
    for (int64_t pi = 0; pi < p; pi++) {
        kb_va va = shard_va(tl, qkv, (int)(u * p + pi)) + (kb_va)(r0 * c) * es;
        kb_val blk = tl_load(tl, va, KB_SHAPE2(n, c), act);
        tl_copy(tl, tl_view(tl, dst, 0, (uint32_t)(pi * c), (uint32_t)n, (uint32_t)c), blk);
        tl_free(tl, blk);
    }
    (void)T;
}

/* ---- prefill attention + its W_o rows ---- */

void kb_decoder_attn_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_attn_args *a = KB_KARGS_GET(ka, kb_dec_attn_args);
    int64_t seq = a->seq, qrows = a->qrows, qb = a->qb, nq = a->nq;
    int64_t nkv = a->nkv, p = a->p, c = a->c, hd = a->hd;
    int64_t T = a->T, d = a->d, flags = a->flags;
    kb_dtype act = F_ACT(flags);
    int j = pe_index(tl);
    if (j >= a->items)
        return;
    int64_t b = j / (nq * qb), i = (j / qb) % nq, q0 = (j % qb) * qrows;
    int64_t q1 = q0 + qrows < seq ? q0 + qrows : seq, n = q1 - q0, g = i / (nq / nkv);
    int64_t base = b * seq;
    kb_val q = tl_full(tl, KB_SHAPE2(n, hd), 0.0f);
    kb_val k = tl_full(tl, KB_SHAPE2(q1, hd), 0.0f);
    kb_val v = tl_full(tl, KB_SHAPE2(q1, hd), 0.0f);
    head_rows(tl, q, a->qkv, i, p, c, T, base + q0, n, act);
    head_rows(tl, k, a->qkv, nq + g, p, c, T, base, q1, act);
    head_rows(tl, v, a->qkv, nq + nkv + g, p, c, T, base, q1, act);
    kb_val kt = tl_transpose(tl, k);
    tl_free(tl, k);
    kb_val s = tl_dot(tl, q, kt);
    tl_free(tl, q);
    tl_free(tl, kt);
    kb_val pr = tl_attn_softmax(tl, s, (float)a->qscale, (float)a->softcap, 1, q0);
    tl_free(tl, s);
    kb_val o = tl_dot(tl, pr, v);
    tl_free(tl, pr);
    tl_free(tl, v);
    kb_val part = wdot(tl, o, &a->wo, j, (uint32_t)hd, (uint32_t)d, flags);
    tl_free(tl, o);
    /* this PE's own partial block (S blocks of T x d f32), rows of its queries */
    tl_store(tl, a->part + (kb_va)(((int64_t)j * T + base + q0) * d) * 4, part);
}

/* ---- decode: split-KV attention ---- */

void kb_decoder_dattn_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_dattn_args *a = KB_KARGS_GET(ka, kb_dec_dattn_args);
    int64_t C = a->chunks, clen = a->clen, kvl = a->kv_len, nq = a->nq;
    int64_t nkv = a->nkv, p = a->p, c = a->c, hd = a->hd;
    int64_t T = a->T, flags = a->flags, nrep = nq / nkv;
    kb_dtype act = F_ACT(flags);
    size_t es = kb_dtype_size(act);
    int j = pe_index(tl);
    if (j >= a->items)
        return;
    int64_t b = j / (nkv * C), g = (j / C) % nkv, p0 = (j % C) * clen;
    int64_t p1 = p0 + clen < kvl + 1 ? p0 + clen : kvl + 1, len = p1 - p0;
    int64_t ncache = (p1 < kvl ? p1 : kvl) - p0; /* cached positions of the chunk */
    kb_va kc = shard_va(tl, a->kc, j), vc = shard_va(tl, a->vc, j);
    kb_val q = tl_full(tl, KB_SHAPE2(nrep, hd), 0.0f);
    for (int64_t t = 0; t < nrep; t++)
        head_rows(tl, tl_view(tl, q, (uint32_t)t, 0, 1, (uint32_t)hd), a->qkv,
                  g * nrep + t, p, c, T, b, 1, act);
    kb_val k = tl_full(tl, KB_SHAPE2(len, hd), 0.0f), v = tl_full(tl, KB_SHAPE2(len, hd), 0.0f);
    if (ncache > 0) {
        kb_val kb = tl_load(tl, kc, KB_SHAPE2(ncache, hd), act);
        kb_val vb = tl_load(tl, vc, KB_SHAPE2(ncache, hd), act);
        tl_copy(tl, tl_view(tl, k, 0, 0, (uint32_t)ncache, (uint32_t)hd), kb);
        tl_copy(tl, tl_view(tl, v, 0, 0, (uint32_t)ncache, (uint32_t)hd), vb);
        tl_free(tl, kb);
        tl_free(tl, vb);
    }
    if (p1 == kvl + 1) {
        /* the new token: its K and V from the QKV blocks, appended to the cache */
        for (int kv = 0; kv < 2; kv++) {
            int64_t u = nq + (kv ? nkv : 0) + g;
            kb_val dst = kv ? v : k;
            for (int64_t pi = 0; pi < p; pi++) {
                kb_va src = shard_va(tl, a->qkv, (int)(u * p + pi)) + (kb_va)(b * c) * es;
                kb_val blk = tl_load(tl, src, KB_SHAPE2(1, c), act);
                tl_copy(tl, tl_view(tl, dst, (uint32_t)(len - 1), (uint32_t)(pi * c), 1,
                                    (uint32_t)c), blk);
                tl_store(tl, (kv ? vc : kc) + (kb_va)((kvl - p0) * hd + pi * c) * es, blk);
                tl_free(tl, blk);
            }
        }
    }
    kb_val kt = tl_transpose(tl, k);
    tl_free(tl, k);
    kb_val s = tl_dot(tl, q, kt);
    tl_free(tl, q);
    tl_free(tl, kt);
    kb_val ss = tl_scale(tl, s, (float)a->qscale, 0.0f);
    tl_free(tl, s);
    if (a->softcap > 0) {
        kb_val sc = tl_softcap(tl, ss, (float)a->softcap);
        tl_free(tl, ss);
        ss = sc;
    }
    kb_val mx = tl_max(tl, ss, 1);
    kb_val sh = tl_sub(tl, ss, mx);
    tl_free(tl, ss);
    kb_val e = tl_exp(tl, sh);
    tl_free(tl, sh);
    kb_val l = tl_sum(tl, e, 1);
    kb_val o = tl_dot(tl, e, v);
    /* the chunk's (P V, max, sum): nrep x (hd + 2) f32 */
    kb_va out = shard_va(tl, a->out, j);
    uint32_t ld = (uint32_t)(hd + 2);
    tl_store2d(tl, out, ld, o);
    tl_store2d(tl, out + (kb_va)hd * 4, ld, mx);
    tl_store2d(tl, out + (kb_va)(hd + 1) * 4, ld, l);
}

void kb_decoder_dcomb_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_dcomb_args *a = KB_KARGS_GET(ka, kb_dec_dcomb_args);
    int64_t C = a->chunks, nq = a->nq, nkv = a->nkv, hd = a->hd;
    int64_t T = a->T, d = a->d, flags = a->flags, nrep = nq / nkv;
    int j = pe_index(tl);
    if (j >= a->items)
        return;
    int64_t b = j / nkv;
    uint32_t ld = (uint32_t)(hd + 2);
    kb_val M = tl_full(tl, KB_SHAPE2(nrep, C), 0.0f), L = tl_full(tl, KB_SHAPE2(nrep, C), 0.0f);
    for (int64_t ch = 0; ch < C; ch++) {
        kb_va va = shard_va(tl, a->dpart, (int)(j * C + ch));
        kb_val ml = tl_load2d(tl, va + (kb_va)hd * 4, KB_SHAPE2(nrep, 2), ld, KB_F32);
        tl_copy(tl, tl_view(tl, M, 0, (uint32_t)ch, (uint32_t)nrep, 1),
                tl_view(tl, ml, 0, 0, (uint32_t)nrep, 1));
        tl_copy(tl, tl_view(tl, L, 0, (uint32_t)ch, (uint32_t)nrep, 1),
                tl_view(tl, ml, 0, 1, (uint32_t)nrep, 1));
        tl_free(tl, ml);
    }
    kb_val mx = tl_max(tl, M, 1);
    kb_val sh = tl_sub(tl, M, mx);
    kb_val w = tl_exp(tl, sh);
    tl_free(tl, sh);
    tl_free(tl, M);
    kb_val wl = tl_mul(tl, w, L);
    kb_val den = tl_sum(tl, wl, 1);
    tl_free(tl, wl);
    tl_free(tl, L);
    kb_val acc = tl_full(tl, KB_SHAPE2(nrep, hd), 0.0f);
    for (int64_t ch = 0; ch < C; ch++) {
        kb_va va = shard_va(tl, a->dpart, (int)(j * C + ch));
        kb_val oc = tl_load2d(tl, va, KB_SHAPE2(nrep, hd), ld, KB_F32);
        kb_val t = tl_mul(tl, oc, tl_view(tl, w, 0, (uint32_t)ch, (uint32_t)nrep, 1));
        kb_val s = tl_add(tl, acc, t);
        tl_free(tl, oc);
        tl_free(tl, t);
        tl_free(tl, acc);
        acc = s;
    }
    kb_val o = tl_div(tl, acc, den);
    kb_val flat = tl_full(tl, KB_SHAPE2(1, nrep * hd), 0.0f);
    for (int64_t t = 0; t < nrep; t++)
        tl_copy(tl, tl_view(tl, flat, 0, (uint32_t)(t * hd), 1, (uint32_t)hd),
                tl_view(tl, o, (uint32_t)t, 0, 1, (uint32_t)hd));
    kb_val part = wdot(tl, flat, &a->wo, j, (uint32_t)(nrep * hd), (uint32_t)d, flags);
    tl_store(tl, a->part + (kb_va)(((int64_t)j * T + b) * d) * 4, part);
}

/* ---- MLP: gate/up columns and down rows of one PE ---- */

void kb_decoder_mlp_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_mlp_args *a = KB_KARGS_GET(ka, kb_dec_mlp_args);
    int64_t T = a->T, d = a->d, cf = a->cf, tb = a->tb;
    int64_t flags = a->flags;
    int j = pe_index(tl);
    for (int64_t r0 = 0; r0 < T; r0 += tb) {
        int64_t n = T - r0 < tb ? T - r0 : tb;
        kb_val x = gemm_input(tl, a->in, j, r0, n, d, F_ACT(flags));
        kb_val g = wdot(tl, x, &a->wg, j, (uint32_t)d, (uint32_t)cf, flags);
        kb_val u = wdot(tl, x, &a->wu, j, (uint32_t)d, (uint32_t)cf, flags);
        tl_free(tl, x);
        kb_val h = tl_gated(tl, g, u, a->act);
        tl_free(tl, g);
        tl_free(tl, u);
        kb_val part = wdot(tl, h, &a->wd, j, (uint32_t)cf, (uint32_t)d, flags);
        tl_free(tl, h);
        tl_store(tl, a->part + (kb_va)(((int64_t)j * T + r0) * d) * 4, part);
        tl_free(tl, part);
    }
}
