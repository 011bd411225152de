/*
 * Fuzz target: the model file loader (configs/models/NAME.yaml, kb_model_load) and what the
 * decoder layer derives from a loaded model.
 */
#include <math.h>

#include "fuzz_util.h"

#include "kb_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kb_model_cfg m;
    kb_errbuf eb;
    int rc;

    if (size > KBF_MAX_INPUT)
        return 0;
    kb_model_defaults(&m);
    eb.msg[0] = '\0';
    rc = kb_model_load(&m, kbf_file("model.yaml", data, size), &eb);
    if (rc != 0) {
        KBF_CHECK_ERR(rc, eb);
        return 0;
    }
    /* a loaded model is a valid one (kb_model_load validates), with a usable shape */
    KBF_CHECK(kb_model_validate(&m, &eb) == 0, "loaded but invalid: %s", eb.msg);
    KBF_CHECK(m.d_model > 0 && m.n_heads > 0 && m.n_kv_heads > 0 && m.head_dim > 0 &&
                  m.mlp_hidden > 0,
              "shape %lld %lld %lld %lld %lld", (long long)m.d_model, (long long)m.n_heads,
              (long long)m.n_kv_heads, (long long)m.head_dim, (long long)m.mlp_hidden);
    {
        int act = kb_model_act(&m);
        double qs = kb_model_qscale(&m);
        KBF_CHECK(act == KB_ACT_SILU || act == KB_ACT_GELU_TANH, "activation %d", act);
        KBF_CHECK(isfinite(qs) && qs > 0, "query scale %g", qs);
        KBF_CHECK(isfinite(m.norm_eps) && isfinite(m.rope_theta) && isfinite(m.attn_softcap),
                  "a non-finite value: eps %g theta %g softcap %g", m.norm_eps, m.rope_theta,
                  m.attn_softcap);
    }
    return 0;
}
