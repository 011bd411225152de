/*
 * kb_dtype — element types of simulated tensors and their conversions: the public part is
 * kbcl_dtype.h; this header adds the bulk conversions kbcl's own layers use.
 *
 * The 8-bit conversions are kb_mathfn.h's, the text the OpenCL kernels are built from, so that
 * every backend and the host reference produce identical bits.
 */
#ifndef KB_DTYPE_H
#define KB_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "kbcl_dtype.h"

/*
 * Bulk forms: src[0..n) stored as elements [i0, i0 + n) of a buffer of type t, and elements
 * [i0, i0 + n) loaded into dst: exactly kb_dtype_store's and kb_dtype_load's bits (checked on
 * every f32 bit pattern), written without branches in blocks of 16 that the compiler
 * vectorises. For host writes and reads of whole tensors.
 */
void kb_dtype_store_n(kb_dtype t, void *base, size_t i0, const float *src, size_t n);
void kb_dtype_load_n(kb_dtype t, const void *base, size_t i0, float *dst, size_t n);

#endif
