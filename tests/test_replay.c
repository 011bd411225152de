/*
 * test_replay — Phase 2 on the reference backend: every record kind on small hand-computed
 * examples (exact expected values), the planner's batching, ordering, kind grouping and arena
 * layout, validation errors, a failing backend leaving the store untouched, level scheduling
 * of interleaved independent chains (one batch per depth), the plan time of 300 000 records
 * (printed, not asserted), and the property tests: random op logs replayed in batches give
 * byte-identical memory to a serial replay in (t_start, seq) order, and every record's batch
 * is exactly one past the latest batch of the earlier records it conflicts with.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kb_mathfn.h"
#include "kb_replay.h"
#include "kb_seedgen.h"
#include "kb_test_util.h"

/* ------------------------------------------------------------------ fixture and helpers */

typedef struct fx {
    kb_oplog *log;
    kb_memstore *ms;
    kb_backend be;
    kb_replay_stats st;
    kb_errbuf eb;
} fx;

static int setup_with(void **state, int resident)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->log = kb_oplog_create();
    f->ms = kb_memstore_create();
    if (!f->log || !f->ms ||
        (resident ? kb_ref_backend_create_resident(&f->be) : kb_ref_backend_create(&f->be)) != 0)
        return -1;
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, 0);
}

/* The same tests on device-resident memory (kb_resident, with host buffers as the device). */
static int setup_resident(void **state)
{
    return setup_with(state, 1);
}

static int teardown(void **state)
{
    fx *f = *state;
    kb_oplog_destroy(f->log);
    kb_memstore_destroy(f->ms);
    f->be.ops->destroy(f->be.self);
    free(f);
    return 0;
}

static void put_f32(kb_memstore *ms, uint64_t pa, const float *v, size_t n)
{
    assert_int_equal(kb_memstore_write(ms, pa, v, n * sizeof *v), 0);
}

static void put_f16(kb_memstore *ms, uint64_t pa, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h = kb_f32_to_f16(v[i]);
        assert_int_equal(kb_memstore_write(ms, pa + 2 * i, &h, 2), 0);
    }
}

/* Host reads go through kb_memstore_load: they pull what a resident backend computed. */
static void load(kb_memstore *ms, uint64_t pa, void *dst, size_t n)
{
    kb_errbuf eb;
    eb.msg[0] = '\0';
    int rc = kb_memstore_load(ms, pa, dst, n, &eb);
    if (rc)
        print_error("load: %s\n", eb.msg);
    assert_int_equal(rc, 0);
}

static float get_f32(kb_memstore *ms, uint64_t pa, size_t i)
{
    float v;
    load(ms, pa + 4 * i, &v, sizeof v);
    return v;
}

static uint16_t get_u16(kb_memstore *ms, uint64_t pa, size_t i)
{
    uint16_t v;
    load(ms, pa + 2 * i, &v, sizeof v);
    return v;
}

static float get_f16(kb_memstore *ms, uint64_t pa, size_t i)
{
    return kb_f16_to_f32(get_u16(ms, pa, i));
}

static uint32_t get_u32(kb_memstore *ms, uint64_t pa, size_t i)
{
    uint32_t v;
    load(ms, pa + 4 * i, &v, sizeof v);
    return v;
}

static void append(fx *f, const kb_rec *r)
{
    assert_int_equal(kb_oplog_append(f->log, r, NULL), 0);
}

static void flush_ok(fx *f)
{
    f->eb.msg[0] = '\0';
    int rc = kb_replay_flush(f->log, f->ms, &f->be, &f->st, &f->eb);
    if (rc)
        print_error("flush: %s\n", f->eb.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(kb_oplog_replayed(f->log), kb_oplog_count(f->log));
}

/* ------------------------------------------------------------------ kinds */

static void test_gemm(void **state)
{
    fx *f = *state;
    const float a[6] = { 1, 2, 3, 4, 5, 6 }, b[6] = { 7, 8, 9, 10, 11, 12 };
    const float ones[4] = { 1, 1, 1, 1 };
    put_f32(f->ms, 0x1000, a, 6);
    put_f32(f->ms, 0x2000, b, 6);
    put_f16(f->ms, 0x3100, ones, 4);

    kb_rec r = kbt_rec_new(KB_REC_GEMM, 0);
    r.src[0] = kb_opnd_make(0x1000, 2, 3, KB_F32);
    r.src[1] = kb_opnd_make(0x2000, 3, 2, KB_F32);
    r.dst = kb_opnd_make(0x3000, 2, 2, KB_F32);
    append(f, &r);
    r.t_start = 1;
    r.flags = KB_REC_ACC;
    r.dst = kb_opnd_make(0x3100, 2, 2, KB_F16);
    append(f, &r);
    flush_ok(f);

    const float want[4] = { 58, 64, 139, 154 };
    for (size_t i = 0; i < 4; i++) {
        assert_true(get_f32(f->ms, 0x3000, i) == want[i]);
        assert_true(get_f16(f->ms, 0x3100, i) == want[i] + 1.0f);
    }
    assert_int_equal(f->st.records, 2);
    assert_int_equal(f->st.batches, 1);
    assert_int_equal(f->st.launches, 1);
    assert_int_equal(f->st.flushes, 1);
}

static void test_softmax(void **state)
{
    fx *f = *state;
    const float row[2] = { 0.0f, logf(3.0f) };
    const float m[4] = { 0.0f, 1.0f, logf(3.0f), 1.0f };
    put_f32(f->ms, 0x1000, row, 2);
    put_f32(f->ms, 0x1100, m, 4);

    kb_rec r = kbt_rec_new(KB_REC_SOFTMAX, 0);
    r.op = 1;
    r.src[0] = kb_opnd_make(0x1000, 1, 2, KB_F32);
    r.dst = kb_opnd_make(0x2000, 1, 2, KB_F16);
    append(f, &r);
    r.op = 0; /* over each column */
    r.src[0] = kb_opnd_make(0x1100, 2, 2, KB_F32);
    r.dst = kb_opnd_make(0x2100, 2, 2, KB_F16);
    append(f, &r);
    /* In place on f32, row-wise: dst == src. */
    r.op = 1;
    r.src[0] = kb_opnd_make(0x1000, 1, 2, KB_F32);
    r.dst = r.src[0];
    r.t_start = 5;
    append(f, &r);
    flush_ok(f);

    assert_int_equal(get_u16(f->ms, 0x2000, 0), 0x3400); /* 0.25 */
    assert_int_equal(get_u16(f->ms, 0x2000, 1), 0x3A00); /* 0.75 */
    assert_true(get_f16(f->ms, 0x2100, 0) == 0.25f);
    assert_true(get_f16(f->ms, 0x2100, 1) == 0.5f);
    assert_true(get_f16(f->ms, 0x2100, 2) == 0.75f);
    assert_true(get_f16(f->ms, 0x2100, 3) == 0.5f);
    assert_true(fabsf(get_f32(f->ms, 0x1000, 0) - 0.25f) <= 2e-7f);
    assert_true(fabsf(get_f32(f->ms, 0x1000, 1) - 0.75f) <= 2e-7f);
    /* The in-place record reads what the first one read: it comes later and must be split. */
    assert_int_equal(f->st.batches, 2);
}

static void test_reduce(void **state)
{
    fx *f = *state;
    const float a[6] = { 1, 2, 3, 4, 5, -6 };
    put_f32(f->ms, 0x1000, a, 6);

    kb_rec r = kbt_rec_new(KB_REC_REDUCE, 0);
    r.src[0] = kb_opnd_make(0x1000, 2, 3, KB_F32);
    r.op = KB_RED_SUM;
    r.dst = kb_opnd_make(0x2000, 2, 1, KB_F32);
    append(f, &r);
    r.flags = KB_REC_AXIS0;
    r.dst = kb_opnd_make(0x2010, 1, 3, KB_F32);
    append(f, &r);
    r.op = KB_RED_MAX;
    r.flags = 0;
    r.dst = kb_opnd_make(0x2020, 2, 1, KB_BF16);
    append(f, &r);
    r.flags = KB_REC_AXIS0;
    r.dst = kb_opnd_make(0x2030, 1, 3, KB_F16);
    append(f, &r);
    flush_ok(f);

    assert_true(get_f32(f->ms, 0x2000, 0) == 6.0f);
    assert_true(get_f32(f->ms, 0x2000, 1) == 3.0f);
    assert_true(get_f32(f->ms, 0x2010, 0) == 5.0f);
    assert_true(get_f32(f->ms, 0x2010, 1) == 7.0f);
    assert_true(get_f32(f->ms, 0x2010, 2) == -3.0f);
    assert_int_equal(get_u16(f->ms, 0x2020, 0), 0x4040); /* bf16 3 */
    assert_int_equal(get_u16(f->ms, 0x2020, 1), 0x40A0); /* bf16 5 */
    assert_true(get_f16(f->ms, 0x2030, 0) == 4.0f);
    assert_true(get_f16(f->ms, 0x2030, 1) == 5.0f);
    assert_true(get_f16(f->ms, 0x2030, 2) == 3.0f);
    assert_int_equal(f->st.batches, 1);
    assert_int_equal(f->st.launches, 1);
}

static void test_broadcast_math2(void **state)
{
    fx *f = *state;
    const float x[6] = { 1, 2, 3, 4, 5, 6 }, bias[3] = { 10, 20, 30 }, col[2] = { 100, 200 };
    put_f32(f->ms, 0x1000, x, 6);
    put_f16(f->ms, 0x1100, bias, 3);
    put_f32(f->ms, 0x1200, col, 2);

    kb_rec r = kbt_rec_new(KB_REC_MATH2, 0);
    r.op = KB_M2_ADD;
    r.src[0] = kb_opnd_make(0x1000, 2, 3, KB_F32);
    r.src[1] = kb_opnd_make(0x1100, 1, 3, KB_F16); /* a 1 x N bias over the rows */
    r.dst = kb_opnd_make(0x2000, 2, 3, KB_F32);
    append(f, &r);
    r.op = KB_M2_MUL;
    r.src[1] = kb_opnd_make(0x1200, 2, 1, KB_F32); /* a column over the columns */
    r.dst = kb_opnd_make(0x2100, 2, 3, KB_F32);
    append(f, &r);
    r.op = KB_M2_SUB;
    r.src[0] = kb_opnd_make(0x1100, 1, 3, KB_F16);
    r.src[1] = kb_opnd_make(0x1200, 2, 1, KB_F32); /* both broadcast: outer difference */
    r.dst = kb_opnd_make(0x2200, 2, 3, KB_F32);
    append(f, &r);
    r.op = KB_M2_DIV;
    r.src[0] = kb_opnd_make(0x1000, 1, 3, KB_F32);
    r.src[1] = kb_opnd_make(0x1000, 1, 1, KB_F32);
    r.dst = kb_opnd_make(0x2300, 1, 3, KB_F32);
    append(f, &r);
    r.op = KB_M2_MAX;
    r.src[0] = kb_opnd_make(0x1000, 1, 3, KB_F32);
    r.src[1] = kb_opnd_make(0x1008, 1, 1, KB_F32); /* 3 */
    r.dst = kb_opnd_make(0x2400, 1, 3, KB_F32);
    append(f, &r);
    r.op = KB_M2_MIN;
    r.dst = kb_opnd_make(0x2500, 1, 3, KB_F32);
    append(f, &r);
    flush_ok(f);

    const float add[6] = { 11, 22, 33, 14, 25, 36 }, mul[6] = { 100, 200, 300, 800, 1000, 1200 };
    const float sub[6] = { -90, -80, -70, -190, -180, -170 };
    for (size_t i = 0; i < 6; i++) {
        assert_true(get_f32(f->ms, 0x2000, i) == add[i]);
        assert_true(get_f32(f->ms, 0x2100, i) == mul[i]);
        assert_true(get_f32(f->ms, 0x2200, i) == sub[i]);
    }
    assert_true(get_f32(f->ms, 0x2300, 0) == 1.0f);
    assert_true(get_f32(f->ms, 0x2300, 1) == 2.0f);
    assert_true(get_f32(f->ms, 0x2300, 2) == 3.0f);
    assert_true(get_f32(f->ms, 0x2400, 0) == 3.0f);
    assert_true(get_f32(f->ms, 0x2400, 2) == 3.0f);
    assert_true(get_f32(f->ms, 0x2500, 0) == 1.0f);
    assert_true(get_f32(f->ms, 0x2500, 2) == 3.0f);
}

/*
 * Elementwise records over whole rows run through f32 blocks (kb_ref.c's fast path); they must
 * give the element-by-element bits: adds of f16 into f32 sums with NaN, infinities and -0 in
 * some 16-element blocks (a NaN sum takes kb_mf_add's operand NaN or the canonical one),
 * other ops, an f32 -> f16 copy with ties and overflow, in place, and a destination that
 * overlaps its source one element on (which must read the source's old values in order,
 * element by element: the record's documented order).
 */
static void test_rowwise_fast_path(void **state)
{
    enum { N = 1000 };
    fx *f = *state;
    static float a[N], b[N];
    static uint16_t bh[N];
    const uint32_t qnan = 0x7FC00123u, canon = 0x7FC00000u;
    for (int i = 0; i < N; i++) {
        a[i] = (float)((i * 37) % 101) * 0.37f - 11.0f;
        b[i] = (float)((i * 53) % 97) * 0.5f - 20.0f;
    }
    a[35] = kbt_u2f(qnan);   /* a NaN source in block 2 */
    b[70] = INFINITY;        /* inf + -inf: the canonical NaN, block 4 */
    a[70] = -INFINITY;
    b[100] = NAN;
    a[200] = -0.0f;
    b[200] = -0.0f;
    a[999] = INFINITY;       /* the scalar tail */
    for (int i = 0; i < N; i++)
        bh[i] = kb_f32_to_f16(b[i]);
    put_f32(f->ms, 0x10000, a, N);
    assert_int_equal(kb_memstore_write(f->ms, 0x20000, bh, sizeof bh), 0);

    kb_rec r = kbt_rec_new(KB_REC_MATH2, 0);
    static const int ops[] = { KB_M2_ADD, KB_M2_SUB, KB_M2_MUL, KB_M2_MAX };
    for (int k = 0; k < 4; k++) {
        r.op = ops[k];
        r.src[0] = kb_opnd_make(0x10000, 1, N, KB_F32);
        r.src[1] = kb_opnd_make(0x20000, 1, N, KB_F16);
        r.dst = kb_opnd_make(0x30000 + 0x1000 * (uint64_t)k, 1, N, KB_F32);
        append(f, &r);
    }
    /* in place: a += b, then a copy of the sums to f16 */
    r.op = KB_M2_ADD;
    r.dst = kb_opnd_make(0x10000, 1, N, KB_F32);
    append(f, &r);
    kb_rec c = kbt_rec_new(KB_REC_COPY, 0);
    c.src[0] = kb_opnd_make(0x10000, 1, N, KB_F32);
    c.dst = kb_opnd_make(0x40000, 1, N, KB_F16);
    append(f, &c);
    /* overlapping one element on: dst[i] = src[i] with dst = src + 1 element */
    c.src[0] = kb_opnd_make(0x20000, 1, N - 1, KB_F16);
    c.dst = kb_opnd_make(0x20002, 1, N - 1, KB_F16);
    append(f, &c);
    flush_ok(f);

    for (int k = 0; k < 4; k++)
        for (int i = 0; i < N; i++) {
            float bv = kb_f16_to_f32(bh[i]);
            uint32_t want = kbt_f2u(kb_mf_math2((uint32_t)ops[k], a[i], bv));
            assert_int_equal(get_u32(f->ms, 0x30000 + 0x1000 * (uint64_t)k, i), want);
        }
    assert_int_equal(get_u32(f->ms, 0x30000, 35), qnan);  /* kb_mf_add keeps x's NaN */
    assert_int_equal(get_u32(f->ms, 0x30000, 70), canon);
    assert_int_equal(get_u32(f->ms, 0x30000, 200), 0x80000000u); /* -0 + -0 */
    for (int i = 0; i < N; i++) {
        float sum = kb_mf_add(a[i], kb_f16_to_f32(bh[i]));
        assert_int_equal(get_u32(f->ms, 0x10000, i), kbt_f2u(sum));
        assert_int_equal(get_u16(f->ms, 0x40000, i), kb_f32_to_f16(sum));
    }
    /* element by element in order: every element became the old element 0 */
    for (int i = 0; i < N; i++)
        assert_int_equal(get_u16(f->ms, 0x20000, i), bh[0]);
}

static void test_math1(void **state)
{
    fx *f = *state;
    /* op, input, expected (exact in f32) */
    static const struct { kb_math1_op op; float x, want; } cases[] = {
        { KB_M1_EXP, 0.0f, 1.0f },    { KB_M1_LOG, 1.0f, 0.0f },   { KB_M1_SQRT, 4.0f, 2.0f },
        { KB_M1_ABS, -3.0f, 3.0f },   { KB_M1_SIGMOID, 0.0f, 0.5f }, { KB_M1_COS, 0.0f, 1.0f },
        { KB_M1_SIN, 0.0f, 0.0f },    { KB_M1_NEG, 2.0f, -2.0f },  { KB_M1_RECIP, 4.0f, 0.25f },
        { KB_M1_RELU, -1.0f, 0.0f },  { KB_M1_RELU, 2.5f, 2.5f },  { KB_M1_GELU, 0.0f, 0.0f },
        { KB_M1_AXPB, 3.0f, 7.0f },   { KB_M1_RSQRT, 4.0f, 0.5f },
    };
    enum { NC = sizeof cases / sizeof cases[0] };
    for (size_t i = 0; i < NC; i++) {
        put_f32(f->ms, 0x1000 + 4 * i, &cases[i].x, 1);
        kb_rec r = kbt_rec_new(KB_REC_MATH1, 0);
        r.op = (uint8_t)cases[i].op;
        r.imm[0] = 2.0f;
        r.imm[1] = 1.0f;
        r.src[0] = kb_opnd_make(0x1000 + 4 * i, 1, 1, KB_F32);
        r.dst = kb_opnd_make(0x2000 + 4 * i, 1, 1, KB_F32);
        append(f, &r);
    }
    /* GELU(1) and SIGMOID(2) against the formulas evaluated in double, rounded to f16. */
    const float one = 1.0f, two = 2.0f;
    put_f32(f->ms, 0x1100, &one, 1);
    put_f32(f->ms, 0x1104, &two, 1);
    kb_rec r = kbt_rec_new(KB_REC_MATH1, 0);
    r.op = KB_M1_GELU;
    r.src[0] = kb_opnd_make(0x1100, 1, 1, KB_F32);
    r.dst = kb_opnd_make(0x2100, 1, 1, KB_F16);
    append(f, &r);
    r.op = KB_M1_SIGMOID;
    r.src[0] = kb_opnd_make(0x1104, 1, 1, KB_F32);
    r.dst = kb_opnd_make(0x2104, 1, 1, KB_F16);
    append(f, &r);
    flush_ok(f);

    for (size_t i = 0; i < NC; i++)
        assert_true(get_f32(f->ms, 0x2000, i) == cases[i].want);
    double gelu1 = 0.5 * (1.0 + tanh(0.7978845608 * (1.0 + 0.044715)));
    assert_int_equal(get_u16(f->ms, 0x2100, 0), kb_f32_to_f16((float)gelu1));
    assert_int_equal(get_u16(f->ms, 0x2100, 0), 0x3ABB);
    assert_int_equal(get_u16(f->ms, 0x2104, 0), kb_f32_to_f16((float)(1.0 / (1.0 + exp(-2.0)))));
    assert_int_equal(f->st.batches, 1);
    assert_int_equal(f->st.launches, 1);
}

static void test_clamp_fma_fill(void **state)
{
    fx *f = *state;
    const float x[4] = { -2.0f, 0.5f, 3.0f, -0.25f };
    const float a[2] = { 1, 2 }, b[2] = { 3, 4 }, c[2] = { 0.5f, 0.5f };
    const float fa = 1.0f + 0x1p-13f, fb = 1.0f - 0x1p-13f, fc = -1.0f;
    put_f32(f->ms, 0x1000, x, 4);
    put_f16(f->ms, 0x1100, a, 2);
    put_f32(f->ms, 0x1200, b, 2);
    put_f16(f->ms, 0x1300, c, 2);
    put_f32(f->ms, 0x1400, &fa, 1);
    put_f32(f->ms, 0x1404, &fb, 1);
    put_f32(f->ms, 0x1408, &fc, 1);
    const uint8_t marker[16] = { 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
                                 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11 };
    assert_int_equal(kb_memstore_write(f->ms, 0x3000, marker, sizeof marker), 0);

    kb_rec r = kbt_rec_new(KB_REC_CLAMP, 0);
    r.imm[0] = -1.0f;
    r.imm[1] = 1.0f;
    r.src[0] = kb_opnd_make(0x1000, 1, 4, KB_F32);
    r.dst = kb_opnd_make(0x2000, 1, 4, KB_F32);
    append(f, &r);

    r = kbt_rec_new(KB_REC_FMA, 0);
    r.src[0] = kb_opnd_make(0x1100, 1, 2, KB_F16);
    r.src[1] = kb_opnd_make(0x1200, 1, 2, KB_F32);
    r.src[2] = kb_opnd_make(0x1300, 1, 2, KB_F16);
    r.dst = kb_opnd_make(0x2100, 1, 2, KB_F32);
    append(f, &r);
    /* Single rounding: (1+2^-13)(1-2^-13) - 1 = -2^-26, which a separate multiply loses. */
    r.src[0] = kb_opnd_make(0x1400, 1, 1, KB_F32);
    r.src[1] = kb_opnd_make(0x1404, 1, 1, KB_F32);
    r.src[2] = kb_opnd_make(0x1408, 1, 1, KB_F32);
    r.dst = kb_opnd_make(0x2200, 1, 1, KB_F32);
    append(f, &r);

    r = kbt_rec_new(KB_REC_FILL, 0);
    r.imm[0] = 2.5f;
    r.dst = kb_opnd_make(0x3000, 2, 2, KB_F16);
    r.dst.ld = 3; /* elements 0,1 and 3,4; element 2 and 5 keep the marker */
    append(f, &r);
    flush_ok(f);

    assert_true(get_f32(f->ms, 0x2000, 0) == -1.0f);
    assert_true(get_f32(f->ms, 0x2000, 1) == 0.5f);
    assert_true(get_f32(f->ms, 0x2000, 2) == 1.0f);
    assert_true(get_f32(f->ms, 0x2000, 3) == -0.25f);
    assert_true(get_f32(f->ms, 0x2100, 0) == 3.5f);
    assert_true(get_f32(f->ms, 0x2100, 1) == 8.5f);
    assert_true(get_f32(f->ms, 0x2200, 0) == -0x1p-26f);
    assert_int_equal(get_u16(f->ms, 0x3000, 0), 0x4100);
    assert_int_equal(get_u16(f->ms, 0x3000, 1), 0x4100);
    assert_int_equal(get_u16(f->ms, 0x3000, 2), 0x1111);
    assert_int_equal(get_u16(f->ms, 0x3000, 3), 0x4100);
    assert_int_equal(get_u16(f->ms, 0x3000, 4), 0x4100);
    assert_int_equal(get_u16(f->ms, 0x3000, 5), 0x1111);
    assert_int_equal(f->st.batches, 1);
    assert_int_equal(f->st.launches, 1); /* three elementwise kinds: one launch group */
}

/*
 * GEN: the seeded values (kb_seedgen.h) generated by the backend, element by element equal
 * to kb_seedgen_value across 4096-position blocks, a row stride that leaves gaps alone, the
 * sign variant rounded to f16, and a bad op refused.
 */
static void test_gen(void **state)
{
    fx *f = *state;
    enum { R = 3, C = 5000, LD = 5003, N = 9000 };
    const uint8_t marker[8] = { 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a };
    /* a pinned value: the generator's definition, not just agreement with itself */
    assert_true(kb_seedgen_value(1, 3, 4095, 9000) == 0x1.dp-3f);
    assert_int_equal(kb_memstore_write(f->ms, 0x10000 + 4 * (uint64_t)C, marker, 8), 0);

    kb_rec r = kbt_rec_new(KB_REC_GEN, 0);
    r.src[0].addr = 7;     /* tile0 */
    r.src[1].addr = 11;    /* i0 */
    r.src[2].addr = N;     /* n */
    r.src[0].rows = 3;     /* seed */
    r.dst = kb_opnd_make(0x10000, R, C, KB_F32);
    r.dst.ld = LD;
    append(f, &r);
    kb_rec g = kbt_rec_new(KB_REC_GEN, 1);
    g.op = KB_GEN_SIGN;
    g.src[0].addr = 2;
    g.src[1].addr = 0;
    g.src[2].addr = 64;
    g.src[0].rows = 1;
    g.src[0].cols = 4; /* ntiles: element i keeps its value on tile i % 4 */
    g.dst = kb_opnd_make(0x80000, 2, 64, KB_F16);
    append(f, &g);
    flush_ok(f);

    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++)
            if (get_f32(f->ms, 0x10000, (size_t)i * LD + j) !=
                kb_seedgen_value(3, 7 + i, 11 + j, N))
                fail_msg("GEN element (%d, %d)", i, j);
    assert_int_equal(get_u32(f->ms, 0x10000 + 4 * (uint64_t)C, 0), 0x5a5a5a5au);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 64; j++) {
            float v = kb_seedgen_value(1, 2 + i, j, 64);
            if (j % 4 != 2 + i)
                v = v < 0.0f ? -1.0f : 1.0f;
            assert_true(get_f16(f->ms, 0x80000, (size_t)i * 64 + j) == v);
        }

    /* parameters at the ends of the 64-bit range, as a log may carry them: tile and position
     * wrap (unsigned, as replay.cl computes them), and the sign rule takes the unsigned
     * remainder. Signed, position -1 kept its value on no tile instead of tile 0, and
     * INT64_MAX + 1 overflowed (UB; test-asan reports it). Found by the replay fuzz target
     * (tests/fuzz/corpus/replay/regress-gen-wrap.bin). */
    {
        static const uint64_t tile0[2] = { UINT64_MAX, UINT64_C(0x7FFFFFFFFFFFFFFF) };
        static const uint64_t i0[2] = { UINT64_MAX - 1, UINT64_C(0x7FFFFFFFFFFFFFFE) };
        const uint64_t ntiles = 3;
        for (int k = 0; k < 2; k++) {
            kb_rec w = kbt_rec_new(KB_REC_GEN, 2 + k);
            w.op = KB_GEN_SIGN;
            w.src[0].addr = tile0[k];
            w.src[1].addr = i0[k];
            w.src[2].addr = 5;
            w.src[0].rows = 9;
            w.src[0].cols = (uint32_t)ntiles;
            w.dst = kb_opnd_make(0x90000 + 0x100 * (uint64_t)k, 2, 4, KB_F32);
            append(f, &w);
        }
        flush_ok(f);
        for (int k = 0; k < 2; k++)
            for (uint64_t i = 0; i < 2; i++)
                for (uint64_t j = 0; j < 4; j++) {
                    uint64_t tile = tile0[k] + i, at = i0[k] + j; /* wrapping */
                    float v = kb_seedgen_value(9, (int64_t)tile, (int64_t)at, 5);
                    if (at % ntiles != tile)
                        v = v < 0.0f ? -1.0f : 1.0f;
                    if (get_f32(f->ms, 0x90000 + 0x100 * (uint64_t)k, (size_t)(i * 4 + j)) != v)
                        fail_msg("GEN at the range's ends: record %d element (%d, %d)", k,
                                 (int)i, (int)j);
                }
    }

    kb_rec bad = g;
    bad.op = 4;
    kb_rec *pr = &bad;
    kb_plan p;
    assert_int_equal(kb_plan_build((const kb_rec *const *)&pr, 1, &p, &f->eb), KB_ERR_INVAL);
    assert_non_null(strstr(f->eb.msg, "gen op"));
}

/*
 * GEN op KB_GEN_PAT: the benches' pattern (kb_bench_pattern) generated by the backend, pinned
 * by values computed by hand from the hash's definition, a block inside a matrix and its
 * transposed view, a term added, a store to f16; and the parameters the check refuses.
 */
static void test_gen_pattern(void **state)
{
    fx *f = *state;
    enum { R = 3, C = 7, LD = 40, DLD = 9 };
    /* pinned: h(seed 22, i) mod 17 - 8 for i = 0..7, and a position past 2^32 (its low 32
     * bits count) */
    static const int32_t want[8] = { -6, 5, 8, 0, 5, 7, -6, 3 };
    for (int i = 0; i < 8; i++)
        assert_int_equal(kb_seedgen_pattern((uint64_t)i, 22, 8), want[i]);
    assert_int_equal(kb_seedgen_pattern(UINT64_C(123456789012), 7, 1000), 523);

    for (int tr = 0; tr < 2; tr++) {
        kb_rec r = kbt_rec_new(KB_REC_GEN, (uint64_t)tr);
        r.op = KB_GEN_PAT;
        r.src[0].addr = 5;  /* row0 */
        r.src[1].addr = 11; /* col0 */
        r.src[2].addr = LD;
        r.src[0].rows = 22; /* seed */
        r.src[0].cols = 8;  /* range */
        r.src[1].rows = (uint32_t)tr;
        r.imm[0] = 0x1p-6f; /* 1 / den, den 64 */
        r.imm[1] = tr ? 1.0f : 0.0f;
        r.dst = kb_opnd_make(0x20000 + 0x1000 * (uint64_t)tr, R, C, tr ? KB_F16 : KB_F32);
        r.dst.ld = DLD;
        append(f, &r);
    }
    flush_ok(f);
    for (int tr = 0; tr < 2; tr++)
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++) {
                size_t pos = tr ? (size_t)(11 + j) * LD + 5 + i : (size_t)(5 + i) * LD + 11 + j;
                float v = (float)kb_seedgen_pattern(pos, 22, 8) / 64.0f + (tr ? 1.0f : 0.0f);
                uint64_t at = 0x20000 + 0x1000 * (uint64_t)tr;
                float got = tr ? get_f16(f->ms, at, (size_t)i * DLD + j)
                               : get_f32(f->ms, at, (size_t)i * DLD + j);
                if (got != v)
                    fail_msg("GEN pattern (transposed %d) element (%d, %d): %g, want %g", tr, i,
                             j, (double)got, (double)v);
            }

    /* refused: a scale that is no power of two (den 3), one in the subnormal range, a term
     * that is subnormal, a range past 2^24, a transpose flag of 2 */
    static const struct { float scale, add; uint32_t range, tr; } no[] = {
        { 1.0f / 3.0f, 0.0f, 8, 0 }, { 0x1p-130f, 0.0f, 8, 0 }, { 0x1p-6f, 0x1p-140f, 8, 0 },
        { 0x1p-6f, 0.0f, (1u << 24) + 1, 0 }, { 0x1p-6f, 0.0f, 8, 2 },
    };
    for (size_t k = 0; k < sizeof no / sizeof no[0]; k++) {
        kb_rec b = kbt_rec_new(KB_REC_GEN, 9);
        b.op = KB_GEN_PAT;
        b.src[0].cols = no[k].range;
        b.src[1].rows = no[k].tr;
        b.imm[0] = no[k].scale;
        b.imm[1] = no[k].add;
        b.dst = kb_opnd_make(0x30000, 1, 4, KB_F32);
        kb_rec *pr = &b;
        kb_plan p;
        assert_int_equal(kb_plan_build((const kb_rec *const *)&pr, 1, &p, &f->eb), KB_ERR_INVAL);
        assert_non_null(strstr(f->eb.msg, "gen pattern"));
    }
}

static void test_copy_convert_strided_payload(void **state)
{
    fx *f = *state;
    const float src[4] = { 1.0f, 0.1f, 65520.0f, 1.0f + 0x1p-11f };
    float m[12];
    for (int i = 0; i < 12; i++)
        m[i] = (float)i;
    put_f32(f->ms, 0x1000, src, 4);
    put_f32(f->ms, 0x1100, m, 12);

    kb_rec r = kbt_rec_new(KB_REC_COPY, 0);
    r.src[0] = kb_opnd_make(0x1000, 1, 4, KB_F32);
    r.dst = kb_opnd_make(0x2000, 1, 4, KB_F16);
    append(f, &r);
    /* The 2x2 block at row 1, col 1 of a 3x4 matrix (ld 4) into a 2x2 bf16 with ld 3. */
    r.src[0] = kb_opnd_make(0x1100 + 4 * 5, 2, 2, KB_F32);
    r.src[0].ld = 4;
    r.dst = kb_opnd_make(0x2100, 2, 2, KB_BF16);
    r.dst.ld = 3;
    append(f, &r);
    /* A host write: f16 bytes from the payload, converted to f32. */
    const uint16_t hw[3] = { 0x3C00, 0xC000, 0x3555 };
    uint64_t off;
    assert_int_equal(kb_oplog_add_payload(f->log, "xyz", 3, &off), 0);
    assert_int_equal(kb_oplog_add_payload(f->log, hw, sizeof hw, &off), 0);
    assert_int_equal(off, 8);
    r.src[0] = kb_opnd_make(off, 1, 3, KB_F16);
    r.src[0].space = KB_SPACE_PAYLOAD;
    r.dst = kb_opnd_make(0x2200, 1, 3, KB_F32);
    r.pe = UINT32_MAX;
    append(f, &r);
    /* Copying never-written memory yields the poison NaN, visibly. */
    r.src[0] = kb_opnd_make(0x9000, 1, 1, KB_F16);
    r.dst = kb_opnd_make(0x2300, 1, 1, KB_F32);
    append(f, &r);
    flush_ok(f);

    assert_int_equal(get_u16(f->ms, 0x2000, 0), 0x3C00);
    assert_int_equal(get_u16(f->ms, 0x2000, 1), 0x2E66);
    assert_int_equal(get_u16(f->ms, 0x2000, 2), 0x7C00);
    assert_int_equal(get_u16(f->ms, 0x2000, 3), 0x3C00);
    assert_int_equal(get_u16(f->ms, 0x2100, 0), 0x40A0); /* 5 */
    assert_int_equal(get_u16(f->ms, 0x2100, 1), 0x40C0); /* 6 */
    assert_int_equal(get_u16(f->ms, 0x2100, 2), 0xFFFF); /* gap untouched */
    assert_int_equal(get_u16(f->ms, 0x2100, 3), 0x4110); /* 9 */
    assert_int_equal(get_u16(f->ms, 0x2100, 4), 0x4120); /* 10 */
    assert_true(get_f32(f->ms, 0x2200, 0) == 1.0f);
    assert_true(get_f32(f->ms, 0x2200, 1) == -2.0f);
    assert_true(get_f32(f->ms, 0x2200, 2) == kb_f16_to_f32(0x3555));
    assert_int_equal(get_u32(f->ms, 0x2300, 0), 0xFFFFE000u);
    /* The source bytes were only read: the store still has exactly what was written. */
    assert_true(get_f32(f->ms, 0x1100, 5) == 5.0f);
    /* 4 KiB pages: 0x1xxx (the sources put here) and 0x2xxx (the results), nothing else;
     * device-resident results stay on the device (reads go through to it) */
    assert_int_equal(kb_memstore_pages(f->ms), f->be.ops->resident ? 1 : 2);
}

/* Broadcast copy (a row repeated) and a strided elementwise op writing in place. */
static void test_copy_broadcast_inplace(void **state)
{
    fx *f = *state;
    const float row[2] = { 7, -8 };
    float m[6] = { 1, 2, 0, 3, 4, 0 }; /* 2x2 with ld 3 */
    put_f32(f->ms, 0x1000, row, 2);
    put_f32(f->ms, 0x1100, m, 6);

    kb_rec r = kbt_rec_new(KB_REC_COPY, 0);
    r.src[0] = kb_opnd_make(0x1000, 1, 2, KB_F32);
    r.dst = kb_opnd_make(0x2000, 3, 2, KB_F16);
    append(f, &r);
    r = kbt_rec_new(KB_REC_MATH1, 1);
    r.op = KB_M1_NEG;
    r.src[0] = kb_opnd_make(0x1100, 2, 2, KB_F32);
    r.src[0].ld = 3;
    r.dst = r.src[0];
    append(f, &r);
    flush_ok(f);

    for (size_t i = 0; i < 3; i++) {
        assert_true(get_f16(f->ms, 0x2000, 2 * i) == 7.0f);
        assert_true(get_f16(f->ms, 0x2000, 2 * i + 1) == -8.0f);
    }
    const float want[6] = { -1, -2, 0, -3, -4, 0 };
    for (size_t i = 0; i < 6; i++)
        assert_true(get_f32(f->ms, 0x1100, i) == want[i]);
    assert_int_equal(f->st.batches, 1);
    assert_int_equal(f->st.launches, 1); /* two elementwise kinds: one launch group */
}

/* ------------------------------------------------------------------ planner */

static void plan_ok(const kb_rec *recs, size_t n, kb_plan *p)
{
    const kb_rec *ptrs[64];
    kb_errbuf eb;
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &recs[i];
    eb.msg[0] = '\0';
    int rc = kb_plan_build(ptrs, n, p, &eb);
    if (rc)
        print_error("plan: %s\n", eb.msg);
    assert_int_equal(rc, 0);
}

static kb_rec copy_rec(uint64_t dst, uint64_t src, uint32_t n, kb_time t, uint64_t seq)
{
    kb_rec r = kbt_rec_new(KB_REC_COPY, t);
    r.src[0] = kb_opnd_make(src, 1, n, KB_F16);
    r.dst = kb_opnd_make(dst, 1, n, KB_F16);
    r.seq = seq;
    return r;
}

static void test_plan_conflicts(void **state)
{
    (void)state;
    kb_plan p;
    kb_rec r[3];

    /* Write/write on the same bytes. */
    r[0] = copy_rec(0x100, 0x200, 4, 0, 0);
    r[1] = copy_rec(0x100, 0x300, 4, 0, 1);
    plan_ok(r, 2, &p);
    assert_int_equal(p.nbatches, 2);
    kb_plan_free(&p);
    /* One byte of overlap is enough. */
    r[1] = copy_rec(0x107, 0x300, 1, 0, 1);
    plan_ok(r, 2, &p);
    assert_int_equal(p.nbatches, 2);
    kb_plan_free(&p);
    /* Adjacent writes do not conflict, and become one written segment. */
    r[1] = copy_rec(0x108, 0x300, 4, 0, 1);
    plan_ok(r, 2, &p);
    assert_int_equal(p.nbatches, 1);
    assert_int_equal(p.nsegs, 3);
    assert_int_equal(p.segs[0].pa, 0x100);
    assert_int_equal(p.segs[0].len, 16);
    assert_int_equal(p.segs[0].written, 1);
    assert_int_equal(p.segs[1].pa, 0x200);
    assert_int_equal(p.segs[1].written, 0);
    kb_plan_free(&p);
    /* Read after write. */
    r[1] = copy_rec(0x400, 0x102, 2, 0, 1);
    plan_ok(r, 2, &p);
    assert_int_equal(p.nbatches, 2);
    kb_plan_free(&p);
    /* Write after read. */
    r[1] = copy_rec(0x204, 0x500, 4, 0, 1);
    plan_ok(r, 2, &p);
    assert_int_equal(p.nbatches, 2);
    kb_plan_free(&p);
    /* Read after read is independent. */
    r[1] = copy_rec(0x600, 0x200, 4, 0, 1);
    plan_ok(r, 2, &p);
    assert_int_equal(p.nbatches, 1);
    kb_plan_free(&p);
    /* A record reading and writing its own bytes is fine; the next reader is split off. */
    r[0] = kbt_rec_new(KB_REC_MATH1, 0);
    r[0].src[0] = kb_opnd_make(0x100, 1, 4, KB_F16);
    r[0].dst = r[0].src[0];
    r[0].seq = 0;
    r[1] = copy_rec(0x200, 0x300, 4, 0, 1);
    r[2] = copy_rec(0x400, 0x104, 2, 0, 2);
    plan_ok(r, 3, &p);
    assert_int_equal(p.nbatches, 2);
    assert_int_equal(p.batches[0].count, 2);
    assert_int_equal(p.batches[1].count, 1);
    kb_plan_free(&p);
    /* Payload sources never conflict with memory. */
    r[0] = copy_rec(0x100, 0x0, 4, 0, 0);
    r[0].src[0].space = KB_SPACE_PAYLOAD;
    r[1] = copy_rec(0x0, 0x300, 4, 0, 1);
    plan_ok(r, 2, &p);
    assert_int_equal(p.nbatches, 1);
    assert_int_equal(p.recs[0].src[0].addr, 0);
    assert_int_equal(p.recs[0].src[0].space, KB_SPACE_PAYLOAD);
    kb_plan_free(&p);
}

static void test_plan_order_and_grouping(void **state)
{
    (void)state;
    kb_plan p;
    kb_rec r[6];

    /* Given out of order; a chain on 0x100 forces the (t_start, seq) order to show. */
    r[0] = copy_rec(0x100, 0x200, 4, 30, 0);
    r[1] = copy_rec(0x100, 0x300, 4, 10, 1);
    r[2] = copy_rec(0x100, 0x400, 4, 20, 2);
    r[3] = copy_rec(0x100, 0x500, 4, 10, 3); /* tie on t_start: after seq 1 */
    plan_ok(r, 4, &p);
    assert_int_equal(p.nbatches, 4);
    const uint64_t want[4] = { 1, 3, 2, 0 };
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(p.batches[i].first, i);
        assert_int_equal(p.batches[i].count, 1);
        assert_int_equal(p.recs[i].seq, want[i]);
    }
    kb_plan_free(&p);

    /* Independent records of mixed kinds: one batch grouped by kind, stable inside a kind. */
    for (size_t i = 0; i < 6; i++) {
        kb_rec_kind k = (i % 2) ? KB_REC_COPY : KB_REC_FILL;
        r[i] = kbt_rec_new(k, (kb_time)(60 - i));
        r[i].seq = i;
        r[i].dst = kb_opnd_make(0x1000 + 0x10 * i, 1, 4, KB_F16);
        if (k == KB_REC_COPY)
            r[i].src[0] = kb_opnd_make(0x2000 + 0x10 * i, 1, 4, KB_F16);
    }
    plan_ok(r, 6, &p);
    assert_int_equal(p.nbatches, 1);
    assert_int_equal(p.batches[0].count, 6);
    const uint64_t grouped[6] = { 5, 3, 1, 4, 2, 0 }; /* copies (kind 0) first, by t_start */
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(p.recs[i].seq, grouped[i]);
    kb_plan_free(&p);
}

static void test_plan_arena(void **state)
{
    (void)state;
    kb_plan p;
    kb_rec r[3];

    r[0] = kbt_rec_new(KB_REC_MATH2, 0);
    r[0].seq = 0;
    r[0].src[0] = kb_opnd_make(0x1004, 1, 2, KB_F16);  /* [0x1004, 0x1008) */
    r[0].src[1] = kb_opnd_make(0x100C, 2, 1, KB_F32);  /* [0x100C, 0x1014) */
    r[0].dst = kb_opnd_make(0x5004, 2, 2, KB_F32);     /* [0x5004, 0x5014) */
    r[1] = copy_rec(0x500C, 0x1008, 2, 1, 1);          /* dst overlaps r0's dst: batch 2 */
    r[1].dst.dtype = KB_F32;                           /* [0x500C, 0x5014) */
    r[2] = copy_rec(0x3001, 0x1000, 2, 0, 2);          /* odd address, joins batch 1 */
    plan_ok(r, 3, &p);
    assert_int_equal(p.nbatches, 2);
    assert_int_equal(p.nsegs, 3);
    assert_int_equal(p.segs[0].pa, 0x1000);
    assert_int_equal(p.segs[0].len, 0x14);
    assert_int_equal(p.segs[0].written, 0);
    assert_int_equal(p.segs[1].pa, 0x3001);
    assert_int_equal(p.segs[1].len, 4);
    assert_int_equal(p.segs[1].written, 1);
    assert_int_equal(p.segs[2].pa, 0x5004);
    assert_int_equal(p.segs[2].len, 0x10);
    assert_int_equal(p.segs[2].written, 1);
    for (size_t i = 0; i < p.nsegs; i++) {
        assert_int_equal(p.segs[i].arena_off % 8, p.segs[i].pa % 8);
        if (i > 0)
            assert_true(p.segs[i].arena_off >= p.segs[i - 1].arena_off + p.segs[i - 1].len);
        assert_true(p.segs[i].arena_off + p.segs[i].len <= p.arena_bytes);
    }
    /* Batch 0 holds r0 (math2) and r2 (copy): copy first. */
    assert_int_equal(p.batches[0].count, 2);
    assert_int_equal(p.recs[0].seq, 2);
    assert_int_equal(p.recs[1].seq, 0);
    assert_int_equal(p.recs[2].seq, 1);
    assert_int_equal(p.recs[0].dst.addr, p.segs[1].arena_off);
    assert_int_equal(p.recs[0].src[0].addr, p.segs[0].arena_off);
    assert_int_equal(p.recs[1].src[0].addr, p.segs[0].arena_off + 4);
    assert_int_equal(p.recs[1].src[1].addr, p.segs[0].arena_off + 0xC);
    assert_int_equal(p.recs[1].dst.addr, p.segs[2].arena_off);
    assert_int_equal(p.recs[2].dst.addr, p.segs[2].arena_off + 8);
    assert_int_equal(p.recs[2].src[0].addr, p.segs[0].arena_off + 8);
    kb_plan_free(&p);

    plan_ok(r, 0, &p);
    assert_int_equal(p.nrecs, 0);
    assert_int_equal(p.nbatches, 0);
    kb_plan_free(&p);
}

static void test_plan_invalid(void **state)
{
    (void)state;
    kb_plan p;
    kb_errbuf eb;
    kb_rec r = kbt_rec_new(KB_REC_COPY, 0);
    const kb_rec *pr = &r;
    r.seq = 42;
    r.src[0] = kb_opnd_make(0, 1, 4, KB_F16);
    r.dst = kb_opnd_make(0x100, 1, 4, KB_F16);

    r.nsrc = 2;
    eb.msg[0] = '\0';
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), KB_ERR_INVAL);
    assert_non_null(strstr(eb.msg, "seq 42"));
    assert_null(p.recs);
    r.nsrc = 1;
    r.dst.space = KB_SPACE_PAYLOAD;
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), KB_ERR_INVAL);
    r.dst.space = KB_SPACE_MEM;
    r.src[0].cols = 3; /* 3 does not broadcast to 4 */
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), KB_ERR_INVAL);
    r.src[0].cols = 4;
    r.dst.dtype = KB_NDTYPES;
    assert_int_equal(kb_plan_build(&pr, 1, &p, NULL), KB_ERR_INVAL);
    r.dst.dtype = KB_F16;
    r.kind = KB_REC_NKINDS;
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), KB_ERR_INVAL);

    /* a shape whose bytes pass 2^64 (two 32-bit factors near 2^31, 4-byte elements):
     * kb_opnd_span wraps to 4, which planned a 4-byte segment for 2^64 bytes of writes
     * (found by the replay fuzz target); with 2-byte elements the same shape fits */
    r = kbt_rec_new(KB_REC_FILL, 0);
    r.seq = 7;
    r.dst = kb_opnd_make(0x1000, 0x80000001u, 1, KB_F32);
    r.dst.ld = 0x80000000u;
    assert_true(kb_opnd_span(&r.dst) == 4);
    eb.msg[0] = '\0';
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), KB_ERR_INVAL);
    assert_non_null(strstr(eb.msg, "seq 7 (fill): operand spans more than 2^64 bytes"));
    r.dst.dtype = KB_F16;
    r.dst.addr = 0;
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), 0);
    assert_true(p.arena_bytes >= kb_opnd_span(&r.dst));
    kb_plan_free(&p);

    r = kbt_rec_new(KB_REC_GEMM, 0);
    r.src[0] = kb_opnd_make(0x0, 2, 3, KB_F32);
    r.src[1] = kb_opnd_make(0x100, 2, 2, KB_F32); /* K mismatch */
    r.dst = kb_opnd_make(0x200, 2, 2, KB_F32);
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), KB_ERR_INVAL);
    assert_non_null(strstr(eb.msg, "gemm"));
    r.src[1].rows = 3;
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), 0);
    kb_plan_free(&p);

    r = kbt_rec_new(KB_REC_REDUCE, 0);
    r.src[0] = kb_opnd_make(0x0, 2, 3, KB_F32);
    r.dst = kb_opnd_make(0x200, 1, 3, KB_F32); /* axis 1 wants 2 x 1 */
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), KB_ERR_INVAL);
    r.flags = KB_REC_AXIS0;
    assert_int_equal(kb_plan_build(&pr, 1, &p, &eb), 0);
    kb_plan_free(&p);
}

static void test_flush_bad_payload(void **state)
{
    fx *f = *state;
    kb_rec r = copy_rec(0x100, 0, 4, 0, 0);
    r.src[0].space = KB_SPACE_PAYLOAD; /* 8 bytes, but the payload holds 2 */
    uint64_t off;
    assert_int_equal(kb_oplog_add_payload(f->log, "ab", 2, &off), 0);
    append(f, &r);
    assert_int_equal(kb_replay_flush(f->log, f->ms, &f->be, &f->st, &f->eb), KB_ERR_INVAL);
    assert_int_equal(kb_oplog_replayed(f->log), 0);
    assert_int_equal(kb_memstore_pages(f->ms), 0);
    assert_int_equal(f->st.flushes, 0);
}

/* A backend that fails its second batch. */
typedef struct fail_be {
    int batches;
} fail_be;

static int fb_begin(void *self, uint8_t *arena, uint64_t arena_bytes, const uint8_t *payload,
                    size_t payload_bytes, kb_errbuf *eb)
{
    (void)self; (void)arena; (void)arena_bytes; (void)payload; (void)payload_bytes; (void)eb;
    return 0;
}

static int fb_run(void *self, const kb_rec *recs, size_t n, kb_errbuf *eb)
{
    fail_be *b = self;
    (void)recs; (void)n;
    if (++b->batches == 2)
        return kb_err_set(eb, KB_ERR_DEVICE, "injected failure");
    return 0;
}

static int fb_end(void *self, uint8_t *arena, uint64_t arena_bytes, kb_errbuf *eb)
{
    (void)self; (void)eb;
    memset(arena, 0x5A, (size_t)arena_bytes); /* would corrupt the store if written back */
    return 0;
}

static void fb_destroy(void *self)
{
    (void)self;
}

static void test_flush_backend_failure(void **state)
{
    fx *f = *state;
    static const kb_backend_ops ops = { "failing", fb_begin, fb_run, fb_end, fb_destroy, NULL, NULL,
                                        KB_BACKEND_OTHER };
    fail_be fb = { 0 };
    kb_backend be = { &ops, &fb };
    const float x[4] = { 1, 2, 3, 4 };
    put_f32(f->ms, 0x1000, x, 4);
    kb_rec r = copy_rec(0x1000, 0x1008, 2, 0, 0);
    r.src[0].dtype = r.dst.dtype = KB_F32;
    append(f, &r);
    r = copy_rec(0x1008, 0x1000, 2, 1, 0);
    r.src[0].dtype = r.dst.dtype = KB_F32;
    append(f, &r);

    f->eb.msg[0] = '\0';
    assert_int_equal(kb_replay_flush(f->log, f->ms, &be, &f->st, &f->eb), KB_ERR_DEVICE);
    assert_non_null(strstr(f->eb.msg, "failing"));
    assert_non_null(strstr(f->eb.msg, "injected failure"));
    assert_int_equal(kb_oplog_replayed(f->log), 0);
    for (size_t i = 0; i < 4; i++)
        assert_true(get_f32(f->ms, 0x1000, i) == x[i]);
    assert_int_equal(f->st.flushes, 0);

    /* The same log then replays fine on ref: [1,2,3,4] -> [3,4,3,4] in two batches. */
    flush_ok(f);
    assert_true(get_f32(f->ms, 0x1000, 0) == 3.0f);
    assert_true(get_f32(f->ms, 0x1000, 1) == 4.0f);
    assert_true(get_f32(f->ms, 0x1000, 2) == 3.0f);
    assert_true(get_f32(f->ms, 0x1000, 3) == 4.0f);
    assert_int_equal(f->st.batches, 2);
    /* Nothing left: a second flush is a no-op. */
    flush_ok(f);
    assert_int_equal(f->st.flushes, 1);
}

/* Many small records: independent ones make one batch, a dependency chain one batch each. */
static void test_plan_scale(void **state)
{
    (void)state;
    enum { N = 40000 };
    kb_rec *r = malloc(N * sizeof *r);
    const kb_rec **pr = malloc(N * sizeof *pr);
    kb_plan p;
    assert_non_null(r);
    assert_non_null(pr);
    for (size_t i = 0; i < N; i++) {
        /* Scattered, interleaved dst/src addresses that never overlap. */
        uint64_t slot = (i * 7919u) % N;
        r[i] = copy_rec(0x100000 + 32 * slot, 0x100000 + 32 * slot + 16, 8, (kb_time)(i % 97), i);
        pr[i] = &r[i];
    }
    assert_int_equal(kb_plan_build(pr, N, &p, NULL), 0);
    assert_int_equal(p.nbatches, 1);
    assert_int_equal(p.nsegs, 1); /* everything is adjacent: one segment */
    assert_int_equal(p.arena_bytes, 32 * (uint64_t)N);
    kb_plan_free(&p);

    for (size_t i = 0; i < N; i++)
        r[i] = copy_rec(0x100000 + 16 * (i % 2), 0x100000 + 16 * ((i + 1) % 2), 8, (kb_time)i, i);
    assert_int_equal(kb_plan_build(pr, N, &p, NULL), 0);
    assert_int_equal(p.nbatches, N);
    kb_plan_free(&p);
    free(r);
    free(pr);
}

/*
 * 64 independent chains of 50 dependent records each, interleaved in time with uneven steps: a
 * greedy cut would start a batch at every chain's next step, level scheduling needs exactly one
 * batch per chain depth. Chain c alternates a copy A_c -> B_c and an in-place negation of B_c,
 * so each depth is one kind: 50 launches.
 */
static void test_plan_interleaved_chains(void **state)
{
    fx *f = *state;
    enum { NCH = 64, DEPTH = 50 };
    kbt_rng g = { 12345 };
    for (size_t c = 0; c < NCH; c++) {
        const float a[4] = { (float)c, (float)c + 0.5f, -(float)c, 2.0f };
        uint64_t pa = 0x10000 + 32 * c, pb = pa + 16;
        kb_time t = (kb_time)(c % 7);
        put_f32(f->ms, pa, a, 4);
        for (size_t k = 0; k < DEPTH; k++) {
            kb_rec r;
            if (k % 2 == 0) {
                r = kbt_rec_new(KB_REC_COPY, t);
                r.src[0] = kb_opnd_make(pa, 1, 4, KB_F32);
            } else {
                r = kbt_rec_new(KB_REC_MATH1, t);
                r.op = KB_M1_NEG;
                r.src[0] = kb_opnd_make(pb, 1, 4, KB_F32);
            }
            r.dst = kb_opnd_make(pb, 1, 4, KB_F32);
            append(f, &r);
            t += 1 + (kb_time)kbt_rng_below(&g, 100);
        }
    }
    size_t n = kb_oplog_count(f->log);
    const kb_rec **v = malloc(n * sizeof *v);
    kb_plan p;
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = kb_oplog_at(f->log, i);
    assert_int_equal(kb_plan_build(v, n, &p, NULL), 0);
    assert_int_equal(p.nbatches, DEPTH);
    for (size_t b = 0; b < DEPTH; b++) {
        assert_int_equal(p.batches[b].count, NCH);
        for (size_t i = 0; i < NCH; i++) { /* depth b of chain i, chains in time order */
            const kb_rec *r = &p.recs[p.batches[b].first + i];
            assert_int_equal(r->seq % DEPTH, b);
        }
    }
    kb_plan_free(&p);
    free(v);

    flush_ok(f);
    assert_int_equal(f->st.batches, DEPTH);
    assert_int_equal(f->st.launches, DEPTH);
    for (size_t c = 0; c < NCH; c++) {
        uint64_t pb = 0x10000 + 32 * c + 16;
        assert_true(get_f32(f->ms, pb, 0) == -(float)c);
        assert_true(get_f32(f->ms, pb, 1) == -((float)c + 0.5f));
        assert_true(get_f32(f->ms, pb, 2) == (float)c);
        assert_true(get_f32(f->ms, pb, 3) == -2.0f);
    }
}

static double wall_ms(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Records whose destination has no elements but 2^32 - 1 rows (0 columns) or columns (0
 * rows) do nothing and take no time: the ref backend used to walk every row, seconds per
 * record (found by the replay fuzz target; tests/fuzz/corpus/replay/regress-empty-dst.bin).
 * 16 of them took a minute; now well under the bound even in sanitizer builds. */
static void test_empty_destination(void **state)
{
    fx *f = *state;
    const float one = 1.0f;
    double t0;
    put_f32(f->ms, 0x2000, &one, 1);
    for (int i = 0; i < 16; i++) {
        kb_rec r = kbt_rec_new(i % 2 ? KB_REC_MATH1 : KB_REC_SOFTMAX, i);
        r.src[0] = kb_opnd_make(0x2000, 1, 1, KB_F32);
        r.dst = kb_opnd_make(0x1000, i % 4 < 2 ? UINT32_MAX : 0, i % 4 < 2 ? 0 : UINT32_MAX,
                             KB_F32);
        r.dst.ld = 0;
        if (r.kind == KB_REC_SOFTMAX)
            r.src[0] = r.dst; /* softmax wants equal shapes */
        append(f, &r);
    }
    t0 = wall_ms();
    flush_ok(f);
    assert_true(wall_ms() - t0 < 5000.0);
    assert_true(get_f32(f->ms, 0x2000, 0) == 1.0f);
    assert_int_equal(get_u32(f->ms, 0x1000, 0), 0xFFFFFFFFu); /* never written: poison */
}

/* Plans n records, prints the time (no assertion on it) and returns the batch count. */
static size_t timed_plan(const char *what, const kb_rec *r, size_t n)
{
    const kb_rec **pr = malloc(n * sizeof *pr);
    kb_plan p;
    assert_non_null(pr);
    for (size_t i = 0; i < n; i++)
        pr[i] = &r[i];
    double t0 = wall_ms();
    assert_int_equal(kb_plan_build(pr, n, &p, NULL), 0);
    double ms = wall_ms() - t0;
    size_t nb = p.nbatches;
    print_message("plan %s: %zu records, %zu batches, %.1f ms\n", what, n, nb, ms);
    kb_plan_free(&p);
    free(pr);
    return nb;
}

/*
 * 300 000 small records, timed (printed only). A ring: at step s rank i copies its slot s % 4 to
 * rank i + 1's slot (s + 1) % 4, so every step depends on the one before: one batch per step.
 * Then the same count of random copies over 64 MiB, which gives the level map many leaves.
 */
static void test_plan_time(void **state)
{
    (void)state;
    enum { RANKS = 256, STEPS = 1172, N = RANKS * STEPS };
    kb_rec *r = malloc(N * sizeof *r);
    kbt_rng g = { 99 };
    assert_non_null(r);
    for (size_t st = 0; st < STEPS; st++) {
        for (size_t i = 0; i < RANKS; i++) {
            size_t k = st * RANKS + i;
            uint64_t from = 0x1000000 * (uint64_t)i + 16 * (st % 4);
            uint64_t to = 0x1000000 * (uint64_t)((i + 1) % RANKS) + 16 * ((st + 1) % 4);
            r[k] = copy_rec(to, from, 8, (kb_time)(st * 1000 + kbt_rng_below(&g, 900)), k);
        }
    }
    assert_int_equal(timed_plan("ring", r, N), STEPS);
    for (size_t k = 0; k < N; k++) {
        uint64_t d = 0x4000000 + 2 * (uint64_t)kbt_rng_below(&g, UINT32_C(1) << 25);
        uint64_t a = 0x4000000 + 2 * (uint64_t)kbt_rng_below(&g, UINT32_C(1) << 25);
        r[k] = copy_rec(d, a, 1 + kbt_rng_below(&g, 32), (kb_time)k, k);
    }
    assert_true(timed_plan("random", r, N) >= 1);
    free(r);
}

/* ------------------------------------------------------------------ property test */

/* Cuts order records by epoch first: a later epoch's record runs after an earlier one it
 * conflicts with, even when it starts earlier. */
static void test_plan_cuts(void **state)
{
    (void)state;
    kb_plan p;
    kb_rec r[3];
    const kb_rec *v[3];
    const uint64_t cut1[] = { 1 }, cut2[] = { 1, 2 };

    r[0] = copy_rec(0x100, 0x200, 4, 50, 0); /* writes 0x100 at t 50 */
    r[1] = copy_rec(0x300, 0x100, 4, 10, 1); /* reads it, starting at t 10 */
    r[2] = copy_rec(0x500, 0x600, 4, 0, 2);  /* independent */
    for (int i = 0; i < 3; i++)
        v[i] = &r[i];
    /* by time: the read goes first, the write after it */
    assert_int_equal(kb_plan_build_cut(v, 3, NULL, 0, NULL, NULL, &p, NULL), 0);
    assert_int_equal(p.nbatches, 2);
    assert_int_equal(p.recs[p.batches[1].first].seq, 0);
    kb_plan_free(&p);
    /* a cut before seq 1: the write first, then the read; seq 2 still joins batch 0 */
    assert_int_equal(kb_plan_build_cut(v, 3, cut1, 1, NULL, NULL, &p, NULL), 0);
    assert_int_equal(p.nbatches, 2);
    assert_int_equal(p.batches[0].count, 2);
    assert_int_equal(p.recs[p.batches[1].first].seq, 1);
    kb_plan_free(&p);
    /* input order does not matter: epochs come from seqs */
    v[0] = &r[2];
    v[2] = &r[0];
    assert_int_equal(kb_plan_build_cut(v, 3, cut2, 2, NULL, NULL, &p, NULL), 0);
    assert_int_equal(p.nbatches, 2);
    assert_int_equal(p.recs[p.batches[1].first].seq, 1);
    kb_plan_free(&p);
}

static uint64_t log_payload(void *log, const void *bytes, size_t n)
{
    uint64_t off;
    assert_int_equal(kb_oplog_add_payload(log, bytes, n, &off), 0);
    return off;
}

/* Random records for the serial oracle, which replays whatever overlaps: small shapes, dense
 * conflicts, a payload source now and then (into log). */
static kbt_recgen gen_over(kb_oplog *log, uint64_t seed, uint64_t base, uint32_t win)
{
    kbt_recgen ge = { { seed }, base, win, 4, 6, 4, 0, 0, 5, log_payload, log };
    return ge;
}

/* Random f16 over the generator's window, in the store and in flat. */
static void fill_window(kb_memstore *ms, kbt_recgen *ge, uint8_t *flat)
{
    kbt_rand_f16(&ge->g, flat, ge->win, -1.0f, 1.0f);
    assert_int_equal(kb_memstore_write(ms, ge->base, flat, ge->win), 0);
}

static int order_cmp(const void *a, const void *b)
{
    const kb_rec *x = *(const kb_rec *const *)a, *y = *(const kb_rec *const *)b;
    if (x->t_start != y->t_start)
        return x->t_start < y->t_start ? -1 : 1;
    return x->seq < y->seq ? -1 : (x->seq > y->seq);
}

/* The oracle: every record alone, in (t_start, seq) order, on a flat copy of the window. */
static void serial_replay(const kb_oplog *log, uint8_t *flat, uint64_t base)
{
    size_t n = kb_oplog_count(log);
    const kb_rec **v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = kb_oplog_at(log, i);
    qsort(v, n, sizeof *v, order_cmp);
    for (size_t i = 0; i < n; i++) {
        kb_rec c = *v[i];
        for (unsigned s = 0; s <= c.nsrc; s++) {
            kb_opnd *o = s == 0 ? &c.dst : &c.src[s - 1];
            if (o->space == KB_SPACE_MEM)
                o->addr -= base;
        }
        kb_ref_exec(&c, flat, kb_oplog_payload(log));
    }
    free(v);
}

static int opnds_overlap(const kb_opnd *a, const kb_opnd *b)
{
    if (a->space != KB_SPACE_MEM || b->space != KB_SPACE_MEM)
        return 0;
    uint64_t sa = kb_opnd_span(a), sb = kb_opnd_span(b);
    return sa && sb && a->addr < b->addr + sb && b->addr < a->addr + sa;
}

static int recs_conflict(const kb_rec *a, const kb_rec *b)
{
    if (opnds_overlap(&a->dst, &b->dst))
        return 1;
    for (unsigned s = 0; s < b->nsrc; s++)
        if (opnds_overlap(&a->dst, &b->src[s]))
            return 1;
    for (unsigned s = 0; s < a->nsrc; s++)
        if (opnds_overlap(&b->dst, &a->src[s]))
            return 1;
    return 0;
}

static int key_less(const kb_rec *a, const kb_rec *b)
{
    return a->t_start < b->t_start || (a->t_start == b->t_start && a->seq < b->seq);
}

/*
 * Brute-force checks of a plan of the whole log; returns the largest batch size. The batch of
 * every record must be exactly one past the latest batch of the records before it in (t_start,
 * seq) order that it conflicts with (0 if none): so conflicting records are in different
 * batches, in their (t_start, seq) order, and no record could have gone earlier. With
 * stride > 1 only every stride-th record is checked against all others.
 */
static size_t check_plan(const kb_oplog *log, size_t stride)
{
    size_t n = kb_oplog_count(log);
    const kb_rec **v = malloc(n * sizeof *v);
    size_t *batch_of = malloc(n * sizeof *batch_of); /* by seq */
    char *seen = calloc(n, 1);
    kb_plan p;
    assert_non_null(v);
    assert_non_null(batch_of);
    assert_non_null(seen);
    for (size_t i = 0; i < n; i++)
        v[i] = kb_oplog_at(log, i);
    assert_int_equal(kb_plan_build(v, n, &p, NULL), 0);
    assert_int_equal(p.nrecs, n);
    size_t next = 0, largest = 0;
    for (size_t b = 0; b < p.nbatches; b++) {
        const kb_batch *bt = &p.batches[b];
        assert_int_equal(bt->first, next);
        if (bt->count > largest)
            largest = bt->count;
        assert_true(bt->count > 0);
        next += bt->count;
        for (size_t i = bt->first; i < bt->first + bt->count; i++) {
            assert_true(p.recs[i].seq < n);
            assert_false(seen[p.recs[i].seq]);
            seen[p.recs[i].seq] = 1;
            batch_of[p.recs[i].seq] = b;
            if (i > bt->first)
                assert_true(p.recs[i - 1].kind <= p.recs[i].kind);
            for (size_t j = bt->first; j < i && n <= 5000; j++)
                assert_false(recs_conflict(&p.recs[i], &p.recs[j]));
        }
    }
    assert_int_equal(next, n);
    /* The log holds the original PAs (the plan's copies have arena offsets); seq == index. */
    for (size_t j = 0; j < n; j += stride) {
        size_t want = 0;
        for (size_t i = 0; i < n; i++) {
            if (i == j || !recs_conflict(v[i], v[j]))
                continue;
            if (key_less(v[i], v[j])) {
                assert_true(batch_of[i] < batch_of[j]);
                if (batch_of[i] + 1 > want)
                    want = batch_of[i] + 1;
            } else {
                assert_true(batch_of[j] < batch_of[i]);
            }
        }
        assert_int_equal(batch_of[j], want);
    }
    kb_plan_free(&p);
    free(v);
    free(batch_of);
    free(seen);
    return largest;
}

/*
 * Random logs of n in [nmin, nmin + nspread) records with t_start in [0, tspan) over a window of
 * `win` bytes that straddles a 64 KiB page boundary: batched replay == serial replay, byte for
 * byte. Returns the largest batch seen; *recs and *batches receive totals.
 */
static size_t random_logs(uint64_t nseeds, uint32_t win, size_t nmin, uint32_t nspread,
                          kb_time tspan, size_t stride, int resident, uint64_t *recs,
                          uint64_t *batches)
{
    uint8_t *flat = malloc(win), *got = malloc(win);
    size_t largest = 0;
    assert_non_null(flat);
    assert_non_null(got);
    *recs = *batches = 0;
    for (uint64_t seed = 1; seed <= nseeds; seed++) {
        kb_oplog *log = kb_oplog_create();
        kbt_recgen g = gen_over(log, seed * 1000003u + win, 0x30000 - win / 2, win);
        kb_memstore *ms = kb_memstore_create();
        kb_backend be;
        kb_replay_stats st;
        kb_errbuf eb;
        memset(&st, 0, sizeof st);
        assert_non_null(log);
        assert_non_null(ms);
        assert_int_equal(resident ? kb_ref_backend_create_resident(&be)
                                  : kb_ref_backend_create(&be), 0);
        fill_window(ms, &g, flat);
        size_t n = nmin + kbt_rng_below(&g.g, nspread);
        for (size_t i = 0; i < n; i++) {
            kb_rec r = kbt_rand_rec(&g, (kb_time)kbt_rng_below(&g.g, (uint32_t)tspan));
            assert_int_equal(kb_oplog_append(log, &r, NULL), 0);
        }
        size_t big = check_plan(log, stride);
        if (big > largest)
            largest = big;
        eb.msg[0] = '\0';
        int rc = kb_replay_flush(log, ms, &be, &st, &eb);
        if (rc)
            print_error("seed %llu: %s\n", (unsigned long long)seed, eb.msg);
        assert_int_equal(rc, 0);
        serial_replay(log, flat, g.base);
        load(ms, g.base, got, win);
        assert_memory_equal(got, flat, win);
        assert_int_equal(st.records, n);
        assert_true(st.batches >= 1 && st.batches <= n);
        assert_true(st.launches >= st.batches);
        *recs += st.records;
        *batches += st.batches;
        be.ops->destroy(be.self);
        kb_oplog_destroy(log);
        kb_memstore_destroy(ms);
    }
    free(flat);
    free(got);
    return largest;
}

/* Dense conflicts: several hundred records over 1 KiB, 50 seeds. */
static void test_property_random_logs(void **state)
{
    (void)state;
    uint64_t recs, batches;
    random_logs(50, 1024, 300, 200, 200, 1, 0, &recs, &batches);
    assert_true(batches < recs); /* batching actually happened */
    random_logs(20, 1024, 300, 200, 200, 1, 1, &recs, &batches);
}

/* Sparse conflicts over 64 KiB: large batches, which exercise the interval sets' merging. */
static void test_property_large_batches(void **state)
{
    (void)state;
    uint64_t recs, batches;
    size_t largest = random_logs(8, 65536, 2000, 500, 2000, 3, 0, &recs, &batches);
    assert_true(largest >= 48);
    assert_true(batches * 8 < recs);
}

/*
 * Tens of thousands of records over 256 KiB: most span endpoints are distinct, which takes the
 * planner's sort-everything path for them instead of its hash table.
 */
static void test_property_many_addresses(void **state)
{
    (void)state;
    uint64_t recs, batches;
    random_logs(2, 256 * 1024, 40000, 1000, 40000, 499, 1, &recs, &batches);
    assert_true(batches * 4 < recs);
}

/*
 * Tiny copies mixed with copies spanning up to 16 KiB, so that a span covers thousands of the
 * planner's elementary intervals (the upper levels of its max tree): batched == serial, and
 * the exact batch rule holds.
 */
static void test_property_wide_spans(void **state)
{
    (void)state;
    enum { WIN = 65536, N = 2000 };
    uint8_t *flat = malloc(WIN), *got = malloc(WIN);
    assert_non_null(flat);
    assert_non_null(got);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        kbt_rng g = { seed * 7777u };
        const uint64_t base = 0x40000;
        kb_oplog *log = kb_oplog_create();
        kb_memstore *ms = kb_memstore_create();
        kb_backend be;
        kb_replay_stats st;
        memset(&st, 0, sizeof st);
        assert_non_null(log);
        assert_non_null(ms);
        /* the last seed on device-resident memory */
        assert_int_equal(seed == 3 ? kb_ref_backend_create_resident(&be)
                                   : kb_ref_backend_create(&be), 0);
        kbt_rand_f16(&g, flat, WIN, -1.0f, 1.0f);
        assert_int_equal(kb_memstore_write(ms, base, flat, WIN), 0);
        for (size_t i = 0; i < N; i++) {
            uint32_t n = kbt_rng_below(&g, 10) == 0 ? 1 + kbt_rng_below(&g, 8192)
                                                     : 1 + kbt_rng_below(&g, 4);
            uint64_t d = base + 2 * kbt_rng_below(&g, (WIN - 2 * n) / 2 + 1);
            uint64_t a = base + 2 * kbt_rng_below(&g, (WIN - 2 * n) / 2 + 1);
            kb_rec r = copy_rec(d, a, n, (kb_time)kbt_rng_below(&g, 5000), 0);
            assert_int_equal(kb_oplog_append(log, &r, NULL), 0);
        }
        check_plan(log, 1);
        assert_int_equal(kb_replay_flush(log, ms, &be, &st, NULL), 0);
        serial_replay(log, flat, base);
        load(ms, base, got, WIN);
        assert_memory_equal(got, flat, WIN);
        be.ops->destroy(be.self);
        kb_oplog_destroy(log);
        kb_memstore_destroy(ms);
    }
    free(flat);
    free(got);
}

/* Flushing in two steps gives the same memory as one flush of everything. */
static void test_incremental_flush(void **state)
{
    (void)state;
    enum { WIN = 1024 };
    uint8_t *a = malloc(WIN), *b = malloc(WIN);
    assert_non_null(a);
    assert_non_null(b);
    for (uint64_t seed = 1; seed <= 10; seed++) {
        kb_oplog *l1 = kb_oplog_create(), *l2 = kb_oplog_create();
        kbt_recgen g1 = gen_over(l1, seed, 0xFE00, WIN), g2 = gen_over(l2, seed, 0xFE00, WIN);
        kb_memstore *m1 = kb_memstore_create(), *m2 = kb_memstore_create();
        kb_backend be, rbe; /* l1 on device-resident memory (odd seeds), l2 on the plain ref */
        kb_replay_stats s1, s2;
        memset(&s1, 0, sizeof s1);
        memset(&s2, 0, sizeof s2);
        assert_int_equal(kb_ref_backend_create(&be), 0);
        if (seed & 1)
            assert_int_equal(kb_ref_backend_create_resident(&rbe), 0);
        else
            rbe = be;
        fill_window(m1, &g1, a);
        fill_window(m2, &g2, b);
        for (size_t i = 0; i < 400; i++) {
            /* The second half starts later in simulated time, as it would after a read. */
            kb_time t0 = i < 200 ? 0 : 1000;
            kb_rec r1 = kbt_rand_rec(&g1, t0 + (kb_time)kbt_rng_below(&g1.g, 1000));
            kb_rec r2 = kbt_rand_rec(&g2, t0 + (kb_time)kbt_rng_below(&g2.g, 1000));
            assert_memory_equal(&r1, &r2, sizeof r1);
            assert_int_equal(kb_oplog_append(l1, &r1, NULL), 0);
            assert_int_equal(kb_oplog_append(l2, &r2, NULL), 0);
            if (i == 199)
                assert_int_equal(kb_replay_flush(l1, m1, &rbe, &s1, NULL), 0);
        }
        assert_int_equal(kb_oplog_replayed(l1), 200);
        assert_int_equal(kb_replay_flush(l1, m1, &rbe, &s1, NULL), 0);
        assert_int_equal(kb_replay_flush(l2, m2, &be, &s2, NULL), 0);
        load(m1, g1.base, a, WIN);
        load(m2, g2.base, b, WIN);
        assert_memory_equal(a, b, WIN);
        assert_int_equal(s1.flushes, 2);
        assert_int_equal(s1.records, 400);
        assert_int_equal(s2.flushes, 1);
        assert_int_equal(s2.records, 400);
        if (seed & 1)
            rbe.ops->destroy(rbe.self);
        be.ops->destroy(be.self);
        kb_oplog_destroy(l1);
        kb_oplog_destroy(l2);
        kb_memstore_destroy(m1);
        kb_memstore_destroy(m2);
    }
    free(a);
    free(b);
}

/*
 * Flushing at a cut and flushing once over it replay the same bytes (on both store kinds),
 * with times that overlap across the cut; without the cut, the single flush orders by time
 * and (for some seeds) ends differently — what a cut exists to prevent.
 */
static void test_cut_flush(void **state)
{
    (void)state;
    enum { WIN = 1024 };
    uint8_t *a = malloc(WIN), *b = malloc(WIN), *c = malloc(WIN);
    int differed = 0;
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    for (uint64_t seed = 1; seed <= 10; seed++) {
        kb_oplog *l[3];
        kbt_recgen g[3];
        kb_memstore *m[3];
        kb_backend be, rbe; /* l[0] flushed at the cut (device-resident for odd seeds) */
        kb_replay_stats st;
        memset(&st, 0, sizeof st);
        for (int k = 0; k < 3; k++) {
            l[k] = kb_oplog_create();
            m[k] = kb_memstore_create();
            g[k] = gen_over(l[k], seed, 0xFE00, WIN);
            fill_window(m[k], &g[k], k == 0 ? a : k == 1 ? b : c);
        }
        assert_int_equal(kb_ref_backend_create(&be), 0);
        if (seed & 1)
            assert_int_equal(kb_ref_backend_create_resident(&rbe), 0);
        else
            rbe = be;
        for (size_t i = 0; i < 400; i++) {
            for (int k = 0; k < 3; k++) {
                kb_rec r = kbt_rand_rec(&g[k], (kb_time)kbt_rng_below(&g[k].g, 1000));
                assert_int_equal(kb_oplog_append(l[k], &r, NULL), 0);
            }
            if (i == 199) {
                assert_int_equal(kb_oplog_cut(l[0]), 0);
                assert_int_equal(kb_replay_flush(l[0], m[0], &rbe, &st, NULL), 0);
                assert_int_equal(kb_oplog_cut(l[1]), 0);
            }
        }
        assert_int_equal(kb_replay_flush(l[0], m[0], &rbe, &st, NULL), 0);
        assert_int_equal(kb_replay_flush(l[1], m[1], &be, &st, NULL), 0);
        assert_int_equal(kb_replay_flush(l[2], m[2], &be, &st, NULL), 0);
        load(m[0], g[0].base, a, WIN);
        load(m[1], g[1].base, b, WIN);
        load(m[2], g[2].base, c, WIN);
        assert_memory_equal(a, b, WIN);
        differed += memcmp(a, c, WIN) != 0;
        if (seed & 1)
            rbe.ops->destroy(rbe.self);
        be.ops->destroy(be.self);
        for (int k = 0; k < 3; k++) {
            kb_oplog_destroy(l[k]);
            kb_memstore_destroy(m[k]);
        }
    }
    assert_true(differed > 0);
    free(a);
    free(b);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gemm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gen_pattern, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broadcast_math2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rowwise_fast_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_math1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clamp_fma_fill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_convert_strided_payload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_broadcast_inplace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gemm, setup_resident, teardown),
        cmocka_unit_test_setup_teardown(test_softmax, setup_resident, teardown),
        cmocka_unit_test_setup_teardown(test_reduce, setup_resident, teardown),
        cmocka_unit_test_setup_teardown(test_broadcast_math2, setup_resident, teardown),
        cmocka_unit_test_setup_teardown(test_rowwise_fast_path, setup_resident, teardown),
        cmocka_unit_test_setup_teardown(test_math1, setup_resident, teardown),
        cmocka_unit_test_setup_teardown(test_clamp_fma_fill, setup_resident, teardown),
        cmocka_unit_test_setup_teardown(test_copy_convert_strided_payload, setup_resident,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_copy_broadcast_inplace, setup_resident, teardown),
        cmocka_unit_test(test_plan_conflicts),
        cmocka_unit_test(test_plan_cuts),
        cmocka_unit_test(test_plan_order_and_grouping),
        cmocka_unit_test(test_plan_arena),
        cmocka_unit_test(test_plan_invalid),
        cmocka_unit_test_setup_teardown(test_flush_bad_payload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flush_bad_payload, setup_resident, teardown),
        cmocka_unit_test_setup_teardown(test_flush_backend_failure, setup, teardown),
        cmocka_unit_test(test_plan_scale),
        cmocka_unit_test_setup_teardown(test_plan_interleaved_chains, setup, teardown),
        cmocka_unit_test(test_plan_time),
        cmocka_unit_test_setup_teardown(test_empty_destination, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_destination, setup_resident, teardown),
        cmocka_unit_test(test_property_random_logs),
        cmocka_unit_test(test_property_large_batches),
        cmocka_unit_test(test_property_many_addresses),
        cmocka_unit_test(test_property_wide_spans),
        cmocka_unit_test(test_incremental_flush),
        cmocka_unit_test(test_cut_flush),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
