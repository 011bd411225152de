/*
 * kb_vquery — questions a Phase-2 device answers about data it holds, so that the answer, not
 * the data, crosses the bus: the check of a seeded collective's result (all-reduce: CHECK,
 * every other kind: COLL) and the digest of it.
 * At GB sizes reading the result back and checking it on the host costs more than the whole
 * replay; on the device both are a few milliseconds.
 *
 * A query names `ntiles` tiles by their offsets in the device arena (kb_resident_query turns
 * PAs into them) and fills a small POD result. Every device-resident backend answers it with
 * the same bits: the plain-C code here (kb_vquery_run_host) is the oracle the ref backend's
 * resident variant runs; replay.cl's kb_vq_* kernels are the OpenCL copy (keep them in step).
 *
 * KB_VQ_CHECK — tiles of n f16 values, the result of an all-reduce (sum) of the seeded inputs
 * x(t, i) = kb_seedgen_value(seed, t, i, n), t < ntiles (root 0). Column i's reference:
 *   ordered: a ring's chain (kb_ccl_ref_ring_allreduce): from tile s = the ring chunk of n in
 *            ntiles chunks that holds i, acc = x(s, i), then acc + x(s + k mod ntiles, i) in
 *            f32 for k = 1 .. ntiles - 1, rounded to f16 after every hop but the last;
 *   else:    the sum over t in ascending order, in double.
 * Element (t, i) then is checked as kb_ccl_verify checks it (exact = the reference, want = it
 * rounded to f16, bound = half an f16 ulp of it + acc_bound; with acc_bound 0 the bits must be
 * want's, else |got - exact| <= bound; a NaN error counts as infinite). Result: one
 * kb_vq_tile per tile, then a kb_vq_sums (wq over the n columns, the same in every tile):
 * everything kb_ccl_verify's verdict needs.
 * KB_VQ_COLL — the same check of every other collective of the seeded f16 inputs (sum), tile t
 * being rank t's result: element (t, i)'s reference (kb_ccl_ref.c's references, with
 * T = ntiles, c = n / T, R = root, x as above) is, by `coll`:
 *   KB_VQ_C_ALLGATHER       x(i / c, i)
 *   KB_VQ_C_ALLTOALL        x(i / c, t * c + i mod c)
 *   KB_VQ_C_BROADCAST       x(R, i)
 *   KB_VQ_C_SHIFT           x(t - 1 mod T, i) (send/recv east; T = 1: x(t, i))
 *   KB_VQ_C_REDUCE_SCATTER  i / c == t: the sum of column i, else x(t, i) (the input kept)
 *   KB_VQ_C_REDUCE          t == R: the sum of column i, else x(t, i)
 * where "the sum" is, ordered: the ring's chain from rank s = t + 1 mod T (reduce-scatter) or
 * R + 1 mod T (reduce) as above; else the sum over ranks in ascending order, in double. A copy
 * is exact (acc_bound 0 for the kinds that only move data: the bits must match). Each element
 * is checked as for CHECK; the result has the same layout, but its kb_vq_sums' wq is the
 * rounded reference's grid sum over every element of every tile (the references differ per
 * tile). Tiles of any length (n < 2^62); c needs n mod T == 0 for the chunked kinds.
 * KB_VQ_DIGEST — the digest of the tiles' bytes in tile order, as one stream of
 * ntiles * tile_bytes bytes (kb_vquery_digest_host). Result: one uint64_t.
 *
 * The digest: FNV-1a 64 of the bytes when there are at most KB_VQ_DIGEST_BLOCK of them (what
 * the benches always printed); else FNV-1a 64 over the little-endian 8-byte FNV-1a 64 digests
 * of the consecutive KB_VQ_DIGEST_BLOCK-byte blocks (the last one may be shorter), which
 * thousands of device threads compute at once. Limits: CHECK tiles of at most 2^31 elements;
 * CHECK and COLL cover f16 sums of kb_seedgen inputs only (other dtypes and ops are checked on
 * the host).
 */
#ifndef KB_VQUERY_H
#define KB_VQUERY_H

#include <stddef.h>
#include <stdint.h>

#define KB_VQ_DIGEST_BLOCK 65536u
#define KB_VQ_FNV_INIT UINT64_C(0xcbf29ce484222325)
#define KB_VQ_FNV_PRIME UINT64_C(0x100000001b3)

enum { KB_VQ_CHECK = 1, KB_VQ_DIGEST = 2, KB_VQ_COLL = 3 };

/* KB_VQ_COLL's collectives (above). */
enum {
    KB_VQ_C_ALLGATHER = 1,
    KB_VQ_C_REDUCE_SCATTER,
    KB_VQ_C_BROADCAST,
    KB_VQ_C_REDUCE,
    KB_VQ_C_ALLTOALL,
    KB_VQ_C_SHIFT,
};

/* A query (plain data: it travels to a device server as is; its size is part of the device
 * server's protocol version). */
typedef struct kb_vquery {
    uint32_t kind;        /* KB_VQ_* */
    uint32_t ntiles;
    uint64_t n;           /* CHECK, COLL: f16 elements per tile */
    uint64_t tile_bytes;  /* DIGEST: bytes per tile */
    uint32_t seed;        /* CHECK, COLL: kb_seedgen's seed */
    uint32_t ordered;     /* CHECK, COLL: 1 the ring's chain, 0 the sum in double */
    double acc_bound;     /* CHECK, COLL: kb_ccl_verify's acc_bound */
    uint32_t coll;        /* COLL: KB_VQ_C_* */
    uint32_t root;        /* COLL: broadcast's and reduce's root (< ntiles), else 0 */
} kb_vquery;

/* One tile's part of a CHECK (kb_ccl_verify's per-tile figures, first occurrences in
 * column order). */
typedef struct kb_vq_tile {
    double max_err, bound;   /* the largest error (-1: no element) and its bound */
    int64_t bad_elem;        /* the first failing column, -1: none */
    double bad_got, bad_want;
    int64_t nwrong;
    int64_t gq;              /* sum of got * 128 over the tile (when every value is on the grid) */
    int64_t offgrid;         /* 1: some got * 128 is no integer (gq is then meaningless) */
} kb_vq_tile;

/* A tile's part before any element. */
#define KB_VQ_TILE_EMPTY ((kb_vq_tile){ -1.0, 0.0, -1, 0.0, 0.0, 0, 0, 0 })
/* Adds the part of a later column range to a tile's part: the first worst error and first
 * failing column stay the earlier ones, counts and sums add up. */
void kb_vq_tile_merge(kb_vq_tile *a, const kb_vq_tile *later);

/* After the tiles: the rounded reference's grid sum over the columns. */
typedef struct kb_vq_sums {
    int64_t wq, offgrid;
} kb_vq_sums;

/* Bytes of the query's result (0 for an unknown kind). */
size_t kb_vquery_result_size(const kb_vquery *q);
/* Bytes each tile of q covers in the arena: n f16 values (CHECK, COLL) or tile_bytes. */
uint64_t kb_vquery_tile_bytes(const kb_vquery *q);
/* Whether q's fields are in range for its kind (KB_VQ_COLL: a known coll, root < ntiles, n
 * divisible by ntiles where c is used); 0 for an unknown kind. */
int kb_vquery_valid(const kb_vquery *q);
/* KB_VQ_COLL's exact reference of element (t, i) (above). */
double kb_vquery_coll_ref(const kb_vquery *q, uint32_t t, uint64_t i);
/* Answers q over host memory: tile t at base + off[t]. out: kb_vquery_result_size bytes.
 * KB_ERR_NOMEM, KB_ERR_INVAL (unknown kind) or 0. */
int kb_vquery_run_host(const kb_vquery *q, const uint8_t *base, const uint64_t *off, void *out);
/* The digest of n contiguous bytes (above), with up to `threads` threads for large n. */
uint64_t kb_vquery_digest_host(const void *data, uint64_t n, int threads);
/* FNV-1a 64 of n bytes continuing from h. */
uint64_t kb_vq_fnv(const void *data, size_t n, uint64_t h);
/* The digest of a stream from its nb block digests (nb == 1: that digest itself). */
uint64_t kb_vq_combine(const uint64_t *bh, uint64_t nb);
/* A device's CHECK parts merged into the result: part[t * nslab + s] is slab s (columns in
 * ascending slabs) of tile t; wpart[2g], wpart[2g + 1] (g < ngroups) the reference's grid sums
 * and off-grid flags. */
void kb_vq_merge_check(const kb_vq_tile *part, uint32_t ntiles, uint32_t nslab,
                       const int64_t *wpart, size_t ngroups, void *out);

#endif
