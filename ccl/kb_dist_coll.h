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

/* Kernel arguments: ptr[0] = the narrow tensor (m x k, column-wise over the S PEs), ptr[1] =
 * the wide one (S*m x ws*k, one m x ws*k block per PE). */
enum { KB_DC_M = 0, KB_DC_C, KB_DC_S, KB_DC_WS, KB_DC_DT, KB_DC_SHAPE, KB_DC_G1, KB_DC_G2,
       KB_DC_ROOT, KB_DC_GW, KB_DC_GH, KB_DC_WRAP };

/* kb_dist_p2p_kernel's arguments, over slots the route makes free: the SIP's role, and the
 * global directions the tensor arrives from (FWD, DST leaders) and leaves on (SRC, FWD). */
enum { KB_DC_ROLE = KB_DC_C, KB_DC_IN = KB_DC_GW, KB_DC_OUT = KB_DC_GH };
enum { KB_DIST_P2P_IDLE = 0, KB_DIST_P2P_SRC, KB_DIST_P2P_FWD, KB_DIST_P2P_DST };

/* The tree of an entry's wiring, by its mapper (all_pes, pe0_all_cubes); -1 for another. */
int kb_dist_coll_tree(const kb_dist_algo *algo);

/* Fills a rank's arguments (ptr[] left to the caller): rows m, c columns per PE, S PEs. */
void kb_dist_coll_args(const kb_machine *m, int tree, int ws, int root_cube, int64_t rows,
                       int64_t c, int S, kb_dtype dt, kb_kargs *a);

void kb_dist_allgather_kernel(kb_tl *tl, const kb_kargs *a);
void kb_dist_reducescatter_kernel(kb_tl *tl, const kb_kargs *a);
/* broadcast / reduce over a tensor of S shards of n elements (the all_reduce layout):
 * ptr[0] = the tensor, i[KB_DC_M] = n, i[KB_DC_C] = the root rank. */
void kb_dist_broadcast_kernel(kb_tl *tl, const kb_kargs *a);
void kb_dist_reduce_kernel(kb_tl *tl, const kb_kargs *a);
/* all_to_all between two tensors of that layout: ptr[0] = in, ptr[1] = out, i[KB_DC_M] = n
 * (a multiple of ws). */
void kb_dist_alltoall_kernel(kb_tl *tl, const kb_kargs *a);
/* send / recv: a tensor of that layout (ptr[0]; i[KB_DC_M] = n) from the SRC SIP, up its tree,
 * along the leaders of the FWD SIPs, down the DST SIP's tree, shard by shard. */
void kb_dist_p2p_kernel(kb_tl *tl, const kb_kargs *a);
/* Whether shard i of a tensor of S shards sits where the kernels of this tree expect it (the
 * all_reduce layout: i = cube * npes + pe over every PE, or cube i's PE 0). */
int kb_dist_coll_shard_ok(const kb_machine *m, int tree, int64_t i, const kb_shard_spec *sh);

#endif
