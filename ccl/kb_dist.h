/*
 * kb_dist — the distributed runtime in the rank = SIP model (a PyTorch-like process group).
 *
 * Host programs spawn one worker per rank (kb_spawn); each worker binds to its SIP
 * (kb_ctx_set_device(ctx, rank)), joins the process group and calls collectives on tensors
 * that live on its SIP. Every collective is an EPOCH BARRIER: each rank joins the current
 * epoch with its tensor; the last rank to arrive launches the collective kernel on every SIP
 * (one launch, per-SIP arguments) and all ranks resume when it has completed. A rank joining
 * an epoch it already joined, or a different collective than the other ranks, is an error.
 *
 * The algorithm is the process group's (ccl.defaults.algorithm unless given), an entry of the
 * rank = SIP table (kb_dist_algo.h), which says how a rank's tensor is laid out:
 *   intercube_allreduce     PE 0 of every cube; tensor (n_cubes x n) row-wise over cubes
 *                           (validator multi_pe_sip_local); ccl/kb_ccl_intercube.c.
 *   hierarchical_allreduce  every PE (mapper all_pes); tensor (n_cubes * n_pes * m x k)
 *                           row-wise over cubes and PEs: one m x k block per PE; the rank = PE
 *                           kernel of ccl/kb_ccl_algos.c.
 * all_reduce leaves in EVERY shard the sum over all shards of all ranks (for intercube: over
 * the cubes' rows and the ranks). Only SUM is supported. all_gather and reduce_scatter are
 * real algorithms over the same wiring (kb_dist_coll.c): a tree inside each SIP to a leader
 * PE and a ring (chain where the SIP grid does not wrap) among the leaders, each leader
 * sending (ws-1)/ws of the gathered / reduced matrix; an entry whose mapper is neither
 * all_pes nor pe0_all_cubes gets them built on its all_reduce (and no broadcast / reduce).
 * broadcast and reduce (SUM) take a root rank; all_to_all exchanges equal blocks of every
 * shard (all three real algorithms over the same wiring, and KB_ERR_UNSUPPORTED for another
 * mapper). barrier synchronises the ranks' host programs without device work.
 * send / recv are point to point, not epochs: a 2-party rendezvous keyed by (src, dst, the
 * pair's call count) whose second arriving rank runs one launch over the SIPs of the route
 * (src's tree, the leaders along the SIP grid, dst's tree); one transfer at a time per process
 * group; a half whose peer never comes ends the run in a deadlock report naming it.
 */
#ifndef KB_DIST_H
#define KB_DIST_H

#include "kb_ccl.h"
#include "kb_runtime.h"

typedef enum kb_dist_op { KB_DIST_SUM = 0, KB_DIST_PROD, KB_DIST_MAX, KB_DIST_MIN } kb_dist_op;

/* Every rank calls it once (a collective): builds the install plan and installs IPCQ
 * (timed). backend must be "ahbm"; algorithm NULL = ccl.defaults.algorithm. */
int kb_dist_init_process_group(kb_ctx *ctx, const char *backend, const char *algorithm);
int kb_dist_get_world_size(kb_ctx *ctx);   /* the SIP count; -1 before init */
int kb_dist_get_rank(kb_ctx *ctx);         /* the calling worker's rank; -1 outside workers */
const char *kb_dist_algorithm(kb_ctx *ctx); /* module of the process group, or NULL */

int kb_dist_all_reduce(kb_ctx *ctx, kb_tensor *t, kb_dist_op op);
int kb_dist_barrier(kb_ctx *ctx);
/* all_gather: `in` (m x k per rank, column-wise over the rank's S PEs: PE j holds columns
 * [j*k/S, (j+1)*k/S)) -> `out` (S*m x ws*k per rank, row-wise: every PE's m x ws*k block
 * holds the whole gathered matrix, rank r's columns at [r*k, (r+1)*k)). */
int kb_dist_all_gather(kb_ctx *ctx, kb_tensor *out, kb_tensor *in);
/* Inverse layout: `in` (wide, row-wise, one m x ws*k block per PE) is summed over every PE
 * of every rank; PE j of rank r keeps its k/S columns of the rank's k-column chunk of the
 * sum in `out` (m x k, column-wise over the PEs). `in` is staging: unspecified afterwards. */
int kb_dist_reduce_scatter(kb_ctx *ctx, kb_tensor *out, kb_tensor *in);

/* broadcast: every rank's tensor (the all_reduce layout) becomes rank root's, shard by shard
 * (shard j of every rank = shard j of root). reduce (SUM): every shard of root's tensor
 * becomes what all_reduce would leave there (the sum over every shard of every rank); the
 * other ranks' tensors are unchanged. Both run over the process group's wiring
 * (kb_dist_coll.c): shards stream up the root SIP's tree, along the leaders' chains (the
 * root's grid row, then every column) and down; reduce sums them the other way. */
int kb_dist_broadcast(kb_ctx *ctx, kb_tensor *t, int root);
int kb_dist_reduce(kb_ctx *ctx, kb_tensor *t, kb_dist_op op, int root);

/* all_to_all: `in` and `out` have the all_reduce layout (S shards of n elements, n a multiple
 * of ws, alike on every rank); every shard is ws blocks of n/ws elements, and block i of
 * shard s of rank r's `in` becomes block r of shard s of rank i's `out` (torch's
 * all_to_all_single on every shard). kb_dist_coll.c: the shards go up each SIP's tree to the
 * leader, the leaders exchange the blocks along the SIP grid's rows then columns (rings;
 * chains both ways where the grid does not wrap; ws - 1 steps on a ring of ws), and every
 * block goes down the tree to the PE that owns its shard. */
int kb_dist_all_to_all(kb_ctx *ctx, kb_tensor *out, kb_tensor *in);

/* Point-to-point (pipeline-parallel handoff): rank src's `t` (the all_reduce layout) is copied
 * into rank dst's `t` (same shape and dtype), shard j into shard j. Not an epoch: a 2-party
 * rendezvous keyed by (src, dst, n-th call of that pair); the rank that arrives second runs
 * one launch over the SIPs of the route (the tensor goes up src's tree, along the leaders of
 * the SIP grid — the row, then the column, shorter way round a ring — and down dst's tree)
 * and both return its code. One transfer runs at a time per process group (pairs matched
 * meanwhile wait). A half whose peer never comes ends the run as a deadlock whose report
 * names it ("kb_dist_recv from rank 0 (#0 of 0 -> 1): no matching kb_dist_send"). */
int kb_dist_send(kb_ctx *ctx, kb_tensor *t, int dst);
int kb_dist_recv(kb_ctx *ctx, kb_tensor *t, int src);

/* The DPPolicy a rank's tensor must have for the process group's algorithm. */
kb_dp_policy kb_dist_policy(kb_ctx *ctx);
/* Number of shards (participating PEs) per rank for the process group's algorithm. */
int kb_dist_shards_per_rank(kb_ctx *ctx);

/* Seconds-free statistics: simulated time spent inside collectives (from the last rank's
 * arrival) and send/recv transfers, summed per call. */
kb_time kb_dist_comm_time(kb_ctx *ctx);
/* Calls of the collective `kind` (KB_COLL_ALLREDUCE, _ALLGATHER, _REDUCE_SCATTER, _BROADCAST,
 * _REDUCE, _ALLTOALL; _SENDRECV counts send/recv pairs) so far and the bytes they sent over
 * inter-SIP links (IPCQ payloads on the global directions), summed over every rank; 0 and 0
 * before init. */
void kb_dist_traffic(kb_ctx *ctx, kb_coll_kind kind, uint64_t *calls, uint64_t *inter_sip_bytes);

/* The intercube install plan (exposed for tests): links of PE 0 of every cube. */
int kb_dist_install_intercube(kb_ctx *ctx, const kb_ipcq_cfg *cfg);

#endif
