/*
 * kb_ccl_reg — the run-time registry of collective algorithms (kb_ccl_reg.h): two arrays of
 * borrowed entry pointers, their checks and the lookups that put the built-in tables first;
 * and the built-in table of rank = SIP algorithms (kb_dist_algo_at / kb_dist_algo_find,
 * kb_dist_algo.h). The table lives here, below the process group (kb_dist.c) that looks
 * modules up through the registry, so neither file calls back into the other.
 */
#include "kb_ccl_reg.h"

#include <stdlib.h>
#include <string.h>

/* The rank = SIP algorithms, in the order error messages and `kbcl list` name them. */
static const kb_dist_algo *const sip_algos[] = {
    &kb_dist_algo_intercube,
    &kb_dist_algo_hierarchical,
};

const kb_dist_algo *kb_dist_algo_at(int i)
{
    if (i < 0 || (size_t)i >= sizeof sip_algos / sizeof sip_algos[0])
        return NULL;
    return sip_algos[i];
}

const kb_dist_algo *kb_dist_algo_find(const char *module)
{
    for (int i = 0; kb_dist_algo_at(i); i++)
        if (!strcmp(sip_algos[i]->module, module))
            return sip_algos[i];
    return NULL;
}

struct kb_ccl_reg {
    const kb_ccl_algo_impl *algos[KB_CCL_REG_MAX]; /* borrowed */
    int nalgos;
    const kb_dist_algo *dists[KB_CCL_REG_MAX];     /* borrowed */
    int ndists;
};

int kb_ccl_reg_create(kb_ccl_reg **out, kb_errbuf *eb)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
}

void kb_ccl_reg_destroy(kb_ccl_reg *r)
{
    free(r);
}

/* The name rules both models share; model names the table in messages. */
static int check_name(const char *module, const char *model, kb_errbuf *eb)
{
    if (!module)
        return kb_err_set(eb, KB_ERR_CONFIG, "a %s algorithm without a module name", model);
    if (!kb_config_valid_name(module))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%.64s': not a valid ccl.yaml name "
                          "(1-%d letters, digits, '_' or '-')", model, module,
                          KB_CFG_NAME_MAX - 1);
    if (kb_ccl_algo_find(module) || kb_dist_algo_find(module))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s' clashes with kbcl's built-in "
                          "module of that name (kbcl list shows them)", model, module);
    return 0;
}

static int known_kind(kb_coll_kind k) { return (int)k >= 0 && k < KB_COLL_NKINDS; }

int kb_ccl_reg_check_algo(const kb_ccl_reg *r, const kb_ccl_algo_impl *a, kb_errbuf *eb)
{
    static const char model[] = "rank = PE";
    int rc;

    if (!a)
        return kb_err_set(eb, KB_ERR_CONFIG, "a NULL %s algorithm entry", model);
    if ((rc = check_name(a->module, model, eb)) != 0)
        return rc;
    if (!a->summary || !a->topology || !a->kernel || !a->max_msg_bytes || !a->reference)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s': summary, topology, kernel, "
                          "max_msg_bytes and reference must all be set", model, a->module);
    if (!known_kind(a->kind))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s': unknown collective kind %d",
                          model, a->module, (int)a->kind);
    if (kb_topo_find(a->topology) < 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s': unknown topology '%s'", model,
                          a->module, a->topology);
    if (a->flags & ~(KB_CCL_ANY_WORLD | KB_CCL_TYPED))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s': unknown flags 0x%x", model,
                          a->module, a->flags & ~(KB_CCL_ANY_WORLD | KB_CCL_TYPED));
    for (int i = 0; r && i < r->nalgos; i++)
        if (!strcmp(r->algos[i]->module, a->module))
            return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s' is already registered",
                              model, a->module);
    return 0;
}

int kb_ccl_reg_check_dist(const kb_ccl_reg *r, const kb_dist_algo *a, kb_errbuf *eb)
{
    static const char model[] = "rank = SIP";
    int rc;

    if (!a)
        return kb_err_set(eb, KB_ERR_CONFIG, "a NULL %s algorithm entry", model);
    if ((rc = check_name(a->module, model, eb)) != 0)
        return rc;
    if (!a->summary || !a->mapper || !a->validator || !a->kernel || !a->install ||
        !a->policy || !a->shards || !a->validate || !a->args || !a->grid || !a->reference)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s': every field (summary, mapper, "
                          "validator, kernel, install, policy, shards, validate, args, grid, "
                          "reference) must be set", model, a->module);
    if (!known_kind(a->kind))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s': unknown collective kind %d",
                          model, a->module, (int)a->kind);
    for (int i = 0; r && i < r->ndists; i++)
        if (!strcmp(r->dists[i]->module, a->module))
            return kb_err_set(eb, KB_ERR_CONFIG, "%s algorithm '%s' is already registered",
                              model, a->module);
    return 0;
}

int kb_ccl_reg_add_algo(kb_ccl_reg *r, const kb_ccl_algo_impl *a, kb_errbuf *eb)
{
    int rc = kb_ccl_reg_check_algo(r, a, eb);
    if (rc)
        return rc;
    if (r->nalgos >= KB_CCL_REG_MAX)
        return kb_err_set(eb, KB_ERR_CONFIG, "rank = PE algorithm '%s': at most %d can be "
                          "added", a->module, KB_CCL_REG_MAX);
    r->algos[r->nalgos++] = a;
    return 0;
}

int kb_ccl_reg_add_dist(kb_ccl_reg *r, const kb_dist_algo *a, kb_errbuf *eb)
{
    int rc = kb_ccl_reg_check_dist(r, a, eb);
    if (rc)
        return rc;
    if (r->ndists >= KB_CCL_REG_MAX)
        return kb_err_set(eb, KB_ERR_CONFIG, "rank = SIP algorithm '%s': at most %d can be "
                          "added", a->module, KB_CCL_REG_MAX);
    r->dists[r->ndists++] = a;
    return 0;
}

const kb_ccl_algo_impl *kb_ccl_reg_algo_at(const kb_ccl_reg *r, int i)
{
    return r && i >= 0 && i < r->nalgos ? r->algos[i] : NULL;
}

const kb_dist_algo *kb_ccl_reg_dist_at(const kb_ccl_reg *r, int i)
{
    return r && i >= 0 && i < r->ndists ? r->dists[i] : NULL;
}

const kb_ccl_algo_impl *kb_ccl_reg_find_algo(const kb_ccl_reg *r, const char *module)
{
    const kb_ccl_algo_impl *a = module ? kb_ccl_algo_find(module) : NULL;
    for (int i = 0; !a && module && r && i < r->nalgos; i++)
        if (!strcmp(r->algos[i]->module, module))
            a = r->algos[i];
    return a;
}

const kb_dist_algo *kb_ccl_reg_find_dist(const kb_ccl_reg *r, const char *module)
{
    const kb_dist_algo *a = module ? kb_dist_algo_find(module) : NULL;
    for (int i = 0; !a && module && r && i < r->ndists; i++)
        if (!strcmp(r->dists[i]->module, module))
            a = r->dists[i];
    return a;
}
