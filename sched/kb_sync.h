/*
 * kb_sync — blocking primitives for fibers: one-shot signals, counting latches and bounded
 * queues. All are plain structs the owner embeds (no allocation except a queue's ring) with
 * intrusive FIFO wait lists: waiters resume in the order they blocked, at the time of the
 * event that releases them. Only fibers may wait; anyone (callbacks too) may fire/put.
 */
#ifndef KB_SYNC_H
#define KB_SYNC_H

#include <stddef.h>

#include "kb_sim.h"

typedef struct kb_waitq {
    kb_fiber *head, *tail;
} kb_waitq;

/* Appends the running fiber to q and blocks it (what/obj for deadlock reports). */
void kb_waitq_block(kb_sim *sim, kb_waitq *q, const char *what, const void *obj);
/* Wakes the first / every waiter at the current time; returns how many were woken. */
int kb_waitq_wake_one(kb_sim *sim, kb_waitq *q);
int kb_waitq_wake_all(kb_sim *sim, kb_waitq *q);

/* One-shot signal with many waiters; waiting on a fired signal returns at once. */
typedef struct kb_signal {
    kb_waitq waiters;
    int fired;
} kb_signal;
void kb_signal_init(kb_signal *s);
void kb_signal_fire(kb_sim *sim, kb_signal *s);
void kb_signal_wait(kb_sim *sim, kb_signal *s);

/* Latch: wait until `count` drops to zero (kb_latch_add raises it, kb_latch_done lowers it). */
typedef struct kb_latch {
    kb_waitq waiters;
    long count;
} kb_latch;
void kb_latch_init(kb_latch *l, long count);
void kb_latch_add(kb_latch *l, long n);
void kb_latch_done(kb_sim *sim, kb_latch *l); /* count--, wakes all waiters at zero */
void kb_latch_wait(kb_sim *sim, kb_latch *l);

/* Bounded FIFO queue of pointers: put blocks while full, get blocks while empty. */
typedef struct kb_queue {
    void **ring;
    size_t cap, head, count;
    kb_waitq getters, putters;
} kb_queue;
int kb_queue_init(kb_queue *q, size_t cap); /* cap >= 1; KB_ERR_NOMEM / KB_ERR_INVAL */
void kb_queue_fini(kb_queue *q);            /* frees the ring; items are the owner's */
void kb_queue_put(kb_sim *sim, kb_queue *q, void *item);
void *kb_queue_get(kb_sim *sim, kb_queue *q);
int kb_queue_try_put(kb_sim *sim, kb_queue *q, void *item); /* 0 or KB_ERR_STATE when full */
int kb_queue_try_get(kb_sim *sim, kb_queue *q, void **item); /* 0 or KB_ERR_STATE when empty */

#endif
