/*
 * kb_vquery: device queries. Each case builds the result tiles of a seeded all-reduce (CHECK)
 * or other collective (COLL: all-gather, reduce-scatter, broadcast, reduce, all-to-all,
 * send/recv; plain and ring-ordered references, roots) from the host's references (right, or
 * with planted errors), places them at scattered offsets of a device-resident arena, and
 * asks every device-resident backend there is — the ref backend's resident variant (the
 * plain-C oracle) and the OpenCL one when a device exists (PoCL in CI) — for the check and
 * the digest. The check's verdict must be, field for field, the host's
 * (kb_ccl_verify_inputs_ord over the same bytes), a COLL answer's bytes must be the oracle's
 * (kb_vquery_run_host over a host copy), and the digest kb_vquery_digest_host's. End to end,
 * `kbcl run --bench ccl --verify-data` of each collective kind on PoCL prints the verdict,
 * worst error and digest of --device ref (the host check) with nothing read back.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kb_ccl.h"
#include "kb_opencl.h"
#include "kb_resident.h"
#include "kb_test_util.h"
#include "kb_vquery.h"

typedef struct tcase {
    int ws;
    int64_t n;
    int ordered;
    int corrupt;
} tcase;

/* The all-reduce's right result (f16, tile-major), then the planted errors. */
static uint16_t *make_tiles(const tcase *c)
{
    size_t total = (size_t)c->ws * (size_t)c->n;
    float *in = malloc(total * sizeof *in);
    double *out = malloc(total * sizeof *out);
    uint16_t *raw = malloc(total * sizeof *raw);
    assert_true(in && out && raw);
    kb_ccl_inputs(in, KB_CCL_INPUT_SEED, 0, c->ws, c->n);
    if (c->ordered)
        kb_ccl_ref_ring_allreduce(in, c->ws, c->n, 0, c->n, KB_F16, KB_CCL_OP_SUM, out);
    else
        kb_ccl_ref_allreduce(in, c->ws, c->n, out);
    for (size_t k = 0; k < total; k++)
        raw[k] = kb_f32_to_f16((float)out[k]);
    if (c->corrupt) { /* on the 1/128 grid: the device gives the whole verdict */
        size_t a = (size_t)(c->ws / 2) * (size_t)c->n + (size_t)(c->n / 3);
        raw[a] = kb_f32_to_f16(kb_f16_to_f32(raw[a]) + 1.0f);
        raw[(size_t)(c->ws - 1) * (size_t)c->n] ^= 0x8000; /* sign */
    }
    if (c->corrupt == 2) { /* off it: the means are left to the host */
        raw[total - 1] = 0x7e00;    /* NaN */
        raw[3 % total] ^= 0x0001;   /* one ulp */
    }
    free(in);
    free(out);
    return raw;
}

static void assert_same_verdict(const kb_ccl_verdict *a, const kb_ccl_verdict *b, int means)
{
    assert_int_equal(a->ntiles, b->ntiles);
    assert_int_equal(a->ok_tiles, b->ok_tiles);
    assert_int_equal(a->first_bad_tile, b->first_bad_tile);
    assert_int_equal(a->first_bad_elem, b->first_bad_elem);
    assert_int_equal(a->nwrong, b->nwrong);
    /* doubles compared as bits (a NaN got value included) */
    assert_memory_equal(&a->first_got, &b->first_got, sizeof a->first_got);
    assert_memory_equal(&a->first_want, &b->first_want, sizeof a->first_want);
    if (means) {
        assert_memory_equal(&a->got_mean, &b->got_mean, sizeof a->got_mean);
        assert_memory_equal(&a->want_mean, &b->want_mean, sizeof a->want_mean);
    }
    assert_memory_equal(&a->max_abs_err, &b->max_abs_err, sizeof a->max_abs_err);
    assert_memory_equal(&a->err_bound, &b->err_bound, sizeof a->err_bound);
}

/* One case on one resident backend. */
static void run_case(kb_backend *be, const tcase *c)
{
    kb_resident *r = be->ops->resident(be->self);
    const kb_resident_ops *ops;
    void *dev;
    kb_errbuf eb = { { 0 } };
    size_t tb = (size_t)c->n * 2, total = (size_t)c->ws * tb;
    uint16_t *raw = make_tiles(c);
    uint64_t *off = malloc((size_t)c->ws * sizeof *off), at = 24, digest = 0;
    kb_vquery q, qd;
    kb_ccl_verdict vh, vd;
    void *out;

    assert_non_null(r);
    assert_non_null(off);
    kb_resident_device(r, &ops, &dev);
    assert_non_null(ops->query);
    for (int t = 0; t < c->ws; t++) { /* scattered, some only 2-aligned, in reverse order */
        off[c->ws - 1 - t] = at + (uint64_t)(t % 3) * 2;
        at += tb + 40;
    }
    assert_int_equal(ops->block(dev, 0, at + 64, &eb), 0);
    for (int t = 0; t < c->ws; t++)
        assert_int_equal(ops->upload(dev, off[t], raw + (size_t)t * (size_t)c->n, tb, &eb), 0);

    kb_ccl_ref_ord_fn ord = c->ordered ? kb_ccl_ref_ring_allreduce : NULL;
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allreduce, ord,
                                      KB_COLL_ALLREDUCE, KB_CCL_INPUT_SEED, c->ws, c->n, 0, &q),
                     1);
    out = malloc(kb_vquery_result_size(&q));
    assert_non_null(out);
    if (ops->query(dev, &q, off, out, &eb) != 0)
        fail_msg("check query: %s", eb.msg);
    int okd = kb_ccl_verdict_of_query(&q, out, &vd);
    int okh = kb_ccl_verify_inputs_ord(KB_F16, KB_CCL_OP_SUM, raw, kb_ccl_ref_allreduce, ord,
                                       KB_COLL_ALLREDUCE, KB_CCL_INPUT_SEED, c->ws, c->n, 0,
                                       q.acc_bound, &vh);
    assert_int_equal(okh, !c->corrupt);
    if (c->corrupt == 2) {
        assert_int_equal(okd, KB_ERR_UNSUPPORTED);
    } else {
        assert_int_equal(okd, okh);
    }
    assert_same_verdict(&vd, &vh, c->corrupt != 2);

    qd = (kb_vquery){ KB_VQ_DIGEST, (uint32_t)c->ws, 0, tb, 0, 0, 0.0, 0, 0 };
    if (ops->query(dev, &qd, off, &digest, &eb) != 0)
        fail_msg("digest query: %s", eb.msg);
    assert_int_equal(digest, kb_vquery_digest_host(raw, total, 2));
    free(out);
    free(off);
    free(raw);
}

static const tcase cases[] = {
    { 5, 1000, 1, 0 },  /* the ring's chain: bit for bit */
    { 5, 1000, 1, 1 },
    { 5, 1000, 1, 2 },
    { 7, 3, 1, 1 },     /* fewer elements than ranks: empty ring chunks */
    { 6, 777, 0, 0 },   /* the plain sum */
    { 3, 70001, 1, 1 }, /* digest blocks straddling tiles, odd tile bytes */
    { 8200, 4, 0, 1 },  /* more ranks than exact terms: an error bound (acc_bound > 0) */
    { 8200, 4, 0, 2 },
    { 8200, 4, 1, 0 },
};


/* ---- KB_VQ_COLL: every other collective */

typedef struct ccase {
    kb_coll_kind kind;
    int ordered; /* the ring-ordered reference (reduce-scatter, reduce) */
    int ws;
    int64_t n;
    int root;
    int corrupt;
} ccase;

/* The host's plain and ordered references of a case's kind. */
static void refs_of(const ccase *c, kb_ccl_ref_fn *ref, kb_ccl_ref_ord_fn *ord)
{
    static const kb_ccl_ref_fn plain[KB_COLL_NKINDS] = {
        [KB_COLL_ALLGATHER] = kb_ccl_ref_allgather,
        [KB_COLL_REDUCE_SCATTER] = kb_ccl_ref_reduce_scatter,
        [KB_COLL_BROADCAST] = kb_ccl_ref_broadcast,
        [KB_COLL_REDUCE] = kb_ccl_ref_reduce,
        [KB_COLL_ALLTOALL] = kb_ccl_ref_alltoall,
        [KB_COLL_SENDRECV] = kb_ccl_ref_shift_east,
    };
    *ref = plain[c->kind];
    *ord = !c->ordered                          ? NULL
           : c->kind == KB_COLL_REDUCE           ? kb_ccl_ref_ring_reduce
           : c->kind == KB_COLL_REDUCE_SCATTER   ? kb_ccl_ref_ring_reduce_scatter
                                                 : NULL;
}

/* The collective's right result (f16, tile-major; rank t's tile is the root-0 reference's
 * tile t - root of the inputs relabelled the same way, as the host check reads it), then the
 * planted errors. */
static uint16_t *make_coll_tiles(const ccase *c)
{
    size_t total = (size_t)c->ws * (size_t)c->n, n = (size_t)c->n;
    float *in = malloc(total * sizeof *in);
    double *out = malloc(total * sizeof *out);
    uint16_t *raw = malloc(total * sizeof *raw);
    kb_ccl_ref_fn ref;
    kb_ccl_ref_ord_fn ord;
    assert_true(in && out && raw);
    refs_of(c, &ref, &ord);
    for (int t = 0; t < c->ws; t++)
        kb_ccl_inputs(in + (size_t)((t - c->root + c->ws) % c->ws) * n, KB_CCL_INPUT_SEED, t,
                      1, c->n);
    if (ord)
        ord(in, c->ws, c->n, 0, c->n, KB_F16, KB_CCL_OP_SUM, out);
    else
        ref(in, c->ws, c->n, out);
    for (int t = 0; t < c->ws; t++)
        for (size_t i = 0; i < n; i++)
            raw[(size_t)t * n + i] =
                kb_f32_to_f16((float)out[(size_t)((t - c->root + c->ws) % c->ws) * n + i]);
    if (c->corrupt) { /* on the 1/128 grid: the device gives the whole verdict */
        size_t a = (size_t)(c->ws / 2) * n + n / 3;
        raw[a] = kb_f32_to_f16(kb_f16_to_f32(raw[a]) + 1.0f);
        raw[(size_t)(c->ws - 1) * n] ^= 0x8000; /* sign */
    }
    if (c->corrupt == 2) { /* off it: the means are left to the host */
        raw[total - 1] = 0x7e00;  /* NaN */
        raw[3 % total] ^= 0x0001; /* one ulp */
    }
    if (c->corrupt == 3) { /* beyond an error bound (acc_bound > 0): the root's element 1 */
        size_t a = (size_t)c->root * n + 1;
        raw[a] = kb_f32_to_f16(kb_f16_to_f32(raw[a]) + 256.0f);
    }
    free(in);
    free(out);
    return raw;
}

/* One COLL case on one resident backend: its verdict is the host's, its bytes the oracle's. */
static void run_coll_case(kb_backend *be, const ccase *c)
{
    kb_resident *r = be->ops->resident(be->self);
    const kb_resident_ops *ops;
    void *dev;
    kb_errbuf eb = { { 0 } };
    size_t tb = (size_t)c->n * 2;
    uint16_t *raw = make_coll_tiles(c);
    uint64_t *off = malloc((size_t)c->ws * sizeof *off), at = 24, digest = 0;
    kb_ccl_ref_fn ref;
    kb_ccl_ref_ord_fn ord;
    kb_vquery q, qd;
    kb_ccl_verdict vh, vd;

    assert_non_null(off);
    refs_of(c, &ref, &ord);
    kb_resident_device(r, &ops, &dev);
    for (int t = 0; t < c->ws; t++) { /* scattered, some only 2-aligned, in reverse order */
        off[c->ws - 1 - t] = at + (uint64_t)(t % 3) * 2;
        at += tb + 40;
    }
    uint8_t *host = calloc((size_t)at + 64, 1); /* the same arena, for the oracle */
    assert_non_null(host);
    assert_int_equal(ops->block(dev, 0, at + 64, &eb), 0); /* one block from offset 0 */
    for (int t = 0; t < c->ws; t++) {
        assert_int_equal(ops->upload(dev, off[t], raw + (size_t)t * (size_t)c->n, tb, &eb), 0);
        memcpy(host + off[t], raw + (size_t)t * (size_t)c->n, tb);
    }
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, ref, ord, c->kind,
                                      KB_CCL_INPUT_SEED, c->ws, c->n, c->root, &q), 1);
    assert_int_equal(q.kind, KB_VQ_COLL);
    size_t rs = kb_vquery_result_size(&q);
    assert_int_equal(rs, (size_t)c->ws * sizeof(kb_vq_tile) + sizeof(kb_vq_sums));
    void *out = malloc(rs), *want = malloc(rs);
    assert_true(out && want);
    if (ops->query(dev, &q, off, out, &eb) != 0)
        fail_msg("coll query: %s", eb.msg);
    assert_int_equal(kb_vquery_run_host(&q, host, off, want), 0);
    assert_memory_equal(out, want, rs); /* bit for bit */
    int okd = kb_ccl_verdict_of_query(&q, out, &vd);
    int okh = kb_ccl_verify_inputs_ord(KB_F16, KB_CCL_OP_SUM, raw, ref, ord, c->kind,
                                       KB_CCL_INPUT_SEED, c->ws, c->n, c->root, q.acc_bound,
                                       &vh);
    assert_int_equal(okh, !c->corrupt);
    assert_int_equal(okd, c->corrupt == 2 ? KB_ERR_UNSUPPORTED : okh);
    assert_same_verdict(&vd, &vh, c->corrupt != 2);
    if (c->corrupt == 1 || c->corrupt == 3) { /* the planted errors found where they are */
        assert_int_equal(vd.first_bad_tile, c->corrupt == 1 ? c->ws / 2 : c->root);
        assert_int_equal(vd.first_bad_elem, c->corrupt == 1 ? c->n / 3 : 1);
        assert_int_equal(vd.nwrong, c->corrupt == 1 ? 2 : 1);
        assert_int_equal(vd.ok_tiles, c->ws - (c->corrupt == 1 ? 2 : 1));
    }
    qd = (kb_vquery){ KB_VQ_DIGEST, (uint32_t)c->ws, 0, tb, 0, 0, 0.0, 0, 0 };
    if (ops->query(dev, &qd, off, &digest, &eb) != 0)
        fail_msg("digest query: %s", eb.msg);
    assert_int_equal(digest, kb_vquery_digest_host(raw, (size_t)c->ws * tb, 2));
    free(out);
    free(want);
    free(host);
    free(off);
    free(raw);
}

static const ccase ccases[] = {
    { KB_COLL_ALLGATHER, 0, 5, 1000, 0, 0 },
    { KB_COLL_ALLGATHER, 0, 5, 1000, 0, 1 },
    { KB_COLL_ALLGATHER, 0, 5, 1000, 0, 2 },
    { KB_COLL_ALLGATHER, 0, 1, 7, 0, 0 },        /* one rank */
    { KB_COLL_ALLGATHER, 0, 3, 70002, 0, 1 },    /* several slabs per tile */
    { KB_COLL_REDUCE_SCATTER, 1, 5, 1000, 0, 0 }, /* the ring's chain: bit for bit */
    { KB_COLL_REDUCE_SCATTER, 1, 5, 1000, 0, 1 },
    { KB_COLL_REDUCE_SCATTER, 0, 6, 600, 0, 1 },
    { KB_COLL_REDUCE_SCATTER, 1, 6, 600, 0, 2 },
    { KB_COLL_BROADCAST, 0, 5, 777, 2, 0 },      /* a root */
    { KB_COLL_BROADCAST, 0, 5, 777, 0, 1 },
    { KB_COLL_REDUCE, 1, 5, 777, 3, 0 },
    { KB_COLL_REDUCE, 1, 5, 777, 3, 1 },
    { KB_COLL_REDUCE, 0, 6, 500, 0, 1 },
    { KB_COLL_REDUCE, 1, 7, 3, 6, 2 },
    { KB_COLL_REDUCE, 0, 8200, 3, 5, 3 },       /* more ranks than exact terms: acc_bound > 0 */
    { KB_COLL_REDUCE, 1, 8200, 3, 0, 0 },
    { KB_COLL_ALLTOALL, 0, 4, 1000, 0, 0 },
    { KB_COLL_ALLTOALL, 0, 16, 4096, 0, 1 },
    { KB_COLL_ALLTOALL, 0, 4, 1000, 0, 2 },
    { KB_COLL_SENDRECV, 0, 5, 333, 0, 0 },
    { KB_COLL_SENDRECV, 0, 5, 333, 0, 1 },
    { KB_COLL_SENDRECV, 0, 1, 10, 0, 0 },       /* one rank keeps its own tile */
};

static void run_all(kb_backend *be)
{
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(be, &cases[i]);
    for (size_t i = 0; i < sizeof ccases / sizeof *ccases; i++)
        run_coll_case(be, &ccases[i]);
}

static void test_ref_resident(void **state)
{
    kb_backend be;
    (void)state;
    assert_int_equal(kb_ref_backend_create_resident(&be), 0);
    run_all(&be);
    be.ops->destroy(be.self);
}

static void test_opencl_device(void **state)
{
    kb_backend be;
    kb_errbuf eb = { { 0 } };
    char desc[256];
    (void)state;
    if (kb_opencl_backend_create(KB_CL_ANY, &be, desc, sizeof desc, &eb) != 0) {
        if (kb_opencl_available(KB_CL_ANY))
            fail_msg("an OpenCL device exists but its backend failed: %s", eb.msg);
        skip();
    }
    run_all(&be);
    be.ops->destroy(be.self);
}

/* The digest's definition: plain FNV-1a 64 up to one block, the blocks' digests beyond. */
static void test_digest_definition(void **state)
{
    enum { N = 3 * 65536 + 5 };
    uint8_t *b = malloc(N);
    uint64_t bh[4], h = KB_VQ_FNV_INIT;
    (void)state;
    assert_non_null(b);
    for (size_t i = 0; i < N; i++)
        b[i] = (uint8_t)(i * 2654435761u >> 13);
    assert_int_equal(kb_vquery_digest_host(b, 65536, 1), kb_vq_fnv(b, 65536, KB_VQ_FNV_INIT));
    assert_int_equal(kb_vquery_digest_host(b, 0, 1), KB_VQ_FNV_INIT);
    for (int k = 0; k < 4; k++)
        bh[k] = kb_vq_fnv(b + (size_t)k * 65536, k < 3 ? 65536 : 5, KB_VQ_FNV_INIT);
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 8; j++) {
            h ^= (bh[k] >> (8 * j)) & 0xff;
            h *= KB_VQ_FNV_PRIME;
        }
    assert_int_equal(kb_vquery_digest_host(b, N, 1), h);
    assert_int_equal(kb_vquery_digest_host(b, N, 3), h); /* threads change nothing */
    /* a pinned value of the definition */
    assert_int_equal(kb_vq_fnv("kbcl", 4, KB_VQ_FNV_INIT), UINT64_C(0x1afd4bd739fe2357));
    free(b);
}

/* The checks no device answers stay on the host. */
static void test_query_scope(void **state)
{
    kb_vquery q;
    (void)state;
    assert_int_equal(kb_ccl_vquery_of(KB_BF16, KB_CCL_OP_SUM, kb_ccl_ref_allreduce, NULL,
                                      KB_COLL_ALLREDUCE, 1, 8, 16, 0, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_MAX, kb_ccl_ref_allreduce, NULL,
                                      KB_COLL_ALLREDUCE, 1, 8, 16, 0, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allreduce, NULL,
                                      KB_COLL_REDUCE, 1, 8, 16, 1, &q), 0);
    /* any size the grid sums hold: tiles of up to 2^31 elements, 2^40 in all */
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allreduce, NULL,
                                      KB_COLL_ALLREDUCE, 1, 1024, INT64_C(1) << 20, 0, &q), 1);
    assert_int_equal(q.ordered, 0);
    assert_int_equal(q.n, UINT64_C(1) << 20);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allreduce, NULL,
                                      KB_COLL_ALLREDUCE, 1, 512, INT64_C(1) << 31, 0, &q), 1);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allreduce, NULL,
                                      KB_COLL_ALLREDUCE, 1, 2, (INT64_C(1) << 31) + 1, 0, &q),
                     0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allreduce, NULL,
                                      KB_COLL_ALLREDUCE, 1, 513, INT64_C(1) << 31, 0, &q), 0);
    /* every other kind: COLL, with its collective, order and root, at any tile length */
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_reduce,
                                      kb_ccl_ref_ring_reduce, KB_COLL_REDUCE, 7, 8, 16, 3, &q),
                     1);
    assert_int_equal(q.kind, KB_VQ_COLL);
    assert_int_equal(q.coll, KB_VQ_C_REDUCE);
    assert_int_equal(q.ordered, 1);
    assert_int_equal(q.root, 3);
    assert_int_equal(q.seed, 7);
    assert_true(q.acc_bound == 0.0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allgather, NULL,
                                      KB_COLL_ALLGATHER, 1, 256, INT64_C(1) << 32, 0, &q), 1);
    assert_int_equal(q.coll, KB_VQ_C_ALLGATHER);
    assert_int_equal(q.n, UINT64_C(1) << 32);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_reduce_scatter, NULL,
                                      KB_COLL_REDUCE_SCATTER, 1, 8200, 8200, 0, &q), 1);
    assert_true(q.acc_bound == kb_ccl_input_acc_bound(KB_COLL_REDUCE_SCATTER, 8200));
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_alltoall, NULL,
                                      KB_COLL_ALLTOALL, 1, 16, 64, 0, &q), 1);
    assert_int_equal(q.coll, KB_VQ_C_ALLTOALL);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_broadcast, NULL,
                                      KB_COLL_BROADCAST, 1, 5, 9, 4, &q), 1);
    assert_int_equal(q.coll, KB_VQ_C_BROADCAST);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_shift_east, NULL,
                                      KB_COLL_SENDRECV, 1, 5, 9, 0, &q), 1);
    assert_int_equal(q.coll, KB_VQ_C_SHIFT);
    /* not answered: chunks that do not divide the tile, a root where the kind has none, a
     * reference the device does not know, other ops and dtypes, more than 2^40 elements */
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allgather, NULL,
                                      KB_COLL_ALLGATHER, 1, 3, 10, 0, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_alltoall, NULL,
                                      KB_COLL_ALLTOALL, 1, 4, 16, 1, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_broadcast, NULL,
                                      KB_COLL_BROADCAST, 1, 4, 16, 4, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allgather, NULL,
                                      KB_COLL_BROADCAST, 1, 4, 16, 0, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_reduce,
                                      kb_ccl_ref_ring_reduce_scatter, KB_COLL_REDUCE, 1, 4, 16,
                                      0, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_MAX, kb_ccl_ref_reduce, NULL,
                                      KB_COLL_REDUCE, 1, 4, 16, 0, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F32, KB_CCL_OP_SUM, kb_ccl_ref_allgather, NULL,
                                      KB_COLL_ALLGATHER, 1, 4, 16, 0, &q), 0);
    assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, kb_ccl_ref_allgather, NULL,
                                      KB_COLL_ALLGATHER, 1, 256, INT64_C(1) << 33, 0, &q), 0);
    /* a query's own range check (what a device server applies before any device sees it) */
    q = (kb_vquery){ KB_VQ_COLL, 4, 16, 0, 1, 0, 0.0, KB_VQ_C_ALLTOALL, 0 };
    assert_int_equal(kb_vquery_valid(&q), 1);
    assert_int_equal(kb_vquery_tile_bytes(&q), 32);
    q.n = 18;
    assert_int_equal(kb_vquery_valid(&q), 0);
    q.coll = KB_VQ_C_SHIFT;
    assert_int_equal(kb_vquery_valid(&q), 1);
    q.root = 4;
    assert_int_equal(kb_vquery_valid(&q), 0);
    q.root = 0;
    q.coll = 0;
    assert_int_equal(kb_vquery_valid(&q), 0);
    assert_int_equal(kb_vquery_result_size(&q), 4 * sizeof(kb_vq_tile) + sizeof(kb_vq_sums));
}

/* The references of KB_VQ_COLL, element by element, against the host's references of the
 * same inputs (one case per collective; rooted ones at root 2). */
static void test_coll_reference(void **state)
{
    enum { WS = 4, N = 12 };
    static const kb_coll_kind kinds[] = { KB_COLL_ALLGATHER, KB_COLL_REDUCE_SCATTER,
                                          KB_COLL_BROADCAST, KB_COLL_REDUCE, KB_COLL_ALLTOALL,
                                          KB_COLL_SENDRECV };
    (void)state;
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
        for (int ordered = 0; ordered < 2; ordered++) {
            ccase c = { kinds[k], ordered, WS, N, kb_coll_rooted(kinds[k]) ? 2 : 0, 0 };
            kb_ccl_ref_fn ref;
            kb_ccl_ref_ord_fn ord;
            kb_vquery q;
            refs_of(&c, &ref, &ord);
            if (ordered && !ord)
                continue;
            uint16_t *raw = make_coll_tiles(&c);
            assert_int_equal(kb_ccl_vquery_of(KB_F16, KB_CCL_OP_SUM, ref, ord, c.kind,
                                              KB_CCL_INPUT_SEED, WS, N, c.root, &q), 1);
            for (int t = 0; t < WS; t++)
                for (int i = 0; i < N; i++)
                    assert_int_equal(kb_f32_to_f16((float)kb_vquery_coll_ref(&q, (uint32_t)t,
                                                                             (uint64_t)i)),
                                     raw[t * N + i]);
            free(raw);
        }
}

/* ---- end to end: `kbcl run --bench ccl` verified on PoCL */

/* The line of out that starts with prefix (up to its newline, into line), or fails. */
static void line_of(const char *out, const char *prefix, char *line, size_t n)
{
    const char *p = strstr(out, prefix);
    if (!p)
        fail_msg("no line starting '%s' in:\n%s", prefix, out);
    size_t len = strcspn(p, "\n");
    snprintf(line, n, "%.*s", (int)len, p);
}

/* The JSON a run wrote to file (the caller deletes it). */
static cJSON *json_of(const char *file)
{
    char *text = kbt_slurp(file);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

/*
 * One `kbcl run --bench ccl --algorithm algo --world-size ws --size 64K --verify-data [extra]`
 * on PoCL and on --device ref, both exiting rc: the verdict line (the OK line, or the FAIL
 * line with its means and first wrong element), n_wrong, the worst error and its bound and
 * the digest are the ref run's (whose host check defines them), and only the answers came
 * down: ws tiles x 64 bytes + 16 for the check, 8 for the digest, nothing read back
 * (verified_on_device 1; the host's run says 0). Phase 2 changes no timing.
 */
static void same_as_ref(const char *a, int ws, const char *extra, int rc)
{
    static char out[16384], ref[16384];
    char cmd[400], want[512], got[512], json[64];
    snprintf(cmd, sizeof cmd, "run --bench ccl --algorithm %s --world-size %d --size 64K "
             "--verify-data %s --device", a, ws, extra);
    if (kbt_kbcl(ref, sizeof ref, "%s ref --json ref_%s.json", cmd, a) != rc)
        fail_msg("%s", ref);
    if (kbt_kbcl(out, sizeof out, "%s cpu --json cpu_%s.json", cmd, a) != rc)
        fail_msg("%s", out);
    snprintf(want, sizeof want, rc ? "  [FAIL] %s (ws=%d): " : "  %s (ws=%d): %d OK", a, ws, ws);
    const char *lines[] = { want, "  max_err ", "  digest ", "  n_wrong " };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        char prefix[128];
        snprintf(prefix, sizeof prefix, "%s", lines[i]);
        line_of(ref, prefix, want, sizeof want);
        line_of(out, prefix, got, sizeof got);
        assert_string_equal(got, want);
    }
    line_of(out, "  verified_on_device ", got, sizeof got);
    assert_string_equal(got, "  verified_on_device 1");
    line_of(ref, "  verified_on_device ", got, sizeof got);
    assert_string_equal(got, "  verified_on_device 0");
    snprintf(json, sizeof json, "cpu_%s.json", a);
    cJSON *j = json_of(json);
    snprintf(json, sizeof json, "ref_%s.json", a);
    cJSON *jr = json_of(json);
    cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "replay"), "transfers");
    assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItem(j, "verified")), rc == 0);
    const char *same[] = { "max_abs_err", "err_bound", "n_wrong", "sim_time_ns", "events" };
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        cJSON *x = cJSON_GetObjectItem(j, same[i]), *y = cJSON_GetObjectItem(jr, same[i]);
        assert_true(cJSON_IsNumber(x) && cJSON_IsNumber(y));
        if (x->valuedouble != y->valuedouble)
            fail_msg("%s: %s %.17g on the device, %.17g on the host", a, same[i],
                     x->valuedouble, y->valuedouble);
    }
    assert_string_equal(cJSON_GetObjectItem(j, "data_digest")->valuestring,
                        cJSON_GetObjectItem(jr, "data_digest")->valuestring);
    assert_int_equal(cJSON_GetObjectItem(j, "verified_on_device")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(t, "upload_bytes")->valuedouble, 0);
    assert_int_equal(cJSON_GetObjectItem(t, "download_bytes")->valuedouble, ws * 64 + 16 + 8);
    cJSON_Delete(j);
    cJSON_Delete(jr);
}

/* Every collective kind but the all-reduce (KB_VQ_COLL) verified on the device, right and
 * (a reduce-scatter whose senders overwrite unread slots) wrong. */
static void test_device_collectives(void **s)
{
    char out[4096];
    (void)s;
    if (kbt_kbcl(out, sizeof out, "devices") != 0 || !strstr(out, "[CPU]"))
        skip();
    same_as_ref("ring_allgather", 8, "", 0);
    same_as_ref("ring_reducescatter", 8, "", 0);
    same_as_ref("ring_broadcast", 8, "", 0);
    same_as_ref("ring_reduce", 8, "", 0);
    same_as_ref("pairwise_alltoall", 16, "", 0);
    same_as_ref("p2p_sendrecv", 8, "", 0);
    same_as_ref("ring_reducescatter", 16,
                "--set ccl.defaults.n_slots=1 --set ccl.defaults.backpressure=false", 1);
}

static int workdir_make(void **s)
{
    (void)s;
    return kbt_workdir_make("kbcl-vquery");
}

static int workdir_remove(void **s)
{
    (void)s;
    return kbt_workdir_remove();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_definition),
        cmocka_unit_test(test_query_scope),
        cmocka_unit_test(test_coll_reference),
        cmocka_unit_test(test_ref_resident),
        cmocka_unit_test(test_opencl_device),
        cmocka_unit_test_setup_teardown(test_device_collectives, workdir_make, workdir_remove),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
