/*
 * kb_memstore — sparse simulated memory: an open-addressing (linear probing) hash map from
 * 4 KiB page number (PA >> 12) to a lazily allocated page that starts filled with
 * KB_MEMSTORE_POISON. The table stays at most half full, so probes are short. A write first
 * makes sure every page it touches exists and only then copies, so a failed (NOMEM) write
 * leaves the visible contents unchanged. Limits: single-threaded; pages are freed only by
 * kb_memstore_destroy; an access must not wrap around the end of the 64-bit address space.
 */
#include "kb_memstore.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define PAGE_SHIFT KB_MEMSTORE_PAGE_SHIFT
#define PAGE_SIZE KB_MEMSTORE_PAGE_BYTES

struct kb_memstore {
    uint64_t *keys;   /* page numbers; a slot is empty when its page pointer is NULL */
    uint8_t **pages;  /* owned */
    size_t cap;       /* power of two, or 0 before the first write */
    unsigned log2cap;
    size_t npages;
};

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
    p = malloc(PAGE_SIZE);
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
    return calloc(1, sizeof(kb_memstore));
}

void kb_memstore_destroy(kb_memstore *ms)
{
    if (!ms)
        return;
    for (size_t i = 0; i < ms->cap; i++)
        free(ms->pages[i]);
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

int kb_memstore_write(kb_memstore *ms, uint64_t pa, const void *src, size_t n)
{
    const uint8_t *in = src;

    if (n == 0)
        return 0;
    if (!src || pa + (n - 1) < pa)
        return KB_ERR_INVAL;
    /* Allocate first: new pages are all poison, so a failure here changes nothing visible. */
    uint64_t first = pa >> PAGE_SHIFT, last = (pa + (n - 1)) >> PAGE_SHIFT;
    for (uint64_t k = first;; k++) {
        uint8_t *p;
        int rc = get_or_add_page(ms, k, &p);
        if (rc)
            return rc;
        if (k == last)
            break;
    }
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
    return 0;
}

size_t kb_memstore_pages(const kb_memstore *ms)
{
    return ms->npages;
}
