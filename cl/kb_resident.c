/*
 * kb_resident — device-resident simulated memory (kb_resident.h). The resident segments are a
 * sorted array searched by binary search. Placing a plan walks the resident segments and the
 * plan's segments together in PA order and groups them into components of overlapping
 * intervals; a component that holds a plan segment and is not exactly one resident segment
 * becomes one new segment, in place when its resident parts lie end to end, else at the end
 * of the used part of a block with room (a new block when none has). The blocks are a short
 * array sorted by arena offset (binary search). New bytes are initialised from the store in
 * pieces of at most 64 MiB through one staging buffer. Wall times come from CLOCK_MONOTONIC
 * around the blocking uploads and downloads.
 */
#include "kb_resident.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STAGE_PIECE (UINT64_C(64) << 20)
#define BLOCK_ALIGN UINT64_C(4096)
#define RESERVE_SLACK (UINT64_C(16) << 20)

typedef struct rseg {
    uint64_t pa, len, off;
} rseg;

/* One device buffer: arena offsets [base, base + cap), used up to top (absolute). */
typedef struct rblk {
    uint64_t base, cap, top;
} rblk;

struct kb_resident {
    const kb_resident_ops *ops;
    uint64_t fill_lo, fill_hi; /* a poison fill not issued yet (fill_lo == fill_hi: none) */
    uint64_t fill_end;         /* the end of its block: it may grow up to there */
    void *dev;
    kb_memstore *ms;          /* the bound store, or NULL */
    const kb_oplog *log;      /* whose payload the device holds */
    size_t payload_have;      /* bytes of it on the device */
    rseg *seg;                /* resident segments, sorted by pa, disjoint */
    size_t nseg;
    rblk *blk;                /* the arena's blocks, by base */
    size_t nblk, blkcap;
    uint64_t cap;             /* arena capacity: the blocks' bytes */
    uint64_t reserve;         /* the announced footprint (kb_resident_reserve) */
    uint64_t blk_max;         /* KBCL_ARENA_BLOCK, 0: no cap */
    int broken;
    kb_xfer_stats st;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t align_off(uint64_t top, uint64_t pa)
{
    return top + ((pa - top) & 7u); /* congruent to pa modulo 8 */
}

/* The block holding arena offset off (nblk when none). */
static size_t blk_of(const kb_resident *r, uint64_t off)
{
    size_t lo = 0, hi = r->nblk;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->blk[mid].base + r->blk[mid].cap <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->nblk && r->blk[lo].base <= off ? lo : r->nblk;
}

/*
 * The arena's invariants, which every flush relies on and which a planner, a server and the
 * kernels each assume without checking: blocks end to end from 0 with their tops inside;
 * segments sorted by PA, disjoint, each inside one block's used part, congruent to its PA
 * modulo 8 (the kernels' aligned loads). Checked after each placement in Debug builds.
 */
static void check_arena(const kb_resident *r)
{
#ifndef NDEBUG
    uint64_t base = 0;
    for (size_t b = 0; b < r->nblk; b++) {
        assert(r->blk[b].base == base);
        assert(r->blk[b].cap > 0);
        assert(r->blk[b].top >= base && r->blk[b].top <= base + r->blk[b].cap);
        base += r->blk[b].cap;
    }
    assert(base == r->cap);
    for (size_t i = 0; i < r->nseg; i++) {
        const rseg *g = &r->seg[i];
        size_t b = blk_of(r, g->off);
        assert(g->len > 0);
        assert(i == 0 || r->seg[i - 1].pa + r->seg[i - 1].len <= g->pa);
        assert(b < r->nblk && g->off + g->len <= r->blk[b].top);
        assert(((g->off - g->pa) & 7u) == 0);
    }
#else
    (void)r;
#endif
}

/* "123", "64K", "16M", "2G" (binary); 0 when unset or not a size. */
static uint64_t env_bytes(const char *name)
{
    const char *v = getenv(name);
    char *end = NULL;
    unsigned long long n;
    if (!v || !*v)
        return 0;
    n = strtoull(v, &end, 10);
    switch (*end) {
    case 'k': case 'K': n <<= 10; end++; break;
    case 'm': case 'M': n <<= 20; end++; break;
    case 'g': case 'G': n <<= 30; end++; break;
    default: break;
    }
    return *end == '\0' ? (uint64_t)n : 0;
}

/* ---------------------------------------------------------------- binding */

/* The first resident segment that ends after pa (nseg when none). */
static size_t seg_after(const kb_resident *r, uint64_t pa)
{
    size_t lo = 0, hi = r->nseg;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->seg[mid].pa + r->seg[mid].len <= pa)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The mirror's pull: device bytes [pa, pa + n), which may span touching segments. */
static int res_pull(void *self, uint64_t pa, void *dst, size_t n, kb_errbuf *eb)
{
    kb_resident *r = self;
    uint8_t *out = dst;
    size_t lo;
    double t0 = now_ms();

    if (r->broken)
        return kb_err_set(eb, KB_ERR_STATE,
                          "device memory is undefined after a failed replay flush");
    lo = seg_after(r, pa);
    while (n > 0) {
        const rseg *s = lo < r->nseg ? &r->seg[lo] : NULL;
        if (!s || s->pa > pa)
            return kb_err_set(eb, KB_ERR_STATE,
                              "device memory: PA 0x%llx is device-dirty but not resident",
                              (unsigned long long)pa);
        uint64_t k = s->pa + s->len - pa;
        if (k > n)
            k = n;
        int rc = r->ops->download(r->dev, s->off + (pa - s->pa), out, k, eb);
        if (rc)
            return rc;
        r->st.downloads++;
        r->st.download_bytes += k;
        out += k;
        pa += k;
        n -= (size_t)k;
        lo++;
    }
    r->st.download_ms += now_ms() - t0;
    return 0;
}

/* The mirror's detach: the store goes away or takes another mirror. */
static void res_detach(void *self)
{
    kb_resident *r = self;
    r->ms = NULL;
    r->log = NULL;
    r->payload_have = 0;
    r->nseg = 0;
    for (size_t i = 0; i < r->nblk; i++) /* kept for the next store, emptied */
        r->blk[i].top = r->blk[i].base;
}

const kb_oplog *kb_resident_log(const kb_resident *r)
{
    return r->log;
}

void kb_resident_device(const kb_resident *r, const kb_resident_ops **ops, void **dev)
{
    *ops = r->ops;
    *dev = r->dev;
}

kb_resident *kb_resident_create(const kb_resident_ops *ops, void *dev)
{
    kb_resident *r = calloc(1, sizeof *r);
    if (r) {
        r->ops = ops;
        r->dev = dev;
        r->blk_max = env_bytes("KBCL_ARENA_BLOCK");
    }
    return r;
}

int kb_resident_release(kb_resident *r, kb_errbuf *eb)
{
    int rc;
    if (!r || !r->ms)
        return 0;
    if ((rc = kb_memstore_sync_all(r->ms, eb)) != 0)
        return rc;
    kb_memstore_set_mirror(r->ms, NULL); /* calls res_detach */
    return 0;
}

void kb_resident_destroy(kb_resident *r)
{
    kb_errbuf eb;
    if (!r)
        return;
    if (r->ms && kb_resident_release(r, &eb) != 0)
        kb_memstore_set_mirror(r->ms, NULL); /* its device-dirty bytes are lost */
    free(r->seg);
    free(r->blk);
    free(r);
}

void kb_resident_fail(kb_resident *r)
{
    r->broken = 1;
}

int kb_resident_broken(const kb_resident *r)
{
    return r->broken;
}

/* ---------------------------------------------------------------- queries */

static int fill_flush(kb_resident *r, kb_errbuf *eb);

/* The arena offset of [pa, pa + n) when it lies in one resident segment and no byte of it is
 * host-dirty, else KB_ERR_NOTFOUND. */
static int locate(const kb_resident *r, uint64_t pa, uint64_t n, uint64_t *off)
{
    const kb_ivset *hd = kb_memstore_host_dirty(r->ms);
    size_t lo = seg_after(r, pa);
    if (lo == r->nseg || r->seg[lo].pa > pa || r->seg[lo].pa + r->seg[lo].len < pa + n)
        return KB_ERR_NOTFOUND;
    for (size_t i = 0; i < hd->n; i++)
        if (hd->v[i].lo < pa + n && hd->v[i].hi > pa)
            return KB_ERR_NOTFOUND;
    *off = r->seg[lo].off + (pa - r->seg[lo].pa);
    return 0;
}

int kb_resident_query(kb_resident *r, const kb_vquery *q, const uint64_t *pa, void *out,
                      kb_errbuf *eb)
{
    uint64_t per = kb_vquery_tile_bytes(q);
    uint64_t *off;
    double t0 = now_ms();
    int rc = 0;

    if (r->broken)
        return kb_err_set(eb, KB_ERR_STATE,
                          "device memory is undefined after a failed replay flush");
    if (!r->ops->query || !r->ms)
        return KB_ERR_UNSUPPORTED;
    if (!(off = malloc((q->ntiles ? q->ntiles : 1) * sizeof *off)))
        return kb_err_set(eb, KB_ERR_NOMEM, "device query: out of memory");
    for (uint32_t t = 0; t < q->ntiles && rc == 0; t++)
        if ((rc = locate(r, pa[t], per, &off[t])) == 0 && blk_of(r, off[t]) != blk_of(r, off[0]))
            rc = KB_ERR_NOTFOUND; /* the query kernels read one buffer */
    if (rc == 0 && (rc = fill_flush(r, eb)) == 0 &&
        (rc = r->ops->query(r->dev, q, off, out, eb)) == 0) {
        r->st.downloads++;
        r->st.download_bytes += kb_vquery_result_size(q);
        r->st.download_ms += now_ms() - t0;
    }
    free(off);
    return rc;
}

/* ---------------------------------------------------------------- transfers */

/* Issues the pending poison fill. */
static int fill_flush(kb_resident *r, kb_errbuf *eb)
{
    uint64_t n = r->fill_hi - r->fill_lo;
    int rc = 0;
    if (n > 0 && (rc = r->ops->fill(r->dev, r->fill_lo, n, KB_MEMSTORE_POISON, eb)) == 0) {
        r->st.fills++;
        r->st.fill_bytes += n;
    }
    r->fill_lo = r->fill_hi = 0;
    return rc;
}

/*
 * Arena bytes [off, off + n) take the store's bytes at pa: poison on the device when the store
 * holds no page there, else uploaded. Fills are issued lazily: one that starts less than 8
 * bytes after the pending one (what lies between is alignment padding) extends it, so the new
 * segments of a flush cost one fill, not one each.
 */
static int init_from_store(kb_resident *r, uint64_t off, uint64_t pa, uint64_t n, kb_errbuf *eb)
{
    uint8_t *stage = NULL;
    int rc = 0;

    if (n == 0)
        return 0;
    if (!kb_memstore_has_pages(r->ms, pa, n)) {
        if (r->fill_hi > r->fill_lo && off >= r->fill_hi && off - r->fill_hi < 8 &&
            off + n <= r->fill_end) { /* never across blocks */
            r->fill_hi = off + n;
            return 0;
        }
        if ((rc = fill_flush(r, eb)) != 0)
            return rc;
        size_t b = blk_of(r, off);
        r->fill_lo = off;
        r->fill_hi = off + n;
        r->fill_end = b < r->nblk ? r->blk[b].base + r->blk[b].cap : off + n;
        return 0;
    }
    if ((rc = fill_flush(r, eb)) != 0)
        return rc;
    stage = malloc((size_t)(n < STAGE_PIECE ? n : STAGE_PIECE));
    if (!stage)
        return kb_err_set(eb, KB_ERR_NOMEM, "device memory: out of memory staging an upload");
    for (uint64_t done = 0; done < n && rc == 0;) {
        uint64_t k = n - done < STAGE_PIECE ? n - done : STAGE_PIECE;
        double t0 = now_ms();
        kb_memstore_read(r->ms, pa + done, stage, (size_t)k);
        if ((rc = r->ops->upload(r->dev, off + done, stage, k, eb)) == 0) {
            r->st.uploads++;
            r->st.upload_bytes += k;
            r->st.upload_ms += now_ms() - t0;
        }
        done += k;
    }
    free(stage);
    return rc;
}

/* ---------------------------------------------------------------- flush steps */

/* Uploads the host-dirty bytes that are resident, then forgets the host-dirty set. */
static int upload_host_dirty(kb_resident *r, kb_errbuf *eb)
{
    const kb_ivset *hd = kb_memstore_host_dirty(r->ms);
    size_t j = 0;
    int rc;

    for (size_t i = 0; i < hd->n; i++) {
        uint64_t lo = hd->v[i].lo, hi = hd->v[i].hi;
        while (j < r->nseg && r->seg[j].pa + r->seg[j].len <= lo)
            j++;
        for (size_t k = j; k < r->nseg && r->seg[k].pa < hi; k++) {
            const rseg *s = &r->seg[k];
            uint64_t a = s->pa > lo ? s->pa : lo, b = s->pa + s->len < hi ? s->pa + s->len : hi;
            if ((rc = init_from_store(r, s->off + (a - s->pa), a, b - a, eb)) != 0)
                return rc;
        }
    }
    if ((rc = fill_flush(r, eb)) != 0)
        return rc;
    kb_memstore_host_clean(r->ms);
    return 0;
}

int kb_resident_prepare(kb_resident *r, kb_oplog *log, kb_memstore *ms, kb_errbuf *eb)
{
    int rc;

    if (r->broken)
        return kb_err_set(eb, KB_ERR_STATE,
                          "device memory is undefined after a failed replay flush");
    if (r->ms != ms) {
        void *other = kb_memstore_mirror_self(ms);
        if ((rc = kb_resident_release(r, eb)) != 0)
            return rc;
        /* A store another backend holds data of: get it back first. */
        if (other && (rc = kb_memstore_sync_all(ms, eb)) != 0)
            return rc;
        kb_memstore_mirror m = { r, res_pull, res_detach };
        kb_memstore_set_mirror(ms, &m); /* detaches the other one */
        res_detach(r);
        r->ms = ms;
        kb_memstore_host_clean(ms); /* nothing of it is resident yet */
    }
    if (r->log != log || kb_oplog_payload_size(log) < r->payload_have) {
        r->log = log;
        r->payload_have = 0;
    }
    return upload_host_dirty(r, eb);
}

/* A component of overlapping intervals: resident segments [r0, r1), plan segments [s0, s1). */
typedef struct comp {
    uint64_t lo, hi, off;
    size_t r0, r1, s0, s1;
    int fresh; /* becomes one new segment */
} comp;

static uint64_t round_block(uint64_t n)
{
    return (n + BLOCK_ALIGN - 1) & ~(BLOCK_ALIGN - 1);
}

/* Arena bytes a fresh component takes at most (its bytes and the alignment padding). */
static uint64_t comp_need(const comp *k)
{
    return k->hi - k->lo + 7;
}

/* Whether k fits at the end of a block used up to top and ending at end. */
static int fits(uint64_t top, uint64_t end, const comp *k)
{
    return align_off(top, k->lo) + (k->hi - k->lo) <= end;
}

/*
 * The bytes of fresh components c[q..nc) that the blocks' room cannot take, placed first fit
 * in order as kb_resident_place will (merges in place counted as needing room: a bound).
 */
static uint64_t overflow(const kb_resident *r, const comp *c, size_t q, size_t nc)
{
    uint64_t *top = malloc((r->nblk ? r->nblk : 1) * sizeof *top), over = 0;
    for (size_t b = 0; top && b < r->nblk; b++)
        top[b] = r->blk[b].top;
    for (size_t j = q; j < nc; j++) {
        size_t b = 0;
        if (!c[j].fresh)
            continue;
        while (top && b < r->nblk && !fits(top[b], r->blk[b].base + r->blk[b].cap, &c[j]))
            b++;
        if (top && b < r->nblk)
            top[b] = align_off(top[b], c[j].lo) + (c[j].hi - c[j].lo);
        else
            over += comp_need(&c[j]);
    }
    free(top);
    return over;
}

/*
 * Adds a block that holds at least `need` bytes; `rest` are the bytes of this flush that the
 * blocks cannot take (need among them). The size: the larger of rest, the announced footprint
 * the arena does not cover yet (with slack) and a quarter of the arena, capped by blk_max;
 * when the device refuses it, just rest, then just need (the last refusal is the error).
 * Nothing resident moves.
 */
static int add_block(kb_resident *r, uint64_t need, uint64_t rest, kb_errbuf *eb)
{
    uint64_t want = rest > need ? rest : need, tries[3];
    int rc = KB_ERR_DEVICE;

    if (r->reserve > 0) {
        uint64_t fp = kb_resident_footprint(r->reserve);
        if (fp > r->cap && fp - r->cap > want)
            want = fp - r->cap;
    }
    if (r->cap / 4 > want) /* a run that grows by small flushes gets few blocks */
        want = r->cap / 4;
    if (r->blk_max > 0 && want > r->blk_max)
        want = r->blk_max > need ? r->blk_max : need;
    tries[0] = round_block(want);
    tries[1] = round_block(rest > need && rest < want ? rest : want);
    tries[2] = round_block(need);
    if (r->nblk == r->blkcap) {
        size_t c = r->blkcap ? 2 * r->blkcap : 8;
        rblk *nb = realloc(r->blk, c * sizeof *nb);
        if (!nb)
            return kb_err_set(eb, KB_ERR_NOMEM, "device memory: out of memory adding a block");
        r->blk = nb;
        r->blkcap = c;
    }
    /* a device that is short of memory says KB_ERR_DEVICE, a server past what it lends a
     * session KB_ERR_RANGE, a host "device" KB_ERR_NOMEM: a smaller block may still do */
    for (int i = 0; i < 3 && rc != 0; i++) {
        if (i > 0 && tries[i] >= tries[i - 1])
            continue;
        rc = r->ops->block(r->dev, r->cap, tries[i], eb);
        if (rc == 0) {
            rblk *k = &r->blk[r->nblk++];
            k->base = k->top = r->cap;
            k->cap = tries[i];
            r->cap += tries[i];
        }
    }
    return rc;
}

/* A block with room for k: `prefer` first, else the first one; nblk when none. */
static size_t find_room(const kb_resident *r, const comp *k, size_t prefer)
{
    if (prefer < r->nblk && fits(r->blk[prefer].top, r->blk[prefer].base + r->blk[prefer].cap, k))
        return prefer;
    for (size_t b = 0; b < r->nblk; b++)
        if (fits(r->blk[b].top, r->blk[b].base + r->blk[b].cap, k))
            return b;
    return r->nblk;
}

/*
 * A merge that needs no copy: k's resident parts lie end to end in one block (touching in PA,
 * one arena-minus-PA offset) from k->lo on, and k ends with the last one or extends it into
 * free room at the end of its block's used part. Sets k->off and claims that room.
 */
static int merge_in_place(kb_resident *r, comp *k)
{
    const rseg *f, *l;
    size_t b;
    uint64_t lend;

    if (k->r1 == k->r0)
        return 0;
    f = &r->seg[k->r0];
    l = &r->seg[k->r1 - 1];
    b = blk_of(r, f->off);
    lend = l->off + l->len;
    if (k->lo != f->pa || b >= r->nblk || blk_of(r, l->off) != b)
        return 0;
    for (size_t m = k->r0 + 1; m < k->r1; m++)
        if (r->seg[m].pa != r->seg[m - 1].pa + r->seg[m - 1].len ||
            r->seg[m].off != r->seg[m - 1].off + r->seg[m - 1].len)
            return 0;
    if (k->hi > l->pa + l->len) {
        rblk *x = &r->blk[b];
        if (lend != x->top || x->base + x->cap - x->top < k->hi - (l->pa + l->len))
            return 0;
        x->top = lend + (k->hi - (l->pa + l->len));
    }
    k->off = f->off;
    return 1;
}

/* Component c[q] becomes one new segment: its place, its resident parts copied there, the
 * bytes between them from the store (c[q + 1 .. nc): the flush's later components). */
static int place_fresh(kb_resident *r, comp *c, size_t q, size_t nc, kb_errbuf *eb)
{
    comp *k = &c[q];
    uint64_t at = k->lo, off;
    size_t b;
    int rc;

    if (merge_in_place(r, k)) {
        at = r->seg[k->r1 - 1].pa + r->seg[k->r1 - 1].len;
        return init_from_store(r, k->off + (at - k->lo), at, k->hi - at, eb);
    }
    b = find_room(r, k, k->r1 > k->r0 ? blk_of(r, r->seg[k->r0].off) : r->nblk);
    if (b == r->nblk) {
        if ((rc = add_block(r, comp_need(k), overflow(r, c, q, nc), eb)) != 0)
            return rc;
        b = r->nblk - 1;
    }
    off = align_off(r->blk[b].top, k->lo);
    k->off = off;
    for (size_t m = k->r0; m < k->r1; m++) {
        const rseg *s = &r->seg[m];
        if ((rc = init_from_store(r, off + (at - k->lo), at, s->pa - at, eb)) != 0 ||
            (rc = fill_flush(r, eb)) != 0 ||
            (rc = r->ops->copy(r->dev, off + (s->pa - k->lo), s->off, s->len, eb)) != 0)
            return rc;
        r->st.moves++;
        r->st.move_bytes += s->len;
        at = s->pa + s->len;
    }
    if ((rc = init_from_store(r, off + (at - k->lo), at, k->hi - at, eb)) != 0)
        return rc;
    r->blk[b].top = off + (k->hi - k->lo);
    return 0;
}

/* The components of the resident segments and the plan's, in PA order, into c (room for
 * nseg + nS + 1); returns their number, *nfresh how many become new segments. */
static size_t components(const kb_resident *r, const kb_plan *p, comp *c, size_t *nfresh)
{
    const kb_segment *S = p->segs;
    size_t nS = p->nsegs, i = 0, j = 0, nc = 0;

    *nfresh = 0;
    /* Intervals join a component when they overlap it (touching is not enough: no operand
     * spans two plan segments). */
    while (i < r->nseg || j < nS) {
        comp *k = &c[nc++];
        int from_r = j == nS || (i < r->nseg && r->seg[i].pa <= S[j].pa);
        k->lo = from_r ? r->seg[i].pa : S[j].pa;
        k->hi = from_r ? r->seg[i].pa + r->seg[i].len : S[j].pa + S[j].len;
        k->r0 = i;
        k->s0 = j;
        if (from_r)
            i++;
        else
            j++;
        for (;;) {
            if (i < r->nseg && r->seg[i].pa < k->hi) {
                if (r->seg[i].pa + r->seg[i].len > k->hi)
                    k->hi = r->seg[i].pa + r->seg[i].len;
                i++;
            } else if (j < nS && S[j].pa < k->hi) {
                if (S[j].pa + S[j].len > k->hi)
                    k->hi = S[j].pa + S[j].len;
                j++;
            } else {
                break;
            }
        }
        k->r1 = i;
        k->s1 = j;
        k->fresh = k->s1 > k->s0 && !(k->r1 == k->r0 + 1 && k->lo == r->seg[k->r0].pa &&
                                      k->hi == r->seg[k->r0].pa + r->seg[k->r0].len);
        if (k->fresh)
            (*nfresh)++;
    }
    return nc;
}

int kb_resident_place(void *ctx, kb_plan *p, kb_errbuf *eb)
{
    kb_resident *r = ctx;
    const kb_segment *S = p->segs;
    size_t nc, nfresh, nout = 0;
    comp *c = malloc((r->nseg + p->nsegs + 1) * sizeof *c);
    rseg *out = NULL;
    int rc = 0;

    if (!c)
        return kb_err_set(eb, KB_ERR_NOMEM, "device memory: out of memory placing segments");
    /* Blocks kept from an earlier binding, all empty, that the announced footprint outgrows:
     * start over with one block sized for it (the next block is at base 0, which releases
     * them), rather than spread this run over the old blocks and one for the difference. A
     * sweep's device worker keeps its backend from point to point with sizes growing; spread
     * and merged, its ring_allreduce_tcm 32M point took 36 s on an H200, 16 s alone. */
    if (r->nseg == 0 && r->nblk > 0 && r->reserve > 0 &&
        kb_resident_footprint(r->reserve) > r->cap) {
        r->nblk = 0;
        r->cap = 0;
    }
    nc = components(r, p, c, &nfresh);
    /* New segments: in place, or resident parts copied on the device and the bytes between
     * from the store. */
    for (size_t q = 0; q < nc && rc == 0; q++)
        if (c[q].fresh)
            rc = place_fresh(r, c, q, nc, eb);
    if (rc != 0 || (rc = fill_flush(r, eb)) != 0)
        goto out;
    /* The new segment list, and the plan segments' offsets. */
    out = malloc((r->nseg + nfresh + 1) * sizeof *out);
    if (!out) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "device memory: out of memory placing segments");
        goto out;
    }
    for (size_t q = 0; q < nc; q++) {
        comp *k = &c[q];
        if (k->fresh) {
            out[nout].pa = k->lo;
            out[nout].len = k->hi - k->lo;
            out[nout].off = k->off;
            nout++;
            for (size_t m = k->s0; m < k->s1; m++)
                p->segs[m].arena_off = k->off + (S[m].pa - k->lo);
            continue;
        }
        for (size_t m = k->r0; m < k->r1; m++)
            out[nout++] = r->seg[m];
        for (size_t m = k->s0; m < k->s1; m++) /* inside the one resident segment */
            p->segs[m].arena_off = r->seg[k->r0].off + (S[m].pa - r->seg[k->r0].pa);
    }
    free(r->seg);
    r->seg = out;
    r->nseg = nout;
    out = NULL;
    p->arena_bytes = r->cap;
    check_arena(r);
out:
    r->fill_lo = r->fill_hi = 0;
    free(out);
    free(c);
    return rc;
}

int kb_resident_commit(kb_resident *r, const kb_plan *p, kb_errbuf *eb)
{
    const uint8_t *payload = kb_oplog_payload(r->log);
    size_t size = kb_oplog_payload_size(r->log);
    int rc;

    if ((rc = kb_memstore_mark_device(r->ms, p->wruns, p->nwruns)) != 0)
        return kb_err_set(eb, rc, "device memory: out of memory marking written bytes");
    if (size > r->payload_have) {
        double t0 = now_ms();
        if ((rc = r->ops->payload(r->dev, payload, size, r->payload_have, eb)) != 0)
            return rc;
        r->st.uploads++;
        r->st.upload_bytes += size - r->payload_have;
        r->st.upload_ms += now_ms() - t0;
        r->payload_have = size;
    }
    return 0;
}

void kb_resident_stats(const kb_resident *r, kb_xfer_stats *out)
{
    *out = r->st;
    out->arena_bytes = r->cap;
    out->blocks = r->nblk;
    out->resident_bytes = 0;
    for (size_t i = 0; i < r->nseg; i++)
        out->resident_bytes += r->seg[i].len;
    out->segments = r->nseg;
}

uint64_t kb_resident_footprint(uint64_t bytes)
{
    return bytes + bytes / 16 + RESERVE_SLACK;
}

void kb_resident_reserve(kb_resident *r, uint64_t bytes)
{
    if (r)
        r->reserve = bytes;
}

void kb_backend_reserve(const kb_backend *be, uint64_t bytes)
{
    if (be && be->ops && be->ops->resident)
        kb_resident_reserve(be->ops->resident(be->self), bytes);
}

void kb_backend_xfer_stats(const kb_backend *be, kb_xfer_stats *out)
{
    kb_resident *r = be && be->ops && be->ops->resident ? be->ops->resident(be->self) : NULL;
    if (r)
        kb_resident_stats(r, out);
    else
        memset(out, 0, sizeof *out);
}
