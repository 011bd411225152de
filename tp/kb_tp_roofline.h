/*
 * kb_tp_roofline — the roofline (kb_roofline.h) of the tensor-parallel workloads on a machine:
 * the decoder layer (kb_decoder.h) and the tp_mlp / tp_attention layers (kb_tp.h), with the
 * TP size = the machine's SIPs and each rank's work on the PEs of its SIP, as the benches run
 * them. docs/decoder.md ("Roofline") derives every term; in short, per rank:
 *  - compute: the projections' 2·M·N·K flops at the number format's PE_GEMM rate (2:4 sparse
 *    included), and the attention's Q·Kᵀ and P·V at the base rate, causal prefill counting
 *    only the unmasked triangle, over the SIP's PEs (the layouts use them all: every PE holds
 *    a partial block of the all-reduce). PE_MATH work (norms, softmax, activation, the 8-bit
 *    formats' activation quantization, reductions' adds) is not counted;
 *  - memory (HBM): every weight read once in its format's bytes, the decode step's KV cache
 *    read once (and the new token's K and V written), the input read and the output written,
 *    plus each PE's tiles of the collectives (kb_ccl_roofline.h), over the PEs' HBM ports;
 *  - comm: the layers' collectives among every PE of every SIP (the process group's all_pes
 *    layout), one after another: the decoder's two all-reduces of the f32 partial blocks
 *    (T × d), or with seq_parallel its all_gathers of the normalised activations (activation
 *    dtype) and reduce_scatters of the partials; the TP layers' one all-reduce each.
 * Limits: the layouts' replicated copies (KV heads on several ranks when TP > the KV heads,
 * W_o rows per query block, the activation copies per gemm PE) are counted once, as the
 * workload needs them, and the layers' intermediates (Q, K, V, the MLP's hidden activations)
 * not at all; the bound stays a lower bound of the layouts that do more.
 */
#ifndef KB_TP_ROOFLINE_H
#define KB_TP_ROOFLINE_H

#include "kb_decoder.h"
#include "kb_roofline.h"

/* The decoder layer of mc with o on m (TP size m->nsips). 0, or the plan's KB_ERR_USAGE /
 * KB_ERR_NOMEM with the message in eb. */
int kb_tp_roofline_decoder(const kb_machine *m, const kb_model_cfg *mc, const kb_decoder_opts *o,
                           kb_roofline *out, kb_errbuf *eb);
/* tp_mlp: tokens x d -> column-parallel d x hidden (+ bias, GeLU) -> row-parallel hidden x d
 * (+ bias) with its all-reduce, f16 tensors. */
int kb_tp_roofline_mlp(const kb_machine *m, int64_t tokens, int64_t d, int64_t hidden,
                       kb_roofline *out, kb_errbuf *eb);
/* tp_attention: seq tokens of width d, heads heads (one per PE, heads / TP per rank), full
 * (non-causal) softmax, the row-parallel output projection and its all-reduce. */
int kb_tp_roofline_attention(const kb_machine *m, int64_t seq, int64_t d, int64_t heads,
                             kb_roofline *out, kb_errbuf *eb);

#endif
