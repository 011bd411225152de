/*
 * Fuzz target: the Phase-2 replay (cl/kb_replay*.c). The input drives a generator of op logs
 * over a window of memory: records of every kind with shapes, strides, dtypes, ops, in-place
 * and misaligned operands, payload sources, equal and distinct start times, cuts between
 * records and flushes part way; now and then one field of a record is replaced by raw bytes
 * (any kind, count, shape, address). Then:
 *  - the planner (kb_plan_build_cut) either refuses the records with a message or returns a
 *    plan whose every operand lies inside the arena, whose batches cover every record once,
 *    and where each record's batch is exactly one past the latest batch of the earlier
 *    records (in (epoch, t_start, seq) order) it conflicts with: the level schedule
 *    kb_replay.h specifies, checked against a brute-force one;
 *  - when every operand lies in the window (no record asks for a huge arena), the flush
 *    through the reference backend (plain or device-resident) must fail exactly when the
 *    planner refused, leave the memory as it was when it fails, and otherwise leave the
 *    window byte for byte as the serial replay of the same records (kb_ref_exec, one at a
 *    time in planner order) leaves a flat copy.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"

#include "kb_memstore.h"
#include "kb_oplog.h"
#include "kb_replay.h"
#include "kb_seedgen.h"

#define MAX_RECS 96
#define MAX_WIN 4096u

/* ---- the input as a stream of choices (zeros once it runs out) ---- */

typedef struct bytes {
    const uint8_t *p;
    size_t n, i;
} bytes;

static unsigned u8(bytes *b)
{
    return b->i < b->n ? b->p[b->i++] : 0;
}

/* In [0, n), n >= 1: one byte for small ranges, more for large ones. */
static uint32_t below(bytes *b, uint32_t n)
{
    uint32_t v = u8(b);
    if (n > 0x100u)
        v = v << 8 | u8(b);
    if (n > 0x10000u)
        v = v << 16 | u8(b) << 8 | u8(b);
    return v % n;
}

static uint64_t u64(bytes *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | u8(b);
    return v;
}

/* Values for the window and the payload: splitmix64 from a seed of the input, so a few input
 * bytes give kilobytes of data. */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* n bytes of data: raw bit patterns (NaNs, infinities, subnormals of every dtype), or f16
 * values in [-1, 1) as Phase 1 mostly produces. */
static void fill(uint64_t *s, int raw, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 2) {
        uint64_t r = mix(s);
        uint16_t h;
        if (raw) {
            h = (uint16_t)r;
        } else { /* sign, exponent 0..14 (|x| < 1), random mantissa */
            h = (uint16_t)((r & 0x8000u) | ((r >> 16) % 15u) << 10 | (r >> 32 & 0x3ffu));
        }
        p[i] = (uint8_t)h;
        if (i + 1 < n)
            p[i + 1] = (uint8_t)(h >> 8);
    }
}

/* ---- operand arithmetic without overflow (the product's own may not be trusted here) ---- */

/* The operand's span in bytes; -1 when it does not fit in 64 bits. */
static int span_of(const kb_opnd *o, uint64_t *span)
{
    uint64_t v;
    if (o->rows == 0 || o->cols == 0) {
        *span = 0;
        return 0;
    }
    if (__builtin_mul_overflow((uint64_t)(o->rows - 1), (uint64_t)o->ld, &v) ||
        __builtin_add_overflow(v, (uint64_t)o->cols, &v) ||
        __builtin_mul_overflow(v, (uint64_t)kb_dtype_size((kb_dtype)o->dtype), &v))
        return -1;
    *span = v;
    return 0;
}

/* The memory operands of r: dst and its sources (GEN's and ATTN_SOFTMAX's extra src fields
 * are parameters, not operands). */
static unsigned mem_opnds(const kb_rec *r, const kb_opnd *out[4])
{
    unsigned k = 0;
    if (r->dst.space == KB_SPACE_MEM)
        out[k++] = &r->dst;
    for (unsigned s = 0; s < r->nsrc && s < 3; s++)
        if (r->src[s].space == KB_SPACE_MEM)
            out[k++] = &r->src[s];
    return k;
}

static int overlap(const kb_opnd *a, const kb_opnd *b)
{
    uint64_t sa, sb;
    if (span_of(a, &sa) || span_of(b, &sb))
        return 1; /* only records the planner must refuse have these */
    return sa && sb && a->addr < b->addr + sb && b->addr < a->addr + sa;
}

/* A conflict as kb_replay.h defines it: one writes bytes the other reads or writes. */
static int conflict(const kb_rec *a, const kb_rec *b)
{
    if (overlap(&a->dst, &b->dst))
        return 1;
    for (unsigned s = 0; s < b->nsrc && s < 3; s++)
        if (b->src[s].space == KB_SPACE_MEM && overlap(&a->dst, &b->src[s]))
            return 1;
    for (unsigned s = 0; s < a->nsrc && s < 3; s++)
        if (a->src[s].space == KB_SPACE_MEM && overlap(&b->dst, &a->src[s]))
            return 1;
    return 0;
}

/* ---- the generator ---- */

typedef struct gen {
    bytes in;
    uint64_t base;        /* window start PA */
    uint32_t win;         /* window bytes */
    uint32_t maxd;        /* largest row / column count */
    uint64_t data;        /* value stream state */
    int raw;              /* raw bit patterns in the window and the payload */
    kb_oplog *log;
    int fit;              /* every operand so far fitted the window */
    int corrupt;          /* some records get a raw field (half the inputs: the other half
                           * reach long runs of valid records) */
} gen;

/* An operand of rows x cols somewhere in the window (sometimes at a misaligned element
 * address); fit = 0 when the shape does not fit. */
static kb_opnd place(gen *g, uint32_t rows, uint32_t cols, kb_dtype t)
{
    kb_opnd o = kb_opnd_make(0, rows, cols, t);
    uint64_t es = kb_dtype_size(t), span;
    o.ld = cols + (rows > 1 ? below(&g->in, 3) : 0);
    span = kb_opnd_span(&o);
    if (span + 4 > g->win) {
        g->fit = 0;
        o.addr = g->base;
        return o;
    }
    o.addr = g->base + es * below(&g->in, (uint32_t)((g->win - span - 4) / es + 1));
    if (below(&g->in, 16) == 0)
        o.addr += es == 2 ? 1 : 2;
    return o;
}

static kb_dtype any_dtype(gen *g)
{
    return (kb_dtype)below(&g->in, KB_NDTYPES);
}

/* A source broadcasting to rows x cols: a row, a column or the full shape. */
static kb_opnd bsrc(gen *g, uint32_t rows, uint32_t cols)
{
    uint32_t r = below(&g->in, 4) == 0 ? 1 : rows, c = below(&g->in, 4) == 0 ? 1 : cols;
    return place(g, r, c, any_dtype(g));
}

/* Any 32-bit pattern as a float: NaNs, infinities and subnormals included. */
static float bits_float(bytes *b)
{
    uint32_t u = (uint32_t)u64(b);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float any_float(gen *g, float lo, float hi)
{
    return lo + (hi - lo) * (float)below(&g->in, 1u << 16) * 0x1p-16f;
}

/* Moves source s of r to the payload, with data of its span. */
static void to_payload(gen *g, kb_opnd *o)
{
    uint8_t buf[MAX_WIN];
    uint64_t span = kb_opnd_span(o), off;
    if (span > sizeof buf)
        return;
    fill(&g->data, g->raw, buf, (size_t)span);
    if (kb_oplog_add_payload(g->log, buf, (size_t)span, &off) != 0)
        KBF_ENV_FAIL("out of memory for the payload");
    o->addr = off;
    o->space = KB_SPACE_PAYLOAD;
}

/* A raw count or stride: often an edge (zero, one, the 31- and 32-bit limits), else any. */
static uint32_t raw_u32(gen *g)
{
    static const uint32_t edge[] = { 0, 1, 2, 0x7fffffffu, 0x80000000u, 0x80000001u,
                                     0xfffffffeu, 0xffffffffu };
    if (below(&g->in, 2))
        return edge[below(&g->in, sizeof edge / sizeof edge[0])];
    return (uint32_t)u64(&g->in);
}

/* A raw address: often near the window or the ends of the space, else any. */
static uint64_t raw_addr(gen *g)
{
    switch (below(&g->in, 4)) {
    case 0: return g->base + g->win - below(&g->in, 64);
    case 1: return UINT64_MAX - below(&g->in, 64);
    case 2: return below(&g->in, 64);
    default: return u64(&g->in);
    }
}

/* A 64-bit parameter read as a signed count or index: often next to a limit. */
static uint64_t raw_param(gen *g)
{
    switch (below(&g->in, 4)) {
    case 0: return (uint64_t)INT64_MAX - below(&g->in, 64);
    case 1: return (uint64_t)INT64_MIN + below(&g->in, 64);
    case 2: return UINT64_MAX - below(&g->in, 64);
    default: return u64(&g->in);
    }
}

/* One raw field: what a record a buggy Phase 1 or a hostile devd client sends looks like. */
static void corrupt(gen *g, kb_rec *r)
{
    kb_opnd *o = below(&g->in, 2) == 0 ? &r->dst : &r->src[below(&g->in, 3)];
    switch (below(&g->in, 11)) {
    case 10: /* a whole raw shape: spans past 2^64 need two large factors */
        o->rows = raw_u32(g);
        o->cols = raw_u32(g);
        o->ld = raw_u32(g);
        break;
    case 0: r->kind = (uint8_t)u8(&g->in); break;
    case 1: r->nsrc = (uint8_t)u8(&g->in); break;
    case 2: r->op = (uint8_t)u8(&g->in); break;
    case 3: r->flags = (uint8_t)u8(&g->in); break;
    case 4: o->rows = raw_u32(g); break;
    case 5: o->cols = raw_u32(g); break;
    case 6: o->ld = raw_u32(g); break;
    case 7: o->dtype = (uint8_t)u8(&g->in); break;
    case 8: o->space = (uint8_t)u8(&g->in); break;
    default: o->addr = raw_addr(g); break;
    }
}

static kb_rec gen_rec(gen *g, kb_time t)
{
    static const unsigned nsrc[KB_REC_NKINDS] = { 1, 0, 1, 2, 3, 1, 1, 1, 2, 1, 1, 2, 1, 0 };
    bytes *in = &g->in;
    kb_rec r;
    kb_rec_kind k = (kb_rec_kind)below(in, KB_REC_NKINDS);
    uint32_t rows = 1 + below(in, g->maxd), cols = 1 + below(in, g->maxd);
    kb_dtype dt = any_dtype(g);

    memset(&r, 0, sizeof r);
    r.kind = (uint8_t)k;
    r.nsrc = (uint8_t)nsrc[k];
    r.t_start = t;
    r.t_end = t + 10;
    switch (k) {
    case KB_REC_COPY:
    case KB_REC_MATH1:
    case KB_REC_MATH2:
    case KB_REC_FMA:
    case KB_REC_CLAMP:
        for (unsigned s = 0; s < r.nsrc; s++)
            r.src[s] = bsrc(g, rows, cols);
        r.op = (uint8_t)(k == KB_REC_MATH1 ? below(in, KB_M1_NOPS)
                         : k == KB_REC_MATH2 ? below(in, KB_M2_NOPS) : 0);
        r.imm[0] = k == KB_REC_CLAMP ? any_float(g, -1.0f, 0.0f) : any_float(g, -2.0f, 2.0f);
        r.imm[1] = k == KB_REC_CLAMP ? any_float(g, 0.0f, 1.0f) : any_float(g, -1.0f, 1.0f);
        break;
    case KB_REC_FILL:
        r.imm[0] = any_float(g, -4.0f, 4.0f);
        break;
    case KB_REC_SOFTMAX:
        r.op = (uint8_t)below(in, 2);
        r.src[0] = place(g, rows, cols, any_dtype(g));
        break;
    case KB_REC_REDUCE:
        r.op = (uint8_t)below(in, KB_RED_NOPS);
        r.src[0] = place(g, rows, cols, any_dtype(g));
        if (below(in, 2)) {
            r.flags = KB_REC_AXIS0;
            rows = 1;
        } else {
            cols = 1;
        }
        break;
    case KB_REC_GEMM: {
        uint32_t kd = 1 + below(in, g->maxd);
        r.flags = below(in, 2) ? KB_REC_ACC : 0;
        r.src[0] = place(g, rows, kd, any_dtype(g));
        r.src[1] = place(g, kd, cols, any_dtype(g));
        break;
    }
    case KB_REC_TRANSPOSE:
        r.src[0] = place(g, cols, rows, any_dtype(g));
        break;
    case KB_REC_ATTN_SOFTMAX:
        r.op = (uint8_t)below(in, 2);
        r.imm[0] = any_float(g, 0.1f, 2.0f);
        r.imm[1] = below(in, 2) ? any_float(g, 1.0f, 30.0f) : 0.0f;
        r.src[0] = place(g, rows, cols, any_dtype(g));
        /* the causal offset (a parameter): from every element masked to none */
        r.src[1].addr = (uint64_t)((int64_t)below(in, rows + cols + 3) - (int64_t)rows - 1);
        break;
    case KB_REC_GATHER:
        r.src[0] = place(g, 1 + below(in, g->maxd), cols, any_dtype(g));
        r.src[1] = below(in, 2) ? place(g, 1, rows, any_dtype(g))
                                : place(g, rows, 1, any_dtype(g));
        break;
    case KB_REC_DEQUANT: {
        int sparse = below(in, 2), scaled = below(in, 3) != 0;
        uint32_t rb = 1 + below(in, 4), cb = 1 + below(in, 4), ru = sparse ? 4 * rb : rb;
        rows = (rows + ru - 1) / ru * ru;
        cols = (cols + cb - 1) / cb * cb;
        r.nsrc = (uint8_t)(1 + sparse + scaled);
        r.imm[0] = below(in, 2) ? 1.0f : 0x1p-6f;
        r.src[0] = place(g, sparse ? rows / 2 : rows, cols, any_dtype(g));
        if (sparse) {
            r.flags |= KB_REC_QSPARSE;
            r.src[1] = place(g, (rows + 7) / 8, cols, KB_I8);
        }
        if (scaled) {
            r.flags |= KB_REC_QSCALE;
            r.src[r.nsrc - 1] = place(g, rows / rb, cols / cb, any_dtype(g));
        }
        break;
    }
    case KB_REC_GEN:
        /* parameters, any 64-bit values: where the seeded tiles start, the seed, the tile
         * count of the sign variant */
        r.op = (uint8_t)below(in, 4);
        if (r.op == KB_GEN_QW) { /* a quantized weight's part: two maps of random bytes in
                                  * the payload (ranges and scales past the rules included) */
            uint32_t kq = 1 + below(in, 96), nb = 1 + below(in, 6);
            r.nsrc = 2;
            r.flags = below(in, 2) ? KB_REC_QSPARSE : 0;
            r.src[0] = kb_opnd_make(0, 1, 8 * kq, KB_I8);
            r.src[1] = kb_opnd_make(0, 1, KB_SEEDGEN_COL_BYTES * nb, KB_I8);
            to_payload(g, &r.src[0]);
            to_payload(g, &r.src[1]);
            r.src[2].addr = below(in, 2) ? raw_param(g) : below(in, 64);
            r.src[2].ld = below(in, 8);
            r.src[2].rows = below(in, 4);
            r.src[2].cols = below(in, 7);
            int qdt = kb_seedgen_qw_dtype(r.src[2].cols, r.src[2].rows);
            if (qdt >= 0 && below(in, 8) != 0)
                dt = (kb_dtype)qdt; /* mostly a valid destination */
            break;
        }
        r.src[0].addr = below(in, 2) ? raw_param(g) : below(in, 64);
        r.src[1].addr = below(in, 2) ? raw_param(g) : below(in, 4096);
        r.src[2].addr = below(in, 2) ? raw_param(g) : below(in, 4096);
        r.src[0].rows = (uint32_t)u64(in);
        r.src[0].cols = 1 + below(in, 8);
        if (r.op == KB_GEN_PAT) { /* the benches' pattern: range, transposed, 1/den, term */
            r.src[0].cols = below(in, 4) == 0 ? (uint32_t)u64(in) : below(in, 1u << 12);
            r.src[1].rows = below(in, 8) == 0 ? (uint32_t)u64(in) : below(in, 2);
            r.imm[0] = below(in, 8) == 0 ? bits_float(in)
                                         : ldexpf(1.0f, (int)below(in, 64) - 40);
            r.imm[1] = below(in, 2) ? 0.0f : below(in, 8) == 0 ? bits_float(in)
                                                              : (float)below(in, 9) - 4.0f;
        }
        break;
    default:
        break;
    }
    for (unsigned s = 0; s < r.nsrc; s++)
        if (k != KB_REC_GEN && below(in, 8) == 0)
            to_payload(g, &r.src[s]);
    r.dst = place(g, rows, cols, dt);
    /* in place now and then, when the first source has dst's shape */
    if (k != KB_REC_GEMM && k != KB_REC_REDUCE && k != KB_REC_FILL && k != KB_REC_TRANSPOSE &&
        k != KB_REC_GATHER && k != KB_REC_DEQUANT && k != KB_REC_GEN && below(in, 6) == 0 &&
        r.src[0].rows == rows && r.src[0].cols == cols && r.src[0].space == KB_SPACE_MEM)
        r.dst = r.src[0];
    if (g->corrupt && below(in, 32) == 0)
        do
            corrupt(g, &r);
        while (below(in, 2));
    return r;
}

/* Every memory operand of r inside the window: then the arena is at most a few windows.
 * Records the planner refuses before their operands (kind, source count) count as inside. */
static int in_window(const gen *g, const kb_rec *r)
{
    if (r->kind >= KB_REC_NKINDS || r->nsrc > 3)
        return 1;
    for (unsigned s = 0; s <= r->nsrc; s++) {
        const kb_opnd *o = s == 0 ? &r->dst : &r->src[s - 1];
        uint64_t span, off = o->addr - g->base;
        if (span_of(o, &span) != 0)
            return 0;
        if (o->space == KB_SPACE_MEM && (o->addr < g->base || off > g->win || span > g->win - off))
            return 0;
    }
    return 1;
}

/* The flush's own check beyond the planner's: payload sources inside the payload. */
static int payload_ok(const kb_rec *r, size_t payload_bytes)
{
    for (unsigned s = 0; s < r->nsrc && s < 3; s++) {
        const kb_opnd *o = &r->src[s];
        uint64_t span;
        if (o->space != KB_SPACE_PAYLOAD)
            continue;
        if (span_of(o, &span) != 0 ||
            (span > 0 && (o->addr > payload_bytes || span > payload_bytes - o->addr)))
            return 0;
    }
    return 1;
}

/* ---- checks ---- */

typedef struct flushed {
    size_t first, n;      /* log records [first, first + n) */
    const uint64_t *cuts; /* the log's cuts inside them */
    size_t ncuts;
} flushed;

static size_t epoch_of(const flushed *f, uint64_t seq)
{
    size_t e = 0;
    while (e < f->ncuts && f->cuts[e] <= seq)
        e++;
    return e;
}

/* a before b in the planner's order (epoch, t_start, seq) */
static int key_less(const flushed *f, const kb_rec *a, const kb_rec *b)
{
    size_t ea = epoch_of(f, a->seq), eb = epoch_of(f, b->seq);
    if (ea != eb)
        return ea < eb;
    if (a->t_start != b->t_start)
        return a->t_start < b->t_start;
    return a->seq < b->seq;
}

/* The plan of a flush's records against kb_replay.h's specification. */
static void check_plan(const kb_oplog *log, const flushed *f, const kb_plan *p)
{
    static size_t batch_of[MAX_RECS];
    static unsigned char seen[MAX_RECS];
    size_t next = 0;

    KBF_CHECK(p->nrecs == f->n, "%zu records planned of %zu", p->nrecs, f->n);
    memset(seen, 0, sizeof seen);
    for (size_t b = 0; b < p->nbatches; b++) {
        const kb_batch *bt = &p->batches[b];
        KBF_CHECK(bt->first == next && bt->count > 0 && bt->count <= f->n - next,
                  "batch %zu: [%zu, +%zu) after %zu", b, bt->first, bt->count, next);
        for (size_t i = bt->first; i < bt->first + bt->count; i++) {
            const kb_rec *r = &p->recs[i];
            const kb_opnd *ops[4];
            uint64_t q = r->seq - f->first;
            KBF_CHECK(r->seq >= f->first && q < f->n && !seen[q], "record seq %llu",
                      (unsigned long long)r->seq);
            seen[q] = 1;
            batch_of[q] = b;
            KBF_CHECK(i == bt->first || p->recs[i - 1].kind <= r->kind,
                      "kinds not grouped in batch %zu", b);
            /* rewritten operands address the arena */
            for (unsigned k = 0, m = mem_opnds(r, ops); k < m; k++) {
                uint64_t span;
                KBF_CHECK(span_of(ops[k], &span) == 0,
                          "seq %llu: accepted an operand whose span overflows 64 bits "
                          "(%u x %u, ld %u, dtype %u)", (unsigned long long)r->seq,
                          ops[k]->rows, ops[k]->cols, ops[k]->ld, ops[k]->dtype);
                KBF_CHECK(span == 0 || (ops[k]->addr <= p->arena_bytes &&
                                        span <= p->arena_bytes - ops[k]->addr),
                          "seq %llu: operand [%llu, +%llu) outside the arena of %llu bytes",
                          (unsigned long long)r->seq, (unsigned long long)ops[k]->addr,
                          (unsigned long long)span, (unsigned long long)p->arena_bytes);
            }
        }
        next += bt->count;
    }
    KBF_CHECK(next == f->n, "batches cover %zu of %zu records", next, f->n);
    /* the level schedule, brute force over the log's original addresses */
    for (size_t j = 0; j < f->n; j++) {
        const kb_rec *rj = kb_oplog_at(log, f->first + j);
        size_t want = 0;
        for (size_t i = 0; i < f->n; i++) {
            const kb_rec *ri = kb_oplog_at(log, f->first + i);
            if (i != j && key_less(f, ri, rj) && conflict(ri, rj) && batch_of[i] + 1 > want)
                want = batch_of[i] + 1;
        }
        KBF_CHECK(batch_of[j] == want, "seq %llu in batch %zu, the level schedule says %zu",
                  (unsigned long long)rj->seq, batch_of[j], want);
    }
    /* segments: sorted, disjoint, not touching, inside the arena */
    for (size_t s = 0; s < p->nsegs; s++) {
        const kb_segment *sg = &p->segs[s];
        KBF_CHECK(sg->len > 0 && sg->arena_off <= p->arena_bytes &&
                      sg->len <= p->arena_bytes - sg->arena_off,
                  "segment %zu outside the arena", s);
        KBF_CHECK(s == 0 || p->segs[s - 1].pa + p->segs[s - 1].len < sg->pa,
                  "segments %zu and %zu overlap or touch", s - 1, s);
    }
}

static const kb_rec *order_[MAX_RECS];
static const flushed *order_f_;

static int order_cmp(const void *a, const void *b)
{
    const kb_rec *x = *(const kb_rec *const *)a, *y = *(const kb_rec *const *)b;
    return key_less(order_f_, x, y) ? -1 : key_less(order_f_, y, x);
}

/* The oracle: the flush's records one at a time in the planner's order on a flat copy of
 * the window. */
static void serial_replay(const kb_oplog *log, const flushed *f, uint8_t *flat, uint64_t base)
{
    for (size_t i = 0; i < f->n; i++)
        order_[i] = kb_oplog_at(log, f->first + i);
    order_f_ = f;
    qsort(order_, f->n, sizeof order_[0], order_cmp);
    for (size_t i = 0; i < f->n; i++) {
        kb_rec c = *order_[i];
        for (unsigned s = 0; s <= c.nsrc && s <= 3; s++) {
            kb_opnd *o = s == 0 ? &c.dst : &c.src[s - 1];
            if (o->space == KB_SPACE_MEM && !(s > 0 && c.kind == KB_REC_GEN))
                o->addr -= base;
        }
        kb_ref_exec(&c, flat, kb_oplog_payload(log));
    }
}

/* Plans the records not yet replayed, checks the plan, then (when the log fits the window)
 * flushes them and compares with the oracle. Returns 0 to go on, 1 when done (the records
 * were refused: they stay unreplayed, and every later flush would refuse them again). */
static int flush(gen *g, kb_memstore *ms, kb_backend *be, uint8_t *flat, uint8_t *got)
{
    flushed f;
    const kb_rec *ptrs[MAX_RECS];
    kb_plan plan;
    kb_errbuf eb;
    int prc, rc, pay_ok = 1;

    f.first = kb_oplog_replayed(g->log);
    f.n = kb_oplog_count(g->log) - f.first;
    if (f.n == 0)
        return 0;
    f.ncuts = kb_oplog_cuts_in(g->log, f.first, f.first + f.n, &f.cuts);
    for (size_t i = 0; i < f.n; i++)
        ptrs[i] = kb_oplog_at(g->log, f.first + i);
    eb.msg[0] = '\0';
    prc = kb_plan_build_cut(ptrs, f.n, f.cuts, f.ncuts, NULL, NULL, &plan, &eb);
    if (prc == 0) {
        check_plan(g->log, &f, &plan);
        kb_plan_free(&plan);
    } else {
        KBF_CHECK_ERR(prc, eb);
        /* the refusal names one record: every other one is planned alone, so that a bad
         * record the planner accepts is caught even behind one it refuses */
        for (size_t i = 0; i < f.n; i++) {
            flushed one = { f.first + i, 1, NULL, 0 };
            if (kb_plan_build(&ptrs[i], 1, &plan, NULL) == 0) {
                check_plan(g->log, &one, &plan);
                kb_plan_free(&plan);
            }
        }
    }
    if (!g->fit)
        return prc != 0; /* operands outside the window: the arena could be any size */

    for (size_t i = 0; i < f.n && pay_ok; i++)
        pay_ok = payload_ok(ptrs[i], kb_oplog_payload_size(g->log));
    eb.msg[0] = '\0';
    rc = kb_replay_flush(g->log, ms, be, NULL, &eb);
    KBF_CHECK((rc == 0) == (prc == 0 && pay_ok), "the planner says %d, payload refs %s, the "
              "flush %d: %s", prc, pay_ok ? "ok" : "bad", rc, eb.msg);
    if (rc != 0) {
        KBF_CHECK_ERR(rc, eb);
        KBF_CHECK(kb_oplog_replayed(g->log) == f.first, "a failed flush marked records done");
    } else {
        serial_replay(g->log, &f, flat, g->base);
    }
    eb.msg[0] = '\0';
    KBF_CHECK(kb_memstore_load(ms, g->base, got, g->win, &eb) == 0, "load: %s", eb.msg);
    if (memcmp(got, flat, g->win) != 0) {
        size_t i = 0;
        while (got[i] == flat[i])
            i++;
        KBF_CHECK(0, "window byte %zu (PA 0x%llx): replay 0x%02x, serial 0x%02x%s", i,
                  (unsigned long long)(g->base + i), got[i], flat[i],
                  rc ? " (after a failed flush)" : "");
    }
    return rc != 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t flat[MAX_WIN], got[MAX_WIN];
    static const uint32_t wins[4] = { 256, 1024, 2048, MAX_WIN };
    gen g;
    kb_memstore *ms = NULL;
    kb_backend be = { NULL, NULL };
    unsigned mode;
    size_t nrec = 0;

    if (size > KBF_MAX_INPUT)
        return 0;
    memset(&g, 0, sizeof g);
    g.in.p = data;
    g.in.n = size;
    g.win = wins[below(&g.in, 4)];
    switch (below(&g.in, 4)) {
    case 0: g.base = 0; break;
    case 1: g.base = KB_MEMSTORE_PAGE_BYTES - g.win / 2; break;   /* across a page boundary */
    case 2: g.base = UINT64_MAX - g.win + 1; break;               /* the last bytes of the space */
    default: g.base = u64(&g.in) & ~UINT64_C(7); /* anywhere the window does not wrap */
        if (g.base > UINT64_MAX - g.win + 1)
            g.base = UINT64_MAX - g.win + 1;
    }
    mode = u8(&g.in);
    g.raw = mode & 1;
    g.corrupt = (mode & 4) != 0;
    g.maxd = 1 + below(&g.in, g.win >= 2048 ? 16 : g.win >= 1024 ? 8 : 4);
    g.data = u64(&g.in);
    g.fit = 1;
    if (!(g.log = kb_oplog_create()) || !(ms = kb_memstore_create()) ||
        ((mode & 2) ? kb_ref_backend_create_resident(&be) : kb_ref_backend_create(&be)) != 0)
        KBF_ENV_FAIL("out of memory for the log, the store or the backend");
    fill(&g.data, g.raw, flat, g.win);
    if (kb_memstore_write(ms, g.base, flat, g.win) != 0)
        KBF_ENV_FAIL("out of memory for the store");

    while (g.in.i < g.in.n && nrec < MAX_RECS) {
        unsigned op = u8(&g.in) % 16;
        if (op == 0) {
            if (kb_oplog_cut(g.log) != 0)
                KBF_ENV_FAIL("out of memory for a cut");
        } else if (op == 1) {
            if (flush(&g, ms, &be, flat, got))
                goto out;
        } else {
            /* start times from a small range: ties are common, as in Phase 1 */
            kb_rec r = gen_rec(&g, (kb_time)below(&g.in, 32));
            if (!in_window(&g, &r))
                g.fit = 0;
            if (kb_oplog_append(g.log, &r, NULL) != 0)
                KBF_ENV_FAIL("out of memory for a record");
            nrec++;
        }
    }
    (void)flush(&g, ms, &be, flat, got);
out:
    be.ops->destroy(be.self);
    kb_memstore_destroy(ms);
    kb_oplog_destroy(g.log);
    return 0;
}
