/*
 * kb_tp — column/row-parallel linear layers over the process group (kb_tp.h). Host-side
 * slicing picks the rank's part of the full weights; kernels run on the PEs that hold the
 * slices; the row-parallel reduction is the process group's all-reduce.
 */
#include "kb_tp.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_dist_algo.h"
#include "kb_tl.h"

int kb_tp_initialize_model_parallel(kb_ctx *ctx, int tp)
{
    int ws = kb_dist_get_world_size(ctx);
    if (ws < 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE,
                          "initialize_model_parallel before init_process_group");
    if (tp != ws)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_UNSUPPORTED,
                          "initialize_model_parallel(%d): tensor-parallel size must equal the "
                          "world size %d (other splits are not implemented)", tp, ws);
    const char *alg = kb_dist_algorithm(ctx);
    const kb_ccl_algo_impl *da = kb_dist_algo_of(ctx);
    assert(alg && da); /* an initialised process group has its module and its entry */
    /* the layers' partial sums live on every PE of a rank: the collective must take them all */
    if (!da || strcmp(da->sip->mapper, "all_pes") != 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_CONFIG,
                          "tensor parallelism reduces partial sums on every PE: the process "
                          "group's algorithm must use every PE of a rank (mapper all_pes, e.g. "
                          "hierarchical_allreduce; it uses %s)", alg ? alg : "none");
    return 0;
}

int kb_tp_get_rank(kb_ctx *ctx) { return kb_dist_get_rank(ctx); }
int kb_tp_world_size(kb_ctx *ctx) { return kb_dist_get_world_size(ctx); }

void kb_tp_pick_pes(const kb_machine *m, int64_t n, int *cubes, int *pes)
{
    int total = m->ncubes * m->npes;
    assert(m->ncubes >= 1 && m->npes >= 1);
    for (int p = total < n ? total : (int)n; p >= 1; p--) {
        if (n % p)
            continue;
        if (p <= m->npes) {
            *cubes = 1;
            *pes = p;
            return;
        }
        if (p % m->npes == 0) {
            *cubes = p / m->npes;
            *pes = m->npes;
            assert(*cubes <= m->ncubes); /* p <= total */
            return;
        }
    }
    /* p = 1 divides every n >= 1 and fits one cube: only an empty side gets here */
    assert(n < 1);
    *cubes = 1;
    *pes = 1;
}

static int make(kb_ctx *ctx, const char *name, int64_t rows, int64_t cols, kb_dp_policy dp,
                const kb_fill *src, kb_tensor **out)
{
    kb_tensor_desc d = { name, rows, cols, KB_F16, dp, KB_MEM_HBM };
    return src ? kb_tensor_from_fill(ctx, &d, src, out) : kb_tensor_empty(ctx, &d, out);
}

static int linear(kb_ctx *ctx, int column, int64_t in, int64_t out, const kb_fill *w_full,
                  const kb_fill *b_full, kb_tp_linear *lin)
{
    int ws = kb_tp_world_size(ctx), r = kb_tp_get_rank(ctx), rc = 0;
    int64_t split = column ? out : in;

    memset(lin, 0, sizeof *lin);
    if (ws < 1 || r < 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "parallel linear outside a TP rank");
    if (split % ws)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_RANGE, "%s linear: %lld %s not divisible by "
                          "the TP size %d", column ? "column-parallel" : "row-parallel",
                          (long long)split, column ? "outputs" : "inputs", ws);
    lin->column = column;
    lin->in = in;
    lin->out = out;
    lin->local_in = column ? in : in / ws;
    lin->local_out = column ? out / ws : out;
    assert(r < ws); /* the process group hands out ranks 0 .. ws - 1 */
    kb_tp_pick_pes(kb_ctx_machine(ctx), column ? lin->local_out : lin->local_in, &lin->cubes,
                   &lin->pes);
    /* the kernels split the sliced dimension evenly over the layer's PEs */
    assert((column ? lin->local_out : lin->local_in) % (lin->cubes * lin->pes) == 0);
    /* the rank's slice of the full weight lies inside it */
    assert((int64_t)(r + 1) * (column ? lin->local_out : lin->local_in) <= split);
    /* the rank's slice, read through the fill (only when the write records) */
    kb_fill w = column ? kb_fill_at(*w_full, 0, (int64_t)r * lin->local_out)
                       : kb_fill_at(*w_full, (int64_t)r * lin->local_in, 0);
    kb_dp_policy dp = column ? kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, lin->cubes, lin->pes)
                             : kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, lin->cubes, lin->pes);
    rc = make(ctx, column ? "w_col" : "w_row", lin->local_in, lin->local_out, dp, &w, &lin->w);
    if (rc == 0 && b_full) {
        /* column: the rank's bias slice split like W's columns; row: the full bias, replicated */
        kb_fill b = column ? kb_fill_at(*b_full, 0, (int64_t)r * lin->local_out) : *b_full;
        rc = column ? make(ctx, "b_col", 1, lin->local_out,
                           kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, lin->cubes, lin->pes),
                           &b, &lin->b)
                    : make(ctx, "b_row", 1, out, kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 0, 0),
                           &b, &lin->b);
    }
    return rc;
}

int kb_tp_column_linear_fill(kb_ctx *ctx, int64_t in, int64_t out, const kb_fill *w_full,
                             const kb_fill *b_full, kb_tp_linear *lin)
{
    return linear(ctx, 1, in, out, w_full, b_full, lin);
}

int kb_tp_row_linear_fill(kb_ctx *ctx, int64_t in, int64_t out, const kb_fill *w_full,
                          const kb_fill *b_full, kb_tp_linear *lin)
{
    return linear(ctx, 0, in, out, w_full, b_full, lin);
}

int kb_tp_input_fill(kb_ctx *ctx, const kb_tp_linear *lin, int64_t m, const kb_fill *x,
                     kb_tensor **out)
{
    return make(ctx, "x", m, lin->local_in,
                kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, lin->cubes, lin->pes), x, out);
}

int kb_tp_column_linear(kb_ctx *ctx, int64_t in, int64_t out, const float *w_full,
                        const float *b_full, kb_tp_linear *lin)
{
    kb_fill w = kb_fill_array(w_full, out), b = kb_fill_array(b_full, out);
    return linear(ctx, 1, in, out, &w, b_full ? &b : NULL, lin);
}

int kb_tp_row_linear(kb_ctx *ctx, int64_t in, int64_t out, const float *w_full,
                     const float *b_full, kb_tp_linear *lin)
{
    kb_fill w = kb_fill_array(w_full, out), b = kb_fill_array(b_full, out);
    return linear(ctx, 0, in, out, &w, b_full ? &b : NULL, lin);
}

int kb_tp_input(kb_ctx *ctx, const kb_tp_linear *lin, int64_t m, const float *x, kb_tensor **out)
{
    kb_fill f = kb_fill_array(x, lin->local_in);
    return kb_tp_input_fill(ctx, lin, m, x ? &f : NULL, out);
}

/* ---- kernels (PE index j = cube * pes + pe within the layer's grid) ---- */

static int pe_index(kb_tl *tl)
{
    int j = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    assert(j >= 0 && j < tl_num_programs(tl, 1) * tl_num_programs(tl, 0));
    return j;
}

typedef struct column_args {
    kb_va x, w, b, y;
    int64_t m, k;
    int64_t c;        /* columns per PE */
    int has_bias, gelu;
} column_args;

static void column_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const column_args *a = KB_KARGS_GET(ka, column_args);
    int64_t m = a->m, k = a->k, c = a->c;
    int j = pe_index(tl);
    kb_val x = tl_load(tl, a->x + (kb_va)j * (kb_va)(m * k * 2), KB_SHAPE2(m, k), KB_F16);
    kb_val w = tl_ref(tl, a->w + (kb_va)j * (kb_va)(k * c * 2), KB_SHAPE2(k, c), KB_F16);
    kb_val y = tl_dot(tl, x, w);
    tl_free(tl, x);
    if (a->has_bias) {
        kb_val b = tl_load(tl, a->b + (kb_va)j * (kb_va)(c * 2), KB_SHAPE2(1, c), KB_F16);
        kb_val yb = tl_add(tl, y, b);
        tl_free(tl, y);
        tl_free(tl, b);
        y = yb;
    }
    if (a->gelu) {
        kb_val g = tl_gelu(tl, y);
        tl_free(tl, y);
        y = g;
    }
    tl_store(tl, a->y + (kb_va)j * (kb_va)(m * c * 2), y);
}

int kb_tp_column_forward(kb_ctx *ctx, const kb_tp_linear *lin, kb_tensor *x, int gelu,
                         kb_tensor **y_local)
{
    int64_t m = kb_tensor_rows(x);
    int rc;
    if (!lin->column || kb_tensor_cols(x) != lin->in)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL, "column forward: x must be m x %lld",
                          (long long)lin->in);
    rc = make(ctx, "y_local", m, lin->local_out,
              kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, lin->cubes, lin->pes), NULL, y_local);
    if (rc)
        return rc;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    /* the layer was built with a grid that splits its columns evenly (linear) */
    assert(lin->local_out % (lin->cubes * lin->pes) == 0);
    KB_KARGS_PUT(&a, (column_args){ .x = kb_tensor_va(x), .w = kb_tensor_va(lin->w),
                                    .b = lin->b ? kb_tensor_va(lin->b) : 0,
                                    .y = kb_tensor_va(*y_local), .m = m, .k = lin->in,
                                    .c = lin->local_out / (lin->cubes * lin->pes),
                                    .has_bias = lin->b != NULL, .gelu = gelu });
    kb_grid g = { lin->pes, lin->cubes, 1, -1 };
    return kb_launch(ctx, "tp_column", column_kernel, &a, &g);
}

typedef struct row_args {
    kb_va x_local, w, partial;
    int64_t m;
    int64_t kr; /* rows of W per PE */
    int64_t n;
} row_args;

static void row_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const row_args *a = KB_KARGS_GET(ka, row_args);
    int64_t m = a->m, kr = a->kr, n = a->n;
    int j = pe_index(tl);
    kb_val x = tl_load(tl, a->x_local + (kb_va)j * (kb_va)(m * kr * 2), KB_SHAPE2(m, kr), KB_F16);
    kb_val w = tl_ref(tl, a->w + (kb_va)j * (kb_va)(kr * n * 2), KB_SHAPE2(kr, n), KB_F16);
    kb_val p = tl_dot(tl, x, w);
    /* PE j of the layer is PE j of the SIP: its partial goes to block j (f32) */
    tl_store(tl, a->partial + (kb_va)j * (kb_va)(m * n * 4), p);
}

typedef struct bias_args {
    kb_va partial, bias, y; /* partial: f32 */
    int64_t mn;             /* elements of a PE's block */
    int64_t n;
    int has_bias;
} bias_args;

static void bias_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const bias_args *a = KB_KARGS_GET(ka, bias_args);
    int64_t mn = a->mn, n = a->n;
    int j = pe_index(tl);
    assert(n > 0 && mn % n == 0); /* a block is whole rows of the partial sums */
    kb_val p = tl_load(tl, a->partial + (kb_va)j * (kb_va)(mn * 4), KB_SHAPE2(mn / n, n), KB_F32);
    if (a->has_bias) {
        kb_val b = tl_load(tl, a->bias + (kb_va)j * (kb_va)(n * 2), KB_SHAPE2(1, n), KB_F16);
        kb_val s = tl_add(tl, p, b);
        tl_free(tl, p);
        p = s;
    }
    tl_store(tl, a->y + (kb_va)j * (kb_va)(mn * 2), p);
}

int kb_tp_reduce_blocks(kb_ctx *ctx, kb_tensor *partial, kb_tensor *bias, kb_tensor **y)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int S = m->ncubes * m->npes, rc;
    int64_t rows = kb_tensor_rows(partial), n = kb_tensor_cols(partial), mb = rows / S;
    /* bias_kernel's PE j reads block j: a ragged last block would be summed short */
    if (rows % S != 0 || rows == 0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL,
                          "reduce_blocks: partial has %lld rows, not a positive multiple of "
                          "the SIP's %d PEs (one m x n block per PE)", (long long)rows, S);
    if (bias && (kb_tensor_rows(bias) != 1 || kb_tensor_cols(bias) != n))
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL,
                          "reduce_blocks: bias must be 1 x %lld, is %lld x %lld", (long long)n,
                          (long long)kb_tensor_rows(bias), (long long)kb_tensor_cols(bias));
    if ((rc = kb_dist_all_reduce(ctx, partial, KB_DIST_SUM)) != 0)
        return rc;
    if ((rc = make(ctx, "y", rows, n, kb_dist_policy(ctx), NULL, y)) != 0)
        return rc;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, (bias_args){ .partial = kb_tensor_va(partial),
                                  .bias = bias ? kb_tensor_va(bias) : 0, .y = kb_tensor_va(*y),
                                  .mn = mb * n, .n = n, .has_bias = bias != NULL });
    kb_grid g = { m->npes, m->ncubes, 1, -1 };
    return kb_launch(ctx, "tp_bias", bias_kernel, &a, &g);
}

int kb_tp_row_forward(kb_ctx *ctx, const kb_tp_linear *lin, kb_tensor *x_local, kb_tensor **y)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int S = m->ncubes * m->npes, P = lin->cubes * lin->pes, rc;
    int64_t mrows = kb_tensor_rows(x_local);
    kb_tensor *partial;

    if (lin->column || kb_tensor_cols(x_local) != lin->local_in ||
        (int)kb_tensor_nshards(x_local) != P)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL,
                          "row forward: x_local must be m x %lld split column-wise over the %d "
                          "PEs that hold W's rows", (long long)lin->local_in, P);
    /* row_kernel's PE j writes block j of partial's S blocks; the rows split evenly */
    assert(P <= S && lin->local_in % P == 0);
    kb_tensor_desc dp = { "partial", (int64_t)S * mrows, lin->out, KB_F32, kb_dist_policy(ctx),
                          KB_MEM_HBM };
    if ((rc = kb_tensor_zeros(ctx, &dp, &partial)) != 0)
        return rc;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, (row_args){ .x_local = kb_tensor_va(x_local), .w = kb_tensor_va(lin->w),
                                 .partial = kb_tensor_va(partial), .m = mrows,
                                 .kr = lin->local_in / P, .n = lin->out });
    kb_grid g = { lin->pes, lin->cubes, 1, -1 };
    if ((rc = kb_launch(ctx, "tp_row", row_kernel, &a, &g)) != 0)
        return rc;
    return kb_tp_reduce_blocks(ctx, partial, lin->b, y);
}

int kb_tp_gather_from_tp_region(kb_ctx *ctx, kb_tensor *y_local, kb_tensor **y)
{
    int ws = kb_tp_world_size(ctx), S = kb_dist_shards_per_rank(ctx);
    int64_t m = kb_tensor_rows(y_local), k = kb_tensor_cols(y_local);
    int rc;
    if ((int)kb_tensor_nshards(y_local) != S)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL,
                          "gather_from_tp_region: the local output must be split over all %d "
                          "PEs of the SIP (local columns divisible by %d)", S, S);
    if ((rc = make(ctx, "gathered", (int64_t)S * m, k * ws, kb_dist_policy(ctx), NULL, y)) != 0)
        return rc;
    return kb_dist_all_gather(ctx, *y, y_local);
}
