/*
 * kb_opencl — the OpenCL backend of the Phase-2 replay, and OpenCL device discovery.
 *
 * A backend owns one context, in-order queue, program and kernel set on one device, and its
 * device-resident memory (kb_resident.h): a resident arena and payload buffer that persist
 * across flushes, moved only by kb_resident's primitives (clEnqueueCopyBuffer for growth and
 * merges, clEnqueueFillBuffer for poison, blocking writes and reads for uploads and pulls),
 * plus a buffer for the argument tables. A resident flush's begin() only points the launches
 * at those buffers; run_batch() only appends one kb_clent per record to a host table and one
 * launch per kind group (the planner sorts a batch by kind), so it costs no driver calls;
 * end() uploads all tables of the flush in one write, enqueues every launch in batch order
 * (the in-order queue keeps dependent batches apart) and waits once. Called with a host arena
 * (bench-self's synthetic batches), begin() uploads it and the payload into buffers of their
 * own and end() reads it back. Kernels are built once per backend from the embedded
 * cl/kb_mathfn.h + cl/replay.cl with fixed local sizes and FP_CONTRACT OFF, and with correctly
 * rounded division and sqrt when the device offers it, so results match kb_ref.c bit for bit;
 * the built program is kept in kbcl's program cache (kb_clcache.h) and loaded from there by
 * later backends on the same device and driver. Every launch carries a profiling event, so the
 * device time of the replay is known (kb_opencl_kernel_ms), and the set-up is timed
 * (kb_opencl_setup_of). Before the first OpenCL call, POCL_CACHE_DIR is pointed at a writable
 * cache directory when it is unset (PoCL caches compiled kernels there). Limits:
 * little-endian devices; one device per backend; a device without correctly rounded
 * division/sqrt or without f32 denormals still runs, but may differ from ref in the last bit.
 */
#include "kb_opencl.h"
#include "kb_progress.h"
#include "kb_remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KBCL_HAVE_OPENCL

#include <errno.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <CL/cl.h>

#include "kb_clcache.h"
#include "kb_mathfn.h"
#include "kb_resident.h"
#include "kb_opencl_src.h" /* generated: kb_opencl_src[], the NUL-terminated program text */

/* Work sizes; passed to the program as -D so host and kernels agree. */
#define EW_LOCAL 256u
#ifndef KB_EW_PER
#define KB_EW_PER 8
#endif
#define EW_PER ((unsigned)KB_EW_PER)
#define EW_CHUNK (EW_LOCAL * EW_PER)
#define LN_LOCAL 64u
#ifndef KB_GEMM_TM
#define KB_GEMM_TM 128
#endif
#ifndef KB_GEMM_TN
#define KB_GEMM_TN 128
#endif
#ifndef KB_GEMM_TK
#define KB_GEMM_TK 16
#endif
#ifndef KB_GEMM_WM
#define KB_GEMM_WM 8
#endif
#ifndef KB_GEMM_WN
#define KB_GEMM_WN 8
#endif
#define GEMM_NT ((KB_GEMM_TM / KB_GEMM_WM) * (KB_GEMM_TN / KB_GEMM_WN))

_Static_assert(KB_GEMM_WM % 4 == 0 && KB_GEMM_WN % 4 == 0 && KB_GEMM_TM % KB_GEMM_WM == 0 &&
               KB_GEMM_TN % KB_GEMM_WN == 0, "gemm tile shape");
_Static_assert(KB_REC_COPY == 0 && KB_REC_FILL == 1 && KB_REC_MATH1 == 2 && KB_REC_MATH2 == 3 &&
               KB_REC_FMA == 4 && KB_REC_CLAMP == 5 && KB_REC_SOFTMAX == 6 &&
               KB_REC_REDUCE == 7 && KB_REC_GEMM == 8 && KB_REC_TRANSPOSE == 9 &&
               KB_REC_ATTN_SOFTMAX == 10 && KB_REC_GATHER == 11 && KB_REC_DEQUANT == 12 &&
               KB_REC_GEN == 13 && KB_REC_NKINDS == 14,
               "record kinds");
_Static_assert(KB_MF_M1_GELU == KB_M1_GELU && KB_MF_M1_AXPB == KB_M1_AXPB &&
               KB_MF_M1_RSQRT == KB_M1_RSQRT && KB_MF_M1_SOFTCAP == KB_M1_SOFTCAP &&
               KB_MF_M2_MIN == KB_M2_MIN && KB_RED_MAX == 1,
               "op codes shared with replay.cl");
_Static_assert(KB_F16 == 0 && KB_BF16 == 1 && KB_F32 == 2, "dtype codes shared with replay.cl");
_Static_assert(KB_I8 == 3 && KB_FP8E4M3 == 4 && KB_FP8E5M2 == 5 && KB_E8M0 == 6 && KB_I32 == 7 &&
               KB_NDTYPES == 8, "number-format dtype codes shared with replay.cl (3 bits)");

/* Argument table entry; the layout of replay.cl's kb_ent (naturally aligned, no padding). */
typedef struct kb_clent {
    cl_ulong start;
    cl_ulong off[4];
    cl_uint rows, cols, kdim, flags;
    cl_uint rs[4], cs[4];
    cl_uint dt, op;
    cl_float imm0, imm1;
} kb_clent;
_Static_assert(sizeof(kb_clent) == 104, "kb_clent must match replay.cl's kb_ent");

enum { DT_PAYLOAD = 8, DT_UNALIGNED = 16 };
enum { EF_ACC = 1, EF_FLAT = 2, EF_BIG = 4, EF_FMA = 8, EF_PAIR = 16, EF_QUAD = 32 };
enum { EF_QSPARSE = 64, EF_QSCALE = 128 }; /* DEQUANT */

/* The kernels of record kinds, then kb_ew: a launch group of several elementwise kinds. */
#define CL_EW_MIXED KB_REC_NKINDS
#define CL_NKERN (KB_REC_NKINDS + 1)
#define EF_KIND_SHIFT 8 /* replay.cl's KB_EF_KIND_SHIFT: an elementwise entry's kind */

static const char *const kernel_names[CL_NKERN] = {
    "kb_copy", "kb_fill", "kb_math1", "kb_math2", "kb_fma",
    "kb_clamp", "kb_softmax", "kb_reduce", "kb_gemm",
    "kb_transpose", "kb_attn_softmax", "kb_gather",
    /* number formats */
    "kb_dequant",
    /* test data */
    "kb_gen",
    /* several elementwise kinds */
    "kb_ew",
};

/* Work-items per group of a kind's kernel (replay.cl's reqd_work_group_size). */
static size_t local_of(unsigned kind)
{
    if (kind == KB_REC_GEMM)
        return GEMM_NT;
    if (kind == KB_REC_SOFTMAX || kind == KB_REC_REDUCE || kind == KB_REC_ATTN_SOFTMAX)
        return LN_LOCAL;
    return EW_LOCAL;
}

/* One kernel launch of a flush: entries [first, first + n) of the flush's table. */
typedef struct cl_launch {
    unsigned kind;
    size_t first, n;
    uint64_t units;
} cl_launch;

typedef struct clbe {
    cl_context ctx;                     /* shared with clones (retained) */
    cl_device_id dev;
    cl_command_queue q;
    cl_program prog;                    /* shared with clones (retained) */
    cl_kernel kern[CL_NKERN];            /* by kind, then kb_ew (CL_EW_MIXED) */
    cl_kernel kfill;                    /* kb_fill_bytes (rs_fill) */
    cl_kernel kvq_digest, kvq_colref, kvq_check; /* device queries (rs_query); the last two
                                                    NULL without fp64 */
    cl_mem arena, payload, table;       /* device buffers, grown on demand */
    size_t arena_cap, payload_cap, table_cap;
    kb_resident *res;                   /* device-resident memory (kb_resident.h): */
    cl_mem rarena, rpayload;            /* its arena and payload */
    size_t rarena_cap, rpayload_cap;
    cl_mem cur_arena, cur_payload;      /* what the flush's launches use */
    cl_uint ncu;
    uint64_t arena_bytes;
    kb_clent *tab;                      /* the flush's argument tables, in launch order */
    size_t ntab, tabcap;
    cl_launch *ln;
    size_t nln, lncap;
    cl_event *ev;                       /* one per launch of the flush (profiling) */
    size_t nev, evcap;
    int active, failed;
    uint64_t launches;
    double kernel_ms;                   /* device time of all launches, from the events */
    kb_opencl_setup setup;
    char desc[800];                     /* as kb_opencl_backend_create describes the device */
} clbe;

static const char *cl_errname(cl_int e)
{
    switch (e) {
    case CL_SUCCESS: return "CL_SUCCESS";
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_BUILD_OPTIONS: return "CL_INVALID_BUILD_OPTIONS";
    case CL_INVALID_PROGRAM_EXECUTABLE: return "CL_INVALID_PROGRAM_EXECUTABLE";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_OPERATION: return "CL_INVALID_OPERATION";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "OpenCL error";
    }
}

static int cl_fail(kb_errbuf *eb, const char *what, cl_int err)
{
    return kb_err_set(eb, KB_ERR_DEVICE, "opencl: %s: %s (%d)", what, cl_errname(err), (int)err);
}

/* ---------------------------------------------------------------- environment */

/* path and its parents exist and path is writable */
static int mkdir_p(const char *path)
{
    return kb_clcache_mkdir_p(path) == 0 && access(path, W_OK) == 0 ? 0 : -1;
}

/* PoCL needs a writable kernel cache; give it one unless the user chose: DIR/pocl of kbcl's
 * cache folder (kb_clcache_dir), else a folder in /tmp. */
static void pocl_cache_env(void)
{
    char dir[4096], base[3900];
    int ok = 0;

    if (getenv("POCL_CACHE_DIR"))
        return;
    if (kb_clcache_dir(base, sizeof base)) {
        snprintf(dir, sizeof dir, "%s/pocl", base);
        ok = mkdir_p(dir) == 0;
    }
    if (!ok) {
        snprintf(dir, sizeof dir, "/tmp/kbcl-pocl-cache-%lu", (unsigned long)getuid());
        ok = mkdir_p(dir) == 0;
    }
    if (ok)
        setenv("POCL_CACHE_DIR", dir, 0);
}

void kb_opencl_env(void)
{
    pocl_cache_env();
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The NVIDIA OpenCL driver library, if installed in a usual place. */
static const char *nvidia_lib(void)
{
    static const char *const paths[] = {
        "/usr/local/nvidia/lib64/libnvidia-opencl.so.1",
        "/usr/local/nvidia/lib/libnvidia-opencl.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1",
        "/usr/lib/aarch64-linux-gnu/libnvidia-opencl.so.1",
        "/usr/lib64/libnvidia-opencl.so.1",
        "/usr/lib/libnvidia-opencl.so.1",
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (access(paths[i], R_OK) == 0)
            return paths[i];
    return NULL;
}

/* ---------------------------------------------------------------- discovery */

typedef struct cl_dev {
    cl_platform_id plat;
    cl_device_id dev;
    cl_device_type type;
} cl_dev;

typedef struct cl_inventory {
    cl_platform_id *plats;
    cl_uint nplats;
    cl_dev *devs;
    size_t ndevs;
    int nvidia_platform; /* a platform whose name or vendor mentions NVIDIA */
} cl_inventory;

static void inv_free(cl_inventory *v)
{
    free(v->plats);
    free(v->devs);
    memset(v, 0, sizeof *v);
}

static void plat_str(cl_platform_id p, cl_platform_info what, char *buf, size_t n)
{
    if (clGetPlatformInfo(p, what, n, buf, NULL) != CL_SUCCESS)
        snprintf(buf, n, "?");
    buf[n - 1] = '\0';
}

static void dev_str(cl_device_id d, cl_device_info what, char *buf, size_t n)
{
    if (clGetDeviceInfo(d, what, n, buf, NULL) != CL_SUCCESS)
        snprintf(buf, n, "?");
    buf[n - 1] = '\0';
}

/* All platforms and devices; no platform at all is not an error. KB_ERR_NOMEM. */
static int inventory(cl_inventory *v)
{
    cl_uint np = 0;

    memset(v, 0, sizeof *v);
    pocl_cache_env();
    if (clGetPlatformIDs(0, NULL, &np) != CL_SUCCESS || np == 0)
        return 0;
    v->plats = calloc(np, sizeof *v->plats);
    if (!v->plats)
        return KB_ERR_NOMEM;
    if (clGetPlatformIDs(np, v->plats, &np) != CL_SUCCESS)
        np = 0;
    v->nplats = np;
    for (cl_uint p = 0; p < np; p++) {
        char name[256], vendor[256];
        cl_uint nd = 0;
        plat_str(v->plats[p], CL_PLATFORM_NAME, name, sizeof name);
        plat_str(v->plats[p], CL_PLATFORM_VENDOR, vendor, sizeof vendor);
        if (strstr(name, "NVIDIA") || strstr(vendor, "NVIDIA"))
            v->nvidia_platform = 1;
        if (clGetDeviceIDs(v->plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0)
            continue;
        cl_device_id *ids = calloc(nd, sizeof *ids);
        cl_dev *grown = realloc(v->devs, (v->ndevs + nd) * sizeof *grown);
        if (!ids || !grown) {
            free(ids);
            if (grown)
                v->devs = grown;
            inv_free(v);
            return KB_ERR_NOMEM;
        }
        v->devs = grown;
        if (clGetDeviceIDs(v->plats[p], CL_DEVICE_TYPE_ALL, nd, ids, &nd) != CL_SUCCESS)
            nd = 0;
        for (cl_uint i = 0; i < nd; i++) {
            cl_dev *d = &v->devs[v->ndevs++];
            d->plat = v->plats[p];
            d->dev = ids[i];
            if (clGetDeviceInfo(ids[i], CL_DEVICE_TYPE, sizeof d->type, &d->type, NULL) != CL_SUCCESS)
                d->type = 0;
        }
        free(ids);
    }
    return 0;
}

static const char *type_name(cl_device_type t)
{
    if (t & CL_DEVICE_TYPE_GPU)
        return "GPU";
    if (t & CL_DEVICE_TYPE_CPU)
        return "CPU";
    if (t & CL_DEVICE_TYPE_ACCELERATOR)
        return "accelerator";
    return "other";
}

/* Index of the device to use, or -1. */
static long pick(const cl_inventory *v, kb_cl_want want)
{
    static const cl_device_type order_any[] = { CL_DEVICE_TYPE_GPU, CL_DEVICE_TYPE_CPU,
                                                 CL_DEVICE_TYPE_ALL };
    for (size_t o = 0; o < 3; o++) {
        cl_device_type t = want == KB_CL_GPU ? CL_DEVICE_TYPE_GPU
                           : want == KB_CL_CPU ? CL_DEVICE_TYPE_CPU : order_any[o];
        for (size_t i = 0; i < v->ndevs; i++) {
            cl_bool avail = CL_FALSE;
            if (!(v->devs[i].type & t))
                continue;
            if (clGetDeviceInfo(v->devs[i].dev, CL_DEVICE_AVAILABLE, sizeof avail, &avail, NULL)
                    != CL_SUCCESS || !avail)
                continue;
            return (long)i;
        }
        if (want != KB_CL_ANY)
            break;
    }
    return -1;
}

/* "PLATFORM: DEVICE (TYPE); ..." or "no OpenCL platform". */
static void found_list(const cl_inventory *v, char *buf, size_t n)
{
    size_t len = 0;

    buf[0] = '\0';
    if (v->nplats == 0) {
        snprintf(buf, n, "no OpenCL platform");
        return;
    }
    for (cl_uint p = 0; p < v->nplats && len + 1 < n; p++) {
        char pname[128];
        int any = 0;
        plat_str(v->plats[p], CL_PLATFORM_NAME, pname, sizeof pname);
        for (size_t i = 0; i < v->ndevs && len + 1 < n; i++) {
            char dname[128];
            if (v->devs[i].plat != v->plats[p])
                continue;
            dev_str(v->devs[i].dev, CL_DEVICE_NAME, dname, sizeof dname);
            len += (size_t)snprintf(buf + len, n - len, "%s%s: %s (%s)", len ? "; " : "", pname,
                                    dname, type_name(v->devs[i].type));
            any = 1;
        }
        if (!any && len + 1 < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s: no devices", len ? "; " : "",
                                    pname);
    }
}

static void icd_hint(const cl_inventory *v, char *buf, size_t n)
{
    const char *lib = nvidia_lib();

    buf[0] = '\0';
    if (lib && !v->nvidia_platform)
        snprintf(buf, n,
                 "hint: the NVIDIA OpenCL driver %s is installed but no NVIDIA platform is "
                 "registered; set OCL_ICD_FILENAMES=%s or add /etc/OpenCL/vendors/nvidia.icd "
                 "containing libnvidia-opencl.so.1",
                 lib, lib);
}

/* The program's build options for dev. */
static void build_opts(cl_device_id dev, char *opts, size_t n)
{
    cl_device_fp_config fp = 0;

    (void)clGetDeviceInfo(dev, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
    snprintf(opts, n,
             "-cl-std=CL1.2 -DKB_EW_LOCAL=%u -DKB_EW_PER=%u -DKB_LN_LOCAL=%u -DKB_GEMM_TM=%d "
             "-DKB_GEMM_TN=%d -DKB_GEMM_TK=%d -DKB_GEMM_WM=%d -DKB_GEMM_WN=%d%s",
             EW_LOCAL, EW_PER, LN_LOCAL, KB_GEMM_TM, KB_GEMM_TN, KB_GEMM_TK, KB_GEMM_WM,
             KB_GEMM_WN,
             (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) ? " -cl-fp32-correctly-rounded-divide-sqrt"
                                                        : "");
}

/* The cache key of the program for dev: everything its binary depends on. */
static void program_key(cl_platform_id plat, cl_device_id dev, const char *opts, char *key,
                        size_t n)
{
    const char *src = (const char *)kb_opencl_src;
    size_t len = strlen(src);
    char pname[256], pver[256], dname[256], dvendor[256], dver[256], drv[256];

    plat_str(plat, CL_PLATFORM_NAME, pname, sizeof pname);
    plat_str(plat, CL_PLATFORM_VERSION, pver, sizeof pver);
    dev_str(dev, CL_DEVICE_NAME, dname, sizeof dname);
    dev_str(dev, CL_DEVICE_VENDOR, dvendor, sizeof dvendor);
    dev_str(dev, CL_DEVICE_VERSION, dver, sizeof dver);
    dev_str(dev, CL_DRIVER_VERSION, drv, sizeof drv);
    snprintf(key, n,
             "kbcl replay program v1\nplatform: %s | %s\ndevice: %s | %s | %s\ndriver: %s\n"
             "source: %016llx %zu\noptions: %s\n",
             pname, pver, dname, dvendor, dver, drv,
             (unsigned long long)kb_clcache_hash(src, len, KB_CLCACHE_HASH_INIT), len, opts);
}

int kb_opencl_available(kb_cl_want want)
{
    cl_inventory v;
    int ok;

    if (inventory(&v) != 0)
        return 0;
    ok = pick(&v, want) >= 0;
    inv_free(&v);
    return ok;
}

int kb_opencl_list(char *buf, size_t n)
{
    cl_inventory v;
    size_t len = 0;
    char hint[512];

    if (!buf || n == 0)
        return KB_ERR_INVAL;
    buf[0] = '\0';
    if (inventory(&v) != 0) {
        snprintf(buf, n, "OpenCL: out of memory while listing devices\n");
        return KB_ERR_NOMEM;
    }
    char cdir[3800];
    int cache_on = kb_clcache_dir(cdir, sizeof cdir);
#define KB_APPEND(...)                                                               \
    do {                                                                             \
        if (len + 1 < n)                                                             \
            len += (size_t)snprintf(buf + len, n - len, __VA_ARGS__);                \
    } while (0)
    if (v.nplats == 0)
        KB_APPEND("OpenCL: no platform found (no ICD registered in /etc/OpenCL/vendors, or "
                  "OCL_ICD_FILENAMES empty)\n");
    for (cl_uint p = 0; p < v.nplats; p++) {
        char name[256], ver[256];
        plat_str(v.plats[p], CL_PLATFORM_NAME, name, sizeof name);
        plat_str(v.plats[p], CL_PLATFORM_VERSION, ver, sizeof ver);
        KB_APPEND("platform %u: %s (%s)\n", (unsigned)p, name, ver);
        for (size_t i = 0, j = 0; i < v.ndevs; i++) {
            char dname[256], dver[256], cver[256];
            cl_uint ncu = 0;
            cl_ulong mem = 0;
            if (v.devs[i].plat != v.plats[p])
                continue;
            dev_str(v.devs[i].dev, CL_DEVICE_NAME, dname, sizeof dname);
            dev_str(v.devs[i].dev, CL_DEVICE_VERSION, dver, sizeof dver);
            dev_str(v.devs[i].dev, CL_DEVICE_OPENCL_C_VERSION, cver, sizeof cver);
            (void)clGetDeviceInfo(v.devs[i].dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof ncu, &ncu, NULL);
            (void)clGetDeviceInfo(v.devs[i].dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
            KB_APPEND("  device %zu: %s [%s] %s; %s; %u compute units, %.1f GiB\n", j++, dname,
                      type_name(v.devs[i].type), dver, cver, (unsigned)ncu,
                      (double)mem / (1024.0 * 1024.0 * 1024.0));
            if (cache_on) {
                char opts[512], key[2048], path[4096];
                uint8_t *bin = NULL;
                size_t nbin = 0;
                build_opts(v.devs[i].dev, opts, sizeof opts);
                program_key(v.plats[p], v.devs[i].dev, opts, key, sizeof key);
                kb_clcache_path(cdir, key, path, sizeof path);
                if (kb_clcache_load(cdir, key, &bin, &nbin) == 1)
                    KB_APPEND("    program cache: hit (%s, %.0f KiB): set-up starts warm\n", path,
                              (double)nbin / 1024.0);
                else
                    KB_APPEND("    program cache: miss: the first backend builds from source and "
                              "stores %s\n", path);
                free(bin);
            }
        }
    }
    KB_APPEND("program cache: %s%s\n", cdir,
              cache_on ? " (KBCL_CACHE_DIR=off turns it off)" : "");
    icd_hint(&v, hint, sizeof hint);
    if (hint[0])
        KB_APPEND("%s\n", hint);
#undef KB_APPEND
    int count = (int)v.ndevs;
    inv_free(&v);
    return count;
}

/* ---------------------------------------------------------------- backend */

static int ensure_buf(clbe *b, cl_mem *m, size_t *cap, size_t need, cl_mem_flags fl,
                      const char *what, kb_errbuf *eb)
{
    cl_int err;

    if (need < 64)
        need = 64;
    if (*m && *cap >= need)
        return 0;
    if (*m)
        clReleaseMemObject(*m);
    *m = NULL;
    *cap = 0;
    if (need < SIZE_MAX / 2)
        need += need / 4; /* room to grow across flushes */
    *m = clCreateBuffer(b->ctx, fl, need, NULL, &err);
    if (!*m)
        return kb_err_set(eb, KB_ERR_DEVICE, "opencl: %s buffer of %zu bytes: %s (%d)", what,
                          need, cl_errname(err), (int)err);
    *cap = need;
    return 0;
}

/* A flush starts: its launches use these buffers; the argument tables start empty. */
static void flush_open(clbe *b, cl_mem arena, cl_mem payload, uint64_t arena_bytes)
{
    b->cur_arena = arena;
    b->cur_payload = payload;
    b->arena_bytes = arena_bytes;
    b->ntab = 0;
    b->nln = 0;
    b->failed = 0;
    b->active = 1;
}

static int cl_begin(void *self, uint8_t *arena, uint64_t arena_bytes,
                    const uint8_t *payload, size_t payload_bytes, kb_errbuf *eb)
{
    clbe *b = self;
    cl_int err;
    int rc;

    if (b->active)
        return kb_err_set(eb, KB_ERR_STATE, "opencl backend: begin inside a flush");
    if (arena_bytes > SIZE_MAX)
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: arena of %llu bytes",
                          (unsigned long long)arena_bytes);
    if (!arena) { /* a resident flush: kb_resident has put everything in place */
        if (arena_bytes > b->rarena_cap)
            return kb_err_set(eb, KB_ERR_STATE,
                              "opencl backend: resident arena of %llu bytes, has %zu",
                              (unsigned long long)arena_bytes, b->rarena_cap);
        if ((!b->rarena && (rc = ensure_buf(b, &b->rarena, &b->rarena_cap, 64,
                                            CL_MEM_READ_WRITE, "arena", eb)) != 0) ||
            (!b->rpayload && (rc = ensure_buf(b, &b->rpayload, &b->rpayload_cap, 64,
                                              CL_MEM_READ_ONLY, "payload", eb)) != 0))
            return rc;
        flush_open(b, b->rarena, b->rpayload, arena_bytes);
        return 0;
    }
    if ((rc = ensure_buf(b, &b->arena, &b->arena_cap, (size_t)arena_bytes, CL_MEM_READ_WRITE,
                         "arena", eb)) != 0)
        return rc;
    if ((rc = ensure_buf(b, &b->payload, &b->payload_cap, payload_bytes, CL_MEM_READ_ONLY,
                         "payload", eb)) != 0)
        return rc;
    /* Non-blocking: the caller keeps both host buffers unchanged until end() returns. */
    if (arena_bytes > 0 &&
        (err = clEnqueueWriteBuffer(b->q, b->arena, CL_FALSE, 0, (size_t)arena_bytes, arena, 0,
                                    NULL, NULL)) != CL_SUCCESS)
        goto fail;
    if (payload_bytes > 0 &&
        (err = clEnqueueWriteBuffer(b->q, b->payload, CL_FALSE, 0, payload_bytes, payload, 0,
                                    NULL, NULL)) != CL_SUCCESS)
        goto fail;
    flush_open(b, b->arena, b->payload, arena_bytes);
    return 0;
fail:
    clFinish(b->q);
    return cl_fail(eb, "upload", err);
}

static uint32_t opnd_desc(const kb_opnd *o)
{
    uint32_t d = o->dtype;
    if (o->space == KB_SPACE_PAYLOAD)
        d |= DT_PAYLOAD;
    if (o->addr % kb_dtype_size((kb_dtype)o->dtype) != 0)
        d |= DT_UNALIGNED;
    return d;
}

static void set_opnd(kb_clent *e, unsigned slot, const kb_opnd *o)
{
    e->off[slot] = o->addr;
    e->dt |= opnd_desc(o) << (8 * slot);
}

/* make_entry for the kb_tl_nn kinds (kb_oplog.h; kernels at the end of replay.cl). */
static void make_nn_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    uint64_t n = (uint64_t)d->rows * d->cols;

    e->rows = d->rows;
    e->cols = d->cols;
    e->rs[0] = d->ld;
    e->cs[0] = 1;
    set_opnd(e, 1, &s[0]);
    switch (r->kind) {
    case KB_REC_TRANSPOSE: /* dst (i, j) = src (j, i): the source's strides swapped */
        e->rs[1] = 1;
        e->cs[1] = s[0].ld;
        if (n > UINT32_MAX)
            e->flags |= EF_BIG;
        *units = (n + EW_CHUNK - 1) / EW_CHUNK;
        return;
    case KB_REC_ATTN_SOFTMAX:
        e->rs[1] = s[0].ld;
        e->cs[1] = 1;
        e->off[2] = s[1].addr; /* the causal offset's bits, not an operand */
        *units = d->cols == 0 ? 0 : (d->rows + LN_LOCAL - 1) / LN_LOCAL;
        return;
    case KB_REC_GATHER:
        set_opnd(e, 2, &s[1]);
        e->rs[1] = s[0].ld;
        e->kdim = s[0].rows;
        e->rs[2] = s[1].rows == 1 ? 1 : s[1].ld;
        *units = (n + EW_CHUNK - 1) / EW_CHUNK;
        return;
    default:
        *units = 0;
        return;
    }
}

/* Fills the entry of one record; *units receives its work units (0: nothing to do). */
static void make_entry(const kb_rec *r, kb_clent *e, uint64_t *units)
{
    const kb_opnd *d = &r->dst, *s = r->src;

    memset(e, 0, sizeof *e);
    set_opnd(e, 0, d);
    e->op = r->op;
    e->imm0 = r->imm[0];
    e->imm1 = r->imm[1];
    switch (r->kind) {
    case KB_REC_TRANSPOSE:
    case KB_REC_ATTN_SOFTMAX:
    case KB_REC_GATHER:
        make_nn_entry(r, e, units);
        return;
    case KB_REC_SOFTMAX: {
        int rows = r->op == 1; /* axis 1: one line per row */
        set_opnd(e, 1, &s[0]);
        e->rows = rows ? d->rows : d->cols;
        e->cols = rows ? d->cols : d->rows;
        e->rs[0] = rows ? d->ld : 1;
        e->cs[0] = rows ? 1 : d->ld;
        e->rs[1] = rows ? s[0].ld : 1;
        e->cs[1] = rows ? 1 : s[0].ld;
        *units = e->cols == 0 ? 0 : (e->rows + LN_LOCAL - 1) / LN_LOCAL;
        return;
    }
    case KB_REC_REDUCE: {
        int axis0 = (r->flags & KB_REC_AXIS0) != 0;
        set_opnd(e, 1, &s[0]);
        e->rows = axis0 ? s[0].cols : s[0].rows;
        e->cols = axis0 ? s[0].rows : s[0].cols;
        e->rs[0] = axis0 ? 1 : d->ld;
        e->rs[1] = axis0 ? 1 : s[0].ld;
        e->cs[1] = axis0 ? s[0].ld : 1;
        *units = (e->rows + LN_LOCAL - 1) / LN_LOCAL;
        return;
    }
    case KB_REC_GEMM: {
        set_opnd(e, 1, &s[0]);
        set_opnd(e, 2, &s[1]);
        e->rows = d->rows;
        e->cols = d->cols;
        e->kdim = s[0].cols;
        e->rs[0] = d->ld;
        e->rs[1] = s[0].ld;
        e->rs[2] = s[1].ld;
        if (r->flags & KB_REC_ACC)
            e->flags |= EF_ACC;
        if (s[0].dtype == KB_F16 && s[1].dtype == KB_F16)
            e->flags |= EF_FMA; /* f16 x f16 is exact in f32, so fma == multiply then add */
        *units = (uint64_t)((d->rows + KB_GEMM_TM - 1) / KB_GEMM_TM) *
                 ((d->cols + KB_GEMM_TN - 1) / KB_GEMM_TN);
        return;
    }
    case KB_REC_GEN: /* parameters in the operand slots (kb_oplog.h, replay.cl's kb_gen) */
        e->off[1] = s[0].addr;
        e->off[2] = s[1].addr;
        e->off[3] = s[2].addr;
        e->kdim = s[0].rows;
        e->rs[1] = s[0].cols;
        e->rows = d->rows;
        e->cols = d->cols;
        e->rs[0] = d->ld;
        *units = ((uint64_t)d->rows * d->cols + EW_CHUNK - 1) / EW_CHUNK;
        return;
    case KB_REC_DEQUANT: {
        /* slot 1 elements, 2 metadata, 3 scale; cs[1], cs[2]: the scale's row and column
         * blocks (dst rows / columns per scale element) */
        int sparse = (r->flags & KB_REC_QSPARSE) != 0, scaled = (r->flags & KB_REC_QSCALE) != 0;
        set_opnd(e, 1, &s[0]);
        e->rs[1] = s[0].ld;
        if (sparse) {
            set_opnd(e, 2, &s[1]);
            e->rs[2] = s[1].ld;
            e->flags |= EF_QSPARSE;
        }
        if (scaled) {
            const kb_opnd *sc = &s[r->nsrc - 1];
            set_opnd(e, 3, sc);
            e->rs[3] = sc->ld;
            e->cs[1] = d->rows / sc->rows;
            e->cs[2] = d->cols / sc->cols;
            e->flags |= EF_QSCALE;
        }
        e->rows = d->rows;
        e->cols = d->cols;
        e->rs[0] = d->ld;
        if ((uint64_t)d->rows * d->cols > UINT32_MAX)
            e->flags |= EF_BIG;
        *units = ((uint64_t)d->rows * d->cols + EW_CHUNK - 1) / EW_CHUNK;
        return;
    }
    default:
        break;
    }
    /* Elementwise: dst rows x cols in row-major order; sources broadcast with stride 0. */
    uint64_t n = (uint64_t)d->rows * d->cols;
    int flat = 1;
    e->rows = d->rows;
    e->cols = d->cols;
    e->rs[0] = d->ld;
    e->cs[0] = 1;
    for (unsigned i = 0; i < r->nsrc && i < 3; i++) {
        set_opnd(e, i + 1, &s[i]);
        e->rs[i + 1] = s[i].rows == 1 ? 0 : s[i].ld;
        e->cs[i + 1] = s[i].cols == 1 ? 0 : 1;
    }
    for (unsigned i = 0; i <= r->nsrc && i < 4; i++)
        if (!((d->rows == 1 || e->rs[i] == d->cols) && (d->cols == 1 || e->cs[i] == 1)))
            flat = 0;
    if (flat) {
        /* Wide accesses: four 16-bit elements in 8 bytes, or pairs of elements, when every
         * operand is aligned for them. */
        int pair = 1, quad = 1;
        e->flags |= EF_FLAT;
        for (unsigned i = 0; i <= r->nsrc && i < 4; i++) {
            const kb_opnd *o = i == 0 ? d : &s[i - 1];
            size_t es = kb_dtype_size((kb_dtype)o->dtype);
            if (o->addr % (2 * es) != 0 || es == 1) /* no byte-pair accesses */
                pair = 0;
            if (es != 2 || o->addr % 8 != 0)
                quad = 0;
        }
        if (quad && EW_PER % 4 == 0)
            e->flags |= EF_QUAD;
        else if (pair && EW_PER % 2 == 0)
            e->flags |= EF_PAIR;
    }
    if (n > UINT32_MAX)
        e->flags |= EF_BIG;
    *units = (n + EW_CHUNK - 1) / EW_CHUNK;
}

static int cl_run_batch(void *self, const kb_rec *recs, size_t n, kb_errbuf *eb)
{
    clbe *b = self;

    if (!b->active)
        return kb_err_set(eb, KB_ERR_STATE, "opencl backend: run_batch outside begin/end");
    for (size_t i = 0; i < n;) {
        unsigned kind = recs[i].kind, group = kb_rec_launch_group(kind);
        size_t j = i;
        uint64_t units = 0;
        size_t first = b->ntab;
        if (kind >= KB_REC_NKINDS) {
            b->failed = 1;
            return kb_err_set(eb, KB_ERR_INVAL, "opencl backend: record kind %u", kind);
        }
        for (; j < n && recs[j].kind < KB_REC_NKINDS &&
               kb_rec_launch_group(recs[j].kind) == group; j++) {
            uint64_t u;
            if (b->ntab == b->tabcap) {
                size_t c = b->tabcap ? 2 * b->tabcap : 256;
                kb_clent *t = realloc(b->tab, c * sizeof *t);
                if (!t) {
                    b->failed = 1;
                    return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: argument table");
                }
                b->tab = t;
                b->tabcap = c;
            }
            make_entry(&recs[j], &b->tab[b->ntab], &u);
            if (u == 0)
                continue; /* an empty record: nothing to launch for it */
            if (b->ntab == first)
                kind = recs[j].kind; /* the first entry with work names the kernel ... */
            else if (recs[j].kind != kind)
                kind = CL_EW_MIXED;  /* ... unless elementwise kinds differ: kb_ew */
            if (group == KB_REC_COPY)
                b->tab[b->ntab].flags |= (cl_uint)recs[j].kind << EF_KIND_SHIFT;
            b->tab[b->ntab++].start = units;
            units += u;
        }
        if (b->ntab > first) {
            if (b->nln == b->lncap) {
                size_t c = b->lncap ? 2 * b->lncap : 64;
                cl_launch *l = realloc(b->ln, c * sizeof *l);
                if (!l) {
                    b->failed = 1;
                    return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: launch list");
                }
                b->ln = l;
                b->lncap = c;
            }
            cl_launch *l = &b->ln[b->nln++];
            l->kind = kind;
            l->first = first;
            l->n = b->ntab - first;
            l->units = units;
        }
        i = j;
    }
    return 0;
}

static int enqueue_all(clbe *b, kb_errbuf *eb)
{
    cl_int err;
    int rc;

    if (b->nln == 0)
        return 0;
    if ((rc = ensure_buf(b, &b->table, &b->table_cap, b->ntab * sizeof *b->tab,
                         CL_MEM_READ_ONLY, "argument table", eb)) != 0)
        return rc;
    if ((err = clEnqueueWriteBuffer(b->q, b->table, CL_FALSE, 0, b->ntab * sizeof *b->tab, b->tab,
                                    0, NULL, NULL)) != CL_SUCCESS)
        return cl_fail(eb, "argument table upload", err);
    if (b->nln > b->evcap) {
        cl_event *ev = realloc(b->ev, b->nln * sizeof *ev);
        if (!ev)
            return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: launch events");
        b->ev = ev;
        b->evcap = b->nln;
    }
    for (size_t i = 0; i < b->nln; i++) {
        const cl_launch *l = &b->ln[i];
        cl_kernel k = b->kern[l->kind];
        cl_uint n = (cl_uint)l->n;
        cl_ulong units = l->units;
        size_t local, groups, global;
        cl_uint first = (cl_uint)l->first;

        if (l->n > UINT32_MAX || l->first > UINT32_MAX)
            return kb_err_set(eb, KB_ERR_DEVICE, "opencl: %zu records in one flush", b->ntab);
        if (l->kind == KB_REC_GEMM) {
            local = GEMM_NT;
            groups = (size_t)l->units;
        } else {
            /* Grid-stride kernels: enough work-groups to fill the device, not one per unit. */
            size_t cap = (size_t)(b->ncu ? b->ncu : 1) * 32;
            local = local_of(l->kind);
            groups = l->units < cap ? (size_t)l->units : cap;
        }
        global = groups * local;
        err = clSetKernelArg(k, 0, sizeof(cl_mem), &b->cur_arena);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, 1, sizeof(cl_mem), &b->cur_payload);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, 2, sizeof(cl_mem), &b->table);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, 3, sizeof first, &first);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, 4, sizeof n, &n);
        if (err == CL_SUCCESS)
            err = clSetKernelArg(k, 5, sizeof units, &units);
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(b->q, k, 1, NULL, &global, &local, 0, NULL, &b->ev[i]);
        if (err != CL_SUCCESS)
            return kb_err_set(eb, KB_ERR_DEVICE, "opencl: launching %s over %zu records: %s (%d)",
                              kernel_names[l->kind], l->n, cl_errname(err), (int)err);
        b->launches++;
        b->nev = i + 1;
    }
    return 0;
}

/* Adds the finished launches' device time to kernel_ms and releases their events. */
static void collect_events(clbe *b)
{
    for (size_t i = 0; i < b->nev; i++) {
        cl_ulong t0 = 0, t1 = 0;
        if (clGetEventProfilingInfo(b->ev[i], CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL) ==
                CL_SUCCESS &&
            clGetEventProfilingInfo(b->ev[i], CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) ==
                CL_SUCCESS && t1 > t0)
            b->kernel_ms += (double)(t1 - t0) / 1e6;
        clReleaseEvent(b->ev[i]);
    }
    b->nev = 0;
}

static int cl_end(void *self, uint8_t *arena, uint64_t arena_bytes, kb_errbuf *eb)
{
    clbe *b = self;
    cl_int err;
    int rc = 0;

    if (!b->active)
        return kb_err_set(eb, KB_ERR_STATE, "opencl backend: end without begin");
    b->active = 0;
    if (b->failed) {
        rc = kb_err_set(eb, KB_ERR_STATE, "opencl backend: end after a failed batch");
        goto fail;
    }
    if (arena_bytes != b->arena_bytes) {
        rc = kb_err_set(eb, KB_ERR_STATE, "opencl backend: end with %llu arena bytes, begin had %llu",
                        (unsigned long long)arena_bytes, (unsigned long long)b->arena_bytes);
        goto fail;
    }
    if ((rc = enqueue_all(b, eb)) != 0)
        goto fail;
    if (arena && arena_bytes > 0 &&
        (err = clEnqueueReadBuffer(b->q, b->arena, CL_FALSE, 0, (size_t)arena_bytes, arena, 0,
                                   NULL, NULL)) != CL_SUCCESS) {
        rc = cl_fail(eb, "arena read-back", err);
        goto fail;
    }
    if ((err = clFinish(b->q)) != CL_SUCCESS) {
        rc = cl_fail(eb, "replay", err);
        collect_events(b);
        return rc;
    }
    collect_events(b);
    b->ntab = 0;
    b->nln = 0;
    return 0;
fail:
    /* Nothing queued may still refer to the caller's buffers once we return. */
    clFinish(b->q);
    collect_events(b);
    b->ntab = 0;
    b->nln = 0;
    return rc;
}

static void cl_destroy(void *self)
{
    clbe *b = self;

    if (!b)
        return;
    kb_resident_destroy(b->res); /* may still pull a bound store's data */
    if (b->q)
        clFinish(b->q);
    collect_events(b);
    for (unsigned i = 0; i < CL_NKERN; i++)
        if (b->kern[i])
            clReleaseKernel(b->kern[i]);
    if (b->kfill)
        clReleaseKernel(b->kfill);
    if (b->kvq_digest)
        clReleaseKernel(b->kvq_digest);
    if (b->kvq_colref)
        clReleaseKernel(b->kvq_colref);
    if (b->kvq_check)
        clReleaseKernel(b->kvq_check);
    if (b->prog)
        clReleaseProgram(b->prog);
    if (b->arena)
        clReleaseMemObject(b->arena);
    if (b->payload)
        clReleaseMemObject(b->payload);
    if (b->table)
        clReleaseMemObject(b->table);
    if (b->rarena)
        clReleaseMemObject(b->rarena);
    if (b->rpayload)
        clReleaseMemObject(b->rpayload);
    if (b->q)
        clReleaseCommandQueue(b->q);
    if (b->ctx)
        clReleaseContext(b->ctx);
    free(b->tab);
    free(b->ln);
    free(b->ev);
    free(b);
}

/* ---------------------------------------------------------------- device-resident memory */

static int rs_arena(void *dev, uint64_t bytes, const kb_move *mv, size_t n, kb_errbuf *eb)
{
    clbe *b = dev;
    cl_int err;
    cl_mem m;

    if (bytes > SIZE_MAX || bytes == 0)
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl: resident arena of %llu bytes",
                          (unsigned long long)bytes);
    m = clCreateBuffer(b->ctx, CL_MEM_READ_WRITE, (size_t)bytes, NULL, &err);
    if (!m)
        return kb_err_set(eb, KB_ERR_DEVICE, "opencl: resident arena of %llu bytes: %s (%d)",
                          (unsigned long long)bytes, cl_errname(err), (int)err);
    for (size_t i = 0; i < n; i++) {
        if (mv[i].n == 0)
            continue;
        err = clEnqueueCopyBuffer(b->q, b->rarena, m, (size_t)mv[i].from, (size_t)mv[i].to,
                                  (size_t)mv[i].n, 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            clFinish(b->q);
            clReleaseMemObject(m);
            return cl_fail(eb, "moving the resident arena", err);
        }
    }
    /* Released once the copies are done (the queue keeps it until then). */
    if (b->rarena)
        clReleaseMemObject(b->rarena);
    b->rarena = m;
    b->rarena_cap = (size_t)bytes;
    return 0;
}

static int rs_copy(void *dev, uint64_t to, uint64_t from, uint64_t n, kb_errbuf *eb)
{
    clbe *b = dev;
    cl_int err;

    if (n == 0)
        return 0;
    if (from < to + n && to < from + n)
        return kb_err_set(eb, KB_ERR_INVAL, "opencl: overlapping copy in the resident arena");
    err = clEnqueueCopyBuffer(b->q, b->rarena, b->rarena, (size_t)from, (size_t)to, (size_t)n, 0,
                              NULL, NULL);
    return err == CL_SUCCESS ? 0 : cl_fail(eb, "copy in the resident arena", err);
}

/* Our own kernel, not clEnqueueFillBuffer (replay.cl's kb_fill_bytes says why). */
static int rs_fill(void *dev, uint64_t off, uint64_t n, uint8_t byte, kb_errbuf *eb)
{
    clbe *b = dev;
    cl_int err;
    cl_ulong o = off, len = n;
    cl_uint v = byte;
    /* one work-item per 16 bytes, at most 2^20 work-items (grid-stride beyond) */
    uint64_t items = (n + 15) / 16;
    size_t global = (size_t)(items < (1u << 20) ? items : (1u << 20));

    if (n == 0)
        return 0;
    global = (global + 63) / 64 * 64;
    if ((err = clSetKernelArg(b->kfill, 0, sizeof b->rarena, &b->rarena)) != CL_SUCCESS ||
        (err = clSetKernelArg(b->kfill, 1, sizeof o, &o)) != CL_SUCCESS ||
        (err = clSetKernelArg(b->kfill, 2, sizeof len, &len)) != CL_SUCCESS ||
        (err = clSetKernelArg(b->kfill, 3, sizeof v, &v)) != CL_SUCCESS ||
        (err = clEnqueueNDRangeKernel(b->q, b->kfill, 1, NULL, &global, NULL, 0, NULL, NULL)) !=
            CL_SUCCESS)
        return cl_fail(eb, "fill in the resident arena", err);
    return 0;
}

static int rs_upload(void *dev, uint64_t off, const void *src, uint64_t n, kb_errbuf *eb)
{
    clbe *b = dev;
    cl_int err;

    if (n == 0)
        return 0;
    err = clEnqueueWriteBuffer(b->q, b->rarena, CL_TRUE, (size_t)off, (size_t)n, src, 0, NULL,
                               NULL);
    return err == CL_SUCCESS ? 0 : cl_fail(eb, "upload to the resident arena", err);
}

static int rs_download(void *dev, uint64_t off, void *dst, uint64_t n, kb_errbuf *eb)
{
    clbe *b = dev;
    cl_int err;

    if (n == 0)
        return 0;
    err = clEnqueueReadBuffer(b->q, b->rarena, CL_TRUE, (size_t)off, (size_t)n, dst, 0, NULL,
                              NULL);
    return err == CL_SUCCESS ? 0 : cl_fail(eb, "download from the resident arena", err);
}

static int rs_payload(void *dev, const uint8_t *p, size_t size, size_t have, kb_errbuf *eb)
{
    clbe *b = dev;
    cl_int err;

    if (size > b->rpayload_cap) {
        size_t cap = size + size / 4;
        cl_mem m = clCreateBuffer(b->ctx, CL_MEM_READ_ONLY, cap, NULL, &err);
        if (!m)
            return kb_err_set(eb, KB_ERR_DEVICE, "opencl: payload buffer of %zu bytes: %s (%d)",
                              cap, cl_errname(err), (int)err);
        if (have > 0 && (err = clEnqueueCopyBuffer(b->q, b->rpayload, m, 0, 0, have, 0, NULL,
                                                   NULL)) != CL_SUCCESS) {
            clFinish(b->q);
            clReleaseMemObject(m);
            return cl_fail(eb, "moving the payload", err);
        }
        if (b->rpayload)
            clReleaseMemObject(b->rpayload);
        b->rpayload = m;
        b->rpayload_cap = cap;
    }
    if (size > have &&
        (err = clEnqueueWriteBuffer(b->q, b->rpayload, CL_TRUE, have, size - have, p + have, 0,
                                    NULL, NULL)) != CL_SUCCESS)
        return cl_fail(eb, "payload upload", err);
    return 0;
}

/* ---------------------------------------------------------------- device queries */

#define VQ_LOCAL 256                /* replay.cl's KB_VQ_LOCAL */
#define VQ_SLAB (VQ_LOCAL * 64)     /* columns a check work-group covers */

/* Sets kernel k's arguments 0 .. n-1: sz[i] bytes at v[i]. */
static cl_int set_args(cl_kernel k, size_t n, const size_t *sz, const void *const *v)
{
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < n && err == CL_SUCCESS; i++)
        err = clSetKernelArg(k, (cl_uint)i, sz[i], v[i]);
    return err;
}

static int vq_digest(clbe *b, const kb_vquery *q, cl_mem toff, uint64_t *out, kb_errbuf *eb)
{
    cl_ulong tb = q->tile_bytes, total = q->tile_bytes * q->ntiles;
    cl_ulong nb = total ? (total + KB_VQ_DIGEST_BLOCK - 1) / KB_VQ_DIGEST_BLOCK : 0;
    cl_mem bh = NULL;
    uint64_t *h = NULL;
    cl_int err = CL_SUCCESS;
    int rc = 0;

    if (nb == 0) {
        *out = KB_VQ_FNV_INIT;
        return 0;
    }
    size_t local = 64, global = (size_t)((nb + local - 1) / local * local);
    if (!(h = malloc((size_t)nb * sizeof *h)) ||
        !(bh = clCreateBuffer(b->ctx, CL_MEM_WRITE_ONLY, (size_t)nb * 8, NULL, &err))) {
        rc = h ? cl_fail(eb, "digest buffer", err)
               : kb_err_set(eb, KB_ERR_NOMEM, "opencl: digest of %llu blocks",
                            (unsigned long long)nb);
        goto out;
    }
    const size_t sz[] = { sizeof(cl_mem), sizeof(cl_mem), sizeof tb, sizeof total, sizeof nb,
                          sizeof(cl_mem) };
    const void *const v[] = { &b->rarena, &toff, &tb, &total, &nb, &bh };
    if ((err = set_args(b->kvq_digest, 6, sz, v)) != CL_SUCCESS ||
        (err = clEnqueueNDRangeKernel(b->q, b->kvq_digest, 1, NULL, &global, &local, 0, NULL,
                                      NULL)) != CL_SUCCESS ||
        (err = clEnqueueReadBuffer(b->q, bh, CL_TRUE, 0, (size_t)nb * 8, h, 0, NULL, NULL)) !=
            CL_SUCCESS) {
        rc = cl_fail(eb, "digest query", err);
        goto out;
    }
    *out = kb_vq_combine(h, nb);
out:
    if (bh)
        clReleaseMemObject(bh);
    free(h);
    return rc;
}

static int vq_check(clbe *b, const kb_vquery *q, cl_mem toff, void *out, kb_errbuf *eb)
{
    cl_ulong n = q->n, slab = VQ_SLAB;
    cl_uint seed = q->seed, T = q->ntiles, ord = q->ordered;
    cl_uint nslab = (cl_uint)(n ? (n + VQ_SLAB - 1) / VQ_SLAB : 1);
    cl_double accb = q->acc_bound;
    size_t cap = (size_t)(b->ncu ? b->ncu : 1) * 16, local = VQ_LOCAL;
    size_t rgroups = (size_t)((n + VQ_LOCAL - 1) / VQ_LOCAL);
    size_t nparts = (size_t)T * nslab;
    cl_mem ref = NULL, wp = NULL, part = NULL;
    kb_vq_tile *hp = NULL;
    int64_t *hw = NULL;
    cl_int err = CL_SUCCESS;
    int rc = 0;

    if (rgroups > cap)
        rgroups = cap;
    if (rgroups == 0)
        rgroups = 1;
    size_t rglobal = rgroups * local, cglobal = nparts * local;
    if (!(hp = malloc(nparts * sizeof *hp)) || !(hw = malloc(rgroups * 2 * sizeof *hw))) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "opencl: check of %u tiles", (unsigned)T);
        goto out;
    }
    if (!(ref = clCreateBuffer(b->ctx, CL_MEM_READ_WRITE, (size_t)(n ? n : 1) * 8, NULL, &err)) ||
        !(wp = clCreateBuffer(b->ctx, CL_MEM_WRITE_ONLY, rgroups * 16, NULL, &err)) ||
        !(part = clCreateBuffer(b->ctx, CL_MEM_WRITE_ONLY, nparts * sizeof *hp, NULL, &err))) {
        rc = cl_fail(eb, "check buffers", err);
        goto out;
    }
    {
        const size_t sz[] = { sizeof seed, sizeof T, sizeof n, sizeof ord, sizeof(cl_mem),
                              sizeof(cl_mem) };
        const void *const v[] = { &seed, &T, &n, &ord, &ref, &wp };
        if ((err = set_args(b->kvq_colref, 6, sz, v)) != CL_SUCCESS ||
            (err = clEnqueueNDRangeKernel(b->q, b->kvq_colref, 1, NULL, &rglobal, &local, 0,
                                          NULL, NULL)) != CL_SUCCESS) {
            rc = cl_fail(eb, "check query (references)", err);
            goto out;
        }
    }
    {
        const size_t sz[] = { sizeof(cl_mem), sizeof(cl_mem), sizeof n, sizeof slab,
                              sizeof nslab, sizeof accb, sizeof(cl_mem), sizeof(cl_mem) };
        const void *const v[] = { &b->rarena, &toff, &n, &slab, &nslab, &accb, &ref, &part };
        if ((err = set_args(b->kvq_check, 8, sz, v)) != CL_SUCCESS ||
            (err = clEnqueueNDRangeKernel(b->q, b->kvq_check, 1, NULL, &cglobal, &local, 0, NULL,
                                          NULL)) != CL_SUCCESS ||
            (err = clEnqueueReadBuffer(b->q, part, CL_FALSE, 0, nparts * sizeof *hp, hp, 0, NULL,
                                       NULL)) != CL_SUCCESS ||
            (err = clEnqueueReadBuffer(b->q, wp, CL_TRUE, 0, rgroups * 16, hw, 0, NULL, NULL)) !=
                CL_SUCCESS) {
            rc = cl_fail(eb, "check query", err);
            goto out;
        }
    }
    kb_vq_merge_check(hp, T, nslab, hw, rgroups, out);
out:
    if (rc)
        clFinish(b->q); /* nothing queued may still write into hp / hw */
    if (ref)
        clReleaseMemObject(ref);
    if (wp)
        clReleaseMemObject(wp);
    if (part)
        clReleaseMemObject(part);
    free(hp);
    free(hw);
    return rc;
}

static int rs_query(void *dev, const kb_vquery *q, const uint64_t *off, void *out,
                    kb_errbuf *eb)
{
    clbe *b = dev;
    cl_mem toff = NULL;
    cl_int err = CL_SUCCESS;
    int rc;

    if (q->kind == KB_VQ_CHECK && !b->kvq_check)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: the device has no doubles (fp64) "
                          "for a check query");
    if (q->kind != KB_VQ_CHECK && q->kind != KB_VQ_DIGEST)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: query kind %u", q->kind);
    if (q->ntiles == 0 || !b->rarena)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: a query over no resident tile");
    if (!(toff = clCreateBuffer(b->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                (size_t)q->ntiles * sizeof *off, (void *)off, &err)))
        return cl_fail(eb, "query tile table", err);
    rc = q->kind == KB_VQ_DIGEST ? vq_digest(b, q, toff, out, eb) : vq_check(b, q, toff, out, eb);
    clReleaseMemObject(toff);
    return rc;
}

static const kb_resident_ops rs_ops = {
    rs_arena, rs_copy, rs_fill, rs_upload, rs_download, rs_payload, rs_query,
};

static kb_resident *cl_resident(void *self)
{
    return ((clbe *)self)->res;
}

static const kb_backend_ops cl_ops = {
    .name = "opencl",
    .begin = cl_begin,
    .run_batch = cl_run_batch,
    .end = cl_end,
    .destroy = cl_destroy,
    .resident = cl_resident,
};

static uint64_t cl_launches_of(const kb_backend *be)
{
    if (!be || be->ops != &cl_ops || !be->self)
        return 0;
    return ((const clbe *)be->self)->launches;
}

static double cl_kernel_ms_of(const kb_backend *be)
{
    if (!be || be->ops != &cl_ops || !be->self)
        return 0.0;
    return ((const clbe *)be->self)->kernel_ms;
}

static void build_log(cl_program prog, cl_device_id dev, char *log, size_t n)
{
    size_t got = 0;

    log[0] = '\0';
    if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n - 1, log, &got) != CL_SUCCESS) {
        /* Longer than our buffer: fetch it whole and keep the start (the first error). */
        size_t need = 0;
        char *full = NULL;
        if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &need) ==
                CL_SUCCESS && (full = malloc(need + 1)) != NULL &&
            clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, need, full, NULL) ==
                CL_SUCCESS) {
            full[need] = '\0';
            snprintf(log, n, "%s", full);
        }
        free(full);
    }
    log[n - 1] = '\0';
}

/* Builds b->prog from the cached binary; 1 when it worked, 0 (nothing kept) when not. */
static int program_from_binary(clbe *b, cl_device_id dev, const char *opts, const uint8_t *bin,
                               size_t n)
{
    cl_int err, st = CL_SUCCESS;

    b->prog = clCreateProgramWithBinary(b->ctx, 1, &dev, &n, &bin, &st, &err);
    if (!b->prog)
        return 0;
    if (err != CL_SUCCESS || st != CL_SUCCESS ||
        clBuildProgram(b->prog, 1, &dev, opts, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(b->prog);
        b->prog = NULL;
        return 0;
    }
    return 1;
}

/* The built program's binary for its one device (malloc'd), or NULL. */
static uint8_t *program_binary(cl_program prog, size_t *n)
{
    size_t size = 0;
    uint8_t *bin;

    *n = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS ||
        size == 0 || (bin = malloc(size)) == NULL)
        return NULL;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) != CL_SUCCESS) {
        free(bin);
        return NULL;
    }
    *n = size;
    return bin;
}

/*
 * Builds the program for dev: from the cache's binary when mode allows and there is one that
 * the driver takes, else from source (then stored, unless bypassed). Fills b->setup's cache
 * fields; a cache that cannot be written is a note, not an error.
 */
static int build_program(clbe *b, cl_platform_id plat, cl_device_id dev, kb_cl_cache_mode mode,
                         kb_progress *pg, kb_errbuf *eb)
{
    const char *src = (const char *)kb_opencl_src;
    char opts[512], dir[3800], key[2048];
    uint8_t *bin = NULL;
    size_t nbin = 0;
    cl_int err;
    int on, rc = 0;

    build_opts(dev, opts, sizeof opts);
    on = mode != KB_CL_CACHE_BYPASS && kb_clcache_dir(dir, sizeof dir);
    b->setup.cache = KB_CL_CACHE_OFF;
    if (!on) {
        snprintf(b->setup.note, sizeof b->setup.note, "%.200s",
                 mode == KB_CL_CACHE_BYPASS ? "program cache bypassed" : dir);
    } else {
        program_key(plat, dev, opts, key, sizeof key);
        kb_clcache_path(dir, key, b->setup.cache_path, sizeof b->setup.cache_path);
        b->setup.cache = KB_CL_CACHE_MISS;
        if (mode == KB_CL_CACHE_USE && kb_clcache_load(dir, key, &bin, &nbin) == 1) {
            kb_progress_set_device(pg, KB_PROGRESS_DEV_LOAD);
            if (program_from_binary(b, dev, opts, bin, nbin)) {
                b->setup.cache = KB_CL_CACHE_HIT;
                b->setup.binary_bytes = nbin;
            } else {
                b->setup.cache = KB_CL_CACHE_REJECTED;
            }
            free(bin);
            bin = NULL;
        }
    }
    if (!b->prog) {
        b->prog = clCreateProgramWithSource(b->ctx, 1, &src, NULL, &err);
        if (!b->prog)
            return cl_fail(eb, "clCreateProgramWithSource", err);
        /* a cold start's long wait (a minute on some CPU drivers): a display says why */
        kb_progress_set_device(pg, KB_PROGRESS_DEV_BUILD);
        err = clBuildProgram(b->prog, 1, &dev, opts, NULL, NULL);
        if (err != CL_SUCCESS) {
            char log[600];
            build_log(b->prog, dev, log, sizeof log);
            return kb_err_set(eb, KB_ERR_DEVICE,
                              "opencl: building the replay kernels: %s (%d): %s",
                              cl_errname(err), (int)err, log[0] ? log : "(no build log)");
        }
        if (on) {
            kb_errbuf why;
            bin = program_binary(b->prog, &nbin);
            if (!bin)
                snprintf(b->setup.note, sizeof b->setup.note,
                         "program cache: the driver gave no binary");
            else if (kb_clcache_store(dir, key, bin, nbin, &why) != 0)
                snprintf(b->setup.note, sizeof b->setup.note, "%.250s", why.msg);
            else
                b->setup.binary_bytes = nbin;
            free(bin);
        }
    }
    kb_progress_set_device(pg, KB_PROGRESS_DEV_SETUP);
    return rc;
}

/* The kernel objects of b->prog: each backend has its own (clSetKernelArg is not
 * thread-safe on a shared kernel). */
static int make_kernels(clbe *b, cl_device_id dev, kb_errbuf *eb)
{
    cl_int err;
    int rc = 0;

    if (!(b->kfill = clCreateKernel(b->prog, "kb_fill_bytes", &err)))
        return cl_fail(eb, "kb_fill_bytes", err);
    if (!(b->kvq_digest = clCreateKernel(b->prog, "kb_vq_digest", &err)))
        return cl_fail(eb, "kb_vq_digest", err);
    /* replay.cl builds these only where doubles exist (cl_khr_fp64); else a check query is
     * answered by the host */
    b->kvq_colref = clCreateKernel(b->prog, "kb_vq_colref", &err);
    b->kvq_check = b->kvq_colref ? clCreateKernel(b->prog, "kb_vq_check", &err) : NULL;
    for (unsigned i = 0; i < CL_NKERN && rc == 0; i++) {
        size_t wg = 0, want = local_of(i);
        b->kern[i] = clCreateKernel(b->prog, kernel_names[i], &err);
        if (!b->kern[i])
            return cl_fail(eb, kernel_names[i], err);
        if (clGetKernelWorkGroupInfo(b->kern[i], dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                                     NULL) == CL_SUCCESS && wg < want)
            rc = kb_err_set(eb, KB_ERR_DEVICE,
                            "opencl: kernel %s runs at most %zu work-items per group, needs %zu",
                            kernel_names[i], wg, want);
    }
    return rc;
}

int kb_opencl_backend_trim(const kb_backend *be)
{
    clbe *b;
    if (!be || be->ops != &cl_ops || !be->self)
        return KB_ERR_INVAL;
    b = be->self;
    if (b->active || (b->res && kb_resident_broken(b->res)))
        return KB_ERR_STATE;
    if (clFinish(b->q) != CL_SUCCESS)
        return KB_ERR_DEVICE;
    collect_events(b);
    cl_mem *bufs[4] = { &b->arena, &b->payload, &b->rarena, &b->rpayload };
    size_t *caps[4] = { &b->arena_cap, &b->payload_cap, &b->rarena_cap, &b->rpayload_cap };
    for (int i = 0; i < 4; i++) {
        if (*bufs[i])
            clReleaseMemObject(*bufs[i]);
        *bufs[i] = NULL;
        *caps[i] = 0;
    }
    b->launches = 0;
    b->kernel_ms = 0.0;
    return 0;
}

const char *kb_cl_cache_state_name(kb_cl_cache_state s)
{
    switch (s) {
    case KB_CL_CACHE_MISS: return "miss";
    case KB_CL_CACHE_HIT: return "hit";
    case KB_CL_CACHE_REJECTED: return "rejected";
    default: return "off";
    }
}

static int cl_setup_of(const kb_backend *be, kb_opencl_setup *out)
{
    if (!be || be->ops != &cl_ops || !be->self || !out)
        return KB_ERR_INVAL;
    *out = ((const clbe *)be->self)->setup;
    return 0;
}

int kb_opencl_backend_create(kb_cl_want want, kb_backend *out, char *desc, size_t desc_n,
                             kb_errbuf *eb)
{
    return kb_opencl_backend_create_ex(want, KB_CL_CACHE_USE, out, desc, desc_n, eb);
}

int kb_opencl_backend_create_ex(kb_cl_want want, kb_cl_cache_mode mode, kb_backend *out,
                                char *desc, size_t desc_n, kb_errbuf *eb)
{
    return kb_opencl_backend_create_pg(want, mode, NULL, out, desc, desc_n, eb);
}

int kb_opencl_backend_create_pg(kb_cl_want want, kb_cl_cache_mode mode, kb_progress *pg,
                                kb_backend *out, char *desc, size_t desc_n, kb_errbuf *eb)
{
    double t0 = now_ms(), t1, t2;
    cl_inventory v;
    clbe *b = NULL;
    cl_int err;
    long idx;
    int rc;

    if (!out)
        return kb_err_set(eb, KB_ERR_INVAL, "opencl backend: no output");
    out->ops = NULL;
    out->self = NULL;
    if (desc && desc_n)
        desc[0] = '\0';
    if ((rc = inventory(&v)) != 0)
        return kb_err_set(eb, rc, "opencl: out of memory listing devices");
    idx = pick(&v, want);
    if (idx < 0) {
        char found[400], hint[300];
        found_list(&v, found, sizeof found);
        icd_hint(&v, hint, sizeof hint);
        rc = kb_err_set(eb, KB_ERR_DEVICE, "no OpenCL %sdevice; found: %s%s%s",
                        want == KB_CL_GPU ? "GPU " : want == KB_CL_CPU ? "CPU " : "", found,
                        hint[0] ? "; " : "", hint);
        inv_free(&v);
        return rc;
    }
    cl_device_id dev = v.devs[idx].dev;
    cl_platform_id plat = v.devs[idx].plat;
    inv_free(&v);
    t1 = now_ms();

    b = calloc(1, sizeof *b);
    if (!b || (b->res = kb_resident_create(&rs_ops, b)) == NULL) {
        free(b);
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: out of memory");
    }
    cl_context_properties props[3] = { CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0 };
    b->ctx = clCreateContext(props, 1, &dev, NULL, NULL, &err);
    if (!b->ctx) {
        rc = cl_fail(eb, "clCreateContext", err);
        goto fail;
    }
    /* Profiling costs next to nothing per launch and gives the replay's device time. */
    b->q = clCreateCommandQueue(b->ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    if (!b->q) {
        rc = cl_fail(eb, "clCreateCommandQueue", err);
        goto fail;
    }
    (void)clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof b->ncu, &b->ncu, NULL);
    t2 = now_ms();
    b->dev = dev;
    if ((rc = build_program(b, plat, dev, mode, pg, eb)) != 0 ||
        (rc = make_kernels(b, dev, eb)) != 0)
        goto fail;
    b->setup.discover_ms = t1 - t0;
    b->setup.context_ms = t2 - t1;
    b->setup.program_ms = now_ms() - t2;
    b->setup.total_ms = now_ms() - t0;
    if (desc && desc_n) {
        char dname[256], pname[256], ver[256], v1[64] = "", v2[64] = "";
        dev_str(dev, CL_DEVICE_NAME, dname, sizeof dname);
        plat_str(plat, CL_PLATFORM_NAME, pname, sizeof pname);
        dev_str(dev, CL_DEVICE_VERSION, ver, sizeof ver);
        /* "OpenCL 3.0 CUDA" -> "OpenCL 3.0" */
        if (sscanf(ver, "%63s %63s", v1, v2) == 2)
            snprintf(ver, sizeof ver, "%s %s", v1, v2);
        snprintf(b->desc, sizeof b->desc, "%s (%s, %s)", dname, pname, ver);
        snprintf(desc, desc_n, "%s", b->desc);
    }
    out->ops = &cl_ops;
    out->self = b;
    return 0;
fail:
    cl_destroy(b);
    return rc;
}

int kb_opencl_backend_clone(const kb_backend *src, kb_backend *out, char *desc, size_t desc_n,
                            kb_errbuf *eb)
{
    const clbe *s;
    clbe *b = NULL;
    double t0 = now_ms();
    cl_int err;
    int rc;

    if (!out || !src || src->ops != &cl_ops || !src->self)
        return kb_err_set(eb, KB_ERR_INVAL, "opencl clone: not an OpenCL backend");
    out->ops = NULL;
    out->self = NULL;
    s = src->self;
    b = calloc(1, sizeof *b);
    if (!b || (b->res = kb_resident_create(&rs_ops, b)) == NULL) {
        free(b);
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl backend: out of memory");
    }
    if ((err = clRetainContext(s->ctx)) != CL_SUCCESS) {
        rc = cl_fail(eb, "clRetainContext", err);
        goto fail;
    }
    b->ctx = s->ctx;
    if ((err = clRetainProgram(s->prog)) != CL_SUCCESS) {
        rc = cl_fail(eb, "clRetainProgram", err);
        goto fail;
    }
    b->prog = s->prog;
    b->dev = s->dev;
    b->ncu = s->ncu;
    b->setup = s->setup;
    memcpy(b->desc, s->desc, sizeof b->desc);
    b->q = clCreateCommandQueue(b->ctx, b->dev, CL_QUEUE_PROFILING_ENABLE, &err);
    if (!b->q) {
        rc = cl_fail(eb, "clCreateCommandQueue", err);
        goto fail;
    }
    if ((rc = make_kernels(b, b->dev, eb)) != 0)
        goto fail;
    /* the clone's own set-up: a queue and kernels on the shared context and program */
    b->setup.discover_ms = 0.0;
    b->setup.context_ms = 0.0;
    b->setup.program_ms = now_ms() - t0;
    b->setup.total_ms = b->setup.program_ms;
    if (desc && desc_n)
        snprintf(desc, desc_n, "%s", b->desc);
    out->ops = &cl_ops;
    out->self = b;
    return 0;
fail:
    cl_destroy(b);
    return rc;
}

#else /* !KBCL_HAVE_OPENCL */

int kb_opencl_backend_trim(const kb_backend *be)
{
    (void)be;
    return KB_ERR_INVAL;
}

int kb_opencl_backend_clone(const kb_backend *src, kb_backend *out, char *desc, size_t desc_n,
                            kb_errbuf *eb)
{
    (void)src;
    (void)desc;
    (void)desc_n;
    if (out) {
        out->ops = NULL;
        out->self = NULL;
    }
    return kb_err_set(eb, KB_ERR_DEVICE, "kbcl was built without OpenCL");
}

int kb_opencl_backend_create(kb_cl_want want, kb_backend *out, char *desc, size_t desc_n,
                             kb_errbuf *eb)
{
    (void)want;
    if (out) {
        out->ops = NULL;
        out->self = NULL;
    }
    if (desc && desc_n)
        desc[0] = '\0';
    return kb_err_set(eb, KB_ERR_DEVICE, "kbcl was built without OpenCL (no OpenCL device)");
}

int kb_opencl_backend_create_ex(kb_cl_want want, kb_cl_cache_mode mode, kb_backend *out,
                                char *desc, size_t desc_n, kb_errbuf *eb)
{
    (void)mode;
    return kb_opencl_backend_create(want, out, desc, desc_n, eb);
}

int kb_opencl_backend_create_pg(kb_cl_want want, kb_cl_cache_mode mode, kb_progress *pg,
                                kb_backend *out, char *desc, size_t desc_n, kb_errbuf *eb)
{
    (void)pg;
    return kb_opencl_backend_create_ex(want, mode, out, desc, desc_n, eb);
}

static int cl_setup_of(const kb_backend *be, kb_opencl_setup *out)
{
    (void)be;
    (void)out;
    return KB_ERR_INVAL;
}

const char *kb_cl_cache_state_name(kb_cl_cache_state s)
{
    (void)s;
    return "off";
}

int kb_opencl_list(char *buf, size_t n)
{
    if (buf && n)
        snprintf(buf, n, "OpenCL: not available (kbcl was built without OpenCL)\n");
    return KB_ERR_DEVICE;
}

int kb_opencl_available(kb_cl_want want)
{
    (void)want;
    return 0;
}

void kb_opencl_env(void)
{
}

static uint64_t cl_launches_of(const kb_backend *be)
{
    (void)be;
    return 0;
}

static double cl_kernel_ms_of(const kb_backend *be)
{
    (void)be;
    return 0.0;
}

#endif

/* The accessors answer for a device server's session too (kb_remote.h). */
uint64_t kb_opencl_launches(const kb_backend *be)
{
    return kb_remote_is(be) ? kb_remote_launches(be) : cl_launches_of(be);
}

double kb_opencl_kernel_ms(const kb_backend *be)
{
    return kb_remote_is(be) ? kb_remote_kernel_ms(be) : cl_kernel_ms_of(be);
}

int kb_opencl_setup_of(const kb_backend *be, kb_opencl_setup *out)
{
    return kb_remote_is(be) ? kb_remote_setup_of(be, out) : cl_setup_of(be, out);
}
