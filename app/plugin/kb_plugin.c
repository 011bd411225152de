/*
 * kb_plugin — the plugin loader (kb_plugin.h). A load stages what the plugin's init adds in
 * the plugin's own record: each entry is first copied into the record's own storage in this
 * kbcl's layout (entry_take: its head says the size and version the plugin was built with),
 * then checked against the built-ins, the plugins loaded before and the plugin's earlier
 * entries; only when init has returned 0 and no entry was refused are the collectives
 * committed to the set's kb_ccl_reg and the record kept. A refused load closes the handle and
 * leaves the set as it was.
 */
#include "kb_plugin.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct plugin {
    kb_plugin_info info;              /* its entries point into the stores below */
    /* the plugin's entries as this kbcl lays them out (entry_take), whatever the version the
     * plugin was built with */
    kb_ccl_algo_impl algo_store[KB_PLUGIN_MAX_ENTRIES];
    kb_bench bench_store[KB_PLUGIN_MAX_ENTRIES];
    char path[PATH_MAX];
    char name[64], summary[160];
    void *handle;                     /* dlopen's; closed by kb_plugins_destroy */
} plugin;

struct kb_plugins {
    plugin *v[KB_PLUGINS_MAX];        /* owned */
    int n;
    kb_ccl_reg *ccl;                  /* owned: every plugin's collectives */
};

/* What the add functions of one load work on (kb_plugin_reg.loader). */
typedef struct staging {
    kb_plugins *ps;
    plugin *p;
    int failed;                       /* an add refused an entry: the load fails */
} staging;

int kb_plugins_create(kb_plugins **out, kb_errbuf *eb)
{
    kb_plugins *ps = calloc(1, sizeof *ps);
    int rc;

    *out = NULL;
    if (!ps)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    if ((rc = kb_ccl_reg_create(&ps->ccl, eb)) != 0) {
        free(ps);
        return rc;
    }
    *out = ps;
    return 0;
}

void kb_plugins_destroy(kb_plugins *ps)
{
    if (!ps)
        return;
    kb_ccl_reg_destroy(ps->ccl);
    for (int i = ps->n - 1; i >= 0; i--) {
        dlclose(ps->v[i]->handle);
        free(ps->v[i]);
    }
    free(ps);
}

const kb_plugin_info *kb_plugins_at(const kb_plugins *ps, int i)
{
    return ps && i >= 0 && i < ps->n ? &ps->v[i]->info : NULL;
}

const kb_ccl_reg *kb_plugins_ccl(const kb_plugins *ps)
{
    return ps ? ps->ccl : NULL;
}

/* A bench of an earlier plugin, or of the plugin being loaded (p, may be NULL). */
static const kb_bench *plugin_bench(const kb_plugins *ps, const plugin *p, const char *name)
{
    for (int i = 0; ps && i <= ps->n; i++) {
        const plugin *q = i < ps->n ? ps->v[i] : p;
        for (int j = 0; q && j < q->info.nbenches; j++)
            if (!strcmp(q->info.benches[j]->name, name))
                return q->info.benches[j];
    }
    return NULL;
}

const kb_bench *kb_plugins_find_bench(const kb_plugins *ps, const char *name)
{
    const kb_bench *b = name ? kb_bench_find(name) : NULL;
    return b || !name ? b : plugin_bench(ps, NULL, name);
}

/* ---- the registration table ---- */

static staging *st_of(kb_plugin_reg *reg) { return reg->loader; }

/* Records a refusal (the message is already in reg->err) and returns its code. */
static int refuse(kb_plugin_reg *reg, int rc)
{
    st_of(reg)->failed = 1;
    return rc;
}

/*
 * Copies a plugin's entry e (a `type`, what = how messages call it) into out, a zeroed entry
 * of this kbcl's layout (cur bytes): any version from 1 to `version` (the current one) whose
 * size lies in [min, cur], the fields past the plugin's size left zero (they were appended
 * after it was built, and zero means "not set"). Refuses, naming the entry (its name is at
 * name_off in every version), an entry without a head, a newer version, or a size that is no
 * version of the type.
 */
static int entry_take(kb_plugin_reg *reg, const char *what, const char *type, const void *e,
                      size_t cur, size_t min, size_t name_off, uint32_t version, void *out)
{
    kb_entry_head h;
    const char *name = NULL;

    if (!e)
        return refuse(reg, kb_err_set(reg->err, KB_ERR_CONFIG, "a NULL %s", what));
    memcpy(&h, e, sizeof h);
    memcpy(&name, (const char *)e + name_off, sizeof name);
    if (!name)
        name = "?";
    if (h.version == 0)
        return refuse(reg, kb_err_set(reg->err, KB_ERR_CONFIG, "%s '%.64s': no entry head "
                                      "(write .head = %s in its initialiser; docs/plugins.md "
                                      "section 7)", what, name, type));
    if (h.version > version)
        return refuse(reg, kb_err_set(reg->err, KB_ERR_CONFIG, "%s '%.64s': built for version "
                                      "%u of its entry, newer than this kbcl's %u: rebuild the "
                                      "plugin against this kbcl's headers", what, name,
                                      h.version, version));
    if (h.size < min || h.size > cur)
        return refuse(reg, kb_err_set(reg->err, KB_ERR_CONFIG, "%s '%.64s': an entry of %u "
                                      "bytes is no version %u entry (%zu to %zu bytes)", what,
                                      name, h.size, h.version, min, cur));
    memset(out, 0, cur);
    memcpy(out, e, h.size);
    ((kb_entry_head *)out)->size = (uint32_t)cur;
    return 0;
}

static int reg_describe(kb_plugin_reg *reg, const char *name, const char *summary)
{
    plugin *p = st_of(reg)->p;
    if (!name || !name[0])
        return refuse(reg, kb_err_set(reg->err, KB_ERR_CONFIG, "describe: an empty name"));
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->summary, sizeof p->summary, "%s", summary ? summary : "");
    return 0;
}

static int reg_ccl_algo(kb_plugin_reg *reg, const kb_ccl_algo_impl *e)
{
    staging *st = st_of(reg);
    plugin *p = st->p;
    kb_ccl_algo_impl *a = &p->algo_store[p->info.nalgos];
    int rc;

    if (p->info.nalgos >= KB_PLUGIN_MAX_ENTRIES)
        return refuse(reg, kb_err_set(reg->err, KB_ERR_CONFIG, "algorithm '%.64s': at most %d "
                                      "per plugin", e && e->module ? e->module : "?",
                                      KB_PLUGIN_MAX_ENTRIES));

    /* every version has the fields up to flags; `ordered` was appended */
    if ((rc = entry_take(reg, "algorithm", "KB_CCL_ALGO_HEAD", e, sizeof *a,
                         offsetof(kb_ccl_algo_impl, ordered),
                         offsetof(kb_ccl_algo_impl, module), KB_CCL_ALGO_VERSION, a)) != 0)
        return rc;
    rc = kb_ccl_reg_check_algo(st->ps->ccl, a, reg->err);
    for (int i = 0; rc == 0 && i < p->info.nalgos; i++)
        if (!strcmp(p->info.algos[i]->module, a->module))
            rc = kb_err_set(reg->err, KB_ERR_CONFIG, "algorithm '%s' is added twice",
                            a->module);
    if (rc)
        return refuse(reg, rc);
    p->info.algos[p->info.nalgos++] = a;
    return 0;
}

/* An entry a bench run can use: a valid name, run, parameters that name themselves. */
static int check_bench(const kb_bench *b, kb_errbuf *eb)
{
    if (!b || !b->name)
        return kb_err_set(eb, KB_ERR_CONFIG, "a bench without a name");
    if (!kb_config_valid_name(b->name))
        return kb_err_set(eb, KB_ERR_CONFIG, "bench '%.64s': not a valid name (1-%d letters, "
                          "digits, '_' or '-')", b->name, KB_CFG_NAME_MAX - 1);
    if (kb_bench_find(b->name))
        return kb_err_set(eb, KB_ERR_CONFIG, "bench '%s' clashes with kbcl's built-in bench of "
                          "that name (kbcl list shows them)", b->name);
    if (!b->summary || !b->run)
        return kb_err_set(eb, KB_ERR_CONFIG, "bench '%s': summary and run must be set",
                          b->name);
    if (b->nparams < 0 || b->nparams > KB_BENCH_MAX_PARAMS || b->size_elem_bytes < 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "bench '%s': nparams %d (0..%d), size_elem_bytes "
                          "%d (>= 0)", b->name, b->nparams, KB_BENCH_MAX_PARAMS,
                          b->size_elem_bytes);
    for (int i = 0; i < b->nparams; i++)
        if (!b->params[i].name || !b->params[i].doc || b->params[i].min > b->params[i].max ||
            b->params[i].dflt < b->params[i].min || b->params[i].dflt > b->params[i].max)
            return kb_err_set(eb, KB_ERR_CONFIG, "bench '%s': parameter %d needs a name, a doc "
                              "and min <= default <= max", b->name, i);
    for (int i = 0; i < b->nparams; i++)
        for (int64_t k = 0; b->param_names[i] && b->param_names[i][k]; k++)
            if (!b->param_names[i][k][0] || k < b->params[i].min || k > b->params[i].max)
                return kb_err_set(eb, KB_ERR_CONFIG, "bench '%s': parameter %s: value name %lld "
                                  "is empty or names a value outside %lld..%lld", b->name,
                                  b->params[i].name, (long long)k, (long long)b->params[i].min,
                                  (long long)b->params[i].max);
    return 0;
}

static int reg_bench(kb_plugin_reg *reg, const kb_bench *e)
{
    staging *st = st_of(reg);
    plugin *p = st->p;
    kb_bench *b = &p->bench_store[p->info.nbenches];
    int rc;

    if (p->info.nbenches >= KB_PLUGIN_MAX_ENTRIES)
        return refuse(reg, kb_err_set(reg->err, KB_ERR_CONFIG, "bench '%.64s': at most %d per "
                                      "plugin", e && e->name ? e->name : "?",
                                      KB_PLUGIN_MAX_ENTRIES));

    /* every version has the fields up to size_elem_bytes; param_names was appended */
    if ((rc = entry_take(reg, "bench", "KB_BENCH_HEAD", e, sizeof *b,
                         offsetof(kb_bench, param_names), offsetof(kb_bench, name),
                         KB_BENCH_VERSION, b)) != 0)
        return rc;
    rc = check_bench(b, reg->err);
    if (rc == 0 && plugin_bench(st->ps, p, b->name))
        rc = kb_err_set(reg->err, KB_ERR_CONFIG, "bench '%s' is already registered", b->name);
    if (rc)
        return refuse(reg, rc);
    p->info.benches[p->info.nbenches++] = b;
    return 0;
}

/* ---- loading ---- */

/* The init function's type, and the conversion from dlsym's object pointer (POSIX requires
 * it to work; ISO C does not define it, hence the copy instead of a cast). */
typedef int (*init_fn)(kb_plugin_reg *reg, int abi_version);

static init_fn as_init(void *sym)
{
    init_fn f;
    _Static_assert(sizeof f == sizeof sym, "function and object pointers have one size");
    memcpy(&f, &sym, sizeof f);
    return f;
}

int kb_plugins_load(kb_plugins *ps, const char *path, kb_errbuf *eb)
{
    plugin *p = NULL;
    kb_errbuf perr = { { 0 } };
    staging st;
    kb_plugin_reg reg;
    void *sym;
    const char *base;
    char real[PATH_MAX];
    int rc = 0;

    if (!ps || !path)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_plugins_load: NULL argument");
    if (!realpath(path, real))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: cannot load plugin: %s", path,
                          strerror(errno));
    for (int i = 0; i < ps->n; i++)
        if (!strcmp(ps->v[i]->path, real))
            return 0; /* already loaded (the set is not touched: sweep workers call this) */
    if (ps->n >= KB_PLUGINS_MAX)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: cannot load plugin: at most %d plugins", path,
                          KB_PLUGINS_MAX);
    if (!(p = calloc(1, sizeof *p)))
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    memcpy(p->path, real, sizeof real);
    dlerror();
    if (!(p->handle = dlopen(p->path, RTLD_NOW | RTLD_LOCAL))) {
        const char *why = dlerror();
        rc = kb_err_set(eb, KB_ERR_CONFIG, "%s: not a loadable shared object: %s", path,
                        why ? why : "dlopen failed");
        goto fail;
    }
    if (!(sym = dlsym(p->handle, KB_PLUGIN_INIT_SYMBOL))) {
        rc = kb_err_set(eb, KB_ERR_CONFIG, "%s: not a kbcl plugin: it defines no symbol %s",
                        path, KB_PLUGIN_INIT_SYMBOL);
        goto fail;
    }
    {
        const int *abi = dlsym(p->handle, KB_PLUGIN_ABI_SYMBOL);
        if (!abi) {
            rc = kb_err_set(eb, KB_ERR_CONFIG, "%s: not a kbcl plugin: it defines no symbol %s "
                            "(KB_PLUGIN_DECLARE_ABI)", path, KB_PLUGIN_ABI_SYMBOL);
            goto fail;
        }
        if (*abi != KB_PLUGIN_ABI_VERSION) {
            rc = kb_err_set(eb, KB_ERR_CONFIG, "%s: plugin ABI mismatch: %s = %d, this kbcl "
                            "speaks ABI %d (rebuild the plugin against this kbcl's headers)",
                            path, KB_PLUGIN_ABI_SYMBOL, *abi, KB_PLUGIN_ABI_VERSION);
            goto fail;
        }
    }
    base = strrchr(p->path, '/');
    snprintf(p->name, sizeof p->name, "%.*s", (int)sizeof p->name - 1, base ? base + 1 : p->path);
    p->info.path = p->path;
    p->info.name = p->name;
    p->info.summary = p->summary;
    st = (staging){ ps, p, 0 };
    reg = (kb_plugin_reg){ .abi_version = KB_PLUGIN_ABI_VERSION, .path = p->path, .err = &perr,
                           .describe = reg_describe, .add_ccl_algo = reg_ccl_algo,
                           .add_bench = reg_bench, .loader = &st };
    rc = as_init(sym)(&reg, KB_PLUGIN_ABI_VERSION);
    if (rc || st.failed) {
        rc = kb_err_set(eb, KB_ERR_CONFIG, "%s: %s %s: %s", path, KB_PLUGIN_INIT_SYMBOL,
                        st.failed ? "registered an entry kbcl refuses" : "refused to load",
                        perr.msg[0] ? perr.msg : "(no message)");
        goto fail;
    }
    /* commit: the checks above make these additions succeed */
    for (int i = 0; rc == 0 && i < p->info.nalgos; i++)
        rc = kb_ccl_reg_add_algo(ps->ccl, p->info.algos[i], eb);
    if (rc) {
        /* unreachable while the staging checks match kb_ccl_reg's; a half-committed plugin
         * cannot be taken back, so nothing of the set may be used any more */
        kb_err_prefix(eb, "%s: internal error committing the plugin", path);
        goto fail;
    }
    ps->v[ps->n++] = p;
    return 0;
fail:
    if (p && p->handle)
        dlclose(p->handle);
    free(p);
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every "*.so" file of folder dir, in name order. */
static int load_folder(kb_plugins *ps, const char *dir, kb_errbuf *eb)
{
    DIR *d = opendir(dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;

    if (!d)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: cannot read the plugin folder: %s", dir,
                          strerror(errno));
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".so") != 0)
            continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? cap * 2 : 16) * sizeof *nn);
            if (!nn) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                goto out;
            }
            names = nn;
        }
        if (!(names[n] = malloc(strlen(dir) + len + 2))) {
            rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
            goto out;
        }
        sprintf(names[n++], "%s/%s", dir, e->d_name);
    }
    if (n)
        qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = kb_plugins_load(ps, names[i], eb);
out:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    closedir(d);
    return rc;
}

int kb_plugins_load_list(kb_plugins *ps, const char *list, kb_errbuf *eb)
{
    char elem[PATH_MAX];
    int rc = 0;

    for (const char *s = list; s && *s && rc == 0;) {
        const char *colon = strchr(s, ':');
        size_t len = colon ? (size_t)(colon - s) : strlen(s);
        struct stat sb;

        if (len >= sizeof elem)
            return kb_err_set(eb, KB_ERR_CONFIG, "plugin path element '%.*s...' is too long",
                              64, s);
        memcpy(elem, s, len);
        elem[len] = '\0';
        s += len + (colon ? 1 : 0);
        if (!len)
            continue;
        if (stat(elem, &sb) == 0 && S_ISDIR(sb.st_mode))
            rc = load_folder(ps, elem, eb);
        else
            rc = kb_plugins_load(ps, elem, eb);
    }
    return rc;
}
