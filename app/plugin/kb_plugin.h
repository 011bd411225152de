/*
 * kb_plugin — kbcl's plugin interface: a shared object that adds collective algorithms (in
 * both rank models) and benches to kbcl without rebuilding it (docs/plugins.md), and the
 * loader the kbcl commands use.
 *
 * The ABI. A plugin exports two symbols:
 *   const int kbcl_plugin_abi = KB_PLUGIN_ABI_VERSION;      (write KB_PLUGIN_DECLARE_ABI;)
 *   int kbcl_plugin_init(kb_plugin_reg *reg, int abi_version);
 * The loader dlopen()s the file (RTLD_NOW | RTLD_LOCAL: every undefined symbol is resolved at
 * once, none of the plugin's leaks into the next plugin), reads kbcl_plugin_abi and refuses
 * the plugin unless it is the loader's own KB_PLUGIN_ABI_VERSION, before any of its code runs;
 * then calls kbcl_plugin_init once with a registration table and that version. init calls the
 * table's functions to name itself and add entries, and returns 0, or nonzero (a message in
 * reg->err) to refuse. A refused load keeps nothing: no entry, no handle.
 *
 * Versioning rule: KB_PLUGIN_ABI_VERSION is one integer, matched exactly (no ranges, no
 * negotiation). It is raised by every change that could break a compiled plugin: the layout
 * or meaning of kb_plugin_reg, of the entries a plugin hands over (kb_ccl_algo_impl,
 * kb_dist_algo, kb_bench) and of what they receive (kb_kargs, kb_bench_args, kb_bench_result,
 * kb_tl calls ...), or the signature or meaning of any public function a plugin may call.
 * Adding a function or a flag bit kbcl did not have does not raise it. A plugin is built
 * against the headers of the kbcl that loads it; a mismatch is a configuration error, never a
 * crash.
 *
 * The symbols a plugin calls (tl_*, kb_ccl_*, kb_bench_check ...) are kbcl's own: the kbcl
 * executable links every kbcl library whole and exports its symbols (--export-dynamic), and a
 * plugin links no kbcl library, so its references resolve to the executable when it is loaded
 * and the plugin shares kbcl's one copy of everything. A plugin that linked the static
 * libraries again would carry a second, separate copy of kbcl's code (and of any state it
 * keeps). A program other than kbcl that loads plugins must export the same symbols.
 *
 * The loader: a kb_plugins set holds every plugin loaded into it, what each added, the
 * collective registry their algorithms went to (kb_ccl_reg, lent to contexts through
 * kb_ccl_cfg.reg) and their benches. It is an explicit object the commands create, pass and
 * destroy; nothing here is a global. Loaded code is process-wide by nature, so a process
 * should load its plugins into one set; a forked child (a sweep worker) inherits the parent's
 * set and its loaded plugins as they are. Errors: every refusal is KB_ERR_CONFIG (exit 2)
 * with a message that starts with the file and names the symbol or entry at fault.
 * Limits: KB_PLUGINS_MAX plugins per set, KB_PLUGIN_MAX_ENTRIES entries of each kind per
 * plugin.
 *
 * Ownership: entries are registered by pointer and must be static data of the plugin (they
 * stay valid until the set is destroyed, which unloads the plugins); the set must outlive
 * every context, bench run and result that uses one of its entries.
 */
#ifndef KB_PLUGIN_H
#define KB_PLUGIN_H

#include "kb_bench.h"
#include "kb_ccl.h"
#include "kb_ccl_reg.h"
#include "kb_dist_algo.h"
#include "kbcl_plugin.h"

/* ---- the loader ---- */

#define KB_PLUGINS_MAX 32
#define KB_PLUGIN_MAX_ENTRIES 64

/* One loaded plugin, as listings show it. */
typedef struct kb_plugin_info {
    const char *path;                  /* the file, as resolved (realpath) */
    const char *name, *summary;        /* describe()'s, or the file's name and "" */
    const kb_ccl_algo_impl *algos[KB_PLUGIN_MAX_ENTRIES];
    int nalgos;
    const kb_dist_algo *dists[KB_PLUGIN_MAX_ENTRIES];
    int ndists;
    const kb_bench *benches[KB_PLUGIN_MAX_ENTRIES];
    int nbenches;
} kb_plugin_info;

typedef struct kb_plugins kb_plugins;

/* An empty set (KB_ERR_NOMEM). kb_plugins_destroy(NULL) is a no-op; destroy unloads the
 * plugins, last loaded first. */
int kb_plugins_create(kb_plugins **out, kb_errbuf *eb);
void kb_plugins_destroy(kb_plugins *ps);

/*
 * Loads the plugin at path (a file kbcl can open; a relative path is relative to the current
 * folder). Loading a file the set already holds (the same realpath) does nothing. Errors
 * (KB_ERR_CONFIG, "PATH: ..."): no such file, not a shared object (dlerror's reason: a missing
 * symbol kbcl does not export, a wrong architecture), no kbcl_plugin_init or kbcl_plugin_abi,
 * another ABI version, init refused, an entry refused (its name and why).
 */
int kb_plugins_load(kb_plugins *ps, const char *path, kb_errbuf *eb);
/*
 * Loads every element of a ':'-separated list (KBCL_PLUGIN_PATH): a file, or a folder whose
 * files ending in ".so" load in name order. Empty elements are skipped. Stops at the first
 * error; what loaded before it stays loaded.
 */
int kb_plugins_load_list(kb_plugins *ps, const char *list, kb_errbuf *eb);

/* The loaded plugins in load order (NULL past the end or for ps NULL). */
const kb_plugin_info *kb_plugins_at(const kb_plugins *ps, int i);
/* The registry holding every loaded plugin's collectives (NULL for ps NULL). */
const kb_ccl_reg *kb_plugins_ccl(const kb_plugins *ps);
/* A bench by name: the built-in table, then the plugins' (ps NULL = built-ins only). */
const kb_bench *kb_plugins_find_bench(const kb_plugins *ps, const char *name);

#endif
