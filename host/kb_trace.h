/*
 * kb_trace — a timeline of a run in the Chrome trace-event format (Perfetto, chrome://tracing).
 *
 * While a trace is attached to a context (kb_ctx_opts.trace_rec) the runtime records, each
 * event in one category (the event's "cat"):
 *  - kernel: one complete event per kernel (its whole run) on its PE's thread;
 *  - dma, ipcq, compute: one complete event per data operation on the thread of the PE that
 *    issued it (name: the operation, e.g. "copy", "add", "gemm", "ipcq send E"; args: bytes),
 *    and host writes on a "host" thread: copies, fills and generated test data are dma, IPCQ
 *    sends and receives ipcq, every other operation (math, gemm, reductions ...) compute;
 *  - res: one complete event per resource reservation of every DMA on a thread per link or
 *    memory port ("sip0/cube5 ucie E", "sip0/cube0/pe3 hbm", "sip0->sip1 link" ...), spanning
 *    the time that resource is occupied.
 * Processes are SIPs ("SIP 0", ...); threads are PEs (tid = cube * PEs + PE + 1) and links
 * (tid >= 100000). Times are microseconds with picosecond resolution. Events are kept in
 * memory (about 48 bytes each) and written once at the end, each through cJSON.
 *
 * A full trace of a large run is large (the default 16-byte all-reduce on 256 PEs: docs/
 * performance.md): a filter (categories and places) and a window of simulated time, set
 * before the run, decide at recording time which events are kept, so that what is left out
 * takes neither memory nor file space.
 */
#ifndef KB_TRACE_H
#define KB_TRACE_H

#include <stdint.h>

#include "kb_err.h"
#include "kb_res.h"
#include "kb_time.h"

typedef struct kb_trace kb_trace;
struct kb_machine;

int kb_trace_create(kb_trace **out, kb_errbuf *eb);
void kb_trace_destroy(kb_trace *t); /* NULL is a no-op */

/* Names threads of links / ports; set by the runtime when the trace is attached. */
void kb_trace_set_machine(kb_trace *t, const struct kb_machine *m);

typedef enum kb_trace_cat {
    KB_TRACE_KERNEL = 0, /* a kernel's whole run */
    KB_TRACE_DMA,        /* copies, fills, generated test data, host writes */
    KB_TRACE_IPCQ,       /* IPCQ sends and receives */
    KB_TRACE_COMPUTE,    /* every other data operation */
    KB_TRACE_RES,        /* a resource reservation */
    KB_TRACE_NCATS
} kb_trace_cat;

/* The category's name in filters and in the events' "cat": kernel, dma, ipcq, compute, res. */
const char *kb_trace_cat_name(kb_trace_cat c);

/*
 * Keeps only the events that match spec, a comma-separated list of terms: category names
 * (kb_trace_cat_name) and places "sipR[/cubeR[/peR]]", R being a number N, a range N-M or *
 * (levels left out are any: "sip0/cube1" is every PE and resource of that cube). An event
 * is kept when it is in one of the categories named (any, if none is) and at one of the
 * places named (any, if none is); a resource is at the SIP, cube and PE its name starts with
 * ("sip0->sip1 link" is SIP 0's, "sip0/cube5 ucie E" cube 5's), a host thread at its SIP only.
 * Call before the run. 0, or KB_ERR_USAGE with the offending term and the grammar in eb.
 */
int kb_trace_set_filter(kb_trace *t, const char *spec, kb_errbuf *eb);
/* Keeps only the events that overlap simulated time [t0, t1) (an instant event: t0 <= it <
 * t1). Call before the run. */
void kb_trace_set_window(kb_trace *t, kb_time t0, kb_time t1);

/* An event of category cat on a PE's thread (pe < 0: the SIP's host thread). `name` must
 * outlive the trace (a string literal or a name owned by a longer-lived object). */
void kb_trace_pe(kb_trace *t, kb_trace_cat cat, unsigned gsip, unsigned cube, int pe,
                 const char *name, kb_time t0, kb_time t1, uint64_t bytes);
/* A copy of `name` owned by the trace (one per distinct string), for names that do not
 * outlive the run (a kernel's name lives in its launch). NULL when out of memory. */
const char *kb_trace_intern(kb_trace *t, const char *name);

/* A reservation [t0, t1) of a resource of the machine. */
void kb_trace_res(kb_trace *t, const kb_res *r, kb_time t0, kb_time t1, uint64_t bytes);

/* The events kept, and all those offered (kept or left out by the filter and window). */
size_t kb_trace_events(const kb_trace *t);
size_t kb_trace_events_offered(const kb_trace *t);
/* Writes {"traceEvents": [...], "displayTimeUnit": "ns"} atomically to path. */
int kb_trace_write(kb_trace *t, const char *path, kb_errbuf *eb);
/* The size in bytes of the file the last kb_trace_write wrote (0 before one). */
uint64_t kb_trace_bytes(const kb_trace *t);

#endif
