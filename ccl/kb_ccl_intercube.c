/*
 * kb_ccl_intercube — the intercube all-reduce, an algorithm with a rank = SIP form only: its
 * kernel, its install plan (kb_dist_install_intercube), its form and its registry entry. It runs on PE 0
 * of every cube; a rank's tensor is (n_cubes x n) row-wise over the cubes (one row per cube's
 * PE 0). Data flow: reduce along each cube-mesh row to the root's column and down that column
 * to the root cube, exchange among the SIPs' root cubes by system.sips.topology (ring_1d: ring;
 * torus_2d / mesh_2d: row ring then column ring; mesh_2d_no_wrap: chain reduce + broadcast
 * along rows, then columns), broadcast back. Every message is f32; the result is stored once
 * in the tensor's dtype. Every cube's PE 0 is wired for inter-SIP traffic (to the same cube of
 * the neighbouring SIPs), though only the root cubes use it.
 * Limits: the root cube's exchange assumes the machine's SIP grid (sip_grid_w x sip_grid_h).
 * A row whose f32 messages are longer than a slot runs block by block (kb_ccl_run_tile).
 */
#include <assert.h>
#include <stdlib.h>

#include "kb_dist.h"
#include "kb_dist_algo.h"

enum { SIPTOPO_RING = 0, SIPTOPO_TORUS = 1, SIPTOPO_MESH = 2 };

/* Chain/ring helpers over f32 values (every message of intercube is f32). */
static kb_val add_free(kb_tl *tl, kb_val acc, kb_val in)
{
    kb_val s = tl_add(tl, acc, in);
    tl_free(tl, acc);
    tl_free(tl, in);
    return s;
}

/*
 * All-reduce among the k members of a ring (my index i). Two members exchange once (a + b ==
 * b + a bitwise); three or more reduce-scatter + all-gather through the row at mine (n of dt)
 * so that every member holds the same bits (kb_ccl_ring_allreduce_val).
 */
static kb_val ring(kb_tl *tl, kb_val acc, int64_t i, int64_t k, kb_dir out, kb_dir in_dir,
                   kb_va mine, kb_dtype dt)
{
    if (k < 2)
        return acc;
    if (k > 2)
        return kb_ccl_ring_allreduce_val(tl, acc, k, i, out, in_dir, mine, dt);
    kb_val in = kb_ccl_sendrecv(tl, out, acc, (kb_val){ 0 }, in_dir,
                                KB_SHAPE2(acc.rows, acc.cols), KB_F32);
    return add_free(tl, acc, in);
}

/* Chain reduce toward the end of a line of k members (my index i) along `fwd`, then broadcast
 * back along `back`; every member ends with the line's sum. */
static kb_val line_allreduce(kb_tl *tl, kb_val acc, int i, int k, kb_dir fwd, kb_dir back)
{
    kb_shape s = KB_SHAPE2(acc.rows, acc.cols);
    assert(i >= 0 && i < k);
    if (k < 2)
        return acc;
    if (i > 0)
        acc = add_free(tl, acc, tl_recv(tl, back, s, KB_F32));
    if (i < k - 1) {
        tl_send(tl, fwd, acc);
        tl_free(tl, acc);
        acc = tl_recv(tl, fwd, s, KB_F32);
    }
    if (i > 0)
        tl_send(tl, back, acc);
    return acc;
}

/* Reduce along one mesh line toward index r: members below r pass up `up`, members above r
 * pass down `down`; r receives from both sides. */
static kb_val reduce_to(kb_tl *tl, kb_val acc, int i, int k, int r, kb_dir up, kb_dir down)
{
    kb_shape s = KB_SHAPE2(acc.rows, acc.cols);
    assert(i >= 0 && i < k && r >= 0 && r < k);
    if (i < r) {
        if (i > 0)
            acc = add_free(tl, acc, tl_recv(tl, down, s, KB_F32));
        tl_send(tl, up, acc);
    } else if (i > r) {
        if (i < k - 1)
            acc = add_free(tl, acc, tl_recv(tl, up, s, KB_F32));
        tl_send(tl, down, acc);
    } else {
        if (r > 0)
            acc = add_free(tl, acc, tl_recv(tl, down, s, KB_F32));
        if (r < k - 1)
            acc = add_free(tl, acc, tl_recv(tl, up, s, KB_F32));
    }
    return acc;
}

/* Inverse of reduce_to: r's value flows out to both ends; the others release their partial
 * sums (sent during the reduce) once the total has come. */
static kb_val bcast_from(kb_tl *tl, kb_val acc, int i, int k, int r, kb_dir up, kb_dir down)
{
    kb_shape s = KB_SHAPE2(acc.rows, acc.cols);
    if (i == r) {
        if (r > 0)
            tl_send(tl, down, acc);
        if (r < k - 1)
            tl_send(tl, up, acc);
        return acc;
    }
    kb_val part = acc;
    if (i < r) {
        acc = tl_recv(tl, up, s, KB_F32);
        if (i > 0)
            tl_send(tl, down, acc);
    } else {
        acc = tl_recv(tl, down, s, KB_F32);
        if (i < k - 1)
            tl_send(tl, up, acc);
    }
    tl_free(tl, part);
    return acc;
}

typedef struct intercube_args {
    kb_va t;           /* the SIP's tensor: a row of n elements per cube */
    int64_t n;
    int w, h;          /* the cube mesh */
    int sips;
    int topo;          /* SIPTOPO_* */
    int gw, gh;        /* the SIP grid */
    int root;          /* the root cube */
    kb_dtype dt;
} intercube_args;

/* The whole exchange over the n elements at `mine` (the cube's row, or one block of it). */
static void intercube_tile(kb_tl *tl, const kb_kargs *ka, kb_va mine, int64_t n)
{
    const intercube_args *a = KB_KARGS_GET(ka, intercube_args);
    int w = a->w, h = a->h, sips = a->sips;
    int gw = a->gw, gh = a->gh, root = a->root;
    kb_dtype dt = a->dt;
    int cube = tl_program_id(tl, 1), sip = tl_program_id(tl, 2);
    int col = cube % w, row = cube / w, rc = root % w, rr = root / w;
    kb_val v = tl_load(tl, mine, KB_SHAPE1(n), dt);
    kb_val acc = tl_scale(tl, v, 1.0f, 0.0f); /* every message is f32 */
    tl_free(tl, v);

    /* 1-2: reduce along the row to the root column, then down the root column to the root */
    acc = reduce_to(tl, acc, col, w, rc, KB_DIR_E, KB_DIR_W);
    if (col == rc)
        acc = reduce_to(tl, acc, row, h, rr, KB_DIR_S, KB_DIR_N);
    /* 3: the SIPs' root cubes combine their sums */
    if (cube == root && sips > 1) {
        int sx = sip % gw, sy = sip / gw;
        switch (a->topo) {
        case SIPTOPO_RING:
            acc = ring(tl, acc, sip, sips, KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W, mine, dt);
            break;
        case SIPTOPO_TORUS:
            acc = ring(tl, acc, sx, gw, KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W, mine, dt);
            acc = ring(tl, acc, sy, gh, KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_N, mine, dt);
            break;
        default:
            acc = line_allreduce(tl, acc, sx, gw, KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W);
            acc = line_allreduce(tl, acc, sy, gh, KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_N);
            break;
        }
    }
    /* 4-5: broadcast back up/down the root column, then along every row */
    if (col == rc)
        acc = bcast_from(tl, acc, row, h, rr, KB_DIR_S, KB_DIR_N);
    acc = bcast_from(tl, acc, col, w, rc, KB_DIR_E, KB_DIR_W);
    tl_store(tl, mine, acc);
    tl_free(tl, acc); /* a streamed row's next block starts from free scratch */
}

/* Lines and chains have no cycle of sends and the rings step through kb_ccl_sendrecv, so a
 * block's f32 messages longer than a slot stream as chunks; a row larger than that runs block
 * by block (kb_ccl_run_tile), every cube starting the next block as soon as it is done with
 * this one. */
static void intercube_allreduce(kb_tl *tl, const kb_kargs *ka)
{
    const intercube_args *a = KB_KARGS_GET(ka, intercube_args);
    int64_t n = a->n;
    kb_dtype dt = a->dt;
    kb_va mine = a->t + (kb_va)tl_program_id(tl, 1) * (kb_va)n * kb_dtype_size(dt);

    kb_ccl_run_tile(tl, ka, mine, n, dt, 4, intercube_tile);
}

/* How the SIPs' root cubes combine, per the machine's system.sips.topology. */
static const int sip_kinds[KB_SIPTOPO_COUNT] = {
    [KB_SIPTOPO_RING_1D] = SIPTOPO_RING,
    [KB_SIPTOPO_TORUS_2D] = SIPTOPO_TORUS,
    [KB_SIPTOPO_MESH_2D] = SIPTOPO_TORUS,
    [KB_SIPTOPO_MESH_2D_NO_WRAP] = SIPTOPO_MESH,
};

int kb_dist_install_intercube(kb_ctx *ctx, const kb_ipcq_cfg *cfg)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int S = m->nsips, C = m->ncubes, w = m->mesh_w, h = m->mesh_h;
    int kind = sip_kinds[m->sip_topo], gw = m->sip_grid_w, gh = m->sip_grid_h;
    int wrap = kind != SIPTOPO_MESH;
    size_t cap = (size_t)S * (size_t)C * 8, n = 0;
    kb_ipcq_link *links;
    int rc;

    links = malloc(cap * sizeof *links);
    if (!links)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    for (int s = 0; s < S; s++) {
        int sx = s % gw, sy = s / gw;
        for (int c = 0; c < C; c++) {
            int x = c % w, y = c / w;
            kb_pe_hw *pe = kb_machine_pe(m, (unsigned)s, (unsigned)c, 0);
            struct { int ok; kb_dir d; int sip, cube; kb_dir back; } nb[8] = {
                { x + 1 < w, KB_DIR_E, s, c + 1, KB_DIR_W },
                { x > 0, KB_DIR_W, s, c - 1, KB_DIR_E },
                { y > 0, KB_DIR_N, s, c - w, KB_DIR_S },
                { y + 1 < h, KB_DIR_S, s, c + w, KB_DIR_N },
                /* every cube's PE 0 is wired to the same cube of the neighbouring SIPs */
                { S > 1 && gw > 1 && (wrap || sx + 1 < gw), KB_DIR_GLOBAL_E,
                  sy * gw + (sx + 1) % gw, c, KB_DIR_GLOBAL_W },
                { S > 1 && gw > 1 && (wrap || sx > 0), KB_DIR_GLOBAL_W,
                  sy * gw + (sx + gw - 1) % gw, c, KB_DIR_GLOBAL_E },
                { S > 1 && gh > 1 && (wrap || sy > 0), KB_DIR_GLOBAL_N,
                  ((sy + gh - 1) % gh) * gw + sx, c, KB_DIR_GLOBAL_S },
                { S > 1 && gh > 1 && (wrap || sy + 1 < gh), KB_DIR_GLOBAL_S,
                  ((sy + 1) % gh) * gw + sx, c, KB_DIR_GLOBAL_N },
            };
            for (int i = 0; i < 8; i++) {
                if (!nb[i].ok)
                    continue;
                assert(n < cap); /* at most 8 links per cube's PE 0 */
                links[n].pe = pe;
                links[n].dir = nb[i].d;
                links[n].peer = kb_machine_pe(m, (unsigned)nb[i].sip, (unsigned)nb[i].cube, 0);
                links[n].peer_dir = nb[i].back;
                n++;
            }
        }
    }
    rc = kb_ipcq_install(ctx, cfg, links, n);
    free(links);
    return rc;
}

/* ---- registry entry ---- */

static int ic_install(kb_ctx *ctx, const kb_ipcq_cfg *cfg, int ws)
{
    (void)ws; /* one rank per SIP: the plan covers every SIP of the machine */
    return kb_dist_install_intercube(ctx, cfg);
}

static kb_dp_policy ic_policy(const kb_machine *m)
{
    (void)m;
    return kb_dp(KB_DP_ROW_WISE, KB_DP_REPLICATE, 0, 1);
}

static int ic_shards(const kb_machine *m) { return m->ncubes; }

static int on_pe0(const kb_shard_spec *sh) { return sh->pe == 0; }

static int ic_validate(kb_ctx *ctx, kb_tensor *const *t, int ws, const char *what)
{
    return kb_dist_check_sip_local(ctx, t, ws, kb_ctx_machine(ctx)->ncubes, what,
                                   "rows over the cubes' PE 0", on_pe0);
}

static int ic_args(kb_ctx *ctx, const kb_dist_launch *l, kb_kargs *a)
{
    kb_machine *m = kb_ctx_machine(ctx);
    /* init_process_group refused a root_cube past the SIP's cubes */
    assert(l->root_cube >= 0 && l->root_cube < m->ncubes);
    KB_KARGS_PUT(a, (intercube_args){ .t = kb_tensor_va(l->t), .n = l->n, .w = m->mesh_w,
                                      .h = m->mesh_h, .sips = l->ws,
                                      .topo = sip_kinds[m->sip_topo], .gw = m->sip_grid_w,
                                      .gh = m->sip_grid_h, .root = l->root_cube,
                                      .dt = kb_tensor_dtype(l->t) });
    return 0;
}

static kb_grid ic_grid(const kb_machine *m, int ws) { return (kb_grid){ 1, m->ncubes, ws, 0 }; }

const kb_ccl_sip_form kb_ccl_sip_intercube = {
    .summary = "PE 0 of every cube: reduce over the cube mesh to a root cube, exchange among SIPs, broadcast",
    .mapper = "pe0_all_cubes",
    .validator = "multi_pe_sip_local",
    .kernel = intercube_allreduce,
    .install = ic_install,
    .policy = ic_policy,
    .shards = ic_shards,
    .validate = ic_validate,
    .args = ic_args,
    .grid = ic_grid,
    .reference = kb_ccl_ref_allreduce,
};

/* A rank = SIP algorithm only: its kernel needs the SIP's cube mesh, which no rank = PE world
 * of one rank per PE has. */
const kb_ccl_algo_impl kb_ccl_algo_intercube = {
    .module = "intercube_allreduce",
    .summary = "PE 0 of every cube: reduce over the cube mesh to a root cube, exchange among SIPs, broadcast",
    .kind = KB_COLL_ALLREDUCE,
    .sip = &kb_ccl_sip_intercube,
};
