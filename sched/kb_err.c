/* kb_err — error names and message buffers (see kb_err.h). */
#include "kb_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *kb_strerror(int code)
{
    switch (code) {
#define KB_ERR_CASE_(name, value, lname, desc) case (value): return (desc);
        KB_ERR_TABLE(KB_ERR_CASE_)
#undef KB_ERR_CASE_
    default:
        return "unknown error";
    }
}

const char *kb_err_name(int code)
{
    switch (code) {
#define KB_ERR_CASE_(name, value, lname, desc) case (value): return (lname);
        KB_ERR_TABLE(KB_ERR_CASE_)
#undef KB_ERR_CASE_
    default:
        return NULL;
    }
}

int kb_err_set(kb_errbuf *eb, int code, const char *fmt, ...)
{
    if (eb) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

int kb_err_nomem(kb_errbuf *eb, unsigned long long bytes, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    if (!eb)
        return KB_ERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kb_err_set(eb, KB_ERR_NOMEM, "%s: %llu bytes (%.1f MiB) could not be allocated", what,
                      bytes, (double)bytes / 1048576.0);
}

void kb_err_prefix(kb_errbuf *eb, const char *fmt, ...)
{
    char head[256];
    size_t cap, hl, ol;
    va_list ap;

    if (!eb)
        return;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    /* result = head ": " old, truncated to the buffer; built by hand so nothing overlaps */
    cap = sizeof eb->msg - 1;
    hl = strlen(head);
    if (hl + 2 > cap)
        hl = cap - 2;
    ol = strnlen(eb->msg, cap);
    if (hl + 2 + ol > cap)
        ol = cap - hl - 2;
    memmove(eb->msg + hl + 2, eb->msg, ol);
    memcpy(eb->msg, head, hl);
    eb->msg[hl] = ':';
    eb->msg[hl + 1] = ' ';
    eb->msg[hl + 2 + ol] = '\0';
}
