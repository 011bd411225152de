/*
 * kb_runtime — the host runtime: a simulation context, tensors placed by DPPolicy, kernel
 * launches through the command path, and Phase-2 replay on host reads.
 *
 * A kb_ctx owns the engine (kb_sim), the machine (kb_machine), the op log, the memory store
 * and the Phase-2 backend. Host programs run as fibers (kb_ctx_run_host): a launch, a tensor
 * write or a read blocks the host fiber in simulated time, exactly like a worker waiting on a
 * device. Each host fiber has a current device (the SIP its tensors and launches go to;
 * kb_ctx_set_device, SIP 0 by default).
 *
 * Errors: every function returns 0 or a KB_ERR_* code and leaves a message in
 * kb_ctx_errmsg(ctx). An error inside a kernel (bad address, memory exhausted ...) stops the
 * simulation; kb_ctx_run_host then returns that error with the kernel and PE in the message.
 *
 * Data and timing: with device KB_DEV_NONE nothing is recorded, host writes never look at
 * their values (kb_fill) and tensor reads fail with KB_ERR_UNSUPPORTED, so no host memory
 * follows the tensors' sizes; every other device records each data operation in the op log,
 * and a read first replays what is pending (kb_ctx_flush). Timing is identical in both modes.
 *
 * Ownership: tensors belong to the context (kb_tensor_free releases one early; the context
 * frees the rest). Limits: tensors are 1-D or 2-D (higher ranks are viewed as 2-D: rows =
 * product of the leading dimensions).
 */
#ifndef KB_RUNTIME_H
#define KB_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kb_config.h"
#include "kb_dtype.h"
#include "kb_err.h"
#include "kb_machine.h"
#include "kb_mmu.h"
#include "kb_oplog.h"
#include "kb_placement.h"
#include "kb_replay.h"
#include "kb_sim.h"

typedef struct kb_ctx kb_ctx;
typedef struct kb_tensor kb_tensor;
typedef struct kb_tl kb_tl;

typedef enum kb_device_kind {
    KB_DEV_AUTO = 0, KB_DEV_GPU, KB_DEV_CPU, KB_DEV_REF, KB_DEV_NONE
} kb_device_kind;
const char *kb_device_name(kb_device_kind d);
int kb_device_from_name(const char *name); /* -1 when unknown */

/*
 * The Phase-2 backend for a device: ref (plain C), cpu (an OpenCL CPU device, e.g. PoCL),
 * gpu (an OpenCL GPU), auto (GPU, else OpenCL CPU, else ref; `note` then says which one and
 * why). desc (may be NULL) names the device. none has no backend (KB_ERR_INVAL).
 * KB_ERR_DEVICE (message naming what was found) when the asked-for device does not exist.
 */
int kb_backend_for_device(kb_device_kind dev, kb_backend *out, char *desc, size_t desc_n,
                          char *note, size_t note_n, kb_errbuf *eb);

typedef struct kb_ctx_opts {
    kb_device_kind device;
    FILE *trace;      /* IPCQ trace lines (KBCL_CCL_TRACE); NULL = off; not owned */
    struct kb_trace *trace_rec; /* timeline recorder (kbcl run --trace); NULL = off; not owned */
    /* A Phase-2 backend to use instead of making one for `device` (a sweep worker's, kept
     * across points, so its device set-up is paid once); NULL = make one. Not owned: the
     * context forgets it when destroyed. backend_desc names it (may be NULL). */
    const kb_backend *backend;
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
} kb_ctx_opts;

#define KB_CTX_CUT_RECORDS ((size_t)32768)

/* cfg is copied. Owner: caller; kb_ctx_destroy(NULL) is a no-op. */
int kb_ctx_create(const kb_config *cfg, const kb_ctx_opts *opts, kb_ctx **out, kb_errbuf *eb);
void kb_ctx_destroy(kb_ctx *ctx);

const char *kb_ctx_errmsg(const kb_ctx *ctx);
/* What the device choice resolved to ("NVIDIA H100 (...)", "ref"), and a note when auto fell
 * back to another device (else ""); after kb_ctx_backend_wait. */
const char *kb_ctx_device_desc(const kb_ctx *ctx);
const char *kb_ctx_device_note(const kb_ctx *ctx);
/* The full report of the last deadlock (every blocked fiber and the registered dumps; the
 * error message holds only its start), or NULL. Owned by the context. */
const char *kb_ctx_report(const kb_ctx *ctx);
kb_errbuf *kb_ctx_err(kb_ctx *ctx);
kb_sim *kb_ctx_sim(kb_ctx *ctx);
kb_machine *kb_ctx_machine(kb_ctx *ctx);
const kb_config *kb_ctx_config(const kb_ctx *ctx);
kb_oplog *kb_ctx_oplog(kb_ctx *ctx);
int kb_ctx_recording(const kb_ctx *ctx);
kb_device_kind kb_ctx_device(const kb_ctx *ctx);
const kb_replay_stats *kb_ctx_replay_stats(const kb_ctx *ctx);
/*
 * An OpenCL backend (devices gpu, cpu, auto) is set up on a thread of its own from
 * kb_ctx_create on, while the simulation runs; the first flush waits for it, and so does this
 * call, which returns the set-up's error (KB_ERR_DEVICE naming what was found, with the message
 * in kb_ctx_errmsg) or 0. kb_ctx_backend, kb_ctx_device_desc and kb_ctx_device_note are valid
 * once it has returned (at once for other devices).
 */
int kb_ctx_backend_wait(kb_ctx *ctx);
/* Wall time spent waiting for that set-up (the part the simulation did not hide). */
double kb_ctx_backend_wait_ms(const kb_ctx *ctx);
/* The Phase-2 backend (ops NULL with device none): its set-up and transfer figures. */
const kb_backend *kb_ctx_backend(const kb_ctx *ctx);
/* 1 when the backend came from kb_ctx_opts.backend (set up before this context). */
int kb_ctx_backend_borrowed(const kb_ctx *ctx);

/* ---- host programs ---- */

typedef int (*kb_host_fn)(kb_ctx *ctx, void *arg);

/*
 * Runs fn(ctx, arg) as a host fiber (device SIP 0) and the simulation until everything has
 * finished. Returns fn's result, the first kernel error, or KB_ERR_DEADLOCK (the message
 * lists every blocked fiber and what it waits on, plus any registered dumps).
 */
int kb_ctx_run_host(kb_ctx *ctx, kb_host_fn fn, void *arg);

/*
 * Runs worker(ctx, rank, arg) for rank = 0 .. nprocs-1, each as its own host fiber (a rank
 * worker: its device starts as SIP 0; call kb_ctx_set_device(ctx, rank) to bind it), and
 * blocks the calling host fiber until all have returned. Workers block in simulated time on
 * launches and collectives. If a worker returns an error, the simulation stops at once (the
 * other workers never run again) and the error comes back from kb_ctx_run_host with the
 * message "rank R: ..." naming the failing rank. Only from a host fiber.
 */
typedef int (*kb_worker_fn)(kb_ctx *ctx, int rank, void *arg);
int kb_spawn(kb_ctx *ctx, kb_worker_fn worker, void *arg, int nprocs);
/* The calling worker's spawn rank, or -1 outside a spawned worker. */
int kb_ctx_rank(kb_ctx *ctx);
/* Number of workers of the calling worker's spawn, or 0. */
int kb_ctx_nprocs(kb_ctx *ctx);

/* Binds the calling host fiber to SIP `sip` (its tensors and launches go there). */
int kb_ctx_set_device(kb_ctx *ctx, int sip);
int kb_ctx_current_device(kb_ctx *ctx);

/* Extra text for deadlock reports (the IPCQ layer registers its pointer dump here). */
typedef void (*kb_dump_fn)(kb_ctx *ctx, char *buf, size_t n, void *ud);
void kb_ctx_set_deadlock_dump(kb_ctx *ctx, kb_dump_fn fn, void *ud);

/*
 * Extension slots: layers above the runtime (the IPCQ layer, collectives) keep their
 * per-context state here. `destroy` (may be NULL) is called with the pointer when the context
 * is destroyed, in reverse slot order, before the machine is freed.
 */
enum { KB_EXT_IPCQ = 0, KB_EXT_CCL = 1, KB_EXT_CCL_CONFIG = 2, KB_EXT_NSLOTS = 4 };
void *kb_ctx_ext(kb_ctx *ctx, int slot);
void kb_ctx_set_ext(kb_ctx *ctx, int slot, void *ptr, void (*destroy)(void *ptr));
FILE *kb_ctx_trace(kb_ctx *ctx);

/* Stops the simulation with `code` (message already in kb_ctx_err); used by kernels' errors. */
void kb_ctx_fail(kb_ctx *ctx, int code);

/* Appends a record when recording; fills seq. Returns 0 or KB_ERR_NOMEM (also when off: 0).
 * With a timeline attached the operation also goes into it, named after its kind (or `name`,
 * a string that outlives the context). */
int kb_ctx_record(kb_ctx *ctx, kb_rec *r);
int kb_ctx_record_as(kb_ctx *ctx, kb_rec *r, const char *name);

/* Replays pending op-log records into the memory store, and waits for a pipelined backend's
 * earlier flushes (kb_ctx_sync); a no-op when nothing is pending. */
int kb_ctx_flush(kb_ctx *ctx);
/* Waits until a pipelined backend (kb_backend_ops.sync) has run everything it was handed, and
 * returns the first error of that work; 0 at once for other backends. */
int kb_ctx_sync(kb_ctx *ctx);
kb_memstore *kb_ctx_memstore(kb_ctx *ctx);

/* ---- tensors ---- */

typedef enum kb_mem_kind { KB_MEM_HBM = 0, KB_MEM_TCM, KB_MEM_SRAM } kb_mem_kind;

typedef struct kb_tensor_desc {
    const char *name;         /* copied; for messages */
    int64_t rows, cols;       /* a 1-D tensor of n elements is 1 x n */
    kb_dtype dtype;
    kb_dp_policy dp;
    kb_mem_kind mem;          /* where shards live (HBM slices by default) */
} kb_tensor_desc;

/* Allocates a tensor on the calling fiber's device, without writing it (`empty`). */
int kb_tensor_empty(kb_ctx *ctx, const kb_tensor_desc *d, kb_tensor **out);
/* Allocates and writes zeros (a timed host write of every shard). */
int kb_tensor_zeros(kb_ctx *ctx, const kb_tensor_desc *d, kb_tensor **out);
/* Allocates and copies `data` (rows*cols f32 values, logical row-major) in, rounding once. */
int kb_tensor_from_host(kb_ctx *ctx, const kb_tensor_desc *d, const float *data, kb_tensor **out);

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
/* Source element (row, col) = kb_seedgen_value(seed, tile0 + row, i0 + col, n), then
 * kb_seedgen_sign(ntiles) when sign is set. */
typedef struct kb_fill_gen {
    uint32_t seed;
    int sign;
    int64_t ntiles, tile0, i0, n;
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
kb_fill kb_fill_array(const float *data, int64_t ld);
/* `f` moved by (rows, cols) into its source: the slice starting there. */
kb_fill kb_fill_at(kb_fill f, int64_t rows, int64_t cols);
int kb_tensor_from_fill(kb_ctx *ctx, const kb_tensor_desc *d, const kb_fill *src,
                        kb_tensor **out);
int kb_tensor_copy_from_fill(kb_tensor *t, const kb_fill *src);
/* Device -> host read into f32 (replays pending records first). */
int kb_tensor_read(kb_tensor *t, float *out);
/* Same, raw storage bytes of the logical tensor (rows*cols*elem size bytes). */
int kb_tensor_read_raw(kb_tensor *t, void *out);
/* Raw bytes of shard i's block (replays first; untimed: for checking every replica). */
int kb_tensor_read_shard_raw(kb_tensor *t, size_t i, void *out);
void kb_tensor_free(kb_tensor *t);

kb_va kb_tensor_va(const kb_tensor *t);
int64_t kb_tensor_rows(const kb_tensor *t);
int64_t kb_tensor_cols(const kb_tensor *t);
kb_dtype kb_tensor_dtype(const kb_tensor *t);
size_t kb_tensor_nshards(const kb_tensor *t);
const kb_shard_spec *kb_tensor_shard(const kb_tensor *t, size_t i);
kb_pa kb_tensor_shard_pa(const kb_tensor *t, size_t i);
const char *kb_tensor_name(const kb_tensor *t);
unsigned kb_tensor_sip(const kb_tensor *t);   /* global SIP index the tensor lives on */

/* The tensor that owns va on SIP gsip (NULL if none). */
kb_tensor *kb_ctx_tensor_at(kb_ctx *ctx, unsigned gsip, kb_va va);

/* ---- kernels ---- */

#define KB_KARGS_MAX 12
typedef struct kb_kargs {
    kb_va ptr[KB_KARGS_MAX];   /* tensor base VAs */
    int64_t i[KB_KARGS_MAX];   /* integer scalars */
    double f[KB_KARGS_MAX];    /* float scalars */
} kb_kargs;

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
int kb_launch(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *a,
              const kb_grid *grid);
/* Same, with one argument block per SIP of the grid (args[s] for SIP sip0 + s). */
int kb_launch_per_sip(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *args,
                      const kb_grid *grid);
/* Grid covering the PEs that own shards of t: its policy's num_pes x num_cubes. */
kb_grid kb_grid_of(const kb_tensor *t);

/* Statistics for reports. */
uint64_t kb_ctx_kernels_run(const kb_ctx *ctx);

#endif
