/*
 * kb_resident — device-resident simulated memory (kb_resident.h). The resident segments are a
 * sorted array searched by binary search. Placing a plan walks the resident segments and the
 * plan's segments together in PA order and groups them into components of overlapping
 * intervals; a component that holds a plan segment and is not exactly one resident segment
 * becomes one new segment at the arena's end. New bytes are initialised from the store in
 * pieces of at most 64 MiB through one staging buffer. Wall times come from CLOCK_MONOTONIC
 * around the blocking uploads and downloads.
 */
#include "kb_resident.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STAGE_PIECE (UINT64_C(64) << 20)

typedef struct rseg {
    uint64_t pa, len, off;
} rseg;

struct kb_resident {
    const kb_resident_ops *ops;
    uint64_t fill_lo, fill_hi; /* a poison fill not issued yet (fill_lo == fill_hi: none) */
    void *dev;
    kb_memstore *ms;          /* the bound store, or NULL */
    const kb_oplog *log;      /* whose payload the device holds */
    size_t payload_have;      /* bytes of it on the device */
    rseg *seg;                /* resident segments, sorted by pa, disjoint */
    size_t nseg;
    uint64_t top, cap;        /* arena bytes handed out / capacity */
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
    r->top = 0;
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
        rc = locate(r, pa[t], per, &off[t]);
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
        if (r->fill_hi > r->fill_lo && off >= r->fill_hi && off - r->fill_hi < 8) {
            r->fill_hi = off + n;
            return 0;
        }
        if ((rc = fill_flush(r, eb)) != 0)
            return rc;
        r->fill_lo = off;
        r->fill_hi = off + n;
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

/* Grows (and compacts) the arena so that `need` more bytes fit after the resident segments. */
static int grow(kb_resident *r, uint64_t need, kb_errbuf *eb)
{
    kb_move *mv = malloc((r->nseg ? r->nseg : 1) * sizeof *mv);
    uint64_t end = 0, cap;
    int rc;

    if (!mv)
        return kb_err_set(eb, KB_ERR_NOMEM, "device memory: out of memory growing the arena");
    for (size_t i = 0; i < r->nseg; i++) {
        uint64_t off = align_off(end, r->seg[i].pa);
        mv[i].from = r->seg[i].off;
        mv[i].to = off;
        mv[i].n = r->seg[i].len;
        end = off + r->seg[i].len;
    }
    /* A first arena is sized to fit; a growing one gets half again as much room, unless the
     * device cannot hold that beside the old one (the copy needs both): then just what fits
     * the data, which a device with room for twice the data always takes. */
    cap = end + need;
    if (r->cap > 0)
        cap += cap / 2;
    cap = (cap + 4095u) & ~(uint64_t)4095u;
    rc = r->ops->arena(r->dev, cap, mv, r->nseg, eb);
    if (rc == KB_ERR_DEVICE && r->cap > 0 && cap > ((end + need + 4095u) & ~(uint64_t)4095u)) {
        cap = (end + need + 4095u) & ~(uint64_t)4095u;
        rc = r->ops->arena(r->dev, cap, mv, r->nseg, eb);
    }
    if (rc == 0) {
        for (size_t i = 0; i < r->nseg; i++) {
            r->seg[i].off = mv[i].to;
            r->st.moves++;
            r->st.move_bytes += mv[i].n;
        }
        r->top = end;
        r->cap = cap;
    }
    free(mv);
    return rc;
}

int kb_resident_place(void *ctx, kb_plan *p, kb_errbuf *eb)
{
    kb_resident *r = ctx;
    const kb_segment *S = p->segs;
    size_t nS = p->nsegs, i = 0, j = 0, nc = 0, nfresh = 0;
    comp *c = malloc((r->nseg + nS + 1) * sizeof *c);
    rseg *out = NULL;
    uint64_t need = 0;
    int rc = 0;

    if (!c)
        return kb_err_set(eb, KB_ERR_NOMEM, "device memory: out of memory placing segments");
    /* Components in PA order; intervals join one when they overlap it (touching is not enough:
     * no operand spans two plan segments). */
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
        if (k->fresh) {
            need += k->hi - k->lo + 8;
            nfresh++;
        }
    }
    if (nfresh > 0 && r->top + need > r->cap && (rc = grow(r, need, eb)) != 0)
        goto out;
    /* New segments: resident parts copied on the device, the bytes between from the store. */
    for (size_t q = 0; q < nc; q++) {
        comp *k = &c[q];
        if (!k->fresh)
            continue;
        uint64_t off = align_off(r->top, k->lo), at = k->lo;
        k->off = off;
        for (size_t m = k->r0; m < k->r1; m++) {
            const rseg *s = &r->seg[m];
            if ((rc = init_from_store(r, off + (at - k->lo), at, s->pa - at, eb)) != 0 ||
                (rc = fill_flush(r, eb)) != 0 ||
                (rc = r->ops->copy(r->dev, off + (s->pa - k->lo), s->off, s->len, eb)) != 0)
                goto out;
            r->st.moves++;
            r->st.move_bytes += s->len;
            at = s->pa + s->len;
        }
        if ((rc = init_from_store(r, off + (at - k->lo), at, k->hi - at, eb)) != 0)
            goto out;
        r->top = off + (k->hi - k->lo);
    }
    if ((rc = fill_flush(r, eb)) != 0)
        goto out;
    /* The new segment list, and the plan segments' offsets. */
    size_t nout = 0;
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
    out->resident_bytes = 0;
    for (size_t i = 0; i < r->nseg; i++)
        out->resident_bytes += r->seg[i].len;
    out->segments = r->nseg;
}

void kb_backend_xfer_stats(const kb_backend *be, kb_xfer_stats *out)
{
    kb_resident *r = be && be->ops && be->ops->resident ? be->ops->resident(be->self) : NULL;
    if (r)
        kb_resident_stats(r, out);
    else
        memset(out, 0, sizeof *out);
}
