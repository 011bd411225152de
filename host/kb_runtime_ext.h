/*
 * kb_runtime_ext — the runtime's extension interface: what the layers above the runtime
 * (IPCQ and the collectives in ccl/, tensor parallelism in tp/) may use to build kernel-side
 * operations of their own, beyond the public runtime (kb_runtime.h) and kernel language
 * (kb_tl.h). It replaces reading the runtime's private structs: every call here is a
 * function (link-time optimisation inlines the one-line accessors into the IPCQ fast path).
 *
 * Contract for an extension operation issued from a kernel (what tl_send/tl_recv do):
 *  - pay the issue cost kb_tl_issue_cost(tl) (plus the unit's own overhead) before the unit
 *    starts, and advance the kernel's fiber with kb_tl_wait_until or the sched/ primitives;
 *  - take scratch results from kb_tl_scratch_val / kb_tl_scratch_alloc, translate kernel
 *    virtual addresses with kb_tl_translate (it checks bounds and mapping);
 *  - build op records only when kb_ctx_records(ctx) says so and append them with
 *    kb_tl_record (which stamps the PE);
 *  - on misuse call tl_fail (it does not return).
 * Errors inside these calls stop the run like any tl_* call (they do not return).
 * The PE's hardware model (kb_machine.h) holds two slots owned by the IPCQ layer
 * (kb_pe_hw.ipcq_state, kb_pe_hw.ipcq_wired); the rest of kb_machine.h is read-only here.
 */
#ifndef KB_RUNTIME_EXT_H
#define KB_RUNTIME_EXT_H

#include <stdint.h>

#include "kb_psim.h"
#include "kb_runtime.h"
#include "kb_tl.h"
#include "kb_wire.h"

/* The issue cost of one tl call on this kernel's PE (pe.cpu.overhead_ns, in ps). */
kb_time kb_tl_issue_cost(const kb_tl *tl);

/*
 * The launch grid the kernel sees through tl_program_id / tl_num_programs. A kernel that runs
 * another kernel on a world of its own (ccl/kb_ccl_lanes.c: one rank per SIP, the SIP's PEs
 * in lanes) shows it pid/np before the call and puts the saved ones back afterwards: the
 * runtime reads the real ids when the kernel ends. old_pid/old_np (may be NULL) get the ids
 * in force before the call.
 */
void kb_tl_view(kb_tl *tl, const int pid[3], const int np[3], int old_pid[3], int old_np[3]);

/*
 * kb_tensor_from_fill for a source that repeats every prow rows and pcol columns (0: does
 * not repeat in that dimension): element (r, c) equals element (r mod prow, c mod pcol). The
 * caller promises it; shards whose origins are equal modulo the period and whose shapes are
 * equal then share one block of the op log's payload, so a weight made of copies costs the
 * host (and the upload to a device) one copy. The values recorded are those of src either way.
 */
int kb_tensor_from_fill_periodic(kb_ctx *ctx, const kb_tensor_desc *d, const kb_fill *src,
                                 int64_t prow, int64_t pcol, kb_tensor **out);

/*
 * A tensor that is a part of a quantized weight generated where it replays (a GEN record's op
 * KB_GEN_QW per shard, kb_oplog.h): the maps of one copy of k x nb values are already in the
 * op log's payload at rows_off (k uint64) and cols_off (nb kb_seedgen_col entries); part and
 * fmt as kb_seedgen.h names them. Tensor row r is part row r mod (the part's rows per copy),
 * column c copy column c mod nb. The write is timed as any host write of the tensor.
 */
typedef struct kb_qgen_src {
    unsigned fmt, part;
    int sparse;
    uint64_t k, nb;
    uint64_t rows_off, cols_off;
} kb_qgen_src;
int kb_tensor_from_qgen(kb_ctx *ctx, const kb_tensor_desc *d, const kb_qgen_src *g,
                        kb_tensor **out);

/*
 * SchedulerV2's stages for this kernel's streamed gemms (tl_dot, tl_dot_q with an operand
 * outside the PE's TCM): how many steps' tile loads may be in flight, each step's loads
 * starting once the step `stages` before it has finished computing. 2 (double buffering) is
 * every kernel's default; a kernel tuned for its machine may take more, e.g. one per DMA
 * channel. Clamped to [2, KB_TL_MAX_STAGES]; the kernel's later gemms use it.
 */
#define KB_TL_MAX_STAGES 8
void kb_tl_set_stages(kb_tl *tl, int stages);
int kb_tl_stages(const kb_tl *tl);

/*
 * The host program's device launch queue (a stream whose launches the device runs back to
 * back). While on, the host's launches (and the process group's, which the last rank to
 * arrive issues) are queued on the device: the first one sends the commands down the host's
 * path (timing-model.md §5.1), every later one starts at its SIPs' IO_CPUs (their overhead
 * only) once the host program has passed the launches before it, and a launch is complete
 * for the host program when its SIPs' completions are aggregated at their IO_CPUs, not when
 * they reach the host. Turning it off pays the path up to the host once, from the device's
 * SIP. The host program must only launch in between: a host write or read while it is on
 * is KB_ERR_STATE. Returns 0, or KB_ERR_STATE outside a host program.
 */
int kb_launch_queue(kb_ctx *ctx, int on);

/*
 * The kernels' span of the host program's last kb_launch: *first is when its first kernel
 * started, *last when its last kernel ended (ps, every SIP of the grid). The launch's own
 * time beyond it is the command path: the commands down, the completions' aggregation back
 * (timing-model.md §5.1). 0, or KB_ERR_STATE outside a host program or before its first
 * launch.
 */
int kb_launch_span(kb_ctx *ctx, kb_time *first, kb_time *last);

/* Stage k of the host program's last launch (a kb_launch_seq), over its PEs and SIPs: the
 * PE_GEMM busy time its kernels booked (summed), when its first kernel started and when its
 * last one returned (ps; both 0 when no PE ran it). 0, KB_ERR_STATE outside a host program,
 * KB_ERR_RANGE when that launch has no stage k (a plain kb_launch has none). */
typedef struct kb_stage_stats {
    kb_time gemm_busy, first, last;
} kb_stage_stats;
int kb_launch_stage_stats(kb_ctx *ctx, int k, kb_stage_stats *st);

/* Blocks the kernel until simulated time t (no-op when t is not in the future). */
void kb_tl_wait_until(kb_tl *tl, kb_time t);

/* Fails the kernel for a DMA from src to dst that kb_machine_dma refused (called without an
 * error buffer, as hot paths do): recomputes the route for its message, "<op>: <why>".
 * Does not return. */
void kb_tl_dma_fail(kb_tl *tl, kb_pa src, kb_pa dst, const char *op);

/* A scratch value of rows x cols in dtype dt on the kernel's PE, or only its address
 * (callers that fill a kb_val in place). `op` names the operation in messages. */
kb_val kb_tl_scratch_val(kb_tl *tl, uint32_t rows, uint32_t cols, kb_dtype dt, const char *op);
kb_pa kb_tl_scratch_alloc(kb_tl *tl, uint64_t bytes, const char *op);
/* Bytes of the largest scratch value the kernel could allocate now (large values it freed
 * and the runtime kept for reuse are given back to the PE's scratch first). */
uint64_t kb_tl_scratch_room(kb_tl *tl);

/*
 * tl_dot whose SchedulerV2 loads each reserve their route when the PE's DMA engine can start
 * them (the kernel waits until then), not all at the call: streams of several PEs over a
 * shared FIFO link (a cube's NoC) then interleave load by load instead of a later stream
 * queuing behind an earlier one's whole reservation. Alone on its links it takes exactly
 * tl_dot's time (more scheduler events). tl_gemm uses it with nparts > 1.
 */
kb_val kb_tl_dot_paced(kb_tl *tl, kb_val a, kb_val b);

/* Physical address of [va, va + bytes) as the kernel's PE sees it (one mapping must cover
 * it); *tensor (may be NULL) gets the tensor it belongs to. */
kb_pa kb_tl_translate(kb_tl *tl, kb_va va, uint64_t bytes, const char *op, kb_tensor **tensor);

/* Appends an op record issued by this kernel (its PE is filled in). */
void kb_tl_record(kb_tl *tl, kb_rec *r);

/* The op-log operand of a value (address, shape, dtype and row stride). */
kb_opnd kb_tl_opnd(kb_val v);
/* Fills *r (cleared first) with a record of `kind`/`op` over [t_start, t_end): dst, nsrc
 * sources, the two immediates. The caller may adjust it, then appends it with kb_tl_record. */
void kb_tl_rec_fill(kb_rec *r, kb_rec_kind kind, int op, kb_val dst, const kb_val *src, int nsrc,
                    float imm0, float imm1, kb_time t_start, kb_time t_end);

/* Whether operations must build op records (op log or trace on); timing-only runs skip
 * building them. */
int kb_ctx_records(const kb_ctx *ctx);

/* The error code that stopped the run, 0 while it runs. */
int kb_ctx_failed(const kb_ctx *ctx);

/*
 * Fails the run from `sim`, the simulation the caller runs in (a kernel's tl_sim, or the one
 * that fired an event callback), with `code` and a printf-style message, unless the run has
 * failed already (the first failure's message is the run's). The one way kernels and event
 * callbacks end a run: in a launch forked over the SIPs (docs/parallel.md) it stops the
 * caller's partition and keeps that partition's first failure; the launch's join makes the
 * lowest-numbered failed partition's the run's, whatever the thread count.
 */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
void kb_ctx_fail_in(kb_ctx *ctx, kb_sim *sim, int code, const char *fmt, ...);

/*
 * fn(sim of SIP `to`, a, b) at t, from code of SIP `from` running in `sim`: kb_sim_at(sim, ...)
 * in a sequential run; in a launch forked over the SIPs a message to SIP to's partition
 * (kb_psim_post), which between SIPs must be at least the lookahead (the least inter-SIP link
 * latency) after from's clock, else KB_ERR_RANGE. What an event of one SIP does to another's
 * state goes through here. 0, KB_ERR_NOMEM, KB_ERR_RANGE.
 */
int kb_ctx_post(kb_ctx *ctx, kb_sim *sim, unsigned from, unsigned to, kb_time t, kb_event_fn fn,
                void *a, void *b);

/*
 * A module's part in a run spread over several processes (kb_ctx_opts.net, docs/parallel.md):
 * what of its state a forked launch's SIPs change, handed after the launch from the process
 * that ran each SIP to the others, and how its messages between SIPs (kb_ctx_post) cross
 * between processes. save writes the state of the SIPs this process ran (own[s] != 0) into w
 * (failed: the launch failed, and the state serves the run's reports only, so what a failed
 * launch leaves behind may be passed over); load reads what another process's save wrote
 * (theirs[s]: the SIPs that one ran); both get the module's kb_ctx_ext pointer and return 0 or
 * an error. Each message function has its
 * codec (sched/kb_psim.h), whose ud is that pointer too.
 */
#define KB_EXT_DIST_MSGS 4
typedef struct kb_ext_dist {
    int (*save)(void *ext, const uint8_t *own, int failed, struct kb_wire *w);
    int (*load)(void *ext, const uint8_t *theirs, struct kb_wire_rd *r);
    int nmsg;
    struct {
        kb_event_fn fn;
        kb_psim_enc_fn enc;
        kb_psim_dec_fn dec;
    } msg[KB_EXT_DIST_MSGS];
} kb_ext_dist;

/* Sets (d copied; NULL: none) slot's part in a run over several processes: 0, KB_ERR_INVAL. */
int kb_ctx_set_ext_dist(kb_ctx *ctx, int slot, const kb_ext_dist *d);
/* kb_ctx_opts.net, NULL for a run in one process. */
const struct kb_psim_net *kb_ctx_net(const kb_ctx *ctx);

#endif
