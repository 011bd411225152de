/*
 * kb_opencl — the OpenCL backend of the Phase-2 replay (kb_backend_ops): its life (created on
 * a discovered device, cloned for a device server's sessions, trimmed, destroyed) and its
 * flushes. A backend owns one context, in-order queue, program and kernel set on one device,
 * and its device-resident memory (kb_resident.h, primitives in kb_opencl_mem.c), plus a
 * buffer for the argument tables. A resident flush's begin() only points the launches at the
 * resident buffers; run_batch() only appends one kb_clent per record to a host table and one
 * launch per kind group (the planner sorts a batch by kind; a group whose records need more
 * than KB_OCL_SLOTS of the arena's blocks gets several), so it costs no driver calls;
 * end() uploads all tables of the flush in one write, enqueues every launch in batch order
 * (the in-order queue keeps dependent batches apart) and waits once. Called with a host arena
 * (bench-self's synthetic batches), begin() uploads it and the payload into buffers of their
 * own and end() reads it back. Every launch carries a profiling event, so the device time of
 * the replay is known (kb_opencl_kernel_ms), and the set-up is timed (kb_opencl_setup_of).
 * The program and its cache are kb_opencl_prog.c's, the drivers' environment and discovery
 * kb_opencl_env.c's, the public accessors kb_opencl_remote.c's (kb_opencl_int.h lists what
 * they share). Limits: little-endian devices; one device per backend; a device without
 * correctly rounded division/sqrt or without f32 denormals still runs, but may differ from
 * ref in the last bit.
 */
#include "kb_opencl.h"
#include "kb_opencl_int.h"
#include "kb_progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KBCL_HAVE_OPENCL

#include <time.h>

#include <CL/cl.h>

#include "kb_mathfn.h"
#include "kb_resident.h"
#include "kb_seedgen.h"

_Static_assert(KB_GEMM_WM % 4 == 0 && KB_GEMM_WN % 4 == 0 && KB_GEMM_TM % KB_GEMM_WM == 0 &&
               KB_GEMM_TN % KB_GEMM_WN == 0, "gemm tile shape");
_Static_assert(KB_MF_M1_GELU == KB_M1_GELU && KB_MF_M1_AXPB == KB_M1_AXPB &&
               KB_MF_M1_RSQRT == KB_M1_RSQRT && KB_MF_M1_SOFTCAP == KB_M1_SOFTCAP &&
               KB_MF_M2_MIN == KB_M2_MIN && KB_RED_MAX == 1,
               "op codes shared with replay.cl");
_Static_assert(KB_F16 == 0 && KB_BF16 == 1 && KB_F32 == 2, "dtype codes shared with replay.cl");
_Static_assert(KB_I8 == 3 && KB_FP8E4M3 == 4 && KB_FP8E5M2 == 5 && KB_E8M0 == 6 && KB_I32 == 7 &&
               KB_NDTYPES == 8, "number-format dtype codes shared with replay.cl (3 bits)");

/* Argument table entry; the layout of replay.cl's kb_ent (naturally aligned, no padding). */
struct kb_clent {
    cl_ulong start;
    cl_ulong off[4];
    cl_uint rows, cols, kdim, flags;
    cl_uint rs[4], cs[4];
    cl_uint dt, op;
    cl_float imm0, imm1;
};
_Static_assert(sizeof(kb_clent) == 104, "kb_clent must match replay.cl's kb_ent");

/* An operand descriptor's byte (replay.cl's KB_DT_*): dtype, payload, unaligned; bits 5-6 the
 * launch's arena slot (kernel argument 0-3) of its block; bit 7, which kernels ignore, marks an
 * arena operand for the binding (bind_entry) */
enum { DT_PAYLOAD = 8, DT_UNALIGNED = 16, DT_SLOT_SHIFT = 5, DT_ARENA = 128 };
enum { EF_ACC = 1, EF_FLAT = 2, EF_BIG = 4, EF_FMA = 8, EF_PAIR = 16, EF_QUAD = 32 };
enum { EF_QSPARSE = 64, EF_QSCALE = 128 }; /* DEQUANT */

#define EF_KIND_SHIFT 8 /* replay.cl's KB_EF_KIND_SHIFT: an elementwise entry's kind */

/* One kernel launch of a flush: entries [first, first + n) of the flush's table, and the
 * resident blocks its arena slots bind (nbind 0: a host-arena flush's one buffer). */
struct kb_ocl_launch {
    unsigned kind;
    size_t first, n;
    uint64_t units;
    size_t bind[KB_OCL_SLOTS];
    unsigned nbind;
};

const char *kb_ocl_errname(cl_int e)
{
    switch (e) {
    case CL_SUCCESS: return "CL_SUCCESS";
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_BUILD_OPTIONS: return "CL_INVALID_BUILD_OPTIONS";
    case CL_INVALID_PROGRAM_EXECUTABLE: return "CL_INVALID_PROGRAM_EXECUTABLE";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_OPERATION: return "CL_INVALID_OPERATION";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "OpenCL error";
    }
}

int kb_ocl_fail(kb_errbuf *eb, const char *what, cl_int err)
{
    return kb_err_set(eb, KB_ERR_DEVICE, "opencl: %s: %s (%d)", what, kb_ocl_errname(err),
                      (int)err);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---------------------------------------------------------------- backend */

static int ensure_buf(kb_ocl_be *b, cl_mem *m, size_t *cap, size_t need, cl_mem_flags fl,
                      const char *what, kb_errbuf *eb)
{
    cl_int err;

    if (need < 64)
        need = 64;
    if (*m && *cap >= need)
        return 0;
    if (*m)
        clReleaseMemObject(*m);
    *m = NULL;
    *cap = 0;
    if (need < SIZE_MAX / 2)
        need += need / 4; /* room to grow across flushes */
    *m = clCreateBuffer(b->ctx, fl, need, NULL, &err);
    if (!*m)
        return kb_err_set(eb, KB_ERR_DEVICE, "opencl: %s buffer of %zu bytes: %s (%d)", what,
                          need, kb_ocl_errname(err), (int)err);
    *cap = need;
    return 0;
}

/* A flush starts: its launches use these buffers; the argument tables start empty. */
static void flush_open(kb_ocl_be *b, cl_mem arena, cl_mem payload, uint64_t arena_bytes)
{
    b->cur_arena = arena;
    b->cur_resident = arena == NULL;
    b->cur_payload = payload;
    b->arena_bytes = arena_bytes;
    b->ntab = 0;
    b->nln = 0;
    b->failed = 0;
    b->active = 1;
}

static int cl_begin(void *self, uint8_t *arena, uint64_t arena_bytes,
                    const uint8_t *payload, size_t payload_bytes, kb_errbuf *eb)
{
    kb_ocl_be *b = self;
    cl_int err;
    int rc;

    if (b->active)
        return kb_err_set(eb, KB_ERR_STATE, "opencl backend: begin inside a flush");
    if (arena_bytes > SIZE_MAX)
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: arena of %llu bytes",
                          (unsigned long long)arena_bytes);
    if (!arena) { /* a resident flush: kb_resident has put everything in place */
        if (arena_bytes > b->rarena_cap)
            return kb_err_set(eb, KB_ERR_STATE,
                              "opencl backend: resident arena of %llu bytes, has %llu",
                              (unsigned long long)arena_bytes,
                              (unsigned long long)b->rarena_cap);
        /* a launch binds a buffer even when the flush placed nothing */
        if ((b->nrblk == 0 && (rc = kb_ocl_blk_add(b, 0, 64, eb)) != 0) ||
            (!b->rpayload && (rc = ensure_buf(b, &b->rpayload, &b->rpayload_cap, 64,
                                              CL_MEM_READ_ONLY, "payload", eb)) != 0))
            return rc;
        flush_open(b, NULL, b->rpayload, arena_bytes);
        return 0;
    }
    if ((rc = ensure_buf(b, &b->arena, &b->arena_cap, (size_t)arena_bytes, CL_MEM_READ_WRITE,
                         "arena", eb)) != 0)
        return rc;
    if ((rc = ensure_buf(b, &b->payload, &b->payload_cap, payload_bytes, CL_MEM_READ_ONLY,
                         "payload", eb)) != 0)
        return rc;
    /* Non-blocking: the caller keeps both host buffers unchanged until end() returns. */
    if (arena_bytes > 0 &&
        (err = clEnqueueWriteBuffer(b->q, b->arena, CL_FALSE, 0, (size_t)arena_bytes, arena, 0,
                                    NULL, NULL)) != CL_SUCCESS)
        goto fail;
    if (payload_bytes > 0 &&
        (err = clEnqueueWriteBuffer(b->q, b->payload, CL_FALSE, 0, payload_bytes, payload, 0,
                                    NULL, NULL)) != CL_SUCCESS)
        goto fail;
    flush_open(b, b->arena, b->payload, arena_bytes);
    return 0;
fail:
    clFinish(b->q);
    return kb_ocl_fail(eb, "upload", err);
}

static uint32_t opnd_desc(const kb_opnd *o)
{
    uint32_t d = o->dtype;
    if (o->space == KB_SPACE_PAYLOAD)
        d |= DT_PAYLOAD;
    else
        d |= DT_ARENA;
    if (o->addr % kb_dtype_size((kb_dtype)o->dtype) != 0)
        d |= DT_UNALIGNED;
    return d;
}

static void set_opnd(kb_clent *e, unsigned slot, const kb_opnd *o)
{
    e->off[slot] = o->addr;
    e->dt |= opnd_desc(o) << (8 * slot);
}

/* make_entry for the kb_tl_nn kinds (kb_oplog.h; kernels at the end of replay.cl). */
static void make_nn_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    uint64_t n = (uint64_t)d->rows * d->cols;

    e->rows = d->rows;
    e->cols = d->cols;
    e->rs[0] = d->ld;
    e->cs[0] = 1;
    set_opnd(e, 1, &s[0]);
    switch (r->kind) {
    case KB_REC_TRANSPOSE: /* dst (i, j) = src (j, i): the source's strides swapped */
        e->rs[1] = 1;
        e->cs[1] = s[0].ld;
        if (n > UINT32_MAX)
            e->flags |= EF_BIG;
        *units = (n + KB_OCL_EW_CHUNK - 1) / KB_OCL_EW_CHUNK;
        return;
    case KB_REC_ATTN_SOFTMAX:
        e->rs[1] = s[0].ld;
        e->cs[1] = 1;
        e->off[2] = s[1].addr; /* the causal offset's bits, not an operand */
        *units = d->cols == 0 ? 0 : (d->rows + KB_OCL_LN_LOCAL - 1) / KB_OCL_LN_LOCAL;
        return;
    case KB_REC_GATHER:
        set_opnd(e, 2, &s[1]);
        e->rs[1] = s[0].ld;
        e->kdim = s[0].rows;
        e->rs[2] = s[1].rows == 1 ? 1 : s[1].ld;
        *units = (n + KB_OCL_EW_CHUNK - 1) / KB_OCL_EW_CHUNK;
        return;
    default:
        *units = 0;
        return;
    }
}

/* SOFTMAX: one line per row (axis 1) or per column, read through the strides. */
static void make_softmax_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    int rows = r->op == 1; /* axis 1: one line per row */

    set_opnd(e, 1, &s[0]);
    e->rows = rows ? d->rows : d->cols;
    e->cols = rows ? d->cols : d->rows;
    e->rs[0] = rows ? d->ld : 1;
    e->cs[0] = rows ? 1 : d->ld;
    e->rs[1] = rows ? s[0].ld : 1;
    e->cs[1] = rows ? 1 : s[0].ld;
    *units = e->cols == 0 ? 0 : (e->rows + KB_OCL_LN_LOCAL - 1) / KB_OCL_LN_LOCAL;
}

/* REDUCE: one line per output element, along axis 1 or (KB_REC_AXIS0) axis 0. */
static void make_reduce_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    int axis0 = (r->flags & KB_REC_AXIS0) != 0;

    set_opnd(e, 1, &s[0]);
    e->rows = axis0 ? s[0].cols : s[0].rows;
    e->cols = axis0 ? s[0].rows : s[0].cols;
    e->rs[0] = axis0 ? 1 : d->ld;
    e->rs[1] = axis0 ? 1 : s[0].ld;
    e->cs[1] = axis0 ? s[0].ld : 1;
    *units = (e->rows + KB_OCL_LN_LOCAL - 1) / KB_OCL_LN_LOCAL;
}

/* GEMM: one work unit per output tile. */
static void make_gemm_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;

    set_opnd(e, 1, &s[0]);
    set_opnd(e, 2, &s[1]);
    e->rows = d->rows;
    e->cols = d->cols;
    e->kdim = s[0].cols;
    e->rs[0] = d->ld;
    e->rs[1] = s[0].ld;
    e->rs[2] = s[1].ld;
    if (r->flags & KB_REC_ACC)
        e->flags |= EF_ACC;
    if (s[0].dtype == KB_F16 && s[1].dtype == KB_F16)
        e->flags |= EF_FMA; /* f16 x f16 is exact in f32, so fma == multiply then add */
    *units = (uint64_t)((d->rows + KB_GEMM_TM - 1) / KB_GEMM_TM) *
             ((d->cols + KB_GEMM_TN - 1) / KB_GEMM_TN);
}

/* GEN: parameters in the operand slots (kb_oplog.h, replay.cl's kb_gen). */
static void make_gen_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;

    if (r->op == KB_GEN_QW) { /* the maps' payload offsets and the layout; a column per item */
        e->off[1] = s[0].addr;
        e->off[2] = s[1].addr;
        e->off[3] = s[2].addr;
        e->kdim = s[0].cols / 8u;
        e->rs[1] = s[1].cols / KB_SEEDGEN_COL_BYTES;
        e->rs[2] = s[2].rows;
        e->rs[3] = s[2].cols;
        e->cs[1] = s[2].ld;
        if (r->flags & KB_REC_QSPARSE)
            e->flags |= EF_QSPARSE;
        e->rows = d->rows;
        e->cols = d->cols;
        e->rs[0] = d->ld;
        *units = (d->cols + KB_OCL_EW_LOCAL - 1) / KB_OCL_EW_LOCAL;
        return;
    }

    e->off[1] = s[0].addr;
    e->off[2] = s[1].addr;
    e->off[3] = s[2].addr;
    e->kdim = s[0].rows;
    e->rs[1] = s[0].cols;
    e->cs[1] = s[1].rows;
    e->rows = d->rows;
    e->cols = d->cols;
    e->rs[0] = d->ld;
    *units = ((uint64_t)d->rows * d->cols + KB_OCL_EW_CHUNK - 1) / KB_OCL_EW_CHUNK;
}

/* DEQUANT: slot 1 elements, 2 metadata, 3 scale; cs[1], cs[2]: the scale's row and column
 * blocks (dst rows / columns per scale element). */
static void make_dequant_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    int sparse = (r->flags & KB_REC_QSPARSE) != 0, scaled = (r->flags & KB_REC_QSCALE) != 0;

    set_opnd(e, 1, &s[0]);
    e->rs[1] = s[0].ld;
    if (sparse) {
        set_opnd(e, 2, &s[1]);
        e->rs[2] = s[1].ld;
        e->flags |= EF_QSPARSE;
    }
    if (scaled) {
        const kb_opnd *sc = &s[r->nsrc - 1];
        set_opnd(e, 3, sc);
        e->rs[3] = sc->ld;
        e->cs[1] = d->rows / sc->rows;
        e->cs[2] = d->cols / sc->cols;
        e->flags |= EF_QSCALE;
    }
    e->rows = d->rows;
    e->cols = d->cols;
    e->rs[0] = d->ld;
    if ((uint64_t)d->rows * d->cols > UINT32_MAX)
        e->flags |= EF_BIG;
    *units = ((uint64_t)d->rows * d->cols + KB_OCL_EW_CHUNK - 1) / KB_OCL_EW_CHUNK;
}

/* Elementwise: dst rows x cols in row-major order; sources broadcast with stride 0. */
static void make_ew_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    uint64_t n = (uint64_t)d->rows * d->cols;
    int flat = 1;

    e->rows = d->rows;
    e->cols = d->cols;
    e->rs[0] = d->ld;
    e->cs[0] = 1;
    for (unsigned i = 0; i < r->nsrc && i < 3; i++) {
        set_opnd(e, i + 1, &s[i]);
        e->rs[i + 1] = s[i].rows == 1 ? 0 : s[i].ld;
        e->cs[i + 1] = s[i].cols == 1 ? 0 : 1;
    }
    for (unsigned i = 0; i <= r->nsrc && i < 4; i++)
        if (!((d->rows == 1 || e->rs[i] == d->cols) && (d->cols == 1 || e->cs[i] == 1)))
            flat = 0;
    if (flat) {
        /* Wide accesses: four 16-bit elements in 8 bytes, or pairs of elements, when every
         * operand is aligned for them. */
        int pair = 1, quad = 1;
        e->flags |= EF_FLAT;
        for (unsigned i = 0; i <= r->nsrc && i < 4; i++) {
            const kb_opnd *o = i == 0 ? d : &s[i - 1];
            size_t es = kb_dtype_size((kb_dtype)o->dtype);
            if (o->addr % (2 * es) != 0 || es == 1) /* no byte-pair accesses */
                pair = 0;
            if (es != 2 || o->addr % 8 != 0)
                quad = 0;
        }
        if (quad && KB_OCL_EW_PER % 4 == 0)
            e->flags |= EF_QUAD;
        else if (pair && KB_OCL_EW_PER % 2 == 0)
            e->flags |= EF_PAIR;
    }
    if (n > UINT32_MAX)
        e->flags |= EF_BIG;
    *units = (n + KB_OCL_EW_CHUNK - 1) / KB_OCL_EW_CHUNK;
}

/* Fills the entry of one record; *units receives its work units (0: nothing to do). */
static void make_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    memset(e, 0, sizeof *e);
    set_opnd(e, 0, &r->dst);
    e->op = r->op;
    e->imm0 = r->imm[0];
    e->imm1 = r->imm[1];
    switch (r->kind) {
    case KB_REC_TRANSPOSE:
    case KB_REC_ATTN_SOFTMAX:
    case KB_REC_GATHER:
        make_nn_entry(r, e, units);
        return;
    case KB_REC_SOFTMAX:
        make_softmax_entry(r, e, units);
        return;
    case KB_REC_REDUCE:
        make_reduce_entry(r, e, units);
        return;
    case KB_REC_GEMM:
        make_gemm_entry(r, e, units);
        return;
    case KB_REC_GEN:
        make_gen_entry(r, e, units);
        return;
    case KB_REC_DEQUANT:
        make_dequant_entry(r, e, units);
        return;
    default:
        make_ew_entry(r, e, units);
        return;
    }
}

/*
 * Binds entry e's arena operands (record r's) to the launch's slots (bind[0 .. *nbind)): each
 * operand's offset becomes its offset in its block, its slot goes into its descriptor. 1 when
 * they fit, 0 (nothing changed) when the launch would need more than KB_OCL_SLOTS blocks, or
 * KB_ERR_RANGE for an operand that is not inside one block (every byte the kernels may touch
 * is checked: a device server's client is not trusted to respect the blocks). A host-arena
 * flush has one buffer: nothing to bind.
 */
static int bind_entry(const kb_ocl_be *b, const kb_rec *r, kb_clent *e, size_t *bind,
                      unsigned *nbind)
{
    const kb_opnd *o[4] = { &r->dst, &r->src[0], &r->src[1], &r->src[2] };
    size_t blk[4];
    uint64_t loc[4];
    unsigned nb = *nbind, slot[4];

    if (!b->cur_resident)
        return 1;
    for (unsigned i = 0; i <= r->nsrc && i < 4; i++) {
        uint64_t span = o[i]->space == KB_SPACE_MEM ? kb_opnd_span(o[i]) : 0;
        if (span > 0 && kb_ocl_blk_find(b, o[i]->addr, span, &blk[0], &loc[0]) != 0)
            return KB_ERR_RANGE;
    }
    for (unsigned s = 0; s < 4; s++) {
        if (!((e->dt >> (8 * s)) & DT_ARENA))
            continue;
        if (kb_ocl_blk_find(b, e->off[s], 0, &blk[s], &loc[s]) != 0) {
            blk[s] = bind[0]; /* an empty operand (checked above): its base is never read; */
            loc[s] = 0;       /* the destination, slot 0, is bound first and never empty */
        }
        for (slot[s] = 0; slot[s] < nb && bind[slot[s]] != blk[s]; slot[s]++)
            ;
        if (slot[s] == nb) {
            if (nb == KB_OCL_SLOTS)
                return 0;
            bind[nb++] = blk[s];
        }
    }
    for (unsigned s = 0; s < 4; s++) {
        if (!((e->dt >> (8 * s)) & DT_ARENA))
            continue;
        e->off[s] = loc[s];
        e->dt |= (cl_uint)slot[s] << (8 * s + DT_SLOT_SHIFT);
    }
    *nbind = nb;
    return 1;
}

/* Appends the launch of entries [first, ntab): `kind`'s kernel over `units` work units. */
static int add_launch(kb_ocl_be *b, unsigned kind, size_t first, uint64_t units,
                      const size_t *bind, unsigned nbind, kb_errbuf *eb)
{
    if (b->ntab == first)
        return 0;
    if (b->nln == b->lncap) {
        size_t c = b->lncap ? 2 * b->lncap : 64;
        kb_ocl_launch *l = realloc(b->ln, c * sizeof *l);
        if (!l)
            return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: launch list");
        b->ln = l;
        b->lncap = c;
    }
    kb_ocl_launch *l = &b->ln[b->nln++];
    l->kind = kind;
    l->first = first;
    l->n = b->ntab - first;
    l->units = units;
    memcpy(l->bind, bind, sizeof l->bind);
    l->nbind = nbind;
    return 0;
}

static int cl_run_batch(void *self, const kb_rec *recs, size_t n, kb_errbuf *eb)
{
    kb_ocl_be *b = self;
    int rc;

    if (!b->active)
        return kb_err_set(eb, KB_ERR_STATE, "opencl backend: run_batch outside begin/end");
    for (size_t i = 0; i < n;) {
        unsigned kind = recs[i].kind, group = kb_rec_launch_group(kind), nbind = 0;
        size_t j = i, bind[KB_OCL_SLOTS] = { 0 };
        uint64_t units = 0;
        size_t first = b->ntab;
        if (kind >= KB_REC_NKINDS) {
            b->failed = 1;
            return kb_err_set(eb, KB_ERR_INVAL, "opencl backend: record kind %u", kind);
        }
        for (; j < n && recs[j].kind < KB_REC_NKINDS &&
               kb_rec_launch_group(recs[j].kind) == group; j++) {
            uint64_t u;
            if (b->ntab == b->tabcap) {
                size_t c = b->tabcap ? 2 * b->tabcap : 256;
                kb_clent *t = realloc(b->tab, c * sizeof *t);
                if (!t) {
                    b->failed = 1;
                    return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: argument table");
                }
                b->tab = t;
                b->tabcap = c;
            }
            kb_clent *e = &b->tab[b->ntab];
            make_entry(&recs[j], e, &u);
            if (u == 0)
                continue; /* an empty record: nothing to launch for it */
            if ((rc = bind_entry(b, &recs[j], e, bind, &nbind)) == 0) {
                /* more blocks than a launch binds: the group goes on in another launch */
                if ((rc = add_launch(b, kind, first, units, bind, nbind, eb)) != 0) {
                    b->failed = 1;
                    return rc;
                }
                first = b->ntab;
                units = 0;
                nbind = 0;
                rc = bind_entry(b, &recs[j], e, bind, &nbind); /* a record always fits */
            }
            if (rc < 0) {
                b->failed = 1;
                return kb_err_set(eb, rc, "opencl backend: record %zu of a batch: an operand "
                                  "not inside one block of the resident arena", j);
            }
            if (b->ntab == first)
                kind = recs[j].kind; /* the first entry with work names the kernel ... */
            else if (recs[j].kind != kind)
                kind = KB_OCL_EW_MIXED;  /* ... unless elementwise kinds differ: kb_ew */
            if (group == KB_REC_COPY)
                e->flags |= (cl_uint)recs[j].kind << EF_KIND_SHIFT;
            e->start = units;
            b->ntab++;
            units += u;
        }
        if ((rc = add_launch(b, kind, first, units, bind, nbind, eb)) != 0) {
            b->failed = 1;
            return rc;
        }
        i = j;
    }
    return 0;
}

static int enqueue_all(kb_ocl_be *b, kb_errbuf *eb)
{
    cl_int err;
    int rc;

    if (b->nln == 0)
        return 0;
    if ((rc = ensure_buf(b, &b->table, &b->table_cap, b->ntab * sizeof *b->tab,
                         CL_MEM_READ_ONLY, "argument table", eb)) != 0)
        return rc;
    if ((err = clEnqueueWriteBuffer(b->q, b->table, CL_FALSE, 0, b->ntab * sizeof *b->tab, b->tab,
                                    0, NULL, NULL)) != CL_SUCCESS)
        return kb_ocl_fail(eb, "argument table upload", err);
    if (b->nln > b->evcap) {
        cl_event *ev = realloc(b->ev, b->nln * sizeof *ev);
        if (!ev)
            return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: launch events");
        b->ev = ev;
        b->evcap = b->nln;
    }
    for (size_t i = 0; i < b->nln; i++) {
        const kb_ocl_launch *l = &b->ln[i];
        cl_kernel k = b->kern[l->kind];
        cl_uint n = (cl_uint)l->n;
        cl_ulong units = l->units;
        size_t local, groups, global;
        cl_uint first = (cl_uint)l->first;

        if (l->n > UINT32_MAX || l->first > UINT32_MAX)
            return kb_err_set(eb, KB_ERR_DEVICE, "opencl: %zu records in one flush", b->ntab);
        if (l->kind == KB_REC_GEMM) {
            local = KB_OCL_GEMM_NT;
            groups = (size_t)l->units;
        } else {
            /* Grid-stride kernels: enough work-groups to fill the device, not one per unit. */
            size_t cap = (size_t)(b->ncu ? b->ncu : 1) * 32;
            local = kb_ocl_local_of(l->kind);
            groups = l->units < cap ? (size_t)l->units : cap;
        }
        global = groups * local;
        err = CL_SUCCESS;
        /* arena slots 0-3: the launch's blocks (an unused slot repeats the first) */
        for (cl_uint s = 0; s < KB_OCL_SLOTS && err == CL_SUCCESS; s++) {
            const cl_mem *m = l->nbind == 0 ? &b->cur_arena
                                            : &b->rblk[l->bind[s < l->nbind ? s : 0]];
            err = clSetKernelArg(k, s, sizeof(cl_mem), m);
        }
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, KB_OCL_SLOTS, sizeof(cl_mem), &b->cur_payload);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, KB_OCL_SLOTS + 1, sizeof(cl_mem), &b->table);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, KB_OCL_SLOTS + 2, sizeof first, &first);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, KB_OCL_SLOTS + 3, sizeof n, &n);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, KB_OCL_SLOTS + 4, sizeof units, &units);
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(b->q, k, 1, NULL, &global, &local, 0, NULL, &b->ev[i]);
        if (err != CL_SUCCESS)
            return kb_err_set(eb, KB_ERR_DEVICE, "opencl: launching %s over %zu records: %s (%d)",
                              kb_ocl_kernel_names[l->kind], l->n, kb_ocl_errname(err), (int)err);
        b->launches++;
        b->nev = i + 1;
    }
    return 0;
}

/* Adds the finished launches' device time to kernel_ms and releases their events. */
static void collect_events(kb_ocl_be *b)
{
    for (size_t i = 0; i < b->nev; i++) {
        cl_ulong t0 = 0, t1 = 0;
        if (clGetEventProfilingInfo(b->ev[i], CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL) ==
                CL_SUCCESS &&
            clGetEventProfilingInfo(b->ev[i], CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) ==
                CL_SUCCESS && t1 > t0)
            b->kernel_ms += (double)(t1 - t0) / 1e6;
        clReleaseEvent(b->ev[i]);
    }
    b->nev = 0;
}

static int cl_end(void *self, uint8_t *arena, uint64_t arena_bytes, kb_errbuf *eb)
{
    kb_ocl_be *b = self;
    cl_int err;
    int rc = 0;

    if (!b->active)
        return kb_err_set(eb, KB_ERR_STATE, "opencl backend: end without begin");
    b->active = 0;
    if (b->failed) {
        rc = kb_err_set(eb, KB_ERR_STATE, "opencl backend: end after a failed batch");
        goto fail;
    }
    if (arena_bytes != b->arena_bytes) {
        rc = kb_err_set(eb, KB_ERR_STATE, "opencl backend: end with %llu arena bytes, begin had %llu",
                        (unsigned long long)arena_bytes, (unsigned long long)b->arena_bytes);
        goto fail;
    }
    if ((rc = enqueue_all(b, eb)) != 0)
        goto fail;
    if (arena && arena_bytes > 0 &&
        (err = clEnqueueReadBuffer(b->q, b->arena, CL_FALSE, 0, (size_t)arena_bytes, arena, 0,
                                   NULL, NULL)) != CL_SUCCESS) {
        rc = kb_ocl_fail(eb, "arena read-back", err);
        goto fail;
    }
    if ((err = clFinish(b->q)) != CL_SUCCESS) {
        rc = kb_ocl_fail(eb, "replay", err);
        collect_events(b);
        return rc;
    }
    collect_events(b);
    b->ntab = 0;
    b->nln = 0;
    return 0;
fail:
    /* Nothing queued may still refer to the caller's buffers once we return. */
    clFinish(b->q);
    collect_events(b);
    b->ntab = 0;
    b->nln = 0;
    return rc;
}

static void cl_destroy(void *self)
{
    kb_ocl_be *b = self;

    if (!b)
        return;
    kb_resident_destroy(b->res); /* may still pull a bound store's data */
    if (b->q)
        clFinish(b->q);
    collect_events(b);
    for (unsigned i = 0; i < KB_OCL_NKERN; i++)
        if (b->kern[i])
            clReleaseKernel(b->kern[i]);
    if (b->kfill)
        clReleaseKernel(b->kfill);
    if (b->kvq_digest)
        clReleaseKernel(b->kvq_digest);
    if (b->kvq_colref)
        clReleaseKernel(b->kvq_colref);
    if (b->kvq_check)
        clReleaseKernel(b->kvq_check);
    if (b->kvq_coll)
        clReleaseKernel(b->kvq_coll);
    if (b->prog)
        clReleaseProgram(b->prog);
    if (b->arena)
        clReleaseMemObject(b->arena);
    if (b->payload)
        clReleaseMemObject(b->payload);
    if (b->table)
        clReleaseMemObject(b->table);
    kb_ocl_blk_release(b);
    free(b->rblk);
    free(b->rblk_end);
    if (b->rpayload)
        clReleaseMemObject(b->rpayload);
    if (b->q)
        clReleaseCommandQueue(b->q);
    if (b->ctx)
        clReleaseContext(b->ctx);
    free(b->tab);
    free(b->ln);
    free(b->ev);
    free(b);
}

static kb_resident *cl_resident(void *self)
{
    return ((kb_ocl_be *)self)->res;
}

static const kb_backend_ops cl_ops = {
    .name = "opencl",
    .kind = KB_BACKEND_OPENCL,
    .begin = cl_begin,
    .run_batch = cl_run_batch,
    .end = cl_end,
    .destroy = cl_destroy,
    .resident = cl_resident,
};

/* be's state when it is an OpenCL backend (its ops table says so), else NULL. */
static kb_ocl_be *ocl_of(const kb_backend *be)
{
    return be && be->ops && be->ops->kind == KB_BACKEND_OPENCL ? be->self : NULL;
}

uint64_t kb_ocl_launches_of(const kb_backend *be)
{
    const kb_ocl_be *b = ocl_of(be);
    return b ? b->launches : 0;
}

double kb_ocl_kernel_ms_of(const kb_backend *be)
{
    const kb_ocl_be *b = ocl_of(be);
    return b ? b->kernel_ms : 0.0;
}

int kb_opencl_backend_trim(const kb_backend *be)
{
    kb_ocl_be *b = ocl_of(be);
    if (!b)
        return KB_ERR_INVAL;
    if (b->active || (b->res && kb_resident_broken(b->res)))
        return KB_ERR_STATE;
    if (clFinish(b->q) != CL_SUCCESS)
        return KB_ERR_DEVICE;
    collect_events(b);
    kb_ocl_blk_release(b);
    cl_mem *bufs[3] = { &b->arena, &b->payload, &b->rpayload };
    size_t *caps[3] = { &b->arena_cap, &b->payload_cap, &b->rpayload_cap };
    for (int i = 0; i < 3; i++) {
        if (*bufs[i])
            clReleaseMemObject(*bufs[i]);
        *bufs[i] = NULL;
        *caps[i] = 0;
    }
    b->launches = 0;
    b->kernel_ms = 0.0;
    return 0;
}

const char *kb_cl_cache_state_name(kb_cl_cache_state s)
{
    switch (s) {
    case KB_CL_CACHE_MISS: return "miss";
    case KB_CL_CACHE_HIT: return "hit";
    case KB_CL_CACHE_REJECTED: return "rejected";
    default: return "off";
    }
}

int kb_ocl_setup_of(const kb_backend *be, kb_opencl_setup *out)
{
    const kb_ocl_be *b = ocl_of(be);
    if (!b || !out)
        return KB_ERR_INVAL;
    *out = b->setup;
    return 0;
}

int kb_opencl_backend_create(kb_cl_want want, kb_backend *out, char *desc, size_t desc_n,
                             kb_errbuf *eb)
{
    return kb_opencl_backend_create_ex(want, KB_CL_CACHE_USE, out, desc, desc_n, eb);
}

int kb_opencl_backend_create_ex(kb_cl_want want, kb_cl_cache_mode mode, kb_backend *out,
                                char *desc, size_t desc_n, kb_errbuf *eb)
{
    return kb_opencl_backend_create_pg(want, mode, NULL, out, desc, desc_n, eb);
}

int kb_opencl_backend_create_pg(kb_cl_want want, kb_cl_cache_mode mode, kb_progress *pg,
                                kb_backend *out, char *desc, size_t desc_n, kb_errbuf *eb)
{
    double t0 = now_ms(), t1, t2;
    kb_ocl_inventory v;
    kb_ocl_be *b = NULL;
    cl_int err;
    long idx;
    int rc;

    if (!out)
        return kb_err_set(eb, KB_ERR_INVAL, "opencl backend: no output");
    out->ops = NULL;
    out->self = NULL;
    if (desc && desc_n)
        desc[0] = '\0';
    if ((rc = kb_ocl_inventory_get(&v)) != 0)
        return kb_err_set(eb, rc, "opencl: out of memory listing devices");
    idx = kb_ocl_pick(&v, want);
    if (idx < 0) {
        char found[400], hint[300];
        kb_ocl_found_list(&v, found, sizeof found);
        kb_ocl_icd_hint(&v, hint, sizeof hint);
        rc = kb_err_set(eb, KB_ERR_DEVICE, "no OpenCL %sdevice; found: %s%s%s",
                        want == KB_CL_GPU ? "GPU " : want == KB_CL_CPU ? "CPU " : "", found,
                        hint[0] ? "; " : "", hint);
        kb_ocl_inventory_free(&v);
        return rc;
    }
    cl_device_id dev = v.devs[idx].dev;
    cl_platform_id plat = v.devs[idx].plat;
    kb_ocl_inventory_free(&v);
    t1 = now_ms();

    b = calloc(1, sizeof *b);
    if (!b || (b->res = kb_ocl_resident_create(b)) == NULL) {
        free(b);
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: out of memory");
    }
    cl_context_properties props[3] = { CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0 };
    b->ctx = clCreateContext(props, 1, &dev, NULL, NULL, &err);
    if (!b->ctx) {
        rc = kb_ocl_fail(eb, "clCreateContext", err);
        goto fail;
    }
    /* Profiling costs next to nothing per launch and gives the replay's device time. */
    b->q = clCreateCommandQueue(b->ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    if (!b->q) {
        rc = kb_ocl_fail(eb, "clCreateCommandQueue", err);
        goto fail;
    }
    (void)clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof b->ncu, &b->ncu, NULL);
    {
        cl_ulong gm = 0, ma = 0;
        (void)clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gm, &gm, NULL);
        (void)clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof ma, &ma, NULL);
        b->setup.global_mem_bytes = gm;
        b->setup.max_alloc_bytes = ma;
    }
    t2 = now_ms();
    b->dev = dev;
    if ((rc = kb_ocl_build_program(b, plat, dev, mode, pg, eb)) != 0 ||
        (rc = kb_ocl_make_kernels(b, dev, eb)) != 0)
        goto fail;
    b->setup.discover_ms = t1 - t0;
    b->setup.context_ms = t2 - t1;
    b->setup.program_ms = now_ms() - t2;
    b->setup.total_ms = now_ms() - t0;
    if (desc && desc_n) {
        char dname[256], pname[256], ver[256], v1[64] = "", v2[64] = "";
        kb_ocl_dev_str(dev, CL_DEVICE_NAME, dname, sizeof dname);
        kb_ocl_plat_str(plat, CL_PLATFORM_NAME, pname, sizeof pname);
        kb_ocl_dev_str(dev, CL_DEVICE_VERSION, ver, sizeof ver);
        /* "OpenCL 3.0 CUDA" -> "OpenCL 3.0" */
        if (sscanf(ver, "%63s %63s", v1, v2) == 2)
            snprintf(ver, sizeof ver, "%s %s", v1, v2);
        snprintf(b->desc, sizeof b->desc, "%s (%s, %s)", dname, pname, ver);
        snprintf(desc, desc_n, "%s", b->desc);
    }
    out->ops = &cl_ops;
    out->self = b;
    return 0;
fail:
    cl_destroy(b);
    return rc;
}

int kb_opencl_backend_clone(const kb_backend *src, kb_backend *out, char *desc, size_t desc_n,
                            kb_errbuf *eb)
{
    const kb_ocl_be *s;
    kb_ocl_be *b = NULL;
    double t0 = now_ms();
    cl_int err;
    int rc;

    if (!out || (s = ocl_of(src)) == NULL)
        return kb_err_set(eb, KB_ERR_INVAL, "opencl clone: not an OpenCL backend");
    out->ops = NULL;
    out->self = NULL;
    b = calloc(1, sizeof *b);
    if (!b || (b->res = kb_ocl_resident_create(b)) == NULL) {
        free(b);
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: out of memory");
    }
    if ((err = clRetainContext(s->ctx)) != CL_SUCCESS) {
        rc = kb_ocl_fail(eb, "clRetainContext", err);
        goto fail;
    }
    b->ctx = s->ctx;
    if ((err = clRetainProgram(s->prog)) != CL_SUCCESS) {
        rc = kb_ocl_fail(eb, "clRetainProgram", err);
        goto fail;
    }
    b->prog = s->prog;
    b->dev = s->dev;
    b->ncu = s->ncu;
    b->setup = s->setup;
    memcpy(b->desc, s->desc, sizeof b->desc);
    b->q = clCreateCommandQueue(b->ctx, b->dev, CL_QUEUE_PROFILING_ENABLE, &err);
    if (!b->q) {
        rc = kb_ocl_fail(eb, "clCreateCommandQueue", err);
        goto fail;
    }
    if ((rc = kb_ocl_make_kernels(b, b->dev, eb)) != 0)
        goto fail;
    /* the clone's own set-up: a queue and kernels on the shared context and program */
    b->setup.discover_ms = 0.0;
    b->setup.context_ms = 0.0;
    b->setup.program_ms = now_ms() - t0;
    b->setup.total_ms = b->setup.program_ms;
    if (desc && desc_n)
        snprintf(desc, desc_n, "%s", b->desc);
    out->ops = &cl_ops;
    out->self = b;
    return 0;
fail:
    cl_destroy(b);
    return rc;
}

#else /* !KBCL_HAVE_OPENCL */

int kb_opencl_backend_trim(const kb_backend *be)
{
    (void)be;
    return KB_ERR_INVAL;
}

int kb_opencl_backend_clone(const kb_backend *src, kb_backend *out, char *desc, size_t desc_n,
                            kb_errbuf *eb)
{
    (void)src;
    (void)desc;
    (void)desc_n;
    if (out) {
        out->ops = NULL;
        out->self = NULL;
    }
    return kb_err_set(eb, KB_ERR_DEVICE, "kbcl was built without OpenCL");
}

int kb_opencl_backend_create(kb_cl_want want, kb_backend *out, char *desc, size_t desc_n,
                             kb_errbuf *eb)
{
    (void)want;
    if (out) {
        out->ops = NULL;
        out->self = NULL;
    }
    if (desc && desc_n)
        desc[0] = '\0';
    return kb_err_set(eb, KB_ERR_DEVICE, "kbcl was built without OpenCL (no OpenCL device)");
}

int kb_opencl_backend_create_ex(kb_cl_want want, kb_cl_cache_mode mode, kb_backend *out,
                                char *desc, size_t desc_n, kb_errbuf *eb)
{
    (void)mode;
    return kb_opencl_backend_create(want, out, desc, desc_n, eb);
}

int kb_opencl_backend_create_pg(kb_cl_want want, kb_cl_cache_mode mode, kb_progress *pg,
                                kb_backend *out, char *desc, size_t desc_n, kb_errbuf *eb)
{
    (void)pg;
    return kb_opencl_backend_create_ex(want, mode, out, desc, desc_n, eb);
}

int kb_ocl_setup_of(const kb_backend *be, kb_opencl_setup *out)
{
    (void)be;
    (void)out;
    return KB_ERR_INVAL;
}

const char *kb_cl_cache_state_name(kb_cl_cache_state s)
{
    (void)s;
    return "off";
}

uint64_t kb_ocl_launches_of(const kb_backend *be)
{
    (void)be;
    return 0;
}

double kb_ocl_kernel_ms_of(const kb_backend *be)
{
    (void)be;
    return 0.0;
}

#endif
