/*
 * kb_opencl_mem — the device-resident memory of an OpenCL backend: the primitives
 * kb_resident.h moves simulated memory with (a resident arena of blocks, one buffer each, that
 * persist across flushes and never move, and a payload buffer; clEnqueueCopyBuffer for merges,
 * a fill kernel for poison, blocking writes and reads for uploads and pulls) and the device
 * queries over that arena (kb_vquery.h: a digest, and a check against the seeded reference
 * values, answered by replay.cl's kb_vq_* kernels so that only the answer comes back). Every
 * primitive maps arena offsets to (block, offset in it) and refuses a range that is not
 * inside one block. Limits: the payload only grows (by reallocation and copy); copies within
 * one block must not overlap; a query's tiles lie in one block; a check query needs doubles
 * (cl_khr_fp64) on the device, else it is KB_ERR_UNSUPPORTED and the host answers it.
 */
#include "kb_opencl_int.h"

#include <stdlib.h>

#ifdef KBCL_HAVE_OPENCL

#include "kb_vquery.h"

int kb_ocl_blk_find(const kb_ocl_be *b, uint64_t off, uint64_t n, size_t *blk, uint64_t *local)
{
    size_t lo = 0, hi = b->nrblk;
    while (lo < hi) { /* the first block ending after off */
        size_t mid = lo + (hi - lo) / 2;
        if (b->rblk_end[mid] <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == b->nrblk || n > b->rblk_end[lo] - off)
        return KB_ERR_RANGE;
    *blk = lo;
    *local = off - (lo ? b->rblk_end[lo - 1] : 0);
    return 0;
}

void kb_ocl_blk_release(kb_ocl_be *b)
{
    for (size_t i = 0; i < b->nrblk; i++)
        clReleaseMemObject(b->rblk[i]); /* the queue keeps it until its commands are done */
    b->nrblk = 0;
    b->rarena_cap = 0;
}

int kb_ocl_blk_add(kb_ocl_be *b, uint64_t base, uint64_t bytes, kb_errbuf *eb)
{
    cl_int err;
    cl_mem m;

    if (base == 0)
        kb_ocl_blk_release(b);
    if (base != b->rarena_cap)
        return kb_err_set(eb, KB_ERR_STATE, "opencl: resident block at %llu, the arena has %llu",
                          (unsigned long long)base, (unsigned long long)b->rarena_cap);
    if (bytes > SIZE_MAX || bytes == 0)
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl: resident block of %llu bytes",
                          (unsigned long long)bytes);
    if (b->nrblk == b->rblkcap) {
        size_t c = b->rblkcap ? 2 * b->rblkcap : 8;
        cl_mem *nm = realloc(b->rblk, c * sizeof *nm);
        uint64_t *ne = nm ? realloc(b->rblk_end, c * sizeof *ne) : NULL;
        if (nm)
            b->rblk = nm;
        if (!ne)
            return kb_err_set(eb, KB_ERR_NOMEM, "opencl: out of memory adding a block");
        b->rblk_end = ne;
        b->rblkcap = c;
    }
    m = clCreateBuffer(b->ctx, CL_MEM_READ_WRITE, (size_t)bytes, NULL, &err);
    /* NVIDIA allocates a buffer at its first use: a blocking 1-byte write makes a block the
     * device cannot hold fail here, where kb_resident asks for a smaller one, rather than at
     * the flush's first fill (the byte is arbitrary, like the rest of a fresh block) */
    if (m && (err = clEnqueueWriteBuffer(b->q, m, CL_TRUE, 0, 1, &(cl_uchar){ 0 }, 0, NULL,
                                         NULL)) != CL_SUCCESS) {
        clReleaseMemObject(m);
        m = NULL;
    }
    if (!m)
        return kb_err_set(eb, KB_ERR_DEVICE, "opencl: resident block of %llu bytes: %s (%d)",
                          (unsigned long long)bytes, kb_ocl_errname(err), (int)err);
    b->rblk[b->nrblk] = m;
    b->rblk_end[b->nrblk++] = base + bytes;
    b->rarena_cap = base + bytes;
    return 0;
}

static int rs_block(void *dev, uint64_t base, uint64_t bytes, kb_errbuf *eb)
{
    return kb_ocl_blk_add(dev, base, bytes, eb);
}

/* [off, off + n) as a block's buffer and offset; KB_ERR_RANGE naming `what` otherwise. */
static int at(const kb_ocl_be *b, const char *what, uint64_t off, uint64_t n, cl_mem *m,
              size_t *local, kb_errbuf *eb)
{
    size_t k;
    uint64_t lo;
    if (kb_ocl_blk_find(b, off, n, &k, &lo) != 0)
        return kb_err_set(eb, KB_ERR_RANGE, "opencl: %s [%llu, +%llu) not inside one block of "
                          "the resident arena (%llu bytes)", what, (unsigned long long)off,
                          (unsigned long long)n, (unsigned long long)b->rarena_cap);
    *m = b->rblk[k];
    *local = (size_t)lo;
    return 0;
}

static int rs_copy(void *dev, uint64_t to, uint64_t from, uint64_t n, kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
    cl_mem mt, mf;
    size_t lt, lf;
    cl_int err;
    int rc;

    if (n == 0)
        return 0;
    if (from < to + n && to < from + n)
        return kb_err_set(eb, KB_ERR_INVAL, "opencl: overlapping copy in the resident arena");
    if ((rc = at(b, "copy to", to, n, &mt, &lt, eb)) != 0 ||
        (rc = at(b, "copy from", from, n, &mf, &lf, eb)) != 0)
        return rc;
    err = clEnqueueCopyBuffer(b->q, mf, mt, lf, lt, (size_t)n, 0, NULL, NULL);
    return err == CL_SUCCESS ? 0 : kb_ocl_fail(eb, "copy in the resident arena", err);
}

/* Our own kernel, not clEnqueueFillBuffer (replay.cl's kb_fill_bytes says why). */
static int rs_fill(void *dev, uint64_t off, uint64_t n, uint8_t byte, kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
    cl_int err;
    cl_ulong o, len = n;
    cl_uint v = byte;
    /* one work-item per 16 bytes, at most 2^20 work-items (grid-stride beyond) */
    uint64_t items = (n + 15) / 16;
    size_t global = (size_t)(items < (1u << 20) ? items : (1u << 20)), lo;
    cl_mem m;
    int rc;

    if (n == 0)
        return 0;
    if ((rc = at(b, "fill", off, n, &m, &lo, eb)) != 0)
        return rc;
    o = lo;
    global = (global + 63) / 64 * 64;
    if ((err = clSetKernelArg(b->kfill, 0, sizeof m, &m)) != CL_SUCCESS ||
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
    cl_mem m;
    size_t lo;
    cl_int err;
    int rc;

    if (n == 0)
        return 0;
    if ((rc = at(b, "upload", off, n, &m, &lo, eb)) != 0)
        return rc;
    err = clEnqueueWriteBuffer(b->q, m, CL_TRUE, lo, (size_t)n, src, 0, NULL, NULL);
    return err == CL_SUCCESS ? 0 : kb_ocl_fail(eb, "upload to the resident arena", err);
}

static int rs_download(void *dev, uint64_t off, void *dst, uint64_t n, kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
    cl_mem m;
    size_t lo;
    cl_int err;
    int rc;

    if (n == 0)
        return 0;
    if ((rc = at(b, "download", off, n, &m, &lo, eb)) != 0)
        return rc;
    err = clEnqueueReadBuffer(b->q, m, CL_TRUE, lo, (size_t)n, dst, 0, NULL, NULL);
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
    const void *const v[] = { &b->vq_arena, &toff, &tb, &total, &nb, &bh };
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
        const void *const v[] = { &b->vq_arena, &toff, &n, &slab, &nslab, &accb, &ref, &part };
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

/* The tiles' offsets in the one block that holds them all (b->vq_arena, which the query
 * kernels read), into *loc (the caller frees it); KB_ERR_RANGE when they are not in one. */
static int tiles_in_block(kb_ocl_be *b, const kb_vquery *q, const uint64_t *off, uint64_t **loc,
                          kb_errbuf *eb)
{
    uint64_t per = q->kind == KB_VQ_CHECK ? q->n * 2 : q->tile_bytes;
    size_t k0 = 0, k;

    if (!(*loc = malloc((size_t)q->ntiles * sizeof **loc)))
        return kb_err_set(eb, KB_ERR_NOMEM, "opencl: query of %u tiles", (unsigned)q->ntiles);
    for (uint32_t t = 0; t < q->ntiles; t++) {
        if (kb_ocl_blk_find(b, off[t], per, &k, &(*loc)[t]) != 0 || (t > 0 && k != k0)) {
            free(*loc);
            *loc = NULL;
            return kb_err_set(eb, KB_ERR_RANGE, "opencl: query tile %u not in the block of "
                              "tile 0", (unsigned)t);
        }
        k0 = k;
    }
    b->vq_arena = b->rblk[k0];
    return 0;
}

static int rs_query(void *dev, const kb_vquery *q, const uint64_t *off, void *out,
                    kb_errbuf *eb)
{
    kb_ocl_be *b = dev;
    cl_mem toff = NULL;
    cl_int err = CL_SUCCESS;
    uint64_t *loc;
    int rc;

    if (q->kind == KB_VQ_CHECK && !b->kvq_check)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: the device has no doubles (fp64) "
                          "for a check query");
    if (q->kind != KB_VQ_CHECK && q->kind != KB_VQ_DIGEST && q->kind != KB_VQ_COLL)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: query kind %u", q->kind);
    if (q->ntiles == 0 || b->nrblk == 0)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "opencl: a query over no resident tile");
    if ((rc = tiles_in_block(b, q, off, &loc, eb)) != 0)
        return rc;
    if (!(toff = clCreateBuffer(b->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                (size_t)q->ntiles * sizeof *loc, loc, &err))) {
        free(loc);
        return kb_ocl_fail(eb, "query tile table", err);
    }
    free(loc);
    rc = q->kind == KB_VQ_DIGEST ? vq_digest(b, q, toff, out, eb)
         : q->kind == KB_VQ_COLL ? kb_ocl_vq_coll(b, q, toff, out, eb) /* kb_opencl_vq.c */
                                 : vq_check(b, q, toff, out, eb);
    clReleaseMemObject(toff);
    return rc;
}

static const kb_resident_ops rs_ops = {
    rs_block, rs_copy, rs_fill, rs_upload, rs_download, rs_payload, rs_query,
};

kb_resident *kb_ocl_resident_create(kb_ocl_be *b)
{
    return kb_resident_create(&rs_ops, b);
}

#endif /* KBCL_HAVE_OPENCL */
