/*
 * kb_opencl_int — what the files of the OpenCL backend share with each other and with nobody
 * else: the backend object (kb_ocl_be), the work sizes the host and cl/replay.cl agree on, and
 * the functions one file of the backend calls in another. The files: kb_opencl_env.c (the
 * drivers' environment and device discovery), kb_opencl_prog.c (the program: build options,
 * cache key, build, kernels), kb_opencl.c (the backend: flushes, launches, create / clone /
 * trim), kb_opencl_mem.c (device-resident memory and device queries), kb_opencl_vq.c (the
 * KB_VQ_COLL query) and kb_opencl_remote.c
 * (the public accessors, answered for a device server's session too). Internal: not installed
 * (CMakeLists.txt leaves it out of include/kbcl) and included by those files only; the
 * OpenCL part exists only with KBCL_HAVE_OPENCL.
 */
#ifndef KB_OPENCL_INT_H
#define KB_OPENCL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kb_opencl.h"
#include "kb_replay.h"

/* The figures of a local OpenCL backend, for kb_opencl_remote.c's public accessors: 0 /
 * KB_ERR_INVAL for any other backend (without OpenCL: always). */
uint64_t kb_ocl_launches_of(const kb_backend *be);
double kb_ocl_kernel_ms_of(const kb_backend *be);
int kb_ocl_setup_of(const kb_backend *be, kb_opencl_setup *out);

#ifdef KBCL_HAVE_OPENCL

#include <CL/cl.h>

#include "kb_progress.h"
#include "kb_resident.h"

/* Work sizes; passed to the program as -D so host and kernels agree. KB_EW_PER and
 * KB_GEMM_* are tuning knobs (docs/phase2.md): compile-time defines of the backend. */
#define KB_OCL_EW_LOCAL 256u
#ifndef KB_EW_PER
#define KB_EW_PER 8
#endif
#define KB_OCL_EW_PER ((unsigned)KB_EW_PER)
#define KB_OCL_EW_CHUNK (KB_OCL_EW_LOCAL * KB_OCL_EW_PER)
#define KB_OCL_LN_LOCAL 64u
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
#define KB_OCL_GEMM_NT ((KB_GEMM_TM / KB_GEMM_WM) * (KB_GEMM_TN / KB_GEMM_WN))

/* Arena buffers one launch binds (replay.cl's kernel arguments 0-3): a record's operands are in
 * at most four blocks (dst and three sources), so every record fits one launch. */
#define KB_OCL_SLOTS 4u

/* The kernels of record kinds, then kb_ew: a launch group of several elementwise kinds. */
#define KB_OCL_EW_MIXED KB_REC_NKINDS
#define KB_OCL_NKERN (KB_REC_NKINDS + 1)

/* An argument table entry and a kernel launch of a flush: kb_opencl.c, the one file that
 * reads them, defines them. */
typedef struct kb_clent kb_clent;
typedef struct kb_ocl_launch kb_ocl_launch;

/* One backend: a context, queue, program and kernels on one device, its buffers and the
 * flush in progress. */
typedef struct kb_ocl_be {
    cl_context ctx;                     /* shared with clones (retained) */
    cl_device_id dev;
    cl_command_queue q;
    cl_program prog;                    /* shared with clones (retained) */
    cl_kernel kern[KB_OCL_NKERN];       /* by kind, then kb_ew (KB_OCL_EW_MIXED) */
    cl_kernel kfill;                    /* kb_fill_bytes (rs_fill) */
    cl_kernel kvq_digest, kvq_colref, kvq_check; /* device queries (rs_query); the last two
                                                    NULL without fp64 */
    cl_kernel kvq_coll;                 /* KB_VQ_COLL (kb_opencl_vq.c); NULL without fp64 */
    cl_mem arena, payload, table;       /* device buffers, grown on demand */
    size_t arena_cap, payload_cap, table_cap;
    kb_resident *res;                   /* device-resident memory (kb_resident.h): */
    cl_mem *rblk;                       /* its arena: blocks, one buffer each, end to end */
    uint64_t *rblk_end;                 /* block i: arena offsets [end[i-1] or 0, end[i]) */
    size_t nrblk, rblkcap;
    uint64_t rarena_cap;                /* the blocks' bytes */
    cl_mem rpayload;                    /* its payload */
    size_t rpayload_cap;
    cl_mem vq_arena;                    /* the block a device query reads (rs_query) */
    cl_mem cur_arena, cur_payload;      /* what the flush's launches use (host arena) */
    int cur_resident;                   /* this flush's operands are arena offsets */
    cl_uint ncu;
    uint64_t arena_bytes;
    kb_clent *tab;                      /* the flush's argument tables, in launch order */
    size_t ntab, tabcap;
    kb_ocl_launch *ln;
    size_t nln, lncap;
    cl_event *ev;                       /* one per launch of the flush (profiling) */
    size_t nev, evcap;
    int active, failed;
    uint64_t launches;
    double kernel_ms;                   /* device time of all launches, from the events */
    kb_opencl_setup setup;
    char desc[800];                     /* as kb_opencl_backend_create describes the device */
} kb_ocl_be;

/* ---- kb_opencl.c */

/* The name of an OpenCL error code ("OpenCL error" for one it does not know). */
const char *kb_ocl_errname(cl_int e);
/* KB_ERR_DEVICE with "opencl: WHAT: NAME (CODE)". */
int kb_ocl_fail(kb_errbuf *eb, const char *what, cl_int err);

/* ---- kb_opencl_env.c: discovery */

typedef struct kb_ocl_dev {
    cl_platform_id plat;
    cl_device_id dev;
    cl_device_type type;
} kb_ocl_dev;

typedef struct kb_ocl_inventory {
    cl_platform_id *plats;
    cl_uint nplats;
    kb_ocl_dev *devs;
    size_t ndevs;
    int nvidia_platform; /* a platform whose name or vendor mentions NVIDIA */
} kb_ocl_inventory;

/* All platforms and devices (the drivers' environment set first); no platform at all is not
 * an error. KB_ERR_NOMEM. */
int kb_ocl_inventory_get(kb_ocl_inventory *v);
void kb_ocl_inventory_free(kb_ocl_inventory *v);
/* Index of the device to use, or -1. */
long kb_ocl_pick(const kb_ocl_inventory *v, kb_cl_want want);
/* "PLATFORM: DEVICE (TYPE); ..." or "no OpenCL platform". */
void kb_ocl_found_list(const kb_ocl_inventory *v, char *buf, size_t n);
/* How to register an installed NVIDIA driver that no platform stands for; else "". */
void kb_ocl_icd_hint(const kb_ocl_inventory *v, char *buf, size_t n);
/* A platform's or device's string property into buf ("?" when the driver gives none). */
void kb_ocl_plat_str(cl_platform_id p, cl_platform_info what, char *buf, size_t n);
void kb_ocl_dev_str(cl_device_id d, cl_device_info what, char *buf, size_t n);

/* ---- kb_opencl_prog.c: the program */

/* The kernel names, by kind, then kb_ew. */
extern const char *const kb_ocl_kernel_names[KB_OCL_NKERN];
/* Work-items per group of a kind's kernel (replay.cl's reqd_work_group_size). */
size_t kb_ocl_local_of(unsigned kind);
/* The program's build options for dev. */
void kb_ocl_build_opts(cl_device_id dev, char *opts, size_t n);
/* The cache key of the program for dev: everything its binary depends on. */
void kb_ocl_program_key(cl_platform_id plat, cl_device_id dev, const char *opts, char *key,
                        size_t n);
/* Builds b->prog for dev, from the program cache or from source (b->setup's cache fields). */
int kb_ocl_build_program(kb_ocl_be *b, cl_platform_id plat, cl_device_id dev,
                         kb_cl_cache_mode mode, kb_progress *pg, kb_errbuf *eb);
/* b's own kernel objects of b->prog. */
int kb_ocl_make_kernels(kb_ocl_be *b, cl_device_id dev, kb_errbuf *eb);

/* ---- kb_opencl_mem.c: device-resident memory */

/* b's kb_resident, over the resident primitives and queries of kb_opencl_mem.c; NULL when
 * out of memory. */
kb_resident *kb_ocl_resident_create(kb_ocl_be *b);
/* The block holding resident arena bytes [off, off + n) (n 0: off itself) and off's offset in
 * it; KB_ERR_RANGE when they are not inside one block. */
int kb_ocl_blk_find(const kb_ocl_be *b, uint64_t off, uint64_t n, size_t *blk, uint64_t *local);
/* A new block at arena offset base (0: releasing every block first), of `bytes`. */
int kb_ocl_blk_add(kb_ocl_be *b, uint64_t base, uint64_t bytes, kb_errbuf *eb);
/* Releases every block. */
void kb_ocl_blk_release(kb_ocl_be *b);

/* ---- kb_opencl_vq.c: the KB_VQ_COLL query */

/*
 * Slabs per tile of a check over T tiles of n columns (kb_vq_check, kb_vq_coll: one work-group
 * per slab): enough work-groups to fill the device (64 per compute unit) but no slab under
 * 16 384 columns, so that few parts come back however many elements there are.
 */
cl_uint kb_ocl_vq_slabs(const kb_ocl_be *b, uint64_t n, uint32_t T);
/* Answers q (kind KB_VQ_COLL) over b's resident arena, tile t at the offset toff[t] (a device
 * buffer); out: kb_vquery_result_size(q) bytes. KB_ERR_UNSUPPORTED without fp64. */
int kb_ocl_vq_coll(kb_ocl_be *b, const kb_vquery *q, cl_mem toff, void *out, kb_errbuf *eb);

#endif /* KBCL_HAVE_OPENCL */

#endif
