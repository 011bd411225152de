/*
 * kb_ccl_reg — collective algorithms added at run time (by plugins: docs/plugins.md), next to
 * the built-in table of kb_ccl_algos.c. There is one entry type (kb_ccl_algo_impl), and an
 * entry carries its placements: a rank = PE kernel, a rank = SIP form, or both. A registry
 * is an explicit object, not a global: the application creates it, fills it, and hands it to
 * the contexts that may run its algorithms through their collective configuration
 * (kb_ccl_cfg.reg, borrowed). Lookups through a registry see the built-in table first, then
 * its own entries, so a built-in can never be shadowed.
 *
 * Names: an added module must be a valid ccl.yaml name (the application may create an entry of
 * that name for it), must not be a built-in module, and must not be in the registry already.
 *
 * Ownership: the registry holds pointers only. The entries, their strings and their functions
 * belong to whoever added them (the plugin loader's copies, pointing at a plugin's static
 * data) and must outlive the registry and every context that was given it. Limits:
 * KB_CCL_REG_MAX entries.
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
 * is configuration to kbcl) for an incomplete entry (a NULL name or summary, an unknown kind,
 * neither a kernel nor a rank = SIP form, a rank = PE kernel without its topology, message
 * size or reference, an unknown topology or flag, a rank = SIP form with a hook unset), a name
 * that is not a valid ccl.yaml name, or a clash; the message names the module.
 */
int kb_ccl_reg_check_algo(const kb_ccl_reg *r, const kb_ccl_algo_impl *a, kb_errbuf *eb);
/* Checks, then adds (KB_ERR_CONFIG past KB_CCL_REG_MAX). */
int kb_ccl_reg_add_algo(kb_ccl_reg *r, const kb_ccl_algo_impl *a, kb_errbuf *eb);

/* The added entries, in the order they were added (NULL past the end or for r NULL). */
const kb_ccl_algo_impl *kb_ccl_reg_algo_at(const kb_ccl_reg *r, int i);

/* Lookups by module, the built-in table first, then r's entries (r NULL = the built-ins
 * only): the entry when it has a rank = PE kernel (find_algo) or a rank = SIP form
 * (find_dist), else NULL. */
const kb_ccl_algo_impl *kb_ccl_reg_find_algo(const kb_ccl_reg *r, const char *module);
const kb_ccl_algo_impl *kb_ccl_reg_find_dist(const kb_ccl_reg *r, const char *module);

#endif
