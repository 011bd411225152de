/*
 * kb_hostgemm — blocked, vectorised, threaded f64 reference gemm and its checker
 * (kb_hostgemm.h). Rows are cut into blocks of RB (the unit of work of a thread); each block
 * walks column panels of JB and K steps of KB, with the B panel converted to f64 once per
 * step and a 2-row x 8-column kernel keeping its 32 sums in registers over the step. Each
 * element's sums still run over k in ascending order, one rounding per operation.
 */
#include "kb_hostgemm.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kb_par.h"

enum { RB = 128, JB = 128, KB = 128 };

/* Four doubles as one value (GCC/Clang vector extension): the sums stay in registers, one
 * AVX2 register each in the avx2 copy, two SSE2 halves in the baseline one. */
typedef double v4d __attribute__((vector_size(32)));
typedef long long v4i __attribute__((vector_size(32)));

/* Macros, not functions: a function taking or returning a 32-byte vector has a different
 * ABI with and without AVX (GCC warns). */
#define LD4(v, p) memcpy(&(v), (p), sizeof(v4d))
#define ST4(p, v) memcpy((p), &(v), sizeof(v4d))
/* |x|: the sign bits cleared, as fabs does */
#define ABS4(x) ((v4d)((v4i)(x) & absmask))

/* s/t[0..8) of rows 0 and 1 += a0/a1[k] * bp[k * JB + 0..8) (and |.|) for k < kw. */
KB_VECTOR_CLONES
static void kernel_2x8(const float *a0, const float *a1, const double *bp, size_t kw,
                       double *s0, double *s1, double *t0, double *t1)
{
    const v4i absmask = { INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX };
    v4d x0, x1, x2, x3, y0, y1, y2, y3;
    LD4(x0, s0);
    LD4(x1, s0 + 4);
    LD4(x2, s1);
    LD4(x3, s1 + 4);
    LD4(y0, t0);
    LD4(y1, t0 + 4);
    LD4(y2, t1);
    LD4(y3, t1 + 4);
    for (size_t k = 0; k < kw; k++) {
        v4d b0, b1;
        LD4(b0, bp + k * JB);
        LD4(b1, bp + k * JB + 4);
        double u = (double)a0[k], v = (double)a1[k];
        v4d uu = { u, u, u, u }, vv = { v, v, v, v };
        v4d p0 = uu * b0, p1 = uu * b1, q0 = vv * b0, q1 = vv * b1;
        x0 += p0;
        x1 += p1;
        x2 += q0;
        x3 += q1;
        y0 += ABS4(p0);
        y1 += ABS4(p1);
        y2 += ABS4(q0);
        y3 += ABS4(q1);
    }
    ST4(s0, x0);
    ST4(s0 + 4, x1);
    ST4(s1, x2);
    ST4(s1 + 4, x3);
    ST4(t0, y0);
    ST4(t0 + 4, y1);
    ST4(t1, y2);
    ST4(t1 + 4, y3);
}

/* The edges: one row, w columns. */
static void kernel_1xw(const float *a0, const double *bp, size_t kw, size_t w, double *s0,
                       double *t0)
{
    for (size_t j = 0; j < w; j++) {
        double x = s0[j], y = t0[j];
        for (size_t k = 0; k < kw; k++) {
            double p = (double)a0[k] * bp[k * JB + j];
            x += p;
            y += fabs(p);
        }
        s0[j] = x;
        t0[j] = y;
    }
}

/*
 * Rows [i0, i0 + rows) of the product: s (sums) and t (sums of |products|), rows x N with
 * row stride N, overwritten. bp: JB * KB doubles of workspace.
 */
static void block_rows(const float *a, const float *b, size_t N, size_t K, size_t i0,
                       size_t rows, double *s, double *t, double *bp)
{
    for (size_t i = 0; i < rows; i++) {
        memset(s + i * N, 0, N * sizeof *s);
        memset(t + i * N, 0, N * sizeof *t);
    }
    for (size_t j0 = 0; j0 < N; j0 += JB) {
        size_t jw = N - j0 < JB ? N - j0 : JB;
        for (size_t k0 = 0; k0 < K; k0 += KB) {
            size_t kw = K - k0 < KB ? K - k0 : KB;
            for (size_t k = 0; k < kw; k++)
                for (size_t j = 0; j < jw; j++)
                    bp[k * JB + j] = (double)b[(k0 + k) * N + j0 + j];
            size_t i = 0;
            for (; i + 2 <= rows; i += 2) {
                const float *a0 = a + (i0 + i) * K + k0, *a1 = a0 + K;
                double *s0 = s + i * N + j0, *t0 = t + i * N + j0;
                size_t j = 0;
                for (; j + 8 <= jw; j += 8)
                    kernel_2x8(a0, a1, bp + j, kw, s0 + j, s0 + N + j, t0 + j, t0 + N + j);
                if (j < jw) {
                    kernel_1xw(a0, bp + j, kw, jw - j, s0 + j, t0 + j);
                    kernel_1xw(a1, bp + j, kw, jw - j, s0 + N + j, t0 + N + j);
                }
            }
            if (i < rows)
                kernel_1xw(a + (i0 + i) * K + k0, bp, kw, jw, s + i * N + j0, t + i * N + j0);
        }
    }
}

/*
 * The exact path. When every A value is an integer multiple of 2^qa, every B value one of
 * 2^qb, and K * max|A / 2^qa| * max|B / 2^qb| < 2^24 (qa + qb within f32's range), every
 * product, partial sum and sum of |products| is an integer below 2^24 times 2^(qa + qb):
 * exact in f32, so f32 arithmetic gives the f64 loop's values bit for bit, twice as wide per
 * register. (The benches' patterns, k/16 with |k| <= 8, qualify up to K = 2^18.)
 */
typedef float v8f __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
#define LD8(v, p) memcpy(&(v), (p), sizeof(v8f))
#define ST8(p, v) memcpy((p), &(v), sizeof(v8f))
#define ABS8(x) ((v8f)((v8i)(x) & absmask8))

/* Lowest set bit's exponent of every nonzero value (min) and the largest |value| of x[0..n);
 * 0 when one is not finite. */
static int grid_of(const float *x, size_t n, int *qmin, float *maxabs)
{
    int q = INT32_MAX;
    float mx = 0.0f;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        uint32_t e = (u >> 23) & 0xFFu, mant = u & 0x7FFFFFu;
        int lsb;
        if (e == 0xFFu)
            return 0;
        if (e == 0 && mant == 0)
            continue;
        if (e != 0)
            mant |= 0x800000u;
        lsb = (e ? (int)e - 150 : -149) + __builtin_ctz(mant);
        if (lsb < q)
            q = lsb;
        if (fabsf(x[i]) > mx)
            mx = fabsf(x[i]);
    }
    *qmin = q == INT32_MAX ? 0 : q;
    *maxabs = mx;
    return 1;
}

static int exact_in_f32(const float *a, const float *b, size_t M, size_t N, size_t K)
{
    int qa, qb;
    float ma, mb;
    if (!grid_of(a, M * K, &qa, &ma) || !grid_of(b, K * N, &qb, &mb))
        return 0;
    if (qa + qb < -149 || qa + qb > 100)
        return 0;
    return (double)K * ldexp((double)ma, -qa) * ldexp((double)mb, -qb) < 16777216.0;
}

/* kernel_2x8 in f32, 16 columns */
KB_VECTOR_CLONES
static void kernel_2x16f(const float *a0, const float *a1, const float *bp, size_t kw,
                         float *s0, float *s1, float *t0, float *t1)
{
    const v8i absmask8 = { INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX,
                           INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX };
    v8f x0, x1, x2, x3, y0, y1, y2, y3;
    LD8(x0, s0);
    LD8(x1, s0 + 8);
    LD8(x2, s1);
    LD8(x3, s1 + 8);
    LD8(y0, t0);
    LD8(y1, t0 + 8);
    LD8(y2, t1);
    LD8(y3, t1 + 8);
    for (size_t k = 0; k < kw; k++) {
        v8f b0, b1;
        float u = a0[k], v = a1[k];
        v8f uu = { u, u, u, u, u, u, u, u }, vv = { v, v, v, v, v, v, v, v };
        LD8(b0, bp + k * JB);
        LD8(b1, bp + k * JB + 8);
        v8f p0 = uu * b0, p1 = uu * b1, q0 = vv * b0, q1 = vv * b1;
        x0 += p0;
        x1 += p1;
        x2 += q0;
        x3 += q1;
        y0 += ABS8(p0);
        y1 += ABS8(p1);
        y2 += ABS8(q0);
        y3 += ABS8(q1);
    }
    ST8(s0, x0);
    ST8(s0 + 8, x1);
    ST8(s1, x2);
    ST8(s1 + 8, x3);
    ST8(t0, y0);
    ST8(t0 + 8, y1);
    ST8(t1, y2);
    ST8(t1 + 8, y3);
}

static void kernel_1xwf(const float *a0, const float *bp, size_t kw, size_t w, float *s0,
                        float *t0)
{
    for (size_t j = 0; j < w; j++) {
        float x = s0[j], y = t0[j];
        for (size_t k = 0; k < kw; k++) {
            float p = a0[k] * bp[k * JB + j];
            x += p;
            y += fabsf(p);
        }
        s0[j] = x;
        t0[j] = y;
    }
}

/* block_rows in f32 (the exact path): s, t are rows x N floats. */
static void block_rows_f(const float *a, const float *b, size_t N, size_t K, size_t i0,
                         size_t rows, float *s, float *t, float *bp)
{
    memset(s, 0, rows * N * sizeof *s);
    memset(t, 0, rows * N * sizeof *t);
    for (size_t j0 = 0; j0 < N; j0 += JB) {
        size_t jw = N - j0 < JB ? N - j0 : JB;
        for (size_t k0 = 0; k0 < K; k0 += KB) {
            size_t kw = K - k0 < KB ? K - k0 : KB;
            for (size_t k = 0; k < kw; k++)
                memcpy(bp + k * JB, b + (k0 + k) * N + j0, jw * sizeof *bp);
            size_t i = 0;
            for (; i + 2 <= rows; i += 2) {
                const float *a0 = a + (i0 + i) * K + k0, *a1 = a0 + K;
                float *s0 = s + i * N + j0, *t0 = t + i * N + j0;
                size_t j = 0;
                for (; j + 16 <= jw; j += 16)
                    kernel_2x16f(a0, a1, bp + j, kw, s0 + j, s0 + N + j, t0 + j, t0 + N + j);
                if (j < jw) {
                    kernel_1xwf(a0, bp + j, kw, jw - j, s0 + j, t0 + j);
                    kernel_1xwf(a1, bp + j, kw, jw - j, s0 + N + j, t0 + N + j);
                }
            }
            if (i < rows)
                kernel_1xwf(a + (i0 + i) * K + k0, bp, kw, jw, s + i * N + j0, t + i * N + j0);
        }
    }
}

/* Work shared by the threads of one call; each takes a contiguous range of row blocks. */
typedef struct job {
    const float *a, *b, *got;
    size_t M, N, K;
    double *ref, *bound;       /* kb_hostgemm_ref: the outputs; check: NULL */
    kb_dtype dt;
    const char *what;
    kb_bench_result *blk;      /* check: one result per row block */
    int *blk_ok;
    int exact;                 /* the f32 path gives the same values (exact_in_f32) */
} job;

typedef struct worker {
    const job *j;
    size_t b0, b1; /* row blocks */
    int nomem;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    const job *j = w->j;
    double scale = (double)j->K * ldexp(1.0, -24);
    size_t blk_elems = (size_t)RB * j->N;
    double *bp = malloc((size_t)JB * KB * sizeof *bp); /* room for the f32 path's too */
    double *s = NULL, *t = NULL;
    float *sf = NULL, *tf = NULL;

    if (!bp || (!j->ref && (!(s = malloc(blk_elems * sizeof *s)) ||
                            !(t = malloc(blk_elems * sizeof *t)))) ||
        (j->exact && (!(sf = malloc(blk_elems * sizeof *sf)) ||
                      !(tf = malloc(blk_elems * sizeof *tf))))) {
        w->nomem = 1;
        goto out;
    }
    for (size_t blk = w->b0; blk < w->b1; blk++) {
        size_t i0 = blk * RB, rows = j->M - i0 < RB ? j->M - i0 : RB, n = rows * j->N;
        double *bs = j->ref ? j->ref + i0 * j->N : s, *bt = j->ref ? j->bound + i0 * j->N : t;
        if (j->exact) {
            block_rows_f(j->a, j->b, j->N, j->K, i0, rows, sf, tf, (float *)bp);
            for (size_t e = 0; e < n; e++) {
                bs[e] = (double)sf[e];
                bt[e] = (double)tf[e];
            }
        } else {
            block_rows(j->a, j->b, j->N, j->K, i0, rows, bs, bt, bp);
        }
        for (size_t e = 0; e < n; e++)
            bt[e] *= scale;
        if (!j->ref)
            j->blk_ok[blk] = kb_bench_check_from(&j->blk[blk], j->dt, j->got + i0 * j->N, bs, bt,
                                                 n, i0 * j->N, j->what);
    }
out:
    free(bp);
    free(s);
    free(t);
    free(sf);
    free(tf);
    return NULL;
}

/* Runs the job over its row blocks: one thread per online CPU (at most KB_HOSTGEMM_THREADS,
 * one per block) for products of 2^24 multiply-adds or more, else on the caller. */
static int run_job(const job *j, size_t blocks)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double macs = (double)j->M * (double)j->N * (double)j->K;
    size_t nth = macs < 16777216.0 || cpus < 1 ? 1 : (size_t)cpus;
    worker wk[KB_HOSTGEMM_THREADS];
    int rc = 0;

    if (nth > KB_HOSTGEMM_THREADS)
        nth = KB_HOSTGEMM_THREADS;
    if (nth > blocks)
        nth = blocks > 0 ? blocks : 1;
    for (size_t i = 0; i < nth; i++) {
        wk[i].j = j;
        wk[i].b0 = blocks * i / nth;
        wk[i].b1 = blocks * (i + 1) / nth;
        wk[i].nomem = 0;
    }
    kb_par_run(work, wk, sizeof *wk, nth);
    for (size_t i = 0; i < nth; i++)
        if (wk[i].nomem)
            rc = KB_ERR_NOMEM;
    return rc;
}

int kb_hostgemm_ref(const float *a, const float *b, size_t M, size_t N, size_t K, double *ref,
                    double *bound)
{
    job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.b = b;
    j.M = M;
    j.N = N;
    j.K = K;
    j.ref = ref;
    j.bound = bound;
    j.exact = exact_in_f32(a, b, M, N, K);
    return M && N ? run_job(&j, (M + RB - 1) / RB) : 0;
}

int kb_hostgemm_check(kb_bench_result *r, kb_dtype dt, const float *got, const float *a,
                      const float *b, size_t M, size_t N, size_t K, const char *what)
{
    size_t blocks = (M + RB - 1) / RB;
    kb_bench_result *blk;
    int *blk_ok, ok = 1, rc;
    job j;

    if (!M || !N)
        return 1;
    blk = calloc(blocks, sizeof *blk);
    blk_ok = calloc(blocks, sizeof *blk_ok);
    if (!blk || !blk_ok) {
        free(blk);
        free(blk_ok);
        return KB_ERR_NOMEM;
    }
    memset(&j, 0, sizeof j);
    j.a = a;
    j.b = b;
    j.got = got;
    j.M = M;
    j.N = N;
    j.K = K;
    j.dt = dt;
    j.what = what;
    j.blk = blk;
    j.blk_ok = blk_ok;
    j.exact = exact_in_f32(a, b, M, N, K);
    rc = run_job(&j, blocks);
    /* merged in block order: what one pass over the elements in order gives */
    for (size_t i = 0; rc == 0 && i < blocks; i++) {
        const kb_bench_result *x = &blk[i];
        if (x->have_err && (!r->have_err || (!isnan(r->max_abs_err) &&
                                             !(x->max_abs_err <= r->max_abs_err)))) {
            r->max_abs_err = x->max_abs_err;
            r->err_bound = x->err_bound;
            r->have_err = 1;
        }
        if (!blk_ok[i]) {
            if (ok)
                snprintf(r->detail, sizeof r->detail, "%s", x->detail);
            ok = 0;
        }
    }
    free(blk);
    free(blk_ok);
    return rc ? rc : ok;
}
