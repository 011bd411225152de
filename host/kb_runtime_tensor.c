/*
 * kb_runtime_tensor — tensors (kb_runtime.h; part of the runtime, what its files share is in
 * host/private/kb_runtime_int.h): shards placed by the tensor's DP policy, their memory from
 * the TCM, SRAM or HBM allocators and their VA mapped in the SIP's MMU; host writes timed as
 * DMAs over PCIe into the SIP and recorded as op-log records (a COPY from the log's payload,
 * which holds each distinct block once, a FILL of zeros, or a GEN the replay generates in
 * place); reads that replay the pending records first (kb_ctx_flush), then take the bytes
 * through kb_memstore_load (from the device when a device-resident backend holds them).
 * Limits: tensors are found by VA with a binary search over (SIP, VA), the registry kept
 * sorted by insertion.
 */
#include "kb_runtime_int.h"
#include "kb_opencl.h"
#include "kb_resident.h"
#include "kb_seedgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KB_TENSOR_ALIGN 256u
#define KB_VA_ALIGN 65536u

/* KB_ERR_STATE when the calling host program's device launch queue is on (kb_launch_queue):
 * its time is the device's, and a host transfer would be timed from there. */
static int check_no_queue(kb_ctx *ctx, const kb_tensor *t, const char *what)
{
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    if (hp && hp->queue)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "tensor '%s': a host %s inside a device "
                          "launch queue (kb_launch_queue(ctx, 0) first)", t->name, what);
    return 0;
}

/* Blocks the calling fiber until absolute time t (no-op outside fibers or in the past). */
static void wait_until(kb_ctx *ctx, kb_time t)
{
    kb_time now = kb_sim_now(ctx->sim);
    if (kb_fiber_current(ctx->sim) && t > now)
        kb_fiber_sleep(ctx->sim, t - now);
}

static int tensor_cmp_key(const kb_tensor *t, unsigned gsip, kb_va va)
{
    if (t->gsip != gsip)
        return t->gsip < gsip ? -1 : 1;
    if (va < t->va)
        return 1;
    if (va >= t->va + t->va_bytes)
        return -1;
    return 0;
}

kb_tensor *kb_ctx_tensor_at(kb_ctx *ctx, unsigned gsip, kb_va va)
{
    size_t lo = 0, hi = ctx->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = tensor_cmp_key(ctx->tensors[mid], gsip, va);
        if (c == 0)
            return ctx->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int registry_insert(kb_ctx *ctx, kb_tensor *t)
{
    if (ctx->ntensors == ctx->captensors) {
        size_t cap = ctx->captensors ? ctx->captensors * 2 : 16;
        kb_tensor **n = realloc(ctx->tensors, cap * sizeof *n);
        if (!n)
            return KB_ERR_NOMEM;
        ctx->tensors = n;
        ctx->captensors = cap;
    }
    size_t i = ctx->ntensors;
    while (i > 0 && (ctx->tensors[i - 1]->gsip > t->gsip ||
                     (ctx->tensors[i - 1]->gsip == t->gsip && ctx->tensors[i - 1]->va > t->va))) {
        ctx->tensors[i] = ctx->tensors[i - 1];
        i--;
    }
    ctx->tensors[i] = t;
    ctx->ntensors++;
    return 0;
}

static void registry_remove(kb_ctx *ctx, kb_tensor *t)
{
    for (size_t i = 0; i < ctx->ntensors; i++) {
        if (ctx->tensors[i] == t) {
            memmove(&ctx->tensors[i], &ctx->tensors[i + 1],
                    (ctx->ntensors - i - 1) * sizeof *ctx->tensors);
            ctx->ntensors--;
            return;
        }
    }
}

static kb_alloc *shard_allocator(kb_ctx *ctx, const kb_tensor *t, const kb_shard_spec *s)
{
    kb_cube_hw *cube = &ctx->m->sips[s->sip].cubes[s->cube];
    switch (t->mem) {
    case KB_MEM_TCM:
        return cube->pes[s->pe].tcm;
    case KB_MEM_SRAM:
        return cube->sram;
    default:
        return cube->pes[s->pe].hbm;
    }
}

/* Also kb_ctx_destroy's, for the tensors still registered. */
void kb_tensor_fini(kb_tensor *t)
{
    kb_ctx *ctx = t->ctx;
    kb_sip_hw *sip = &ctx->m->sips[t->gsip];
    for (size_t i = 0; i < t->nshards; i++) {
        if (t->pas[i] != KB_PA_INVALID_ADDR) {
            kb_alloc_free(shard_allocator(ctx, t, &t->shards[i]), t->pas[i], NULL);
            kb_mmu_unmap(sip->mmu, t->va + t->shards[i].offset_bytes, t->shards[i].nbytes, NULL);
        }
    }
    if (t->va)
        kb_alloc_free(sip->va, t->va, NULL);
    free(t->shards);
    free(t->pas);
    t->shards = NULL;
    t->pas = NULL;
    t->nshards = 0;
}

void kb_tensor_free(kb_tensor *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nshards; i++) /* device_fit's count */
        t->ctx->tensor_bytes -= t->ctx->tensor_bytes >= t->shards[i].nbytes
                                    ? t->shards[i].nbytes : t->ctx->tensor_bytes;
    registry_remove(t->ctx, t);
    kb_tensor_fini(t);
    free(t);
}

/* Past this many bytes of tensors a recording run checks they fit its device (device_fit). */
#define KB_FIT_CHECK_BYTES (UINT64_C(1) << 30)

/*
 * Whether a recording run's tensors, t's included, fit the memory of its OpenCL device (or a
 * device server's): the resident arena holds every tensor byte a replay touches, so a run
 * whose tensors are larger than the device's memory cannot replay. It stops here, at the
 * allocation that crosses the line, before its kernels run, naming both figures
 * (KB_ERR_NOFIT, nothing on the device yet), instead of failing in the replay. Runs below
 * KB_FIT_CHECK_BYTES never wait for the device's set-up to ask.
 *
 * The need is what the arena will ask for (kb_resident_footprint: the tensors and the slack
 * that covers IPCQ rings, scratch and alignment); the device lends a run all but 1/16 of its
 * memory, which the driver's context and the replay's own buffers (argument tables, payload,
 * query results) use. On an H200 a 128 GiB arena passed a check against the whole memory
 * and then failed mid-replay on an argument table of a few MiB.
 */
static int device_fit(kb_ctx *ctx, const kb_tensor *t, uint64_t bytes)
{
    const kb_backend *be;
    kb_opencl_setup su;
    uint64_t limit, usable, need;
    char tens[32], needs[32], have[32], use[32];

    ctx->tensor_bytes += bytes;
    if (!ctx->recording || ctx->tensor_bytes <= KB_FIT_CHECK_BYTES ||
        (ctx->device != KB_DEV_GPU && ctx->device != KB_DEV_CPU && ctx->device != KB_DEV_AUTO))
        return 0;
    if (kb_ctx_backend_wait(ctx) != 0) /* its set-up failed: the first flush says so */
        return 0;
    be = kb_ctx_backend(ctx);
    if (!be || !be->ops || (be->ops->kind != KB_BACKEND_OPENCL &&
                            be->ops->kind != KB_BACKEND_REMOTE) ||
        kb_opencl_setup_of(be, &su) != 0)
        return 0;
    /* the device's memory, not its largest buffer: NVIDIA's driver says 35 GiB of an H200's
     * 139.8 GiB and allocates a 64 GiB arena all the same */
    limit = su.global_mem_bytes;
    usable = limit - limit / 16;
    need = kb_resident_footprint(ctx->tensor_bytes);
    if (limit == 0 || need <= usable)
        return 0;
    return kb_err_set(&ctx->err, KB_ERR_NOFIT,
                      "tensor '%s': the run's tensors need at least %s (%llu bytes) of device "
                      "memory, %s (%llu bytes) with the arena's slack, and %s has %s (%llu bytes), "
                      "%s of it for a run's arena: a smaller size fits, or --device ref, or "
                      "--device none for timing only",
                      t->name, kb_fmt_bytes(ctx->tensor_bytes, tens, sizeof tens),
                      (unsigned long long)ctx->tensor_bytes,
                      kb_fmt_bytes(need, needs, sizeof needs), (unsigned long long)need,
                      ctx->device_desc, kb_fmt_bytes(limit, have, sizeof have),
                      (unsigned long long)limit, kb_fmt_bytes(usable, use, sizeof use));
}

int kb_tensor_empty(kb_ctx *ctx, const kb_tensor_desc *d, kb_tensor **out)
{
    kb_errbuf *eb = &ctx->err;
    kb_tensor *t = calloc(1, sizeof *t);
    int rc = 0;
    size_t esize = kb_dtype_size(d->dtype);
    const char *name = d->name ? d->name : "tensor";

    *out = NULL;
    if (!t)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    t->ctx = ctx;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = d->rows;
    t->cols = d->cols;
    t->dtype = d->dtype;
    t->dp = d->dp;
    t->mem = d->mem;
    t->gsip = (unsigned)kb_ctx_current_device(ctx);
    if (d->rows <= 0 || d->cols <= 0 || (unsigned)d->dtype >= KB_NDTYPES ||
        d->rows > UINT32_MAX || d->cols > UINT32_MAX) {
        rc = kb_err_set(eb, KB_ERR_INVAL, "tensor '%s': invalid shape %lld x %lld or dtype", name,
                        (long long)d->rows, (long long)d->cols);
        goto fail;
    }
    rc = kb_dp_resolve(&d->dp, (uint64_t)d->rows, (uint64_t)d->cols, esize, ctx->m->npes,
                       ctx->m->ncubes, t->gsip, &t->shards, &t->nshards, eb);
    if (rc) {
        kb_err_prefix(eb, "tensor '%s'", name);
        goto fail;
    }
    t->grid_pes = d->dp.num_pes ? d->dp.num_pes : ctx->m->npes;
    t->grid_cubes = d->dp.num_cubes ? d->dp.num_cubes : ctx->m->ncubes;
    t->pas = malloc(t->nshards * sizeof *t->pas);
    if (!t->pas) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < t->nshards; i++)
        t->pas[i] = KB_PA_INVALID_ADDR;
    for (size_t i = 0; i < t->nshards; i++)
        t->va_bytes = t->shards[i].offset_bytes + t->shards[i].nbytes > t->va_bytes
                          ? t->shards[i].offset_bytes + t->shards[i].nbytes
                          : t->va_bytes;
    kb_sip_hw *sip = &ctx->m->sips[t->gsip];
    rc = kb_alloc_alloc(sip->va, t->va_bytes, KB_VA_ALIGN, &t->va, eb);
    if (rc) {
        kb_err_prefix(eb, "tensor '%s'", name);
        goto fail;
    }
    for (size_t i = 0; i < t->nshards; i++) {
        const kb_shard_spec *s = &t->shards[i];
        uint64_t pa;
        rc = kb_alloc_alloc(shard_allocator(ctx, t, s), s->nbytes, KB_TENSOR_ALIGN, &pa, eb);
        if (rc) {
            char b[32];
            kb_err_prefix(eb, "tensor '%s' (%s, %lld x %lld %s), shard %zu", name,
                          kb_fmt_bytes((uint64_t)d->rows * (uint64_t)d->cols * esize, b, sizeof b),
                          (long long)d->rows, (long long)d->cols, kb_dtype_name(d->dtype), i);
            goto fail;
        }
        t->pas[i] = pa;
        rc = kb_mmu_map(sip->mmu, t->va + s->offset_bytes, s->nbytes, pa, eb);
        if (rc)
            goto fail;
    }
    if (registry_insert(ctx, t) != 0) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        uint64_t bytes = 0;
        for (size_t i = 0; i < t->nshards; i++)
            bytes += t->shards[i].nbytes;
        if ((rc = device_fit(ctx, t, bytes)) != 0) {
            kb_tensor_free(t); /* out of the registry, its memory back */
            return rc;
        }
    }
    *out = t;
    return 0;
fail:
    kb_tensor_fini(t);
    free(t);
    return rc;
}

kb_fill kb_fill_array(const float *data, int64_t ld)
{
    kb_fill f = { NULL, NULL, data, ld, 0, 0, NULL };
    return f;
}

kb_fill kb_fill_at(kb_fill f, int64_t rows, int64_t cols)
{
    f.row0 += rows;
    f.col0 += cols;
    return f;
}

/* Values per piece a recording host write asks a generator for: bounds its scratch. */
#define KB_FILL_PIECE 65536

/* Shard s's block of the source, rounded once to the tensor's dtype into block (row-major,
 * s->rows x s->cols); piece: KB_FILL_PIECE floats of scratch for a generator. */
static void fill_block(const kb_tensor *t, const kb_shard_spec *s, const kb_fill *src,
                       uint8_t *block, float *piece)
{
    int64_t R = (int64_t)s->rows, C = (int64_t)s->cols;
    int64_t r0 = src->row0 + (int64_t)s->row0, c0 = src->col0 + (int64_t)s->col0;

    if (!src->fn) {
        int64_t ld = src->ld ? src->ld : t->cols;
        for (int64_t r = 0; r < R; r++)
            kb_dtype_store_n(t->dtype, block, (size_t)(r * C),
                             src->data + (size_t)((r0 + r) * ld + c0), (size_t)C);
        return;
    }
    /* whole rows while they fit in a piece, else a row in parts */
    int64_t rows_per = C >= KB_FILL_PIECE ? 1 : KB_FILL_PIECE / C;
    int64_t cols_per = C >= KB_FILL_PIECE ? KB_FILL_PIECE : C;
    for (int64_t r = 0; r < R; r += rows_per) {
        int64_t nr = R - r < rows_per ? R - r : rows_per;
        for (int64_t c = 0; c < C; c += cols_per) {
            int64_t nc = C - c < cols_per ? C - c : cols_per;
            src->fn(src->ud, r0 + r, c0 + c, nr, nc, piece);
            for (int64_t i = 0; i < nr; i++)
                kb_dtype_store_n(t->dtype, block, (size_t)((r + i) * C + c), piece + i * nc,
                                 (size_t)nc);
        }
    }
}

/* Whether shards a and b hold the same block of a source periodic in (prow, pcol) rows and
 * columns (0: not periodic in that dimension): same shape, origins equal modulo the period. */
static int same_block(const kb_shard_spec *a, const kb_shard_spec *b, int64_t prow, int64_t pcol)
{
    uint64_t pr = prow > 0 ? (uint64_t)prow : UINT64_MAX;
    uint64_t pc = pcol > 0 ? (uint64_t)pcol : UINT64_MAX;
    return a->rows == b->rows && a->cols == b->cols && a->row0 % pr == b->row0 % pr &&
           a->col0 % pc == b->col0 % pc;
}

/* A generated source's parameters, refused before anything is written when a backend could
 * give other values than the host (kb_fill_gen says which). */
static int check_gen(const kb_tensor *t, const kb_fill *src)
{
    const kb_fill_gen *g = src ? src->gen : NULL;
    if (!g)
        return 0;
    if (g->kind != KB_FILL_GEN_SEED && g->kind != KB_FILL_GEN_PATTERN)
        return kb_err_set(&t->ctx->err, KB_ERR_INVAL, "tensor '%s': generator kind %d",
                          t->name, g->kind);
    if (g->kind == KB_FILL_GEN_PATTERN &&
        (g->ld < 0 || !kb_seedgen_pattern_ok(g->range, 1.0f / g->den, g->add)))
        return kb_err_set(&t->ctx->err, KB_ERR_INVAL, "tensor '%s': a generated pattern needs "
                          "range <= 2^24, ld >= 0, den a power of two in [2^-100, 2^100] and "
                          "add 0 or of magnitude >= 2^-100 (range %u, ld %lld, den %g, add %g)",
                          t->name, g->range, (long long)g->ld, (double)g->den, (double)g->add);
    return 0;
}

/* The first shard up to i that holds the same block of a source periodic in (prow, pcol)
 * rows and columns as shard i (same_block): i itself when no earlier one does. */
static size_t first_same(const kb_tensor *t, size_t i, int64_t prow, int64_t pcol)
{
    size_t j = 0;
    while (j < i && !same_block(&t->shards[j], &t->shards[i], prow, pcol))
        j++;
    return j;
}

/*
 * Times a host write of every shard and, when recording, records it: src == NULL writes
 * zeros (FILL), else a COPY from the op log's payload, which holds each distinct block once
 * (replicas share it, and so do the shards of a source periodic in (prow, pcol): 0 = not).
 * A timing-only context never looks at src's values.
 */
static int host_write(kb_tensor *t, const kb_fill *src, int64_t prow, int64_t pcol,
                      const kb_qgen_src *qg)
{
    kb_ctx *ctx = t->ctx;
    size_t esize = kb_dtype_size(t->dtype);
    kb_time t0 = kb_sim_now(ctx->sim) + ctx->m->host_overhead, tmax = t0;
    uint8_t *block = NULL;
    float *piece = NULL;
    uint64_t *payload_of = NULL;
    kb_time *gen_end = NULL; /* generated shards: when their GEN record ends */
    size_t j;
    int rc = 0;

    if (src && !src->fn && !src->data)
        return kb_err_set(&ctx->err, KB_ERR_INVAL, "tensor '%s': a host write with neither a "
                          "generator nor data", t->name);
    if ((rc = check_no_queue(ctx, t, "write")) != 0 || (rc = check_gen(t, src)) != 0)
        return rc;
    if (qg) { /* tensor row r is part row r mod its rows per copy, column c copy column c mod nb */
        prow = (int64_t)kb_seedgen_qw_rows(qg->fmt, qg->sparse, qg->part, qg->k);
        pcol = (int64_t)qg->nb;
    }
    if (qg && ctx->recording && !(gen_end = malloc(t->nshards * sizeof *gen_end))) {
        rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (src && !qg && ctx->recording) {
        payload_of = malloc(t->nshards * sizeof *payload_of);
        piece = src->fn && !src->gen ? malloc(KB_FILL_PIECE * sizeof *piece) : NULL;
        if (!payload_of || (src->fn && !src->gen && !piece)) {
            rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    for (size_t i = 0; i < t->nshards; i++) {
        const kb_shard_spec *s = &t->shards[i];
        kb_rec r;
        memset(&r, 0, sizeof r);
        rc = kb_machine_dma(ctx->m, NULL, KB_PA_INVALID_ADDR, t->pas[i], s->nbytes, t0,
                            &r.t_start, &r.t_end, &ctx->err);
        if (rc)
            goto out;
        if (r.t_end > tmax)
            tmax = r.t_end;
        if (!ctx->recording)
            continue;
        r.pe = UINT32_MAX;
        r.dst = kb_opnd_make(t->pas[i], (uint32_t)s->rows, (uint32_t)s->cols, t->dtype);
        if (qg && (j = first_same(t, i, prow, pcol)) < i) {
            /* the same block of the copies as shard j: copied from it once it is made (the
             * replay orders records by start time, so this one starts when j's ends) */
            r.kind = KB_REC_COPY;
            r.nsrc = 1;
            r.src[0] = kb_opnd_make(t->pas[j], (uint32_t)s->rows, (uint32_t)s->cols, t->dtype);
            if (r.t_start < gen_end[j])
                r.t_start = gen_end[j];
            if (r.t_end < r.t_start)
                r.t_end = r.t_start;
        } else if (qg) { /* a quantized weight's part, generated and quantized where it replays */
            gen_end[i] = r.t_end;
            r.kind = KB_REC_GEN;
            r.op = KB_GEN_QW;
            r.nsrc = 2;
            r.flags = qg->sparse ? KB_REC_QSPARSE : 0;
            r.src[0] = kb_opnd_make(qg->rows_off, 1, (uint32_t)(8 * qg->k), KB_I8);
            r.src[1] = kb_opnd_make(qg->cols_off, 1, (uint32_t)(KB_SEEDGEN_COL_BYTES * qg->nb),
                                    KB_I8);
            r.src[0].space = r.src[1].space = KB_SPACE_PAYLOAD;
            r.src[2].addr = s->row0;
            r.src[2].ld = (uint32_t)(s->col0 % qg->nb);
            r.src[2].rows = qg->part;
            r.src[2].cols = qg->fmt;
        } else if (!src) {
            r.kind = KB_REC_FILL;
            r.nsrc = 0;
            r.imm[0] = 0.0f;
        } else if (src->gen && src->gen->kind == KB_FILL_GEN_PATTERN) { /* the benches' */
            const kb_fill_gen *g = src->gen;
            r.kind = KB_REC_GEN;
            r.op = KB_GEN_PAT;
            r.nsrc = 0;
            r.src[0].addr = (uint64_t)(src->row0 + (int64_t)s->row0);
            r.src[1].addr = (uint64_t)(src->col0 + (int64_t)s->col0);
            r.src[2].addr = (uint64_t)g->ld;
            r.src[0].rows = g->seed;
            r.src[0].cols = g->range;
            r.src[1].rows = g->transpose != 0;
            r.imm[0] = 1.0f / g->den; /* exact: a power of two (check_gen) */
            r.imm[1] = g->add;
        } else if (src->gen) { /* generated where it replays */
            const kb_fill_gen *g = src->gen;
            r.kind = KB_REC_GEN;
            r.nsrc = 0;
            r.op = g->sign ? KB_GEN_SIGN : KB_GEN_PLAIN;
            r.src[0].addr = (uint64_t)(g->tile0 + src->row0 + (int64_t)s->row0);
            r.src[1].addr = (uint64_t)(g->i0 + src->col0 + (int64_t)s->col0);
            r.src[2].addr = (uint64_t)g->n;
            r.src[0].rows = g->seed;
            r.src[0].cols = (uint32_t)g->ntiles;
        } else {
            size_t n = (size_t)(s->rows * s->cols);
            /* identical blocks (replicas, periods) share one payload */
            if ((j = first_same(t, i, prow, pcol)) < i) {
                payload_of[i] = payload_of[j];
            } else {
                /* generated straight into the payload: no block to copy from */
                if (kb_oplog_reserve_payload(ctx->log, n * esize, &payload_of[i], &block) != 0) {
                    rc = kb_err_nomem(&ctx->err, (unsigned long long)(n * esize),
                                      "tensor '%s': shard %zu's data in the op log (%llu bytes "
                                      "held there already)", t->name, i,
                                      (unsigned long long)kb_oplog_payload_size(ctx->log));
                    goto out;
                }
                fill_block(t, s, src, block, piece);
                block = NULL;
            }
            r.kind = KB_REC_COPY;
            r.nsrc = 1;
            r.src[0] = kb_opnd_make(payload_of[i], (uint32_t)s->rows, (uint32_t)s->cols, t->dtype);
            r.src[0].space = KB_SPACE_PAYLOAD;
        }
        if ((rc = kb_ctx_record(ctx, &r)) != 0)
            goto out;
    }
out:
    free(piece);
    free(payload_of);
    free(gen_end);
    /* wait with nothing held: a run stopped meanwhile never resumes this fiber */
    if (rc == 0)
        wait_until(ctx, tmax);
    return rc;
}

int kb_tensor_zeros(kb_ctx *ctx, const kb_tensor_desc *d, kb_tensor **out)
{
    return kb_tensor_from_fill(ctx, d, NULL, out);
}

int kb_tensor_from_fill_periodic(kb_ctx *ctx, const kb_tensor_desc *d, const kb_fill *src,
                                 int64_t prow, int64_t pcol, kb_tensor **out)
{
    int rc;
    if (prow < 0 || pcol < 0)
        return kb_err_set(&ctx->err, KB_ERR_INVAL, "tensor '%s': negative period %lld x %lld",
                          d && d->name ? d->name : "?", (long long)prow, (long long)pcol);
    rc = kb_tensor_empty(ctx, d, out);
    if (rc == 0 && (rc = host_write(*out, src, prow, pcol, NULL)) != 0) {
        kb_tensor_free(*out);
        *out = NULL;
    }
    return rc;
}

int kb_tensor_from_qgen(kb_ctx *ctx, const kb_tensor_desc *d, const kb_qgen_src *g,
                        kb_tensor **out)
{
    int rc;
    if (!g || !d || kb_seedgen_qw_dtype(g->fmt, g->part) != (int)d->dtype || g->k == 0 ||
        g->nb == 0 || 8 * g->k > UINT32_MAX || KB_SEEDGEN_COL_BYTES * g->nb > UINT32_MAX)
        return kb_err_set(&ctx->err, KB_ERR_INVAL, "tensor '%s': a generated weight part that "
                          "does not fit its layout", d && d->name ? d->name : "?");
    rc = kb_tensor_empty(ctx, d, out);
    if (rc == 0 && (rc = host_write(*out, NULL, 0, 0, g)) != 0) {
        kb_tensor_free(*out);
        *out = NULL;
    }
    return rc;
}

int kb_tensor_from_fill(kb_ctx *ctx, const kb_tensor_desc *d, const kb_fill *src,
                        kb_tensor **out)
{
    return kb_tensor_from_fill_periodic(ctx, d, src, 0, 0, out);
}

int kb_tensor_from_host(kb_ctx *ctx, const kb_tensor_desc *d, const float *data, kb_tensor **out)
{
    kb_fill f = kb_fill_array(data, 0);
    return kb_tensor_from_fill(ctx, d, data ? &f : NULL, out);
}

int kb_tensor_copy_from_fill(kb_tensor *t, const kb_fill *src)
{
    return host_write(t, src, 0, 0, NULL);
}

/* Shard i is the first shard holding its block (replicas after the first are skipped). */
static int first_replica(const kb_tensor *t, size_t i)
{
    const kb_shard_spec *s = &t->shards[i];
    for (size_t j = 0; j < i; j++)
        if (t->shards[j].row0 == s->row0 && t->shards[j].col0 == s->col0 &&
            t->shards[j].rows == s->rows && t->shards[j].cols == s->cols)
            return 0;
    return 1;
}

int kb_tensor_read_raw(kb_tensor *t, void *out)
{
    kb_ctx *ctx = t->ctx;
    size_t esize = kb_dtype_size(t->dtype);
    uint8_t *block = NULL;
    int rc = check_no_queue(ctx, t, "read");
    if (rc || (rc = kb_ctx_flush(ctx)) != 0)
        return rc;
    kb_time t0 = kb_sim_now(ctx->sim) + ctx->m->host_overhead, tmax = t0;
    for (size_t i = 0; i < t->nshards; i++) {
        const kb_shard_spec *s = &t->shards[i];
        kb_time ts, te;
        if (!first_replica(t, i))
            continue;
        if (kb_fiber_current(ctx->sim)) {
            rc = kb_machine_dma(ctx->m, NULL, t->pas[i], KB_PA_INVALID_ADDR, s->nbytes, t0, &ts,
                                &te, &ctx->err);
            if (rc)
                goto out;
            if (te > tmax)
                tmax = te;
        }
        if (s->cols == (uint64_t)t->cols) { /* whole rows: contiguous in out too */
            rc = kb_memstore_load(ctx->ms, t->pas[i], (uint8_t *)out + s->row0 * s->cols * esize,
                                  s->nbytes, &ctx->err);
            if (rc)
                goto out;
            continue;
        }
        free(block);
        block = malloc(s->nbytes);
        if (!block) {
            rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
            goto out;
        }
        if ((rc = kb_memstore_load(ctx->ms, t->pas[i], block, s->nbytes, &ctx->err)) != 0)
            goto out;
        kb_shard_unpack(s, block, (uint64_t)t->cols, esize, out);
    }
    wait_until(ctx, tmax);
out:
    free(block);
    return rc;
}

int kb_tensor_read(kb_tensor *t, float *out)
{
    size_t n = (size_t)(t->rows * t->cols), esize = kb_dtype_size(t->dtype);
    uint8_t *raw = malloc(n * esize);
    int rc;
    if (!raw)
        return kb_err_nomem(&t->ctx->err, (unsigned long long)(n * esize),
                            "tensor '%s' read back", t->name);
    rc = kb_tensor_read_raw(t, raw);
    if (rc == 0)
        kb_dtype_load_n(t->dtype, raw, 0, out, n);
    free(raw);
    return rc;
}

int kb_tensor_read_shard_raw(kb_tensor *t, size_t i, void *out)
{
    int rc;
    if (i >= t->nshards)
        return kb_err_set(&t->ctx->err, KB_ERR_RANGE, "tensor '%s' has %zu shards", t->name,
                          t->nshards);
    if ((rc = kb_ctx_flush(t->ctx)) != 0)
        return rc;
    return kb_memstore_load(t->ctx->ms, t->pas[i], out, t->shards[i].nbytes, &t->ctx->err);
}

kb_va kb_tensor_va(const kb_tensor *t) { return t->va; }
int64_t kb_tensor_rows(const kb_tensor *t) { return t->rows; }
int64_t kb_tensor_cols(const kb_tensor *t) { return t->cols; }
kb_dtype kb_tensor_dtype(const kb_tensor *t) { return t->dtype; }
size_t kb_tensor_nshards(const kb_tensor *t) { return t->nshards; }
const kb_shard_spec *kb_tensor_shard(const kb_tensor *t, size_t i) { return &t->shards[i]; }
kb_pa kb_tensor_shard_pa(const kb_tensor *t, size_t i) { return t->pas[i]; }
const char *kb_tensor_name(const kb_tensor *t) { return t->name; }
unsigned kb_tensor_sip(const kb_tensor *t) { return t->gsip; }
