/*
 * Fuzz target: the two readers of `kbcl sweep` output. The input is a results file, CSV or,
 * when it starts with '{', JSON Lines (the name it gets says which, as users name theirs):
 *  - kbcl report: reading the rows and rendering the whole page (plots, table);
 *  - kbcl sweep --resume: checking the file against a sweep's grid, for two fixed sweeps
 *    (a collective over n_elem x system.sips.count; the decoder layer, whose rows have the
 *    time-split columns), without changing the file; what it would cut must be a partial
 *    last line only (no whole line is ever lost).
 * The sweeps are loaded once per process from the text below, with the configuration of
 * $KBCL_CONFIG_DIR as for kbcl (any configuration loads them: no key names an entry).
 */
#include "fuzz_util.h"

#include "kb_cli.h"

static const char plan_coll[] =
    "bench: ccl_allreduce\n"
    "device: none\n"
    "grid:\n"
    "  n_elem: [64, 256]\n"
    "  system.sips.count: [1, 2]\n";

/* the decoder sweep names a model file, which kbcl checks when the plan loads: a small one
 * written next to it */
static const char model_tiny[] =
    "model:\n"
    "  name: tiny\n"
    "  d_model: 64\n"
    "  n_heads: 4\n"
    "  n_kv_heads: 2\n"
    "  head_dim: 32\n"
    "  mlp_hidden: 128\n";

static const char plan_decoder[] =
    "bench: decoder_layer\n"
    "device: none\n"
    "model: tiny.yaml\n"
    "grid:\n"
    "  system.sips.count: [1, 2]\n"
    "  dtype: [f16, int8]\n";

#define NPLANS 2
static kbcl_sweep_plan *plans[NPLANS];

static void load_plans(void)
{
    static const char *const text[NPLANS] = { plan_coll, plan_decoder };
    static const char *const name[NPLANS] = { "coll.yaml", "decoder.yaml" };
    (void)kbf_file("tiny.yaml", model_tiny, strlen(model_tiny));
    for (int i = 0; i < NPLANS; i++) {
        kb_errbuf eb = { { 0 } };
        if (kbcl_sweep_plan_load(kbf_file(name[i], text[i], strlen(text[i])), NULL, &plans[i],
                                 &eb) != 0)
            KBF_ENV_FAIL("the fixed sweep %s does not load: %s", name[i], eb.msg);
    }
}

static void free_plans(void)
{
    for (int i = 0; i < NPLANS; i++)
        kbcl_sweep_plan_free(plans[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path;
    char *html = NULL;
    kb_errbuf eb;
    int rc;

    if (size > KBF_MAX_INPUT)
        return 0;
    if (!plans[0]) {
        load_plans();
        atexit(free_plans);
    }
    path = kbf_file(size && data[0] == '{' ? "rows.jsonl" : "rows.csv", data, size);

    eb.msg[0] = '\0';
    rc = kbcl_report_render(path, &html, &eb);
    if (rc != 0) {
        KBF_CHECK_ERR(rc, eb);
        KBF_CHECK(html == NULL, "a page from a failed report");
    } else {
        KBF_CHECK(html && strstr(html, "</html>"), "a page without its end");
    }
    free(html);

    for (int i = 0; i < NPLANS; i++) {
        int ndone = -1;
        size_t keep = 0;
        eb.msg[0] = '\0';
        rc = kbcl_sweep_resume_check(plans[i], path, &ndone, &keep, &eb);
        if (rc != 0) {
            KBF_CHECK_ERR(rc, eb);
            continue;
        }
        KBF_CHECK(ndone >= 0 && ndone <= kbcl_sweep_plan_npoints(plans[i]),
                  "%d points done of %d", ndone, kbcl_sweep_plan_npoints(plans[i]));
        /* no data loss: --resume cuts at most a partial last line, never a whole one */
        KBF_CHECK(keep <= size && (keep == 0 || data[keep - 1] == '\n') &&
                      !memchr(data + keep, '\n', size - keep),
                  "--resume would keep %zu of %zu bytes, cutting whole lines", keep, size);
    }
    return 0;
}
