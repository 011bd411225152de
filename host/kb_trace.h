/*
 * kb_trace — a timeline of a run in the Chrome trace-event format (Perfetto, chrome://tracing).
 *
 * While a trace is attached to a context (kb_ctx_opts.trace_rec) the runtime records:
 *  - one complete event per data operation on the thread of the PE that issued it (name: the
 *    operation, e.g. "copy", "add", "gemm", "ipcq send E"; args: bytes), and host writes on a
 *    "host" thread;
 *  - one complete event per kernel (its whole run) on its PE's thread;
 *  - one complete event per resource reservation of every DMA on a thread per link or memory
 *    port ("sip0/cube5 ucie E", "sip0/cube0/pe3 hbm", "sip0->sip1 link" ...), spanning the
 *    time that resource is occupied.
 * Processes are SIPs ("SIP 0", ...); threads are PEs (tid = cube * PEs + PE + 1) and links
 * (tid >= 100000). Times are microseconds with picosecond resolution. Events are kept in
 * memory (about 48 bytes each) and written once at the end, each through cJSON.
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

/* An event on a PE's thread (pe < 0: the SIP's host thread). `name` must outlive the trace
 * (a string literal or a name owned by a longer-lived object). */
void kb_trace_pe(kb_trace *t, unsigned gsip, unsigned cube, int pe, const char *name,
                 kb_time t0, kb_time t1, uint64_t bytes);
/* A copy of `name` owned by the trace (one per distinct string), for names that do not
 * outlive the run (a kernel's name lives in its launch). NULL when out of memory. */
const char *kb_trace_intern(kb_trace *t, const char *name);

/* A reservation [t0, t1) of a resource of the machine. */
void kb_trace_res(kb_trace *t, const kb_res *r, kb_time t0, kb_time t1, uint64_t bytes);

size_t kb_trace_events(const kb_trace *t);
/* Writes {"traceEvents": [...], "displayTimeUnit": "ns"} atomically to path. */
int kb_trace_write(kb_trace *t, const char *path, kb_errbuf *eb);

#endif
