/*
 * Tests of the decoder layer (tp/kb_decoder.h, tp/kb_model.h, the decoder_layer bench):
 * model files and their errors, the placement plan at the shipped shapes (mappings naive and
 * machine, auto's choice, machine's refusal of decode), the projection gemms' simulated time
 * against the closed form kb_qgemm_ns for every format and sparsity in both mappings, and end
 * to end through the kbcl binary with the tiny models: every mode verifies (machine with
 * batches, query blocks and row owners that cut each other), digests are pinned (fused
 * launches or a launch per kernel alike, and the fused ones count the same traffic in less
 * time), and an OpenCL CPU device gives ref's digest.
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

#include "kb_bench.h"
#include "kb_decoder.h"
#include "kb_model.h"
#include "kb_tl_q.h"

#include "kb_test_util.h"

static char path_buf[1024];
static const char *src_path(const char *rel)
{
    const char *d = getenv("KBCL_SOURCE_DIR");
    snprintf(path_buf, sizeof path_buf, "%s/%s", d ? d : ".", rel);
    return path_buf;
}

static int setup(void **s)
{
    (void)s;
    return kbt_workdir_make("kbcl-decoder");
}

static int teardown(void **s)
{
    (void)s;
    return kbt_workdir_remove();
}

/* ---- model files ---- */

static void test_model_files(void **s)
{
    kb_model_cfg m;
    kb_errbuf eb = { { 0 } };
    (void)s;
    assert_int_equal(kb_model_load(&m, src_path("configs/models/gemma2-2b.yaml"), &eb), 0);
    assert_int_equal(m.d_model, 2304);
    assert_int_equal(m.n_heads, 8);
    assert_int_equal(m.n_kv_heads, 4);
    assert_int_equal(m.head_dim, 256);
    assert_int_equal(m.mlp_hidden, 9216);
    assert_int_equal(kb_model_act(&m), KB_ACT_GELU_TANH);
    assert_true(m.attn_softcap == 50.0 && m.norm_unit_offset == 1.0 && m.post_norms == 1);
    assert_true(m.norm_eps == 1e-6 && m.rope_theta == 10000.0);
    assert_true(kb_model_qscale(&m) == 1.0 / 16.0);
    assert_int_equal(kb_model_load(&m, src_path("configs/models/mistral-7b.yaml"), &eb), 0);
    assert_int_equal(m.d_model, 4096);
    assert_int_equal(m.n_heads, 32);
    assert_int_equal(m.n_kv_heads, 8);
    assert_int_equal(m.head_dim, 128);
    assert_int_equal(m.mlp_hidden, 14336);
    assert_int_equal(kb_model_act(&m), KB_ACT_SILU);
    assert_true(m.attn_softcap == 0.0 && m.norm_unit_offset == 0.0 && m.post_norms == 0);
    assert_true(m.rope_theta == 1e6 && m.norm_eps == 1e-5);
    assert_int_equal(kb_model_load(&m, src_path("configs/models/tiny.yaml"), &eb), 0);
    assert_int_equal(kb_model_load(&m, src_path("tests/data/tiny-silu.yaml"), &eb), 0);
    assert_int_equal(kb_model_act(&m), KB_ACT_SILU);
}

/* Every model key is documented in config-reference.md with its default. */
static char *g_ref_doc;
static void key_in_doc(const char *path, const char *type, const char *dflt, const char *doc,
                       void *ud)
{
    char want[256];
    (void)type;
    (void)doc;
    (void)ud;
    snprintf(want, sizeof want, "| `%s` |", path);
    if (!strstr(g_ref_doc, want))
        fail_msg("docs/config-reference.md does not list %s", path);
    snprintf(want, sizeof want, "| %s |", dflt);
    const char *row = strstr(g_ref_doc, path);
    const char *eol = row ? strchr(row, '\n') : NULL;
    char *hit = row ? strstr(row, want) : NULL;
    if (!hit || (eol && hit > eol))
        fail_msg("docs/config-reference.md: %s's default is not %s", path, dflt);
}

/* The reference continues from the device's normalised activations where they lie within the
 * f16 bound of its own, and names the first element that does not (kb_decoder_ref_in.n_dev). */
static void test_reference_takes_device_norm(void **s)
{
    kb_model_cfg m;
    kb_errbuf eb;
    (void)s;
    assert_int_equal(kb_model_load(&m, src_path("configs/models/tiny.yaml"), &eb), 0);
    enum { T = 4 };
    int64_t d = m.d_model, nq = m.n_heads * m.head_dim, nk = m.n_kv_heads * m.head_dim,
            F = m.mlp_hidden;
    kb_decoder_opts o = { 1, T, 0, 0, 0, KB_QF_INT8, 0, KB_DEC_MAP_NAIVE, 0 };
    size_t sz[] = { (size_t)(T * d), (size_t)(d * nq), (size_t)(d * nk), (size_t)(d * nk),
                    (size_t)(nq * d), (size_t)(d * F), (size_t)(d * F), (size_t)(F * d),
                    (size_t)d };
    float *a[9];
    uint64_t g = 12345;
    for (int i = 0; i < 9; i++) {
        a[i] = malloc(sizeof(float) * sz[i]);
        assert_non_null(a[i]);
        for (size_t j = 0; j < sz[i]; j++) { /* small values on an f16 grid */
            g = g * 6364136223846793005ull + 1442695040888963407ull;
            a[i][j] = (float)((int)(g >> 40 & 255) - 128) / (i == 0 ? 64.0f : 2048.0f);
        }
    }
    kb_decoder_ref_in in;
    memset(&in, 0, sizeof in);
    in.x = a[0];
    for (int i = 0; i < 4; i++)
        in.ln[i] = a[8];
    in.wq = a[1], in.wk = a[2], in.wv = a[3], in.wo = a[4], in.wg = a[5], in.wu = a[6],
    in.wd = a[7];
    in.act = KB_F16;
    in.o_seg = m.head_dim;
    in.mlp_seg = F;
    double *y0 = malloc(sizeof(double) * (size_t)(T * d)), *y1 = malloc(sizeof(double) * (size_t)(T * d));
    float *n1 = malloc(sizeof(float) * (size_t)(T * d)), *n2 = malloc(sizeof(float) * (size_t)(T * d));
    assert_true(y0 && y1 && n1 && n2);
    assert_int_equal(kb_decoder_reference(&m, &o, &in, y0, &eb), 0);
    /* device activations far from anything the reference computes: every element is named */
    int64_t far = 7;
    for (int64_t i = 0; i < T * d; i++)
        n1[i] = n2[i] = 1000.0f;
    in.n_dev[0] = n1;
    in.n_dev[1] = n2;
    in.n_tol = 1.0 / 128;
    in.n_far = &far;
    assert_int_equal(kb_decoder_reference(&m, &o, &in, y1, &eb), 0);
    assert_int_equal(far, 0);
    /* ... and the reference kept its own values: the same output */
    assert_memory_equal(y0, y1, sizeof(double) * (size_t)(T * d));
    free(y0), free(y1), free(n1), free(n2);
    for (int i = 0; i < 9; i++)
        free(a[i]);
}

static void test_model_keys_documented(void **s)
{
    (void)s;
    FILE *f = fopen(src_path("docs/config-reference.md"), "rb");
    assert_non_null(f);
    g_ref_doc = calloc(1, 1 << 20);
    assert_non_null(g_ref_doc);
    assert_true(fread(g_ref_doc, 1, (1 << 20) - 1, f) > 0);
    fclose(f);
    kb_model_foreach_key(key_in_doc, NULL);
    free(g_ref_doc);
}

static void write_file(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", kbt_workdir(), name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_model_errors(void **s)
{
    kb_model_cfg m;
    kb_errbuf eb = { { 0 } };
    char p[512];
    (void)s;
    write_file("bad1.yaml", "model:\n  d_model: 64\n  n_head: 4\n");
    snprintf(p, sizeof p, "%s/bad1.yaml", kbt_workdir());
    assert_int_equal(kb_model_load(&m, p, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "bad1.yaml:3:");
    kbt_msg_has(eb.msg, "n_head");
    write_file("bad2.yaml", "model:\n  activation: relu\n");
    snprintf(p, sizeof p, "%s/bad2.yaml", kbt_workdir());
    assert_int_equal(kb_model_load(&m, p, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "bad2.yaml:2:");
    kbt_msg_has(eb.msg, "gelu_tanh");
    write_file("bad3.yaml", "model:\n  d_model: 64\n  n_heads: 6\n  n_kv_heads: 4\n"
                            "  head_dim: 16\n  mlp_hidden: 128\n");
    snprintf(p, sizeof p, "%s/bad3.yaml", kbt_workdir());
    assert_int_equal(kb_model_load(&m, p, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "multiple of model.n_kv_heads");
    write_file("bad4.yaml", "model:\n  head_dim: -2\n");
    snprintf(p, sizeof p, "%s/bad4.yaml", kbt_workdir());
    assert_int_equal(kb_model_load(&m, p, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "bad4.yaml:2:");
    kbt_msg_has(eb.msg, "model.head_dim = -2 is out of range [2, 65536]");
    /* a floating-point key states its whole range, an exclusive bound as "(" */
    write_file("bad5.yaml", "model:\n  norm_eps: 0\n");
    snprintf(p, sizeof p, "%s/bad5.yaml", kbt_workdir());
    assert_int_equal(kb_model_load(&m, p, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "bad5.yaml:2:13: model.norm_eps = 0 is out of range (0, 1]");
    write_file("bad6.yaml", "model:\n  rope_theta: 2e12\n");
    snprintf(p, sizeof p, "%s/bad6.yaml", kbt_workdir());
    assert_int_equal(kb_model_load(&m, p, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "model.rope_theta = 2e12 is out of range (0, 1e12]");
    /* an empty file, or one cut short before the shape is complete, is an error (it used to
     * run the built-in Mistral-7B shape) */
    write_file("empty.yaml", "");
    snprintf(p, sizeof p, "%s/empty.yaml", kbt_workdir());
    assert_int_equal(kb_model_load(&m, p, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "empty.yaml: model.d_model is missing: a model file names the "
                        "layer's shape (model.d_model, n_heads, n_kv_heads, head_dim and "
                        "mlp_hidden)");
    write_file("cut.yaml", "model:\n  name: cut\n  d_model: 64\n  n_heads: 4\n"
                           "  n_kv_heads: 2\n  head_dim: 16\n");
    snprintf(p, sizeof p, "%s/cut.yaml", kbt_workdir());
    assert_int_equal(kb_model_load(&m, p, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "cut.yaml: model.mlp_hidden is missing");
    /* a configuration built in code skips the schema: the plan refuses a shape it would
     * divide by instead of dividing by zero */
    kb_model_cfg hand;
    kb_decoder_plan pl;
    kb_decoder_opts o = { 1, 16, 0, 0, 0, KB_QF_F16, 0, KB_DEC_MAP_NAIVE, 0 };
    kb_model_defaults(&hand);
    hand.n_kv_heads = 0;
    assert_int_equal(kb_model_validate(&hand, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "model: model.n_kv_heads 0 is out of range (at least 1)");
    assert_int_equal(kb_decoder_plan_make(&hand, &o, 4, 0, 16, 8, &pl, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "model.n_kv_heads 0 is out of range");
    kb_model_defaults(&hand);
    hand.head_dim = 0;
    assert_int_equal(kb_model_validate(&hand, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "model.head_dim 0 is out of range (at least 2)");
}

/* ---- placement ---- */

static void test_plan(void **s)
{
    kb_model_cfg m;
    kb_decoder_plan pl;
    kb_errbuf eb = { { 0 } };
    kb_decoder_opts o = { 1, 128, 0, 0, 0, KB_QF_F16, 0, KB_DEC_MAP_NAIVE, 0 };
    (void)s;
    assert_int_equal(kb_model_load(&m, src_path("configs/models/gemma2-2b.yaml"), &eb), 0);
    /* TP 4 on 16 cubes x 8 PEs: 2 q heads + 1 KV head per rank = 4 units of 8 PEs with 32
     * columns each; 8 query blocks of 16 rows per head; 2304 MLP columns = 72 x 32 */
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 1, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.nq, 2);
    assert_int_equal(pl.nkv, 1);
    assert_int_equal(pl.kv0, 1);
    assert_int_equal(pl.U, 4);
    assert_int_equal(pl.p, 8);
    assert_int_equal(pl.c, 32);
    assert_int_equal(pl.qkv.n, 32);
    assert_int_equal(pl.qrows, 16);
    assert_int_equal(pl.items, 16);
    assert_int_equal(pl.mlp.n, 72);
    assert_int_equal(pl.cf, 32);
    assert_int_equal(pl.rows.n, 128);
    /* TP 8: 4 KV heads replicated, rank r uses KV head r / 2 */
    assert_int_equal(kb_decoder_plan_make(&m, &o, 8, 5, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.nq, 1);
    assert_int_equal(pl.nkv, 1);
    assert_int_equal(pl.kv0, 2);
    assert_int_equal(pl.mlp.n, 36);
    /* seq_parallel: the rank's 32 tokens x 2304 over 128 PEs = pieces of 576 */
    o.seq_parallel = 1;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.Tl, 32);
    assert_int_equal(pl.piece, 576);
    /* decode at kv_len 2048: chunks of 17 positions over 121 PEs */
    o.seq_parallel = 0;
    o.decode = 1;
    o.kv_len = 2048;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.T, 1);
    assert_int_equal(pl.clen, 17);
    assert_int_equal(pl.chunks, 121);
    assert_int_equal(pl.citems, 1);
    /* a TP size that splits no head count */
    o.decode = 0;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 3, 0, 16, 8, &pl, &eb), KB_ERR_USAGE);
    kbt_msg_has(eb.msg, "query heads");
    /* machine, seq 2048: 128 row owners of 16 rows; QKV in 16 token groups of 128 rows x 8
     * column blocks (p 2: 128 columns, a cube per group), MLP the same with 288 columns
     * (8 x 288 = 2304); 128 attention items of 16 query rows, each for both heads; every
     * attention cube's K/V copy is 2 x 2048 rows, 512 per PE */
    o.seq = 2048;
    o.mapping = KB_DEC_MAP_MACHINE;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.machine, 1);
    assert_int_equal(pl.rows.n, 128);
    assert_int_equal(pl.rc, 16);
    assert_int_equal(pl.qncol, 8);
    assert_int_equal(pl.p, 2);
    assert_int_equal(pl.c, 128);
    assert_int_equal(pl.qtr, 128);
    assert_int_equal(pl.qkv.n, 128);
    assert_int_equal(pl.mncol, 8);
    assert_int_equal(pl.cf, 288);
    assert_int_equal(pl.mtr, 128);
    assert_int_equal(pl.mlp.n, 128);
    assert_int_equal(pl.hg, 2);
    assert_int_equal(pl.qrows, 16);
    assert_int_equal(pl.items, 128);
    assert_int_equal(pl.rep_rows, 512);
    assert_int_equal(pl.ocol, 1); /* as many items as PEs */
    /* seq 128: 8 items of 16 rows, on 4 PEs of a cube each with 576 columns of W_o: an item
     * loads at most A = 2 x 128 x 256 x 2 = 131 072 bytes of K/V, 4^2 A <= W = 2 x 256 x
     * 2304 x 2 = 2 359 296 < 6^2 A; each cube's copy (256 rows) is 64 rows per PE */
    o.seq = 128;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.items, 8);
    assert_int_equal(pl.ocol, 4);
    assert_int_equal(pl.att.cubes, 8);
    assert_int_equal(pl.att.pes, 4);
    assert_int_equal(pl.rep_rows, 64);
    o.seq = 2048;
    /* auto: machine for prefill and for decode (naive's placement, the combine in bulk, one
     * shared copy of a single token's row); naive for seq_parallel, which machine refuses */
    o.mapping = KB_DEC_MAP_AUTO;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.machine, 1);
    o.decode = 1;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.machine, 0);
    assert_int_equal(pl.dmachine, 1);
    assert_int_equal(pl.shared, 1);
    /* machine's chunk count balances a chunk PE's K/V reads against the combining PE's
     * partials: round(sqrt(2049 x 2 x 256 x 2 / (2 x 258 x 4))) = round(31.9) = 32 chunks of
     * 65 positions (naive above: 121 of 17) */
    assert_int_equal(pl.chunks, 32);
    assert_int_equal(pl.clen, 65);
    /* the combination over ccol PEs of a cube: W_o's rows are W = 2 x 256 x 2304 x 2 =
     * 2 359 296 bytes, the partials P = 32 x 2 x 258 x 4 = 66 048; 4^2 P <= W, 5 does not
     * divide 2304, 6^2 P = 2.38 MB is over */
    assert_int_equal(pl.citems, 1);
    assert_int_equal(pl.ccol, 4);
    assert_int_equal(pl.comb.cubes, 1);
    assert_int_equal(pl.comb.pes, 4);
    assert_int_equal(pl.comb.n, 4);
    /* one KV head per rank: the column blocks go straight into the row owner's sum row,
     * all-reduced over its lane alone */
    assert_int_equal(pl.nkv, 1);
    assert_int_equal(pl.rows.n, 1);
    assert_int_equal(pl.dsum, 1);
    /* the MLP's partial rows too: the row owner sums them, its lane all-reduces them */
    assert_int_equal(pl.dmsum, 1);
    o.kv_len = 32768; /* sqrt(32769 x 1024 / 2064) = 127.5: 128, as many as there are PEs */
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.chunks, 128);
    assert_int_equal(pl.clen, 257);
    o.kv_len = 2048;
    o.batch = 4; /* 4 x 2304 x 2 bytes: more than one copy should hold */
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.shared, 0);
    /* a cube per sequence; 32 chunks each (128 PEs over 4 sequences): P = 66 048 bytes,
     * 4^2 P <= W, 6^2 P = 2.38 MB is not (5 does not divide 2304) */
    assert_int_equal(pl.citems, 4);
    assert_int_equal(pl.chunks, 32);
    assert_int_equal(pl.ccol, 4);
    assert_int_equal(pl.comb.cubes, 4);
    assert_int_equal(pl.comb.n, 16);
    assert_int_equal(pl.dsum, 1); /* 4 row owners, PEs 0-3 of cube 0 */
    assert_int_equal(pl.dmsum, 1);
    o.batch = 16;                 /* 16 row owners over two cubes: the partials' all-reduce */
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.rows.cubes, 2);
    assert_int_equal(pl.dsum, 0);
    assert_int_equal(pl.dmsum, 0);
    o.batch = 4;
    o.mapping = KB_DEC_MAP_NAIVE; /* one PE per (sequence, KV head) */
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.ccol, 1);
    assert_int_equal(pl.comb.n, 4);
    assert_int_equal(pl.dsum, 0);
    assert_int_equal(pl.dmsum, 0);
    o.mapping = KB_DEC_MAP_AUTO;
    o.batch = 1;
    o.decode = 0;
    o.seq_parallel = 1;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), 0);
    assert_int_equal(pl.machine + pl.dmachine, 0);
    o.mapping = KB_DEC_MAP_MACHINE;
    assert_int_equal(kb_decoder_plan_make(&m, &o, 4, 0, 16, 8, &pl, &eb), KB_ERR_USAGE);
    kbt_msg_has(eb.msg, "use mapping=naive (0) for seq_parallel");
}

/* ---- the projection gemms' time is the closed form ---- */

/* x (m x k) @ a streamed k x n weight: one PE_GEMM use per SchedulerV2 step, each the
 * closed form kb_qgemm_ns of its tile (timing-model.md); whole picoseconds */
static int64_t tiled_ps(const kb_topo_cfg *c, kb_qfmt f, int sp, uint64_t m, uint64_t n,
                        uint64_t k)
{
    int64_t ps = 0;
    for (uint64_t m0 = 0; m0 < m; m0 += 128)
        for (uint64_t n0 = 0; n0 < n; n0 += 128)
            for (uint64_t k0 = 0; k0 < k; k0 += 128)
                ps += llround(1000.0 * kb_qgemm_ns(c, f, sp, m - m0 < 128 ? m - m0 : 128,
                                                   n - n0 < 128 ? n - n0 : 128,
                                                   k - k0 < 128 ? k - k0 : 128));
    return ps;
}

/* The closed form of one PE's rows in row blocks of 128, times the PEs. */
static int64_t rows_ps(const kb_topo_cfg *c, kb_qfmt f, int sp, int64_t rows, int64_t pes,
                       uint64_t n, uint64_t k)
{
    int64_t ps = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += 128)
        ps += pes * tiled_ps(c, f, sp, (uint64_t)(rows - r0 < 128 ? rows - r0 : 128), n, k);
    return ps;
}

static void test_proj_gemm_closed_form(void **s)
{
    const kb_bench *b = kb_bench_find("decoder_layer");
    static const kb_qfmt fmts[] = { KB_QF_F16, KB_QF_BF16, KB_QF_INT8, KB_QF_MXINT8,
                                    KB_QF_FP8E4M3, KB_QF_FP8E5M2 };
    char model[1024];
    (void)s;
    assert_non_null(b);
    snprintf(model, sizeof model, "%s", src_path("configs/models/tiny.yaml"));
    for (int map = 0; map <= 1; map++)
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (int sparse = 0; sparse <= 1; sparse++) {
            kb_config cfg;
            kb_errbuf eb = { { 0 } };
            kb_run_report rep;
            kb_ctx_opts co = { .device = KB_DEV_NONE };
            kb_bench_args a;
            kb_model_cfg m;
            kb_decoder_plan pl;
            memset(&a, 0, sizeof a);
            for (int i = 0; i < b->nparams; i++)
                a.p[i] = b->params[i].dflt;
            a.p[0] = 160; /* seq: a full 128-row gemm block and a partial one */
            a.model = model;
            a.dtype = kb_qfmt_name(fmts[f]);
            a.p[5] = sparse;
            a.p[6] = map; /* mapping: naive, machine */
            kb_config_defaults(&cfg);
            cfg.topo.cube_mesh_width = 2;
            cfg.topo.cube_mesh_height = 1;
            if (kb_bench_execute(&cfg, NULL, &co, b, &a, &rep, &eb) != 0)
                fail_msg("%s sparse=%d: %s", a.dtype, sparse, eb.msg);
            double got = -1;
            for (int i = 0; i < rep.res.nextras; i++)
                if (!strcmp(rep.res.extras[i].name, "proj_gemm_ns"))
                    got = rep.res.extras[i].value;
            kb_run_report_fini(&rep);
            /* the closed form, from the plan of rank 0 */
            kb_decoder_opts o = { 1, 160, 0, 0, 0, fmts[f], sparse, map, 0 };
            assert_int_equal(kb_model_load(&m, model, &eb), 0);
            assert_int_equal(kb_decoder_plan_make(&m, &o, cfg.topo.sips_count, 0, 2, 8, &pl,
                                                  &eb), 0);
            const kb_topo_cfg *c = &cfg.topo;
            /* every QKV (MLP) PE its token group's qtr (mtr) rows: naive all 160 */
            assert_int_equal(pl.machine, map);
            int64_t want =
                rows_ps(c, fmts[f], sparse, pl.qtr, pl.qkv.n, (uint64_t)pl.c, (uint64_t)pl.d) +
                2 * rows_ps(c, fmts[f], sparse, pl.mtr, pl.mlp.n, (uint64_t)pl.cf,
                            (uint64_t)pl.d) +
                rows_ps(c, fmts[f], sparse, pl.mtr, pl.mlp.n, (uint64_t)pl.d, (uint64_t)pl.cf);
            /* exactly, in picoseconds */
            if (!(got > 0) || llround(got * 1000.0) != want)
                fail_msg("%s sparse=%d mapping %d: PE_GEMM busy %.3f ns, closed form %.3f ns",
                         a.dtype, sparse, map, got, want / 1000.0);
        }
}

/* ---- end to end ---- */

#define TINY "--bench decoder_layer --set system.sips.count=2 --set sip.cube_mesh.width=2 " \
             "--set sip.cube_mesh.height=1"

static const char *digest_of(const char *out)
{
    static char d[32];
    const char *p = strstr(out, "digest");
    d[0] = 0;
    if (p && sscanf(p, "digest %31s", d) != 1)
        d[0] = 0;
    return d;
}

static void run_ok(const char *extra, char *out, size_t n)
{
    int rc = kbt_kbcl(out, n, "run " TINY " --model %s --device ref --verify-data %s",
                      src_path("configs/models/tiny.yaml"), extra);
    if (rc != 0)
        fail_msg("%s: exit %d\n%s", extra, rc, out);
    /* the result line (sanitizer builds may print warnings before it) */
    char *line = strstr(out, "  decoder_layer (");
    char *nl = line ? strchr(line, '\n') : NULL;
    if (!nl || nl - line < 3 || strncmp(nl - 3, " OK", 3) != 0)
        fail_msg("%s: no OK line\n%s", extra, out);
}

static void test_e2e_modes(void **s)
{
    static const char *const modes[] = {
        "--param seq=16 --param mapping=naive",
        "--param seq=16", /* auto: machine */
        "--param seq=24 --param batch=2 --param mapping=machine",
        "--param seq=8 --param batch=2 --param seq_parallel=1",
        "--param decode=1 --param kv_len=40 --param batch=2", /* auto: machine */
        "--param decode=1 --param kv_len=40 --param batch=2 --param seq_parallel=1",
        "--param decode=1 --param kv_len=40 --param batch=2 --param mapping=naive",
        "--param decode=1 --param kv_len=40 --param batch=2 --dtype mxint8 --param sparse=1",
        "--param seq=16 --dtype bf16",
        "--param seq=16 --dtype int8",
        "--param seq=16 --dtype mxint8",
        "--param seq=16 --dtype fp8e4m3",
        "--param seq=16 --dtype fp8e5m2",
        "--param seq=16 --param sparse=1",
        "--param seq=16 --dtype mxint8 --param sparse=1",
        "--param seq=16 --dtype mxint8 --param sparse=1 --param mapping=naive",
        "--param seq=16 --param fuse=0", /* machine, a launch per kernel */
        "--param decode=1 --param kv_len=40 --param batch=2 --param fuse=0",
    };
    /* the exact output bytes of some of them (the mappings add in other orders: f16 differs
     * in the last bits, the 8-bit format's sums here are exact) */
    static const char *const digests[] = { "42ec8903dd3e3f78", "682902dc02f97a2d", NULL, NULL,
                                           "e380288f93ec2ee8", NULL, "e380288f93ec2ee8", NULL,
                                           NULL, NULL, NULL, NULL, NULL, NULL,
                                           "0978fcdbe3dc645a", "0978fcdbe3dc645a",
                                           "682902dc02f97a2d", "e380288f93ec2ee8" };
    char out[8192];
    (void)s;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        run_ok(modes[i], out, sizeof out);
        if (digests[i])
            assert_string_equal(digest_of(out), digests[i]);
    }
    /* the SiLU / plain-norm model */
    int rc = kbt_kbcl(out, sizeof out, "run " TINY " --model %s --param seq=16 --verify-data",
                      src_path("tests/data/tiny-silu.yaml"));
    if (rc != 0)
        fail_msg("tiny-silu: exit %d\n%s", rc, out);
}

/* A number the run printed on the line that starts with `key` (two spaces in). */
static double printed(const char *out, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\n  %s ", key);
    const char *p = strstr(out, pat);
    if (!p)
        fail_msg("no %s in\n%s", key, out);
    return strtod(p + strlen(pat), NULL);
}

/*
 * Mapping machine's fused launches against a launch per kernel (fuse=0), timing only: the
 * same inter-SIP bytes (the fused all-reduce's count is the lane rings' closed form, the
 * other's is measured) and projection gemm time, less command path and less time. The
 * output bytes are the same (test_e2e_modes' digests).
 */
static void test_e2e_fused(void **s)
{
    static const char *const modes[] = { "--param seq=16", "--param decode=1 --param kv_len=40 "
                                                           "--param batch=2" };
    static const char *const keys[] = { "inter_sip_bytes", "all_reduce_sip_bytes",
                                        "proj_gemm_ns" };
    char out[2][8192];
    (void)s;
    for (int m = 0; m < 2; m++) {
        for (int f = 0; f < 2; f++) {
            int rc = kbt_kbcl(out[f], sizeof out[f], "run " TINY " --model %s --device none "
                              "--param fuse=%d %s", src_path("configs/models/tiny.yaml"), f,
                              modes[m]);
            if (rc != 0)
                fail_msg("%s fuse=%d: exit %d\n%s", modes[m], f, rc, out[f]);
        }
        for (int k = 0; k < 3; k++)
            assert_true(printed(out[0], keys[k]) == printed(out[1], keys[k]));
        assert_true(printed(out[1], "all_reduce_sip_bytes") > 0);
        assert_true(printed(out[1], "comm_ns") > 0);
        assert_true(printed(out[1], "launch_ns") < printed(out[0], "launch_ns"));
        assert_true(printed(out[1], "sim_time") < printed(out[0], "sim_time"));
    }
}

static void test_e2e_cpu_digest(void **s)
{
    char out[8192], ref[32];
    (void)s;
    run_ok("--param seq=16", out, sizeof out);
    snprintf(ref, sizeof ref, "%s", digest_of(out));
    assert_true(ref[0] != 0);
    if (kbt_kbcl(out, sizeof out, "devices") != 0 || !strstr(out, "[CPU]"))
        skip();
    int rc = kbt_kbcl(out, sizeof out, "run " TINY " --model %s --param seq=16 --device cpu "
                      "--verify-data", src_path("configs/models/tiny.yaml"));
    if (rc != 0)
        fail_msg("cpu: exit %d\n%s", rc, out);
    assert_string_equal(digest_of(out), ref);
}

static void test_e2e_usage(void **s)
{
    char out[8192];
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench decoder_layer --device none"), 2);
    kbt_msg_has(out, "--model");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --model x.yaml"), 2);
    kbt_msg_has(out, "takes no model");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run " TINY " --model %s --dtype int4 "
                              "--device none", src_path("configs/models/tiny.yaml")), 2);
    kbt_msg_has(out, "int4");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run " TINY " --model nosuch.yaml --device none"),
                     2);
    /* mapping: by name or number; machine is prefill's */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run " TINY " --model %s --param mapping=fast "
                              "--device none", src_path("configs/models/tiny.yaml")), 2);
    kbt_msg_has(out, "or one of naive (0), machine (1), auto (2)");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run " TINY " --model %s --param mapping=1 "
                              "--param seq=16 --param seq_parallel=1 --device none",
                              src_path("configs/models/tiny.yaml")), 2);
    kbt_msg_has(out, "use mapping=naive (0) for seq_parallel");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run " TINY " --model %s --param mapping=machine "
                              "--device none", src_path("configs/models/tiny.yaml")), 0);
    kbt_msg_has(out, "mapping machine)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_files),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_reference_takes_device_norm),
        cmocka_unit_test(test_model_keys_documented),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_proj_gemm_closed_form),
        cmocka_unit_test(test_e2e_modes),
        cmocka_unit_test(test_e2e_fused),
        cmocka_unit_test(test_e2e_cpu_digest),
        cmocka_unit_test(test_e2e_usage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
