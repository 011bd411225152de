/*
 * kb_model — model files (kb_model.h): one schema table, loaded by the host's YAML walker.
 */
#include "kb_model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "kb_config.h"
#include "kb_schema.h"

static const char *const activations[] = { "silu", "gelu_tanh", NULL };

#define M_ kb_model_cfg
static const kb_schema_key model_keys[] = {
    KB_SCHEMA_STR(M_, "name", name, "model", "the model's name, for reports (text)"),
    KB_SCHEMA_I64(M_, "d_model", d_model, "4096", 1, 1048576, "hidden size (elements)"),
    KB_SCHEMA_I64(M_, "n_heads", n_heads, "32", 1, 4096, "attention (query) heads (count)"),
    KB_SCHEMA_I64(M_, "n_kv_heads", n_kv_heads, "8", 1, 4096,
                  "key/value heads; n_heads / n_kv_heads query heads share one (count)"),
    KB_SCHEMA_I64(M_, "head_dim", head_dim, "128", 2, 65536, "elements per head (even)"),
    KB_SCHEMA_I64(M_, "mlp_hidden", mlp_hidden, "14336", 1, 4194304,
                  "gated MLP's intermediate size (elements)"),
    KB_SCHEMA_ENUM(M_, "activation", activation, "silu", activations,
                   "gated MLP activation: act(x W_gate) * (x W_up) (name)"),
    KB_SCHEMA_DBL(M_, "attn_softcap", attn_softcap, "0", 0, 1e9,
                  "attention logit soft-cap c: c * tanh(s / c); 0 = none (logit units)"),
    KB_SCHEMA_DBL(M_, "query_pre_attn_scalar", query_pre_attn_scalar, "0", 0, 1e9,
                  "logits are scaled by 1/sqrt(this); 0 = head_dim (scalar)"),
    KB_SCHEMA_POS(M_, "norm_eps", norm_eps, "1e-5", 1.0, "RMSNorm epsilon (scalar)"),
    KB_SCHEMA_DBL(M_, "norm_unit_offset", norm_unit_offset, "0", 0, 1,
                  "RMSNorm weight offset: x * (offset + w); Gemma 1, Llama/Mistral 0 (scalar)"),
    KB_SCHEMA_BOOL(M_, "post_norms", post_norms, "false",
                   "Gemma-2 sandwich norms: RMSNorm of the attention and MLP outputs before "
                   "each residual add (bool)"),
    KB_SCHEMA_POS(M_, "rope_theta", rope_theta, "1000000", 1e12,
                  "rotary embedding base (scalar)"),
};
#undef M_

static const kb_schema_scope scope_model = {
    "model", { model_keys, NULL }, { KB_SCHEMA_NKEYS(model_keys), 0 }, { 0, 0 }, NULL };

void kb_model_defaults(kb_model_cfg *m)
{
    memset(m, 0, sizeof *m);
    kb_schema_apply_defaults(&scope_model, m);
}

int kb_model_validate(const kb_model_cfg *m, kb_errbuf *eb)
{
    const char *f = m->path[0] ? m->path : "model";
    /* a file's values are in the schema's ranges; a configuration built in code may not be,
     * and every later step divides by these */
    const struct { const char *key; int64_t v, min; } shape[] = {
        { "d_model", m->d_model, 1 },       { "n_heads", m->n_heads, 1 },
        { "n_kv_heads", m->n_kv_heads, 1 }, { "head_dim", m->head_dim, 2 },
        { "mlp_hidden", m->mlp_hidden, 1 },
    };
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i].v < shape[i].min)
            return kb_err_set(eb, KB_ERR_CONFIG, "%s: model.%s %lld is out of range (at least "
                              "%lld)", f, shape[i].key, (long long)shape[i].v,
                              (long long)shape[i].min);
    if (!(m->query_pre_attn_scalar >= 0))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: model.query_pre_attn_scalar %g is out of "
                          "range (0 = head_dim, else > 0)", f, m->query_pre_attn_scalar);
    if (m->head_dim % 2)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: model.head_dim %lld must be even (rotary "
                          "embeddings rotate pairs)", f, (long long)m->head_dim);
    if (m->n_heads % m->n_kv_heads)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: model.n_heads %lld must be a multiple of "
                          "model.n_kv_heads %lld", f, (long long)m->n_heads,
                          (long long)m->n_kv_heads);
    return 0;
}

int kb_model_load(kb_model_cfg *m, const char *path, kb_errbuf *eb)
{
    kb_model_cfg work;
    int rc;
    kb_model_defaults(&work);
    /* the layer's shape has no sensible default in a file: an empty or cut-short file would
     * otherwise run the built-in model unnoticed, so these keys start unset (0 is outside
     * each one's range) and must be named */
    work.d_model = work.n_heads = work.n_kv_heads = work.head_dim = work.mlp_hidden = 0;
    const kb_cfg_section secs[] = {
        { "model", "model", &scope_model, &work, NULL, NULL, NULL, NULL },
    };
    if ((rc = kb_config_load_sections(path, secs, 1, eb)) != 0)
        return rc;
    const struct {
        const char *key;
        int64_t v;
    } shape[] = { { "d_model", work.d_model }, { "n_heads", work.n_heads },
                  { "n_kv_heads", work.n_kv_heads }, { "head_dim", work.head_dim },
                  { "mlp_hidden", work.mlp_hidden } };
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i].v == 0)
            return kb_err_set(eb, KB_ERR_CONFIG, "%s: model.%s is missing: a model file "
                              "names the layer's shape (model.d_model, n_heads, n_kv_heads, "
                              "head_dim and mlp_hidden)", path, shape[i].key);
    snprintf(work.path, sizeof work.path, "%s", path);
    if ((rc = kb_model_validate(&work, eb)) != 0)
        return rc;
    *m = work;
    return 0;
}

int kb_model_act(const kb_model_cfg *m)
{
    return strcmp(m->activation, "gelu_tanh") == 0 ? KB_ACT_GELU_TANH : KB_ACT_SILU;
}

double kb_model_qscale(const kb_model_cfg *m)
{
    double s = m->query_pre_attn_scalar > 0 ? m->query_pre_attn_scalar : (double)m->head_dim;
    return 1.0 / sqrt(s);
}

void kb_model_foreach_key(kb_config_key_fn fn, void *ud)
{
    kb_config_foreach_scope(&scope_model, NULL, fn, ud);
}
