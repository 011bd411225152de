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

/*
 * X(name, value, lower-case name, description). A code names a kind of failure that any layer
 * may report; what is particular to one layer (which IPCQ direction, which key) goes in the
 * message, so no code here belongs to a layer above. Values are stable (programs and saved
 * sweep rows hold them): a retired code leaves its value unused (-14).
 */
#define KB_ERR_TABLE(X)                                                                \
    X(OK,          0,   "ok",          "success")                                      \
    X(NOMEM,       -1,  "nomem",       "out of host memory")                           \
    X(INVAL,       -2,  "inval",       "invalid argument")                             \
    X(CONFIG,      -3,  "config",      "configuration error")                          \
    X(RANGE,       -4,  "range",       "value out of range")                           \
    X(NOSPACE,     -5,  "nospace",     "simulated memory exhausted")                   \
    X(NOTFOUND,    -6,  "notfound",    "not found")                                    \
    X(DEADLOCK,    -7,  "deadlock",    "deadlock: fibers wait and no event is pending") \
    X(IO,          -8,  "io",          "I/O error")                                    \
    X(DEVICE,      -9,  "device",      "compute device error")                         \
    X(UNSUPPORTED, -10, "unsupported", "not supported")                                \
    X(VERIFY,      -11, "verify",      "verification failed")                          \
    X(STATE,       -12, "state",       "invalid state for this call")                  \
    X(UNWIRED,     -13, "unwired",     "no link or queue wired in that direction")     \
    X(USAGE,       -15, "usage",       "usage error")

enum {
#define KB_ERR_ENUM_(name, value, lname, desc) KB_ERR_##name = (value),
    KB_ERR_TABLE(KB_ERR_ENUM_)
#undef KB_ERR_ENUM_
    KB_ERR_MIN_ = -15 /* the lowest code; not every value above it is one (the holes above) */
};

/*
 * KB_API marks the functions of this layer that plugins may call. kb_sched is compiled with
 * hidden visibility: the event engine is kbcl's internal machinery, which the kbcl executable
 * does not export to plugins (docs/plugins.md), so link-time optimisation keeps inlining its
 * hot paths into the layers above as it did before kbcl exported its symbols. The error
 * functions below are what plugins need of it.
 */
#if defined(__GNUC__)
#define KB_API __attribute__((visibility("default")))
#else
#define KB_API
#endif

/* Name of an error code ("simulated memory exhausted"); never NULL. */
KB_API const char *kb_strerror(int code);
/* The code's short lower-case name ("nospace"), or NULL when it is no code. */
KB_API const char *kb_err_name(int code);

/* Caller-owned buffer for the detailed message of the last failure. */
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
 * one; the same C, so the same results. Not in sanitizer builds. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__)
#define KB_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KB_VECTOR_CLONES
#endif

typedef struct kb_errbuf {
    char msg[768];
} kb_errbuf;

/*
 * Writes a printf-style message into `eb` (which may be NULL: the message is dropped) and
 * returns `code`, so that failing paths read `return kb_err_set(eb, KB_ERR_RANGE, "...")`.
 * An existing message is replaced.
 */
KB_API int kb_err_set(kb_errbuf *eb, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/*
 * Returns KB_ERR_NOMEM with the message "WHAT: N bytes (X MiB) could not be allocated", WHAT
 * being the printf-style rest: an out-of-memory error says how much was asked for and what
 * for, so that the user can tell a size too large for the host from a leak.
 */
KB_API int kb_err_nomem(kb_errbuf *eb, unsigned long long bytes, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Prepends "prefix: " to the message already in `eb` (for adding context on the way up). */
KB_API void kb_err_prefix(kb_errbuf *eb, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
