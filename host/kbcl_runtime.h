/*
 * kbcl_runtime — kbcl's public host runtime (docs/api.md): what a plugin's bench and a
 * program embedding kbcl see of a simulation context, its tensors placed by DPPolicy, kernel
 * launches, and the roofline a bench reports.
 *
 * A kb_ctx is one simulated machine with its engine, op log and Phase-2 backend; kbcl makes
 * it and hands it to a bench's run and verify functions. Host code runs as fibers: a launch, a
 * tensor write or a read blocks the calling host fiber in simulated time, exactly like a
 * worker waiting on a device. Each host fiber has a current device (the SIP its tensors and
 * launches go to; kb_ctx_set_device, SIP 0 by default).
 *
 * Errors: every function returns 0 or a KB_ERR_* code and leaves a message in
 * kb_ctx_errmsg(ctx). An error inside a kernel (bad address, memory exhausted ...) stops the
 * simulation, and the launch's caller gets that error with the kernel and PE in the message.
 * Data and timing: in a timing-only run (kbcl --device none) host writes never look at their
 * values (kb_fill) and tensor reads fail with KB_ERR_UNSUPPORTED; the simulated time is the
 * same with and without data.
 *
 * Ownership: tensors belong to the context (kb_tensor_free releases one early; the context
 * frees the rest). Limits: tensors are 1-D or 2-D (higher ranks are viewed as 2-D: rows =
 * product of the leading dimensions); KB_KARGS_MAX arguments of each kind per launch.
 */
#ifndef KBCL_RUNTIME_H
#define KBCL_RUNTIME_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kbcl_base.h"
#include "kbcl_dtype.h"

/* A virtual address in a SIP's address space (what a tensor's shards are mapped at) and a
 * physical one (a place in one memory of the machine). */
typedef uint64_t kb_va;
typedef uint64_t kb_pa;

typedef struct kb_ctx kb_ctx;       /* a simulation context (opaque) */
typedef struct kb_tensor kb_tensor; /* a tensor of a context (opaque) */
typedef struct kb_tl kb_tl;         /* a running kernel's handle (opaque; kbcl_tl.h) */

/* ---- configuration and contexts ---- */

/*
 * A machine configuration (opaque; the keys and their defaults: docs/config.md). Created
 * holding the built-in default machine; kb_config_load_topology reads a topology file over it
 * (keys the file does not name keep their values) and kb_config_set applies one "a.b.c=value"
 * assignment, as kbcl's --set does. Errors: KB_ERR_CONFIG with file:line or the key in eb.
 * Owner: the caller; kb_config_destroy(NULL) is a no-op. A context copies it.
 */
typedef struct kb_config kb_config;
KB_API int kb_config_create(kb_config **out, kb_errbuf *eb);
KB_API void kb_config_destroy(kb_config *cfg);
KB_API int kb_config_load_topology(kb_config *cfg, const char *path, kb_errbuf *eb);
KB_API int kb_config_set(kb_config *cfg, const char *assignment, kb_errbuf *eb);

/* Where Phase 2 computes the data (docs/phase2.md): auto (an OpenCL GPU, else an OpenCL CPU,
 * else ref), an OpenCL GPU or CPU device, ref (plain C, the oracle), or none (timing only). */
typedef enum kb_device_kind {
    KB_DEV_AUTO = 0, KB_DEV_GPU, KB_DEV_CPU, KB_DEV_REF, KB_DEV_NONE
} kb_device_kind;
KB_API const char *kb_device_name(kb_device_kind d);
KB_API int kb_device_from_name(const char *name); /* -1 when unknown */

/* How a context runs: the device, and what kbcl's own commands attach (all may be zero). */
struct kb_trace;
struct kb_backend;
struct kb_progress;
struct kb_psim_net;
typedef struct kb_ctx_opts {
    kb_device_kind device;
    FILE *trace;      /* IPCQ trace lines (KBCL_CCL_TRACE); NULL = off; not owned */
    struct kb_trace *trace_rec; /* timeline recorder (kbcl run --trace); NULL = off; not owned */
    /* A Phase-2 backend to use instead of making one for `device` (a sweep worker's, kept
     * across points, so its device set-up is paid once); NULL = make one. Not owned: the
     * context forgets it when destroyed. backend_desc names it (may be NULL). */
    const struct kb_backend *backend;
    const char *backend_desc;
    /* Records between op-log cuts (kb_oplog.h); 0 = KB_CTX_CUT_RECORDS, SIZE_MAX = no cuts.
     * Once that many records are appended, the simulation pauses after its current step, a
     * cut is marked, and a pipelined backend (kb_backend_ops.sync: a device server's) is
     * handed everything so far, to replay while the simulation goes on. Cuts order records
     * the same way on every backend, so results do not depend on which one flushed there. */
    size_t cut_records;
    /* Where the run publishes how far it has come (kb_progress.h: the phase, Phase 1's
     * simulated time and events, Phase 2's flushes and batches, the device set-up's stage),
     * for a display on another thread; NULL = nobody watches. Not owned; must outlive the
     * context. Changes nothing the run computes. */
    struct kb_progress *progress;
    /* Phase-1 threads (docs/parallel.md): 0 = one, the sequential engine (the default);
     * N >= 1 = a launch over several SIPs runs its SIPs as partitions of a parallel run on N
     * threads (at most KB_CTX_MAX_THREADS) where it can: no trace, system.switch.arbitration
     * per_sip, no device queue, nothing else pending in the host's simulation. The result,
     * op records included, is the same for every N >= 1; other launches run sequentially. */
    int threads;
    /* Several processes (kbcl run under mpirun; sched/kb_psim.h's kb_psim_net, the caller's
     * collective): every process runs the whole host program, and a forked launch's SIPs are
     * spread over the processes, each running its block of them on its `threads` and handing
     * the others what its SIPs changed after the launch. The result is the same for every
     * process count. NULL = this process alone. Not owned; must outlive the context. */
    const struct kb_psim_net *net;
} kb_ctx_opts;

#define KB_CTX_MAX_THREADS 64

#define KB_CTX_CUT_RECORDS ((size_t)32768)

/* A context for the machine cfg describes (cfg is copied; opts NULL = device auto).
 * Owner: caller; kb_ctx_destroy(NULL) is a no-op. */
KB_API int kb_ctx_create(const kb_config *cfg, const kb_ctx_opts *opts, kb_ctx **out,
                         kb_errbuf *eb);
KB_API void kb_ctx_destroy(kb_ctx *ctx);

/* ---- the context ---- */

/* The message of the context's last failure. */
KB_API const char *kb_ctx_errmsg(const kb_ctx *ctx);
/* The context's error buffer, for a bench's own messages (kb_err_set(kb_ctx_err(ctx), ...)). */
KB_API kb_errbuf *kb_ctx_err(kb_ctx *ctx);
/* Simulated time now (ps). */
KB_API kb_time kb_ctx_now(kb_ctx *ctx);

/* The simulated machine's shape: SIPs of the system, cubes per SIP, PEs per cube. */
typedef struct kb_ctx_shape {
    int sips, cubes, pes;
} kb_ctx_shape;
KB_API kb_ctx_shape kb_ctx_machine_shape(const kb_ctx *ctx);

/* ---- host programs ---- */

typedef int (*kb_host_fn)(kb_ctx *ctx, void *arg);

/*
 * Runs fn(ctx, arg) as a host fiber (device SIP 0) and the simulation until everything has
 * finished. Returns fn's result, the first kernel error, or KB_ERR_DEADLOCK (the message
 * lists every blocked fiber and what it waits on, plus any registered dumps).
 */
KB_API int kb_ctx_run_host(kb_ctx *ctx, kb_host_fn fn, void *arg);

/*
 * Runs worker(ctx, rank, arg) for rank = 0 .. nprocs-1, each as its own host fiber (a rank
 * worker: its device starts as SIP 0; call kb_ctx_set_device(ctx, rank) to bind it), and
 * blocks the calling host fiber until all have returned. Workers block in simulated time on
 * launches and collectives. If a worker returns an error, the simulation stops at once (the
 * other workers never run again) and the error comes back from kb_ctx_run_host with the
 * message "rank R: ..." naming the failing rank. Only from a host fiber.
 */
typedef int (*kb_worker_fn)(kb_ctx *ctx, int rank, void *arg);
KB_API int kb_spawn(kb_ctx *ctx, kb_worker_fn worker, void *arg, int nprocs);
/* The calling worker's spawn rank, or -1 outside a spawned worker. */
KB_API int kb_ctx_rank(kb_ctx *ctx);
/* Number of workers of the calling worker's spawn, or 0. */
KB_API int kb_ctx_nprocs(kb_ctx *ctx);

/* Binds the calling host fiber to SIP `sip` (its tensors and launches go there). */
KB_API int kb_ctx_set_device(kb_ctx *ctx, int sip);
KB_API int kb_ctx_current_device(kb_ctx *ctx);

/* ---- tensors ---- */

/* Data-parallel placement of a tensor's shards over cubes and PEs (docs/tensors.md). */
typedef enum kb_dp_split { KB_DP_REPLICATE = 0, KB_DP_COLUMN_WISE, KB_DP_ROW_WISE } kb_dp_split;
typedef enum kb_dp_mode {
    KB_DP_BLOCK = 0,            /* cube/pe splits */
    KB_DP_TILED_ROW_MAJOR,      /* tiles in row-major tile order, round-robin over slots */
    KB_DP_TILED_COLUMN_MAJOR    /* tiles in column-major tile order, round-robin over slots */
} kb_dp_mode;

typedef struct kb_dp_policy {
    kb_dp_split cube, pe;
    int num_cubes, num_pes;      /* 0 = all of the topology's */
    kb_dp_mode mode;
    uint64_t tile_rows, tile_cols; /* tiled modes only, > 0 */
} kb_dp_policy;

/* Convenience constructor for the block modes. */
KB_API kb_dp_policy kb_dp(kb_dp_split cube, kb_dp_split pe, int num_cubes, int num_pes);

KB_API const char *kb_dp_split_name(kb_dp_split s);   /* "replicate" ... */
KB_API int kb_dp_split_from_name(const char *name);   /* -1 when unknown */

typedef enum kb_mem_kind { KB_MEM_HBM = 0, KB_MEM_TCM, KB_MEM_SRAM } kb_mem_kind;

typedef struct kb_tensor_desc {
    const char *name;         /* copied; for messages */
    int64_t rows, cols;       /* a 1-D tensor of n elements is 1 x n */
    kb_dtype dtype;
    kb_dp_policy dp;
    kb_mem_kind mem;          /* where shards live (HBM slices by default) */
} kb_tensor_desc;

/* Allocates a tensor on the calling fiber's device, without writing it (`empty`). */
KB_API int kb_tensor_empty(kb_ctx *ctx, const kb_tensor_desc *d, kb_tensor **out);
/* Allocates and writes zeros (a timed host write of every shard). */
KB_API int kb_tensor_zeros(kb_ctx *ctx, const kb_tensor_desc *d, kb_tensor **out);
/* Allocates and copies `data` (rows*cols f32 values, logical row-major) in, rounding once. */
KB_API int kb_tensor_from_host(kb_ctx *ctx, const kb_tensor_desc *d, const float *data, kb_tensor **out);

/*
 * The values of a host write, produced on demand. Element (r, c) of the tensor is element
 * (row0 + r, col0 + c) of the source, which is either a generator, fn(ud, row, col, rows, cols,
 * out) writing the rows x cols block whose top-left element is (row, col) row-major into out,
 * or (fn NULL) a dense row-major f32 array `data` of ld values per row. (row0, col0) place
 * the tensor inside a larger source, e.g. a rank's slice of a full weight.
 * The write consults the source only when the context records (kb_ctx_recording): a
 * timing-only run never computes or holds a tensor's values, and its write takes exactly the
 * simulated time of a recorded one. A recording write asks the generator for each distinct
 * shard block once, in pieces of at most 65 536 values, and keeps only the rounded bytes (in
 * the op log's payload).
 * A source whose values are the seeded test values of kb_seedgen.h may say so (`gen`): a
 * recording write then records one GEN record per shard instead (kb_oplog.h), and the values
 * are generated where the record replays (on the device for an OpenCL backend): no payload
 * and no host work proportional to the tensor. fn must still give the same values (readers
 * of the fill on the host use it).
 */
typedef void (*kb_fill_fn)(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols,
                           float *out);
/* Source element (row, col) of kind KB_FILL_GEN_SEED (0) = kb_seedgen_value(seed, tile0 + row,
 * i0 + col, n), then kb_seedgen_sign(ntiles) when sign is set. Kind KB_FILL_GEN_PATTERN (the
 * benches' kb_bench_pattern, kb_seedgen_pattern) = kb_seedgen_pattern(p, seed, range) / den +
 * add with p = row * ld + col, or col * ld + row when transpose is set; den must be a power of
 * two from 2^-100 to 2^100 and add 0 or of magnitude at least 2^-100 (the values are then the
 * same on every backend; a write refuses other values with KB_ERR_INVAL). Fields of the other
 * kind are ignored. */
enum { KB_FILL_GEN_SEED = 0, KB_FILL_GEN_PATTERN = 1 };
typedef struct kb_fill_gen {
    uint32_t seed;
    int sign;
    int64_t ntiles, tile0, i0, n;
    /* plugin ABI 10: */
    int kind;           /* KB_FILL_GEN_SEED or KB_FILL_GEN_PATTERN */
    int transpose;
    uint32_t range;     /* at most 2^24 */
    float den, add;
    int64_t ld;
} kb_fill_gen;
typedef struct kb_fill {
    kb_fill_fn fn;
    void *ud;
    const float *data; /* when fn is NULL */
    int64_t ld;
    int64_t row0, col0;
    const kb_fill_gen *gen; /* optional (above); NULL: fn or data */
} kb_fill;
/* A fill reading a row-major array of ld values per row (ld 0: the tensor's cols). */
KB_API kb_fill kb_fill_array(const float *data, int64_t ld);
/* `f` moved by (rows, cols) into its source: the slice starting there. */
KB_API kb_fill kb_fill_at(kb_fill f, int64_t rows, int64_t cols);
KB_API int kb_tensor_from_fill(kb_ctx *ctx, const kb_tensor_desc *d, const kb_fill *src,
                        kb_tensor **out);
KB_API int kb_tensor_copy_from_fill(kb_tensor *t, const kb_fill *src);
/* Device -> host read into f32 (replays pending records first). */
KB_API int kb_tensor_read(kb_tensor *t, float *out);
/* Same, raw storage bytes of the logical tensor (rows*cols*elem size bytes). */
KB_API int kb_tensor_read_raw(kb_tensor *t, void *out);
KB_API void kb_tensor_free(kb_tensor *t);

KB_API kb_va kb_tensor_va(const kb_tensor *t);
KB_API int64_t kb_tensor_rows(const kb_tensor *t);
KB_API int64_t kb_tensor_cols(const kb_tensor *t);
KB_API kb_dtype kb_tensor_dtype(const kb_tensor *t);
KB_API const char *kb_tensor_name(const kb_tensor *t);
KB_API unsigned kb_tensor_sip(const kb_tensor *t);   /* global SIP index the tensor lives on */

/* ---- kernels ---- */

/*
 * A launch's argument block. A kernel's own arguments go in `typed`: a struct per kernel,
 * declared next to it (or in the header its launchers share), written with KB_KARGS_PUT at the
 * launch and read with KB_KARGS_GET in the kernel, so that each argument has a name and a type
 * where it is set and where it is used. ptr/i/f hold the arguments of frameworks that index
 * them by name for every kernel they run (the collectives' KB_CCL_ARG_*).
 *
 * Ownership: kb_launch copies the whole block, the typed struct with it, so the caller's
 * block may go once the launch returns; what the struct addresses by VA must outlive the
 * launch, as any VA argument must. The struct holds plain data, values and VAs: never a
 * pointer to the caller's stack or other host memory, which a kernel would reach outside the
 * simulated machine (no time, no op record). It must fit KB_KARGS_TYPED_MAX bytes
 * (KB_KARGS_PUT refuses a larger one at compile time) and need at most 16-byte alignment.
 */
#define KB_KARGS_MAX 12
#define KB_KARGS_TYPED_MAX 256
typedef struct kb_kargs {
    kb_va ptr[KB_KARGS_MAX];   /* tensor base VAs */
    int64_t i[KB_KARGS_MAX];   /* integer scalars */
    double f[KB_KARGS_MAX];    /* float scalars */
    _Alignas(16) unsigned char typed[KB_KARGS_TYPED_MAX]; /* a kernel's own struct */
} kb_kargs;

/* The typed block of `a`, for a struct of `size` bytes and alignment `align` (asserted to
 * fit); KB_KARGS_GET is the way to call it. */
static inline const void *kb_kargs_typed(const kb_kargs *a, size_t size, size_t align)
{
    assert(size <= sizeof a->typed && align <= 16);
    (void)size;
    (void)align;
    return a->typed;
}

/* Copies `value` (an lvalue: a variable or a compound literal such as
 * (my_args){ .x = kb_tensor_va(t), .n = n }) into a's typed block. */
#define KB_KARGS_PUT(a, ...)                                                                   \
    do {                                                                                       \
        _Static_assert(sizeof(__VA_ARGS__) <= KB_KARGS_TYPED_MAX,                              \
                       "kernel arguments larger than kb_kargs.typed");                         \
        memcpy((a)->typed, &(__VA_ARGS__), sizeof(__VA_ARGS__));                               \
    } while (0)

/* In the kernel: a's typed block as the struct T its launcher put there. */
#define KB_KARGS_GET(a, T) ((const T *)kb_kargs_typed((a), sizeof(T), _Alignof(T)))

typedef void (*kb_kernel_fn)(kb_tl *tl, const kb_kargs *a);

/*
 * Grid of a launch: PEs [0, pes) of cubes [0, cubes) of SIPs [sip0, sip0 + sips); 0 means the
 * whole extent (sips 0 = just the current device). tl_program_id(axis 0/1/2) = PE / cube /
 * SIP index inside the grid.
 */
typedef struct kb_grid {
    int pes, cubes, sips;
    int sip0;                  /* -1 = the current device */
} kb_grid;

/*
 * Launches `kernel` on every PE of the grid through the command path (host -> PCIe -> IO_CPU
 * -> M_CPU per cube -> PE_CPU per PE) and blocks the host fiber until the completion has come
 * back (aggregated per cube and per SIP). `a` is copied. Only from a host fiber.
 */
KB_API int kb_launch(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *a,
              const kb_grid *grid);
/* Same, with one argument block per SIP of the grid (args[s] for SIP sip0 + s). */
KB_API int kb_launch_per_sip(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *args,
                      const kb_grid *grid);
/* One kernel of a launch that runs several in turn (kb_launch_seq): its function, its
 * arguments (copied), its grid on each SIP, the first `pes` PEs of the first `cubes` cubes
 * (0: all), and its name (a string that outlives the launch, e.g. a literal). */
typedef struct kb_stage {
    kb_kernel_fn kernel;
    kb_kargs args;
    int pes, cubes;
    const char *name; /* in --trace timelines (NULL: the launch's); must outlive the launch */
} kb_stage;
/*
 * One launch that runs n kernels in turn, as a fused (persistent) kernel does: the command
 * path and the completions once, on the union of the stages' grids (grid: its sips and sip0;
 * its pes and cubes 0), and between consecutive stages a tl_barrier over the launch's PEs of
 * each SIP. A PE runs stage k's kernel when it is in that stage's grid, which the kernel sees
 * through tl_program_id / tl_num_programs. st is copied. Only from a host fiber; 1 <= n <= 16.
 */
KB_API int kb_launch_seq(kb_ctx *ctx, const char *name, const kb_stage *st, int n,
                         const kb_grid *grid);
/* Grid covering the PEs that own shards of t: its policy's num_pes x num_cubes. */
KB_API kb_grid kb_grid_of(const kb_tensor *t);

/* ---- the roofline ---- */

typedef enum kb_roof_bound { KB_ROOF_NONE = 0, KB_ROOF_COMPUTE, KB_ROOF_MEMORY,
                             KB_ROOF_COMM } kb_roof_bound;
typedef enum kb_roof_level { KB_ROOF_SIP = 0, KB_ROOF_CUBE, KB_ROOF_PE,
                             KB_ROOF_NLEVELS } kb_roof_level;

/* A workload's bound on a machine (ns). */
typedef struct kb_roofline {
    double compute_ns, memory_ns, comm_ns;
    double ns;               /* the largest of the three */
    kb_roof_bound bound;     /* which one (compute before memory before comm among equals) */
    int comm_level;          /* the kb_roof_level comm_ns comes from, -1 without traffic */
} kb_roofline;

/* "compute", "memory", "comm"; "" for KB_ROOF_NONE. */
KB_API const char *kb_roofline_bound_name(kb_roof_bound b);
/* "inter_sip", "ucie", "noc" (the links of a level, as kb_res names them); "" otherwise. */
KB_API const char *kb_roofline_level_name(int level);
/* r->ns / sim_ns: how close a run of sim_ns came to the bound (<= 1); 0 when either is 0. */
KB_API double kb_roofline_efficiency(const kb_roofline *r, double sim_ns);

#endif
