/*
 * kb_memstore — sparse simulated memory: an open-addressing (linear probing) hash map from
 * 4 KiB page number (PA >> 12) to a lazily allocated page that starts filled with
 * KB_MEMSTORE_POISON. The table stays at most half full, so probes are short. A write first
 * makes sure every page it touches exists and only then copies, so a failed (NOMEM) write
 * leaves the visible contents unchanged. With a device mirror attached, two kb_ivsets track
 * the device-dirty and host-dirty bytes (kb_memstore.h); a sync pulls device-dirty runs in
 * pieces of at most 64 MiB through one staging buffer and stores them into the pages without
 * marking them host-dirty. Pages are cut from slabs of one 2 MiB huge page each (kb_bigmem):
 * a store of gigabytes then costs the kernel one fault per 2 MiB instead of one or two per page
 * (a malloc'd 4 KiB page with its header straddles two), which halved a verified model layer's
 * system time. Limits: single-threaded; pages are freed only by kb_memstore_destroy (with their
 * slabs); an access must not wrap around the end of the 64-bit address space.
 */
#include "kb_memstore.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kb_bigmem.h"

#define PAGE_SHIFT KB_MEMSTORE_PAGE_SHIFT
#define PAGE_SIZE KB_MEMSTORE_PAGE_BYTES

struct kb_memstore {
    uint64_t *keys;   /* page numbers; a slot is empty when its page pointer is NULL */
    uint8_t **pages;  /* owned */
    size_t cap;       /* power of two, or 0 before the first write */
    unsigned log2cap;
    size_t npages;
    uint8_t **slabs;  /* owned (kb_bigmem); pages point into them */
    size_t nslabs, slabcap;
    uint8_t *slab_next; /* the next free page of the newest slab */
    size_t slab_left;   /* free pages left in it */
    kb_memstore_mirror mirror; /* self == NULL: none */
    kb_ivset dev_dirty, host_dirty;
};

#define SYNC_PIECE (UINT64_C(64) << 20)

/* A slab's pages, and what to ask kb_bigmem for so that they are page-aligned and the buffer
 * with kb_bigmem's 64-byte header fits one 2 MiB huge page: 510 pages from the first page
 * boundary past the header. */
#define SLAB_PAGES 510u
#define SLAB_ASK ((size_t)SLAB_PAGES * PAGE_SIZE + PAGE_SIZE - 64u)

/* A fresh page from the newest slab, a new slab when it is used up; NULL when out of memory. */
static uint8_t *page_alloc(kb_memstore *ms)
{
    if (!ms->slab_left) {
        if (ms->nslabs == ms->slabcap) {
            size_t c = ms->slabcap ? 2 * ms->slabcap : 16;
            uint8_t **s = realloc(ms->slabs, c * sizeof *s);
            if (!s)
                return NULL;
            ms->slabs = s;
            ms->slabcap = c;
        }
        uint8_t *b = kb_bigmem_alloc(SLAB_ASK);
        if (!b)
            return NULL;
        ms->slabs[ms->nslabs++] = b;
        ms->slab_next = (uint8_t *)(((uintptr_t)b + PAGE_SIZE - 1) & ~(uintptr_t)(PAGE_SIZE - 1));
        ms->slab_left = SLAB_PAGES;
        assert(ms->slab_next + (size_t)SLAB_PAGES * PAGE_SIZE <= b + SLAB_ASK);
    }
    uint8_t *p = ms->slab_next;
    ms->slab_next += PAGE_SIZE;
    ms->slab_left--;
    return p;
}

static size_t slot_of(const kb_memstore *ms, uint64_t key)
{
    /* Fibonacci hashing spreads consecutive page numbers over the table. */
    return (size_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - ms->log2cap));
}

static uint8_t *find_page(const kb_memstore *ms, uint64_t key)
{
    if (ms->cap == 0)
        return NULL;
    size_t mask = ms->cap - 1;
    for (size_t i = slot_of(ms, key);; i = (i + 1) & mask) {
        if (!ms->pages[i])
            return NULL;
        if (ms->keys[i] == key)
            return ms->pages[i];
    }
}

static void insert_slot(kb_memstore *ms, uint64_t key, uint8_t *page)
{
    size_t mask = ms->cap - 1;
    size_t i = slot_of(ms, key);
    while (ms->pages[i])
        i = (i + 1) & mask;
    ms->keys[i] = key;
    ms->pages[i] = page;
}

static int grow(kb_memstore *ms)
{
    size_t oldcap = ms->cap;
    uint64_t *oldkeys = ms->keys;
    uint8_t **oldpages = ms->pages;
    size_t cap = oldcap ? oldcap * 2 : 64;
    uint64_t *keys = malloc(cap * sizeof *keys);
    uint8_t **pages = calloc(cap, sizeof *pages);

    if (!keys || !pages) {
        free(keys);
        free(pages);
        return KB_ERR_NOMEM;
    }
    ms->keys = keys;
    ms->pages = pages;
    ms->cap = cap;
    ms->log2cap = 0;
    while (((size_t)1 << ms->log2cap) < cap)
        ms->log2cap++;
    for (size_t i = 0; i < oldcap; i++)
        if (oldpages[i])
            insert_slot(ms, oldkeys[i], oldpages[i]);
    free(oldkeys);
    free(oldpages);
    return 0;
}

static int get_or_add_page(kb_memstore *ms, uint64_t key, uint8_t **out)
{
    uint8_t *p = find_page(ms, key);
    if (p) {
        *out = p;
        return 0;
    }
    if ((ms->npages + 1) * 2 > ms->cap) {
        int rc = grow(ms);
        if (rc)
            return rc;
    }
    p = page_alloc(ms);
    if (!p)
        return KB_ERR_NOMEM;
    memset(p, KB_MEMSTORE_POISON, PAGE_SIZE);
    insert_slot(ms, key, p);
    ms->npages++;
    *out = p;
    return 0;
}

kb_memstore *kb_memstore_create(void)
{
    kb_memstore *ms = calloc(1, sizeof(kb_memstore));
    if (ms) {
        kb_ivset_init(&ms->dev_dirty);
        kb_ivset_init(&ms->host_dirty);
    }
    return ms;
}

void kb_memstore_destroy(kb_memstore *ms)
{
    if (!ms)
        return;
    if (ms->mirror.self && ms->mirror.detach)
        ms->mirror.detach(ms->mirror.self);
    kb_ivset_free(&ms->dev_dirty);
    kb_ivset_free(&ms->host_dirty);
    for (size_t i = 0; i < ms->nslabs; i++)
        kb_bigmem_free(ms->slabs[i]);
    free(ms->slabs);
    free(ms->keys);
    free(ms->pages);
    free(ms);
}

void kb_memstore_read(const kb_memstore *ms, uint64_t pa, void *dst, size_t n)
{
    uint8_t *out = dst;

    assert(n == 0 || pa + (n - 1) >= pa);
    while (n > 0) {
        uint64_t in_page = pa & (PAGE_SIZE - 1);
        size_t chunk = (size_t)(PAGE_SIZE - in_page);
        if (chunk > n)
            chunk = n;
        const uint8_t *p = find_page(ms, pa >> PAGE_SHIFT);
        if (p)
            memcpy(out, p + in_page, chunk);
        else
            memset(out, KB_MEMSTORE_POISON, chunk);
        out += chunk;
        pa += chunk;
        n -= chunk;
    }
}

/*
 * The end of [pa, pa + n) (n > 0, not wrapping) in the dirty sets, whose intervals cannot end
 * at 2^64: a range that reaches the last byte of the address space is tracked without it. No
 * record ever touches that byte (the planner refuses an operand that would, kb_replay.c), so
 * it is never on a device: the host copy is always the newest.
 */
static uint64_t track_end(uint64_t pa, uint64_t n)
{
    return n > UINT64_MAX - pa ? UINT64_MAX : pa + n;
}

/* Makes every page of [pa, pa + n) exist (n > 0); a failure changes nothing visible. */
static int add_pages(kb_memstore *ms, uint64_t pa, uint64_t n)
{
    uint64_t first = pa >> PAGE_SHIFT, last = (pa + (n - 1)) >> PAGE_SHIFT;
    for (uint64_t k = first;; k++) {
        uint8_t *p;
        int rc = get_or_add_page(ms, k, &p);
        if (rc)
            return rc;
        if (k == last)
            break;
    }
    return 0;
}

/* Copies into existing pages. */
static void copy_in(kb_memstore *ms, uint64_t pa, const uint8_t *in, size_t n)
{
    while (n > 0) {
        uint64_t in_page = pa & (PAGE_SIZE - 1);
        size_t chunk = (size_t)(PAGE_SIZE - in_page);
        if (chunk > n)
            chunk = n;
        uint8_t *p = find_page(ms, pa >> PAGE_SHIFT);
        assert(p);
        memcpy(p + in_page, in, chunk);
        in += chunk;
        pa += chunk;
        n -= chunk;
    }
}

int kb_memstore_write(kb_memstore *ms, uint64_t pa, const void *src, size_t n)
{
    int rc;

    if (n == 0)
        return 0;
    if (!src || pa + (n - 1) < pa)
        return KB_ERR_INVAL;
    /* Allocate first: new pages are all poison, so a failure here changes nothing visible. */
    if ((rc = add_pages(ms, pa, n)) != 0)
        return rc;
    if (ms->mirror.self) {
        /* The host's bytes are now the newer ones: reserve, so that neither change fails. */
        if (kb_ivset_reserve(&ms->dev_dirty, 1) != 0 || kb_ivset_reserve(&ms->host_dirty, 1) != 0)
            return KB_ERR_NOMEM;
        kb_ivset_remove(&ms->dev_dirty, pa, track_end(pa, n));
        kb_ivset_add(&ms->host_dirty, pa, track_end(pa, n));
    }
    copy_in(ms, pa, src, n);
    return 0;
}

int kb_memstore_has_pages(const kb_memstore *ms, uint64_t pa, uint64_t n)
{
    if (n == 0 || ms->npages == 0)
        return 0;
    uint64_t first = pa >> PAGE_SHIFT, last = (pa + (n - 1)) >> PAGE_SHIFT;
    if (last - first >= ms->cap) { /* a long range: scan the table instead */
        for (size_t i = 0; i < ms->cap; i++)
            if (ms->pages[i] && ms->keys[i] >= first && ms->keys[i] <= last)
                return 1;
        return 0;
    }
    for (uint64_t k = first;; k++) {
        if (find_page(ms, k))
            return 1;
        if (k == last)
            return 0;
    }
}

void kb_memstore_set_mirror(kb_memstore *ms, const kb_memstore_mirror *m)
{
    if (ms->mirror.self && ms->mirror.detach &&
        (!m || m->self != ms->mirror.self))
        ms->mirror.detach(ms->mirror.self);
    if (m)
        ms->mirror = *m;
    else
        memset(&ms->mirror, 0, sizeof ms->mirror);
}

void *kb_memstore_mirror_self(const kb_memstore *ms)
{
    return ms->mirror.self;
}

int kb_memstore_mark_device(kb_memstore *ms, const kb_range *r, size_t k)
{
    return kb_ivset_add_sorted(&ms->dev_dirty, r, k);
}

int kb_memstore_sync(kb_memstore *ms, uint64_t pa, uint64_t n, kb_errbuf *eb)
{
    uint64_t end;
    uint8_t *stage = NULL;
    size_t i;
    int rc = 0;

    if (n == 0)
        return 0;
    if (pa + (n - 1) < pa)
        return kb_err_set(eb, KB_ERR_INVAL, "memory store: %llu bytes at PA 0x%llx wrap around "
                          "the address space", (unsigned long long)n, (unsigned long long)pa);
    end = track_end(pa, n);
    if (!kb_ivset_overlaps(&ms->dev_dirty, pa, end))
        return 0;
    if (!ms->mirror.self)
        return kb_err_set(eb, KB_ERR_STATE,
                          "memory store: %llu bytes at PA 0x%llx were computed on a device that "
                          "is gone",
                          (unsigned long long)ms->dev_dirty.bytes, (unsigned long long)pa);
    while ((i = kb_ivset_find(&ms->dev_dirty, pa)) < ms->dev_dirty.n &&
           ms->dev_dirty.v[i].lo < end) {
        uint64_t a = ms->dev_dirty.v[i].lo > pa ? ms->dev_dirty.v[i].lo : pa;
        uint64_t b = ms->dev_dirty.v[i].hi < end ? ms->dev_dirty.v[i].hi : end;
        if (b - a > SYNC_PIECE)
            b = a + SYNC_PIECE;
        /* every piece lies in the original [pa, end) and is at most SYNC_PIECE long */
        if (!stage && (stage = malloc((size_t)(n < SYNC_PIECE ? n : SYNC_PIECE))) == NULL) {
            rc = kb_err_set(eb, KB_ERR_NOMEM, "memory store: out of memory pulling device data");
            goto out;
        }
        if ((rc = add_pages(ms, a, b - a)) != 0 ||
            (rc = kb_ivset_reserve(&ms->dev_dirty, 1)) != 0) {
            kb_err_set(eb, rc, "memory store: out of memory pulling device data");
            goto out;
        }
        if ((rc = ms->mirror.pull(ms->mirror.self, a, stage, (size_t)(b - a), eb)) != 0)
            goto out;
        copy_in(ms, a, stage, (size_t)(b - a));
        kb_ivset_remove(&ms->dev_dirty, a, b);
        pa = b; /* what lies before b in [pa, end) is clean now */
    }
out:
    free(stage);
    return rc;
}

int kb_memstore_sync_all(kb_memstore *ms, kb_errbuf *eb)
{
    int rc = 0;
    while (rc == 0 && ms->dev_dirty.n > 0) {
        kb_range r = ms->dev_dirty.v[0];
        rc = kb_memstore_sync(ms, r.lo, r.hi - r.lo, eb);
    }
    return rc;
}

int kb_memstore_load(kb_memstore *ms, uint64_t pa, void *dst, size_t n, kb_errbuf *eb)
{
    uint8_t *out = dst;
    uint64_t end;

    if (n == 0)
        return 0;
    if (pa + (n - 1) < pa)
        return kb_err_set(eb, KB_ERR_INVAL, "memory store: %zu bytes at PA 0x%llx wrap around "
                          "the address space", n, (unsigned long long)pa);
    end = track_end(pa, n);
    if (!kb_ivset_overlaps(&ms->dev_dirty, pa, end)) {
        kb_memstore_read(ms, pa, dst, n);
        return 0;
    }
    if (!ms->mirror.self)
        return kb_memstore_sync(ms, pa, n, eb); /* reports the lost device copy */
    /* Device-dirty runs straight from the device into dst, the rest from the pages. */
    for (size_t i = kb_ivset_find(&ms->dev_dirty, pa); pa < end;) {
        const kb_range *d = i < ms->dev_dirty.n ? &ms->dev_dirty.v[i] : NULL;
        if (d && d->lo <= pa) {
            uint64_t b = d->hi < end ? d->hi : end;
            int rc = ms->mirror.pull(ms->mirror.self, pa, out, (size_t)(b - pa), eb);
            if (rc)
                return rc;
            out += b - pa;
            pa = b;
            i++;
        } else {
            uint64_t b = d && d->lo < end ? d->lo : end;
            kb_memstore_read(ms, pa, out, (size_t)(b - pa));
            out += b - pa;
            pa = b;
        }
    }
    if (out < (uint8_t *)dst + n) /* the last byte of the address space: never on a device */
        kb_memstore_read(ms, pa, out, (size_t)((uint8_t *)dst + n - out));
    return 0;
}

const kb_ivset *kb_memstore_device_dirty(const kb_memstore *ms)
{
    return &ms->dev_dirty;
}

const kb_ivset *kb_memstore_host_dirty(const kb_memstore *ms)
{
    return &ms->host_dirty;
}

void kb_memstore_host_clean(kb_memstore *ms)
{
    kb_ivset_clear(&ms->host_dirty);
}

size_t kb_memstore_pages(const kb_memstore *ms)
{
    return ms->npages;
}
