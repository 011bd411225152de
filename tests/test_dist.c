/*
 * test_dist — the rank = SIP distributed runtime (kb_dist.h over kb_spawn): world size and
 * ranks of the process group, placement of a rank's tensors on its SIP, the intercube install
 * plan's wiring (exact peers and reverse rings on the default 4x4 cube mesh, the SIP grid of
 * torus_2d / mesh_2d_no_wrap), all_reduce results for intercube_allreduce over ring_1d,
 * torus_2d and mesh_2d_no_wrap and for hierarchical_allreduce, all_gather / reduce_scatter
 * against the layouts kb_dist.h documents (both wirings, 1-4 SIPs on ring_1d, torus_2d and
 * mesh_2d_no_wrap, messages longer than a 4 KiB slot, intercube with a moved root cube),
 * broadcast / reduce, all_to_all (values against the host rule and inter-SIP bytes against
 * the closed form of docs/distributed.md, rings and chains, 1-6 SIPs), send / recv (pairs 1-3
 * hops apart, a pair's messages in order, a pipeline through every rank, two pairs at once,
 * bytes = hops x tensor; a mismatched shape, a tensor off its SIP, a self / out-of-range
 * peer, a recv without a send ending as a deadlock report naming it), all_reduce_shards (each
 * shard summed over 1-4 SIPs only, in the ring and the small form (the choice asserted per
 * case), as an epoch and as a stage of each rank's own launch, inter-SIP bytes against each
 * form's closed form, its refusals either way: another process group, f16, a shard that does
 * not split, no room for the rings),
 * and the error paths (mismatched collectives, a
 * second join of an open epoch, unsupported op / backend / algorithm, collectives before init
 * or outside a worker, a failing worker stopping the run), and the rank = SIP registry: every
 * entry's all_reduce on seeded position-dependent data (kb_ccl_inputs, one tile per shard)
 * checked with kb_ccl_verify against the entry's host reference. Data are chosen so every
 * partial sum is exact in f32, so results are compared for exact equality. Most
 * cases run on a small machine (2x2 cubes of 2 PEs) to stay fast; the wiring and one
 * all_reduce use the default 4x4 mesh. Limits: no timing is asserted (bench_ccl and
 * test_ipcq cover time); every context is destroyed so the ASan build checks for leaks.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_ccl_config.h"
#include "kb_ccl_reg.h"
#include "kb_dist.h"
#include "kb_dist_coll.h"
#include "kb_dist_algo.h"
#include "kb_dtype.h"
#include "kb_ipcq.h"
#include "kb_runtime.h"
#include "kb_sim.h"

#include "kb_test_util.h"

#define MAXR 8
#define MAXE 16384 /* elements of the largest per-rank host buffer */

/* ---- contexts ---- */

/*
 * A reference-device context of `sips` SIPs linked by `topo`; small = 2x2 cubes of 2 PEs,
 * else the default 4x4 mesh of 8 PEs. algo sets ccl.defaults.algorithm in a ccl config
 * attached to the context (NULL attaches none and keeps the shipped default, which has no
 * rank = SIP form). Owner: the caller (kb_ctx_destroy).
 */
static kb_ctx *make_ctx(int sips, const char *topo, int small, const char *algo)
{
    char count[64], link[96], algorithm[128];
    const char *sets[] = { count, link, "sip.cube_mesh.width=2", "sip.cube_mesh.height=2",
                           "cube.corners=1", "cube.pe_per_corner=2" };
    const char *ccl_sets[] = { algorithm };
    kb_ctx *ctx;

    snprintf(count, sizeof count, "system.sips.count=%d", sips);
    snprintf(link, sizeof link, "system.sips.topology=%s", topo);
    /* the default mesh takes the first two assignments only */
    ctx = kbt_ctx_new(sets, small ? sizeof sets / sizeof sets[0] : 2,
                      &(kb_ctx_opts){ .device = KB_DEV_REF });
    if (algo) {
        snprintf(algorithm, sizeof algorithm, "ccl.defaults.algorithm=%s", algo);
        kbt_ccl_attach(ctx, ccl_sets, 1);
    }
    return ctx;
}

/* ---- rank workers ---- */

typedef struct job job;
typedef int (*body_fn)(kb_ctx *ctx, int rank, job *j);

/* Shared by the host program, every worker and the checks after the run (owned by the test). */
struct job {
    int nprocs;
    const char *backend;      /* NULL = "ahbm" */
    const char *algo;         /* init_process_group's algorithm; NULL = ccl.defaults */
    int skip_init;            /* body runs before any init_process_group */
    body_fn body;             /* after init; NULL = nothing */
    int64_t m, n;             /* rows per shard, columns */
    int pattern;              /* 0: rank r holds r+1; 1: (r+1)(q+1)/8 + column; 2: seeded
                                 (kb_ccl_inputs, shard p of rank r is tile r*S + p) */
    int repeat;               /* all_reduce a second tensor after a barrier */
    int fail_rank;            /* worker error scenarios: the rank that fails */
    int sleeper;              /* ... and rank 0 sleeps past the failure instead of waiting */
    kb_dist_op op;            /* op of the unsupported-op case */
    int root;                 /* broadcast / reduce: the root rank */
    int p2p;                  /* send/recv scenario (body_p2p) */
    int src, dst;             /* ... its pair */
    int64_t bad_cols;         /* ... the receiver's columns in the mismatch case */
    int lanes;                /* all_reduce_shards over the first `lanes` PEs (0: every PE) */
    int as_stage;             /* ... as a stage of each rank's own launch (kb_launch_seq) */
    kb_tensor *t[MAXR], *u[MAXR];
    int rank_seen[MAXR], ws_seen[MAXR], nprocs_seen[MAXR], after[MAXR];
    int host_rc;              /* what a host-side call after kb_spawn returned */
    /* Host staging buffers per rank (two per rank). They live here, not on the heap of a
     * worker, because a failing rank stops the run and the others' fibers never resume to
     * free what they hold. */
    float buf[MAXR][2][MAXE];
    float *big[MAXR][2]; /* larger staging buffers of big_n elements (the case's, or NULL) */
    int64_t big_n;
};

static int worker(kb_ctx *ctx, int rank, void *arg)
{
    job *j = arg;
    int rc;
    if (j->skip_init)
        return j->body(ctx, rank, j);
    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||
        (rc = kb_dist_init_process_group(ctx, j->backend ? j->backend : "ahbm", j->algo)) != 0)
        return rc;
    j->rank_seen[rank] = kb_dist_get_rank(ctx);
    j->ws_seen[rank] = kb_dist_get_world_size(ctx);
    j->nprocs_seen[rank] = kb_ctx_nprocs(ctx);
    return j->body ? j->body(ctx, rank, j) : 0;
}

static int host_spawn(kb_ctx *ctx, void *arg)
{
    job *j = arg;
    return kb_spawn(ctx, worker, j, j->nprocs);
}

static void run_ok(kb_ctx *ctx, job *j)
{
    int rc = kb_ctx_run_host(ctx, host_spawn, j);
    if (rc != 0)
        fail_msg("run: %d %s", rc, kb_ctx_errmsg(ctx));
}

/* Runs a job that must fail with `code` and a message containing `want`. */
static void run_fails(kb_ctx *ctx, job *j, int code, const char *want)
{
    int rc = kb_ctx_run_host(ctx, host_spawn, j);
    if (rc != code || !strstr(kb_ctx_errmsg(ctx), want))
        fail_msg("expected %d with \"%s\", got %d: %s", code, want, rc, kb_ctx_errmsg(ctx));
}

/* Value of element (row q, column i) of rank r's input (patterns 0 and 1). */
static double val(int pattern, int r, int64_t q, int64_t i)
{
    return pattern == 0 ? (double)(r + 1) : (r + 1) * (double)(q + 1) / 8.0 + (double)i;
}

#define SEED 7u

/* Pattern 2: row q of rank r (S shards of m rows of n) is in shard q / m, the tile r*S + q/m. */
static float seeded(const job *j, int S, int r, int64_t q, int64_t i)
{
    return kb_ccl_input(SEED, (int64_t)r * S + q / j->m, (q % j->m) * j->n + i, j->m * j->n);
}

/* A rank's staging buffer `which` for rows x cols elements; NULL when it does not fit (no
 * cmocka assert here: it would longjmp out of a fiber). */
static float *stage(job *j, int rank, int which, int64_t rows, int64_t cols)
{
    if (rank < MAXR && j->big[rank][which])
        return rows * cols <= j->big_n ? j->big[rank][which] : NULL;
    return rank < MAXR && rows * cols <= MAXE ? j->buf[rank][which] : NULL;
}

/* Gives every rank of j staging buffers of n elements (freed by big_free, after the run). */
static void big_alloc(job *j, int64_t n)
{
    j->big_n = n;
    for (int r = 0; r < j->nprocs; r++)
        for (int w = 0; w < 2; w++) {
            j->big[r][w] = malloc(sizeof(float) * (size_t)n);
            assert_non_null(j->big[r][w]);
        }
}

static void big_free(job *j)
{
    for (int r = 0; r < MAXR; r++)
        for (int w = 0; w < 2; w++)
            free(j->big[r][w]);
}

static int too_big(kb_ctx *ctx)
{
    return kb_err_set(kb_ctx_err(ctx), KB_ERR_RANGE, "test staging buffer too small");
}

/* A rows x cols f16 tensor on the calling rank's SIP holding val(pattern, rank, q, i). */
static int make_tensor(kb_ctx *ctx, job *j, int rank, int64_t rows, int64_t cols,
                       kb_dp_policy dp, kb_tensor **out)
{
    float *data = stage(j, rank, 0, rows, cols);
    if (!data)
        return too_big(ctx);
    for (int64_t q = 0; q < rows; q++)
        for (int64_t i = 0; i < cols; i++)
            data[q * cols + i] = j->pattern == 2 ? seeded(j, (int)(rows / j->m), rank, q, i)
                                                 : (float)val(j->pattern, rank, q, i);
    kb_tensor_desc d = { "x", rows, cols, KB_F16, dp, KB_MEM_HBM };
    return kb_tensor_from_host(ctx, &d, data, out);
}

static int body_place(kb_ctx *ctx, int rank, job *j)
{
    kb_tensor_desc d = { "p", kb_dist_shards_per_rank(ctx) * j->m, j->n, KB_F16,
                         kb_dist_policy(ctx), KB_MEM_HBM };
    return kb_tensor_zeros(ctx, &d, &j->t[rank]);
}

static int body_allreduce(kb_ctx *ctx, int rank, job *j)
{
    int64_t rows = kb_dist_shards_per_rank(ctx) * j->m;
    int rc = make_tensor(ctx, j, rank, rows, j->n, kb_dist_policy(ctx), &j->t[rank]);
    if (rc == 0)
        rc = kb_dist_all_reduce(ctx, j->t[rank], KB_DIST_SUM);
    if (rc == 0 && j->repeat) {
        /* a second epoch after a barrier: same data, a fresh tensor */
        rc = make_tensor(ctx, j, rank, rows, j->n, kb_dist_policy(ctx), &j->u[rank]);
        if (rc == 0)
            rc = kb_dist_barrier(ctx);
        if (rc == 0)
            rc = kb_dist_all_reduce(ctx, j->u[rank], KB_DIST_SUM);
    }
    return rc;
}

/* Asserts that want is exact in f16 and that got equals it. */
static void expect_exact(float got, double want, const char *what, int r, int64_t q, int64_t i)
{
    float w = (float)want;
    assert_true((double)w == want);
    assert_true(kb_f16_to_f32(kb_f32_to_f16(w)) == w);
    if (got != w)
        fail_msg("%s: rank %d [%lld][%lld]: got %g, expected %g", what, r, (long long)q,
                 (long long)i, (double)got, want);
}

/* Every block of m rows of every rank's t must be the sum over all ranks' blocks. */
static void check_allreduce(kb_ctx *ctx, job *j, kb_tensor **t, int ws)
{
    int S = kb_dist_shards_per_rank(ctx);
    int64_t rows = S * j->m, n = j->n;
    float *got = malloc(sizeof *got * (size_t)(rows * n));
    assert_non_null(got);
    for (int r = 0; r < ws; r++) {
        assert_non_null(t[r]);
        assert_int_equal(kb_tensor_nshards(t[r]), S);
        assert_int_equal(kb_tensor_read(t[r], got), 0);
        for (int64_t q = 0; q < rows; q++)
            for (int64_t i = 0; i < n; i++) {
                double want = 0.0;
                for (int rr = 0; rr < ws; rr++)
                    for (int p = 0; p < S; p++)
                        want += val(j->pattern, rr, p * j->m + q % j->m, i);
                expect_exact(got[q * n + i], want, "all_reduce", r, q, i);
            }
    }
    free(got);
}

/*
 * Pattern 2: every shard of every rank against the process group entry's reference over all
 * ws*S shards (kb_ccl_verify, exact), as the ccl_allreduce bench checks it.
 */
static void check_seeded(kb_ctx *ctx, job *j, int ws)
{
    const kb_ccl_algo_impl *algo = kb_dist_algo_of(ctx);
    int S = kb_dist_shards_per_rank(ctx);
    int64_t tile = j->m * j->n;
    size_t total = (size_t)ws * (size_t)S * (size_t)tile;
    float *in = malloc(total * sizeof *in), *got = malloc(total * sizeof *got);
    double *ref = malloc(total * sizeof *ref);
    uint16_t *raw = malloc(total * sizeof *raw);
    kb_ccl_verdict v;

    assert_non_null(algo);
    assert_true(in && got && ref && raw);
    kb_ccl_inputs(in, SEED, 0, ws * S, tile);
    for (int r = 0; r < ws; r++)
        assert_int_equal(kb_tensor_read(j->t[r], got + (size_t)r * (size_t)S * (size_t)tile), 0);
    for (size_t k = 0; k < total; k++)
        raw[k] = kb_f32_to_f16(got[k]);
    algo->sip->reference(in, ws * S, tile, ref);
    if (!kb_ccl_verify(KB_F16, raw, ref, ws * S, tile, 0.0, &v))
        fail_msg("%s ws=%d: shard %d of rank %d, element %lld = %g, expected %g",
                 algo->module, ws, v.first_bad_tile % S, v.first_bad_tile / S,
                 (long long)v.first_bad_elem, v.first_got, v.first_want);
    /* an element out of place inside one shard is caught */
    size_t a = (size_t)(ws * S - 1) * (size_t)tile, b = a + 1;
    while (b < total && raw[b] == raw[a])
        b++;
    assert_true(b < total);
    uint16_t tmp = raw[a];
    raw[a] = raw[b];
    raw[b] = tmp;
    assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, ws * S, tile, 0.0, &v), 0);
    assert_int_equal(v.first_bad_tile, ws * S - 1);
    free(in);
    free(got);
    free(ref);
    free(raw);
}

/* ---- world, ranks, placement ---- */

static void test_world_and_ranks(void **state)
{
    (void)state;
    for (int sips = 2; sips <= 4; sips += 2) {
        kb_ctx *ctx = make_ctx(sips, "ring_1d", 1, "intercube_allreduce");
        job j = { .nprocs = sips, .body = body_place, .m = 1, .n = 4 };
        kb_machine *m = kb_ctx_machine(ctx);
        assert_int_equal(kb_dist_get_world_size(ctx), -1);
        assert_null(kb_dist_algorithm(ctx));
        run_ok(ctx, &j);
        assert_int_equal(kb_dist_get_world_size(ctx), sips);
        assert_int_equal(kb_dist_get_rank(ctx), -1); /* not a worker */
        assert_string_equal(kb_dist_algorithm(ctx), "intercube_allreduce");
        assert_int_equal(kb_dist_shards_per_rank(ctx), 4);
        for (int r = 0; r < sips; r++) {
            assert_int_equal(j.ws_seen[r], sips);
            assert_int_equal(j.rank_seen[r], r);
            assert_int_equal(j.nprocs_seen[r], sips);
            /* intercube: one shard per cube, on its PE 0, on the rank's SIP */
            assert_int_equal(kb_tensor_nshards(j.t[r]), (size_t)m->ncubes);
            for (size_t i = 0; i < kb_tensor_nshards(j.t[r]); i++) {
                const kb_shard_spec *s = kb_tensor_shard(j.t[r], i);
                assert_int_equal(s->sip, (unsigned)r);
                assert_int_equal(s->cube, (unsigned)i);
                assert_int_equal(s->pe, 0);
            }
        }
        kb_ctx_destroy(ctx);
    }
}

static void test_placement_hierarchical(void **state)
{
    kb_ctx *ctx = make_ctx(2, "ring_1d", 1, NULL);
    job j = { .nprocs = 2, .algo = "hierarchical_allreduce", .body = body_place, .m = 2, .n = 4 };
    (void)state;
    run_ok(ctx, &j);
    assert_string_equal(kb_dist_algorithm(ctx), "hierarchical_allreduce");
    assert_int_equal(kb_dist_shards_per_rank(ctx), 8); /* 4 cubes x 2 PEs */
    for (int r = 0; r < 2; r++) {
        assert_int_equal(j.rank_seen[r], r);
        assert_int_equal(kb_tensor_nshards(j.t[r]), 8);
        for (size_t i = 0; i < 8; i++) {
            const kb_shard_spec *s = kb_tensor_shard(j.t[r], i);
            assert_int_equal(s->sip, (unsigned)r);
            assert_int_equal(s->cube, (unsigned)(i / 2));
            assert_int_equal(s->pe, (unsigned)(i % 2));
            assert_int_equal(s->row0, 2 * i);
            assert_int_equal(s->rows, 2);
        }
    }
    kb_ctx_destroy(ctx);
}

/* ---- intercube wiring ---- */

#define BIT(d) (1u << (d))

static kb_pe_hw *pe0(kb_ctx *ctx, int sip, int cube)
{
    return kb_machine_pe(kb_ctx_machine(ctx), (unsigned)sip, (unsigned)cube, 0);
}

/* sip/cube's PE 0 sends on `d` into psip/pcube's PE 0 ring of `pd`. */
static void expect_link(kb_ctx *ctx, int sip, int cube, kb_dir d, int psip, int pcube, kb_dir pd)
{
    kb_ipcq_counters c, back;
    if (kb_ipcq_counters_of(ctx, pe0(ctx, sip, cube), d, &c) != 0)
        fail_msg("SIP %d cube %d: %s not wired", sip, cube, kb_dir_name(d));
    if (c.peer != pe0(ctx, psip, pcube))
        fail_msg("SIP %d cube %d %s: wrong peer (expected SIP %d cube %d)", sip, cube,
                 kb_dir_name(d), psip, pcube);
    assert_int_equal(kb_ipcq_counters_of(ctx, c.peer, pd, &back), 0);
    if (back.my_rx_base != c.peer_rx_base)
        fail_msg("SIP %d cube %d %s does not feed the peer's %s ring", sip, cube,
                 kb_dir_name(d), kb_dir_name(pd));
    assert_int_equal(c.my_head, 0);
    assert_int_equal(c.peer_tail_cache, 0);
}

static void test_wiring_ring_default_mesh(void **state)
{
    kb_ctx *ctx = make_ctx(2, "ring_1d", 0, "intercube_allreduce");
    job j = { .nprocs = 2 };
    kb_machine *m = kb_ctx_machine(ctx);
    const uint32_t g = BIT(KB_DIR_GLOBAL_E) | BIT(KB_DIR_GLOBAL_W);
    kb_ipcq_counters c;
    (void)state;
    assert_int_equal(m->mesh_w, 4);
    assert_int_equal(m->mesh_h, 4);
    run_ok(ctx, &j);
    for (int s = 0; s < 2; s++) {
        /* corner cube 0: E and S only inside the mesh */
        assert_int_equal(kb_ipcq_wired(ctx, pe0(ctx, s, 0)), BIT(KB_DIR_E) | BIT(KB_DIR_S) | g);
        expect_link(ctx, s, 0, KB_DIR_E, s, 1, KB_DIR_W);
        expect_link(ctx, s, 0, KB_DIR_S, s, 4, KB_DIR_N);
        assert_int_equal(kb_ipcq_counters_of(ctx, pe0(ctx, s, 0), KB_DIR_W, &c), KB_ERR_DIRECTION);
        assert_int_equal(kb_ipcq_counters_of(ctx, pe0(ctx, s, 0), KB_DIR_N, &c), KB_ERR_DIRECTION);
        /* inner cube 5: all four */
        assert_int_equal(kb_ipcq_wired(ctx, pe0(ctx, s, 5)),
                         BIT(KB_DIR_N) | BIT(KB_DIR_S) | BIT(KB_DIR_E) | BIT(KB_DIR_W) | g);
        expect_link(ctx, s, 5, KB_DIR_N, s, 1, KB_DIR_S);
        expect_link(ctx, s, 5, KB_DIR_S, s, 9, KB_DIR_N);
        expect_link(ctx, s, 5, KB_DIR_E, s, 6, KB_DIR_W);
        expect_link(ctx, s, 5, KB_DIR_W, s, 4, KB_DIR_E);
        /* root cube 15: N and W */
        assert_int_equal(kb_ipcq_wired(ctx, pe0(ctx, s, 15)), BIT(KB_DIR_N) | BIT(KB_DIR_W) | g);
        expect_link(ctx, s, 15, KB_DIR_N, s, 11, KB_DIR_S);
        expect_link(ctx, s, 15, KB_DIR_W, s, 14, KB_DIR_E);
        for (int cube = 0; cube < 16; cube++) {
            /* every cube's PE 0 reaches the same cube of the other SIP both ways ... */
            expect_link(ctx, s, cube, KB_DIR_GLOBAL_E, 1 - s, cube, KB_DIR_GLOBAL_W);
            expect_link(ctx, s, cube, KB_DIR_GLOBAL_W, 1 - s, cube, KB_DIR_GLOBAL_E);
            assert_int_equal(kb_ipcq_wired(ctx, pe0(ctx, s, cube)) &
                                 (BIT(KB_DIR_GLOBAL_N) | BIT(KB_DIR_GLOBAL_S)), 0);
            /* ... through two different rings of the same peer */
            kb_ipcq_counters e, w;
            assert_int_equal(kb_ipcq_counters_of(ctx, pe0(ctx, s, cube), KB_DIR_GLOBAL_E, &e), 0);
            assert_int_equal(kb_ipcq_counters_of(ctx, pe0(ctx, s, cube), KB_DIR_GLOBAL_W, &w), 0);
            assert_true(e.peer_rx_base != w.peer_rx_base);
            /* only PE 0 takes part */
            for (int p = 1; p < m->npes; p++)
                assert_int_equal(kb_ipcq_wired(ctx, kb_machine_pe(m, (unsigned)s,
                                                                   (unsigned)cube, (unsigned)p)), 0);
        }
    }
    /* the root's global_E of SIP 0 leads to SIP 1's root */
    assert_int_equal(kb_ipcq_counters_of(ctx, pe0(ctx, 0, 15), KB_DIR_GLOBAL_E, &c), 0);
    assert_ptr_equal(c.peer, pe0(ctx, 1, 15));
    kb_ctx_destroy(ctx);
}

static void test_wiring_sip_grids(void **state)
{
    (void)state;
    /* torus_2d, 4 SIPs: a 2x2 grid that wraps, so N and S both lead to the other row */
    kb_ctx *ctx = make_ctx(4, "torus_2d", 1, "intercube_allreduce");
    job j = { .nprocs = 4 };
    run_ok(ctx, &j);
    assert_int_equal(kb_ctx_machine(ctx)->sip_grid_w, 2);
    assert_int_equal(kb_ctx_machine(ctx)->sip_grid_h, 2);
    for (int cube = 0; cube < 4; cube++) {
        expect_link(ctx, 0, cube, KB_DIR_GLOBAL_E, 1, cube, KB_DIR_GLOBAL_W);
        expect_link(ctx, 0, cube, KB_DIR_GLOBAL_W, 1, cube, KB_DIR_GLOBAL_E);
        expect_link(ctx, 0, cube, KB_DIR_GLOBAL_N, 2, cube, KB_DIR_GLOBAL_S);
        expect_link(ctx, 0, cube, KB_DIR_GLOBAL_S, 2, cube, KB_DIR_GLOBAL_N);
        expect_link(ctx, 3, cube, KB_DIR_GLOBAL_E, 2, cube, KB_DIR_GLOBAL_W);
        expect_link(ctx, 3, cube, KB_DIR_GLOBAL_N, 1, cube, KB_DIR_GLOBAL_S);
        for (int s = 0; s < 4; s++)
            assert_int_equal(kb_ipcq_wired(ctx, pe0(ctx, s, cube)) >> KB_DIR_GLOBAL_E, 0xf);
    }
    /* 2x2 cube mesh: cube 3 (the root) has N and W */
    assert_int_equal(kb_ipcq_wired(ctx, pe0(ctx, 2, 3)) & 0xf, BIT(KB_DIR_N) | BIT(KB_DIR_W));
    kb_ctx_destroy(ctx);

    /* mesh_2d_no_wrap, 4 SIPs: the grid's edges have no global links */
    ctx = make_ctx(4, "mesh_2d_no_wrap", 1, "intercube_allreduce");
    job k = { .nprocs = 4 };
    run_ok(ctx, &k);
    for (int cube = 0; cube < 4; cube++) {
        assert_int_equal(kb_ipcq_wired(ctx, pe0(ctx, 0, cube)) >> KB_DIR_GLOBAL_E,
                         BIT(0) | BIT(3)); /* global_E, global_S */
        assert_int_equal(kb_ipcq_wired(ctx, pe0(ctx, 3, cube)) >> KB_DIR_GLOBAL_E,
                         BIT(1) | BIT(2)); /* global_W, global_N */
        expect_link(ctx, 0, cube, KB_DIR_GLOBAL_E, 1, cube, KB_DIR_GLOBAL_W);
        expect_link(ctx, 0, cube, KB_DIR_GLOBAL_S, 2, cube, KB_DIR_GLOBAL_N);
        expect_link(ctx, 3, cube, KB_DIR_GLOBAL_W, 2, cube, KB_DIR_GLOBAL_E);
        expect_link(ctx, 3, cube, KB_DIR_GLOBAL_N, 1, cube, KB_DIR_GLOBAL_S);
    }
    kb_ctx_destroy(ctx);
}

/* ---- all_reduce ---- */

static void allreduce_case(int sips, const char *topo, int small, const char *algo, int pattern,
                           int64_t m, int64_t n, int repeat)
{
    kb_ctx *ctx = make_ctx(sips, topo, small, algo);
    job j = { .nprocs = sips, .body = body_allreduce, .m = m, .n = n, .pattern = pattern,
              .repeat = repeat };
    run_ok(ctx, &j);
    check_allreduce(ctx, &j, j.t, sips);
    if (repeat)
        check_allreduce(ctx, &j, j.u, sips);
    assert_true(kb_dist_comm_time(ctx) > 0);
    kb_ctx_destroy(ctx);
}

static void test_allreduce_ring(void **state)
{
    (void)state;
    /* default mesh: 16 cubes x (1 + 2) = 48 everywhere; then per-cube distinct values */
    allreduce_case(2, "ring_1d", 0, "intercube_allreduce", 0, 1, 8, 0);
    allreduce_case(2, "ring_1d", 0, "intercube_allreduce", 1, 1, 8, 0);
    allreduce_case(4, "ring_1d", 1, "intercube_allreduce", 1, 1, 8, 1);
}

static void test_allreduce_torus(void **state)
{
    (void)state;
    allreduce_case(4, "torus_2d", 1, "intercube_allreduce", 0, 1, 8, 0);
    allreduce_case(4, "torus_2d", 1, "intercube_allreduce", 1, 1, 8, 1);
    allreduce_case(6, "torus_2d", 1, "intercube_allreduce", 1, 1, 4, 0); /* 3x2 grid */
}

static void test_allreduce_mesh_no_wrap(void **state)
{
    (void)state;
    allreduce_case(4, "mesh_2d_no_wrap", 1, "intercube_allreduce", 0, 1, 8, 0);
    allreduce_case(4, "mesh_2d_no_wrap", 1, "intercube_allreduce", 1, 1, 8, 1);
    allreduce_case(6, "mesh_2d_no_wrap", 1, "intercube_allreduce", 1, 1, 4, 0);
}

static void test_allreduce_hierarchical(void **state)
{
    (void)state;
    /* one 2 x n block per PE (8 PEs per SIP) */
    allreduce_case(2, "ring_1d", 1, "hierarchical_allreduce", 1, 2, 4, 1);
    allreduce_case(4, "torus_2d", 1, "hierarchical_allreduce", 0, 1, 4, 0);
}

/* ---- all_reduce shard by shard (the lane rings) ---- */

static kb_ctx *gather_ctx(int sips, const char *topo, const char *algo, int slot, int root);

/* Element i of shard p of rank r: small integers, so every sum is exact in f32. */
static double shard_in(int r, int p, int64_t i)
{
    return (double)((r * 37 + p * 11 + i * 3) % 97) - 48.0;
}

/* The shards all_reduce_shards works on: every PE's, or the first j->lanes PEs'. */
static int shards_of(kb_ctx *ctx, const job *j)
{
    return j->lanes ? j->lanes : kb_dist_shards_per_rank(ctx);
}

static int body_shards(kb_ctx *ctx, int rank, job *j)
{
    int S = shards_of(ctx, j), npes = kb_ctx_machine(ctx)->npes;
    int64_t rows = S * j->m;
    float *data = stage(j, rank, 0, rows, j->n);
    if (!data)
        return too_big(ctx);
    for (int64_t q = 0; q < rows; q++)
        for (int64_t i = 0; i < j->n; i++)
            data[q * j->n + i] = (float)shard_in(rank, (int)(q / j->m), (q % j->m) * j->n + i);
    kb_dp_policy pol = !j->lanes ? kb_dist_policy(ctx)
                       : S <= npes ? kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, 1, S)
                                   : kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, S / npes, npes);
    kb_tensor_desc d = { "x", rows, j->n, j->pattern ? KB_F16 : KB_F32, pol, KB_MEM_HBM };
    int rc = kb_tensor_from_host(ctx, &d, data, &j->t[rank]);
    if (rc || !j->as_stage)
        return rc ? rc : kb_dist_all_reduce_shards(ctx, j->t[rank]);
    kb_stage st;
    if ((rc = kb_dist_all_reduce_shards_stage(ctx, j->t[rank], &st)) != 0)
        return rc;
    return kb_launch_seq(ctx, "ars", &st, 1, NULL);
}

/* Every rank's shard p ends as the sum of shard p over the ranks (not over the shards); the
 * lanes' rings send 2 (ws - 1) units of n/ws f32 per PE and rank, or in the small form
 * (kb_dist_lanes_small, `small` says which the case takes) the whole block ws - 1 times
 * (lanes: over the first `lanes` PEs only, 0 every PE). */
static void shards_case_as(int sips, const char *topo, int64_t m, int64_t n, int slot,
                           int lanes, int small, int as_stage)
{
    kb_ctx *ctx = gather_ctx(sips, topo, "hierarchical_allreduce", slot, -1);
    job j = { .nprocs = sips, .body = body_shards, .m = m, .n = n, .lanes = lanes,
              .as_stage = as_stage };
    int S = shards_of(ctx, &j);
    if (S * m * n > MAXE)
        big_alloc(&j, S * m * n);
    run_ok(ctx, &j);
    int64_t rows = S * m, blk = m * n;
    uint64_t calls, bytes;
    kb_dist_traffic(ctx, KB_COLL_ALLREDUCE, &calls, &bytes);
    assert_int_equal(calls, 1);
    assert_int_equal(kb_dist_lanes_small(kb_ctx_machine(ctx), sips, S, (uint64_t)blk), small);
    assert_int_equal(bytes, sips < 2 ? 0 : (uint64_t)sips * (uint64_t)S * (uint64_t)(sips - 1) *
                                           4u * (small ? (uint64_t)blk
                                                       : 2u * (uint64_t)(blk / sips)));
    float *got = malloc(sizeof *got * (size_t)(rows * n));
    assert_non_null(got);
    for (int r = 0; r < sips; r++) {
        assert_int_equal(kb_tensor_read(j.t[r], got), 0);
        for (int64_t q = 0; q < rows; q++)
            for (int64_t i = 0; i < n; i++) {
                double want = 0.0;
                for (int rr = 0; rr < sips; rr++)
                    want += shard_in(rr, (int)(q / m), (q % m) * n + i);
                expect_exact(got[q * n + i], want, "all_reduce_shards", r, q, i);
            }
    }
    free(got);
    big_free(&j);
    kb_ctx_destroy(ctx);
}

static void shards_case_lanes(int sips, const char *topo, int64_t m, int64_t n, int slot,
                              int lanes, int small)
{
    shards_case_as(sips, topo, m, n, slot, lanes, small, 0);
}

static void shards_case(int sips, const char *topo, int64_t m, int64_t n, int slot, int small)
{
    shards_case_lanes(sips, topo, m, n, slot, 0, small);
}

static void test_all_reduce_shards(void **state)
{
    (void)state;
    /* the first lanes only (the test machine: 4 cubes of 2 PEs): PE 0, cube 0's two PEs,
     * two whole cubes; latency-bound blocks take the small form, the last case the ring */
    shards_case_lanes(4, "ring_1d", 1, 8, 0, 1, 1);
    shards_case_lanes(3, "ring_1d", 2, 6, 0, 2, 1);
    shards_case_lanes(2, "ring_1d", 1, 4, 0, 4, 1);
    shards_case(2, "ring_1d", 2, 6, 0, 1);
    shards_case(3, "ring_1d", 1, 9, 0, 1);
    shards_case(4, "torus_2d", 3, 8, 0, 1);
    shards_case(4, "ring_1d", 4, 512, 4096, 1); /* several slots of 4 KiB a block */
    /* bandwidth-bound (8 lanes of 32 KiB): the ring, units of 8 KiB in two slots each */
    shards_case(4, "ring_1d", 4, 2048, 4096, 0);
    shards_case(1, "ring_1d", 2, 4, 0, 0);      /* one rank: the tensor stays as it is */
    /* as a stage of each rank's own launch (kb_dist_all_reduce_shards_stage): the same sums
     * and, counted in closed form, the same traffic, in both forms */
    shards_case_as(4, "ring_1d", 1, 8, 0, 1, 1, 1);
    shards_case_as(3, "ring_1d", 1, 9, 0, 0, 1, 1);
    shards_case_as(4, "ring_1d", 4, 2048, 4096, 0, 0, 1);
}

static void test_all_reduce_shards_errors(void **state)
{
    (void)state;
    struct {
        const char *algo;
        int slot, f16;
        int64_t n;
        int code;
        const char *want;
    } c[] = {
        { "intercube_allreduce", 0, 0, 4, KB_ERR_UNSUPPORTED, "has no lane rings" },
        { "hierarchical_allreduce", 0, 1, 4, KB_ERR_UNSUPPORTED, "f16 tensors (f32 only)" },
        { "hierarchical_allreduce", 0, 0, 3, KB_ERR_USAGE, "3 elements does not split over 2" },
        /* 4 slots of 320 KiB: a leader's six rings fit its 8 MiB area, eight would not */
        { "hierarchical_allreduce", 327680, 0, 4, KB_ERR_UNSUPPORTED, "lower slot_size" },
    };
    for (size_t k = 0; k < 2 * (sizeof c / sizeof c[0]); k++) { /* an epoch, then a stage */
        size_t i = k % (sizeof c / sizeof c[0]);
        kb_ctx *ctx = gather_ctx(2, "ring_1d", c[i].algo, c[i].slot, -1);
        job j = { .nprocs = 2, .body = body_shards, .m = 1, .n = c[i].n, .pattern = c[i].f16,
                  .as_stage = k >= sizeof c / sizeof c[0] };
        run_fails(ctx, &j, c[i].code, c[i].want);
        kb_ctx_destroy(ctx);
    }
}

/* ---- all_gather / reduce_scatter ---- */

/* The narrow layout: m x k column-wise over the rank's S participating PEs. */
static kb_dp_policy narrow_policy(kb_ctx *ctx)
{
    return !strcmp(kb_dist_algorithm(ctx), "intercube_allreduce")
               ? kb_dp(KB_DP_COLUMN_WISE, KB_DP_REPLICATE, 0, 1)
               : kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, 0);
}

/* all_gather input of rank r: integers below 2048 (exact in f16), position-dependent */
static double ag_in(int r, int64_t q, int64_t i)
{
    return (double)((r * 977 + q * 131 + i * 7) % 2039);
}

static int body_all_gather(kb_ctx *ctx, int rank, job *j)
{
    int S = kb_dist_shards_per_rank(ctx), ws = kb_dist_get_world_size(ctx);
    int64_t k = j->n, wrows = S * j->m, wcols = ws * k;
    float *in = stage(j, rank, 0, j->m, k), *junk = stage(j, rank, 1, wrows, wcols);
    int rc;
    if (!in || !junk)
        return too_big(ctx);
    for (int64_t q = 0; q < j->m; q++)
        for (int64_t i = 0; i < k; i++)
            in[q * k + i] = (float)ag_in(rank, q, i);
    for (int64_t x = 0; x < wrows * wcols; x++)
        junk[x] = -7.0f; /* the gather must overwrite every element */
    kb_tensor_desc dn = { "in", j->m, k, KB_F16, narrow_policy(ctx), KB_MEM_HBM };
    kb_tensor_desc dw = { "out", wrows, wcols, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
    rc = kb_tensor_from_host(ctx, &dn, in, &j->u[rank]);
    if (rc == 0)
        rc = kb_tensor_from_host(ctx, &dw, junk, &j->t[rank]);
    if (rc == 0 && (int)kb_tensor_nshards(j->u[rank]) != S)
        rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "narrow tensor has %zu shards",
                        kb_tensor_nshards(j->u[rank]));
    return rc ? rc : kb_dist_all_gather(ctx, j->t[rank], j->u[rank]);
}

/*
 * A small-machine context (2x2 cubes of 2 PEs) of `sips` SIPs on `topo` whose process group
 * runs `algo`, with IPCQ slots of `slot` bytes (0 = the default) and intercube's root cube
 * `root` (-1 = the default, the last cube).
 */
static kb_ctx *gather_ctx_scratch(int sips, const char *topo, const char *algo, int slot,
                                  int root, int scratch)
{
    char count[64], link[96], a[128], sl[96], rt[128], mod[128], scr[96];
    const char *sets[] = { count, link, "sip.cube_mesh.width=2", "sip.cube_mesh.height=2",
                           "cube.corners=1", "cube.pe_per_corner=2", scr };
    const char *ccl_sets[4] = { a };
    size_t n = 1;
    snprintf(count, sizeof count, "system.sips.count=%d", sips);
    snprintf(link, sizeof link, "system.sips.topology=%s", topo);
    snprintf(a, sizeof a, "ccl.defaults.algorithm=%s", root >= 0 ? "rooted" : algo);
    snprintf(scr, sizeof scr, "pe.scratch.size_bytes=%d", scratch ? scratch : 8388608);
    kb_ctx *ctx = kbt_ctx_new(sets, sizeof sets / sizeof sets[0],
                              &(kb_ctx_opts){ .device = KB_DEV_REF });
    if (slot) {
        snprintf(sl, sizeof sl, "ccl.defaults.slot_size=%d", slot);
        ccl_sets[n++] = sl;
    }
    if (root >= 0) {
        /* an entry of its own: the module and its root cube */
        snprintf(mod, sizeof mod, "ccl.algorithms.rooted.module=%s", algo);
        snprintf(rt, sizeof rt, "ccl.algorithms.rooted.root_cube=%d", root);
        ccl_sets[n++] = mod;
        ccl_sets[n++] = rt;
    }
    kbt_ccl_attach(ctx, ccl_sets, n);
    return ctx;
}

static kb_ctx *gather_ctx(int sips, const char *topo, const char *algo, int slot, int root)
{
    return gather_ctx_scratch(sips, topo, algo, slot, root, 0);
}

/* One call of `kind`, whose inter-SIP traffic is the ring's closed form: every rank sends
 * (ws - 1) chunks of `chunk` bytes, i.e. (ws - 1)/ws of the ws-chunk buffer (a chain that
 * does not wrap sends the same in total, unevenly over the ranks). */
static void expect_traffic(kb_ctx *ctx, kb_coll_kind kind, int ws, int64_t chunk)
{
    uint64_t calls, bytes;
    kb_dist_traffic(ctx, kind, &calls, &bytes);
    assert_int_equal(calls, 1);
    assert_int_equal(bytes, (uint64_t)ws * (uint64_t)(ws - 1) * (uint64_t)chunk);
}

static void all_gather_case_scratch(int sips, const char *topo, const char *algo, int64_t m,
                                    int64_t k, int slot, int root, int scratch)
{
    kb_ctx *ctx = gather_ctx_scratch(sips, topo, algo, slot, root, scratch);
    job j = { .nprocs = sips, .body = body_all_gather, .m = m, .n = k };
    int S;
    if (scratch) /* the wide tensor of S = 8 PEs */
        big_alloc(&j, 8 * m * sips * k);
    run_ok(ctx, &j);
    S = kb_dist_shards_per_rank(ctx);
    expect_traffic(ctx, KB_COLL_ALLGATHER, sips, m * k * 2);
    int64_t wrows = S * m, wcols = sips * k;
    float *got = malloc(sizeof *got * (size_t)(wrows * wcols));
    assert_non_null(got);
    for (int r = 0; r < sips; r++) {
        assert_int_equal(kb_tensor_read(j.t[r], got), 0);
        /* every PE's m-row block is the gathered matrix: rank rr's columns at [rr*k, +k) */
        for (int64_t q = 0; q < wrows; q++)
            for (int64_t x = 0; x < wcols; x++)
                expect_exact(got[q * wcols + x], ag_in((int)(x / k), q % m, x % k), "all_gather",
                             r, q, x);
    }
    free(got);
    big_free(&j);
    kb_ctx_destroy(ctx);
}

static void all_gather_case(int sips, const char *topo, const char *algo, int64_t m, int64_t k,
                            int slot, int root)
{
    all_gather_case_scratch(sips, topo, algo, m, k, slot, root, 0);
}

/* Both process groups' wirings; SIP counts 2..4 on ring_1d, torus_2d and mesh_2d_no_wrap;
 * messages longer than a 4 KiB slot (chunked); intercube with its root at cube 0. */
static void test_all_gather(void **state)
{
    static const char *const topos[] = { "ring_1d", "torus_2d", "mesh_2d_no_wrap" };
    (void)state;
    for (int t = 0; t < 3; t++)
        for (int n = 2; n <= 4; n++) {
            all_gather_case(n, topos[t], "intercube_allreduce", 2, 8, 0, -1); /* 4 PEs, 2 cols */
            all_gather_case(n, topos[t], "hierarchical_allreduce", 2, 16, 0, -1); /* 8 PEs */
        }
    all_gather_case(3, "ring_1d", "intercube_allreduce", 4, 256, 4096, -1); /* 6 KiB messages */
    all_gather_case(4, "torus_2d", "intercube_allreduce", 2, 128, 4096, 0);
    all_gather_case(3, "mesh_2d_no_wrap", "hierarchical_allreduce", 2, 256, 4096, -1);
    all_gather_case(1, "ring_1d", "hierarchical_allreduce", 1, 16, 0, -1);
    /* a gathered row of 384 KiB (320 KiB) broadcast down in 3 pieces (256 KiB of scratch,
     * values take 64 KiB blocks) */
    assert_int_equal(kb_dist_coll_pieces(0, 262144, 1, 8, 3, 8192, KB_F16), 3);
    assert_int_equal(kb_dist_coll_pieces(0, 262144, 1, 4, 4, 10240, KB_F16), 3);
    all_gather_case_scratch(3, "ring_1d", "hierarchical_allreduce", 1, 65536, 0, -1, 262144);
    all_gather_case_scratch(4, "torus_2d", "intercube_allreduce", 1, 40960, 0, -1, 262144);
}

/* reduce_scatter input of rank r (S*m x ws*k): quarters below 8, so that every sum of up to
 * 32 terms is exact in f16 */
static double rs_in(int r, int64_t q, int64_t x)
{
    return (double)((r * 13 + q * 7 + x * 5) % 31) / 4.0;
}

static int body_reduce_scatter(kb_ctx *ctx, int rank, job *j)
{
    int S = kb_dist_shards_per_rank(ctx), ws = kb_dist_get_world_size(ctx);
    int64_t k = j->n, wrows = S * j->m, wcols = ws * k;
    float *in = stage(j, rank, 0, wrows, wcols);
    int rc;
    if (!in)
        return too_big(ctx);
    for (int64_t q = 0; q < wrows; q++)
        for (int64_t x = 0; x < wcols; x++)
            in[q * wcols + x] = (float)rs_in(rank, q, x);
    kb_tensor_desc dw = { "in", wrows, wcols, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
    kb_tensor_desc dn = { "out", j->m, k, KB_F16, narrow_policy(ctx), KB_MEM_HBM };
    rc = kb_tensor_from_host(ctx, &dw, in, &j->u[rank]);
    if (rc == 0)
        rc = kb_tensor_zeros(ctx, &dn, &j->t[rank]);
    return rc ? rc : kb_dist_reduce_scatter(ctx, j->t[rank], j->u[rank]);
}

static void reduce_scatter_case_scratch(int sips, const char *topo, const char *algo, int64_t m,
                                        int64_t k, int slot, int root, int scratch)
{
    kb_ctx *ctx = gather_ctx_scratch(sips, topo, algo, slot, root, scratch);
    job j = { .nprocs = sips, .body = body_reduce_scatter, .m = m, .n = k };
    if (scratch)
        big_alloc(&j, 8 * m * sips * k);
    run_ok(ctx, &j);
    int S = kb_dist_shards_per_rank(ctx);
    expect_traffic(ctx, KB_COLL_REDUCE_SCATTER, sips, m * k * 4); /* f32 partial sums */
    float *got = malloc(sizeof *got * (size_t)(m * k));
    assert_non_null(got);
    for (int r = 0; r < sips; r++) {
        /* out of rank r: columns [r*k, +k) of the sum over every PE block of every rank */
        assert_int_equal(kb_tensor_read(j.t[r], got), 0);
        for (int64_t q = 0; q < m; q++)
            for (int64_t c = 0; c < k; c++) {
                double want = 0.0;
                for (int rr = 0; rr < sips; rr++)
                    for (int p = 0; p < S; p++)
                        want += rs_in(rr, p * m + q, r * k + c);
                expect_exact(got[q * k + c], want, "reduce_scatter", r, q, c);
            }
    }
    free(got);
    big_free(&j);
    kb_ctx_destroy(ctx);
}

static void reduce_scatter_case(int sips, const char *topo, const char *algo, int64_t m,
                                int64_t k, int slot, int root)
{
    reduce_scatter_case_scratch(sips, topo, algo, m, k, slot, root, 0);
}

/* The pieces of kb_dist_coll_pieces, by hand: a PE's f32 working set of three whole-width
 * blocks (12 bytes per element) against its scratch. */
static void test_coll_pieces(void **state)
{
    (void)state;
    /* Gemma-2 2B TP 4 seq_parallel, 8 MiB: W = T x 2304 over 128 PEs (c = T/4 x 2304 / 128) */
    assert_int_equal(kb_dist_coll_pieces(1, 8388608, 1, 128, 4, 576, KB_F16), 1);  /* T 128:
        12 x 294 912 B = 3.5 MB fits */
    assert_int_equal(kb_dist_coll_pieces(1, 8388608, 1, 128, 4, 2304, KB_F16), 4); /* T 512:
        14.2 MB; / 4 = 3.5 MB <= 4 MiB, / 2 = 7.1 MB is not */
    assert_int_equal(kb_dist_coll_pieces(1, 8388608, 1, 128, 4, 9216, KB_F16), 16); /* T 2048:
        56.6 MB / 16 = 3.5 MB */
    assert_int_equal(kb_dist_coll_pieces(0, 8388608, 1, 128, 4, 2304, KB_F16), 1); /* 2.4 MB */
    assert_int_equal(kb_dist_coll_pieces(0, 8388608, 1, 128, 4, 9216, KB_F16), 3); /* 9.4 MB in
        pieces of at most 4 MiB */
    /* no child (S == 1): the block as loaded and as f32, 6 bytes per element */
    assert_int_equal(kb_dist_coll_pieces(1, 6144, 1, 1, 4, 256, KB_F16), 1);
    assert_int_equal(kb_dist_coll_pieces(1, 6143, 1, 1, 4, 256, KB_F16), 0);
    /* several rows do not stream; neither do pieces of more than S blocks */
    assert_int_equal(kb_dist_coll_pieces(1, 8192, 2, 8, 3, 64, KB_F16), 0);
    assert_int_equal(kb_dist_coll_pieces(0, 8192, 2, 8, 3, 512, KB_F16), 0);
    assert_int_equal(kb_dist_coll_pieces(1, 8192, 1, 8, 3, 512, KB_F16), 0);
}

static void test_reduce_scatter(void **state)
{
    static const char *const topos[] = { "ring_1d", "torus_2d", "mesh_2d_no_wrap" };
    (void)state;
    for (int t = 0; t < 3; t++)
        for (int n = 2; n <= 4; n++) {
            reduce_scatter_case(n, topos[t], "intercube_allreduce", 2, 8, 0, -1);
            reduce_scatter_case(n, topos[t], "hierarchical_allreduce", 1, 8, 0, -1);
        }
    /* f32 partials of 1536 elements: 6 KiB messages in 4 KiB slots */
    reduce_scatter_case(3, "ring_1d", "intercube_allreduce", 2, 256, 4096, -1);
    reduce_scatter_case(4, "torus_2d", "intercube_allreduce", 2, 128, 4096, 1);
    reduce_scatter_case(3, "mesh_2d_no_wrap", "hierarchical_allreduce", 2, 256, 4096, -1);
    reduce_scatter_case(1, "ring_1d", "hierarchical_allreduce", 1, 8, 0, -1);
    /* a row of 3 x 16384 f32 partials (576 KiB of working set) in 4 pieces (512 KiB of
     * scratch), on a ring and on chains that do not wrap */
    assert_int_equal(kb_dist_coll_pieces(1, 524288, 1, 8, 3, 2048, KB_F16), 4);
    assert_int_equal(kb_dist_coll_pieces(1, 524288, 1, 4, 3, 4096, KB_F16), 4);
    reduce_scatter_case_scratch(3, "ring_1d", "hierarchical_allreduce", 1, 16384, 0, -1, 524288);
    reduce_scatter_case_scratch(3, "mesh_2d_no_wrap", "intercube_allreduce", 1, 16384, 0, -1,
                                524288);
    /* two such rows do not stream: refused before the launch, with the figures */
    kb_ctx *ctx = gather_ctx_scratch(3, "ring_1d", "hierarchical_allreduce", 0, -1, 524288);
    job j = { .nprocs = 3, .body = body_reduce_scatter, .m = 2, .n = 16384 };
    big_alloc(&j, 8 * 2 * 3 * 16384);
    run_fails(ctx, &j, KB_ERR_USAGE, "reduce_scatter: a PE's 2 x 49152 block (f16; f32 while "
              "reduced) does not fit its 524288 bytes of scratch");
    big_free(&j);
    kb_ctx_destroy(ctx);
}

/* ---- broadcast / reduce ---- */

/* broadcast input: integers below 1024 (exact in f16); reduce input: quarters below 8, so
 * that a sum of up to 32 terms is exact in f16 */
static double bc_in(int r, int64_t s, int64_t i) { return (double)((r * 97 + s * 31 + i * 7) % 1021); }
static double rd_in(int r, int64_t s, int64_t i) { return (double)((r * 13 + s * 7 + i * 5) % 31) / 4.0; }

static int body_rooted(kb_ctx *ctx, int rank, job *j, int reduce)
{
    int S = kb_dist_shards_per_rank(ctx);
    float *x = stage(j, rank, 0, S, j->n);
    int rc;
    if (!x)
        return too_big(ctx);
    for (int64_t s = 0; s < S; s++)
        for (int64_t i = 0; i < j->n; i++)
            x[s * j->n + i] = (float)(reduce ? rd_in(rank, s, i) : bc_in(rank, s, i));
    kb_tensor_desc d = { "t", S, j->n, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
    if ((rc = kb_tensor_from_host(ctx, &d, x, &j->t[rank])) != 0)
        return rc;
    return reduce ? kb_dist_reduce(ctx, j->t[rank], KB_DIST_SUM, j->root)
                  : kb_dist_broadcast(ctx, j->t[rank], j->root);
}

static int body_broadcast(kb_ctx *ctx, int rank, job *j) { return body_rooted(ctx, rank, j, 0); }
static int body_reduce(kb_ctx *ctx, int rank, job *j) { return body_rooted(ctx, rank, j, 1); }

static void rooted_case(int reduce, int sips, const char *topo, const char *algo, int64_t n,
                        int root, int slot)
{
    kb_ctx *ctx = gather_ctx(sips, topo, algo, slot, -1);
    job j = { .nprocs = sips, .body = reduce ? body_reduce : body_broadcast, .n = n,
              .root = root };
    run_ok(ctx, &j);
    int S = kb_dist_shards_per_rank(ctx);
    uint64_t calls, bytes;
    kb_dist_traffic(ctx, reduce ? KB_COLL_REDUCE : KB_COLL_BROADCAST, &calls, &bytes);
    assert_int_equal(calls, 1);
    /* broadcast: every other rank receives the tensor once; reduce: every other rank's f32
     * sum of its shards crosses one inter-SIP link */
    assert_int_equal(bytes, (uint64_t)(sips - 1) * (uint64_t)(reduce ? n * 4 : S * n * 2));
    float *got = malloc(sizeof *got * (size_t)(S * n));
    assert_non_null(got);
    for (int r = 0; r < sips; r++) {
        assert_int_equal(kb_tensor_read(j.t[r], got), 0);
        for (int64_t s = 0; s < S; s++)
            for (int64_t i = 0; i < n; i++) {
                double want = 0.0;
                if (!reduce)
                    want = bc_in(root, s, i);
                else if (r != root)
                    want = rd_in(r, s, i);
                else
                    for (int rr = 0; rr < sips; rr++)
                        for (int p = 0; p < S; p++)
                            want += rd_in(rr, p, i);
                expect_exact(got[s * n + i], want, reduce ? "reduce" : "broadcast", r, s, i);
            }
    }
    free(got);
    kb_ctx_destroy(ctx);
}

/* Both wirings, 1-4 SIPs on ring_1d, torus_2d and mesh_2d_no_wrap, the first and the last
 * rank as root, and shards longer than a 4 KiB slot. */
static void test_broadcast_reduce(void **state)
{
    static const char *const topos[] = { "ring_1d", "torus_2d", "mesh_2d_no_wrap" };
    (void)state;
    for (int reduce = 0; reduce < 2; reduce++) {
        for (int t = 0; t < 3; t++)
            for (int n = 1; n <= 4; n++)
                for (int root = 0; root < n; root += n > 1 ? n - 1 : 1) {
                    rooted_case(reduce, n, topos[t], "intercube_allreduce", 8, root, 0);
                    rooted_case(reduce, n, topos[t], "hierarchical_allreduce", 8, root, 0);
                }
        rooted_case(reduce, 3, "ring_1d", "intercube_allreduce", 4096, 1, 4096);
        rooted_case(reduce, 4, "torus_2d", "hierarchical_allreduce", 2048, 2, 4096);
    }
}

/* ---- all_to_all ---- */

/* all_to_all input: integers below 1024, distinct across ranks, shards and positions */
static double a2a_in(int r, int64_t s, int64_t i) { return (double)((r * 131 + s * 37 + i * 11) % 1021); }

static int body_all_to_all(kb_ctx *ctx, int rank, job *j)
{
    int S = kb_dist_shards_per_rank(ctx);
    float *x = stage(j, rank, 0, S, j->n);
    int rc;
    if (!x)
        return too_big(ctx);
    for (int64_t s = 0; s < S; s++)
        for (int64_t i = 0; i < j->n; i++)
            x[s * j->n + i] = (float)a2a_in(rank, s, i);
    kb_tensor_desc di = { "a2a_in", S, j->n, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
    /* bad_cols: out has other columns than in (the mismatch case) */
    kb_tensor_desc dout = { "a2a_out", S, j->bad_cols ? j->bad_cols : j->n, KB_F16,
                            kb_dist_policy(ctx), KB_MEM_HBM };
    if ((rc = kb_tensor_from_host(ctx, &di, x, &j->u[rank])) != 0 ||
        (rc = kb_tensor_empty(ctx, &dout, &j->t[rank])) != 0)
        return rc;
    return kb_dist_all_to_all(ctx, j->t[rank], j->u[rank]);
}

/* Items (one block of every shard each) a dimension of g leaders sends over its links when
 * every pair of members exchanges q of them: ring q g^2 (g-1)/2 (each of the g members
 * forwards q (g-1) g / 2), chain q (g+1) g (g-1)/3 (the link between i and i+1 carries
 * (i+1)(g-1-i) q each way). */
static uint64_t a2a_dim_items(uint64_t g, uint64_t q, int wrap)
{
    return wrap ? q * g * g * (g - 1) / 2 : q * (g + 1) * g * (g - 1) / 3;
}

/* The closed form of kb_dist_all_to_all's inter-SIP bytes: S shards, blocks of u elements of
 * es bytes, a gw x gh leaders' grid: gh row exchanges of q = gh items per pair, then gw column
 * exchanges of q = gw. */
static uint64_t a2a_bytes(uint64_t S, uint64_t u, uint64_t es, uint64_t gw, uint64_t gh, int wrap)
{
    return S * u * es * (gh * a2a_dim_items(gw, gh, wrap) + gw * a2a_dim_items(gh, gw, wrap));
}

static void all_to_all_case(int sips, const char *topo, const char *algo, int64_t n, int slot)
{
    kb_ctx *ctx = gather_ctx(sips, topo, algo, slot, -1);
    job j = { .nprocs = sips, .body = body_all_to_all, .n = n };
    run_ok(ctx, &j);
    kb_machine *m = kb_ctx_machine(ctx);
    int S = kb_dist_shards_per_rank(ctx), hier = !strcmp(algo, "hierarchical_allreduce");
    int64_t u = n / sips;
    uint64_t calls, bytes;
    kb_dist_traffic(ctx, KB_COLL_ALLTOALL, &calls, &bytes);
    assert_int_equal(calls, 1);
    assert_int_equal(bytes, a2a_bytes((uint64_t)S, (uint64_t)u, 2, hier ? (uint64_t)sips : (uint64_t)m->sip_grid_w,
                                      hier ? 1 : (uint64_t)m->sip_grid_h,
                                      hier || strcmp(topo, "mesh_2d_no_wrap") != 0));
    float *got = malloc(sizeof *got * (size_t)(S * n));
    assert_non_null(got);
    for (int r = 0; r < sips; r++) {
        assert_int_equal(kb_tensor_read(j.t[r], got), 0);
        /* block src of shard s of rank r = block r of shard s of rank src */
        for (int64_t s = 0; s < S; s++)
            for (int64_t i = 0; i < n; i++)
                expect_exact(got[s * n + i], a2a_in((int)(i / u), s, r * u + i % u), "all_to_all",
                             r, s, i);
        /* the input is left as it was */
        assert_int_equal(kb_tensor_read(j.u[r], got), 0);
        for (int64_t s = 0; s < S; s++)
            for (int64_t i = 0; i < n; i++)
                expect_exact(got[s * n + i], a2a_in(r, s, i), "all_to_all in", r, s, i);
    }
    free(got);
    kb_ctx_destroy(ctx);
}

/* Both wirings, 1-4 SIPs on ring_1d, torus_2d and mesh_2d_no_wrap (4 SIPs: a 2 x 2 grid),
 * 6 SIPs on a 3 x 2 torus and chain, and blocks longer than a 1 KiB slot. */
static void test_all_to_all(void **state)
{
    static const char *const topos[] = { "ring_1d", "torus_2d", "mesh_2d_no_wrap" };
    (void)state;
    for (int t = 0; t < 3; t++)
        for (int n = 1; n <= 4; n++) {
            all_to_all_case(n, topos[t], "intercube_allreduce", 12, 0);
            all_to_all_case(n, topos[t], "hierarchical_allreduce", 12, 0);
        }
    all_to_all_case(6, "torus_2d", "intercube_allreduce", 12, 0);
    all_to_all_case(6, "mesh_2d_no_wrap", "intercube_allreduce", 6, 0);
    all_to_all_case(5, "ring_1d", "hierarchical_allreduce", 10, 0);
    all_to_all_case(2, "ring_1d", "intercube_allreduce", 2048, 1024);
    all_to_all_case(4, "torus_2d", "hierarchical_allreduce", 2048, 1024);
}

static void test_all_to_all_errors(void **state)
{
    (void)state;
    kb_ctx *ctx = gather_ctx(2, "ring_1d", "intercube_allreduce", 0, -1);
    job j = { .nprocs = 2, .body = body_all_to_all, .n = 12, .bad_cols = 8 };
    run_fails(ctx, &j, KB_ERR_STATE, "all_to_all: rank 0's out (4 x 8 f16) differs from its in "
              "(4 x 12 f16)");
    kb_ctx_destroy(ctx);
    ctx = gather_ctx(4, "torus_2d", "hierarchical_allreduce", 0, -1);
    job odd = { .nprocs = 4, .body = body_all_to_all, .n = 10 };
    run_fails(ctx, &odd, KB_ERR_STATE, "all_to_all: a shard of 10 elements does not split into "
              "4 equal blocks (one per rank)");
    kb_ctx_destroy(ctx);
}

/* ---- send / recv ---- */

enum { P2P_PAIR, P2P_TWICE, P2P_PIPELINE, P2P_TWO_PAIRS, P2P_NO_SEND, P2P_SELF, P2P_RANGE,
       P2P_OFF_SIP };

/* message k of rank r: integers below 1024 */
static double p2p_in(int r, int k, int64_t s, int64_t i)
{
    return (double)((r * 211 + k * 101 + s * 29 + i * 3) % 1019);
}

/* A fresh S x cols tensor of the process group's layout holding message k of rank `rank`
 * (stage buffer `which`). */
static int p2p_tensor(kb_ctx *ctx, job *j, int rank, int which, int k, int64_t cols,
                      kb_tensor **out)
{
    int S = kb_dist_shards_per_rank(ctx);
    float *x = stage(j, rank, which, S, cols);
    if (!x)
        return too_big(ctx);
    for (int64_t s = 0; s < S; s++)
        for (int64_t i = 0; i < cols; i++)
            x[s * cols + i] = (float)p2p_in(rank, k, s, i);
    kb_tensor_desc d = { which ? "rx" : "tx", S, cols, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
    return kb_tensor_from_host(ctx, &d, x, out);
}

static int body_p2p(kb_ctx *ctx, int rank, job *j)
{
    int rc = 0, ws = kb_dist_get_world_size(ctx);
    int64_t n = j->n;
    switch (j->p2p) {
    case P2P_PAIR: /* t[dst] ends as src's tensor; u[dst] stays for a second check */
    case P2P_NO_SEND:
        if (rank == j->src && j->p2p == P2P_PAIR)
            return (rc = p2p_tensor(ctx, j, rank, 0, 0, n, &j->t[rank])) != 0 ? rc
                   : kb_dist_send(ctx, j->t[rank], j->dst);
        if (rank == j->dst)
            return (rc = p2p_tensor(ctx, j, rank, 1, 0, j->bad_cols ? j->bad_cols : n,
                                    &j->t[rank])) != 0 ? rc
                   : kb_dist_recv(ctx, j->t[rank], j->src);
        return 0;
    case P2P_TWICE: /* two messages of one pair arrive in order */
        if (rank == j->src) {
            if ((rc = p2p_tensor(ctx, j, rank, 0, 0, n, &j->t[rank])) != 0 ||
                (rc = p2p_tensor(ctx, j, rank, 1, 1, n, &j->u[rank])) != 0 ||
                (rc = kb_dist_send(ctx, j->t[rank], j->dst)) != 0)
                return rc;
            return kb_dist_send(ctx, j->u[rank], j->dst);
        }
        if (rank == j->dst) {
            if ((rc = p2p_tensor(ctx, j, rank, 0, 7, n, &j->t[rank])) != 0 ||
                (rc = p2p_tensor(ctx, j, rank, 1, 7, n, &j->u[rank])) != 0 ||
                (rc = kb_dist_recv(ctx, j->t[rank], j->src)) != 0)
                return rc;
            return kb_dist_recv(ctx, j->u[rank], j->src);
        }
        return 0;
    case P2P_PIPELINE: /* rank 0's tensor handed down the ranks: r receives from r - 1 and
                        * passes it on to r + 1 */
        if ((rc = p2p_tensor(ctx, j, rank, 0, 5, n, &j->t[rank])) != 0)
            return rc;
        if (rank > 0 && (rc = kb_dist_recv(ctx, j->t[rank], rank - 1)) != 0)
            return rc;
        return rank + 1 < ws ? kb_dist_send(ctx, j->t[rank], rank + 1) : 0;
    case P2P_TWO_PAIRS: /* 0 -> 2 and 1 -> 3 at once (their routes share SIPs) */
        if ((rc = p2p_tensor(ctx, j, rank, 0, 3, n, &j->t[rank])) != 0)
            return rc;
        return rank < 2 ? kb_dist_send(ctx, j->t[rank], rank + 2)
                        : kb_dist_recv(ctx, j->t[rank], rank - 2);
    case P2P_SELF:
        return rank == 0 ? kb_dist_send(ctx, NULL, 0) : 0;
    case P2P_OFF_SIP: /* rank 0's tensor made on rank 1's SIP */
        if (rank == 0)
            return (rc = kb_ctx_set_device(ctx, 1)) != 0 ||
                   (rc = p2p_tensor(ctx, j, rank, 0, 0, n, &j->t[rank])) != 0 ||
                   (rc = kb_ctx_set_device(ctx, 0)) != 0 ? rc
                   : kb_dist_send(ctx, j->t[rank], 1);
        return (rc = p2p_tensor(ctx, j, rank, 1, 0, n, &j->t[rank])) != 0 ? rc
               : kb_dist_recv(ctx, j->t[rank], 0);
    default:
        return rank == 0 ? kb_dist_recv(ctx, NULL, ws) : 0;
    }
}

static void expect_p2p(kb_ctx *ctx, kb_tensor *t, int from, int k, int64_t n, int r)
{
    int S = kb_dist_shards_per_rank(ctx);
    float *got = malloc(sizeof *got * (size_t)(S * n));
    assert_non_null(got);
    assert_int_equal(kb_tensor_read(t, got), 0);
    for (int64_t s = 0; s < S; s++)
        for (int64_t i = 0; i < n; i++)
            expect_exact(got[s * n + i], p2p_in(from, k, s, i), "send/recv", r, s, i);
    free(got);
}

/* The transfers' inter-SIP bytes: every shard crosses each link of the route once. */
static void expect_p2p_traffic(kb_ctx *ctx, uint64_t calls_want, uint64_t hops, int64_t n)
{
    uint64_t calls, bytes;
    kb_dist_traffic(ctx, KB_COLL_SENDRECV, &calls, &bytes);
    assert_int_equal(calls, calls_want);
    assert_int_equal(bytes, hops * (uint64_t)kb_dist_shards_per_rank(ctx) * (uint64_t)n * 2);
}

/* One pair src -> dst, `hops` leaders' links apart. */
static void p2p_pair_case(int sips, const char *topo, const char *algo, int src, int dst,
                          int hops, int64_t n, int slot)
{
    kb_ctx *ctx = gather_ctx(sips, topo, algo, slot, -1);
    job j = { .nprocs = sips, .body = body_p2p, .n = n, .p2p = P2P_PAIR, .src = src, .dst = dst };
    run_ok(ctx, &j);
    expect_p2p(ctx, j.t[dst], src, 0, n, dst);
    expect_p2p(ctx, j.t[src], src, 0, n, src);
    expect_p2p_traffic(ctx, 1, (uint64_t)hops, n);
    kb_ctx_destroy(ctx);
}

/* Adjacent and distant pairs on both wirings: a ring's neighbours (also round the wrap), two
 * hops on a ring of 4 (the tie goes east), the 2 x 2 torus's diagonal, a 3 x 2 grid without
 * wrap corner to corner, hierarchical's global ring, and shards longer than a 1 KiB slot. */
static void test_send_recv(void **state)
{
    (void)state;
    p2p_pair_case(2, "ring_1d", "intercube_allreduce", 0, 1, 1, 8, 0);
    p2p_pair_case(2, "ring_1d", "hierarchical_allreduce", 1, 0, 1, 8, 0);
    p2p_pair_case(4, "ring_1d", "intercube_allreduce", 3, 0, 1, 8, 0);
    p2p_pair_case(4, "ring_1d", "intercube_allreduce", 1, 3, 2, 8, 0);
    p2p_pair_case(4, "ring_1d", "intercube_allreduce", 2, 0, 2, 8, 0);
    p2p_pair_case(5, "ring_1d", "hierarchical_allreduce", 0, 3, 2, 8, 0);
    p2p_pair_case(4, "torus_2d", "intercube_allreduce", 0, 3, 2, 8, 0);
    p2p_pair_case(4, "torus_2d", "hierarchical_allreduce", 3, 1, 2, 8, 0);
    p2p_pair_case(6, "mesh_2d_no_wrap", "intercube_allreduce", 5, 0, 3, 8, 0);
    p2p_pair_case(6, "mesh_2d_no_wrap", "intercube_allreduce", 0, 2, 2, 8, 0);
    p2p_pair_case(4, "mesh_2d_no_wrap", "hierarchical_allreduce", 3, 0, 1, 8, 0); /* its own ring */
    p2p_pair_case(3, "ring_1d", "intercube_allreduce", 0, 1, 1, 2048, 1024);
    p2p_pair_case(4, "torus_2d", "hierarchical_allreduce", 1, 3, 2, 1024, 1024);
}

/* Two messages of one pair in order, a pipeline through every rank, two pairs at once. */
static void test_send_recv_sequences(void **state)
{
    (void)state;
    for (int h = 0; h < 2; h++) {
        const char *algo = h ? "hierarchical_allreduce" : "intercube_allreduce";
        kb_ctx *ctx = gather_ctx(3, "ring_1d", algo, 0, -1);
        job j = { .nprocs = 3, .body = body_p2p, .n = 8, .p2p = P2P_TWICE, .src = 2, .dst = 0 };
        run_ok(ctx, &j);
        expect_p2p(ctx, j.t[0], 2, 0, 8, 0);
        expect_p2p(ctx, j.u[0], 2, 1, 8, 0);
        expect_p2p_traffic(ctx, 2, 2, 8);
        kb_ctx_destroy(ctx);

        ctx = gather_ctx(4, "torus_2d", algo, 0, -1);
        job pl = { .nprocs = 4, .body = body_p2p, .n = 8, .p2p = P2P_PIPELINE };
        run_ok(ctx, &pl);
        for (int r = 0; r < 4; r++)
            expect_p2p(ctx, pl.t[r], 0, 5, 8, r);
        /* hops 0->1, 1->2, 2->3: 1 + 2 + 1 on the 2 x 2 torus (intercube), 1 + 1 + 1 on the
         * global ring (hierarchical) */
        expect_p2p_traffic(ctx, 3, h ? 3 : 4, 8);
        kb_ctx_destroy(ctx);

        ctx = gather_ctx(4, "ring_1d", algo, 0, -1);
        job two = { .nprocs = 4, .body = body_p2p, .n = 8, .p2p = P2P_TWO_PAIRS };
        run_ok(ctx, &two);
        expect_p2p(ctx, two.t[2], 0, 3, 8, 2);
        expect_p2p(ctx, two.t[3], 1, 3, 8, 3);
        expect_p2p_traffic(ctx, 2, 4, 8);
        kb_ctx_destroy(ctx);
    }
}

static void test_send_recv_errors(void **state)
{
    (void)state;
    kb_ctx *ctx = gather_ctx(2, "ring_1d", "intercube_allreduce", 0, -1);
    job j = { .nprocs = 2, .body = body_p2p, .n = 8, .p2p = P2P_PAIR, .src = 0, .dst = 1,
              .bad_cols = 4 };
    run_fails(ctx, &j, KB_ERR_STATE, "rank 0 sends 'tx' (4 x 8 f16) but rank 1 receives into "
              "'rx' (4 x 4 f16)");
    kb_ctx_destroy(ctx);

    ctx = gather_ctx(3, "ring_1d", "hierarchical_allreduce", 0, -1);
    job ns = { .nprocs = 3, .body = body_p2p, .n = 8, .p2p = P2P_NO_SEND, .src = 0, .dst = 2 };
    run_fails(ctx, &ns, KB_ERR_DEADLOCK, "rank2: waits on kb_dist_recv from rank 0 (#0 of 0 -> "
              "2): no matching kb_dist_send");
    kb_ctx_destroy(ctx);

    ctx = gather_ctx(2, "ring_1d", "intercube_allreduce", 0, -1);
    job self = { .nprocs = 2, .body = body_p2p, .n = 8, .p2p = P2P_SELF };
    run_fails(ctx, &self, KB_ERR_INVAL, "send: rank 0 names itself as its peer");
    kb_ctx_destroy(ctx);

    ctx = gather_ctx(2, "ring_1d", "hierarchical_allreduce", 0, -1);
    job off = { .nprocs = 2, .body = body_p2p, .n = 8, .p2p = P2P_OFF_SIP };
    run_fails(ctx, &off, KB_ERR_STATE, "send: rank 0's tensor 'tx' must live on SIP 0 with the "
              "process group's layout (hierarchical_allreduce: 8 equal shards, kb_dist_policy)");
    kb_ctx_destroy(ctx);

    ctx = gather_ctx(2, "ring_1d", "intercube_allreduce", 0, -1);
    job range = { .nprocs = 2, .body = body_p2p, .n = 8, .p2p = P2P_RANGE };
    run_fails(ctx, &range, KB_ERR_RANGE, "recv: rank 2 outside a world of 2 ranks");
    kb_ctx_destroy(ctx);
}

/* ---- errors ---- */

static int body_mismatch(kb_ctx *ctx, int rank, job *j)
{
    if (rank == 1)
        return kb_dist_barrier(ctx); /* opens epoch 1 as a barrier and waits there */
    int rc = make_tensor(ctx, j, rank, kb_dist_shards_per_rank(ctx), 4, kb_dist_policy(ctx),
                         &j->t[rank]);
    if (rc == 0) {
        kb_fiber_sleep(kb_ctx_sim(ctx), kb_ns(1000));
        rc = kb_dist_all_reduce(ctx, j->t[rank], KB_DIST_SUM);
    }
    j->after[rank] = 1;
    return rc;
}

static void test_err_mismatch(void **state)
{
    kb_ctx *ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
    job j = { .nprocs = 2, .body = body_mismatch };
    (void)state;
    run_fails(ctx, &j, KB_ERR_STATE,
              "rank 0: rank 0 called all_reduce but epoch 1 is a barrier of the other ranks");
    assert_int_equal(j.after[0], 1);
    assert_int_equal(j.after[1], 0);
    kb_ctx_destroy(ctx);
}

/*
 * "Joined twice" is not reachable by one worker calling collectives in sequence: join()
 * blocks until the epoch completes, and the epoch is closed (d->cur = NULL) before anyone
 * resumes, so a rank's next call always opens a new epoch. It is reachable when two fibers
 * claim the same rank: here rank 1 spawns a sub-worker (rank 0 of its own group) that calls
 * all_reduce while rank 0 is still waiting in epoch 1.
 */
static int sub_worker(kb_ctx *ctx, int rank, void *arg)
{
    job *j = arg;
    (void)rank;
    return kb_dist_all_reduce(ctx, j->t[0], KB_DIST_SUM);
}

static int body_twice(kb_ctx *ctx, int rank, job *j)
{
    if (rank == 0) {
        int rc = make_tensor(ctx, j, rank, kb_dist_shards_per_rank(ctx), 4, kb_dist_policy(ctx),
                             &j->t[0]);
        return rc ? rc : kb_dist_all_reduce(ctx, j->t[0], KB_DIST_SUM);
    }
    kb_fiber_sleep(kb_ctx_sim(ctx), kb_ns(100000));
    int rc = kb_spawn(ctx, sub_worker, j, 1);
    j->after[rank] = 1;
    return rc;
}

static void test_err_joined_twice(void **state)
{
    kb_ctx *ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
    job j = { .nprocs = 2, .body = body_twice };
    (void)state;
    run_fails(ctx, &j, KB_ERR_STATE,
              "rank 0: rank 0 joined collective epoch 1 (all_reduce) twice: it called "
              "all_reduce again before every rank had joined");
    assert_int_equal(j.after[1], 0);
    kb_ctx_destroy(ctx);
}

static int body_op(kb_ctx *ctx, int rank, job *j)
{
    int rc = make_tensor(ctx, j, rank, kb_dist_shards_per_rank(ctx), 4, kb_dist_policy(ctx),
                         &j->t[rank]);
    return rc ? rc : kb_dist_all_reduce(ctx, j->t[rank], j->op);
}

static void test_err_op(void **state)
{
    static const char *const want[] = { "", "all_reduce: op PROD is not supported (only SUM)",
                                        "all_reduce: op MAX is not supported (only SUM)",
                                        "all_reduce: op MIN is not supported (only SUM)" };
    (void)state;
    for (int op = KB_DIST_PROD; op <= KB_DIST_MIN; op++) {
        kb_ctx *ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
        job j = { .nprocs = 2, .body = body_op, .op = (kb_dist_op)op };
        run_fails(ctx, &j, KB_ERR_UNSUPPORTED, want[op]);
        kb_ctx_destroy(ctx);
    }
}

static void test_err_backend_and_algorithm(void **state)
{
    (void)state;
    kb_ctx *ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
    job j = { .nprocs = 2, .backend = "nccl" };
    run_fails(ctx, &j, KB_ERR_UNSUPPORTED,
              "init_process_group: backend 'nccl' is not supported (use \"ahbm\")");
    assert_int_equal(kb_dist_get_world_size(ctx), -1);
    kb_ctx_destroy(ctx);

    /* the shipped default (ring_allreduce_tcm, rank = PE) has no process-group form (kbcl run
     * runs it one rank per SIP in lanes, not through a process group) */
    ctx = make_ctx(2, "ring_1d", 1, NULL);
    job k = { .nprocs = 2 };
    run_fails(ctx, &k, KB_ERR_UNSUPPORTED, "algorithm 'ring_allreduce_tcm' (module "
              "ring_allreduce_tcm) has no process-group form; use intercube_allreduce or "
              "hierarchical_allreduce");
    assert_int_equal(kb_dist_get_world_size(ctx), -1);
    kb_ctx_destroy(ctx);

    /* the world is one rank per SIP: spawning fewer workers is refused */
    ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
    job l = { .nprocs = 1 };
    run_fails(ctx, &l, KB_ERR_STATE, "rank 0: init_process_group: 1 workers were spawned but "
              "the world has 2 ranks (one per SIP)");
    kb_ctx_destroy(ctx);
}

/* The registry: lookup, complete entries, and what the process group takes from them. */
static void test_registry(void **state)
{
    int n = 0;
    (void)state;
    for (; kb_dist_algo_at(n); n++) {
        const kb_ccl_algo_impl *a = kb_dist_algo_at(n);
        const kb_ccl_sip_form *e = a->sip;
        assert_ptr_equal(kb_dist_algo_find(a->module), a);
        assert_int_equal(a->kind, KB_COLL_ALLREDUCE);
        assert_true(e->summary && e->kernel && e->install && e->policy && e->shards &&
                    e->validate && e->args && e->grid && e->reference);
    }
    assert_int_equal(n, 2);
    assert_null(kb_dist_algo_at(-1));
    assert_null(kb_dist_algo_find("ring_allreduce")); /* an entry without a rank = SIP form */
    assert_ptr_equal(kb_dist_algo_find("intercube_allreduce")->sip, &kb_ccl_sip_intercube);
    assert_ptr_equal(kb_dist_algo_find("hierarchical_allreduce")->sip, &kb_ccl_sip_hierarchical);
    /* one entry, both placements: the rank = PE kernel is the rank = SIP form's */
    assert_ptr_equal(kb_dist_algo_find("hierarchical_allreduce")->kernel,
                     kb_ccl_sip_hierarchical.kernel);
    /* the process group's layout and grid are its entry's */
    for (int i = 0; i < n; i++) {
        const kb_ccl_sip_form *e = kb_dist_algo_at(i)->sip;
        kb_ctx *ctx = make_ctx(2, "ring_1d", 1, kb_dist_algo_at(i)->module);
        job j = { .nprocs = 2, .body = body_place, .m = 1, .n = 4 };
        kb_machine *m = kb_ctx_machine(ctx);
        run_ok(ctx, &j);
        kb_dp_policy a = kb_dist_policy(ctx), b = e->policy(m);
        assert_memory_equal(&a, &b, sizeof a);
        assert_int_equal(kb_dist_shards_per_rank(ctx), e->shards(m));
        kb_grid g = e->grid(m, 2);
        assert_int_equal(g.pes * g.cubes, e->shards(m)); /* one PE per shard */
        assert_int_equal(g.sips, 2);
        kb_ctx_destroy(ctx);
    }
}

/* Every rank = SIP entry on seeded position-dependent data, several SIP counts and grids. */
static void test_allreduce_seeded(void **state)
{
    static const struct { int sips; const char *topo; int64_t m, n; int slot; } cases[] = {
        { 2, "ring_1d", 1, 8, 0 }, { 3, "ring_1d", 2, 5, 0 }, { 4, "torus_2d", 1, 16, 0 },
        { 4, "mesh_2d_no_wrap", 2, 8, 0 }, { 6, "torus_2d", 1, 4, 0 },
        /* shards of 4400 and 4800 f32 bytes over 4096-byte slots: messages travel as chunks */
        { 2, "ring_1d", 1, 1100, 4096 }, { 4, "torus_2d", 2, 600, 4096 },
    };
    (void)state;
    for (int a = 0; kb_dist_algo_at(a); a++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const char *module = kb_dist_algo_at(a)->module;
            kb_ctx *ctx = make_ctx(cases[c].sips, cases[c].topo, 1, module);
            if (cases[c].slot) {
                char alg[128], slot[64];
                const char *sets[] = { alg, slot };
                snprintf(alg, sizeof alg, "ccl.defaults.algorithm=%s", module);
                snprintf(slot, sizeof slot, "ccl.defaults.slot_size=%d", cases[c].slot);
                kbt_ccl_attach(ctx, sets, 2);
            }
            job j = { .nprocs = cases[c].sips, .body = body_allreduce, .m = cases[c].m,
                      .n = cases[c].n, .pattern = 2 };
            run_ok(ctx, &j);
            check_seeded(ctx, &j, cases[c].sips);
            kb_ctx_destroy(ctx);
        }
    }
}

/* A rank = SIP algorithm added at run time (the built-in intercube entry under another
 * name) is found through the configuration's registry, and only through it. */
static void test_registry_entry(void **state)
{
    static const kb_ccl_algo_impl mine = {
        .module = "my_intercube", .summary = "the intercube form under another name",
        .kind = KB_COLL_ALLREDUCE, .sip = &kb_ccl_sip_intercube,
    };
    kb_ccl_reg *reg = NULL;
    kb_errbuf eb = {{0}};
    kb_ccl_cfg c;
    const char *sets[] = { "ccl.defaults.algorithm=my_intercube" };
    (void)state;
    assert_int_equal(kb_ccl_reg_create(&reg, &eb), 0);
    assert_int_equal(kb_ccl_reg_add_algo(reg, &mine, &eb), 0);
    for (int with = 0; with < 2; with++) {
        kb_ctx *ctx = make_ctx(2, "ring_1d", 1, NULL);
        job j = { .nprocs = 2, .body = body_allreduce, .m = 1, .n = 8, .pattern = 2 };
        kbt_ccl_config_with(&c, sets, 1);
        c.reg = with ? reg : NULL;
        assert_int_equal(kb_ccl_config_attach(ctx, &c), 0);
        if (!with) {
            run_fails(ctx, &j, KB_ERR_UNSUPPORTED, "algorithm 'my_intercube' (module "
                      "my_intercube) has no process-group form; use intercube_allreduce or "
                      "hierarchical_allreduce");
        } else {
            run_ok(ctx, &j);
            assert_string_equal(kb_dist_algorithm(ctx), "my_intercube");
            assert_ptr_equal(kb_dist_algo_of(ctx), &mine);
            check_seeded(ctx, &j, 2);
        }
        kb_ctx_destroy(ctx);
    }
    kb_ccl_reg_destroy(reg);
}

/* Pattern-free f32 data whose partial sums round: (r + 1) / 3 + i / 7 (no exact binary form). */
static float odd_f32(int r, int64_t q, int64_t i) { return (float)((r + 1) / 3.0 + (q * 97 + i) / 7.0); }

static int body_allreduce_f32(kb_ctx *ctx, int rank, job *j)
{
    int64_t rows = kb_dist_shards_per_rank(ctx) * j->m;
    float *data = stage(j, rank, 0, rows, j->n);
    int rc;
    if (!data)
        return too_big(ctx);
    for (int64_t q = 0; q < rows; q++)
        for (int64_t i = 0; i < j->n; i++)
            data[q * j->n + i] = odd_f32(rank, q, i);
    kb_tensor_desc d = { "x", rows, j->n, KB_F32, kb_dist_policy(ctx), KB_MEM_HBM };
    rc = kb_tensor_from_host(ctx, &d, data, &j->t[rank]);
    return rc ? rc : kb_dist_all_reduce(ctx, j->t[rank], KB_DIST_SUM);
}

/*
 * f32 sums round, so their order matters: every rank's replica must still hold the same bits
 * (a tensor-parallel layer relies on it), and each element must be within f32 rounding of the
 * exact sum. A ring that forwards whole values among 3 or more SIP leaders failed this.
 */
static void test_allreduce_replicas_agree(void **state)
{
    static const struct { int sips; const char *topo; int64_t n; int slot; } cases[] = {
        { 3, "ring_1d", 24, 0 }, { 4, "torus_2d", 40, 0 }, { 5, "ring_1d", 7, 0 },
        { 4, "ring_1d", 1500, 4096 }, /* 6000-byte rows over 4096-byte slots: streamed */
    };
    (void)state;
    for (int a = 0; kb_dist_algo_at(a); a++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const char *module = kb_dist_algo_at(a)->module;
            kb_ctx *ctx = make_ctx(cases[c].sips, cases[c].topo, 1, module);
            char alg[128], slot[64];
            const char *sets[] = { alg, slot };
            snprintf(alg, sizeof alg, "ccl.defaults.algorithm=%s", module);
            snprintf(slot, sizeof slot, "ccl.defaults.slot_size=%d",
                     cases[c].slot ? cases[c].slot : 262144);
            kbt_ccl_attach(ctx, sets, 2);
            job j = { .nprocs = cases[c].sips, .body = body_allreduce_f32, .m = 1,
                      .n = cases[c].n };
            run_ok(ctx, &j);
            int64_t rows = kb_dist_shards_per_rank(ctx), n = j.n;
            float *r0 = malloc(sizeof *r0 * (size_t)(rows * n)), *got = malloc(sizeof *got * (size_t)(rows * n));
            assert_non_null(r0);
            assert_non_null(got);
            assert_int_equal(kb_tensor_read(j.t[0], r0), 0);
            for (int64_t q = 0; q < rows; q++)
                for (int64_t i = 0; i < n; i++) {
                    double want = 0; /* every PE block of every rank is a member */
                    for (int rr = 0; rr < cases[c].sips; rr++)
                        for (int64_t p = 0; p < rows; p++)
                            want += odd_f32(rr, p, i);
                    if (fabs(r0[q * n + i] - want) > 2.0 * (double)(cases[c].sips * rows) *
                                                         FLT_EPSILON * fabs(want))
                        fail_msg("%s %d SIPs: [%lld][%lld] = %.9g, exact %.9g", module,
                                 cases[c].sips, (long long)q, (long long)i, (double)r0[q * n + i],
                                 want);
                }
            for (int r = 1; r < cases[c].sips; r++) {
                assert_int_equal(kb_tensor_read(j.t[r], got), 0);
                if (memcmp(got, r0, sizeof *got * (size_t)(rows * n)) != 0)
                    fail_msg("%s %d SIPs n=%lld: rank %d's replica differs from rank 0's", module,
                             cases[c].sips, (long long)n, r);
            }
            free(r0);
            free(got);
            kb_ctx_destroy(ctx);
        }
    }
}

static int body_before_init(kb_ctx *ctx, int rank, job *j)
{
    (void)j;
    return rank == 0 ? kb_dist_all_reduce(ctx, NULL, KB_DIST_SUM) : kb_dist_barrier(ctx);
}

static int host_after_spawn(kb_ctx *ctx, void *arg)
{
    job *j = arg;
    int rc = kb_spawn(ctx, worker, j, j->nprocs);
    if (rc)
        return rc;
    /* the host program itself is no rank */
    j->host_rc = kb_dist_barrier(ctx);
    return 0;
}

static void test_err_state(void **state)
{
    (void)state;
    kb_ctx *ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
    job j = { .nprocs = 2, .skip_init = 1, .body = body_before_init };
    run_fails(ctx, &j, KB_ERR_STATE, "rank 0: all_reduce before init_process_group");
    kb_ctx_destroy(ctx);

    ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
    job k = { .nprocs = 2 };
    assert_int_equal(kb_ctx_run_host(ctx, host_after_spawn, &k), 0);
    assert_int_equal(k.host_rc, KB_ERR_STATE);
    assert_string_equal(kb_ctx_errmsg(ctx), "barrier outside a spawned rank worker");
    kb_ctx_destroy(ctx);
}

/* Rank fail_rank fails at t = 1 us; the others wait in a barrier (rank 0 first sleeps past
 * the failure when j->sleeper is set) and mark after[] if they ever get further. */
static int body_fail(kb_ctx *ctx, int rank, job *j)
{
    if (rank == j->fail_rank) {
        kb_fiber_sleep(kb_ctx_sim(ctx), kb_ns(1000));
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL, "worker gave up");
    }
    if (rank == 0 && j->sleeper)
        kb_fiber_sleep(kb_ctx_sim(ctx), kb_ns(10000));
    int rc = kb_dist_barrier(ctx);
    j->after[rank] = 1;
    return rc;
}

static void test_err_worker_fails(void **state)
{
    (void)state;
    for (int sleeper = 0; sleeper <= 1; sleeper++) {
        kb_ctx *ctx = make_ctx(4, "ring_1d", 1, "intercube_allreduce");
        job j = { .nprocs = 4, .body = body_fail, .fail_rank = 2, .sleeper = sleeper };
        kb_sim *sim = kb_ctx_sim(ctx);
        run_fails(ctx, &j, KB_ERR_INVAL, "rank 2: worker gave up");
        assert_int_equal(strncmp(kb_ctx_errmsg(ctx), "rank 2: ", 8), 0);
        /* the run stopped at the failure: host + the 3 other ranks are still live, unfinished */
        assert_int_equal(kb_sim_live_fibers(sim), 4);
        assert_int_equal(kb_sim_now(sim) >= kb_ns(1000) && kb_sim_now(sim) < kb_ns(10000), 1);
        for (int r = 0; r < 4; r++)
            assert_int_equal(j.after[r], 0);
        if (!sleeper) {
            /* nothing is pending: running again only finds the ranks blocked in the barrier */
            assert_int_equal(kb_sim_run(sim), KB_ERR_DEADLOCK);
            for (int r = 0; r < 4; r++)
                assert_int_equal(j.after[r], 0);
        }
        kb_ctx_destroy(ctx);
    }
}

/* Errors right after (or inside) a collective: nothing may leak. */
static int body_fail_after(kb_ctx *ctx, int rank, job *j)
{
    int rc = kb_dist_barrier(ctx);
    if (rc == 0 && rank == j->fail_rank)
        rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL, "worker gave up");
    return rc;
}

/* an exec error: rank 1's tensor lives off its rank's SIP */
static int body_bad_tensor(kb_ctx *ctx, int rank, job *j)
{
    (void)j;
    if (rank == 1 && kb_ctx_set_device(ctx, 0) != 0)
        return KB_ERR_INVAL;
    kb_tensor_desc d = { "bad", kb_dist_shards_per_rank(ctx), 4, KB_F16, kb_dist_policy(ctx),
                         KB_MEM_HBM };
    int rc = kb_tensor_zeros(ctx, &d, &j->t[rank]);
    return rc ? rc : kb_dist_all_reduce(ctx, j->t[rank], KB_DIST_SUM);
}

static void test_err_after_collective(void **state)
{
    (void)state;
    for (int fr = 0; fr < 2; fr++) {
        kb_ctx *ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
        job j = { .nprocs = 2, .body = body_fail_after, .fail_rank = fr };
        run_fails(ctx, &j, KB_ERR_INVAL, "worker gave up");
        kb_ctx_destroy(ctx);
    }
    kb_ctx *ctx = make_ctx(2, "ring_1d", 1, "intercube_allreduce");
    job j = { .nprocs = 2, .body = body_bad_tensor };
    run_fails(ctx, &j, KB_ERR_STATE, "all_reduce: validator multi_pe_sip_local: rank 1's tensor "
              "'bad' lives on SIP 0 (call set_device(rank) first)");
    kb_ctx_destroy(ctx);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_and_ranks),
        cmocka_unit_test(test_placement_hierarchical),
        cmocka_unit_test(test_wiring_ring_default_mesh),
        cmocka_unit_test(test_wiring_sip_grids),
        cmocka_unit_test(test_allreduce_ring),
        cmocka_unit_test(test_allreduce_torus),
        cmocka_unit_test(test_allreduce_mesh_no_wrap),
        cmocka_unit_test(test_allreduce_hierarchical),
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_coll_pieces),
        cmocka_unit_test(test_broadcast_reduce),
        cmocka_unit_test(test_all_to_all),
        cmocka_unit_test(test_all_to_all_errors),
        cmocka_unit_test(test_send_recv),
        cmocka_unit_test(test_send_recv_sequences),
        cmocka_unit_test(test_send_recv_errors),
        cmocka_unit_test(test_err_mismatch),
        cmocka_unit_test(test_err_joined_twice),
        cmocka_unit_test(test_err_op),
        cmocka_unit_test(test_err_backend_and_algorithm),
        cmocka_unit_test(test_err_state),
        cmocka_unit_test(test_err_worker_fails),
        cmocka_unit_test(test_err_after_collective),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_allreduce_seeded),
        cmocka_unit_test(test_registry_entry),
        cmocka_unit_test(test_allreduce_replicas_agree),
        cmocka_unit_test(test_all_reduce_shards),
        cmocka_unit_test(test_all_reduce_shards_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
