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

/*
 * Writes a human listing of the OpenCL platforms and devices into buf (always
 * NUL-terminated when n > 0), with a hint when the NVIDIA OpenCL library is installed but no
 * NVIDIA platform is registered. Returns the number of devices, or KB_ERR_DEVICE when the
 * library was built without OpenCL.
 */
int kb_opencl_list(char *buf, size_t n);

/* 1 if a device of the wanted kind exists, else 0. */
int kb_opencl_available(kb_cl_want want);

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
