/*
 * my_ring — the plugin example of docs/plugins.md: a user's own collective and bench, added to
 * kbcl as a shared object (libmy_ring.so) without rebuilding kbcl.
 *
 *  my_ring   (rank = PE all-reduce) a ring that passes running sums: at every step a rank
 *            sends its running sum east, receives its west neighbour's and adds its own tile
 *            to it, so after p-1 steps every rank holds the sum of all p tiles. Unlike kbcl's
 *            ring_allreduce (which forwards f16 tiles and adds them off the critical path) the
 *            messages are f32 sums and each step's add is on the path; the result is rounded
 *            once. It runs on any world size (KB_CCL_ANY_WORLD: partial cubes are fine) and
 *            at any tile size (kb_ccl_run_tile streams a long tile block by block).
 *  my_scale  (bench) y = 0.5 x + 1 for an R x C f16 tensor split row-wise over the PEs of
 *            cube 0, checked against a host computation.
 *
 * Build it against an installed kbcl (docs/examples/CMakeLists.txt: kbcl_add_plugin), or by
 * hand with only the headers — a plugin links no kbcl library, kbcl's symbols come from the
 * kbcl executable that loads it:
 *   cc -shared -fPIC $(pkg-config --cflags kbcl) docs/examples/my_ring.c -o libmy_ring.so
 *   kbcl run --plugin ./libmy_ring.so --bench ccl --algorithm my_ring --world-size 12 \
 *            --size 1M --device ref --verify-data
 *   kbcl run --plugin ./libmy_ring.so --bench my_scale --verify-data
 * Limits: an example; a tile's blocks follow kb_ccl_run_tile's sizes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kbcl_plugin.h"
#include "kbcl_tl.h"

/* ---- my_ring ---- */

/* The ring over the n elements at va (the whole tile, or one block of it). */
static void my_ring_body(kb_tl *tl, const kb_kargs *a, kb_va va, int64_t n)
{
    int64_t ws = a->i[KB_CCL_ARG_WS];
    kb_val own = tl_load(tl, va, KB_SHAPE1(n), KB_F16);
    kb_val run = tl_scale(tl, own, 1.0f, 0.0f); /* the running sum, f32 */

    for (int64_t step = 0; step + 1 < ws; step++) {
        /* send the running sum east (and drop it), take the west neighbour's */
        kb_val in = kb_ccl_sendrecv(tl, KB_DIR_E, run, run, KB_DIR_W, KB_SHAPE1(n), KB_F32);
        run = tl_add(tl, own, in);
        tl_free(tl, in);
    }
    tl_store(tl, va, run); /* rounded once to f16 */
    tl_free(tl, run);
    tl_free(tl, own);
}

static void my_ring(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a PE of the last cube past the last rank */
        return;
    kb_ccl_run_tile(tl, a, kb_ccl_my_tile(tl, a), a->i[KB_CCL_ARG_N], KB_F16, 4, my_ring_body);
}

/* The largest message: an f32 sum of the tile (a longer one travels as slot-sized chunks). */
static uint64_t my_ring_msg(int64_t n, int ws)
{
    (void)ws;
    return (uint64_t)n * 4;
}

static const kb_ccl_algo_impl my_ring_algo = {
    .head = KB_CCL_ALGO_HEAD, /* the size and version this plugin was built with */
    .module = "my_ring",
    .summary = "ring passing f32 running sums: p-1 steps, each adds the rank's own tile",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "ring_1d",
    .kernel = my_ring,
    .max_msg_bytes = my_ring_msg,
    .reference = kb_ccl_ref_allreduce,
    .flags = KB_CCL_ANY_WORLD,
};

/* ---- my_scale ---- */

enum { P_ROWS, P_COLS, P_PES };

static const kb_bench_pat pat_x = { .seed = 7, .range = 64, .den = 8.0f };

typedef struct scale_state {
    kb_tensor *x, *y;
    kb_bench_pat px;
} scale_state;

/* The kernel's own arguments: a struct in kb_kargs' typed block (KB_KARGS_PUT at the launch,
 * KB_KARGS_GET in the kernel). */
typedef struct scale_args {
    kb_va x, y;
    int64_t rows, cols; /* a PE's block */
} scale_args;

/* Every PE: its block of rows of x, scaled, into the same rows of y. */
static void scale_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const scale_args *a = KB_KARGS_GET(ka, scale_args);
    kb_va off = (kb_va)tl_program_id(tl, 0) * (kb_va)(a->rows * a->cols * 2);
    kb_val x = tl_load(tl, a->x + off, KB_SHAPE2(a->rows, a->cols), KB_F16);
    kb_val y = tl_scale(tl, x, 0.5f, 1.0f);
    tl_store(tl, a->y + off, y);
}

static int scale_run(kb_ctx *ctx, const kb_bench_args *args, void *state, kb_bench_result *res)
{
    scale_state *st = state;
    int64_t R = args->p[P_ROWS], C = args->p[P_COLS], P = args->p[P_PES];
    kb_dp_policy dp = kb_dp(KB_DP_REPLICATE, KB_DP_ROW_WISE, 1, (int)P);
    kb_tensor_desc dx = { "x", R, C, KB_F16, dp, KB_MEM_HBM };
    kb_tensor_desc dy = { "y", R, C, KB_F16, dp, KB_MEM_HBM };
    kb_kargs ka;
    kb_grid g = { (int)P, 1, 1, -1 };
    kb_fill fx;
    int rc;

    if (R % P || P > kb_ctx_machine_shape(ctx).pes)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_USAGE, "my_scale: rows=%lld must be a "
                          "multiple of pes=%lld, at most the cube's %d PEs", (long long)R,
                          (long long)P, kb_ctx_machine_shape(ctx).pes);
    st->px = pat_x;
    st->px.ld = C;
    fx = kb_bench_pattern_fill(&st->px);
    if ((rc = kb_tensor_from_fill(ctx, &dx, &fx, &st->x)) != 0 ||
        (rc = kb_tensor_empty(ctx, &dy, &st->y)) != 0)
        return rc;
    memset(&ka, 0, sizeof ka);
    KB_KARGS_PUT(&ka, (scale_args){ .x = kb_tensor_va(st->x), .y = kb_tensor_va(st->y),
                                    .rows = R / P, .cols = C });
    kb_bench_mark_begin(ctx, res);
    if ((rc = kb_launch(ctx, "my_scale", scale_kernel, &ka, &g)) != 0)
        return rc;
    kb_bench_mark_end(ctx, res);
    snprintf(res->line, sizeof res->line, "  my_scale (%lldx%lld f16 over %lld PEs)",
             (long long)R, (long long)C, (long long)P);
    return 0;
}

static int scale_verify(kb_ctx *ctx, const kb_bench_args *args, void *state,
                        kb_bench_result *res)
{
    scale_state *st = state;
    size_t n = (size_t)(args->p[P_ROWS] * args->p[P_COLS]);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    double *ref = malloc(n * sizeof *ref);
    int rc = 0;

    if (!x || !y || !ref) {
        rc = kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = kb_tensor_read(st->y, y)) != 0)
        goto out;
    kb_bench_pattern(x, n, pat_x.seed, pat_x.range, pat_x.den);
    for (size_t i = 0; i < n; i++)
        ref[i] = 0.5 * (double)kb_f16_to_f32(kb_f32_to_f16(x[i])) + 1.0;
    res->verified = kb_bench_check(res, KB_F16, y, ref, NULL, n, "y");
    res->digest = kb_fnv1a64(y, n * sizeof *y, KB_FNV1A64_INIT);
    res->have_digest = 1;
out:
    free(x);
    free(y);
    free(ref);
    return rc;
}

static const kb_bench my_scale_bench = {
    .head = KB_BENCH_HEAD,
    .name = "my_scale",
    .summary = "plugin example: y = 0.5 x + 1, rows split over PEs of cube 0, verified",
    .params = {
        { "rows", 32, 1, 4096, "rows of x and y" },
        { "cols", 64, 1, 4096, "columns of x and y" },
        { "pes", 4, 1, 64, "PEs of cube 0 that hold rows (rows must divide evenly)" },
    },
    .nparams = 3,
    .state_size = sizeof(scale_state),
    .run = scale_run,
    .verify = scale_verify,
    /* no cleanup (the tensors are the context's), and no --size (size_elem_bytes 0) */
};

/* ---- the plugin's entry points ---- */

KB_PLUGIN_DECLARE_ABI;

int kbcl_plugin_init(kb_plugin_reg *reg, int abi_version)
{
    int rc;
    if (abi_version != KB_PLUGIN_ABI_VERSION) /* the loader checked kbcl_plugin_abi already */
        return -1;
    if ((rc = reg->describe(reg, "my_ring", "a user's ring all-reduce and a small bench")) ||
        (rc = reg->add_ccl_algo(reg, &my_ring_algo)) ||
        (rc = reg->add_bench(reg, &my_scale_bench)))
        return rc;
    return 0;
}
