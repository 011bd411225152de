/*
 * kb_devd_proto — what the device server (kb_devd.h) and its client (kb_remote.h) share: the
 * wire protocol (the requests, the request and reply headers, the HELLO reply, a message's
 * size limit), where servers' sockets live and the check of their folder (the first gate of
 * kb_devd.h's "Trust"), and whole-message socket I/O, with a descriptor passed alongside
 * (SCM_RIGHTS). Neither side's own code is here: the server and the client each use this file
 * and not each other.
 *
 * The records travel as raw structs, so both ends must be the same kbcl build: HELLO checks
 * KB_DEVD_MAGIC, KB_DEVD_PROTO and sizeof(kb_rec).
 */
#ifndef KB_DEVD_PROTO_H
#define KB_DEVD_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kb_opencl.h"

#define KB_DEVD_PROTO 5 /* 5: kb_vquery grew coll and root (KB_VQ_COLL); BLOCK (an arena of
                         * blocks) instead of ARENA with moves */
#define KB_DEVD_MAGIC 0x6b62646576643031ULL /* "kbdevd01" */
/* A request's data, and a download's reply data, at most (64 MiB): 256 sessions can make the
 * server buffer 16 GiB at worst, and a round trip per 64 MiB costs nothing next to the copy. */
#define KB_DEVD_MAX_MSG ((uint64_t)64 << 20)

/* Requests. */
enum {
    KB_DEVD_HELLO = 1,  /* a = magic, b = proto, c = sizeof(kb_rec); flags 1: open a session */
    KB_DEVD_BLOCK,      /* a = base, b = bytes: a new block of the arena (kb_resident_ops
                           .block; base 0 starts a new arena); no data */
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
/* The timed forms the server reads with: each wait for more bytes lasts at most ms (the
 * first wait of a recv, first_ms; < 0: no limit). 0; -1 the peer is gone or the call failed
 * (*got_some: whether it sent a part); -2 it stalled. */
int kb_devd_read_timed(int fd, void *p, size_t n, int ms);
int kb_devd_recv_fd_timed(int fd, void *p, size_t n, int *gotfd, int first_ms, int rest_ms,
                          int *got_some);

#endif
