/*
 * kb_vquery: device queries. Each case builds the result tiles of a seeded all-reduce (right,
 * or with planted errors), places them at scattered offsets of a device-resident arena, and
 * asks every device-resident backend there is — the ref backend's resident variant (the
 * plain-C oracle) and the OpenCL one when a device exists (PoCL in CI) — for the check and
 * the digest. The check's verdict must be, field for field, the host's
 * (kb_ccl_verify_inputs_ord over the same bytes), and the digest kb_vquery_digest_host's.
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

#include "kb_ccl.h"
#include "kb_opencl.h"
#include "kb_resident.h"
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
    assert_int_equal(ops->arena(dev, at + 64, NULL, 0, &eb), 0);
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

static void run_all(kb_backend *be)
{
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(be, &cases[i]);
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
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_definition),
        cmocka_unit_test(test_query_scope),
        cmocka_unit_test(test_ref_resident),
        cmocka_unit_test(test_opencl_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
