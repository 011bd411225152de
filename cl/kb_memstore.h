/*
 * kb_memstore — the contents of simulated memory, stored sparsely.
 *
 * A hash map from 4 KiB page number (PA >> 12) to a lazily allocated page. Phase 2 writes it
 * (the replay copies its results back), host reads read it. Bytes never written read as 0xFF,
 * which is a NaN in every kbcl dtype, so reading an `empty` tensor before writing it is
 * visible rather than silently zero.
 * Limits: single-threaded; pages are never freed before kb_memstore_destroy.
 */
#ifndef KB_MEMSTORE_H
#define KB_MEMSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"

#define KB_MEMSTORE_POISON 0xFFu
/* Small pages: simulated data is scattered over many PEs' windows in small pieces (a 256-PE
 * collective touches thousands of them), and every page is filled with poison when created. */
#define KB_MEMSTORE_PAGE_SHIFT 12
#define KB_MEMSTORE_PAGE_BYTES (UINT64_C(1) << KB_MEMSTORE_PAGE_SHIFT)

typedef struct kb_memstore kb_memstore;

kb_memstore *kb_memstore_create(void);
void kb_memstore_destroy(kb_memstore *ms); /* NULL is a no-op */

void kb_memstore_read(const kb_memstore *ms, uint64_t pa, void *dst, size_t n);
int kb_memstore_write(kb_memstore *ms, uint64_t pa, const void *src, size_t n); /* NOMEM */

size_t kb_memstore_pages(const kb_memstore *ms);

#endif
