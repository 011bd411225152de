/*
 * kb_ccl_lanes — the rank = SIP form of the rank = PE collective algorithms (every built-in
 * module without a rank = SIP form of its own, and a plugin's): one rank per SIP, the rank's
 * buffer spread over every PE of its SIP in lanes. Lane l (the SIP's l-th PE in grid order,
 * cube-major) holds a slice of the buffer — the same slice of every chunk for the kinds whose
 * buffer is ws chunks (all_gather, reduce_scatter, all_to_all) — and runs the algorithm's own
 * kernel, unchanged, among the ws PEs of lane l (one per SIP) over the algorithm's topology
 * wired between SIP ranks. The lanes run side by side and share the inter-SIP links: NCCL's
 * channels, one per PE. A wrapper kernel shows the algorithm a world of ws ranks
 * (tl_program_id = (0, 0, sip), kb_ccl_rank = the SIP) and its lane's tile; so the algorithm
 * must take its rank and tile only from kb_ccl_rank / kb_ccl_my_tile and its arguments
 * (every built-in but hierarchical_allreduce, which has its own rank = SIP form, does).
 *
 * Split: count elements per rank (and chunk) go to the lanes as evenly as possible, the first
 * count mod lanes lanes one more; a lane with none sits the collective out (a count below the
 * PE count leaves most lanes empty — legal, as empty chunks are). Limits: the topology's
 * rings per PE (full_mesh: ws - 1 peer directions per lane PE, whose rings must fit its IPCQ
 * area) and the algorithm's own check (mesh: a square number of SIPs), with their messages.
 */
#ifndef KB_CCL_LANES_H
#define KB_CCL_LANES_H

#include "kb_ccl.h"

/* A collective in lanes. Owner: the caller (the tensors belong to the context). */
typedef struct kb_ccl_lanes {
    const kb_ccl_algo_impl *impl;
    char name[64];
    char topo[64];
    int ws;              /* ranks = SIPs of the machine */
    int lanes;           /* PEs per SIP, one lane (a row of the tensors) each */
    int channels;        /* lanes that carry the collective: the first ones in grid order */
    int chunks;          /* kb_coll_tile_ranks(kind, ws): chunks of a rank's buffer */
    int root, op;
    kb_dtype dtype;
    int64_t count;       /* elements per rank and chunk (nccl-tests' count) */
    int64_t width;       /* columns of a lane's row: chunks x the largest lane share */
    kb_ipcq_cfg icfg;
    kb_tensor *t[KB_MAX_GSIPS]; /* SIP s: one row per PE (lane), width columns */
    kb_kargs args[KB_MAX_GSIPS];
} kb_ccl_lanes;

/* Lane l's share of count elements over `lanes` lanes: elements [*off, *off + share) of every
 * chunk (off may be NULL). */
int64_t kb_ccl_lane_share(int64_t count, int lanes, int l, int64_t *off);

/*
 * From a host program: checks the world (ws = the machine's SIPs) for the algorithm, creates
 * and fills every SIP's lanes with kb_ccl_input_op_span's seeded values of the rank's logical
 * buffer (computed only when the context records), and installs IPCQ (timed). `o` gives the
 * root, dtype and op as kb_ccl_job_prepare_opts takes them, with the same errors. channels
 * (ccl.yaml `channels`; 0 = every PE) limits the lanes that carry the collective to the SIP's
 * first that many PEs in grid order, NCCL's channels; the others sit it out.
 */
int kb_ccl_lanes_prepare(kb_ctx *ctx, kb_ccl_lanes *job, const kb_ccl_algo_impl *impl,
                         const char *name, const char *topo, int64_t count, int channels,
                         const kb_ccl_job_opts *o, const kb_ipcq_cfg *icfg);
/* Launches the algorithm on every lane of every SIP and waits for it. */
int kb_ccl_lanes_launch(kb_ctx *ctx, kb_ccl_lanes *job);
/* Every rank's logical buffer (chunks x count elements of the dtype, rank-major: what the
 * rank = PE job of the same algorithm would hold) as raw bytes. */
int kb_ccl_lanes_read_raw(kb_ctx *ctx, kb_ccl_lanes *job, void *raw);

/*
 * Checks a lane run of an algorithm whose reference emulates its order (the entry's
 * `ordered`): the order depends on the tile length, so each lane is checked as the rank = PE
 * collective it ran — its inputs rebuilt from the seeded logical buffers, its outputs taken
 * from `raw` (every rank's logical buffer, kb_ccl_lanes_read_raw) — and the verdicts merged
 * (a rank passes when every lane of it does; first_bad_elem is an index of the logical
 * buffer). Returns 1 (every rank passed), 0, or KB_ERR_NOMEM.
 */
int kb_ccl_lanes_verify_ordered(const kb_ccl_lanes *job, const void *raw, double acc_bound,
                                kb_ccl_verdict *v);

#endif
