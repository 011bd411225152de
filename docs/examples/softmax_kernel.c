/*
 * softmax_kernel — the worked example of docs/kernels.md: a row-wise softmax (over each row's
 * columns) of an R x C f16 tensor, computed two ways on one cube of the default machine, and
 * checked against a host reference in double.
 *
 *  1. X is placed column_wise over 4 PEs, so no PE holds a whole row. Each PE reads every
 *     shard (its own and its peers', by VA), builds the row maxima and the row sums of
 *     exp(x - max) over all shards, and writes its own columns of Y.
 *  2. X is placed row_wise over 4 PEs, so every PE holds whole rows and one tl_softmax(v, 1)
 *     does the work.
 *
 * The main build makes it build/examples/softmax_kernel; CTest's example_softmax_kernel checks
 * that it prints what docs/kernels.md §8 quotes. By hand, from the repository root after
 * `cmake --build build` (it uses the kb_host layer and the two below it):
 *   gcc -I sched -I cl -I host -I host/config -I host/hw -I host/mem \
 *       docs/examples/softmax_kernel.c build/libkb_host.a build/libkb_cl.a build/libkb_sched.a \
 *       -lcjson -lyaml -lOpenCL -lm -o /tmp/softmax_kernel
 * Against an installed kbcl (docs/plugins.md "Installing kbcl"): docs/examples/CMakeLists.txt,
 * or cc docs/examples/softmax_kernel.c $(pkg-config --cflags --libs kbcl) -o /tmp/softmax_kernel
 * Limits: an example, not a library kernel; R x (C / 4) blocks must fit the PE's scratch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kbcl_tl.h"

#define R 16   /* rows */
#define C 64   /* columns */
#define P 4    /* PEs of cube 0 that hold X */

/* Both kernels' arguments: a struct in kb_kargs' typed block (KB_KARGS_PUT / _GET). */
typedef struct softmax_args {
    kb_va x, y;
    int64_t rows, cols_per_pe, pes;
} softmax_args;

/* Version 1: X column_wise over P PEs; shard k is the R x c block at x + k * R * c * 2. */
static void softmax_rows_colwise(kb_tl *tl, const kb_kargs *ka)
{
    const softmax_args *a = KB_KARGS_GET(ka, softmax_args);
    int64_t rows = a->rows, c = a->cols_per_pe, np = a->pes;
    int me = tl_program_id(tl, 0);                  /* PE index inside the grid */
    kb_va x = a->x, y = a->y;
    kb_va block = (kb_va)(rows * c) * 2;            /* bytes of one f16 shard */
    kb_val mx = { 0 }, sum = { 0 };

    /* pass 1: row maxima over every shard (peers' shards come by DMA from their HBM) */
    for (int64_t k = 0; k < np; k++) {
        kb_val b = tl_load(tl, x + (kb_va)k * block, KB_SHAPE2(rows, c), KB_F16);
        kb_val m = tl_max(tl, b, 1);                /* R x 1 */
        tl_free(tl, b);
        if (k == 0) {
            mx = m;
        } else {
            kb_val t = tl_maximum(tl, mx, m);
            tl_free(tl, mx);
            tl_free(tl, m);
            mx = t;
        }
    }
    /* pass 2: row sums of exp(x - max); R x c minus R x 1 broadcasts along the columns */
    for (int64_t k = 0; k < np; k++) {
        kb_val b = tl_load(tl, x + (kb_va)k * block, KB_SHAPE2(rows, c), KB_F16);
        kb_val d = tl_sub(tl, b, mx);
        kb_val e = tl_exp(tl, d);
        kb_val s = tl_sum(tl, e, 1);                /* R x 1 */
        tl_free(tl, b);
        tl_free(tl, d);
        tl_free(tl, e);
        if (k == 0) {
            sum = s;
        } else {
            kb_val t = tl_add(tl, sum, s);
            tl_free(tl, sum);
            tl_free(tl, s);
            sum = t;
        }
    }
    /* own columns: exp(x - max) / sum, rounded once to Y's f16 by tl_store */
    kb_val b = tl_load(tl, x + (kb_va)me * block, KB_SHAPE2(rows, c), KB_F16);
    kb_val e = tl_exp(tl, tl_sub(tl, b, mx));       /* the inner value is freed at return */
    tl_store(tl, y + (kb_va)me * block, tl_div(tl, e, sum));
}

/* Version 2: X row_wise over P PEs; shard k is the (R / P) x C block at x + k * (R/P) * C * 2. */
static void softmax_rows_rowwise(kb_tl *tl, const kb_kargs *ka)
{
    const softmax_args *a = KB_KARGS_GET(ka, softmax_args);
    int64_t rp = a->rows / a->pes, cols = a->cols_per_pe * a->pes;
    kb_va off = (kb_va)tl_program_id(tl, 0) * (kb_va)(rp * cols) * 2;
    kb_val b = tl_load(tl, a->x + off, KB_SHAPE2(rp, cols), KB_F16);
    tl_store(tl, a->y + off, tl_softmax(tl, b, 1));
}

typedef struct run {
    float x[R * C];
    float y[2][R * C];
    double ns[2];
} run;

/* The host program: runs as a fiber; every call below costs simulated time. */
static int host(kb_ctx *ctx, void *arg)
{
    run *st = arg;
    static const char *const names[2] = { "softmax_rows_colwise", "softmax_rows_rowwise" };
    kb_kernel_fn kernels[2] = { softmax_rows_colwise, softmax_rows_rowwise };
    kb_dp_split split[2] = { KB_DP_COLUMN_WISE, KB_DP_ROW_WISE };
    int rc;

    for (int v = 0; v < 2; v++) {
        /* one cube (num_cubes 1), P PEs of it; the cube level replicates over that one cube */
        kb_tensor_desc dx = { "x", R, C, KB_F16, kb_dp(KB_DP_REPLICATE, split[v], 1, P),
                              KB_MEM_HBM };
        kb_tensor_desc dy = dx;
        kb_tensor *x, *y;
        dy.name = "y";
        if ((rc = kb_tensor_from_host(ctx, &dx, st->x, &x)) != 0 ||
            (rc = kb_tensor_empty(ctx, &dy, &y)) != 0)
            return rc;
        kb_kargs a;
        memset(&a, 0, sizeof a);
        KB_KARGS_PUT(&a, (softmax_args){ .x = kb_tensor_va(x), .y = kb_tensor_va(y),
                                         .rows = R, .cols_per_pe = C / P, .pes = P });
        kb_grid g = kb_grid_of(x);                 /* P PEs x 1 cube of x's SIP */
        kb_time t0 = kb_ctx_now(ctx);
        if ((rc = kb_launch(ctx, names[v], kernels[v], &a, &g)) != 0)
            return rc;
        st->ns[v] = kb_time_to_ns(kb_ctx_now(ctx) - t0);
        if ((rc = kb_tensor_read(y, st->y[v])) != 0)   /* Phase-2 replay, then a timed read */
            return rc;
    }
    return 0;
}

int main(void)
{
    static run st;
    kb_config *cfg = NULL;
    kb_ctx_opts opts = { .device = KB_DEV_REF };
    kb_ctx *ctx = NULL;
    kb_errbuf eb;
    int rc, bad = 0;
    double worst = 0.0;

    /* inputs exact in f16: multiples of 1/4 in [-2, 2] */
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++)
            st.x[i * C + j] = (float)((i * 7 + j * 3) % 17) / 4.0f - 2.0f;

    if ((rc = kb_config_create(&cfg, &eb)) != 0 ||   /* the default machine */
        (rc = kb_ctx_create(cfg, &opts, &ctx, &eb)) != 0) {
        fprintf(stderr, "kb_ctx_create: %s\n", eb.msg);
        kb_config_destroy(cfg);
        return 1;
    }
    kb_config_destroy(cfg);                        /* the context has its copy */
    rc = kb_ctx_run_host(ctx, host, &st);
    if (rc != 0) {
        fprintf(stderr, "run: %s: %s\n", kb_strerror(rc), kb_ctx_errmsg(ctx));
        kb_ctx_destroy(ctx);
        return 1;
    }
    kb_ctx_destroy(ctx);

    /* host reference in double; allowed error: half an f16 ulp of the result + f32 noise */
    for (int i = 0; i < R; i++) {
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < C; j++)
            mx = st.x[i * C + j] > mx ? st.x[i * C + j] : mx;
        for (int j = 0; j < C; j++)
            sum += exp(st.x[i * C + j] - mx);
        for (int j = 0; j < C; j++) {
            double ref = exp(st.x[i * C + j] - mx) / sum;
            for (int v = 0; v < 2; v++) {
                double err = fabs(st.y[v][i * C + j] - ref);
                worst = err > worst ? err : worst;
                bad += err > 0.5 * kb_f16_ulp((float)ref) + 1e-6;
            }
        }
    }
    printf("softmax_rows_colwise: %.3f ns\n", st.ns[0]);
    printf("softmax_rows_rowwise: %.3f ns\n", st.ns[1]);
    printf("y[0][0..3] = %.6f %.6f %.6f %.6f\n", st.y[0][0], st.y[0][1], st.y[0][2], st.y[0][3]);
    printf("max |y - ref| = %.3g over %d values: %s\n", worst, 2 * R * C, bad ? "FAIL" : "OK");
    return bad ? 1 : 0;
}
