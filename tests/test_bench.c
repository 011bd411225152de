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

#include <stdio.h>
#include <string.h>

#include "kb_bench.h"

static const kb_ctx_opts ref_opts = { .device = KB_DEV_REF };

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
    kb_ctx_opts o = { .device = dev };
    int rc = kb_bench_execute(&cfg, NULL, &o, b, &a, rep, &eb);
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
    assert_int_equal(kb_bench_execute(&cfg, NULL, &ref_opts, b, &a, &rep, &eb), 0);
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
    assert_int_equal(kb_bench_execute(&cfg, NULL, &ref_opts, b, &a, &rep, &eb), KB_ERR_USAGE);
    assert_non_null(strstr(eb.msg, "multiple"));
    assert_null(kb_bench_find("nope"));
    assert_int_equal(kb_bench_param_index(b, "k"), 1);
    assert_int_equal(kb_bench_param_index(b, "zz"), -1);
}


/* ---- collectives against the closed forms of docs/timing-model.md §11 ---- */

static int64_t xfer(int64_t n, int64_t bytes_per_us)
{
    return (n * 1000000 + bytes_per_us - 1) / bytes_per_us;
}

/* Default-config step costs in ps (docs/timing-model.md §11 table), from the config numbers. */
typedef struct costs {
    int64_t cpu, ipcq, setup, dma, math_fixed, lanes, l_tcm, l_noc, l_hbm, down, up_fixed, m_cpu;
} costs;

static costs default_costs(void)
{
    kb_config c;
    kb_config_defaults(&c);
    const kb_topo_cfg *t = &c.topo;
    costs k;
    k.cpu = (int64_t)(t->pe_cpu_overhead_ns * 1000);
    k.ipcq = (int64_t)(t->ipcq_overhead_ns * 1000);
    k.setup = (int64_t)(t->dma_setup_ns * 1000);
    k.dma = (int64_t)(t->dma_bandwidth_gbps * 1000);
    k.math_fixed = (int64_t)(t->math_fixed_ns * 1000);
    k.lanes = (int64_t)(t->math_lanes_per_ns * 1000);
    k.l_tcm = (int64_t)(t->tcm.latency_ns * 1000);
    k.l_noc = (int64_t)(t->noc.latency_ns * 1000);
    k.l_hbm = (int64_t)(t->hbm.latency_ns * 1000);
    k.m_cpu = (int64_t)(t->m_cpu_overhead_ns * 1000);
    int64_t pcie = (int64_t)(t->pcie.latency_ns * 1000) + xfer(64, (int64_t)(t->pcie.bandwidth_gbps * 1000));
    int64_t noc = k.l_noc + xfer(64, (int64_t)(t->noc.bandwidth_gbps * 1000));
    int64_t ep = (int64_t)(t->pcie_ep_overhead_ns * 1000), io = (int64_t)(t->io_cpu_overhead_ns * 1000);
    k.down = (int64_t)(t->host_overhead_ns * 1000) + pcie + ep + io + k.m_cpu + noc + k.cpu;
    k.up_fixed = noc + io + ep + pcie; /* plus p * M_CPU */
    return k;
}

static int64_t t_load(const costs *k, int64_t b) { return k->cpu + k->l_hbm + k->l_noc + k->l_tcm + k->setup + xfer(b, k->dma); }
static int64_t t_send(const costs *k, int64_t b) { return k->cpu + k->ipcq + 2 * k->l_tcm + k->l_noc + k->setup + xfer(b, k->dma); }
static int64_t t_recv(const costs *k, int64_t b) { return k->cpu + k->ipcq + k->l_tcm + k->setup + xfer(b, k->dma); }
static int64_t t_add(const costs *k, int64_t e) { return k->cpu + k->math_fixed + xfer(e, k->lanes); }
static int64_t t_hbm_ipcq(const costs *k, int64_t b) { return k->cpu + k->ipcq + k->l_hbm + k->l_noc + k->l_tcm + k->setup + xfer(b, k->dma); }

static double ccl_sim_ps(const char *algo, int ws, int n)
{
    const kb_bench *b = kb_bench_find("ccl_allreduce");
    kb_config cfg;
    kb_ccl_cfg ccl;
    kb_errbuf eb;
    kb_run_report rep;
    char set[128];
    kb_ctx_opts none = { .device = KB_DEV_NONE };
    kb_bench_args a = defaults_of(b, 0);
    kb_config_defaults(&cfg);
    kb_ccl_config_defaults(&ccl);
    snprintf(set, sizeof set, "ccl.algorithms.%s.module=%s", algo, algo);
    assert_int_equal(kb_ccl_config_set(&ccl, set, &eb), 0);
    snprintf(set, sizeof set, "ccl.algorithms.%s.topology=ring_1d", algo);
    assert_int_equal(kb_ccl_config_set(&ccl, set, &eb), 0);
    snprintf(set, sizeof set, "ccl.algorithms.%s.world_size=%d", algo, ws);
    assert_int_equal(kb_ccl_config_set(&ccl, set, &eb), 0);
    snprintf(set, sizeof set, "ccl.algorithms.%s.n_elem=%d", algo, n);
    assert_int_equal(kb_ccl_config_set(&ccl, set, &eb), 0);
    snprintf(set, sizeof set, "ccl.defaults.algorithm=%s", algo);
    assert_int_equal(kb_ccl_config_set(&ccl, set, &eb), 0);
    if (kb_bench_execute(&cfg, &ccl, &none, b, &a, &rep, &eb) != 0)
        fail_msg("%s", eb.msg);
    return rep.sim_time_ns * 1000.0;
}

static void assert_within_1pct(double got, int64_t want)
{
    double rel = (got - (double)want) / (double)want;
    if (rel < -0.01 || rel > 0.01)
        fail_msg("simulated %.0f ps, closed form %lld ps (%.3f%%)", got, (long long)want, rel * 100);
}

static void test_ring_closed_form(void **s)
{
    costs k = default_costs();
    int64_t p = 8, n = 32, b = 2 * n;
    int64_t want = k.down + t_load(&k, b) + (p - 1) * (t_send(&k, b) + t_recv(&k, b) + t_add(&k, n)) +
                   t_load(&k, b) /* store: same route reversed */ + k.up_fixed + p * k.m_cpu;
    (void)s;
    assert_int_equal(want, 4900750); /* the worked example of the doc */
    assert_within_1pct(ccl_sim_ps("ring_allreduce", (int)p, (int)n), want);
}

static void test_rsag_closed_form(void **s)
{
    costs k = default_costs();
    int64_t p = 8, n = 64, c = n / p;
    int64_t want = k.down + t_load(&k, 2 * n) +
                   (t_send(&k, 2 * c) + t_recv(&k, 2 * c) + t_add(&k, c)) +
                   (p - 2) * (t_send(&k, 4 * c) + t_recv(&k, 4 * c) + t_add(&k, c)) +
                   t_load(&k, 2 * c) /* store of the owned chunk */ +
                   (p - 1) * 2 * t_hbm_ipcq(&k, 2 * c) + k.up_fixed + p * k.m_cpu;
    (void)s;
    assert_int_equal(want, 6842250);
    assert_within_1pct(ccl_sim_ps("ring_rsag_allreduce", (int)p, (int)n), want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_va_offset),
        cmocka_unit_test(test_gpt3_qkv),
        cmocka_unit_test(test_gemm_ragged_shape),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_ring_closed_form),
        cmocka_unit_test(test_rsag_closed_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
