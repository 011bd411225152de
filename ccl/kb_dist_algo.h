/*
 * kb_dist_algo — the rank = SIP placement's view of the one algorithm registry: the entries
 * with a rank = SIP form of their own (kb_ccl_sip_form, kbcl_ccl.h). The process group
 * (kb_dist.c) knows no algorithm by name: it looks the module up here and calls the form's
 * functions for the install plan, the layout of a rank's tensor, the validator, the launch
 * arguments and the grid. A form is defined next to its kernel, and its entry (in the table of
 * kb_ccl_algos.c) points at it. The process group's all_reduce launches the form's kernel; its
 * all_gather and reduce_scatter (kb_dist_coll.c) run over the form's wiring, recognised by its
 * mapper (all_pes: hierarchical_3level; pe0_all_cubes: the intercube plan); another mapper gets
 * them built on all_reduce. Limits: every form is an all-reduce whose messages are f32 shards.
 */
#ifndef KB_DIST_ALGO_H
#define KB_DIST_ALGO_H

#include "kb_ccl.h"

/* The built-in entry of that module with a rank = SIP form, or NULL (an entry plugins add is
 * found through kb_ccl_reg_find_dist). */
const kb_ccl_algo_impl *kb_dist_algo_find(const char *module);
/* The built-in entries with a rank = SIP form, in table order (NULL past the end). */
const kb_ccl_algo_impl *kb_dist_algo_at(int i);

/* The entry the context's process group runs (built-in or added at run time; its sip is set);
 * NULL before init_process_group has succeeded. */
const kb_ccl_algo_impl *kb_dist_algo_of(kb_ctx *ctx);

/*
 * Validator multi_pe_sip_local, shared by the entries: every rank passed a tensor that lives
 * on its own SIP, has `shards` equal shards and rank 0's shape and dtype; shard_ok (NULL =
 * anywhere) accepts each shard's place. `layout` says in the message how the rows must be
 * spread ("rows over every PE"). Defined in kb_dist_algo.c.
 */
int kb_dist_check_sip_local(kb_ctx *ctx, kb_tensor *const *t, int ws, int shards,
                            const char *what, const char *layout,
                            int (*shard_ok)(const kb_shard_spec *sh));

#endif
