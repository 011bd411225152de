/*
 * kb_decoder — one transformer decoder layer (kb_model.h shapes) on a tensor-parallel rank
 * (rank = SIP, kb_tp.h's process group), prefill or one KV-cache decode step, and its host
 * f64 reference.
 *
 * The layer (Llama/Mistral; Gemma-2 adds the post norms and the soft-cap):
 *   a  = attention(rmsnorm(x, ln0))            causal GQA, RoPE, scale, soft-cap
 *   h  = x + (post_norms ? rmsnorm(a, ln1) : a)
 *   m  = down(act(gate(n)) * up(n)),  n = rmsnorm(h, ln2)
 *   y  = h + (post_norms ? rmsnorm(m, ln3) : m)
 *
 * Megatron placement over the ws ranks: Q/K/V and gate/up are column-parallel (rank r owns
 * query heads [r*Hq/ws, ...) and the matching KV heads; KV heads are REPLICATED when
 * ws > Hkv: rank r uses KV head r / (ws / Hkv)), O and down are row-parallel; their partial
 * sums are all-reduced (or reduce-scattered with seq_parallel). Inside a rank (S PEs):
 *  - norms and residual adds run on R "row owner" PEs, each owning a block of token rows
 *    (the residual stream x, h, y is Tl x d f32 split row-wise over them; Tl = T, or T/ws
 *    tokens of the rank's chunk with seq_parallel);
 *  - QKV: N-split, PE j computes a T x c column block of one head (c = head_dim / p columns,
 *    the block's two halves are the matching rotary pairs so RoPE is local) and applies
 *    RoPE;
 *  - attention: prefill, one PE per (sequence, query head, block of >= 16 query rows): it
 *    assembles Q, K, V from the QKV PEs' blocks, s = Q K^T, causal masked soft-capped softmax,
 *    o = P V, and immediately multiplies o by its head's rows of W_o (a row-parallel
 *    partial, stored in its own partial block); decode, split-KV ("flash-decoding"): one PE
 *    per (sequence, KV head, chunk of the cache; the cache chunk lives in that PE's HBM), the
 *    new token's K/V appended to the cache, partial (max, sum, P V) per chunk, then one PE per
 *    (sequence, KV head) combines them and multiplies by W_o's rows of its query heads;
 *  - MLP: PE j owns c_f columns of gate/up and the same c_f rows of down (c_f a multiple of
 *    32, the MX block): act(x Wg_j) * (x Wu_j) @ Wd_j is its partial of the whole output;
 *  - the partial sums live one T x d f32 block per PE (zeros where a PE adds nothing) and the
 *    process group's all_reduce sums them over the PEs and ranks (kb_tp_reduce_blocks'
 *    layout); with seq_parallel a reduce_scatter leaves rank r its token chunk, the row
 *    owners normalize it, and an all_gather (before QKV and before the MLP) replicates the
 *    normalized activations on every PE of every rank (kb_dist.h's flattened 1 x T*d layout).
 *    Without seq_parallel the row owners write their normalized rows into a T x d copy in
 *    every gemm PE's HBM.
 * That is mapping naive. Mapping machine (prefill without seq_parallel) keeps the row
 * owners and the attention items but places the projections in token groups: the QKV and
 * MLP grids are R groups x ncol column blocks, PE (g, j) computing column block j for the
 * group's T/R rows only, from a copy of just those rows that the group's row owners write
 * (groups of whole row-owner blocks, a cube's PEs where ncol = PEs per cube), with its own
 * copy of the column block's weights (replicated over the groups: weights stay in the HBM
 * of the PE that uses them); the attention items and MLP PEs keep their partial rows only,
 * each row owner sums its rows' partials inside the SIP (the heads' for O, the group's
 * column blocks' for down) into its block of a SIP sum, and kb_dist_all_reduce_shards adds
 * the SIPs' sums lane by lane, so only the SIP's sum crosses SIP links, once (with fewer
 * attention items than cubes, an item runs on ocol PEs of its cube, each with a column
 * block of the W_o rows). In decode,
 * machine keeps naive's chunks but combines them in bulk (every chunk's partials loaded at
 * once, a few whole-array operations) on ccol PEs of a cube per (sequence, KV head), each
 * taking a column block of the W_o rows, and, for a few tokens, writes one copy of the
 * normalised rows that every gemm PE reads instead of one per gemm PE. Machine's layer runs
 * in one device launch queue (kb_launch_queue) as one launch whose kernels and lane
 * all-reduces are stages with a barrier between them (kb_launch_seq; launch_per_kernel: a
 * launch each), and its kernels stream weight tiles with a SchedulerV2 stage per DMA
 * channel (kb_tl_set_stages); naive keeps a host round trip per launch and double
 * buffering.
 * Weights are in `fmt` (kb_tl_q.h: f16, bf16, int8, mxint8, fp8), 2:4 sparse along K when
 * sparse; activations are stored in bf16 for bf16, f16 otherwise, and quantized by
 * tl_dot_q for 8-bit formats. Limits: one forward per kb_decoder (the partial blocks are
 * zeroed once at creation); Hq divisible by ws, Hkv a multiple or a divisor of ws; with
 * seq_parallel T divisible by ws and the chunk's T/ws * d divisible by S with rows and pieces
 * nested (d % (T*d/(ws*S)) == 0 or the other way round).
 */
#ifndef KB_DECODER_H
#define KB_DECODER_H

#include "kb_model.h"
#include "kb_runtime.h"
#include "kb_tl_q.h"

/* How a rank's work goes onto its PEs (kb_decoder.h's header and docs/decoder.md say what
 * each does). */
typedef enum kb_decoder_mapping {
    KB_DEC_MAP_NAIVE = 0,   /* column splits over all tokens; partials all-reduced per PE */
    KB_DEC_MAP_MACHINE = 1, /* token groups x column splits; partials reduced in the SIP */
    KB_DEC_MAP_AUTO = 2     /* machine where it is defined and its plan fits, else naive */
} kb_decoder_mapping;

typedef struct kb_decoder_opts {
    int64_t batch, seq;  /* prefill: T = batch * seq tokens; decode: T = batch (seq unused) */
    int decode;          /* one decode step: a token at position kv_len per sequence */
    int64_t kv_len;      /* decode: cached positions per sequence (0 .. kv_len-1) */
    int seq_parallel;
    kb_qfmt fmt;
    int sparse;          /* 2:4 along K for every projection weight */
    int mapping;         /* kb_decoder_mapping (machine: without seq_parallel) */
    /* machine: a launch per kernel and per all-reduce (the layer before its fused launch),
     * where 0 runs the kernels and the lane all-reduces as one launch, a barrier between
     * them (docs/decoder.md, "One launch for the layer") */
    int launch_per_kernel;
} kb_decoder_opts;

/*
 * The layer's values as fills (element (i, j) of each full matrix; kb_runtime.h): read only
 * when the context records. Layouts (row-major, y = x @ W):
 *   x: T x d (token t = b*seq + s; decode: t = b);  ln[0..3]: 1 x d (input, post-attention,
 *   pre-feedforward, post-feedforward norm weights; ln[1], ln[3] unused without post_norms);
 *   wq: d x Hq*hd; wk, wv: d x Hkv*hd; wo: Hq*hd x d; wg, wu: d x F; wd: F x d;
 *   kc, vc (decode): (batch*Hkv*kv_len) x hd, row (b*Hkv + g)*kv_len + p = the cached key
 *   (already rotated) / value of KV head g at position p of sequence b.
 */
typedef struct kb_decoder_fills {
    kb_fill x, ln[4], wq, wk, wv, wo, wg, wu, wd, kc, vc;
} kb_decoder_fills;

/* A rectangular PE grid of a SIP: cubes x pes PEs, n = cubes * pes. */
typedef struct kb_dec_grid {
    int cubes, pes, n;
} kb_dec_grid;

/* Where everything of one rank goes (kb_decoder_plan; pure arithmetic, no context). */
typedef struct kb_decoder_plan {
    int ws, rank, S;                  /* TP size, rank, PEs per SIP */
    int64_t d, hd, F, T, Tl;          /* Tl: tokens of the rank's residual stream */
    int64_t nq, nkv, q0, kv0, nrep;   /* local heads, first global ones, q heads per kv head */
    int64_t Floc;                     /* MLP columns of the rank */
    kb_dec_grid rows;  int64_t rc;    /* row owners, rows each (Tl = rows.n * rc) */
    int64_t trows_rc;                 /* non-SP: rows per owner of the T-row tensors (= rc) */
    int64_t U, p, c;                  /* QKV: units, PEs per unit, columns per PE */
    kb_dec_grid qkv;
    int64_t qrows, qb;                /* prefill attention: query rows per PE, blocks per seq */
    int64_t hg;                       /* prefill: query heads per item (machine: all nq) */
    int64_t rep_rows;                 /* machine: rows of a PE's part of the K/V replicas */
    int64_t chunks, clen;             /* decode: cache chunks per (seq, kv head), positions each */
    kb_dec_grid att;  int64_t items;  /* attention PEs (items used of att.n) */
    kb_dec_grid comb; int64_t citems; /* decode: combining PEs */
    int64_t ccol;                     /* machine decode: W_o column blocks per combined item (1: one PE) */
    int64_t ocol;                     /* machine prefill: W_o column blocks per attention item (1: one PE) */
    kb_dec_grid mlp;  int64_t cf;     /* MLP PEs, columns each */
    int64_t piece;                    /* seq_parallel: elements per PE of the 1 x Tl*d pieces */
    int64_t tb;                       /* gemm row block (bounds scratch) */
    /* The projections' token groups: PE i of the qkv (mlp) grid takes the column block
     * i mod qncol (mncol) of the rows [g*qtr, (g+1)*qtr) of group g = i / qncol. naive: one
     * group of T rows (qncol = qkv.n, mncol = mlp.n); machine: qkv.n / qncol groups. */
    int64_t qncol, qtr, mncol, mtr;
    int machine;                      /* prefill in mapping machine (token groups ...) */
    int dmachine;                     /* decode in mapping machine (the combine in bulk) */
    int dsum;                         /* machine decode, one KV head per rank: the combination's
                                         W_o column blocks straight into the SIP's sum rows, all-
                                         reduced over the row owners' lanes only */
    int shared;                       /* machine decode of few tokens: one copy of the
                                         normalised rows, read by every gemm PE */
    int dmsum;                        /* machine decode, row owners in one cube: the row
                                         owners sum the MLP PEs' partial rows (gsum), then
                                         all-reduce them over their lanes only */
} kb_decoder_plan;

/* The plan for rank `rank` of ws on a machine of ncubes x npes PEs per SIP. 0 or
 * KB_ERR_RANGE / KB_ERR_USAGE with the reason in eb. */
int kb_decoder_plan_make(const kb_model_cfg *mc, const kb_decoder_opts *o, int ws, int rank,
                         int ncubes, int npes, kb_decoder_plan *pl, kb_errbuf *eb);

/* The projection gemm's PE_GEMM time in closed form: x (m x k, local) @ a k x n weight
 * streamed from HBM by SchedulerV2 is one gemm-unit use per tile step (tile_m x tile_n x
 * tile_k, edge tiles smaller), each kb_qgemm_ns of its sizes (format rate, 2:4 speed-up). */
double kb_decoder_gemm_closed_ns(const kb_topo_cfg *c, kb_qfmt fmt, int sparse, uint64_t m,
                                 uint64_t n, uint64_t k);

/* Time split of one forward (rank 0's critical path; see docs/decoder.md). */
typedef struct kb_decoder_stats {
    double compute_ns, memory_ns, comm_ns;
    /* the command path of the layer's own launches: each launch's time beyond its kernels'
     * span (kb_launch_span), and a launch queue's way up to the host */
    double launch_ns;
    /* PE_GEMM time of the projection gemms (tl_dot_q) as the closed form kb_qgemm_ns gives
     * it for every call made, summed over the rank's PEs, and the time the rank's PE_GEMM
     * units were busy in the projection kernels' gemm calls (measured): equal by design
     * (kb_decoder_gemm_closed_ns) */
    double proj_gemm_closed_ns, proj_gemm_busy_ns;
} kb_decoder_stats;

typedef struct kb_decoder {
    kb_model_cfg mc;
    kb_decoder_opts o;
    kb_decoder_plan pl;
    kb_dtype act;
    kb_tensor *x, *ln[4], *cosq, *sinq, *qkv, *h, *y, *po, *pd, *kc, *vc, *dpart;
    kb_tensor *hn1, *hn2;               /* non-SP: a copy of the normalized T x d per gemm PE */
    kb_tensor *ag1_in, *ag1, *ag2_in, *ag2, *rs_o, *rs_d; /* seq_parallel */
    kb_tensor *sum_o, *sum_d;           /* machine: the SIP's sums, a block per row owner
                                           (machine decode's sum_o with dsum and sum_d with
                                           dmsum: per row owner) */
    kb_tensor *kv_rep;                  /* machine: every attention cube's copy of K and V */
    kb_qweight wqkv, wo, wg, wu, wd;
    kb_decoder_stats st;
} kb_decoder;

/* On a TP rank (after kb_tp_initialize_model_parallel): plans and creates the rank's
 * tensors and weights from the fills (values only when recording). */
int kb_decoder_create(kb_ctx *ctx, const kb_model_cfg *mc, const kb_decoder_opts *o,
                      const kb_decoder_fills *f, kb_decoder *dec);
/* Runs the layer once; dec->y then holds the rank's Tl x d f32 output rows (tokens
 * [0, T) or, with seq_parallel, the rank's chunk [rank*T/ws, ...)); dec->st its time split. */
int kb_decoder_forward(kb_ctx *ctx, kb_decoder *dec);

/*
 * Host f64 reference of the whole layer. Inputs are the values the device holds: x (T x d),
 * ln[4] (d each), the projection weights as the ranks hold them after quantization
 * (kb_decoder_ref_weight), the caches (decode). out: T x d.
 * The reference rounds where the device stores (the normalized activations and Q, K, V to the
 * activation dtype `act`) and quantizes each projection's input the way tl_dot_q does
 * (kb_qact_host_values, per row over the k a PE multiplies: d for QKV and gate/up, o_seg
 * columns for O — a head, or a decode group's heads — and mlp_seg for down — a PE's c_f);
 * everything else is double. So it differs from the device by f32 arithmetic and by the rare
 * activation that lands on the other side of a rounding boundary.
 */
typedef struct kb_decoder_ref_in {
    const float *x, *ln[4];
    const float *wq, *wk, *wv, *wo, *wg, *wu, *wd; /* full matrices (layouts as the fills) */
    const float *kc, *vc;
    kb_dtype act;
    int64_t o_seg, mlp_seg;
    /* Optional (NULL: not used): the device's normalized activations (T x d, token order) fed
     * to the attention (0) and MLP (1) projections. Where the reference's own rounded value
     * n is within n_tol * (|n| + rms(n)) (or one step of the activation dtype) of the
     * device's, the reference continues from the device's value: the projections then
     * quantize the same numbers, and an activation that f32 arithmetic put on the other side
     * of a rounding boundary no longer requantizes a whole row or MX block differently from
     * the device (an absmax flip changes the row's scale). *n_far (if not NULL) receives the
     * first element index further away (the reference keeps its own value there), or -1. */
    const float *n_dev[2];
    double n_tol;
    int64_t *n_far;
} kb_decoder_ref_in;
int kb_decoder_reference(const kb_model_cfg *mc, const kb_decoder_opts *o,
                         const kb_decoder_ref_in *in, double *out, kb_errbuf *eb);

/* The device's weight values (dequantized, pruned) of a full K x N projection split over ws
 * ranks: column-parallel (row_parallel 0) or row-parallel; each rank's slice quantized the
 * way kb_qweight_create does it for that rank. out: K x N. */
int kb_decoder_ref_weight(kb_qfmt fmt, int sparse, int64_t k, int64_t n, int ws,
                          int row_parallel, const kb_fill *w, float *out);

#endif
