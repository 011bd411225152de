/*
 * kb_tl_gemm — tl_gemm: output tiles that fit scratch, each one tl_dot over all of K with its
 * operands referenced in place (kb_tl_gemm.h says what it computes, how it tiles and what it
 * costs). Built only on the public tl calls and the runtime's extension interface.
 */
#include "kb_tl_gemm.h"

#include <assert.h>

#include "kb_config.h"
#include "kb_runtime_ext.h"

/* x rounded down to a multiple of g when it is at least g (smaller x stay as they are). */
static uint32_t round_down_to(uint64_t x, uint32_t g)
{
    if (x > UINT32_MAX)
        x = UINT32_MAX;
    return x >= g ? (uint32_t)(x - x % g) : (uint32_t)x;
}

static uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

static uint64_t isqrt64(uint64_t x)
{
    uint64_t r = 0;
    for (uint64_t bit = UINT64_C(1) << 62; bit; bit >>= 2) {
        if (x >= r + bit) {
            x -= r + bit;
            r = (r >> 1) + bit;
        } else {
            r >>= 1;
        }
    }
    return r;
}

/* Halves a tile side (not below g, unless it is already below it); returns 0 if it cannot. */
static int halve(uint32_t *t, uint32_t g)
{
    uint32_t h;
    if (*t <= g)
        return 0;
    h = round_down_to((*t + 1) / 2, g);
    if (h < g)
        h = g;
    if (h >= *t)
        return 0;
    *t = h;
    return 1;
}

int kb_tl_gemm_tiling(uint32_t m, uint32_t n, uint64_t room, uint64_t scratch, uint32_t gm,
                      uint32_t gn, int nparts, kb_gemm_tiling *out)
{
    uint64_t budget = scratch / 2, cap;
    uint32_t tm, tn;

    if (m == 0 || n == 0 || nparts < 1)
        return -1;
    if (gm == 0)
        gm = 1;
    if (gn == 0)
        gn = 1;
    if (nparts == 1) {
        if ((uint64_t)m * n * 4 <= room) { /* what one tl_dot needs: one tile */
            tm = m;
            tn = n;
            goto done;
        }
        if (room < budget)
            budget = room;
    }
    cap = budget / 4; /* f32 accumulator elements */
    if (cap == 0)
        return -1;
    /* squarish: columns first (whole scheduler tiles), then as many rows as fit */
    tn = min_u32(n, round_down_to(isqrt64(cap), gn));
    if (tn == 0)
        tn = 1;
    tm = min_u32(m, round_down_to(cap / tn, gm));
    if (tm == 0)
        tm = 1;
    if (tm == m) /* few rows: widen the columns into the room left */
        tn = min_u32(n, round_down_to(cap / tm, gn));
    if (tn == 0)
        tn = 1;
    /* several parts: at least one tile each, as far as scheduler tiles allow */
    while (nparts > 1 && (uint64_t)((m + tm - 1) / tm) * ((n + tn - 1) / tn) < (uint64_t)nparts) {
        if (tm >= tn ? !halve(&tm, gm) && !halve(&tn, gn) : !halve(&tn, gn) && !halve(&tm, gm))
            break;
    }
done:
    assert(tm >= 1 && tm <= m && tn >= 1 && tn <= n); /* a tile lies inside C */
    out->tm = tm;
    out->tn = tn;
    out->tiles_m = (m + tm - 1) / tm;
    out->tiles_n = (n + tn - 1) / tn;
    return 0;
}

void tl_gemm(kb_tl *tl, const kb_gemm_op *op)
{
    const kb_topo_cfg *cfg = &kb_ctx_config(tl_ctx(tl))->topo;
    const kb_va c = op->c, a = op->a, b = op->b;
    const uint32_t ldc = op->ldc, lda = op->lda, ldb = op->ldb, m = op->m, n = op->n, k = op->k;
    const kb_dtype da = op->da, db = op->db;
    const int part = op->part, nparts = op->nparts;
    size_t ea = kb_dtype_size(da), eb = kb_dtype_size(db), ec;
    kb_gemm_tiling g;
    kb_tensor *tc;
    uint64_t room = 0, ntiles;

    if (m == 0 || n == 0 || k == 0)
        tl_fail(tl, KB_ERR_INVAL, "tl_gemm: empty shape %ux%ux%u", m, k, n);
    if ((unsigned)da >= KB_NDTYPES || (unsigned)db >= KB_NDTYPES)
        tl_fail(tl, KB_ERR_INVAL, "tl_gemm: bad operand dtype");
    if (lda < k || ldb < n || ldc < n)
        tl_fail(tl, KB_ERR_INVAL,
                "tl_gemm: row strides below the rows' lengths (lda %u < k %u, ldb %u < n %u or "
                "ldc %u < n %u)", lda, k, ldb, n, ldc, n);
    if (nparts < 1 || part < 0 || part >= nparts)
        tl_fail(tl, KB_ERR_INVAL, "tl_gemm: part %d of %d parts", part, nparts);
    /* C's element size is its tensor's (tl_store2d rounds into it) */
    kb_tl_translate(tl, c, 1, "tl_gemm", &tc);
    ec = kb_dtype_size(tc ? kb_tensor_dtype(tc) : KB_F32);
    if (nparts == 1)
        room = kb_tl_scratch_room(tl);
    if (kb_tl_gemm_tiling(m, n, room, cfg->scratch_size_bytes, (uint32_t)cfg->sched_tile_m,
                          (uint32_t)cfg->sched_tile_n, nparts, &g) != 0)
        tl_fail(tl, KB_ERR_NOSPACE, "tl_gemm: no scratch left for even a 1 x 1 f32 tile "
                "(free values with tl_free)");
    ntiles = (uint64_t)g.tiles_m * g.tiles_n;
    for (uint64_t t = (uint64_t)part; t < ntiles; t += (uint64_t)nparts) {
        uint32_t m0 = (uint32_t)(t / g.tiles_n) * g.tm, n0 = (uint32_t)(t % g.tiles_n) * g.tn;
        assert(m0 < m && n0 < n); /* tile t of tiles_m x tiles_n starts inside C */
        uint32_t mt = min_u32(g.tm, m - m0), nt = min_u32(g.tn, n - n0);
        kb_val va = tl_ref2d(tl, a + (kb_va)((uint64_t)m0 * lda * ea), KB_SHAPE2(mt, k), lda, da);
        kb_val vb = tl_ref2d(tl, b + (kb_va)((uint64_t)n0 * eb), KB_SHAPE2(k, nt), ldb, db);
        /* several parts share the cubes' links: their streams interleave step by step */
        kb_val acc = nparts > 1 ? kb_tl_dot_paced(tl, va, vb) : tl_dot(tl, va, vb);
        tl_store2d(tl, c + (kb_va)(((uint64_t)m0 * ldc + n0) * ec), ldc, acc);
        tl_free(tl, acc);
    }
}
