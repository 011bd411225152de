/*
 * kbcl_dtype — the element types of simulated tensors and their conversions (public API,
 * docs/api.md).
 *
 * Storage types are f16 (IEEE binary16, the default), bf16 and f32, and for number formats
 * (docs/formats.md) int8, fp8 e4m3 and e5m2 (OCP FP8), e8m0 (the OCP MX block scale) and int32.
 * All arithmetic is done in f32; a value is rounded once, when it is stored in a narrower
 * type, with round-to-nearest-even (NaN stays NaN, f16/bf16 overflow goes to infinity,
 * subnormals are kept). The 8-bit formats saturate instead: finite overflow gives the largest
 * finite value (int8: [-128, 127], NaN -> 0; e4m3: +-448, +-inf -> +-448; e5m2: +-57344, inf
 * kept); e8m0 stores the power of two at or below the value (the MX scale rule). The
 * conversions are exact software routines, the same bits on every Phase-2 backend and in the
 * host reference.
 */
#ifndef KBCL_DTYPE_H
#define KBCL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "kbcl_base.h"

/* Codes are shared with cl/replay.cl (3 bits there): keep them below 8. */
typedef enum kb_dtype {
    KB_F16 = 0, KB_BF16 = 1, KB_F32 = 2,
    /* number formats (issue #16) */
    KB_I8 = 3, KB_FP8E4M3 = 4, KB_FP8E5M2 = 5, KB_E8M0 = 6, KB_I32 = 7,
    KB_NDTYPES
} kb_dtype;

/* Bytes per element (1 for a code out of range, so sizes never come out 0). */
static inline size_t kb_dtype_size(kb_dtype t)
{
    static const unsigned char sz[KB_NDTYPES] = { 2, 2, 4, 1, 1, 1, 1, 4 };
    return (unsigned)t < KB_NDTYPES ? sz[t] : 1u;
}
/* "f16", "bf16", "f32", "i8", "fp8e4m3", "fp8e5m2", "e8m0", "i32" */
KB_API const char *kb_dtype_name(kb_dtype t);
KB_API int kb_dtype_from_name(const char *name);   /* -1 when unknown */

KB_API float kb_f16_to_f32(uint16_t h);
KB_API uint16_t kb_f32_to_f16(float f);            /* round to nearest even */
KB_API float kb_bf16_to_f32(uint16_t h);
KB_API uint16_t kb_f32_to_bf16(float f);           /* round to nearest even */
/* The number-format conversions (see the file comment for rounding and saturation). */
KB_API float kb_i8_to_f32(uint8_t c);
KB_API uint8_t kb_f32_to_i8(float f);
KB_API float kb_e4m3_to_f32(uint8_t c);
KB_API uint8_t kb_f32_to_e4m3(float f);
KB_API float kb_e5m2_to_f32(uint8_t c);
KB_API uint8_t kb_f32_to_e5m2(float f);
KB_API float kb_e8m0_to_f32(uint8_t c);
KB_API uint8_t kb_f32_to_e8m0(float f);

/* Element i of a buffer of type t, as f32 / store f32 into element i (rounding once). */
KB_API float kb_dtype_load(kb_dtype t, const void *base, size_t i);
KB_API void kb_dtype_store(kb_dtype t, void *base, size_t i, float v);

/* Distance in units in the last place of f16 between two values (for tests and bounds). */
KB_API float kb_f16_ulp(float v);

#endif
