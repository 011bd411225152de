/*
 * test_tl — the kernel language on the runtime, end to end on a small machine (1 SIP, 2 x 1
 * cubes, 4 PEs per cube, 6 GiB HBM slices) with the reference backend: program ids, data
 * results of load/elementwise/reduce/softmax/gemm/store after a host read, the exact
 * simulated cost of single operations (docs/timing-model.md), launch and host-transfer times,
 * scratch release, kernel errors with their messages, tensor placement errors and 2-D
 * scatter/gather. Kernels report what they see through a probe struct whose address travels
 * in kb_kargs.i[PROBE_ARG] (kernels get no other channel to the test; their tensors come in
 * the typed block). Limits: one SIP only; the multi-SIP paths are covered by test_machine.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_runtime.h"
#include "kb_runtime_ext.h"
#include "kb_seedgen.h"
#include "kb_tl.h"
#include "kb_tl_gemm.h"
#include "kb_test_util.h"

#define NPES 4
#define NCUBES 2
#define NPROG (NPES * NCUBES)
#define PROBE_ARG 7

typedef struct probe {
    int ran[NPROG];
    int pid[NPROG][3], np[NPROG][3];
    kb_time t_enter[NPROG];
    kb_time dt[8];           /* durations of single operations, ps */
    uint64_t used[4];        /* allocator readings */
    kb_time t0, t1, t2, t3;  /* host-side times */
    int rc[4];
} probe;

static probe *probe_of(const kb_kargs *a) { return (probe *)(intptr_t)a->i[PROBE_ARG]; }

/* The worked examples of timing-model.md §5-§6 (launches, loads, gemm) are the bus model's
 * with one DMA channel (the model before issue #29, still cube.noc.topology=bus): these tests
 * pin it; the network's routes and channels are test_machine's. */
static const char *const small_machine[] = {
    "system.sips.count=1",
    "sip.cube_mesh.width=2",
    "sip.cube_mesh.height=1",
    "cube.pe_per_corner=1",
    "cube.hbm.size_bytes=25769803776", /* 24 GiB = 4 slices of 6 GiB */
    "cube.noc.topology=bus",
    "pe.dma.channels=1",
};

static kb_ctx *make_ctx_with(kb_device_kind dev, const char *extra)
{
    kb_config cfg;
    kb_ctx *ctx;

    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    if (extra)
        kbt_config_set(&cfg, extra);
    ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = dev });
    assert_int_equal(kb_ctx_machine(ctx)->npes, NPES);
    assert_int_equal(kb_ctx_machine(ctx)->ncubes, NCUBES);
    return ctx;
}

static kb_ctx *make_ctx(void) { return make_ctx_with(KB_DEV_REF, NULL); }

static const kb_topo_cfg *topo(kb_ctx *ctx) { return &kb_ctx_config(ctx)->topo; }

static kb_tensor_desc desc(const char *name, int64_t rows, int64_t cols, kb_dtype dt,
                           kb_dp_policy dp)
{
    kb_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.name = name;
    d.rows = rows;
    d.cols = cols;
    d.dtype = dt;
    d.dp = dp;
    d.mem = KB_MEM_HBM;
    return d;
}

static kb_dp_policy on_pe0(void) { return kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1); }

static kb_kargs kargs(probe *p)
{
    kb_kargs a;
    memset(&a, 0, sizeof a);
    a.i[PROBE_ARG] = (int64_t)(intptr_t)p;
    return a;
}

static const kb_grid one_pe = { 1, 1, 1, -1 };

/* ---- program ids and launch timing ---- */

static void k_ids(kb_tl *tl, const kb_kargs *a)
{
    probe *p = probe_of(a);
    kb_pe_hw *pe = tl_pe(tl);
    int g = (int)(pe->cube * NPES + pe->pe);
    if (p->ran[g]++ == 0) /* the first launch's start times */
        p->t_enter[g] = kbt_tl_now(tl);
    for (int ax = 0; ax < 3; ax++) {
        p->pid[g][ax] = tl_program_id(tl, ax);
        p->np[g][ax] = tl_num_programs(tl, ax);
    }
}

static int h_ids(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_kargs a = kargs(p);
    kb_grid two = { 2, 1, 1, -1 };
    int rc;

    p->rc[0] = kb_launch_span(ctx, &p->t2, &p->t3); /* no launch yet */
    p->t0 = kbt_ctx_now(ctx);
    if ((rc = kb_launch(ctx, "ids", k_ids, &a, NULL)) != 0)
        return rc;
    p->t1 = kbt_ctx_now(ctx);
    p->rc[1] = kb_launch_span(ctx, &p->t2, &p->t3);
    memset(p->np, 0, sizeof p->np);
    if ((rc = kb_launch(ctx, "ids2", k_ids, &a, &two)) != 0)
        return rc;
    return 0;
}

static void test_program_ids(void **state)
{
    kb_ctx *ctx = make_ctx();
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_ids, &p), 0);
    for (int c = 0; c < NCUBES; c++) {
        for (int e = 0; e < NPES; e++) {
            int g = c * NPES + e;
            assert_int_equal(p.ran[g], e < 2 && c == 0 ? 2 : 1);
            assert_int_equal(p.pid[g][0], e);
            assert_int_equal(p.pid[g][1], c);
            assert_int_equal(p.pid[g][2], 0);
            if (e < 2 && c == 0) { /* the second, 2 x 1 x 1 grid wrote last */
                assert_int_equal(p.np[g][0], 2);
                assert_int_equal(p.np[g][1], 1);
            } else {
                assert_int_equal(p.np[g][0], 0);
            }
        }
    }
    assert_int_equal(kb_ctx_kernels_run(ctx), 10);
    /*
     * Kernel start of the first launch (whole SIP) at t=0: host 1000 ns + PCIe 1 ns + 1000 ns
     * + EP 100 ns + IO_CPU 200 ns = 2301 ns at IO_CPU; cube 0: M_CPU 50 ns -> 2351 ns; cube 1:
     * one UCIe hop (0.25 + 20 ns) first -> 2371.25 ns. PE p: NoC messages queue 125 ps each,
     * + 5 ns latency + PE_CPU 2 ns.
     */
    for (int e = 0; e < NPES; e++) {
        assert_int_equal(p.t_enter[e], 2351000 + 125 * (e + 1) + 5000 + 2000);
        assert_int_equal(p.t_enter[NPES + e], 2371250 + 125 * (e + 1) + 5000 + 2000);
    }
    /* the empty kernels' completions, aggregated per cube and per SIP (timing-model.md) */
    assert_int_equal(p.t1 - p.t0, 4064250);
    /* kb_launch_span: refused before the first launch; then the first PE's start and the
     * last one's end (an empty kernel ends where it starts): the rest of the launch's
     * 4 064 250 ps, 4 043 625, is its command path */
    assert_int_equal(p.rc[0], KB_ERR_STATE);
    assert_int_equal(p.rc[1], 0);
    assert_int_equal(p.t2 - p.t0, 2351000 + 125 + 5000 + 2000);
    assert_int_equal(p.t3 - p.t0, 2371250 + 125 * NPES + 5000 + 2000);
    assert_int_equal((p.t1 - p.t0) - (p.t3 - p.t2), 4043625);
    kb_ctx_destroy(ctx);
}

static void k_empty(kb_tl *tl, const kb_kargs *a)
{
    probe_of(a)->t_enter[0] = kbt_tl_now(tl);
}

static int h_empty(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_kargs a = kargs(p);
    p->t0 = kbt_ctx_now(ctx);
    int rc = kb_launch(ctx, "empty", k_empty, &a, &one_pe);
    p->t1 = kbt_ctx_now(ctx);
    return rc;
}

/* One PE, empty kernel: the command path there and back, hop by hop from the config. */
static void test_launch_round_trip(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_empty, &p), 0);
    int64_t pcie = kbt_xfer_ps(64, c->pcie.bandwidth_gbps) + kbt_ps(c->pcie.latency_ns);
    int64_t noc = kbt_xfer_ps(64, c->noc.bandwidth_gbps) + kbt_ps(c->noc.latency_ns);
    int64_t t_io = kbt_ps(c->host_overhead_ns) + pcie + kbt_ps(c->pcie_ep_overhead_ns) +
                   kbt_ps(c->io_cpu_overhead_ns);
    int64_t t_pe = t_io + kbt_ps(c->m_cpu_overhead_ns) + noc + kbt_ps(c->pe_cpu_overhead_ns);
    assert_int_equal(p.t_enter[0], t_pe);
    assert_int_equal(p.t_enter[0], 2358125);
    int64_t t_back = t_pe + noc + kbt_ps(c->m_cpu_overhead_ns) + kbt_ps(c->io_cpu_overhead_ns) +
                     kbt_ps(c->pcie_ep_overhead_ns) + pcie;
    assert_int_equal(p.t1 - p.t0, t_back);
    assert_int_equal(p.t1 - p.t0, 3714250);
    kb_ctx_destroy(ctx);
}

/* ---- sip.io_cpu.completions: per_cube against tree ---- */

static void k_cube_enter(kb_tl *tl, const kb_kargs *a)
{
    probe_of(a)->t_enter[tl_program_id(tl, 1)] = kbt_tl_now(tl);
}

static int h_two_cubes(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_kargs a = kargs(p);
    kb_grid g = { 1, 2, 1, -1 }; /* one PE in each of the 2 cubes */
    p->t0 = kbt_ctx_now(ctx);
    int rc = kb_launch(ctx, "cubes", k_cube_enter, &a, &g);
    p->t1 = kbt_ctx_now(ctx);
    return rc;
}

/*
 * An empty kernel on one PE of each of the 2 cubes. Cube 1's command arrives H after cube 0's
 * (its UCIe hop and NoCs), and its completion takes as long back (H). Cube 0's PE is done at
 * A0 (its NoC and M_CPU up). per_cube: cube 0 reports to the IO_CPU at A0; cube 1's report
 * gets there at A0 + 2H and is handled after cube 0's: A0 + max(2H, io) + io. tree: cube 1
 * reports to cube 0's M_CPU (A0 + 2H + mc), which alone reports to the IO_CPU:
 * A0 + 2H + mc + io. Both then take the PCIe EP and the PCIe up.
 */
static void test_completion_tree(void **state)
{
    probe p[2];
    (void)state;
    for (int k = 0; k < 2; k++) {
        kb_ctx *ctx = make_ctx_with(KB_DEV_NONE, k ? "sip.io_cpu.completions=tree" : NULL);
        const kb_topo_cfg *c = topo(ctx);
        memset(&p[k], 0, sizeof p[k]);
        assert_int_equal(kb_ctx_machine(ctx)->io_tree, k);
        assert_int_equal(kb_ctx_run_host(ctx, h_two_cubes, &p[k]), 0);
        int64_t noc = kbt_xfer_ps(64, c->noc.bandwidth_gbps) + kbt_ps(c->noc.latency_ns);
        int64_t pcie = kbt_xfer_ps(64, c->pcie.bandwidth_gbps) + kbt_ps(c->pcie.latency_ns);
        int64_t io = kbt_ps(c->io_cpu_overhead_ns), mc = kbt_ps(c->m_cpu_overhead_ns);
        int64_t h = p[k].t_enter[1] - p[k].t_enter[0];
        int64_t a0 = p[k].t_enter[0] + noc + mc, up = kbt_ps(c->pcie_ep_overhead_ns) + pcie;
        assert_true(h > 0);
        if (k == 0)
            assert_int_equal(p[k].t1, a0 + (2 * h > io ? 2 * h : io) + io + up);
        else
            assert_int_equal(p[k].t1, a0 + 2 * h + mc + io + up);
        kb_ctx_destroy(ctx);
    }
    /* the way down is the same */
    assert_int_equal(p[0].t_enter[0], p[1].t_enter[0]);
    assert_int_equal(p[0].t_enter[1], p[1].t_enter[1]);
    /* the small machine: H = 20.25 ns (one UCIe hop), so per_cube waits on the IO_CPU twice */
    assert_int_equal(p[0].t_enter[1] - p[0].t_enter[0], 20250);
    assert_int_equal(p[0].t1, 3914250);
    assert_int_equal(p[1].t1, 3804750);
}

/* Two empty one-PE launches in a device launch queue, and a host write inside one. */
static int h_queued(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_kargs a = kargs(p);
    kb_tensor *t = NULL;
    kb_tensor_desc d = { "x", 1, 4, KB_F32, kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1),
                         KB_MEM_HBM };
    int rc;
    p->t0 = kbt_ctx_now(ctx);
    if ((rc = kb_launch_queue(ctx, 1)) != 0 ||
        (rc = kb_launch(ctx, "empty", k_empty, &a, &one_pe)) != 0)
        return rc;
    p->t1 = kbt_ctx_now(ctx);
    if ((rc = kb_launch(ctx, "empty", k_empty, &a, &one_pe)) != 0)
        return rc;
    p->t2 = kbt_ctx_now(ctx);
    p->rc[0] = kb_tensor_zeros(ctx, &d, &t); /* refused: the host's time is the device's */
    kb_tensor_free(t);
    if ((rc = kb_launch_queue(ctx, 0)) != 0)
        return rc;
    p->t3 = kbt_ctx_now(ctx);
    return 0;
}

/*
 * The first queued launch pays the path down (2 301 000 to the IO_CPU) and is done for the
 * host when its completion reaches the IO_CPU (2 613 250, no PCIe up). The second starts at
 * the IO_CPU (its 200 ns) and takes the cube's M_CPU, the PE and back to the IO_CPU, and
 * turning the queue off pays the PCIe EP and PCIe up once: 4 226 500 ps for both, against
 * 2 x 3 714 250 one at a time.
 */
static void test_launch_queue(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_queued, &p), 0);
    int64_t pcie = kbt_xfer_ps(64, c->pcie.bandwidth_gbps) + kbt_ps(c->pcie.latency_ns);
    int64_t noc = kbt_xfer_ps(64, c->noc.bandwidth_gbps) + kbt_ps(c->noc.latency_ns);
    int64_t io = kbt_ps(c->io_cpu_overhead_ns), mc = kbt_ps(c->m_cpu_overhead_ns);
    int64_t pe = kbt_ps(c->pe_cpu_overhead_ns);
    int64_t t_io = kbt_ps(c->host_overhead_ns) + pcie + kbt_ps(c->pcie_ep_overhead_ns) + io;
    int64_t done1 = t_io + mc + noc + pe + noc + mc + io;
    assert_int_equal(p.t1 - p.t0, done1);
    assert_int_equal(p.t1 - p.t0, 2613250);
    int64_t done2 = done1 + io + mc + noc + pe + noc + mc + io;
    assert_int_equal(p.t2 - p.t0, done2);
    assert_int_equal(p.rc[0], KB_ERR_STATE);
    assert_int_equal(p.t3 - p.t0, done2 + kbt_ps(c->pcie_ep_overhead_ns) + pcie);
    assert_int_equal(p.t3 - p.t0, 4226500);
    kbt_msg_has(kb_ctx_errmsg(ctx), "inside a device launch queue");
    kb_ctx_destroy(ctx);
}

/* ---- load + add + store ---- */

typedef struct add_rows_args {
    kb_va x, y, z;
    int64_t cols;
} add_rows_args;

static void k_add_rows(kb_tl *tl, const kb_kargs *ka)
{
    const add_rows_args *a = KB_KARGS_GET(ka, add_rows_args);
    int64_t idx = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    int64_t cols = a->cols;
    kb_val x = tl_load(tl, a->x + (kb_va)(idx * cols * 4), KB_SHAPE2(1, cols), KB_F32);
    kb_val y = tl_load(tl, a->y + (kb_va)(idx * cols * 4), KB_SHAPE2(1, cols), KB_F32);
    kb_val z = tl_add(tl, x, y);
    tl_store(tl, a->z + (kb_va)(idx * cols * 2), z); /* z is f16 */
}

typedef struct add_io {
    float x[8 * 16], y[8 * 16], z[8 * 16];
} add_io;

static int h_add_rows(kb_ctx *ctx, void *arg)
{
    add_io *io = arg;
    kb_dp_policy rows = kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, 0, 0);
    kb_tensor_desc dx = desc("x", 8, 16, KB_F32, rows), dy = desc("y", 8, 16, KB_F32, rows);
    kb_tensor_desc dz = desc("z", 8, 16, KB_F16, rows);
    kb_tensor *tx, *ty, *tz;
    kb_kargs a = kargs(NULL);
    int rc;

    if ((rc = kb_tensor_from_host(ctx, &dx, io->x, &tx)) != 0 ||
        (rc = kb_tensor_from_host(ctx, &dy, io->y, &ty)) != 0 ||
        (rc = kb_tensor_empty(ctx, &dz, &tz)) != 0)
        return rc;
    if (kb_tensor_nshards(tz) != NPROG)
        return KB_ERR_STATE;
    KB_KARGS_PUT(&a, (add_rows_args){ .x = kb_tensor_va(tx), .y = kb_tensor_va(ty),
                                      .z = kb_tensor_va(tz), .cols = 16 });
    if ((rc = kb_launch(ctx, "add_rows", k_add_rows, &a, NULL)) != 0)
        return rc;
    return kb_tensor_read(tz, io->z);
}

static void test_load_add_store(void **state)
{
    kb_ctx *ctx = make_ctx();
    add_io *io = calloc(1, sizeof *io);

    (void)state;
    assert_non_null(io);
    for (int i = 0; i < 8 * 16; i++) {
        io->x[i] = 0.25f * (float)i;
        io->y[i] = 100.0f - (float)i;
        io->z[i] = -1.0f;
    }
    assert_int_equal(kb_ctx_run_host(ctx, h_add_rows, io), 0);
    /* 100 - 0.75 i is exact in f16 for i < 128 */
    for (int i = 0; i < 8 * 16; i++)
        assert_true(io->z[i] == 100.0f - 0.75f * (float)i);
    kb_ctx_destroy(ctx);
    free(io);
}

/* ---- the exact cost of one vector op ---- */

/* the one tensor of a kernel that reads or writes only one */
typedef struct one_args {
    kb_va t;
} one_args;

static void k_add_timed(kb_tl *tl, const kb_kargs *ka)
{
    probe *p = probe_of(ka);
    kb_time t0 = kbt_tl_now(tl);
    kb_val x = tl_full(tl, KB_SHAPE2(1, 100), 1.5f);
    kb_time t1 = kbt_tl_now(tl);
    kb_val y = tl_full(tl, KB_SHAPE2(1, 100), 2.0f);
    kb_time t2 = kbt_tl_now(tl);
    kb_val z = tl_add(tl, x, y);
    kb_time t3 = kbt_tl_now(tl);
    p->dt[0] = t1 - t0;
    p->dt[1] = t3 - t2;
    p->used[0] = kb_alloc_used(tl_pe(tl)->scratch);
    tl_store(tl, KB_KARGS_GET(ka, one_args)->t, z);
}

static int h_add_timed(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_tensor_desc d = desc("out", 1, 100, KB_F32, on_pe0());
    kb_tensor *t;
    kb_kargs a = kargs(p);
    float out[100];
    int rc;

    if ((rc = kb_tensor_empty(ctx, &d, &t)) != 0)
        return rc;
    KB_KARGS_PUT(&a, (one_args){ .t = kb_tensor_va(t) });
    if ((rc = kb_launch(ctx, "add_timed", k_add_timed, &a, &one_pe)) != 0 ||
        (rc = kb_tensor_read(t, out)) != 0)
        return rc;
    for (int i = 0; i < 100; i++)
        if (out[i] != 3.5f)
            return KB_ERR_VERIFY;
    p->used[1] = kb_alloc_used(kb_machine_pe(kb_ctx_machine(ctx), 0, 0, 0)->scratch);
    return 0;
}

static void test_add_duration(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_add_timed, &p), 0);
    /* PE_CPU issue + PE_MATH fixed + ceil(100 elements * 1000 / 64 lanes) ps */
    int64_t want = kbt_ps(c->pe_cpu_overhead_ns) + kbt_ps(c->math_fixed_ns) +
                   kbt_xfer_ps(100, c->math_lanes_per_ns);
    assert_int_equal(p.dt[1], want);
    assert_int_equal(p.dt[1], 2000 + 4000 + 1563);
    assert_int_equal(p.dt[0], want); /* tl_full costs the same */
    /* three live 400-byte f32 values: small values come from one 64 KiB chunk of the PE's
     * scratch (512-byte class), taken when the first is allocated */
    assert_int_equal(p.used[0], 64 * 1024);
    assert_int_equal(p.used[1], 0); /* released when the kernel returned */
    kb_ctx_destroy(ctx);
}

/* ---- posted stores ---- */

typedef struct two_args {
    kb_va t0, t1;
} two_args;

/* A blocking store, then two posted ones of the same value into the two tensors. */
static void k_store_posted(kb_tl *tl, const kb_kargs *ka)
{
    probe *p = probe_of(ka);
    const two_args *a = KB_KARGS_GET(ka, two_args);
    kb_val x = tl_full(tl, KB_SHAPE2(1, 100), 1.5f);
    kb_time t0 = kbt_tl_now(tl);
    tl_store(tl, a->t0, x);
    kb_time t1 = kbt_tl_now(tl);
    int64_t la = tl_store_async(tl, a->t0, x);
    kb_time t2 = kbt_tl_now(tl);
    int64_t lb = tl_store2d_async(tl, a->t1, 100, x);
    kb_time t3 = kbt_tl_now(tl);
    p->dt[0] = t1 - t0;           /* the blocking store */
    p->dt[1] = t2 - t1;           /* a posted one's issue */
    p->dt[2] = t3 - t2;
    p->dt[3] = (kb_time)la - t1;  /* its landing */
    p->dt[4] = (kb_time)lb - t1;
    p->t_enter[0] = (kb_time)lb;
    tl_free_after(tl, x, lb);
}

/* A posted load of tensor a into a view of a value, then twice it into tensor b. */
static void k_load_posted(kb_tl *tl, const kb_kargs *ka)
{
    probe *p = probe_of(ka);
    const two_args *a = KB_KARGS_GET(ka, two_args);
    kb_val y = tl_full(tl, KB_SHAPE2(2, 100), 0.0f);
    kb_time t0 = kbt_tl_now(tl);
    int64_t ready = tl_load_into_async(tl, tl_view(tl, y, 1, 0, 1, 100), a->t0, 100);
    p->dt[5] = kbt_tl_now(tl) - t0; /* the issue */
    p->dt[6] = (kb_time)ready - t0;
    tl_wait_time(tl, ready);
    tl_store(tl, a->t1, tl_scale(tl, tl_view(tl, y, 1, 0, 1, 100), 2.0f, 0.0f));
}

static int h_store_posted(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_tensor_desc d0 = desc("a", 1, 100, KB_F32, on_pe0()), d1 = desc("b", 1, 100, KB_F32, on_pe0());
    kb_tensor *t0, *t1;
    kb_kargs a = kargs(p);
    float out[100];
    int rc;

    if ((rc = kb_tensor_empty(ctx, &d0, &t0)) != 0 || (rc = kb_tensor_empty(ctx, &d1, &t1)) != 0)
        return rc;
    KB_KARGS_PUT(&a, (two_args){ .t0 = kb_tensor_va(t0), .t1 = kb_tensor_va(t1) });
    if ((rc = kb_launch(ctx, "store_posted", k_store_posted, &a, &one_pe)) != 0 ||
        (rc = kb_launch_span(ctx, &p->t2, &p->t3)) != 0)
        return rc;
    for (int k = 0; k < 2; k++) {
        if ((rc = kb_tensor_read(k ? t1 : t0, out)) != 0)
            return rc;
        for (int i = 0; i < 100; i++)
            if (out[i] != 1.5f)
                return KB_ERR_VERIFY;
    }
    if ((rc = kb_launch(ctx, "load_posted", k_load_posted, &a, &one_pe)) != 0 ||
        (rc = kb_tensor_read(t1, out)) != 0)
        return rc;
    for (int i = 0; i < 100; i++)
        if (out[i] != 3.0f)
            return KB_ERR_VERIFY;
    return 0;
}

static void test_store_posted(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_store_posted, &p), 0);
    /* 400 bytes scratch -> own HBM (timing-model.md §11, T_store): issue, TCM, NoC, HBM,
     * DMA setup and the transfer at the channel's rate */
    int64_t xfer = kbt_xfer_ps(400, c->dma_bandwidth_gbps), setup = kbt_ps(c->dma_setup_ns);
    int64_t store = kbt_ps(c->pe_cpu_overhead_ns) + kbt_ps(c->tcm.latency_ns) +
                    kbt_ps(c->noc.latency_ns) + kbt_ps(c->hbm.latency_ns) + setup + xfer;
    assert_int_equal(p.dt[0], store);
    assert_int_equal(p.dt[0], 132125);
    /* posted: the kernel pays the issue only; the first lands as the blocking store did, the
     * second (issued 2 ns later) waits for the one DMA channel: setup + transfer */
    assert_int_equal(p.dt[1], kbt_ps(c->pe_cpu_overhead_ns));
    assert_int_equal(p.dt[2], kbt_ps(c->pe_cpu_overhead_ns));
    assert_int_equal(p.dt[3], store);
    assert_int_equal(p.dt[4], store + setup + xfer);
    assert_int_equal(p.dt[4], 155250);
    /* the kernel ends when the last one has landed, and both tensors hold the value */
    assert_int_equal(p.t3, p.t_enter[0]);
    /* a posted load into a view: the issue, then the data there after the same path the
     * other way (own HBM -> scratch); twice what it loaded reached tensor b */
    assert_int_equal(p.dt[5], kbt_ps(c->pe_cpu_overhead_ns));
    assert_int_equal(p.dt[6], store);
    kb_ctx_destroy(ctx);
}

/* ---- notifications, barriers and launches of several kernels (kb_launch_seq) ---- */

/* PE 1 notifies PE 0 (slot 3) after dt[0] of work; PE 0 waits for it. */
static void k_notify(kb_tl *tl, const kb_kargs *a)
{
    probe *p = probe_of(a);
    if (tl_program_id(tl, 0) == 1) {
        kb_tl_wait_until(tl, kbt_tl_now(tl) + 100000);
        p->t0 = kbt_tl_now(tl);
        tl_notify(tl, 0, 0, 3);
        p->t1 = kbt_tl_now(tl);
    } else {
        tl_wait_notify(tl, 3, 1);
        p->t2 = kbt_tl_now(tl);
        tl_wait_notify(tl, 3, 0); /* nothing to wait for: the issue only */
        p->t3 = kbt_tl_now(tl);
    }
}

/* Stage 0: PE k of the grid works k * 100 ns and records its end; stage 1 records its
 * start and its program ids. */
static void k_stage0(kb_tl *tl, const kb_kargs *a)
{
    probe *p = probe_of(a);
    kb_pe_hw *pe = tl_pe(tl);
    int g = (int)(pe->cube * NPES + pe->pe);
    kb_tl_wait_until(tl, kbt_tl_now(tl) + (kb_time)g * 100000);
    p->t_enter[g] = kbt_tl_now(tl);
    p->ran[g] |= 1;
}

static void k_stage1(kb_tl *tl, const kb_kargs *a)
{
    probe *p = probe_of(a);
    kb_pe_hw *pe = tl_pe(tl);
    int g = (int)(pe->cube * NPES + pe->pe);
    p->ran[g] |= 2;
    for (int ax = 0; ax < 3; ax++) {
        p->pid[g][ax] = tl_program_id(tl, ax);
        p->np[g][ax] = tl_num_programs(tl, ax);
    }
    p->dt[g] = kbt_tl_now(tl);
}

static int h_notify(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_kargs a = kargs(p);
    kb_grid two = { 2, 1, 1, -1 };
    int rc;
    if ((rc = kb_launch(ctx, "notify", k_notify, &a, &two)) != 0)
        return rc;
    /* a barrier over 2 PEs of cube 0, then over the whole SIP (stage 1 on cube 1 only) */
    kb_stage st[2] = { { .kernel = k_stage0, .args = a, .pes = 2, .cubes = 1 },
                       { .kernel = k_stage1, .args = a, .pes = 2, .cubes = 1 } };
    p->rc[0] = kb_launch_seq(ctx, "seq2", st, 2, NULL);
    memcpy(p->used, (uint64_t[]){ (uint64_t)p->t_enter[1], (uint64_t)p->dt[1] }, 16);
    memset(p->ran, 0, sizeof p->ran);
    st[0].pes = st[0].cubes = 0; /* every PE */
    st[1].pes = 3;
    st[1].cubes = 2;
    p->rc[1] = kb_launch_seq(ctx, "seq8", st, 2, NULL);
    kb_stage_stats ss;
    p->rc[2] = kb_launch_stage_stats(ctx, 1, &ss);
    p->rc[3] = kb_launch_stage_stats(ctx, 2, &ss);
    p->used[2] = (uint64_t)ss.first; /* untouched by the refused call: stage 1's */
    return 0;
}

/*
 * One notification on the small machine: the issue, then an 8-byte DMA from PE 1's TCM to
 * PE 0's over the cube's bus (TCM, NoC, TCM latencies, the channel's setup and transfer).
 * A two-PE barrier: PE 1 arrives last (it worked 100 ns), tells PE 0, which releases it: PE 1
 * runs stage 1 two notifications after its arrival. Over the whole SIP every PE runs stage
 * 1 after every PE has ended stage 0.
 */
static void test_notify_barrier(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_notify, &p), 0);
    int64_t issue = kbt_ps(c->pe_cpu_overhead_ns);
    int64_t dma = 2 * kbt_ps(c->tcm.latency_ns) + kbt_ps(c->noc.latency_ns) +
                  kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(8, c->dma_bandwidth_gbps);
    assert_int_equal(p.t1 - p.t0, issue);       /* posted: the issue only */
    assert_int_equal(p.t2 - p.t0, issue + dma); /* PE 0 resumes as it lands */
    assert_int_equal(p.t2 - p.t0, 31063);
    assert_int_equal(p.t3 - p.t2, issue);
    /* the two-PE barrier */
    assert_int_equal(p.rc[0], 0);
    assert_int_equal((int64_t)(p.used[1] - p.used[0]), 2 * (issue + dma));
    /* the whole SIP: stage 1 on the 3 x 2 PEs of its grid only, with its program ids */
    assert_int_equal(p.rc[1], 0);
    kb_time last0 = 0, first1 = KB_TIME_MAX;
    for (int g = 0; g < NPROG; g++) {
        int in1 = g % NPES < 3;
        assert_int_equal(p.ran[g], in1 ? 3 : 1);
        last0 = p.t_enter[g] > last0 ? p.t_enter[g] : last0;
        if (in1) {
            first1 = p.dt[g] < first1 ? p.dt[g] : first1;
            assert_int_equal(p.pid[g][0], g % NPES);
            assert_int_equal(p.pid[g][1], g / NPES);
            assert_int_equal(p.np[g][0], 3);
            assert_int_equal(p.np[g][1], 2);
        }
    }
    assert_true(first1 > last0);
    assert_int_equal(p.rc[2], 0);
    assert_int_equal((kb_time)p.used[2], first1); /* stage 1's first start */
    assert_int_equal(p.rc[3], KB_ERR_RANGE);
    kb_ctx_destroy(ctx);
}

/* Misuse: a notification nobody takes, a PE outside the grid, a wait from a thread, a
 * notification that lands after its target returned. */
static void k_untaken(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    if (tl_program_id(tl, 0) == 1)
        tl_notify(tl, 0, 0, 0);
    else /* still running when it lands */
        kb_tl_wait_until(tl, kbt_tl_now(tl) + 1000000);
}

static void k_late(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    if (tl_program_id(tl, 0) == 1) {
        kb_tl_wait_until(tl, kbt_tl_now(tl) + 100000);
        tl_notify(tl, 0, 0, 0);
    }
}

static void k_outside(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    tl_notify(tl, 0, 2, 0);
}

static void thread_wait(kb_tl *tl, void *arg)
{
    (void)arg;
    tl_wait_notify(tl, 0, 1);
}

static void k_thread_wait(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    tl_join(tl, tl_fork(tl, thread_wait, NULL));
}

static int h_misuse(kb_ctx *ctx, void *arg)
{
    static const kb_kernel_fn k[] = { k_untaken, k_outside, k_thread_wait, k_late };
    kb_grid two = { 2, 1, 1, -1 };
    kb_kargs a = kargs(arg);
    return kb_launch(ctx, "misuse", k[((probe *)arg)->rc[0]], &a, &two);
}

static void test_notify_errors(void **state)
{
    static const char *const msg[] = { "returned with 1 notification(s) in slot 0 not taken",
                                       "PE 2 of cube 0 is outside the launch's grid of 1 x 2",
                                       "only a launch's kernel may use notifications",
                                       "a notification (slot 0) reached sip0/cube0/pe0 after "
                                       "its kernel returned" };
    static const int code[] = { KB_ERR_STATE, KB_ERR_INVAL, KB_ERR_STATE, KB_ERR_STATE };
    (void)state;
    for (int i = 0; i < 4; i++) {
        kb_ctx *ctx = make_ctx();
        probe p;
        memset(&p, 0, sizeof p);
        p.rc[0] = i;
        assert_int_equal(kb_ctx_run_host(ctx, h_misuse, &p), code[i]);
        assert_non_null(strstr(kb_ctx_errmsg(ctx), msg[i]));
        kb_ctx_destroy(ctx);
    }
    /* a launch of no stages, or of a stage wider than the SIP */
    kb_ctx *ctx = make_ctx();
    kb_stage st = { .kernel = k_empty, .pes = NPES + 1, .cubes = 1 };
    assert_int_equal(kb_launch_seq(ctx, "none", &st, 0, NULL), KB_ERR_INVAL);
    assert_int_equal(kb_launch_seq(ctx, "wide", &st, 1, NULL), KB_ERR_RANGE);
    kb_ctx_destroy(ctx);
}

/* ---- reductions, softmax, broadcasting ---- */

static const float k_sm_in[8] = { 1, -2, 3, -4, -1, 5, -3, 0 };

/* x and the outputs: softmax and sum along rows, sum along columns, max along rows and
 * columns, softmax along columns */
typedef struct reduce_args {
    kb_va x, sm, s1, s0, m1, m0, sm0;
} reduce_args;

static void k_reduce(kb_tl *tl, const kb_kargs *ka)
{
    probe *p = probe_of(ka);
    const reduce_args *a = KB_KARGS_GET(ka, reduce_args);
    kb_val x = tl_load(tl, a->x, KB_SHAPE2(2, 4), KB_F32);
    kb_time t0 = kbt_tl_now(tl);
    kb_val sm = tl_softmax(tl, x, 1);
    kb_time t1 = kbt_tl_now(tl);
    kb_val s1 = tl_sum(tl, x, 1);
    kb_time t2 = kbt_tl_now(tl);
    p->dt[0] = t1 - t0;
    p->dt[1] = t2 - t1;
    tl_store(tl, a->sm, sm);
    tl_store(tl, a->s1, s1);
    tl_store(tl, a->s0, tl_sum(tl, x, 0));
    tl_store(tl, a->m1, tl_max(tl, x, 1));
    tl_store(tl, a->m0, tl_max(tl, x, 0));
    tl_store(tl, a->sm0, tl_softmax(tl, x, 0));
}

typedef struct reduce_io {
    probe p;
    float sm[8], s1[2], s0[4], m1[2], m0[4], sm0[8];
} reduce_io;

static int h_reduce(kb_ctx *ctx, void *arg)
{
    reduce_io *io = arg;
    static const int64_t shape[7][2] = { { 2, 4 }, { 2, 4 }, { 2, 1 }, { 1, 4 },
                                         { 2, 1 }, { 1, 4 }, { 2, 4 } };
    float *outs[7] = { NULL, io->sm, io->s1, io->s0, io->m1, io->m0, io->sm0 };
    kb_tensor *t[7];
    kb_kargs a = kargs(&io->p);
    int rc;

    for (int i = 0; i < 7; i++) {
        kb_tensor_desc d = desc(i ? "out" : "x", shape[i][0], shape[i][1], KB_F32, on_pe0());
        rc = i ? kb_tensor_empty(ctx, &d, &t[i]) : kb_tensor_from_host(ctx, &d, k_sm_in, &t[i]);
        if (rc)
            return rc;
    }
    KB_KARGS_PUT(&a, (reduce_args){ .x = kb_tensor_va(t[0]), .sm = kb_tensor_va(t[1]),
                                    .s1 = kb_tensor_va(t[2]), .s0 = kb_tensor_va(t[3]),
                                    .m1 = kb_tensor_va(t[4]), .m0 = kb_tensor_va(t[5]),
                                    .sm0 = kb_tensor_va(t[6]) });
    if ((rc = kb_launch(ctx, "reduce", k_reduce, &a, &one_pe)) != 0)
        return rc;
    for (int i = 1; i < 7; i++)
        if ((rc = kb_tensor_read(t[i], outs[i])) != 0)
            return rc;
    return 0;
}

static void test_softmax_sum_max(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    reduce_io io;

    (void)state;
    memset(&io, 0, sizeof io);
    assert_int_equal(kb_ctx_run_host(ctx, h_reduce, &io), 0);
    for (int r = 0; r < 2; r++) {
        double mx = -1e30, sum = 0.0;
        for (int j = 0; j < 4; j++)
            mx = fmax(mx, (double)k_sm_in[r * 4 + j]);
        for (int j = 0; j < 4; j++)
            sum += exp((double)k_sm_in[r * 4 + j] - mx);
        for (int j = 0; j < 4; j++)
            assert_float_equal(io.sm[r * 4 + j], exp((double)k_sm_in[r * 4 + j] - mx) / sum, 1e-6);
    }
    for (int j = 0; j < 4; j++) {
        double a0 = (double)k_sm_in[j], a1 = (double)k_sm_in[4 + j], mx = fmax(a0, a1);
        double sum = exp(a0 - mx) + exp(a1 - mx);
        assert_float_equal(io.sm0[j], exp(a0 - mx) / sum, 1e-6);
        assert_float_equal(io.sm0[4 + j], exp(a1 - mx) / sum, 1e-6);
    }
    assert_true(io.s1[0] == -2.0f && io.s1[1] == 1.0f);
    assert_true(io.s0[0] == 0.0f && io.s0[1] == 3.0f && io.s0[2] == 0.0f && io.s0[3] == -4.0f);
    assert_true(io.m1[0] == 3.0f && io.m1[1] == 5.0f);
    assert_true(io.m0[0] == 1.0f && io.m0[1] == 5.0f && io.m0[2] == 3.0f && io.m0[3] == 0.0f);
    /* softmax: 4 passes over 8 elements; a reduction: 1 pass */
    assert_int_equal(io.p.dt[0], kbt_ps(c->pe_cpu_overhead_ns) + kbt_ps(c->math_fixed_ns) +
                                     kbt_xfer_ps(4 * 8, c->math_lanes_per_ns));
    assert_int_equal(io.p.dt[0], 2000 + 4000 + 500);
    assert_int_equal(io.p.dt[1], 2000 + 4000 + 125);
    kb_ctx_destroy(ctx);
}

typedef struct bcast_args {
    kb_va x, bias, col, sum, prod;
} bcast_args;

static void k_bcast(kb_tl *tl, const kb_kargs *ka)
{
    const bcast_args *a = KB_KARGS_GET(ka, bcast_args);
    kb_val x = tl_load(tl, a->x, KB_SHAPE2(3, 4), KB_F32);
    kb_val bias = tl_load(tl, a->bias, KB_SHAPE2(1, 4), KB_F32);
    kb_val col = tl_load(tl, a->col, KB_SHAPE2(3, 1), KB_F32);
    tl_store(tl, a->sum, tl_add(tl, x, bias));
    tl_store(tl, a->prod, tl_mul(tl, col, x)); /* the broadcast operand may come first */
}

typedef struct bcast_io {
    float x[12], bias[4], col[3], sum[12], prod[12];
} bcast_io;

static int h_bcast(kb_ctx *ctx, void *arg)
{
    bcast_io *io = arg;
    kb_dp_policy one = on_pe0();
    kb_tensor_desc dx = desc("x", 3, 4, KB_F32, one), db = desc("bias", 1, 4, KB_F32, one);
    kb_tensor_desc dc = desc("col", 3, 1, KB_F32, one), ds = desc("sum", 3, 4, KB_F32, one);
    kb_tensor *tx, *tb, *tc, *ts, *tp;
    kb_kargs a = kargs(NULL);
    int rc;

    if ((rc = kb_tensor_from_host(ctx, &dx, io->x, &tx)) != 0 ||
        (rc = kb_tensor_from_host(ctx, &db, io->bias, &tb)) != 0 ||
        (rc = kb_tensor_from_host(ctx, &dc, io->col, &tc)) != 0 ||
        (rc = kb_tensor_empty(ctx, &ds, &ts)) != 0 || (rc = kb_tensor_empty(ctx, &ds, &tp)) != 0)
        return rc;
    KB_KARGS_PUT(&a, (bcast_args){ .x = kb_tensor_va(tx), .bias = kb_tensor_va(tb),
                                   .col = kb_tensor_va(tc), .sum = kb_tensor_va(ts),
                                   .prod = kb_tensor_va(tp) });
    if ((rc = kb_launch(ctx, "bcast", k_bcast, &a, &one_pe)) != 0 ||
        (rc = kb_tensor_read(ts, io->sum)) != 0 || (rc = kb_tensor_read(tp, io->prod)) != 0)
        return rc;
    return 0;
}

static void test_broadcast(void **state)
{
    kb_ctx *ctx = make_ctx();
    bcast_io io;

    (void)state;
    memset(&io, 0, sizeof io);
    for (int i = 0; i < 12; i++)
        io.x[i] = (float)i;
    for (int j = 0; j < 4; j++)
        io.bias[j] = 100.0f * (float)(j + 1);
    for (int r = 0; r < 3; r++)
        io.col[r] = (float)(r - 1);
    assert_int_equal(kb_ctx_run_host(ctx, h_bcast, &io), 0);
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 4; j++) {
            assert_true(io.sum[r * 4 + j] == (float)(r * 4 + j) + 100.0f * (float)(j + 1));
            assert_true(io.prod[r * 4 + j] == (float)(r * 4 + j) * (float)(r - 1));
        }
    kb_ctx_destroy(ctx);
}

/* ---- gemm: local operands, and SchedulerV2 streaming from HBM ---- */

static const float k_A[6] = { 1, 2, 3, 4, 5, 6 };        /* 2 x 3 */
static const float k_B[6] = { 7, 8, 9, 10, 11, 12 };     /* 3 x 2 */
static const float k_C[4] = { 58, 64, 139, 154 };        /* A @ B */

typedef struct gemm_args {
    kb_va a, b, c, acc;
    int streamed; /* A and B by tl_ref, else loaded */
    int stages;   /* kb_tl_set_stages before the gemms (0: the default) */
} gemm_args;

static void k_gemm(kb_tl *tl, const kb_kargs *ka)
{
    probe *p = probe_of(ka);
    const gemm_args *g = KB_KARGS_GET(ka, gemm_args);
    kb_val va, vb;
    if (g->stages)
        kb_tl_set_stages(tl, g->stages);
    p->dt[1] = kb_tl_stages(tl);
    if (g->streamed) {
        va = tl_ref(tl, g->a, KB_SHAPE2(2, 3), KB_F32);
        vb = tl_ref(tl, g->b, KB_SHAPE2(3, 2), KB_F32);
    } else {
        va = tl_load(tl, g->a, KB_SHAPE2(2, 3), KB_F32);
        vb = tl_load(tl, g->b, KB_SHAPE2(3, 2), KB_F32);
    }
    kb_time t0 = kbt_tl_now(tl);
    kb_val c = tl_dot(tl, va, vb);
    p->dt[0] = kbt_tl_now(tl) - t0;
    tl_store(tl, g->c, c);
    kb_val acc = tl_full(tl, KB_SHAPE2(2, 2), 1.0f);
    tl_dot_acc(tl, acc, va, vb);
    tl_store(tl, g->acc, acc);
}

typedef struct gemm_io {
    probe p;
    int streamed, stages;
    float c[4], acc[4];
} gemm_io;

static int h_gemm(kb_ctx *ctx, void *arg)
{
    gemm_io *io = arg;
    kb_tensor_desc da = desc("a", 2, 3, KB_F32, on_pe0()), db = desc("b", 3, 2, KB_F32, on_pe0());
    kb_tensor_desc dc = desc("c", 2, 2, KB_F32, on_pe0());
    kb_tensor *ta, *tb, *tc, *tacc;
    kb_kargs a = kargs(&io->p);
    int rc;

    if ((rc = kb_tensor_from_host(ctx, &da, k_A, &ta)) != 0 ||
        (rc = kb_tensor_from_host(ctx, &db, k_B, &tb)) != 0 ||
        (rc = kb_tensor_empty(ctx, &dc, &tc)) != 0 || (rc = kb_tensor_empty(ctx, &dc, &tacc)) != 0)
        return rc;
    KB_KARGS_PUT(&a, (gemm_args){ .a = kb_tensor_va(ta), .b = kb_tensor_va(tb),
                                  .c = kb_tensor_va(tc), .acc = kb_tensor_va(tacc),
                                  .streamed = io->streamed, .stages = io->stages });
    if ((rc = kb_launch(ctx, "gemm", k_gemm, &a, &one_pe)) != 0 ||
        (rc = kb_tensor_read(tc, io->c)) != 0 || (rc = kb_tensor_read(tacc, io->acc)) != 0)
        return rc;
    return 0;
}

static void check_gemm_values(const gemm_io *io)
{
    for (int i = 0; i < 4; i++) {
        assert_true(io->c[i] == k_C[i]);
        assert_true(io->acc[i] == k_C[i] + 1.0f);
    }
}

static void test_gemm_local(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    gemm_io io;

    (void)state;
    memset(&io, 0, sizeof io);
    assert_int_equal(kb_ctx_run_host(ctx, h_gemm, &io), 0);
    check_gemm_values(&io);
    /* issue + fixed + ceil(2*M*N*K * 1000 / flops_per_ns) = 2 + 16 + 0.006 ns (24 flops) */
    assert_int_equal(io.p.dt[0], kbt_ps(c->pe_cpu_overhead_ns) + kbt_ps(c->gemm_fixed_ns) +
                                     kbt_xfer_ps(2 * 2 * 2 * 3, c->gemm_flops_per_ns));
    assert_int_equal(io.p.dt[0], 18006);
    kb_ctx_destroy(ctx);
}

/* One SchedulerV2 step: DMA A's tile, then B's (the engine is FIFO), then one PE_GEMM use. */
static void test_gemm_streamed_one_step(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    gemm_io io;

    (void)state;
    memset(&io, 0, sizeof io);
    io.streamed = 1;
    assert_int_equal(kb_ctx_run_host(ctx, h_gemm, &io), 0);
    check_gemm_values(&io);
    int64_t lat = kbt_ps(c->hbm.latency_ns) + kbt_ps(c->noc.latency_ns) + kbt_ps(c->tcm.latency_ns);
    /* 24 B tiles */
    int64_t dma24 = kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(24, c->dma_bandwidth_gbps);
    int64_t want = kbt_ps(c->pe_cpu_overhead_ns) + 2 * dma24 + lat + kbt_ps(c->gemm_fixed_ns) +
                   kbt_xfer_ps(24, c->gemm_flops_per_ns);
    assert_int_equal(io.p.dt[0], want);
    assert_int_equal(io.p.dt[0], 2000 + 2 * 20188 + 107000 + 16000 + 6);
    kb_ctx_destroy(ctx);
}

/*
 * tile_k = 2 cuts K = 3 into steps of 2 and 1. Double buffering: step 1's loads are issued
 * at the start (step -1 "finished" then), queue on the DMA engine behind step 0's, and the
 * second PE_GEMM use starts when they have arrived.
 */
static void test_gemm_streamed_two_steps(void **state)
{
    kb_ctx *ctx = make_ctx_with(KB_DEV_REF, "pe.scheduler.tile_k=2");
    const kb_topo_cfg *c = topo(ctx);
    gemm_io io;

    (void)state;
    memset(&io, 0, sizeof io);
    io.streamed = 1;
    assert_int_equal(kb_ctx_run_host(ctx, h_gemm, &io), 0);
    check_gemm_values(&io);
    int64_t lat = kbt_ps(c->hbm.latency_ns) + kbt_ps(c->noc.latency_ns) + kbt_ps(c->tcm.latency_ns);
    int64_t d16 = kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(16, c->dma_bandwidth_gbps); /* 2x2 f32 */
    int64_t d8 = kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(8, c->dma_bandwidth_gbps);   /* 2x1 / 1x2 */
    int64_t g0 = kbt_ps(c->gemm_fixed_ns) + kbt_xfer_ps(16, c->gemm_flops_per_ns);
    int64_t g1 = kbt_ps(c->gemm_fixed_ns) + kbt_xfer_ps(8, c->gemm_flops_per_ns);
    int64_t ti = kbt_ps(c->pe_cpu_overhead_ns);
    int64_t end0 = ti + d16 + lat + d16 + g0;          /* A0, B0 back to back, gemm 0 */
    int64_t ready1 = ti + 2 * d16 + d8 + lat + d8;     /* A1, B1 queued behind them */
    int64_t end1 = (ready1 > end0 ? ready1 : end0) + g1;
    assert_int_equal(io.p.dt[0], end1);
    assert_int_equal(end0, 2000 + 20125 + 107000 + 20125 + 16004);
    assert_int_equal(io.p.dt[0], 2000 + 2 * 20125 + 2 * 20063 + 107000 + 16002);
    kb_ctx_destroy(ctx);
}


/*
 * Three steps (tile_k = 1: A tiles 2 x 1, B tiles 1 x 2, 8 bytes each, occupancy d8 on the
 * one DMA engine, gemm g each). Double-buffered, step 2's loads wait for gemm 0:
 *   end = t_i + 2 d8 + lat + g (gemm 0) + 2 d8 + lat + g;
 * with 3 stages they queue at t_i behind step 1's, and step 2's data arrive last:
 *   end = t_i + 6 d8 + lat + g.
 */
static void test_gemm_streamed_stages(void **state)
{
    (void)state;
    for (int st = 0; st <= 3; st++) {
        kb_ctx *ctx = make_ctx_with(KB_DEV_REF, "pe.scheduler.tile_k=1");
        const kb_topo_cfg *c = topo(ctx);
        gemm_io io;
        memset(&io, 0, sizeof io);
        io.streamed = 1;
        io.stages = st == 1 ? 99 : st; /* 0: the default (2); 99 clamps to the most */
        assert_int_equal(kb_ctx_run_host(ctx, h_gemm, &io), 0);
        check_gemm_values(&io);
        int64_t lat = kbt_ps(c->hbm.latency_ns) + kbt_ps(c->noc.latency_ns) +
                      kbt_ps(c->tcm.latency_ns);
        int64_t d8 = kbt_ps(c->dma_setup_ns) + kbt_xfer_ps(8, c->dma_bandwidth_gbps);
        int64_t g = kbt_ps(c->gemm_fixed_ns) + kbt_xfer_ps(8, c->gemm_flops_per_ns);
        int64_t ti = kbt_ps(c->pe_cpu_overhead_ns);
        if (st == 0 || st == 2) {
            assert_int_equal(io.p.dt[1], 2);
            assert_int_equal(io.p.dt[0], ti + 4 * d8 + 2 * lat + 2 * g);
            assert_int_equal(io.p.dt[0], 328256);
        } else {
            assert_int_equal(io.p.dt[1], st == 1 ? KB_TL_MAX_STAGES : 3);
            assert_int_equal(io.p.dt[0], ti + 6 * d8 + lat + g);
            assert_int_equal(io.p.dt[0], 245380);
        }
        kb_ctx_destroy(ctx);
    }
}

/* ---- strided values: tl_load2d / tl_ref2d / tl_store2d / tl_load_into / tl_view / tl_copy ---- */

#define SM_R 6
#define SM_C 10 /* the source matrix m: 6 x 10 f32, m[i][j] = 10 i + j */

/* the source m and the outputs o1..o5 (strided_io) */
typedef struct strided_args {
    kb_va m, o1, o2, o3, o4, o5;
} strided_args;

static void k_strided(kb_tl *tl, const kb_kargs *ka)
{
    probe *p = probe_of(ka);
    const strided_args *a = KB_KARGS_GET(ka, strided_args);
    kb_va m = a->m;
    kb_time t0 = kbt_tl_now(tl);
    kb_val blk = tl_load2d(tl, m + (1 * SM_C + 2) * 4, KB_SHAPE2(4, 5), SM_C, KB_F32);
    kb_time t1 = kbt_tl_now(tl);
    kb_val flat = tl_load(tl, m, KB_SHAPE2(1, 20), KB_F32); /* the same 80 bytes, contiguous */
    kb_time t2 = kbt_tl_now(tl);
    p->dt[0] = t1 - t0;
    p->dt[1] = t2 - t1;
    tl_store(tl, a->o1, blk);
    /* into the f16 tensor o2: rows 0-1 contiguously, then the block at rows 2-5, cols 3-7 */
    t0 = kbt_tl_now(tl);
    tl_store(tl, a->o2, flat);
    t1 = kbt_tl_now(tl);
    tl_store2d(tl, a->o2 + (2 * SM_C + 3) * 2, SM_C, blk);
    t2 = kbt_tl_now(tl);
    p->dt[2] = t1 - t0;
    p->dt[3] = t2 - t1;
    /* views of a 4 x 6 value, written through tl_load_into and tl_copy */
    kb_val x = tl_full(tl, KB_SHAPE2(4, 6), -1.0f);
    t0 = kbt_tl_now(tl);
    kb_val v = tl_view(tl, x, 1, 2, 2, 3);  /* x[1..3) x [2..5) */
    kb_val vv = tl_view(tl, v, 1, 1, 1, 2); /* x[2][3..5) */
    p->dt[7] = kbt_tl_now(tl) - t0;
    t0 = kbt_tl_now(tl);
    tl_load_into(tl, v, m + 3 * SM_C * 4, SM_C); /* m[3..5) x [0..3) */
    t1 = kbt_tl_now(tl);
    (void)tl_load(tl, m, KB_SHAPE2(1, 6), KB_F32);
    t2 = kbt_tl_now(tl);
    p->dt[4] = t1 - t0;
    p->dt[5] = t2 - t1;
    kb_val six = tl_full(tl, KB_SHAPE2(1, 2), 6.0f);
    t0 = kbt_tl_now(tl);
    tl_copy(tl, vv, six);
    p->dt[6] = kbt_tl_now(tl) - t0;
    tl_store(tl, a->o3, x);
    tl_store(tl, a->o5, tl_add(tl, v, v)); /* a view as a compute operand */
    /* a gemm of strided references: m[0..2) x [0..3) @ m[0..3) x [7..9) */
    kb_val ra = tl_ref2d(tl, m, KB_SHAPE2(2, 3), SM_C, KB_F32);
    kb_val rb = tl_ref2d(tl, m + 7 * 4, KB_SHAPE2(3, 2), SM_C, KB_F32);
    tl_store(tl, a->o4, tl_dot(tl, ra, rb));
}

typedef struct strided_io {
    probe p;
    float m[SM_R * SM_C];
    float o1[20], o2[SM_R * SM_C], o3[24], o4[4], o5[6];
} strided_io;

static int h_strided(kb_ctx *ctx, void *arg)
{
    strided_io *io = arg;
    kb_tensor_desc dm = desc("m", SM_R, SM_C, KB_F32, on_pe0());
    kb_tensor_desc d1 = desc("o1", 4, 5, KB_F32, on_pe0());
    kb_tensor_desc d2 = desc("o2", SM_R, SM_C, KB_F16, on_pe0());
    kb_tensor_desc d3 = desc("o3", 4, 6, KB_F32, on_pe0());
    kb_tensor_desc d4 = desc("o4", 2, 2, KB_F32, on_pe0());
    kb_tensor_desc d5 = desc("o5", 2, 3, KB_F32, on_pe0());
    kb_tensor *tm, *t[5];
    kb_kargs a = kargs(&io->p);
    int rc;

    if ((rc = kb_tensor_from_host(ctx, &dm, io->m, &tm)) != 0 ||
        (rc = kb_tensor_empty(ctx, &d1, &t[0])) != 0 ||
        (rc = kb_tensor_zeros(ctx, &d2, &t[1])) != 0 ||
        (rc = kb_tensor_empty(ctx, &d3, &t[2])) != 0 ||
        (rc = kb_tensor_empty(ctx, &d4, &t[3])) != 0 ||
        (rc = kb_tensor_empty(ctx, &d5, &t[4])) != 0)
        return rc;
    KB_KARGS_PUT(&a, (strided_args){ .m = kb_tensor_va(tm), .o1 = kb_tensor_va(t[0]),
                                     .o2 = kb_tensor_va(t[1]), .o3 = kb_tensor_va(t[2]),
                                     .o4 = kb_tensor_va(t[3]), .o5 = kb_tensor_va(t[4]) });
    if ((rc = kb_launch(ctx, "strided", k_strided, &a, &one_pe)) != 0 ||
        (rc = kb_tensor_read(t[0], io->o1)) != 0 || (rc = kb_tensor_read(t[1], io->o2)) != 0 ||
        (rc = kb_tensor_read(t[2], io->o3)) != 0 || (rc = kb_tensor_read(t[3], io->o4)) != 0 ||
        (rc = kb_tensor_read(t[4], io->o5)) != 0)
        return rc;
    return 0;
}

static float sm(int i, int j) { return (float)(SM_C * i + j); }

static void test_strided_values(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    strided_io *io = calloc(1, sizeof *io);

    (void)state;
    assert_non_null(io);
    for (int i = 0; i < SM_R; i++)
        for (int j = 0; j < SM_C; j++)
            io->m[i * SM_C + j] = sm(i, j);
    assert_int_equal(kb_ctx_run_host(ctx, h_strided, io), 0);
    /* tl_load2d: rows 1..4, columns 2..6 */
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            assert_true(io->o1[i * 5 + j] == sm(1 + i, 2 + j));
    /* o2 (f16): rows 0-1 = m's first 20 values; the block at rows 2..5, columns 3..7; 0 else */
    for (int i = 0; i < SM_R; i++)
        for (int j = 0; j < SM_C; j++) {
            float want = i < 2 ? sm(i, j)
                         : j >= 3 && j < 8 ? sm(1 + (i - 2), 2 + (j - 3)) : 0.0f;
            if (io->o2[i * SM_C + j] != want)
                fail_msg("o2[%d][%d] = %g, expected %g", i, j, (double)io->o2[i * SM_C + j],
                         (double)want);
        }
    /* x: -1 except its view x[1..3) x [2..5) = m[3..5) x [0..3), then x[2][3..5) = 6 */
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) {
            float want = -1.0f;
            if (i >= 1 && i < 3 && j >= 2 && j < 5)
                want = i == 2 && j >= 3 ? 6.0f : sm(3 + (i - 1), j - 2);
            if (io->o3[i * 6 + j] != want)
                fail_msg("x[%d][%d] = %g, expected %g", i, j, (double)io->o3[i * 6 + j],
                         (double)want);
        }
    /* v + v over the view */
    static const float k_vv[6] = { 60, 62, 64, 80, 12, 12 };
    for (int i = 0; i < 6; i++)
        assert_true(io->o5[i] == k_vv[i]);
    /* the strided gemm: sum_k m[i][k] * m[k][7 + j] */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            float want = 0.0f;
            for (int k = 0; k < 3; k++)
                want += sm(i, k) * sm(k, 7 + j);
            assert_true(io->o4[i * 2 + j] == want);
        }
    /* costs: a strided DMA costs what a contiguous one of the same bytes costs */
    assert_int_equal(io->p.dt[0], io->p.dt[1]);
    assert_int_equal(io->p.dt[2], io->p.dt[3]);
    assert_int_equal(io->p.dt[4], io->p.dt[5]);
    int64_t lat = kbt_ps(c->hbm.latency_ns) + kbt_ps(c->noc.latency_ns) + kbt_ps(c->tcm.latency_ns);
    assert_int_equal(io->p.dt[0], kbt_ps(c->pe_cpu_overhead_ns) + kbt_ps(c->dma_setup_ns) +
                                      kbt_xfer_ps(80, c->dma_bandwidth_gbps) + lat);
    /* tl_copy: one PE_MATH pass over its 2 elements; views cost nothing */
    assert_int_equal(io->p.dt[6], kbt_ps(c->pe_cpu_overhead_ns) + kbt_ps(c->math_fixed_ns) +
                                      kbt_xfer_ps(2, c->math_lanes_per_ns));
    assert_int_equal(io->p.dt[6], 2000 + 4000 + 32);
    assert_int_equal(io->p.dt[7], 0);
    kb_ctx_destroy(ctx);
    free(io);
}

/* Misuse of strided values: a view outside its value, a row stride below the width, a block
 * whose last row runs past its shard. */
typedef struct strided_err_args {
    kb_va m;
    int which; /* the misuse (test_strided_errors' cases) */
} strided_err_args;

static void k_strided_err(kb_tl *tl, const kb_kargs *ka)
{
    const strided_err_args *a = KB_KARGS_GET(ka, strided_err_args);
    switch (a->which) {
    case 0:
        (void)tl_view(tl, tl_full(tl, KB_SHAPE2(4, 6), 0.0f), 2, 1, 3, 2);
        break;
    case 1:
        (void)tl_load2d(tl, a->m, KB_SHAPE2(2, 5), 3, KB_F32);
        break;
    case 2:
        /* columns 9-10 of 6 rows: the last row's second element is past m's 240 bytes */
        (void)tl_load2d(tl, a->m + 9 * 4, KB_SHAPE2(SM_R, 2), SM_C, KB_F32);
        break;
    default:
        tl_store2d(tl, a->m, 4, tl_full(tl, KB_SHAPE2(2, 5), 0.0f));
        break;
    }
    probe_of(ka)->rc[0] = 1; /* never reached */
}

static int h_strided_err(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_tensor_desc dm = desc("m", SM_R, SM_C, KB_F32, on_pe0());
    kb_tensor *tm;
    kb_kargs a = kargs(p);
    int rc;
    if ((rc = kb_tensor_zeros(ctx, &dm, &tm)) != 0)
        return rc;
    KB_KARGS_PUT(&a, (strided_err_args){ .m = kb_tensor_va(tm), .which = p->rc[1] });
    return kb_launch(ctx, "strided_err", k_strided_err, &a, &one_pe);
}

static void test_strided_errors(void **state)
{
    static const struct {
        int rc;
        const char *msg;
    } cases[] = {
        { KB_ERR_RANGE, "tl_view: [2, 5) x [1, 3) is outside a 4 x 6 value" },
        { KB_ERR_INVAL, "tl_load2d: row stride 3 is below the block's 5 columns" },
        { KB_ERR_RANGE, "cross the end of a shard (204 bytes left in it)" },
        { KB_ERR_INVAL, "tl_store2d: row stride 4 is below the block's 5 columns" },
    };
    (void)state;
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        kb_ctx *ctx = make_ctx();
        probe p;
        memset(&p, 0, sizeof p);
        p.rc[1] = i;
        assert_int_equal(kb_ctx_run_host(ctx, h_strided_err, &p), cases[i].rc);
        assert_int_equal(p.rc[0], 0);
        if (!strstr(kb_ctx_errmsg(ctx), cases[i].msg))
            fail_msg("case %d: %s", i, kb_ctx_errmsg(ctx));
        kb_ctx_destroy(ctx);
    }
}


/* ---- tl_gemm: gemm of any size in output tiles ---- */

static void test_gemm_tiling(void **state)
{
    kb_gemm_tiling g;
    (void)state;
    /* fits the free scratch: one tile, what one tl_dot needs */
    assert_int_equal(kb_tl_gemm_tiling(256, 256, 8u << 20, 8u << 20, 128, 128, 1, &g), 0);
    assert_true(g.tm == 256 && g.tn == 256 && g.tiles_m == 1 && g.tiles_n == 1);
    /* 4096^2: tiles of half the scratch (4 MiB of f32 = 1024 x 1024) */
    assert_int_equal(kb_tl_gemm_tiling(4096, 4096, 8u << 20, 8u << 20, 128, 128, 1, &g), 0);
    assert_true(g.tm == 1024 && g.tn == 1024 && g.tiles_m == 4 && g.tiles_n == 4);
    /* less free than half: the free block bounds the tile */
    assert_int_equal(kb_tl_gemm_tiling(4096, 4096, 1u << 20, 8u << 20, 128, 128, 1, &g), 0);
    assert_true(g.tm == 512 && g.tn == 512);
    /* few rows: wide tiles */
    assert_int_equal(kb_tl_gemm_tiling(8, 1 << 20, 8u << 20, 8u << 20, 128, 128, 1, &g), 0);
    assert_true(g.tm == 8 && g.tn == 131072 && g.tiles_n == 8);
    /* several parts: halved (longer side first) until each part has a tile */
    assert_int_equal(kb_tl_gemm_tiling(1024, 1024, 0, 8u << 20, 128, 128, 8, &g), 0);
    assert_true(g.tm == 256 && g.tn == 512 && g.tiles_m == 4 && g.tiles_n == 2);
    /* ... but not below a scheduler tile: 64 tiles for 128 parts */
    assert_int_equal(kb_tl_gemm_tiling(1024, 1024, 0, 8u << 20, 128, 128, 128, &g), 0);
    assert_true(g.tm == 128 && g.tn == 128 && g.tiles_m * g.tiles_n == 64);
    /* no room at all */
    assert_int_equal(kb_tl_gemm_tiling(16, 16, 0, 8u << 20, 128, 128, 1, &g), -1);
}

#define TG_M 300
#define TG_N 200
#define TG_K 500
#define TG_LDA 512 /* A and C sit in wider tensors: row strides above their widths */
#define TG_LDC 256

static float tg_a(int i, int k) { return (float)((i * 7 + k * 3) % 9 - 4) * 0.25f; }
static float tg_b(int k, int j) { return (float)((k * 5 + j) % 7 - 3) * 0.5f; }

typedef struct tlgemm_args {
    kb_va a, b, c;
    int nparts;
} tlgemm_args;

static void k_tlgemm(kb_tl *tl, const kb_kargs *ka)
{
    probe *p = probe_of(ka);
    const tlgemm_args *g = KB_KARGS_GET(ka, tlgemm_args);
    int part = tl_program_id(tl, 0);
    kb_time t0 = kbt_tl_now(tl);
    tl_gemm(tl, &(kb_gemm_op){ .c = g->c, .ldc = TG_LDC, .a = g->a, .lda = TG_LDA, .b = g->b,
                               .ldb = TG_N, .m = TG_M, .n = TG_N, .k = TG_K, .da = KB_F16,
                               .db = KB_F16, .part = part, .nparts = g->nparts });
    if (part == 0)
        p->dt[0] = kbt_tl_now(tl) - t0;
}

typedef struct tlgemm_io {
    probe p;
    int nparts;
    kb_mem_kind mem;
    float a[TG_M * TG_LDA], b[TG_K * TG_N], c[TG_M * TG_LDC];
} tlgemm_io;

static int h_tlgemm(kb_ctx *ctx, void *arg)
{
    tlgemm_io *io = arg;
    kb_tensor_desc da = desc("a", TG_M, TG_LDA, KB_F16, on_pe0());
    kb_tensor_desc db = desc("b", TG_K, TG_N, KB_F16, on_pe0());
    kb_tensor_desc dc = desc("c", TG_M, TG_LDC, KB_F32, on_pe0());
    kb_tensor *ta, *tb, *tc;
    kb_kargs a = kargs(&io->p);
    kb_grid g = { io->nparts, 1, 1, -1 };
    int rc;

    da.mem = db.mem = dc.mem = io->mem;
    if ((rc = kb_tensor_from_host(ctx, &da, io->a, &ta)) != 0 ||
        (rc = kb_tensor_from_host(ctx, &db, io->b, &tb)) != 0 ||
        (rc = kb_tensor_from_host(ctx, &dc, io->c, &tc)) != 0)
        return rc;
    KB_KARGS_PUT(&a, (tlgemm_args){ .a = kb_tensor_va(ta), .b = kb_tensor_va(tb),
                                    .c = kb_tensor_va(tc), .nparts = io->nparts });
    if ((rc = kb_launch(ctx, "tlgemm", k_tlgemm, &a, &g)) != 0)
        return rc;
    return kb_tensor_read(tc, io->c);
}

/* 300 x 500 @ 500 x 200 with 128 KiB of scratch per PE: 6 tiles of at most 128 x 128. */
static tlgemm_io *run_tlgemm(int nparts, kb_mem_kind mem)
{
    kb_ctx *ctx = make_ctx_with(KB_DEV_REF, "pe.scratch.size_bytes=131072");
    tlgemm_io *io = calloc(1, sizeof *io);

    assert_non_null(io);
    io->nparts = nparts;
    io->mem = mem;
    for (int i = 0; i < TG_M; i++)
        for (int k = 0; k < TG_LDA; k++)
            io->a[i * TG_LDA + k] = k < TG_K ? tg_a(i, k) : 99.0f;
    for (int k = 0; k < TG_K; k++)
        for (int j = 0; j < TG_N; j++)
            io->b[k * TG_N + j] = tg_b(k, j);
    for (int i = 0; i < TG_M * TG_LDC; i++)
        io->c[i] = -7.0f;
    assert_int_equal(kb_ctx_run_host(ctx, h_tlgemm, io), 0);
    /* every element exact (multiples of 1/8 below 2^10: exact f32 sums), the rest of C kept */
    for (int i = 0; i < TG_M; i++)
        for (int j = 0; j < TG_LDC; j++) {
            double want = -7.0;
            if (j < TG_N) {
                want = 0.0;
                for (int k = 0; k < TG_K; k++)
                    want += (double)tg_a(i, k) * (double)tg_b(k, j);
            }
            if ((double)io->c[i * TG_LDC + j] != want)
                fail_msg("nparts %d: c[%d][%d] = %g, expected %g", nparts, i, j,
                         (double)io->c[i * TG_LDC + j], want);
        }
    kb_ctx_destroy(ctx);
    return io;
}

static void test_tl_gemm_odd_sizes(void **state)
{
    (void)state;
    tlgemm_io *one = run_tlgemm(1, KB_MEM_HBM), *three = run_tlgemm(3, KB_MEM_HBM);
    /* the same bits whoever computes which tile */
    assert_memory_equal(one->c, three->c, sizeof one->c);
    assert_true(three->p.dt[0] < one->p.dt[0]);
    free(one);
    free(three);
}

/*
 * Operands in the PE's own TCM: each tile's tl_dot is one PE_GEMM use (no streaming), its
 * store one DMA scratch -> TCM, so tl_gemm's time is the closed form
 *   sum over tiles of  issue + gemm.fixed + 2 mt nt K / flops  +  issue + dma.setup
 *                      + mt nt 4 B / dma.bandwidth + tcm.latency.
 */
static void test_tl_gemm_time_local(void **state)
{
    kb_ctx *ctx = make_ctx_with(KB_DEV_REF, "pe.scratch.size_bytes=131072");
    const kb_topo_cfg *c = topo(ctx);
    static const uint32_t mts[3] = { 128, 128, 44 }, nts[2] = { 128, 72 };
    int64_t want = 0;
    (void)state;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            uint64_t mn = (uint64_t)mts[i] * nts[j];
            want += kbt_ps(c->pe_cpu_overhead_ns) + kbt_ps(c->gemm_fixed_ns) +
                    kbt_xfer_ps(2 * mn * TG_K, c->gemm_flops_per_ns);
            want += kbt_ps(c->pe_cpu_overhead_ns) + kbt_ps(c->dma_setup_ns) +
                    kbt_xfer_ps(mn * 4, c->dma_bandwidth_gbps) + kbt_ps(c->tcm.latency_ns);
        }
    kb_ctx_destroy(ctx);
    tlgemm_io *io = run_tlgemm(1, KB_MEM_TCM);
    assert_int_equal(io->p.dt[0], want);
    assert_int_equal(io->p.dt[0], 16775438);
    free(io);
}

/* Alone on its links, a paced stream takes exactly tl_dot's time (8 steps from HBM). */
typedef struct paced_args {
    kb_va a, b;
} paced_args;

static void k_paced(kb_tl *tl, const kb_kargs *ka)
{
    probe *p = probe_of(ka);
    const paced_args *g = KB_KARGS_GET(ka, paced_args);
    kb_val va = tl_ref(tl, g->a, KB_SHAPE2(256, 256), KB_F16);
    kb_val vb = tl_ref(tl, g->b, KB_SHAPE2(256, 256), KB_F16);
    kb_time t0 = kbt_tl_now(tl);
    tl_free(tl, tl_dot(tl, va, vb));
    kb_time t1 = kbt_tl_now(tl);
    tl_free(tl, kb_tl_dot_paced(tl, va, vb));
    p->dt[0] = t1 - t0;
    p->dt[1] = kbt_tl_now(tl) - t1;
}

static int h_paced(kb_ctx *ctx, void *arg)
{
    kb_tensor_desc d = desc("x", 256, 256, KB_F16, on_pe0());
    kb_tensor *ta, *tb;
    kb_kargs a = kargs(arg);
    int rc;
    if ((rc = kb_tensor_zeros(ctx, &d, &ta)) != 0 || (rc = kb_tensor_zeros(ctx, &d, &tb)) != 0)
        return rc;
    KB_KARGS_PUT(&a, (paced_args){ .a = kb_tensor_va(ta), .b = kb_tensor_va(tb) });
    return kb_launch(ctx, "paced", k_paced, &a, &one_pe);
}

static void test_dot_paced_alone(void **state)
{
    kb_ctx *ctx = make_ctx();
    probe p;
    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_paced, &p), 0);
    assert_int_equal(p.dt[0], p.dt[1]);
    assert_true(p.dt[0] > 8 * kbt_xfer_ps(2u * 128 * 128 * 128, topo(ctx)->gemm_flops_per_ns));
    kb_ctx_destroy(ctx);
}

/* ---- scratch release ---- */

static void k_free_loop(kb_tl *tl, const kb_kargs *a)
{
    probe *p = probe_of(a);
    p->used[0] = kb_alloc_used(tl_pe(tl)->scratch);
    for (int i = 0; i < 64; i++) { /* 64 x 1 MiB through an 8 MiB scratch */
        kb_val v = tl_full(tl, KB_SHAPE2(1, 262144), (float)i);
        if (i == 0)
            p->used[1] = kb_alloc_used(tl_pe(tl)->scratch);
        tl_free(tl, v);
    }
    /* the last freed value stays allocated for reuse (the kernel's cache of large values) */
    p->used[2] = kb_alloc_used(tl_pe(tl)->scratch);
    /* ... and is given back when an allocation needs the room: the whole 8 MiB fits */
    kb_val all = tl_full(tl, KB_SHAPE2(1, 2097152), 0.0f);
    p->used[3] = kb_alloc_used(tl_pe(tl)->scratch);
    tl_free(tl, all);
}

static void k_hoard(kb_tl *tl, const kb_kargs *a)
{
    probe *p = probe_of(a);
    for (int i = 0; i < 64; i++) {
        tl_full(tl, KB_SHAPE2(1, 262144), (float)i);
        p->rc[0] = i + 1;
    }
}

static int h_launch_one(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_kargs a = kargs(p);
    return kb_launch(ctx, p->rc[3] ? "hoard" : "free_loop", p->rc[3] ? k_hoard : k_free_loop, &a,
                     &one_pe);
}

static void test_free_releases_scratch(void **state)
{
    kb_ctx *ctx = make_ctx();
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_launch_one, &p), 0);
    assert_int_equal(p.used[0], 0);
    assert_int_equal(p.used[1], UINT64_C(1) << 20);
    assert_int_equal(p.used[2], UINT64_C(1) << 20);
    assert_int_equal(p.used[3], UINT64_C(8) << 20);
    kb_ctx_destroy(ctx);

    /* without tl_free the same loop runs out after 8 values */
    ctx = make_ctx();
    memset(&p, 0, sizeof p);
    p.rc[3] = 1;
    assert_int_equal(kb_ctx_run_host(ctx, h_launch_one, &p), KB_ERR_NOSPACE);
    assert_int_equal(p.rc[0], 8);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "kernel hoard on sip0/cube0/pe0"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "tl_free"));
    kb_ctx_destroy(ctx);
}


/* Small values come from size classes: freed ones are reused, a double free is an error. */
static void k_small_values(kb_tl *tl, const kb_kargs *a)
{
    probe *p = probe_of(a);
    kb_val x = tl_full(tl, KB_SHAPE1(100), 1.0f), y = tl_full(tl, KB_SHAPE1(100), 2.0f);
    p->used[0] = x.pa != y.pa;                      /* two live values, two places */
    tl_free(tl, x);
    kb_val z = tl_full(tl, KB_SHAPE1(90), 3.0f);    /* same class (512 B): reuses x's place */
    p->used[1] = z.pa == x.pa;
    kb_val big = tl_full(tl, KB_SHAPE1(2048), 4.0f); /* 8 KiB: from the allocator directly */
    p->used[2] = big.pa != z.pa && big.pa != y.pa;
    tl_free(tl, big);
    tl_free(tl, y);
    p->rc[0] = 1;
    tl_free(tl, y);                                  /* again: misuse */
    p->rc[0] = 2;                                    /* never reached */
}

static int h_small_values(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_kargs a = kargs(p);
    return kb_launch(ctx, "small_values", k_small_values, &a, &one_pe);
}

static void test_small_values(void **state)
{
    kb_ctx *ctx = make_ctx();
    probe p;
    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_small_values, &p), KB_ERR_INVAL);
    assert_int_equal(p.used[0], 1);
    assert_int_equal(p.used[1], 1);
    assert_int_equal(p.used[2], 1);
    assert_int_equal(p.rc[0], 1);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "tl_free: value at"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "is not a live scratch value"));
    kb_ctx_destroy(ctx);
}

/* Free stacks are LIFO, also across the inline top of the small classes (3 entries). */
static void k_lifo(kb_tl *tl, const kb_kargs *a)
{
    probe *p = probe_of(a);
    kb_val v[6], w[6];
    for (int i = 0; i < 6; i++)
        v[i] = tl_full(tl, KB_SHAPE1(8), (float)i); /* 32 B: the 64-byte class */
    for (int i = 0; i < 6; i++)
        tl_free(tl, v[i]);
    for (int i = 0; i < 6; i++)
        w[i] = tl_full(tl, KB_SHAPE1(8), 0.0f);
    int lifo = 1;
    for (int i = 0; i < 6; i++)
        lifo &= w[i].pa == v[5 - i].pa;
    p->used[0] = lifo;
    tl_free(tl, w[0]);
    p->rc[0] = 1;
    tl_free(tl, w[0]); /* a double free of a value on the inline top */
    p->rc[0] = 2;
}

static int h_lifo(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_kargs a = kargs(p);
    return kb_launch(ctx, "lifo", k_lifo, &a, &one_pe);
}

static void test_small_values_lifo(void **state)
{
    kb_ctx *ctx = make_ctx();
    probe p;
    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_lifo, &p), KB_ERR_INVAL);
    assert_int_equal(p.used[0], 1);
    assert_int_equal(p.rc[0], 1);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "is not a live scratch value"));
    kb_ctx_destroy(ctx);
}

/* ---- kernel errors ---- */

static void k_badload(kb_tl *tl, const kb_kargs *a)
{
    tl_load(tl, (kb_va)0x1000, KB_SHAPE2(1, 4), KB_F32);
    probe_of(a)->rc[0] = 1; /* never reached */
}

static int h_badload(kb_ctx *ctx, void *arg)
{
    kb_kargs a = kargs(arg);
    return kb_launch(ctx, "badload", k_badload, &a, &one_pe);
}

static void test_err_unmapped(void **state)
{
    kb_ctx *ctx = make_ctx();
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_badload, &p), KB_ERR_NOTFOUND);
    assert_int_equal(p.rc[0], 0);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "kernel badload on sip0/cube0/pe0"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "tl_load"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "unmapped virtual address 0x1000"));
    kb_ctx_destroy(ctx);
}

static void k_cross(kb_tl *tl, const kb_kargs *ka)
{
    /* shard 0 holds row 0 only */
    tl_load(tl, KB_KARGS_GET(ka, one_args)->t, KB_SHAPE2(2, 8), KB_F32);
}

static int h_cross(kb_ctx *ctx, void *arg)
{
    kb_tensor_desc d = desc("halves", 2, 8, KB_F32, kb_dp(KB_DP_REPLICATE, KB_DP_ROW_WISE, 1, 2));
    kb_tensor *t;
    kb_kargs a = kargs(arg);
    int rc = kb_tensor_zeros(ctx, &d, &t);
    if (rc)
        return rc;
    KB_KARGS_PUT(&a, (one_args){ .t = kb_tensor_va(t) });
    return kb_launch(ctx, "cross", k_cross, &a, &one_pe);
}

static void test_err_cross_shard(void **state)
{
    kb_ctx *ctx = make_ctx();

    (void)state;
    assert_int_equal(kb_ctx_run_host(ctx, h_cross, NULL), KB_ERR_RANGE);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "kernel cross on sip0/cube0/pe0"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "64 bytes"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "cross the end of a shard (32 bytes left"));
    kb_ctx_destroy(ctx);
}

/* ---- placement errors ---- */

static int h_too_big(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_machine *m = kb_ctx_machine(ctx);
    /* 114688 x 32768 f16 = 7 * 2^29 elements = 7 GiB on cube 0 / PE 0 (a 6 GiB slice) */
    kb_tensor_desc d = desc("huge", 114688, 32768, KB_F16, on_pe0());
    kb_tensor_desc ok = desc("fits", 1024, 1024, KB_F16, on_pe0());
    kb_tensor *t = (kb_tensor *)(void *)p, *t2 = NULL; /* t: any non-NULL sentinel */

    p->rc[0] = kb_tensor_empty(ctx, &d, &t);
    p->rc[1] = t == NULL;
    p->used[0] = kb_alloc_used(kb_machine_pe(m, 0, 0, 0)->hbm);
    p->used[1] = kb_alloc_used(m->sips[0].va);
    p->used[2] = kb_mmu_nsegments(m->sips[0].mmu);
    p->rc[2] = kb_tensor_empty(ctx, &ok, &t2); /* the context is still usable */
    p->used[3] = kb_alloc_used(kb_machine_pe(m, 0, 0, 0)->hbm);
    return 0;
}

static void test_err_too_big(void **state)
{
    kb_ctx *ctx = make_ctx();
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_machine_pe(kb_ctx_machine(ctx), 0, 0, 0)->hbm != NULL, 1);
    assert_int_equal(kb_alloc_size(kb_machine_pe(kb_ctx_machine(ctx), 0, 0, 0)->hbm),
                     UINT64_C(6) << 30);
    assert_int_equal(kb_ctx_run_host(ctx, h_too_big, &p), 0);
    assert_int_equal(p.rc[0], KB_ERR_NOSPACE);
    assert_int_equal(p.rc[1], 1);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "huge"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "7.00 GiB"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "6.00 GiB"));
    assert_int_equal(p.used[0], 0); /* nothing half-allocated */
    assert_int_equal(p.used[1], 0);
    assert_int_equal(p.used[2], 0);
    assert_int_equal(p.rc[2], 0);
    assert_int_equal(p.used[3], 2 << 20);
    kb_ctx_destroy(ctx);
}

/* ---- 2-D scatter / gather and host transfer times ---- */

typedef struct sg_io {
    probe p;
    float in[60], out[60];
    uint16_t in16[60];
    float out16[60];
    float shard7[6];
    size_t nshards;
    kb_shard_spec s7;
    int read_rc;
} sg_io;

static int h_scatter_gather(kb_ctx *ctx, void *arg)
{
    sg_io *io = arg;
    kb_dp_policy dp = kb_dp(KB_DP_ROW_WISE, KB_DP_COLUMN_WISE, 0, 0);
    kb_tensor_desc d = desc("grid", 6, 10, KB_F32, dp), d16 = desc("grid16", 6, 10, KB_F16, dp);
    kb_tensor *t, *t16;
    int rc;

    io->p.t0 = kbt_ctx_now(ctx);
    if ((rc = kb_tensor_from_host(ctx, &d, io->in, &t)) != 0)
        return rc;
    io->p.t1 = kbt_ctx_now(ctx);
    io->nshards = kb_tensor_nshards(t);
    io->s7 = *kb_tensor_shard(t, 7);
    io->read_rc = kb_tensor_read(t, io->out);
    if (io->read_rc != 0)
        return 0; /* device none: nothing more to check */
    if ((rc = kb_tensor_read_shard_raw(t, 7, io->shard7)) != 0 ||
        (rc = kb_tensor_from_host(ctx, &d16, io->in, &t16)) != 0 ||
        (rc = kb_tensor_read(t16, io->out16)) != 0)
        return rc;
    return 0;
}

static void test_scatter_gather_2d(void **state)
{
    kb_ctx *ctx = make_ctx();
    sg_io *io = calloc(1, sizeof *io);

    (void)state;
    assert_non_null(io);
    for (int i = 0; i < 60; i++)
        io->in[i] = 0.5f * (float)i - 7.0f; /* exact in f16 too */
    assert_int_equal(kb_ctx_run_host(ctx, h_scatter_gather, io), 0);
    assert_int_equal(io->read_rc, 0);
    assert_int_equal(io->nshards, 8);
    /* cube 1 holds rows 3..5; its PE 3 the last 2 of the 10 columns (3, 3, 2, 2) */
    assert_int_equal(io->s7.cube, 1);
    assert_int_equal(io->s7.pe, 3);
    assert_int_equal(io->s7.row0, 3);
    assert_int_equal(io->s7.rows, 3);
    assert_int_equal(io->s7.col0, 8);
    assert_int_equal(io->s7.cols, 2);
    for (int i = 0; i < 60; i++) {
        assert_true(io->out[i] == io->in[i]);
        assert_true(io->out16[i] == io->in[i]);
    }
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 2; j++)
            assert_true(io->shard7[r * 2 + j] == io->in[(3 + r) * 10 + 8 + j]);
    assert_true(io->p.t1 - io->p.t0 > 0);
    kb_ctx_destroy(ctx);
    free(io);
}

static void test_device_none(void **state)
{
    kb_ctx *ctx = make_ctx_with(KB_DEV_NONE, NULL);
    kb_ctx *ref = make_ctx();
    sg_io *io = calloc(1, sizeof *io), *io_ref = calloc(1, sizeof *io_ref);

    (void)state;
    assert_non_null(io);
    assert_non_null(io_ref);
    assert_int_equal(kb_ctx_recording(ctx), 0);
    assert_int_equal(kb_ctx_run_host(ctx, h_scatter_gather, io), 0);
    assert_int_equal(io->read_rc, KB_ERR_UNSUPPORTED);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "none"));
    assert_int_equal(kb_oplog_count(kb_ctx_oplog(ctx)), 0);
    /* the same host write costs the same simulated time with and without data */
    assert_int_equal(kb_ctx_run_host(ref, h_scatter_gather, io_ref), 0);
    assert_int_equal(io->p.t1 - io->p.t0, io_ref->p.t1 - io_ref->p.t0);
    kb_ctx_destroy(ref);
    kb_ctx_destroy(ctx);
    free(io);
    free(io_ref);
}

/* ---- host writes from fills ---- */

#define WIDE 70000 /* > the 65 536 values a generator is asked for at once */

typedef struct fill_io {
    int64_t calls, values, max_piece; /* what the generator was asked for */
    kb_time dt[3];                    /* durations: fill, array, copy_from_fill */
    int bad_rc, read_rc;
    float a[60], b[60], a2[60];
    float *wide, *square;             /* 3 x WIDE, 300 x 300 */
} fill_io;

/* Source element (r, c): multiples of 1/4 below 256, exact in f16. */
static float src_val(int64_t r, int64_t c)
{
    return (float)((r * 7 + c * 3) % 2048 - 1024) / 4.0f;
}

static void gen_fill(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols, float *out)
{
    fill_io *io = ud;
    io->calls++;
    io->values += rows * cols;
    if (rows * cols > io->max_piece)
        io->max_piece = rows * cols;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            out[i * cols + j] = src_val(row + i, col + j);
}

static int h_fill(kb_ctx *ctx, void *arg)
{
    fill_io *io = arg;
    kb_dp_policy grid = kb_dp(KB_DP_ROW_WISE, KB_DP_COLUMN_WISE, 0, 0);
    kb_dp_policy everywhere = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 0, 0);
    kb_tensor_desc d = desc("a", 6, 10, KB_F32, grid), dw = desc("wide", 3, WIDE, KB_F16, everywhere),
                   ds = desc("square", 300, 300, KB_F16, on_pe0());
    kb_fill gen = { gen_fill, io, NULL, 0, 0, 0, NULL },
            none = { NULL, NULL, NULL, 0, 0, 0, NULL };
    kb_fill at = kb_fill_at(gen, 2, 5); /* element (r, c) is source (2 + r, 5 + c) */
    float arr[6 * 10];
    kb_tensor *a, *b, *w, *sq, *bad = NULL;
    kb_time t;
    int rc;

    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 10; c++)
            arr[r * 10 + c] = src_val(2 + r, 5 + c);
    t = kbt_ctx_now(ctx);
    if ((rc = kb_tensor_from_fill(ctx, &d, &at, &a)) != 0)
        return rc;
    io->dt[0] = kbt_ctx_now(ctx) - t;
    t = kbt_ctx_now(ctx);
    if ((rc = kb_tensor_from_host(ctx, &d, arr, &b)) != 0)
        return rc;
    io->dt[1] = kbt_ctx_now(ctx) - t;
    if ((rc = kb_tensor_from_fill(ctx, &dw, &gen, &w)) != 0 ||
        (rc = kb_tensor_from_fill(ctx, &ds, &gen, &sq)) != 0)
        return rc;
    io->bad_rc = kb_tensor_from_fill(ctx, &d, &none, &bad);
    if (bad)
        return KB_ERR_STATE;
    if (!kb_ctx_recording(ctx)) {
        t = kbt_ctx_now(ctx);
        rc = kb_tensor_copy_from_fill(a, &gen);
        io->dt[2] = kbt_ctx_now(ctx) - t;
        return rc;
    }
    if ((io->read_rc = kb_tensor_read(a, io->a)) != 0 || (rc = kb_tensor_read(b, io->b)) != 0 ||
        (rc = kb_tensor_read(w, io->wide)) != 0 || (rc = kb_tensor_read(sq, io->square)) != 0)
        return io->read_rc ? io->read_rc : rc;
    t = kbt_ctx_now(ctx);
    if ((rc = kb_tensor_copy_from_fill(a, &gen)) != 0)
        return rc;
    io->dt[2] = kbt_ctx_now(ctx) - t;
    return kb_tensor_read(a, io->a2);
}

/*
 * A fill (generator or array, moved into its source by kb_fill_at) writes what the equivalent
 * array writes, in the same simulated time; the generator is asked for each distinct block
 * once (replicas share it), in pieces of at most 65 536 values, rows or parts of a row; a
 * fill with no values is refused. Without recording the generator is never called and the
 * context keeps nothing: no record, no payload, no memory-store page.
 */
static void test_fill_sources(void **state)
{
    kb_ctx *ctx = make_ctx(), *none = make_ctx_with(KB_DEV_NONE, NULL);
    fill_io *io = calloc(1, sizeof *io), *ion = calloc(1, sizeof *ion);
    (void)state;
    assert_non_null(io);
    assert_non_null(ion);
    io->wide = malloc(sizeof(float) * 3 * WIDE);
    io->square = malloc(sizeof(float) * 300 * 300);
    assert_non_null(io->wide);
    assert_non_null(io->square);
    assert_int_equal(kb_ctx_run_host(ctx, h_fill, io), 0);
    assert_int_equal(io->read_rc, 0);
    assert_int_equal(io->bad_rc, KB_ERR_INVAL);
    assert_memory_equal(io->a, io->b, sizeof io->a);
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 10; c++) {
            assert_true(io->a[r * 10 + c] == src_val(2 + r, 5 + c));
            assert_true(io->a2[r * 10 + c] == src_val(r, c));
        }
    for (int64_t r = 0; r < 3; r++)
        for (int64_t c = 0; c < WIDE; c += 997)
            assert_true(io->wide[r * WIDE + c] == src_val(r, c));
    assert_true(io->wide[3 * WIDE - 1] == src_val(2, WIDE - 1));
    for (int64_t k = 0; k < 300 * 300; k++)
        assert_true(io->square[k] == src_val(k / 300, k % 300));
    /* a's 8 blocks twice (60 values each time), wide's one block once for 8 replicas (in
     * rows split in two pieces), square's in two pieces of whole rows */
    assert_int_equal(io->values, 60 + 3 * WIDE + 300 * 300 + 60);
    assert_int_equal(io->calls, 8 + 3 * 2 + 2 + 8);
    assert_int_equal(io->max_piece, 65536); /* wide: 65 536 + 4 464 values a row */
    assert_int_equal(io->dt[0], io->dt[1]);

    assert_int_equal(kb_ctx_run_host(none, h_fill, ion), 0);
    assert_int_equal(ion->calls, 0);
    assert_int_equal(ion->bad_rc, KB_ERR_INVAL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ion->dt[i], io->dt[i]);
    assert_int_equal(kb_oplog_count(kb_ctx_oplog(none)), 0);
    assert_int_equal(kb_oplog_payload_size(kb_ctx_oplog(none)), 0);
    assert_int_equal(kb_memstore_pages(kb_ctx_memstore(none)), 0);
    assert_true(kb_oplog_payload_size(kb_ctx_oplog(ctx)) > 0);
    kb_ctx_destroy(ctx);
    kb_ctx_destroy(none);
    free(io->wide);
    free(io->square);
    free(io);
    free(ion);
}

/* ---- a generated pattern (kb_fill_gen, KB_FILL_GEN_PATTERN) ---- */

typedef struct pat_io {
    kb_fill_gen g;
    int64_t calls;
    int bad_rc;
    float plain[6 * 10], tr[10 * 6];
} pat_io;

/* The host's copy of the pattern (readers of a fill use fn): den 16, term 0.5. */
static float pat_val(const kb_fill_gen *g, int64_t r, int64_t c)
{
    uint64_t p = g->transpose ? (uint64_t)(c * g->ld + r) : (uint64_t)(r * g->ld + c);
    return (float)kb_seedgen_pattern(p, g->seed, g->range) / g->den + g->add;
}

static void pat_fill(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols, float *out)
{
    pat_io *io = ud;
    io->calls++;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            out[i * cols + j] = pat_val(&io->g, row + i, col + j);
}

static int h_pattern(kb_ctx *ctx, void *arg)
{
    pat_io *io = arg;
    kb_dp_policy grid = kb_dp(KB_DP_ROW_WISE, KB_DP_COLUMN_WISE, 0, 0);
    kb_tensor_desc d = desc("p", 6, 10, KB_F16, grid), dt = desc("pt", 10, 6, KB_F32, grid);
    kb_fill f = { pat_fill, io, NULL, 0, 0, 0, &io->g };
    kb_fill at = kb_fill_at(f, 3, 7); /* element (r, c) is source (3 + r, 7 + c) */
    kb_tensor *a, *b, *bad = NULL;
    int rc;

    if ((rc = kb_tensor_from_fill(ctx, &d, &at, &a)) != 0 || (rc = kb_tensor_read(a, io->plain)) != 0)
        return rc;
    io->g.transpose = 1;
    if ((rc = kb_tensor_from_fill(ctx, &dt, &at, &b)) != 0 || (rc = kb_tensor_read(b, io->tr)) != 0)
        return rc;
    io->g.den = 3.0f; /* not a power of two: refused before anything is written */
    io->bad_rc = kb_tensor_from_fill(ctx, &d, &f, &bad);
    return bad ? KB_ERR_STATE : 0;
}

/*
 * A recording host write from a generated pattern records one GEN record per shard and no
 * payload, never asks the host generator, and replays to the pattern's values at the fill's
 * offset, plain and transposed; a den that is no power of two is refused with its value.
 */
static void test_fill_pattern_gen(void **state)
{
    kb_ctx *ctx = make_ctx();
    pat_io *io = calloc(1, sizeof *io);
    (void)state;
    assert_non_null(io);
    io->g = (kb_fill_gen){ .seed = 22, .kind = KB_FILL_GEN_PATTERN, .range = 40, .den = 16.0f,
                           .add = 0.5f, .ld = 50 };
    assert_int_equal(kb_ctx_run_host(ctx, h_pattern, io), 0);
    assert_int_equal(io->bad_rc, KB_ERR_INVAL);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "den 3"));
    assert_int_equal(io->calls, 0);
    assert_int_equal(kb_oplog_payload_size(kb_ctx_oplog(ctx)), 0);
    size_t gens = 0, n = kb_oplog_count(kb_ctx_oplog(ctx));
    for (size_t i = 0; i < n; i++) { /* every write a GEN, every other record a read */
        const kb_rec *r = kb_oplog_at(kb_ctx_oplog(ctx), i);
        gens += r->kind == KB_REC_GEN;
        assert_true(r->kind == KB_REC_GEN || r->dst.space == KB_SPACE_PAYLOAD ||
                    r->src[0].space != KB_SPACE_PAYLOAD);
    }
    assert_true(gens >= 16); /* one per shard: a 6 x 10 grid tensor has 8 blocks */
    kb_fill_gen g = io->g;
    g.den = 16.0f;
    g.transpose = 0; /* f16 holds these values exactly (steps of 1/16 below 3) */
    for (int64_t r = 0; r < 6; r++)
        for (int64_t c = 0; c < 10; c++)
            assert_true(io->plain[r * 10 + c] == pat_val(&g, 3 + r, 7 + c));
    g.transpose = 1;
    for (int64_t r = 0; r < 10; r++)
        for (int64_t c = 0; c < 6; c++)
            assert_true(io->tr[r * 6 + c] == pat_val(&g, 3 + r, 7 + c));
    kb_ctx_destroy(ctx);
    free(io);
}

static int h_host_times(kb_ctx *ctx, void *arg)
{
    probe *p = arg;
    kb_tensor_desc d = desc("small", 6, 10, KB_F32, on_pe0());
    kb_tensor *t;
    float buf[60] = { 0 };
    int rc;

    p->t0 = kbt_ctx_now(ctx);
    if ((rc = kb_tensor_from_host(ctx, &d, buf, &t)) != 0)
        return rc;
    p->t1 = kbt_ctx_now(ctx);
    if ((rc = kb_tensor_read(t, buf)) != 0)
        return rc;
    p->t2 = kbt_ctx_now(ctx);
    return 0;
}

/* 240 bytes to HBM of cube 0 / PE 0 and back: the PCIe EP's 100 ns is the largest occupancy. */
static void test_host_write_read_time(void **state)
{
    kb_ctx *ctx = make_ctx();
    const kb_topo_cfg *c = topo(ctx);
    probe p;

    (void)state;
    memset(&p, 0, sizeof p);
    assert_int_equal(kb_ctx_run_host(ctx, h_host_times, &p), 0);
    int64_t want = kbt_ps(c->host_overhead_ns) + kbt_ps(c->pcie.latency_ns) +
                   kbt_ps(c->noc.latency_ns) + kbt_ps(c->hbm.latency_ns) +
                   kbt_ps(c->pcie_ep_overhead_ns);
    assert_true(kbt_ps(c->pcie_ep_overhead_ns) > kbt_xfer_ps(240, c->pcie.bandwidth_gbps));
    assert_int_equal(p.t1 - p.t0, want);
    assert_int_equal(p.t1 - p.t0, 2205000);
    assert_int_equal(p.t2 - p.t1, want);
    kb_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_program_ids),
        cmocka_unit_test(test_launch_round_trip),
        cmocka_unit_test(test_launch_queue),
        cmocka_unit_test(test_completion_tree),
        cmocka_unit_test(test_load_add_store),
        cmocka_unit_test(test_add_duration),
        cmocka_unit_test(test_store_posted),
        cmocka_unit_test(test_notify_barrier),
        cmocka_unit_test(test_notify_errors),
        cmocka_unit_test(test_softmax_sum_max),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_gemm_local),
        cmocka_unit_test(test_gemm_streamed_one_step),
        cmocka_unit_test(test_gemm_streamed_two_steps),
        cmocka_unit_test(test_gemm_streamed_stages),
        cmocka_unit_test(test_strided_values),
        cmocka_unit_test(test_strided_errors),
        cmocka_unit_test(test_gemm_tiling),
        cmocka_unit_test(test_tl_gemm_odd_sizes),
        cmocka_unit_test(test_tl_gemm_time_local),
        cmocka_unit_test(test_dot_paced_alone),
        cmocka_unit_test(test_free_releases_scratch),
        cmocka_unit_test(test_small_values_lifo),
        cmocka_unit_test(test_small_values),
        cmocka_unit_test(test_err_unmapped),
        cmocka_unit_test(test_err_cross_shard),
        cmocka_unit_test(test_err_too_big),
        cmocka_unit_test(test_scatter_gather_2d),
        cmocka_unit_test(test_device_none),
        cmocka_unit_test(test_fill_sources),
        cmocka_unit_test(test_fill_pattern_gen),
        cmocka_unit_test(test_host_write_read_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
