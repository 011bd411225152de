/*
 * sweep_plan — loads a `kbcl sweep` file (docs/sweeps.md) into a plan: the fixed options, the
 * grid's axes, the excludes and the list of points, and checks before anything runs all that
 * can be checked (the bench and its parameters, the model file, devices, algorithm names,
 * set: keys, and every point's configuration as `kbcl run` checks it), with FILE:LINE:COL in
 * each message. It also turns a point into its `kbcl run` job. Limits: at most SW_MAX_AXES axes
 * and SW_MAX_POINTS points; plugins named by the file load here, in the sweep's process, before
 * any worker forks.
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "kb_sweep_int.h"
#include "kb_model.h"
#include "kb_tl_q.h"

/* Bench options that are both top-level keys and axis names, in AX_* order. */
const char *const kbcl_sweep_shorthand_keys[SW_NSHORTHAND] = { "algorithm", "world_size",
                                                               "n_elem", "size", "buffer_kind",
                                                               "op", "dtype", "device" };

/* ---------------------------------------------------------------- plan loading -------- */

static char *xstrdup(const char *s)
{
    char *d = malloc(strlen(s) + 1);
    if (d)
        strcpy(d, s);
    return d;
}

char *kbcl_sweep_asprintf(const char *fmt, ...)
{
    va_list ap;
    int n;
    char *s;
    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !(s = malloc((size_t)n + 1)))
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

static void plan_free(sw_plan *p)
{
    if (!p)
        return;
    free(p->file);
    free(p->bench);
    free(p->device);
    free(p->topology);
    free(p->ccl);
    free(p->model);
    for (int i = 0; i < SW_NFIXED; i++)
        free(p->fixed[i]);
    for (int i = 0; i < p->nsets; i++)
        free(p->sets[i]);
    for (int i = 0; i < p->nparams; i++)
        free(p->params[i]);
    for (int a = 0; a < p->nax; a++) {
        for (int v = 0; v < p->ax[a].nvals; v++) {
            free(p->ax[a].vals[v]);
            if (p->ax[a].assign)
                free(p->ax[a].assign[v]);
        }
        free(p->ax[a].vals);
        free(p->ax[a].assign);
        free(p->ax[a].name);
    }
    for (int i = 0; i < p->nplugin_files; i++)
        free(p->plugin_files[i]);
    for (int e = 0; e < p->nexcl; e++)
        for (int a = 0; a < SW_MAX_AXES; a++)
            free(p->excl[e].want[a]);
    free(p->excl);
    free(p->pt);
    free(p->base_cfg);
    free(p->base_ccl);
    free(p);
}

/* Where a value was written (1-based; line 0 = unknown), for messages found after parsing. */
typedef struct sw_mark {
    int line, col;
} sw_mark;

typedef struct sw_parse {
    sw_plan *p;
    yaml_document_t *doc;
    kb_errbuf *eb;
    sw_mark *vmark[SW_MAX_AXES];       /* per axis value (owned) */
    sw_mark set_mark[KBCL_MAX_SETS], param_mark[KBCL_MAX_SETS];
    sw_mark plugin_mark[KBCL_MAX_PLUGIN_ARGS];
    sw_mark bench_mark, device_mark, alg_mark, size_mark, model_mark;
} sw_parse;

static sw_mark mark_of(const yaml_node_t *n)
{
    sw_mark m = { (int)n->start_mark.line + 1, (int)n->start_mark.column + 1 };
    return m;
}

/* Sets "FILE:LINE:COL: message" for node n (n may be NULL: "FILE: message"). */
static int perr(sw_parse *ps, const yaml_node_t *n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int perr(sw_parse *ps, const yaml_node_t *n, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!n)
        return kb_err_set(ps->eb, KB_ERR_CONFIG, "%s: %s", ps->p->file, msg);
    return kb_err_set(ps->eb, KB_ERR_CONFIG, "%s:%zu:%zu: %s", ps->p->file,
                      (size_t)n->start_mark.line + 1, (size_t)n->start_mark.column + 1, msg);
}

static const char *scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int want_scalar(sw_parse *ps, const yaml_node_t *n, const char *what, const char **out)
{
    *out = scalar(n);
    if (!*out)
        return perr(ps, n, "%s: expected a single value, got a %s", what,
                    n && n->type == YAML_SEQUENCE_NODE ? "list" : "map");
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    static const char *const t[] = { "true", "True", "TRUE", "yes", "on", "1" };
    static const char *const f[] = { "false", "False", "FALSE", "no", "off", "0" };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (!strcmp(s, t[i]))
            return *out = 1, 0;
        if (!strcmp(s, f[i]))
            return *out = 0, 0;
    }
    return -1;
}

int kbcl_sweep_is_int_text(const char *s)
{
    char *end;
    errno = 0;
    (void)strtoll(s, &end, 10);
    return *s && !errno && !*end;
}

/* Resolves a config file path of the sweep file relative to the sweep file's folder. */
static char *resolve_path(const char *sweep_file, const char *path)
{
    const char *slash = strrchr(sweep_file, '/');
    if (path[0] == '/' || !slash)
        return xstrdup(path);
    return kbcl_sweep_asprintf("%.*s/%s", (int)(slash - sweep_file), sweep_file, path);
}

static int axis_kind(const char *name)
{
    for (int k = 0; k < SW_NSHORTHAND; k++)
        if (!strcmp(name, kbcl_sweep_shorthand_keys[k]))
            return k;
    if (!strncmp(name, "param.", 6))
        return AX_PARAM;
    return AX_CONFIG;
}

/* A key that an earlier pair of the same map already has: an error at the second one that
 * names the first's line (kbcl's other loaders reject duplicates the same way). */
static int dup_key(sw_parse *ps, const yaml_node_t *map, const yaml_node_pair_t *pr,
                   const char *section)
{
    const yaml_node_t *k = yaml_document_get_node(ps->doc, pr->key);
    const char *ks = scalar(k);
    for (const yaml_node_pair_t *q = map->data.mapping.pairs.start; ks && q < pr; q++) {
        const yaml_node_t *e = yaml_document_get_node(ps->doc, q->key);
        const char *es = scalar(e);
        if (es && !strcmp(es, ks))
            return perr(ps, k, "%s%sduplicate key '%s' (first at line %zu)", section,
                        *section ? ": " : "", ks, e->start_mark.line + 1);
    }
    return 0;
}

static int add_kv(sw_parse *ps, const yaml_node_t *map, const char *section, char **arr, int *n,
                  sw_mark *marks)
{
    if (map->type != YAML_MAPPING_NODE)
        return perr(ps, map, "%s: expected a map of KEY: VALUE", section);
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *k = yaml_document_get_node(ps->doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(ps->doc, pr->value);
        const char *ks, *vs;
        int rc;
        if ((rc = want_scalar(ps, k, section, &ks)) || (rc = want_scalar(ps, v, ks, &vs)) ||
            (rc = dup_key(ps, map, pr, section)))
            return rc;
        if (*n >= KBCL_MAX_SETS)
            return perr(ps, k, "%s: at most %d entries", section, KBCL_MAX_SETS);
        if (!(arr[*n] = kbcl_sweep_asprintf("%s=%s", ks, vs)))
            return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
        marks[(*n)++] = mark_of(v);
    }
    return 0;
}

/* plugins: a list of shared objects (docs/plugins.md), relative to the sweep file's folder. */
static int parse_plugins(sw_parse *ps, const yaml_node_t *v)
{
    sw_plan *p = ps->p;
    if (v->type == YAML_SCALAR_NODE && !*scalar(v))
        return 0; /* `plugins:` with nothing under it */
    if (v->type != YAML_SEQUENCE_NODE)
        return perr(ps, v, "plugins: expected a list of plugin files");
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        const yaml_node_t *e = yaml_document_get_node(ps->doc, *it);
        const char *s;
        int rc;
        if ((rc = want_scalar(ps, e, "plugins", &s)))
            return rc;
        if (!*s)
            return perr(ps, e, "plugins: an empty file name");
        if (p->nplugin_files >= KBCL_MAX_PLUGIN_ARGS)
            return perr(ps, e, "plugins: at most %d", KBCL_MAX_PLUGIN_ARGS);
        if (!(p->plugin_files[p->nplugin_files] = resolve_path(p->file, s)))
            return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
        ps->plugin_mark[p->nplugin_files++] = mark_of(e);
    }
    return 0;
}

static int parse_axis(sw_parse *ps, const yaml_node_t *k, const yaml_node_t *v)
{
    sw_plan *p = ps->p;
    sw_axis *ax;
    const char *name;
    int rc, n;

    if ((rc = want_scalar(ps, k, "grid", &name)))
        return rc;
    if (p->nax >= SW_MAX_AXES)
        return perr(ps, k, "grid: at most %d axes", SW_MAX_AXES);
    for (int a = 0; a < p->nax; a++)
        if (!strcmp(p->ax[a].name, name))
            return perr(ps, k, "grid: axis '%s' appears twice", name);
    if (!strcmp(name, "bench") || !strcmp(name, "point") || !strcmp(name, "verify"))
        return perr(ps, k, "grid: '%s' cannot be swept (axes: " SW_AXES_HELP ")", name);
    if (axis_kind(name) == AX_CONFIG && !strchr(name, '.'))
        return perr(ps, k, "grid: unknown axis '%s' (axes: " SW_AXES_HELP ")", name);
    if (v->type == YAML_MAPPING_NODE)
        return perr(ps, v, "grid: %s: expected a list of values", name);
    n = v->type == YAML_SEQUENCE_NODE
            ? (int)(v->data.sequence.items.top - v->data.sequence.items.start) : 1;
    if (n == 0)
        return perr(ps, v, "grid: %s: the list of values is empty", name);
    ax = &p->ax[p->nax];
    ax->kind = axis_kind(name);
    ax->name = xstrdup(name);
    ax->vals = calloc((size_t)n, sizeof *ax->vals);
    if (ax->kind == AX_PARAM || ax->kind == AX_CONFIG)
        ax->assign = calloc((size_t)n, sizeof *ax->assign);
    ps->vmark[p->nax] = calloc((size_t)n, sizeof(sw_mark));
    p->nax++; /* from here plan_free owns the axis */
    if (!ax->name || !ax->vals || !ps->vmark[p->nax - 1] ||
        ((ax->kind == AX_PARAM || ax->kind == AX_CONFIG) && !ax->assign))
        return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const yaml_node_t *e = v->type == YAML_SEQUENCE_NODE
            ? yaml_document_get_node(ps->doc, v->data.sequence.items.start[i]) : v;
        const char *s;
        if ((rc = want_scalar(ps, e, name, &s)))
            return rc;
        if (!*s || strchr(s, '\n') || strchr(s, '\r'))
            return perr(ps, e, "grid: %s: values must be non-empty single-line text", name);
        for (int j = 0; j < ax->nvals; j++)
            if (!strcmp(ax->vals[j], s))
                return perr(ps, e, "grid: %s: value '%s' appears twice", name, s);
        if (!(ax->vals[i] = xstrdup(s)))
            return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
        ps->vmark[p->nax - 1][i] = mark_of(e);
        ax->nvals++;
        if (ax->assign &&
            !(ax->assign[i] = kbcl_sweep_asprintf("%s=%s", ax->kind == AX_PARAM ? name + 6 : name,
                                                  s)))
            return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
    }
    return 0;
}

static int axis_index(const sw_plan *p, const char *name)
{
    for (int a = 0; a < p->nax; a++)
        if (!strcmp(p->ax[a].name, name))
            return a;
    return -1;
}

static int parse_exclude(sw_parse *ps, const yaml_node_t *list)
{
    sw_plan *p = ps->p;
    int n;
    if (list->type != YAML_SEQUENCE_NODE)
        return perr(ps, list, "exclude: expected a list of maps {AXIS: VALUE or [VALUES]}");
    n = (int)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (!(p->excl = calloc((size_t)n + 1, sizeof *p->excl)))
        return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        yaml_node_t *m = yaml_document_get_node(ps->doc, list->data.sequence.items.start[i]);
        sw_excl *x = &p->excl[p->nexcl++];
        if (m->type != YAML_MAPPING_NODE ||
            m->data.mapping.pairs.top == m->data.mapping.pairs.start)
            return perr(ps, m, "exclude: expected a map {AXIS: VALUE or [VALUES]}");
        for (yaml_node_pair_t *pr = m->data.mapping.pairs.start; pr < m->data.mapping.pairs.top;
             pr++) {
            yaml_node_t *k = yaml_document_get_node(ps->doc, pr->key);
            yaml_node_t *v = yaml_document_get_node(ps->doc, pr->value);
            const char *ks;
            int a, rc, nv;
            if ((rc = want_scalar(ps, k, "exclude", &ks)))
                return rc;
            if ((a = axis_index(p, ks)) < 0)
                return perr(ps, k, "exclude: '%s' is not an axis of grid:", ks);
            if (x->want[a])
                return perr(ps, k, "exclude: '%s' appears twice in one entry", ks);
            if (!(x->want[a] = calloc((size_t)p->ax[a].nvals, 1)))
                return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
            nv = v->type == YAML_SEQUENCE_NODE
                     ? (int)(v->data.sequence.items.top - v->data.sequence.items.start) : 1;
            for (int j = 0; j < nv; j++) {
                const yaml_node_t *e = v->type == YAML_SEQUENCE_NODE
                    ? yaml_document_get_node(ps->doc, v->data.sequence.items.start[j]) : v;
                const char *s;
                int hit = -1;
                if ((rc = want_scalar(ps, e, ks, &s)))
                    return rc;
                for (int q = 0; q < p->ax[a].nvals; q++)
                    if (!strcmp(p->ax[a].vals[q], s))
                        hit = q;
                if (hit < 0)
                    return perr(ps, e, "exclude: %s has no value '%s' in grid:", ks, s);
                x->want[a][hit] = 1;
            }
        }
    }
    return 0;
}

/* Top-level keys that take one value (grid, exclude, set and params take more). */
static int is_scalar_key(const char *k)
{
    static const char *const keys[] = { "name", "description", "bench", "device", "verify",
                                        "topology", "ccl", "model", "algorithm", "world_size",
                                        "n_elem",
                                        "size", "buffer_kind", "op", "dtype" };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(k, keys[i]))
            return 1;
    return 0;
}

static int parse_top(sw_parse *ps, const yaml_node_t *root)
{
    sw_plan *p = ps->p;
    const yaml_node_t *grid = NULL, *exclude = NULL;
    int rc;

    if (!root)
        return perr(ps, NULL, "the file is empty (expected a map with bench:, grid: ...)");
    if (root->type != YAML_MAPPING_NODE)
        return perr(ps, root, "expected a map with bench:, grid: ... at the top level");
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start;
         pr < root->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(ps->doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(ps->doc, pr->value);
        const char *ks = scalar(k), *vs = NULL;
        char **slot = NULL;
        if (!ks)
            return perr(ps, k, "expected a key name");
        if ((rc = dup_key(ps, root, pr, "")) != 0)
            return rc;
        if (!strcmp(ks, "grid")) {
            if (v->type != YAML_MAPPING_NODE && !(v->type == YAML_SCALAR_NODE && !*scalar(v)))
                return perr(ps, v, "grid: expected a map of AXIS: [VALUES]");
            grid = v;
            continue;
        }
        if (!strcmp(ks, "exclude")) {
            exclude = v;
            continue;
        }
        if (!strcmp(ks, "set")) {
            if ((rc = add_kv(ps, v, "set", p->sets, &p->nsets, ps->set_mark)))
                return rc;
            continue;
        }
        if (!strcmp(ks, "params")) {
            if ((rc = add_kv(ps, v, "params", p->params, &p->nparams, ps->param_mark)))
                return rc;
            continue;
        }
        if (!strcmp(ks, "plugins")) {
            if ((rc = parse_plugins(ps, v)))
                return rc;
            continue;
        }
        char kbuf[80];
        if (!is_scalar_key(ks))
            return perr(ps, k, "unknown key %s (keys: name, description, bench, device, verify, "
                        "topology, ccl, model, algorithm, world_size, n_elem, size, buffer_kind, set, "
                        "params, plugins, grid, exclude)", kb_config_key_shown(ks, kbuf, sizeof kbuf));
        if (!(vs = scalar(v)))
            return perr(ps, v, "%s: expected a single value (to sweep it, list its values "
                        "under grid:)", ks);
        if (!strcmp(ks, "name") || !strcmp(ks, "description"))
            continue; /* for people and reports; not part of any job */
        if (!strcmp(ks, "verify")) {
            if (parse_bool(vs, &p->verify) != 0)
                return perr(ps, v, "verify: expected true or false, got '%s'", vs);
            continue;
        }
        if (!strcmp(ks, "bench"))
            slot = &p->bench, ps->bench_mark = mark_of(v);
        else if (!strcmp(ks, "device"))
            slot = &p->device, ps->device_mark = mark_of(v);
        else if (!strcmp(ks, "topology") || !strcmp(ks, "ccl") || !strcmp(ks, "model")) {
            char **dst = ks[0] == 't' ? &p->topology : ks[0] == 'c' ? &p->ccl : &p->model;
            if (dst == &p->model)
                ps->model_mark = mark_of(v);
            free(*dst);
            if (!(*dst = resolve_path(p->file, vs)))
                return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
            continue;
        } else {
            for (int i = 0; i < SW_NFIXED; i++)
                if (!strcmp(ks, kbcl_sweep_shorthand_keys[i]))
                    slot = &p->fixed[i];
            if (slot == &p->fixed[AX_ALGORITHM])
                ps->alg_mark = mark_of(v);
            if (slot == &p->fixed[AX_SIZE])
                ps->size_mark = mark_of(v);
        }
        assert(slot);
        free(*slot);
        if (!(*slot = xstrdup(vs)))
            return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
    }
    if (grid && grid->type == YAML_MAPPING_NODE)
        for (yaml_node_pair_t *pr = grid->data.mapping.pairs.start;
             pr < grid->data.mapping.pairs.top; pr++)
            if ((rc = parse_axis(ps, yaml_document_get_node(ps->doc, pr->key),
                                 yaml_document_get_node(ps->doc, pr->value))))
                return rc;
    if (exclude && (rc = parse_exclude(ps, exclude)))
        return rc;
    return 0;
}

/* An error found after parsing, at the place m where the value was written. */
static int markerr(sw_parse *ps, sw_mark m, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int markerr(sw_parse *ps, sw_mark m, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!m.line)
        return kb_err_set(ps->eb, KB_ERR_CONFIG, "%s: %s", ps->p->file, msg);
    return kb_err_set(ps->eb, KB_ERR_CONFIG, "%s:%d:%d: %s", ps->p->file, m.line, m.col, msg);
}

/* A size value (key or axis): what `kbcl run --size` accepts for bench b. */
static int check_size(sw_parse *ps, const kb_bench *b, sw_mark m, const char *s)
{
    int64_t v;
    if (kbcl_parse_size(s, &v) != 0)
        return markerr(ps, m, "size: '%s': " KBCL_SIZE_HELP, s);
    if (b->size_elem_bytes < 1)
        return markerr(ps, m, "size: bench '%s' takes no size (ccl_allreduce does; its sizes "
                       "are param.NAME axes)", b->name);
    if (v % b->size_elem_bytes)
        return markerr(ps, m, "size: '%s' is not a whole number of %d-byte elements", s,
                       b->size_elem_bytes);
    return 0;
}

/* A bench parameter's value (an integer or a value name) against the parameter's range;
 * label names it as the file does ("params: m", "param.m"). */
static int check_param_range(sw_parse *ps, sw_mark m, const char *label, const kb_bench *b,
                             const kb_bench_param *bp, const char *s)
{
    int64_t v = 0;
    if (kb_bench_param_parse(b, (int)(bp - b->params), s, &v) != 0)
        return markerr(ps, m, "%s: '%s' is neither an integer nor a name of its values", label,
                       s);
    if (v < bp->min || v > bp->max)
        return markerr(ps, m, "%s = %s is out of range [%lld, %lld]", label, s,
                       (long long)bp->min, (long long)bp->max);
    return 0;
}

/*
 * plan_check, first: the plugins (here, before any worker forks: the workers inherit them),
 * then the configuration files and their plugins (both may add the bench and the
 * algorithms), kept in p->base_cfg and p->base_ccl for plan_check_points.
 */
static int check_load_configs(sw_parse *ps, kb_config *cfg, kb_ccl_cfg *ccl)
{
    sw_plan *p = ps->p;
    kb_errbuf e2 = { { 0 } };

    for (int i = 0; i < p->nplugin_files; i++)
        if ((p->plugins ? kb_plugins_load(p->plugins, p->plugin_files[i], &e2)
                        : kb_err_set(&e2, KB_ERR_CONFIG, "this program loads no plugins")) != 0)
            return markerr(ps, ps->plugin_mark[i], "plugins: %s", e2.msg);
    /* the files kbcl_job_run reads */
    if (kbcl_configs_load(p->topology, p->ccl, p->plugins, cfg, ccl, &e2) != 0)
        return kb_err_set(ps->eb, KB_ERR_CONFIG, "%s", e2.msg);
    if (!(p->base_cfg = malloc(sizeof *p->base_cfg)) ||
        !(p->base_ccl = malloc(sizeof *p->base_ccl)))
        return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
    *p->base_cfg = *cfg;
    *p->base_ccl = *ccl;
    return 0;
}

/* plan_check: the bench, its model file, and no collective options for a bench that runs
 * no collective. Sets *out to the bench. */
static int check_bench(sw_parse *ps, const kb_bench **out)
{
    sw_plan *p = ps->p;
    kb_errbuf e2 = { { 0 } };
    const kb_bench *b = kb_plugins_find_bench(p->plugins, p->bench ? p->bench : "ccl_allreduce");

    *out = b;
    if (!b)
        return markerr(ps, ps->bench_mark, "unknown bench '%s' (kbcl list shows them)",
                       p->bench);
    if (p->model && !kb_bench_takes_model(b))
        return markerr(ps, ps->bench_mark, "model: bench '%s' takes no model file", b->name);
    p->split_cols = kb_bench_takes_model(b);
    /* the model file is every point's: checked once, where the file names it */
    if (kb_bench_takes_model(b)) {
        kb_model_cfg mc;
        if (!p->model)
            return markerr(ps, ps->bench_mark, "bench '%s' needs a model file (model: FILE, "
                           "e.g. ../models/gemma2-2b.yaml)", b->name);
        if (kb_model_load(&mc, p->model, &e2) != 0)
            return markerr(ps, ps->model_mark, "model: %s", e2.msg);
    }
    if (!kb_bench_takes_collective(b)) { /* the collective's options would change nothing */
        static const int kinds[] = { AX_ALGORITHM, AX_WORLD_SIZE, AX_N_ELEM, AX_BUFFER_KIND,
                                     AX_OP, AX_DTYPE };
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            const sw_mark *at = NULL;
            for (int a = 0; a < p->nax && !at; a++)
                if (p->ax[a].kind == kinds[i])
                    at = &ps->vmark[a][0];
            if (!at && !p->fixed[kinds[i]])
                continue;
            return markerr(ps, at ? *at : kinds[i] == AX_ALGORITHM ? ps->alg_mark : ps->bench_mark,
                           "%s: bench '%s' runs no collective and "
                           "takes no %s (its options are params: and param.NAME axes; kbcl list "
                           "shows them)", kbcl_sweep_shorthand_keys[kinds[i]], b->name,
                           kbcl_sweep_shorthand_keys[kinds[i]]);
        }
    }
    return 0;
}

/* plan_check: the values given once for every point (device:, params:, set:, n_elem or size,
 * algorithm:); set: entries are applied to cfg and ccl. */
static int check_fixed(sw_parse *ps, const kb_bench *b, kb_config *cfg, kb_ccl_cfg *ccl)
{
    sw_plan *p = ps->p;
    kb_errbuf e2 = { { 0 } };
    int rc, ne, sz;

    if (p->device && kb_device_from_name(p->device) < 0)
        return markerr(ps, ps->device_mark, "unknown device '%s' (ref, none, cpu, gpu, auto)",
                       p->device);
    for (int i = 0; i < p->nparams; i++) {
        char *eq = strchr(p->params[i], '=');
        char label[80];
        *eq = 0;
        int idx = kb_bench_param_index(b, p->params[i]);
        *eq = '=';
        if (idx < 0)
            return markerr(ps, ps->param_mark[i], "params: %s: expected NAME: VALUE with a "
                           "parameter of '%s' (kbcl list shows them)", p->params[i], b->name);
        snprintf(label, sizeof label, "params: %s", b->params[idx].name);
        if ((rc = check_param_range(ps, ps->param_mark[i], label, b, &b->params[idx],
                                    eq + 1)) != 0)
            return rc;
    }
    for (int i = 0; i < p->nsets; i++)
        if (kbcl_config_set(cfg, ccl, p->sets[i], &e2) != 0)
            return markerr(ps, ps->set_mark[i], "set: %s", e2.msg);
    /* n_elem and size are two ways to say one thing: at most one of them, fixed or swept */
    ne = axis_index(p, "n_elem");
    sz = axis_index(p, "size");
    if ((p->fixed[AX_N_ELEM] || ne >= 0) && (p->fixed[AX_SIZE] || sz >= 0))
        return markerr(ps, sz >= 0 ? ps->vmark[sz][0] : ps->size_mark, "n_elem and size both "
                       "give the message size: use one of them (as a key or as an axis)");
    if (p->fixed[AX_SIZE] && (rc = check_size(ps, b, ps->size_mark, p->fixed[AX_SIZE])) != 0)
        return rc;
    if (p->fixed[0] && !kb_ccl_config_find(ccl, p->fixed[0]))
        return markerr(ps, ps->alg_mark, "algorithm: no entry '%s' in ccl.yaml (kbcl list "
                       "shows them)", p->fixed[0]);
    return 0;
}

/* plan_check: value v of axis a; world_size, n_elem, buffer_kind and config axis values are
 * applied to cfg and ccl, as the values before them were. */
static int check_axis_value(sw_parse *ps, const kb_bench *b, kb_config *cfg, kb_ccl_cfg *ccl,
                            int a, int v)
{
    const sw_axis *ax = &ps->p->ax[a];
    const char *s = ax->vals[v];
    sw_mark m = ps->vmark[a][v];
    kb_errbuf e2 = { { 0 } };
    char setbuf[512];

    switch (ax->kind) {
    case AX_ALGORITHM:
        if (!kb_ccl_config_find(ccl, s))
            return markerr(ps, m, "algorithm: no entry '%s' in ccl.yaml (kbcl list shows them)",
                           s);
        return 0;
    case AX_DEVICE:
        if (kb_device_from_name(s) < 0)
            return markerr(ps, m, "device: unknown device '%s'", s);
        return 0;
    case AX_SIZE:
        return check_size(ps, b, m, s);
    case AX_OP:
        if (kb_ccl_op_from_name(s) < 0)
            return markerr(ps, m, "op: unknown op '%s' (sum, prod, max, min, avg)", s);
        return 0;
    case AX_DTYPE:
        if (kb_bench_takes_model(b) ? kb_qfmt_from_name(s) < 0
                                    : kb_dtype_from_name(s) < 0 ||
                                          kb_dtype_from_name(s) > KB_F32) {
            if (kb_bench_takes_model(b))
                return markerr(ps, m, "dtype: unknown number format '%s' (f16, bf16, int8, "
                               "mxint8, fp8e4m3, fp8e5m2)", s);
            return markerr(ps, m, "dtype: unknown dtype '%s' (f16, bf16, f32)", s);
        }
        return 0;
    case AX_WORLD_SIZE:
    case AX_N_ELEM:
    case AX_BUFFER_KIND:
        snprintf(setbuf, sizeof setbuf, "ccl.defaults.%s=%s", ax->name, s);
        if (kb_ccl_config_set(ccl, setbuf, &e2) != 0)
            return markerr(ps, m, "%s: %s", ax->name, e2.msg);
        return 0;
    case AX_PARAM:
        if (kb_bench_param_index(b, ax->name + 6) < 0)
            return markerr(ps, m, "%s: expected values of a parameter of '%s' (kbcl list shows "
                           "them)", ax->name, b->name);
        return check_param_range(ps, m, ax->name, b,
                                 &b->params[kb_bench_param_index(b, ax->name + 6)], s);
    default:
        if (kbcl_config_set(cfg, ccl, ax->assign[v], &e2) != 0)
            return markerr(ps, m, "%s", e2.msg);
        return 0;
    }
}

/*
 * Checks everything that can be checked without running: the bench and its parameters (their
 * ranges included), the model file, devices, algorithm names, and that every set: entry and
 * config axis value is a key the configuration accepts (so a typo is one error, not a failed
 * row per point). What only a combination of values can break is plan_check_points'.
 */
static int plan_check(sw_parse *ps)
{
    sw_plan *p = ps->p;
    const kb_bench *b = NULL;
    kb_config cfg;
    kb_ccl_cfg ccl;
    int rc = 0, nset_axes = 0, nparam_axes = 0;

    kb_config_defaults(&cfg);
    kb_ccl_config_defaults(&ccl);
    if ((rc = check_load_configs(ps, &cfg, &ccl)) != 0 || (rc = check_bench(ps, &b)) != 0 ||
        (rc = check_fixed(ps, b, &cfg, &ccl)) != 0)
        goto out;
    for (int a = 0; a < p->nax; a++) {
        if (p->ax[a].kind == AX_CONFIG)
            nset_axes++;
        if (p->ax[a].kind == AX_PARAM)
            nparam_axes++;
        for (int v = 0; v < p->ax[a].nvals; v++)
            if ((rc = check_axis_value(ps, b, &cfg, &ccl, a, v)) != 0)
                goto out;
    }
    if (p->nsets + nset_axes > KBCL_MAX_SETS || p->nparams + nparam_axes > KBCL_MAX_SETS)
        rc = perr(ps, NULL, "too many set:/params: entries and axes (at most %d each)",
                  KBCL_MAX_SETS);
out:
    kb_config_fini(&cfg);
    return rc;
}

static int excluded(const sw_plan *p, const int *idx)
{
    for (int e = 0; e < p->nexcl; e++) {
        int all = 1;
        for (int a = 0; a < p->nax && all; a++)
            if (p->excl[e].want[a] && !p->excl[e].want[a][idx[a]])
                all = 0;
        if (all)
            return 1;
    }
    return 0;
}

/* The points: the cartesian product of the axes, first axis slowest, minus the excludes. */
static int plan_points(sw_parse *ps)
{
    sw_plan *p = ps->p;
    long long total = 1;
    int idx[SW_MAX_AXES] = { 0 };

    for (int a = 0; a < p->nax; a++) {
        total *= p->ax[a].nvals;
        if (total > SW_MAX_POINTS)
            return perr(ps, NULL, "grid: more than %d points", SW_MAX_POINTS);
    }
    if (!(p->pt = malloc((size_t)total * (size_t)(p->nax ? p->nax : 1) * sizeof *p->pt)))
        return kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
    for (long long i = 0; i < total; i++) {
        long long r = i;
        for (int a = p->nax - 1; a >= 0; a--) {
            idx[a] = (int)(r % p->ax[a].nvals);
            r /= p->ax[a].nvals;
        }
        if (excluded(p, idx))
            continue;
        memcpy(&p->pt[(size_t)p->npoints * (size_t)p->nax], idx, (size_t)p->nax * sizeof *idx);
        p->npoints++;
    }
    if (p->npoints == 0)
        return perr(ps, NULL, "exclude: removes every point of the grid");
    return 0;
}

static int plan_load(const char *path, kb_plugins *plugins, sw_plan **out, kb_errbuf *eb)
{
    sw_plan *p = calloc(1, sizeof *p);
    sw_parse ps;
    yaml_parser_t parser;
    yaml_document_t doc;
    int have_parser = 0, have_doc = 0, rc = 0;
    FILE *f = NULL;

    *out = NULL;
    memset(&ps, 0, sizeof ps);
    if (!p || !(p->file = xstrdup(path))) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    ps.p = p;
    ps.doc = &doc;
    ps.eb = eb;
    p->plugins = plugins;
    if (!(f = fopen(path, "rb"))) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    if (!yaml_parser_initialize(&parser)) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "%s: cannot create a YAML parser", path);
        goto fail;
    }
    have_parser = 1;
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        const yaml_mark_t *m = &parser.problem_mark;
        rc = kb_err_set(eb, KB_ERR_CONFIG, "%s:%zu:%zu: YAML syntax error: %s%s%s", path,
                        (size_t)m->line + 1, (size_t)m->column + 1,
                        parser.problem ? parser.problem : "unknown",
                        parser.context ? " " : "", parser.context ? parser.context : "");
        goto fail;
    }
    have_doc = 1;
    if ((rc = parse_top(&ps, yaml_document_get_root_node(&doc))) != 0 ||
        (rc = plan_check(&ps)) != 0 || (rc = plan_points(&ps)) != 0)
        goto fail;
    *out = p;
    p = NULL; /* now the caller's */
fail:
    if (have_doc)
        yaml_document_delete(&doc);
    if (have_parser)
        yaml_parser_delete(&parser);
    if (f)
        fclose(f);
    plan_free(p);
    for (int a = 0; a < SW_MAX_AXES; a++)
        free(ps.vmark[a]);
    return rc;
}

const char *kbcl_sweep_point_val(const sw_plan *p, int point, int a)
{
    return p->ax[a].vals[p->pt[(size_t)point * (size_t)p->nax + (size_t)a]];
}

/* ---------------------------------------------------------------- a point's job ------- */

/* The device a point runs on: its device axis value, else the sweep's device. */
const char *kbcl_sweep_point_device(const sw_plan *p, int point)
{
    for (int a = 0; a < p->nax; a++)
        if (p->ax[a].kind == AX_DEVICE)
            return p->ax[a].vals[p->pt[(size_t)point * (size_t)p->nax + (size_t)a]];
    return p->device ? p->device : "ref";
}

/* Whether a point's device is an OpenCL one (gpu, cpu, auto): such points run in workers that
 * keep their backend (context, queue, program) from point to point. */
int kbcl_sweep_point_uses_opencl(const sw_plan *p, int point)
{
    int d = kb_device_from_name(kbcl_sweep_point_device(p, point));
    return d == KB_DEV_GPU || d == KB_DEV_CPU || d == KB_DEV_AUTO;
}

/* The `kbcl run` job of one point. */
void kbcl_sweep_point_job(const sw_plan *p, int point, kbcl_job *job)
{
    const char **shorthand[SW_NSHORTHAND] = { &job->algorithm, &job->world_size, &job->n_elem,
                                              &job->size, &job->buffer_kind, &job->op,
                                              &job->dtype, &job->device };
    memset(job, 0, sizeof *job);
    job->bench = p->bench;
    job->topology = p->topology;
    job->ccl = p->ccl;
    job->model = p->model;
    job->device = p->device;
    job->verify = p->verify;
    /* No op-log cuts when the sweep's --jobs keep every core busy: a device server then has
     * no idle core to replay beside the simulation on, and each cut splits batches into more
     * launches (allreduce.yaml with device: gpu, --jobs 16 on the H200 machine: 1.5 x ref's
     * wall without cuts, 2.0 x with them). With cores to spare (sweep.c decides) a point's
     * replay overlaps its simulation as `kbcl run`'s does (ring_allreduce_tcm 256 ranks 32M
     * verified on the H200, --jobs 1: 21.7 s without cuts, 15.8 s with them). */
    job->replay_cut = p->replay_cuts ? NULL : "0";
    job->plugins = p->plugins;
    for (int i = 0; i < SW_NFIXED; i++)
        *shorthand[i] = p->fixed[i];
    for (int i = 0; i < p->nsets; i++)
        job->sets[job->nsets++] = p->sets[i];
    for (int i = 0; i < p->nparams; i++)
        job->params[job->nparams++] = p->params[i];
    for (int a = 0; a < p->nax; a++) {
        int v = p->pt[(size_t)point * (size_t)p->nax + (size_t)a];
        if (p->ax[a].kind == AX_CONFIG)
            job->sets[job->nsets++] = p->ax[a].assign[v];
        else if (p->ax[a].kind == AX_PARAM)
            job->params[job->nparams++] = p->ax[a].assign[v];
        else
            *shorthand[p->ax[a].kind] = p->ax[a].vals[v];
    }
}

/*
 * Every point's configuration through the checks `kbcl run` makes before it simulates
 * (kbcl_job_prepare, on the files plan_check loaded once), so that a combination that cannot
 * run (a world size the machine of that point does not have, a set: value that another axis
 * makes invalid) stops the sweep before any point runs and before its output is touched,
 * instead of becoming an error row after the points before it ran.
 */
int kbcl_sweep_plan_check_points(const sw_plan *p, kb_errbuf *eb)
{
    kbcl_result *res = malloc(sizeof *res);
    kb_errbuf e2 = { { 0 } };
    kbcl_job job;
    int rc = 0;

    if (!res)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    for (int point = 0; point < p->npoints && !rc; point++) {
        kbcl_sweep_point_job(p, point, &job);
        job.base_cfg = p->base_cfg;
        job.base_ccl = p->base_ccl;
        job.model_checked = 1; /* plan_check loaded it */
        rc = kbcl_job_prepare(&job, res, &e2);
        kbcl_result_fini(res);
        if (rc) {
            char what[512];
            size_t len = 0;
            what[0] = 0;
            for (int a = 0; a < p->nax && len < sizeof what; a++)
                len += (size_t)snprintf(what + len, sizeof what - len, "%s%s=%s",
                                        a ? ", " : "", p->ax[a].name,
                                        kbcl_sweep_point_val(p, point, a));
            rc = kb_err_set(eb, KB_ERR_CONFIG, "%s: point %d of %d (%s) cannot run, so no point "
                            "was run: %s", p->file, point, p->npoints, what, e2.msg);
        }
    }
    free(res);
    return rc;
}

/* ---------------------------------------------------------------- for tests ----------- */

int kbcl_sweep_plan_load(const char *file, kb_plugins *plugins, kbcl_sweep_plan **out,
                         kb_errbuf *eb)
{
    if (!out || !file) {
        if (out)
            *out = NULL;
        return kb_err_set(eb, KB_ERR_INVAL, "kbcl_sweep_plan_load: NULL argument");
    }
    return plan_load(file, plugins, out, eb);
}

int kbcl_sweep_plan_npoints(const kbcl_sweep_plan *p)
{
    return p ? p->npoints : 0;
}

void kbcl_sweep_plan_free(kbcl_sweep_plan *p)
{
    plan_free(p);
}
