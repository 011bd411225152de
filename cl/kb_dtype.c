/*
 * kb_dtype — exact software conversions between f32 and the 16-bit storage types (f16, bf16),
 * and typed element load/store on raw byte buffers (the number formats' conversions are
 * kb_mathfn.h's, shared with the OpenCL kernels; their bulk forms go element by element). The conversions work on bit patterns only
 * (no reliance on compiler or hardware half support), so every host and backend produce the
 * same bits: round-to-nearest-even, subnormals kept, overflow to infinity, NaN kept as a quiet
 * NaN with its sign and the high payload bits. The bulk forms compute every case of a block
 * of 16 elements and select with masks (no branches, so that -O2 vectorises them); f32 -> f16
 * rounds results below 2^-14 by adding 0.5f (whose ulp is f16's subnormal step, 2^-24) and
 * taking the low bits: the FPU's round-to-nearest-even, which requires the default rounding
 * mode without flush-to-zero. Limits: elements are addressed unaligned-safe through memcpy.
 */
#include "kb_dtype.h"
#include "kb_err.h"
#include "kb_mathfn.h"

#include <math.h>
#include <string.h>

/* x86-64 with F16C: the bulk f16 conversions use the hardware's (vcvtph2ps / vcvtps2ph with
 * round-to-nearest-even give the software conversions' bits in every case, NaN payloads
 * included: test_dtype's test_bulk compares them on every pattern it tries), chosen at run
 * time. Not in sanitizer builds, as KB_VECTOR_CLONES, nor with clang (the fuzz build), whose
 * __builtin_cpu_supports (clang 14) does not know "f16c". */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#include <immintrin.h>
#define KB_F16C 1
#endif

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

const char *kb_dtype_name(kb_dtype t)
{
    switch (t) {
    case KB_F16: return "f16";
    case KB_BF16: return "bf16";
    case KB_F32: return "f32";
    case KB_I8: return "i8";
    case KB_FP8E4M3: return "fp8e4m3";
    case KB_FP8E5M2: return "fp8e5m2";
    case KB_E8M0: return "e8m0";
    case KB_I32: return "i32";
    default: return "?";
    }
}

int kb_dtype_from_name(const char *name)
{
    if (!name)
        return -1;
    if (strcmp(name, "f16") == 0)
        return KB_F16;
    if (strcmp(name, "bf16") == 0)
        return KB_BF16;
    for (int t = 0; t < KB_NDTYPES; t++)
        if (strcmp(name, kb_dtype_name((kb_dtype)t)) == 0)
            return t;
    return -1;
}

float kb_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;

    if (e == 0) {
        if (m == 0)
            return f32_from_bits(sign);
        /* Subnormal: every f16 subnormal is a normal f32; shift the leading 1 into place. */
        int ee = 1;
        while (!(m & 0x400u)) {
            m <<= 1;
            ee--;
        }
        m &= 0x3FFu;
        return f32_from_bits(sign | ((uint32_t)(ee + 112) << 23) | (m << 13));
    }
    if (e == 31) {
        if (m == 0)
            return f32_from_bits(sign | 0x7F800000u);
        return f32_from_bits(sign | 0x7FC00000u | (m << 13));
    }
    return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t kb_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);

    x &= 0x7FFFFFFFu;
    if (x > 0x7F800000u) /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7E00u | ((x >> 13) & 0x3FFu));
    /* 65520 is the midpoint between 65504 (odd mantissa) and 2^16: ties go up to infinity. */
    if (x >= 0x477FF000u)
        return (uint16_t)(sign | 0x7C00u);

    int e = (int)(x >> 23) - 127;
    if (e >= -14) {
        /* Normal: rebias, keep 10 mantissa bits; a carry may bump the exponent, which is right. */
        uint32_t h = (x - (112u << 23)) >> 13;
        uint32_t rem = x & 0x1FFFu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    /* Result is subnormal or zero: value / 2^-24 = m * 2^(e + 1) with m the 24-bit significand. */
    int s = -(e + 1);
    if (s >= 25 || (x >> 23) == 0) /* below half the smallest subnormal (f32 subnormals too) */
        return sign;
    uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

float kb_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        x |= 0x00400000u;
    return f32_from_bits(x);
}

uint16_t kb_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);

    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    /* Adding 0x7FFF (+1 when the kept lsb is odd) rounds to nearest even; the carry out of the
     * largest finite values lands exactly on infinity. */
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float kb_i8_to_f32(uint8_t c) { return kb_mf_i82f(c); }
uint8_t kb_f32_to_i8(float f) { return (uint8_t)kb_mf_f2i8(f); }
float kb_e4m3_to_f32(uint8_t c) { return kb_mf_e4m32f(c); }
uint8_t kb_f32_to_e4m3(float f) { return (uint8_t)kb_mf_f2e4m3(f); }
float kb_e5m2_to_f32(uint8_t c) { return kb_mf_e5m22f(c); }
uint8_t kb_f32_to_e5m2(float f) { return (uint8_t)kb_mf_f2e5m2(f); }
float kb_e8m0_to_f32(uint8_t c) { return kb_mf_e8m02f(c); }
uint8_t kb_f32_to_e8m0(float f) { return (uint8_t)kb_mf_f2e8m0(f); }

/* The number formats: 1-byte codes and int32 (out of the f16/bf16/f32 fast paths). */
static float load_fmt(kb_dtype t, const unsigned char *p, size_t i)
{
    uint32_t u;
    switch (t) {
    case KB_I8: return kb_mf_i82f(p[i]);
    case KB_FP8E4M3: return kb_mf_e4m32f(p[i]);
    case KB_FP8E5M2: return kb_mf_e5m22f(p[i]);
    case KB_E8M0: return kb_mf_e8m02f(p[i]);
    default:
        memcpy(&u, p + 4u * i, sizeof u);
        return kb_mf_i322f(u);
    }
}

static void store_fmt(kb_dtype t, unsigned char *p, size_t i, float v)
{
    uint32_t u;
    switch (t) {
    case KB_I8: p[i] = (unsigned char)kb_mf_f2i8(v); return;
    case KB_FP8E4M3: p[i] = (unsigned char)kb_mf_f2e4m3(v); return;
    case KB_FP8E5M2: p[i] = (unsigned char)kb_mf_f2e5m2(v); return;
    case KB_E8M0: p[i] = (unsigned char)kb_mf_f2e8m0(v); return;
    default:
        u = kb_mf_f2i32(v);
        memcpy(p + 4u * i, &u, sizeof u);
        return;
    }
}

float kb_dtype_load(kb_dtype t, const void *base, size_t i)
{
    const unsigned char *p = base;
    if (t > KB_F32)
        return load_fmt(t, p, i);
    if (t == KB_F32) {
        float f;
        memcpy(&f, p + i * 4u, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + i * 2u, sizeof h);
    return t == KB_F16 ? kb_f16_to_f32(h) : kb_bf16_to_f32(h);
}

void kb_dtype_store(kb_dtype t, void *base, size_t i, float v)
{
    unsigned char *p = base;
    if (t > KB_F32) {
        store_fmt(t, p, i, v);
        return;
    }
    if (t == KB_F32) {
        memcpy(p + i * 4u, &v, sizeof v);
        return;
    }
    uint16_t h = t == KB_F16 ? kb_f32_to_f16(v) : kb_f32_to_bf16(v);
    memcpy(p + i * 2u, &h, sizeof h);
}

enum { BLK = 16 };

/* f32 -> f16 of BLK values (see the file comment). */
static KB_ALWAYS_INLINE void f16_store_blk(uint16_t *h, const float *src)
{
    for (int i = 0; i < BLK; i++) {
        float f = src[i], a = fabsf(f) + 0.5f;
        uint32_t u = f32_bits(f), x = u & 0x7FFFFFFFu, sub = f32_bits(a) - 0x3F000000u;
        uint32_t nrm = (x - (112u << 23) + 0xFFFu + ((x >> 13) & 1u)) >> 13;
        uint32_t ms = 0u - (uint32_t)(x < 0x38800000u); /* below 2^-14: subnormal or zero */
        uint32_t mn = 0u - (uint32_t)(x < 0x477FF000u); /* below 65520: finite */
        uint32_t mi = 0u - (uint32_t)(x < 0x7F800001u); /* not NaN */
        uint32_t big = (0x7C00u & mi) | ((0x7E00u | ((x >> 13) & 0x3FFu)) & ~mi);
        uint32_t r = (sub & ms) | (nrm & mn & ~ms) | (big & ~mn);
        h[i] = (uint16_t)(r | ((u >> 16) & 0x8000u));
    }
}

static KB_ALWAYS_INLINE void bf16_store_blk(uint16_t *h, const float *src)
{
    for (int i = 0; i < BLK; i++) {
        uint32_t x = f32_bits(src[i]);
        uint32_t mnan = 0u - (uint32_t)((x & 0x7FFFFFFFu) > 0x7F800000u);
        uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
        h[i] = (uint16_t)((r & ~mnan) | (((x >> 16) | 0x0040u) & mnan));
    }
}

/* f16 -> f32 of BLK values: subnormals as (mantissa as float) * 2^-24, exactly. */
static KB_ALWAYS_INLINE void f16_load_blk(float *dst, const uint16_t *h)
{
    for (int i = 0; i < BLK; i++) {
        uint32_t v = h[i], sign = (v & 0x8000u) << 16, e = (v >> 10) & 0x1Fu, m = v & 0x3FFu;
        uint32_t sub = f32_bits((float)(int)m * 0x1p-24f);
        uint32_t nrm = ((e + 112u) << 23) | (m << 13);
        uint32_t inf = 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0u);
        uint32_t mz = 0u - (uint32_t)(e == 0), mx = 0u - (uint32_t)(e == 31);
        uint32_t r = (sub & mz) | (inf & mx) | (nrm & ~(mz | mx));
        dst[i] = f32_from_bits(r | sign);
    }
}

#ifdef KB_F16C
static int have_f16c(void)
{
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}

/* Whole groups of 8; returns how many elements it converted. */
__attribute__((target("avx,f16c"))) static size_t f16_store_hw(unsigned char *p,
                                                                  const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(p + 2u * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}

__attribute__((target("avx,f16c"))) static size_t f16_load_hw(float *dst,
                                                                 const unsigned char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2u * i))));
    return i;
}
#endif

KB_VECTOR_CLONES
void kb_dtype_store_n(kb_dtype t, void *base, size_t i0, const float *src, size_t n)
{
    unsigned char *p = (unsigned char *)base + i0 * kb_dtype_size(t);
    uint16_t h[BLK];
    size_t i = 0;

    if (t == KB_F32) {
        memcpy(p, src, n * 4u);
        return;
    }
#ifdef KB_F16C
    if (t == KB_F16 && have_f16c())
        i = f16_store_hw(p, src, n);
#endif
    for (; t <= KB_BF16 && i + BLK <= n; i += BLK) {
        if (t == KB_F16)
            f16_store_blk(h, src + i);
        else
            bf16_store_blk(h, src + i);
        memcpy(p + 2u * i, h, sizeof h);
    }
    /* the 1-byte formats with the format chosen once, not per element (store_fmt's codes) */
    switch (t) {
    case KB_I8:
        for (; i < n; i++)
            p[i] = (unsigned char)kb_mf_f2i8(src[i]);
        return;
    case KB_FP8E4M3:
        for (; i < n; i++)
            p[i] = (unsigned char)kb_mf_f2e4m3(src[i]);
        return;
    case KB_FP8E5M2:
        for (; i < n; i++)
            p[i] = (unsigned char)kb_mf_f2e5m2(src[i]);
        return;
    default:
        break;
    }
    for (; i < n; i++)
        kb_dtype_store(t, p, i, src[i]);
}

KB_VECTOR_CLONES
void kb_dtype_load_n(kb_dtype t, const void *base, size_t i0, float *dst, size_t n)
{
    const unsigned char *p = (const unsigned char *)base + i0 * kb_dtype_size(t);
    uint16_t h[BLK];
    size_t i = 0;

    if (t == KB_F32) {
        memcpy(dst, p, n * 4u);
        return;
    }
#ifdef KB_F16C
    if (t == KB_F16 && have_f16c())
        i = f16_load_hw(dst, p, n);
#endif
    for (; t == KB_F16 && i + BLK <= n; i += BLK) {
        memcpy(h, p + 2u * i, sizeof h);
        f16_load_blk(dst + i, h);
    }
    switch (t) { /* the 1-byte formats, as kb_dtype_store_n */
    case KB_I8:
        for (; i < n; i++)
            dst[i] = kb_mf_i82f(p[i]);
        return;
    case KB_FP8E4M3:
        for (; i < n; i++)
            dst[i] = kb_mf_e4m32f(p[i]);
        return;
    case KB_FP8E5M2:
        for (; i < n; i++)
            dst[i] = kb_mf_e5m22f(p[i]);
        return;
    default:
        break;
    }
    for (; i < n; i++)
        dst[i] = kb_dtype_load(t, p, i);
}

float kb_f16_ulp(float v)
{
    /* Beyond the f16 range the formula is simply continued (there are no f16 numbers there). */
    if (isnan(v))
        return v;
    if (isinf(v))
        return INFINITY;
    float a = fabsf(v);
    if (a < 0x1p-14f)
        return 0x1p-24f;
    int ex;
    (void)frexpf(a, &ex); /* a = f * 2^ex, f in [0.5, 1): the binade exponent is ex - 1 */
    return ldexpf(1.0f, ex - 1 - 10);
}
