/*
 * kb_alloc — a first-fit range allocator over one contiguous region [base, base + size).
 *
 * Used for every simulated memory: a PE's HBM slice, TCM, IPCQ ring area and scratch, and a
 * cube's SRAM; also for the virtual address space. It hands out offsets/addresses aligned to
 * the requested power of two, keeps free blocks in an address-ordered list and merges
 * neighbours on free, so fragmentation stays visible and deterministic.
 * Exhaustion is an error (KB_ERR_NOSPACE) that leaves the allocator unchanged.
 * Limits: O(free blocks) per call; not thread-safe.
 */
#ifndef KB_ALLOC_H
#define KB_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"

typedef struct kb_alloc kb_alloc;

/* name is copied (for messages). Owner: caller; kb_alloc_destroy(NULL) is a no-op. */
kb_alloc *kb_alloc_create(const char *name, uint64_t base, uint64_t size);
void kb_alloc_destroy(kb_alloc *a);

/*
 * Allocates `size` bytes (> 0) aligned to `align` (a power of two, 0 = 1) and stores the
 * address in *out. On failure returns KB_ERR_NOSPACE (message: "<name>: cannot allocate
 * 7.00 GiB: 6.00 GiB free, largest free block 6.00 GiB of 6.00 GiB") or KB_ERR_INVAL, and
 * changes nothing.
 */
int kb_alloc_alloc(kb_alloc *a, uint64_t size, uint64_t align, uint64_t *out, kb_errbuf *eb);

/* Frees a block returned by kb_alloc_alloc (exact address); KB_ERR_INVAL for anything else. */
int kb_alloc_free(kb_alloc *a, uint64_t addr, kb_errbuf *eb);

uint64_t kb_alloc_base(const kb_alloc *a);
uint64_t kb_alloc_size(const kb_alloc *a);
uint64_t kb_alloc_used(const kb_alloc *a);
uint64_t kb_alloc_largest_free(const kb_alloc *a);
size_t kb_alloc_nblocks(const kb_alloc *a); /* live allocations */

/* "7.00 GiB", "512 B", "1.50 MiB" into buf (n bytes); returns buf. */
char *kb_fmt_bytes(uint64_t bytes, char *buf, size_t n);

#endif
