/*
 * kb_decoder_kernels — the decoder layer's kernels (part of the decoder, kb_decoder.h, which
 * describes the placement they implement; their argument structs are in kb_decoder_int.h): the
 * row owners' norms and residual adds, QKV with RoPE, prefill attention with its W_o rows,
 * decode's split-KV attention and its combination, and the MLP. Each PE finds its work from
 * its index in the launch's grid; weights go through tl_dot_q in their number format.
 * Mapping machine's kernels keep their DMAs in flight together (inputs loaded ahead, small
 * stores posted), where naive's wait for each.
 * Limits: the shapes are the plan's (kb_decoder_plan_make), which the kernels do not check.
 */
#include "kb_decoder_int.h"

#include <assert.h>

#include "kb_runtime_ext.h"
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

/* Whether a DMA of `bytes` is latency-bound: its bytes take no longer at one DMA channel's
 * rate than the channel's setup and an HBM access (15 KiB on the shipped machine). */
static int latency_bound(kb_tl *tl, double bytes)
{
    const kb_topo_cfg *c = &kb_ctx_machine(tl_ctx(tl))->cfg;
    return bytes <= (c->dma_setup_ns + c->hbm.latency_ns) * c->dma_bandwidth_gbps;
}

/*
 * A store of machine's kernels (posted != 0) that is latency-bound goes posted: the kernel
 * goes on, so a loop of them has one per DMA channel in flight, and *landed gets the latest
 * landing (free the value after it; the kernel's end waits for it anyway). Otherwise, and
 * always for naive's kernels, it waits (tl_store): posting a bandwidth-bound store gains
 * nothing once the ports are busy, and the reservation model (first come, first served,
 * timing-model.md §12) then queues the later traffic behind it (Mistral-7B TP 8 seq 2048
 * lost 7 % with its row owners' 128 KiB copies posted).
 */
static void dec_store(kb_tl *tl, int posted, kb_va va, uint32_t ld, kb_val v, size_t es,
                      int64_t *landed)
{
    if (posted && latency_bound(tl, (double)v.rows * v.cols * (double)es)) {
        int64_t t = tl_store2d_async(tl, va, ld, v);
        *landed = t > *landed ? t : *landed;
    } else if (ld == v.cols) {
        tl_store(tl, va, v);
    } else {
        tl_store2d(tl, va, ld, v);
    }
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

/* An input a machine kernel loads ahead (every one in flight at once), or not (have 0). */
typedef struct dec_pre {
    kb_val v;
    int64_t ready;
    int have;
} dec_pre;

static void pre_load(kb_tl *tl, dec_pre *p, kb_va va, kb_shape s, kb_dtype dt)
{
    p->v = tl_load_async(tl, va, s, dt, &p->ready);
    p->have = 1;
}

/* The input at va: the one loaded ahead, once it is there, or a load now. */
static kb_val pre_get(kb_tl *tl, dec_pre *p, kb_va va, kb_shape s, kb_dtype dt)
{
    if (!p->have)
        return tl_load(tl, va, s, dt);
    tl_wait_time(tl, p->ready);
    return p->v;
}

void kb_decoder_rows_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_rows_args *a = KB_KARGS_GET(ka, kb_dec_rows_args);
    int mode = a->mode, sp = a->sp, post = a->post;
    int64_t rc = a->rc, d = a->d, piece = a->piece;
    kb_dtype act = a->act;
    float eps = (float)a->eps, off = (float)a->off;
    int j = pe_index(tl);
    int64_t r0 = (int64_t)j * rc;
    kb_dtype rdt = mode == 1 ? act : KB_F32, xdt = mode == 0 ? act : rdt;
    kb_va xva = a->x + (kb_va)(r0 * d) * kb_dtype_size(xdt);
    kb_va sva = a->sum + (kb_va)(((int64_t)j * a->sblock + r0) * d) * 4;
    kb_val h;
    /* machine: every input in flight at once (naive loads each where it is used) */
    dec_pre px = { { 0 }, 0, 0 }, ps = px, pa = px, pb = px;
    if (a->posted) {
        if (mode != 0 && !sp)
            pre_load(tl, &ps, sva, KB_SHAPE2(rc, d), KB_F32);
        if (mode != 0 && post)
            pre_load(tl, &pa, shard_va(tl, a->lna, j), KB_SHAPE2(1, d), KB_F32);
        pre_load(tl, &px, xva, KB_SHAPE2(rc, d), xdt);
        if (mode != 2)
            pre_load(tl, &pb, shard_va(tl, a->lnb, j), KB_SHAPE2(1, d), KB_F32);
    }
    if (mode == 0) {
        h = pre_get(tl, &px, xva, KB_SHAPE2(rc, d), act);
    } else {
        /* the summed partials: an all-reduced block (any block holds the sum; j's is local)
         * or the rank's reduce-scatter pieces */
        kb_val s;
        if (sp) {
            s = tl_full(tl, KB_SHAPE2(rc, d), 0.0f);
            pieces_io(tl, s, a->sum, r0, rc, d, piece, 4, 0);
        } else {
            s = pre_get(tl, &ps, sva, KB_SHAPE2(rc, d), KB_F32);
        }
        if (post) {
            kb_val w = pre_get(tl, &pa, shard_va(tl, a->lna, j), KB_SHAPE2(1, d), KB_F32);
            kb_val n = tl_rmsnorm(tl, s, w, eps, off);
            tl_free(tl, s);
            tl_free(tl, w);
            s = n;
        }
        kb_val r = pre_get(tl, &px, xva, KB_SHAPE2(rc, d), rdt);
        h = tl_add(tl, r, s);
        tl_free(tl, r);
        tl_free(tl, s);
        /* machine: the norm below goes on while h is stored (it only reads h, which lives
         * until the kernel's end, and that waits for the store) */
        if (a->posted)
            (void)tl_store_async(tl, a->out + (kb_va)(r0 * d) * 4, h);
        else
            tl_store(tl, a->out + (kb_va)(r0 * d) * 4, h);
        if (mode == 2)
            return;
    }
    kb_val w = pre_get(tl, &pb, shard_va(tl, a->lnb, j), KB_SHAPE2(1, d), KB_F32);
    kb_val n = tl_rmsnorm(tl, h, w, eps, off);
    if (sp)
        pieces_io(tl, n, a->norm, r0, rc, d, piece, kb_dtype_size(act), 1);
    else { /* into the copy of each gemm PE of the rows' token group (gemm_input) */
        int64_t g = r0 / a->tr, landed = 0; /* n lives until the kernel's end */
        for (int64_t k = 0; k < a->ncopy; k++)
            dec_store(tl, a->posted,
                      shard_va(tl, a->norm, (int)((g * a->ncopy + k) * a->cstride)) +
                          (kb_va)((r0 - g * a->tr) * d) * kb_dtype_size(act),
                      n.cols, n, kb_dtype_size(act), &landed);
    }
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

/* Whether an item of attention cube cc reads a row of [r0, r0 + n): item j = (sequence
 * j / qb, query block j mod qb) reads its sequence's rows up to its last query. */
static int cube_reads(const kb_dec_qkv_args *a, int64_t cc, int64_t r0, int64_t n)
{
    /* the cube's PEs [cc apes, (cc + 1) apes) take items j / ocol */
    for (int64_t j = cc * a->apes / a->ocol; j <= ((cc + 1) * a->apes - 1) / a->ocol &&
                                             j < a->items; j++) {
        int64_t b = j / a->qb, q1 = (j % a->qb + 1) * a->qrows;
        int64_t lo = b * a->seq, hi = lo + (q1 < a->seq ? q1 : a->seq);
        if (r0 < hi && r0 + n > lo)
            return 1;
    }
    return 0;
}

/* machine: rows [r0, r0 + n) of K/V head unit h (K of the local KV heads, then V; columns
 * [col, col + y.cols)) into the copy of every attention cube that reads them (causal: the
 * cubes of later queries), split where a PE's part ends. */
static void kv_replicate(kb_tl *tl, const kb_dec_qkv_args *a, kb_val y, int64_t h, int64_t r0,
                         int64_t n, int64_t col, int64_t *landed)
{
    size_t es = kb_dtype_size(F_ACT(a->flags));
    assert(h >= 0 && h < 2 * a->nkv && a->rep_rows > 0);
    for (int64_t cc = 0; cc < a->rep_cubes; cc++) {
        if (!cube_reads(a, cc, r0, n))
            continue;
        int64_t row = cc * 2 * a->nkv * a->T + h * a->T + r0;
        for (int64_t t = 0; t < n;) {
            int64_t e = ((row + t) / a->rep_rows + 1) * a->rep_rows - row;
            if (e > n)
                e = n;
            dec_store(tl, F_IS_POSTED(a->flags), a->rep + (kb_va)((row + t) * a->hd + col) * es,
                      (uint32_t)a->hd, tl_view(tl, y, (uint32_t)t, 0, (uint32_t)(e - t), y.cols),
                      es, landed);
            t = e;
        }
    }
}

void kb_decoder_qkv_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_qkv_args *a = KB_KARGS_GET(ka, kb_dec_qkv_args);
    if (F_STAGES(a->flags))
        kb_tl_set_stages(tl, F_STAGES(a->flags));
    int64_t d = a->d, c = a->c, p = a->p, hd = a->hd;
    int64_t tb = a->tb, flags = a->flags;
    kb_dtype act = F_ACT(flags);
    int j = pe_index(tl);
    int64_t jj = j % a->ncol, lo = j / a->ncol * a->tr, hi = lo + a->tr;
    int64_t u = jj / p, pi = jj % p;
    int rope = u < a->nrope;
    kb_va out = shard_va(tl, a->out, j);
    for (int64_t r0 = lo; r0 < hi; r0 += tb) {
        int64_t n = hi - r0 < tb ? hi - r0 : tb;
        kb_val x = gemm_input(tl, a->in, a->shared ? j / a->shared * a->shared : j, r0 - lo, n,
                              d, act);
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
        int64_t landed = 0; /* y is read until then */
        dec_store(tl, F_IS_POSTED(flags), out + (kb_va)((r0 - lo) * c) * kb_dtype_size(act),
                  y.cols, y, kb_dtype_size(act), &landed);
        if (a->rep && u >= a->nq)
            kv_replicate(tl, a, y, u - a->nq, r0, n, pi * c, &landed);
        tl_free_after(tl, y, landed);
    }
}

/* machine: a block to load into dst at (at, col), rows x cols of the activation dtype. */
typedef struct dec_seg {
    kb_va va;
    int64_t at, col, rows, cols;
} dec_seg;
typedef dec_seg (*dec_seg_fn)(const void *ud, int64_t k);

/* The nseg blocks seg(ud, k) into dst (f32), `wave` of them (at most MAX_WAVE) in flight at
 * a time (tl_load_async over the PE's DMA channels) before they are copied in. */
#define HEAD_WAVE 8
#define MAX_WAVE 64
static void load_segs_wave(kb_tl *tl, kb_val dst, int64_t nseg, dec_seg_fn seg,
                           const void *ud, kb_dtype act, int64_t wave)
{
    assert(wave >= 1 && wave <= MAX_WAVE);
    for (int64_t w0 = 0; w0 < nseg; w0 += wave) {
        kb_val blk[MAX_WAVE];
        dec_seg sg[MAX_WAVE];
        int64_t ready = 0, nw = 0;
        for (int64_t k = w0; k < nseg && nw < wave; k++, nw++) {
            int64_t rdy;
            sg[nw] = seg(ud, k);
            assert(sg[nw].rows > 0 && sg[nw].at >= 0); /* the segments tile dst's rows */
            blk[nw] = tl_load_async(tl, sg[nw].va, KB_SHAPE2(sg[nw].rows, sg[nw].cols), act,
                                    &rdy);
            ready = rdy > ready ? rdy : ready;
        }
        tl_wait_time(tl, ready);
        for (int64_t k = 0; k < nw; k++) {
            tl_copy(tl, tl_view(tl, dst, (uint32_t)sg[k].at, (uint32_t)sg[k].col,
                                (uint32_t)sg[k].rows, (uint32_t)sg[k].cols), blk[k]);
            tl_free(tl, blk[k]);
        }
    }
}

/* The same for segments already in dst's dtype: each DMA'd straight into its view of dst,
 * a wave in flight at once, with no copy. */
static void load_segs_into(kb_tl *tl, kb_val dst, int64_t nseg, dec_seg_fn seg, const void *ud,
                           int64_t wave)
{
    assert(wave >= 1);
    for (int64_t w0 = 0; w0 < nseg; w0 += wave) {
        int64_t ready = 0;
        for (int64_t k = w0; k < nseg && k < w0 + wave; k++) {
            dec_seg s = seg(ud, k);
            int64_t rdy = tl_load_into_async(tl, tl_view(tl, dst, (uint32_t)s.at, (uint32_t)s.col,
                                                         (uint32_t)s.rows, (uint32_t)s.cols),
                                             s.va, (uint32_t)s.cols);
            ready = rdy > ready ? rdy : ready;
        }
        tl_wait_time(tl, ready);
    }
}

static void load_segs(kb_tl *tl, kb_val dst, int64_t nseg, dec_seg_fn seg, const void *ud,
                      kb_dtype act)
{
    load_segs_wave(tl, dst, nseg, seg, ud, act, HEAD_WAVE);
}

/* machine: rows [r0, r0 + n) of head unit u from the QKV blocks, which are split in token
 * groups of tr rows with ncol blocks each: one segment per (group, block of the unit). */
typedef struct head_src {
    kb_tl *tl;
    kb_va qkv;
    int64_t u, p, c, ncol, tr, r0, n, g0;
    size_t es;
} head_src;

static dec_seg head_seg(const void *ud, int64_t k)
{
    const head_src *h = ud;
    int64_t g = h->g0 + k / h->p, pi = k % h->p;
    int64_t t = g * h->tr > h->r0 ? g * h->tr : h->r0;
    int64_t e = (g + 1) * h->tr < h->r0 + h->n ? (g + 1) * h->tr : h->r0 + h->n;
    return (dec_seg){ shard_va(h->tl, h->qkv, (int)(g * h->ncol + h->u * h->p + pi)) +
                          (kb_va)((t - g * h->tr) * h->c) * h->es,
                      t - h->r0, pi * h->c, e - t, h->c };
}

static void head_rows_m(kb_tl *tl, kb_val dst, kb_va qkv, int64_t u, int64_t p, int64_t c,
                        int64_t ncol, int64_t tr, int64_t r0, int64_t n, kb_dtype act)
{
    head_src h = { tl, qkv, u, p, c, ncol, tr, r0, n, r0 / tr, kb_dtype_size(act) };
    load_segs(tl, dst, ((r0 + n - 1) / tr - r0 / tr + 1) * p, head_seg, &h, act);
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

/* machine: rows [r0, r0 + n) of the cube's K/V copy (hd columns, `per` rows per PE): one
 * segment per PE's part. */
typedef struct rep_src {
    kb_va rep;
    int64_t per, hd, r0, n;
    size_t es;
} rep_src;

static dec_seg rep_seg(const void *ud, int64_t k)
{
    const rep_src *r = ud;
    int64_t t = k == 0 ? r->r0 : (r->r0 / r->per + k) * r->per;
    int64_t e = (t / r->per + 1) * r->per < r->r0 + r->n ? (t / r->per + 1) * r->per
                                                         : r->r0 + r->n;
    return (dec_seg){ r->rep + (kb_va)(t * r->hd) * r->es, t - r->r0, 0, e - t, r->hd };
}

/* K (rows [rk, rk + n) of the copy) into rows [0, n) of kv and V (from rv) into rows
 * [n, 2n): the segments of both in flight at once (waves of MAX_WAVE). */
typedef struct kv_src {
    rep_src k, v;
    int64_t nk; /* K's segments; V's follow */
} kv_src;

static dec_seg kv_seg(const void *ud, int64_t i)
{
    const kv_src *s = ud;
    dec_seg g = i < s->nk ? rep_seg(&s->k, i) : rep_seg(&s->v, i - s->nk);
    g.at += i < s->nk ? 0 : s->k.n; /* V's rows sit below K's in the pair's value */
    return g;
}

static void rep_rows_kv(kb_tl *tl, kb_val kv, kb_va rep, int64_t per, int64_t hd, int64_t rk,
                        int64_t rv, int64_t n, kb_dtype act)
{
    size_t es = kb_dtype_size(act);
    kv_src s = { { rep, per, hd, rk, n, es }, { rep, per, hd, rv, n, es }, 0 };
    int64_t nv = (rv + n - 1) / per - rv / per + 1;
    s.nk = (rk + n - 1) / per - rk / per + 1;
    load_segs_wave(tl, kv, s.nk + nv, kv_seg, &s, act,
                   s.nk + nv < MAX_WAVE ? s.nk + nv : MAX_WAVE);
}

/* softmax_causal(softcap(scale q k^T)) v for queries from position q0 (n x hd f32) */
static kb_val attend(kb_tl *tl, const kb_dec_attn_args *a, kb_val q, kb_val kt, kb_val v,
                     int64_t q0)
{
    kb_val s = tl_dot(tl, q, kt);
    kb_val pr = tl_attn_softmax(tl, s, (float)a->qscale, (float)a->softcap, 1, q0);
    tl_free(tl, s);
    kb_val o = tl_dot(tl, pr, v);
    tl_free(tl, pr);
    return o;
}

/*
 * machine: item j = (sequence, block of query rows) for every local head: per KV head, K and
 * V of the prefix from the cube's copy, then each of its query heads' output into its
 * columns of o (n x nq*hd), multiplied by the rank's W_o rows: the SIP's O rows, stored into
 * the row owners' blocks of the sum.
 */
static void attn_items_all_heads(kb_tl *tl, const kb_dec_attn_args *a, int pe)
{
    int64_t seq = a->seq, nq = a->nq, nkv = a->nkv, hd = a->hd, d = a->d, T = a->T;
    kb_dtype act = F_ACT(a->flags);
    /* item j on PE pe, with W_o columns [cq dq, (cq + 1) dq) (ocol of them per item) */
    int64_t j = pe / a->ocol, cq = pe % a->ocol, dq = d / a->ocol;
    int64_t b = j / a->qb, q0 = (j % a->qb) * a->qrows;
    int64_t q1 = q0 + a->qrows < seq ? q0 + a->qrows : seq, n = q1 - q0, base = b * seq;
    kb_va rep = a->rep + (kb_va)((int64_t)(pe / a->apes) * 2 * nkv * T * hd) *
                             kb_dtype_size(act);
    assert(n > 0 && nq % nkv == 0); /* an item has rows; GQA groups of whole heads */
    kb_val o = kb_tl_scratch_val(tl, (uint32_t)n, (uint32_t)(nq * hd), KB_F32, "decoder attention");
    for (int64_t h = 0; h < nkv; h++) {
        /* K and V of the prefix, both loaded at once: rows [0, q1) and [q1, 2 q1) of kv */
        kb_val kv = kb_tl_scratch_val(tl, (uint32_t)(2 * q1), (uint32_t)hd, KB_F32,
                                      "decoder attention");
        rep_rows_kv(tl, kv, rep, a->rep_rows, hd, h * T + base, (nkv + h) * T + base, q1, act);
        kb_val v = tl_view(tl, kv, (uint32_t)q1, 0, (uint32_t)q1, (uint32_t)hd);
        kb_val kt = tl_transpose(tl, tl_view(tl, kv, 0, 0, (uint32_t)q1, (uint32_t)hd));
        for (int64_t i = h * (nq / nkv); i < (h + 1) * (nq / nkv); i++) {
            kb_val q = kb_tl_scratch_val(tl, (uint32_t)n, (uint32_t)hd, KB_F32,
                                         "decoder attention");
            head_rows_m(tl, q, a->qkv, i, a->p, a->c, a->ncol, a->tr, base + q0, n, act);
            kb_val oi = attend(tl, a, q, kt, v, q0);
            tl_free(tl, q);
            tl_copy(tl, tl_view(tl, o, 0, (uint32_t)(i * hd), (uint32_t)n, (uint32_t)hd), oi);
            tl_free(tl, oi);
        }
        tl_free(tl, kt);
        tl_free(tl, kv);
    }
    kb_val part = wdot(tl, o, &a->wo, pe, (uint32_t)(nq * hd), (uint32_t)dq, a->flags);
    tl_free(tl, o);
    int64_t landed = 0; /* part is read until then */
    for (int64_t t = 0; t < n;) { /* a row owner's block at a time (one PE's shard each) */
        int64_t r = base + q0 + t, e = (r / a->rc + 1) * a->rc - (base + q0);
        kb_val rows;
        if (e > n)
            e = n;
        rows = tl_view(tl, part, (uint32_t)t, 0, (uint32_t)(e - t), (uint32_t)dq);
        dec_store(tl, F_IS_POSTED(a->flags),
                  a->sum + (kb_va)(r * d + (a->ocol == 1 ? 0 : cq * dq)) * 4,
                  a->ocol == 1 ? rows.cols : (uint32_t)d, rows, 4, &landed);
        t = e;
    }
    tl_free_after(tl, part, landed);
}

void kb_decoder_attn_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_attn_args *a = KB_KARGS_GET(ka, kb_dec_attn_args);
    if (F_STAGES(a->flags))
        kb_tl_set_stages(tl, F_STAGES(a->flags));
    int64_t seq = a->seq, qrows = a->qrows, qb = a->qb, nq = a->nq;
    int64_t nkv = a->nkv, p = a->p, c = a->c, hd = a->hd;
    int64_t T = a->T, d = a->d, flags = a->flags;
    kb_dtype act = F_ACT(flags);
    int j = pe_index(tl);
    if (a->own) {
        assert(d % a->ocol == 0); /* the plan's divisor */
        if (j / a->ocol < a->items)
            attn_items_all_heads(tl, a, j);
        return;
    }
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

/* machine decode: block pi of head unit u0 + k / p (k < n p) of token b's QKV row, as row
 * k / p of the destination (u0, step: units 0, step, ...: the queries of a KV group, or the
 * KV group's K and V). */
typedef struct unit_src {
    kb_tl *tl;
    kb_va qkv;
    int64_t u0, step, p, c, b;
    size_t es;
} unit_src;

static dec_seg unit_seg(const void *ud, int64_t k)
{
    const unit_src *s = ud;
    int64_t t = k / s->p, pi = k % s->p;
    return (dec_seg){ shard_va(s->tl, s->qkv, (int)((s->u0 + t * s->step) * s->p + pi)) +
                          (kb_va)(s->b * s->c) * s->es,
                      t, pi * s->c, 1, s->c };
}

/* machine decode: the new token's K and V rows (from the QKV blocks, all loads in flight at
 * once) into the last row of k and v and, one store each, into the cache */
static void dattn_new_kv(kb_tl *tl, const kb_dec_dattn_args *a, kb_val k, kb_val v, int64_t g,
                         int64_t b, int64_t row, kb_va kc, kb_va vc)
{
    kb_dtype act = F_ACT(a->flags);
    size_t es = kb_dtype_size(act);
    int64_t hd = a->hd, last = (int64_t)k.rows - 1;
    unit_src us = { tl, a->qkv, a->nq + g, a->nkv, a->p, a->c, b, es };
    kb_val kv = kb_tl_scratch_val(tl, 2, (uint32_t)hd, KB_F32, "decoder attention");
    load_segs(tl, kv, 2 * a->p, unit_seg, &us, act);
    tl_copy(tl, tl_view(tl, k, (uint32_t)last, 0, 1, (uint32_t)hd),
            tl_view(tl, kv, 0, 0, 1, (uint32_t)hd));
    tl_copy(tl, tl_view(tl, v, (uint32_t)last, 0, 1, (uint32_t)hd),
            tl_view(tl, kv, 1, 0, 1, (uint32_t)hd));
    int64_t landed = 0; /* kv is read until then */
    dec_store(tl, F_IS_POSTED(a->flags), kc + (kb_va)(row * hd) * es, (uint32_t)hd,
              tl_view(tl, kv, 0, 0, 1, (uint32_t)hd), es, &landed);
    dec_store(tl, F_IS_POSTED(a->flags), vc + (kb_va)(row * hd) * es, (uint32_t)hd,
              tl_view(tl, kv, 1, 0, 1, (uint32_t)hd), es, &landed);
    tl_free_after(tl, kv, landed);
}

/* A chunk PE's rows x hd f32 value: zeroed (naive), or not where every row is written
 * before it is read (machine). */
static kb_val dattn_rows(kb_tl *tl, int fast, int64_t rows, int64_t hd)
{
    if (!fast)
        return tl_full(tl, KB_SHAPE2(rows, hd), 0.0f);
    return kb_tl_scratch_val(tl, (uint32_t)rows, (uint32_t)hd, KB_F32, "decoder attention");
}

void kb_decoder_dattn_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_dattn_args *a = KB_KARGS_GET(ka, kb_dec_dattn_args);
    if (F_STAGES(a->flags))
        kb_tl_set_stages(tl, F_STAGES(a->flags));
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
    /* machine: the chunk's cached K and V on their way while the query blocks come */
    kb_val kb = { 0 }, vb = { 0 };
    int64_t rk = 0, rv = 0;
    if (a->fast && ncache > 0) {
        kb = tl_load_async(tl, kc, KB_SHAPE2(ncache, hd), act, &rk);
        vb = tl_load_async(tl, vc, KB_SHAPE2(ncache, hd), act, &rv);
    }
    kb_val q = dattn_rows(tl, a->fast, nrep, hd);
    if (a->fast) { /* every query block in flight at once */
        unit_src us = { tl, a->qkv, g * nrep, 1, p, c, b, es };
        load_segs(tl, q, nrep * p, unit_seg, &us, act);
    } else {
        for (int64_t t = 0; t < nrep; t++)
            head_rows(tl, tl_view(tl, q, (uint32_t)t, 0, 1, (uint32_t)hd), a->qkv,
                      g * nrep + t, p, c, T, b, 1, act);
    }
    /* machine: no zero fill, every row is written below (the cached ones, then the new
     * token's when the chunk holds position kv_len) */
    kb_val k = dattn_rows(tl, a->fast, len, hd), v = dattn_rows(tl, a->fast, len, hd);
    assert(ncache == len || ncache + 1 == len); /* the new token is the last row */
    if (ncache > 0) {
        if (a->fast) {
            tl_wait_time(tl, rk > rv ? rk : rv);
        } else {
            kb = tl_load(tl, kc, KB_SHAPE2(ncache, hd), act);
            vb = tl_load(tl, vc, KB_SHAPE2(ncache, hd), act);
        }
        tl_copy(tl, tl_view(tl, k, 0, 0, (uint32_t)ncache, (uint32_t)hd), kb);
        tl_copy(tl, tl_view(tl, v, 0, 0, (uint32_t)ncache, (uint32_t)hd), vb);
        tl_free(tl, kb);
        tl_free(tl, vb);
    }
    if (p1 == kvl + 1 && a->fast) {
        dattn_new_kv(tl, a, k, v, g, b, kvl - p0, kc, vc);
    } else if (p1 == kvl + 1) {
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
    int64_t landed = 0; /* o, mx, l live until the kernel's end, which waits for them */
    dec_store(tl, F_IS_POSTED(flags), out, ld, o, 4, &landed);
    dec_store(tl, F_IS_POSTED(flags), out + (kb_va)hd * 4, ld, mx, 4, &landed);
    dec_store(tl, F_IS_POSTED(flags), out + (kb_va)(hd + 1) * 4, ld, l, 4, &landed);
}

/* machine decode: chunk ch's row of query head t (P V, max, sum: hd + 2 f32) as a segment
 * of head t's C rows. */
typedef struct chunk_src {
    kb_tl *tl;
    kb_va dpart;
    int64_t C, hd, first; /* first: the combining PE's first chunk shard */
} chunk_src;

static dec_seg chunk_seg(const void *ud, int64_t k)
{
    const chunk_src *c = ud;
    int64_t t = k / c->C, ch = k % c->C;
    return (dec_seg){ shard_va(c->tl, c->dpart, (int)(c->first + ch)) +
                          (kb_va)(t * (c->hd + 2)) * 4,
                      k, 0, 1, c->hd + 2 };
}

/* machine decode: every chunk's (P V, max, sum) of every query head loaded at once (head t's
 * C chunks in rows [t C, (t + 1) C)), then per head the chunks' weights exp(m_c - max m),
 * the denominator sum w_c l_c and the output (w^T [P V]) / den as a few bulk operations
 * instead of a dozen per chunk; the heads' outputs into flat (1 x nrep hd). */
static void dcomb_bulk(kb_tl *tl, const kb_dec_dcomb_args *a, int j, int64_t nrep, kb_val flat)
{
    int64_t C = a->chunks, hd = a->hd;
    chunk_src cs = { tl, a->dpart, C, hd, (int64_t)j * C };
    kb_val P = kb_tl_scratch_val(tl, (uint32_t)(nrep * C), (uint32_t)(hd + 2), KB_F32,
                                 "decoder combine");
    /* small segments from every cube: latency-bound, so many in flight, each straight into
     * its row of P (f32 both) */
    load_segs_into(tl, P, nrep * C, chunk_seg, &cs, MAX_WAVE);
    for (int64_t t = 0; t < nrep; t++) {
        uint32_t r0 = (uint32_t)(t * C);
        kb_val m = tl_view(tl, P, r0, (uint32_t)hd, (uint32_t)C, 1);
        kb_val mx = tl_max(tl, m, 0);
        kb_val sh = tl_sub(tl, m, mx);
        kb_val w = tl_exp(tl, sh);
        kb_val wl = tl_mul(tl, w, tl_view(tl, P, r0, (uint32_t)hd + 1, (uint32_t)C, 1));
        kb_val den = tl_sum(tl, wl, 0);
        kb_val wt = tl_transpose(tl, w);
        kb_val num = tl_dot(tl, wt, tl_view(tl, P, r0, 0, (uint32_t)C, (uint32_t)hd));
        kb_val o = tl_div(tl, num, den);
        tl_copy(tl, tl_view(tl, flat, 0, (uint32_t)(t * hd), 1, (uint32_t)hd), o);
        tl_free(tl, o);
        tl_free(tl, num);
        tl_free(tl, wt);
        tl_free(tl, den);
        tl_free(tl, wl);
        tl_free(tl, w);
        tl_free(tl, sh);
        tl_free(tl, mx);
    }
    tl_free(tl, P);
}

void kb_decoder_dcomb_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_dcomb_args *a = KB_KARGS_GET(ka, kb_dec_dcomb_args);
    if (F_STAGES(a->flags))
        kb_tl_set_stages(tl, F_STAGES(a->flags));
    int64_t C = a->chunks, nq = a->nq, nkv = a->nkv, hd = a->hd;
    int64_t T = a->T, d = a->d, flags = a->flags, nrep = nq / nkv;
    int j = pe_index(tl);
    if (a->fast) {
        /* item j / ccol, its W_o columns [q dq, (q + 1) dq) (shard j), stored into the PE's
         * own block of the partials, whose other columns stay zero */
        int64_t it = j / a->ccol, q = j % a->ccol, dq = d / a->ccol;
        assert(dq * a->ccol == d); /* the plan's divisor */
        if (it >= a->items)
            return;
        kb_val flat = kb_tl_scratch_val(tl, 1, (uint32_t)(nrep * hd), KB_F32, "decoder combine");
        dcomb_bulk(tl, a, (int)it, nrep, flat);
        kb_val part = wdot(tl, flat, &a->wo, j, (uint32_t)(nrep * hd), (uint32_t)dq, flags);
        tl_free(tl, flat);
        if (a->sum) { /* one KV head: the sequence's row of the sum, its columns this PE's */
            assert(nkv == 1);
            tl_store(tl, a->sum + (kb_va)(it * d + q * dq) * 4, part);
        } else {
            tl_store(tl, a->part + (kb_va)(((int64_t)j * T + it / nkv) * d + q * dq) * 4, part);
        }
        tl_free(tl, part);
        return;
    }
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
    if (F_STAGES(a->flags))
        kb_tl_set_stages(tl, F_STAGES(a->flags));
    int64_t d = a->d, cf = a->cf, tb = a->tb;
    int64_t flags = a->flags;
    int j = pe_index(tl);
    int64_t lo = j / a->ncol * a->tr, hi = lo + a->tr;
    for (int64_t r0 = lo; r0 < hi; r0 += tb) {
        int64_t n = hi - r0 < tb ? hi - r0 : tb;
        kb_val x = gemm_input(tl, a->in, a->shared ? j / a->shared * a->shared : j, r0 - lo, n,
                              d, F_ACT(flags));
        kb_val g = wdot(tl, x, &a->wg, j, (uint32_t)d, (uint32_t)cf, flags);
        kb_val u = wdot(tl, x, &a->wu, j, (uint32_t)d, (uint32_t)cf, flags);
        tl_free(tl, x);
        kb_val h = tl_gated(tl, g, u, a->act);
        tl_free(tl, g);
        tl_free(tl, u);
        kb_val part = wdot(tl, h, &a->wd, j, (uint32_t)cf, (uint32_t)d, flags);
        tl_free(tl, h);
        tl_store(tl, a->part + (kb_va)(((int64_t)j * a->tr + r0 - lo) * d) * 4, part);
        tl_free(tl, part);
    }
}

/* ---- machine: the SIP's partial sums of a row owner's rows ---- */

/* Bytes of a row owner's blocks a wave of the MLP sums keeps in flight (scratch). */
#define GSUM_WAVE_BYTES ((int64_t)2 << 20)

void kb_decoder_gsum_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dec_gsum_args *a = KB_KARGS_GET(ka, kb_dec_gsum_args);
    int64_t rc = a->rc, d = a->d, r0 = (int64_t)pe_index(tl) * rc, g = r0 / a->tr;
    kb_val acc = { 0 }, v[MAX_WAVE];
    int64_t rdy[MAX_WAVE], wave = GSUM_WAVE_BYTES / (rc * d * 4);
    assert(a->ncol >= 1 && (r0 - g * a->tr) + rc <= a->tr); /* a block inside one group */
    /* the group's column blocks, a wave of loads in flight at once (into one PE: its own
     * DMA channels and TCM port are the limit either way), added in column order */
    wave = wave < 1 ? 1 : wave > MAX_WAVE ? MAX_WAVE : wave;
    for (int64_t w0 = 0; w0 < a->ncol; w0 += wave) {
        int64_t nw = a->ncol - w0 < wave ? a->ncol - w0 : wave;
        for (int64_t k = 0; k < nw; k++)
            v[k] = tl_load_async(tl, shard_va(tl, a->src, (int)(g * a->ncol + w0 + k)) +
                                         (kb_va)((r0 - g * a->tr) * d) * 4,
                                 KB_SHAPE2(rc, d), KB_F32, &rdy[k]);
        for (int64_t k = 0; k < nw; k++) {
            tl_wait_time(tl, rdy[k]);
            if (w0 + k == 0) {
                acc = v[k];
                continue;
            }
            kb_val sum = tl_add(tl, acc, v[k]);
            tl_free(tl, acc);
            tl_free(tl, v[k]);
            acc = sum;
        }
    }
    tl_store(tl, a->out + (kb_va)(r0 * d) * 4, acc);
    tl_free(tl, acc);
}
