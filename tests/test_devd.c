/*
 * test_devd — the device server (kb_devd) and its client backend (kb_remote) over a real
 * Unix socket, with the reference backend's resident variant as the served device (no
 * OpenCL needed): a replay through the server gives the same bytes and the same transfer
 * counts as the same backend in process; two sessions at once keep their data apart; the
 * host data reaches the server through the log's shared payload file or, for other memory, as
 * a copy; the errors a user can meet are reported (no server, a stale socket file, a different build,
 * a server that went away mid-run, a host-arena flush, a pipelined replay that failed on the
 * server), and --stop ends the server.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kb_devd.h"
#include "kb_remote.h"
#include "kb_replay.h"
#include "kb_resident.h"
#include "kb_test_util.h"

typedef struct srv {
    char path[300];
    volatile sig_atomic_t stop;
    pthread_t th;
    int rc;
    int sessions_made;
    int pool, recycled;   /* pool: offer finished backends back (recycle) */
    int fail_at;          /* > 0: a session's fail_at-th flush fails on the server */
    kb_errbuf eb;
} srv;

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
                       s->pool ? ref_recycle : NULL, 0, &s->stop, -1 };
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
    fail_msg("the server did not start listening");
}

/* A second server in the work folder (socket `sock`), for a test of its own. */
static void srv_start(srv *s, const char *sock, int pool, int fail_at)
{
    memset(s, 0, sizeof *s);
    s->pool = pool;
    s->fail_at = fail_at;
    snprintf(s->path, sizeof s->path, "%s/%s", kbt_workdir(), sock);
    assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
    srv_wait_listening(s);
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
 * (host-dirty uploads), poison fills, merges that grow the arena (ARENA with moves, COPY),
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
    /* spans both the 0x30000 and 0x40000 segments: a merge into a grown arena */
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
    assert_int_equal(ops->arena(dev, 4096, NULL, 0, &eb), 0);
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
    kb_devd_opts o = { path, "cpu", "x", NULL, ref_session, &s2, NULL, 0, &s2.stop, -1 };
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_as_in_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_sessions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pooled_sessions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copied_payload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_server, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_build, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_arena_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_request, setup, teardown),
        cmocka_unit_test(test_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
