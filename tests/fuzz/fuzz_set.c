/*
 * Fuzz target: `--set NAME=VALUE` assignments (kbcl_config_set: ccl.* keys to the collective
 * library, every other key to the machine), one per input line, applied in order to the
 * default configuration as `kbcl run --set A --set B ...` applies them; then the cross-field
 * checks of both. A failed assignment does not stop the rest, so one input reaches many keys.
 */
#include "fuzz_util.h"

#include "kb_ccl_config.h"
#include "kb_cli.h"

/* argv strings are short; longer lines are cut here as a shell would never pass them on */
#define SET_LINE_MAX 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kb_ccl_cfg ccl;
    kb_config cfg;
    kb_errbuf eb;
    char line[SET_LINE_MAX + 1];
    size_t i = 0;
    int rc;

    if (size > KBF_MAX_INPUT)
        return 0;
    kb_config_defaults(&cfg);
    kb_ccl_config_defaults(&ccl);
    while (i < size) {
        const uint8_t *nl = memchr(data + i, '\n', size - i);
        size_t len = nl ? (size_t)(nl - (data + i)) : size - i;
        size_t n = len < SET_LINE_MAX ? len : SET_LINE_MAX;
        /* a C string, as argv holds it: an embedded NUL ends it */
        memcpy(line, data + i, n);
        line[n] = '\0';
        i += len + 1;
        eb.msg[0] = '\0';
        rc = kbcl_config_set(&cfg, &ccl, line, &eb);
        if (rc != 0)
            KBF_CHECK_ERR(rc, eb);
    }
    eb.msg[0] = '\0';
    if ((rc = kb_config_validate(&cfg, &eb)) != 0)
        KBF_CHECK_ERR(rc, eb);
    eb.msg[0] = '\0';
    if ((rc = kb_ccl_config_validate(&ccl, &cfg.topo, &eb)) != 0)
        KBF_CHECK_ERR(rc, eb);
    KBF_CHECK(ccl.nalgos >= 0 && ccl.nalgos <= KB_CFG_MAX_ALGOS, "%d entries", ccl.nalgos);
    kb_config_fini(&cfg);
    return 0;
}
