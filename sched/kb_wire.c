/*
 * kb_wire — byte buffers between the processes of a distributed run (kb_wire.h).
 */
#include "kb_wire.h"

#include <stdlib.h>
#include <string.h>

#include "kb_err.h"

void kb_wire_init(kb_wire *w) { memset(w, 0, sizeof *w); }

void kb_wire_free(kb_wire *w)
{
    if (!w)
        return;
    free(w->p);
    memset(w, 0, sizeof *w);
}

void kb_wire_put(kb_wire *w, const void *src, size_t n)
{
    if (w->oom || n == 0) /* nothing: src may be NULL, and so may the buffer be */
        return;
    if (n > w->cap - w->n) {
        size_t c = w->cap ? w->cap : 256;
        while (c - w->n < n) {
            if (c > SIZE_MAX / 2) {
                w->oom = 1;
                return;
            }
            c *= 2;
        }
        uint8_t *p = realloc(w->p, c);
        if (!p) {
            w->oom = 1;
            return;
        }
        w->p = p;
        w->cap = c;
    }
    if (src)
        memcpy(w->p + w->n, src, n);
    else
        memset(w->p + w->n, 0, n);
    w->n += n;
}

int kb_wire_ok(const kb_wire *w) { return w->oom ? KB_ERR_NOMEM : 0; }

void kb_wire_rd_init(kb_wire_rd *r, const void *p, size_t n)
{
    r->p = p;
    r->n = n;
    r->at = 0;
    r->bad = 0;
}

void kb_wire_get(kb_wire_rd *r, void *dst, size_t n)
{
    if (n == 0) /* dst may be NULL (an empty array) */
        return;
    if (r->bad || n > r->n - r->at) {
        r->bad = 1;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, r->p + r->at, n);
    r->at += n;
}
