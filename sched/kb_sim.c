/*
 * kb_sim — discrete-event engine and fibers (API and ordering argument in kb_sim.h).
 *
 * Events are stored by value: future events in a near run, a timing wheel and a far heap (see
 * "event storage" below), events for the current time in a power-of-two ring (the FIFO). The
 * arrays grow by doubling and share one capacity that is kept >= pending callback events + live
 * fibers: every live fiber has at most one pending event (its resume), so the fiber paths
 * (sleep, wake, finish), which cannot report errors, never allocate; only kb_sim_at/after and
 * kb_fiber_spawn grow the arrays.
 * Fibers switch with inline assembly on x86-64 (uctx_switch) or Boost.Context's fcontext
 * elsewhere (registers only, no system call per switch) or, under KBCL_FIBER_UCONTEXT, with
 * swapcontext (slower: it saves the signal mask); under AddressSanitizer every switch is
 * announced with __sanitizer_{start,finish}_switch_fiber. Fibers are asymmetric: a fiber always
 * switches back to the scheduler loop that resumed it. Finished fibers keep their stack on a
 * free list for the next spawn. The engine's memory (creation and destruction, the growth of
 * the event arrays, the stacks themselves) is kb_sim_mem.c's; the state both files share is in
 * kb_sim_int.h. Limits: single-threaded; kb_sim_destroy must not be called from inside a run.
 */
#include "kb_sim_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "kb_err.h"
#include "kb_progress.h"

#if KBCL_FIBER_ASM
/* kb_switch_x86_64.S: where a fresh context starts; calls the function at the stack top with
 * the fiber (in rdi, put there by the switch). */
extern void kb_fiber_start(void);

#if defined(__AVX512F__)
#define KB_CLOBBER_AVX512_                                                                     \
    , "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", \
        "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "k1", "k2", "k3", "k4", "k5", "k6", \
        "k7"
#else
#define KB_CLOBBER_AVX512_
#endif

/*
 * The x86-64 switch is inline assembly at each switch site, with no call and no return: a
 * suspended context is {stack pointer, frame pointer, resume address}; the switch stores the
 * current three, loads the other side's and jumps. Every other register is declared clobbered,
 * so the compiler keeps nothing live in registers across a switch (it spills what it needs,
 * as around a call). Why no call: a call into a switch routine pushes a return address that
 * the other side never pops, and the return-stack predictor then mispredicts the resumed
 * side's returns (a fiber returns through two or three frames after each resume). Without
 * them, the predictor still holds the previous fiber's returns, which, with hundreds of
 * kernels taking turns through the same code, are the right ones. The MXCSR and x87 control
 * words are not switched: kbcl never changes them.
 */

/* Suspends the running context into *from and resumes *to; arg reaches a fresh context's
 * entry function in rdi. Returns when something switches back to *from. */
static inline __attribute__((always_inline)) void uctx_switch(kb_uctx_ *from,
                                                              const kb_uctx_ *to, void *arg)
{
    __asm__ volatile("leaq 1f(%%rip), %%rax\n\t"
                     "movq %%rax, 16(%[from])\n\t"
                     "movq %%rsp, 0(%[from])\n\t"
                     "movq %%rbp, 8(%[from])\n\t"
                     "movq 0(%[to]), %%rsp\n\t"
                     "movq 8(%[to]), %%rbp\n\t"
                     "jmpq *16(%[to])\n\t"
                     "1:"
                     : "+D"(arg), [from] "+S"(from), [to] "+d"(to)
                     :
                     : "rax", "rbx", "rcx", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15",
                       "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "st",
                       "st(1)", "st(2)", "st(3)", "st(4)", "st(5)", "st(6)", "st(7)", "memory",
                       "cc" KB_CLOBBER_AVX512_);
}
#elif !KBCL_FIBER_UCONTEXT
/* Boost.Context's C-linkage switch (libboost_context); declared here because its header is C++. */
extern kb_transfer_ jump_fcontext(kb_fctx_ const to, void *vp);
extern kb_fctx_ make_fcontext(void *sp, size_t size, void (*fn)(kb_transfer_));
#endif

/* ---------------------------------------------------------------- event storage */

/*
 * Three stores hold the future events, and together they keep exact (time, seq) order:
 *  - the near run holds every pending event whose slot (time >> shift) is at most
 *    the cursor slot (the slot of `now`, or of the only pending event when a push finds the
 *    queue empty, which keeps a lone event off the wheel), sorted by (time, seq) and consumed
 *    from its front (a slot's events mostly share one time: lockstep PEs; then filling it is
 *    a copy); a slot whose events come in random time order makes it a 4-ary heap until it
 *    is used up;
 *  - the wheel holds events of the next KB_WHEEL_N_ - 1 slots, unsorted, one list per slot,
 *    with a bit per slot and a bit per word of those (the next non-empty slot is a couple of
 *    word scans away however sparse the wheel is);
 *  - the far heap holds events that were beyond the wheel's horizon when pushed. Its horizon,
 *    33.6 us with the default slots, is past the DMA and PE_MATH times of a 1 MiB IPCQ chunk
 *    (8 us each): with 2.1 us, a 256-rank all-reduce at 1 GiB per rank sent a fifth of its
 *    events through the far heap, and its pops were 8 % of the run's instructions.
 * When the near run is used up, the cursor moves to the earliest slot that the wheel or the far
 * heap holds, and that slot's events move into the near run. Every event left behind has a
 * later slot, hence a later time, than any in the near run, so its front is the global
 * (time, seq) minimum. A collective's events cluster within a few microseconds of `now`, so a
 * slot holds a handful of events and a push into a later slot costs a list link, where one heap
 * of everything paid a full-depth pop per event (docs/performance.md has the history).
 */

/* Non-short-circuit operators: heap comparisons are unpredictable, so avoid branches. */
static int ev_before(const kb_event *x, const kb_event *y)
{
    return (x->time < y->time) | ((x->time == y->time) & (x->seq < y->seq));
}

static inline uint64_t slot_of(const kb_sim *sim, kb_time t)
{
    return (uint64_t)t >> sim->shift;
}

/* Makes room for `extra` more callback events / fibers (see the invariant at the top). */
static int reserve(kb_sim *sim, size_t extra)
{
    size_t need = (sim->hn - sim->nh) + sim->farn + sim->wn + sim->fn + sim->nlive + extra;
    return need <= sim->cap ? 0 : kb_sim_grow(sim, need);
}

/*
 * A 4-ary heap: half the depth of a binary one, and a node's four children are adjacent, so a
 * sift-down level costs three comparisons within two cache lines instead of a dependent load
 * per level.
 */
#define KB_HEAP_D_ 4

static void heap_insert(kb_event *h, size_t *hn, const kb_event *ev)
{
    size_t i = (*hn)++;

    while (i > 0) {
        size_t p = (i - 1) / KB_HEAP_D_;
        if (!ev_before(ev, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = *ev;
}

/* Places ev at the hole i of h[0..n) and sifts it down (moving the hole, not swapping). */
static void sift_down(kb_event *h, size_t n, size_t i, const kb_event *ev)
{
    for (;;) {
        size_t c = KB_HEAP_D_ * i + 1, best;
        if (c >= n)
            break;
        best = c;
        size_t end = c + KB_HEAP_D_ < n ? c + KB_HEAP_D_ : n;
        for (size_t k = c + 1; k < end; k++)
            best = ev_before(&h[k], &h[best]) ? k : best;
        if (!ev_before(&h[best], ev))
            break;
        h[i] = h[best];
        i = best;
    }
    h[i] = *ev;
}

static void heap_remove_min(kb_event *h, size_t *hn, kb_event *out)
{
    size_t n = --*hn;

    *out = h[0];
    if (n > 0) {
        kb_event last = h[n];
        sift_down(h, n, 0, &last);
    }
}

/* Turns h[0..n) into a heap (Floyd: sift down every parent, last first). */
static void heapify(kb_event *h, size_t n)
{
    for (size_t i = n > 1 ? (n - 2) / KB_HEAP_D_ + 1 : 0; i-- > 0;) {
        kb_event ev = h[i];
        sift_down(h, n, i, &ev);
    }
}

/*
 * The near run turns into a heap (until it is used up) when keeping it sorted would cost
 * more than a few moves: slots whose events arrive in random time order.
 */
#define KB_NEAR_SHIFTS_ 8

static void near_to_heap(kb_sim *sim)
{
    size_t n = sim->hn - sim->nh;
    if (sim->nh)
        memmove(sim->heap, sim->heap + sim->nh, n * sizeof *sim->heap);
    sim->nh = 0;
    sim->hn = n;
    sim->near_heap = 1; /* a sorted array already is a heap */
}

/* Inserts into the sorted near run. A new event has the largest seq so far, so it goes after
 * every event of its time, usually at the end; one from the far heap may go before events of
 * its own time that the wheel handed over (they were pushed after it). */
static void near_insert(kb_sim *sim, const kb_event *ev)
{
    kb_event *h = sim->heap;
    size_t i;

    if (!sim->near_heap) {
        /* its place: after the last event of a time <= its own, counted from the back */
        for (i = sim->hn; i > sim->nh && ev_before(ev, &h[i - 1]); i--)
            if (sim->hn - i == KB_NEAR_SHIFTS_) {
                near_to_heap(sim);
                break;
            }
    }
    if (sim->near_heap) {
        assert(sim->hn < sim->cap);
        heap_insert(sim->heap, &sim->hn, ev);
        return;
    }
    if (sim->hn == sim->cap) { /* compact: the consumed front is free space */
        memmove(h, h + sim->nh, (sim->hn - sim->nh) * sizeof *h);
        i -= sim->nh;
        sim->hn -= sim->nh;
        sim->nh = 0;
    }
    assert(sim->hn < sim->cap);
    memmove(h + i + 1, h + i, (sim->hn - i) * sizeof *h);
    h[i] = *ev;
    sim->hn++;
}

/* Puts ev, which precedes every pending event, at the front of the near run. */
static void near_push_front(kb_sim *sim, const kb_event *ev)
{
    if (sim->near_heap) {
        heap_insert(sim->heap, &sim->hn, ev); /* the minimum: it becomes the root */
        return;
    }
    if (sim->nh == 0) {
        assert(sim->hn < sim->cap);
        memmove(sim->heap + 1, sim->heap, sim->hn * sizeof *sim->heap);
        sim->hn++;
        sim->nh = 1;
    }
    sim->heap[--sim->nh] = *ev;
}

/* Marks bucket b empty. */
static void wheel_clear(kb_sim *sim, uint32_t b)
{
    if (!(sim->bits[b >> 6] &= ~(UINT64_C(1) << (b & 63u))))
        sim->sums[b >> 12] &= ~(UINT64_C(1) << ((b >> 6) & 63u));
}

/* Out of line and cold: what calls it pays one compare per move of the wheel's cursor to a
 * later slot (advance, and heap_push into an empty queue), none per event (kb_progress.h).
 * The time is that of the last event fired. The stores are relaxed: the reader is a
 * display, not a consumer of simulated state. */
static KB_COLD void progress_publish(kb_sim *sim)
{
    atomic_store_explicit(&sim->progress->sim_now, sim->now, memory_order_relaxed);
    atomic_store_explicit(&sim->progress->events, sim->nevents, memory_order_relaxed);
    sim->publish_at = sim->nevents + KB_PROGRESS_EVERY;
}

static void heap_push(kb_sim *sim, kb_time t, kb_event_fn fn, void *a, void *b)
{
    uint64_t s = slot_of(sim, t);

    if (s > sim->cursor && sim->hn == sim->nh && sim->wn == 0 && sim->farn == 0) {
        sim->cursor = s; /* nothing else is pending: the cursor may jump to it */
        if (sim->nevents >= sim->publish_at)
            progress_publish(sim);
    }
    if (s > sim->cursor && s - sim->cursor < KB_WHEEL_N_) {
        /* the common case first; fields written in place (a struct built on the stack and
         * copied costs a store-forwarding stall) */
        uint32_t b_ = (uint32_t)(s & (KB_WHEEL_N_ - 1u)), i = sim->free_node;
        kb_wnode *nd = &sim->nodes[i];
        assert(i != KB_NIL_);
        sim->free_node = nd->next;
        nd->ev.time = t;
        nd->ev.seq = sim->seq++;
        nd->ev.fn = fn;
        nd->ev.a = a;
        nd->ev.b = b;
        nd->next = sim->bucket[b_];
        sim->bucket[b_] = i;
        sim->bits[b_ >> 6] |= UINT64_C(1) << (b_ & 63u);
        sim->sums[b_ >> 12] |= UINT64_C(1) << ((b_ >> 6) & 63u);
        sim->wn++;
        return;
    }
    kb_event ev = {t, sim->seq++, fn, a, b};
    if (s <= sim->cursor) {
        near_insert(sim, &ev);
    } else {
        assert(sim->farn < sim->cap);
        heap_insert(sim->far, &sim->farn, &ev);
    }
}

/* Distance (1 .. N-1) from bucket `from` to the next non-empty bucket after it, circularly. */
static uint64_t wheel_next(const kb_sim *sim, uint32_t from)
{
    uint32_t start = (from + 1u) & (KB_WHEEL_N_ - 1u);
    uint32_t w = start >> 6;
    uint64_t m = sim->bits[w] & (~UINT64_C(0) << (start & 63u));

    if (!m) {
        /* the next non-empty word, circularly, through the summary (bits[w] itself may hold
         * buckets before `start` only: those come last, a whole turn later) */
        uint32_t ws = (w + 1u) & (KB_WHEEL_WORDS_ - 1u), g = ws >> 6;
        uint64_t sm = sim->sums[g] & (~UINT64_C(0) << (ws & 63u));
        for (uint32_t k = 0; !sm && k < KB_WHEEL_SUMS_; k++) {
            g = (g + 1u) & (KB_WHEEL_SUMS_ - 1u);
            sm = sim->sums[g];
        }
        assert(sm);
        w = (g << 6) + (uint32_t)__builtin_ctzll(sm);
        m = sim->bits[w];
    }
    uint32_t b = (w << 6) + (uint32_t)__builtin_ctzll(m);
    return (b - from) & (KB_WHEEL_N_ - 1u);
}

static void near_pop(kb_sim *sim, kb_event *out);

static void fiber_resume_ev(kb_sim *sim, void *a, void *b);
static void fiber_then_ev(kb_sim *sim, void *a, void *b);

/*
 * Prefetching the next resumes. With thousands of PEs on a thread every PE's state is cold when
 * its next event comes (a window sweeps them all), and a resume finds its lines one through
 * another: the event names the fiber's record, the record its stack, the stack the kernel's
 * context, that its PE; each a miss that waits for the one before. The run loop walks that
 * chain ahead, one link per event: the records of the resumes among the events after next
 * (and of a slot's events as they enter the near run), then, for the next event, the lines
 * its record names — the stack's top, what the fiber blocked on, its kb_fiber_set_hot lines
 * and the line of its kb_fiber_set_hot_vec vector; last, just before a resume, the lines that
 * vector names (one link further: what a kernel reaches through its PE's tables). Only events
 * already in the near run are seen. Prefetches change nothing the run computes.
 */
static KB_ALWAYS_INLINE int ev_resumes(const kb_event *e)
{
    return e->fn == fiber_resume_ev || e->fn == fiber_then_ev;
}

static KB_ALWAYS_INLINE void prefetch_record(const kb_event *e)
{
    if (ev_resumes(e)) {
        __builtin_prefetch(e->a, 1);
        __builtin_prefetch((const char *)e->a + 64, 0);
    }
}

/* The lines a resume of fiber f reads besides its record and stack: what it blocked on, its
 * kb_fiber_set_hot lines, its hint vector's line. A macro because __builtin_prefetch takes its
 * locality as a constant: 3 (the L1) just before a resume, 2 (the L2) for kb_sim_warm_next. */
#define PREFETCH_HINTS(f, loc)                                                                  \
    do {                                                                                        \
        if ((f)->state == KB_F_BLOCKED && (f)->u.b.obj)                                         \
            __builtin_prefetch((f)->u.b.obj, 0, loc);                                           \
        for (int i_ = 0; i_ < KB_FIBER_HOT; i_++)                                               \
            if ((f)->hot[i_])                                                                   \
                __builtin_prefetch((f)->hot[i_], 0, loc);                                       \
        if ((f)->hot_vec)                                                                       \
            __builtin_prefetch((f)->hot_vec, 0, loc);                                           \
    } while (0)

static KB_ALWAYS_INLINE void prefetch_lines(const kb_event *e)
{
    const kb_fiber *f = e->a;

    if (!ev_resumes(e))
        return;
#if KBCL_FIBER_ASM
    __builtin_prefetch(f->uc.sp, 0);
    __builtin_prefetch((const char *)f->uc.sp + 64, 0);
#endif
    PREFETCH_HINTS(f, 3);
}

/* The event about to fire, if it resumes a fiber: its record's lines once more (the first of a
 * slot, a FIFO event or a new front of the near run had no event before it to ask for them;
 * for the rest the record has arrived and they are reissued), then the lines its
 * kb_fiber_set_hot_vec vector names now (the vector's line was asked for with the record's). */
static KB_ALWAYS_INLINE void prefetch_current(const kb_event *e)
{
    const kb_fiber *f = e->a;

    if (!ev_resumes(e))
        return;
    prefetch_lines(e);
    if (f->hot_vec)
        for (int i = 0; i < KB_FIBER_HOT_VEC; i++)
            __builtin_prefetch(f->hot_vec[i], 1);
}

static KB_ALWAYS_INLINE void prefetch_ahead(const kb_sim *sim)
{
    const kb_event *nx = &sim->heap[sim->nh];

    if (sim->hn <= sim->nh)
        return;
    if (!sim->near_heap) {
        if (sim->hn > sim->nh + 1)
            prefetch_record(&nx[1]);
    } else { /* a 4-ary heap: the next but one is among the root's children */
        for (size_t j = 1; j < sim->hn && j <= 4; j++)
            prefetch_record(&nx[j]);
    }
    prefetch_lines(nx);
}

/* One step of kb_sim_warm_next's walk, after an event: the lines named by the vector of the
 * fiber before (its line was asked for a step ago), then, from the record asked for a step ago,
 * the next fiber's record and this one's hot lines, what it blocked on and its vector's line.
 * Each link of the chain is read a step (an event) after it was asked for, so it has mostly
 * arrived. Locality 2: the L2 (prefetcht1 on x86), as the lines are wanted a partition later.
 * Not the stack: its live lines (8 to 20) cost more to ask for than they saved (docs/parallel.md
 * "Warming the next partition"). */
static KB_NOINLINE void warm_step(kb_sim *sim)
{
    kb_fiber *f = sim->wcur, *v = sim->wvec;

    if (v)
        for (int i = 0; i < KB_FIBER_HOT_VEC; i++)
            __builtin_prefetch(v->hot_vec[i], 0, 2);
    sim->wvec = NULL;
    if (!f)
        return;
    kb_fiber *n = f->next;
    if (n) {
        __builtin_prefetch(n, 0, 2);
        __builtin_prefetch((const char *)n + 64, 0, 2);
    }
    PREFETCH_HINTS(f, 2);
    if (f->hot_vec)
        sim->wvec = f;
    sim->wcur = n;
}

void kb_sim_warm_next(kb_sim *sim, kb_sim *next)
{
    int on = next && next != sim;

    sim->wcur = on ? next->live_head : NULL;
    sim->wvec = NULL;
    if (on && sim->wcur) { /* the first record, a step ahead as the walk wants it */
        __builtin_prefetch(sim->wcur, 0, 2);
        __builtin_prefetch((const char *)sim->wcur + 64, 0, 2);
    }
}

/* After slot b was taken (kb_sim_opts.prefetch_slots): the record of the next slot's newest
 * event, whose list node the slot before asked for, and the node of the slot after that. A
 * slot's first event has no event before it in the near run to see it coming, and at thousands
 * of PEs on a thread the partitions' wheels hold about two events a slot. */
static KB_ALWAYS_INLINE void prefetch_slots_ahead(const kb_sim *sim, uint32_t b)
{
    if (!sim->pf_slots || !sim->wn)
        return;
    uint32_t b1 = (b + (uint32_t)wheel_next(sim, b)) & (KB_WHEEL_N_ - 1u), i1 = sim->bucket[b1];
    if (b1 == b || i1 == KB_NIL_)
        return;
    prefetch_record(&sim->nodes[i1].ev);
    uint32_t b2 = (b1 + (uint32_t)wheel_next(sim, b1)) & (KB_WHEEL_N_ - 1u), i2 = sim->bucket[b2];
    if (b2 != b1 && i2 != KB_NIL_)
        __builtin_prefetch(&sim->nodes[i2], 0);
}

/*
 * With the near run used up: moves the cursor to the earliest slot still holding events and
 * takes that slot's first event into *out, the rest into the near run (a slot that holds a
 * single event goes straight out). Returns 0 when nothing at all is
 * pending.
 */
static KB_ALWAYS_INLINE int advance(kb_sim *sim, kb_event *out)
{
    uint64_t next = UINT64_MAX;
    uint32_t cb = (uint32_t)(sim->cursor & (KB_WHEEL_N_ - 1u));

    assert(sim->hn == sim->nh);
    sim->nh = sim->hn = 0;
    sim->near_heap = 0;
    if (sim->wn)
        next = sim->cursor + wheel_next(sim, cb);
    if (sim->farn && slot_of(sim, sim->far[0].time) < next)
        next = slot_of(sim, sim->far[0].time);
    if (next == UINT64_MAX)
        return 0;
    /* Here (and where heap_push moves the cursor), not in kb_sim_run's loop: the progress
     * display costs the per-event paths nothing (kb_progress.h). */
    if (sim->nevents >= sim->publish_at)
        progress_publish(sim);
    sim->cursor = next;
    if (sim->wn) {
        uint32_t b = (uint32_t)(next & (KB_WHEEL_N_ - 1u));
        uint32_t i = sim->bucket[b];
        if (i != KB_NIL_ && sim->nodes[i].next == KB_NIL_ &&
            slot_of(sim, sim->nodes[i].ev.time) == next &&
            !(sim->farn && slot_of(sim, sim->far[0].time) == next)) {
            *out = sim->nodes[i].ev; /* alone in its slot: it is the minimum */
            sim->nodes[i].next = sim->free_node;
            sim->free_node = i;
            sim->wn--;
            sim->bucket[b] = KB_NIL_;
            wheel_clear(sim, b);
            prefetch_slots_ahead(sim, b);
            return 1;
        }
        if (i != KB_NIL_ && slot_of(sim, sim->nodes[i].ev.time) == next) {
            /* the list is newest first: copy it out in one pass, then reverse (seq order) */
            kb_event *h = sim->heap;
            size_t k = 0;
            int sorted = 1;
            while (i != KB_NIL_) {
                uint32_t nx = sim->nodes[i].next;
                h[k] = sim->nodes[i].ev;
                prefetch_record(&h[k]);
                if (k > 0 && h[k].time > h[k - 1].time)
                    sorted = 0; /* in reverse order, times must not increase */
                k++;
                sim->nodes[i].next = sim->free_node;
                sim->free_node = i;
                i = nx;
            }
            for (size_t lo = 0, hi = k - 1; lo < hi; lo++, hi--) {
                kb_event t = h[lo];
                h[lo] = h[hi];
                h[hi] = t;
            }
            sim->wn -= k;
            sim->hn = k;
            if (!sorted) {
                heapify(sim->heap, k);
                sim->near_heap = 1;
            }
            sim->bucket[b] = KB_NIL_;
            wheel_clear(sim, b);
            prefetch_slots_ahead(sim, b);
        }
    }
    while (sim->farn && slot_of(sim, sim->far[0].time) == next) {
        kb_event ev;
        heap_remove_min(sim->far, &sim->farn, &ev);
        near_insert(sim, &ev);
    }
    assert(sim->hn > sim->nh);
    near_pop(sim, out);
    return 1;
}

static KB_NOINLINE void near_heap_pop(kb_sim *sim, kb_event *out)
{
    heap_remove_min(sim->heap, &sim->hn, out);
    sim->near_heap = sim->hn > 0;
}

/* Takes the near run's front (or its heap's minimum). */
static inline void near_pop(kb_sim *sim, kb_event *out)
{
    if (sim->near_heap) {
        near_heap_pop(sim, out);
        return;
    }
    *out = sim->heap[sim->nh++];
    if (sim->nh == sim->hn)
        sim->nh = sim->hn = 0;
}

static void fifo_push(kb_sim *sim, kb_event_fn fn, void *a, void *b)
{
    kb_now_event *e;

    assert(sim->fn < sim->cap);
    e = &sim->fifo[(sim->fhead + sim->fn++) & (sim->cap - 1)];
    e->fn = fn;
    e->a = a;
    e->b = b;
}

/* Events at `now` go to the FIFO (ordering argument in kb_sim.h), later ones to the heaps. */
static void push(kb_sim *sim, kb_time t, kb_event_fn fn, void *a, void *b)
{
    if (t == sim->now)
        fifo_push(sim, fn, a, b);
    else
        heap_push(sim, t, fn, a, b);
}

static kb_time time_add_sat(kb_time t, kb_time dt)
{
    return dt > KB_TIME_MAX - t ? KB_TIME_MAX : t + dt;
}

/* ---------------------------------------------------------------- engine */

int kb_sim_at(kb_sim *sim, kb_time t, kb_event_fn fn, void *a, void *b)
{
    int rc;

    if (!fn || t < sim->now)
        return KB_ERR_INVAL;
    rc = reserve(sim, 1);
    if (rc)
        return rc;
    push(sim, t, fn, a, b);
    return 0;
}

int kb_sim_after(kb_sim *sim, kb_time dt, kb_event_fn fn, void *a, void *b)
{
    if (dt < 0 || dt > KB_TIME_MAX - sim->now)
        return KB_ERR_INVAL;
    return kb_sim_at(sim, sim->now + dt, fn, a, b);
}

static inline __attribute__((always_inline)) void fiber_resume(kb_sim *sim, kb_fiber *f);
static inline __attribute__((always_inline)) int fiber_then(kb_sim *sim, kb_fiber *f,
                                                            uint64_t seq);

void kb_sim_set_progress(kb_sim *sim, kb_progress *p)
{
    sim->progress = p;
    sim->publish_at = p ? sim->nevents + KB_PROGRESS_EVERY : UINT64_MAX;
    if (p)
        progress_publish(sim);
}

/*
 * The run loop: every pending event, or (bounded) those before `limit`. A bounded loop leaves
 * the first event at or after the limit where it was (in the near run's front, with its seq),
 * so the order of the events it has not fired does not depend on where it stopped. Inlined
 * into both callers with `bounded` a constant: the unbounded loop has no extra compare.
 */
static KB_ALWAYS_INLINE void run_loop(kb_sim *sim, int bounded, kb_time limit)
{
    kb_event ev;

    while (!sim->stop) {
        /* Heap events at `now` were inserted before anything in the FIFO: they go first. */
        if (sim->hn > sim->nh && sim->heap[sim->nh].time == sim->now) {
            near_pop(sim, &ev);
        } else if (sim->fn) {
            kb_now_event *e = &sim->fifo[sim->fhead];
            sim->fhead = (sim->fhead + 1) & (sim->cap - 1);
            sim->fn--;
            ev.fn = e->fn;
            ev.a = e->a;
            ev.b = e->b;
        } else if (sim->hn > sim->nh) {
            if (bounded && sim->heap[sim->nh].time >= limit)
                break;
            near_pop(sim, &ev);
            sim->now = ev.time;
        } else if (advance(sim, &ev)) {
            if (bounded && ev.time >= limit) {
                near_push_front(sim, &ev);
                break;
            }
            sim->now = ev.time;
        } else {
            break;
        }
        sim->nevents++;
        prefetch_ahead(sim);
        prefetch_current(&ev);
        if (sim->wcur || sim->wvec)
            warm_step(sim);
        /* A resume in line: the switch back lands in this loop, so no return through an
         * event function follows it (after a fiber's run the return predictor holds the
         * fiber's calls, and that return would be mispredicted). */
        if (ev.fn == fiber_resume_ev) {
            fiber_resume(sim, ev.a);
        } else if (ev.fn == fiber_then_ev) {
            if (fiber_then(sim, ev.a, (uint64_t)(uintptr_t)ev.b))
                fiber_resume(sim, ev.a);
        } else {
            ev.fn(sim, ev.a, ev.b);
        }
    }
    if (sim->progress)
        progress_publish(sim);
    sim->wcur = sim->wvec = NULL; /* kb_sim_warm_next holds for one run */
}

/* 1 and the code of a stop that ended the loop (the stop cleared), else 0. */
static int take_stop(kb_sim *sim, int *code)
{
    if (!sim->stop)
        return 0;
    sim->stop = 0;
    *code = sim->stop_code;
    return 1;
}

/*
 * A stop requested outside a run stays pending: the next run returns its code before firing
 * anything. Re-entering run from a callback or a fiber is refused with KB_ERR_STATE.
 */
int kb_sim_run(kb_sim *sim)
{
    int rc;

    if (sim->running)
        return KB_ERR_STATE;
    sim->running = 1;
    run_loop(sim, 0, 0);
    if (!take_stop(sim, &rc))
        rc = sim->nblocked ? KB_ERR_DEADLOCK : 0;
    sim->running = 0;
    return rc;
}

int kb_sim_run_until(kb_sim *sim, kb_time limit)
{
    int rc = 0;

    if (sim->running)
        return KB_ERR_STATE;
    sim->running = 1;
    run_loop(sim, 1, limit);
    (void)take_stop(sim, &rc);
    sim->running = 0;
    return rc;
}

/* The earliest time in wheel bucket b's list (events of one slot, in any time order). */
static kb_time bucket_min(const kb_sim *sim, uint32_t b)
{
    kb_time t = KB_TIME_MAX;
    for (uint32_t i = sim->bucket[b]; i != KB_NIL_; i = sim->nodes[i].next)
        if (sim->nodes[i].ev.time < t)
            t = sim->nodes[i].ev.time;
    return t;
}

int kb_sim_next(const kb_sim *sim, kb_time *t)
{
    kb_time best = KB_TIME_MAX;
    int any = 0;

    if (sim->fn) {
        *t = sim->now;
        return 1;
    }
    if (sim->hn > sim->nh) { /* the near run's front, or its heap's root (nh 0) */
        *t = sim->heap[sim->nh].time;
        return 1;
    }
    if (sim->wn) { /* slots after the cursor only: the cursor's went to the near run */
        uint32_t cb = (uint32_t)(sim->cursor & (KB_WHEEL_N_ - 1u));
        best = bucket_min(sim, (uint32_t)((cb + wheel_next(sim, cb)) & (KB_WHEEL_N_ - 1u)));
        any = 1;
    }
    if (sim->farn && (!any || sim->far[0].time < best)) {
        best = sim->far[0].time;
        any = 1;
    }
    if (any)
        *t = best;
    return any;
}

size_t kb_sim_blocked(const kb_sim *sim) { return sim->nblocked; }

void kb_sim_stop(kb_sim *sim, int code)
{
    sim->stop = 1;
    sim->stop_code = code;
}

uint64_t kb_sim_events(const kb_sim *sim) { return sim->nevents; }
uint64_t kb_sim_switches(const kb_sim *sim) { return sim->nswitches; }
size_t kb_sim_live_fibers(const kb_sim *sim) { return sim->nlive; }

/* ---------------------------------------------------------------- context switching */

/*
 * ASan must be told about every stack switch, else it takes the fiber stack for the thread's
 * and reports false positives. These expand to nothing without ASan.
 */
#ifdef KB_ASAN_
#define ASAN_TO_FIBER_(sim, f, fake)                                                         \
    __sanitizer_start_switch_fiber(&(fake), (f)->stack, (sim)->stack_bytes)
#define ASAN_BACK_IN_SCHED_(fake) __sanitizer_finish_switch_fiber((fake), NULL, NULL)
#define ASAN_TO_SCHED_(sim, fsave)                                                           \
    __sanitizer_start_switch_fiber((fsave), (sim)->sched_stack_bottom, (sim)->sched_stack_size)
#define ASAN_BACK_IN_FIBER_(sim, fake)                                                       \
    __sanitizer_finish_switch_fiber((fake), &(sim)->sched_stack_bottom, &(sim)->sched_stack_size)
#else
#define ASAN_TO_FIBER_(sim, f, fake) ((void)0)
#define ASAN_BACK_IN_SCHED_(fake) ((void)0)
#define ASAN_TO_SCHED_(sim, fsave) ((void)0)
#define ASAN_BACK_IN_FIBER_(sim, fake) ((void)0)
#endif

/* TSan: the scheduler's own fiber is the running thread's, noted at every resume (a
 * partition of a parallel run may move between threads from one run to the next). */
#ifdef KB_TSAN_
#define TSAN_TO_FIBER_(sim, f)                                                               \
    ((sim)->sched_tsan = __tsan_get_current_fiber(), __tsan_switch_to_fiber((f)->tsan, 0))
#define TSAN_TO_SCHED_(sim) __tsan_switch_to_fiber((sim)->sched_tsan, 0)
#else
#define TSAN_TO_FIBER_(sim, f) ((void)0)
#define TSAN_TO_SCHED_(sim) ((void)0)
#endif

static void fiber_recycle(kb_sim *sim, kb_fiber *f);

/* Body shared by both entry trampolines; never returns. */
static void fiber_main(kb_sim *sim, kb_fiber *f)
{
    f->fn(sim, f->arg);
    f->state = KB_F_DEAD;
    ASAN_TO_SCHED_(sim, NULL); /* NULL: this stack is abandoned */
    TSAN_TO_SCHED_(sim);
#if KBCL_FIBER_UCONTEXT
    setcontext(&sim->sched_uc);
#elif KBCL_FIBER_ASM
    uctx_switch(&f->uc, &sim->sched_uc, NULL);
#else
    jump_fcontext(sim->sched_ctx, NULL);
#endif
    assert(!"a finished fiber was resumed");
}

#if KBCL_FIBER_UCONTEXT
/* makecontext passes int arguments only: the fiber pointer travels as two halves. */
static void fiber_entry_uc(unsigned int hi, unsigned int lo)
{
    kb_fiber *f = (kb_fiber *)(uintptr_t)(((uint64_t)hi << 32) | lo);
    ASAN_BACK_IN_FIBER_(f->sim, NULL);
    fiber_main(f->sim, f);
}
#elif KBCL_FIBER_ASM
/* kb_fiber_start calls this with the fiber the first switch into it passed. */
static void fiber_entry_asm(kb_fiber *f)
{
    fiber_main(f->sim, f);
}
#else
static void fiber_entry_fc(kb_transfer_ t)
{
    kb_fiber *f = t.data;
    f->sim->sched_ctx = t.fctx;
    ASAN_BACK_IN_FIBER_(f->sim, NULL);
    fiber_main(f->sim, f);
}
#endif

/* Prepares f's context to start fiber_main on its (possibly recycled) stack. */
static int fiber_make_context(kb_sim *sim, kb_fiber *f)
{
    unsigned char *lo = f->stack;
#ifdef KB_TSAN_
    if (!(f->tsan = __tsan_create_fiber(0)))
        return KB_ERR_NOMEM;
#endif
#if KBCL_FIBER_UCONTEXT
    uint64_t p = (uint64_t)(uintptr_t)f;
    if (getcontext(&f->uc) != 0) {
#ifdef KB_TSAN_
        __tsan_destroy_fiber(f->tsan);
        f->tsan = NULL;
#endif
        return KB_ERR_NOMEM;
    }
    f->uc.uc_stack.ss_sp = lo;
    f->uc.uc_stack.ss_size = sim->stack_bytes;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, (void (*)(void))fiber_entry_uc, 2, (unsigned int)(p >> 32),
                (unsigned int)(p & 0xffffffffu));
#elif KBCL_FIBER_ASM
    /* kb_fiber_start finds the entry function at the (16-byte aligned) stack pointer */
    unsigned char *sp = (unsigned char *)(((uintptr_t)(lo + sim->stack_bytes) & ~(uintptr_t)15) - 16);
    void (*entry)(kb_fiber *) = fiber_entry_asm;
    memcpy(sp, &entry, sizeof entry);
    f->uc.sp = sp;
    f->uc.bp = NULL;
    f->uc.pc = (void *)(uintptr_t)kb_fiber_start;
#else
    f->ctx = make_fcontext(lo + sim->stack_bytes, sim->stack_bytes, fiber_entry_fc);
#endif
    return 0;
}

/* Runs f until it blocks, sleeps or finishes (scheduler side). */
static inline __attribute__((always_inline)) void fiber_resume(kb_sim *sim, kb_fiber *f)
{
#ifdef KB_ASAN_
    void *fake = NULL;
#endif

    f->state = KB_F_RUNNING;
    sim->current = f;
    sim->nswitches++;
    ASAN_TO_FIBER_(sim, f, fake);
    TSAN_TO_FIBER_(sim, f);
#if KBCL_FIBER_UCONTEXT
    swapcontext(&sim->sched_uc, &f->uc);
#elif KBCL_FIBER_ASM
    uctx_switch(&sim->sched_uc, &f->uc, f);
#else
    f->ctx = jump_fcontext(f->ctx, f).fctx;
#endif
    ASAN_BACK_IN_SCHED_(fake);
    sim->current = NULL;
    if (f->state == KB_F_DEAD)
        fiber_recycle(sim, f);
}

/* The resume event (kb_sim_run resumes in line; this is its address and the general path). */
static void fiber_resume_ev(kb_sim *sim, void *a, void *b)
{
    (void)b;
    fiber_resume(sim, a);
}

/* Fiber side: hands control back to the scheduler; returns when resumed. */
static inline __attribute__((always_inline)) void fiber_yield(kb_sim *sim, kb_fiber *f)
{
#ifdef KB_ASAN_
    ASAN_TO_SCHED_(sim, &f->fake_stack);
#endif
    TSAN_TO_SCHED_(sim);
#if KBCL_FIBER_UCONTEXT
    swapcontext(&f->uc, &sim->sched_uc);
#elif KBCL_FIBER_ASM
    uctx_switch(&f->uc, &sim->sched_uc, NULL);
#else
    (void)f;
    sim->sched_ctx = jump_fcontext(sim->sched_ctx, NULL).fctx;
#endif
#ifdef KB_ASAN_
    ASAN_BACK_IN_FIBER_(sim, f->fake_stack);
#endif
}

/* ---------------------------------------------------------------- fibers */

static void live_unlink(kb_sim *sim, kb_fiber *f)
{
    if (f->prev)
        f->prev->next = f->next;
    else
        sim->live_head = f->next;
    if (f->next)
        f->next->prev = f->prev;
    else
        sim->live_tail = f->prev;
    f->prev = f->next = NULL;
}

static void fiber_recycle(kb_sim *sim, kb_fiber *f)
{
    live_unlink(sim, f);
    sim->nlive--;
#ifdef KB_ASAN_
    ASAN_UNPOISON_MEMORY_REGION(f->stack, sim->stack_bytes);
#endif
#ifdef KB_TSAN_
    __tsan_destroy_fiber(f->tsan); /* from the scheduler's side: not the running fiber */
    f->tsan = NULL;
#endif
    f->next = sim->free_list;
    sim->free_list = f;
}

static kb_fiber *fiber_alloc(kb_sim *sim)
{
    kb_fiber *f = sim->free_list;

    if (f) {
        sim->free_list = f->next;
        return f;
    }
    f = aligned_alloc(_Alignof(kb_fiber), (sizeof *f + _Alignof(kb_fiber) - 1) /
                                             _Alignof(kb_fiber) * _Alignof(kb_fiber));
#ifdef KB_TSAN_
    if (f)
        f->tsan = NULL;
#endif
    if (f && kb_sim_stack_alloc(sim, f) != 0) {
        free(f);
        f = NULL;
    }
    return f;
}

kb_fiber *kb_fiber_spawn(kb_sim *sim, kb_fiber_fn fn, void *arg, const char *name)
{
    kb_fiber *f;
    size_t len;

    if (!fn || reserve(sim, 2) != 0)
        return NULL;
    f = fiber_alloc(sim);
    if (!f)
        return NULL;
    f->sim = sim;
    f->fn = fn;
    f->arg = arg;
    memset(f->hot, 0, sizeof f->hot);
    f->hot_vec = NULL;
    f->udata = NULL;
    f->state = KB_F_READY;
    f->u.b.what = NULL;
    f->u.b.obj = NULL;
    f->wait_next = NULL;
#ifdef KB_ASAN_
    f->fake_stack = NULL;
#endif
    if (!name)
        name = "";
    len = strnlen(name, KB_NAME_MAX_);
    memcpy(f->name, name, len);
    f->name[len] = '\0';
    if (fiber_make_context(sim, f) != 0) {
        f->next = sim->free_list;
        sim->free_list = f;
        return NULL;
    }
    f->next = NULL;
    f->prev = sim->live_tail;
    if (sim->live_tail)
        sim->live_tail->next = f;
    else
        sim->live_head = f;
    sim->live_tail = f;
    sim->nlive++;
    fifo_push(sim, fiber_resume_ev, f, NULL);
    return f;
}

kb_fiber *kb_fiber_current(kb_sim *sim) { return sim->current; }
const char *kb_fiber_name(const kb_fiber *f) { return f ? f->name : ""; }
int kb_fiber_set_hot_vec(kb_fiber *f, const void *const *vec)
{
    for (int i = 0; vec && i < KB_FIBER_HOT_VEC; i++)
        if (!vec[i])
            return KB_ERR_INVAL;
    f->hot_vec = vec;
    return 0;
}

int kb_fiber_set_hot(kb_fiber *f, const void *const *lines, int n)
{
    if (n < 0 || n > KB_FIBER_HOT || (n > 0 && !lines))
        return KB_ERR_INVAL;
    for (int i = 0; i < KB_FIBER_HOT; i++)
        f->hot[i] = i < n ? lines[i] : NULL;
    return 0;
}

void kb_fiber_set_udata(kb_fiber *f, void *udata) { f->udata = udata; }
void *kb_fiber_udata(const kb_fiber *f) { return f->udata; }
kb_fiber **kb_fiber_link(kb_fiber *f) { return &f->wait_next; }

/* Negative dt counts as 0. Called outside a fiber it does nothing (asserts in debug builds). */
void kb_fiber_sleep(kb_sim *sim, kb_time dt)
{
    kb_fiber *f = sim->current;

    assert(f && "kb_fiber_sleep outside a fiber");
    if (!f)
        return;
    f->state = KB_F_READY;
    push(sim, dt > 0 ? time_add_sat(sim->now, dt) : sim->now, fiber_resume_ev, f, NULL);
    fiber_yield(sim, f);
}

/* kb_fiber_sleep_then's event, first half: the callback. Returns whether the resume (the
 * second half, a counted event of its own) follows. */
static inline __attribute__((always_inline)) int fiber_then(kb_sim *sim, kb_fiber *f,
                                                            uint64_t seq)
{
    f->then_fn(sim, f->u.then.a, f->u.then.b);
    if (sim->stop) {
        /* The loop would have stopped before popping the resume: leave it first in line. */
        kb_event ev = { sim->now, seq, fiber_resume_ev, f, NULL };
        near_push_front(sim, &ev);
        return 0;
    }
    sim->nevents++;
    return 1;
}

/* (kb_sim_run runs it in line; this is its address.) */
static void fiber_then_ev(kb_sim *sim, void *a, void *b)
{
    if (fiber_then(sim, a, (uint64_t)(uintptr_t)b))
        fiber_resume(sim, a);
}

int kb_fiber_sleep_then(kb_sim *sim, kb_time t, kb_event_fn fn, void *a, void *b)
{
    kb_fiber *f = sim->current;

    assert(f && "kb_fiber_sleep_then outside a fiber");
    if (!f || !fn || t <= sim->now)
        return KB_ERR_INVAL;
    f->then_fn = fn;
    f->u.then.a = a;
    f->u.then.b = b;
    f->state = KB_F_READY;
    /* the callback's seq, then the resume's (kept for a stop between the two) */
    heap_push(sim, t, fiber_then_ev, f, (void *)(uintptr_t)(sim->seq + 1));
    sim->seq++;
    fiber_yield(sim, f);
    return 0;
}

void kb_fiber_block(kb_sim *sim, const char *what, const void *obj)
{
    kb_fiber *f = sim->current;

    assert(f && "kb_fiber_block outside a fiber");
    if (!f)
        return;
    f->state = KB_F_BLOCKED;
    f->u.b.what = what;
    f->u.b.obj = obj;
    sim->nblocked++;
    fiber_yield(sim, f);
    f->u.b.what = NULL;
    f->u.b.obj = NULL;
}

/* Waking a fiber that is not blocked (running, sleeping, already woken) does nothing. */
void kb_fiber_wake_at(kb_sim *sim, kb_fiber *f, kb_time t)
{
    if (!f || f->state != KB_F_BLOCKED)
        return;
    f->state = KB_F_READY;
    sim->nblocked--;
    push(sim, t > sim->now ? t : sim->now, fiber_resume_ev, f, NULL);
}

void kb_fiber_wake(kb_sim *sim, kb_fiber *f)
{
    if (!f || f->state != KB_F_BLOCKED)
        return;
    f->state = KB_F_READY;
    sim->nblocked--;
    fifo_push(sim, fiber_resume_ev, f, NULL);
}

void kb_sim_foreach_blocked(const kb_sim *sim, kb_blocked_fn fn, void *ud)
{
    for (const kb_fiber *f = sim->live_head; f; f = f->next)
        if (f->state == KB_F_BLOCKED)
            fn(f, f->u.b.what, f->u.b.obj, ud);
}
