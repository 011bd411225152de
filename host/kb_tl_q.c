/*
 * kb_tl_q — number formats and 2:4 sparsity for gemm (kb_tl_q.h, docs/formats.md).
 *
 * One set of scalar routines defines every quantized value: the host paths
 * (kb_qweight_create, kb_qweight_host_values, kb_qact_host_values) call them directly and the
 * kernel path records ops whose replay evaluates the same kb_mathfn.h functions
 * (ABS, REDUCE max, CLAMP, AXPB, DIV into an 8-bit dtype, COPY into e8m0, DEQUANT), so host
 * references reproduce the device's bits. Scales: int8/fp8 s = max(amax, FLT_MIN) * (1/Q)
 * (one f32 rounding; Q = 127, 448, 57344; amax via the NaN-ignoring max), q = RNE-saturating
 * store of x / s; MXINT8 per 32-block: e = e8m0(amax) (floor of log2, the OCP MX rule with
 * emax = 0 for INT8), q = int8(x / (2^e * 2^-6)), value q * 2^e * 2^-6 (exact).
 *
 * Timing: activation quantization occupies PE_MATH (int8/fp8: 3 passes over m x k — abs, row
 * max, divide-and-store — plus 2 over m for the scale; MXINT8: 3 passes over m x k plus 2
 * over m x k / 32); the gemm occupies PE_GEMM for fixed + 2MNK / (flops_per_ns * speedup) per
 * SchedulerV2 step, reserved here with the format's rate (the DEQUANT records that make
 * replay see f32 operands stand for the gemm unit's own format handling and take no time).
 * Weights not in the PE's TCM are streamed per (m, n, k) tile like tl_dot's B operand, in the
 * format's bytes: elements (1 B, f16/bf16 2 B; sparse: half the rows), MXINT8 scales 1 B per
 * 32 elements, per-channel scales 4 B per column at each tile's first k step, 2:4 metadata
 * 1 B per 8 rows (2 bits per kept element). Limits: see kb_tl_q.h.
 */
#include "kb_tl_q.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kb_addr.h"
#include "kb_machine.h"
#include "kb_mathfn.h"
#include "kb_par.h"
#include "kb_runtime_ext.h"

static const char *const fmt_names[KB_QF_COUNT] = { "f16", "bf16", "int8", "mxint8", "fp8e4m3",
                                                    "fp8e5m2" };

const char *kb_qfmt_name(kb_qfmt f)
{
    return (unsigned)f < KB_QF_COUNT ? fmt_names[f] : "?";
}

int kb_qfmt_from_name(const char *s)
{
    for (int i = 0; s && i < KB_QF_COUNT; i++)
        if (strcmp(s, fmt_names[i]) == 0)
            return i;
    return -1;
}

double kb_qfmt_bits(kb_qfmt f)
{
    switch (f) {
    case KB_QF_F16:
    case KB_QF_BF16: return 16.0;
    case KB_QF_MXINT8: return 8.0 + 8.0 / 32.0;
    case KB_QF_INT8:
    case KB_QF_FP8E4M3:
    case KB_QF_FP8E5M2: return 8.0;
    default: return 0.0;
    }
}

kb_dtype kb_qfmt_dtype(kb_qfmt f)
{
    static const kb_dtype dt[KB_QF_COUNT] = { KB_F16, KB_BF16, KB_I8, KB_I8, KB_FP8E4M3,
                                              KB_FP8E5M2 };
    return (unsigned)f < KB_QF_COUNT ? dt[f] : KB_F16;
}

static int is8(kb_qfmt f) { return f >= KB_QF_INT8 && f < KB_QF_COUNT; }
static int has_scale(kb_qfmt f) { return is8(f); }

/* Q: the largest element magnitude of a per-channel / per-token format. */
static float qmax(kb_qfmt f)
{
    return f == KB_QF_FP8E4M3 ? 448.0f : f == KB_QF_FP8E5M2 ? 57344.0f : 127.0f;
}

#define MX_BLOCK 32
#define MX_ELEM_SCALE 0x1p-6f /* MXINT8 elements are fixed point with 6 fractional bits */

/* ---------------------------------------------------------------- scalar definitions */

/* The scalar definitions are kb_mathfn.h's kb_mf_q* (shared with the replay backends, which
 * quantize a GEN record's weight where it replays); the format codes are the same. */
_Static_assert(KB_QF_F16 == KB_MF_QF_F16 && KB_QF_BF16 == KB_MF_QF_BF16 &&
               KB_QF_INT8 == KB_MF_QF_INT8 && KB_QF_MXINT8 == KB_MF_QF_MXINT8 &&
               KB_QF_FP8E4M3 == KB_MF_QF_FP8E4M3 && KB_QF_FP8E5M2 == KB_MF_QF_FP8E5M2 &&
               KB_QF_COUNT == KB_MF_QF_COUNT && MX_BLOCK == KB_MF_MX_BLOCK,
               "kb_qfmt codes are kb_mathfn.h's");

/* ---------------------------------------------------------------- host side */

void kb_prune_2_4(float *w, int64_t k, int64_t n)
{
    /* groups outer, columns inner: four rows stream side by side */
    for (int64_t g = 0; g + 4 <= k; g += 4) {
        for (int64_t j = 0; j < n; j++) {
            unsigned keep = kb_mf_q24_keep(w[g * n + j], w[(g + 1) * n + j], w[(g + 2) * n + j],
                                           w[(g + 3) * n + j]);
            for (unsigned p = 0; p < 4; p++)
                if (p != (keep & 3u) && p != keep >> 2)
                    w[(g + p) * n + j] = 0.0f;
        }
    }
}

/* Row blocks of a k x n matrix for kb_par_run: a block per online CPU for matrices of 2^20
 * elements or more (a thread costs ~50 us), else one. */
typedef struct rows_job {
    const kb_fill *f;
    kb_dtype dt;
    int64_t r0, r1, n;
    float *out, *deq, *q;
    int rc;
} rows_job;

static int64_t row_blocks(int64_t k, int64_t n)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t t = (double)k * (double)n < 1048576.0 || cpus < 1 ? 1 : cpus;
    t = t > KB_PAR_MAX ? KB_PAR_MAX : t;
    return t > k ? (k > 0 ? k : 1) : t;
}

/* fn over proto's k rows in row_blocks' blocks; the first block's error, or 0. */
static int run_rows(void *(*fn)(void *), const rows_job *proto, int64_t k)
{
    rows_job jobs[KB_PAR_MAX];
    int64_t nb = row_blocks(k, proto->n);
    for (int64_t b = 0; b < nb; b++) {
        jobs[b] = *proto;
        jobs[b].r0 = k * b / nb;
        jobs[b].r1 = k * (b + 1) / nb;
    }
    kb_par_run(fn, jobs, sizeof jobs[0], (size_t)nb);
    for (int64_t b = 0; b < nb; b++)
        if (jobs[b].rc)
            return jobs[b].rc;
    return 0;
}

static void *fill_rows(void *p)
{
    const rows_job *j = p;
    const kb_fill *f = j->f;
    int64_t n = j->n, ld = f->ld ? f->ld : n;
    if (j->r1 <= j->r0)
        return NULL;
    if (f->fn) {
        f->fn(f->ud, f->row0 + j->r0, f->col0, j->r1 - j->r0, n, j->out + j->r0 * n);
        return NULL;
    }
    for (int64_t r = j->r0; r < j->r1; r++)
        memcpy(j->out + r * n, f->data + (f->row0 + r) * ld + f->col0, (size_t)n * sizeof *j->out);
    return NULL;
}

/* The fill's values of the k x n block at its origin into out (row-major), row blocks on
 * every online CPU (kb_qweight_create's fills are pure functions of the position). */
static void eval_fill(const kb_fill *f, int64_t k, int64_t n, float *out)
{
    (void)run_rows(fill_rows, &(rows_job){ .f = f, .n = n, .out = out }, k);
}

/* f16 / bf16 rows: each element becomes the value stored in dt (the element value and its
 * dequantized value alike). */
static void *round_rows(void *p)
{
    rows_job *j = p;
    int64_t n = j->n;
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!h) {
        j->rc = KB_ERR_NOMEM;
        return NULL;
    }
    for (int64_t i = j->r0; i < j->r1; i++) {
        float *row = j->out + i * n;
        kb_dtype_store_n(j->dt, h, 0, row, (size_t)n);
        kb_dtype_load_n(j->dt, h, 0, row, (size_t)n);
        if (j->deq)
            memcpy(j->deq + i * n, row, (size_t)n * sizeof *row);
        if (j->q)
            memcpy(j->q + i * n, row, (size_t)n * sizeof *row);
    }
    free(h);
    return NULL;
}

/* Rows [i0, i1) of w into their element values with the per-column divisors d and scales
 * sc (s: the scale the element is dequantized with, e the MXINT8 element scale or 1), deq and
 * q as quantize_weight says. Row-major, as w lies in memory. */
static void quantize_rows(kb_qfmt fmt, int sparse, int64_t i0, int64_t i1, int64_t n, float *w,
                          float *q, float *deq, const float *d, const float *sc, float e)
{
    for (int64_t i = i0; i < i1; i++) {
        float *row = w + i * n;
        for (int64_t j = 0; j < n; j++) {
            float qv = kb_mf_qelem(fmt, row[j], d[j]);
            if (deq)
                deq[i * n + j] = kb_mf_deq(qv, sc[j], e, 1);
            row[j] = qv; /* the element value, for the sparse packing */
        }
        if (q && !sparse)
            memcpy(q + i * n, row, (size_t)n * sizeof *row);
    }
}

/*
 * Quantizes w (k x n, pruned first when sparse) in place into its element values, and
 * optionally the dense q (k x n), the scales (int8/fp8: n; mxint8: k/32 x n, the f32 values
 * of the e8m0 codes) and deq (the dequantized k x n matrix). NULL outputs are skipped. Every
 * pass runs row by row (a column walk of a 2304 x 9216 weight misses the cache on every
 * element); each column's maximum still takes its rows in ascending order, so the values are
 * those of the column-by-column definition. KB_ERR_NOMEM or 0.
 */
static int quantize_weight(kb_qfmt fmt, int sparse, int64_t k, int64_t n, float *w, float *q,
                           float *scale, float *deq)
{
    kb_dtype dt = kb_qfmt_dtype(fmt);
    float *amax = NULL, *d = NULL, *sc = NULL;

    if (sparse)
        kb_prune_2_4(w, k, n);
    if (!is8(fmt)) { /* f16 / bf16: the element is the value stored in dt, dequantized as is */
        return run_rows(round_rows, &(rows_job){ .dt = dt, .n = n, .out = w, .deq = deq,
                                                 .q = sparse ? NULL : q }, k);
    }
    amax = malloc((size_t)n * sizeof *amax);
    d = malloc((size_t)n * sizeof *d);
    sc = malloc((size_t)n * sizeof *sc);
    if (!amax || !d || !sc) {
        free(amax), free(d), free(sc);
        return KB_ERR_NOMEM;
    }
    /* per channel (int8, fp8): one scale per column over all k rows; mxint8: per block of
     * MX_BLOCK rows of a column */
    int64_t blk = fmt == KB_QF_MXINT8 ? MX_BLOCK : k;
    for (int64_t b = 0; b < k; b += blk) {
        int64_t b1 = b + blk < k ? b + blk : k;
        for (int64_t i = b; i < b1; i++)
            for (int64_t j = 0; j < n; j++) {
                float a = kb_mf_math1(KB_MF_M1_ABS, w[i * n + j], 0.0f, 0.0f);
                amax[j] = i == b ? a : kb_mf_fmax(amax[j], a);
            }
        for (int64_t j = 0; j < n; j++) {
            if (fmt == KB_QF_MXINT8) {
                sc[j] = kb_mf_qmx_scale(amax[j]);
                d[j] = kb_mf_qmx_div(sc[j]);
                if (scale)
                    scale[(b / MX_BLOCK) * n + j] = sc[j];
            } else {
                sc[j] = d[j] = kb_mf_qchan_scale(fmt, amax[j]);
                if (scale)
                    scale[j] = sc[j];
            }
        }
        quantize_rows(fmt, sparse, b, b1, n, w, q, deq, d, sc,
                      fmt == KB_QF_MXINT8 ? MX_ELEM_SCALE : 1.0f);
    }
    free(amax), free(d), free(sc);
    return 0;
}

/* Positions kept by kb_prune_2_4 for group g of column j of the original w. */
static void kept_of(const float *w, int64_t n, int64_t g, int64_t j, int *i0, int *i1)
{
    unsigned keep = kb_mf_q24_keep(w[(4 * g) * n + j], w[(4 * g + 1) * n + j],
                                   w[(4 * g + 2) * n + j], w[(4 * g + 3) * n + j]);
    *i0 = (int)(keep & 3u);
    *i1 = (int)(keep >> 2);
}

/*
 * Everything of a weight from its source fill: the part tensors' values (q: rows x n element
 * values, rows = k or k/2; scale; meta: ceil(k/8) x n byte values as signed i8) and the
 * dequantized k x n matrix deq; NULL when not wanted. The 2:4 positions come from the source
 * values (a kept value may quantize to 0).
 */
static int build_weight(kb_qfmt fmt, int sparse, int64_t k, int64_t n, const kb_fill *src,
                        float *q, float *scale, float *meta, float *deq)
{
    size_t kn = (size_t)k * (size_t)n;
    float *w = malloc(kn * sizeof *w), *orig = NULL;

    if (!w)
        return KB_ERR_NOMEM;
    eval_fill(src, k, n, w);
    if (sparse) {
        orig = malloc(kn * sizeof *orig);
        if (!orig) {
            free(w);
            return KB_ERR_NOMEM;
        }
        memcpy(orig, w, kn * sizeof *w);
    }
    if (quantize_weight(fmt, sparse, k, n, w, sparse ? NULL : q, scale, deq) != 0) {
        free(w);
        free(orig);
        return KB_ERR_NOMEM;
    }
    if (sparse) {
        if (meta)
            for (size_t i = 0; i < (size_t)((k + 7) / 8) * (size_t)n; i++)
                meta[i] = 0.0f;
        for (int64_t g = 0; g < k / 4; g++) { /* row-major, as in quantize_weight */
            for (int64_t j = 0; j < n; j++) {
                int i0, i1;
                kept_of(orig, n, g, j, &i0, &i1);
                if (q) {
                    q[(2 * g) * n + j] = w[(4 * g + i0) * n + j];
                    q[(2 * g + 1) * n + j] = w[(4 * g + i1) * n + j];
                }
                if (meta) {
                    float *m = &meta[(g / 2) * n + j];
                    unsigned byte = (unsigned)(int)*m & 0xFFu;
                    byte |= (unsigned)(i0 | i1 << 2) << (4 * (g & 1));
                    *m = (float)(byte >= 128u ? (int)byte - 256 : (int)byte); /* as i8 */
                }
            }
        }
    }
    free(w);
    free(orig);
    return 0;
}

static int check_sizes(kb_qfmt fmt, int sparse, int64_t k, int64_t n, kb_errbuf *eb)
{
    if ((unsigned)fmt >= KB_QF_COUNT)
        return kb_err_set(eb, KB_ERR_INVAL, "number format %d out of range", (int)fmt);
    if (k <= 0 || n <= 0 || k > UINT32_MAX || n > UINT32_MAX)
        return kb_err_set(eb, KB_ERR_INVAL, "weight of %lld x %lld", (long long)k, (long long)n);
    if (fmt == KB_QF_MXINT8 && k % MX_BLOCK != 0)
        return kb_err_set(eb, KB_ERR_INVAL, "mxint8 needs K a multiple of 32 (K = %lld)",
                          (long long)k);
    if (sparse && k % 4 != 0)
        return kb_err_set(eb, KB_ERR_INVAL, "2:4 sparsity needs K a multiple of 4 (K = %lld)",
                          (long long)k);
    return 0;
}

int kb_qweight_host_values(kb_qfmt fmt, int sparse, int64_t k, int64_t n, const kb_fill *w,
                           float *out)
{
    if (!w || !out || check_sizes(fmt, sparse, k, n, NULL) != 0)
        return KB_ERR_INVAL;
    return build_weight(fmt, sparse, k, n, w, NULL, NULL, NULL, out);
}

int kb_qact_host_values(kb_qfmt fmt, int64_t m, int64_t k, const float *x, float *out)
{
    if (!x || !out || m <= 0 || k <= 0 || (unsigned)fmt >= KB_QF_COUNT ||
        (fmt == KB_QF_MXINT8 && k % MX_BLOCK != 0))
        return KB_ERR_INVAL;
    for (int64_t i = 0; i < m; i++) {
        const float *xr = x + i * k;
        float *yr = out + i * k;
        if (!is8(fmt)) {
            memcpy(yr, xr, (size_t)k * sizeof *yr);
            continue;
        }
        float s = 1.0f;
        if (fmt != KB_QF_MXINT8) {
            float amax = 0.0f;
            for (int64_t c = 0; c < k; c++) {
                float a = kb_mf_math1(KB_MF_M1_ABS, xr[c], 0.0f, 0.0f);
                amax = c == 0 ? a : kb_mf_fmax(amax, a);
            }
            s = kb_mf_qchan_scale(fmt, amax);
            for (int64_t c = 0; c < k; c++)
                yr[c] = kb_mf_deq(kb_mf_qelem(fmt, xr[c], s), s, 1.0f, 1);
            continue;
        }
        for (int64_t b = 0; b < k; b += MX_BLOCK) {
            float amax = 0.0f, sv, d;
            for (int64_t c = b; c < b + MX_BLOCK; c++) {
                float a = kb_mf_math1(KB_MF_M1_ABS, xr[c], 0.0f, 0.0f);
                amax = c == b ? a : kb_mf_fmax(amax, a);
            }
            sv = kb_mf_qmx_scale(amax);
            d = kb_mf_qmx_div(sv);
            for (int64_t c = b; c < b + MX_BLOCK; c++)
                yr[c] = kb_mf_deq(kb_mf_qelem(fmt, xr[c], d), sv, MX_ELEM_SCALE, 1);
        }
    }
    return 0;
}

/* A fill never consulted (timing-only contexts do not evaluate fills). */
static void fill_unused(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols,
                        float *out)
{
    (void)ud;
    (void)row;
    (void)col;
    memset(out, 0, (size_t)(rows * cols) * sizeof *out);
}

/* The K range [*k0, *k0 + *kr) shard s of a part tensor covers (rows_per: K rows per row). */
static void shard_k(const kb_shard_spec *s, int64_t num, int64_t den, uint64_t *k0, uint64_t *kr)
{
    *k0 = s->row0 * (uint64_t)num / (uint64_t)den;
    *kr = s->rows * (uint64_t)num / (uint64_t)den;
}

/* Shards of the parts must pair up: same columns, same K ranges (per-channel scales are
 * replicated over row splits). */
static int check_shards(const kb_qweight *w, kb_errbuf *eb)
{
    size_t ns = kb_tensor_nshards(w->q);
    int mx = w->fmt == KB_QF_MXINT8;

    if ((w->scale && kb_tensor_nshards(w->scale) != ns) ||
        (w->meta && kb_tensor_nshards(w->meta) != ns))
        return kb_err_set(eb, KB_ERR_INVAL, "quantized weight: its parts split into different "
                          "numbers of shards");
    for (size_t i = 0; i < ns; i++) {
        const kb_shard_spec *q = kb_tensor_shard(w->q, i);
        uint64_t k0, kr, a0, ar;
        shard_k(q, w->sparse ? 2 : 1, 1, &k0, &kr);
        if (w->meta) {
            const kb_shard_spec *m = kb_tensor_shard(w->meta, i);
            if (m->col0 != q->col0 || m->cols != q->cols || m->row0 * 8 != k0 ||
                m->rows != (kr + 7) / 8)
                return kb_err_set(eb, KB_ERR_INVAL, "quantized weight: shard %zu's K rows "
                                  "[%llu, +%llu) do not start on a metadata byte (8 rows); "
                                  "split K in multiples of 8 per part", i,
                                  (unsigned long long)k0, (unsigned long long)kr);
        }
        if (w->scale) {
            const kb_shard_spec *s = kb_tensor_shard(w->scale, i);
            if (s->col0 != q->col0 || s->cols != q->cols)
                return kb_err_set(eb, KB_ERR_INVAL, "quantized weight: scale shard %zu covers "
                                  "other columns than its elements", i);
            shard_k(s, MX_BLOCK, 1, &a0, &ar);
            if (mx && (a0 != k0 || ar != kr))
                return kb_err_set(eb, KB_ERR_INVAL, "quantized weight: shard %zu's K rows "
                                  "[%llu, +%llu) are not whole MXINT8 blocks of 32; split K "
                                  "in multiples of 32 per part", i, (unsigned long long)k0,
                                  (unsigned long long)kr);
        }
    }
    return 0;
}

void kb_qweight_free(kb_qweight *w)
{
    if (!w)
        return;
    if (w->q)
        kb_tensor_free(w->q);
    if (w->scale)
        kb_tensor_free(w->scale);
    if (w->meta)
        kb_tensor_free(w->meta);
    w->q = w->scale = w->meta = NULL;
}

/* A source repeating a rows x cols row-major array in both dimensions (kb_fill_fn). */
typedef struct rep_src {
    const float *b;
    int64_t rows, cols;
} rep_src;

static void rep_fill(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols, float *out)
{
    const rep_src *s = ud;
    for (int64_t r = 0; r < rows; r++) {
        const float *br = s->b + ((row + r) % s->rows) * s->cols;
        for (int64_t c = 0; c < cols;) {
            int64_t bc = (col + c) % s->cols, n = s->cols - bc < cols - c ? s->cols - bc : cols - c;
            memcpy(out + r * cols + c, br + bc, (size_t)n * sizeof *out);
            c += n;
        }
    }
}

/* A part of the weight (rows x n of its tensor) from base, the part of one of its rk x rn
 * copies (rows/rr x n/rn; rr: rk for parts with rows per K block, 1 for a per-channel scale
 * row); base NULL (timing only) writes nothing. The tensor's shards that hold the same block
 * of the copies share one payload block (kb_tensor_from_fill_periodic). With qg (a generated
 * weight) the part is generated and quantized where it replays instead. */
static int write_part(kb_ctx *ctx, const kb_tensor_desc *d, const float *base, int64_t rr,
                      int64_t rn, const kb_qgen_src *qg, unsigned part, kb_tensor **out)
{
    kb_fill none = { fill_unused, NULL, NULL, 0, 0, 0, NULL };
    rep_src src = { base, d->rows / rr, d->cols / rn };
    kb_fill f = base ? kb_fill_array(base, d->cols) : none;

    assert(src.rows * rr == d->rows && src.cols * rn == d->cols); /* whole copies */
    if (qg) {
        kb_qgen_src g = *qg;
        g.part = part;
        return kb_tensor_from_qgen(ctx, d, &g, out);
    }
    if (base && (rr > 1 || rn > 1)) {
        f.fn = rep_fill;
        f.ud = &src;
        f.data = NULL;
    }
    return kb_tensor_from_fill_periodic(ctx, d, &f, rr > 1 ? src.rows : 0,
                                        rn > 1 ? src.cols : 0, out);
}

/* The weight's tensors from the host arrays of one of its rk x rn copies (q, sc, meta: NULL
 * when the context does not record; kb_qweight_create's layouts). On error nothing is left
 * allocated. */
static int qweight_write(kb_ctx *ctx, const char *name, int64_t k, int64_t n, kb_qfmt fmt,
                         int sparse, kb_dp_policy dp, const float *q, const float *sc,
                         const float *meta, int64_t rk, int64_t rn, const kb_qgen_src *qg,
                         kb_qweight *out)
{
    kb_errbuf *eb = kb_ctx_err(ctx);
    kb_qweight qw;
    int64_t qrows = sparse ? k / 2 : k, srows = fmt == KB_QF_MXINT8 ? k / MX_BLOCK : 1;
    int64_t mrows = (k + 7) / 8;
    char nm[3][160];
    int rc;

    memset(&qw, 0, sizeof qw);
    /* the host arrays come all or none (only a recording context builds them) */
    assert((q == NULL) == (sc == NULL) && (q == NULL) == (meta == NULL));
    qw.fmt = fmt;
    qw.sparse = sparse;
    qw.k = k;
    qw.n = n;
    snprintf(nm[0], sizeof nm[0], "%s.q", name ? name : "qweight");
    snprintf(nm[1], sizeof nm[1], "%s.scale", name ? name : "qweight");
    snprintf(nm[2], sizeof nm[2], "%s.meta", name ? name : "qweight");
    kb_tensor_desc d = { nm[0], qrows, n, kb_qfmt_dtype(fmt), dp, KB_MEM_HBM };
    if ((rc = write_part(ctx, &d, q, rk, rn, qg, KB_SEEDGEN_QW_Q, &qw.q)) != 0)
        goto fail;
    if (has_scale(fmt)) {
        kb_tensor_desc ds = { nm[1], srows, n, fmt == KB_QF_MXINT8 ? KB_E8M0 : KB_F32, dp,
                              KB_MEM_HBM };
        /* a per-channel scale row goes whole to every PE of a row (K) split */
        if (fmt != KB_QF_MXINT8) {
            if (ds.dp.cube == KB_DP_ROW_WISE)
                ds.dp.cube = KB_DP_REPLICATE;
            if (ds.dp.pe == KB_DP_ROW_WISE)
                ds.dp.pe = KB_DP_REPLICATE;
        }
        if ((rc = write_part(ctx, &ds, sc, fmt == KB_QF_MXINT8 ? rk : 1, rn, qg,
                              KB_SEEDGEN_QW_SCALE, &qw.scale)) != 0)
            goto fail;
    }
    if (sparse) {
        kb_tensor_desc dm = { nm[2], mrows, n, KB_I8, dp, KB_MEM_HBM };
        if ((rc = write_part(ctx, &dm, meta, rk, rn, qg, KB_SEEDGEN_QW_META, &qw.meta)) != 0)
            goto fail;
    }
    if ((rc = check_shards(&qw, eb)) != 0)
        goto fail;
    *out = qw;
    return 0;
fail:
    kb_qweight_free(&qw);
    return rc;
}

/*
 * The host arrays of a k x n weight made of rk x rn copies of the k/rk x n/rn weight w,
 * quantized (kb_qweight_create's layouts), for one copy: the written weight repeats them.
 * Quantization works per column and per MX block (32 rows) or 2:4 group (4 rows, meta bytes
 * of 8) of a column, and a per-channel scale is the column's maximum over all rows, the same
 * over repeated rows; so with k/rk a multiple of those blocks the repeated arrays are the ones
 * the repeated weight itself gives. 0, KB_ERR_NOMEM or the build's code.
 */
static int build_base(kb_qfmt fmt, int sparse, int64_t k, int64_t n, const kb_fill *w,
                      int64_t rk, int64_t rn, float **q, float **sc, float **meta)
{
    int64_t kb = k / rk, nb = n / rn, qrows = sparse ? kb / 2 : kb;
    int64_t srows = fmt == KB_QF_MXINT8 ? kb / MX_BLOCK : 1, mrows = (kb + 7) / 8;
    /* whole copies of whole blocks (kb_qweight_create_rep's checks) */
    assert(kb * rk == k && nb * rn == n && (rk == 1 || !sparse || mrows * 8 == kb));
    *q = malloc((size_t)qrows * (size_t)nb * sizeof **q);
    *sc = malloc((size_t)srows * (size_t)nb * sizeof **sc);
    *meta = malloc((size_t)mrows * (size_t)nb * sizeof **meta);
    if (!*q || !*sc || !*meta)
        return KB_ERR_NOMEM;
    return build_weight(fmt, sparse, kb, nb, w, *q, *sc, *meta, NULL);
}

int kb_fill_seedgen_col(const kb_fill *f, int64_t col, kb_seedgen_col *c)
{
    const kb_fill_gen *g = f ? f->gen : NULL;
    uint64_t ld, sc, r0;
    if (!g || g->kind != KB_FILL_GEN_PATTERN || g->add != 0.0f)
        return 0;
    ld = (uint64_t)g->ld;
    sc = (uint64_t)(f->col0 + col);
    r0 = (uint64_t)f->row0;
    /* p = (row0 + r) * ld + col0 + col, or (col0 + col) * ld + row0 + r transposed */
    *c = (kb_seedgen_col){ .off = g->transpose ? sc * ld + r0 : r0 * ld + sc,
                           .rmul = g->transpose ? 1u : ld, .seed = g->seed, .range = g->range,
                           .inv = 1.0f / g->den };
    return kb_seedgen_col_ok(c);
}

/* The maps of a k x n copy into the op log's payload (qg's offsets); KB_ERR_INVAL for a
 * column entry that breaks kb_seedgen.h's rules, KB_ERR_NOMEM. */
static int put_maps(kb_ctx *ctx, const char *name, const kb_qw_map *map, int64_t k, int64_t n,
                    kb_qgen_src *qg)
{
    kb_oplog *log = kb_ctx_oplog(ctx);
    uint8_t *at;
    for (int64_t j = 0; j < n; j++)
        if (!kb_seedgen_col_ok(&map->cols[j]))
            return kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL, "'%s': column %lld of its generated "
                              "source has range %u and scale %g (at most 2^24, a power of two "
                              ">= 2^-100)", name ? name : "?", (long long)j, map->cols[j].range,
                              (double)map->cols[j].inv);
    qg->k = (uint64_t)k;
    qg->nb = (uint64_t)n;
    if (kb_oplog_reserve_payload(log, (size_t)k * 8u, &qg->rows_off, &at) != 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "'%s': its row map", name ? name : "?");
    memcpy(at, map->rows, (size_t)k * 8u);
    if (kb_oplog_reserve_payload(log, (size_t)n * KB_SEEDGEN_COL_BYTES, &qg->cols_off, &at) != 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "'%s': its column map",
                          name ? name : "?");
    for (int64_t j = 0; j < n; j++)
        memcpy(at + j * KB_SEEDGEN_COL_BYTES, &map->cols[j], KB_SEEDGEN_COL_BYTES);
    return 0;
}

/* w's own map when it is a plain pattern (rows as they are, its columns): *rows and *cols
 * allocated (the caller frees them), or both NULL when w is none. KB_ERR_NOMEM. */
static int fill_map(const kb_fill *w, int64_t k, int64_t n, uint64_t **rows, kb_seedgen_col **cols)
{
    kb_seedgen_col c0;
    *rows = NULL;
    *cols = NULL;
    if (!kb_fill_seedgen_col(w, 0, &c0))
        return 0;
    *rows = malloc((size_t)k * sizeof **rows);
    *cols = malloc((size_t)n * sizeof **cols);
    if (!*rows || !*cols)
        return KB_ERR_NOMEM;
    for (int64_t i = 0; i < k; i++)
        (*rows)[i] = (uint64_t)i;
    for (int64_t j = 0; j < n; j++)
        if (!kb_fill_seedgen_col(w, j, &(*cols)[j])) { /* not a pattern after all */
            free(*rows), free(*cols);
            *rows = NULL;
            *cols = NULL;
            return 0;
        }
    return 0;
}

int kb_qweight_create_rep(kb_ctx *ctx, const char *name, int64_t k, int64_t n, kb_qfmt fmt,
                          int sparse, kb_dp_policy dp, const kb_fill *w, int64_t rk, int64_t rn,
                          const kb_qw_map *map, kb_qweight *out)
{
    kb_errbuf *eb = kb_ctx_err(ctx);
    float *q = NULL, *sc = NULL, *meta = NULL;
    uint64_t *own_rows = NULL;
    kb_seedgen_col *own_cols = NULL;
    kb_qgen_src qg = { .fmt = (unsigned)fmt, .sparse = sparse };
    kb_qw_map own = { NULL, NULL }; /* w's own map (outlives the block that makes it) */
    int rc;

    if (!out || !w)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_qweight_create: NULL argument");
    if ((rc = check_sizes(fmt, sparse, k, n, eb)) != 0)
        return rc;
    if (rk < 1 || rn < 1 || k % rk || n % rn ||
        (rk > 1 && ((k / rk) % (fmt == KB_QF_MXINT8 ? MX_BLOCK : 1) || (sparse && (k / rk) % 8))))
        return kb_err_set(eb, KB_ERR_INVAL, "kb_qweight_create: '%s': %lld x %lld copies of a "
                          "%lld x %lld weight do not keep its blocks whole", name ? name : "?",
                          (long long)rk, (long long)rn, (long long)k, (long long)n);
    if (dp.mode != KB_DP_BLOCK)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_qweight_create: '%s': tiled dp is not "
                          "supported for quantized weights", name ? name : "?");
    if (!kb_ctx_recording(ctx)) { /* the values are only consulted when recording */
        rc = qweight_write(ctx, name, k, n, fmt, sparse, dp, NULL, NULL, NULL, rk, rn, NULL, out);
        goto out;
    }
    /* generated where it replays when the source is a pattern (given or w's own map) */
    if (!map) {
        if ((rc = fill_map(w, k / rk, n / rn, &own_rows, &own_cols)) != 0) {
            rc = kb_err_set(eb, rc, "kb_qweight_create: '%s': its map", name ? name : "?");
            goto out;
        }
        own.rows = own_rows;
        own.cols = own_cols;
        if (own_rows)
            map = &own;
    }
    if (map) {
        if ((rc = put_maps(ctx, name, map, k / rk, n / rn, &qg)) == 0)
            rc = qweight_write(ctx, name, k, n, fmt, sparse, dp, NULL, NULL, NULL, rk, rn, &qg,
                               out);
        goto out;
    }
    if ((rc = build_base(fmt, sparse, k, n, w, rk, rn, &q, &sc, &meta)) != 0) {
        rc = kb_err_set(eb, rc, "kb_qweight_create: host buffers");
        goto out;
    }
    rc = qweight_write(ctx, name, k, n, fmt, sparse, dp, q, sc, meta, rk, rn, NULL, out);
out:
    free(q);
    free(sc);
    free(meta);
    free(own_rows);
    free(own_cols);
    return rc;
}

int kb_qweight_create(kb_ctx *ctx, const char *name, int64_t k, int64_t n, kb_qfmt fmt,
                      int sparse, kb_dp_policy dp, const kb_fill *w, kb_qweight *out)
{
    return kb_qweight_create_rep(ctx, name, k, n, fmt, sparse, dp, w, 1, 1, NULL, out);
}

int kb_tensor_from_map(kb_ctx *ctx, const kb_tensor_desc *d, const kb_qw_map *map,
                       kb_tensor **out)
{
    kb_qgen_src qg = { .fmt = d->dtype == KB_BF16 ? KB_QF_BF16 : KB_QF_F16,
                       .part = KB_SEEDGEN_QW_Q, .k = (uint64_t)d->rows, .nb = (uint64_t)d->cols };
    int rc;
    if (d->dtype != KB_F16 && d->dtype != KB_BF16)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL, "tensor '%s': a generated tensor is f16 "
                          "or bf16", d->name ? d->name : "?");
    if (kb_ctx_recording(ctx) && (rc = put_maps(ctx, d->name, map, d->rows, d->cols, &qg)) != 0)
        return rc;
    return kb_tensor_from_qgen(ctx, d, &qg, out);
}

/* ---------------------------------------------------------------- gemm-unit time */

static double fmt_speedup(const kb_topo_cfg *c, kb_qfmt fmt, int sparse)
{
    double s = fmt == KB_QF_INT8 ? c->gemm_int8_speedup
             : fmt == KB_QF_MXINT8 ? c->gemm_mxint8_speedup
             : (fmt == KB_QF_FP8E4M3 || fmt == KB_QF_FP8E5M2) ? c->gemm_fp8_speedup : 1.0;
    return sparse ? s * c->gemm_sparse_speedup : s;
}

/* The format's PE_GEMM rate in "bytes" (flops) per microsecond, rounded as kb_res_init does. */
static uint64_t fmt_bpu(const kb_topo_cfg *c, kb_qfmt fmt, int sparse)
{
    double bpu = c->gemm_flops_per_ns * fmt_speedup(c, fmt, sparse) * 1000.0;
    return bpu < 1.0 ? 1u : bpu >= 9.0e18 ? UINT64_C(9000000000000000000) : (uint64_t)llround(bpu);
}

static kb_time occ_ps(const kb_topo_cfg *c, kb_qfmt fmt, int sparse, uint64_t flops)
{
    return kb_time_from_ns(c->gemm_fixed_ns) + kb_bw_time(fmt_bpu(c, fmt, sparse), flops);
}

double kb_qgemm_ns(const kb_topo_cfg *c, kb_qfmt fmt, int sparse, uint64_t m, uint64_t n, uint64_t k)
{
    return kb_time_to_ns(occ_ps(c, fmt, sparse, 2ull * m * n * k));
}

uint64_t kb_qgemm_flops_per_us(const kb_topo_cfg *c, kb_qfmt fmt, int sparse)
{
    return fmt_bpu(c, fmt, sparse);
}

uint64_t kb_qweight_bytes(kb_qfmt fmt, int sparse, int64_t k, int64_t n)
{
    uint64_t K = (uint64_t)k, N = (uint64_t)n;
    uint64_t b = (sparse ? K / 2 : K) * N * kb_dtype_size(kb_qfmt_dtype(fmt));
    if (fmt == KB_QF_MXINT8)
        b += K / MX_BLOCK * N;
    else if (has_scale(fmt))
        b += 4 * N;
    if (sparse)
        b += (K + 7) / 8 * N;
    return b;
}

/* One FIFO use of PE_GEMM from t for occ (kb_res_hop's accounting, at our own rate). */
static kb_time gemm_reserve(kb_res *r, kb_time t, kb_time occ, uint64_t flops)
{
    kb_time start = t > r->free_at ? t : r->free_at;
    r->free_at = start + occ;
    r->bytes += flops;
    r->busy += occ;
    return r->free_at + r->latency;
}

static int pa_local(kb_tl *tl, kb_pa pa)
{
    const kb_pe_hw *pe = tl_pe(tl);
    return kb_pa_in_pe_window(pa, kb_pa_pe_window(pe->gsip, pe->cube, pe->pe));
}

static kb_time now_issue(kb_tl *tl)
{
    return kb_sim_now(tl_sim(tl)) + kb_tl_issue_cost(tl);
}

static void dma_part(kb_tl *tl, kb_val v, kb_pa resv, uint64_t bytes, kb_time at, kb_time *ready)
{
    kb_time ts, te;
    kb_errbuf e;
    if (bytes == 0 || pa_local(tl, v.pa))
        return;
    if (kb_machine_dma(kb_ctx_machine(tl_ctx(tl)), tl_pe(tl), v.pa, resv, bytes, at, &ts, &te,
                       &e) != 0)
        tl_fail(tl, KB_ERR_RANGE, "tl_dot_q: %s", e.msg);
    if (te > *ready)
        *ready = te;
}

/*
 * tl_dot_q's gemm time from t0: one occupancy when every part of W is in this PE's TCM, else
 * SchedulerV2 steps (tl_dot's stages, kb_tl_stages) whose DMAs move the parts' bytes of each
 * tile. Returns the end; *t_first receives the first step's start.
 */
static kb_time qgemm_time(kb_tl *tl, const kb_qref *w, uint32_t M, kb_time t0)
{
    const kb_topo_cfg *c = &kb_ctx_machine(tl_ctx(tl))->cfg;
    kb_pe_hw *pe = tl_pe(tl);
    kb_qfmt fmt = (kb_qfmt)w->fmt;
    uint32_t N = w->n, K = w->k;
    int scaled = has_scale(fmt), mx = fmt == KB_QF_MXINT8;
    int local = pa_local(tl, w->q.pa) && (!scaled || pa_local(tl, w->scale.pa)) &&
                (!w->sparse || pa_local(tl, w->meta.pa));
    size_t es = kb_dtype_size(kb_qfmt_dtype(fmt));

    if (local)
        return gemm_reserve(&pe->gemm, t0, occ_ps(c, fmt, w->sparse, 2ull * M * N * K),
                            2ull * M * N * K);

    kb_pa resv = kb_pa_pe_tcm(pe->gsip, pe->cube, pe->pe,
                              c->tcm_size_bytes - c->tcm_scheduler_reserved_bytes);
    uint32_t tm = (uint32_t)c->sched_tile_m, tn = (uint32_t)c->sched_tile_n,
             tk = (uint32_t)c->sched_tile_k;
    kb_time done[KB_TL_MAX_STAGES], end = t0;
    unsigned nst = (unsigned)kb_tl_stages(tl);
    uint64_t step = 0;

    for (unsigned i = 0; i < nst; i++)
        done[i] = t0;
    for (uint32_t m0 = 0; m0 < M; m0 += tm) {
        uint32_t mt = M - m0 < tm ? M - m0 : tm;
        for (uint32_t n0 = 0; n0 < N; n0 += tn) {
            uint32_t nt = N - n0 < tn ? N - n0 : tn;
            for (uint32_t k0 = 0; k0 < K; k0 += tk, step++) {
                uint32_t kt = K - k0 < tk ? K - k0 : tk, k1 = k0 + kt;
                kb_time at = done[step % nst] > t0 ? done[step % nst] : t0, ready = at;
                /* rows of each part in [k0, k1): differences of cumulative counts, so the
                 * steps of a tile add up to the parts' exact sizes */
                uint64_t qrows = w->sparse ? k1 / 2 - k0 / 2 : kt;
                uint64_t srows = mx ? k1 / MX_BLOCK - k0 / MX_BLOCK : (scaled && k0 == 0);
                uint64_t mrows = w->sparse ? (k1 + 7) / 8 - (k0 + 7) / 8 : 0;
                dma_part(tl, w->q, resv, qrows * nt * es, at, &ready);
                if (scaled)
                    dma_part(tl, w->scale, resv, srows * nt * (mx ? 1u : 4u), at, &ready);
                if (w->sparse)
                    dma_part(tl, w->meta, resv, mrows * nt, at, &ready);
                end = gemm_reserve(&pe->gemm, ready,
                                   occ_ps(c, fmt, w->sparse, 2ull * mt * nt * kt),
                                   2ull * mt * nt * kt);
                done[step % nst] = end;
            }
        }
    }
    assert(end >= t0);
    return end;
}

/* ---------------------------------------------------------------- kernel side */

static kb_opnd opnd_of(kb_val v) { return kb_tl_opnd(v); }

/* A PE_MATH op over n elements with an explicit destination (any dtype): the record of an
 * elementwise kind whose store rounds into dst's dtype. */
static void math_into(kb_tl *tl, kb_rec_kind kind, int op, kb_val dst, const kb_val *src,
                      int nsrc, float imm0, float imm1)
{
    kb_time t0 = now_issue(tl);
    kb_time t1 = kb_res_hop(&tl_pe(tl)->math, t0, (uint64_t)dst.rows * dst.cols);
    if (kb_ctx_records(tl_ctx(tl))) {
        kb_rec r;
        kb_tl_rec_fill(&r, kind, op, dst, src, nsrc, imm0, imm1, t0, t1);
        kb_tl_record(tl, &r);
    }
    kb_tl_wait_until(tl, t1);
}

/* A DEQUANT record (no time of its own: part of the gemm interval [t0, t1]). */
static void dequant_rec(kb_tl *tl, kb_val dst, kb_val x, const kb_val *meta, const kb_val *scale,
                        float imm, kb_time t0, kb_time t1)
{
    kb_rec r;
    if (!kb_ctx_records(tl_ctx(tl)))
        return;
    memset(&r, 0, sizeof r);
    r.t_start = t0;
    r.t_end = t1;
    r.kind = KB_REC_DEQUANT;
    r.imm[0] = imm;
    r.dst = opnd_of(dst);
    r.src[r.nsrc++] = opnd_of(x);
    if (meta) {
        r.flags |= KB_REC_QSPARSE;
        r.src[r.nsrc++] = opnd_of(*meta);
    }
    if (scale) {
        r.flags |= KB_REC_QSCALE;
        r.src[r.nsrc++] = opnd_of(*scale);
    }
    kb_tl_record(tl, &r);
}

/* v (contiguous) seen as rows x cols over the same elements. */
static kb_val reshape(kb_val v, uint32_t rows, uint32_t cols)
{
    assert(kb_val_contiguous(v) && (uint64_t)rows * cols == (uint64_t)v.rows * v.cols);
    v.rows = rows;
    v.cols = cols;
    v.ld = 0;
    v.scratch = 0;
    return v;
}

kb_qref tl_qref(kb_tl *tl, kb_va q, kb_va scale, kb_va meta, uint32_t k, uint32_t n,
                kb_qfmt fmt, int sparse)
{
    kb_qref r;
    kb_errbuf eb;

    memset(&r, 0, sizeof r);
    if (check_sizes(fmt, sparse, k, n, &eb) != 0)
        tl_fail(tl, KB_ERR_INVAL, "tl_qref: %s", eb.msg);
    r.fmt = (uint8_t)fmt;
    r.sparse = (uint8_t)!!sparse;
    r.k = k;
    r.n = n;
    r.q = tl_ref(tl, q, KB_SHAPE2(sparse ? k / 2 : k, n), kb_qfmt_dtype(fmt));
    if (fmt == KB_QF_MXINT8)
        r.scale = tl_ref(tl, scale, KB_SHAPE2(k / MX_BLOCK, n), KB_E8M0);
    else if (has_scale(fmt))
        r.scale = tl_ref(tl, scale, KB_SHAPE2(1, n), KB_F32);
    if (sparse)
        r.meta = tl_ref(tl, meta, KB_SHAPE2((k + 7) / 8, n), KB_I8);
    return r;
}

/*
 * x quantized the tl_dot_q way and dequantized to f32 for the gemm (m x k contiguous). The
 * DEQUANT record is stamped [t, t] at the gemm's issue (the gemm unit's own work).
 */
static kb_val quantize_act(kb_tl *tl, kb_val x, kb_qfmt fmt)
{
    uint32_t m = x.rows, k = x.cols;
    kb_dtype dt = kb_qfmt_dtype(fmt);
    kb_val xd = kb_tl_scratch_val(tl, m, k, KB_F32, "tl_dot_q");

    if (fmt != KB_QF_MXINT8) {
        kb_val a = tl_abs(tl, x), amax = tl_max(tl, a, 1), c, s, src[2];
        tl_free(tl, a);
        c = tl_clamp(tl, amax, FLT_MIN, FLT_MAX);
        tl_free(tl, amax);
        s = tl_scale(tl, c, 1.0f / qmax(fmt), 0.0f);
        tl_free(tl, c);
        kb_val q = kb_tl_scratch_val(tl, m, k, dt, "tl_dot_q");
        src[0] = x;
        src[1] = s;
        math_into(tl, KB_REC_MATH2, KB_M2_DIV, q, src, 2, 0.0f, 0.0f);
        kb_time t = now_issue(tl);
        dequant_rec(tl, xd, q, NULL, &s, 1.0f, t, t);
        tl_free(tl, q);
        tl_free(tl, s);
        return xd;
    }
    {
        uint32_t nb = (uint32_t)((uint64_t)m * k / MX_BLOCK);
        kb_val xc = x, owned = { 0 };
        if (!kb_val_contiguous(x)) { /* the block view needs contiguous rows */
            owned = kb_tl_scratch_val(tl, m, k, KB_F32, "tl_dot_q");
            tl_copy(tl, owned, x);
            xc = owned;
        }
        kb_val xv = reshape(xc, nb, MX_BLOCK), src[2];
        kb_val a = tl_abs(tl, xv), amax = tl_max(tl, a, 1);
        tl_free(tl, a);
        kb_val e = kb_tl_scratch_val(tl, nb, 1, KB_E8M0, "tl_dot_q");
        math_into(tl, KB_REC_COPY, 0, e, &amax, 1, 0.0f, 0.0f);
        tl_free(tl, amax);
        kb_val d = kb_tl_scratch_val(tl, nb, 1, KB_F32, "tl_dot_q");
        math_into(tl, KB_REC_MATH1, KB_M1_AXPB, d, &e, 1, MX_ELEM_SCALE, 0.0f);
        kb_val q = kb_tl_scratch_val(tl, nb, MX_BLOCK, KB_I8, "tl_dot_q");
        src[0] = xv;
        src[1] = d;
        math_into(tl, KB_REC_MATH2, KB_M2_DIV, q, src, 2, 0.0f, 0.0f);
        tl_free(tl, d);
        kb_time t = now_issue(tl);
        kb_val qm = reshape(q, m, k), em = reshape(e, m, k / MX_BLOCK);
        dequant_rec(tl, xd, qm, NULL, &em, MX_ELEM_SCALE, t, t);
        tl_free(tl, q);
        tl_free(tl, e);
        if (owned.scratch)
            tl_free(tl, owned);
        return xd;
    }
}

/* K rows per dequantized weight chunk: a multiple of 32 (MX blocks, metadata bytes) at most
 * the scheduler's tile depth and at most 1 MiB of f32 for n columns, so the f32 copy of W
 * stays small in scratch (at least 32 rows). */
static uint32_t chunk_rows(kb_tl *tl, uint32_t n)
{
    int64_t tk = kb_ctx_machine(tl_ctx(tl))->cfg.sched_tile_k, cap = (INT64_C(1) << 18) / n;
    int64_t r = (tk < cap ? tk : cap) / MX_BLOCK * MX_BLOCK;
    return r < MX_BLOCK ? MX_BLOCK : (uint32_t)r;
}

/* Rows [r0, r0 + rows) of v (a view; rows clipped by the caller). */
static kb_val rows_of(kb_tl *tl, kb_val v, uint32_t r0, uint32_t rows)
{
    return tl_view(tl, v, r0, 0, rows, v.cols);
}

kb_val tl_dot_q(kb_tl *tl, kb_val x, kb_qref w)
{
    kb_qfmt fmt = (kb_qfmt)w.fmt;
    kb_errbuf eb;
    uint32_t m = x.rows, K = w.k, N = w.n;

    if (check_sizes(fmt, w.sparse, w.k, w.n, &eb) != 0)
        tl_fail(tl, KB_ERR_INVAL, "tl_dot_q: %s", eb.msg);
    if (x.cols != K)
        tl_fail(tl, KB_ERR_INVAL, "tl_dot_q: inner dimensions differ (%ux%u @ %ux%u)", x.rows,
                x.cols, K, N);
    if (!pa_local(tl, x.pa))
        tl_fail(tl, KB_ERR_INVAL, "tl_dot_q: the activation is not in this PE's TCM/scratch "
                "(tl_load it first)");
    if (!w.sparse && !is8(fmt))
        return tl_dot(tl, x, w.q);

    kb_val xd = is8(fmt) ? quantize_act(tl, x, fmt) : x;
    kb_val y = kb_tl_scratch_val(tl, m, N, KB_F32, "tl_dot_q");
    kb_time t0 = now_issue(tl), t1 = qgemm_time(tl, &w, m, t0);

    /* the f32 chunk is allocated in timing-only runs too, so both use the same scratch */
    uint32_t ck = chunk_rows(tl, N);
    kb_val wd = kb_tl_scratch_val(tl, K < ck ? K : ck, N, KB_F32, "tl_dot_q");
    if (kb_ctx_records(tl_ctx(tl))) {
        int mx = fmt == KB_QF_MXINT8;
        float imm = mx ? MX_ELEM_SCALE : 1.0f;
        for (uint32_t k0 = 0; k0 < K; k0 += ck) {
            uint32_t kt = K - k0 < ck ? K - k0 : ck;
            /* a chunk is whole MX blocks and metadata bytes (chunk_rows, check_sizes) */
            assert(k0 % MX_BLOCK == 0 && (!mx || kt % MX_BLOCK == 0));
            kb_val dst = rows_of(tl, wd, 0, kt), q, meta, sc;
            q = w.sparse ? rows_of(tl, w.q, k0 / 2, kt / 2) : rows_of(tl, w.q, k0, kt);
            if (w.sparse)
                meta = rows_of(tl, w.meta, k0 / 8, (kt + 7) / 8);
            if (mx)
                sc = rows_of(tl, w.scale, k0 / MX_BLOCK, kt / MX_BLOCK);
            else if (has_scale(fmt))
                sc = w.scale;
            dequant_rec(tl, dst, q, w.sparse ? &meta : NULL, has_scale(fmt) ? &sc : NULL, imm,
                        t0, t1);
            {
                kb_rec r;
                memset(&r, 0, sizeof r);
                r.t_start = t0;
                r.t_end = t1;
                r.kind = KB_REC_GEMM;
                r.flags = (uint8_t)(k0 ? KB_REC_ACC : 0);
                r.nsrc = 2;
                r.dst = opnd_of(y);
                r.src[0] = opnd_of(tl_view(tl, xd, 0, k0, m, kt));
                r.src[1] = opnd_of(dst);
                kb_tl_record(tl, &r);
            }
        }
    }
    tl_free(tl, wd);
    kb_tl_wait_until(tl, t1);
    if (is8(fmt))
        tl_free(tl, xd);
    return y;
}
