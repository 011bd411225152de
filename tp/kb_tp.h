/*
 * kb_tp — Megatron-style tensor parallelism over the rank = SIP process group.
 *
 * initialize_model_parallel(tp) requires tp == the world size (other splits are not
 * implemented). Layers hold the rank's slice of a full weight given by the host:
 *   ColumnParallelLinear(in, out): W (in x out/ws) = columns [r*out/ws, (r+1)*out/ws) of the
 *     full W, bias likewise; forward y_local = x @ W + b (optionally GeLU), no communication.
 *   RowParallelLinear(in, out): W (in/ws x out) = rows [r*in/ws, ...) of the full W; forward
 *     computes the rank's partial x_local @ W, all-reduces it (SUM) and adds the full bias.
 * Inside a rank the gemm is spread over the SIP's PEs: the local columns (column-parallel) or
 * rows (row-parallel) are split evenly over P PEs (the largest P <= PEs of the SIP that
 * divides them, filling whole cubes beyond one cube); x is replicated on those PEs. The
 * row-parallel partial sums live one m x out block per PE of the SIP (zeros on the PEs that
 * compute nothing) and are reduced by the process group's all-reduce, which must be
 * hierarchical_allreduce (every PE); the result is replicated on every PE.
 * gather_from_tp_region concatenates the ranks' column slices with the process group's (ring)
 * all_gather (kb_dist_coll.c).
 * Tensors are f16 in memory; partial sums are f32; all arithmetic is f32.
 */
#ifndef KB_TP_H
#define KB_TP_H

#include "kb_dist.h"
#include "kb_runtime.h"

int kb_tp_initialize_model_parallel(kb_ctx *ctx, int tp);
int kb_tp_get_rank(kb_ctx *ctx);
int kb_tp_world_size(kb_ctx *ctx);

typedef struct kb_tp_linear {
    int column;          /* 1 column-parallel, 0 row-parallel */
    int64_t in, out;     /* full sizes */
    int64_t local_in, local_out;
    int pes, cubes;      /* the PEs that hold the weight slice */
    kb_tensor *w, *b;    /* b NULL without bias */
} kb_tp_linear;

/* w_full: in x out row-major f32 (the same on every rank); b_full: out values or NULL. */
int kb_tp_column_linear(kb_ctx *ctx, int64_t in, int64_t out, const float *w_full,
                        const float *b_full, kb_tp_linear *lin);
int kb_tp_row_linear(kb_ctx *ctx, int64_t in, int64_t out, const float *w_full,
                     const float *b_full, kb_tp_linear *lin);

/* A tensor of m rows replicated on the PEs a column-parallel layer uses (its input x). */
int kb_tp_input(kb_ctx *ctx, const kb_tp_linear *lin, int64_t m, const float *x, kb_tensor **out);

/* The same with the values as fills (kb_runtime.h: element (i, j) of the full weight, bias
 * (1 x out) or input is the fill's (i, j)): the rank's slice is read through the fill, only
 * when the context records, so a timing-only run never builds or slices a weight. */
int kb_tp_column_linear_fill(kb_ctx *ctx, int64_t in, int64_t out, const kb_fill *w_full,
                             const kb_fill *b_full, kb_tp_linear *lin);
int kb_tp_row_linear_fill(kb_ctx *ctx, int64_t in, int64_t out, const kb_fill *w_full,
                          const kb_fill *b_full, kb_tp_linear *lin);
int kb_tp_input_fill(kb_ctx *ctx, const kb_tp_linear *lin, int64_t m, const kb_fill *x,
                     kb_tensor **out);

/* y_local (m x local_out, column-wise over lin's PEs) = x @ W + b, then GeLU if gelu. */
int kb_tp_column_forward(kb_ctx *ctx, const kb_tp_linear *lin, kb_tensor *x, int gelu,
                         kb_tensor **y_local);
/* y (PEs*m x out, one replicated m x out block per PE of the SIP) = all_reduce(x_local @ W) + b.
 * x_local must be split over the same PEs as W's rows (a column layer's output). */
int kb_tp_row_forward(kb_ctx *ctx, const kb_tp_linear *lin, kb_tensor *x_local, kb_tensor **y);

/* all_gather of a column layer's output: y (PEs*m x out_full), the whole m x out_full on
 * every PE of the SIP. */
int kb_tp_gather_from_tp_region(kb_ctx *ctx, kb_tensor *y_local, kb_tensor **y);

/* Picks the PE grid for splitting n columns/rows: *cubes x *pes PEs, cubes*pes | n. */
void kb_tp_pick_pes(const kb_machine *m, int64_t n, int *cubes, int *pes);

/* Sums every partial block of `partial` (one m x n f32 block per PE of the SIP, row-wise)
 * over all PEs of all ranks, adds bias (1 x n, may be NULL), into y (f16, same layout). */
int kb_tp_reduce_blocks(kb_ctx *ctx, kb_tensor *partial, kb_tensor *bias, kb_tensor **y);

#endif
