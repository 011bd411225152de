/*
 * kbcl_plugin — kbcl's public plugin API (docs/plugins.md, docs/api.md): a shared object that
 * adds collective algorithms (kbcl_ccl.h) and benches to kbcl without rebuilding it.
 *
 * A bench is a table entry: integer parameters (name, default, range, doc), a `run` function
 * executed as the host program inside the simulation (it creates tensors, launches kernels and
 * marks the measured region), and a `verify` function called after the simulation, outside
 * simulated time, that reads the outputs back, compares them with a host computation and fills
 * the result. sim_time_ns is the simulated time of the measured region, so it is the same with
 * and without --device none / --verify-data.
 *
 * The ABI: a plugin exports kbcl_plugin_abi (KB_PLUGIN_DECLARE_ABI) and kbcl_plugin_init. kbcl
 * dlopen()s the file, refuses it unless kbcl_plugin_abi is KB_PLUGIN_ABI_VERSION, then calls
 * init once with a registration table whose functions add the plugin's entries. A plugin is
 * compiled against these public headers only and links no kbcl library: the symbols it calls
 * are the kbcl executable's, which exports exactly the functions the public headers declare
 * (KB_API), so every call a plugin compiles resolves when it loads.
 *
 * Versions: kbcl_plugin_abi is matched exactly, and raised by a change to kb_plugin_reg, to
 * what a plugin receives (kb_kargs, kb_bench_args, kb_bench_result ...) or to a public
 * function's signature or meaning. Each entry a plugin registers carries its own size and
 * version in a kb_entry_head (kbcl_base.h; .head = KB_BENCH_HEAD and the like): kbcl copies it
 * into its own layout, reading fields appended since the plugin was built as zero, and
 * refuses by name an entry without a head or of a version it does not know
 * (docs/plugins.md section 7).
 *
 * Ownership: kbcl copies the entries; the strings and functions they point to must be the
 * plugin's static data, valid until kbcl unloads it. Errors: every refusal is a configuration
 * error (exit 2) whose message starts with the file and names the symbol or entry at fault.
 */
#ifndef KBCL_PLUGIN_H
#define KBCL_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "kbcl_ccl.h"
#include "kbcl_runtime.h"
#include "kbcl_tl.h"

/* ---- benches ---- */

#define KB_BENCH_MAX_PARAMS 8
#define KB_BENCH_MAX_EXTRAS 24

typedef struct kb_bench_param {
    const char *name;
    int64_t dflt, min, max;
    const char *doc;
} kb_bench_param;

typedef struct kb_bench_args {
    int64_t p[KB_BENCH_MAX_PARAMS];   /* resolved values, in the bench's param order */
    int verify;                        /* --verify-data */
    /* --size: the collective's buffer per rank in bytes, nccl-tests' size (see
     * kb_bench_coll_size); 0 = not given (the tile length comes from ccl.yaml's n_elem).
     * Only a bench with size_elem_bytes > 0 gets one. */
    int64_t size_bytes;
    /* --model FILE and --dtype NAME for a bench that takes them (kb_bench_takes_model;
     * NULL = not given). */
    const char *model;
    const char *dtype;
} kb_bench_args;

typedef struct kb_bench_result {
    int verified;                      /* 1 passed, 0 failed, -1 not checked */
    char line[256];                    /* the bench's result line ("  gemm (...)") */
    char ok_text[64];                  /* printed after "line: " on success ("OK" if empty) */
    char detail[512];                  /* why verification failed */
    int have_digest;
    uint64_t digest;                   /* FNV-1a 64 of the verified output bytes (the ccl
                                          bench beyond 64 KiB: kb_vquery.h's block digest) */
    int have_err;
    double max_abs_err, err_bound;     /* worst |got - ref| and the bound it was checked against */
    kb_time t_begin, t_end;            /* measured region (simulated) */
    /* the resource reserved longest in the region (kb_bench_mark_begin / _end): its kind and
     * place ("noc sip0/cube3"), and that time over the region's; empty when not measured */
    char busiest[96];
    double busiest_frac;
    /* the bound of the region (kb_bench_mark_end): the longest time one resource (a DMA
     * engine's channels together) needs for the bytes it carried at its bandwidth, or its
     * busy time when that is less; which resource; 0 and "" when not measured */
    double bound_ns;
    char bound_resource[96];
    void *busy_mark;                   /* owned: every resource's busy time and bytes at
                                        * mark_begin */
    int nextras;
    struct { const char *name; double value; } extras[KB_BENCH_MAX_EXTRAS];
    /* the workload's lower bound on the machine (kb_roofline.h): what its flops, HBM bytes
     * and link traffic need at the machine's peaks, whatever the schedule; set by the bench
     * (kb_bench_set_roofline), have_roofline 0 when it has none. Unlike bound_ns, which is
     * the busiest resource's time for what the run did move, it does not depend on the run.
     * Last in the struct: a plugin compiled before it never sees it and reports none. */
    int have_roofline;
    kb_roofline roofline;
} kb_bench_result;

typedef struct kb_bench {
    kb_entry_head head;                /* a plugin's: KB_BENCH_HEAD (kbcl_base.h) */
    const char *name;
    const char *summary;
    kb_bench_param params[KB_BENCH_MAX_PARAMS];
    int nparams;
    size_t state_size;                 /* zeroed state passed to run/verify */
    int (*run)(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res);
    int (*verify)(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res);
    /* Frees what run/verify malloc'd in state (tensors belong to the context). May be NULL. */
    void (*cleanup)(void *state);
    /* > 0: the bench runs a collective and takes --size (args.size_bytes) in elements of this
     * many bytes; 0: it takes no size. */
    int size_elem_bytes;
    /* Appended (an entry built before reads NULLs): names of parameter i's values (a
     * NULL-terminated list, value k named param_names[i][k]; NULL: integers only).
     * --param NAME=WORD and sweep files take a name as well as its integer; `kbcl list`
     * shows them. */
    const char *const *param_names[KB_BENCH_MAX_PARAMS];
} kb_bench;

#define KB_BENCH_VERSION 1u
#define KB_BENCH_HEAD { (uint32_t)sizeof(kb_bench), KB_BENCH_VERSION }

/* Helpers for benches. */
KB_API uint64_t kb_fnv1a64(const void *data, size_t n, uint64_t h);
#define KB_FNV1A64_INIT UINT64_C(0xcbf29ce484222325)
/* Appends a named number to the result (text output, --json, sweeps' columns where they
 * name it); at most KB_BENCH_MAX_EXTRAS per result, later ones are not kept. */
KB_API void kb_bench_add_extra(kb_bench_result *r, const char *name, double value);
/* Marks the start/end of the measured region at the current simulated time. */
KB_API void kb_bench_mark_begin(kb_ctx *ctx, kb_bench_result *r);
KB_API void kb_bench_mark_end(kb_ctx *ctx, kb_bench_result *r);

/*
 * Checks got[i] (rounded outputs) against ref[i] (exact) with per-element bound
 * 0.5 ulp_f16(ref) + acc_bound[i] (acc_bound may be NULL); records the worst error and
 * returns 1 when all pass. For f32 outputs the ulp term uses f32's spacing.
 */
KB_API int kb_bench_check(kb_bench_result *r, kb_dtype dt, const float *got, const double *ref,
                   const double *acc_bound, size_t n, const char *what);
/* The same for elements index0 .. index0 + n - 1 of a larger output: the index a failure
 * message names counts from index0. */
KB_API int kb_bench_check_from(kb_bench_result *r, kb_dtype dt, const float *got, const double *ref,
                        const double *acc_bound, size_t n, size_t index0, const char *what);


/* bound_ns / the region's time: how close the run came to what its busiest resource allows
 * (<= 1); 0 when not measured. */
KB_API double kb_bench_efficiency(const kb_bench_result *r);

/* The roofline's time over the region's: how close the run came to its workload's lower
 * bound (<= 1); 0 when there is none. */
KB_API double kb_bench_roofline_efficiency(const kb_bench_result *r);
/* Stores a bench's roofline in r (have_roofline = 1). */
KB_API void kb_bench_set_roofline(kb_bench_result *r, const kb_roofline *rl);


/*
 * Deterministic test data: x[i] = (h(seed, i) mod (2*range + 1) - range) / den, small
 * integers over a power of two, so products and sums stay exact in f32 for the sizes the
 * benches use and the host reference is exact.
 */
KB_API void kb_bench_pattern(float *x, size_t n, uint32_t seed, int range, float den);
/* Its value x[i] alone. */
KB_API float kb_bench_pattern_at(size_t i, uint32_t seed, int range, float den);
/*
 * A pattern as the values of a host write (kb_fill), computed only when the write records:
 * element (r, c) is x[r * ld + c] of kb_bench_pattern(seed, range, den), or x[c * ld + r]
 * with transpose (a transposed view). `p` must outlive the fill. When den is a power of two
 * (and range at most 2^24) the fill also carries the pattern as a generator (p->gen, written
 * here): a recording write then records GEN records and the values are made where they replay
 * (kb_fill_gen, KB_FILL_GEN_PATTERN); other patterns go through the op log's payload.
 */
typedef struct kb_bench_pat {
    uint32_t seed;
    int range;
    float den;
    int64_t ld;
    int transpose;
    kb_fill_gen gen; /* plugin ABI 10: kb_bench_pattern_fill's; never set it yourself */
} kb_bench_pat;
KB_API kb_fill kb_bench_pattern_fill(kb_bench_pat *p);

/* ---- the plugin's entry points ---- */

#define KB_PLUGIN_ABI_VERSION 11
#define KB_PLUGIN_INIT_SYMBOL "kbcl_plugin_init"
#define KB_PLUGIN_ABI_SYMBOL "kbcl_plugin_abi"

#if defined(__GNUC__)
#define KB_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define KB_PLUGIN_EXPORT
#endif

typedef struct kb_plugin_reg kb_plugin_reg;

/*
 * The registration table kbcl_plugin_init receives (owned by the loader, valid during the
 * call). Every function returns 0, or KB_ERR_CONFIG with the reason in err: an incomplete
 * entry, a name that a built-in or an earlier plugin has, a name twice in one plugin, too
 * many entries.
 */
struct kb_plugin_reg {
    int abi_version;          /* the loader's KB_PLUGIN_ABI_VERSION */
    const char *path;         /* the file being loaded */
    kb_errbuf *err;           /* the add functions' messages; the plugin may set its own */
    /* A name (default: the file's name) and a one-line summary for `kbcl list`; copied. */
    int (*describe)(kb_plugin_reg *reg, const char *name, const char *summary);
    /* A collective algorithm (kbcl_ccl.h): a rank = PE kernel, a rank = SIP form, or both
     * (docs/plugins.md has the name rules). */
    int (*add_ccl_algo)(kb_plugin_reg *reg, const kb_ccl_algo_impl *algo);
    /* A bench (above); its name must not be a built-in bench's. */
    int (*add_bench)(kb_plugin_reg *reg, const kb_bench *bench);
    void *loader;             /* the loader's state: plugins leave it alone */
};

/* What every plugin defines (the loader looks them up by these names). */
KB_PLUGIN_EXPORT extern const int kbcl_plugin_abi;
KB_PLUGIN_EXPORT int kbcl_plugin_init(kb_plugin_reg *reg, int abi_version);
/* Defines kbcl_plugin_abi: write `KB_PLUGIN_DECLARE_ABI;` once in a plugin. */
#define KB_PLUGIN_DECLARE_ABI KB_PLUGIN_EXPORT const int kbcl_plugin_abi = KB_PLUGIN_ABI_VERSION

/* ---- the loader: for a program that hosts plugins as kbcl does ---- */

/*
 * A kb_plugins set holds every plugin loaded into it, what each added, the collective
 * registry their algorithms went to (lent to contexts through the collective configuration)
 * and their benches. It is an explicit object, created, passed and destroyed by its owner;
 * nothing here is a global. Loaded code is process-wide by nature, so a process should load
 * its plugins into one set; a forked child inherits the parent's set as it is. The host
 * program must export kbcl's public functions (kbcl_plugin_host() of the CMake package does),
 * since a plugin links no kbcl library. Limits: KB_PLUGINS_MAX plugins per set,
 * KB_PLUGIN_MAX_ENTRIES entries of each kind per plugin.
 */
typedef struct kb_ccl_reg kb_ccl_reg;  /* the collectives plugins added (opaque) */

#define KB_PLUGINS_MAX 32
#define KB_PLUGIN_MAX_ENTRIES 64

/* One loaded plugin, as listings show it. */
typedef struct kb_plugin_info {
    const char *path;                  /* the file, as resolved (realpath) */
    const char *name, *summary;        /* describe()'s, or the file's name and "" */
    const kb_ccl_algo_impl *algos[KB_PLUGIN_MAX_ENTRIES];
    int nalgos;
    const kb_bench *benches[KB_PLUGIN_MAX_ENTRIES];
    int nbenches;
} kb_plugin_info;

typedef struct kb_plugins kb_plugins;

/* An empty set (KB_ERR_NOMEM). kb_plugins_destroy(NULL) is a no-op; destroy unloads the
 * plugins, last loaded first. */
KB_API int kb_plugins_create(kb_plugins **out, kb_errbuf *eb);
KB_API void kb_plugins_destroy(kb_plugins *ps);

/*
 * Loads the plugin at path (a file kbcl can open; a relative path is relative to the current
 * folder). Loading a file the set already holds (the same realpath) does nothing. Errors
 * (KB_ERR_CONFIG, "PATH: ..."): no such file, not a shared object (dlerror's reason: a missing
 * symbol kbcl does not export, a wrong architecture), no kbcl_plugin_init or kbcl_plugin_abi,
 * another ABI version, init refused, an entry refused (its name and why).
 */
KB_API int kb_plugins_load(kb_plugins *ps, const char *path, kb_errbuf *eb);
/*
 * Loads every element of a ':'-separated list (KBCL_PLUGIN_PATH): a file, or a folder whose
 * files ending in ".so" load in name order. Empty elements are skipped. Stops at the first
 * error; what loaded before it stays loaded.
 */
KB_API int kb_plugins_load_list(kb_plugins *ps, const char *list, kb_errbuf *eb);

/* The loaded plugins in load order (NULL past the end or for ps NULL). */
KB_API const kb_plugin_info *kb_plugins_at(const kb_plugins *ps, int i);
/* The registry holding every loaded plugin's collectives (NULL for ps NULL). */
KB_API const kb_ccl_reg *kb_plugins_ccl(const kb_plugins *ps);
/* A bench by name: the built-in table, then the plugins' (ps NULL = built-ins only). */
KB_API const kb_bench *kb_plugins_find_bench(const kb_plugins *ps, const char *name);

#endif
