/*
 * kb_bench — built-in benchmarks and the runner that drives one from config to verified
 * numbers.
 *
 * A bench is a table entry: integer parameters (name, default, range, doc), a `run` function
 * executed as the host program inside the simulation (it creates tensors, launches kernels
 * and marks the end of the measured region), and a `verify` function called after the
 * simulation, outside simulated time, that reads the outputs back (Phase-2 replay), compares
 * them with a host computation and fills the result. sim_time_ns is the simulated time of the
 * measured region, so it is the same with and without --device none / --verify-data.
 */
#ifndef KB_BENCH_H
#define KB_BENCH_H

#include <stdint.h>

#include "kb_ccl.h"
#include "kb_ccl_config.h"
#include "kb_resident.h"
#include "kb_roofline.h"
#include "kb_runtime.h"
#include "kbcl_plugin.h"


/* 1 when b takes --model FILE (args.model) and reads --dtype as its number format
 * (args.dtype) instead of the collective's: the built-in decoder_layer; 0 for every other
 * bench (plugins' included), which refuse --model. */
int kb_bench_takes_model(const kb_bench *b);
/* 0 when b runs no collective, so that the collective's options (--algorithm, --world-size,
 * --n-elem, --buffer-kind, --root, --op and, but for decoder_layer, --dtype) would change
 * nothing: the built-in gemm, va_offset, gpt3_qkv and ipcq_deadlock; 1 for every other bench
 * (plugins' included). */
int kb_bench_takes_collective(const kb_bench *b);

/* The registry. */
const kb_bench *kb_bench_find(const char *name);
const kb_bench *kb_bench_at(int i);   /* NULL past the end */

/* Index of a parameter, -1 when the bench has none of that name. */
int kb_bench_param_index(const kb_bench *b, const char *name);
/* The value text s of parameter idx: a decimal integer or one of its value names
 * (kb_bench.param_names). 0 and *out, or -1 (neither; the range is the caller's check). */
int kb_bench_param_parse(const kb_bench *b, int idx, const char *s, int64_t *out);
/* Its value names as "a (0), b (1)" into buf ("" without names); returns buf. */
const char *kb_bench_param_names(const kb_bench *b, int idx, char *buf, size_t cap);

/* Everything a finished run reports. */
typedef struct kb_run_report {
    kb_bench_result res;
    double sim_time_ns;   /* the bench's measured region */
    double sim_end_ns;    /* simulated time when the host program ended (the whole run) */
    uint64_t events, switches, kernels, records;
    /* Phase-1 threads asked for (kb_ctx_opts.threads), the launches that ran forked over the
     * SIPs on them, and those launches' windows (docs/parallel.md) */
    int threads;
    uint64_t forked_launches, windows;
    /* host memory the run's data took: memory-store pages and op-log payload bytes at its
     * end (both 0 in a timing-only run) */
    uint64_t memstore_pages, payload_bytes;
    kb_replay_stats replay;
    /* Phase 2 on an OpenCL device: its transfers (zeros for ref), the backend's set-up, the
     * program cache's state (kb_cl_cache_state; -1 without an OpenCL backend) and the
     * kernels' device time */
    kb_xfer_stats xfer;
    double setup_ms, kernel_ms;
    double setup_wait_ms; /* the part of setup_ms the run waited for (the rest overlapped the
                           * simulation: the set-up runs in the background) */
    int program_cache;
    double wall_ms;
    double phase1_ms;  /* wall time inside the simulation (the host program and its kernels) */
    char *report;      /* full deadlock report when the run deadlocked (malloc'd), else NULL */
    char device_desc[160]; /* the Phase-2 device the run used */
    char device_note[256]; /* why --device auto chose what it chose, or "" */
} kb_run_report;

/* Frees what a report owns. */
void kb_run_report_fini(kb_run_report *rep);

/*
 * Creates a context for cfg/opts (device, trace stream), runs the bench, verifies when asked (and possible), and
 * fills *rep. Returns 0 (verification failure is rep->res.verified == 0, not an error) or an
 * error code with the message in eb.
 */
int kb_bench_execute(const kb_config *cfg, const kb_ccl_cfg *ccl, const kb_ctx_opts *opts,
                     const kb_bench *b,
                     const kb_bench_args *a, kb_run_report *rep, kb_errbuf *eb);

/* The registered benches (defined in bench_*.c). */
extern const kb_bench kb_bench_gemm;
extern const kb_bench kb_bench_va_offset;
extern const kb_bench kb_bench_gpt3_qkv;
extern const kb_bench kb_bench_ccl;
extern const kb_bench kb_bench_ccl_allreduce;   /* the same bench as kb_bench_ccl, its old name */
extern const kb_bench kb_bench_ipcq_deadlock;
extern const kb_bench kb_bench_tp_mlp;
extern const kb_bench kb_bench_tp_attention;
extern const kb_bench kb_bench_decoder_layer;

/*
 * nccl-tests' "size" of a collective: the bytes of the larger of a rank's send and receive
 * buffers (nccl-tests src/common.cu prints max(sendBytes, expectedBytes) in its size column),
 * for `count` elements of elem_bytes each, count being nccl-tests' count column
 * (the per-rank paramcount of each src/<coll>.cu GetCollByteCount):
 *   all_reduce, broadcast, reduce, sendrecv: size = count * elem (the one buffer);
 *   all_gather:     size = ws * count * elem (the receive buffer; count is what a rank sends);
 *   reduce_scatter: size = ws * count * elem (the send buffer; count is what a rank receives);
 *   all_to_all:     size = ws * count * elem (either buffer; count goes to each peer).
 * algbw is size / time for every kind (each GetBw's baseBw). 0 for ws < 1 or a bad kind.
 */
uint64_t kb_bench_coll_size(kb_coll_kind k, int ws, int64_t count, int elem_bytes);
/*
 * The inverse: the count whose size is exactly size_bytes. Returns 0, or -1 when size_bytes is
 * not a whole number of elements (times ws for the kinds that split the buffer by rank), where
 * nccl-tests would round down: kbcl refuses, so the size it reports is the size asked for.
 */
int kb_bench_coll_count(kb_coll_kind k, int ws, int64_t size_bytes, int elem_bytes,
                        int64_t *count);

/* Reference gemm in double: ref (MxN) = a (MxK) @ b (KxN); bound[i] = K * 2^-24 * sum|a||b|
 * (the f32 accumulation error allowance). kb_hostgemm_ref's blocked, threaded loops; to check
 * an output without holding ref and bound, kb_hostgemm_check. */
void kb_bench_ref_gemm(const float *a, const float *b, size_t M, size_t N, size_t K, double *ref,
                       double *bound);

#endif
