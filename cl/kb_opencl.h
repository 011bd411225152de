/*
 * kb_opencl — the OpenCL Phase-2 backend (kb_backend_ops) and device discovery.
 *
 * The backend replays op-log batches with the kernels of cl/replay.cl (embedded into the
 * library at build time, built once per backend for its device): one device buffer for the
 * arena and one for the payload, uploaded in begin(); per batch one launch per record kind
 * over an argument table; all tables of a flush go up in one write and everything is enqueued
 * before the single wait in end(), which reads the arena back. Results are bit-identical to
 * the `ref` backend (kb_ref.c) for every record kind, gemm included (docs/phase2.md gives the
 * precision rules that make this hold on CPUs and GPUs alike).
 *
 * Warm start: the built program is cached on disk (kb_clcache.h), keyed by platform, device,
 * driver version, source hash and build options; a later backend on the same device loads
 * the binary (clCreateProgramWithBinary) and falls back to a source build when the driver
 * rejects it. kb_opencl_setup_of says what the set-up cost and whether the cache was hit.
 *
 * Without KBCL_HAVE_OPENCL (the library built without OpenCL) the functions exist and report
 * that no device is available.
 */
#ifndef KB_OPENCL_H
#define KB_OPENCL_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kb_replay.h"

typedef enum kb_cl_want { KB_CL_ANY, KB_CL_GPU, KB_CL_CPU } kb_cl_want;

/* How a backend uses kbcl's program cache (kb_clcache.h). */
typedef enum kb_cl_cache_mode {
    KB_CL_CACHE_USE = 0, /* load the cached binary if there is one; store after a source build */
    KB_CL_CACHE_REFRESH, /* build from source and store: a cold start that leaves it warm */
    KB_CL_CACHE_BYPASS   /* neither load nor store */
} kb_cl_cache_mode;

/* Whether the cache gave the program. */
typedef enum kb_cl_cache_state {
    KB_CL_CACHE_OFF = 0,  /* cache off (KBCL_CACHE_DIR=off, no HOME) or bypassed: source build */
    KB_CL_CACHE_MISS,     /* no entry (or REFRESH): source build, then stored */
    KB_CL_CACHE_HIT,      /* built from the cached binary */
    KB_CL_CACHE_REJECTED  /* an entry the driver refused: source build, stored again */
} kb_cl_cache_state;

const char *kb_cl_cache_state_name(kb_cl_cache_state s); /* "off", "miss", "hit", "rejected" */

/* What creating a backend cost, in wall-clock ms, and where the program came from. */
typedef struct kb_opencl_setup {
    double discover_ms;  /* platforms and devices (the ICD loader starts the drivers) */
    double context_ms;   /* context and command queue */
    double program_ms;   /* the program (cache load and binary build, or source build) + kernels */
    double total_ms;
    kb_cl_cache_state cache;
    size_t binary_bytes; /* the binary loaded or stored; 0 when none */
    char cache_path[512];/* the entry file, or "" with the cache off */
    char note[256];      /* why the cache was off, or why a store failed; else "" */
    /* The device's memory, bytes (CL_DEVICE_GLOBAL_MEM_SIZE: what a run's tensors must fit),
     * and the largest buffer it says it allocates (CL_DEVICE_MAX_MEM_ALLOC_SIZE, which drivers
     * need not hold to: an H200's says 35 GiB and allocates a 64 GiB arena). */
    uint64_t global_mem_bytes, max_alloc_bytes;
} kb_opencl_setup;

/*
 * Creates a backend on the first OpenCL device of the wanted kind (ANY: a GPU if there is
 * one, else a CPU device, else any other device) and builds the kernels for it. `desc`
 * (may be NULL) receives "DEVICE (PLATFORM, OpenCL X.Y)". Owner: caller
 * (out->ops->destroy(out->self)). Errors: KB_ERR_DEVICE naming the platforms and devices found
 * when none of the wanted kind exists, or carrying the OpenCL error / program build log;
 * KB_ERR_NOMEM.
 */
int kb_opencl_backend_create(kb_cl_want want, kb_backend *out, char *desc, size_t desc_n,
                             kb_errbuf *eb);
/* The same with a program-cache mode (kb_opencl_backend_create uses KB_CL_CACHE_USE). */
int kb_opencl_backend_create_ex(kb_cl_want want, kb_cl_cache_mode mode, kb_backend *out,
                                char *desc, size_t desc_n, kb_errbuf *eb);
/* The same, publishing into pg (kb_progress.h; NULL = nobody watches) whether the program is
 * being built from source or loaded from the cache: the set-up runs on a thread of its own
 * while Phase 1 runs, and a cold build can take a minute. */
struct kb_progress;
int kb_opencl_backend_create_pg(kb_cl_want want, kb_cl_cache_mode mode, struct kb_progress *pg,
                                kb_backend *out, char *desc, size_t desc_n, kb_errbuf *eb);

/* The set-up figures of an OpenCL backend into *out; KB_ERR_INVAL for any other backend. */
int kb_opencl_setup_of(const kb_backend *be, kb_opencl_setup *out);
/*
 * A second backend on src's device that shares its context and built program (retained) and
 * has its own command queue, kernels, buffers and resident memory: what a device server
 * (kb_devd.h) gives each session. Costs a queue and the kernel objects, no build; its set-up
 * record is src's, with program_ms/total_ms the clone's own time. Owner: the caller; the
 * context lives until src and every clone are destroyed, in any order.
 */
int kb_opencl_backend_clone(const kb_backend *src, kb_backend *out, char *desc, size_t desc_n,
                            kb_errbuf *eb);
/* Frees a backend's device buffers (arena, payload: everything of a flush's data) and zeroes
 * its launch and kernel-time counters, keeping its queue, kernels and host tables: a device
 * server keeps a few such backends for its next sessions. 0, KB_ERR_STATE inside a flush or
 * after a failed one (not reusable), KB_ERR_INVAL for another kind of backend. */
int kb_opencl_backend_trim(const kb_backend *be);

/*
 * Writes a human listing of the OpenCL platforms and devices into buf (always
 * NUL-terminated when n > 0), with the program cache's folder and, per device, whether it
 * holds this build's program for it (a backend created now would start warm), and a hint
 * when the NVIDIA OpenCL library is installed but no NVIDIA platform is registered. Returns
 * the number of devices, or KB_ERR_DEVICE when the library was built without OpenCL.
 */
int kb_opencl_list(char *buf, size_t n);

/* 1 if a device of the wanted kind exists, else 0. */
int kb_opencl_available(kb_cl_want want);

/*
 * Sets the environment the OpenCL drivers read (POCL_CACHE_DIR, kb_clcache.h) if unset. Every
 * entry point here does it first; a program that creates a backend on another thread calls it
 * before starting that thread, so that no thread changes the environment while another reads
 * it.
 */
void kb_opencl_env(void);

/*
 * Kernel launches the backend has enqueued since it was created (0 for a backend that is not
 * an OpenCL one). The replay statistic `launches` (one per kind per batch) bounds it.
 */
uint64_t kb_opencl_launches(const kb_backend *be);

/*
 * Device execution time of all those launches in ms (OpenCL profiling events: from each
 * kernel's start to its end, transfers excluded); 0 for a backend that is not an OpenCL one.
 * For throughput figures (bench-self): bytes or flops of the replayed records / this time.
 */
double kb_opencl_kernel_ms(const kb_backend *be);

#endif
