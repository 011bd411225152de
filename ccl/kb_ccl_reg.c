/*
 * kb_ccl_reg — the run-time registry of collective algorithms (kb_ccl_reg.h): an array of
 * borrowed entry pointers, their checks, and the lookups that put the built-in table first;
 * and the rank = SIP placement's view of the built-in table (kb_dist_algo_at / _find,
 * kb_dist_algo.h), which lives here, below the process group (kb_dist.c) that looks modules up
 * through the registry, so neither file calls back into the other.
 */
#include "kb_ccl_reg.h"

#include <stdlib.h>
#include <string.h>

const kb_ccl_algo_impl *kb_dist_algo_at(int i)
{
    const kb_ccl_algo_impl *a;
    for (int k = 0, n = 0; (a = kb_ccl_algo_at(k)) != NULL; k++)
        if (a->sip && n++ == i)
            return a;
    return NULL;
}

const kb_ccl_algo_impl *kb_dist_algo_find(const char *module)
{
    const kb_ccl_algo_impl *a = kb_ccl_algo_find(module);
    return a && a->sip ? a : NULL;
}

struct kb_ccl_reg {
    const kb_ccl_algo_impl *algos[KB_CCL_REG_MAX]; /* borrowed */
    int nalgos;
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

static int known_kind(kb_coll_kind k) { return (int)k >= 0 && k < KB_COLL_NKINDS; }

/* The rank = SIP form: every hook set. */
static int check_sip(const kb_ccl_algo_impl *a, kb_errbuf *eb)
{
    const kb_ccl_sip_form *f = a->sip;
    if (!f->summary || !f->mapper || !f->validator || !f->kernel || !f->install || !f->policy ||
        !f->shards || !f->validate || !f->args || !f->grid || !f->reference)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': its rank = SIP form must set "
                          "every field (summary, mapper, validator, kernel, install, policy, "
                          "shards, validate, args, grid, reference)", a->module);
    return 0;
}

/* The rank = PE placement: what a job of it needs. */
static int check_pe(const kb_ccl_algo_impl *a, kb_errbuf *eb)
{
    if (!a->topology || !a->max_msg_bytes || !a->reference)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': a rank = PE kernel needs "
                          "topology, max_msg_bytes and reference", a->module);
    if (kb_topo_find(a->topology) < 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': unknown topology '%s'", a->module,
                          a->topology);
    if (a->flags & ~(KB_CCL_ANY_WORLD | KB_CCL_TYPED))
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': unknown flags 0x%x", a->module,
                          a->flags & ~(KB_CCL_ANY_WORLD | KB_CCL_TYPED));
    return 0;
}

int kb_ccl_reg_check_algo(const kb_ccl_reg *r, const kb_ccl_algo_impl *a, kb_errbuf *eb)
{
    int rc;

    if (!a)
        return kb_err_set(eb, KB_ERR_CONFIG, "a NULL algorithm entry");
    if (!a->module)
        return kb_err_set(eb, KB_ERR_CONFIG, "an algorithm without a module name");
    if (!kb_config_valid_name(a->module))
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%.64s': not a valid ccl.yaml name "
                          "(1-%d letters, digits, '_' or '-')", a->module, KB_CFG_NAME_MAX - 1);
    if (kb_ccl_algo_find(a->module))
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s' clashes with kbcl's built-in "
                          "module of that name (kbcl list shows them)", a->module);
    if (!a->summary)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': no summary", a->module);
    if (!known_kind(a->kind))
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': unknown collective kind %d",
                          a->module, (int)a->kind);
    if (!a->kernel && !a->sip)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': neither a rank = PE kernel nor a "
                          "rank = SIP form", a->module);
    if ((a->kernel && (rc = check_pe(a, eb)) != 0) || (a->sip && (rc = check_sip(a, eb)) != 0))
        return rc;
    for (int i = 0; r && i < r->nalgos; i++)
        if (!strcmp(r->algos[i]->module, a->module))
            return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s' is already registered",
                              a->module);
    return 0;
}

int kb_ccl_reg_add_algo(kb_ccl_reg *r, const kb_ccl_algo_impl *a, kb_errbuf *eb)
{
    int rc = kb_ccl_reg_check_algo(r, a, eb);
    if (rc)
        return rc;
    if (r->nalgos >= KB_CCL_REG_MAX)
        return kb_err_set(eb, KB_ERR_CONFIG, "algorithm '%s': at most %d can be added",
                          a->module, KB_CCL_REG_MAX);
    r->algos[r->nalgos++] = a;
    return 0;
}

const kb_ccl_algo_impl *kb_ccl_reg_algo_at(const kb_ccl_reg *r, int i)
{
    return r && i >= 0 && i < r->nalgos ? r->algos[i] : NULL;
}

/* The entry of that module, built-in first, then r's; NULL when neither has one. */
static const kb_ccl_algo_impl *find_any(const kb_ccl_reg *r, const char *module)
{
    const kb_ccl_algo_impl *a = module ? kb_ccl_algo_find(module) : NULL;
    for (int i = 0; !a && module && r && i < r->nalgos; i++)
        if (!strcmp(r->algos[i]->module, module))
            a = r->algos[i];
    return a;
}

const kb_ccl_algo_impl *kb_ccl_reg_find_algo(const kb_ccl_reg *r, const char *module)
{
    const kb_ccl_algo_impl *a = find_any(r, module);
    return a && a->kernel ? a : NULL;
}

const kb_ccl_algo_impl *kb_ccl_reg_find_dist(const kb_ccl_reg *r, const char *module)
{
    const kb_ccl_algo_impl *a = find_any(r, module);
    return a && a->sip ? a : NULL;
}
