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

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

void kb_ccl_ref_allreduce(const float *in, int ws, int64_t n, double *out)
{
    /* the sum once, then copies: O(ws*n), not O(ws^2*n), for 256-rank references */
    for (int64_t i = 0; i < n; i++) {
        double s = 0.0;
        for (int q = 0; q < ws; q++)
            s += in[(size_t)q * (size_t)n + (size_t)i];
        out[i] = s;
    }
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

void kb_ccl_ref_shift_east(const float *in, int ws, int64_t n, double *out)
{
    for (int r = 0; r < ws; r++) {
        int from = ws < 2 ? r : (r + ws - 1) % ws;
        for (int64_t i = 0; i < n; i++)
            out[(size_t)r * (size_t)n + (size_t)i] = in[(size_t)from * (size_t)n + (size_t)i];
    }
}

/* ---- test inputs ---- */

static uint32_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return (uint32_t)x;
}

/* A keyed bijection of [0, 4096): adding, multiplying by an odd number and xor-shifting right
 * are each invertible modulo 2^12, so distinct positions of one block get distinct values. */
static uint32_t perm12(uint32_t x, uint32_t key)
{
    for (int r = 0; r < 4; r++) {
        x = (x + (key >> (r * 5))) & 0xfffu;
        x = (x * 0x9e5u) & 0xfffu;
        x ^= x >> 5;
        x = (x * 0x2c1u) & 0xfffu;
        x ^= x >> 7;
    }
    return x;
}

static uint32_t input_key(uint32_t seed, uint64_t p)
{
    return mix64(((uint64_t)seed << 32) ^ (p >> 12) ^ UINT64_C(0x9e3779b97f4a7c15));
}

float kb_ccl_input(uint32_t seed, int64_t tile, int64_t i, int64_t n)
{
    uint64_t p = (uint64_t)tile * (uint64_t)n + (uint64_t)i;
    int k = (int)perm12((uint32_t)(p & 0xfffu), input_key(seed, p));
    return (float)(k - KB_CCL_INPUT_GRID / 2) / 128.0f;
}

void kb_ccl_input_span(float *x, uint32_t seed, int64_t tile, int64_t i0, int64_t len, int64_t n)
{
    uint64_t p = (uint64_t)tile * (uint64_t)n + (uint64_t)i0;
    /* one key per block of 4096 positions, then the permutation alone per element */
    for (int64_t k = 0; k < len;) {
        uint32_t key = input_key(seed, p), lo = (uint32_t)(p & 0xfffu);
        int64_t m = (int64_t)(0x1000u - lo);
        if (m > len - k)
            m = len - k;
        for (int64_t j = 0; j < m; j++)
            x[k + j] = (float)((int)perm12(lo + (uint32_t)j, key) - KB_CCL_INPUT_GRID / 2) /
                       128.0f;
        k += m;
        p += (uint64_t)m;
    }
}

void kb_ccl_inputs(float *x, uint32_t seed, int64_t tile0, int64_t ntiles, int64_t n)
{
    for (int64_t t = 0; t < ntiles; t++)
        kb_ccl_input_span(x + (size_t)t * (size_t)n, seed, tile0 + t, 0, n, n);
}

void kb_ccl_input_op_span(float *x, uint32_t seed, int op, kb_dtype dt, int64_t ntiles,
                          int64_t tile, int64_t i0, int64_t len, int64_t n)
{
    unsigned char b[4];
    kb_ccl_input_span(x, seed, tile, i0, len, n);
    for (int64_t j = 0; op == KB_CCL_OP_PROD && j < len; j++)
        if ((i0 + j) % ntiles != tile)
            x[j] = x[j] < 0.0f ? -1.0f : 1.0f;
    for (int64_t j = 0; dt != KB_F32 && j < len; j++) {
        kb_dtype_store(dt, b, 0, x[j]); /* what the tile holds */
        x[j] = kb_dtype_load(dt, b, 0);
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

int kb_ccl_verify(kb_dtype dt, const void *raw, const double *ref, int ntiles, int64_t n,
                  double acc_bound, kb_ccl_verdict *v)
{
    size_t es = kb_dtype_size(dt);
    double got_sum = 0.0, want_sum = 0.0;
    unsigned char want[4];

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
    verdict_finish(v, got_sum, want_sum, n);
    return v->ok_tiles == ntiles;
}

/* A tile's part of a verdict: its worst error (first occurrence) and first wrong element. */
typedef struct tile_verdict {
    double max_err, bound;
    int64_t bad_elem; /* -1: none */
    double bad_got, bad_want;
    int64_t nwrong;
} tile_verdict;

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
                        kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                        double acc_bound, kb_ccl_verdict *v)
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

int kb_ccl_verify_inputs_root(kb_dtype dt, const void *raw, kb_ccl_ref_fn ref,
                              kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                              double acc_bound, kb_ccl_verdict *v)
{
    return kb_ccl_verify_inputs_op(dt, KB_CCL_OP_SUM, raw, ref, kind, seed, ntiles, n, root,
                                   acc_bound, v);
}

int kb_ccl_verify_inputs_op(kb_dtype dt, int op, const void *raw, kb_ccl_ref_fn ref,
                            kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                            double acc_bound, kb_ccl_verdict *v)
{
    size_t es = kb_dtype_size(dt), total = (size_t)ntiles * (size_t)n;
    int64_t B = (int64_t)(KB_CCL_VERIFY_BLOCK / (ntiles > 0 ? (size_t)ntiles : 1));
    if (!kb_ccl_positionwise(kind))
        return verify_whole(dt, op, raw, ref, kind, seed, ntiles, n, root, acc_bound, v);
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
        tv[t] = (tile_verdict){ -1.0, 0.0, -1, 0.0, 0.0, 0 };
    for (int64_t i0 = 0; i0 < n; i0 += B) {
        int64_t nb = n - i0 < B ? n - i0 : B;
        for (int t = 0; t < ntiles; t++)
            kb_ccl_input_op_span(in + (size_t)rot(t, root, ntiles) * (size_t)nb, seed, op, dt,
                                 ntiles, t, i0, nb, n);
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
                if (err > a->max_err) {
                    a->max_err = err;
                    a->bound = bound;
                }
                a->nwrong += !ok;
                if (!ok && a->bad_elem < 0) {
                    a->bad_elem = i0 + j;
                    a->bad_got = got;
                    a->bad_want = w;
                }
            }
        }
    }
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
