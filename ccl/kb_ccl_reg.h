/*
 * kb_ccl_reg — collective algorithms added at run time (by plugins: docs/plugins.md), in both
 * rank models, next to the built-in tables of kb_ccl_algos.c (rank = PE) and kb_dist.c
 * (rank = SIP). A registry is an explicit object, not a global: the application creates it,
 * fills it, and hands it to the contexts that may run its algorithms through their collective
 * configuration (kb_ccl_cfg.reg, borrowed). Lookups through a registry see the built-in
 * tables first, then its own entries, so a built-in can never be shadowed.
 *
 * Names: an added module must be a valid ccl.yaml name (the application may create an entry of
 * that name for it), must not be a built-in module of either rank model (a rank = PE entry
 * named like a rank = SIP built-in would change how the collective bench routes that
 * built-in's ccl.yaml entries), and must not be in the registry already in the same model. The
 * same name may be added once per model (one algorithm with both forms, as
 * hierarchical_allreduce has).
 *
 * Ownership: the registry holds pointers only. The entries, their strings and their functions
 * belong to whoever added them (a plugin's static data) and must outlive the registry and
 * every context that was given it. Limits: KB_CCL_REG_MAX entries per model.
 */
#ifndef KB_CCL_REG_H
#define KB_CCL_REG_H

#include "kb_ccl.h"
#include "kb_dist_algo.h"

#define KB_CCL_REG_MAX 256

typedef struct kb_ccl_reg kb_ccl_reg;

/* An empty registry (KB_ERR_NOMEM). kb_ccl_reg_destroy(NULL) is a no-op. */
int kb_ccl_reg_create(kb_ccl_reg **out, kb_errbuf *eb);
void kb_ccl_reg_destroy(kb_ccl_reg *r);

/*
 * Whether the entry could be added: 0, or KB_ERR_CONFIG (an entry comes from a plugin, which
 * is configuration to kbcl) for an incomplete entry (a NULL name, kernel or function, an
 * unknown kind, topology or flag), a name that is not a valid ccl.yaml name, or a clash (see
 * above); the message names the module.
 */
int kb_ccl_reg_check_algo(const kb_ccl_reg *r, const kb_ccl_algo_impl *a, kb_errbuf *eb);
int kb_ccl_reg_check_dist(const kb_ccl_reg *r, const kb_dist_algo *a, kb_errbuf *eb);
/* Checks, then adds (KB_ERR_CONFIG past KB_CCL_REG_MAX; KB_ERR_NOMEM). */
int kb_ccl_reg_add_algo(kb_ccl_reg *r, const kb_ccl_algo_impl *a, kb_errbuf *eb);
int kb_ccl_reg_add_dist(kb_ccl_reg *r, const kb_dist_algo *a, kb_errbuf *eb);

/* The added entries, in the order they were added (NULL past the end or for r NULL). */
const kb_ccl_algo_impl *kb_ccl_reg_algo_at(const kb_ccl_reg *r, int i);
const kb_dist_algo *kb_ccl_reg_dist_at(const kb_ccl_reg *r, int i);

/* Lookups by module: the built-in table, then r's entries (r NULL = the built-ins only). */
const kb_ccl_algo_impl *kb_ccl_reg_find_algo(const kb_ccl_reg *r, const char *module);
const kb_dist_algo *kb_ccl_reg_find_dist(const kb_ccl_reg *r, const char *module);

#endif
