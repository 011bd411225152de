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
 * The algorithm is the process group's (ccl.defaults.algorithm unless given), an entry with a
 * rank = SIP form (kb_dist_algo.h), which says how a rank's tensor is laid out:
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
#include "kbcl_ccl.h" /* the process group's public calls */

/* Calls of the collective `kind` (KB_COLL_ALLREDUCE, _ALLGATHER, _REDUCE_SCATTER, _BROADCAST,
 * _REDUCE, _ALLTOALL; _SENDRECV counts send/recv pairs) so far and the bytes they sent over
 * inter-SIP links (IPCQ payloads on the global directions), summed over every rank; 0 and 0
 * before init. */
void kb_dist_traffic(kb_ctx *ctx, kb_coll_kind kind, uint64_t *calls, uint64_t *inter_sip_bytes);

/*
 * kb_dist_all_reduce_shards as a stage of the rank's own launch (kb_launch_seq: a fused
 * layer), not an epoch: the same checks on this rank's tensor t (shards over the first PEs
 * of the SIP or whole cubes of them), and *st gets the lane kernel, its arguments and its grid.
 * Every rank of the group must run the same stage between the same collectives: the lane
 * rings' sends and receives pair them (a rank that does not ends the run in a deadlock
 * report). kb_dist_traffic counts the call once (rank 0's) with the bytes the lane rings
 * carry, 2 (ws - 1) / ws of each lane's block per rank; kb_dist_comm_time does not count it
 * (the stage's time is its launch's). 0 or an error.
 */
int kb_dist_all_reduce_shards_stage(kb_ctx *ctx, kb_tensor *t, kb_stage *st);
/*
 * Whether all_reduce_shards of k lanes of n f32 each over ws ranks takes the small form
 * (every block both ways round the lane ring, each PE adding them in rank order;
 * kb_dist_coll.c) rather than the ring's reduce-scatter + all-gather: when ws / 2 steps, each
 * a link latency (system.inter_sip_link.latency_ns + system.switch.overhead_ns) plus every
 * lane's whole block on the link, cost less than the ring's 2 (ws - 1) steps of one lane's
 * n / ws, half the lanes each way (the link's bandwidth is system.inter_sip_link's), and ws
 * is 2 to KB_DIST_SMALL_MAX. Latency-bound blocks take it (a decode step's rows), bandwidth-
 * bound ones the ring (a prefill's). The process group asks only while ccl.yaml's
 * small_lanes is true (the default; false: always the ring).
 */
int kb_dist_lanes_small(const kb_machine *m, int ws, int k, uint64_t n);
/* The intercube install plan (exposed for tests): links of PE 0 of every cube. */
int kb_dist_install_intercube(kb_ctx *ctx, const kb_ipcq_cfg *cfg);

#endif
