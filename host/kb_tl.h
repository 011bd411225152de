/*
 * kb_tl — the kernel language: a Triton-like API that kernels (C functions run as fibers on
 * simulated PEs) use to move and compute data.
 *
 * A kb_val is a handle to a 2-D block in simulated memory (address, shape, dtype) — never the
 * data: Phase 1 only times the operation and appends an op record, so a kernel must not
 * branch on tensor values. Each call first costs the PE_CPU's issue overhead, then occupies
 * the unit that does the work (PE_DMA and the memories/links of its route for load/store,
 * PE_MATH for elementwise work, PE_GEMM for dot) and returns when the work is done.
 *
 *  - tl_load copies a block addressed by a virtual address into the PE's scratch (a DMA, also
 *    from peers' memories); tl_ref returns a handle to the block where it is, without a copy
 *    (tl_dot streams such HBM operands through SchedulerV2's tiles).
 *  - Compute results live in scratch, in f32 (computation is f32; a value is rounded once when
 *    tl_store writes it into a tensor of a narrower dtype).
 *  - Elementwise operands must be in the PE's own TCM ranges (load them first); sources with
 *    one row or one column broadcast.
 *  - tl_free releases a scratch value early (long loops); everything left is released when
 *    the kernel returns.
 * Misuse (unmapped address, shape mismatch, scratch exhausted) stops the simulation with a
 * message naming the kernel and PE; the call does not return.
 * The names are tl_* (not kb_tl_*) on purpose: they are the kernel DSL of DESIGN §7.
 */
#ifndef KB_TL_H
#define KB_TL_H

#include <stdint.h>

#include "kb_runtime.h"

typedef struct kb_val {
    kb_pa pa;
    uint32_t rows, cols;   /* contiguous row-major block */
    uint8_t dtype;         /* kb_dtype */
    uint8_t scratch;       /* 1 = owned scratch allocation */
} kb_val;

typedef struct kb_shape {
    uint32_t rows, cols;
} kb_shape;

static inline kb_shape kb_shape1(uint32_t n) { kb_shape s = { 1, n }; return s; }
static inline kb_shape kb_shape2(uint32_t r, uint32_t c) { kb_shape s = { r, c }; return s; }
#define KB_SHAPE1(n) kb_shape1((uint32_t)(n))
#define KB_SHAPE2(r, c) kb_shape2((uint32_t)(r), (uint32_t)(c))

static inline int64_t tl_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* axis 0 = PE within the cube, 1 = cube within the SIP, 2 = SIP (all relative to the grid) */
int tl_program_id(kb_tl *tl, int axis);
int tl_num_programs(kb_tl *tl, int axis);

kb_val tl_load(kb_tl *tl, kb_va va, kb_shape s, kb_dtype dt);
kb_val tl_ref(kb_tl *tl, kb_va va, kb_shape s, kb_dtype dt);
/* Stores v at va, converting to the destination tensor's dtype. */
void tl_store(kb_tl *tl, kb_va va, kb_val v);

kb_val tl_dot(kb_tl *tl, kb_val a, kb_val b);
/* acc += a @ b in place (acc must be an f32 scratch value of shape M x N). */
void tl_dot_acc(kb_tl *tl, kb_val acc, kb_val a, kb_val b);

kb_val tl_add(kb_tl *tl, kb_val a, kb_val b);
kb_val tl_sub(kb_tl *tl, kb_val a, kb_val b);
kb_val tl_mul(kb_tl *tl, kb_val a, kb_val b);
kb_val tl_div(kb_tl *tl, kb_val a, kb_val b);
kb_val tl_maximum(kb_tl *tl, kb_val a, kb_val b);
kb_val tl_minimum(kb_tl *tl, kb_val a, kb_val b);

kb_val tl_exp(kb_tl *tl, kb_val a);
kb_val tl_log(kb_tl *tl, kb_val a);
kb_val tl_sqrt(kb_tl *tl, kb_val a);
kb_val tl_rsqrt(kb_tl *tl, kb_val a);
kb_val tl_abs(kb_tl *tl, kb_val a);
kb_val tl_sigmoid(kb_tl *tl, kb_val a);
kb_val tl_cos(kb_tl *tl, kb_val a);
kb_val tl_sin(kb_tl *tl, kb_val a);
kb_val tl_neg(kb_tl *tl, kb_val a);
kb_val tl_relu(kb_tl *tl, kb_val a);
kb_val tl_gelu(kb_tl *tl, kb_val a);
/* mul * a + add */
kb_val tl_scale(kb_tl *tl, kb_val a, float mul, float add);

kb_val tl_fma(kb_tl *tl, kb_val a, kb_val b, kb_val c);
kb_val tl_clamp(kb_tl *tl, kb_val a, float lo, float hi);
/* axis 1: over each row's columns; axis 0: over each column's rows */
kb_val tl_softmax(kb_tl *tl, kb_val a, int axis);
kb_val tl_sum(kb_tl *tl, kb_val a, int axis);
kb_val tl_max(kb_tl *tl, kb_val a, int axis);

/* A scratch value filled with `value` (f32). */
kb_val tl_full(kb_tl *tl, kb_shape s, float value);

void tl_free(kb_tl *tl, kb_val v);

/* For library layers (IPCQ, collectives): the PE and context a kernel runs on. */
kb_pe_hw *tl_pe(kb_tl *tl);
kb_ctx *tl_ctx(kb_tl *tl);
const char *tl_kernel_name(kb_tl *tl);
/* Stops the simulation with code and a message naming this kernel and PE. */
_Noreturn void tl_fail(kb_tl *tl, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
