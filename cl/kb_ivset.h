/*
 * kb_ivset — a set of byte addresses kept as sorted, disjoint, non-adjacent half-open
 * intervals [lo, hi). The memory store tracks with it which bytes are newer on the device
 * and which the host changed (kb_memstore.h).
 *
 * Adding merges with the neighbours an interval overlaps or touches; removing splits. Both
 * are a binary search plus a shift of the array tail, so a set of k intervals costs
 * O(log k + k) per change at worst; kb_ivset_add_sorted merges a sorted batch in one pass.
 * Limits: single-threaded; an interval must not wrap around the 64-bit address space.
 */
#ifndef KB_IVSET_H
#define KB_IVSET_H

#include <stddef.h>
#include <stdint.h>

typedef struct kb_range {
    uint64_t lo, hi; /* [lo, hi), lo < hi */
} kb_range;

typedef struct kb_ivset {
    kb_range *v; /* n intervals, sorted, disjoint, non-adjacent */
    size_t n, cap;
    uint64_t bytes; /* sum of the lengths */
} kb_ivset;

void kb_ivset_init(kb_ivset *s);
void kb_ivset_free(kb_ivset *s); /* leaves an empty set */
void kb_ivset_clear(kb_ivset *s);

/* Room for `extra` more intervals: the next `extra` single adds or removes cannot fail. */
int kb_ivset_reserve(kb_ivset *s, size_t extra);
/* Adds [lo, hi) (no-op when lo >= hi). KB_ERR_NOMEM leaves the set unchanged. */
int kb_ivset_add(kb_ivset *s, uint64_t lo, uint64_t hi);
/* Adds r[0..k), sorted by lo (they may overlap or touch). KB_ERR_NOMEM leaves the set
 * unchanged. */
int kb_ivset_add_sorted(kb_ivset *s, const kb_range *r, size_t k);
/* Removes [lo, hi). KB_ERR_NOMEM (splitting one interval in two) leaves the set unchanged. */
int kb_ivset_remove(kb_ivset *s, uint64_t lo, uint64_t hi);
/* Index of the first interval that ends after addr (n when none). */
size_t kb_ivset_find(const kb_ivset *s, uint64_t addr);
/* 1 if some byte of [lo, hi) is in the set. */
int kb_ivset_overlaps(const kb_ivset *s, uint64_t lo, uint64_t hi);

#endif
