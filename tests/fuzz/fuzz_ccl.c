/*
 * Fuzz target: the collective library's configuration loader (configs/ccl.yaml,
 * kb_ccl_config_load), its checks against the default machine, and the effective parameters
 * of every entry. The loader is documented all or nothing: a failed load must leave the
 * configuration exactly as it was.
 */
#include "fuzz_util.h"

#include "kb_ccl_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kb_ccl_cfg ccl, before;
    kb_config cfg;
    kb_errbuf eb;
    int rc;

    if (size > KBF_MAX_INPUT)
        return 0;
    kb_config_defaults(&cfg);
    kb_ccl_config_defaults(&ccl);
    before = ccl;
    eb.msg[0] = '\0';
    rc = kb_ccl_config_load(&ccl, kbf_file("ccl.yaml", data, size), &eb);
    if (rc != 0) {
        KBF_CHECK_ERR(rc, eb);
        KBF_CHECK(memcmp(&ccl, &before, sizeof ccl) == 0, "a failed load changed the config");
    } else {
        KBF_CHECK(ccl.nalgos >= 0 && ccl.nalgos <= KB_CFG_MAX_ALGOS, "%d entries", ccl.nalgos);
        KBF_CHECK(ccl.nplugins >= 0 && ccl.nplugins <= KB_CCL_MAX_PLUGINS, "%d plugins",
                  ccl.nplugins);
        for (int i = 0; i < ccl.nalgos; i++) {
            const kb_ccl_algo *a = &ccl.algos[i];
            kb_ccl_params p = kb_ccl_config_params(&ccl, a);
            KBF_CHECK(kb_ccl_config_find(&ccl, a->name) == a, "entry '%s' found elsewhere",
                      a->name);
            KBF_CHECK(memchr(a->name, 0, sizeof a->name) && memchr(a->module, 0, sizeof a->module)
                          && memchr(p.buffer_kind, 0, sizeof p.buffer_kind),
                      "an unterminated name");
        }
        eb.msg[0] = '\0';
        rc = kb_ccl_config_validate(&ccl, &cfg.topo, &eb);
        if (rc != 0)
            KBF_CHECK_ERR(rc, eb);
    }
    kb_config_fini(&cfg);
    return 0;
}
