/*
 * kb_sim — the discrete-event engine and its fibers.
 *
 * Pending events are ordered by (time, seq), where seq strictly increases at insertion, so
 * events at equal times fire in insertion order. Future events sit in a sorted run for the
 * current slot (0.512 ns by default: kb_sim_opts.slot_shift), a timing wheel of the next 65 535
 * slots (33.6 us by default) and a heap beyond it; events scheduled for the current time go
 * to a FIFO in front of them (the common zero-delay wake-up never touches a heap). The FIFO
 * preserves (time, seq) order because every event already queued for the current time was
 * inserted earlier and is drained first.
 *
 * Two kinds of actors run on the engine: callbacks (kb_event_fn, run on the engine's own stack)
 * and fibers (stackful coroutines that may block: sleep, wait on a signal, a latch or a queue).
 * Fibers switch registers with kbcl's own x86-64 switch (inline assembly, KBCL_FIBER_ASM),
 * or Boost.Context's C-linkage jump_fcontext on other CPUs, or, when built with
 * KBCL_FIBER_UCONTEXT (the sanitizer build), with ucontext. Stacks are
 * mmap'd with MAP_NORESERVE in chunks (committed lazily by the kernel), have a guard page below
 * them (every stack on kernels with guard regions, Linux 6.13+; the first 16 384 elsewhere, see
 * kb_sim.c), and are recycled through a free list when a fiber ends. With thousands of fibers
 * their state is cold whenever they resume, so the run loop prefetches the lines of the
 * resumes it can see coming (the current slot's events, and with kb_sim_opts.prefetch_slots
 * the next slot's newest): records, stack tops, what they blocked on and the lines each names
 * with kb_fiber_set_hot and kb_fiber_set_hot_vec.
 *
 * kb_sim_run() returns when no event is pending. If fibers are still blocked then, that is a
 * deadlock: it returns KB_ERR_DEADLOCK and kb_sim_foreach_blocked() lists who waits on what.
 * A fiber or callback can end the run early with kb_sim_stop(sim, code).
 *
 * Limits: single-threaded (one kb_sim per thread; several sims may coexist); events carry two
 * pointer arguments; a fiber's function must not longjmp out of the fiber.
 */
#ifndef KB_SIM_H
#define KB_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "kb_time.h"

typedef struct kb_sim kb_sim;
typedef struct kb_fiber kb_fiber;

typedef void (*kb_event_fn)(kb_sim *sim, void *a, void *b);
typedef void (*kb_fiber_fn)(kb_sim *sim, void *arg);

/* A timing-wheel slot is 2^slot_shift ps wide (kb_sim.c, "event storage"). */
#define KB_SIM_SLOT_SHIFT_DEFAULT 9u /* 0.512 ns: a 33.6 us horizon */
#define KB_SIM_SLOT_SHIFT_MIN 4u
#define KB_SIM_SLOT_SHIFT_MAX 20u

typedef struct kb_sim_opts {
    size_t fiber_stack_bytes; /* 0 = default (256 KiB); rounded up to pages */
    /* the wheel's slot width, log2 of picoseconds: 0 = KB_SIM_SLOT_SHIFT_DEFAULT, else MIN ..
     * MAX. Events run in (time, seq) order whatever it is; it sets the speed only. Narrow
     * slots keep a slot's events few (the events of lockstep PEs mostly share one time, and a
     * slot whose events do not is sorted as a heap); wide ones keep the wheel's lines few (a
     * push reads its slot's list head: with thousands of PEs on one thread, each window
     * sweeps every PE's state through the cache, and a wheel of 0.512 ns slots spreads a
     * window's pushes over a list-head line per 8 ns) */
    unsigned slot_shift;
    /* nonzero: as the run takes a wheel slot, it also asks for the record of the next slot's
     * newest event and the list node of the slot after that (two bitmap scans a slot), so that
     * a slot's first resume is seen ahead too. For runs whose events find their state cold
     * (thousands of PEs on a thread); a speed hint only */
    int prefetch_slots;
} kb_sim_opts;

/* Owner: the caller; destroy with kb_sim_destroy (NULL is a no-op). opts may be NULL.
 * NULL: out of memory, or an option out of range. */
kb_sim *kb_sim_create(const kb_sim_opts *opts);
/* Frees every fiber (blocked ones included, without resuming them) and pending event. */
void kb_sim_destroy(kb_sim *sim);

/* The current time: a load, as kernels ask for it all the time. A kb_sim starts with its
 * time (kb_sim.c checks that), and a pointer to a struct points to its first member. */
static inline kb_time kb_sim_now(const kb_sim *sim) { return *(const kb_time *)(const void *)sim; }

/* Schedule fn(sim, a, b) at absolute time t (t >= now, else KB_ERR_INVAL) / after dt >= 0. */
int kb_sim_at(kb_sim *sim, kb_time t, kb_event_fn fn, void *a, void *b);
int kb_sim_after(kb_sim *sim, kb_time dt, kb_event_fn fn, void *a, void *b);

/*
 * Runs events until none is pending or kb_sim_stop() was called. Returns 0, the stop code,
 * or KB_ERR_DEADLOCK when fibers are still blocked with nothing pending. Must be called from
 * outside any fiber. May be called again after it returns (e.g. after scheduling more work).
 */
int kb_sim_run(kb_sim *sim);

/*
 * Runs the events before `limit` (time < limit) and returns, the later ones left pending in
 * their order: what a partition of a parallel run does in one window (kb_psim.h). Returns 0
 * or the stop code; never KB_ERR_DEADLOCK (with events past the limit, blocked fibers may
 * still be woken: the caller decides, with kb_sim_next and kb_sim_blocked).
 */
int kb_sim_run_until(kb_sim *sim, kb_time limit);
/* 1 and the earliest pending event's time in *t, or 0 when nothing is pending. */
int kb_sim_next(const kb_sim *sim, kb_time *t);
/* Fibers blocked now (waiting for a wake that only another event can give). */
size_t kb_sim_blocked(const kb_sim *sim);

/* Ends the current kb_sim_run() after the running event/fiber step; code is what run returns. */
void kb_sim_stop(kb_sim *sim, int code);

/*
 * Publishes the simulated time reached and the events fired into p (kb_progress.h) for a
 * display on another thread: now, when a run returns, and during a run at the first move of
 * simulated time to a later wheel slot after each KB_PROGRESS_EVERY events (a run that
 * fires events at one time only publishes when it returns). NULL stops it. p must outlive
 * the sim or be unset first. Changes nothing the run computes.
 */
struct kb_progress;
void kb_sim_set_progress(kb_sim *sim, struct kb_progress *p);

/* Statistics. */
uint64_t kb_sim_events(const kb_sim *sim);          /* events fired so far */
uint64_t kb_sim_switches(const kb_sim *sim);        /* fiber resumes so far */
size_t kb_sim_live_fibers(const kb_sim *sim);       /* spawned and not yet finished */

/* ---- fibers ---- */

/*
 * Creates a fiber that starts running fn(sim, arg) at the current time (after the events
 * already queued for now). `name` is copied (truncated to 47 chars) and used in deadlock
 * reports. Returns NULL when out of memory. The fiber's memory belongs to the sim and is
 * recycled when fn returns; the handle must not be used after that.
 */
kb_fiber *kb_fiber_spawn(kb_sim *sim, kb_fiber_fn fn, void *arg, const char *name);

/* The running fiber, or NULL when called from a callback / outside the run. */
kb_fiber *kb_fiber_current(kb_sim *sim);
const char *kb_fiber_name(const kb_fiber *f);

/* Per-fiber user pointer (e.g. the PE a kernel fiber runs on). */
void kb_fiber_set_udata(kb_fiber *f, void *udata);
void *kb_fiber_udata(const kb_fiber *f);

/*
 * Lines the fiber reads first whenever it resumes, beyond its own stack and what it blocked on
 * (n <= KB_FIBER_HOT addresses, any values; n = 0 clears them): the run loop prefetches them
 * with those while the event before its resume runs (kb_sim.c, "prefetching the next
 * resumes"). A hint for speed only: the addresses are never dereferenced, and nothing the run
 * computes depends on them. KB_ERR_INVAL when n is out of range.
 */
#define KB_FIBER_HOT 2
int kb_fiber_set_hot(kb_fiber *f, const void *const *lines, int n);

/*
 * Lines the fiber will likely reach through a chain of its own data soon after it resumes (a
 * DMA's resources, found through a route table), named by a vector its owner keeps current:
 * vec holds KB_FIBER_HOT_VEC addresses, none NULL, and stays valid while set (vec = NULL clears
 * it). The run loop prefetches the line holding vec with the record's lines, one event before
 * the resume, and the lines vec names just before it; vec's entries may change between
 * resumes (the run reads them then). A hint for speed only, like kb_fiber_set_hot.
 * KB_ERR_INVAL when an entry is NULL.
 */
#define KB_FIBER_HOT_VEC 4
int kb_fiber_set_hot_vec(kb_fiber *f, const void *const *vec);

/*
 * Warming the engine a thread runs next. During sim's next run (kb_sim_run or
 * kb_sim_run_until; the run ends the walk), sim walks next's live fibers, one for every event it
 * fires, and asks for the lines a resume of each reads to be brought into the mid-level cache
 * (not the L1): its record, what it blocked on, the lines of kb_fiber_set_hot and those its
 * kb_fiber_set_hot_vec vector names (not its stack). For a thread that runs several engines in
 * turn whose state together passes its L2 (kb_psim_opts.warm: a thread's partitions, one after
 * another in each window), so that the next one's state is there, not in the L3 or memory, when
 * the thread turns to it. next must not run, nor have fibers spawned or ended, while sim runs
 * (the walk reads its fiber list): the two belong to one thread. next == NULL or sim: no walk.
 * A speed hint only; nothing the run computes depends on it.
 */
void kb_sim_warm_next(kb_sim *sim, kb_sim *next);

/* Suspends the running fiber for dt >= 0 picoseconds (dt = 0 yields to events queued for now). */
void kb_fiber_sleep(kb_sim *sim, kb_time dt);

/*
 * kb_sim_at(sim, t, fn, a, b) followed by sleeping until t, in one queue entry: at t, fn runs
 * and the fiber resumes right after it, as the two events would (nothing can come between
 * them: they are adjacent in (time, seq) order; both count in kb_sim_events). t must be later
 * than now (else KB_ERR_INVAL and nothing happens); never allocates. Running fiber only.
 */
int kb_fiber_sleep_then(kb_sim *sim, kb_time t, kb_event_fn fn, void *a, void *b);

/*
 * Suspends the running fiber until someone calls kb_fiber_wake() on it. `what` (a static
 * string) and `obj` describe what it waits on, for deadlock reports. Building block of the
 * primitives in kb_sync.h; use those when they fit.
 */
void kb_fiber_block(kb_sim *sim, const char *what, const void *obj);

/* Makes a blocked fiber runnable at the current time (FIFO order) / at absolute time t. */
void kb_fiber_wake(kb_sim *sim, kb_fiber *f);
void kb_fiber_wake_at(kb_sim *sim, kb_fiber *f, kb_time t);

/* Calls fn for every fiber blocked in kb_fiber_block, in spawn order. */
typedef void (*kb_blocked_fn)(const kb_fiber *f, const char *what, const void *obj, void *ud);
void kb_sim_foreach_blocked(const kb_sim *sim, kb_blocked_fn fn, void *ud);

/* Intrusive link used by kb_sync.h wait lists; a fiber waits on at most one thing at a time. */
kb_fiber **kb_fiber_link(kb_fiber *f);

#endif
