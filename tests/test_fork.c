/*
 * Tests of launches forked over the SIPs (kb_ctx_opts.threads, docs/parallel.md): a collective
 * whose ranks span four SIPs runs its SIPs as partitions of a parallel run and gives the same
 * simulated time, events, fiber switches, kernels and windows at 1, 2, 3 and 4 threads, and
 * the simulated time of the sequential engine; recorded, its replay verifies with the
 * sequential run's digest. A deadlock and a kernel failing in two partitions give the
 * sequential run's report and message. A run that cannot fork (the route arbitration) runs
 * sequentially, and a bad thread count is refused. Spread over 2 and 3 processes (kb_ctx_opts.net,
 * forked here as mpirun would start them), each gets what one process gets, failures and a
 * deadlock's report included. Labelled `threads`: make test-tsan runs it under ThreadSanitizer.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_ccl_config.h"
#include "kb_ipcq.h"
#include "kbcl_runtime.h"
#include "kbcl_tl.h"

#include "kb_psim.h"
#include "kb_runtime_ext.h"
#include "kb_test_net.h"
#include "kb_test_util.h"

/* ring_rsag_allreduce over 64 ranks on 4 SIPs of 2 cubes (16 ranks each), 8 KiB per rank,
 * with `arbitration`, on `threads` Phase-1 threads and device dev; the bench's result code. */
static int ring_run_net(const char *arbitration, int threads, kb_device_kind dev,
                        const kb_psim_net *net, kb_run_report *rep, kb_errbuf *eb)
{
    static const char *const sets[] = {
        "ccl.algorithms.ring_rsag_allreduce.module=ring_rsag_allreduce",
        "ccl.algorithms.ring_rsag_allreduce.topology=ring_1d",
        "ccl.algorithms.ring_rsag_allreduce.world_size=64",
        "ccl.algorithms.ring_rsag_allreduce.n_elem=4096",
        "ccl.defaults.algorithm=ring_rsag_allreduce",
    };
    char arb[64];
    const kb_bench *b = kb_bench_find("ccl_allreduce");
    kb_bench_args a;
    kb_ccl_cfg ccl;
    kb_config cfg;
    kb_ctx_opts o = { .device = dev, .threads = threads, .net = net };

    assert_non_null(b);
    memset(&a, 0, sizeof a);
    for (int i = 0; i < b->nparams; i++)
        a.p[i] = b->params[i].dflt;
    a.verify = dev != KB_DEV_NONE;
    kbt_ccl_config_with(&ccl, sets, sizeof sets / sizeof sets[0]);
    kb_config_defaults(&cfg);
    kbt_config_set(&cfg, "system.sips.count=4");
    kbt_config_set(&cfg, "sip.cube_mesh.width=2");
    kbt_config_set(&cfg, "sip.cube_mesh.height=1");
    snprintf(arb, sizeof arb, "system.switch.arbitration=%s", arbitration);
    kbt_config_set(&cfg, arb);
    memset(rep, 0, sizeof *rep);
    return kb_bench_execute(&cfg, &ccl, &o, b, &a, rep, eb);
}

static int ring_run(const char *arbitration, int threads, kb_device_kind dev, kb_run_report *rep,
                    kb_errbuf *eb)
{
    return ring_run_net(arbitration, threads, dev, NULL, rep, eb);
}

static void ring_ok(const char *arbitration, int threads, kb_device_kind dev, kb_run_report *rep)
{
    kb_errbuf eb = { { 0 } };
    if (ring_run(arbitration, threads, dev, rep, &eb) != 0)
        fail_msg("%s, %d threads: %s", arbitration, threads, eb.msg);
}

/*
 * Every thread count gives one result, and it is the sequential engine's simulated time: the
 * ring's events at equal times keep their order across the partitions. The forked run fires
 * one event more (the join, in the context's simulation). Every window of a partition is at
 * least the lookahead (an inter-SIP link's latency) long, so a ring of 2 x 63 steps over four
 * SIPs takes a few hundred of them, and never fewer than its steps.
 */
static void test_same_at_any_threads(void **state)
{
    kb_run_report seq, rep[5];
    (void)state;
    ring_ok("per_sip", 0, KB_DEV_NONE, &seq);
    assert_int_equal(seq.threads, 0);
    assert_int_equal(seq.forked_launches, 0);
    assert_int_equal(seq.kernels, 64);
    for (int t = 1; t <= 4; t++) {
        kb_run_report *r = &rep[t];
        ring_ok("per_sip", t, KB_DEV_NONE, r);
        assert_int_equal(r->threads, t);
        assert_int_equal(r->forked_launches, 1);
        assert_int_equal(r->kernels, 64);
        assert_true(r->sim_time_ns == seq.sim_time_ns);
        assert_true(r->sim_end_ns == seq.sim_end_ns);
        assert_int_equal(r->events, seq.events + 1);
        assert_int_equal(r->switches, seq.switches);
        assert_true(r->windows >= 2 * 63);
        assert_int_equal(r->windows, rep[1].windows);
        kb_run_report_fini(r);
    }
    kb_run_report_fini(&seq);
}

/* A recorded run forks too: its partitions' records are gathered into the op log after every
 * window, and the replay gives the sequential run's verified digest and record count at every
 * thread count. */
static void test_recorded(void **state)
{
    kb_run_report seq, rep;
    (void)state;
    ring_ok("per_sip", 0, KB_DEV_REF, &seq);
    assert_int_equal(seq.res.verified, 1);
    for (int t = 1; t <= 3; t++) {
        ring_ok("per_sip", t, KB_DEV_REF, &rep);
        assert_int_equal(rep.res.verified, 1);
        assert_int_equal(rep.forked_launches, 1);
        assert_true(rep.sim_time_ns == seq.sim_time_ns);
        assert_int_equal(rep.events, seq.events + 1);
        assert_int_equal(rep.records, seq.records);
        assert_true(rep.res.digest == seq.res.digest);
        kb_run_report_fini(&rep);
    }
    kb_run_report_fini(&seq);
}

/* What cannot fork runs sequentially, with the sequential result: the route arbitration (a
 * send books the other SIP at once). */
static void test_sequential_fallbacks(void **state)
{
    kb_run_report seq, rep;
    (void)state;
    ring_ok("route", 0, KB_DEV_NONE, &seq);
    ring_ok("route", 2, KB_DEV_NONE, &rep);
    assert_int_equal(rep.forked_launches, 0);
    assert_true(rep.sim_time_ns == seq.sim_time_ns);
    assert_int_equal(rep.events, seq.events);
    kb_run_report_fini(&rep);
    kb_run_report_fini(&seq);
}

/* A deadlock in a forked launch (every PE of a 64-rank ring only receives, over 4 SIPs):
 * KB_ERR_DEADLOCK with every partition's blocked fibers listed after the host's, the same
 * report at 1 and 3 threads as the sequential run's. */
/* The deadlocking ring (below) on `threads` and net: its code, its message in msg and its
 * report (malloc'd) in *report. */
static int deadlock_run(int threads, const kb_psim_net *net, char *msg, char **report)
{
    const kb_bench *b = kb_bench_find("ipcq_deadlock");
    kb_bench_args a;
    kb_config cfg;
    kb_run_report rep;
    kb_errbuf eb = { { 0 } };
    kb_ctx_opts o = { .device = KB_DEV_NONE, .threads = threads, .net = net };
    int rc;
    assert_non_null(b);
    memset(&a, 0, sizeof a);
    for (int i = 0; i < b->nparams; i++)
        a.p[i] = b->params[i].dflt;
    a.p[0] = 64; /* world_size */
    kb_config_defaults(&cfg);
    kbt_config_set(&cfg, "system.sips.count=4");
    kbt_config_set(&cfg, "sip.cube_mesh.width=2");
    kbt_config_set(&cfg, "sip.cube_mesh.height=1");
    kbt_config_set(&cfg, "system.switch.arbitration=per_sip");
    memset(&rep, 0, sizeof rep);
    rc = kb_bench_execute(&cfg, NULL, &o, b, &a, &rep, &eb);
    memcpy(msg, eb.msg, sizeof(kb_errbuf));
    *report = rep.report;
    rep.report = NULL;
    kb_run_report_fini(&rep);
    return rc;
}

static void test_deadlock(void **state)
{
    char msg[3][sizeof(kb_errbuf)], *report[3];
    (void)state;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(deadlock_run(k == 0 ? 0 : 2 * k - 1, NULL, msg[k], &report[k]),
                         KB_ERR_DEADLOCK);
        kbt_msg_has(msg[k], "65 fiber(s) are blocked:\n  host: waits on signal\n  "
                    "recv_only@sip0/cube0/pe0: waits on ipcq recv W");
        assert_non_null(report[k]);
        kbt_msg_has(report[k], "recv_only@sip3/cube1/pe7: waits on ipcq recv W");
    }
    assert_string_equal(msg[1], msg[2]);
    assert_string_equal(msg[0], msg[1]);
    assert_string_equal(report[1], report[2]);
    assert_string_equal(report[0], report[1]);
    for (int k = 0; k < 3; k++)
        free(report[k]);
}

/* ---- a kernel failing in two partitions ---- */

static void k_fail(kb_tl *tl, const kb_kargs *a)
{
    int s = tl_program_id(tl, 2);
    (void)a;
    if ((s == 1 || s == 3) && tl_program_id(tl, 0) == 0 && tl_program_id(tl, 1) == 0)
        tl_fail(tl, KB_ERR_INVAL, "injected on SIP %d", s);
}

static int h_fail(kb_ctx *ctx, void *arg)
{
    kb_kargs a;
    kb_grid all = { 0, 0, 4, 0 };
    (void)arg;
    memset(&a, 0, sizeof a);
    return kb_launch(ctx, "fail", k_fail, &a, &all);
}

/* Kernels on SIPs 1 and 3 fail at the same simulated time: the run fails with SIP 1's message
 * (the lowest-numbered failed partition's) at 1, 2 and 3 threads, as the sequential run does
 * (SIP 1's kernels come first in its event order). */
/* A timing-only context on 4 SIPs of 2 cubes with per_sip, on `threads` and net. */
static kb_ctx *four_sips(int threads, const kb_psim_net *net)
{
    kb_config cfg;
    kb_ctx *ctx = NULL;
    kb_errbuf eb = { { 0 } };
    kb_ctx_opts o = { .device = KB_DEV_NONE, .threads = threads, .net = net };
    kb_config_defaults(&cfg);
    kbt_config_set(&cfg, "system.sips.count=4");
    kbt_config_set(&cfg, "sip.cube_mesh.width=2");
    kbt_config_set(&cfg, "sip.cube_mesh.height=1");
    kbt_config_set(&cfg, "system.switch.arbitration=per_sip");
    assert_int_equal(kb_ctx_create(&cfg, &o, &ctx, &eb), 0);
    return ctx;
}

/* The failing launch on `threads` and net: its code, its message in msg. */
static int fail_run(int threads, const kb_psim_net *net, char *msg)
{
    kb_ctx *ctx = four_sips(threads, net);
    int rc = kb_ctx_run_host(ctx, h_fail, NULL);
    snprintf(msg, sizeof(kb_errbuf), "%s", kb_ctx_errmsg(ctx));
    kb_ctx_destroy(ctx);
    return rc;
}

static void test_kernel_failure(void **state)
{
    char msg[4][sizeof(kb_errbuf)];
    (void)state;
    for (int t = 0; t <= 3; t++) {
        assert_int_equal(fail_run(t, NULL, msg[t]), KB_ERR_INVAL);
        kbt_msg_has(msg[t], "kernel fail on sip1/cube0/pe0 at t=");
        kbt_msg_has(msg[t], ": injected on SIP 1");
        if (t > 0)
            assert_string_equal(msg[t], msg[0]);
    }
}

/* ---- several processes (kb_ctx_opts.net; what kbcl run does under mpirun) ---- */

/* Vector work of a size that differs from PE to PE, so that every SIP's resources end a launch
 * in a state of their own; and each SIP's first PE passes a message round the ring of SIPs
 * (two slots of 256 bytes and a message of two chunks: the second launch's sends need the
 * credits of the first's receives), so that the IPCQ's state carries from one launch to the
 * next. */
static void k_work(kb_tl *tl, const kb_kargs *a)
{
    int n = 1 + (tl_program_id(tl, 2) * 7 + tl_program_id(tl, 1) * 3 + tl_program_id(tl, 0)) % 5;
    (void)a;
    for (int i = 0; i < n; i++)
        (void)tl_exp(tl, tl_full(tl, (kb_shape){ 16, 16 * (uint32_t)n }, 1.0f));
    if (tl_program_id(tl, 0) == 0 && tl_program_id(tl, 1) == 0) {
        tl_send(tl, KB_DIR_GLOBAL_E, tl_full(tl, (kb_shape){ 2, 64 }, 2.0f));
        (void)tl_recv(tl, KB_DIR_GLOBAL_W, (kb_shape){ 2, 64 }, KB_F32);
    }
}

static void res_fold(void *ud, const kb_res *r, const char *where)
{
    uint64_t *h = ud;
    (void)where;
    const uint64_t v[] = { (uint64_t)r->free_at, (uint64_t)r->hole_lo, (uint64_t)r->hole_hi,
                           r->bytes, (uint64_t)r->busy };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        *h = (*h ^ v[i]) * 0x100000001b3ull;
}

/* Two launches of k_work over the 4 SIPs, then the digest of every resource of the machine and
 * of the ring's IPCQ counters (arg), as the host sees them. */
static int h_work(kb_ctx *ctx, void *arg)
{
    kb_kargs a;
    kb_grid all = { 0, 0, 4, 0 };
    kb_machine *m = kb_ctx_machine(ctx);
    kb_ipcq_cfg cfg = { .n_slots = 2, .slot_size = 256, .buffer_kind = KB_MEM_TCM,
                        .backpressure = 1 };
    kb_ipcq_link links[8];
    uint64_t *h = arg;
    for (int s = 0; s < 4; s++) {
        kb_pe_hw *p = kb_machine_pe(m, (unsigned)s, 0, 0);
        kb_pe_hw *q = kb_machine_pe(m, (unsigned)(s + 1) % 4, 0, 0);
        links[2 * s] = (kb_ipcq_link){ p, KB_DIR_GLOBAL_E, q, KB_DIR_GLOBAL_W };
        links[2 * s + 1] = (kb_ipcq_link){ q, KB_DIR_GLOBAL_W, p, KB_DIR_GLOBAL_E };
    }
    int irc = kb_ipcq_install(ctx, &cfg, links, 8);
    if (irc)
        return irc;
    memset(&a, 0, sizeof a);
    for (int k = 0; k < 2; k++) {
        int rc = kb_launch(ctx, "work", k_work, &a, &all);
        if (rc)
            return rc;
    }
    *h = 0xcbf29ce484222325ull;
    kb_machine_each_res(m, res_fold, h);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 2; d++) {
            kb_ipcq_counters c;
            if (kb_ipcq_counters_of(ctx, kb_machine_pe(m, (unsigned)s, 0, 0),
                                    d ? KB_DIR_GLOBAL_W : KB_DIR_GLOBAL_E, &c) != 0)
                return KB_ERR_STATE;
            const uint64_t v[] = { c.my_head, c.my_tail, c.peer_head_cache, c.peer_tail_cache };
            for (int i = 0; i < 4; i++)
                *h = (*h ^ v[i]) * 0x100000001b3ull;
        }
    return 0;
}

/* The two launches on `threads` and net: the code; the machine's digest in *h and the
 * launches that forked in *forked. */
static int work_run(int threads, const kb_psim_net *net, uint64_t *h, uint64_t *forked)
{
    kb_ctx *ctx = four_sips(threads, net);
    int rc = kb_ctx_run_host(ctx, h_work, h), th;
    uint64_t win;
    kb_ctx_fork_stats(ctx, &th, forked, &win);
    kb_ctx_destroy(ctx);
    return rc;
}

typedef struct proc_result {
    kb_run_report tm, rec;  /* the ring timed, and recorded and verified */
    int rc_tm, rc_rec, rc_fail, rc_dl, rc_work;
    uint64_t work_digest, work_forked; /* the machine after two forked launches */
    char fail[sizeof(kb_errbuf)], dl[sizeof(kb_errbuf)];
    char *dl_report;
} proc_result;

/* Every run of this file on `threads` and net (NULL: one process). No cmocka checks: the
 * forked processes run it too. */
static void proc_runs(int threads, const kb_psim_net *net, proc_result *r)
{
    kb_errbuf eb = { { 0 } };
    memset(r, 0, sizeof *r);
    r->rc_tm = ring_run_net("per_sip", threads, KB_DEV_NONE, net, &r->tm, &eb);
    r->rc_rec = ring_run_net("per_sip", threads, KB_DEV_REF, net, &r->rec, &eb);
    r->rc_fail = fail_run(threads, net, r->fail);
    r->rc_dl = deadlock_run(threads, net, r->dl, &r->dl_report);
    r->rc_work = work_run(threads, net, &r->work_digest, &r->work_forked);
}

static void proc_fini(proc_result *r)
{
    kb_run_report_fini(&r->tm);
    kb_run_report_fini(&r->rec);
    free(r->dl_report);
}

/*
 * The ring over 4 SIPs spread over 2 and 3 processes (forked here as mpirun would start them;
 * 2 threads each in the second): every process gets what one process gets: the simulated
 * time, events, switches, kernels and windows; recorded, the records, digest and verdict;
 * the failing launch's message (SIP 1's, though SIP 3 fails in another process); the
 * deadlock's message and whole report (every SIP's blocked fibers, the IPCQ counters); every
 * resource of the machine after two launches, as the host sees it.
 */
static void test_processes(void **state)
{
    proc_result got[2], one;
    (void)state;
    for (int k = 0; k < 2; k++) {
        kbt_net net;
        assert_int_equal(kbt_net_start(&net, k + 2), 0);
        kb_psim_net pn = { net.rank, net.nranks, kbt_net_allgather, &net };
        proc_runs(k + 1, &pn, &got[k]);
        if (net.rank != 0) {
            int ok = got[k].rc_tm == 0 && got[k].rc_rec == 0 && got[k].rec.res.verified == 1 &&
                     got[k].rc_fail == KB_ERR_INVAL && got[k].rc_dl == KB_ERR_DEADLOCK &&
                     got[k].rc_work == 0;
            kbt_net_finish(&net, ok ? 0 : 1);
        }
        assert_int_equal(kbt_net_finish(&net, 0), 0);
    }
    proc_runs(1, NULL, &one); /* after the forks: this process alone, on one thread */
    assert_int_equal(one.rc_tm, 0);
    assert_int_equal(one.rc_rec, 0);
    assert_int_equal(one.rec.res.verified, 1);
    assert_int_equal(one.tm.forked_launches, 1);
    for (int k = 0; k < 2; k++) {
        proc_result *g = &got[k];
        assert_int_equal(g->rc_tm, 0);
        assert_true(g->tm.sim_time_ns == one.tm.sim_time_ns);
        assert_true(g->tm.sim_end_ns == one.tm.sim_end_ns);
        assert_int_equal(g->tm.events, one.tm.events);
        assert_int_equal(g->tm.switches, one.tm.switches);
        assert_int_equal(g->tm.kernels, one.tm.kernels);
        assert_int_equal(g->tm.windows, one.tm.windows);
        assert_int_equal(g->tm.forked_launches, 1);
        assert_int_equal(g->rc_rec, 0);
        assert_int_equal(g->rec.res.verified, 1);
        assert_int_equal(g->rec.records, one.rec.records);
        assert_true(g->rec.res.digest == one.rec.res.digest);
        assert_true(g->rec.sim_time_ns == one.rec.sim_time_ns);
        assert_int_equal(g->rc_fail, KB_ERR_INVAL);
        assert_string_equal(g->fail, one.fail);
        assert_int_equal(g->rc_dl, KB_ERR_DEADLOCK);
        assert_string_equal(g->dl, one.dl);
        assert_non_null(g->dl_report);
        assert_string_equal(g->dl_report, one.dl_report);
        assert_int_equal(g->rc_work, 0);
        assert_int_equal(g->work_forked, 2);
        assert_true(g->work_digest == one.work_digest);
        proc_fini(g);
    }
    proc_fini(&one);
}

static void test_bad_thread_count(void **state)
{
    kb_run_report rep;
    kb_errbuf eb = { { 0 } };
    (void)state;
    assert_int_equal(ring_run("per_sip", -1, KB_DEV_NONE, &rep, &eb), KB_ERR_USAGE);
    kbt_msg_has(eb.msg, "-1 Phase-1 threads: give 1 to 64");
    assert_int_equal(ring_run("per_sip", KB_CTX_MAX_THREADS + 1, KB_DEV_NONE, &rep, &eb),
                     KB_ERR_USAGE);
    kbt_msg_has(eb.msg, "65 Phase-1 threads");
    kb_run_report_fini(&rep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_processes), /* first: it forks, before any other thread runs */
        cmocka_unit_test(test_same_at_any_threads),
        cmocka_unit_test(test_recorded),
        cmocka_unit_test(test_sequential_fallbacks),
        cmocka_unit_test(test_deadlock),
        cmocka_unit_test(test_kernel_failure),
        cmocka_unit_test(test_bad_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
