/*
 * kb_runtime — simulation context, host fibers, tensors and kernel launches (kb_runtime.h).
 *
 * Host writes become op-log records (a COPY from the log's payload, or a FILL) timed as DMAs
 * over PCIe into the SIP; launches are timed hop by hop on the command path with fan-out per
 * cube and aggregated completions. Reads replay pending records through the Phase-2 backend
 * first, then take the bytes through kb_memstore_load (from the device when a device-resident
 * backend holds them). An OpenCL backend is set up on a thread of its own while the
 * simulation runs (joined by the first flush or kb_ctx_backend_wait); a backend passed in
 * kb_ctx_opts is used as is and left alone. Limits: tensors are found by VA with a binary
 * search over (SIP, VA); a launch's bookkeeping is freed when the host fiber that waits for it
 * resumes.
 */
#include "kb_runtime_int.h"

#include "kb_opencl.h"
#include "kb_progress.h"
#include "kb_remote.h"
#include "kb_trace.h"

#include <assert.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KB_TENSOR_ALIGN 256u
#define KB_VA_ALIGN 65536u
#define KB_CMD_BYTES 64u

const char *kb_device_name(kb_device_kind d)
{
    static const char *names[] = { "auto", "gpu", "cpu", "ref", "none" };
    return (unsigned)d < 5 ? names[d] : "?";
}

int kb_device_from_name(const char *name)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(name, kb_device_name((kb_device_kind)i)) == 0)
            return i;
    return -1;
}

/* The machine's reservation observer, forwarding to the trace recorder. */
static void trace_res_observer(void *ud, const kb_res *r, kb_time t0, kb_time t1, uint64_t bytes)
{
    kb_trace_res(ud, r, t0, t1, bytes);
}

static double rt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int backend_for_device(kb_device_kind dev, kb_progress *pg, kb_backend *out, char *desc,
                              size_t desc_n, char *note, size_t note_n, kb_errbuf *eb);

/* The set-up thread: makes the backend of ctx->device (nothing else of ctx is touched but
 * the device stage of ctx->progress, which is this thread's to write). */
static void *backend_setup(void *arg)
{
    kb_ctx *ctx = arg;
    ctx->be_eb.msg[0] = '\0';
    kb_progress_set_device(ctx->progress, KB_PROGRESS_DEV_SETUP);
    ctx->be_rc = backend_for_device(ctx->device, ctx->progress, &ctx->be, ctx->device_desc,
                                    sizeof ctx->device_desc, ctx->device_note,
                                    sizeof ctx->device_note, &ctx->be_eb);
    kb_progress_set_device(ctx->progress, KB_PROGRESS_DEV_NONE);
    if (ctx->be_rc != 0)
        ctx->be.ops = NULL;
    /* A driver may have given this thread an alternate signal stack from its own heap (LLVM,
     * which PoCL loads, does); the thread's exit must not try to release it as its own (the
     * AddressSanitizer runtime would): nothing on this thread needs one any more. */
    stack_t off;
    memset(&off, 0, sizeof off);
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, NULL);
    atomic_store(&ctx->be_ready, 1);
    return NULL;
}

int kb_ctx_backend_wait(kb_ctx *ctx)
{
    if (ctx->be_pending) {
        double t0 = rt_now_ms();
        int prev = kb_progress_set_phase(ctx->progress, KB_PROGRESS_DEVICE_WAIT);
        pthread_join(ctx->be_thread, NULL);
        kb_progress_set_phase(ctx->progress, (kb_progress_phase)prev);
        ctx->be_pending = 0;
        ctx->be_wait_ms += rt_now_ms() - t0;
    }
    if (ctx->be_rc != 0)
        return kb_err_set(&ctx->err, ctx->be_rc, "%s", ctx->be_eb.msg);
    return 0;
}

double kb_ctx_backend_wait_ms(const kb_ctx *ctx) { return ctx->be_wait_ms; }

int kb_ctx_create(const kb_config *cfg, const kb_ctx_opts *opts, kb_ctx **out, kb_errbuf *eb)
{
    kb_ctx *ctx = calloc(1, sizeof *ctx);
    int rc;

    *out = NULL;
    if (!ctx)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the context");
    ctx->cfg = *cfg;
    ctx->device = opts ? opts->device : KB_DEV_AUTO;
    ctx->trace = opts ? opts->trace : NULL;
    ctx->trace_rec = opts ? opts->trace_rec : NULL;
    ctx->cut_every = opts && opts->cut_records ? opts->cut_records : KB_CTX_CUT_RECORDS;
    ctx->progress = opts ? opts->progress : NULL;
    if ((rc = kb_config_validate(cfg, eb)) != 0)
        goto fail;
    if ((rc = kb_machine_create(&cfg->topo, &ctx->m, eb)) != 0)
        goto fail;
    if (ctx->trace_rec) {
        kb_machine_observe(ctx->m, trace_res_observer, ctx->trace_rec);
        kb_trace_set_machine(ctx->trace_rec, ctx->m);
    }
    ctx->sim = kb_sim_create(NULL);
    ctx->log = kb_oplog_create();
    ctx->ms = kb_memstore_create();
    if (!ctx->sim || !ctx->log || !ctx->ms) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the context");
        goto fail;
    }
    kb_sim_set_progress(ctx->sim, ctx->progress);
    if (ctx->device == KB_DEV_NONE) {
        ctx->recording = 0;
        snprintf(ctx->device_desc, sizeof ctx->device_desc, "none (timing only)");
    } else if (opts && opts->backend && opts->backend->ops) {
        ctx->recording = 1;
        ctx->be = *opts->backend;
        ctx->be_borrowed = 1;
        snprintf(ctx->device_desc, sizeof ctx->device_desc, "%s",
                 opts->backend_desc ? opts->backend_desc : ctx->be.ops->name);
    } else if (ctx->device == KB_DEV_GPU || ctx->device == KB_DEV_CPU ||
               ctx->device == KB_DEV_AUTO) {
        /* The device set-up (driver, context, program) overlaps the simulation. */
        ctx->recording = 1;
        kb_opencl_env();
        ctx->be_pending = pthread_create(&ctx->be_thread, NULL, backend_setup, ctx) == 0;
        if (!ctx->be_pending) {
            backend_setup(ctx);
            if ((rc = ctx->be_rc) != 0) {
                kb_err_set(eb, rc, "%s", ctx->be_eb.msg);
                goto fail;
            }
        }
    } else {
        ctx->recording = 1;
        if ((rc = kb_backend_for_device(ctx->device, &ctx->be, ctx->device_desc,
                                        sizeof ctx->device_desc, ctx->device_note,
                                        sizeof ctx->device_note, eb)) != 0)
            goto fail;
    }
    *out = ctx;
    return 0;
fail:
    kb_ctx_destroy(ctx);
    return rc;
}

static void tensor_release(kb_tensor *t);
struct kb_spawn_st;
static void spawn_free(kb_ctx *ctx, struct kb_spawn_st *sp);

void kb_ctx_destroy(kb_ctx *ctx)
{
    if (!ctx)
        return;
    for (int i = KB_EXT_NSLOTS; i-- > 0;)
        if (ctx->ext[i] && ctx->ext_destroy[i])
            ctx->ext_destroy[i](ctx->ext[i]);
    while (ctx->spawns)
        spawn_free(ctx, ctx->spawns);
    while (ctx->launches) {
        kb_launch_st *l = ctx->launches;
        ctx->launches = l->next;
        for (int i = 0; l->tls && i < l->ntl; i++)
            kb_tl_fini(&l->tls[i]);
        free(l->tls);
        free(l->args);
        free(l->cube_left);
        free(l->cube_tmax);
        free(l->sip_left);
        free(l->sip_tmax);
        free(l);
    }
    for (size_t i = 0; i < ctx->ntensors; i++) {
        tensor_release(ctx->tensors[i]);
        free(ctx->tensors[i]);
    }
    free(ctx->tensors);
    kb_sim_destroy(ctx->sim);
    if (ctx->be_pending) {
        pthread_join(ctx->be_thread, NULL);
        ctx->be_pending = 0;
    }
    /* The store before the backend: a device-resident backend then forgets it instead of
     * handing its device data back. */
    kb_memstore_destroy(ctx->ms);
    if (ctx->be.ops && !ctx->be_borrowed)
        ctx->be.ops->destroy(ctx->be.self);
    kb_machine_destroy(ctx->m);
    kb_oplog_destroy(ctx->log);
    free(ctx->report);
    free(ctx);
}

const char *kb_ctx_errmsg(const kb_ctx *ctx) { return ctx->err.msg; }
const char *kb_ctx_device_desc(const kb_ctx *ctx) { return ctx->device_desc; }
const char *kb_ctx_device_note(const kb_ctx *ctx) { return ctx->device_note; }

int kb_backend_for_device(kb_device_kind dev, kb_backend *out, char *desc, size_t desc_n,
                          char *note, size_t note_n, kb_errbuf *eb)
{
    return backend_for_device(dev, NULL, out, desc, desc_n, note, note_n, eb);
}

/* kb_backend_for_device, publishing the OpenCL program build's stage into pg. */
static int backend_for_device(kb_device_kind dev, kb_progress *pg, kb_backend *out, char *desc,
                              size_t desc_n, char *note, size_t note_n, kb_errbuf *eb)
{
    char tmp[160];
    int rc;
    if (note && note_n)
        note[0] = 0;
    if (!desc) {
        desc = tmp;
        desc_n = sizeof tmp;
    }
    if ((dev == KB_DEV_GPU || dev == KB_DEV_CPU || dev == KB_DEV_AUTO) && kb_devd_enabled()) {
        /* a device server (kbcl devd) for this device: no set-up of our own */
        const char *names[2] = { kb_device_name(dev), dev == KB_DEV_AUTO ? "gpu" : NULL };
        for (int i = 0; i < 2 && names[i]; i++) {
            char path[200];
            kb_errbuf why = { { 0 } };
            if (kb_devd_socket_path(names[i], path, sizeof path, &why) != 0)
                continue;
            rc = kb_remote_backend_create(path, out, desc, desc_n, &why);
            if (rc == 0)
                return 0;
            if (rc != KB_ERR_NOTFOUND && note && note_n)
                snprintf(note, note_n, "%.200s; setting the device up in this process",
                         why.msg);
        }
    }
    switch (dev) {
    case KB_DEV_REF:
        snprintf(desc, desc_n, "ref (plain C)");
        return kb_ref_backend_create(out);
    case KB_DEV_GPU:
        return kb_opencl_backend_create_pg(KB_CL_GPU, KB_CL_CACHE_USE, pg, out, desc, desc_n, eb);
    case KB_DEV_CPU:
        return kb_opencl_backend_create_pg(KB_CL_CPU, KB_CL_CACHE_USE, pg, out, desc, desc_n, eb);
    case KB_DEV_AUTO: {
        kb_errbuf why;
        rc = kb_opencl_backend_create_pg(KB_CL_ANY, KB_CL_CACHE_USE, pg, out, desc, desc_n,
                                         &why);
        if (rc == 0)
            return 0;
        if (note && note_n)
            snprintf(note, note_n, "device auto: no usable OpenCL device, replaying with ref (%.180s)",
                     why.msg);
        snprintf(desc, desc_n, "ref (plain C)");
        return kb_ref_backend_create(out);
    }
    default:
        return kb_err_set(eb, KB_ERR_INVAL, "device '%s' has no Phase-2 backend",
                          kb_device_name(dev));
    }
}
const char *kb_ctx_report(const kb_ctx *ctx) { return ctx->report; }
kb_errbuf *kb_ctx_err(kb_ctx *ctx) { return &ctx->err; }
kb_sim *kb_ctx_sim(kb_ctx *ctx) { return ctx->sim; }
kb_machine *kb_ctx_machine(kb_ctx *ctx) { return ctx->m; }
const kb_config *kb_ctx_config(const kb_ctx *ctx) { return &ctx->cfg; }
kb_oplog *kb_ctx_oplog(kb_ctx *ctx) { return ctx->log; }
int kb_ctx_recording(const kb_ctx *ctx) { return ctx->recording; }
kb_device_kind kb_ctx_device(const kb_ctx *ctx) { return ctx->device; }
const kb_replay_stats *kb_ctx_replay_stats(const kb_ctx *ctx) { return &ctx->rstats; }
const kb_backend *kb_ctx_backend(const kb_ctx *ctx) { return &ctx->be; }
int kb_ctx_backend_borrowed(const kb_ctx *ctx) { return ctx->be_borrowed; }
kb_memstore *kb_ctx_memstore(kb_ctx *ctx) { return ctx->ms; }
uint64_t kb_ctx_kernels_run(const kb_ctx *ctx) { return ctx->kernels; }
FILE *kb_ctx_trace(kb_ctx *ctx) { return ctx->trace; }
int kb_ctx_records(const kb_ctx *ctx) { return ctx->recording || ctx->trace_rec != NULL; }
int kb_ctx_failed(const kb_ctx *ctx) { return ctx->failed; }

void *kb_ctx_ext(kb_ctx *ctx, int slot)
{
    return slot >= 0 && slot < KB_EXT_NSLOTS ? ctx->ext[slot] : NULL;
}

void kb_ctx_set_ext(kb_ctx *ctx, int slot, void *ptr, void (*destroy)(void *ptr))
{
    if (slot < 0 || slot >= KB_EXT_NSLOTS)
        return;
    ctx->ext[slot] = ptr;
    ctx->ext_destroy[slot] = destroy;
}

void kb_ctx_set_deadlock_dump(kb_ctx *ctx, kb_dump_fn fn, void *ud)
{
    ctx->dump = fn;
    ctx->dump_ud = ud;
}

void kb_ctx_fail(kb_ctx *ctx, int code)
{
    if (!ctx->failed) {
        ctx->failed = code;
        kb_sim_stop(ctx->sim, code);
    }
}

static const char *rec_name(const kb_rec *r)
{
    static const char *const m1[KB_M1_NOPS] = { "exp", "log", "sqrt", "abs", "sigmoid", "cos",
                                                "sin", "neg", "recip", "relu", "gelu", "scale",
                                                "rsqrt", "tanh", "silu", "softcap" };
    static const char *const m2[KB_M2_NOPS] = { "add", "sub", "mul", "div", "max", "min" };
    switch (r->kind) {
    case KB_REC_MATH1:
        return r->op < KB_M1_NOPS ? m1[r->op] : "math1";
    case KB_REC_MATH2:
        return r->op < KB_M2_NOPS ? m2[r->op] : "math2";
    case KB_REC_REDUCE:
        return r->op == KB_RED_MAX ? "reduce_max" : "reduce_sum";
    default:
        return kb_rec_kind_name((kb_rec_kind)r->kind);
    }
}

int kb_ctx_record(kb_ctx *ctx, kb_rec *r)
{
    return kb_ctx_record_as(ctx, r, NULL);
}

int kb_ctx_record_as(kb_ctx *ctx, kb_rec *r, const char *name)
{
    if (ctx->trace_rec) {
        const kb_pe_hw *pe = r->pe == UINT32_MAX ? NULL : ctx->m->pe_by_gid[r->pe];
        unsigned gsip = pe ? pe->gsip : kb_pa_gsip(r->dst.addr);
        /* IPCQ names its copies "ipcq send E", "ipcq recv W" ... (kb_ipcq.c) */
        kb_trace_cat cat = r->kind == KB_REC_COPY && name && !strncmp(name, "ipcq", 4)
                               ? KB_TRACE_IPCQ
                           : r->kind == KB_REC_COPY || r->kind == KB_REC_FILL ||
                                   r->kind == KB_REC_GEN || !pe
                               ? KB_TRACE_DMA
                               : KB_TRACE_COMPUTE;
        kb_trace_pe(ctx->trace_rec, cat, gsip, pe ? pe->cube : 0, pe ? (int)pe->pe : -1,
                    name ? name : rec_name(r), r->t_start, r->t_end, kb_opnd_span(&r->dst));
    }
    if (!ctx->recording)
        return 0;
    if (kb_oplog_append(ctx->log, r, &r->seq) != 0)
        return kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory appending to the op log");
    /* Pause the simulation after this step for a cut (ctx_cut): a fixed record count, so the
     * cuts fall at the same places whatever the backend. */
    if (++ctx->since_cut >= ctx->cut_every && !ctx->cut_asked && !ctx->failed) {
        ctx->cut_asked = 1;
        kb_sim_stop(ctx->sim, KB_CTX_CUT_);
    }
    return 0;
}

static int replay_pending(kb_ctx *ctx)
{
    int prev = kb_progress_set_phase(ctx->progress, KB_PROGRESS_REPLAY);
    int rc = kb_replay_flush_pg(ctx->log, ctx->ms, &ctx->be, &ctx->rstats, ctx->progress,
                                &ctx->err);
    kb_progress_set_phase(ctx->progress, (kb_progress_phase)prev);
    if (rc)
        kb_err_prefix(&ctx->err, "phase-2 replay (%s)", ctx->be.ops->name);
    return rc;
}

int kb_ctx_sync(kb_ctx *ctx)
{
    if (ctx->be_pending || !ctx->be.ops || !ctx->be.ops->sync)
        return 0;
    int rc = ctx->be.ops->sync(ctx->be.self, &ctx->err);
    if (rc)
        kb_err_prefix(&ctx->err, "phase-2 replay (%s)", ctx->be.ops->name);
    return rc;
}

int kb_ctx_flush(kb_ctx *ctx)
{
    if (!ctx->recording)
        return kb_err_set(&ctx->err, KB_ERR_UNSUPPORTED,
                          "no data with --device none (timing only): tensor contents are not computed");
    if (kb_oplog_replayed(ctx->log) == kb_oplog_count(ctx->log))
        return kb_ctx_sync(ctx);
    int rc = kb_ctx_backend_wait(ctx);
    if (rc == 0)
        rc = replay_pending(ctx);
    if (rc == 0)
        rc = kb_ctx_sync(ctx);
    return rc;
}

/*
 * At a pause for a cut: marks it, and hands a pipelined backend everything so far (not
 * waiting for a backend still being set up: a later cut or read takes those records).
 */
static int ctx_cut(kb_ctx *ctx)
{
    int rc;
    ctx->cut_asked = 0;
    ctx->since_cut = 0;
    if (kb_oplog_cut(ctx->log) != 0)
        return kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory marking an op-log cut");
    if (ctx->be_pending) {
        if (!atomic_load(&ctx->be_ready))
            return 0;
        if ((rc = kb_ctx_backend_wait(ctx)) != 0)
            return rc;
    }
    if (!ctx->be.ops || !ctx->be.ops->sync)
        return 0;
    return replay_pending(ctx);
}

/* ---- host fibers ---- */

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

static void dl_line(const kb_fiber *f, const char *what, const void *obj, void *ud)
{
    dl_report *r = ud;
    (void)obj;
    r->count++;
    if (r->len < r->n) {
        int w = snprintf(r->buf + r->len, r->n - r->len, "\n  %s: waits on %s", kb_fiber_name(f),
                         what ? what : "?");
        if (w > 0)
            r->len += (size_t)w;
    }
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
    kb_hostproc hp = { KB_TAG_HOST, ctx, fn, arg, 0, -1, 0, 0, NULL };
    kb_fiber *f = kb_fiber_spawn(ctx->sim, host_main, &hp, "host");
    int rc;

    if (!f)
        return kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory spawning the host fiber");
    kb_fiber_set_udata(f, &hp);
    while ((rc = kb_sim_run(ctx->sim)) == KB_CTX_CUT_) {
        if ((rc = ctx_cut(ctx)) != 0) {
            kb_ctx_fail(ctx, rc);
            return rc;
        }
    }
    if (rc == KB_ERR_DEADLOCK) {
        /* the report grows with the machine: build it whole, keep it, summarise in err */
        size_t cap = 4096 + 256 * (size_t)(ctx->m->nsips * ctx->m->ncubes * ctx->m->npes);
        char *buf = malloc(cap);
        dl_report r = { buf, cap, 0, 0 };
        if (buf) {
            buf[0] = 0;
            kb_sim_foreach_blocked(ctx->sim, dl_line, &r);
            if (ctx->dump && r.len + 1 < cap) {
                int w = snprintf(buf + r.len, cap - r.len, "\n");
                r.len += w > 0 ? (size_t)w : 0;
                ctx->dump(ctx, buf + r.len, cap - r.len, ctx->dump_ud);
            }
            free(ctx->report);
            ctx->report = buf;
            kb_err_set(&ctx->err, KB_ERR_DEADLOCK, "at t=%.3f ns %d fiber(s) are blocked:%s",
                       kb_time_to_ns(kb_sim_now(ctx->sim)), r.count, buf);
        } else {
            kb_err_set(&ctx->err, KB_ERR_DEADLOCK, "deadlock");
        }
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

static void spawn_free(kb_ctx *ctx, kb_spawn_st *sp)
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
        *hp = (kb_hostproc){ KB_TAG_HOST, ctx, NULL, NULL, 0, r, 0, 0, sp };
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
    spawn_free(ctx, sp);
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

/* Blocks the calling fiber until absolute time t (no-op outside fibers or in the past). */
static void wait_until(kb_ctx *ctx, kb_time t)
{
    kb_time now = kb_sim_now(ctx->sim);
    if (kb_fiber_current(ctx->sim) && t > now)
        kb_fiber_sleep(ctx->sim, t - now);
}

/* ---- tensors ---- */

static int tensor_cmp_key(const kb_tensor *t, unsigned gsip, kb_va va)
{
    if (t->gsip != gsip)
        return t->gsip < gsip ? -1 : 1;
    if (va < t->va)
        return 1;
    if (va >= t->va + t->va_bytes)
        return -1;
    return 0;
}

kb_tensor *kb_ctx_tensor_at(kb_ctx *ctx, unsigned gsip, kb_va va)
{
    size_t lo = 0, hi = ctx->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = tensor_cmp_key(ctx->tensors[mid], gsip, va);
        if (c == 0)
            return ctx->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int registry_insert(kb_ctx *ctx, kb_tensor *t)
{
    if (ctx->ntensors == ctx->captensors) {
        size_t cap = ctx->captensors ? ctx->captensors * 2 : 16;
        kb_tensor **n = realloc(ctx->tensors, cap * sizeof *n);
        if (!n)
            return KB_ERR_NOMEM;
        ctx->tensors = n;
        ctx->captensors = cap;
    }
    size_t i = ctx->ntensors;
    while (i > 0 && (ctx->tensors[i - 1]->gsip > t->gsip ||
                     (ctx->tensors[i - 1]->gsip == t->gsip && ctx->tensors[i - 1]->va > t->va))) {
        ctx->tensors[i] = ctx->tensors[i - 1];
        i--;
    }
    ctx->tensors[i] = t;
    ctx->ntensors++;
    return 0;
}

static void registry_remove(kb_ctx *ctx, kb_tensor *t)
{
    for (size_t i = 0; i < ctx->ntensors; i++) {
        if (ctx->tensors[i] == t) {
            memmove(&ctx->tensors[i], &ctx->tensors[i + 1],
                    (ctx->ntensors - i - 1) * sizeof *ctx->tensors);
            ctx->ntensors--;
            return;
        }
    }
}

static kb_alloc *shard_allocator(kb_ctx *ctx, const kb_tensor *t, const kb_shard_spec *s)
{
    kb_cube_hw *cube = &ctx->m->sips[s->sip].cubes[s->cube];
    switch (t->mem) {
    case KB_MEM_TCM:
        return cube->pes[s->pe].tcm;
    case KB_MEM_SRAM:
        return cube->sram;
    default:
        return cube->pes[s->pe].hbm;
    }
}

/* Frees shard memory and VA; the struct itself stays (caller frees). */
static void tensor_release(kb_tensor *t)
{
    kb_ctx *ctx = t->ctx;
    kb_sip_hw *sip = &ctx->m->sips[t->gsip];
    for (size_t i = 0; i < t->nshards; i++) {
        if (t->pas[i] != KB_PA_INVALID_ADDR) {
            kb_alloc_free(shard_allocator(ctx, t, &t->shards[i]), t->pas[i], NULL);
            kb_mmu_unmap(sip->mmu, t->va + t->shards[i].offset_bytes, t->shards[i].nbytes, NULL);
        }
    }
    if (t->va)
        kb_alloc_free(sip->va, t->va, NULL);
    free(t->shards);
    free(t->pas);
    t->shards = NULL;
    t->pas = NULL;
    t->nshards = 0;
}

void kb_tensor_free(kb_tensor *t)
{
    if (!t)
        return;
    registry_remove(t->ctx, t);
    tensor_release(t);
    free(t);
}

int kb_tensor_empty(kb_ctx *ctx, const kb_tensor_desc *d, kb_tensor **out)
{
    kb_errbuf *eb = &ctx->err;
    kb_tensor *t = calloc(1, sizeof *t);
    int rc = 0;
    size_t esize = kb_dtype_size(d->dtype);
    const char *name = d->name ? d->name : "tensor";

    *out = NULL;
    if (!t)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    t->ctx = ctx;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = d->rows;
    t->cols = d->cols;
    t->dtype = d->dtype;
    t->dp = d->dp;
    t->mem = d->mem;
    t->gsip = (unsigned)kb_ctx_current_device(ctx);
    if (d->rows <= 0 || d->cols <= 0 || (unsigned)d->dtype >= KB_NDTYPES ||
        d->rows > UINT32_MAX || d->cols > UINT32_MAX) {
        rc = kb_err_set(eb, KB_ERR_INVAL, "tensor '%s': invalid shape %lld x %lld or dtype", name,
                        (long long)d->rows, (long long)d->cols);
        goto fail;
    }
    rc = kb_dp_resolve(&d->dp, (uint64_t)d->rows, (uint64_t)d->cols, esize, ctx->m->npes,
                       ctx->m->ncubes, t->gsip, &t->shards, &t->nshards, eb);
    if (rc) {
        kb_err_prefix(eb, "tensor '%s'", name);
        goto fail;
    }
    t->grid_pes = d->dp.num_pes ? d->dp.num_pes : ctx->m->npes;
    t->grid_cubes = d->dp.num_cubes ? d->dp.num_cubes : ctx->m->ncubes;
    t->pas = malloc(t->nshards * sizeof *t->pas);
    if (!t->pas) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < t->nshards; i++)
        t->pas[i] = KB_PA_INVALID_ADDR;
    for (size_t i = 0; i < t->nshards; i++)
        t->va_bytes = t->shards[i].offset_bytes + t->shards[i].nbytes > t->va_bytes
                          ? t->shards[i].offset_bytes + t->shards[i].nbytes
                          : t->va_bytes;
    kb_sip_hw *sip = &ctx->m->sips[t->gsip];
    rc = kb_alloc_alloc(sip->va, t->va_bytes, KB_VA_ALIGN, &t->va, eb);
    if (rc) {
        kb_err_prefix(eb, "tensor '%s'", name);
        goto fail;
    }
    for (size_t i = 0; i < t->nshards; i++) {
        const kb_shard_spec *s = &t->shards[i];
        uint64_t pa;
        rc = kb_alloc_alloc(shard_allocator(ctx, t, s), s->nbytes, KB_TENSOR_ALIGN, &pa, eb);
        if (rc) {
            char b[32];
            kb_err_prefix(eb, "tensor '%s' (%s, %lld x %lld %s), shard %zu", name,
                          kb_fmt_bytes((uint64_t)d->rows * (uint64_t)d->cols * esize, b, sizeof b),
                          (long long)d->rows, (long long)d->cols, kb_dtype_name(d->dtype), i);
            goto fail;
        }
        t->pas[i] = pa;
        rc = kb_mmu_map(sip->mmu, t->va + s->offset_bytes, s->nbytes, pa, eb);
        if (rc)
            goto fail;
    }
    if (registry_insert(ctx, t) != 0) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    *out = t;
    return 0;
fail:
    tensor_release(t);
    free(t);
    return rc;
}

kb_fill kb_fill_array(const float *data, int64_t ld)
{
    kb_fill f = { NULL, NULL, data, ld, 0, 0, NULL };
    return f;
}

kb_fill kb_fill_at(kb_fill f, int64_t rows, int64_t cols)
{
    f.row0 += rows;
    f.col0 += cols;
    return f;
}

/* Values per piece a recording host write asks a generator for: bounds its scratch. */
#define KB_FILL_PIECE 65536

/* Shard s's block of the source, rounded once to the tensor's dtype into block (row-major,
 * s->rows x s->cols); piece: KB_FILL_PIECE floats of scratch for a generator. */
static void fill_block(const kb_tensor *t, const kb_shard_spec *s, const kb_fill *src,
                       uint8_t *block, float *piece)
{
    int64_t R = (int64_t)s->rows, C = (int64_t)s->cols;
    int64_t r0 = src->row0 + (int64_t)s->row0, c0 = src->col0 + (int64_t)s->col0;

    if (!src->fn) {
        int64_t ld = src->ld ? src->ld : t->cols;
        for (int64_t r = 0; r < R; r++)
            kb_dtype_store_n(t->dtype, block, (size_t)(r * C),
                             src->data + (size_t)((r0 + r) * ld + c0), (size_t)C);
        return;
    }
    /* whole rows while they fit in a piece, else a row in parts */
    int64_t rows_per = C >= KB_FILL_PIECE ? 1 : KB_FILL_PIECE / C;
    int64_t cols_per = C >= KB_FILL_PIECE ? KB_FILL_PIECE : C;
    for (int64_t r = 0; r < R; r += rows_per) {
        int64_t nr = R - r < rows_per ? R - r : rows_per;
        for (int64_t c = 0; c < C; c += cols_per) {
            int64_t nc = C - c < cols_per ? C - c : cols_per;
            src->fn(src->ud, r0 + r, c0 + c, nr, nc, piece);
            for (int64_t i = 0; i < nr; i++)
                kb_dtype_store_n(t->dtype, block, (size_t)((r + i) * C + c), piece + i * nc,
                                 (size_t)nc);
        }
    }
}

/*
 * Times a host write of every shard and, when recording, records it: src == NULL writes
 * zeros (FILL), else a COPY from the op log's payload, which holds each distinct block once
 * (replicas share it). A timing-only context never looks at src's values.
 */
static int host_write(kb_tensor *t, const kb_fill *src)
{
    kb_ctx *ctx = t->ctx;
    size_t esize = kb_dtype_size(t->dtype);
    kb_time t0 = kb_sim_now(ctx->sim) + ctx->m->host_overhead, tmax = t0;
    uint8_t *block = NULL;
    float *piece = NULL;
    uint64_t *payload_of = NULL;
    int rc = 0;

    if (src && !src->fn && !src->data)
        return kb_err_set(&ctx->err, KB_ERR_INVAL, "tensor '%s': a host write with neither a "
                          "generator nor data", t->name);
    if (src && ctx->recording) {
        payload_of = malloc(t->nshards * sizeof *payload_of);
        piece = src->fn && !src->gen ? malloc(KB_FILL_PIECE * sizeof *piece) : NULL;
        if (!payload_of || (src->fn && !src->gen && !piece)) {
            rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    for (size_t i = 0; i < t->nshards; i++) {
        const kb_shard_spec *s = &t->shards[i];
        kb_rec r;
        memset(&r, 0, sizeof r);
        rc = kb_machine_dma(ctx->m, NULL, KB_PA_INVALID_ADDR, t->pas[i], s->nbytes, t0,
                            &r.t_start, &r.t_end, &ctx->err);
        if (rc)
            goto out;
        if (r.t_end > tmax)
            tmax = r.t_end;
        if (!ctx->recording)
            continue;
        r.pe = UINT32_MAX;
        r.dst = kb_opnd_make(t->pas[i], (uint32_t)s->rows, (uint32_t)s->cols, t->dtype);
        if (!src) {
            r.kind = KB_REC_FILL;
            r.nsrc = 0;
            r.imm[0] = 0.0f;
        } else if (src->gen) { /* generated where it replays */
            const kb_fill_gen *g = src->gen;
            r.kind = KB_REC_GEN;
            r.nsrc = 0;
            r.op = g->sign ? KB_GEN_SIGN : KB_GEN_PLAIN;
            r.src[0].addr = (uint64_t)(g->tile0 + src->row0 + (int64_t)s->row0);
            r.src[1].addr = (uint64_t)(g->i0 + src->col0 + (int64_t)s->col0);
            r.src[2].addr = (uint64_t)g->n;
            r.src[0].rows = g->seed;
            r.src[0].cols = (uint32_t)g->ntiles;
        } else {
            size_t j, n = (size_t)(s->rows * s->cols);
            /* identical blocks (replicas) share one payload */
            for (j = 0; j < i; j++)
                if (t->shards[j].row0 == s->row0 && t->shards[j].col0 == s->col0 &&
                    t->shards[j].rows == s->rows && t->shards[j].cols == s->cols)
                    break;
            if (j < i) {
                payload_of[i] = payload_of[j];
            } else {
                /* generated straight into the payload: no block to copy from */
                if (kb_oplog_reserve_payload(ctx->log, n * esize, &payload_of[i], &block) != 0) {
                    rc = kb_err_nomem(&ctx->err, (unsigned long long)(n * esize),
                                      "tensor '%s': shard %zu's data in the op log (%llu bytes "
                                      "held there already)", t->name, i,
                                      (unsigned long long)kb_oplog_payload_size(ctx->log));
                    goto out;
                }
                fill_block(t, s, src, block, piece);
                block = NULL;
            }
            r.kind = KB_REC_COPY;
            r.nsrc = 1;
            r.src[0] = kb_opnd_make(payload_of[i], (uint32_t)s->rows, (uint32_t)s->cols, t->dtype);
            r.src[0].space = KB_SPACE_PAYLOAD;
        }
        if ((rc = kb_ctx_record(ctx, &r)) != 0)
            goto out;
    }
out:
    free(piece);
    free(payload_of);
    /* wait with nothing held: a run stopped meanwhile never resumes this fiber */
    if (rc == 0)
        wait_until(ctx, tmax);
    return rc;
}

int kb_tensor_zeros(kb_ctx *ctx, const kb_tensor_desc *d, kb_tensor **out)
{
    return kb_tensor_from_fill(ctx, d, NULL, out);
}

int kb_tensor_from_fill(kb_ctx *ctx, const kb_tensor_desc *d, const kb_fill *src,
                        kb_tensor **out)
{
    int rc = kb_tensor_empty(ctx, d, out);
    if (rc == 0 && (rc = host_write(*out, src)) != 0) {
        kb_tensor_free(*out);
        *out = NULL;
    }
    return rc;
}

int kb_tensor_from_host(kb_ctx *ctx, const kb_tensor_desc *d, const float *data, kb_tensor **out)
{
    kb_fill f = kb_fill_array(data, 0);
    return kb_tensor_from_fill(ctx, d, data ? &f : NULL, out);
}

int kb_tensor_copy_from_fill(kb_tensor *t, const kb_fill *src)
{
    return host_write(t, src);
}

int kb_tensor_copy_from(kb_tensor *t, const float *data)
{
    kb_fill f = kb_fill_array(data, 0);
    return host_write(t, data ? &f : NULL);
}

/* Shard i is the first shard holding its block (replicas after the first are skipped). */
static int first_replica(const kb_tensor *t, size_t i)
{
    const kb_shard_spec *s = &t->shards[i];
    for (size_t j = 0; j < i; j++)
        if (t->shards[j].row0 == s->row0 && t->shards[j].col0 == s->col0 &&
            t->shards[j].rows == s->rows && t->shards[j].cols == s->cols)
            return 0;
    return 1;
}

int kb_tensor_read_raw(kb_tensor *t, void *out)
{
    kb_ctx *ctx = t->ctx;
    size_t esize = kb_dtype_size(t->dtype);
    uint8_t *block = NULL;
    int rc = kb_ctx_flush(ctx);
    if (rc)
        return rc;
    kb_time t0 = kb_sim_now(ctx->sim) + ctx->m->host_overhead, tmax = t0;
    for (size_t i = 0; i < t->nshards; i++) {
        const kb_shard_spec *s = &t->shards[i];
        kb_time ts, te;
        if (!first_replica(t, i))
            continue;
        if (kb_fiber_current(ctx->sim)) {
            rc = kb_machine_dma(ctx->m, NULL, t->pas[i], KB_PA_INVALID_ADDR, s->nbytes, t0, &ts,
                                &te, &ctx->err);
            if (rc)
                goto out;
            if (te > tmax)
                tmax = te;
        }
        if (s->cols == (uint64_t)t->cols) { /* whole rows: contiguous in out too */
            rc = kb_memstore_load(ctx->ms, t->pas[i], (uint8_t *)out + s->row0 * s->cols * esize,
                                  s->nbytes, &ctx->err);
            if (rc)
                goto out;
            continue;
        }
        free(block);
        block = malloc(s->nbytes);
        if (!block) {
            rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
            goto out;
        }
        if ((rc = kb_memstore_load(ctx->ms, t->pas[i], block, s->nbytes, &ctx->err)) != 0)
            goto out;
        kb_shard_unpack(s, block, (uint64_t)t->cols, esize, out);
    }
    wait_until(ctx, tmax);
out:
    free(block);
    return rc;
}

int kb_tensor_read(kb_tensor *t, float *out)
{
    size_t n = (size_t)(t->rows * t->cols), esize = kb_dtype_size(t->dtype);
    uint8_t *raw = malloc(n * esize);
    int rc;
    if (!raw)
        return kb_err_nomem(&t->ctx->err, (unsigned long long)(n * esize),
                            "tensor '%s' read back", t->name);
    rc = kb_tensor_read_raw(t, raw);
    if (rc == 0)
        kb_dtype_load_n(t->dtype, raw, 0, out, n);
    free(raw);
    return rc;
}

int kb_tensor_read_shard_raw(kb_tensor *t, size_t i, void *out)
{
    int rc;
    if (i >= t->nshards)
        return kb_err_set(&t->ctx->err, KB_ERR_RANGE, "tensor '%s' has %zu shards", t->name,
                          t->nshards);
    if ((rc = kb_ctx_flush(t->ctx)) != 0)
        return rc;
    return kb_memstore_load(t->ctx->ms, t->pas[i], out, t->shards[i].nbytes, &t->ctx->err);
}

kb_va kb_tensor_va(const kb_tensor *t) { return t->va; }
int64_t kb_tensor_rows(const kb_tensor *t) { return t->rows; }
int64_t kb_tensor_cols(const kb_tensor *t) { return t->cols; }
kb_dtype kb_tensor_dtype(const kb_tensor *t) { return t->dtype; }
size_t kb_tensor_nshards(const kb_tensor *t) { return t->nshards; }
const kb_shard_spec *kb_tensor_shard(const kb_tensor *t, size_t i) { return &t->shards[i]; }
kb_pa kb_tensor_shard_pa(const kb_tensor *t, size_t i) { return t->pas[i]; }
const char *kb_tensor_name(const kb_tensor *t) { return t->name; }
unsigned kb_tensor_sip(const kb_tensor *t) { return t->gsip; }

/* ---- launches ---- */

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
    kb_tl *parent;
    struct kb_tl_thread *next; /* the launch's threads */
} kb_tl_thread;

static void launch_free(kb_launch_st *l)
{
    kb_ctx *ctx = l->ctx;
    for (kb_tl_thread *t = l->threads, *n; t; t = n) {
        n = t->next;
        kb_tl_fini(&t->tl);
        free(t);
    }
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
    free(l->cube_left);
    free(l->cube_tmax);
    free(l->sip_left);
    free(l->sip_tmax);
    free(l);
}

static void launch_done_event(kb_sim *sim, void *a, void *b)
{
    kb_launch_st *l = a;
    (void)b;
    kb_signal_fire(sim, &l->done);
}

void kb_tl_release_all(kb_tl *tl);

/* Completion of one PE's kernel: aggregate per cube at M_CPU, per SIP at IO_CPU. */
static void kernel_finished(kb_tl *tl)
{
    kb_launch_st *l = tl->launch;
    kb_ctx *ctx = tl->ctx;
    kb_machine *m = ctx->m;
    int s = tl->pid[2], c = tl->pid[1];
    int ci = s * l->grid.cubes + c;
    kb_time t = kb_machine_cmd_pe_to_mcpu(m, tl->pe, kb_sim_now(ctx->sim), KB_CMD_BYTES);

    if (t > l->cube_tmax[ci])
        l->cube_tmax[ci] = t;
    if (--l->cube_left[ci] > 0)
        return;
    t = kb_machine_cmd_mcpu_to_iocpu(m, tl->pe->gsip, tl->pe->cube, l->cube_tmax[ci], KB_CMD_BYTES);
    if (t > l->sip_tmax[s])
        l->sip_tmax[s] = t;
    if (--l->sip_left[s] > 0)
        return;
    t = kb_machine_cmd_iocpu_to_host(m, tl->pe->gsip, l->sip_tmax[s], KB_CMD_BYTES);
    if (t > l->t_done)
        l->t_done = t;
    if (--l->sips_left > 0)
        return;
    if (kb_sim_at(ctx->sim, l->t_done, launch_done_event, l, NULL) != 0)
        kb_signal_fire(ctx->sim, &l->done);
}

static void kernel_main(kb_sim *sim, void *arg)
{
    kb_tl *tl = arg;
    kb_time now = kb_sim_now(sim);
    if (tl->start > now)
        kb_fiber_sleep(sim, tl->start - now);
    tl->launch->kernel(tl, &tl->launch->args[tl->pid[2]]);
    for (kb_tl_thread *t = tl->launch->threads; t; t = t->next)
        if (t->parent == tl && !t->done)
            tl_fail(tl, KB_ERR_STATE, "the kernel returned before joining a thread it forked "
                    "(tl_join)");
    if (tl->ctx->trace_rec) {
        /* the launch (and its name) is freed before the trace is written */
        const char *name = kb_trace_intern(tl->ctx->trace_rec, tl->launch->name);
        if (name)
            kb_trace_pe(tl->ctx->trace_rec, KB_TRACE_KERNEL, tl->pe->gsip, tl->pe->cube,
                        (int)tl->pe->pe, name, tl->start, kb_sim_now(sim), 0);
    }
    kb_tl_release_all(tl);
    tl->ctx->kernels++;
    kernel_finished(tl);
}

static void thread_main(kb_sim *sim, void *arg)
{
    kb_tl_thread *t = arg;
    t->fn(&t->tl, t->arg);
    for (kb_tl_thread *c = t->tl.launch->threads; c; c = c->next)
        if (c->parent == &t->tl && !c->done)
            tl_fail(&t->tl, KB_ERR_STATE, "a thread returned before joining a thread it forked "
                    "(tl_join)");
    kb_tl_release_all(&t->tl);
    t->done = 1;
    if (t->joiner)
        kb_fiber_wake_at(sim, t->joiner, kb_sim_now(sim));
}

kb_tl *tl_fork(kb_tl *tl, void (*fn)(kb_tl *child, void *arg), void *arg)
{
    kb_launch_st *l = tl->launch;
    kb_tl_thread *t = aligned_alloc(64, (sizeof *t + 63) & ~(size_t)63);
    char fname[128];
    if (!t)
        tl_fail(tl, KB_ERR_NOMEM, "tl_fork: out of memory");
    memset(t, 0, sizeof *t);
    t->tl.tag = tl->tag;
    t->tl.ctx = tl->ctx;
    t->tl.pe = tl->pe;
    t->tl.launch = l;
    memcpy(t->tl.pid, tl->pid, sizeof t->tl.pid);
    memcpy(t->tl.np, tl->np, sizeof t->tl.np);
    t->tl.cpu_ovh = tl->cpu_ovh;
    t->fn = fn;
    t->arg = arg;
    t->parent = tl;
    t->next = l->threads;
    l->threads = t;
    kb_tl_wait_until(tl, kb_sim_now(tl->ctx->sim) + tl->cpu_ovh);
    t->tl.start = kb_sim_now(tl->ctx->sim);
    snprintf(fname, sizeof fname, "%s@sip%u/cube%u/pe%u+", l->name, tl->pe->gsip, tl->pe->cube,
             tl->pe->pe);
    kb_fiber *f = kb_fiber_spawn(tl->ctx->sim, thread_main, t, fname);
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
        t->joiner = kb_fiber_current(tl->ctx->sim);
        kb_fiber_block(tl->ctx->sim, "tl_join", t);
    }
}

/* args: one block per SIP of the grid when stride is sizeof(kb_kargs), one shared block when 0 */
static int launch_impl(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *args,
                       size_t stride, const kb_grid *grid)
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
    l->ntl = g.pes * g.cubes * g.sips;
    /* kb_tl is cache-line aligned */
    l->tls = aligned_alloc(64, (size_t)(l->ntl > 0 ? l->ntl : 1) * sizeof *l->tls);
    if (l->tls)
        memset(l->tls, 0, (size_t)(l->ntl > 0 ? l->ntl : 1) * sizeof *l->tls);
    l->cube_left = calloc((size_t)(g.cubes * g.sips), sizeof *l->cube_left);
    l->cube_tmax = calloc((size_t)(g.cubes * g.sips), sizeof *l->cube_tmax);
    l->sip_left = calloc((size_t)g.sips, sizeof *l->sip_left);
    l->sip_tmax = calloc((size_t)g.sips, sizeof *l->sip_tmax);
    l->next = ctx->launches;
    if (ctx->launches)
        ctx->launches->prev = l;
    ctx->launches = l;
    if (!l->tls || !l->args || !l->cube_left || !l->cube_tmax || !l->sip_left || !l->sip_tmax) {
        rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kb_signal_init(&l->done);
    l->sips_left = g.sips;

    kb_time now = kb_sim_now(ctx->sim), cpu_ovh = kb_time_from_ns(m->cfg.pe_cpu_overhead_ns);
    int k = 0;
    for (int s = 0; s < g.sips; s++) {
        unsigned gsip = (unsigned)(g.sip0 + s);
        kb_time t_io = kb_machine_cmd_host_to_iocpu(m, gsip, now, KB_CMD_BYTES);
        l->sip_left[s] = g.cubes;
        for (int c = 0; c < g.cubes; c++) {
            kb_time t_m = kb_machine_cmd_iocpu_to_mcpu(m, gsip, (unsigned)c, t_io, KB_CMD_BYTES);
            l->cube_left[s * g.cubes + c] = g.pes;
            for (int p = 0; p < g.pes; p++, k++) {
                kb_tl *tl = &l->tls[k];
                char fname[128];
                tl->tag = KB_TAG_KERNEL;
                tl->ctx = ctx;
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
                snprintf(fname, sizeof fname, "%s@sip%u/cube%d/pe%d", l->name, gsip, c, p);
                kb_fiber *f = kb_fiber_spawn(ctx->sim, kernel_main, tl, fname);
                if (!f) {
                    /* fibers already spawned reference l: stop the run; ctx frees l */
                    rc = kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory spawning kernel fibers");
                    kb_ctx_fail(ctx, rc);
                    kb_fiber_block(ctx->sim, "aborted run", NULL);
                    return rc;
                }
                kb_fiber_set_udata(f, tl);
            }
        }
    }
    kb_signal_wait(ctx->sim, &l->done);
    launch_free(l);
    return 0;
fail:
    launch_free(l);
    return rc;
}

int kb_launch(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *a,
              const kb_grid *grid)
{
    return launch_impl(ctx, name, kernel, a, 0, grid);
}

int kb_launch_per_sip(kb_ctx *ctx, const char *name, kb_kernel_fn kernel, const kb_kargs *args,
                      const kb_grid *grid)
{
    return launch_impl(ctx, name, kernel, args, sizeof(kb_kargs), grid);
}
