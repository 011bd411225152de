/*
 * kb_ccl_config — the collective library's configuration (configs/ccl.yaml): `defaults` that
 * every algorithm starts from and `algorithms.<name>` entries (module = implementation,
 * topology, root_cube, root, and overrides of any default but `algorithm`). Precedence: entry >
 * defaults (> for world_size: the SIP count). Loaded with host's schema-driven YAML walker
 * (kb_config_load_sections), so errors carry FILE:LINE:COLUMN and unknown keys are errors.
 *
 * A top-level `plugins:` list names shared objects that add algorithms and benches
 * (docs/plugins.md); the file only records them, resolved against the file's folder, and the
 * application loads them. What they added reaches the library through `reg`, the run-time
 * registry of algorithms (kb_ccl_reg.h) that lookups through a context's configuration see
 * after the built-in tables.
 *
 * A context gets the configuration with kb_ccl_config_attach (a copy); the distributed
 * runtime and the benches read it back with kb_ccl_config_of. Which PEs take part and which
 * shard layout an algorithm needs are properties of its implementation (ccl/kb_ccl.h's
 * registry), not configuration.
 *
 * Ownership: a kb_ccl_cfg is a plain struct (fixed arrays, nothing to free) the caller owns;
 * `reg` is borrowed and must outlive every copy of the struct that is used.
 */
#ifndef KB_CCL_CONFIG_H
#define KB_CCL_CONFIG_H

#include <stdint.h>

#include "kb_config.h"
#include "kb_runtime.h"

#define KB_CFG_MAX_ALGOS 32
#define KB_CCL_MAX_PLUGINS 8
#define KB_CCL_PLUGIN_PATH_MAX 512

/* Parameters: the defaults, or an entry's overrides (0 / "" / -1 = inherit). */
typedef struct kb_ccl_params {
    char algorithm[KB_CFG_NAME_MAX];   /* defaults only: the algorithm to run */
    char buffer_kind[16];              /* tcm | hbm | sram */
    int backpressure;                  /* bool */
    int posted_sends;                  /* bool: streamed kernels post their sends */
    int small_lanes;                   /* bool: all_reduce_shards' small form where it wins */
    int n_slots;                       /* >= 1 */
    uint64_t slot_size;                /* bytes, >= 16 */
    int world_size;                    /* 0 = derive (SIP count); > 0 = rank = PE */
    int64_t n_elem;                    /* elements per rank tile, 0 = bench default */
    int channels;                      /* rank = SIP lanes: PEs per SIP that carry the
                                        * collective (NCCL's channels); 0 = every PE */
} kb_ccl_params;

typedef struct kb_ccl_algo {
    char name[KB_CFG_NAME_MAX];        /* key under algorithms: */
    char module[KB_CFG_NAME_MAX];      /* algorithm implementation (kernel) name */
    char topology[KB_CFG_NAME_MAX];
    int root_cube;                     /* -1 = unset */
    int root;                          /* root rank of a broadcast / reduce; -1 = unset (0) */
    char op[8];                        /* reduction: sum|prod|max|min|avg; "" = unset (sum) */
    char dtype[8];                     /* tile dtype: f16|bf16|f32; "" = unset (f16) */
    kb_ccl_params p;                   /* overrides; unset fields are 0 / "" / -1 (backpressure,
                                        * posted_sends, small_lanes) */
    int line;                          /* where it was defined, for messages */
} kb_ccl_algo;

typedef struct kb_ccl_cfg {
    kb_ccl_params defaults;
    kb_ccl_algo algos[KB_CFG_MAX_ALGOS];
    int nalgos;
    char path[512];                    /* the file loaded last, "" = built-in defaults */
    /* `plugins:` of the files loaded, in order, each once; relative paths were resolved
     * against their file's folder */
    char plugins[KB_CCL_MAX_PLUGINS][KB_CCL_PLUGIN_PATH_MAX];
    int nplugins;
    /* borrowed: algorithms added at run time (kb_ccl_reg.h); NULL = the built-ins only */
    const struct kb_ccl_reg *reg;
} kb_ccl_cfg;

/* Built-in defaults, no algorithm entries. */
void kb_ccl_config_defaults(kb_ccl_cfg *c);
/* Loads a ccl.yaml over c; all or nothing (c is unchanged on error). */
int kb_ccl_config_load(kb_ccl_cfg *c, const char *path, kb_errbuf *eb);
/* Applies "ccl.defaults.<key>=value" or "ccl.algorithms.<name>.<key>=value" (a new name
 * adds an entry). ccl.defaults.n_slots and ccl.defaults.slot_size also clear that key in every
 * entry loaded so far: set for a run, the queue's performance parameters reach every entry,
 * including those that ship their own (a later entry-level assignment still wins). Errors are
 * prefixed "--set ASSIGNMENT". */
int kb_ccl_config_set(kb_ccl_cfg *c, const char *assignment, kb_errbuf *eb);
/* Cross-field checks against the machine (world sizes, root cubes, the selected entry). */
int kb_ccl_config_validate(const kb_ccl_cfg *c, const kb_topo_cfg *t, kb_errbuf *eb);

/* The entry called name, or NULL. */
const kb_ccl_algo *kb_ccl_config_find(const kb_ccl_cfg *c, const char *name);
/* Effective parameters of an entry (NULL = the defaults alone). */
kb_ccl_params kb_ccl_config_params(const kb_ccl_cfg *c, const kb_ccl_algo *entry);

/* Every ccl key (defaults, then entry keys) for listings and the docs check. */
void kb_ccl_config_foreach_key(kb_config_key_fn fn, void *ud);

/* Gives ctx a copy of c (replacing any earlier one). KB_ERR_NOMEM on failure. */
int kb_ccl_config_attach(kb_ctx *ctx, const kb_ccl_cfg *c);
/* The context's configuration; the built-in defaults (attached on first use) when none was
 * given; NULL only when that allocation fails. */
const kb_ccl_cfg *kb_ccl_config_of(kb_ctx *ctx);

#endif
