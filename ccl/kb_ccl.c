/*
 * kb_ccl — topologies, reverse pairing, the rank = PE layout and install plans
 * (kb_ccl.h). Topology tables are computed per rank on demand (O(1) each), so a plan for
 * thousands of ranks needs no big tables. Limits: mesh topologies need a square world.
 */
#include "kb_ccl.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>


/* ---- topologies: one function per family, one table ---- */

typedef int (*topo_fn)(const char *name, int ws, int rank, const kb_ccl_geom *g,
                       int nbr[KB_NDIRS], kb_errbuf *eb);

static int isqrt_exact(int ws)
{
    int k = (int)lround(sqrt((double)ws));
    return k * k == ws ? k : -1;
}

static int topo_none(const char *name, int ws, int rank, const kb_ccl_geom *g,
                     int nbr[KB_NDIRS], kb_errbuf *eb)
{
    (void)name, (void)ws, (void)rank, (void)g, (void)nbr, (void)eb;
    return 0;
}

/* ring_1d and ring_1d_unidir: unidir data flows E only, but each link's receiving side is W */
static int topo_ring(const char *name, int ws, int rank, const kb_ccl_geom *g,
                     int nbr[KB_NDIRS], kb_errbuf *eb)
{
    (void)name, (void)g, (void)eb;
    if (ws > 1) {
        nbr[KB_DIR_E] = (rank + 1) % ws;
        nbr[KB_DIR_W] = (rank + ws - 1) % ws;
    }
    return 0;
}

static int topo_mesh(const char *name, int ws, int rank, const kb_ccl_geom *g,
                     int nbr[KB_NDIRS], kb_errbuf *eb, int wrap)
{
    int k = isqrt_exact(ws);
    (void)g;
    if (k < 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "topology %s needs a square world size, got %d",
                          name, ws);
    int x = rank % k, y = rank / k;
    if (k > 1) {
        if (wrap || x + 1 < k)
            nbr[KB_DIR_E] = y * k + (x + 1) % k;
        if (wrap || x > 0)
            nbr[KB_DIR_W] = y * k + (x + k - 1) % k;
        if (wrap || y > 0)
            nbr[KB_DIR_N] = ((y + k - 1) % k) * k + x;
        if (wrap || y + 1 < k)
            nbr[KB_DIR_S] = ((y + 1) % k) * k + x;
    }
    return 0;
}

static int topo_mesh_wrap(const char *name, int ws, int rank, const kb_ccl_geom *g,
                          int nbr[KB_NDIRS], kb_errbuf *eb)
{
    return topo_mesh(name, ws, rank, g, nbr, eb, 1);
}

static int topo_mesh_nowrap(const char *name, int ws, int rank, const kb_ccl_geom *g,
                            int nbr[KB_NDIRS], kb_errbuf *eb)
{
    return topo_mesh(name, ws, rank, g, nbr, eb, 0);
}

/* heap order over the ranks relabelled v = (rank - root) mod ws: the tree hangs from the
 * geometry's root (0 without one) */
static int topo_tree(const char *name, int ws, int rank, const kb_ccl_geom *g,
                     int nbr[KB_NDIRS], kb_errbuf *eb)
{
    int root = g ? g->root : 0, v = ((rank - root) % ws + ws) % ws;
    (void)name, (void)eb;
    if (v > 0)
        nbr[KB_DIR_PARENT] = ((v - 1) / 2 + root) % ws;
    if (2 * v + 1 < ws)
        nbr[KB_DIR_CHILD_LEFT] = (2 * v + 1 + root) % ws;
    if (2 * v + 2 < ws)
        nbr[KB_DIR_CHILD_RIGHT] = (2 * v + 2 + root) % ws;
    return 0;
}

static int topo_hier(const char *name, int ws, int rank, const kb_ccl_geom *g,
                     int nbr[KB_NDIRS], kb_errbuf *eb)
{
    /* ranks fill PEs in linear order; the world's last cube and SIP may be partial: a chain
     * links the ranks it has (the kernel's hier_chains counts them the same way) */
    int P = g->pes_per_cube, per_sip = P * g->cubes_per_sip;
    (void)name, (void)eb;
    int pe = rank % P, cube = rank % per_sip / P, sip = rank / per_sip;
    int cube_base = rank - pe, sip_base = sip * per_sip;
    int in_cube = ws - cube_base < P ? ws - cube_base : P;
    int in_sip = ws - sip_base < per_sip ? ws - sip_base : per_sip;
    int cubes = (in_sip + P - 1) / P, sips = (ws + per_sip - 1) / per_sip;
    if (in_cube > 1) {
        nbr[KB_DIR_E] = cube_base + (pe + 1) % in_cube;
        nbr[KB_DIR_W] = cube_base + (pe + in_cube - 1) % in_cube;
    }
    if (pe == 0 && cubes > 1) {
        nbr[KB_DIR_N] = sip_base + ((cube + 1) % cubes) * P;
        nbr[KB_DIR_S] = sip_base + ((cube + cubes - 1) % cubes) * P;
    }
    if (pe == 0 && cube == 0 && sips > 1) {
        nbr[KB_DIR_GLOBAL_E] = ((sip + 1) % sips) * per_sip;
        nbr[KB_DIR_GLOBAL_W] = ((sip + sips - 1) % sips) * per_sip;
    }
    return 0;
}

int kb_topo_cube_ring(int C, int w, int *order)
{
    int h = w > 0 && C % w == 0 ? C / w : 0, k = 0, t = 0;
    if (w < 2 || h < 2 || (w % 2 && h % 2)) {
        for (int c = 0; c < C; c++)
            order[c] = c;
        return C;
    }
    if (h % 2) { /* walk the transposed grid: rows become columns */
        t = 1;
        int x = w;
        w = h;
        h = x;
    }
    /* (x, y) of the walk is cube y * w + x, or x * h + y transposed */
#define KB_CUBE_AT(x, y) (t ? (x) * h + (y) : (y) * w + (x))
    for (int x = 0; x < w; x++)
        order[k++] = KB_CUBE_AT(x, 0);
    for (int y = 1; y < h; y++)
        for (int i = 1; i < w; i++)
            order[k++] = KB_CUBE_AT(y % 2 ? w - i : i, y);
    for (int y = h - 1; y >= 1; y--)
        order[k++] = KB_CUBE_AT(0, y);
#undef KB_CUBE_AT
    assert(k == C); /* the cycle visits each of the w x h cubes once */
    return k;
}

int kb_topo_cube_pos(int cube, int C, int w)
{
    int order[KB_MAX_CUBES], k = 0;
    (void)kb_topo_cube_ring(C, w, order);
    while (k < C && order[k] != cube)
        k++;
    return k;
}

int kb_topo_lanes_shape(int ws, const kb_ccl_geom *g, int *P, int *C, int *S)
{
    int p = g->pes_per_cube, per_sip = p * g->cubes_per_sip;
    if (ws < 1 || p < 1 || ws % p != 0 || (ws > per_sip && ws % per_sip != 0))
        return 0;
    *P = p;
    *C = ws > per_sip ? g->cubes_per_sip : ws / p;
    *S = ws > per_sip ? ws / per_sip : 1;
    return 1;
}

int kb_topo_lanes_flat_pos(int rank, const kb_ccl_geom *g, int P, int C)
{
    int f = P * C, i = rank % f;
    return kb_topo_cube_pos(i / P, C, C == g->cubes_per_sip ? g->mesh_w : 0) * P + i % P;
}

int kb_topo_lanes_flat_pe(int q, const kb_ccl_geom *g, int P, int C)
{
    int order[KB_MAX_CUBES];
    assert(q >= 0 && q < P * C);
    (void)kb_topo_cube_ring(C, C == g->cubes_per_sip ? g->mesh_w : 0, order);
    return order[q / P] * P + q % P;
}

/* hierarchical_lanes: on a world of whole cubes (and whole SIPs beyond one), every PE is wired
 * at every level (E/W ring of its cube, N/S ring of the PEs of its index in the SIP's cubes,
 * global_E/W ring of the PEs at its place in every SIP); the PE 0s' and the SIP leaders' links
 * are hierarchical_3level's, which it is on any other world. */
static int topo_lanes(const char *name, int ws, int rank, const kb_ccl_geom *g,
                      int nbr[KB_NDIRS], kb_errbuf *eb)
{
    int P, C, S;
    if (!kb_topo_lanes_shape(ws, g, &P, &C, &S))
        return topo_hier(name, ws, rank, g, nbr, eb);
    int pe = rank % P, cube = rank / P % C, sip = rank / (P * C);
    int at = sip * P * C + cube * P;
    if (P > 1) {
        nbr[KB_DIR_E] = at + (pe + 1) % P;
        nbr[KB_DIR_W] = at + (pe + P - 1) % P;
    }
    if (C > 1) { /* N: the next cube of the SIP's cube ring, S: the one before */
        int order[KB_MAX_CUBES], k = 0;
        (void)kb_topo_cube_ring(C, C == g->cubes_per_sip ? g->mesh_w : 0, order);
        while (order[k] != cube)
            k++;
        nbr[KB_DIR_N] = sip * P * C + order[(k + 1) % C] * P + pe;
        nbr[KB_DIR_S] = sip * P * C + order[(k + C - 1) % C] * P + pe;
    }
    if (S > 1) {
        nbr[KB_DIR_GLOBAL_E] = ((sip + 1) % S) * P * C + cube * P + pe;
        nbr[KB_DIR_GLOBAL_W] = ((sip + S - 1) % S) * P * C + cube * P + pe;
    }
    return 0;
}

/* full_mesh: peer direction KB_DIR_PEER(k-1) leads to rank r+k (mod ws), k = 1 .. ws-1, so
 * every pair of ranks has a queue; kb_topo_neighbors_n fills them (kb_topo_peer_dirs), the
 * named directions stay unwired */
static int topo_full(const char *name, int ws, int rank, const kb_ccl_geom *g,
                     int nbr[KB_NDIRS], kb_errbuf *eb)
{
    (void)name, (void)ws, (void)rank, (void)g, (void)nbr, (void)eb;
    return 0;
}

/*
 * hypercube: MPI's recursive-doubling wiring for any world size. With P = 2^d the largest
 * power of two <= ws and rem = ws - P, ranks below 2*rem pair up (r even with r+1) on
 * direction d (the fold); the odd ones and the ranks from 2*rem on are the P survivors, v =
 * r/2 or r - rem, and direction k (< d) of a survivor leads to the survivor v ^ 2^k.
 */
static int topo_cube(const char *name, int ws, int rank, const kb_ccl_geom *g,
                     int nbr[KB_NDIRS], kb_errbuf *eb)
{
    int d = kb_topo_hypercube_dims(ws), rem = ws - (1 << d);
    (void)g;
    if (d + (rem > 0) > KB_NDIRS)
        return kb_err_set(eb, KB_ERR_CONFIG, "topology %s: a world of %d needs %d IPCQ "
                          "directions per PE, a PE has %d", name, ws, d + (rem > 0), KB_NDIRS);
    if (rank < 2 * rem)
        nbr[d] = rank ^ 1;
    if (rank < 2 * rem && !(rank & 1))
        return 0;
    int v = rank < 2 * rem ? rank / 2 : rank - rem;
    for (int k = 0; k < d; k++) {
        int p = v ^ (1 << k);
        nbr[k] = p < rem ? 2 * p + 1 : p + rem;
    }
    return 0;
}

/* ---- the double binary tree (kb_ccl.h; its kernel is kb_ccl_dbtree.c) ---- */

/* Node q (1 .. m) of the in-order tree over m positions: parent (0 = q is the root) and
 * children (0 = none), as NCCL's ncclGetBtree without its extra root 0. */
static void inorder(int64_t m, int64_t q, int64_t *up, int64_t ch[2])
{
    int64_t b = q & -q, low = b >> 1;

    *up = (q ^ b) | (b << 1);
    if (*up > m)
        *up = q ^ b;
    ch[0] = low ? q - low : 0;
    ch[1] = 0;
    for (; low; low >>= 1)
        if (q + low <= m) {
            ch[1] = q + low;
            break;
        }
}

/* Rank <-> position of tree t: tree 1 mirrors an even world and shifts an odd one by one. */
static int64_t pos_of(int64_t ws, int t, int64_t r)
{
    return t == 0 ? r : ws % 2 == 0 ? ws - 1 - r : (r - 1 + ws) % ws;
}

static int64_t rank_of(int64_t ws, int t, int64_t p)
{
    return t == 0 ? p : ws % 2 == 0 ? ws - 1 - p : (p + 1) % ws;
}

void kb_ccl_dbtree_node_of(int ws, int tree, int rank, kb_ccl_dbtree_node *out)
{
    int64_t m = ws, q = pos_of(ws, tree, rank) + 1, up, ch[2], pch[2], pup;

    assert(ws >= 1 && (tree == 0 || tree == 1) && rank >= 0 && rank < ws);
    inorder(m, q, &up, ch);
    out->parent = up ? (int)rank_of(ws, tree, up - 1) : -1;
    for (int c = 0; c < 2; c++)
        out->child[c] = ch[c] ? (int)rank_of(ws, tree, ch[c] - 1) : -1;
    out->side = -1;
    if (up) {
        inorder(m, up, &pup, pch);
        out->side = pch[0] == q ? 0 : 1;
    }
    out->depth = 0;
    for (int64_t x = up; x; x = pup) {
        inorder(m, x, &pup, pch);
        out->depth++;
    }
    assert(out->child[1] < 0 || out->child[0] >= 0); /* child 1 only beside a child 0 */
}

kb_dir kb_ccl_dbtree_up_dir(int tree, int side)
{
    static const kb_dir up[2][2] = { { KB_DIR_N, KB_DIR_E },
                                     { KB_DIR_GLOBAL_N, KB_DIR_GLOBAL_E } };
    return up[tree != 0][side != 0];
}

kb_dir kb_ccl_dbtree_down_dir(int tree, int c)
{
    /* the opposites of the up directions: a child on side c hears its parent there */
    static const kb_dir down[2][2] = { { KB_DIR_S, KB_DIR_W },
                                       { KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_W } };
    return down[tree != 0][c != 0];
}

/* double_binary_tree: rank r's parent and children in both trees (kb_ccl_dbtree_node_of),
 * each on its tree's directions */
static int topo_dbtree(const char *name, int ws, int rank, const kb_ccl_geom *g,
                       int nbr[KB_NDIRS], kb_errbuf *eb)
{
    (void)name, (void)g, (void)eb;
    for (int t = 0; t < 2; t++) {
        kb_ccl_dbtree_node nd;
        kb_ccl_dbtree_node_of(ws, t, rank, &nd);
        if (nd.parent >= 0)
            nbr[kb_ccl_dbtree_up_dir(t, nd.side)] = nd.parent;
        for (int c = 0; c < 2; c++)
            if (nd.child[c] >= 0)
                nbr[kb_ccl_dbtree_down_dir(t, c)] = nd.child[c];
    }
    return 0;
}

int kb_topo_hypercube_dims(int ws)
{
    int d = 0;
    while (ws >= (2 << d))
        d++;
    return d;
}

/* The one list of rank topologies: kb_topo_names[i] is built by topo_fns[i]. ccl.yaml's
 * `topology` key takes exactly these names. */
const char *const kb_topo_names[] = {
    "ring_1d", "ring_1d_unidir", "mesh_2d", "torus_2d", "mesh_2d_no_wrap", "tree_binary",
    "hierarchical_3level", "none", "full_mesh", "hypercube", "double_binary_tree",
    "hierarchical_lanes", NULL,
};
static const topo_fn topo_fns[] = {
    topo_ring, topo_ring, topo_mesh_wrap, topo_mesh_wrap, topo_mesh_nowrap, topo_tree,
    topo_hier, topo_none, topo_full, topo_cube, topo_dbtree, topo_lanes,
};
_Static_assert(sizeof topo_fns / sizeof topo_fns[0] ==
                   sizeof kb_topo_names / sizeof kb_topo_names[0] - 1,
               "every topology name has its builder");

int kb_topo_find(const char *name)
{
    for (int i = 0; name && kb_topo_names[i]; i++)
        if (!strcmp(kb_topo_names[i], name))
            return i;
    return -1;
}

int kb_topo_peer_dirs(const char *topo, int ws)
{
    if (topo && !strcmp(topo, "hierarchical_lanes"))
        return KB_TOPO_LANES_PEER_DIRS;
    return topo && !strcmp(topo, "full_mesh") && ws > 1 ? ws - 1 : 0;
}

int kb_topo_ndirs(const char *topo, int ws) { return KB_NDIRS + kb_topo_peer_dirs(topo, ws); }

int kb_topo_neighbors_n(const char *topo, int ws, int rank, const kb_ccl_geom *g, int *nbr,
                        int ndirs, kb_errbuf *eb)
{
    int t = kb_topo_find(topo), np = kb_topo_peer_dirs(topo, ws), rc;
    assert(ndirs >= KB_NDIRS);
    for (int d = 0; d < ndirs; d++)
        nbr[d] = KB_TOPO_NONE;
    if (ws < 1 || rank < 0 || rank >= ws)
        return kb_err_set(eb, KB_ERR_RANGE, "rank %d of a world of %d", rank, ws);
    if (t < 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "unknown topology '%s'", topo);
    if (np > KB_IPCQ_MAX_PEER_DIRS)
        return kb_err_set(eb, KB_ERR_CONFIG, "topology %s: a world of %d needs %d IPCQ peer "
                          "directions per PE, at most %d", topo, ws, np, KB_IPCQ_MAX_PEER_DIRS);
    if (KB_NDIRS + np > ndirs)
        return kb_err_set(eb, KB_ERR_CONFIG, "topology %s: a world of %d needs %d IPCQ "
                          "directions per PE (%d peer directions), this caller has room for %d",
                          topo, ws, KB_NDIRS + np, np, ndirs);
    if ((rc = topo_fns[t](kb_topo_names[t], ws, rank, g, nbr, eb)) != 0)
        return rc;
    if (topo_fns[t] == topo_lanes) {
        /* the ring form's rings again (peer k and peer 7 - k lead to each other's reverse) and,
         * across SIPs, the flat ring over the SIP's PEs (KB_LANES_NEXT / KB_LANES_PREV); on
         * one SIP 8 rings of 4 x 256 KiB slots fill the IPCQ area, as before the flat ring */
        int P, C, S;
        if (kb_topo_lanes_shape(ws, g, &P, &C, &S)) {
            int f = P * C, q = kb_topo_lanes_flat_pos(rank, g, P, C), base = rank - rank % f;
            nbr[KB_LANES_PEER_E] = nbr[KB_DIR_E];
            nbr[KB_LANES_PEER_W] = nbr[KB_DIR_W];
            nbr[KB_LANES_PEER_N] = nbr[KB_DIR_N];
            nbr[KB_LANES_PEER_S] = nbr[KB_DIR_S];
            nbr[KB_LANES_PEER_GE] = nbr[KB_DIR_GLOBAL_E];
            nbr[KB_LANES_PEER_GW] = nbr[KB_DIR_GLOBAL_W];
            if (f > 1 && S > 1) { /* the chain form runs only across SIPs */
                nbr[KB_LANES_NEXT] = base + kb_topo_lanes_flat_pe((q + 1) % f, g, P, C);
                nbr[KB_LANES_PREV] = base + kb_topo_lanes_flat_pe((q + f - 1) % f, g, P, C);
            }
        }
        return 0;
    }
    for (int k = 1; k <= np; k++) /* full_mesh: offset k on peer direction k - 1 */
        nbr[KB_DIR_PEER(k - 1)] = (rank + k) % ws;
    return 0;
}

int kb_topo_neighbors(const char *topo, int ws, int rank, const kb_ccl_geom *g,
                      int nbr[KB_NDIRS], kb_errbuf *eb)
{
    return kb_topo_neighbors_n(topo, ws, rank, g, nbr, KB_NDIRS, eb);
}

int kb_topo_reverse_n(const int *nbr_of_peer, int ndirs, int r, kb_dir d)
{
    int np = ndirs - KB_NDIRS;
    /* peer direction k's opposite is np-1-k (full_mesh: offset o comes back on ws - o) */
    int o = (int)d >= KB_NDIRS ? ((int)d - KB_NDIRS < np ? KB_NDIRS + np - 1 - ((int)d - KB_NDIRS)
                                                          : -1)
                               : kb_dir_opposite(d);
    if (o >= 0 && nbr_of_peer[o] == r)
        return o;
    for (int i = 0; i < ndirs; i++)
        if (nbr_of_peer[i] == r)
            return i;
    return -1;
}

int kb_topo_reverse(const int nbr_of_peer[KB_NDIRS], int r, kb_dir d)
{
    return kb_topo_reverse_n(nbr_of_peer, KB_NDIRS, r, d);
}

int kb_ccl_layout_whole(const kb_machine *m, int ws, kb_ccl_layout *out, kb_errbuf *eb)
{
    int per_sip = m->npes * m->ncubes, total = per_sip * m->nsips;
    if (ws < 1 || ws > total)
        return kb_err_set(eb, KB_ERR_CONFIG,
                          "world size %d does not fit the machine's %d PEs (rank = PE mode)", ws,
                          total);
    out->ws = ws;
    if (ws > per_sip) {
        if (ws % per_sip != 0)
            return kb_err_set(eb, KB_ERR_CONFIG,
                              "world size %d spans SIPs but is not a multiple of %d PEs per SIP",
                              ws, per_sip);
        out->sips = ws / per_sip;
        out->cubes = m->ncubes;
        out->pes = m->npes;
    } else if (ws > m->npes) {
        if (ws % m->npes != 0)
            return kb_err_set(eb, KB_ERR_CONFIG,
                              "world size %d spans cubes but is not a multiple of %d PEs per cube",
                              ws, m->npes);
        out->sips = 1;
        out->cubes = ws / m->npes;
        out->pes = m->npes;
    } else {
        out->sips = 1;
        out->cubes = 1;
        out->pes = ws;
    }
    out->ranks_per_sip = out->cubes * out->pes;
    out->root = 0;
    assert(out->sips * out->ranks_per_sip == ws);
    return 0;
}

int kb_ccl_layout_linear(const kb_machine *m, int ws, kb_ccl_layout *out, kb_errbuf *eb)
{
    int per_sip = m->npes * m->ncubes, total = per_sip * m->nsips;
    if (ws < 1 || ws > total)
        return kb_err_set(eb, KB_ERR_CONFIG,
                          "world size %d does not fit the machine's %d PEs (rank = PE mode)", ws,
                          total);
    out->ws = ws;
    if (ws > per_sip) {
        out->sips = (ws + per_sip - 1) / per_sip;
        out->cubes = m->ncubes;
        out->pes = m->npes;
        out->ranks_per_sip = per_sip;
    } else {
        out->sips = 1;
        out->cubes = (ws + m->npes - 1) / m->npes;
        out->pes = ws < m->npes ? ws : m->npes;
        out->ranks_per_sip = ws;
    }
    out->root = 0;
    assert((out->sips - 1) * out->ranks_per_sip < ws && ws <= out->sips * out->ranks_per_sip);
    return 0;
}

int kb_ccl_layout_sip_ranks(const kb_ccl_layout *l, int s)
{
    int left = l->ws - s * l->ranks_per_sip;
    return left < 0 ? 0 : left < l->ranks_per_sip ? left : l->ranks_per_sip;
}

kb_pe_hw *kb_ccl_rank_pe(const kb_machine *m, const kb_ccl_layout *l, int rank)
{
    assert(rank >= 0 && rank < l->ws);
    int sip = rank / l->ranks_per_sip, local = rank % l->ranks_per_sip;
    return kb_machine_pe(m, (unsigned)sip, (unsigned)(local / l->pes), (unsigned)(local % l->pes));
}

double kb_ccl_topo_bound_gbps(kb_ctx *ctx, const char *topo, const kb_ccl_layout *l)
{
    kb_machine *m = kb_ctx_machine(ctx);
    kb_ccl_geom g = { m->npes, l->cubes, l->root, m->mesh_w };
    kb_res *path[KB_MAX_ROUTE];
    uint64_t best = UINT64_MAX; /* bytes per us of the slowest resource so far */
    int ndirs = kb_topo_ndirs(topo, l->ws);
    int *nbr = malloc((size_t)ndirs * sizeof *nbr);

    for (int r = 0; nbr && r < l->ws; r++) {
        if (kb_topo_neighbors_n(topo, l->ws, r, &g, nbr, ndirs, NULL) != 0) {
            free(nbr);
            return 0.0;
        }
        kb_pe_hw *a = kb_ccl_rank_pe(m, l, r);
        for (int d = 0; d < ndirs; d++) {
            if (nbr[d] == KB_TOPO_NONE)
                continue;
            kb_pe_hw *b = kb_ccl_rank_pe(m, l, nbr[d]);
            int n = kb_machine_route(m, a, kb_pa_pe_scratch(a->gsip, a->cube, a->pe, 0),
                                     kb_pa_pe_ipcq(b->gsip, b->cube, b->pe, 0), path,
                                     KB_MAX_ROUTE, NULL);
            for (int i = 0; i < n; i++)
                if (path[i]->bytes_per_us && path[i]->bytes_per_us < best)
                    best = path[i]->bytes_per_us;
        }
    }
    free(nbr);
    return best == UINT64_MAX ? 0.0 : (double)best / 1000.0;
}

/* Appends one link to *links (growing it); 0 or KB_ERR_NOMEM. */
static int add_link(kb_ipcq_link **links, size_t *n, size_t *cap, kb_ipcq_link lk, kb_errbuf *eb)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        kb_ipcq_link *nl = realloc(*links, c * sizeof *nl);
        if (!nl)
            return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        *links = nl;
        *cap = c;
    }
    assert(*n < *cap);
    (*links)[(*n)++] = lk;
    return 0;
}

/* The lane rings: rank r's KB_DIR_PEER(0) leads to the rank `per` places on (mod ws), its
 * KB_DIR_PEER(1) back; with per = the PEs of a SIP, the same PE of the next and the previous
 * SIP. */
static int lane_links(const kb_machine *m, const kb_ccl_layout *l, int per, kb_ipcq_link **links,
                      size_t *n, size_t *cap, kb_errbuf *eb)
{
    int rc = 0;
    for (int r = 0; r < l->ws && rc == 0; r++) {
        int nx = (r + per) % l->ws, pv = (r + l->ws - per) % l->ws;
        kb_pe_hw *a = kb_ccl_rank_pe(m, l, r);
        if ((rc = add_link(links, n, cap, (kb_ipcq_link){ a, KB_DIR_PEER(0),
                           kb_ccl_rank_pe(m, l, nx), KB_DIR_PEER(1) }, eb)) == 0)
            rc = add_link(links, n, cap, (kb_ipcq_link){ a, KB_DIR_PEER(1),
                          kb_ccl_rank_pe(m, l, pv), KB_DIR_PEER(0) }, eb);
    }
    return rc;
}

int kb_ccl_install(kb_ctx *ctx, const char *topo, const kb_ccl_layout *l, const kb_ipcq_cfg *cfg)
{
    return kb_ccl_install_lanes(ctx, topo, l, cfg, 0);
}

int kb_ccl_install_lanes(kb_ctx *ctx, const char *topo, const kb_ccl_layout *l,
                         const kb_ipcq_cfg *cfg, int per)
{
    kb_errbuf *eb = kb_ctx_err(ctx);
    kb_machine *m = kb_ctx_machine(ctx);
    kb_ccl_geom g = { m->npes, l->cubes, l->root, m->mesh_w };
    kb_ipcq_link *links = NULL;
    size_t n = 0, cap = 0;
    int ndirs = kb_topo_ndirs(topo, l->ws), np = ndirs - KB_NDIRS;
    int *nbr = malloc(2 * (size_t)ndirs * sizeof *nbr), *pnbr = nbr ? nbr + ndirs : NULL;
    char lbl[KB_DIR_LABEL_LEN];
    int rc = 0;

    if (!nbr) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* a full mesh's rings must fit every PE's ring area: say so before building ws^2 links */
    if (np > 0 && (rc = kb_ipcq_check_fit(ctx, cfg, kb_ccl_rank_pe(m, l, 0), np)) != 0)
        goto out;
    for (int r = 0; r < l->ws; r++) {
        if ((rc = kb_topo_neighbors_n(topo, l->ws, r, &g, nbr, ndirs, eb)) != 0)
            goto out;
        for (int d = 0; d < ndirs; d++) {
            if (nbr[d] == KB_TOPO_NONE)
                continue;
            assert(nbr[d] >= 0 && nbr[d] < l->ws);
            if ((rc = kb_topo_neighbors_n(topo, l->ws, nbr[d], &g, pnbr, ndirs, eb)) != 0)
                goto out;
            int rd = kb_topo_reverse_n(pnbr, ndirs, r, (kb_dir)d);
            if (rd < 0) {
                rc = kb_err_set(eb, KB_ERR_CONFIG, "topology %s: rank %d's %s points at rank %d, "
                                "which has no direction back", topo, r,
                                kb_dir_label((kb_dir)d, lbl, sizeof lbl), nbr[d]);
                goto out;
            }
            if ((rc = add_link(&links, &n, &cap, (kb_ipcq_link){ kb_ccl_rank_pe(m, l, r),
                               (kb_dir)d, kb_ccl_rank_pe(m, l, nbr[d]), (kb_dir)rd }, eb)) != 0)
                goto out;
        }
    }
    assert(per == 0 || np == 0); /* the lane rings take the first peer directions */
    if (per > 0 && l->ws / per >= 2 && (rc = lane_links(m, l, per, &links, &n, &cap, eb)) != 0)
        goto out;
    rc = kb_ipcq_install(ctx, cfg, links, n);
out:
    free(links);
    free(nbr);
    return rc;
}

int kb_ccl_rank(kb_tl *tl)
{
    return (tl_program_id(tl, 2) * tl_num_programs(tl, 1) + tl_program_id(tl, 1)) *
               tl_num_programs(tl, 0) + tl_program_id(tl, 0);
}

kb_va kb_ccl_my_tile(kb_tl *tl, const kb_kargs *a)
{
    int local = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    return a->ptr[KB_CCL_PTR_TILE] +
           (kb_va)local * (kb_va)a->i[KB_CCL_ARG_N] *
               (kb_va)kb_dtype_size((kb_dtype)a->i[KB_CCL_ARG_DTYPE]);
}

int64_t kb_ccl_slice_elems(uint64_t slot, int64_t window, int64_t chunk, size_t es)
{
    int64_t W = (int64_t)(slot / es), floor = (int64_t)(KB_CCL_MIN_SLICE_BYTES / es);
    if (window > 1 && chunk < window * W) {
        int64_t w = (chunk + window - 1) / window;
        w = w > floor ? w : floor;
        W = w < W ? w : W;
    }
    return W > 0 ? W : 1;
}

int64_t kb_ccl_stream_block(kb_tl *tl, int64_t n, uint32_t msg_esz)
{
    uint64_t slot = kb_ipcq_slot_size(tl_ctx(tl));
    int64_t S = (int64_t)(slot / 4u), cap = (int64_t)(KB_CCL_STREAM_BYTES / 4u);

    if ((uint64_t)n * msg_esz <= slot && (uint64_t)n * 4u <= KB_CCL_STREAM_BYTES)
        return 0;
    /* whole f32 slices up to the budget; a slot larger than the budget: the budget */
    return S >= 1 && S <= cap ? cap / S * S : cap;
}

void kb_ccl_run_tile(kb_tl *tl, const kb_kargs *a, kb_va va, int64_t n, kb_dtype dt,
                     uint32_t msg_esz, kb_ccl_tile_fn f)
{
    int64_t blk = kb_ccl_stream_block(tl, n, msg_esz), off, len;

    if (!blk) {
        f(tl, a, va, n);
        return;
    }
    for (int64_t j = 0; (len = kb_ccl_piece(n, blk, j, &off)) != 0; j++)
        f(tl, a, kb_ccl_elem_va(va, off, dt), len);
}

kb_val kb_ccl_ring_allreduce_val(kb_tl *tl, kb_val acc, int64_t k, int64_t i, kb_dir out,
                                 kb_dir in, kb_va va, kb_dtype dt)
{
    int64_t n = acc.cols;
    uint32_t off, len;

    assert(k >= 2 && acc.rows == 1);
    assert(i >= 0 && i < k); /* the member's own value goes to v[i] */
    if (k <= KB_CCL_GATHER_SUM_MAX && (uint64_t)k * (uint64_t)n * 4u <= kb_ipcq_slot_size(tl_ctx(tl))) {
        /* small: forward the members' values round the ring (k - 1 steps, the latency of the
         * plain ring), keep them, and sum them in member order 0, 1, ... k - 1 */
        kb_val v[KB_CCL_GATHER_SUM_MAX], cur = acc, sum;
        v[i] = acc;
        for (int64_t s = 0; s + 1 < k; s++) {
            cur = kb_ccl_sendrecv(tl, out, cur, (kb_val){ 0 }, in, KB_SHAPE1(n), KB_F32);
            v[((i - 1 - s) % k + k) % k] = cur;
        }
        sum = tl_add(tl, v[0], v[1]);
        for (int64_t m = 2; m < k; m++) {
            kb_val t = tl_add(tl, sum, v[m]);
            tl_free(tl, sum);
            sum = t;
        }
        for (int64_t m = 0; m < k; m++)
            tl_free(tl, v[m]);
        (void)va;
        (void)dt;
        return sum;
    }
    /* reduce-scatter: step s sends chunk i - s and receives chunk i - s - 1 */
    kb_ccl_chunk(n, k, i, &off, &len);
    kb_val part = kb_val_slice(acc, off, len);
    for (int64_t s = 0; s + 1 < k; s++) {
        int64_t rc = ((i - s - 1) % k + k) % k;
        uint32_t slen = len;
        kb_val sent = part, got;
        kb_ccl_chunk(n, k, rc, &off, &len);
        if (slen && len) {
            got = kb_ccl_sendrecv(tl, out, sent, sent, in, KB_SHAPE1(len), KB_F32);
        } else {
            if (slen)
                tl_send(tl, out, sent);
            if (sent.scratch)
                tl_free(tl, sent);
            part = kb_val_slice(acc, off, 0);
            if (!len)
                continue;
            got = tl_recv(tl, in, KB_SHAPE1(len), KB_F32);
        }
        part = tl_add(tl, kb_val_slice(acc, off, len), got);
        tl_free(tl, got);
    }
    /* chunk i + 1 is complete: store it, then gather the others into the tile */
    kb_ccl_chunk(n, k, (i + 1) % k, &off, &len);
    assert(part.cols == len);
    if (len)
        tl_store(tl, kb_ccl_elem_va(va, off, dt), part);
    if (part.scratch)
        tl_free(tl, part);
    for (int64_t s = 0; s + 1 < k; s++) {
        uint32_t soff, slen;
        kb_ccl_chunk(n, k, ((i + 1 - s) % k + k) % k, &soff, &slen);
        kb_ccl_chunk(n, k, ((i - s) % k + k) % k, &off, &len);
        kb_val v = slen ? tl_ref(tl, kb_ccl_elem_va(va, soff, dt), KB_SHAPE1(slen), dt)
                        : (kb_val){ 0 };
        if (slen && len)
            kb_ccl_sendrecv_into(tl, out, v, in, kb_ccl_elem_va(va, off, dt), KB_SHAPE1(len), dt);
        else if (slen)
            tl_send(tl, out, v);
        else if (len)
            tl_recv_into(tl, in, kb_ccl_elem_va(va, off, dt), KB_SHAPE1(len), dt);
    }
    tl_free(tl, acc);
    kb_val tot = tl_load(tl, va, KB_SHAPE1(n), dt);
    if (dt == KB_F32)
        return tot;
    kb_val t32 = tl_scale(tl, tot, 1.0f, 0.0f);
    tl_free(tl, tot);
    return t32;
}
