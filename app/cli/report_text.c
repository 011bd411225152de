/*
 * report_text.c — the text buffer `kbcl report` writes its page into: printf-style appends,
 * raw bytes, and HTML/XML escaping, growing by doubling so that a page of many rows costs
 * appends linear in its size. A failed allocation is remembered (rp_buf.oom) rather than
 * reported per call: the page checks once when it is done. Limits: the text holds no NUL of
 * its own (rp_buf.s is a C string).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_report_int.h"

void rp_printf(rp_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;
    if (b->oom)
        return;
    va_start(ap, fmt);
    n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if (!b->s || b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *s;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        if (!(s = realloc(b->s, cap))) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
        va_start(ap, fmt);
        vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* Appends n bytes of s. */
void rp_putn(rp_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *p;
        while (cap < b->len + n + 1)
            cap *= 2;
        if (!(p = realloc(b->s, cap))) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

void rp_puts(rp_buf *b, const char *s)
{
    rp_putn(b, s, strlen(s));
}

/* HTML/XML-escaped text: runs of plain characters in one copy (the rows table escapes every
 * cell of every row). */
void rp_esc(rp_buf *b, const char *s)
{
    for (;;) {
        size_t n = strcspn(s, "&<>\"");
        rp_putn(b, s, n);
        s += n;
        switch (*s) {
        case '&': rp_puts(b, "&amp;"); break;
        case '<': rp_puts(b, "&lt;"); break;
        case '>': rp_puts(b, "&gt;"); break;
        case '"': rp_puts(b, "&quot;"); break;
        default: return;
        }
        s++;
    }
}
