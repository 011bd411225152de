/*
 * kb_oplog — the op log: one record per data operation of Phase 1, replayed by Phase 2.
 *
 * Phase 1 moves no tensor data; every DMA, IPCQ copy, host write, vector op and gemm appends a
 * kb_rec with its simulated t_start/t_end, a strictly increasing seq, and its operands as
 * PHYSICAL addresses (translated in Phase 1) with shapes and dtypes. Host writes carry their
 * bytes in the log's payload area (operand space KB_SPACE_PAYLOAD). Records are stored in
 * fixed-size chunks, so appending never moves earlier records and pointers stay valid.
 *
 * Operand shapes are 2-D (rows x cols, a 1-D vector is 1 x n) with a row stride `ld` in
 * elements (ld >= cols). Elementwise sources broadcast: a source with rows == 1 repeats over
 * the destination's rows, one with cols == 1 over its columns.
 *
 * Semantics of each kind (all arithmetic in f32, one rounding on store to dst's dtype):
 *   COPY    dst = src0 (same shape; converts dtype)        FILL  dst = imm[0]
 *   MATH1   dst = op(src0), op a kb_math1_op, AXPB uses imm[0]*x + imm[1]
 *   MATH2   dst = op(src0, src1), op a kb_math2_op
 *   FMA     dst = src0 * src1 + src2                        CLAMP dst = min(max(src0, imm[0]), imm[1])
 *   SOFTMAX dst = softmax(src0) along axis `op` (1: over each row's columns, 0: over each column)
 *   REDUCE  dst = sum|max of src0 along axis (flags & KB_REC_AXIS0 ? 0 : 1), op a kb_reduce_op;
 *           axis 1 gives rows x 1, axis 0 gives 1 x cols
 *   GEMM    dst(MxN) = src0(MxK) @ src1(KxN) [+ dst when flags & KB_REC_ACC]; k summed in
 *           ascending order in f32
 *   TRANSPOSE    dst (C x R) = src0 (R x C) transposed (dtype converted like COPY)
 *   ATTN_SOFTMAX dst = softmax over each row of y, y(i, j) = softcap(imm[0] * src0(i, j)) with
 *           softcap(v) = imm[1] * tanh(v / imm[1]) when imm[1] > 0 (else v); when op == 1
 *           (causal) element (i, j) is masked (left out, stored as 0) when j > i + offset,
 *           offset = (int64_t)src[1].addr (src[1] is no operand: nsrc is 1). A row with every
 *           element masked is all zeros. Same order of operations as SOFTMAX on the unmasked
 *           prefix of each row.
 *   GATHER  dst (n x d) row i = row id_i of src0 (the table, V x d, in memory), id_i = element
 *           i of src1 (1 x n or n x 1, any dtype, read as f32); an id that is not an integer
 *           in [0, V) (NaN included) gives a row of +0 (a vocab-parallel shard's miss)
 * Number formats (issue #16, host/kb_tl_q.c):
 *   DEQUANT dst(RxC) = x * s * imm[0], per element, the two products rounded in f32 in that
 *           order (x * imm[0] without a scale). x: src0(RxC), or with flags & KB_REC_QSPARSE the
 *           2:4-expanded src0 (R/2 x C kept values, R % 4 == 0) with src1 the metadata
 *           (ceil(R/8) x C bytes, dtype i8, raw bits): byte (g/2, j) holds group g = i/4 of
 *           column j in its low (g even) or high nibble as idx0 | idx1 << 2 (idx0 < idx1, the
 *           positions in the group of kept rows 2g and 2g + 1); other positions are +0.
 *           s (flags & KB_REC_QSCALE, the last source, sr x sc with R % sr == 0, C % sc == 0):
 *           element (i, j) uses s(i / (R/sr), j / (C/sc)) — per-channel, per-token and
 *           32-element MX blocks alike. nsrc = 1 + sparse + scale.
 * Test data:
 *   GEN     dst(RxC) = the seeded test values of kb_seedgen.h, generated where the record
 *           replays (no payload): element (i, j) = kb_seedgen_value(seed, tile0 + i, i0 + j, n)
 *           with tile0 = src[0].addr, i0 = src[1].addr, n = src[2].addr, seed = src[0].rows
 *           (nsrc 0: the sources are parameters, not operands); op KB_GEN_SIGN then applies
 *           kb_seedgen_sign with ntiles = src[0].cols (a product's inputs).
 *           Op KB_GEN_PAT: the benches' pattern instead, element (i, j) =
 *           kb_seedgen_pattern(p, seed, range) * imm[0] + imm[1] with p = r * ld + c, or
 *           c * ld + r when src[1].rows is 1 (transposed), r = row0 + i, c = col0 + j,
 *           row0 = src[0].addr, col0 = src[1].addr, ld = src[2].addr, seed = src[0].rows,
 *           range = src[0].cols (at most KB_SEEDGEN_PAT_MAX_RANGE), imm[0] a power of two
 *           (1/den: the product is exact), all positions in wrapping 64-bit arithmetic.
 *           Op KB_GEN_QW: a shard of a part of a quantized weight generated from a pattern,
 *           quantized where it replays (host/kb_tl_q.h's layouts and kb_mathfn.h's kb_mf_q*
 *           definitions: the host's quantization, bit for bit). nsrc 2, both in the payload:
 *           src[0] the row map (k uint64, 1 x 8k bytes), src[1] the column map (nb entries,
 *           1 x 32nb bytes; kb_seedgen.h's kb_seedgen_col) of one k x nb copy of the weight;
 *           src[2].rows the part (KB_SEEDGEN_QW_Q, _SCALE, _META), src[2].cols the format
 *           (KB_MF_QF_*), flags & KB_REC_QSPARSE 2:4-sparse. dst element (i, j) is part row
 *           (src[2].addr + i) mod P of copy column (src[2].ld + j) mod nb, P the part's rows
 *           per copy (kb_seedgen_qw_rows); dst's dtype is the part's (kb_seedgen_qw_dtype).
 */
#ifndef KB_OPLOG_H
#define KB_OPLOG_H

#include <stddef.h>
#include <stdint.h>

#include "kb_dtype.h"
#include "kb_err.h"
#include "kb_time.h"

typedef enum kb_rec_kind {
    KB_REC_COPY = 0,
    KB_REC_FILL,
    KB_REC_MATH1,
    KB_REC_MATH2,
    KB_REC_FMA,
    KB_REC_CLAMP,
    KB_REC_SOFTMAX,
    KB_REC_REDUCE,
    KB_REC_GEMM,
    /* neural-network kinds (kb_tl_nn) */
    KB_REC_TRANSPOSE,
    KB_REC_ATTN_SOFTMAX,
    KB_REC_GATHER,
    /* number formats (issue #16) */
    KB_REC_DEQUANT,
    /* test data (kb_seedgen.h) */
    KB_REC_GEN,
    KB_REC_NKINDS
} kb_rec_kind;

typedef enum kb_math1_op {
    KB_M1_EXP = 0, KB_M1_LOG, KB_M1_SQRT, KB_M1_ABS, KB_M1_SIGMOID, KB_M1_COS, KB_M1_SIN,
    KB_M1_NEG, KB_M1_RECIP, KB_M1_RELU, KB_M1_GELU, KB_M1_AXPB, KB_M1_RSQRT,
    /* kb_tl_nn: tanh, x * sigmoid(x), imm[0] * tanh(x / imm[0]) */
    KB_M1_TANH, KB_M1_SILU, KB_M1_SOFTCAP, KB_M1_NOPS
} kb_math1_op;

typedef enum kb_math2_op {
    KB_M2_ADD = 0, KB_M2_SUB, KB_M2_MUL, KB_M2_DIV, KB_M2_MAX, KB_M2_MIN, KB_M2_NOPS
} kb_math2_op;

typedef enum kb_reduce_op { KB_RED_SUM = 0, KB_RED_MAX, KB_RED_NOPS } kb_reduce_op;

enum { KB_SPACE_MEM = 0, KB_SPACE_PAYLOAD = 1 };

/* GEN ops */
enum { KB_GEN_PLAIN = 0, KB_GEN_SIGN = 1, KB_GEN_PAT = 2, KB_GEN_QW = 3 };

enum { KB_REC_ACC = 1u << 0, KB_REC_AXIS0 = 1u << 1 };
/* DEQUANT flags (number formats) */
enum { KB_REC_QSPARSE = 1u << 4, KB_REC_QSCALE = 1u << 5 };

typedef struct kb_opnd {
    uint64_t addr;   /* PA (KB_SPACE_MEM) or payload byte offset (KB_SPACE_PAYLOAD);
                        the replay planner rewrites MEM addresses into arena offsets */
    uint32_t rows, cols;
    uint32_t ld;     /* row stride in elements, >= cols */
    uint8_t dtype;   /* kb_dtype */
    uint8_t space;
    uint16_t pad_;
} kb_opnd;

typedef struct kb_rec {
    kb_time t_start, t_end;
    uint64_t seq;    /* assigned by kb_oplog_append */
    uint8_t kind;    /* kb_rec_kind */
    uint8_t op;      /* kb_math1_op / kb_math2_op / kb_reduce_op / softmax axis */
    uint8_t flags;   /* KB_REC_* */
    uint8_t nsrc;    /* sources used: COPY 1, FILL 0, MATH1 1, MATH2 2, FMA 3, ... GEMM 2,
                        TRANSPOSE 1, ATTN_SOFTMAX 1, GATHER 2 */
    uint32_t pe;     /* global index of the PE that issued it (host writes: UINT32_MAX) */
    float imm[2];
    kb_opnd dst;
    kb_opnd src[3];
} kb_rec;

/* Number of bytes an operand spans from its addr: ((rows-1)*ld + cols) * elem size. */
static inline uint64_t kb_opnd_span(const kb_opnd *o)
{
    if (o->rows == 0 || o->cols == 0)
        return 0;
    return ((uint64_t)(o->rows - 1) * o->ld + o->cols) * kb_dtype_size((kb_dtype)o->dtype);
}

/* Fills a contiguous operand. */
static inline kb_opnd kb_opnd_make(uint64_t addr, uint32_t rows, uint32_t cols, kb_dtype t)
{
    kb_opnd o;
    o.addr = addr; o.rows = rows; o.cols = cols; o.ld = cols;
    o.dtype = (uint8_t)t; o.space = KB_SPACE_MEM; o.pad_ = 0;
    return o;
}

const char *kb_rec_kind_name(kb_rec_kind k);

typedef struct kb_oplog kb_oplog;

kb_oplog *kb_oplog_create(void);
void kb_oplog_destroy(kb_oplog *log); /* NULL is a no-op */

/* Copies *r in, assigning the next seq (returned in *seq if non-NULL). KB_ERR_NOMEM. */
int kb_oplog_append(kb_oplog *log, const kb_rec *r, uint64_t *seq);
/* Copies n bytes into the payload area; *off receives their payload offset. KB_ERR_NOMEM. */
int kb_oplog_add_payload(kb_oplog *log, const void *data, size_t n, uint64_t *off);
/* Appends n bytes for the caller to write at *at (valid until the next payload append); *off
 * receives their payload offset. Their contents are unspecified until written. KB_ERR_NOMEM. */
int kb_oplog_reserve_payload(kb_oplog *log, size_t n, uint64_t *off, uint8_t **at);

size_t kb_oplog_count(const kb_oplog *log);
const kb_rec *kb_oplog_at(const kb_oplog *log, size_t i); /* i < count; stable pointer */
const uint8_t *kb_oplog_payload(const kb_oplog *log);     /* base; may move on add_payload */
size_t kb_oplog_payload_size(const kb_oplog *log);
/* The shared-memory file (memfd) holding the payload, whose first kb_oplog_payload_size bytes
 * are the payload; -1 when the payload is heap memory (or empty). Owned by the log: a reader
 * may map it (read-only) or dup it, never close it. */
int kb_oplog_payload_fd(const kb_oplog *log);

/* Number of records already replayed (maintained by the replayer). */
size_t kb_oplog_replayed(const kb_oplog *log);
void kb_oplog_set_replayed(kb_oplog *log, size_t n);

/*
 * Cuts: a cut at index c orders every record before it ahead of every record from c on,
 * whatever their times — the planner's order is (epoch, t_start, seq), the epoch being the
 * number of cuts at or below a record's index. A flush covers whole epochs' worth of records
 * (it always ends at the log's count), so replaying the log in one flush or in several that
 * end at cuts gives the same order: that is what lets a device backend replay while Phase 1
 * still runs (kb_runtime.h). kb_oplog_cut marks one at the current count (no-op when empty or
 * already marked there); KB_ERR_NOMEM. kb_oplog_cuts_in sets *cuts to the ascending cuts c
 * (record indices, which are seqs) with first < c < end and returns their number (the pointer stays valid until the next cut).
 */
int kb_oplog_cut(kb_oplog *log);
size_t kb_oplog_cuts_in(const kb_oplog *log, size_t first, size_t end, const uint64_t **cuts);

#endif
