/*
 * test_dtype — f16/bf16 <-> f32 conversions: known bit patterns, every tie and rounding
 * boundary between consecutive f16 values, exhaustive round trips of all 65536 patterns, NaN
 * handling, typed load/store and kb_f16_ulp.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_dtype.h"
#include "kb_test_util.h"

/* Exact value of an f16 pattern computed independently, in double. */
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(kb_dtype_name(KB_F16), "f16");
    assert_string_equal(kb_dtype_name(KB_BF16), "bf16");
    assert_string_equal(kb_dtype_name(KB_F32), "f32");
    assert_int_equal(kb_dtype_from_name("bf16"), KB_BF16);
    assert_int_equal(kb_dtype_from_name("f32"), KB_F32);
    assert_int_equal(kb_dtype_from_name("f16"), KB_F16);
    assert_int_equal(kb_dtype_from_name("fp8"), -1); /* the formats are fp8e4m3, fp8e5m2 */
    assert_int_equal(kb_dtype_from_name(NULL), -1);
    assert_int_equal(kb_dtype_size(KB_F16), 2);
    assert_int_equal(kb_dtype_size(KB_BF16), 2);
    assert_int_equal(kb_dtype_size(KB_F32), 4);
}

static void test_f16_known(void **state)
{
    (void)state;
    assert_int_equal(kb_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(kb_f32_to_f16(-2.0f), 0xC000);
    assert_int_equal(kb_f32_to_f16(0.0f), 0x0000);
    assert_int_equal(kb_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(kb_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(kb_f32_to_f16(65519.996f), 0x7BFF);
    assert_int_equal(kb_f32_to_f16(65520.0f), 0x7C00);   /* tie with odd 65504 -> inf */
    assert_int_equal(kb_f32_to_f16(-65520.0f), 0xFC00);
    assert_int_equal(kb_f32_to_f16(1e30f), 0x7C00);
    assert_int_equal(kb_f32_to_f16(INFINITY), 0x7C00);
    assert_int_equal(kb_f32_to_f16(-INFINITY), 0xFC00);
    assert_int_equal(kb_f32_to_f16(0x1p-14f), 0x0400);    /* smallest normal */
    assert_int_equal(kb_f32_to_f16(0x1p-24f), 0x0001);    /* smallest subnormal */
    assert_int_equal(kb_f32_to_f16(0x1p-25f), 0x0000);    /* tie -> even 0 */
    assert_int_equal(kb_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(kb_f32_to_f16(3.0f * 0x1p-25f), 0x0002); /* 1.5 ulp: tie -> even 2 */
    assert_int_equal(kb_f32_to_f16(0x1p-26f), 0x0000);
    assert_int_equal(kb_f32_to_f16(-0x1p-30f), 0x8000);
    assert_int_equal(kb_f32_to_f16(kbt_u2f(0x00000001u)), 0x0000); /* f32 subnormal */
    assert_int_equal(kb_f32_to_f16(1023.0f * 0x1p-24f), 0x03FF);
    assert_int_equal(kb_f32_to_f16(1023.5f * 0x1p-24f), 0x0400);  /* tie, carries to normal */
    assert_int_equal(kb_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);       /* tie -> even */
    assert_int_equal(kb_f32_to_f16(1.0f + 3.0f * 0x1p-11f), 0x3C02); /* tie -> even 1+2^-9 */
    assert_int_equal(kb_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
    assert_int_equal(kb_f32_to_f16(2047.0f / 1024.0f + 0x1p-11f), 0x4000); /* carry to 2.0 */
    assert_int_equal(kb_f32_to_f16(0.1f), 0x2E66);
    assert_int_equal(kb_f32_to_f16(3.140625f), 0x4248);

    assert_true(kb_f16_to_f32(0x3C00) == 1.0f);
    assert_true(kb_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(kb_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(kb_f16_to_f32(0x03FF) == 1023.0f * 0x1p-24f);
    assert_true(kb_f16_to_f32(0x0400) == 0x1p-14f);
    assert_true(kb_f16_to_f32(0xC000) == -2.0f);
    assert_int_equal(kbt_f2u(kb_f16_to_f32(0x8000)), 0x80000000u);
    assert_true(isinf(kb_f16_to_f32(0x7C00)) && kb_f16_to_f32(0x7C00) > 0);
    assert_true(isinf(kb_f16_to_f32(0xFC00)) && kb_f16_to_f32(0xFC00) < 0);
}

static void test_f16_nan(void **state)
{
    (void)state;
    assert_int_equal(kb_f32_to_f16(NAN) & 0x7E00, 0x7E00);
    assert_int_equal(kb_f32_to_f16(-NAN) & 0xFE00, 0xFE00);
    /* A signalling f32 NaN whose payload lives only in the low bits must stay a NaN. */
    assert_int_equal(kb_f32_to_f16(kbt_u2f(0x7F800001u)), 0x7E00);
    assert_int_equal(kb_f32_to_f16(kbt_u2f(0xFFA02000u)), 0xFE01 | 0x0100);
    assert_int_equal(kbt_f2u(kb_f16_to_f32(0x7E00)), 0x7FC00000u);
    assert_int_equal(kbt_f2u(kb_f16_to_f32(0x7C01)), 0x7FC02000u); /* quieted */
    assert_int_equal(kbt_f2u(kb_f16_to_f32(0xFE05)), 0xFFC0A000u);
}

static void test_f16_exhaustive_roundtrip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536u; h++) {
        float f = kb_f16_to_f32((uint16_t)h);
        uint16_t back = kb_f32_to_f16(f);
        if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu)) {
            assert_true(isnan(f));
            assert_int_equal(back, h | 0x200u); /* NaNs come back quiet, payload kept */
            continue;
        }
        assert_int_equal(back, h);
        if ((h & 0x7C00u) != 0x7C00u)
            assert_true((double)f == f16_value((uint16_t)h));
    }
}

/* Every midpoint between consecutive finite f16 values, and its two f32 neighbours. */
static void test_f16_all_ties(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x7BFFu; h++) {
        for (uint32_t sign = 0; sign <= 0x8000u; sign += 0x8000u) {
            double a = f16_value((uint16_t)h), b = f16_value((uint16_t)(h + 1));
            float mid = (float)((a + b) / 2.0); /* exact: one more significand bit */
            if (sign)
                mid = -mid;
            assert_true(fabs((double)mid) == (a + b) / 2.0);
            uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
            assert_int_equal(kb_f32_to_f16(mid), even | sign);
            assert_int_equal(kb_f32_to_f16(nextafterf(mid, 0.0f)), h | sign);
            assert_int_equal(kb_f32_to_f16(nextafterf(mid, sign ? -INFINITY : INFINITY)),
                             (h + 1) | sign);
        }
    }
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(kb_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(kb_f32_to_bf16(-1.0f), 0xBF80);
    assert_int_equal(kb_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);        /* tie -> even */
    assert_int_equal(kb_f32_to_bf16(1.0f + 3.0f * 0x1p-8f), 0x3F82); /* tie -> even */
    assert_int_equal(kb_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
    assert_int_equal(kb_f32_to_bf16(kbt_u2f(0x7F7F0000u)), 0x7F7F);   /* largest finite */
    assert_int_equal(kb_f32_to_bf16(kbt_u2f(0x7F7F7FFFu)), 0x7F7F);
    assert_int_equal(kb_f32_to_bf16(kbt_u2f(0x7F7F8000u)), 0x7F80);   /* tie, odd -> inf */
    assert_int_equal(kb_f32_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(kb_f32_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(kb_f32_to_bf16(0x1p-133f), 0x0001); /* subnormal kept */
    assert_int_equal(kb_f32_to_bf16(kbt_u2f(0x00008000u)), 0x0000); /* tie -> even 0 */
    assert_int_equal(kb_f32_to_bf16(kbt_u2f(0x00018000u)), 0x0002);
    assert_int_equal(kb_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(kb_f32_to_bf16(kbt_u2f(0x7F800001u)), 0x7FC0); /* NaN stays NaN */
    assert_int_equal(kb_f32_to_bf16(kbt_u2f(0xFF812345u)), 0xFFC1);
    assert_true(kb_bf16_to_f32(0x3F80) == 1.0f);
    assert_true(kb_bf16_to_f32(0x4049) == 3.140625f);
    assert_int_equal(kbt_f2u(kb_bf16_to_f32(0x7F81)), 0x7FC10000u);

    for (uint32_t h = 0; h < 65536u; h++) {
        float f = kb_bf16_to_f32((uint16_t)h);
        uint16_t back = kb_f32_to_bf16(f);
        if ((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu)) {
            assert_true(isnan(f));
            assert_int_equal(back, h | 0x40u);
        } else {
            assert_int_equal(back, h);
            assert_int_equal(kbt_f2u(f), h << 16);
        }
    }
}

static void test_load_store(void **state)
{
    (void)state;
    unsigned char buf[16];
    memset(buf, 0xAB, sizeof buf);
    kb_dtype_store(KB_F16, buf, 3, 1.0f + 0x1p-11f + 0x1p-20f);
    assert_int_equal(buf[6], 0x01);
    assert_int_equal(buf[7], 0x3C);
    assert_int_equal(buf[5], 0xAB);
    assert_int_equal(buf[8], 0xAB);
    assert_true(kb_dtype_load(KB_F16, buf, 3) == 1.0f + 0x1p-10f);

    kb_dtype_store(KB_BF16, buf, 0, -1.0f);
    assert_int_equal(buf[0], 0x80);
    assert_int_equal(buf[1], 0xBF);
    assert_true(kb_dtype_load(KB_BF16, buf, 0) == -1.0f);

    kb_dtype_store(KB_F32, buf, 2, 0.1f);
    assert_true(kb_dtype_load(KB_F32, buf, 2) == 0.1f);
    assert_int_equal(kbt_f2u(kb_dtype_load(KB_F32, buf, 2)), 0x3DCCCCCDu);
    /* Unaligned base pointers are fine. */
    kb_dtype_store(KB_F32, buf + 1, 0, -3.5f);
    assert_true(kb_dtype_load(KB_F32, buf + 1, 0) == -3.5f);
}

static void test_ulp(void **state)
{
    (void)state;
    assert_true(kb_f16_ulp(1.0f) == 0x1p-10f);
    assert_true(kb_f16_ulp(1.99f) == 0x1p-10f);
    assert_true(kb_f16_ulp(2.0f) == 0x1p-9f);
    assert_true(kb_f16_ulp(-3.0f) == 0x1p-9f);
    assert_true(kb_f16_ulp(0.75f) == 0x1p-11f);
    assert_true(kb_f16_ulp(65504.0f) == 32.0f);
    assert_true(kb_f16_ulp(0x1p-14f) == 0x1p-24f);
    assert_true(kb_f16_ulp(1e-6f) == 0x1p-24f);
    assert_true(kb_f16_ulp(0.0f) == 0x1p-24f);
    /* The ulp is the gap to the next f16 value for every positive finite normal f16. */
    for (uint16_t h = 0x0400; h < 0x7BFF; h++)
        assert_true(kb_f16_ulp(kb_f16_to_f32(h)) == kb_f16_to_f32((uint16_t)(h + 1)) -
                                                       kb_f16_to_f32(h));
}

/*
 * The bulk conversions give the scalar ones' bits: every 16-bit pattern loaded; stored, every
 * upper half of an f32 with low halves around both rounding points and random ones (about
 * 2.2 M patterns, each f16/bf16 tie and subnormal boundary among them), at offsets and
 * lengths that leave scalar remainders; the 1-byte formats' every code and 65 536 f32 upper
 * halves. (Every one of the 2^32 f32 patterns was checked once for f16 by a standalone run;
 * it takes ~20 s.)
 */
static void test_bulk(void **state)
{
    enum { N = 65536 };
    static const uint32_t lows[] = { 0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000,
                                     0x3000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF };
    const size_t nl = sizeof lows / sizeof lows[0] + 20;
    float *src = malloc(N * sizeof *src), *got = malloc(N * sizeof *got);
    uint16_t *h = malloc(N * 2), *ref16 = malloc(N * 2), *bulk = malloc((N + 3) * 2);
    kbt_rng g = { 5 };
    (void)state;
    assert_non_null(src);
    assert_non_null(got);
    assert_non_null(h);
    assert_non_null(ref16);
    assert_non_null(bulk);
    for (uint32_t i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    for (int t = 0; t < 2; t++) {
        kb_dtype dt = t ? KB_BF16 : KB_F16;
        kb_dtype_load_n(dt, h, 0, got, N);
        for (uint32_t i = 0; i < N; i++)
            assert_int_equal(kbt_f2u(got[i]), kbt_f2u(kb_dtype_load(dt, h, i)));
        kb_dtype_load_n(dt, h, 3, got, 37); /* an offset and a scalar tail */
        for (uint32_t i = 0; i < 37; i++)
            assert_int_equal(kbt_f2u(got[i]), kbt_f2u(kb_dtype_load(dt, h, 3 + i)));
        for (size_t l = 0; l < nl; l++) {
            uint32_t lo = l < sizeof lows / sizeof lows[0] ? lows[l] : 0;
            for (uint32_t hi = 0; hi < N; hi++)
                src[hi] = kbt_u2f(hi << 16 | (l < sizeof lows / sizeof lows[0]
                                                  ? lo
                                                  : (uint32_t)kbt_rng_next(&g) & 0xFFFFu));
            size_t at = l % 3, n = N - (l % 7);
            kb_dtype_store_n(dt, bulk, at, src, n);
            for (size_t i = 0; i < n; i++)
                kb_dtype_store(dt, ref16, i, src[i]);
            assert_memory_equal(bulk + at, ref16, n * 2);
        }
    }
    kb_dtype_store_n(KB_F32, got, 1, src, 5);
    assert_memory_equal(got + 1, src, 5 * sizeof *src);
    kb_dtype_load_n(KB_F32, src, 2, got, 7);
    assert_memory_equal(got, src + 2, 7 * sizeof *src);
    /* the 1-byte formats: every code loaded, and every upper half of an f32 (random low
     * halves) stored, at an offset, give the scalar conversions' bytes */
    static const kb_dtype bytes[] = { KB_I8, KB_FP8E4M3, KB_FP8E5M2, KB_E8M0 };
    uint8_t *b8 = (uint8_t *)h, *r8 = (uint8_t *)ref16;
    for (size_t t = 0; t < sizeof bytes / sizeof bytes[0]; t++) {
        for (uint32_t i = 0; i < 256; i++)
            b8[i] = (uint8_t)i;
        kb_dtype_load_n(bytes[t], b8, 1, got, 255);
        for (uint32_t i = 0; i < 255; i++)
            assert_int_equal(kbt_f2u(got[i]), kbt_f2u(kb_dtype_load(bytes[t], b8, 1 + i)));
        for (uint32_t hi = 0; hi < N; hi++)
            src[hi] = kbt_u2f(hi << 16 | ((uint32_t)kbt_rng_next(&g) & 0xFFFFu));
        kb_dtype_store_n(bytes[t], b8, 2, src, N - 2);
        for (size_t i = 0; i < N - 2; i++)
            kb_dtype_store(bytes[t], r8, i, src[i]);
        assert_memory_equal(b8 + 2, r8, N - 2);
    }
    free(src);
    free(got);
    free(h);
    free(ref16);
    free(bulk);
}

/* ------------------------------------------------------------------ number formats */

static void test_fmt_names_sizes(void **state)
{
    static const char *const nm[] = { "i8", "fp8e4m3", "fp8e5m2", "e8m0", "i32" };
    static const size_t sz[] = { 1, 1, 1, 1, 4 };
    (void)state;
    for (int t = KB_I8; t <= KB_I32; t++) {
        assert_string_equal(kb_dtype_name((kb_dtype)t), nm[t - KB_I8]);
        assert_int_equal(kb_dtype_from_name(nm[t - KB_I8]), t);
        assert_int_equal(kb_dtype_size((kb_dtype)t), sz[t - KB_I8]);
    }
    assert_int_equal(KB_NDTYPES, 8);
}

/* Every code of each 8-bit format decodes and encodes back to itself (NaNs included). */
static void test_fmt_roundtrip_all_codes(void **state)
{
    (void)state;
    for (unsigned c = 0; c < 256; c++) {
        uint8_t b = (uint8_t)c;
        assert_int_equal(kb_f32_to_i8(kb_i8_to_f32(b)), b);
        assert_int_equal(kb_f32_to_e4m3(kb_e4m3_to_f32(b)), b);
        assert_int_equal(kb_f32_to_e5m2(kb_e5m2_to_f32(b)), b);
        if (c > 0) /* e8m0 0x00 is 2^-127, an f32 subnormal: it stores back as 0x00 too */
            assert_int_equal(kb_f32_to_e8m0(kb_e8m0_to_f32(b)), b);
        for (int t = KB_I8; t <= KB_E8M0; t++) { /* the dtype paths agree */
            uint8_t buf[1] = { b }, out[1];
            float v = kb_dtype_load((kb_dtype)t, buf, 0);
            kb_dtype_store((kb_dtype)t, out, 0, v);
            assert_int_equal(out[0], b);
        }
    }
    assert_int_equal(kb_f32_to_e8m0(kb_e8m0_to_f32(0)), 0);
}

static void test_fmt_values(void **state)
{
    (void)state;
    /* int8: two's complement */
    assert_true(kb_i8_to_f32(0x80) == -128.0f && kb_i8_to_f32(0x7F) == 127.0f);
    assert_true(kb_i8_to_f32(0xFF) == -1.0f);
    /* e4m3: bias 7, max 448 = S.1111.110, min subnormal 2^-9, NaN S.1111.111 */
    assert_true(kb_e4m3_to_f32(0x7E) == 448.0f && kb_e4m3_to_f32(0xFE) == -448.0f);
    assert_true(kb_e4m3_to_f32(0x01) == 0x1p-9f && kb_e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(kb_e4m3_to_f32(0x38) == 1.0f);
    assert_true(isnan(kb_e4m3_to_f32(0x7F)) && isnan(kb_e4m3_to_f32(0xFF)));
    assert_true(kb_e4m3_to_f32(0x80) == 0.0f && signbit(kb_e4m3_to_f32(0x80)));
    /* e5m2: bias 15, max 57344 = S.11110.11, inf S.11111.00 */
    assert_true(kb_e5m2_to_f32(0x7B) == 57344.0f && kb_e5m2_to_f32(0x3C) == 1.0f);
    assert_true(kb_e5m2_to_f32(0x01) == 0x1p-16f && isinf(kb_e5m2_to_f32(0x7C)));
    assert_true(isnan(kb_e5m2_to_f32(0x7D)) && isnan(kb_e5m2_to_f32(0xFF)));
    /* e8m0: 2^(e - 127), 0xFF NaN */
    assert_true(kb_e8m0_to_f32(127) == 1.0f && kb_e8m0_to_f32(0) == 0x1p-127f);
    assert_true(kb_e8m0_to_f32(254) == 0x1p127f && isnan(kb_e8m0_to_f32(255)));
}

/* Round to nearest even at the midpoints; saturation to the largest finite value. */
static void test_fmt_rounding(void **state)
{
    (void)state;
    /* int8 */
    assert_int_equal(kb_f32_to_i8(2.5f), 2);
    assert_int_equal(kb_f32_to_i8(3.5f), 4);
    assert_int_equal(kb_f32_to_i8(-2.5f), 0xFE);
    assert_int_equal(kb_f32_to_i8(-0.5f), 0);
    assert_int_equal(kb_f32_to_i8(0.5000001f), 1);
    assert_int_equal(kb_f32_to_i8(127.5f), 127);   /* 128 saturates */
    assert_int_equal(kb_f32_to_i8(1e9f), 127);
    assert_int_equal(kb_f32_to_i8(-128.5f), 0x80); /* -128 is in range */
    assert_int_equal(kb_f32_to_i8(-1e9f), 0x80);
    assert_int_equal(kb_f32_to_i8(INFINITY), 127);
    assert_int_equal(kb_f32_to_i8(NAN), 0);
    /* e4m3 between 1 (0x38) and 1.125 (0x39): the midpoint goes to the even 0x38; between
     * 1.125 and 1.25 (0x3A) to 0x3A */
    assert_int_equal(kb_f32_to_e4m3(1.0625f), 0x38);
    assert_int_equal(kb_f32_to_e4m3(1.1875f), 0x3A);
    assert_int_equal(kb_f32_to_e4m3(1.0626f), 0x39);
    assert_int_equal(kb_f32_to_e4m3(464.0f), 0x7E);   /* midpoint 448 | 480: even 448 */
    assert_int_equal(kb_f32_to_e4m3(1e6f), 0x7E);     /* saturates */
    assert_int_equal(kb_f32_to_e4m3(-1e6f), 0xFE);
    assert_int_equal(kb_f32_to_e4m3(-INFINITY), 0xFE); /* no infinities */
    assert_int_equal(kb_f32_to_e4m3(NAN), 0x7F);
    assert_int_equal(kb_f32_to_e4m3(0x1p-10f), 0x00); /* half the smallest subnormal: even 0 */
    assert_int_equal(kb_f32_to_e4m3(0x1.8p-9f), 0x02); /* 1.5 subnormal steps: even 2 */
    /* e5m2 */
    assert_int_equal(kb_f32_to_e5m2(1.125f), 0x3C);   /* midpoint 1 | 1.25: even 1 */
    assert_int_equal(kb_f32_to_e5m2(1.375f), 0x3E);   /* midpoint 1.25 | 1.5: even 1.5 */
    assert_int_equal(kb_f32_to_e5m2(61440.0f), 0x7B); /* would round to 2^16: saturates */
    assert_int_equal(kb_f32_to_e5m2(1e9f), 0x7B);
    assert_int_equal(kb_f32_to_e5m2(INFINITY), 0x7C); /* infinity is kept */
    assert_int_equal(kb_f32_to_e5m2(0x1p-17f), 0x00);
    /* e8m0: the power of two at or below */
    assert_int_equal(kb_f32_to_e8m0(1.0f), 127);
    assert_int_equal(kb_f32_to_e8m0(1.99f), 127);
    assert_int_equal(kb_f32_to_e8m0(0.5f), 126);
    assert_int_equal(kb_f32_to_e8m0(0.0f), 0);
    assert_int_equal(kb_f32_to_e8m0(-4.0f), 0);
    assert_int_equal(kb_f32_to_e8m0(INFINITY), 254);
    assert_int_equal(kb_f32_to_e8m0(NAN), 255);
    /* i32 through the dtype paths */
    uint8_t b[4];
    kb_dtype_store(KB_I32, b, 0, 2.5f);
    assert_true(kb_dtype_load(KB_I32, b, 0) == 2.0f);
    kb_dtype_store(KB_I32, b, 0, -3.5f);
    assert_true(kb_dtype_load(KB_I32, b, 0) == -4.0f);
    kb_dtype_store(KB_I32, b, 0, 3e9f);
    assert_true(kb_dtype_load(KB_I32, b, 0) == 2147483648.0f); /* INT32_MAX as f32 */
    kb_dtype_store(KB_I32, b, 0, NAN);
    assert_true(kb_dtype_load(KB_I32, b, 0) == 0.0f);
}

/* e4m3 and e5m2 against a reference: the nearest code by value (ties to the even code),
 * saturated, for a sweep of f32 values across the whole range. */
static void test_fmt_nearest_sweep(void **state)
{
    (void)state;
    for (int fmt = 0; fmt < 2; fmt++) {
        float (*dec)(uint8_t) = fmt ? kb_e5m2_to_f32 : kb_e4m3_to_f32;
        uint8_t (*enc)(float) = fmt ? kb_f32_to_e5m2 : kb_f32_to_e4m3;
        uint8_t maxc = fmt ? 0x7B : 0x7E;
        for (uint32_t u = 0; u < 0x48000000u; u += 0x1357u) { /* 0 .. 131072 */
            float x;
            memcpy(&x, &u, sizeof x);
            int best = 0;
            for (int c = 1; c <= maxc; c++) {
                double dc = fabs((double)dec((uint8_t)c) - x), db = fabs((double)dec((uint8_t)best) - x);
                if (dc < db || (dc == db && (c & 1) == 0))
                    best = c;
            }
            if (enc(x) != best)
                fail_msg("fmt %d: %a -> 0x%02x, nearest 0x%02x", fmt, (double)x, enc(x), best);
            assert_int_equal(enc(-x), best | 0x80);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_f16_known),
        cmocka_unit_test(test_f16_nan),
        cmocka_unit_test(test_f16_exhaustive_roundtrip),
        cmocka_unit_test(test_f16_all_ties),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_load_store),
        cmocka_unit_test(test_ulp),
        cmocka_unit_test(test_bulk),
        cmocka_unit_test(test_fmt_names_sizes),
        cmocka_unit_test(test_fmt_roundtrip_all_codes),
        cmocka_unit_test(test_fmt_values),
        cmocka_unit_test(test_fmt_rounding),
        cmocka_unit_test(test_fmt_nearest_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
