/*
 * kb_mmu — virtual-to-physical translation for kernels.
 *
 * A tensor gets one virtual range from the VA allocator (kb_alloc over the VA space); shard i
 * lives at va_base + offset_bytes(i), and each shard maps to the physical block that holds
 * it. An MMU is a sorted table of disjoint segments {va, len, pa}; translation is a binary
 * search and returns the PA plus how many bytes stay contiguous from there. kbcl keeps one
 * MMU per SIP, referenced by each of that SIP's PEs (every PE of a SIP sees every tensor of
 * that SIP, as kernels that address peers' shards need).
 * Limits: segments may not overlap (KB_ERR_INVAL); O(log n) lookups, O(n) inserts.
 */
#ifndef KB_MMU_H
#define KB_MMU_H

#include <stddef.h>
#include <stdint.h>

#include "kb_addr.h"
#include "kb_err.h"


typedef struct kb_mmu kb_mmu;

kb_mmu *kb_mmu_create(void);
void kb_mmu_destroy(kb_mmu *m); /* NULL is a no-op */

/* Maps [va, va+len) -> [pa, pa+len). Overlap with an existing segment is KB_ERR_INVAL. */
int kb_mmu_map(kb_mmu *m, kb_va va, uint64_t len, kb_pa pa, kb_errbuf *eb);
/* Removes every segment inside [va, va+len) (segments must lie wholly inside). */
int kb_mmu_unmap(kb_mmu *m, kb_va va, uint64_t len, kb_errbuf *eb);

/*
 * Translates va. On success *pa receives the physical address and *contig (may be NULL) the
 * number of bytes mapped contiguously from va to the end of its segment. Unmapped VA gives
 * KB_ERR_NOTFOUND with a message naming the address.
 */
int kb_mmu_translate(const kb_mmu *m, kb_va va, kb_pa *pa, uint64_t *contig, kb_errbuf *eb);

/*
 * The segment holding va: its start, length and physical start (a caller may keep them to
 * translate later addresses inside it without a search, while kb_mmu_gen is unchanged).
 * Unmapped VA gives KB_ERR_NOTFOUND with a message naming the address.
 */
int kb_mmu_segment(const kb_mmu *m, kb_va va, kb_va *seg_va, uint64_t *seg_len, kb_pa *seg_pa,
                   kb_errbuf *eb);

/* A count that changes whenever a segment is mapped or unmapped (never 0). */
uint64_t kb_mmu_gen(const kb_mmu *m);

size_t kb_mmu_nsegments(const kb_mmu *m);

#endif
