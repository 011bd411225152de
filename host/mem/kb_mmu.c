/*
 * kb_mmu — virtual-to-physical translation (see kb_mmu.h). The table is one array of
 * disjoint segments sorted by virtual address: kernels translate far more often than tensors
 * are mapped, so lookups are a binary search and inserts pay the O(n) shift. Segments are
 * variable-length (one per shard) rather than fixed pages, which keeps the table small and
 * lets translate() report how many bytes stay contiguous. Limits: a segment's physical range
 * is only checked for a valid start address and no 64-bit wrap, not for staying inside one
 * memory window (the allocators that produced it guarantee that); not thread-safe.
 */
#include "kb_mmu.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct segment {
    kb_va va;
    uint64_t len;
    kb_pa pa;
} segment;

struct kb_mmu {
    segment *seg; /* owned; sorted by va, disjoint */
    size_t n, cap;
    uint64_t gen; /* bumped by every map and unmap (callers' translation caches) */
};

kb_mmu *kb_mmu_create(void)
{
    return calloc(1, sizeof(kb_mmu));
}

void kb_mmu_destroy(kb_mmu *m)
{
    if (!m)
        return;
    free(m->seg);
    free(m);
}

/* Index of the first segment whose va is > va. */
static size_t upper_bound(const kb_mmu *m, kb_va va)
{
    size_t lo = 0, hi = m->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->seg[mid].va <= va)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int kb_mmu_map(kb_mmu *m, kb_va va, uint64_t len, kb_pa pa, kb_errbuf *eb)
{
    size_t at;

    if (!m)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_mmu_map: NULL mmu");
    if (len == 0 || len > UINT64_MAX - va || len > UINT64_MAX - pa)
        return kb_err_set(eb, KB_ERR_INVAL,
                          "mmu: cannot map 0x%" PRIx64 " bytes at virtual address 0x%" PRIx64,
                          len, va);
    if (!kb_pa_valid(pa))
        return kb_err_set(eb, KB_ERR_INVAL,
                          "mmu: virtual address 0x%" PRIx64 " mapped to invalid physical "
                          "address 0x%" PRIx64,
                          va, pa);
    at = upper_bound(m, va);
    if (at > 0 && m->seg[at - 1].va + m->seg[at - 1].len > va) {
        const segment *s = &m->seg[at - 1];
        return kb_err_set(eb, KB_ERR_INVAL,
                          "mmu: [0x%" PRIx64 ", 0x%" PRIx64 ") overlaps the mapped segment "
                          "[0x%" PRIx64 ", 0x%" PRIx64 ")",
                          va, va + len, s->va, s->va + s->len);
    }
    if (at < m->n && m->seg[at].va < va + len) {
        const segment *s = &m->seg[at];
        return kb_err_set(eb, KB_ERR_INVAL,
                          "mmu: [0x%" PRIx64 ", 0x%" PRIx64 ") overlaps the mapped segment "
                          "[0x%" PRIx64 ", 0x%" PRIx64 ")",
                          va, va + len, s->va, s->va + s->len);
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        segment *ns = realloc(m->seg, cap * sizeof *ns);
        if (!ns)
            return kb_err_set(eb, KB_ERR_NOMEM, "mmu: out of host memory");
        m->seg = ns;
        m->cap = cap;
    }
    memmove(&m->seg[at + 1], &m->seg[at], (m->n - at) * sizeof *m->seg);
    m->seg[at] = (segment){va, len, pa};
    m->n++;
    m->gen++;
    return 0;
}

int kb_mmu_unmap(kb_mmu *m, kb_va va, uint64_t len, kb_errbuf *eb)
{
    size_t first, last, i;
    kb_va end;

    if (!m)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_mmu_unmap: NULL mmu");
    if (len == 0 || len > UINT64_MAX - va)
        return kb_err_set(eb, KB_ERR_INVAL,
                          "mmu: cannot unmap 0x%" PRIx64 " bytes at virtual address 0x%" PRIx64,
                          len, va);
    end = va + len;
    /* Segments intersecting [va, end) are the run [first, last). */
    first = upper_bound(m, va);
    if (first > 0 && m->seg[first - 1].va + m->seg[first - 1].len > va)
        first--;
    last = first;
    while (last < m->n && m->seg[last].va < end)
        last++;
    if (first == last)
        return kb_err_set(eb, KB_ERR_NOTFOUND,
                          "mmu: nothing mapped in [0x%" PRIx64 ", 0x%" PRIx64 ")", va, end);
    for (i = first; i < last; i++) {
        const segment *s = &m->seg[i];
        if (s->va < va || s->va + s->len > end)
            return kb_err_set(eb, KB_ERR_INVAL,
                              "mmu: segment [0x%" PRIx64 ", 0x%" PRIx64 ") sticks out of the "
                              "unmapped range [0x%" PRIx64 ", 0x%" PRIx64 ")",
                              s->va, s->va + s->len, va, end);
    }
    memmove(&m->seg[first], &m->seg[last], (m->n - last) * sizeof *m->seg);
    m->n -= last - first;
    m->gen++;
    return 0;
}

int kb_mmu_translate(const kb_mmu *m, kb_va va, kb_pa *pa, uint64_t *contig, kb_errbuf *eb)
{
    size_t at;
    const segment *s;

    if (!m || !pa)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_mmu_translate: NULL argument");
    at = upper_bound(m, va);
    if (at == 0 || m->seg[at - 1].va + m->seg[at - 1].len <= va)
        return kb_err_set(eb, KB_ERR_NOTFOUND, "unmapped virtual address 0x%" PRIx64, va);
    s = &m->seg[at - 1];
    *pa = s->pa + (va - s->va);
    if (contig)
        *contig = s->va + s->len - va;
    return 0;
}

int kb_mmu_segment(const kb_mmu *m, kb_va va, kb_va *seg_va, uint64_t *seg_len, kb_pa *seg_pa,
                   kb_errbuf *eb)
{
    size_t at;

    if (!m)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_mmu_segment: NULL mmu");
    at = upper_bound(m, va);
    if (at == 0 || m->seg[at - 1].va + m->seg[at - 1].len <= va)
        return kb_err_set(eb, KB_ERR_NOTFOUND, "unmapped virtual address 0x%" PRIx64, va);
    *seg_va = m->seg[at - 1].va;
    *seg_len = m->seg[at - 1].len;
    *seg_pa = m->seg[at - 1].pa;
    return 0;
}

uint64_t kb_mmu_gen(const kb_mmu *m)
{
    return m ? m->gen + 1 : 0;
}

size_t kb_mmu_nsegments(const kb_mmu *m)
{
    return m ? m->n : 0;
}
