/*
 * kb_replay — Phase 2: the planner, the arena and the backend interface.
 *
 * A flush replays the op-log records not yet replayed. The planner
 *  1. orders them by (epoch, t_start, seq), the epoch counting the log's cuts below the
 *     record (kb_oplog.h; 0 without cuts);
 *  2. gives each record a batch by level scheduling: one past the latest batch of any earlier
 *     record (in that order) it conflicts with, i.e. whose written bytes it reads or writes, or
 *     whose read bytes it writes (exact byte intervals); 0 if none. Conflicting records keep
 *     their order across batches, so running batch 0, 1, 2, ... equals the serial replay, and
 *     the batch count is the longest conflict chain. Inside a batch records are grouped by
 *     kind (stable within a kind), so a backend can issue one launch per kind with an
 *     argument table;
 *  3. builds the arena: every byte range the records touch in memory is coalesced into
 *     segments packed into one buffer, and the operands' PAs are rewritten to arena offsets.
 * For a host backend the replayer copies the segments' current contents from the memory store
 * into a fresh arena, hands the batches to the backend, and writes the segments that records
 * wrote back. A device-resident backend (one with a kb_resident, kb_resident.h) keeps one arena
 * on the device across flushes instead: the plan's segments are placed in it (new ones
 * initialised from the store, ones that grew merged on the device), only the payload's new
 * bytes and the bytes the host changed go up, and the store only learns which bytes the
 * device wrote; a host read pulls those it needs.
 *
 * Backends are tables of function pointers (kb_backend_ops). `ref` (kb_ref_backend) is the
 * plain-C oracle; OpenCL backends implement the same table.
 */
#ifndef KB_REPLAY_H
#define KB_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kb_ivset.h"
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
    kb_segment *segs;      /* sorted by pa, disjoint, not touching */
    size_t nsegs;
    kb_range *wruns;       /* the bytes records write (PAs): sorted, disjoint, not touching */
    size_t nwruns;
    uint64_t arena_bytes;
} kb_plan;

/* Whether r is a record a backend may run as is (what the planner hands it): the checks the
 * planner makes of a log's records, and every operand inside [0, arena_bytes) of the arena or
 * [0, payload_bytes) of the payload. For records from outside this process (a device
 * server's clients); KB_ERR_INVAL with the reason. */
int kb_rec_check_placed(const kb_rec *r, uint64_t arena_bytes, uint64_t payload_bytes,
                        kb_errbuf *eb);

/* Plans recs[0..n) (any order; they are sorted here). */
int kb_plan_build(const kb_rec *const *recs, size_t n, kb_plan *out, kb_errbuf *eb);
void kb_plan_free(kb_plan *p);

/*
 * A placer gives the plan's segments their arena offsets (segs[i].arena_off, each congruent
 * to its pa modulo 8) and sets arena_bytes, before operands are rewritten; it may fail.
 */
typedef int (*kb_plan_place_fn)(void *ctx, kb_plan *p, kb_errbuf *eb);
/* kb_plan_build with a placer instead of the packed layout (place NULL: packed). */
int kb_plan_build_ex(const kb_rec *const *recs, size_t n, kb_plan_place_fn place, void *ctx,
                     kb_plan *out, kb_errbuf *eb);
/*
 * kb_plan_build_ex honouring cuts (kb_oplog.h): cuts[0..ncuts) are ascending seqs, and a
 * record's epoch is the number of them <= its seq; records are ordered by (epoch, t_start,
 * seq) instead of (t_start, seq).
 */
int kb_plan_build_cut(const kb_rec *const *recs, size_t n, const uint64_t *cuts, size_t ncuts,
                      kb_plan_place_fn place, void *ctx, kb_plan *out, kb_errbuf *eb);

/*
 * Launch groups: the records of one batch that a device runs in one launch. Elementwise kinds
 * (COPY, FILL, MATH1, MATH2, FMA, CLAMP: contiguous codes, so adjacent in a batch's kind
 * order) share one; every other kind is a group of its own. kb_replay_stats.launches counts
 * the groups of each batch.
 */
static inline unsigned kb_rec_launch_group(unsigned kind)
{
    return kind <= KB_REC_CLAMP ? KB_REC_COPY : kind;
}

struct kb_resident;

/* What a backend is, for the accessors that read its own state (kb_opencl_launches,
 * kb_remote_kernel_ms, ...): its ops table says so. A backend no accessor reads (a test's, a
 * wrapper) is KB_BACKEND_OTHER, which a table leaving `kind` out gets. */
typedef enum kb_backend_kind {
    KB_BACKEND_OTHER = 0, KB_BACKEND_REF, KB_BACKEND_OPENCL, KB_BACKEND_REMOTE
} kb_backend_kind;

/* Backend interface. `self` is the backend's own state. */
typedef struct kb_backend_ops {
    const char *name;
    /* Start of a flush: the arena's initial contents and the payload area. The arena is
     * the caller's and left alone by it until `end`: a host backend may compute in it in
     * place (the ref backend does: no second copy of the arena) and then copies nothing at
     * `end`; a device backend uploads it. A resident backend (below) is called with arena
     * and payload NULL: its device arena and payload are already in place. */
    int (*begin)(void *self, uint8_t *arena, uint64_t arena_bytes,
                 const uint8_t *payload, size_t payload_bytes, kb_errbuf *eb);
    /* One batch: recs[0..n) are independent and grouped by kind. */
    int (*run_batch)(void *self, const kb_rec *recs, size_t n, kb_errbuf *eb);
    /* End of a flush: copy the arena's final contents back into `arena` (NULL: a resident
     * flush, nothing is copied; the work is complete when it returns). */
    int (*end)(void *self, uint8_t *arena, uint64_t arena_bytes, kb_errbuf *eb);
    void (*destroy)(void *self);
    /* Device-resident backends: their kb_resident (kb_resident.h); NULL for host backends. */
    struct kb_resident *(*resident)(void *self);
    /* Pipelined backends only (NULL otherwise): their resident `end` returns once the flush is
     * handed to the device, before it has run, and an error of that work surfaces at the next
     * call into the backend or its kb_resident; sync waits for everything handed over and
     * returns its error. The runtime flushes such a backend at each cut while Phase 1 runs
     * (kb_runtime.h), so the device replays while the host simulates. */
    int (*sync)(void *self, kb_errbuf *eb);
    kb_backend_kind kind; /* last, so that a table written before it is KB_BACKEND_OTHER */
} kb_backend_ops;

typedef struct kb_backend {
    const kb_backend_ops *ops;
    void *self;
} kb_backend;

/* The reference backend (plain C loops). Owner: caller (backend.ops->destroy(self)). */
int kb_ref_backend_create(kb_backend *out);
/* The reference backend with device-resident memory in a host buffer standing for the
 * device: the same arithmetic, the resident replayer's transfers as memcpy (tests of
 * kb_resident without a device). */
int kb_ref_backend_create_resident(kb_backend *out);

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
/* The same, publishing into pg (kb_progress.h; NULL = nobody watches) the flush's number, its
 * records, its batches once planned and the batches run so far. */
struct kb_progress;
int kb_replay_flush_pg(kb_oplog *log, kb_memstore *ms, kb_backend *be, kb_replay_stats *st,
                       struct kb_progress *pg, kb_errbuf *eb);

#endif
