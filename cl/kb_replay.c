/*
 * kb_replay — the Phase-2 planner and the flush that drives a backend. The planner validates
 * records, orders them by (t_start, seq) and gives each one a batch by level scheduling: its
 * batch is one past the latest batch of any earlier record it conflicts with (it reads bytes
 * that one writes, or writes bytes that one reads or writes), or 0. Conflicting records thus
 * keep their (t_start, seq) order across batches, so replaying batch 0, 1, 2, ... equals the
 * serial replay, while independent records fall into the earliest batch they can; the batch
 * count is the longest conflict chain. Conflicts use exact byte intervals: a record's reads are
 * its MEM sources' spans, its write is its dst span; payload sources never conflict because the
 * payload is read-only. Span endpoints are ranked among the flush's distinct endpoint
 * addresses (through a hash table, as real logs reuse the same buffers over and over, then a
 * sort of the distinct ones; or a sort of all endpoints when most are distinct), which cuts the
 * address space into elementary intervals. Over those intervals a 16-ary max tree with lazy
 * "raise to at least" tags keeps the latest batch that wrote and that read each byte, so a
 * query or update costs a few node visits for the small spans of real logs and O(16 log m) at
 * worst. The same intervals give the arena: maximal runs of touched intervals are coalesced
 * segments, packed in PA order, each at an arena offset congruent to its PA modulo 8 so that
 * every operand keeps the natural alignment it had in simulated memory; MEM operands are
 * rewritten to arena offsets. Each batch is grouped by kind (stable). All sorting is a stable
 * LSD radix sort (no comparator calls, same result on every libc). A placer (kb_plan_build_ex)
 * may give the segments other offsets, such as a device-resident backend's (kb_resident.c);
 * the leaves' offsets then follow their segments. The flush of a host backend builds a fresh
 * arena from the memory store and writes the written segments back; that of a resident
 * backend moves only what kb_resident decides. Limits: spans are conservative for strided
 * operands (the gaps between rows count as touched); at most 2^32 / 8 records per flush.
 */
#include "kb_replay.h"

#include "kb_bigmem.h"
#include "kb_progress.h"
#include "kb_resident.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct ival {
    uint64_t lo, hi; /* [lo, hi) */
} ival;

/* ---------------------------------------------------------------- validation */

static unsigned nsrc_of(unsigned kind)
{
    static const unsigned n[KB_REC_NKINDS] = { 1, 0, 1, 2, 3, 1, 1, 1, 2, 1, 1, 2,
                                               /* dequant: at least (see check_dequant) */ 1,
                                               /* gen: parameters, no operands */ 0 };
    return kind < KB_REC_NKINDS ? n[kind] : 0;
}

static int bad(const kb_rec *r, kb_errbuf *eb, const char *what)
{
    return kb_err_set(eb, KB_ERR_INVAL, "op log record seq %llu (%s): %s",
                      (unsigned long long)r->seq, kb_rec_kind_name((kb_rec_kind)r->kind), what);
}

static int check_opnd(const kb_rec *r, const kb_opnd *o, kb_errbuf *eb)
{
    if (o->dtype >= KB_NDTYPES)
        return bad(r, eb, "operand dtype out of range");
    if (o->space != KB_SPACE_MEM && o->space != KB_SPACE_PAYLOAD)
        return bad(r, eb, "operand space out of range");
    if (o->rows > 1 && o->ld < o->cols)
        return bad(r, eb, "operand row stride ld < cols");
    /* (rows - 1) * ld + cols fits in 64 bits for any 32-bit shape, its bytes need not: a
     * kb_opnd_span that wrapped would plan a few bytes for an operand the kernels then walk
     * far past (found by tests/fuzz/fuzz_replay.c) */
    if (o->rows > 0 && o->cols > 0 &&
        (uint64_t)(o->rows - 1) * o->ld + o->cols > UINT64_MAX / kb_dtype_size((kb_dtype)o->dtype))
        return bad(r, eb, "operand spans more than 2^64 bytes");
    if (o->addr > UINT64_MAX - kb_opnd_span(o))
        return bad(r, eb, "operand wraps around the address space");
    return 0;
}

static int bcasts(const kb_opnd *s, const kb_opnd *d)
{
    return (s->rows == d->rows || s->rows == 1) && (s->cols == d->cols || s->cols == 1);
}

/* The kinds of kb_tl_nn (kb_oplog.h): shapes and ops. */
static int check_nn_rec(const kb_rec *r, kb_errbuf *eb)
{
    const kb_opnd *d = &r->dst, *s = r->src;

    switch (r->kind) {
    case KB_REC_TRANSPOSE:
        if (s[0].rows != d->cols || s[0].cols != d->rows)
            return bad(r, eb, "transpose needs a C x R destination for an R x C source");
        return 0;
    case KB_REC_ATTN_SOFTMAX:
        if (r->op > 1)
            return bad(r, eb, "attn_softmax causal flag must be 0 or 1");
        if (s[0].rows != d->rows || s[0].cols != d->cols)
            return bad(r, eb, "attn_softmax source and destination shapes differ");
        return 0;
    case KB_REC_GATHER:
        if (s[0].cols != d->cols)
            return bad(r, eb, "gather table and destination widths differ");
        if (!((s[1].rows == 1 && s[1].cols == d->rows) || (s[1].cols == 1 && s[1].rows == d->rows)))
            return bad(r, eb, "gather needs one id per destination row (1 x n or n x 1)");
        return 0;
    default:
        return bad(r, eb, "not a kb_tl_nn kind");
    }
}

/* DEQUANT (kb_oplog.h): the elements, the 2:4 metadata and the scale fit the destination. */
static int check_dequant(const kb_rec *r, kb_errbuf *eb)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    if (r->flags & KB_REC_QSPARSE) {
        if (d->rows % 4 != 0 || s[0].rows * 2 != d->rows || s[0].cols != d->cols)
            return bad(r, eb, "sparse dequant needs R % 4 == 0 and R/2 x C kept values");
        if (s[1].rows != (d->rows + 7) / 8 || s[1].cols != d->cols || s[1].dtype != KB_I8)
            return bad(r, eb, "sparse dequant needs ceil(R/8) x C i8 metadata");
    } else if (s[0].rows != d->rows || s[0].cols != d->cols) {
        return bad(r, eb, "dequant elements and destination shapes differ");
    }
    if (r->flags & KB_REC_QSCALE) {
        const kb_opnd *sc = &s[r->nsrc - 1];
        if (sc->rows == 0 || sc->cols == 0 || d->rows % sc->rows != 0 ||
            d->cols % sc->cols != 0)
            return bad(r, eb, "dequant scale shape does not divide the destination's");
    }
    return 0;
}

static int check_rec(const kb_rec *r, kb_errbuf *eb)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    int rc;

    if (r->kind >= KB_REC_NKINDS)
        return kb_err_set(eb, KB_ERR_INVAL, "op log record seq %llu: unknown kind %u",
                          (unsigned long long)r->seq, (unsigned)r->kind);
    if (r->kind == KB_REC_DEQUANT
            ? r->nsrc != 1u + !!(r->flags & KB_REC_QSPARSE) + !!(r->flags & KB_REC_QSCALE)
            : r->nsrc != nsrc_of(r->kind))
        return bad(r, eb, "wrong number of sources");
    if (d->space != KB_SPACE_MEM)
        return bad(r, eb, "destination not in memory");
    if ((rc = check_opnd(r, d, eb)) != 0)
        return rc;
    for (unsigned i = 0; i < r->nsrc; i++)
        if ((rc = check_opnd(r, &s[i], eb)) != 0)
            return rc;
    switch (r->kind) {
    case KB_REC_MATH1:
        if (r->op >= KB_M1_NOPS)
            return bad(r, eb, "math1 op out of range");
        break;
    case KB_REC_MATH2:
        if (r->op >= KB_M2_NOPS)
            return bad(r, eb, "math2 op out of range");
        break;
    case KB_REC_SOFTMAX:
        if (r->op > 1)
            return bad(r, eb, "softmax axis must be 0 or 1");
        if (s[0].rows != d->rows || s[0].cols != d->cols)
            return bad(r, eb, "softmax source and destination shapes differ");
        return 0;
    case KB_REC_REDUCE:
        if (r->op >= KB_RED_NOPS)
            return bad(r, eb, "reduce op out of range");
        if (r->flags & KB_REC_AXIS0) {
            if (d->rows != 1 || d->cols != s[0].cols)
                return bad(r, eb, "axis-0 reduce needs a 1 x cols destination");
        } else if (d->cols != 1 || d->rows != s[0].rows) {
            return bad(r, eb, "axis-1 reduce needs a rows x 1 destination");
        }
        return 0;
    case KB_REC_GEMM:
        if (s[0].rows != d->rows || s[1].cols != d->cols || s[0].cols != s[1].rows)
            return bad(r, eb, "gemm shapes do not chain (MxK @ KxN -> MxN)");
        return 0;
    case KB_REC_TRANSPOSE:
    case KB_REC_ATTN_SOFTMAX:
    case KB_REC_GATHER:
        return check_nn_rec(r, eb);
    case KB_REC_DEQUANT:
        return check_dequant(r, eb);
    case KB_REC_GEN:
        if (r->op > KB_GEN_SIGN)
            return bad(r, eb, "gen op out of range");
        if (r->op == KB_GEN_SIGN && r->src[0].cols == 0)
            return bad(r, eb, "gen sign variant needs ntiles >= 1");
        return 0;
    default:
        break;
    }
    for (unsigned i = 0; i < r->nsrc; i++)
        if (!bcasts(&s[i], d))
            return bad(r, eb, "source shape does not broadcast to the destination");
    return 0;
}

int kb_rec_check_placed(const kb_rec *r, uint64_t arena_bytes, uint64_t payload_bytes,
                        kb_errbuf *eb)
{
    const kb_opnd *o[4] = { &r->dst, &r->src[0], &r->src[1], &r->src[2] };
    int rc = check_rec(r, eb);

    if (rc)
        return rc;
    /* GEN's parameters: the first tile and element get a 32-bit index added as int64_t */
    if (r->kind == KB_REC_GEN)
        for (unsigned i = 0; i < 3; i++)
            if (r->src[i].addr > (uint64_t)INT64_MAX - UINT32_MAX)
                return bad(r, eb, "gen parameter out of range");
    /* check_rec bounds nsrc by 3; the span is computed here without kb_opnd_span, whose
     * product by the element size can wrap for rows and ld near 2^32 */
    for (unsigned i = 0; i <= r->nsrc; i++) {
        uint64_t lim = o[i]->space == KB_SPACE_PAYLOAD ? payload_bytes : arena_bytes;
        uint64_t esz = kb_dtype_size((kb_dtype)o[i]->dtype), elems;
        if (o[i]->rows == 0 || o[i]->cols == 0) {
            /* no bytes, but a backend may still loop over its other extent: no longer than
             * over an operand the space could hold (a 1 x 0 one fits anywhere) */
            uint64_t cap = lim / esz > 0 ? lim / esz : 1;
            if (o[i]->rows > cap || o[i]->cols > cap)
                return bad(r, eb, "empty operand with an extent its space could not hold");
            if (o[i]->addr > lim) /* its base is still computed */
                return bad(r, eb, "empty operand beyond its space");
            continue;
        }
        elems = (uint64_t)(o[i]->rows - 1) * o[i]->ld + o[i]->cols; /* < 2^64: no wrap */
        if (elems > lim / esz || o[i]->addr > lim - elems * esz)
            return bad(r, eb, o[i]->space == KB_SPACE_PAYLOAD ? "operand beyond the payload"
                                                              : "operand beyond the arena");
    }
    return 0;
}

/* ---------------------------------------------------------------- sorting */

/* A sort item: a 64-bit key and what it belongs to. */
typedef struct kv {
    uint64_t key, val;
} kv;

/*
 * Stable LSD radix sort of a[0..n) by key, one byte per pass; passes in which every key has
 * the same byte are skipped, so small key ranges cost few passes, and sorted input costs one
 * scan. tmp holds n items.
 */
static void radix_sort(kv *a, kv *tmp, size_t n)
{
    size_t cnt[8][256];
    kv *src = a, *dst = tmp;

    if (n < 2)
        return;
    size_t sorted = 1; /* common: records arrive in seq order */
    while (sorted < n && a[sorted - 1].key <= a[sorted].key)
        sorted++;
    if (sorted == n)
        return;
    memset(cnt, 0, sizeof cnt);
    for (size_t i = 0; i < n; i++)
        for (unsigned b = 0; b < 8; b++)
            cnt[b][(a[i].key >> (8 * b)) & 0xFFu]++;
    for (unsigned b = 0; b < 8; b++) {
        if (cnt[b][(a[0].key >> (8 * b)) & 0xFFu] == n)
            continue;
        size_t pos = 0;
        for (unsigned d = 0; d < 256; d++) {
            size_t c = cnt[b][d];
            cnt[b][d] = pos;
            pos += c;
        }
        for (size_t i = 0; i < n; i++)
            dst[cnt[b][(src[i].key >> (8 * b)) & 0xFFu]++] = src[i];
        kv *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sizeof *a);
}

/* ---------------------------------------------------------------- spans and endpoints */

static int mem_ival(const kb_opnd *o, ival *v)
{
    uint64_t span = kb_opnd_span(o);
    if (o->space != KB_SPACE_MEM || span == 0)
        return 0;
    v->lo = o->addr;
    v->hi = o->addr + span;
    return 1;
}

/* Reads (MEM sources) and write (dst) of a record; returns the number of reads. */
static unsigned rec_ivals(const kb_rec *r, ival reads[3], ival *write, int *has_write)
{
    unsigned n = 0;
    for (unsigned i = 0; i < r->nsrc; i++)
        n += (unsigned)mem_ival(&r->src[i], &reads[n]);
    *has_write = mem_ival(&r->dst, write);
    return n;
}

/*
 * The planner's scratch. What the later passes need is gathered from the records once, in
 * input order, so that the passes in (t_start, seq) order read small arrays instead of
 * scattered records, and freshly allocated memory (whose first touch is costly) stays small.
 * Endpoints: each record's MEM spans, sources in order then dst, give two endpoints each (lo,
 * hi), numbered consecutively from efirst[record].
 */
typedef struct plan_tmp {
    kv *keys, *ktmp;   /* n: record order; ktmp is sort scratch, then the batch-major order */
    uint64_t *tkey;    /* n, by input index: t_start as an unsigned sort key */
    uint8_t *meta;     /* n, by input index: MEM reads | has_write << 2 | kind << 3 */
    uint32_t *efirst;  /* n, by input index: first endpoint */
    uint32_t *rank;    /* by endpoint: index of its address among the distinct ones */
    uint64_t *uaddr;   /* nranks distinct endpoint addresses, ascending */
    size_t nranks;
    uint64_t *leafoff; /* by rank: the arena offset of that address (where it is covered) */
    uint32_t *lvl;     /* n, by sorted position: batch */
    uint32_t *dest;    /* n, by input index: position in the plan */
    size_t *bstart;    /* nbatches + 1 */
} plan_tmp;

static void plan_tmp_free(plan_tmp *t)
{
    kb_bigmem_free(t->keys);
    kb_bigmem_free(t->ktmp);
    kb_bigmem_free(t->tkey);
    kb_bigmem_free(t->meta);
    kb_bigmem_free(t->efirst);
    kb_bigmem_free(t->rank);
    free(t->uaddr);
    free(t->leafoff);
    kb_bigmem_free(t->lvl);
    kb_bigmem_free(t->dest);
    free(t->bstart);
}

/*
 * Distinct endpoint addresses, numbered in order of appearance, in an open-addressing hash
 * table. Real logs touch the same buffers over and over, so there are few; when most addresses
 * turn out distinct, sorting all endpoints is cheaper and the table gives up.
 */
typedef struct uhash {
    uint64_t *key;  /* cap slots */
    uint32_t *id;   /* cap slots: id + 1, 0 = empty */
    size_t cap;
    unsigned bits;  /* cap == 1 << bits */
    uint64_t *ua;   /* by id: the address */
    size_t nu, ucap;
} uhash;

static void uhash_free(uhash *h)
{
    free(h->key);
    free(h->id);
    free(h->ua);
    memset(h, 0, sizeof *h);
}

static size_t uhash_slot(uint64_t a, unsigned bits)
{
    return (size_t)((a * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - bits));
}

static int uhash_resize(uhash *h, unsigned bits)
{
    size_t cap = (size_t)1 << bits;
    uint64_t *key = malloc(cap * sizeof *key);
    uint32_t *id = calloc(cap, sizeof *id);

    if (!key || !id) {
        free(key);
        free(id);
        return KB_ERR_NOMEM;
    }
    for (size_t j = 0; j < h->nu; j++) {
        size_t s = uhash_slot(h->ua[j], bits);
        while (id[s])
            s = (s + 1) & (cap - 1);
        key[s] = h->ua[j];
        id[s] = (uint32_t)(j + 1);
    }
    free(h->key);
    free(h->id);
    h->key = key;
    h->id = id;
    h->cap = cap;
    h->bits = bits;
    return 0;
}

/*
 * The id of address a (added if new) in *id; seen: endpoints looked up so far. Returns 1 when
 * giving up (most addresses distinct and the table large), or KB_ERR_NOMEM.
 */
static int uhash_id(uhash *h, uint64_t a, size_t seen, uint32_t *id)
{
    size_t s = uhash_slot(a, h->bits);
    while (h->id[s] && h->key[s] != a)
        s = (s + 1) & (h->cap - 1);
    if (h->id[s]) {
        *id = h->id[s] - 1;
        return 0;
    }
    if (h->nu == h->ucap) {
        size_t c = h->ucap ? 2 * h->ucap : 1024;
        uint64_t *g = realloc(h->ua, c * sizeof *h->ua);
        if (!g)
            return KB_ERR_NOMEM;
        h->ua = g;
        h->ucap = c;
    }
    h->ua[h->nu] = a;
    h->key[s] = a;
    h->id[s] = (uint32_t)++h->nu;
    *id = (uint32_t)(h->nu - 1);
    if (2 * h->nu > h->cap) { /* keep the load at most 1/2 */
        if (h->bits >= 15 && 4 * h->nu > seen)
            return 1;
        return uhash_resize(h, h->bits + 1);
    }
    return 0;
}

/*
 * Validates recs and fills keys (by seq), tkey, meta, efirst, and, while the hash table copes,
 * rank with the endpoints' ids (*hashed = 1); *ne: endpoint count.
 */
static int plan_gather(const kb_rec *const *recs, size_t n, plan_tmp *t, uhash *h, int *hashed,
                       size_t *ne, kb_errbuf *eb)
{
    size_t e = 0;
    int rc;

    *hashed = 1;
    for (size_t i = 0; i < n; i++) {
        const kb_rec *r = recs[i];
        ival iv[4];
        int has_write;
        unsigned nr;

        if (!r)
            return kb_err_set(eb, KB_ERR_INVAL, "plan: record %zu is NULL", i);
        if ((rc = check_rec(r, eb)) != 0)
            return rc;
        nr = rec_ivals(r, iv, &iv[3], &has_write);
        t->keys[i].key = r->seq;
        t->keys[i].val = i;
        /* Flip the sign bit so that signed times sort as unsigned keys. */
        t->tkey[i] = (uint64_t)r->t_start ^ (UINT64_C(1) << 63);
        t->meta[i] = (uint8_t)(nr | (unsigned)has_write << 2 | (unsigned)r->kind << 3);
        t->efirst[i] = (uint32_t)e;
        if (has_write)
            iv[nr++] = iv[3];
        for (unsigned k = 0; k < 2 * nr; k++, e++) {
            if (!*hashed)
                continue;
            rc = uhash_id(h, (k & 1u) ? iv[k / 2].hi : iv[k / 2].lo, e + 1, &t->rank[e]);
            if (rc < 0)
                return rc;
            if (rc == 1) {
                *hashed = 0;
                uhash_free(h);
            }
        }
    }
    *ne = e;
    return 0;
}

/* Ranks kv items sorted by key into rank[val]; the distinct keys go to uaddr. */
static size_t rank_sorted(const kv *s, size_t m, uint32_t *rank, uint64_t *uaddr)
{
    size_t r = 0;
    for (size_t i = 0; i < m; i++) {
        if (i == 0 || s[i].key != s[i - 1].key)
            uaddr[r++] = s[i].key;
        rank[s[i].val] = (uint32_t)(r - 1);
    }
    return r;
}

/* Turns the hash ids in t->rank into ranks: sorts the distinct addresses only. */
static int rank_by_hash(plan_tmp *t, uhash *h, size_t ne)
{
    size_t nu = h->nu;
    kv *uk = malloc((nu ? nu : 1) * sizeof *uk), *tmp = malloc((nu ? nu : 1) * sizeof *tmp);
    uint32_t *urank = malloc((nu ? nu : 1) * sizeof *urank);
    int rc = KB_ERR_NOMEM;

    if (!uk || !tmp || !urank)
        goto out;
    for (size_t j = 0; j < nu; j++) {
        uk[j].key = h->ua[j];
        uk[j].val = j;
    }
    radix_sort(uk, tmp, nu);
    t->nranks = rank_sorted(uk, nu, urank, h->ua); /* all distinct: nranks == nu */
    for (size_t e = 0; e < ne; e++)
        t->rank[e] = urank[t->rank[e]];
    t->uaddr = h->ua;
    h->ua = NULL;
    rc = 0;
out:
    free(uk);
    free(tmp);
    free(urank);
    return rc;
}

/* Ranks every endpoint by sorting them all; walks the records again in gathering order. */
static int rank_by_sort(plan_tmp *t, const kb_rec *const *recs, size_t n, size_t ne)
{
    kv *s = malloc((ne ? ne : 1) * sizeof *s), *tmp = malloc((ne ? ne : 1) * sizeof *tmp);
    size_t e = 0;
    int rc = KB_ERR_NOMEM;

    t->uaddr = malloc((ne ? ne : 1) * sizeof *t->uaddr);
    if (!s || !tmp || !t->uaddr)
        goto out;
    for (size_t i = 0; i < n; i++) {
        ival iv[4];
        int has_write;
        unsigned nr = rec_ivals(recs[i], iv, &iv[3], &has_write);
        if (has_write)
            iv[nr++] = iv[3];
        for (unsigned k = 0; k < nr; k++) {
            s[e].key = iv[k].lo;
            s[e].val = e;
            e++;
            s[e].key = iv[k].hi;
            s[e].val = e;
            e++;
        }
    }
    assert(e == ne);
    radix_sort(s, tmp, ne);
    t->nranks = rank_sorted(s, ne, t->rank, t->uaddr);
    rc = 0;
out:
    free(s);
    free(tmp);
    return rc;
}

/* ---------------------------------------------------------------- level map */

/*
 * Over the elementary intervals between consecutive distinct endpoints (leaves), the latest
 * batch + 1 that wrote ([LV_W]) and that read ([LV_R]) each; 0 = none. Level k > 0 node i covers
 * leaves [i * 16^k, (i + 1) * 16^k); its mx is the largest value applied to any leaf below it
 * (so a parent's mx is never below a child's), its tag a value applied to every leaf below it,
 * pushed nowhere: a leaf's value is the max of its own and its ancestors' tags. A range is split
 * into the maximal nodes it covers, so every strict ancestor of a covering node also contains
 * the range's first or last leaf, and the walks up from those two leaves see every tag (query)
 * and raise every mx (update) the range involves.
 */
enum { LV_FAN = 16, LV_MAXLEV = 17, LV_W = 0, LV_R = 1 };

typedef struct lvleaf {
    uint32_t v[2];
} lvleaf;

typedef struct lvnode {
    uint32_t mx[2], tag[2];
} lvnode;

typedef struct lvmap {
    unsigned nlev;
    int tagged;             /* some node above the leaves has a tag */
    lvleaf *leaf;
    lvnode *lev[LV_MAXLEV]; /* lev[1..nlev); lev[1] owns the allocation */
} lvmap;

static void lvmap_free(lvmap *m)
{
    free(m->leaf);
    free(m->lev[1]);
}

static int lvmap_init(lvmap *m, size_t leaves)
{
    size_t len[LV_MAXLEV], total = 0;
    unsigned k = 0;

    memset(m, 0, sizeof *m);
    len[0] = leaves ? leaves : 1;
    while (len[k] > LV_FAN) {
        len[k + 1] = (len[k] + LV_FAN - 1) / LV_FAN;
        total += len[++k];
    }
    m->nlev = k + 1;
    m->leaf = calloc(len[0], sizeof *m->leaf);
    if (!m->leaf)
        return KB_ERR_NOMEM;
    if (total == 0)
        return 0;
    m->lev[1] = calloc(total, sizeof(lvnode));
    if (!m->lev[1])
        return KB_ERR_NOMEM;
    for (unsigned i = 2; i < m->nlev; i++)
        m->lev[i] = m->lev[i - 1] + len[i - 1];
    return 0;
}

/* mask: bit LV_W = writes, bit LV_R = reads. */
static uint32_t lv_pick(const uint32_t v[2], unsigned mask)
{
    uint32_t a = (mask & (1u << LV_W)) ? v[LV_W] : 0, b = (mask & (1u << LV_R)) ? v[LV_R] : 0;
    return a > b ? a : b;
}

static uint32_t lv_scan(const lvmap *m, unsigned k, size_t lo, size_t hi, unsigned mask)
{
    uint32_t best = 0, v;
    for (size_t i = lo; i < hi; i++) {
        v = k == 0 ? lv_pick(m->leaf[i].v, mask) : lv_pick(m->lev[k][i].mx, mask);
        if (v > best)
            best = v;
    }
    return best;
}

static void lv_raise_span(lvmap *m, unsigned k, size_t lo, size_t hi, unsigned w, uint32_t v)
{
    for (size_t i = lo; i < hi; i++) {
        if (k == 0) {
            if (m->leaf[i].v[w] < v)
                m->leaf[i].v[w] = v;
            continue;
        }
        lvnode *nd = &m->lev[k][i];
        m->tagged = 1;
        if (nd->mx[w] < v)
            nd->mx[w] = v;
        if (nd->tag[w] < v)
            nd->tag[w] = v;
    }
}

/* Largest value of the kinds in mask over leaves [l, r), l < r. */
static uint32_t lv_query(const lvmap *m, size_t l, size_t r, unsigned mask)
{
    uint32_t best = 0, v;
    size_t lo = l, hi = r, a = l, b = r - 1;
    unsigned k = 0;

    for (;;) {
        size_t plo = (lo + LV_FAN - 1) / LV_FAN, phi = hi / LV_FAN;
        if (k + 1 < m->nlev && plo < phi) { /* whole parents inside: cover them one level up */
            if ((v = lv_scan(m, k, lo, plo * LV_FAN, mask)) > best)
                best = v;
            if ((v = lv_scan(m, k, phi * LV_FAN, hi, mask)) > best)
                best = v;
            lo = plo;
            hi = phi;
            k++;
            continue;
        }
        if ((v = lv_scan(m, k, lo, hi, mask)) > best)
            best = v;
        break;
    }
    for (k = 1; m->tagged && k < m->nlev; k++) {
        a /= LV_FAN;
        b /= LV_FAN;
        if ((v = lv_pick(m->lev[k][a].tag, mask)) > best)
            best = v;
        if (b != a && (v = lv_pick(m->lev[k][b].tag, mask)) > best)
            best = v;
    }
    return best;
}

/* Raises kind w (LV_W or LV_R) of leaves [l, r), l < r, to at least v. */
static void lv_raise(lvmap *m, size_t l, size_t r, unsigned w, uint32_t v)
{
    size_t lo = l, hi = r, a = l, b = r - 1;
    unsigned k;
    int up_a = 1, up_b = 1;

    /* Ancestors first, while every parent's mx is still at least its children's: a walk can
     * then stop at the first node that already holds v. */
    for (k = 1; k < m->nlev && (up_a || up_b); k++) {
        a /= LV_FAN;
        b /= LV_FAN;
        if (up_a) {
            if (m->lev[k][a].mx[w] < v)
                m->lev[k][a].mx[w] = v;
            else
                up_a = 0;
        }
        if (b == a) {
            up_b = up_a;
        } else if (up_b) {
            if (m->lev[k][b].mx[w] < v)
                m->lev[k][b].mx[w] = v;
            else
                up_b = 0;
        }
    }
    for (k = 0;;) {
        size_t plo = (lo + LV_FAN - 1) / LV_FAN, phi = hi / LV_FAN;
        if (k + 1 < m->nlev && plo < phi) {
            lv_raise_span(m, k, lo, plo * LV_FAN, w, v);
            lv_raise_span(m, k, phi * LV_FAN, hi, w, v);
            lo = plo;
            hi = phi;
            k++;
            continue;
        }
        lv_raise_span(m, k, lo, hi, w, v);
        break;
    }
}

/* ---------------------------------------------------------------- planner */

/*
 * Gives every sorted record p (input index keys[p].val) its batch lvl[p]; *nbatches receives
 * the count. A span is the leaf range [rank(lo), rank(hi)).
 */
static int plan_levels(plan_tmp *t, size_t n, size_t *nbatches)
{
    lvmap map;
    size_t nb = 0;
    int rc;

    if ((rc = lvmap_init(&map, t->nranks)) != 0)
        goto out;
    for (size_t p = 0; p < n; p++) {
        size_t i = t->keys[p].val;
        const uint32_t *rk = t->rank + t->efirst[i];
        unsigned nr = t->meta[i] & 3u, has_write = (t->meta[i] >> 2) & 1u;
        const uint32_t *wr = rk + 2 * nr; /* the write's endpoints */
        uint32_t top = 0, v;

        for (unsigned k = 0; k < nr; k++)
            if ((v = lv_query(&map, rk[2 * k], rk[2 * k + 1], 1u << LV_W)) > top)
                top = v;
        if (has_write && (v = lv_query(&map, wr[0], wr[1], (1u << LV_W) | (1u << LV_R))) > top)
            top = v;
        /* The map holds batch + 1, so top is one past the latest conflicting batch: ours. */
        t->lvl[p] = top;
        if (top + 1 > nb)
            nb = top + 1;
        if (has_write)
            lv_raise(&map, wr[0], wr[1], LV_W, top + 1);
        for (unsigned k = 0; k < nr; k++)
            lv_raise(&map, rk[2 * k], rk[2 * k + 1], LV_R, top + 1);
    }
    *nbatches = nb;
out:
    lvmap_free(&map);
    return rc;
}

/*
 * Lays out the arena over the leaves: maximal runs of leaves that some span covers are the
 * segments (spans that overlap or touch share one), packed in PA order, each at an offset
 * congruent to its PA modulo 8. Fills p->segs, p->nsegs, p->arena_bytes and t->leafoff.
 */
static int plan_arena(plan_tmp *t, size_t n, kb_plan *p)
{
    size_t nr = t->nranks, nseg = 0;
    /* Coverage counts as differences at span ends; a leaf is touched where the sum is > 0. */
    int64_t *cov = calloc(nr + 1, sizeof *cov), *wcov = calloc(nr + 1, sizeof *wcov);
    int64_t c = 0, wc = 0;
    uint64_t end = 0;
    int rc = KB_ERR_NOMEM;

    size_t nw = 0;
    p->segs = malloc((nr ? nr : 1) * sizeof *p->segs); /* shrunk below */
    p->wruns = malloc((nr ? nr : 1) * sizeof *p->wruns);
    if (!cov || !wcov || !p->segs || !p->wruns)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *rk = t->rank + t->efirst[i];
        unsigned ns = (t->meta[i] & 3u) + ((t->meta[i] >> 2) & 1u);
        for (unsigned k = 0; k < ns; k++) {
            cov[rk[2 * k]]++;
            cov[rk[2 * k + 1]]--;
        }
        if ((t->meta[i] >> 2) & 1u) {
            wcov[rk[2 * ns - 2]]++;
            wcov[rk[2 * ns - 1]]--;
        }
    }
    for (size_t j = 0; j + 1 < nr; j++) { /* leaf j is [uaddr[j], uaddr[j + 1]) */
        c += cov[j];
        wc += wcov[j];
        if (c == 0)
            continue;
        kb_segment *sg = nseg > 0 ? &p->segs[nseg - 1] : NULL;
        if (!sg || sg->pa + sg->len != t->uaddr[j]) {
            uint64_t off = end + ((t->uaddr[j] - end) & 7u); /* keep the PA's alignment mod 8 */
            sg = &p->segs[nseg++];
            sg->pa = t->uaddr[j];
            sg->len = 0;
            sg->arena_off = off;
            sg->written = 0;
        }
        t->leafoff[j] = sg->arena_off + (t->uaddr[j] - sg->pa);
        sg->len = t->uaddr[j + 1] - sg->pa;
        if (wc > 0) {
            sg->written = 1;
            if (nw > 0 && p->wruns[nw - 1].hi == t->uaddr[j])
                p->wruns[nw - 1].hi = t->uaddr[j + 1];
            else
                p->wruns[nw++] = (kb_range){ t->uaddr[j], t->uaddr[j + 1] };
        }
        end = sg->arena_off + sg->len;
    }
    p->nsegs = nseg;
    p->nwruns = nw;
    if (nseg > 0) {
        kb_segment *shrunk = realloc(p->segs, nseg * sizeof *p->segs);
        if (shrunk)
            p->segs = shrunk;
    }
    if (nw > 0) {
        kb_range *shrunk = realloc(p->wruns, nw * sizeof *p->wruns);
        if (shrunk)
            p->wruns = shrunk;
    }
    p->arena_bytes = (end + 7u) & ~(uint64_t)7u;
    rc = 0;
out:
    free(cov);
    free(wcov);
    return rc;
}

/* Rewrites a copied record's MEM operands to arena offsets; e: its first endpoint. */
static void rewrite_opnds(kb_rec *r, const plan_tmp *t, size_t e)
{
    for (unsigned s = 0; s <= r->nsrc; s++) {
        kb_opnd *o = s < r->nsrc ? &r->src[s] : &r->dst; /* endpoint order: sources, then dst */
        if (o->space != KB_SPACE_MEM)
            continue;
        if (kb_opnd_span(o) == 0) {
            o->addr = 0; /* never dereferenced */
            continue;
        }
        o->addr = t->leafoff[t->rank[e]];
        e += 2;
    }
}

void kb_plan_free(kb_plan *p)
{
    if (!p)
        return;
    kb_bigmem_free(p->recs);
    free(p->batches);
    free(p->segs);
    free(p->wruns);
    memset(p, 0, sizeof *p);
}

/* After a placer moved the segments: every covered leaf's offset follows its segment. */
static void replace_leaves(plan_tmp *t, const kb_plan *p)
{
    size_t k = 0;
    for (size_t j = 0; j + 1 < t->nranks; j++) {
        uint64_t a = t->uaddr[j];
        while (k < p->nsegs && p->segs[k].pa + p->segs[k].len <= a)
            k++;
        if (k == p->nsegs)
            break;
        if (p->segs[k].pa <= a)
            t->leafoff[j] = p->segs[k].arena_off + (a - p->segs[k].pa);
    }
}

int kb_plan_build(const kb_rec *const *recs, size_t n, kb_plan *out, kb_errbuf *eb)
{
    return kb_plan_build_ex(recs, n, NULL, NULL, out, eb);
}

int kb_plan_build_ex(const kb_rec *const *recs, size_t n, kb_plan_place_fn place, void *ctx,
                     kb_plan *out, kb_errbuf *eb)
{
    return kb_plan_build_cut(recs, n, NULL, 0, place, ctx, out, eb);
}

/* Sorts t->keys (by seq on entry) into (epoch, t_start, seq) order, each pass stable. */
static int plan_order(plan_tmp *t, size_t n, const uint64_t *cuts, size_t ncuts)
{
    uint32_t *ep = NULL;

    if (ncuts) {
        size_t c = 0;
        if (!(ep = malloc(n * sizeof *ep)))
            return KB_ERR_NOMEM;
        for (size_t p = 0; p < n; p++) { /* keys are in seq order: epochs only grow */
            while (c < ncuts && cuts[c] <= t->keys[p].key)
                c++;
            ep[t->keys[p].val] = (uint32_t)c;
        }
    }
    for (size_t p = 0; p < n; p++)
        t->keys[p].key = t->tkey[t->keys[p].val];
    radix_sort(t->keys, t->ktmp, n);
    if (ep) {
        for (size_t p = 0; p < n; p++)
            t->keys[p].key = ep[t->keys[p].val];
        radix_sort(t->keys, t->ktmp, n);
        free(ep);
    }
    return 0;
}

int kb_plan_build_cut(const kb_rec *const *recs, size_t n, const uint64_t *cuts, size_t ncuts,
                      kb_plan_place_fn place, void *ctx, kb_plan *out, kb_errbuf *eb)
{
    plan_tmp t;
    uhash h;
    size_t ne = 0, nb = 0;
    int rc, hashed = 0;

    memset(out, 0, sizeof *out);
    memset(&t, 0, sizeof t);
    memset(&h, 0, sizeof h);
    if (n == 0)
        return 0;
    rc = KB_ERR_NOMEM;
    /* Batches and endpoint ranks are 32-bit; at most 8 endpoints per record. Such a flush
     * would not fit in memory anyway. */
    if (n > UINT32_MAX / 8)
        goto fail;
    /* per-record arrays: kb_bigmem (huge pages for big flushes) */
    t.keys = kb_bigmem_alloc(n * sizeof *t.keys);
    t.ktmp = kb_bigmem_alloc(n * sizeof *t.ktmp);
    t.tkey = kb_bigmem_alloc(n * sizeof *t.tkey);
    t.meta = kb_bigmem_alloc(n);
    t.efirst = kb_bigmem_alloc(n * sizeof *t.efirst);
    t.rank = kb_bigmem_alloc(8 * n * sizeof *t.rank); /* only the pages used are touched */
    if (!t.keys || !t.ktmp || !t.tkey || !t.meta || !t.efirst || !t.rank)
        goto fail;
    rc = uhash_resize(&h, 12);
    if (rc == 0)
        rc = plan_gather(recs, n, &t, &h, &hashed, &ne, eb);
    if (rc == 0)
        rc = hashed ? rank_by_hash(&t, &h, ne) : rank_by_sort(&t, recs, n, ne);
    uhash_free(&h);
    if (rc)
        goto fail;

    rc = KB_ERR_NOMEM;
    t.leafoff = malloc((t.nranks ? t.nranks : 1) * sizeof *t.leafoff);
    t.lvl = kb_bigmem_alloc(n * sizeof *t.lvl);
    if (!t.leafoff || !t.lvl)
        goto fail;
    if ((rc = plan_arena(&t, n, out)) != 0)
        goto fail;
    if (place) {
        if ((rc = place(ctx, out, eb)) != 0)
            goto fail;
        replace_leaves(&t, out);
    }
    /* (epoch, t_start, seq) order, ties in input order: sort by seq, then stably by t_start,
     * then (with cuts) stably by epoch. */
    radix_sort(t.keys, t.ktmp, n);
    rc = KB_ERR_NOMEM;
    if (plan_order(&t, n, cuts, ncuts) != 0)
        goto fail;
    if ((rc = plan_levels(&t, n, &nb)) != 0)
        goto fail;

    /* Batch-major, then kind-major order, each stable: sort by batch (into ktmp), then each
     * batch by kind (into dest); one sort on batch * kinds + kind would need nb * kinds
     * counters. */
    rc = KB_ERR_NOMEM;
    t.bstart = calloc(nb + 1, sizeof *t.bstart);
    t.dest = kb_bigmem_alloc(n * sizeof *t.dest);
    out->batches = malloc(nb * sizeof *out->batches);
    out->recs = kb_bigmem_alloc(n * sizeof *out->recs);
    if (!t.bstart || !t.dest || !out->batches || !out->recs)
        goto fail;
    for (size_t p = 0; p < n; p++)
        t.bstart[t.lvl[p] + 1]++;
    for (size_t b = 0; b < nb; b++)
        t.bstart[b + 1] += t.bstart[b];
    for (size_t p = 0; p < n; p++)
        t.ktmp[t.bstart[t.lvl[p]]++] = t.keys[p];
    /* Each bstart[b] has moved on to batch b's end, which is batch b + 1's start. */
    memmove(t.bstart + 1, t.bstart, nb * sizeof *t.bstart);
    t.bstart[0] = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = t.bstart[b], hi = t.bstart[b + 1];
        size_t pos[KB_REC_NKINDS] = { 0 };
        for (size_t p = lo; p < hi; p++)
            pos[t.meta[t.ktmp[p].val] >> 3]++;
        size_t acc = lo;
        for (unsigned k = 0; k < KB_REC_NKINDS; k++) {
            size_t c = pos[k];
            pos[k] = acc;
            acc += c;
        }
        for (size_t p = lo; p < hi; p++) {
            size_t i = t.ktmp[p].val;
            t.dest[i] = (uint32_t)pos[t.meta[i] >> 3]++;
        }
        out->batches[b].first = lo;
        out->batches[b].count = hi - lo;
    }
    /* Copy in input order: reading the records in sequence is much faster than gathering
     * them in plan order, and the scattered writes do not stall. */
    for (size_t i = 0; i < n; i++) {
        kb_rec *r = &out->recs[t.dest[i]];
        *r = *recs[i];
        rewrite_opnds(r, &t, t.efirst[i]);
    }
    out->nrecs = n;
    out->nbatches = nb;
    plan_tmp_free(&t);
    return 0;
fail:
    plan_tmp_free(&t);
    kb_plan_free(out);
    return rc == KB_ERR_NOMEM ? kb_err_set(eb, rc, "replay plan of %zu records: out of host "
                                           "memory", n) : rc;
}

/* ---------------------------------------------------------------- flush */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Makes sure every page the written segments touch exists, by rewriting one byte per page with
 * its current value: afterwards the write-back cannot fail, so a flush either updates the
 * store completely or leaves it as it was.
 */
static int reserve_pages(kb_memstore *ms, const kb_plan *p)
{
    const uint64_t page = KB_MEMSTORE_PAGE_BYTES;

    for (size_t i = 0; i < p->nsegs; i++) {
        const kb_segment *s = &p->segs[i];
        if (!s->written)
            continue;
        uint64_t end = s->pa + s->len;
        for (uint64_t a = s->pa; a < end; a = (a | (page - 1)) + 1) {
            uint8_t b;
            kb_memstore_read(ms, a, &b, 1);
            int rc = kb_memstore_write(ms, a, &b, 1);
            if (rc)
                return rc;
            if ((a | (page - 1)) == UINT64_MAX)
                break;
        }
    }
    return 0;
}

static int check_payload_refs(const kb_rec *const *recs, size_t n, size_t payload_bytes,
                              kb_errbuf *eb)
{
    for (size_t i = 0; i < n; i++) {
        const kb_rec *r = recs[i];
        for (unsigned s = 0; s < r->nsrc && s < 3; s++) {
            const kb_opnd *o = &r->src[s];
            uint64_t span = kb_opnd_span(o);
            if (o->space == KB_SPACE_PAYLOAD && span > 0 &&
                (o->addr > payload_bytes || span > payload_bytes - o->addr))
                return bad(r, eb, "payload source beyond the payload area");
        }
    }
    return 0;
}

/*
 * Runs the plan's batches on the backend over the arena. A failure names the backend; a
 * backend stopped after begin is still ended, into a scratch buffer: its message must not hide
 * the first one.
 */
static int run_plan(kb_backend *be, const kb_plan *plan, uint8_t *arena, const uint8_t *payload,
                    size_t payload_bytes, kb_progress *pg, kb_errbuf *eb)
{
    int rc = be->ops->begin(be->self, arena, plan->arena_bytes, payload, payload_bytes, eb);

    if (pg)
        atomic_store_explicit(&pg->batches, plan->nbatches, memory_order_relaxed);
    if (rc == 0) {
        for (size_t b = 0; b < plan->nbatches && rc == 0; b++) {
            const kb_batch *bt = &plan->batches[b];
            rc = be->ops->run_batch(be->self, plan->recs + bt->first, bt->count, eb);
            if (pg)
                atomic_store_explicit(&pg->batches_done, b + 1, memory_order_relaxed);
        }
        if (rc == 0) {
            rc = be->ops->end(be->self, arena, plan->arena_bytes, eb);
        } else {
            kb_errbuf scratch;
            (void)be->ops->end(be->self, arena, plan->arena_bytes, &scratch);
        }
    }
    if (rc != 0)
        kb_err_prefix(eb, "replay on %s", be->ops->name ? be->ops->name : "?");
    return rc;
}

int kb_replay_flush(kb_oplog *log, kb_memstore *ms, kb_backend *be, kb_replay_stats *st,
                    kb_errbuf *eb)
{
    return kb_replay_flush_pg(log, ms, be, st, NULL, eb);
}

int kb_replay_flush_pg(kb_oplog *log, kb_memstore *ms, kb_backend *be, kb_replay_stats *st,
                       kb_progress *pg, kb_errbuf *eb)
{
    double t0 = now_ms();
    const kb_rec **ptrs = NULL;
    uint8_t *arena = NULL;
    kb_plan plan;
    int rc;

    memset(&plan, 0, sizeof plan);
    if (!log || !ms || !be || !be->ops)
        return kb_err_set(eb, KB_ERR_INVAL, "replay: no log, memory store or backend");
    size_t first = kb_oplog_replayed(log), count = kb_oplog_count(log);
    if (first >= count)
        return 0;
    size_t n = count - first;
    const uint8_t *payload = kb_oplog_payload(log);
    if (pg) {
        atomic_fetch_add_explicit(&pg->flushes, 1, memory_order_relaxed);
        atomic_store_explicit(&pg->flush_records, n, memory_order_relaxed);
        atomic_store_explicit(&pg->batches, 0, memory_order_relaxed);
        atomic_store_explicit(&pg->batches_done, 0, memory_order_relaxed);
    }
    size_t payload_bytes = kb_oplog_payload_size(log);

    kb_resident *res = be->ops->resident ? be->ops->resident(be->self) : NULL;

    rc = KB_ERR_NOMEM;
    ptrs = kb_bigmem_alloc(n * sizeof *ptrs);
    if (!ptrs) {
        kb_err_nomem(eb, (unsigned long long)(n * sizeof *ptrs), "replay: the list of its %zu "
                     "records", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        ptrs[i] = kb_oplog_at(log, first + i);
    if ((rc = check_payload_refs(ptrs, n, payload_bytes, eb)) != 0)
        goto out;

    const uint64_t *cuts;
    size_t ncuts = kb_oplog_cuts_in(log, first, count, &cuts);

    if (res) {
        /* Device-resident: nothing of the arena crosses the bus (kb_resident.h). */
        if ((rc = kb_resident_prepare(res, log, ms, eb)) != 0 ||
            (rc = kb_plan_build_cut(ptrs, n, cuts, ncuts, kb_resident_place, res, &plan,
                                    eb)) != 0 ||
            (rc = kb_resident_commit(res, &plan, eb)) != 0) {
            kb_err_prefix(eb, "replay on %s", be->ops->name ? be->ops->name : "?");
            goto out;
        }
        if ((rc = run_plan(be, &plan, NULL, NULL, 0, pg, eb)) != 0) {
            kb_resident_fail(res);
            goto out;
        }
    } else {
        /* A store that a resident backend holds data of gets it back first. */
        if (kb_memstore_mirror_self(ms)) {
            if ((rc = kb_memstore_sync_all(ms, eb)) != 0)
                goto out;
            kb_memstore_set_mirror(ms, NULL);
        }
        if ((rc = kb_plan_build_cut(ptrs, n, cuts, ncuts, NULL, NULL, &plan, eb)) != 0)
            goto out;
        /* zeroed: the alignment padding between segments is never read by a record, but is
         * copied */
        arena = plan.arena_bytes <= SIZE_MAX ? kb_bigmem_alloc((size_t)plan.arena_bytes) : NULL;
        if (!arena) {
            rc = kb_err_nomem(eb, (unsigned long long)plan.arena_bytes, "replay: the arena that "
                              "holds the data of %zu records", n);
            goto out;
        }
        for (size_t i = 0; i < plan.nsegs; i++)
            kb_memstore_read(ms, plan.segs[i].pa, arena + plan.segs[i].arena_off,
                             (size_t)plan.segs[i].len);

        if ((rc = run_plan(be, &plan, arena, payload, payload_bytes, pg, eb)) != 0)
            goto out;

        if ((rc = reserve_pages(ms, &plan)) != 0) {
            unsigned long long written = 0;
            for (size_t i = 0; i < plan.nsegs; i++)
                written += plan.segs[i].written ? plan.segs[i].len : 0;
            kb_err_nomem(eb, written, "replay: the memory store's pages for the data the "
                         "replay wrote (%zu pages of %d bytes held already)",
                         kb_memstore_pages(ms), (int)KB_MEMSTORE_PAGE_BYTES);
            goto out;
        }
        for (size_t i = 0; i < plan.nsegs; i++) {
            const kb_segment *sg = &plan.segs[i];
            if (sg->written) {
                rc = kb_memstore_write(ms, sg->pa, arena + sg->arena_off, (size_t)sg->len);
                assert(rc == 0); /* every page exists after reserve_pages */
            }
        }
    }
    kb_oplog_set_replayed(log, count);

    if (st) {
        uint64_t launches = 0;
        for (size_t b = 0; b < plan.nbatches; b++) {
            const kb_batch *bt = &plan.batches[b];
            for (size_t i = 0; i < bt->count; i++)
                if (i == 0 || kb_rec_launch_group(plan.recs[bt->first + i].kind) !=
                                  kb_rec_launch_group(plan.recs[bt->first + i - 1].kind))
                    launches++;
        }
        st->records += n;
        st->batches += plan.nbatches;
        st->launches += launches;
        st->flushes++;
        st->ms += now_ms() - t0;
    }
    rc = 0;
out:
    kb_plan_free(&plan);
    kb_bigmem_free(arena);
    kb_bigmem_free(ptrs);
    return rc;
}
