/*
 * kb_sim_int — what the event engine's two files share, and nobody else: the event and fiber
 * records, the engine's state (struct kb_sim) and the functions kb_sim.c calls in
 * kb_sim_mem.c. kb_sim.c is the engine (event storage, the run loop, context switches, the
 * fiber calls), kb_sim_mem.c its memory (an engine's creation and destruction, the growth of
 * its event stores, fiber stacks). Internal: not installed (CMakeLists.txt leaves it out of
 * include/kbcl) and included by those two files only; the fields may change at any time.
 */
#ifndef KB_SIM_INT_H
#define KB_SIM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kb_progress.h"
#include "kb_sim.h"

#if KBCL_FIBER_UCONTEXT
#include <ucontext.h>
#elif KBCL_FIBER_ASM
/* A context suspended by kb_sim.c's x86-64 switch: stack pointer, frame pointer, resume
 * address (why no more: the comment at the switch). */
typedef struct kb_uctx_ {
    void *sp, *bp, *pc;
} kb_uctx_;
#else
typedef void *kb_fctx_;
typedef struct {
    kb_fctx_ fctx;
    void *data;
} kb_transfer_;
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KB_ASAN_ 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KB_ASAN_ 1
#endif
#endif
#ifdef KB_ASAN_
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* ThreadSanitizer (KBCL_TSAN builds): every fiber is a TSan fiber and every switch is
 * announced (kb_sim.c), so that TSan keeps each fiber's accesses apart. */
#if defined(__SANITIZE_THREAD__)
#define KB_TSAN_ 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KB_TSAN_ 1
#endif
#endif
#ifdef KB_TSAN_
#include <sanitizer/tsan_interface.h>
#endif

#define KB_DEFAULT_STACK_ (256u * 1024u)
#define KB_MIN_STACK_ (16u * 1024u) /* below this even a trivial fiber overflows */
#define KB_INITIAL_CAP_ 64u
#define KB_GUARDED_STACKS_ 16384u /* mprotect guards: 32 768 VMAs, half of vm.max_map_count */
#define KB_CHUNK_STACKS_ 64u
#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102 /* Linux 6.13 uapi; older kernels answer EINVAL */
#endif
#define KB_NAME_MAX_ 47

typedef struct kb_event {
    kb_time time;
    uint64_t seq;
    kb_event_fn fn;
    void *a, *b;
} kb_event;

/* FIFO entries need no time (it is `now`) and no seq (the ring order is the order). */
typedef struct kb_now_event {
    kb_event_fn fn;
    void *a, *b;
} kb_now_event;

typedef struct kb_stack_chunk {
    struct kb_stack_chunk *next;
    unsigned char *base;
} kb_stack_chunk;

enum { KB_F_READY, KB_F_RUNNING, KB_F_BLOCKED, KB_F_DEAD };

struct kb_fiber {
    /* first, in one cache line (the struct is line-aligned: kb_sim.c fiber_alloc): what a
     * resume, a sleep, a block and a wake touch. With thousands of fibers every resume finds
     * the fiber cold, so each line more is a cache miss per event */
#if KBCL_FIBER_UCONTEXT
    _Alignas(64) ucontext_t uc;
#elif KBCL_FIBER_ASM
    _Alignas(64) kb_uctx_ uc;
#else
    _Alignas(64) kb_fctx_ ctx;
#endif
    int state;
    kb_event_fn then_fn; /* kb_fiber_sleep_then: what runs just before the resume */
    union {
        struct { /* KB_F_BLOCKED: what it waits on (a static string) and for which object */
            const char *what;
            const void *obj;
        } b;
        struct { /* kb_fiber_sleep_then, until it runs: then_fn's arguments */
            void *a, *b;
        } then;
    } u;
    kb_fiber *wait_next;          /* kb_sync wait lists */
    kb_sim *sim;
    const void *const *hot_vec;   /* kb_fiber_set_hot_vec (NULL: none) */
    const void *hot[KB_FIBER_HOT]; /* kb_fiber_set_hot: prefetched before a resume */
    void *udata;
    kb_fiber *prev, *next;        /* live list (spawn order); next doubles as free-list link */
    kb_fiber_fn fn;               /* read once, at the fiber's start */
    /* the second line ends here: the run loop prefetches it with the first */
    void *arg;
    unsigned char *stack;         /* low end of the usable stack (sim->stack_bytes long) */
#ifdef KB_ASAN_
    void *fake_stack;
#endif
#ifdef KB_TSAN_
    void *tsan;                   /* its TSan fiber, from its context's making to its end */
#endif
    char name[KB_NAME_MAX_ + 1];
};

#if KBCL_FIBER_ASM
_Static_assert(offsetof(struct kb_fiber, sim) == 64, "a fiber's hot fields fill its first line");
_Static_assert(offsetof(struct kb_fiber, hot) + sizeof(const void *[KB_FIBER_HOT]) <= 128 &&
                   offsetof(struct kb_fiber, hot_vec) < 128,
               "the prefetch hints are on the fiber's second line");
#endif

/* A wheel bucket's event: linked by pool index, so the pool can grow by realloc. */
typedef struct kb_wnode {
    kb_event ev;
    uint32_t next;
} kb_wnode;

#define KB_WHEEL_N_ 65536u /* buckets of 2^shift ps: a 33.6 us horizon by default */
#define KB_WHEEL_WORDS_ (KB_WHEEL_N_ / 64u)
#define KB_WHEEL_SUMS_ (KB_WHEEL_WORDS_ / 64u)
#define KB_NIL_ UINT32_MAX

struct kb_sim {
    kb_time now;
    uint64_t seq;
    kb_event *heap;  /* near run: every pending event of the cursor's slot, sorted, in [nh, hn) */
    size_t nh, hn;
    int near_heap;   /* the near run is a 4-ary heap in [0, hn) instead (nh = 0) */
    unsigned shift;  /* a slot is 2^shift ps (kb_sim_opts.slot_shift) */
    int pf_slots;    /* kb_sim_opts.prefetch_slots */
    kb_event *far;   /* far heap: events beyond the wheel's horizon when pushed */
    size_t farn;
    kb_now_event *fifo;
    size_t fhead, fn;
    size_t cap; /* capacity of heap, far heap, fifo and node pool; a power of two */

    /* timing wheel between the two heaps (see "event storage") */
    uint64_t cursor;                  /* slot (time >> shift) the near run holds */
    kb_wnode *nodes;                  /* pool of cap nodes */
    uint32_t free_node;
    size_t wn;                        /* events in wheel buckets */
    uint32_t bucket[KB_WHEEL_N_];     /* list heads, KB_NIL_ when empty */
    uint64_t bits[KB_WHEEL_WORDS_];   /* bit b set <=> bucket[b] non-empty */
    uint64_t sums[KB_WHEEL_SUMS_];    /* bit w set <=> bits[w] != 0 */

    kb_fiber *current;
    kb_fiber *live_head, *live_tail;
    kb_fiber *free_list;
    struct kb_stack_chunk *chunks; /* stacks are carved from the head chunk */
    size_t chunk_left;             /* stacks not yet handed out in the head chunk */
    size_t nstacks;                /* stacks created so far */
    int guard_regions;             /* MADV_GUARD_INSTALL: 0 untried, 1 works, -1 refused */
    size_t nlive, nblocked;
    size_t page, stack_bytes;

    uint64_t nevents, nswitches;
    int running, stop, stop_code;
    /* kb_sim_warm_next's walk, for this run: the next engine's fiber whose record was asked
     * for at the last event, and the one before it if its vector's line was (NULL: none) */
    kb_fiber *wcur, *wvec;

#if KBCL_FIBER_UCONTEXT
    ucontext_t sched_uc;
#elif KBCL_FIBER_ASM
    kb_uctx_ sched_uc;
#else
    kb_fctx_ sched_ctx;
#endif
#ifdef KB_TSAN_
    void *sched_tsan;              /* the TSan fiber of the thread running the loop */
#endif
#ifdef KB_ASAN_
    const void *sched_stack_bottom;
    size_t sched_stack_size;
#endif
    /* kb_sim_set_progress: the loop publishes to `progress` at its first move to a later
     * slot once nevents has reached publish_at (UINT64_MAX without one: never) */
    uint64_t publish_at;
    kb_progress *progress;
};

_Static_assert(offsetof(struct kb_sim, now) == 0, "kb_sim_now (kb_sim.h) reads the first member");

/* kb_sim_mem.c. Grows every event store so that cap >= need; keeps cap unchanged on failure
 * (0 or KB_ERR_NOMEM). */
int kb_sim_grow(kb_sim *sim, size_t need);

/* kb_sim_mem.c. Gives f a fresh stack (guard page below it) from the head chunk: 0 or
 * KB_ERR_NOMEM. */
int kb_sim_stack_alloc(kb_sim *sim, kb_fiber *f);

#endif
