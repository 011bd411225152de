/*
 * kb_runtime_launch — kernel launches and the threads kernels fork (kb_runtime.h, kb_tl.h;
 * part of the runtime, what its files share is in host/private/kb_runtime_int.h). A launch is
 * timed hop by hop on the command path (host -> IO_CPU -> M_CPU -> PE) with fan-out per cube,
 * runs one fiber per PE of its grid, and aggregates the completions per cube at M_CPU and per
 * SIP at IO_CPU before the host hears of it. Limits: a launch's bookkeeping is freed when the
 * host fiber that waits for it resumes; a kernel or thread must join every thread it forked
 * before it returns.
 */
#include "kb_runtime_int.h"

#include "kb_progress.h"
#include "kb_psim.h"
#include "kb_trace.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KB_CMD_BYTES 64u

kb_grid kb_grid_of(const kb_tensor *t)
{
    kb_grid g = { t->grid_pes, t->grid_cubes, 1, (int)t->gsip };
    return g;
}

/* A thread forked by a kernel (tl_fork): its context first (kb_tl is line-aligned). */
typedef struct kb_tl_thread {
    kb_tl tl;
    void (*fn)(kb_tl *, void *);
    void *arg;
    int done;
    kb_fiber *joiner;
    struct kb_tl_thread *next; /* the forking context's next child */
} kb_tl_thread;

/* Frees tl's forked threads and theirs (children before their parents' contexts). */
static void free_children(kb_tl *tl)
{
    for (kb_tl_thread *t = tl->children, *n; t; t = n) {
        n = t->next;
        free_children(&t->tl);
        kb_tl_fini(&t->tl);
        free(t);
    }
    tl->children = NULL;
}

void kb_launch_free(kb_launch_st *l)
{
    kb_ctx *ctx = l->ctx;
    /* a forked launch's partitions first: their fibers (a failed run's, still blocked) use
     * the contexts freed below */
    for (int i = 0; l->recs && i < kb_psim_parts(l->ps); i++) {
        free(l->recs[i].v);
        free(l->recs[i].t);
    }
    free(l->recs);
    free(l->keys);
    for (int i = 0; l->dl_lines && i < kb_psim_parts(l->ps); i++)
        free(l->dl_lines[i]);
    free(l->dl_lines);
    free(l->dl_count);
    free(l->dl_now);
    kb_psim_destroy(l->ps);
    free(l->perr);
    if (ctx->fork == l)
        ctx->fork = NULL;
    for (int i = 0; l->tls && i < l->ntl; i++)
        free_children(&l->tls[i]);
    if (l->prev)
        l->prev->next = l->next;
    else
        ctx->launches = l->next;
    if (l->next)
        l->next->prev = l->prev;
    for (int i = 0; l->tls && i < l->ntl; i++)
        kb_tl_fini(&l->tls[i]);
    free(l->tls);
    free(l->args);
    free(l->stages);
    free(l->stage_st);
    free(l->cube_left);
    free(l->cube_tmax);
    free(l->sip_left);
    free(l->sip_tmax);
    free(l->sip_kernels);
    free(l->sip_kend);
    free(l);
}

static void launch_done_event(kb_sim *sim, void *a, void *b)
{
    kb_launch_st *l = a;
    (void)b;
    kb_signal_fire(sim, &l->done);
}

void kb_tl_release_all(kb_tl *tl);

/* Wakes the host at the latest SIP's completion (every SIP of l has finished). */
static void launch_done_at_last_sip(kb_sim *sim, kb_launch_st *l)
{
    kb_time t_done = 0;
    for (int i = 0; i < l->grid.sips; i++)
        t_done = l->sip_tmax[i] > t_done ? l->sip_tmax[i] : t_done;
    if (kb_sim_at(sim, t_done, launch_done_event, l, NULL) != 0)
        kb_signal_fire(sim, &l->done);
}

/* Completion of one PE's kernel: aggregate per cube at M_CPU, per SIP at IO_CPU (with
 * sip.io_cpu.completions tree, up a binary tree of the M_CPUs first: a cube is done when its
 * PEs and its children in the tree are, and cube 0 alone reports to the IO_CPU). */
static void kernel_finished(kb_tl *tl)
{
    kb_launch_st *l = tl->launch;
    kb_ctx *ctx = tl->ctx;
    kb_machine *m = ctx->m;
    int s = tl->pid[2], c = tl->pid[1];
    int ci = s * l->grid.cubes + c;
    kb_time t = kb_sim_now(tl->sim);
    if (t > l->sip_kend[s])
        l->sip_kend[s] = t;
    t = kb_machine_cmd_pe_to_mcpu(m, tl->pe, t, KB_CMD_BYTES);

    if (t > l->cube_tmax[ci])
        l->cube_tmax[ci] = t;
    if (--l->cube_left[ci] > 0)
        return;
    if (m->io_tree) {
        while (c > 0) { /* this subtree is done: its report to the parent's M_CPU */
            int p = (c - 1) / 2, pi = s * l->grid.cubes + p;
            t = kb_machine_cmd_mcpu_to_mcpu(m, tl->pe->gsip, (unsigned)c, (unsigned)p,
                                            l->cube_tmax[ci], KB_CMD_BYTES);
            if (t > l->cube_tmax[pi])
                l->cube_tmax[pi] = t;
            if (--l->cube_left[pi] > 0)
                return;
            c = p;
            ci = pi;
        }
    }
    t = kb_machine_cmd_mcpu_to_iocpu(m, tl->pe->gsip, (unsigned)c, l->cube_tmax[ci], KB_CMD_BYTES);
    if (t > l->sip_tmax[s])
        l->sip_tmax[s] = t;
    if (--l->sip_left[s] > 0)
        return;
    /* SIP s is done: from here on sip_tmax[s] is when its completion reaches the host
     * (queued: the IO_CPU, where the next launch of the queue starts). Each SIP writes its
     * own; the last SIP to finish wakes the host at the latest of them (a launch forked over
     * the SIPs' partitions would take that maximum after the join, docs/parallel.md) */
    if (!l->queued)
        l->sip_tmax[s] = kb_machine_cmd_iocpu_to_host(m, tl->pe->gsip, l->sip_tmax[s],
                                                      KB_CMD_BYTES);
    if (l->ps || --l->sips_left > 0) /* forked: the join takes the maximum (fork_run) */
        return;
    launch_done_at_last_sip(ctx->sim, l);
}

static void kernel_main(kb_sim *sim, void *arg)
{
    kb_tl *tl = arg;
    kb_time now = kb_sim_now(sim);
    if (tl->start > now)
        kb_fiber_sleep(sim, tl->start - now);
    tl->launch->kernel(tl, &tl->launch->args[tl->pid[2]]);
    for (kb_tl_thread *t = tl->children; t; t = t->next)
        if (!t->done)
            tl_fail(tl, KB_ERR_STATE, "the kernel returned before joining a thread it forked "
                    "(tl_join)");
    kb_tl_wait_until(tl, tl->posted); /* a kernel is done when its writes have landed */
    kb_tl_notify_end(tl);
    if (tl->ctx->trace_rec) {
        /* the launch (and its name) is freed before the trace is written */
        const char *name = kb_trace_intern(tl->ctx->trace_rec, tl->launch->name);
        if (name)
            kb_trace_pe(tl->ctx->trace_rec, KB_TRACE_KERNEL, tl->pe->gsip, tl->pe->cube,
                        (int)tl->pe->pe, name, tl->start, kb_sim_now(sim), 0);
    }
    kb_tl_release_all(tl);
    if (tl->launch->ps) /* forked: counted per SIP, summed at the join */
        tl->launch->sip_kernels[tl->pid[2]]++;
    else
        tl->ctx->kernels++;
    kernel_finished(tl);
}

static void thread_main(kb_sim *sim, void *arg)
{
    kb_tl_thread *t = arg;
    t->fn(&t->tl, t->arg);
    for (kb_tl_thread *c = t->tl.children; c; c = c->next)
        if (!c->done)
            tl_fail(&t->tl, KB_ERR_STATE, "a thread returned before joining a thread it forked "
                    "(tl_join)");
    kb_tl_wait_until(&t->tl, t->tl.posted);
    kb_tl_release_all(&t->tl);
    t->done = 1;
    if (t->joiner)
        kb_fiber_wake_at(sim, t->joiner, kb_sim_now(sim));
}

kb_tl *tl_fork(kb_tl *tl, void (*fn)(kb_tl *child, void *arg), void *arg)
{
    kb_launch_st *l = tl->launch;
    kb_tl_thread *t = aligned_alloc(64, (sizeof *t + 63) & ~(size_t)63);
    char fname[192];
    if (!t)
        tl_fail(tl, KB_ERR_NOMEM, "tl_fork: out of memory");
    memset(t, 0, sizeof *t);
    t->tl.tag = tl->tag;
    t->tl.thread = 1;
    t->tl.ctx = tl->ctx;
    t->tl.sim = tl->sim;
    t->tl.pe = tl->pe;
    t->tl.launch = l;
    memcpy(t->tl.pid, tl->pid, sizeof t->tl.pid);
    memcpy(t->tl.np, tl->np, sizeof t->tl.np);
    t->tl.cpu_ovh = tl->cpu_ovh;
    t->fn = fn;
    t->arg = arg;
    t->next = tl->children;
    tl->children = t;
    kb_tl_wait_until(tl, kb_sim_now(tl->sim) + tl->cpu_ovh);
    t->tl.start = kb_sim_now(tl->sim);
    snprintf(fname, sizeof fname, "%s@sip%u/cube%u/pe%u+", l->name, tl->pe->gsip, tl->pe->cube,
             tl->pe->pe);
    kb_fiber *f = kb_fiber_spawn(tl->sim, thread_main, t, fname);
    if (!f)
        tl_fail(tl, KB_ERR_NOMEM, "tl_fork: out of memory spawning a thread");
    kb_fiber_set_udata(f, &t->tl);
    return &t->tl;
}

void tl_join(kb_tl *tl, kb_tl *child)
{
    kb_tl_thread *t = (kb_tl_thread *)(void *)child;
    if (!child || child->launch != tl->launch || child == tl)
        tl_fail(tl, KB_ERR_INVAL, "tl_join: not a thread this kernel forked");
    if (!t->done) {
        t->joiner = kb_fiber_current(tl->sim);
        kb_fiber_block(tl->sim, "tl_join", t);
    }
}

/* ---- launches forked over the SIPs (docs/parallel.md, step 5's first form) ---- */

/* The least latency of an inter-SIP link: the lookahead of a run partitioned by SIP (every
 * effect of one SIP on another crosses one); 0 without links. */
static kb_time sip_lookahead(const kb_machine *m)
{
    kb_time look = 0;
    for (int s = 0; s < m->nsips; s++)
        for (int i = 0; i < m->sips[s].nlinks; i++) {
            kb_time lat = m->sips[s].links[i].link.latency;
            look = look == 0 || lat < look ? lat : look;
        }
    return look;
}

/*
 * Whether a launch over grid g may run forked: Phase-1 threads asked for, several SIPs, and
 * nothing that couples SIPs without a link's delay. The op log and the traces are one
 * sequence, the route arbitration books other SIPs from the sender's event, a device queue
 * starts the next kernel at the latest SIP's end, and whatever else is pending in the
 * context's simulation (another host program, a timer) could act while the launch runs.
 */
/* Its lookahead when it may (a machine without inter-SIP links has none), else 0. */
static kb_time fork_wanted(kb_ctx *ctx, const kb_hostproc *hp, const kb_grid *g)
{
    kb_time t;
    if (ctx->threads > 0 && g->sips > 1 && ctx->m->per_sip && !ctx->trace && !ctx->trace_rec &&
        !hp->queue && !kb_sim_next(ctx->sim, &t) && kb_sim_live_fibers(ctx->sim) == 1)
        return sip_lookahead(ctx->m);
    return 0;
}

/* The collective of a launch over several processes: every process's bytes of w in *all
 * (malloc'd), their sizes in counts[nranks]; 0 or an error code. */
static int trade(const kb_psim_net *net, const kb_wire *w, void **all, size_t *counts)
{
    int rc = kb_wire_ok(w);
    return rc ? rc : net->allgather(net->ud, w->p, w->n, all, counts);
}

/* Process r's bytes of a trade, as a reader. */
static void rank_bytes(kb_wire_rd *rd, const void *all, const size_t *counts, int r)
{
    size_t off = 0;
    for (int k = 0; k < r; k++)
        off += counts[k];
    kb_wire_rd_init(rd, (const uint8_t *)all + off, counts[r]);
}

/* Room for n more records in b: 0 or KB_ERR_NOMEM. */
static int recs_room(kb_fork_recs *b, size_t more)
{
    if (b->n + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more)
        cap *= 2;
    kb_rec *v = realloc(b->v, cap * sizeof *v);
    if (v)
        b->v = v;
    kb_time *t = realloc(b->t, cap * sizeof *t);
    if (t)
        b->t = t;
    if (!v || !t)
        return KB_ERR_NOMEM;
    b->cap = cap;
    return 0;
}

int kb_fork_record(kb_launch_st *l, const kb_rec *r)
{
    /* kernels' and the IPCQ's records carry the PE whose SIP's partition makes them */
    assert(r->pe != UINT32_MAX);
    unsigned s = l->ctx->m->pe_by_gid[r->pe]->gsip;
    kb_fork_recs *b = &l->recs[s];
    if (recs_room(b, 1) != 0)
        return KB_ERR_NOMEM;
    b->v[b->n] = *r;
    b->t[b->n++] = kb_sim_now(kb_psim_part(l->ps, (int)s));
    return 0;
}

/*
 * A recording launch over several processes, after a window: every process hands the others
 * its SIPs' records of the window (with their times), so that every process gathers the whole
 * op log in the same order and replays it as one process would. 0 or an error code.
 */
static int fork_trade_records(kb_launch_st *l)
{
    const kb_psim_net *net = l->ctx->net;
    int n = kb_psim_parts(l->ps), rc;
    size_t *counts = calloc((size_t)net->nranks, sizeof *counts);
    void *all = NULL;
    kb_wire w;
    kb_wire_init(&w);
    if (!counts) {
        rc = KB_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (kb_psim_owns(l->ps, i)) {
            kb_wire_u64(&w, l->recs[i].n);
            kb_wire_put(&w, l->recs[i].v, l->recs[i].n * sizeof *l->recs[i].v);
            kb_wire_put(&w, l->recs[i].t, l->recs[i].n * sizeof *l->recs[i].t);
        }
    if ((rc = trade(net, &w, &all, counts)) != 0)
        goto done;
    for (int r = 0; r < net->nranks; r++) {
        kb_wire_rd rd;
        if (r == net->rank)
            continue;
        rank_bytes(&rd, all, counts, r);
        for (int i = 0; i < n; i++) {
            if (kb_psim_owner(l->ps, i) != r)
                continue;
            kb_fork_recs *b = &l->recs[i];
            uint64_t k = kb_wire_get_u64(&rd);
            if (k > (rd.n - rd.at) / sizeof *b->v) {
                rc = KB_ERR_STATE;
                goto done;
            }
            b->n = 0;
            if ((rc = recs_room(b, (size_t)k)) != 0)
                goto done;
            kb_wire_get(&rd, b->v, (size_t)k * sizeof *b->v);
            kb_wire_get(&rd, b->t, (size_t)k * sizeof *b->t);
            b->n = (size_t)k;
        }
        if (!kb_wire_rd_ok(&rd) || !kb_wire_rd_done(&rd)) {
            rc = KB_ERR_STATE;
            goto done;
        }
    }
done:
    free(all);
    free(counts);
    kb_wire_free(&w);
    return rc;
}

/* The gathering's order: time, then partition (a partition's own records are in order). */
static int key_less(const kb_fork_key *a, const kb_fork_key *b)
{
    return a->t != b->t ? a->t < b->t : a->part < b->part;
}

static void heap_down(kb_fork_key *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && key_less(&h[l], &h[m]))
            m = l;
        if (r < n && key_less(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        kb_fork_key x = h[i];
        h[i] = h[m];
        h[m] = x;
        i = m;
    }
}

/*
 * After every window of a forked launch that records or is watched (every partition still):
 * the progress a display shows (the latest partition clock, the events so far), and the
 * window's records into the op log, ordered by the time each was made, then partition, then
 * order in it. Whatever depends on a record was made later in simulated time (across SIPs, at least a
 * link's latency later), so the order is one the sequential engine could have made, and it is
 * the same for every thread count.
 */
static int fork_window(kb_psim *ps, kb_time t, void *ud)
{
    kb_launch_st *l = ud;
    int n = kb_psim_parts(ps), rc = 0;
    size_t m = 0, k = 0;
    (void)t;
    if (l->ctx->net && l->recs && (rc = fork_trade_records(l)) != 0) {
        kb_err_set(&l->gather_eb, rc, "handing the window's op records between processes "
                   "failed: %s", kb_strerror(rc));
        return rc;
    }
    if (l->ctx->progress) { /* what a display shows while the context's simulation waits */
        kb_time now = kb_sim_now(l->ctx->sim);
        uint64_t ev = kb_ctx_events(l->ctx);
        for (int i = 0; i < n; i++) {
            kb_sim *p = kb_psim_part(ps, i);
            now = kb_sim_now(p) > now ? kb_sim_now(p) : now;
            ev += kb_sim_events(p);
        }
        atomic_store_explicit(&l->ctx->progress->sim_now, now, memory_order_relaxed);
        atomic_store_explicit(&l->ctx->progress->events, ev, memory_order_relaxed);
    }
    for (int i = 0; i < n && l->recs; i++)
        m += l->recs[i].n;
    if (m == 0)
        return 0;
    if ((size_t)n > l->capkeys) {
        kb_fork_key *v = realloc(l->keys, (size_t)n * sizeof *v);
        if (!v) {
            kb_err_set(&l->gather_eb, KB_ERR_NOMEM, "out of memory gathering the partitions' op "
                       "records");
            return KB_ERR_NOMEM;
        }
        l->keys = v;
        l->capkeys = (size_t)n;
    }
    /* each partition's records are in time order (its clock only advances): a k-way merge on
     * (time, partition), a heap of one head per partition, gives the sorted order */
    for (int i = 0; i < n; i++)
        if (l->recs[i].n)
            l->keys[k++] = (kb_fork_key){ l->recs[i].t[0], (uint32_t)i, 0 };
    for (size_t h = k / 2; h-- > 0;)
        heap_down(l->keys, k, h);
    while (k > 0 && rc == 0) {
        kb_fork_key *top = &l->keys[0];
        kb_fork_recs *b = &l->recs[top->part];
        rc = kb_ctx_log_gathered(l->ctx, &b->v[top->i]);
        if (++top->i < b->n) {
            assert(b->t[top->i] >= top->t);
            top->t = b->t[top->i];
        } else {
            *top = l->keys[--k];
        }
        heap_down(l->keys, k, 0);
    }
    for (int i = 0; i < n; i++)
        l->recs[i].n = 0;
    if (rc)
        kb_err_set(&l->gather_eb, rc, "%s", kb_ctx_errmsg(l->ctx));
    return rc;
}

/*
 * After a forked launch over several processes (kb_ctx_opts.net): every process hands the
 * others what its SIPs changed (their kernels' counts and completions, their first failure,
 * their resources' reservations, and the modules' state: kb_ext_dist), so that every process
 * goes on with the whole machine as one process would have left it; after a deadlock, the
 * blocked fibers of each SIP for the report (l->dl_*). `failed`: the launch's code. 0 or an
 * error code (why, in l->gather_eb when there is more to say).
 */
static int fork_sync(kb_launch_st *l, int failed)
{
    kb_ctx *ctx = l->ctx;
    kb_machine *m = ctx->m;
    const kb_psim_net *net = ctx->net;
    int S = m->nsips, rc;
    uint8_t *own = calloc((size_t)S, 1);
    size_t *counts = calloc((size_t)net->nranks, sizeof *counts);
    void *all = NULL;
    kb_wire w;

    kb_wire_init(&w);
    if (!own || !counts) {
        rc = KB_ERR_NOMEM;
        goto done;
    }
    for (int s = 0; s < S; s++)
        own[s] = (uint8_t)kb_psim_owns(l->ps, s);
    for (int s = 0; s < S; s++) {
        if (!own[s])
            continue;
        int g = s - l->grid.sip0;
        size_t len = strlen(l->perr[s].eb.msg);
        kb_wire_u32(&w, (uint32_t)l->perr[s].code);
        kb_wire_u64(&w, len);
        kb_wire_put(&w, l->perr[s].eb.msg, len);
        if (g >= 0 && g < l->grid.sips) {
            kb_wire_u64(&w, l->sip_kernels[g]);
            kb_wire_u64(&w, l->sip_tmax[g]);
            kb_wire_u64(&w, l->sip_kend[g]);
        }
        kb_machine_sip_save(m, s, &w);
        if (failed == KB_ERR_DEADLOCK) {
            int cnt = 0;
            char *ln = kb_ctx_blocked_lines(ctx, kb_psim_part(l->ps, s), &cnt);
            size_t ll = ln ? strlen(ln) : 0;
            kb_wire_u64(&w, kb_sim_now(kb_psim_part(l->ps, s)));
            kb_wire_u32(&w, (uint32_t)cnt);
            kb_wire_u64(&w, ll);
            kb_wire_put(&w, ln, ll);
            free(ln);
        }
    }
    for (int x = 0; x < KB_EXT_NSLOTS; x++)
        if (ctx->ext[x] && ctx->ext_dist[x].save &&
            (rc = ctx->ext_dist[x].save(ctx->ext[x], own, failed != 0, &w)) != 0)
            goto done;
    if (failed == KB_ERR_DEADLOCK &&
        (!(l->dl_lines = calloc((size_t)S, sizeof *l->dl_lines)) ||
         !(l->dl_count = calloc((size_t)S, sizeof *l->dl_count)) ||
         !(l->dl_now = calloc((size_t)S, sizeof *l->dl_now)))) {
        rc = KB_ERR_NOMEM;
        goto done;
    }
    if ((rc = trade(net, &w, &all, counts)) != 0)
        goto done;
    for (int r = 0; r < net->nranks; r++) {
        kb_wire_rd rd;
        if (r == net->rank)
            continue;
        rank_bytes(&rd, all, counts, r);
        for (int s = 0; s < S; s++) {
            own[s] = (uint8_t)(kb_psim_owner(l->ps, s) == r);
            if (!own[s])
                continue;
            int g = s - l->grid.sip0;
            l->perr[s].code = (int)kb_wire_get_u32(&rd);
            uint64_t len = kb_wire_get_u64(&rd);
            if (len >= sizeof l->perr[s].eb.msg) {
                rc = KB_ERR_STATE;
                goto done;
            }
            kb_wire_get(&rd, l->perr[s].eb.msg, (size_t)len);
            l->perr[s].eb.msg[len] = 0;
            if (g >= 0 && g < l->grid.sips) {
                l->sip_kernels[g] = kb_wire_get_u64(&rd);
                l->sip_tmax[g] = kb_wire_get_u64(&rd);
                l->sip_kend[g] = kb_wire_get_u64(&rd);
            }
            kb_machine_sip_load(m, s, &rd);
            if (failed == KB_ERR_DEADLOCK) {
                l->dl_now[s] = kb_wire_get_u64(&rd);
                l->dl_count[s] = (int)kb_wire_get_u32(&rd);
                uint64_t ll = kb_wire_get_u64(&rd);
                if (ll > counts[r] || !(l->dl_lines[s] = malloc((size_t)ll + 1))) {
                    rc = ll > counts[r] ? KB_ERR_STATE : KB_ERR_NOMEM;
                    goto done;
                }
                kb_wire_get(&rd, l->dl_lines[s], (size_t)ll);
                l->dl_lines[s][ll] = 0;
            }
        }
        for (int x = 0; x < KB_EXT_NSLOTS; x++)
            if (ctx->ext[x] && ctx->ext_dist[x].load &&
                (rc = ctx->ext_dist[x].load(ctx->ext[x], own, &rd)) != 0)
                goto done;
        if (!kb_wire_rd_ok(&rd) || !kb_wire_rd_done(&rd)) {
            rc = KB_ERR_STATE;
            kb_err_set(&l->gather_eb, rc, "process %d's state of its SIPs does not read as "
                       "this process's would (are both the same kbcl on the same inputs?)", r);
            goto done;
        }
    }
    rc = 0;
done:
    free(all);
    free(counts);
    free(own);
    kb_wire_free(&w);
    return rc;
}

/* The join of a forked launch: runs its partitions to the end (an event of the context's
 * simulation, while the launching host fiber waits), then wakes the host at the latest SIP's
 * completion, or fails the run with the lowest-numbered failed partition's error. */
static void fork_run(kb_sim *sim, void *a, void *b)
{
    kb_launch_st *l = a;
    kb_ctx *ctx = l->ctx;
    kb_machine *m = ctx->m;
    int n = kb_psim_parts(l->ps), rc;
    (void)b;

    ctx->fork = l;
    kb_machine_bind_sips(m, 1);
    rc = kb_psim_run(l->ps);
    kb_machine_bind_sips(m, 0);
    ctx->fork = NULL;
    ctx->forked++;
    ctx->fork_windows += kb_psim_windows(l->ps);
    ctx->fork_events += kb_psim_events(l->ps);
    ctx->fork_switches += kb_psim_switches(l->ps);
    if (ctx->net) {
        int src = fork_sync(l, rc);
        if (src) {
            kb_ctx_fail_in(ctx, sim, src, "launch %s over %d SIPs: handing the SIPs' state "
                           "between processes failed: %s", l->name, l->grid.sips,
                           l->gather_eb.msg[0] ? l->gather_eb.msg : kb_strerror(src));
            return;
        }
    }
    for (int s = 0; s < l->grid.sips; s++)
        ctx->kernels += l->sip_kernels[s];
    if (rc == KB_ERR_DEADLOCK) { /* the host's fibers first, as a sequential run lists them */
        char *lines[KB_PSIM_MAX_PARTS + 1];
        int cnt[KB_PSIM_MAX_PARTS + 1];
        kb_time t = 0;
        lines[0] = kb_ctx_blocked_lines(ctx, sim, &cnt[0]);
        for (int i = 0; i < n; i++) {
            kb_sim *p = kb_psim_part(l->ps, i);
            kb_time ti = kb_sim_now(p);
            if (kb_psim_owns(l->ps, i)) {
                lines[i + 1] = kb_ctx_blocked_lines(ctx, p, &cnt[i + 1]);
            } else { /* another process's SIP: what fork_sync brought */
                lines[i + 1] = l->dl_lines[i];
                l->dl_lines[i] = NULL;
                cnt[i + 1] = l->dl_count[i];
                ti = l->dl_now[i];
            }
            t = ti > t ? ti : t;
        }
        kb_ctx_deadlock_report_lines(ctx, lines, cnt, n + 1, t);
        for (int i = 0; i <= n; i++)
            free(lines[i]);
        kb_ctx_fail(ctx, rc);
        return;
    }
    if (rc) {
        int i = 0;
        while (i < n && !l->perr[i].code)
            i++;
        if (i < n)
            kb_ctx_fail_in(ctx, sim, l->perr[i].code, "%s", l->perr[i].eb.msg);
        else if (l->gather_eb.msg[0]) /* the records' gathering after a window */
            kb_ctx_fail_in(ctx, sim, rc, "%s", l->gather_eb.msg);
        else /* the engine's own failure, in no partition (out of memory) */
            kb_ctx_fail_in(ctx, sim, rc, "launch %s over %d SIPs on %d threads: %s", l->name,
                           l->grid.sips, kb_psim_threads(l->ps), kb_strerror(rc));
        return;
    }
    launch_done_at_last_sip(sim, l);
}

_Static_assert(KB_PE_NEXT_RES == KB_FIBER_HOT_VEC,
               "a PE's next_res is its kernel fiber's hint vector");

/* A thread that runs at least this many PEs sweeps more state than its caches hold: its
 * partitions get wheel slots of 4.1 ns (2^12 ps; the engine's default 0.512 ns otherwise) that
 * are prefetched a slot ahead (kb_sim_opts.prefetch_slots), its kernels a hint vector
 * (kb_fiber_set_hot_vec), and it warms each partition's fibers while it runs the one before
 * (kb_psim_opts.warm). */
#define KB_FORK_WIDE_SHIFT 12u
#define KB_FORK_WIDE_PES 1024

/* The PEs each thread of a forked launch runs: the machine's SIPs split over the processes
 * (ceil), then a process's over its threads (ceil), as kb_psim splits them. */
static long fork_pes_per_thread(const kb_ctx *ctx)
{
    const kb_machine *m = ctx->m;
    int ranks = ctx->net ? ctx->net->nranks : 1;
    int local = (m->nsips + ranks - 1) / ranks;
    int thr = ctx->threads < local ? ctx->threads : local;
    return (long)m->npes * m->ncubes * ((local + thr - 1) / thr);
}

/* Makes l's partitions (one per SIP of the machine) for a run forked with lookahead `look`:
 * 0, or an error. */
static int fork_prepare(kb_ctx *ctx, kb_launch_st *l, kb_time look)
{
    kb_machine *m = ctx->m;
    /* The wheel's slots by the PEs a thread runs (docs/parallel.md "The wheel's slots"): with
     * a thousand or more, each window sweeps their state through the cache and the list heads
     * of a window's pushes (a line per 8 ns of 0.512 ns slots) were cold at nearly every
     * push, so 4.1 ns slots; with fewer the lines stay warm and narrower slots sort fewer
     * events. Order and results do not depend on it. */
    long pes = fork_pes_per_thread(ctx);
    kb_sim_opts so = { .slot_shift = pes >= KB_FORK_WIDE_PES ? KB_FORK_WIDE_SHIFT : 0,
                       .prefetch_slots = pes >= KB_FORK_WIDE_PES };
    kb_psim_opts po = { .parts = m->nsips, .threads = ctx->threads, .lookahead = look,
                        .sim = &so, .net = ctx->net, .warm = pes >= KB_FORK_WIDE_PES };
    int rc = kb_psim_create(&po, &l->ps);
    for (int s = 0; rc == 0 && ctx->net && s < KB_EXT_NSLOTS; s++)
        for (int k = 0; rc == 0 && ctx->ext[s] && k < ctx->ext_dist[s].nmsg; k++)
            rc = kb_psim_codec(l->ps, ctx->ext_dist[s].msg[k].fn, ctx->ext_dist[s].msg[k].enc,
                               ctx->ext_dist[s].msg[k].dec, ctx->ext[s]);
    if (rc == 0 && !(l->perr = calloc((size_t)m->nsips, sizeof *l->perr)))
        rc = KB_ERR_NOMEM;
    if (rc == 0 && ctx->recording && !(l->recs = calloc((size_t)m->nsips, sizeof *l->recs)))
        rc = KB_ERR_NOMEM;
    if (rc == 0 && (ctx->recording || ctx->progress))
        kb_psim_on_window(l->ps, fork_window, l);
    return rc ? kb_err_set(&ctx->err, rc, "launch %s: %s making its SIPs' partitions", l->name,
                           kb_strerror(rc)) : 0;
}

/* kb_launch_seq's kernel: the stages in turn, a barrier between them, each PE running those
 * whose grid holds it under that grid's program ids. */
static void stages_kernel(kb_tl *tl, const kb_kargs *a)
{
    kb_launch_st *l = tl->launch;
    int p = (int)tl->pe->pe, c = (int)tl->pe->cube; /* a launch's grid starts at PE 0, cube 0 */
    (void)a;
    for (int k = 0; k < l->nstages; k++) {
        const kb_stage *st = &l->stages[k];
        if (k > 0)
            tl_barrier(tl);
        if (p >= st->pes || c >= st->cubes)
            continue;
        int pid[3] = { p, c, tl->pid[2] }, np[3] = { st->pes, st->cubes, tl->np[2] };
        int opid[3], onp[3];
        kb_stage_stats *ss = &l->stage_st[tl->pid[2] * l->nstages + k];
        kb_time g0 = tl->pe->gemm.busy, t0 = kb_sim_now(tl->sim);
        kb_tl_view(tl, pid, np, opid, onp);
        st->kernel(tl, &st->args);
        kb_tl_view(tl, opid, onp, NULL, NULL);
        /* the stage's bookings are all made by its return: the PE's matrix unit is its own */
        ss->gemm_busy += tl->pe->gemm.busy - g0;
        if (tl->ctx->trace_rec) { /* each stage's span, under its own name */
            const char *name = kb_trace_intern(tl->ctx->trace_rec, st->name ? st->name : l->name);
            if (name)
                kb_trace_pe(tl->ctx->trace_rec, KB_TRACE_KERNEL, tl->pe->gsip, tl->pe->cube,
                            (int)tl->pe->pe, name, t0, kb_sim_now(tl->sim), 0);
        }
        ss->first = t0 < ss->first ? t0 : ss->first;
        ss->last = kb_sim_now(tl->sim) > ss->last ? kb_sim_now(tl->sim) : ss->last;
        /* as at a kernel's end: its writes land, its scratch goes back (the next kernel
         * finds the PE's scratch as a launch of its own would), its settings are reset */
        kb_tl_wait_until(tl, tl->posted);
        kb_tl_release_all(tl);
        tl->stages = 0;
    }
}

/* args: one block per SIP of the grid when stride is sizeof(kb_kargs), one shared block when
 * 0; stages: kb_launch_seq's kernels (copied), run by stages_kernel, else NULL */
static int launch_impl(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *args,
                       size_t stride, const kb_grid *grid, const kb_stage *stages, int nstages)
{
    kb_machine *m = ctx->m;
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    kb_launch_st *l;
    kb_grid g;
    int rc = 0;

    if (!hp)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "kb_launch(%s) outside a host program", name);
    g = grid ? *grid : (kb_grid){ 0, 0, 0, -1 };
    if (g.sip0 < 0)
        g.sip0 = hp->device;
    if (g.pes == 0)
        g.pes = m->npes;
    if (g.cubes == 0)
        g.cubes = m->ncubes;
    if (g.sips == 0)
        g.sips = 1;
    if (g.pes < 0 || g.pes > m->npes || g.cubes < 0 || g.cubes > m->ncubes || g.sips < 0 ||
        g.sip0 + g.sips > m->nsips)
        return kb_err_set(&ctx->err, KB_ERR_RANGE,
                          "launch %s: grid %d PEs x %d cubes x %d SIPs from SIP %d does not fit "
                          "the machine (%d x %d x %d)",
                          name, g.pes, g.cubes, g.sips, g.sip0, m->npes, m->ncubes, m->nsips);
    l = calloc(1, sizeof *l);
    if (!l)
        return kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
    l->ctx = ctx;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->kernel = kernel;
    l->grid = g;
    l->args = calloc((size_t)g.sips, sizeof *l->args);
    for (int s = 0; l->args && args && s < g.sips; s++)
        l->args[s] = *(const kb_kargs *)((const char *)args + (size_t)s * stride);
    if (nstages > 0 && (l->stages = malloc((size_t)nstages * sizeof *l->stages)) != NULL) {
        memcpy(l->stages, stages, (size_t)nstages * sizeof *l->stages);
        l->nstages = nstages;
        l->stage_st = calloc((size_t)nstages * (size_t)g.sips, sizeof *l->stage_st);
        for (int k = 0; l->stage_st && k < nstages * g.sips; k++)
            l->stage_st[k].first = KB_TIME_MAX;
    }
    l->ntl = g.pes * g.cubes * g.sips;
    /* kb_tl is cache-line aligned */
    l->tls = aligned_alloc(64, (size_t)(l->ntl > 0 ? l->ntl : 1) * sizeof *l->tls);
    if (l->tls)
        memset(l->tls, 0, (size_t)(l->ntl > 0 ? l->ntl : 1) * sizeof *l->tls);
    l->cube_left = calloc((size_t)(g.cubes * g.sips), sizeof *l->cube_left);
    l->cube_tmax = calloc((size_t)(g.cubes * g.sips), sizeof *l->cube_tmax);
    l->sip_left = calloc((size_t)g.sips, sizeof *l->sip_left);
    l->sip_tmax = calloc((size_t)g.sips, sizeof *l->sip_tmax);
    l->sip_kernels = calloc((size_t)g.sips, sizeof *l->sip_kernels);
    l->sip_kend = calloc((size_t)g.sips, sizeof *l->sip_kend);
    l->next = ctx->launches;
    if (ctx->launches)
        ctx->launches->prev = l;
    ctx->launches = l;
    if (!l->tls || !l->args || (nstages > 0 && (!l->stages || !l->stage_st)) || !l->cube_left ||
        !l->cube_tmax || !l->sip_left || !l->sip_tmax || !l->sip_kernels || !l->sip_kend) {
        rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kb_time look = fork_wanted(ctx, hp, &g);
    if (look > 0 && (rc = fork_prepare(ctx, l, look)) != 0)
        goto fail;
    kb_signal_init(&l->done);
    l->sips_left = g.sips;
    l->queued = hp->queue != 0;

    kb_time now = kb_sim_now(ctx->sim), cpu_ovh = kb_time_from_ns(m->cfg.pe_cpu_overhead_ns);
    int k = 0;
    /* hint vectors only where the PEs' state is cold anyway: with fewer PEs a thread their
     * lines stay warm and the vector's reads at each resume buy nothing (docs/parallel.md) */
    long pes_thr = l->ps ? fork_pes_per_thread(ctx) : (long)g.sips * g.cubes * g.pes;
    int hot_vec = pes_thr >= KB_FORK_WIDE_PES;
    l->kfirst = KB_TIME_MAX;
    for (int s = 0; s < g.sips; s++) {
        unsigned gsip = (unsigned)(g.sip0 + s);
        /* queued after the first: the command waits in the IO_CPU's queue */
        kb_time t_io = hp->queue == 2 ? kb_machine_cmd_at_iocpu(m, gsip, now, KB_CMD_BYTES)
                                      : kb_machine_cmd_host_to_iocpu(m, gsip, now, KB_CMD_BYTES);
        l->sip_left[s] = m->io_tree ? 1 : g.cubes; /* tree: cube 0 alone reports */
        for (int c = 0; c < g.cubes; c++) {
            kb_time t_m = kb_machine_cmd_iocpu_to_mcpu(m, gsip, (unsigned)c, t_io, KB_CMD_BYTES);
            /* its PEs, and with the tree its children (2c + 1, 2c + 2) */
            l->cube_left[s * g.cubes + c] =
                g.pes + (m->io_tree ? (2 * c + 1 < g.cubes) + (2 * c + 2 < g.cubes) : 0);
            for (int p = 0; p < g.pes; p++, k++) {
                kb_tl *tl = &l->tls[k];
                char fname[192];
                tl->tag = KB_TAG_KERNEL;
                tl->ctx = ctx;
                tl->sim = l->ps ? kb_psim_part(l->ps, (int)gsip) : ctx->sim;
                tl->pe = kb_machine_pe(m, gsip, (unsigned)c, (unsigned)p);
                tl->launch = l;
                tl->pid[0] = p;
                tl->pid[1] = c;
                tl->pid[2] = s;
                tl->np[0] = g.pes;
                tl->np[1] = g.cubes;
                tl->np[2] = g.sips;
                tl->cpu_ovh = cpu_ovh;
                tl->start = kb_machine_cmd_mcpu_to_pe(m, tl->pe, t_m, KB_CMD_BYTES);
                if (tl->start < l->kfirst)
                    l->kfirst = tl->start;
                if (l->ps && !kb_psim_owns(l->ps, (int)gsip))
                    continue; /* another process runs this SIP (kb_ctx_opts.net) */
                snprintf(fname, sizeof fname, "%s@sip%u/cube%d/pe%d", l->name, gsip, c, p);
                kb_fiber *f = kb_fiber_spawn(tl->sim, kernel_main, tl, fname);
                if (!f) {
                    /* fibers already spawned reference l: stop the run; ctx frees l */
                    rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory spawning kernel fibers");
                    kb_ctx_fail(ctx, rc);
                    kb_fiber_block(ctx->sim, "aborted run", NULL);
                    return rc;
                }
                kb_fiber_set_udata(f, tl);
                /* what a resumed kernel reads first: its context and its PE (the route
                 * memo's keys as a third were no faster: docs/parallel.md) */
                const void *hot[KB_FIBER_HOT] = { tl, tl->pe };
                kb_fiber_set_hot(f, hot, KB_FIBER_HOT);
                /* and, just before it resumes, what its PE's next DMA will likely reserve */
                if (hot_vec)
                    kb_fiber_set_hot_vec(f, (const void *const *)tl->pe->next_res);
            }
        }
    }
    if (hp->queue)
        hp->queue = 2;
    if (l->ps && kb_sim_at(ctx->sim, now, fork_run, l, NULL) != 0) {
        rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
        kb_ctx_fail(ctx, rc); /* the partitions' fibers reference l: ctx frees it */
        kb_fiber_block(ctx->sim, "aborted run", NULL);
        return rc;
    }
    kb_signal_wait(ctx->sim, &l->done);
    hp->span[0] = l->kfirst;
    hp->span[1] = 0;
    for (int s = 0; s < g.sips; s++)
        hp->span[1] = l->sip_kend[s] > hp->span[1] ? l->sip_kend[s] : hp->span[1];
    hp->spanned = 1;
    hp->nstages = l->nstages;
    for (int j = 0; j < l->nstages; j++) {
        kb_stage_stats *o = &hp->stage[j];
        *o = (kb_stage_stats){ 0, KB_TIME_MAX, 0 };
        for (int s = 0; s < g.sips; s++) {
            const kb_stage_stats *x = &l->stage_st[s * l->nstages + j];
            o->gemm_busy += x->gemm_busy;
            o->first = x->first < o->first ? x->first : o->first;
            o->last = x->last > o->last ? x->last : o->last;
        }
        if (o->first > o->last) /* no PE ran it */
            o->first = o->last = 0;
    }
    kb_launch_free(l);
    return 0;
fail:
    kb_launch_free(l);
    return rc;
}

int kb_launch_span(kb_ctx *ctx, kb_time *first, kb_time *last)
{
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    if (!hp)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "kb_launch_span outside a host program");
    if (!hp->spanned)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "kb_launch_span before the host program's "
                          "first launch");
    *first = hp->span[0];
    *last = hp->span[1];
    return 0;
}

int kb_launch_stage_stats(kb_ctx *ctx, int k, kb_stage_stats *st)
{
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    if (!hp)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "kb_launch_stage_stats outside a host "
                          "program");
    if (k < 0 || k >= hp->nstages)
        return kb_err_set(&ctx->err, KB_ERR_RANGE, "kb_launch_stage_stats: stage %d of %d "
                          "(the host program's last launch)", k, hp->nstages);
    *st = hp->stage[k];
    return 0;
}

int kb_launch_queue(kb_ctx *ctx, int on)
{
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    if (!hp)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "kb_launch_queue outside a host program");
    int was = hp->queue;
    assert(was >= 0 && was <= 2); /* off, on and empty, on with launches */
    hp->queue = on ? (was ? was : 1) : 0;
    if (!on && was == 2) { /* the last completion's way up to the host */
        kb_time now = kb_sim_now(ctx->sim);
        kb_time t = kb_machine_cmd_iocpu_to_host(ctx->m, (unsigned)hp->device, now,
                                                 KB_CMD_BYTES);
        if (t > now)
            kb_fiber_sleep(ctx->sim, t - now);
    }
    return 0;
}

int kb_launch(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *a,
              const kb_grid *grid)
{
    return launch_impl(ctx, name, kernel, a, 0, grid, NULL, 0);
}

int kb_launch_seq(kb_ctx *ctx, const char *name, const kb_stage *st, int n, const kb_grid *grid)
{
    kb_machine *m = ctx->m;
    kb_stage cp[16];
    kb_grid g = grid ? *grid : (kb_grid){ 0, 0, 0, -1 };
    if (n < 1 || n > 16 || !st)
        return kb_err_set(&ctx->err, KB_ERR_INVAL, "kb_launch_seq(%s): %d stages (1 to 16)",
                          name, n);
    g.pes = g.cubes = 0;
    for (int k = 0; k < n; k++) {
        cp[k] = st[k];
        cp[k].pes = cp[k].pes ? cp[k].pes : m->npes;
        cp[k].cubes = cp[k].cubes ? cp[k].cubes : m->ncubes;
        if (!cp[k].kernel || cp[k].pes < 0 || cp[k].pes > m->npes || cp[k].cubes < 0 ||
            cp[k].cubes > m->ncubes)
            return kb_err_set(&ctx->err, KB_ERR_RANGE, "kb_launch_seq(%s): stage %d has no "
                              "kernel or its grid %d PEs x %d cubes does not fit a SIP (%d x "
                              "%d)", name, k, cp[k].pes, cp[k].cubes, m->npes, m->ncubes);
        g.pes = cp[k].pes > g.pes ? cp[k].pes : g.pes;
        g.cubes = cp[k].cubes > g.cubes ? cp[k].cubes : g.cubes;
    }
    return launch_impl(ctx, name, stages_kernel, NULL, 0, &g, cp, n);
}

int kb_launch_per_sip(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *args,
                      const kb_grid *grid)
{
    return launch_impl(ctx, name, kernel, args, sizeof(kb_kargs), grid, NULL, 0);
}
