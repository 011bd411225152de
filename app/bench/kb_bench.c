/*
 * kb_bench — the bench registry and runner (kb_bench.h). The runner owns the context for one
 * run: it is created, used for the host program and the verification, and destroyed here.
 */
#include "kb_bench.h"

#include "kb_hostgemm.h"
#include "kb_opencl.h"
#include "kb_progress.h"
#include "kb_seedgen.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static const kb_bench *const registry[] = {
    &kb_bench_gemm,
    &kb_bench_va_offset,
    &kb_bench_gpt3_qkv,
    &kb_bench_ccl,
    &kb_bench_ccl_allreduce,
    &kb_bench_ipcq_deadlock,
    &kb_bench_tp_mlp,
    &kb_bench_tp_attention,
    &kb_bench_decoder_layer,
};

int kb_bench_takes_model(const kb_bench *b) { return b == &kb_bench_decoder_layer; }

int kb_bench_takes_collective(const kb_bench *b)
{
    return b != &kb_bench_gemm && b != &kb_bench_va_offset && b != &kb_bench_gpt3_qkv &&
           b != &kb_bench_ipcq_deadlock;
}

const kb_bench *kb_bench_at(int i)
{
    if (i < 0 || (size_t)i >= sizeof registry / sizeof registry[0])
        return NULL;
    return registry[i];
}

const kb_bench *kb_bench_find(const char *name)
{
    for (int i = 0; kb_bench_at(i); i++)
        if (strcmp(kb_bench_at(i)->name, name) == 0)
            return kb_bench_at(i);
    return NULL;
}

int kb_bench_param_index(const kb_bench *b, const char *name)
{
    for (int i = 0; i < b->nparams; i++)
        if (strcmp(b->params[i].name, name) == 0)
            return i;
    return -1;
}

int kb_bench_param_parse(const kb_bench *b, int idx, const char *s, int64_t *out)
{
    char *end;
    const char *const *names = b->param_names[idx];
    errno = 0;
    long long v = strtoll(s, &end, 0); /* decimal, or 0x hexadecimal as C writes it */
    if (!*end && errno == 0 && end != s) {
        *out = v;
        return 0;
    }
    for (int64_t k = 0; names && names[k]; k++)
        if (!strcmp(names[k], s)) {
            *out = k;
            return 0;
        }
    return -1;
}

const char *kb_bench_param_names(const kb_bench *b, int idx, char *buf, size_t cap)
{
    const char *const *names = b->param_names[idx];
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; names && names[k] && len < cap; k++) {
        int w = snprintf(buf + len, cap - len, "%s%s (%d)", k ? ", " : "", names[k], k);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    return buf;
}

void kb_run_report_fini(kb_run_report *rep)
{
    free(rep->report);
    rep->report = NULL;
}

uint64_t kb_fnv1a64(const void *data, size_t n, uint64_t h)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

void kb_bench_add_extra(kb_bench_result *r, const char *name, double value)
{
    if (r->nextras < KB_BENCH_MAX_EXTRAS) {
        r->extras[r->nextras].name = name;
        r->extras[r->nextras].value = value;
        r->nextras++;
    }
}

/* How many per-rank counts one size covers: ws for the kinds whose nccl-tests size is the
 * whole ws-rank buffer, else 1 (kb_bench_coll_size); 0 for what has no size. */
static int64_t coll_ranks_in_size(kb_coll_kind k, int ws)
{
    if (ws < 1)
        return 0;
    switch (k) {
    case KB_COLL_ALLREDUCE:
    case KB_COLL_BROADCAST:
    case KB_COLL_REDUCE:
    case KB_COLL_SENDRECV:
        return 1;
    case KB_COLL_ALLGATHER:
    case KB_COLL_REDUCE_SCATTER:
    case KB_COLL_ALLTOALL:
        return ws;
    default:
        return 0;
    }
}

uint64_t kb_bench_coll_size(kb_coll_kind k, int ws, int64_t count, int elem_bytes)
{
    if (count < 0 || elem_bytes < 1)
        return 0;
    return (uint64_t)coll_ranks_in_size(k, ws) * (uint64_t)count * (uint64_t)elem_bytes;
}

int kb_bench_coll_count(kb_coll_kind k, int ws, int64_t size_bytes, int elem_bytes,
                        int64_t *count)
{
    int64_t per = coll_ranks_in_size(k, ws) * (int64_t)elem_bytes;
    if (per < 1 || size_bytes < 1 || size_bytes % per)
        return -1;
    *count = size_bytes / per;
    return 0;
}

/*
 * The busiest resource and the bound of a region: every resource's busy time (kb_res.busy, the
 * occupancy of its reservations) and bytes at the start, compared at the end. Resources that
 * kb_machine_each_res visits one after the other with the same kind and place are one unit
 * (a DMA engine's channels): their busy times and bytes add, and so do their bandwidths.
 */
typedef struct busy_mark_s {
    kb_time busy;
    uint64_t bytes;
} busy_mark_s;

typedef struct busy_walk {
    busy_mark_s *mark;
    size_t i;
    /* the unit being summed */
    const char *kind;
    char where[64];
    int n;
    kb_time busy;
    uint64_t bytes, bpu;
    /* results */
    kb_time best, bound;
    kb_bench_result *r;
} busy_walk;

static void busy_count(void *ud, const kb_res *r, const char *where)
{
    (void)r, (void)where;
    ((busy_walk *)ud)->i++;
}

static void busy_store(void *ud, const kb_res *r, const char *where)
{
    busy_walk *w = ud;
    (void)where;
    w->mark[w->i].busy = r->busy;
    w->mark[w->i++].bytes = r->bytes;
}

/* Closes the unit being summed: its busy time (per server) and its bound, min(bytes over its
 * bandwidth, busy time): transfers' fixed costs are not the machine's limit, and a compute
 * unit running a faster number format than its bandwidth states is bounded by its time. */
static void busy_flush(busy_walk *w)
{
    if (!w->n)
        return;
    kb_time busy = w->busy / w->n;
    kb_time bnd = w->bpu ? kb_bw_time(w->bpu, w->bytes) : 0;
    if (bnd > busy)
        bnd = busy;
    if (busy > w->best) { /* the first of equals, in the machine's order */
        w->best = busy;
        snprintf(w->r->busiest, sizeof w->r->busiest, "%s %s", w->kind, w->where);
    }
    if (bnd > w->bound) {
        w->bound = bnd;
        snprintf(w->r->bound_resource, sizeof w->r->bound_resource, "%s %s", w->kind, w->where);
    }
    w->n = 0;
}

static void busy_compare(void *ud, const kb_res *r, const char *where)
{
    busy_walk *w = ud;
    const busy_mark_s *m = &w->mark[w->i++];
    if (!w->n || strcmp(r->name, w->kind) || strcmp(where, w->where)) {
        busy_flush(w);
        w->kind = r->name;
        snprintf(w->where, sizeof w->where, "%s", where);
        w->busy = 0;
        w->bytes = 0;
        w->bpu = 0;
    }
    w->n++;
    w->busy += r->busy - m->busy;
    w->bytes += r->bytes - m->bytes;
    w->bpu += r->bytes_per_us;
}

void kb_bench_mark_begin(kb_ctx *ctx, kb_bench_result *r)
{
    const kb_machine *m = kb_ctx_machine(ctx);
    busy_walk w = { 0 };
    r->t_begin = kb_sim_now(kb_ctx_sim(ctx));
    free(r->busy_mark);
    kb_machine_each_res(m, busy_count, &w);
    /* no memory for the snapshot: no busiest resource or bound, the run itself is unaffected */
    if ((r->busy_mark = malloc((w.i ? w.i : 1) * sizeof(busy_mark_s))) != NULL) {
        w.mark = r->busy_mark;
        w.i = 0;
        kb_machine_each_res(m, busy_store, &w);
    }
}

void kb_bench_mark_end(kb_ctx *ctx, kb_bench_result *r)
{
    r->t_end = kb_sim_now(kb_ctx_sim(ctx));
    r->busiest[0] = r->bound_resource[0] = '\0';
    r->busiest_frac = 0.0;
    r->bound_ns = 0.0;
    if (!r->busy_mark)
        return;
    busy_walk w = { 0 };
    w.mark = r->busy_mark;
    w.r = r;
    kb_machine_each_res(kb_ctx_machine(ctx), busy_compare, &w);
    busy_flush(&w);
    kb_time span = r->t_end - r->t_begin;
    r->busiest_frac = span > 0 && w.best > 0 ? (double)w.best / (double)span : 0.0;
    if (w.best == 0)
        r->busiest[0] = '\0';
    /* every reservation made in the region starts in it and ends before the kernels that
     * wait for it, so no resource's share can outlast the region (test_bench checks it) */
    r->bound_ns = kb_time_to_ns(w.bound);
    if (w.bound == 0)
        r->bound_resource[0] = '\0';
    free(r->busy_mark);
    r->busy_mark = NULL;
}

double kb_bench_efficiency(const kb_bench_result *r)
{
    double span = kb_time_to_ns(r->t_end - r->t_begin);
    return span > 0.0 && r->bound_ns > 0.0 ? r->bound_ns / span : 0.0;
}

double kb_bench_roofline_efficiency(const kb_bench_result *r)
{
    return r->have_roofline ? kb_roofline_efficiency(&r->roofline,
                                                     kb_time_to_ns(r->t_end - r->t_begin))
                            : 0.0;
}

void kb_bench_set_roofline(kb_bench_result *r, const kb_roofline *rl)
{
    r->roofline = *rl;
    r->have_roofline = 1;
}

int kb_bench_check_from(kb_bench_result *r, kb_dtype dt, const float *got, const double *ref,
                        const double *acc_bound, size_t n, size_t index0, const char *what)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double ulp = dt == KB_F32 ? ldexp(fabs(ref[i]) > 0 ? 1.0 : 0.0, ilogb(ref[i]) - 23)
                                  : (double)kb_f16_ulp((float)ref[i]);
        if (dt == KB_BF16)
            ulp = (double)kb_f16_ulp((float)ref[i]) * 8.0; /* bf16 has 3 fewer mantissa bits */
        double bound = 0.5 * ulp + (acc_bound ? acc_bound[i] : 0.0);
        double err = fabs((double)got[i] - ref[i]);
        /* the worst error wins; a NaN error sticks */
        if (!r->have_err || (!isnan(r->max_abs_err) && !(err <= r->max_abs_err))) {
            r->max_abs_err = err;
            r->err_bound = bound;
            r->have_err = 1;
        }
        if (!(err <= bound)) { /* NaN fails too */
            if (ok)
                snprintf(r->detail, sizeof r->detail,
                         "%s[%zu] = %.9g, expected %.9g (|err| %.3g > bound %.3g)", what,
                         index0 + i, (double)got[i], ref[i], err, bound);
            ok = 0;
        }
    }
    return ok;
}

int kb_bench_check(kb_bench_result *r, kb_dtype dt, const float *got, const double *ref,
                   const double *acc_bound, size_t n, const char *what)
{
    return kb_bench_check_from(r, dt, got, ref, acc_bound, n, 0, what);
}

typedef struct runner {
    const kb_bench *b;
    const kb_bench_args *a;
    void *state;
    kb_bench_result *res;
} runner;

static int host_program(kb_ctx *ctx, void *arg)
{
    runner *r = arg;
    r->res->t_begin = kb_sim_now(kb_ctx_sim(ctx));
    r->res->t_end = -1;
    int rc = r->b->run(ctx, r->a, r->state, r->res);
    if (r->res->t_end < 0)
        r->res->t_end = kb_sim_now(kb_ctx_sim(ctx));
    return rc;
}

static double wall_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int kb_bench_execute(const kb_config *cfg, const kb_ccl_cfg *ccl, const kb_ctx_opts *opts,
                     const kb_bench *b,
                     const kb_bench_args *a, kb_run_report *rep, kb_errbuf *eb)
{
    kb_ctx *ctx = NULL;
    void *state = NULL;
    double w0 = wall_now_ms();
    int rc;

    memset(rep, 0, sizeof *rep);
    rep->res.verified = -1;
    rep->program_cache = -1;
    if ((rc = kb_ctx_create(cfg, opts, &ctx, eb)) != 0)
        return rc;
    /* A backend kept across runs: its set-up was paid before, its counters started before
     * (an own backend, still being set up in the background, starts from zero). */
    kb_opencl_setup su;
    kb_xfer_stats x0;
    double k0 = 0.0;
    memset(&x0, 0, sizeof x0);
    if (kb_ctx_backend_borrowed(ctx)) {
        k0 = kb_opencl_kernel_ms(kb_ctx_backend(ctx));
        kb_backend_xfer_stats(kb_ctx_backend(ctx), &x0);
    }
    if (ccl && (rc = kb_ccl_config_attach(ctx, ccl)) != 0) {
        kb_err_set(eb, rc, "%s", kb_ctx_errmsg(ctx));
        goto out;
    }
    state = calloc(1, b->state_size ? b->state_size : 1);
    if (!state) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    runner r = { b, a, state, &rep->res };
    double p0 = wall_now_ms();
    rc = kb_ctx_run_host(ctx, host_program, &r);
    rep->phase1_ms = wall_now_ms() - p0;
    if (rc) {
        kb_err_set(eb, rc, "%s", kb_ctx_errmsg(ctx));
        if (kb_ctx_report(ctx))
            rep->report = strdup(kb_ctx_report(ctx));
        goto out;
    }
    /* the background set-up (if the simulation did not need it yet): errors, figures */
    if ((rc = kb_ctx_backend_wait(ctx)) != 0) {
        kb_err_set(eb, rc, "%s", kb_ctx_errmsg(ctx));
        goto out;
    }
    snprintf(rep->device_desc, sizeof rep->device_desc, "%s", kb_ctx_device_desc(ctx));
    snprintf(rep->device_note, sizeof rep->device_note, "%s", kb_ctx_device_note(ctx));
    if (kb_opencl_setup_of(kb_ctx_backend(ctx), &su) == 0) {
        rep->setup_ms = kb_ctx_backend_borrowed(ctx) ? 0.0 : su.total_ms;
        rep->program_cache = (int)su.cache;
    }
    rep->sim_time_ns = kb_time_to_ns(rep->res.t_end - rep->res.t_begin);
    rep->sim_end_ns = kb_time_to_ns(kb_sim_now(kb_ctx_sim(ctx)));
    rep->events = kb_ctx_events(ctx);
    rep->switches = kb_ctx_switches(ctx);
    kb_ctx_fork_stats(ctx, &rep->threads, &rep->forked_launches, &rep->windows);
    rep->kernels = kb_ctx_kernels_run(ctx);
    if (a->verify && kb_ctx_recording(ctx) && b->verify) {
        kb_progress_set_phase(opts ? opts->progress : NULL, KB_PROGRESS_VERIFY);
        rc = b->verify(ctx, a, state, &rep->res);
        if (rc) {
            kb_err_set(eb, rc, "%s", kb_ctx_errmsg(ctx));
            goto out;
        }
    }
    /* what a pipelined backend was handed during the run has finished, or failed the run */
    if ((rc = kb_ctx_sync(ctx)) != 0) {
        kb_err_set(eb, rc, "%s", kb_ctx_errmsg(ctx));
        goto out;
    }
    rep->records = kb_oplog_count(kb_ctx_oplog(ctx));
    rep->memstore_pages = kb_memstore_pages(kb_ctx_memstore(ctx));
    rep->payload_bytes = kb_oplog_payload_size(kb_ctx_oplog(ctx));
    rep->replay = *kb_ctx_replay_stats(ctx);
    kb_backend_xfer_stats(kb_ctx_backend(ctx), &rep->xfer);
    rep->xfer.uploads -= x0.uploads;
    rep->xfer.upload_bytes -= x0.upload_bytes;
    rep->xfer.downloads -= x0.downloads;
    rep->xfer.download_bytes -= x0.download_bytes;
    rep->xfer.fills -= x0.fills;
    rep->xfer.fill_bytes -= x0.fill_bytes;
    rep->xfer.moves -= x0.moves;
    rep->xfer.move_bytes -= x0.move_bytes;
    rep->xfer.upload_ms -= x0.upload_ms;
    rep->xfer.download_ms -= x0.download_ms;
    rep->kernel_ms = kb_opencl_kernel_ms(kb_ctx_backend(ctx)) - k0;
    rep->setup_wait_ms = kb_ctx_backend_wait_ms(ctx);
out:
    free(rep->res.busy_mark); /* a run that stopped between mark_begin and mark_end */
    rep->res.busy_mark = NULL;
    if (state && b->cleanup)
        b->cleanup(state);
    free(state);
    kb_ctx_destroy(ctx);
    rep->wall_ms = wall_now_ms() - w0;
    return rc;
}

float kb_bench_pattern_at(size_t i, uint32_t seed, int range, float den)
{
    return (float)kb_seedgen_pattern(i, seed, (uint32_t)range) / den;
}

void kb_bench_pattern(float *x, size_t n, uint32_t seed, int range, float den)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kb_bench_pattern_at(i, seed, range, den);
}

static void pattern_block(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols,
                          float *out)
{
    const kb_bench_pat *p = ud;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int64_t i = p->transpose ? (col + c) * p->ld + row + r : (row + r) * p->ld + col + c;
            out[r * cols + c] = kb_bench_pattern_at((size_t)i, p->seed, p->range, p->den);
        }
}

kb_fill kb_bench_pattern_fill(kb_bench_pat *p)
{
    kb_fill f = { pattern_block, p, NULL, 0, 0, 0, NULL };
    /* made where it replays when every backend gives the same values (kb_fill_gen) */
    if (p->range >= 0 && p->ld >= 0 &&
        kb_seedgen_pattern_ok((uint32_t)p->range, 1.0f / p->den, 0.0f)) {
        p->gen = (kb_fill_gen){ .seed = p->seed, .kind = KB_FILL_GEN_PATTERN,
                                .transpose = p->transpose != 0, .range = (uint32_t)p->range,
                                .den = p->den, .add = 0.0f, .ld = p->ld };
        f.gen = &p->gen;
    }
    return f;
}

void kb_bench_ref_gemm(const float *a, const float *b, size_t M, size_t N, size_t K, double *ref,
                       double *bound)
{
    /* the blocked product; without memory for its buffers, the plain loop (same values) */
    if (kb_hostgemm_ref(a, b, M, N, K, ref, bound) == 0)
        return;
    for (size_t i = 0; i < M; i++) {
        for (size_t j = 0; j < N; j++) {
            double s = 0.0, sa = 0.0;
            for (size_t k = 0; k < K; k++) {
                double p = (double)a[i * K + k] * (double)b[k * N + j];
                s += p;
                sa += fabs(p);
            }
            ref[i * N + j] = s;
            bound[i * N + j] = (double)K * ldexp(1.0, -24) * sa;
        }
    }
}
