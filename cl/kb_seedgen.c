/*
 * kb_seedgen — seeded test values (kb_seedgen.h). The scalar path and the 64-wide path give the
 * same bits; replay.cl's kb_gen is the device's copy of perm12 and input_key.
 */
#include "kb_seedgen.h"

#include <math.h>
#include <string.h>

#include "kb_dtype.h"
#include "kb_err.h"
#include "kb_mathfn.h"

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

float kb_seedgen_value(uint32_t seed, int64_t tile, int64_t i, int64_t n)
{
    uint64_t p = (uint64_t)tile * (uint64_t)n + (uint64_t)i;
    int k = (int)perm12((uint32_t)(p & 0xfffu), input_key(seed, p));
    return (float)(k - KB_SEEDGEN_GRID / 2) / 128.0f;
}

/*
 * perm12(base + j, key) for j in [0, 64), in 16-bit lanes: every step keeps 12 bits, and the
 * low 16 bits of a sum or product depend only on the operands' low 16 bits, so this is
 * perm12 exactly; a fixed trip count of 16-bit operations vectorises (8 lanes with SSE2).
 */
static void perm12_64(uint16_t *out, uint32_t base, uint32_t key)
{
    uint16_t k[4];
    for (int r = 0; r < 4; r++)
        k[r] = (uint16_t)(key >> (r * 5));
    for (int j = 0; j < 64; j++) {
        uint16_t x = (uint16_t)((base + (uint32_t)j) & 0xfffu);
        for (int r = 0; r < 4; r++) {
            x = (uint16_t)((x + k[r]) & 0xfffu);
            x = (uint16_t)((x * 0x9e5u) & 0xfffu);
            x ^= (uint16_t)(x >> 5);
            x = (uint16_t)((x * 0x2c1u) & 0xfffu);
            x ^= (uint16_t)(x >> 7);
        }
        out[j] = x;
    }
}

KB_VECTOR_CLONES
void kb_seedgen_span(float *x, uint32_t seed, int64_t tile, int64_t i0, int64_t len, int64_t n)
{
    uint64_t p = (uint64_t)tile * (uint64_t)n + (uint64_t)i0;
    uint16_t v[64];
    float f[64];
    /* one key per block of 4096 positions, then the permutation alone per element, 64
     * positions at a time (x / 128 == x * 2^-7 exactly) */
    for (int64_t k = 0; k < len;) {
        uint32_t key = input_key(seed, p), lo = (uint32_t)(p & 0xfffu);
        int64_t m = (int64_t)(0x1000u - lo);
        if (m > len - k)
            m = len - k;
        for (int64_t j = 0; j < m;) {
            uint32_t at = lo + (uint32_t)j, g = at & ~63u, off = at - g;
            int64_t c = (int64_t)(64u - off);
            if (c > m - j)
                c = m - j;
            perm12_64(v, g, key);
            for (int q = 0; q < 64; q++)
                f[q] = (float)((int)v[q] - KB_SEEDGEN_GRID / 2) * 0x1p-7f;
            memcpy(x + k + j, f + off, (size_t)c * sizeof *f);
            j += c;
        }
        k += m;
        p += (uint64_t)m;
    }
}

/* In 64-bit unsigned arithmetic, as replay.cl's kb_gen: a GEN record's tile and position are
 * any 64-bit values from the op log, where a signed i0 + j could overflow and a negative one
 * would take a different remainder than the device's (found by tests/fuzz/fuzz_replay.c). */
void kb_seedgen_sign(float *x, int64_t ntiles, int64_t tile, int64_t i0, int64_t len)
{
    for (int64_t j = 0; ntiles > 0 && j < len; j++)
        if (((uint64_t)i0 + (uint64_t)j) % (uint64_t)ntiles != (uint64_t)tile)
            x[j] = x[j] < 0.0f ? -1.0f : 1.0f;
}

int32_t kb_seedgen_pattern(uint64_t i, uint32_t seed, uint32_t range)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ (seed * 0x9e3779b9u + 0x7f4a7c15u);
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    /* in 64 bits: a range past the rule (from a log's map) gives some value, never overflow */
    return (int32_t)((int64_t)(h % (2u * range + 1u)) - (int64_t)range);
}

void kb_seedgen_pattern_span(float *x, uint32_t seed, uint32_t range, float inv, float add,
                             uint64_t i0, uint64_t step, int64_t len)
{
    for (int64_t j = 0; j < len; j++) /* product exact (inv a power of two), one rounding */
        x[j] = (float)kb_seedgen_pattern(i0 + (uint64_t)j * step, seed, range) * inv + add;
}

float kb_seedgen_mapped(uint64_t row, const kb_seedgen_col *c)
{
    if (row == KB_SEEDGEN_ROW_ZERO)
        return 0.0f;
    return (float)kb_seedgen_pattern(row * c->rmul + c->off, c->seed, c->range) * c->inv;
}

int kb_seedgen_pattern_ok(uint32_t range, float inv, float add)
{
    int ex;
    return range <= KB_SEEDGEN_PAT_MAX_RANGE && isfinite(inv) && inv >= 0x1p-100f &&
           inv <= 0x1p100f && frexpf(inv, &ex) == 0.5f && isfinite(add) &&
           (add == 0.0f || fabsf(add) >= 0x1p-100f);
}

int kb_seedgen_col_ok(const kb_seedgen_col *c)
{
    return kb_seedgen_pattern_ok(c->range, c->inv, 0.0f);
}

uint64_t kb_seedgen_qw_rows(unsigned fmt, int sparse, unsigned part, uint64_t k)
{
    switch (part) {
    case KB_SEEDGEN_QW_Q: return sparse ? k / 2 : k;
    case KB_SEEDGEN_QW_SCALE: return fmt == KB_MF_QF_MXINT8 ? k / KB_MF_MX_BLOCK : 1;
    default: return (k + 7) / 8;
    }
}

int kb_seedgen_qw_dtype(unsigned fmt, unsigned part)
{
    static const int qdt[KB_MF_QF_COUNT] = { KB_F16, KB_BF16, KB_I8, KB_I8, KB_FP8E4M3,
                                             KB_FP8E5M2 };
    if (fmt >= KB_MF_QF_COUNT || part > KB_SEEDGEN_QW_META)
        return -1;
    if (part == KB_SEEDGEN_QW_Q)
        return qdt[fmt];
    if (part == KB_SEEDGEN_QW_META)
        return KB_I8;
    return fmt == KB_MF_QF_MXINT8 ? KB_E8M0 : fmt >= KB_MF_QF_INT8 ? KB_F32 : -1;
}
