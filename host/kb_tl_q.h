/*
 * kb_tl_q — number formats and 2:4 structured sparsity for gemm (issue #16, docs/formats.md):
 * weights stored as int8 with per-channel f32 scales, MXINT8 (OCP MX v1.0: 32-element blocks
 * along K sharing an E8M0 scale, int8 elements read as fixed point with 6 fractional bits),
 * fp8 e4m3 / e5m2 (OCP FP8) with per-channel f32 scales, or f16 / bf16; any of them
 * optionally 2:4-sparse along K (two kept values and their 2-bit positions per group of 4).
 *
 * Host side: kb_qweight_create quantizes a K x N f32 weight (after 2:4 pruning) into up to
 * three tensors (elements, scales, metadata) laid out per PE shard like an f16 weight with the
 * same dp; kb_qweight_host_values / kb_qact_host_values give the exact f32 values the device
 * computes with, for host references. Kernel side: tl_qref names a PE's shard, tl_dot_q
 * computes y = x @ W: 8-bit formats quantize x on PE_MATH first (int8/fp8 per token, MXINT8
 * per 32-block of k), then the gemm occupies PE_GEMM at the format's rate
 * (pe.gemm.*_speedup) while SchedulerV2 streams W's parts in the format's bytes.
 *
 * Numerics (what replay computes, identical on every backend): operands are dequantized
 * exactly as kb_*_host_values say (q * scale rounded once in f32; exact for MXINT8) and
 * multiplied by the f32 gemm, k ascending. A sparse weight is expanded with +0 at pruned
 * positions, so the result is the dense gemm of the pruned matrix (a unit that skips the
 * pruned terms can differ only in the sign of an exact zero). Hardware int8 units sum q*q in
 * int32 and scale once: that differs from this by f32 rounding only, far below the format's
 * quantization error. Limits: x must be a local value; W's shard must be one contiguous block
 * per part; MXINT8 needs K % 32 == 0, sparse K % 4 == 0 (per shard too).
 */
#ifndef KB_TL_Q_H
#define KB_TL_Q_H

#include <stdint.h>

#include "kb_config.h"
#include "kb_seedgen.h"
#include "kb_runtime.h"
#include "kb_tl.h"

typedef enum kb_qfmt { KB_QF_F16 = 0, KB_QF_BF16, KB_QF_INT8, KB_QF_MXINT8, KB_QF_FP8E4M3,
                       KB_QF_FP8E5M2, KB_QF_COUNT } kb_qfmt;

const char *kb_qfmt_name(kb_qfmt f);    /* "f16" "bf16" "int8" "mxint8" "fp8e4m3" "fp8e5m2" */
int kb_qfmt_from_name(const char *s);  /* -1 unknown */
/* Storage bits per element incl. block scales: f16/bf16 16, int8 and fp8 8 (+ one f32 scale
 * per column), mxint8 8.25. */
double kb_qfmt_bits(kb_qfmt f);
/* The element dtype of a format's q tensor. */
kb_dtype kb_qfmt_dtype(kb_qfmt f);

/* A K x N weight (y = x @ W) in format fmt, optionally 2:4-sparse along K, as tensors on the
 * context. Layout per PE shard exactly like a f16 weight split by dp (column-wise or row-wise
 * over cubes x pes); shard j of every part tensor belongs to the same PE. */
typedef struct kb_qweight {
    kb_qfmt fmt; int sparse; int64_t k, n;      /* full (this rank's) sizes */
    kb_tensor *q;      /* elements: K x N (dense) or K/2 x N (sparse kept values) */
    kb_tensor *scale;  /* int8/fp8: 1 x N f32 per-channel; mxint8: K/32 x N E8M0; f16/bf16: NULL */
    kb_tensor *meta;   /* sparse: ceil(K/8) x N i8 bytes, 4 bits per group of 4 along K
                        * (kb_oplog.h DEQUANT); else NULL */
} kb_qweight;

/*
 * A weight's values as a gather of pattern matrices (kb_seedgen.h): element (i, j) of one copy
 * is kb_seedgen_mapped(rows[i], &cols[j]). A recording kb_qweight_create_rep given one (or
 * whose w is itself a pattern, kb_fill_seedgen_col) records the weight as GEN records that
 * quantize where they replay (op KB_GEN_QW: no payload but the maps, no host quantization);
 * w must still give the same values, for host references.
 */
typedef struct kb_qw_map {
    const uint64_t *rows;         /* a copy's rows: source rows, KB_SEEDGEN_ROW_ZERO for 0 */
    const kb_seedgen_col *cols;   /* a copy's columns */
} kb_qw_map;
/* Column col of a pattern fill (a kb_fill_gen of kind KB_FILL_GEN_PATTERN without a term) as a
 * map entry, with rows counted from the fill's origin; 0 (c unspecified) when f is none. */
int kb_fill_seedgen_col(const kb_fill *f, int64_t col, kb_seedgen_col *c);
/* An f16 / bf16 tensor (its rows x cols one copy) whose values are map's, generated where it
 * replays (a GEN record per shard). KB_ERR_INVAL for another dtype. */
int kb_tensor_from_map(kb_ctx *ctx, const kb_tensor_desc *d, const kb_qw_map *map,
                       kb_tensor **out);

/* Quantizes w (K x N, evaluated only when the context records) into new tensors; on error
 * nothing is left allocated. KB_ERR_INVAL for bad sizes (message in kb_ctx_err). w's fn (as
 * kb_qweight_host_values') is called on blocks of rows from several threads at once: it must
 * be a pure function of the position (every fill of kbcl's benches and layers is). */
int kb_qweight_create(kb_ctx *ctx, const char *name, int64_t k, int64_t n, kb_qfmt fmt,
                      int sparse, kb_dp_policy dp, const kb_fill *w, kb_qweight *out);
/* The same for a K x N weight made of rk x rn copies of the K/rk x N/rn weight w (a weight
 * each group of PEs holds a copy of): w is evaluated and quantized once, and the result is
 * the one kb_qweight_create gives for the repeated values (quantization keeps to columns,
 * MX blocks and 2:4 groups, which the copies must keep whole: K/rk a multiple of 32 for
 * mxint8 and of 8 for 2:4 when rk > 1; KB_ERR_INVAL otherwise). */
int kb_qweight_create_rep(kb_ctx *ctx, const char *name, int64_t k, int64_t n, kb_qfmt fmt,
                          int sparse, kb_dp_policy dp, const kb_fill *w, int64_t rk, int64_t rn,
                          const kb_qw_map *map, kb_qweight *out);
void kb_qweight_free(kb_qweight *w);

/* Host-side: the dequantized (and pruned) f32 values the device weight holds, K x N, for
 * references. 0 or KB_ERR_INVAL / KB_ERR_NOMEM. */
int kb_qweight_host_values(kb_qfmt fmt, int sparse, int64_t k, int64_t n, const kb_fill *w,
                           float *out);
/* The same for an activation x (m x k row-major f32, the values of tl_dot_q's x) quantized
 * the way tl_dot_q does it; f16/bf16: x unchanged (the gemm takes x as it is). */
int kb_qact_host_values(kb_qfmt fmt, int64_t m, int64_t k, const float *x, float *out);
/* Magnitude pruning per group of 4 consecutive k of each column: keeps the 2 largest |w|
 * (ties: the lower index), zeroes the others (+0). In place; k % 4 == 0. */
void kb_prune_2_4(float *w, int64_t k, int64_t n);

/* Kernel side: the PE's shard j of a weight (the kernel gets the part tensors' VAs in kargs) */
typedef struct kb_qref { kb_val q, scale, meta; uint8_t fmt, sparse; uint32_t k, n; } kb_qref;
kb_qref tl_qref(kb_tl *tl, kb_va q, kb_va scale, kb_va meta, uint32_t k, uint32_t n,
                kb_qfmt fmt, int sparse);     /* k x n shard; VAs of shard j's blocks */
/* y = x @ W for a local activation x (m x k, f16/f32 value): quantizes x per row (int8/fp8:
 * per-token f32 scale; mxint8: 32-blocks along k) on PE_MATH when fmt is 8-bit, then the
 * gemm on PE_GEMM at the format's rate (topology.yaml), streaming W's parts from memory
 * (SchedulerV2; bytes moved follow the format); returns m x n f32. f16/bf16 dense = tl_dot. */
kb_val tl_dot_q(kb_tl *tl, kb_val x, kb_qref w);
/* Closed form of tl_dot_q's gemm-unit time for tests/docs (ns, no DMA):
 * fixed_ns + 2mnk / (flops_per_ns * speedup(fmt) * (sparse ? sparse_speedup : 1)), the
 * division rounded up to whole picoseconds as every occupancy is. */
double kb_qgemm_ns(const kb_topo_cfg *c, kb_qfmt fmt, int sparse, uint64_t m, uint64_t n, uint64_t k);
/* The PE_GEMM rate tl_dot_q charges for fmt (2:4 sparse or not), in flops per microsecond as
 * the engine rounds it (flops_per_ns * speedup * 1000, to the nearest integer); f16 dense is
 * the unit's base rate, which tl_dot charges for every dtype. */
uint64_t kb_qgemm_flops_per_us(const kb_topo_cfg *c, kb_qfmt fmt, int sparse);
/* Bytes a K x N weight occupies in fmt: its elements (K/2 rows when sparse), its scales
 * (int8/fp8 one f32 per column, MXINT8 one byte per 32 elements of a column) and its 2:4
 * metadata (a byte per 8 rows of a column), each counted once for the whole matrix. */
uint64_t kb_qweight_bytes(kb_qfmt fmt, int sparse, int64_t k, int64_t n);

#endif
