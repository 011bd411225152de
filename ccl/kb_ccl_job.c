/*
 * kb_ccl_job — preparing, launching and reading a collective (kb_ccl.h), and the mock
 * runtime built on them. The bench and the tests share this path, so the mock exercises
 * exactly the kernels, install plans and replay that full runs use.
 */
#include "kb_ccl.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tiles of one SIP (a 1 x rps*n row: rank s*rps + lr's tile at column lr*n): the
 * caller's inputs, or kb_ccl_inputs' seeded values, computed only when a write records. */
typedef struct tiles_src {
    const float *inputs; /* ws*n, rank-major; NULL = seeded */
    int sip, rps;
    int64_t n;
    int op, ws;     /* the seeded inputs' op and world (kb_ccl_input_op_span) */
    kb_dtype dt;
} tiles_src;

static void tiles_fill(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols,
                       float *out)
{
    const tiles_src *ts = ud;
    for (int64_t k = 0; k < rows; k++) {
        int64_t r = (int64_t)ts->sip * ts->rps + row + k; /* row lr of SIP s: rank s*rps + lr */
        assert(r < ts->ws); /* the tensor has a row per rank, no more */
        if (ts->inputs)
            memcpy(out + k * cols, ts->inputs + (size_t)(r * ts->n + col),
                   sizeof(float) * (size_t)cols);
        else
            kb_ccl_input_op_span(out + k * cols, KB_CCL_INPUT_SEED, ts->op, ts->dt, ts->ws, r,
                                 col, cols, ts->n);
    }
}

int kb_ccl_job_prepare(kb_ctx *ctx, kb_ccl_job *job, const kb_ccl_algo_impl *impl,
                       const char *name, const char *topo, int ws, int64_t n,
                       const kb_ipcq_cfg *icfg, const float *inputs)
{
    return kb_ccl_job_prepare_root(ctx, job, impl, name, topo, ws, n, 0, icfg, inputs);
}

int kb_ccl_job_create(kb_ctx *ctx, const kb_ccl_algo_impl *impl, const char *name,
                      const char *topo, int ws, int64_t n, const kb_ipcq_cfg *icfg,
                      const float *inputs, kb_ccl_job **out)
{
    kb_ccl_job *job;
    int rc;

    *out = NULL;
    /* on the heap, not the caller's stack: ~74 KiB of launch arguments, and host fibers'
     * stacks are small */
    if (!(job = calloc(1, sizeof *job)))
        return kb_err_nomem(kb_ctx_err(ctx), sizeof *job, "collective job %s", name);
    if ((rc = kb_ccl_job_prepare(ctx, job, impl, name, topo ? topo : impl->topology, ws, n,
                                 icfg, inputs)) != 0) {
        free(job);
        return rc;
    }
    *out = job;
    return 0;
}

void kb_ccl_job_destroy(kb_ccl_job *job)
{
    free(job); /* its tensors are the context's */
}

int kb_ccl_job_prepare_root(kb_ctx *ctx, kb_ccl_job *job, const kb_ccl_algo_impl *impl,
                            const char *name, const char *topo, int ws, int64_t n, int root,
                            const kb_ipcq_cfg *icfg, const float *inputs)
{
    kb_ccl_job_opts o = { root, KB_F16, KB_CCL_OP_SUM };
    return kb_ccl_job_prepare_opts(ctx, job, impl, name, topo, ws, n, &o, icfg, inputs);
}

int kb_ccl_job_check_opts(const kb_ccl_algo_impl *impl, const char *name,
                          const kb_ccl_job_opts *o, int ws, kb_errbuf *eb)
{
    /* collectives reduce in f16, bf16 or f32; the number formats (i8, fp8, ...) are not
     * collective element types */
    if ((unsigned)o->dtype > KB_F32 || o->op < 0 || o->op >= KB_CCL_NOPS)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: unknown dtype %d (f16, bf16, f32) or op %d",
                          name, (int)o->dtype, o->op);
    if (o->op != KB_CCL_OP_SUM && !kb_coll_reduces(impl->kind))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: op %s: the %s kind does not reduce", name,
                          kb_ccl_op_name(o->op), kb_coll_name(impl->kind));
    if ((o->dtype != KB_F16 || o->op != KB_CCL_OP_SUM) && !(impl->flags & KB_CCL_TYPED))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: module %s runs f16 sums only (dtype %s, op %s "
                          "asked)", name, impl->module, kb_dtype_name(o->dtype),
                          kb_ccl_op_name(o->op));
    if (o->root < 0 || o->root >= ws)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: root %d is not a rank of a world of %d", name,
                          o->root, ws);
    if (o->root && !kb_coll_rooted(impl->kind))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: the %s kind has no root (got root %d)", name,
                          kb_coll_name(impl->kind), o->root);
    return 0;
}

int kb_ccl_job_prepare_opts(kb_ctx *ctx, kb_ccl_job *job, const kb_ccl_algo_impl *impl,
                            const char *name, const char *topo, int ws, int64_t n,
                            const kb_ccl_job_opts *o, const kb_ipcq_cfg *icfg,
                            const float *inputs)
{
    int root = o->root;
    kb_machine *m = kb_ctx_machine(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    int rc;

    memset(job, 0, sizeof *job);
    if (!impl->kernel)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: module %s has no rank = PE kernel (it runs "
                          "one rank per SIP, in a process group)", name, impl->module);
    job->impl = impl;
    snprintf(job->name, sizeof job->name, "%s", name);
    snprintf(job->topo, sizeof job->topo, "%s", topo);
    job->n = n;
    job->icfg = *icfg;
    job->dtype = o->dtype;
    job->op = o->op;
    if (n < 1 || n > UINT32_MAX / 4)
        return kb_err_set(eb, KB_ERR_RANGE, "%s: n_elem %lld out of range", name, (long long)n);
    rc = impl->flags & KB_CCL_ANY_WORLD ? kb_ccl_layout_linear(m, ws, &job->layout, eb)
                                         : kb_ccl_layout_whole(m, ws, &job->layout, eb);
    if (rc)
        return rc;
    if ((rc = kb_ccl_job_check_opts(impl, name, o, ws, eb)) != 0)
        return rc;
    job->layout.root = root;
    kb_ccl_geom g = { m->npes, job->layout.cubes, root, m->mesh_w };
    if (impl->check && (rc = impl->check(ws, n, &g, eb)) != 0)
        return rc;

    int rps = job->layout.ranks_per_sip;
    tiles_src ts = { inputs, 0, rps, n, o->op, ws, o->dtype };
    /* seeded tiles: row lr of SIP s is tile s*rps + lr (tiles_fill), generated where the
     * write replays (a GEN record per shard) */
    kb_fill_gen gen = { .seed = KB_CCL_INPUT_SEED, .sign = o->op == KB_CCL_OP_PROD,
                        .ntiles = ws, .n = n };
    kb_fill fill = { tiles_fill, &ts, NULL, 0, 0, 0, inputs ? NULL : &gen };
    for (int s = 0; s < job->layout.sips && rc == 0; s++) {
        /* one row per rank: row lr (rank s*rps + lr) on the lr-th PE of the grid, at the same
         * VA offset lr*n*2 as a single row split by columns would give, without a 2^32-column
         * limit on a SIP's tiles */
        kb_tensor_desc d = { "tiles", rps, n, o->dtype,
                             kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, job->layout.cubes,
                                   job->layout.pes), KB_MEM_HBM };
        int here = kb_ccl_layout_sip_ranks(&job->layout, s);
        assert(here >= 1 && here <= rps); /* every SIP of the layout holds a rank */
        if (here < job->layout.cubes * job->layout.pes) {
            /* a partial cube (KB_CCL_ANY_WORLD): rows dealt one per PE in grid order, which
             * is where row-wise blocks would put them, and the same VA offsets */
            d.rows = here;
            d.dp.mode = KB_DP_TILED_ROW_MAJOR;
            d.dp.tile_rows = 1;
            d.dp.tile_cols = (uint64_t)n;
        }
        ts.sip = s;
        gen.tile0 = (int64_t)s * rps;
        if ((rc = kb_ctx_set_device(ctx, s)) == 0)
            rc = kb_tensor_from_fill(ctx, &d, &fill, &job->tiles[s]);
        /* validator single_shard_per_rank: each rank's PE holds exactly its own tile */
        for (size_t i = 0; rc == 0 && i < kb_tensor_nshards(job->tiles[s]); i++) {
            const kb_shard_spec *sh = kb_tensor_shard(job->tiles[s], i);
            int r = s * rps + (int)(sh->cube * (unsigned)job->layout.pes + sh->pe);
            if (sh->nbytes != (uint64_t)n * kb_dtype_size(o->dtype) ||
                kb_ccl_rank_pe(m, &job->layout, r) != kb_machine_pe(m, sh->sip, sh->cube, sh->pe))
                rc = kb_err_set(eb, KB_ERR_STATE, "validator single_shard_per_rank: shard %zu "
                                "of SIP %d is not rank %d's tile", i, s, r);
        }
    }
    if (rc == 0)
        rc = kb_ctx_set_device(ctx, 0);
    if (rc == 0)
        rc = kb_ccl_install(ctx, topo, &job->layout, icfg);
    return rc;
}

int kb_ccl_job_launch(kb_ctx *ctx, kb_ccl_job *job, kb_kernel_fn kernel, const char *name)
{
    kb_kargs *args = job->args;
    kb_grid g = { job->layout.pes, job->layout.cubes, job->layout.sips, 0 };
    assert(job->layout.sips >= 1 && job->layout.sips <= KB_MAX_GSIPS); /* args[] */
    memset(args, 0, sizeof job->args);
    for (int s = 0; s < job->layout.sips; s++) {
        args[s].ptr[KB_CCL_PTR_TILE] = kb_tensor_va(job->tiles[s]);
        args[s].i[KB_CCL_ARG_N] = job->n;
        args[s].i[KB_CCL_ARG_WS] = job->layout.ws;
        args[s].i[KB_CCL_ARG_PES] = job->layout.pes;
        args[s].i[KB_CCL_ARG_CUBES] = job->layout.cubes;
        args[s].i[KB_CCL_ARG_SIPS] = job->layout.sips;
        args[s].i[KB_CCL_ARG_ROOT] = job->layout.root;
        args[s].i[KB_CCL_ARG_DTYPE] = job->dtype;
        args[s].i[KB_CCL_ARG_OP] = job->op;
        args[s].i[KB_CCL_ARG_FLAGS] = strcmp(job->topo, "hierarchical_lanes") ? 0
                                                                              : KB_CCL_FLAG_LANES;
    }
    return kb_launch_per_sip(ctx, name ? name : job->name,
                             kernel ? kernel : job->impl->kernel, args, &g);
}

int kb_ccl_job_read(kb_ctx *ctx, kb_ccl_job *job, float *out, uint16_t *raw)
{
    /* every SIP but a partial last one holds ranks_per_sip tiles; SIP s's start at s * per */
    size_t per = (size_t)job->n * (size_t)job->layout.ranks_per_sip;
    /* raw alone: straight into it; else through one SIP's tiles at a time */
    uint16_t *buf = out || !raw ? malloc(per * 2) : NULL;
    int rc = 0;
    if ((out || !raw) && !buf)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    for (int s = 0; s < job->layout.sips && rc == 0; s++) {
        size_t here = (size_t)job->n * (size_t)kb_ccl_layout_sip_ranks(&job->layout, s);
        if ((rc = kb_tensor_read_raw(job->tiles[s], buf ? buf : raw + (size_t)s * per)) != 0)
            break;
        for (size_t i = 0; buf && i < here; i++) {
            if (out)
                out[(size_t)s * per + i] = kb_f16_to_f32(buf[i]);
            if (raw)
                raw[(size_t)s * per + i] = buf[i];
        }
    }
    free(buf);
    return rc;
}

int kb_ccl_job_read_raw(kb_ctx *ctx, kb_ccl_job *job, void *raw)
{
    size_t es = kb_dtype_size(job->dtype);
    size_t per = (size_t)job->n * (size_t)job->layout.ranks_per_sip * es;
    int rc = 0;
    (void)ctx; /* the tiles belong to it; kept for symmetry with kb_ccl_job_read */
    for (int s = 0; s < job->layout.sips && rc == 0; s++)
        rc = kb_tensor_read_raw(job->tiles[s], (unsigned char *)raw + (size_t)s * per);
    return rc;
}

const char *kb_ccl_default_topo(const char *module)
{
    const kb_ccl_algo_impl *impl = kb_ccl_algo_find(module);
    return impl && impl->topology ? impl->topology : "ring_1d";
}

typedef struct mock {
    const kb_ccl_algo_impl *impl;
    const char *topo;
    const kb_ipcq_cfg *icfg;
    int ws, root;
    int64_t n;
    const float *in;
    kb_ccl_job job;
} mock;

static int mock_host(kb_ctx *ctx, void *arg)
{
    mock *mk = arg;
    kb_ipcq_cfg icfg = { 2, mk->impl->max_msg_bytes(mk->n, mk->ws), KB_MEM_TCM, 1, 1 };
    int rc;
    if (icfg.slot_size < 64)
        icfg.slot_size = 64;
    if (mk->icfg)
        icfg = *mk->icfg;
    rc = kb_ccl_job_prepare_root(ctx, &mk->job, mk->impl, mk->impl->module, mk->topo, mk->ws,
                                 mk->n, mk->root, &icfg, mk->in);
    if (rc == 0)
        rc = kb_ccl_job_launch(ctx, &mk->job, NULL, NULL);
    return rc;
}

int kb_ccl_mock_run(const char *module, const char *topo, int ws, int64_t n, const float *in,
                    float *out, kb_errbuf *eb)
{
    return kb_ccl_mock_run_opts(module, topo, ws, n, 0, NULL, in, out, eb);
}

int kb_ccl_mock_run_opts(const char *module, const char *topo, int ws, int64_t n, int root,
                         const kb_ipcq_cfg *icfg, const float *in, float *out, kb_errbuf *eb)
{
    const kb_ccl_algo_impl *impl = kb_ccl_algo_find(module);
    if (!impl || !impl->kernel) /* a rank = SIP form only runs in a process group */
        return kb_err_set(eb, KB_ERR_NOTFOUND, "unknown algorithm module '%s'", module);
    return kb_ccl_mock_run_algo(impl, topo, ws, n, root, icfg, in, out, eb);
}

int kb_ccl_mock_run_algo(const kb_ccl_algo_impl *impl, const char *topo, int ws, int64_t n,
                         int root, const kb_ipcq_cfg *icfg, const float *in, float *out,
                         kb_errbuf *eb)
{
    kb_config cfg;
    kb_ctx_opts opts = { .device = KB_DEV_REF };
    kb_ctx *ctx = NULL;
    mock mk;
    int rc;

    memset(&mk, 0, sizeof mk);
    if (!impl || !impl->kernel)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_ccl_mock_run_algo: %s", impl ? "an entry "
                          "without a rank = PE kernel" : "NULL entry");
    mk.impl = impl;
    mk.topo = topo ? topo : impl->topology;
    mk.ws = ws;
    mk.root = root;
    mk.icfg = icfg;
    mk.n = n;
    mk.in = in;
    kb_config_defaults(&cfg);
    if (ws < 1) /* before the divisions below */
        return kb_err_set(eb, KB_ERR_RANGE, "mock runtime: cannot lay out %d ranks", ws);
    /* the smallest machine holding the world */
    int pes = ws <= 16 ? ws : 8, per_sip = ws <= 16 ? ws : ws <= 256 ? ws : 128;
    int cubes = per_sip / pes, sips = ws / per_sip;
    const char *sets[5];
    char b[5][96];
    snprintf(b[0], sizeof b[0], "system.sips.count=%d", sips > 0 ? sips : 1);
    snprintf(b[1], sizeof b[1], "cube.corners=1");
    snprintf(b[2], sizeof b[2], "cube.pe_per_corner=%d", pes);
    snprintf(b[3], sizeof b[3], "sip.cube_mesh.width=%d", cubes <= 8 ? cubes : 8);
    snprintf(b[4], sizeof b[4], "sip.cube_mesh.height=%d", cubes <= 8 ? 1 : (cubes + 7) / 8);
    for (int i = 0; i < 5; i++)
        sets[i] = b[i];
    if (ws < 1 || (ws > 16 && ws % 8) || (ws > 256 && ws % 128) || cubes > 32)
        return kb_err_set(eb, KB_ERR_RANGE, "mock runtime: cannot lay out %d ranks", ws);
    for (int i = 0; i < 5; i++)
        if ((rc = kb_config_set(&cfg, sets[i], eb)) != 0)
            return rc;
    if ((rc = kb_ctx_create(&cfg, &opts, &ctx, eb)) != 0)
        return rc;
    rc = kb_ctx_run_host(ctx, mock_host, &mk);
    if (rc == 0)
        rc = kb_ccl_job_read(ctx, &mk.job, out, NULL);
    if (rc)
        kb_err_set(eb, rc, "%s", kb_ctx_errmsg(ctx));
    kb_ctx_destroy(ctx);
    return rc;
}
