/*
 * kb_opencl_vq — the OpenCL answer to KB_VQ_COLL (kb_vquery.h): the check of a seeded
 * collective other than an all-reduce, over tiles of the resident arena, by replay.cl's
 * kb_vq_coll. Apart from kb_opencl_mem.c (which dispatches to it) so that the resident
 * memory's file stays about memory. Each work-group checks a slab of one tile and leaves its
 * kb_vq_tile part and its references' grid sum; only those parts come back (a few hundred KiB
 * at most), merged in slab order by kb_vq_merge_check into what kb_vquery_run_host gives.
 * Needs doubles (cl_khr_fp64): without them the kernel is missing and the host checks.
 */
#include "kb_opencl_int.h"

#include <stdlib.h>

#ifdef KBCL_HAVE_OPENCL

#include "kb_vquery.h"

#define VQ_LOCAL 256            /* replay.cl's KB_VQ_LOCAL */
#define VQ_SLAB_MIN (VQ_LOCAL * 64) /* columns a work-group covers at least */

cl_uint kb_ocl_vq_slabs(const kb_ocl_be *b, uint64_t n, uint32_t T)
{
    uint64_t want = (uint64_t)(b->ncu ? b->ncu : 1) * 64, per = (want + T - 1) / T;
    uint64_t most = (n + VQ_SLAB_MIN - 1) / VQ_SLAB_MIN;
    if (per > most)
        per = most;
    return (cl_uint)(per ? per : 1);
}

int kb_ocl_vq_coll(kb_ocl_be *b, const kb_vquery *q, cl_mem toff, void *out, kb_errbuf *eb)
{
    cl_uint T = q->ntiles, nslab = kb_ocl_vq_slabs(b, q->n, q->ntiles);
    cl_ulong n = q->n, slab = (n + nslab - 1) / nslab;
    cl_uint coll = q->coll, seed = q->seed, root = q->root, ord = q->ordered;
    cl_double accb = q->acc_bound;
    size_t local = VQ_LOCAL, nparts = (size_t)T * nslab, global = nparts * local;
    cl_mem part = NULL, wp = NULL;
    kb_vq_tile *hp = NULL;
    int64_t *hw = NULL;
    cl_int err = CL_SUCCESS;
    int rc = 0;

    if (!b->kvq_coll)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: the device has no doubles (fp64) "
                          "for a check query");
    if (!(hp = malloc(nparts * sizeof *hp)) || !(hw = malloc(nparts * 2 * sizeof *hw))) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "opencl: check of %u tiles", (unsigned)T);
        goto out;
    }
    if (!(part = clCreateBuffer(b->ctx, CL_MEM_WRITE_ONLY, nparts * sizeof *hp, NULL, &err)) ||
        !(wp = clCreateBuffer(b->ctx, CL_MEM_WRITE_ONLY, nparts * 16, NULL, &err))) {
        rc = kb_ocl_fail(eb, "check buffers", err);
        goto out;
    }
    const size_t sz[] = { sizeof(cl_mem), sizeof(cl_mem), sizeof n, sizeof slab, sizeof nslab,
                          sizeof accb, sizeof coll, sizeof seed, sizeof T, sizeof root,
                          sizeof ord, sizeof(cl_mem), sizeof(cl_mem) };
    const void *const v[] = { &b->vq_arena, &toff, &n, &slab, &nslab, &accb, &coll, &seed, &T,
                              &root, &ord, &part, &wp };
    for (cl_uint i = 0; i < 13 && err == CL_SUCCESS; i++)
        err = clSetKernelArg(b->kvq_coll, i, sz[i], v[i]);
    if (err != CL_SUCCESS ||
        (err = clEnqueueNDRangeKernel(b->q, b->kvq_coll, 1, NULL, &global, &local, 0, NULL,
                                      NULL)) != CL_SUCCESS ||
        (err = clEnqueueReadBuffer(b->q, part, CL_FALSE, 0, nparts * sizeof *hp, hp, 0, NULL,
                                   NULL)) != CL_SUCCESS ||
        (err = clEnqueueReadBuffer(b->q, wp, CL_TRUE, 0, nparts * 16, hw, 0, NULL, NULL)) !=
            CL_SUCCESS) {
        rc = kb_ocl_fail(eb, "check query", err);
        goto out;
    }
    kb_vq_merge_check(hp, T, nslab, hw, nparts, out);
out:
    if (rc)
        clFinish(b->q); /* nothing queued may still write into hp / hw */
    if (part)
        clReleaseMemObject(part);
    if (wp)
        clReleaseMemObject(wp);
    free(hp);
    free(hw);
    return rc;
}

#endif /* KBCL_HAVE_OPENCL */
