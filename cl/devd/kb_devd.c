/*
 * kb_devd — the device server (kb_devd.h): a listening Unix socket, one thread per session,
 * each driving a device-resident backend of its own with the requests of kb_devd_proto.h
 * (whose socket I/O and folder check, kb_devd_proto.c, it shares with the client).
 */
#include "kb_devd.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
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
#include "kb_vquery.h"

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
    uint64_t arena_bytes;   /* the device arena as this session's BLOCKs made it */
    uint64_t payload_bytes; /* the device payload as this session's PAYLOAD made it */
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
    uint64_t nreq;      /* requests read */
    double tokens, tlast; /* the request rate's bucket */
    /* a flush sent in parts (KB_DEVD_MORE): begun, its arena, its first error */
    int flush_open, flush_begun, flush_rc;
    uint64_t flush_a;
    kb_errbuf flush_eb;
    long peer_pid;      /* for the log */
    int dev_failed;     /* a request failed on the device: the backend is not pooled */
    int end_rc;         /* why the server closed the connection (0: the peer did) */
    kb_errbuf end_eb;
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
    int io_ms;          /* o->io_timeout_s, or the default, in ms */
    double rate;        /* o->rate_hz, or the default */
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void say(const devd *d, const char *fmt, ...)
{
    char line[400];
    va_list ap;
    if (!d->o->log)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    d->o->log(d->o->arg, line);
}

/* The reply: rc with eb's message, then n bytes of data. -1 when the client is gone. */
static int reply(session *s, int rc, const kb_errbuf *eb, uint64_t a, uint64_t b,
                 const void *data, uint64_t n)
{
    kb_devd_rep r;
    if (rc == KB_ERR_DEVICE)
        s->dev_failed = 1;
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

static const char *op_name(uint32_t op)
{
    static const char *const names[] = { "?",        "HELLO",    "BLOCK", "COPY",
                                         "FILL",     "UPLOAD",   "DOWNLOAD", "PAYLOAD",
                                         "FLUSH",    "SHUTDOWN", "QUERY" };
    return op < sizeof names / sizeof *names ? names[op] : "?";
}

/*
 * Ends the session for a request that breaks the protocol (or a stall): the client hears why
 * (when it still listens), the server's log too, and the connection closes. Always -1.
 */
static int refuse(session *s, int rc, kb_errbuf *eb)
{
    s->end_rc = rc;
    s->end_eb = *eb;
    kb_err_prefix(eb, "device server: connection closed");
    (void)reply(s, rc, eb, 0, 0, NULL, 0);
    say(s->d, "closed the connection of pid %ld: %s", (long)s->peer_pid, s->end_eb.msg);
    return -1;
}

/* The protocol's rules a header alone can break: checked before its data is read. */
static int check_header(const session *s, const kb_devd_msg *m, kb_errbuf *eb)
{
    static const uint32_t flags_ok[] = { 0, 1, 0, 0, 0, 0, KB_DEVD_SHARED, KB_DEVD_SHARED,
                                         KB_DEVD_MORE, 0, 0 };
    if (m->op < KB_DEVD_HELLO || m->op > KB_DEVD_QUERY)
        return kb_err_set(eb, KB_ERR_INVAL, "unknown request %u", m->op);
    if (m->flags & ~flags_ok[m->op])
        return kb_err_set(eb, KB_ERR_INVAL, "%s with flags 0x%x", op_name(m->op), m->flags);
    if (m->len > KB_DEVD_MAX_MSG)
        return kb_err_set(eb, KB_ERR_INVAL, "%s with %llu data bytes, more than the %llu a "
                          "request may carry", op_name(m->op), (unsigned long long)m->len,
                          (unsigned long long)KB_DEVD_MAX_MSG);
    if (s->flush_open && m->op != KB_DEVD_FLUSH)
        return kb_err_set(eb, KB_ERR_INVAL, "%s inside a flush sent in parts",
                          op_name(m->op));
    if (!s->be.ops && m->op != KB_DEVD_HELLO && m->op != KB_DEVD_SHUTDOWN)
        return kb_err_set(eb, KB_ERR_INVAL, "%s before a session (HELLO first)",
                          op_name(m->op));
    switch (m->op) {
    case KB_DEVD_HELLO:
        if (m->a != KB_DEVD_MAGIC)
            return kb_err_set(eb, KB_ERR_INVAL, "HELLO without kbcl's magic number (not a kbcl "
                              "client)");
        /* fall through */
    case KB_DEVD_COPY:
    case KB_DEVD_SHUTDOWN:
    case KB_DEVD_DOWNLOAD:
        if (m->len)
            return kb_err_set(eb, KB_ERR_INVAL, "%s with %llu data bytes", op_name(m->op),
                              (unsigned long long)m->len);
        return 0;
    case KB_DEVD_FILL:
        if (m->len || m->c > 255)
            return kb_err_set(eb, KB_ERR_INVAL, "FILL with %llu data bytes, byte %llu",
                              (unsigned long long)m->len, (unsigned long long)m->c);
        return 0;
    case KB_DEVD_BLOCK:
        if (m->len)
            return kb_err_set(eb, KB_ERR_INVAL, "BLOCK with %llu data bytes",
                              (unsigned long long)m->len);
        return 0;
    case KB_DEVD_PAYLOAD:
        if ((m->flags & KB_DEVD_SHARED) ? m->len != 0 || m->a < m->b
                                        : m->a < m->b || m->len != m->a - m->b)
            return kb_err_set(eb, KB_ERR_INVAL, "PAYLOAD to %llu bytes from %llu with %llu "
                              "data bytes", (unsigned long long)m->a, (unsigned long long)m->b,
                              (unsigned long long)m->len);
        return 0;
    case KB_DEVD_FLUSH:
        if (m->b > m->len / sizeof(uint64_t))
            return kb_err_set(eb, KB_ERR_INVAL, "FLUSH of %llu batches with %llu data bytes",
                              (unsigned long long)m->b, (unsigned long long)m->len);
        return 0;
    case KB_DEVD_QUERY:
        if (m->len < sizeof(kb_vquery))
            return kb_err_set(eb, KB_ERR_INVAL, "QUERY with %llu data bytes",
                              (unsigned long long)m->len);
        return 0;
    default: /* UPLOAD: any length up to the bound */
        return 0;
    }
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
    /* a pooled backend may still hold its last session's buffers: this one starts with none */
    s->arena_bytes = s->payload_bytes = 0;
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

/*
 * Maps at least `need` bytes of fd (a client's file) at *map (*len bytes mapped): kept when
 * large enough, else mapped again. The file must be a regular one (memfd) at least that long
 * and sealed against shrinking: a client that truncated it under the mapping would make the
 * server's next access a SIGBUS.
 */
static int map_file(int fd, size_t need, int prot, uint8_t **map, size_t *len, kb_errbuf *eb)
{
    struct stat st;
    int seals;
    void *p;
    if (*map && *len >= need)
        return 0;
    if (*map)
        munmap(*map, *len);
    *map = NULL;
    *len = 0;
    if (need == 0)
        return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return kb_err_set(eb, KB_ERR_INVAL, "device server: a client file that is no regular "
                          "file");
    if ((seals = fcntl(fd, F_GET_SEALS)) < 0 || !(seals & F_SEAL_SHRINK))
        return kb_err_set(eb, KB_ERR_INVAL, "device server: a client file not sealed against "
                          "shrinking (F_SEAL_SHRINK)");
    if ((uint64_t)st.st_size < need)
        return kb_err_set(eb, KB_ERR_RANGE, "device server: a client file of %lld bytes, "
                          "%zu wanted", (long long)st.st_size, need);
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

/* [off, off + n) inside the session's arena: 0, else KB_ERR_RANGE. */
static int in_arena(const session *s, const char *what, uint64_t off, uint64_t n,
                    kb_errbuf *eb)
{
    if (off <= s->arena_bytes && n <= s->arena_bytes - off)
        return 0;
    return kb_err_set(eb, KB_ERR_RANGE, "device server: %s [%llu, +%llu) outside the arena "
                      "of %llu bytes", what, (unsigned long long)off, (unsigned long long)n,
                      (unsigned long long)s->arena_bytes);
}

/* A new size of the arena or the payload against the server's bound. */
static int in_bound(const session *s, const char *what, uint64_t n, kb_errbuf *eb)
{
    uint64_t max = s->d->o->max_bytes;
    if (n <= SIZE_MAX && (max == 0 || n <= max))
        return 0;
    return kb_err_set(eb, KB_ERR_RANGE, "device server: %s of %llu bytes, more than the %llu "
                      "this server lends a session", what, (unsigned long long)n,
                      (unsigned long long)(max ? max : (uint64_t)SIZE_MAX));
}

/* A new block at the end of the arena (a = base, b = bytes), or a new arena (base 0). */
static int serve_block(session *s, const kb_devd_msg *m, kb_errbuf *eb)
{
    int rc;
    if (m->a != 0 && m->a != s->arena_bytes)
        return kb_err_set(eb, KB_ERR_RANGE, "device server: BLOCK at %llu, the arena has %llu "
                          "bytes", (unsigned long long)m->a, (unsigned long long)s->arena_bytes);
    if (m->b > UINT64_MAX - m->a)
        return kb_err_set(eb, KB_ERR_RANGE, "device server: BLOCK of %llu bytes at %llu",
                          (unsigned long long)m->b, (unsigned long long)m->a);
    if ((rc = in_bound(s, "arena", m->a + m->b, eb)) != 0)
        return rc;
    if (m->a == 0)
        s->arena_bytes = 0; /* the backend releases the old blocks */
    if ((rc = s->ops->block(s->dev, m->a, m->b, eb)) == 0)
        s->arena_bytes = m->a + m->b;
    return rc;
}

static int serve_payload(session *s, const kb_devd_msg *m, kb_errbuf *eb)
{
    int rc;
    if ((rc = in_bound(s, "payload", m->a, eb)) != 0)
        return rc;
    if (m->b > s->payload_bytes) /* "the device has these bytes": it must */
        return kb_err_set(eb, KB_ERR_RANGE, "device server: PAYLOAD from byte %llu of a payload "
                          "of %llu", (unsigned long long)m->b,
                          (unsigned long long)s->payload_bytes);
    if (m->flags & KB_DEVD_SHARED) { /* the client's own pages: map, upload, no copy */
        if (s->rfd >= 0) {
            unmap_file(&s->shm_fd, &s->shm, &s->shm_len);
            s->shm_fd = s->rfd;
            s->rfd = -1;
        }
        if (s->shm_fd < 0)
            return kb_err_set(eb, KB_ERR_INVAL, "device server: shared payload without a file");
        if ((rc = map_file(s->shm_fd, (size_t)m->a, PROT_READ, &s->shm, &s->shm_len, eb)) ==
                0 &&
            (rc = s->ops->payload(s->dev, s->shm, (size_t)m->a, (size_t)m->b, eb)) == 0)
            s->payload_bytes = m->a;
        return rc;
    }
    /* the client sends the bytes the device lacks; the primitive wants the whole area */
    if (grow(&s->payload, &s->payload_cap, (size_t)m->a) != 0)
        return kb_err_set(eb, KB_ERR_NOMEM, "device server: payload of %llu bytes",
                          (unsigned long long)m->a);
    if (m->len)
        memcpy(s->payload + m->b, s->buf, (size_t)m->len);
    if ((rc = s->ops->payload(s->dev, s->payload, (size_t)m->a, (size_t)m->b, eb)) == 0)
        s->payload_bytes = m->a;
    return rc;
}

static int serve_download(session *s, const kb_devd_msg *m)
{
    kb_errbuf eb = { { 0 } };
    int rc = in_arena(s, "DOWNLOAD", m->a, m->b, &eb);
    if (m->flags & KB_DEVD_SHARED) { /* into the client's staging file */
        if (s->rfd >= 0) {
            unmap_file(&s->stage_fd, &s->stage, &s->stage_len);
            s->stage_fd = s->rfd;
            s->rfd = -1;
        }
        if (rc == 0 && s->stage_fd < 0)
            rc = kb_err_set(&eb, KB_ERR_INVAL, "device server: shared download without a file");
        if (rc == 0 && (rc = map_file(s->stage_fd, (size_t)m->b, PROT_READ | PROT_WRITE,
                                      &s->stage, &s->stage_len, &eb)) == 0)
            rc = s->ops->download(s->dev, m->a, s->stage, m->b, &eb);
        return reply(s, rc, &eb, 0, 0, NULL, 0);
    }
    if (rc == 0 && m->b > KB_DEVD_MAX_MSG)
        rc = kb_err_set(&eb, KB_ERR_RANGE, "device server: DOWNLOAD of %llu bytes through the "
                        "socket, more than %llu", (unsigned long long)m->b,
                        (unsigned long long)KB_DEVD_MAX_MSG);
    if (rc == 0 && grow(&s->buf, &s->buf_cap, (size_t)m->b) != 0)
        rc = kb_err_set(&eb, KB_ERR_NOMEM, "device server: %llu bytes to download",
                        (unsigned long long)m->b);
    if (rc == 0)
        rc = s->ops->download(s->dev, m->a, s->buf, m->b, &eb);
    return reply(s, rc, &eb, 0, 0, s->buf, m->b);
}

/*
 * A flush, or one part of it (KB_DEVD_MORE: more follow, unanswered). The records are checked
 * against the session's arena and payload before any of the part runs: a client's records
 * reach the device's kernels as they are.
 */
static int serve_flush(session *s, const kb_devd_msg *m)
{
    const uint64_t *cnt = (const uint64_t *)s->buf;
    const kb_rec *recs = m->len ? (const kb_rec *)(s->buf + m->b * sizeof(uint64_t)) : NULL;
    uint64_t nrec = 0, room = (m->len - m->b * sizeof(uint64_t)) / sizeof(kb_rec);
    kb_errbuf eb = { { 0 } };
    int rc;

    uint64_t i = 0;
    for (; i < m->b && cnt[i] <= room - nrec; i++) /* no sum that could wrap */
        nrec += cnt[i];
    if (i < m->b || m->len != m->b * sizeof(uint64_t) + nrec * sizeof(kb_rec)) {
        kb_err_set(&eb, KB_ERR_INVAL, "FLUSH of %llu batches with %llu data bytes",
                   (unsigned long long)m->b, (unsigned long long)m->len);
        return refuse(s, KB_ERR_INVAL, &eb);
    }
    if (!s->flush_open) {
        s->flush_open = 1;
        s->flush_begun = 0;
        s->flush_a = m->a;
        s->flush_eb.msg[0] = '\0';
        s->flush_rc = in_arena(s, "FLUSH", 0, m->a, &s->flush_eb);
        if (s->flush_rc == 0 &&
            (s->flush_rc = s->be.ops->begin(s->be.self, NULL, m->a, NULL, 0, &s->flush_eb)) == 0)
            s->flush_begun = 1;
    } else if (m->a != s->flush_a) {
        kb_err_set(&eb, KB_ERR_INVAL, "FLUSH parts over arenas of %llu and %llu bytes",
                   (unsigned long long)s->flush_a, (unsigned long long)m->a);
        return refuse(s, KB_ERR_INVAL, &eb);
    }
    for (i = 0; s->flush_rc == 0 && i < nrec; i++)
        if ((s->flush_rc = kb_rec_check_placed(&recs[i], m->a, s->payload_bytes,
                                               &s->flush_eb)) != 0)
            kb_err_prefix(&s->flush_eb, "device server: FLUSH record %llu",
                          (unsigned long long)i);
    for (i = 0; s->flush_rc == 0 && i < m->b; i++) {
        s->flush_rc = s->be.ops->run_batch(s->be.self, recs, (size_t)cnt[i], &s->flush_eb);
        recs += cnt[i];
    }
    if (m->flags & KB_DEVD_MORE)
        return 0;
    s->flush_open = 0;
    rc = s->flush_rc;
    if (s->flush_begun) {
        if (rc == 0)
            rc = s->be.ops->end(s->be.self, NULL, m->a, &s->flush_eb);
        else { /* close the flush; its own error is the one to report */
            kb_errbuf ignored;
            s->be.ops->end(s->be.self, NULL, m->a, &ignored);
        }
    }
    double kms = kb_opencl_kernel_ms(&s->be);
    uint64_t bits;
    memcpy(&bits, &kms, sizeof bits);
    return reply(s, rc, &s->flush_eb, kb_opencl_launches(&s->be), bits, NULL, 0);
}

static int serve_query(session *s, const kb_devd_msg *m)
{
    kb_errbuf eb = { { 0 } };
    kb_vquery q;
    const uint64_t *off = (const uint64_t *)(s->buf + sizeof q);
    void *out = NULL;
    size_t outn;
    int rc = 0;

    memcpy(&q, s->buf, sizeof q);
    outn = kb_vquery_result_size(&q);
    if (m->len != sizeof q + (uint64_t)q.ntiles * sizeof(uint64_t) || outn == 0) {
        kb_err_set(&eb, KB_ERR_INVAL, "QUERY kind %u over %u tiles with %llu data bytes",
                   q.kind, q.ntiles, (unsigned long long)m->len);
        return refuse(s, KB_ERR_INVAL, &eb);
    }
    /* what each tile covers of the arena (kb_vquery.h): n f16 values, or tile_bytes */
    uint64_t per = kb_vquery_tile_bytes(&q);
    /* no tile, or empty ones: nothing to answer (a check would still loop over n columns);
     * fields out of their kind's range (kb_vquery_valid) are refused before a device sees
     * them */
    if (q.ntiles == 0 || per == 0 || outn > KB_DEVD_MAX_MSG || !kb_vquery_valid(&q))
        rc = kb_err_set(&eb, KB_ERR_RANGE, "device server: QUERY over %u tiles of %llu",
                        q.ntiles, (unsigned long long)per);
    for (uint32_t t = 0; rc == 0 && t < q.ntiles; t++)
        rc = in_arena(s, "QUERY tile", off[t], per, &eb);
    if (rc == 0 && !s->ops->query)
        rc = kb_err_set(&eb, KB_ERR_UNSUPPORTED, "device server: no device queries");
    else if (rc == 0 && !(out = malloc(outn)))
        rc = kb_err_set(&eb, KB_ERR_NOMEM, "device server: query result");
    else if (rc == 0)
        rc = s->ops->query(s->dev, &q, off, out, &eb);
    int w = reply(s, rc, &eb, 0, 0, out, outn);
    free(out);
    return w;
}

/* One request whose header is m (check_header passed) and whose data is in s->buf. -1: end
 * the session. */
static int serve_one(session *s, const kb_devd_msg *m)
{
    kb_errbuf eb = { { 0 } };
    int rc = 0;
    devd *d = s->d;

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
        if (m->b != KB_DEVD_PROTO || m->c != sizeof(kb_rec)) {
            kb_err_set(&eb, KB_ERR_DEVICE,
                       "device server (pid %d) speaks protocol %d with %zu-byte records; "
                       "this kbcl %llu with %llu-byte records (a different build: restart "
                       "the server)",
                       (int)getpid(), KB_DEVD_PROTO, sizeof(kb_rec), (unsigned long long)m->b,
                       (unsigned long long)m->c);
            (void)reply(s, KB_ERR_DEVICE, &eb, 0, 0, NULL, 0);
            s->end_rc = KB_ERR_DEVICE;
            s->end_eb = eb;
            say(d, "closed the connection of pid %ld: a client of another build (protocol "
                "%llu, %llu-byte records)", (long)s->peer_pid, (unsigned long long)m->b,
                (unsigned long long)m->c);
            return -1; /* nothing else it says can be read right */
        }
        if ((m->flags & 1) && !s->be.ops)
            rc = open_backend(s, &eb);
        return reply(s, rc, &eb, 0, 0, &s->hello, sizeof s->hello);
    case KB_DEVD_SHUTDOWN:
        pthread_mutex_lock(&d->mu);
        d->shutdown = 1;
        pthread_mutex_unlock(&d->mu);
        return reply(s, 0, &eb, 0, 0, NULL, 0);
    case KB_DEVD_BLOCK:
        return reply(s, serve_block(s, m, &eb), &eb, 0, 0, NULL, 0);
    case KB_DEVD_COPY:
        if ((rc = in_arena(s, "COPY to", m->a, m->c, &eb)) == 0 &&
            (rc = in_arena(s, "COPY from", m->b, m->c, &eb)) == 0)
            rc = s->ops->copy(s->dev, m->a, m->b, m->c, &eb);
        return reply(s, rc, &eb, 0, 0, NULL, 0);
    case KB_DEVD_FILL:
        if ((rc = in_arena(s, "FILL", m->a, m->b, &eb)) == 0)
            rc = s->ops->fill(s->dev, m->a, m->b, (uint8_t)m->c, &eb);
        return reply(s, rc, &eb, 0, 0, NULL, 0);
    case KB_DEVD_UPLOAD:
        if ((rc = in_arena(s, "UPLOAD", m->a, m->len, &eb)) == 0)
            rc = s->ops->upload(s->dev, m->a, s->buf, m->len, &eb);
        return reply(s, rc, &eb, 0, 0, NULL, 0);
    case KB_DEVD_DOWNLOAD:
        return serve_download(s, m);
    case KB_DEVD_PAYLOAD:
        return reply(s, serve_payload(s, m, &eb), &eb, 0, 0, NULL, 0);
    case KB_DEVD_FLUSH:
        return serve_flush(s, m);
    case KB_DEVD_QUERY:
        return serve_query(s, m);
    default: /* check_header lets none through */
        kb_err_set(&eb, KB_ERR_INVAL, "unknown request %u", m->op);
        return refuse(s, KB_ERR_INVAL, &eb);
    }
}

/* A request's turn: at most d->rate a second, after a burst of as many (sleeps, never
 * refuses: a client that asks fast only waits). */
static void throttle(session *s)
{
    double now = mono_s(), rate = s->d->rate;
    s->tokens += (now - s->tlast) * rate;
    s->tlast = now;
    if (s->tokens > rate)
        s->tokens = rate;
    if (s->tokens < 1.0) {
        double wait = (1.0 - s->tokens) / rate;
        struct timespec ts = { (time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9) };
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        s->tokens = 1.0;
        s->tlast = mono_s();
    }
    s->tokens -= 1.0;
}

/* Reads and serves requests until the peer goes, a request ends the session, or the server
 * closes it (s->end_rc). */
static void session_loop(session *s)
{
    devd *d = s->d;
    kb_devd_msg m;
    kb_errbuf eb;
    int r, some;

    s->tokens = d->rate;
    s->tlast = mono_s();
    for (;;) {
        eb.msg[0] = '\0';
        /* between requests a client may think for as long as it likes, once it said hello */
        r = kb_devd_recv_fd_timed(s->fd, &m, sizeof m, &s->rfd, s->nreq ? -1 : d->io_ms,
                                  d->io_ms, &some);
        if (r == -2) {
            kb_err_set(&eb, KB_ERR_INVAL, some ? "a request header stalled for %.3g s"
                                               : "no request within %.3g s of connecting",
                       d->io_ms / 1e3);
            refuse(s, KB_ERR_INVAL, &eb);
            break;
        }
        if (r != 0)
            break; /* the peer is gone (a part of a header is no request) */
        s->nreq++;
        throttle(s);
        if (check_header(s, &m, &eb) != 0) {
            refuse(s, KB_ERR_INVAL, &eb);
            break;
        }
        if (m.len && grow(&s->buf, &s->buf_cap, (size_t)m.len) != 0) {
            kb_err_set(&eb, KB_ERR_NOMEM, "%s of %llu data bytes: out of memory",
                       op_name(m.op), (unsigned long long)m.len);
            refuse(s, KB_ERR_NOMEM, &eb);
            break;
        }
        if (m.len && (r = kb_devd_read_timed(s->fd, s->buf, (size_t)m.len, d->io_ms)) != 0) {
            if (r == -2) {
                kb_err_set(&eb, KB_ERR_INVAL, "%s data stalled for %.3g s", op_name(m.op),
                           d->io_ms / 1e3);
                refuse(s, KB_ERR_INVAL, &eb);
            }
            break;
        }
        int stop = serve_one(s, &m) != 0;
        if (s->rfd >= 0) { /* a descriptor no request took */
            close(s->rfd);
            s->rfd = -1;
        }
        if (stop)
            break;
    }
}

/* The session's end: its files and buffers, and its backend to the pool or destroyed. */
static void session_close(session *s)
{
    devd *d = s->d;
    if (s->rfd >= 0)
        close(s->rfd);
    s->rfd = -1;
    unmap_file(&s->shm_fd, &s->shm, &s->shm_len);
    unmap_file(&s->stage_fd, &s->stage, &s->stage_len);
    if (s->be.ops) {
        int kept = 0;
        if (s->flush_open && s->flush_begun) { /* a flush cut off between its parts */
            kb_errbuf ignored;
            s->be.ops->end(s->be.self, NULL, s->flush_a, &ignored);
        }
        /* the device memory goes either way; the queue, kernels and tables may stay. Not after
         * a device error: a buffer the driver failed to back (NVIDIA allocates at first use)
         * would fail every later session that got this backend from the pool */
        if (!s->dev_failed && d->o->recycle && d->o->recycle(d->o->arg, &s->be) == 0) {
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
        pthread_mutex_lock(&d->mu);
        d->open--;
        d->last_busy = mono_s();
        pthread_mutex_unlock(&d->mu);
    }
    free(s->payload);
    free(s->buf);
    s->payload = s->buf = NULL;
}

static void session_init(session *s, devd *d, int fd)
{
    memset(s, 0, sizeof *s);
    s->d = d;
    s->fd = fd;
    s->shm_fd = -1;
    s->stage_fd = -1;
    s->rfd = -1;
}

static void *session_main(void *arg)
{
    session *s = arg;
    session_loop(s);
    session_close(s);
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

/*
 * The second gate after the folder: a peer of another uid (root's processes pass any folder's
 * permissions) is closed before it is read. Once per refused connection, a log line.
 */
static int peer_ok(const devd *d, int fd, long *pid)
{
    struct ucred uc;
    socklen_t n = sizeof uc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &n) != 0 || n != sizeof uc) {
        say(d, "refused a connection whose credentials cannot be read: %s", strerror(errno));
        return 0;
    }
    *pid = (long)uc.pid;
    if (uc.uid == geteuid())
        return 1;
    say(d, "refused a connection from pid %ld, uid %lu: this server serves uid %lu only",
        (long)uc.pid, (unsigned long)uc.uid, (unsigned long)geteuid());
    return 0;
}

static void devd_init(devd *d, const kb_devd_opts *o)
{
    memset(d, 0, sizeof *d);
    d->o = o;
    d->started = d->last_busy = mono_s();
    pthread_mutex_init(&d->mu, NULL);
    if (o->setup)
        d->setup = *o->setup;
    snprintf(d->desc, sizeof d->desc, "%s", o->desc ? o->desc : o->device);
    d->io_ms = (int)((o->io_timeout_s > 0 ? o->io_timeout_s : KB_DEVD_IO_TIMEOUT_S) * 1e3);
    if (d->io_ms < 1)
        d->io_ms = 1;
    d->rate = o->rate_hz > 0 ? o->rate_hz : KB_DEVD_RATE_HZ;
}

static void devd_fini(devd *d)
{
    for (int i = 0; i < d->npool; i++) {
        d->pool[i].be.ops->destroy(d->pool[i].be.self);
        free(d->pool[i].buf);
    }
    free(d->s);
    pthread_mutex_destroy(&d->mu);
}

int kb_devd_serve_conn(const kb_devd_opts *o, int fd, kb_errbuf *eb)
{
    devd d;
    session *s;
    int rc;

    if (!o || !o->session || !o->device)
        return kb_err_set(eb, KB_ERR_INVAL, "device server: missing options");
    if (!(s = malloc(sizeof *s)))
        return kb_err_set(eb, KB_ERR_NOMEM, "device server: out of memory");
    devd_init(&d, o);
    session_init(s, &d, fd);
    struct ucred uc;
    socklen_t n = sizeof uc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &n) == 0 && n == sizeof uc)
        s->peer_pid = (long)uc.pid;
    session_loop(s);
    session_close(s);
    rc = s->end_rc;
    if (rc)
        kb_err_set(eb, rc, "%s", s->end_eb.msg);
    free(s);
    devd_fini(&d);
    return rc;
}

int kb_devd_serve(const kb_devd_opts *o, kb_errbuf *eb)
{
    devd d;
    int lfd, rc = 0;

    if (!o || !o->path || !o->session || !o->device)
        return kb_err_set(eb, KB_ERR_INVAL, "device server: missing options");
    if ((rc = kb_devd_dir_check(o->path, 1, eb)) != 0)
        return rc;
    lfd = listen_on(o->path, eb);
    if (lfd < 0)
        return lfd;
    devd_init(&d, o);
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
        long pid = 0;
        if (!peer_ok(&d, cfd, &pid)) {
            close(cfd);
            continue;
        }
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
        session_init(s, &d, cfd);
        s->peer_pid = pid;
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
    devd_fini(&d);
    return rc;
}
