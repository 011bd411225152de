/*
 * kb_ccl — the collective library: topologies (rank -> direction -> peer rank, one table),
 * reverse-direction pairing, the rank = PE layout (rank r on global PE r) and its validator
 * single_shard_per_rank, install plans, the IPCQ configuration from ccl.yaml parameters,
 * the algorithm registry (one table of entries, each an algorithm with its placements: a
 * rank = PE kernel with its collective kind, usual topology and host reference, a rank = SIP
 * form, or both), and the verification data every collective bench and test uses (seeded
 * position-dependent inputs, an exact comparison). kb_dist_algo.h is the rank = SIP
 * placement's view of the table. A new collective = its own file + one table line + its test +
 * its ccl.yaml entry (docs/collectives.md §7).
 *
 * Topologies (the rank layouts an install plan wires; ccl.yaml's `topology:` names them):
 * ring_1d, ring_1d_unidir, mesh_2d / torus_2d (square k x k, wraps),
 * mesh_2d_no_wrap, tree_binary (heap order: parent (r-1)/2, children 2r+1, 2r+2),
 * hierarchical_3level (E/W ring inside each cube, N/S ring of the cubes' PE 0 inside each SIP,
 * global_E/global_W ring of the SIPs' leaders (cube 0, PE 0)), none, full_mesh (peer direction
 * KB_DIR_PEER(k-1) leads to rank r+k: a queue to every other rank, any ws up to the machine's
 * PEs, as far as ws - 1 rings fit the IPCQ area), hypercube (MPI's
 * recursive doubling for any ws: ranks below 2*rem = 2(ws - 2^d) fold in pairs on direction
 * d, the 2^d survivors are a d-cube on directions 0..d-1; needs d + (rem > 0) <= KB_NDIRS). tree_binary hangs
 * from the geometry's root (heap order over ranks relabelled r - root mod ws).
 * double_binary_tree: NCCL's two binary trees at once (kb_ccl_dbtree_node_of below), six
 * directions at most per rank, any ws.
 * Reverse pairing: for rank r sending on d to p, p's receiving direction is opposite(d) if p's
 * table points it back at r, else the first direction of p (in kb_dir order) that does; the
 * opposite of peer direction k of a table with np peer directions is peer direction np-1-k
 * (full_mesh: offset o comes back on offset ws - o).
 *
 * Rank = PE (a ccl.yaml world_size > 0; the older of the two models): rank r runs on global PE r, i.e. ranks fill the
 * PEs of cube 0 of SIP 0 first, then cube 1, ..., then SIP 1.
 */
#ifndef KB_CCL_H
#define KB_CCL_H

#include <assert.h>
#include <stdint.h>

#include "kb_ccl_config.h"
#include "kb_ipcq.h"
#include "kb_runtime.h"
#include "kb_vquery.h"
#include "kbcl_ccl.h"

#define KB_TOPO_NONE (-1)

/* Machine geometry a topology may need (hierarchical_3level). */
typedef struct kb_ccl_geom {
    int pes_per_cube;
    int cubes_per_sip;
    int root;      /* the rank a rooted topology (tree_binary) hangs from; 0 by default */
    int mesh_w;    /* cubes per row of the SIP's cube mesh (hierarchical_lanes' cube ring);
                    * 0: unknown, the ring takes the cubes in index order */
} kb_ccl_geom;

/*
 * The order hierarchical_lanes' ring visits the C cubes of a SIP in (order[k] = cube at step
 * k): with all w x h cubes of the mesh and w * h even, a cycle of one UCIe hop per step
 * (row 0 east, the other rows in a snake over columns 1.., back north along column 0; the
 * grid transposed when only w is even), so that no link carries two of the ring's edges;
 * otherwise cube index order. Returns the number of cubes written (C).
 */
int kb_topo_cube_ring(int C, int w, int *order);
/* The step of kb_topo_cube_ring(C, w)'s order at which `cube` comes. */
int kb_topo_cube_pos(int cube, int C, int w);

/* The levels of hierarchical_lanes: 1 and *P PEs per cube, *C cubes per SIP, *S SIPs when
 * the world is whole cubes (and whole SIPs beyond one SIP); 0 otherwise. */
int kb_topo_lanes_shape(int ws, const kb_ccl_geom *g, int *P, int *C, int *S);
/* hierarchical_lanes' peer directions (peer k and peer 7 - k are each other's reverse,
 * kb_topo_reverse_n): the ring form's three rings a second time, for a PE's second pair of
 * threads, and, on a world of several SIPs, the chain form's flat ring over the PEs of each
 * SIP (the cubes taken in kb_topo_cube_ring's order, each cube's PEs in index order). */
#define KB_LANES_PEER_E KB_DIR_PEER(0)
#define KB_LANES_PEER_N KB_DIR_PEER(1)
#define KB_LANES_PEER_GE KB_DIR_PEER(2)
#define KB_LANES_NEXT KB_DIR_PEER(3)
#define KB_LANES_PREV KB_DIR_PEER(4)
#define KB_LANES_PEER_GW KB_DIR_PEER(5)
#define KB_LANES_PEER_S KB_DIR_PEER(6)
#define KB_LANES_PEER_W KB_DIR_PEER(7)
#define KB_TOPO_LANES_PEER_DIRS 8
/* A PE's place on the flat ring (0: the SIP's cube 0 PE 0, at the inter-SIP links' router),
 * and the PE (its index in the SIP) at place q. */
int kb_topo_lanes_flat_pos(int rank, const kb_ccl_geom *g, int P, int C);
int kb_topo_lanes_flat_pe(int q, const kb_ccl_geom *g, int P, int C);

/*
 * Fills nbr[d] = peer rank of `rank` on direction d, or KB_TOPO_NONE, for a world of `ws`
 * ranks. Errors (KB_ERR_CONFIG / KB_ERR_RANGE with a message): unknown topology, a mesh
 * world that is not a square, a
 * topology with peer directions (full_mesh beyond one rank) for a table of KB_NDIRS.
 * kb_topo_neighbors_n fills a table of ndirs >= kb_topo_ndirs(topo, ws) entries, the peer
 * directions after the named ones.
 */
int kb_topo_neighbors(const char *topo, int ws, int rank, const kb_ccl_geom *g,
                      int nbr[KB_NDIRS], kb_errbuf *eb);
int kb_topo_neighbors_n(const char *topo, int ws, int rank, const kb_ccl_geom *g, int *nbr,
                        int ndirs, kb_errbuf *eb);
/* The peer directions a topology wires per rank in a world of ws (full_mesh: ws - 1, every
 * other topology 0), and the size of the direction table it needs (KB_NDIRS + those). */
int kb_topo_peer_dirs(const char *topo, int ws);
int kb_topo_ndirs(const char *topo, int ws);

/* d = floor(log2 ws): the dimensions of the hypercube topology (ws >= 1). */
int kb_topo_hypercube_dims(int ws);

/* Reverse direction at peer `p` for the link (r, d): returns the direction or -1. The _n form
 * takes p's table of ndirs entries (peer directions included). */
int kb_topo_reverse(const int nbr_of_peer[KB_NDIRS], int r, kb_dir d);
int kb_topo_reverse_n(const int *nbr_of_peer, int ndirs, int r, kb_dir d);

/*
 * The double binary tree (NCCL's ncclGetDtree; topology double_binary_tree; built in
 * ccl/kb_ccl.c, its all-reduce kernel in ccl/kb_ccl_dbtree.c).
 * Tree 0 is the in-order binary tree over positions p = 0 .. ws-1 (rank r at p = r): with
 * q = p + 1 and b its lowest set bit, q's children are q - b/2 and the first of q + b/2,
 * q + b/4, ... that is <= ws, its parent (q ^ b) | 2b, or q ^ b when that is past ws; the
 * root is the largest power of two <= ws. Its interior nodes are the odd positions, its
 * leaves the even ones. Tree 1 is its mirror (rank r at p = ws-1-r) for an even ws and its
 * shift (p = r - 1 mod ws) for an odd one, so every rank is interior in at most one tree and
 * a leaf in at least one. Directions: tree 0 hangs on N (a child 0 toward its parent) / E
 * (a child 1), its parent reaching child 0 on S and child 1 on W; tree 1 the same on
 * global_N / global_E and global_S / global_W. Every link is its direction's opposite, so a
 * pair linked in both trees pairs up right (kb_topo_reverse).
 */
typedef struct kb_ccl_dbtree_node {
    int parent;      /* rank; -1 at the root */
    int child[2];    /* ranks; -1 where none (child 0 exists whenever child 1 does) */
    int side;        /* which child of its parent the rank is (0 or 1); -1 at the root */
    int depth;       /* hops to the root */
} kb_ccl_dbtree_node;
/* Rank `rank`'s node in tree `tree` (0 or 1) over ws >= 1 ranks. */
void kb_ccl_dbtree_node_of(int ws, int tree, int rank, kb_ccl_dbtree_node *out);
/* The direction toward the parent of a child on `side` of tree t, and toward child c. */
kb_dir kb_ccl_dbtree_up_dir(int tree, int side);
kb_dir kb_ccl_dbtree_down_dir(int tree, int c);

/* Names of all topologies, NULL-terminated: the one list (ccl.yaml, `kbcl list`). */
extern const char *const kb_topo_names[];
/* Index of a topology in kb_topo_names, -1 when unknown. */
int kb_topo_find(const char *name);

/* Which PEs take part: the grid of a rank = PE world of ws ranks. */
typedef struct kb_ccl_layout {
    int ws;
    int sips, cubes, pes;     /* grid: PEs [0,pes) of cubes [0,cubes) of SIPs [0,sips) */
    int ranks_per_sip;
    int root;                 /* the collective's root rank (broadcast, reduce); 0 otherwise */
} kb_ccl_layout;
/* The rank = PE layout of a world that fills whole cubes (and whole SIPs beyond one SIP). */
int kb_ccl_layout_whole(const kb_machine *m, int ws, kb_ccl_layout *out, kb_errbuf *eb);
/*
 * The same mapping (rank r on global PE r) for any ws from 1 to every PE: a world that spans
 * cubes takes ceil(ws / PEs per cube) cubes of its SIP, the last one maybe partial; beyond one
 * SIP it takes whole SIPs but the last. pes x cubes x sips is then the grid the kernel is
 * launched on, which may hold PEs past the last rank; ranks_per_sip is the ranks of every SIP
 * but the last (kb_ccl_layout_sip_ranks). A world that fills whole cubes gets exactly
 * kb_ccl_layout_whole's layout.
 */
int kb_ccl_layout_linear(const kb_machine *m, int ws, kb_ccl_layout *out, kb_errbuf *eb);
/* Ranks on SIP s of a layout (ranks_per_sip, or fewer on a partial last SIP). */
int kb_ccl_layout_sip_ranks(const kb_ccl_layout *l, int s);
kb_pe_hw *kb_ccl_rank_pe(const kb_machine *m, const kb_ccl_layout *l, int rank);

/* The IPCQ configuration effective parameters ask for (KB_ERR_CONFIG on an unknown
 * buffer_kind). */
int kb_ccl_config_ipcq(const kb_ccl_params *p, kb_ipcq_cfg *out, kb_errbuf *eb);

/*
 * The bus-bandwidth bound of a topology over a layout, in GB/s: the bandwidth of the slowest
 * resource on the route of any of its links (a rank's scratch to its peer's IPCQ ring, as a
 * send goes; PE_DMA engines included). busbw cannot exceed it: a ring moves busbw bytes per
 * second over every link. 0 when the topology has no link (one rank, `none`).
 */
double kb_ccl_topo_bound_gbps(kb_ctx *ctx, const char *topo, const kb_ccl_layout *l);

/* Builds the install links of a topology over a layout and installs IPCQ (timed). */
int kb_ccl_install(kb_ctx *ctx, const char *topo, const kb_ccl_layout *l, const kb_ipcq_cfg *cfg);
/* The same, plus the lane rings when per > 0 and the layout holds two or more groups of per
 * ranks: rank r's KB_DIR_PEER(0) leads to rank r + per (mod ws), KB_DIR_PEER(1) to r - per
 * (kb_dist_all_reduce_shards' rings; the topology must use no peer direction itself). */
int kb_ccl_install_lanes(kb_ctx *ctx, const char *topo, const kb_ccl_layout *l,
                         const kb_ipcq_cfg *cfg, int per);

/* ---- algorithms ---- */

/* Names of the ops, NULL-terminated (the ccl.yaml key's values). */
extern const char *const kb_ccl_op_names[];
/* Names of the tile dtypes, NULL-terminated: f16, bf16, f32. */
extern const char *const kb_ccl_dtype_names[];

/* The registry of built-in algorithms, both rank models: a table of entry pointers in
 * kb_ccl_algos.c, looked up by module (kb_ccl_algo_find: any entry; kb_ccl_reg_find_algo and
 * kb_ccl_reg_find_dist: the ones with a rank = PE kernel, or with a rank = SIP form). The
 * entries of kb_ccl_algos.c are its own; an algorithm written in a file of its own
 * (ccl/kb_ccl_<name>.c) defines `const kb_ccl_algo_impl kb_ccl_algo_<name>`, declared here,
 * and adds one line to that table. */
const kb_ccl_algo_impl *kb_ccl_algo_find(const char *module);
/* ccl/kb_ccl_coll.c: the collectives other than all-reduce */
extern const kb_ccl_algo_impl kb_ccl_algo_ring_allgather, kb_ccl_algo_ring_reducescatter,
    kb_ccl_algo_p2p_sendrecv, kb_ccl_algo_ring_broadcast, kb_ccl_algo_ring_reduce,
    kb_ccl_algo_tree_broadcast, kb_ccl_algo_tree_reduce, kb_ccl_algo_pairwise_alltoall,
    kb_ccl_algo_rd_allgather, kb_ccl_algo_rh_reducescatter, kb_ccl_algo_rhd_allreduce;
/* ccl/kb_ccl_dbtree.c: NCCL's double binary tree all-reduce */
extern const kb_ccl_algo_impl kb_ccl_algo_dbtree_allreduce;
/* ccl/kb_ccl_intercube.c: PE 0 of every cube (a rank = SIP form only) */
extern const kb_ccl_algo_impl kb_ccl_algo_intercube;
const kb_ccl_algo_impl *kb_ccl_algo_at(int i); /* NULL past the end */

/*
 * Ring all-reduce of the f32 value acc (1 x n) among k members (my index i; sends on `out`
 * to i + 1, receives on `in` from i - 1), for a collective's top level where the members'
 * totals must have the same bits — a ring that forwards whole values and adds each as it
 * comes sums in a different order on every member. Small (k <= KB_CCL_GATHER_SUM_MAX and
 * the k values within one slot): the values go round as in that ring (k - 1 steps) and each
 * member sums them in member order. Otherwise reduce-scatter + all-gather: each chunk is
 * summed once, along one path, then handed round; the all-gather runs in the member's tile
 * memory at va (n elements of dt, overwritten) and the total is read back from it as f32, so
 * with f16 it is rounded to f16 once (as the tile's store would round it). acc is released;
 * returns a new value. Needs k >= 2; messages longer than a slot travel as chunks.
 */
#define KB_CCL_GATHER_SUM_MAX 64
kb_val kb_ccl_ring_allreduce_val(kb_tl *tl, kb_val acc, int64_t k, int64_t i, kb_dir out,
                                 kb_dir in, kb_va va, kb_dtype dt);

/*
 * Elements per block when a kernel must stream its tile of n elements, 0 when it need not:
 * it streams when its largest message (msg_esz bytes per tile element) is longer than a slot
 * or the tile's f32 sums exceed KB_CCL_STREAM_BYTES. The answer depends only on n and the
 * context's IPCQ configuration, so every rank takes the same path; a tile that fits keeps
 * the algorithm's whole-tile code exactly as it was.
 */
int64_t kb_ccl_stream_block(kb_tl *tl, int64_t n, uint32_t msg_esz);

/*
 * hierarchical_allreduce's lanes form (kb_ccl_hier.c): runs the all-reduce of the tile at va
 * and returns 1 when it applies (posted sends, a tile that streams, a world of whole cubes and
 * SIPs wired by hierarchical_lanes), else returns 0 at once and the caller runs the chain form.
 */
int kb_ccl_hier_lanes(kb_tl *tl, const kb_kargs *a, kb_va va, int64_t n);

/* ---- running a collective ---- */

/*
 * A collective job in a rank = PE world: one tile tensor per SIP (rank r's n f16 elements on
 * r's PE: validator single_shard_per_rank), IPCQ installed for the topology, and the kernel.
 * Owner: the caller (the tensors belong to the context).
 */
typedef struct kb_ccl_job {
    const kb_ccl_algo_impl *impl;
    char name[64];
    char topo[64];
    kb_ccl_layout layout;
    int64_t n;
    kb_ipcq_cfg icfg;
    kb_tensor *tiles[KB_MAX_GSIPS];
    /* launch arguments, kept here rather than on the heap: a launch that never returns (a
     * failed or deadlocked run) must not strand an allocation (~136 KiB: keep jobs off fiber
     * stacks) */
    kb_kargs args[KB_MAX_GSIPS];
    kb_dtype dtype;            /* the tiles' dtype (f16 unless kb_ccl_job_prepare_opts said) */
    int op;                    /* kb_ccl_op of a reducing kind (sum by default) */
} kb_ccl_job;

/*
 * From a host program: checks the world for the algorithm, creates and fills the tiles
 * (inputs: ws*n f32 values, rank-major; NULL = kb_ccl_inputs(KB_CCL_INPUT_SEED, ...)),
 * validates the layout and installs IPCQ. `name` is what reports call the algorithm. The
 * values never change the host writes' sizes or order, so they never change simulated time;
 * they are computed (or copied) a shard block at a time and only when the context records
 * (a kb_fill), so a timing-only job holds no host memory for them.
 */
int kb_ccl_job_prepare(kb_ctx *ctx, kb_ccl_job *job, const kb_ccl_algo_impl *impl,
                       const char *name, const char *topo, int ws, int64_t n,
                       const kb_ipcq_cfg *icfg, const float *inputs);
/* The same with a root rank (broadcast, reduce; KB_CCL_ARG_ROOT, and the rank a rooted
 * topology hangs from). KB_ERR_CONFIG for a root outside [0, ws) or a non-zero root of a kind
 * that has none. */
int kb_ccl_job_prepare_root(kb_ctx *ctx, kb_ccl_job *job, const kb_ccl_algo_impl *impl,
                            const char *name, const char *topo, int ws, int64_t n, int root,
                            const kb_ipcq_cfg *icfg, const float *inputs);
/* Everything kb_ccl_job_prepare_root takes beyond it: the root, the tiles' dtype and the
 * reduction. The seeded inputs depend on the op (kb_ccl_input_op). KB_ERR_CONFIG for a dtype
 * other than f16 or an op other than sum on an entry without KB_CCL_TYPED, and for an op
 * other than sum on a kind that does not reduce. */
typedef struct kb_ccl_job_opts {
    int root;
    kb_dtype dtype;
    int op;
} kb_ccl_job_opts;
int kb_ccl_job_prepare_opts(kb_ctx *ctx, kb_ccl_job *job, const kb_ccl_algo_impl *impl,
                            const char *name, const char *topo, int ws, int64_t n,
                            const kb_ccl_job_opts *o, const kb_ipcq_cfg *icfg,
                            const float *inputs);
/* The dtype, op and root checks of kb_ccl_job_prepare_opts for a world of ws ranks
 * (KB_ERR_CONFIG naming `name`); the rank = SIP lanes (kb_ccl_lanes.h) apply the same. */
int kb_ccl_job_check_opts(const kb_ccl_algo_impl *impl, const char *name,
                          const kb_ccl_job_opts *o, int ws, kb_errbuf *eb);
/* Whether a kind reduces (all_reduce, reduce_scatter, reduce): the kinds an op applies to. */
int kb_coll_reduces(kb_coll_kind k);
/* kb_ccl_job_launch and kb_ccl_job_read: kbcl_ccl.h. */
/* Every rank's tile as raw bytes of the job's dtype (ws*n*size, rank-major). */
int kb_ccl_job_read_raw(kb_ctx *ctx, kb_ccl_job *job, void *raw);

/*
 * Mock runtime: runs algorithm `module` on ws ranks with the given inputs (ws*n values,
 * rounded to f16; NULL = kb_ccl_inputs(KB_CCL_INPUT_SEED, ...)) and returns every rank's
 * result tile in out (ws*n). It builds the smallest
 * machine that holds the world (one cube of ws PEs up to 16 ranks, else cubes of 8 PEs, else
 * SIPs of 128 PEs), runs the real kernel and replays the data with the ref backend; the
 * simulated time is computed but not reported. topo NULL = the algorithm's usual topology.
 */
int kb_ccl_mock_run(const char *module, const char *topo, int ws, int64_t n, const float *in,
                    float *out, kb_errbuf *eb);
/* The same with a root (kb_ccl_job_prepare_root) and, when icfg is non-NULL, that IPCQ
 * configuration instead of two slots of the largest message (e.g. small slots, to chunk). */
int kb_ccl_mock_run_opts(const char *module, const char *topo, int ws, int64_t n, int root,
                         const kb_ipcq_cfg *icfg, const float *in, float *out, kb_errbuf *eb);
/* The same for an entry that is in no table (a plugin's, before or without registering it);
 * topo NULL = the entry's topology. */
int kb_ccl_mock_run_algo(const kb_ccl_algo_impl *impl, const char *topo, int ws, int64_t n,
                         int root, const kb_ipcq_cfg *icfg, const float *in, float *out,
                         kb_errbuf *eb);

/* The topology an algorithm module normally runs on (its table entry's; ring_1d for a module
 * that is not registered). */
const char *kb_ccl_default_topo(const char *module);

/* ---- verification data ---- */

/*
 * The seeded inputs of a job with reduction op over ntiles ranks. Sum, max, min and avg:
 * kb_ccl_input. Prod: a product of ntiles grid values would leave f16's range, so element i
 * keeps its grid value only on tile i mod ntiles and is +-1 (the sign of its grid value) on
 * every other tile: the product is exact in every dtype and f32 order, still
 * position-dependent. x[j] for elements [i0, i0 + len) of tile `tile`, rounded to dt.
 */
void kb_ccl_input_op_span(float *x, uint32_t seed, int op, kb_dtype dt, int64_t ntiles,
                          int64_t tile, int64_t i0, int64_t len, int64_t n);
/* The reference of a reducing kind for op (root 0, as kb_ccl_ref_fn): all_reduce, reduce
 * and reduce_scatter with the op in place of the sum; avg = sum / ws. */
void kb_ccl_ref_op(kb_coll_kind kind, int op, const float *in, int ws, int64_t n, double *out);


/* Whether output element i of a collective of kind k depends only on the inputs' elements i:
 * all-reduce, reduce, broadcast and send/recv. */
int kb_ccl_positionwise(kb_coll_kind k);

/*
 * kb_ccl_verify of ntiles result tiles of a collective of kind `kind` whose inputs were
 * kb_ccl_inputs(seed, 0, ntiles, n), against `ref` of those inputs, with the same verdict bit
 * for bit, but without the ws*n inputs (f32) and reference (f64): for position-wise kinds both
 * are computed KB_CCL_VERIFY_BLOCK / ntiles columns at a time. Host memory beyond raw: the
 * reference rounded to dt (dt bytes per element, for the means), O(ntiles) and the blocks
 * (~12 * KB_CCL_VERIFY_BLOCK bytes). Other kinds build the whole arrays. Returns 1 (every tile
 * passed), 0, or KB_ERR_NOMEM.
 */
#define KB_CCL_VERIFY_BLOCK ((size_t)1 << 18)
/* Checks of 4 Mi elements and more split the column blocks over up to this many threads (one
 * per online CPU), merged in column order: the verdict does not depend on the split. */
#define KB_CCL_VERIFY_THREADS 16
int kb_ccl_verify_inputs(kb_dtype dt, const void *raw, kb_ccl_ref_fn ref, kb_coll_kind kind,
                         uint32_t seed, int ntiles, int64_t n, double acc_bound,
                         kb_ccl_verdict *v);
/* The same for a collective rooted at `root` (0 <= root < ntiles): tile t is checked as the
 * reference's tile (t - root) mod ntiles of the inputs relabelled the same way. */
int kb_ccl_verify_inputs_root(kb_dtype dt, const void *raw, kb_ccl_ref_fn ref,
                              kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                              double acc_bound, kb_ccl_verdict *v);
/*
 * kb_ccl_verify_inputs_root for a job of dtype dt and op: the inputs are
 * kb_ccl_input_op_span's (rounded to dt), the reference the entry's `ref` for sum and
 * kb_ccl_ref_op for the other ops of a reducing kind.
 */
int kb_ccl_verify_inputs_op(kb_dtype dt, int op, const void *raw, kb_ccl_ref_fn ref,
                            kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                            double acc_bound, kb_ccl_verdict *v);
/* The same with an order-emulating reference: `ord` replaces `ref` (and kb_ccl_ref_op) when
 * non-NULL (an entry's `ordered`); a root relabels the ranks as for `ref`. */
int kb_ccl_verify_inputs_ord(kb_dtype dt, int op, const void *raw, kb_ccl_ref_fn ref,
                             kb_ccl_ref_ord_fn ord, kb_coll_kind kind, uint32_t seed, int ntiles,
                             int64_t n, int root, double acc_bound, kb_ccl_verdict *v);
/*
 * The same check on the device that holds the result (kb_vquery.h), so that neither the data
 * nor the host's work grows with it: when the check is one a device answers, fills *q (the
 * seeded inputs of `seed`) and returns 1; else 0. Answered: f16 sums of at most 2^40
 * elements in all, with the entry's plain reference (kb_ccl_ref_<kind>) or its ring-ordered
 * one; an all-reduce (root 0, ordered kb_ccl_ref_ring_allreduce, tiles of at most 2^31
 * elements) as KB_VQ_CHECK, every other kind (all-gather, reduce-scatter, broadcast, reduce,
 * all-to-all, send/recv; ordered kb_ccl_ref_ring_reduce_scatter / _reduce; a root only for
 * broadcast and reduce; the chunked kinds with n a multiple of ntiles) as KB_VQ_COLL.
 */
int kb_ccl_vquery_of(kb_dtype dt, int op, kb_ccl_ref_fn ref, kb_ccl_ref_ord_fn ord,
                     kb_coll_kind kind, uint32_t seed, int ntiles, int64_t n, int root,
                     kb_vquery *q);
/* The verdict of q's result (kb_vq_tile per tile, then kb_vq_sums): the very verdict
 * kb_ccl_verify_inputs_ord gives for the same data. 1 when every tile passed, 0 when not,
 * KB_ERR_UNSUPPORTED when the result cannot give the means exactly (a value off the 1/128
 * grid, e.g. a NaN: check on the host; *v then holds all the rest), KB_ERR_NOMEM. */
int kb_ccl_verdict_of_query(const kb_vquery *q, const void *result, kb_ccl_verdict *v);
/* kb_ccl_input_acc_bound for op: the sum's; max, min and prod (kb_ccl_input_op_span's data)
 * are exact (0); avg adds 2^-18, the two f32 roundings of sum * (1/ws) (|avg| <= 16). */
double kb_ccl_input_acc_bound_op(kb_coll_kind k, int op, int64_t nterms);
/* The acc_bound kb_ccl_verify needs for a collective of kind k over nterms kb_ccl_inputs
 * tiles: 0 for kinds that only move data, and for reductions of up to
 * KB_CCL_INPUT_EXACT_TERMS tiles; else f32's summation bound (nterms-1) * 2^-24 * 16*nterms. */
double kb_ccl_input_acc_bound(kb_coll_kind k, int64_t nterms);

#endif
