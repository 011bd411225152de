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

/* What an entry's argument builder knows of one rank's launch. */
typedef struct kb_dist_launch {
    kb_tensor *t;      /* the rank's tensor, already validated */
    int rank, ws;      /* rank = its SIP; world size = the SIP count */
    int64_t n;         /* elements per shard */
    int root_cube;     /* ccl.yaml root_cube, else the SIP's last cube */
} kb_dist_launch;

typedef struct kb_dist_algo {
    const char *module;    /* ccl.yaml `module` */
    const char *summary;   /* for `kbcl list` */
    /* which PEs of a rank take part (the seed's mapper) and the layout check its tensor must
     * pass (validator), by name, for `kbcl list` and messages: properties of the algorithm,
     * not configuration */
    const char *mapper, *validator;
    kb_coll_kind kind;
    kb_kernel_fn kernel;
    /* Installs IPCQ for a world of ws ranks, one per SIP (timed; once per context). */
    int (*install)(kb_ctx *ctx, const kb_ipcq_cfg *cfg, int ws);
    /* The DPPolicy and the shard (participating PE) count of a rank's tensor. */
    kb_dp_policy (*policy)(const kb_machine *m);
    int (*shards)(const kb_machine *m);
    /* Layout validator over every rank's tensor (t[ws]); `what` prefixes the message. */
    int (*validate)(kb_ctx *ctx, kb_tensor *const *t, int ws, const char *what);
    /* Fills one rank's (zeroed) kernel arguments. */
    int (*args)(kb_ctx *ctx, const kb_dist_launch *l, kb_kargs *a);
    /* The launch grid per SIP (PEs per cube, cubes, SIPs). */
    kb_grid (*grid)(const kb_machine *m, int ws);
    /* Host reference over every shard of every rank as one tile each (rank-major). */
    kb_ccl_ref_fn reference;
} kb_dist_algo;

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

/* The entries, each defined next to its kernel. */
extern const kb_dist_algo kb_dist_algo_intercube;     /* kb_ccl_intercube.c */
extern const kb_dist_algo kb_dist_algo_hierarchical;  /* kb_ccl_algos.c */

#endif
