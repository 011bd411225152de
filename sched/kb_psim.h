/*
 * kb_psim — a discrete-event run split into partitions that run side by side on threads:
 * conservative synchronisation in windows (YAWNS), the base of a Phase 1 partitioned by SIP.
 *
 * A partition is a kb_sim of its own (its events, fibers and clock). A partition affects
 * another only through a message (kb_psim_post): an event for the other partition at a time
 * at least `lookahead` after its own clock, the smallest delay of anything that crosses a
 * partition boundary (for SIPs: the inter-SIP link's latency). The run goes in windows: with
 * T the earliest pending event of all partitions, every partition fires its events before
 * T + lookahead, which no message of this window can precede, so the partitions of a window
 * are independent and run on any threads. Between windows the messages are delivered, each
 * destination's sorted by (time, sending partition, the sender's post order) and scheduled in
 * that order, so events at equal times keep an order that depends on the partitions' own
 * histories only. The result is therefore the same for every thread count, 1 included: the
 * threads only decide which partitions a core runs.
 *
 * Ownership: kb_psim_create makes the partitions' kb_sims and kb_psim_destroy frees them
 * (with their pending events and fibers). Limits: a message carries a function and two
 * pointers, which must stay valid until it fires (to another process it travels as its codec's
 * bytes, kb_psim_net); a partition's code may post only from its
 * own events and fibers (its thread); the partitions and the thread count are fixed at
 * creation; a run cannot be nested or re-entered.
 */
#ifndef KB_PSIM_H
#define KB_PSIM_H

#include <stdint.h>

#include "kb_sim.h"

typedef struct kb_psim kb_psim;

/*
 * A run spread over several processes (kbcl under mpirun: docs/parallel.md). Every process
 * builds the same partitions and runs its own block of them: process r of R runs partitions
 * [r * P / R, (r + 1) * P / R). After every window the processes exchange, in one collective
 * call, each partition's state (its next event, its code, its blocked fibers) and the messages
 * bound for another process's partitions, written by the codec of their function
 * (kb_psim_codec). Every process then decides the next window identically, and delivers in the
 * same (time, sender, order) as one process would, so the result is the same for every process
 * count. The library calls no MPI: the caller passes the collective.
 */
typedef struct kb_psim_net {
    int rank, nranks; /* this process, of nranks >= 1 */
    /*
     * Collective, called by every process in the same order (from the thread that called
     * kb_psim_run): each passes its n bytes; on success *all receives a buffer (malloc'd,
     * the caller frees it) holding every process's bytes in rank order, and counts[r]
     * (nranks entries, the caller's) their sizes. 0 or a negative code.
     */
    int (*allgather)(void *ud, const void *mine, size_t n, void **all, size_t *counts);
    void *ud;
} kb_psim_net;

/* The most bytes a codec writes for one message. */
#define KB_PSIM_WIRE_MAX 192

/*
 * How a message function crosses to another process: enc writes what fn's a and b mean into
 * buf (at most KB_PSIM_WIRE_MAX bytes) and returns the length, on the sender's process between
 * windows (every partition still; the message will not fire there, so enc releases what a and b
 * hold); dec, on the receiver's, makes a and b again for partition `to` (0, or a negative code
 * that fails the run).
 */
typedef size_t (*kb_psim_enc_fn)(void *ud, void *a, void *b, uint8_t *buf);
typedef int (*kb_psim_dec_fn)(void *ud, kb_sim *to, const uint8_t *buf, size_t n, void **a,
                              void **b);

#define KB_PSIM_MAX_PARTS 4096
#define KB_PSIM_MAX_THREADS 64

typedef struct kb_psim_opts {
    int parts;              /* partitions, 1 .. KB_PSIM_MAX_PARTS */
    int threads;            /* threads that run them, >= 1; at most parts and
                               KB_PSIM_MAX_THREADS are used (kb_psim_threads) */
    kb_time lookahead;      /* the least delay of a message between partitions, > 0 */
    const kb_sim_opts *sim; /* each partition's engine options; NULL: the defaults */
    const kb_psim_net *net; /* several processes (copied); NULL: this one alone */
    /* nonzero: while a thread runs one of its partitions it warms the one it runs next
     * (kb_sim_warm_next). For threads whose partitions' state together passes their L2; a
     * speed hint only */
    int warm;
} kb_psim_opts;

/* 0 and *out, KB_ERR_INVAL (a count or the lookahead out of range) or KB_ERR_NOMEM. Owner:
 * the caller, who frees it with kb_psim_destroy (NULL is a no-op). */
int kb_psim_create(const kb_psim_opts *o, kb_psim **out);
void kb_psim_destroy(kb_psim *ps);

/* Partition i's engine (0 <= i < parts), for scheduling its first events and spawning its
 * fibers before the run, and for its code during the run. */
kb_sim *kb_psim_part(kb_psim *ps, int i);
int kb_psim_parts(const kb_psim *ps);
/* 1 when this process runs partition i (always, without a net). */
int kb_psim_owns(const kb_psim *ps, int i);
/* The process that runs partition i (0 without a net). */
int kb_psim_owner(const kb_psim *ps, int i);
/* The processes of the run (1 without a net). */
int kb_psim_ranks(const kb_psim *ps);

/* Registers the codec of message function fn (before a run; the same functions in the same
 * order on every process). 0, KB_ERR_INVAL or KB_ERR_NOMEM. */
int kb_psim_codec(kb_psim *ps, kb_event_fn fn, kb_psim_enc_fn enc, kb_psim_dec_fn dec,
                  void *ud);
int kb_psim_threads(const kb_psim *ps);
kb_time kb_psim_lookahead(const kb_psim *ps);

/*
 * From partition `from` (its event or fiber, or anyone before the run): fn(sim of `to`, a, b)
 * at time t in partition `to`. Between two partitions t must be at least from's clock plus the
 * lookahead, else KB_ERR_RANGE (the message could land in a window already run); within one
 * partition it is kb_sim_at. KB_ERR_INVAL for a bad partition or fn, or, with a net, for a
 * message to another process's partition whose fn has no codec; KB_ERR_NOMEM.
 */
int kb_psim_post(kb_psim *ps, int from, int to, kb_time t, kb_event_fn fn, void *a, void *b);

/*
 * A stop-the-world operation: fn(ps, t, ud) runs once every partition has fired all its
 * events before t and none at or after it, on one thread while every partition stands still,
 * so it may read and change any partition (schedule events at t or later anywhere, post
 * messages, ask for later operations). What kbcl's host does that touches every SIP at once
 * (a tensor's creation, a host read) is one of these. Asked for from partition `from` (its
 * event or fiber, or before the run) at t no earlier than from's clock plus the lookahead
 * (else KB_ERR_RANGE), or from a running operation at any later t. Operations due at equal
 * times run partition by partition, each partition's in the order it asked. KB_ERR_INVAL,
 * KB_ERR_NOMEM.
 */
typedef void (*kb_psim_sync_fn)(kb_psim *ps, kb_time t, void *ud);
int kb_psim_sync_at(kb_psim *ps, int from, kb_time t, kb_psim_sync_fn fn, void *ud);

/*
 * After every window, once every partition has fired its events before the window's end `t`
 * and before the next window starts: fn(ps, t, ud) on one thread while every partition stands
 * still (what partitions buffered in the window may be gathered there, in an order of their
 * own). A nonzero return ends the run with that code. NULL: none (the default). Set before a
 * run. With a net it runs on every process after every window (it may call the collective).
 */
typedef int (*kb_psim_window_fn)(kb_psim *ps, kb_time t, void *ud);
void kb_psim_on_window(kb_psim *ps, kb_psim_window_fn fn, void *ud);

/*
 * Runs every partition until nothing is pending anywhere (events, messages, operations).
 * Returns 0; the nonzero code of a partition's kb_sim_stop (the lowest-numbered partition's
 * when several stopped in one window; every partition ends that window first; a stop with
 * code 0 only ends its partition's window early); KB_ERR_DEADLOCK when fibers are blocked
 * with nothing pending; KB_ERR_NOMEM; KB_ERR_STATE when called during a run. May be called
 * again after a stop.
 */
int kb_psim_run(kb_psim *ps);

/* Totals over the partitions (every process's, with a net: gathered as a run ends), the
 * windows and the stop-the-world operations run so far. */
uint64_t kb_psim_events(const kb_psim *ps);
uint64_t kb_psim_switches(const kb_psim *ps);
/* Partition i's events and fiber switches (with a net: as of the end of the last run). */
uint64_t kb_psim_part_events(const kb_psim *ps, int i);
uint64_t kb_psim_windows(const kb_psim *ps);
uint64_t kb_psim_messages(const kb_psim *ps);
uint64_t kb_psim_syncs(const kb_psim *ps);

#endif
