/*
 * kb_opencl_mem — the device-resident memory of an OpenCL backend: the primitives
 * kb_resident.h moves simulated memory with (a resident arena and payload buffer that persist
 * across flushes; clEnqueueCopyBuffer for growth and merges, a fill kernel for poison,
 * blocking writes and reads for uploads and pulls) and the device queries over that arena
 * (kb_vquery.h: a digest, and a check against the seeded reference values, answered by
 * replay.cl's kb_vq_* kernels so that only the answer comes back). Limits: the arena and the
 * payload only grow (by reallocation and copy); copies within the arena must not overlap; a
 * check query needs doubles (cl_khr_fp64) on the device, else it is KB_ERR_UNSUPPORTED and the
 * host answers it.
 */
#include "kb_opencl_int.h"

#include <stdlib.h>

#ifdef KBCL_HAVE_OPENCL

#include "kb_vquery.h"

static int rs_arena(void *dev, uint64_t bytes, const kb_move *mv, size_t n, kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
    cl_int err;
    cl_mem m;

    if (bytes > SIZE_MAX || bytes == 0)
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl: resident arena of %llu bytes",
                          (unsigned long long)bytes);
    m = clCreateBuffer(b->ctx, CL_MEM_READ_WRITE, (size_t)bytes, NULL, &err);
    if (!m)
        return kb_err_set(eb, KB_ERR_DEVICE, "opencl: resident arena of %llu bytes: %s (%d)",
                          (unsigned long long)bytes, kb_ocl_errname(err), (int)err);
    for (size_t i = 0; i < n; i++) {
        if (mv[i].n == 0)
            continue;
        err = clEnqueueCopyBuffer(b->q, b->rarena, m, (size_t)mv[i].from, (size_t)mv[i].to,
                                  (size_t)mv[i].n, 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            clFinish(b->q);
            clReleaseMemObject(m);
            return kb_ocl_fail(eb, "moving the resident arena", err);
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
    kb_ocl_be *b = dev;
    cl_int err;

    if (n == 0)
        return 0;
    if (from < to + n && to < from + n)
        return kb_err_set(eb, KB_ERR_INVAL, "opencl: overlapping copy in the resident arena");
    err = clEnqueueCopyBuffer(b->q, b->rarena, b->rarena, (size_t)from, (size_t)to, (size_t)n, 0,
                              NULL, NULL);
    return err == CL_SUCCESS ? 0 : kb_ocl_fail(eb, "copy in the resident arena", err);
}

/* Our own kernel, not clEnqueueFillBuffer (replay.cl's kb_fill_bytes says why). */
static int rs_fill(void *dev, uint64_t off, uint64_t n, uint8_t byte, kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
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
        return kb_ocl_fail(eb, "fill in the resident arena", err);
    return 0;
}

static int rs_upload(void *dev, uint64_t off, const void *src, uint64_t n, kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
    cl_int err;

    if (n == 0)
        return 0;
    err = clEnqueueWriteBuffer(b->q, b->rarena, CL_TRUE, (size_t)off, (size_t)n, src, 0, NULL,
                               NULL);
    return err == CL_SUCCESS ? 0 : kb_ocl_fail(eb, "upload to the resident arena", err);
}

static int rs_download(void *dev, uint64_t off, void *dst, uint64_t n, kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
    cl_int err;

    if (n == 0)
        return 0;
    err = clEnqueueReadBuffer(b->q, b->rarena, CL_TRUE, (size_t)off, (size_t)n, dst, 0, NULL,
                              NULL);
    return err == CL_SUCCESS ? 0 : kb_ocl_fail(eb, "download from the resident arena", err);
}

static int rs_payload(void *dev, const uint8_t *p, size_t size, size_t have, kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
    cl_int err;

    if (size > b->rpayload_cap) {
        size_t cap = size + size / 4;
        cl_mem m = clCreateBuffer(b->ctx, CL_MEM_READ_ONLY, cap, NULL, &err);
        if (!m)
            return kb_err_set(eb, KB_ERR_DEVICE, "opencl: payload buffer of %zu bytes: %s (%d)",
                              cap, kb_ocl_errname(err), (int)err);
        if (have > 0 && (err = clEnqueueCopyBuffer(b->q, b->rpayload, m, 0, 0, have, 0, NULL,
                                                   NULL)) != CL_SUCCESS) {
            clFinish(b->q);
            clReleaseMemObject(m);
            return kb_ocl_fail(eb, "moving the payload", err);
        }
        if (b->rpayload)
            clReleaseMemObject(b->rpayload);
        b->rpayload = m;
        b->rpayload_cap = cap;
    }
    if (size > have &&
        (err = clEnqueueWriteBuffer(b->q, b->rpayload, CL_TRUE, have, size - have, p + have, 0,
                                    NULL, NULL)) != CL_SUCCESS)
        return kb_ocl_fail(eb, "payload upload", err);
    return 0;
}

/* ---------------------------------------------------------------- device queries */

#define VQ_LOCAL 256                /* replay.cl's KB_VQ_LOCAL */

/* Sets kernel k's arguments 0 .. n-1: sz[i] bytes at v[i]. */
static cl_int set_args(cl_kernel k, size_t n, const size_t *sz, const void *const *v)
{
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < n && err == CL_SUCCESS; i++)
        err = clSetKernelArg(k, (cl_uint)i, sz[i], v[i]);
    return err;
}

static int vq_digest(kb_ocl_be *b, const kb_vquery *q, cl_mem toff, uint64_t *out, kb_errbuf *eb)
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
        rc = h ? kb_ocl_fail(eb, "digest buffer", err)
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
        rc = kb_ocl_fail(eb, "digest query", err);
        goto out;
    }
    *out = kb_vq_combine(h, nb);
out:
    if (bh)
        clReleaseMemObject(bh);
    free(h);
    return rc;
}

static int vq_check(kb_ocl_be *b, const kb_vquery *q, cl_mem toff, void *out, kb_errbuf *eb)
{
    cl_uint seed = q->seed, T = q->ntiles, ord = q->ordered;
    cl_uint nslab = kb_ocl_vq_slabs(b, q->n, T); /* a few parts per tile come back */
    cl_ulong n = q->n, slab = (n + nslab - 1) / nslab;
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
        rc = kb_ocl_fail(eb, "check buffers", err);
        goto out;
    }
    {
        const size_t sz[] = { sizeof seed, sizeof T, sizeof n, sizeof ord, sizeof(cl_mem),
                              sizeof(cl_mem) };
        const void *const v[] = { &seed, &T, &n, &ord, &ref, &wp };
        if ((err = set_args(b->kvq_colref, 6, sz, v)) != CL_SUCCESS ||
            (err = clEnqueueNDRangeKernel(b->q, b->kvq_colref, 1, NULL, &rglobal, &local, 0,
                                          NULL, NULL)) != CL_SUCCESS) {
            rc = kb_ocl_fail(eb, "check query (references)", err);
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
            rc = kb_ocl_fail(eb, "check query", err);
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
    kb_ocl_be *b = dev;
    cl_mem toff = NULL;
    cl_int err = CL_SUCCESS;
    int rc;

    if (q->kind == KB_VQ_CHECK && !b->kvq_check)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: the device has no doubles (fp64) "
                          "for a check query");
    if (q->kind != KB_VQ_CHECK && q->kind != KB_VQ_DIGEST && q->kind != KB_VQ_COLL)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: query kind %u", q->kind);
    if (q->ntiles == 0 || !b->rarena)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: a query over no resident tile");
    if (!(toff = clCreateBuffer(b->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                (size_t)q->ntiles * sizeof *off, (void *)off, &err)))
        return kb_ocl_fail(eb, "query tile table", err);
    rc = q->kind == KB_VQ_DIGEST ? vq_digest(b, q, toff, out, eb)
         : q->kind == KB_VQ_COLL ? kb_ocl_vq_coll(b, q, toff, out, eb) /* kb_opencl_vq.c */
                                 : vq_check(b, q, toff, out, eb);
    clReleaseMemObject(toff);
    return rc;
}

static const kb_resident_ops rs_ops = {
    rs_arena, rs_copy, rs_fill, rs_upload, rs_download, rs_payload, rs_query,
};

kb_resident *kb_ocl_resident_create(kb_ocl_be *b)
{
    return kb_resident_create(&rs_ops, b);
}

#endif /* KBCL_HAVE_OPENCL */
