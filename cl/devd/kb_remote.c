/*
 * kb_remote — a Phase-2 backend served by a device server (kb_remote.h; the protocol:
 * kb_devd_proto.h).
 */
#include "kb_remote.h"

#include <errno.h>
#include <fcntl.h>
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

typedef struct rbe {
    int fd;             /* -1 once the connection is lost */
    kb_resident *res;
    char path[128];
    kb_devd_hello hello;
    kb_opencl_setup setup;
    /* the flush being collected: batch sizes and records, sent by end(). The planner's
     * batches are consecutive in one array: while they are, only a pointer is kept (ext);
     * otherwise they are copied into own[]. */
    uint64_t *cnt;
    size_t ncnt, cntcap;
    const kb_rec *ext;
    kb_rec *own;
    size_t nrec, owncap;
    /* read-ahead: a copy of arena bytes [ra_off, ra_off + ra_n), valid until the next
     * request that changes the device (a flush, upload, fill, copy, new block) */
    uint8_t *ra;
    uint64_t ra_off, ra_n;
    size_t ra_cap;
    uint64_t *blk_end;  /* the arena's blocks' ends (read-ahead stays inside one block) */
    size_t nblk, blkcap;
    uint64_t arena_bytes;
    int active, failed;
    uint64_t launches;
    double kernel_ms;
    /* the staging file downloads land in (KB_DEVD_SHARED; -2 until the first download tries
     * to make it, -1 where memfd is refused): stage_cap bytes mapped at stage */
    int stage_fd, stage_sent;
    uint8_t *stage;
    size_t stage_cap;
    /* the payload file the server has (KB_DEVD_SHARED) */
    int shm_sent;
    ino_t shm_ino;
    dev_t shm_dev;
    /* Pipelining: end() sends a flush and returns; its reply is read by the next request
     * (settle). A flush that failed there breaks the session: every later request returns
     * its error (brk_rc, brk), since the device's data is no longer known. */
    int pending;
    int brk_rc;
    kb_errbuf brk;
} rbe;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * One request and its reply on fd: header m, data d1[n1] then d2[n2]; the reply's data (at
 * most `cap` bytes) goes to out. Returns the reply's rc (its message in eb), or KB_ERR_DEVICE
 * when the connection fails (*lost set).
 */
static int send_req(int fd, const char *path, kb_devd_msg *m, int passfd, const void *d1,
                    size_t n1, const void *d2, size_t n2, int *lost, kb_errbuf *eb)
{
    m->len = n1 + n2;
    if (kb_devd_send_fd(fd, m, sizeof *m, passfd) != 0 ||
        (n1 && kb_devd_write_full(fd, d1, n1) != 0) ||
        (n2 && kb_devd_write_full(fd, d2, n2) != 0)) {
        if (lost)
            *lost = 1;
        return kb_err_set(eb, KB_ERR_DEVICE, "device server %s: connection lost", path);
    }
    return 0;
}

/* Reads one reply (see call_fd). */
static int read_rep(int fd, const char *path, kb_devd_rep *rep, void *out, size_t cap,
                    int *lost, kb_errbuf *eb)
{
    kb_devd_rep r;
    if (kb_devd_read_full(fd, &r, sizeof r) != 0)
        goto lost;
    if (r.rc) {
        char msg[sizeof eb->msg];
        size_t k = r.msglen < sizeof msg - 1 ? r.msglen : sizeof msg - 1;
        if (kb_devd_read_full(fd, msg, k) != 0)
            goto lost;
        for (size_t left = r.msglen - k; left > 0;) { /* a longer message than ours: skip */
            char skip[256];
            size_t s = left < sizeof skip ? left : sizeof skip;
            if (kb_devd_read_full(fd, skip, s) != 0)
                goto lost;
            left -= s;
        }
        msg[k] = '\0';
        return kb_err_set(eb, r.rc < 0 ? r.rc : KB_ERR_DEVICE, "%s", msg);
    }
    if (r.len > cap)
        goto lost; /* not what we asked for: the stream cannot be trusted any more */
    if (r.len && kb_devd_read_full(fd, out, (size_t)r.len) != 0)
        goto lost;
    if (rep)
        *rep = r;
    return 0;
lost:
    if (lost)
        *lost = 1;
    return kb_err_set(eb, KB_ERR_DEVICE, "device server %s: connection lost", path);
}

static int call_fd(int fd, const char *path, kb_devd_msg *m, int passfd, const void *d1,
                   size_t n1, const void *d2, size_t n2, kb_devd_rep *rep, void *out, size_t cap,
                   int *lost, kb_errbuf *eb)
{
    int rc = send_req(fd, path, m, passfd, d1, n1, d2, n2, lost, eb);
    return rc ? rc : read_rep(fd, path, rep, out, cap, lost, eb);
}

static int call(int fd, const char *path, kb_devd_msg *m, const void *d1, size_t n1,
                const void *d2, size_t n2, kb_devd_rep *rep, void *out, size_t cap, int *lost,
                kb_errbuf *eb)
{
    return call_fd(fd, path, m, -1, d1, n1, d2, n2, rep, out, cap, lost, eb);
}

/*
 * A server is trusted with this process's data (the payload, the results) only when nobody
 * else could have put it there: its folder passes the server's own checks, the socket is this
 * user's, and the process that listens on it runs as this user (SO_PEERCRED).
 */
static int connect_to(const char *path, kb_errbuf *eb)
{
    struct sockaddr_un sa;
    struct stat st;
    struct ucred uc;
    socklen_t n = sizeof uc;
    int fd, rc;

    if ((rc = kb_devd_dir_check(path, 0, eb)) != 0)
        return rc;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT)
            return kb_err_set(eb, KB_ERR_IO, "device server %s: %s", path, strerror(errno));
        return kb_err_set(eb, KB_ERR_NOTFOUND, "no device server at %s", path);
    }
    if (!S_ISSOCK(st.st_mode))
        return kb_err_set(eb, KB_ERR_NOTFOUND, "no device server at %s", path);
    if (st.st_uid != geteuid())
        return kb_err_set(eb, KB_ERR_STATE, "device server socket %s belongs to uid %lu, not "
                          "to this user (uid %lu): not used", path, (unsigned long)st.st_uid,
                          (unsigned long)geteuid());
    if ((fd = kb_devd_socket(path, &sa, eb)) < 0)
        return fd;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        if (e == ENOENT || e == ECONNREFUSED)
            return kb_err_set(eb, KB_ERR_NOTFOUND, "no device server at %s", path);
        return kb_err_set(eb, KB_ERR_IO, "device server %s: %s", path, strerror(e));
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &n) != 0 || n != sizeof uc) {
        int e = errno;
        close(fd);
        return kb_err_set(eb, KB_ERR_IO, "device server %s: its credentials: %s", path,
                          strerror(e));
    }
    if (uc.uid != geteuid()) {
        close(fd);
        return kb_err_set(eb, KB_ERR_STATE, "device server %s runs as uid %lu (pid %ld), not "
                          "as this user (uid %lu): not used", path, (unsigned long)uc.uid,
                          (long)uc.pid, (unsigned long)geteuid());
    }
    return fd;
}

/* HELLO on a new connection; *fd_out the connection (closed on failure). */
static int hello(const char *path, int session, int *fd_out, kb_devd_hello *h, kb_errbuf *eb)
{
    kb_devd_msg m = { KB_DEVD_HELLO, (uint32_t)session, KB_DEVD_MAGIC, KB_DEVD_PROTO,
                      sizeof(kb_rec), 0 };
    kb_devd_rep r;
    int fd = connect_to(path, eb), rc;
    if (fd < 0)
        return fd;
    memset(h, 0, sizeof *h);
    int lost = 0;
    rc = call(fd, path, &m, NULL, 0, NULL, 0, &r, h, sizeof *h, &lost, eb);
    if (lost) /* accepted by the kernel, closed unanswered: a server that is stopping */
        rc = kb_err_set(eb, KB_ERR_NOTFOUND, "device server %s: stopping", path);
    if (rc == 0 && r.len != sizeof *h)
        rc = kb_err_set(eb, KB_ERR_DEVICE, "device server %s: a hello of %llu bytes", path,
                        (unsigned long long)r.len);
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* ------------------------------------------------------------------ resident primitives */

static void drop(rbe *b)
{
    close(b->fd);
    b->fd = -1;
}

/*
 * Reads the reply of the flush in flight, if any; then fails when a flush ever failed. Every
 * request starts here, so replies stay in order and no result of a failed replay is served.
 */
static int settle(rbe *b, kb_errbuf *eb)
{
    if (b->pending) {
        kb_devd_rep r;
        int lost = 0, rc;
        b->pending = 0;
        if (b->fd < 0)
            rc = kb_err_set(&b->brk, KB_ERR_DEVICE, "device server %s: connection lost", b->path);
        else
            rc = read_rep(b->fd, b->path, &r, NULL, 0, &lost, &b->brk);
        if (lost)
            drop(b);
        if (rc == 0) {
            b->launches = r.a;
            memcpy(&b->kernel_ms, &r.b, sizeof b->kernel_ms);
        } else {
            kb_err_prefix(&b->brk, "a pipelined replay");
            b->brk_rc = rc;
        }
    }
    if (b->brk_rc)
        return kb_err_set(eb, b->brk_rc, "%s", b->brk.msg);
    return 0;
}

static int rcall(rbe *b, kb_devd_msg *m, const void *d, size_t n, void *out, size_t cap,
                 kb_errbuf *eb)
{
    int lost = 0, rc;
    if ((rc = settle(b, eb)) != 0)
        return rc;
    if (b->fd < 0)
        return kb_err_set(eb, KB_ERR_DEVICE, "device server %s: connection lost", b->path);
    rc = call(b->fd, b->path, m, d, n, NULL, 0, NULL, out, cap, &lost, eb);
    if (lost)
        drop(b);
    return rc;
}

static int r_block(void *dev, uint64_t base, uint64_t bytes, kb_errbuf *eb)
{
    kb_devd_msg m = { KB_DEVD_BLOCK, 0, base, bytes, 0, 0 };
    rbe *b = dev;
    int rc;
    b->ra_n = 0;
    if (b->nblk == b->blkcap) {
        size_t c = b->blkcap ? 2 * b->blkcap : 8;
        uint64_t *e = realloc(b->blk_end, c * sizeof *e);
        if (!e)
            return kb_err_set(eb, KB_ERR_NOMEM, "remote backend: blocks");
        b->blk_end = e;
        b->blkcap = c;
    }
    if ((rc = rcall(dev, &m, NULL, 0, NULL, 0, eb)) == 0) {
        if (base == 0)
            b->nblk = 0;
        b->blk_end[b->nblk++] = base + bytes;
    }
    return rc;
}

/* The end of the block holding arena offset off (0 when none). */
static uint64_t blk_end_of(const rbe *b, uint64_t off)
{
    size_t lo = 0, hi = b->nblk;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (b->blk_end[mid] <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < b->nblk ? b->blk_end[lo] : 0;
}

static int r_copy(void *dev, uint64_t to, uint64_t from, uint64_t n, kb_errbuf *eb)
{
    kb_devd_msg m = { KB_DEVD_COPY, 0, to, from, n, 0 };
    ((rbe *)dev)->ra_n = 0;
    return rcall(dev, &m, NULL, 0, NULL, 0, eb);
}

static int r_fill(void *dev, uint64_t off, uint64_t n, uint8_t byte, kb_errbuf *eb)
{
    kb_devd_msg m = { KB_DEVD_FILL, 0, off, n, byte, 0 };
    ((rbe *)dev)->ra_n = 0;
    return rcall(dev, &m, NULL, 0, NULL, 0, eb);
}

/* The bytes of one request: at most KB_DEVD_MAX_MSG (the server's bound). */
static uint64_t chunk(uint64_t left)
{
    return left < KB_DEVD_MAX_MSG ? left : KB_DEVD_MAX_MSG;
}

static int r_upload(void *dev, uint64_t off, const void *src, uint64_t n, kb_errbuf *eb)
{
    uint64_t done = 0;
    int rc;
    ((rbe *)dev)->ra_n = 0;
    if (n > SIZE_MAX)
        return kb_err_set(eb, KB_ERR_NOMEM, "device server: upload of %llu bytes",
                          (unsigned long long)n);
    do {
        kb_devd_msg m = { KB_DEVD_UPLOAD, 0, off + done, 0, 0, 0 };
        uint64_t k = chunk(n - done);
        if ((rc = rcall(dev, &m, (const uint8_t *)src + done, (size_t)k, NULL, 0, eb)) != 0)
            return rc;
        done += k;
    } while (done < n);
    return 0;
}

/* Arena bytes [off, off + n) through the socket into dst. */
static int download_copy(rbe *b, uint64_t off, uint8_t *dst, uint64_t n, kb_errbuf *eb)
{
    uint64_t done = 0;
    int rc;
    do {
        kb_devd_msg m = { KB_DEVD_DOWNLOAD, 0, off + done, chunk(n - done), 0, 0 };
        if ((rc = rcall(b, &m, NULL, 0, dst + done, (size_t)m.b, eb)) != 0)
            return rc;
        done += m.b;
    } while (done < n);
    return 0;
}

/*
 * A host read asks for one range at a time (a check reads rank after rank), and a round trip
 * costs more than the bytes: a small read brings KB_REMOTE_READ_AHEAD bytes (clipped to its
 * block of the arena) and later reads inside them are served here.
 */
#define KB_REMOTE_READ_AHEAD ((uint64_t)1 << 20)

/* The staging file holds at least `need` bytes (made on first use). 0, or -1 when there is
 * none (memfd refused, out of memory): downloads then come through the socket. */
static int stage_ensure(rbe *b, size_t need)
{
    size_t cap;
    void *p;
    if (b->stage_fd == -2) {
        /* the server maps it: sealed so that it can never shrink under that mapping */
        b->stage_fd = memfd_create("kbcl-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (b->stage_fd >= 0 && fcntl(b->stage_fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
            close(b->stage_fd);
            b->stage_fd = -1;
        }
    }
    if (b->stage_fd < 0)
        return -1;
    if (b->stage && b->stage_cap >= need)
        return 0;
    cap = b->stage_cap ? b->stage_cap : KB_REMOTE_READ_AHEAD;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : 2 * cap;
    if (ftruncate(b->stage_fd, (off_t)cap) != 0)
        return -1;
    p = b->stage ? mremap(b->stage, b->stage_cap, cap, MREMAP_MAYMOVE)
                 : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, b->stage_fd, 0);
    if (p == MAP_FAILED)
        return -1;
    b->stage = p;
    b->stage_cap = cap;
    return 0;
}

static int r_download(void *dev, uint64_t off, void *dst, uint64_t n, kb_errbuf *eb)
{
    rbe *b = dev;
    uint64_t want = n;
    const uint8_t *ra = b->stage_fd >= 0 ? b->stage : b->ra;
    int rc;

    if (n > SIZE_MAX)
        return kb_err_set(eb, KB_ERR_NOMEM, "device server: download of %llu bytes",
                          (unsigned long long)n);
    if (b->ra_n && off >= b->ra_off && off - b->ra_off <= b->ra_n &&
        n <= b->ra_n - (off - b->ra_off)) {
        memcpy(dst, ra + (off - b->ra_off), (size_t)n);
        return 0;
    }
    uint64_t end = blk_end_of(b, off);
    if (n < KB_REMOTE_READ_AHEAD && end > off) {
        want = end - off < KB_REMOTE_READ_AHEAD ? end - off : KB_REMOTE_READ_AHEAD;
        if (want < n)
            want = n;
    }
    b->ra_n = 0;
    if ((rc = settle(b, eb)) != 0)
        return rc;
    if (b->fd >= 0 && stage_ensure(b, (size_t)want) == 0) {
        /* the server writes into our staging file: no bytes through the socket */
        kb_devd_msg m = { KB_DEVD_DOWNLOAD, KB_DEVD_SHARED, off, want, 0, 0 };
        int lost = 0;
        rc = call_fd(b->fd, b->path, &m, b->stage_sent ? -1 : b->stage_fd, NULL, 0, NULL, 0,
                     NULL, NULL, 0, &lost, eb);
        if (lost)
            drop(b);
        if (rc)
            return rc;
        b->stage_sent = 1;
        b->ra_off = off;
        b->ra_n = want;
        memcpy(dst, b->stage, (size_t)n);
        return 0;
    }
    if (want == n)
        return download_copy(b, off, dst, n, eb);
    if (b->ra_cap < want) {
        uint8_t *p = realloc(b->ra, (size_t)want);
        if (!p)
            return kb_err_set(eb, KB_ERR_NOMEM, "remote backend: read-ahead buffer");
        b->ra = p;
        b->ra_cap = (size_t)want;
    }
    if ((rc = download_copy(b, off, b->ra, want, eb)) != 0)
        return rc;
    b->ra_off = off;
    b->ra_n = want;
    memcpy(dst, b->ra, (size_t)n);
    return 0;
}

static int r_payload(void *dev, const uint8_t *p, size_t size, size_t have, kb_errbuf *eb)
{
    rbe *b = dev;
    kb_devd_msg m = { KB_DEVD_PAYLOAD, 0, size, have, 0, 0 };
    const kb_oplog *log = kb_resident_log(b->res);
    int pfd = log && kb_oplog_payload(log) == p ? kb_oplog_payload_fd(log) : -1;
    struct stat st;

    if (have > size)
        return kb_err_set(eb, KB_ERR_INVAL, "device server: payload shrinks");
    int src = settle(b, eb);
    if (src)
        return src;
    if (pfd >= 0 && fstat(pfd, &st) == 0 && b->fd >= 0) {
        /* the payload is a shared-memory file: the server maps it (sent once per file) */
        int lost = 0, rc;
        int send = !(b->shm_sent && st.st_ino == b->shm_ino && st.st_dev == b->shm_dev);
        m.flags = KB_DEVD_SHARED;
        rc = call_fd(b->fd, b->path, &m, send ? pfd : -1, NULL, 0, NULL, 0, NULL, NULL, 0, &lost,
                     eb);
        if (lost)
            drop(b);
        if (rc == 0 && send) {
            b->shm_sent = 1;
            b->shm_ino = st.st_ino;
            b->shm_dev = st.st_dev;
        }
        return rc;
    }
    do { /* the bytes the device lacks, in requests the server takes */
        size_t k = (size_t)chunk(size - have);
        m.a = have + k;
        m.b = have;
        if ((src = rcall(dev, &m, p + have, k, NULL, 0, eb)) != 0)
            return src;
        have += k;
    } while (have < size);
    return 0;
}

static int r_query(void *dev, const kb_vquery *q, const uint64_t *off, void *out,
                   kb_errbuf *eb)
{
    kb_devd_msg m = { KB_DEVD_QUERY, 0, 0, 0, 0, 0 };
    rbe *b = dev;
    int lost = 0, rc;
    if ((rc = settle(b, eb)) != 0)
        return rc;
    if (b->fd < 0)
        return kb_err_set(eb, KB_ERR_DEVICE, "device server %s: connection lost", b->path);
    rc = call(b->fd, b->path, &m, q, sizeof *q, off, (size_t)q->ntiles * sizeof *off, NULL, out,
              kb_vquery_result_size(q), &lost, eb);
    if (lost)
        drop(b);
    return rc;
}

static const kb_resident_ops r_ops = {
    r_block, r_copy, r_fill, r_upload, r_download, r_payload, r_query,
};

/* ------------------------------------------------------------------ backend */

static int rb_begin(void *self, uint8_t *arena, uint64_t arena_bytes, const uint8_t *payload,
                    size_t payload_bytes, kb_errbuf *eb)
{
    rbe *b = self;
    int rc;
    (void)payload;
    (void)payload_bytes;
    if (b->active)
        return kb_err_set(eb, KB_ERR_STATE, "remote backend: begin inside a flush");
    if ((rc = settle(b, eb)) != 0)
        return rc;
    if (arena)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED,
                          "remote backend: host-arena flushes are not served (only "
                          "device-resident replay goes through a device server)");
    b->ncnt = 0;
    b->nrec = 0;
    b->ext = NULL;
    b->arena_bytes = arena_bytes;
    b->failed = 0;
    b->active = 1;
    return 0;
}

static int rb_run_batch(void *self, const kb_rec *recs, size_t n, kb_errbuf *eb)
{
    rbe *b = self;
    if (!b->active)
        return kb_err_set(eb, KB_ERR_STATE, "remote backend: run_batch outside begin/end");
    if (b->ncnt == b->cntcap) {
        size_t c = b->cntcap ? 2 * b->cntcap : 64;
        uint64_t *t = realloc(b->cnt, c * sizeof *t);
        if (!t)
            goto nomem;
        b->cnt = t;
        b->cntcap = c;
    }
    if (b->ncnt == 0 || (b->ext && recs == b->ext + b->nrec)) {
        b->ext = b->ncnt == 0 ? recs : b->ext; /* consecutive: no copy */
    } else {
        if (b->nrec + n > b->owncap) {
            size_t c = b->owncap ? b->owncap : 256;
            while (c < b->nrec + n)
                c *= 2;
            kb_rec *t = realloc(b->own, c * sizeof *t);
            if (!t)
                goto nomem;
            b->own = t;
            b->owncap = c;
        }
        if (b->ext) { /* the batches so far were the caller's: copy them first */
            memcpy(b->own, b->ext, b->nrec * sizeof *b->own);
            b->ext = NULL;
        }
        memcpy(b->own + b->nrec, recs, n * sizeof *recs);
    }
    b->nrec += n;
    b->cnt[b->ncnt++] = n;
    return 0;
nomem:
    b->failed = 1;
    return kb_err_set(eb, KB_ERR_NOMEM, "remote backend: out of memory collecting a flush");
}

/*
 * A flush larger than a request may be (KB_DEVD_MAX_MSG) goes in parts, all but the last
 * flagged KB_DEVD_MORE (unanswered). A batch may be cut between two parts: its records are
 * independent of each other (kb_replay.h), so running them as two batches gives the same bytes.
 */
static int send_parts(rbe *b, uint64_t arena_bytes, int *lost, kb_errbuf *eb)
{
    const kb_rec *r = b->ext ? b->ext : b->own;
    uint64_t *pc = malloc(b->ncnt * sizeof *pc);
    size_t bi = 0;
    uint64_t used = 0; /* records of batch bi already sent */
    int rc = 0;

    if (!pc)
        return kb_err_set(eb, KB_ERR_NOMEM, "remote backend: out of memory sending a flush");
    while (rc == 0 && bi < b->ncnt) {
        size_t np = 0;
        uint64_t bytes = 0, nr = 0;
        while (bi < b->ncnt && bytes + sizeof *pc <= KB_DEVD_MAX_MSG) {
            uint64_t left = b->cnt[bi] - used;
            uint64_t fit = (KB_DEVD_MAX_MSG - bytes - sizeof *pc) / sizeof(kb_rec);
            uint64_t k = left < fit ? left : fit;
            if (k == 0 && left > 0)
                break;
            pc[np++] = k;
            bytes += sizeof *pc + k * sizeof(kb_rec);
            nr += k;
            used += k;
            if (used == b->cnt[bi]) {
                bi++;
                used = 0;
            }
        }
        kb_devd_msg m = { KB_DEVD_FLUSH, bi < b->ncnt ? KB_DEVD_MORE : 0, arena_bytes, np, 0,
                          0 };
        rc = send_req(b->fd, b->path, &m, -1, pc, np * sizeof *pc, r, nr * sizeof(kb_rec), lost,
                      eb);
        r += nr;
    }
    free(pc);
    return rc;
}

static int rb_end(void *self, uint8_t *arena, uint64_t arena_bytes, kb_errbuf *eb)
{
    rbe *b = self;
    kb_devd_msg m = { KB_DEVD_FLUSH, 0, arena_bytes, b->ncnt, 0, 0 };
    int lost = 0, rc;

    if (!b->active)
        return kb_err_set(eb, KB_ERR_STATE, "remote backend: end without begin");
    b->active = 0;
    if (b->failed)
        return kb_err_set(eb, KB_ERR_STATE, "remote backend: end after a failed batch");
    if (arena || arena_bytes != b->arena_bytes)
        return kb_err_set(eb, KB_ERR_STATE, "remote backend: end does not match begin");
    if (b->fd < 0)
        return kb_err_set(eb, KB_ERR_DEVICE, "device server %s: connection lost", b->path);
    b->ra_n = 0;
    /* Once sent, the records are the server's (the socket has copied them): the reply is read
     * by the next request (settle), and meanwhile this process simulates on. */
    if (b->ncnt * sizeof *b->cnt + b->nrec * sizeof(kb_rec) <= KB_DEVD_MAX_MSG)
        rc = send_req(b->fd, b->path, &m, -1, b->cnt, b->ncnt * sizeof *b->cnt,
                      b->ext ? b->ext : b->own, b->nrec * sizeof(kb_rec), &lost, eb);
    else
        rc = send_parts(b, arena_bytes, &lost, eb);
    b->ext = NULL; /* the caller's array is theirs again */
    if (lost)
        drop(b);
    if (rc == 0)
        b->pending = 1;
    return rc;
}

static int rb_sync(void *self, kb_errbuf *eb)
{
    return settle(self, eb);
}

static void rb_destroy(void *self)
{
    rbe *b = self;
    if (!b)
        return;
    kb_resident_destroy(b->res); /* may still pull a bound store's data */
    if (b->fd >= 0)
        close(b->fd);            /* the server ends the session and frees its device memory */
    free(b->cnt);
    free(b->own);
    free(b->ra);
    free(b->blk_end);
    if (b->stage)
        munmap(b->stage, b->stage_cap);
    if (b->stage_fd >= 0)
        close(b->stage_fd);
    free(b);
}

static kb_resident *rb_resident(void *self)
{
    return ((rbe *)self)->res;
}

static const kb_backend_ops rb_ops = {
    .name = "remote",
    .kind = KB_BACKEND_REMOTE,
    .begin = rb_begin,
    .run_batch = rb_run_batch,
    .end = rb_end,
    .destroy = rb_destroy,
    .resident = rb_resident,
    .sync = rb_sync,
};

int kb_remote_backend_create(const char *path, kb_backend *out, char *desc, size_t desc_n,
                             kb_errbuf *eb)
{
    double t0 = now_ms();
    rbe *b;
    int rc;

    out->ops = NULL;
    out->self = NULL;
    b = calloc(1, sizeof *b);
    if (!b || (b->res = kb_resident_create(&r_ops, b)) == NULL) {
        free(b);
        return kb_err_set(eb, KB_ERR_NOMEM, "remote backend: out of memory");
    }
    b->fd = -1;
    b->stage_fd = -2;
    snprintf(b->path, sizeof b->path, "%s", path);
    if ((rc = hello(path, 1, &b->fd, &b->hello, eb)) != 0) {
        rb_destroy(b);
        return rc;
    }
    b->setup = b->hello.setup;
    b->setup.discover_ms = 0.0;
    b->setup.context_ms = now_ms() - t0 - b->hello.session_ms;
    b->setup.program_ms = b->hello.session_ms;
    b->setup.total_ms = now_ms() - t0;
    snprintf(b->setup.note, sizeof b->setup.note, "device server %.200s (pid %d)", path,
             (int)b->hello.pid);
    if (desc && desc_n)
        snprintf(desc, desc_n, "%s via kbcl devd", b->hello.desc);
    out->ops = &rb_ops;
    out->self = b;
    return 0;
}

int kb_remote_is(const kb_backend *be)
{
    return be && be->ops && be->ops->kind == KB_BACKEND_REMOTE && be->self;
}

uint64_t kb_remote_launches(const kb_backend *be)
{
    return kb_remote_is(be) ? ((const rbe *)be->self)->launches : 0;
}

double kb_remote_kernel_ms(const kb_backend *be)
{
    return kb_remote_is(be) ? ((const rbe *)be->self)->kernel_ms : 0.0;
}

int kb_remote_setup_of(const kb_backend *be, kb_opencl_setup *out)
{
    if (!kb_remote_is(be) || !out)
        return KB_ERR_INVAL;
    *out = ((const rbe *)be->self)->setup;
    return 0;
}

int kb_remote_hello(const char *path, kb_devd_hello *out, kb_errbuf *eb)
{
    int fd = -1, rc = hello(path, 0, &fd, out, eb);
    if (rc == 0)
        close(fd);
    return rc;
}

int kb_remote_shutdown(const char *path, kb_errbuf *eb)
{
    kb_devd_msg m = { KB_DEVD_SHUTDOWN, 0, 0, 0, 0, 0 };
    int fd = connect_to(path, eb), rc;
    if (fd < 0)
        return fd;
    rc = call(fd, path, &m, NULL, 0, NULL, 0, NULL, NULL, 0, NULL, eb);
    close(fd);
    return rc;
}
