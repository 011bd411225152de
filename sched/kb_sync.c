/*
 * kb_sync — signals, latches and bounded queues for fibers (API in kb_sync.h).
 *
 * Everything is built on one intrusive FIFO wait list (kb_waitq, linked through
 * kb_fiber_link) and kb_fiber_block/kb_fiber_wake, so a woken fiber resumes at the current
 * time, after the events already queued for it, in the order the waiters blocked. Queues use
 * wake-and-recheck: a woken putter (getter) re-checks for room (an item) when it runs and, if a
 * fiber that ran in between took it, blocks again at the tail of the list. The order is still
 * deterministic. Limits: only fibers may wait; a fiber waits on one list at a time; the
 * structs must not move while fibers wait on them.
 */
#include "kb_sync.h"

#include <assert.h>
#include <stdlib.h>

#include "kb_err.h"

/* ---------------------------------------------------------------- wait lists */

void kb_waitq_block(kb_sim *sim, kb_waitq *q, const char *what, const void *obj)
{
    kb_fiber *f = kb_fiber_current(sim);

    assert(f && "only fibers may wait");
    if (!f)
        return;
    assert(!q->head == !q->tail); /* an empty list has neither end */
    *kb_fiber_link(f) = NULL;
    if (q->tail)
        *kb_fiber_link(q->tail) = f;
    else
        q->head = f;
    q->tail = f;
    kb_fiber_block(sim, what, obj);
}

int kb_waitq_wake_one(kb_sim *sim, kb_waitq *q)
{
    kb_fiber *f = q->head;

    if (!f)
        return 0;
    q->head = *kb_fiber_link(f);
    if (!q->head)
        q->tail = NULL;
    *kb_fiber_link(f) = NULL;
    kb_fiber_wake(sim, f);
    return 1;
}

int kb_waitq_wake_all(kb_sim *sim, kb_waitq *q)
{
    int n = 0;

    while (kb_waitq_wake_one(sim, q))
        n++;
    return n;
}

/* ---------------------------------------------------------------- signal */

void kb_signal_init(kb_signal *s)
{
    s->waiters.head = s->waiters.tail = NULL;
    s->fired = 0;
}

void kb_signal_fire(kb_sim *sim, kb_signal *s)
{
    if (s->fired)
        return;
    s->fired = 1;
    kb_waitq_wake_all(sim, &s->waiters);
}

void kb_signal_wait(kb_sim *sim, kb_signal *s)
{
    if (!s->fired)
        kb_waitq_block(sim, &s->waiters, "signal", s);
}

/* ---------------------------------------------------------------- latch */

void kb_latch_init(kb_latch *l, long count)
{
    l->waiters.head = l->waiters.tail = NULL;
    l->count = count;
}

void kb_latch_add(kb_latch *l, long n) { l->count += n; }

void kb_latch_done(kb_sim *sim, kb_latch *l)
{
    if (--l->count <= 0)
        kb_waitq_wake_all(sim, &l->waiters);
}

void kb_latch_wait(kb_sim *sim, kb_latch *l)
{
    if (l->count > 0)
        kb_waitq_block(sim, &l->waiters, "latch", l);
}

/* ---------------------------------------------------------------- bounded queue */

int kb_queue_init(kb_queue *q, size_t cap)
{
    q->ring = NULL;
    q->cap = q->head = q->count = 0;
    q->getters.head = q->getters.tail = NULL;
    q->putters.head = q->putters.tail = NULL;
    if (cap == 0 || cap > SIZE_MAX / sizeof(void *))
        return KB_ERR_INVAL;
    q->ring = malloc(cap * sizeof(void *));
    if (!q->ring)
        return KB_ERR_NOMEM;
    q->cap = cap;
    return 0;
}

void kb_queue_fini(kb_queue *q)
{
    if (!q)
        return;
    free(q->ring);
    q->ring = NULL;
    q->cap = q->head = q->count = 0;
}

static void queue_push(kb_sim *sim, kb_queue *q, void *item)
{
    size_t tail = q->head + q->count;

    assert(q->count < q->cap && q->head < q->cap); /* callers wait or refuse while full */
    if (tail >= q->cap)
        tail -= q->cap;
    q->ring[tail] = item;
    q->count++;
    kb_waitq_wake_one(sim, &q->getters);
}

static void *queue_pop(kb_sim *sim, kb_queue *q)
{
    assert(q->count > 0 && q->head < q->cap); /* callers wait or refuse while empty */
    void *item = q->ring[q->head];

    if (++q->head == q->cap)
        q->head = 0;
    q->count--;
    kb_waitq_wake_one(sim, &q->putters);
    return item;
}

/*
 * Outside a fiber nothing can block: a put on a full queue then drops the item and a get on
 * an empty one returns NULL (debug builds assert); callbacks should use the try_ variants.
 */
void kb_queue_put(kb_sim *sim, kb_queue *q, void *item)
{
    while (q->count == q->cap) {
        assert(kb_fiber_current(sim) && "kb_queue_put would block outside a fiber");
        if (!kb_fiber_current(sim))
            return;
        kb_waitq_block(sim, &q->putters, "queue put", q);
    }
    queue_push(sim, q, item);
}

void *kb_queue_get(kb_sim *sim, kb_queue *q)
{
    while (q->count == 0) {
        assert(kb_fiber_current(sim) && "kb_queue_get would block outside a fiber");
        if (!kb_fiber_current(sim))
            return NULL;
        kb_waitq_block(sim, &q->getters, "queue get", q);
    }
    return queue_pop(sim, q);
}

int kb_queue_try_put(kb_sim *sim, kb_queue *q, void *item)
{
    if (q->count == q->cap)
        return KB_ERR_STATE;
    queue_push(sim, q, item);
    return 0;
}

int kb_queue_try_get(kb_sim *sim, kb_queue *q, void **item)
{
    if (q->count == 0)
        return KB_ERR_STATE;
    *item = queue_pop(sim, q);
    return 0;
}
