/*
 * test_closed_form — the cross-simulator closed form of issue #31 (docs/validation-closed-form.md):
 * kbcl configured as a flat ring of N SIPs of one PE each (configs/machines/flat-ring.yaml),
 * links of bandwidth beta and latency alpha, a one-chunk ring all-reduce of S bytes
 * (ring_rsag_allreduce with a slot of at least S/N bytes: one message per ring step), takes
 *
 *     2(N-1) * (alpha + S/(N*beta))  +  the fixed and local costs named in the document
 *
 * exactly, in picoseconds, for N = 2, 8 and 256. The expected time is computed here from the
 * machine file's own values (loaded with the library's loader, which also proves the file has
 * no unknown key) and compared with what the real kbcl binary ($KBCL_BIN) reports in --json,
 * so a change of the timing model, of the kernel or of the file shows up as a difference of
 * some picoseconds, never hidden by a tolerance. Tests that need the source tree read
 * KBCL_SOURCE_DIR (set by CTest) and are skipped without it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_config.h"

#include "kb_test_util.h"

#define MIB (UINT64_C(1) << 20)
/* The slot of every run: at least S/N for every (N, S) below, so each ring step is one
 * message; two per direction, so a slot's credit is back before the send that needs it
 * (test_one_slot_credit_wait shows the term one slot adds). E + W rings: 64 MiB of the
 * file's 128 MiB IPCQ area. */
#define SLOT_BYTES (16 * MIB)

static kb_config cfg;      /* configs/machines/flat-ring.yaml */
static char machine[512];  /* its path */
static char ccl_yaml[512]; /* configs/ccl.yaml: the defaults the run's own entry inherits */

static int setup(void **s)
{
    kb_errbuf eb;
    (void)s;
    if (kbt_workdir_make("kbcl_test_closed_form") != 0)
        return -1;
    if (!kbt_source_path("configs/machines/flat-ring.yaml", machine, sizeof machine))
        return 0; /* each test skips */
    kbt_source_path("configs/ccl.yaml", ccl_yaml, sizeof ccl_yaml);
    kb_config_defaults(&cfg);
    if (kb_config_load_topology(&cfg, machine, &eb) != 0) {
        fprintf(stderr, "%s\n", eb.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **s)
{
    (void)s;
    return kbt_workdir_remove();
}

static void need_source(void)
{
    if (!getenv("KBCL_SOURCE_DIR"))
        skip();
}

/* ---- the closed form, from the file's values (docs/validation-closed-form.md) ---- */

/* ceil(n * 1000 / rate) ps (kbt_xfer_ps), and ceil(e / rate) for PE_MATH's elements. */
static int64_t x(uint64_t n, double rate) { return kbt_xfer_ps(n, rate); }

typedef struct costs {
    int64_t alpha;            /* link latency + switch overhead (ps) */
    int64_t cpu, ipcq, setup; /* PE_CPU issue, IPCQ post, DMA setup (ps) */
    int64_t mfix;             /* PE_MATH fixed cost (ps) */
    int64_t credit;           /* IPCQ credit latency (ps) */
    int64_t down, up;         /* the launch's command path down and the completion back */
} costs;

static costs costs_of(const kb_topo_cfg *t)
{
    costs k;
    int64_t cmd = x(64, t->pcie.bandwidth_gbps); /* a 64-byte command message on PCIe */
    k.alpha = kbt_ps(t->inter_sip.latency_ns + t->switch_overhead_ns);
    k.cpu = kbt_ps(t->pe_cpu_overhead_ns);
    k.ipcq = kbt_ps(t->ipcq_overhead_ns);
    k.setup = kbt_ps(t->dma_setup_ns);
    k.mfix = kbt_ps(t->math_fixed_ns);
    k.credit = kbt_ps(t->ipcq_credit_latency_ns);
    /* host -> PCIe -> PCIe EP -> IO_CPU -> M_CPU -> PE_CPU: one cube, one PE at the hub's
     * router, so no UCIe or NoC hop (timing-model.md §5) */
    k.down = kbt_ps(t->host_overhead_ns + t->pcie.latency_ns + t->pcie_ep_overhead_ns +
                    t->io_cpu_overhead_ns + t->m_cpu_overhead_ns + t->pe_cpu_overhead_ns) +
             cmd;
    /* PE -> M_CPU -> IO_CPU -> PCIe EP -> PCIe -> host: completions pay no host overhead */
    k.up = kbt_ps(t->m_cpu_overhead_ns + t->io_cpu_overhead_ns + t->pcie_ep_overhead_ns +
                  t->pcie.latency_ns) +
           cmd;
    return k;
}

/* A local DMA of b bytes (a load, a store, a copy out of a slot): its channel's setup and
 * transfer, the longest occupancy of its route when every port is at least as fast as the
 * channel and has no latency (checked by test_machine_file). */
static int64_t t_local(const costs *k, uint64_t b)
{
    return k->setup + x(b, cfg.topo.dma_bandwidth_gbps);
}

/* The parts of the one-chunk ring (ps), for N ranks and S bytes of f16. */
typedef struct ring_terms {
    int64_t net;    /* alpha + S/(N beta): one message on the link */
    int64_t step;   /* the per-step fixed cost c: 2 (cpu + ipcq) + setup */
    int64_t local;  /* the per-step copy-out transfer: ceil(S/N / beta_dma) */
    int64_t add;    /* a reduce-scatter step's combine: cpu + fixed + ceil(S/2N / lanes) */
    int64_t load;   /* the tile into scratch: cpu + setup + ceil(S / beta_dma) */
    int64_t store;  /* the reduced chunk back: cpu + setup + ceil(S/N / beta_dma) */
} ring_terms;

static ring_terms terms(const costs *k, int64_t N, uint64_t S)
{
    ring_terms r;
    uint64_t b = S / (uint64_t)N;
    r.net = k->alpha + x(b, cfg.topo.inter_sip.bandwidth_gbps);
    r.step = 2 * (k->cpu + k->ipcq) + k->setup;
    r.local = x(b, cfg.topo.dma_bandwidth_gbps);
    r.add = k->cpu + k->mfix + x(b / 2, cfg.topo.math_lanes_per_ns);
    r.load = k->cpu + t_local(k, S);
    r.store = k->cpu + t_local(k, b);
    /* the send's DMA setup hides behind the link (the route's longest occupancy, §4) */
    assert_true(x(b, cfg.topo.inter_sip.bandwidth_gbps) >= t_local(k, b));
    return r;
}

/*
 * sim_time of the run, ps:
 *   down + load + (N-1)(send + copy + add) + store + (N-1)(send + copy) + up
 * with send = cpu + ipcq + alpha + S/(N beta) and copy = cpu + ipcq + setup + local, i.e.
 *   2(N-1)(alpha + S/(N beta)) + 2(N-1)(c + local) + (N-1) add + down + load + store + up.
 */
static int64_t closed_form(int64_t N, uint64_t S)
{
    costs k = costs_of(&cfg.topo);
    ring_terms r = terms(&k, N, S);
    return 2 * (N - 1) * r.net + 2 * (N - 1) * (r.step + r.local) + (N - 1) * r.add + k.down +
           r.load + r.store + k.up;
}

/* ---- runs of the binary ---- */

/* sim_time of kbcl's one-chunk ring on N SIPs, S bytes per rank, in ps. ws: the world size
 * (N: rank = PE, one per SIP; 0: rank = SIP, one lane per SIP); slots per direction; dev:
 * "none" or "ref --verify-data". The run has its own entry (flat_ring) so that a change of
 * ccl.yaml's shipped entries cannot change it; it inherits only ccl.yaml's defaults. */
static int64_t run_ps(int64_t N, uint64_t S, int64_t ws, int slots, const char *dev, char *out,
                      size_t n)
{
    const char *E = "ccl.algorithms.flat_ring";
    int rc = kbt_kbcl(out, n,
                      "run --quiet --topology '%s' --ccl '%s' --set system.sips.count=%lld "
                      "--set %s.module=ring_rsag_allreduce --set %s.topology=ring_1d "
                      "--set %s.buffer_kind=tcm --set %s.dtype=f16 --set %s.op=sum "
                      "--set %s.slot_size=%llu --set %s.n_slots=%d --algorithm flat_ring "
                      "--world-size %lld --size %llu --device %s --json out.json",
                      machine, ccl_yaml, (long long)N, E, E, E, E, E, E,
                      (unsigned long long)SLOT_BYTES, E, slots, (long long)ws,
                      (unsigned long long)S, dev);
    if (rc != 0)
        fail_msg("kbcl exited %d:\n%s", rc, out);
    char *j = kbt_slurp("out.json"), *p;
    assert_non_null(j);
    p = strstr(j, "\"sim_time_ns\":");
    assert_non_null(p);
    /* printed in ns with every digit of the integer ps (kb_time_to_ns) */
    int64_t ps = llround(strtod(p + strlen("\"sim_time_ns\":"), NULL) * 1000.0);
    free(j);
    return ps;
}

static void expect_closed_form(int64_t N, uint64_t S)
{
    char out[8192];
    int64_t got = run_ps(N, S, N, 2, "none", out, sizeof out);
    int64_t want = closed_form(N, S);
    print_message("N=%-3lld S=%3llu MiB: simulated %lld ps, closed form %lld ps\n",
                  (long long)N, (unsigned long long)(S / MIB), (long long)got,
                  (long long)want);
    if (got != want)
        fail_msg("N=%lld S=%llu: simulated %lld ps, closed form %lld ps (%+lld)", (long long)N,
                 (unsigned long long)S, (long long)got, (long long)want,
                 (long long)(got - want));
}

/* ---- tests ---- */

/* The file loads (no unknown key: the loader rejects one) and has the shape and the
 * properties the closed form assumes: a ring of SIPs of one cube of one PE; memories without
 * latency and at least as fast as the DMA channel, so a local DMA is its channel's setup and
 * transfer; a switch folded into alpha. */
static void test_machine_file(void **s)
{
    kb_errbuf eb;
    const kb_topo_cfg *t = &cfg.topo;
    (void)s;
    need_source();
    assert_int_equal(kb_config_validate(&cfg, &eb), 0);
    assert_string_equal(t->sips_topology, "ring_1d");
    assert_int_equal(t->cube_mesh_width * t->cube_mesh_height, 1);
    assert_int_equal(t->corners * t->pe_per_corner, 1);
    assert_true(t->switch_overhead_ns == 0.0);
    assert_true(t->tcm.latency_ns == 0.0 && t->hbm.latency_ns == 0.0);
    assert_true(t->tcm.bandwidth_gbps >= t->dma_bandwidth_gbps);
    assert_true(t->hbm.bandwidth_gbps >= t->dma_bandwidth_gbps);
    /* the kernel keeps the whole tile in scratch (one message per step) up to half of it:
     * the largest tile below is 64 MiB; the rings hold E + W slots of SLOT_BYTES */
    assert_true(t->scratch_size_bytes >= 2 * 64 * MIB);
    assert_true(t->ipcq_area_bytes >= 2 * 2 * SLOT_BYTES);
    /* the round numbers of the document */
    assert_true(t->inter_sip.bandwidth_gbps == 100.0 && t->inter_sip.latency_ns == 500.0);
}

/* Every term of the document for N = 8, S = 1 MiB, each from the file (so that the document's
 * table and the file cannot drift apart silently), then the sum. */
static void test_terms_of_the_document(void **s)
{
    (void)s;
    need_source();
    costs k = costs_of(&cfg.topo);
    ring_terms r = terms(&k, 8, MIB);
    assert_int_equal(k.alpha, 500000);
    assert_int_equal(r.net, 500000 + 1310720);    /* 131 072 B at 100 GB/s */
    assert_int_equal(r.step, 44000);              /* 2 (2 + 10) + 20 ns */
    assert_int_equal(r.local, 132);               /* ceil(131.072) ps at 1e6 GB/s */
    assert_int_equal(r.add, 6001);                /* 2 + 4 ns + ceil(65 536 / 1e6) ps */
    assert_int_equal(r.load, 22000 + 1049);       /* 2 + 20 ns + ceil(1 048.576) ps */
    assert_int_equal(r.store, 22000 + 132);
    assert_int_equal(k.down, 2353000);            /* 1000 + 1000 + 1 + 100 + 200 + 50 + 2 ns */
    assert_int_equal(k.up, 1351000);              /* 50 + 200 + 100 + 1000 + 1 ns */
    assert_int_equal(closed_form(8, MIB), 29759116);
}

static void test_n2(void **s)
{
    (void)s;
    need_source();
    expect_closed_form(2, 1 * MIB);
    expect_closed_form(2, 3 * MIB);
    expect_closed_form(2, 32 * MIB);
}

static void test_n8(void **s)
{
    (void)s;
    need_source();
    expect_closed_form(8, 1 * MIB);
    expect_closed_form(8, 3 * MIB);
    expect_closed_form(8, 32 * MIB);
}

static void test_n256(void **s)
{
    (void)s;
    need_source();
    expect_closed_form(256, 1 * MIB);
    expect_closed_form(256, 3 * MIB);
    expect_closed_form(256, 32 * MIB);
    expect_closed_form(256, 64 * MIB);
}

/* Rank = SIP (--world-size 0: one lane per SIP, the SIP's one PE) runs the same kernel on
 * the same PEs: the same time. */
static void test_lanes_same_time(void **s)
{
    char out[8192];
    (void)s;
    need_source();
    assert_int_equal(run_ps(8, 3 * MIB, 0, 2, "none", out, sizeof out), closed_form(8, 3 * MIB));
}

/* The data are right, and data never change the timing (timing-model.md §12). */
static void test_verified(void **s)
{
    char out[8192];
    (void)s;
    need_source();
    assert_int_equal(run_ps(8, MIB, 8, 2, "ref --verify-data", out, sizeof out),
                     closed_form(8, MIB));
    kbt_msg_has(out, "flat_ring (ws=8): 8 OK");
}

/*
 * One slot per direction: the send of a step waits for the credit of the previous message on
 * its queue, which leaves the receiver when its copy-out ends (at the same time as the
 * sender's own, the ring being symmetric) and arrives credit_latency + alpha later. Every
 * step after the first waits for it: a reduce-scatter step by credit + alpha - add (the add
 * ran meanwhile), the first all-gather step by credit + alpha - add - store, the others by
 * credit + alpha. The structural term that n_slots >= 2 removes.
 */
static void test_one_slot_credit_wait(void **s)
{
    char out[8192];
    (void)s;
    need_source();
    static const int64_t Ns[] = { 2, 8 };
    for (size_t i = 0; i < sizeof Ns / sizeof *Ns; i++) {
        int64_t N = Ns[i];
        uint64_t S = MIB;
        costs k = costs_of(&cfg.topo);
        ring_terms r = terms(&k, N, S);
        int64_t rt = k.credit + k.alpha;
        assert_true(rt > r.add + r.store); /* every wait is positive */
        int64_t want = closed_form(N, S) + (N - 2) * (rt - r.add) + (rt - r.add - r.store) +
                       (N - 2) * rt;
        assert_int_equal(run_ps(N, S, N, 1, "none", out, sizeof out), want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_machine_file),
        cmocka_unit_test(test_terms_of_the_document),
        cmocka_unit_test(test_n2),
        cmocka_unit_test(test_n8),
        cmocka_unit_test(test_n256),
        cmocka_unit_test(test_lanes_same_time),
        cmocka_unit_test(test_verified),
        cmocka_unit_test(test_one_slot_credit_wait),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
