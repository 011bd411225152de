/*
 * kb_ccl_dbtree — NCCL's double binary tree all-reduce as a rank = PE kernel and its
 * registry entry. The trees themselves (kb_ccl_dbtree_node_of) are built in kb_ccl.c with the
 * topology double_binary_tree they define, so this kernel depends on kb_ccl.c, not back.
 *
 * Two binary trees span the ws ranks (kb_ccl_dbtree_node_of): tree 0 in order over the
 * ranks, tree 1 its mirror (even ws) or its shift by one (odd ws), so a rank is interior in
 * at most one of them and a leaf in the other: the interior ranks' two inbound f32 streams of
 * one tree meet only leaf traffic of the other. The tile splits in two halves, the first
 * ceil(n/2) elements going through tree 0 and the other floor(n/2) through tree 1 (an empty
 * half does nothing). Each half is cut into slices of one slot of f32 and flows through its
 * tree as a pipeline, both trees at once. With H = floor(log2 ws) (no node is deeper), in
 * tick tau a rank reduces, for each tree, slice tau - (H - depth) of its half (its own slice,
 * loaded from the tile, plus its children's partial sums; a leaf sends its raw slice from the
 * tile) and sends it up, a root rounding the total, storing it and sending it down from the
 * tile; then it takes slice tau - (H + depth)'s total from its parent straight into its tile
 * and forwards it to its children. Partial sums travel in f32 (exact for the seeded inputs)
 * and the total is rounded once by the root's store; totals travel down in the tile's dtype,
 * so every rank ends with the root's bits. Honours KB_CCL_ARG_DTYPE and KB_CCL_ARG_OP
 * (KB_CCL_TYPED).
 *
 * Why the ticks are skewed by depth: a child handles a slice one tick before its parent on
 * the way up and one tick after it on the way down, so every wait of tick tau is on another
 * rank's tick tau - 1 or earlier and the ranks' ticks overlap. On one step index for both
 * trees (tree_allreduce's schedule), a rank's tree-1 reduction would wait on its tree-1
 * descendants' tree-0 reductions of the same step, and the world would walk both trees in
 * lockstep (at 8 ranks and 4 MiB: 608 us instead of 374 us).
 * Why it cannot deadlock with any n_slots: every message fits one slot; a rank posts each
 * child's next partial sum when it consumes the previous window's and its parent's totals up
 * to 64 slices ahead (into the tile: no scratch), so every send of tick tau finds a receive or
 * a free slot made in an earlier tick, and every wait a message sent in an earlier tick.
 *
 * With posted sends (ccl.defaults.posted_sends, db_up_posted) every send is posted, the
 * children's partial sums are read in their receive slots and a rank's own slice is loaded
 * a step ahead, so a rank's own time per tick is its additions and the trees' link traffic
 * of successive ticks overlaps (256 ranks, 64 MiB: 2.07 ms, 0.97 of the inter-SIP link's
 * bound, against 3.31 ms with blocking sends); without them the kernel is the one above.
 *
 * Limits: six IPCQ directions per rank (rings: 6 x n_slots x slot_size of the PE's IPCQ area,
 * 6 MiB at the default 4 x 256 KiB); scratch: up to 1 MiB of posted f32 slices.
 */
#include <assert.h>

#include "kb_ccl.h"

/* ---- the kernel ---- */

/* Totals posted ahead into the tile; up to this many f32 partial sums posted per child. */
#define DB_MAX_POSTED 64

/* One rank's part in one tree. */
typedef struct db_tree {
    int64_t base, len, nsl;      /* its half: tile offset, elements, slices */
    int64_t depth;               /* steps its totals lag its partial sums */
    kb_dir up;                   /* KB_DIR_NONE at the root */
    kb_dir down[2];
    kb_dtype in_dt[2];           /* what each child sends: raw tile values from a leaf */
    int nd;                      /* children */
    kb_ipcq_req *up_rq[2][DB_MAX_POSTED];
    kb_ipcq_req *dn_rq[DB_MAX_POSTED];
    kb_val own;                  /* posted: the own slice of the next step, loading */
    int64_t own_at;              /* when its data are there */
} db_tree;

typedef struct db_run {
    kb_va tile;
    kb_dtype dt;
    int op;
    int64_t ws, S, W;            /* world, elements per slice, partial sums posted per child */
    int posted;                  /* kb_ipcq_posted: posted sends, views, own slices ahead */
} db_run;

static kb_va db_va(const db_run *x, const db_tree *t, int64_t off)
{
    return kb_ccl_elem_va(x->tile, t->base + off, x->dt);
}

/* Starts the load of the own slice k of a half (posted); nothing past the half's end. */
static void db_own(kb_tl *tl, const db_run *x, db_tree *t, int64_t k)
{
    int64_t off, len = kb_ccl_piece(t->len, x->S, k, &off);
    if (len)
        t->own = tl_load_async(tl, db_va(x, t, off), KB_SHAPE1(len), x->dt, &t->own_at);
}

/*
 * db_up with posted sends: the own slice was loaded during the step before (db_own), the
 * children's partial sums are read in their receive slots (views, released once added), and
 * the sum goes up as a posted send whose scratch goes back once the send has read it; the
 * root's totals go down as posted sends from the tile. The kernel's own time per step is then
 * its additions, so the links' traffic of successive steps overlaps.
 */
static void db_up_posted(kb_tl *tl, const db_run *x, db_tree *t, int64_t k)
{
    int64_t off, len = kb_ccl_piece(t->len, x->S, k, &off), rdy = t->own_at;
    kb_va va = db_va(x, t, off);
    kb_val acc = t->own;

    db_own(tl, x, t, k + 1);
    for (int c = 0; c < t->nd; c++) {
        kb_val in = tl_wait(tl, t->up_rq[c][k % x->W]);
        if (c == 0)
            tl_wait_time(tl, rdy);
        kb_val s = kb_ccl_combine(tl, x->op, acc, in);
        tl_recv_release(tl, t->down[c], in);
        tl_free(tl, acc);
        acc = s;
        int64_t no, nl = kb_ccl_piece(t->len, x->S, k + x->W, &no);
        if (nl)
            t->up_rq[c][k % x->W] = tl_recv_view_async(tl, t->down[c], KB_SHAPE1(nl),
                                                       t->in_dt[c]);
    }
    if (t->up != KB_DIR_NONE) {
        kb_ccl_send_free(tl, t->up, acc);
        return;
    }
    acc = kb_ccl_finish(tl, x->op, acc, x->ws);
    tl_store(tl, va, acc); /* rounded once; the children get these bits */
    tl_free(tl, acc);
    for (int c = 0; c < t->nd; c++)
        (void)tl_send_async(tl, t->down[c], tl_ref(tl, va, KB_SHAPE1(len), x->dt));
}

/* Step k's partial sum of the half's slice k: sent up, or at the root stored and sent down. */
static void db_up(kb_tl *tl, const db_run *x, db_tree *t, int64_t k)
{
    int64_t off, len = kb_ccl_piece(t->len, x->S, k, &off);
    kb_va va = db_va(x, t, off);

    assert(len > 0); /* the ticks only reach the half's slices */
    if (!t->nd) {
        /* a leaf is never a root: with ws >= 2 every root has a child */
        assert(t->up != KB_DIR_NONE);
        kb_ccl_send(tl, t->up, tl_ref(tl, va, KB_SHAPE1(len), x->dt));
        return;
    }
    if (x->posted) {
        db_up_posted(tl, x, t, k);
        return;
    }
    kb_val acc = tl_load(tl, va, KB_SHAPE1(len), x->dt);
    for (int c = 0; c < t->nd; c++) {
        kb_val in = tl_wait(tl, t->up_rq[c][k % x->W]);
        int64_t no, nl = kb_ccl_piece(t->len, x->S, k + x->W, &no);
        if (nl)
            t->up_rq[c][k % x->W] = tl_recv_async(tl, t->down[c], KB_SHAPE1(nl), t->in_dt[c]);
        kb_val s = kb_ccl_combine(tl, x->op, acc, in);
        tl_free(tl, acc);
        tl_free(tl, in);
        acc = s;
    }
    if (t->up != KB_DIR_NONE) {
        tl_send(tl, t->up, acc);
        tl_free(tl, acc);
        return;
    }
    acc = kb_ccl_finish(tl, x->op, acc, x->ws);
    tl_store(tl, va, acc); /* rounded once; the children get these bits */
    tl_free(tl, acc);
    for (int c = 0; c < t->nd; c++)
        tl_send(tl, t->down[c], tl_ref(tl, va, KB_SHAPE1(len), x->dt));
}

/* Slice j's total has landed in the tile: post slice j + 64's, forward it to the children. */
static void db_down(kb_tl *tl, const db_run *x, db_tree *t, int64_t j)
{
    int64_t off, len = kb_ccl_piece(t->len, x->S, j, &off);
    int64_t no, nl = kb_ccl_piece(t->len, x->S, j + DB_MAX_POSTED, &no);

    assert(t->up != KB_DIR_NONE && len > 0); /* totals come down from a parent */
    (void)tl_wait(tl, t->dn_rq[j % DB_MAX_POSTED]);
    if (nl)
        t->dn_rq[j % DB_MAX_POSTED] = tl_recv_into_async(tl, t->up, db_va(x, t, no),
                                                         KB_SHAPE1(nl), x->dt);
    for (int c = 0; c < t->nd; c++)
        kb_ccl_send(tl, t->down[c], tl_ref(tl, db_va(x, t, off), KB_SHAPE1(len), x->dt));
}

static void dbtree_allreduce(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl);
    uint64_t slot = kb_ipcq_slot_size(tl_ctx(tl));
    db_run x = { kb_ccl_my_tile(tl, a), (kb_dtype)a->i[KB_CCL_ARG_DTYPE],
                 (int)a->i[KB_CCL_ARG_OP], ws, (int64_t)(slot / 4u), 1,
                 kb_ipcq_posted(tl_ctx(tl)) };
    db_tree tr[2];
    int64_t inputs = 0, steps = 0, off, len, H = 0;

    if (ws < 2) /* one rank: every op leaves the tile as it is (avg: x / 1) */
        return;
    while ((int64_t)2 << H <= ws)
        H++; /* floor(log2 ws): no node of either tree is deeper */
    if (x.S < 1)
        x.S = 1;
    for (int t = 0; t < 2; t++) {
        db_tree *d = &tr[t];
        kb_ccl_dbtree_node nd;
        kb_ccl_dbtree_node_of((int)ws, t, (int)r, &nd);
        d->base = t ? (n + 1) / 2 : 0;
        d->len = t ? n / 2 : (n + 1) / 2;
        d->nsl = (d->len + x.S - 1) / x.S;
        d->depth = nd.depth;
        assert(d->depth <= H); /* the ticks' skew H - depth is never negative */
        d->up = nd.parent < 0 ? KB_DIR_NONE : kb_ccl_dbtree_up_dir(t, nd.side);
        d->nd = 0;
        for (int c = 0; c < 2; c++) {
            kb_ccl_dbtree_node cn;
            if (nd.child[c] < 0)
                continue;
            kb_ccl_dbtree_node_of((int)ws, t, nd.child[c], &cn);
            d->down[d->nd] = kb_ccl_dbtree_down_dir(t, c);
            d->in_dt[d->nd] = cn.child[0] < 0 ? x.dt : KB_F32;
            d->nd++;
        }
        inputs += d->nsl ? d->nd : 0;
        /* the last tick: the total of the last slice (the root: its reduction) */
        int64_t end = d->nsl + H + (d->up == KB_DIR_NONE ? 0 : d->depth);
        steps = d->nsl && end > steps ? end : steps;
    }
    /* the partial sums posted ahead share a scratch window of KB_CCL_STREAM_BYTES */
    x.W = (int64_t)(KB_CCL_STREAM_BYTES / (slot ? slot : 1u)) / (inputs ? inputs : 1);
    x.W = x.W < 1 ? 1 : x.W > DB_MAX_POSTED ? DB_MAX_POSTED : x.W;
    for (int t = 0; t < 2; t++) {
        db_tree *d = &tr[t];
        for (int c = 0; c < d->nd; c++)
            for (int64_t j = 0; j < d->nsl && j < x.W; j++) {
                len = kb_ccl_piece(d->len, x.S, j, &off);
                d->up_rq[c][j] = x.posted ? tl_recv_view_async(tl, d->down[c], KB_SHAPE1(len),
                                                               d->in_dt[c])
                                          : tl_recv_async(tl, d->down[c], KB_SHAPE1(len),
                                                          d->in_dt[c]);
            }
        if (x.posted && d->nd)
            db_own(tl, &x, d, 0);
        if (d->up != KB_DIR_NONE)
            for (int64_t j = 0; j < d->nsl && j < DB_MAX_POSTED; j++) {
                len = kb_ccl_piece(d->len, x.S, j, &off);
                d->dn_rq[j] = tl_recv_into_async(tl, d->up, db_va(&x, d, off), KB_SHAPE1(len),
                                                 x.dt);
            }
    }
    /*
     * Tick tau reduces slice tau - (H - depth) of each half and forwards the total of slice
     * tau - (H + depth): a rank handles a slice one tick after its children and one tick
     * before its parent on the way up, one tick after its parent on the way down. Every wait
     * of a tick is on another rank's earlier tick, so the ranks' ticks overlap as a
     * pipeline even though a rank's two trees are interleaved in one kernel (with both
     * trees on the same step index, a rank's tree-1 step would wait on its tree-1
     * descendants' tree-0 step, and the whole world would walk the trees in lockstep).
     */
    for (int64_t tau = 0; tau < steps; tau++) {
        for (int t = 0; t < 2; t++) {
            int64_t k = tau - (H - tr[t].depth);
            if (k >= 0 && k < tr[t].nsl)
                db_up(tl, &x, &tr[t], k);
        }
        for (int t = 0; t < 2; t++) {
            int64_t j = tau - (H + tr[t].depth);
            if (tr[t].up != KB_DIR_NONE && j >= 0 && j < tr[t].nsl)
                db_down(tl, &x, &tr[t], j);
        }
    }
}

/* the largest message: a slice of f32 partial sums of the longer half */
static uint64_t dbtree_msg(int64_t n, int ws)
{
    (void)ws;
    return (uint64_t)((n + 1) / 2) * 4u;
}

const kb_ccl_algo_impl kb_ccl_algo_dbtree_allreduce = {
    .module = "dbtree_allreduce",
    .summary = "double binary tree (NCCL): half the tile up and down each of two trees at once, pipelined",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "double_binary_tree",
    .kernel = dbtree_allreduce,
    .max_msg_bytes = dbtree_msg,
    .reference = kb_ccl_ref_allreduce,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
};
