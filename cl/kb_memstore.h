/*
 * kb_memstore — the contents of simulated memory, stored sparsely.
 *
 * A hash map from 4 KiB page number (PA >> 12) to a lazily allocated page. Phase 2 writes it
 * (the replay copies its results back), host reads read it. Bytes never written read as 0xFF,
 * which is a NaN in every kbcl dtype, so reading an `empty` tensor before writing it is
 * visible rather than silently zero.
 *
 * Device copy. A device-resident Phase-2 backend keeps the bytes its records touch in device
 * memory across flushes (kb_replay.h); the store is then the host copy and attaches that
 * backend as its mirror. Two sets of byte ranges say which copy is newer:
 *   device-dirty: bytes the device wrote that the host copy lacks. kb_memstore_load, which
 *     every host read of simulated memory uses, reads them through from the mirror straight
 *     into the caller's buffer, keeping nothing (a GB-scale result read once needs no host
 *     pages; a second read pulls again); kb_memstore_sync pulls them into the host copy,
 *     where they are then clean; kb_memstore_read alone returns the host copy as it is.
 *   host-dirty:   bytes kb_memstore_write changed while a mirror was attached; the replayer
 *     uploads those it holds on the device before its next flush and clears the set.
 * A write makes its bytes host-dirty and no longer device-dirty (the host's bytes are newer).
 * Without a mirror both sets stay empty and the store is what it always was.
 * Limits: single-threaded; pages are never freed before kb_memstore_destroy; a range must not
 * wrap around the 64-bit address space (writes, loads and syncs refuse one: KB_ERR_INVAL),
 * and the space's last byte is never device-dirty or host-dirty (the dirty sets cannot hold
 * it; no record reaches it).
 */
#ifndef KB_MEMSTORE_H
#define KB_MEMSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kb_ivset.h"

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
/* 1 if some page of [pa, pa + n) exists (some byte there was ever written), else 0. */
int kb_memstore_has_pages(const kb_memstore *ms, uint64_t pa, uint64_t n);

/* The device side of the store (see above). */
typedef struct kb_memstore_mirror {
    void *self;
    /* Copies device bytes [pa, pa + n) into dst. */
    int (*pull)(void *self, uint64_t pa, void *dst, size_t n, kb_errbuf *eb);
    /* The store is being destroyed or gets another mirror: forget it, transfer nothing. */
    void (*detach)(void *self);
} kb_memstore_mirror;

/* Attaches m (copied; NULL: none). A previous mirror is detached; the dirty sets are kept. */
void kb_memstore_set_mirror(kb_memstore *ms, const kb_memstore_mirror *m);
/* The attached mirror's self, or NULL. */
void *kb_memstore_mirror_self(const kb_memstore *ms);

/* Marks r[0..k) (sorted by lo) device-dirty. KB_ERR_NOMEM leaves the sets unchanged. */
int kb_memstore_mark_device(kb_memstore *ms, const kb_range *r, size_t k);
/*
 * Pulls the device-dirty bytes of [pa, pa + n) into the host copy (they are then clean).
 * KB_ERR_NOMEM, the mirror's error, or KB_ERR_STATE when bytes are device-dirty and no mirror
 * is attached (the device copy was lost).
 */
int kb_memstore_sync(kb_memstore *ms, uint64_t pa, uint64_t n, kb_errbuf *eb);
/* Pulls every device-dirty byte (before the mirror goes away). */
int kb_memstore_sync_all(kb_memstore *ms, kb_errbuf *eb);
/* [pa, pa + n) as the newest copy has it (device-dirty bytes read through from the mirror,
 * the rest from the host copy): what a host read of simulated memory uses. Errors as
 * kb_memstore_sync's. */
int kb_memstore_load(kb_memstore *ms, uint64_t pa, void *dst, size_t n, kb_errbuf *eb);

const kb_ivset *kb_memstore_device_dirty(const kb_memstore *ms);
const kb_ivset *kb_memstore_host_dirty(const kb_memstore *ms);
void kb_memstore_host_clean(kb_memstore *ms);  /* empties the host-dirty set */

#endif
