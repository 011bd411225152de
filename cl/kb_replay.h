/*
 * kb_replay — Phase 2: the planner, the arena and the backend interface.
 *
 * A flush replays the op-log records not yet replayed. The planner
 *  1. orders them by (t_start, seq);
 *  2. gives each record a batch by level scheduling: one past the latest batch of any earlier
 *     record (in that order) it conflicts with, i.e. whose written bytes it reads or writes, or
 *     whose read bytes it writes (exact byte intervals); 0 if none. Conflicting records keep
 *     their order across batches, so running batch 0, 1, 2, ... equals the serial replay, and
 *     the batch count is the longest conflict chain. Inside a batch records are grouped by
 *     kind (stable within a kind), so a backend can issue one launch per kind with an
 *     argument table;
 *  3. builds the arena: every byte range the records touch in memory is coalesced into
 *     segments packed into one buffer, and the operands' PAs are rewritten to arena offsets.
 * The replayer copies the segments' current contents from the memory store into the arena,
 * hands the batches to a backend, and writes the segments that records wrote back.
 *
 * Backends are tables of function pointers (kb_backend_ops). `ref` (kb_ref_backend) is the
 * plain-C oracle; OpenCL backends implement the same table.
 */
#ifndef KB_REPLAY_H
#define KB_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kb_memstore.h"
#include "kb_oplog.h"

/* A contiguous run of records [first, first + count) of a plan's record array. */
typedef struct kb_batch {
    size_t first, count;
} kb_batch;

typedef struct kb_segment {
    uint64_t pa, len, arena_off;
    int written;
} kb_segment;

/* Output of the planner. Owner: caller, freed with kb_plan_free. */
typedef struct kb_plan {
    kb_rec *recs;          /* copies, ordered batch by batch, MEM addrs rewritten to arena offsets */
    size_t nrecs;
    kb_batch *batches;
    size_t nbatches;
    kb_segment *segs;      /* sorted by pa, disjoint */
    size_t nsegs;
    uint64_t arena_bytes;
} kb_plan;

/* Plans recs[0..n) (any order; they are sorted here). */
int kb_plan_build(const kb_rec *const *recs, size_t n, kb_plan *out, kb_errbuf *eb);
void kb_plan_free(kb_plan *p);

/* Backend interface. `self` is the backend's own state. */
typedef struct kb_backend_ops {
    const char *name;
    /* Start of a flush: the arena's initial contents and the payload area. The arena is
     * the caller's and left alone by it until `end`: a host backend may compute in it in
     * place (the ref backend does: no second copy of the arena) and then copies nothing at
     * `end`; a device backend uploads it. */
    int (*begin)(void *self, uint8_t *arena, uint64_t arena_bytes,
                 const uint8_t *payload, size_t payload_bytes, kb_errbuf *eb);
    /* One batch: recs[0..n) are independent and grouped by kind. */
    int (*run_batch)(void *self, const kb_rec *recs, size_t n, kb_errbuf *eb);
    /* End of a flush: copy the arena's final contents back into `arena`. */
    int (*end)(void *self, uint8_t *arena, uint64_t arena_bytes, kb_errbuf *eb);
    void (*destroy)(void *self);
} kb_backend_ops;

typedef struct kb_backend {
    const kb_backend_ops *ops;
    void *self;
} kb_backend;

/* The reference backend (plain C loops). Owner: caller (backend.ops->destroy(self)). */
int kb_ref_backend_create(kb_backend *out);

/* Executes one record (arena-relative operands) on a host arena: the oracle's kernel. */
void kb_ref_exec(const kb_rec *r, uint8_t *arena, const uint8_t *payload);

typedef struct kb_replay_stats {
    uint64_t records, batches, launches, flushes;
    double ms; /* wall-clock time spent in flushes */
} kb_replay_stats;

/*
 * Replays log records [replayed, count) through `be` into `ms`, then marks them replayed.
 * `launches` counts one per distinct kind per batch. A failed flush leaves the store as it
 * was and returns the backend's error.
 */
int kb_replay_flush(kb_oplog *log, kb_memstore *ms, kb_backend *be, kb_replay_stats *st,
                    kb_errbuf *eb);

#endif
