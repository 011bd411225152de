/*
 * kb_runtime — the simulation context (kb_runtime.h): its creation and destruction, the
 * Phase-2 backend, the op log and its flushes. Host writes and kernels append records to the
 * log; a flush replays the pending ones through the backend, and every kb_ctx_opts.cut_records
 * records the simulation pauses for a cut that hands a pipelined backend what it has so far.
 * An OpenCL backend is set up on a thread of its own while the simulation runs (joined by the
 * first flush or kb_ctx_backend_wait); a backend passed in kb_ctx_opts is used as is and left
 * alone. The runtime's other files: kb_runtime_host.c (host fibers: the host program, spawned
 * ranks, deadlock reports), kb_runtime_tensor.c (tensors, host writes and reads) and
 * kb_runtime_launch.c (kernel launches, forked threads); what they share with this one and
 * kb_tl.c is in host/private/kb_runtime_int.h. Limits: a context is used by one thread; until
 * it is joined, the set-up thread owns the backend and the device's description and note.
 */
#include "kb_runtime_int.h"

#include "kb_opencl.h"
#include "kb_progress.h"
#include "kb_psim.h"
#include "kb_remote.h"
#include "kb_resident.h"
#include "kb_trace.h"

#include <assert.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    ctx->threads = opts ? opts->threads : 0;
    ctx->net = opts ? opts->net : NULL;
    if (ctx->threads < 0 || ctx->threads > KB_CTX_MAX_THREADS) {
        rc = kb_err_set(eb, KB_ERR_USAGE, "%d Phase-1 threads: give 1 to %d (0: the sequential "
                        "engine)", ctx->threads, KB_CTX_MAX_THREADS);
        goto fail;
    }
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

void kb_ctx_destroy(kb_ctx *ctx)
{
    if (!ctx)
        return;
    for (int i = KB_EXT_NSLOTS; i-- > 0;)
        if (ctx->ext[i] && ctx->ext_destroy[i])
            ctx->ext_destroy[i](ctx->ext[i]);
    while (ctx->spawns)
        kb_ctx_spawn_free(ctx, ctx->spawns);
    while (ctx->launches) /* a failed run's launches, with the threads they forked */
        kb_launch_free(ctx->launches);
    for (size_t i = 0; i < ctx->ntensors; i++) {
        kb_tensor_fini(ctx->tensors[i]);
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
kb_time kb_ctx_now(kb_ctx *ctx) { return kb_sim_now(ctx->sim); }
kb_ctx_shape kb_ctx_machine_shape(const kb_ctx *ctx)
{
    kb_ctx_shape s = { ctx->m->nsips, ctx->m->ncubes, ctx->m->npes };
    return s;
}
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

int kb_ctx_set_ext_dist(kb_ctx *ctx, int slot, const kb_ext_dist *d)
{
    if (slot < 0 || slot >= KB_EXT_NSLOTS || (d && d->nmsg > KB_EXT_DIST_MSGS))
        return KB_ERR_INVAL;
    ctx->ext_dist[slot] = d ? *d : (kb_ext_dist){ 0 };
    return 0;
}

const struct kb_psim_net *kb_ctx_net(const kb_ctx *ctx) { return ctx->net; }

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

void kb_ctx_fail_in(kb_ctx *ctx, kb_sim *sim, int code, const char *fmt, ...)
{
    va_list ap;
    if (sim != ctx->sim) {
        /* a partition of a forked launch (on its own thread): its first failure stops it;
         * the launch's join picks the run's (kb_runtime_launch.c) */
        kb_launch_st *l = ctx->fork;
        int i = 0, n = kb_psim_parts(l->ps);
        assert(l && code != 0);
        while (i < n && kb_psim_part(l->ps, i) != sim)
            i++;
        assert(i < n);
        if (!l->perr[i].code) {
            l->perr[i].code = code;
            va_start(ap, fmt);
            vsnprintf(l->perr[i].eb.msg, sizeof l->perr[i].eb.msg, fmt, ap);
            va_end(ap);
        }
        kb_sim_stop(sim, code);
        return;
    }
    if (!ctx->failed) {
        va_start(ap, fmt);
        vsnprintf(ctx->err.msg, sizeof ctx->err.msg, fmt, ap);
        va_end(ap);
    }
    kb_ctx_fail(ctx, code);
}

int kb_ctx_post(kb_ctx *ctx, kb_sim *sim, unsigned from, unsigned to, kb_time t, kb_event_fn fn,
                void *a, void *b)
{
    if (ctx->fork)
        return kb_psim_post(ctx->fork->ps, (int)from, (int)to, t, fn, a, b);
    return kb_sim_at(sim, t, fn, a, b);
}

uint64_t kb_ctx_events(const kb_ctx *ctx) { return kb_sim_events(ctx->sim) + ctx->fork_events; }
uint64_t kb_ctx_switches(const kb_ctx *ctx)
{
    return kb_sim_switches(ctx->sim) + ctx->fork_switches;
}
void kb_ctx_fork_stats(const kb_ctx *ctx, int *threads, uint64_t *forked, uint64_t *windows)
{
    *threads = ctx->threads;
    *forked = ctx->forked;
    *windows = ctx->fork_windows;
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
        /* IPCQ names its copies "ipcq send E", "ipcq recv W" ... (kb_ipcq_send.c, _recv.c) */
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
    if (ctx->fork) /* a partition's: gathered after its window (kb_fork_record) */
        return kb_fork_record(ctx->fork, r);
    if (kb_oplog_append(ctx->log, r, &r->seq) != 0)
        return kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory appending to the op log");
    /* Pause the simulation after this step for a cut (kb_ctx_cut): a fixed record count, so the
     * cuts fall at the same places whatever the backend. */
    if (++ctx->since_cut >= ctx->cut_every && !ctx->cut_asked && !ctx->failed) {
        ctx->cut_asked = 1;
        kb_sim_stop(ctx->sim, KB_CTX_CUT_);
    }
    return 0;
}

int kb_ctx_log_gathered(kb_ctx *ctx, kb_rec *r)
{
    if (kb_oplog_append(ctx->log, r, &r->seq) != 0)
        return kb_err_set(&ctx->err, KB_ERR_NOMEM, "out of memory appending to the op log");
    /* every partition stands still: the cut is made here, not at a pause */
    if (++ctx->since_cut >= ctx->cut_every && !ctx->cut_asked)
        return kb_ctx_cut(ctx);
    return 0;
}

static int replay_pending(kb_ctx *ctx)
{
    int prev = kb_progress_set_phase(ctx->progress, KB_PROGRESS_REPLAY);
    /* the footprint known so far sizes the device arena's next block (kb_resident.h) */
    kb_backend_reserve(&ctx->be, ctx->tensor_bytes);
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

/* Not waiting for a backend still being set up: a later cut or read takes those records. */
int kb_ctx_cut(kb_ctx *ctx)
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
