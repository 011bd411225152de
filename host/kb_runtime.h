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
#include "kbcl_runtime.h"


/*
 * The Phase-2 backend for a device: ref (plain C), cpu (an OpenCL CPU device, e.g. PoCL),
 * gpu (an OpenCL GPU), auto (GPU, else OpenCL CPU, else ref; `note` then says which one and
 * why). desc (may be NULL) names the device. none has no backend (KB_ERR_INVAL).
 * KB_ERR_DEVICE (message naming what was found) when the asked-for device does not exist.
 */
int kb_backend_for_device(kb_device_kind dev, kb_backend *out, char *desc, size_t desc_n,
                          char *note, size_t note_n, kb_errbuf *eb);

/* What the device choice resolved to ("NVIDIA H100 (...)", "ref"), and a note when auto fell
 * back to another device (else ""); after kb_ctx_backend_wait. */
const char *kb_ctx_device_desc(const kb_ctx *ctx);
const char *kb_ctx_device_note(const kb_ctx *ctx);
/* The full report of the last deadlock (every blocked fiber and the registered dumps; the
 * error message holds only its start), or NULL. Owned by the context. */
const char *kb_ctx_report(const kb_ctx *ctx);
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

/* ---- for the layers above (kbcl_runtime.h has the host programs) ---- */

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

/* ---- tensors (kbcl_runtime.h has the public part) ---- */

/* Raw bytes of shard i's block (replays first; untimed: for checking every replica). */
int kb_tensor_read_shard_raw(kb_tensor *t, size_t i, void *out);
/* A tensor's shards (kb_dp_resolve's) and their physical addresses. */
size_t kb_tensor_nshards(const kb_tensor *t);
const kb_shard_spec *kb_tensor_shard(const kb_tensor *t, size_t i);
kb_pa kb_tensor_shard_pa(const kb_tensor *t, size_t i);

/* The tensor that owns va on SIP gsip (NULL if none). */
kb_tensor *kb_ctx_tensor_at(kb_ctx *ctx, unsigned gsip, kb_va va);

/* Statistics for reports. */
uint64_t kb_ctx_kernels_run(const kb_ctx *ctx);
/* Events and fiber switches of the whole run: the context's simulation's and those of every
 * launch forked over the SIPs (their partitions', docs/parallel.md). */
uint64_t kb_ctx_events(const kb_ctx *ctx);
uint64_t kb_ctx_switches(const kb_ctx *ctx);
/* Phase-1 threads asked for (kb_ctx_opts.threads), launches that ran forked over the SIPs, and
 * their windows (kb_psim). */
void kb_ctx_fork_stats(const kb_ctx *ctx, int *threads, uint64_t *forked, uint64_t *windows);

#endif
