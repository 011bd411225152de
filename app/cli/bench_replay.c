/*
 * bench-self, Phase 2. First, on an OpenCL device, the backend's set-up in fresh processes:
 * cold (the program built from source and stored in the program cache) and warm (loaded from
 * it), split into driver start, context and program. Then every shipped bench run end to end
 * on the device and on ref, each in a child process: wall time and where it goes on the device
 * (set-up, upload, replay, download, the rest: simulation and host checks) with each one's
 * share of the wall, and whether the digests agree. Last, replay throughput of the backend on
 * synthetic batches built directly in arena coordinates (no planner): grouped copies and
 * elementwise adds at several batch sizes (GB/s of bytes read + written), gemm at several
 * sizes (GFLOP/s), and launches per second. Each throughput measurement replays the same
 * batch `reps` times between one begin/end and subtracts an empty begin/end of the same
 * arena, so transfers are not counted. Children are forked before this process touches
 * OpenCL (drivers do not survive a fork).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kb_cli.h"
#include "kb_opencl.h"
#include "kb_runtime.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * Seconds of work for reps x run_batch. OpenCL backends report the device time of their
 * kernels (profiling events), which excludes transfers and launch latency; for the others the
 * wall time of begin + reps x run_batch + end minus an empty begin + end is used.
 */
static int time_batch(kb_backend *be, uint8_t *arena, uint64_t bytes, const kb_rec *recs,
                      size_t n, int reps, double *secs, kb_errbuf *eb)
{
    double t0, t1, t2, k0 = kb_opencl_kernel_ms(be);
    int rc;
    t0 = now_s();
    if ((rc = be->ops->begin(be->self, arena, bytes, NULL, 0, eb)) != 0 ||
        (rc = be->ops->end(be->self, arena, bytes, eb)) != 0)
        return rc;
    t1 = now_s();
    if ((rc = be->ops->begin(be->self, arena, bytes, NULL, 0, eb)) != 0)
        return rc;
    for (int r = 0; r < reps; r++)
        if ((rc = be->ops->run_batch(be->self, recs, n, eb)) != 0)
            return rc;
    if ((rc = be->ops->end(be->self, arena, bytes, eb)) != 0)
        return rc;
    t2 = now_s();
    double kms = kb_opencl_kernel_ms(be) - k0;
    *secs = kms > 0 ? kms / 1e3 : (t2 - t1) - (t1 - t0);
    if (*secs <= 0)
        *secs = t2 - t1; /* noise swamped the difference: report the whole flush */
    return 0;
}

/* ---- set-up and whole benches, in child processes ---- */

/* Runs fn(arg, out) in a child and copies its n-byte result back; 0, or -1 (out zeroed). */
static int in_child(void (*fn)(void *arg, void *out), void *arg, void *out, size_t n)
{
    int fd[2], rc = -1;
    memset(out, 0, n);
    fflush(stdout);
    fflush(stderr);
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char buf[1024];
        close(fd[0]);
        memset(buf, 0, sizeof buf);
        fn(arg, buf);
        (void)kbcl_write_all(fd[1], buf, n);
        _exit(0);
    }
    close(fd[1]);
    if (pid > 0) {
        size_t got = 0;
        while (got < n) {
            ssize_t r = read(fd[0], (unsigned char *)out + got, n - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        waitpid(pid, NULL, 0);
        rc = got == n ? 0 : -1;
    }
    close(fd[0]);
    return rc;
}

typedef struct setup_arg {
    kb_cl_want want;
    kb_cl_cache_mode mode;
} setup_arg;

typedef struct setup_out {
    int ok;
    kb_opencl_setup su;
} setup_out;

static void avail_child(void *arg, void *out)
{
    *(int *)out = kb_opencl_available(((const setup_arg *)arg)->want);
}

static void setup_child(void *arg, void *out)
{
    const setup_arg *a = arg;
    setup_out *o = out;
    kb_backend be;
    kb_errbuf eb;
    if (kb_opencl_backend_create_ex(a->want, a->mode, &be, NULL, 0, &eb) != 0)
        return;
    o->ok = kb_opencl_setup_of(&be, &o->su) == 0;
    be.ops->destroy(be.self);
}

typedef struct bench_arg {
    const char *device;
    const char *bench, *algorithm, *world_size, *n_elem;
} bench_arg;

typedef struct bench_out {
    int ok, verified, program_cache;
    uint64_t digest, upload_bytes, download_bytes;
    double wall_ms, phase1_ms, setup_ms, setup_wait_ms, upload_ms, replay_ms, download_ms,
        kernel_ms;
} bench_out;

static void bench_child(void *arg, void *out)
{
    const bench_arg *a = arg;
    bench_out *o = out;
    kbcl_job job;
    kbcl_result res;
    kb_errbuf eb;
    memset(&job, 0, sizeof job);
    job.bench = a->bench;
    job.algorithm = a->algorithm;
    job.world_size = a->world_size;
    job.n_elem = a->n_elem;
    job.device = a->device;
    job.verify = 1;
    if (kbcl_job_run(&job, &res, &eb) == 0) {
        const kb_run_report *r = &res.rep;
        o->ok = 1;
        o->verified = r->res.verified;
        o->digest = r->res.have_digest ? r->res.digest : 0;
        o->program_cache = r->program_cache;
        o->wall_ms = r->wall_ms;
        o->phase1_ms = r->phase1_ms;
        o->setup_ms = r->setup_ms;
        o->setup_wait_ms = r->setup_wait_ms;
        o->upload_ms = r->xfer.upload_ms;
        o->upload_bytes = r->xfer.upload_bytes;
        o->download_ms = r->xfer.download_ms;
        o->download_bytes = r->xfer.download_bytes;
        o->replay_ms = r->replay.ms - r->xfer.upload_ms; /* uploads happen inside flushes */
        o->kernel_ms = r->kernel_ms;
    }
    kbcl_result_fini(&res);
}

static double pct(double part, double whole)
{
    return whole > 0 ? 100.0 * part / whole : 0.0;
}

/*
 * The set-up rows (OpenCL devices) and the per-bench rows, printed and added to p2
 * ("setup", "benches").
 */
static void phase2_runs(int dev, cJSON *p2)
{
    static const bench_arg benches[] = {
        { NULL, "gemm", NULL, NULL, NULL },
        { NULL, "va_offset", NULL, NULL, NULL },
        { NULL, "gpt3_qkv", NULL, NULL, NULL },
        { NULL, "tp_mlp", NULL, NULL, NULL },
        { NULL, "tp_attention", NULL, NULL, NULL },
        { NULL, "ccl_allreduce", "ring_allreduce_tcm", "256", "8" },     /* make run */
        { NULL, "ccl_allreduce", "ring_rsag_allreduce", "256", "4096" },
    };
    const char *devname = kb_device_name((kb_device_kind)dev);
    int ocl = dev == KB_DEV_GPU || dev == KB_DEV_CPU || dev == KB_DEV_AUTO;

    if (ocl) {
        setup_arg sa = { dev == KB_DEV_GPU ? KB_CL_GPU : dev == KB_DEV_CPU ? KB_CL_CPU : KB_CL_ANY,
                         KB_CL_CACHE_REFRESH };
        setup_out cold, warm;
        int avail = 0;
        /* no such device: nothing to measure (the caller reports the device error) */
        if (dev != KB_DEV_AUTO && (in_child(avail_child, &sa, &avail, sizeof avail) != 0 ||
                                   !avail))
            return;
        cJSON *o = cJSON_CreateObject();
        in_child(setup_child, &sa, &cold, sizeof cold);
        sa.mode = KB_CL_CACHE_USE;
        in_child(setup_child, &sa, &warm, sizeof warm);
        printf("  set-up (fresh process)   %9s %9s %9s %9s  program cache\n", "total ms",
               "driver", "context", "program");
        const setup_out *rows[2] = { &cold, &warm };
        for (int i = 0; i < 2; i++) {
            const kb_opencl_setup *u = &rows[i]->su;
            cJSON *j = cJSON_CreateObject();
            if (!rows[i]->ok) {
                printf("  %-24s   failed\n", i ? "warm" : "cold");
                cJSON_Delete(j);
                continue;
            }
            printf("  %-24s %9.1f %9.1f %9.1f %9.1f  %s\n",
                   i ? "warm (cache)" : "cold (source build)", u->total_ms, u->discover_ms,
                   u->context_ms, u->program_ms, kb_cl_cache_state_name(u->cache));
            cJSON_AddNumberToObject(j, "total_ms", u->total_ms);
            cJSON_AddNumberToObject(j, "driver_ms", u->discover_ms);
            cJSON_AddNumberToObject(j, "context_ms", u->context_ms);
            cJSON_AddNumberToObject(j, "program_ms", u->program_ms);
            cJSON_AddStringToObject(j, "program_cache", kb_cl_cache_state_name(u->cache));
            cJSON_AddNumberToObject(j, "binary_bytes", (double)u->binary_bytes);
            cJSON_AddItemToObject(o, i ? "warm" : "cold", j);
        }
        cJSON_AddItemToObject(p2, "setup", o);
    }
    printf("  %-44s %9s %9s %6s | %s\n", "bench (verified; warm cache)", "ref ms", "wall ms",
           "x ref", "set-up waited / upload / replay / download / rest: ms (share of wall)");
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++) {
        bench_arg a = benches[i], r = benches[i];
        bench_out od, orf;
        char name[64];
        a.device = devname;
        r.device = "ref";
        if (a.algorithm)
            snprintf(name, sizeof name, "%s %s ws%s n%s", a.bench, a.algorithm, a.world_size,
                     a.n_elem);
        else
            snprintf(name, sizeof name, "%s", a.bench);
        in_child(bench_child, &r, &orf, sizeof orf);
        in_child(bench_child, &a, &od, sizeof od);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "bench", name);
        cJSON_AddBoolToObject(j, "ok", od.ok && orf.ok);
        if (!od.ok || !orf.ok) {
            printf("  %-44s   failed\n", name);
            cJSON_AddItemToArray(arr, j);
            continue;
        }
        /* the set-up runs beside the simulation: only what the run waited for counts */
        double rest = od.wall_ms - od.setup_wait_ms - od.upload_ms - od.replay_ms -
                      od.download_ms;
        int same = od.digest == orf.digest && od.verified == orf.verified;
        printf("  %-44s %9.1f %9.1f %6.2f | %.1f (%.0f%%) / %.1f (%.0f%%) / %.1f (%.0f%%) / "
               "%.1f (%.0f%%) / %.1f (%.0f%%)%s\n",
               name, orf.wall_ms, od.wall_ms, orf.wall_ms > 0 ? od.wall_ms / orf.wall_ms : 0.0,
               od.setup_wait_ms, pct(od.setup_wait_ms, od.wall_ms), od.upload_ms,
               pct(od.upload_ms, od.wall_ms), od.replay_ms, pct(od.replay_ms, od.wall_ms),
               od.download_ms, pct(od.download_ms, od.wall_ms), rest, pct(rest, od.wall_ms),
               same ? "" : "  DIGEST DIFFERS");
        cJSON_AddNumberToObject(j, "ref_wall_ms", orf.wall_ms);
        cJSON_AddNumberToObject(j, "wall_ms", od.wall_ms);
        cJSON_AddNumberToObject(j, "phase1_ms", od.phase1_ms);
        cJSON_AddNumberToObject(j, "setup_ms", od.setup_ms);
        cJSON_AddNumberToObject(j, "setup_wait_ms", od.setup_wait_ms);
        if (od.program_cache >= 0)
            cJSON_AddStringToObject(j, "program_cache",
                                    kb_cl_cache_state_name((kb_cl_cache_state)od.program_cache));
        cJSON_AddNumberToObject(j, "upload_ms", od.upload_ms);
        cJSON_AddNumberToObject(j, "upload_bytes", (double)od.upload_bytes);
        cJSON_AddNumberToObject(j, "replay_ms", od.replay_ms);
        cJSON_AddNumberToObject(j, "kernel_ms", od.kernel_ms);
        cJSON_AddNumberToObject(j, "download_ms", od.download_ms);
        cJSON_AddNumberToObject(j, "download_bytes", (double)od.download_bytes);
        cJSON_AddNumberToObject(j, "rest_ms", rest);
        cJSON_AddBoolToObject(j, "digest_matches_ref", same);
        cJSON_AddItemToArray(arr, j);
    }
    cJSON_AddItemToObject(p2, "benches", arr);
}

static cJSON *row(const char *what, double batch, double size, double value, const char *unit,
                  double launches_per_s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "op", what);
    cJSON_AddNumberToObject(o, "records_per_batch", batch);
    cJSON_AddNumberToObject(o, "size", size);
    cJSON_AddNumberToObject(o, unit, value);
    if (launches_per_s >= 0)
        cJSON_AddNumberToObject(o, "launches_per_s", launches_per_s);
    return o;
}

int kbcl_bench_phase2(const char *device, int quick, cJSON **out, kb_errbuf *eb)
{
    kb_backend be = { NULL, NULL };
    char desc[160], note[256];
    int dev = kb_device_from_name(device), rc = 0;
    cJSON *p2 = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    uint8_t *arena = NULL;
    kb_rec *recs = NULL;

    *out = NULL;
    if (dev < 0 || dev == KB_DEV_NONE) {
        cJSON_Delete(p2);
        cJSON_Delete(rows);
        return kb_err_set(eb, KB_ERR_USAGE, "bench-self --device %s: use ref, cpu, gpu or auto",
                          device);
    }
    printf("Phase 2 (%s)\n", kb_device_name((kb_device_kind)dev));
    phase2_runs(dev, p2); /* children first: this process has not touched OpenCL */
    if ((rc = kb_backend_for_device((kb_device_kind)dev, &be, desc, sizeof desc, note,
                                    sizeof note, eb)) != 0) {
        cJSON_Delete(p2);
        cJSON_Delete(rows);
        return rc;
    }
    if (note[0])
        fprintf(stderr, "kbcl: %s\n", note);
    printf("  replay throughput on %s\n", desc);
    cJSON_AddStringToObject(p2, "device", desc);
    int slow = dev == KB_DEV_REF;
    /* ---- copies and adds: total bytes fixed, records per batch varied ---- */
    const uint64_t total = quick ? (16u << 20) : (slow ? (64u << 20) : (256u << 20));
    static const size_t batches[] = { 1, 64, 4096 };
    arena = malloc(total * 3);
    recs = malloc(sizeof *recs * 4096);
    if (!arena || !recs) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    memset(arena, 0, total * 3);
    printf("  %-10s %10s %12s %12s %14s\n", "op", "records", "bytes each", "GB/s", "launches/s");
    for (int kind = 0; kind < 2; kind++) {
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            size_t n = batches[bi];
            uint64_t each = total / n / 2 * 2, elems = each / 2;
            for (size_t i = 0; i < n; i++) {
                kb_rec *r = &recs[i];
                memset(r, 0, sizeof *r);
                r->kind = kind ? KB_REC_MATH2 : KB_REC_COPY;
                r->op = KB_M2_ADD;
                r->nsrc = kind ? 2 : 1;
                r->dst = kb_opnd_make(total + i * each, 1, (uint32_t)elems, KB_F16);
                r->src[0] = kb_opnd_make(i * each, 1, (uint32_t)elems, KB_F16);
                r->src[1] = kb_opnd_make(2 * total + i * each, 1, (uint32_t)elems, KB_F16);
            }
            int reps = slow ? 2 : 10;
            double secs;
            if ((rc = time_batch(&be, arena, total * 3, recs, n, reps, &secs, eb)) != 0)
                goto out;
            double moved = (double)reps * (double)n * (double)each * (kind ? 3.0 : 2.0);
            double gbs = moved / secs / 1e9, lps = reps / secs;
            printf("  %-10s %10zu %12llu %12.1f %14.0f\n", kind ? "add f16" : "copy f16", n,
                   (unsigned long long)each, gbs, lps);
            cJSON_AddItemToArray(rows, row(kind ? "add_f16" : "copy_f16", (double)n,
                                           (double)each, gbs, "gb_per_s", lps));
        }
    }
    free(arena);
    arena = NULL;
    /* ---- gemm ---- */
    static const uint32_t fast_sizes[] = { 1024, 4096 }, slow_sizes[] = { 256, 512 };
    const uint32_t *sizes = slow ? slow_sizes : fast_sizes;
    size_t nsizes = quick ? 1 : 2;
    printf("  %-10s %10s %12s %12s\n", "gemm", "M=N=K", "", "GFLOP/s");
    for (size_t si = 0; si < nsizes; si++) {
        uint32_t s = sizes[si];
        uint64_t a = (uint64_t)s * s * 2, c = (uint64_t)s * s * 4;
        arena = malloc(2 * a + c);
        if (!arena) {
            rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
            goto out;
        }
        for (uint64_t i = 0; i < 2 * a / 2; i++)
            ((uint16_t *)arena)[i] = kb_f32_to_f16((float)((int)(i % 7) - 3) / 8.0f);
        kb_rec *r = &recs[0];
        memset(r, 0, sizeof *r);
        r->kind = KB_REC_GEMM;
        r->nsrc = 2;
        r->dst = kb_opnd_make(2 * a, s, s, KB_F32);
        r->src[0] = kb_opnd_make(0, s, s, KB_F16);
        r->src[1] = kb_opnd_make(a, s, s, KB_F16);
        int reps = slow ? 1 : 5;
        double secs;
        if ((rc = time_batch(&be, arena, 2 * a + c, recs, 1, reps, &secs, eb)) != 0)
            goto out;
        double gf = 2.0 * s * s * (double)s * reps / secs / 1e9;
        printf("  %-10s %10u %12s %12.1f\n", "gemm f16", s, "", gf);
        cJSON_AddItemToArray(rows, row("gemm_f16", 1, s, gf, "gflop_per_s", -1));
        free(arena);
        arena = NULL;
    }
    cJSON_AddItemToObject(p2, "replay", rows);
    rows = NULL;
    *out = p2;
    p2 = NULL;
out:
    free(arena);
    free(recs);
    cJSON_Delete(rows);
    cJSON_Delete(p2);
    if (be.ops)
        be.ops->destroy(be.self);
    return rc;
}
