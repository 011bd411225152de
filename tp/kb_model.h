/*
 * kb_model — the shape of a transformer decoder layer, read from a model file
 * (configs/models/NAME.yaml, a `model:` section; keys and units in docs/config-reference.md).
 *
 * The file describes one decoder layer of a pre-norm, rotary, grouped-query-attention model
 * with a gated MLP (Llama/Mistral, Gemma-2): widths, head counts, the MLP activation, the
 * norms (RMSNorm epsilon, (1 + w) weights, Gemma-2's extra post-attention / post-MLP norms),
 * the attention's query scale and logit soft-cap and the rotary base. Loading goes through the
 * project's schema-driven YAML loader (kb_config_load_sections): unknown keys, wrong types and
 * out-of-range values are errors with FILE:LINE:COLUMN. Limits: one layer shape, no biases, no
 * sliding-window attention, no final-logit soft-cap (they are not part of one layer's work).
 */
#ifndef KB_MODEL_H
#define KB_MODEL_H

#include <stdint.h>

#include "kb_config.h"
#include "kb_err.h"

enum { KB_ACT_SILU = 0, KB_ACT_GELU_TANH = 1 }; /* tl_gated's act argument */

typedef struct kb_model_cfg {
    char name[64];
    int64_t d_model, n_heads, n_kv_heads, head_dim, mlp_hidden;
    char activation[16];          /* "silu" | "gelu_tanh" */
    double attn_softcap;          /* cap * tanh(s / cap) on the attention logits; 0 = none */
    double query_pre_attn_scalar; /* logits scale = 1/sqrt(this); 0 = head_dim */
    double norm_eps;
    double norm_unit_offset;      /* RMSNorm multiplies by (unit_offset + w): Gemma 1, else 0 */
    int post_norms;               /* Gemma-2: RMSNorm of the attention / MLP output before the
                                   * residual add (post_attention / post_feedforward norms) */
    double rope_theta;
    char path[512];               /* the file it came from ("" = defaults) */
} kb_model_cfg;

/* The defaults (Mistral-7B's shape); a model file sets every key it names. */
void kb_model_defaults(kb_model_cfg *m);
/* Loads path's `model:` section over the defaults and validates it. 0 or KB_ERR_CONFIG /
 * KB_ERR_IO with the message (FILE:LINE:COLUMN for a bad key) in eb. */
int kb_model_load(kb_model_cfg *m, const char *path, kb_errbuf *eb);
/* The shape's ranges (for a configuration built in code) and the cross-key checks (head_dim
 * even, n_heads a multiple of n_kv_heads). 0 or KB_ERR_CONFIG with the message in eb. */
int kb_model_validate(const kb_model_cfg *m, kb_errbuf *eb);
/* KB_ACT_SILU or KB_ACT_GELU_TANH. */
int kb_model_act(const kb_model_cfg *m);
/* The attention logits' scale: 1/sqrt(query_pre_attn_scalar or head_dim). */
double kb_model_qscale(const kb_model_cfg *m);
/* Calls fn for every key (path, type, default, doc), for the docs check. */
void kb_model_foreach_key(kb_config_key_fn fn, void *ud);

#endif
