/*
 * kb_resident — device-resident simulated memory for a Phase-2 backend: which PA ranges live
 * where in the backend's device arena, across flushes, and the transfers that keep the
 * memory store (the host copy, kb_memstore.h) and the device copy consistent.
 *
 * A device backend creates one kb_resident with the primitive operations on its buffers
 * (kb_resident_ops) and returns it from kb_backend_ops.resident; kb_replay_flush then
 *   1. binds the store and log it replays (a store bound before is handed back first: its
 *      device-dirty bytes are pulled into it) and attaches itself as the store's mirror;
 *   2. uploads the bytes the host changed in the store (host-dirty) that are resident;
 *   3. places the plan's segments (kb_resident_place): a segment inside a resident one keeps
 *      its place; a new one goes at the end of the used part of the first block with room
 *      and is initialised from the store (filled with poison on the device when the store
 *      holds no page there, else uploaded); one that overlaps resident segments becomes a new
 *      segment holding them and the new bytes between them (a merge, below);
 *   4. marks the plan's written runs device-dirty in the store and uploads the payload bytes
 *      the device lacks (the payload only grows);
 *   5. runs the batches with begin(arena NULL) / run_batch / end(arena NULL).
 * Nothing is downloaded by a flush: a host read syncs the store (kb_memstore_sync), which
 * pulls exactly the device-dirty bytes it reads. Every transfer is counted (kb_xfer_stats).
 *
 * The arena never moves (issue #33). It is a list of blocks, each one device buffer, laid end
 * to end in one space of arena offsets (block i at the sum of the earlier blocks' sizes); the
 * arena grows by adding a block, never by copying, so a run needs its data's bytes on the
 * device, not twice them. Why blocks and a footprint, not one or the other: one buffer sized
 * before the first flush cannot cover what the runtime does not know (IPCQ rings, scratch,
 * tensors allocated later), and blocks alone, grown by need, would split a large run over
 * many buffers, which a kernel launch then has to bind (kb_opencl.c binds at most four per
 * launch and splits a launch group otherwise) and a device query cannot span. So the first
 * block is sized from the footprint the runtime announces (kb_backend_reserve: the bytes of
 * the tensors allocated so far, plus a sixteenth and 16 MiB of slack; the data may need more:
 * the first flush's need wins), and a later block from the larger of the flush's need (less
 * the room left in the blocks), the footprint not covered yet and a quarter of the arena
 * (fewer blocks for runs that grow by small flushes); when the device refuses that, from the
 * flush's need and then the one segment's: the largest run is bounded by the device's free
 * memory, not half of it. KBCL_ARENA_BLOCK=BYTES (K/M/G suffixes) caps a block's
 * size (never below one segment's): a test and tuning knob that makes a small run span many
 * blocks. A segment lies wholly in one block; every primitive call's range too.
 *
 * Merges: a segment that overlaps resident ones needs them contiguous. When they already lie
 * end to end in one block (same arena-minus-PA offset, touching; the usual case: a tensor
 * placed piece by piece, in PA order, then touched whole) the merge is only bookkeeping, and
 * new bytes after the last one extend it in place when it ends its block's used part.
 * Otherwise the merged segment is copied together (counted as moves), into the block of its
 * first resident part when that has room, and the old places stay unused until the store is
 * unbound: a merge may copy inside a block (and, when that block is full, into another), the
 * growth of the arena never copies.
 *
 * Invariants: resident segments are sorted by PA and disjoint, each at an arena offset
 * congruent to its PA modulo 8 and inside one block; device-dirty bytes are always resident.
 * Limits: one store at a time per backend; arena space of merged segments is reclaimed only
 * when the store is unbound (blocks are kept, emptied); a device query over tiles in more than
 * one block is answered by the host (KB_ERR_NOTFOUND below); if running a flush's batches
 * fails, the device copy is undefined: the kb_resident is broken, and every later flush or
 * pull reports KB_ERR_STATE.
 */
#ifndef KB_RESIDENT_H
#define KB_RESIDENT_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kb_memstore.h"
#include "kb_oplog.h"
#include "kb_replay.h"
#include "kb_vquery.h"

/*
 * The device primitives. Every call's effect is visible to later calls and to later kernel
 * launches (an in-order queue); upload and download return when their host buffer is free.
 */
typedef struct kb_resident_ops {
    /* A new block (device buffer) for arena offsets [base, base + bytes): base is the sum of
     * the blocks made before, 0 for a first block, which releases every block held before
     * (a new binding starts over). Nothing is copied. */
    int (*block)(void *dev, uint64_t base, uint64_t bytes, kb_errbuf *eb);
    /* These take ranges inside one block each (copy: two, which may be different blocks). */
    int (*copy)(void *dev, uint64_t to, uint64_t from, uint64_t n, kb_errbuf *eb);
    int (*fill)(void *dev, uint64_t off, uint64_t n, uint8_t byte, kb_errbuf *eb);
    int (*upload)(void *dev, uint64_t off, const void *src, uint64_t n, kb_errbuf *eb);
    int (*download)(void *dev, uint64_t off, void *dst, uint64_t n, kb_errbuf *eb);
    /* The device payload becomes p[0, size); its first `have` bytes are there already. */
    int (*payload)(void *dev, const uint8_t *p, size_t size, size_t have, kb_errbuf *eb);
    /* Optional (NULL: none): answers q (kb_vquery.h) over the arena, tile t at off[t];
     * out receives kb_vquery_result_size(q) bytes. KB_ERR_UNSUPPORTED when this device
     * cannot answer that kind. */
    int (*query)(void *dev, const kb_vquery *q, const uint64_t *off, void *out, kb_errbuf *eb);
} kb_resident_ops;

typedef struct kb_xfer_stats {
    uint64_t uploads, upload_bytes;     /* host -> device: payload, host-dirty, new segments */
    uint64_t downloads, download_bytes; /* device -> host: host reads of device-dirty bytes */
    uint64_t fills, fill_bytes;         /* new segments the store held nothing for: poison */
    uint64_t moves, move_bytes;         /* device -> device: merges (growth never copies) */
    double upload_ms, download_ms;      /* wall time of the uploads and the downloads */
    uint64_t arena_bytes;               /* the device arena's capacity (all blocks) */
    uint64_t blocks;                    /* device buffers the arena is made of */
    uint64_t resident_bytes;            /* bytes of the resident segments */
    uint64_t segments;                  /* resident segments */
} kb_xfer_stats;

typedef struct kb_resident kb_resident;

/* Owner: the backend. NULL when out of memory. */
kb_resident *kb_resident_create(const kb_resident_ops *ops, void *dev);
/* Hands the device data back to the bound store (pulls its device-dirty bytes; a failure
 * leaves them lost, see kb_memstore_sync), then frees. NULL is a no-op. */
void kb_resident_destroy(kb_resident *r);
/* Pulls the bound store's device-dirty bytes and unbinds it; the arena's contents are then
 * free for other use. 0 (also when nothing is bound) or the device's error. */
int kb_resident_release(kb_resident *r, kb_errbuf *eb);

/* The flush's steps 1-2 (bind and host-dirty upload). */
int kb_resident_prepare(kb_resident *r, kb_oplog *log, kb_memstore *ms, kb_errbuf *eb);
/* Step 3: a kb_plan_place_fn (ctx is the kb_resident). */
int kb_resident_place(void *ctx, kb_plan *p, kb_errbuf *eb);
/* Step 4. */
int kb_resident_commit(kb_resident *r, const kb_plan *p, kb_errbuf *eb);
/* Running the batches failed: the device copy is undefined from now on. */
void kb_resident_fail(kb_resident *r);
int kb_resident_broken(const kb_resident *r);

void kb_resident_stats(const kb_resident *r, kb_xfer_stats *out);
/* The device primitives and their device handle (a device server drives them directly). */
void kb_resident_device(const kb_resident *r, const kb_resident_ops **ops, void **dev);
/* The log whose payload the device holds (NULL before the first flush). */
const kb_oplog *kb_resident_log(const kb_resident *r);
/*
 * Answers q on the device (kb_vquery.h) over the tiles at PAs pa[0 .. q->ntiles), each
 * q->n * 2 (CHECK) or q->tile_bytes (DIGEST) bytes: nothing is downloaded but the result.
 * KB_ERR_UNSUPPORTED when the device has no query primitive or cannot answer this one, and
 * KB_ERR_NOTFOUND when a tile is not wholly in one resident segment with the device's copy
 * current (the host changed it since the last flush), or the tiles lie in more than one block
 * (the query kernels read one buffer): the caller then reads the data instead.
 * Time is counted as a download (kb_xfer_stats), the result's bytes as download bytes.
 */
int kb_resident_query(kb_resident *r, const kb_vquery *q, const uint64_t *pa, void *out,
                      kb_errbuf *eb);
/*
 * The run's device footprint, as far as it is known (the bytes of the tensors allocated so
 * far): a block added from now on is made large enough for the part of it (plus slack) the
 * arena does not hold yet, so that a run whose tensors are all allocated before its first
 * flush gets one block. Only a hint: it never limits anything. A no-op for a host backend.
 */
void kb_resident_reserve(kb_resident *r, uint64_t bytes);
void kb_backend_reserve(const kb_backend *be, uint64_t bytes);
/* The device bytes the arena asks for to hold a footprint of `bytes` (the footprint, its
 * slack for alignment and for what is not a tensor): what a run must find free on its device
 * (kb_runtime_tensor.c's fit check uses the same rule as the arena). */
uint64_t kb_resident_footprint(uint64_t bytes);
/* The transfer statistics of a backend's kb_resident; zeros for a host backend. */
void kb_backend_xfer_stats(const kb_backend *be, kb_xfer_stats *out);

#endif
