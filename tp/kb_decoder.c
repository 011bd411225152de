/*
 * kb_decoder — a decoder layer on a TP rank (kb_decoder.h): the plan (where each part of the
 * layer goes on the rank's PEs, from the model and the options alone) and the rank's tensors
 * and weights, whose fills are adapted to the placement (QKV columns in PE-block order with the
 * rotary pairs together, W_o rows per attention PE, cache rows per chunk, RoPE tables). The
 * layer's other files: kb_decoder_kernels.c (its kernels), kb_decoder_fwd.c (the forward pass
 * and its time split) and kb_decoder_ref.c (the host f64 reference); what they share is in
 * kb_decoder_int.h. Limits: those kb_decoder.h lists (head counts against the TP size,
 * seq_parallel's divisibility), which the plan refuses with a message.
 */
#include "kb_decoder_int.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_dist.h"
#include "kb_machine.h"
#include "kb_tl_nn.h"
#include "kb_tp.h"

#define MIN_QROWS 16    /* prefill attention: query rows per PE at least (W_o rows per PE) */
#define MIN_CHUNK 16    /* decode: cache positions per PE at least */
#define MIN_QKV_COLS 32 /* QKV: columns per PE at least (reuse of the gathered activations) */
#define MLP_GRAN 32     /* MLP: columns per PE a multiple of the MX block */
#define GEMM_TB 128     /* gemm row block */
#define SHARED_MAX_BYTES 16384 /* machine decode: normalised rows read from one copy */

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

/* The head split over the ranks (KV heads replicated when there are fewer than ranks) and the
 * shape rules of the number formats. */
static int plan_heads(const kb_model_cfg *mc, const kb_decoder_opts *o, int ws, int rank,
                      kb_decoder_plan *pl, kb_errbuf *eb)
{
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
    return 0;
}

/* The residual stream: the rank's tokens (its chunk of them with seq_parallel, cut into one
 * piece per PE) in blocks of rows over the row owners. */
static int plan_rows(const kb_decoder_opts *o, int ws, int ncubes, int npes,
                     kb_decoder_plan *pl, kb_errbuf *eb)
{
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
    return 0;
}

/* QKV: U head units of hd columns, p PEs each, the rotary pairs kept together. */
static int plan_qkv(int ncubes, int npes, kb_decoder_plan *pl, kb_errbuf *eb)
{
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
    return 0;
}

/* Attention: prefill, one item per (sequence, query head, block of query rows); decode, one
 * per (sequence, KV head, chunk of the cache), and the PEs that combine the chunks. */
static int plan_attention(const kb_decoder_opts *o, int ncubes, int npes, kb_decoder_plan *pl,
                          kb_errbuf *eb)
{
    if (!o->decode) {
        /* machine: an item takes every local head of its query rows (they share K and V) */
        pl->hg = o->mapping == KB_DEC_MAP_MACHINE ? pl->nq : 1;
        int64_t per = pl->S / (o->batch * (pl->nq / pl->hg));
        if (per < 1)
            return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: %lld sequences x %lld heads "
                              "exceed the %d PEs of a rank", (long long)o->batch,
                              (long long)pl->nq, pl->S);
        int64_t qb = (o->seq + MIN_QROWS - 1) / MIN_QROWS;
        if (qb > per)
            qb = per;
        pl->qrows = (o->seq + qb - 1) / qb;
        pl->qb = (o->seq + pl->qrows - 1) / pl->qrows;
        pl->items = o->batch * (pl->nq / pl->hg) * pl->qb;
    } else {
        int64_t L = o->kv_len + 1, per = pl->S / (o->batch * pl->nkv);
        if (per < 1)
            return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: %lld sequences x %lld KV heads "
                              "exceed the %d PEs of a rank", (long long)o->batch,
                              (long long)pl->nkv, pl->S);
        int64_t C = (L + MIN_CHUNK - 1) / MIN_CHUNK;
        if (o->mapping == KB_DEC_MAP_MACHINE) {
            /* machine: the chunk count that balances the two ends of the critical path, a
             * chunk PE's K and V reads (L / C positions of 2 hd activations) against the
             * combining PE's partial reads (C chunks of nrep (hd + 2) f32) */
            const double es = 2.0; /* the cache's f16 or bf16 */
            int64_t cb = llround(sqrt((double)L * 2.0 * (double)pl->hd * es /
                                      ((double)pl->nrep * (double)(pl->hd + 2) * 4.0)));
            if (cb < C)
                C = cb < 1 ? 1 : cb;
        }
        if (C > per)
            C = per;
        pl->clen = (L + C - 1) / C;
        pl->chunks = (L + pl->clen - 1) / pl->clen;
        pl->items = o->batch * pl->nkv * pl->chunks;
        pl->citems = o->batch * pl->nkv;
        cover_grid(ncubes, npes, pl->citems, &pl->comb);
    }
    cover_grid(ncubes, npes, pl->items, &pl->att);
    return 0;
}

/* MLP: c_f columns of gate/up and rows of down per PE */
static int plan_mlp(const kb_decoder_opts *o, int ncubes, int npes, kb_decoder_plan *pl,
                    kb_errbuf *eb)
{
    int64_t g = pl->Floc % MLP_GRAN == 0 ? MLP_GRAN : 1;
    if (g == 1 && (o->fmt == KB_QF_MXINT8 || o->sparse))
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mlp_hidden / TP = %lld must "
                          "be a multiple of %d for mxint8 or 2:4 sparsity",
                          (long long)pl->Floc, MLP_GRAN);
    pick_grid(ncubes, npes, pl->Floc / g, pl->S, &pl->mlp);
    pl->cf = pl->Floc / pl->mlp.n;
    return 0;
}

/*
 * Mapping machine: token groups x column blocks for a projection. Among the column-block
 * counts cand[0..nc), the one whose grid of R groups uses the most PEs, R the largest divisor
 * of the row owners' count (so a group holds whole row-owner blocks) with R * ncol PEs in an
 * exact rectangle of the SIP; ties go to the largest count that fits a cube (the copies and
 * the sums then stay in one cube), else to the smallest. 0 when none fits.
 */
static int pick_groups(int ncubes, int npes, int64_t owners, const int64_t *cand, int nc,
                       int64_t *ncol, int64_t *R, kb_dec_grid *grid)
{
    int64_t S = (int64_t)ncubes * npes, best = 0, bkey = 0;
    for (int k = 0; k < nc; k++) {
        int64_t n = cand[k], r = 0;
        kb_dec_grid g;
        for (int64_t x = S / n; x >= 1 && !r; x--)
            if (owners % x == 0) {
                pick_grid(ncubes, npes, x * n, x * n, &g);
                if (g.n == x * n)
                    r = x;
            }
        if (!r)
            continue;
        int64_t key = n <= npes ? n : -n;
        if (r * n > best || (r * n == best && key > bkey)) {
            best = r * n;
            bkey = key;
            *ncol = n;
            *R = r;
            pick_grid(ncubes, npes, r * n, r * n, grid);
        }
    }
    return best > 0;
}

/*
 * Machine: `items` work items (at most a cube each) that each multiply by the W_o rows (W
 * bytes in f16), spread over c PEs of their cube, each with d / c columns of them, so that
 * one PE does not read the rows alone. Each of the c PEs loads the item's own input (`load`
 * bytes), so c is the largest divisor of d (and of `div`) with c copies of the input costing
 * no more than one PE's block: c^2 load <= W. Sets *g to items cubes x c PEs when c > 1;
 * returns c (1: one PE per item, *g untouched).
 */
static int64_t split_wo(int64_t d, int64_t div, int64_t items, int ncubes, int npes,
                        int64_t load, int64_t W, kb_dec_grid *g)
{
    int64_t cols = 1;
    for (int c = npes; c > 1 && items <= ncubes && cols == 1; c--)
        if (d % c == 0 && div % c == 0 && (int64_t)c * c * load <= W)
            cols = c;
    if (cols > 1) {
        g->cubes = (int)items;
        g->pes = (int)cols;
        g->n = (int)(items * cols);
    }
    return cols;
}

/* The projections' token groups: one group of every token for naive; for machine the QKV
 * units' split p (with the rotary rule of plan_qkv) and the MLP's column count cf (a multiple
 * of its granule) that pick_groups prefers. */
static int plan_groups(const kb_decoder_opts *o, int ws, int ncubes, int npes,
                       kb_decoder_plan *pl, kb_errbuf *eb)
{
    int64_t cand[64], R;
    int nc = 0;
    /* naive's one group of every token (machine prefill replaces it below) */
    pl->qncol = pl->qkv.n;
    pl->mncol = pl->mlp.n;
    pl->qtr = pl->mtr = pl->T;
    pl->ccol = pl->ocol = 1;
    if (o->mapping != KB_DEC_MAP_MACHINE)
        return 0;
    if (o->seq_parallel)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mapping=machine (1) maps prefill "
                          "and decode without seq_parallel; use mapping=naive (0) for "
                          "seq_parallel");
    if (o->decode) { /* naive's placement, the combine in bulk */
        pl->dmachine = 1;
        /* every item's combination on ccol PEs: each loads all the chunks' partials
         * (C nrep (hd + 2) f32) against the W_o rows nrep hd x d */
        pl->ccol = split_wo(pl->d, pl->d, pl->citems, ncubes, npes,
                            pl->chunks * pl->nrep * (pl->hd + 2) * 4,
                            pl->nrep * pl->hd * pl->d * 2, &pl->comb);
        /* a few tokens' rows: one copy that every gemm PE reads (a few KB from one port)
         * costs less than a store per gemm PE; more tokens keep the copies */
        pl->shared = pl->T * pl->d * 2 <= SHARED_MAX_BYTES;
        /* one KV head per rank: the items' W_o column blocks are disjoint (no partial sums
         * in the SIP), so they go into the row owners' sum rows, whose lanes alone all-reduce
         * them (the row owners in one cube: kb_dist_all_reduce_shards' first lanes) */
        pl->dsum = pl->nkv == 1 && pl->rows.cubes == 1 && (pl->rc * pl->d) % ws == 0;
        /* the MLP's partial rows likewise: summed by the row owners first (a few KB from
         * each MLP PE, all loads in flight), so that only their lanes cross the SIPs, where
         * the process group's hierarchical all-reduce ran over every PE's block */
        pl->dmsum = pl->rows.cubes == 1 && (pl->rc * pl->d) % ws == 0;
        return 0;
    }
    if ((pl->rc * pl->d) % ws)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mapping=machine: a row owner's "
                          "%lld x %lld rows do not split over the %d ranks' lane rings",
                          (long long)pl->rc, (long long)pl->d, ws);
    pl->machine = 1;
    for (int64_t p = 1; p * pl->U <= pl->S && nc < 64; p++)
        if ((pl->hd / 2) % p == 0 && (p == 1 || pl->hd / p >= MIN_QKV_COLS))
            cand[nc++] = p * pl->U;
    if (!pick_groups(ncubes, npes, pl->rows.n, cand, nc, &pl->qncol, &R, &pl->qkv))
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mapping=machine: no PE grid for "
                          "%lld QKV units", (long long)pl->U);
    pl->p = pl->qncol / pl->U;
    pl->c = pl->hd / pl->p;
    pl->qtr = pl->T / R;
    /* groups of whole row-owner blocks over an exact grid (pick_groups' choice) */
    assert(R * pl->qncol == pl->qkv.n && pl->qtr * R == pl->T && pl->qtr % pl->rc == 0);
    int64_t g = pl->Floc % MLP_GRAN == 0 ? MLP_GRAN : 1;
    nc = 0;
    for (int64_t n = 1; n <= pl->S && nc < 64; n++)
        if (pl->Floc % n == 0 && (pl->Floc / n) % g == 0)
            cand[nc++] = n;
    if (!pick_groups(ncubes, npes, pl->rows.n, cand, nc, &pl->mncol, &R, &pl->mlp))
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mapping=machine: no PE grid for "
                          "%lld MLP columns", (long long)pl->Floc);
    pl->cf = pl->Floc / pl->mncol;
    pl->mtr = pl->T / R;
    assert(R * pl->mncol == pl->mlp.n && pl->mtr * R == pl->T && pl->mtr % pl->rc == 0);
    /* fewer items than cubes: each item on ocol PEs, each loading the item's K and V
     * prefix (at most 2 nkv seq hd f16) against the rank's W_o rows nq hd x d; the cube's
     * K/V copy is striped over them */
    pl->ocol = split_wo(pl->d, 2 * pl->nkv * pl->T, pl->items, ncubes, npes,
                        2 * pl->nkv * pl->qrows * pl->qb * pl->hd * 2,
                        pl->nq * pl->hd * pl->d * 2, &pl->att);
    if ((2 * pl->nkv * pl->T) % pl->att.pes)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer: mapping=machine: the %lld K and V "
                          "rows of a cube's copy do not split over its %d attention PEs",
                          (long long)(2 * pl->nkv * pl->T), pl->att.pes);
    pl->rep_rows = 2 * pl->nkv * pl->T / pl->att.pes;
    assert(pl->hg == pl->nq && pl->items * pl->ocol <= pl->att.n); /* machine items */
    return 0;
}

static int plan_once(const kb_model_cfg *mc, const kb_decoder_opts *o, int ws, int rank,
                     int ncubes, int npes, kb_decoder_plan *pl, kb_errbuf *eb)
{
    int rc;

    memset(pl, 0, sizeof *pl);
    if ((rc = kb_model_validate(mc, eb)) != 0) /* the plan divides by the model's shape */
        return rc;
    pl->ws = ws;
    pl->rank = rank;
    pl->S = ncubes * npes;
    pl->d = mc->d_model;
    pl->hd = mc->head_dim;
    pl->F = mc->mlp_hidden;
    pl->T = o->decode ? o->batch : o->batch * o->seq;
    if ((rc = plan_heads(mc, o, ws, rank, pl, eb)) != 0 ||
        (rc = plan_rows(o, ws, ncubes, npes, pl, eb)) != 0 ||
        (rc = plan_qkv(ncubes, npes, pl, eb)) != 0 ||
        (rc = plan_attention(o, ncubes, npes, pl, eb)) != 0 ||
        (rc = plan_mlp(o, ncubes, npes, pl, eb)) != 0 ||
        (rc = plan_groups(o, ws, ncubes, npes, pl, eb)) != 0)
        return rc;
    pl->tb = pl->T < GEMM_TB ? pl->T : GEMM_TB;
    pl->trows_rc = pl->rc;
    return 0;
}

int kb_decoder_plan_make(const kb_model_cfg *mc, const kb_decoder_opts *o, int ws, int rank,
                         int ncubes, int npes, kb_decoder_plan *pl, kb_errbuf *eb)
{
    if (o->mapping != KB_DEC_MAP_AUTO)
        return plan_once(mc, o, ws, rank, ncubes, npes, pl, eb);
    /* auto: machine for prefill without seq_parallel when its plan fits; naive otherwise,
     * whose plan then reports any error of the shape itself */
    kb_decoder_opts m = *o;
    m.mapping = KB_DEC_MAP_MACHINE;
    if (!o->seq_parallel && plan_once(mc, &m, ws, rank, ncubes, npes, pl, eb) == 0)
        return 0;
    m.mapping = KB_DEC_MAP_NAIVE;
    return plan_once(mc, &m, ws, rank, ncubes, npes, pl, eb);
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

/*
 * Where a placed element comes from, for the gathered kinds (QKV, W_o, K/V caches): row R of
 * the placed tensor is source row dec_row(f, R) (-1: a row of zeros), column C is column *scol
 * of source dec_col(f, C, scol) (0..2: wq, wk, wv or the one source). One definition for the
 * host's values (dec_fill_fn) and the maps of tensors generated where they replay (dec_map).
 * QKV gathers columns only, W_o rows only.
 */
static int64_t dec_row(const dec_fill *f, int64_t R)
{
    const kb_decoder_plan *pl = f->pl;
    int64_t hd = pl->hd;
    switch (f->what) {
    case DF_WO_ATT:  /* (att.n * hd) x d: PE j's hd rows = W_o rows of its item's head */
        if (pl->hg > 1) /* machine: the rank's rows per item */
            return pl->q0 * hd + R % (pl->hg * hd);
        else {
            int64_t j = R / hd, it = j < pl->items ? j : pl->items - 1;
            return (pl->q0 + (it / pl->qb) % pl->nq) * hd + R % hd;
        }
    case DF_WO_COMB: { /* (comb.n * nrep*hd) x d: PE j's rows = W_o rows of its group's heads */
        int64_t k = pl->nrep * hd, j = R / k, g = j % pl->nkv;
        return (pl->q0 + g * pl->nrep) * hd + R % k;
    }
    case DF_KC: /* (att.n * clen) x hd: PE j's rows = its chunk's cached positions */
    case DF_VC: {
        int64_t j = R / pl->clen, pp = R % pl->clen;
        int64_t b = j / (pl->nkv * pl->chunks), g = (j / pl->chunks) % pl->nkv;
        int64_t pos = (j % pl->chunks) * pl->clen + pp;
        if (j >= pl->items || pos >= f->o->kv_len)
            return -1;
        return (b * f->mc->n_kv_heads + pl->kv0 + g) * f->o->kv_len + pos;
    }
    default:
        return R;
    }
}

static int dec_col(const dec_fill *f, int64_t C, int64_t *scol)
{
    const kb_decoder_plan *pl = f->pl;
    int64_t hd = pl->hd, u = C / hd, t = C % hd;
    switch (f->what) {
    case DF_QKV: /* d x U*hd: column n -> unit n / hd, PE-block layout inside the head */
        if (u < pl->nq) {
            *scol = (pl->q0 + u) * hd + perm_col(t, hd, pl->c);
            return 0;
        }
        if (u < pl->nq + pl->nkv) {
            *scol = (pl->kv0 + u - pl->nq) * hd + perm_col(t, hd, pl->c);
            return 1;
        }
        *scol = (pl->kv0 + u - pl->nq - pl->nkv) * hd + t;
        return 2;
    case DF_KC:
        *scol = perm_col(C, hd, pl->c);
        return 0;
    default:
        *scol = C;
        return 0;
    }
}

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
    int64_t hd = pl->hd, sc;
    float *tmp = malloc(sizeof(float) * (size_t)(rows > cols ? rows : cols) * 2 + 16);
    if (!tmp) {
        for (int64_t i = 0; i < rows * cols; i++)
            out[i] = NAN; /* fills cannot fail: the verification reports the damage */
        return;
    }
    switch (f->what) {
    case DF_QKV: /* columns gathered, rows as they are */
        for (int64_t j = 0; j < cols; j++) {
            int s = dec_col(f, col + j, &sc);
            put_col(&f->src[s], row, sc, rows, tmp, out, cols, j);
        }
        break;
    case DF_WO_ATT: /* rows gathered, columns as they are */
    case DF_WO_COMB:
        for (int64_t r = 0; r < rows; r++)
            fill_get(&f->src[0], dec_row(f, row + r), col, 1, cols, out + r * cols);
        break;
    case DF_KC:
    case DF_VC:
        for (int64_t r = 0; r < rows; r++) {
            int64_t srow = dec_row(f, row + r);
            if (srow < 0) {
                memset(out + r * cols, 0, sizeof(float) * (size_t)cols);
                continue;
            }
            for (int64_t c = 0; c < cols; c++) {
                int s = dec_col(f, col + c, &sc);
                fill_get(&f->src[s], srow, sc, 1, 1, out + r * cols + c);
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
/* tensors and weights                                                                       */

static int make_t(kb_ctx *ctx, const char *name, int64_t rows, int64_t cols, kb_dtype dt,
                  kb_dp_policy dp, const kb_fill *f, int zeros, kb_tensor **out)
{
    kb_tensor_desc d = { name, rows, cols, dt, dp, KB_MEM_HBM };
    if (f)
        return kb_tensor_from_fill(ctx, &d, f, out);
    return zeros ? kb_tensor_zeros(ctx, &d, out) : kb_tensor_empty(ctx, &d, out);
}

/* The maps of a rows x cols copy of a gathered fill (dec_row, dec_col), for a tensor generated
 * where it replays: *mr NULL (nothing allocated) when the context does not record (nothing is
 * generated then) or a source is no pattern (the host makes the values). KB_ERR_NOMEM. */
static int dec_map(kb_ctx *ctx, const dec_fill *f, int64_t rows, int64_t cols, uint64_t **mr,
                   kb_seedgen_col **mc)
{
    int64_t sc;
    *mr = NULL;
    *mc = NULL;
    if (!kb_ctx_recording(ctx))
        return 0;
    *mr = malloc((size_t)rows * sizeof **mr);
    *mc = malloc((size_t)cols * sizeof **mc);
    if (!*mr || !*mc) {
        free(*mr), free(*mc);
        *mr = NULL;
        *mc = NULL;
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "decoder: a weight's map");
    }
    for (int64_t R = 0; R < rows; R++) {
        int64_t r = dec_row(f, R);
        (*mr)[R] = r < 0 ? KB_SEEDGEN_ROW_ZERO : (uint64_t)r;
    }
    for (int64_t C = 0; C < cols; C++) {
        int s = dec_col(f, C, &sc);
        if (!kb_fill_seedgen_col(&f->src[s], sc, &(*mc)[C])) {
            free(*mr), free(*mc);
            *mr = NULL;
            *mc = NULL;
            return 0;
        }
    }
    return 0;
}

/* A weight of rk x rn copies of the fill's k/rk x n/rn values (machine: every token group
 * holds its column blocks; 1 x 1 otherwise), quantized once: where it replays when its source
 * is a pattern (df: a gathered fill's maps; otherwise f's own), else on the host. */
static int make_w(kb_ctx *ctx, const char *name, int64_t k, int64_t n, const kb_decoder_opts *o,
                  kb_dp_policy dp, const kb_fill *f, const dec_fill *df, int64_t rk, int64_t rn,
                  kb_qweight *w)
{
    uint64_t *mr = NULL;
    kb_seedgen_col *mc = NULL;
    int rc;
    if (df && (rc = dec_map(ctx, df, k / rk, n / rn, &mr, &mc)) != 0)
        return rc;
    rc = kb_qweight_create_rep(ctx, name, k, n, o->fmt, o->sparse, dp, f, rk, rn,
                               mr ? &(kb_qw_map){ mr, mc } : NULL, w);
    free(mr);
    free(mc);
    return rc;
}

/* A tensor of a gathered fill's values (the K/V caches), generated where it replays when its
 * source is a pattern. */
static int make_gt(kb_ctx *ctx, const char *name, int64_t rows, int64_t cols, kb_dtype dt,
                   kb_dp_policy dp, const kb_fill *f, const dec_fill *df, kb_tensor **out)
{
    kb_tensor_desc d = { name, rows, cols, dt, dp, KB_MEM_HBM };
    uint64_t *mr = NULL;
    kb_seedgen_col *mc = NULL;
    int rc;
    if ((rc = dec_map(ctx, df, rows, cols, &mr, &mc)) != 0)
        return rc;
    rc = mr ? kb_tensor_from_map(ctx, &d, &(kb_qw_map){ mr, mc }, out)
            : kb_tensor_from_fill(ctx, &d, f, out);
    free(mr);
    free(mc);
    return rc;
}

static kb_dp_policy dpg(kb_dp_split s, const kb_dec_grid *g) { return kb_dp(s, s, g->cubes, g->pes); }

/* The rest of a rank's tensors, in this order: the partial sums (and machine's SIP sums),
 * h and y, the MLP weights (machine: every token group's copy of its column blocks), and the
 * gemm PEs' inputs (seq_parallel's collective buffers, or the row owners' copies). */
static int make_rest(kb_ctx *ctx, kb_decoder *dec, const kb_decoder_fills *f, int r)
{
    kb_machine *m = kb_ctx_machine(ctx);
    const kb_decoder_plan *pl = &dec->pl;
    const kb_decoder_opts *o = &dec->o;
    kb_dtype act = dec->act;
    int64_t d = pl->d, T = pl->T, Tl = pl->Tl, S = pl->S, mg = pl->mlp.n / pl->mncol;
    kb_dp_policy rows = dpg(KB_DP_ROW_WISE, &pl->rows), all = kb_dist_policy(ctx);
    kb_dp_policy allcol = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, m->ncubes, m->npes);
    kb_fill fg = kb_fill_at(f->wg, 0, (int64_t)r * pl->Floc);
    kb_fill fu = kb_fill_at(f->wu, 0, (int64_t)r * pl->Floc);
    kb_fill fd = kb_fill_at(f->wd, (int64_t)r * pl->Floc, 0);
    int rc;
    int64_t prow = o->seq_parallel ? S : S * T, pcol = o->seq_parallel ? T * d : d;
    if (pl->machine) { /* the MLP PEs' rows; the SIP sums, a block per PE */
        if ((rc = make_t(ctx, "partial_mlp", (int64_t)pl->mlp.n * pl->mtr, d, KB_F32,
                         dpg(KB_DP_ROW_WISE, &pl->mlp), NULL, 1, &dec->pd)) != 0 ||
            (rc = make_t(ctx, "sum_attn", S * pl->rc, d, KB_F32, all, NULL, 1, &dec->sum_o)) != 0 ||
            (rc = make_t(ctx, "sum_mlp", S * pl->rc, d, KB_F32, all, NULL, 1, &dec->sum_d)) != 0)
            return rc;
    } else if ((rc = make_t(ctx, "partial_attn", prow, pcol, KB_F32, all, NULL, 1, &dec->po)) != 0 ||
               (rc = make_t(ctx, "partial_mlp", prow, pcol, KB_F32, all, NULL, 1, &dec->pd)) != 0 ||
               (pl->dsum && (rc = make_t(ctx, "sum_attn", Tl, d, KB_F32, rows, NULL, 1,
                                         &dec->sum_o)) != 0) ||
               (pl->dmsum && (rc = make_t(ctx, "sum_mlp", Tl, d, KB_F32, rows, NULL, 1,
                                          &dec->sum_d)) != 0)) {
        return rc;
    }
    if ((rc = make_t(ctx, "h", Tl, d, KB_F32, rows, NULL, 0, &dec->h)) != 0 ||
        (rc = make_t(ctx, "y", Tl, d, KB_F32, rows, NULL, 0, &dec->y)) != 0 ||
        (rc = make_w(ctx, "w_gate", d, mg * pl->Floc, o, dpg(KB_DP_COLUMN_WISE, &pl->mlp),
                     &fg, NULL, 1, mg, &dec->wg)) != 0 ||
        (rc = make_w(ctx, "w_up", d, mg * pl->Floc, o, dpg(KB_DP_COLUMN_WISE, &pl->mlp),
                     &fu, NULL, 1, mg, &dec->wu)) != 0 ||
        (rc = make_w(ctx, "w_down", mg * pl->Floc, d, o, dpg(KB_DP_ROW_WISE, &pl->mlp),
                     &fd, NULL, mg, 1, &dec->wd)) != 0)
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
        /* one copy of its token group's rows (naive: all T) per gemm PE, written by the row
         * owners */
        if ((rc = make_t(ctx, "hn_attn", (int64_t)pl->qkv.n * pl->qtr, d, act,
                         dpg(KB_DP_ROW_WISE, &pl->qkv), NULL, 0, &dec->hn1)) != 0 ||
            (rc = make_t(ctx, "hn_mlp", (int64_t)pl->mlp.n * pl->mtr, d, act,
                         dpg(KB_DP_ROW_WISE, &pl->mlp), NULL, 0, &dec->hn2)) != 0)
            return rc;
    }
    return 0;
}

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
    int64_t d = pl->d, hd = pl->hd, T = pl->T, Tl = pl->Tl;
    kb_dp_policy rows = dpg(KB_DP_ROW_WISE, &pl->rows);
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
    static const char *const ln_names[4] = { "ln_input", "ln_post_attn", "ln_pre_ffw",
                                             "ln_post_ffw" };
    if ((rc = make_t(ctx, "x", Tl, d, act, rows, &fx, 0, &dec->x)) != 0)
        return rc;
    for (int i = 0; i < 4; i++)
        if ((i % 2 == 0 || mc->post_norms) &&
            (rc = make_t(ctx, ln_names[i], 1, d, KB_F32, dpg(KB_DP_REPLICATE, &pl->rows),
                         &f->ln[i], 0, &dec->ln[i])) != 0)
            return rc;
    /* machine: every token group holds the column blocks of its weights (qg groups) */
    int64_t qg = pl->qkv.n / pl->qncol;
    if ((rc = make_t(ctx, "rope_cos", T, hd / 2, KB_F32, dpg(KB_DP_REPLICATE, &pl->qkv), &Fc, 0,
                     &dec->cosq)) != 0 ||
        (rc = make_t(ctx, "rope_sin", T, hd / 2, KB_F32, dpg(KB_DP_REPLICATE, &pl->qkv), &Fs, 0,
                     &dec->sinq)) != 0 ||
        (rc = make_w(ctx, "w_qkv", d, qg * pl->U * hd, o, dpg(KB_DP_COLUMN_WISE, &pl->qkv),
                     &Fq, &fq, 1, qg, &dec->wqkv)) != 0 ||
        (rc = pl->machine
                  ? make_t(ctx, "qkv", (int64_t)pl->qkv.n * pl->qtr, pl->c, act,
                           dpg(KB_DP_ROW_WISE, &pl->qkv), NULL, 0, &dec->qkv)
                  : make_t(ctx, "qkv", T, pl->U * hd, act, dpg(KB_DP_COLUMN_WISE, &pl->qkv),
                           NULL, 0, &dec->qkv)) != 0)
        return rc;
    if (!o->decode) { /* W_o rows per item: its head's (naive), every local head's (machine) */
        rc = pl->ocol > 1 /* an item's rows over a cube, its PEs taking column blocks */
                 ? make_w(ctx, "w_o", pl->items * pl->hg * hd, d, o,
                          kb_dp(KB_DP_ROW_WISE, KB_DP_COLUMN_WISE, pl->att.cubes, pl->att.pes),
                          &Fo, &fo, pl->items, 1, &dec->wo)
                 : make_w(ctx, "w_o", (int64_t)pl->att.n * pl->hg * hd, d, o,
                          dpg(KB_DP_ROW_WISE, &pl->att), &Fo, &fo, pl->machine ? pl->att.n : 1,
                          1, &dec->wo);
        if (rc == 0 && pl->machine) /* an attention cube's K/V over its attention PEs */
            rc = make_t(ctx, "kv_copies", (int64_t)pl->att.cubes * 2 * pl->nkv * T, hd, act,
                        dpg(KB_DP_ROW_WISE, &pl->att), NULL, 0, &dec->kv_rep);
    } else {
        int64_t rows_c = (int64_t)pl->att.n * pl->clen;
        if ((rc = make_gt(ctx, "k_cache", rows_c, hd, act, dpg(KB_DP_ROW_WISE, &pl->att), &Fk,
                          &fk, &dec->kc)) != 0 ||
            (rc = make_gt(ctx, "v_cache", rows_c, hd, act, dpg(KB_DP_ROW_WISE, &pl->att), &Fv,
                          &fv, &dec->vc)) != 0 ||
            (rc = make_t(ctx, "attn_chunks", (int64_t)pl->att.n * pl->nrep, hd + 2, KB_F32,
                         dpg(KB_DP_ROW_WISE, &pl->att), NULL, 0, &dec->dpart)) != 0)
            return rc;
        /* a combining PE's rows (naive); machine: an item's rows over a cube, its PEs
         * taking column blocks */
        rc = pl->ccol > 1
                 ? make_w(ctx, "w_o", pl->citems * pl->nrep * hd, d, o,
                          kb_dp(KB_DP_ROW_WISE, KB_DP_COLUMN_WISE, pl->comb.cubes, pl->comb.pes),
                          &Fo, &fo, 1, 1, &dec->wo)
                 : make_w(ctx, "w_o", (int64_t)pl->comb.n * pl->nrep * hd, d, o,
                          dpg(KB_DP_ROW_WISE, &pl->comb), &Fo, &fo, 1, 1, &dec->wo);
    }
    if (rc)
        return rc;
    return make_rest(ctx, dec, f, r);
}
