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
 *      its place; a new one is appended to the arena and initialised from the store (filled
 *      with poison on the device when the store holds no page there, else uploaded); one that
 *      overlaps resident segments becomes a new segment holding them (copied on the device)
 *      and the new bytes between them. The arena grows by reallocation, which also compacts
 *      it (only resident segments move, packed);
 *   4. marks the plan's written runs device-dirty in the store and uploads the payload bytes
 *      the device lacks (the payload only grows);
 *   5. runs the batches with begin(arena NULL) / run_batch / end(arena NULL).
 * Nothing is downloaded by a flush: a host read syncs the store (kb_memstore_sync), which
 * pulls exactly the device-dirty bytes it reads. Every transfer is counted (kb_xfer_stats).
 *
 * Invariants: resident segments are sorted by PA and disjoint, each at an arena offset
 * congruent to its PA modulo 8; device-dirty bytes are always resident.
 * Limits: one store at a time per backend; arena space of merged segments is reclaimed only
 * when the arena grows; if running a flush's batches fails, the device copy is undefined:
 * the kb_resident is broken, and every later flush or pull reports KB_ERR_STATE.
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

/* n bytes from arena offset `from` to `to`. */
typedef struct kb_move {
    uint64_t from, to, n;
} kb_move;

/*
 * The device primitives. Every call's effect is visible to later calls and to later kernel
 * launches (an in-order queue); upload and download return when their host buffer is free.
 */
typedef struct kb_resident_ops {
    /* A new arena of `bytes` that receives mv[0..n) from the current one (then released). */
    int (*arena)(void *dev, uint64_t bytes, const kb_move *mv, size_t n, kb_errbuf *eb);
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
    uint64_t moves, move_bytes;         /* device -> device: merges, arena growth */
    double upload_ms, download_ms;      /* wall time of the uploads and the downloads */
    uint64_t arena_bytes;               /* the device arena's capacity */
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
 * current (the host changed it since the last flush): the caller then reads the data instead.
 * Time is counted as a download (kb_xfer_stats), the result's bytes as download bytes.
 */
int kb_resident_query(kb_resident *r, const kb_vquery *q, const uint64_t *pa, void *out,
                      kb_errbuf *eb);
/* The transfer statistics of a backend's kb_resident; zeros for a host backend. */
void kb_backend_xfer_stats(const kb_backend *be, kb_xfer_stats *out);

#endif
