/*
 * kb_bigmem — see kb_bigmem.h. Every buffer carries a 64-byte header just before the pointer
 * handed out, saying how it was obtained, so that one free function serves both kinds and the
 * data keeps 64-byte alignment.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include "kb_bigmem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KB_HDR_ 64u
#define KB_HUGE_PAGE_ ((size_t)2 << 20)

typedef struct hdr {
    void *base;    /* what to free / unmap */
    size_t len;    /* mapping length; 0 = from calloc */
} hdr;

void *kb_bigmem_alloc(size_t bytes)
{
    unsigned char *p;
    hdr *h;

    if (bytes > SIZE_MAX - KB_HDR_ - 2 * KB_HUGE_PAGE_)
        return NULL;
    if (bytes < KB_BIGMEM_HUGE) {
        void *base = NULL;
        if (posix_memalign(&base, KB_HDR_, KB_HDR_ + bytes) != 0)
            return NULL;
        p = (unsigned char *)base + KB_HDR_;
        memset(p, 0, bytes); /* calloc has no aligned variant */
        h = (hdr *)base;
        h->base = base;
        h->len = 0;
        return p;
    }
    /* Over-map by one huge page to place the buffer's header on a 2 MiB boundary, then give
     * back the slack at both ends. */
    size_t len = (KB_HDR_ + bytes + KB_HUGE_PAGE_ - 1) & ~(KB_HUGE_PAGE_ - 1);
    unsigned char *m = mmap(NULL, len + KB_HUGE_PAGE_, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uintptr_t a = ((uintptr_t)m + KB_HUGE_PAGE_ - 1) & ~(uintptr_t)(KB_HUGE_PAGE_ - 1);
    unsigned char *al = (unsigned char *)a;
    if (al > m)
        munmap(m, (size_t)(al - m));
    if (al + len < m + len + KB_HUGE_PAGE_)
        munmap(al + len, (size_t)(m + len + KB_HUGE_PAGE_ - (al + len)));
#ifdef MADV_HUGEPAGE
    (void)madvise(al, len, MADV_HUGEPAGE); /* a hint: failure only costs speed */
#endif
    h = (hdr *)al;
    h->base = al;
    h->len = len;
    return al + KB_HDR_;
}

void kb_bigmem_free(void *p)
{
    if (!p)
        return;
    hdr *h = (hdr *)((unsigned char *)p - KB_HDR_);
    if (h->len)
        munmap(h->base, h->len);
    else
        free(h->base);
}
