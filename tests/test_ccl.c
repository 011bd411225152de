/*
 * test_ccl — the collective library: topology tables and reverse pairing (every topology,
 * with explicit neighbour lists and a generic "every link has a way back" check), the legacy
 * rank = PE layout on the default machine (2 SIPs x 16 cubes x 8 PEs), the verification
 * machinery (collective kinds and busbw factors, host references, the seeded inputs, and a
 * comparison that rejects an element out of place), and every registered algorithm run through
 * the mock runtime on seeded position-dependent data at several world sizes, compared bit for
 * bit with its host reference rounded once to f16 (the inputs keep every f32 partial sum
 * exact) and, independently, with a sum computed here. Limits: the mock runtime reports no
 * time, so nothing here checks timing (test_ipcq checks the protocol's ordering).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_ccl.h"
#include "kb_ccl_reg.h"
#include "kb_dtype.h"
#include "kb_ipcq.h"
#include "kb_runtime.h"
#include "kb_test_util.h"

#define NONE KB_TOPO_NONE

/* ---- topologies ---- */

/* Direction tables here have room for the peer directions of a full mesh of 257 ranks. */
#define TMAX (KB_NDIRS + 256)

static void nbrs(const char *topo, int ws, int rank, const kb_ccl_geom *g, int out[TMAX])
{
    kb_errbuf eb;
    int rc = kb_topo_neighbors_n(topo, ws, rank, g, out, TMAX, &eb);
    if (rc != 0)
        fail_msg("%s ws=%d rank=%d: %d %s", topo, ws, rank, rc, eb.msg);
}

/* Asserts rank's table is exactly {dir: peer} for the listed pairs and NONE elsewhere. */
static void expect_nbrs(const char *topo, int ws, int rank, const kb_ccl_geom *g, int npairs,
                        ...)
{
    int want[TMAX], got[TMAX];
    char lbl[KB_DIR_LABEL_LEN];
    va_list ap;
    for (int d = 0; d < TMAX; d++)
        want[d] = NONE;
    va_start(ap, npairs);
    for (int i = 0; i < npairs; i++) {
        int d = va_arg(ap, int);
        want[d] = va_arg(ap, int);
    }
    va_end(ap);
    nbrs(topo, ws, rank, g, got);
    for (int d = 0; d < TMAX; d++)
        if (got[d] != want[d])
            fail_msg("%s ws=%d rank %d %s: got %d, expected %d", topo, ws, rank,
                     kb_dir_label((kb_dir)d, lbl, sizeof lbl), got[d], want[d]);
}

static int reverse_of(const char *topo, int ws, int r, kb_dir d, const kb_ccl_geom *g)
{
    int t[TMAX], p[TMAX];
    nbrs(topo, ws, r, g, t);
    assert_int_not_equal(t[d], NONE);
    nbrs(topo, ws, t[d], g, p);
    return kb_topo_reverse_n(p, kb_topo_ndirs(topo, ws), r, d);
}

/* Every link of every rank has a reverse direction at the peer that points back. */
static void check_all_links_reverse(const char *topo, int ws, const kb_ccl_geom *g)
{
    int t[TMAX], p[TMAX], nd = kb_topo_ndirs(topo, ws);
    char lbl[KB_DIR_LABEL_LEN];
    assert_true(nd <= TMAX);
    for (int r = 0; r < ws; r++) {
        nbrs(topo, ws, r, g, t);
        for (int d = nd; d < TMAX; d++) /* nothing past the topology's directions */
            assert_int_equal(t[d], NONE);
        for (int d = 0; d < nd; d++) {
            if (t[d] == NONE)
                continue;
            assert_true(t[d] >= 0 && t[d] < ws);
            nbrs(topo, ws, t[d], g, p);
            int rd = kb_topo_reverse_n(p, nd, r, (kb_dir)d);
            if (rd < 0 || p[rd] != r)
                fail_msg("%s ws=%d: rank %d %s -> %d has no way back", topo, ws, r,
                         kb_dir_label((kb_dir)d, lbl, sizeof lbl), t[d]);
            /* the preferred opposite is taken whenever it points back (peer direction k's
             * is peer direction np-1-k) */
            int o = d < KB_NDIRS ? kb_dir_opposite((kb_dir)d) : nd - 1 - (d - KB_NDIRS);
            if (o >= 0 && p[o] == r)
                assert_int_equal(rd, o);
        }
    }
}

static void test_topo_ring(void **state)
{
    (void)state;
    /* ring of 2: E and W both lead to the other rank; the reverse keeps them apart */
    expect_nbrs("ring_1d", 2, 0, NULL, 2, KB_DIR_E, 1, KB_DIR_W, 1);
    expect_nbrs("ring_1d", 2, 1, NULL, 2, KB_DIR_E, 0, KB_DIR_W, 0);
    assert_int_equal(reverse_of("ring_1d", 2, 0, KB_DIR_E, NULL), KB_DIR_W);
    assert_int_equal(reverse_of("ring_1d", 2, 0, KB_DIR_W, NULL), KB_DIR_E);
    assert_int_equal(reverse_of("ring_1d", 2, 1, KB_DIR_E, NULL), KB_DIR_W);
    /* ring of 4 */
    expect_nbrs("ring_1d", 4, 0, NULL, 2, KB_DIR_E, 1, KB_DIR_W, 3);
    expect_nbrs("ring_1d", 4, 3, NULL, 2, KB_DIR_E, 0, KB_DIR_W, 2);
    assert_int_equal(reverse_of("ring_1d", 4, 3, KB_DIR_E, NULL), KB_DIR_W);
    /* unidirectional ring: same links (the receiving side of each is W) */
    expect_nbrs("ring_1d_unidir", 5, 0, NULL, 2, KB_DIR_E, 1, KB_DIR_W, 4);
    expect_nbrs("ring_1d_unidir", 5, 4, NULL, 2, KB_DIR_E, 0, KB_DIR_W, 3);
    /* a world of one has no links */
    expect_nbrs("ring_1d", 1, 0, NULL, 0);
    expect_nbrs("none", 4, 2, NULL, 0);
    for (int ws = 2; ws <= 9; ws++) {
        check_all_links_reverse("ring_1d", ws, NULL);
        check_all_links_reverse("ring_1d_unidir", ws, NULL);
    }
}

static void test_topo_mesh(void **state)
{
    int a[TMAX], b[TMAX];
    kb_errbuf eb;
    (void)state;
    /* 2 x 2: E and W lead to the same peer, and N and S likewise */
    expect_nbrs("mesh_2d", 4, 0, NULL, 4, KB_DIR_E, 1, KB_DIR_W, 1, KB_DIR_N, 2, KB_DIR_S, 2);
    expect_nbrs("mesh_2d", 4, 3, NULL, 4, KB_DIR_E, 2, KB_DIR_W, 2, KB_DIR_N, 1, KB_DIR_S, 1);
    assert_int_equal(reverse_of("mesh_2d", 4, 0, KB_DIR_E, NULL), KB_DIR_W);
    assert_int_equal(reverse_of("mesh_2d", 4, 0, KB_DIR_W, NULL), KB_DIR_E);
    assert_int_equal(reverse_of("mesh_2d", 4, 0, KB_DIR_N, NULL), KB_DIR_S);
    assert_int_equal(reverse_of("mesh_2d", 4, 0, KB_DIR_S, NULL), KB_DIR_N);
    /* 3 x 3 wraps (row-major, N = row above) */
    expect_nbrs("mesh_2d", 9, 0, NULL, 4, KB_DIR_E, 1, KB_DIR_W, 2, KB_DIR_N, 6, KB_DIR_S, 3);
    expect_nbrs("mesh_2d", 9, 4, NULL, 4, KB_DIR_E, 5, KB_DIR_W, 3, KB_DIR_N, 1, KB_DIR_S, 7);
    expect_nbrs("mesh_2d", 9, 8, NULL, 4, KB_DIR_E, 6, KB_DIR_W, 7, KB_DIR_N, 5, KB_DIR_S, 2);
    /* no wrap: corners have 2 neighbours, edges 3, the centre 4 */
    expect_nbrs("mesh_2d_no_wrap", 9, 0, NULL, 2, KB_DIR_E, 1, KB_DIR_S, 3);
    expect_nbrs("mesh_2d_no_wrap", 9, 2, NULL, 2, KB_DIR_W, 1, KB_DIR_S, 5);
    expect_nbrs("mesh_2d_no_wrap", 9, 6, NULL, 2, KB_DIR_E, 7, KB_DIR_N, 3);
    expect_nbrs("mesh_2d_no_wrap", 9, 8, NULL, 2, KB_DIR_W, 7, KB_DIR_N, 5);
    expect_nbrs("mesh_2d_no_wrap", 9, 1, NULL, 3, KB_DIR_E, 2, KB_DIR_W, 0, KB_DIR_S, 4);
    expect_nbrs("mesh_2d_no_wrap", 9, 4, NULL, 4, KB_DIR_E, 5, KB_DIR_W, 3, KB_DIR_N, 1,
                KB_DIR_S, 7);
    expect_nbrs("mesh_2d", 1, 0, NULL, 0);
    /* torus_2d is an alias of mesh_2d */
    static const int squares[] = { 1, 4, 9, 16, 25 };
    for (size_t si = 0; si < sizeof squares / sizeof squares[0]; si++) {
        int ws = squares[si];
        for (int r = 0; r < ws; r++) {
            nbrs("mesh_2d", ws, r, NULL, a);
            nbrs("torus_2d", ws, r, NULL, b);
            assert_memory_equal(a, b, sizeof a);
        }
        check_all_links_reverse("mesh_2d", ws, NULL);
        check_all_links_reverse("torus_2d", ws, NULL);
        check_all_links_reverse("mesh_2d_no_wrap", ws, NULL);
    }
    /* errors */
    assert_int_equal(kb_topo_neighbors("mesh_2d", 6, 0, NULL, a, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "square world size, got 6"));
    assert_int_equal(kb_topo_neighbors("mesh_2d_no_wrap", 8, 0, NULL, a, &eb), KB_ERR_CONFIG);
    assert_int_equal(kb_topo_neighbors("torus_2d", 2, 0, NULL, a, &eb), KB_ERR_CONFIG);
    for (int d = 0; d < KB_NDIRS; d++)
        assert_int_equal(a[d], NONE);
}

static void test_topo_tree(void **state)
{
    (void)state;
    expect_nbrs("tree_binary", 7, 0, NULL, 2, KB_DIR_CHILD_LEFT, 1, KB_DIR_CHILD_RIGHT, 2);
    expect_nbrs("tree_binary", 7, 1, NULL, 3, KB_DIR_PARENT, 0, KB_DIR_CHILD_LEFT, 3,
                KB_DIR_CHILD_RIGHT, 4);
    expect_nbrs("tree_binary", 7, 2, NULL, 3, KB_DIR_PARENT, 0, KB_DIR_CHILD_LEFT, 5,
                KB_DIR_CHILD_RIGHT, 6);
    for (int leaf = 3; leaf < 7; leaf++)
        expect_nbrs("tree_binary", 7, leaf, NULL, 1, KB_DIR_PARENT, (leaf - 1) / 2);
    /* a parent with one child */
    expect_nbrs("tree_binary", 6, 2, NULL, 2, KB_DIR_PARENT, 0, KB_DIR_CHILD_LEFT, 5);
    expect_nbrs("tree_binary", 1, 0, NULL, 0);
    /* reverse: a child link comes back as parent; parent links as the matching child */
    assert_int_equal(reverse_of("tree_binary", 7, 1, KB_DIR_CHILD_LEFT, NULL), KB_DIR_PARENT);
    assert_int_equal(reverse_of("tree_binary", 7, 1, KB_DIR_CHILD_RIGHT, NULL), KB_DIR_PARENT);
    assert_int_equal(reverse_of("tree_binary", 7, 3, KB_DIR_PARENT, NULL), KB_DIR_CHILD_LEFT);
    assert_int_equal(reverse_of("tree_binary", 7, 4, KB_DIR_PARENT, NULL), KB_DIR_CHILD_RIGHT);
    assert_int_equal(reverse_of("tree_binary", 7, 2, KB_DIR_PARENT, NULL), KB_DIR_CHILD_RIGHT);
    for (int ws = 1; ws <= 16; ws++)
        check_all_links_reverse("tree_binary", ws, NULL);
    /* hanging from root 5 of 7: heap order over r - 5 mod 7 */
    kb_ccl_geom g5 = { 8, 1, 5, 0 };
    expect_nbrs("tree_binary", 7, 5, &g5, 2, KB_DIR_CHILD_LEFT, 6, KB_DIR_CHILD_RIGHT, 0);
    expect_nbrs("tree_binary", 7, 6, &g5, 3, KB_DIR_PARENT, 5, KB_DIR_CHILD_LEFT, 1,
                KB_DIR_CHILD_RIGHT, 2);
    expect_nbrs("tree_binary", 7, 4, &g5, 1, KB_DIR_PARENT, 0);
    for (int ws = 1; ws <= 16; ws++) {
        kb_ccl_geom gr = { 8, 1, ws - 1, 0 };
        check_all_links_reverse("tree_binary", ws, &gr);
    }
}

static void test_topo_full_mesh(void **state)
{
    int t[TMAX];
    kb_errbuf eb;
    (void)state;
    /* peer direction k-1 leads to r+k; the named directions stay unwired */
    expect_nbrs("full_mesh", 4, 1, NULL, 3, KB_DIR_PEER(0), 2, KB_DIR_PEER(1), 3,
                KB_DIR_PEER(2), 0);
    expect_nbrs("full_mesh", 2, 1, NULL, 1, KB_DIR_PEER(0), 0);
    expect_nbrs("full_mesh", 1, 0, NULL, 0);
    assert_int_equal(kb_topo_peer_dirs("full_mesh", 256), 255);
    assert_int_equal(kb_topo_ndirs("full_mesh", 256), KB_NDIRS + 255);
    assert_int_equal(kb_topo_peer_dirs("full_mesh", 1), 0);
    assert_int_equal(kb_topo_peer_dirs("ring_1d", 256), 0);
    /* 256 ranks: rank 7's peer direction k leads to 7 + k + 1 mod 256 */
    nbrs("full_mesh", 256, 7, NULL, t);
    assert_int_equal(t[KB_DIR_PEER(0)], 8);
    assert_int_equal(t[KB_DIR_PEER(247)], 255);
    assert_int_equal(t[KB_DIR_PEER(248)], 0);
    assert_int_equal(t[KB_DIR_PEER(254)], 6);
    assert_int_equal(t[KB_DIR_PEER(255)], NONE);
    /* the reverse of r -> r+k (peer direction k-1) is the peer's peer direction ws-k-1 */
    assert_int_equal(reverse_of("full_mesh", 4, 1, KB_DIR_PEER(0), NULL), KB_DIR_PEER(2));
    assert_int_equal(reverse_of("full_mesh", 4, 1, KB_DIR_PEER(1), NULL), KB_DIR_PEER(1));
    assert_int_equal(reverse_of("full_mesh", 256, 3, KB_DIR_PEER(9), NULL), KB_DIR_PEER(245));
    for (int ws = 1; ws <= 17; ws++)
        check_all_links_reverse("full_mesh", ws, NULL);
    check_all_links_reverse("full_mesh", 64, NULL);
    /* a table of the named directions only has no room for peer directions */
    assert_int_equal(kb_topo_neighbors("full_mesh", 4, 0, NULL, t, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "a world of 4 needs 14 IPCQ directions per PE (3 peer "
                           "directions), this caller has room for 11"));
    assert_int_equal(kb_topo_neighbors("full_mesh", 1, 0, NULL, t, &eb), 0);
}

static void test_topo_hypercube(void **state)
{
    (void)state;
    assert_int_equal(kb_topo_hypercube_dims(1), 0);
    assert_int_equal(kb_topo_hypercube_dims(7), 2);
    assert_int_equal(kb_topo_hypercube_dims(8), 3);
    assert_int_equal(kb_topo_hypercube_dims(256), 8);
    /* 8: a 3-cube, direction k to r ^ 2^k */
    expect_nbrs("hypercube", 8, 5, NULL, 3, KB_DIR_E, 4, KB_DIR_W, 7, KB_DIR_N, 1);
    /* 6 = 4 + 2: ranks 0-3 fold in pairs on direction 2; survivors 1, 3, 4, 5 are v 0..3 */
    expect_nbrs("hypercube", 6, 0, NULL, 1, KB_DIR_N, 1);
    expect_nbrs("hypercube", 6, 1, NULL, 3, KB_DIR_E, 3, KB_DIR_W, 4, KB_DIR_N, 0);
    expect_nbrs("hypercube", 6, 5, NULL, 2, KB_DIR_E, 4, KB_DIR_W, 3);
    for (int ws = 1; ws <= 70; ws++)
        check_all_links_reverse("hypercube", ws, NULL);
}

static void test_topo_hierarchical(void **state)
{
    kb_ccl_geom g = { 8, 16, 0, 0 };
    int t[TMAX];
    kb_errbuf eb;
    (void)state;
    /* ws 256 = 2 SIPs x 16 cubes x 8 PEs */
    expect_nbrs("hierarchical_3level", 256, 0, &g, 6, KB_DIR_E, 1, KB_DIR_W, 7, KB_DIR_N, 8,
                KB_DIR_S, 120, KB_DIR_GLOBAL_E, 128, KB_DIR_GLOBAL_W, 128);
    expect_nbrs("hierarchical_3level", 256, 1, &g, 2, KB_DIR_E, 2, KB_DIR_W, 0);
    expect_nbrs("hierarchical_3level", 256, 8, &g, 4, KB_DIR_E, 9, KB_DIR_W, 15, KB_DIR_N, 16,
                KB_DIR_S, 0);
    expect_nbrs("hierarchical_3level", 256, 128, &g, 6, KB_DIR_E, 129, KB_DIR_W, 135, KB_DIR_N,
                136, KB_DIR_S, 248, KB_DIR_GLOBAL_E, 0, KB_DIR_GLOBAL_W, 0);
    expect_nbrs("hierarchical_3level", 256, 255, &g, 2, KB_DIR_E, 248, KB_DIR_W, 254);
    expect_nbrs("hierarchical_3level", 256, 120, &g, 4, KB_DIR_E, 121, KB_DIR_W, 127, KB_DIR_N,
                0, KB_DIR_S, 112);
    assert_int_equal(reverse_of("hierarchical_3level", 256, 0, KB_DIR_GLOBAL_E, &g),
                     KB_DIR_GLOBAL_W);
    assert_int_equal(reverse_of("hierarchical_3level", 256, 128, KB_DIR_GLOBAL_W, &g),
                     KB_DIR_GLOBAL_E);
    assert_int_equal(reverse_of("hierarchical_3level", 256, 0, KB_DIR_N, &g), KB_DIR_S);
    /* one SIP of 2 cubes: N and S both lead to the other cube's PE 0 */
    expect_nbrs("hierarchical_3level", 16, 0, &g, 4, KB_DIR_E, 1, KB_DIR_W, 7, KB_DIR_N, 8,
                KB_DIR_S, 8);
    /* one cube: only the E/W ring */
    expect_nbrs("hierarchical_3level", 8, 0, &g, 2, KB_DIR_E, 1, KB_DIR_W, 7);
    check_all_links_reverse("hierarchical_3level", 256, &g);
    check_all_links_reverse("hierarchical_3level", 16, &g);
    check_all_links_reverse("hierarchical_3level", 64, &g);
    /* partial cubes and SIPs (ranks fill PEs in linear order): each chain links the ranks it
     * has. 12 ranks: cube 1 holds 8..11; 3 ranks: one chain of 3; 130 ranks: SIP 1 holds
     * 128 and 129, one cube, and the SIP ring has two leaders, 0 and 128. */
    expect_nbrs("hierarchical_3level", 12, 8, &g, 4, KB_DIR_E, 9, KB_DIR_W, 11, KB_DIR_N, 0,
                KB_DIR_S, 0);
    expect_nbrs("hierarchical_3level", 12, 11, &g, 2, KB_DIR_E, 8, KB_DIR_W, 10);
    expect_nbrs("hierarchical_3level", 3, 0, &g, 2, KB_DIR_E, 1, KB_DIR_W, 2);
    expect_nbrs("hierarchical_3level", 130, 128, &g, 4, KB_DIR_E, 129, KB_DIR_W, 129,
                KB_DIR_GLOBAL_E, 0, KB_DIR_GLOBAL_W, 0);
    expect_nbrs("hierarchical_3level", 130, 120, &g, 4, KB_DIR_E, 121, KB_DIR_W, 127, KB_DIR_N,
                0, KB_DIR_S, 112);
    expect_nbrs("hierarchical_3level", 1, 0, &g, 0);
    check_all_links_reverse("hierarchical_3level", 3, &g);
    check_all_links_reverse("hierarchical_3level", 12, &g);
    check_all_links_reverse("hierarchical_3level", 130, &g);
    check_all_links_reverse("hierarchical_3level", 193, &g);
    (void)t, (void)eb;
}

/* The double binary tree: explicit tables at ws 4, then for every ws up to 300 both trees
 * are trees (one root; parents and children agree; depth = parent's + 1, at most
 * floor(log2 ws)), every rank is interior in at most one tree and a leaf in at least one, and
 * every link pairs up with its opposite direction. */
static void test_topo_dbtree(void **state)
{
    (void)state;
    /* tree 0: 3 -> 1 -> {0, 2}; tree 1 (mirror): 0 -> 2 -> {3, 1} */
    expect_nbrs("double_binary_tree", 4, 1, NULL, 4, KB_DIR_N, 3, KB_DIR_S, 0, KB_DIR_W, 2,
                KB_DIR_GLOBAL_E, 2);
    expect_nbrs("double_binary_tree", 4, 2, NULL, 4, KB_DIR_E, 1, KB_DIR_GLOBAL_N, 0,
                KB_DIR_GLOBAL_S, 3, KB_DIR_GLOBAL_W, 1);
    expect_nbrs("double_binary_tree", 4, 3, NULL, 2, KB_DIR_S, 1, KB_DIR_GLOBAL_N, 2);
    /* odd: tree 1 is tree 0 shifted by one rank (3: tree 0 1 -> {0, 2}, tree 1 2 -> {1, 0}) */
    expect_nbrs("double_binary_tree", 3, 0, NULL, 2, KB_DIR_N, 1, KB_DIR_GLOBAL_E, 2);
    expect_nbrs("double_binary_tree", 3, 2, NULL, 3, KB_DIR_E, 1, KB_DIR_GLOBAL_S, 1,
                KB_DIR_GLOBAL_W, 0);
    expect_nbrs("double_binary_tree", 1, 0, NULL, 0);
    /* a pair linked in both trees pairs each link with its opposite */
    assert_int_equal(reverse_of("double_binary_tree", 4, 1, KB_DIR_W, NULL), KB_DIR_E);
    assert_int_equal(reverse_of("double_binary_tree", 4, 1, KB_DIR_GLOBAL_E, NULL),
                     KB_DIR_GLOBAL_W);
    for (int ws = 1; ws <= 300; ws++) {
        int logws = 0;
        while ((2 << logws) <= ws)
            logws++;
        for (int r = 0; r < ws; r++) {
            int interior = 0, t[TMAX], wired = 0;
            for (int tree = 0; tree < 2; tree++) {
                kb_ccl_dbtree_node nd, pn, cn;
                kb_ccl_dbtree_node_of(ws, tree, r, &nd);
                assert_true(nd.depth >= 0 && nd.depth <= logws);
                if (nd.parent < 0) {
                    assert_int_equal(nd.depth, 0);
                    assert_int_equal(nd.side, -1);
                } else {
                    assert_true(nd.parent < ws && nd.parent != r);
                    assert_true(nd.side == 0 || nd.side == 1);
                    kb_ccl_dbtree_node_of(ws, tree, nd.parent, &pn);
                    assert_int_equal(pn.child[nd.side], r);
                    assert_int_equal(nd.depth, pn.depth + 1);
                }
                if (nd.child[1] >= 0)
                    assert_true(nd.child[0] >= 0);
                for (int c = 0; c < 2; c++) {
                    if (nd.child[c] < 0)
                        continue;
                    kb_ccl_dbtree_node_of(ws, tree, nd.child[c], &cn);
                    assert_int_equal(cn.parent, r);
                    assert_int_equal(cn.side, c);
                }
                interior += nd.child[0] >= 0;
                /* tree 0 is in order: the odd ranks are its interior */
                if (tree == 0 && ws > 1)
                    assert_int_equal(nd.child[0] >= 0, r % 2 == 1);
            }
            assert_true(interior <= 1);
            nbrs("double_binary_tree", ws, r, NULL, t);
            for (int d = 0; d < KB_NDIRS; d++)
                wired += t[d] != NONE;
            assert_true(wired <= 6);
        }
        /* one root per tree: the ranks' depths sum to a tree's */
        for (int tree = 0; tree < 2; tree++) {
            int roots = 0;
            for (int r = 0; r < ws; r++) {
                kb_ccl_dbtree_node nd;
                kb_ccl_dbtree_node_of(ws, tree, r, &nd);
                roots += nd.parent < 0;
            }
            assert_int_equal(roots, 1);
        }
        check_all_links_reverse("double_binary_tree", ws, NULL);
    }
}

/* Each step of a cube ring one UCIe hop (|dx| + |dy| = 1 in a w-wide mesh), the wrap too. */
static void check_cube_cycle(const int *order, int C, int w)
{
    int seen[KB_MAX_CUBES] = { 0 };
    for (int k = 0; k < C; k++) {
        int a = order[k], b = order[(k + 1) % C];
        assert_true(a >= 0 && a < C && !seen[a]);
        seen[a] = 1;
        int d = abs(a % w - b % w) + abs(a / w - b / w);
        if (d != 1)
            fail_msg("cube ring %d wide: step %d goes %d -> %d (%d hops)", w, k, a, b, d);
    }
}

static void test_topo_lanes(void **state)
{
    static const int want16[16] = { 0, 1, 2, 3, 7, 6, 5, 9, 10, 11, 15, 14, 13, 12, 8, 4 };
    static const int want6[6] = { 0, 2, 4, 5, 3, 1 }; /* 2 wide, 3 tall: walked transposed */
    int order[KB_MAX_CUBES];
    kb_ccl_geom g = { 8, 16, 0, 4 };
    (void)state;
    assert_int_equal(kb_topo_cube_ring(16, 4, order), 16);
    assert_memory_equal(order, want16, sizeof want16);
    check_cube_cycle(order, 16, 4);
    assert_int_equal(kb_topo_cube_ring(6, 2, order), 6);
    assert_memory_equal(order, want6, sizeof want6);
    check_cube_cycle(order, 6, 2);
    kb_topo_cube_ring(8, 4, order); /* a 4 x 2 part of the mesh */
    check_cube_cycle(order, 8, 4);
    kb_topo_cube_ring(32, 8, order);
    check_cube_cycle(order, 32, 8);
    kb_topo_cube_ring(9, 3, order); /* odd x odd: no such cycle, index order */
    for (int c = 0; c < 9; c++)
        assert_int_equal(order[c], c);
    kb_topo_cube_ring(5, 0, order); /* unknown width: index order */
    assert_int_equal(order[4], 4);
    assert_int_equal(kb_topo_cube_pos(9, 16, 4), 7);
    assert_int_equal(kb_topo_cube_pos(4, 16, 4), 15);
    /* ws 256 = 2 SIPs x 16 cubes x 8 PEs: every PE at every level, the ring form's rings
     * twice, and the flat ring over the SIP's PEs (cube ring order, then PE index) */
    assert_int_equal(kb_topo_peer_dirs("hierarchical_lanes", 256), KB_TOPO_LANES_PEER_DIRS);
    expect_nbrs("hierarchical_lanes", 256, 0, &g, 14, KB_DIR_E, 1, KB_DIR_W, 7, KB_DIR_N, 8,
                KB_DIR_S, 32, KB_DIR_GLOBAL_E, 128, KB_DIR_GLOBAL_W, 128, KB_LANES_PEER_E, 1,
                KB_LANES_PEER_W, 7, KB_LANES_PEER_N, 8, KB_LANES_PEER_S, 32, KB_LANES_PEER_GE,
                128, KB_LANES_PEER_GW, 128, KB_LANES_NEXT, 1, KB_LANES_PREV, 39);
    /* cube 3, PE 5: the cube ring goes 2 -> 3 -> 7 */
    expect_nbrs("hierarchical_lanes", 256, 29, &g, 14, KB_DIR_E, 30, KB_DIR_W, 28, KB_DIR_N,
                61, KB_DIR_S, 21, KB_DIR_GLOBAL_E, 157, KB_DIR_GLOBAL_W, 157, KB_LANES_PEER_E,
                30, KB_LANES_PEER_W, 28, KB_LANES_PEER_N, 61, KB_LANES_PEER_S, 21,
                KB_LANES_PEER_GE, 157, KB_LANES_PEER_GW, 157, KB_LANES_NEXT, 30, KB_LANES_PREV,
                28);
    /* cube 3, PE 7: the flat ring leaves for cube 7's PE 0 */
    expect_nbrs("hierarchical_lanes", 256, 31, &g, 14, KB_DIR_E, 24, KB_DIR_W, 30, KB_DIR_N,
                63, KB_DIR_S, 23, KB_DIR_GLOBAL_E, 159, KB_DIR_GLOBAL_W, 159, KB_LANES_PEER_E,
                24, KB_LANES_PEER_W, 30, KB_LANES_PEER_N, 63, KB_LANES_PEER_S, 23,
                KB_LANES_PEER_GE, 159, KB_LANES_PEER_GW, 159, KB_LANES_NEXT, 56, KB_LANES_PREV,
                30);
    /* SIP 1, cube 4 (the cube ring's last), PE 7: the flat ring's last place, before the
     * gateway (SIP 1's cube 0 PE 0) */
    expect_nbrs("hierarchical_lanes", 256, 167, &g, 14, KB_DIR_E, 160, KB_DIR_W, 166,
                KB_DIR_N, 135, KB_DIR_S, 199, KB_DIR_GLOBAL_E, 39, KB_DIR_GLOBAL_W, 39,
                KB_LANES_PEER_E, 160, KB_LANES_PEER_W, 166, KB_LANES_PEER_N, 135,
                KB_LANES_PEER_S, 199, KB_LANES_PEER_GE, 39, KB_LANES_PEER_GW, 39,
                KB_LANES_NEXT, 128, KB_LANES_PREV, 166);
    assert_int_equal(kb_topo_lanes_flat_pos(0, &g, 8, 16), 0);
    assert_int_equal(kb_topo_lanes_flat_pos(31, &g, 8, 16), 31);
    assert_int_equal(kb_topo_lanes_flat_pos(167, &g, 8, 16), 127);
    assert_int_equal(kb_topo_lanes_flat_pe(127, &g, 8, 16), 39);
    assert_int_equal(kb_topo_lanes_flat_pe(32, &g, 8, 16), 56);
    for (int q = 0; q < 128; q++)
        assert_int_equal(kb_topo_lanes_flat_pos(kb_topo_lanes_flat_pe(q, &g, 8, 16), &g, 8, 16),
                         q);
    int P, C, S;
    assert_int_equal(kb_topo_lanes_shape(256, &g, &P, &C, &S), 1);
    assert_true(P == 8 && C == 16 && S == 2);
    assert_int_equal(kb_topo_lanes_shape(64, &g, &P, &C, &S), 1);
    assert_true(P == 8 && C == 8 && S == 1);
    assert_int_equal(kb_topo_lanes_shape(12, &g, &P, &C, &S), 0);  /* a partial cube */
    assert_int_equal(kb_topo_lanes_shape(136, &g, &P, &C, &S), 0); /* a partial SIP */
    /* any other world: hierarchical_3level's links */
    expect_nbrs("hierarchical_lanes", 12, 8, &g, 4, KB_DIR_E, 9, KB_DIR_W, 11, KB_DIR_N, 0,
                KB_DIR_S, 0);
    static const int worlds[] = { 256, 64, 16, 8, 12, 3, 136 };
    for (size_t i = 0; i < sizeof worlds / sizeof *worlds; i++)
        check_all_links_reverse("hierarchical_lanes", worlds[i], &g);
}

static void test_topo_errors_and_names(void **state)
{
    kb_ccl_geom g = { 2, 2, 0, 0 };
    int t[TMAX];
    kb_errbuf eb;
    int n = 0;
    (void)state;
    assert_int_equal(kb_topo_neighbors("dragonfly", 4, 0, &g, t, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "unknown topology 'dragonfly'"));
    assert_int_equal(kb_topo_neighbors("ring_1d", 4, 4, &g, t, &eb), KB_ERR_RANGE);
    assert_int_equal(kb_topo_neighbors("ring_1d", 4, -1, &g, t, &eb), KB_ERR_RANGE);
    assert_int_equal(kb_topo_neighbors("ring_1d", 0, 0, &g, t, &eb), KB_ERR_RANGE);
    /* every listed topology accepts a world of 4 (a square of 2 x 2 cubes of 2 PEs) */
    for (; kb_topo_names[n]; n++) {
        assert_int_equal(kb_topo_neighbors_n(kb_topo_names[n], 4, 3, &g, t, TMAX, &eb), 0);
        check_all_links_reverse(kb_topo_names[n], 4, &g);
    }
    assert_int_equal(n, 12);
    /* kb_topo_reverse: no direction points back */
    for (int d = 0; d < KB_NDIRS; d++)
        t[d] = NONE;
    t[KB_DIR_N] = 5;
    assert_int_equal(kb_topo_reverse(t, 3, KB_DIR_E), -1);
    assert_int_equal(kb_topo_reverse(t, 5, KB_DIR_E), KB_DIR_N);
}

/* ---- legacy layout ---- */

static void layout_ok(const kb_machine *m, int ws, int sips, int cubes, int pes)
{
    kb_ccl_layout l;
    kb_errbuf eb;
    int rc = kb_ccl_layout_whole(m, ws, &l, &eb);
    if (rc != 0)
        fail_msg("ws %d: %s", ws, eb.msg);
    assert_int_equal(l.ws, ws);
    assert_int_equal(l.sips, sips);
    assert_int_equal(l.cubes, cubes);
    assert_int_equal(l.pes, pes);
    assert_int_equal(l.ranks_per_sip, cubes * pes);
    /* rank r runs on global PE r: every rank maps to a distinct PE, in order */
    for (int r = 0; r < ws; r++) {
        kb_pe_hw *pe = kb_ccl_rank_pe(m, &l, r);
        assert_int_equal(pe->gsip, r / (cubes * pes));
        assert_int_equal(pe->cube, (r % (cubes * pes)) / pes);
        assert_int_equal(pe->pe, r % pes);
        assert_int_equal(pe->gid, r);
    }
}

static void test_layout_legacy(void **state)
{
    kb_config cfg;
    kb_machine *m = NULL;
    kb_ccl_layout l;
    kb_errbuf eb;
    (void)state;
    kb_config_defaults(&cfg);
    assert_int_equal(kb_machine_create(&cfg.topo, &m, &eb), 0);
    assert_int_equal(m->nsips, 2);
    assert_int_equal(m->ncubes, 16);
    assert_int_equal(m->npes, 8);
    layout_ok(m, 1, 1, 1, 1);
    layout_ok(m, 7, 1, 1, 7);
    layout_ok(m, 8, 1, 1, 8);
    layout_ok(m, 16, 1, 2, 8);
    layout_ok(m, 128, 1, 16, 8);
    layout_ok(m, 256, 2, 16, 8);
    assert_int_equal(kb_ccl_layout_whole(m, 9, &l, &eb), KB_ERR_CONFIG);
    assert_int_equal(kb_ccl_layout_whole(m, 12, &l, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "spans cubes but is not a multiple of 8"));
    assert_int_equal(kb_ccl_layout_whole(m, 192, &l, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "spans SIPs but is not a multiple of 128"));
    assert_int_equal(kb_ccl_layout_whole(m, 257, &l, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "does not fit the machine's 256 PEs"));
    assert_int_equal(kb_ccl_layout_whole(m, 0, &l, &eb), KB_ERR_CONFIG);
    kb_machine_destroy(m);
    kb_machine_destroy(NULL);
}

/* kb_ccl_layout_linear: any world size, partial cubes and a partial last SIP. */
static void test_layout_linear(void **state)
{
    static const struct { int ws, sips, cubes, pes, rps, last; } cases[] = {
        { 1, 1, 1, 1, 1, 1 },     { 7, 1, 1, 7, 7, 7 },       { 8, 1, 1, 8, 8, 8 },
        { 9, 1, 2, 8, 9, 9 },     { 12, 1, 2, 8, 12, 12 },    { 16, 1, 2, 8, 16, 16 },
        { 127, 1, 16, 8, 127, 127 }, { 130, 2, 16, 8, 128, 2 }, { 256, 2, 16, 8, 128, 128 },
    };
    kb_config cfg;
    kb_machine *m = NULL;
    kb_ccl_layout l, w;
    kb_errbuf eb;
    (void)state;
    kb_config_defaults(&cfg);
    assert_int_equal(kb_machine_create(&cfg.topo, &m, &eb), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ws = cases[i].ws;
        assert_int_equal(kb_ccl_layout_linear(m, ws, &l, &eb), 0);
        assert_int_equal(l.ws, ws);
        assert_int_equal(l.sips, cases[i].sips);
        assert_int_equal(l.cubes, cases[i].cubes);
        assert_int_equal(l.pes, cases[i].pes);
        assert_int_equal(l.ranks_per_sip, cases[i].rps);
        assert_int_equal(kb_ccl_layout_sip_ranks(&l, l.sips - 1), cases[i].last);
        assert_int_equal(kb_ccl_layout_sip_ranks(&l, l.sips), 0);
        for (int r = 0; r < ws; r++)
            assert_int_equal(kb_ccl_rank_pe(m, &l, r)->gid, r);
        /* where whole cubes are filled it is the legacy layout */
        if (kb_ccl_layout_whole(m, ws, &w, &eb) == 0)
            assert_memory_equal(&w, &l, sizeof l);
    }
    assert_int_equal(kb_ccl_layout_linear(m, 257, &l, &eb), KB_ERR_CONFIG);
    assert_int_equal(kb_ccl_layout_linear(m, 0, &l, &eb), KB_ERR_CONFIG);
    kb_machine_destroy(m);
}

/* A KB_CCL_ANY_WORLD algorithm: every rank sends its tile east and keeps what comes from the
 * west; the grid's PEs past the last rank return at once. */
static void shift_any(kb_tl *tl, const kb_kargs *a)
{
    int64_t n = a->i[KB_CCL_ARG_N];
    if (kb_ccl_idle(tl, a))
        return;
    kb_va mine = kb_ccl_my_tile(tl, a);
    kb_val v = tl_load(tl, mine, KB_SHAPE1(n), KB_F16);
    tl_send(tl, KB_DIR_E, v);
    tl_free(tl, v);
    tl_store(tl, mine, tl_recv(tl, KB_DIR_W, KB_SHAPE1(n), KB_F16));
}

static uint64_t shift_msg(int64_t n, int ws)
{
    (void)ws;
    return (uint64_t)n * 2;
}

static const kb_ccl_algo_impl shift_any_impl = {
    .module = "shift_any",
    .summary = "test: shift east on any world",
    .kind = KB_COLL_SENDRECV,
    .topology = "ring_1d",
    .kernel = shift_any,
    .max_msg_bytes = shift_msg,
    .reference = kb_ccl_ref_shift_east,
    .flags = KB_CCL_ANY_WORLD,
};

typedef struct any_case {
    const kb_ccl_algo_impl *impl;
    int ws;
    kb_ccl_job job;
} any_case;

static int h_any(kb_ctx *ctx, void *arg)
{
    any_case *c = arg;
    kb_ipcq_cfg icfg = { 2, 4096, KB_MEM_TCM, 1, 1 };
    int rc = kb_ccl_job_prepare(ctx, &c->job, c->impl, c->impl->module, "ring_1d", c->ws, 16,
                                &icfg, NULL);
    return rc ? rc : kb_ccl_job_launch(ctx, &c->job, NULL, NULL);
}

typedef struct any_algo_case {
    const kb_ccl_algo_impl *impl;
    int ws;
    int64_t n;
    kb_ccl_job job;
} any_algo_case;

static int h_any_algo(kb_ctx *ctx, void *arg)
{
    any_algo_case *c = arg;
    kb_ipcq_cfg icfg = { 2, 4096, KB_MEM_TCM, 1, 1 };
    int rc = kb_ccl_job_prepare(ctx, &c->job, c->impl, c->impl->module, c->impl->topology,
                                c->ws, c->n, &icfg, NULL);
    return rc ? rc : kb_ccl_job_launch(ctx, &c->job, NULL, NULL);
}

/* Every built-in algorithm (all have KB_CCL_ANY_WORLD) on worlds that split a cube (12) and
 * a SIP (130) of the default machine (8 PEs per cube, 128 per SIP), odd counts, seeded
 * inputs, checked against its reference; the full mesh of 130 ranks wires 129 peer
 * directions per PE (129 rings of 2 x 4 KiB in the 8 MiB IPCQ area). */
static void test_builtin_any_world(void **state)
{
    static const int worlds[] = { 12, 130 };
    any_algo_case *c = calloc(1, sizeof *c);
    int flagged = 0;
    (void)state;
    assert_non_null(c);
    for (int i = 0; kb_ccl_algo_at(i); i++) {
        const kb_ccl_algo_impl *impl = kb_ccl_algo_at(i);
        if (!impl->kernel)
            continue; /* a rank = SIP form only (intercube_allreduce): test_dist's */
        if (!(impl->flags & KB_CCL_ANY_WORLD))
            fail_msg("%s: no KB_CCL_ANY_WORLD", impl->module);
        flagged++;
        for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
            int ws = worlds[w];
            int64_t n = 5 * kb_coll_tile_ranks(impl->kind, ws);
            if (!strcmp(impl->topology, "mesh_2d"))
                ws = w ? 121 : 9; /* squares that split a cube / a SIP */
            kb_config cfg;
            kb_ctx_opts opts = { .device = KB_DEV_REF };
            kb_ctx *ctx = NULL;
            kb_errbuf eb;
            kb_ccl_verdict v;
            uint16_t *raw = malloc((size_t)ws * (size_t)n * 2);
            assert_non_null(raw);
            kb_config_defaults(&cfg);
            assert_int_equal(kb_ctx_create(&cfg, &opts, &ctx, &eb), 0);
            memset(c, 0, sizeof *c);
            c->impl = impl;
            c->ws = ws;
            c->n = n;
            if (kb_ctx_run_host(ctx, h_any_algo, c) != 0)
                fail_msg("%s ws %d: %s", impl->module, ws, kb_ctx_errmsg(ctx));
            assert_int_equal(kb_ccl_job_read(ctx, &c->job, NULL, raw), 0);
            if (kb_ccl_verify_inputs_ord(KB_F16, KB_CCL_OP_SUM, raw, impl->reference,
                                         impl->ordered, impl->kind, KB_CCL_INPUT_SEED, ws, n,
                                         0, 0.0, &v) != 1)
                fail_msg("%s ws %d: rank %d element %lld = %g, expected %g", impl->module, ws,
                         v.first_bad_tile, (long long)v.first_bad_elem, v.first_got,
                         v.first_want);
            kb_ctx_destroy(ctx);
            free(raw);
        }
    }
    assert_int_equal(flagged, 18);
    free(c);
}

typedef struct typed_case {
    const kb_ccl_algo_impl *impl;
    int ws;
    int64_t n;
    kb_ccl_job_opts o;
    kb_ccl_job job;
} typed_case;

static int h_typed(kb_ctx *ctx, void *arg)
{
    typed_case *c = arg;
    kb_ipcq_cfg icfg = { 2, 4096, KB_MEM_TCM, 1, 1 };
    int rc = kb_ccl_job_prepare_opts(ctx, &c->job, c->impl, c->impl->module,
                                     c->impl->topology, c->ws, c->n, &c->o, &icfg, NULL);
    return rc ? rc : kb_ccl_job_launch(ctx, &c->job, NULL, NULL);
}

/* Runs one typed job on the default machine; returns its raw tiles (caller frees). */
static void *run_typed(typed_case *c)
{
    kb_config cfg;
    kb_ctx_opts opts = { .device = KB_DEV_REF };
    kb_ctx *ctx = NULL;
    kb_errbuf eb;
    void *raw = malloc((size_t)c->ws * (size_t)c->n * kb_dtype_size(c->o.dtype));
    assert_non_null(raw);
    kb_config_defaults(&cfg);
    assert_int_equal(kb_ctx_create(&cfg, &opts, &ctx, &eb), 0);
    if (kb_ctx_run_host(ctx, h_typed, c) != 0)
        fail_msg("%s ws %d op %s dtype %s: %s", c->impl->module, c->ws,
                 kb_ccl_op_name(c->o.op), kb_dtype_name(c->o.dtype), kb_ctx_errmsg(ctx));
    assert_int_equal(kb_ccl_job_read_raw(ctx, &c->job, raw), 0);
    kb_ctx_destroy(ctx);
    return raw;
}

/*
 * Every KB_CCL_TYPED reducing algorithm x op x dtype x world sizes {1, 2, 3, 5, 12} x counts
 * {1, 7, 37} (4096-byte slots, so the larger counts take several f32 slices), against the op
 * reference with the stated tolerance (exact but for avg). Max is also checked against an
 * expectation computed here from the raw inputs, and a max result must fail as a min.
 */
static void test_typed_ops(void **state)
{
    static const int worlds[] = { 1, 2, 3, 5, 12 };
    static const int64_t counts[] = { 1, 7, 1500 };
    typed_case *c = calloc(1, sizeof *c);
    int algos = 0;
    (void)state;
    assert_non_null(c);
    for (int i = 0; kb_ccl_algo_at(i); i++) {
        const kb_ccl_algo_impl *impl = kb_ccl_algo_at(i);
        if (!impl->kernel)
            continue; /* a rank = SIP form only (intercube_allreduce): test_dist's */
        if (!(impl->flags & KB_CCL_TYPED) || !kb_coll_reduces(impl->kind))
            continue;
        algos++;
        for (int op = 0; op < KB_CCL_NOPS; op++)
            for (int dt = 0; dt <= KB_F32; dt++) /* collective element types */
                for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++)
                    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
                        int ws = worlds[w];
                        int64_t n = counts[k] * kb_coll_tile_ranks(impl->kind, ws);
                        kb_ccl_verdict v;
                        memset(c, 0, sizeof *c);
                        c->impl = impl;
                        c->ws = ws;
                        c->n = n;
                        c->o = (kb_ccl_job_opts){ ws > 2 ? 2 : 0, (kb_dtype)dt, op };
                        if (!kb_coll_rooted(impl->kind))
                            c->o.root = 0;
                        void *raw = run_typed(c);
                        double acc = kb_ccl_input_acc_bound_op(impl->kind, op, ws);
                        if (kb_ccl_verify_inputs_ord((kb_dtype)dt, op, raw, impl->reference,
                                                    impl->ordered, impl->kind, KB_CCL_INPUT_SEED, ws, n,
                                                    c->o.root, acc, &v) != 1)
                            fail_msg("%s ws %d n %lld op %s dtype %s: rank %d element %lld = "
                                     "%g, expected %g", impl->module, ws, (long long)n,
                                     kb_ccl_op_name(op), kb_dtype_name((kb_dtype)dt),
                                     v.first_bad_tile, (long long)v.first_bad_elem,
                                     v.first_got, v.first_want);
                        /* bit for bit against the reference rounded once, but for avg */
                        assert_true((acc == 0.0) == (op != KB_CCL_OP_AVG));
                        if (op == KB_CCL_OP_MAX && ws > 1 && impl->kind == KB_COLL_ALLREDUCE) {
                            /* independently: element i of every rank = max over the inputs */
                            float *x = malloc((size_t)n * sizeof *x), *m = malloc((size_t)n * sizeof *m);
                            assert_true(x && m);
                            for (int t = 0; t < ws; t++) {
                                kb_ccl_input_op_span(x, KB_CCL_INPUT_SEED, op, (kb_dtype)dt, ws, t,
                                                     0, n, n);
                                for (int64_t e = 0; e < n; e++)
                                    m[e] = t == 0 || x[e] > m[e] ? x[e] : m[e];
                            }
                            for (int t = 0; t < ws; t++)
                                for (int64_t e = 0; e < n; e++)
                                    assert_true(kb_dtype_load((kb_dtype)dt, raw,
                                                              (size_t)t * (size_t)n + (size_t)e) == m[e]);
                            /* the same result is not a min */
                            assert_int_equal(kb_ccl_verify_inputs_ord((kb_dtype)dt, KB_CCL_OP_MIN,
                                                                     raw, impl->reference, impl->ordered,
                                                                     impl->kind, KB_CCL_INPUT_SEED,
                                                                     ws, n, 0, 0.0, &v), 0);
                            free(x);
                            free(m);
                        }
                        free(raw);
                    }
    }
    assert_int_equal(algos, 5); /* ring_rsag_allreduce, ring_reducescatter, ring/tree_reduce,
                                 * dbtree_allreduce */
    /* the kinds that only move data take every element type too, bit for bit */
    int movers = 0;
    for (int i = 0; kb_ccl_algo_at(i); i++) {
        const kb_ccl_algo_impl *impl = kb_ccl_algo_at(i);
        if (!impl->kernel)
            continue; /* a rank = SIP form only (intercube_allreduce): test_dist's */
        if (!(impl->flags & KB_CCL_TYPED) || kb_coll_reduces(impl->kind))
            continue;
        movers++;
        for (int dt = 0; dt <= KB_F32; dt++)
            for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++)
                for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
                    int ws = worlds[w];
                    int64_t n = counts[k] * kb_coll_tile_ranks(impl->kind, ws);
                    kb_ccl_verdict v;
                    memset(c, 0, sizeof *c);
                    c->impl = impl;
                    c->ws = ws;
                    c->n = n;
                    c->o = (kb_ccl_job_opts){ kb_coll_rooted(impl->kind) && ws > 2 ? 2 : 0,
                                              (kb_dtype)dt, KB_CCL_OP_SUM };
                    void *raw = run_typed(c);
                    if (kb_ccl_verify_inputs_op((kb_dtype)dt, KB_CCL_OP_SUM, raw,
                                                impl->reference, impl->kind, KB_CCL_INPUT_SEED,
                                                ws, n, c->o.root, 0.0, &v) != 1)
                        fail_msg("%s ws %d n %lld dtype %s: rank %d element %lld = %g, "
                                 "expected %g", impl->module, ws, (long long)n,
                                 kb_dtype_name((kb_dtype)dt), v.first_bad_tile,
                                 (long long)v.first_bad_elem, v.first_got, v.first_want);
                    free(raw);
                }
    }
    assert_int_equal(movers, 6); /* ring/rd_allgather, p2p_sendrecv, ring/tree_broadcast,
                                  * pairwise_alltoall */
    /* an algorithm without KB_CCL_TYPED refuses another dtype or op, a kind that does not
     * reduce refuses an op */
    {
        kb_config cfg;
        kb_ctx_opts opts = { .device = KB_DEV_REF };
        kb_ctx *ctx = NULL;
        kb_errbuf eb;
        kb_config_defaults(&cfg);
        assert_int_equal(kb_ctx_create(&cfg, &opts, &ctx, &eb), 0);
        memset(c, 0, sizeof *c);
        c->impl = kb_ccl_algo_find("ring_allreduce");
        c->ws = 4;
        c->n = 8;
        c->o = (kb_ccl_job_opts){ 0, KB_BF16, KB_CCL_OP_SUM };
        assert_int_equal(kb_ctx_run_host(ctx, h_typed, c), KB_ERR_CONFIG);
        assert_non_null(strstr(kb_ctx_errmsg(ctx), "module ring_allreduce runs f16 sums only "
                                                   "(dtype bf16, op sum asked)"));
        kb_ctx_destroy(ctx);
        assert_int_equal(kb_ctx_create(&cfg, &opts, &ctx, &eb), 0);
        memset(c, 0, sizeof *c);
        c->impl = kb_ccl_algo_find("ring_allgather");
        c->ws = 4;
        c->n = 8;
        c->o = (kb_ccl_job_opts){ 0, KB_F16, KB_CCL_OP_MAX };
        assert_int_equal(kb_ctx_run_host(ctx, h_typed, c), KB_ERR_CONFIG);
        assert_non_null(strstr(kb_ctx_errmsg(ctx), "op max: the all_gather kind does not reduce"));
        kb_ctx_destroy(ctx);
    }
    free(c);
}

/* Partial cubes and a partial last SIP through kb_ccl_job_* on the default machine; an
 * algorithm without the flag is still refused. */
static void test_job_any_world(void **state)
{
    static const int worlds[] = { 12, 130 };
    any_case *c = calloc(1, sizeof *c);
    (void)state;
    assert_non_null(c);
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        kb_config cfg;
        kb_ctx_opts opts = { .device = KB_DEV_REF };
        kb_ctx *ctx = NULL;
        kb_errbuf eb;
        kb_ccl_verdict v;
        int ws = worlds[w];
        uint16_t *raw = malloc((size_t)ws * 16 * 2);
        double *ref = malloc((size_t)ws * 16 * sizeof *ref);
        float *in = malloc((size_t)ws * 16 * sizeof *in);
        assert_true(raw && ref && in);
        kb_config_defaults(&cfg);
        assert_int_equal(kb_ctx_create(&cfg, &opts, &ctx, &eb), 0);
        memset(c, 0, sizeof *c);
        c->impl = &shift_any_impl;
        c->ws = ws;
        if (kb_ctx_run_host(ctx, h_any, c) != 0)
            fail_msg("ws %d: %s", ws, kb_ctx_errmsg(ctx));
        assert_int_equal(kb_ccl_job_read(ctx, &c->job, NULL, raw), 0);
        kb_ccl_inputs(in, KB_CCL_INPUT_SEED, 0, ws, 16);
        kb_ccl_ref_shift_east(in, ws, 16, ref);
        assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, ws, 16, 0.0, &v), 1);
        kb_ctx_destroy(ctx);
        free(raw);
        free(ref);
        free(in);
    }
    {
        kb_config cfg;
        kb_ctx_opts opts = { .device = KB_DEV_REF };
        kb_ctx *ctx = NULL;
        kb_errbuf eb;
        kb_ccl_algo_impl whole = shift_any_impl;
        whole.flags = 0;
        kb_config_defaults(&cfg);
        assert_int_equal(kb_ctx_create(&cfg, &opts, &ctx, &eb), 0);
        memset(c, 0, sizeof *c);
        c->impl = &whole;
        c->ws = 12;
        assert_int_equal(kb_ctx_run_host(ctx, h_any, c), KB_ERR_CONFIG);
        assert_non_null(strstr(kb_ctx_errmsg(ctx), "spans cubes but is not a multiple of 8"));
        kb_ctx_destroy(ctx);
    }
    free(c);
}

/* kb_ccl_reg: adding, the clash and completeness checks, lookups after the built-ins, and a
 * registered entry through the mock runtime. */
static void test_registry(void **state)
{
    kb_ccl_reg *r = NULL;
    kb_errbuf eb = {{0}};
    kb_ccl_algo_impl bad;
    (void)state;
    assert_int_equal(kb_ccl_reg_create(&r, &eb), 0);
    assert_null(kb_ccl_reg_algo_at(r, 0));
    assert_null(kb_ccl_reg_find_algo(r, "shift_any"));
    assert_ptr_equal(kb_ccl_reg_find_algo(r, "ring_allreduce"), kb_ccl_algo_find("ring_allreduce"));
    assert_ptr_equal(kb_ccl_reg_find_algo(NULL, "ring_allreduce"), kb_ccl_algo_find("ring_allreduce"));
    assert_int_equal(kb_ccl_reg_add_algo(r, &shift_any_impl, &eb), 0);
    assert_ptr_equal(kb_ccl_reg_algo_at(r, 0), &shift_any_impl);
    assert_ptr_equal(kb_ccl_reg_find_algo(r, "shift_any"), &shift_any_impl);
    assert_null(kb_ccl_reg_find_algo(NULL, "shift_any"));
    assert_null(kb_ccl_reg_find_dist(r, "shift_any"));
    assert_int_equal(kb_ccl_reg_add_algo(r, &shift_any_impl, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "algorithm 'shift_any' is already registered");
    /* built-in names of either model clash */
    bad = shift_any_impl;
    bad.module = "ring_rsag_allreduce";
    assert_int_equal(kb_ccl_reg_check_algo(r, &bad, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "'ring_rsag_allreduce' clashes with kbcl's built-in module");
    bad.module = "intercube_allreduce";
    assert_int_equal(kb_ccl_reg_check_algo(r, &bad, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "clashes with kbcl's built-in module");
    bad.module = "no spaces";
    assert_int_equal(kb_ccl_reg_check_algo(r, &bad, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "not a valid ccl.yaml name");
    bad = shift_any_impl;
    bad.module = "other";
    bad.reference = NULL;
    assert_int_equal(kb_ccl_reg_check_algo(r, &bad, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "a rank = PE kernel needs topology, max_msg_bytes and reference");
    bad.reference = kb_ccl_ref_shift_east;
    bad.topology = "moebius";
    assert_int_equal(kb_ccl_reg_check_algo(r, &bad, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "unknown topology 'moebius'");
    bad.topology = "ring_1d";
    bad.flags = 12; /* 1 and 2 are KB_CCL_ANY_WORLD and KB_CCL_TYPED */
    assert_int_equal(kb_ccl_reg_check_algo(r, &bad, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "unknown flags 0xc");
    bad.flags = 0;
    bad.kind = KB_COLL_NKINDS;
    assert_int_equal(kb_ccl_reg_check_algo(r, &bad, &eb), KB_ERR_CONFIG);
    assert_int_equal(kb_ccl_reg_check_algo(r, NULL, &eb), KB_ERR_CONFIG);
    /* an entry with a rank = SIP form: a built-in's form under another name is fine; the
     * lookups see each entry in the rank models it has a placement in */
    {
        kb_ccl_sip_form f = kb_ccl_sip_hierarchical;
        kb_ccl_algo_impl d = { .module = "hierarchical_allreduce", .summary = "s",
                               .kind = KB_COLL_ALLREDUCE, .sip = &f };
        assert_int_equal(kb_ccl_reg_add_algo(r, &d, &eb), KB_ERR_CONFIG);
        kbt_msg_has(eb.msg, "'hierarchical_allreduce' clashes with kbcl's built-in module");
        d.module = "sip_only";
        assert_int_equal(kb_ccl_reg_add_algo(r, &d, &eb), 0);
        assert_ptr_equal(kb_ccl_reg_find_dist(r, "sip_only"), &d);
        assert_null(kb_ccl_reg_find_algo(r, "sip_only")); /* no rank = PE kernel */
        assert_ptr_equal(kb_ccl_reg_algo_at(r, 1), &d);
        assert_int_equal(kb_ccl_reg_add_algo(r, &d, &eb), KB_ERR_CONFIG);
        d.module = "x2";
        f.grid = NULL;
        assert_int_equal(kb_ccl_reg_check_algo(r, &d, &eb), KB_ERR_CONFIG);
        kbt_msg_has(eb.msg, "its rank = SIP form must set every field");
        d.sip = NULL;
        assert_int_equal(kb_ccl_reg_check_algo(r, &d, &eb), KB_ERR_CONFIG);
        kbt_msg_has(eb.msg, "neither a rank = PE kernel nor a rank = SIP form");
        /* both placements in one entry, as hierarchical_allreduce has */
        assert_ptr_equal(kb_ccl_reg_find_dist(NULL, "hierarchical_allreduce"),
                         kb_ccl_reg_find_algo(NULL, "hierarchical_allreduce"));
        assert_ptr_equal(kb_ccl_reg_find_dist(NULL, "intercube_allreduce"),
                         kb_ccl_algo_find("intercube_allreduce"));
        assert_null(kb_ccl_reg_find_algo(NULL, "intercube_allreduce"));
    }
    kb_ccl_reg_destroy(r);
    kb_ccl_reg_destroy(NULL);
    /* an entry in no table runs through the mock runtime */
    {
        float in[5 * 8], out[5 * 8];
        kb_ccl_inputs(in, 3, 0, 5, 8);
        assert_int_equal(kb_ccl_mock_run_algo(&shift_any_impl, NULL, 5, 8, 0, NULL, in, out, &eb), 0);
        for (int rk = 0; rk < 5; rk++)
            for (int i = 0; i < 8; i++)
                assert_true(out[rk * 8 + i] == in[((rk + 4) % 5) * 8 + i]);
        assert_int_equal(kb_ccl_mock_run_algo(NULL, NULL, 5, 8, 0, NULL, in, out, &eb), KB_ERR_INVAL);
    }
}

/* ---- every algorithm through the mock runtime ---- */

/* Raw f16 bits of ntiles*n floats (what a tile tensor holds after the collective). */
static uint16_t *to_f16(const float *x, size_t total)
{
    uint16_t *h = malloc(total * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < total; i++)
        h[i] = kb_f32_to_f16(x[i]);
    return h;
}

/* What element i of rank `rank`'s tile must hold after a collective of kind k rooted at
 * `root`, from every rank's input tile (in, ws x n), computed here apart from the library's
 * references; exact (f32 partial sums of these inputs are), not yet rounded. */
static double expect_of(kb_coll_kind k, const float *in, int ws, int64_t n, int root, int rank,
                        int64_t i)
{
    int64_t cnt = n / ws;
    double sum = 0.0;
    for (int q = 0; q < ws; q++)
        sum += in[(size_t)q * (size_t)n + (size_t)i];
    const float *mine = in + (size_t)rank * (size_t)n;
    switch (k) {
    case KB_COLL_ALLREDUCE:
        return sum;
    case KB_COLL_SENDRECV:
        return in[(size_t)((rank + ws - 1) % ws) * (size_t)n + (size_t)i];
    case KB_COLL_ALLGATHER:
        return in[(size_t)(i / cnt) * (size_t)n + (size_t)i];
    case KB_COLL_REDUCE_SCATTER:
        return i / cnt == rank ? sum : mine[i];
    case KB_COLL_ALLTOALL:
        return in[(size_t)(i / cnt) * (size_t)n + (size_t)(rank * cnt + i % cnt)];
    case KB_COLL_BROADCAST:
        return in[(size_t)root * (size_t)n + (size_t)i];
    case KB_COLL_REDUCE:
        return rank == root ? sum : mine[i];
    default:
        fail_msg("kind %d has no expectation here", (int)k);
        return 0.0;
    }
}

/*
 * Runs `module` on ws ranks (tile n, root, IPCQ configuration icfg or the mock's) with
 * kb_ccl_inputs(seed) and checks every element two ways: against an expectation computed here
 * from the kind (expect_of), and with the library's check against the registry's reference
 * (what the bench does: kb_ccl_verify, and kb_ccl_verify_inputs_root for a root).
 */
/* The expected f16 sum of an entry: its order-emulating reference where it has one. */
static void ref_of(const kb_ccl_algo_impl *impl, const float *in, int ws, int64_t n, double *out)
{
    if (impl->ordered)
        impl->ordered(in, ws, n, 0, n, KB_F16, KB_CCL_OP_SUM, out);
    else
        impl->reference(in, ws, n, out);
}

static void run_mock_opts(const char *module, const char *topo, int ws, int64_t n, int root,
                          const kb_ipcq_cfg *icfg, uint32_t seed)
{
    const kb_ccl_algo_impl *impl = kb_ccl_algo_find(module);
    size_t total = (size_t)ws * (size_t)n;
    float *in = malloc(total * sizeof *in), *out = malloc(total * sizeof *out);
    double *ref = malloc(total * sizeof *ref);
    kb_ccl_verdict v;
    kb_errbuf eb;
    int rc;

    assert_non_null(impl);
    assert_non_null(in);
    assert_non_null(out);
    assert_non_null(ref);
    kb_ccl_inputs(in, seed, 0, ws, n);
    for (size_t i = 0; i < total; i++)
        out[i] = 1e30f;
    rc = kb_ccl_mock_run_opts(module, topo, ws, n, root, icfg, in, out, &eb);
    if (rc != 0)
        fail_msg("%s ws=%d n=%lld root=%d: %d %s", module, ws, (long long)n, root, rc, eb.msg);
    if (impl->ordered) { /* partials rounded to f16 per hop: the kernel's order, for root 0
                          * on the ranks relabelled r - root */
        float *rel = malloc(total * sizeof *rel);
        assert_non_null(rel);
        for (int q = 0; q < ws; q++)
            memcpy(rel + (size_t)q * (size_t)n, in + (size_t)((q + root) % ws) * (size_t)n,
                   (size_t)n * sizeof *rel);
        impl->ordered(rel, ws, n, 0, n, KB_F16, KB_CCL_OP_SUM, ref);
        free(rel);
    }
    for (int rank = 0; rank < ws; rank++) {
        for (int64_t i = 0; i < n; i++) {
            size_t rk = (size_t)((rank - root + ws) % ws);
            double want = impl->ordered ? ref[rk * (size_t)n + (size_t)i]
                                        : expect_of(impl->kind, in, ws, n, root, rank, i);
            /* partial sums are exact in f32; the result is rounded to f16 once */
            want = kb_f16_to_f32(kb_f32_to_f16((float)want));
            double got = out[(size_t)rank * (size_t)n + (size_t)i];
            if (got != want)
                fail_msg("%s ws=%d n=%lld root=%d: rank %d element %lld = %g, expected %g",
                         module, ws, (long long)n, root, rank, (long long)i, got, want);
        }
    }
    uint16_t *raw = to_f16(out, total);
    if (root == 0) {
        ref_of(impl, in, ws, n, ref);
        if (!kb_ccl_verify(KB_F16, raw, ref, ws, n, kb_ccl_input_acc_bound(impl->kind, ws), &v))
            fail_msg("%s ws=%d: kb_ccl_verify rejects rank %d element %lld", module, ws,
                     v.first_bad_tile, (long long)v.first_bad_elem);
        assert_int_equal(v.ok_tiles, ws);
        assert_true(v.max_abs_err <= v.err_bound);
    }
    if (kb_ccl_verify_inputs_ord(KB_F16, KB_CCL_OP_SUM, raw, impl->reference, impl->ordered,
                                 impl->kind, seed, ws, n, root,
                                 kb_ccl_input_acc_bound(impl->kind, ws), &v) != 1)
        fail_msg("%s ws=%d root=%d: kb_ccl_verify_inputs_root rejects rank %d element %lld",
                 module, ws, root, v.first_bad_tile, (long long)v.first_bad_elem);
    free(raw);
    free(in);
    free(out);
    free(ref);
}

static void run_mock(const char *module, const char *topo, int ws, int64_t n, uint32_t seed)
{
    run_mock_opts(module, topo, ws, n, 0, NULL, seed);
}

typedef struct algo_case {
    const char *module;
    int ws[9];       /* 0-terminated */
    int n_eq_ws;     /* also run with n = ws */
    int sweep;       /* counts 1, ws-1 and 37 (chunked kinds: ws chunks of them) and, for a
                      * rooted kind, roots ws-1 and ws/2 too */
} algo_case;

static const algo_case algo_cases[] = {
    { "hello_send", { 2, 5, 0 }, 0, 0 },
    { "ring_allreduce", { 2, 3, 5, 8, 16, 24, 0 }, 0, 0 },
    { "ring_rsag_allreduce", { 2, 3, 8, 16, 0 }, 1, 0 },
    { "mesh_allreduce", { 1, 4, 9, 16, 0 }, 0, 0 },
    { "tree_allreduce", { 1, 2, 7, 13, 0 }, 0, 0 },
    { "hierarchical_allreduce", { 3, 5, 8, 16, 24, 32, 64, 0 }, 0, 0 },
    { "ring_allgather", { 1, 2, 3, 7, 8, 16, 64, 0 }, 0, 1 },
    { "ring_reducescatter", { 1, 2, 3, 7, 8, 16, 64, 0 }, 0, 1 },
    { "p2p_sendrecv", { 1, 2, 3, 7, 8, 16, 64, 0 }, 0, 1 },
    { "ring_broadcast", { 1, 2, 3, 7, 8, 16, 64, 0 }, 0, 1 },
    { "ring_reduce", { 1, 2, 3, 7, 8, 16, 64, 0 }, 0, 1 },
    { "tree_broadcast", { 1, 2, 3, 7, 8, 16, 64, 0 }, 0, 1 },
    { "tree_reduce", { 1, 2, 3, 7, 8, 16, 64, 0 }, 0, 1 },
    { "pairwise_alltoall", { 1, 2, 3, 5, 8, 12, 13, 64 }, 0, 1 }, /* 13 on: peer directions */
    { "rd_allgather", { 1, 2, 3, 6, 7, 8, 16, 64 }, 0, 1 },
    { "rh_reducescatter", { 1, 2, 3, 5, 8, 12, 64, 0 }, 0, 1 },
    { "rhd_allreduce", { 1, 2, 3, 5, 8, 12, 64, 0 }, 0, 1 },
    { "dbtree_allreduce", { 1, 2, 3, 5, 8, 12, 64, 0 }, 0, 1 },
};

static const algo_case *case_of(const char *module)
{
    for (size_t i = 0; i < sizeof algo_cases / sizeof algo_cases[0]; i++)
        if (!strcmp(algo_cases[i].module, module))
            return &algo_cases[i];
    return NULL;
}

static void test_mock_every_algorithm(void **state)
{
    int nalgos = 0;
    (void)state;
    for (int a = 0; kb_ccl_algo_at(a); a++) {
        const kb_ccl_algo_impl *impl = kb_ccl_algo_at(a);
        if (!impl->kernel)
            continue; /* a rank = SIP form only (intercube_allreduce): test_dist's */
        nalgos++;
        const algo_case *c = case_of(impl->module);
        if (!c)
            fail_msg("algorithm module '%s' has no test case here", impl->module);
        assert_ptr_equal(kb_ccl_algo_find(impl->module), impl);
        assert_non_null(impl->kernel);
        assert_non_null(impl->max_msg_bytes);
        for (int i = 0; c->ws[i]; i++) {
            int ws = c->ws[i], tr = kb_coll_tile_ranks(impl->kind, ws);
            if (!c->sweep) {
                run_mock(impl->module, NULL, ws, 37, (uint32_t)(a * 100 + i));
                if (c->n_eq_ws)
                    run_mock(impl->module, NULL, ws, ws, (uint32_t)(a * 100 + 50 + i));
                continue;
            }
            const int64_t counts[3] = { 1, ws - 1, 37 };
            const int roots[3] = { 0, ws - 1, ws / 2 };
            for (int ci = 0; ci < 3; ci++)
                for (int ri = 0; ri < (kb_coll_rooted(impl->kind) ? 3 : 1); ri++)
                    if (counts[ci] > 0)
                        run_mock_opts(impl->module, NULL, ws, counts[ci] * tr, roots[ri], NULL,
                                      (uint32_t)(a * 100 + i * 10 + ci * 3 + ri));
        }
    }
    assert_int_equal(nalgos, (int)(sizeof algo_cases / sizeof algo_cases[0]));
    /* tiles shorter than the world: the reduce-scatter ring skips its empty chunks */
    run_mock("ring_rsag_allreduce", NULL, 16, 5, 4242);
    run_mock("ring_rsag_allreduce", NULL, 8, 1, 4243);
    assert_null(kb_ccl_algo_at(-1));
    assert_null(kb_ccl_algo_find("no_such_algo"));
}

/*
 * The other collectives at sizes past a slot: 4096-byte slots (two, and one) with 3001
 * elements per chunk (or tile) make every chunk several slices; 64-byte slots with 2100
 * make more slices than a block posts (several blocks, the last one short). Rooted kinds run
 * at a root other than 0.
 */
static void test_coll_chunked(void **state)
{
    static const char *const modules[] = {
        "ring_allgather", "ring_reducescatter", "p2p_sendrecv", "ring_broadcast",
        "ring_reduce", "tree_broadcast", "tree_reduce", "pairwise_alltoall", "rd_allgather",
        "rh_reducescatter", "rhd_allreduce", "dbtree_allreduce",
    };
    static const struct { int slots; uint64_t slot; int64_t count; } sz[] = {
        { 2, 4096, 3001 }, { 1, 4096, 3001 }, { 2, 64, 2100 },
    };
    static const int worlds[] = { 3, 8 };
    (void)state;
    for (size_t m = 0; m < sizeof modules / sizeof modules[0]; m++) {
        const kb_ccl_algo_impl *impl = kb_ccl_algo_find(modules[m]);
        assert_non_null(impl);
        for (size_t k = 0; k < sizeof sz / sizeof sz[0]; k++)
            for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
                int ws = worlds[w];
                kb_ipcq_cfg icfg = { sz[k].slots, sz[k].slot, KB_MEM_TCM, 1, 1 };
                int64_t n = sz[k].count * kb_coll_tile_ranks(impl->kind, ws);
                int root = kb_coll_rooted(impl->kind) ? ws - 2 : 0;
                assert_true((uint64_t)sz[k].count * 2u > sz[k].slot);
                run_mock_opts(modules[m], NULL, ws, n, root, &icfg,
                              (uint32_t)(1000 + m * 10 + k * 2 + w));
            }
    }
}

/* With no inputs the mock feeds kb_ccl_inputs(KB_CCL_INPUT_SEED), like the bench. */
static void test_mock_default_inputs(void **state)
{
    enum { WS = 4, NE = 8 };
    float in[WS * NE], a[WS * NE], b[WS * NE];
    kb_errbuf eb;
    (void)state;
    kb_ccl_inputs(in, KB_CCL_INPUT_SEED, 0, WS, NE);
    for (int i = 0; kb_ccl_algo_at(i); i++) {
        const char *module = kb_ccl_algo_at(i)->module;
        if (!kb_ccl_algo_at(i)->kernel) { /* a rank = SIP form only: no rank = PE job */
            assert_int_equal(kb_ccl_mock_run(module, NULL, WS, NE, NULL, a, &eb),
                             KB_ERR_NOTFOUND);
            continue;
        }
        assert_int_equal(kb_ccl_mock_run(module, NULL, WS, NE, NULL, a, &eb), 0);
        assert_int_equal(kb_ccl_mock_run(module, NULL, WS, NE, in, b, &eb), 0);
        assert_memory_equal(a, b, sizeof a);
    }
}

/* Algorithms on topologies other than their usual one. */
static void test_mock_other_topologies(void **state)
{
    (void)state;
    run_mock("ring_allreduce", "ring_1d_unidir", 5, 37, 7);
    run_mock("ring_rsag_allreduce", "ring_1d_unidir", 6, 37, 8);
    run_mock("hello_send", "ring_1d", 3, 37, 9);
    /* 32 cubes of one SIP, then 3 SIPs: the leaders' global_E/W ring */
    run_mock("hierarchical_allreduce", NULL, 256, 37, 10);
    run_mock("hierarchical_allreduce", NULL, 384, 37, 11);
    /* the usual topology is the table's */
    assert_string_equal(kb_ccl_default_topo("ring_allreduce"), "ring_1d");
    assert_string_equal(kb_ccl_default_topo("mesh_allreduce"), "mesh_2d");
    assert_string_equal(kb_ccl_default_topo("tree_allreduce"), "tree_binary");
    assert_string_equal(kb_ccl_default_topo("hierarchical_allreduce"), "hierarchical_lanes");
    /* the chain form on the wiring it had before the lanes */
    run_mock("hierarchical_allreduce", "hierarchical_3level", 256, 37, 12);
    assert_string_equal(kb_ccl_default_topo("no_such_algo"), "ring_1d");
    for (int i = 0; kb_ccl_algo_at(i); i++)
        assert_string_equal(kb_ccl_default_topo(kb_ccl_algo_at(i)->module),
                            kb_ccl_algo_at(i)->topology ? kb_ccl_algo_at(i)->topology
                                                        : "ring_1d");
}

/* hierarchical_allreduce's chain form (kb_ccl_hier.c: several SIPs, a tile of at least F
 * slots on F PEs per SIP): 64-byte slots put a tile of 4 099 elements past it on 3 SIPs of
 * 128 PEs (the gateways' reduce-scatter ring of 3; 257 slices per chain, a ragged last one);
 * exact sums, rounded once. */
static void test_mock_hier_chain(void **state)
{
    kb_ipcq_cfg icfg = { 4, 64, KB_MEM_TCM, 1, 1 };
    (void)state;
    run_mock_opts("hierarchical_allreduce", NULL, 384, 4099, 0, &icfg, 13);
}

static void test_mock_errors(void **state)
{
    float in[6 * 4] = { 0 }, out[6 * 4];
    kb_errbuf eb;
    (void)state;
    assert_int_equal(kb_ccl_mock_run("mesh_allreduce", NULL, 6, 4, in, out, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "square world size, got 6"));
    assert_int_equal(kb_ccl_mock_run("no_such_algo", NULL, 2, 4, in, out, &eb), KB_ERR_NOTFOUND);
    assert_non_null(strstr(eb.msg, "unknown algorithm module 'no_such_algo'"));
    assert_int_equal(kb_ccl_mock_run("ring_allreduce", "dragonfly", 2, 4, in, out, &eb),
                     KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "unknown topology 'dragonfly'"));
    assert_int_equal(kb_ccl_mock_run("ring_allreduce", NULL, 20, 4, NULL, NULL, &eb),
                     KB_ERR_RANGE);
    assert_non_null(strstr(eb.msg, "cannot lay out 20 ranks"));
    assert_int_equal(kb_ccl_mock_run("ring_allreduce", NULL, 0, 4, NULL, NULL, &eb),
                     KB_ERR_RANGE);
    /* chunked kinds need ws chunks; a full mesh must fit the IPCQ area; roots are ranks */
    assert_int_equal(kb_ccl_mock_run("ring_allgather", NULL, 3, 4, in, out, &eb), KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "a tile of 4 elements is not 3 chunks"));
    {
        /* a full mesh whose rings do not fit the IPCQ area: the install says by how much */
        kb_ipcq_cfg big = { 4, 65536, KB_MEM_TCM, 1, 1 };
        assert_int_equal(kb_ccl_mock_run_opts("pairwise_alltoall", NULL, 64, 64, 0, &big, NULL,
                                              NULL, &eb), KB_ERR_NOSPACE);
        assert_non_null(strstr(eb.msg, "needs 63 rx rings (63 of them peer directions) of 4 "
                               "slots x 65536 bytes = 16515072 bytes, but the PE's IPCQ area "
                               "in TCM (pe.ipcq.area_bytes) has 8388608 bytes (8388608 free)"));
    }
    assert_int_equal(kb_ccl_mock_run_opts("ring_broadcast", NULL, 4, 4, 4, NULL, in, out, &eb),
                     KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "root 4 is not a rank of a world of 4"));
    assert_int_equal(kb_ccl_mock_run_opts("ring_allgather", NULL, 4, 4, 1, NULL, in, out, &eb),
                     KB_ERR_CONFIG);
    assert_non_null(strstr(eb.msg, "the all_gather kind has no root"));
}

/* ---- verification machinery ---- */

static void test_coll_kinds_busbw(void **state)
{
    (void)state;
    /* nccl-tests' factors at 8 ranks */
    assert_true(kb_coll_busbw_factor(KB_COLL_ALLREDUCE, 8) == 1.75);
    assert_true(kb_coll_busbw_factor(KB_COLL_ALLGATHER, 8) == 0.875);
    assert_true(kb_coll_busbw_factor(KB_COLL_REDUCE_SCATTER, 8) == 0.875);
    assert_true(kb_coll_busbw_factor(KB_COLL_ALLTOALL, 8) == 0.875);
    assert_true(kb_coll_busbw_factor(KB_COLL_BROADCAST, 8) == 1.0);
    assert_true(kb_coll_busbw_factor(KB_COLL_REDUCE, 8) == 1.0);
    assert_true(kb_coll_busbw_factor(KB_COLL_SENDRECV, 8) == 1.0);
    /* a world of one moves nothing for the n-1 kinds; no world, no factor */
    assert_true(kb_coll_busbw_factor(KB_COLL_ALLREDUCE, 1) == 0.0);
    assert_true(kb_coll_busbw_factor(KB_COLL_ALLGATHER, 1) == 0.0);
    assert_true(kb_coll_busbw_factor(KB_COLL_SENDRECV, 1) == 1.0);
    assert_true(kb_coll_busbw_factor(KB_COLL_ALLREDUCE, 0) == 0.0);
    assert_true(kb_coll_busbw_factor(KB_COLL_NKINDS, 8) == 0.0);
    assert_true(kb_coll_busbw_factor(KB_COLL_ALLREDUCE, 256) == 2.0 * 255 / 256);
    assert_string_equal(kb_coll_name(KB_COLL_ALLREDUCE), "all_reduce");
    assert_string_equal(kb_coll_name(KB_COLL_SENDRECV), "sendrecv");
    assert_string_equal(kb_coll_name(KB_COLL_ALLTOALL), "all_to_all");
    assert_string_equal(kb_coll_name(KB_COLL_NKINDS), "?");
    /* every registered algorithm names a kind and a topology the library knows */
    for (int i = 0; kb_ccl_algo_at(i); i++) {
        const kb_ccl_algo_impl *impl = kb_ccl_algo_at(i);
        if (!impl->kernel)
            continue; /* a rank = SIP form only (intercube_allreduce): test_dist's */
        int known = 0;
        assert_true((unsigned)impl->kind < KB_COLL_NKINDS);
        assert_non_null(impl->reference);
        for (int t = 0; kb_topo_names[t]; t++)
            known |= !strcmp(kb_topo_names[t], impl->topology);
        assert_true(known);
    }
    assert_int_equal(kb_ccl_algo_find("hello_send")->kind, KB_COLL_SENDRECV);
    assert_int_equal(kb_ccl_algo_find("ring_allreduce")->kind, KB_COLL_ALLREDUCE);
}

static void test_references(void **state)
{
    const float in[3 * 2] = { 1, 2, 10, 20, 100, 200 };
    double out[3 * 2];
    (void)state;
    kb_ccl_ref_allreduce(in, 3, 2, out);
    for (int r = 0; r < 3; r++) {
        assert_true(out[r * 2] == 111.0);
        assert_true(out[r * 2 + 1] == 222.0);
    }
    kb_ccl_ref_shift_east(in, 3, 2, out); /* rank r gets rank r-1's tile */
    assert_true(out[0] == 100.0 && out[1] == 200.0);
    assert_true(out[2] == 1.0 && out[3] == 2.0);
    assert_true(out[4] == 10.0 && out[5] == 20.0);
    kb_ccl_ref_shift_east(in, 1, 2, out);
    assert_true(out[0] == 1.0 && out[1] == 2.0);
    /* two ranks, tiles of two chunks of one: rank r's chunk c at element c */
    const float in2[2 * 2] = { 1, 2, 10, 20 };
    double o2[4];
    kb_ccl_ref_allgather(in2, 2, 2, o2); /* chunk c from rank c */
    assert_true(o2[0] == 1 && o2[1] == 20 && o2[2] == 1 && o2[3] == 20);
    kb_ccl_ref_reduce_scatter(in2, 2, 2, o2); /* chunk r summed on rank r, the rest kept */
    assert_true(o2[0] == 11 && o2[1] == 2 && o2[2] == 10 && o2[3] == 22);
    kb_ccl_ref_alltoall(in2, 2, 2, o2); /* chunk c of rank r = chunk r of rank c */
    assert_true(o2[0] == 1 && o2[1] == 10 && o2[2] == 2 && o2[3] == 20);
    kb_ccl_ref_broadcast(in, 3, 2, out);
    for (int r = 0; r < 3; r++)
        assert_true(out[r * 2] == 1.0 && out[r * 2 + 1] == 2.0);
    kb_ccl_ref_reduce(in, 3, 2, out);
    assert_true(out[0] == 111.0 && out[1] == 222.0);
    assert_true(out[2] == 10.0 && out[5] == 200.0);
    assert_int_equal(kb_coll_tile_ranks(KB_COLL_ALLGATHER, 5), 5);
    assert_int_equal(kb_coll_tile_ranks(KB_COLL_ALLTOALL, 5), 5);
    assert_int_equal(kb_coll_tile_ranks(KB_COLL_REDUCE, 5), 1);
    assert_true(kb_coll_rooted(KB_COLL_BROADCAST) && kb_coll_rooted(KB_COLL_REDUCE));
    assert_false(kb_coll_rooted(KB_COLL_ALLREDUCE));
}

static void test_inputs(void **state)
{
    enum { G = KB_CCL_INPUT_GRID };
    static float x[2 * G];
    static uint8_t seen[G];
    (void)state;
    /* every (tile, element) of a world with ntiles * n <= the grid gets its own value, for
     * several shapes and seeds; values are on the 1/128 grid, |x| <= 16, exact in f16 */
    static const int64_t shapes[][2] = { { 256, 16 }, { 4096, 1 }, { 1, 4096 }, { 7, 37 } };
    for (uint32_t seed = 1; seed <= 3; seed++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t nt = shapes[s][0], n = shapes[s][1];
            memset(seen, 0, sizeof seen);
            kb_ccl_inputs(x, seed, 0, nt, n);
            for (int64_t k = 0; k < nt * n; k++) {
                float v = x[k];
                int q = (int)(v * 128.0f) + G / 2;
                assert_true(v * 128.0f == (float)(q - G / 2));
                assert_true(v >= -16.0f && v < 16.0f);
                assert_true(kb_f16_to_f32(kb_f32_to_f16(v)) == v);
                if (seen[q])
                    fail_msg("seed %u, %lld x %lld: value %g repeats at %lld", seed,
                             (long long)nt, (long long)n, (double)v, (long long)k);
                seen[q] = 1;
                /* the same as element by element, and deterministic */
                assert_true(kb_ccl_input(seed, k / n, k % n, n) == v);
            }
        }
    }
    /* spans of a tile, across the 4096-position blocks, are the same values */
    for (int64_t i0 = 0; i0 < 3 * G; i0 += 1237) {
        kb_ccl_input_span(x, 4, 2, i0, 2 * G - 1, 3 * G + 5);
        for (int64_t j = 0; j < 2 * G - 1; j++)
            assert_true(x[j] == kb_ccl_input(4, 2, i0 + j, 3 * G + 5));
    }
    /* a tile range starting later is the same positions' values */
    kb_ccl_inputs(x, 5, 0, 8, 64);
    kb_ccl_inputs(x + 8 * 64, 5, 3, 2, 64);
    assert_memory_equal(x + 8 * 64, x + 3 * 64, 2 * 64 * sizeof *x);
    /* the seed changes the values; beyond the grid they go on varying */
    int differ = 0;
    for (int64_t i = 0; i < 64; i++)
        differ += kb_ccl_input(1, 0, i, 64) != kb_ccl_input(2, 0, i, 64);
    assert_true(differ > 48);
    kb_ccl_inputs(x, 1, 0, 2, G); /* positions 0..8191: block 1 is another permutation */
    differ = 0;
    for (int64_t i = 0; i < G; i++)
        differ += x[i] != x[G + i];
    assert_true(differ > G * 3 / 4);
    /* exactness range of reductions */
    assert_true(kb_ccl_input_acc_bound(KB_COLL_ALLREDUCE, KB_CCL_INPUT_EXACT_TERMS) == 0.0);
    assert_true(kb_ccl_input_acc_bound(KB_COLL_ALLREDUCE, KB_CCL_INPUT_EXACT_TERMS + 1) > 0.0);
    assert_true(kb_ccl_input_acc_bound(KB_COLL_SENDRECV, 100000) == 0.0);
    /* the worst case of the exact range: KB_CCL_INPUT_EXACT_TERMS values of -16 in f32 */
    float acc = 0.0f;
    for (int i = 0; i < KB_CCL_INPUT_EXACT_TERMS; i++)
        acc += -16.0f + 1.0f / 128.0f * (float)(i & 1);
    assert_true((double)acc == -16.0 * KB_CCL_INPUT_EXACT_TERMS +
                                   (double)(KB_CCL_INPUT_EXACT_TERMS / 2) / 128.0);
}

/* Swaps the first element of tile t with a later one of another value; returns its index. */
static int64_t swap_in_tile(uint16_t *raw, int t, int64_t n)
{
    uint16_t *tile = raw + (size_t)t * (size_t)n;
    for (int64_t j = 1; j < n; j++) {
        if (tile[j] != tile[0]) {
            uint16_t tmp = tile[0];
            tile[0] = tile[j];
            tile[j] = tmp;
            return j;
        }
    }
    fail_msg("tile %d holds one value only", t);
    return -1;
}

/*
 * The comparison the bench uses (kb_ccl_verify) rejects a real result with two elements of
 * one rank's tile swapped: the swap keeps the tile's sum and the mean, so only checking every
 * element at its place catches it. Also: a tolerance that still catches the swap.
 */
/*
 * The order-emulating references: with f16 partials rounded per hop the ring's result differs
 * from the exact sum rounded once on some elements of the seeded data (so the check really
 * depends on the order), never in f32 (the grid's sums are exact); and a real run of the
 * kernel matches the emulation bit for bit but fails against the exact sum.
 */
static void test_ordered_reference(void **state)
{
    enum { WS = 12, NE = 1200 };
    static float in[WS * NE], out[WS * NE];
    static double ord[WS * NE], exact[WS * NE];
    kb_ccl_verdict v;
    kb_errbuf eb;
    (void)state;
    kb_ccl_inputs(in, KB_CCL_INPUT_SEED, 0, WS, NE);
    for (int m = 0; m < 2; m++) {
        const kb_ccl_algo_impl *impl = kb_ccl_algo_find(m ? "ring_reducescatter" : "ring_rsag_allreduce");
        assert_non_null(impl->ordered);
        impl->reference(in, WS, NE, exact);
        impl->ordered(in, WS, NE, 0, NE, KB_F32, KB_CCL_OP_SUM, ord);
        for (size_t k = 0; k < (size_t)WS * NE; k++)
            assert_true(ord[k] == exact[k]);
        impl->ordered(in, WS, NE, 0, NE, KB_F16, KB_CCL_OP_SUM, ord);
        int differ = 0;
        for (size_t k = 0; k < (size_t)WS * NE; k++)
            differ += kb_f32_to_f16((float)ord[k]) != kb_f32_to_f16((float)exact[k]);
        assert_true(differ > 0);
        assert_int_equal(kb_ccl_mock_run(impl->module, NULL, WS, NE, in, out, &eb), 0);
        uint16_t *raw = to_f16(out, (size_t)WS * NE);
        assert_int_equal(kb_ccl_verify(KB_F16, raw, ord, WS, NE, 0.0, &v), 1);
        assert_int_equal(kb_ccl_verify(KB_F16, raw, exact, WS, NE, 0.0, &v), 0);
        free(raw);
    }
}

static void test_verify_rejects_swap(void **state)
{
    enum { WS = 8, NE = 40 }; /* 5 elements a chunk for the chunked kinds */
    float in[WS * NE], out[WS * NE];
    double ref[WS * NE];
    kb_ccl_verdict v;
    kb_errbuf eb;
    (void)state;
    kb_ccl_inputs(in, 99, 0, WS, NE);
    for (int a = 0; kb_ccl_algo_at(a); a++) {
        const kb_ccl_algo_impl *impl = kb_ccl_algo_at(a);
        if (!impl->kernel)
            continue; /* a rank = SIP form only (intercube_allreduce): test_dist's */
        int ws = !strcmp(impl->module, "mesh_allreduce") ? 4 : WS;
        assert_int_equal(kb_ccl_mock_run(impl->module, NULL, ws, NE, in, out, &eb), 0);
        ref_of(impl, in, ws, NE, ref);
        uint16_t *raw = to_f16(out, (size_t)ws * NE);
        assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, ws, NE, 0.0, &v), 1);
        assert_int_equal(v.ok_tiles, ws);
        assert_int_equal(v.first_bad_tile, -1);
        int64_t j = swap_in_tile(raw, ws - 1, NE);
        assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, ws, NE, 0.0, &v), 0);
        assert_int_equal(v.ok_tiles, ws - 1);
        assert_int_equal(v.first_bad_tile, ws - 1);
        assert_int_equal(v.first_bad_elem, 0);
        assert_true(v.first_got == kb_f16_to_f32(raw[(size_t)(ws - 1) * NE]));
        assert_true(v.max_abs_err > v.err_bound);
        /* the mean cannot tell: the FAIL line's means agree */
        assert_true(fabs(v.got_mean - v.want_mean) < 1e-9);
        /* a loose tolerance (here 1/64 beyond half an ulp) still sees it */
        assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, ws, NE, 1.0 / 64, &v), 0);
        swap_in_tile(raw, ws - 1, NE); /* the same pair back */
        (void)j;
        assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, ws, NE, 0.0, &v), 1);
        free(raw);
    }
}

/* Exact mode wants the bits of the reference rounded to nearest even; the tolerant mode
 * accepts half an ulp plus acc_bound and reports the worst error against its bound. */
static void test_verify_rounding(void **state)
{
    /* 2049 is a tie between f16 2048 and 2050: nearest even is 2048 */
    const double ref[2] = { 2049.0, 1.0 };
    uint16_t raw[2] = { kb_f32_to_f16(2048.0f), kb_f32_to_f16(1.0f) };
    float f32[2] = { 2049.0f, 1.0f };
    kb_ccl_verdict v;
    (void)state;
    assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, 1, 2, 0.0, &v), 1);
    assert_true(v.max_abs_err == 1.0 && v.err_bound == 1.0);
    raw[0] = kb_f32_to_f16(2050.0f); /* the other neighbour: as close, but not RNE */
    assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, 1, 2, 0.0, &v), 0);
    assert_int_equal(v.first_bad_elem, 0);
    assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, 1, 2, 1e-6, &v), 1);
    raw[0] = kb_f32_to_f16(2052.0f);
    assert_int_equal(kb_ccl_verify(KB_F16, raw, ref, 1, 2, 1e-6, &v), 0);
    assert_true(v.max_abs_err == 3.0);
    /* f32 tiles: exact */
    assert_int_equal(kb_ccl_verify(KB_F32, f32, ref, 1, 2, 0.0, &v), 1);
    assert_true(v.max_abs_err == 0.0);
    f32[1] = 1.0f + 0x1p-23f;
    assert_int_equal(kb_ccl_verify(KB_F32, f32, ref, 2, 1, 0.0, &v), 0);
    assert_int_equal(v.ok_tiles, 1);
    assert_int_equal(v.first_bad_tile, 1);
}

/* Two verdicts agree in every field, doubles bit for bit (NaN means included). */
static void assert_same_verdict(const kb_ccl_verdict *a, const kb_ccl_verdict *b)
{
    assert_int_equal(a->ntiles, b->ntiles);
    assert_int_equal(a->ok_tiles, b->ok_tiles);
    assert_int_equal(a->first_bad_tile, b->first_bad_tile);
    assert_int_equal(a->first_bad_elem, b->first_bad_elem);
    const double da[] = { a->first_got, a->first_want, a->got_mean, a->want_mean,
                          a->max_abs_err, a->err_bound };
    const double db[] = { b->first_got, b->first_want, b->got_mean, b->want_mean,
                          b->max_abs_err, b->err_bound };
    assert_memory_equal(da, db, sizeof da);
}

/*
 * kb_ccl_verify_inputs (column blocks, nothing held whole) gives kb_ccl_verify's verdict of
 * the whole arrays, field for field: correct results, scattered wrong values, NaNs, equal
 * worst errors in several tiles (the first in tile-major order wins), several blocks with a
 * partial last one, both comparison modes, f16 and f32, position-wise kinds and the
 * whole-array fallback.
 */
static void test_verify_inputs_matches(void **state)
{
    static const struct { int ntiles; int64_t n; } shapes[] = {
        { 5, 37 }, { 1, 1 }, { 3, 4100 }, { 700, 420 }, /* 374 columns a block: 2 */
    };
    static const struct { kb_coll_kind kind; kb_ccl_ref_fn ref; } refs[] = {
        { KB_COLL_ALLREDUCE, kb_ccl_ref_allreduce },
        { KB_COLL_SENDRECV, kb_ccl_ref_shift_east },
        { KB_COLL_ALLGATHER, kb_ccl_ref_shift_east }, /* not position-wise: whole arrays */
    };
    static const kb_dtype dts[] = { KB_F16, KB_F32 };
    kbt_rng g = { 7 };
    (void)state;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int nt = shapes[si].ntiles;
        int64_t n = shapes[si].n;
        size_t total = (size_t)nt * (size_t)n;
        float *in = malloc(total * sizeof *in);
        double *ref = malloc(total * sizeof *ref);
        unsigned char *raw = malloc(total * 4);
        assert_non_null(in);
        assert_non_null(ref);
        assert_non_null(raw);
        kb_ccl_inputs(in, 3, 0, nt, n);
        for (size_t ri = 0; ri < sizeof refs / sizeof refs[0]; ri++) {
            refs[ri].ref(in, nt, n, ref);
            for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
                kb_dtype dt = dts[di];
                for (int variant = 0; variant < 3; variant++) {
                    for (size_t k = 0; k < total; k++)
                        kb_dtype_store(dt, raw, k, (float)ref[k]);
                    if (variant >= 1) { /* scattered wrong values, some NaN */
                        for (int c = 0; c < 1 + (int)(total / 97); c++) {
                            size_t k = kbt_rng_below(&g, (uint32_t)total);
                            float bad = kbt_rng_below(&g, 5) == 0 ? NAN
                                        : (float)ref[k] + (float)(kbt_rng_below(&g, 9)) - 4.0f;
                            kb_dtype_store(dt, raw, k, bad);
                        }
                    }
                    if (variant == 2 && nt > 1) { /* equal worst errors in tiles nt-1 and 0 */
                        size_t k1 = total - 1, k0 = (size_t)(n - 1);
                        kb_dtype_store(dt, raw, k1, (float)ref[k1] + 64.0f);
                        kb_dtype_store(dt, raw, k0, (float)ref[k0] + 64.0f);
                    }
                    for (int mode = 0; mode < 2; mode++) {
                        double acc = mode ? 0.05 : 0.0;
                        kb_ccl_verdict want, got;
                        int w = kb_ccl_verify(dt, raw, ref, nt, n, acc, &want);
                        int r = kb_ccl_verify_inputs(dt, raw, refs[ri].ref, refs[ri].kind, 3,
                                                     nt, n, acc, &got);
                        if (variant == 0)
                            assert_int_equal(w, 1);
                        assert_int_equal(r, w);
                        assert_same_verdict(&got, &want);
                    }
                }
            }
        }
        free(in);
        free(ref);
        free(raw);
    }
    assert_true(kb_ccl_positionwise(KB_COLL_ALLREDUCE) && kb_ccl_positionwise(KB_COLL_SENDRECV));
    assert_false(kb_ccl_positionwise(KB_COLL_ALLGATHER) ||
                 kb_ccl_positionwise(KB_COLL_REDUCE_SCATTER) ||
                 kb_ccl_positionwise(KB_COLL_ALLTOALL));
}

/*
 * A check large enough to be split over threads (4 Mi elements: one per CPU, column blocks
 * merged in order) gives kb_ccl_verify's verdict, field for field: correct all-reduce
 * results, then wrong values in the first and last blocks of several tiles (the first wrong
 * element and the first worst error must be the single-pass ones), then an off-grid value
 * (the means are then summed in order).
 */
static void test_verify_inputs_threads(void **state)
{
    enum { NT = 256, N = 16384 };
    size_t total = (size_t)NT * N;
    float *in = malloc(total * sizeof *in);
    double *ref = malloc(total * sizeof *ref);
    uint16_t *raw = malloc(total * 2);
    (void)state;
    assert_non_null(in);
    assert_non_null(ref);
    assert_non_null(raw);
    kb_ccl_inputs(in, 9, 0, NT, N);
    kb_ccl_ref_allreduce(in, NT, N, ref);
    for (size_t k = 0; k < total; k++)
        kb_dtype_store(KB_F16, raw, k, (float)ref[k]);
    for (int round = 0; round < 3; round++) {
        if (round == 1) {
            kb_dtype_store(KB_F16, raw, (size_t)7 * N + N - 3, (float)ref[7 * N + N - 3] + 2.0f);
            kb_dtype_store(KB_F16, raw, (size_t)9 * N + 5, (float)ref[9 * N + 5] - 2.0f);
            kb_dtype_store(KB_F16, raw, (size_t)9 * N + N - 1, (float)ref[9 * N + N - 1] + 2.0f);
            kb_dtype_store(KB_F16, raw, (size_t)200 * N + N / 2, NAN);
        }
        if (round == 2)
            raw[(size_t)3 * N + 11] = 0x0001; /* 2^-24: off the inputs' 2^-7 grid */
        for (int mode = 0; mode < 2; mode++) {
            double acc = mode ? 0.05 : 0.0;
            kb_ccl_verdict want, got;
            int w = kb_ccl_verify(KB_F16, raw, ref, NT, N, acc, &want);
            int r = kb_ccl_verify_inputs(KB_F16, raw, kb_ccl_ref_allreduce, KB_COLL_ALLREDUCE, 9,
                                         NT, N, acc, &got);
            assert_int_equal(w, round == 0);
            assert_int_equal(r, w);
            assert_same_verdict(&got, &want);
        }
    }
    free(in);
    free(ref);
    free(raw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topo_ring),
        cmocka_unit_test(test_topo_mesh),
        cmocka_unit_test(test_topo_tree),
        cmocka_unit_test(test_topo_full_mesh),
        cmocka_unit_test(test_topo_hypercube),
        cmocka_unit_test(test_topo_hierarchical),
        cmocka_unit_test(test_topo_lanes),
        cmocka_unit_test(test_topo_dbtree),
        cmocka_unit_test(test_topo_errors_and_names),
        cmocka_unit_test(test_layout_legacy),
        cmocka_unit_test(test_layout_linear),
        cmocka_unit_test(test_job_any_world),
        cmocka_unit_test(test_builtin_any_world),
        cmocka_unit_test(test_typed_ops),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_mock_every_algorithm),
        cmocka_unit_test(test_coll_chunked),
        cmocka_unit_test(test_mock_default_inputs),
        cmocka_unit_test(test_mock_other_topologies),
        cmocka_unit_test(test_mock_hier_chain),
        cmocka_unit_test(test_mock_errors),
        cmocka_unit_test(test_coll_kinds_busbw),
        cmocka_unit_test(test_references),
        cmocka_unit_test(test_inputs),
        cmocka_unit_test(test_verify_rejects_swap),
        cmocka_unit_test(test_ordered_reference),
        cmocka_unit_test(test_verify_rounding),
        cmocka_unit_test(test_verify_inputs_matches),
        cmocka_unit_test(test_verify_inputs_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
