/*
 * Tests of the built-in benches through the runner: each verifies against its host
 * reference, is deterministic, and reports the same simulated time without data (--device
 * none). The digests pin the exact output bytes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kb_bench.h"

static const kb_ctx_opts ref_opts = { KB_DEV_REF, NULL };

static kb_bench_args defaults_of(const kb_bench *b, int verify)
{
    kb_bench_args a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < b->nparams; i++)
        a.p[i] = b->params[i].dflt;
    a.verify = verify;
    return a;
}

static void run_bench(const char *name, kb_device_kind dev, int verify, kb_run_report *rep)
{
    kb_config cfg;
    kb_errbuf eb = { { 0 } };
    const kb_bench *b = kb_bench_find(name);
    assert_non_null(b);
    kb_config_defaults(&cfg);
    kb_bench_args a = defaults_of(b, verify);
    kb_ctx_opts o = { dev, NULL };
    int rc = kb_bench_execute(&cfg, &o, b, &a, rep, &eb);
    if (rc)
        fail_msg("%s: %s", name, eb.msg);
}

static void check_bench(const char *name, uint64_t digest)
{
    kb_run_report r1, r2, rn;
    run_bench(name, KB_DEV_REF, 1, &r1);
    assert_int_equal(r1.res.verified, 1);
    assert_true(r1.res.have_digest);
    assert_true(r1.sim_time_ns > 0);
    assert_true(r1.replay.records > 0);
    assert_true(r1.replay.batches >= 1 && r1.replay.batches <= r1.replay.records);
    assert_true(r1.res.max_abs_err <= r1.res.err_bound);
    /* determinism */
    run_bench(name, KB_DEV_REF, 1, &r2);
    assert_int_equal(r1.res.digest, r2.res.digest);
    assert_true(r1.sim_time_ns == r2.sim_time_ns);
    assert_int_equal(r1.events, r2.events);
    /* timing-only run: same simulated time, nothing recorded, nothing checked */
    run_bench(name, KB_DEV_NONE, 1, &rn);
    assert_true(rn.sim_time_ns == r1.sim_time_ns);
    assert_int_equal(rn.events, r1.events);
    assert_int_equal(rn.records, 0);
    assert_int_equal(rn.res.verified, -1);
    /* the exact output bytes */
    assert_int_equal(r1.res.digest, digest);
}

static void test_gemm(void **s)
{
    (void)s;
    check_bench("gemm", UINT64_C(0xb1904fb1444fed8a));
}

static void test_va_offset(void **s)
{
    (void)s;
    check_bench("va_offset", UINT64_C(0x0b0c1e2b05459353));
}

static void test_gpt3_qkv(void **s)
{
    (void)s;
    check_bench("gpt3_qkv", UINT64_C(0x0ce77d95cbf22621));
}

static void test_gemm_ragged_shape(void **s)
{
    /* shapes that are not multiples of SchedulerV2's 128 tiles */
    const kb_bench *b = kb_bench_find("gemm");
    kb_config cfg;
    kb_errbuf eb;
    kb_run_report rep;
    kb_bench_args a = defaults_of(b, 1);
    (void)s;
    kb_config_defaults(&cfg);
    a.p[0] = 130;
    a.p[1] = 300;
    a.p[2] = 7;
    assert_int_equal(kb_bench_execute(&cfg, &ref_opts, b, &a, &rep, &eb), 0);
    assert_int_equal(rep.res.verified, 1);
}

static void test_usage_errors(void **s)
{
    /* k not a multiple of the SIP's 128 PEs */
    const kb_bench *b = kb_bench_find("va_offset");
    kb_config cfg;
    kb_errbuf eb;
    kb_run_report rep;
    kb_bench_args a = defaults_of(b, 1);
    (void)s;
    kb_config_defaults(&cfg);
    a.p[1] = 100;
    assert_int_equal(kb_bench_execute(&cfg, &ref_opts, b, &a, &rep, &eb), KB_ERR_USAGE);
    assert_non_null(strstr(eb.msg, "multiple"));
    assert_null(kb_bench_find("nope"));
    assert_int_equal(kb_bench_param_index(b, "k"), 1);
    assert_int_equal(kb_bench_param_index(b, "zz"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_va_offset),
        cmocka_unit_test(test_gpt3_qkv),
        cmocka_unit_test(test_gemm_ragged_shape),
        cmocka_unit_test(test_usage_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
