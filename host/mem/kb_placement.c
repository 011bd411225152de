/*
 * kb_placement — turns a DPPolicy into the list of shards of a 2-D tensor and moves data
 * between the logical row-major buffer and the shards' row-major blocks (see kb_placement.h).
 * Block modes split the whole tensor over cubes, then each cube's block over its PEs, with
 * balanced splits (the first L % n parts one longer); tiled modes deal fixed-size tiles
 * round-robin over the (cube, pe) slots. The result is a plain malloc'd array the caller owns;
 * nothing here allocates simulated memory. Limits: tensors are 2-D (callers fold leading
 * dimensions into rows); every size product is checked for 64-bit overflow, which is reported
 * as KB_ERR_RANGE; pack/unpack trust the caller's buffers to be large enough.
 */
#include "kb_placement.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *const split_names[] = {"replicate", "column_wise", "row_wise"};

kb_dp_policy kb_dp(kb_dp_split cube, kb_dp_split pe, int num_cubes, int num_pes)
{
    kb_dp_policy p;

    memset(&p, 0, sizeof p);
    p.cube = cube;
    p.pe = pe;
    p.num_cubes = num_cubes;
    p.num_pes = num_pes;
    p.mode = KB_DP_BLOCK;
    return p;
}

const char *kb_dp_split_name(kb_dp_split s)
{
    if ((int)s < 0 || (size_t)s >= sizeof split_names / sizeof split_names[0])
        return "unknown";
    return split_names[s];
}

int kb_dp_split_from_name(const char *name)
{
    size_t i;

    if (!name)
        return -1;
    for (i = 0; i < sizeof split_names / sizeof split_names[0]; i++)
        if (strcmp(name, split_names[i]) == 0)
            return (int)i;
    return -1;
}

static int valid_split(kb_dp_split s)
{
    return s == KB_DP_REPLICATE || s == KB_DP_COLUMN_WISE || s == KB_DP_ROW_WISE;
}

/* Balanced split of length `len` into n parts: part i's start and length. */
static void balanced(uint64_t len, uint64_t n, uint64_t i, uint64_t *start, uint64_t *part)
{
    uint64_t q = len / n, r = len % n;

    assert(n > 0 && i < n);
    *part = q + (i < r ? 1 : 0);
    *start = i * q + (i < r ? i : r);
}

typedef struct block {
    uint64_t row0, col0, rows, cols;
} block;

/* Part i of n of block b under split s. The caller has checked n <= the length split. */
static block split_block(block b, kb_dp_split s, uint64_t n, uint64_t i)
{
    uint64_t start, len;

    switch (s) {
    case KB_DP_COLUMN_WISE:
        balanced(b.cols, n, i, &start, &len);
        b.col0 += start;
        b.cols = len;
        break;
    case KB_DP_ROW_WISE:
        balanced(b.rows, n, i, &start, &len);
        b.row0 += start;
        b.rows = len;
        break;
    default:
        break; /* replicate: every part is the whole block */
    }
    return b;
}

/* "more parts than columns/rows" check for splitting a length-`len` side n ways. */
static int check_parts(kb_dp_split s, uint64_t rows, uint64_t cols, uint64_t n,
                       const char *level, kb_errbuf *eb)
{
    if (s == KB_DP_COLUMN_WISE && n > cols)
        return kb_err_set(eb, KB_ERR_RANGE,
                          "placement: cannot split %" PRIu64 " columns column_wise over %" PRIu64
                          " %s",
                          cols, n, level);
    if (s == KB_DP_ROW_WISE && n > rows)
        return kb_err_set(eb, KB_ERR_RANGE,
                          "placement: cannot split %" PRIu64 " rows row_wise over %" PRIu64 " %s",
                          rows, n, level);
    return 0;
}

/* Number of shards and their blocks in the block modes; *out malloc'd. */
static int resolve_block(const kb_dp_policy *dp, uint64_t rows, uint64_t cols, uint64_t nc,
                         uint64_t np, block **out, size_t *n, kb_errbuf *eb)
{
    block *b = NULL;
    block whole = {0, 0, rows, cols};
    uint64_t c, p;
    int rc;

    if (!valid_split(dp->cube) || !valid_split(dp->pe)) {
        rc = kb_err_set(eb, KB_ERR_INVAL, "placement: unknown split (cube %d, pe %d)",
                        (int)dp->cube, (int)dp->pe);
        goto fail;
    }
    rc = check_parts(dp->cube, rows, cols, nc, "cubes", eb);
    if (rc != 0)
        goto fail;
    /* Balanced splits make part nc-1 the smallest; if it can be split np ways, all can. */
    {
        block smallest = split_block(whole, dp->cube, nc, nc - 1);
        rc = check_parts(dp->pe, smallest.rows, smallest.cols, np, "PEs per cube", eb);
        if (rc != 0)
            goto fail;
    }
    b = malloc((size_t)(nc * np) * sizeof *b);
    if (!b) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "placement: out of host memory");
        goto fail;
    }
    for (c = 0; c < nc; c++) {
        block cb = split_block(whole, dp->cube, nc, c);
        for (p = 0; p < np; p++)
            b[c * np + p] = split_block(cb, dp->pe, np, p);
    }
    *out = b;
    *n = (size_t)(nc * np);
    return 0;
fail:
    free(b);
    return rc;
}

static int resolve_tiled(const kb_dp_policy *dp, uint64_t rows, uint64_t cols, block **out,
                         size_t *n, kb_errbuf *eb)
{
    block *b = NULL;
    uint64_t tr = dp->tile_rows, tc = dp->tile_cols;
    uint64_t ntr, ntc, k;
    int rc;

    if (tr == 0 || tc == 0) {
        rc = kb_err_set(eb, KB_ERR_INVAL,
                        "placement: tile size %" PRIu64 " x %" PRIu64 " must be non-zero", tr, tc);
        goto fail;
    }
    ntr = rows / tr + (rows % tr != 0);
    ntc = cols / tc + (cols % tc != 0);
    if (ntr > SIZE_MAX / sizeof *b / ntc) {
        rc = kb_err_set(eb, KB_ERR_RANGE,
                        "placement: %" PRIu64 " x %" PRIu64 " tiles are too many", ntr, ntc);
        goto fail;
    }
    b = malloc((size_t)(ntr * ntc) * sizeof *b);
    if (!b) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "placement: out of host memory");
        goto fail;
    }
    for (k = 0; k < ntr * ntc; k++) {
        uint64_t ti, tj;
        if (dp->mode == KB_DP_TILED_ROW_MAJOR) {
            ti = k / ntc;
            tj = k % ntc;
        } else {
            ti = k % ntr;
            tj = k / ntr;
        }
        b[k].row0 = ti * tr;
        b[k].col0 = tj * tc;
        b[k].rows = rows - b[k].row0 < tr ? rows - b[k].row0 : tr;
        b[k].cols = cols - b[k].col0 < tc ? cols - b[k].col0 : tc;
    }
    *out = b;
    *n = (size_t)(ntr * ntc);
    return 0;
fail:
    free(b);
    return rc;
}

int kb_dp_resolve(const kb_dp_policy *dp, uint64_t rows, uint64_t cols, size_t itemsize,
                  int topo_pes, int topo_cubes, unsigned target_sip,
                  kb_shard_spec **out, size_t *nshards, kb_errbuf *eb)
{
    block *b = NULL;
    kb_shard_spec *s = NULL;
    size_t n = 0, i;
    uint64_t nc, np, offset = 0;
    int rc;

    if (!dp || !out || !nshards) {
        rc = kb_err_set(eb, KB_ERR_INVAL, "kb_dp_resolve: NULL argument");
        goto fail;
    }
    if (topo_pes <= 0 || topo_cubes <= 0) {
        rc = kb_err_set(eb, KB_ERR_INVAL,
                        "placement: topology of %d cubes x %d PEs has no PEs", topo_cubes,
                        topo_pes);
        goto fail;
    }
    if (dp->num_cubes < 0 || dp->num_cubes > topo_cubes) {
        rc = kb_err_set(eb, KB_ERR_RANGE,
                        "placement: num_cubes %d outside 0..%d (the SIP's cubes)", dp->num_cubes,
                        topo_cubes);
        goto fail;
    }
    if (dp->num_pes < 0 || dp->num_pes > topo_pes) {
        rc = kb_err_set(eb, KB_ERR_RANGE,
                        "placement: num_pes %d outside 0..%d (the PEs per cube)", dp->num_pes,
                        topo_pes);
        goto fail;
    }
    if (rows == 0 || cols == 0 || itemsize == 0) {
        rc = kb_err_set(eb, KB_ERR_INVAL,
                        "placement: zero-sized tensor (%" PRIu64 " x %" PRIu64 " of %zu-byte items)",
                        rows, cols, itemsize);
        goto fail;
    }
    if (cols > UINT64_MAX / rows || rows * cols > UINT64_MAX / itemsize) {
        rc = kb_err_set(eb, KB_ERR_RANGE,
                        "placement: tensor of %" PRIu64 " x %" PRIu64 " x %zu bytes overflows",
                        rows, cols, itemsize);
        goto fail;
    }
    nc = (uint64_t)(dp->num_cubes ? dp->num_cubes : topo_cubes);
    np = (uint64_t)(dp->num_pes ? dp->num_pes : topo_pes);

    switch (dp->mode) {
    case KB_DP_BLOCK:
        rc = resolve_block(dp, rows, cols, nc, np, &b, &n, eb);
        break;
    case KB_DP_TILED_ROW_MAJOR:
    case KB_DP_TILED_COLUMN_MAJOR:
        rc = resolve_tiled(dp, rows, cols, &b, &n, eb);
        break;
    default:
        rc = kb_err_set(eb, KB_ERR_INVAL, "placement: unknown mode %d", (int)dp->mode);
        break;
    }
    if (rc != 0)
        goto fail;

    s = malloc(n * sizeof *s);
    if (!s) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "placement: out of host memory");
        goto fail;
    }
    for (i = 0; i < n; i++) {
        /* Block modes list shards cube-major; tiles go round-robin over the same slots. */
        uint64_t slot = i % (nc * np);
        uint64_t nbytes = b[i].rows * b[i].cols * itemsize;

        /* check_parts left every part at least one row and column, inside the tensor */
        assert(b[i].rows > 0 && b[i].cols > 0 && b[i].row0 + b[i].rows <= rows &&
               b[i].col0 + b[i].cols <= cols);

        if (offset > UINT64_MAX - nbytes) {
            rc = kb_err_set(eb, KB_ERR_RANGE,
                            "placement: the shards' total size overflows 64 bits");
            goto fail;
        }
        s[i].sip = target_sip;
        s[i].cube = (unsigned)(slot / np);
        s[i].pe = (unsigned)(slot % np);
        s[i].row0 = b[i].row0;
        s[i].col0 = b[i].col0;
        s[i].rows = b[i].rows;
        s[i].cols = b[i].cols;
        s[i].offset_bytes = offset;
        s[i].nbytes = nbytes;
        offset += nbytes;
    }
    free(b);
    *out = s;
    *nshards = n;
    return 0;
fail:
    free(b);
    free(s);
    return rc;
}

void kb_shard_pack(const kb_shard_spec *s, const void *logical, uint64_t cols, size_t itemsize,
                   void *block_out)
{
    const unsigned char *src = logical;
    unsigned char *dst = block_out;
    size_t row_bytes = (size_t)(s->cols * itemsize);
    uint64_t r;

    assert(s->col0 + s->cols <= cols);
    for (r = 0; r < s->rows; r++)
        memcpy(dst + r * row_bytes, src + ((s->row0 + r) * cols + s->col0) * itemsize,
               row_bytes);
}

void kb_shard_unpack(const kb_shard_spec *s, const void *block_in, uint64_t cols,
                     size_t itemsize, void *logical)
{
    const unsigned char *src = block_in;
    unsigned char *dst = logical;
    size_t row_bytes = (size_t)(s->cols * itemsize);
    uint64_t r;

    assert(s->col0 + s->cols <= cols);
    for (r = 0; r < s->rows; r++)
        memcpy(dst + ((s->row0 + r) * cols + s->col0) * itemsize, src + r * row_bytes,
               row_bytes);
}
