/*
 * kb_seedgen — generated test values, in the layer every Phase-2 backend can reach, so that a
 * GEN record (kb_oplog.h) is generated where it replays: on the host by the ref backend, on
 * the device by replay.cl's kb_gen, which computes the same integer steps (keep the two in
 * step). Three families: the collectives' seeded values (kb_ccl_input), the benches' pattern
 * (kb_bench_pattern), and weights gathered from patterns by row and column maps (the TP
 * layers' and the decoder's, quantized where they replay: kb_tl_q.h).
 *
 * Seeded values: position p = tile * n + i of a tile of n values gets (k - 2048) / 128, k a
 * keyed bijection of p's low 12 bits, the key mixed from the seed and p's upper bits: every
 * value is exact in f16 and |value| <= 16 (kb_ccl.h says why the collectives' checks want
 * that grid). Limits: positions are 64-bit; values repeat across blocks of 4096 positions
 * only by chance; the pattern hashes a position's low 32 bits.
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

/*
 * The benches' pattern (kb_bench_pattern, a GEN record's op KB_GEN_PAT): the integer
 * h(seed, i) mod (2*range + 1) - range, in [-range, range], of a hash of the position's low
 * 32 bits. A bench scales it by 1/den; with den a power of two that is exact, and so the same
 * on every backend. Limit: range <= KB_SEEDGEN_PAT_MAX_RANGE (the integers stay exact in f32).
 */
#define KB_SEEDGEN_PAT_MAX_RANGE (1 << 24)
int32_t kb_seedgen_pattern(uint64_t i, uint32_t seed, uint32_t range);
/* x[j] = kb_seedgen_pattern(p_j) * inv + add, p_j = i0 + j * step (wrapping in 64 bits), for
 * j in [0, len): a row (step 1) or a column (step ld) of a pattern matrix. */
void kb_seedgen_pattern_span(float *x, uint32_t seed, uint32_t range, float inv, float add,
                             uint64_t i0, uint64_t step, int64_t len);

/*
 * A generated weight (a GEN record's op KB_GEN_QW, kb_oplog.h): element (i, j) of a k x nb
 * block is kb_seedgen_pattern(rows[i] * c.rmul + c.off, c.seed, c.range) * c.inv, c the
 * column's entry, or +0 where rows[i] is KB_SEEDGEN_ROW_ZERO: any gather of a pattern
 * matrix's rows and columns (permuted heads, a rank's slice, a transposed view). In the op
 * log's payload the row map is k little-endian uint64 values and the column map nb entries of
 * this 32-byte layout (little-endian, as every backend reads it). inv must be a power of two
 * of at least 2^-100 and range at most KB_SEEDGEN_PAT_MAX_RANGE, or the backends may differ.
 */
#define KB_SEEDGEN_ROW_ZERO UINT64_MAX
typedef struct kb_seedgen_col {
    uint64_t off, rmul;
    uint32_t seed, range;
    float inv;
    uint32_t pad_; /* 0 */
} kb_seedgen_col;
#define KB_SEEDGEN_COL_BYTES 32

/* A quantized weight's parts (kb_tl_q.h's layouts) as a GEN record names them, the rows one
 * copy of k rows gives each (q: k, or k/2 sparse; scale: 1, or k/32 for mxint8; meta:
 * ceil(k/8)), and each part's element type (a kb_dtype; -1 for a bad fmt or part). fmt is
 * kb_mathfn.h's KB_MF_QF_* code. */
enum { KB_SEEDGEN_QW_Q = 0, KB_SEEDGEN_QW_SCALE = 1, KB_SEEDGEN_QW_META = 2 };
uint64_t kb_seedgen_qw_rows(unsigned fmt, int sparse, unsigned part, uint64_t k);
int kb_seedgen_qw_dtype(unsigned fmt, unsigned part);

/* Element value of row map entry row in column c (the definition above). */
float kb_seedgen_mapped(uint64_t row, const kb_seedgen_col *c);
/* Whether c keeps the rules above (a writer checks its maps with it). */
int kb_seedgen_col_ok(const kb_seedgen_col *c);
/* Whether a pattern scaled by inv (1/den) plus add gives the same bits on every backend: range
 * at most KB_SEEDGEN_PAT_MAX_RANGE, inv a power of two in [2^-100, 2^100], add 0 or finite of
 * magnitude at least 2^-100 (far from subnormals, which a device may flush: a product is then
 * exact and a sum a multiple of 2^-123, never below f32's least normal). */
int kb_seedgen_pattern_ok(uint32_t range, float inv, float add);

#endif
