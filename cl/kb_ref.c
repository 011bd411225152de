/*
 * kb_ref — the reference Phase-2 backend: plain C loops that execute one op-log record at a
 * time on a host arena. It is the oracle every other backend is compared with, so it favours
 * a fixed, documented evaluation order over speed: all arithmetic in f32, one rounding when a
 * result is stored (kb_dtype_store), reductions and gemm sums in ascending index order
 * starting from 0 (or from dst with KB_REC_ACC), FMA and AXPB with a single rounding. The
 * elementwise, softmax and reduce arithmetic (exp, log, sin, cos, tanh, MAX/MIN ignoring NaN
 * with -0 < +0, NaN propagation) comes from kb_mathfn.h, the same text the OpenCL kernels are
 * built from, so both give identical bits. Gemm converts A to f32 once and B block by block and
 * runs blocks of K over f32 accumulator panels (4 x 16 elements in registers): each output
 * element still sums its products in ascending k, one product rounding and one addition
 * rounding per k; a NaN result is stored as the canonical
 * NaN (which NaN the hardware propagates through a sum differs between CPUs and GPUs). Records must already be validated and
 * have arena-relative MEM operands (the planner does both). Limits: elements are computed and
 * stored one at a time in row-major order, so a record whose dst overlaps a source other than
 * exactly in place (same addr and layout) gives order-dependent results, and gemm with dst
 * aliasing src0/src1 is not supported (gemm ACC reads dst itself, which is fine). Elementwise
 * records whose operands all have the destination's shape and are exactly it or disjoint from
 * it run a row at a time through f32 blocks instead (the same arithmetic per element, so the
 * same bits, ~15x faster on f16/f32 adds); the others keep the element-at-a-time order. The backend
 * computes in the caller's arena between begin and end. Its resident variant
 * (kb_ref_backend_create_resident) keeps a host buffer standing for device memory across
 * flushes, so that kb_resident's placement, merges and dirty-range transfers are tested
 * without a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_mathfn.h"
#include "kb_replay.h"
#include "kb_resident.h"
#include "kb_seedgen.h"

/* kb_mathfn.h's op codes are the op log's. */
_Static_assert(KB_MF_M1_EXP == KB_M1_EXP && KB_MF_M1_LOG == KB_M1_LOG &&
               KB_MF_M1_SQRT == KB_M1_SQRT && KB_MF_M1_ABS == KB_M1_ABS &&
               KB_MF_M1_SIGMOID == KB_M1_SIGMOID && KB_MF_M1_COS == KB_M1_COS &&
               KB_MF_M1_SIN == KB_M1_SIN && KB_MF_M1_NEG == KB_M1_NEG &&
               KB_MF_M1_RECIP == KB_M1_RECIP && KB_MF_M1_RELU == KB_M1_RELU &&
               KB_MF_M1_GELU == KB_M1_GELU && KB_MF_M1_AXPB == KB_M1_AXPB &&
               KB_MF_M1_RSQRT == KB_M1_RSQRT && KB_MF_M1_TANH == KB_M1_TANH &&
               KB_MF_M1_SILU == KB_M1_SILU && KB_MF_M1_SOFTCAP == KB_M1_SOFTCAP &&
               KB_M1_NOPS == 16,
               "math1 op codes");
_Static_assert(KB_MF_M2_ADD == KB_M2_ADD && KB_MF_M2_SUB == KB_M2_SUB &&
               KB_MF_M2_MUL == KB_M2_MUL && KB_MF_M2_DIV == KB_M2_DIV &&
               KB_MF_M2_MAX == KB_M2_MAX && KB_MF_M2_MIN == KB_M2_MIN && KB_M2_NOPS == 6,
               "math2 op codes");

static const uint8_t *opnd_base(const kb_opnd *o, const uint8_t *arena, const uint8_t *payload)
{
    return (o->space == KB_SPACE_PAYLOAD ? payload : arena) + o->addr;
}

/* Element (i, j) of a source broadcast over the destination's shape. */
static float load_bcast(const kb_opnd *o, const uint8_t *base, uint32_t i, uint32_t j)
{
    size_t r = o->rows == 1 ? 0 : i;
    size_t c = o->cols == 1 ? 0 : j;
    return kb_dtype_load((kb_dtype)o->dtype, base, r * o->ld + c);
}

static float load_at(const kb_opnd *o, const uint8_t *base, uint32_t i, uint32_t j)
{
    return kb_dtype_load((kb_dtype)o->dtype, base, (size_t)i * o->ld + j);
}

static void store_at(const kb_opnd *o, uint8_t *base, uint32_t i, uint32_t j, float v)
{
    kb_dtype_store((kb_dtype)o->dtype, base, (size_t)i * o->ld + j, v);
}

/* Bytes an operand spans in its space, from its address. */
static uint64_t opnd_span(const kb_opnd *o)
{
    return o->rows == 0 || o->cols == 0
               ? 0
               : ((uint64_t)(o->rows - 1) * o->ld + o->cols) * kb_dtype_size((kb_dtype)o->dtype);
}

/*
 * Whether an elementwise record may run a row at a time through f32 buffers (the fast path
 * below) with the same result as element by element: every source has the destination's
 * shape (no broadcast) and is either exactly the destination (in place) or disjoint from it;
 * the kinds are the ones the fast path knows.
 */
static int elementwise_rowwise(const kb_rec *r)
{
    const kb_opnd *d = &r->dst;
    uint64_t d0 = d->addr, d1 = d0 + opnd_span(d);

    if (r->kind != KB_REC_COPY && r->kind != KB_REC_MATH1 && r->kind != KB_REC_MATH2)
        return 0;
    if (r->nsrc != (r->kind == KB_REC_MATH2 ? 2u : 1u))
        return 0;
    for (unsigned k = 0; k < r->nsrc; k++) {
        const kb_opnd *o = &r->src[k];
        uint64_t s0 = o->addr, s1 = s0 + opnd_span(o);
        if (o->rows != d->rows || o->cols != d->cols)
            return 0;
        if (o->space == KB_SPACE_PAYLOAD || s1 <= d0 || d1 <= s0)
            continue;
        if (!(s0 == d0 && o->ld == d->ld && o->dtype == d->dtype))
            return 0;
    }
    return 1;
}

/* The fast path: ROWWISE_BLK elements at a time, converted in bulk (kb_dtype_load_n /
 * store_n, the same roundings as one at a time), the arithmetic of kb_mathfn.h per element. */
#define ROWWISE_BLK 1024
/* x[i] = kb_mf_add(x[i], y[i]): blocks of 16 as plain sums (branch-free, so they vectorise),
 * which are kb_mf_add's bits whenever no sum is a NaN; a block with one goes element by
 * element. */
KB_VECTOR_CLONES
static void add_n(float *x, const float *y, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        float z[16];
        unsigned nan = 0;
        for (int k = 0; k < 16; k++) {
            z[k] = x[i + k] + y[i + k];
            nan |= (unsigned)(z[k] != z[k]);
        }
        if (!nan)
            memcpy(x + i, z, sizeof z);
        else
            for (int k = 0; k < 16; k++)
                x[i + k] = kb_mf_add(x[i + k], y[i + k]);
    }
    for (; i < n; i++)
        x[i] = kb_mf_add(x[i], y[i]);
}

static void exec_rowwise(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *d = &r->dst;
    const uint8_t *sb0 = opnd_base(&r->src[0], arena, payload);
    const uint8_t *sb1 = r->nsrc > 1 ? opnd_base(&r->src[1], arena, payload) : NULL;
    uint8_t *db = arena + d->addr;
    float x[ROWWISE_BLK], y[ROWWISE_BLK];

    for (uint32_t i = 0; i < d->rows; i++) {
        for (uint32_t j = 0; j < d->cols; j += ROWWISE_BLK) {
            size_t n = d->cols - j < ROWWISE_BLK ? d->cols - j : ROWWISE_BLK;
            kb_dtype_load_n((kb_dtype)r->src[0].dtype, sb0, (size_t)i * r->src[0].ld + j, x, n);
            if (r->kind == KB_REC_MATH2) {
                kb_dtype_load_n((kb_dtype)r->src[1].dtype, sb1, (size_t)i * r->src[1].ld + j, y,
                                n);
                if (r->op == KB_M2_ADD)
                    add_n(x, y, n);
                else
                    for (size_t k = 0; k < n; k++)
                        x[k] = kb_mf_math2(r->op, x[k], y[k]);
            } else if (r->kind == KB_REC_MATH1) {
                for (size_t k = 0; k < n; k++)
                    x[k] = kb_mf_math1(r->op, x[k], r->imm[0], r->imm[1]);
            }
            kb_dtype_store_n((kb_dtype)d->dtype, db, (size_t)i * d->ld + j, x, n);
        }
    }
}

static void exec_elementwise(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *d = &r->dst;
    uint8_t *db = arena + d->addr;
    const uint8_t *sb[3] = { NULL, NULL, NULL };

    if (elementwise_rowwise(r)) {
        exec_rowwise(r, arena, payload);
        return;
    }
    for (unsigned s = 0; s < r->nsrc && s < 3; s++)
        sb[s] = opnd_base(&r->src[s], arena, payload);
    for (uint32_t i = 0; i < d->rows; i++) {
        for (uint32_t j = 0; j < d->cols; j++) {
            float v;
            switch (r->kind) {
            case KB_REC_COPY:
                v = load_bcast(&r->src[0], sb[0], i, j);
                break;
            case KB_REC_FILL:
                v = r->imm[0];
                break;
            case KB_REC_MATH1:
                v = kb_mf_math1(r->op, load_bcast(&r->src[0], sb[0], i, j), r->imm[0], r->imm[1]);
                break;
            case KB_REC_MATH2:
                v = kb_mf_math2(r->op, load_bcast(&r->src[0], sb[0], i, j),
                          load_bcast(&r->src[1], sb[1], i, j));
                break;
            case KB_REC_FMA:
                v = kb_mf_fma(load_bcast(&r->src[0], sb[0], i, j),
                              load_bcast(&r->src[1], sb[1], i, j),
                              load_bcast(&r->src[2], sb[2], i, j));
                break;
            case KB_REC_CLAMP:
                v = kb_mf_fmin(kb_mf_fmax(load_bcast(&r->src[0], sb[0], i, j), r->imm[0]),
                               r->imm[1]);
                break;
            default:
                return;
            }
            store_at(d, db, i, j, v);
        }
    }
}

/* Softmax over n elements of one row (axis 1) or column (axis 0), starting at (i0, j0). */
static void softmax_line(const kb_rec *r, const uint8_t *sb, uint8_t *db, uint32_t i0, uint32_t j0,
                         uint32_t n, int along_cols)
{
    const kb_opnd *s = &r->src[0], *d = &r->dst;
    float m = 0.0f, sum = 0.0f;

    for (uint32_t k = 0; k < n; k++) {
        float x = along_cols ? load_at(s, sb, i0, j0 + k) : load_at(s, sb, i0 + k, j0);
        m = k == 0 ? x : kb_mf_fmax(m, x);
    }
    for (uint32_t k = 0; k < n; k++) {
        float x = along_cols ? load_at(s, sb, i0, j0 + k) : load_at(s, sb, i0 + k, j0);
        sum = kb_mf_add(sum, kb_mf_exp(kb_mf_sub(x, m)));
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = along_cols ? i0 : i0 + k, j = along_cols ? j0 + k : j0;
        store_at(d, db, i, j, kb_mf_div(kb_mf_exp(kb_mf_sub(load_at(s, sb, i, j), m)), sum));
    }
}

static void exec_softmax(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *d = &r->dst;
    const uint8_t *sb = opnd_base(&r->src[0], arena, payload);
    uint8_t *db = arena + d->addr;

    if (r->op == 1) {
        for (uint32_t i = 0; i < d->rows; i++)
            softmax_line(r, sb, db, i, 0, d->cols, 1);
    } else {
        for (uint32_t j = 0; j < d->cols; j++)
            softmax_line(r, sb, db, 0, j, d->rows, 0);
    }
}

static void exec_reduce(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *s = &r->src[0], *d = &r->dst;
    const uint8_t *sb = opnd_base(s, arena, payload);
    uint8_t *db = arena + d->addr;
    int axis0 = (r->flags & KB_REC_AXIS0) != 0;
    uint32_t nout = axis0 ? s->cols : s->rows;
    uint32_t nin = axis0 ? s->rows : s->cols;

    for (uint32_t o = 0; o < nout; o++) {
        float acc = 0.0f;
        for (uint32_t k = 0; k < nin; k++) {
            float x = axis0 ? load_at(s, sb, k, o) : load_at(s, sb, o, k);
            if (r->op == KB_RED_MAX)
                acc = k == 0 ? x : kb_mf_fmax(acc, x);
            else
                acc = kb_mf_add(acc, x);
        }
        if (r->op == KB_RED_MAX && nin == 0)
            acc = -INFINITY;
        if (axis0)
            store_at(d, db, 0, o, acc);
        else
            store_at(d, db, o, 0, acc);
    }
}

/* The plain triple loop: the definition, used when the fast path cannot get its buffers. */
static void gemm_plain(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *a = &r->src[0], *b = &r->src[1], *d = &r->dst;
    const uint8_t *ab = opnd_base(a, arena, payload), *bb = opnd_base(b, arena, payload);
    uint8_t *db = arena + d->addr;
    uint32_t kdim = a->cols;

    for (uint32_t i = 0; i < d->rows; i++) {
        for (uint32_t j = 0; j < d->cols; j++) {
            float acc = (r->flags & KB_REC_ACC) ? load_at(d, db, i, j) : 0.0f;
            for (uint32_t k = 0; k < kdim; k++) {
                float p = load_at(a, ab, i, k) * load_at(b, bb, k, j);
                acc += p;
            }
            store_at(d, db, i, j, kb_mf_canon(acc));
        }
    }
}

/*
 * The fast path. A is converted to f32 once (m x K), B one KB x JB block at a time; the
 * accumulators of a column panel (m x JB f32) start from 0 or dst and take the K blocks in
 * ascending order, each block's k in ascending order, so every element still sums its
 * products in ascending k with one product rounding and one addition rounding per k: the
 * plain loop's bits. The inner kernel keeps 4 rows x 16 columns of sums in registers.
 */
enum { GEMM_JB = 256, GEMM_KB = 256 };

/* Eight floats as one value (GCC/Clang vector extension): one AVX2 register in the avx2 copy,
 * two SSE halves in the baseline one. Loads and stores through memcpy (any alignment). */
typedef float kb_v8f __attribute__((vector_size(32)));
#define V8_LD(v, p) memcpy(&(v), (p), sizeof(kb_v8f))
#define V8_ST(p, v) memcpy((p), &(v), sizeof(kb_v8f))

/* c[r][0..16) += a[r * lda + k] * bp[k * GEMM_JB + 0..16) for r < 4, k < kw (c: row stride ldc) */
KB_VECTOR_CLONES
static void gemm_4x16(const float *a, size_t lda, const float *bp, size_t kw, float *c, size_t ldc)
{
    kb_v8f c00, c01, c10, c11, c20, c21, c30, c31;
    V8_LD(c00, c);
    V8_LD(c01, c + 8);
    V8_LD(c10, c + ldc);
    V8_LD(c11, c + ldc + 8);
    V8_LD(c20, c + 2 * ldc);
    V8_LD(c21, c + 2 * ldc + 8);
    V8_LD(c30, c + 3 * ldc);
    V8_LD(c31, c + 3 * ldc + 8);
    for (size_t k = 0; k < kw; k++) {
        kb_v8f b0, b1;
        float x0 = a[k], x1 = a[lda + k], x2 = a[2 * lda + k], x3 = a[3 * lda + k];
        kb_v8f a0 = { x0, x0, x0, x0, x0, x0, x0, x0 }, a1 = { x1, x1, x1, x1, x1, x1, x1, x1 };
        kb_v8f a2 = { x2, x2, x2, x2, x2, x2, x2, x2 }, a3 = { x3, x3, x3, x3, x3, x3, x3, x3 };
        kb_v8f p;
        V8_LD(b0, bp + k * GEMM_JB);
        V8_LD(b1, bp + k * GEMM_JB + 8);
        p = a0 * b0; c00 += p;
        p = a0 * b1; c01 += p;
        p = a1 * b0; c10 += p;
        p = a1 * b1; c11 += p;
        p = a2 * b0; c20 += p;
        p = a2 * b1; c21 += p;
        p = a3 * b0; c30 += p;
        p = a3 * b1; c31 += p;
    }
    V8_ST(c, c00);
    V8_ST(c + 8, c01);
    V8_ST(c + ldc, c10);
    V8_ST(c + ldc + 8, c11);
    V8_ST(c + 2 * ldc, c20);
    V8_ST(c + 2 * ldc + 8, c21);
    V8_ST(c + 3 * ldc, c30);
    V8_ST(c + 3 * ldc + 8, c31);
}

/* The edges: one row, w columns, the same sums one element at a time. */
static void gemm_1xw(const float *a, const float *bp, size_t kw, size_t w, float *c)
{
    for (size_t j = 0; j < w; j++) {
        float acc = c[j];
        for (size_t k = 0; k < kw; k++) {
            float p = a[k] * bp[k * GEMM_JB + j];
            acc += p;
        }
        c[j] = acc;
    }
}

static void exec_gemm(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *a = &r->src[0], *b = &r->src[1], *d = &r->dst;
    const uint8_t *ab = opnd_base(a, arena, payload), *bb = opnd_base(b, arena, payload);
    uint8_t *db = arena + d->addr;
    size_t m = d->rows, n = d->cols, kdim = a->cols;
    size_t jb = n < GEMM_JB ? n : GEMM_JB;
    float *af = NULL, *bp = NULL, *acc = NULL;

    if (m == 0 || n == 0)
        return;
    if (kdim <= SIZE_MAX / sizeof(float) / m && m <= SIZE_MAX / sizeof(float) / GEMM_JB) {
        af = malloc(m * kdim * sizeof *af + 1);
        bp = malloc((size_t)GEMM_KB * GEMM_JB * sizeof *bp);
        acc = malloc(m * jb * sizeof *acc);
    }
    if (!af || !bp || !acc) { /* A too big to stage in f32: the unstaged loop */
        gemm_plain(r, arena, payload);
        goto out;
    }
    for (size_t i = 0; i < m; i++)
        kb_dtype_load_n((kb_dtype)a->dtype, ab, i * a->ld, af + i * kdim, kdim);
    for (size_t j0 = 0; j0 < n; j0 += GEMM_JB) {
        size_t jw = n - j0 < GEMM_JB ? n - j0 : GEMM_JB;
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < jw; j++)
                acc[i * jb + j] = (r->flags & KB_REC_ACC)
                                      ? load_at(d, db, (uint32_t)i, (uint32_t)(j0 + j)) : 0.0f;
        for (size_t k0 = 0; k0 < kdim; k0 += GEMM_KB) {
            size_t kw = kdim - k0 < GEMM_KB ? kdim - k0 : GEMM_KB;
            for (size_t k = 0; k < kw; k++)
                kb_dtype_load_n((kb_dtype)b->dtype, bb, (k0 + k) * b->ld + j0, bp + k * GEMM_JB,
                                jw);
            size_t i = 0;
            for (; i + 4 <= m; i += 4) {
                size_t j = 0;
                for (; j + 16 <= jw; j += 16)
                    gemm_4x16(af + i * kdim + k0, kdim, bp + j, kw, acc + i * jb + j, jb);
                for (size_t ii = i; j < jw && ii < i + 4; ii++)
                    gemm_1xw(af + ii * kdim + k0, bp + j, kw, jw - j, acc + ii * jb + j);
            }
            for (; i < m; i++)
                gemm_1xw(af + i * kdim + k0, bp, kw, jw, acc + i * jb);
        }
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < jw; j++)
                store_at(d, db, (uint32_t)i, (uint32_t)(j0 + j), kb_mf_canon(acc[i * jb + j]));
    }
out:
    free(af);
    free(bp);
    free(acc);
}

/* ---- the kb_tl_nn kinds (kb_oplog.h) ---- */

static void exec_transpose(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *s = &r->src[0], *d = &r->dst;
    const uint8_t *sb = opnd_base(s, arena, payload);
    uint8_t *db = arena + d->addr;

    for (uint32_t i = 0; i < d->rows; i++)
        for (uint32_t j = 0; j < d->cols; j++)
            store_at(d, db, i, j, load_at(s, sb, j, i));
}

/*
 * Unmasked prefix length of row i of an ATTN_SOFTMAX record: cols, or with the causal flag
 * the j <= i + offset, clamped to [0, cols] (replay.cl's kb_attn_valid is the same).
 */
static uint32_t attn_valid(const kb_rec *r, uint32_t i)
{
    int64_t off = (int64_t)r->src[1].addr, lim;
    uint32_t cols = r->dst.cols;

    if (r->op == 0)
        return cols;
    /* the clamp first, so that i + offset + 1 cannot overflow */
    if (off >= (int64_t)cols)
        return cols;
    if (off < -(int64_t)UINT32_MAX - 1)
        return 0;
    lim = (int64_t)i + off + 1;
    return lim <= 0 ? 0 : lim >= (int64_t)cols ? cols : (uint32_t)lim;
}

/* Softmax of each row of the scores over its unmasked prefix, as exec_softmax's order. */
static void exec_attn_softmax(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *s = &r->src[0], *d = &r->dst;
    const uint8_t *sb = opnd_base(s, arena, payload);
    uint8_t *db = arena + d->addr;
    float scale = r->imm[0], cap = r->imm[1];

    for (uint32_t i = 0; i < d->rows; i++) {
        uint32_t nv = attn_valid(r, i);
        float m = 0.0f, sum = 0.0f;
        for (uint32_t k = 0; k < nv; k++) {
            float y = kb_mf_attn_score(load_at(s, sb, i, k), scale, cap);
            m = k == 0 ? y : kb_mf_fmax(m, y);
        }
        for (uint32_t k = 0; k < nv; k++)
            sum = kb_mf_add(sum, kb_mf_exp(kb_mf_sub(kb_mf_attn_score(load_at(s, sb, i, k),
                                                                      scale, cap), m)));
        for (uint32_t k = 0; k < d->cols; k++) {
            float v = 0.0f;
            if (k < nv)
                v = kb_mf_div(kb_mf_exp(kb_mf_sub(kb_mf_attn_score(load_at(s, sb, i, k), scale,
                                                                   cap), m)), sum);
            store_at(d, db, i, k, v);
        }
    }
}

/* Row index from a GATHER id: the integer in [0, vocab), or -1. */
static int64_t gather_row(float x, uint32_t vocab)
{
    uint64_t u;
    if (!(x >= 0.0f && x < 4294967296.0f))
        return -1;
    u = (uint64_t)x;
    return (float)u == x && u < vocab ? (int64_t)u : -1;
}

static void exec_gather(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *t = &r->src[0], *ids = &r->src[1], *d = &r->dst;
    const uint8_t *tb = opnd_base(t, arena, payload), *ib = opnd_base(ids, arena, payload);
    uint8_t *db = arena + d->addr;
    size_t istride = ids->rows == 1 ? 1 : ids->ld;

    for (uint32_t i = 0; i < d->rows; i++) {
        int64_t row = gather_row(kb_dtype_load((kb_dtype)ids->dtype, ib, i * istride), t->rows);
        for (uint32_t j = 0; j < d->cols; j++)
            store_at(d, db, i, j, row < 0 ? 0.0f : load_at(t, tb, (uint32_t)row, j));
    }
}

/* DEQUANT (kb_oplog.h), element by element in row-major order. */
static void exec_dequant(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *d = &r->dst, *x = &r->src[0];
    int sparse = (r->flags & KB_REC_QSPARSE) != 0, scaled = (r->flags & KB_REC_QSCALE) != 0;
    const kb_opnd *meta = sparse ? &r->src[1] : NULL, *sc = scaled ? &r->src[r->nsrc - 1] : NULL;
    const uint8_t *xb = opnd_base(x, arena, payload);
    const uint8_t *mb = meta ? opnd_base(meta, arena, payload) : NULL;
    const uint8_t *sb = sc ? opnd_base(sc, arena, payload) : NULL;
    uint8_t *db = arena + d->addr;
    uint32_t rb = sc ? d->rows / sc->rows : 1, cb = sc ? d->cols / sc->cols : 1;

    for (uint32_t i = 0; i < d->rows; i++) {
        for (uint32_t j = 0; j < d->cols; j++) {
            float v, s = sc ? load_at(sc, sb, i / rb, j / cb) : 0.0f;
            if (sparse) {
                uint32_t g = i / 4;
                int k = kb_mf_sparse_slot(mb[(size_t)(g / 2) * meta->ld + j], g, i % 4);
                v = k < 0 ? 0.0f : load_at(x, xb, 2 * g + (uint32_t)k, j);
            } else {
                v = load_at(x, xb, i, j);
            }
            store_at(d, db, i, j, kb_mf_deq(v, s, r->imm[0], scaled));
        }
    }
}

/* GEN (kb_oplog.h): the seeded values, a row at a time in blocks, one rounding on store. */
static void exec_gen(const kb_rec *r, uint8_t *arena)
{
    const kb_opnd *d = &r->dst;
    uint8_t *db = arena + d->addr;
    uint32_t seed = r->src[0].rows;
    int64_t tile0 = (int64_t)r->src[0].addr, i0 = (int64_t)r->src[1].addr;
    int64_t n = (int64_t)r->src[2].addr;
    float x[ROWWISE_BLK];

    if (r->op == KB_GEN_PAT) { /* row0 + i, col0 + j of a (transposed) matrix of ld columns */
        uint64_t r0 = r->src[0].addr, c0 = r->src[1].addr, ld = r->src[2].addr;
        int tr = r->src[1].rows != 0;
        for (uint32_t i = 0; i < d->rows; i++)
            for (uint32_t j = 0; j < d->cols; j += ROWWISE_BLK) {
                size_t m = d->cols - j < ROWWISE_BLK ? d->cols - j : ROWWISE_BLK;
                uint64_t rr = r0 + i, cc = c0 + j;
                kb_seedgen_pattern_span(x, seed, r->src[0].cols, r->imm[0], r->imm[1],
                                        tr ? cc * ld + rr : rr * ld + cc, tr ? ld : 1,
                                        (int64_t)m);
                kb_dtype_store_n((kb_dtype)d->dtype, db, (size_t)i * d->ld + j, x, m);
            }
        return;
    }
    for (uint32_t i = 0; i < d->rows; i++)
        for (uint32_t j = 0; j < d->cols; j += ROWWISE_BLK) {
            size_t m = d->cols - j < ROWWISE_BLK ? d->cols - j : ROWWISE_BLK;
            /* the log's parameters are any 64-bit values: tile and position wrap as in
             * replay.cl's kb_gen, never overflow as signed sums */
            int64_t tile = (int64_t)((uint64_t)tile0 + i), at = (int64_t)((uint64_t)i0 + j);
            kb_seedgen_span(x, seed, tile, at, (int64_t)m, n);
            if (r->op == KB_GEN_SIGN)
                kb_seedgen_sign(x, r->src[0].cols, tile, at, (int64_t)m);
            kb_dtype_store_n((kb_dtype)d->dtype, db, (size_t)i * d->ld + j, x, m);
        }
}

/* ---- GEN op KB_GEN_QW: a quantized weight's part generated and quantized here ---- */

/* One column of a generated weight copy (kb_seedgen.h's maps) and its format. */
typedef struct qw_col {
    const uint8_t *rows; /* the row map: k little-endian uint64 */
    kb_seedgen_col c;
    uint64_t k;
    unsigned fmt;
    int sparse;
    uint64_t blk;        /* mxint8: the block whose scale is cached (UINT64_MAX: none) */
    float bsv, bd;       /* its scale value and divisor */
} qw_col;

static float qw_raw(const qw_col *q, uint64_t i)
{
    uint64_t row;
    memcpy(&row, q->rows + 8 * i, sizeof row); /* little-endian hosts (x86-64, arm64) */
    return kb_seedgen_mapped(row, &q->c);
}

/* Group g's four values, pruned when sparse (+0 where 2:4 drops one); its nibble. */
static unsigned qw_group(const qw_col *q, uint64_t g, float v[4])
{
    unsigned keep;
    for (unsigned p = 0; p < 4; p++)
        v[p] = qw_raw(q, 4 * g + p);
    keep = kb_mf_q24_keep(v[0], v[1], v[2], v[3]);
    for (unsigned p = 0; q->sparse && p < 4; p++)
        if (p != (keep & 3u) && p != keep >> 2)
            v[p] = 0.0f;
    return keep;
}

/* The largest |value| of rows [a, b) after pruning (kb_tl_q's order: ascending rows). */
static float qw_amax(const qw_col *q, uint64_t a, uint64_t b)
{
    float m = 0.0f, v[4];
    for (uint64_t i = a; i < b; i++) {
        float x;
        if (q->sparse) { /* a and b are multiples of 4 when sparse */
            if ((i - a) % 4 == 0)
                qw_group(q, i / 4, v);
            x = v[i % 4];
        } else {
            x = qw_raw(q, i);
        }
        float ab = kb_mf_math1(KB_MF_M1_ABS, x, 0.0f, 0.0f);
        m = i == a ? ab : kb_mf_fmax(m, ab);
    }
    return m;
}

/* mxint8: block b's scale value and divisor, cached for the rows after it. */
static void qw_block(qw_col *q, uint64_t b)
{
    if (q->blk == b)
        return;
    q->blk = b;
    q->bsv = kb_mf_qmx_scale(qw_amax(q, b * KB_MF_MX_BLOCK, (b + 1) * KB_MF_MX_BLOCK));
    q->bd = kb_mf_qmx_div(q->bsv);
}

/* The element value of (pruned) row i's value x: rounded (f16/bf16) or quantized. */
static float qw_elem(qw_col *q, uint64_t i, float x, float chan)
{
    if (q->fmt == KB_MF_QF_F16 || q->fmt == KB_MF_QF_BF16)
        return kb_mf_qround(q->fmt, x);
    if (q->fmt == KB_MF_QF_MXINT8) {
        qw_block(q, i / KB_MF_MX_BLOCK);
        return kb_mf_qelem(q->fmt, x, q->bd);
    }
    return kb_mf_qelem(q->fmt, x, chan);
}

/* GEN op KB_GEN_QW (kb_oplog.h): column by column, as kb_tl_q quantizes a weight. */
static void exec_gen_qw(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    const kb_opnd *d = &r->dst;
    uint8_t *db = arena + d->addr;
    const uint8_t *cm = payload + r->src[1].addr;
    unsigned part = r->src[2].rows;
    qw_col q = { .rows = payload + r->src[0].addr, .k = r->src[0].cols / 8u,
                 .fmt = r->src[2].cols, .sparse = (r->flags & KB_REC_QSPARSE) != 0 };
    uint64_t nb = r->src[1].cols / KB_SEEDGEN_COL_BYTES;
    uint64_t prows = kb_seedgen_qw_rows(q.fmt, q.sparse, part, q.k);
    int chan = q.fmt != KB_MF_QF_F16 && q.fmt != KB_MF_QF_BF16 && q.fmt != KB_MF_QF_MXINT8;

    for (uint32_t j = 0; j < d->cols; j++) {
        float s = 0.0f, v[4];
        memcpy(&q.c, cm + KB_SEEDGEN_COL_BYTES * ((r->src[2].ld + (uint64_t)j) % nb), sizeof q.c);
        q.blk = UINT64_MAX;
        if (chan && part != KB_SEEDGEN_QW_META)
            s = kb_mf_qchan_scale(q.fmt, qw_amax(&q, 0, q.k));
        for (uint32_t i = 0; i < d->rows; i++) {
            uint64_t pr = (r->src[2].addr + i) % prows;
            float out;
            if (part == KB_SEEDGEN_QW_SCALE) {
                if (q.fmt == KB_MF_QF_MXINT8)
                    qw_block(&q, pr);
                out = q.fmt == KB_MF_QF_MXINT8 ? q.bsv : s;
            } else if (part == KB_SEEDGEN_QW_META) {
                unsigned byte = qw_group(&q, 2 * pr, v);
                if (2 * pr + 1 < q.k / 4)
                    byte |= qw_group(&q, 2 * pr + 1, v) << 4;
                out = (float)(byte >= 128u ? (int)byte - 256 : (int)byte);
            } else if (q.sparse) { /* kept value t of group pr / 2 */
                unsigned keep = qw_group(&q, pr / 2, v), at = pr % 2 ? keep >> 2 : keep & 3u;
                out = qw_elem(&q, 4 * (pr / 2) + at, v[at], s);
            } else {
                out = qw_elem(&q, pr, qw_raw(&q, pr), s);
            }
            store_at(d, db, i, j, out);
        }
    }
}

void kb_ref_exec(const kb_rec *r, uint8_t *arena, const uint8_t *payload)
{
    /* A destination without elements: nothing to compute, as the OpenCL kernels (sized by
     * the destination's elements) find. Its other dimension may still be 2^32 - 1, and the
     * row loops below would walk it for nothing (seconds per record; found by
     * tests/fuzz/fuzz_replay.c). */
    if (r->dst.rows == 0 || r->dst.cols == 0)
        return;
    switch (r->kind) {
    case KB_REC_COPY:
    case KB_REC_FILL:
    case KB_REC_MATH1:
    case KB_REC_MATH2:
    case KB_REC_FMA:
    case KB_REC_CLAMP:
        exec_elementwise(r, arena, payload);
        break;
    case KB_REC_SOFTMAX:
        exec_softmax(r, arena, payload);
        break;
    case KB_REC_REDUCE:
        exec_reduce(r, arena, payload);
        break;
    case KB_REC_GEMM:
        exec_gemm(r, arena, payload);
        break;
    case KB_REC_TRANSPOSE:
        exec_transpose(r, arena, payload);
        break;
    case KB_REC_ATTN_SOFTMAX:
        exec_attn_softmax(r, arena, payload);
        break;
    case KB_REC_GATHER:
        exec_gather(r, arena, payload);
        break;
    case KB_REC_DEQUANT:
        exec_dequant(r, arena, payload);
        break;
    case KB_REC_GEN:
        if (r->op == KB_GEN_QW)
            exec_gen_qw(r, arena, payload);
        else
            exec_gen(r, arena);
        break;
    default:
        break;
    }
}

/* Backend state between begin and end. */
typedef struct ref_state {
    uint8_t *arena;          /* the caller's arena, computed in place (borrowed for one flush) */
    uint64_t arena_bytes;
    const uint8_t *payload;  /* borrowed from the caller for the duration of one flush */
    int active;
    /* the resident variant: host buffers standing for device memory */
    kb_resident *res;
    uint8_t *dev_arena, *dev_payload;  /* the blocks end to end in one host buffer */
    uint64_t dev_arena_bytes;
    uint64_t *blk_end;                 /* the blocks' ends, ascending */
    size_t nblk, blkcap;
    size_t dev_payload_bytes;
} ref_state;

static int ref_begin(void *self, uint8_t *arena, uint64_t arena_bytes,
                     const uint8_t *payload, size_t payload_bytes, kb_errbuf *eb)
{
    ref_state *st = self;
    /* never NULL, even for an empty arena, so operand pointers are always well defined */
    static uint8_t empty[8];

    (void)payload_bytes;
    if (arena_bytes > SIZE_MAX)
        return kb_err_nomem(eb, (unsigned long long)arena_bytes, "ref backend: the replay's "
                            "arena");
    if (!arena && st->res) { /* resident flush: the "device" buffers */
        if (arena_bytes > st->dev_arena_bytes)
            return kb_err_set(eb, KB_ERR_STATE,
                              "ref backend: resident arena of %llu bytes, has %llu",
                              (unsigned long long)arena_bytes,
                              (unsigned long long)st->dev_arena_bytes);
        arena = st->dev_arena;
        payload = st->dev_payload;
    }
    if (!arena && arena_bytes > 0)
        return kb_err_set(eb, KB_ERR_INVAL, "ref backend: no arena");
    st->arena = arena ? arena : empty;
    st->arena_bytes = arena_bytes;
    st->payload = payload ? payload : empty; /* an empty payload operand's base, too */
    st->active = 1;
    return 0;
}

static int ref_run_batch(void *self, const kb_rec *recs, size_t n, kb_errbuf *eb)
{
    ref_state *st = self;

    if (!st->active)
        return kb_err_set(eb, KB_ERR_STATE, "ref backend: run_batch outside begin/end");
    for (size_t i = 0; i < n; i++)
        kb_ref_exec(&recs[i], st->arena, st->payload);
    return 0;
}

static int ref_end(void *self, uint8_t *arena, uint64_t arena_bytes, kb_errbuf *eb)
{
    ref_state *st = self;

    if (!st->active)
        return kb_err_set(eb, KB_ERR_STATE, "ref backend: end without begin");
    st->active = 0;
    st->payload = NULL;
    if (arena_bytes != st->arena_bytes)
        return kb_err_set(eb, KB_ERR_STATE,
                          "ref backend: end with %llu arena bytes, begin had %llu",
                          (unsigned long long)arena_bytes, (unsigned long long)st->arena_bytes);
    if (arena && arena_bytes > 0 && arena != st->arena) /* another buffer than begin's */
        memcpy(arena, st->arena, (size_t)arena_bytes);
    st->arena = NULL;
    return 0;
}

static void ref_destroy(void *self)
{
    ref_state *st = self;

    if (!st)
        return;
    kb_resident_destroy(st->res);
    free(st->dev_arena);
    free(st->dev_payload);
    free(st->blk_end);
    free(st);
}

/* ---- the resident variant's "device": host buffers ---- */

/* A block: the host buffer grows (realloc may move it: a host stand-in for device memory,
 * where what counts is that kb_resident never asks for a copy); its block ends are kept so
 * that every primitive's range is checked to lie in one block, as on a device. */
static int rd_block(void *dev, uint64_t base, uint64_t bytes, kb_errbuf *eb)
{
    ref_state *st = dev;
    uint8_t *a;

    if (base == 0)
        st->nblk = st->dev_arena_bytes = 0; /* a new binding: the old blocks are released */
    if (base != st->dev_arena_bytes || bytes == 0 || bytes > SIZE_MAX - base)
        return kb_err_set(eb, KB_ERR_STATE, "ref backend: block at %llu of %llu bytes, the "
                          "arena has %llu", (unsigned long long)base, (unsigned long long)bytes,
                          (unsigned long long)st->dev_arena_bytes);
    if (st->nblk == st->blkcap) {
        size_t c = st->blkcap ? 2 * st->blkcap : 8;
        uint64_t *e = realloc(st->blk_end, c * sizeof *e);
        if (!e)
            return kb_err_nomem(eb, (unsigned long long)(c * sizeof *e), "ref backend: blocks");
        st->blk_end = e;
        st->blkcap = c;
    }
    if (!(a = realloc(st->dev_arena, (size_t)(base + bytes))))
        return kb_err_nomem(eb, (unsigned long long)bytes, "ref backend: the resident arena");
    memset(a + base, 0xA5, (size_t)bytes); /* what a fresh device buffer holds: anything */
    st->dev_arena = a;
    st->dev_arena_bytes = base + bytes;
    st->blk_end[st->nblk++] = base + bytes;
    return 0;
}

static int rd_check(const ref_state *st, uint64_t off, uint64_t n, kb_errbuf *eb)
{
    size_t lo = 0, hi = st->nblk;
    while (lo < hi) { /* the block holding off: the first one ending after it */
        size_t mid = lo + (hi - lo) / 2;
        if (st->blk_end[mid] <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (n == 0 ? off <= st->dev_arena_bytes : lo < st->nblk && n <= st->blk_end[lo] - off)
        return 0;
    return kb_err_set(eb, KB_ERR_RANGE, "ref backend: [%llu, +%llu) not inside one block of "
                      "the arena of %llu", (unsigned long long)off, (unsigned long long)n,
                      (unsigned long long)st->dev_arena_bytes);
}

static int rd_copy(void *dev, uint64_t to, uint64_t from, uint64_t n, kb_errbuf *eb)
{
    ref_state *st = dev;
    int rc = rd_check(st, to, n, eb);
    if (rc == 0 && (rc = rd_check(st, from, n, eb)) == 0 && n > 0)
        memmove(st->dev_arena + to, st->dev_arena + from, (size_t)n);
    return rc;
}

static int rd_fill(void *dev, uint64_t off, uint64_t n, uint8_t byte, kb_errbuf *eb)
{
    ref_state *st = dev;
    int rc = rd_check(st, off, n, eb);
    if (rc == 0 && n > 0)
        memset(st->dev_arena + off, byte, (size_t)n);
    return rc;
}

static int rd_upload(void *dev, uint64_t off, const void *src, uint64_t n, kb_errbuf *eb)
{
    ref_state *st = dev;
    int rc = rd_check(st, off, n, eb);
    if (rc == 0 && n > 0)
        memcpy(st->dev_arena + off, src, (size_t)n);
    return rc;
}

static int rd_download(void *dev, uint64_t off, void *dst, uint64_t n, kb_errbuf *eb)
{
    ref_state *st = dev;
    int rc = rd_check(st, off, n, eb);
    if (rc == 0 && n > 0)
        memcpy(dst, st->dev_arena + off, (size_t)n);
    return rc;
}

static int rd_payload(void *dev, const uint8_t *p, size_t size, size_t have, kb_errbuf *eb)
{
    ref_state *st = dev;
    if (size > st->dev_payload_bytes) {
        uint8_t *np = malloc(size);
        if (!np)
            return kb_err_nomem(eb, (unsigned long long)size, "ref backend: the op log's "
                                "payload");
        if (have > 0)
            memcpy(np, st->dev_payload, have);
        free(st->dev_payload);
        st->dev_payload = np;
        st->dev_payload_bytes = size;
    }
    if (size > have)
        memcpy(st->dev_payload + have, p + have, size - have);
    return 0;
}

/* The oracle's answers (kb_vquery_run_host) over the "device" arena. */
static int rd_query(void *dev, const kb_vquery *q, const uint64_t *off, void *out,
                    kb_errbuf *eb)
{
    ref_state *st = dev;
    uint64_t per = kb_vquery_tile_bytes(q);
    int rc = 0;
    for (uint32_t t = 0; t < q->ntiles && rc == 0; t++)
        rc = rd_check(st, off[t], per, eb);
    if (rc == 0 && (rc = kb_vquery_run_host(q, st->dev_arena, off, out)) != 0)
        kb_err_set(eb, rc, "ref backend: query kind %u: %s", q->kind, kb_strerror(rc));
    return rc;
}

static const kb_resident_ops rd_ops = {
    rd_block, rd_copy, rd_fill, rd_upload, rd_download, rd_payload, rd_query,
};

static kb_resident *ref_resident(void *self)
{
    return ((ref_state *)self)->res;
}

static const kb_backend_ops ref_ops = {
    .name = "ref",
    .kind = KB_BACKEND_REF,
    .begin = ref_begin,
    .run_batch = ref_run_batch,
    .end = ref_end,
    .destroy = ref_destroy,
};

static const kb_backend_ops ref_resident_ops = {
    .name = "ref-resident",
    .kind = KB_BACKEND_REF,
    .begin = ref_begin,
    .run_batch = ref_run_batch,
    .end = ref_end,
    .destroy = ref_destroy,
    .resident = ref_resident,
};

int kb_ref_backend_create_resident(kb_backend *out)
{
    ref_state *st = calloc(1, sizeof *st);

    if (!st)
        return KB_ERR_NOMEM;
    st->res = kb_resident_create(&rd_ops, st);
    if (!st->res) {
        free(st);
        return KB_ERR_NOMEM;
    }
    out->ops = &ref_resident_ops;
    out->self = st;
    return 0;
}

int kb_ref_backend_create(kb_backend *out)
{
    ref_state *st = calloc(1, sizeof *st);

    if (!st)
        return KB_ERR_NOMEM;
    out->ops = &ref_ops;
    out->self = st;
    return 0;
}
