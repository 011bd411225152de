/*
 * test_tl_nn — the neural-network kernel ops (kb_tl_nn) end to end on a small machine with the
 * reference backend: each op's values against a double-precision host computation (tolerance:
 * 2e-6 relative + 2e-6 absolute for single-pass ops, 1e-5 for the softmax and the norms, whose
 * f32 sums round a few times more; exact for data movement: transpose, concat, repeat_kv,
 * embedding), f16 and bf16 inputs, the causal mask with offsets that mask whole rows (zeros),
 * soft-capping, embedding ids out of range (zero rows), the exact PE_MATH time of each op from
 * its closed form (docs/timing-model.md), the embedding DMA equal to a load of as many rows,
 * the same times with --device none, kb_rope_tables, the ops' error messages, and a causal
 * grouped-query attention composed of them (repeat_kv, transpose, dot, attn_softmax, copy)
 * against double precision.
 * OpenCL-vs-ref bit equality of the new record kinds is in test_opencl.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_runtime.h"
#include "kb_tl.h"
#include "kb_tl_nn.h"
#include "kb_test_util.h"

static const char *const small_machine[] = {
    "system.sips.count=1",
    "sip.cube_mesh.width=2",
    "sip.cube_mesh.height=1",
    "cube.pe_per_corner=1",
    "cube.hbm.size_bytes=25769803776",
};

static kb_ctx *make_ctx(kb_device_kind dev)
{
    kb_config cfg;
    kbt_config_with(&cfg, small_machine, sizeof small_machine / sizeof small_machine[0]);
    return kbt_ctx_from(&cfg, &(kb_ctx_opts){ .device = dev });
}

enum {
    OP_TANH, OP_SILU, OP_GELU, OP_SOFTCAP, OP_ATTN, OP_RMS, OP_LN, OP_ROPE, OP_TRANSPOSE,
    OP_CAT0, OP_CAT1, OP_REPKV, OP_GATED_SILU, OP_GATED_GELU, OP_EMB, OP_ATTN_BLOCK
};

#define MAXN 512

/*
 * Causal grouped-query attention of i[0] query heads over i[1] kv heads of width i[2]:
 * q (T x nh*hd), k and v (T x nkv*hd) -> T x nh*hd, the way a decoder layer composes the ops.
 */
static kb_val attn_block(kb_tl *tl, kb_val q, kb_val k, kb_val v, int nh, int nkv, int hd)
{
    kb_val kr = tl_repeat_kv(tl, k, nkv, hd, nh / nkv), vr = tl_repeat_kv(tl, v, nkv, hd, nh / nkv);
    kb_val out = tl_full(tl, KB_SHAPE2(q.rows, q.cols), 0.0f);
    for (int h = 0; h < nh; h++) {
        uint32_t c0 = (uint32_t)(h * hd);
        kb_val kt = tl_transpose(tl, tl_view(tl, kr, 0, c0, k.rows, (uint32_t)hd));
        kb_val sc = tl_dot(tl, tl_view(tl, q, 0, c0, q.rows, (uint32_t)hd), kt);
        kb_val pr = tl_attn_softmax(tl, sc, 1.0f / sqrtf((float)hd), 0.0f, 1, 0);
        kb_val o = tl_dot(tl, pr, tl_view(tl, vr, 0, c0, v.rows, (uint32_t)hd));
        tl_copy(tl, tl_view(tl, out, 0, c0, q.rows, (uint32_t)hd), o);
        tl_free(tl, o);
        tl_free(tl, pr);
        tl_free(tl, sc);
        tl_free(tl, kt);
    }
    return out;
}

/* One op on up to three inputs (input 0 in dtype dt, the others f32), one output. */
typedef struct nn_case {
    int op;
    kb_dtype dt;
    uint32_t r[3], c[3];      /* input shapes (rows 0: unused) */
    float in[3][MAXN];        /* inputs as the device holds them (already rounded to dt) */
    uint32_t orow, ocol;
    float f[2];
    int64_t i[3];
    float out[MAXN];
    kb_time dt_op, dt_ref;    /* the op's duration; embedding: a load of as many rows */
    const char *fail_msg;     /* set: the launch must fail with this in its message */
} nn_case;

/* The kernel's tensors: the case's inputs (0 where it has fewer) and its output. The case
 * itself travels apart, as a host address in kb_kargs.i[CASE_ARG]. */
typedef struct nn_args {
    kb_va in[3], out;
} nn_args;
#define CASE_ARG 11

static nn_case *case_of(const kb_kargs *a) { return (nn_case *)(intptr_t)a->i[CASE_ARG]; }

static void k_nn(kb_tl *tl, const kb_kargs *ka)
{
    nn_case *c = case_of(ka);
    const nn_args *a = KB_KARGS_GET(ka, nn_args);
    kb_val v[3], out;
    kb_time t0, t1;

    memset(v, 0, sizeof v);
    for (int s = 0; s < 3; s++)
        if (c->r[s] && !(c->op == OP_EMB && s == 0))
            v[s] = tl_load(tl, a->in[s], KB_SHAPE2(c->r[s], c->c[s]), s == 0 ? c->dt : KB_F32);
    t0 = kbt_tl_now(tl);
    switch (c->op) {
    case OP_TANH: out = tl_tanh(tl, v[0]); break;
    case OP_SILU: out = tl_silu(tl, v[0]); break;
    case OP_GELU: out = tl_gelu_tanh(tl, v[0]); break;
    case OP_SOFTCAP: out = tl_softcap(tl, v[0], c->f[0]); break;
    case OP_ATTN: out = tl_attn_softmax(tl, v[0], c->f[0], c->f[1], (int)c->i[0], c->i[1]); break;
    case OP_RMS: out = tl_rmsnorm(tl, v[0], v[1], c->f[0], c->f[1]); break;
    case OP_LN: out = tl_layernorm(tl, v[0], v[1], v[2], c->f[0]); break;
    case OP_ROPE: out = tl_rope(tl, v[0], v[1], v[2]); break;
    case OP_TRANSPOSE: out = tl_transpose(tl, v[0]); break;
    case OP_CAT0: out = tl_concat(tl, v[0], v[1], 0); break;
    case OP_CAT1: out = tl_concat(tl, v[0], v[1], 1); break;
    case OP_REPKV: out = tl_repeat_kv(tl, v[0], (int)c->i[0], (int)c->i[1], (int)c->i[2]); break;
    case OP_GATED_SILU: out = tl_gated(tl, v[0], v[1], 0); break;
    case OP_GATED_GELU: out = tl_gated(tl, v[0], v[1], 1); break;
    case OP_ATTN_BLOCK:
        out = attn_block(tl, v[0], v[1], v[2], (int)c->i[0], (int)c->i[1], (int)c->i[2]);
        break;
    default: /* OP_EMB */
        out = tl_embedding(tl, a->in[0], c->r[0], c->c[0], c->dt, v[1]);
        break;
    }
    t1 = kbt_tl_now(tl);
    c->dt_op = t1 - t0;
    if (c->op == OP_EMB) {
        uint32_t n = v[1].rows * v[1].cols;
        kb_time t2 = kbt_tl_now(tl);
        tl_load(tl, a->in[0], KB_SHAPE2(n, c->c[0]), c->dt);
        c->dt_ref = kbt_tl_now(tl) - t2;
    }
    tl_store(tl, a->out, out);
}

static kb_tensor_desc desc(const char *name, int64_t rows, int64_t cols, kb_dtype dt)
{
    kb_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.name = name;
    d.rows = rows;
    d.cols = cols;
    d.dtype = dt;
    d.dp = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 1, 1);
    d.mem = KB_MEM_HBM;
    return d;
}

static int h_nn(kb_ctx *ctx, void *arg)
{
    nn_case *c = arg;
    static const char *const names[3] = { "in0", "in1", "in2" };
    kb_kargs a;
    nn_args na;
    kb_tensor *t[4];
    kb_grid one = { 1, 1, 1, -1 };
    int rc;

    memset(&a, 0, sizeof a);
    memset(&na, 0, sizeof na);
    a.i[CASE_ARG] = (int64_t)(intptr_t)c;
    for (int s = 0; s < 3; s++) {
        if (!c->r[s])
            continue;
        kb_tensor_desc d = desc(names[s], c->r[s], c->c[s], s == 0 ? c->dt : KB_F32);
        if ((rc = kb_tensor_from_host(ctx, &d, c->in[s], &t[s])) != 0)
            return rc;
        na.in[s] = kb_tensor_va(t[s]);
    }
    kb_tensor_desc d = desc("out", c->orow, c->ocol, KB_F32);
    if ((rc = kb_tensor_empty(ctx, &d, &t[3])) != 0)
        return rc;
    na.out = kb_tensor_va(t[3]);
    KB_KARGS_PUT(&a, na);
    if ((rc = kb_launch(ctx, "nn", k_nn, &a, &one)) != 0)
        return rc;
    if (kb_ctx_device(ctx) == KB_DEV_NONE)
        return 0;
    return kb_tensor_read(t[3], c->out);
}

/* Runs the case on a fresh context (ref backend, or none: times only). */
static void run_case(nn_case *c, kb_device_kind dev)
{
    kb_ctx *ctx = make_ctx(dev);
    int rc = kb_ctx_run_host(ctx, h_nn, c);
    if (c->fail_msg) {
        assert_int_not_equal(rc, 0);
        if (!strstr(kb_ctx_errmsg(ctx), c->fail_msg))
            fail_msg("error '%s' does not name '%s'", kb_ctx_errmsg(ctx), c->fail_msg);
    } else {
        if (rc)
            fail_msg("run failed: %s", kb_ctx_errmsg(ctx));
    }
    kb_ctx_destroy(ctx);
}

/* Input s: rows x cols of a smooth pseudo-random pattern in [-amp, amp], rounded to dt. */
static void set_input(nn_case *c, int s, uint32_t rows, uint32_t cols, float amp, unsigned seed)
{
    kb_dtype dt = s == 0 ? c->dt : KB_F32;
    uint8_t tmp[8];
    assert_true(rows * cols <= MAXN);
    c->r[s] = rows;
    c->c[s] = cols;
    for (uint32_t i = 0; i < rows * cols; i++) {
        float x = amp * (float)sin(0.37 * (double)(i + 1) * (double)(seed + 1) + (double)seed);
        kb_dtype_store(dt, tmp, 0, x);
        c->in[s][i] = kb_dtype_load(dt, tmp, 0);
    }
}

static nn_case *new_case(int op, kb_dtype dt, uint32_t orow, uint32_t ocol)
{
    nn_case *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->op = op;
    c->dt = dt;
    c->orow = orow;
    c->ocol = ocol;
    return c;
}

static void expect_close(const nn_case *c, const double *want, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        double got = (double)c->out[i];
        if (isnan(want[i])) {
            if (!isnan(got))
                fail_msg("element %zu: %g, want NaN", i, got);
            continue;
        }
        if (!(fabs(got - want[i]) <= tol * (1.0 + fabs(want[i]))))
            fail_msg("element %zu: %.9g, want %.9g (tol %g)", i, got, want[i], tol);
    }
}

/* ---- closed-form times ---- */

typedef struct costs {
    int64_t ovh, fixed;
    double lanes;
} costs;

static costs costs_of(void)
{
    kb_ctx *ctx = make_ctx(KB_DEV_NONE);
    const kb_topo_cfg *t = &kb_ctx_config(ctx)->topo;
    costs k = { kbt_ps(t->pe_cpu_overhead_ns), kbt_ps(t->math_fixed_ns), t->math_lanes_per_ns };
    kb_ctx_destroy(ctx);
    return k;
}

/* One PE_MATH record of n element-passes. */
static int64_t rec_ps(costs k, uint64_t n) { return k.ovh + k.fixed + kbt_xfer_ps(n, k.lanes); }

/* ---- elementwise ---- */

static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static double silu_d(double x) { return x / (1.0 + exp(-x)); }

static void test_elementwise(void **state)
{
    costs k = costs_of();
    static const int ops[] = { OP_TANH, OP_SILU, OP_GELU, OP_SOFTCAP };
    (void)state;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        for (int dt = 0; dt < 3; dt++) {
            nn_case *c = new_case(ops[o], (kb_dtype)dt, 6, 20);
            double want[MAXN];
            set_input(c, 0, 6, 20, ops[o] == OP_SOFTCAP ? 60.0f : 6.0f, 1);
            c->f[0] = 30.0f;
            run_case(c, KB_DEV_REF);
            for (int i = 0; i < 120; i++) {
                double x = (double)c->in[0][i];
                want[i] = ops[o] == OP_TANH ? tanh(x) : ops[o] == OP_SILU ? silu_d(x)
                          : ops[o] == OP_GELU ? gelu_d(x) : 30.0 * tanh(x / 30.0);
            }
            expect_close(c, want, 120, 2e-6);
            assert_int_equal(c->dt_op, rec_ps(k, 120)); /* 1 pass */
            free(c);
        }
    }
}

/* ---- attention softmax ---- */

static void attn_ref(const nn_case *c, double *want)
{
    uint32_t R = c->r[0], C = c->c[0];
    for (uint32_t i = 0; i < R; i++) {
        double y[64], m = -INFINITY, sum = 0.0;
        uint32_t nv = C;
        if (c->i[0]) { /* j <= i + offset, in double: no overflow for extreme offsets */
            double lim = (double)i + (double)c->i[1] + 1.0;
            nv = lim <= 0.0 ? 0 : lim >= (double)C ? C : (uint32_t)lim;
        }
        for (uint32_t j = 0; j < C; j++) {
            y[j] = (double)c->f[0] * (double)c->in[0][i * C + j];
            if (c->f[1] > 0.0f)
                y[j] = (double)c->f[1] * tanh(y[j] / (double)c->f[1]);
            if (j < nv)
                m = fmax(m, y[j]);
        }
        for (uint32_t j = 0; j < nv; j++)
            sum += exp(y[j] - m);
        for (uint32_t j = 0; j < C; j++)
            want[i * C + j] = j < nv ? exp(y[j] - m) / sum : 0.0;
    }
}

static void test_attn_softmax(void **state)
{
    costs k = costs_of();
    /* causal, offset, cap: no mask; causal square; a later query block; rows fully masked */
    static const struct { int causal; int64_t off; float cap; kb_dtype dt; } cases[] = {
        { 0, 0, 0.0f, KB_F32 }, { 1, 0, 0.0f, KB_F32 }, { 1, 3, 0.0f, KB_BF16 },
        { 1, -2, 0.0f, KB_F32 }, { 1, 0, 2.5f, KB_F16 }, { 0, 0, 50.0f, KB_F32 },
        { 1, -100, 0.0f, KB_F32 }, { 1, INT64_MAX, 1.0f, KB_F32 }, { 1, INT64_MIN, 0.0f, KB_F32 },
    };
    (void)state;
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        nn_case *c = new_case(OP_ATTN, cases[t].dt, 5, 9);
        double want[MAXN];
        set_input(c, 0, 5, 9, 8.0f, 3);
        c->f[0] = 0.35f;
        c->f[1] = cases[t].cap;
        c->i[0] = cases[t].causal;
        c->i[1] = cases[t].off;
        run_case(c, KB_DEV_REF);
        attn_ref(c, want);
        expect_close(c, want, 45, 1e-5);
        if (cases[t].causal && cases[t].off == -2)
            for (int j = 0; j < 9 * 2; j++) /* rows 0 and 1: every element masked */
                assert_true(c->out[j] == 0.0f && !signbit(c->out[j]));
        assert_int_equal(c->dt_op, rec_ps(k, (KB_ATTN_SOFTMAX_PASSES + (cases[t].cap > 0 ? 1 : 0))
                                                 * 45ull));
        free(c);
    }
}

/* ---- norms ---- */

static void test_rmsnorm(void **state)
{
    costs k = costs_of();
    (void)state;
    for (int uo = 0; uo < 2; uo++) {
        for (int dt = 0; dt < 3; dt++) {
            const uint32_t R = 4, C = 24;
            nn_case *c = new_case(OP_RMS, (kb_dtype)dt, R, C);
            double want[MAXN];
            set_input(c, 0, R, C, 3.0f, 4);
            set_input(c, 1, 1, C, 1.0f, 5);
            c->f[0] = 1e-6f;
            c->f[1] = uo ? 1.0f : 0.0f;
            run_case(c, KB_DEV_REF);
            for (uint32_t i = 0; i < R; i++) {
                double ss = 0.0;
                for (uint32_t j = 0; j < C; j++)
                    ss += (double)c->in[0][i * C + j] * c->in[0][i * C + j];
                double r = 1.0 / sqrt(ss / C + (double)c->f[0]);
                for (uint32_t j = 0; j < C; j++)
                    want[i * C + j] = (double)c->in[0][i * C + j] * r *
                                      ((double)c->in[1][j] + (double)c->f[1]);
            }
            expect_close(c, want, R * C, 1e-5);
            /* x*x, sum, scale (R), rsqrt (R), x*r, [w + 1 (C)], *w */
            int64_t t = rec_ps(k, R * C) * 4 + rec_ps(k, R) * 2 + (uo ? rec_ps(k, C) : 0);
            assert_int_equal(c->dt_op, t);
            free(c);
        }
    }
}

static void test_layernorm(void **state)
{
    costs k = costs_of();
    const uint32_t R = 3, C = 40;
    nn_case *c = new_case(OP_LN, KB_BF16, R, C);
    double want[MAXN];
    (void)state;
    set_input(c, 0, R, C, 2.0f, 6);
    for (uint32_t i = 0; i < R * C; i++) { /* a mean far from 0, rounded to bf16 again */
        uint8_t tmp[4];
        kb_dtype_store(KB_BF16, tmp, 0, c->in[0][i] + 5.0f);
        c->in[0][i] = kb_dtype_load(KB_BF16, tmp, 0);
    }
    set_input(c, 1, 1, C, 1.5f, 7);
    set_input(c, 2, 1, C, 0.5f, 8);
    c->f[0] = 1e-5f;
    run_case(c, KB_DEV_REF);
    for (uint32_t i = 0; i < R; i++) {
        double mu = 0.0, var = 0.0;
        for (uint32_t j = 0; j < C; j++)
            mu += c->in[0][i * C + j];
        mu /= C;
        for (uint32_t j = 0; j < C; j++)
            var += (c->in[0][i * C + j] - mu) * (c->in[0][i * C + j] - mu);
        var /= C;
        for (uint32_t j = 0; j < C; j++)
            want[i * C + j] = (c->in[0][i * C + j] - mu) / sqrt(var + (double)c->f[0]) *
                                  c->in[1][j] + c->in[2][j];
    }
    expect_close(c, want, R * C, 1e-5);
    /* sum, scale (R), sub, mul, sum, scale (R), rsqrt (R), mul, fma */
    assert_int_equal(c->dt_op, rec_ps(k, R * C) * 6 + rec_ps(k, R) * 3);
    free(c);
}

/* ---- rope ---- */

static void test_rope(void **state)
{
    costs k = costs_of();
    const uint32_t R = 5, HD = 16, H = 8;
    nn_case *c = new_case(OP_ROPE, KB_F16, R, HD);
    int64_t pos[5] = { 0, 1, 2, 7, 1000 };
    double want[MAXN];
    (void)state;
    set_input(c, 0, R, HD, 2.0f, 9);
    c->r[1] = c->r[2] = R;
    c->c[1] = c->c[2] = H;
    kb_rope_tables(pos, R, (int)HD, 10000.0, c->in[1], c->in[2]);
    /* the tables: angle = pos * theta^(-2k/hd) */
    for (uint32_t i = 0; i < R; i++)
        for (uint32_t j = 0; j < H; j++) {
            double ang = (double)pos[i] * pow(10000.0, -2.0 * j / HD);
            assert_true(c->in[1][i * H + j] == (float)cos(ang));
            assert_true(c->in[2][i * H + j] == (float)sin(ang));
        }
    run_case(c, KB_DEV_REF);
    for (uint32_t i = 0; i < R; i++)
        for (uint32_t j = 0; j < H; j++) {
            double x1 = c->in[0][i * HD + j], x2 = c->in[0][i * HD + H + j];
            double cs = c->in[1][i * H + j], sn = c->in[2][i * H + j];
            want[i * HD + j] = x1 * cs - x2 * sn;
            want[i * HD + H + j] = x2 * cs + x1 * sn;
        }
    expect_close(c, want, R * HD, 2e-6);
    assert_int_equal(c->dt_op, rec_ps(k, R * H) * 6); /* 3 passes over x */
    free(c);
}

/* ---- data movement: exact ---- */

static void test_transpose_concat_repeat(void **state)
{
    costs k = costs_of();
    (void)state;
    {
        nn_case *c = new_case(OP_TRANSPOSE, KB_BF16, 11, 7);
        set_input(c, 0, 7, 11, 4.0f, 10);
        run_case(c, KB_DEV_REF);
        for (uint32_t i = 0; i < 11; i++)
            for (uint32_t j = 0; j < 7; j++)
                assert_true(c->out[i * 7 + j] == c->in[0][j * 11 + i]);
        assert_int_equal(c->dt_op, rec_ps(k, 77));
        free(c);
    }
    for (int axis = 0; axis < 2; axis++) {
        nn_case *c = new_case(axis ? OP_CAT1 : OP_CAT0, KB_F16, axis ? 3 : 8, axis ? 9 : 4);
        set_input(c, 0, 3, 4, 4.0f, 11);
        set_input(c, 1, axis ? 3 : 5, axis ? 5 : 4, 4.0f, 12);
        run_case(c, KB_DEV_REF);
        for (uint32_t i = 0; i < c->orow; i++)
            for (uint32_t j = 0; j < c->ocol; j++) {
                float w = axis ? (j < 4 ? c->in[0][i * 4 + j] : c->in[1][i * 5 + j - 4])
                               : (i < 3 ? c->in[0][i * 4 + j] : c->in[1][(i - 3) * 4 + j]);
                assert_true(c->out[i * c->ocol + j] == w);
            }
        assert_int_equal(c->dt_op, rec_ps(k, 12) + rec_ps(k, axis ? 15 : 20));
        free(c);
    }
    {
        const int nkv = 2, hd = 3, rep = 3, R = 4;
        nn_case *c = new_case(OP_REPKV, KB_F32, R, nkv * hd * rep);
        set_input(c, 0, R, nkv * hd, 4.0f, 13);
        c->i[0] = nkv;
        c->i[1] = hd;
        c->i[2] = rep;
        run_case(c, KB_DEV_REF);
        for (int i = 0; i < R; i++)
            for (int h = 0; h < nkv * rep; h++)
                for (int e = 0; e < hd; e++)
                    assert_true(c->out[i * nkv * hd * rep + h * hd + e] ==
                                c->in[0][i * nkv * hd + (h / rep) * hd + e]);
        assert_int_equal(c->dt_op, rec_ps(k, R * hd) * nkv * rep);
        free(c);
    }
}

static void test_gated(void **state)
{
    costs k = costs_of();
    (void)state;
    for (int act = 0; act < 2; act++) {
        nn_case *c = new_case(act ? OP_GATED_GELU : OP_GATED_SILU, KB_BF16, 4, 30);
        double want[MAXN];
        set_input(c, 0, 4, 30, 5.0f, 14);
        set_input(c, 1, 4, 30, 2.0f, 15);
        run_case(c, KB_DEV_REF);
        for (int i = 0; i < 120; i++) {
            double g = c->in[0][i];
            /* the activation rounds to f32 before the product */
            want[i] = (double)(float)(act ? gelu_d(g) : silu_d(g)) * c->in[1][i];
        }
        expect_close(c, want, 120, 2e-6);
        assert_int_equal(c->dt_op, rec_ps(k, 120) * 2);
        free(c);
    }
}

/* ---- embedding ---- */

static void test_embedding(void **state)
{
    static const float ids[8] = { 3, 0, 9, 3, 12, 2.5f, -1, 7 };
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        for (int col = 0; col < 2; col++) {
            nn_case *c = new_case(OP_EMB, (kb_dtype)dt, 8, 6);
            set_input(c, 0, 10, 6, 4.0f, 16);
            c->r[1] = col ? 8 : 1;
            c->c[1] = col ? 1 : 8;
            memcpy(c->in[1], ids, sizeof ids);
            run_case(c, KB_DEV_REF);
            for (int i = 0; i < 8; i++) {
                int ok = ids[i] >= 0 && ids[i] < 10 && ids[i] == floorf(ids[i]);
                for (int j = 0; j < 6; j++) {
                    float got = c->out[i * 6 + j];
                    if (ok)
                        assert_true(got == c->in[0][(int)ids[i] * 6 + j]);
                    else /* not a row of this table: +0 */
                        assert_true(got == 0.0f && !signbit(got));
                }
            }
            /* a DMA of 8 rows of 6 elements: what loading 8 rows costs */
            assert_true(c->dt_op > 0);
            assert_int_equal(c->dt_op, c->dt_ref);
            free(c);
        }
    }
}

/* ---- composition: causal grouped-query attention ---- */

static void test_attention_block(void **state)
{
    enum { T = 6, NH = 4, NKV = 2, HD = 8 };
    nn_case *c = new_case(OP_ATTN_BLOCK, KB_BF16, T, NH * HD);
    double want[MAXN];
    (void)state;
    set_input(c, 0, T, NH * HD, 2.0f, 20);
    set_input(c, 1, T, NKV * HD, 2.0f, 21);
    set_input(c, 2, T, NKV * HD, 2.0f, 22);
    c->i[0] = NH;
    c->i[1] = NKV;
    c->i[2] = HD;
    run_case(c, KB_DEV_REF);
    for (int h = 0; h < NH; h++) {
        int g = h / (NH / NKV);
        for (int i = 0; i < T; i++) {
            double sc[T], m = -INFINITY, sum = 0.0;
            for (int j = 0; j <= i; j++) {
                double d = 0.0;
                for (int e = 0; e < HD; e++)
                    d += (double)c->in[0][i * NH * HD + h * HD + e] *
                         c->in[1][j * NKV * HD + g * HD + e];
                sc[j] = d / sqrt((double)HD);
                m = fmax(m, sc[j]);
            }
            for (int j = 0; j <= i; j++)
                sum += exp(sc[j] - m);
            for (int e = 0; e < HD; e++) {
                double o = 0.0;
                for (int j = 0; j <= i; j++)
                    o += exp(sc[j] - m) / sum * c->in[2][j * NKV * HD + g * HD + e];
                want[i * NH * HD + h * HD + e] = o;
            }
        }
    }
    expect_close(c, want, T * NH * HD, 1e-5);
    free(c);
}

/* ---- timing only: the same times, no data read ---- */

static void test_device_none(void **state)
{
    (void)state;
    for (int op = OP_ATTN; op <= OP_EMB; op += OP_EMB - OP_ATTN) {
        nn_case *a = new_case(op, KB_F32, op == OP_EMB ? 4 : 5, op == OP_EMB ? 6 : 9);
        nn_case *b;
        if (op == OP_EMB) {
            set_input(a, 0, 10, 6, 1.0f, 1);
            a->r[1] = 1;
            a->c[1] = 4;
        } else {
            set_input(a, 0, 5, 9, 1.0f, 1);
            a->f[0] = 1.0f;
            a->f[1] = 3.0f;
            a->i[0] = 1;
        }
        b = malloc(sizeof *b);
        assert_non_null(b);
        memcpy(b, a, sizeof *a);
        run_case(a, KB_DEV_REF);
        run_case(b, KB_DEV_NONE);
        assert_int_equal(a->dt_op, b->dt_op);
        free(a);
        free(b);
    }
}

/* ---- misuse ---- */

static void test_errors(void **state)
{
    static const struct { int op; uint32_t r1, c1; const char *msg; } cases[] = {
        { OP_RMS, 1, 5, "tl_rmsnorm: the weight is 1x5, needs 1x8" },
        { OP_ROPE, 4, 3, "tl_rope" },
        { OP_CAT1, 3, 8, "tl_concat" },
        { OP_GATED_SILU, 4, 7, "tl_gated" },
        { OP_SOFTCAP, 0, 0, "tl_softcap: cap" },
        { OP_REPKV, 0, 0, "tl_repeat_kv" },
    };
    (void)state;
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        nn_case *c = new_case(cases[t].op, KB_F32, 4, 8);
        set_input(c, 0, 4, 8, 1.0f, 1);
        if (cases[t].r1) {
            set_input(c, 1, cases[t].r1, cases[t].c1, 1.0f, 2);
            if (cases[t].op == OP_ROPE)
                set_input(c, 2, cases[t].r1, cases[t].c1, 1.0f, 3);
        }
        c->f[0] = -1.0f;   /* softcap: not positive */
        c->i[0] = 3;       /* repeat_kv: 3 heads of 3 != 8 columns */
        c->i[1] = 3;
        c->i[2] = 2;
        c->fail_msg = cases[t].msg;
        run_case(c, KB_DEV_REF);
        free(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_attn_softmax),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_transpose_concat_repeat),
        cmocka_unit_test(test_gated),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_attention_block),
        cmocka_unit_test(test_device_none),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
