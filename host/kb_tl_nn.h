/*
 * kb_tl_nn — the kernel-language ops of a transformer decoder layer (activations, soft-capping,
 * attention softmax with causal mask, RMSNorm/LayerNorm, rotary embedding, transpose, concat,
 * repeat_kv, gated MLP activation, embedding lookup), on top of kb_tl.
 *
 * All ops take local values (in the PE's TCM/scratch; views allowed) and return a new
 * contiguous f32 scratch value; arithmetic is f32 from operands of any dtype, rounded once on
 * store, with kb_mathfn.h's NaN rules, so ref and OpenCL replay give the same bits. Time is
 * PE_MATH: fixed + passes * elements / lanes per op record (docs/timing-model.md gives each
 * op's passes). Ops are single records where a composition would be wasteful or impossible:
 *  - tl_tanh, tl_silu, tl_gelu_tanh (= tl_gelu), tl_softcap: one MATH1 record, 1 pass;
 *  - tl_attn_softmax: one ATTN_SOFTMAX record, KB_ATTN_SOFTMAX_PASSES passes (+1 when
 *    soft-capping). A fully masked row gives all zeros;
 *  - tl_transpose: one TRANSPOSE record, 1 pass;
 *  - tl_embedding: one GATHER record whose time is a DMA of n rows of d elements from the
 *    table's shard (Phase 1 cannot know which rows: ids are only read in Phase 2); an id that
 *    is not an integer in [0, vocab) gives a row of zeros, so that lookups in the vocabulary
 *    shards of a vocab-parallel table (ids shifted by each shard's first row with tl_scale)
 *    sum to the embedding, as Megatron's VocabParallelEmbedding does.
 * The others are compositions of kb_tl records (their time is the sum of their parts):
 * tl_rmsnorm, tl_layernorm, tl_rope, tl_concat, tl_repeat_kv, tl_gated.
 * Limits: tl_embedding's table must lie in one shard mapping (one DMA route); ids are f32
 * (exact below 2^24). Misuse stops the kernel with a message naming the op (tl_fail).
 */
#ifndef KB_TL_NN_H
#define KB_TL_NN_H

#include <stdint.h>

#include "kb_tl.h"

/* PE_MATH passes of tl_attn_softmax over rows x cols: max, exp+sum, divide, plus the scale
 * and mask fused into the first pass; soft-capping (tanh) adds one pass. */
#define KB_ATTN_SOFTMAX_PASSES 4u

kb_val tl_tanh(kb_tl *tl, kb_val a);
kb_val tl_silu(kb_tl *tl, kb_val a);                       /* x * sigmoid(x) */
kb_val tl_gelu_tanh(kb_tl *tl, kb_val a);                  /* 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))) */
kb_val tl_softcap(kb_tl *tl, kb_val a, float cap);         /* cap * tanh(a / cap), cap > 0 */
/* softmax over each row (axis 1) of mask(softcap(scale * a)); cap <= 0: no soft-capping;
 * causal != 0: element (i, j) is masked (-inf before the softmax) when j > i + offset
 * (offset = kv_len_before for a query block starting later in the sequence). */
kb_val tl_attn_softmax(kb_tl *tl, kb_val a, float scale, float cap, int causal, int64_t offset);
/* per row: x / sqrt(mean(x^2) + eps) * (w + unit_offset); w is 1 x cols (Gemma: unit_offset 1) */
kb_val tl_rmsnorm(kb_tl *tl, kb_val x, kb_val w, float eps, float unit_offset);
/* per row: (x - mean) / sqrt(var + eps) * w + b (biased variance); w, b are 1 x cols */
kb_val tl_layernorm(kb_tl *tl, kb_val x, kb_val w, kb_val b, float eps);
/* rotary embedding, rotate-half form (Llama/Mistral/Gemma), on x = rows x hd (one head,
 * row i = token i); cos, sin: rows x hd/2 (the host builds them from position ids with
 * kb_rope_tables). out[:, :h] = x1*cos - x2*sin, out[:, h:] = x2*cos + x1*sin, h = hd/2. */
kb_val tl_rope(kb_tl *tl, kb_val x, kb_val cos, kb_val sin);
/* cos/sin tables (n x hd/2, row-major) for positions pos[0..n): angle(i, k) =
 * pos[i] * theta^(-2k/hd), evaluated in double and rounded once to f32. */
void kb_rope_tables(const int64_t *pos, int64_t n, int hd, double theta, float *cos, float *sin);
kb_val tl_transpose(kb_tl *tl, kb_val a);                  /* cols x rows */
kb_val tl_concat(kb_tl *tl, kb_val a, kb_val b, int axis); /* axis 0: rows, 1: columns */
/* repeat_kv: kv = rows x (nkv*hd) -> rows x (nkv*n_rep*hd), head h of the result = kv head h/n_rep */
kb_val tl_repeat_kv(kb_tl *tl, kb_val kv, int nkv, int hd, int n_rep);
/* gated MLP activation: act(gate) * up, act 0 = silu, 1 = gelu_tanh */
kb_val tl_gated(kb_tl *tl, kb_val gate, kb_val up, int act);
/* embedding lookup: rows ids (ids: 1 x n or n x 1 local value holding row numbers as f32,
 * exact below 2^24) of the table (vocab x d, dtype dt, at VA table, one shard) -> n x d f32;
 * an id outside [0, vocab) (or not an integer, or NaN) gives a row of zeros */
kb_val tl_embedding(kb_tl *tl, kb_va table, int64_t vocab, int64_t d, kb_dtype dt, kb_val ids);

#endif
