/*
 * test_tl_q — number formats and 2:4 sparsity (kb_tl_q): format names and bits, 2:4 pruning
 * with ties, a small quantized / sparse gemm per format run on the reference backend and
 * compared bit for bit with a host computation from kb_qact_host_values and
 * kb_qweight_host_values (the same f32 gemm, k ascending), the quantization error against
 * the f32 product within each format's stated tolerance (docs/formats.md), the same runs on
 * the OpenCL backend (PoCL) giving identical bytes, tl_dot_q's PE_GEMM occupancy equal to
 * kb_qgemm_ns for local operands, the DMA bytes per format for a weight in HBM, and the
 * errors (K not a multiple of 32 for MXINT8, of 4 for 2:4).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_machine.h"
#include "kb_oplog.h"
#include "kb_runtime.h"
#include "kb_tl.h"
#include "kb_tl_q.h"
#include "kb_test_util.h"

static const char *const small_machine[] = {
    "system.sips.count=1",
    "sip.cube_mesh.width=2",
    "sip.cube_mesh.height=1",
    "cube.pe_per_corner=1",
    "cube.hbm.size_bytes=25769803776",
};

/* The kernels' tensors: x, the weight's parts (kb_qweight; 0 where it has none) and y. The
 * test's case travels apart, as a host address in kb_kargs.i[CASE_ARG]: it is not plain data
 * for the typed block. */
typedef struct q_args {
    kb_va x, q, scale, meta, y;
} q_args;
#define CASE_ARG 7

static q_args q_args_of(kb_tensor *x, const kb_qweight *w, kb_tensor *y)
{
    return (q_args){ .x = kb_tensor_va(x), .q = kb_tensor_va(w->q),
                     .scale = w->scale ? kb_tensor_va(w->scale) : 0,
                     .meta = w->meta ? kb_tensor_va(w->meta) : 0, .y = kb_tensor_va(y) };
}

typedef struct qcase {
    kb_qfmt fmt;
    int sparse, local;
    int64_t m, k, n;
    const float *x, *w;
    float *y;
    kb_time busy;       /* PE_GEMM occupancy of the tl_dot_q */
    uint64_t dma;       /* PE_DMA bytes of the tl_dot_q */
} qcase;

/* Bytes every DMA channel of the PE has carried. */
static uint64_t dma_bytes(const kb_pe_hw *pe)
{
    uint64_t b = 0;
    for (int i = 0; i < pe->ndma; i++)
        b += pe->dma[i].bytes;
    return b;
}

static void k_q(kb_tl *tl, const kb_kargs *ka)
{
    qcase *c = (qcase *)(intptr_t)ka->i[CASE_ARG];
    const q_args *a = KB_KARGS_GET(ka, q_args);
    uint32_t m = (uint32_t)c->m, k = (uint32_t)c->k, n = (uint32_t)c->n;
    kb_val x = tl_load(tl, a->x, KB_SHAPE2(m, k), KB_F32);
    kb_qref w = tl_qref(tl, a->q, a->scale, a->meta, k, n, c->fmt, c->sparse);
    kb_pe_hw *pe = tl_pe(tl);

    if (c->local) { /* the parts in this PE's scratch: no streaming */
        w.q = tl_load(tl, a->q, KB_SHAPE2(w.q.rows, w.q.cols), (kb_dtype)w.q.dtype);
        if (a->scale)
            w.scale = tl_load(tl, a->scale, KB_SHAPE2(w.scale.rows, w.scale.cols),
                              (kb_dtype)w.scale.dtype);
        if (a->meta)
            w.meta = tl_load(tl, a->meta, KB_SHAPE2(w.meta.rows, w.meta.cols), KB_I8);
    }
    kb_time busy0 = pe->gemm.busy;
    uint64_t dma0 = dma_bytes(pe);
    kb_val y = tl_dot_q(tl, x, w);
    c->busy = pe->gemm.busy - busy0;
    c->dma = dma_bytes(pe) - dma0;
    tl_store(tl, a->y, y);
}

static int h_q(kb_ctx *ctx, void *arg)
{
    qcase *c = arg;
    kb_dp_policy one = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1);
    kb_tensor_desc dx = { "x", c->m, c->k, KB_F32, one, KB_MEM_HBM };
    kb_tensor_desc dy = { "y", c->m, c->n, KB_F32, one, KB_MEM_HBM };
    kb_fill fw = kb_fill_array(c->w, c->n);
    kb_tensor *xt = NULL, *yt = NULL;
    kb_qweight qw;
    q_args qa;
    kb_kargs a;
    kb_grid g = { 1, 1, 1, -1 };
    int rc;

    memset(&a, 0, sizeof a);
    if ((rc = kb_tensor_from_host(ctx, &dx, c->x, &xt)) != 0)
        return rc;
    if ((rc = kb_tensor_empty(ctx, &dy, &yt)) != 0)
        return rc;
    if ((rc = kb_qweight_create(ctx, "w", c->k, c->n, c->fmt, c->sparse, one, &fw, &qw)) != 0)
        return rc;
    qa = q_args_of(xt, &qw, yt);
    KB_KARGS_PUT(&a, qa);
    a.i[CASE_ARG] = (int64_t)(intptr_t)c;
    if ((rc = kb_launch(ctx, "qgemm", k_q, &a, &g)) != 0)
        return rc;
    if (c->y && (rc = kb_tensor_read(yt, c->y)) != 0)
        return rc;
    kb_qweight_free(&qw);
    kb_tensor_free(xt);
    kb_tensor_free(yt);
    return 0;
}

/* Runs one case on a fresh context of device dev; 0 or the run's error (message printed). */
static int run_case(qcase *c, kb_device_kind dev)
{
    kb_config cfg;
    kb_ctx *ctx;
    kb_errbuf eb;
    int rc;

    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    if (kb_ctx_create(&cfg, &(kb_ctx_opts){ .device = dev }, &ctx, &eb) != 0)
        return -1000; /* no such device here */
    rc = kb_ctx_run_host(ctx, h_q, c);
    if (rc)
        print_message("run: %s\n", kb_ctx_errmsg(ctx));
    kb_ctx_destroy(ctx);
    return rc;
}

static void rand_fill(float *v, size_t n, uint64_t seed, float lo, float hi)
{
    kbt_rng g = { seed };
    for (size_t i = 0; i < n; i++)
        v[i] = kbt_rng_float(&g, lo, hi);
}

/* ------------------------------------------------------------------ tests */

static void test_names_bits(void **state)
{
    (void)state;
    for (int f = 0; f < KB_QF_COUNT; f++)
        assert_int_equal(kb_qfmt_from_name(kb_qfmt_name((kb_qfmt)f)), f);
    assert_string_equal(kb_qfmt_name(KB_QF_MXINT8), "mxint8");
    assert_string_equal(kb_qfmt_name(KB_QF_FP8E4M3), "fp8e4m3");
    assert_int_equal(kb_qfmt_from_name("int4"), -1);
    assert_int_equal(kb_qfmt_from_name(NULL), -1);
    assert_true(kb_qfmt_bits(KB_QF_F16) == 16.0 && kb_qfmt_bits(KB_QF_BF16) == 16.0);
    assert_true(kb_qfmt_bits(KB_QF_INT8) == 8.0 && kb_qfmt_bits(KB_QF_FP8E5M2) == 8.0);
    assert_true(kb_qfmt_bits(KB_QF_MXINT8) == 8.25);
    assert_int_equal(kb_qfmt_dtype(KB_QF_MXINT8), KB_I8);
    assert_int_equal(kb_qfmt_dtype(KB_QF_FP8E4M3), KB_FP8E4M3);
}

static void test_prune(void **state)
{
    /* 8 x 2 row-major; column 0: 1 -5 3 2 | 0 0 7 -7 (a magnitude tie: the lower index
     * comes first), column 1: 1 1 2 2 | 3 0 0 0 (ties: the lower indices are kept) */
    float w[16] = { 1, 1, -5, 1, 3, 2, 2, 2, 0, 3, 0, 0, 7, 0, -7, 0 };
    const float want[16] = { 0, 0, -5, 0, 3, 2, 0, 2, 0, 3, 0, 0, 7, 0, -7, 0 };
    (void)state;
    kb_prune_2_4(w, 8, 2);
    assert_memory_equal(w, want, sizeof w);
}

/* Relative tolerance of a quantized gemm against the f32 product, as a fraction of
 * sum_k |x||w| (docs/formats.md): both operands' relative rounding errors add. */
static double fmt_tol(kb_qfmt f)
{
    switch (f) {
    case KB_QF_F16: return 1e-3;          /* weights only: 2^-11 */
    case KB_QF_BF16: return 8e-3;         /* 2^-8 */
    case KB_QF_INT8: return 0.03;         /* half a step of max/127 per operand; an outlier
                                           * token (x[7] = 40) makes its row's steps coarse */
    case KB_QF_MXINT8: return 2.0 / 127.0; /* half a step of 1/64 of a power of two >= max/2,
                                            * per 32-block: the outlier stays in its block */
    case KB_QF_FP8E4M3: return 2.0 * 0x1p-4; /* 3 mantissa bits: 2^-4 relative, twice */
    default: return 2.0 * 0x1p-3;         /* e5m2: 2 mantissa bits */
    }
}

static void test_gemm_formats(void **state)
{
    enum { M = 5, K = 256, N = 40 }; /* K: two 128-row dequant chunks */
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * K * N);
    float *xd = malloc(sizeof(float) * M * K), *wd = malloc(sizeof(float) * K * N);
    float *wp = malloc(sizeof(float) * K * N), *y = malloc(sizeof(float) * M * N);
    float *yr = malloc(sizeof(float) * M * N), *ycl = malloc(sizeof(float) * M * N);
    int ran_cl = 0;

    (void)state;
    assert_true(x && w && xd && wd && wp && y && yr && ycl);
    rand_fill(x, M * K, 11, -3.0f, 3.0f);
    rand_fill(w, K * N, 12, -0.5f, 0.5f);
    x[7] = 40.0f; /* an outlier: per-token scales must follow it */
    for (int f = 0; f < KB_QF_COUNT; f++) {
        for (int sp = 0; sp < 2; sp++) {
            qcase c = { (kb_qfmt)f, sp, 0, M, K, N, x, w, y, 0, 0 };
            kb_fill fw = kb_fill_array(w, N);
            double maxerr = 0.0;
            assert_int_equal(run_case(&c, KB_DEV_REF), 0);
            assert_int_equal(kb_qact_host_values((kb_qfmt)f, M, K, x, xd), 0);
            assert_int_equal(kb_qweight_host_values((kb_qfmt)f, sp, K, N, &fw, wd), 0);
            memcpy(wp, w, sizeof(float) * K * N);
            if (sp)
                kb_prune_2_4(wp, K, N);
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < N; j++) {
                    float acc = 0.0f;
                    double ex = 0.0, mag = 0.0;
                    for (int k = 0; k < K; k++) {
                        float p = xd[i * K + k] * wd[k * N + j];
                        acc += p;
                        ex += (double)x[i * K + k] * wp[k * N + j];
                        mag += fabs((double)x[i * K + k] * wp[k * N + j]);
                    }
                    yr[i * N + j] = acc;
                    double e = fabs((double)y[i * N + j] - ex) / mag;
                    maxerr = e > maxerr ? e : maxerr;
                }
            }
            /* exactly the host computation from the host values */
            if (memcmp(y, yr, sizeof(float) * M * N) != 0)
                fail_msg("%s sparse %d: device result differs from the host reference",
                         kb_qfmt_name((kb_qfmt)f), sp);
            if (maxerr > fmt_tol((kb_qfmt)f))
                fail_msg("%s sparse %d: error %.3g above %.3g", kb_qfmt_name((kb_qfmt)f), sp,
                         maxerr, fmt_tol((kb_qfmt)f));
            print_message("%-8s sparse %d: max error %.3g of sum|x w| (tolerance %.3g)\n",
                          kb_qfmt_name((kb_qfmt)f), sp, maxerr, fmt_tol((kb_qfmt)f));
            /* the OpenCL backend: the same bytes */
            c.y = ycl;
            int rc = run_case(&c, KB_DEV_CPU);
            if (rc == -1000)
                continue;
            assert_int_equal(rc, 0);
            assert_memory_equal(ycl, y, sizeof(float) * M * N);
            ran_cl++;
        }
    }
    print_message("OpenCL comparisons: %d\n", ran_cl);
    free(x);
    free(w);
    free(xd);
    free(wd);
    free(wp);
    free(y);
    free(yr);
    free(ycl);
}

/* tl_dot_q's PE_GEMM occupancy for local operands is kb_qgemm_ns; in HBM the DMA moves the
 * format's bytes. */
static void test_times_bytes(void **state)
{
    enum { M = 4, K = 96, N = 24 };
    float x[M * K], w[K * N];
    kb_config cfg;
    const kb_topo_cfg *t;

    (void)state;
    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    t = &cfg.topo;
    rand_fill(x, M * K, 3, -1.0f, 1.0f);
    rand_fill(w, K * N, 4, -1.0f, 1.0f);
    /* closed form: int8 at twice the f16 rate, sparse int8 at four times */
    assert_true(fabs(kb_qgemm_ns(t, KB_QF_F16, 0, M, N, K) -
                     (t->gemm_fixed_ns + 2.0 * M * N * K / t->gemm_flops_per_ns)) < 1e-3);
    assert_true(fabs(kb_qgemm_ns(t, KB_QF_INT8, 1, M, N, K) -
                     (t->gemm_fixed_ns + 2.0 * M * N * K / (4.0 * t->gemm_flops_per_ns))) < 1e-3);
    /* the numbers docs/timing-model.md quotes (defaults) */
    assert_true(kb_qgemm_ns(t, KB_QF_F16, 0, M, N, K) == 20.5);
    assert_true(kb_qgemm_ns(t, KB_QF_INT8, 0, M, N, K) == 18.25);
    assert_true(kb_qgemm_ns(t, KB_QF_INT8, 1, M, N, K) == 17.125);
    assert_true(kb_qgemm_ns(t, KB_QF_MXINT8, 0, M, N, K) == 18.25);
    assert_true(kb_qgemm_ns(t, KB_QF_FP8E5M2, 1, M, N, K) == 17.125);
    for (int f = 0; f < KB_QF_COUNT; f++) {
        for (int sp = 0; sp < 2; sp++) {
            kb_qfmt fmt = (kb_qfmt)f;
            qcase c = { fmt, sp, 1, M, K, N, x, w, NULL, 0, 0 };
            assert_int_equal(run_case(&c, KB_DEV_NONE), 0);
            assert_int_equal(c.busy, kb_time_from_ns(kb_qgemm_ns(t, fmt, sp, M, N, K)));
            assert_int_equal(c.dma, 0);

            qcase h = { fmt, sp, 0, M, K, N, x, w, NULL, 0, 0 };
            uint64_t es = kb_dtype_size(kb_qfmt_dtype(fmt));
            uint64_t want = (uint64_t)(sp ? K / 2 : K) * N * es; /* one m tile */
            if (fmt == KB_QF_MXINT8)
                want += (uint64_t)K / 32 * N;
            else if (fmt >= KB_QF_INT8)
                want += 4u * N;
            if (sp)
                want += (uint64_t)(K + 7) / 8 * N;
            assert_int_equal(run_case(&h, KB_DEV_NONE), 0);
            assert_int_equal(h.dma, want);
            /* streamed: one SchedulerV2 step (K, N below the tiles), same occupancy */
            assert_int_equal(h.busy, c.busy);
        }
    }
}

static void test_errors(void **state)
{
    enum { K = 48, N = 8 };
    float w[K * N] = { 0 }, out[K * N];
    kb_fill fw = kb_fill_array(w, N);
    kb_config cfg;
    kb_ctx *ctx;

    (void)state;
    assert_int_equal(kb_qweight_host_values(KB_QF_MXINT8, 0, K, N, &fw, out), KB_ERR_INVAL);
    assert_int_equal(kb_qweight_host_values(KB_QF_INT8, 1, 6, N, &fw, out), KB_ERR_INVAL);
    assert_int_equal(kb_qweight_host_values(KB_QF_INT8, 1, K, N, &fw, out), 0);

    /* kb_qweight_create: MXINT8 with K = 48 */
    qcase c = { KB_QF_MXINT8, 0, 0, 2, K, N, w, w, NULL, 0, 0 };
    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_NONE });
    assert_int_equal(kb_ctx_run_host(ctx, h_q, &c), KB_ERR_INVAL);
    kbt_msg_has(kb_ctx_errmsg(ctx), "mxint8 needs K a multiple of 32 (K = 48)");
    kb_ctx_destroy(ctx);

    /* 2:4 with K = 6 */
    qcase s = { KB_QF_FP8E4M3, 1, 0, 2, 6, N, w, w, NULL, 0, 0 };
    ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_NONE });
    assert_int_equal(kb_ctx_run_host(ctx, h_q, &s), KB_ERR_INVAL);
    kbt_msg_has(kb_ctx_errmsg(ctx), "2:4 sparsity needs K a multiple of 4 (K = 6)");
    kb_ctx_destroy(ctx);
}

/* tl_qref in a kernel with a K the format cannot take. */
static void k_badref(kb_tl *tl, const kb_kargs *ka)
{
    const q_args *a = KB_KARGS_GET(ka, q_args);
    (void)tl_qref(tl, a->q, a->scale, 0, 40, 8, KB_QF_MXINT8, 0);
}

static int h_badref(kb_ctx *ctx, void *arg)
{
    kb_dp_policy one = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1);
    kb_tensor_desc d = { "t", 64, 8, KB_I8, one, KB_MEM_HBM };
    kb_tensor *t;
    kb_kargs a;
    kb_grid g = { 1, 1, 1, -1 };
    int rc;
    (void)arg;
    memset(&a, 0, sizeof a);
    if ((rc = kb_tensor_empty(ctx, &d, &t)) != 0)
        return rc;
    KB_KARGS_PUT(&a, (q_args){ .q = kb_tensor_va(t), .scale = kb_tensor_va(t) });
    return kb_launch(ctx, "badref", k_badref, &a, &g);
}

static void test_kernel_errors(void **state)
{
    kb_config cfg;
    kb_ctx *ctx;
    (void)state;
    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_NONE });
    assert_int_equal(kb_ctx_run_host(ctx, h_badref, NULL), KB_ERR_INVAL);
    kbt_msg_has(kb_ctx_errmsg(ctx), "tl_qref: mxint8 needs K a multiple of 32 (K = 40)");
    kb_ctx_destroy(ctx);
}

/* A weight split column-wise over all 8 PEs: PE j multiplies by its shard j (VAs base + j *
 * shard bytes) and stores shard j of a column-wise y; the whole y equals the host reference. */
typedef struct splitcase {
    kb_qfmt fmt;
    int sparse;
    const float *x, *w;
    float *y;
} splitcase;

enum { SM = 3, SK = 64, SN = 64, SPARTS = 8, SNJ = SN / SPARTS };

static void k_split(kb_tl *tl, const kb_kargs *ka)
{
    splitcase *c = (splitcase *)(intptr_t)ka->i[CASE_ARG];
    const q_args *a = KB_KARGS_GET(ka, q_args);
    int j = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    size_t es = kb_dtype_size(kb_qfmt_dtype(c->fmt));
    uint32_t qrows = c->sparse ? SK / 2 : SK;
    kb_va q = a->q + (kb_va)j * qrows * SNJ * es;
    kb_va sc = a->scale ? a->scale + (kb_va)j * SNJ * 4 : 0;
    kb_va meta = a->meta ? a->meta + (kb_va)j * ((SK + 7) / 8) * SNJ : 0;
    kb_val x = tl_load(tl, a->x, KB_SHAPE2(SM, SK), KB_F32);
    kb_val y = tl_dot_q(tl, x, tl_qref(tl, q, sc, meta, SK, SNJ, c->fmt, c->sparse));
    tl_store(tl, a->y + (kb_va)j * SM * SNJ * 4, y);
}

static int h_split(kb_ctx *ctx, void *arg)
{
    splitcase *c = arg;
    kb_dp_policy cw = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, 0);
    kb_dp_policy one = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 0, 0);
    kb_tensor_desc dx = { "x", SM, SK, KB_F32, one, KB_MEM_HBM };
    kb_tensor_desc dy = { "y", SM, SN, KB_F32, cw, KB_MEM_HBM };
    kb_fill fw = kb_fill_array(c->w, SN);
    kb_tensor *xt = NULL, *yt = NULL;
    kb_qweight qw;
    q_args qa;
    kb_kargs a;
    int rc;

    memset(&a, 0, sizeof a);
    if ((rc = kb_tensor_from_host(ctx, &dx, c->x, &xt)) != 0 ||
        (rc = kb_tensor_empty(ctx, &dy, &yt)) != 0 ||
        (rc = kb_qweight_create(ctx, "w", SK, SN, c->fmt, c->sparse, cw, &fw, &qw)) != 0)
        return rc;
    assert_int_equal(kb_tensor_nshards(qw.q), SPARTS);
    qa = q_args_of(xt, &qw, yt);
    KB_KARGS_PUT(&a, qa);
    a.i[CASE_ARG] = (int64_t)(intptr_t)c;
    if ((rc = kb_launch(ctx, "qsplit", k_split, &a, NULL)) != 0)
        return rc;
    return kb_tensor_read(yt, c->y);
}

static void test_column_split(void **state)
{
    float x[SM * SK], w[SK * SN], xd[SM * SK], wd[SK * SN], y[SM * SN];
    kb_qfmt fmts[3] = { KB_QF_INT8, KB_QF_FP8E4M3, KB_QF_F16 };

    (void)state;
    rand_fill(x, SM * SK, 31, -2.0f, 2.0f);
    rand_fill(w, SK * SN, 32, -1.0f, 1.0f);
    for (int f = 0; f < 3; f++) {
        int sp = f != 1;
        splitcase c = { fmts[f], sp, x, w, y };
        kb_config cfg;
        kb_ctx *ctx;
        kb_fill fw = kb_fill_array(w, SN);
        kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
        ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_REF });
        if (kb_ctx_run_host(ctx, h_split, &c) != 0)
            fail_msg("%s", kb_ctx_errmsg(ctx));
        kb_ctx_destroy(ctx);
        assert_int_equal(kb_qact_host_values(fmts[f], SM, SK, x, xd), 0);
        assert_int_equal(kb_qweight_host_values(fmts[f], sp, SK, SN, &fw, wd), 0);
        for (int i = 0; i < SM; i++)
            for (int j = 0; j < SN; j++) {
                float acc = 0.0f;
                for (int k = 0; k < SK; k++) {
                    float p = xd[i * SK + k] * wd[k * SN + j];
                    acc += p;
                }
                if (acc != y[i * SN + j])
                    fail_msg("%s: y(%d, %d) = %a, host %a", kb_qfmt_name(fmts[f]), i, j,
                             (double)y[i * SN + j], (double)acc);
            }
    }
}

/* A row (K) split must keep whole MXINT8 blocks and metadata bytes per part. */
static int h_rowsplit(kb_ctx *ctx, void *arg)
{
    kb_qweight qw;
    float *w = arg;
    kb_fill fw = kb_fill_array(w, 8);
    kb_dp_policy rw = kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, 0, 0);
    int rc = kb_qweight_create(ctx, "w", 384, 8, KB_QF_MXINT8, 0, rw, &fw, &qw); /* 48 rows each */
    if (rc == 0)
        kb_qweight_free(&qw);
    return rc;
}

static int h_rowsplit_ok(kb_ctx *ctx, void *arg)
{
    kb_qweight qw;
    float *w = arg;
    kb_fill fw = kb_fill_array(w, 8);
    kb_dp_policy rw = kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, 0, 0);
    int rc = kb_qweight_create(ctx, "w", 256, 8, KB_QF_INT8, 1, rw, &fw, &qw); /* 32 rows each */
    if (rc != 0)
        return rc;
    assert_int_equal(kb_tensor_nshards(qw.scale), SPARTS); /* replicated per-channel scale */
    assert_int_equal(kb_tensor_shard(qw.meta, 3)->row0, 12);
    assert_int_equal(kb_tensor_shard(qw.q, 3)->row0, 48);
    kb_qweight_free(&qw);
    return 0;
}

static void test_row_split(void **state)
{
    float *w = calloc(384 * 8, sizeof *w);
    kb_config cfg;
    kb_ctx *ctx;
    (void)state;
    assert_non_null(w);
    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_NONE });
    assert_int_equal(kb_ctx_run_host(ctx, h_rowsplit, w), KB_ERR_INVAL);
    kbt_msg_has(kb_ctx_errmsg(ctx), "not whole MXINT8 blocks of 32");
    kb_ctx_destroy(ctx);
    ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_NONE });
    assert_int_equal(kb_ctx_run_host(ctx, h_rowsplit_ok, w), 0);
    kb_ctx_destroy(ctx);
    free(w);
}

/* kb_qweight_create_rep: rk x rn copies of a base weight, quantized once, give the bytes
 * (values, scales, 2:4 metadata) of kb_qweight_create of the repeated weight itself. */
typedef struct rep_case {
    kb_qfmt fmt;
    int sparse;
    int64_t kb, nb, rk, rn;
    int split; /* columns over 2 cubes x 4 PEs: shards of copies share payload */
} rep_case;

static int same_raw(kb_tensor *a, kb_tensor *b)
{
    if (!a || !b)
        return a == b;
    size_t n = (size_t)(kb_tensor_rows(a) * kb_tensor_cols(a)) * kb_dtype_size(kb_tensor_dtype(a));
    uint8_t *x = malloc(n), *y = malloc(n);
    int same = x && y && kb_tensor_rows(a) == kb_tensor_rows(b) &&
               kb_tensor_cols(a) == kb_tensor_cols(b) &&
               kb_tensor_dtype(a) == kb_tensor_dtype(b) && kb_tensor_read_raw(a, x) == 0 &&
               kb_tensor_read_raw(b, y) == 0 && memcmp(x, y, n) == 0;
    free(x);
    free(y);
    return same;
}

/* Distinct payload blocks the host writes among records [from, to) copy from. */
static size_t payload_blocks(const kb_oplog *log, size_t from, size_t to)
{
    size_t n = 0;
    for (size_t i = from; i < to; i++) {
        const kb_rec *r = kb_oplog_at(log, i), *q;
        size_t j;
        if (r->kind != KB_REC_COPY || r->src[0].space != KB_SPACE_PAYLOAD)
            continue;
        for (j = from; j < i; j++) {
            q = kb_oplog_at(log, j);
            if (q->kind == KB_REC_COPY && q->src[0].space == KB_SPACE_PAYLOAD &&
                q->src[0].addr == r->src[0].addr)
                break;
        }
        n += j == i;
    }
    return n;
}

static int h_rep(kb_ctx *ctx, void *arg)
{
    const rep_case *c = arg;
    int64_t k = c->kb * c->rk, n = c->nb * c->rn;
    float *base = malloc((size_t)(c->kb * c->nb) * sizeof *base);
    float *full = malloc((size_t)(k * n) * sizeof *full);
    kb_dp_policy one = c->split ? kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 2, 4)
                                : kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1);
    kb_oplog *log = kb_ctx_oplog(ctx);
    size_t r0, r1 = 0;
    kb_qweight a, b;
    uint32_t x = 12345u;
    int rc;
    if (!base || !full)
        return KB_ERR_NOMEM;
    for (int64_t i = 0; i < c->kb * c->nb; i++) { /* spread magnitudes: scales differ */
        x = x * 1664525u + 1013904223u;
        base[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * (float)(1 + i % 7);
    }
    for (int64_t r = 0; r < k; r++)
        for (int64_t j = 0; j < n; j++)
            full[r * n + j] = base[(r % c->kb) * c->nb + j % c->nb];
    kb_fill fb = kb_fill_array(base, c->nb), ff = kb_fill_array(full, n);
    r0 = kb_oplog_count(log);
    if ((rc = kb_qweight_create(ctx, "a", k, n, c->fmt, c->sparse, one, &ff, &a)) == 0 &&
        (r1 = kb_oplog_count(log),
         rc = kb_qweight_create_rep(ctx, "b", k, n, c->fmt, c->sparse, one, &fb, c->rk, c->rn,
                                    NULL, &b)) == 0) {
        /* split into column blocks, the shards of one copy are all the payload blocks: b's
         * records name rn times fewer than a's, whose shards all differ */
        size_t na = payload_blocks(log, r0, r1), nb = payload_blocks(log, r1, kb_oplog_count(log));
        if (c->split && (na != 8 * (size_t)(1 + !!a.scale + !!a.meta) || na != nb * (size_t)c->rn))
            rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "format %d sparse %d: %zu payload "
                            "blocks for the copies, %zu for the weight", (int)c->fmt, c->sparse,
                            nb, na);
        else if (!same_raw(a.q, b.q) || !same_raw(a.scale, b.scale) ||
                 !same_raw(a.meta, b.meta))
            rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "format %d sparse %d: the copies "
                            "differ", (int)c->fmt, c->sparse);
        kb_qweight_free(&b);
    }
    if (a.q)
        kb_qweight_free(&a);
    free(base);
    free(full);
    return rc;
}

/* ---- a weight generated and quantized where it replays (GEN op KB_GEN_QW) ---- */

enum { GK = 128, GN = 8 };

typedef struct gen_case {
    rep_case c;
    uint64_t rows[GK];
    kb_seedgen_col cols[GN];
} gen_case;

static void map_fill(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols, float *out)
{
    const gen_case *g = ud;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            out[i * cols + j] = kb_seedgen_mapped(g->rows[(row + i) % GK], &g->cols[(col + j) % GN]);
}

static int h_gen(kb_ctx *ctx, void *arg)
{
    gen_case *g = arg;
    const rep_case *c = &g->c;
    int64_t k = GK * c->rk, n = GN * c->rn;
    float *full = malloc((size_t)(k * n) * sizeof *full);
    kb_dp_policy dp = c->split ? kb_dp(KB_DP_COLUMN_WISE, KB_DP_ROW_WISE, 2, 4)
                               : kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1);
    kb_oplog *log = kb_ctx_oplog(ctx);
    kb_fill fm = { map_fill, g, NULL, 0, 0, 0, NULL };
    kb_qw_map map = { g->rows, g->cols };
    kb_qweight a, b;
    size_t r1 = 0, gens = 0, copies = 0;
    int rc;
    if (!full)
        return KB_ERR_NOMEM;
    map_fill(g, 0, 0, k, n, full);
    kb_fill ff = kb_fill_array(full, n);
    memset(&a, 0, sizeof a);
    if ((rc = kb_qweight_create(ctx, "a", k, n, c->fmt, c->sparse, dp, &ff, &a)) == 0 &&
        (r1 = kb_oplog_count(log),
         rc = kb_qweight_create_rep(ctx, "b", k, n, c->fmt, c->sparse, dp, &fm, c->rk, c->rn,
                                    &map, &b)) == 0) {
        for (size_t i = r1; i < kb_oplog_count(log); i++) {
            const kb_rec *r = kb_oplog_at(log, i);
            gens += r->kind == KB_REC_GEN && r->op == KB_GEN_QW;
            /* replicas copy a generated shard; nothing comes from the payload */
            copies += r->kind == KB_REC_COPY && r->src[0].space == KB_SPACE_PAYLOAD;
        }
        if (gens == 0 || copies != 0)
            rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "format %d sparse %d: %zu generated "
                            "records, %zu copies from the payload", (int)c->fmt, c->sparse, gens,
                            copies);
        else if (!same_raw(a.q, b.q) || !same_raw(a.scale, b.scale) || !same_raw(a.meta, b.meta))
            rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "format %d sparse %d rk %lld rn %lld "
                            "split %d: generated and host-quantized weights differ", (int)c->fmt,
                            c->sparse, (long long)c->rk, (long long)c->rn, c->split);
        kb_qweight_free(&b);
    }
    kb_qweight_free(&a);
    free(full);
    return rc;
}

/*
 * A weight whose source is a gather of two pattern matrices (rows permuted, two zero rows, one
 * source transposed), generated and quantized where it replays, holds the bytes the host's
 * quantization of the same values gives: every format, dense and 2:4, copies, and shards of
 * rows and columns (so a record starts inside a copy). Its records are GEN records only.
 */
static void test_generated(void **state)
{
    static const kb_qfmt fmts[] = { KB_QF_F16, KB_QF_BF16, KB_QF_INT8, KB_QF_MXINT8,
                                    KB_QF_FP8E4M3, KB_QF_FP8E5M2 };
    static const int64_t reps[][2] = { { 1, 1 }, { 2, 3 } };
    kb_config cfg;
    gen_case *g = calloc(1, sizeof *g);
    (void)state;
    assert_non_null(g);
    for (int i = 0; i < GK; i++)
        g->rows[i] = i == 7 || i == 21 ? KB_SEEDGEN_ROW_ZERO : (uint64_t)((i * 5 + 3) % 100);
    for (int j = 0; j < GN; j++) {
        kb_fill_gen pa = { .kind = KB_FILL_GEN_PATTERN, .seed = 91, .range = 8, .den = 64.0f,
                           .ld = 40 };
        kb_fill_gen pb = { .kind = KB_FILL_GEN_PATTERN, .seed = 92, .range = 100, .den = 32.0f,
                           .ld = 100, .transpose = 1 };
        kb_fill f = { NULL, NULL, NULL, 0, 2, 1, j % 2 ? &pb : &pa };
        assert_true(kb_fill_seedgen_col(&f, (j * 3) % 30, &g->cols[j]));
    }
    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (int sp = 0; sp <= 1; sp++)
            for (int split = 0; split <= 1; split++)
                for (int rp = 0; rp < 2; rp++) {
                    g->c = (rep_case){ fmts[f], sp, GK, GN, reps[rp][0], reps[rp][1], split };
                    kb_ctx *ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_REF });
                    if (kb_ctx_run_host(ctx, h_gen, g) != 0)
                        fail_msg("%s", kb_ctx_errmsg(ctx));
                    kb_ctx_destroy(ctx);
                }
    free(g);
}

static void test_repeated(void **state)
{
    static const kb_qfmt fmts[] = { KB_QF_F16, KB_QF_BF16, KB_QF_INT8, KB_QF_MXINT8,
                                    KB_QF_FP8E4M3, KB_QF_FP8E5M2 };
    kb_config cfg;
    (void)state;
    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (int sp = 0; sp <= 1; sp++) {
            for (int split = 0; split <= 1; split++) {
                rep_case c = { fmts[f], sp, 64, 8, split ? 1 : 3, 2, split };
                kb_ctx *ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_REF });
                if (kb_ctx_run_host(ctx, h_rep, &c) != 0)
                    fail_msg("%s", kb_ctx_errmsg(ctx));
                kb_ctx_destroy(ctx);
            }
        }
    /* per-channel int8 with copies of 12 rows (no block to keep whole) */
    rep_case odd = { KB_QF_INT8, 0, 12, 8, 2, 3, 0 };
    kb_ctx *c2 = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_REF });
    if (kb_ctx_run_host(c2, h_rep, &odd) != 0)
        fail_msg("%s", kb_ctx_errmsg(c2));
    kb_ctx_destroy(c2);
    /* copies that would cut an MX block */
    rep_case bad = { KB_QF_MXINT8, 0, 48, 8, 2, 1, 0 };
    kb_ctx *ctx = kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = KB_DEV_REF });
    assert_int_equal(kb_ctx_run_host(ctx, h_rep, &bad), KB_ERR_INVAL);
    kbt_msg_has(kb_ctx_errmsg(ctx), "do not keep its blocks whole");
    kb_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_bits),
        cmocka_unit_test(test_prune),
        cmocka_unit_test(test_gemm_formats),
        cmocka_unit_test(test_times_bytes),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_kernel_errors),
        cmocka_unit_test(test_column_split),
        cmocka_unit_test(test_row_split),
        cmocka_unit_test(test_repeated),
        cmocka_unit_test(test_generated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
