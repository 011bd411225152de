/*
 * kb_runtime_int — internals shared by the runtime's files (kb_runtime.c: the context, backend
 * and op log; kb_runtime_host.c: host fibers; kb_runtime_tensor.c: tensors; kb_runtime_launch.c:
 * launches) and the tl files that reach into a kernel's context (kb_tl.c, kb_tl_nn.c) only.
 * Private to the kb_host target (host/private/ is not on any other target's include path):
 * the layers above use the extension interface kb_runtime_ext.h instead. The structs here may
 * change at any time.
 */
#ifndef KB_RUNTIME_INT_H
#define KB_RUNTIME_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "kb_memstore.h"
#include "kb_runtime.h"
#include "kb_sync.h"
#include "kb_runtime_ext.h"
#include "kb_tl.h"

struct kb_tensor {
    kb_ctx *ctx;
    char name[64];
    int64_t rows, cols;
    kb_dtype dtype;
    kb_dp_policy dp;
    kb_mem_kind mem;
    unsigned gsip;
    kb_va va;
    uint64_t va_bytes;
    kb_shard_spec *shards;  /* owned */
    kb_pa *pas;             /* owned, per shard */
    size_t nshards;
    int grid_pes, grid_cubes;
};

typedef struct kb_launch_st kb_launch_st;

enum { KB_TAG_HOST = 0x484f5354, KB_TAG_KERNEL = 0x4b45524e };

/* kb_sim_run's result when the run paused for an op-log cut (errors are negative) */
#define KB_CTX_CUT_ 1

#define KB_SCR_NCLASS 7              /* 64 B, 128 B, ... 4 KiB */
#define KB_SCR_MAX (64u << (KB_SCR_NCLASS - 1))
#define KB_SCR_INL_CLASSES 2         /* the 64 B and 128 B classes ... */
#define KB_SCR_INL 3                 /* ... keep the top 3 entries of their free stacks inline */
#define KB_SCR_CHUNK (64u << 10)
#define KB_BIG_CACHE 4               /* freed large values kept for reuse per kernel */
typedef struct kb_scr_chunk {
    kb_pa base;
    uint64_t live[KB_SCR_CHUNK / 64 / 64]; /* one bit per 64-byte unit: a value starts there */
} kb_scr_chunk;

/* Fiber udata of host and kernel fibers both start with a tag saying which it is. */
/*
 * A kernel's context. What every operation touches comes first, in two cache lines (with
 * hundreds of kernels taking turns, each line is a cache miss per turn): line 1 holds the
 * context, PE, issue cost, the scratch chunks and the free counts; line 2 the tops of the
 * small classes' free stacks. A class's free stack is freel[c][0 .. nfree[c]) with, for the
 * first KB_SCR_INL_CLASSES classes, inl[c][0 .. ninl[c]) on top of it.
 */
struct kb_tl {
    _Alignas(64) kb_ctx *ctx;
    kb_pe_hw *pe;
    kb_sim *sim;            /* the simulation its fiber runs in (tl_sim) */
    kb_time cpu_ovh;
    /* small scratch values (<= KB_SCR_MAX bytes): size classes carved from 64 KiB chunks */
    struct kb_scr_chunk *chunks;  /* owned */
    uint32_t nchunks;
    uint32_t nfree[KB_SCR_NCLASS];
    kb_pa inl[KB_SCR_INL_CLASSES][KB_SCR_INL];
    uint8_t ninl[KB_SCR_INL_CLASSES];
    /* values tl_free_after holds (`later` below): every scratch allocation reads the count,
     * so it sits on the allocator's line */
    uint32_t nlater;
    kb_pa *freel[KB_SCR_NCLASS];  /* per-class stacks of free values (owned) */
    kb_pa bump, bump_end;
    /* values carved per class so far, and the free stacks' capacities, kept >= that count
     * when carving so that tl_free never grows a stack (or reads this line) */
    uint32_t ncarved[KB_SCR_NCLASS], capfree[KB_SCR_NCLASS];
    size_t capchunks;
    int tag;
    int stages;             /* SchedulerV2 tile loads in flight (kb_tl_set_stages; 0: 2) */
    kb_launch_st *launch;
    int pid[3], np[3];
    kb_time start;          /* when the launch message reaches the PE */
    kb_time posted;         /* when its posted stores (tl_store_async) have all landed: its
                             * end waits for it */
    kb_pa *vals;            /* live large scratch allocations (owned) */
    size_t nvals, capvals;
    /* large values freed lately, still allocated: a streaming kernel frees and allocates
     * the same few sizes every step (given back when an allocation fails, and at the end) */
    struct { kb_pa pa; uint64_t bytes; } bigc[KB_BIG_CACHE];
    int nbigc;
    /* kb_tl_translate's last segment: a kernel walks the same few tiles over and over, and
     * two searches (segments, tensors) per access cost more than the access's bookkeeping.
     * Valid while the SIP's MMU generation is tlb_gen (0: empty). One line: an access that
     * hits reads all five. */
    _Alignas(64) uint64_t tlb_gen;
    kb_va tlb_va, tlb_end;
    kb_pa tlb_pa;
    struct kb_tensor *tlb_t;  /* borrowed: the tensor holding the segment, or NULL */
    /* values tl_free_after holds until a time (a posted send still reading them); given back
     * by the first scratch allocation at or after it (owned array) */
    struct kb_tl_later *later;
    size_t caplater;
    /* the threads this kernel or thread forked (tl_fork), owned, freed with the launch: per
     * parent, so that a kernel's end checks its own (not every thread of the launch), and so
     * that kernels of different SIPs never share the list */
    struct kb_tl_thread *children;
    /* tl_notify / tl_wait_notify (a launch's kernels only, not its threads): notifications
     * landed on this PE and not yet taken, per slot (tl_barrier's two slots after the
     * public ones), and which slot and count the kernel's fiber waits for (sem_wait NULL:
     * none). A notification that lands once the kernel has returned (ended) fails the run. */
    int32_t sem[KB_TL_NOTIFY_SLOTS + 2];
    kb_fiber *sem_wait;
    int sem_slot;
    int32_t sem_need;
    kb_time notified;       /* when its notifications have all landed (its end waits) */
    int thread;             /* a thread tl_fork made, not the launch's kernel */
    int ended;
};

_Static_assert(offsetof(struct kb_tl, nlater) / 64 == offsetof(struct kb_tl, ninl) / 64,
               "a scratch allocation reads the held count on the inline stacks' line");
_Static_assert(offsetof(struct kb_tl, tlb_t) / 64 == offsetof(struct kb_tl, tlb_gen) / 64,
               "a translation that hits reads one line");

/* At a kernel's return: waits for its notifications to land, and fails it when one sent to
 * it was not taken; a later one fails the run when it lands (tl_notify). */
void kb_tl_notify_end(kb_tl *tl);

/* Frees what a kernel context owns (after kb_tl_release_all returned its memory). */
void kb_tl_fini(kb_tl *tl);

struct kb_launch_st {
    kb_ctx *ctx;
    kb_launch_st *next, *prev; /* ctx's live launches */
    char name[128];
    kb_kernel_fn kernel;
    kb_kargs *args;         /* [grid.sips], owned */
    kb_stage *stages;       /* kb_launch_seq: its kernels [nstages], owned; NULL otherwise */
    int nstages;
    kb_stage_stats *stage_st; /* [sips * nstages]: each stage on each SIP (its partition
                               * writes its own), owned */
    kb_grid grid;
    kb_tl *tls;             /* [ntl] */
    int ntl;
    int *cube_left;         /* per (sip, cube) of the grid */
    kb_time *cube_tmax;
    int *sip_left;
    kb_time *sip_tmax;      /* per SIP: its IO_CPU's aggregation, then its completion's arrival */
    int sips_left;
    int queued;             /* the host program's device queue was on (kb_launch_queue) */
    kb_signal done;
    uint64_t *sip_kernels;  /* per SIP: its kernels that ended (added to ctx->kernels) */
    kb_time *sip_kend;      /* per SIP: when its last kernel ended (its own partition writes it) */
    kb_time kfirst;         /* the earliest kernel start of the launch */
    /* A launch forked over the SIPs (docs/parallel.md): its partitions, one per SIP of the
     * machine (owned; NULL: the launch runs in the context's simulation), and each
     * partition's first failure ([nsips], owned). */
    struct kb_psim *ps;
    struct kb_fork_err *perr;
    /* a recording forked launch: each partition's records of the current window ([nsips],
     * owned), gathered into the op log after it in (time, partition, order) (fork_window) */
    struct kb_fork_recs *recs;
    struct kb_fork_key *keys; /* the gathering's merge heap, a head per partition (owned) */
    size_t capkeys;
    kb_errbuf gather_eb;      /* why gathering failed (the run's message then) */
    /* a deadlocked launch over several processes: each other process's SIP's blocked fibers
     * as report lines, their count and its clock ([nsips], owned; NULL until fork_sync) */
    char **dl_lines;
    int *dl_count;
    kb_time *dl_now;
};

/* A partition's records of the current window, with the time each was made at. */
typedef struct kb_fork_recs {
    kb_rec *v;
    kb_time *t;
    size_t n, cap;
} kb_fork_recs;

typedef struct kb_fork_key {
    kb_time t;
    uint32_t part;
    uint32_t i;
} kb_fork_key;

/* A partition's first failure in a forked launch (kb_ctx_fail_in). */
typedef struct kb_fork_err {
    int code;
    kb_errbuf eb;
} kb_fork_err;

typedef struct kb_hostproc {
    int tag;
    kb_ctx *ctx;
    kb_host_fn fn;
    void *arg;
    int device;
    int rank;               /* spawn rank, -1 for the main host program */
    int rc;
    int finished;
    struct kb_spawn_st *group; /* the spawn this worker belongs to, or NULL */
    /* kb_launch_queue: 0 off; 1 on, no launch yet (the next pays the host's path down);
     * 2 on, the commands are in the IO_CPUs' queues */
    int queue;
    /* its last launch's kernels: the first one's start and the last one's end (ps), for
     * kb_launch_span; spanned once it has launched */
    kb_time span[2];
    int spanned;
    /* kb_launch_stage_stats: each stage of its last launch */
    kb_stage_stats stage[16];
    int nstages;
} kb_hostproc;

struct kb_ctx {
    kb_config cfg;
    kb_sim *sim;
    kb_machine *m;
    kb_oplog *log;
    kb_memstore *ms;
    kb_backend be;
    int be_borrowed;          /* be came from kb_ctx_opts.backend: not destroyed here */
    /* An OpenCL backend is set up on be_thread while the simulation runs: until it is joined
     * (be_pending == 0), be, device_desc and device_note belong to that thread. */
    pthread_t be_thread;
    int be_pending, be_rc;
    atomic_int be_ready;      /* set by the set-up thread as it ends: joining will not wait */
    kb_errbuf be_eb;
    double be_wait_ms;        /* time spent waiting for it */
    kb_device_kind device;
    int recording;
    uint64_t tensor_bytes;    /* of every tensor allocated so far (device_fit) */
    char device_desc[160];
    char device_note[256];
    kb_replay_stats rstats;
    struct kb_progress *progress; /* kb_ctx_opts.progress (NULL: nobody watches) */
    size_t cut_every;       /* records between cuts (kb_ctx_opts.cut_records resolved) */
    size_t since_cut;       /* records appended since the last cut */
    int cut_asked;          /* the simulation was asked to pause for a cut */
    kb_errbuf err;
    int failed;             /* first error code that stopped the run */
    kb_tensor **tensors;    /* sorted by (gsip, va) */
    size_t ntensors, captensors;
    kb_launch_st *launches;
    struct kb_spawn_st *spawns;  /* live spawns (freed here if a failure strands them) */
    kb_dump_fn dump;
    void *dump_ud;
    uint64_t kernels;
    /* Phase-1 threads (kb_ctx_opts.threads) and the forked launches' totals: the launch
     * running forked now (set and cleared by the context's simulation around kb_psim_run,
     * read by the partitions' threads in between), its partitions' events, fiber switches
     * and windows, and how many launches ran forked */
    int threads;
    const struct kb_psim_net *net; /* kb_ctx_opts.net (not owned) */
    kb_ext_dist ext_dist[KB_EXT_NSLOTS]; /* kb_ctx_set_ext_dist */
    kb_launch_st *fork;
    uint64_t fork_events, fork_switches, fork_windows, forked;
    FILE *trace;
    struct kb_trace *trace_rec;
    char *report;           /* full deadlock report (owned), NULL if none */
    void *ext[KB_EXT_NSLOTS];
    void (*ext_destroy[KB_EXT_NSLOTS])(void *);
};

/* The host process of the running fiber, or NULL (kernel fiber / outside the run). */
kb_hostproc *kb_ctx_hostproc(kb_ctx *ctx);

/* kb_runtime.c. At a pause for a cut: marks it, and hands a pipelined backend every record so
 * far. 0, or an error set in ctx's errbuf. */
int kb_ctx_cut(kb_ctx *ctx);

/* kb_runtime.c. Appends a record a forked launch's partition made (gathered after a window,
 * every partition still) and makes a cut when one is due: 0, or an error set in ctx's errbuf. */
int kb_ctx_log_gathered(kb_ctx *ctx, kb_rec *r);

/* kb_runtime_launch.c. Keeps a record made in a partition of forked launch l (the partition of
 * the record's PE, whose thread runs) until the window's end: 0 or KB_ERR_NOMEM. */
int kb_fork_record(kb_launch_st *l, const kb_rec *r);

/* kb_runtime_host.c. Keeps the deadlock report of the fibers blocked in sims[0 .. nsims) (in
 * that order) at simulated time t in ctx->report, and its summary in ctx's errbuf. */
void kb_ctx_deadlock_report(kb_ctx *ctx, kb_sim *const *sims, int nsims, kb_time t);
/* kb_runtime_host.c. The blocked fibers of sim as the report's lines (malloc'd; NULL when out
 * of memory) and their count; and the report made of such lines, n of them in order. */
char *kb_ctx_blocked_lines(const kb_ctx *ctx, kb_sim *sim, int *count);
void kb_ctx_deadlock_report_lines(kb_ctx *ctx, char *const *lines, const int *counts, int n,
                                  kb_time t);

/* kb_runtime_host.c. Unhooks sp from ctx's live spawns and frees it. */
void kb_ctx_spawn_free(kb_ctx *ctx, struct kb_spawn_st *sp);

/* kb_runtime_tensor.c. Frees a tensor's shard memory and VA; the struct itself stays (the
 * caller frees it). */
void kb_tensor_fini(kb_tensor *t);

/* kb_runtime_launch.c. Unhooks l from its context's live launches and frees it with the
 * threads its kernels forked (tl_fork): at the launch's end, and for a failed run's leftovers
 * in kb_ctx_destroy. */
void kb_launch_free(kb_launch_st *l);

#endif
