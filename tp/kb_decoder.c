/*
 * kb_decoder — a decoder layer on a TP rank (kb_decoder.h): the plan, the rank's tensors and
 * weights (fills adapted to the placement), the kernels, the forward pass with its time
 * split, and the host f64 reference.
 */
#include "kb_decoder.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_dist.h"
#include "kb_machine.h"
#include "kb_tl.h"
#include "kb_tl_nn.h"
#include "kb_tp.h"

#define MIN_QROWS 16    /* prefill attention: query rows per PE at least (W_o rows per PE) */
#define MIN_CHUNK 16    /* decode: cache positions per PE at least */
#define MIN_QKV_COLS 32 /* QKV: columns per PE at least (reuse of the gathered activations) */
#define MLP_GRAN 32     /* MLP: columns per PE a multiple of the MX block */
#define GEMM_TB 128     /* gemm row block */

/* ---------------------------------------------------------------------------------------- */
/* plan                                                                                      */

/* The largest rectangular grid of at most maxn PEs (cubes <= ncubes, pes <= npes) whose size
 * divides n (n <= 0: any size). */
static void pick_grid(int ncubes, int npes, int64_t n, int64_t maxn, kb_dec_grid *g)
{
    int64_t S = (int64_t)ncubes * npes, top = maxn < S ? maxn : S;
    for (int64_t P = top; P >= 1; P--) {
        if (n > 0 && n % P)
            continue;
        for (int pes = npes; pes >= 1; pes--)
            if (P % pes == 0 && P / pes <= ncubes) {
                g->cubes = (int)(P / pes);
                g->pes = pes;
                g->n = (int)P;
                return;
            }
    }
    g->cubes = g->pes = g->n = 1;
}

/* A grid of at least n PEs (n <= S): whole rows of npes PEs. */
static void cover_grid(int ncubes, int npes, int64_t n, kb_dec_grid *g)
{
    (void)ncubes;
    g->pes = n < npes ? (int)n : npes;
    g->cubes = (int)((n + g->pes - 1) / g->pes);
    g->n = g->cubes * g->pes;
}

int kb_decoder_plan_make(const kb_model_cfg *mc, const kb_decoder_opts *o, int ws, int rank,
                         int ncubes, int npes, kb_decoder_plan *pl, kb_errbuf *eb)
{
    memset(pl, 0, sizeof *pl);
    pl->ws = ws;
    pl->rank = rank;
    pl->S = ncubes * npes;
    pl->d = mc->d_model;
    pl->hd = mc->head_dim;
    pl->F = mc->mlp_hidden;
    pl->T = o->decode ? o->batch : o->batch * o->seq;
    if (o->decode && o->kv_len < 1)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: decode needs kv_len >= 1");
    if (mc->n_heads % ws)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: %lld query heads do not split over "
                          "a TP size of %d", (long long)mc->n_heads, ws);
    if (mc->n_kv_heads % ws && ws % mc->n_kv_heads)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: %lld KV heads and a TP size of %d: "
                          "one must divide the other", (long long)mc->n_kv_heads, ws);
    if (pl->F % ws)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mlp_hidden %lld does not split "
                          "over a TP size of %d", (long long)pl->F, ws);
    pl->nq = mc->n_heads / ws;
    pl->q0 = (int64_t)rank * pl->nq;
    if (mc->n_kv_heads % ws == 0) {
        pl->nkv = mc->n_kv_heads / ws;
        pl->kv0 = (int64_t)rank * pl->nkv;
    } else { /* replicated: ws / Hkv ranks share each KV head */
        pl->nkv = 1;
        pl->kv0 = rank / (ws / mc->n_kv_heads);
    }
    pl->nrep = pl->nq / pl->nkv;
    pl->Floc = pl->F / ws;
    if (o->fmt == KB_QF_MXINT8 &&
        (pl->d % 32 || pl->hd % 32))
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mxint8 needs d_model and head_dim "
                          "multiples of 32 (the MX block along K)");
    if (o->sparse && (pl->d % 4 || pl->hd % 4))
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: 2:4 sparsity needs d_model and "
                          "head_dim multiples of 4");
    /* residual stream */
    if (o->seq_parallel) {
        if (pl->T % ws)
            return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: seq_parallel needs the %lld "
                              "tokens divisible by the TP size %d", (long long)pl->T, ws);
        pl->Tl = pl->T / ws;
        if ((pl->Tl * pl->d) % pl->S)
            return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: seq_parallel needs the rank's "
                              "%lld x %lld chunk divisible by its %d PEs", (long long)pl->Tl,
                              (long long)pl->d, pl->S);
        pl->piece = pl->Tl * pl->d / pl->S;
        if (pl->d % pl->piece && pl->piece % pl->d)
            return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: seq_parallel: a PE's piece "
                              "of %lld elements must hold whole rows of %lld or divide one",
                              (long long)pl->piece, (long long)pl->d);
    } else {
        pl->Tl = pl->T;
    }
    pick_grid(ncubes, npes, pl->Tl, pl->S, &pl->rows);
    pl->rc = pl->Tl / pl->rows.n;
    /* QKV: U head units of hd columns, p PEs each, the rotary pairs kept together */
    pl->U = pl->nq + 2 * pl->nkv;
    if (pl->U > pl->S)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: %lld head units on %d PEs",
                          (long long)pl->U, pl->S);
    pl->p = 1;
    for (int64_t p = pl->S / pl->U; p >= 1; p--) {
        kb_dec_grid g;
        if ((pl->hd / 2) % p || (p > 1 && pl->hd / p < MIN_QKV_COLS))
            continue;
        pick_grid(ncubes, npes, pl->U * p, pl->U * p, &g);
        if (g.n != pl->U * p)
            continue;
        pl->p = p;
        break;
    }
    pick_grid(ncubes, npes, pl->U * pl->p, pl->U * pl->p, &pl->qkv);
    if (pl->qkv.n != pl->U * pl->p)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: no PE grid for %lld QKV units",
                          (long long)pl->U);
    pl->c = pl->hd / pl->p;
    /* attention */
    if (!o->decode) {
        int64_t per = pl->S / (o->batch * pl->nq);
        if (per < 1)
            return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: %lld sequences x %lld heads "
                              "exceed the %d PEs of a rank", (long long)o->batch,
                              (long long)pl->nq, pl->S);
        int64_t qb = (o->seq + MIN_QROWS - 1) / MIN_QROWS;
        if (qb > per)
            qb = per;
        pl->qrows = (o->seq + qb - 1) / qb;
        pl->qb = (o->seq + pl->qrows - 1) / pl->qrows;
        pl->items = o->batch * pl->nq * pl->qb;
    } else {
        int64_t L = o->kv_len + 1, per = pl->S / (o->batch * pl->nkv);
        if (per < 1)
            return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: %lld sequences x %lld KV heads "
                              "exceed the %d PEs of a rank", (long long)o->batch,
                              (long long)pl->nkv, pl->S);
        int64_t C = (L + MIN_CHUNK - 1) / MIN_CHUNK;
        if (C > per)
            C = per;
        pl->clen = (L + C - 1) / C;
        pl->chunks = (L + pl->clen - 1) / pl->clen;
        pl->items = o->batch * pl->nkv * pl->chunks;
        pl->citems = o->batch * pl->nkv;
        cover_grid(ncubes, npes, pl->citems, &pl->comb);
    }
    cover_grid(ncubes, npes, pl->items, &pl->att);
    /* MLP: c_f columns of gate/up and rows of down per PE */
    {
        int64_t g = pl->Floc % MLP_GRAN == 0 ? MLP_GRAN : 1;
        if (g == 1 && (o->fmt == KB_QF_MXINT8 || o->sparse))
            return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mlp_hidden / TP = %lld must "
                              "be a multiple of %d for mxint8 or 2:4 sparsity",
                              (long long)pl->Floc, MLP_GRAN);
        pick_grid(ncubes, npes, pl->Floc / g, pl->S, &pl->mlp);
        pl->cf = pl->Floc / pl->mlp.n;
    }
    pl->tb = pl->T < GEMM_TB ? pl->T : GEMM_TB;
    pl->trows_rc = pl->rc;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* fills adapted to the placement                                                             */

static void fill_get(const kb_fill *f, int64_t row, int64_t col, int64_t rows, int64_t cols,
                     float *out)
{
    if (f->fn) {
        f->fn(f->ud, f->row0 + row, f->col0 + col, rows, cols, out);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        memcpy(out + r * cols, f->data + (f->row0 + row + r) * f->ld + f->col0 + col,
               sizeof(float) * (size_t)cols);
}

/* Column cc (0 .. hd) of a QKV PE block layout -> the head's natural column: block pi holds
 * columns [pi*c/2, (pi+1)*c/2) and the same range + hd/2 (the rotary pairs). */
static int64_t perm_col(int64_t cc, int64_t hd, int64_t c)
{
    int64_t pi = cc / c, w = cc % c, h = c / 2;
    return w < h ? pi * h + w : hd / 2 + pi * h + (w - h);
}

typedef struct dec_fill {
    const kb_decoder_plan *pl;
    const kb_decoder_opts *o;
    const kb_model_cfg *mc;
    kb_fill src[3];
    int what;
} dec_fill;

enum { DF_QKV, DF_WO_ATT, DF_WO_COMB, DF_KC, DF_VC, DF_COS, DF_SIN };

/* One source column (rows x 1, at (row, col) of src) into column oc of out (ld cols). */
static void put_col(const kb_fill *src, int64_t row, int64_t col, int64_t rows, float *tmp,
                    float *out, int64_t ld, int64_t oc)
{
    fill_get(src, row, col, rows, 1, tmp);
    for (int64_t r = 0; r < rows; r++)
        out[r * ld + oc] = tmp[r];
}

static void dec_fill_fn(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols,
                        float *out)
{
    dec_fill *f = ud;
    const kb_decoder_plan *pl = f->pl;
    int64_t hd = pl->hd;
    float *tmp = malloc(sizeof(float) * (size_t)(rows > cols ? rows : cols) * 2 + 16);
    if (!tmp) {
        for (int64_t i = 0; i < rows * cols; i++)
            out[i] = NAN; /* fills cannot fail: the verification reports the damage */
        return;
    }
    switch (f->what) {
    case DF_QKV: /* d x U*hd: column n -> unit n / hd, PE-block layout inside the head */
        for (int64_t j = 0; j < cols; j++) {
            int64_t n = col + j, u = n / hd, t = n % hd, src, gcol;
            if (u < pl->nq) {
                src = 0;
                gcol = (pl->q0 + u) * hd + perm_col(t, hd, pl->c);
            } else if (u < pl->nq + pl->nkv) {
                src = 1;
                gcol = (pl->kv0 + u - pl->nq) * hd + perm_col(t, hd, pl->c);
            } else {
                src = 2;
                gcol = (pl->kv0 + u - pl->nq - pl->nkv) * hd + t;
            }
            put_col(&f->src[src], row, gcol, rows, tmp, out, cols, j);
        }
        break;
    case DF_WO_ATT:  /* (att.n * hd) x d: PE j's hd rows = W_o rows of its item's head */
    case DF_WO_COMB: /* (comb.n * nrep*hd) x d: PE j's rows = W_o rows of its group's heads */
        for (int64_t r = 0; r < rows; r++) {
            int64_t R = row + r, srow;
            if (f->what == DF_WO_ATT) {
                int64_t j = R / hd, it = j < pl->items ? j : pl->items - 1;
                srow = (pl->q0 + (it / pl->qb) % pl->nq) * hd + R % hd;
            } else {
                int64_t k = pl->nrep * hd, j = R / k, g = j % pl->nkv;
                srow = (pl->q0 + g * pl->nrep) * hd + R % k;
            }
            fill_get(&f->src[0], srow, col, 1, cols, out + r * cols);
        }
        break;
    case DF_KC: /* (att.n * clen) x hd: PE j's rows = its chunk's cached positions */
    case DF_VC:
        for (int64_t r = 0; r < rows; r++) {
            int64_t R = row + r, j = R / pl->clen, pp = R % pl->clen;
            int64_t b = j / (pl->nkv * pl->chunks), g = (j / pl->chunks) % pl->nkv;
            int64_t pos = (j % pl->chunks) * pl->clen + pp;
            if (j >= pl->items || pos >= f->o->kv_len) {
                memset(out + r * cols, 0, sizeof(float) * (size_t)cols);
                continue;
            }
            int64_t srow = (b * f->mc->n_kv_heads + pl->kv0 + g) * f->o->kv_len + pos;
            for (int64_t c = 0; c < cols; c++) {
                int64_t cc = col + c, sc = f->what == DF_KC ? perm_col(cc, hd, pl->c) : cc;
                fill_get(&f->src[0], srow, sc, 1, 1, out + r * cols + c);
            }
        }
        break;
    case DF_COS:
    case DF_SIN: { /* T x hd/2 per token: positions b*seq + s -> s, decode -> kv_len */
        float *cs = malloc(sizeof(float) * (size_t)hd);
        if (!cs)
            break;
        for (int64_t r = 0; r < rows; r++) {
            int64_t t = row + r, pos = f->o->decode ? f->o->kv_len : t % f->o->seq;
            kb_rope_tables(&pos, 1, (int)hd, f->mc->rope_theta, cs, cs + hd / 2);
            memcpy(out + r * cols, cs + (f->what == DF_SIN ? hd / 2 : 0) + col,
                   sizeof(float) * (size_t)cols);
        }
        free(cs);
        break;
    }
    }
    free(tmp);
}

/* ---------------------------------------------------------------------------------------- */
/* kernels                                                                                   */

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

/* flags word: fmt | sparse << 8 | act dtype << 16 */
#define FLAGS(fmt, sp, act) ((int64_t)(fmt) | (int64_t)(sp) << 8 | (int64_t)(act) << 16)
#define F_FMT(x) ((kb_qfmt)((x)&0xff))
#define F_SPARSE(x) ((int)(((x) >> 8) & 0xff))
#define F_ACT(x) ((kb_dtype)(((x) >> 16) & 0xff))

/* x (m x k) @ shard j (k x n) of a weight whose parts are at w[0..2] (kb_qweight). */
static kb_val wdot(kb_tl *tl, kb_val x, const kb_va *w, int j, uint32_t k, uint32_t n,
                   int64_t flags)
{
    kb_qref q = tl_qref(tl, shard_va(tl, w[0], j), shard_va(tl, w[1], j), shard_va(tl, w[2], j),
                        k, n, F_FMT(flags), F_SPARSE(flags));
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

enum { RK_MODE, RK_RC, RK_D, RK_SP, RK_PIECE, RK_POST, RK_T, RK_ACT, RK_NCOPY };
enum { RP_X, RP_LNA, RP_LNB, RP_SUM, RP_OUT, RP_NORM };

static void rows_kernel(kb_tl *tl, const kb_kargs *a)
{
    int mode = (int)a->i[RK_MODE], sp = (int)a->i[RK_SP], post = (int)a->i[RK_POST];
    int64_t rc = a->i[RK_RC], d = a->i[RK_D], piece = a->i[RK_PIECE], T = a->i[RK_T];
    kb_dtype act = (kb_dtype)a->i[RK_ACT];
    float eps = (float)a->f[0], off = (float)a->f[1];
    int j = pe_index(tl);
    int64_t r0 = (int64_t)j * rc;
    kb_val h;
    if (mode == 0) {
        h = tl_load(tl, a->ptr[RP_X] + (kb_va)(r0 * d) * kb_dtype_size(act), KB_SHAPE2(rc, d),
                    act);
    } else {
        /* the summed partials: an all-reduced block (any block holds the sum; j's is local)
         * or the rank's reduce-scatter pieces */
        kb_val s;
        if (sp) {
            s = tl_full(tl, KB_SHAPE2(rc, d), 0.0f);
            pieces_io(tl, s, a->ptr[RP_SUM], r0, rc, d, piece, 4, 0);
        } else {
            s = tl_load(tl, a->ptr[RP_SUM] + (kb_va)(((int64_t)j * T + r0) * d) * 4,
                        KB_SHAPE2(rc, d), KB_F32);
        }
        if (post) {
            kb_val w = tl_load(tl, shard_va(tl, a->ptr[RP_LNA], j), KB_SHAPE2(1, d), KB_F32);
            kb_val n = tl_rmsnorm(tl, s, w, eps, off);
            tl_free(tl, s);
            tl_free(tl, w);
            s = n;
        }
        kb_dtype rdt = mode == 1 ? act : KB_F32;
        kb_val r = tl_load(tl, a->ptr[RP_X] + (kb_va)(r0 * d) * kb_dtype_size(rdt),
                           KB_SHAPE2(rc, d), rdt);
        h = tl_add(tl, r, s);
        tl_free(tl, r);
        tl_free(tl, s);
        tl_store(tl, a->ptr[RP_OUT] + (kb_va)(r0 * d) * 4, h);
        if (mode == 2)
            return;
    }
    kb_val w = tl_load(tl, shard_va(tl, a->ptr[RP_LNB], j), KB_SHAPE2(1, d), KB_F32);
    kb_val n = tl_rmsnorm(tl, h, w, eps, off);
    if (sp)
        pieces_io(tl, n, a->ptr[RP_NORM], r0, rc, d, piece, kb_dtype_size(act), 1);
    else /* into every gemm PE's copy of the T x d activations (gemm_input) */
        for (int64_t k = 0; k < a->i[RK_NCOPY]; k++)
            tl_store(tl, shard_va(tl, a->ptr[RP_NORM], (int)k) +
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

enum { QK_T, QK_D, QK_C, QK_P, QK_NROPE, QK_HD, QK_TB, QK_FLAGS };
enum { QP_IN, QP_W, QP_WS, QP_WM, QP_COS, QP_SIN, QP_OUT };

static void qkv_kernel(kb_tl *tl, const kb_kargs *a)
{
    int64_t T = a->i[QK_T], d = a->i[QK_D], c = a->i[QK_C], p = a->i[QK_P], hd = a->i[QK_HD];
    int64_t tb = a->i[QK_TB], flags = a->i[QK_FLAGS];
    kb_dtype act = F_ACT(flags);
    int j = pe_index(tl);
    int64_t u = j / p, pi = j % p;
    int rope = u < a->i[QK_NROPE];
    kb_va out = shard_va(tl, a->ptr[QP_OUT], j);
    for (int64_t r0 = 0; r0 < T; r0 += tb) {
        int64_t n = T - r0 < tb ? T - r0 : tb;
        kb_val x = gemm_input(tl, a->ptr[QP_IN], j, r0, n, d, act);
        kb_val y = wdot(tl, x, &a->ptr[QP_W], j, (uint32_t)d, (uint32_t)c, flags);
        tl_free(tl, x);
        if (rope) {
            kb_va co = (kb_va)(r0 * (hd / 2) + pi * (c / 2)) * 4;
            kb_val cs = tl_load2d(tl, shard_va(tl, a->ptr[QP_COS], j) + co,
                                  KB_SHAPE2(n, c / 2), (uint32_t)(hd / 2), KB_F32);
            kb_val sn = tl_load2d(tl, shard_va(tl, a->ptr[QP_SIN], j) + co,
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

enum { AK_SEQ, AK_QROWS, AK_QB, AK_NQ, AK_NKV, AK_P, AK_C, AK_HD, AK_T, AK_D, AK_FLAGS,
       AK_ITEMS };
enum { AP_QKV, AP_WO, AP_WOS, AP_WOM, AP_PART };

static void attn_kernel(kb_tl *tl, const kb_kargs *a)
{
    int64_t seq = a->i[AK_SEQ], qrows = a->i[AK_QROWS], qb = a->i[AK_QB], nq = a->i[AK_NQ];
    int64_t nkv = a->i[AK_NKV], p = a->i[AK_P], c = a->i[AK_C], hd = a->i[AK_HD];
    int64_t T = a->i[AK_T], d = a->i[AK_D], flags = a->i[AK_FLAGS];
    kb_dtype act = F_ACT(flags);
    int j = pe_index(tl);
    if (j >= a->i[AK_ITEMS])
        return;
    int64_t b = j / (nq * qb), i = (j / qb) % nq, q0 = (j % qb) * qrows;
    int64_t q1 = q0 + qrows < seq ? q0 + qrows : seq, n = q1 - q0, g = i / (nq / nkv);
    int64_t base = b * seq;
    kb_val q = tl_full(tl, KB_SHAPE2(n, hd), 0.0f);
    kb_val k = tl_full(tl, KB_SHAPE2(q1, hd), 0.0f);
    kb_val v = tl_full(tl, KB_SHAPE2(q1, hd), 0.0f);
    head_rows(tl, q, a->ptr[AP_QKV], i, p, c, T, base + q0, n, act);
    head_rows(tl, k, a->ptr[AP_QKV], nq + g, p, c, T, base, q1, act);
    head_rows(tl, v, a->ptr[AP_QKV], nq + nkv + g, p, c, T, base, q1, act);
    kb_val kt = tl_transpose(tl, k);
    tl_free(tl, k);
    kb_val s = tl_dot(tl, q, kt);
    tl_free(tl, q);
    tl_free(tl, kt);
    kb_val pr = tl_attn_softmax(tl, s, (float)a->f[0], (float)a->f[1], 1, q0);
    tl_free(tl, s);
    kb_val o = tl_dot(tl, pr, v);
    tl_free(tl, pr);
    tl_free(tl, v);
    kb_val part = wdot(tl, o, &a->ptr[AP_WO], j, (uint32_t)hd, (uint32_t)d, flags);
    tl_free(tl, o);
    /* this PE's own partial block (S blocks of T x d f32), rows of its queries */
    tl_store(tl, a->ptr[AP_PART] + (kb_va)(((int64_t)j * T + base + q0) * d) * 4, part);
}

/* ---- decode: split-KV attention ---- */

enum { DK_CH, DK_CLEN, DK_KVLEN, DK_NQ, DK_NKV, DK_P, DK_C, DK_HD, DK_T, DK_FLAGS, DK_ITEMS };
enum { DP_QKV, DP_KC, DP_VC, DP_OUT };

static void dattn_kernel(kb_tl *tl, const kb_kargs *a)
{
    int64_t C = a->i[DK_CH], clen = a->i[DK_CLEN], kvl = a->i[DK_KVLEN], nq = a->i[DK_NQ];
    int64_t nkv = a->i[DK_NKV], p = a->i[DK_P], c = a->i[DK_C], hd = a->i[DK_HD];
    int64_t T = a->i[DK_T], flags = a->i[DK_FLAGS], nrep = nq / nkv;
    kb_dtype act = F_ACT(flags);
    size_t es = kb_dtype_size(act);
    int j = pe_index(tl);
    if (j >= a->i[DK_ITEMS])
        return;
    int64_t b = j / (nkv * C), g = (j / C) % nkv, p0 = (j % C) * clen;
    int64_t p1 = p0 + clen < kvl + 1 ? p0 + clen : kvl + 1, len = p1 - p0;
    int64_t ncache = (p1 < kvl ? p1 : kvl) - p0; /* cached positions of the chunk */
    kb_va kc = shard_va(tl, a->ptr[DP_KC], j), vc = shard_va(tl, a->ptr[DP_VC], j);
    kb_val q = tl_full(tl, KB_SHAPE2(nrep, hd), 0.0f);
    for (int64_t t = 0; t < nrep; t++)
        head_rows(tl, tl_view(tl, q, (uint32_t)t, 0, 1, (uint32_t)hd), a->ptr[DP_QKV],
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
                kb_va src = shard_va(tl, a->ptr[DP_QKV], (int)(u * p + pi)) + (kb_va)(b * c) * es;
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
    kb_val ss = tl_scale(tl, s, (float)a->f[0], 0.0f);
    tl_free(tl, s);
    if (a->f[1] > 0) {
        kb_val sc = tl_softcap(tl, ss, (float)a->f[1]);
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
    kb_va out = shard_va(tl, a->ptr[DP_OUT], j);
    uint32_t ld = (uint32_t)(hd + 2);
    tl_store2d(tl, out, ld, o);
    tl_store2d(tl, out + (kb_va)hd * 4, ld, mx);
    tl_store2d(tl, out + (kb_va)(hd + 1) * 4, ld, l);
}

enum { CK_CH, CK_NQ, CK_NKV, CK_HD, CK_T, CK_D, CK_FLAGS, CK_ITEMS };
enum { CP_DPART, CP_WO, CP_WOS, CP_WOM, CP_PART };

static void dcomb_kernel(kb_tl *tl, const kb_kargs *a)
{
    int64_t C = a->i[CK_CH], nq = a->i[CK_NQ], nkv = a->i[CK_NKV], hd = a->i[CK_HD];
    int64_t T = a->i[CK_T], d = a->i[CK_D], flags = a->i[CK_FLAGS], nrep = nq / nkv;
    int j = pe_index(tl);
    if (j >= a->i[CK_ITEMS])
        return;
    int64_t b = j / nkv;
    uint32_t ld = (uint32_t)(hd + 2);
    kb_val M = tl_full(tl, KB_SHAPE2(nrep, C), 0.0f), L = tl_full(tl, KB_SHAPE2(nrep, C), 0.0f);
    for (int64_t ch = 0; ch < C; ch++) {
        kb_va va = shard_va(tl, a->ptr[CP_DPART], (int)(j * C + ch));
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
        kb_va va = shard_va(tl, a->ptr[CP_DPART], (int)(j * C + ch));
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
    kb_val part = wdot(tl, flat, &a->ptr[CP_WO], j, (uint32_t)(nrep * hd), (uint32_t)d, flags);
    tl_store(tl, a->ptr[CP_PART] + (kb_va)(((int64_t)j * T + b) * d) * 4, part);
}

/* ---- MLP: gate/up columns and down rows of one PE ---- */

enum { MK_T, MK_D, MK_CF, MK_TB, MK_FLAGS, MK_ACT };
enum { MP_IN, MP_WG, MP_WGS, MP_WGM, MP_WU, MP_WUS, MP_WUM, MP_WD, MP_WDS, MP_WDM, MP_PART };

static void mlp_kernel(kb_tl *tl, const kb_kargs *a)
{
    int64_t T = a->i[MK_T], d = a->i[MK_D], cf = a->i[MK_CF], tb = a->i[MK_TB];
    int64_t flags = a->i[MK_FLAGS];
    int j = pe_index(tl);
    for (int64_t r0 = 0; r0 < T; r0 += tb) {
        int64_t n = T - r0 < tb ? T - r0 : tb;
        kb_val x = gemm_input(tl, a->ptr[MP_IN], j, r0, n, d, F_ACT(flags));
        kb_val g = wdot(tl, x, &a->ptr[MP_WG], j, (uint32_t)d, (uint32_t)cf, flags);
        kb_val u = wdot(tl, x, &a->ptr[MP_WU], j, (uint32_t)d, (uint32_t)cf, flags);
        tl_free(tl, x);
        kb_val h = tl_gated(tl, g, u, (int)a->i[MK_ACT]);
        tl_free(tl, g);
        tl_free(tl, u);
        kb_val part = wdot(tl, h, &a->ptr[MP_WD], j, (uint32_t)cf, (uint32_t)d, flags);
        tl_free(tl, h);
        tl_store(tl, a->ptr[MP_PART] + (kb_va)(((int64_t)j * T + r0) * d) * 4, part);
        tl_free(tl, part);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* host side: tensors, weights, forward                                                      */

static int make_t(kb_ctx *ctx, const char *name, int64_t rows, int64_t cols, kb_dtype dt,
                  kb_dp_policy dp, const kb_fill *f, int zeros, kb_tensor **out)
{
    kb_tensor_desc d = { name, rows, cols, dt, dp, KB_MEM_HBM };
    if (f)
        return kb_tensor_from_fill(ctx, &d, f, out);
    return zeros ? kb_tensor_zeros(ctx, &d, out) : kb_tensor_empty(ctx, &d, out);
}

static int make_w(kb_ctx *ctx, const char *name, int64_t k, int64_t n, const kb_decoder_opts *o,
                  kb_dp_policy dp, const kb_fill *f, kb_qweight *w)
{
    return kb_qweight_create(ctx, name, k, n, o->fmt, o->sparse, dp, f, w);
}

static void wptrs(const kb_qweight *w, kb_va *p)
{
    p[0] = kb_tensor_va(w->q);
    p[1] = w->scale ? kb_tensor_va(w->scale) : 0;
    p[2] = w->meta ? kb_tensor_va(w->meta) : 0;
}

static kb_dp_policy dpg(kb_dp_split s, const kb_dec_grid *g) { return kb_dp(s, s, g->cubes, g->pes); }

int kb_decoder_create(kb_ctx *ctx, const kb_model_cfg *mc, const kb_decoder_opts *o,
                      const kb_decoder_fills *f, kb_decoder *dec)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int ws = kb_tp_world_size(ctx), r = kb_tp_get_rank(ctx), rc;
    memset(dec, 0, sizeof *dec);
    dec->mc = *mc;
    dec->o = *o;
    if (ws < 1 || r < 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "decoder layer outside a TP rank");
    if ((rc = kb_decoder_plan_make(mc, o, ws, r, m->ncubes, m->npes, &dec->pl,
                                   kb_ctx_err(ctx))) != 0)
        return rc;
    const kb_decoder_plan *pl = &dec->pl;
    kb_dtype act = o->fmt == KB_QF_BF16 ? KB_BF16 : KB_F16;
    dec->act = act;
    int64_t d = pl->d, hd = pl->hd, T = pl->T, Tl = pl->Tl, S = pl->S;
    kb_dp_policy rows = dpg(KB_DP_ROW_WISE, &pl->rows), all = kb_dist_policy(ctx);
    kb_dp_policy allcol = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, m->ncubes, m->npes);
    dec_fill fq = { &dec->pl, &dec->o, &dec->mc, { f->wq, f->wk, f->wv }, DF_QKV };
    dec_fill fc = { &dec->pl, &dec->o, &dec->mc, { { 0 } }, DF_COS };
    dec_fill fs = { &dec->pl, &dec->o, &dec->mc, { { 0 } }, DF_SIN };
    dec_fill fo = { &dec->pl, &dec->o, &dec->mc, { f->wo }, o->decode ? DF_WO_COMB : DF_WO_ATT };
    dec_fill fk = { &dec->pl, &dec->o, &dec->mc, { f->kc }, DF_KC };
    dec_fill fv = { &dec->pl, &dec->o, &dec->mc, { f->vc }, DF_VC };
    kb_fill Fq = { dec_fill_fn, &fq, NULL, 0, 0, 0, NULL },
            Fc = { dec_fill_fn, &fc, NULL, 0, 0, 0, NULL },
            Fs = { dec_fill_fn, &fs, NULL, 0, 0, 0, NULL },
            Fo = { dec_fill_fn, &fo, NULL, 0, 0, 0, NULL },
            Fk = { dec_fill_fn, &fk, NULL, 0, 0, 0, NULL },
            Fv = { dec_fill_fn, &fv, NULL, 0, 0, 0, NULL };
    kb_fill fx = kb_fill_at(f->x, o->seq_parallel ? (int64_t)r * Tl : 0, 0);
    kb_fill fg = kb_fill_at(f->wg, 0, (int64_t)r * pl->Floc);
    kb_fill fu = kb_fill_at(f->wu, 0, (int64_t)r * pl->Floc);
    kb_fill fd = kb_fill_at(f->wd, (int64_t)r * pl->Floc, 0);
    static const char *const ln_names[4] = { "ln_input", "ln_post_attn", "ln_pre_ffw",
                                             "ln_post_ffw" };
    if ((rc = make_t(ctx, "x", Tl, d, act, rows, &fx, 0, &dec->x)) != 0)
        return rc;
    for (int i = 0; i < 4; i++)
        if ((i % 2 == 0 || mc->post_norms) &&
            (rc = make_t(ctx, ln_names[i], 1, d, KB_F32, dpg(KB_DP_REPLICATE, &pl->rows),
                         &f->ln[i], 0, &dec->ln[i])) != 0)
            return rc;
    if ((rc = make_t(ctx, "rope_cos", T, hd / 2, KB_F32, dpg(KB_DP_REPLICATE, &pl->qkv), &Fc, 0,
                     &dec->cosq)) != 0 ||
        (rc = make_t(ctx, "rope_sin", T, hd / 2, KB_F32, dpg(KB_DP_REPLICATE, &pl->qkv), &Fs, 0,
                     &dec->sinq)) != 0 ||
        (rc = make_w(ctx, "w_qkv", d, pl->U * hd, o, dpg(KB_DP_COLUMN_WISE, &pl->qkv), &Fq,
                     &dec->wqkv)) != 0 ||
        (rc = make_t(ctx, "qkv", T, pl->U * hd, act, dpg(KB_DP_COLUMN_WISE, &pl->qkv), NULL, 0,
                     &dec->qkv)) != 0)
        return rc;
    if (!o->decode) {
        rc = make_w(ctx, "w_o", (int64_t)pl->att.n * hd, d, o, dpg(KB_DP_ROW_WISE, &pl->att), &Fo,
                    &dec->wo);
    } else {
        int64_t rows_c = (int64_t)pl->att.n * pl->clen;
        if ((rc = make_t(ctx, "k_cache", rows_c, hd, act, dpg(KB_DP_ROW_WISE, &pl->att), &Fk, 0,
                         &dec->kc)) != 0 ||
            (rc = make_t(ctx, "v_cache", rows_c, hd, act, dpg(KB_DP_ROW_WISE, &pl->att), &Fv, 0,
                         &dec->vc)) != 0 ||
            (rc = make_t(ctx, "attn_chunks", (int64_t)pl->att.n * pl->nrep, hd + 2, KB_F32,
                         dpg(KB_DP_ROW_WISE, &pl->att), NULL, 0, &dec->dpart)) != 0)
            return rc;
        rc = make_w(ctx, "w_o", (int64_t)pl->comb.n * pl->nrep * hd, d, o,
                    dpg(KB_DP_ROW_WISE, &pl->comb), &Fo, &dec->wo);
    }
    if (rc)
        return rc;
    int64_t prow = o->seq_parallel ? S : S * T, pcol = o->seq_parallel ? T * d : d;
    if ((rc = make_t(ctx, "partial_attn", prow, pcol, KB_F32, all, NULL, 1, &dec->po)) != 0 ||
        (rc = make_t(ctx, "partial_mlp", prow, pcol, KB_F32, all, NULL, 1, &dec->pd)) != 0 ||
        (rc = make_t(ctx, "h", Tl, d, KB_F32, rows, NULL, 0, &dec->h)) != 0 ||
        (rc = make_t(ctx, "y", Tl, d, KB_F32, rows, NULL, 0, &dec->y)) != 0 ||
        (rc = make_w(ctx, "w_gate", d, pl->Floc, o, dpg(KB_DP_COLUMN_WISE, &pl->mlp), &fg,
                     &dec->wg)) != 0 ||
        (rc = make_w(ctx, "w_up", d, pl->Floc, o, dpg(KB_DP_COLUMN_WISE, &pl->mlp), &fu,
                     &dec->wu)) != 0 ||
        (rc = make_w(ctx, "w_down", pl->Floc, d, o, dpg(KB_DP_ROW_WISE, &pl->mlp), &fd,
                     &dec->wd)) != 0)
        return rc;
    if (o->seq_parallel) {
        if ((rc = make_t(ctx, "ag1_in", 1, Tl * d, act, allcol, NULL, 0, &dec->ag1_in)) != 0 ||
            (rc = make_t(ctx, "ag1", S, T * d, act, all, NULL, 0, &dec->ag1)) != 0 ||
            (rc = make_t(ctx, "ag2_in", 1, Tl * d, act, allcol, NULL, 0, &dec->ag2_in)) != 0 ||
            (rc = make_t(ctx, "ag2", S, T * d, act, all, NULL, 0, &dec->ag2)) != 0 ||
            (rc = make_t(ctx, "rs_attn", 1, Tl * d, KB_F32, allcol, NULL, 0, &dec->rs_o)) != 0 ||
            (rc = make_t(ctx, "rs_mlp", 1, Tl * d, KB_F32, allcol, NULL, 0, &dec->rs_d)) != 0)
            return rc;
    } else {
        /* one T x d copy per gemm PE, written by the row owners */
        if ((rc = make_t(ctx, "hn_attn", (int64_t)pl->qkv.n * T, d, act,
                         dpg(KB_DP_ROW_WISE, &pl->qkv), NULL, 0, &dec->hn1)) != 0 ||
            (rc = make_t(ctx, "hn_mlp", (int64_t)pl->mlp.n * T, d, act,
                         dpg(KB_DP_ROW_WISE, &pl->mlp), NULL, 0, &dec->hn2)) != 0)
            return rc;
    }
    return 0;
}

/* ---- forward with the time split ---- */

typedef struct phase {
    kb_time t0;
    kb_time *busy0;   /* per PE of the rank's SIP: PE_GEMM + PE_MATH busy */
    kb_time gemm0;    /* sum of PE_GEMM busy over the SIP */
} phase;

static void snap(kb_ctx *ctx, kb_time *per_pe, kb_time *gemm_sum)
{
    kb_machine *m = kb_ctx_machine(ctx);
    const kb_sip_hw *s = &m->sips[kb_ctx_current_device(ctx)];
    kb_time g = 0;
    for (int c = 0; c < m->ncubes; c++)
        for (int p = 0; p < m->npes; p++) {
            const kb_pe_hw *pe = &s->cubes[c].pes[p];
            per_pe[c * m->npes + p] = pe->gemm.busy + pe->math.busy;
            g += pe->gemm.busy;
        }
    *gemm_sum = g;
}

static int launch_timed(kb_ctx *ctx, kb_decoder *dec, phase *ph, const char *name,
                        kb_kernel_fn fn, const kb_kargs *a, const kb_dec_grid *g, int proj)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int S = m->ncubes * m->npes, rc;
    kb_time *now_busy = ph->busy0 + S, gemm1;
    kb_grid grid = { g->pes, g->cubes, 1, -1 };
    snap(ctx, ph->busy0, &ph->gemm0);
    ph->t0 = kb_sim_now(kb_ctx_sim(ctx));
    if ((rc = kb_launch(ctx, name, fn, a, &grid)) != 0)
        return rc;
    kb_time dt = kb_sim_now(kb_ctx_sim(ctx)) - ph->t0, cmax = 0;
    snap(ctx, now_busy, &gemm1);
    for (int i = 0; i < S; i++)
        if (now_busy[i] - ph->busy0[i] > cmax)
            cmax = now_busy[i] - ph->busy0[i];
    if (cmax > dt)
        cmax = dt;
    dec->st.compute_ns += kb_time_to_ns(cmax);
    dec->st.memory_ns += kb_time_to_ns(dt - cmax);
    if (proj)
        dec->st.proj_gemm_busy_ns += kb_time_to_ns(gemm1 - ph->gemm0);
    return 0;
}

enum { C_AR, C_RS, C_AG };
static int coll_timed(kb_ctx *ctx, kb_decoder *dec, int kind, kb_tensor *out, kb_tensor *in)
{
    kb_time t0 = kb_sim_now(kb_ctx_sim(ctx));
    int rc = kind == C_AR   ? kb_dist_all_reduce(ctx, in, KB_DIST_SUM)
             : kind == C_RS ? kb_dist_reduce_scatter(ctx, out, in)
                            : kb_dist_all_gather(ctx, out, in);
    dec->st.comm_ns += kb_time_to_ns(kb_sim_now(kb_ctx_sim(ctx)) - t0);
    return rc;
}

double kb_decoder_gemm_closed_ns(const kb_topo_cfg *c, kb_qfmt fmt, int sparse, uint64_t m,
                                  uint64_t n, uint64_t k)
{
    uint64_t tm = (uint64_t)c->sched_tile_m, tn = (uint64_t)c->sched_tile_n,
             tk = (uint64_t)c->sched_tile_k;
    double t = 0;
    for (uint64_t m0 = 0; m0 < m; m0 += tm)
        for (uint64_t n0 = 0; n0 < n; n0 += tn)
            for (uint64_t k0 = 0; k0 < k; k0 += tk)
                t += kb_qgemm_ns(c, fmt, sparse, m - m0 < tm ? m - m0 : tm,
                                 n - n0 < tn ? n - n0 : tn, k - k0 < tk ? k - k0 : tk);
    return t;
}

/* The closed form of the projection gemms of the QKV and MLP kernels on one rank. */
static double proj_closed(kb_ctx *ctx, const kb_decoder *dec)
{
    const kb_topo_cfg *c = &kb_ctx_machine(ctx)->cfg;
    const kb_decoder_plan *pl = &dec->pl;
    kb_qfmt f = dec->o.fmt;
    int sp = dec->o.sparse;
    double t = 0;
    for (int64_t r0 = 0; r0 < pl->T; r0 += pl->tb) {
        uint64_t n = (uint64_t)(pl->T - r0 < pl->tb ? pl->T - r0 : pl->tb);
        t += pl->qkv.n * kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->c, (uint64_t)pl->d);
        t += pl->mlp.n *
             (2 * kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->cf, (uint64_t)pl->d) +
              kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->d, (uint64_t)pl->cf));
    }
    return t;
}

int kb_decoder_forward(kb_ctx *ctx, kb_decoder *dec)
{
    kb_machine *m = kb_ctx_machine(ctx);
    const kb_decoder_plan *pl = &dec->pl;
    const kb_decoder_opts *o = &dec->o;
    const kb_model_cfg *mc = &dec->mc;
    int sp = o->seq_parallel, rc = 0;
    int64_t flags = FLAGS(o->fmt, o->sparse, dec->act);
    phase ph;
    kb_kargs a;
    memset(&dec->st, 0, sizeof dec->st);
    ph.busy0 = calloc(2 * (size_t)m->ncubes * (size_t)m->npes, sizeof(kb_time));
    if (!ph.busy0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");

    /* row owners: rows kernel args shared by the three calls */
    kb_kargs ra;
    memset(&ra, 0, sizeof ra);
    ra.i[RK_RC] = pl->rc;
    ra.i[RK_D] = pl->d;
    ra.i[RK_SP] = sp;
    ra.i[RK_PIECE] = pl->piece;
    ra.i[RK_POST] = mc->post_norms;
    ra.i[RK_T] = pl->T;
    ra.i[RK_ACT] = dec->act;
    ra.f[0] = mc->norm_eps;
    ra.f[1] = mc->norm_unit_offset;

    /* 1. input norm -> the QKV PEs' input */
    a = ra;
    a.i[RK_MODE] = 0;
    a.i[RK_NCOPY] = pl->qkv.n;
    a.ptr[RP_X] = kb_tensor_va(dec->x);
    a.ptr[RP_LNB] = kb_tensor_va(dec->ln[0]);
    a.ptr[RP_NORM] = kb_tensor_va(sp ? dec->ag1_in : dec->hn1);
    if ((rc = launch_timed(ctx, dec, &ph, "dec_norm_in", rows_kernel, &a, &pl->rows, 0)) != 0 ||
        (sp && (rc = coll_timed(ctx, dec, C_AG, dec->ag1, dec->ag1_in)) != 0))
        goto out;

    /* 2. QKV + RoPE */
    memset(&a, 0, sizeof a);
    a.i[QK_T] = pl->T;
    a.i[QK_D] = pl->d;
    a.i[QK_C] = pl->c;
    a.i[QK_P] = pl->p;
    a.i[QK_NROPE] = pl->nq + pl->nkv;
    a.i[QK_HD] = pl->hd;
    a.i[QK_TB] = pl->tb;
    a.i[QK_FLAGS] = flags;
    a.ptr[QP_IN] = kb_tensor_va(sp ? dec->ag1 : dec->hn1);
    wptrs(&dec->wqkv, &a.ptr[QP_W]);
    a.ptr[QP_COS] = kb_tensor_va(dec->cosq);
    a.ptr[QP_SIN] = kb_tensor_va(dec->sinq);
    a.ptr[QP_OUT] = kb_tensor_va(dec->qkv);
    if ((rc = launch_timed(ctx, dec, &ph, "dec_qkv", qkv_kernel, &a, &pl->qkv, 1)) != 0)
        goto out;

    /* 3. attention (+ its W_o rows) into the attention partials */
    memset(&a, 0, sizeof a);
    a.f[0] = kb_model_qscale(mc);
    a.f[1] = mc->attn_softcap;
    if (!o->decode) {
        a.i[AK_SEQ] = o->seq;
        a.i[AK_QROWS] = pl->qrows;
        a.i[AK_QB] = pl->qb;
        a.i[AK_NQ] = pl->nq;
        a.i[AK_NKV] = pl->nkv;
        a.i[AK_P] = pl->p;
        a.i[AK_C] = pl->c;
        a.i[AK_HD] = pl->hd;
        a.i[AK_T] = pl->T;
        a.i[AK_D] = pl->d;
        a.i[AK_FLAGS] = flags;
        a.i[AK_ITEMS] = pl->items;
        a.ptr[AP_QKV] = kb_tensor_va(dec->qkv);
        wptrs(&dec->wo, &a.ptr[AP_WO]);
        a.ptr[AP_PART] = kb_tensor_va(dec->po);
        if ((rc = launch_timed(ctx, dec, &ph, "dec_attention", attn_kernel, &a, &pl->att, 0)) != 0)
            goto out;
    } else {
        a.i[DK_CH] = pl->chunks;
        a.i[DK_CLEN] = pl->clen;
        a.i[DK_KVLEN] = o->kv_len;
        a.i[DK_NQ] = pl->nq;
        a.i[DK_NKV] = pl->nkv;
        a.i[DK_P] = pl->p;
        a.i[DK_C] = pl->c;
        a.i[DK_HD] = pl->hd;
        a.i[DK_T] = pl->T;
        a.i[DK_FLAGS] = flags;
        a.i[DK_ITEMS] = pl->items;
        a.ptr[DP_QKV] = kb_tensor_va(dec->qkv);
        a.ptr[DP_KC] = kb_tensor_va(dec->kc);
        a.ptr[DP_VC] = kb_tensor_va(dec->vc);
        a.ptr[DP_OUT] = kb_tensor_va(dec->dpart);
        if ((rc = launch_timed(ctx, dec, &ph, "dec_attention_chunks", dattn_kernel, &a, &pl->att,
                               0)) != 0)
            goto out;
        memset(&a, 0, sizeof a);
        a.i[CK_CH] = pl->chunks;
        a.i[CK_NQ] = pl->nq;
        a.i[CK_NKV] = pl->nkv;
        a.i[CK_HD] = pl->hd;
        a.i[CK_T] = pl->T;
        a.i[CK_D] = pl->d;
        a.i[CK_FLAGS] = flags;
        a.i[CK_ITEMS] = pl->citems;
        a.ptr[CP_DPART] = kb_tensor_va(dec->dpart);
        wptrs(&dec->wo, &a.ptr[CP_WO]);
        a.ptr[CP_PART] = kb_tensor_va(dec->po);
        if ((rc = launch_timed(ctx, dec, &ph, "dec_attention_combine", dcomb_kernel, &a,
                               &pl->comb, 0)) != 0)
            goto out;
    }
    if ((rc = coll_timed(ctx, dec, sp ? C_RS : C_AR, dec->rs_o, dec->po)) != 0)
        goto out;

    /* 4. residual + norms -> the MLP PEs' input */
    a = ra;
    a.i[RK_MODE] = 1;
    a.i[RK_NCOPY] = pl->mlp.n;
    a.ptr[RP_X] = kb_tensor_va(dec->x);
    a.ptr[RP_LNA] = dec->ln[1] ? kb_tensor_va(dec->ln[1]) : 0;
    a.ptr[RP_LNB] = kb_tensor_va(dec->ln[2]);
    a.ptr[RP_SUM] = kb_tensor_va(sp ? dec->rs_o : dec->po);
    a.ptr[RP_OUT] = kb_tensor_va(dec->h);
    a.ptr[RP_NORM] = kb_tensor_va(sp ? dec->ag2_in : dec->hn2);
    if ((rc = launch_timed(ctx, dec, &ph, "dec_residual_attn", rows_kernel, &a, &pl->rows, 0)) != 0 ||
        (sp && (rc = coll_timed(ctx, dec, C_AG, dec->ag2, dec->ag2_in)) != 0))
        goto out;

    /* 5. MLP into the MLP partials */
    memset(&a, 0, sizeof a);
    a.i[MK_T] = pl->T;
    a.i[MK_D] = pl->d;
    a.i[MK_CF] = pl->cf;
    a.i[MK_TB] = pl->tb;
    a.i[MK_FLAGS] = flags;
    a.i[MK_ACT] = kb_model_act(mc);
    a.ptr[MP_IN] = kb_tensor_va(sp ? dec->ag2 : dec->hn2);
    wptrs(&dec->wg, &a.ptr[MP_WG]);
    wptrs(&dec->wu, &a.ptr[MP_WU]);
    wptrs(&dec->wd, &a.ptr[MP_WD]);
    a.ptr[MP_PART] = kb_tensor_va(dec->pd);
    if ((rc = launch_timed(ctx, dec, &ph, "dec_mlp", mlp_kernel, &a, &pl->mlp, 1)) != 0 ||
        (rc = coll_timed(ctx, dec, sp ? C_RS : C_AR, dec->rs_d, dec->pd)) != 0)
        goto out;

    /* 6. residual */
    a = ra;
    a.i[RK_MODE] = 2;
    a.ptr[RP_X] = kb_tensor_va(dec->h);
    a.ptr[RP_LNA] = dec->ln[3] ? kb_tensor_va(dec->ln[3]) : 0;
    a.ptr[RP_SUM] = kb_tensor_va(sp ? dec->rs_d : dec->pd);
    a.ptr[RP_OUT] = kb_tensor_va(dec->y);
    rc = launch_timed(ctx, dec, &ph, "dec_residual_mlp", rows_kernel, &a, &pl->rows, 0);
    dec->st.proj_gemm_closed_ns = proj_closed(ctx, dec);
out:
    free(ph.busy0);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* host f64 reference                                                                         */

typedef struct mm_job {
    const double *a;
    const float *w;
    double *out;
    int64_t m0, m1, K, N;
} mm_job;

/* out rows [m0, m1) = a @ w, i-k-j order (rows of w streamed, out row in cache) */
static void *mm_rows(void *p)
{
    mm_job *j = p;
    for (int64_t i = j->m0; i < j->m1; i++) {
        double *o = j->out + i * j->N;
        for (int64_t n = 0; n < j->N; n++)
            o[n] = 0.0;
        for (int64_t k = 0; k < j->K; k++) {
            double x = j->a[i * j->K + k];
            const float *w = j->w + k * j->N;
            if (x == 0.0)
                continue;
            for (int64_t n = 0; n < j->N; n++)
                o[n] += x * (double)w[n];
        }
    }
    return NULL;
}

/* out (M x N) = a (M x K) @ w (K x N) on two threads (the reference of a Gemma-2 layer at
 * seq 128 is ~10 G multiply-adds). */
static void ref_mm(const double *a, const float *w, double *out, int64_t M, int64_t K, int64_t N)
{
    mm_job j[2] = { { a, w, out, 0, M / 2, K, N }, { a, w, out, M / 2, M, K, N } };
    pthread_t th;
    if (M >= 2 && (double)M * K * N > 1e7 && pthread_create(&th, NULL, mm_rows, &j[1]) == 0) {
        mm_rows(&j[0]);
        pthread_join(th, NULL);
        return;
    }
    j[0].m1 = M;
    mm_rows(&j[0]);
}

/* x rounded to what a store of dtype dt keeps */
static void ref_round(double *x, int64_t n, kb_dtype dt)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = dt == KB_BF16 ? kb_bf16_to_f32(kb_f32_to_bf16((float)x[i]))
             : dt == KB_F16  ? kb_f16_to_f32(kb_f32_to_f16((float)x[i]))
                             : (double)(float)x[i];
}

/* tl_dot_q's activation quantization of x (M x K), per row over each seg columns; tmp holds
 * 2 * M * seg floats */
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

int kb_decoder_reference(const kb_model_cfg *mc, const kb_decoder_opts *o,
                         const kb_decoder_ref_in *in, double *out, kb_errbuf *eb)
{
    int64_t d = mc->d_model, hd = mc->head_dim, Hq = mc->n_heads, Hkv = mc->n_kv_heads;
    int64_t F = mc->mlp_hidden, T = o->decode ? o->batch : o->batch * o->seq;
    int64_t nq = Hq * hd, nk = Hkv * hd, rep = Hq / Hkv;
    int64_t L = o->decode ? o->kv_len + 1 : o->seq; /* keys per sequence */
    double scale = kb_model_qscale(mc), cap = mc->attn_softcap, off = mc->norm_unit_offset;
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
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = o->decode ? o->kv_len : t % o->seq;
        for (int64_t hh = 0; hh < Hq; hh++)
            ref_rope(q + t * nq + hh * hd, hd, pos, mc->rope_theta);
        for (int64_t hh = 0; hh < Hkv; hh++)
            ref_rope(k + t * nk + hh * hd, hd, pos, mc->rope_theta);
    }
    ref_round(q, T * nq, in->act);
    ref_round(k, T * nk, in->act);
    ref_round(v, T * nk, in->act);
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
    for (int64_t i = 0; i < T * F; i++) {
        double z = g[i];
        double a = kb_model_act(mc) == KB_ACT_SILU
                       ? z / (1.0 + exp(-z))
                       : 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
        g[i] = a * u[i];
    }
    if ((rc = ref_quant(fmt, g, T, F, in->mlp_seg, qt)) != 0)
        goto qfail;
    ref_mm(g, in->wd, t1, T, F, d);
    if (mc->post_norms) {
        ref_rmsnorm(t1, in->ln[3], n, T, d, mc->norm_eps, off);
        memcpy(t1, n, sizeof(double) * (size_t)(T * d));
    }
    for (int64_t i = 0; i < T * d; i++)
        out[i] = h[i] + t1[i];
    (void)L;
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
