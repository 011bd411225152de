/*
 * kb_dist_coll — the rank = SIP all-gather, reduce-scatter, broadcast, reduce, all-to-all and
 * send/recv kernels the process group (kb_dist.c) launches for kb_dist_all_gather,
 * _reduce_scatter, _broadcast, _reduce, _all_to_all and _send / _recv: a tree inside each SIP to a leader PE and rings / chains among the SIPs' leaders
 * over the wiring of the process group's install plan. Algorithms and limits are described
 * in kb_dist_coll.c; the tensor layouts in kb_dist.h.
 */
#ifndef KB_DIST_COLL_H
#define KB_DIST_COLL_H

#include "kb_dist_algo.h"

/* The tree a process group's wiring gives (kb_dist_coll_tree). */
enum {
    KB_DIST_TREE_CHAINS = 0, /* hierarchical_3level: E/W chains in cubes, N/S among PE 0s */
    KB_DIST_TREE_LINES = 1   /* intercube: cube-mesh rows toward the root column, then down it */
};

/* What every kernel here needs of the tensors' layout and the wiring (kb_dist_coll_shape_of). */
typedef struct kb_dist_coll_shape {
    int64_t m;        /* all_gather, reduce_scatter: rows; the others: elements per shard */
    int64_t S;        /* shards (PEs) per rank */
    int64_t ws;
    kb_dtype dt;
    int tree;         /* KB_DIST_TREE_* */
    int g1, g2;       /* CHAINS: PEs per cube, cubes; LINES: the cube mesh's width, height */
    int root_cube;    /* LINES: the cube the lines lead to */
    int gw, gh, wrap; /* the leaders' SIP grid, and whether its rows and columns wrap */
} kb_dist_coll_shape;

/* The tree of an entry's wiring, by its mapper (all_pes, pe0_all_cubes); -1 for another. */
int kb_dist_coll_tree(const kb_ccl_sip_form *algo);

/* The shape of a world of ws ranks on machine m, for tree `tree`: `rows` rows or elements
 * (kb_dist_coll_shape.m), S PEs per rank. */
kb_dist_coll_shape kb_dist_coll_shape_of(const kb_machine *m, int tree, int ws, int root_cube,
                                         int64_t rows, int S, kb_dtype dt);

/* all_gather / reduce_scatter: the narrow tensor (m x k, column-wise over the S PEs, c = k/S
 * columns each) and the wide one (S*m x ws*k, one m x ws*k block per PE). */
typedef struct kb_dist_gather_args {
    kb_dist_coll_shape sh;
    kb_va narrow, wide;
    int64_t c;
    int64_t pieces; /* kb_dist_coll_pieces: 1 = the whole block at once */
} kb_dist_gather_args;
/* The pieces a PE's block streams in, for a PE of `scratch` bytes: 1 (the one-pass
 * algorithm) while its working set fits, so every run that fits keeps its timing; else, for
 * reduce_scatter with m == 1, the fewest of S's divisors whose f32 working set takes at most
 * half the scratch (a piece is whole blocks of every rank's chunk), and for all_gather the
 * fewest equal pieces of the gathered m x ws*k block (its broadcast down the tree) that take
 * at most half. Reduce-scatter with m > 1 does not stream (0: its block does not fit). */
int64_t kb_dist_coll_pieces(int reduce_scatter, uint64_t scratch, int64_t m, int64_t S,
                            int64_t ws, int64_t c, kb_dtype dt);
void kb_dist_allgather_kernel(kb_tl *tl, const kb_kargs *a);
void kb_dist_reducescatter_kernel(kb_tl *tl, const kb_kargs *a);

/* broadcast / reduce over a tensor t of S shards of n = sh.m elements (the all_reduce layout)
 * from / to rank `root`. */
typedef struct kb_dist_rooted_args {
    kb_dist_coll_shape sh;
    kb_va t;
    int root;
} kb_dist_rooted_args;
void kb_dist_broadcast_kernel(kb_tl *tl, const kb_kargs *a);
void kb_dist_reduce_kernel(kb_tl *tl, const kb_kargs *a);

/* all_to_all between two tensors of that layout (n = sh.m, a multiple of ws). */
typedef struct kb_dist_alltoall_args {
    kb_dist_coll_shape sh;
    kb_va in, out;
} kb_dist_alltoall_args;
void kb_dist_alltoall_kernel(kb_tl *tl, const kb_kargs *a);

/* send / recv: a tensor t of that layout (n = sh.m) from the SRC SIP, up its tree, along the
 * leaders of the FWD SIPs, down the DST SIP's tree, shard by shard. Each SIP's role on the
 * route, and the global directions the tensor arrives from (FWD, DST leaders) and leaves on
 * (SRC, FWD); t is the SRC's or the DST's tensor (0 elsewhere). */
enum { KB_DIST_P2P_IDLE = 0, KB_DIST_P2P_SRC, KB_DIST_P2P_FWD, KB_DIST_P2P_DST };
typedef struct kb_dist_p2p_args {
    kb_dist_coll_shape sh;
    kb_va t;
    int role;         /* KB_DIST_P2P_* */
    kb_dir in, out;
} kb_dist_p2p_args;
void kb_dist_p2p_kernel(kb_tl *tl, const kb_kargs *a);

/* kb_dist_all_reduce_shards: every PE's block (n f32 elements at tile + j*n*4 for the
 * SIP's j-th PE, n a multiple of ws) summed with the same-place blocks of the other SIPs
 * over the lane rings (KB_DIST_LANE_NEXT / _PREV: to the PE at the same place in SIP
 * sip + 1 / sip - 1 mod ws). */
#define KB_DIST_LANE_NEXT KB_DIR_PEER(0)
#define KB_DIST_LANE_PREV KB_DIR_PEER(1)
typedef struct kb_dist_lanes_args {
    kb_va tile;
    int64_t n;
    int ws, sip;
    int small;    /* every block both ways round the ring, added in rank order
                   * (kb_dist_lanes_small says when) */
} kb_dist_lanes_args;
/* At most this many ranks take the small form (a PE holds every rank's block). */
#define KB_DIST_SMALL_MAX 16
void kb_dist_lanes_allreduce_kernel(kb_tl *tl, const kb_kargs *a);

/* Whether shard i of a tensor of S shards sits where the kernels of this tree expect it (the
 * all_reduce layout: i = cube * npes + pe over every PE, or cube i's PE 0). */
int kb_dist_coll_shard_ok(const kb_machine *m, int tree, int64_t i, const kb_shard_spec *sh);

#endif
