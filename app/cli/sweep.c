/*
 * kbcl sweep — runs the cartesian product of a YAML grid of `kbcl run` jobs (docs/sweeps.md)
 * and appends one result row per point to a CSV or JSON Lines file as soon as the point
 * finishes. Each point runs in a forked worker process (--jobs N at a time) that sends its
 * outcome back over a pipe, so a crashing point becomes an error row instead of ending the
 * sweep; points on an OpenCL device go to device workers instead, which stay and keep their
 * Phase-2 backend (context, program) from point to point, reading point numbers from a
 * command pipe; under mpirun the points are spread over the ranks instead (sweep_mpi.c). Rows are
 * written whole with one write() to an O_APPEND file, so an interrupted sweep leaves at most
 * one partial last line, which --resume cuts off before it skips the points already present.
 * Limits: a grid has at most SW_MAX_AXES axes and SW_MAX_POINTS points; rows are one line
 * each (newlines in messages become spaces); resume trusts rows whose point index and swept
 * values match this sweep file and refuses a file written by a different grid.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <yaml.h>

#include "kb_cli.h"
#include "kb_devd.h"
#include "kb_model.h"
#include "kb_resident.h"
#include "kb_tl_q.h"

#define SW_MAX_AXES 16
#define SW_MAX_POINTS 1000000
#define SW_MAX_JOBS 256

enum { AX_ALGORITHM, AX_WORLD_SIZE, AX_N_ELEM, AX_SIZE, AX_BUFFER_KIND, AX_OP, AX_DTYPE,
       AX_DEVICE, AX_PARAM, AX_CONFIG };
/* The bench options before AX_DEVICE are kept in sw_plan.fixed when given as top-level keys
 * (device has a field of its own); every one before AX_PARAM is also an axis name. */
#define SW_NFIXED AX_DEVICE
#define SW_NSHORTHAND AX_PARAM

/* Bench options that are both top-level keys and axis names, in AX_* order. */
static const char *const shorthand_keys[SW_NSHORTHAND] = { "algorithm", "world_size", "n_elem",
                                                           "size", "buffer_kind", "op", "dtype",
                                                           "device" };
/* The axes for messages. */
#define SW_AXES_HELP "algorithm, world_size, n_elem, size, buffer_kind, op, dtype, device, "    \
                     "param.NAME or " \
                     "a config key such as system.sips.count"

typedef struct sw_axis {
    char *name;     /* column name, as written under grid: */
    int kind;       /* AX_* */
    int nvals;
    char **vals;    /* scalar text of each value */
    char **assign;  /* "key=value" per value for AX_PARAM / AX_CONFIG, else NULL */
} sw_axis;

/* One exclude: entry; want[a] == NULL means any value of axis a. */
typedef struct sw_excl {
    unsigned char *want[SW_MAX_AXES];
} sw_excl;

typedef struct kbcl_sweep_plan {
    char *file;
    char *bench, *device, *topology, *ccl, *model;
    int split_cols; /* the bench reports the decoder time split: its columns are written */
    char *fixed[SW_NFIXED];            /* algorithm, world_size, n_elem, size, buffer_kind,
                                        * op, dtype */
    int verify;
    char *sets[KBCL_MAX_SETS];         /* "key=value" */
    int nsets;
    char *params[KBCL_MAX_SETS];       /* "name=value" */
    int nparams;
    sw_axis ax[SW_MAX_AXES];
    int nax;
    sw_excl *excl;
    int nexcl;
    int npoints;
    int *pt;                           /* npoints x nax value indices */
    char *plugin_files[KBCL_MAX_PLUGIN_ARGS]; /* plugins:, resolved against the file's folder */
    int nplugin_files;
    kb_plugins *plugins;               /* borrowed: where they load; every point's job uses it */
    /* the topology and ccl files as loaded (ccl's plugins applied), for checking the points
     * without loading them once per point */
    kb_config *base_cfg;
    kb_ccl_cfg *base_ccl;
} sw_plan;

/* What a worker sends back for one point: plain bytes, under PIPE_BUF so one write is atomic. */
typedef struct sw_outcome {
    int point;
    int rc;                            /* 0 or a KB_ERR_* code; SW_CRASH for a dead worker */
    int verified;                      /* 1, 0, -1 (not checked) */
    int have_size, have_algbw, have_busbw, have_split;
    int have_bound;                    /* the run measured a bound (kb_bench_result.bound_*) */
    double size_bytes, sim_time_ns, algbw, busbw, wall_ms;
    double bound_ns, efficiency;       /* efficiency: kb_bench_efficiency, as `kbcl run` */
    double split[4];                   /* compute_ns memory_ns comm_ns tokens_per_s */
    unsigned long long events;
    char bound_resource[sizeof ((kb_bench_result *)0)->bound_resource];
    char msg[sizeof(kb_errbuf)];
} sw_outcome;

_Static_assert(sizeof(sw_outcome) <= PIPE_BUF, "a worker's outcome is one atomic pipe write");

#define SW_CRASH 1

/* The decoder_layer time split (docs/decoder.md): columns of a sweep whose bench takes a
 * model file, between wall_ms and verified. */
#define SW_NSPLIT 4
static const char *const split_cols[SW_NSPLIT] = { "compute_ns", "memory_ns", "comm_ns",
                                                   "tokens_per_s" };

struct sw_worker;

typedef struct sw_ctx {
    sw_plan *plan;
    const char *out_path;              /* NULL = stdout */
    int fd, jsonl, quiet, tty;
    unsigned char *done;               /* per point: a row exists */
    int ndone_before, nfinished, npending;
    int n_ok, n_verify_fail, n_err;
    double t0;
    int bar_shown;
    int write_failed;
    kb_errbuf werr;
    /* for the ETA: points run at a time, the finished points' own wall times, and the local
     * workers (NULL under MPI, whose running points this rank does not see) */
    int slots;
    int nmeasured;
    double measured_s;
    const struct sw_worker *workers;
    int nworkers;
} sw_ctx;

/* ---------------------------------------------------------------- plan loading -------- */

static char *xstrdup(const char *s)
{
    char *d = malloc(strlen(s) + 1);
    if (d)
        strcpy(d, s);
    return d;
}

static char *xasprintf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

static char *xasprintf(const char *fmt, ...)
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

static int is_int_text(const char *s)
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
    return xasprintf("%.*s/%s", (int)(slash - sweep_file), sweep_file, path);
}

static int axis_kind(const char *name)
{
    for (int k = 0; k < SW_NSHORTHAND; k++)
        if (!strcmp(name, shorthand_keys[k]))
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
        if (!(arr[*n] = xasprintf("%s=%s", ks, vs)))
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
        if (ax->assign && !(ax->assign[i] = xasprintf("%s=%s", ax->kind == AX_PARAM ? name + 6
                                                                                : name, s)))
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
                if (!strcmp(ks, shorthand_keys[i]))
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

/* An integer bench parameter value (is_int_text) against the parameter's range; label names
 * it as the file does ("params: m", "param.m"). */
static int check_param_range(sw_parse *ps, sw_mark m, const char *label,
                             const kb_bench_param *bp, const char *s)
{
    long long v = strtoll(s, NULL, 10);
    if (v < bp->min || v > bp->max)
        return markerr(ps, m, "%s = %s is out of range [%lld, %lld]", label, s,
                       (long long)bp->min, (long long)bp->max);
    return 0;
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
    kb_errbuf e2 = { { 0 } };
    int rc = 0, nset_axes = 0, nparam_axes = 0;

    kb_config_defaults(&cfg);
    kb_ccl_config_defaults(&ccl);
    /* plugins first (here, before any worker forks: the workers inherit them), then the
     * configuration files and their plugins: both may add the bench and the algorithms */
    for (int i = 0; i < p->nplugin_files; i++)
        if ((p->plugins ? kb_plugins_load(p->plugins, p->plugin_files[i], &e2)
                        : kb_err_set(&e2, KB_ERR_CONFIG, "this program loads no plugins")) != 0) {
            rc = markerr(ps, ps->plugin_mark[i], "plugins: %s", e2.msg);
            goto out;
        }
    {
        char buf[2][4096];
        const char *tp = p->topology, *cp = p->ccl;
        /* the same defaults kbcl_job_run uses */
        if (!tp)
            tp = kbcl_default_config("topology.yaml", buf[0], sizeof buf[0]);
        if (!cp)
            cp = kbcl_default_config("ccl.yaml", buf[1], sizeof buf[1]);
        if ((tp && kb_config_load_topology(&cfg, tp, &e2) != 0) ||
            (cp && kb_ccl_config_load(&ccl, cp, &e2) != 0) ||
            kbcl_ccl_plugins(p->plugins, &ccl, &e2) != 0) {
            rc = kb_err_set(ps->eb, KB_ERR_CONFIG, "%s", e2.msg);
            goto out;
        }
        if (!(p->base_cfg = malloc(sizeof *p->base_cfg)) ||
            !(p->base_ccl = malloc(sizeof *p->base_ccl))) {
            rc = kb_err_set(ps->eb, KB_ERR_NOMEM, "out of memory");
            goto out;
        }
        *p->base_cfg = cfg;
        *p->base_ccl = ccl;
    }
    b = kb_plugins_find_bench(p->plugins, p->bench ? p->bench : "ccl_allreduce");
    if (!b) {
        rc = markerr(ps, ps->bench_mark, "unknown bench '%s' (kbcl list shows them)", p->bench);
        goto out;
    }
    if (p->model && !kb_bench_takes_model(b)) {
        rc = markerr(ps, ps->bench_mark, "model: bench '%s' takes no model file", b->name);
        goto out;
    }
    p->split_cols = kb_bench_takes_model(b);
    /* the model file is every point's: checked once, where the file names it */
    if (kb_bench_takes_model(b)) {
        kb_model_cfg mc;
        if (!p->model) {
            rc = markerr(ps, ps->bench_mark, "bench '%s' needs a model file (model: FILE, e.g. "
                         "../models/gemma2-2b.yaml)", b->name);
            goto out;
        }
        if (kb_model_load(&mc, p->model, &e2) != 0) {
            rc = markerr(ps, ps->model_mark, "model: %s", e2.msg);
            goto out;
        }
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
            rc = markerr(ps, at ? *at : kinds[i] == AX_ALGORITHM ? ps->alg_mark : ps->bench_mark,
                         "%s: bench '%s' runs no collective and "
                         "takes no %s (its options are params: and param.NAME axes; kbcl list "
                         "shows them)", shorthand_keys[kinds[i]], b->name,
                         shorthand_keys[kinds[i]]);
            goto out;
        }
    }
    if (p->device && kb_device_from_name(p->device) < 0) {
        rc = markerr(ps, ps->device_mark, "unknown device '%s' (ref, none, cpu, gpu, auto)",
                     p->device);
        goto out;
    }
    for (int i = 0; i < p->nparams; i++) {
        char *eq = strchr(p->params[i], '=');
        *eq = 0;
        int idx = kb_bench_param_index(b, p->params[i]);
        *eq = '=';
        if (idx < 0 || !is_int_text(eq + 1)) {
            rc = markerr(ps, ps->param_mark[i], "params: %s: expected NAME: INTEGER with a "
                         "parameter of '%s' (kbcl list shows them)", p->params[i], b->name);
            goto out;
        }
        {
            char label[80];
            snprintf(label, sizeof label, "params: %s", b->params[idx].name);
            if ((rc = check_param_range(ps, ps->param_mark[i], label, &b->params[idx],
                                        eq + 1)) != 0)
                goto out;
        }
    }
    for (int i = 0; i < p->nsets; i++)
        if (kbcl_config_set(&cfg, &ccl, p->sets[i], &e2) != 0) {
            rc = markerr(ps, ps->set_mark[i], "set: %s", e2.msg);
            goto out;
        }
    /* n_elem and size are two ways to say one thing: at most one of them, fixed or swept */
    {
        int ne = axis_index(p, "n_elem"), sz = axis_index(p, "size");
        if ((p->fixed[AX_N_ELEM] || ne >= 0) && (p->fixed[AX_SIZE] || sz >= 0)) {
            rc = markerr(ps, sz >= 0 ? ps->vmark[sz][0] : ps->size_mark, "n_elem and size both give the message size: use one of them "
                         "(as a key or as an axis)");
            goto out;
        }
        if (p->fixed[AX_SIZE] &&
            (rc = check_size(ps, b, ps->size_mark, p->fixed[AX_SIZE])) != 0)
            goto out;
    }
    if (p->fixed[0] && !kb_ccl_config_find(&ccl, p->fixed[0])) {
        rc = markerr(ps, ps->alg_mark, "algorithm: no entry '%s' in ccl.yaml (kbcl list shows "
                     "them)", p->fixed[0]);
        goto out;
    }
    for (int a = 0; a < p->nax; a++) {
        sw_axis *ax = &p->ax[a];
        if (ax->kind == AX_CONFIG)
            nset_axes++;
        if (ax->kind == AX_PARAM)
            nparam_axes++;
        for (int v = 0; v < ax->nvals; v++) {
            const char *s = ax->vals[v];
            char setbuf[512];
            switch (ax->kind) {
            case AX_ALGORITHM:
                if (!kb_ccl_config_find(&ccl, s)) {
                    rc = markerr(ps, ps->vmark[a][v], "algorithm: no entry '%s' in ccl.yaml "
                                 "(kbcl list shows them)", s);
                    goto out;
                }
                break;
            case AX_DEVICE:
                if (kb_device_from_name(s) < 0) {
                    rc = markerr(ps, ps->vmark[a][v], "device: unknown device '%s'", s);
                    goto out;
                }
                break;
            case AX_SIZE:
                if ((rc = check_size(ps, b, ps->vmark[a][v], s)) != 0)
                    goto out;
                break;
            case AX_OP:
                if (kb_ccl_op_from_name(s) < 0) {
                    rc = markerr(ps, ps->vmark[a][v], "op: unknown op '%s' (sum, prod, max, "
                                 "min, avg)", s);
                    goto out;
                }
                break;
            case AX_DTYPE:
                if (kb_bench_takes_model(b) ? kb_qfmt_from_name(s) < 0
                                            : kb_dtype_from_name(s) < 0 ||
                                                  kb_dtype_from_name(s) > KB_F32) {
                    if (kb_bench_takes_model(b)) {
                        rc = markerr(ps, ps->vmark[a][v], "dtype: unknown number format '%s' "
                                     "(f16, bf16, int8, mxint8, fp8e4m3, fp8e5m2)", s);
                        goto out;
                    }
                    rc = markerr(ps, ps->vmark[a][v], "dtype: unknown dtype '%s' (f16, bf16, "
                                 "f32)", s);
                    goto out;
                }
                break;
            case AX_WORLD_SIZE:
            case AX_N_ELEM:
            case AX_BUFFER_KIND:
                snprintf(setbuf, sizeof setbuf, "ccl.defaults.%s=%s", ax->name, s);
                if (kb_ccl_config_set(&ccl, setbuf, &e2) != 0) {
                    rc = markerr(ps, ps->vmark[a][v], "%s: %s", ax->name, e2.msg);
                    goto out;
                }
                break;
            case AX_PARAM:
                if (kb_bench_param_index(b, ax->name + 6) < 0 || !is_int_text(s)) {
                    rc = markerr(ps, ps->vmark[a][v], "%s: expected integer values of a "
                                 "parameter of '%s' (kbcl list shows them)", ax->name, b->name);
                    goto out;
                }
                if ((rc = check_param_range(ps, ps->vmark[a][v], ax->name,
                                            &b->params[kb_bench_param_index(b, ax->name + 6)],
                                            s)) != 0)
                    goto out;
                break;
            default:
                if (kbcl_config_set(&cfg, &ccl, ax->assign[v], &e2) != 0) {
                    rc = markerr(ps, ps->vmark[a][v], "%s", e2.msg);
                    goto out;
                }
            }
        }
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

static const char *point_val(const sw_plan *p, int point, int a)
{
    return p->ax[a].vals[p->pt[(size_t)point * (size_t)p->nax + (size_t)a]];
}

/* ---------------------------------------------------------------- running a point ----- */

/* The device a point runs on: its device axis value, else the sweep's device. */
static const char *point_device(const sw_plan *p, int point)
{
    for (int a = 0; a < p->nax; a++)
        if (p->ax[a].kind == AX_DEVICE)
            return p->ax[a].vals[p->pt[(size_t)point * (size_t)p->nax + (size_t)a]];
    return p->device ? p->device : "ref";
}

/* Whether a point's device is an OpenCL one (gpu, cpu, auto): such points run in workers that
 * keep their backend (context, queue, program) from point to point. */
static int point_uses_opencl(const sw_plan *p, int point)
{
    int d = kb_device_from_name(point_device(p, point));
    return d == KB_DEV_GPU || d == KB_DEV_CPU || d == KB_DEV_AUTO;
}

/* The `kbcl run` job of one point. */
static void point_job(const sw_plan *p, int point, kbcl_job *job)
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
    /* No op-log cuts: a sweep's --jobs keep every core busy, so a device server has no idle
     * core to replay beside the simulation on, and each cut splits batches into more
     * launches (allreduce.yaml with device: gpu, --jobs 16 on the H200 machine: 1.5 x ref's
     * wall without cuts, 2.0 x with them). */
    job->replay_cut = "0";
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
static int plan_check_points(const sw_plan *p, kb_errbuf *eb)
{
    kbcl_result *res = malloc(sizeof *res);
    kb_errbuf e2 = { { 0 } };
    kbcl_job job;
    int rc = 0;

    if (!res)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    for (int point = 0; point < p->npoints && !rc; point++) {
        point_job(p, point, &job);
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
                                        a ? ", " : "", p->ax[a].name, point_val(p, point, a));
            rc = kb_err_set(eb, KB_ERR_CONFIG, "%s: point %d of %d (%s) cannot run, so no point "
                            "was run: %s", p->file, point, p->npoints, what, e2.msg);
        }
    }
    free(res);
    return rc;
}

/* Runs one point; be (may be NULL) is a backend kept across points, desc its name. */
static void run_point_on(const sw_plan *p, int point, sw_outcome *o, const kb_backend *be,
                         const char *desc)
{
    kbcl_job job;
    kbcl_result *res = calloc(1, sizeof *res);
    kb_errbuf eb = { { 0 } };
    int rc;

    memset(o, 0, sizeof *o);
    o->point = point;
    o->verified = -1;
    if (!res) {
        o->rc = KB_ERR_NOMEM;
        snprintf(o->msg, sizeof o->msg, "out of memory");
        return;
    }
    point_job(p, point, &job);
    job.backend = be;
    job.backend_desc = desc;
    rc = kbcl_job_run(&job, res, &eb);
    o->rc = rc;
    if (rc) {
        snprintf(o->msg, sizeof o->msg, "%s", eb.msg[0] ? eb.msg : kb_strerror(rc));
    } else {
        const kb_run_report *rep = &res->rep;
        o->verified = rep->res.verified;
        o->sim_time_ns = rep->sim_time_ns;
        o->events = (unsigned long long)rep->events;
        o->wall_ms = rep->wall_ms;
        for (int i = 0; i < rep->res.nextras; i++) {
            if (!strcmp(rep->res.extras[i].name, "size_bytes"))
                o->have_size = 1, o->size_bytes = rep->res.extras[i].value;
            if (!strcmp(rep->res.extras[i].name, "algbw_gbps"))
                o->have_algbw = 1, o->algbw = rep->res.extras[i].value;
            if (!strcmp(rep->res.extras[i].name, "busbw_gbps"))
                o->have_busbw = 1, o->busbw = rep->res.extras[i].value;
            for (int k = 0; k < SW_NSPLIT; k++)
                if (!strcmp(rep->res.extras[i].name, split_cols[k]))
                    o->have_split = 1, o->split[k] = rep->res.extras[i].value;
        }
        /* the same test and numbers as `kbcl run --json` (kb_cli.c): a bound exactly when it
         * names its resource */
        if (rep->res.bound_resource[0]) {
            o->have_bound = 1;
            o->bound_ns = rep->res.bound_ns;
            o->efficiency = kb_bench_efficiency(&rep->res);
            snprintf(o->bound_resource, sizeof o->bound_resource, "%s",
                     rep->res.bound_resource);
        }
        if (rep->res.verified == 0)
            snprintf(o->msg, sizeof o->msg, "%s", rep->res.detail);
    }
    for (char *c = o->msg; *c; c++) /* rows are single lines */
        if (*c == '\n' || *c == '\r' || *c == '\t')
            *c = ' ';
    for (char *c = o->bound_resource; *c; c++)
        if (*c == '\n' || *c == '\r' || *c == '\t')
            *c = ' ';
    kbcl_result_fini(res);
    free(res);
}

static void run_point(const sw_plan *p, int point, sw_outcome *o)
{
    run_point_on(p, point, o, NULL, NULL);
}

static void run_point_cb(void *ctx, int point, void *outcome)
{
    run_point(((sw_ctx *)ctx)->plan, point, outcome);
}

/* Row status of an outcome: "ok", the lower-case KB_ERR_* name, or "crash". */
static const char *status_name(int rc)
{
    static const char *const lower[] = {
        "ok", "nomem", "inval", "config", "range", "nospace", "notfound", "deadlock", "io",
        "device", "unsupported", "verify", "state", "direction", "aborted", "usage",
    };
    _Static_assert(sizeof lower / sizeof lower[0] == 1 - KB_ERR_MIN_,
                   "one status name per KB_ERR_* code");
    if (rc == SW_CRASH)
        return "crash";
    if (rc <= 0 && rc >= KB_ERR_MIN_)
        return lower[-rc];
    return "error";
}

/* ---------------------------------------------------------------- rows --------------- */

static int csv_needs_quotes(const char *s)
{
    return strpbrk(s, ",\"\n\r") != NULL || (*s && (s[0] == ' ' || s[strlen(s) - 1] == ' '));
}

/* Appends one CSV field (with its separator) to buf; returns the new length or -1. */
static int csv_put(char *buf, size_t n, int len, const char *s, int first)
{
    if (len < 0 || (size_t)len >= n)
        return -1;
    if (!first)
        len += snprintf(buf + len, n - (size_t)len, ",");
    if (!csv_needs_quotes(s))
        return len + snprintf(buf + len, (size_t)len < n ? n - (size_t)len : 0, "%s", s);
    if ((size_t)len + 1 < n)
        buf[len++] = '"';
    for (; *s && (size_t)len + 2 < n; s++) {
        if (*s == '"')
            buf[len++] = '"';
        buf[len++] = *s;
    }
    if ((size_t)len + 1 < n)
        buf[len++] = '"';
    buf[len] = 0;
    return len;
}

/* The fixed columns after the swept ones, in TC_* order; the decoder split columns, when the
 * sweep has them, go before verified. bound_ns, efficiency and bound_resource (issue #29)
 * sit with the other measured columns; a file without them has a different header, which
 * --resume refuses rather than mix two column sets in one file. */
static const char *const tail_cols[] = { "bench", "size_bytes", "sim_time_ns", "algbw_gbps",
                                         "busbw_gbps", "bound_ns", "efficiency",
                                         "bound_resource", "events", "wall_ms", "verified",
                                         "status", "error" };
enum { TC_BENCH, TC_SIZE, TC_SIM, TC_ALGBW, TC_BUSBW, TC_BOUND, TC_EFF, TC_BOUND_RES, TC_EVENTS,
       TC_WALL, TC_VERIFIED, TC_STATUS, TC_ERROR, N_TAIL };
_Static_assert(sizeof tail_cols / sizeof tail_cols[0] == N_TAIL, "one name per TC_* column");

/* Text columns (JSON strings); verified is a boolean and the rest are numbers. */
static int tail_is_text(int i)
{
    return i == TC_BENCH || i == TC_BOUND_RES || i == TC_STATUS || i == TC_ERROR;
}

/* The CSV header; bound_cols 0 gives the one kbcl wrote before the bound columns, so that
 * --resume can say why such a file does not fit. */
static char *csv_header_cols(const sw_plan *p, int bound_cols)
{
    size_t n = 512;
    char *buf;
    int len = 0;
    for (int a = 0; a < p->nax; a++)
        n += 3 + 2 * strlen(p->ax[a].name);
    if (!(buf = malloc(n)))
        return NULL;
    len = csv_put(buf, n, 0, "point", 1);
    for (int a = 0; a < p->nax; a++)
        len = csv_put(buf, n, len, p->ax[a].name, 0);
    for (int i = 0; i < N_TAIL; i++) {
        if (i == TC_VERIFIED && p->split_cols)
            for (int k = 0; k < SW_NSPLIT; k++)
                len = csv_put(buf, n, len, split_cols[k], 0);
        if (bound_cols || i < TC_BOUND || i > TC_BOUND_RES)
            len = csv_put(buf, n, len, tail_cols[i], 0);
    }
    snprintf(buf + len, n - (size_t)len, "\n");
    return buf;
}

static char *csv_header(const sw_plan *p)
{
    return csv_header_cols(p, 1);
}

static void fmt_num(char *b, size_t n, int have, double v)
{
    if (have)
        snprintf(b, n, "%.12g", v);
    else
        b[0] = 0;
}

/* The row of one outcome, "\n"-terminated (malloc'd). */
static char *format_row(const sw_plan *p, const sw_outcome *o, int jsonl)
{
    char num[N_TAIL][48], split[SW_NSPLIT][48];
    const char *val[N_TAIL]; /* every tail column as text, "" when empty */
    int ok = o->rc == 0;

    for (int i = 0; i < N_TAIL; i++) {
        num[i][0] = 0;
        val[i] = num[i];
    }
    for (int k = 0; k < SW_NSPLIT; k++)
        fmt_num(split[k], sizeof split[k], ok && o->have_split, o->split[k]);
    val[TC_BENCH] = p->bench ? p->bench : "ccl_allreduce";
    fmt_num(num[TC_SIZE], sizeof num[TC_SIZE], ok && o->have_size, o->size_bytes);
    fmt_num(num[TC_SIM], sizeof num[TC_SIM], ok, o->sim_time_ns);
    fmt_num(num[TC_ALGBW], sizeof num[TC_ALGBW], ok && o->have_algbw, o->algbw);
    fmt_num(num[TC_BUSBW], sizeof num[TC_BUSBW], ok && o->have_busbw, o->busbw);
    fmt_num(num[TC_BOUND], sizeof num[TC_BOUND], ok && o->have_bound, o->bound_ns);
    fmt_num(num[TC_EFF], sizeof num[TC_EFF], ok && o->have_bound, o->efficiency);
    if (ok && o->have_bound)
        val[TC_BOUND_RES] = o->bound_resource;
    if (ok)
        snprintf(num[TC_EVENTS], sizeof num[TC_EVENTS], "%llu", o->events);
    if (ok)
        snprintf(num[TC_WALL], sizeof num[TC_WALL], "%.3f", o->wall_ms);
    val[TC_VERIFIED] = o->rc || o->verified < 0 ? "" : o->verified ? "true" : "false";
    val[TC_STATUS] = ok ? "ok" : status_name(o->rc);
    val[TC_ERROR] = o->msg;
    if (jsonl) {
        cJSON *r = cJSON_CreateObject();
        char *text, *line;
        cJSON_AddNumberToObject(r, "point", o->point);
        for (int a = 0; a < p->nax; a++) {
            const char *v = point_val(p, o->point, a);
            char canon[32];
            /* a number only when it prints back as the same text ("010" stays a string) */
            snprintf(canon, sizeof canon, "%lld", strtoll(v, NULL, 10));
            if (is_int_text(v) && strlen(v) < 16 && !strcmp(canon, v))
                cJSON_AddNumberToObject(r, p->ax[a].name, (double)strtoll(v, NULL, 10));
            else
                cJSON_AddStringToObject(r, p->ax[a].name, v);
        }
        /* the keys in the CSV's column order; an empty value is null */
        for (int i = 0; i < N_TAIL; i++) {
            for (int k = 0; i == TC_VERIFIED && p->split_cols && k < SW_NSPLIT; k++) {
                if (split[k][0])
                    cJSON_AddRawToObject(r, split_cols[k], split[k]);
                else
                    cJSON_AddNullToObject(r, split_cols[k]);
            }
            if (!*val[i])
                cJSON_AddNullToObject(r, tail_cols[i]);
            else if (i == TC_VERIFIED)
                cJSON_AddBoolToObject(r, tail_cols[i], val[i][0] == 't');
            else if (tail_is_text(i))
                cJSON_AddStringToObject(r, tail_cols[i], val[i]);
            else
                cJSON_AddRawToObject(r, tail_cols[i], val[i]);
        }
        text = cJSON_PrintUnformatted(r);
        cJSON_Delete(r);
        if (!text)
            return NULL;
        line = xasprintf("%s\n", text);
        cJSON_free(text);
        return line;
    }
    {
        size_t n = 1024 + 2 * sizeof o->msg + 2 * sizeof o->bound_resource +
                   2 * strlen(val[TC_BENCH]);
        char *buf, idx[16];
        int len;
        for (int a = 0; a < p->nax; a++)
            n += 3 + 2 * strlen(point_val(p, o->point, a));
        if (!(buf = malloc(n)))
            return NULL;
        snprintf(idx, sizeof idx, "%d", o->point);
        len = csv_put(buf, n, 0, idx, 1);
        for (int a = 0; a < p->nax; a++)
            len = csv_put(buf, n, len, point_val(p, o->point, a), 0);
        for (int i = 0; i < N_TAIL; i++) {
            for (int k = 0; i == TC_VERIFIED && p->split_cols && k < SW_NSPLIT; k++)
                len = csv_put(buf, n, len, split[k], 0);
            len = csv_put(buf, n, len, val[i], 0);
        }
        snprintf(buf + len, n - (size_t)len, "\n");
        return buf;
    }
}

/* ---------------------------------------------------------------- progress ------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double kbcl_sweep_eta(int not_started, int jobs, int nmeasured, double measured_s,
                      const double *running_s, int nrunning)
{
    double mean, work, longest = 0.0, eta;
    if (nmeasured <= 0)
        return -1.0;
    mean = measured_s / nmeasured;
    work = not_started > 0 ? not_started * mean : 0.0;
    for (int i = 0; i < nrunning; i++) {
        double left = mean - running_s[i];
        if (left > 0) {
            work += left;
            if (left > longest)
                longest = left;
        }
    }
    if (not_started <= 0 && nrunning > 0 && longest <= 0)
        return -1.0;
    eta = work / (jobs > 0 ? jobs : 1);
    if (longest > eta)
        eta = longest;
    if (not_started > 0 && mean > eta) /* a waiting point takes a mean of its own */
        eta = mean;
    return eta;
}

static void sweep_worker_times(const sw_ctx *c, double now, double *running, int *n,
                               double *longest);

static void progress_bar(sw_ctx *c)
{
    int total = c->plan->npoints, done = c->ndone_before + c->nfinished, width = 30;
    int fill = total ? (int)((long long)done * width / total) : width;
    double now = now_s(), el = now - c->t0, longest = 0.0, eta;
    double running[SW_MAX_JOBS];
    int nrunning = 0, left = c->npending - c->nfinished;
    char bar[64], e1[32], e2[64], e3[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    kbcl_fmt_dur(e1, sizeof e1, el);
    sweep_worker_times(c, now, running, &nrunning, &longest);
    eta = kbcl_sweep_eta(left - nrunning, c->slots, c->nmeasured, c->measured_s, running,
                         nrunning);
    /* rounded up: a point still running never shows 0:00 */
    if (eta >= 0 && left > 0 && eta < 1.0)
        eta = 1.0;
    if (eta >= 0) {
        kbcl_fmt_dur(e2, sizeof e2, eta);
    } else if (nrunning > 0) {
        kbcl_fmt_dur(e3, sizeof e3, longest);
        snprintf(e2, sizeof e2, "? (a point running for %s)", e3);
    } else {
        snprintf(e2, sizeof e2, "?");
    }
    fprintf(stderr, "\r\033[K[%s] %d/%d %3d%%  elapsed %s  ETA %s", bar, done, total,
            total ? done * 100 / total : 100, e1, e2);
    fflush(stderr);
    c->bar_shown = 1;
}

static void progress_clear(sw_ctx *c)
{
    if (c->bar_shown) {
        fputs("\r\033[K", stderr);
        c->bar_shown = 0;
    }
}

static void describe_point(const sw_ctx *c, int point, char *b, size_t n)
{
    size_t len = 0;
    b[0] = 0;
    for (int a = 0; a < c->plan->nax && len < n; a++)
        len += (size_t)snprintf(b + len, n - len, "%s%s=%s", a ? " " : "", c->plan->ax[a].name,
                                point_val(c->plan, point, a));
}

static void progress_point(sw_ctx *c, const sw_outcome *o)
{
    char what[512];
    int failed = o->rc != 0 || o->verified == 0;
    if (c->quiet)
        return;
    describe_point(c, o->point, what, sizeof what);
    if (c->tty && !failed) {
        progress_bar(c);
        return;
    }
    progress_clear(c);
    if (o->rc)
        fprintf(stderr, "[%d/%d] point %d %s: %s: %s\n", c->ndone_before + c->nfinished,
                c->plan->npoints, o->point, what, status_name(o->rc), o->msg);
    else
        fprintf(stderr, "[%d/%d] point %d %s: %s %.6g ns (%.2f s)\n",
                c->ndone_before + c->nfinished, c->plan->npoints, o->point, what,
                o->verified == 1 ? "verified" : o->verified == 0 ? "VERIFICATION FAILED"
                                                                 : "ok",
                o->sim_time_ns, o->wall_ms / 1000.0);
    if (c->tty)
        progress_bar(c);
}

/* Records one finished point: its row goes to the output at once. */
static int finish_point(void *ctx, const void *outcome)
{
    sw_ctx *c = ctx;
    const sw_outcome *o = outcome;
    char *row;

    assert(o->point >= 0 && o->point < c->plan->npoints);
    c->nfinished++;
    if (o->wall_ms > 0) { /* a crashed worker's point has no time of its own */
        c->nmeasured++;
        c->measured_s += o->wall_ms / 1000.0;
    }
    if (o->rc)
        c->n_err++;
    else if (o->verified == 0)
        c->n_verify_fail++;
    else
        c->n_ok++;
    row = format_row(c->plan, o, c->jsonl);
    if (c->tty && c->fd == STDOUT_FILENO)
        progress_clear(c);
    if (!row || kbcl_write_all(c->fd, row, strlen(row)) != 0) {
        if (!c->write_failed)
            kb_err_set(&c->werr, KB_ERR_IO, "%s: cannot append a row: %s",
                       c->out_path ? c->out_path : "stdout", row ? strerror(errno)
                                                                 : "out of memory");
        c->write_failed = 1;
    }
    free(row);
    c->done[o->point] = 1;
    progress_point(c, o);
    return c->write_failed ? KB_ERR_IO : 0;
}

/* ---------------------------------------------------------------- resume -------------- */

/* Splits one CSV line (no newline) into at most max fields, in place. Returns the count. */
static int csv_split(char *line, char **f, int max)
{
    int n = 0;
    char *r = line, *w = line;
    for (;;) {
        char *start = w;
        if (*r == '"') {
            r++;
            for (;;) {
                if (!*r)
                    break;
                if (*r == '"' && r[1] == '"') {
                    *w++ = '"';
                    r += 2;
                } else if (*r == '"') {
                    r++;
                    break;
                } else {
                    *w++ = *r++;
                }
            }
            while (*r && *r != ',')
                *w++ = *r++;
        } else {
            while (*r && *r != ',')
                *w++ = *r++;
        }
        if (n < max)
            f[n] = start;
        n++;
        if (!*r) {
            *w = 0;
            break;
        }
        r++;
        *w++ = 0;
    }
    return n;
}

static char *read_fd(int fd, size_t *len)
{
    struct stat st;
    char *buf;
    size_t got = 0;
    if (fstat(fd, &st) != 0 || !(buf = malloc((size_t)st.st_size + 1)))
        return NULL;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    buf[got] = 0;
    *len = got;
    return buf;
}

/* One existing row: checks it belongs to this sweep and marks its point done. */
static int resume_row(sw_ctx *c, int lineno, int point, const char *const *vals,
                      const char *verified, const char *status, kb_errbuf *eb)
{
    const sw_plan *p = c->plan;
    if (point < 0 || point >= p->npoints)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: point %d is not a point of %s (it has %d); "
                          "was the file written by another sweep? Use a new --out",
                          c->out_path, lineno, point, p->file, p->npoints);
    for (int a = 0; a < p->nax; a++)
        if (strcmp(vals[a], point_val(p, point, a)))
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: point %d has %s=%s but point %d of %s "
                              "has %s=%s (the grid changed?); use a new --out", c->out_path,
                              lineno, point, p->ax[a].name, vals[a], point, p->file,
                              p->ax[a].name, point_val(p, point, a));
    if (c->done[point])
        return 0; /* a duplicate from a hand-edited file: the first row stands */
    c->done[point] = 1;
    c->ndone_before++;
    if (strcmp(status, "ok"))
        c->n_err++;
    else if (!strcmp(verified, "false"))
        c->n_verify_fail++;
    else
        c->n_ok++;
    return 0;
}

static int resume_csv(sw_ctx *c, char *text, kb_errbuf *eb)
{
    const sw_plan *p = c->plan;
    int ncol = 1 + p->nax + N_TAIL + (p->split_cols ? SW_NSPLIT : 0), lineno = 1, rc = 0;
    char **f = calloc((size_t)ncol, sizeof *f), *hdr = csv_header(p), *line = text, *nl;
    if (!f || !hdr) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    nl = strchr(line, '\n');
    if (!nl)
        goto out; /* empty file: the header is written as for a new one */
    if ((size_t)(nl - line + 1) != strlen(hdr) || strncmp(line, hdr, strlen(hdr))) {
        char *old = csv_header_cols(p, 0);
        /* this grid's columns as a kbcl before the bound columns wrote them: the generic
         * message would list two near-identical headers and hide that only the version
         * differs. The file is left as it is either way. */
        if (old && (size_t)(nl - line + 1) == strlen(old) && !strncmp(line, old, strlen(old))) {
            rc = kb_err_set(eb, KB_ERR_USAGE, "%s:1: the file was written by an older kbcl "
                            "sweep, without the bound_ns, efficiency and bound_resource "
                            "columns; --resume does not rewrite it: use a new --out (or run "
                            "the sweep again without --resume)", c->out_path);
        } else {
            hdr[strlen(hdr) - 1] = 0;
            rc = kb_err_set(eb, KB_ERR_USAGE, "%s:1: header %.*s does not match this sweep's "
                            "columns (%s); use a new --out", c->out_path, (int)(nl - line),
                            line, hdr);
        }
        free(old);
        goto out;
    }
    for (line = nl + 1; (nl = strchr(line, '\n')); line = nl + 1) {
        int n, point;
        lineno++;
        *nl = 0;
        if (!*line)
            continue;
        n = csv_split(line, f, ncol);
        if (n != ncol || !is_int_text(f[0])) {
            rc = kb_err_set(eb, KB_ERR_USAGE, "%s:%d: not a row of this sweep (%d fields, "
                            "expected %d)", c->out_path, lineno, n, ncol);
            goto out;
        }
        point = (int)strtol(f[0], NULL, 10);
        if ((rc = resume_row(c, lineno, point, (const char *const *)f + 1, f[ncol - 3],
                             f[ncol - 2], eb)) != 0)
            goto out;
    }
out:
    free(f);
    free(hdr);
    return rc;
}

static int resume_jsonl(sw_ctx *c, char *text, kb_errbuf *eb)
{
    const sw_plan *p = c->plan;
    char num[SW_MAX_AXES][40];
    const char *vals[SW_MAX_AXES];
    int lineno = 0, rc = 0;
    char *nl;
    for (char *line = text; (nl = strchr(line, '\n')); line = nl + 1) {
        cJSON *r, *it;
        int point;
        lineno++;
        *nl = 0;
        if (!*line)
            continue;
        r = cJSON_Parse(line);
        it = cJSON_GetObjectItemCaseSensitive(r, "point");
        if (!r || !cJSON_IsNumber(it)) {
            cJSON_Delete(r);
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: not a row of a sweep (no \"point\")",
                              c->out_path, lineno);
        }
        point = it->valueint;
        for (int a = 0; a < p->nax; a++) {
            it = cJSON_GetObjectItemCaseSensitive(r, p->ax[a].name);
            if (cJSON_IsString(it)) {
                vals[a] = it->valuestring;
            } else if (cJSON_IsNumber(it)) {
                snprintf(num[a], sizeof num[a], "%.17g", it->valuedouble);
                vals[a] = num[a];
            } else {
                vals[a] = "(missing)";
            }
        }
        it = cJSON_GetObjectItemCaseSensitive(r, "verified");
        rc = resume_row(c, lineno, point, vals, cJSON_IsFalse(it) ? "false" : "",
                        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r, "status"))
                            ? cJSON_GetObjectItemCaseSensitive(r, "status")->valuestring
                            : "", eb);
        cJSON_Delete(r);
        if (rc)
            return rc;
    }
    return 0;
}

/* 1 when the n bytes at s begin as the string w does (or w begins with all of them). */
static int prefix_match(const char *s, size_t n, const char *w)
{
    size_t m = strlen(w);
    return !strncmp(s, w, n < m ? n : m);
}

/* A partial last line (n bytes at s, no newline) that --resume may cut: the start of this
 * sweep's header when it is the file's only line, else the start of a row. Anything else
 * means the file is not this sweep's output, and it is left as it is. */
static int partial_line_ok(const sw_ctx *c, const char *s, size_t n, int first, kb_errbuf *eb)
{
    int ok;
    if (c->jsonl) {
        ok = prefix_match(s, n, "{\"point\":");
    } else if (first) {
        char *hdr = csv_header(c->plan);
        if (!hdr)
            return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        ok = prefix_match(s, n, hdr);
        free(hdr);
    } else {
        ok = s[0] >= '0' && s[0] <= '9';
    }
    if (ok)
        return 0;
    return kb_err_set(eb, KB_ERR_USAGE, "%s: %s is not %s of this sweep; --resume leaves the "
                      "file as it is: use a new --out", c->out_path,
                      first ? "its first line" : "its last line",
                      first ? (c->jsonl ? "a row" : "the header") : "a row");
}

/*
 * --resume's reading of the existing output (text: its len bytes and a NUL): the whole file is
 * checked before anything of it is cut. Its whole lines must be this sweep's rows, whose
 * points it marks done, and a partial last line what an interrupted run leaves; *keep is the
 * length without that line. A NUL byte is refused: the line functions would stop at it and
 * take the rows after it for absent (run again) or for part of the partial line (cut).
 */
static int resume_scan(sw_ctx *c, char *text, size_t len, size_t *keep, kb_errbuf *eb)
{
    const char *nul = memchr(text, 0, len), *nl;
    int rc;

    if (nul) {
        size_t line = 1;
        for (const char *q = text; q < nul; q++)
            line += *q == '\n';
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%zu: a NUL byte: not the output of kbcl sweep; "
                          "--resume leaves the file as it is: use a new --out", c->out_path,
                          line);
    }
    *keep = len && text[len - 1] != '\n'
                ? ((nl = strrchr(text, '\n')) ? (size_t)(nl - text) + 1 : 0)
                : len;
    if (*keep < len && (rc = partial_line_ok(c, text + *keep, len - *keep, *keep == 0, eb)) != 0)
        return rc;
    text[*keep] = 0;
    return c->jsonl ? resume_jsonl(c, text, eb) : resume_csv(c, text, eb);
}

/* The output against every input of the sweep: its plan, the files the plan names, the
 * plugins and the default configurations (a sweep that wrote over one of them would lose it
 * before its first point ran). */
static int sweep_check_out(const sw_ctx *c, const char *plan_file, const char *const *plugins,
                           int nplugins, kb_errbuf *eb)
{
    char tbuf[4096], cbuf[4096];
    const sw_plan *p = c->plan;
    const char *ins[6 + KBCL_MAX_PLUGIN_ARGS] = {
        plan_file, p->topology, p->ccl, p->model,
        kbcl_default_config("topology.yaml", tbuf, sizeof tbuf),
        kbcl_default_config("ccl.yaml", cbuf, sizeof cbuf),
    };
    int n = 6;
    for (int i = 0; i < nplugins; i++)
        ins[n++] = plugins[i];
    return kbcl_check_output("--out", c->out_path, ins, n, eb);
}

/*
 * Opens the output (rank 0 only). With resume, cuts a partial last line (a row whose write
 * was cut short by a kill), then marks the points the file already holds.
 */
static int output_open(sw_ctx *c, int resume, kb_errbuf *eb)
{
    char *text = NULL, *hdr = NULL;
    size_t len = 0;
    int rc = 0;

    if (!c->out_path) {
        c->fd = STDOUT_FILENO;
        if (!c->jsonl && (!(hdr = csv_header(c->plan)) || kbcl_write_all(c->fd, hdr, strlen(hdr))))
            rc = kb_err_set(eb, KB_ERR_IO, "stdout: write failed");
        goto out;
    }
    c->fd = open(c->out_path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (resume ? 0 : O_TRUNC),
                 0644);
    if (c->fd < 0) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot open: %s", c->out_path, strerror(errno));
        goto out;
    }
    /* A POSIX record lock, not flock(): forked workers do not inherit it, so the lock goes
     * with the sweep process itself (a flock would live on in a worker that a kill -9 of the
     * sweep left dying, and a --resume right after would find the file locked). */
    struct flock lk = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
    if (fcntl(c->fd, F_SETLK, &lk) != 0) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: another kbcl sweep is writing it", c->out_path);
        goto out;
    }
    if (resume) {
        size_t keep;
        if (!(text = read_fd(c->fd, &len))) {
            rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot read: %s", c->out_path, strerror(errno));
            goto out;
        }
        if ((rc = resume_scan(c, text, len, &keep, eb)) != 0)
            goto out;
        if (keep < len) {
            if (ftruncate(c->fd, (off_t)keep) != 0) {
                rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot cut the partial last line: %s",
                                c->out_path, strerror(errno));
                goto out;
            }
            if (!c->quiet)
                fprintf(stderr, "kbcl sweep: %s: removed a partial last row (%zu bytes) left "
                        "by an interrupted run\n", c->out_path, len - keep);
            len = keep;
        }
    }
    if (!len && !c->jsonl &&
        (!(hdr = csv_header(c->plan)) || kbcl_write_all(c->fd, hdr, strlen(hdr)) != 0))
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot write the header: %s", c->out_path,
                        hdr ? strerror(errno) : "out of memory");
out:
    free(text);
    free(hdr);
    return rc;
}

/* ---------------------------------------------------------------- local workers ------- */

typedef struct sw_worker {
    pid_t pid;
    int fd, point;
    int cmd;     /* a device worker's command pipe (it reads point numbers); -1: one point */
    int busy;    /* a device worker is running a point (one-point workers always are) */
    double t0;   /* when it was handed its point (now_s) */
    size_t got;
    sw_outcome o;
} sw_worker;

/* The running points' times so far, and the longest of them. */
static void sweep_worker_times(const sw_ctx *c, double now, double *running, int *n,
                               double *longest)
{
    *n = 0;
    *longest = 0.0;
    for (int i = 0; c->workers && i < c->nworkers; i++)
        if (c->workers[i].pid && c->workers[i].busy) {
            running[*n] = now - c->workers[i].t0;
            if (running[*n] > *longest)
                *longest = running[*n];
            ++*n;
        }
}

static void crash_outcome(sw_outcome *o, int point, int status)
{
    memset(o, 0, sizeof *o);
    o->point = point;
    o->rc = SW_CRASH;
    o->verified = -1;
    if (WIFSIGNALED(status))
        snprintf(o->msg, sizeof o->msg, "the worker was killed by signal %d (%s)",
                 WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(o->msg, sizeof o->msg, "the worker exited with status %d without a result",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* In a new worker: the other workers' pipe ends are not its own (a device worker must see
 * its command pipe close when the sweep closes it). */
static void close_others(const sw_worker *all, int jobs, const sw_worker *self)
{
    for (int i = 0; i < jobs; i++) {
        if (&all[i] == self || !all[i].pid)
            continue;
        close(all[i].fd);
        if (all[i].cmd >= 0)
            close(all[i].cmd);
    }
}

static int spawn(sw_ctx *c, sw_worker *w, int point, const sigset_t *oldmask, int sfd,
                 const sw_worker *all, int jobs, kb_errbuf *eb)
{
    int pfd[2];
    pid_t parent = getpid();
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return kb_err_set(eb, KB_ERR_IO, "pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    w->pid = fork();
    if (w->pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return kb_err_set(eb, KB_ERR_IO, "fork: %s", strerror(errno));
    }
    if (w->pid == 0) {
        sw_outcome o;
        /* a worker dies with the sweep (kill -9 included) and takes default signals */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        sigprocmask(SIG_SETMASK, oldmask, NULL);
        close(sfd);
        close(pfd[0]);
        close_others(all, jobs, w);
        if (c->fd != STDOUT_FILENO)
            close(c->fd);
        run_point(c->plan, point, &o);
        _exit(kbcl_write_all(pfd[1], (const char *)&o, sizeof o) ? 1 : 0);
    }
    close(pfd[1]);
    w->fd = pfd[0];
    w->cmd = -1;
    w->busy = 1;
    w->t0 = now_s();
    w->point = point;
    w->got = 0;
    return 0;
}

/*
 * A device worker: reads point numbers until its command pipe closes and answers each with an
 * outcome, keeping one Phase-2 backend (its OpenCL context, queue and built program) for all
 * of them; it is made again only when a point needs another device or a failed flush left it
 * unusable.
 */
static void device_worker(const sw_plan *p, int cmd, int out)
{
    kb_backend be = { NULL, NULL };
    int be_dev = -1, point;
    char desc[160], note[256];

    while (kb_devd_read_full(cmd, &point, sizeof point) == 0) { /* whole reads, any fd */
        sw_outcome o;
        int dev = kb_device_from_name(point_device(p, point));
        kb_resident *res = be.ops && be.ops->resident ? be.ops->resident(be.self) : NULL;
        if (be.ops && (dev != be_dev || (res && kb_resident_broken(res)))) {
            be.ops->destroy(be.self);
            be.ops = NULL;
        }
        if (!be.ops) {
            kb_errbuf eb = { { 0 } };
            int rc = kb_backend_for_device((kb_device_kind)dev, &be, desc, sizeof desc, note,
                                           sizeof note, &eb);
            if (rc) {
                be.ops = NULL;
                memset(&o, 0, sizeof o);
                o.point = point;
                o.rc = rc;
                o.verified = -1;
                snprintf(o.msg, sizeof o.msg, "%s", eb.msg[0] ? eb.msg : kb_strerror(rc));
                if (kbcl_write_all(out, (const char *)&o, sizeof o) != 0)
                    break;
                continue;
            }
            be_dev = dev;
        }
        run_point_on(p, point, &o, &be, desc);
        if (kbcl_write_all(out, (const char *)&o, sizeof o) != 0)
            break;
    }
    if (be.ops)
        be.ops->destroy(be.self);
}

/* Starts a device worker in slot w (idle: no point yet). */
static int spawn_device(sw_ctx *c, sw_worker *w, const sigset_t *oldmask, int sfd,
                        const sw_worker *all, int jobs, kb_errbuf *eb)
{
    int pfd[2], cfd[2];
    pid_t parent = getpid();
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return kb_err_set(eb, KB_ERR_IO, "pipe: %s", strerror(errno));
    if (pipe2(cfd, O_CLOEXEC) != 0) {
        close(pfd[0]);
        close(pfd[1]);
        return kb_err_set(eb, KB_ERR_IO, "pipe: %s", strerror(errno));
    }
    fflush(stdout);
    fflush(stderr);
    w->pid = fork();
    if (w->pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        close(cfd[0]);
        close(cfd[1]);
        return kb_err_set(eb, KB_ERR_IO, "fork: %s", strerror(errno));
    }
    if (w->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        sigprocmask(SIG_SETMASK, oldmask, NULL);
        close(sfd);
        close(pfd[0]);
        close(cfd[1]);
        close_others(all, jobs, w);
        if (c->fd != STDOUT_FILENO)
            close(c->fd);
        device_worker(c->plan, cfd[0], pfd[1]);
        _exit(0);
    }
    close(pfd[1]);
    close(cfd[0]);
    w->fd = pfd[0];
    w->cmd = cfd[1];
    w->busy = 0;
    w->got = 0;
    return 0;
}

/* Hands point to the idle device worker w; -1 if the worker is gone. */
static int assign(sw_worker *w, int point)
{
    if (kbcl_write_all(w->cmd, (const char *)&point, sizeof point) != 0)
        return -1;
    w->point = point;
    w->busy = 1;
    w->t0 = now_s();
    w->got = 0;
    return 0;
}

/* Ends slot w's worker (a device worker exits when its command pipe closes). */
static void retire(sw_worker *w, int kill_it)
{
    int status;
    if (!w->pid)
        return;
    if (kill_it)
        kill(w->pid, SIGTERM);
    if (w->cmd >= 0)
        close(w->cmd);
    close(w->fd);
    while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR)
        ;
    w->pid = 0;
    w->cmd = -1;
    w->busy = 0;
}

/* Runs the pending points in up to `jobs` forked workers. Returns 0, or 128+signal. */
static int run_local(sw_ctx *c, const int *pending, int npending, int jobs, kb_errbuf *eb)
{
    sw_worker *w = calloc((size_t)jobs, sizeof *w);
    struct pollfd *pfd = calloc((size_t)jobs + 1, sizeof *pfd);
    sigset_t block, old;
    int next = 0, running = 0, stop = 0, sfd = -1, rc = 0;

    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    if (!w || !pfd) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < jobs; i++)
        w[i].cmd = -1;
    c->workers = w;
    c->nworkers = jobs;
    /* signals arrive as readable data in the poll loop: no handler, no global flag */
    sigprocmask(SIG_BLOCK, &block, &old);
    if ((sfd = signalfd(-1, &block, SFD_CLOEXEC)) < 0) {
        rc = kb_err_set(eb, KB_ERR_IO, "signalfd: %s", strerror(errno));
        goto out;
    }
    /* SIGPIPE from a device worker that died between points: seen as a failed write */
    signal(SIGPIPE, SIG_IGN);
    while (running > 0 || (next < npending && !stop)) {
        int np = 0, slot[SW_MAX_JOBS + 1];
        /* Hand out points: an OpenCL point to an idle device worker (started in a free slot
         * if there is none), any other to a one-point worker in a free slot (an idle device
         * worker gives its slot up for it). */
        while (next < npending && !stop && !c->write_failed) {
            int point = pending[next], ocl = point_uses_opencl(c->plan, point), pick = -1;
            for (int i = 0; i < jobs && pick < 0; i++)
                if (ocl && w[i].pid && w[i].cmd >= 0 && !w[i].busy)
                    pick = i;
            for (int i = 0; i < jobs && pick < 0; i++)
                if (!w[i].pid)
                    pick = i;
            for (int i = 0; i < jobs && pick < 0 && !ocl; i++)
                if (w[i].pid && w[i].cmd >= 0 && !w[i].busy) {
                    retire(&w[i], 0);
                    pick = i;
                }
            if (pick < 0)
                break;
            if (ocl) {
                if (!w[pick].pid &&
                    (rc = spawn_device(c, &w[pick], &old, sfd, w, jobs, eb)) != 0) {
                    stop = -1;
                    break;
                }
                if (assign(&w[pick], point) != 0) { /* died idle: start another */
                    retire(&w[pick], 1);
                    continue;
                }
            } else if ((rc = spawn(c, &w[pick], point, &old, sfd, w, jobs, eb)) != 0) {
                stop = -1;
                break;
            }
            next++;
            running++;
        }
        if (c->write_failed)
            stop = stop ? stop : -1;
        if (running == 0)
            break;
        pfd[np].fd = sfd;
        pfd[np].events = POLLIN;
        slot[np++] = -1;
        for (int i = 0; i < jobs; i++)
            if (w[i].pid) { /* idle device workers too: an EOF says one died */
                pfd[np].fd = w[i].fd;
                pfd[np].events = POLLIN;
                slot[np++] = i;
            }
        if (poll(pfd, (nfds_t)np, c->tty && !c->quiet ? 1000 : -1) < 0) {
            if (errno == EINTR)
                continue;
            rc = kb_err_set(eb, KB_ERR_IO, "poll: %s", strerror(errno));
            stop = -1;
            break;
        }
        if (pfd[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof si) == (ssize_t)sizeof si && stop <= 0) {
                stop = (int)si.ssi_signo;
                for (int i = 0; i < jobs; i++)
                    if (w[i].pid)
                        kill(w[i].pid, SIGTERM);
            }
        }
        for (int k = 1; k < np; k++) {
            sw_worker *x = &w[slot[k]];
            ssize_t r;
            int status = 0;
            if (!(pfd[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            r = read(x->fd, (char *)&x->o + x->got, sizeof x->o - x->got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r > 0) {
                x->got += (size_t)r;
                if (x->got < sizeof x->o)
                    continue;
                if (x->cmd >= 0) { /* a device worker's outcome: it stays, idle */
                    x->busy = 0;
                    x->got = 0;
                    running--;
                    if (finish_point(c, &x->o) != 0 && stop == 0)
                        stop = -1;
                    continue;
                }
            }
            /* a whole outcome or EOF: the worker is done */
            int was_busy = x->busy;
            if (x->cmd >= 0)
                close(x->cmd);
            x->cmd = -1;
            close(x->fd);
            while (waitpid(x->pid, &status, 0) < 0 && errno == EINTR)
                ;
            x->pid = 0;
            x->busy = 0;
            if (!was_busy)
                continue; /* an idle device worker ended */
            running--;
            if (x->got == sizeof x->o) {
                if (finish_point(c, &x->o) != 0 && stop == 0)
                    stop = -1;
                continue;
            }
            if (WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM ||
                                        WTERMSIG(status) == SIGHUP)) {
                if (stop == 0) { /* someone interrupted the worker: the sweep stops too */
                    stop = WTERMSIG(status);
                    for (int i = 0; i < jobs; i++)
                        if (w[i].pid)
                            kill(w[i].pid, SIGTERM);
                }
                continue;
            }
            if (stop > 0)
                continue; /* interrupted: the point runs again on --resume */
            crash_outcome(&x->o, x->point, status);
            if (finish_point(c, &x->o) != 0 && stop == 0)
                stop = -1;
        }
        if (c->tty && !c->quiet && stop == 0)
            progress_bar(c);
    }
    if (stop > 0)
        rc = 128 + stop;
out:
    c->workers = NULL;
    for (int i = 0; w && i < jobs; i++) /* idle device workers; any other means a stop */
        retire(&w[i], w[i].busy || w[i].cmd < 0);
    if (sfd >= 0) {
        close(sfd);
        sigprocmask(SIG_SETMASK, &old, NULL);
    }
    free(w);
    free(pfd);
    return rc;
}

/* ---------------------------------------------------------------- the command --------- */

static void usage_sweep(FILE *f)
{
    fputs("usage: kbcl sweep FILE.yaml [options]\n"
          "\n"
          "Runs every point of the grid in FILE.yaml (docs/sweeps.md) and appends one row per\n"
          "finished point to the output.\n"
          "\n"
          "  --jobs N       run N points at a time in worker processes (default 1; 0 = one per\n"
          "                 CPU). Under mpirun the points are spread over the ranks instead.\n"
          "  --out FILE     .csv (default format) or .jsonl/.json (JSON Lines); default stdout\n"
          "  --resume       keep the rows already in --out and run only the missing points\n"
          "  --quiet        no progress output\n"
          "  --plugin FILE  load a plugin before the sweep file's plugins: (repeatable;\n"
          "                 docs/plugins.md); KBCL_PLUGIN_PATH=A:B loads plugins first\n"
          "Every point is checked as `kbcl run` checks its options before any point runs.\n"
          "exit codes: 0 every point ok, 1 a verification failed, 2 usage or sweep-file error\n"
          "            or a point that cannot run (nothing ran), 3 a point errored, 128+N\n"
          "            interrupted by signal N (resume with --resume)\n",
          f);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The output's format, from its name: JSON Lines for .jsonl and .json, else CSV. */
static int out_is_jsonl(const char *path)
{
    return path && (ends_with(path, ".jsonl") || ends_with(path, ".json"));
}

int kbcl_cmd_sweep(int argc, char **argv)
{
    const char *file = NULL;
    int jobs = 1, resume = 0, quiet = 0, rank = 0, size = 1, mpi, rc = 0, code = 0;
    int *pending = NULL, npending = 0, nfiles = 0;
    const char *files[KBCL_MAX_PLUGIN_ARGS];
    kb_plugins *plugins = NULL;
    sw_plan *plan = NULL;
    sw_ctx c;
    kb_errbuf eb = { { 0 } };

    memset(&c, 0, sizeof c);
    c.fd = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_sweep(stdout);
            return 0;
        } else if (!strcmp(a, "--jobs") || !strcmp(a, "-j")) {
            char *end;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
            if (i + 1 >= argc || *end || v < 0 || v > SW_MAX_JOBS) {
                fprintf(stderr, "kbcl sweep: --jobs needs a number 0..%d\n", SW_MAX_JOBS);
                return KBCL_EXIT_USAGE;
            }
            jobs = (int)v;
            i++;
        } else if (!strcmp(a, "--out") || !strcmp(a, "-o")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kbcl sweep: --out needs a file name\n");
                return KBCL_EXIT_USAGE;
            }
            c.out_path = argv[++i];
        } else if (!strcmp(a, "--resume")) {
            resume = 1;
        } else if (!strcmp(a, "--plugin")) {
            if (i + 1 >= argc || nfiles >= KBCL_MAX_PLUGIN_ARGS) {
                fprintf(stderr, "kbcl sweep: --plugin needs a file (at most %d)\n",
                        KBCL_MAX_PLUGIN_ARGS);
                return KBCL_EXIT_USAGE;
            }
            files[nfiles++] = argv[++i];
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            quiet = 1;
        } else if (a[0] == '-' || file) {
            fprintf(stderr, "kbcl sweep: unexpected argument '%s' (see kbcl sweep --help)\n", a);
            return KBCL_EXIT_USAGE;
        } else {
            file = a;
        }
    }
    if (!file) {
        usage_sweep(stderr);
        return KBCL_EXIT_USAGE;
    }
    if (resume && !c.out_path) {
        fprintf(stderr, "kbcl sweep: --resume needs --out FILE\n");
        return KBCL_EXIT_USAGE;
    }
    if (jobs == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = n > 0 ? (n < SW_MAX_JOBS ? (int)n : SW_MAX_JOBS) : 1;
    }
    mpi = kbcl_sweep_mpi_init(&rank, &size, &eb);
    if (mpi < 0) {
        fprintf(stderr, "kbcl sweep: %s\n", eb.msg);
        return KBCL_EXIT_USAGE;
    }
    c.jsonl = out_is_jsonl(c.out_path);
    c.quiet = quiet || rank != 0;
    c.tty = isatty(STDERR_FILENO);
    c.t0 = now_s();
    /* every rank (and, through fork, every worker) has the plugins before any point runs */
    if ((rc = kb_plugins_create(&plugins, &eb)) == 0)
        rc = kbcl_plugins_load_cli(plugins, files, nfiles, &eb);
    if (rc == 0)
        rc = plan_load(file, plugins, &plan, &eb);
    if (rc != 0) {
        if (rank == 0)
            fprintf(stderr, "kbcl sweep: %s\n", eb.msg);
        npending = -1;
    } else if (rank == 0) {
        c.plan = plan;
        if (!(c.done = calloc((size_t)plan->npoints, 1)) ||
            !(pending = malloc((size_t)plan->npoints * sizeof *pending))) {
            rc = kb_err_set(&eb, KB_ERR_NOMEM, "out of memory");
        } else if ((rc = plan_check_points(plan, &eb)) == 0 &&
                   (rc = sweep_check_out(&c, file, files, nfiles, &eb)) == 0 &&
                   (rc = output_open(&c, resume, &eb)) == 0) {
            for (int i = 0; i < plan->npoints; i++)
                if (!c.done[i])
                    pending[npending++] = i;
        }
        if (rc) {
            fprintf(stderr, "kbcl sweep: %s\n", eb.msg);
            npending = -1;
        }
    }
    c.plan = plan;
    /* every rank learns rank 0's list of points to run, or that some rank cannot go on */
    if (mpi && kbcl_sweep_mpi_share(&pending, &npending, npending >= 0, &eb) != 0) {
        fprintf(stderr, "kbcl sweep: %s\n", eb.msg);
        code = KBCL_EXIT_SIM;
        goto out;
    }
    if (npending < 0) {
        code = KBCL_EXIT_USAGE;
        goto out;
    }
    c.npending = npending;
    c.slots = mpi ? size : jobs;
    if (rank == 0 && !c.quiet && !c.tty)
        fprintf(stderr, "kbcl sweep: %s: %d points, %d to run (%s %d)\n", plan->file,
                plan->npoints, npending, mpi ? "MPI ranks" : "jobs", mpi ? size : jobs);
    if (rank == 0 && !c.quiet && c.tty)
        progress_bar(&c);
    if (mpi) {
        kbcl_sweep_io io = { &c, sizeof(sw_outcome), run_point_cb, finish_point };
        rc = kbcl_sweep_mpi_run(&io, pending, npending, &eb);
    } else {
        rc = run_local(&c, pending, npending, jobs, &eb);
    }
    if (rank == 0 && c.write_failed && rc <= 0)
        rc = kb_err_set(&eb, KB_ERR_IO, "%s", c.werr.msg);
    if (rank != 0) {
        code = rc ? KBCL_EXIT_SIM : 0;
        goto out;
    }
    progress_clear(&c);
    if (rc > 0) {
        fprintf(stderr, "kbcl sweep: interrupted (%s): %d of %d points in %s; run again with "
                "--resume to finish\n", strsignal(rc - 128), c.ndone_before + c.nfinished,
                plan->npoints, c.out_path ? c.out_path : "stdout");
        code = rc;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "kbcl sweep: %s\n", eb.msg);
        code = kbcl_exit_code(rc);
        goto out;
    }
    code = c.n_err ? KBCL_EXIT_SIM : c.n_verify_fail ? KBCL_EXIT_VERIFY : 0;
    if (!quiet)
        fprintf(stderr, "kbcl sweep: %d points: %d ok, %d failed verification, %d errors "
                "(%d from earlier runs); %.1f s%s%s\n", plan->npoints, c.n_ok, c.n_verify_fail,
                c.n_err, c.ndone_before, now_s() - c.t0, c.out_path ? "; rows in " : "",
                c.out_path ? c.out_path : "");
out:
    if (c.fd >= 0 && c.fd != STDOUT_FILENO)
        close(c.fd);
    free(c.done);
    free(pending);
    plan_free(plan);
    kb_plugins_destroy(plugins);
    if (mpi)
        kbcl_sweep_mpi_fini();
    return code;
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

int kbcl_sweep_resume_check(kbcl_sweep_plan *p, const char *out, int *ndone, size_t *keep,
                            kb_errbuf *eb)
{
    sw_ctx c;
    char *text = NULL;
    size_t len = 0, kept = 0;
    int rc;

    memset(&c, 0, sizeof c);
    c.fd = -1;
    if (ndone)
        *ndone = 0;
    if (keep)
        *keep = 0;
    if (!p || !out) {
        rc = kb_err_set(eb, KB_ERR_INVAL, "kbcl_sweep_resume_check: NULL argument");
        goto out;
    }
    c.plan = p;
    c.out_path = out;
    c.jsonl = out_is_jsonl(out);
    c.quiet = 1;
    if (!(c.done = calloc((size_t)p->npoints, 1))) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((c.fd = open(out, O_RDONLY | O_CLOEXEC)) < 0 || !(text = read_fd(c.fd, &len))) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot read: %s", out, strerror(errno));
        goto out;
    }
    if ((rc = resume_scan(&c, text, len, &kept, eb)) == 0) {
        if (ndone)
            *ndone = c.ndone_before;
        if (keep)
            *keep = kept;
    }
out:
    if (c.fd >= 0)
        close(c.fd);
    free(c.done);
    free(text);
    return rc;
}
