/*
 * kb_dist_coll — the rank = SIP all-gather, reduce-scatter, broadcast and reduce kernels of
 * the process group (kb_dist_all_gather, _reduce_scatter, _broadcast, _reduce; layouts in
 * kb_dist.h), over the IPCQ wiring the process group's install plan made. Each is a real
 * algorithm, not an all-reduce of a padded buffer:
 *
 *   all_gather      1. inside the SIP, every PE's m x c block is gathered up a two-level tree
 *                      to the rank's leader PE (each message carries the blocks of the
 *                      sender's subtree, in the tensor's dtype);
 *                   2. the leaders all-gather the ranks' m x k chunks over the SIP grid
 *                      (rings, or bidirectional chains where the grid does not wrap): a
 *                      leader sends (ws - 1)/ws of the gathered m x ws*k matrix (on chains,
 *                      on average over the leaders);
 *                   3. the leader broadcasts the gathered matrix down the tree.
 *   reduce_scatter  1. every PE's m x ws*k partial (as f32) is reduced up the tree to the
 *                      leader (the layout gives every PE a whole-width partial);
 *                   2. the leaders reduce-scatter over the SIP grid (rings, or two chains
 *                      where it does not wrap): a leader sends (ws - 1)/ws of the f32 matrix
 *                      (on chains, on average), and ends with its rank's m x k chunk of the
 *                      total;
 *                   3. the leader rounds the chunk to the dtype once and scatters it down the
 *                      tree: each message carries only the blocks of the receiver's subtree.
 *
 *   broadcast       the root SIP's shards stream up its tree in shard order, along the
 *                   leaders' tree over the SIP grid (the root's grid row, then every column;
 *                   a ring as two chains from the root) and down every other SIP's tree to
 *                   the PE that owns each shard.
 *   reduce          every SIP's shards summed up its tree (f32), the leaders' sums toward the
 *                   root's leader, the total down the root SIP's tree into every shard.
 *   all_to_all      every SIP's shards streamed up its tree to the leader; the leaders
 *                   exchange the blocks along the grid rows, then the columns (a ring of g-1
 *                   forwarding steps, or a chain each way, one packed message per step:
 *                   a2a_dim); every output shard down the tree to the PE that owns it.
 *   send / recv     the source SIP's shards up its tree, along the leaders of the route (row,
 *                   then column), down the destination SIP's tree (kb_dist_p2p_kernel).
 *   all_reduce_shards  every shard summed over the ranks only: a ring reduce-scatter and
 *                   all-gather per lane (the same-place PEs of the SIPs) over the lane rings
 *                   (kb_dist_lanes_allreduce_kernel); latency-bound blocks instead go whole
 *                   round the ring both ways and each PE adds them in rank order.
 *
 * The trees (kb_dist_coll_tree): hierarchical_allreduce's wiring (mapper all_pes) gives chains
 * inside each cube (E/W) and among the cubes' PE 0 (N/S), each split in two halves toward
 * member 0, like its all-reduce; the leader is cube 0's PE 0 and the SIP grid is its global
 * E/W ring of ws SIPs whatever system.sips.topology says. intercube_allreduce's wiring
 * (pe0_all_cubes) gives lines along each cube-mesh row toward the root column and down that
 * column to the root cube (its all-reduce's reduce_to); the leader is the root cube's PE 0
 * and the SIP grid is the machine's (sip_grid_w x sip_grid_h, wrapping unless
 * mesh_2d_no_wrap): rows over global E/W, then columns over global S/N.
 *
 * The leaders' all_gather messages are the ranks' contiguous m x k chunks (the leader turns
 * its own chunk row-major before and lays the whole matrix out after: local stores); their
 * reduce_scatter runs one matrix row at a time (the f32 partial stays in scratch, where a
 * chunk is m strided row pieces), so m rows cost m messages per step, with the bytes of the
 * closed form. Messages longer than a slot travel as chunks (chains block until the receiver
 * takes them; rings step through kb_ccl_sendrecv). A PE's m x ws*k block (f32 for
 * reduce_scatter) is held in its scratch at once while it fits; a one-row block that does not
 * streams in pieces (kb_dist_coll_pieces: reduce_scatter piece by piece of whole blocks up the
 * tree and across the leaders, all_gather's broadcast down in equal pieces). Limits: several
 * rows that do not fit are refused; reduce_scatter uses the leader's block of `in`
 * as staging (its contents afterwards are unspecified); all_to_all's leader holds the rank's
 * whole tensor and every message it receives in scratch until the end (about (ws + 1)/2
 * times the tensor on a ring) and copies each travelling block into the next message.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "kb_dist_coll.h"
#include "kb_runtime_ext.h"
#include "kb_tl.h"

/* One member of a tree level: member indices [lo, hi] form its subtree; up to two children
 * (direction to the child and the child's subtree); parent direction, or -1 at the root. */
typedef struct tnode {
    int parent;
    int nch;
    kb_dir ch[2];
    int clo[2], chi[2];
    int lo, hi;
} tnode;

/* The child whose subtree's members start at mbr, or nd->nch when mbr is the node's own. */
static int child_from(const tnode *nd, int mbr)
{
    int x = 0;
    while (x < nd->nch && nd->clo[x] != mbr)
        x++;
    return x;
}

/* Chain split in two halves toward member 0 (hierarchical's chain_reduce): members 1..h pass
 * toward 0 on `dec`, members h+1..g-1 on `inc` (g-1 wraps to 0). */
static void tree_halves(tnode *t, int i, int g, kb_dir inc, kb_dir dec)
{
    int h = g / 2;
    assert(i >= 0 && i < g);
    memset(t, 0, sizeof *t);
    t->parent = -1;
    if (i == 0) {
        t->lo = 0;
        t->hi = g - 1;
        if (g >= 2) {
            t->ch[t->nch] = inc, t->clo[t->nch] = 1, t->chi[t->nch] = h, t->nch++;
            if (g - 1 >= h + 1)
                t->ch[t->nch] = dec, t->clo[t->nch] = h + 1, t->chi[t->nch] = g - 1, t->nch++;
        }
    } else if (i <= h) {
        t->parent = (int)dec;
        t->lo = i;
        t->hi = h;
        if (i + 1 <= h)
            t->ch[0] = inc, t->clo[0] = i + 1, t->chi[0] = h, t->nch = 1;
    } else {
        t->parent = (int)inc;
        t->lo = h + 1;
        t->hi = i;
        if (i - 1 >= h + 1)
            t->ch[0] = dec, t->clo[0] = h + 1, t->chi[0] = i - 1, t->nch = 1;
    }
}

/* A line of g members toward member r (intercube's reduce_to): members below r pass on `up`,
 * members above r on `down`. */
static void tree_line(tnode *t, int i, int g, int r, kb_dir up, kb_dir down)
{
    assert(i >= 0 && i < g && r >= 0 && r < g);
    memset(t, 0, sizeof *t);
    t->parent = -1;
    if (i < r) {
        t->parent = (int)up;
        t->lo = 0;
        t->hi = i;
        if (i > 0)
            t->ch[0] = down, t->clo[0] = 0, t->chi[0] = i - 1, t->nch = 1;
    } else if (i > r) {
        t->parent = (int)down;
        t->lo = i;
        t->hi = g - 1;
        if (i < g - 1)
            t->ch[0] = up, t->clo[0] = i + 1, t->chi[0] = g - 1, t->nch = 1;
    } else {
        t->lo = 0;
        t->hi = g - 1;
        if (r > 0)
            t->ch[t->nch] = down, t->clo[t->nch] = 0, t->chi[t->nch] = r - 1, t->nch++;
        if (r < g - 1)
            t->ch[t->nch] = up, t->clo[t->nch] = r + 1, t->chi[t->nch] = g - 1, t->nch++;
    }
}

/* Where this PE sits: its block index j in the rank (0..S-1), its two tree levels (level 2
 * only for level-1 roots), block units per member of each level and the level's first block. */
typedef struct where {
    int j, leader, in2;
    tnode l1, l2;
    int64_t unit1, base1, unit2;
} where;

static void locate(kb_tl *tl, const kb_dist_coll_shape *sh, where *w)
{
    int pe = tl_program_id(tl, 0), cube = tl_program_id(tl, 1);
    memset(w, 0, sizeof *w);
    if (sh->tree == KB_DIST_TREE_CHAINS) {
        int P = sh->g1, C = sh->g2;
        w->j = cube * P + pe;
        tree_halves(&w->l1, pe, P, KB_DIR_E, KB_DIR_W);
        w->in2 = pe == 0;
        if (w->in2)
            tree_halves(&w->l2, cube, C, KB_DIR_N, KB_DIR_S);
        w->unit1 = 1;
        w->base1 = (int64_t)cube * P;
        w->unit2 = P;
    } else {
        int mw = sh->g1, mh = sh->g2, root = sh->root_cube;
        int col = cube % mw, row = cube / mw, rc = root % mw, rr = root / mw;
        w->j = cube;
        tree_line(&w->l1, col, mw, rc, KB_DIR_E, KB_DIR_W);
        w->in2 = col == rc;
        if (w->in2)
            tree_line(&w->l2, row, mh, rr, KB_DIR_S, KB_DIR_N);
        w->unit1 = 1;
        w->base1 = (int64_t)row * mw;
        w->unit2 = mw;
    }
    assert(w->j < sh->S); /* the PE's block is one of the rank's S */
    w->leader = w->in2 && w->l2.parent < 0;
}

static kb_va elem(kb_va va, int64_t i, kb_dtype dt) { return va + (kb_va)i * kb_dtype_size(dt); }

/* ---- between the leaders: one matrix row at a time ---- */

/* All-gather of g units of u elements at row + base (member i owns unit i), in place. */
static void ag_row_ring(kb_tl *tl, kb_va row, int64_t u, int i, int g, kb_dir fwd, kb_dir back,
                        kb_dtype dt, int t)
{
    int su = ((i - t) % g + g) % g, ru = ((i - t - 1) % g + g) % g;
    kb_val v = tl_load(tl, elem(row, su * u, dt), KB_SHAPE1(u), dt);
    kb_ccl_sendrecv_into(tl, fwd, v, back, elem(row, ru * u, dt), KB_SHAPE1(u), dt);
    tl_free(tl, v);
}

/* One dimension of the leaders' all-gather over m rows (row q at va + q*W): a ring of g - 1
 * steps when the dimension wraps, else a chain east then a chain west. */
static void ag_dim(kb_tl *tl, kb_va va, int64_t m, int64_t W, int64_t base, int64_t u, int i,
                   int g, int wrap, kb_dir fwd, kb_dir back, kb_dtype dt)
{
    if (g < 2)
        return;
    if (wrap) {
        for (int t = 0; t < g - 1; t++)
            for (int64_t q = 0; q < m; q++)
                ag_row_ring(tl, elem(va, q * W + base, dt), u, i, g, fwd, back, dt, t);
        return;
    }
    for (int64_t q = 0; q < m; q++) {
        kb_va row = elem(va, q * W + base, dt);
        if (i > 0)
            tl_recv_into(tl, back, row, KB_SHAPE1(i * u), dt);
        if (i < g - 1) {
            kb_val v = tl_load(tl, row, KB_SHAPE1((i + 1) * u), dt);
            tl_send(tl, fwd, v);
            tl_free(tl, v);
        }
    }
    for (int64_t q = 0; q < m; q++) {
        kb_va row = elem(va, q * W + base, dt);
        if (i < g - 1)
            tl_recv_into(tl, fwd, elem(row, (i + 1) * u, dt), KB_SHAPE1((g - 1 - i) * u), dt);
        if (i > 0) {
            kb_val v = tl_load(tl, elem(row, i * u, dt), KB_SHAPE1((g - i) * u), dt);
            tl_send(tl, back, v);
            tl_free(tl, v);
        }
    }
}

static void free_own(kb_tl *tl, kb_val v)
{
    if (v.scratch)
        tl_free(tl, v);
}

/*
 * Reduce-scatter of one row x (g units of u f32 elements, member i of g): returns the total
 * of unit i as a new value (a view of x when g == 1). Ring: g - 1 steps, unit i - t - 1 sent
 * at step t. Chain (no wrap): partial sums of units [i+1, g) flow east and of [0, i) west.
 */
static kb_val rs_row(kb_tl *tl, kb_val x, int64_t u, int i, int g, int wrap, kb_dir fwd,
                     kb_dir back)
{
    if (g < 2)
        return x;
    if (wrap) {
        kb_val cur = kb_val_slice(x, (uint32_t)((((i - 1) % g + g) % g) * u), (uint32_t)u);
        for (int t = 0; t < g - 1; t++) {
            int ru = ((i - t - 2) % g + g) % g;
            kb_val in = kb_ccl_sendrecv(tl, fwd, cur, cur, back, KB_SHAPE1(u), KB_F32);
            cur = tl_add(tl, kb_val_slice(x, (uint32_t)(ru * u), (uint32_t)u), in);
            tl_free(tl, in);
        }
        return cur;
    }
    kb_val part = { 0 }, inw = { 0 }, tot;
    if (i > 0) {
        kb_val ine = tl_recv(tl, back, KB_SHAPE1((g - i) * u), KB_F32);
        part = tl_add(tl, kb_val_slice(x, (uint32_t)(i * u), (uint32_t)((g - i) * u)), ine);
        tl_free(tl, ine);
    }
    if (i < g - 1)
        tl_send(tl, fwd, i > 0 ? kb_val_slice(part, (uint32_t)u, (uint32_t)((g - 1 - i) * u))
                               : kb_val_slice(x, (uint32_t)u, (uint32_t)((g - 1) * u)));
    if (i < g - 1)
        inw = tl_recv(tl, fwd, KB_SHAPE1((i + 1) * u), KB_F32);
    if (i > 0) {
        kb_val xs = kb_val_slice(x, 0, (uint32_t)(i * u));
        if (inw.scratch) {
            kb_val p2 = tl_add(tl, xs, kb_val_slice(inw, 0, (uint32_t)(i * u)));
            tl_send(tl, back, p2);
            tl_free(tl, p2);
        } else {
            tl_send(tl, back, xs);
        }
    }
    kb_val mine = i > 0 ? kb_val_slice(part, 0, (uint32_t)u) : kb_val_slice(x, 0, (uint32_t)u);
    tot = inw.scratch ? tl_add(tl, mine, kb_val_slice(inw, (uint32_t)(i * u), (uint32_t)u))
                      : tl_scale(tl, mine, 1.0f, 0.0f);
    free_own(tl, part);
    free_own(tl, inw);
    return tot;
}

/* ---- all_reduce shard by shard, over the lane rings ---- */

/*
 * Lane j (the SIP's j-th PE) of every SIP: the block in f32 reduce-scattered round the lane's
 * ring (rs_row: ws - 1 steps of n/ws elements, partial sums in f32), the SIP's unit of the total
 * stored, then all-gathered in place (ag_row_ring). Odd lanes go round the other way (member
 * (ws - sip) mod ws, NEXT and PREV swapped), so each direction of a link carries half the lanes.
 */
/*
 * The small form: every rank's whole block travels round the lane's ring both ways at once,
 * ceil((g - 1) / 2) steps (with g even the last goes forward only), each step's two sends
 * posted and its two receives in flight together; then the PE adds the g blocks in rank
 * order, so every SIP holds the same bits. g - 1 blocks cross each way where the ring moves
 * 2 (g - 1) / g of one, in a quarter of its 2 (g - 1) steps at g = 4.
 */
static void lanes_small(kb_tl *tl, kb_va tile, int64_t n, int sip, int g)
{
    kb_val blk[KB_DIST_SMALL_MAX];
    kb_shape sh = KB_SHAPE1(n);
    int64_t landed = 0;
    assert(g >= 2 && g <= KB_DIST_SMALL_MAX);
    blk[sip] = tl_load(tl, tile, sh, KB_F32);
    for (int s = 1; s <= g / 2; s++) {
        int rp = (sip - s + g) % g, rn = (sip + s) % g, both = 2 * s != g;
        kb_ipcq_req *r1 = tl_recv_async(tl, KB_DIST_LANE_PREV, sh, KB_F32);
        kb_ipcq_req *r2 = both ? tl_recv_async(tl, KB_DIST_LANE_NEXT, sh, KB_F32) : NULL;
        int64_t t = tl_send_async(tl, KB_DIST_LANE_NEXT, blk[(rp + 1) % g]);
        landed = t > landed ? t : landed;
        if (both) {
            t = tl_send_async(tl, KB_DIST_LANE_PREV, blk[(rn - 1 + g) % g]);
            landed = t > landed ? t : landed;
        }
        blk[rp] = tl_wait(tl, r1);
        if (both)
            blk[rn] = tl_wait(tl, r2);
    }
    kb_val acc = tl_add(tl, blk[0], blk[1]);
    for (int r = 2; r < g; r++) {
        kb_val next = tl_add(tl, acc, blk[r]);
        tl_free(tl, acc);
        acc = next;
    }
    tl_store(tl, tile, acc);
    tl_free(tl, acc);
    for (int r = 0; r < g; r++) /* the posted sends read them until they land */
        tl_free_after(tl, blk[r], landed);
}

void kb_dist_lanes_allreduce_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dist_lanes_args *a = KB_KARGS_GET(ka, kb_dist_lanes_args);
    int j = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    int g = a->ws, odd = j % 2;
    int i = odd ? (g - a->sip) % g : a->sip;
    kb_dir fwd = odd ? KB_DIST_LANE_PREV : KB_DIST_LANE_NEXT;
    kb_dir back = odd ? KB_DIST_LANE_NEXT : KB_DIST_LANE_PREV;
    int64_t n = a->n, u = n / g;
    kb_va tile = elem(a->tile, (int64_t)j * n, KB_F32);

    assert(u * g == n && a->sip >= 0 && a->sip < g); /* the caller's checks */
    if (g < 2 || n == 0)
        return;
    if (a->small) {
        lanes_small(tl, tile, n, a->sip, g);
        return;
    }
    kb_val x = tl_load(tl, tile, KB_SHAPE1(n), KB_F32);
    kb_val tot = rs_row(tl, x, u, i, g, 1, fwd, back);
    tl_store(tl, elem(tile, i * u, KB_F32), tot);
    tl_free(tl, tot);
    tl_free(tl, x);
    for (int t = 0; t < g - 1; t++)
        ag_row_ring(tl, tile, u, i, g, fwd, back, KB_F32, t);
}

/* The leaders' SIP grid and this leader's place in it. */
static void grid_of(const kb_dist_coll_shape *sh, int sip, int *gw, int *gh, int *sx, int *sy,
                    int *wrap)
{
    *gw = sh->gw;
    *gh = sh->gh;
    *wrap = sh->wrap;
    *sx = sip % *gw;
    *sy = sip / *gw;
}

/* ---- all_gather ---- */

void kb_dist_allgather_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dist_gather_args *a = KB_KARGS_GET(ka, kb_dist_gather_args);
    int64_t m = a->sh.m, c = a->c, S = a->sh.S, ws = a->sh.ws;
    kb_dtype dt = a->sh.dt;
    int64_t B = m * c, k = S * c, W = ws * k, K = m * k; /* K: elements of a rank's chunk */
    int sip = tl_program_id(tl, 2);
    where w;
    locate(tl, &a->sh, &w);
    kb_va in = elem(a->narrow, w.j * B, dt), out = elem(a->wide, w.j * m * W, dt);
    /* the PE's out block is staging until the end: rank-major, chunk r at r*K; inside the
     * own chunk the S blocks go block-major while they are gathered */
    kb_va own = elem(out, sip * K, dt);
    kb_val v = tl_load(tl, in, KB_SHAPE1(B), dt);
    tl_store(tl, elem(own, w.j * B, dt), v);
    tl_free(tl, v);

    /* 1. gather up: level 1 (members of a cube / a cube row), then level 2 */
    for (int lvl = 1; lvl <= 2; lvl++) {
        const tnode *t = lvl == 1 ? &w.l1 : &w.l2;
        int64_t unit = lvl == 1 ? w.unit1 : w.unit2, base = lvl == 1 ? w.base1 : 0;
        if (lvl == 2 && !w.in2)
            break;
        for (int x = 0; x < t->nch; x++)
            tl_recv_into(tl, t->ch[x], elem(own, (base + t->clo[x] * unit) * B, dt),
                         KB_SHAPE1((t->chi[x] - t->clo[x] + 1) * unit * B), dt);
        if (t->parent >= 0) {
            v = tl_load(tl, elem(own, (base + t->lo * unit) * B, dt),
                        KB_SHAPE1((t->hi - t->lo + 1) * unit * B), dt);
            tl_send(tl, (kb_dir)t->parent, v);
            tl_free(tl, v);
        }
    }

    /* 2. the leader turns its chunk row-major (m x k), the leaders all-gather the ranks'
     * contiguous chunks, and the leader lays the m x W matrix out row-major (the local
     * rearrangement of Megatron's gather along the last dimension) */
    if (w.leader) {
        if (m > 1) {
            v = tl_load(tl, own, KB_SHAPE1(K), dt);
            for (int64_t q = 0; q < m; q++)
                for (int64_t b = 0; b < S; b++)
                    tl_store(tl, elem(own, q * k + b * c, dt),
                             kb_val_slice(v, (uint32_t)(b * B + q * c), (uint32_t)c));
            tl_free(tl, v);
        }
        int gw, gh, sx, sy, wrap;
        grid_of(&a->sh, sip, &gw, &gh, &sx, &sy, &wrap);
        ag_dim(tl, out, 1, 0, (int64_t)sy * gw * K, K, sx, gw, wrap, KB_DIR_GLOBAL_E,
               KB_DIR_GLOBAL_W, dt);
        ag_dim(tl, out, 1, 0, 0, gw * K, sy, gh, wrap, KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_N, dt);
        if (m > 1 && ws > 1) {
            v = tl_load(tl, out, KB_SHAPE1(m * W), dt);
            for (int64_t r = 0; r < ws; r++)
                for (int64_t q = 0; q < m; q++)
                    tl_store(tl, elem(out, q * W + r * k, dt),
                             kb_val_slice(v, (uint32_t)(r * K + q * k), (uint32_t)k));
            tl_free(tl, v);
        }
    }

    /* 3. broadcast the m x W matrix down (level 2, then level 1), in equal pieces when it
     * does not fit at once (kb_dist_coll_pieces) */
    int64_t len = (m * W + a->pieces - 1) / a->pieces;
    for (int64_t off = 0; off < m * W; off += len) {
        int64_t n = m * W - off < len ? m * W - off : len;
        v = (kb_val){ 0 };
        if (w.leader)
            v = tl_load(tl, elem(out, off, dt), KB_SHAPE1(n), dt);
        for (int lvl = 2; lvl >= 1; lvl--) {
            const tnode *t = lvl == 1 ? &w.l1 : &w.l2;
            if (lvl == 2 && !w.in2)
                continue;
            if (t->parent >= 0) {
                v = tl_recv(tl, (kb_dir)t->parent, KB_SHAPE1(n), dt);
                tl_store(tl, elem(out, off, dt), v);
            }
            for (int x = 0; x < t->nch; x++)
                tl_send(tl, t->ch[x], v);
        }
        tl_free(tl, v);
    }
}

/* ---- reduce_scatter ---- */

/* A contiguous scratch value seen as one row (kb_val_slice works on rows). */
static kb_val flat(kb_val v)
{
    assert(kb_val_contiguous(v));
    v.cols *= v.rows;
    v.rows = 1;
    v.ld = 0;
    return v;
}

/* 1. Piece p of the PE's whole-width partial reduced up the tree (f32): the whole m x W block
 * when there is one piece, else (m == 1) columns [p kp, (p+1) kp) of each rank's unit, as
 * ws units of kp. Returns the subtree's sum (already sent on when the PE has a parent). */
static kb_val rs_up(kb_tl *tl, const kb_dist_gather_args *a, const where *w, kb_va in,
                    int64_t p)
{
    int64_t m = a->sh.m, k = a->sh.S * a->c, P = a->pieces, kp = k / P, n = m * a->sh.ws * kp;
    kb_dtype dt = a->sh.dt;
    kb_val v = P == 1 ? tl_load(tl, in, KB_SHAPE1(n), dt)
                      : flat(tl_load2d(tl, elem(in, p * kp, dt),
                                       KB_SHAPE2(a->sh.ws, kp), (uint32_t)k, dt));
    kb_val acc = tl_scale(tl, v, 1.0f, 0.0f);
    tl_free(tl, v);
    for (int lvl = 1; lvl <= 2; lvl++) {
        const tnode *t = lvl == 1 ? &w->l1 : &w->l2;
        if (lvl == 2 && !w->in2)
            break;
        for (int x = 0; x < t->nch; x++) {
            kb_val r = tl_recv(tl, t->ch[x], KB_SHAPE1(n), KB_F32);
            kb_val s = tl_add(tl, acc, r);
            tl_free(tl, acc);
            tl_free(tl, r);
            acc = s;
        }
        if (t->parent >= 0) {
            tl_send(tl, (kb_dir)t->parent, acc);
            break;
        }
    }
    return acc;
}

/* 2. The leaders reduce-scatter piece p row by row (grid columns first, then rows); the
 * rank's chunk goes block-major, rounded to the dtype once, to the start of the leader's `in`
 * block (with pieces, m == 1: the chunk's blocks lie end to end, piece p at p kp, a range
 * the leader has already read). */
static void rs_leaders(kb_tl *tl, const kb_dist_gather_args *a, int sip, kb_val acc, kb_va in,
                       int64_t p)
{
    int64_t m = a->sh.m, c = a->c, S = a->sh.S, B = m * c, P = a->pieces, kp = S * c / P;
    int64_t Wp = a->sh.ws * kp;
    kb_dtype dt = a->sh.dt;
    int gw, gh, sx, sy, wrap;
    grid_of(&a->sh, sip, &gw, &gh, &sx, &sy, &wrap);
    for (int64_t q = 0; q < m; q++) {
        kb_val row = kb_val_slice(acc, (uint32_t)(q * Wp), (uint32_t)Wp);
        kb_val ry = rs_row(tl, row, gw * kp, sy, gh, wrap, KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_N);
        kb_val rx = rs_row(tl, ry, kp, sx, gw, wrap, KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W);
        if (!ry.scratch && !rx.scratch) /* one SIP: the chunk is the row itself */
            rx = kb_val_slice(row, 0, (uint32_t)kp);
        if (P == 1)
            for (int64_t b = 0; b < S; b++)
                tl_store(tl, elem(in, b * B + q * c, dt),
                         kb_val_slice(rx, (uint32_t)(b * c), (uint32_t)c));
        else
            tl_store(tl, elem(in, p * kp, dt), rx);
        if (rx.pa != ry.pa)
            free_own(tl, rx);
        free_own(tl, ry);
    }
}

void kb_dist_reducescatter_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dist_gather_args *a = KB_KARGS_GET(ka, kb_dist_gather_args);
    int64_t m = a->sh.m, c = a->c, S = a->sh.S, ws = a->sh.ws;
    kb_dtype dt = a->sh.dt;
    int64_t B = m * c, W = ws * S * c;
    int sip = tl_program_id(tl, 2);
    where w;
    locate(tl, &a->sh, &w);
    kb_va out = elem(a->narrow, w.j * B, dt), in = elem(a->wide, w.j * m * W, dt);

    /* the caller's kb_dist_coll_pieces: pieces of whole blocks, only for one row */
    assert(a->pieces >= 1 && S % a->pieces == 0 && (a->pieces == 1 || m == 1));
    for (int64_t p = 0; p < a->pieces; p++) {
        kb_val acc = rs_up(tl, a, &w, in, p);
        if (w.leader)
            rs_leaders(tl, a, sip, acc, in, p);
        tl_free(tl, acc);
    }

    /* 3. scatter the chunk down: each message holds the receiver's subtree's blocks */
    kb_val v = { 0 };
    int64_t vlo = 0; /* first block v holds */
    if (w.leader)
        v = tl_load(tl, in, KB_SHAPE1(S * B), dt);
    for (int lvl = 2; lvl >= 1; lvl--) {
        const tnode *t = lvl == 1 ? &w.l1 : &w.l2;
        int64_t unit = lvl == 1 ? w.unit1 : w.unit2, base = lvl == 1 ? w.base1 : 0;
        if (lvl == 2 && !w.in2)
            continue;
        if (t->parent >= 0) {
            vlo = base + t->lo * unit;
            v = tl_recv(tl, (kb_dir)t->parent, KB_SHAPE1((t->hi - t->lo + 1) * unit * B), dt);
        }
        for (int x = 0; x < t->nch; x++)
            tl_send(tl, t->ch[x],
                    kb_val_slice(v, (uint32_t)((base + t->clo[x] * unit - vlo) * B),
                                 (uint32_t)((t->chi[x] - t->clo[x] + 1) * unit * B)));
    }
    tl_store(tl, out, kb_val_slice(v, (uint32_t)((w.j - vlo) * B), (uint32_t)B));
    tl_free(tl, v);
}

/* ---- arguments ---- */

int64_t kb_dist_coll_pieces(int reduce_scatter, uint64_t scratch, int64_t m, int64_t S,
                            int64_t ws, int64_t c, kb_dtype dt)
{
    uint64_t W = (uint64_t)(ws * S * c), es = kb_dtype_size(dt);
    if (reduce_scatter) {
        /* the one pass holds a PE's sum, a child's block and the new sum (f32); a PE with no
         * child (S == 1) its block as loaded and as f32 */
        if ((uint64_t)m * W * (S > 1 ? 12 : 4 + es) <= scratch)
            return 1;
        for (int64_t P = 2; m == 1 && P <= S; P++)
            if (S % P == 0 && 12 * (W / (uint64_t)P) <= scratch / 2)
                return P;
        return 0;
    }
    if ((uint64_t)m * W * es <= scratch) /* the broadcast's block; the leader's layout */
        return 1;
    if (m != 1)
        return 0;
    return (int64_t)((W * es + scratch / 2 - 1) / (scratch / 2));
}

/* The wirings whose trees the kernels know, by the mapper of the entry that installs them. */
static const struct {
    const char *mapper;
    int tree;
} wirings[] = {
    { "all_pes", KB_DIST_TREE_CHAINS },       /* hierarchical_3level over every PE */
    { "pe0_all_cubes", KB_DIST_TREE_LINES },  /* kb_dist_install_intercube */
};

int kb_dist_coll_tree(const kb_ccl_sip_form *algo)
{
    for (size_t i = 0; i < sizeof wirings / sizeof wirings[0]; i++)
        if (algo->mapper && !strcmp(wirings[i].mapper, algo->mapper))
            return wirings[i].tree;
    return -1;
}

kb_dist_coll_shape kb_dist_coll_shape_of(const kb_machine *m, int tree, int ws, int root_cube,
                                         int64_t rows, int S, kb_dtype dt)
{
    kb_dist_coll_shape sh = { .m = rows, .S = S, .ws = ws, .dt = dt, .tree = tree };
    if (tree == KB_DIST_TREE_CHAINS) {
        /* hierarchical_3level: a global E/W ring of the SIP leaders, whatever the topology */
        sh.g1 = m->npes;
        sh.g2 = m->ncubes;
        sh.gw = ws;
        sh.gh = 1;
        sh.wrap = 1;
    } else {
        /* the lines and the leaders' grid cover the SIP's cubes and the machine's SIPs */
        assert(root_cube >= 0 && root_cube < m->mesh_w * m->mesh_h &&
               m->sip_grid_w * m->sip_grid_h == ws);
        sh.g1 = m->mesh_w;
        sh.g2 = m->mesh_h;
        sh.root_cube = root_cube;
        sh.gw = m->sip_grid_w;
        sh.gh = m->sip_grid_h;
        sh.wrap = m->sip_topo != KB_SIPTOPO_MESH_2D_NO_WRAP;
    }
    return sh;
}

/* ---- broadcast and reduce (a rank's tensor: S shards of n elements, one per PE) ---- */

/* A leader's place in the broadcast / reduce tree over the SIP grid rooted at rank `root`:
 * along the root's grid row (X), then along every column (Y); halves of a ring where the
 * grid wraps, lines from the root where it does not. */
typedef struct gnode {
    int parent;      /* direction toward the root, -1 at the root */
    int nch;
    kb_dir ch[4];
} gnode;

static void dim_node(int i, int g, int rt, int wrap, kb_dir fwd, kb_dir back, int *parent,
                     kb_dir *ch, int *nch)
{
    *parent = -1;
    if (g < 2)
        return;
    if (wrap) {
        int de = ((i - rt) % g + g) % g, h = g / 2;
        if (de == 0) {
            ch[(*nch)++] = fwd;
            if (g - 1 >= h + 1)
                ch[(*nch)++] = back;
        } else if (de <= h) {
            *parent = (int)back;
            if (de < h)
                ch[(*nch)++] = fwd;
        } else {
            *parent = (int)fwd;
            if (de > h + 1)
                ch[(*nch)++] = back;
        }
        return;
    }
    if (i == rt) {
        if (rt < g - 1)
            ch[(*nch)++] = fwd;
        if (rt > 0)
            ch[(*nch)++] = back;
    } else if (i > rt) {
        *parent = (int)back;
        if (i < g - 1)
            ch[(*nch)++] = fwd;
    } else {
        *parent = (int)fwd;
        if (i > 0)
            ch[(*nch)++] = back;
    }
}

static void grid_node(const kb_dist_coll_shape *sh, int sip, int root, gnode *gn)
{
    int gw, gh, sx, sy, wrap, p;
    grid_of(sh, sip, &gw, &gh, &sx, &sy, &wrap);
    int rx = root % gw, ry = root / gw;
    assert(sy < gh && ry < gh); /* the leaders' grid holds every SIP */
    memset(gn, 0, sizeof *gn);
    gn->parent = -1;
    if (sy == ry) {
        dim_node(sx, gw, rx, wrap, KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W, &gn->parent, gn->ch, &gn->nch);
        dim_node(sy, gh, ry, wrap, KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_N, &p, gn->ch, &gn->nch);
    } else {
        dim_node(sy, gh, ry, wrap, KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_N, &gn->parent, gn->ch,
                 &gn->nch);
    }
    assert(gn->nch <= 4); /* two children per dimension at most */
}

typedef struct bsink {
    int ndir;
    kb_dir dir[4];
} bsink;

static void sink_send(kb_tl *tl, const bsink *s, kb_val v)
{
    for (int x = 0; x < s->ndir; x++)
        tl_send(tl, s->dir[x], v);
}

/*
 * Broadcast, up on the root's SIP: the PE's subtree's blocks in increasing block order, each
 * taken from the child that holds it (received) or from its own shard (loaded) and handed to
 * the sink. Every subtree of a chain or line is a range of members with the own member at an
 * end, so each child emits its blocks in increasing order too.
 */
static void emit_up(kb_tl *tl, const where *w, int lvl, kb_va t, int64_t n, kb_dtype dt,
                    const bsink *s)
{
    const tnode *nd = lvl == 1 ? &w->l1 : &w->l2;
    int64_t unit = lvl == 1 ? w->unit1 : w->unit2;
    /* segments in member order: children's ranges and the own member */
    for (int mbr = nd->lo; mbr <= nd->hi;) {
        int x = child_from(nd, mbr);
        if (x < nd->nch) {
            int64_t cnt = (nd->chi[x] - nd->clo[x] + 1) * unit;
            for (int64_t b = 0; b < cnt; b++) {
                kb_val v = tl_recv(tl, nd->ch[x], KB_SHAPE1(n), dt);
                sink_send(tl, s, v);
                tl_free(tl, v);
            }
            mbr = nd->chi[x] + 1;
        } else {
            if (lvl == 2) {
                emit_up(tl, w, 1, t, n, dt, s);
            } else {
                kb_val v = tl_load(tl, elem(t, w->j * n, dt), KB_SHAPE1(n), dt);
                sink_send(tl, s, v);
                tl_free(tl, v);
            }
            mbr++;
        }
    }
}

/* Broadcast, down on another SIP: block b (received, in increasing order) goes to the child
 * whose subtree holds it, or into the own shard at element `off`. */
static void route_down(kb_tl *tl, const where *w, int lvl, int64_t b, kb_val v, kb_va t,
                       int64_t n, int64_t off, kb_dtype dt)
{
    const tnode *nd = lvl == 1 ? &w->l1 : &w->l2;
    int64_t unit = lvl == 1 ? w->unit1 : w->unit2, base = lvl == 1 ? w->base1 : 0;
    int64_t mbr = (b - base) / unit;
    for (int x = 0; x < nd->nch; x++)
        if (mbr >= nd->clo[x] && mbr <= nd->chi[x]) {
            tl_send(tl, nd->ch[x], v);
            return;
        }
    if (lvl == 2)
        route_down(tl, w, 1, b, v, t, n, off, dt);
    else
        tl_store(tl, elem(t, w->j * n + off, dt), v);
}

void kb_dist_broadcast_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dist_rooted_args *a = KB_KARGS_GET(ka, kb_dist_rooted_args);
    int64_t n = a->sh.m;
    int root = a->root, sip = tl_program_id(tl, 2);
    kb_dtype dt = a->sh.dt;
    kb_va t = a->t;
    where w;
    locate(tl, &a->sh, &w);
    int top = w.in2 ? 2 : 1;
    const tnode *nd = top == 1 ? &w.l1 : &w.l2;
    gnode gn;
    bsink s = { 0, { 0 } };
    if (w.leader) {
        grid_node(&a->sh, sip, root, &gn);
        s.ndir = gn.nch;
        memcpy(s.dir, gn.ch, sizeof gn.ch);
    } else if (sip == root) {
        s.ndir = 1;
        s.dir[0] = (kb_dir)nd->parent;
    }
    if (sip == root) {
        emit_up(tl, &w, top, t, n, dt, &s);
        return;
    }
    /* another SIP: the blocks of this PE's subtree arrive in increasing order */
    int parent = w.leader ? gn.parent : nd->parent;
    int64_t lo = top == 1 ? w.base1 + nd->lo * w.unit1 : nd->lo * w.unit2;
    int64_t hi = top == 1 ? w.base1 + (nd->hi + 1) * w.unit1 : (nd->hi + 1) * w.unit2;
    for (int64_t b = lo; b < hi; b++) {
        kb_val v = tl_recv(tl, (kb_dir)parent, KB_SHAPE1(n), dt);
        if (w.leader)
            sink_send(tl, &s, v);
        route_down(tl, &w, top, b, v, t, n, 0, dt);
        tl_free(tl, v);
    }
}

/*
 * Reduce: every shard summed (f32) up the tree to the leader, the leaders' sums toward the
 * root's leader, whose total goes down its SIP's tree into every shard of the root's tensor.
 * The other ranks' tensors are left as they were.
 */
void kb_dist_reduce_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dist_rooted_args *a = KB_KARGS_GET(ka, kb_dist_rooted_args);
    int64_t n = a->sh.m;
    int root = a->root, sip = tl_program_id(tl, 2);
    kb_dtype dt = a->sh.dt;
    kb_va mine;
    where w;
    locate(tl, &a->sh, &w);
    mine = elem(a->t, w.j * n, dt);
    kb_val v = tl_load(tl, mine, KB_SHAPE1(n), dt);
    kb_val acc = tl_scale(tl, v, 1.0f, 0.0f);
    tl_free(tl, v);
    int sent = 0;
    for (int lvl = 1; lvl <= 2 && !sent; lvl++) {
        const tnode *t = lvl == 1 ? &w.l1 : &w.l2;
        if (lvl == 2 && !w.in2)
            break;
        for (int x = 0; x < t->nch; x++) {
            kb_val r = tl_recv(tl, t->ch[x], KB_SHAPE1(n), KB_F32);
            kb_val s = tl_add(tl, acc, r);
            tl_free(tl, acc);
            tl_free(tl, r);
            acc = s;
        }
        if (t->parent >= 0) {
            tl_send(tl, (kb_dir)t->parent, acc);
            sent = 1;
        }
    }
    if (w.leader) {
        gnode gn;
        grid_node(&a->sh, sip, root, &gn);
        for (int x = 0; x < gn.nch; x++) {
            kb_val r = tl_recv(tl, gn.ch[x], KB_SHAPE1(n), KB_F32);
            kb_val s = tl_add(tl, acc, r);
            tl_free(tl, acc);
            tl_free(tl, r);
            acc = s;
        }
        if (gn.parent >= 0)
            tl_send(tl, (kb_dir)gn.parent, acc);
    }
    if (sip == root) {
        /* the total down the root SIP's tree: level 2, then level 1 */
        for (int lvl = 2; lvl >= 1; lvl--) {
            const tnode *t = lvl == 1 ? &w.l1 : &w.l2;
            if (lvl == 2 && !w.in2)
                continue;
            if (t->parent >= 0) {
                tl_free(tl, acc);
                acc = tl_recv(tl, (kb_dir)t->parent, KB_SHAPE1(n), KB_F32);
            }
            for (int x = 0; x < t->nch; x++)
                tl_send(tl, t->ch[x], acc);
        }
        tl_store(tl, mine, acc);
    }
    tl_free(tl, acc);
}

/* ---- all_to_all (a rank's tensors: S shards of n elements, each ws blocks of u = n/ws) ---- */

/* The leader's up phase: the rank's S shards as values, vals[b] = shard b, received up the
 * tree in the order emit_up sends them (every subtree in increasing block order). */
static void collect_up(kb_tl *tl, const where *w, int lvl, kb_va t, int64_t n, kb_dtype dt,
                       kb_val *vals)
{
    const tnode *nd = lvl == 1 ? &w->l1 : &w->l2;
    int64_t unit = lvl == 1 ? w->unit1 : w->unit2, base = lvl == 1 ? w->base1 : 0;
    for (int mbr = nd->lo; mbr <= nd->hi;) {
        int x = child_from(nd, mbr);
        if (x < nd->nch) {
            for (int64_t b = base + nd->clo[x] * unit; b < base + (nd->chi[x] + 1) * unit; b++)
                vals[b] = tl_recv(tl, nd->ch[x], KB_SHAPE1(n), dt);
            mbr = nd->chi[x] + 1;
        } else {
            if (lvl == 2)
                collect_up(tl, w, 1, t, n, dt, vals);
            else
                vals[w->j] = tl_load(tl, elem(t, w->j * n, dt), KB_SHAPE1(n), dt);
            mbr++;
        }
    }
}

/* The nc items (u elements each) as one contiguous message: local copies into a fresh
 * scratch value of the items' dtype (freed by the caller once sent). */
static kb_val pack_items(kb_tl *tl, const kb_val *items, int64_t nc, int64_t u, kb_dtype dt)
{
    kb_val p = kb_tl_scratch_val(tl, 1, (uint32_t)(nc * u), dt, "dist_all_to_all");
    for (int64_t e = 0; e < nc; e++)
        tl_copy(tl, kb_val_slice(p, (uint32_t)(e * u), (uint32_t)u), items[e]);
    return p;
}

/*
 * All-to-all along one dimension of the leaders' grid: g members, this one i. it[d*q + k] is
 * the k-th item (u elements) this member holds for member d; on return got[x*q + k] is the
 * k-th item member x held for this one (the own items pass as they are). Every step moves
 * one message per direction: the items a member passes on are packed into one value, and
 * those it receives stay views of the received value, which is appended to keep[] (freed
 * by the caller at the end). carry has room for g*q items.
 *   ring (wrap): g - 1 steps; at step t every member sends fwd the items still travelling
 *      (those of source i - t + 1 for distances t .. g-1 from it, nearest first) and receives
 *      from back those of source i - t: it keeps the first q (its own) and forwards the rest
 *      at step t + 1. Through kb_ccl_sendrecv, so the ring never blocks.
 *   chain (no wrap): the same flow eastward over members 0 .. g-1 (items for higher members),
 *      then westward (items for lower members); a member sends a batch before it receives
 *      the next, and the flow is one way, so a full queue only waits for the member ahead.
 * A link of a ring carries q g (g - 1) / 2 items; the chain's link between members i and
 * i + 1 carries (i + 1)(g - 1 - i) q items each way.
 */
static void a2a_dim(kb_tl *tl, const kb_val *it, kb_val *got, kb_val *carry, int64_t q,
                    int64_t u, int i, int g, int wrap, kb_dir fwd, kb_dir back, kb_dtype dt,
                    kb_val *keep, int *nkeep)
{
    int64_t nc = 0;
    for (int64_t k = 0; k < q; k++)
        got[(int64_t)i * q + k] = it[(int64_t)i * q + k];
    if (g < 2)
        return;
    if (wrap) {
        for (int d = 1; d < g; d++)
            for (int64_t k = 0; k < q; k++)
                carry[nc++] = it[(int64_t)((i + d) % g) * q + k];
        for (int t = 1; t < g; t++) {
            int x = ((i - t) % g + g) % g;
            kb_val p = pack_items(tl, carry, nc, u, dt);
            kb_val r = kb_ccl_sendrecv(tl, fwd, p, p, back, KB_SHAPE1(nc * u), dt);
            keep[(*nkeep)++] = r;
            for (int64_t e = 0; e < nc; e++) {
                kb_val v = kb_val_slice(r, (uint32_t)(e * u), (uint32_t)u);
                if (e < q)
                    got[(int64_t)x * q + e] = v;
                else
                    carry[e - q] = v;
            }
            nc -= q;
        }
        return;
    }
    for (int dir = 0; dir < 2; dir++) {
        /* east: members ascending over fwd; west: the mirror image over back */
        int me = dir == 0 ? i : g - 1 - i;
        kb_dir to = dir == 0 ? fwd : back, from = dir == 0 ? back : fwd;
        nc = 0;
        for (int d = me + 1; d < g; d++)
            for (int64_t k = 0; k < q; k++)
                carry[nc++] = it[(int64_t)(dir == 0 ? d : g - 1 - d) * q + k];
        for (int t = 1; t < g; t++) {
            if (me - t + 1 >= 0 && me < g - 1 && nc > 0) {
                kb_val p = pack_items(tl, carry, nc, u, dt);
                tl_send(tl, to, p);
                tl_free(tl, p);
            }
            nc = 0;
            if (me - t < 0)
                break;
            int x = dir == 0 ? me - t : g - 1 - (me - t);
            int64_t cnt = (int64_t)(g - me) * q;
            kb_val r = tl_recv(tl, from, KB_SHAPE1(cnt * u), dt);
            keep[(*nkeep)++] = r;
            for (int64_t e = 0; e < cnt; e++) {
                kb_val v = kb_val_slice(r, (uint32_t)(e * u), (uint32_t)u);
                if (e < q)
                    got[(int64_t)x * q + e] = v;
                else
                    carry[nc++] = v;
            }
        }
    }
}

/*
 * all_to_all: block i of shard s of rank r (the i-th u-element slice of the PE's shard of
 * `in`) becomes block r of shard s of rank i (`out`). 1. every PE streams its subtree's shards
 * up the tree (emit_up) to the leader, which holds the rank's whole tensor; 2. the leaders
 * exchange the blocks over the SIP grid, along grid rows (items: every shard's blocks for
 * the destinations of a grid column) and then along columns (a2a_dim: rings, or chains where
 * the grid does not wrap); 3. the leader packs every shard's received blocks in rank order
 * and routes the shard down the tree to the PE that owns it, in increasing shard order.
 * n = sh.m elements per shard, S = sh.S shards.
 */
void kb_dist_alltoall_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dist_alltoall_args *a = KB_KARGS_GET(ka, kb_dist_alltoall_args);
    int64_t n = a->sh.m, S = a->sh.S, ws = a->sh.ws, u = n / ws;
    kb_dtype dt = a->sh.dt;
    kb_va in = a->in, out = a->out;
    int sip = tl_program_id(tl, 2);
    where w;
    locate(tl, &a->sh, &w);
    int top = w.in2 ? 2 : 1;
    const tnode *nd = top == 1 ? &w.l1 : &w.l2;

    if (!w.leader) {
        bsink s = { 1, { (kb_dir)nd->parent } };
        int64_t lo = top == 1 ? w.base1 + nd->lo * w.unit1 : nd->lo * w.unit2;
        int64_t hi = top == 1 ? w.base1 + (nd->hi + 1) * w.unit1 : (nd->hi + 1) * w.unit2;
        emit_up(tl, &w, top, in, n, dt, &s);
        for (int64_t b = lo; b < hi; b++) {
            kb_val v = tl_recv(tl, (kb_dir)nd->parent, KB_SHAPE1(n), dt);
            route_down(tl, &w, top, b, v, out, n, 0, dt);
            tl_free(tl, v);
        }
        return;
    }

    int gw, gh, sx, sy, wrap;
    grid_of(&a->sh, sip, &gw, &gh, &sx, &sy, &wrap);
    int64_t q1 = S * gh, q2 = S * gw, total = S * ws;
    /* one allocation for the item tables (freed on return; a kernel that fails never
     * returns, and the run stops with it) */
    kb_val *vals = calloc((size_t)(S + 5 * total + 4 * ws), sizeof *vals);
    if (!vals)
        tl_fail(tl, KB_ERR_NOMEM, "dist_all_to_all: out of host memory for %lld items", (long long)total);
    kb_val *it1 = vals + S, *got1 = it1 + total, *it2 = got1 + total, *got2 = it2 + total,
           *carry = got2 + total, *keep = carry + total; /* keep: the received messages */
    int nkeep = 0;

    /* 1. the rank's tensor up to the leader */
    collect_up(tl, &w, 2, in, n, dt, vals);
    /* 2. grid rows: the items of column dc are every shard's blocks for the ranks of column
     * dc (k = s*gh + destination row); then grid columns (k = s*gw + source column) */
    for (int64_t s = 0; s < S; s++)
        for (int dr = 0; dr < gh; dr++)
            for (int dc = 0; dc < gw; dc++)
                it1[dc * q1 + s * gh + dr] =
                    kb_val_slice(vals[s], (uint32_t)((dr * gw + dc) * u), (uint32_t)u);
    a2a_dim(tl, it1, got1, carry, q1, u, sx, gw, wrap, KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W, dt,
            keep, &nkeep);
    for (int64_t s = 0; s < S; s++)
        for (int dr = 0; dr < gh; dr++)
            for (int xc = 0; xc < gw; xc++)
                it2[dr * q2 + s * gw + xc] = got1[xc * q1 + s * gh + dr];
    a2a_dim(tl, it2, got2, carry, q2, u, sy, gh, wrap, KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_N, dt,
            keep, &nkeep);
    /* 3. down: got2[yr*q2 + s*gw + xc] is shard s's block from rank yr*gw + xc; a shard's
     * blocks are packed in rank order (carry is free again) and go down as one message */
    for (int64_t s = 0; s < S; s++) {
        for (int64_t src = 0; src < ws; src++)
            carry[src] = got2[(src / gw) * q2 + s * gw + src % gw];
        kb_val v = pack_items(tl, carry, ws, u, dt);
        route_down(tl, &w, 2, s, v, out, n, 0, dt);
        tl_free(tl, v);
    }
    for (int x = 0; x < nkeep; x++)
        tl_free(tl, keep[x]);
    for (int64_t s = 0; s < S; s++)
        tl_free(tl, vals[s]);
    free(vals);
}

/* ---- send / recv ---- */

void kb_dist_p2p_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const kb_dist_p2p_args *a = KB_KARGS_GET(ka, kb_dist_p2p_args);
    int64_t n = a->sh.m, S = a->sh.S;
    int role = a->role;
    kb_dtype dt = a->sh.dt;
    kb_va t = a->t;
    where w;
    if (role == KB_DIST_P2P_IDLE)
        return;
    locate(tl, &a->sh, &w);
    int top = w.in2 ? 2 : 1;
    const tnode *nd = top == 1 ? &w.l1 : &w.l2;
    if (role == KB_DIST_P2P_SRC) {
        /* the shards up the tree in increasing order, the leader passing each on */
        bsink s = { 1, { w.leader ? a->out : (kb_dir)nd->parent } };
        emit_up(tl, &w, top, t, n, dt, &s);
    } else if (role == KB_DIST_P2P_FWD) {
        if (!w.leader)
            return;
        for (int64_t b = 0; b < S; b++) {
            kb_val v = tl_recv(tl, a->in, KB_SHAPE1(n), dt);
            tl_send(tl, a->out, v);
            tl_free(tl, v);
        }
    } else {
        /* DST: the shards arrive in increasing order, each routed to the PE that owns it */
        int parent = w.leader ? (int)a->in : nd->parent;
        int64_t lo = top == 1 ? w.base1 + nd->lo * w.unit1 : nd->lo * w.unit2;
        int64_t hi = top == 1 ? w.base1 + (nd->hi + 1) * w.unit1 : (nd->hi + 1) * w.unit2;
        for (int64_t b = lo; b < hi; b++) {
            kb_val v = tl_recv(tl, (kb_dir)parent, KB_SHAPE1(n), dt);
            route_down(tl, &w, top, b, v, t, n, 0, dt);
            tl_free(tl, v);
        }
    }
}

int kb_dist_coll_shard_ok(const kb_machine *m, int tree, int64_t i, const kb_shard_spec *sh)
{
    if (tree == KB_DIST_TREE_CHAINS)
        return sh->cube == (unsigned)(i / m->npes) && sh->pe == (unsigned)(i % m->npes);
    return sh->cube == (unsigned)i && sh->pe == 0;
}
