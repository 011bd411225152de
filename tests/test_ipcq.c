/*
 * test_ipcq — the PE_IPCQ protocol on a small machine (1 SIP, 1 cube of 4 PEs) with the
 * reference backend: direction matching by destination address in a 2-rank ring (data and
 * credits), credit backpressure with one and three slots (ordering taken from the op log),
 * rx ring placement for every buffer_kind, install errors and their rollback, kernel misuse
 * (unwired direction, oversized values), asynchronous receives, the deadlock report, peer
 * directions (KB_DIR_PEER(k): pairing, names, errors, the ring-area check), and the
 * ring all-reduces with one slot through kb_ccl_job for every buffer_kind. Kernels learn their
 * tensors from kb_kargs' typed block and report times through a fixture whose address
 * travels in kb_kargs.i[FX_ARG]. Limits: one cube only; routes across cubes and SIPs are
 * exercised by the collectives in test_ccl.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_ccl.h"
#include "kb_ipcq.h"
#include "kb_runtime.h"
#include "kb_tl.h"
#include "kb_test_util.h"

#define NPES 4
#define NSLOT 4      /* value slots per PE in the in/out tensors */
#define N 16         /* f32 elements per value: 64 bytes */
#define CH_N (2 * N + 5) /* 37 f32 elements: two full 64-byte slots and a 20-byte chunk */
#define FX_ARG 7
#define MAX_LINKS 16

typedef struct link_spec {
    int pe;
    kb_dir dir;
    int peer;
    kb_dir peer_dir;
} link_spec;

typedef struct fx {
    /* set by the test */
    kb_ipcq_cfg icfg;
    link_spec links[MAX_LINKS];
    size_t nlinks;
    kb_kernel_fn kernel;
    int grid_pes;
    /* filled by the host program and the kernels */
    kb_tensor *in, *out;
    kb_time t_call[NSLOT], t_sent[NSLOT], t_recv[NSLOT];
    int twice; /* test_recv_view: release the view twice */
} fx;

static fx *fx_of(const kb_kargs *a) { return (fx *)(intptr_t)a->i[FX_ARG]; }

/* The input value of element i of slot `slot` of PE `pe` (exact in f32 and distinct). */
static float in_val(int pe, int slot, int i)
{
    return (float)((pe * NSLOT + slot) * N + i) * 0.5f + 1.0f;
}

/* The kernels' tensors (h_run): NSLOT values per PE, column-wise split over the PEs. */
typedef struct ipcq_args {
    kb_va in, out;
} ipcq_args;

/* VA of slot `slot` of PE `pe` in the tensor at base. */
static kb_va slot_va(kb_va base, int pe, int slot)
{
    return base + (kb_va)((pe * NSLOT + slot) * N) * 4u;
}

static kb_va in_at(const kb_kargs *a, int pe, int slot)
{
    return slot_va(KB_KARGS_GET(a, ipcq_args)->in, pe, slot);
}

static kb_va out_at(const kb_kargs *a, int pe, int slot)
{
    return slot_va(KB_KARGS_GET(a, ipcq_args)->out, pe, slot);
}

/* legacy: the model before issue #29 (cube.noc.topology=bus, one DMA channel) */
static kb_ctx *make_ctx_model(FILE *trace, int legacy)
{
    static const char *const sets[] = {
        "system.sips.count=1", "sip.cube_mesh.width=1", "sip.cube_mesh.height=1",
        "cube.corners=1", "cube.pe_per_corner=4", "cube.hbm.size_bytes=4294967296",
        "cube.noc.topology=bus", "pe.dma.channels=1",
    };
    kb_ctx_opts opts = { .device = KB_DEV_REF, .trace = trace };
    kb_ctx *ctx = kbt_ctx_new(sets, sizeof sets / sizeof sets[0] - (legacy ? 0 : 2), &opts);

    assert_int_equal(kb_ctx_machine(ctx)->npes, NPES);
    assert_int_equal(kb_ctx_machine(ctx)->ncubes, 1);
    return ctx;
}

static kb_ctx *make_ctx_trace(FILE *trace) { return make_ctx_model(trace, 0); }
static kb_ctx *make_ctx(void) { return make_ctx_trace(NULL); }

static kb_pe_hw *pe_at(kb_ctx *ctx, int pe)
{
    return kb_machine_pe(kb_ctx_machine(ctx), 0, 0, (unsigned)pe);
}

static void fx_init(fx *f, int n_slots, kb_mem_kind kind, kb_kernel_fn kernel, int grid_pes)
{
    memset(f, 0, sizeof *f);
    f->icfg.n_slots = n_slots;
    f->icfg.slot_size = N * 4;
    f->icfg.buffer_kind = kind;
    f->icfg.backpressure = 1;
    f->kernel = kernel;
    f->grid_pes = grid_pes;
}

static void fx_link(fx *f, int pe, kb_dir d, int peer, kb_dir pd)
{
    assert_true(f->nlinks < MAX_LINKS);
    f->links[f->nlinks++] = (link_spec){ pe, d, peer, pd };
}

/* PEs a and b joined both ways: a's E and W lead to b (a 2-rank ring). */
static void fx_ring2(fx *f, int a, int b)
{
    fx_link(f, a, KB_DIR_E, b, KB_DIR_W);
    fx_link(f, a, KB_DIR_W, b, KB_DIR_E);
    fx_link(f, b, KB_DIR_W, a, KB_DIR_E);
    fx_link(f, b, KB_DIR_E, a, KB_DIR_W);
}

static int install_specs(kb_ctx *ctx, const kb_ipcq_cfg *cfg, const link_spec *ls, size_t n)
{
    kb_ipcq_link links[MAX_LINKS];
    if (n > MAX_LINKS) /* no cmocka assertion here: this runs on a simulation fiber */
        return KB_ERR_RANGE;
    for (size_t i = 0; i < n; i++) {
        links[i].pe = pe_at(ctx, ls[i].pe);
        links[i].dir = ls[i].dir;
        links[i].peer = pe_at(ctx, ls[i].peer);
        links[i].peer_dir = ls[i].peer_dir;
    }
    return kb_ipcq_install(ctx, cfg, links, n);
}

/* Host program: in/out tensors, the fixture's install, one launch of its kernel. */
static int h_run(kb_ctx *ctx, void *arg)
{
    fx *f = arg;
    float *data = malloc(sizeof(float) * NPES * NSLOT * N);
    kb_tensor_desc d = { "in", 1, NPES * NSLOT * N, KB_F32,
                         kb_dp(KB_DP_REPLICATE, KB_DP_COLUMN_WISE, 1, NPES), KB_MEM_HBM };
    kb_grid g = { f->grid_pes, 1, 1, -1 };
    kb_kargs a;
    int rc;

    if (!data)
        return KB_ERR_NOMEM;
    for (int pe = 0; pe < NPES; pe++)
        for (int s = 0; s < NSLOT; s++)
            for (int i = 0; i < N; i++)
                data[(pe * NSLOT + s) * N + i] = in_val(pe, s, i);
    rc = kb_tensor_from_host(ctx, &d, data, &f->in);
    free(data);
    if (rc)
        return rc;
    d.name = "out";
    if ((rc = kb_tensor_zeros(ctx, &d, &f->out)) != 0)
        return rc;
    if ((rc = install_specs(ctx, &f->icfg, f->links, f->nlinks)) != 0)
        return rc;
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, (ipcq_args){ .in = kb_tensor_va(f->in), .out = kb_tensor_va(f->out) });
    a.i[FX_ARG] = (int64_t)(intptr_t)f;
    return kb_launch(ctx, "ipcq_test", f->kernel, &a, &g);
}

static float *read_out(fx *f)
{
    float *out = malloc(sizeof(float) * NPES * NSLOT * N);
    assert_non_null(out);
    assert_int_equal(kb_tensor_read(f->out, out), 0);
    return out;
}

/* out slot (pe, slot) holds in slot (src_pe, src_slot) + add, element by element. */
static void check_slot(const float *out, int pe, int slot, int src_pe, int src_slot, float add)
{
    for (int i = 0; i < N; i++) {
        float got = out[(pe * NSLOT + slot) * N + i];
        float want = in_val(src_pe, src_slot, i) + add;
        if (got != want)
            fail_msg("out pe%d slot%d [%d] = %g, expected %g (pe%d slot%d + %g)", pe, slot, i,
                     (double)got, (double)want, src_pe, src_slot, (double)add);
    }
}

static kb_ipcq_counters counters(kb_ctx *ctx, int pe, kb_dir d)
{
    kb_ipcq_counters c;
    memset(&c, 0, sizeof c);
    assert_int_equal(kb_ipcq_counters_of(ctx, pe_at(ctx, pe), d, &c), 0);
    return c;
}

/* ---- directions ---- */

static void test_dir_names(void **state)
{
    (void)state;
    assert_string_equal(kb_dir_name(KB_DIR_E), "E");
    assert_string_equal(kb_dir_name(KB_DIR_GLOBAL_W), "global_W");
    assert_string_equal(kb_dir_name(KB_DIR_CHILD_RIGHT), "child_right");
    assert_string_equal(kb_dir_name(KB_NDIRS), "peer");
    assert_string_equal(kb_dir_name((kb_dir)KB_IPCQ_MAX_DIRS), "?");
    for (int d = 0; d < KB_NDIRS; d++)
        assert_int_equal(kb_dir_from_name(kb_dir_name((kb_dir)d)), d);
    assert_int_equal(kb_dir_from_name("NE"), -1);
    /* peer directions: "peer<k>" both ways, up to the last one */
    {
        char b[KB_DIR_LABEL_LEN];
        static const int ks[] = { 0, 1, 9, 12, 254, KB_IPCQ_MAX_PEER_DIRS - 1 };
        assert_string_equal(kb_dir_label(KB_DIR_PEER(12), b, sizeof b), "peer12");
        assert_string_equal(kb_dir_label(KB_DIR_CHILD_LEFT, b, sizeof b), "child_left");
        assert_string_equal(kb_dir_label(KB_DIR_PEER(KB_IPCQ_MAX_PEER_DIRS - 1), b, sizeof b),
                            "peer64999");
        for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
            assert_int_equal(kb_dir_from_name(kb_dir_label(KB_DIR_PEER(ks[i]), b, sizeof b)),
                             KB_DIR_PEER(ks[i]));
        assert_int_equal(kb_dir_from_name("peer"), -1);
        assert_int_equal(kb_dir_from_name("peer012"), -1);
        assert_int_equal(kb_dir_from_name("peer1x"), -1);
        assert_int_equal(kb_dir_from_name("peer65000"), -1);
        assert_int_equal(kb_dir_from_name("peer-1"), -1);
        assert_int_equal(kb_dir_opposite(KB_DIR_PEER(3)), -1);
    }
    assert_int_equal(kb_dir_opposite(KB_DIR_E), KB_DIR_W);
    assert_int_equal(kb_dir_opposite(KB_DIR_S), KB_DIR_N);
    assert_int_equal(kb_dir_opposite(KB_DIR_GLOBAL_E), KB_DIR_GLOBAL_W);
    assert_int_equal(kb_dir_opposite(KB_DIR_GLOBAL_N), KB_DIR_GLOBAL_S);
    assert_int_equal(kb_dir_opposite(KB_DIR_CHILD_LEFT), KB_DIR_PARENT);
    assert_int_equal(kb_dir_opposite(KB_DIR_CHILD_RIGHT), KB_DIR_PARENT);
    assert_int_equal(kb_dir_opposite(KB_DIR_PARENT), -1);
}

/* ---- 2-rank ring: E and W lead to the same peer ---- */

static void k_ring2(kb_tl *tl, const kb_kargs *a)
{
    if (tl_program_id(tl, 0) == 0) {
        kb_val va = tl_load(tl, in_at(a, 0, 0), KB_SHAPE1(N), KB_F32);
        kb_val vb = tl_load(tl, in_at(a, 0, 1), KB_SHAPE1(N), KB_F32);
        tl_send(tl, KB_DIR_E, va);
        tl_send(tl, KB_DIR_W, vb);
    } else {
        kb_val x = tl_recv(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
        tl_store(tl, out_at(a, 1, 0), x);
        kb_val y = tl_recv(tl, KB_DIR_E, KB_SHAPE1(N), KB_F32);
        tl_store(tl, out_at(a, 1, 1), y);
    }
}

static void test_ring2_direction_matching(void **state)
{
    char *tbuf = NULL;
    size_t tlen = 0;
    FILE *trace = open_memstream(&tbuf, &tlen);
    kb_ctx *ctx;
    fx f;

    (void)state;
    assert_non_null(trace);
    ctx = make_ctx_trace(trace);
    fx_init(&f, 2, KB_MEM_TCM, k_ring2, 2);
    fx_ring2(&f, 0, 1);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), 0);

    float *out = read_out(&f);
    check_slot(out, 1, 0, 0, 0, 0.0f); /* A, sent E, arrives on PE1's W */
    check_slot(out, 1, 1, 0, 1, 0.0f); /* B, sent W, arrives on PE1's E */
    free(out);

    kb_ipcq_counters c1w = counters(ctx, 1, KB_DIR_W), c1e = counters(ctx, 1, KB_DIR_E);
    kb_ipcq_counters c0e = counters(ctx, 0, KB_DIR_E), c0w = counters(ctx, 0, KB_DIR_W);
    assert_int_equal(c1w.peer_head_cache, 1);
    assert_int_equal(c1w.my_tail, 1);
    assert_int_equal(c1w.my_head, 0);
    assert_int_equal(c1e.peer_head_cache, 1);
    assert_int_equal(c1e.my_tail, 1);
    assert_int_equal(c0e.my_head, 1);
    assert_int_equal(c0e.peer_tail_cache, 1);
    assert_int_equal(c0e.peer_head_cache, 0);
    assert_int_equal(c0w.my_head, 1);
    assert_int_equal(c0w.peer_tail_cache, 1);
    /* pairing: PE0's E writes into PE1's W ring and vice versa */
    assert_true(c0e.peer_rx_base == c1w.my_rx_base);
    assert_true(c0w.peer_rx_base == c1e.my_rx_base);
    assert_true(c1w.peer_rx_base == c0e.my_rx_base);
    assert_true(c1e.peer_rx_base == c0w.my_rx_base);
    assert_ptr_equal(c0e.peer, pe_at(ctx, 1));
    assert_ptr_equal(c1w.peer, pe_at(ctx, 0));
    assert_int_equal(kb_ipcq_wired(ctx, pe_at(ctx, 0)), (1u << KB_DIR_E) | (1u << KB_DIR_W));
    assert_int_equal(kb_ipcq_wired(ctx, pe_at(ctx, 2)), 0);
    assert_int_equal(kb_ipcq_counters_of(ctx, pe_at(ctx, 0), KB_DIR_N, &c0e), KB_ERR_DIRECTION);
    assert_int_equal(kb_ipcq_counters_of(ctx, pe_at(ctx, 2), KB_DIR_E, &c0e), KB_ERR_DIRECTION);
    kb_ctx_destroy(ctx);

    /* KBCL_CCL_TRACE: one line per send and per receive */
    fclose(trace);
    assert_non_null(strstr(tbuf, "send E 64B seq=0 sip0/cube0/pe0"));
    assert_non_null(strstr(tbuf, "send W 64B seq=0 sip0/cube0/pe0"));
    assert_non_null(strstr(tbuf, "recv W 64B seq=0 sip0/cube0/pe1"));
    assert_non_null(strstr(tbuf, "recv E 64B seq=0 sip0/cube0/pe1"));
    free(tbuf);
}

/* ---- peer directions (full_mesh's KB_DIR_PEER(k)) next to named ones ---- */

/* PE0 sends slot 0 on peer5 (-> PE1's peer2), slot 1 on peer7 (-> PE2's peer0) and slot 2 on
 * E (-> PE1's W); PE1 and PE2 store what they receive in out slots 0, 2 and 1. */
static void k_peer(kb_tl *tl, const kb_kargs *a)
{
    int pe = tl_program_id(tl, 0);
    if (pe == 0) {
        static const kb_dir dirs[3] = { KB_DIR_PEER(5), KB_DIR_PEER(7), KB_DIR_E };
        for (int j = 0; j < 3; j++) {
            kb_val v = tl_load(tl, in_at(a, 0, j), KB_SHAPE1(N), KB_F32);
            tl_send(tl, dirs[j], v);
            tl_free(tl, v);
        }
    } else if (pe == 1) {
        tl_store(tl, out_at(a, 1, 0), tl_recv(tl, KB_DIR_PEER(2), KB_SHAPE1(N), KB_F32));
        tl_store(tl, out_at(a, 1, 2), tl_recv(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32));
    } else if (pe == 2) {
        tl_store(tl, out_at(a, 2, 1), tl_recv(tl, KB_DIR_PEER(0), KB_SHAPE1(N), KB_F32));
    }
}

static void fx_peer_links(fx *f)
{
    fx_link(f, 0, KB_DIR_PEER(5), 1, KB_DIR_PEER(2));
    fx_link(f, 1, KB_DIR_PEER(2), 0, KB_DIR_PEER(5));
    fx_link(f, 0, KB_DIR_PEER(7), 2, KB_DIR_PEER(0));
    fx_link(f, 2, KB_DIR_PEER(0), 0, KB_DIR_PEER(7));
    fx_link(f, 0, KB_DIR_E, 1, KB_DIR_W);
    fx_link(f, 1, KB_DIR_W, 0, KB_DIR_E);
}

static void test_peer_directions(void **state)
{
    char *tbuf = NULL;
    size_t tlen = 0;
    FILE *trace = open_memstream(&tbuf, &tlen);
    kb_ctx *ctx;
    fx f;

    (void)state;
    assert_non_null(trace);
    ctx = make_ctx_trace(trace);
    fx_init(&f, 2, KB_MEM_TCM, k_peer, 3);
    fx_peer_links(&f);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), 0);

    float *out = read_out(&f);
    check_slot(out, 1, 0, 0, 0, 0.0f); /* peer5 -> PE1's peer2 */
    check_slot(out, 2, 1, 0, 1, 0.0f); /* peer7 -> PE2's peer0 */
    check_slot(out, 1, 2, 0, 2, 0.0f); /* E -> PE1's W */
    free(out);

    /* queue pairs exist on the wired peer directions only, paired with the right rings */
    kb_ipcq_counters c05 = counters(ctx, 0, KB_DIR_PEER(5)), c12 = counters(ctx, 1, KB_DIR_PEER(2));
    kb_ipcq_counters c07 = counters(ctx, 0, KB_DIR_PEER(7)), c20 = counters(ctx, 2, KB_DIR_PEER(0));
    assert_ptr_equal(c05.peer, pe_at(ctx, 1));
    assert_ptr_equal(c12.peer, pe_at(ctx, 0));
    assert_ptr_equal(c07.peer, pe_at(ctx, 2));
    assert_ptr_equal(c20.peer, pe_at(ctx, 0));
    assert_true(c05.peer_rx_base == c12.my_rx_base && c12.peer_rx_base == c05.my_rx_base);
    assert_true(c07.peer_rx_base == c20.my_rx_base && c20.peer_rx_base == c07.my_rx_base);
    assert_int_equal(c05.my_head, 1);
    assert_int_equal(c05.peer_tail_cache, 1);
    assert_int_equal(c12.my_tail, 1);
    assert_int_equal(c20.peer_head_cache, 1);
    kb_ipcq_counters c;
    assert_int_equal(kb_ipcq_counters_of(ctx, pe_at(ctx, 0), KB_DIR_PEER(6), &c),
                     KB_ERR_DIRECTION);
    assert_int_equal(kb_ipcq_counters_of(ctx, pe_at(ctx, 0), KB_DIR_PEER(4), &c),
                     KB_ERR_DIRECTION);
    assert_int_equal(kb_ipcq_counters_of(ctx, pe_at(ctx, 0), KB_DIR_PEER(8), &c),
                     KB_ERR_DIRECTION);
    assert_int_equal(kb_ipcq_counters_of(ctx, pe_at(ctx, 1), KB_DIR_PEER(5), &c),
                     KB_ERR_DIRECTION);
    /* the named bitmask keeps the named ones; peer ones are counted apart */
    assert_int_equal(kb_ipcq_wired(ctx, pe_at(ctx, 0)), 1u << KB_DIR_E);
    assert_int_equal(kb_ipcq_wired(ctx, pe_at(ctx, 2)), 0);
    assert_int_equal(kb_ipcq_peer_wired(ctx, pe_at(ctx, 0)), 2);
    assert_int_equal(kb_ipcq_peer_wired(ctx, pe_at(ctx, 2)), 1);
    assert_int_equal(kb_ipcq_peer_wired(ctx, pe_at(ctx, 3)), 0);
    assert_true(kb_ipcq_is_wired(ctx, pe_at(ctx, 0), KB_DIR_PEER(7)));
    assert_true(kb_ipcq_is_wired(ctx, pe_at(ctx, 0), KB_DIR_E));
    assert_false(kb_ipcq_is_wired(ctx, pe_at(ctx, 0), KB_DIR_W));
    assert_false(kb_ipcq_is_wired(ctx, pe_at(ctx, 0), KB_DIR_PEER(6)));
    /* three rings on PE0 (2 slots x 64 B each), one on PE2 */
    assert_int_equal(kb_alloc_used(pe_at(ctx, 0)->ipcq), 3 * 128);
    assert_int_equal(kb_alloc_used(pe_at(ctx, 2)->ipcq), 128);
    assert_int_equal(kb_ipcq_peer_bytes(ctx), 2 * N * 4);
    assert_int_equal(kb_ipcq_dir_bytes(ctx, KB_DIR_E), N * 4);
    kb_ctx_destroy(ctx);

    fclose(trace);
    assert_non_null(strstr(tbuf, "send peer5 64B seq=0 sip0/cube0/pe0"));
    assert_non_null(strstr(tbuf, "recv peer2 64B seq=0 sip0/cube0/pe1"));
    assert_non_null(strstr(tbuf, "recv peer0 64B seq=0 sip0/cube0/pe2"));
    free(tbuf);
}

static void k_send_peer6(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    if (tl_program_id(tl, 0) == 0)
        tl_send(tl, KB_DIR_PEER(6), tl_full(tl, KB_SHAPE1(N), 1.0f));
}

/* A peer direction inside the PE's span but not wired is named in the error. */
static void test_peer_unwired(void **state)
{
    kb_ctx *ctx = make_ctx();
    fx f;

    (void)state;
    fx_init(&f, 2, KB_MEM_TCM, k_send_peer6, 3);
    fx_peer_links(&f);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), KB_ERR_DIRECTION);
    if (!strstr(kb_ctx_errmsg(ctx), "tl_send: direction peer6 is not wired on this PE (wired: "
                                    "E and 2 peer directions in peer5..peer7)"))
        fail_msg("message: %s", kb_ctx_errmsg(ctx));
    kb_ctx_destroy(ctx);
}

/* Install errors on peer directions: twice on a PE, no way back, rings beyond the area. */
typedef struct peer_inst {
    int rc[4];
    char msg[4][768];
    uint64_t used0[4];
} peer_inst;

static int h_peer_install(kb_ctx *ctx, void *arg)
{
    peer_inst *pi = arg;
    kb_ipcq_cfg cfg = { 2, 64, KB_MEM_TCM, 1, 1 };
    link_spec twice[3] = {
        { 0, KB_DIR_PEER(3), 1, KB_DIR_PEER(1) }, { 1, KB_DIR_PEER(1), 0, KB_DIR_PEER(3) },
        { 0, KB_DIR_PEER(3), 1, KB_DIR_PEER(1) },
    };
    link_spec no_back[1] = { { 0, KB_DIR_PEER(300), 1, KB_DIR_PEER(1) } };
    link_spec good[2] = {
        { 0, KB_DIR_PEER(300), 1, KB_DIR_PEER(1) }, { 1, KB_DIR_PEER(1), 0, KB_DIR_PEER(300) },
    };
    for (int step = 0; step < 3; step++) {
        switch (step) {
        case 0: pi->rc[step] = install_specs(ctx, &cfg, twice, 3); break;
        case 1: pi->rc[step] = install_specs(ctx, &cfg, no_back, 1); break;
        default: pi->rc[step] = install_specs(ctx, &cfg, good, 2); break;
        }
        snprintf(pi->msg[step], sizeof pi->msg[step], "%s", kb_ctx_errmsg(ctx));
        pi->used0[step] = kb_alloc_used(pe_at(ctx, 0)->ipcq);
    }
    return 0;
}

static int h_peer_nofit(kb_ctx *ctx, void *arg)
{
    peer_inst *pi = arg;
    kb_ipcq_cfg cfg = { 2, 1048576, KB_MEM_TCM, 1, 1 };
    link_spec ls[10];
    for (int k = 0; k < 5; k++) { /* PE0 <-> PE1 on five peer directions each way: 10 MiB */
        ls[2 * k] = (link_spec){ 0, KB_DIR_PEER(k), 1, KB_DIR_PEER(k) };
        ls[2 * k + 1] = (link_spec){ 1, KB_DIR_PEER(k), 0, KB_DIR_PEER(k) };
    }
    pi->rc[3] = install_specs(ctx, &cfg, ls, 10);
    snprintf(pi->msg[3], sizeof pi->msg[3], "%s", kb_ctx_errmsg(ctx));
    pi->used0[3] = kb_alloc_used(pe_at(ctx, 0)->ipcq);
    return 0;
}

static void test_peer_install_errors(void **state)
{
    kb_ctx *ctx = make_ctx();
    peer_inst *pi = calloc(1, sizeof *pi);

    (void)state;
    assert_non_null(pi);
    assert_int_equal(kb_ctx_run_host(ctx, h_peer_install, pi), 0);
    assert_int_equal(pi->rc[0], KB_ERR_INVAL);
    assert_non_null(strstr(pi->msg[0], "sip0/cube0/pe0 direction peer3 appears twice"));
    assert_int_equal(pi->rc[1], KB_ERR_INVAL);
    assert_non_null(strstr(pi->msg[1], "sip0/cube0/pe0 peer300 -> sip0/cube0/pe1, but "
                                       "sip0/cube0/pe1 has no peer1 queue pointing back"));
    assert_int_equal(pi->used0[0], 0); /* rolled back */
    assert_int_equal(pi->used0[1], 0);
    if (pi->rc[2] != 0)
        fail_msg("good install: %s", pi->msg[2]);
    assert_int_equal(pi->used0[2], 128);
    assert_true(kb_ipcq_is_wired(ctx, pe_at(ctx, 0), KB_DIR_PEER(300)));
    kb_ctx_destroy(ctx);

    ctx = make_ctx();
    assert_int_equal(kb_ctx_run_host(ctx, h_peer_nofit, pi), 0);
    assert_int_equal(pi->rc[3], KB_ERR_NOSPACE);
    if (!strstr(pi->msg[3], "sip0/cube0/pe0 needs 5 rx rings (5 of them peer directions) of 2 "
                            "slots x 1048576 bytes = 10485760 bytes, but the PE's IPCQ area in "
                            "TCM (pe.ipcq.area_bytes) has"))
        fail_msg("message: %s", pi->msg[3]);
    assert_int_equal(pi->used0[3], 0);
    kb_ctx_destroy(ctx);
    free(pi);
}

/* ---- backpressure ---- */

#define BURN_OPS 200
#define NSEND NSLOT

static void k_credit(kb_tl *tl, const kb_kargs *a)
{
    fx *f = fx_of(a);
    if (tl_program_id(tl, 0) == 0) {
        for (int j = 0; j < NSEND; j++) {
            kb_val v = tl_load(tl, in_at(a, 0, j), KB_SHAPE1(N), KB_F32);
            f->t_call[j] = kbt_tl_now(tl);
            tl_send(tl, KB_DIR_E, v);
            f->t_sent[j] = kbt_tl_now(tl);
            tl_free(tl, v);
        }
    } else {
        /* busy long enough that the sender runs out of credits before the first receive */
        kb_val z = tl_full(tl, KB_SHAPE1(N), 1.0f);
        for (int k = 0; k < BURN_OPS; k++)
            tl_free(tl, tl_add(tl, z, z));
        for (int j = 0; j < NSEND; j++) {
            kb_val x = tl_recv(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
            f->t_recv[j] = kbt_tl_now(tl);
            tl_store(tl, out_at(a, 1, j), x);
            tl_free(tl, x);
        }
    }
}

static int in_range(uint64_t addr, kb_pa base, uint64_t len)
{
    return addr >= base && addr < base + len;
}

/* NSEND values E from PE0 to PE1 through a queue of n_slots slots; PE1 starts late. */
static void check_backpressure(int n_slots)
{
    kb_ctx *ctx = make_ctx();
    fx f;
    const kb_rec *snd[NSEND], *cpy[NSEND];
    int ns = 0, nc = 0;

    fx_init(&f, n_slots, KB_MEM_TCM, k_credit, 2);
    fx_link(&f, 0, KB_DIR_E, 1, KB_DIR_W);
    fx_link(&f, 1, KB_DIR_W, 0, KB_DIR_E);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), 0);

    float *out = read_out(&f);
    for (int j = 0; j < NSEND; j++)
        check_slot(out, 1, j, 0, j, 0.0f);
    free(out);

    kb_ipcq_counters c0 = counters(ctx, 0, KB_DIR_E), c1 = counters(ctx, 1, KB_DIR_W);
    assert_int_equal(c0.my_head, NSEND);
    assert_int_equal(c0.peer_tail_cache, NSEND);
    assert_int_equal(c1.peer_head_cache, NSEND);
    assert_int_equal(c1.my_tail, NSEND);

    /* the op log holds the send DMAs (into PE1's ring) and the receive copies (out of it) */
    kb_oplog *log = kb_ctx_oplog(ctx);
    uint64_t ring_len = (uint64_t)f.icfg.n_slots * f.icfg.slot_size;
    for (size_t i = 0; i < kb_oplog_count(log); i++) {
        const kb_rec *r = kb_oplog_at(log, i);
        if (r->kind != KB_REC_COPY)
            continue;
        if (in_range(r->dst.addr, c1.my_rx_base, ring_len)) {
            assert_true(ns < NSEND);
            assert_int_equal(r->pe, pe_at(ctx, 0)->gid);
            snd[ns++] = r;
        } else if (in_range(r->src[0].addr, c1.my_rx_base, ring_len)) {
            assert_true(nc < NSEND);
            assert_int_equal(r->pe, pe_at(ctx, 1)->gid);
            cpy[nc++] = r;
        }
    }
    assert_int_equal(ns, NSEND);
    assert_int_equal(nc, NSEND);
    kb_time credit = kb_time_from_ns(kb_ctx_config(ctx)->topo.ipcq_credit_latency_ns);
    assert_true(credit > 0);
    for (int j = 0; j < NSEND; j++) {
        /* slots are used round-robin, and read back from the same slot */
        kb_pa slot = c1.my_rx_base + (uint64_t)(j % n_slots) * f.icfg.slot_size;
        assert_true(snd[j]->dst.addr == slot);
        assert_true(cpy[j]->src[0].addr == slot);
        assert_true(cpy[j]->t_start >= snd[j]->t_end);
        assert_true(f.t_recv[j] >= cpy[j]->t_end);
        if (j < n_slots) {
            /* a free slot: the send went out while PE1 was still busy */
            assert_true(snd[j]->t_end < cpy[0]->t_start);
        } else {
            /* the send waited for the credit of the copy that freed its slot, which travels
             * pe.ipcq.credit_latency_ns plus the route's link latencies */
            assert_true(snd[j]->t_start > cpy[j - n_slots]->t_end + credit);
            assert_true(f.t_sent[j] > f.t_recv[j - n_slots]);
        }
    }
    /* the first send that needed a credit was issued while PE1 was busy: it really blocked */
    if (n_slots < NSEND) {
        assert_true(f.t_call[n_slots] < cpy[0]->t_start);
        assert_true(f.t_sent[n_slots] - f.t_call[n_slots] > credit);
    }
    kb_ctx_destroy(ctx);
}

static void test_backpressure_one_slot(void **state) { (void)state; check_backpressure(1); }
static void test_backpressure_three_slots(void **state) { (void)state; check_backpressure(3); }

/* ---- rx ring placement ---- */

static void k_nop(kb_tl *tl, const kb_kargs *a)
{
    (void)tl;
    (void)a;
}

static void check_placement(kb_mem_kind kind)
{
    kb_ctx *ctx = make_ctx();
    fx f;
    kb_pa base[NPES * 2];
    int nb = 0;

    fx_init(&f, 3, kind, k_nop, 1);
    for (int pe = 0; pe < NPES; pe++) { /* a 4-PE ring */
        int e = (pe + 1) % NPES, w = (pe + NPES - 1) % NPES;
        fx_link(&f, pe, KB_DIR_E, e, KB_DIR_W);
        fx_link(&f, pe, KB_DIR_W, w, KB_DIR_E);
    }
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), 0);
    uint64_t len = (uint64_t)f.icfg.n_slots * f.icfg.slot_size;
    for (int pe = 0; pe < NPES; pe++) {
        for (int d = KB_DIR_E; d <= KB_DIR_W; d++) {
            kb_ipcq_counters c = counters(ctx, pe, (kb_dir)d);
            kb_pa_fields pf = kb_pa_decode(c.my_rx_base);
            kb_pa_fields pl = kb_pa_decode(c.my_rx_base + len - 1);
            assert_int_equal(kb_pa_gsip(c.my_rx_base), 0);
            assert_int_equal(pf.cube, 0);
            switch (kind) {
            case KB_MEM_TCM:
                assert_int_equal(pf.kind, KB_PA_PE_RES);
                assert_int_equal(pf.range, KB_PE_IPCQ);
                assert_int_equal(pf.pe, pe);
                assert_int_equal(pl.kind, KB_PA_PE_RES);
                assert_int_equal(pl.range, KB_PE_IPCQ);
                break;
            case KB_MEM_HBM: {
                uint64_t slice = kb_ctx_machine(ctx)->hbm_slice_bytes;
                assert_int_equal(pf.kind, KB_PA_HBM);
                assert_int_equal(pf.offset / slice, pe); /* the PE's own HBM slice */
                assert_int_equal((pf.offset + len - 1) / slice, pe);
                break;
            }
            case KB_MEM_SRAM:
                assert_int_equal(pf.kind, KB_PA_SRAM);
                assert_int_equal(pl.kind, KB_PA_SRAM);
                break;
            }
            /* the peer writes into the ring the reverse direction owns */
            int peer = d == KB_DIR_E ? (pe + 1) % NPES : (pe + NPES - 1) % NPES;
            kb_ipcq_counters pc = counters(ctx, peer, d == KB_DIR_E ? KB_DIR_W : KB_DIR_E);
            assert_true(c.peer_rx_base == pc.my_rx_base);
            base[nb++] = c.my_rx_base;
        }
    }
    for (int i = 0; i < nb; i++)
        for (int j = i + 1; j < nb; j++)
            assert_true(base[i] + len <= base[j] || base[j] + len <= base[i]);
    kb_ctx_destroy(ctx);
}

static void test_placement_tcm(void **state) { (void)state; check_placement(KB_MEM_TCM); }
static void test_placement_hbm(void **state) { (void)state; check_placement(KB_MEM_HBM); }
static void test_placement_sram(void **state) { (void)state; check_placement(KB_MEM_SRAM); }

/* ---- install errors leave nothing installed ---- */

typedef struct inst_case {
    int rc[8];
    char msg[8][768];
    uint32_t wired2[8], wired3[8];
    uint64_t used2[8], used3[8];
} inst_case;

static int h_install_errors(kb_ctx *ctx, void *arg)
{
    inst_case *ic = arg;
    kb_ipcq_cfg cfg = { 2, 64, KB_MEM_TCM, 1, 1 }, other = cfg;
    link_spec ring01[4] = {
        { 0, KB_DIR_E, 1, KB_DIR_W }, { 0, KB_DIR_W, 1, KB_DIR_E },
        { 1, KB_DIR_W, 0, KB_DIR_E }, { 1, KB_DIR_E, 0, KB_DIR_W },
    };
    /* PE2 and PE3 first, so the failure has fresh state to roll back */
    link_spec again[3] = {
        { 2, KB_DIR_E, 3, KB_DIR_W }, { 3, KB_DIR_W, 2, KB_DIR_E }, { 0, KB_DIR_N, 1, KB_DIR_S },
    };
    link_spec one_way[1] = { { 2, KB_DIR_E, 3, KB_DIR_W } };
    link_spec no_back[3] = {
        { 2, KB_DIR_E, 3, KB_DIR_W }, { 3, KB_DIR_W, 2, KB_DIR_E }, { 3, KB_DIR_E, 2, KB_DIR_W },
    };
    link_spec twice[3] = {
        { 2, KB_DIR_E, 3, KB_DIR_W }, { 3, KB_DIR_W, 2, KB_DIR_E }, { 2, KB_DIR_E, 3, KB_DIR_W },
    };
    link_spec good[2] = { { 2, KB_DIR_E, 3, KB_DIR_W }, { 3, KB_DIR_W, 2, KB_DIR_E } };
    kb_ipcq_cfg zero = cfg;
    zero.n_slots = 0;
    other.n_slots = 3;

    for (int step = 0; step < 8; step++) {
        switch (step) {
        case 0: ic->rc[step] = install_specs(ctx, &cfg, ring01, 4); break;
        case 1: ic->rc[step] = install_specs(ctx, &cfg, again, 3); break;
        case 2: ic->rc[step] = install_specs(ctx, &cfg, one_way, 1); break;
        case 3: ic->rc[step] = install_specs(ctx, &cfg, no_back, 3); break;
        case 4: ic->rc[step] = install_specs(ctx, &cfg, twice, 3); break;
        case 5: ic->rc[step] = install_specs(ctx, &other, good, 2); break;
        case 6: ic->rc[step] = install_specs(ctx, &zero, good, 2); break;
        default: ic->rc[step] = install_specs(ctx, &cfg, good, 2); break;
        }
        snprintf(ic->msg[step], sizeof ic->msg[step], "%s", kb_ctx_errmsg(ctx));
        ic->wired2[step] = kb_ipcq_wired(ctx, pe_at(ctx, 2));
        ic->wired3[step] = kb_ipcq_wired(ctx, pe_at(ctx, 3));
        ic->used2[step] = kb_alloc_used(pe_at(ctx, 2)->ipcq);
        ic->used3[step] = kb_alloc_used(pe_at(ctx, 3)->ipcq);
    }
    return 0;
}

static void test_install_errors(void **state)
{
    kb_ctx *ctx = make_ctx();
    inst_case *ic = calloc(1, sizeof *ic);

    (void)state;
    assert_non_null(ic);
    assert_int_equal(kb_ctx_run_host(ctx, h_install_errors, ic), 0);
    assert_int_equal(ic->rc[0], 0);
    /* a second install on PE0 */
    assert_int_equal(ic->rc[1], KB_ERR_STATE);
    assert_non_null(strstr(ic->msg[1], "sip0/cube0/pe0 is already installed"));
    /* PE3 has no queue at all, then no E... W pair back to PE2 */
    assert_int_equal(ic->rc[2], KB_ERR_INVAL);
    assert_non_null(strstr(ic->msg[2], "sip0/cube0/pe2 E -> sip0/cube0/pe3"));
    assert_non_null(strstr(ic->msg[2], "has no W queue pointing back"));
    assert_int_equal(ic->rc[3], KB_ERR_INVAL);
    assert_non_null(strstr(ic->msg[3], "sip0/cube0/pe2 has no W queue pointing back"));
    assert_int_equal(ic->rc[4], KB_ERR_INVAL);
    assert_non_null(strstr(ic->msg[4], "sip0/cube0/pe2 direction E appears twice"));
    assert_int_equal(ic->rc[5], KB_ERR_STATE);
    assert_non_null(strstr(ic->msg[5], "one IPCQ configuration"));
    assert_int_equal(ic->rc[6], KB_ERR_RANGE);
    for (int s = 1; s <= 6; s++) {
        /* nothing half-installed: no state, no ring memory left behind */
        assert_int_equal(ic->wired2[s], 0);
        assert_int_equal(ic->wired3[s], 0);
        assert_int_equal(ic->used2[s], ic->used2[0]);
        assert_int_equal(ic->used3[s], ic->used3[0]);
    }
    /* after all that, PE2 and PE3 install cleanly */
    assert_int_equal(ic->rc[7], 0);
    assert_int_equal(ic->wired2[7], 1u << KB_DIR_E);
    assert_int_equal(ic->wired3[7], 1u << KB_DIR_W);
    assert_int_equal(ic->used2[7], ic->used2[0] + 128);
    assert_int_equal(kb_ipcq_wired(ctx, pe_at(ctx, 0)), (1u << KB_DIR_E) | (1u << KB_DIR_W));
    assert_int_equal(kb_ipcq_wired(ctx, pe_at(ctx, 1)), (1u << KB_DIR_E) | (1u << KB_DIR_W));
    free(ic);
    kb_ctx_destroy(ctx);
}

/* Two installs with equal settings are one configuration, whatever the structs' padding. */
static int h_install_twice(kb_ctx *ctx, void *arg)
{
    int *rc = arg;
    kb_ipcq_cfg a, b;
    link_spec ring01[2] = { { 0, KB_DIR_E, 1, KB_DIR_W }, { 1, KB_DIR_W, 0, KB_DIR_E } };
    link_spec ring23[2] = { { 2, KB_DIR_E, 3, KB_DIR_W }, { 3, KB_DIR_W, 2, KB_DIR_E } };

    memset(&a, 0, sizeof a);
    memset(&b, 0xa5, sizeof b);
    a.n_slots = b.n_slots = 2;
    a.slot_size = b.slot_size = 64;
    a.buffer_kind = b.buffer_kind = KB_MEM_HBM;
    a.backpressure = b.backpressure = 1;
    rc[0] = install_specs(ctx, &a, ring01, 2);
    rc[1] = install_specs(ctx, &b, ring23, 2);
    return 0;
}

static void test_install_same_config_twice(void **state)
{
    kb_ctx *ctx = make_ctx();
    int rc[2] = { -100, -100 };

    (void)state;
    assert_int_equal(kb_ctx_run_host(ctx, h_install_twice, rc), 0);
    assert_int_equal(rc[0], 0);
    if (rc[1] != 0)
        fail_msg("second install: %d %s", rc[1], kb_ctx_errmsg(ctx));
    assert_int_equal(kb_ipcq_wired(ctx, pe_at(ctx, 3)), 1u << KB_DIR_W);
    kb_ctx_destroy(ctx);
}

/* ---- kernel misuse ---- */

static void k_send_north(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    if (tl_program_id(tl, 0) == 0)
        tl_send(tl, KB_DIR_N, tl_full(tl, KB_SHAPE1(N), 1.0f));
}

static void test_unwired_direction(void **state)
{
    kb_ctx *ctx = make_ctx();
    fx f;

    (void)state;
    fx_init(&f, 2, KB_MEM_TCM, k_send_north, 2);
    fx_ring2(&f, 0, 1);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), KB_ERR_DIRECTION);
    const char *msg = kb_ctx_errmsg(ctx);
    assert_non_null(strstr(msg, "sip0/cube0/pe0"));
    assert_non_null(strstr(msg, "tl_send: direction N is not wired"));
    assert_non_null(strstr(msg, "(wired: E W)"));
    kb_ctx_destroy(ctx);
}

/* A strided view cannot travel as a message (its rows are not one run of memory). */
static void k_send_view(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    if (tl_program_id(tl, 0) == 0)
        tl_send(tl, KB_DIR_E, tl_view(tl, tl_full(tl, KB_SHAPE2(4, 8), 1.0f), 1, 2, 2, 3));
}

static void test_send_strided_view(void **state)
{
    kb_ctx *ctx = make_ctx();
    fx f;

    (void)state;
    fx_init(&f, 2, KB_MEM_TCM, k_send_view, 2);
    fx_ring2(&f, 0, 1);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), KB_ERR_INVAL);
    if (!strstr(kb_ctx_errmsg(ctx), "sip0/cube0/pe0") ||
        !strstr(kb_ctx_errmsg(ctx), "tl_send E: the value is a strided view (row stride 8, 3 "
                                    "columns); tl_copy it into a contiguous value first"))
        fail_msg("message: %s", kb_ctx_errmsg(ctx));
    kb_ctx_destroy(ctx);
}

static void k_recv_unwired(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    if (tl_program_id(tl, 0) == 2)
        (void)tl_recv(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
}

static void test_uninstalled_pe(void **state)
{
    kb_ctx *ctx = make_ctx();
    fx f;

    (void)state;
    fx_init(&f, 2, KB_MEM_TCM, k_recv_unwired, 3);
    fx_ring2(&f, 0, 1);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), KB_ERR_DIRECTION);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "sip0/cube0/pe2"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "tl_recv: direction W is not wired"));
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "(wired: none)"));
    kb_ctx_destroy(ctx);
}

/* ---- between SIPs with system.switch.arbitration per_sip ---- */

typedef struct xs_fx {
    int n_slots;
    kb_time t_call, t_sent, t_recv[3];
} xs_fx;

/* PE 0 of SIP 0 sends a 64-byte value and then a 3-chunk one (CH_N elements) on global_E;
 * PE 0 of SIP 1 receives both on global_W. */
static void k_cross_sip(kb_tl *tl, const kb_kargs *a)
{
    xs_fx *f = (xs_fx *)(intptr_t)a->i[FX_ARG];
    if (tl_program_id(tl, 2) == 0) {
        kb_val v = tl_full(tl, KB_SHAPE1(N), 1.5f), w = tl_full(tl, KB_SHAPE1(CH_N), 2.5f);
        f->t_call = kbt_tl_now(tl);
        tl_send(tl, KB_DIR_GLOBAL_E, v);
        f->t_sent = kbt_tl_now(tl);
        tl_send(tl, KB_DIR_GLOBAL_E, w);
        tl_free(tl, w);
        tl_free(tl, v);
    } else {
        kb_val v = tl_recv(tl, KB_DIR_GLOBAL_W, KB_SHAPE1(N), KB_F32);
        f->t_recv[0] = kbt_tl_now(tl);
        kb_ipcq_req *r = tl_recv_async(tl, KB_DIR_GLOBAL_W, KB_SHAPE1(CH_N), KB_F32);
        kb_val w = tl_wait(tl, r);
        f->t_recv[1] = kbt_tl_now(tl);
        tl_free(tl, w);
        tl_free(tl, v);
    }
}

static int h_cross_sip(kb_ctx *ctx, void *arg)
{
    kb_machine *m = kb_ctx_machine(ctx);
    kb_pe_hw *a = kb_machine_pe(m, 0, 0, 0), *b = kb_machine_pe(m, 1, 0, 0);
    xs_fx *f = arg;
    kb_ipcq_cfg cfg = { .n_slots = f->n_slots, .slot_size = N * 4, .buffer_kind = KB_MEM_TCM,
                        .backpressure = 1 };
    kb_ipcq_link links[2] = { { a, KB_DIR_GLOBAL_E, b, KB_DIR_GLOBAL_W },
                              { b, KB_DIR_GLOBAL_W, a, KB_DIR_GLOBAL_E } };
    kb_grid g = { 1, 1, 2, 0 };
    kb_kargs ka;
    int rc = kb_ipcq_install(ctx, &cfg, links, 2);
    if (rc)
        return rc;
    memset(&ka, 0, sizeof ka);
    ka.i[FX_ARG] = (int64_t)(intptr_t)arg;
    return kb_launch(ctx, "cross_sip", k_cross_sip, &ka, &g);
}

/*
 * Idle, both arbitrations land the first value at the same time (the parts add up to the
 * route's closed form); with per_sip the sender is done when its value has left SIP 0, earlier
 * by the latency of SIP 1's part of the route (its NoC and the TCM port the ring is in: the
 * 64-byte DMA's occupancy, the engine's setup, is in SIP 0's part). With 4 slots the second
 * message leaves that much earlier too; with 1 slot it waits for the first slot's credit, which
 * per_sip brings as an event at the same time route writes it: from there on nothing differs.
 */
static void check_cross_sip(int n_slots)
{
    static const char *const sets[] = {
        "system.sips.count=2", "sip.cube_mesh.width=1", "sip.cube_mesh.height=1",
        "cube.corners=1", "cube.pe_per_corner=1", "cube.noc.topology=bus", "pe.dma.channels=1",
        "system.switch.arbitration=route", "system.switch.arbitration=per_sip",
    };
    kb_ctx_opts opts = { .device = KB_DEV_NONE };
    xs_fx f[2];
    uint64_t events[2];
    for (int arb = 0; arb < 2; arb++) {
        /* route named, then overridden by per_sip (the default since 2026-12-04) */
        kb_ctx *ctx = kbt_ctx_new(sets, 8 + (size_t)arb, &opts);
        memset(&f[arb], 0, sizeof f[arb]);
        f[arb].n_slots = n_slots;
        assert_int_equal(kb_ctx_machine(ctx)->per_sip, arb);
        assert_int_equal(kb_ctx_run_host(ctx, h_cross_sip, &f[arb]), 0);
        events[arb] = kb_sim_events(kb_ctx_sim(ctx));
        if (arb) {
            const kb_topo_cfg *c = &kb_ctx_machine(ctx)->cfg;
            assert_int_equal(f[0].t_sent - f[1].t_sent,
                             kbt_ps(c->noc.latency_ns) + kbt_ps(c->tcm.latency_ns));
        }
        kb_ctx_destroy(ctx);
    }
    assert_int_equal(f[0].t_call, f[1].t_call);
    assert_true(f[1].t_sent < f[0].t_sent);
    assert_int_equal(f[0].t_recv[0], f[1].t_recv[0]);
    if (n_slots > 1)
        assert_int_equal(f[0].t_recv[1] - f[1].t_recv[1], f[0].t_sent - f[1].t_sent);
    else
        assert_int_equal(f[0].t_recv[1], f[1].t_recv[1]);
    /* one event more per chunk between SIPs (1 + 3 chunks) and one per credit coming back */
    assert_int_equal(events[1], events[0] + 8);
}

static void test_cross_sip_per_sip(void **state) { (void)state; check_cross_sip(4); }
static void test_cross_sip_credits(void **state) { (void)state; check_cross_sip(1); }

/* ---- messages longer than a slot: chunks through the credit window ---- */


static void k_chunked(kb_tl *tl, const kb_kargs *a)
{
    fx *f = fx_of(a);
    if (tl_program_id(tl, 0) == 0) {
        kb_val v = tl_load(tl, in_at(a, 0, 0), KB_SHAPE1(CH_N), KB_F32);
        f->t_call[0] = kbt_tl_now(tl);
        tl_send(tl, KB_DIR_E, v);
        f->t_sent[0] = kbt_tl_now(tl);
        /* the reply, received into scratch: a chunked message the other way */
        kb_val back = tl_recv(tl, KB_DIR_W, KB_SHAPE2(2, CH_N / 2), KB_F32);
        tl_store(tl, out_at(a, 0, 0), back);
    } else {
        kb_ipcq_req *r = tl_recv_into_async(tl, KB_DIR_W, out_at(a, 1, 0), KB_SHAPE1(CH_N),
                                            KB_F32);
        (void)tl_wait(tl, r);
        f->t_recv[0] = kbt_tl_now(tl);
        tl_send(tl, KB_DIR_E, tl_load(tl, in_at(a, 1, 0), KB_SHAPE2(2, CH_N / 2), KB_F32));
    }
}

static void check_chunked(int n_slots, int legacy)
{
    kb_ctx *ctx = make_ctx_model(NULL, legacy);
    fx f;
    int chunks = (CH_N + N - 1) / N, back_chunks = (2 * (CH_N / 2) + N - 1) / N;

    fx_init(&f, n_slots, KB_MEM_TCM, k_chunked, 2);
    fx_ring2(&f, 0, 1);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), 0);

    /* every element arrived where it belongs, both ways */
    float *out = read_out(&f);
    for (int i = 0; i < CH_N; i++)
        if (out[(1 * NSLOT) * N + i] != in_val(0, i / N, i % N))
            fail_msg("n_slots %d: pe1 element %d = %g, expected %g", n_slots, i,
                     (double)out[(1 * NSLOT) * N + i], (double)in_val(0, i / N, i % N));
    for (int i = 0; i < 2 * (CH_N / 2); i++)
        if (out[i] != in_val(1, i / N, i % N))
            fail_msg("n_slots %d: pe0 element %d = %g, expected %g", n_slots, i,
                     (double)out[i], (double)in_val(1, i / N, i % N));
    free(out);

    /* one slot per chunk went each way, every one credited */
    kb_ipcq_counters c0 = counters(ctx, 0, KB_DIR_E), c1 = counters(ctx, 1, KB_DIR_W);
    assert_int_equal(c0.my_head, chunks);
    assert_int_equal(c0.peer_tail_cache, chunks);
    assert_int_equal(c1.peer_head_cache, chunks);
    assert_int_equal(c1.my_tail, chunks);
    assert_int_equal(counters(ctx, 1, KB_DIR_E).my_head, back_chunks);

    if (n_slots >= chunks) {
        /*
         * With a free slot for every chunk, the IPCQ engine issues them back to back at the
         * call's issue time; each DMA holds its route at once. One DMA channel (legacy): chunk
         * j starts when the bottleneck, the sender's PE_DMA, is done with chunk j-1 (its setup
         * plus the bytes), so the message ends after the route's link latencies plus
         * Σ (setup + transfer) over its chunks (docs/timing-model.md §11). Several channels:
         * chunk j takes a channel of its own and starts once the NoC link PE 0 -> PE 1 (the
         * narrowest shared resource of the route) has carried the chunks before it; the send
         * ends with its last token, max_j (start_j + setup + transfer_j) after the latencies.
         * Route either way: TCM (2 ns), NoC (5 ns), TCM (2 ns).
         */
        const kb_topo_cfg *t = &kb_ctx_config(ctx)->topo;
        int64_t lat = 2 * kbt_ps(t->tcm.latency_ns) + kbt_ps(t->noc.latency_ns);
        int64_t engine = 0, start = 0;
        for (int off = 0; off < CH_N; off += N) {
            uint64_t b = (uint64_t)(CH_N - off < N ? CH_N - off : N) * 4u;
            int64_t occ = kbt_ps(t->dma_setup_ns) + kbt_xfer_ps(b, t->dma_bandwidth_gbps);
            if (legacy) {
                engine += occ;
            } else {
                engine = start + occ > engine ? start + occ : engine;
                start += kbt_xfer_ps(b, t->noc.bandwidth_gbps);
            }
        }
        int64_t want = kbt_ps(t->pe_cpu_overhead_ns) + kbt_ps(t->ipcq_overhead_ns) + lat + engine;
        assert_int_equal(f.t_sent[0] - f.t_call[0], want);
        assert_int_equal(f.t_sent[0] - f.t_call[0], legacy ? 82157 : 41625);
    }
    assert_true(f.t_recv[0] > f.t_sent[0]);
    kb_ctx_destroy(ctx);
}

static void test_chunked_one_slot(void **state) { (void)state; check_chunked(1, 0); }
static void test_chunked_window(void **state)
{
    (void)state;
    check_chunked(4, 0);
    check_chunked(4, 1);
}


/* A receive naming another size than the message it matches is an error, not a silent
 * misread (the meta token carries the message size). */
static void k_recv_mismatch(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    if (tl_program_id(tl, 0) == 0)
        tl_send(tl, KB_DIR_E, tl_full(tl, KB_SHAPE1(N / 2), 1.0f));
    else
        (void)tl_recv(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
}

static void test_recv_size_mismatch(void **state)
{
    kb_ctx *ctx = make_ctx();
    fx f;
    (void)state;
    fx_init(&f, 2, KB_MEM_TCM, k_recv_mismatch, 2);
    fx_ring2(&f, 0, 1);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), KB_ERR_INVAL);
    if (!strstr(kb_ctx_errmsg(ctx), "sip0/cube0/pe1: tl_recv W expects 64 bytes but message 0 "
                                    "from the peer has 32"))
        fail_msg("message: %s", kb_ctx_errmsg(ctx));
    kb_ctx_destroy(ctx);
}

/* ---- asynchronous receives ---- */

static void k_async(kb_tl *tl, const kb_kargs *a)
{
    if (tl_program_id(tl, 0) == 0) {
        tl_send(tl, KB_DIR_E, tl_load(tl, in_at(a, 0, 0), KB_SHAPE1(N), KB_F32));
        tl_send(tl, KB_DIR_E, tl_load(tl, in_at(a, 0, 1), KB_SHAPE1(N), KB_F32));
        tl_send(tl, KB_DIR_E, tl_load(tl, in_at(a, 0, 2), KB_SHAPE1(N), KB_F32));
    } else {
        /* two receives outstanding on a one-slot queue, collected out of order */
        kb_ipcq_req *r1 = tl_recv_async(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
        kb_ipcq_req *r2 = tl_recv_async(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
        kb_val two = tl_full(tl, KB_SHAPE1(N), 2.0f);
        kb_val four = tl_add(tl, two, two);
        kb_val y2 = tl_wait(tl, r2);
        kb_val y1 = tl_wait(tl, r1);
        tl_store(tl, out_at(a, 1, 0), tl_add(tl, y1, four));
        tl_store(tl, out_at(a, 1, 1), y2);
        /* received straight into the tensor */
        tl_recv_into(tl, KB_DIR_W, out_at(a, 1, 2), KB_SHAPE1(N), KB_F32);
    }
}

static void test_recv_async(void **state)
{
    kb_ctx *ctx = make_ctx();
    fx f;

    (void)state;
    fx_init(&f, 1, KB_MEM_TCM, k_async, 2);
    fx_link(&f, 0, KB_DIR_E, 1, KB_DIR_W);
    fx_link(&f, 1, KB_DIR_W, 0, KB_DIR_E);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), 0);
    float *out = read_out(&f);
    check_slot(out, 1, 0, 0, 0, 4.0f);
    check_slot(out, 1, 1, 0, 1, 0.0f);
    check_slot(out, 1, 2, 0, 2, 0.0f);
    for (int i = 0; i < N; i++) /* untouched: zeros */
        assert_true(out[(1 * NSLOT + 3) * N + i] == 0.0f);
    free(out);
    kb_ipcq_counters c1 = counters(ctx, 1, KB_DIR_W);
    assert_int_equal(c1.my_tail, 3);
    assert_int_equal(counters(ctx, 0, KB_DIR_E).peer_tail_cache, 3);
    kb_ctx_destroy(ctx);
}

/* A view holds its slot: on a one-slot queue the second message can only come once the view
 * is released, and the copy-out receive posted behind the view gets it then. */
static void k_view(kb_tl *tl, const kb_kargs *a)
{
    if (tl_program_id(tl, 0) == 0) {
        for (int k = 0; k < 3; k++)
            tl_send(tl, KB_DIR_E, tl_load(tl, in_at(a, 0, k), KB_SHAPE1(N), KB_F32));
        return;
    }
    kb_ipcq_req *r1 = tl_recv_view_async(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
    kb_ipcq_req *r2 = tl_recv_async(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
    kb_val v1 = tl_wait(tl, r1);
    kb_ipcq_counters c;
    if (kb_ipcq_counters_of(tl_ctx(tl), tl_pe(tl), KB_DIR_W, &c) != 0 || v1.scratch ||
        v1.pa != c.my_rx_base)
        tl_fail(tl, KB_ERR_STATE, "the view is not the receive slot");
    kb_val two = tl_full(tl, KB_SHAPE1(N), 2.0f);
    tl_store(tl, out_at(a, 1, 0), tl_add(tl, v1, tl_add(tl, two, two)));
    tl_recv_release(tl, KB_DIR_W, v1);
    tl_store(tl, out_at(a, 1, 1), tl_wait(tl, r2));
    /* a view that is no longer held cannot be released again */
    if (fx_of(a)->twice)
        tl_recv_release(tl, KB_DIR_W, v1);
    tl_recv_into(tl, KB_DIR_W, out_at(a, 1, 2), KB_SHAPE1(N), KB_F32);
}

static void test_recv_view(void **state)
{
    for (int twice = 0; twice < 2; twice++) {
        kb_ctx *ctx = make_ctx();
        fx f;
        (void)state;
        fx_init(&f, 1, KB_MEM_TCM, k_view, 2);
        f.twice = twice;
        fx_link(&f, 0, KB_DIR_E, 1, KB_DIR_W);
        fx_link(&f, 1, KB_DIR_W, 0, KB_DIR_E);
        if (twice) {
            assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), KB_ERR_INVAL);
            assert_non_null(strstr(kb_ctx_errmsg(ctx), "tl_recv_release W: the value is not "
                                                       "the oldest held view"));
            kb_ctx_destroy(ctx);
            continue;
        }
        assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), 0);
        float *out = read_out(&f);
        check_slot(out, 1, 0, 0, 0, 4.0f);
        check_slot(out, 1, 1, 0, 1, 0.0f);
        check_slot(out, 1, 2, 0, 2, 0.0f);
        free(out);
        assert_int_equal(counters(ctx, 1, KB_DIR_W).my_tail, 3);
        assert_int_equal(counters(ctx, 0, KB_DIR_E).peer_tail_cache, 3);
        kb_ctx_destroy(ctx);
    }
}

/* ---- deadlock report ---- */

static void k_only_recv(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    (void)tl_recv(tl, KB_DIR_W, KB_SHAPE1(N), KB_F32);
}

static void test_deadlock_report(void **state)
{
    kb_ctx *ctx = make_ctx();
    fx f;

    (void)state;
    fx_init(&f, 2, KB_MEM_TCM, k_only_recv, 2);
    fx_ring2(&f, 0, 1);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), KB_ERR_DEADLOCK);
    const char *msg = kb_ctx_errmsg(ctx);
    assert_non_null(strstr(msg, "ipcq recv W"));
    assert_non_null(strstr(msg, "my_head=0"));
    assert_non_null(strstr(msg, "peer_tail_cache"));
    assert_non_null(strstr(msg, "sip0/cube0/pe0"));
    kb_ctx_destroy(ctx);
}

/* A receive on a peer direction that nobody feeds: the report names the peer directions. */
static void k_peer_only_recv(kb_tl *tl, const kb_kargs *a)
{
    (void)a;
    if (tl_program_id(tl, 0) == 1)
        (void)tl_recv(tl, KB_DIR_PEER(2), KB_SHAPE1(N), KB_F32);
}

static void test_peer_deadlock_report(void **state)
{
    kb_ctx *ctx = make_ctx();
    fx f;

    (void)state;
    fx_init(&f, 2, KB_MEM_TCM, k_peer_only_recv, 3);
    fx_peer_links(&f);
    assert_int_equal(kb_ctx_run_host(ctx, h_run, &f), KB_ERR_DEADLOCK);
    const char *rep = kb_ctx_report(ctx);
    if (!strstr(rep, "ipcq recv peer") || !strstr(rep, "sip0/cube0/pe1 peer2      my_head=0") ||
        !strstr(rep, "sip0/cube0/pe0 peer5      my_head=0") ||
        !strstr(rep, "sip0/cube0/pe0 peer7      my_head=0") ||
        !strstr(rep, "sip0/cube0/pe0 E          my_head=0"))
        fail_msg("report: %s", rep);
    kb_ctx_destroy(ctx);
}

/* ---- ring all-reduce with one slot, every buffer kind ---- */

#define AR_WS 4
#define AR_N 48

typedef struct ar_case {
    kb_ipcq_cfg icfg;
    int ws;
    const char *module;
    const char *topo;  /* NULL = ring_1d */
    int64_t n;         /* 0 = AR_N, from in; else from big */
    const float *big;
    float in[AR_WS * AR_N];
    kb_ccl_job job;
} ar_case;

static int h_allreduce(kb_ctx *ctx, void *arg)
{
    ar_case *c = arg;
    int rc = kb_ccl_job_prepare(ctx, &c->job, kb_ccl_algo_find(c->module), c->module,
                                c->topo ? c->topo : "ring_1d", c->ws, c->n ? c->n : AR_N,
                                &c->icfg, c->n ? c->big : c->in);
    if (rc == 0)
        rc = kb_ccl_job_launch(ctx, &c->job, NULL, NULL);
    return rc;
}

static void test_ring_allreduce_one_slot(void **state)
{
    static const kb_mem_kind kinds[3] = { KB_MEM_TCM, KB_MEM_HBM, KB_MEM_SRAM };
    static const char *const modules[2] = { "ring_allreduce", "ring_rsag_allreduce" };
    static const int worlds[2] = { 2, AR_WS }; /* 2: E and W lead to the same peer */
    ar_case *c = calloc(1, sizeof *c);
    float out[AR_WS * AR_N];

    (void)state;
    assert_non_null(c);
    for (int t = 0; t < 2 * 2 * 3; t++) {
        int m = t / 6, w = (t / 3) % 2, k = t % 3, ws = worlds[w];
        kb_ctx *ctx = make_ctx();
        memset(c, 0, sizeof *c);
        c->ws = ws;
        c->module = modules[m];
        c->icfg = (kb_ipcq_cfg){ 1, AR_N * 4, kinds[k], 1, 1 };
        for (int r = 0; r < ws; r++)
            for (int i = 0; i < AR_N; i++)
                c->in[r * AR_N + i] = (float)((r * 7 + i * 3) % 17 - 8) * 0.25f;
        assert_int_equal(kb_ctx_run_host(ctx, h_allreduce, c), 0);
        assert_int_equal(kb_ccl_job_read(ctx, &c->job, out, NULL), 0);
        for (int r = 0; r < ws; r++) {
            for (int i = 0; i < AR_N; i++) {
                float want = 0.0f;
                for (int q = 0; q < ws; q++)
                    want += c->in[q * AR_N + i];
                if (out[r * AR_N + i] != want)
                    fail_msg("%s ws %d kind %d rank %d [%d] = %g, expected %g", modules[m], ws,
                             k, r, i, (double)out[r * AR_N + i], (double)want);
            }
        }
        /* every rank's E queue carried ws-1 (ring) or 2(ws-1) (rsag) messages, all credited */
        for (int r = 0; r < ws; r++) {
            kb_ipcq_counters cnt = counters(ctx, r, KB_DIR_E), in = counters(ctx, r, KB_DIR_W);
            assert_int_equal(cnt.my_head, m == 0 ? ws - 1 : 2 * (ws - 1));
            assert_int_equal(cnt.peer_tail_cache, cnt.my_head);
            assert_int_equal(in.my_tail, cnt.my_head);
            assert_int_equal(in.peer_head_cache, cnt.my_head);
        }
        kb_ctx_destroy(ctx);
    }
    free(c);
}

/*
 * The same collectives with messages longer than a slot: 16-byte slots (four f32 elements),
 * one or two of them, so every message is chunked and ring_rsag_allreduce takes its streamed
 * form (its chunks do not fit a slot). The sums must be exact, and every chunk credited.
 */
static void test_ring_allreduce_chunked(void **state)
{
    static const char *const modules[3] = { "ring_allreduce", "ring_rsag_allreduce",
                                            "hello_send" };
    static const int worlds[2] = { 2, AR_WS };
    ar_case *c = calloc(1, sizeof *c);
    float out[AR_WS * AR_N];

    (void)state;
    assert_non_null(c);
    for (int t = 0; t < 3 * 2 * 2; t++) {
        int m = t / 4, ws = worlds[(t / 2) % 2], slots = 1 + t % 2;
        kb_ctx *ctx = make_ctx();
        memset(c, 0, sizeof *c);
        c->ws = ws;
        c->module = modules[m];
        c->icfg = (kb_ipcq_cfg){ slots, 16, KB_MEM_TCM, 1, 1 };
        for (int r = 0; r < ws; r++)
            for (int i = 0; i < AR_N; i++)
                c->in[r * AR_N + i] = (float)((r * 5 + i * 7) % 23 - 11) * 0.5f;
        assert_int_equal(kb_ctx_run_host(ctx, h_allreduce, c), 0);
        assert_int_equal(kb_ccl_job_read(ctx, &c->job, out, NULL), 0);
        for (int r = 0; r < ws; r++) {
            for (int i = 0; i < AR_N; i++) {
                float want = 0.0f;
                if (m == 2) { /* hello_send: the west neighbour's tile */
                    want = c->in[((r + ws - 1) % ws) * AR_N + i];
                } else {
                    for (int q = 0; q < ws; q++)
                        want += c->in[q * AR_N + i];
                }
                if (out[r * AR_N + i] != want)
                    fail_msg("%s ws %d n_slots %d rank %d [%d] = %g, expected %g", modules[m],
                             ws, slots, r, i, (double)out[r * AR_N + i], (double)want);
            }
        }
        for (int r = 0; r < ws; r++) {
            kb_ipcq_counters snd = counters(ctx, r, KB_DIR_E), rcv = counters(ctx, r, KB_DIR_W);
            assert_true(snd.my_head > (uint64_t)(ws - 1)); /* more chunks than messages */
            assert_int_equal(snd.peer_tail_cache, snd.my_head);
            assert_int_equal(rcv.my_tail, rcv.peer_head_cache);
        }
        kb_ctx_destroy(ctx);
    }
    free(c);
}

/*
 * Every all-reduce streams a tile whose messages are longer than a slot: 16-byte slots force
 * it at AR_N (slices of a few elements; mesh: one block of many chunks), and a tile past
 * KB_CCL_STREAM_BYTES of f32 with 4 KiB slots runs as many slices and, for mesh, several
 * blocks, the last one short. The sums of these inputs are exact in f16, so every element
 * must equal the exact sum.
 */
static void test_allreduce_streamed(void **state)
{
    static const struct { const char *module, *topo; } algos[] = {
        { "ring_allreduce", "ring_1d" },          { "tree_allreduce", "tree_binary" },
        { "mesh_allreduce", "mesh_2d" },          { "hierarchical_allreduce", "hierarchical_3level" },
    };
    const int nalgos = (int)(sizeof algos / sizeof algos[0]);
    /* two blocks and an odd remainder */
    const int64_t big_n = (int64_t)(KB_CCL_STREAM_BYTES / 4u) + 1003;
    ar_case *c = calloc(1, sizeof *c);
    float *big = malloc((size_t)AR_WS * (size_t)big_n * sizeof *big);
    float *out = malloc((size_t)AR_WS * (size_t)big_n * sizeof *out);

    (void)state;
    assert_non_null(c);
    assert_non_null(big);
    assert_non_null(out);
    for (int64_t q = 0; q < AR_WS * big_n; q++)
        big[q] = (float)((q % big_n * 7 + q / big_n * 5) % 23 - 11) * 0.5f;
    /* per algorithm: small tile with 16-byte slots (n_slots 1 and 2), then the large tile with
     * 4 KiB slots and one slot; ring also on 2 ranks (E and W are the same peer) */
    for (int t = 0; t < nalgos * 3 + 1; t++) {
        int m = t < nalgos * 3 ? t / 3 : 0, v = t < nalgos * 3 ? t % 3 : 2;
        int ws = t < nalgos * 3 ? AR_WS : 2;
        int64_t n = v < 2 ? AR_N : big_n;
        const float *in;
        kb_ctx *ctx = make_ctx();

        memset(c, 0, sizeof *c);
        c->ws = ws;
        c->module = algos[m].module;
        c->topo = algos[m].topo;
        if (v < 2) {
            c->icfg = (kb_ipcq_cfg){ 1 + v, 16, KB_MEM_TCM, 1, 1 };
            for (int r = 0; r < ws; r++)
                for (int i = 0; i < AR_N; i++)
                    c->in[r * AR_N + i] = (float)((r * 5 + i * 7) % 23 - 11) * 0.5f;
            in = c->in;
        } else {
            c->icfg = (kb_ipcq_cfg){ 1, 4096, KB_MEM_TCM, 1, 1 };
            c->n = big_n;
            c->big = big;
            in = big;
        }
        assert_int_equal(kb_ctx_run_host(ctx, h_allreduce, c), 0);
        assert_int_equal(kb_ccl_job_read(ctx, &c->job, out, NULL), 0);
        for (int r = 0; r < ws; r++) {
            for (int64_t i = 0; i < n; i++) {
                float want = 0.0f;
                for (int q = 0; q < ws; q++)
                    want += in[q * n + i];
                if (out[r * n + i] != want)
                    fail_msg("%s ws %d n %lld slot %llu rank %d [%lld] = %g, expected %g",
                             algos[m].module, ws, (long long)n,
                             (unsigned long long)c->icfg.slot_size, r, (long long)i,
                             (double)out[r * n + i], (double)want);
            }
        }
        kb_ctx_destroy(ctx);
    }
    free(out);
    free(big);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dir_names),
        cmocka_unit_test(test_peer_directions),
        cmocka_unit_test(test_peer_unwired),
        cmocka_unit_test(test_peer_install_errors),
        cmocka_unit_test(test_ring2_direction_matching),
        cmocka_unit_test(test_backpressure_one_slot),
        cmocka_unit_test(test_backpressure_three_slots),
        cmocka_unit_test(test_placement_tcm),
        cmocka_unit_test(test_placement_hbm),
        cmocka_unit_test(test_placement_sram),
        cmocka_unit_test(test_install_errors),
        cmocka_unit_test(test_install_same_config_twice),
        cmocka_unit_test(test_unwired_direction),
        cmocka_unit_test(test_uninstalled_pe),
        cmocka_unit_test(test_send_strided_view),
        cmocka_unit_test(test_cross_sip_per_sip),
        cmocka_unit_test(test_cross_sip_credits),
        cmocka_unit_test(test_chunked_one_slot),
        cmocka_unit_test(test_chunked_window),
        cmocka_unit_test(test_recv_size_mismatch),
        cmocka_unit_test(test_recv_async),
        cmocka_unit_test(test_recv_view),
        cmocka_unit_test(test_deadlock_report),
        cmocka_unit_test(test_peer_deadlock_report),
        cmocka_unit_test(test_ring_allreduce_one_slot),
        cmocka_unit_test(test_ring_allreduce_chunked),
        cmocka_unit_test(test_allreduce_streamed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
