/*
 * kb_runtime_host — the host side's fibers (part of the runtime, kb_runtime.h; what the
 * runtime's files share is in host/private/kb_runtime_int.h): the host program, which
 * kb_ctx_run_host runs in a fiber until it finishes, fails or deadlocks, pausing for op-log
 * cuts on the way (a deadlock's report names every blocked fiber and what it waits on, then
 * adds the registered dump); the process groups of kb_spawn, one fiber per rank; each host
 * fiber's rank and current device. Limits: kb_spawn and kb_ctx_set_device work inside a host
 * program only; a spawn that runs out of memory part way fails the run and never returns (its
 * ranks already started still point at it).
 */
#include "kb_runtime_int.h"

#include "kb_progress.h"

#include <stdio.h>
#include <stdlib.h>

kb_hostproc *kb_ctx_hostproc(kb_ctx *ctx)
{
    kb_fiber *f = kb_fiber_current(ctx->sim);
    if (!f)
        return NULL;
    kb_hostproc *hp = kb_fiber_udata(f);
    return hp && hp->tag == KB_TAG_HOST ? hp : NULL;
}

static void host_main(kb_sim *sim, void *arg)
{
    kb_hostproc *hp = arg;
    (void)sim;
    hp->rc = hp->fn(hp->ctx, hp->arg);
    hp->finished = 1;
    if (hp->rc)
        kb_ctx_fail(hp->ctx, hp->rc);
}

typedef struct dl_report {
    char *buf;
    size_t n, len;
    int count;
} dl_report;

/* One blocked fiber's line, the buffer grown as needed (a line that finds no memory is left
 * out; the count still counts it). */
static void dl_line(const kb_fiber *f, const char *what, const void *obj, void *ud)
{
    dl_report *r = ud;
    (void)obj;
    r->count++;
    for (int tries = 0; tries < 2; tries++) {
        int w = snprintf(r->buf + r->len, r->n - r->len, "\n  %s: waits on %s", kb_fiber_name(f),
                         what ? what : "?");
        if (w < 0)
            return;
        if ((size_t)w < r->n - r->len) {
            r->len += (size_t)w;
            return;
        }
        char *nb = realloc(r->buf, 2 * r->n + (size_t)w + 1);
        if (!nb) {
            r->buf[r->len] = 0;
            return;
        }
        r->buf = nb;
        r->n = 2 * r->n + (size_t)w + 1;
    }
}

char *kb_ctx_blocked_lines(const kb_ctx *ctx, kb_sim *sim, int *count)
{
    dl_report r = { malloc(4096), 4096, 0, 0 };
    (void)ctx;
    *count = 0;
    if (!r.buf)
        return NULL;
    r.buf[0] = 0;
    kb_sim_foreach_blocked(sim, dl_line, &r);
    *count = r.count;
    return r.buf;
}

void kb_ctx_deadlock_report_lines(kb_ctx *ctx, char *const *lines, const int *counts, int n,
                                  kb_time t)
{
    /* the report grows with the machine: build it whole, keep it, summarise in err */
    size_t cap = 4096 + 256 * (size_t)(ctx->m->nsips * ctx->m->ncubes * ctx->m->npes);
    char *buf = malloc(cap);
    dl_report r = { buf, cap, 0, 0 };
    if (!buf) {
        kb_err_set(&ctx->err, KB_ERR_DEADLOCK, "deadlock");
        return;
    }
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        r.count += counts[i];
        if (lines[i] && r.len < cap) {
            int w = snprintf(buf + r.len, cap - r.len, "%s", lines[i]);
            r.len += w > 0 ? (size_t)w : 0;
            r.len = r.len < cap ? r.len : cap - 1;
        }
    }
    if (ctx->dump && r.len + 1 < cap) {
        int w = snprintf(buf + r.len, cap - r.len, "\n");
        r.len += w > 0 ? (size_t)w : 0;
        ctx->dump(ctx, buf + r.len, cap - r.len, ctx->dump_ud);
    }
    free(ctx->report);
    ctx->report = buf;
    kb_err_set(&ctx->err, KB_ERR_DEADLOCK, "at t=%.3f ns %d fiber(s) are blocked:%s",
               kb_time_to_ns(t), r.count, buf);
}

void kb_ctx_deadlock_report(kb_ctx *ctx, kb_sim *const *sims, int nsims, kb_time t)
{
    char **lines = calloc((size_t)nsims, sizeof *lines);
    int *counts = calloc((size_t)nsims, sizeof *counts);
    if (lines && counts)
        for (int i = 0; i < nsims; i++)
            lines[i] = kb_ctx_blocked_lines(ctx, sims[i], &counts[i]);
    kb_ctx_deadlock_report_lines(ctx, lines, counts, lines && counts ? nsims : 0, t);
    for (int i = 0; lines && i < nsims; i++)
        free(lines[i]);
    free(lines);
    free(counts);
}

static int run_host(kb_ctx *ctx, kb_host_fn fn, void *arg);

int kb_ctx_run_host(kb_ctx *ctx, kb_host_fn fn, void *arg)
{
    int prev = kb_progress_set_phase(ctx->progress, KB_PROGRESS_PHASE1);
    int rc = run_host(ctx, fn, arg);
    kb_progress_set_phase(ctx->progress, (kb_progress_phase)prev);
    return rc;
}

static int run_host(kb_ctx *ctx, kb_host_fn fn, void *arg)
{
    kb_hostproc hp = { KB_TAG_HOST, ctx, fn, arg, 0, -1, 0, 0, NULL, 0, { 0, 0 }, 0, { { 0, 0, 0 } }, 0 };
    kb_fiber *f = kb_fiber_spawn(ctx->sim, host_main, &hp, "host");
    int rc;

    if (!f)
        return kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory spawning the host fiber");
    kb_fiber_set_udata(f, &hp);
    while ((rc = kb_sim_run(ctx->sim)) == KB_CTX_CUT_) {
        if ((rc = kb_ctx_cut(ctx)) != 0) {
            kb_ctx_fail(ctx, rc);
            return rc;
        }
    }
    if (rc == KB_ERR_DEADLOCK && ctx->failed == KB_ERR_DEADLOCK)
        return rc; /* a forked launch's, reported at its join */
    if (rc == KB_ERR_DEADLOCK) {
        kb_sim *sims[1] = { ctx->sim };
        kb_ctx_deadlock_report(ctx, sims, 1, kb_sim_now(ctx->sim));
        return rc;
    }
    if (rc)
        return rc;
    if (!hp.finished)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "host program did not finish");
    return hp.rc;
}

typedef struct kb_spawn_st {
    struct kb_spawn_st *next, *prev;
    kb_ctx *ctx;
    kb_worker_fn fn;
    void *arg;
    int nprocs;
    kb_hostproc *procs;
    kb_latch done;
} kb_spawn_st;

void kb_ctx_spawn_free(kb_ctx *ctx, kb_spawn_st *sp)
{
    if (sp->prev)
        sp->prev->next = sp->next;
    else
        ctx->spawns = sp->next;
    if (sp->next)
        sp->next->prev = sp->prev;
    free(sp->procs);
    free(sp);
}

static void worker_main(kb_sim *sim, void *p)
{
    kb_hostproc *hp = p;
    kb_spawn_st *sp = hp->group;
    hp->rc = sp->fn(hp->ctx, hp->rank, sp->arg);
    hp->finished = 1;
    if (hp->rc) {
        if (!hp->ctx->failed)
            kb_err_prefix(&hp->ctx->err, "rank %d", hp->rank);
        kb_ctx_fail(hp->ctx, hp->rc);
        return;
    }
    kb_latch_done(sim, &sp->done);
}

int kb_spawn(kb_ctx *ctx, kb_worker_fn worker, void *arg, int nprocs)
{
    kb_hostproc *self = kb_ctx_hostproc(ctx);
    kb_spawn_st *sp;
    char name[48];
    int rc = 0;

    if (!self)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "spawn outside a host program");
    if (nprocs < 1)
        return kb_err_set(&ctx->err, KB_ERR_RANGE, "spawn: nprocs %d", nprocs);
    sp = calloc(1, sizeof *sp);
    if (!sp || !(sp->procs = calloc((size_t)nprocs, sizeof *sp->procs))) {
        free(sp);
        return kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
    }
    sp->ctx = ctx;
    sp->fn = worker;
    sp->arg = arg;
    sp->nprocs = nprocs;
    sp->next = ctx->spawns;
    if (ctx->spawns)
        ctx->spawns->prev = sp;
    ctx->spawns = sp;
    kb_latch_init(&sp->done, nprocs);
    for (int r = 0; r < nprocs; r++) {
        kb_hostproc *hp = &sp->procs[r];
        *hp = (kb_hostproc){ KB_TAG_HOST, ctx, NULL, NULL, 0, r, 0, 0, sp, 0, { 0, 0 }, 0, { { 0, 0, 0 } }, 0 };
        snprintf(name, sizeof name, "rank%d", r);
        kb_fiber *f = kb_fiber_spawn(ctx->sim, worker_main, hp, name);
        if (!f) {
            rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory spawning rank %d", r);
            kb_ctx_fail(ctx, rc);
            /* ranks already spawned point at sp: never return while they could run */
            for (;;)
                kb_fiber_block(ctx->sim, "aborted run", NULL);
        }
        kb_fiber_set_udata(f, hp);
    }
    kb_latch_wait(ctx->sim, &sp->done);
    kb_ctx_spawn_free(ctx, sp);
    return rc;
}

int kb_ctx_rank(kb_ctx *ctx)
{
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    return hp ? hp->rank : -1;
}

int kb_ctx_nprocs(kb_ctx *ctx)
{
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    return hp && hp->group ? hp->group->nprocs : 0;
}

int kb_ctx_set_device(kb_ctx *ctx, int sip)
{
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    if (sip < 0 || sip >= ctx->m->nsips)
        return kb_err_set(&ctx->err, KB_ERR_RANGE, "set_device(%d): the machine has SIPs 0..%d",
                          sip, ctx->m->nsips - 1);
    if (!hp)
        return kb_err_set(&ctx->err, KB_ERR_STATE, "set_device outside a host program");
    hp->device = sip;
    return 0;
}

int kb_ctx_current_device(kb_ctx *ctx)
{
    kb_hostproc *hp = kb_ctx_hostproc(ctx);
    return hp ? hp->device : 0;
}
