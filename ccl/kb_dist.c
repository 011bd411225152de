/*
 * kb_dist — process group, epoch barriers and the rank = SIP collectives (kb_dist.h). The
 * process group names no algorithm: it finds the module's entry in the registry (one with a
 * rank = SIP form, kb_dist_algo.h) and calls the form's install plan, layout, validator,
 * argument builder and grid. A new rank = SIP collective = its own file (kernel, form, entry) +
 * one line in algos[] (kb_ccl_algos.c) + its test + its ccl.yaml entry. all_gather, reduce_scatter, broadcast and
 * reduce and all_to_all launch the kernels of kb_dist_coll.c over the entry's wiring (for a
 * wiring they do not know, all_gather and reduce_scatter are built on the entry's
 * all_reduce). send / recv meet outside the epochs, in a list of waiting halves keyed by
 * (src, dst, seq); the second half to arrive launches kb_dist_p2p_kernel over the route.
 * Limits: one process group per context (IPCQ is installed once per PE); SUM only; one
 * send/recv transfer at a time.
 */
#include "kb_dist.h"
#include "kb_dist_algo.h"
#include "kb_dist_coll.h"
#include "kb_ccl_reg.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_sync.h"

enum { EP_INIT = 1, EP_ALLREDUCE, EP_BARRIER, EP_ALLGATHER, EP_REDUCESCATTER, EP_BROADCAST,
       EP_REDUCE, EP_ALLTOALL, EP_ALLREDUCE_SHARDS };
static const char *const ep_names[] = { "", "init_process_group", "all_reduce", "barrier",
                                        "all_gather", "reduce_scatter", "broadcast", "reduce",
                                        "all_to_all", "all_reduce_shards" };

typedef struct epoch {
    int id, kind, arrived, users;
    int root;                 /* broadcast / reduce: the root rank every rank named */
    uint8_t *joined;          /* [ws] */
    kb_tensor **a, **b;       /* [ws] per-rank arguments */
    kb_signal done;
    int rc;
} epoch;

/* A point-to-point half (send or recv) waiting for its peer: the rendezvous key is (src, dst,
 * seq), seq counting the calls of that ordered pair on each side. The waiting rank frees it
 * when it resumes; dist_free frees what a stopped run left. */
typedef struct p2p {
    struct p2p *next;
    int src, dst, poster;     /* poster: the rank that waits (src for a send, dst for a recv) */
    uint64_t seq;
    kb_tensor *t;
    int matched, rc;
    kb_waitq waiters;
    char what[128];           /* what the waiting rank waits on, for deadlock reports */
} p2p;

typedef struct dist {
    int ws;
    int initialised;
    const kb_ccl_algo_impl *algo; /* the registry's entry */
    const kb_ccl_sip_form *form;  /* its rank = SIP form (algo->sip) */
    char module[KB_CFG_NAME_MAX];
    kb_ipcq_cfg icfg;
    int small_lanes;          /* ccl.yaml small_lanes: all_reduce_shards' small form allowed */
    int root_cube;
    epoch *cur;
    epoch *done;              /* the last completed epoch while ranks may still wait in it */
    kb_kargs *args;           /* launch arguments [ws], reused (owned here: a failed kernel
                                 never returns to the launching fiber) */
    int next_id;
    kb_time comm;
    uint64_t calls[KB_COLL_NKINDS], inter_sip[KB_COLL_NKINDS]; /* kb_dist_traffic */
    p2p *posts;               /* unmatched and matched-but-not-resumed halves */
    uint64_t *seq_send, *seq_recv; /* [src * ws + dst]: calls so far per ordered pair */
    int p2p_busy;             /* a transfer runs; matched pairs queue in p2p_wait */
    kb_waitq p2p_wait;
} dist;

static void dist_free(void *p)
{
    dist *d = p;
    /* at context destroy no fiber resumes: ranks still waiting in the open epoch never
     * drop their references, so it goes regardless of users */
    for (int i = 0; i < 2; i++) {
        epoch *e = i ? d->done : d->cur;
        if (e) {
            free(e->joined);
            free(e->a);
            free(e->b);
            free(e);
        }
    }
    while (d->posts) {
        p2p *h = d->posts;
        d->posts = h->next;
        free(h);
    }
    free(d->seq_send);
    free(d->seq_recv);
    free(d->args);
    free(d);
}

static dist *dist_of(kb_ctx *ctx) { return kb_ctx_ext(ctx, KB_EXT_CCL); }

int kb_dist_get_world_size(kb_ctx *ctx)
{
    dist *d = dist_of(ctx);
    return d && d->initialised ? d->ws : -1;
}

int kb_dist_get_rank(kb_ctx *ctx) { return kb_ctx_rank(ctx); }

const char *kb_dist_algorithm(kb_ctx *ctx)
{
    dist *d = dist_of(ctx);
    return d && d->initialised ? d->module : NULL;
}

const kb_ccl_algo_impl *kb_dist_algo_of(kb_ctx *ctx)
{
    dist *d = dist_of(ctx);
    return d && d->initialised ? d->algo : NULL;
}

/* Bytes sent so far over the SIPs' links: every install plan of the table wires inter-SIP
 * links on the global directions, and the hierarchical one the lane rings on peer
 * directions (which lead to other SIPs only). */
static uint64_t global_bytes(kb_ctx *ctx)
{
    return kb_ipcq_dir_bytes(ctx, KB_DIR_GLOBAL_E) + kb_ipcq_dir_bytes(ctx, KB_DIR_GLOBAL_W) +
           kb_ipcq_dir_bytes(ctx, KB_DIR_GLOBAL_N) + kb_ipcq_dir_bytes(ctx, KB_DIR_GLOBAL_S) +
           kb_ipcq_peer_bytes(ctx);
}

void kb_dist_traffic(kb_ctx *ctx, kb_coll_kind kind, uint64_t *calls, uint64_t *inter_sip_bytes)
{
    dist *d = dist_of(ctx);
    int ok = d && (unsigned)kind < KB_COLL_NKINDS;
    *calls = ok ? d->calls[kind] : 0;
    *inter_sip_bytes = ok ? d->inter_sip[kind] : 0;
}

kb_time kb_dist_comm_time(kb_ctx *ctx)
{
    dist *d = dist_of(ctx);
    return d ? d->comm : 0;
}

/* Before init_process_group the layout is every PE's (the hierarchical process group's). */
kb_dp_policy kb_dist_policy(kb_ctx *ctx)
{
    dist *d = dist_of(ctx);
    if (d)
        return d->form->policy(kb_ctx_machine(ctx));
    return kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, 0, 0);
}

int kb_dist_shards_per_rank(kb_ctx *ctx)
{
    dist *d = dist_of(ctx);
    kb_machine *m = kb_ctx_machine(ctx);
    int s = d ? d->form->shards(m) : m->ncubes * m->npes;
    assert(s >= 1 && s <= m->ncubes * m->npes); /* a rank's shards are PEs of its SIP */
    return s;
}

/* ---- epochs ---- */

typedef int (*exec_fn)(kb_ctx *ctx, dist *d, epoch *e);

static int join_root(kb_ctx *ctx, dist *d, int kind, kb_tensor *a, kb_tensor *b, int root,
                     exec_fn exec);

static int join(kb_ctx *ctx, dist *d, int kind, kb_tensor *a, kb_tensor *b, exec_fn exec)
{
    return join_root(ctx, d, kind, a, b, 0, exec);
}

static int join_root(kb_ctx *ctx, dist *d, int kind, kb_tensor *a, kb_tensor *b, int root,
                     exec_fn exec)
{
    kb_errbuf *eb = kb_ctx_err(ctx);
    int r = kb_ctx_rank(ctx), rc;
    epoch *e;

    if (r < 0)
        return kb_err_set(eb, KB_ERR_STATE, "%s outside a spawned rank worker", ep_names[kind]);
    if (r >= d->ws)
        return kb_err_set(eb, KB_ERR_RANGE, "rank %d outside a world of %d", r, d->ws);
    if (!d->cur) {
        e = calloc(1, sizeof *e);
        if (!e || !(e->joined = calloc((size_t)d->ws, 1)) ||
            !(e->a = calloc((size_t)d->ws, sizeof *e->a)) ||
            !(e->b = calloc((size_t)d->ws, sizeof *e->b))) {
            if (e) {
                free(e->joined);
                free(e->a);
                free(e);
            }
            return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        }
        e->id = d->next_id++;
        e->kind = kind;
        e->root = root;
        e->users = 1; /* the dist's reference */
        kb_signal_init(&e->done);
        d->cur = e;
    }
    e = d->cur;
    /* the last rank to arrive closes an epoch, and the dist holds the open one */
    assert(e->arrived < d->ws && e->users >= 1);
    if (e->joined[r])
        return kb_err_set(eb, KB_ERR_STATE,
                          "rank %d joined collective epoch %d (%s) twice: it called %s again "
                          "before every rank had joined", r, e->id, ep_names[e->kind],
                          ep_names[kind]);
    if (e->kind != kind)
        return kb_err_set(eb, KB_ERR_STATE,
                          "rank %d called %s but epoch %d is a %s of the other ranks", r,
                          ep_names[kind], e->id, ep_names[e->kind]);
    if (e->root != root)
        return kb_err_set(eb, KB_ERR_STATE, "rank %d called %s with root %d but the other "
                          "ranks of epoch %d named root %d", r, ep_names[kind], root, e->id,
                          e->root);
    e->joined[r] = 1;
    e->a[r] = a;
    e->b[r] = b;
    e->users++;
    if (++e->arrived < d->ws) {
        kb_signal_wait(kb_ctx_sim(ctx), &e->done);
    } else {
        kb_time t0 = kb_sim_now(kb_ctx_sim(ctx));
        uint64_t b0 = global_bytes(ctx);
        /* every rank left the previous epoch before it could join this one */
        assert(!d->done);
        d->cur = NULL;
        d->done = e;
        e->users--; /* the dist no longer points at it */
        e->rc = exec ? exec(ctx, d, e) : 0;
        int ck = kind == EP_ALLREDUCE || kind == EP_ALLREDUCE_SHARDS ? KB_COLL_ALLREDUCE
               : kind == EP_ALLGATHER ? KB_COLL_ALLGATHER
               : kind == EP_REDUCESCATTER ? KB_COLL_REDUCE_SCATTER
               : kind == EP_BROADCAST ? KB_COLL_BROADCAST : kind == EP_REDUCE ? KB_COLL_REDUCE
               : kind == EP_ALLTOALL ? KB_COLL_ALLTOALL : -1;
        if (ck >= 0) {
            d->calls[ck]++;
            d->inter_sip[ck] += global_bytes(ctx) - b0;
        }
        if (e->rc)
            kb_err_prefix(eb, "%s of epoch %d (run for every rank by rank %d, the last to join)",
                          ep_names[kind], e->id, r);
        if (kind != EP_BARRIER && kind != EP_INIT)
            d->comm += kb_sim_now(kb_ctx_sim(ctx)) - t0;
        kb_signal_fire(kb_ctx_sim(ctx), &e->done);
    }
    rc = e->rc;
    assert(e->users >= 1);
    if (--e->users == 0) {
        if (d->done == e)
            d->done = NULL;
        free(e->joined);
        free(e->a);
        free(e->b);
        free(e);
    }
    return rc;
}

static int exec_init(kb_ctx *ctx, dist *d, epoch *e)
{
    (void)e;
    return d->form->install(ctx, &d->icfg, d->ws);
}

/* The i-th module with a rank = SIP form: the built-in table's, then the registry's. */
static const kb_ccl_algo_impl *any_algo_at(const kb_ccl_reg *r, int i)
{
    const kb_ccl_algo_impl *a;
    int nb = 0;
    while (kb_dist_algo_at(nb))
        nb++;
    if (i < nb)
        return kb_dist_algo_at(i);
    for (int k = 0, n = nb; (a = kb_ccl_reg_algo_at(r, k)) != NULL; k++)
        if (a->sip && n++ == i)
            return a;
    return NULL;
}

/* "a, b or c": the modules of the table and the registry, for the error that names them. */
static void algo_list(const kb_ccl_reg *r, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; any_algo_at(r, i) && len < cap; i++) {
        const char *sep = i == 0 ? "" : any_algo_at(r, i + 1) ? ", " : " or ";
        int k = snprintf(buf + len, cap - len, "%s%s", sep, any_algo_at(r, i)->module);
        if (k < 0)
            break;
        len += (size_t)k;
    }
}

int kb_dist_init_process_group(kb_ctx *ctx, const char *backend, const char *algorithm)
{
    const kb_ccl_cfg *cfg = kb_ccl_config_of(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    kb_machine *m = kb_ctx_machine(ctx);
    dist *d = dist_of(ctx);

    if (!backend || strcmp(backend, "ahbm") != 0)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "init_process_group: backend '%s' is not "
                          "supported (use \"ahbm\")", backend ? backend : "(null)");
    if (!cfg)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    if (!d) {
        /* build it whole, attach it only when every check passed */
        const char *name = algorithm ? algorithm : cfg->defaults.algorithm;
        const kb_ccl_algo *entry = kb_ccl_config_find(cfg, name);
        const char *module = entry ? entry->module : name;
        kb_ccl_params p = kb_ccl_config_params(cfg, entry);
        dist nd;
        memset(&nd, 0, sizeof nd);
        nd.ws = m->nsips;
        snprintf(nd.module, sizeof nd.module, "%s", module);
        nd.algo = kb_ccl_reg_find_dist(cfg->reg, module);
        nd.form = nd.algo ? nd.algo->sip : NULL;
        if (!nd.algo) {
            char names[256];
            algo_list(cfg->reg, names, sizeof names);
            return kb_err_set(eb, KB_ERR_UNSUPPORTED,
                              "init_process_group: algorithm '%s' (module %s) has no process-group "
                              "form; use %s", name, module, names);
        }
        if (p.world_size != 0 && p.world_size != nd.ws)
            return kb_err_set(eb, KB_ERR_CONFIG,
                              "init_process_group: %s sets world_size %d (rank = PE mode); the "
                              "process group has one rank per SIP (%d)", name, p.world_size,
                              nd.ws);
        nd.root_cube = entry && entry->root_cube >= 0 ? entry->root_cube : m->ncubes - 1;
        if (nd.root_cube >= m->ncubes)
            return kb_err_set(eb, KB_ERR_CONFIG, "root_cube %d: the SIP has %d cubes",
                              nd.root_cube, m->ncubes);
        int rc = kb_ccl_config_ipcq(&p, &nd.icfg, eb);
        nd.small_lanes = p.small_lanes != 0;
        if (rc)
            return rc;
        nd.args = calloc((size_t)nd.ws, sizeof *nd.args);
        nd.seq_send = calloc((size_t)nd.ws * (size_t)nd.ws, sizeof *nd.seq_send);
        nd.seq_recv = calloc((size_t)nd.ws * (size_t)nd.ws, sizeof *nd.seq_recv);
        d = malloc(sizeof *d);
        if (!d || !nd.args || !nd.seq_send || !nd.seq_recv) {
            free(d);
            free(nd.args);
            free(nd.seq_send);
            free(nd.seq_recv);
            return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        }
        *d = nd;
        kb_ctx_set_ext(ctx, KB_EXT_CCL, d, dist_free);
    } else if (algorithm && !d->initialised) {
        /* ranks joining the same init: they must name the same algorithm */
        const kb_ccl_algo *entry = kb_ccl_config_find(cfg, algorithm);
        const char *module = entry ? entry->module : algorithm;
        if (strcmp(module, d->module) != 0)
            return kb_err_set(eb, KB_ERR_STATE, "init_process_group: rank %d asks for %s but "
                              "another rank chose %s", kb_ctx_rank(ctx), module, d->module);
    }
    if (kb_ctx_nprocs(ctx) != d->ws)
        return kb_err_set(eb, KB_ERR_STATE, "init_process_group: %d workers were spawned but "
                          "the world has %d ranks (one per SIP)", kb_ctx_nprocs(ctx), d->ws);
    int rc = join(ctx, d, EP_INIT, NULL, NULL, exec_init);
    if (rc == 0)
        d->initialised = 1;
    return rc;
}

static int need_init(kb_ctx *ctx, dist *d, const char *what)
{
    if (!d || !d->initialised)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "%s before init_process_group", what);
    return 0;
}

static int launch_allreduce(kb_ctx *ctx, dist *d, kb_tensor *const *t)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int rc = d->form->validate(ctx, t, d->ws, "all_reduce");
    if (rc)
        return rc;
    uint64_t n = kb_tensor_shard(t[0], 0)->nbytes / kb_dtype_size(kb_tensor_dtype(t[0]));
    kb_kargs *args = d->args;
    memset(args, 0, (size_t)d->ws * sizeof *args);
    for (int r = 0; r < d->ws; r++) {
        kb_dist_launch l = { t[r], r, d->ws, (int64_t)n, d->root_cube };
        if ((rc = d->form->args(ctx, &l, &args[r])) != 0)
            return rc;
    }
    kb_grid g = d->form->grid(m, d->ws);
    return kb_launch_per_sip(ctx, d->module, d->form->kernel, args, &g);
}

static int exec_allreduce(kb_ctx *ctx, dist *d, epoch *e)
{
    return launch_allreduce(ctx, d, e->a);
}

int kb_dist_all_reduce(kb_ctx *ctx, kb_tensor *t, kb_dist_op op)
{
    static const char *const names[] = { "SUM", "PROD", "MAX", "MIN" };
    dist *d = dist_of(ctx);
    int rc = need_init(ctx, d, "all_reduce");
    if (rc)
        return rc;
    if (op != KB_DIST_SUM)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_UNSUPPORTED,
                          "all_reduce: op %s is not supported (only SUM)",
                          (unsigned)op < 4 ? names[op] : "?");
    return join(ctx, d, EP_ALLREDUCE, t, NULL, exec_allreduce);
}

/* The lanes' part of an all_reduce_shards of k shards of t (f32, one per lane): the process
 * group's lane rings are there and each shard splits over the ranks; *n gets a shard's
 * elements. 0 or the error. */
static int shards_check(kb_ctx *ctx, dist *d, kb_tensor *t, uint64_t *n)
{
    kb_machine *m = kb_ctx_machine(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    if (d->form != &kb_ccl_sip_hierarchical ||
        (d->ws > 1 && !kb_ipcq_is_wired(ctx, kb_machine_pe(m, 0, 0, 0), KB_DIST_LANE_NEXT)))
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "all_reduce_shards: the process group (%s) "
                          "has no lane rings: they come with hierarchical_allreduce's wiring "
                          "when the IPCQ ring area holds two more rings per PE (lower "
                          "slot_size or n_slots)", d->module);
    kb_dtype dt = kb_tensor_dtype(t);
    *n = kb_tensor_shard(t, 0)->nbytes / kb_dtype_size(dt);
    if (dt != KB_F32)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "all_reduce_shards: %s tensors (f32 only)",
                          kb_dtype_name(dt));
    if (*n % (uint64_t)d->ws)
        return kb_err_set(eb, KB_ERR_USAGE, "all_reduce_shards: a shard of %llu elements does "
                          "not split over %d ranks", (unsigned long long)*n, d->ws);
    return 0;
}

/* kb_dist.h: ws / 2 steps of every lane's whole block against 2 (ws - 1) of n / ws. */
int kb_dist_lanes_small(const kb_machine *m, int ws, int k, uint64_t n)
{
    if (ws < 2 || ws > KB_DIST_SMALL_MAX)
        return 0;
    double lat = m->cfg.inter_sip.latency_ns + m->cfg.switch_overhead_ns;
    double bw = m->cfg.inter_sip.bandwidth_gbps; /* bytes per ns */
    double bytes = (double)n * 4.0 * k;
    double ring = 2.0 * (ws - 1) * (lat + bytes / ws / 2.0 / bw);
    double small = (double)(ws / 2) * (lat + bytes / bw);
    return small < ring;
}

/* Whether k lanes are the first PEs of a SIP's cube 0 or whole cubes from cube 0, and the
 * grid of them (*pes x *cubes). */
static int shards_lanes(const kb_machine *m, int k, int *pes, int *cubes)
{
    *pes = k <= m->npes ? k : m->npes;
    *cubes = k <= m->npes ? 1 : k / m->npes;
    return k >= 1 && (k <= m->npes || (k % m->npes == 0 && k / m->npes <= m->ncubes));
}

/* all_reduce shard by shard over the lane rings (kb_dist_lanes_allreduce_kernel). */
static int exec_allreduce_shards(kb_ctx *ctx, dist *d, epoch *e)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int k = (int)kb_tensor_nshards(e->a[0]), S = m->ncubes * m->npes, rc, pes, cubes;
    uint64_t n;
    /* every PE's block, or the blocks of the first k PEs (cube 0's first PEs, or whole cubes
     * from cube 0): those lanes only */
    if (k == S || !shards_lanes(m, k, &pes, &cubes))
        rc = d->form->validate(ctx, e->a, d->ws, "all_reduce_shards");
    else
        rc = kb_dist_check_sip_local(ctx, e->a, d->ws, k, "all_reduce_shards",
                                     "rows over the first PEs", NULL);
    if (rc || (rc = shards_check(ctx, d, e->a[0], &n)) != 0)
        return rc;
    kb_kargs *args = d->args;
    memset(args, 0, (size_t)d->ws * sizeof *args);
    int small = d->small_lanes && kb_dist_lanes_small(m, d->ws, k, n);
    for (int r = 0; r < d->ws; r++)
        KB_KARGS_PUT(&args[r], (kb_dist_lanes_args){ .tile = kb_tensor_va(e->a[r]),
                                                     .n = (int64_t)n, .ws = d->ws, .sip = r,
                                                     .small = small });
    kb_grid g = d->form->grid(m, d->ws);
    if (k < S) { /* the first k lanes */
        g.pes = pes;
        g.cubes = cubes;
    }
    assert(g.pes * g.cubes == k || k == S);
    return kb_launch_per_sip(ctx, "all_reduce_shards", kb_dist_lanes_allreduce_kernel, args, &g);
}

int kb_dist_all_reduce_shards_stage(kb_ctx *ctx, kb_tensor *t, kb_stage *st)
{
    dist *d = dist_of(ctx);
    kb_machine *m = kb_ctx_machine(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    int r = kb_ctx_rank(ctx), rc = need_init(ctx, d, "all_reduce_shards"), k, pes, cubes;
    uint64_t n;
    if (rc)
        return rc;
    if (r < 0 || r >= d->ws)
        return kb_err_set(eb, KB_ERR_STATE, "all_reduce_shards (a stage): rank %d outside a "
                          "world of %d", r, d->ws);
    k = t ? (int)kb_tensor_nshards(t) : 0;
    if (!t || !shards_lanes(m, k, &pes, &cubes))
        return kb_err_set(eb, KB_ERR_USAGE, "all_reduce_shards (a stage): the tensor must be "
                          "split over the first PEs of the SIP, or whole cubes of them (%d "
                          "shards)", k);
    /* the epoch's checks (kb_dist_check_sip_local), on this rank's tensor alone */
    if (kb_tensor_sip(t) != (unsigned)r)
        return kb_err_set(eb, KB_ERR_STATE, "all_reduce_shards: rank %d's tensor '%s' lives on "
                          "SIP %u (call set_device(rank) first)", r, kb_tensor_name(t),
                          kb_tensor_sip(t));
    for (int i = 0; i < k; i++)
        if (kb_tensor_shard(t, (size_t)i)->nbytes != kb_tensor_shard(t, 0)->nbytes)
            return kb_err_set(eb, KB_ERR_STATE, "all_reduce_shards: uneven shard %d of rank "
                              "%d", i, r);
    if ((rc = shards_check(ctx, d, t, &n)) != 0)
        return rc;
    memset(st, 0, sizeof *st);
    st->kernel = kb_dist_lanes_allreduce_kernel;
    int small = d->small_lanes && kb_dist_lanes_small(m, d->ws, k, n);
    KB_KARGS_PUT(&st->args, (kb_dist_lanes_args){ .tile = kb_tensor_va(t), .n = (int64_t)n,
                                                   .ws = d->ws, .sip = r, .small = small });
    st->pes = pes;
    st->cubes = cubes;
    if (r == 0) { /* the group's count, once for its ranks: each lane sends 2 (ws - 1) units
                   * of n / ws f32 round its ring, or in the small form its n f32 ws - 1
                   * times (kb_dist_lanes_allreduce_kernel) */
        d->calls[KB_COLL_ALLREDUCE]++;
        if (d->ws > 1)
            d->inter_sip[KB_COLL_ALLREDUCE] +=
                (uint64_t)d->ws * (uint64_t)k * (uint64_t)(d->ws - 1) * 4u *
                (small ? n : 2u * (n / (uint64_t)d->ws));
    }
    return 0;
}

int kb_dist_all_reduce_shards(kb_ctx *ctx, kb_tensor *t)
{
    dist *d = dist_of(ctx);
    int rc = need_init(ctx, d, "all_reduce_shards");
    return rc ? rc : join(ctx, d, EP_ALLREDUCE_SHARDS, t, NULL, exec_allreduce_shards);
}

int kb_dist_barrier(kb_ctx *ctx)
{
    dist *d = dist_of(ctx);
    int rc = need_init(ctx, d, "barrier");
    return rc ? rc : join(ctx, d, EP_BARRIER, NULL, NULL, NULL);
}

/* ---- all_gather / reduce_scatter ---- */

/* The arguments of scatter_in and gather_out: the rank's narrow tensor (m x S*c, c columns
 * per PE) and its wide one (S*m x ws*S*c, one m x ws*S*c block per PE). */
typedef struct place_args {
    kb_va src, dst; /* scatter_in: narrow -> wide; gather_out: wide -> narrow */
    int64_t m, c;
    int64_t S;      /* shards per rank */
    int64_t ws, rank;
    kb_dtype dt;
} place_args;

/*
 * Per PE: copy the PE's block of `in` (m x c, column block j of rank r) into columns
 * [(r*S + j)*c, +c) of its zeroed out block (m x ws*S*c), row by row.
 */
static void scatter_in(kb_tl *tl, const kb_kargs *ka)
{
    const place_args *a = KB_KARGS_GET(ka, place_args);
    int64_t m = a->m, c = a->c, S = a->S, ws = a->ws, r = a->rank;
    kb_dtype dt = a->dt;
    size_t es = kb_dtype_size(dt);
    int64_t j = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    int64_t wide = ws * S * c;
    kb_va in = a->src + (kb_va)(j * m * c) * es;
    kb_va block = a->dst + (kb_va)(j * m * wide) * es;
    kb_va out = block + (kb_va)((r * S + j) * c) * es;
    kb_val z = tl_full(tl, KB_SHAPE2(m, wide), 0.0f); /* the other ranks' columns sum in as 0 */
    tl_store(tl, block, z);
    tl_free(tl, z);
    for (int64_t row = 0; row < m; row++) {
        kb_val v = tl_load(tl, in + (kb_va)(row * c) * es, KB_SHAPE1(c), dt);
        tl_store(tl, out + (kb_va)(row * wide) * es, v);
        tl_free(tl, v);
    }
}

/* Inverse: the PE's chunk of the reduced block back into its block of out. */
static void gather_out(kb_tl *tl, const kb_kargs *ka)
{
    const place_args *a = KB_KARGS_GET(ka, place_args);
    int64_t m = a->m, c = a->c, S = a->S, ws = a->ws, r = a->rank;
    kb_dtype dt = a->dt;
    size_t es = kb_dtype_size(dt);
    int64_t j = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    int64_t wide = ws * S * c;
    kb_va src = a->src + (kb_va)(j * m * wide) * es + (kb_va)((r * S + j) * c) * es;
    kb_va dst = a->dst + (kb_va)(j * m * c) * es;
    for (int64_t row = 0; row < m; row++) {
        kb_val v = tl_load(tl, src + (kb_va)(row * wide) * es, KB_SHAPE1(c), dt);
        tl_store(tl, dst + (kb_va)(row * c) * es, v);
        tl_free(tl, v);
    }
}

static int exec_gather(kb_ctx *ctx, dist *d, epoch *e, int reduce_scatter)
{
    kb_machine *m = kb_ctx_machine(ctx);
    /* e->a = out and e->b = in for both; the wide one is all_gather's out / reduce_scatter's in */
    kb_tensor **wide = reduce_scatter ? e->b : e->a, **narrow = reduce_scatter ? e->a : e->b;
    int S = kb_dist_shards_per_rank(ctx), rc;
    kb_errbuf *eb = kb_ctx_err(ctx);

    for (int r = 0; r < d->ws; r++)
        if (!wide[r] || !narrow[r] || kb_tensor_sip(wide[r]) != (unsigned)r || kb_tensor_sip(narrow[r]) != (unsigned)r)
            return kb_err_set(eb, KB_ERR_STATE, "%s: rank %d's tensors must live on SIP %d",
                              ep_names[reduce_scatter ? EP_REDUCESCATTER : EP_ALLGATHER], r, r);
    int64_t rows = kb_tensor_rows(narrow[0]), c = kb_tensor_cols(narrow[0]) / S;
    int bad = -1;
    for (int r = 0; r < d->ws && bad < 0; r++)
        if ((int)kb_tensor_nshards(narrow[r]) != S || kb_tensor_cols(narrow[r]) % S != 0 ||
            kb_tensor_rows(narrow[r]) != rows || kb_tensor_cols(narrow[r]) != kb_tensor_cols(narrow[0]) ||
            kb_tensor_dtype(narrow[r]) != kb_tensor_dtype(narrow[0]) || kb_tensor_rows(wide[r]) != rows * S ||
            kb_tensor_cols(wide[r]) != kb_tensor_cols(narrow[0]) * d->ws || kb_tensor_dtype(wide[r]) != kb_tensor_dtype(narrow[0]))
            bad = r;
    if (bad >= 0)
        return kb_err_set(eb, KB_ERR_STATE,
                          "%s: rank %d: the narrow tensor must be (m x k) split column-wise "
                          "over the rank's %d PEs and the wide one (%d*m x ws*k) row-wise over "
                          "them, alike on every rank",
                          ep_names[reduce_scatter ? EP_REDUCESCATTER : EP_ALLGATHER], bad, S, S);
    kb_grid g = d->form->grid(m, d->ws);
    int tree = kb_dist_coll_tree(d->form);
    if (tree >= 0) {
        /* the real algorithms (kb_dist_coll.c) over the process group's wiring */
        kb_dtype dt = kb_tensor_dtype(narrow[0]);
        int64_t pieces = kb_dist_coll_pieces(reduce_scatter, m->cfg.scratch_size_bytes, rows,
                                             S, d->ws, c, dt);
        if (pieces == 0)
            return kb_err_set(eb, KB_ERR_USAGE,
                              "%s: a PE's %lld x %lld block (%s; f32 while reduced) does not "
                              "fit its %llu bytes of scratch, and only blocks of one row "
                              "stream in pieces",
                              ep_names[reduce_scatter ? EP_REDUCESCATTER : EP_ALLGATHER],
                              (long long)rows, (long long)(c * S * d->ws), kb_dtype_name(dt),
                              (unsigned long long)m->cfg.scratch_size_bytes);
        for (int r = 0; r < d->ws; r++) {
            kb_kargs *a = &d->args[r];
            memset(a, 0, sizeof *a);
            KB_KARGS_PUT(a, (kb_dist_gather_args){
                .sh = kb_dist_coll_shape_of(m, tree, d->ws, d->root_cube, rows, S, dt),
                .narrow = kb_tensor_va(narrow[r]), .wide = kb_tensor_va(wide[r]), .c = c,
                .pieces = pieces });
        }
        return kb_launch_per_sip(ctx, reduce_scatter ? "dist_reduce_scatter" : "dist_all_gather",
                                 reduce_scatter ? kb_dist_reducescatter_kernel
                                                : kb_dist_allgather_kernel,
                                 d->args, &g);
    }
    /* another entry's wiring: built on its all-reduce (a zero-padded buffer / the own chunk
     * of the sum). d->args is shared with launch_allreduce; kb_launch_per_sip copies what it
     * is given */
    if (reduce_scatter && (rc = launch_allreduce(ctx, d, wide)) != 0)
        return rc;
    for (int r = 0; r < d->ws; r++) {
        kb_kargs *a = &d->args[r];
        memset(a, 0, sizeof *a);
        KB_KARGS_PUT(a, (place_args){
            .src = reduce_scatter ? kb_tensor_va(wide[r]) : kb_tensor_va(narrow[r]),
            .dst = reduce_scatter ? kb_tensor_va(narrow[r]) : kb_tensor_va(wide[r]),
            .m = rows, .c = c, .S = S, .ws = d->ws, .rank = r,
            .dt = kb_tensor_dtype(narrow[r]) });
    }
    rc = kb_launch_per_sip(ctx, reduce_scatter ? "reduce_scatter_pick" : "all_gather_place",
                           reduce_scatter ? gather_out : scatter_in, d->args, &g);
    if (rc == 0 && !reduce_scatter)
        rc = launch_allreduce(ctx, d, wide);
    return rc;
}

static int exec_allgather(kb_ctx *ctx, dist *d, epoch *e) { return exec_gather(ctx, d, e, 0); }
static int exec_reducescatter(kb_ctx *ctx, dist *d, epoch *e) { return exec_gather(ctx, d, e, 1); }

int kb_dist_all_gather(kb_ctx *ctx, kb_tensor *out, kb_tensor *in)
{
    dist *d = dist_of(ctx);
    int rc = need_init(ctx, d, "all_gather");
    return rc ? rc : join(ctx, d, EP_ALLGATHER, out, in, exec_allgather);
}

int kb_dist_reduce_scatter(kb_ctx *ctx, kb_tensor *out, kb_tensor *in)
{
    dist *d = dist_of(ctx);
    int rc = need_init(ctx, d, "reduce_scatter");
    return rc ? rc : join(ctx, d, EP_REDUCESCATTER, out, in, exec_reducescatter);
}

/* ---- broadcast / reduce ---- */

static int exec_rooted(kb_ctx *ctx, dist *d, epoch *e, int reduce)
{
    kb_machine *m = kb_ctx_machine(ctx);
    const char *what = ep_names[reduce ? EP_REDUCE : EP_BROADCAST];
    int tree = kb_dist_coll_tree(d->form), rc;
    if (tree < 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_UNSUPPORTED, "%s: the process group's "
                          "algorithm %s (mapper %s) has no %s", what, d->module,
                          d->form->mapper ? d->form->mapper : "?", what);
    if ((rc = d->form->validate(ctx, e->a, d->ws, what)) != 0)
        return rc;
    assert(e->root >= 0 && e->root < d->ws); /* check_root, and every rank named it */
    if (d->ws == 1 && !reduce)
        return 0; /* the root's tensor is every rank's already */
    uint64_t n = kb_tensor_shard(e->a[0], 0)->nbytes / kb_dtype_size(kb_tensor_dtype(e->a[0]));
    for (int r = 0; r < d->ws; r++) {
        kb_kargs *a = &d->args[r];
        memset(a, 0, sizeof *a);
        KB_KARGS_PUT(a, (kb_dist_rooted_args){
            .sh = kb_dist_coll_shape_of(m, tree, d->ws, d->root_cube, (int64_t)n,
                                        kb_dist_shards_per_rank(ctx), kb_tensor_dtype(e->a[r])),
            .t = kb_tensor_va(e->a[r]), .root = e->root });
    }
    kb_grid g = d->form->grid(m, d->ws);
    return kb_launch_per_sip(ctx, reduce ? "dist_reduce" : "dist_broadcast",
                             reduce ? kb_dist_reduce_kernel : kb_dist_broadcast_kernel, d->args,
                             &g);
}

static int exec_broadcast(kb_ctx *ctx, dist *d, epoch *e) { return exec_rooted(ctx, d, e, 0); }
static int exec_reduce(kb_ctx *ctx, dist *d, epoch *e) { return exec_rooted(ctx, d, e, 1); }

static int check_root(kb_ctx *ctx, dist *d, const char *what, int root)
{
    if (root < 0 || root >= d->ws)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_RANGE, "%s: root %d outside a world of %d "
                          "ranks", what, root, d->ws);
    return 0;
}

int kb_dist_broadcast(kb_ctx *ctx, kb_tensor *t, int root)
{
    dist *d = dist_of(ctx);
    int rc = need_init(ctx, d, "broadcast");
    if (rc == 0)
        rc = check_root(ctx, d, "broadcast", root);
    return rc ? rc : join_root(ctx, d, EP_BROADCAST, t, NULL, root, exec_broadcast);
}

int kb_dist_reduce(kb_ctx *ctx, kb_tensor *t, kb_dist_op op, int root)
{
    static const char *const names[] = { "SUM", "PROD", "MAX", "MIN" };
    dist *d = dist_of(ctx);
    int rc = need_init(ctx, d, "reduce");
    if (rc == 0)
        rc = check_root(ctx, d, "reduce", root);
    if (rc == 0 && op != KB_DIST_SUM)
        rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_UNSUPPORTED,
                        "reduce: op %s is not supported (only SUM)",
                        (unsigned)op < 4 ? names[op] : "?");
    return rc ? rc : join_root(ctx, d, EP_REDUCE, t, NULL, root, exec_reduce);
}

/* ---- all_to_all ---- */

static int exec_alltoall(kb_ctx *ctx, dist *d, epoch *e)
{
    kb_machine *m = kb_ctx_machine(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    int tree = kb_dist_coll_tree(d->form), rc;
    /* e->a = out, e->b = in */
    if (tree < 0)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "all_to_all: the process group's algorithm "
                          "%s (mapper %s) has no all_to_all", d->module,
                          d->form->mapper ? d->form->mapper : "?");
    if ((rc = d->form->validate(ctx, e->b, d->ws, "all_to_all (in)")) != 0 ||
        (rc = d->form->validate(ctx, e->a, d->ws, "all_to_all (out)")) != 0)
        return rc;
    for (int r = 0; r < d->ws; r++)
        if (kb_tensor_rows(e->a[r]) != kb_tensor_rows(e->b[r]) ||
            kb_tensor_cols(e->a[r]) != kb_tensor_cols(e->b[r]) ||
            kb_tensor_dtype(e->a[r]) != kb_tensor_dtype(e->b[r]))
            return kb_err_set(eb, KB_ERR_STATE, "all_to_all: rank %d's out (%lld x %lld %s) "
                              "differs from its in (%lld x %lld %s)", r,
                              (long long)kb_tensor_rows(e->a[r]), (long long)kb_tensor_cols(e->a[r]),
                              kb_dtype_name(kb_tensor_dtype(e->a[r])),
                              (long long)kb_tensor_rows(e->b[r]), (long long)kb_tensor_cols(e->b[r]),
                              kb_dtype_name(kb_tensor_dtype(e->b[r])));
    uint64_t n = kb_tensor_shard(e->b[0], 0)->nbytes / kb_dtype_size(kb_tensor_dtype(e->b[0]));
    if (n % (uint64_t)d->ws != 0)
        return kb_err_set(eb, KB_ERR_STATE, "all_to_all: a shard of %llu elements does not "
                          "split into %d equal blocks (one per rank)", (unsigned long long)n,
                          d->ws);
    for (int r = 0; r < d->ws; r++) {
        kb_kargs *a = &d->args[r];
        memset(a, 0, sizeof *a);
        KB_KARGS_PUT(a, (kb_dist_alltoall_args){
            .sh = kb_dist_coll_shape_of(m, tree, d->ws, d->root_cube, (int64_t)n,
                                        kb_dist_shards_per_rank(ctx), kb_tensor_dtype(e->b[r])),
            .in = kb_tensor_va(e->b[r]), .out = kb_tensor_va(e->a[r]) });
    }
    kb_grid g = d->form->grid(m, d->ws);
    return kb_launch_per_sip(ctx, "dist_all_to_all", kb_dist_alltoall_kernel, d->args, &g);
}

int kb_dist_all_to_all(kb_ctx *ctx, kb_tensor *out, kb_tensor *in)
{
    dist *d = dist_of(ctx);
    int rc = need_init(ctx, d, "all_to_all");
    return rc ? rc : join(ctx, d, EP_ALLTOALL, out, in, exec_alltoall);
}

/* ---- send / recv ---- */

static kb_dir opposite(kb_dir d)
{
    return d == KB_DIR_GLOBAL_E ? KB_DIR_GLOBAL_W : d == KB_DIR_GLOBAL_W ? KB_DIR_GLOBAL_E
         : d == KB_DIR_GLOBAL_S ? KB_DIR_GLOBAL_N : KB_DIR_GLOBAL_S;
}

/*
 * The leaders' route from src to dst over the SIP grid of `sh` (kb_dist_coll_shape_of):
 * along src's grid row to dst's column, then along that column (the shorter way round where
 * the grid wraps, east / south on a tie). Puts every SIP's arguments in args[sip]: the role
 * and directions of those on the route (t_src and t_dst the two ends' tensors), IDLE for the
 * others; sets the range [lo, hi] of SIPs the launch covers and returns the hop count.
 */
static int p2p_route(const kb_dist_coll_shape *sh, int src, int dst, kb_va t_src, kb_va t_dst,
                     kb_kargs *args, int *lo, int *hi)
{
    int gw = sh->gw, gh = sh->gh, wrap = sh->wrap, cur = src, hops = 0;
    /* the SIP at cur, complete once the hop out of it is known */
    kb_dist_p2p_args at = { .sh = *sh, .t = t_src, .role = KB_DIST_P2P_SRC };
    for (int r = 0; r < (int)sh->ws; r++) {
        memset(&args[r], 0, sizeof args[r]);
        KB_KARGS_PUT(&args[r], (kb_dist_p2p_args){ .sh = *sh, .role = KB_DIST_P2P_IDLE });
    }
    *lo = *hi = src;
    for (int dim = 0; dim < 2; dim++) {
        int g = dim == 0 ? gw : gh;
        int at_g = dim == 0 ? cur % gw : cur / gw, to = dim == 0 ? dst % gw : dst / gw;
        int fwd = (to - at_g + g) % g, steps, up;
        if (wrap) {
            up = fwd <= g - fwd;
            steps = up ? fwd : g - fwd;
        } else {
            up = to >= at_g;
            steps = up ? to - at_g : at_g - to;
        }
        kb_dir d = dim == 0 ? (up ? KB_DIR_GLOBAL_E : KB_DIR_GLOBAL_W)
                            : (up ? KB_DIR_GLOBAL_S : KB_DIR_GLOBAL_N);
        for (int k = 0; k < steps; k++) {
            at_g = (at_g + (up ? 1 : g - 1)) % g;
            int next = dim == 0 ? (cur / gw) * gw + at_g : at_g * gw + cur % gw;
            at.out = d;
            KB_KARGS_PUT(&args[cur], at);
            at = (kb_dist_p2p_args){ .sh = *sh, .in = opposite(d),
                                     .role = next == dst ? KB_DIST_P2P_DST : KB_DIST_P2P_FWD };
            cur = next;
            hops++;
            *lo = cur < *lo ? cur : *lo;
            *hi = cur > *hi ? cur : *hi;
        }
    }
    assert(cur == dst); /* the row, then the column, reach the destination */
    at.t = t_dst;
    KB_KARGS_PUT(&args[cur], at);
    return hops;
}

/* The tensor `t` of rank r has the process group's layout (its all_reduce layout). */
static int p2p_layout(kb_ctx *ctx, dist *d, int tree, const char *what, int r, kb_tensor *t)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int S = kb_dist_shards_per_rank(ctx);
    int ok = kb_tensor_sip(t) == (unsigned)r && (int)kb_tensor_nshards(t) == S;
    for (int i = 0; ok && i < S; i++) {
        const kb_shard_spec *sh = kb_tensor_shard(t, (size_t)i);
        ok = sh->nbytes == kb_tensor_shard(t, 0)->nbytes &&
             sh->offset_bytes == (uint64_t)i * sh->nbytes && kb_dist_coll_shard_ok(m, tree, i, sh);
    }
    if (!ok)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "%s: rank %d's tensor '%s' must live "
                          "on SIP %d with the process group's layout (%s: %d equal shards, "
                          "kb_dist_policy)", what, r, kb_tensor_name(t), r, d->module, S);
    return 0;
}

/* Runs the transfer of a matched pair (called by the rank that arrived second). */
static int p2p_exec(kb_ctx *ctx, dist *d, int src, int dst, uint64_t seq, kb_tensor *ts,
                    kb_tensor *tr)
{
    kb_machine *m = kb_ctx_machine(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    kb_sim *sim = kb_ctx_sim(ctx);
    int tree = kb_dist_coll_tree(d->form), rc, lo, hi;
    if (tree < 0)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "send/recv: the process group's algorithm %s "
                          "(mapper %s) has no send/recv", d->module,
                          d->form->mapper ? d->form->mapper : "?");
    if (!ts || !tr)
        return kb_err_set(eb, KB_ERR_INVAL, "send/recv: rank %d passed no tensor", ts ? dst : src);
    if (kb_tensor_rows(ts) != kb_tensor_rows(tr) || kb_tensor_cols(ts) != kb_tensor_cols(tr) ||
        kb_tensor_dtype(ts) != kb_tensor_dtype(tr))
        return kb_err_set(eb, KB_ERR_STATE, "send/recv #%llu: rank %d sends '%s' (%lld x %lld "
                          "%s) but rank %d receives into '%s' (%lld x %lld %s)",
                          (unsigned long long)seq, src, kb_tensor_name(ts),
                          (long long)kb_tensor_rows(ts), (long long)kb_tensor_cols(ts),
                          kb_dtype_name(kb_tensor_dtype(ts)), dst, kb_tensor_name(tr),
                          (long long)kb_tensor_rows(tr), (long long)kb_tensor_cols(tr),
                          kb_dtype_name(kb_tensor_dtype(tr)));
    if ((rc = p2p_layout(ctx, d, tree, "send", src, ts)) != 0 ||
        (rc = p2p_layout(ctx, d, tree, "recv", dst, tr)) != 0)
        return rc;
    /* one transfer at a time: two routes may share a leader and its global queues */
    while (d->p2p_busy)
        kb_waitq_block(sim, &d->p2p_wait, "kb_dist send/recv of another pair", d);
    d->p2p_busy = 1;
    uint64_t n = kb_tensor_shard(ts, 0)->nbytes / kb_dtype_size(kb_tensor_dtype(ts));
    kb_dist_coll_shape sh = kb_dist_coll_shape_of(m, tree, d->ws, d->root_cube, (int64_t)n,
                                                  kb_dist_shards_per_rank(ctx),
                                                  kb_tensor_dtype(ts));
    p2p_route(&sh, src, dst, kb_tensor_va(ts), kb_tensor_va(tr), d->args, &lo, &hi);
    /* the launch covers SIPs [lo, hi]: both ends of the route among them */
    assert(lo <= src && src <= hi && lo <= dst && dst <= hi);
    kb_grid g = d->form->grid(m, d->ws);
    g.sip0 = lo;
    g.sips = hi - lo + 1;
    kb_time t0 = kb_sim_now(sim);
    uint64_t b0 = global_bytes(ctx);
    rc = kb_launch_per_sip(ctx, "dist_send_recv", kb_dist_p2p_kernel, d->args + lo, &g);
    d->calls[KB_COLL_SENDRECV]++;
    d->inter_sip[KB_COLL_SENDRECV] += global_bytes(ctx) - b0;
    d->comm += kb_sim_now(sim) - t0;
    d->p2p_busy = 0;
    kb_waitq_wake_one(sim, &d->p2p_wait);
    return rc;
}

/* One half of a pair: matches the peer's waiting half or waits for it. */
static int p2p_half(kb_ctx *ctx, kb_tensor *t, int peer, int is_send)
{
    const char *what = is_send ? "send" : "recv";
    dist *d = dist_of(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    int me = kb_ctx_rank(ctx), rc = need_init(ctx, d, what);
    if (rc)
        return rc;
    if (me < 0)
        return kb_err_set(eb, KB_ERR_STATE, "%s outside a spawned rank worker", what);
    if (peer < 0 || peer >= d->ws)
        return kb_err_set(eb, KB_ERR_RANGE, "%s: rank %d outside a world of %d ranks", what,
                          peer, d->ws);
    if (peer == me)
        return kb_err_set(eb, KB_ERR_INVAL, "%s: rank %d names itself as its peer", what, me);
    int src = is_send ? me : peer, dst = is_send ? peer : me;
    uint64_t *ctr = is_send ? d->seq_send : d->seq_recv;
    uint64_t seq = ctr[src * d->ws + dst]++;
    for (p2p *p = d->posts; p; p = p->next)
        if (!p->matched && p->src == src && p->dst == dst && p->seq == seq) {
            /* the peer waits: run the transfer for both, then wake it. Each side counts its
             * own calls, so a waiting half of this key is the peer's */
            assert(p->poster == peer);
            p->matched = 1;
            rc = p2p_exec(ctx, d, src, dst, seq, is_send ? t : p->t, is_send ? p->t : t);
            if (rc)
                kb_err_prefix(eb, "%s #%llu of ranks %d -> %d (run by rank %d, the second to "
                              "arrive)", what, (unsigned long long)seq, src, dst, me);
            p->rc = rc;
            kb_waitq_wake_all(kb_ctx_sim(ctx), &p->waiters);
            return rc;
        }
    p2p *p = calloc(1, sizeof *p);
    if (!p)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    p->src = src;
    p->dst = dst;
    p->poster = me;
    p->seq = seq;
    p->t = t;
    snprintf(p->what, sizeof p->what, "kb_dist_%s %s rank %d (#%llu of %d -> %d): no matching "
             "kb_dist_%s", what, is_send ? "to" : "from", peer, (unsigned long long)seq, src,
             dst, is_send ? "recv" : "send");
    p->next = d->posts;
    d->posts = p;
    kb_waitq_block(kb_ctx_sim(ctx), &p->waiters, p->what, p);
    assert(p->matched); /* only the matching half wakes it */
    /* matched and done: unlink and free the half */
    for (p2p **pp = &d->posts; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    rc = p->rc;
    free(p);
    return rc;
}

int kb_dist_send(kb_ctx *ctx, kb_tensor *t, int dst) { return p2p_half(ctx, t, dst, 1); }
int kb_dist_recv(kb_ctx *ctx, kb_tensor *t, int src) { return p2p_half(ctx, t, src, 0); }
