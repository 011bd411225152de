/*
 * kb_seedgen — the seeded, position-dependent test values of the collectives (kb_ccl_input),
 * in the layer every Phase-2 backend can reach, so that a GEN record (kb_oplog.h) is
 * generated where it replays: on the host by the ref backend, on the device by replay.cl's
 * kb_gen, which computes the same integer permutation (keep the two in step).
 *
 * Position p = tile * n + i of a tile of n values gets (k - 2048) / 128, k a keyed bijection
 * of p's low 12 bits, the key mixed from the seed and p's upper bits: every value is exact
 * in f16 and |value| <= 16 (kb_ccl.h says why the collectives' checks want that grid).
 * Limits: positions are 64-bit; values repeat across blocks of 4096 positions only by chance.
 */
#ifndef KB_SEEDGEN_H
#define KB_SEEDGEN_H

#include <stdint.h>

/* Values live on a grid of this many steps of 1/128, centred on 0. */
#define KB_SEEDGEN_GRID 4096

/* The value of tile `tile`'s element i (tiles of n elements). */
float kb_seedgen_value(uint32_t seed, int64_t tile, int64_t i, int64_t n);
/* x[j] = kb_seedgen_value(seed, tile, i0 + j, n) for j in [0, len), vectorised. */
void kb_seedgen_span(float *x, uint32_t seed, int64_t tile, int64_t i0, int64_t len, int64_t n);
/*
 * The "sign" variant (a GEN record's op KB_GEN_SIGN; the inputs of a product): element i keeps
 * its value only on tile i mod ntiles and is +-1 (its value's sign) on every other tile.
 * Applied to x[0, len) holding elements [i0, i0 + len) of `tile`.
 */
void kb_seedgen_sign(float *x, int64_t ntiles, int64_t tile, int64_t i0, int64_t len);

#endif
