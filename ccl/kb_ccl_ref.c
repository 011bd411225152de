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

#include <math.h>
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

int kb_ccl_verify(kb_dtype dt, const void *raw, const double *ref, int ntiles, int64_t n,
                  double acc_bound, kb_ccl_verdict *v)
{
    size_t es = kb_dtype_size(dt);
    double got_sum = 0.0, want_sum = 0.0;
    unsigned char want[4];

    memset(v, 0, sizeof *v);
    v->ntiles = ntiles;
    v->first_bad_tile = -1;
    v->first_bad_elem = -1;
    v->max_abs_err = -1.0;
    for (int t = 0; t < ntiles; t++) {
        int good = 1;
        for (int64_t i = 0; i < n; i++) {
            size_t k = (size_t)t * (size_t)n + (size_t)i;
            double got = kb_dtype_load(dt, raw, k), exact = ref[k];
            kb_dtype_store(dt, want, 0, (float)exact);
            double w = kb_dtype_load(dt, want, 0), bound = half_ulp(dt, exact) + acc_bound;
            double err = fabs(got - exact);
            int ok = acc_bound > 0.0 ? err <= bound
                                     : !memcmp((const unsigned char *)raw + k * es, want, es);
            if (isnan(err))
                err = INFINITY;
            if (err > v->max_abs_err) {
                v->max_abs_err = err;
                v->err_bound = bound;
            }
            got_sum += got;
            want_sum += w;
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
    if (v->max_abs_err < 0.0)
        v->max_abs_err = 0.0;
    if (ntiles > 0 && n > 0) {
        v->got_mean = got_sum / ((double)ntiles * (double)n);
        v->want_mean = want_sum / ((double)ntiles * (double)n);
    }
    return v->ok_tiles == ntiles;
}
