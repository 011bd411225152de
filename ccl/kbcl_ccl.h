/*
 * kbcl_ccl — kbcl's public collective API (docs/api.md, docs/plugins.md): what a plugin needs
 * to write a collective algorithm and register it. A kernel's side of IPCQ (the credit-based
 * queues that carry messages between PEs: tl_send, tl_recv and their posted forms), the
 * collective kinds and reduction ops, the host references results are checked against, the
 * arguments every algorithm's kernel receives and the helpers a ring or chain step is built
 * from, and the registry entry, kb_ccl_algo_impl: one algorithm, placed at rank = PE (one rank
 * per PE) and at rank = SIP (one rank per SIP: its own process-group form, or its rank = PE
 * kernel in lanes over every PE of each SIP, docs/collectives.md section 3).
 *
 * Messages of any size travel as slot-sized chunks through each queue's credit window; a
 * send blocks while the peer's ring is full. Misuse (an unwired direction, a receive that
 * names another size than the message) stops the run with a message naming the PE and the
 * direction. Limits: a rank = SIP form's install, layout and validator hooks take kbcl's
 * internal machine (kb_machine: opaque here) and its IPCQ install plans, so a plugin's entry
 * uses a built-in form (kb_ccl_sip_intercube, kb_ccl_sip_hierarchical) or none; a new
 * algorithm is written as a rank = PE kernel, which runs in both rank models.
 */
#ifndef KBCL_CCL_H
#define KBCL_CCL_H

#include <assert.h>
#include <stdint.h>

#include "kbcl_runtime.h"
#include "kbcl_tl.h"

typedef struct kb_ccl_geom kb_ccl_geom;   /* the machine geometry a check sees (opaque) */
typedef struct kb_machine kb_machine;     /* the simulated machine (opaque) */

/* ---- the kernel side of IPCQ: a PE's queues to its peers ---- */

/* A direction of a PE's queue pairs; which ones are wired is the install plan's topology. */
typedef enum kb_dir {
    KB_DIR_E = 0, KB_DIR_W, KB_DIR_N, KB_DIR_S,
    KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W, KB_DIR_GLOBAL_N, KB_DIR_GLOBAL_S,
    KB_DIR_PARENT, KB_DIR_CHILD_LEFT, KB_DIR_CHILD_RIGHT,
    KB_NDIRS
} kb_dir;

/* Peer directions: KB_DIR_PEER(k), k < KB_IPCQ_MAX_PEER_DIRS (a queue pair keeps its
 * direction in 16 bits); KB_IPCQ_MAX_DIRS bounds every direction. */
#define KB_DIR_PEER(k) ((kb_dir)(KB_NDIRS + (k)))
/* No direction: a kernel's sentinel for "no parent" / "no output" (never wired). */
#define KB_DIR_NONE ((kb_dir)-1)

/* ---- kernel side ---- */

typedef struct kb_ipcq_req kb_ipcq_req;

KB_API void tl_send(kb_tl *tl, kb_dir dir, kb_val v);
/* The same send, posted: the kernel goes on once its last chunk is issued (after the call's
 * issue cost and any wait for credits) and gets the time that chunk lands at the peer, when
 * the value has been read (NCCL's posted put). The value must stay valid until then in
 * Phase 1 terms: scratch freed earlier may be reused, which Phase 2 replays in start order. */
KB_API int64_t tl_send_async(kb_tl *tl, kb_dir dir, kb_val v);
KB_API kb_val tl_recv(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt);
/* Receives straight into the tensor memory at va (no scratch value). */
KB_API void tl_recv_into(kb_tl *tl, kb_dir dir, kb_va va, kb_shape s, kb_dtype dt);
KB_API kb_ipcq_req *tl_recv_async(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt);
/* The same, straight into the tensor memory at va; tl_wait returns an empty value. */
KB_API kb_ipcq_req *tl_recv_into_async(kb_tl *tl, kb_dir dir, kb_va va, kb_shape s, kb_dtype dt);
KB_API kb_val tl_wait(kb_tl *tl, kb_ipcq_req *req);
/*
 * A receive read in place: when the message fits one slot and the ring is in this PE's own
 * TCM, tl_wait returns a value that IS the receive slot (no copy-out: the wait ends when the
 * data are there, at max(post, arrival)), and the slot stays the kernel's until
 * tl_recv_release hands it back (its credit leaves then). Compute ops read it like any local
 * value; never tl_free it, and release a direction's views in the order they were received.
 * Otherwise (a longer message, a ring in HBM or SRAM) it is tl_recv_async, and
 * tl_recv_release frees the copy. What NCCL's reduce-from-the-receive-buffer is here.
 */
KB_API kb_ipcq_req *tl_recv_view_async(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt);
KB_API void tl_recv_release(kb_tl *tl, kb_dir dir, kb_val v);


/* Bytes per slot of the queue pair on direction d of the kernel's PE (stops the run when d
 * is not wired): a message longer than this travels as several chunks. */
KB_API uint64_t tl_slot_size(kb_tl *tl, kb_dir d);
/* Slots of the peer's ring that a send on d may fill ahead of the peer's receives (n_slots):
 * a kernel that holds received slots (views) while it sends must not send more than this
 * ahead of what its neighbour can take in without it. */
KB_API uint32_t tl_slot_count(kb_tl *tl, kb_dir d);

/* The context's slot size (one IPCQ configuration per context), 0 before any install: what a
 * ring step compares its messages with, without a direction lookup. */
KB_API uint64_t kb_ipcq_slot_size(kb_ctx *ctx);
/* The context's kb_ipcq_cfg.posted (0 before any install). */
KB_API int kb_ipcq_posted(kb_ctx *ctx);

/* An IPCQ configuration (ccl.yaml's ipcq keys, docs/collectives.md): what an install plan
 * wires every queue pair with. */
typedef struct kb_ipcq_cfg {
    int n_slots;              /* >= 1 */
    uint64_t slot_size;       /* bytes per slot */
    kb_mem_kind buffer_kind;  /* where rx rings live */
    int backpressure;         /* 0 = never block on credits (unsafe; for experiments) */
    int posted;               /* ccl.yaml posted_sends: streamed kernels post their sends
                               * (kb_ccl_send) and keep a window of slices in flight */
} kb_ipcq_cfg;

/* One directed link of an install: `pe` sends on `dir` into `peer`'s ring of `peer_dir`. */
/* ---- collectives ---- */

/*
 * What a collective computes. The kind decides the host reference an algorithm is checked
 * against and nccl-tests' bus-bandwidth factor.
 *
 * A rank's tile (n elements) is its buffer as nccl-tests sizes it (size / element):
 * all_reduce, broadcast, reduce and sendrecv work on n = count elements in place; all_gather,
 * reduce_scatter and all_to_all on n = ws * count (kb_coll_tile_ranks), chunk c being
 * elements [c * count, (c + 1) * count). In place as NCCL's in-place calls: all_gather's input
 * is the rank's own chunk r (the other chunks are overwritten); reduce_scatter leaves the sum
 * of chunk r in chunk r and every other chunk untouched; all_to_all sends chunk c to rank c
 * and receives rank c's chunk r into chunk c. reduce leaves the sum on the root and every
 * other tile untouched.
 */
typedef enum kb_coll_kind {
    KB_COLL_ALLREDUCE = 0,
    KB_COLL_ALLGATHER,
    KB_COLL_REDUCE_SCATTER,
    KB_COLL_BROADCAST,
    KB_COLL_REDUCE,
    KB_COLL_ALLTOALL,
    KB_COLL_SENDRECV,
    KB_COLL_NKINDS
} kb_coll_kind;

/* "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
 * "sendrecv" (nccl-tests' names); "?" for anything else. */
KB_API const char *kb_coll_name(kb_coll_kind k);
/* Whether a kind has a root rank (broadcast, reduce). */
KB_API int kb_coll_rooted(kb_coll_kind k);
/* Tile elements per element of nccl-tests' count: ws for all_gather, reduce_scatter and
 * all_to_all, else 1. */
KB_API int kb_coll_tile_ranks(kb_coll_kind k, int ws);

/*
 * nccl-tests' bus-bandwidth factor busbw / algbw for a world of ws ranks: 2(ws-1)/ws for
 * all-reduce; (ws-1)/ws for all-gather, reduce-scatter and all-to-all; 1 for broadcast,
 * reduce and send/recv. It turns algbw into the per-link traffic of an optimal algorithm, so
 * busbw is comparable across world sizes. 0 for ws < 1 or an unknown kind.
 */
KB_API double kb_coll_busbw_factor(kb_coll_kind k, int ws);

/*
 * A host reference: given every rank's input tile (ws*n values, rank-major), writes every
 * rank's expected output tile (ws*n, rank-major) in double. With kb_ccl_inputs' data every
 * value it writes is exact (see there); the caller rounds to the tile dtype. For the
 * position-wise kinds (kb_ccl_positionwise) element i of every output tile must depend only
 * on element i of the input tiles: verification then runs it on blocks of columns.
 */
typedef void (*kb_ccl_ref_fn)(const float *in, int ws, int64_t n, double *out);
/* The references, for root 0 (a rooted check relabels the ranks, kb_ccl_verify_inputs_root):
 * all_reduce: the elementwise sum over ranks in every tile; shift_east (sendrecv): every rank
 * gets its west neighbour's tile (rank r-1 mod ws; ws < 2 keeps its own); all_gather: chunk c
 * of every tile = chunk c of rank c's; reduce_scatter: chunk r of rank r = the sum of every
 * rank's chunk r, the rest unchanged; all_to_all: chunk c of rank r = chunk r of rank c;
 * broadcast: every tile = rank 0's; reduce: rank 0's tile = the sum, the rest unchanged. The
 * chunked kinds need n to be a multiple of ws. */
KB_API void kb_ccl_ref_allreduce(const float *in, int ws, int64_t n, double *out);
KB_API void kb_ccl_ref_shift_east(const float *in, int ws, int64_t n, double *out);
KB_API void kb_ccl_ref_allgather(const float *in, int ws, int64_t n, double *out);
KB_API void kb_ccl_ref_reduce_scatter(const float *in, int ws, int64_t n, double *out);
KB_API void kb_ccl_ref_alltoall(const float *in, int ws, int64_t n, double *out);
KB_API void kb_ccl_ref_broadcast(const float *in, int ws, int64_t n, double *out);
KB_API void kb_ccl_ref_reduce(const float *in, int ws, int64_t n, double *out);

/*
 * A reference that emulates an algorithm's order of operations, for kernels whose partial
 * results travel rounded to the tile's dtype (so the result depends on which rank starts a
 * chain and in which order the ranks combine): given columns [i0, i0 + nb) of every rank's
 * input tile of n elements (ws rows of nb values, already rounded to dt), writes those columns
 * of every rank's expected output tile (ws rows of nb) for dtype dt and op (kb_ccl_op), each
 * value what the kernel computes before its final rounding to dt (avg: the chain's sum / ws).
 * A kind that is not position-wise is called once with i0 = 0, nb = n.
 */
typedef void (*kb_ccl_ref_ord_fn)(const float *in, int ws, int64_t n, int64_t i0, int64_t nb,
                                  kb_dtype dt, int op, double *out);
/* ring_rsag_allreduce: chunk c (kb_ccl_chunk of the tile) is combined along c, c+1, ...,
 * c-1 with a rounding to dt after every hop but the last, then gathered to every rank. */
KB_API void kb_ccl_ref_ring_allreduce(const float *in, int ws, int64_t n, int64_t i0, int64_t nb,
                               kb_dtype dt, int op, double *out);
/* ring_reducescatter: chunk c (count = n / ws elements) along c+1, c+2, ..., c, ending in
 * rank c's chunk c; every other chunk unchanged. */
/* ring_reduce (root 0; a rooted check relabels the ranks): the chain 1, 2, ..., ws-1, 0 in
 * rank 0's tile, every other tile unchanged. */
KB_API void kb_ccl_ref_ring_reduce(const float *in, int ws, int64_t n, int64_t i0, int64_t nb,
                            kb_dtype dt, int op, double *out);
KB_API void kb_ccl_ref_ring_reduce_scatter(const float *in, int ws, int64_t n, int64_t i0,
                                    int64_t nb, kb_dtype dt, int op, double *out);

/* What a rank = SIP form's argument builder knows of one rank's launch. */
typedef struct kb_dist_launch {
    kb_tensor *t;      /* the rank's tensor, already validated */
    int rank, ws;      /* rank = its SIP; world size = the SIP count */
    int64_t n;         /* elements per shard */
    int root_cube;     /* ccl.yaml root_cube, else the SIP's last cube */
} kb_dist_launch;

/*
 * An algorithm's own rank = SIP form: one rank per SIP, a rank's tensor spread over several
 * PEs of its SIP, run by the process group (init_process_group, kb_dist_*) and the collective
 * bench at world_size 0. An algorithm without one runs at rank = SIP in lanes (its rank = PE
 * kernel among the ws PEs of each lane, docs/collectives.md section 3). Its hooks take kbcl's
 * machine and IPCQ install plans, which are not public: a plugin's entry points at a built-in
 * form (kb_ccl_sip_intercube, kb_ccl_sip_hierarchical) or has none.
 */
typedef struct kb_ccl_sip_form {
    const char *summary;   /* what the form does, for `kbcl list` */
    /* which PEs of a rank take part (the seed's mapper) and the layout check its tensor must
     * pass (validator), by name, for `kbcl list` and messages */
    const char *mapper, *validator;
    kb_kernel_fn kernel;
    /* Installs IPCQ for a world of ws ranks, one per SIP (timed; once per context). */
    int (*install)(kb_ctx *ctx, const kb_ipcq_cfg *cfg, int ws);
    /* The DPPolicy and the shard (participating PE) count of a rank's tensor. */
    kb_dp_policy (*policy)(const kb_machine *m);
    int (*shards)(const kb_machine *m);
    /* Layout validator over every rank's tensor (t[ws]); `what` prefixes the message. */
    int (*validate)(kb_ctx *ctx, kb_tensor *const *t, int ws, const char *what);
    /* Fills one rank's (zeroed) kernel arguments: the kernel's own struct (KB_KARGS_PUT,
     * as kb_ccl_intercube.c does) or, for a rank = PE kernel, the KB_CCL_ARG_* slots. */
    int (*args)(kb_ctx *ctx, const kb_dist_launch *l, kb_kargs *a);
    /* The launch grid per SIP (PEs per cube, cubes, SIPs). */
    kb_grid (*grid)(const kb_machine *m, int ws);
    /* Host reference over every shard of every rank as one tile each (rank-major). */
    kb_ccl_ref_fn reference;
} kb_ccl_sip_form;

/* The built-in forms, for a plugin's entry that runs one under a name of its own. */
extern KB_API const kb_ccl_sip_form kb_ccl_sip_intercube;     /* kb_ccl_intercube.c */
extern KB_API const kb_ccl_sip_form kb_ccl_sip_hierarchical;  /* kb_ccl_algos.c */

/*
 * A collective algorithm: the one registry entry type, built-in or a plugin's. It is written
 * against ranks; where the ranks live is a placement: rank = PE (`kernel`, one rank per PE of
 * a ccl.yaml world_size > 0) and rank = SIP (its own form `sip`, or, without one, `kernel`
 * in lanes). An entry has a rank = PE kernel, a rank = SIP form, or both
 * (hierarchical_allreduce); the fields from topology to ordered describe the rank = PE
 * placement and are unused without a kernel.
 */
typedef struct kb_ccl_algo_impl {
    kb_entry_head head;          /* a plugin's: KB_CCL_ALGO_HEAD (kbcl_base.h) */
    const char *module;          /* ccl.yaml `module` */
    const char *summary;
    kb_coll_kind kind;
    const char *topology;        /* the topology it usually runs on (kb_ccl_default_topo) */
    kb_kernel_fn kernel;
    /* Checks the world size and tile length (n elements) for this algorithm; NULL = any.
     * KB_ERR_CONFIG with a message in eb. */
    int (*check)(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb);
    /* Largest message in bytes for a tile of n f16 elements on ws ranks (slot size check). */
    uint64_t (*max_msg_bytes)(int64_t n, int ws);
    /* Every rank's expected output tile from every rank's input tile. */
    kb_ccl_ref_fn reference;
    /* KB_CCL_* flags below; 0 for none. */
    unsigned flags;
    /* Optional, appended in version 1 (a plugin compiled before reads NULL): the
     * order-emulating reference, used instead of `reference` (and of kb_ccl_ref_op) when set;
     * NULL for kernels whose result does not depend on the order (partials in f32 on exact
     * data, or no reduction). */
    kb_ccl_ref_ord_fn ordered;
    /* Optional, appended in version 1: the algorithm's own rank = SIP form; NULL = it runs at
     * rank = SIP in lanes. */
    const kb_ccl_sip_form *sip;
} kb_ccl_algo_impl;

/* The entry's version, and its head for a plugin's designated initialiser:
 *   static const kb_ccl_algo_impl mine = { .head = KB_CCL_ALGO_HEAD, .module = "mine", ... }; */
#define KB_CCL_ALGO_VERSION 1u
#define KB_CCL_ALGO_HEAD { (uint32_t)sizeof(kb_ccl_algo_impl), KB_CCL_ALGO_VERSION }

/*
 * The algorithm runs on any world size of the rank = PE layout, partial cubes and a partial
 * last SIP included (kb_ccl_layout_linear): its topology is one that takes any world size
 * (ring_1d, ring_1d_unidir, tree_binary, none, full_mesh, hypercube, double_binary_tree,
 * hierarchical_3level; mesh_2d's own limit is a square). Its kernel is launched over whole cubes, so
 * the PEs of the last cube past the last rank run it too: it must return at once on them
 * (kb_ccl_idle). Without the flag a world that spans cubes must fill whole cubes (and whole
 * SIPs beyond one SIP), as kb_ccl_layout_whole requires.
 */
#define KB_CCL_ANY_WORLD 1u
/*
 * The kernel honours KB_CCL_ARG_DTYPE (tiles of f16, bf16 or f32) and, for a reducing kind
 * (all_reduce, reduce_scatter, reduce), KB_CCL_ARG_OP (kb_ccl_op). Without the flag a job
 * with another dtype than f16 or another op than sum is refused (kb_ccl_job_prepare_opts).
 */
#define KB_CCL_TYPED 2u

/*
 * Reduction operators, nccl-tests' --op (NCCL's ncclRedOp_t): sum, prod, max, min, avg. Every
 * reducing kernel accumulates in f32 whatever the tile dtype (f16 and bf16 values are exact in
 * f32) and rounds once when it stores; avg is the sum, scaled by 1/ws once at the end, as
 * NCCL's ncclAvg for floating types.
 */
typedef enum kb_ccl_op {
    KB_CCL_OP_SUM = 0, KB_CCL_OP_PROD, KB_CCL_OP_MAX, KB_CCL_OP_MIN, KB_CCL_OP_AVG, KB_CCL_NOPS
} kb_ccl_op;
/* "sum", "prod", "max", "min", "avg"; "?" otherwise. */
KB_API const char *kb_ccl_op_name(int op);
/* The op of a name, -1 when unknown. */
KB_API int kb_ccl_op_from_name(const char *name);

/* ---- writing an algorithm's kernel ---- */

/*
 * Kernel arguments of every rank = PE algorithm: ptr[KB_CCL_PTR_TILE] = the SIP's tile tensor
 * (one n-element f16 tile per rank, rank-local order), i[KB_CCL_ARG_N] = n elements per tile,
 * i[1] = world size, i[2] = PEs per cube, i[3] = cubes per SIP used, i[4] = SIPs used. They
 * are indexed by name rather than typed (kb_kargs) because every algorithm and plugin kernel
 * reads the same ones, and kb_ccl_lanes.c rewrites them for a lane.
 */
enum { KB_CCL_PTR_TILE = 0 };
enum { KB_CCL_ARG_N = 0, KB_CCL_ARG_WS, KB_CCL_ARG_PES, KB_CCL_ARG_CUBES, KB_CCL_ARG_SIPS,
       KB_CCL_ARG_DTYPE /* tile dtype (kb_dtype; 0 = f16); honoured by hierarchical_allreduce */,
       KB_CCL_ARG_ROOT /* the root rank of a rooted collective (broadcast, reduce), < ws */,
       KB_CCL_ARG_OP /* the reduction (kb_ccl_op; 0 = sum); honoured by KB_CCL_TYPED kernels */,
       KB_CCL_ARG_FLAGS /* KB_CCL_FLAG_*: how the world is wired */ };
/* The world is wired by hierarchical_lanes (kb_ccl_job_launch sets it from the job's topology):
 * hierarchical_allreduce runs its lanes form, and its chains visit the cubes in
 * kb_topo_cube_ring's order. */
#define KB_CCL_FLAG_LANES 1

/* Combines two partial results with op (f32 out): add for sum and avg, mul, maximum,
 * minimum. */
static inline kb_val kb_ccl_combine(kb_tl *tl, int op, kb_val a, kb_val b)
{
    switch (op) {
    case KB_CCL_OP_PROD:
        return tl_mul(tl, a, b);
    case KB_CCL_OP_MAX:
        return tl_maximum(tl, a, b);
    case KB_CCL_OP_MIN:
        return tl_minimum(tl, a, b);
    default:
        return tl_add(tl, a, b);
    }
}

/* kb_ccl_combine with the result written in dtype dt (tl_binary_as: one pass, rounded to
 * dt as it is written): a partial result that travels on in the buffer's dtype, as NCCL's
 * ring reduce-scatter sends it (f32: the same as kb_ccl_combine). */
static inline kb_val kb_ccl_combine_as(kb_tl *tl, int op, kb_val a, kb_val b, kb_dtype dt)
{
    if (dt == KB_F32)
        return kb_ccl_combine(tl, op, a, b);
    kb_binop o = op == KB_CCL_OP_PROD ? KB_BIN_MUL
                 : op == KB_CCL_OP_MAX ? KB_BIN_MAX
                 : op == KB_CCL_OP_MIN ? KB_BIN_MIN
                                       : KB_BIN_ADD;
    return tl_binary_as(tl, o, a, b, dt);
}

/* A complete reduction before it is stored: avg scales it by 1/ws (v is released, a new
 * value returned); every other op returns v. */
static inline kb_val kb_ccl_finish(kb_tl *tl, int op, kb_val v, int64_t ws)
{
    if (op != KB_CCL_OP_AVG)
        return v;
    assert(ws >= 1);
    kb_val s = tl_scale(tl, v, 1.0f / (float)ws, 0.0f);
    if (v.scratch)
        tl_free(tl, v);
    return s;
}

/* A kernel's rank and the VA of its own tile. */
KB_API int kb_ccl_rank(kb_tl *tl);
KB_API kb_va kb_ccl_my_tile(kb_tl *tl, const kb_kargs *a);
/* 1 on a PE of the launch grid that holds no rank (past the last rank of a KB_CCL_ANY_WORLD
 * layout): the kernel returns at once there. */
static inline int kb_ccl_idle(kb_tl *tl, const kb_kargs *a)
{
    return kb_ccl_rank(tl) >= a->i[KB_CCL_ARG_WS];
}

/*
 * One exchange of a ring step: send v on sd, release `drop` (a scratch value the step no
 * longer needs; a zero kb_val for none), receive shape s of dt from rd. When both messages
 * fit one slot this is send, free, receive — the sequence the algorithms always issued, so
 * their timing is unchanged. When either is longer, the receive is posted first: every rank
 * of a ring sends before it receives, and a send that streams more chunks than the slot
 * window holds needs the neighbour's receive to be consuming them already (blocking sends
 * around a ring would deadlock). Inline: in a ring's inner loop the test folds into the
 * caller's constants (the slot size is one per context; send and receive check directions).
 */
static inline int kb_ccl__fits(kb_tl *tl, kb_val v, kb_shape s, kb_dtype dt)
{
    uint64_t slot = kb_ipcq_slot_size(tl_ctx(tl));
    uint64_t out = (uint64_t)v.rows * v.cols * kb_dtype_size((kb_dtype)v.dtype);
    uint64_t in = (uint64_t)s.rows * s.cols * kb_dtype_size(dt);
    return out <= slot && in <= slot;
}

static inline kb_val kb_ccl_sendrecv(kb_tl *tl, kb_dir sd, kb_val v, kb_val drop, kb_dir rd,
                                     kb_shape s, kb_dtype dt)
{
    if (kb_ccl__fits(tl, v, s, dt)) {
        tl_send(tl, sd, v);
        if (drop.scratch)
            tl_free(tl, drop);
        return tl_recv(tl, rd, s, dt);
    }
    kb_ipcq_req *r = tl_recv_async(tl, rd, s, dt);
    tl_send(tl, sd, v);
    if (drop.scratch)
        tl_free(tl, drop);
    return tl_wait(tl, r);
}

/* The same, receiving straight into the tensor memory at va. */
static inline void kb_ccl_sendrecv_into(kb_tl *tl, kb_dir sd, kb_val v, kb_dir rd, kb_va va,
                                        kb_shape s, kb_dtype dt)
{
    if (kb_ccl__fits(tl, v, s, dt)) {
        tl_send(tl, sd, v);
        tl_recv_into(tl, rd, va, s, dt);
        return;
    }
    kb_ipcq_req *r = tl_recv_into_async(tl, rd, va, s, dt);
    tl_send(tl, sd, v);
    tl_wait(tl, r);
}

/* Column slice [c0, c0 + n) of a one-row value (a view: same memory, not freeable). */
static inline kb_val kb_val_slice(kb_val v, uint32_t c0, uint32_t n)
{
    kb_val s = v;
    assert((uint64_t)c0 + n <= v.cols);
    s.pa = v.pa + (uint64_t)c0 * kb_dtype_size((kb_dtype)v.dtype);
    s.cols = n;
    s.scratch = 0;
    return s;
}


/* ---- streaming a tile that does not fit one message ---- */

/*
 * Past one slot per message, an algorithm that keeps its whole tile (and f32 sums of it) in
 * PE scratch stops at a few MiB per rank. The streamed forms keep the tile in HBM and work on
 * it a block at a time: a block is whole slot-sized slices of f32 (slot / 4 elements each),
 * at most KB_CCL_STREAM_BYTES of f32, so scratch holds a small constant number of blocks
 * whatever the tile's size, and every block's messages still travel as slot-sized chunks.
 */
#define KB_CCL_STREAM_BYTES ((uint64_t)1 << 20)

/*
 * Elements per slice of a pipelined step that moves `chunk` elements of es bytes through a
 * queue of `window` slots of `slot` bytes: one slot's worth, or, when a chunk would fill fewer
 * than `window` slots, chunk / window (at least KB_CCL_MIN_SLICE_BYTES), so that a step keeps
 * `window` slices in flight at mid sizes too (NCCL halves its chunk for small messages the same
 * way). Never more than a slot, never less than one element.
 */
#define KB_CCL_MIN_SLICE_BYTES ((uint64_t)64 << 10)
KB_API int64_t kb_ccl_slice_elems(uint64_t slot, int64_t window, int64_t chunk, size_t es);

/* A streamed kernel's send: posted (tl_send_async; the kernel goes on while it lands) when
 * the context's IPCQ configuration says posted_sends, else tl_send (waits for its DMA). */
static inline void kb_ccl_send(kb_tl *tl, kb_dir dir, kb_val v)
{
    if (kb_ipcq_posted(tl_ctx(tl)))
        (void)tl_send_async(tl, dir, v);
    else
        tl_send(tl, dir, v);
}

/* kb_ccl_send of a scratch value the kernel is done with: freed once the send has read it
 * (a posted send's DMA may start after the kernel's next operations, which must not get its
 * memory before then). */
static inline void kb_ccl_send_free(kb_tl *tl, kb_dir dir, kb_val v)
{
    if (kb_ipcq_posted(tl_ctx(tl))) {
        tl_free_after(tl, v, tl_send_async(tl, dir, v));
        return;
    }
    tl_send(tl, dir, v);
    tl_free(tl, v);
}

/* Elements of piece j of a span of n elements cut into pieces of S (0 past its end); its
 * offset in the span in *off. */
static inline int64_t kb_ccl_piece(int64_t n, int64_t S, int64_t j, int64_t *off)
{
    int64_t lo = j * S, len = n - lo;
    assert(S > 0 && j >= 0);
    *off = lo;
    return len <= 0 ? 0 : len < S ? len : S;
}

/* VA of element i of a tile of dtype dt starting at va. */
static inline kb_va kb_ccl_elem_va(kb_va va, int64_t i, kb_dtype dt)
{
    return va + (kb_va)i * (kb_va)kb_dtype_size(dt);
}

/* Chunk c of n elements cut into ws chunks as evenly as possible (the first n % ws one
 * element longer): its offset and length (0 when n < ws leaves it empty). */
static inline void kb_ccl_chunk(int64_t n, int64_t ws, int64_t c, uint32_t *off, uint32_t *len)
{
    int64_t base = n / ws, extra = n % ws;
    /* offsets and lengths are uint32: tiles stay below 2^32 elements (kb_ccl_job_prepare) */
    assert(ws >= 1 && c >= 0 && c < ws && n >= 0 && n <= UINT32_MAX);
    *off = (uint32_t)(c * base + (c < extra ? c : extra));
    *len = (uint32_t)(base + (c < extra ? 1 : 0));
}

/*
 * Runs an algorithm's whole-tile body f once on the tile at va (n elements of dt) when it
 * fits (kb_ccl_stream_block), else on each block of it in order: the body's loads, messages
 * and stores then cover one block, and every rank walks the same blocks, so the body's
 * exchanges pair up block by block and nothing of the tile stays in scratch between blocks.
 * Suits algorithms whose exchanges do not wait on a cycle of full sends (chains, trees, rings
 * through kb_ccl_sendrecv): a block's messages longer than a slot stream as chunks. f must
 * release every scratch value it allocates before it returns (the kernel's end would only
 * release them after the last block). Mesh and intercube use it; ring, rsag, tree and
 * hierarchical have slice-by-slice streamed forms of their own.
 */
typedef void (*kb_ccl_tile_fn)(kb_tl *tl, const kb_kargs *a, kb_va va, int64_t n);
KB_API void kb_ccl_run_tile(kb_tl *tl, const kb_kargs *a, kb_va va, int64_t n, kb_dtype dt,
                     uint32_t msg_esz, kb_ccl_tile_fn f);

/* ---- running a rank = PE collective from a program ---- */

/*
 * A collective job in a rank = PE world (rank r on global PE r): one tile tensor per SIP
 * holding every rank's n f16 elements on the rank's PE, IPCQ installed for topology `topo`
 * (NULL = the algorithm's usual one), and the algorithm's kernel. kb_ccl_job_create, from a
 * host program, checks the world for the algorithm, creates the tiles and fills them (inputs:
 * ws*n f32 values, rank-major; NULL = kb_ccl_inputs(KB_CCL_INPUT_SEED, 0, ws, n)) and
 * installs IPCQ, all in simulated time; `name` is what messages call the algorithm.
 * kb_ccl_job_launch runs `kernel` (NULL = the algorithm's) on every rank and waits for it;
 * kb_ccl_job_read reads every rank's tile back (ws*n f32 values, rank-major, and the raw
 * f16 bits into raw when it is not NULL), replaying the op log first (Phase 2).
 * Owner: the caller destroys the job (kb_ccl_job_destroy(NULL) is a no-op); its tensors
 * belong to the context. Errors: KB_ERR_CONFIG for a world or tile the algorithm refuses,
 * with the message in kb_ctx_errmsg.
 */
typedef struct kb_ccl_job kb_ccl_job;
KB_API int kb_ccl_job_create(kb_ctx *ctx, const kb_ccl_algo_impl *impl, const char *name,
                      const char *topo, int ws, int64_t n, const kb_ipcq_cfg *icfg,
                      const float *inputs, kb_ccl_job **out);
KB_API void kb_ccl_job_destroy(kb_ccl_job *job);
KB_API int kb_ccl_job_launch(kb_ctx *ctx, kb_ccl_job *job, kb_kernel_fn kernel, const char *name);
KB_API int kb_ccl_job_read(kb_ctx *ctx, kb_ccl_job *job, float *out, uint16_t *raw);

/* ---- verification data ---- */

/*
 * Test inputs of every collective bench and of the mock runtime's default: element i of tile
 * t (a rank's tile; in rank = SIP runs, shard s of rank r is tile r*shards + s) gets
 * (k - 2048) / 128 with k = a seeded permutation of position p = t*n + i on [0, 4096).
 * Why this grid: every value is exact in f16, |value| <= 16, and a sum of up to
 * KB_CCL_INPUT_EXACT_TERMS of them is a multiple of 1/128 below 2^17, i.e. exact in f32 in any
 * order, so the reduced result is the exact sum rounded once and the check can be exact.
 * Values are distinct for every (tile, element) while ntiles*n <= KB_CCL_INPUT_GRID; beyond
 * that each block of 4096 positions is a different permutation: still position-dependent
 * pseudo-random, but values repeat across blocks.
 */
#define KB_CCL_INPUT_SEED 1u
#define KB_CCL_INPUT_GRID 4096
#define KB_CCL_INPUT_EXACT_TERMS 8192
KB_API float kb_ccl_input(uint32_t seed, int64_t tile, int64_t i, int64_t n);
/* x[(t - tile0)*n + i] = kb_ccl_input(seed, t, i, n) for tiles [tile0, tile0 + ntiles). */
KB_API void kb_ccl_inputs(float *x, uint32_t seed, int64_t tile0, int64_t ntiles, int64_t n);
/* x[j] = kb_ccl_input(seed, tile, i0 + j, n) for j in [0, len): part of one tile. */
KB_API void kb_ccl_input_span(float *x, uint32_t seed, int64_t tile, int64_t i0, int64_t len,
                       int64_t n);

/* What kb_ccl_verify found. Means are over all elements, of the result and of the
 * reference rounded to the dtype (the FAIL line prints them); for f16 whose every value is on
 * the 2^-7 grid they are the exact integer sums of value * 128 (int64, up to 2^40 elements),
 * each converted to double once, which is the sequential double sum wherever that is exact
 * and what a device's check gives in any order (kb_vquery.h); else the sequential sums. */
typedef struct kb_ccl_verdict {
    int ntiles, ok_tiles;
    int first_bad_tile;           /* -1 when every tile passed */
    int64_t first_bad_elem;
    double first_got, first_want; /* that element's value and its reference (rounded) */
    double got_mean, want_mean;
    double max_abs_err, err_bound; /* worst |got - exact reference| and its bound */
    int64_t nwrong;               /* elements that failed (nccl-tests' #wrong) */
} kb_ccl_verdict;

/*
 * Compares ntiles output tiles of n elements (raw: the dtype's bytes, tile-major) with the
 * exact reference ref (double). acc_bound == 0 (inputs whose partial sums are exact, e.g.
 * kb_ccl_inputs over at most KB_CCL_INPUT_EXACT_TERMS tiles): an element passes only when it
 * is, bit for bit, the reference rounded to the dtype (round to nearest even). acc_bound > 0:
 * it passes when |got - ref| <= ulp(ref)/2 + acc_bound (f32 summation that may round).
 * err_bound is ulp/2 + acc_bound at the worst element, which a correctly rounded value always
 * meets. Returns 1 when every tile passed, else 0.
 */
KB_API int kb_ccl_verify(kb_dtype dt, const void *raw, const double *ref, int ntiles, int64_t n,
                  double acc_bound, kb_ccl_verdict *v);

/* ---- the process group: rank = SIP collectives from a program (docs/distributed.md) ---- */

/* Host programs spawn one worker per rank (kb_spawn); each binds to its SIP
 * (kb_ctx_set_device(ctx, rank)), joins the process group and calls collectives on tensors
 * that live on its SIP, laid out as kb_dist_policy says. Every collective is an epoch
 * barrier: all ranks resume when it has completed. */
typedef enum kb_dist_op { KB_DIST_SUM = 0, KB_DIST_PROD, KB_DIST_MAX, KB_DIST_MIN } kb_dist_op;

/* Every rank calls it once (a collective): builds the install plan and installs IPCQ
 * (timed). backend must be "ahbm"; algorithm NULL = ccl.defaults.algorithm. */
KB_API int kb_dist_init_process_group(kb_ctx *ctx, const char *backend, const char *algorithm);
KB_API int kb_dist_get_world_size(kb_ctx *ctx);   /* the SIP count; -1 before init */
KB_API int kb_dist_get_rank(kb_ctx *ctx);         /* the calling worker's rank; -1 outside workers */
KB_API const char *kb_dist_algorithm(kb_ctx *ctx); /* module of the process group, or NULL */

KB_API int kb_dist_all_reduce(kb_ctx *ctx, kb_tensor *t, kb_dist_op op);
/* all_reduce shard by shard: shard j of every rank's `t` (the all_reduce layout of the
 * hierarchical process group: one block per PE, f32, the block's elements a multiple of the
 * world size; or the same over the first k PEs, k at most a cube's PEs or whole cubes from
 * cube 0, whose lanes alone then run) becomes the sum of shard j over the ranks, not over the
 * rank's shards. The
 * lanes of NCCL's channels: the S same-place PEs of the SIPs form a ring each (a bandwidth-
 * optimal reduce-scatter then all-gather; even lanes one way round, odd lanes the other, so
 * both directions of the SIPs' links carry half), over the lane rings the hierarchical
 * process group wires when the IPCQ ring area has room for them (KB_ERR_UNSUPPORTED
 * otherwise, and for another process-group algorithm). What a layer whose partial sums are
 * already reduced inside each SIP needs: the data crossing SIPs is the SIP's sum, once. */
KB_API int kb_dist_all_reduce_shards(kb_ctx *ctx, kb_tensor *t);
KB_API int kb_dist_barrier(kb_ctx *ctx);
/* all_gather: `in` (m x k per rank, column-wise over the rank's S PEs: PE j holds columns
 * [j*k/S, (j+1)*k/S)) -> `out` (S*m x ws*k per rank, row-wise: every PE's m x ws*k block
 * holds the whole gathered matrix, rank r's columns at [r*k, (r+1)*k)). */
KB_API int kb_dist_all_gather(kb_ctx *ctx, kb_tensor *out, kb_tensor *in);
/* Inverse layout: `in` (wide, row-wise, one m x ws*k block per PE) is summed over every PE
 * of every rank; PE j of rank r keeps its k/S columns of the rank's k-column chunk of the
 * sum in `out` (m x k, column-wise over the PEs). `in` is staging: unspecified afterwards. */
KB_API int kb_dist_reduce_scatter(kb_ctx *ctx, kb_tensor *out, kb_tensor *in);

/* broadcast: every rank's tensor (the all_reduce layout) becomes rank root's, shard by shard
 * (shard j of every rank = shard j of root). reduce (SUM): every shard of root's tensor
 * becomes what all_reduce would leave there (the sum over every shard of every rank); the
 * other ranks' tensors are unchanged. Both run over the process group's wiring
 * (kb_dist_coll.c): shards stream up the root SIP's tree, along the leaders' chains (the
 * root's grid row, then every column) and down; reduce sums them the other way. */
KB_API int kb_dist_broadcast(kb_ctx *ctx, kb_tensor *t, int root);
KB_API int kb_dist_reduce(kb_ctx *ctx, kb_tensor *t, kb_dist_op op, int root);

/* all_to_all: `in` and `out` have the all_reduce layout (S shards of n elements, n a multiple
 * of ws, alike on every rank); every shard is ws blocks of n/ws elements, and block i of
 * shard s of rank r's `in` becomes block r of shard s of rank i's `out` (torch's
 * all_to_all_single on every shard). kb_dist_coll.c: the shards go up each SIP's tree to the
 * leader, the leaders exchange the blocks along the SIP grid's rows then columns (rings;
 * chains both ways where the grid does not wrap; ws - 1 steps on a ring of ws), and every
 * block goes down the tree to the PE that owns its shard. */
KB_API int kb_dist_all_to_all(kb_ctx *ctx, kb_tensor *out, kb_tensor *in);

/* Point-to-point (pipeline-parallel handoff): rank src's `t` (the all_reduce layout) is copied
 * into rank dst's `t` (same shape and dtype), shard j into shard j. Not an epoch: a 2-party
 * rendezvous keyed by (src, dst, n-th call of that pair); the rank that arrives second runs
 * one launch over the SIPs of the route (the tensor goes up src's tree, along the leaders of
 * the SIP grid — the row, then the column, shorter way round a ring — and down dst's tree)
 * and both return its code. One transfer runs at a time per process group (pairs matched
 * meanwhile wait). A half whose peer never comes ends the run as a deadlock whose report
 * names it ("kb_dist_recv from rank 0 (#0 of 0 -> 1): no matching kb_dist_send"). */
KB_API int kb_dist_send(kb_ctx *ctx, kb_tensor *t, int dst);
KB_API int kb_dist_recv(kb_ctx *ctx, kb_tensor *t, int src);

/* The DPPolicy a rank's tensor must have for the process group's algorithm. */
KB_API kb_dp_policy kb_dist_policy(kb_ctx *ctx);
/* Number of shards (participating PEs) per rank for the process group's algorithm. */
KB_API int kb_dist_shards_per_rank(kb_ctx *ctx);

/* Seconds-free statistics: simulated time spent inside collectives (from the last rank's
 * arrival) and send/recv transfers, summed per call. */
KB_API kb_time kb_dist_comm_time(kb_ctx *ctx);

#endif
