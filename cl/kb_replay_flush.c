/*
 * kb_replay_flush — a Phase-2 flush: replays the op-log records not yet replayed on a backend
 * (part of the replay: kb_replay.c plans, kb_replay_check.c checks; shared names in
 * kb_replay_int.h). The flush of a host backend builds a fresh arena from the memory store,
 * runs the plan's batches on it and writes the written segments back, after making sure every
 * page they touch exists, so that a flush either updates the store completely or leaves it as
 * it was; that of a device-resident backend moves only what kb_resident decides (kb_resident.h)
 * and plans with its placer. A flush publishes its progress (records, batches done) to a
 * kb_progress and adds its figures to kb_replay_stats. Limits: a host backend's arena (every
 * segment the flush touches) must fit in host memory.
 */
#include "kb_replay_int.h"

#include "kb_bigmem.h"
#include "kb_progress.h"
#include "kb_resident.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Makes sure every page the written segments touch exists, by rewriting one byte per page with
 * its current value: afterwards the write-back cannot fail, so a flush either updates the
 * store completely or leaves it as it was.
 */
static int reserve_pages(kb_memstore *ms, const kb_plan *p)
{
    const uint64_t page = KB_MEMSTORE_PAGE_BYTES;

    for (size_t i = 0; i < p->nsegs; i++) {
        const kb_segment *s = &p->segs[i];
        if (!s->written)
            continue;
        uint64_t end = s->pa + s->len;
        for (uint64_t a = s->pa; a < end; a = (a | (page - 1)) + 1) {
            uint8_t b;
            kb_memstore_read(ms, a, &b, 1);
            int rc = kb_memstore_write(ms, a, &b, 1);
            if (rc)
                return rc;
            if ((a | (page - 1)) == UINT64_MAX)
                break;
        }
    }
    return 0;
}

/*
 * Runs the plan's batches on the backend over the arena. A failure names the backend; a
 * backend stopped after begin is still ended, into a scratch buffer: its message must not hide
 * the first one.
 */
static int run_plan(kb_backend *be, const kb_plan *plan, uint8_t *arena, const uint8_t *payload,
                    size_t payload_bytes, kb_progress *pg, kb_errbuf *eb)
{
    int rc = be->ops->begin(be->self, arena, plan->arena_bytes, payload, payload_bytes, eb);

    if (pg)
        atomic_store_explicit(&pg->batches, plan->nbatches, memory_order_relaxed);
    if (rc == 0) {
        for (size_t b = 0; b < plan->nbatches && rc == 0; b++) {
            const kb_batch *bt = &plan->batches[b];
            rc = be->ops->run_batch(be->self, plan->recs + bt->first, bt->count, eb);
            if (pg)
                atomic_store_explicit(&pg->batches_done, b + 1, memory_order_relaxed);
        }
        if (rc == 0) {
            rc = be->ops->end(be->self, arena, plan->arena_bytes, eb);
        } else {
            kb_errbuf scratch;
            (void)be->ops->end(be->self, arena, plan->arena_bytes, &scratch);
        }
    }
    if (rc != 0)
        kb_err_prefix(eb, "replay on %s", be->ops->name ? be->ops->name : "?");
    return rc;
}

/* Writes the segments the replay wrote back into the store: all of them, or none when the
 * store cannot hold their pages (the message says how much it needed). */
static int write_back(kb_memstore *ms, const kb_plan *plan, const uint8_t *arena, kb_errbuf *eb)
{
    int rc;

    if ((rc = reserve_pages(ms, plan)) != 0) {
        unsigned long long written = 0;
        for (size_t i = 0; i < plan->nsegs; i++)
            written += plan->segs[i].written ? plan->segs[i].len : 0;
        kb_err_nomem(eb, written, "replay: the memory store's pages for the data the "
                     "replay wrote (%zu pages of %d bytes held already)",
                     kb_memstore_pages(ms), (int)KB_MEMSTORE_PAGE_BYTES);
        return rc;
    }
    for (size_t i = 0; i < plan->nsegs; i++) {
        const kb_segment *sg = &plan->segs[i];
        if (sg->written) {
            rc = kb_memstore_write(ms, sg->pa, arena + sg->arena_off, (size_t)sg->len);
            assert(rc == 0); /* every page exists after reserve_pages */
        }
    }
    return 0;
}

/* Adds a flush of n records begun at t0 (now_ms) to st; its launches are what a backend
 * issues, one per launch group of each batch. */
static void add_stats(kb_replay_stats *st, const kb_plan *plan, size_t n, double t0)
{
    uint64_t launches = 0;
    for (size_t b = 0; b < plan->nbatches; b++) {
        const kb_batch *bt = &plan->batches[b];
        for (size_t i = 0; i < bt->count; i++)
            if (i == 0 || kb_rec_launch_group(plan->recs[bt->first + i].kind) !=
                              kb_rec_launch_group(plan->recs[bt->first + i - 1].kind))
                launches++;
    }
    st->records += n;
    st->batches += plan->nbatches;
    st->launches += launches;
    st->flushes++;
    st->ms += now_ms() - t0;
}

int kb_replay_flush(kb_oplog *log, kb_memstore *ms, kb_backend *be, kb_replay_stats *st,
                    kb_errbuf *eb)
{
    return kb_replay_flush_pg(log, ms, be, st, NULL, eb);
}

int kb_replay_flush_pg(kb_oplog *log, kb_memstore *ms, kb_backend *be, kb_replay_stats *st,
                       kb_progress *pg, kb_errbuf *eb)
{
    double t0 = now_ms();
    const kb_rec **ptrs = NULL;
    uint8_t *arena = NULL;
    kb_plan plan;
    int rc;

    memset(&plan, 0, sizeof plan);
    if (!log || !ms || !be || !be->ops)
        return kb_err_set(eb, KB_ERR_INVAL, "replay: no log, memory store or backend");
    size_t first = kb_oplog_replayed(log), count = kb_oplog_count(log);
    if (first >= count)
        return 0;
    size_t n = count - first;
    const uint8_t *payload = kb_oplog_payload(log);
    if (pg) {
        atomic_fetch_add_explicit(&pg->flushes, 1, memory_order_relaxed);
        atomic_store_explicit(&pg->flush_records, n, memory_order_relaxed);
        atomic_store_explicit(&pg->batches, 0, memory_order_relaxed);
        atomic_store_explicit(&pg->batches_done, 0, memory_order_relaxed);
    }
    size_t payload_bytes = kb_oplog_payload_size(log);

    kb_resident *res = be->ops->resident ? be->ops->resident(be->self) : NULL;

    rc = KB_ERR_NOMEM;
    ptrs = kb_bigmem_alloc(n * sizeof *ptrs);
    if (!ptrs) {
        kb_err_nomem(eb, (unsigned long long)(n * sizeof *ptrs), "replay: the list of its %zu "
                     "records", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        ptrs[i] = kb_oplog_at(log, first + i);
    if ((rc = kb_replay_check_payload(ptrs, n, payload_bytes, eb)) != 0)
        goto out;

    const uint64_t *cuts;
    size_t ncuts = kb_oplog_cuts_in(log, first, count, &cuts);

    if (res) {
        /* Device-resident: nothing of the arena crosses the bus (kb_resident.h). */
        if ((rc = kb_resident_prepare(res, log, ms, eb)) != 0 ||
            (rc = kb_plan_build_cut(ptrs, n, cuts, ncuts, kb_resident_place, res, &plan,
                                    eb)) != 0 ||
            (rc = kb_resident_commit(res, &plan, eb)) != 0) {
            kb_err_prefix(eb, "replay on %s", be->ops->name ? be->ops->name : "?");
            goto out;
        }
        if ((rc = run_plan(be, &plan, NULL, NULL, 0, pg, eb)) != 0) {
            kb_resident_fail(res);
            goto out;
        }
    } else {
        /* A store that a resident backend holds data of gets it back first. */
        if (kb_memstore_mirror_self(ms)) {
            if ((rc = kb_memstore_sync_all(ms, eb)) != 0)
                goto out;
            kb_memstore_set_mirror(ms, NULL);
        }
        if ((rc = kb_plan_build_cut(ptrs, n, cuts, ncuts, NULL, NULL, &plan, eb)) != 0)
            goto out;
        /* zeroed: the alignment padding between segments is never read by a record, but is
         * copied */
        arena = plan.arena_bytes <= SIZE_MAX ? kb_bigmem_alloc((size_t)plan.arena_bytes) : NULL;
        if (!arena) {
            rc = kb_err_nomem(eb, (unsigned long long)plan.arena_bytes, "replay: the arena that "
                              "holds the data of %zu records", n);
            goto out;
        }
        for (size_t i = 0; i < plan.nsegs; i++)
            kb_memstore_read(ms, plan.segs[i].pa, arena + plan.segs[i].arena_off,
                             (size_t)plan.segs[i].len);

        if ((rc = run_plan(be, &plan, arena, payload, payload_bytes, pg, eb)) != 0)
            goto out;

        if ((rc = write_back(ms, &plan, arena, eb)) != 0)
            goto out;
    }
    kb_oplog_set_replayed(log, count);

    if (st)
        add_stats(st, &plan, n, t0);
    rc = 0;
out:
    kb_plan_free(&plan);
    kb_bigmem_free(arena);
    kb_bigmem_free(ptrs);
    return rc;
}
