/*
 * ccl bench (also named ccl_allreduce) — runs the collective chosen in ccl.yaml (ccl.defaults.algorithm, or
 * kbcl run --algorithm), in the rank = PE world (an entry with a world_size: rank r's
 * tile of n_elem f16 values on PE r, IPCQ installed for the entry's topology) or through the
 * rank = SIP process group (one rank per SIP, one tile per shard). Every tile is filled with
 * kb_ccl_inputs' seeded position-dependent values, so an element that lands in the wrong place
 * fails; --verify-data compares every element with the algorithm's host reference rounded to
 * f16 (kb_ccl_verify_inputs: bit for bit while the partial sums are exact). The values never
 * change the host writes' sizes or order, hence never the simulated time, and are computed
 * only when the run records: a timing-only run holds nothing proportional to the tiles. The
 * tile length is ccl.yaml's n_elem, or comes from --size (nccl-tests' size of the algorithm's
 * kind, kb_bench_coll_count, split over a rank's shards; an all_gather, reduce_scatter or
 * all_to_all tile is the rank's whole buffer of ws chunks of that count, kb_coll_tile_ranks).
 * A broadcast or reduce takes its root from the entry's `root` (kbcl run --root). Reports size_bytes (nccl-tests'
 * size), algbw = size_bytes / time, nccl-tests' busbw = algbw * the factor of the algorithm's
 * collective kind, and busbw_bound_gbps = busbw / efficiency, the busbw at the run's bound
 * (kb_bench_result.bound_ns: its busiest resource never idle).
 *
 * ipcq_deadlock bench — the same install on a ring, with a kernel in which every PE only
 * receives: the run must end in a deadlock report with every queue pair's pointers.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kb_bench.h"
#include "kb_ccl.h"
#include "kb_ccl_lanes.h"
#include "kb_ccl_reg.h"
#include "kb_ccl_roofline.h"
#include "kb_dist.h"
#include "kb_dist_algo.h"
#include "kb_resident.h"
#include "kb_tl.h"
#include "kb_vquery.h"

#define KB_CCL_DEFAULT_N 32
/* bytes of a tile element by default (f16; kb_bench_ccl.size_elem_bytes too); an entry's
 * `dtype` (--dtype) sets another */
#define KB_CCL_ELEM_BYTES 2

typedef struct ccl_state {
    kb_ccl_job job;
    int64_t size_bytes;    /* --size (kb_bench_args.size_bytes), 0 = n_elem decides */
    kb_dtype dt;           /* the entry's dtype (f16 unless set) */
    int op;                /* the entry's kb_ccl_op (sum unless set) */
    /* rank = SIP mode: the module's own form (dist) or the rank = PE kernel in lanes */
    int dist;
    int lanes;
    kb_ccl_lanes lj;
    int ws;
    int64_t n;
    char name[KB_CFG_NAME_MAX];
    kb_tensor *t[KB_MAX_GSIPS];
    kb_bench_result *res;
} ccl_state;

/*
 * The tile length: elements per rank (rank = PE, and rank = SIP in lanes) or per shard (a
 * rank = SIP process group, `shards` per rank). With --size: nccl-tests' count for that size,
 * rounded down as nccl-tests rounds it, at least 1 — per shard for a process group, whose
 * tensor holds the same whole number of elements on each shard; the result's size_bytes is
 * the size that count gives. Otherwise ccl.yaml's n_elem, else the bench's default.
 */
static int tile_len(kb_errbuf *eb, const ccl_state *st, const char *name, kb_coll_kind kind,
                    int ws, int shards, int64_t n_elem, int64_t *n)
{
    int esz = (int)kb_dtype_size(st->dt);
    int64_t count;
    if (!st->size_bytes) {
        *n = n_elem > 0 ? n_elem : KB_CCL_DEFAULT_N;
        return 0;
    }
    if (shards == 1) {
        /* rank = PE: nccl-tests' rounding (count = size / (ranks in the size * elem), at
         * least 1); the size reported is the one that count gives */
        int64_t per = (int64_t)kb_bench_coll_size(kind, ws, 1, esz);
        if (per < 1)
            return kb_err_set(eb, KB_ERR_USAGE, "--size %lld: %s (%s) has no size",
                              (long long)st->size_bytes, name, kb_coll_name(kind));
        count = st->size_bytes / per;
        *n = count > 0 ? count : 1;
        return 0;
    }
    /* a process group's tensor: whole elements on each of the rank's shards, so the count
     * rounds down to a multiple of the shard count (at least one element per shard) */
    uint64_t unit = kb_bench_coll_size(kind, ws, 1, esz) * (uint64_t)shards;
    if (shards < 1 || unit < 1)
        return kb_err_set(eb, KB_ERR_USAGE, "--size %lld: %s (%s) has no size",
                          (long long)st->size_bytes, name, kb_coll_name(kind));
    count = st->size_bytes / (int64_t)unit;
    *n = count > 0 ? count : 1;
    return 0;
}

/* Resolves the algorithm entry and its parameters (algorithm > defaults) and prepares. */
static int ccl_setup(kb_ctx *ctx, ccl_state *st, const char *force_module, int force_ws,
                     const char *force_topo)
{
    const kb_ccl_cfg *cfg = kb_ccl_config_of(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    const char *name;
    const kb_ccl_algo *entry;
    const kb_ccl_algo_impl *impl;
    kb_ccl_params p;
    kb_ipcq_cfg icfg;

    if (!cfg)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    name = force_module ? force_module : cfg->defaults.algorithm;
    entry = force_module ? NULL : kb_ccl_config_find(cfg, name);

    if (!entry && !force_module)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s' is not defined in ccl.yaml", name);
    p = kb_ccl_config_params(cfg, entry);
    st->dt = KB_F16;
    st->op = KB_CCL_OP_SUM;
    if (entry && entry->dtype[0])
        st->dt = (kb_dtype)kb_dtype_from_name(entry->dtype);
    if (entry && entry->op[0])
        st->op = kb_ccl_op_from_name(entry->op);
    /* a module with only a rank = SIP form runs one rank per SIP whatever the entry says */
    int sip_only = entry && kb_ccl_reg_find_dist(cfg->reg, entry->module) &&
                   !kb_ccl_reg_find_algo(cfg->reg, entry->module);
    if (!force_module && sip_only && p.world_size)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s runs one rank per SIP: it takes no world_size "
                          "(got %d)", entry->module, p.world_size);
    if (!force_module && p.world_size == 0 && !kb_ccl_reg_find_dist(cfg->reg, entry->module) &&
        (impl = kb_ccl_reg_find_algo(cfg->reg, entry->module)) != NULL) {
        /* rank = SIP, the rank = PE kernel in lanes over every PE of each SIP */
        int64_t count;
        int rc = kb_ccl_config_ipcq(&p, &icfg, eb);
        if (rc || (rc = tile_len(eb, st, name, impl->kind, kb_ctx_machine(ctx)->nsips, 1,
                                 p.n_elem, &count)) != 0)
            return rc;
        kb_ccl_job_opts o = { entry->root > 0 ? entry->root : 0, st->dt, st->op };
        st->lanes = 1;
        return kb_ccl_lanes_prepare(ctx, &st->lj, impl, name, entry->topology, count,
                                    p.channels, &o, &icfg);
    }
    if (!force_module && (p.world_size == 0 || sip_only)) {
        /* rank = SIP: run through spawn + the process group (dist_run) */
        const kb_ccl_algo_impl *da = kb_ccl_reg_find_dist(cfg->reg, entry->module);
        const kb_machine *m = kb_ctx_machine(ctx);
        st->dist = 1;
        snprintf(st->name, sizeof st->name, "%s", name);
        if (st->dt != KB_F16 || st->op != KB_CCL_OP_SUM)
            return kb_err_set(eb, KB_ERR_CONFIG, "%s: the rank = SIP process group runs f16 sums "
                              "(dtype %s, op %s asked)", name, kb_dtype_name(st->dt),
                              kb_ccl_op_name(st->op));
        /* (a module without a rank = SIP form fails in init_process_group, with its message) */
        return tile_len(eb, st, name, da ? da->kind : KB_COLL_ALLREDUCE, m->nsips,
                        da ? da->sip->shards(m) : 1, p.n_elem, &st->n);
    }
    impl = kb_ccl_reg_find_algo(cfg->reg, entry ? entry->module : name);
    if (!impl)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': unknown module '%s'", name,
                          entry ? entry->module : name);
    int ws = force_ws ? force_ws : p.world_size;
    int64_t n;
    int rc = kb_ccl_config_ipcq(&p, &icfg, eb);
    if (rc || (rc = tile_len(eb, st, name, impl->kind, ws, 1, p.n_elem, &n)) != 0)
        return rc;
    /* the tile is the rank's whole buffer: ws chunks of count for the chunked kinds */
    n *= kb_coll_tile_ranks(impl->kind, ws > 0 ? ws : 1);
    kb_ccl_job_opts o = { entry && entry->root > 0 ? entry->root : 0, st->dt, st->op };
    return kb_ccl_job_prepare_opts(ctx, &st->job, impl, name,
                                   force_topo ? force_topo : entry->topology, ws, n, &o, &icfg,
                                   NULL);
}

/* Rank `rank`'s tensor (shards x n; row s = input tile rank * shards + s), computed only
 * when the host write records. */
typedef struct dist_src {
    int64_t tile0, n;
} dist_src;

static void dist_fill(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols,
                      float *out)
{
    const dist_src *ds = ud;
    for (int64_t r = 0; r < rows; r++)
        kb_ccl_input_span(out + r * cols, KB_CCL_INPUT_SEED, ds->tile0 + row + r, col, cols,
                          ds->n);
}

/* One rank of the rank = SIP run: bind, join, fill (shard s of rank r is input tile
 * r * shards + s), all-reduce. */
static int dist_worker(kb_ctx *ctx, int rank, void *arg)
{
    ccl_state *st = arg;
    int rc, shards;
    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||
        (rc = kb_dist_init_process_group(ctx, "ahbm", st->name)) != 0)
        return rc;
    shards = kb_dist_shards_per_rank(ctx);
    kb_tensor_desc d = { "tiles", shards, st->n, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
    dist_src ds = { (int64_t)rank * shards, st->n };
    kb_fill_gen gen = { .seed = KB_CCL_INPUT_SEED, .tile0 = ds.tile0, .n = st->n };
    kb_fill fill = { dist_fill, &ds, NULL, 0, 0, 0, &gen };
    rc = kb_tensor_from_fill(ctx, &d, &fill, &st->t[rank]);
    if (rc == 0)
        rc = kb_dist_barrier(ctx);
    if (rc)
        return rc;
    if (rank == 0)
        kb_bench_mark_begin(ctx, st->res);
    rc = kb_dist_all_reduce(ctx, st->t[rank], KB_DIST_SUM);
    if (rc == 0 && rank == 0)
        kb_bench_mark_end(ctx, st->res);
    return rc;
}

/* The nccl-tests columns of a run that moved `count` elements per rank (nccl-tests' count). */
static void add_bw(kb_bench_result *res, kb_coll_kind kind, int ws, int64_t count, int esz)
{
    double ns = kb_time_to_ns(res->t_end - res->t_begin);
    double bytes = (double)kb_bench_coll_size(kind, ws, count, esz);
    double algbw = bytes / ns; /* bytes per ns = GB/s; nccl-tests: size / time for every kind */
    kb_bench_add_extra(res, "world_size", ws);
    kb_bench_add_extra(res, "n_elem", (double)count);
    kb_bench_add_extra(res, "size_bytes", bytes);
    kb_bench_add_extra(res, "algbw_gbps", algbw);
    kb_bench_add_extra(res, "busbw_gbps", algbw * kb_coll_busbw_factor(kind, ws));
    /* the busbw the run would reach at its bound (its busiest resource never idle) */
    double eff = kb_bench_efficiency(res);
    if (eff > 0.0)
        kb_bench_add_extra(res, "busbw_bound_gbps", algbw * kb_coll_busbw_factor(kind, ws) / eff);
}

/* IPCQ traffic of the whole run (set-up and barriers included): Phase 1's host cost per
 * chunk is phase1_ms over ipcq_chunks. */
static void add_traffic(kb_ctx *ctx, kb_bench_result *res)
{
    uint64_t msgs, chunks;
    kb_ipcq_counts(ctx, &msgs, &chunks);
    kb_bench_add_extra(res, "ipcq_messages", (double)msgs);
    kb_bench_add_extra(res, "ipcq_chunks", (double)chunks);
}

/* The collective's bandwidth-optimal bound over where the run put its ranks
 * (kb_ccl_roofline.h): the rank = PE job's PEs, every SIP's lanes, or the process group's
 * shards. */
static int ccl_roofline(kb_ctx *ctx, ccl_state *st, kb_bench_result *res)
{
    kb_errbuf *eb = kb_ctx_err(ctx);
    kb_roofline_acc *acc;
    kb_roofline rl;
    int rc = kb_roofline_acc_create(kb_ctx_machine(ctx), &acc, eb);
    if (rc)
        return rc;
    if (st->dist)
        rc = kb_ccl_roofline_shards(acc, kb_dist_algo_of(ctx)->kind, st->ws, st->t,
                                    (double)st->n * KB_CCL_ELEM_BYTES, eb);
    else if (st->lanes)
        rc = kb_ccl_roofline_lanes(acc, &st->lj, eb);
    else
        rc = kb_ccl_roofline_job(acc, &st->job, eb);
    if (rc == 0) {
        kb_roofline_result(acc, &rl);
        kb_bench_set_roofline(res, &rl);
    }
    kb_roofline_acc_destroy(acc);
    return rc;
}

static int ccl_run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    ccl_state *st = state;
    kb_ccl_job *job = &st->job;
    int rc;
    st->size_bytes = a->size_bytes;
    if ((rc = ccl_setup(ctx, st, NULL, 0, NULL)) != 0)
        return rc;
    if (st->dist) {
        st->ws = kb_ctx_machine(ctx)->nsips;
        st->res = res;
        snprintf(res->line, sizeof res->line, "  %s (ws=%d)", st->name, st->ws);
        if ((rc = kb_spawn(ctx, dist_worker, st, st->ws)) != 0)
            return rc;
        /* bytes per rank: the whole tensor of the rank */
        add_bw(res, kb_dist_algo_of(ctx)->kind, st->ws,
               st->n * kb_dist_shards_per_rank(ctx), KB_CCL_ELEM_BYTES);
        add_traffic(ctx, res);
        return ccl_roofline(ctx, st, res);
    }
    if (st->lanes) {
        kb_ccl_lanes *lj = &st->lj;
        snprintf(res->line, sizeof res->line, "  %s (ws=%d)", lj->name, lj->ws);
        kb_bench_mark_begin(ctx, res);
        if ((rc = kb_ccl_lanes_launch(ctx, lj)) != 0)
            return rc;
        kb_bench_mark_end(ctx, res);
        add_bw(res, lj->impl->kind, lj->ws, lj->count, (int)kb_dtype_size(lj->dtype));
        add_traffic(ctx, res);
        return ccl_roofline(ctx, st, res);
    }
    snprintf(res->line, sizeof res->line, "  %s (ws=%d)", job->name, job->layout.ws);
    kb_bench_mark_begin(ctx, res);
    if ((rc = kb_ccl_job_launch(ctx, job, NULL, NULL)) != 0)
        return rc;
    kb_bench_mark_end(ctx, res);
    add_bw(res, job->impl->kind, job->layout.ws,
           job->n / kb_coll_tile_ranks(job->impl->kind, job->layout.ws),
           (int)kb_dtype_size(job->dtype));
    add_traffic(ctx, res);
    return ccl_roofline(ctx, st, res);
}

/*
 * Compares ntiles result tiles (raw f16, tile-major; `per_rank` tiles per rank) with `ref` of
 * the inputs the bench fed (kb_ccl_verify_inputs: computed in column blocks, never held
 * whole) and fills the result: "<tiles> OK", the digest of the raw bytes, the worst error
 * and, on failure, the mean line and the first wrong element.
 */
/* The digest of a result (kb_vquery.h: FNV-1a 64 up to 64 KiB, of the blocks' digests
 * beyond, which a device computes where the data is): it runs in a thread of its own while
 * the result is checked, its blocks over the CPUs. */
typedef struct digest_job {
    const void *data;
    size_t n;
    uint64_t h;
} digest_job;

static void *digest_main(void *arg)
{
    digest_job *d = arg;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    d->h = kb_vquery_digest_host(d->data, d->n, cpus > 0 ? (int)cpus : 1);
    return NULL;
}

/* The result of a check (ok: 1, 0 or a negative error), the digest of its raw bytes, and the
 * verdict's figures; ranks of per_rank tiles each. on_device: whether the device that holds
 * the result answered the check and the digest (device_verify: nothing was read back), which
 * the run reports as verified_on_device 1 / 0. */
static int report_verdict(kb_ctx *ctx, kb_bench_result *res, int ok, const kb_ccl_verdict *v,
                          uint64_t digest, int ntiles, int per_rank, int on_device)
{
    if (ok < 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    res->verified = ok;
    res->digest = digest;
    res->have_digest = 1;
    res->have_err = 1;
    res->max_abs_err = v->max_abs_err;
    res->err_bound = v->err_bound;
    kb_bench_add_extra(res, "n_wrong", (double)v->nwrong);
    kb_bench_add_extra(res, "verified_on_device", on_device);
    /* ranks, as nccl-tests counts them (a rank = SIP process group's rank is per_rank
     * shards, every one of which passed) */
    snprintf(res->ok_text, sizeof res->ok_text, "%d OK", v->ok_tiles / per_rank);
    if (!res->verified) {
        int r = v->first_bad_tile / per_rank, sh = v->first_bad_tile % per_rank;
        char where[48] = "";
        if (per_rank > 1)
            snprintf(where, sizeof where, " shard %d", sh);
        snprintf(res->detail, sizeof res->detail,
                 "got mean=%.6g, expected=%.6g (%d of %d %s wrong, first: rank %d%s element "
                 "%lld = %.6g, expected %.6g)", v->got_mean, v->want_mean, ntiles - v->ok_tiles,
                 ntiles, per_rank > 1 ? "shards" : "ranks", r, where,
                 (long long)v->first_bad_elem, v->first_got, v->first_want);
    }
    return 0;
}

/* Starts the digest of a large result in a thread of its own (0 when it runs), else 1: the
 * caller then runs digest_main itself. */
static int digest_start(digest_job *dj, pthread_t *th)
{
    return !(dj->n >= ((size_t)2 << 22) && pthread_create(th, NULL, digest_main, dj) == 0);
}

static int check_tiles(kb_ctx *ctx, kb_bench_result *res, kb_ccl_ref_fn ref,
                       kb_ccl_ref_ord_fn ord, kb_coll_kind kind, const void *raw, int ntiles,
                       int per_rank, int64_t n, int root, kb_dtype dt, int op)
{
    size_t total = (size_t)ntiles * (size_t)n;
    kb_ccl_verdict v;
    digest_job dj = { raw, total * kb_dtype_size(dt), 0 };
    pthread_t th;
    int inline_digest = digest_start(&dj, &th);
    int ok = kb_ccl_verify_inputs_ord(dt, op, raw, ref, ord, kind, KB_CCL_INPUT_SEED, ntiles, n,
                                      root, kb_ccl_input_acc_bound_op(kind, op, ntiles), &v);

    if (inline_digest)
        digest_main(&dj);
    else
        pthread_join(th, NULL);
    return report_verdict(ctx, res, ok, &v, dj.h, ntiles, per_rank, 0);
}

/* A lane run of an algorithm with an order-emulating reference: lane by lane. */
static int check_lanes_ordered(kb_ctx *ctx, kb_bench_result *res, const kb_ccl_lanes *lj,
                               const void *raw)
{
    kb_ccl_verdict v;
    digest_job dj = { raw, (size_t)lj->ws * (size_t)(lj->chunks * lj->count) *
                               kb_dtype_size(lj->dtype), 0 };
    pthread_t th;
    int inline_digest = digest_start(&dj, &th);
    int ok = kb_ccl_lanes_verify_ordered(
        lj, raw, kb_ccl_input_acc_bound_op(lj->impl->kind, lj->op, lj->ws), &v);

    if (inline_digest)
        digest_main(&dj);
    else
        pthread_join(th, NULL);
    return report_verdict(ctx, res, ok, &v, dj.h, lj->ws, 1, 0);
}

/* rank = SIP: every shard of every rank against the process group algorithm's reference. */
static int dist_verify(kb_ctx *ctx, ccl_state *st, kb_bench_result *res)
{
    const kb_ccl_algo_impl *algo = kb_dist_algo_of(ctx);
    int shards = (int)kb_tensor_rows(st->t[0]), ntiles = st->ws * shards;
    size_t per = (size_t)shards * (size_t)st->n;
    uint16_t *raw = malloc((size_t)st->ws * per * 2);
    int rc = 0;

    if (!raw)
        return kb_err_nomem(kb_ctx_err(ctx), (unsigned long long)st->ws * per * 2,
                            "the %d ranks' results, read back to check them", st->ws);
    for (int r = 0; r < st->ws && rc == 0; r++)
        rc = kb_tensor_read_raw(st->t[r], raw + (size_t)r * per);
    if (rc == 0)
        rc = check_tiles(ctx, res, algo->sip->reference, NULL, algo->kind, raw, ntiles, shards, st->n, 0,
                         KB_F16, KB_CCL_OP_SUM);
    free(raw);
    return rc;
}

/* rank = SIP in lanes: every rank's logical buffer, checked as the rank = PE job's tiles. */
static int lanes_verify(kb_ctx *ctx, ccl_state *st, kb_bench_result *res)
{
    kb_ccl_lanes *lj = &st->lj;
    int64_t n = lj->count * lj->chunks;
    void *raw = malloc((size_t)lj->ws * (size_t)n * kb_dtype_size(lj->dtype));
    int rc;

    if (!raw)
        return kb_err_nomem(kb_ctx_err(ctx),
                            (unsigned long long)lj->ws * (unsigned long long)n *
                                kb_dtype_size(lj->dtype),
                            "the %d ranks' results, read back to check them", lj->ws);
    rc = kb_ccl_lanes_read_raw(ctx, lj, raw);
    if (rc == 0)
        rc = lj->impl->ordered ? check_lanes_ordered(ctx, res, lj, raw)
                               : check_tiles(ctx, res, lj->impl->reference, NULL, lj->impl->kind,
                                             raw, lj->ws, 1, n, lj->root, lj->dtype, lj->op);
    free(raw);
    return rc;
}

/*
 * The rank = PE job's check and digest on the device that holds the tiles (a device-resident
 * backend with queries, kb_vquery.h), for the checks a device answers (kb_ccl_vquery_of: the
 * f16 sum jobs of every collective kind, all-reduce as KB_VQ_CHECK, the others as
 * KB_VQ_COLL): nothing but the answers comes back, and the verdict is the host check's bit
 * for bit. 1 when done, 0 when the host must check (no such device, a check it does not
 * answer, tiles not resident, values off the grid), or an error.
 */
static int device_verify(kb_ctx *ctx, kb_bench_result *res, const kb_ccl_job *job)
{
    const kb_backend *be = kb_ctx_backend(ctx);
    kb_resident *r = be && be->ops && be->ops->resident ? be->ops->resident(be->self) : NULL;
    kb_errbuf *eb = kb_ctx_err(ctx);
    int ws = job->layout.ws, rps = job->layout.ranks_per_sip, rc, ok;
    kb_vquery q, qd;
    kb_ccl_verdict v;
    uint64_t *pa = NULL, digest = 0;
    void *out = NULL;

    if (!r || !kb_ccl_vquery_of(job->dtype, job->op, job->impl->reference, job->impl->ordered,
                                job->impl->kind, KB_CCL_INPUT_SEED, ws, job->n,
                                job->layout.root, &q))
        return 0;
    if ((rc = kb_ctx_flush(ctx)) != 0)
        return rc;
    pa = malloc((size_t)ws * sizeof *pa);
    out = malloc(kb_vquery_result_size(&q));
    if (!pa || !out) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int t = 0; t < ws; t++)
        pa[t] = UINT64_MAX; /* no tile yet */
    /* rank s * rps + row: one shard per rank, its whole tile (kb_ccl_job_prepare) */
    for (int s = 0; s < job->layout.sips; s++)
        for (size_t i = 0; i < kb_tensor_nshards(job->tiles[s]); i++) {
            const kb_shard_spec *sh = kb_tensor_shard(job->tiles[s], i);
            int64_t rank = (int64_t)s * rps + (int64_t)sh->row0;
            if (sh->rows != 1 || (int64_t)sh->cols != job->n || rank >= ws ||
                pa[rank] != UINT64_MAX) {
                rc = 0; /* not the layout the query assumes: the host reads it */
                goto out;
            }
            pa[rank] = kb_tensor_shard_pa(job->tiles[s], i);
        }
    for (int t = 0; t < ws; t++)
        if (pa[t] == UINT64_MAX) { /* a rank without its tile: the host reads what there is */
            rc = 0;
            goto out;
        }
    qd = (kb_vquery){ KB_VQ_DIGEST, (uint32_t)ws, 0, (uint64_t)job->n * 2, 0, 0, 0.0, 0, 0 };
    rc = kb_resident_query(r, &q, pa, out, eb);
    if (rc == 0)
        rc = kb_resident_query(r, &qd, pa, &digest, eb);
    if (rc == KB_ERR_UNSUPPORTED || rc == KB_ERR_NOTFOUND) {
        rc = 0;
        goto out;
    }
    if (rc)
        goto out;
    if ((ok = kb_ccl_verdict_of_query(&q, out, &v)) < 0) {
        rc = ok == KB_ERR_UNSUPPORTED ? 0 : kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    rc = report_verdict(ctx, res, ok, &v, digest, ws, 1, 1);
    if (rc == 0)
        rc = 1;
out:
    free(pa);
    free(out);
    return rc;
}

static int ccl_verify(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    ccl_state *st = state;
    kb_ccl_job *job = &st->job;
    if (st->dist)
        return dist_verify(ctx, st, res);
    if (st->lanes)
        return lanes_verify(ctx, st, res);
    int drc = device_verify(ctx, res, job);
    if (drc != 0)
        return drc < 0 ? drc : 0;
    int ws = job->layout.ws;
    void *raw = malloc((size_t)ws * (size_t)job->n * kb_dtype_size(job->dtype));
    int rc;
    (void)a;

    if (!raw)
        return kb_err_nomem(kb_ctx_err(ctx),
                            (unsigned long long)ws * (unsigned long long)job->n *
                                kb_dtype_size(job->dtype),
                            "the %d ranks' results, read back to check them", ws);
    rc = kb_ccl_job_read_raw(ctx, job, raw);
    if (rc == 0)
        rc = check_tiles(ctx, res, job->impl->reference, job->impl->ordered, job->impl->kind, raw, ws, 1, job->n,
                         job->layout.root, job->dtype, job->op);
    free(raw);
    return rc;
}

/* `ccl` is the generic name (any collective of ccl.yaml); `ccl_allreduce` is the same bench
 * under the name it had when every algorithm was an all-reduce, kept so that existing command
 * lines, sweep files and result rows stay as they are. */
const kb_bench kb_bench_ccl = {
    .name = "ccl",
    .summary = "the collective of ccl.yaml (--algorithm/--world-size/--n-elem or "
               "--size/--buffer-kind), verified",
    .state_size = sizeof(ccl_state),
    .run = ccl_run,
    .verify = ccl_verify,
    .size_elem_bytes = KB_CCL_ELEM_BYTES,
};

const kb_bench kb_bench_ccl_allreduce = {
    .name = "ccl_allreduce",
    .summary = "the same bench as ccl (its earlier name, kept as an alias)",
    .state_size = sizeof(ccl_state),
    .run = ccl_run,
    .verify = ccl_verify,
    .size_elem_bytes = KB_CCL_ELEM_BYTES,
};

/* ---- ipcq_deadlock ---- */

static void recv_only(kb_tl *tl, const kb_kargs *a)
{
    kb_val v = tl_recv(tl, KB_DIR_W, KB_SHAPE1(a->i[KB_CCL_ARG_N]), KB_F16);
    tl_store(tl, kb_ccl_my_tile(tl, a), v);
}

static int deadlock_run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    ccl_state *st = state;
    int rc;
    if ((rc = ccl_setup(ctx, st, "ring_allreduce", (int)a->p[0], "ring_1d")) != 0)
        return rc;
    snprintf(res->line, sizeof res->line, "  ipcq_deadlock (ws=%d)", st->job.layout.ws);
    kb_bench_mark_begin(ctx, res);
    return kb_ccl_job_launch(ctx, &st->job, recv_only, "recv_only");
}

const kb_bench kb_bench_ipcq_deadlock = {
    .name = "ipcq_deadlock",
    .summary = "every PE of a ring only receives: must end in a deadlock report (exit 3)",
    .params = {
        { "world_size", 8, 2, 8192, "ranks (PEs) in the ring" },
    },
    .nparams = 1,
    .state_size = sizeof(ccl_state),
    .run = deadlock_run,
};
