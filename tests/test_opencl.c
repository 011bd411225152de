/*
 * test_opencl — the OpenCL Phase-2 backend against the reference backend, and the shared math
 * of kb_mathfn.h.
 *
 * Host-only parts (always run): kb_mathfn.h's f16/bf16 conversions equal kb_dtype.c's
 * (exhaustively for 16-bit inputs, on about 1.5 M f32 patterns for the other direction), its
 * exp/log/sin/cos/tanh stay within a few ulp of double-precision libm, and its NaN and signed
 * zero rules. Device parts (skipped with a message when there is no OpenCL device): random op
 * logs of every kind and dtype (ragged shapes, row strides, broadcasting, in-place records,
 * payload sources, odd addresses, records spanning many work-groups) replayed by ref and by
 * opencl into two memory stores must leave byte-identical memory, gemm included (1x1x1,
 * 17x33x65, 130x7x300, ... with ACC, all dtype pairs, strides); launches never exceed the
 * replay's one per kind per batch; the kb_tl_nn kinds (transpose, attention softmax with causal
 * offsets and soft-capping, gather with invalid ids, tanh/silu/softcap) on targeted shapes;
 * device listing and errors. The device is an OpenCL CPU
 * device (PoCL in CI) unless KBCL_OPENCL_WANT=gpu|any says otherwise; KBCL_OPENCL_REQUIRE=1
 * turns a missing device into a failure (scripts/gpu-smoke.sh).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_clcache.h"
#include "kb_mathfn.h"
#include "kb_seedgen.h"
#include "kb_opencl.h"
#include "kb_replay.h"
#include "kb_resident.h"
#include "kb_test_util.h"

/*
 * LeakSanitizer hook: PoCL's kernel compiler (LLVM) keeps allocations until exit by design
 * when it compiles a kernel (a cold POCL_CACHE_DIR); they are not kbcl's.
 */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libLLVM\nleak:libpocl\nleak:libclang\n";
}

/* ------------------------------------------------------------------ host-only: kb_mathfn */

static void test_conversions(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        assert_int_equal(kbt_f2u(kb_mf_h2f(h)), kbt_f2u(kb_f16_to_f32((uint16_t)h)));
        assert_int_equal(kbt_f2u(kb_mf_bf2f(h)), kbt_f2u(kb_bf16_to_f32((uint16_t)h)));
    }
    /* Every upper half with low halves around both types' rounding points, plus random bits. */
    static const uint32_t lows[] = { 0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000,
                                     0x3000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF };
    kbt_rng g = { 42 };
    for (uint32_t hi = 0; hi < 0x10000u; hi++) {
        for (size_t i = 0; i < sizeof lows / sizeof lows[0] + 10; i++) {
            uint32_t lo = i < sizeof lows / sizeof lows[0] ? lows[i]
                                                           : (uint32_t)kbt_rng_next(&g) & 0xFFFFu;
            float f = kbt_u2f(hi << 16 | lo);
            assert_int_equal(kb_mf_f2h(f), kb_f32_to_f16(f));
            assert_int_equal(kb_mf_f2bf(f), kb_f32_to_bf16(f));
        }
    }
}

/* Error of got against the exact value want, in ulp of want's f32 binade. */
static double ulp_err(float got, double want)
{
    if (isnan(want))
        return isnan(got) ? 0.0 : INFINITY;
    if (isinf(want) || isinf(got))
        return (double)got == want ? 0.0 : INFINITY;
    double a = fabs(want);
    int e;
    (void)frexp(a, &e); /* a = f 2^e, f in [0.5, 1) */
    double ulp = ldexp(1.0, e - 24);
    if (ulp < 0x1p-149)
        ulp = 0x1p-149;
    return fabs((double)got - want) / ulp;
}

typedef float (*mf1)(float);
typedef double (*ref1)(double);

static double max_err(mf1 f, ref1 r, kbt_rng *g, float lo, float hi, int n)
{
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        float x = kbt_rng_float(g, lo, hi);
        double e = ulp_err(f(x), r((double)x));
        if (e > worst)
            worst = e;
    }
    return worst;
}

static double gelu_d(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
}

static float gelu_f(float x)
{
    return kb_mf_math1(KB_MF_M1_GELU, x, 0.0f, 0.0f);
}

static double sigmoid_d(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

static float sigmoid_f(float x)
{
    return kb_mf_math1(KB_MF_M1_SIGMOID, x, 0.0f, 0.0f);
}

static double silu_d(double x)
{
    return x / (1.0 + exp(-x));
}

static float softcap30_f(float x)
{
    return kb_mf_math1(KB_MF_M1_SOFTCAP, x, 30.0f, 0.0f);
}

static double softcap30_d(double x)
{
    return 30.0 * tanh(x / 30.0);
}

static void test_math_accuracy(void **state)
{
    (void)state;
    kbt_rng g = { 7 };
    /* Measured maxima (4e5 samples): exp 0.9, sin/cos 1.45 (also at |x| ~ 1e6), tanh 2.4,
     * expm1 1.5, sigmoid 2.4, gelu 3.1 on [-1, 5] (below -1 the formula's 1 + tanh cancels),
     * log 0.93. The bounds leave a little room. */
    assert_true(max_err(kb_mf_exp, exp, &g, -103.0f, 88.7f, 200000) <= 1.0);
    assert_true(max_err(kb_mf_exp, exp, &g, -1.0f, 1.0f, 200000) <= 1.0);
    assert_true(max_err(kb_mf_sin, sin, &g, -10.0f, 10.0f, 200000) <= 1.5);
    assert_true(max_err(kb_mf_cos, cos, &g, -10.0f, 10.0f, 200000) <= 1.5);
    assert_true(max_err(kb_mf_sin, sin, &g, -1e4f, 1e4f, 200000) <= 1.5);
    assert_true(max_err(kb_mf_cos, cos, &g, -1e4f, 1e4f, 200000) <= 1.5);
    assert_true(max_err(kb_mf_tanh, tanh, &g, -10.0f, 10.0f, 200000) <= 3.0);
    assert_true(max_err(kb_mf_tanh, tanh, &g, -0.01f, 0.01f, 200000) <= 3.0);
    assert_true(max_err(kb_mf_expm1, expm1, &g, -2.0f, 2.0f, 200000) <= 2.0);
    assert_true(max_err(sigmoid_f, sigmoid_d, &g, -20.0f, 20.0f, 200000) <= 3.0);
    assert_true(max_err(gelu_f, gelu_d, &g, -1.0f, 5.0f, 200000) <= 4.0);
    /* kb_tl_nn's: silu 2.35 on [-20, 20], softcap (cap 30) 3.6 on [-200, 200] (measured) */
    assert_true(max_err(kb_mf_silu, silu_d, &g, -20.0f, 20.0f, 200000) <= 3.0);
    assert_true(max_err(softcap30_f, softcap30_d, &g, -200.0f, 200.0f, 200000) <= 4.5);
    assert_int_equal(kbt_f2u(kb_mf_silu(-INFINITY)), 0x80000000u);
    assert_true(kb_mf_silu(INFINITY) == INFINITY);
    assert_true(kb_mf_math1(KB_MF_M1_TANH, 0.5f, 0.0f, 0.0f) == kb_mf_tanh(0.5f));
    /* log over every binade, subnormals included: random bit patterns of positive floats. */
    double worst = 0.0;
    for (int i = 0; i < 400000; i++) {
        float x = kbt_u2f((uint32_t)kbt_rng_next(&g) % 0x7F800000u + 1u);
        double e = ulp_err(kb_mf_log(x), log((double)x));
        if (e > worst)
            worst = e;
    }
    assert_true(worst <= 1.0);

    /* Exact special values. */
    assert_true(kb_mf_exp(0.0f) == 1.0f);
    assert_true(kb_mf_exp(-INFINITY) == 0.0f);
    assert_true(kb_mf_exp(INFINITY) == INFINITY);
    assert_true(kb_mf_exp(89.0f) == INFINITY);
    assert_true(kb_mf_exp(-104.0f) == 0.0f);
    assert_true(kb_mf_exp(-100.0f) > 0.0f); /* subnormal, not flushed */
    assert_true(kb_mf_log(1.0f) == 0.0f);
    assert_true(kb_mf_log(0.0f) == -INFINITY);
    assert_true(kb_mf_log(-0.0f) == -INFINITY);
    assert_true(kb_mf_log(INFINITY) == INFINITY);
    assert_int_equal(kbt_f2u(kb_mf_log(-1.0f)), 0x7FC00000u);
    assert_true(kb_mf_sin(0.0f) == 0.0f);
    assert_int_equal(kbt_f2u(kb_mf_sin(-0.0f)), 0x80000000u);
    assert_true(kb_mf_cos(0.0f) == 1.0f);
    assert_int_equal(kbt_f2u(kb_mf_sin(INFINITY)), 0x7FC00000u);
    assert_true(kb_mf_tanh(20.0f) == 1.0f);
    assert_true(kb_mf_tanh(-20.0f) == -1.0f);
    assert_int_equal(kbt_f2u(kb_mf_tanh(-0.0f)), 0x80000000u);
    assert_true(kb_mf_rint(2.5f) == 2.0f);
    assert_true(kb_mf_rint(-3.5f) == -4.0f);
    assert_true(kb_mf_rint(0x1p23f + 1.0f) == 0x1p23f + 1.0f);
}

static void test_nan_and_zero_rules(void **state)
{
    (void)state;
    const float nan_a = kbt_u2f(0x7FC12345u), nan_b = kbt_u2f(0xFFC00001u);
    /* A NaN operand comes back unchanged: the first one when both are NaN. */
    assert_int_equal(kbt_f2u(kb_mf_add(nan_a, 1.0f)), 0x7FC12345u);
    assert_int_equal(kbt_f2u(kb_mf_add(1.0f, nan_b)), 0xFFC00001u);
    assert_int_equal(kbt_f2u(kb_mf_mul(nan_b, nan_a)), 0xFFC00001u);
    assert_int_equal(kbt_f2u(kb_mf_fma(1.0f, nan_a, nan_b)), 0x7FC12345u);
    assert_int_equal(kbt_f2u(kb_mf_math1(KB_MF_M1_EXP, nan_b, 0, 0)), 0xFFC00001u);
    /* A NaN made from numbers is the canonical one. */
    assert_int_equal(kbt_f2u(kb_mf_sub(INFINITY, INFINITY)), 0x7FC00000u);
    assert_int_equal(kbt_f2u(kb_mf_mul(0.0f, INFINITY)), 0x7FC00000u);
    assert_int_equal(kbt_f2u(kb_mf_div(0.0f, 0.0f)), 0x7FC00000u);
    assert_int_equal(kbt_f2u(kb_mf_math1(KB_MF_M1_SQRT, -1.0f, 0, 0)), 0x7FC00000u);
    assert_int_equal(kbt_f2u(kb_mf_math1(KB_MF_M1_RSQRT, -4.0f, 0, 0)), 0x7FC00000u);
    assert_int_equal(kbt_f2u(kb_mf_math1(KB_MF_M1_GELU, -INFINITY, 0, 0)), 0x7FC00000u);
    /* MAX/MIN ignore NaN and order -0 < +0 in either argument order. */
    assert_true(kb_mf_fmax(nan_a, 2.0f) == 2.0f);
    assert_true(kb_mf_fmin(3.0f, nan_b) == 3.0f);
    assert_int_equal(kbt_f2u(kb_mf_fmax(-0.0f, 0.0f)), 0x00000000u);
    assert_int_equal(kbt_f2u(kb_mf_fmax(0.0f, -0.0f)), 0x00000000u);
    assert_int_equal(kbt_f2u(kb_mf_fmin(-0.0f, 0.0f)), 0x80000000u);
    assert_int_equal(kbt_f2u(kb_mf_fmin(0.0f, -0.0f)), 0x80000000u);
    /* ABS and NEG are sign-bit operations, NaN included. */
    assert_int_equal(kbt_f2u(kb_mf_math1(KB_MF_M1_ABS, nan_b, 0, 0)), 0x7FC00001u);
    assert_int_equal(kbt_f2u(kb_mf_math1(KB_MF_M1_NEG, nan_a, 0, 0)), 0xFFC12345u);
    assert_int_equal(kbt_f2u(kb_mf_math1(KB_MF_M1_RELU, -0.0f, 0, 0)), 0x80000000u);
}

/* ------------------------------------------------------------------ device fixture */

typedef struct dev {
    int have, broken; /* broken: a device exists but the backend could not be created */
    int split;        /* its arena may be in more blocks than a launch binds (more launches) */
    kb_backend be;
    char desc[256];
    char why[768];
} dev;

/* The device kind the tests use: KBCL_OPENCL_WANT=gpu|any, else an OpenCL CPU device. */
static kb_cl_want want_of_env(void)
{
    const char *w = getenv("KBCL_OPENCL_WANT");
    if (w && strcmp(w, "gpu") == 0)
        return KB_CL_GPU;
    if (w && strcmp(w, "any") == 0)
        return KB_CL_ANY;
    return KB_CL_CPU;
}

static int group_setup(void **state)
{
    dev *d = calloc(1, sizeof *d);
    kb_cl_want want = want_of_env();
    kb_errbuf eb;

    if (!d)
        return -1;
    eb.msg[0] = '\0';
    int rc = kb_opencl_backend_create(want, &d->be, d->desc, sizeof d->desc, &eb);
    if (rc == 0) {
        d->have = 1;
        fprintf(stderr, "test_opencl: device %s\n", d->desc);
    } else {
        const char *req = getenv("KBCL_OPENCL_REQUIRE");
        snprintf(d->why, sizeof d->why, "%s", eb.msg);
        /* A device that exists but fails, or a required one that is missing, is an error. */
        d->broken = rc != KB_ERR_DEVICE || kb_opencl_available(want) ||
                    (req && strcmp(req, "0") != 0);
        fprintf(stderr, "test_opencl: %s: %s\n",
                d->broken ? "backend creation FAILED" : "no OpenCL device, device tests skipped",
                eb.msg);
    }
    *state = d;
    return 0;
}

static int group_teardown(void **state)
{
    dev *d = *state;
    if (d->have)
        d->be.ops->destroy(d->be.self);
    free(d);
    return 0;
}

static dev *need_device(void **state)
{
    dev *d = *state;
    if (d->broken)
        fail_msg("opencl backend: %s", d->why);
    if (!d->have)
        skip();
    return d;
}

/* ------------------------------------------------------------------ replay both ways */

typedef struct pair {
    kb_oplog *log_ref, *log_cl; /* the same records and payload, twice */
    kb_memstore *ms_ref, *ms_cl;
    kb_replay_stats st_ref, st_cl;
} pair;

static void pair_init(pair *p)
{
    memset(p, 0, sizeof *p);
    p->log_ref = kb_oplog_create();
    p->log_cl = kb_oplog_create();
    p->ms_ref = kb_memstore_create();
    p->ms_cl = kb_memstore_create();
    assert_non_null(p->log_ref);
    assert_non_null(p->log_cl);
    assert_non_null(p->ms_ref);
    assert_non_null(p->ms_cl);
}

static void pair_free(pair *p)
{
    kb_oplog_destroy(p->log_ref);
    kb_oplog_destroy(p->log_cl);
    kb_memstore_destroy(p->ms_ref);
    kb_memstore_destroy(p->ms_cl);
}

static void pair_write(pair *p, uint64_t pa, const void *data, size_t n)
{
    assert_int_equal(kb_memstore_write(p->ms_ref, pa, data, n), 0);
    assert_int_equal(kb_memstore_write(p->ms_cl, pa, data, n), 0);
}

static uint64_t pair_payload(pair *p, const void *data, size_t n)
{
    uint64_t a, b;
    assert_int_equal(kb_oplog_add_payload(p->log_ref, data, n, &a), 0);
    assert_int_equal(kb_oplog_add_payload(p->log_cl, data, n, &b), 0);
    assert_int_equal(a, b);
    return a;
}

static void pair_append(pair *p, const kb_rec *r)
{
    assert_int_equal(kb_oplog_append(p->log_ref, r, NULL), 0);
    assert_int_equal(kb_oplog_append(p->log_cl, r, NULL), 0);
}

/* Flushes both logs; returns the OpenCL launches of this flush. */
static uint64_t pair_flush(pair *p, dev *d)
{
    kb_backend ref;
    kb_errbuf eb;
    uint64_t before = kb_opencl_launches(&d->be);

    assert_int_equal(kb_ref_backend_create(&ref), 0);
    eb.msg[0] = '\0';
    int rc = kb_replay_flush(p->log_ref, p->ms_ref, &ref, &p->st_ref, &eb);
    if (rc)
        print_error("ref flush: %s\n", eb.msg);
    assert_int_equal(rc, 0);
    ref.ops->destroy(ref.self);
    eb.msg[0] = '\0';
    rc = kb_replay_flush(p->log_cl, p->ms_cl, &d->be, &p->st_cl, &eb);
    if (rc)
        print_error("opencl flush: %s\n", eb.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(p->st_ref.batches, p->st_cl.batches);
    assert_int_equal(p->st_ref.launches, p->st_cl.launches);
    uint64_t got = kb_opencl_launches(&d->be) - before;
    if (!d->split)
        assert_true(got <= p->st_cl.launches);
    return got;
}

/* Byte-for-byte comparison of [pa, pa + n) in both stores, reporting the first difference. */
static void pair_compare(pair *p, uint64_t pa, size_t n)
{
    uint8_t *a = malloc(n), *b = malloc(n);
    assert_non_null(a);
    assert_non_null(b);
    kb_errbuf eb;
    assert_int_equal(kb_memstore_load(p->ms_ref, pa, a, n, &eb), 0);
    assert_int_equal(kb_memstore_load(p->ms_cl, pa, b, n, &eb), 0); /* pulls from the device */
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i]) {
            size_t w = i & ~(size_t)3;
            uint32_t x = 0, y = 0;
            memcpy(&x, a + w, w + 4 <= n ? 4 : 1);
            memcpy(&y, b + w, w + 4 <= n ? 4 : 1);
            print_error("first difference at PA 0x%llx (+%zu): ref word %08x, opencl %08x\n",
                        (unsigned long long)(pa + i), i, x, y);
            break;
        }
    }
    assert_memory_equal(a, b, n);
    free(a);
    free(b);
}

/* ------------------------------------------------------------------ random op logs */

static uint64_t pair_payload_cb(void *p, const void *data, size_t n)
{
    return pair_payload(p, data, n);
}

/* Random records for a comparison with ref: odd addresses, payload sources, dst never partly
 * over a source (the result must not depend on the element order). */
static kbt_recgen gen_over(pair *p, uint64_t seed, uint64_t base, uint32_t win, uint32_t maxr,
                           uint32_t maxc)
{
    kbt_recgen ge = { { seed }, base, win, maxr, maxc, 2 * maxc, 1, 1, 8, pair_payload_cb, p };
    return ge;
}

static void fill_window(kbt_recgen *ge)
{
    uint8_t *buf = malloc(ge->win);
    assert_non_null(buf);
    kbt_rand_f16(&ge->g, buf, ge->win, -1.5f, 1.5f);
    pair_write(ge->ud, ge->base, buf, ge->win);
    free(buf);
}

/* nlogs random logs of nrec records; returns the total batches. */
static uint64_t random_logs(dev *d, uint64_t seed0, int nlogs, int nrec, uint32_t win,
                            uint32_t maxr, uint32_t maxc, kb_time tspan)
{
    uint64_t batches = 0;
    for (int l = 0; l < nlogs; l++) {
        pair p;
        pair_init(&p);
        kbt_recgen ge = gen_over(&p, seed0 * 7919u + (uint64_t)l,
                                 (0x400000 - win / 3) & ~(uint64_t)7, win, maxr, maxc);
        fill_window(&ge);
        for (int i = 0; i < nrec; i++) {
            kb_rec r = kbt_rand_rec(&ge, (kb_time)kbt_rng_below(&ge.g, (uint32_t)tspan));
            pair_append(&p, &r);
        }
        pair_flush(&p, d);
        pair_compare(&p, ge.base, win);
        batches += p.st_cl.batches;
        pair_free(&p);
    }
    return batches;
}

/* Small shapes, dense conflicts: long dependency chains across many batches. */
static void test_random_dense(void **state)
{
    dev *d = need_device(state);
    uint64_t batches = random_logs(d, 1, 12, 300, 4096, 5, 9, 300);
    assert_true(batches > 12 * 20);
}

/* Larger, ragged shapes (many work-groups per record) over a wide window: big batches. */
static void test_random_large(void **state)
{
    dev *d = need_device(state);
    random_logs(d, 2, 4, 200, 1u << 20, 70, 90, 1000);
}

/* ------------------------------------------------------------------ gemm shapes */

static void gemm_case(dev *d, uint32_t m, uint32_t n, uint32_t k, kb_dtype ta, kb_dtype tb,
                      kb_dtype td, int acc, uint32_t pad, int payload_a, uint64_t seed)
{
    pair p;
    kbt_rng g = { seed };
    kb_rec r = kbt_rec_new(KB_REC_GEMM, 0);
    pair_init(&p);
    r.src[0] = kb_opnd_make(0x100000, m, k, ta);
    r.src[1] = kb_opnd_make(0x800000, k, n, tb);
    r.dst = kb_opnd_make(0x1000000, m, n, td);
    r.src[0].ld = k + pad;
    r.src[1].ld = n + 2 * pad;
    r.dst.ld = n + pad;
    r.flags = acc ? KB_REC_ACC : 0;
    const kb_opnd *ops[3] = { &r.src[0], &r.src[1], &r.dst };
    for (int o = 0; o < 3; o++) {
        size_t span = (size_t)kb_opnd_span(ops[o]), es = kb_dtype_size((kb_dtype)ops[o]->dtype);
        uint8_t *buf = malloc(span + 4);
        assert_non_null(buf);
        for (size_t i = 0; i < span / es; i++)
            kbt_rand_store(&g, (kb_dtype)ops[o]->dtype, buf, i, -1.0f, 1.0f);
        if (o == 0 && payload_a) {
            r.src[0].addr = pair_payload(&p, buf, span);
            r.src[0].space = KB_SPACE_PAYLOAD;
        } else {
            pair_write(&p, ops[o]->addr, buf, span);
        }
        free(buf);
    }
    pair_append(&p, &r);
    assert_int_equal(pair_flush(&p, d), 1);
    pair_compare(&p, r.dst.addr, (size_t)kb_opnd_span(&r.dst));
    pair_free(&p);
}

/* Exact equality with ref: each output sums its products in ascending k, as ref does. */
static void test_gemm_shapes(void **state)
{
    dev *d = need_device(state);
    static const uint32_t shapes[][3] = {
        { 1, 1, 1 }, { 17, 33, 65 }, { 130, 7, 300 }, { 1, 129, 16 }, { 128, 128, 16 },
        { 129, 257, 33 }, { 5, 3, 0 }, { 64, 1, 200 }, { 200, 150, 17 },
    };
    uint64_t seed = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < KB_NDTYPES; ta++)
            for (int tb = 0; tb < KB_NDTYPES; tb++) {
                kb_dtype td = (kb_dtype)((ta + tb + (int)s) % KB_NDTYPES);
                gemm_case(d, shapes[s][0], shapes[s][1], shapes[s][2], (kb_dtype)ta,
                          (kb_dtype)tb, td, (int)((s + (size_t)ta) % 2), (uint32_t)(s % 3),
                          (int)(s % 4 == 1), seed++);
            }
    /* A larger square in the common f16 case. */
    gemm_case(d, 256, 256, 256, KB_F16, KB_F16, KB_F16, 0, 0, 0, seed++);
    gemm_case(d, 256, 256, 256, KB_F16, KB_F16, KB_F32, 1, 0, 0, seed++);
}

/* Several gemms of different shapes and dtypes in one batch: one launch. */
static void test_gemm_grouped(void **state)
{
    dev *d = need_device(state);
    pair p;
    kbt_rng g = { 99 };
    pair_init(&p);
    uint8_t *buf = malloc(1u << 20);
    assert_non_null(buf);
    for (size_t i = 0; i < (1u << 19); i++)
        kbt_rand_store(&g, KB_F16, buf, i, -1.0f, 1.0f);
    pair_write(&p, 0x100000, buf, 1u << 20);
    for (uint32_t i = 0; i < 12; i++) {
        kb_rec r = kbt_rec_new(KB_REC_GEMM, i);
        uint32_t m = 1 + 23 * i % 150, n = 1 + 37 * i % 140, k = 1 + 51 * i % 90;
        r.src[0] = kb_opnd_make(0x100000 + 0x1000 * i, m, k, (kb_dtype)(i % 3));
        r.src[1] = kb_opnd_make(0x140000 + 0x1000 * i, k, n, (kb_dtype)((i / 3) % 3));
        r.dst = kb_opnd_make(0x400000 + 0x20000 * i, m, n, (kb_dtype)((i / 2) % 3));
        r.flags = i % 2 ? KB_REC_ACC : 0;
        pair_append(&p, &r);
    }
    assert_int_equal(pair_flush(&p, d), 1);
    assert_int_equal(p.st_cl.batches, 1);
    pair_compare(&p, 0x400000, 12 * 0x20000);
    free(buf);
    pair_free(&p);
}

/* ------------------------------------------------------------------ conversions through copies */

static void test_copy_specials(void **state)
{
    dev *d = need_device(state);
    static const uint32_t bits[] = {
        0x00000000u, 0x80000000u, 0x3F800000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
        0xFFC00001u, 0x7F800001u, 0x7FBFFFFFu, 0x00000001u, 0x807FFFFFu, 0x477FF000u,
        0x477FEFFFu, 0x477FE000u, 0x33000000u, 0x33000001u, 0x337FFFFFu, 0x387FC000u,
        0x38800000u, 0x3F801000u, 0x3F803000u, 0x3F808000u, 0x3F818000u, 0x7F7FFFFFu,
        0x7F7F8000u, 0xC2F6E979u, 0x3DCCCCCDu, 0x477FFFFFu, 0x35800000u, 0xB4000000u,
    };
    enum { NB = sizeof bits / sizeof bits[0] };
    static const uint16_t h16[] = { 0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF,
                                    0x7C00, 0xFC00, 0x7C01, 0x7DFF, 0x7E00, 0xFFFF, 0xFF81,
                                    0x7F80, 0x7FC0, 0x0080, 0x8001 };
    enum { NH = sizeof h16 / sizeof h16[0] };
    pair p;
    pair_init(&p);
    pair_write(&p, 0x1000, bits, sizeof bits);
    pair_write(&p, 0x2001, h16, sizeof h16); /* odd address */
    kb_time t = 0;
    uint64_t out = 0x10000;
    for (int ts = 0; ts < KB_NDTYPES; ts++) {
        for (int td = 0; td < KB_NDTYPES; td++) {
            kb_rec r = kbt_rec_new(KB_REC_COPY, t++);
            r.src[0] = ts == KB_F32 ? kb_opnd_make(0x1000, 1, NB, KB_F32)
                                    : kb_opnd_make(0x2001, 1, NH, (kb_dtype)ts);
            r.dst = kb_opnd_make(out, 1, ts == KB_F32 ? NB : NH, (kb_dtype)td);
            pair_append(&p, &r);
            r.dst.addr += 0x401; /* and to an odd / misaligned place */
            pair_append(&p, &r);
            out += 0x1000;
        }
    }
    /* Arithmetic on the specials keeps the NaN rules. */
    for (int op = 0; op < KB_M1_NOPS; op++) {
        kb_rec r = kbt_rec_new(KB_REC_MATH1, t++);
        r.op = (uint8_t)op;
        r.imm[0] = 0.5f;
        r.imm[1] = -2.0f;
        r.src[0] = kb_opnd_make(0x1000, 1, NB, KB_F32);
        r.dst = kb_opnd_make(out, 1, NB, op % 2 ? KB_F32 : KB_F16);
        pair_append(&p, &r);
        out += 0x200;
    }
    for (int op = 0; op < KB_M2_NOPS; op++) {
        kb_rec r = kbt_rec_new(KB_REC_MATH2, t++);
        r.op = (uint8_t)op;
        r.src[0] = kb_opnd_make(0x1000, 1, NB, KB_F32);
        r.src[1] = kb_opnd_make(0x1000 + 4 * 5, 1, 1, KB_F32); /* a NaN, broadcast */
        r.dst = kb_opnd_make(out, 1, NB, KB_F32);
        pair_append(&p, &r);
        r.src[1] = kb_opnd_make(0x1000, 1, NB, KB_F32);
        r.src[0] = kb_opnd_make(0x1000 + 4 * 3, 1, 1, KB_F32); /* inf, broadcast */
        r.dst.addr += 0x100;
        pair_append(&p, &r);
        out += 0x200;
    }
    pair_flush(&p, d);
    pair_compare(&p, 0x10000, (size_t)(out - 0x10000));
    pair_free(&p);
}

/*
 * Number formats: every code of each 8-bit type (and int32 words) copied into every type, a
 * sweep of f32 values (ties, saturation, subnormals, NaN, inf) stored into each of them, and
 * DEQUANT records (dense / 2:4, with per-channel, per-token and 32-block scales): both
 * backends give the same bytes.
 */
static void test_formats(void **state)
{
    dev *d = need_device(state);
    enum { NV = 2048 };
    uint8_t codes[1024];
    float *vals = malloc(NV * sizeof *vals);
    kbt_rng g = { 21 };
    pair p;
    kb_time t = 0;
    uint64_t out = 0x40000;

    assert_non_null(vals);
    for (int i = 0; i < 1024; i++) /* every code, then random bytes */
        codes[i] = (uint8_t)(i < 256 ? (uint64_t)i : kbt_rng_next(&g));
    for (int i = 0; i < NV; i++) { /* midpoints, big, tiny and special values */
        uint32_t u = (uint32_t)kbt_rng_next(&g);
        float v = i % 4 == 0 ? kbt_rng_float(&g, -600.0f, 600.0f)
                : i % 4 == 1 ? (float)(i / 4 - 256) + 0.5f
                : i % 4 == 2 ? kbt_rng_float(&g, -1.0f, 1.0f) * 0x1p-8f : 0.0f;
        if (i % 4 == 3)
            memcpy(&v, &u, sizeof v); /* any bit pattern: NaNs, infinities, subnormals */
        vals[i] = v;
    }
    pair_init(&p);
    pair_write(&p, 0x1000, codes, sizeof codes);
    pair_write(&p, 0x2000, vals, NV * sizeof *vals);
    for (int ts = KB_I8; ts <= KB_I32; ts++) {
        for (int td = 0; td < KB_NDTYPES; td++) {
            kb_rec r = kbt_rec_new(KB_REC_COPY, t++);
            r.src[0] = kb_opnd_make(0x1000, 1, ts == KB_I32 ? 64 : 256, (kb_dtype)ts);
            r.dst = kb_opnd_make(out, 1, r.src[0].cols, (kb_dtype)td);
            pair_append(&p, &r);
            out += 0x800;
        }
    }
    for (int td = KB_I8; td <= KB_I32; td++) {
        kb_rec r = kbt_rec_new(KB_REC_COPY, t++);
        r.src[0] = kb_opnd_make(0x2000, 1, NV, KB_F32);
        r.dst = kb_opnd_make(out, 1, NV, (kb_dtype)td);
        pair_append(&p, &r);
        out += 4 * NV;
    }
    for (int k = 0; k < 12; k++) { /* DEQUANT: 64 x 16 from the codes / values */
        kb_rec r = kbt_rec_new(KB_REC_DEQUANT, t++);
        int sparse = k & 1, sk = (k >> 1) % 3;
        kb_dtype et = k % 4 < 2 ? KB_I8 : (k & 2) ? KB_FP8E4M3 : KB_FP8E5M2;
        r.nsrc = 1;
        r.imm[0] = sk == 2 ? 0x1p-6f : 1.0f;
        r.src[0] = kb_opnd_make(0x1000, sparse ? 32 : 64, 16, k > 8 ? KB_FP8E5M2 : et);
        if (sparse) {
            r.flags |= KB_REC_QSPARSE;
            r.src[r.nsrc++] = kb_opnd_make(0x1000 + 7 * k, 8, 16, KB_I8);
        }
        if (sk < 2 || k > 8) {
            r.flags |= KB_REC_QSCALE;
            r.src[r.nsrc] = sk == 0 ? kb_opnd_make(0x2000, 1, 16, KB_F32)   /* per channel */
                          : sk == 1 ? kb_opnd_make(0x2100, 64, 1, KB_F32)   /* per token */
                                    : kb_opnd_make(0x1010, 2, 16, KB_E8M0); /* 32-blocks */
            r.nsrc++;
        }
        r.dst = kb_opnd_make(out, 64, 16, k % 3 ? KB_F32 : KB_F16);
        pair_append(&p, &r);
        out += 64 * 16 * 4;
    }
    pair_flush(&p, d);
    pair_compare(&p, 0x40000, (size_t)(out - 0x40000));
    pair_free(&p);
    free(vals);
}

/*
 * Contiguous records of every length 1..41 at 8-byte aligned places (4 elements per access
 * for 16-bit types, pairs otherwise, with the odd tails), at 2-element alignment, and in place.
 */
static void test_wide_paths(void **state)
{
    dev *d = need_device(state);
    pair p;
    kbt_rng g = { 11 };
    kbt_recgen ge = gen_over(&p, 12, 0x100000, 1u << 16, 1, 1);
    pair_init(&p);
    fill_window(&ge);
    kb_time t = 0;
    uint64_t out = 0x200000;
    for (uint32_t len = 1; len <= 41; len++) {
        for (int k = 0; k < 8; k++) {
            kb_dtype ts = (kb_dtype)(k % 3), td = (kb_dtype)((k / 3 + k) % 3);
            kb_rec r = kbt_rec_new(k < 4 ? KB_REC_MATH2 : k < 6 ? KB_REC_COPY : KB_REC_FMA, t++);
            uint64_t shift = k == 7 ? 2 * kb_dtype_size(ts) : 0; /* pairs but not quads */
            r.op = (uint8_t)(k % KB_M2_NOPS);
            for (unsigned s2 = 0; s2 < r.nsrc; s2++)
                r.src[s2] = kb_opnd_make(0x100000 + 0x800 * s2 + 8 * kbt_rng_below(&g, 64) + shift,
                                         1, len, s2 == 0 ? ts : td);
            r.dst = kb_opnd_make(out + shift, 1, len, td);
            pair_append(&p, &r);
            out += 0x100;
        }
        /* In place on a 16-bit vector. */
        kb_rec r = kbt_rec_new(KB_REC_MATH1, t++);
        r.op = KB_M1_NEG;
        r.src[0] = kb_opnd_make(0x108000 + 0x100 * len, 1, len, KB_BF16);
        r.dst = r.src[0];
        pair_append(&p, &r);
    }
    pair_flush(&p, d);
    pair_compare(&p, 0x200000, (size_t)(out - 0x200000));
    pair_compare(&p, 0x100000, 1u << 16);
    pair_free(&p);
}

/* ------------------------------------------------------------------ kb_tl_nn kinds */

/*
 * The record kinds of kb_tl_nn against ref, bit for bit: ATTN_SOFTMAX (causal offsets from
 * all rows masked to none, soft-capping, rows beyond one work-group, strides, every dtype),
 * TRANSPOSE (shapes beyond one chunk, strides, dtype pairs), GATHER (valid and invalid ids,
 * 1 x n and strided n x 1 ids, every table dtype) and the new MATH1 ops over a wide range.
 */
static void test_nn_kinds(void **state)
{
    dev *d = need_device(state);
    pair p;
    kbt_rng g = { 77 };
    const uint64_t in = 0x100000, out0 = 0x400000;
    enum { WIN = 1 << 18 };
    uint8_t *buf = malloc(WIN);
    kb_time t = 0;
    uint64_t out = out0;

    assert_non_null(buf);
    pair_init(&p);
    for (size_t i = 0; i + 1 < WIN; i += 2) /* f16 scores in [-6, 6]; as f32 / bf16: anything */
        kbt_rand_store(&g, KB_F16, buf, i / 2, -6.0f, 6.0f);
    pair_write(&p, in, buf, WIN);
    {
        static const uint32_t shp[][2] = { { 1, 1 }, { 5, 9 }, { 130, 77 }, { 3, 300 } };
        static const int64_t offs[] = { 0, -3, 5, -200, INT64_MAX, INT64_MIN };
        for (size_t s = 0; s < sizeof shp / sizeof shp[0]; s++) {
            for (int k = 0; k < 12; k++) {
                kb_rec r = kbt_rec_new(KB_REC_ATTN_SOFTMAX, t++);
                kb_dtype ts = (kb_dtype)(k % 3), td = (kb_dtype)((k / 3) % 3);
                r.op = (uint8_t)(k % 6 != 5);
                r.imm[0] = 0.125f * (float)(1 + k % 3);
                r.imm[1] = k % 2 ? 20.0f : 0.0f;
                r.src[1].addr = (uint64_t)offs[k % 6];
                r.src[0] = kb_opnd_make(in + 2 * kbt_rng_below(&g, 64), shp[s][0], shp[s][1], ts);
                r.src[0].ld = shp[s][1] + (uint32_t)(k % 3);
                if (ts == KB_F32)
                    r.src[0] = kb_opnd_make(in, shp[s][0], shp[s][1], KB_F16); /* sane values */
                r.dst = kb_opnd_make(out, shp[s][0], shp[s][1], td);
                r.dst.ld = shp[s][1] + (uint32_t)(k % 2);
                pair_append(&p, &r);
                out += (kb_opnd_span(&r.dst) + 64) & ~(uint64_t)63;
            }
        }
    }
    {
        static const uint32_t shp[][2] = { { 1, 1 }, { 3, 70 }, { 70, 3 }, { 300, 50 } };
        for (size_t s = 0; s < sizeof shp / sizeof shp[0]; s++) {
            for (int k = 0; k < 9; k++) {
                kb_rec r = kbt_rec_new(KB_REC_TRANSPOSE, t++);
                r.src[0] = kb_opnd_make(in + 2 * kbt_rng_below(&g, 64), shp[s][0], shp[s][1],
                                        (kb_dtype)(k % 3));
                r.src[0].ld = shp[s][1] + (uint32_t)(k % 2);
                r.dst = kb_opnd_make(out, shp[s][1], shp[s][0], (kb_dtype)(k / 3));
                r.dst.ld = shp[s][0] + (uint32_t)(k % 3);
                pair_append(&p, &r);
                out += (kb_opnd_span(&r.dst) + 64) & ~(uint64_t)63;
            }
        }
    }
    {
        /* ids: integers below the vocabulary and invalid ones (-1, V, 2.5, NaN, 1e10) */
        enum { V = 50, D = 37, NID = 100 };
        float ids[NID * 3];
        const uint64_t ida = 0x80000;
        for (int i = 0; i < NID * 3; i++)
            ids[i] = (float)kbt_rng_below(&g, V);
        ids[3] = -1.0f;
        ids[7] = (float)V;
        ids[11] = 2.5f;
        ids[13] = NAN;
        ids[17] = 1e10f;
        pair_write(&p, ida, ids, sizeof ids);
        for (int k = 0; k < 12; k++) {
            kb_rec r = kbt_rec_new(KB_REC_GATHER, t++);
            uint32_t n = k < 6 ? NID : 1 + kbt_rng_below(&g, 20);
            r.src[0] = kb_opnd_make(in + 2 * kbt_rng_below(&g, 64), V, D, (kb_dtype)(k % 3));
            r.src[0].ld = D + (uint32_t)(k % 2) * 5;
            if (k % 2) {
                r.src[1] = kb_opnd_make(ida, 1, n, KB_F32);
            } else { /* n x 1 with a row stride of 3 */
                r.src[1] = kb_opnd_make(ida, n, 1, KB_F32);
                r.src[1].ld = 3;
            }
            r.dst = kb_opnd_make(out, n, D, (kb_dtype)((k / 3) % 3));
            pair_append(&p, &r);
            out += (kb_opnd_span(&r.dst) + 64) & ~(uint64_t)63;
        }
    }
    {
        /* the new MATH1 ops over [-40, 40] (f32 written over the f16 window's second half) */
        float xs[4096];
        for (int i = 0; i < 4096; i++)
            xs[i] = kbt_rng_float(&g, -40.0f, 40.0f);
        pair_write(&p, in + WIN / 2, xs, sizeof xs);
        for (int op = KB_M1_TANH; op <= KB_M1_SOFTCAP; op++) {
            for (int td = 0; td < 3; td++) {
                kb_rec r = kbt_rec_new(KB_REC_MATH1, t++);
                r.op = (uint8_t)op;
                r.imm[0] = 15.0f;
                r.src[0] = kb_opnd_make(in + WIN / 2, 64, 64, KB_F32);
                r.dst = kb_opnd_make(out, 64, 64, (kb_dtype)td);
                pair_append(&p, &r);
                out += (kb_opnd_span(&r.dst) + 64) & ~(uint64_t)63;
            }
        }
    }
    for (int k = 0; k < 8; k++) { /* GEN: seeded values, both variants, every float dtype */
        static const uint32_t shp[][2] = { { 1, 1 }, { 4, 5000 }, { 9, 33 }, { 2, 4097 } };
        kb_rec r = kbt_rec_new(KB_REC_GEN, t++);
        r.op = (uint8_t)(k % 2);
        r.src[0].addr = (uint64_t)k * 3;
        r.src[1].addr = (uint64_t)k * 1000;
        r.src[2].addr = 1u << 20;
        r.src[0].rows = 1 + (uint32_t)k;
        r.src[0].cols = 5;
        r.dst = kb_opnd_make(out, shp[k % 4][0], shp[k % 4][1], (kb_dtype)(k % 3));
        r.dst.ld = shp[k % 4][1] + (uint32_t)(k % 2) * 3;
        pair_append(&p, &r);
        out += (kb_opnd_span(&r.dst) + 64) & ~(uint64_t)63;
    }
    { /* GEN op 3: a quantized weight's parts generated where they replay, every format, dense
       * and 2:4, shards starting inside a copy; maps with a zero row and a transposed source */
        enum { K = 64, NB = 6 };
        uint64_t rows[K];
        kb_seedgen_col cols[NB];
        for (int i = 0; i < K; i++)
            rows[i] = i == 9 ? KB_SEEDGEN_ROW_ZERO : (uint64_t)(i * 7 % 97) + (UINT64_C(1) << 33);
        for (int j = 0; j < NB; j++)
            cols[j] = (kb_seedgen_col){ .off = (uint64_t)j * 131, .rmul = j % 2 ? 1u : 500u,
                                        .seed = 40u + (uint32_t)j, .range = j % 3 ? 8u : 300u,
                                        .inv = j % 2 ? 0x1p-6f : 0x1p-3f };
        uint64_t roff = pair_payload(&p, rows, sizeof rows);
        uint64_t coff = pair_payload(&p, cols, sizeof cols);
        for (unsigned fmt = 0; fmt < KB_MF_QF_COUNT; fmt++)
            for (unsigned sp = 0; sp < 2; sp++)
                for (unsigned part = 0; part < 3; part++) {
                    int dt = kb_seedgen_qw_dtype(fmt, part);
                    uint64_t pr = kb_seedgen_qw_rows(fmt, (int)sp, part, K);
                    if (dt < 0 || (part == KB_SEEDGEN_QW_META && !sp))
                        continue;
                    kb_rec r = kbt_rec_new(KB_REC_GEN, t++);
                    r.op = KB_GEN_QW;
                    r.nsrc = 2;
                    r.flags = sp ? KB_REC_QSPARSE : 0;
                    r.src[0] = kb_opnd_make(roff, 1, 8 * K, KB_I8);
                    r.src[1] = kb_opnd_make(coff, 1, KB_SEEDGEN_COL_BYTES * NB, KB_I8);
                    r.src[0].space = r.src[1].space = KB_SPACE_PAYLOAD;
                    r.src[2].addr = pr > 1 ? pr / 2 + 1 : 0; /* wraps into the next copy */
                    r.src[2].ld = 4;                         /* and past the last column */
                    r.src[2].rows = part;
                    r.src[2].cols = fmt;
                    r.dst = kb_opnd_make(out, (uint32_t)(pr > 1 ? pr : 2), 5, (kb_dtype)dt);
                    r.dst.ld = 7;
                    pair_append(&p, &r);
                    out += (kb_opnd_span(&r.dst) + 64) & ~(uint64_t)63;
                }
    }
    for (int k = 0; k < 6; k++) { /* GEN op 2: the benches' pattern, plain and transposed */
        static const uint32_t shp[][2] = { { 1, 1 }, { 4, 5000 }, { 9, 33 } };
        kb_rec r = kbt_rec_new(KB_REC_GEN, t++);
        r.op = KB_GEN_PAT;
        r.src[0].addr = (uint64_t)k * 7;            /* row0 */
        r.src[1].addr = UINT64_C(1) << (30 + k);    /* col0: positions past 2^32 too */
        r.src[2].addr = 6000;                       /* ld */
        r.src[0].rows = 21 + (uint32_t)k;           /* seed */
        r.src[0].cols = k % 2 ? 1000 : 8;           /* range */
        r.src[1].rows = (uint32_t)(k / 3);          /* transposed */
        r.imm[0] = k % 2 ? 0x1p-10f : 0x1p-4f;
        r.imm[1] = k == 2 ? -1.0f : 0.0f;
        r.dst = kb_opnd_make(out, shp[k % 3][0], shp[k % 3][1], (kb_dtype)(k % 3));
        pair_append(&p, &r);
        out += (kb_opnd_span(&r.dst) + 64) & ~(uint64_t)63;
    }
    assert_true(out - out0 < 0x400000);
    pair_flush(&p, d);
    pair_compare(&p, out0, (size_t)(out - out0));
    {
        /* spot checks on ref's result: the first record (1 x 1, causal, offset 0, f16) is
         * 1; the second (offset -3) masks its only element: 0 */
        uint16_t v[2];
        kb_errbuf eb;
        assert_int_equal(kb_memstore_load(p.ms_ref, out0, &v[0], 2, &eb), 0);
        assert_int_equal(kb_memstore_load(p.ms_ref, out0 + 64, &v[1], 2, &eb), 0);
        assert_int_equal(v[0], 0x3C00);
        assert_int_equal(v[1], 0x0000);
    }
    pair_free(&p);
    free(buf);
}

/* ------------------------------------------------------------------ launches and flushes */

static void test_launch_count(void **state)
{
    dev *d = need_device(state);
    pair p;
    const float x[8] = { 1, -2, 3, -4, 5, -6, 7, -8 };
    pair_init(&p);
    pair_write(&p, 0x1000, x, sizeof x);
    /* Batch 1: 3 fills, 2 copies, 1 math1 (independent): 3 elementwise kinds, one launch
     * group -> one launch of kb_ew. */
    for (int i = 0; i < 3; i++) {
        kb_rec r = kbt_rec_new(KB_REC_FILL, 0);
        r.imm[0] = (float)i;
        r.dst = kb_opnd_make(0x2000 + 0x100 * (uint64_t)i, 1, 8, KB_F16);
        pair_append(&p, &r);
    }
    for (int i = 0; i < 2; i++) {
        kb_rec r = kbt_rec_new(KB_REC_COPY, 0);
        r.src[0] = kb_opnd_make(0x1000, 1, 8, KB_F32);
        r.dst = kb_opnd_make(0x3000 + 0x100 * (uint64_t)i, 1, 8, KB_BF16);
        pair_append(&p, &r);
    }
    kb_rec r = kbt_rec_new(KB_REC_MATH1, 0);
    r.op = KB_M1_EXP;
    r.src[0] = kb_opnd_make(0x1000, 1, 8, KB_F32);
    r.dst = kb_opnd_make(0x4000, 1, 8, KB_F32);
    pair_append(&p, &r);
    /* An empty clamp touches no memory, so it joins batch 1's group; with no work it adds
     * nothing to the launch. */
    r = kbt_rec_new(KB_REC_CLAMP, 5);
    r.src[0] = kb_opnd_make(0x6000, 1, 0, KB_F32);
    r.dst = kb_opnd_make(0x6000, 1, 0, KB_F32);
    pair_append(&p, &r);
    /* Batch 2 (reads batch 1's output): a reduce. */
    r = kbt_rec_new(KB_REC_REDUCE, 5);
    r.src[0] = kb_opnd_make(0x4000, 1, 8, KB_F32);
    r.dst = kb_opnd_make(0x5000, 1, 1, KB_F32);
    pair_append(&p, &r);
    uint64_t launches = pair_flush(&p, d);
    assert_int_equal(p.st_cl.batches, 2);
    assert_int_equal(p.st_cl.launches, 2);
    assert_int_equal(launches, 2);
    pair_compare(&p, 0x2000, 0x4000);
    float sum;
    kb_errbuf eb;
    assert_int_equal(kb_memstore_load(p.ms_cl, 0x5000, &sum, sizeof sum, &eb), 0);
    assert_true(sum > 1268.0f && sum < 1268.02f); /* e^1 + e^-2 + ... + e^-8 = 1268.0066 */
    pair_free(&p);
}

/* Two flushes of one log (the second with a larger arena), then another log: same as ref. */
static void test_incremental(void **state)
{
    dev *d = need_device(state);
    pair p;
    pair_init(&p);
    kbt_recgen ge = gen_over(&p, 5, 0x80000, 8192, 6, 10);
    fill_window(&ge);
    for (int i = 0; i < 150; i++) {
        kb_rec r = kbt_rand_rec(&ge, (kb_time)i);
        pair_append(&p, &r);
    }
    pair_flush(&p, d);
    pair_compare(&p, ge.base, ge.win);
    ge.win = 65536;
    for (int i = 0; i < 150; i++) {
        kb_rec r = kbt_rand_rec(&ge, (kb_time)(1000 + i));
        pair_append(&p, &r);
    }
    pair_flush(&p, d);
    assert_int_equal(p.st_cl.flushes, 2);
    pair_compare(&p, ge.base, ge.win);
    pair_free(&p);
    random_logs(d, 3, 1, 100, 2048, 4, 4, 50);
}

/*
 * The resident arena in blocks of at most 4 KiB (KBCL_ARENA_BLOCK, read when the backend is
 * made), each one OpenCL buffer: one batch whose four FMAs each read three regions and write a
 * fourth, every region in a block of its own, binds at most four blocks per launch, so its
 * one launch group becomes four launches; a gemm reads and writes three blocks; later flushes
 * add blocks without moving anything. Every byte equals ref's.
 */
static void test_arena_blocks(void **state)
{
    dev *d0 = need_device(state), d;
    kb_errbuf eb;
    pair p;
    uint8_t buf[3000];
    kbt_rng g = { 77 };
    kb_xfer_stats x;

    (void)d0;
    memset(&d, 0, sizeof d);
    d.have = d.split = 1;
    setenv("KBCL_ARENA_BLOCK", "4K", 1);
    eb.msg[0] = '\0';
    int rc = kb_opencl_backend_create(want_of_env(), &d.be, NULL, 0, &eb);
    unsetenv("KBCL_ARENA_BLOCK");
    if (rc)
        fail_msg("backend: %s", eb.msg);
    pair_init(&p);
    for (int i = 0; i < 8; i++) { /* regions of 1500 f16 at 0x100000 + i x 64 KiB */
        kbt_rand_f16(&g, buf, sizeof buf, -2.0f, 2.0f);
        pair_write(&p, 0x100000 + 0x10000 * (uint64_t)i, buf, sizeof buf);
    }
    for (int i = 0; i < 4; i++) {
        kb_rec r = kbt_rec_new(KB_REC_FMA, 0);
        r.nsrc = 3;
        for (int k = 0; k < 3; k++)
            r.src[k] = kb_opnd_make(0x100000 + 0x10000 * (uint64_t)((i + k) % 4), 1, 1500,
                                    KB_F16);
        r.dst = kb_opnd_make(0x100000 + 0x10000 * (uint64_t)(4 + i), 1, 1500, KB_F16);
        pair_append(&p, &r);
    }
    assert_int_equal(pair_flush(&p, &d), 4);
    assert_int_equal(p.st_cl.launches, 1);
    kb_backend_xfer_stats(&d.be, &x);
    assert_int_equal(x.blocks, 8);
    assert_int_equal(x.arena_bytes, 8 * 4096);
    pair_compare(&p, 0x100000, 8 * 0x10000);
    /* gemm: dst (20 x 30 f32, a new block) = region 0 (20 x 37 f16) @ region 1 (37 x 30) */
    kb_rec gm = kbt_rec_new(KB_REC_GEMM, 1);
    gm.nsrc = 2;
    gm.src[0] = kb_opnd_make(0x100000, 20, 37, KB_F16);
    gm.src[1] = kb_opnd_make(0x110000, 37, 30, KB_F16);
    gm.dst = kb_opnd_make(0x200000, 20, 30, KB_F32);
    pair_append(&p, &gm);
    pair_flush(&p, &d);
    kb_backend_xfer_stats(&d.be, &x);
    assert_int_equal(x.blocks, 9);
    assert_int_equal(x.moves, 0);
    assert_int_equal(x.move_bytes, 0);
    pair_compare(&p, 0x200000, 20 * 30 * 4);
    pair_free(&p);
    /* random records over windows that outgrow their blocks, flush after flush */
    random_logs(&d, 17, 2, 200, 16384, 5, 9, 100);
    /* a record (as a device server's client could send) whose operand crosses from one block
     * into the next is refused before anything is launched */
    const kb_resident_ops *ops;
    void *dv;
    kb_resident_device(d.be.ops->resident(d.be.self), &ops, &dv);
    assert_int_equal(ops->block(dv, 0, 4096, &eb), 0);
    assert_int_equal(ops->block(dv, 4096, 4096, &eb), 0);
    kb_rec c = kbt_rec_new(KB_REC_COPY, 0);
    c.src[0] = kb_opnd_make(0, 1, 50, KB_F32);
    c.dst = kb_opnd_make(4000, 1, 50, KB_F32);
    assert_int_equal(d.be.ops->begin(d.be.self, NULL, 8192, NULL, 0, &eb), 0);
    assert_int_equal(d.be.ops->run_batch(d.be.self, &c, 1, &eb), KB_ERR_RANGE);
    assert_non_null(strstr(eb.msg, "not inside one block"));
    assert_int_equal(d.be.ops->end(d.be.self, NULL, 8192, &eb), KB_ERR_STATE);
    d.be.ops->destroy(d.be.self);
}

/* ------------------------------------------------------------------ program cache */

/* A backend created with mode under KBCL_CACHE_DIR=dir; its set-up figures in *su. */
static void create_cached(const char *dir, kb_cl_cache_mode mode, kb_backend *be,
                          kb_opencl_setup *su)
{
    kb_errbuf eb;
    eb.msg[0] = '\0';
    setenv("KBCL_CACHE_DIR", dir, 1);
    int rc = kb_opencl_backend_create_ex(want_of_env(), mode, be, NULL, 0, &eb);
    if (rc)
        print_error("backend: %s\n", eb.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(kb_opencl_setup_of(be, su), 0);
    assert_true(su->total_ms >= su->program_ms && su->program_ms > 0.0);
}

/* The same records replayed by be and by ref give the same bytes (a program from the cache
 * works). */
static void check_backend(kb_backend *be)
{
    dev d;
    memset(&d, 0, sizeof d);
    d.have = 1;
    d.be = *be;
    random_logs(&d, 11, 1, 60, 4096, 4, 8, 20);
}

static void test_program_cache(void **state)
{
    need_device(state);
    const char *saved = getenv("KBCL_CACHE_DIR");
    char *keep = saved ? strdup(saved) : NULL;
    char dir[300], path[600], tmpl[] = "/tmp/kbcl-progcache-XXXXXX";
    kb_backend be;
    kb_opencl_setup su;

    assert_non_null(mkdtemp(tmpl));
    snprintf(dir, sizeof dir, "%s/c", tmpl);
    /* Cold: a miss, built from source and stored; warm: a hit with the same binary. */
    create_cached(dir, KB_CL_CACHE_USE, &be, &su);
    assert_int_equal(su.cache, KB_CL_CACHE_MISS);
    assert_true(su.binary_bytes > 0);
    assert_string_equal(su.note, "");
    size_t stored = su.binary_bytes;
    snprintf(path, sizeof path, "%s", su.cache_path);
    assert_non_null(strstr(path, "/c/programs/"));
    be.ops->destroy(be.self);
    create_cached(dir, KB_CL_CACHE_USE, &be, &su);
    assert_int_equal(su.cache, KB_CL_CACHE_HIT);
    assert_int_equal(su.binary_bytes, stored);
    assert_string_equal(su.cache_path, path);
    fprintf(stderr, "test_opencl: program cache: set-up %.1f ms warm (program %.1f ms)\n",
            su.total_ms, su.program_ms);
    check_backend(&be);
    be.ops->destroy(be.self);
    /* kbcl devices says the device starts warm. */
    char list[8192];
    kb_opencl_list(list, sizeof list);
    assert_non_null(strstr(list, "program cache: hit"));
    /* An entry the driver refuses (right key, garbage binary): rebuilt from source and stored
     * again, then a hit. */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t hdr[32];
    assert_int_equal(fread(hdr, 1, 32, f), 32);
    size_t klen = hdr[8] | (size_t)hdr[9] << 8 | (size_t)hdr[10] << 16;
    char *key = calloc(1, klen + 1);
    assert_non_null(key);
    assert_int_equal(fread(key, 1, klen, f), klen);
    fclose(f);
    kb_errbuf eb;
    assert_int_equal(kb_clcache_store(dir, key, "not a program", 13, &eb), 0);
    free(key);
    create_cached(dir, KB_CL_CACHE_USE, &be, &su);
    assert_int_equal(su.cache, KB_CL_CACHE_REJECTED);
    check_backend(&be);
    be.ops->destroy(be.self);
    create_cached(dir, KB_CL_CACHE_USE, &be, &su);
    assert_int_equal(su.cache, KB_CL_CACHE_HIT);
    be.ops->destroy(be.self);
    /* Bypassed, or turned off: a source build that stores nothing. */
    create_cached(dir, KB_CL_CACHE_BYPASS, &be, &su);
    assert_int_equal(su.cache, KB_CL_CACHE_OFF);
    assert_int_equal(su.binary_bytes, 0);
    be.ops->destroy(be.self);
    char off[300];
    snprintf(off, sizeof off, "%s/elsewhere", tmpl);
    create_cached("off", KB_CL_CACHE_USE, &be, &su);
    assert_int_equal(su.cache, KB_CL_CACHE_OFF);
    assert_non_null(strstr(su.note, "KBCL_CACHE_DIR=off"));
    be.ops->destroy(be.self);
    kb_opencl_list(list, sizeof list);
    assert_non_null(strstr(list, "program cache: off"));
    assert_null(strstr(list, "program cache: hit"));
    /* REFRESH rebuilds and stores whatever is there. */
    create_cached(off, KB_CL_CACHE_REFRESH, &be, &su);
    assert_int_equal(su.cache, KB_CL_CACHE_MISS);
    be.ops->destroy(be.self);
    create_cached(off, KB_CL_CACHE_USE, &be, &su);
    assert_int_equal(su.cache, KB_CL_CACHE_HIT);
    be.ops->destroy(be.self);

    if (keep)
        setenv("KBCL_CACHE_DIR", keep, 1);
    else
        unsetenv("KBCL_CACHE_DIR");
    free(keep);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
    assert_int_equal(system(cmd), 0);
}

/* ------------------------------------------------------------------ devices */

static void test_devices(void **state)
{
    dev *d = *state;
    char buf[8192];
    int n = kb_opencl_list(buf, sizeof buf);
    assert_true(strlen(buf) > 0);
    if (n == KB_ERR_DEVICE) { /* the library was built without OpenCL */
        assert_non_null(strstr(buf, "without OpenCL"));
        assert_int_equal(kb_opencl_available(KB_CL_ANY), 0);
        skip();
    }
    assert_true(n >= 0);
    if (!d->have) {
        need_device(state);
        assert_non_null(strstr(d->why, "found"));
        skip();
    }
    assert_true(n >= 1);
    assert_non_null(strstr(buf, "platform 0:"));
    assert_non_null(strstr(buf, "device"));
    assert_int_equal(kb_opencl_available(KB_CL_ANY), 1);
    assert_non_null(strstr(d->desc, " ("));
    assert_non_null(strstr(d->desc, ", OpenCL "));
    assert_string_equal(d->be.ops->name, "opencl");
    /* Asking for a kind that is absent names what exists. */
    kb_cl_want other = kb_opencl_available(KB_CL_GPU) ? KB_CL_CPU : KB_CL_GPU;
    if (!kb_opencl_available(other)) {
        kb_backend be;
        kb_errbuf eb;
        eb.msg[0] = '\0';
        assert_int_equal(kb_opencl_backend_create(other, &be, NULL, 0, &eb), KB_ERR_DEVICE);
        assert_null(be.ops);
        assert_non_null(strstr(eb.msg, "found:"));
    }
    /* Misuse of the interface is reported, not crashed on. */
    kb_errbuf eb;
    uint8_t a[8] = { 0 };
    assert_int_equal(d->be.ops->end(d->be.self, a, sizeof a, &eb), KB_ERR_STATE);
    assert_int_equal(d->be.ops->run_batch(d->be.self, NULL, 0, &eb), KB_ERR_STATE);
    assert_int_equal(kb_opencl_launches(NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_math_accuracy),
        cmocka_unit_test(test_nan_and_zero_rules),
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_copy_specials),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_wide_paths),
        cmocka_unit_test(test_nn_kinds),
        cmocka_unit_test(test_launch_count),
        cmocka_unit_test(test_gemm_shapes),
        cmocka_unit_test(test_gemm_grouped),
        cmocka_unit_test(test_random_dense),
        cmocka_unit_test(test_random_large),
        cmocka_unit_test(test_incremental),
        cmocka_unit_test(test_arena_blocks),
        cmocka_unit_test(test_program_cache),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
