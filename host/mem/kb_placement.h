/*
 * kb_placement — where the pieces of a tensor live: DPPolicy -> ShardSpecs, and moving data
 * between a logical row-major host buffer and the shards' blocks.
 *
 * A tensor is treated as 2-D: rows = product of all but the last dimension, cols = the last.
 * DPPolicy is intra-device (one SIP): `cube` says how the tensor is split over cubes and `pe`
 * how each cube's part is split over that cube's PEs; each level is replicate, column_wise or
 * row_wise. Splits are balanced: with n parts of a length L, the first L % n parts get one
 * extra row/column. The tiled modes cut the tensor into tile_rows x tile_cols tiles (edge
 * tiles smaller), enumerate them in row-major or column-major tile order and deal them
 * round-robin to slots (slot s = cube * num_pes + pe), each tile becoming one shard.
 *
 * Every shard is a 2-D block (row0, col0, rows, cols) stored contiguous and row-major in its
 * own memory. Shard i's place in the tensor's virtual range is offset_bytes, the sum of the
 * sizes of shards 0..i-1 (so for an even split, shard i is at va_base + i * shard_nbytes,
 * the Triton-style `ptr + pid * stride` kernels use). Shard coordinates are structural
 * (sip, cube, pe); there is no flat index. Shard order: cube-major, then PE (block modes);
 * tile order (tiled modes).
 */
#ifndef KB_PLACEMENT_H
#define KB_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kbcl_runtime.h" /* kb_dp_policy */

typedef struct kb_shard_spec {
    unsigned sip, cube, pe;
    uint64_t row0, col0, rows, cols;
    uint64_t offset_bytes, nbytes;
} kb_shard_spec;

/*
 * Resolves dp for a rows x cols tensor of `itemsize`-byte elements on a SIP with
 * topo_cubes cubes of topo_pes PEs; every shard gets sip = target_sip. *out is malloc'd
 * (caller frees). Errors (KB_ERR_RANGE / KB_ERR_INVAL, message in eb): num_cubes/num_pes
 * beyond the topology or negative, more parts than rows/columns to split, zero-sized tensor,
 * zero tile size.
 */
int kb_dp_resolve(const kb_dp_policy *dp, uint64_t rows, uint64_t cols, size_t itemsize,
                  int topo_pes, int topo_cubes, unsigned target_sip,
                  kb_shard_spec **out, size_t *nshards, kb_errbuf *eb);

/* Copies shard s's block out of / into a logical row-major buffer with `cols` columns. */
void kb_shard_pack(const kb_shard_spec *s, const void *logical, uint64_t cols, size_t itemsize,
                   void *block);
void kb_shard_unpack(const kb_shard_spec *s, const void *block, uint64_t cols, size_t itemsize,
                     void *logical);

#endif
