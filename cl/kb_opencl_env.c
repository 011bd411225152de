/*
 * kb_opencl_env — the OpenCL drivers' environment and device discovery, for the OpenCL
 * backend (kb_opencl.h): before the first OpenCL call, POCL_CACHE_DIR is pointed at a
 * writable cache folder when it is unset (PoCL caches compiled kernels there); the inventory
 * of platforms and devices, the pick of a device of the wanted kind (ANY: a GPU, else a CPU,
 * else any other available device), the "found:" list and the ICD hint that an error names,
 * and the public kb_opencl_available / kb_opencl_list (which also says, per device, whether
 * the program cache holds this build's program for it). Limits: it only reads what the ICD
 * loader registers (/etc/OpenCL/vendors or OCL_ICD_FILENAMES); the NVIDIA hint knows the
 * usual library paths only; the environment is set once, unsynchronised, so a program that
 * discovers devices on several threads calls kb_opencl_env first (kb_opencl.h).
 */
#include "kb_opencl_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KBCL_HAVE_OPENCL

#include <unistd.h>

#include "kb_clcache.h"

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

void kb_ocl_inventory_free(kb_ocl_inventory *v)
{
    free(v->plats);
    free(v->devs);
    memset(v, 0, sizeof *v);
}

void kb_ocl_plat_str(cl_platform_id p, cl_platform_info what, char *buf, size_t n)
{
    if (clGetPlatformInfo(p, what, n, buf, NULL) != CL_SUCCESS)
        snprintf(buf, n, "?");
    buf[n - 1] = '\0';
}

void kb_ocl_dev_str(cl_device_id d, cl_device_info what, char *buf, size_t n)
{
    if (clGetDeviceInfo(d, what, n, buf, NULL) != CL_SUCCESS)
        snprintf(buf, n, "?");
    buf[n - 1] = '\0';
}

/* All platforms and devices; no platform at all is not an error. KB_ERR_NOMEM. */
int kb_ocl_inventory_get(kb_ocl_inventory *v)
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
        kb_ocl_plat_str(v->plats[p], CL_PLATFORM_NAME, name, sizeof name);
        kb_ocl_plat_str(v->plats[p], CL_PLATFORM_VENDOR, vendor, sizeof vendor);
        if (strstr(name, "NVIDIA") || strstr(vendor, "NVIDIA"))
            v->nvidia_platform = 1;
        if (clGetDeviceIDs(v->plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0)
            continue;
        cl_device_id *ids = calloc(nd, sizeof *ids);
        kb_ocl_dev *grown = realloc(v->devs, (v->ndevs + nd) * sizeof *grown);
        if (!ids || !grown) {
            free(ids);
            if (grown)
                v->devs = grown;
            kb_ocl_inventory_free(v);
            return KB_ERR_NOMEM;
        }
        v->devs = grown;
        if (clGetDeviceIDs(v->plats[p], CL_DEVICE_TYPE_ALL, nd, ids, &nd) != CL_SUCCESS)
            nd = 0;
        for (cl_uint i = 0; i < nd; i++) {
            kb_ocl_dev *d = &v->devs[v->ndevs++];
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
long kb_ocl_pick(const kb_ocl_inventory *v, kb_cl_want want)
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
void kb_ocl_found_list(const kb_ocl_inventory *v, char *buf, size_t n)
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
        kb_ocl_plat_str(v->plats[p], CL_PLATFORM_NAME, pname, sizeof pname);
        for (size_t i = 0; i < v->ndevs && len + 1 < n; i++) {
            char dname[128];
            if (v->devs[i].plat != v->plats[p])
                continue;
            kb_ocl_dev_str(v->devs[i].dev, CL_DEVICE_NAME, dname, sizeof dname);
            len += (size_t)snprintf(buf + len, n - len, "%s%s: %s (%s)", len ? "; " : "", pname,
                                    dname, type_name(v->devs[i].type));
            any = 1;
        }
        if (!any && len + 1 < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s: no devices", len ? "; " : "",
                                    pname);
    }
}

void kb_ocl_icd_hint(const kb_ocl_inventory *v, char *buf, size_t n)
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

int kb_opencl_available(kb_cl_want want)
{
    kb_ocl_inventory v;
    int ok;

    if (kb_ocl_inventory_get(&v) != 0)
        return 0;
    ok = kb_ocl_pick(&v, want) >= 0;
    kb_ocl_inventory_free(&v);
    return ok;
}

int kb_opencl_list(char *buf, size_t n)
{
    kb_ocl_inventory v;
    size_t len = 0;
    char hint[512];

    if (!buf || n == 0)
        return KB_ERR_INVAL;
    buf[0] = '\0';
    if (kb_ocl_inventory_get(&v) != 0) {
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
        kb_ocl_plat_str(v.plats[p], CL_PLATFORM_NAME, name, sizeof name);
        kb_ocl_plat_str(v.plats[p], CL_PLATFORM_VERSION, ver, sizeof ver);
        KB_APPEND("platform %u: %s (%s)\n", (unsigned)p, name, ver);
        for (size_t i = 0, j = 0; i < v.ndevs; i++) {
            char dname[256], dver[256], cver[256];
            cl_uint ncu = 0;
            cl_ulong mem = 0;
            if (v.devs[i].plat != v.plats[p])
                continue;
            kb_ocl_dev_str(v.devs[i].dev, CL_DEVICE_NAME, dname, sizeof dname);
            kb_ocl_dev_str(v.devs[i].dev, CL_DEVICE_VERSION, dver, sizeof dver);
            kb_ocl_dev_str(v.devs[i].dev, CL_DEVICE_OPENCL_C_VERSION, cver, sizeof cver);
            (void)clGetDeviceInfo(v.devs[i].dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof ncu, &ncu, NULL);
            (void)clGetDeviceInfo(v.devs[i].dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
            cl_ulong maxa = 0; /* the largest buffer, as the driver says (not always held to) */
            (void)clGetDeviceInfo(v.devs[i].dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof maxa, &maxa,
                                  NULL);
            KB_APPEND("  device %zu: %s [%s] %s; %s; %u compute units, %.1f GiB (buffers up to "
                      "%.1f GiB)\n", j++, dname, type_name(v.devs[i].type), dver, cver,
                      (unsigned)ncu, (double)mem / (1024.0 * 1024.0 * 1024.0),
                      (double)maxa / (1024.0 * 1024.0 * 1024.0));
            if (cache_on) {
                char opts[512], key[2048], path[4096];
                uint8_t *bin = NULL;
                size_t nbin = 0;
                kb_ocl_build_opts(v.devs[i].dev, opts, sizeof opts);
                kb_ocl_program_key(v.plats[p], v.devs[i].dev, opts, key, sizeof key);
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
    kb_ocl_icd_hint(&v, hint, sizeof hint);
    if (hint[0])
        KB_APPEND("%s\n", hint);
#undef KB_APPEND
    int count = (int)v.ndevs;
    kb_ocl_inventory_free(&v);
    return count;
}

#else /* !KBCL_HAVE_OPENCL */

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

#endif
