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

#define KB_BENCH_MAX_PARAMS 8
#define KB_BENCH_MAX_EXTRAS 16

typedef struct kb_bench_param {
    const char *name;
    int64_t dflt, min, max;
    const char *doc;
} kb_bench_param;

typedef struct kb_bench_args {
    int64_t p[KB_BENCH_MAX_PARAMS];   /* resolved values, in the bench's param order */
    int verify;                        /* --verify-data */
    /* --size: the collective's buffer per rank in bytes, nccl-tests' size (see
     * kb_bench_coll_size); 0 = not given (the tile length comes from ccl.yaml's n_elem).
     * Only a bench with size_elem_bytes > 0 gets one. */
    int64_t size_bytes;
    /* --model FILE and --dtype NAME for a bench that takes them (kb_bench_takes_model;
     * NULL = not given). */
    const char *model;
    const char *dtype;
} kb_bench_args;

typedef struct kb_bench_result {
    int verified;                      /* 1 passed, 0 failed, -1 not checked */
    char line[256];                    /* the bench's result line ("  gemm (...)") */
    char ok_text[64];                  /* printed after "line: " on success ("OK" if empty) */
    char detail[512];                  /* why verification failed */
    int have_digest;
    uint64_t digest;                   /* FNV-1a 64 of the verified output bytes (the ccl
                                          bench beyond 64 KiB: kb_vquery.h's block digest) */
    int have_err;
    double max_abs_err, err_bound;     /* worst |got - ref| and the bound it was checked against */
    kb_time t_begin, t_end;            /* measured region (simulated) */
    /* the resource reserved longest in the region (kb_bench_mark_begin / _end): its kind and
     * place ("noc sip0/cube3"), and that time over the region's; empty when not measured */
    char busiest[96];
    double busiest_frac;
    /* the bound of the region (kb_bench_mark_end): the longest time one resource (a DMA
     * engine's channels together) needs for the bytes it carried at its bandwidth, or its
     * busy time when that is less; which resource; 0 and "" when not measured */
    double bound_ns;
    char bound_resource[96];
    void *busy_mark;                   /* owned: every resource's busy time and bytes at
                                        * mark_begin */
    int nextras;
    struct { const char *name; double value; } extras[KB_BENCH_MAX_EXTRAS];
    /* the workload's lower bound on the machine (kb_roofline.h): what its flops, HBM bytes
     * and link traffic need at the machine's peaks, whatever the schedule; set by the bench
     * (kb_bench_set_roofline), have_roofline 0 when it has none. Unlike bound_ns, which is
     * the busiest resource's time for what the run did move, it does not depend on the run.
     * Last in the struct: a plugin compiled before it never sees it and reports none. */
    int have_roofline;
    kb_roofline roofline;
} kb_bench_result;

typedef struct kb_bench {
    const char *name;
    const char *summary;
    kb_bench_param params[KB_BENCH_MAX_PARAMS];
    int nparams;
    size_t state_size;                 /* zeroed state passed to run/verify */
    int (*run)(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res);
    int (*verify)(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res);
    /* Frees what run/verify malloc'd in state (tensors belong to the context). May be NULL. */
    void (*cleanup)(void *state);
    /* > 0: the bench runs a collective and takes --size (args.size_bytes) in elements of this
     * many bytes; 0: it takes no size. */
    int size_elem_bytes;
} kb_bench;

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

/* Everything a finished run reports. */
typedef struct kb_run_report {
    kb_bench_result res;
    double sim_time_ns;   /* the bench's measured region */
    double sim_end_ns;    /* simulated time when the host program ended (the whole run) */
    uint64_t events, switches, kernels, records;
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

/* bound_ns / the region's time: how close the run came to what its busiest resource allows
 * (<= 1); 0 when not measured. */
double kb_bench_efficiency(const kb_bench_result *r);

/* The roofline's time over the region's: how close the run came to its workload's lower
 * bound (<= 1); 0 when there is none. */
double kb_bench_roofline_efficiency(const kb_bench_result *r);
/* Stores a bench's roofline in r (have_roofline = 1). */
void kb_bench_set_roofline(kb_bench_result *r, const kb_roofline *rl);

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

/* Helpers for benches. */
uint64_t kb_fnv1a64(const void *data, size_t n, uint64_t h);
#define KB_FNV1A64_INIT UINT64_C(0xcbf29ce484222325)
void kb_bench_add_extra(kb_bench_result *r, const char *name, double value);
/* Marks the start/end of the measured region at the current simulated time. */
void kb_bench_mark_begin(kb_ctx *ctx, kb_bench_result *r);
void kb_bench_mark_end(kb_ctx *ctx, kb_bench_result *r);

/*
 * Checks got[i] (rounded outputs) against ref[i] (exact) with per-element bound
 * 0.5 ulp_f16(ref) + acc_bound[i] (acc_bound may be NULL); records the worst error and
 * returns 1 when all pass. For f32 outputs the ulp term uses f32's spacing.
 */
int kb_bench_check(kb_bench_result *r, kb_dtype dt, const float *got, const double *ref,
                   const double *acc_bound, size_t n, const char *what);
/* The same for elements index0 .. index0 + n - 1 of a larger output: the index a failure
 * message names counts from index0. */
int kb_bench_check_from(kb_bench_result *r, kb_dtype dt, const float *got, const double *ref,
                        const double *acc_bound, size_t n, size_t index0, const char *what);

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
 * Deterministic test data: x[i] = (h(seed, i) mod (2*range + 1) - range) / den, small
 * integers over a power of two, so products and sums stay exact in f32 for the sizes the
 * benches use and the host reference is exact.
 */
void kb_bench_pattern(float *x, size_t n, uint32_t seed, int range, float den);
/* Its value x[i] alone. */
float kb_bench_pattern_at(size_t i, uint32_t seed, int range, float den);
/*
 * A pattern as the values of a host write (kb_fill), computed only when the write records:
 * element (r, c) is x[r * ld + c] of kb_bench_pattern(seed, range, den), or x[c * ld + r]
 * with transpose (a transposed view). `p` must outlive the fill.
 */
typedef struct kb_bench_pat {
    uint32_t seed;
    int range;
    float den;
    int64_t ld;
    int transpose;
} kb_bench_pat;
kb_fill kb_bench_pattern_fill(const kb_bench_pat *p);

/* Reference gemm in double: ref (MxN) = a (MxK) @ b (KxN); bound[i] = K * 2^-24 * sum|a||b|
 * (the f32 accumulation error allowance). kb_hostgemm_ref's blocked, threaded loops; to check
 * an output without holding ref and bound, kb_hostgemm_check. */
void kb_bench_ref_gemm(const float *a, const float *b, size_t M, size_t N, size_t K, double *ref,
                       double *bound);

#endif
