/*
 * Fuzz target: sweep files (kbcl sweep FILE.yaml): parsing, every check `kbcl sweep` makes
 * before its first point (bench, parameters, devices, algorithms, set: entries and config axes
 * against the configuration) and the grid's points after exclude:, without running any.
 * Plugins are not loaded (a plugins: list is an error here), so no input makes the target
 * dlopen a file. The configuration is $KBCL_CONFIG_DIR's, as for kbcl (scripts/fuzz.sh and
 * the corpus test point it at configs/).
 */
#include "fuzz_util.h"

#include "kb_cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kbcl_sweep_plan *p = NULL;
    kb_errbuf eb;
    int rc;

    if (size > KBF_MAX_INPUT)
        return 0;
    eb.msg[0] = '\0';
    rc = kbcl_sweep_plan_load(kbf_file("sweep.yaml", data, size), NULL, &p, &eb);
    if (rc != 0) {
        KBF_CHECK_ERR(rc, eb);
        KBF_CHECK(p == NULL, "a plan from a failed load");
    } else {
        int n = kbcl_sweep_plan_npoints(p);
        KBF_CHECK(n >= 1 && n <= 1000000, "%d points", n);
    }
    kbcl_sweep_plan_free(p);
    return 0;
}
