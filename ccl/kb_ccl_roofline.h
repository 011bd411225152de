/*
 * kb_ccl_roofline — the bandwidth-optimal lower bound of a collective over where its ranks
 * are (kb_roofline.h's model; docs/decoder.md, "Roofline", derives each case).
 *
 * For a kind, n ranks on the PEs gid[0..n) and `bytes` per rank (nccl-tests' count in bytes:
 * the buffer of an all_reduce, broadcast, reduce or sendrecv, the chunk of an all_gather,
 * reduce_scatter or all_to_all), it adds to an accumulator what any algorithm must do:
 *  - HBM: each rank's tile lives in its PE's slice; what must be read from it and written to
 *    it (all_reduce B and B; all_gather c and (n-1)c; reduce_scatter nc and c; all_to_all
 *    (n-1)c each way; broadcast: the root reads B, the others write B; reduce: the others
 *    read B, the root reads and writes B; sendrecv B and B);
 *  - per level of links (SIPs, cubes, PEs), with m groups holding ranks and a group of k of
 *    the n ranks: what must cross that group's edge (all_reduce B; all_gather and
 *    reduce_scatter max(k, n-k) c; all_to_all k(n-k) c; broadcast and reduce B; sendrecv, in
 *    which rank r's buffer goes to rank r+1: B per rank whose neighbour is outside, either
 *    way) and what must cross the level in all (all_reduce 2(m-1)B, Patarasuk and Yuan's
 *    bound; all_gather and reduce_scatter n(m-1)c; all_to_all the sum of the groups'
 *    k(n-k)c; broadcast and reduce (m-1)B; sendrecv the sum of the cuts);
 *  - the hops data must travel at each level: the farthest pair of ranks (the root and the
 *    farthest rank for the rooted kinds; neighbours for sendrecv), as one step.
 * One rank (or nothing to move) adds nothing. Reductions' arithmetic is not counted.
 */
#ifndef KB_CCL_ROOFLINE_H
#define KB_CCL_ROOFLINE_H

#include "kb_ccl.h"
#include "kb_ccl_lanes.h"
#include "kb_roofline.h"

/* One collective, step `step` of the accumulator's dependent chain (collectives with the same
 * step run side by side). 0 or KB_ERR_NOMEM / KB_ERR_INVAL (message in eb). */
int kb_ccl_roofline_add(kb_roofline_acc *a, kb_coll_kind kind, int n, const int *gid, int root,
                        double bytes, int step, kb_errbuf *eb);

/* A rank = PE job (kb_ccl_job_prepare's ranks, tiles and root). */
int kb_ccl_roofline_job(kb_roofline_acc *a, const kb_ccl_job *job, kb_errbuf *eb);
/* A rank = SIP collective in lanes: lane l of every SIP is one collective of its share. */
int kb_ccl_roofline_lanes(kb_roofline_acc *a, const kb_ccl_lanes *job, kb_errbuf *eb);
/* A rank = SIP process group's collective over tensors t[0..ws) (one per rank, the same
 * shards each): every shard is one rank of the collective, in rank-major order, with
 * `bytes` per shard. */
int kb_ccl_roofline_shards(kb_roofline_acc *a, kb_coll_kind kind, int ws,
                           kb_tensor *const *t, double bytes, kb_errbuf *eb);

#endif
