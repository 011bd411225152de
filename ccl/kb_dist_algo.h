/*
 * kb_dist_algo — the registry of rank = SIP collective algorithms: one rank per SIP, a rank's
 * tensor spread over several PEs of its SIP. The process group (kb_dist.c) knows no algorithm
 * by name: it looks the module up in this table and calls the entry's functions for the
 * install plan, the layout of a rank's tensor, the validator, the launch arguments and the
 * grid. Each algorithm's file defines its entry (a const kb_dist_algo), and kb_dist.c's table
 * lists it. A new rank = SIP collective = its own file in ccl/ + one line in that table + its
 * test (tests/test_dist.c) + its ccl.yaml entry.
 * The process group's all_reduce launches the entry's kernel; its all_gather and
 * reduce_scatter (kb_dist_coll.c) run over the entry's wiring, recognised by its mapper
 * (all_pes: hierarchical_3level; pe0_all_cubes: the intercube plan); another mapper gets them
 * built on all_reduce. Limits: every entry is an all-reduce whose messages are f32 shards.
 */
#ifndef KB_DIST_ALGO_H
#define KB_DIST_ALGO_H

#include "kb_ccl.h"

/* Table lookup by module name; NULL when the module has no built-in rank = SIP form (the
 * algorithms plugins add are found through kb_ccl_reg_find_dist). The table: kb_ccl_reg.c. */
const kb_dist_algo *kb_dist_algo_find(const char *module);
const kb_dist_algo *kb_dist_algo_at(int i); /* NULL past the end */

/* The entry the context's process group runs (built-in or added at run time); NULL before
 * init_process_group has succeeded. */
const kb_dist_algo *kb_dist_algo_of(kb_ctx *ctx);

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
