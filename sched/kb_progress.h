/*
 * kb_progress — where a long run is, for a progress display on another thread.
 *
 * Library code never prints (kb_err.h). A program that wants to show how far a run has come
 * owns one kb_progress, hands it down through the objects it already passes (kb_ctx_opts,
 * which gives it to the engine, the replay and the device set-up), and reads it from a thread
 * of its own (kbcl run's ticker, app/cli/progress.c). The writers publish with relaxed
 * stores: the reader wants recent values, not a consistent snapshot, and no writer may pay
 * for an ordering it does not need. The event engine publishes `now` and its event count
 * at most once per KB_PROGRESS_EVERY events, from the path that moves its timing wheel to a
 * later slot rather than from the per-event loop, and never with a clock read or a system
 * call (kb_sim.c), so that a display costs the simulation nothing measurable.
 *
 * Nothing here changes what a run computes: every field is written, never read, by the
 * simulation, the replay and the set-up. A NULL kb_progress is accepted everywhere and means
 * "nobody is watching".
 */
#ifndef KB_PROGRESS_H
#define KB_PROGRESS_H

#include <stdatomic.h>
#include <stdint.h>

/* What the run's own thread is doing. */
typedef enum kb_progress_phase {
    KB_PROGRESS_START = 0,   /* reading the configuration, building the machine */
    KB_PROGRESS_PHASE1,      /* the simulation (Phase 1) */
    KB_PROGRESS_DEVICE_WAIT, /* waiting for the Phase-2 device's set-up to end */
    KB_PROGRESS_REPLAY,      /* replaying the op log (Phase 2) */
    KB_PROGRESS_VERIFY,      /* checking the outputs against the host */
} kb_progress_phase;

/* What the Phase-2 device set-up (a thread of its own, kb_runtime.h) is doing. */
typedef enum kb_progress_device {
    KB_PROGRESS_DEV_NONE = 0,  /* no set-up under way (none, ended, or no OpenCL device) */
    KB_PROGRESS_DEV_SETUP,     /* drivers, devices, context */
    KB_PROGRESS_DEV_BUILD,     /* clBuildProgram from source: the long part of a cold start */
    KB_PROGRESS_DEV_LOAD,      /* the program from kbcl's cache of built binaries */
} kb_progress_device;

/* The engine publishes at most once per this many events. */
#define KB_PROGRESS_EVERY 4096u

typedef struct kb_progress {
    _Atomic int phase;              /* kb_progress_phase */
    _Atomic int device;             /* kb_progress_device */
    _Atomic int64_t sim_now;        /* simulated time reached, ps (kb_time) */
    _Atomic uint64_t events;        /* events fired so far */
    _Atomic uint64_t flushes;       /* replay flushes begun */
    _Atomic uint64_t flush_records; /* records of the flush under way */
    _Atomic uint64_t batches;       /* batches of the flush under way (0 while it is planned) */
    _Atomic uint64_t batches_done;  /* of those, run */
} kb_progress;

/* Zeroes every field (phase START, no device set-up). p may be NULL. */
static inline void kb_progress_init(kb_progress *p)
{
    if (!p)
        return;
    atomic_init(&p->phase, KB_PROGRESS_START);
    atomic_init(&p->device, KB_PROGRESS_DEV_NONE);
    atomic_init(&p->sim_now, 0);
    atomic_init(&p->events, 0);
    atomic_init(&p->flushes, 0);
    atomic_init(&p->flush_records, 0);
    atomic_init(&p->batches, 0);
    atomic_init(&p->batches_done, 0);
}

/* Publishers (p may be NULL). kb_progress_set_phase returns the phase it replaces, so that a
 * step nested in another (a flush inside Phase 1 or a verification) can put it back. */
static inline int kb_progress_set_phase(kb_progress *p, kb_progress_phase ph)
{
    return p ? atomic_exchange_explicit(&p->phase, (int)ph, memory_order_relaxed)
             : KB_PROGRESS_START;
}

static inline void kb_progress_set_device(kb_progress *p, kb_progress_device d)
{
    if (p)
        atomic_store_explicit(&p->device, (int)d, memory_order_relaxed);
}

#endif
