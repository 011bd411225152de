/*
 * kb_devd — the device server: one long-lived process that holds a Phase-2 device (its
 * OpenCL context and built program) and lends it to short-lived kbcl processes over a Unix
 * socket, so that a run on a GPU does not pay the driver's per-process set-up (~0.25 s for an
 * NVIDIA context, more than many whole runs take with the reference backend).
 *
 * Each connection gets a session: a device-resident backend of its own (for OpenCL, a clone
 * that shares the server's context and program but has its own queue, kernels and buffers),
 * made by the caller's session function and destroyed when the client disconnects. The
 * client side is kb_remote.h; it keeps the resident bookkeeping (kb_resident) and sends the
 * device primitives (arena, copy, fill, upload, download, payload, query) and, once per
 * flush, the flush's batches. Every request is answered (status, error text, data) before the next is
 * read, so a session is strictly sequential; sessions run in threads of their own.
 *
 * The wire protocol (requests, headers, the HELLO reply) and what both sides use of the
 * socket (its folder and its check, whole-message I/O, descriptor passing) are
 * kb_devd_proto.h, so the server and its client depend on that file, not on each other.
 *
 * The op log's payload (host input bytes) is a memfd the client passes once: the server maps
 * it and uploads from its mapping; host reads land in a staging memfd of the client's that the
 * server writes into. So no simulated data crosses the socket.
 *
 * Trust: the socket's folder is the user's own (0700, owned by the server's uid: checked by
 * kb_devd_dir_check on both sides), the server refuses a peer of another uid (SO_PEERCRED on
 * accept) and the client a server of another uid. Peers of the same uid are not trusted to be
 * well-formed: a request's data is at most KB_DEVD_MAX_MSG bytes, checked before anything is
 * allocated; every range, record and query is checked against the session's arena and payload
 * before it reaches the device (kb_rec_check_placed); shared files must be sealed against
 * shrinking (F_SEAL_SHRINK) and as long as claimed. A malformed request (unknown op or flags,
 * lengths that do not add up, a request before HELLO, bad magic) is answered with an error
 * and its connection closed; a connection that stops in the middle of a message, or sends no
 * first one, for io_timeout_s is closed; each connection is held to rate_hz requests per
 * second (it is slowed down, not refused).
 *
 * Limits: clients must be the same kbcl build (the records travel as raw structs; the hello
 * checks the protocol version and the struct sizes); one machine (a Unix socket); a payload
 * that is not a shared file is copied, and the server then keeps a copy of it (the payload
 * primitive needs the whole area); the server buffers one request at a time per session (at
 * most KB_DEVD_MAX_MSG bytes: the client splits larger transfers and flushes); at most
 * KB_DEVD_MAX_SESSIONS sessions at once.
 */
#ifndef KB_DEVD_H
#define KB_DEVD_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "kb_devd_proto.h"
#include "kb_err.h"
#include "kb_opencl.h"
#include "kb_replay.h"

#define KB_DEVD_MAX_SESSIONS 256
#define KB_DEVD_POOL 4
#define KB_DEVD_RATE_HZ 20000.0    /* requests per second per connection (and its burst) */
#define KB_DEVD_IO_TIMEOUT_S 10.0  /* a stalled message, or no first one: closed */

/* A new device-resident backend for a session. Owner of *out: the server (ops->destroy). */
typedef int (*kb_devd_session_fn)(void *arg, kb_backend *out, char *desc, size_t desc_n,
                                  kb_errbuf *eb);

typedef struct kb_devd_opts {
    const char *path;              /* the socket to listen on (made; removed on return) */
    const char *device;            /* the device name served (gpu, cpu, auto) */
    const char *desc;              /* the device, as kbcl run prints it */
    const kb_opencl_setup *setup;  /* the server's own set-up; NULL: none */
    kb_devd_session_fn session;
    void *arg;
    /* Optional: makes a finished session's backend fit for another session (0) or says it
     * is not (then it is destroyed). Up to KB_DEVD_POOL such backends wait for the next. */
    int (*recycle)(void *arg, kb_backend *be);
    double idle_exit_s;            /* return after this long without sessions; 0: never */
    volatile sig_atomic_t *stop;   /* return once *stop is set (a signal handler's flag) */
    int ready_fd;                  /* >= 0: written one byte, then closed, once listening */
    /* Optional (0 / NULL: the defaults) */
    uint64_t max_bytes;            /* a session's arena and payload, at most (0: the device's
                                      own limit) */
    double io_timeout_s;           /* KB_DEVD_IO_TIMEOUT_S */
    double rate_hz;                /* KB_DEVD_RATE_HZ */
    /* A line about a refused peer or a connection closed for a malformed request (called from
     * any thread; no newline). NULL: not said. */
    void (*log)(void *arg, const char *line);
} kb_devd_opts;

/* Serves until *stop, a SHUTDOWN request or the idle time; waits for open sessions to end
 * (their sockets are shut down). 0, or the error that kept it from listening (an unsafe
 * folder: KB_ERR_STATE, see kb_devd_dir_check). */
int kb_devd_serve(const kb_devd_opts *o, kb_errbuf *eb);

/* Serves one connection, fd (not closed here), in this thread, as a session of the server
 * of o would (its path, ready_fd, stop and idle time unused; no peer check): what the
 * protocol's fuzz target drives. 0 when the peer ended it, KB_ERR_INVAL when it was closed
 * for a malformed request or a stall (why in eb). */
int kb_devd_serve_conn(const kb_devd_opts *o, int fd, kb_errbuf *eb);

#endif
