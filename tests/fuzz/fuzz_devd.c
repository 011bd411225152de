/*
 * fuzz_devd — the device server's protocol (cl/devd/kb_devd.c, kb_devd.h, kb_devd_proto.h)
 * from a byte stream.
 *
 * The input is what one client sends on one connection: request headers (kb_devd_msg) and
 * their data, back to back. kb_devd_serve_conn serves it, in this thread, from one end of a
 * socketpair, as a session of a real server would: the same header checks, bounds, range
 * and record checks and handlers, with the reference backend's resident variant as the
 * device (kb_ref_backend_create_resident: host buffers, no OpenCL) and a 64 KiB bound on the
 * session's arena and payload (so a valid gemm over the whole arena stays quick). A helper
 * thread writes the input and reads the replies at once (neither side can wait on the other),
 * and checks that every reply is well formed. No descriptor travels, so the shared-file
 * paths are reached only as far as their "without a file" errors (test_devd.c covers them).
 *
 * A finding: a crash, a sanitizer report, a leak, a hang (libFuzzer's -timeout), a malformed
 * reply or an unexpected result of the session (abort()). Every other outcome is the
 * product's business. Seeds: tests/fuzz/corpus/devd/ (a session using every request, a
 * flush in parts, edge cases), laid out for this build's kb_rec (136 bytes).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_util.h"

#include "kb_devd.h"
#include "kb_replay.h"

/* The client's side: the input to write, the replies to read and check. */
typedef struct feed {
    int fd;
    const uint8_t *in;
    size_t n;
    /* the reply being read */
    kb_devd_rep rep;
    int phase;   /* 0 the header, 1 the message, 2 the data */
    size_t have; /* bytes of the current phase */
    char msg[sizeof(((kb_errbuf *)0)->msg)];
    int verbose; /* DEVD_FUZZ_VERBOSE set: each reply on stderr (to check a seed) */
} feed;

static void check_reply(const kb_devd_rep *r)
{
    KBF_CHECK(kb_err_name(r->rc) != NULL, "reply rc %d is no KB_ERR_* code", (int)r->rc);
    KBF_CHECK(r->rc != 0 || r->msglen == 0, "a success with a message");
    KBF_CHECK(r->rc == 0 || r->len == 0, "an error with data");
    KBF_CHECK(r->msglen < sizeof(((kb_errbuf *)0)->msg), "message of %u bytes",
                    r->msglen);
    KBF_CHECK(r->len <= KB_DEVD_MAX_MSG, "reply data of %llu bytes",
                    (unsigned long long)r->len);
}

/* Takes n reply bytes at p: a header, then its message, then its data. */
static void eat(feed *f, const uint8_t *p, size_t n)
{
    while (n > 0) {
        size_t k;
        if (f->phase == 0) {
            k = sizeof f->rep - f->have < n ? sizeof f->rep - f->have : n;
            memcpy((uint8_t *)&f->rep + f->have, p, k);
            f->have += k;
            if (f->have == sizeof f->rep) {
                check_reply(&f->rep);
                f->have = 0;
                f->phase = 1;
            }
        } else if (f->phase == 1) {
            k = f->rep.msglen - f->have < n ? f->rep.msglen - f->have : n;
            memcpy(f->msg + f->have, p, k);
            f->have += k;
        } else {
            k = f->rep.len - f->have < n ? (size_t)(f->rep.len - f->have) : n;
            f->have += k;
        }
        p += k;
        n -= k;
        if (f->phase == 1 && f->have == f->rep.msglen) {
            if (f->verbose)
                fprintf(stderr, "reply %d (%llu data bytes) %.*s\n", (int)f->rep.rc,
                        (unsigned long long)f->rep.len, (int)f->rep.msglen, f->msg);
            f->have = 0;
            f->phase = 2;
        }
        if (f->phase == 2 && f->have == f->rep.len) {
            f->have = 0;
            f->phase = 0;
        }
    }
}

static void *feed_main(void *arg)
{
    feed *f = arg;
    uint8_t sink[1 << 16];
    size_t put = 0;
    int writing = 1;

    if (f->n == 0) {
        shutdown(f->fd, SHUT_WR);
        writing = 0;
    }
    for (;;) {
        struct pollfd p = { f->fd, (short)(POLLIN | (writing ? POLLOUT : 0)), 0 };
        if (poll(&p, 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (writing && (p.revents & (POLLOUT | POLLERR))) {
            ssize_t w = send(f->fd, f->in + put, f->n - put, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0)
                put += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                put = f->n; /* the server closed the connection: the rest is unread */
            if (put == f->n) {
                shutdown(f->fd, SHUT_WR);
                writing = 0;
            }
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(f->fd, sink, sizeof sink, MSG_DONTWAIT);
            if (r > 0)
                eat(f, sink, (size_t)r);
            else if (r == 0 || (errno != EAGAIN && errno != EINTR))
                break; /* the session is over */
        }
    }
    /* a reply cut short is no finding: the server stops answering once it closes */
    return NULL;
}

static int ref_session(void *arg, kb_backend *out, char *desc, size_t n, kb_errbuf *eb)
{
    (void)arg;
    snprintf(desc, n, "ref-resident (fuzz)");
    if (kb_ref_backend_create_resident(out) != 0)
        return kb_err_set(eb, KB_ERR_NOMEM, "fuzz: no backend");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kb_devd_opts o = { NULL, "cpu", "fuzz device", NULL, ref_session, NULL, NULL, 0, NULL, -1,
                       64 << 10, 5.0, 0, NULL };
    kb_errbuf eb = { { 0 } };
    feed f;
    pthread_t th;
    int sv[2], rc;

    if (size > KBF_MAX_INPUT)
        return 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        fprintf(stderr, "fuzz harness: socketpair: %s\n", strerror(errno));
        exit(2);
    }
    memset(&f, 0, sizeof f);
    f.fd = sv[0];
    f.in = data;
    f.n = size;
    f.verbose = getenv("DEVD_FUZZ_VERBOSE") != NULL;
    if (pthread_create(&th, NULL, feed_main, &f) != 0) {
        fprintf(stderr, "fuzz harness: no thread\n");
        exit(2);
    }
    rc = kb_devd_serve_conn(&o, sv[1], &eb);
    shutdown(sv[1], SHUT_RDWR); /* the client's side sees the end */
    pthread_join(th, NULL);
    close(sv[0]);
    close(sv[1]);
    /* the peer ended it, or the server closed it for a malformed request, a stall, another
     * build's hello or a buffer it could not allocate: nothing else */
    KBF_CHECK(rc == 0 || rc == KB_ERR_INVAL || rc == KB_ERR_DEVICE || rc == KB_ERR_NOMEM,
                    "session ended with %d: %s", rc, eb.msg);
    return 0;
}
