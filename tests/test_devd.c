/*
 * test_devd — the device server (kb_devd) and its client backend (kb_remote) over a real
 * Unix socket, with the reference backend's resident variant as the served device (no
 * OpenCL needed): a replay through the server gives the same bytes and the same transfer
 * counts as the same backend in process; two sessions at once keep their data apart; the
 * host data reaches the server through the log's shared payload file or, for other memory, as
 * a copy; the errors a user can meet are reported (no server, a stale socket file, a different build,
 * a server that went away mid-run, a host-arena flush, a pipelined replay that failed on the
 * server), and --stop ends the server.
 *
 * Security (kb_devd.h, "Trust"): the server's folder must be the user's alone, and so says the
 * client; a process of another uid is refused by the peer check (as root: a forked child that
 * setuid()s to nobody; the 0700 folder alone also stops it), and the client refuses a server
 * of another uid; malformed requests (truncated, oversized, unknown, garbage, lengths that do
 * not add up, stalls) close their connection with an error and the server serves the next
 * client; ranges, records and shared files are checked before they reach the device; a
 * request's data is bounded (the client splits larger transfers and flushes) and its rate.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kb_devd.h"
#include "kb_remote.h"
#include "kb_replay.h"
#include "kb_resident.h"
#include "kb_seedgen.h"
#include "kb_test_util.h"
#include "kb_vquery.h"

typedef struct srv {
    char path[300];
    volatile sig_atomic_t stop;
    pthread_t th;
    int rc;
    int sessions_made;
    int pool, recycled;   /* pool: offer finished backends back (recycle) */
    int fail_at;          /* > 0: a session's fail_at-th flush fails on the server */
    uint64_t max_bytes;   /* kb_devd_opts' bounds (0: the defaults) */
    double io_timeout_s, rate_hz;
    char log[4096];       /* the server's log lines, one a line */
    kb_errbuf eb;
} srv;

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static void srv_log(void *arg, const char *line)
{
    srv *s = arg;
    pthread_mutex_lock(&log_mu);
    size_t k = strlen(s->log);
    snprintf(s->log + k, sizeof s->log - k, "%s\n", line);
    pthread_mutex_unlock(&log_mu);
}

/* Whether the server's log has `part` (copied under the lock: threads append to it). */
static int srv_logged(srv *s, const char *part)
{
    char copy[sizeof s->log];
    pthread_mutex_lock(&log_mu);
    memcpy(copy, s->log, sizeof copy);
    pthread_mutex_unlock(&log_mu);
    return strstr(copy, part) != NULL;
}

static void copy_str(char *dst, size_t n, const char *src)
{
    size_t k = strlen(src);
    assert_true(k < n);
    memcpy(dst, src, k + 1);
}

/* The session backend of a server with fail_at: a kbt_wrap that owns its inner backend. */
static void fail_destroy(void *self)
{
    kbt_wrap *w = self;
    w->inner.ops->destroy(w->inner.self);
    free(w);
}

static const kb_backend_ops fail_ops = {
    .name = "failing",
    .begin = kbt_wrap_begin,
    .run_batch = kbt_wrap_run,
    .end = kbt_wrap_end,
    .destroy = fail_destroy,
    .resident = kbt_wrap_resident,
};

static int ref_session(void *arg, kb_backend *out, char *desc, size_t n, kb_errbuf *eb)
{
    srv *s = arg;
    (void)eb;
    __atomic_add_fetch(&s->sessions_made, 1, __ATOMIC_SEQ_CST);
    snprintf(desc, n, "ref-resident (test)");
    if (!s->fail_at)
        return kb_ref_backend_create_resident(out);
    kbt_wrap *w = calloc(1, sizeof *w);
    if (!w || kb_ref_backend_create_resident(&w->inner) != 0) {
        free(w);
        return KB_ERR_NOMEM;
    }
    w->fail_end = s->fail_at;
    out->ops = &fail_ops;
    out->self = w;
    return 0;
}

static int ref_recycle(void *arg, kb_backend *be)
{
    srv *s = arg;
    (void)be; /* the next client's first request makes a new arena: nothing to trim */
    __atomic_add_fetch(&s->recycled, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static void *srv_main(void *arg)
{
    srv *s = arg;
    kb_devd_opts o = { s->path, "cpu", "test device", NULL, ref_session, s,
                       s->pool ? ref_recycle : NULL, 0, &s->stop, -1, s->max_bytes,
                       s->io_timeout_s, s->rate_hz, srv_log };
    s->rc = kb_devd_serve(&o, &s->eb);
    return NULL;
}

static void srv_wait_listening(const srv *s)
{
    for (int i = 0; i < 500; i++) {
        kb_devd_hello h;
        kb_errbuf eb;
        if (kb_remote_hello(s->path, &h, &eb) == 0)
            return;
        usleep(10000);
    }
    fail_msg("the server did not start listening (server rc %d: %s)", s->rc, s->eb.msg);
}

/* A second server in the work folder (socket `sock`, maybe in a folder of its own, which
 * the server makes), for a test of its own: srv_prepare, its settings, srv_run. */
static void srv_prepare(srv *s, const char *sock)
{
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s/%s", kbt_workdir(), sock);
}

static void srv_run(srv *s)
{
    assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
    srv_wait_listening(s);
}

static void srv_start(srv *s, const char *sock, int pool, int fail_at)
{
    srv_prepare(s, sock);
    s->pool = pool;
    s->fail_at = fail_at;
    srv_run(s);
}

static int setup(void **state)
{
    srv *s = calloc(1, sizeof *s);
    if (!s || kbt_workdir_make("kbcl-devd") != 0)
        return -1;
    snprintf(s->path, sizeof s->path, "%s/cpu.sock", kbt_workdir());
    if (pthread_create(&s->th, NULL, srv_main, s) != 0)
        return -1;
    srv_wait_listening(s);
    *state = s;
    return 0;
}

static void srv_stop(srv *s)
{
    s->stop = 1;
    pthread_join(s->th, NULL);
    assert_int_equal(s->rc, 0);
}

static int teardown(void **state)
{
    srv *s = *state;
    if (!s->stop)
        srv_stop(s);
    kbt_workdir_remove();
    free(s);
    return 0;
}

static kb_rec copy_f32(uint64_t dst, uint64_t src, uint32_t n, kb_time t)
{
    kb_rec r = kbt_rec_new(KB_REC_COPY, t);
    r.src[0] = kb_opnd_make(src, 1, n, KB_F32);
    r.dst = kb_opnd_make(dst, 1, n, KB_F32);
    return r;
}

typedef struct run {
    kb_oplog *log;
    kb_memstore *ms;
    kb_backend be;
    kb_replay_stats st;
} run;

static void run_open(run *r, const char *path)
{
    kb_errbuf eb = { { 0 } };
    char desc[300];
    r->log = kb_oplog_create();
    r->ms = kb_memstore_create();
    assert_non_null(r->log);
    assert_non_null(r->ms);
    memset(&r->st, 0, sizeof r->st);
    if (path) {
        int rc = kb_remote_backend_create(path, &r->be, desc, sizeof desc, &eb);
        if (rc)
            print_error("remote: %s\n", eb.msg);
        assert_int_equal(rc, 0);
        assert_true(kb_remote_is(&r->be));
        assert_string_equal(desc, "ref-resident (test) via kbcl devd");
    } else {
        assert_int_equal(kb_ref_backend_create_resident(&r->be), 0);
    }
}

static void run_close(run *r)
{
    r->be.ops->destroy(r->be.self);
    kb_oplog_destroy(r->log);
    kb_memstore_destroy(r->ms);
}

static int flush(run *r, kb_rec rec, kb_errbuf *eb)
{
    assert_int_equal(kb_oplog_append(r->log, &rec, NULL), 0);
    return kb_replay_flush(r->log, r->ms, &r->be, &r->st, eb);
}

static void flush_ok(run *r, kb_rec rec)
{
    kb_errbuf eb = { { 0 } };
    int rc = flush(r, rec, &eb);
    if (rc)
        print_error("flush: %s\n", eb.msg);
    assert_int_equal(rc, 0);
}

/*
 * A sequence that uses every request: payload sources (two payload uploads), host writes
 * (host-dirty uploads), poison fills, merges that grow the arena (BLOCK, COPY),
 * adds, and reads (DOWNLOAD). out[] receives what the host reads at the end (2 x 1040 f32).
 */
static void scenario(run *r, float *out, uint64_t salt)
{
    float a[1024], b[16];
    uint64_t off;
    kbt_rng g = { 0x9E3779B97F4A7C15ULL ^ salt };
    for (int i = 0; i < 1024; i++)
        a[i] = kbt_rng_float(&g, -4.0f, 4.0f);
    for (int i = 0; i < 16; i++)
        b[i] = kbt_rng_float(&g, -1.0f, 1.0f);
    assert_int_equal(kb_oplog_add_payload(r->log, a, sizeof a, &off), 0);
    kb_rec c = copy_f32(0x10000, off, 1024, 0);
    c.src[0].space = KB_SPACE_PAYLOAD;
    flush_ok(r, c);
    assert_int_equal(kb_memstore_write(r->ms, 0x20000, b, sizeof b), 0);
    flush_ok(r, copy_f32(0x30000, 0x20000, 16, 1));
    kb_rec add = kbt_rec_new(KB_REC_MATH2, 2);
    add.op = KB_M2_ADD;
    add.nsrc = 2;
    add.src[0] = kb_opnd_make(0x10000, 1, 1024, KB_F32);
    add.src[1] = kb_opnd_make(0x10000, 1, 1024, KB_F32);
    add.dst = kb_opnd_make(0x40000, 1, 1024, KB_F32);
    flush_ok(r, add);
    assert_int_equal(kb_oplog_add_payload(r->log, b, sizeof b, &off), 0);
    c = copy_f32(0x40010, off, 16, 3);
    c.src[0].space = KB_SPACE_PAYLOAD;
    flush_ok(r, c);
    /* spans both the 0x30000 and 0x40000 segments: a merge, copied into a new block */
    flush_ok(r, copy_f32(0x50000, 0x30000, 16384 + 1040, 4));
    kb_errbuf eb = { { 0 } };
    assert_int_equal(kb_memstore_load(r->ms, 0x40000, out, 1040 * 4, &eb), 0);
    assert_int_equal(kb_memstore_load(r->ms, 0x50000 + 16384 * 4, out + 1040, 1040 * 4, &eb), 0);
    /* the expected values, independent of any backend */
    for (int i = 0; i < 1024; i++) {
        float want = i >= 4 && i < 20 ? b[i - 4] : a[i] + a[i];
        assert_true(out[i] == want);
        assert_true(out[1040 + i] == want);
    }
}

static void test_same_as_in_process(void **state)
{
    srv *s = *state;
    static float lo[2080], re[2080];
    run l, r;
    kb_xfer_stats xl, xr;

    run_open(&l, NULL);
    scenario(&l, lo, 1);
    run_open(&r, s->path);
    scenario(&r, re, 1);
    assert_memory_equal(lo, re, sizeof lo);
    kb_backend_xfer_stats(&l.be, &xl);
    kb_backend_xfer_stats(&r.be, &xr);
    assert_true(xr.uploads > 0 && xr.downloads > 0 && xr.moves > 0 && xr.fills > 0);
    assert_int_equal(xl.uploads, xr.uploads);
    assert_int_equal(xl.upload_bytes, xr.upload_bytes);
    assert_int_equal(xl.downloads, xr.downloads);
    assert_int_equal(xl.download_bytes, xr.download_bytes);
    assert_int_equal(xl.fills, xr.fills);
    assert_int_equal(xl.fill_bytes, xr.fill_bytes);
    assert_int_equal(xl.moves, xr.moves);
    assert_int_equal(xl.move_bytes, xr.move_bytes);
    assert_int_equal(xl.arena_bytes, xr.arena_bytes);
    assert_int_equal(l.st.batches, r.st.batches);
    kb_opencl_setup su;
    assert_int_equal(kb_opencl_setup_of(&r.be, &su), 0);
    assert_non_null(strstr(su.note, s->path));
    run_close(&l);
    run_close(&r);
    assert_int_equal(s->sessions_made, 1);
}


/*
 * A reduce-scatter's check (KB_VQ_COLL, the largest query) over 4 resident tiles of 64 f16
 * values (a right result of the seeded inputs but for one planted error): its answer, out
 * (kb_vquery_result_size bytes), and the tiles' digest. An unknown collective is refused.
 */
static void coll_query(run *r, void *out, uint64_t *digest)
{
    uint16_t h[256];
    uint64_t pa[4] = { 0x30000, 0x30080, 0x30100, 0x30180 };
    kb_vquery q = { KB_VQ_COLL, 4, 64, 0, 1, 0, 0.0, KB_VQ_C_REDUCE_SCATTER, 0 };
    kb_vquery qd = { KB_VQ_DIGEST, 4, 0, 128, 0, 0, 0.0, 0, 0 };
    kb_errbuf eb = { { 0 } };
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 64; i++) {
            double s = 0.0;
            for (int k = 0; k < 4 && i / 16 == t; k++)
                s += kb_seedgen_value(1, k, i, 64);
            h[t * 64 + i] = kb_f32_to_f16(i / 16 == t ? (float)s : kb_seedgen_value(1, t, i, 64));
        }
    h[77] ^= 0x0400; /* tile 1, element 13 */
    assert_int_equal(kb_memstore_write(r->ms, 0x20000, h, sizeof h), 0);
    flush_ok(r, copy_f32(0x30000, 0x20000, 128, 0));
    kb_resident *res = r->be.ops->resident(r->be.self);
    assert_non_null(res);
    int rc = kb_resident_query(res, &q, pa, out, &eb);
    if (rc)
        print_error("query: %s\n", eb.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(kb_resident_query(res, &qd, pa, digest, &eb), 0);
    q.coll = 99;
    assert_true(kb_resident_query(res, &q, pa, out, &eb) < 0);
}

/* A device query through the server answers what the device in process answers, bit for bit,
 * and what the oracle answers over the same bytes. */
static void test_coll_query(void **state)
{
    srv *s = *state;
    enum { RS = 4 * sizeof(kb_vq_tile) + sizeof(kb_vq_sums) };
    static unsigned char lo[RS], re[RS];
    uint64_t dl = 0, dr = 1;
    run l, r;

    run_open(&l, NULL);
    coll_query(&l, lo, &dl);
    run_open(&r, s->path);
    coll_query(&r, re, &dr);
    assert_memory_equal(lo, re, RS);
    assert_int_equal(dl, dr);
    const kb_vq_tile *tv = (const kb_vq_tile *)lo;
    assert_int_equal(tv[0].nwrong + tv[2].nwrong + tv[3].nwrong, 0);
    assert_int_equal(tv[1].nwrong, 1);
    assert_int_equal(tv[1].bad_elem, 13);
    run_close(&l);
    run_close(&r);
}

typedef struct par {
    const char *path;
    uint64_t salt;
    float out[2080];
} par;

static void *par_main(void *arg)
{
    par *p = arg;
    run r;
    run_open(&r, p->path);
    scenario(&r, p->out, p->salt);
    run_close(&r);
    return NULL;
}

/* Two sessions at once: each its own device memory (the scenario checks its own values). */
static void test_two_sessions(void **state)
{
    srv *s = *state;
    static par p[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        p[i].path = s->path;
        p[i].salt = 7 + (uint64_t)i;
        assert_int_equal(pthread_create(&th[i], NULL, par_main, &p[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_memory_not_equal(p[0].out, p[1].out, sizeof p[0].out);
    kb_devd_hello h;
    kb_errbuf eb;
    /* both closed: their sessions end in the server's own time */
    for (int i = 0; i < 200; i++) {
        assert_int_equal(kb_remote_hello(s->path, &h, &eb), 0);
        if (h.sessions == 0)
            break;
        usleep(5000);
    }
    assert_int_equal(h.sessions, 0);
    assert_string_equal(h.device, "cpu");
    assert_string_equal(h.desc, "test device");
    assert_int_equal(h.pid, (int)getpid());
}

/* A server with recycling keeps a finished session's backend for the next session: the
 * second client gets it (no new backend made) and its own correct data. */
static void test_pooled_sessions(void **state)
{
    (void)state;
    static float a[2080], b[2080];
    srv s2;
    run r;
    srv_start(&s2, "pool.sock", 1, 0);
    run_open(&r, s2.path);
    scenario(&r, a, 3);
    run_close(&r);
    for (int i = 0; i < 200 && __atomic_load_n(&s2.recycled, __ATOMIC_SEQ_CST) == 0; i++)
        usleep(5000); /* the session ends in the server's own time */
    run_open(&r, s2.path);
    scenario(&r, b, 4);
    run_close(&r);
    assert_int_equal(s2.sessions_made, 1);
    assert_true(s2.recycled >= 1);
    assert_memory_not_equal(a, b, sizeof a);
    srv_stop(&s2);
}

/* The device primitives of a remote backend, driven directly: a payload that is not a
 * log's shared file (heap memory) travels as a copy, and a flush reads it on the server. */
static void test_copied_payload(void **state)
{
    srv *s = *state;
    kb_backend be;
    kb_errbuf eb = { { 0 } };
    const kb_resident_ops *ops;
    void *dev;
    float src[16], got[16];
    for (int i = 0; i < 16; i++)
        src[i] = (float)i * 0.25f - 1.0f;
    assert_int_equal(kb_remote_backend_create(s->path, &be, NULL, 0, &eb), 0);
    kb_resident_device(be.ops->resident(be.self), &ops, &dev);
    assert_int_equal(ops->block(dev, 0, 4096, &eb), 0);
    assert_int_equal(ops->payload(dev, (const uint8_t *)src, 32, 0, &eb), 0);
    assert_int_equal(ops->payload(dev, (const uint8_t *)src, sizeof src, 32, &eb), 0);
    kb_rec r = copy_f32(256, 0, 16, 0);
    r.src[0].space = KB_SPACE_PAYLOAD;
    assert_int_equal(be.ops->begin(be.self, NULL, 4096, NULL, 0, &eb), 0);
    assert_int_equal(be.ops->run_batch(be.self, &r, 1, &eb), 0);
    assert_int_equal(be.ops->end(be.self, NULL, 4096, &eb), 0);
    assert_int_equal(ops->download(dev, 256, got, sizeof got, &eb), 0);
    assert_memory_equal(got, src, sizeof src);
    /* a payload that shrinks is refused before anything is sent */
    assert_int_equal(ops->payload(dev, (const uint8_t *)src, 8, 32, &eb), KB_ERR_INVAL);
    be.ops->destroy(be.self);
}

static void test_no_server(void **state)
{
    (void)state;
    char path[400];
    kb_backend be;
    kb_errbuf eb = { { 0 } };
    snprintf(path, sizeof path, "%s/none.sock", kbt_workdir());
    assert_int_equal(kb_remote_backend_create(path, &be, NULL, 0, &eb), KB_ERR_NOTFOUND);
    kbt_msg_has(eb.msg, "no device server at");
    assert_null(be.ops);
    /* a stale socket file (its server was killed): nobody accepts, also "not found" */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    copy_str(sa.sun_path, sizeof sa.sun_path, path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
    assert_int_equal(kb_remote_backend_create(path, &be, NULL, 0, &eb), KB_ERR_NOTFOUND);
    /* a server can take over a stale socket */
    srv s2;
    memset(&s2, 0, sizeof s2);
    copy_str(s2.path, sizeof s2.path, path);
    assert_int_equal(pthread_create(&s2.th, NULL, srv_main, &s2), 0);
    srv_wait_listening(&s2);
    /* a second server on a live socket is refused */
    kb_devd_opts o = { path, "cpu", "x", NULL, ref_session, &s2, NULL, 0, &s2.stop, -1, 0, 0, 0,
                       NULL };
    assert_int_equal(kb_devd_serve(&o, &eb), KB_ERR_STATE);
    kbt_msg_has(eb.msg, "already listens");
    srv_stop(&s2);
    assert_int_equal(access(path, F_OK), -1); /* removed on exit */
}

/* A client of another build (another protocol or record size) is told so. */
static void test_other_build(void **state)
{
    srv *s = *state;
    struct sockaddr_un sa;
    kb_devd_msg m = { KB_DEVD_HELLO, 1, KB_DEVD_MAGIC, KB_DEVD_PROTO, sizeof(kb_rec) + 8, 0 };
    kb_devd_rep r;
    char msg[512] = "";
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    copy_str(sa.sun_path, sizeof sa.sun_path, s->path);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(write(fd, &m, sizeof m), (ssize_t)sizeof m);
    assert_int_equal(read(fd, &r, sizeof r), (ssize_t)sizeof r);
    assert_int_equal(r.rc, KB_ERR_DEVICE);
    assert_true(r.msglen > 0 && r.msglen < sizeof msg);
    assert_int_equal(read(fd, msg, r.msglen), (ssize_t)r.msglen);
    kbt_msg_has(msg, "a different build");
    close(fd);
    assert_int_equal(s->sessions_made, 0);
}

/* The server goes away mid-run: the next flush and the next read of device data fail with
 * a device error naming the server; nothing crashes and the in-process state stays sane. */
static void test_server_gone(void **state)
{
    srv *s = *state;
    run r;
    float x[4] = { 1, 2, 3, 4 }, got[4];
    kb_errbuf eb = { { 0 } };
    run_open(&r, s->path);
    assert_int_equal(kb_memstore_write(r.ms, 0x1000, x, sizeof x), 0);
    flush_ok(&r, copy_f32(0x2000, 0x1000, 4, 0));
    srv_stop(s); /* shuts the session's socket down */
    int rc = flush(&r, copy_f32(0x3000, 0x1000, 4, 1), &eb);
    assert_int_equal(rc, KB_ERR_DEVICE);
    kbt_msg_has(eb.msg, "connection lost");
    kbt_msg_has(eb.msg, s->path);
    rc = kb_memstore_load(r.ms, 0x2000, got, sizeof got, &eb);
    assert_int_not_equal(rc, 0);
    run_close(&r);
}

/*
 * Flushes are pipelined: a flush returns once its records are sent. A replay that then fails
 * on the server is reported by the next request (a read here, the sync otherwise), and every
 * request after it fails the same way: no data of a failed replay is ever served.
 */
static void test_pipelined_failure(void **state)
{
    (void)state;
    srv s2;
    run r;
    float x[4] = { 1, 2, 3, 4 }, got[4];
    kb_errbuf eb = { { 0 } };
    srv_start(&s2, "fail.sock", 0, 2);
    run_open(&r, s2.path);
    assert_non_null(r.be.ops->sync);
    assert_int_equal(kb_memstore_write(r.ms, 0x1000, x, sizeof x), 0);
    flush_ok(&r, copy_f32(0x2000, 0x1000, 4, 0));
    assert_int_equal(r.be.ops->sync(r.be.self, &eb), 0);
    assert_int_equal(kb_memstore_load(r.ms, 0x2000, got, sizeof got, &eb), 0);
    assert_memory_equal(got, x, sizeof x);
    flush_ok(&r, copy_f32(0x3000, 0x2000, 4, 1)); /* fails on the server, unseen yet */
    int rc = kb_memstore_load(r.ms, 0x3000, got, sizeof got, &eb);
    assert_int_equal(rc, KB_ERR_DEVICE);
    kbt_msg_has(eb.msg, "a pipelined replay");
    kbt_msg_has(eb.msg, "injected failure");
    eb.msg[0] = '\0';
    assert_int_equal(r.be.ops->sync(r.be.self, &eb), KB_ERR_DEVICE);
    kbt_msg_has(eb.msg, "injected failure");
    eb.msg[0] = '\0';
    assert_int_not_equal(flush(&r, copy_f32(0x4000, 0x1000, 4, 2), &eb), 0);
    kbt_msg_has(eb.msg, "injected failure");
    run_close(&r);
    srv_stop(&s2);
}

/*
 * A session whose replay failed on the device does not give its backend to the pool: the
 * driver may hold a buffer it failed to back (NVIDIA allocates at first use), and every
 * session that got that backend would fail the same way. The next client gets a new one.
 */
static void test_failed_session_not_pooled(void **state)
{
    (void)state;
    srv s2;
    run r;
    float x[4] = { 1, 2, 3, 4 };
    kb_errbuf eb = { { 0 } };
    kb_devd_hello h;
    srv_start(&s2, "failpool.sock", 1, 1);
    for (int k = 0; k < 2; k++) {
        run_open(&r, s2.path);
        assert_int_equal(kb_memstore_write(r.ms, 0x1000, x, sizeof x), 0);
        flush_ok(&r, copy_f32(0x2000, 0x1000, 4, 0)); /* fails on the server */
        eb.msg[0] = '\0';
        assert_int_equal(r.be.ops->sync(r.be.self, &eb), KB_ERR_DEVICE);
        kbt_msg_has(eb.msg, "injected failure");
        run_close(&r);
        /* the session ends in the server's own time */
        for (int i = 0; i < 400; i++) {
            assert_int_equal(kb_remote_hello(s2.path, &h, &eb), 0);
            if (h.sessions == 0)
                break;
            usleep(5000);
        }
        assert_int_equal(h.sessions, 0);
    }
    assert_int_equal(s2.sessions_made, 2);
    assert_int_equal(s2.recycled, 0);
    srv_stop(&s2);
}

static void test_host_arena_refused(void **state)
{
    srv *s = *state;
    run r;
    uint8_t arena[64] = { 0 };
    kb_errbuf eb = { { 0 } };
    run_open(&r, s->path);
    assert_int_equal(r.be.ops->begin(r.be.self, arena, sizeof arena, NULL, 0, &eb),
                     KB_ERR_UNSUPPORTED);
    kbt_msg_has(eb.msg, "host-arena flushes");
    run_close(&r);
}

static void test_shutdown_request(void **state)
{
    srv *s = *state;
    kb_errbuf eb = { { 0 } };
    assert_int_equal(kb_remote_shutdown(s->path, &eb), 0);
    pthread_join(s->th, NULL);
    s->stop = 1; /* joined */
    assert_int_equal(s->rc, 0);
    kb_devd_hello h;
    assert_int_equal(kb_remote_hello(s->path, &h, &eb), KB_ERR_NOTFOUND);
}

static void test_paths(void **state)
{
    (void)state;
    char buf[200];
    kb_errbuf eb;
    setenv("KBCL_DEVD_DIR", "/run/x", 1);
    assert_int_equal(kb_devd_socket_path("gpu", buf, sizeof buf, &eb), 0);
    assert_string_equal(buf, "/run/x/gpu.sock");
    char longdir[300];
    memset(longdir, 'a', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = '\0';
    setenv("KBCL_DEVD_DIR", longdir, 1);
    assert_int_equal(kb_devd_socket_path("gpu", buf, sizeof buf, &eb), KB_ERR_RANGE);
    unsetenv("KBCL_DEVD_DIR");
    setenv("XDG_RUNTIME_DIR", "/run/user/7", 1);
    assert_int_equal(kb_devd_socket_path("cpu", buf, sizeof buf, &eb), 0);
    assert_string_equal(buf, "/run/user/7/kbcl/cpu.sock");
    unsetenv("XDG_RUNTIME_DIR");
    assert_int_equal(kb_devd_socket_path("cpu", buf, sizeof buf, &eb), 0);
    char want[100];
    snprintf(want, sizeof want, "/tmp/kbcl-devd-%lu/cpu.sock", (unsigned long)getuid());
    assert_string_equal(buf, want);
    setenv("KBCL_DEVD", "off", 1);
    assert_false(kb_devd_enabled());
    setenv("KBCL_DEVD", "1", 1);
    assert_true(kb_devd_enabled());
    unsetenv("KBCL_DEVD");
    assert_true(kb_devd_enabled());
}

/* ------------------------------------------------------------------ security */

/* A raw connection to path (reads give up after 5 s, so a server that hangs fails the test). */
static int raw_connect(const char *path)
{
    struct sockaddr_un sa;
    struct timeval tv = { 5, 0 };
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    copy_str(sa.sun_path, sizeof sa.sun_path, path);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    /* the server may have closed already (it refuses a header before its data) */
    (void)!send(fd, p, n, MSG_NOSIGNAL);
}

static void raw_req(int fd, uint32_t op, uint32_t flags, uint64_t a, uint64_t b, uint64_t c,
                    uint64_t len, const void *data, size_t n)
{
    kb_devd_msg m = { op, flags, a, b, c, len };
    raw_send(fd, &m, sizeof m);
    if (n)
        raw_send(fd, data, n);
}

/* Reads one reply: its rc, its message into msg (NUL-terminated), its data skipped. */
static int raw_reply(int fd, char *msg, size_t msg_n)
{
    kb_devd_rep r;
    assert_int_equal(kb_devd_read_full(fd, &r, sizeof r), 0);
    assert_true(r.msglen < msg_n);
    assert_int_equal(kb_devd_read_full(fd, msg, r.msglen), 0);
    msg[r.msglen] = '\0';
    for (uint64_t left = r.len; left > 0;) {
        char skip[4096];
        size_t k = left < sizeof skip ? (size_t)left : sizeof skip;
        assert_int_equal(kb_devd_read_full(fd, skip, k), 0);
        left -= k;
    }
    return r.rc;
}

/* The server closed the connection (not: it timed out, or sent more). */
static void raw_closed(int fd)
{
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r < 0 && errno == ECONNRESET)
        r = 0;
    assert_int_equal(r, 0);
    close(fd);
}

static void raw_hello(int fd, int session)
{
    char msg[512];
    raw_req(fd, KB_DEVD_HELLO, (uint32_t)session, KB_DEVD_MAGIC, KB_DEVD_PROTO, sizeof(kb_rec),
            0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
}

/* A request the server must answer with an error naming `part`, then close. */
static void expect_closed(int fd, const char *part)
{
    char msg[512];
    int rc = raw_reply(fd, msg, sizeof msg);
    if (rc != KB_ERR_INVAL)
        fail_msg("wanted the error '%s', got rc %d: %s", part, rc, msg);
    kbt_msg_has(msg, "device server: connection closed");
    kbt_msg_has(msg, part);
    raw_closed(fd);
}

/* The server still serves: a hello, and a whole replay through it. */
static void still_serves(const char *path)
{
    static float out[2080];
    kb_devd_hello h;
    kb_errbuf eb = { { 0 } };
    run r;
    assert_int_equal(kb_remote_hello(path, &h, &eb), 0);
    run_open(&r, path);
    scenario(&r, out, 11);
    run_close(&r);
}

/*
 * Malformed requests: each closes its own connection with an error (none crashes or stops
 * the server, none makes it wait for data it refused), and a good client is served after all.
 */
static void test_malformed(void **state)
{
    srv *s = *state;
    uint8_t junk[64];
    uint64_t eight = 5;
    int fd;

    /* a truncated header: the peer is gone, nothing to answer */
    fd = raw_connect(s->path);
    raw_send(fd, "kbdevd", 6);
    close(fd);
    /* garbage where a header belongs */
    memset(junk, 0xA5, sizeof junk);
    fd = raw_connect(s->path);
    raw_send(fd, junk, sizeof junk);
    expect_closed(fd, "unknown request 2779096485");
    /* a hello with another magic number */
    fd = raw_connect(s->path);
    raw_req(fd, KB_DEVD_HELLO, 1, 0x1234, KB_DEVD_PROTO, sizeof(kb_rec), 0, NULL, 0);
    expect_closed(fd, "magic");
    /* a device request before the hello */
    fd = raw_connect(s->path);
    raw_req(fd, KB_DEVD_COPY, 0, 0, 0, 8, 0, NULL, 0);
    expect_closed(fd, "COPY before a session (HELLO first)");
    /* an unknown request after it */
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, 99, 0, 0, 0, 0, 0, NULL, 0);
    expect_closed(fd, "unknown request 99");
    /* flags a request does not have */
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_COPY, 0x80, 0, 0, 0, 0, NULL, 0);
    expect_closed(fd, "COPY with flags 0x80");
    /* more data than a request may carry: refused from its header, the data never read */
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_UPLOAD, 0, 0, 0, 0, KB_DEVD_MAX_MSG + 1, NULL, 0);
    expect_closed(fd, "more than the 67108864 a request may carry");
    /* lengths that do not add up: moves, a flush's counts, a query's tiles */
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_BLOCK, 0, 0, 4096, 0, 8, junk, 8);
    expect_closed(fd, "BLOCK with 8 data bytes");
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_FLUSH, 0, 0, 1, 0, sizeof eight, &eight, sizeof eight);
    expect_closed(fd, "FLUSH of 1 batches with 8 data bytes");
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    kb_vquery q = { KB_VQ_DIGEST, 1000, 0, 16, 0, 0, 0.0, 0, 0 };
    raw_req(fd, KB_DEVD_QUERY, 0, 0, 0, 0, sizeof q, &q, sizeof q);
    expect_closed(fd, "QUERY kind 2 over 1000 tiles");
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_PAYLOAD, 0, 8, 0, 0, 4, junk, 4);
    expect_closed(fd, "PAYLOAD to 8 bytes from 0 with 4 data bytes");
    /* another request between the parts of a flush */
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_FLUSH, KB_DEVD_MORE, 0, 0, 0, 0, NULL, 0);
    raw_req(fd, KB_DEVD_FILL, 0, 0, 0, 0, 0, NULL, 0);
    expect_closed(fd, "FILL inside a flush sent in parts");
    /* a part cut off: the server closes the flush it began and goes on */
    fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_FLUSH, KB_DEVD_MORE, 0, 0, 0, 0, NULL, 0);
    close(fd);
    still_serves(s->path);
    assert_true(srv_logged(s, "closed the connection of pid "));
    assert_true(srv_logged(s, "unknown request 99"));
}

/* A connection that sends nothing, or stops inside a message, is closed after the server's
 * I/O timeout: it holds no session thread for ever. Between requests a client may think. */
static void test_stalls(void **state)
{
    (void)state;
    srv s2;
    int fd;
    char msg[512];
    srv_prepare(&s2, "stall.sock");
    s2.io_timeout_s = 0.2;
    srv_run(&s2);
    fd = raw_connect(s2.path);
    expect_closed(fd, "no request within 0.2 s of connecting");
    fd = raw_connect(s2.path);
    raw_hello(fd, 1);
    usleep(400000); /* thinking between requests is no stall */
    raw_req(fd, KB_DEVD_BLOCK, 0, 0, 64, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_send(fd, "partial", 7);
    expect_closed(fd, "a request header stalled for 0.2 s");
    fd = raw_connect(s2.path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_UPLOAD, 0, 0, 0, 0, 100, "ten bytes.", 10);
    expect_closed(fd, "UPLOAD data stalled for 0.2 s");
    still_serves(s2.path);
    srv_stop(&s2);
}

/* Ranges, records and queries outside the session's arena or payload are refused before they
 * reach the device; the session goes on (these are errors, not broken framing). */
static void test_ranges_checked(void **state)
{
    srv *s = *state;
    char msg[512];
    uint8_t data[64] = { 0 };
    int fd = raw_connect(s->path);
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_COPY, 0, 0, 0, 8, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    kbt_msg_has(msg, "outside the arena of 0 bytes");
    raw_req(fd, KB_DEVD_BLOCK, 0, 0, 4096, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_req(fd, KB_DEVD_FILL, 0, 4000, 100, 7, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    raw_req(fd, KB_DEVD_UPLOAD, 0, UINT64_MAX - 8, 0, 0, sizeof data, data, sizeof data);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    raw_req(fd, KB_DEVD_DOWNLOAD, 0, 0, KB_DEVD_MAX_MSG + 1, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    raw_req(fd, KB_DEVD_BLOCK, 0, 8192, 4096, 0, 0, NULL, 0); /* not at the arena's end */
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    kbt_msg_has(msg, "BLOCK at 8192, the arena has 4096 bytes");
    raw_req(fd, KB_DEVD_FILL, 0, 4000, 200, 7, 0, NULL, 0); /* across two blocks */
    raw_req(fd, KB_DEVD_BLOCK, 0, 4096, 4096, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_req(fd, KB_DEVD_FILL, 0, 4000, 200, 7, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    kbt_msg_has(msg, "not inside one block");
    raw_req(fd, KB_DEVD_PAYLOAD, 0, 16, 8, 0, 8, data, 8); /* "the device has 8": it has 0 */
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    struct {
        kb_vquery q;
        uint64_t off;
    } qt = { { KB_VQ_DIGEST, 1, 0, 64, 0, 0, 0.0, 0, 0 }, 8190 };
    raw_req(fd, KB_DEVD_QUERY, 0, 0, 0, 0, sizeof qt, &qt, sizeof qt);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    kbt_msg_has(msg, "QUERY tile");
    /* records: one whose source lies beyond the flush's arena, one with a wrapping span */
    struct {
        uint64_t cnt;
        kb_rec r;
    } fl = { 1, copy_f32(0, 1u << 20, 16, 0) };
    raw_req(fd, KB_DEVD_FLUSH, 0, 4096, 1, 0, sizeof fl, &fl, sizeof fl);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    kbt_msg_has(msg, "operand beyond the arena");
    fl.r = copy_f32(0, 0, 16, 0);
    fl.r.src[0].rows = fl.r.dst.rows = UINT32_MAX;
    fl.r.src[0].ld = fl.r.dst.ld = UINT32_MAX;
    raw_req(fd, KB_DEVD_FLUSH, 0, 4096, 1, 0, sizeof fl, &fl, sizeof fl);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    /* the planner's own check (kb_rec_check) refuses it before the arena's */
    kbt_msg_has(msg, "operand spans more than 2^64 bytes");
    fl.r = copy_f32(0, 0, 16, 0);
    fl.r.src[0].space = KB_SPACE_PAYLOAD; /* the session has no payload yet */
    raw_req(fd, KB_DEVD_FLUSH, 0, 4096, 1, 0, sizeof fl, &fl, sizeof fl);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    kbt_msg_has(msg, "operand beyond the payload");
    /* an empty operand whose other extent is huge: no bytes, but a loop of 2^31 rows (the
     * fuzz target's first finding: a FILL that kept the server busy for seconds) */
    fl.r = kbt_rec_new(KB_REC_FILL, 0);
    fl.r.dst = kb_opnd_make(0, 1u << 31, 0, KB_F32);
    raw_req(fd, KB_DEVD_FLUSH, 0, 4096, 1, 0, sizeof fl, &fl, sizeof fl);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    kbt_msg_has(msg, "empty operand with an extent its space could not hold");
    /* an empty operand far beyond the arena (its base was still computed: the fuzz target's
     * third finding, a pointer overflow) */
    fl.r.dst = kb_opnd_make(UINT64_MAX - 1791, 0, 8, KB_F32);
    raw_req(fd, KB_DEVD_FLUSH, 0, 4096, 1, 0, sizeof fl, &fl, sizeof fl);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    kbt_msg_has(msg, "empty operand beyond its space");
    /* a GEN whose first element plus a row index would overflow an int64_t */
    fl.r = kbt_rec_new(KB_REC_GEN, 0);
    fl.r.dst = kb_opnd_make(0, 1, 16, KB_F32);
    fl.r.src[1].addr = (uint64_t)INT64_MAX - 4;
    raw_req(fd, KB_DEVD_FLUSH, 0, 4096, 1, 0, sizeof fl, &fl, sizeof fl);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    kbt_msg_has(msg, "gen parameter out of range");
    /* a query over no tile (a check would still loop over its n columns) */
    qt.q.ntiles = 0;
    qt.q.kind = KB_VQ_CHECK;
    qt.q.n = 1u << 30;
    raw_req(fd, KB_DEVD_QUERY, 0, 0, 0, 0, sizeof qt.q, &qt.q, sizeof qt.q);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    /* and a good flush in the same session */
    fl.r = copy_f32(64, 0, 16, 0);
    raw_req(fd, KB_DEVD_FLUSH, 0, 4096, 1, 0, sizeof fl, &fl, sizeof fl);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    close(fd);
}

/* Requests of nothing are valid and do nothing: before the fuzz target found them, each
 * handed a NULL buffer on to memcpy (undefined, caught by the sanitizer build's UBSan). */
static void test_zero_sizes(void **state)
{
    srv *s = *state;
    char msg[512];
    int fd = raw_connect(s->path);
    struct {
        uint64_t cnt;
        kb_rec r;
    } fl = { 1, copy_f32(0, 0, 0, 0) };
    raw_hello(fd, 1);
    raw_req(fd, KB_DEVD_BLOCK, 0, 0, 64, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_req(fd, KB_DEVD_UPLOAD, 0, 8, 0, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_req(fd, KB_DEVD_DOWNLOAD, 0, 8, 0, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_req(fd, KB_DEVD_COPY, 0, 8, 16, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_req(fd, KB_DEVD_FILL, 0, 8, 0, 1, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_req(fd, KB_DEVD_PAYLOAD, 0, 0, 0, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    raw_req(fd, KB_DEVD_FLUSH, 0, 0, 0, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    fl.r.src[0].space = KB_SPACE_PAYLOAD; /* an empty operand in an empty payload */
    raw_req(fd, KB_DEVD_FLUSH, 0, 64, 1, 0, sizeof fl, &fl, sizeof fl);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    struct {
        kb_vquery q;
        uint64_t off;
    } qt = { { KB_VQ_DIGEST, 1, 0, 0, 0, 0, 0.0, 0, 0 }, 0 };
    raw_req(fd, KB_DEVD_QUERY, 0, 0, 0, 0, sizeof qt, &qt, sizeof qt);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    close(fd);
}

/* Shared files must be regular, sealed against shrinking and as long as claimed: a client
 * that truncated one under the server's mapping would have crashed it (SIGBUS). */
static void test_shared_files_checked(void **state)
{
    srv *s = *state;
    char msg[512];
    int fd = raw_connect(s->path), p[2];
    int loose = memfd_create("loose", MFD_CLOEXEC);
    int sealed = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    kb_devd_msg m = { KB_DEVD_PAYLOAD, KB_DEVD_SHARED, 4096, 0, 0, 0 };
    assert_true(loose >= 0 && sealed >= 0);
    assert_int_equal(ftruncate(loose, 4096), 0);
    assert_int_equal(ftruncate(sealed, 100), 0);
    assert_int_equal(fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    assert_int_equal(pipe(p), 0);
    raw_hello(fd, 1);
    assert_int_equal(kb_devd_send_fd(fd, &m, sizeof m, loose), 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    kbt_msg_has(msg, "not sealed against shrinking");
    assert_int_equal(kb_devd_send_fd(fd, &m, sizeof m, sealed), 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_RANGE);
    kbt_msg_has(msg, "a client file of 100 bytes, 4096 wanted");
    assert_int_equal(kb_devd_send_fd(fd, &m, sizeof m, p[0]), 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    kbt_msg_has(msg, "no regular file");
    raw_req(fd, KB_DEVD_BLOCK, 0, 0, 4096, 0, 0, NULL, 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), 0);
    kb_devd_msg d = { KB_DEVD_DOWNLOAD, KB_DEVD_SHARED, 0, 4096, 0, 0 };
    assert_int_equal(kb_devd_send_fd(fd, &d, sizeof d, loose), 0);
    assert_int_equal(raw_reply(fd, msg, sizeof msg), KB_ERR_INVAL);
    kbt_msg_has(msg, "not sealed against shrinking");
    close(fd);
    close(loose);
    close(sealed);
    close(p[0]);
    close(p[1]);
    still_serves(s->path);
}

/*
 * The size bound: through the client, transfers and flushes larger than a request may carry
 * go in several (uploads, a heap payload, a flush of 600 000 records in two parts), with the
 * right bytes; a server's max_bytes bounds a session's arena and payload.
 */
static void test_size_bound(void **state)
{
    srv *s = *state;
    kb_backend be;
    kb_errbuf eb = { { 0 } };
    const kb_resident_ops *ops;
    void *dev;
    const size_t big = (size_t)KB_DEVD_MAX_MSG + 4096, nfill = 600000;
    uint8_t *src = malloc(big), *got = malloc(big);
    kb_rec *recs = calloc(nfill, sizeof *recs);
    assert_non_null(src);
    assert_non_null(got);
    assert_non_null(recs);
    assert_true(nfill * sizeof(kb_rec) > KB_DEVD_MAX_MSG);
    for (size_t i = 0; i < big; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 12));
    assert_int_equal(kb_remote_backend_create(s->path, &be, NULL, 0, &eb), 0);
    kb_resident_device(be.ops->resident(be.self), &ops, &dev);
    assert_int_equal(ops->block(dev, 0, big + 4096, &eb), 0);
    assert_int_equal(ops->upload(dev, 4096, src, big, &eb), 0);
    assert_int_equal(ops->download(dev, 4096, got, big, &eb), 0);
    assert_memory_equal(got, src, big);
    /* a payload from the heap (no shared file): copied, in two requests */
    assert_int_equal(ops->payload(dev, src, big, 0, &eb), 0);
    kb_rec c = copy_f32(0, big - 4096, 1024, 0);
    c.src[0].space = KB_SPACE_PAYLOAD;
    assert_int_equal(be.ops->begin(be.self, NULL, big + 4096, NULL, 0, &eb), 0);
    assert_int_equal(be.ops->run_batch(be.self, &c, 1, &eb), 0);
    assert_int_equal(be.ops->end(be.self, NULL, big + 4096, &eb), 0);
    assert_int_equal(ops->download(dev, 0, got, 4096, &eb), 0);
    assert_memory_equal(got, src + big - 4096, 4096);
    /* a flush of more record bytes than a request: one batch, cut between two parts */
    for (size_t i = 0; i < nfill; i++) {
        recs[i] = kbt_rec_new(KB_REC_FILL, 0);
        recs[i].dst = kb_opnd_make(4 * i, 1, 1, KB_F32);
        recs[i].imm[0] = (float)i;
    }
    assert_int_equal(be.ops->begin(be.self, NULL, big + 4096, NULL, 0, &eb), 0);
    assert_int_equal(be.ops->run_batch(be.self, recs, nfill, &eb), 0);
    assert_int_equal(be.ops->end(be.self, NULL, big + 4096, &eb), 0);
    assert_int_equal(be.ops->sync(be.self, &eb), 0);
    assert_int_equal(ops->download(dev, 0, got, nfill * 4, &eb), 0);
    for (size_t i = 0; i < nfill; i++) {
        float v;
        memcpy(&v, got + 4 * i, 4);
        if (v != (float)i)
            fail_msg("element %zu: %g", i, (double)v);
    }
    be.ops->destroy(be.self);
    free(src);
    free(got);
    free(recs);

    srv s2;
    srv_prepare(&s2, "small.sock");
    s2.max_bytes = 1 << 20;
    srv_run(&s2);
    assert_int_equal(kb_remote_backend_create(s2.path, &be, NULL, 0, &eb), 0);
    kb_resident_device(be.ops->resident(be.self), &ops, &dev);
    assert_int_equal(ops->block(dev, 0, 1 << 20, &eb), 0);
    assert_int_equal(ops->block(dev, 0, (1 << 20) + 1, &eb), KB_ERR_RANGE);
    kbt_msg_has(eb.msg, "more than the 1048576 this server lends a session");
    be.ops->destroy(be.self);
    /* a footprint announced beyond the server's bound: the first block asked for (64 MiB and
     * slack) is refused, the flush's need (4 KiB) is lent */
    run r;
    kb_xfer_stats x;
    run_open(&r, s2.path);
    kb_backend_reserve(&r.be, 64 << 20);
    flush_ok(&r, copy_f32(0x2000, 0x1000, 16, 0));
    kb_backend_xfer_stats(&r.be, &x);
    assert_int_equal(x.blocks, 1);
    assert_int_equal(x.arena_bytes, 4096);
    run_close(&r);
    srv_stop(&s2);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The rate bound: a connection gets a burst of rate_hz requests, then rate_hz a second (it is
 * slowed down, not refused); another connection has a bucket of its own. */
static void test_rate_bound(void **state)
{
    (void)state;
    srv s2;
    srv_prepare(&s2, "rate.sock");
    s2.rate_hz = 100;
    srv_run(&s2);
    int fd = raw_connect(s2.path);
    double t0 = now_s();
    for (int i = 0; i < 250; i++)
        raw_hello(fd, 0);
    double slow = now_s() - t0;
    close(fd);
    fd = raw_connect(s2.path);
    t0 = now_s();
    for (int i = 0; i < 50; i++)
        raw_hello(fd, 0);
    double fresh = now_s() - t0;
    close(fd);
    srv_stop(&s2);
    /* 100 at once, then 150 at 100 a second */
    assert_true(slow >= 1.4);
    assert_true(fresh < 0.4);
}

/* The server's folder: made 0700; refused (and by the client) when it is open to others,
 * another user's, a symbolic link or a file. */
static void test_folder_checks(void **state)
{
    (void)state;
    char dir[400], sock[450], other[400];
    kb_errbuf eb = { { 0 } };
    kb_devd_hello h;
    struct stat st;
    srv s2, dummy;
    memset(&dummy, 0, sizeof dummy);
    kb_devd_opts o = { sock, "cpu", "x", NULL, ref_session, &dummy, NULL, 0, &dummy.stop, -1,
                       0, 0, 0, NULL };

    srv_start(&s2, "fresh/cpu.sock", 0, 0);
    snprintf(dir, sizeof dir, "%s/fresh", kbt_workdir());
    assert_int_equal(lstat(dir, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0700);
    srv_stop(&s2);

    snprintf(dir, sizeof dir, "%s/open", kbt_workdir());
    snprintf(sock, sizeof sock, "%s/cpu.sock", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(kb_devd_serve(&o, &eb), KB_ERR_STATE);
    kbt_msg_has(eb.msg, "is open to other users (mode 0755): chmod 700 ");
    kbt_msg_has(eb.msg, "/open");
    eb.msg[0] = '\0';
    assert_int_equal(kb_remote_hello(sock, &h, &eb), KB_ERR_STATE);
    kbt_msg_has(eb.msg, "chmod 700");
    assert_int_equal(chmod(dir, 0770), 0); /* group access alone is too much */
    assert_int_equal(kb_devd_serve(&o, &eb), KB_ERR_STATE);

    snprintf(dir, sizeof dir, "%s/link", kbt_workdir());
    snprintf(sock, sizeof sock, "%s/cpu.sock", dir);
    snprintf(other, sizeof other, "%s/fresh", kbt_workdir());
    assert_int_equal(symlink(other, dir), 0);
    assert_int_equal(kb_devd_serve(&o, &eb), KB_ERR_STATE);
    kbt_msg_has(eb.msg, "is a symbolic link");
    assert_int_equal(kb_remote_hello(sock, &h, &eb), KB_ERR_STATE);

    kbt_write_file("file", "x\n");
    snprintf(sock, sizeof sock, "%s/file/cpu.sock", kbt_workdir());
    assert_int_equal(kb_devd_serve(&o, &eb), KB_ERR_IO);
    kbt_msg_has(eb.msg, "/file/cpu.sock: Not a directory");
    assert_int_equal(kb_remote_hello(sock, &h, &eb), KB_ERR_IO);
    kbt_msg_has(eb.msg, "/file/cpu.sock: Not a directory");

    if (geteuid() != 0) {
        print_message("[ NOTE     ] a folder of another user: not checked (needs root to "
                      "chown)\n");
        return;
    }
    snprintf(dir, sizeof dir, "%s/foreign", kbt_workdir());
    snprintf(sock, sizeof sock, "%s/cpu.sock", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(chown(dir, 65534, 65534), 0);
    assert_int_equal(kb_devd_serve(&o, &eb), KB_ERR_STATE);
    kbt_msg_has(eb.msg, "belongs to uid 65534, not to this user (uid 0): remove it, or set "
                        "KBCL_DEVD_DIR");
    assert_int_equal(kb_remote_hello(sock, &h, &eb), KB_ERR_STATE);
    kbt_msg_has(eb.msg, "belongs to uid 65534");
}

/* ---- another uid: as root, a forked child that setuid()s to nobody ---- */

#define OTHER_UID 65534

static void need_root(void)
{
    if (geteuid() == 0)
        return;
    /* Without CAP_SETUID no process here can get another kernel uid: in an unprivileged user
     * namespace the peer keeps ours (SO_PEERCRED reports it), so it would not test a thing. */
    print_message("[ SKIPPED  ] needs root (setuid to uid %d): an unprivileged user namespace "
                  "keeps this uid, which the server rightly accepts\n", OTHER_UID);
    skip();
}

/* In a forked child: becomes OTHER_UID for good. */
static int become_other(void)
{
    return setgroups(0, NULL) == 0 && setgid(OTHER_UID) == 0 && setuid(OTHER_UID) == 0 &&
                   geteuid() == OTHER_UID
               ? 0
               : -1;
}

/* Child of test_other_uid_refused: 0 when it connected and the server closed the connection
 * unanswered; 10 + what else happened. */
static int other_hello(const char *path)
{
    struct sockaddr_un sa;
    struct timeval tv = { 5, 0 };
    kb_devd_msg m = { KB_DEVD_HELLO, 1, KB_DEVD_MAGIC, KB_DEVD_PROTO, sizeof(kb_rec), 0 };
    char c;
    if (become_other() != 0)
        return 10;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        return 11; /* a permission would have stopped it: not what this tests */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)!send(fd, &m, sizeof m, MSG_NOSIGNAL);
    ssize_t r = read(fd, &c, 1);
    if (r == 0 || (r < 0 && errno == ECONNRESET))
        return 0;
    return r > 0 ? 12 : 13;
}

static int wait_child(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/*
 * The acceptance test: a client of another uid is refused by the peer check. The folder and
 * socket are opened to it first, so that it really connects: the refusal is the server's
 * (SO_PEERCRED), not the file system's. The server says so, once, with its pid and uid.
 */
static void test_other_uid_refused(void **state)
{
    srv *s = *state;
    srv s2;
    char dir[400], line[200];
    need_root();
    srv_start(&s2, "peer/cpu.sock", 0, 0);
    snprintf(dir, sizeof dir, "%s/peer", kbt_workdir());
    assert_int_equal(chmod(kbt_workdir(), 0711), 0);
    assert_int_equal(chmod(dir, 0711), 0);
    assert_int_equal(chmod(s2.path, 0777), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(other_hello(s2.path));
    int code = wait_child(pid);
    assert_int_equal(chmod(dir, 0700), 0);
    assert_int_equal(chmod(kbt_workdir(), 0700), 0);
    assert_int_equal(code, 0);
    snprintf(line, sizeof line, "refused a connection from pid %ld, uid %d: this server serves "
             "uid 0 only", (long)pid, OTHER_UID);
    assert_true(srv_logged(&s2, line));
    /* this user's clients are served as ever */
    still_serves(s2.path);
    srv_stop(&s2);
    (void)s;
}

/* The folder alone stops another user: the socket cannot even be reached, and the client's
 * own check names the folder's owner. The server hears nothing. */
static void test_other_uid_folder(void **state)
{
    (void)state;
    srv s2;
    need_root();
    srv_start(&s2, "priv/cpu.sock", 0, 0);
    assert_int_equal(chmod(kbt_workdir(), 0711), 0); /* up to the folder, not into it */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct sockaddr_un sa;
        kb_devd_hello h;
        kb_errbuf eb = { { 0 } };
        if (become_other() != 0)
            _exit(10);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, s2.path, strlen(s2.path) + 1);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 || errno != EACCES)
            _exit(11);
        if (kb_remote_hello(s2.path, &h, &eb) != KB_ERR_STATE ||
            !strstr(eb.msg, "belongs to uid 0, not to this user (uid 65534)"))
            _exit(12);
        _exit(0);
    }
    int code = wait_child(pid);
    assert_int_equal(chmod(kbt_workdir(), 0700), 0);
    assert_int_equal(code, 0);
    assert_false(srv_logged(&s2, "refused"));
    srv_stop(&s2);
}

/* The client checks the server's uid too: a socket in this user's folder, bound by this user,
 * but listened on by a process that became another user, is not used. */
static void test_client_checks_server_uid(void **state)
{
    (void)state;
    char dir[400], path[450], ready;
    struct sockaddr_un sa;
    kb_devd_hello h;
    kb_errbuf eb = { { 0 } };
    int p[2];
    need_root();
    snprintf(dir, sizeof dir, "%s/fake", kbt_workdir());
    snprintf(path, sizeof path, "%s/cpu.sock", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        alarm(10); /* never outlive a failed parent */
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, path, strlen(path) + 1);
        /* bound as root (the file is root's), listening as nobody (the credentials a client
         * sees are those of listen) */
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || become_other() != 0 ||
            listen(fd, 4) != 0)
            _exit(10);
        (void)!write(p[1], "r", 1);
        int c = accept(fd, NULL, NULL);
        if (c >= 0)
            close(c);
        _exit(0);
    }
    close(p[1]);
    assert_int_equal(read(p[0], &ready, 1), 1);
    close(p[0]);
    assert_int_equal(kb_remote_hello(path, &h, &eb), KB_ERR_STATE);
    kbt_msg_has(eb.msg, "runs as uid 65534 (pid ");
    kbt_msg_has(eb.msg, "not as this user (uid 0): not used");
    assert_int_equal(wait_child(pid), 0);
}

/* A session driven over one connection in this thread (what the fuzz target does): a good
 * client's requests, then the end it chose; and a malformed request's reason. */
static void test_serve_conn(void **state)
{
    (void)state;
    srv dummy;
    kb_errbuf eb = { { 0 } };
    char msg[512];
    int sv[2];
    memset(&dummy, 0, sizeof dummy);
    kb_devd_opts o = { NULL, "cpu", "x", NULL, ref_session, &dummy, NULL, 0, NULL, -1, 0, 0, 0,
                       NULL };
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    raw_req(sv[0], KB_DEVD_HELLO, 1, KB_DEVD_MAGIC, KB_DEVD_PROTO, sizeof(kb_rec), 0, NULL, 0);
    raw_req(sv[0], KB_DEVD_BLOCK, 0, 0, 64, 0, 0, NULL, 0);
    shutdown(sv[0], SHUT_WR);
    assert_int_equal(kb_devd_serve_conn(&o, sv[1], &eb), 0);
    assert_int_equal(raw_reply(sv[0], msg, sizeof msg), 0);
    assert_int_equal(raw_reply(sv[0], msg, sizeof msg), 0);
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    raw_req(sv[0], KB_DEVD_HELLO, 0, 7, KB_DEVD_PROTO, sizeof(kb_rec), 0, NULL, 0);
    assert_int_equal(kb_devd_serve_conn(&o, sv[1], &eb), KB_ERR_INVAL);
    kbt_msg_has(eb.msg, "magic");
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(dummy.sessions_made, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_as_in_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coll_query, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_sessions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pooled_sessions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_session_not_pooled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copied_payload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_server, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_build, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_arena_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_request, setup, teardown),
        cmocka_unit_test(test_paths),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stalls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ranges_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_files_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_size_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rate_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_folder_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_uid_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_uid_folder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_checks_server_uid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_serve_conn, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
