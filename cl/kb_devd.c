/*
 * kb_devd — the device server (kb_devd.h): a listening Unix socket, one thread per session,
 * each driving a device-resident backend of its own with the requests of kb_devd.h.
 */
#include "kb_devd.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kb_resident.h"

/* ------------------------------------------------------------------ paths and settings */

int kb_devd_dir(char *buf, size_t n, kb_errbuf *eb)
{
    const char *d = getenv("KBCL_DEVD_DIR"), *x = getenv("XDG_RUNTIME_DIR");
    int k;
    if (d && d[0])
        k = snprintf(buf, n, "%s", d);
    else if (x && x[0])
        k = snprintf(buf, n, "%s/kbcl", x);
    else
        k = snprintf(buf, n, "/tmp/kbcl-devd-%lu", (unsigned long)getuid());
    if (k < 0 || (size_t)k >= n)
        return kb_err_set(eb, KB_ERR_RANGE, "device server folder: path too long");
    return 0;
}

int kb_devd_socket_path(const char *device, char *buf, size_t n, kb_errbuf *eb)
{
    char dir[512];
    struct sockaddr_un sa;
    int rc, k;
    if ((rc = kb_devd_dir(dir, sizeof dir, eb)) != 0)
        return rc;
    k = snprintf(buf, n, "%s/%s.sock", dir, device);
    if (k < 0 || (size_t)k >= n || (size_t)k >= sizeof sa.sun_path)
        return kb_err_set(eb, KB_ERR_RANGE,
                          "device server socket %s/%s.sock: longer than %zu bytes (set "
                          "KBCL_DEVD_DIR to a shorter folder)",
                          dir, device, sizeof sa.sun_path - 1);
    return 0;
}

int kb_devd_enabled(void)
{
    const char *v = getenv("KBCL_DEVD");
    return !(v && (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "no")));
}

/* ------------------------------------------------------------------ the server */

typedef struct devd devd;

typedef struct session {
    devd *d;
    int fd;
    pthread_t th;
    int done;           /* the thread has finished (joinable) */
    kb_backend be;      /* none until HELLO asks for one */
    const kb_resident_ops *ops;
    void *dev;
    uint8_t *payload;   /* this session's payload area, as the device has it (copied) */
    size_t payload_cap;
    int shm_fd;         /* the client's payload file (KB_DEVD_SHARED), or -1 */
    uint8_t *shm;       /* shm_fd mapped read-only: shm_len bytes */
    size_t shm_len;
    int stage_fd;       /* the client's staging file for downloads, or -1 */
    uint8_t *stage;     /* stage_fd mapped read-write: stage_len bytes */
    size_t stage_len;
    int rfd;            /* a descriptor that came with the current request, or -1 */
    uint8_t *buf;       /* the request's data */
    size_t buf_cap;
    kb_devd_hello hello;
} session;

/* A finished session's backend and buffers, kept for the next session. */
typedef struct pooled {
    kb_backend be;
    uint8_t *buf;
    size_t buf_cap;
    char desc[200];
} pooled;

struct devd {
    const kb_devd_opts *o;
    pooled pool[KB_DEVD_POOL];
    int npool;
    pthread_mutex_t mu;
    session **s;        /* running and finished-but-not-joined sessions */
    size_t ns;
    int open;           /* sessions with a backend (for the idle clock and HELLO) */
    double last_busy;   /* when the last session ended (monotonic s) */
    double started;
    int shutdown;       /* a SHUTDOWN request came */
    kb_opencl_setup setup; /* the server's own set-up: what hellos report */
    char desc[200];
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int kb_devd_read_full(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

int kb_devd_write_full(int fd, const void *p, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t w = send(fd, (const char *)p + put, n - put, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        put += (size_t)w;
    }
    return 0;
}

int kb_devd_send_fd(int fd, const void *p, size_t n, int passfd)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = { (void *)p, n };
    struct msghdr mh;
    ssize_t w;

    if (passfd < 0)
        return kb_devd_write_full(fd, p, n);
    memset(&mh, 0, sizeof mh);
    memset(&ctl, 0, sizeof ctl);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &passfd, sizeof passfd);
    do
        w = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w <= 0)
        return -1;
    /* the descriptor went with the first byte; the rest is plain data */
    return (size_t)w == n ? 0 : kb_devd_write_full(fd, (const char *)p + w, n - (size_t)w);
}

int kb_devd_recv_fd(int fd, void *p, size_t n, int *gotfd)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = { p, n };
    struct msghdr mh;
    ssize_t r;

    if (gotfd)
        *gotfd = -1;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    do
        r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r <= 0)
        return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int got;
            memcpy(&got, CMSG_DATA(c), sizeof got);
            if (gotfd && *gotfd < 0)
                *gotfd = got;
            else
                close(got);
        }
    if ((size_t)r < n && kb_devd_read_full(fd, (char *)p + r, n - (size_t)r) != 0) {
        if (gotfd && *gotfd >= 0) {
            close(*gotfd);
            *gotfd = -1;
        }
        return -1;
    }
    return 0;
}

/* The reply: rc with eb's message, then n bytes of data. -1 when the client is gone. */
static int reply(session *s, int rc, const kb_errbuf *eb, uint64_t a, uint64_t b,
                 const void *data, uint64_t n)
{
    kb_devd_rep r;
    memset(&r, 0, sizeof r);
    r.rc = rc;
    r.msglen = rc && eb ? (uint32_t)strnlen(eb->msg, sizeof eb->msg) : 0;
    r.a = a;
    r.b = b;
    r.len = rc ? 0 : n;
    if (kb_devd_write_full(s->fd, &r, sizeof r) != 0 ||
        (r.msglen && kb_devd_write_full(s->fd, eb->msg, r.msglen) != 0) ||
        (r.len && kb_devd_write_full(s->fd, data, (size_t)r.len) != 0))
        return -1;
    return 0;
}

static int grow(uint8_t **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : 2 * c;
    uint8_t *q = realloc(*p, c);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Makes the session's backend (HELLO with flags 1). */
static int open_backend(session *s, kb_errbuf *eb)
{
    devd *d = s->d;
    double t0 = mono_s();
    char desc[200] = "";
    int rc = 0, reused = 0;
    pthread_mutex_lock(&d->mu);
    if (d->npool > 0) {
        pooled *p = &d->pool[--d->npool];
        s->be = p->be;
        free(s->buf);
        s->buf = p->buf;
        s->buf_cap = p->buf_cap;
        memcpy(desc, p->desc, sizeof desc);
        reused = 1;
    }
    pthread_mutex_unlock(&d->mu);
    if (!reused && (rc = d->o->session(d->o->arg, &s->be, desc, sizeof desc, eb)) != 0)
        return rc;
    kb_resident *res = s->be.ops->resident ? s->be.ops->resident(s->be.self) : NULL;
    if (!res) {
        s->be.ops->destroy(s->be.self);
        s->be.ops = NULL;
        return kb_err_set(eb, KB_ERR_DEVICE, "device server: its backend is not device-resident");
    }
    kb_resident_device(res, &s->ops, &s->dev);
    s->hello.session_ms = (mono_s() - t0) * 1e3;
    snprintf(s->hello.desc, sizeof s->hello.desc, "%s", desc);
    kb_opencl_setup su;
    if (kb_opencl_setup_of(&s->be, &su) == 0)
        s->hello.setup = su;
    pthread_mutex_lock(&d->mu);
    d->open++;
    s->hello.sessions = (uint32_t)d->open;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* Maps at least `need` bytes of fd (a client's file) at *map (*len bytes mapped): kept when
 * large enough, else mapped again. */
static int map_file(int fd, size_t need, int prot, uint8_t **map, size_t *len, kb_errbuf *eb)
{
    void *p;
    if (*map && *len >= need)
        return 0;
    if (*map)
        munmap(*map, *len);
    *map = NULL;
    *len = 0;
    if (need == 0)
        return 0;
    p = mmap(NULL, need, prot, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return kb_err_set(eb, KB_ERR_IO, "device server: mapping a client file: %s",
                          strerror(errno));
    *map = p;
    *len = need;
    return 0;
}

static void unmap_file(int *fd, uint8_t **map, size_t *len)
{
    if (*map)
        munmap(*map, *len);
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
    *map = NULL;
    *len = 0;
}

/* One request whose header is m and whose data is in s->buf. -1: end the session. */
static int serve_one(session *s, const kb_devd_msg *m)
{
    kb_errbuf eb = { { 0 } };
    int rc = 0;
    devd *d = s->d;

    if (m->op != KB_DEVD_HELLO && m->op != KB_DEVD_SHUTDOWN && !s->be.ops)
        return reply(s, kb_err_set(&eb, KB_ERR_STATE, "device server: no session (HELLO first)"),
                     &eb, 0, 0, NULL, 0);
    switch (m->op) {
    case KB_DEVD_HELLO:
        memset(&s->hello, 0, sizeof s->hello);
        s->hello.proto = KB_DEVD_PROTO;
        s->hello.rec_size = (uint32_t)sizeof(kb_rec);
        s->hello.pid = (int32_t)getpid();
        snprintf(s->hello.device, sizeof s->hello.device, "%s", d->o->device);
        pthread_mutex_lock(&d->mu);
        s->hello.uptime_s = mono_s() - d->started;
        s->hello.sessions = (uint32_t)d->open;
        s->hello.setup = d->setup;
        snprintf(s->hello.desc, sizeof s->hello.desc, "%s", d->desc);
        pthread_mutex_unlock(&d->mu);
        if (m->a != KB_DEVD_MAGIC || m->b != KB_DEVD_PROTO || m->c != sizeof(kb_rec))
            rc = kb_err_set(&eb, KB_ERR_DEVICE,
                            "device server (pid %d) speaks protocol %d with %zu-byte records; "
                            "this kbcl %llu with %llu-byte records (a different build: restart "
                            "the server)",
                            (int)getpid(), KB_DEVD_PROTO, sizeof(kb_rec),
                            (unsigned long long)m->b, (unsigned long long)m->c);
        else if ((m->flags & 1) && !s->be.ops)
            rc = open_backend(s, &eb);
        return reply(s, rc, &eb, 0, 0, &s->hello, sizeof s->hello);
    case KB_DEVD_SHUTDOWN:
        pthread_mutex_lock(&d->mu);
        d->shutdown = 1;
        pthread_mutex_unlock(&d->mu);
        return reply(s, 0, &eb, 0, 0, NULL, 0);
    case KB_DEVD_ARENA:
        if (m->len != m->b * sizeof(kb_move))
            rc = kb_err_set(&eb, KB_ERR_INVAL, "device server: ARENA with %llu data bytes",
                            (unsigned long long)m->len);
        else
            rc = s->ops->arena(s->dev, m->a, (const kb_move *)s->buf, (size_t)m->b, &eb);
        return reply(s, rc, &eb, 0, 0, NULL, 0);
    case KB_DEVD_COPY:
        return reply(s, s->ops->copy(s->dev, m->a, m->b, m->c, &eb), &eb, 0, 0, NULL, 0);
    case KB_DEVD_FILL:
        return reply(s, s->ops->fill(s->dev, m->a, m->b, (uint8_t)m->c, &eb), &eb, 0, 0, NULL,
                     0);
    case KB_DEVD_UPLOAD:
        return reply(s, s->ops->upload(s->dev, m->a, s->buf, m->len, &eb), &eb, 0, 0, NULL, 0);
    case KB_DEVD_DOWNLOAD:
        if (m->flags & KB_DEVD_SHARED) { /* into the client's staging file */
            if (s->rfd >= 0) {
                unmap_file(&s->stage_fd, &s->stage, &s->stage_len);
                s->stage_fd = s->rfd;
                s->rfd = -1;
            }
            if (s->stage_fd < 0 || m->b > SIZE_MAX)
                rc = kb_err_set(&eb, KB_ERR_INVAL, "device server: shared download without a file");
            else if ((rc = map_file(s->stage_fd, (size_t)m->b, PROT_READ | PROT_WRITE,
                                    &s->stage, &s->stage_len, &eb)) == 0)
                rc = s->ops->download(s->dev, m->a, s->stage, m->b, &eb);
            return reply(s, rc, &eb, 0, 0, NULL, 0);
        }
        if (m->b > SIZE_MAX || grow(&s->buf, &s->buf_cap, (size_t)m->b) != 0)
            rc = kb_err_set(&eb, KB_ERR_NOMEM, "device server: %llu bytes to download",
                            (unsigned long long)m->b);
        else
            rc = s->ops->download(s->dev, m->a, s->buf, m->b, &eb);
        return reply(s, rc, &eb, 0, 0, s->buf, m->b);
    case KB_DEVD_PAYLOAD:
        if (m->flags & KB_DEVD_SHARED) { /* the client's own pages: map, upload, no copy */
            if (s->rfd >= 0) {
                unmap_file(&s->shm_fd, &s->shm, &s->shm_len);
                s->shm_fd = s->rfd;
                s->rfd = -1;
            }
            if (s->shm_fd < 0 || m->a < m->b || m->a > SIZE_MAX || m->len)
                rc = kb_err_set(&eb, KB_ERR_INVAL, "device server: shared payload without a file");
            else if ((rc = map_file(s->shm_fd, (size_t)m->a, PROT_READ, &s->shm, &s->shm_len,
                                    &eb)) == 0)
                rc = s->ops->payload(s->dev, s->shm, (size_t)m->a, (size_t)m->b, &eb);
            return reply(s, rc, &eb, 0, 0, NULL, 0);
        }
        /* the client sends the bytes the device lacks; the primitive wants the whole area */
        if (m->a < m->b || m->len != m->a - m->b || m->a > SIZE_MAX ||
            grow(&s->payload, &s->payload_cap, (size_t)m->a) != 0)
            rc = kb_err_set(&eb, KB_ERR_NOMEM, "device server: payload of %llu bytes",
                            (unsigned long long)m->a);
        else {
            if (m->len)
                memcpy(s->payload + m->b, s->buf, (size_t)m->len);
            rc = s->ops->payload(s->dev, s->payload, (size_t)m->a, (size_t)m->b, &eb);
        }
        return reply(s, rc, &eb, 0, 0, NULL, 0);
    case KB_DEVD_FLUSH: {
        const uint64_t *cnt = (const uint64_t *)s->buf;
        const kb_rec *recs;
        uint64_t nrec = 0;
        if (m->b > m->len / sizeof(uint64_t))
            rc = kb_err_set(&eb, KB_ERR_INVAL, "device server: FLUSH of %llu batches",
                            (unsigned long long)m->b);
        for (uint64_t i = 0; rc == 0 && i < m->b; i++)
            nrec += cnt[i];
        if (rc == 0 && m->len != m->b * sizeof(uint64_t) + nrec * sizeof(kb_rec))
            rc = kb_err_set(&eb, KB_ERR_INVAL, "device server: FLUSH with %llu data bytes",
                            (unsigned long long)m->len);
        if (rc == 0) {
            recs = (const kb_rec *)(s->buf + m->b * sizeof(uint64_t));
            rc = s->be.ops->begin(s->be.self, NULL, m->a, NULL, 0, &eb);
            for (uint64_t i = 0; rc == 0 && i < m->b; i++) {
                rc = s->be.ops->run_batch(s->be.self, recs, (size_t)cnt[i], &eb);
                recs += cnt[i];
            }
            if (rc == 0)
                rc = s->be.ops->end(s->be.self, NULL, m->a, &eb);
            else { /* close the flush; its own error is the one to report */
                kb_errbuf ignored;
                s->be.ops->end(s->be.self, NULL, m->a, &ignored);
            }
        }
        double kms = kb_opencl_kernel_ms(&s->be);
        uint64_t bits;
        memcpy(&bits, &kms, sizeof bits);
        return reply(s, rc, &eb, kb_opencl_launches(&s->be), bits, NULL, 0);
    }
    case KB_DEVD_QUERY: {
        kb_vquery q;
        void *out = NULL;
        size_t outn = 0;
        if (m->len < sizeof q) {
            rc = kb_err_set(&eb, KB_ERR_INVAL, "device server: QUERY with %llu data bytes",
                            (unsigned long long)m->len);
        } else {
            memcpy(&q, s->buf, sizeof q);
            outn = kb_vquery_result_size(&q);
            if (m->len != sizeof q + (uint64_t)q.ntiles * sizeof(uint64_t) || outn == 0)
                rc = kb_err_set(&eb, KB_ERR_INVAL, "device server: QUERY kind %u over %u tiles "
                                "with %llu data bytes", q.kind, q.ntiles,
                                (unsigned long long)m->len);
            else if (!s->ops->query)
                rc = kb_err_set(&eb, KB_ERR_UNSUPPORTED, "device server: no device queries");
            else if (!(out = malloc(outn)))
                rc = kb_err_set(&eb, KB_ERR_NOMEM, "device server: query result");
            else
                rc = s->ops->query(s->dev, &q, (const uint64_t *)(s->buf + sizeof q), out, &eb);
        }
        int w = reply(s, rc, &eb, 0, 0, out, outn);
        free(out);
        return w;
    }
    default:
        kb_err_set(&eb, KB_ERR_INVAL, "device server: unknown request %u", m->op);
        reply(s, KB_ERR_INVAL, &eb, 0, 0, NULL, 0);
        return -1;
    }
}

static void *session_main(void *arg)
{
    session *s = arg;
    kb_devd_msg m;

    s->shm_fd = -1;
    s->stage_fd = -1;
    s->rfd = -1;
    while (kb_devd_recv_fd(s->fd, &m, sizeof m, &s->rfd) == 0) {
        if (m.len > SIZE_MAX || grow(&s->buf, &s->buf_cap, (size_t)m.len) != 0)
            break; /* cannot even read it: the client sees the connection close */
        if (m.len && kb_devd_read_full(s->fd, s->buf, (size_t)m.len) != 0)
            break;
        int stop = serve_one(s, &m) != 0;
        if (s->rfd >= 0) { /* a descriptor no request took */
            close(s->rfd);
            s->rfd = -1;
        }
        if (stop)
            break;
    }
    if (s->rfd >= 0)
        close(s->rfd);
    unmap_file(&s->shm_fd, &s->shm, &s->shm_len);
    unmap_file(&s->stage_fd, &s->stage, &s->stage_len);
    if (s->be.ops) {
        devd *d = s->d;
        int kept = 0;
        /* the device memory goes either way; the queue, kernels and tables may stay */
        if (d->o->recycle && d->o->recycle(d->o->arg, &s->be) == 0) {
            pthread_mutex_lock(&d->mu);
            if (d->npool < KB_DEVD_POOL) {
                pooled *p = &d->pool[d->npool++];
                p->be = s->be;
                p->buf = s->buf;
                p->buf_cap = s->buf_cap;
                memcpy(p->desc, s->hello.desc, sizeof p->desc);
                s->buf = NULL;
                kept = 1;
            }
            pthread_mutex_unlock(&d->mu);
        }
        if (!kept)
            s->be.ops->destroy(s->be.self);
        s->be.ops = NULL;
        pthread_mutex_lock(&s->d->mu);
        s->d->open--;
        s->d->last_busy = mono_s();
        pthread_mutex_unlock(&s->d->mu);
    }
    free(s->payload);
    free(s->buf);
    s->payload = s->buf = NULL;
    shutdown(s->fd, SHUT_RDWR);
    pthread_mutex_lock(&s->d->mu);
    s->done = 1;
    pthread_mutex_unlock(&s->d->mu);
    return NULL;
}

/* Joins the finished sessions (all of them with `all`, after shutting their sockets). */
static void reap(devd *d, int all)
{
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < d->ns;) {
        session *s = d->s[i];
        if (!s->done && !all) {
            i++;
            continue;
        }
        if (!s->done)
            shutdown(s->fd, SHUT_RDWR);
        pthread_mutex_unlock(&d->mu);
        pthread_join(s->th, NULL);
        pthread_mutex_lock(&d->mu);
        close(s->fd);
        free(s);
        d->s[i] = d->s[--d->ns];
    }
    pthread_mutex_unlock(&d->mu);
}

int kb_devd_socket(const char *path, struct sockaddr_un *sa, kb_errbuf *eb)
{
    int fd;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa->sun_path)
        return kb_err_set(eb, KB_ERR_RANGE, "device server socket %s: path too long", path);
    memcpy(sa->sun_path, path, strlen(path));
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kb_err_set(eb, KB_ERR_IO, "socket: %s", strerror(errno));
    return fd;
}

static int listen_on(const char *path, kb_errbuf *eb)
{
    struct sockaddr_un sa;
    int fd = kb_devd_socket(path, &sa, eb);

    if (fd < 0)
        return fd;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
        goto bound;
    if (errno == EADDRINUSE) {
        /* a socket file: a live server answers a connect, a stale one (killed) does not */
        int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = c >= 0 && connect(c, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (c >= 0)
            close(c);
        if (live) {
            close(fd);
            return kb_err_set(eb, KB_ERR_STATE,
                              "a device server already listens at %s (kbcl devd --stop ends it)",
                              path);
        }
        unlink(path);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
            goto bound;
    }
    {
        int e = errno;
        close(fd);
        return kb_err_set(eb, KB_ERR_IO, "device server: bind %s: %s", path, strerror(e));
    }
bound:
    if (listen(fd, 64) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return kb_err_set(eb, KB_ERR_IO, "device server: listen %s: %s", path, strerror(e));
    }
    return fd;
}

int kb_devd_serve(const kb_devd_opts *o, kb_errbuf *eb)
{
    devd d;
    char dir[600];
    int lfd, rc = 0;

    memset(&d, 0, sizeof d);
    d.o = o;
    d.started = d.last_busy = mono_s();
    if (!o || !o->path || !o->session || !o->device)
        return kb_err_set(eb, KB_ERR_INVAL, "device server: missing options");
    /* the socket's folder: private to this user */
    snprintf(dir, sizeof dir, "%s", o->path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return kb_err_set(eb, KB_ERR_IO, "device server: mkdir %s: %s", dir, strerror(errno));
    }
    lfd = listen_on(o->path, eb);
    if (lfd < 0)
        return lfd;
    pthread_mutex_init(&d.mu, NULL);
    if (o->setup)
        d.setup = *o->setup;
    snprintf(d.desc, sizeof d.desc, "%s", o->desc ? o->desc : o->device);
    if (o->ready_fd >= 0) {
        char one = 1;
        (void)!write(o->ready_fd, &one, 1);
        close(o->ready_fd);
    }
    for (;;) {
        struct pollfd p = { lfd, POLLIN, 0 };
        int n = poll(&p, 1, 200);
        reap(&d, 0);
        pthread_mutex_lock(&d.mu);
        int stop = d.shutdown || (o->stop && *o->stop) ||
                   (o->idle_exit_s > 0 && d.ns == 0 && mono_s() - d.last_busy >= o->idle_exit_s);
        pthread_mutex_unlock(&d.mu);
        if (stop)
            break;
        if (n <= 0 || !(p.revents & POLLIN))
            continue;
        int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0)
            continue;
        session *s = calloc(1, sizeof *s);
        pthread_mutex_lock(&d.mu);
        int full = d.ns >= KB_DEVD_MAX_SESSIONS;
        session **grown = full || !s ? NULL : realloc(d.s, (d.ns + 1) * sizeof *d.s);
        if (grown)
            d.s = grown;
        pthread_mutex_unlock(&d.mu);
        if (!grown) { /* refused: the client sees the connection close and sets up itself */
            free(s);
            close(cfd);
            continue;
        }
        s->d = &d;
        s->fd = cfd;
        if (pthread_create(&s->th, NULL, session_main, s) != 0) {
            free(s);
            close(cfd);
            continue;
        }
        pthread_mutex_lock(&d.mu);
        d.s[d.ns++] = s;
        d.last_busy = mono_s();
        pthread_mutex_unlock(&d.mu);
    }
    close(lfd);
    unlink(o->path);
    reap(&d, 1);
    for (int i = 0; i < d.npool; i++) {
        d.pool[i].be.ops->destroy(d.pool[i].be.self);
        free(d.pool[i].buf);
    }
    free(d.s);
    pthread_mutex_destroy(&d.mu);
    return rc;
}
