/*
 * kb_bigmem — zero-filled buffers for the large, short-lived arrays of a run (the op log's
 * record chunks, the Phase-2 planner's per-record arrays, the replay arena).
 *
 * A verified 256-PE collective writes ~200 000 records (tens of MiB) and plans them in a
 * handful of record-sized arrays; with 4 KiB pages the kernel's page faults and their
 * bookkeeping are a large part of such a run (docs/performance.md). Buffers of KB_BIGMEM_HUGE
 * bytes or more are therefore mapped on their own, 2 MiB aligned, and offered to transparent
 * huge pages (madvise(MADV_HUGEPAGE), honoured when the system's THP mode is "madvise" or
 * "always"); smaller ones come from calloc. Either way the memory starts zeroed and is released
 * with kb_bigmem_free. Limits: no realloc; a buffer's size is fixed at allocation.
 */
#ifndef KB_BIGMEM_H
#define KB_BIGMEM_H

#include <stddef.h>

#define KB_BIGMEM_HUGE ((size_t)1 << 20)

/* Owner: the caller; free with kb_bigmem_free. Returns NULL when out of memory. */
void *kb_bigmem_alloc(size_t bytes);
/* NULL is a no-op. */
void kb_bigmem_free(void *p);

#endif
