/*
 * kb_par — the one fork-join shape kbcl's host-side bulk work uses (large checks, digests, the
 * host gemm reference): n work items, each run once by fn, items 1 .. n-1 on threads of their
 * own and item 0 on the caller's, all finished when kb_par_run returns. An item whose thread
 * cannot be started runs on the caller's thread after item 0, so the work is always done and
 * the result never depends on how many threads there were. Limits: a thread per item (callers
 * keep n near the CPU count, at most KB_PAR_MAX); no pool: each call starts its threads
 * (~50 us each), so it is for work of milliseconds and more.
 */
#ifndef KB_PAR_H
#define KB_PAR_H

#include <stddef.h>

#define KB_PAR_MAX 64

/* fn(items + i * size) for i in [0, n), n <= KB_PAR_MAX (more are run n at a time). */
void kb_par_run(void *(*fn)(void *), void *items, size_t size, size_t n);

#endif
