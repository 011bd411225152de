/*
 * kb_tl_gemm — gemm at any size: C = A @ B for operands in memory, cut into output tiles whose
 * f32 accumulator fits the PE's scratch, each tile computed by one tl_dot that SchedulerV2
 * streams over M, N and K through TCM, and split over several PEs by output tiles.
 *
 * tl_gemm(tl, &op) with a kb_gemm_op: A is m x k of dtype da at VA a with row stride lda
 * elements, B k x n of db at b (ldb), C m x n at c (ldc) in its tensor's dtype. Tile t (row-major over the tile grid) is done by the caller whose part is
 * t % nparts (round-robin), so nparts kernels with parts 0..nparts-1 together write all of C,
 * each tile once. Per tile: tl_ref2d of A's row block (tm x k) and B's column block (k x tn)
 * in place, tl_dot (SchedulerV2: tile_m x tile_n x tile_k steps, double-buffered DMAs into the
 * reserved TCM, docs/timing-model.md), tl_store2d into C (rounded once into C's dtype), tl_free.
 * Its simulated time is therefore the sum of those calls; it adds none of its own.
 * Every output element is the f32 sum of its k products in ascending k (one tl_dot over the
 * whole of K), so C's bits do not depend on the tiling or on nparts.
 *
 * Tiling (kb_tl_gemm_tiling): with nparts == 1, the whole m x n output is one tile when its
 * f32 accumulator fits the largest free block of the PE's scratch (what a single tl_dot needs,
 * so a gemm that fitted one tl_dot keeps its exact cost); otherwise tiles of at most
 * min(largest free, pe.scratch.size_bytes / 2) bytes of f32, squarish, in multiples of the
 * SchedulerV2 tile (pe.scheduler.tile_m/n) where they are that big. With nparts > 1 every
 * part must cut the same way, so the budget is pe.scratch.size_bytes / 2 from the
 * configuration alone (that much scratch must be free), and tiles are halved (the longer side
 * first, not below a scheduler tile) until there are at least nparts of them.
 * Limits: operands must each lie in one shard's mapping (tl_ref2d's rule); misuse stops the
 * kernel with a message naming tl_gemm.
 */
#ifndef KB_TL_GEMM_H
#define KB_TL_GEMM_H

#include <stdint.h>

#include "kb_tl.h"

/* One caller's share of C = A @ B (the file comment has the rules); written with designated
 * initialisers at the call, so that the three operands' addresses and strides cannot trade
 * places unnoticed. */
typedef struct kb_gemm_op {
    kb_va c, a, b;             /* the operands' VAs */
    uint32_t ldc, lda, ldb;    /* their row strides, elements */
    uint32_t m, n, k;          /* C is m x n, A m x k, B k x n */
    kb_dtype da, db;           /* A's and B's dtypes (C's is its tensor's) */
    int part, nparts;          /* this caller does tiles t with t % nparts == part */
} kb_gemm_op;

void tl_gemm(kb_tl *tl, const kb_gemm_op *op);

typedef struct kb_gemm_tiling {
    uint32_t tm, tn;           /* tile rows / columns (edge tiles are smaller) */
    uint32_t tiles_m, tiles_n; /* tile grid: cdiv(m, tm) x cdiv(n, tn) */
} kb_gemm_tiling;

/*
 * The tiling tl_gemm uses for an m x n output: room = bytes of the largest scratch block free
 * (only consulted when nparts == 1), scratch = pe.scratch.size_bytes, (gm, gn) =
 * pe.scheduler.tile_m/n. Returns 0, or -1 when not even a 1 x 1 f32 tile fits.
 */
int kb_tl_gemm_tiling(uint32_t m, uint32_t n, uint64_t room, uint64_t scratch, uint32_t gm,
                      uint32_t gn, int nparts, kb_gemm_tiling *out);

#endif
