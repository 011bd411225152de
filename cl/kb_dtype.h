/*
 * kb_dtype — element types of simulated tensors and their conversions.
 *
 * Storage types are f16 (IEEE binary16, the default), bf16 and f32. All arithmetic is done in
 * f32; a value is rounded once, when it is stored in a narrower type, with round-to-nearest-
 * even (NaN stays NaN, overflow goes to infinity, subnormals are kept). Conversions are exact
 * software routines so that every backend and the host reference produce identical bits.
 */
#ifndef KB_DTYPE_H
#define KB_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum kb_dtype { KB_F16 = 0, KB_BF16 = 1, KB_F32 = 2, KB_NDTYPES } kb_dtype;

static inline size_t kb_dtype_size(kb_dtype t) { return t == KB_F32 ? 4u : 2u; }
const char *kb_dtype_name(kb_dtype t);      /* "f16", "bf16", "f32" */
int kb_dtype_from_name(const char *name);   /* -1 when unknown */

float kb_f16_to_f32(uint16_t h);
uint16_t kb_f32_to_f16(float f);            /* round to nearest even */
float kb_bf16_to_f32(uint16_t h);
uint16_t kb_f32_to_bf16(float f);           /* round to nearest even */

/* Element i of a buffer of type t, as f32 / store f32 into element i (rounding once). */
float kb_dtype_load(kb_dtype t, const void *base, size_t i);
void kb_dtype_store(kb_dtype t, void *base, size_t i, float v);

/*
 * Bulk forms: src[0..n) stored as elements [i0, i0 + n) of a buffer of type t, and elements
 * [i0, i0 + n) loaded into dst: exactly kb_dtype_store's and kb_dtype_load's bits (checked on
 * every f32 bit pattern), written without branches in blocks of 16 that the compiler
 * vectorises. For host writes and reads of whole tensors.
 */
void kb_dtype_store_n(kb_dtype t, void *base, size_t i0, const float *src, size_t n);
void kb_dtype_load_n(kb_dtype t, const void *base, size_t i0, float *dst, size_t n);

/* Distance in units in the last place of f16 between two values (for tests and bounds). */
float kb_f16_ulp(float v);

#endif
