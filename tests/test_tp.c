/*
 * Tests of tensor parallelism (tp/kb_tp): model-parallel initialisation, the per-rank weight
 * slices of column- and row-parallel layers, exact forward results against a host
 * computation, and gather_from_tp_region (its values, and its inter-SIP traffic: the ring
 * all-gather's closed form). Small machines (2 cubes x 2 PEs per SIP) keep it
 * fast; every value is a small multiple of a power of two, so results are exact in f16/f32.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_tp.h"
#include "kb_test_util.h"

enum { M = 2, IN = 8, HID = 16, OUT = 4 };

static kb_ctx *make_ctx(int sips)
{
    char count[64];
    const char *sets[] = { count, "sip.cube_mesh.width=2", "sip.cube_mesh.height=1",
                           "cube.corners=1", "cube.pe_per_corner=2",
                           "cube.hbm.size_bytes=1073741824" };
    snprintf(count, sizeof count, "system.sips.count=%d", sips);
    return kbt_ctx_new(sets, sizeof sets / sizeof sets[0], &(kb_ctx_opts){ .device = KB_DEV_REF });
}

typedef struct tp_test {
    int ws;
    int tp;                       /* the size passed to initialize_model_parallel */
    float w1[IN * HID], b1[HID], w2[HID * OUT], b2[OUT], x[M * IN];
    kb_tp_linear fc1[4], fc2[4];
    kb_tensor *h[4], *y[4], *g[4];
    int init_rc[4];
} tp_test;

static void fill(float *v, int n, int seed)
{
    for (int i = 0; i < n; i++)
        v[i] = (float)(((i * 7 + seed * 13) % 9) - 4) / 8.0f;
}

static int worker(kb_ctx *ctx, int rank, void *arg)
{
    tp_test *t = arg;
    kb_tensor *x;
    int rc;
    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||
        (rc = kb_dist_init_process_group(ctx, "ahbm", "hierarchical_allreduce")) != 0)
        return rc;
    t->init_rc[rank] = kb_tp_initialize_model_parallel(ctx, t->tp);
    if (t->init_rc[rank])
        return 0; /* the test checks the code; nothing else to do on this rank */
    if (kb_tp_world_size(ctx) != t->ws || kb_tp_get_rank(ctx) != rank)
        return KB_ERR_STATE;
    if ((rc = kb_tp_column_linear(ctx, IN, HID, t->w1, t->b1, &t->fc1[rank])) != 0 ||
        (rc = kb_tp_row_linear(ctx, HID, OUT, t->w2, t->b2, &t->fc2[rank])) != 0 ||
        (rc = kb_tp_input(ctx, &t->fc1[rank], M, t->x, &x)) != 0 ||
        (rc = kb_tp_column_forward(ctx, &t->fc1[rank], x, 0, &t->h[rank])) != 0 ||
        (rc = kb_tp_row_forward(ctx, &t->fc2[rank], t->h[rank], &t->y[rank])) != 0)
        return rc;
    return 0;
}

static int host(kb_ctx *ctx, void *arg)
{
    tp_test *t = arg;
    return kb_spawn(ctx, worker, t, t->ws);
}

static void run_mlp(int ws)
{
    tp_test *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->ws = ws;
    t->tp = ws;
    fill(t->w1, IN * HID, 1);
    fill(t->b1, HID, 2);
    fill(t->w2, HID * OUT, 3);
    fill(t->b2, OUT, 4);
    fill(t->x, M * IN, 5);
    kb_ctx *ctx = make_ctx(ws);
    if (kb_ctx_run_host(ctx, host, t) != 0)
        fail_msg("%s", kb_ctx_errmsg(ctx));
    for (int r = 0; r < ws; r++) {
        /* weight slices per rank: column-parallel (in, out/ws), row-parallel (in/ws, out) */
        assert_int_equal(t->fc1[r].local_in, IN);
        assert_int_equal(t->fc1[r].local_out, HID / ws);
        assert_int_equal(kb_tensor_rows(t->fc1[r].w), IN);
        assert_int_equal(kb_tensor_cols(t->fc1[r].w), HID / ws);
        assert_int_equal(kb_tensor_rows(t->fc2[r].w), HID / ws);
        assert_int_equal(kb_tensor_cols(t->fc2[r].w), OUT);
        assert_int_equal(kb_tensor_shard(t->fc1[r].w, 0)->sip, (unsigned)r);
        /* the weight is spread over the SIP's PEs, one column block each */
        assert_int_equal(t->fc1[r].pes * t->fc1[r].cubes, (int)kb_tensor_nshards(t->fc1[r].w));
        assert_true(kb_tensor_nshards(t->fc1[r].w) > 1);
        /* the rank's slice holds exactly columns [r*HID/ws, ...) of w1 */
        float w[IN * HID];
        assert_int_equal(kb_tensor_read(t->fc1[r].w, w), 0);
        for (int i = 0; i < IN; i++)
            for (int j = 0; j < HID / ws; j++)
                assert_true(w[i * (HID / ws) + j] == t->w1[i * HID + r * (HID / ws) + j]);
        /* h_r = x @ w1[:, slice] + b1[slice], exactly */
        float h[M * HID];
        assert_int_equal(kb_tensor_read(t->h[r], h), 0);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < HID / ws; j++) {
                double s = t->b1[r * (HID / ws) + j];
                for (int k = 0; k < IN; k++)
                    s += (double)t->x[i * IN + k] * t->w1[k * HID + r * (HID / ws) + j];
                assert_true(h[i * (HID / ws) + j] == (float)s);
            }
        /* y = h @ w2 + b2 on every PE block of every rank (all-reduced partial sums) */
        int blocks = (int)kb_tensor_rows(t->y[r]) / M;
        float *y = malloc(sizeof(float) * (size_t)(blocks * M * OUT));
        assert_non_null(y);
        assert_int_equal(kb_tensor_read(t->y[r], y), 0);
        for (int b = 0; b < blocks; b++)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < OUT; j++) {
                    double s = t->b2[j];
                    for (int k = 0; k < HID; k++) {
                        double hk = t->b1[k];
                        for (int q = 0; q < IN; q++)
                            hk += (double)t->x[i * IN + q] * t->w1[q * HID + k];
                        s += hk * t->w2[k * OUT + j];
                    }
                    float got = y[(b * M + i) * OUT + j];
                    if (fabs(got - s) > 0.5 * kb_f16_ulp((float)s))
                        fail_msg("rank %d block %d y[%d][%d] = %g, want %g", r, b, i, j, got, s);
                }
        free(y);
    }
    kb_ctx_destroy(ctx);
    free(t);
}

static void test_mlp_2(void **s) { (void)s; run_mlp(2); }
static void test_mlp_4(void **s) { (void)s; run_mlp(4); }

static void test_tp_size_mismatch(void **s)
{
    tp_test *t = calloc(1, sizeof *t);
    (void)s;
    assert_non_null(t);
    t->ws = 2;
    t->tp = 1;
    kb_ctx *ctx = make_ctx(2);
    assert_int_equal(kb_ctx_run_host(ctx, host, t), 0);
    assert_int_equal(t->init_rc[0], KB_ERR_UNSUPPORTED);
    assert_int_equal(t->init_rc[1], KB_ERR_UNSUPPORTED);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "must equal the world size 2"));
    kb_ctx_destroy(ctx);
    free(t);
}

/* gather_from_tp_region: every rank's column slice, concatenated in rank order, on every PE */
static int gather_worker(kb_ctx *ctx, int rank, void *arg)
{
    tp_test *t = arg;
    int rc, S;
    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||
        (rc = kb_dist_init_process_group(ctx, "ahbm", "hierarchical_allreduce")) != 0 ||
        (rc = kb_tp_initialize_model_parallel(ctx, t->ws)) != 0)
        return rc;
    S = kb_dist_shards_per_rank(ctx);
    float v[M * 8];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < S; j++)
            v[i * S + j] = (float)(rank * 100 + i * 10 + j);
    kb_tensor_desc d = { "local", M, S, KB_F16, kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, 0),
                         KB_MEM_HBM };
    kb_tensor *local;
    if ((rc = kb_tensor_from_host(ctx, &d, v, &local)) != 0)
        return rc;
    return kb_tp_gather_from_tp_region(ctx, local, &t->g[rank]);
}

static int gather_host(kb_ctx *ctx, void *arg)
{
    tp_test *t = arg;
    return kb_spawn(ctx, gather_worker, t, t->ws);
}

static void test_gather_from_tp_region(void **s)
{
    tp_test *t = calloc(1, sizeof *t);
    (void)s;
    assert_non_null(t);
    t->ws = 2;
    kb_ctx *ctx = make_ctx(2);
    if (kb_ctx_run_host(ctx, gather_host, t) != 0)
        fail_msg("%s", kb_ctx_errmsg(ctx));
    int S = 4, W = S * t->ws;
    /* the real ring all-gather: each rank sends (ws - 1)/ws of the gathered M x W f16 matrix
     * over inter-SIP links, and nothing else crosses them */
    uint64_t calls, bytes;
    kb_dist_traffic(ctx, KB_COLL_ALLGATHER, &calls, &bytes);
    assert_int_equal(calls, 1);
    assert_int_equal(bytes, (uint64_t)t->ws * (uint64_t)(t->ws - 1) * M * W * 2 / t->ws);
    kb_dist_traffic(ctx, KB_COLL_ALLREDUCE, &calls, &bytes);
    assert_int_equal(calls, 0);
    for (int r = 0; r < t->ws; r++) {
        assert_int_equal(kb_tensor_rows(t->g[r]), S * M);
        assert_int_equal(kb_tensor_cols(t->g[r]), W);
        float *g = malloc(sizeof(float) * (size_t)(S * M * W));
        assert_non_null(g);
        assert_int_equal(kb_tensor_read(t->g[r], g), 0);
        for (int b = 0; b < S; b++)
            for (int i = 0; i < M; i++)
                for (int c = 0; c < W; c++) {
                    int src = c / S, j = c % S;
                    assert_true(g[(b * M + i) * W + c] == (float)(src * 100 + i * 10 + j));
                }
        free(g);
    }
    kb_ctx_destroy(ctx);
    free(t);
}

/* kb_tp_reduce_blocks refuses a partial whose rows are not one block per PE of the SIP */
static int ragged_worker(kb_ctx *ctx, int rank, void *arg)
{
    int *rc_out = arg, rc;
    int S;
    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||
        (rc = kb_dist_init_process_group(ctx, "ahbm", "hierarchical_allreduce")) != 0 ||
        (rc = kb_tp_initialize_model_parallel(ctx, 2)) != 0)
        return rc;
    S = kb_dist_shards_per_rank(ctx);
    kb_tensor_desc d = { "partial", (int64_t)S * M + 1, OUT, KB_F32, kb_dist_policy(ctx),
                         KB_MEM_HBM };
    kb_tensor *partial, *y = NULL;
    if ((rc = kb_tensor_zeros(ctx, &d, &partial)) != 0)
        return rc;
    rc_out[rank] = kb_tp_reduce_blocks(ctx, partial, NULL, &y);
    return 0;
}

static int ragged_host(kb_ctx *ctx, void *arg)
{
    return kb_spawn(ctx, ragged_worker, arg, 2);
}

static void test_reduce_blocks_ragged(void **s)
{
    int rcs[2] = { 1, 1 };
    (void)s;
    kb_ctx *ctx = make_ctx(2);
    if (kb_ctx_run_host(ctx, ragged_host, rcs) != 0)
        fail_msg("%s", kb_ctx_errmsg(ctx));
    assert_int_equal(rcs[0], KB_ERR_INVAL);
    assert_int_equal(rcs[1], KB_ERR_INVAL);
    assert_non_null(strstr(kb_ctx_errmsg(ctx), "not a positive multiple of the SIP's 4 PEs"));
    kb_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_2),
        cmocka_unit_test(test_mlp_4),
        cmocka_unit_test(test_tp_size_mismatch),
        cmocka_unit_test(test_gather_from_tp_region),
        cmocka_unit_test(test_reduce_blocks_ragged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
