/*
 * kb_mathfn — the f32 math of Phase 2, written once for both the C reference backend and the
 * OpenCL kernels, so that both produce the same bits.
 *
 * This header is compiled twice: as C11 (included by kb_ref.c and the tests) and as OpenCL C
 * 1.2 (its text is prepended to cl/replay.cl and embedded into the library). It therefore
 * uses only the common subset: +, -, *, / and comparisons on float (IEEE round-to-nearest;
 * the OpenCL program is built with FP_CONTRACT OFF and correctly rounded division and sqrt),
 * fma, sqrt, integer arithmetic on 32-bit unsigned values and bit casts through the
 * KB_MF_AS_* macros. No libm transcendental is called: exp, log, sin, cos and tanh are
 * evaluated here with fixed polynomials (errors of at most a few ulp over the f32 range; see
 * tests/test_opencl.c for the measured bounds).
 *
 * NaN rules (so that NaN bits do not depend on the hardware's NaN propagation, which differs
 * between x86 and GPUs): a NaN operand is returned unchanged (the first NaN operand for two
 * operands), a NaN produced from non-NaN operands is the canonical quiet NaN 0x7FC00000. MAX
 * and MIN ignore a NaN operand and order -0 below +0, so they are commutative and
 * associative. Limits: the argument reduction of sin/cos is accurate for |x| up to about 1e5
 * and degrades gradually beyond (the results are still identical on every backend); the
 * functions assume IEEE f32 evaluation without excess precision (no x87).
 */
#ifndef KB_MATHFN_H
#define KB_MATHFN_H

#ifdef __OPENCL_VERSION__

#pragma OPENCL FP_CONTRACT OFF

typedef uint kb_mf_u32;
#define KB_MF_FN
#define KB_MF_AS_U32(f) as_uint(f)
#define KB_MF_AS_F32(u) as_float(u)
#define KB_MF_FMA(a, b, c) fma((a), (b), (c))
#define KB_MF_SQRT(x) sqrt(x)

#else

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* clang fuses a * b + c by default; gcc does not in ISO C mode */
#endif

typedef uint32_t kb_mf_u32;
#define KB_MF_FN static inline

static inline kb_mf_u32 kb_mf_as_u32_(float f)
{
    kb_mf_u32 u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kb_mf_as_f32_(kb_mf_u32 u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define KB_MF_AS_U32(f) kb_mf_as_u32_(f)
#define KB_MF_AS_F32(u) kb_mf_as_f32_(u)
#define KB_MF_FMA(a, b, c) fmaf((a), (b), (c))
#define KB_MF_SQRT(x) sqrtf(x)

#endif

/* Op codes; kb_ref.c and kb_opencl.c check that they equal kb_math1_op / kb_math2_op. */
#define KB_MF_M1_EXP 0
#define KB_MF_M1_LOG 1
#define KB_MF_M1_SQRT 2
#define KB_MF_M1_ABS 3
#define KB_MF_M1_SIGMOID 4
#define KB_MF_M1_COS 5
#define KB_MF_M1_SIN 6
#define KB_MF_M1_NEG 7
#define KB_MF_M1_RECIP 8
#define KB_MF_M1_RELU 9
#define KB_MF_M1_GELU 10
#define KB_MF_M1_AXPB 11
#define KB_MF_M1_RSQRT 12
#define KB_MF_M1_TANH 13
#define KB_MF_M1_SILU 14
#define KB_MF_M1_SOFTCAP 15

#define KB_MF_M2_ADD 0
#define KB_MF_M2_SUB 1
#define KB_MF_M2_MUL 2
#define KB_MF_M2_DIV 3
#define KB_MF_M2_MAX 4
#define KB_MF_M2_MIN 5

#define KB_MF_NAN_BITS 0x7FC00000u
#define KB_MF_INF_BITS 0x7F800000u

KB_MF_FN int kb_mf_isnan(float x)
{
    return x != x;
}

/* The canonical NaN when r is a NaN made from non-NaN operands. */
KB_MF_FN float kb_mf_canon(float r)
{
    return r != r ? KB_MF_AS_F32(KB_MF_NAN_BITS) : r;
}

/* ---------------------------------------------------------------- storage conversions */

/*
 * f16 bits -> f32, exact; NaN keeps sign and payload and becomes quiet (as kb_dtype.c).
 * Written with selects rather than branches so GPU loads around it stay in flight.
 */
KB_MF_FN float kb_mf_h2f(kb_mf_u32 h)
{
    kb_mf_u32 sgn = (h & 0x8000u) << 16, em = h & 0x7FFFu, m = h & 0x3FFu;
    kb_mf_u32 nrm = (em << 13) + 0x38000000u;              /* rebias: exponent + 112 */
    kb_mf_u32 sub = KB_MF_AS_U32((float)em * 0x1p-24f);    /* zero or subnormal: exact */
    kb_mf_u32 spc = 0x7F800000u | (m << 13) | (m != 0u ? 0x400000u : 0u); /* inf, NaN */
    kb_mf_u32 r = em < 0x400u ? sub : em >= 0x7C00u ? spc : nrm;
    return KB_MF_AS_F32(r | sgn);
}

/* f32 -> f16 bits with round-to-nearest-even; the same mapping as kb_f32_to_f16. */
KB_MF_FN kb_mf_u32 kb_mf_f2h(float f)
{
    kb_mf_u32 x = KB_MF_AS_U32(f);
    kb_mf_u32 sgn = (x >> 16) & 0x8000u;

    x &= 0x7FFFFFFFu;
    if (x > 0x7F800000u)
        return sgn | 0x7E00u | ((x >> 13) & 0x3FFu);
    if (x >= 0x477FF000u) /* >= 65520 rounds to infinity */
        return sgn | 0x7C00u;
    if (x >= 0x38800000u) { /* >= 2^-14: a normal f16 */
        kb_mf_u32 h = (x - 0x38000000u) >> 13, rem = x & 0x1FFFu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u))
            h++;
        return sgn | h;
    }
    if (x < 0x33000000u) /* <= 2^-25 (half the smallest subnormal) or an f32 subnormal */
        return sgn;
    {
        kb_mf_u32 s = 126u - (x >> 23); /* 14..24 */
        kb_mf_u32 m = (x & 0x7FFFFFu) | 0x800000u;
        kb_mf_u32 q = m >> s, rem = m & ((1u << s) - 1u), hv = 1u << (s - 1u);
        if (rem > hv || (rem == hv && (q & 1u) != 0u))
            q++;
        return sgn | q;
    }
}

KB_MF_FN float kb_mf_bf2f(kb_mf_u32 h)
{
    kb_mf_u32 x = (h & 0xFFFFu) << 16;
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        x |= 0x400000u;
    return KB_MF_AS_F32(x);
}

KB_MF_FN kb_mf_u32 kb_mf_f2bf(float f)
{
    kb_mf_u32 x = KB_MF_AS_U32(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return ((x >> 16) | 0x40u) & 0xFFFFu;
    x += 0x7FFFu + ((x >> 16) & 1u);
    return x >> 16;
}

/*
 * The 8-bit formats (docs/formats.md) and int32. Every f32 -> format conversion rounds to
 * nearest even and saturates finite overflow to the largest finite value; NaN stays NaN.
 *  - fp8 e4m3 (OCP FP8): bias 7, no infinities, max 448 (0x7E), NaN S.1111.111; +-inf
 *    saturates to +-448.
 *  - fp8 e5m2 (OCP FP8, IEEE-like): bias 15, max 57344 (0x7B), +-inf kept (0x7C), NaN
 *    S.11111.mm (mm != 0): a NaN's f32 form carries mm in its low payload bits so every code
 *    round-trips; other f32 NaNs become S.11111.10.
 *  - int8: two's complement, [-128, 127]; NaN -> 0.
 *  - int32: [-2^31, 2^31 - 1]; NaN -> 0; loads round to nearest even above 2^24.
 *  - e8m0 (OCP MX scale): 2^(e - 127), 0xFF = NaN. A store keeps the power of two at or below
 *    the value (floor(log2 v), the MX shared-scale rule, not round-to-nearest), clamped to
 *    [2^-127, 2^127]; zero, negatives and values below 2^-127 give 0x00, +inf 0xFE.
 */
KB_MF_FN float kb_mf_rint_small(float t) /* t in [0, 2^23): round to nearest even */
{
    return (t + 8388608.0f) - 8388608.0f;
}

/* |f| -> code of a sign-less minifloat with m mantissa bits and minimum normal exponent emin
 * (unbiased), before saturation; f must be finite. */
KB_MF_FN kb_mf_u32 kb_mf_mini_code(kb_mf_u32 a, int m, int emin)
{
    int e = (int)(a >> 23) - 127;
    int s;
    kb_mf_u32 sig, q, rem, hv;

    if ((a >> 23) == 0u) /* zero or an f32 subnormal: far below half the smallest subnormal */
        return 0u;
    if (e >= 64) /* far above any 8-bit format's range: saturated by the caller */
        return 0xFFFFu;
    s = 23 - m + (e < emin ? emin - e : 0);
    if (s > 24)
        return 0u;
    sig = (a & 0x7FFFFFu) | 0x800000u;
    q = sig >> s;
    rem = sig & ((1u << s) - 1u);
    hv = 1u << (s - 1);
    if (rem > hv || (rem == hv && (q & 1u) != 0u))
        q++;
    return (e >= emin ? (kb_mf_u32)(e - emin) << m : 0u) + q;
}

KB_MF_FN kb_mf_u32 kb_mf_f2e4m3(float f)
{
    kb_mf_u32 x = KB_MF_AS_U32(f), sgn = (x >> 24) & 0x80u, a = x & 0x7FFFFFFFu, c;
    if (a > 0x7F800000u)
        return sgn | 0x7Fu;
    c = a == 0x7F800000u ? 0x7Eu : kb_mf_mini_code(a, 3, -6);
    return sgn | (c > 0x7Eu ? 0x7Eu : c);
}

KB_MF_FN float kb_mf_e4m32f(kb_mf_u32 c)
{
    kb_mf_u32 sgn = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u, r;
    if ((c & 0x7Fu) == 0x7Fu)
        r = KB_MF_NAN_BITS;
    else if (e == 0u)
        r = KB_MF_AS_U32((float)m * 0x1p-9f);
    else
        r = ((e + 120u) << 23) | (m << 20);
    return KB_MF_AS_F32(r | sgn);
}

KB_MF_FN kb_mf_u32 kb_mf_f2e5m2(float f)
{
    kb_mf_u32 x = KB_MF_AS_U32(f), sgn = (x >> 24) & 0x80u, a = x & 0x7FFFFFFFu, c;
    if (a > 0x7F800000u)
        return sgn | 0x7Cu | ((a & 3u) != 0u ? (a & 3u) : 2u);
    if (a == 0x7F800000u)
        return sgn | 0x7Cu;
    c = kb_mf_mini_code(a, 2, -14);
    return sgn | (c > 0x7Bu ? 0x7Bu : c);
}

KB_MF_FN float kb_mf_e5m22f(kb_mf_u32 c)
{
    kb_mf_u32 sgn = (c & 0x80u) << 24, e = (c >> 2) & 0x1Fu, m = c & 3u, r;
    if (e == 31u)
        r = m != 0u ? (KB_MF_NAN_BITS | m) : KB_MF_INF_BITS;
    else if (e == 0u)
        r = KB_MF_AS_U32((float)m * 0x1p-16f);
    else
        r = ((e + 112u) << 23) | (m << 21);
    return KB_MF_AS_F32(r | sgn);
}

KB_MF_FN kb_mf_u32 kb_mf_f2i8(float f)
{
    float t = f < 0.0f ? -f : f, r;
    if (f != f)
        return 0u;
    r = t < 256.0f ? kb_mf_rint_small(t) : 256.0f;
    if (f < 0.0f)
        return r >= 128.0f ? 0x80u : (0u - (kb_mf_u32)r) & 0xFFu;
    return r >= 127.0f ? 0x7Fu : (kb_mf_u32)r;
}

KB_MF_FN float kb_mf_i82f(kb_mf_u32 c)
{
    c &= 0xFFu;
    return c >= 0x80u ? -(float)(0x100u - c) : (float)c;
}

KB_MF_FN kb_mf_u32 kb_mf_f2i32(float f)
{
    float t = f < 0.0f ? -f : f;
    kb_mf_u32 r;
    if (f != f)
        return 0u;
    if (f >= 2147483648.0f)
        return 0x7FFFFFFFu;
    if (f <= -2147483648.0f)
        return 0x80000000u;
    r = (kb_mf_u32)(t < 8388608.0f ? kb_mf_rint_small(t) : t); /* >= 2^23: already integral */
    return f < 0.0f ? 0u - r : r;
}

KB_MF_FN float kb_mf_i322f(kb_mf_u32 c)
{
    /* magnitude first, so the conversion is unsigned -> float (one rounding, to nearest even) */
    return (c & 0x80000000u) ? -(float)(0u - c) : (float)c;
}

KB_MF_FN kb_mf_u32 kb_mf_f2e8m0(float f)
{
    kb_mf_u32 x = KB_MF_AS_U32(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return 0xFFu;
    if ((x & 0x80000000u) != 0u || x < 0x00800000u) /* <= 0 or below 2^-126 (subnormal) */
        return 0u;
    return (x >> 23) >= 0xFFu ? 0xFEu : (x >> 23);
}

KB_MF_FN float kb_mf_e8m02f(kb_mf_u32 c)
{
    c &= 0xFFu;
    return KB_MF_AS_F32(c == 0xFFu ? KB_MF_NAN_BITS : c == 0u ? 0x00400000u : c << 23);
}

/* ---------------------------------------------------------------- NaN-deterministic basics */

KB_MF_FN float kb_mf_add(float x, float y)
{
    if (x != x)
        return x;
    if (y != y)
        return y;
    return kb_mf_canon(x + y);
}

KB_MF_FN float kb_mf_sub(float x, float y)
{
    if (x != x)
        return x;
    if (y != y)
        return y;
    return kb_mf_canon(x - y);
}

KB_MF_FN float kb_mf_mul(float x, float y)
{
    if (x != x)
        return x;
    if (y != y)
        return y;
    return kb_mf_canon(x * y);
}

KB_MF_FN float kb_mf_div(float x, float y)
{
    if (x != x)
        return x;
    if (y != y)
        return y;
    return kb_mf_canon(x / y);
}

KB_MF_FN float kb_mf_fma(float x, float y, float z)
{
    if (x != x)
        return x;
    if (y != y)
        return y;
    if (z != z)
        return z;
    return kb_mf_canon(KB_MF_FMA(x, y, z));
}

/* Maximum ignoring a NaN operand; +0 > -0. */
KB_MF_FN float kb_mf_fmax(float x, float y)
{
    if (x > y)
        return x;
    if (y > x)
        return y;
    if (x != x)
        return y;
    if (y != y)
        return x;
    return (KB_MF_AS_U32(x) & 0x80000000u) != 0u ? y : x; /* equal: only zeros differ */
}

/* Minimum ignoring a NaN operand; -0 < +0. */
KB_MF_FN float kb_mf_fmin(float x, float y)
{
    if (x < y)
        return x;
    if (y < x)
        return y;
    if (x != x)
        return y;
    if (y != y)
        return x;
    return (KB_MF_AS_U32(x) & 0x80000000u) != 0u ? x : y;
}

/* ---------------------------------------------------------------- transcendental */

/* Round to the nearest integer, ties to even (the 2^23 trick needs strict IEEE f32). */
KB_MF_FN float kb_mf_rint(float x)
{
    float a = x < 0.0f ? -x : x;
    float s = x < 0.0f ? -0x1p23f : 0x1p23f;
    if (!(a < 0x1p23f))
        return x;
    return (x + s) - s;
}

/* 2^k for -126 <= k <= 127. */
KB_MF_FN float kb_mf_pow2i(int k)
{
    return KB_MF_AS_F32((kb_mf_u32)(k + 127) << 23);
}

KB_MF_FN float kb_mf_exp(float x)
{
    if (x != x)
        return x;
    if (x > 100.0f)
        return KB_MF_AS_F32(KB_MF_INF_BITS);
    if (x < -110.0f)
        return 0.0f;
    {
        float kf = kb_mf_rint(x * 0x1.715476p+0f); /* x / ln 2 */
        /* r = x - k ln2 in two steps; k * ln2_hi is exact (ln2_hi has 16 bits, |k| <= 159). */
        float r = KB_MF_FMA(-kf, 0x1.62e4p-1f, x);
        r = KB_MF_FMA(-kf, 0x1.7f7d1cp-20f, r);
        /* e^r, |r| <= 0.35: Taylor to degree 7 (truncation < 2^-27 relative). */
        float p = 0x1.a01a02p-13f;
        p = KB_MF_FMA(p, r, 0x1.6c16c2p-10f);
        p = KB_MF_FMA(p, r, 0x1.111112p-7f);
        p = KB_MF_FMA(p, r, 0x1.555556p-5f);
        p = KB_MF_FMA(p, r, 0x1.555556p-3f);
        p = KB_MF_FMA(p, r, 0.5f);
        p = KB_MF_FMA(p, r, 1.0f);
        p = KB_MF_FMA(p, r, 1.0f);
        {
            /* Scale in two exact steps, so a subnormal or overflowing result rounds once. */
            int k = (int)kf;
            int k1 = k / 2, k2 = k - k1;
            return (p * kb_mf_pow2i(k1)) * kb_mf_pow2i(k2);
        }
    }
}

/* e^y - 1 without cancellation for small |y|. */
KB_MF_FN float kb_mf_expm1(float y)
{
    float a = y < 0.0f ? -y : y;
    if (y == 0.0f)
        return y; /* keeps -0 */
    if (!(a < 0.5f))
        return kb_mf_exp(y) - 1.0f;
    {
        float p = 0x1.27e4fcp-22f;                 /* 1/10! */
        p = KB_MF_FMA(p, y, 0x1.71de3ap-19f);      /* 1/9! */
        p = KB_MF_FMA(p, y, 0x1.a01a02p-16f);      /* 1/8! */
        p = KB_MF_FMA(p, y, 0x1.a01a02p-13f);
        p = KB_MF_FMA(p, y, 0x1.6c16c2p-10f);
        p = KB_MF_FMA(p, y, 0x1.111112p-7f);
        p = KB_MF_FMA(p, y, 0x1.555556p-5f);
        p = KB_MF_FMA(p, y, 0x1.555556p-3f);
        p = KB_MF_FMA(p, y, 0.5f);
        return KB_MF_FMA(p * y, y, y);
    }
}

KB_MF_FN float kb_mf_log(float x)
{
    if (x != x)
        return x;
    if (x < 0.0f)
        return KB_MF_AS_F32(KB_MF_NAN_BITS);
    if (x == 0.0f)
        return KB_MF_AS_F32(KB_MF_INF_BITS | 0x80000000u);
    if (x == KB_MF_AS_F32(KB_MF_INF_BITS))
        return x;
    {
        kb_mf_u32 u = KB_MF_AS_U32(x);
        int e = 0;
        if (u < 0x00800000u) { /* subnormal: scale into the normal range first */
            u = KB_MF_AS_U32(x * 0x1p23f);
            e = -23;
        }
        e += (int)(u >> 23) - 127;
        {
            float m = KB_MF_AS_F32((u & 0x007FFFFFu) | 0x3F800000u); /* [1, 2) */
            if (m > 0x1.6a09e6p+0f) { /* keep m in [sqrt(1/2), sqrt(2)] */
                m *= 0.5f;
                e += 1;
            }
            {
                /* log(1+f) = f - s (f - R), s = f / (2 + f), R = 2s^3/3 + 2s^5/5 + ... over s. */
                float f = m - 1.0f; /* exact */
                float s = f / (2.0f + f);
                float z = s * s;
                float R = 0x1.c71c72p-3f;             /* 2/9 */
                R = KB_MF_FMA(R, z, 0x1.24924ap-2f);  /* 2/7 */
                R = KB_MF_FMA(R, z, 0x1.99999ap-2f);  /* 2/5 */
                R = KB_MF_FMA(R, z, 0x1.555556p-1f);  /* 2/3 */
                R = R * z;
                {
                    float lm = f - s * (f - R);
                    float ef = (float)e;
                    /* e * ln2_hi is exact; add the small parts first. */
                    return ef * 0x1.62e4p-1f + KB_MF_FMA(ef, 0x1.7f7d1cp-20f, lm);
                }
            }
        }
    }
}

/* sin (want_cos 0) or cos (want_cos 1). */
KB_MF_FN float kb_mf_sincos(float x, int want_cos)
{
    if (x != x)
        return x;
    if (x == KB_MF_AS_F32(KB_MF_INF_BITS) || x == -KB_MF_AS_F32(KB_MF_INF_BITS))
        return KB_MF_AS_F32(KB_MF_NAN_BITS);
    if ((x < 0.0f ? -x : x) < 0x1p-13f) /* sin x rounds to x, cos x to 1 (and sin -0 = -0) */
        return want_cos ? 1.0f : x;
    {
        float kf = kb_mf_rint(x * 0x1.45f306p-1f); /* x / (pi/2) */
        float ka = kf < 0.0f ? -kf : kf;
        /* r = x - k pi/2 with pi/2 in three parts (Cody-Waite with fma). */
        float r = KB_MF_FMA(-kf, 0x1.921fb6p+0f, x);
        r = KB_MF_FMA(-kf, -0x1.777a5cp-25f, r);
        r = KB_MF_FMA(-kf, -0x1.ee59dap-50f, r);
        {
            /* Quadrant: k mod 4; a float >= 2^30 is a multiple of 4. */
            int q = ka < 0x1p30f ? ((int)kf & 3) : 0;
            float z = r * r;
            float sp, cp;
            q = (q + want_cos) & 3;
            /* Taylor on |r| <= pi/4: sin to r^9, cos to r^10 (truncation < 2^-28). */
            sp = 0x1.71de3ap-19f;
            sp = KB_MF_FMA(sp, z, -0x1.a01a02p-13f);
            sp = KB_MF_FMA(sp, z, 0x1.111112p-7f);
            sp = KB_MF_FMA(sp, z, -0x1.555556p-3f);
            sp = KB_MF_FMA(sp * z, r, r);
            cp = -0x1.27e4fcp-22f;
            cp = KB_MF_FMA(cp, z, 0x1.a01a02p-16f);
            cp = KB_MF_FMA(cp, z, -0x1.6c16c2p-10f);
            cp = KB_MF_FMA(cp, z, 0x1.555556p-5f);
            cp = KB_MF_FMA(cp, z, -0.5f);
            cp = KB_MF_FMA(cp, z, 1.0f);
            if (q == 0)
                return sp;
            if (q == 1)
                return cp;
            if (q == 2)
                return -sp;
            return -cp;
        }
    }
}

KB_MF_FN float kb_mf_sin(float x)
{
    return kb_mf_sincos(x, 0);
}

KB_MF_FN float kb_mf_cos(float x)
{
    return kb_mf_sincos(x, 1);
}

KB_MF_FN float kb_mf_tanh(float x)
{
    if (x != x)
        return x;
    {
        float a = x < 0.0f ? -x : x;
        float t;
        if (a > 9.1f) {
            t = 1.0f;
        } else {
            float e = kb_mf_expm1(2.0f * a);
            t = e / (e + 2.0f);
        }
        return KB_MF_AS_F32(KB_MF_AS_U32(t) | (KB_MF_AS_U32(x) & 0x80000000u)); /* -0 too */
    }
}

/* ---------------------------------------------------------------- neural-network helpers */

/* x * sigmoid(x) as x / (1 + e^-x); -inf gives -0 (not -inf / inf). */
KB_MF_FN float kb_mf_silu(float x)
{
    if (x != x)
        return x;
    if (x == -KB_MF_AS_F32(KB_MF_INF_BITS))
        return -0.0f;
    return kb_mf_canon(x / (1.0f + kb_mf_exp(-x)));
}

/* cap * tanh(x / cap), the logit soft-capping of Gemma 2 (cap > 0). */
KB_MF_FN float kb_mf_softcap(float x, float cap)
{
    return kb_mf_mul(cap, kb_mf_tanh(kb_mf_div(x, cap)));
}

/* An ATTN_SOFTMAX score before the softmax: softcap(scale * x) when cap > 0, else scale * x. */
KB_MF_FN float kb_mf_attn_score(float x, float scale, float cap)
{
    float y = kb_mf_mul(x, scale);
    return cap > 0.0f ? kb_mf_softcap(y, cap) : y;
}

/* ---------------------------------------------------------------- the record ops */

/* MATH1 op on x (AXPB: a * x + b with one rounding). */
KB_MF_FN float kb_mf_math1(kb_mf_u32 op, float x, float a, float b)
{
    float r;

    if (op == KB_MF_M1_ABS)
        return KB_MF_AS_F32(KB_MF_AS_U32(x) & 0x7FFFFFFFu);
    if (op == KB_MF_M1_NEG)
        return KB_MF_AS_F32(KB_MF_AS_U32(x) ^ 0x80000000u);
    if (x != x)
        return x;
    switch (op) {
    case KB_MF_M1_EXP: r = kb_mf_exp(x); break;
    case KB_MF_M1_LOG: r = kb_mf_log(x); break;
    case KB_MF_M1_SQRT: r = x < 0.0f ? KB_MF_AS_F32(KB_MF_NAN_BITS) : KB_MF_SQRT(x); break;
    case KB_MF_M1_SIGMOID: r = 1.0f / (1.0f + kb_mf_exp(-x)); break;
    case KB_MF_M1_COS: r = kb_mf_cos(x); break;
    case KB_MF_M1_SIN: r = kb_mf_sin(x); break;
    case KB_MF_M1_RECIP: r = 1.0f / x; break;
    case KB_MF_M1_RELU: r = x < 0.0f ? 0.0f : x; break;
    case KB_MF_M1_GELU: {
        float u = 0.7978845608f * (x + 0.044715f * (x * x * x));
        r = 0.5f * x * (1.0f + kb_mf_tanh(u));
        break;
    }
    case KB_MF_M1_AXPB: r = kb_mf_fma(a, x, b); break;
    case KB_MF_M1_RSQRT: r = x < 0.0f ? KB_MF_AS_F32(KB_MF_NAN_BITS) : 1.0f / KB_MF_SQRT(x); break;
    case KB_MF_M1_TANH: r = kb_mf_tanh(x); break;
    case KB_MF_M1_SILU: r = kb_mf_silu(x); break;
    case KB_MF_M1_SOFTCAP: r = kb_mf_softcap(x, a); break;
    default: r = KB_MF_AS_F32(KB_MF_NAN_BITS); break;
    }
    return kb_mf_canon(r);
}

KB_MF_FN float kb_mf_math2(kb_mf_u32 op, float x, float y)
{
    switch (op) {
    case KB_MF_M2_ADD: return kb_mf_add(x, y);
    case KB_MF_M2_SUB: return kb_mf_sub(x, y);
    case KB_MF_M2_MUL: return kb_mf_mul(x, y);
    case KB_MF_M2_DIV: return kb_mf_div(x, y);
    case KB_MF_M2_MAX: return kb_mf_fmax(x, y);
    case KB_MF_M2_MIN: return kb_mf_fmin(x, y);
    default: return KB_MF_AS_F32(KB_MF_NAN_BITS);
    }
}

/* ---------------------------------------------------------------- number formats */

/*
 * DEQUANT (kb_oplog.h): which kept value of a 2:4 group holds position pos (0..3) of group g,
 * given the metadata byte holding g (low nibble for even g): 0, 1 or -1 (a pruned zero).
 */
KB_MF_FN int kb_mf_sparse_slot(kb_mf_u32 byte, kb_mf_u32 g, kb_mf_u32 pos)
{
    kb_mf_u32 nib = (byte >> (4u * (g & 1u))) & 0xFu;
    return (nib & 3u) == pos ? 0 : (nib >> 2) == pos ? 1 : -1;
}

/* The dequantized element: (x * s) * imm with a scale, x * imm without (NaN rules above). */
KB_MF_FN float kb_mf_deq(float x, float s, float imm, int has_scale)
{
    float v = has_scale ? kb_mf_mul(x, s) : x;
    return kb_mf_mul(v, imm);
}

/*
 * Quantized weights (host/kb_tl_q.h; a GEN record's op KB_GEN_QW quantizes where it replays):
 * the definitions every quantizer shares, so the host's weights and the device's agree to the
 * bit. fmt is kb_qfmt's code (KB_MF_QF_*).
 */
#define KB_MF_QF_F16 0u
#define KB_MF_QF_BF16 1u
#define KB_MF_QF_INT8 2u
#define KB_MF_QF_MXINT8 3u
#define KB_MF_QF_FP8E4M3 4u
#define KB_MF_QF_FP8E5M2 5u
#define KB_MF_QF_COUNT 6u
#define KB_MF_MX_BLOCK 32u /* MXINT8: rows of a column sharing one E8M0 scale */

/* v stored in the element type of format fmt (int8 for mxint8) and loaded back. */
KB_MF_FN float kb_mf_qround(kb_mf_u32 fmt, float v)
{
    switch (fmt) {
    case KB_MF_QF_F16: return kb_mf_h2f(kb_mf_f2h(v));
    case KB_MF_QF_BF16: return kb_mf_bf2f(kb_mf_f2bf(v));
    case KB_MF_QF_FP8E4M3: return kb_mf_e4m32f(kb_mf_f2e4m3(v));
    case KB_MF_QF_FP8E5M2: return kb_mf_e5m22f(kb_mf_f2e5m2(v));
    default: return kb_mf_i82f(kb_mf_f2i8(v));
    }
}

/* int8 / fp8: the per-channel scale of an absolute maximum, max(amax, FLT_MIN) at most FLT_MAX
 * times 1/Q rounded once (Q = 127, 448, 57344): CLAMP then AXPB, as tl_dot_q records it. */
KB_MF_FN float kb_mf_qchan_scale(kb_mf_u32 fmt, float amax)
{
    float c = kb_mf_fmin(kb_mf_fmax(amax, 0x1p-126f), 0x1.fffffep127f);
    float inv = fmt == KB_MF_QF_FP8E4M3 ? 0x1.24924ap-9f    /* 1/448, rounded */
                : fmt == KB_MF_QF_FP8E5M2 ? 0x1.24924ap-16f /* 1/57344 */
                                          : 0x1.020408p-7f; /* 1/127 */
    return kb_mf_math1(KB_MF_M1_AXPB, c, inv, 0.0f);
}

/* MXINT8: the E8M0 scale value of a block's absolute maximum (floor of log2), and the divisor
 * of the block's elements, the scale times 2^-6 (exact). */
KB_MF_FN float kb_mf_qmx_scale(float amax) { return kb_mf_e8m02f(kb_mf_f2e8m0(amax)); }
KB_MF_FN float kb_mf_qmx_div(float sv) { return kb_mf_math1(KB_MF_M1_AXPB, sv, 0x1p-6f, 0.0f); }

/* The element value of x with divisor d: the quotient stored in the format's element type. */
KB_MF_FN float kb_mf_qelem(kb_mf_u32 fmt, float x, float d)
{
    return kb_mf_qround(fmt, kb_mf_div(x, d));
}

/* 2:4: the positions kept of a group of four along K, the two largest magnitudes (a NaN ranks
 * lowest, ties keep the lower position), as the metadata nibble i0 | i1 << 2 with i0 < i1. */
KB_MF_FN kb_mf_u32 kb_mf_q24_keep(float w0, float w1, float w2, float w3)
{
    float m[4];
    int k0 = -1, k1 = -1, p;
    m[0] = w0 != w0 ? -1.0f : w0 < 0.0f ? -w0 : w0;
    m[1] = w1 != w1 ? -1.0f : w1 < 0.0f ? -w1 : w1;
    m[2] = w2 != w2 ? -1.0f : w2 < 0.0f ? -w2 : w2;
    m[3] = w3 != w3 ? -1.0f : w3 < 0.0f ? -w3 : w3;
    for (p = 0; p < 4; p++) /* strict >: ties keep the lower position */
        if (k0 < 0 || m[p] > m[k0])
            k0 = p;
    for (p = 0; p < 4; p++)
        if (p != k0 && (k1 < 0 || m[p] > m[k1]))
            k1 = p;
    return k0 < k1 ? (kb_mf_u32)(k0 | k1 << 2) : (kb_mf_u32)(k1 | k0 << 2);
}

#endif
