/*
 * kb_wire — a growable byte buffer written and read as a stream of fixed-width values: what
 * one process of a run spread over several (MPI ranks, docs/parallel.md) hands the others
 * (partition messages, the state of the SIPs it ran, op records). Values are written in the
 * host's own byte order and width: every process of a run is the same binary on the same kind
 * of host. Limits: no versioning and no checks of meaning; a reader that runs past the end
 * sets its error flag and reads zeros from then on, so a caller checks kb_wire_rd_ok once
 * after a batch of reads.
 *
 * Ownership: kb_wire_init starts an empty writer; kb_wire_free frees its bytes (the struct is
 * the caller's). A reader borrows the bytes it reads.
 */
#ifndef KB_WIRE_H
#define KB_WIRE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kb_wire {
    uint8_t *p;
    size_t n, cap;
    int oom; /* an append failed: the buffer is short (kb_wire_ok) */
} kb_wire;

typedef struct kb_wire_rd {
    const uint8_t *p;
    size_t n, at;
    int bad; /* read past the end */
} kb_wire_rd;

void kb_wire_init(kb_wire *w);
void kb_wire_free(kb_wire *w);
/* Appends n bytes (NULL: zeros); on failure sets w->oom and appends nothing. */
void kb_wire_put(kb_wire *w, const void *src, size_t n);
static inline void kb_wire_u64(kb_wire *w, uint64_t v) { kb_wire_put(w, &v, sizeof v); }
static inline void kb_wire_u32(kb_wire *w, uint32_t v) { kb_wire_put(w, &v, sizeof v); }
/* 0, or KB_ERR_NOMEM when an append failed. */
int kb_wire_ok(const kb_wire *w);

void kb_wire_rd_init(kb_wire_rd *r, const void *p, size_t n);
/* Copies the next n bytes to dst (zeros past the end, setting r->bad). */
void kb_wire_get(kb_wire_rd *r, void *dst, size_t n);
static inline uint64_t kb_wire_get_u64(kb_wire_rd *r)
{
    uint64_t v;
    kb_wire_get(r, &v, sizeof v);
    return v;
}
static inline uint32_t kb_wire_get_u32(kb_wire_rd *r)
{
    uint32_t v;
    kb_wire_get(r, &v, sizeof v);
    return v;
}
/* 1 while every read so far was inside the bytes. */
static inline int kb_wire_rd_ok(const kb_wire_rd *r) { return !r->bad; }
/* 1 when every byte has been read. */
static inline int kb_wire_rd_done(const kb_wire_rd *r) { return r->at == r->n; }

#endif
