/*
 * kb_ivset — sorted disjoint intervals (kb_ivset.h): a growable array; every change finds its
 * place by binary search and splices.
 */
#include "kb_ivset.h"

#include <stdlib.h>
#include <string.h>

#include "kb_err.h"

void kb_ivset_init(kb_ivset *s)
{
    memset(s, 0, sizeof *s);
}

void kb_ivset_free(kb_ivset *s)
{
    free(s->v);
    kb_ivset_init(s);
}

void kb_ivset_clear(kb_ivset *s)
{
    s->n = 0;
    s->bytes = 0;
}

static int reserve(kb_ivset *s, size_t need)
{
    if (need <= s->cap)
        return 0;
    size_t c = s->cap ? s->cap : 16;
    while (c < need)
        c *= 2;
    kb_range *v = realloc(s->v, c * sizeof *v);
    if (!v)
        return KB_ERR_NOMEM;
    s->v = v;
    s->cap = c;
    return 0;
}

int kb_ivset_reserve(kb_ivset *s, size_t extra)
{
    return reserve(s, s->n + extra);
}

size_t kb_ivset_find(const kb_ivset *s, uint64_t addr)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].hi <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int kb_ivset_overlaps(const kb_ivset *s, uint64_t lo, uint64_t hi)
{
    size_t i = kb_ivset_find(s, lo);
    return lo < hi && i < s->n && s->v[i].lo < hi;
}

int kb_ivset_add(kb_ivset *s, uint64_t lo, uint64_t hi)
{
    if (lo >= hi)
        return 0;
    /* First interval that ends at or after lo (touching counts), last that starts at or
     * before hi: [i, j) merge with the new one. */
    size_t i = lo > 0 ? kb_ivset_find(s, lo - 1) : 0, j = i;
    while (j < s->n && s->v[j].lo <= hi)
        j++;
    if (i == j) {
        if (reserve(s, s->n + 1) != 0)
            return KB_ERR_NOMEM;
        memmove(s->v + i + 1, s->v + i, (s->n - i) * sizeof *s->v);
        s->v[i].lo = lo;
        s->v[i].hi = hi;
        s->n++;
        s->bytes += hi - lo;
        return 0;
    }
    uint64_t nlo = s->v[i].lo < lo ? s->v[i].lo : lo;
    uint64_t nhi = s->v[j - 1].hi > hi ? s->v[j - 1].hi : hi;
    for (size_t k = i; k < j; k++)
        s->bytes -= s->v[k].hi - s->v[k].lo;
    s->v[i].lo = nlo;
    s->v[i].hi = nhi;
    s->bytes += nhi - nlo;
    memmove(s->v + i + 1, s->v + j, (s->n - j) * sizeof *s->v);
    s->n -= j - i - 1;
    return 0;
}

int kb_ivset_add_sorted(kb_ivset *s, const kb_range *r, size_t k)
{
    if (k == 0)
        return 0;
    size_t alloc = s->n + k, a = 0, b = 0, m = 0;
    kb_range *out = malloc(alloc * sizeof *out);
    uint64_t bytes = 0;

    if (!out)
        return KB_ERR_NOMEM;
    while (a < s->n || b < k) {
        kb_range x;
        if (b == k || (a < s->n && s->v[a].lo <= r[b].lo))
            x = s->v[a++];
        else
            x = r[b++];
        if (x.lo >= x.hi)
            continue;
        if (m > 0 && x.lo <= out[m - 1].hi) {
            if (x.hi > out[m - 1].hi)
                out[m - 1].hi = x.hi;
        } else {
            out[m++] = x;
        }
    }
    for (size_t i = 0; i < m; i++)
        bytes += out[i].hi - out[i].lo;
    free(s->v);
    s->v = out;
    s->n = m;
    s->cap = alloc;
    s->bytes = bytes;
    return 0;
}

int kb_ivset_remove(kb_ivset *s, uint64_t lo, uint64_t hi)
{
    if (lo >= hi)
        return 0;
    size_t i = kb_ivset_find(s, lo);
    if (i == s->n || s->v[i].lo >= hi)
        return 0;
    /* One interval strictly around [lo, hi): split it. */
    if (s->v[i].lo < lo && s->v[i].hi > hi) {
        if (reserve(s, s->n + 1) != 0)
            return KB_ERR_NOMEM;
        memmove(s->v + i + 1, s->v + i, (s->n - i) * sizeof *s->v);
        s->v[i].hi = lo;
        s->v[i + 1].lo = hi;
        s->n++;
        s->bytes -= hi - lo;
        return 0;
    }
    size_t j = i;
    if (s->v[i].lo < lo) { /* keep its head */
        s->bytes -= s->v[i].hi - lo;
        s->v[i].hi = lo;
        i++;
        j = i;
    }
    while (j < s->n && s->v[j].hi <= hi) { /* wholly inside: dropped */
        s->bytes -= s->v[j].hi - s->v[j].lo;
        j++;
    }
    if (j < s->n && s->v[j].lo < hi) { /* keep its tail */
        s->bytes -= hi - s->v[j].lo;
        s->v[j].lo = hi;
    }
    memmove(s->v + i, s->v + j, (s->n - j) * sizeof *s->v);
    s->n -= j - i;
    return 0;
}
