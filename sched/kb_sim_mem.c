/*
 * kb_sim_mem — the event engine's memory (kb_sim.c is the engine; what both files share is in
 * kb_sim_int.h): an engine's creation and destruction, the growth of its event stores (by
 * doubling, all to one capacity: kb_sim.c keeps it >= pending callback events + live fibers,
 * so that only kb_sim_at/after and kb_fiber_spawn ever allocate), and fiber stacks. Stacks are
 * carved from chunks of KB_CHUNK_STACKS_ (one MAP_NORESERVE mapping each, committed page by page
 * as used, no transparent huge pages), each with a guard page at its low end. Where the kernel
 * has guard regions (MADV_GUARD_INSTALL, Linux 6.13) a guard costs one cheap madvise and no VMA,
 * so every stack gets one; elsewhere a guard is an mprotect that splits the chunk's VMA
 * (vm.max_map_count is 65 530 by default), so only a sim's first KB_GUARDED_STACKS_ stacks get
 * one, which still lets hundreds of thousands of fibers coexist. A fresh mapping plus mprotect
 * per stack was most of a launch's cost per kernel (figures in docs/performance.md). A finished
 * fiber's stack is reused by a later spawn (kb_sim.c's free list); stacks are returned to the
 * OS only by kb_sim_destroy. Limits: single-threaded; kb_sim_destroy must not be called from
 * inside a run.
 */
#include "kb_sim_int.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kb_err.h"

/* Grows every store so that cap >= need. Keeps cap unchanged on failure. */
int kb_sim_grow(kb_sim *sim, size_t need)
{
    size_t ncap = sim->cap;
    kb_event *nheap, *nfar;
    kb_now_event *nfifo;
    kb_wnode *nnodes;

    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / sizeof(kb_wnode) || ncap >= KB_NIL_ / 2)
            return KB_ERR_NOMEM;
        ncap *= 2;
    }
    nheap = realloc(sim->heap, ncap * sizeof *nheap);
    if (!nheap)
        return KB_ERR_NOMEM;
    sim->heap = nheap;
    nfar = realloc(sim->far, ncap * sizeof *nfar);
    if (!nfar)
        return KB_ERR_NOMEM;
    sim->far = nfar;
    nnodes = realloc(sim->nodes, ncap * sizeof *nnodes);
    if (!nnodes)
        return KB_ERR_NOMEM;
    sim->nodes = nnodes;
    nfifo = malloc(ncap * sizeof *nfifo);
    if (!nfifo)
        return KB_ERR_NOMEM;
    /* Unwrap the ring so that it starts at index 0 in the new array. */
    for (size_t i = 0; i < sim->fn; i++)
        nfifo[i] = sim->fifo[(sim->fhead + i) & (sim->cap - 1)];
    free(sim->fifo);
    sim->fifo = nfifo;
    sim->fhead = 0;
    /* The new nodes join the free list. */
    for (size_t i = ncap; i-- > sim->cap;) {
        nnodes[i].next = sim->free_node;
        sim->free_node = (uint32_t)i;
    }
    sim->cap = ncap;
    return 0;
}

/* ---------------------------------------------------------------- fiber stacks */

static void *map_anon(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Makes the page at p a guard page: a guard region if the kernel has them, else (within the
 * VMA budget) PROT_NONE. Returns 0 also when the budget leaves the stack unguarded. */
static int guard_page(kb_sim *sim, unsigned char *p)
{
    if (sim->guard_regions >= 0) {
        if (madvise(p, sim->page, MADV_GUARD_INSTALL) == 0) {
            sim->guard_regions = 1;
            return 0;
        }
        if (sim->guard_regions == 1)
            return KB_ERR_NOMEM; /* it worked before: out of page-table memory */
        sim->guard_regions = -1;
    }
    if (sim->nstacks >= KB_GUARDED_STACKS_)
        return 0;
    return mprotect(p, sim->page, PROT_NONE) == 0 ? 0 : KB_ERR_NOMEM;
}

/* Gives f a stack: the next slot (guard page + stack) of the head chunk. */
int kb_sim_stack_alloc(kb_sim *sim, kb_fiber *f)
{
    size_t slot = sim->page + sim->stack_bytes;
    unsigned char *p;

    if (sim->chunk_left == 0) {
        kb_stack_chunk *ch = malloc(sizeof *ch);
        if (!ch)
            return KB_ERR_NOMEM;
        ch->base = map_anon(KB_CHUNK_STACKS_ * slot);
        if (!ch->base) {
            free(ch);
            return KB_ERR_NOMEM;
        }
#ifdef MADV_NOHUGEPAGE
        /* a huge page would commit 2 MiB (eight stacks' worth) for one stack's top frames */
        (void)madvise(ch->base, KB_CHUNK_STACKS_ * slot, MADV_NOHUGEPAGE);
#endif
        ch->next = sim->chunks;
        sim->chunks = ch;
        sim->chunk_left = KB_CHUNK_STACKS_;
    }
    p = sim->chunks->base + (KB_CHUNK_STACKS_ - sim->chunk_left) * slot;
    if (guard_page(sim, p) != 0)
        return KB_ERR_NOMEM;
    sim->chunk_left--;
    f->stack = p + sim->page;
    sim->nstacks++;
    return 0;
}

/* ---------------------------------------------------------------- engine */

kb_sim *kb_sim_create(const kb_sim_opts *opts)
{
    kb_sim *sim = calloc(1, sizeof *sim);
    long page = sysconf(_SC_PAGESIZE);
    size_t stack = opts && opts->fiber_stack_bytes ? opts->fiber_stack_bytes : KB_DEFAULT_STACK_;
    unsigned shift = opts && opts->slot_shift ? opts->slot_shift : KB_SIM_SLOT_SHIFT_DEFAULT;

    if (!sim || shift < KB_SIM_SLOT_SHIFT_MIN || shift > KB_SIM_SLOT_SHIFT_MAX)
        goto fail;
    sim->shift = shift;
    sim->pf_slots = opts && opts->prefetch_slots;
    sim->page = page > 0 ? (size_t)page : 4096u;
    if (stack < KB_MIN_STACK_)
        stack = KB_MIN_STACK_;
    if (stack > SIZE_MAX / 4 / KB_CHUNK_STACKS_)
        goto fail;
    sim->stack_bytes = (stack + sim->page - 1) / sim->page * sim->page;
    sim->cap = KB_INITIAL_CAP_;
    sim->publish_at = UINT64_MAX;
    sim->heap = malloc(sim->cap * sizeof *sim->heap);
    sim->far = malloc(sim->cap * sizeof *sim->far);
    sim->fifo = malloc(sim->cap * sizeof *sim->fifo);
    sim->nodes = malloc(sim->cap * sizeof *sim->nodes);
    if (!sim->heap || !sim->far || !sim->fifo || !sim->nodes)
        goto fail;
    sim->free_node = KB_NIL_;
    for (size_t i = sim->cap; i-- > 0;) {
        sim->nodes[i].next = sim->free_node;
        sim->free_node = (uint32_t)i;
    }
    for (size_t i = 0; i < KB_WHEEL_N_; i++)
        sim->bucket[i] = KB_NIL_;
    return sim;
fail:
    kb_sim_destroy(sim);
    return NULL;
}

static void fiber_free(kb_sim *sim, kb_fiber *f)
{
#ifdef KB_ASAN_
    /* Frames of a fiber that never returned leave poisoned shadow behind. */
    ASAN_UNPOISON_MEMORY_REGION(f->stack, sim->stack_bytes);
#else
    (void)sim;
#endif
#ifdef KB_TSAN_
    if (f->tsan) /* a live fiber's (a recycled one's was destroyed then) */
        __tsan_destroy_fiber(f->tsan);
#endif
    free(f);
}

void kb_sim_destroy(kb_sim *sim)
{
    kb_fiber *f, *next;
    kb_stack_chunk *ch, *ch_next;

    if (!sim)
        return;
    for (f = sim->live_head; f; f = next) {
        next = f->next;
        fiber_free(sim, f);
    }
    for (f = sim->free_list; f; f = next) {
        next = f->next;
        fiber_free(sim, f);
    }
    for (ch = sim->chunks; ch; ch = ch_next) {
        ch_next = ch->next;
        munmap(ch->base, KB_CHUNK_STACKS_ * (sim->page + sim->stack_bytes));
        free(ch);
    }
    free(sim->heap);
    free(sim->far);
    free(sim->nodes);
    free(sim->fifo);
    free(sim);
}
