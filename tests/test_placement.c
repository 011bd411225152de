/* test_placement — DPPolicy resolution (block and tiled modes) and shard pack/unpack. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kb_placement.h"
#include "kb_test_util.h"

/* Expected shard: cube, pe, row0, col0, rows, cols, offset_bytes, nbytes. */
typedef struct want {
    unsigned cube, pe;
    uint64_t row0, col0, rows, cols, off, nbytes;
} want;

static void check_shards(const kb_shard_spec *s, size_t n, unsigned sip, const want *w, size_t nw)
{
    size_t i;

    assert_int_equal(n, nw);
    for (i = 0; i < n; i++) {
        assert_int_equal(s[i].sip, sip);
        assert_int_equal(s[i].cube, w[i].cube);
        assert_int_equal(s[i].pe, w[i].pe);
        assert_int_equal(s[i].row0, w[i].row0);
        assert_int_equal(s[i].col0, w[i].col0);
        assert_int_equal(s[i].rows, w[i].rows);
        assert_int_equal(s[i].cols, w[i].cols);
        assert_int_equal(s[i].offset_bytes, w[i].off);
        assert_int_equal(s[i].nbytes, w[i].nbytes);
    }
}

/* Resolves an 8 x 12 tensor of 2-byte items on 2 cubes x 4 PEs, SIP 0, and checks it. */
static void check_8x12(kb_dp_split cube, kb_dp_split pe, const want *w, size_t nw)
{
    kb_dp_policy dp = kb_dp(cube, pe, 0, 0);
    kb_shard_spec *s = NULL;
    size_t n = 0;
    kb_errbuf eb;

    assert_int_equal(kb_dp_resolve(&dp, 8, 12, 2, 4, 2, 0, &s, &n, &eb), 0);
    check_shards(s, n, 0, w, nw);
    free(s);
}

#define NW(w) (sizeof(w) / sizeof((w)[0]))

static void test_block_replicate_cube(void **state)
{
    const want rr[] = {
        {0, 0, 0, 0, 8, 12, 0, 192},    {0, 1, 0, 0, 8, 12, 192, 192},
        {0, 2, 0, 0, 8, 12, 384, 192},  {0, 3, 0, 0, 8, 12, 576, 192},
        {1, 0, 0, 0, 8, 12, 768, 192},  {1, 1, 0, 0, 8, 12, 960, 192},
        {1, 2, 0, 0, 8, 12, 1152, 192}, {1, 3, 0, 0, 8, 12, 1344, 192},
    };
    const want rc[] = {
        {0, 0, 0, 0, 8, 3, 0, 48},   {0, 1, 0, 3, 8, 3, 48, 48},   {0, 2, 0, 6, 8, 3, 96, 48},
        {0, 3, 0, 9, 8, 3, 144, 48}, {1, 0, 0, 0, 8, 3, 192, 48},  {1, 1, 0, 3, 8, 3, 240, 48},
        {1, 2, 0, 6, 8, 3, 288, 48}, {1, 3, 0, 9, 8, 3, 336, 48},
    };
    const want rw[] = {
        {0, 0, 0, 0, 2, 12, 0, 48},   {0, 1, 2, 0, 2, 12, 48, 48},  {0, 2, 4, 0, 2, 12, 96, 48},
        {0, 3, 6, 0, 2, 12, 144, 48}, {1, 0, 0, 0, 2, 12, 192, 48}, {1, 1, 2, 0, 2, 12, 240, 48},
        {1, 2, 4, 0, 2, 12, 288, 48}, {1, 3, 6, 0, 2, 12, 336, 48},
    };

    (void)state;
    check_8x12(KB_DP_REPLICATE, KB_DP_REPLICATE, rr, NW(rr));
    check_8x12(KB_DP_REPLICATE, KB_DP_COLUMN_WISE, rc, NW(rc));
    check_8x12(KB_DP_REPLICATE, KB_DP_ROW_WISE, rw, NW(rw));
}

static void test_block_column_cube(void **state)
{
    const want cr[] = {
        {0, 0, 0, 0, 8, 6, 0, 96},   {0, 1, 0, 0, 8, 6, 96, 96},  {0, 2, 0, 0, 8, 6, 192, 96},
        {0, 3, 0, 0, 8, 6, 288, 96}, {1, 0, 0, 6, 8, 6, 384, 96}, {1, 1, 0, 6, 8, 6, 480, 96},
        {1, 2, 0, 6, 8, 6, 576, 96}, {1, 3, 0, 6, 8, 6, 672, 96},
    };
    /* Each cube's 6 columns over 4 PEs: 2, 2, 1, 1. */
    const want cc[] = {
        {0, 0, 0, 0, 8, 2, 0, 32},    {0, 1, 0, 2, 8, 2, 32, 32},   {0, 2, 0, 4, 8, 1, 64, 16},
        {0, 3, 0, 5, 8, 1, 80, 16},   {1, 0, 0, 6, 8, 2, 96, 32},   {1, 1, 0, 8, 8, 2, 128, 32},
        {1, 2, 0, 10, 8, 1, 160, 16}, {1, 3, 0, 11, 8, 1, 176, 16},
    };
    const want cw[] = {
        {0, 0, 0, 0, 2, 6, 0, 24},   {0, 1, 2, 0, 2, 6, 24, 24},  {0, 2, 4, 0, 2, 6, 48, 24},
        {0, 3, 6, 0, 2, 6, 72, 24},  {1, 0, 0, 6, 2, 6, 96, 24},  {1, 1, 2, 6, 2, 6, 120, 24},
        {1, 2, 4, 6, 2, 6, 144, 24}, {1, 3, 6, 6, 2, 6, 168, 24},
    };

    (void)state;
    check_8x12(KB_DP_COLUMN_WISE, KB_DP_REPLICATE, cr, NW(cr));
    check_8x12(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, cc, NW(cc));
    check_8x12(KB_DP_COLUMN_WISE, KB_DP_ROW_WISE, cw, NW(cw));
}

static void test_block_row_cube(void **state)
{
    const want wr[] = {
        {0, 0, 0, 0, 4, 12, 0, 96},   {0, 1, 0, 0, 4, 12, 96, 96},  {0, 2, 0, 0, 4, 12, 192, 96},
        {0, 3, 0, 0, 4, 12, 288, 96}, {1, 0, 4, 0, 4, 12, 384, 96}, {1, 1, 4, 0, 4, 12, 480, 96},
        {1, 2, 4, 0, 4, 12, 576, 96}, {1, 3, 4, 0, 4, 12, 672, 96},
    };
    const want wc[] = {
        {0, 0, 0, 0, 4, 3, 0, 24},   {0, 1, 0, 3, 4, 3, 24, 24},  {0, 2, 0, 6, 4, 3, 48, 24},
        {0, 3, 0, 9, 4, 3, 72, 24},  {1, 0, 4, 0, 4, 3, 96, 24},  {1, 1, 4, 3, 4, 3, 120, 24},
        {1, 2, 4, 6, 4, 3, 144, 24}, {1, 3, 4, 9, 4, 3, 168, 24},
    };
    const want ww[] = {
        {0, 0, 0, 0, 1, 12, 0, 24},   {0, 1, 1, 0, 1, 12, 24, 24},  {0, 2, 2, 0, 1, 12, 48, 24},
        {0, 3, 3, 0, 1, 12, 72, 24},  {1, 0, 4, 0, 1, 12, 96, 24},  {1, 1, 5, 0, 1, 12, 120, 24},
        {1, 2, 6, 0, 1, 12, 144, 24}, {1, 3, 7, 0, 1, 12, 168, 24},
    };

    (void)state;
    check_8x12(KB_DP_ROW_WISE, KB_DP_REPLICATE, wr, NW(wr));
    check_8x12(KB_DP_ROW_WISE, KB_DP_COLUMN_WISE, wc, NW(wc));
    check_8x12(KB_DP_ROW_WISE, KB_DP_ROW_WISE, ww, NW(ww));
}

static void test_uneven_split(void **state)
{
    /* 7 x 11 f32 on 3 cubes x 2 PEs: rows 3, 2, 2 over cubes; columns 6, 5 over PEs. */
    const want w[] = {
        {0, 0, 0, 0, 3, 6, 0, 72},   {0, 1, 0, 6, 3, 5, 72, 60},  {1, 0, 3, 0, 2, 6, 132, 48},
        {1, 1, 3, 6, 2, 5, 180, 40}, {2, 0, 5, 0, 2, 6, 220, 48}, {2, 1, 5, 6, 2, 5, 268, 40},
    };
    /* 5 x 10 column_wise over 4 cubes (3, 3, 2, 2), row_wise over 2 PEs (3, 2). */
    const want v[] = {
        {0, 0, 0, 0, 3, 3, 0, 9},   {0, 1, 3, 0, 2, 3, 9, 6},   {1, 0, 0, 3, 3, 3, 15, 9},
        {1, 1, 3, 3, 2, 3, 24, 6},  {2, 0, 0, 6, 3, 2, 30, 6},  {2, 1, 3, 6, 2, 2, 36, 4},
        {3, 0, 0, 8, 3, 2, 40, 6},  {3, 1, 3, 8, 2, 2, 46, 4},
    };
    kb_dp_policy dp = kb_dp(KB_DP_ROW_WISE, KB_DP_COLUMN_WISE, 0, 0);
    kb_shard_spec *s = NULL;
    size_t n = 0;

    (void)state;
    assert_int_equal(kb_dp_resolve(&dp, 7, 11, 4, 2, 3, 0, &s, &n, NULL), 0);
    check_shards(s, n, 0, w, NW(w));
    free(s);
    dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_ROW_WISE, 0, 0);
    assert_int_equal(kb_dp_resolve(&dp, 5, 10, 1, 2, 4, 0, &s, &n, NULL), 0);
    check_shards(s, n, 0, v, NW(v));
    free(s);
}

static void test_subsets_and_sip(void **state)
{
    /* 1 of 2 cubes, 2 of 4 PEs; SIP 5 on every shard. */
    const want w[] = {{0, 0, 0, 0, 8, 6, 0, 192}, {0, 1, 0, 6, 8, 6, 192, 192}};
    /* All 2 cubes, 3 of 4 PEs: 12 columns over 2 cubes, then 6 over 3 PEs. */
    const want v[] = {
        {0, 0, 0, 0, 8, 2, 0, 64},   {0, 1, 0, 2, 8, 2, 64, 64},   {0, 2, 0, 4, 8, 2, 128, 64},
        {1, 0, 0, 6, 8, 2, 192, 64}, {1, 1, 0, 8, 8, 2, 256, 64},  {1, 2, 0, 10, 8, 2, 320, 64},
    };
    kb_dp_policy dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 1, 2);
    kb_shard_spec *s = NULL;
    size_t n = 0;

    (void)state;
    assert_int_equal(kb_dp_resolve(&dp, 8, 12, 4, 4, 2, 5, &s, &n, NULL), 0);
    check_shards(s, n, 5, w, NW(w));
    free(s);
    dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, 3);
    assert_int_equal(kb_dp_resolve(&dp, 8, 12, 4, 4, 2, 255, &s, &n, NULL), 0);
    check_shards(s, n, 255, v, NW(v));
    free(s);
}

static kb_dp_policy tiled(kb_dp_mode mode, uint64_t tr, uint64_t tc, int nc, int np)
{
    kb_dp_policy dp = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, nc, np);

    dp.mode = mode;
    dp.tile_rows = tr;
    dp.tile_cols = tc;
    return dp;
}

static void test_tiled(void **state)
{
    /* 5 x 7 f32 in 2 x 3 tiles: 3 x 3 tiles, the last row/column of tiles ragged; 4 slots. */
    const want rm[] = {
        {0, 0, 0, 0, 2, 3, 0, 24},   {0, 1, 0, 3, 2, 3, 24, 24},  {1, 0, 0, 6, 2, 1, 48, 8},
        {1, 1, 2, 0, 2, 3, 56, 24},  {0, 0, 2, 3, 2, 3, 80, 24},  {0, 1, 2, 6, 2, 1, 104, 8},
        {1, 0, 4, 0, 1, 3, 112, 12}, {1, 1, 4, 3, 1, 3, 124, 12}, {0, 0, 4, 6, 1, 1, 136, 4},
    };
    const want cm[] = {
        {0, 0, 0, 0, 2, 3, 0, 24},   {0, 1, 2, 0, 2, 3, 24, 24},  {1, 0, 4, 0, 1, 3, 48, 12},
        {1, 1, 0, 3, 2, 3, 60, 24},  {0, 0, 2, 3, 2, 3, 84, 24},  {0, 1, 4, 3, 1, 3, 108, 12},
        {1, 0, 0, 6, 2, 1, 120, 8},  {1, 1, 2, 6, 2, 1, 128, 8},  {0, 0, 4, 6, 1, 1, 136, 4},
    };
    /* More slots than tiles: 2 x 2 tensor in 2 x 1 tiles on 3 cubes x 2 PEs (slots 0, 1). */
    const want few[] = {{0, 0, 0, 0, 2, 1, 0, 4}, {0, 1, 0, 1, 2, 1, 4, 4}};
    kb_dp_policy dp = tiled(KB_DP_TILED_ROW_MAJOR, 2, 3, 0, 2);
    kb_shard_spec *s = NULL;
    size_t n = 0;

    (void)state;
    assert_int_equal(kb_dp_resolve(&dp, 5, 7, 4, 4, 2, 3, &s, &n, NULL), 0);
    check_shards(s, n, 3, rm, NW(rm));
    free(s);
    dp = tiled(KB_DP_TILED_COLUMN_MAJOR, 2, 3, 0, 2);
    assert_int_equal(kb_dp_resolve(&dp, 5, 7, 4, 4, 2, 3, &s, &n, NULL), 0);
    check_shards(s, n, 3, cm, NW(cm));
    free(s);
    dp = tiled(KB_DP_TILED_COLUMN_MAJOR, 2, 1, 0, 0);
    assert_int_equal(kb_dp_resolve(&dp, 2, 2, 2, 2, 3, 0, &s, &n, NULL), 0);
    check_shards(s, n, 0, few, NW(few));
    free(s);
    /* Tiles larger than the tensor: one shard holding everything. */
    dp = tiled(KB_DP_TILED_ROW_MAJOR, 100, 100, 0, 0);
    assert_int_equal(kb_dp_resolve(&dp, 5, 7, 4, 4, 2, 0, &s, &n, NULL), 0);
    assert_int_equal(n, 1);
    assert_int_equal(s[0].rows, 5);
    assert_int_equal(s[0].cols, 7);
    assert_int_equal(s[0].nbytes, 140);
    free(s);
}

static void expect_error(const kb_dp_policy *dp, uint64_t rows, uint64_t cols, size_t itemsize,
                         int topo_pes, int topo_cubes, int code, const char *needle)
{
    kb_shard_spec *s = NULL;
    size_t n = 77;
    kb_errbuf eb;

    memset(&eb, 0, sizeof eb);
    assert_int_equal(kb_dp_resolve(dp, rows, cols, itemsize, topo_pes, topo_cubes, 0, &s, &n,
                                   &eb),
                     code);
    assert_null(s);
    assert_int_equal(n, 77);
    assert_non_null(strstr(eb.msg, needle));
}

static void test_errors(void **state)
{
    kb_dp_policy dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, 5);

    (void)state;
    expect_error(&dp, 8, 12, 2, 4, 2, KB_ERR_RANGE, "num_pes 5");
    dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, -1);
    expect_error(&dp, 8, 12, 2, 4, 2, KB_ERR_RANGE, "num_pes -1");
    dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 3, 0);
    expect_error(&dp, 8, 12, 2, 4, 2, KB_ERR_RANGE, "num_cubes 3");
    /* More parts than columns / rows, at either level. */
    dp = kb_dp(KB_DP_REPLICATE, KB_DP_COLUMN_WISE, 0, 0);
    expect_error(&dp, 8, 3, 2, 4, 2, KB_ERR_RANGE, "3 columns");
    dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_REPLICATE, 0, 0);
    expect_error(&dp, 8, 1, 2, 4, 2, KB_ERR_RANGE, "1 columns");
    /* 7 columns over 2 cubes = 4 + 3; 3 columns cannot go to 4 PEs. */
    dp = kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 0, 0);
    expect_error(&dp, 8, 7, 2, 4, 2, KB_ERR_RANGE, "3 columns");
    dp = kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, 0, 0);
    expect_error(&dp, 7, 12, 2, 4, 2, KB_ERR_RANGE, "3 rows");
    /* Zero-sized tensors and items, broken topologies. */
    dp = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 0, 0);
    expect_error(&dp, 0, 12, 2, 4, 2, KB_ERR_INVAL, "zero-sized");
    expect_error(&dp, 8, 0, 2, 4, 2, KB_ERR_INVAL, "zero-sized");
    expect_error(&dp, 8, 12, 0, 4, 2, KB_ERR_INVAL, "zero-sized");
    expect_error(&dp, 8, 12, 2, 0, 2, KB_ERR_INVAL, "topology");
    expect_error(&dp, UINT64_MAX / 2, 4, 2, 4, 2, KB_ERR_RANGE, "overflows");
    /* Zero tile sizes. */
    dp = tiled(KB_DP_TILED_ROW_MAJOR, 0, 4, 0, 0);
    expect_error(&dp, 8, 12, 2, 4, 2, KB_ERR_INVAL, "tile size");
    dp = tiled(KB_DP_TILED_COLUMN_MAJOR, 4, 0, 0, 0);
    expect_error(&dp, 8, 12, 2, 4, 2, KB_ERR_INVAL, "tile size");
    /* Bad enums. */
    dp = kb_dp((kb_dp_split)7, KB_DP_REPLICATE, 0, 0);
    expect_error(&dp, 8, 12, 2, 4, 2, KB_ERR_INVAL, "split");
    dp = kb_dp(KB_DP_REPLICATE, KB_DP_REPLICATE, 0, 0);
    dp.mode = (kb_dp_mode)9;
    expect_error(&dp, 8, 12, 2, 4, 2, KB_ERR_INVAL, "mode");
}

/*
 * Scatters a random logical buffer into one device buffer (shard i at offset_bytes) and
 * gathers it back; also checks the shards cover each element exactly `copies` times and lie
 * back to back.
 */
static void roundtrip(const kb_dp_policy *dp, uint64_t rows, uint64_t cols, size_t itemsize,
                      unsigned copies, uint32_t seed)
{
    size_t total = (size_t)(rows * cols * itemsize), i;
    kbt_rng g = { seed };
    unsigned char *logical = malloc(total), *back = malloc(total), *dev;
    unsigned *cover = calloc((size_t)(rows * cols), sizeof *cover);
    kb_shard_spec *s = NULL;
    size_t n = 0;
    uint64_t off = 0, r, c;

    assert_non_null(logical);
    assert_non_null(back);
    assert_non_null(cover);
    for (i = 0; i < total; i++)
        logical[i] = (unsigned char)kbt_rng_next(&g);
    assert_int_equal(kb_dp_resolve(dp, rows, cols, itemsize, 4, 2, 1, &s, &n, NULL), 0);
    for (i = 0; i < n; i++) {
        assert_int_equal(s[i].offset_bytes, off);
        assert_int_equal(s[i].nbytes, s[i].rows * s[i].cols * itemsize);
        off += s[i].nbytes;
        for (r = 0; r < s[i].rows; r++)
            for (c = 0; c < s[i].cols; c++)
                cover[(s[i].row0 + r) * cols + s[i].col0 + c]++;
    }
    assert_int_equal(off, (uint64_t)total * copies);
    for (i = 0; i < (size_t)(rows * cols); i++)
        assert_int_equal(cover[i], copies);

    dev = malloc((size_t)off);
    assert_non_null(dev);
    for (i = 0; i < n; i++)
        kb_shard_pack(&s[i], logical, cols, itemsize, dev + s[i].offset_bytes);
    /* Coverage was checked above, so gathering every shard must rebuild every byte. */
    memset(back, 0xa5, total);
    for (i = 0; i < n; i++)
        kb_shard_unpack(&s[i], dev + s[i].offset_bytes, cols, itemsize, back);
    assert_memory_equal(back, logical, total);
    /* The first shard's block is its rows, row-major, contiguous. */
    for (r = 0; r < s[0].rows; r++)
        assert_memory_equal(dev + r * s[0].cols * itemsize,
                            logical + ((s[0].row0 + r) * cols + s[0].col0) * itemsize,
                            (size_t)(s[0].cols * itemsize));
    free(dev);
    free(s);
    free(cover);
    free(back);
    free(logical);
}

static void test_pack_unpack_roundtrip(void **state)
{
    const kb_dp_split splits[] = {KB_DP_REPLICATE, KB_DP_COLUMN_WISE, KB_DP_ROW_WISE};
    size_t a, b;
    uint32_t seed = 1;

    (void)state;
    for (a = 0; a < 3; a++)
        for (b = 0; b < 3; b++) {
            kb_dp_policy dp = kb_dp(splits[a], splits[b], 0, 0);
            unsigned copies = (splits[a] == KB_DP_REPLICATE ? 2u : 1u) *
                              (splits[b] == KB_DP_REPLICATE ? 4u : 1u);
            roundtrip(&dp, 13, 17, 4, copies, seed++);
            roundtrip(&dp, 9, 8, 2, copies, seed++);
            dp = kb_dp(splits[a], splits[b], 1, 3);
            copies = splits[b] == KB_DP_REPLICATE ? 3u : 1u;
            roundtrip(&dp, 9, 8, 1, copies, seed++);
        }
    for (a = 0; a < 2; a++) {
        kb_dp_mode mode = a ? KB_DP_TILED_COLUMN_MAJOR : KB_DP_TILED_ROW_MAJOR;
        kb_dp_policy dp = tiled(mode, 4, 5, 0, 0);
        roundtrip(&dp, 13, 17, 4, 1, seed++);
        dp = tiled(mode, 1, 1, 2, 1);
        roundtrip(&dp, 3, 5, 2, 1, seed++);
        dp = tiled(mode, 13, 3, 0, 0);
        roundtrip(&dp, 13, 17, 8, 1, seed++);
    }
}

/* Replicas must each be complete: unpacking only one cube's shards rebuilds the tensor. */
static void test_replica_complete(void **state)
{
    kb_dp_policy dp = kb_dp(KB_DP_REPLICATE, KB_DP_ROW_WISE, 0, 0);
    uint16_t logical[6 * 5], back[6 * 5], dev[2 * 6 * 5];
    kb_shard_spec *s = NULL;
    size_t n = 0, i;

    (void)state;
    for (i = 0; i < 30; i++)
        logical[i] = (uint16_t)(1000 + i);
    assert_int_equal(kb_dp_resolve(&dp, 6, 5, 2, 4, 2, 0, &s, &n, NULL), 0);
    assert_int_equal(n, 8);
    for (i = 0; i < n; i++)
        kb_shard_pack(&s[i], logical, 5, 2, (unsigned char *)dev + s[i].offset_bytes);
    /* Rows 6 over 4 PEs: 2, 2, 1, 1; cube 1's copy starts at 60 bytes. */
    assert_int_equal(s[4].offset_bytes, 60);
    assert_int_equal(dev[30], 1000);
    assert_int_equal(dev[59], 1029);
    memset(back, 0, sizeof back);
    for (i = 4; i < 8; i++)
        kb_shard_unpack(&s[i], (unsigned char *)dev + s[i].offset_bytes, 5, 2, back);
    assert_memory_equal(back, logical, sizeof logical);
    free(s);
}

static void test_names(void **state)
{
    kb_dp_policy dp = kb_dp(KB_DP_ROW_WISE, KB_DP_COLUMN_WISE, 2, 3);

    (void)state;
    assert_string_equal(kb_dp_split_name(KB_DP_REPLICATE), "replicate");
    assert_string_equal(kb_dp_split_name(KB_DP_COLUMN_WISE), "column_wise");
    assert_string_equal(kb_dp_split_name(KB_DP_ROW_WISE), "row_wise");
    assert_string_equal(kb_dp_split_name((kb_dp_split)3), "unknown");
    assert_int_equal(kb_dp_split_from_name("replicate"), KB_DP_REPLICATE);
    assert_int_equal(kb_dp_split_from_name("column_wise"), KB_DP_COLUMN_WISE);
    assert_int_equal(kb_dp_split_from_name("row_wise"), KB_DP_ROW_WISE);
    assert_int_equal(kb_dp_split_from_name("rows"), -1);
    assert_int_equal(kb_dp_split_from_name(NULL), -1);
    assert_int_equal(dp.cube, KB_DP_ROW_WISE);
    assert_int_equal(dp.pe, KB_DP_COLUMN_WISE);
    assert_int_equal(dp.num_cubes, 2);
    assert_int_equal(dp.num_pes, 3);
    assert_int_equal(dp.mode, KB_DP_BLOCK);
    assert_int_equal(dp.tile_rows, 0);
    assert_int_equal(dp.tile_cols, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_replicate_cube),
        cmocka_unit_test(test_block_column_cube),
        cmocka_unit_test(test_block_row_cube),
        cmocka_unit_test(test_uneven_split),
        cmocka_unit_test(test_subsets_and_sip),
        cmocka_unit_test(test_tiled),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_pack_unpack_roundtrip),
        cmocka_unit_test(test_replica_complete),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
