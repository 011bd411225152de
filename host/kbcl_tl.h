/*
 * kbcl_tl — the kernel language (public API, docs/api.md): a Triton-like API that kernels (C functions run as fibers on
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
 * The names are tl_* (not kb_tl_*) on purpose: they are the language kernels are written in,
 * short like the Triton tl.* calls they mirror, not a module's API.
 */
#ifndef KBCL_TL_H
#define KBCL_TL_H

#include <stdint.h>

#include "kbcl_runtime.h"

typedef struct kb_val {
    kb_pa pa;
    uint32_t rows, cols;   /* row-major block */
    uint8_t dtype;         /* kb_dtype */
    uint8_t scratch;       /* 1 = owned scratch allocation (never a view) */
    uint16_t pad_;
    uint32_t ld;           /* row stride in elements; 0 = cols (contiguous) */
} kb_val;

/* Row stride of v in elements. */
static inline uint32_t kb_val_ld(kb_val v) { return v.ld ? v.ld : v.cols; }
static inline int kb_val_contiguous(kb_val v) { return v.ld == 0 || v.ld == v.cols || v.rows <= 1; }

typedef struct kb_shape {
    uint32_t rows, cols;
} kb_shape;

static inline kb_shape kb_shape1(uint32_t n) { kb_shape s = { 1, n }; return s; }
static inline kb_shape kb_shape2(uint32_t r, uint32_t c) { kb_shape s = { r, c }; return s; }
#define KB_SHAPE1(n) kb_shape1((uint32_t)(n))
#define KB_SHAPE2(r, c) kb_shape2((uint32_t)(r), (uint32_t)(c))

static inline int64_t tl_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* axis 0 = PE within the cube, 1 = cube within the SIP, 2 = SIP (all relative to the grid) */
KB_API int tl_program_id(kb_tl *tl, int axis);
KB_API int tl_num_programs(kb_tl *tl, int axis);

KB_API kb_val tl_load(kb_tl *tl, kb_va va, kb_shape s, kb_dtype dt);
KB_API kb_val tl_ref(kb_tl *tl, kb_va va, kb_shape s, kb_dtype dt);
/* tl_load whose DMA the kernel does not wait for: the call returns after its issue cost, and
 * the value's data are there at *ready (simulated ps). Before an op reads the value the kernel
 * waits until then (tl_wait_time), so a load can run on PE_DMA while PE_MATH computes. */
KB_API kb_val tl_load_async(kb_tl *tl, kb_va va, kb_shape s, kb_dtype dt, int64_t *ready);
/* Sleeps until simulated time t (ps) if it is in the future. */
KB_API void tl_wait_time(kb_tl *tl, int64_t t);
/* Stores v at va, converting to the destination tensor's dtype. */
KB_API void tl_store(kb_tl *tl, kb_va va, kb_val v);
/* tl_store posted: the kernel goes on after the call's issue cost and gets the time the data
 * have landed (the DMA's end). v must stay as it is until then: free it with tl_free_after
 * at that time, not tl_free. The kernel (or thread) ends no earlier than its last posted
 * store has landed, so what the next launch reads is there. tl_store2d_async likewise. */
KB_API int64_t tl_store_async(kb_tl *tl, kb_va va, kb_val v);

/*
 * Strided blocks (sub-matrices). `ld` is the row stride of the block in memory, in elements
 * (>= s.cols): the block at va is rows of s.cols elements, ld apart — e.g. columns
 * [c0, c0 + w) of a row-major R x C shard are tl_load2d(va + c0 * es, (R, w), C). The whole
 * span must lie in one shard's mapping. A DMA of a strided block costs the bytes it moves
 * (rows * cols * element size), like a contiguous one.
 *  - tl_load2d copies the block into a new contiguous scratch value; tl_ref2d refers to it in
 *    place (for tl_dot operands streamed by SchedulerV2).
 *  - tl_store2d writes v into the strided block at va (the tensor's dtype).
 *  - tl_load_into DMAs the block at va into an existing local value or view `dst` (same shape;
 *    dst's dtype is the tensor's), e.g. to assemble a value from pieces held by several PEs.
 *  - tl_view is a sub-block [r0, r0 + rows) x [c0, c0 + cols) of v sharing its storage (not
 *    owned: never tl_free a view). Views are valid operands of every compute op and of
 *    tl_store/tl_copy; tl_send needs a contiguous value.
 *  - tl_copy(dst, src): dst = src elementwise (dtype converted) on PE_MATH, e.g. to
 *    concatenate values into views of one value. Both must be local.
 */
KB_API kb_val tl_load2d(kb_tl *tl, kb_va va, kb_shape s, uint32_t ld, kb_dtype dt);
KB_API kb_val tl_ref2d(kb_tl *tl, kb_va va, kb_shape s, uint32_t ld, kb_dtype dt);
KB_API void tl_store2d(kb_tl *tl, kb_va va, uint32_t ld, kb_val v);
KB_API int64_t tl_store2d_async(kb_tl *tl, kb_va va, uint32_t ld, kb_val v);
KB_API void tl_load_into(kb_tl *tl, kb_val dst, kb_va va, uint32_t ld);
/* tl_load_into posted: the kernel goes on after the issue cost and gets the time the data
 * are in dst; it waits for it (tl_wait_time) before an op reads dst. So several blocks can
 * be loaded into views of one value at once, without a copy each. */
KB_API int64_t tl_load_into_async(kb_tl *tl, kb_val dst, kb_va va, uint32_t ld);
KB_API kb_val tl_view(kb_tl *tl, kb_val v, uint32_t r0, uint32_t c0, uint32_t rows, uint32_t cols);
KB_API void tl_copy(kb_tl *tl, kb_val dst, kb_val src);

KB_API kb_val tl_dot(kb_tl *tl, kb_val a, kb_val b);
/* acc += a @ b in place (acc must be an f32 scratch value of shape M x N). */
KB_API void tl_dot_acc(kb_tl *tl, kb_val acc, kb_val a, kb_val b);

KB_API kb_val tl_add(kb_tl *tl, kb_val a, kb_val b);
KB_API kb_val tl_sub(kb_tl *tl, kb_val a, kb_val b);
KB_API kb_val tl_mul(kb_tl *tl, kb_val a, kb_val b);
KB_API kb_val tl_div(kb_tl *tl, kb_val a, kb_val b);
KB_API kb_val tl_maximum(kb_tl *tl, kb_val a, kb_val b);
KB_API kb_val tl_minimum(kb_tl *tl, kb_val a, kb_val b);
/*
 * a op b computed in f32 as tl_add/tl_mul/tl_maximum/tl_minimum do, with the result written
 * in dtype dt (f32, f16 or bf16; rounded to nearest even as it is written): one PE_MATH pass,
 * the same time as the f32 form. What a reduction that forwards its partial results in the
 * buffer's dtype uses (the collectives' ring reduce-scatter).
 */
typedef enum kb_binop { KB_BIN_ADD = 0, KB_BIN_MUL, KB_BIN_MAX, KB_BIN_MIN } kb_binop;
KB_API kb_val tl_binary_as(kb_tl *tl, kb_binop op, kb_val a, kb_val b, kb_dtype dt);
/* The same into an existing local value or view `dst` of the result's shape (rounded to its
 * dtype): a reduction that assembles its result in place. dst may be one of the operands. */
KB_API void tl_binary_into(kb_tl *tl, kb_binop op, kb_val dst, kb_val a, kb_val b);

KB_API kb_val tl_exp(kb_tl *tl, kb_val a);
KB_API kb_val tl_log(kb_tl *tl, kb_val a);
KB_API kb_val tl_sqrt(kb_tl *tl, kb_val a);
KB_API kb_val tl_rsqrt(kb_tl *tl, kb_val a);
KB_API kb_val tl_abs(kb_tl *tl, kb_val a);
KB_API kb_val tl_sigmoid(kb_tl *tl, kb_val a);
KB_API kb_val tl_cos(kb_tl *tl, kb_val a);
KB_API kb_val tl_sin(kb_tl *tl, kb_val a);
KB_API kb_val tl_neg(kb_tl *tl, kb_val a);
KB_API kb_val tl_relu(kb_tl *tl, kb_val a);
KB_API kb_val tl_gelu(kb_tl *tl, kb_val a);
/* mul * a + add */
KB_API kb_val tl_scale(kb_tl *tl, kb_val a, float mul, float add);

KB_API kb_val tl_fma(kb_tl *tl, kb_val a, kb_val b, kb_val c);
KB_API kb_val tl_clamp(kb_tl *tl, kb_val a, float lo, float hi);
/* axis 1: over each row's columns; axis 0: over each column's rows */
KB_API kb_val tl_softmax(kb_tl *tl, kb_val a, int axis);
KB_API kb_val tl_sum(kb_tl *tl, kb_val a, int axis);
KB_API kb_val tl_max(kb_tl *tl, kb_val a, int axis);

/* A scratch value filled with `value` (f32). */
KB_API kb_val tl_full(kb_tl *tl, kb_shape s, float value);

KB_API void tl_free(kb_tl *tl, kb_val v);
/* Frees scratch value v once simulated time reaches t (e.g. when a posted send that reads it
 * has landed): until then its memory is not handed out again. Non-scratch values: no-op. */
KB_API void tl_free_after(kb_tl *tl, kb_val v, int64_t t);

/*
 * A second thread of the kernel on the same PE (a channel, as NCCL runs several CTAs per
 * GPU): fn(child, arg) runs as a fiber of its own from now on, with its own scratch values
 * and the parent's program ids, and shares the PE's units, DMA channels, ports and IPCQ queue
 * pairs (two threads must not use the same side of one queue pair). tl_join waits for it; a
 * kernel joins every thread it forked before it returns (the runtime frees them with the
 * launch). Forking costs the PE_CPU's issue overhead, like any call.
 */
KB_API kb_tl *tl_fork(kb_tl *tl, void (*fn)(kb_tl *child, void *arg), void *arg);
KB_API void tl_join(kb_tl *tl, kb_tl *child);

/*
 * Notifications between the kernels of one launch on one SIP: every PE holds a counter per
 * slot (0 .. KB_TL_NOTIFY_SLOTS - 1), a flag word another PE's DMA engine writes.
 * tl_notify first waits until this kernel's posted stores have landed (so the target sees
 * what was written before it), then sends an 8-byte write from this PE's TCM to the TCM of
 * PE `pe` of cube `cube` of the SIP (the launch's grid coordinates: program ids 0 and 1),
 * which adds one to the slot when it lands; the kernel goes on after the issue, and ends no
 * earlier than the landing. tl_wait_notify blocks until `count` notifications have landed in
 * the slot and takes them. Only a launch's kernels (not threads of tl_fork) use them; the
 * target must be in the grid and still running, and a kernel must take every notification
 * sent to it before it returns (docs/timing-model.md §5.2).
 */
#define KB_TL_NOTIFY_SLOTS 8
KB_API void tl_notify(kb_tl *tl, int cube, int pe, int slot);
KB_API void tl_wait_notify(kb_tl *tl, int slot, int count);
/* Every kernel of the launch on this SIP reaches this call before any passes it: each PE
 * notifies its cube's PE 0, which (all of its cube in) notifies cube 0's PE 0; that one
 * releases its own PEs, then the other cubes' PE 0, which release theirs. A launch's grid on
 * a SIP is its barrier's members; every member must call it the same number of times. */
KB_API void tl_barrier(kb_tl *tl);

/* The context a kernel runs on, and its name. */
KB_API kb_ctx *tl_ctx(kb_tl *tl);
KB_API const char *tl_kernel_name(kb_tl *tl);
/* Stops the simulation with code and a message naming this kernel and PE. */
KB_API _Noreturn void tl_fail(kb_tl *tl, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
