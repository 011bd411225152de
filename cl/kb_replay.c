/*
 * kb_replay — the Phase-2 planner (the flush that drives a backend is kb_replay_flush.c, the
 * checks a record must pass kb_replay_check.c; what they share is in kb_replay_int.h). The
 * planner validates records, orders them by (t_start, seq) and gives each one a batch by level
 * scheduling: its batch is one past the latest batch of any earlier record it conflicts with
 * (it reads bytes that one writes, or writes bytes that one reads or writes), or 0.
 * Conflicting records thus keep their (t_start, seq) order across batches, so replaying batch
 * 0, 1, 2, ... equals the serial replay, while independent records fall into the earliest
 * batch they can; the batch count is the longest conflict chain. Conflicts use exact byte
 * intervals: a record's reads are its MEM sources' spans, its write is its dst span; payload
 * sources never conflict because the payload is read-only. Span endpoints are ranked among the
 * flush's distinct endpoint addresses (through a hash table, as real logs reuse the same
 * buffers over and over, then a sort of the distinct ones; or a sort of all endpoints when
 * most are distinct), which cuts the address space into elementary intervals. Over those
 * intervals a 16-ary max tree with lazy "raise to at least" tags keeps the latest batch that
 * wrote and that read each byte, so a query or update costs a few node visits for the small
 * spans of real logs and O(16 log m) at worst. The same intervals give the arena: maximal runs
 * of touched intervals are coalesced segments, packed in PA order, each at an arena offset
 * congruent to its PA modulo 8 so that every operand keeps the natural alignment it had in
 * simulated memory; MEM operands are rewritten to arena offsets. Each batch is grouped by kind
 * (stable). All sorting is a stable LSD radix sort (no comparator calls, same result on every
 * libc). A placer (kb_plan_build_ex) may give the segments other offsets, such as a
 * device-resident backend's (kb_resident.c); the leaves' offsets then follow their segments.
 * Limits: spans are conservative for strided operands (the gaps between rows count as
 * touched); at most 2^32 / 8 records per flush.
 */
#include "kb_replay_int.h"

#include "kb_bigmem.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

typedef struct ival {
    uint64_t lo, hi; /* [lo, hi) */
} ival;

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
        if ((rc = kb_replay_check_rec(r, eb)) != 0)
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
