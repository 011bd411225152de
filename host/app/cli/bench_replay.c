/*
 * bench-self, Phase 2: replay throughput of one device's backend on synthetic batches built
 * directly in arena coordinates (no planner): grouped copies and elementwise adds at several
 * batch sizes (GB/s of bytes read + written), gemm at several sizes (GFLOP/s), and launches per
 * second. Each measurement replays the same batch `reps` times between one begin/end and
 * subtracts an empty begin/end of the same arena, so arena upload/download are not counted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    if ((rc = kb_backend_for_device((kb_device_kind)dev, &be, desc, sizeof desc, note,
                                    sizeof note, eb)) != 0) {
        cJSON_Delete(p2);
        cJSON_Delete(rows);
        return rc;
    }
    if (note[0])
        fprintf(stderr, "kbcl: %s\n", note);
    printf("Phase 2 (replay on %s)\n", desc);
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
