/*
 * kb_opencl_prog — the OpenCL program of the backend (kb_opencl.h): the replay kernels of the
 * embedded cl/kb_mathfn.h + cl/replay.cl, their names and work-group sizes, the build
 * options (the work sizes as -D, FP_CONTRACT OFF in the source, correctly rounded division
 * and sqrt when the device offers them, so results match kb_ref.c bit for bit), the program
 * cache's key (platform, device, driver, source hash, options), the build (from the cached
 * binary when the driver takes it, else from source, then stored) and each backend's own
 * kernel objects. Limits: one device per program; a cache that cannot be written is a note
 * in the set-up record, not an error; the build log an error carries is cut to its start.
 */
#include "kb_opencl_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KBCL_HAVE_OPENCL

#include "kb_clcache.h"
#include "kb_opencl_src.h" /* generated: kb_opencl_src[], the NUL-terminated program text */

_Static_assert(KB_REC_COPY == 0 && KB_REC_FILL == 1 && KB_REC_MATH1 == 2 && KB_REC_MATH2 == 3 &&
               KB_REC_FMA == 4 && KB_REC_CLAMP == 5 && KB_REC_SOFTMAX == 6 &&
               KB_REC_REDUCE == 7 && KB_REC_GEMM == 8 && KB_REC_TRANSPOSE == 9 &&
               KB_REC_ATTN_SOFTMAX == 10 && KB_REC_GATHER == 11 && KB_REC_DEQUANT == 12 &&
               KB_REC_GEN == 13 && KB_REC_NKINDS == 14,
               "record kinds");

const char *const kb_ocl_kernel_names[KB_OCL_NKERN] = {
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
size_t kb_ocl_local_of(unsigned kind)
{
    if (kind == KB_REC_GEMM)
        return KB_OCL_GEMM_NT;
    if (kind == KB_REC_SOFTMAX || kind == KB_REC_REDUCE || kind == KB_REC_ATTN_SOFTMAX)
        return KB_OCL_LN_LOCAL;
    return KB_OCL_EW_LOCAL;
}

/* The program's build options for dev. */
void kb_ocl_build_opts(cl_device_id dev, char *opts, size_t n)
{
    cl_device_fp_config fp = 0;

    (void)clGetDeviceInfo(dev, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
    snprintf(opts, n,
             "-cl-std=CL1.2 -DKB_EW_LOCAL=%u -DKB_EW_PER=%u -DKB_LN_LOCAL=%u -DKB_GEMM_TM=%d "
             "-DKB_GEMM_TN=%d -DKB_GEMM_TK=%d -DKB_GEMM_WM=%d -DKB_GEMM_WN=%d%s",
             KB_OCL_EW_LOCAL, KB_OCL_EW_PER, KB_OCL_LN_LOCAL, KB_GEMM_TM, KB_GEMM_TN,
             KB_GEMM_TK, KB_GEMM_WM, KB_GEMM_WN,
             (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) ? " -cl-fp32-correctly-rounded-divide-sqrt"
                                                        : "");
}

/* The cache key of the program for dev: everything its binary depends on. */
void kb_ocl_program_key(cl_platform_id plat, cl_device_id dev, const char *opts, char *key,
                        size_t n)
{
    const char *src = (const char *)kb_opencl_src;
    size_t len = strlen(src);
    char pname[256], pver[256], dname[256], dvendor[256], dver[256], drv[256];

    kb_ocl_plat_str(plat, CL_PLATFORM_NAME, pname, sizeof pname);
    kb_ocl_plat_str(plat, CL_PLATFORM_VERSION, pver, sizeof pver);
    kb_ocl_dev_str(dev, CL_DEVICE_NAME, dname, sizeof dname);
    kb_ocl_dev_str(dev, CL_DEVICE_VENDOR, dvendor, sizeof dvendor);
    kb_ocl_dev_str(dev, CL_DEVICE_VERSION, dver, sizeof dver);
    kb_ocl_dev_str(dev, CL_DRIVER_VERSION, drv, sizeof drv);
    snprintf(key, n,
             "kbcl replay program v1\nplatform: %s | %s\ndevice: %s | %s | %s\ndriver: %s\n"
             "source: %016llx %zu\noptions: %s\n",
             pname, pver, dname, dvendor, dver, drv,
             (unsigned long long)kb_clcache_hash(src, len, KB_CLCACHE_HASH_INIT), len, opts);
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
static int program_from_binary(kb_ocl_be *b, cl_device_id dev, const char *opts,
                               const uint8_t *bin, size_t n)
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
int kb_ocl_build_program(kb_ocl_be *b, cl_platform_id plat, cl_device_id dev,
                         kb_cl_cache_mode mode, kb_progress *pg, kb_errbuf *eb)
{
    const char *src = (const char *)kb_opencl_src;
    char opts[512], dir[3800], key[2048];
    uint8_t *bin = NULL;
    size_t nbin = 0;
    cl_int err;
    int on, rc = 0;

    kb_ocl_build_opts(dev, opts, sizeof opts);
    on = mode != KB_CL_CACHE_BYPASS && kb_clcache_dir(dir, sizeof dir);
    b->setup.cache = KB_CL_CACHE_OFF;
    if (!on) {
        snprintf(b->setup.note, sizeof b->setup.note, "%.200s",
                 mode == KB_CL_CACHE_BYPASS ? "program cache bypassed" : dir);
    } else {
        kb_ocl_program_key(plat, dev, opts, key, sizeof key);
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
            return kb_ocl_fail(eb, "clCreateProgramWithSource", err);
        /* a cold start's long wait (a minute on some CPU drivers): a display says why */
        kb_progress_set_device(pg, KB_PROGRESS_DEV_BUILD);
        err = clBuildProgram(b->prog, 1, &dev, opts, NULL, NULL);
        if (err != CL_SUCCESS) {
            char log[600];
            build_log(b->prog, dev, log, sizeof log);
            return kb_err_set(eb, KB_ERR_DEVICE,
                              "opencl: building the replay kernels: %s (%d): %s",
                              kb_ocl_errname(err), (int)err, log[0] ? log : "(no build log)");
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
int kb_ocl_make_kernels(kb_ocl_be *b, cl_device_id dev, kb_errbuf *eb)
{
    cl_int err;
    int rc = 0;

    if (!(b->kfill = clCreateKernel(b->prog, "kb_fill_bytes", &err)))
        return kb_ocl_fail(eb, "kb_fill_bytes", err);
    if (!(b->kvq_digest = clCreateKernel(b->prog, "kb_vq_digest", &err)))
        return kb_ocl_fail(eb, "kb_vq_digest", err);
    /* replay.cl builds these only where doubles exist (cl_khr_fp64); else a check query is
     * answered by the host */
    b->kvq_colref = clCreateKernel(b->prog, "kb_vq_colref", &err);
    b->kvq_check = b->kvq_colref ? clCreateKernel(b->prog, "kb_vq_check", &err) : NULL;
    b->kvq_coll = b->kvq_colref ? clCreateKernel(b->prog, "kb_vq_coll", &err) : NULL;
    for (unsigned i = 0; i < KB_OCL_NKERN && rc == 0; i++) {
        size_t wg = 0, want = kb_ocl_local_of(i);
        b->kern[i] = clCreateKernel(b->prog, kb_ocl_kernel_names[i], &err);
        if (!b->kern[i])
            return kb_ocl_fail(eb, kb_ocl_kernel_names[i], err);
        if (clGetKernelWorkGroupInfo(b->kern[i], dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                                     NULL) == CL_SUCCESS && wg < want)
            rc = kb_err_set(eb, KB_ERR_DEVICE,
                            "opencl: kernel %s runs at most %zu work-items per group, needs %zu",
                            kb_ocl_kernel_names[i], wg, want);
    }
    return rc;
}

#endif /* KBCL_HAVE_OPENCL */
