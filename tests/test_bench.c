/*
 * Tests of the built-in benches through the runner: each verifies against its host
 * reference, is deterministic, and reports the same simulated time without data (--device
 * none). The digests pin the exact output bytes. The collective bench, in both rank models,
 * verifies its seeded inputs exactly (max_abs_err within err_bound) and applies the busbw
 * factor of the algorithm's collective kind. Timing-only runs simulate exactly what recorded
 * runs do and keep no data (no record, payload or memory-store page), and their peak RSS does
 * not grow with the simulated bytes (a forked child per size, Linux's ru_maxrss).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kb_bench.h"
#include "kb_hostgemm.h"
#include "kb_ccl.h"
#include "kb_ccl_config.h"
#include "kb_replay.h"

#include "kb_test_util.h"

static kb_bench_args defaults_of(const kb_bench *b, int verify)
{
    kb_bench_args a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < b->nparams; i++)
        a.p[i] = b->params[i].dflt;
    a.verify = verify;
    return a;
}

/* Set while a test checks a closed form of the model before issue #29 (timing-model.md's bus
 * examples): the machine gets cube.noc.topology=bus and one DMA channel, and the collective
 * configurations built below posted_sends=false (the kernels as they were). */
static int legacy_model;

/* Runs bench b with arguments a on the default machine with device dev (ccl: NULL = the
 * built-in collective configuration); the bench's result code, eb its message. */
static int exec_bench(const kb_bench *b, const kb_ccl_cfg *ccl, kb_device_kind dev,
                      const kb_bench_args *a, kb_run_report *rep, kb_errbuf *eb)
{
    kb_config cfg;
    kb_ctx_opts o = { .device = dev };
    assert_non_null(b);
    kb_config_defaults(&cfg);
    if (legacy_model) {
        kbt_config_set(&cfg, "cube.noc.topology=bus");
        kbt_config_set(&cfg, "pe.dma.channels=1");
    }
    return kb_bench_execute(&cfg, ccl, &o, b, a, rep, eb);
}

/* Bench `name` with its default arguments; any error fails the test. */
static void run_bench(const char *name, kb_device_kind dev, int verify, kb_run_report *rep)
{
    kb_errbuf eb = { { 0 } };
    const kb_bench *b = kb_bench_find(name);
    assert_non_null(b);
    kb_bench_args a = defaults_of(b, verify);
    if (exec_bench(b, NULL, dev, &a, rep, &eb) != 0)
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
    kb_errbuf eb;
    kb_run_report rep;
    kb_bench_args a = defaults_of(b, 1);
    (void)s;
    a.p[0] = 130;
    a.p[1] = 300;
    a.p[2] = 7;
    assert_int_equal(exec_bench(b, NULL, KB_DEV_REF, &a, &rep, &eb), 0);
    assert_int_equal(rep.res.verified, 1);
}

/* Output tiles over PEs: 8 PEs of cube 0 and 16 (two cubes) give gemm's exact bytes, faster;
 * 4096^3 runs (timing only here) at its pinned time. */
static void test_gemm_pes(void **s)
{
    const kb_bench *b = kb_bench_find("gemm");
    kb_errbuf eb;
    kb_run_report r1, r8, r16, big;
    kb_bench_args a = defaults_of(b, 1);
    (void)s;
    a.p[0] = 1000; /* m, k, n: 8 tiles of at most 256 x 512 */
    a.p[1] = 200;
    a.p[2] = 1020;
    assert_int_equal(exec_bench(b, NULL, KB_DEV_REF, &a, &r1, &eb), 0);
    a.p[3] = 8;
    assert_int_equal(exec_bench(b, NULL, KB_DEV_REF, &a, &r8, &eb), 0);
    a.p[3] = 16;
    assert_int_equal(exec_bench(b, NULL, KB_DEV_REF, &a, &r16, &eb), 0);
    assert_int_equal(r1.res.verified, 1);
    assert_int_equal(r8.res.verified, 1);
    assert_int_equal(r16.res.verified, 1);
    assert_int_equal(r8.res.digest, r1.res.digest);
    assert_int_equal(r16.res.digest, r1.res.digest);
    assert_true(r8.sim_time_ns < r1.sim_time_ns / 3);
    assert_true(r16.sim_time_ns < r8.sim_time_ns);
    kb_run_report_fini(&r1);
    kb_run_report_fini(&r8);
    kb_run_report_fini(&r16);
    /* pes=12: neither within one cube nor whole cubes */
    a.p[3] = 12;
    assert_int_equal(exec_bench(b, NULL, KB_DEV_REF, &a, &r1, &eb), KB_ERR_USAGE);
    assert_non_null(strstr(eb.msg, "pes=12"));
    kb_run_report_fini(&r1);
    a = defaults_of(b, 0);
    a.p[0] = a.p[1] = a.p[2] = 4096;
    legacy_model = 1; /* timing-model.md §6's figure for the bus model */
    assert_int_equal(exec_bench(b, NULL, KB_DEV_NONE, &a, &big, &eb), 0);
    legacy_model = 0;
    assert_true(big.sim_time_ns == 34357218.25);
    double bus = big.sim_time_ns;
    kb_run_report_fini(&big);
    /* the network: A's and B's tiles load on two DMA channels at once and cross no NoC link
     * (a PE's own HBM slice to its own TCM), so the same gemm is no slower */
    assert_int_equal(exec_bench(b, NULL, KB_DEV_NONE, &a, &big, &eb), 0);
    assert_true(big.sim_time_ns < bus);
    kb_run_report_fini(&big);
}

/*
 * The bound of a run (kb_bench_mark_end): the gemm bench's default 256^3 f16 gemm on one PE is
 * one tile, 2 * 256^3 flops on PE_GEMM at 4096 flops/ns: 8 192 ns of work (its busy time adds
 * the 16 ns fixed cost, which the bound leaves out). Every other resource carries less for its
 * bandwidth (A and B, 256 KiB, through the HBM port at 256 GB/s: 1 024 ns).
 */
static void test_bound(void **s)
{
    kb_run_report r;
    (void)s;
    run_bench("gemm", KB_DEV_NONE, 0, &r);
    assert_true(r.res.bound_ns == 8192.0);
    assert_string_equal(r.res.bound_resource, "pe_gemm sip0/cube0/pe0");
    assert_true(kb_bench_efficiency(&r.res) == 8192.0 / r.sim_time_ns);
    kb_run_report_fini(&r);
}

/* kb_hostgemm_check gives kb_bench_check's verdict on the full reference: worst error and the
 * first failing element's global index. */
static void test_hostgemm_check(void **s)
{
    enum { M = 70, N = 37, K = 300 };
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *got = malloc(sizeof(float) * M * N);
    double *ref = malloc(sizeof(double) * M * N), *bound = malloc(sizeof(double) * M * N);
    kbt_rng g = { 7 };
    (void)s;
    assert_true(a && b && got && ref && bound);
    for (int pass = 0; pass < 2; pass++) { /* random floats (f64 path), then a coarse grid */
        for (int i = 0; i < M * K; i++)
            a[i] = pass ? (float)((int)kbt_rng_below(&g, 9) - 4) : kbt_rng_float(&g, -1, 1);
        for (int i = 0; i < K * N; i++)
            b[i] = pass ? (float)((int)kbt_rng_below(&g, 9) - 4) / 8 : kbt_rng_float(&g, -1, 1);
        kb_bench_ref_gemm(a, b, M, N, K, ref, bound);
        for (int i = 0; i < M * N; i++) {
            double p = 0.0;
            for (int k = 0; k < K; k++) /* the plain loop's sum, the definition */
                p += (double)a[(i / N) * K + k] * (double)b[k * N + i % N];
            assert_true(ref[i] == p);
            got[i] = kb_f16_to_f32(kb_f32_to_f16((float)ref[i]));
        }
        got[41 * N + 5] += 1.0f;
        got[60 * N + 2] += 2.0f;
        kb_bench_result r1, r2;
        memset(&r1, 0, sizeof r1);
        memset(&r2, 0, sizeof r2);
        assert_int_equal(kb_bench_check(&r1, KB_F16, got, ref, bound, M * N, "c"), 0);
        assert_int_equal(kb_hostgemm_check(&r2, KB_F16, got, a, b, M, N, K, "c"), 0);
        assert_true(r1.max_abs_err == r2.max_abs_err && r1.err_bound == r2.err_bound);
        assert_string_equal(r1.detail, r2.detail);
        assert_non_null(strstr(r2.detail, "c[1522]"));
    }
    free(a);
    free(b);
    free(got);
    free(ref);
    free(bound);
}

static void test_usage_errors(void **s)
{
    /* k not a multiple of the SIP's 128 PEs */
    const kb_bench *b = kb_bench_find("va_offset");
    kb_errbuf eb;
    kb_run_report rep;
    kb_bench_args a = defaults_of(b, 1);
    (void)s;
    a.p[1] = 100;
    assert_int_equal(exec_bench(b, NULL, KB_DEV_REF, &a, &rep, &eb), KB_ERR_USAGE);
    assert_non_null(strstr(eb.msg, "multiple"));
    assert_null(kb_bench_find("nope"));
    assert_int_equal(kb_bench_param_index(b, "k"), 1);
    assert_int_equal(kb_bench_param_index(b, "zz"), -1);
}


/* ---- collectives against the closed forms of docs/timing-model.md §11 ---- */

/*
 * Default-config step costs in ps (docs/timing-model.md §11 table), from the config numbers
 * (times with kbt_ps, transfers with kbt_xfer_ps at the rates in GB/s or elements/ns).
 */
typedef struct costs {
    int64_t cpu, ipcq, setup, math_fixed, l_tcm, l_noc, l_hbm, down, up_fixed, m_cpu;
    double dma, lanes;
} costs;

static costs default_costs(void)
{
    kb_config c;
    kb_config_defaults(&c);
    const kb_topo_cfg *t = &c.topo;
    costs k;
    k.cpu = kbt_ps(t->pe_cpu_overhead_ns);
    k.ipcq = kbt_ps(t->ipcq_overhead_ns);
    k.setup = kbt_ps(t->dma_setup_ns);
    k.dma = t->dma_bandwidth_gbps;
    k.math_fixed = kbt_ps(t->math_fixed_ns);
    k.lanes = t->math_lanes_per_ns;
    k.l_tcm = kbt_ps(t->tcm.latency_ns);
    k.l_noc = kbt_ps(t->noc.latency_ns);
    k.l_hbm = kbt_ps(t->hbm.latency_ns);
    k.m_cpu = kbt_ps(t->m_cpu_overhead_ns);
    int64_t pcie = kbt_ps(t->pcie.latency_ns) + kbt_xfer_ps(64, t->pcie.bandwidth_gbps);
    int64_t noc = k.l_noc + kbt_xfer_ps(64, t->noc.bandwidth_gbps);
    int64_t ep = kbt_ps(t->pcie_ep_overhead_ns), io = kbt_ps(t->io_cpu_overhead_ns);
    k.down = kbt_ps(t->host_overhead_ns) + pcie + ep + io + k.m_cpu + noc + k.cpu;
    k.up_fixed = noc + io + ep + pcie; /* plus p * M_CPU */
    return k;
}

/* b bytes at the DMA rate, e elements at the math lanes' rate */
static int64_t dma(const costs *k, int64_t b) { return kbt_xfer_ps((uint64_t)b, k->dma); }
static int64_t lanes(const costs *k, int64_t e) { return kbt_xfer_ps((uint64_t)e, k->lanes); }

static int64_t t_load(const costs *k, int64_t b) { return k->cpu + k->l_hbm + k->l_noc + k->l_tcm + k->setup + dma(k, b); }
static int64_t t_send(const costs *k, int64_t b) { return k->cpu + k->ipcq + 2 * k->l_tcm + k->l_noc + k->setup + dma(k, b); }
static int64_t t_recv(const costs *k, int64_t b) { return k->cpu + k->ipcq + k->l_tcm + k->setup + dma(k, b); }
static int64_t t_add(const costs *k, int64_t e) { return k->cpu + k->math_fixed + lanes(k, e); }
static int64_t t_hbm_ipcq(const costs *k, int64_t b) { return k->cpu + k->ipcq + k->l_hbm + k->l_noc + k->l_tcm + k->setup + dma(k, b); }

/*
 * Runs ccl_allreduce on a new ccl.yaml entry `name` of `module` (ws 0 = rank = SIP) on the
 * default machine with device dev; fails the test on any error.
 */
static void ccl_entry_run(const char *name, const char *module, const char *topo, int ws, int n,
                          kb_device_kind dev, int verify, kb_run_report *rep)
{
    const kb_bench *b = kb_bench_find("ccl_allreduce");
    kb_ccl_cfg ccl;
    kb_errbuf eb;
    char set[5][128];
    const char *sets[5];
    kb_bench_args a = defaults_of(b, verify);
    snprintf(set[0], sizeof set[0], "ccl.algorithms.%s.module=%s", name, module);
    snprintf(set[1], sizeof set[1], "ccl.algorithms.%s.topology=%s", name, topo);
    snprintf(set[2], sizeof set[2], "ccl.algorithms.%s.world_size=%d", name, ws);
    snprintf(set[3], sizeof set[3], "ccl.algorithms.%s.n_elem=%d", name, n);
    snprintf(set[4], sizeof set[4], "ccl.defaults.algorithm=%s", name);
    for (int i = 0; i < 5; i++)
        sets[i] = set[i];
    kbt_ccl_config_with(&ccl, sets, 5);
    if (legacy_model)
        kbt_ccl_config_set(&ccl, "ccl.defaults.posted_sends=false");
    if (exec_bench(b, &ccl, dev, &a, rep, &eb) != 0)
        fail_msg("%s: %s", name, eb.msg);
}

/* ccl_allreduce with ccl.yaml assignments `sets`; the result code, eb the message. */
static int ccl_sets_run(const char *const *sets, size_t nsets, kb_device_kind dev, int verify,
                        kb_run_report *rep, kb_errbuf *eb)
{
    const kb_bench *b = kb_bench_find("ccl_allreduce");
    kb_ccl_cfg ccl;
    kb_bench_args a = defaults_of(b, verify);
    kbt_ccl_config_with(&ccl, sets, nsets);
    if (legacy_model)
        kbt_ccl_config_set(&ccl, "ccl.defaults.posted_sends=false");
    return exec_bench(b, &ccl, dev, &a, rep, eb);
}

/* ring_rsag_allreduce, 16 ranks x 64 KiB verified, with `cut` records between cuts on
 * backend be (NULL: ref). */
static void rsag16_run(size_t cut, const kb_backend *be, kb_run_report *rep)
{
    const char *sets[] = { "ccl.algorithms.ring_rsag_allreduce.module=ring_rsag_allreduce",
                           "ccl.algorithms.ring_rsag_allreduce.topology=ring_1d",
                           "ccl.algorithms.ring_rsag_allreduce.world_size=16",
                           "ccl.algorithms.ring_rsag_allreduce.n_elem=32768",
                           "ccl.algorithms.ring_rsag_allreduce.slot_size=1048576",
                           "ccl.defaults.algorithm=ring_rsag_allreduce" };
    const kb_bench *b = kb_bench_find("ccl_allreduce");
    kb_bench_args a = defaults_of(b, 1);
    kb_ccl_cfg ccl;
    kb_config cfg;
    kb_errbuf eb = { { 0 } };
    kb_ctx_opts o = { .device = KB_DEV_REF, .backend = be, .cut_records = cut };
    kbt_ccl_config_with(&ccl, sets, 6);
    kb_config_defaults(&cfg);
    if (kb_bench_execute(&cfg, &ccl, &o, b, &a, rep, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_int_equal(rep->res.verified, 1);
}

/*
 * Op-log cuts: every 100 records the run pauses, marks a cut and hands a pipelined backend
 * what it has (12 cuts in 1 248 records, then the rest at the check), and the result is that
 * of ref with one flush; without cuts the pipelined backend also gets one flush.
 */
static void test_pipelined_cuts(void **s)
{
    kb_run_report ref, cut, none;
    kbt_wrap p; /* the runtime takes it for pipelined (it has a sync) */
    kb_backend be = { kbt_wrap_ops(1), &p };
    (void)s;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ref_backend_create_resident(&p.inner), 0);
    rsag16_run(100, NULL, &ref);
    assert_int_equal(ref.replay.flushes, 1);
    assert_int_equal(ref.replay.records, 1248);
    rsag16_run(100, &be, &cut);
    assert_int_equal(cut.res.digest, ref.res.digest);
    assert_int_equal(cut.replay.records, 1248);
    assert_int_equal(cut.replay.flushes, 13);
    assert_int_equal(p.ends, 13);
    assert_true(p.syncs >= 1);
    assert_true(cut.sim_time_ns == ref.sim_time_ns);
    assert_int_equal(cut.events, ref.events);
    p.inner.ops->destroy(p.inner.self);
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ref_backend_create_resident(&p.inner), 0);
    rsag16_run(SIZE_MAX, &be, &none);
    assert_int_equal(none.res.digest, ref.res.digest);
    assert_int_equal(none.replay.flushes, 1);
    assert_int_equal(p.ends, 1);
    p.inner.ops->destroy(p.inner.self);
}

static double ccl_sim_ps(const char *algo, int ws, int n)
{
    kb_run_report rep;
    ccl_entry_run(algo, algo, "ring_1d", ws, n, KB_DEV_NONE, 0, &rep);
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
    /* every reduce-scatter message is an f16 chunk (partials rounded per hop) */
    int64_t want = k.down + t_load(&k, 2 * n) +
                   (p - 1) * (t_send(&k, 2 * c) + t_recv(&k, 2 * c) + t_add(&k, c)) +
                   t_load(&k, 2 * c) /* store of the owned chunk */ +
                   (p - 1) * 2 * t_hbm_ipcq(&k, 2 * c) + k.up_fixed + p * k.m_cpu;
    (void)s;
    assert_int_equal(want, 6840750);
    assert_within_1pct(ccl_sim_ps("ring_rsag_allreduce", (int)p, (int)n), want);
}

/*
 * The other collectives on p ranks of one cube, count c f16 elements per chunk (b = 2c
 * bytes), one slot per message. t_hbm_ipcq is a post (cpu + ipcq) plus a copy-out of the
 * own ring into HBM, or a send from HBM; a send from scratch is t_send.
 *  p2p_sendrecv: load, post, send, copy-out into the tile
 *  ring_allgather: (p-1) x (send the chunk from HBM, post, copy the next one out into HBM)
 *  ring_reducescatter: a post (cpu + ipcq) of the first view, step 0 sends the raw chunk from
 *    HBM; each later step combines its own chunk (loaded from the start of the step before)
 *    with the partial read in place in the receive slot (no copy-out: the view's wait ends at
 *    the arrival, which the symmetric ring has passed), posts the next view and sends the f16
 *    result on, or, in the last step, stores it
 */
static void test_coll_closed_forms(void **s)
{
    costs k = default_costs();
    int64_t p = 8, c = 8, b = 2 * c, up = k.up_fixed + p * k.m_cpu;
    int64_t p2p = k.down + t_load(&k, b) + t_send(&k, b) + t_hbm_ipcq(&k, b) + up;
    int64_t ag = k.down + (p - 1) * 2 * t_hbm_ipcq(&k, b) + up;
    /* ring_reducescatter prefetches: a step's own chunk is loaded (tl_load_async) from the
     * start of the step before; L = t_load(b) is longer than a step's work X (combine, post,
     * send), so the ring runs two steps per L: steps 0..p-2 (p even) end at
     * L + (p-2)/2 * (L + X), then the last combine and the store */
    int64_t post = k.cpu + k.ipcq, L = t_load(&k, b);
    int64_t X = t_add(&k, c) + post + t_send(&k, b);
    int64_t rs = k.down + post + t_hbm_ipcq(&k, b) + L + (p - 2) / 2 * (L + X) + t_add(&k, c) +
                 t_load(&k, b) /* store */ + up;
    (void)s;
    assert_int_equal(p2p, 4373625);
    assert_int_equal(ag, 6012000);
    assert_true(p % 2 == 0 && L > k.cpu + X); /* the regime of the formula */
    assert_int_equal(rs, 5044875);
    /* exact in ps: every rank runs the same sequence and the receive posts hide the skew
     * (the bus model's forms, timing-model.md §11: posted sends pipeline these kernels) */
    legacy_model = 1;
    assert_true(ccl_sim_ps("p2p_sendrecv", (int)p, (int)b / 2) == (double)p2p);
    assert_true(ccl_sim_ps("ring_allgather", (int)p, (int)c) == (double)ag);
    assert_true(ccl_sim_ps("ring_reducescatter", (int)p, (int)c) == (double)rs);
    legacy_model = 0;
}

static double extra(const kb_run_report *rep, const char *name);

/* ring_rsag_allreduce streamed: p ranks of one cube, every chunk k slices of one 16-byte slot
 * (W = 8 f16 elements), n_slots >= k (one block); simulated ps. */
static double rsag_streamed_ps(int p, int k)
{
    char ws[96], n[96];
    snprintf(ws, sizeof ws, "ccl.algorithms.rsag_s.world_size=%d", p);
    snprintf(n, sizeof n, "ccl.algorithms.rsag_s.n_elem=%d", p * 8 * k);
    const char *sets[] = { "ccl.algorithms.rsag_s.module=ring_rsag_allreduce",
                           "ccl.algorithms.rsag_s.topology=ring_1d", ws, n,
                           "ccl.algorithms.rsag_s.slot_size=16",
                           "ccl.algorithms.rsag_s.n_slots=64", "ccl.defaults.algorithm=rsag_s" };
    kb_run_report rep;
    kb_errbuf eb;
    if (ccl_sets_run(sets, sizeof sets / sizeof *sets, KB_DEV_NONE, 0, &rep, &eb) != 0)
        fail_msg("rsag_s p=%d k=%d: %s", p, k, eb.msg);
    assert_true(extra(&rep, "ipcq_chunks") == 2.0 * p * (p - 1) * k); /* 2(p-1) steps of k */
    return rep.sim_time_ns * 1000.0;
}

/*
 * The idle-machine closed form of the streamed ring (docs/timing-model.md §11, "at size"):
 * per slice, every rank posts and sends its own slice from HBM (step 0) and every all-gather
 * slice (p - 1 steps: post, send from HBM); the p - 2 middle reduce-scatter steps run two
 * slices per load latency (D + X: the prefetched own slice of every other slice is not there
 * yet); the last step stores, each store queued behind the next slice's prefetch on PE_DMA.
 * The ends: the first last-step slice waits for its load, the final one prefetches nothing,
 * the final all-gather copy-out lands after the last send.
 */
static void test_rsag_streamed_closed_form(void **s)
{
    legacy_model = 1; /* the bus model's form (timing-model.md §11) */
    costs k = default_costs();
    const int64_t b = 16, W = 8; /* one slot: 16 bytes = 8 f16 elements */
    int64_t c = k.cpu, P = k.cpu + k.ipcq, o = k.setup + dma(&k, b);
    int64_t D = t_load(&k, b) - k.cpu;        /* HBM <-> TCM DMA: latencies + setup + transfer */
    int64_t a = t_add(&k, W) - k.cpu;         /* PE_MATH of one slice */
    int64_t Sh = t_hbm_ipcq(&k, b);           /* send from the tile in HBM */
    int64_t X = c + t_add(&k, W) + P + t_send(&k, b); /* a middle slice with its data there */
    static const struct { int p, k; } cases[] = { { 2, 3 }, { 2, 16 }, { 4, 3 }, { 4, 8 },
                                                  { 8, 5 }, { 3, 4 }, { 3, 5 } };
    (void)s;
    /* the regime: middle steps wait on their loads, a store queues behind a prefetch */
    assert_true(D + c > X && 2 * c + a < o);
    assert_int_equal(D + X, 188375);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int64_t p = cases[i].p, n = cases[i].k, N = (p - 2) * n; /* middle-step slices */
        int64_t want = k.down + p * n * (P + Sh) + N / 2 * (D + X) + (n - 2) * (c + o + D) +
                       (3 * c + a + 2 * D) + (2 * c + a + D) + D + k.up_fixed + p * k.m_cpu;
        if (N % 2) /* an odd count: the last middle slice is a short one (X), and the last
                    * step's first load is there by its prefetch (its store queues instead) */
            want += X + o - 2 * c - a;
        if (p == 2 && n == 3)
            assert_int_equal(want, 5347000);
        if (rsag_streamed_ps((int)p, (int)n) != (double)want)
            fail_msg("p=%lld k=%lld: simulated %.0f ps, closed form %lld ps", (long long)p,
                     (long long)n, rsag_streamed_ps((int)p, (int)n), (long long)want);
    }
    legacy_model = 0;
}

/* ---- the collective bench: verification and busbw per collective kind ---- */

static double extra(const kb_run_report *rep, const char *name)
{
    for (int i = 0; i < rep->res.nextras; i++)
        if (!strcmp(rep->res.extras[i].name, name))
            return rep->res.extras[i].value;
    fail_msg("no extra '%s'", name);
    return 0.0;
}

/* Runs ccl_allreduce on a new entry `name` of `module` (ws 0 = rank = SIP), verified. */
static void ccl_bench(const char *name, const char *module, const char *topo, int ws, int n,
                      kb_run_report *rep)
{
    ccl_entry_run(name, module, topo, ws, n, KB_DEV_REF, 1, rep);
}

static void test_ccl_verify_and_busbw(void **s)
{
    static const struct { const char *module, *topo; int ws, n, ranks; kb_coll_kind k;
                          int ok; } cases[] = {
        { "ring_allreduce", "ring_1d", 8, 32, 8, KB_COLL_ALLREDUCE, 8 },
        { "ring_rsag_allreduce", "ring_1d", 16, 64, 16, KB_COLL_ALLREDUCE, 16 },
        { "hello_send", "ring_1d", 4, 32, 4, KB_COLL_SENDRECV, 4 },
        { "hierarchical_allreduce", "hierarchical_3level", 16, 32, 16, KB_COLL_ALLREDUCE, 16 },
        /* the lanes form: 2 cubes x 8 PEs, a tile that streams (past a 256 KiB slot) */
        { "hierarchical_allreduce", "hierarchical_lanes", 16, 70001, 16, KB_COLL_ALLREDUCE, 16 },
        { "hierarchical_allreduce", "hierarchical_lanes", 64, 300007, 64, KB_COLL_ALLREDUCE,
          64 },
        { "ring_allgather", "ring_1d", 8, 5, 8, KB_COLL_ALLGATHER, 8 },
        { "ring_reducescatter", "ring_1d", 8, 5, 8, KB_COLL_REDUCE_SCATTER, 8 },
        { "pairwise_alltoall", "full_mesh", 8, 5, 8, KB_COLL_ALLTOALL, 8 },
        { "ring_broadcast", "ring_1d", 8, 33, 8, KB_COLL_BROADCAST, 8 },
        { "tree_reduce", "tree_binary", 8, 33, 8, KB_COLL_REDUCE, 8 },
        { "p2p_sendrecv", "ring_1d", 8, 33, 8, KB_COLL_SENDRECV, 8 },
        /* rank = SIP: 2 SIPs; ok counts ranks (of 16 cubes' PE 0 / 128 PEs' shards each) */
        { "intercube_allreduce", "ring_1d", 0, 32, 2, KB_COLL_ALLREDUCE, 2 },
        { "hierarchical_allreduce", "ring_1d", 0, 8, 2, KB_COLL_ALLREDUCE, 2 },
        /* rank = SIP in lanes: the rank = PE kernels over every PE of 2 SIPs */
        { "ring_allgather", "ring_1d", 0, 300, 2, KB_COLL_ALLGATHER, 2 },
        { "tree_reduce", "tree_binary", 0, 129, 2, KB_COLL_REDUCE, 2 },
    };
    kb_run_report rep;
    char ok[32];
    (void)s;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ccl_bench("c", cases[i].module, cases[i].topo, cases[i].ws, cases[i].n, &rep);
        if (rep.res.verified != 1)
            fail_msg("%s: %s", cases[i].module, rep.res.detail);
        snprintf(ok, sizeof ok, "%d OK", cases[i].ok);
        assert_string_equal(rep.res.ok_text, ok);
        assert_true(rep.res.have_err && rep.res.max_abs_err <= rep.res.err_bound);
        assert_int_equal((int)extra(&rep, "world_size"), cases[i].ranks);
        double algbw = extra(&rep, "algbw_gbps"), busbw = extra(&rep, "busbw_gbps");
        assert_true(algbw > 0);
        assert_true(busbw == algbw * kb_coll_busbw_factor(cases[i].k, cases[i].ranks));
        if (cases[i].k == KB_COLL_SENDRECV) /* send/recv's busbw is its algbw */
            assert_true(busbw == algbw);
        if (cases[i].ws > 0) {
            /* nccl-tests' count and size: the chunked kinds' buffer is ws chunks of count */
            assert_true(extra(&rep, "n_elem") == cases[i].n);
            assert_true(extra(&rep, "size_bytes") ==
                        2.0 * cases[i].n * kb_coll_tile_ranks(cases[i].k, cases[i].ws));
            /* the busbw at the run's bound: busbw / efficiency (efficiency <= 1) */
            double bound = extra(&rep, "busbw_bound_gbps"), eff = kb_bench_efficiency(&rep.res);
            assert_true(eff > 0.0 && eff <= 1.0);
            assert_true(fabs(bound - busbw / eff) <= 1e-9 * bound);
            assert_true(busbw <= bound);
        }
        kb_run_report_fini(&rep);
    }
    /*
     * Across SIPs the ring is bound by the inter-SIP link sip0 -> sip1: the one ring edge that
     * crosses it (rank 127 -> 128) carries a chunk of c = 2n/256 bytes in each of the 255
     * reduce-scatter and 255 all-gather steps, 510 c = 4 177 920 bytes at 100 GB/s:
     * 41 779.2 ns. Nothing else carries as much for its bandwidth (a PE's DMA channels move
     * about 4 * 255 c at 4 x 128 GB/s, its HBM port 510 c at 256, a UCIe ring edge 510 c at
     * 256).
     */
    kb_run_report big;
    ccl_entry_run("c", "ring_rsag_allreduce", "ring_1d", 256, 256 * 4096, KB_DEV_NONE, 0, &big);
    assert_true(big.res.bound_ns == 41779.2);
    assert_string_equal(big.res.bound_resource, "inter_sip sip0->sip1 (link 0)");
    assert_true(kb_bench_efficiency(&big.res) <= 1.0);
    assert_true(extra(&big, "busbw_gbps") <= extra(&big, "busbw_bound_gbps"));
    kb_run_report_fini(&big);
    /* the seeded inputs pin the output bytes; they change no simulated time (the closed form
     * of test_ring_closed_form, the bus model's) */
    legacy_model = 1;
    ccl_bench("c", "ring_allreduce", "ring_1d", 8, 32, &rep);
    legacy_model = 0;
    assert_int_equal(rep.res.digest, UINT64_C(0xa7f4e44cf91d2a15));
    assert_true(rep.sim_time_ns == 4900.75);
    kb_run_report_fini(&rep);
}

/* ---- timing-only runs: the same numbers, no data ---- */

/* rep (timing only) and ref (recorded) simulated the same thing; rep holds no data.
 * generated: the recorded run's inputs are seeded values generated where they replay (GEN
 * records), so they take no payload. */
static void assert_same_timing_no_data(const char *what, const kb_run_report *rep,
                                       const kb_run_report *ref, int generated)
{
    if (rep->sim_time_ns != ref->sim_time_ns || rep->events != ref->events ||
        rep->switches != ref->switches || rep->kernels != ref->kernels ||
        rep->sim_end_ns != ref->sim_end_ns)
        fail_msg("%s: timing only %.3f ns / %llu events / %llu switches, recorded %.3f / %llu "
                 "/ %llu", what, rep->sim_time_ns, (unsigned long long)rep->events,
                 (unsigned long long)rep->switches, ref->sim_time_ns,
                 (unsigned long long)ref->events, (unsigned long long)ref->switches);
    assert_int_equal(rep->records, 0);
    assert_int_equal(rep->memstore_pages, 0);
    assert_int_equal(rep->payload_bytes, 0);
    assert_int_equal(rep->res.verified, -1);
    /* the recorded run did keep its data */
    assert_true(ref->records > 0 && ref->memstore_pages > 0);
    if (generated)
        assert_int_equal(ref->payload_bytes, 0);
    else
        assert_true(ref->payload_bytes > 0);
    assert_int_equal(ref->res.verified, 1);
}

/*
 * Every bench whose inputs come from fills (the collective bench in both rank models, with
 * a large tile, and the TP benches) simulates exactly the same with and without data, and a
 * timing-only run ends with an empty memory store, no op-log record and no payload.
 */
static void test_timing_only_same_numbers(void **s)
{
    static const char *const legacy[] = {
        "ccl.algorithms.big.module=ring_rsag_allreduce", "ccl.algorithms.big.topology=ring_1d",
        "ccl.algorithms.big.world_size=16", "ccl.algorithms.big.n_elem=262144",
        "ccl.defaults.slot_size=131072", "ccl.defaults.buffer_kind=hbm",
        "ccl.defaults.algorithm=big",
    };
    static const char *const dist[] = {
        "ccl.algorithms.sip.module=hierarchical_allreduce", "ccl.algorithms.sip.n_elem=4096",
        "ccl.defaults.slot_size=16384", "ccl.defaults.algorithm=sip",
    };
    const char *const *cases[] = { legacy, dist };
    const size_t ncases[] = { sizeof legacy / sizeof *legacy, sizeof dist / sizeof *dist };
    kb_run_report rn, rr;
    kb_errbuf eb;
    (void)s;
    for (size_t i = 0; i < 2; i++) {
        if (ccl_sets_run(cases[i], ncases[i], KB_DEV_NONE, 1, &rn, &eb) != 0 ||
            ccl_sets_run(cases[i], ncases[i], KB_DEV_REF, 1, &rr, &eb) != 0)
            fail_msg("%s", eb.msg);
        assert_same_timing_no_data(cases[i][0], &rn, &rr, 1);
        kb_run_report_fini(&rn);
        kb_run_report_fini(&rr);
    }
    static const char *const tps[] = { "tp_mlp", "tp_attention", "gemm", "va_offset" };
    for (size_t i = 0; i < sizeof tps / sizeof *tps; i++) {
        run_bench(tps[i], KB_DEV_NONE, 1, &rn);
        run_bench(tps[i], KB_DEV_REF, 1, &rr);
        /* their bench patterns are GEN records too (issue #33): no payload either */
        assert_same_timing_no_data(tps[i], &rn, &rr, 1);
        kb_run_report_fini(&rn);
        kb_run_report_fini(&rr);
    }
}

/* Peak RSS (KiB) of a child process that runs the 256-rank ring_rsag_allreduce timing-only
 * with tiles of n f16 elements; -1 on failure. */
static long child_peak_rss(int64_t n)
{
    int fd[2];
    long kib = -1;
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char set[96];
        const char *sets[] = { "ccl.algorithms.r.module=ring_rsag_allreduce",
                               "ccl.algorithms.r.topology=ring_1d",
                               "ccl.algorithms.r.world_size=256", "ccl.defaults.algorithm=r",
                               "ccl.defaults.slot_size=65536", set };
        kb_run_report rep;
        kb_errbuf eb;
        struct rusage ru;
        snprintf(set, sizeof set, "ccl.algorithms.r.n_elem=%lld", (long long)n);
        long out = -1;
        if (ccl_sets_run(sets, 6, KB_DEV_NONE, 0, &rep, &eb) != 0)
            fprintf(stderr, "child: %s\n", eb.msg);
        else if (rep.events > 0 && getrusage(RUSAGE_SELF, &ru) == 0)
            out = ru.ru_maxrss;
        if (write(fd[1], &out, sizeof out) != (ssize_t)sizeof out)
            _exit(2);
        _exit(0);
    }
    close(fd[1]);
    if (pid > 0) {
        if (read(fd[0], &kib, sizeof kib) != (ssize_t)sizeof kib)
            kib = -1;
        waitpid(pid, NULL, 0);
    }
    close(fd[0]);
    return kib;
}

/*
 * Issue #13: a timing-only run's host memory does not grow with the simulated bytes. 256
 * ranks of 1 KiB tiles (256 KiB in all) and of 4 MiB tiles (1 GiB in all, which used to cost
 * 2 GiB of f32 inputs): the peak RSS of the two runs (each in a child forked from the same
 * state) is the same within 64 MiB.
 */
static void test_timing_only_memory_flat(void **s)
{
    (void)s;
    long small = child_peak_rss(512), big = child_peak_rss(2097152);
    if (small < 0 || big < 0)
        fail_msg("child run failed (%ld / %ld KiB)", small, big);
    if (big - small > 64 * 1024)
        fail_msg("peak RSS %ld KiB at 1 GiB simulated vs %ld KiB at 256 KiB", big, small);
}

/* A run's roofline (kb_bench_result.roofline): present, and no larger than the run's time — a
 * run faster than its workload's lower bound would be a bug in one of the two. */
static void check_roofline(const char *what, const kb_run_report *rep)
{
    double e = kb_bench_roofline_efficiency(&rep->res);
    if (!rep->res.have_roofline)
        fail_msg("%s: no roofline", what);
    if (!(e > 0.0 && e <= 1.0))
        fail_msg("%s: roofline %.3f ns (%s), sim_time %.3f ns", what, rep->res.roofline.ns,
                 kb_roofline_bound_name(rep->res.roofline.bound), rep->sim_time_ns);
}

/* Every ccl.yaml entry the project ships, at its own size and at --size 1M. */
static void roofline_ccl(const kb_bench *b)
{
    char path[1024];
    kb_ccl_cfg base;
    kb_errbuf eb = { { 0 } };
    kb_ccl_config_defaults(&base);
    if (kb_ccl_config_load(&base, kbt_source_path("configs/ccl.yaml", path, sizeof path), &eb))
        fail_msg("%s", eb.msg);
    for (int i = 0; i < base.nalgos; i++) {
        char set[160], what[192];
        for (int big = 0; big < 2; big++) {
            kb_ccl_cfg ccl = base;
            kb_run_report rep;
            kb_bench_args a = defaults_of(b, 0);
            snprintf(set, sizeof set, "ccl.defaults.algorithm=%s", base.algos[i].name);
            kbt_ccl_config_set(&ccl, set);
            a.size_bytes = big ? 1 << 20 : 0;
            if (exec_bench(b, &ccl, KB_DEV_NONE, &a, &rep, &eb) != 0)
                fail_msg("%s: %s", base.algos[i].name, eb.msg);
            snprintf(what, sizeof what, "%s %s", base.algos[i].name, big ? "1M" : "default");
            check_roofline(what, &rep);
            kb_run_report_fini(&rep);
        }
    }
}

/* decoder_layer on the tiny model: prefill, seq_parallel, 2:4 mxint8 and a decode step, and
 * prefill in both mappings (auto takes machine for prefill). */
static void roofline_decoder(const kb_bench *b)
{
    static const int64_t cases[6][6] = {
        /* seq, decode, kv_len, seq_parallel, sparse, mapping */
        { 16, 0, 0, 0, 0, 2 }, { 16, 0, 0, 1, 0, 2 }, { 32, 0, 0, 0, 1, 2 }, { 1, 1, 64, 0, 0, 2 },
        { 16, 0, 0, 0, 0, 0 }, { 32, 0, 0, 0, 1, 0 } };
    char path[1024];
    kb_errbuf eb = { { 0 } };
    for (int c = 0; c < 6; c++) {
        kb_run_report rep;
        kb_bench_args a = defaults_of(b, 0);
        char what[64];
        a.model = kbt_source_path("configs/models/tiny.yaml", path, sizeof path);
        a.dtype = cases[c][4] ? "mxint8" : NULL;
        a.p[kb_bench_param_index(b, "seq")] = cases[c][0];
        a.p[kb_bench_param_index(b, "decode")] = cases[c][1];
        if (cases[c][1])
            a.p[kb_bench_param_index(b, "kv_len")] = cases[c][2];
        a.p[kb_bench_param_index(b, "seq_parallel")] = cases[c][3];
        a.p[kb_bench_param_index(b, "sparse")] = cases[c][4];
        a.p[kb_bench_param_index(b, "mapping")] = cases[c][5];
        if (exec_bench(b, NULL, KB_DEV_NONE, &a, &rep, &eb) != 0)
            fail_msg("decoder_layer case %d: %s", c, eb.msg);
        snprintf(what, sizeof what, "decoder_layer case %d", c);
        check_roofline(what, &rep);
        /* the time split: four parts, none negative, that add up to the layer's time; every
         * launch has a command path (kb_launch_span) */
        double parts[4] = { extra(&rep, "compute_ns"), extra(&rep, "memory_ns"),
                            extra(&rep, "comm_ns"), extra(&rep, "launch_ns") };
        double sum = 0, total = kb_time_to_ns(rep.res.t_end - rep.res.t_begin);
        for (int k = 0; k < 4; k++) {
            if (parts[k] < 0)
                fail_msg("%s: part %d of the split is %g", what, k, parts[k]);
            sum += parts[k];
        }
        assert_true(fabs(sum - total) < 1e-6 * total);
        assert_true(parts[3] > 0);
        kb_run_report_fini(&rep);
    }
}

/*
 * Every built-in bench at a small size, timing only (--device none): its roofline is at most
 * its simulated time (roofline_efficiency <= 1). The gemm also on 16 PEs (two cubes: C's
 * stores cross them) and ragged; ipcq_deadlock, which ends in a deadlock by design, has none.
 */
static void test_roofline_every_bench(void **s)
{
    kb_errbuf eb = { { 0 } };
    (void)s;
    for (int i = 0; kb_bench_at(i); i++) {
        const kb_bench *b = kb_bench_at(i);
        kb_run_report rep;
        if (!strcmp(b->name, "ipcq_deadlock"))
            continue;
        if (b->size_elem_bytes > 0) {
            roofline_ccl(b);
            continue;
        }
        if (kb_bench_takes_model(b)) {
            roofline_decoder(b);
            continue;
        }
        run_bench(b->name, KB_DEV_NONE, 0, &rep);
        check_roofline(b->name, &rep);
        kb_run_report_fini(&rep);
    }
    {
        const kb_bench *b = kb_bench_find("gemm");
        static const int64_t shapes[2][4] = { { 256, 256, 256, 16 }, { 200, 72, 328, 3 } };
        for (int k = 0; k < 2; k++) {
            kb_run_report rep;
            kb_bench_args a = defaults_of(b, 0);
            for (int j = 0; j < 4; j++)
                a.p[j] = shapes[k][j];
            if (exec_bench(b, NULL, KB_DEV_NONE, &a, &rep, &eb) != 0)
                fail_msg("gemm: %s", eb.msg);
            check_roofline("gemm (pes > 1)", &rep);
            kb_run_report_fini(&rep);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_va_offset),
        cmocka_unit_test(test_gpt3_qkv),
        cmocka_unit_test(test_gemm_ragged_shape),
        cmocka_unit_test(test_gemm_pes),
        cmocka_unit_test(test_bound),
        cmocka_unit_test(test_hostgemm_check),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_ring_closed_form),
        cmocka_unit_test(test_rsag_closed_form),
        cmocka_unit_test(test_coll_closed_forms),
        cmocka_unit_test(test_rsag_streamed_closed_form),
        cmocka_unit_test(test_ccl_verify_and_busbw),
        cmocka_unit_test(test_timing_only_same_numbers),
        cmocka_unit_test(test_timing_only_memory_flat),
        cmocka_unit_test(test_pipelined_cuts),
        cmocka_unit_test(test_roofline_every_bench),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
