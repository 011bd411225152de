/*
 * kb_vquery — device queries (kb_vquery.h): the plain-C answers, which define the results the
 * OpenCL kernels (replay.cl's kb_vq_*) must reproduce bit for bit, and the host digest.
 */
#include "kb_vquery.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_dtype.h"
#include "kb_err.h"
#include "kb_par.h"
#include "kb_seedgen.h"

uint64_t kb_vq_fnv(const void *data, size_t n, uint64_t h)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= KB_VQ_FNV_PRIME;
    }
    return h;
}

size_t kb_vquery_result_size(const kb_vquery *q)
{
    if (q->kind == KB_VQ_CHECK || q->kind == KB_VQ_COLL)
        return (size_t)q->ntiles * sizeof(kb_vq_tile) + sizeof(kb_vq_sums);
    if (q->kind == KB_VQ_DIGEST)
        return sizeof(uint64_t);
    return 0;
}

uint64_t kb_vquery_tile_bytes(const kb_vquery *q)
{
    return q->kind == KB_VQ_CHECK || q->kind == KB_VQ_COLL ? q->n * 2 : q->tile_bytes;
}

int kb_vquery_valid(const kb_vquery *q)
{
    switch (q->kind) {
    case KB_VQ_DIGEST:
        return 1;
    case KB_VQ_CHECK:
        return q->ntiles > 0 && q->n <= ((uint64_t)1 << 31);
    case KB_VQ_COLL:
        if (q->ntiles == 0 || q->root >= q->ntiles || q->n >= ((uint64_t)1 << 62))
            return 0;
        switch (q->coll) {
        case KB_VQ_C_ALLGATHER:
        case KB_VQ_C_REDUCE_SCATTER:
        case KB_VQ_C_ALLTOALL: /* chunks of c = n / ntiles */
            return q->n % q->ntiles == 0;
        case KB_VQ_C_BROADCAST:
        case KB_VQ_C_REDUCE:
        case KB_VQ_C_SHIFT:
            return 1;
        default:
            return 0;
        }
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------- digest */

/* Tiles laid end to end: tile t of `tb` bytes at base + off[t] (off NULL: contiguous). */
typedef struct stream {
    const uint8_t *base;
    const uint64_t *off;
    uint64_t tb, total;
} stream;

/* FNV-1a of stream bytes [a, b), continuing from h. */
static uint64_t stream_fnv(const stream *s, uint64_t a, uint64_t b, uint64_t h)
{
    if (!s->off)
        return kb_vq_fnv(s->base + a, (size_t)(b - a), h);
    while (a < b) {
        uint64_t t = a / s->tb, in = a - t * s->tb, k = s->tb - in;
        if (k > b - a)
            k = b - a;
        h = kb_vq_fnv(s->base + s->off[t] + in, (size_t)k, h);
        a += k;
    }
    return h;
}

typedef struct dwork {
    const stream *s;
    uint64_t b0, b1; /* blocks */
    uint64_t *bh;
} dwork;

static void *digest_blocks(void *arg)
{
    dwork *w = arg;
    for (uint64_t b = w->b0; b < w->b1; b++) {
        uint64_t lo = b * KB_VQ_DIGEST_BLOCK, hi = lo + KB_VQ_DIGEST_BLOCK;
        w->bh[b] = stream_fnv(w->s, lo, hi < w->s->total ? hi : w->s->total, KB_VQ_FNV_INIT);
    }
    return NULL;
}

/* h continued over a block digest's 8 little-endian bytes. */
static uint64_t combine_into(uint64_t h, uint64_t d)
{
    for (int k = 0; k < 8; k++) {
        h ^= (d >> (8 * k)) & 0xffu;
        h *= KB_VQ_FNV_PRIME;
    }
    return h;
}

#define KB_VQ_MAX_THREADS KB_PAR_MAX

uint64_t kb_vq_combine(const uint64_t *bh, uint64_t nb)
{
    uint64_t h = KB_VQ_FNV_INIT;
    if (nb == 1)
        return bh[0];
    for (uint64_t b = 0; b < nb; b++)
        h = combine_into(h, bh[b]);
    return h;
}

void kb_vq_tile_merge(kb_vq_tile *a, const kb_vq_tile *later)
{
    if (later->max_err > a->max_err) { /* strict: an equal later error is not the first */
        a->max_err = later->max_err;
        a->bound = later->bound;
    }
    if (a->bad_elem < 0 && later->bad_elem >= 0) {
        a->bad_elem = later->bad_elem;
        a->bad_got = later->bad_got;
        a->bad_want = later->bad_want;
    }
    a->nwrong += later->nwrong;
    a->gq += later->gq;
    a->offgrid |= later->offgrid;
}

void kb_vq_merge_check(const kb_vq_tile *part, uint32_t ntiles, uint32_t nslab,
                       const int64_t *wpart, size_t ngroups, void *out)
{
    kb_vq_tile *tv = out;
    kb_vq_sums *sums = (kb_vq_sums *)(tv + ntiles);
    sums->wq = 0;
    sums->offgrid = 0;
    for (size_t g = 0; g < ngroups; g++) {
        sums->wq += wpart[2 * g];
        sums->offgrid |= wpart[2 * g + 1];
    }
    for (uint32_t t = 0; t < ntiles; t++) {
        tv[t] = KB_VQ_TILE_EMPTY;
        for (uint32_t s = 0; s < nslab; s++) /* slabs in ascending columns */
            kb_vq_tile_merge(&tv[t], &part[(size_t)t * nslab + s]);
    }
}

static uint64_t stream_digest(const stream *s, int threads)
{
    if (s->total <= KB_VQ_DIGEST_BLOCK)
        return stream_fnv(s, 0, s->total, KB_VQ_FNV_INIT);
    uint64_t nb = (s->total + KB_VQ_DIGEST_BLOCK - 1) / KB_VQ_DIGEST_BLOCK, h;
    uint64_t *bh = malloc((size_t)nb * sizeof *bh);
    dwork w[KB_VQ_MAX_THREADS];

    if (threads < 1)
        threads = 1;
    if (threads > KB_VQ_MAX_THREADS)
        threads = KB_VQ_MAX_THREADS;
    if ((uint64_t)threads > nb)
        threads = (int)nb;
    if (!bh) { /* no room for the block digests: one pass, combining as it goes */
        h = KB_VQ_FNV_INIT;
        for (uint64_t b = 0; b < nb; b++) {
            uint64_t lo = b * KB_VQ_DIGEST_BLOCK, hi = lo + KB_VQ_DIGEST_BLOCK;
            uint64_t one = stream_fnv(s, lo, hi < s->total ? hi : s->total, KB_VQ_FNV_INIT);
            h = combine_into(h, one);
        }
        return h;
    }
    for (int i = 0; i < threads; i++)
        w[i] = (dwork){ s, nb * (uint64_t)i / (uint64_t)threads,
                        nb * (uint64_t)(i + 1) / (uint64_t)threads, bh };
    kb_par_run(digest_blocks, w, sizeof *w, (size_t)threads);
    h = KB_VQ_FNV_INIT;
    for (uint64_t b = 0; b < nb; b++)
        h = combine_into(h, bh[b]);
    free(bh);
    return h;
}

uint64_t kb_vquery_digest_host(const void *data, uint64_t n, int threads)
{
    stream s = { data, NULL, n, n };
    return stream_digest(&s, threads);
}

/* ---------------------------------------------------------------- check */

/* The ring chunk (of n in ntiles chunks, the first n % ntiles one longer) holding i. */
static uint32_t ring_chunk(uint64_t n, uint32_t ntiles, uint64_t i)
{
    uint64_t base = n / ntiles, extra = n % ntiles, split = extra * (base + 1);
    return (uint32_t)(i < split ? i / (base + 1) : extra + (i - split) / base);
}

static float round_f16(float v)
{
    return kb_f16_to_f32(kb_f32_to_f16(v));
}

/* The sum of column i over the ranks: ordered, the ring's chain from rank `start` (f32, rounded
 * to f16 after every hop but the last); else in ascending rank order, in double. */
static double column_sum(const kb_vquery *q, uint32_t start, uint64_t i)
{
    uint32_t T = q->ntiles;
    if (!q->ordered) {
        double s = 0.0;
        for (uint32_t t = 0; t < T; t++)
            s += (double)kb_seedgen_value(q->seed, t, (int64_t)i, (int64_t)q->n);
        return s;
    }
    float acc = kb_seedgen_value(q->seed, start, (int64_t)i, (int64_t)q->n);
    for (uint32_t k = 1; k < T; k++) {
        float v = acc + kb_seedgen_value(q->seed, (start + k) % T, (int64_t)i, (int64_t)q->n);
        acc = k + 1 < T ? round_f16(v) : v;
    }
    return (double)acc;
}

/* Column i's reference (kb_vquery.h). */
static double column_ref(const kb_vquery *q, uint64_t i)
{
    return column_sum(q, q->ordered ? ring_chunk(q->n, q->ntiles, i) : 0, i);
}

double kb_vquery_coll_ref(const kb_vquery *q, uint32_t t, uint64_t i)
{
    uint32_t T = q->ntiles, src = t;
    uint64_t n = q->n, c = n / T, j = i;
    switch (q->coll) {
    case KB_VQ_C_ALLGATHER:
        src = (uint32_t)(i / c);
        break;
    case KB_VQ_C_ALLTOALL:
        src = (uint32_t)(i / c);
        j = (uint64_t)t * c + i % c;
        break;
    case KB_VQ_C_BROADCAST:
        src = q->root;
        break;
    case KB_VQ_C_SHIFT:
        src = T < 2 ? t : (t + T - 1) % T;
        break;
    case KB_VQ_C_REDUCE_SCATTER:
        if (i / c == t)
            return column_sum(q, (t + 1) % T, i);
        break;
    case KB_VQ_C_REDUCE:
        if (t == q->root)
            return column_sum(q, (q->root + 1) % T, i);
        break;
    default:
        break;
    }
    return (double)kb_seedgen_value(q->seed, src, (int64_t)j, (int64_t)n);
}

/* got * 128 as an integer, or *off set when it is none. */
static int64_t grid_q(float got, int64_t *off)
{
    float q = got * 128.0f;
    if (isfinite(q) && q == floorf(q))
        return (int64_t)q;
    *off = 1;
    return 0;
}

/* Element i of a tile (at `tile`) against its exact reference, the reference's f16 bits and
 * bound (kb_vquery.h), added to the tile's part a. */
static void check_elem(kb_vq_tile *a, const uint8_t *tile, uint64_t i, double exact,
                       uint16_t wbits, double bnd, double acc_bound)
{
    uint16_t h;
    memcpy(&h, tile + 2 * i, 2);
    float gf = kb_f16_to_f32(h);
    double got = gf, e = fabs(got - exact);
    int ok = acc_bound > 0.0 ? e <= bnd : h == wbits;
    e = e != e ? INFINITY : e;
    if (e > a->max_err) {
        a->max_err = e;
        a->bound = bnd;
    }
    a->nwrong += !ok;
    if (!ok && a->bad_elem < 0) {
        a->bad_elem = (int64_t)i;
        a->bad_got = got;
        a->bad_want = kb_f16_to_f32(wbits);
    }
    a->gq += grid_q(gf, &a->offgrid);
}

static int run_check(const kb_vquery *q, const uint8_t *base, const uint64_t *off, void *out)
{
    uint64_t n = q->n;
    kb_vq_tile *tv = out;
    kb_vq_sums *sums = (kb_vq_sums *)(tv + q->ntiles);
    double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    uint16_t *wbits = malloc((size_t)(n ? n : 1) * sizeof *wbits);
    double *bnd = malloc((size_t)(n ? n : 1) * sizeof *bnd);

    if (!ref || !wbits || !bnd) {
        free(ref);
        free(wbits);
        free(bnd);
        return KB_ERR_NOMEM;
    }
    sums->wq = 0;
    sums->offgrid = 0;
    for (uint64_t i = 0; i < n; i++) {
        ref[i] = column_ref(q, i);
        wbits[i] = kb_f32_to_f16((float)ref[i]);
        bnd[i] = 0.5 * (double)kb_f16_ulp((float)ref[i]) + q->acc_bound;
        sums->wq += grid_q(kb_f16_to_f32(wbits[i]), &sums->offgrid);
    }
    for (uint32_t t = 0; t < q->ntiles; t++) {
        const uint8_t *tile = base + off[t];
        tv[t] = KB_VQ_TILE_EMPTY;
        for (uint64_t i = 0; i < n; i++)
            check_elem(&tv[t], tile, i, ref[i], wbits[i], bnd[i], q->acc_bound);
    }
    free(ref);
    free(wbits);
    free(bnd);
    return 0;
}

/* KB_VQ_COLL: every element's reference computed where it is checked (they differ per tile);
 * the rounded references' grid sum runs over every element. */
static void run_coll(const kb_vquery *q, const uint8_t *base, const uint64_t *off, void *out)
{
    kb_vq_tile *tv = out;
    kb_vq_sums *sums = (kb_vq_sums *)(tv + q->ntiles);
    sums->wq = 0;
    sums->offgrid = 0;
    for (uint32_t t = 0; t < q->ntiles; t++) {
        tv[t] = KB_VQ_TILE_EMPTY;
        for (uint64_t i = 0; i < q->n; i++) {
            double exact = kb_vquery_coll_ref(q, t, i);
            uint16_t wbits = kb_f32_to_f16((float)exact);
            double bnd = 0.5 * (double)kb_f16_ulp((float)exact) + q->acc_bound;
            check_elem(&tv[t], base + off[t], i, exact, wbits, bnd, q->acc_bound);
            sums->wq += grid_q(kb_f16_to_f32(wbits), &sums->offgrid);
        }
    }
}

int kb_vquery_run_host(const kb_vquery *q, const uint8_t *base, const uint64_t *off, void *out)
{
    if (!kb_vquery_valid(q))
        return KB_ERR_INVAL;
    if (q->kind == KB_VQ_CHECK)
        return run_check(q, base, off, out);
    if (q->kind == KB_VQ_COLL) {
        run_coll(q, base, off, out);
        return 0;
    }
    if (q->kind == KB_VQ_DIGEST) {
        stream s = { base, off, q->tile_bytes, q->tile_bytes * q->ntiles };
        *(uint64_t *)out = stream_digest(&s, 1);
        return 0;
    }
    return KB_ERR_INVAL;
}
