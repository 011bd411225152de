/*
 * Tests of launches forked over the SIPs (kb_ctx_opts.threads, docs/parallel.md): a collective
 * whose ranks span four SIPs runs its SIPs as partitions of a parallel run and gives the same
 * simulated time, events, fiber switches, kernels and windows at 1, 2, 3 and 4 threads, and
 * the simulated time of the sequential engine; recorded, its replay verifies with the
 * sequential run's digest. A deadlock and a kernel failing in two partitions give the
 * sequential run's report and message. A run that cannot fork (the route arbitration) runs
 * sequentially, and a bad thread count is refused. Labelled `threads`: make
 * test-tsan runs it under ThreadSanitizer.
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
#include "kbcl_runtime.h"
#include "kbcl_tl.h"

#include "kb_test_util.h"

/* ring_rsag_allreduce over 64 ranks on 4 SIPs of 2 cubes (16 ranks each), 8 KiB per rank,
 * with `arbitration`, on `threads` Phase-1 threads and device dev; the bench's result code. */
static int ring_run(const char *arbitration, int threads, kb_device_kind dev, kb_run_report *rep,
                    kb_errbuf *eb)
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
    kb_ctx_opts o = { .device = dev, .threads = threads };

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
static void test_deadlock(void **state)
{
    char msg[3][sizeof(kb_errbuf)], *report[3];
    (void)state;
    for (int k = 0; k < 3; k++) {
        const kb_bench *b = kb_bench_find("ipcq_deadlock");
        kb_bench_args a;
        kb_config cfg;
        kb_run_report rep;
        kb_errbuf eb = { { 0 } };
        kb_ctx_opts o = { .device = KB_DEV_NONE, .threads = k == 0 ? 0 : 2 * k - 1 };
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
        assert_int_equal(kb_bench_execute(&cfg, NULL, &o, b, &a, &rep, &eb), KB_ERR_DEADLOCK);
        kbt_msg_has(eb.msg, "65 fiber(s) are blocked:\n  host: waits on signal\n  "
                    "recv_only@sip0/cube0/pe0: waits on ipcq recv W");
        assert_non_null(rep.report);
        kbt_msg_has(rep.report, "recv_only@sip3/cube1/pe7: waits on ipcq recv W");
        memcpy(msg[k], eb.msg, sizeof msg[k]);
        report[k] = rep.report;
        rep.report = NULL;
        kb_run_report_fini(&rep);
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
static void test_kernel_failure(void **state)
{
    char msg[4][sizeof(kb_errbuf)];
    (void)state;
    for (int t = 0; t <= 3; t++) {
        kb_config cfg;
        kb_ctx *ctx = NULL;
        kb_errbuf eb = { { 0 } };
        kb_ctx_opts o = { .device = KB_DEV_NONE, .threads = t };
        kb_config_defaults(&cfg);
        kbt_config_set(&cfg, "system.sips.count=4");
        kbt_config_set(&cfg, "sip.cube_mesh.width=2");
        kbt_config_set(&cfg, "sip.cube_mesh.height=1");
        kbt_config_set(&cfg, "system.switch.arbitration=per_sip");
        assert_int_equal(kb_ctx_create(&cfg, &o, &ctx, &eb), 0);
        assert_int_equal(kb_ctx_run_host(ctx, h_fail, NULL), KB_ERR_INVAL);
        kbt_msg_has(kb_ctx_errmsg(ctx), "kernel fail on sip1/cube0/pe0 at t=");
        kbt_msg_has(kb_ctx_errmsg(ctx), ": injected on SIP 1");
        snprintf(msg[t], sizeof msg[t], "%s", kb_ctx_errmsg(ctx));
        kb_ctx_destroy(ctx);
        if (t > 0)
            assert_string_equal(msg[t], msg[0]);
    }
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
        cmocka_unit_test(test_same_at_any_threads),
        cmocka_unit_test(test_recorded),
        cmocka_unit_test(test_sequential_fallbacks),
        cmocka_unit_test(test_deadlock),
        cmocka_unit_test(test_kernel_failure),
        cmocka_unit_test(test_bad_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
