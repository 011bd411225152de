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

#include "kb_err.h"
#include "kb_opencl.h"
#include "kb_replay.h"

#define KB_DEVD_PROTO 3
#define KB_DEVD_MAGIC 0x6b62646576643031ULL /* "kbdevd01" */
#define KB_DEVD_MAX_SESSIONS 256
#define KB_DEVD_POOL 4
/* A request's data, and a download's reply data, at most (64 MiB): 256 sessions can make the
 * server buffer 16 GiB at worst, and a round trip per 64 MiB costs nothing next to the copy. */
#define KB_DEVD_MAX_MSG ((uint64_t)64 << 20)
#define KB_DEVD_RATE_HZ 20000.0    /* requests per second per connection (and its burst) */
#define KB_DEVD_IO_TIMEOUT_S 10.0  /* a stalled message, or no first one: closed */

/* Requests. */
enum {
    KB_DEVD_HELLO = 1,  /* a = magic, b = proto, c = sizeof(kb_rec); flags 1: open a session */
    KB_DEVD_ARENA,      /* a = bytes, b = moves; data: kb_move[b] */
    KB_DEVD_COPY,       /* a = to, b = from, c = n */
    KB_DEVD_FILL,       /* a = off, b = n, c = byte */
    KB_DEVD_UPLOAD,     /* a = off; data: the bytes */
    KB_DEVD_DOWNLOAD,   /* a = off, b = n; reply data: the bytes; or, with flags
                           KB_DEVD_SHARED, no reply data: the bytes are written at the start
                           of the client's staging file (passed with this or an earlier
                           shared DOWNLOAD) */
    KB_DEVD_PAYLOAD,    /* a = size, b = have; data: payload bytes [have, size); or, with
                           flags KB_DEVD_SHARED, no data: the bytes are in the shared-memory
                           file the client passed (SCM_RIGHTS, with this or an earlier
                           PAYLOAD), which the server maps instead of receiving a copy */
    KB_DEVD_FLUSH,      /* a = arena bytes, b = batches; data: uint64 counts[b], then kb_rec[];
                           flags KB_DEVD_MORE: a part of a flush larger than KB_DEVD_MAX_MSG,
                           more parts (same a) follow and only the last one is answered */
    KB_DEVD_SHUTDOWN,   /* the server stops accepting and exits once its sessions end */
    KB_DEVD_QUERY,      /* data: a kb_vquery, then uint64 off[ntiles]; reply data: its result
                           (kb_vquery.h, kb_vquery_result_size bytes) */
};

#define KB_DEVD_SHARED 2u /* PAYLOAD and DOWNLOAD flag */
#define KB_DEVD_MORE 4u   /* FLUSH flag */

/* A request header; `len` bytes of data follow. */
typedef struct kb_devd_msg {
    uint32_t op, flags;
    uint64_t a, b, c, len;
} kb_devd_msg;

/* A reply header: `msglen` bytes of error text (rc != 0), then `len` bytes of data. FLUSH
 * replies carry the session's launches in a and its kernel time (ms, a double's bits) in b. */
typedef struct kb_devd_rep {
    int32_t rc;
    uint32_t msglen;
    uint64_t a, b, len;
} kb_devd_rep;

/* The HELLO reply's data. */
typedef struct kb_devd_hello {
    uint32_t proto, rec_size;
    int32_t pid;
    uint32_t sessions;       /* sessions open, this one included */
    double uptime_s;
    double session_ms;       /* making this session's backend (0 without one) */
    kb_opencl_setup setup;   /* the server's own set-up (context, program cache) */
    char device[16];         /* the device name it serves: gpu, cpu, auto */
    char desc[200];          /* the device, as kbcl run prints it */
} kb_devd_hello;

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

/*
 * The folder of socket `path` (its last '/' ends it; none: "."), checked as the server's: a
 * directory (not a symbolic link) owned by this process's effective uid with no group or
 * other permission. make: created 0700 first if missing. 0; KB_ERR_NOTFOUND: missing (make
 * 0); KB_ERR_STATE: it exists and fails a check (which one, and the fix, in eb); KB_ERR_IO:
 * it cannot be looked at or made ("Not a directory" when it is a file).
 */
int kb_devd_dir_check(const char *path, int make, kb_errbuf *eb);

/* The folder of the servers' sockets: $KBCL_DEVD_DIR, else $XDG_RUNTIME_DIR/kbcl, else
 * /tmp/kbcl-devd-$UID. 0, or KB_ERR_RANGE when it does not fit. */
int kb_devd_dir(char *buf, size_t n, kb_errbuf *eb);
/* <dir>/<device>.sock, checked against the socket path length limit. */
int kb_devd_socket_path(const char *device, char *buf, size_t n, kb_errbuf *eb);
struct sockaddr_un;
/* A Unix stream socket (close-on-exec) and *sa filled with path: the descriptor, or the
 * error (KB_ERR_RANGE for a path longer than a socket address holds). */
int kb_devd_socket(const char *path, struct sockaddr_un *sa, kb_errbuf *eb);
/* Whole reads (any descriptor: sockets, pipes) and writes on a socket (EINTR retried; writes
 * never raise SIGPIPE): 0, or -1 when the peer is gone or the call failed. */
int kb_devd_read_full(int fd, void *p, size_t n);
int kb_devd_write_full(int fd, const void *p, size_t n);
/* n bytes that may carry a file descriptor (SCM_RIGHTS): passfd >= 0 sends one with them;
 * *gotfd (if not NULL) receives one that came with them, else -1 (the caller owns it). */
int kb_devd_send_fd(int fd, const void *p, size_t n, int passfd);
int kb_devd_recv_fd(int fd, void *p, size_t n, int *gotfd);
/* Whether clients may use a server: KBCL_DEVD unset or not one of off, 0, no. */
int kb_devd_enabled(void);

#endif
