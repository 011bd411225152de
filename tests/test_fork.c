/*
 * Tests of launches forked over the SIPs (kb_ctx_opts.threads, docs/parallel.md): a collective
 * whose ranks span four SIPs runs its SIPs as partitions of a parallel run and gives the same
 * simulated time, events, fiber switches, kernels and windows at 1, 2, 3 and 4 threads, and
 * the simulated time of the sequential engine. A run that cannot fork (an op log, the route
 * arbitration) runs sequentially, and a bad thread count is refused. Labelled `threads`: make
 * test-tsan runs it under ThreadSanitizer.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_ccl_config.h"

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

/* What cannot fork runs sequentially, with the sequential result: a recording run (the op log
 * is one sequence), verified; the route arbitration (a send books the other SIP at once). */
static void test_sequential_fallbacks(void **state)
{
    kb_run_report seq, rep;
    (void)state;
    ring_ok("per_sip", 0, KB_DEV_REF, &seq);
    ring_ok("per_sip", 2, KB_DEV_REF, &rep);
    assert_int_equal(rep.res.verified, 1);
    assert_int_equal(rep.forked_launches, 0);
    assert_true(rep.sim_time_ns == seq.sim_time_ns);
    assert_int_equal(rep.events, seq.events);
    assert_true(rep.res.digest == seq.res.digest);
    kb_run_report_fini(&rep);
    kb_run_report_fini(&seq);

    ring_ok("route", 0, KB_DEV_NONE, &seq);
    ring_ok("route", 2, KB_DEV_NONE, &rep);
    assert_int_equal(rep.forked_launches, 0);
    assert_true(rep.sim_time_ns == seq.sim_time_ns);
    assert_int_equal(rep.events, seq.events);
    kb_run_report_fini(&rep);
    kb_run_report_fini(&seq);
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
        cmocka_unit_test(test_sequential_fallbacks),
        cmocka_unit_test(test_bad_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
