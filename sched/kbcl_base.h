/*
 * kbcl_base — the base of kbcl's public API (docs/api.md): error codes and messages, and
 * simulated time. Every public header includes it.
 *
 * Every kbcl function that can fail returns an int: 0 on success or one of the negative
 * KB_ERR_* codes below; kb_strerror() names a code. The detailed, human-readable message (the
 * file:line of a configuration error, the PE and direction of an IPCQ misuse) travels in a
 * caller-owned kb_errbuf that the failing function fills with kb_err_set(). Library code never
 * prints and never exits: the program that embeds kbcl decides what to print and which exit
 * status to use.
 *
 * Simulated time is an integer count of picoseconds (kb_time), the same on every machine.
 * Limits: a message is at most 767 bytes (longer ones are cut).
 */
#ifndef KBCL_BASE_H
#define KBCL_BASE_H

#include <stddef.h>
#include <stdint.h>

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
    X(USAGE,       -15, "usage",       "usage error")                                  \
    X(NOFIT,       -16, "nofit",       "the run does not fit the device's memory")

enum {
#define KB_ERR_ENUM_(name, value, lname, desc) KB_ERR_##name = (value),
    KB_ERR_TABLE(KB_ERR_ENUM_)
#undef KB_ERR_ENUM_
    KB_ERR_MIN_ = -16 /* the lowest code; not every value above it is one (the holes above) */
};

/*
 * KB_API marks kbcl's public functions: the ones declared in the public headers (kbcl_*.h,
 * the only headers `cmake --install` puts into include/kbcl). Every kbcl library is compiled
 * with hidden visibility, so the kbcl executable exports exactly these to the plugins it
 * loads, and link-time optimisation stays free to inline and internalise everything else
 * (the event engine's hot paths above all).
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


/* ---- registry entries ---- */

/*
 * The head of every entry a plugin registers (a collective algorithm, a bench): the entry's
 * size and version as the plugin was compiled, so that kbcl loads an entry built against
 * an older kbcl or refuses it by name, instead of reading a struct of another layout. A
 * plugin fills it with the entry type's KB_*_HEAD macro (KB_CCL_ALGO_HEAD, KB_DIST_ALGO_HEAD,
 * KB_BENCH_HEAD) in a designated initialiser; kbcl's own tables leave it zero. The rule
 * (docs/plugins.md §7): a field appended to an entry keeps its version, and kbcl reads the
 * fields past an older plugin's size as zero (each such field says what zero means); any
 * other change raises the version, and kbcl converts every version it still knows.
 */
typedef struct kb_entry_head {
    uint32_t size;     /* sizeof the entry type the plugin was compiled with */
    uint32_t version;  /* the entry type's version then; 0 = no head (refused) */
} kb_entry_head;

/* ---- simulated time ---- */

typedef int64_t kb_time; /* picoseconds (about 106 days fit) */

#define KB_PS_PER_NS INT64_C(1000)
#define KB_TIME_MAX INT64_MAX

static inline kb_time kb_ns(int64_t ns) { return ns * KB_PS_PER_NS; }
/* For reports only (never fed back into the engine, which has no floating-point time). */
static inline double kb_time_to_ns(kb_time t) { return (double)t / 1000.0; }
static inline double kb_time_to_us(kb_time t) { return (double)t / 1.0e6; }

#endif
