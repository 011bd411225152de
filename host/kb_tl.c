/*
 * kb_tl — the kernel operations (kb_tl.h): each one validates its operands, reserves the
 * hardware it uses, appends its op record and sleeps the kernel fiber until it completes.
 * Costs (docs/timing-model.md): every call first pays pe.cpu.overhead_ns; DMA routes per
 * kb_machine; PE_MATH occupies fixed + passes * elements / lanes_per_ns; PE_GEMM occupies
 * fixed + 2MNK / flops_per_ns per SchedulerV2 step. Limits: values are contiguous blocks of
 * at most 2^32-1 rows/columns; a load/store must stay inside one shard's mapping.
 */
#include "kb_runtime_int.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KB_VAL_ALIGN 64u

void kb_tl_release_all(kb_tl *tl);

kb_pe_hw *tl_pe(kb_tl *tl) { return tl->pe; }
kb_sim *tl_sim(kb_tl *tl) { return tl->sim; }
kb_ctx *tl_ctx(kb_tl *tl) { return tl->ctx; }
const char *tl_kernel_name(kb_tl *tl) { return tl->launch->name; }
kb_time kb_tl_issue_cost(const kb_tl *tl) { return tl->cpu_ovh; }

void kb_tl_set_stages(kb_tl *tl, int stages)
{
    tl->stages = stages < 2 ? 2 : stages > KB_TL_MAX_STAGES ? KB_TL_MAX_STAGES : stages;
}

int kb_tl_stages(const kb_tl *tl)
{
    assert(tl->stages == 0 || (tl->stages >= 2 && tl->stages <= KB_TL_MAX_STAGES));
    return tl->stages ? tl->stages : 2;
}

void kb_tl_view(kb_tl *tl, const int pid[3], const int np[3], int old_pid[3], int old_np[3])
{
    for (int i = 0; i < 3; i++) {
        assert(pid[i] >= 0 && pid[i] < np[i]); /* a program id names one of np programs */
        if (old_pid)
            old_pid[i] = tl->pid[i];
        if (old_np)
            old_np[i] = tl->np[i];
        tl->pid[i] = pid[i];
        tl->np[i] = np[i];
    }
}

_Noreturn void tl_fail(kb_tl *tl, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kb_ctx_fail_in(tl->ctx, tl->sim, code, "kernel %s on sip%u/cube%u/pe%u at t=%.3f ns: %s",
                   tl->launch->name, tl->pe->gsip, tl->pe->cube, tl->pe->pe,
                   kb_time_to_ns(kb_sim_now(tl->sim)), msg);
    for (;;) /* the run is over; this fiber is never resumed */
        kb_fiber_block(tl->sim, "aborted run", NULL);
}

int tl_program_id(kb_tl *tl, int axis)
{
    if (axis < 0 || axis > 2)
        tl_fail(tl, KB_ERR_INVAL, "tl_program_id: axis %d (0 = PE, 1 = cube, 2 = SIP)", axis);
    return tl->pid[axis];
}

int tl_num_programs(kb_tl *tl, int axis)
{
    if (axis < 0 || axis > 2)
        tl_fail(tl, KB_ERR_INVAL, "tl_num_programs: axis %d (0 = PE, 1 = cube, 2 = SIP)", axis);
    return tl->np[axis];
}

static kb_time issue_time(kb_tl *tl) { return kb_sim_now(tl->sim) + tl->cpu_ovh; }

void kb_tl_wait_until(kb_tl *tl, kb_time t)
{
    kb_time now = kb_sim_now(tl->sim);
    if (t > now)
        kb_fiber_sleep(tl->sim, t - now);
}

void kb_tl_record(kb_tl *tl, kb_rec *r)
{
    /* an op ends no earlier than it starts; src[] holds three operands */
    assert(r->t_start <= r->t_end && r->nsrc <= 3);
    r->pe = tl->pe->gid;
    if (kb_ctx_record(tl->ctx, r) != 0)
        tl_fail(tl, KB_ERR_NOMEM, "out of memory recording an op");
}

/*
 * Scratch values. Kernels allocate and free one per operation, so small ones (<= 4 KiB, the
 * common case) come from per-kernel size classes (64 B .. 4 KiB, powers of two) carved out of
 * 64 KiB chunks of the PE's scratch, with a free stack per class and a live bit per value for
 * misuse checks; larger ones go to the scratch allocator directly. Everything returns to the
 * PE when the kernel ends. Deterministic: the same kernel gets the same addresses.
 */
static int scr_class(uint64_t bytes)
{
    int c = 0;
    while ((uint64_t)64 << c < bytes)
        c++;
    return c;
}

static kb_scr_chunk *scr_chunk_of(kb_tl *tl, kb_pa pa)
{
    for (size_t i = tl->nchunks; i-- > 0;)
        if (pa >= tl->chunks[i].base && pa < tl->chunks[i].base + KB_SCR_CHUNK)
            return &tl->chunks[i];
    return NULL;
}

/*
 * Makes room for one more entry in an owned array of n entries and capacity *cap (doubling,
 * `first` entries to start with); returns the array, which may have moved. Stops the kernel
 * when out of memory.
 */
static void *grow_array(kb_tl *tl, void *p, size_t n, size_t *cap, size_t elem, size_t first)
{
    if (n < *cap)
        return p;
    size_t c = *cap ? *cap * 2 : first;
    void *q = realloc(p, c * elem);
    if (!q)
        tl_fail(tl, KB_ERR_NOMEM, "out of memory");
    *cap = c;
    return q;
}

/* A fresh 64 KiB chunk to carve from (out of line: it holds an error buffer). */
static KB_NOINLINE void scr_refill(kb_tl *tl, const char *op)
{
    kb_errbuf eb;
    uint64_t base;
    tl->chunks = grow_array(tl, tl->chunks, tl->nchunks, &tl->capchunks, sizeof *tl->chunks, 4);
    if (kb_alloc_alloc(tl->pe->scratch, KB_SCR_CHUNK, KB_VAL_ALIGN, &base, &eb) != 0)
        tl_fail(tl, KB_ERR_NOSPACE, "%s: %s (free values with tl_free, or use smaller "
                "tiles)", op, eb.msg);
    memset(&tl->chunks[tl->nchunks], 0, sizeof tl->chunks[0]);
    tl->chunks[tl->nchunks++].base = base;
    tl->bump = base;
    tl->bump_end = base + KB_SCR_CHUNK;
}

static kb_pa scr_small(kb_tl *tl, int c, const char *op)
{
    uint64_t size = (uint64_t)64 << c;
    kb_pa pa;
    if (c < KB_SCR_INL_CLASSES && tl->ninl[c]) {
        pa = tl->inl[c][--tl->ninl[c]];
    } else if (tl->nfree[c]) {
        pa = tl->freel[c][--tl->nfree[c]];
    } else {
        if (tl->bump + size > tl->bump_end)
            scr_refill(tl, op);
        assert(tl->bump + size <= tl->bump_end && tl->bump % 64 == 0); /* 64-byte units */
        if (tl->ncarved[c] == tl->capfree[c]) {
            size_t cap = tl->capfree[c];
            tl->freel[c] = grow_array(tl, tl->freel[c], tl->ncarved[c], &cap,
                                      sizeof *tl->freel[c], 16);
            if (cap > UINT32_MAX)
                tl_fail(tl, KB_ERR_NOMEM, "too many scratch values");
            tl->capfree[c] = (uint32_t)cap;
        }
        tl->ncarved[c]++;
        pa = tl->bump;
        tl->bump += size;
    }
    kb_scr_chunk *ch = scr_chunk_of(tl, pa);
    assert(ch); /* every small value is carved from one of the kernel's chunks */
    uint64_t unit = (pa - ch->base) / 64;
    assert(!(ch->live[unit / 64] >> (unit % 64) & 1u)); /* free stacks hold free values only */
    ch->live[unit / 64] |= UINT64_C(1) << (unit % 64);
    return pa;
}

struct kb_tl_later {
    kb_val v;
    kb_time t;
};

/* Gives back the held values whose time has come (they were read by then). */
static KB_NOINLINE void later_sweep(kb_tl *tl)
{
    kb_time now = kb_sim_now(tl->sim);
    size_t k = 0;
    for (size_t i = 0; i < tl->nlater; i++) {
        if (tl->later[i].t <= now)
            tl_free(tl, tl->later[i].v);
        else
            tl->later[k++] = tl->later[i];
    }
    tl->nlater = (uint32_t)k;
}

/* Waits until the first held value's time and gives back everything due by then. */
static void later_wait_one(kb_tl *tl)
{
    assert(tl->nlater > 0);
    kb_time t = tl->later[0].t;
    for (size_t i = 1; i < tl->nlater; i++)
        t = tl->later[i].t < t ? tl->later[i].t : t;
    kb_tl_wait_until(tl, t);
    later_sweep(tl);
}

/* A value above the size classes, straight from the scratch allocator. */
static void bigc_flush(kb_tl *tl)
{
    for (int i = 0; i < tl->nbigc; i++)
        kb_alloc_free(tl->pe->scratch, tl->bigc[i].pa, NULL);
    tl->nbigc = 0;
}

static KB_NOINLINE kb_pa scratch_big(kb_tl *tl, uint64_t bytes, const char *op)
{
    kb_errbuf eb;
    kb_pa pa = 0;
    int i = tl->nbigc;

    while (i-- > 0 && tl->bigc[i].bytes != bytes)
        ;
    if (i >= 0) { /* the latest freed value of this size */
        pa = tl->bigc[i].pa;
        for (; i + 1 < tl->nbigc; i++)
            tl->bigc[i] = tl->bigc[i + 1];
        tl->nbigc--;
    } else if (kb_alloc_alloc(tl->pe->scratch, bytes, KB_VAL_ALIGN, &pa, &eb) != 0) {
        bigc_flush(tl);
        /* values held for posted sends come back as the sends land: wait for them, as a
         * kernel waits for its buffers */
        while (kb_alloc_alloc(tl->pe->scratch, bytes, KB_VAL_ALIGN, &pa, &eb) != 0) {
            if (!tl->nlater)
                tl_fail(tl, KB_ERR_NOSPACE,
                        "%s: %s (free values with tl_free, or use smaller tiles)", op, eb.msg);
            later_wait_one(tl);
            bigc_flush(tl);
        }
    }
    tl->vals = grow_array(tl, tl->vals, tl->nvals, &tl->capvals, sizeof *tl->vals, 16);
    tl->vals[tl->nvals++] = pa;
    return pa;
}

kb_pa kb_tl_scratch_alloc(kb_tl *tl, uint64_t bytes, const char *op)
{
    if (tl->nlater)
        later_sweep(tl);
    return bytes <= KB_SCR_MAX ? scr_small(tl, scr_class(bytes), op) : scratch_big(tl, bytes, op);
}

void tl_free_after(kb_tl *tl, kb_val v, int64_t t)
{
    if (!v.scratch)
        return;
    if (t <= kb_sim_now(tl->sim)) {
        tl_free(tl, v);
        return;
    }
    if (tl->nlater == UINT32_MAX)
        tl_fail(tl, KB_ERR_NOMEM, "tl_free_after: too many values held");
    tl->later = grow_array(tl, tl->later, tl->nlater, &tl->caplater, sizeof *tl->later, 16);
    tl->later[tl->nlater].v = v;
    tl->later[tl->nlater++].t = t;
}

uint64_t kb_tl_scratch_room(kb_tl *tl)
{
    bigc_flush(tl);
    return kb_alloc_largest_free(tl->pe->scratch);
}

kb_val kb_tl_scratch_val(kb_tl *tl, uint32_t rows, uint32_t cols, kb_dtype dt, const char *op)
{
    kb_val v;

    v.pa = kb_tl_scratch_alloc(tl, (uint64_t)rows * cols * kb_dtype_size(dt), op);
    v.rows = rows;
    v.cols = cols;
    v.dtype = (uint8_t)dt;
    v.scratch = 1;
    v.pad_ = 0;
    v.ld = 0;
    return v;
}

void tl_free(kb_tl *tl, kb_val v)
{
    uint64_t bytes = (uint64_t)v.rows * v.cols * kb_dtype_size((kb_dtype)v.dtype);
    if (!v.scratch)
        return;
    if (bytes <= KB_SCR_MAX) {
        int c = scr_class(bytes);
        kb_scr_chunk *ch = scr_chunk_of(tl, v.pa);
        uint64_t unit = ch ? (v.pa - ch->base) / 64 : 0;
        if (ch && (ch->live[unit / 64] >> (unit % 64) & 1u)) {
            ch->live[unit / 64] &= ~(UINT64_C(1) << (unit % 64));
            if (c < KB_SCR_INL_CLASSES) {
                kb_pa *top = tl->inl[c];
                if (tl->ninl[c] < KB_SCR_INL) {
                    top[tl->ninl[c]++] = v.pa;
                    return;
                }
                /* full: its bottom entry moves to the array, below the rest (order kept) */
                assert(tl->nfree[c] < tl->capfree[c]);
                tl->freel[c][tl->nfree[c]++] = top[0];
                for (int i = 0; i + 1 < KB_SCR_INL; i++)
                    top[i] = top[i + 1];
                top[KB_SCR_INL - 1] = v.pa;
                return;
            }
            /* a free value was carved, and capfree >= carved values >= free ones */
            assert(tl->nfree[c] < tl->capfree[c]);
            tl->freel[c][tl->nfree[c]++] = v.pa;
            return;
        }
    } else {
        for (size_t i = tl->nvals; i-- > 0;) {
            if (tl->vals[i] == v.pa) {
                tl->vals[i] = tl->vals[--tl->nvals];
                if (tl->nbigc == KB_BIG_CACHE) { /* the oldest goes back */
                    kb_alloc_free(tl->pe->scratch, tl->bigc[0].pa, NULL);
                    memmove(tl->bigc, tl->bigc + 1, sizeof tl->bigc[0] * (KB_BIG_CACHE - 1));
                    tl->nbigc--;
                }
                tl->bigc[tl->nbigc].pa = v.pa;
                tl->bigc[tl->nbigc++].bytes = bytes;
                return;
            }
        }
    }
    tl_fail(tl, KB_ERR_INVAL, "tl_free: value at 0x%llx is not a live scratch value",
            (unsigned long long)v.pa);
}

void kb_tl_release_all(kb_tl *tl)
{
    tl->nlater = 0; /* their memory goes back with everything else's */
    bigc_flush(tl);
    for (size_t i = 0; i < tl->nvals; i++)
        kb_alloc_free(tl->pe->scratch, tl->vals[i], NULL);
    tl->nvals = 0;
    for (size_t i = 0; i < tl->nchunks; i++)
        kb_alloc_free(tl->pe->scratch, tl->chunks[i].base, NULL);
    tl->nchunks = 0;
    tl->bump = tl->bump_end = 0;
    for (int c = 0; c < KB_SCR_NCLASS; c++)
        tl->nfree[c] = tl->ncarved[c] = 0;
    for (int c = 0; c < KB_SCR_INL_CLASSES; c++)
        tl->ninl[c] = 0;
}

void kb_tl_fini(kb_tl *tl)
{
    free(tl->later);
    free(tl->vals);
    free(tl->chunks);
    for (int c = 0; c < KB_SCR_NCLASS; c++)
        free(tl->freel[c]);
}

kb_opnd kb_tl_opnd(kb_val v)
{
    kb_opnd o = kb_opnd_make(v.pa, v.rows, v.cols, (kb_dtype)v.dtype);
    o.ld = kb_val_ld(v);
    return o;
}

static kb_opnd val_opnd(kb_val v) { return kb_tl_opnd(v); }

void kb_tl_rec_fill(kb_rec *r, kb_rec_kind kind, int op, kb_val dst, const kb_val *src, int nsrc,
                    float imm0, float imm1, kb_time t_start, kb_time t_end)
{
    assert(nsrc >= 0 && nsrc <= 3); /* kb_rec.src[3] */
    memset(r, 0, sizeof *r);
    r->t_start = t_start;
    r->t_end = t_end;
    r->kind = (uint8_t)kind;
    r->op = (uint8_t)op;
    r->nsrc = (uint8_t)nsrc;
    r->imm[0] = imm0;
    r->imm[1] = imm1;
    r->dst = kb_tl_opnd(dst);
    for (int i = 0; i < nsrc; i++)
        r->src[i] = kb_tl_opnd(src[i]);
}

/* Bytes a block of rows x cols elements with row stride ld spans from its first element. */
static uint64_t span_bytes(uint32_t rows, uint32_t cols, uint32_t ld, size_t es)
{
    return rows == 0 || cols == 0 ? 0 : ((uint64_t)(rows - 1) * ld + cols) * es;
}

/* kb_tl_translate's miss: looks up va's segment and remembers it. Out of line (its message
 * buffer stays out of the hot frames). */
static KB_NOINLINE void translate_miss(kb_tl *tl, const kb_mmu *mmu, uint64_t gen, kb_va va,
                                       const char *op)
{
    kb_errbuf eb;
    uint64_t len;
    if (kb_mmu_segment(mmu, va, &tl->tlb_va, &len, &tl->tlb_pa, &eb) != 0) {
        tl->tlb_gen = 0;
        tl_fail(tl, KB_ERR_NOTFOUND, "%s: %s", op, eb.msg);
    }
    tl->tlb_end = tl->tlb_va + len;
    tl->tlb_t = kb_ctx_tensor_at(tl->ctx, tl->pe->gsip, tl->tlb_va);
    tl->tlb_gen = gen;
}

/* Translates [va, va + bytes) on this PE's SIP; it must lie in one mapping. */
kb_pa kb_tl_translate(kb_tl *tl, kb_va va, uint64_t bytes, const char *op, kb_tensor **tensor)
{
    const kb_mmu *mmu = tl->ctx->m->sips[tl->pe->gsip].mmu;
    uint64_t gen = kb_mmu_gen(mmu);

    if (tl->tlb_gen != gen || va < tl->tlb_va || va >= tl->tlb_end)
        translate_miss(tl, mmu, gen, va, op);
    assert(tl->tlb_gen == gen && va >= tl->tlb_va && va < tl->tlb_end); /* the cached segment */
    if (tl->tlb_end - va < bytes)
        tl_fail(tl, KB_ERR_RANGE,
                "%s: %llu bytes at va 0x%llx cross the end of a shard (%llu bytes left in it)", op,
                (unsigned long long)bytes, (unsigned long long)va,
                (unsigned long long)(tl->tlb_end - va));
    if (tensor)
        *tensor = tl->tlb_t;
    return tl->tlb_pa + (va - tl->tlb_va);
}

static int is_local(const kb_tl *tl, kb_pa pa)
{
    return kb_pa_in_pe_window(pa, kb_pa_pe_window(tl->pe->gsip, tl->pe->cube, tl->pe->pe));
}

/* Out of line, so that the DMA paths' frames hold no message buffer (a kernel's stack is cold
 * when it resumes: every line a frame spans may be a miss). */
KB_COLD void kb_tl_dma_fail(kb_tl *tl, kb_pa src, kb_pa dst, const char *op)
{
    kb_res *path[KB_MAX_ROUTE];
    kb_errbuf eb;
    eb.msg[0] = '\0';
    kb_machine_route(tl->ctx->m, tl->pe, src, dst, path, KB_MAX_ROUTE, &eb);
    tl_fail(tl, KB_ERR_RANGE, "%s: %s", op, eb.msg);
}

/* Records a DMA's copy (only when the run records: a kb_rec is four lines of the stack). */
static KB_NOINLINE void record_copy(kb_tl *tl, kb_time t_start, kb_time t_end, kb_opnd dst,
                                    kb_opnd src)
{
    kb_rec r;
    memset(&r, 0, sizeof r);
    r.t_start = t_start;
    r.t_end = t_end;
    r.kind = KB_REC_COPY;
    r.nsrc = 1;
    r.dst = dst;
    r.src[0] = src;
    kb_tl_record(tl, &r);
}

/* kb_machine_dma from the kernel's PE, issued at t; fails the kernel when refused. */
static void tl_dma(kb_tl *tl, kb_pa src, kb_pa dst, uint64_t bytes, kb_time t, kb_time *t_start,
                   kb_time *t_end, const char *op)
{
    if (kb_machine_dma(tl->ctx->m, tl->pe, src, dst, bytes, t, t_start, t_end, NULL) != 0)
        kb_tl_dma_fail(tl, src, dst, op);
}

static KB_COLD void not_local(kb_tl *tl, kb_val v, const char *op)
{
    char buf[96];
    tl_fail(tl, KB_ERR_INVAL, "%s: operand at %s is not in this PE's TCM/scratch (tl_load it first)",
            op, kb_pa_format(v.pa, buf, sizeof buf));
}

static void need_local(kb_tl *tl, kb_val v, const char *op)
{
    if (!is_local(tl, v.pa))
        not_local(tl, v, op);
}

/* copy: 0 a reference (no DMA), 1 a load the kernel waits for, 2 a load it does not wait for
 * (the data are there at *ready) */
static kb_val load_common(kb_tl *tl, kb_va va, kb_shape s, uint32_t ld, kb_dtype dt,
                          const char *op, int copy, kb_time *ready)
{
    uint64_t bytes = (uint64_t)s.rows * s.cols * kb_dtype_size(dt);
    kb_tensor *t;
    kb_pa src;
    kb_val v;
    kb_time t_start, t_end;

    if (s.rows == 0 || s.cols == 0 || (unsigned)dt >= KB_NDTYPES)
        tl_fail(tl, KB_ERR_INVAL, "%s: empty shape or bad dtype", op);
    if (ld < s.cols)
        tl_fail(tl, KB_ERR_INVAL, "%s: row stride %u is below the block's %u columns", op, ld,
                s.cols);
    src = kb_tl_translate(tl, va, span_bytes(s.rows, s.cols, ld, kb_dtype_size(dt)), op, &t);
    if (t && t->dtype != dt)
        tl_fail(tl, KB_ERR_INVAL, "%s: asked for %s but tensor '%s' holds %s", op,
                kb_dtype_name(dt), t->name, kb_dtype_name(t->dtype));
    if (!copy) {
        v.pa = src;
        v.rows = s.rows;
        v.cols = s.cols;
        v.dtype = (uint8_t)dt;
        v.scratch = 0;
        v.pad_ = 0;
        v.ld = ld == s.cols ? 0 : ld;
        return v;
    }
    v = kb_tl_scratch_val(tl, s.rows, s.cols, dt, op);
    tl_dma(tl, src, v.pa, bytes, issue_time(tl), &t_start, &t_end, op);
    if (kb_ctx_records(tl->ctx)) {
        kb_opnd o = kb_opnd_make(src, s.rows, s.cols, dt);
        o.ld = ld;
        record_copy(tl, t_start, t_end, val_opnd(v), o);
    }
    if (copy == 2) {
        assert(ready);
        *ready = t_end;
        kb_tl_wait_until(tl, issue_time(tl));
        return v;
    }
    kb_tl_wait_until(tl, t_end);
    return v;
}

void tl_wait_time(kb_tl *tl, int64_t t) { kb_tl_wait_until(tl, (kb_time)t); }

kb_val tl_load_async(kb_tl *tl, kb_va va, kb_shape s, kb_dtype dt, int64_t *ready)
{
    return load_common(tl, va, s, s.cols, dt, "tl_load_async", 2, ready);
}

kb_val tl_load(kb_tl *tl, kb_va va, kb_shape s, kb_dtype dt)
{
    return load_common(tl, va, s, s.cols, dt, "tl_load", 1, NULL);
}

kb_val tl_ref(kb_tl *tl, kb_va va, kb_shape s, kb_dtype dt)
{
    return load_common(tl, va, s, s.cols, dt, "tl_ref", 0, NULL);
}

kb_val tl_load2d(kb_tl *tl, kb_va va, kb_shape s, uint32_t ld, kb_dtype dt)
{
    return load_common(tl, va, s, ld, dt, "tl_load2d", 1, NULL);
}

kb_val tl_ref2d(kb_tl *tl, kb_va va, kb_shape s, uint32_t ld, kb_dtype dt)
{
    return load_common(tl, va, s, ld, dt, "tl_ref2d", 0, NULL);
}

/*
 * One DMA between a value (src_val: local or a tl_ref) and the strided block of a tensor at
 * va (row stride ld): to_mem stores v there (the tensor's dtype), otherwise the block is
 * loaded into v (v's dtype must be the tensor's). Waits for the DMA, or (posted) only for
 * its issue, the kernel's end then waiting for it; returns when the data are there.
 */
static kb_time dma_block(kb_tl *tl, kb_va va, uint32_t ld, kb_val v, int to_mem, int posted,
                         const char *op)
{
    kb_tensor *t;
    kb_dtype dt;
    uint64_t bytes;
    kb_pa mem;
    kb_time t_start, t_end;

    if (ld < v.cols)
        tl_fail(tl, KB_ERR_INVAL, "%s: row stride %u is below the block's %u columns", op, ld,
                v.cols);
    /* the memory side's dtype is the tensor's; the first translation finds the tensor */
    kb_tl_translate(tl, va, 1, op, &t);
    dt = t ? t->dtype : (kb_dtype)v.dtype;
    if (!to_mem && dt != (kb_dtype)v.dtype)
        tl_fail(tl, KB_ERR_INVAL, "%s: the destination holds %s but tensor '%s' holds %s", op,
                kb_dtype_name((kb_dtype)v.dtype), t ? t->name : "?", kb_dtype_name(dt));
    bytes = (uint64_t)v.rows * v.cols * kb_dtype_size(dt);
    mem = kb_tl_translate(tl, va, span_bytes(v.rows, v.cols, ld, kb_dtype_size(dt)), op, NULL);
    tl_dma(tl, to_mem ? v.pa : mem, to_mem ? mem : v.pa, bytes, issue_time(tl), &t_start,
           &t_end, op);
    if (kb_ctx_records(tl->ctx)) {
        kb_opnd o = kb_opnd_make(mem, v.rows, v.cols, dt);
        o.ld = ld;
        if (to_mem)
            record_copy(tl, t_start, t_end, o, val_opnd(v));
        else
            record_copy(tl, t_start, t_end, val_opnd(v), o);
    }
    if (posted) {
        tl->posted = t_end > tl->posted ? t_end : tl->posted;
        kb_tl_wait_until(tl, issue_time(tl));
        return t_end;
    }
    kb_tl_wait_until(tl, t_end);
    return t_end;
}

void tl_store(kb_tl *tl, kb_va va, kb_val v)
{
    dma_block(tl, va, v.cols, v, 1, 0, "tl_store");
}

void tl_store2d(kb_tl *tl, kb_va va, uint32_t ld, kb_val v)
{
    dma_block(tl, va, ld, v, 1, 0, "tl_store2d");
}

int64_t tl_store_async(kb_tl *tl, kb_va va, kb_val v)
{
    return (int64_t)dma_block(tl, va, v.cols, v, 1, 1, "tl_store_async");
}

int64_t tl_store2d_async(kb_tl *tl, kb_va va, uint32_t ld, kb_val v)
{
    return (int64_t)dma_block(tl, va, ld, v, 1, 1, "tl_store2d_async");
}

/* ---- notifications and barriers ---- */

#define SEM_UP KB_TL_NOTIFY_SLOTS         /* tl_barrier: arrivals at a cube's PE 0 */
#define SEM_DOWN (KB_TL_NOTIFY_SLOTS + 1) /* tl_barrier: the release */
#define SEM_BYTES 8u

/* A notification lands on kernel a's PE: one more in slot b; wakes its fiber when that
 * completes what it waits for. */
static void notify_land(kb_sim *sim, void *a, void *b)
{
    kb_tl *to = a;
    int slot = (int)(uintptr_t)b;
    if (to->ended) {
        kb_ctx_fail_in(to->ctx, sim, KB_ERR_STATE,
                       "%s: a notification (slot %d) reached sip%u/cube%u/pe%u after its kernel "
                       "returned", to->launch->name, slot, to->pe->gsip, to->pe->cube,
                       to->pe->pe);
        return;
    }
    to->sem[slot]++;
    if (to->sem_wait && to->sem_slot == slot && to->sem[slot] >= to->sem_need) {
        kb_fiber *f = to->sem_wait;
        to->sem_wait = NULL;
        kb_fiber_wake(sim, f);
    }
}

/* The launch's kernel context of PE (cube, pe) on tl's SIP; fails tl outside the grid. */
static kb_tl *grid_tl(kb_tl *tl, int cube, int pe, const char *op)
{
    kb_launch_st *l = tl->launch;
    if (tl->thread)
        tl_fail(tl, KB_ERR_STATE, "%s: only a launch's kernel may use notifications, not a "
                "thread it forked", op);
    if (cube < 0 || cube >= l->grid.cubes || pe < 0 || pe >= l->grid.pes)
        tl_fail(tl, KB_ERR_INVAL, "%s: PE %d of cube %d is outside the launch's grid of %d x "
                "%d PEs", op, pe, cube, l->grid.cubes, l->grid.pes);
    ptrdiff_t self = tl - l->tls, per_sip = (ptrdiff_t)l->grid.cubes * l->grid.pes;
    assert(self >= 0 && self < l->ntl); /* a kernel's context is the launch's */
    return &l->tls[self / per_sip * per_sip + (ptrdiff_t)cube * l->grid.pes + pe];
}

static void notify_slot(kb_tl *tl, kb_tl *to, int slot, const char *op)
{
    kb_time t_start, t_end, now;
    /* its writes first: the notification tells the target they are there */
    kb_tl_wait_until(tl, tl->posted);
    now = issue_time(tl);
    if (to == tl) {
        t_end = now;
    } else {
        kb_pe_hw *a = tl->pe, *b = to->pe;
        tl_dma(tl, kb_pa_pe_tcm(a->gsip, a->cube, a->pe, 0),
               kb_pa_pe_tcm(b->gsip, b->cube, b->pe, 0), SEM_BYTES, now, &t_start, &t_end, op);
    }
    if (kb_sim_at(tl->sim, t_end, notify_land, to, (void *)(uintptr_t)slot) != 0)
        tl_fail(tl, KB_ERR_NOMEM, "%s: out of memory", op);
    /* not in tl->posted: the next notification waits for this one's data, not for it */
    tl->notified = t_end > tl->notified ? t_end : tl->notified;
    kb_tl_wait_until(tl, now);
}

static void wait_slot(kb_tl *tl, int slot, int32_t count)
{
    kb_tl_wait_until(tl, issue_time(tl));
    if (tl->sem[slot] < count) {
        tl->sem_slot = slot;
        tl->sem_need = count;
        tl->sem_wait = kb_fiber_current(tl->sim);
        kb_fiber_block(tl->sim, "tl_wait_notify", tl);
    }
    assert(tl->sem[slot] >= count);
    tl->sem[slot] -= count;
}

void tl_notify(kb_tl *tl, int cube, int pe, int slot)
{
    if (slot < 0 || slot >= KB_TL_NOTIFY_SLOTS)
        tl_fail(tl, KB_ERR_INVAL, "tl_notify: slot %d is not in 0..%d", slot,
                KB_TL_NOTIFY_SLOTS - 1);
    notify_slot(tl, grid_tl(tl, cube, pe, "tl_notify"), slot, "tl_notify");
}

void tl_wait_notify(kb_tl *tl, int slot, int count)
{
    if (slot < 0 || slot >= KB_TL_NOTIFY_SLOTS || count < 0)
        tl_fail(tl, KB_ERR_INVAL, "tl_wait_notify: slot %d is not in 0..%d, or count %d < 0",
                slot, KB_TL_NOTIFY_SLOTS - 1, count);
    if (tl->thread)
        tl_fail(tl, KB_ERR_STATE, "tl_wait_notify: only a launch's kernel may use "
                "notifications, not a thread it forked");
    wait_slot(tl, slot, count);
}

void tl_barrier(kb_tl *tl)
{
    kb_launch_st *l = tl->launch;
    int pes = l->grid.pes, cubes = l->grid.cubes;
    int c = (int)tl->pe->cube, p = (int)tl->pe->pe;
    (void)grid_tl(tl, 0, 0, "tl_barrier"); /* a kernel, not a thread */
    if (p != 0) { /* up to the cube's PE 0, then wait for its release */
        notify_slot(tl, grid_tl(tl, c, 0, "tl_barrier"), SEM_UP, "tl_barrier");
        wait_slot(tl, SEM_DOWN, 1);
        return;
    }
    wait_slot(tl, SEM_UP, pes - 1 + (c == 0 ? cubes - 1 : 0));
    if (c != 0) {
        notify_slot(tl, grid_tl(tl, 0, 0, "tl_barrier"), SEM_UP, "tl_barrier");
        wait_slot(tl, SEM_DOWN, 1);
    }
    for (int k = 1; k < pes; k++)
        notify_slot(tl, grid_tl(tl, c, k, "tl_barrier"), SEM_DOWN, "tl_barrier");
    if (c == 0)
        for (int k = 1; k < cubes; k++)
            notify_slot(tl, grid_tl(tl, k, 0, "tl_barrier"), SEM_DOWN, "tl_barrier");
}

void kb_tl_notify_end(kb_tl *tl)
{
    kb_tl_wait_until(tl, tl->notified);
    for (int s = 0; s < KB_TL_NOTIFY_SLOTS + 2; s++)
        if (tl->sem[s])
            tl_fail(tl, KB_ERR_STATE, "the kernel returned with %d notification(s) %s%d not "
                    "taken", (int)tl->sem[s], s < KB_TL_NOTIFY_SLOTS ? "in slot " :
                    "of tl_barrier's, slot ", s);
    tl->ended = 1;
}

/* Occupies PE_MATH for `passes` passes over n elements from the issue time; returns the end. */
static kb_time math_time(kb_tl *tl, uint64_t n, unsigned passes)
{
    return kb_res_hop(&tl->pe->math, issue_time(tl), n * passes);
}

static uint32_t bcast_dim(kb_tl *tl, uint32_t a, uint32_t b, const char *op)
{
    if (a == b || b == 1)
        return a;
    if (a == 1)
        return b;
    tl_fail(tl, KB_ERR_INVAL, "%s: shapes do not broadcast (%u vs %u)", op, a, b);
    return 0;
}

/* Out of line, so that timing-only runs never touch a record on the kernel's stack. */
static KB_NOINLINE void record_elementwise(kb_tl *tl, kb_rec_kind kind, int op, const kb_val *src,
                                           int nsrc, float imm0, float imm1, kb_val v,
                                           kb_time t_start, kb_time t_end)
{
    kb_rec r;
    kb_tl_rec_fill(&r, kind, op, v, src, nsrc, imm0, imm1, t_start, t_end);
    kb_tl_record(tl, &r);
}

/* out: the result's dtype (f32 for every op but tl_binary_as: the unit rounds on writeback,
 * within the same pass). */
/* The broadcast shape of the operands of an elementwise op, all of them local. */
static KB_ALWAYS_INLINE void elementwise_shape(kb_tl *tl, const kb_val *src, int nsrc, const char *name,
                              uint32_t *rows, uint32_t *cols)
{
    *rows = src[0].rows;
    *cols = src[0].cols;
    for (int i = 0; i < nsrc; i++) {
        need_local(tl, src[i], name);
        *rows = bcast_dim(tl, *rows, src[i].rows, name);
        *cols = bcast_dim(tl, *cols, src[i].cols, name);
    }
}

/* One PE_MATH pass writing v: timed from now, recorded, waited for. */
static KB_ALWAYS_INLINE void elementwise_run(kb_tl *tl, kb_rec_kind kind, int op, const kb_val *src, int nsrc,
                            float imm0, float imm1, kb_val v)
{
    kb_time t_start = issue_time(tl);
    kb_time t_end = math_time(tl, (uint64_t)v.rows * v.cols, 1);
    if (kb_ctx_records(tl->ctx))
        record_elementwise(tl, kind, op, src, nsrc, imm0, imm1, v, t_start, t_end);
    kb_tl_wait_until(tl, t_end);
}

static kb_val elementwise_as(kb_tl *tl, kb_rec_kind kind, int op, const kb_val *src, int nsrc,
                             float imm0, float imm1, kb_dtype out, const char *name)
{
    uint32_t rows, cols;
    elementwise_shape(tl, src, nsrc, name, &rows, &cols);
    kb_val v = kb_tl_scratch_val(tl, rows, cols, out, name);
    elementwise_run(tl, kind, op, src, nsrc, imm0, imm1, v);
    return v;
}

static kb_val elementwise(kb_tl *tl, kb_rec_kind kind, int op, const kb_val *src, int nsrc,
                          float imm0, float imm1, const char *name)
{
    return elementwise_as(tl, kind, op, src, nsrc, imm0, imm1, KB_F32, name);
}

#define KB_TL_BINARY(fn, opc)                                                  \
    kb_val fn(kb_tl *tl, kb_val a, kb_val b)                                   \
    {                                                                          \
        kb_val s[2] = { a, b };                                                \
        return elementwise(tl, KB_REC_MATH2, opc, s, 2, 0.0f, 0.0f, #fn);      \
    }
KB_TL_BINARY(tl_add, KB_M2_ADD)
KB_TL_BINARY(tl_sub, KB_M2_SUB)
KB_TL_BINARY(tl_mul, KB_M2_MUL)
KB_TL_BINARY(tl_div, KB_M2_DIV)
KB_TL_BINARY(tl_maximum, KB_M2_MAX)
KB_TL_BINARY(tl_minimum, KB_M2_MIN)

void tl_binary_into(kb_tl *tl, kb_binop op, kb_val dst, kb_val a, kb_val b)
{
    static const int opc[] = { [KB_BIN_ADD] = KB_M2_ADD, [KB_BIN_MUL] = KB_M2_MUL,
                               [KB_BIN_MAX] = KB_M2_MAX, [KB_BIN_MIN] = KB_M2_MIN };
    kb_val s[2] = { a, b };
    if ((unsigned)op > KB_BIN_MIN)
        tl_fail(tl, KB_ERR_INVAL, "tl_binary_into: unknown op %d", (int)op);
    if (dst.dtype != KB_F32 && dst.dtype != KB_F16 && dst.dtype != KB_BF16)
        tl_fail(tl, KB_ERR_INVAL, "tl_binary_into: destination dtype %s is not f32, f16 or bf16",
                kb_dtype_name((kb_dtype)dst.dtype));
    uint32_t rows, cols;
    elementwise_shape(tl, s, 2, "tl_binary_into", &rows, &cols);
    need_local(tl, dst, "tl_binary_into");
    if (dst.rows != rows || dst.cols != cols)
        tl_fail(tl, KB_ERR_INVAL, "tl_binary_into: destination %ux%u, result %ux%u", dst.rows,
                dst.cols, rows, cols);
    elementwise_run(tl, KB_REC_MATH2, opc[op], s, 2, 0.0f, 0.0f, dst);
}

kb_val tl_binary_as(kb_tl *tl, kb_binop op, kb_val a, kb_val b, kb_dtype dt)
{
    static const int opc[] = { [KB_BIN_ADD] = KB_M2_ADD, [KB_BIN_MUL] = KB_M2_MUL,
                               [KB_BIN_MAX] = KB_M2_MAX, [KB_BIN_MIN] = KB_M2_MIN };
    kb_val s[2] = { a, b };
    if ((unsigned)op > KB_BIN_MIN)
        tl_fail(tl, KB_ERR_INVAL, "tl_binary_as: unknown op %d", (int)op);
    if (dt != KB_F32 && dt != KB_F16 && dt != KB_BF16)
        tl_fail(tl, KB_ERR_INVAL, "tl_binary_as: result dtype %s is not f32, f16 or bf16",
                kb_dtype_name(dt));
    return elementwise_as(tl, KB_REC_MATH2, opc[op], s, 2, 0.0f, 0.0f, dt, "tl_binary_as");
}

#define KB_TL_UNARY(fn, opc)                                                   \
    kb_val fn(kb_tl *tl, kb_val a)                                             \
    {                                                                          \
        return elementwise(tl, KB_REC_MATH1, opc, &a, 1, 0.0f, 0.0f, #fn);     \
    }
KB_TL_UNARY(tl_exp, KB_M1_EXP)
KB_TL_UNARY(tl_log, KB_M1_LOG)
KB_TL_UNARY(tl_sqrt, KB_M1_SQRT)
KB_TL_UNARY(tl_rsqrt, KB_M1_RSQRT)
KB_TL_UNARY(tl_abs, KB_M1_ABS)
KB_TL_UNARY(tl_sigmoid, KB_M1_SIGMOID)
KB_TL_UNARY(tl_cos, KB_M1_COS)
KB_TL_UNARY(tl_sin, KB_M1_SIN)
KB_TL_UNARY(tl_neg, KB_M1_NEG)
KB_TL_UNARY(tl_relu, KB_M1_RELU)
KB_TL_UNARY(tl_gelu, KB_M1_GELU)

kb_val tl_scale(kb_tl *tl, kb_val a, float mul, float add)
{
    return elementwise(tl, KB_REC_MATH1, KB_M1_AXPB, &a, 1, mul, add, "tl_scale");
}

kb_val tl_fma(kb_tl *tl, kb_val a, kb_val b, kb_val c)
{
    kb_val s[3] = { a, b, c };
    return elementwise(tl, KB_REC_FMA, 0, s, 3, 0.0f, 0.0f, "tl_fma");
}

kb_val tl_clamp(kb_tl *tl, kb_val a, float lo, float hi)
{
    if (!(lo <= hi))
        tl_fail(tl, KB_ERR_INVAL, "tl_clamp: lo %g > hi %g", (double)lo, (double)hi);
    return elementwise(tl, KB_REC_CLAMP, 0, &a, 1, lo, hi, "tl_clamp");
}

void tl_load_into(kb_tl *tl, kb_val dst, kb_va va, uint32_t ld)
{
    need_local(tl, dst, "tl_load_into");
    dma_block(tl, va, ld, dst, 0, 0, "tl_load_into");
}

int64_t tl_load_into_async(kb_tl *tl, kb_val dst, kb_va va, uint32_t ld)
{
    need_local(tl, dst, "tl_load_into_async");
    return (int64_t)dma_block(tl, va, ld, dst, 0, 1, "tl_load_into_async");
}

kb_val tl_view(kb_tl *tl, kb_val v, uint32_t r0, uint32_t c0, uint32_t rows, uint32_t cols)
{
    uint32_t ld = kb_val_ld(v);
    if (rows == 0 || cols == 0 || r0 > v.rows || rows > v.rows - r0 || c0 > v.cols ||
        cols > v.cols - c0)
        tl_fail(tl, KB_ERR_RANGE, "tl_view: [%u, %u) x [%u, %u) is outside a %u x %u value", r0,
                r0 + rows, c0, c0 + cols, v.rows, v.cols);
    v.pa += ((uint64_t)r0 * ld + c0) * kb_dtype_size((kb_dtype)v.dtype);
    v.rows = rows;
    v.cols = cols;
    v.scratch = 0;
    v.ld = rows <= 1 || ld == cols ? 0 : ld;
    return v;
}

void tl_copy(kb_tl *tl, kb_val dst, kb_val src)
{
    kb_time t_start, t_end;
    need_local(tl, dst, "tl_copy");
    need_local(tl, src, "tl_copy");
    if (dst.rows != src.rows || dst.cols != src.cols)
        tl_fail(tl, KB_ERR_INVAL, "tl_copy: shapes differ (%ux%u into %ux%u)", src.rows, src.cols,
                dst.rows, dst.cols);
    t_start = issue_time(tl);
    t_end = math_time(tl, (uint64_t)src.rows * src.cols, 1);
    if (kb_ctx_records(tl->ctx))
        record_copy(tl, t_start, t_end, val_opnd(dst), val_opnd(src));
    kb_tl_wait_until(tl, t_end);
}

kb_val tl_full(kb_tl *tl, kb_shape s, float value)
{
    kb_rec r;
    kb_val v = kb_tl_scratch_val(tl, s.rows, s.cols, KB_F32, "tl_full");
    memset(&r, 0, sizeof r);
    r.t_start = issue_time(tl);
    r.t_end = math_time(tl, (uint64_t)s.rows * s.cols, 1);
    r.kind = KB_REC_FILL;
    r.imm[0] = value;
    r.dst = val_opnd(v);
    kb_tl_record(tl, &r);
    kb_tl_wait_until(tl, r.t_end);
    return v;
}

/* Softmax: max, subtract+exp, sum, divide = 4 passes over the data. */
#define KB_SOFTMAX_PASSES 4u

static kb_val along_axis(kb_tl *tl, kb_val a, int axis, kb_rec_kind kind, int op,
                         const char *name)
{
    kb_rec r;
    kb_val v;
    uint32_t rows = a.rows, cols = a.cols;

    if (axis != 0 && axis != 1)
        tl_fail(tl, KB_ERR_INVAL, "%s: axis %d (0 = down columns, 1 = along rows)", name, axis);
    need_local(tl, a, name);
    if (kind == KB_REC_REDUCE) {
        if (axis == 1)
            cols = 1;
        else
            rows = 1;
    }
    v = kb_tl_scratch_val(tl, rows, cols, KB_F32, name);
    memset(&r, 0, sizeof r);
    r.t_start = issue_time(tl);
    r.t_end = math_time(tl, (uint64_t)a.rows * a.cols,
                        kind == KB_REC_SOFTMAX ? KB_SOFTMAX_PASSES : 1u);
    r.kind = (uint8_t)kind;
    r.op = (uint8_t)(kind == KB_REC_SOFTMAX ? axis : op);
    r.flags = (uint8_t)(kind == KB_REC_REDUCE && axis == 0 ? KB_REC_AXIS0 : 0);
    r.nsrc = 1;
    r.dst = val_opnd(v);
    r.src[0] = val_opnd(a);
    kb_tl_record(tl, &r);
    kb_tl_wait_until(tl, r.t_end);
    return v;
}

kb_val tl_softmax(kb_tl *tl, kb_val a, int axis)
{
    return along_axis(tl, a, axis, KB_REC_SOFTMAX, axis, "tl_softmax");
}

kb_val tl_sum(kb_tl *tl, kb_val a, int axis)
{
    return along_axis(tl, a, axis, KB_REC_REDUCE, KB_RED_SUM, "tl_sum");
}

kb_val tl_max(kb_tl *tl, kb_val a, int axis)
{
    return along_axis(tl, a, axis, KB_REC_REDUCE, KB_RED_MAX, "tl_max");
}

/*
 * Time of a gemm on PE_GEMM. Operands in this PE's TCM ranges feed the unit directly: one
 * occupancy of fixed + 2MNK/flops. Otherwise SchedulerV2 streams: the output is cut into
 * tile_m x tile_n tiles and K into tile_k steps; each step DMAs the A and B tiles that are not
 * local into the scheduler's reserved TCM (kb_tl_stages buffers, 2 unless the kernel set
 * more: a step's loads may start once the step that many before it has finished computing)
 * and then occupies PE_GEMM for
 * fixed + 2*tm*tn*tk/flops. All steps are reserved at the call (FIFO resources: a stream
 * issued later by another PE on a shared link queues behind this whole stream) unless
 * `paced` (dma_dispatch): then the kernel reserves each load when its DMA engine can start
 * it, so that concurrent streams interleave; alone on its path, the same times.
 */
/*
 * Paced streaming: the kernel waits until a load can start on its DMA engine (issued, and the
 * engine done with the transfers before it) and only then reserves its route. Reserved
 * earlier, a load queued behind its own engine's work would hold a shared link (the cube's
 * NoC) from a future start on, and every other PE's transfer on that FIFO link would queue
 * behind that slot. Alone on its links, the reservation gets the same start either way.
 */
static void dma_dispatch(kb_tl *tl, kb_time issue)
{
    kb_time t = kb_machine_dma_channel(tl->pe)->free_at;
    kb_tl_wait_until(tl, t > issue ? t : issue);
}

static kb_time gemm_time(kb_tl *tl, kb_val a, kb_val b, uint32_t M, uint32_t N, uint32_t K,
                         int paced)
{
    const kb_topo_cfg *c = &tl->ctx->m->cfg;
    kb_pe_hw *pe = tl->pe;
    int la = is_local(tl, a.pa), lb = is_local(tl, b.pa);
    kb_time t0 = issue_time(tl);

    if (la && lb)
        return kb_res_hop(&pe->gemm, t0, 2ull * M * N * K);

    kb_pa resv = kb_pa_pe_tcm(pe->gsip, pe->cube, pe->pe,
                              c->tcm_size_bytes - c->tcm_scheduler_reserved_bytes);
    uint32_t tm = (uint32_t)c->sched_tile_m, tn = (uint32_t)c->sched_tile_n,
             tk = (uint32_t)c->sched_tile_k;
    size_t ea = kb_dtype_size((kb_dtype)a.dtype), eb_ = kb_dtype_size((kb_dtype)b.dtype);
    kb_time done[KB_TL_MAX_STAGES], end = t0;
    unsigned nst = (unsigned)kb_tl_stages(tl);
    uint64_t step = 0;

    for (unsigned i = 0; i < nst; i++)
        done[i] = t0;
    for (uint32_t m0 = 0; m0 < M; m0 += tm) {
        uint32_t mt = M - m0 < tm ? M - m0 : tm;
        for (uint32_t n0 = 0; n0 < N; n0 += tn) {
            uint32_t nt = N - n0 < tn ? N - n0 : tn;
            for (uint32_t k0 = 0; k0 < K; k0 += tk, step++) {
                uint32_t kt = K - k0 < tk ? K - k0 : tk;
                kb_time ld_issue = done[step % nst] > t0 ? done[step % nst] : t0;
                kb_time ready = ld_issue, ts, te;
                kb_errbuf e;
                if (!la) {
                    if (paced)
                        dma_dispatch(tl, ld_issue);
                    if (kb_machine_dma(tl->ctx->m, pe, a.pa, resv, (uint64_t)mt * kt * ea,
                                       ld_issue, &ts, &te, &e) != 0)
                        tl_fail(tl, KB_ERR_RANGE, "tl_dot: %s", e.msg);
                    ready = te > ready ? te : ready;
                }
                if (!lb) {
                    if (paced)
                        dma_dispatch(tl, ld_issue);
                    if (kb_machine_dma(tl->ctx->m, pe, b.pa, resv, (uint64_t)kt * nt * eb_,
                                       ld_issue, &ts, &te, &e) != 0)
                        tl_fail(tl, KB_ERR_RANGE, "tl_dot: %s", e.msg);
                    ready = te > ready ? te : ready;
                }
                end = kb_res_hop(&pe->gemm, ready, 2ull * mt * nt * kt);
                done[step % nst] = end;
            }
        }
    }
    assert(end >= t0); /* the stream's steps start at its issue or later */
    return end;
}

static void dot_common(kb_tl *tl, kb_val dst, kb_val a, kb_val b, int acc, int paced)
{
    kb_rec r;

    if (a.cols != b.rows)
        tl_fail(tl, KB_ERR_INVAL, "tl_dot: inner dimensions differ (%ux%u @ %ux%u)", a.rows,
                a.cols, b.rows, b.cols);
    memset(&r, 0, sizeof r);
    r.t_start = issue_time(tl);
    r.t_end = gemm_time(tl, a, b, a.rows, b.cols, a.cols, paced);
    r.kind = KB_REC_GEMM;
    r.flags = (uint8_t)(acc ? KB_REC_ACC : 0);
    r.nsrc = 2;
    r.dst = val_opnd(dst);
    r.src[0] = val_opnd(a);
    r.src[1] = val_opnd(b);
    kb_tl_record(tl, &r);
    kb_tl_wait_until(tl, r.t_end);
}

static kb_val dot_new(kb_tl *tl, kb_val a, kb_val b, int paced)
{
    kb_val d;
    if (a.cols != b.rows)
        tl_fail(tl, KB_ERR_INVAL, "tl_dot: inner dimensions differ (%ux%u @ %ux%u)", a.rows,
                a.cols, b.rows, b.cols);
    d = kb_tl_scratch_val(tl, a.rows, b.cols, KB_F32, "tl_dot");
    dot_common(tl, d, a, b, 0, paced);
    return d;
}

kb_val tl_dot(kb_tl *tl, kb_val a, kb_val b)
{
    return dot_new(tl, a, b, 0);
}

kb_val kb_tl_dot_paced(kb_tl *tl, kb_val a, kb_val b)
{
    return dot_new(tl, a, b, 1);
}

void tl_dot_acc(kb_tl *tl, kb_val acc, kb_val a, kb_val b)
{
    if (!is_local(tl, acc.pa) || acc.dtype != KB_F32 || acc.rows != a.rows ||
        acc.cols != b.cols)
        tl_fail(tl, KB_ERR_INVAL,
                "tl_dot_acc: accumulator must be a local f32 value (or view) of %ux%u", a.rows,
                b.cols);
    dot_common(tl, acc, a, b, 1, 0);
}
