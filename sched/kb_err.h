/*
 * kb_err — the one error-code table of kbcl.
 *
 * Every library function that can fail returns an int: 0 on success or one of the negative
 * KB_ERR_* codes below. kb_strerror() names a code. Detailed, human-readable messages (the
 * file:line of a config error, the PE and direction of an IPCQ misuse) travel separately in a
 * caller-owned kb_errbuf that the failing function fills with kb_err_set(). Library code never
 * prints and never exits; only kbcl's main decides what to print and which exit status to use.
 */
#ifndef KB_ERR_H
#define KB_ERR_H

#include <stddef.h>

#include "kbcl_base.h"

/*
 * Keeps a rarely taken path (an error message, a cache miss) out of its caller, so that the
 * caller's stack frame stays small: kernel fibers resume on cold stacks, and every frame line
 * they touch is a cache miss.
 */
#if defined(__GNUC__)
#define KB_NOINLINE __attribute__((noinline))
#define KB_COLD __attribute__((noinline, cold))
/* The opposite, for a hot helper with several call sites that the compiler would keep out of
 * line (IPCQ's send of one chunk: its one-slot call site must stay the old inline path). */
#define KB_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define KB_NOINLINE
#define KB_COLD
#define KB_ALWAYS_INLINE inline
#endif
/* Bulk loops over host data that gain from wider vectors (conversions, input generation): on
 * x86-64 with GCC, an AVX2 copy chosen when the program loads (ifunc) beside the baseline
 * one; the same C, so the same results. Not in sanitizer builds (their runtimes are not up when
 * the resolvers run). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define KB_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KB_VECTOR_CLONES
#endif

#endif
