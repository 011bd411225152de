/*
 * kb_ccl_ref — what a collective is checked against (kb_ccl.h): the collective kinds with
 * nccl-tests' names and bus-bandwidth factors, the host references, the seeded
 * position-dependent test inputs and the comparison every collective bench, sweep and test
 * uses. Inputs sit on a 1/128 grid (|x| <= 16) so that reductions of up to
 * KB_CCL_INPUT_EXACT_TERMS tiles are exact in f32 in any order; the comparison is then bit for
 * bit against the exact result rounded once. Limits: the references cover the kinds that have
 * algorithms (all-reduce, send/recv); beyond KB_CCL_INPUT_GRID positions input values repeat.
 */
#include "kb_ccl.h"
#include "kb_par.h"
#include "kb_seedgen.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const coll_names[KB_COLL_NKINDS] = {
    [KB_COLL_ALLREDUCE] = "all_reduce",         [KB_COLL_ALLGATHER] = "all_gather",
    [KB_COLL_REDUCE_SCATTER] = "reduce_scatter", [KB_COLL_BROADCAST] = "broadcast",
    [KB_COLL_REDUCE] = "reduce",                 [KB_COLL_ALLTOALL] = "all_to_all",
    [KB_COLL_SENDRECV] = "sendrecv",
};

const char *kb_coll_name(kb_coll_kind k)
{
    return (unsigned)k < KB_COLL_NKINDS ? coll_names[k] : "?";
}

int kb_coll_rooted(kb_coll_kind k) { return k == KB_COLL_BROADCAST || k == KB_COLL_REDUCE; }

int kb_coll_reduces(kb_coll_kind k)
{
    return k == KB_COLL_ALLREDUCE || k == KB_COLL_REDUCE_SCATTER || k == KB_COLL_REDUCE;
}

const char *const kb_ccl_op_names[] = { "sum", "prod", "max", "min", "avg", NULL };
const char *const kb_ccl_dtype_names[] = { "f16", "bf16", "f32", NULL };

const char *kb_ccl_op_name(int op)
{
    return op >= 0 && op < KB_CCL_NOPS ? kb_ccl_op_names[op] : "?";
}

int kb_ccl_op_from_name(const char *name)
{
    for (int i = 0; name && i < KB_CCL_NOPS; i++)
        if (!strcmp(kb_ccl_op_names[i], name))
            return i;
    return -1;
}

int kb_coll_tile_ranks(kb_coll_kind k, int ws)
{
    return k == KB_COLL_ALLGATHER || k == KB_COLL_REDUCE_SCATTER || k == KB_COLL_ALLTOALL ? ws : 1;
}

double kb_coll_busbw_factor(kb_coll_kind k, int ws)
{
    if (ws < 1)
        return 0.0;
    switch (k) {
    case KB_COLL_ALLREDUCE:
        return 2.0 * (ws - 1) / (double)ws;
    case KB_COLL_ALLGATHER:
    case KB_COLL_REDUCE_SCATTER:
    case KB_COLL_ALLTOALL:
        return (ws - 1) / (double)ws;
    case KB_COLL_BROADCAST:
    case KB_COLL_REDUCE:
    case KB_COLL_SENDRECV:
        return 1.0;
    default:
        return 0.0;
    }
}

/* ---- host references ---- */

/* out[i] = in[0][i] + in[1][i] + ... in that order, from +0: rank-major, so that the inner
 * loop runs over contiguous columns (and vectorises); each sum keeps its order. */
static void sum_ranks(const float *in, int ws, int64_t n, double *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = 0.0;
    for (int q = 0; q < ws; q++) {
        const float *row = in + (size_t)q * (size_t)n;
        for (int64_t i = 0; i < n; i++)
            out[i] += row[i];
    }
}

void kb_ccl_ref_allreduce(const float *in, int ws, int64_t n, double *out)
{
    /* the sum once, then copies: O(ws*n), not O(ws^2*n), for 256-rank references */
    sum_ranks(in, ws, n, out);
    for (int r = 1; r < ws; r++)
        memcpy(out + (size_t)r * (size_t)n, out, (size_t)n * sizeof *out);
}

/* Chunk c of a tile of n = ws * count elements is [c * count, (c + 1) * count). */
static int64_t count_of(int ws, int64_t n)
{
    assert(ws > 0 && n % ws == 0);
    return n / ws;
}

void kb_ccl_ref_allgather(const float *in, int ws, int64_t n, double *out)
{
    int64_t cnt = count_of(ws, n);
    for (int r = 0; r < ws; r++)
        for (int64_t j = 0; j < n; j++)
            out[(size_t)r * (size_t)n + (size_t)j] = in[(size_t)(j / cnt) * (size_t)n + (size_t)j];
}

void kb_ccl_ref_reduce_scatter(const float *in, int ws, int64_t n, double *out)
{
    int64_t cnt = count_of(ws, n);
    for (size_t k = 0; k < (size_t)ws * (size_t)n; k++)
        out[k] = in[k];
    for (int r = 0; r < ws; r++)
        for (int64_t i = 0; i < cnt; i++) {
            size_t j = (size_t)r * (size_t)cnt + (size_t)i;
            double s = 0.0;
            for (int q = 0; q < ws; q++)
                s += in[(size_t)q * (size_t)n + j];
            out[(size_t)r * (size_t)n + j] = s;
        }
}

void kb_ccl_ref_alltoall(const float *in, int ws, int64_t n, double *out)
{
    int64_t cnt = count_of(ws, n);
    for (int r = 0; r < ws; r++)
        for (int c = 0; c < ws; c++)
            for (int64_t i = 0; i < cnt; i++)
                out[(size_t)r * (size_t)n + (size_t)(c * cnt + i)] =
                    in[(size_t)c * (size_t)n + (size_t)(r * cnt + i)];
}

void kb_ccl_ref_broadcast(const float *in, int ws, int64_t n, double *out)
{
    for (int r = 0; r < ws; r++)
        for (int64_t i = 0; i < n; i++)
            out[(size_t)r * (size_t)n + (size_t)i] = in[i];
}

void kb_ccl_ref_reduce(const float *in, int ws, int64_t n, double *out)
{
    for (int64_t i = 0; i < n; i++) {
        double s = 0.0;
        for (int q = 0; q < ws; q++)
            s += in[(size_t)q * (size_t)n + (size_t)i];
        out[i] = s;
    }
    for (size_t k = (size_t)n; k < (size_t)ws * (size_t)n; k++)
        out[k] = in[k];
}

/* op over the ws values in[q * stride] (avg: their sum / ws), in double: exact for the
 * seeded data (sums below 2^17 on a 1/128 grid; prod of +-1 and one grid value). */
static double reduce_op(int op, const float *in, int ws, size_t stride)
{
    double a = in[0];
    for (int q = 1; q < ws; q++) {
        double x = in[(size_t)q * stride];
        switch (op) {
        case KB_CCL_OP_PROD:
            a *= x;
            break;
        case KB_CCL_OP_MAX:
            a = x > a ? x : a;
            break;
        case KB_CCL_OP_MIN:
            a = x < a ? x : a;
            break;
        default:
            a += x;
        }
    }
    return op == KB_CCL_OP_AVG ? a / ws : a;
}

void kb_ccl_ref_op(kb_coll_kind kind, int op, const float *in, int ws, int64_t n, double *out)
{
    size_t N = (size_t)n;
    for (size_t k = 0; k < (size_t)ws * N; k++)
        out[k] = in[k];
    if (kind == KB_COLL_REDUCE_SCATTER) {
        int64_t cnt = count_of(ws, n);
        for (int r = 0; r < ws; r++)
            for (int64_t i = 0; i < cnt; i++) {
                size_t j = (size_t)r * (size_t)cnt + (size_t)i;
                out[(size_t)r * N + j] = reduce_op(op, in + j, ws, N);
            }
        return;
    }
    for (size_t i = 0; i < N; i++) {
        double v = reduce_op(op, in + i, ws, N);
        for (int r = 0; r < (kind == KB_COLL_REDUCE ? 1 : ws); r++)
            out[(size_t)r * N + i] = v;
    }
}

/* ---- order-emulating references (kb_ccl_ref_ord_fn) ---- */

/* v rounded to dt as the kernel writes it (f32: as is). */
static float round_dt(kb_dtype dt, float v)
{
    if (dt == KB_F16)
        return kb_f16_to_f32(kb_f32_to_f16(v));
    if (dt == KB_BF16)
        return kb_bf16_to_f32(kb_f32_to_bf16(v));
    return v;
}

/* One combine in f32, as kb_ccl_combine computes it (the replay's kb_mf_* operations on
 * these values: an f32 add or multiply rounds to nearest even in C as on the devices; max
 * and min order -0 below +0). */
static float combine_f32(int op, float a, float x)
{
    switch (op) {
    case KB_CCL_OP_PROD:
        return a * x;
    case KB_CCL_OP_MAX:
        return x > a || (x == a && signbit(a) && !signbit(x)) ? x : a;
    case KB_CCL_OP_MIN:
        return x < a || (x == a && !signbit(a) && signbit(x)) ? x : a;
    default:
        return a + x;
    }
}

/* A ring's chain over the ws values in[q * stride] starting at rank `start`: start's value,
 * then each next rank's combined in, rounded to dt after every hop but the last; avg: the
 * sum / ws. */
static double ring_chain(const float *in, int ws, size_t stride, int start, kb_dtype dt, int op)
{
    float acc = in[(size_t)start * stride];
    for (int k = 1; k < ws; k++) {
        float v = combine_f32(op, acc, in[(size_t)((start + k) % ws) * stride]);
        acc = k + 1 < ws ? round_dt(dt, v) : v;
    }
    return op == KB_CCL_OP_AVG ? (double)acc / ws : (double)acc;
}

/* The chunk (kb_ccl_chunk) of n elements in ws chunks that holds element i. */
static int chunk_index(int64_t n, int ws, int64_t i)
{
    int64_t base = n / ws, extra = n % ws, split = extra * (base + 1);
    return (int)(i < split ? i / (base + 1) : extra + (i - split) / base);
}

/*
 * ring_chain for the columns [0, nb) of in (ws rows of nb) into col[0, nb): the columns of
 * one chunk share their chain's start, so they advance together, up to RING_COLS at a time,
 * and each hop's rounding is one bulk conversion (kb_dtype_store_n / load_n: the same bits as
 * round_dt, vectorised). The values are ring_chain's exactly.
 */
#define RING_COLS 1024

static void ring_allreduce_cols(const float *in, int ws, int64_t n, int64_t i0, int64_t nb,
                                kb_dtype dt, int op, double *col)
{
    float acc[RING_COLS];
    uint16_t tmp[RING_COLS];
    int plain = op == KB_CCL_OP_SUM || op == KB_CCL_OP_AVG; /* combine_f32 is a + x */

    for (int64_t j0 = 0; j0 < nb;) {
        int start = chunk_index(n, ws, i0 + j0);
        int64_t j1 = j0 + 1;
        while (j1 < nb && j1 - j0 < RING_COLS && chunk_index(n, ws, i0 + j1) == start)
            j1++;
        size_t len = (size_t)(j1 - j0);
        const float *first = in + (size_t)start * (size_t)nb + (size_t)j0;
        memcpy(acc, first, len * sizeof *acc);
        for (int k = 1; k < ws; k++) {
            const float *row = in + (size_t)((start + k) % ws) * (size_t)nb + (size_t)j0;
            if (plain)
                for (size_t j = 0; j < len; j++)
                    acc[j] = acc[j] + row[j];
            else
                for (size_t j = 0; j < len; j++)
                    acc[j] = combine_f32(op, acc[j], row[j]);
            if (k + 1 < ws && (dt == KB_F16 || dt == KB_BF16)) {
                kb_dtype_store_n(dt, tmp, 0, acc, len);
                kb_dtype_load_n(dt, tmp, 0, acc, len);
            }
        }
        for (size_t j = 0; j < len; j++)
            col[(size_t)j0 + j] = op == KB_CCL_OP_AVG ? (double)acc[j] / ws : (double)acc[j];
        j0 = j1;
    }
}

void kb_ccl_ref_ring_allreduce(const float *in, int ws, int64_t n, int64_t i0, int64_t nb,
                               kb_dtype dt, int op, double *out)
{
    ring_allreduce_cols(in, ws, n, i0, nb, dt, op, out);
    for (int r = 1; r < ws; r++)
        memcpy(out + (size_t)r * (size_t)nb, out, (size_t)nb * sizeof *out);
}

void kb_ccl_ref_ring_reduce_scatter(const float *in, int ws, int64_t n, int64_t i0,
                                    int64_t nb, kb_dtype dt, int op, double *out)
{
    int64_t cnt = count_of(ws, n);
    assert(i0 == 0 && nb == n); /* not position-wise: the whole tiles */
    (void)i0;
    (void)nb;
    for (size_t k = 0; k < (size_t)ws * (size_t)n; k++)
        out[k] = in[k];
    for (int r = 0; r < ws; r++)
        for (int64_t i = 0; i < cnt; i++) {
            size_t j = (size_t)r * (size_t)cnt + (size_t)i;
            out[(size_t)r * (size_t)n + j] = ring_chain(in + j, ws, (size_t)n, (r + 1) % ws, dt, op);
        }
}

void kb_ccl_ref_ring_reduce(const float *in, int ws, int64_t n, int64_t i0, int64_t nb,
                            kb_dtype dt, int op, double *out)
{
    (void)n;
    (void)i0;
    for (size_t k = 0; k < (size_t)ws * (size_t)nb; k++)
        out[k] = in[k];
    for (int64_t j = 0; j < nb; j++) /* the chain 1, 2, ..., ws-1, 0 ends at the root */
        out[j] = ring_chain(in + j, ws, (size_t)nb, ws > 1 ? 1 : 0, dt, op);
}

void kb_ccl_ref_shift_east(const float *in, int ws, int64_t n, double *out)
{
    for (int r = 0; r < ws; r++) {
        int from = ws < 2 ? r : (r + ws - 1) % ws;
        for (int64_t i = 0; i < n; i++)
            out[(size_t)r * (size_t)n + (size_t)i] = in[(size_t)from * (size_t)n + (size_t)i];
    }
}

/* ---- test inputs ---- */

float kb_ccl_input(uint32_t seed, int64_t tile, int64_t i, int64_t n)
{
    return kb_seedgen_value(seed, tile, i, n);
}

void kb_ccl_input_span(float *x, uint32_t seed, int64_t tile, int64_t i0, int64_t len, int64_t n)
{
    kb_seedgen_span(x, seed, tile, i0, len, n);
}

void kb_ccl_inputs(float *x, uint32_t seed, int64_t tile0, int64_t ntiles, int64_t n)
{
    for (int64_t t = 0; t < ntiles; t++)
        kb_ccl_input_span(x + (size_t)t * (size_t)n, seed, tile0 + t, 0, n, n);
}

void kb_ccl_input_op_span(float *x, uint32_t seed, int op, kb_dtype dt, int64_t ntiles,
                          int64_t tile, int64_t i0, int64_t len, int64_t n)
{
    unsigned char b[4 * 1024];
    kb_seedgen_span(x, seed, tile, i0, len, n);
    if (op == KB_CCL_OP_PROD)
        kb_seedgen_sign(x, ntiles, tile, i0, len);
    /* what the tile holds: rounded to dt (bulk conversions, the same bits as one by one) */
    for (int64_t j = 0; dt != KB_F32 && j < len; j += 1024) {
        size_t m = (size_t)(len - j < 1024 ? len - j : 1024);
        kb_dtype_store_n(dt, b, 0, x + j, m);
        kb_dtype_load_n(dt, b, 0, x + j, m);
    }
}

double kb_ccl_input_acc_bound_op(kb_coll_kind k, int op, int64_t nterms)
{
    if (op == KB_CCL_OP_PROD || op == KB_CCL_OP_MAX || op == KB_CCL_OP_MIN)
        return 0.0;
    double b = kb_ccl_input_acc_bound(k, nterms);
    /* avg: sum * f32(1/ws), two roundings of 2^-24 relative, |avg| <= 16 */
    return op == KB_CCL_OP_AVG && kb_coll_reduces(k) ? b / (double)nterms + ldexp(1.0, -18) : b;
}

double kb_ccl_input_acc_bound(kb_coll_kind k, int64_t nterms)
{
    int reduces = k == KB_COLL_ALLREDUCE || k == KB_COLL_REDUCE || k == KB_COLL_REDUCE_SCATTER;
    if (!reduces || nterms <= KB_CCL_INPUT_EXACT_TERMS)
        return 0.0;
    /* |partial sums| <= 16 * nterms; each of nterms - 1 additions rounds by <= 2^-24 of it */
    return (double)(nterms - 1) * ldexp(1.0, -24) * 16.0 * (double)nterms;
}

/* ---- comparison ---- */

static double half_ulp(kb_dtype dt, double ref)
{
    if (dt == KB_F32)
        return ref == 0.0 ? ldexp(1.0, -150) : ldexp(1.0, ilogb(ref) - 24);
    double u = (double)kb_f16_ulp((float)ref);
    return 0.5 * (dt == KB_BF16 ? u * 8.0 : u); /* bf16 has 3 fewer mantissa bits */
}

/* One element: its value, the reference rounded to dt (bytes into want, value in *w), the
 * error |got - exact| (NaN counts as infinite) and its bound; returns whether it passes. */
static int check_elem(kb_dtype dt, size_t es, const void *raw, size_t k, double exact,
                      double acc_bound, unsigned char *want, double *got, double *w,
                      double *err, double *bound)
{
    *got = kb_dtype_load(dt, raw, k);
    kb_dtype_store(dt, want, 0, (float)exact);
    *w = kb_dtype_load(dt, want, 0);
    *bound = half_ulp(dt, exact) + acc_bound;
    double e = fabs(*got - exact);
    int ok = acc_bound > 0.0 ? e <= *bound
                             : !memcmp((const unsigned char *)raw + k * es, want, es);
    *err = isnan(e) ? INFINITY : e;
    return ok;
}

static void verdict_init(kb_ccl_verdict *v, int ntiles)
{
    memset(v, 0, sizeof *v);
    v->ntiles = ntiles;
    v->first_bad_tile = -1;
    v->first_bad_elem = -1;
    v->max_abs_err = -1.0;
}

static void verdict_finish(kb_ccl_verdict *v, double got_sum, double want_sum, int64_t n)
{
    if (v->max_abs_err < 0.0)
        v->max_abs_err = 0.0;
    if (v->ntiles > 0 && n > 0) {
        v->got_mean = got_sum / ((double)v->ntiles * (double)n);
        v->want_mean = want_sum / ((double)v->ntiles * (double)n);
    }
}

/*
 * The means of an all-reduce's f16 check whose every value is on the 2^-7 grid, from the
 * integer sums of value * 128: gq over every element of every tile, wq over the reference's n
 * columns (the same in every tile). The sums are exact (|value * 128| < 2^23, so int64 holds
 * them up to 2^40 elements), and each sum is converted to double once, so the means do not
 * depend on the order anything was added in: the host check and a device's answer give the
 * same bits at any size. Below 2^30 elements they are the sequential double sums exactly.
 * verdict_finish_q: the same from sums over every element (gq of the results, wq of the
 * rounded references), for the checks whose reference differs per tile.
 */
static void verdict_finish_q(kb_ccl_verdict *v, int64_t gq, int64_t wq, int64_t n)
{
    verdict_finish(v, (double)gq * 0x1p-7, (double)wq * 0x1p-7, n);
}

static void verdict_finish_grid(kb_ccl_verdict *v, int64_t gq, int64_t wq, int ntiles,
                                int64_t n)
{
    /* wq * ntiles in int64 when it fits, else rounded once in double */
    double want = (wq < 0 ? -wq : wq) <= INT64_MAX / (ntiles > 0 ? ntiles : 1)
                      ? (double)(wq * ntiles)
                      : (double)wq * (double)ntiles;
    verdict_finish(v, (double)gq * 0x1p-7, want * 0x1p-7, n);
}

/* x * 128 as an integer when x (an f16 value) is on the 2^-7 grid, else *off set. */
static int64_t grid_of(double x, int *off)
{
    double q = x * 128.0;
    if (isfinite(q) && q == floor(q))
        return (int64_t)q;
    *off = 1;
    return 0;
}

int kb_ccl_verify(kb_dtype dt, const void *raw, const double *ref, int ntiles, int64_t n,
                  double acc_bound, kb_ccl_verdict *v)
{
    size_t es = kb_dtype_size(dt);
    double got_sum = 0.0, want_sum = 0.0;
    unsigned char want[4];
    int64_t gq = 0, wq = 0;
    int off = dt != KB_F16; /* the grid sums are f16's (verdict_finish_q) */

    verdict_init(v, ntiles);
    for (int t = 0; t < ntiles; t++) {
        int good = 1;
        for (int64_t i = 0; i < n; i++) {
            size_t k = (size_t)t * (size_t)n + (size_t)i;
            double got, w, err, bound;
            int ok = check_elem(dt, es, raw, k, ref[k], acc_bound, want, &got, &w, &err, &bound);
            if (err > v->max_abs_err) {
                v->max_abs_err = err;
                v->err_bound = bound;
            }
            got_sum += got;
            want_sum += w;
            if (!off) {
                gq += grid_of(got, &off);
                wq += grid_of(w, &off);
            }
            v->nwrong += !ok;
            if (!ok && good) {
                good = 0;
                if (v->first_bad_tile < 0) {
                    v->first_bad_tile = t;
                    v->first_bad_elem = i;
                    v->first_got = got;
                    v->first_want = w;
                }
            }
        }
        v->ok_tiles += good;
    }
    /* f16 values on the grid: the exact integer sums, which a device's answer gives too */
    if (!off)
        verdict_finish_q(v, gq, wq, n);
    else
        verdict_finish(v, got_sum, want_sum, n);
    return v->ok_tiles == ntiles;
}

#define QOFF INT32_MIN



/* The 16-bit element k of raw. */
static inline uint16_t load16(const void *raw, size_t k)
{
    uint16_t h;
    memcpy(&h, (const unsigned char *)raw + 2 * k, 2);
    return h;
}

/*
 * Element k of a tile (rt) against the column's exact reference, its rounding (wraw's element
 * k) and bound: check_elem's error (NaN: infinite) and verdict (*ok); f16 values on the 2^-7
 * grid are added to *gq as integers, others set *offgrid.
 */
static inline double same_elem(kb_dtype dt, size_t es, const float *lut, const int32_t *lq,
                               const unsigned char *rt, const unsigned char *wraw, double exact,
                               double bound, double acc_bound, size_t k, int *ok, int *offgrid,
                               int64_t *gq)
{
    double got;
    int same_bits;
    if (lut) {
        uint16_t h = load16(rt, k);
        got = lut[h];
        same_bits = h == load16(wraw, k);
        *offgrid |= lq[h] == QOFF;
        *gq += lq[h];
    } else {
        got = kb_dtype_load(dt, rt, k);
        same_bits = !memcmp(rt + k * es, wraw + k * es, es);
    }
    double e = fabs(got - exact);
    *ok = acc_bound > 0.0 ? e <= bound : same_bits;
    return e != e ? INFINITY : e;
}

/*
 * same_elem over elements [k0, k0 + nb) of an f16 tile compared bit for bit (acc_bound 0):
 * returns the largest error, counts the failures into *nbad. Four independent maxima, so that
 * no dependency runs through every element.
 */
static double scan_f16_exact(const unsigned char *rt, const unsigned char *wraw,
                             const double *exact, int64_t nb, size_t k0, const float *lut,
                             const int32_t *lq, int *nbad, int *offgrid, int64_t *gq)
{
    double m0 = -1.0, m1 = -1.0, m2 = -1.0, m3 = -1.0;
    int bad = 0, off = 0;
    int64_t q = 0, j = 0;
#define KB_SCAN1(M, J)                                                                \
    do {                                                                              \
        uint16_t h = load16(rt, k0 + (size_t)(J));                                  \
        double e = fabs((double)lut[h] - exact[J]);                                   \
        e = e != e ? INFINITY : e;                                                    \
        M = e > M ? e : M;                                                            \
        bad += h != load16(wraw, k0 + (size_t)(J));                                   \
        off |= lq[h] == QOFF;                                                         \
        q += lq[h];                                                                   \
    } while (0)
    for (; j + 4 <= nb; j += 4) {
        KB_SCAN1(m0, j);
        KB_SCAN1(m1, j + 1);
        KB_SCAN1(m2, j + 2);
        KB_SCAN1(m3, j + 3);
    }
    for (; j < nb; j++)
        KB_SCAN1(m0, j);
#undef KB_SCAN1
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    *nbad += bad;
    *offgrid |= off;
    *gq += q;
    return m2 > m0 ? m2 : m0;
}

/* A tile's part of a verdict: its worst error (first occurrence) and first wrong element
 * (the device queries' kb_vq_tile; gq and offgrid are the callers' own business here). */
typedef kb_vq_tile tile_verdict;

/* Adds one checked element (its error, its bound, ok or not) to a tile's verdict. */
static void tile_note(tile_verdict *a, int ok, double err, double bound, int64_t elem,
                      double got, double want)
{
    if (err > a->max_err) {
        a->max_err = err;
        a->bound = bound;
    }
    a->nwrong += !ok;
    if (!ok && a->bad_elem < 0) {
        a->bad_elem = elem;
        a->bad_got = got;
        a->bad_want = want;
    }
}

int kb_ccl_positionwise(kb_coll_kind k)
{
    return k == KB_COLL_ALLREDUCE || k == KB_COLL_REDUCE || k == KB_COLL_BROADCAST ||
           k == KB_COLL_SENDRECV;
}

/* Whole arrays: what kinds whose outputs mix positions need. */
/* The reference's tile v is rank (v + root) mod ntiles: a reference written for root 0
 * checks any root with the ranks relabelled. */
static int rot(int t, int root, int ntiles) { return ((t - root) % ntiles + ntiles) % ntiles; }

/* The entry's reference for sum, kb_ccl_ref_op for the other ops of a reducing kind. */
static void run_ref(kb_ccl_ref_fn ref, kb_coll_kind kind, int op, const float *in, int ws,
                    int64_t n, double *out)
{
    if (op == KB_CCL_OP_SUM || !kb_coll_reduces(kind))
        ref(in, ws, n, out);
    else
        kb_ccl_ref_op(kind, op, in, ws, n, out);
}

static int verify_whole(kb_dtype dt, int op, const void *raw, kb_ccl_ref_fn ref,
                        kb_ccl_ref_ord_fn ord, kb_coll_kind kind, uint32_t seed, int ntiles,
                        int64_t n, int root, double acc_bound, kb_ccl_verdict *v)
{
    size_t total = (size_t)ntiles * (size_t)n;
    float *in = malloc((total ? total : 1) * sizeof *in);
    double *want = malloc((total ? total : 1) * sizeof *want);
    double *rw = root ? malloc((total ? total : 1) * sizeof *rw) : want;
    int rc = KB_ERR_NOMEM;
    if (in && want && rw) {
        for (int t = 0; t < ntiles; t++)
            kb_ccl_input_op_span(in + (size_t)rot(t, root, ntiles) * (size_t)n, seed, op, dt,
                                 ntiles, t, 0, n, n);
        if (ord)
            ord(in, ntiles, n, 0, n, dt, op, want);
        else
            run_ref(ref, kind, op, in, ntiles, n, want);
        for (int t = 0; root && t < ntiles; t++)
            memcpy(rw + (size_t)t * (size_t)n, want + (size_t)rot(t, root, ntiles) * (size_t)n,
                   (size_t)n * sizeof *rw);
        rc = kb_ccl_verify(dt, raw, rw, ntiles, n, acc_bound, v);
    }
    if (rw != want)
        free(rw);
    free(in);
    free(want);
    return rc;
}

/*
 * Column blocks: the inputs and the reference of columns [i0, i0 + nb) of every tile at a
 * time; every tile's part of the verdict is kept apart and merged in tile order afterwards,
 * which gives what the tile-major walk of kb_ccl_verify gives (the first worst error and the
 * first wrong element in tile-major order). The rounded reference is kept (dt bytes per
 * element) so that the means sum in tile-major order, exactly as kb_ccl_verify sums them.
 */
int kb_ccl_verify_inputs(kb_dtype dt, const void *raw, kb_ccl_ref_fn ref, kb_coll_kind kind,
                         uint32_t seed, int ntiles, int64_t n, double acc_bound,
                         kb_ccl_verdict *v)
{
    return kb_ccl_verify_inputs_root(dt, raw, ref, kind, seed, ntiles, n, 0, acc_bound, v);
}

/* What the column-block workers share (read-only) and what each one owns. */
typedef struct vshared {
    kb_dtype dt;
    size_t es;
    const void *raw;
    kb_ccl_ref_fn ref;
    kb_ccl_ref_ord_fn ord; /* replaces ref when set (f16 sum: op and dt are fixed) */
    uint32_t seed;
    int ntiles, root, same;
    int64_t n, B;
    double acc_bound;
    const float *lut;
    const int32_t *lq;
    unsigned char *wraw; /* written by column: workers' columns are disjoint */
} vshared;

typedef struct vwork {
    const vshared *sh;
    int64_t c0, c1;    /* columns [c0, c1): whole blocks */
    tile_verdict *tv;  /* ntiles: this worker's part */
    int64_t gq;
    int offgrid, nomem;
} vwork;

/* Checks the blocks of columns [c0, c1) of every tile (see kb_ccl_verify_inputs_root). */
static void *verify_blocks(void *arg)
{
    vwork *w = arg;
    const vshared *sh = w->sh;
    kb_dtype dt = sh->dt;
    size_t es = sh->es;
    int ntiles = sh->ntiles, root = sh->root, same = sh->same;
    int64_t n = sh->n, B = sh->B;
    double acc_bound = sh->acc_bound;
    const float *lut = sh->lut;
    const int32_t *lq = sh->lq;
    unsigned char *wraw = sh->wraw, want[4];
    float *in = malloc((size_t)ntiles * (size_t)B * sizeof *in + 1);
    double *out = malloc((size_t)(same ? 1 : ntiles) * (size_t)B * sizeof *out + 1);
    double *colb = same ? malloc((size_t)B * sizeof *colb + 1) : NULL;

    for (int t = 0; t < ntiles; t++)
        w->tv[t] = KB_VQ_TILE_EMPTY;
    if (!in || !out || (same && !colb)) {
        w->nomem = 1;
        goto out;
    }
    for (int64_t i0 = w->c0; i0 < w->c1; i0 += B) {
        int64_t nb = w->c1 - i0 < B ? w->c1 - i0 : B;
        for (int t = 0; t < ntiles; t++)
            kb_ccl_input_span(in + (size_t)rot(t, root, ntiles) * (size_t)nb, sh->seed, t, i0,
                              nb, n);
        if (same) {
            if (sh->ord) /* kb_ccl_ref_ring_allreduce, one row for all tiles */
                ring_allreduce_cols(in, ntiles, n, i0, nb, KB_F16, KB_CCL_OP_SUM, out);
            else
                sum_ranks(in, ntiles, nb, out);
            for (int64_t j = 0; j < nb; j++) { /* as check_elem does it */
                unsigned char *wj = wraw + (size_t)(i0 + j) * es;
                kb_dtype_store(dt, wj, 0, (float)out[j]);
                colb[j] = half_ulp(dt, out[j]) + acc_bound;
            }
            for (int t = 0; t < ntiles; t++) {
                tile_verdict *a = &w->tv[t];
                const unsigned char *rt =
                    (const unsigned char *)sh->raw + (size_t)t * (size_t)n * es;
                /* The block's largest error (independent maxima: no chain through every
                 * element) and whether any element failed; the first such elements are then
                 * found again, which only a new maximum or a failure costs. */
                double bm = -1.0;
                int nbad = 0;
                if (lut && acc_bound == 0.0) {
                    bm = scan_f16_exact(rt, wraw, out, nb, (size_t)i0, lut, lq, &nbad,
                                        &w->offgrid, &w->gq);
                } else {
                    for (int64_t j = 0; j < nb; j++) {
                        int ok;
                        double err = same_elem(dt, es, lut, lq, rt, wraw, out[j], colb[j],
                                               acc_bound, (size_t)(i0 + j), &ok, &w->offgrid,
                                               &w->gq);
                        bm = err > bm ? err : bm;
                        nbad += !ok;
                    }
                }
                a->nwrong += nbad;
                if (bm <= a->max_err && (nbad == 0 || a->bad_elem >= 0))
                    continue;
                for (int64_t j = 0; j < nb; j++) {
                    int ok, dummy_off = 0;
                    int64_t dummy_q = 0;
                    size_t k = (size_t)(i0 + j);
                    double err = same_elem(dt, es, lut, lq, rt, wraw, out[j], colb[j], acc_bound,
                                           k, &ok, &dummy_off, &dummy_q);
                    if (err > a->max_err) {
                        a->max_err = err;
                        a->bound = colb[j];
                    }
                    if (!ok && a->bad_elem < 0) {
                        a->bad_elem = i0 + j;
                        a->bad_got = lut ? (double)lut[load16(rt, k)] : kb_dtype_load(dt, rt, k);
                        a->bad_want = kb_dtype_load(dt, wraw, k);
                    }
                }
            }
            continue;
        }
        if (sh->ord)
            sh->ord(in, ntiles, n, i0, nb, KB_F16, KB_CCL_OP_SUM, out);
        else
            sh->ref(in, ntiles, nb, out);
        for (int t = 0; t < ntiles; t++) {
            tile_verdict *a = &w->tv[t];
            for (int64_t j = 0; j < nb; j++) {
                size_t k = (size_t)t * (size_t)n + (size_t)(i0 + j);
                double got, wv, err, bound;
                int ok = check_elem(dt, es, sh->raw, k,
                                    out[(size_t)rot(t, root, ntiles) * (size_t)nb + (size_t)j],
                                    acc_bound, want, &got, &wv, &err, &bound);
                memcpy(wraw + k * es, want, es);
                tile_note(a, ok, err, bound, i0 + j, got, wv);
            }
        }
    }
out:
    free(in);
    free(out);
    free(colb);
    return NULL;
}

/* Workers for a verification of `elems` elements in `blocks` column blocks: one per online
 * CPU up to KB_CCL_VERIFY_THREADS, none for small checks (threads cost ~50 us each). */
static int verify_threads(size_t elems, int64_t blocks)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t t = elems < ((size_t)1 << 22) ? 1 : cpus > 0 ? cpus : 1;
    if (t > KB_CCL_VERIFY_THREADS)
        t = KB_CCL_VERIFY_THREADS;
    if (t > blocks)
        t = blocks;
    return t > 0 ? (int)t : 1;
}

int kb_ccl_verify_inputs_root(kb_dtype dt, const void *raw, kb_ccl_ref_fn ref,
                              kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                              double acc_bound, kb_ccl_verdict *v)
{
    return kb_ccl_verify_inputs_op(dt, KB_CCL_OP_SUM, raw, ref, kind, seed, ntiles, n, root,
                                   acc_bound, v);
}

/* The verdict of ntiles tile verdicts: counts, the worst error, the first bad element. */
static void tiles_verdict(const tile_verdict *tv, int ntiles, kb_ccl_verdict *v)
{
    verdict_init(v, ntiles);
    for (int t = 0; t < ntiles; t++) {
        const tile_verdict *a = &tv[t];
        v->nwrong += a->nwrong;
        if (a->max_err > v->max_abs_err) {
            v->max_abs_err = a->max_err;
            v->err_bound = a->bound;
        }
        if (a->bad_elem < 0) {
            v->ok_tiles++;
        } else if (v->first_bad_tile < 0) {
            v->first_bad_tile = t;
            v->first_bad_elem = a->bad_elem;
            v->first_got = a->bad_got;
            v->first_want = a->bad_want;
        }
    }
}

/*
 * The f16 sum check of a position-wise collective (every bench's default), fast: column
 * blocks over threads, an all-reduce's column reference once, f16 results compared as bits.
 * Same verdict as the general loop of kb_ccl_verify_inputs_op.
 */
static int verify_sum_f16(kb_dtype dt, const void *raw, kb_ccl_ref_fn ref, kb_ccl_ref_ord_fn ord,
                          kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                          double acc_bound, kb_ccl_verdict *v)
{
    (void)kind; /* position-wise: the caller checked */
    size_t es = kb_dtype_size(dt), total = (size_t)ntiles * (size_t)n;
    int64_t B = (int64_t)(KB_CCL_VERIFY_BLOCK / (ntiles > 0 ? (size_t)ntiles : 1));
    assert(root >= 0 && (root == 0 || root < ntiles));
    if (B < 64)
        B = 64;
    if (B > n)
        B = n > 0 ? n : 1;
    /* An all-reduce's reference is the same for every tile (the ring's ordered one too: every
     * rank ends with the chain's one result): each column's value, rounding and bound once,
     * then per element only its load and comparison. */
    int same = (ref == kb_ccl_ref_allreduce && !ord) || ord == kb_ccl_ref_ring_allreduce;
    int64_t blocks = n > 0 ? (n + B - 1) / B : 0;
    int nth = verify_threads(total, blocks);
    tile_verdict *tv = malloc((size_t)(ntiles > 0 ? ntiles : 1) * (size_t)nth * sizeof *tv);
    vwork *wk = calloc((size_t)nth, sizeof *wk);
    unsigned char *wraw = malloc((same ? (size_t)n : total) * es + 1);
    float *lut = dt == KB_F16 ? malloc(65536 * sizeof *lut) : NULL;
    /* f16 values on the 2^-7 grid, as integers (else QOFF): while every value is on it the
     * means are exact integer sums (verdict_finish_grid), summed in any order to the same
     * bits; a value off it (a wrong result) takes the sequential double sums below */
    int32_t *lq = dt == KB_F16 ? malloc(65536 * sizeof *lq) : NULL;
    int64_t gq = 0;
    int offgrid = 0;
    double got_sum = 0.0, want_sum = 0.0;
    int rc = KB_ERR_NOMEM;

    if (!tv || !wk || !wraw || (dt == KB_F16 && (!lut || !lq)))
        goto out;
    for (uint32_t h = 0; lut && h < 65536; h++) { /* f16 loads: kb_dtype_load's values */
        lut[h] = kb_f16_to_f32((uint16_t)h);
        if (lq) {
            float q = lut[h] * 128.0f;
            lq[h] = isfinite(q) && q == floorf(q) ? (int32_t)q : QOFF;
        }
    }
    /* Column blocks split over workers in order; their parts are merged in that order, which
     * gives what one pass over the blocks gives, whatever the number of workers. */
    vshared sh = { dt, es, raw, ref, ord, seed, ntiles, root, same, n, B, acc_bound, lut, lq, wraw };
    for (int i = 0; i < nth; i++) {
        wk[i].sh = &sh;
        wk[i].c0 = blocks * i / nth * B;
        wk[i].c1 = i + 1 == nth ? n : blocks * (i + 1) / nth * B;
        wk[i].tv = tv + (size_t)i * (size_t)ntiles;
    }
    kb_par_run(verify_blocks, wk, sizeof *wk, (size_t)nth);
    for (int i = 0; i < nth; i++) {
        if (wk[i].nomem)
            goto out;
        gq += wk[i].gq;
        offgrid |= wk[i].offgrid;
    }
    for (int i = 1; i < nth; i++) /* workers' column ranges in ascending order */
        for (int t = 0; t < ntiles; t++)
            kb_vq_tile_merge(&tv[t], &wk[i].tv[t]);
    tiles_verdict(tv, ntiles, v);
    if (same && lq && !offgrid) { /* exact: the integer sums are the sequential double sums */
        int64_t wq = 0;
        for (int64_t i = 0; i < n; i++) {
            int32_t q = lq[load16(wraw, (size_t)i)];
            offgrid |= q == QOFF;
            wq += q;
        }
        if (!offgrid) {
            verdict_finish_grid(v, gq, wq, ntiles, n);
            rc = v->ok_tiles == ntiles;
            goto out;
        }
    }
    /* the means as kb_ccl_verify gives them: the grid sums while every value is on the grid
     * (checked again here: the other kinds' values were not looked at yet), else summed in
     * tile-major order */
    offgrid = !lq;
    gq = 0;
    int64_t wq = 0;
    for (size_t k = 0; k < total; k++) {
        size_t kw = same ? k % (size_t)n : k;
        if (lut) {
            uint16_t hg = load16(raw, k), hw = load16(wraw, kw);
            got_sum += lut[hg];
            want_sum += lut[hw];
            if (lq[hg] == QOFF || lq[hw] == QOFF) {
                offgrid = 1;
            } else {
                gq += lq[hg];
                wq += lq[hw];
            }
        } else {
            got_sum += kb_dtype_load(dt, raw, k);
            want_sum += kb_dtype_load(dt, wraw, kw);
        }
    }
    if (!offgrid)
        verdict_finish_q(v, gq, wq, n);
    else
        verdict_finish(v, got_sum, want_sum, n);
    rc = v->ok_tiles == ntiles;
out:
    free(tv);
    free(wk);
    free(wraw);
    free(lut);
    free(lq);
    return rc;
}

/* KB_VQ_COLL's collective for a non-all-reduce check whose reference the device computes (the
 * entry's plain reference, or its ring-ordered one), else 0. */
static uint32_t vq_coll_of(kb_coll_kind kind, kb_ccl_ref_fn ref, kb_ccl_ref_ord_fn ord)
{
    switch (kind) {
    case KB_COLL_ALLGATHER:
        return ref == kb_ccl_ref_allgather && !ord ? KB_VQ_C_ALLGATHER : 0;
    case KB_COLL_REDUCE_SCATTER:
        return ref == kb_ccl_ref_reduce_scatter &&
                       (!ord || ord == kb_ccl_ref_ring_reduce_scatter)
                   ? KB_VQ_C_REDUCE_SCATTER
                   : 0;
    case KB_COLL_BROADCAST:
        return ref == kb_ccl_ref_broadcast && !ord ? KB_VQ_C_BROADCAST : 0;
    case KB_COLL_REDUCE:
        return ref == kb_ccl_ref_reduce && (!ord || ord == kb_ccl_ref_ring_reduce)
                   ? KB_VQ_C_REDUCE
                   : 0;
    case KB_COLL_ALLTOALL:
        return ref == kb_ccl_ref_alltoall && !ord ? KB_VQ_C_ALLTOALL : 0;
    case KB_COLL_SENDRECV:
        return ref == kb_ccl_ref_shift_east && !ord ? KB_VQ_C_SHIFT : 0;
    default:
        return 0;
    }
}

int kb_ccl_vquery_of(kb_dtype dt, int op, kb_ccl_ref_fn ref, kb_ccl_ref_ord_fn ord,
                     kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                     kb_vquery *q)
{
    /* verify_sum_f16's "same" case, whose per-column reference the device computes */
    int plain = ref == kb_ccl_ref_allreduce && !ord, ring = ord == kb_ccl_ref_ring_allreduce;
    uint32_t coll = kind == KB_COLL_ALLREDUCE ? 0 : vq_coll_of(kind, ref, ord);
    /* any size a tile and the grid sums hold (kb_vquery.h: CHECK tiles of at most 2^31
     * elements; verdict_finish_grid: 2^40 in all) */
    if (dt != KB_F16 || op != KB_CCL_OP_SUM || ntiles < 1 || n < 1 ||
        (uint64_t)ntiles * (uint64_t)n > ((uint64_t)1 << 40) || root < 0 || root >= ntiles)
        return 0;
    memset(q, 0, sizeof *q);
    q->ntiles = (uint32_t)ntiles;
    q->n = (uint64_t)n;
    q->seed = seed;
    q->acc_bound = kb_ccl_input_acc_bound_op(kind, op, ntiles);
    if (kind == KB_COLL_ALLREDUCE) {
        if (root != 0 || !(plain || ring) || (uint64_t)n > ((uint64_t)1 << 31))
            return 0;
        q->kind = KB_VQ_CHECK;
        q->ordered = (uint32_t)ring;
        return 1;
    }
    q->kind = KB_VQ_COLL;
    q->coll = coll;
    q->ordered = ord != NULL;
    q->root = (uint32_t)root;
    /* a root only where the kind has one (the host relabels the ranks for any root) */
    return coll != 0 && (kb_coll_rooted(kind) || root == 0) && kb_vquery_valid(q);
}

int kb_ccl_verdict_of_query(const kb_vquery *q, const void *result, kb_ccl_verdict *v)
{
    const kb_vq_tile *vt = result;
    const kb_vq_sums *sums = (const kb_vq_sums *)(vt + q->ntiles);
    int ntiles = (int)q->ntiles;
    int64_t gq = 0;
    int offgrid = sums->offgrid != 0;

    for (int t = 0; t < ntiles; t++) {
        gq += vt[t].gq;
        offgrid |= vt[t].offgrid != 0;
    }
    tiles_verdict(vt, ntiles, v);
    if (offgrid) /* all but the means is the host's verdict */
        return KB_ERR_UNSUPPORTED;
    /* as the host check finishes: every value on the grid, so the integer sums are exact
     * (CHECK's wq covers the n columns every tile shares, COLL's every element) */
    if (q->kind == KB_VQ_COLL)
        verdict_finish_q(v, gq, sums->wq, (int64_t)q->n);
    else
        verdict_finish_grid(v, gq, sums->wq, ntiles, (int64_t)q->n);
    return v->ok_tiles == ntiles;
}

int kb_ccl_verify_inputs_op(kb_dtype dt, int op, const void *raw, kb_ccl_ref_fn ref,
                            kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                            double acc_bound, kb_ccl_verdict *v)
{
    return kb_ccl_verify_inputs_ord(dt, op, raw, ref, NULL, kind, seed, ntiles, n, root,
                                    acc_bound, v);
}

int kb_ccl_verify_inputs_ord(kb_dtype dt, int op, const void *raw, kb_ccl_ref_fn ref,
                             kb_ccl_ref_ord_fn ord, kb_coll_kind kind, uint32_t seed, int ntiles,
                             int64_t n, int root, double acc_bound, kb_ccl_verdict *v)
{
    size_t es = kb_dtype_size(dt), total = (size_t)ntiles * (size_t)n;
    int64_t B = (int64_t)(KB_CCL_VERIFY_BLOCK / (ntiles > 0 ? (size_t)ntiles : 1));
    if (!kb_ccl_positionwise(kind))
        return verify_whole(dt, op, raw, ref, ord, kind, seed, ntiles, n, root, acc_bound, v);
    if (op == KB_CCL_OP_SUM && dt == KB_F16)
        return verify_sum_f16(dt, raw, ref, ord, kind, seed, ntiles, n, root, acc_bound, v);
    assert(root >= 0 && (root == 0 || root < ntiles));
    if (B < 64)
        B = 64;
    if (B > n)
        B = n > 0 ? n : 1;
    float *in = malloc((size_t)ntiles * (size_t)B * sizeof *in + 1);
    double *out = malloc((size_t)ntiles * (size_t)B * sizeof *out + 1);
    tile_verdict *tv = malloc((size_t)(ntiles > 0 ? ntiles : 1) * sizeof *tv);
    unsigned char *wraw = malloc(total * es + 1), want[4];
    double got_sum = 0.0, want_sum = 0.0;
    int rc = KB_ERR_NOMEM;

    if (!in || !out || !tv || !wraw)
        goto out;
    for (int t = 0; t < ntiles; t++)
        tv[t] = KB_VQ_TILE_EMPTY;
    for (int64_t i0 = 0; i0 < n; i0 += B) {
        int64_t nb = n - i0 < B ? n - i0 : B;
        for (int t = 0; t < ntiles; t++)
            kb_ccl_input_op_span(in + (size_t)rot(t, root, ntiles) * (size_t)nb, seed, op, dt,
                                 ntiles, t, i0, nb, n);
        if (ord)
            ord(in, ntiles, n, i0, nb, dt, op, out);
        else
            run_ref(ref, kind, op, in, ntiles, nb, out);
        for (int t = 0; t < ntiles; t++) {
            tile_verdict *a = &tv[t];
            for (int64_t j = 0; j < nb; j++) {
                size_t k = (size_t)t * (size_t)n + (size_t)(i0 + j);
                double got, w, err, bound;
                int ok = check_elem(dt, es, raw, k,
                                    out[(size_t)rot(t, root, ntiles) * (size_t)nb + (size_t)j],
                                    acc_bound, want, &got, &w, &err, &bound);
                memcpy(wraw + k * es, want, es);
                tile_note(a, ok, err, bound, i0 + j, got, w);
            }
        }
    }
    tiles_verdict(tv, ntiles, v);
    for (size_t k = 0; k < total; k++) {
        got_sum += kb_dtype_load(dt, raw, k);
        want_sum += kb_dtype_load(dt, wraw, k);
    }
    verdict_finish(v, got_sum, want_sum, n);
    rc = v->ok_tiles == ntiles;
out:
    free(in);
    free(out);
    free(tv);
    free(wraw);
    return rc;
}
