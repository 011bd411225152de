/*
 * kb_alloc — first-fit range allocator (see kb_alloc.h). Free blocks and live allocations are
 * kept in two address-sorted arrays: first-fit walks the free array in address order, free()
 * finds the live block by binary search and merges the returned range with its neighbours.
 * Both arrays are grown *before* anything is modified, so a failing call (no space, bad
 * argument, host out of memory) leaves the allocator exactly as it was. The allocator only
 * hands out numbers; it never touches the memory they name. Limits: O(free blocks) per
 * allocation and O(blocks) per insertion/removal; not thread-safe; the region must not wrap
 * around 2^64.
 */
#include "kb_alloc.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct range {
    uint64_t addr, len;
} range;

/* An address-sorted array of disjoint ranges. */
typedef struct range_vec {
    range *v;
    size_t n, cap;
} range_vec;

struct kb_alloc {
    char *name; /* owned copy */
    uint64_t base, size, used;
    range_vec free_list; /* disjoint, never adjacent (merged on free) */
    range_vec live;      /* live allocations */
};

/* Makes room for `extra` more entries; the contents are untouched. */
static int vec_reserve(range_vec *rv, size_t extra)
{
    size_t cap;
    range *nv;

    if (rv->n + extra <= rv->cap)
        return 0;
    cap = rv->cap ? rv->cap : 8;
    while (cap < rv->n + extra)
        cap *= 2;
    nv = realloc(rv->v, cap * sizeof *nv);
    if (!nv)
        return KB_ERR_NOMEM;
    rv->v = nv;
    rv->cap = cap;
    return 0;
}

/* Capacity must have been reserved. */
static void vec_insert(range_vec *rv, size_t at, range r)
{
    assert(rv->n < rv->cap && at <= rv->n);
    memmove(&rv->v[at + 1], &rv->v[at], (rv->n - at) * sizeof *rv->v);
    rv->v[at] = r;
    rv->n++;
}

static void vec_remove(range_vec *rv, size_t at)
{
    assert(at < rv->n);
    memmove(&rv->v[at], &rv->v[at + 1], (rv->n - at - 1) * sizeof *rv->v);
    rv->n--;
}

/* Index of the first entry whose addr is >= addr. */
static size_t vec_lower_bound(const range_vec *rv, uint64_t addr)
{
    size_t lo = 0, hi = rv->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rv->v[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

kb_alloc *kb_alloc_create(const char *name, uint64_t base, uint64_t size)
{
    kb_alloc *a;

    if (size > UINT64_MAX - base)
        return NULL;
    a = calloc(1, sizeof *a);
    if (!a)
        goto fail;
    a->name = strdup(name ? name : "allocator");
    if (!a->name)
        goto fail;
    a->base = base;
    a->size = size;
    if (size > 0) {
        if (vec_reserve(&a->free_list, 1) != 0)
            goto fail;
        a->free_list.v[0] = (range){base, size};
        a->free_list.n = 1;
    }
    return a;
fail:
    kb_alloc_destroy(a);
    return NULL;
}

void kb_alloc_destroy(kb_alloc *a)
{
    if (!a)
        return;
    free(a->free_list.v);
    free(a->live.v);
    free(a->name);
    free(a);
}

/* The first address >= addr that is a multiple of align (a power of two); 0 on overflow, with
 * *ok cleared. */
static uint64_t align_up(uint64_t addr, uint64_t align, int *ok)
{
    if (align - 1 > UINT64_MAX - addr) {
        *ok = 0;
        return 0;
    }
    *ok = 1;
    return (addr + align - 1) & ~(align - 1);
}

char *kb_fmt_bytes(uint64_t bytes, char *buf, size_t n)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned u = 0;
    uint64_t scale = 1024;

    if (!buf || n == 0)
        return buf;
    if (bytes < 1024) {
        snprintf(buf, n, "%" PRIu64 " B", bytes);
        return buf;
    }
    while (u + 1 < sizeof units / sizeof units[0] && bytes / 1024 >= scale) {
        scale *= 1024;
        u++;
    }
    snprintf(buf, n, "%.2f %s", (double)bytes / (double)scale, units[u]);
    return buf;
}

static int nospace(const kb_alloc *a, uint64_t size, uint64_t align, kb_errbuf *eb)
{
    char want[32], avail[32], largest[32], total[32], al[32];
    uint64_t big = kb_alloc_largest_free(a);

    kb_fmt_bytes(size, want, sizeof want);
    kb_fmt_bytes(a->size - a->used, avail, sizeof avail);
    kb_fmt_bytes(big, largest, sizeof largest);
    kb_fmt_bytes(a->size, total, sizeof total);
    if (big >= size) /* only the alignment stood in the way: say so */
        return kb_err_set(eb, KB_ERR_NOSPACE,
                          "%s: cannot allocate %s: %s free, largest free block %s of %s "
                          "(no free block fits at alignment %s)",
                          a->name, want, avail, largest, total,
                          kb_fmt_bytes(align, al, sizeof al));
    return kb_err_set(eb, KB_ERR_NOSPACE,
                      "%s: cannot allocate %s: %s free, largest free block %s of %s", a->name,
                      want, avail, largest, total);
}

int kb_alloc_alloc(kb_alloc *a, uint64_t size, uint64_t align, uint64_t *out, kb_errbuf *eb)
{
    size_t i;
    int rc;

    if (!a || !out)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_alloc_alloc: NULL argument");
    if (align == 0)
        align = 1;
    if (size == 0)
        return kb_err_set(eb, KB_ERR_INVAL, "%s: cannot allocate 0 bytes", a->name);
    if ((align & (align - 1)) != 0)
        return kb_err_set(eb, KB_ERR_INVAL,
                          "%s: alignment %" PRIu64 " is not a power of two", a->name, align);
    for (i = 0; i < a->free_list.n; i++) {
        range blk = a->free_list.v[i];
        int ok;
        uint64_t start = align_up(blk.addr, align, &ok);
        uint64_t lead, tail;

        if (!ok || start - blk.addr >= blk.len || size > blk.len - (start - blk.addr))
            continue;
        lead = start - blk.addr;
        tail = blk.len - lead - size;
        /* Worst case: the block splits into a leading and a trailing remainder. */
        rc = vec_reserve(&a->free_list, 1);
        if (rc == 0)
            rc = vec_reserve(&a->live, 1);
        if (rc != 0)
            return kb_err_set(eb, rc, "%s: out of host memory", a->name);
        if (lead > 0 && tail > 0) {
            a->free_list.v[i].len = lead;
            vec_insert(&a->free_list, i + 1, (range){start + size, tail});
        } else if (lead > 0) {
            a->free_list.v[i].len = lead;
        } else if (tail > 0) {
            a->free_list.v[i] = (range){start + size, tail};
        } else {
            vec_remove(&a->free_list, i);
        }
        vec_insert(&a->live, vec_lower_bound(&a->live, start), (range){start, size});
        a->used += size;
        assert(a->used <= a->size); /* live ranges are disjoint pieces of the region */
        *out = start;
        return 0;
    }
    return nospace(a, size, align, eb);
}

int kb_alloc_free(kb_alloc *a, uint64_t addr, kb_errbuf *eb)
{
    size_t li, fi;
    range blk;
    int merge_prev, merge_next;

    if (!a)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_alloc_free: NULL allocator");
    li = vec_lower_bound(&a->live, addr);
    if (li == a->live.n || a->live.v[li].addr != addr)
        return kb_err_set(eb, KB_ERR_INVAL,
                          "%s: free of 0x%" PRIx64 ", which is not a live allocation", a->name,
                          addr);
    if (vec_reserve(&a->free_list, 1) != 0)
        return kb_err_set(eb, KB_ERR_NOMEM, "%s: out of host memory", a->name);
    blk = a->live.v[li];
    vec_remove(&a->live, li);
    assert(a->used >= blk.len); /* used is the sum of the live lengths */
    a->used -= blk.len;

    fi = vec_lower_bound(&a->free_list, blk.addr);
    /* a live range overlaps no free block */
    assert((fi == 0 || a->free_list.v[fi - 1].addr + a->free_list.v[fi - 1].len <= blk.addr) &&
           (fi == a->free_list.n || blk.addr + blk.len <= a->free_list.v[fi].addr));
    merge_prev = fi > 0 && a->free_list.v[fi - 1].addr + a->free_list.v[fi - 1].len == blk.addr;
    merge_next = fi < a->free_list.n && blk.addr + blk.len == a->free_list.v[fi].addr;
    if (merge_prev && merge_next) {
        a->free_list.v[fi - 1].len += blk.len + a->free_list.v[fi].len;
        vec_remove(&a->free_list, fi);
    } else if (merge_prev) {
        a->free_list.v[fi - 1].len += blk.len;
    } else if (merge_next) {
        a->free_list.v[fi].addr = blk.addr;
        a->free_list.v[fi].len += blk.len;
    } else {
        vec_insert(&a->free_list, fi, blk);
    }
    return 0;
}

uint64_t kb_alloc_base(const kb_alloc *a)
{
    return a ? a->base : 0;
}

uint64_t kb_alloc_size(const kb_alloc *a)
{
    return a ? a->size : 0;
}

uint64_t kb_alloc_used(const kb_alloc *a)
{
    return a ? a->used : 0;
}

uint64_t kb_alloc_largest_free(const kb_alloc *a)
{
    uint64_t big = 0;
    size_t i;

    if (!a)
        return 0;
    for (i = 0; i < a->free_list.n; i++)
        if (a->free_list.v[i].len > big)
            big = a->free_list.v[i].len;
    return big;
}

size_t kb_alloc_nblocks(const kb_alloc *a)
{
    return a ? a->live.n : 0;
}
