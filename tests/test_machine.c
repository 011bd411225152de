/*
 * test_machine — kb_machine: route contents (local, same PE, cross-cube XY, cross-SIP through
 * the gateway cubes, host transfers), idle-path DMA times against the closed form of
 * docs/timing-model.md, FIFO queuing, the command path hop by hop, SIP topologies and
 * machine sizes. Expected times are computed here from the config numbers with plain integer
 * picosecond arithmetic (not the library's helpers) and, for the defaults, also written out
 * as the literal numbers the document's worked examples give. Limits: only the default
 * machine and small variants; resource statistics are checked only where they pin a rule.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kb_config.h"
#include "kb_machine.h"
#include "kb_test_util.h"

/* ---- independent arithmetic (with kbt_ps and kbt_xfer_ps of kb_test_util.h) ---- */

static int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- machine construction ---- */

/* The model before issue #29 (cube.noc.topology=bus, one DMA channel), which the tests
 * below up to test_host_transfer_idle pin with timing-model.md's bus examples; sets apply
 * after it. The network model's tests use make_net. */
static const char *const legacy[] = { "cube.noc.topology=bus", "pe.dma.channels=1" };

static kb_machine *make_from(kb_config *cfg)
{
    kb_errbuf eb;
    kb_machine *m = NULL;
    assert_int_equal(kb_config_validate(cfg, &eb), 0);
    assert_int_equal(kb_machine_create(&cfg->topo, &m, &eb), 0);
    assert_non_null(m);
    return m;
}

static kb_machine *make_machine(const char *const *sets, int nsets)
{
    kb_config cfg;
    kbt_config_with(&cfg, legacy, 2);
    for (int i = 0; i < nsets; i++)
        kbt_config_set(&cfg, sets[i]);
    return make_from(&cfg);
}

/* The shipped model (mesh NoC, pe.dma.channels of the defaults) changed by sets. */
static kb_machine *make_net(const char *const *sets, int nsets)
{
    kb_config cfg;
    kbt_config_with(&cfg, sets, (size_t)nsets);
    return make_from(&cfg);
}

static kb_machine *make_default(void) { return make_machine(NULL, 0); }

static kb_pa hbm_of(const kb_machine *m, unsigned s, unsigned c, unsigned p, uint64_t off)
{
    return kb_pa_pe_hbm(s, c, p, off, m->hbm_slice_bytes);
}

static int route(kb_machine *m, const kb_pe_hw *issuer, kb_pa src, kb_pa dst, kb_res **path)
{
    kb_errbuf eb;
    int n = kb_machine_route(m, issuer, src, dst, path, KB_MAX_ROUTE, &eb);
    assert_true(n > 0);
    return n;
}

static kb_res *ucie(kb_machine *m, unsigned s, unsigned c, int dir)
{
    return &m->sips[s].cubes[c].ucie_out[dir];
}

/* ---- routes ---- */

static void test_defaults_shape(void **state)
{
    kb_machine *m = make_default();

    (void)state;
    assert_int_equal(m->nsips, 2);
    assert_int_equal(m->ncubes, 16);
    assert_int_equal(m->npes, 8);
    assert_int_equal(m->mesh_w, 4);
    assert_int_equal(m->mesh_h, 4);
    assert_int_equal(m->hbm_slice_bytes, UINT64_C(6) << 30);
    assert_int_equal(m->host_overhead, 1000000);
    /* bandwidths become integer bytes/us; CPUs are fixed costs with infinite bandwidth */
    kb_pe_hw *pe = kb_machine_pe(m, 1, 15, 7);
    assert_int_equal(pe->gid, (1 * 16 + 15) * 8 + 7);
    assert_ptr_equal(m->pe_by_gid[pe->gid], pe);
    assert_int_equal(pe->dma[0].bytes_per_us, 128000);
    assert_int_equal(pe->dma[0].fixed, 20000);
    assert_int_equal(pe->hbm_port.bytes_per_us, 256000);
    assert_int_equal(pe->hbm_port.latency, 100000);
    assert_int_equal(pe->tcm_port.bytes_per_us, 1024000);
    assert_int_equal(pe->cpu.bytes_per_us, 0);
    assert_int_equal(pe->cpu.fixed, 2000);
    /* PE_MATH counts elements (64/ns), PE_GEMM flops (4096/ns) */
    assert_int_equal(pe->math.bytes_per_us, 64000);
    assert_int_equal(pe->math.fixed, 4000);
    assert_int_equal(pe->gemm.bytes_per_us, 4096000);
    assert_int_equal(pe->gemm.fixed, 16000);
    assert_int_equal(kb_res_occupancy(&pe->math, 100), 4000 + 1563);
    /* inter-SIP links carry the switch overhead as latency */
    assert_int_equal(m->sips[0].links[0].link.latency, 505000);
    assert_int_equal(m->sips[0].links[0].link.bytes_per_us, 100000);
    kb_machine_destroy(m);
    kb_machine_destroy(NULL);
}

static void test_route_local_tcm(void **state)
{
    kb_machine *m = make_default();
    kb_pe_hw *pe = kb_machine_pe(m, 0, 3, 2), *peer = kb_machine_pe(m, 0, 3, 5);
    kb_res *path[KB_MAX_ROUTE];
    int n;

    (void)state;
    /* TCM -> scratch inside the issuing PE: engine and the one TCM port, no NoC */
    n = route(m, pe, kb_pa_pe_tcm(0, 3, 2, 0), kb_pa_pe_scratch(0, 3, 2, 4096), path);
    assert_int_equal(n, 2);
    assert_ptr_equal(path[0], &pe->dma[0]);
    assert_ptr_equal(path[1], &pe->tcm_port);
    /* ipcq -> tcm is local too */
    n = route(m, pe, kb_pa_pe_ipcq(0, 3, 2, 64), kb_pa_pe_tcm(0, 3, 2, 0), path);
    assert_int_equal(n, 2);
    /* to a neighbour PE's TCM in the same cube: one NoC (appears once), two ports */
    n = route(m, pe, kb_pa_pe_tcm(0, 3, 2, 0), kb_pa_pe_tcm(0, 3, 5, 0), path);
    assert_int_equal(n, 4);
    assert_ptr_equal(path[0], &pe->dma[0]);
    assert_ptr_equal(path[1], &pe->tcm_port);
    assert_ptr_equal(path[2], &m->sips[0].cubes[3].noc);
    assert_ptr_equal(path[3], &peer->tcm_port);
    kb_machine_destroy(m);
}

static void test_route_hbm_same_pe(void **state)
{
    kb_machine *m = make_default();
    kb_pe_hw *pe = kb_machine_pe(m, 1, 6, 4);
    kb_res *path[KB_MAX_ROUTE];
    int n;

    (void)state;
    n = route(m, pe, hbm_of(m, 1, 6, 4, 4096), kb_pa_pe_tcm(1, 6, 4, 0), path);
    assert_int_equal(n, 4);
    assert_ptr_equal(path[0], &pe->dma[0]);
    assert_ptr_equal(path[1], &pe->hbm_port);
    assert_ptr_equal(path[2], &m->sips[1].cubes[6].noc);
    assert_ptr_equal(path[3], &pe->tcm_port);
    /* the port of an HBM address is the slice's owner PE */
    assert_ptr_equal(kb_machine_port(m, hbm_of(m, 1, 6, 7, 0), NULL),
                     &kb_machine_pe(m, 1, 6, 7)->hbm_port);
    assert_ptr_equal(kb_machine_port(m, kb_pa_cube_sram(1, 6, 0), NULL),
                     &m->sips[1].cubes[6].sram_port);
    kb_machine_destroy(m);
}

static void test_route_cross_cube_xy(void **state)
{
    kb_machine *m = make_default();
    kb_pe_hw *pe = kb_machine_pe(m, 0, 5, 1);    /* cube 5 = (x 1, y 1) */
    kb_pe_hw *far = kb_machine_pe(m, 0, 14, 3);  /* cube 14 = (x 2, y 3) */
    kb_res *path[KB_MAX_ROUTE];
    int n, hops = 0;

    (void)state;
    assert_int_equal(kb_machine_cube_hops(m, 5, 14), 3);
    assert_int_equal(kb_machine_cube_hops(m, 0, 15), 6);
    assert_int_equal(kb_machine_cube_hops(m, 7, 7), 0);
    n = route(m, pe, hbm_of(m, 0, 5, 1, 0), kb_pa_pe_tcm(0, 14, 3, 0), path);
    assert_int_equal(n, 8);
    assert_ptr_equal(path[0], &pe->dma[0]);
    assert_ptr_equal(path[1], &pe->hbm_port);
    assert_ptr_equal(path[2], &m->sips[0].cubes[5].noc);
    /* X first (E from cube 5), then Y (S from cube 6, S from cube 10) */
    assert_ptr_equal(path[3], ucie(m, 0, 5, KB_MESH_E));
    assert_ptr_equal(path[4], ucie(m, 0, 6, KB_MESH_S));
    assert_ptr_equal(path[5], ucie(m, 0, 10, KB_MESH_S));
    assert_ptr_equal(path[6], &m->sips[0].cubes[14].noc);
    assert_ptr_equal(path[7], &far->tcm_port);
    for (int i = 0; i < n; i++)
        hops += strcmp(path[i]->name, "ucie") == 0;
    assert_int_equal(hops, kb_machine_cube_hops(m, 5, 14));

    /* the way back: W from cube 14, then N from cube 13 and cube 9 */
    n = route(m, far, kb_pa_pe_tcm(0, 14, 3, 0), hbm_of(m, 0, 5, 1, 0), path);
    assert_int_equal(n, 8);
    assert_ptr_equal(path[3], ucie(m, 0, 14, KB_MESH_W));
    assert_ptr_equal(path[4], ucie(m, 0, 13, KB_MESH_N));
    assert_ptr_equal(path[5], ucie(m, 0, 9, KB_MESH_N));

    /* corner to corner: 3 E then 3 S, 6 UCIe hops */
    n = route(m, kb_machine_pe(m, 0, 0, 0), hbm_of(m, 0, 0, 0, 0), kb_pa_pe_tcm(0, 15, 0, 0),
              path);
    assert_int_equal(n, 4 + 6 + 1);
    assert_ptr_equal(path[3], ucie(m, 0, 0, KB_MESH_E));
    assert_ptr_equal(path[5], ucie(m, 0, 2, KB_MESH_E));
    assert_ptr_equal(path[6], ucie(m, 0, 3, KB_MESH_S));
    assert_ptr_equal(path[8], ucie(m, 0, 11, KB_MESH_S));
    kb_machine_destroy(m);
}

static void test_route_cross_sip(void **state)
{
    kb_machine *m = make_default();
    kb_pe_hw *pe = kb_machine_pe(m, 0, 5, 0);
    kb_res *path[KB_MAX_ROUTE];
    int n;

    (void)state;
    assert_int_equal(m->sips[0].nlinks, 2); /* a 2-SIP ring: E and W both lead to SIP 1 */
    assert_int_equal(m->sips[0].links[0].peer, 1);
    assert_int_equal(m->sips[0].links[1].peer, 1);
    /* sip0 cube5 -> gateway cube 0 (W, N) -> SIP link -> sip1 cube0 -> cube 6 (E, E, S) */
    n = route(m, pe, hbm_of(m, 0, 5, 0, 0), kb_pa_pe_tcm(1, 6, 2, 0), path);
    assert_int_equal(n, 11);
    assert_ptr_equal(path[0], &pe->dma[0]);
    assert_ptr_equal(path[1], &pe->hbm_port);
    assert_ptr_equal(path[2], &m->sips[0].cubes[5].noc);
    assert_ptr_equal(path[3], ucie(m, 0, 5, KB_MESH_W));
    assert_ptr_equal(path[4], ucie(m, 0, 4, KB_MESH_N));
    assert_ptr_equal(path[5], &m->sips[0].links[0].link);
    assert_ptr_equal(path[6], ucie(m, 1, 0, KB_MESH_E));
    assert_ptr_equal(path[7], ucie(m, 1, 1, KB_MESH_E));
    assert_ptr_equal(path[8], ucie(m, 1, 2, KB_MESH_S));
    assert_ptr_equal(path[9], &m->sips[1].cubes[6].noc);
    assert_ptr_equal(path[10], &kb_machine_pe(m, 1, 6, 2)->tcm_port);
    kb_machine_destroy(m);
}

static void test_route_ring4(void **state)
{
    static const char *const sets[] = { "system.sips.count=4" };
    kb_machine *m = make_machine(sets, 1);
    kb_res *path[KB_MAX_ROUTE];
    int n;

    (void)state;
    assert_int_equal(kb_machine_sip_hops(m, 0, 2), 2);
    assert_int_equal(kb_machine_sip_hops(m, 0, 1), 1);
    assert_int_equal(kb_machine_sip_hops(m, 0, 3), 1); /* the ring wraps */
    assert_int_equal(kb_machine_sip_hops(m, 1, 3), 2);
    assert_int_equal(kb_machine_sip_hops(m, 2, 2), 0);
    /* gateway to gateway: no UCIe, two SIP links (0 -> 1 -> 2, E first) */
    n = route(m, kb_machine_pe(m, 0, 0, 0), hbm_of(m, 0, 0, 0, 0), hbm_of(m, 2, 0, 1, 0), path);
    assert_int_equal(n, 7);
    assert_ptr_equal(path[2], &m->sips[0].cubes[0].noc);
    assert_int_equal(m->sips[0].links[0].peer, 1);
    assert_ptr_equal(path[3], &m->sips[0].links[0].link);
    assert_int_equal(m->sips[1].links[0].peer, 2);
    assert_ptr_equal(path[4], &m->sips[1].links[0].link);
    assert_ptr_equal(path[5], &m->sips[2].cubes[0].noc);
    assert_ptr_equal(path[6], &kb_machine_pe(m, 2, 0, 1)->hbm_port);
    kb_machine_destroy(m);
}

static void test_route_host(void **state)
{
    kb_machine *m = make_default();
    kb_sip_hw *s1 = &m->sips[1], *s0 = &m->sips[0];
    kb_res *path[KB_MAX_ROUTE];
    int n;

    (void)state;
    /* host write into sip1 cube 5: PCIe, PCIe EP, cube 0 -> 5 (E, S), NoC, port */
    n = route(m, NULL, KB_PA_INVALID_ADDR, hbm_of(m, 1, 5, 3, 0), path);
    assert_int_equal(n, 6);
    assert_ptr_equal(path[0], &s1->pcie);
    assert_ptr_equal(path[1], &s1->pcie_ep);
    assert_ptr_equal(path[2], ucie(m, 1, 0, KB_MESH_E));
    assert_ptr_equal(path[3], ucie(m, 1, 1, KB_MESH_S));
    assert_ptr_equal(path[4], &s1->cubes[5].noc);
    assert_ptr_equal(path[5], &kb_machine_pe(m, 1, 5, 3)->hbm_port);
    /* host read from sip0 cube 5: the reverse order */
    n = route(m, NULL, hbm_of(m, 0, 5, 3, 0), KB_PA_INVALID_ADDR, path);
    assert_int_equal(n, 6);
    assert_ptr_equal(path[0], &kb_machine_pe(m, 0, 5, 3)->hbm_port);
    assert_ptr_equal(path[1], &s0->cubes[5].noc);
    assert_ptr_equal(path[2], ucie(m, 0, 5, KB_MESH_W));
    assert_ptr_equal(path[3], ucie(m, 0, 4, KB_MESH_N));
    assert_ptr_equal(path[4], &s0->pcie_ep);
    assert_ptr_equal(path[5], &s0->pcie);
    kb_machine_destroy(m);
}

/* ---- idle-path closed form ---- */

/* 4 KiB HBM -> TCM on one PE: 159 ns with the defaults (docs/timing-model.md, example 1). */
static void test_dma_idle_same_pe(void **state)
{
    kb_machine *m = make_default();
    const kb_topo_cfg *c = &m->cfg;
    kb_pe_hw *pe = kb_machine_pe(m, 0, 0, 0);
    const uint64_t n = 4096;
    kb_time ts = -1, te = -1;
    kb_errbuf eb;

    (void)state;
    int64_t lat = kbt_ps(c->hbm.latency_ns) + kbt_ps(c->noc.latency_ns) + kbt_ps(c->tcm.latency_ns);
    int64_t occ = kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(n, c->dma_bandwidth_gbps);
    occ = max2(occ, kbt_xfer_ps(n, c->hbm.bandwidth_gbps));
    occ = max2(occ, kbt_xfer_ps(n, c->noc.bandwidth_gbps));
    occ = max2(occ, kbt_xfer_ps(n, c->tcm.bandwidth_gbps));
    assert_int_equal(kb_machine_dma(m, pe, hbm_of(m, 0, 0, 0, 0), kb_pa_pe_tcm(0, 0, 0, 0), n, 0,
                                    &ts, &te, &eb),
                     0);
    assert_int_equal(ts, 0);
    assert_int_equal(te, lat + occ);
    assert_int_equal(te, 159000); /* 107 ns latency + 20 ns setup + 32 ns at 128 GB/s */
    /* every resource is busy for its own occupancy from the start */
    assert_int_equal(pe->dma[0].free_at, 52000);
    assert_int_equal(pe->hbm_port.free_at, 16000);
    assert_int_equal(m->sips[0].cubes[0].noc.free_at, 8000);
    assert_int_equal(pe->tcm_port.free_at, 4000);

    /* the local TCM -> scratch copy skips the NoC: 2 ns + 52 ns */
    kb_machine *m2 = make_default();
    kb_pe_hw *p2 = kb_machine_pe(m2, 0, 0, 0);
    assert_int_equal(kb_machine_dma(m2, p2, kb_pa_pe_tcm(0, 0, 0, 0),
                                    kb_pa_pe_scratch(0, 0, 0, 0), n, 1000, &ts, &te, &eb),
                     0);
    assert_int_equal(ts, 1000);
    assert_int_equal(te, 1000 + kbt_ps(c->tcm.latency_ns) + kbt_ps(c->dma_setup_ns) +
                             kbt_xfer_ps(n, c->dma_bandwidth_gbps));
    assert_int_equal(te, 1000 + 54000);
    kb_machine_destroy(m2);
    kb_machine_destroy(m);
}

/* 4 KiB from HBM of sip0 cube 5 to a TCM of cube 14 (3 UCIe hops): 224 ns (example 3). */
static void test_dma_idle_cross_cube(void **state)
{
    kb_machine *m = make_default();
    const kb_topo_cfg *c = &m->cfg;
    const uint64_t n = 4096;
    kb_time ts, te;
    kb_errbuf eb;

    (void)state;
    int64_t lat = kbt_ps(c->hbm.latency_ns) + 2 * kbt_ps(c->noc.latency_ns) +
                  3 * kbt_ps(c->ucie.latency_ns) + kbt_ps(c->tcm.latency_ns);
    int64_t occ = max2(kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(n, c->dma_bandwidth_gbps),
                       kbt_xfer_ps(n, c->ucie.bandwidth_gbps));
    assert_int_equal(kb_machine_dma(m, kb_machine_pe(m, 0, 5, 1), hbm_of(m, 0, 5, 1, 0),
                                    kb_pa_pe_tcm(0, 14, 3, 0), n, 0, &ts, &te, &eb),
                     0);
    assert_int_equal(te, lat + occ);
    assert_int_equal(te, 172000 + 52000);
    /* each UCIe link on the way is busy for 16 ns, each from the common start */
    assert_int_equal(ucie(m, 0, 5, KB_MESH_E)->free_at, 16000);
    assert_int_equal(ucie(m, 0, 10, KB_MESH_S)->free_at, 16000);
    assert_int_equal(ucie(m, 0, 5, KB_MESH_S)->free_at, 0); /* not on the XY route */
    kb_machine_destroy(m);
}

/* The multi-hop cross-SIP route of test_route_cross_sip, idle. */
static int64_t cross_sip_latency(const kb_topo_cfg *c)
{
    return kbt_ps(c->hbm.latency_ns) + 2 * kbt_ps(c->noc.latency_ns) +
           5 * kbt_ps(c->ucie.latency_ns) + kbt_ps(c->inter_sip.latency_ns) +
           kbt_ps(c->switch_overhead_ns) + kbt_ps(c->tcm.latency_ns);
}

static int64_t cross_sip_occ(const kb_topo_cfg *c, uint64_t n)
{
    int64_t occ = kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(n, c->dma_bandwidth_gbps);
    occ = max2(occ, kbt_xfer_ps(n, c->hbm.bandwidth_gbps));
    occ = max2(occ, kbt_xfer_ps(n, c->noc.bandwidth_gbps));
    occ = max2(occ, kbt_xfer_ps(n, c->ucie.bandwidth_gbps));
    occ = max2(occ, kbt_xfer_ps(n, c->inter_sip.bandwidth_gbps));
    return max2(occ, kbt_xfer_ps(n, c->tcm.bandwidth_gbps));
}

static void test_dma_idle_cross_sip(void **state)
{
    kb_machine *m = make_default();
    const kb_topo_cfg *c = &m->cfg;
    kb_pe_hw *pe = kb_machine_pe(m, 0, 5, 0);
    kb_pa src = hbm_of(m, 0, 5, 0, 0), dst = kb_pa_pe_tcm(1, 6, 2, 0);
    const uint64_t big = UINT64_C(1) << 20, small = 4096;
    kb_time ts, te;
    kb_errbuf eb;

    (void)state;
    assert_int_equal(cross_sip_latency(c), 717000);
    /* 1 MiB: the 100 GB/s SIP link is the bottleneck, so t = sum(lat) + n / min(bw) exactly */
    assert_int_equal(kb_machine_dma(m, pe, src, dst, big, 0, &ts, &te, &eb), 0);
    assert_int_equal(ts, 0);
    assert_int_equal(te, cross_sip_latency(c) + kbt_xfer_ps(big, c->inter_sip.bandwidth_gbps));
    assert_int_equal(te, cross_sip_latency(c) + cross_sip_occ(c, big));
    assert_int_equal(te, 717000 + 10485760);

    /* 4 KiB on an idle twin: the DMA engine's setup + 32 ns (52 ns) beats the link's
     * 40.96 ns, so the setup shows and the time is not setup + n / min(bw) (60.96 ns) */
    kb_machine *m2 = make_default();
    kb_pe_hw *p2 = kb_machine_pe(m2, 0, 5, 0);
    assert_int_equal(kb_machine_dma(m2, p2, src, dst, small, 0, &ts, &te, &eb), 0);
    assert_int_equal(te, cross_sip_latency(c) + cross_sip_occ(c, small));
    assert_int_equal(te, 717000 + 52000);
    assert_true(te < cross_sip_latency(c) + kbt_ps(c->dma_setup_ns) +
                         kbt_xfer_ps(small, c->inter_sip.bandwidth_gbps));
    kb_machine_destroy(m2);
    kb_machine_destroy(m);
}

/* A second identical DMA requested at the same time waits for the first's bottleneck. */
static void test_dma_fifo(void **state)
{
    kb_machine *m = make_default();
    const kb_topo_cfg *c = &m->cfg;
    kb_pe_hw *pe = kb_machine_pe(m, 0, 5, 0);
    kb_pa src = hbm_of(m, 0, 5, 0, 0), dst = kb_pa_pe_tcm(1, 6, 2, 0);
    const uint64_t n = UINT64_C(1) << 20;
    kb_time ts1, te1, ts2, te2, ts3, te3;
    kb_errbuf eb;

    (void)state;
    assert_int_equal(kb_machine_dma(m, pe, src, dst, n, 0, &ts1, &te1, &eb), 0);
    assert_int_equal(kb_machine_dma(m, pe, src, dst, n, 0, &ts2, &te2, &eb), 0);
    int64_t occ = cross_sip_occ(c, n), lat = cross_sip_latency(c);
    assert_int_equal(ts1, 0);
    assert_int_equal(te1, lat + occ);
    assert_int_equal(ts2, occ); /* = the SIP link's free time, 10485760 ps */
    assert_int_equal(te2, occ + lat + occ);
    assert_int_equal(te2, 10485760 + 717000 + 10485760);
    assert_int_equal(m->sips[0].links[0].link.bytes, 2 * n);
    assert_int_equal(m->sips[0].links[0].link.busy, 2 * occ);
    /* a DMA on a disjoint route (another SIP-1 PE, local copy) is not delayed */
    kb_pe_hw *other = kb_machine_pe(m, 1, 3, 1);
    assert_int_equal(kb_machine_dma(m, other, kb_pa_pe_tcm(1, 3, 1, 0),
                                    kb_pa_pe_scratch(1, 3, 1, 0), 4096, 0, &ts3, &te3, &eb),
                     0);
    assert_int_equal(ts3, 0);
    assert_int_equal(te3, 54000);
    /* one requested later than the queue's end starts when requested */
    assert_int_equal(kb_machine_dma(m, pe, src, dst, n, te2 + 5, &ts3, &te3, &eb), 0);
    assert_int_equal(ts3, te2 + 5);
    assert_int_equal(te3, te2 + 5 + lat + occ);
    kb_machine_destroy(m);
}

/* ---- system.switch.arbitration per_sip: a route between SIPs booked part by part ---- */

/* test_route_cross_sip's route cut after the SIP link: sip0's part (engine, HBM port, NoC,
 * two UCIe hops, the link and its switch) and sip1's (three UCIe hops, NoC, TCM port). */
static int64_t part0_latency(const kb_topo_cfg *c)
{
    return kbt_ps(c->hbm.latency_ns) + kbt_ps(c->noc.latency_ns) +
           2 * kbt_ps(c->ucie.latency_ns) + kbt_ps(c->inter_sip.latency_ns) +
           kbt_ps(c->switch_overhead_ns);
}

static int64_t part1_latency(const kb_topo_cfg *c)
{
    return 3 * kbt_ps(c->ucie.latency_ns) + kbt_ps(c->noc.latency_ns) + kbt_ps(c->tcm.latency_ns);
}

static int64_t part0_occ(const kb_topo_cfg *c, uint64_t n)
{
    int64_t occ = kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(n, c->dma_bandwidth_gbps);
    occ = max2(occ, kbt_xfer_ps(n, c->hbm.bandwidth_gbps));
    occ = max2(occ, kbt_xfer_ps(n, c->noc.bandwidth_gbps));
    occ = max2(occ, kbt_xfer_ps(n, c->ucie.bandwidth_gbps));
    return max2(occ, kbt_xfer_ps(n, c->inter_sip.bandwidth_gbps));
}

static int64_t part1_occ(const kb_topo_cfg *c, uint64_t n)
{
    int64_t occ = kbt_xfer_ps(n, c->ucie.bandwidth_gbps);
    occ = max2(occ, kbt_xfer_ps(n, c->noc.bandwidth_gbps));
    return max2(occ, kbt_xfer_ps(n, c->tcm.bandwidth_gbps));
}

static const char *const per_sip[] = { "system.switch.arbitration=per_sip" };
/* the arbitration that was the default before 2026-12-04, still reachable */
static const char *const route_arb[] = { "system.switch.arbitration=route" };

/* On an idle route the parts add up to the whole route's closed form, for a transfer the SIP
 * link bounds (1 MiB) and one the DMA engine's setup shows in (4 KiB). */
static void test_parts_idle(void **state)
{
    const uint64_t sizes[2] = { UINT64_C(1) << 20, 4096 };
    (void)state;
    for (int k = 0; k < 2; k++) {
        kb_machine *m = make_machine(per_sip, 1);
        const kb_topo_cfg *c = &m->cfg;
        uint64_t n = sizes[k];
        kb_dma_leg leg;
        kb_errbuf eb;
        assert_int_equal(m->per_sip, 1);
        assert_int_equal(kb_machine_dma_first(m, kb_machine_pe(m, 0, 5, 0), hbm_of(m, 0, 5, 0, 0),
                                              kb_pa_pe_tcm(1, 6, 2, 0), n, 0, &leg, &eb),
                         0);
        assert_true(kb_dma_leg_more(&leg));
        assert_int_equal(leg.nparts, 2);
        assert_int_equal(leg.part, 1);
        assert_int_equal(leg.at, 1);
        assert_int_equal(leg.t_start, 0);
        assert_int_equal(leg.t_head, part0_latency(c));
        assert_int_equal(leg.t_end, part0_latency(c) + part0_occ(c, n));
        /* only sip0's part is booked so far */
        assert_int_equal(m->sips[0].links[0].link.free_at, kbt_xfer_ps(n, c->inter_sip.bandwidth_gbps));
        assert_int_equal(m->sips[1].cubes[6].noc.free_at, 0);
        kb_machine_dma_next(m, &leg, leg.t_head);
        assert_false(kb_dma_leg_more(&leg));
        assert_int_equal(leg.t_start, part0_latency(c));
        assert_int_equal(leg.t_end, cross_sip_latency(c) + cross_sip_occ(c, n));
        assert_int_equal(leg.t_end, k == 0 ? 717000 + 10485760 : 717000 + 52000);
        assert_int_equal(m->sips[1].cubes[6].noc.free_at,
                         part0_latency(c) + kbt_xfer_ps(n, c->noc.bandwidth_gbps));
        kb_machine_destroy(m);
    }
}

/*
 * The destination's NoC busy until X (a 4 MiB copy inside sip1 at 0): with route the whole
 * route waits for it from one start, the SIP link idle meanwhile; per_sip books sip0's part at
 * once (the sender is done at part0's end) and sip1's part from X.
 */
static void test_parts_contention(void **state)
{
    const uint64_t big = UINT64_C(4) << 20, n = 65536;
    kb_time ts, te;
    kb_errbuf eb;
    (void)state;
    for (int arb = 0; arb < 2; arb++) {
        kb_machine *m = arb ? make_machine(per_sip, 1) : make_machine(route_arb, 1);
        const kb_topo_cfg *c = &m->cfg;
        kb_pe_hw *b = kb_machine_pe(m, 1, 6, 2);
        assert_int_equal(kb_machine_dma(m, b, hbm_of(m, 1, 6, 2, 0), kb_pa_pe_tcm(1, 6, 2, 8192),
                                        big, 0, &ts, &te, &eb),
                         0);
        int64_t x = m->sips[1].cubes[6].noc.free_at;
        assert_int_equal(x, kbt_xfer_ps(big, c->noc.bandwidth_gbps)); /* the NoC is its bound */
        assert_true(m->sips[1].cubes[6].noc.hole_hi <= m->sips[1].cubes[6].noc.hole_lo);
        kb_dma_leg leg;
        assert_int_equal(kb_machine_dma_first(m, kb_machine_pe(m, 0, 5, 0), hbm_of(m, 0, 5, 0, 0),
                                              kb_pa_pe_tcm(1, 6, 2, 0), n, 0, &leg, &eb),
                         0);
        if (!arb) {
            assert_false(kb_dma_leg_more(&leg));
            assert_int_equal(leg.t_start, x);
            assert_int_equal(leg.t_end, x + cross_sip_latency(c) + cross_sip_occ(c, n));
            /* the SIP link was booked from X too */
            assert_int_equal(m->sips[0].links[0].link.free_at,
                             x + kbt_xfer_ps(n, c->inter_sip.bandwidth_gbps));
        } else {
            assert_true(kb_dma_leg_more(&leg));
            assert_int_equal(leg.t_start, 0);
            int64_t sender_done = part0_latency(c) + part0_occ(c, n);
            assert_int_equal(leg.t_end, sender_done);
            assert_true(sender_done < x);
            kb_machine_dma_next(m, &leg, leg.t_head);
            assert_false(kb_dma_leg_more(&leg));
            assert_int_equal(leg.t_start, x);
            assert_int_equal(leg.t_end, x + part1_latency(c) + part1_occ(c, n));
            assert_int_equal(m->sips[0].links[0].link.free_at,
                             kbt_xfer_ps(n, c->inter_sip.bandwidth_gbps));
        }
        kb_machine_destroy(m);
    }
}

/* Through a SIP on the way (a 4-SIP ring, sip0 -> sip2): three parts, the middle one sip1's
 * egress link; idle, they add up to the whole route's closed form. A route inside one SIP
 * is one part, booked as kb_machine_dma books it. A leg left in flight holds no memory. */
/*
 * While a launch runs forked over the SIPs (sip_bound), a kernel's DMA may book its own SIP
 * only: one into another SIP's memory is refused with a message naming both SIPs, even when
 * its route was remembered before, and a send by parts still books its first part.
 */
static void test_sip_bound(void **state)
{
    static const char *const sets[] = { "system.switch.arbitration=per_sip",
                                        "system.sips.count=4" };
    kb_machine *m = make_machine(sets, 2);
    kb_pe_hw *pe = kb_machine_pe(m, 0, 0, 0);
    kb_pa src = hbm_of(m, 0, 0, 0, 0), dst = hbm_of(m, 2, 0, 0, 0), near = hbm_of(m, 0, 1, 0, 0);
    kb_time ts, te;
    kb_dma_leg leg;
    kb_errbuf eb;

    (void)state;
    /* remembered while unbound */
    assert_int_equal(kb_machine_dma(m, pe, src, dst, 4096, 0, &ts, &te, &eb), 0);
    kb_machine_bind_sips(m, 1);
    eb.msg[0] = '\0';
    assert_int_equal(kb_machine_dma(m, pe, src, dst, 4096, 0, &ts, &te, &eb), KB_ERR_RANGE);
    kbt_msg_has(eb.msg, "a DMA from sip0 to sip2 issued on sip0");
    kbt_msg_has(eb.msg, "only through IPCQ sends");
    assert_int_equal(kb_machine_dma(m, pe, dst, src, 4096, 0, &ts, &te, &eb), KB_ERR_RANGE);
    kbt_msg_has(eb.msg, "a DMA from sip2 to sip0 issued on sip0");
    assert_int_equal(kb_machine_dma(m, pe, src, near, 4096, 0, &ts, &te, &eb), 0);
    assert_int_equal(kb_machine_dma_first(m, pe, src, dst, 4096, 0, &leg, &eb), 0);
    assert_int_equal(leg.part, 1);
    assert_int_equal(leg.nparts, 3);
    kb_machine_bind_sips(m, 0);
    kb_machine_destroy(m);
}

static void test_parts_through_sip(void **state)
{
    static const char *const sets[] = { "system.switch.arbitration=per_sip",
                                        "system.sips.count=4" };
    kb_machine *m = make_machine(sets, 2), *r = make_machine(sets + 1, 1);
    const kb_topo_cfg *c = &m->cfg;
    const uint64_t n = 65536;
    kb_pa src = hbm_of(m, 0, 0, 0, 0), dst = hbm_of(m, 2, 0, 0, 0);
    kb_time ts, te;
    kb_dma_leg leg, stray;
    kb_errbuf eb;

    (void)state;
    assert_int_equal(kb_machine_sip_hops(m, 0, 2), 2);
    assert_int_equal(kb_machine_dma(r, kb_machine_pe(r, 0, 0, 0), src, dst, n, 0, &ts, &te, &eb), 0);
    assert_int_equal(kb_machine_dma_first(m, kb_machine_pe(m, 0, 0, 0), src, dst, n, 0, &leg, &eb),
                     0);
    assert_int_equal(leg.nparts, 3);
    int64_t link = kbt_ps(c->inter_sip.latency_ns) + kbt_ps(c->switch_overhead_ns);
    assert_int_equal(leg.t_head, kbt_ps(c->hbm.latency_ns) + kbt_ps(c->noc.latency_ns) + link);
    kb_time h0 = leg.t_head;
    kb_machine_dma_next(m, &leg, leg.t_head);
    assert_true(kb_dma_leg_more(&leg));
    assert_int_equal(leg.part, 2);
    assert_int_equal(leg.t_start, h0);
    assert_int_equal(leg.t_head, h0 + link);
    kb_machine_dma_next(m, &leg, leg.t_head);
    assert_false(kb_dma_leg_more(&leg));
    assert_int_equal(leg.t_end, te);
    assert_int_equal(te, kbt_ps(c->hbm.latency_ns) * 2 + kbt_ps(c->noc.latency_ns) * 2 + 2 * link +
                             kbt_xfer_ps(n, c->inter_sip.bandwidth_gbps));
    /* inside one SIP: the whole route, no parts left */
    assert_int_equal(kb_machine_dma_first(m, kb_machine_pe(m, 1, 0, 0), hbm_of(m, 1, 0, 0, 0),
                                          hbm_of(m, 1, 3, 1, 0), n, 0, &leg, &eb),
                     0);
    assert_false(kb_dma_leg_more(&leg));
    /* in flight when the machine goes */
    assert_int_equal(kb_machine_dma_first(m, kb_machine_pe(m, 3, 0, 0), hbm_of(m, 3, 0, 0, 0),
                                          hbm_of(m, 1, 0, 0, 0), n, 0, &stray, &eb),
                     0);
    assert_true(kb_dma_leg_more(&stray));
    kb_machine_destroy(m);
    kb_machine_destroy(r);
}

/* ---- command path ---- */

static void test_command_path(void **state)
{
    kb_machine *m = make_default();
    const kb_topo_cfg *c = &m->cfg;
    const uint64_t b = 64;
    kb_pe_hw *p0 = kb_machine_pe(m, 0, 5, 0), *p1 = kb_machine_pe(m, 0, 5, 1);

    (void)state;
    int64_t host = kbt_ps(c->host_overhead_ns), ep = kbt_ps(c->pcie_ep_overhead_ns);
    int64_t pcie = kbt_xfer_ps(b, c->pcie.bandwidth_gbps), pcie_lat = kbt_ps(c->pcie.latency_ns);
    int64_t io = kbt_ps(c->io_cpu_overhead_ns), mcpu = kbt_ps(c->m_cpu_overhead_ns);
    int64_t uc = kbt_xfer_ps(b, c->ucie.bandwidth_gbps) + kbt_ps(c->ucie.latency_ns);
    int64_t noc_occ = kbt_xfer_ps(b, c->noc.bandwidth_gbps), noc_lat = kbt_ps(c->noc.latency_ns);
    int64_t pcpu = kbt_ps(c->pe_cpu_overhead_ns);

    /* host -> IO_CPU: host overhead, PCIe (64 B + latency), PCIe EP, IO_CPU */
    kb_time t_io = kb_machine_cmd_host_to_iocpu(m, 0, 0, b);
    assert_int_equal(t_io, host + pcie + pcie_lat + ep + io);
    assert_int_equal(t_io, 2301000);
    /* a second message at t=0 queues on PCIe (1 ns), then on PCIe EP and IO_CPU */
    kb_time t_io2 = kb_machine_cmd_host_to_iocpu(m, 0, 0, b);
    assert_int_equal(t_io2, t_io + io);
    assert_int_equal(t_io2, 2501000);
    /* IO_CPU -> M_CPU of cube 5: two UCIe hops from the gateway (E, S), then M_CPU */
    kb_time t_m = kb_machine_cmd_iocpu_to_mcpu(m, 0, 5, t_io, b);
    assert_int_equal(t_m, t_io + 2 * uc + mcpu);
    assert_int_equal(t_m, 2391500);
    /* M_CPU -> PE_CPU: NoC, PE_CPU; the second PE's message queues 125 ps on the NoC */
    kb_time t_p0 = kb_machine_cmd_mcpu_to_pe(m, p0, t_m, b);
    kb_time t_p1 = kb_machine_cmd_mcpu_to_pe(m, p1, t_m, b);
    assert_int_equal(t_p0, t_m + noc_occ + noc_lat + pcpu);
    assert_int_equal(t_p1, t_m + 2 * noc_occ + noc_lat + pcpu);
    assert_int_equal(t_p0, 2398625);
    assert_int_equal(t_p1, 2398750);
    /* completion PE -> M_CPU -> IO_CPU -> host */
    kb_time t_c = kb_machine_cmd_pe_to_mcpu(m, p0, 3000000, b);
    assert_int_equal(t_c, 3000000 + noc_occ + noc_lat + mcpu);
    assert_int_equal(t_c, 3055125);
    kb_time t_ci = kb_machine_cmd_mcpu_to_iocpu(m, 0, 5, t_c, b);
    assert_int_equal(t_ci, t_c + 2 * uc + io);
    assert_int_equal(t_ci, 3295625);
    kb_time t_h = kb_machine_cmd_iocpu_to_host(m, 0, t_ci, b);
    assert_int_equal(t_h, t_ci + ep + pcie + pcie_lat);
    assert_int_equal(t_h, 4396625);
    /* cube 0 is the gateway: no UCIe hop */
    kb_machine *m2 = make_default();
    assert_int_equal(kb_machine_cmd_iocpu_to_mcpu(m2, 1, 0, 100, b), 100 + mcpu);
    kb_machine_destroy(m2);
    kb_machine_destroy(m);
}

/* ---- SIP topologies and sizes ---- */

static int max_sip_hops(const kb_machine *m)
{
    int best = 0;
    for (int a = 0; a < m->nsips; a++)
        for (int b = 0; b < m->nsips; b++) {
            int h = kb_machine_sip_hops(m, (unsigned)a, (unsigned)b);
            assert_int_equal(h, kb_machine_sip_hops(m, (unsigned)b, (unsigned)a));
            best = h > best ? h : best;
        }
    return best;
}

static void test_sip_hops_torus(void **state)
{
    static const char *const sets[] = { "system.sips.count=16", "system.sips.topology=torus_2d" };
    kb_machine *m = make_machine(sets, 2);

    (void)state;
    assert_int_equal(m->sip_grid_w, 4);
    assert_int_equal(m->sip_grid_h, 4);
    for (int s = 0; s < 16; s++)
        assert_int_equal(m->sips[s].nlinks, 4);
    assert_int_equal(kb_machine_sip_hops(m, 0, 15), 2); /* wraps in x and y */
    assert_int_equal(kb_machine_sip_hops(m, 0, 10), 4);
    assert_int_equal(kb_machine_sip_hops(m, 0, 5), 2);
    assert_int_equal(kb_machine_sip_hops(m, 5, 6), 1);
    assert_int_equal(kb_machine_sip_hops(m, 0, 12), 1);
    assert_int_equal(max_sip_hops(m), 4);
    kb_machine_destroy(m);
}

static void test_sip_hops_mesh_no_wrap(void **state)
{
    static const char *const sets[] = { "system.sips.count=16",
                                        "system.sips.topology=mesh_2d_no_wrap" };
    kb_machine *m = make_machine(sets, 2);
    kb_res *path[KB_MAX_ROUTE];

    (void)state;
    assert_int_equal(m->sips[0].nlinks, 2);  /* corner */
    assert_int_equal(m->sips[1].nlinks, 3);  /* edge */
    assert_int_equal(m->sips[5].nlinks, 4);  /* interior */
    assert_int_equal(kb_machine_sip_hops(m, 0, 15), 6);
    assert_int_equal(kb_machine_sip_hops(m, 0, 3), 3);
    assert_int_equal(kb_machine_sip_hops(m, 0, 12), 3);
    assert_int_equal(kb_machine_sip_hops(m, 5, 10), 2);
    assert_int_equal(max_sip_hops(m), 6);
    /* a cross-SIP route carries exactly sip_hops SIP links */
    int n = route(m, kb_machine_pe(m, 0, 0, 0), hbm_of(m, 0, 0, 0, 0), hbm_of(m, 15, 0, 0, 0),
                  path);
    int links = 0;
    for (int i = 0; i < n; i++)
        links += strcmp(path[i]->name, "inter_sip") == 0;
    assert_int_equal(links, 6);
    kb_machine_destroy(m);
}

static void test_sizes(void **state)
{
    static const char *const one[] = { "system.sips.count=1" };
    static const char *const many[] = { "system.sips.count=64" };
    kb_machine *m;
    kb_res *path[KB_MAX_ROUTE];

    (void)state;
    m = make_machine(one, 1);
    assert_int_equal(m->nsips, 1);
    assert_int_equal(m->sips[0].nlinks, 0);
    assert_int_equal(kb_machine_sip_hops(m, 0, 0), 0);
    assert_int_equal(route(m, kb_machine_pe(m, 0, 15, 7), hbm_of(m, 0, 15, 7, 0),
                           kb_pa_pe_tcm(0, 0, 0, 0), path),
                     4 + 6 + 1);
    kb_machine_destroy(m);

    m = make_machine(many, 1);
    assert_int_equal(m->nsips, 64);
    kb_pe_hw *last = m->pe_by_gid[64 * 16 * 8 - 1];
    assert_int_equal(last->gsip, 63);
    assert_int_equal(last->cube, 15);
    assert_int_equal(last->pe, 7);
    assert_int_equal(kb_machine_sip_hops(m, 0, 32), 32);
    assert_int_equal(kb_machine_sip_hops(m, 0, 63), 1);
    assert_int_equal(kb_machine_sip_hops(m, 20, 40), 20);
    /* SIP 16 sits in rack 1 (the address keeps it through encode/decode); 63 -> 0 -> .. -> 16
     * is 17 links; plus engine, port, NoC, 6 UCIe hops to the gateway, NoC, port */
    assert_int_equal(kb_machine_sip_hops(m, 63, 16), 17);
    assert_int_equal(route(m, last, hbm_of(m, 63, 15, 7, 0), kb_pa_pe_tcm(16, 0, 0, 0), path),
                     3 + 6 + 17 + 2);
    kb_machine_destroy(m);
}

static void test_bad_sizes(void **state)
{
    kb_config cfg;
    kb_errbuf eb;
    kb_machine *m = (kb_machine *)(void *)&cfg; /* any non-NULL sentinel */

    (void)state;
    kb_config_defaults(&cfg);
    cfg.topo.sips_count = 0;
    assert_int_equal(kb_machine_create(&cfg.topo, &m, &eb), KB_ERR_RANGE);
    assert_null(m);
    assert_non_null(strstr(eb.msg, "0 SIPs"));
    cfg.topo.sips_count = 257;
    assert_int_equal(kb_machine_create(&cfg.topo, &m, &eb), KB_ERR_RANGE);
    kb_config_defaults(&cfg);
    cfg.topo.pe_per_corner = 5; /* 20 PEs per cube */
    assert_int_equal(kb_machine_create(&cfg.topo, &m, &eb), KB_ERR_RANGE);
    kb_config_defaults(&cfg);
    strcpy(cfg.topo.sips_topology, "hypercube");
    assert_int_equal(kb_machine_create(&cfg.topo, &m, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "hypercube"));
    assert_null(m);
}

/* ---- addresses outside the machine ---- */

static void test_pa_outside(void **state)
{
    kb_machine *m = make_default();
    kb_pe_hw *pe = kb_machine_pe(m, 0, 0, 0);
    kb_pa tcm = kb_pa_pe_tcm(0, 0, 0, 0);
    kb_time ts = -1, te = -1;
    kb_errbuf eb;

    (void)state;
    eb.msg[0] = 0;
    /* SIP 2 of a 2-SIP machine */
    assert_null(kb_machine_port(m, kb_pa_pe_tcm(2, 0, 0, 0), &eb));
    assert_non_null(strstr(eb.msg, "not memory of this machine"));
    assert_int_equal(kb_machine_dma(m, pe, tcm, kb_pa_pe_tcm(2, 0, 0, 0), 64, 0, &ts, &te, &eb),
                     KB_ERR_RANGE);
    assert_int_equal(te, -1); /* nothing reserved, nothing written */
    assert_int_equal(pe->dma[0].bytes, 0);
    /* cube 16 of a 16-cube SIP, PE 8 of an 8-PE cube */
    assert_int_equal(kb_machine_dma(m, pe, kb_pa_pe_tcm(0, 16, 0, 0), tcm, 64, 0, &ts, &te, &eb),
                     KB_ERR_RANGE);
    assert_int_equal(kb_machine_dma(m, pe, tcm, kb_pa_pe_tcm(0, 1, 8, 0), 64, 0, &ts, &te, &eb),
                     KB_ERR_RANGE);
    /* HBM past the 8 slices (48 GiB) of a 128 GiB window */
    assert_int_equal(kb_machine_dma(m, pe, kb_pa_hbm(0, 0, UINT64_C(48) << 30), tcm, 64, 0, &ts,
                                    &te, &eb),
                     KB_ERR_RANGE);
    /* the M_CPU window is not memory; an invalid address neither */
    assert_null(kb_machine_port(m, kb_pa_mcpu(0, 0, 0), NULL));
    assert_null(kb_machine_port(m, KB_PA_INVALID_ADDR - 1, NULL));
    /* a PE DMA needs both ends; the host needs one */
    assert_int_equal(kb_machine_dma(m, pe, KB_PA_INVALID_ADDR, tcm, 64, 0, &ts, &te, &eb),
                     KB_ERR_INVAL);
    assert_int_equal(kb_machine_dma(m, NULL, KB_PA_INVALID_ADDR, KB_PA_INVALID_ADDR, 64, 0, &ts,
                                    &te, &eb),
                     KB_ERR_INVAL);
    assert_int_equal(pe->dma[0].bytes, 0);
    kb_machine_destroy(m);
}

/* Host write (PCIe into the gateway) of 240 bytes to HBM of cube 0: PCIe EP dominates. */
static void test_host_transfer_idle(void **state)
{
    kb_machine *m = make_default();
    const kb_topo_cfg *c = &m->cfg;
    const uint64_t n = 240;
    kb_time ts, te;
    kb_errbuf eb;

    (void)state;
    int64_t lat =
        kbt_ps(c->pcie.latency_ns) + kbt_ps(c->noc.latency_ns) + kbt_ps(c->hbm.latency_ns);
    int64_t occ = max2(kbt_xfer_ps(n, c->pcie.bandwidth_gbps), kbt_ps(c->pcie_ep_overhead_ns));
    occ = max2(occ, max2(kbt_xfer_ps(n, c->noc.bandwidth_gbps),
                         kbt_xfer_ps(n, c->hbm.bandwidth_gbps)));
    assert_int_equal(kb_machine_dma(m, NULL, KB_PA_INVALID_ADDR, hbm_of(m, 0, 0, 0, 0), n, 0, &ts,
                                    &te, &eb),
                     0);
    assert_int_equal(te, lat + occ);
    assert_int_equal(te, 1205000);
    /* 1 MiB: PCIe (64 GB/s) is the bottleneck: 16384 ns */
    kb_machine *m2 = make_default();
    assert_int_equal(kb_machine_dma(m2, NULL, KB_PA_INVALID_ADDR, hbm_of(m2, 1, 0, 0, 0),
                                    UINT64_C(1) << 20, 0, &ts, &te, &eb),
                     0);
    assert_int_equal(te, lat + kbt_xfer_ps(UINT64_C(1) << 20, c->pcie.bandwidth_gbps));
    assert_int_equal(te, 1105000 + 16384000);
    kb_machine_destroy(m2);
    kb_machine_destroy(m);
}

/* ---- the network (cube.noc.topology mesh, the default): routes, channels, closed forms ---- */

static kb_res *link_of(kb_machine *m, unsigned s, unsigned c, int router, int dir)
{
    return &m->sips[s].cubes[c].noc_links[router * 4 + dir];
}

/* 8 PEs of a cube: a 4 x 2 mesh, PE p at step p of the snake (row 0 east, row 1 west) */
static void test_net_layout(void **state)
{
    kb_machine *m = make_net(NULL, 0);
    static const int router[8] = { 0, 1, 2, 3, 7, 6, 5, 4 };
    (void)state;
    assert_int_equal(m->noc, KB_NOC_MESH);
    assert_int_equal(m->noc_w, 4);
    assert_int_equal(m->noc_h, 2);
    for (unsigned p = 0; p < 8; p++)
        assert_int_equal(kb_machine_pe(m, 0, 0, p)->router, router[p]);
    /* UCIe links at the middle of their edge (rounded down): E (3,0), W (0,0), N (1,0),
     * S (1,1) */
    assert_int_equal(m->noc_edge[KB_MESH_E], 3);
    assert_int_equal(m->noc_edge[KB_MESH_W], 0);
    assert_int_equal(m->noc_edge[KB_MESH_N], 1);
    assert_int_equal(m->noc_edge[KB_MESH_S], 5);
    assert_int_equal(kb_machine_pe(m, 0, 0, 0)->ndma, 4);
    kb_machine_destroy(m);
    /* 6 PEs: 3 x 2; an explicit 2 x 4 grid of 8; a width that does not divide is refused */
    static const char *const six[] = { "cube.corners=3" };
    m = make_net(six, 1);
    assert_true(m->noc_w == 3 && m->noc_h == 2);
    kb_machine_destroy(m);
    static const char *const tall[] = { "cube.noc.width=2" };
    m = make_net(tall, 1);
    assert_true(m->noc_w == 2 && m->noc_h == 4);
    assert_int_equal(kb_machine_pe(m, 0, 0, 3)->router, 2); /* row 1 runs west */
    kb_machine_destroy(m);
    kb_config cfg;
    kb_errbuf eb;
    kbt_config_with(&cfg, NULL, 0);
    kbt_config_set(&cfg, "cube.noc.width=3");
    assert_int_equal(kb_config_validate(&cfg, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "cube.noc.width x cube.noc.height = 3 x 0 does not hold "
                                   "the cube's 8 PEs"));
    assert_int_equal(kb_config_set(&cfg, "cube.noc.topology=ring", &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "mesh, crossbar, bus"));
}

static void test_net_routes(void **state)
{
    kb_machine *m = make_net(NULL, 0);
    kb_res *path[KB_MAX_ROUTE];
    int n;
    (void)state;
    kb_pe_hw *pe = kb_machine_pe(m, 0, 3, 2);
    /* its own HBM slice to its own TCM: the engine and the two ports, no link */
    n = route(m, pe, hbm_of(m, 0, 3, 2, 0), kb_pa_pe_tcm(0, 3, 2, 0), path);
    assert_int_equal(n, 3);
    assert_ptr_equal(path[0], &pe->dma[0]);
    assert_ptr_equal(path[1], &pe->hbm_port);
    assert_ptr_equal(path[2], &pe->tcm_wr);
    /* TCM to its own scratch: the TCM's read and write sides */
    n = route(m, pe, kb_pa_pe_tcm(0, 3, 2, 0), kb_pa_pe_scratch(0, 3, 2, 0), path);
    assert_int_equal(n, 3);
    assert_ptr_equal(path[1], &pe->tcm_port);
    assert_ptr_equal(path[2], &pe->tcm_wr);
    /* to the next PE of the cube: one link east, (2,0) -> (3,0) */
    n = route(m, pe, kb_pa_pe_scratch(0, 3, 2, 0), kb_pa_pe_ipcq(0, 3, 3, 0), path);
    assert_int_equal(n, 4);
    assert_ptr_equal(path[2], link_of(m, 0, 3, 2, KB_MESH_E));
    assert_ptr_equal(path[3], &kb_machine_pe(m, 0, 3, 3)->tcm_wr);
    /* PE 7 to PE 0 closes the cube's ring: one link north, (0,1) -> (0,0) */
    n = route(m, kb_machine_pe(m, 0, 3, 7), kb_pa_pe_scratch(0, 3, 7, 0),
              kb_pa_pe_ipcq(0, 3, 0, 0), path);
    assert_int_equal(n, 4);
    assert_ptr_equal(path[2], link_of(m, 0, 3, 4, KB_MESH_N));
    /* HBM of cube 5 PE 1 to TCM of cube 14 PE 3 (cubes XY: E, S, S; inside each cube XY
     * from where the data came in to the exit's edge router) */
    kb_pe_hw *p51 = kb_machine_pe(m, 0, 5, 1);
    n = route(m, p51, hbm_of(m, 0, 5, 1, 0), kb_pa_pe_tcm(0, 14, 3, 0), path);
    kb_res *want[] = {
        &p51->dma[0], &p51->hbm_port,
        link_of(m, 0, 5, 1, KB_MESH_E), link_of(m, 0, 5, 2, KB_MESH_E), ucie(m, 0, 5, KB_MESH_E),
        link_of(m, 0, 6, 0, KB_MESH_E), link_of(m, 0, 6, 1, KB_MESH_S), ucie(m, 0, 6, KB_MESH_S),
        link_of(m, 0, 10, 1, KB_MESH_S), ucie(m, 0, 10, KB_MESH_S),
        link_of(m, 0, 14, 1, KB_MESH_E), link_of(m, 0, 14, 2, KB_MESH_E),
        &kb_machine_pe(m, 0, 14, 3)->tcm_wr,
    };
    assert_int_equal(n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < n; i++)
        assert_ptr_equal(path[i], want[i]);
    kb_machine_destroy(m);
    /* crossbar: the source router's egress port and the destination's ingress port */
    static const char *const xbar[] = { "cube.noc.topology=crossbar" };
    m = make_net(xbar, 1);
    n = route(m, kb_machine_pe(m, 0, 0, 2), kb_pa_pe_scratch(0, 0, 2, 0),
              kb_pa_pe_ipcq(0, 0, 5, 0), path);
    assert_int_equal(n, 5);
    assert_ptr_equal(path[2], &m->sips[0].cubes[0].noc_links[2 * 2]);     /* r2 out */
    assert_ptr_equal(path[3], &m->sips[0].cubes[0].noc_links[6 * 2 + 1]); /* r6 in (PE 5) */
    assert_int_equal(path[3]->latency, 0); /* one traversal, one hop of latency */
    kb_machine_destroy(m);
}

/*
 * Idle paths: end - now = Σ latency + the longest occupancy (timing-model.md §4), with the
 * network's routes. 4 KiB from a PE's HBM slice to its own TCM: HBM 100 ns + TCM 2 ns of
 * latency, the channel's 20 ns setup + 32 ns transfer: 154 ns (the bus model's 159 ns had
 * the NoC's 5 ns). Cube 5 PE 1 -> cube 14 PE 3: 100 + 7 links x 5 + 3 UCIe x 20 + 2 = 197 ns
 * of latency + 52 ns = 249 ns.
 */
static void test_net_dma_idle(void **state)
{
    kb_machine *m = make_net(NULL, 0);
    const kb_topo_cfg *c = &m->cfg;
    kb_time ts, te;
    kb_errbuf eb;
    (void)state;
    int64_t occ4k = kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(4096, c->dma_bandwidth_gbps);
    assert_int_equal(kb_machine_dma(m, kb_machine_pe(m, 0, 3, 2), hbm_of(m, 0, 3, 2, 0),
                                    kb_pa_pe_tcm(0, 3, 2, 0), 4096, 0, &ts, &te, &eb), 0);
    assert_int_equal(te, kbt_ps(c->hbm.latency_ns) + kbt_ps(c->tcm.latency_ns) + occ4k);
    assert_int_equal(te, 154000);
    assert_int_equal(kb_machine_dma(m, kb_machine_pe(m, 0, 5, 1), hbm_of(m, 0, 5, 1, 0),
                                    kb_pa_pe_tcm(0, 14, 3, 0), 4096, 0, &ts, &te, &eb), 0);
    assert_int_equal(te, kbt_ps(c->hbm.latency_ns) + 7 * kbt_ps(c->noc.latency_ns) +
                             3 * kbt_ps(c->ucie.latency_ns) + kbt_ps(c->tcm.latency_ns) + occ4k);
    assert_int_equal(te, 249000);
    kb_machine_destroy(m);
}

/* A route longer than a memo way holds inline (corner cube to corner cube across SIPs, on the
 * mesh) is remembered in the way's own buffer: the second DMA on it takes the memo and times
 * exactly as the first, idle, did; the buffer goes with the machine. */
static void test_net_long_route_memo(void **state)
{
    kb_machine *m = make_net(NULL, 0);
    kb_pe_hw *pe = kb_machine_pe(m, 0, 15, 7);
    kb_pa src = hbm_of(m, 0, 15, 7, 0), dst = hbm_of(m, 1, 15, 7, 0);
    kb_res *path[KB_MAX_ROUTE];
    kb_time ts1, te1, ts2, te2;
    kb_errbuf eb;

    (void)state;
    int n = route(m, pe, src, dst, path);
    assert_true(n > KB_ROUTE_MEMO_LEN && n <= KB_ROUTE_MEMO_MAX);
    assert_int_equal(kb_machine_dma(m, pe, src, dst, 4096, 0, &ts1, &te1, &eb), 0);
    int way = -1;
    for (int i = 0; i < KB_ROUTE_MEMO_WAYS; i++)
        if (pe->routes[i].n == n)
            way = i;
    assert_true(way >= 0);
    assert_non_null(pe->routes[way].far);
    assert_ptr_equal(kb_route_way_path(&pe->routes[way]), pe->routes[way].far);
    for (int i = 1; i < n; i++) /* the engine's channel is swapped in at each use */
        assert_ptr_equal(pe->routes[way].far[i], path[i]);
    kb_time later = te1 + 1000000; /* every resource idle again */
    assert_int_equal(kb_machine_dma(m, pe, src, dst, 4096, later, &ts2, &te2, &eb), 0);
    assert_int_equal(ts2, later);
    assert_int_equal(te2 - ts2, te1 - ts1);
    kb_machine_destroy(m);
}

/*
 * Channels: five 1 MiB loads from one PE's HBM slice into its TCM, issued together. Each
 * takes the channel free first; a channel moves 128 GB/s (8 212 ns with its setup) but the
 * HBM slice's read side 256 GB/s (4 096 ns a MiB), so the loads start 4 096 ns apart, the
 * fifth on channel 0 again once the port has carried the four before it, and each ends
 * 102 ns (HBM + TCM latency) + 8 212 ns after its start: two channels' worth of the port.
 * With six channels the fifth takes channel 4, at the same times.
 */
static void check_channels(int nch)
{
    char set[40];
    snprintf(set, sizeof set, "pe.dma.channels=%d", nch);
    const char *sets[] = { set };
    kb_machine *m = make_net(sets, 1);
    kb_pe_hw *pe = kb_machine_pe(m, 0, 0, 0);
    const uint64_t mib = UINT64_C(1) << 20;
    kb_time ts, te;
    kb_errbuf eb;
    assert_int_equal(pe->ndma, nch);
    for (int k = 0; k < 5; k++) {
        assert_int_equal(kb_machine_dma(m, pe, hbm_of(m, 0, 0, 0, (uint64_t)k * mib),
                                        kb_pa_pe_tcm(0, 0, 0, 0), mib, 0, &ts, &te, &eb), 0);
        assert_int_equal(ts, (int64_t)k * 4096000);
        assert_int_equal(te, (int64_t)k * 4096000 + 102000 + 8212000);
    }
    /* channels 0..nch-1 took the first loads in turn, channel 0 the fifth when nch is 4 */
    for (int k = 0; k < nch; k++)
        assert_int_equal(pe->dma[k].bytes, k < 5 - nch ? 2 * mib : k < 5 ? mib : 0);
    /* the channel free first: with four, kb_pe_hw's copy of their free times chooses it;
     * with six, the channels themselves */
    kb_time best = pe->dma[0].free_at;
    for (int k = 1; k < nch; k++)
        best = pe->dma[k].free_at < best ? pe->dma[k].free_at : best;
    assert_int_equal(kb_machine_dma_channel(pe)->free_at, best);
    for (int k = 0; k < nch && nch <= KB_DMA_INL; k++)
        assert_int_equal(pe->dma_free[k], pe->dma[k].free_at);
    /* the kernel's hints: the channel a transfer takes now, and the remembered route's source
     * port, last link and destination port (the loads' route, way 0, from the second on) */
    const kb_route_way *w = &pe->routes[0];
    int n = w->n;
    assert_true(n >= 3 && n <= KB_ROUTE_MEMO_LEN);
    if (nch <= KB_DMA_INL)
        assert_ptr_equal(pe->next_res[0], kb_machine_dma_channel(pe));
    assert_ptr_equal(pe->next_way, w);
    assert_ptr_equal(pe->next_res[1], w->path[1]);
    assert_ptr_equal(pe->next_res[1], &pe->hbm_port);
    assert_ptr_equal(pe->next_res[2], w->path[n - 2]);
    assert_ptr_equal(pe->next_res[3], &pe->tcm_wr);
    kb_machine_destroy(m);
}

/* Fewer channels than kb_pe_hw mirrors: the unused mirrors are never the channel free first,
 * and the hint names the channel each transfer takes. */
static void test_net_channels_few(void **state)
{
    (void)state;
    for (int nch = 1; nch <= 3; nch++) {
        char set[40];
        snprintf(set, sizeof set, "pe.dma.channels=%d", nch);
        const char *sets[] = { set };
        kb_machine *m = make_net(sets, 1);
        kb_pe_hw *pe = kb_machine_pe(m, 0, 0, 0);
        kb_time ts, te;
        kb_errbuf eb;
        for (int k = 0; k < 4; k++) {
            kb_res *ch = kb_machine_dma_channel(pe);
            assert_ptr_equal(ch, &pe->dma[k % nch]);
            assert_ptr_equal(pe->next_res[0], ch);
            assert_int_equal(kb_machine_dma(m, pe, kb_pa_pe_tcm(0, 0, 0, 0),
                                            kb_pa_pe_tcm(0, 0, 1, 0), 4096, 0, &ts, &te, &eb),
                             0);
            assert_int_equal(ch->bytes, (uint64_t)(k / nch + 1) * 4096);
        }
        kb_machine_destroy(m);
    }
}

static void test_net_channels(void **state)
{
    (void)state;
    check_channels(4);
    check_channels(6); /* more than kb_pe_hw keeps side by side */
}

/*
 * The two concurrency checks (#29): eight PEs of a cube, each moving 1 MiB from its
 * own HBM slice to its own TCM at the same time, each end when one PE alone would (102 ns +
 * the channel's 8 212 ns = 8 314 ns): nothing of one PE's path is another's. The same for
 * eight PEs each sending 1 MiB from its scratch to its ring neighbour's IPCQ range (p -> p+1,
 * 7 -> 0): one mesh link each, all different, TCM latencies 2 + 2 ns and the link's 5 ns:
 * 8 221 ns. With the bus model the eight sends queue on the cube's one NoC resource.
 */
static void test_net_eight_pes(void **state)
{
    const uint64_t mib = UINT64_C(1) << 20;
    kb_time ts, te;
    kb_errbuf eb;
    (void)state;
    for (int legacy_bus = 0; legacy_bus < 2; legacy_bus++) {
        kb_machine *m = legacy_bus ? make_default() : make_net(NULL, 0);
        for (unsigned p = 0; p < 8; p++) {
            assert_int_equal(kb_machine_dma(m, kb_machine_pe(m, 0, 2, p), hbm_of(m, 0, 2, p, 0),
                                            kb_pa_pe_tcm(0, 2, p, 0), mib, 0, &ts, &te, &eb), 0);
            if (!legacy_bus)
                assert_int_equal(te, 8314000);
        }
        kb_time last = 0;
        for (unsigned p = 0; p < 8; p++) {
            assert_int_equal(kb_machine_dma(m, kb_machine_pe(m, 0, 4, p),
                                            kb_pa_pe_scratch(0, 4, p, 0),
                                            kb_pa_pe_ipcq(0, 4, (p + 1) % 8, 0), mib, 0, &ts,
                                            &te, &eb), 0);
            if (!legacy_bus)
                assert_int_equal(te, 8221000);
            last = te > last ? te : last;
        }
        if (legacy_bus) /* 8 x 2 048 ns of the one NoC resource before the last can start */
            assert_true(last >= 7 * 2048000 + 8221000);
        kb_machine_destroy(m);
    }
}

/*
 * The command path over the mesh: IO_CPU (cube 0, router 0) to cube 5's M_CPU (router 0)
 * crosses cube 0 from router 0 to its east edge (3 links), UCIe E, cube 1 from its west edge
 * to its south edge (2 links), UCIe S, cube 5 from its north edge to router 0 (1 link): 6
 * links of 0.125 + 5 ns and 2 UCIe hops of 0.25 + 20 ns, then the M_CPU's 50 ns: 121.25 ns.
 * M_CPU to PE 0 is no link (2 ns of PE_CPU); to PE 4, at (3,1), four links: 22.5 ns.
 */
static void test_net_command_path(void **state)
{
    kb_machine *m = make_net(NULL, 0);
    (void)state;
    assert_int_equal(kb_machine_cmd_iocpu_to_mcpu(m, 0, 5, 0, 64), 121250);
    assert_int_equal(kb_machine_cmd_mcpu_to_pe(m, kb_machine_pe(m, 0, 5, 0), 1000000, 64),
                     1002000);
    assert_int_equal(kb_machine_cmd_mcpu_to_pe(m, kb_machine_pe(m, 0, 5, 4), 2000000, 64),
                     2022500);
    kb_machine_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_shape),
        cmocka_unit_test(test_route_local_tcm),
        cmocka_unit_test(test_route_hbm_same_pe),
        cmocka_unit_test(test_route_cross_cube_xy),
        cmocka_unit_test(test_route_cross_sip),
        cmocka_unit_test(test_route_ring4),
        cmocka_unit_test(test_route_host),
        cmocka_unit_test(test_dma_idle_same_pe),
        cmocka_unit_test(test_dma_idle_cross_cube),
        cmocka_unit_test(test_dma_idle_cross_sip),
        cmocka_unit_test(test_dma_fifo),
        cmocka_unit_test(test_parts_idle),
        cmocka_unit_test(test_parts_contention),
        cmocka_unit_test(test_parts_through_sip),
        cmocka_unit_test(test_sip_bound),
        cmocka_unit_test(test_command_path),
        cmocka_unit_test(test_sip_hops_torus),
        cmocka_unit_test(test_sip_hops_mesh_no_wrap),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_bad_sizes),
        cmocka_unit_test(test_pa_outside),
        cmocka_unit_test(test_host_transfer_idle),
        cmocka_unit_test(test_net_layout),
        cmocka_unit_test(test_net_routes),
        cmocka_unit_test(test_net_dma_idle),
        cmocka_unit_test(test_net_long_route_memo),
        cmocka_unit_test(test_net_channels),
        cmocka_unit_test(test_net_channels_few),
        cmocka_unit_test(test_net_eight_pes),
        cmocka_unit_test(test_net_command_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
