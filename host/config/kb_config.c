/*
 * kb_config — loads configs/topology.yaml with libyaml's document API and checks every node
 * against the schema in kb_schema.c; applies --set overrides; checks cross-field rules. The
 * same walker loads the files of the layers above (ccl.yaml, through kb_config_load_sections).
 * A load works on a copy and commits only on success, so a failed load or --set leaves the
 * caller's kb_config as it was. Only the first YAML document of a file is
 * read (a second non-empty one is an error); anchors and aliases work as libyaml resolves
 * them. Messages give 1-based "FILE:LINE:COLUMN" of the offending node, as editors expect.
 */
#include "kb_config.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "kb_schema.h"

#define PATH_CAP 256 /* longest dotted key path we build */

/* PhysAddr windows (kb_addr.h; kept here so config does not depend on the address model). */
#define PE_RANGE_BYTES (UINT64_C(1) << 27)   /* tcm / ipcq / scratch: 128 MiB each */
#define HBM_WINDOW_BYTES (UINT64_C(1) << 37) /* 128 GiB per cube */
#define SRAM_WINDOW_BYTES (UINT64_C(1) << 29) /* 512 MiB per cube */

typedef struct ld_ctx {
    yaml_document_t *doc;
    const char *file;
    kb_errbuf *eb;
} ld_ctx;

/* --------------------------------------------------------------------------------------- */
/* Defaults, lookup, iteration                                                              */

void kb_config_defaults(kb_config *cfg)
{
    assert(cfg);
    /* Zero first so that string tails and padding compare equal with memcmp. */
    memset(cfg, 0, sizeof *cfg);
    kb_schema_apply_defaults(&kb_schema_topo, &cfg->topo);
}

void kb_config_fini(kb_config *cfg)
{
    (void)cfg;
}

int kb_config_create(kb_config **out, kb_errbuf *eb)
{
    kb_config *cfg = malloc(sizeof *cfg);

    *out = NULL;
    if (!cfg)
        return kb_err_nomem(eb, sizeof *cfg, "a machine configuration");
    kb_config_defaults(cfg);
    *out = cfg;
    return 0;
}

void kb_config_destroy(kb_config *cfg)
{
    if (!cfg)
        return;
    kb_config_fini(cfg);
    free(cfg);
}

void kb_config_foreach_scope(const kb_schema_scope *sc, const kb_schema_scope *inherits,
                             kb_config_key_fn fn, void *ud)
{
    const kb_schema_key *k;
    char full[PATH_CAP], type[160], dflt[PATH_CAP];

    for (size_t i = 0; (k = kb_schema_at(sc, i, NULL)) != NULL; i++) {
        snprintf(full, sizeof full, "%s%s%s", sc->prefix, sc->prefix[0] ? "." : "", k->path);
        kb_schema_type_text(k, type, sizeof type);
        /* keys that inherit from another scope (an entry's overrides of the defaults) */
        if (inherits && kb_schema_find(inherits, k->path, NULL))
            snprintf(dflt, sizeof dflt, "inherits %s.%s", inherits->prefix, k->path);
        else
            snprintf(dflt, sizeof dflt, "%s", k->dflt);
        fn(full, type, dflt, k->doc, ud);
    }
}

void kb_config_foreach_key(kb_config_key_fn fn, void *ud)
{
    if (!fn)
        return;
    kb_config_foreach_scope(&kb_schema_topo, NULL, fn, ud);
}

/* --------------------------------------------------------------------------------------- */
/* YAML walking                                                                             */

static int ld_fail(const ld_ctx *c, const yaml_node_t *n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int ld_fail(const ld_ctx *c, const yaml_node_t *n, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kb_err_set(c->eb, KB_ERR_CONFIG, "%s:%zu:%zu: %s", c->file,
                      (size_t)n->start_mark.line + 1, (size_t)n->start_mark.column + 1, msg);
}

static const char *node_kind(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SCALAR_NODE:
        return "a scalar";
    case YAML_SEQUENCE_NODE:
        return "a sequence";
    case YAML_MAPPING_NODE:
        return "a mapping";
    default:
        return "nothing";
    }
}

static const char *scalar(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static int is_quoted(const yaml_node_t *n)
{
    return n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE &&
           n->data.scalar.style != YAML_ANY_SCALAR_STYLE;
}

/* An empty plain value (`section:` with nothing under it) stands for an empty section. */
static int is_null_node(const yaml_node_t *n)
{
    const char *s;

    if (n->type != YAML_SCALAR_NODE || is_quoted(n))
        return 0;
    s = scalar(n);
    return s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0;
}

static yaml_node_t *pair_key(const ld_ctx *c, const yaml_node_pair_t *p)
{
    return yaml_document_get_node(c->doc, p->key);
}

static yaml_node_t *pair_value(const ld_ctx *c, const yaml_node_pair_t *p)
{
    return yaml_document_get_node(c->doc, p->value);
}

static void section_text(const char *disp, const char *rel, char *buf, size_t cap)
{
    if (!disp[0] && !rel[0])
        snprintf(buf, cap, "at the top level");
    else
        snprintf(buf, cap, "in section '%s%s%s'", disp, disp[0] && rel[0] ? "." : "", rel);
}

/*
 * Checks that pair i of map has a scalar key that no earlier pair repeats; where names the
 * section for messages.
 */
static int check_key(const ld_ctx *c, yaml_node_t *map, size_t i, const char *where)
{
    yaml_node_pair_t *pairs = map->data.mapping.pairs.start;
    yaml_node_t *k = pair_key(c, &pairs[i]);
    char kbuf[80];

    if (k->type != YAML_SCALAR_NODE)
        return ld_fail(c, k, "expected a plain key %s, got %s", where, node_kind(k));
    for (size_t j = 0; j < i; j++) {
        yaml_node_t *k2 = pair_key(c, &pairs[j]);
        if (k2->type == YAML_SCALAR_NODE && strcmp(scalar(k2), scalar(k)) == 0)
            return ld_fail(c, k, "duplicate key %s %s (first at line %zu)",
                           kb_config_key_shown(scalar(k), kbuf, sizeof kbuf), where,
                           (size_t)k2->start_mark.line + 1);
    }
    return 0;
}

/*
 * Walks mapping `map`, which sits at relative path rel ("" = scope root) of scope sc, storing
 * values into the struct at base. disp is the display prefix of full paths.
 */
static int walk_map(const ld_ctx *c, const kb_schema_scope *sc, const char *disp, void *base,
                    yaml_node_t *map, const char *rel)
{
    size_t n = (size_t)(map->data.mapping.pairs.top - map->data.mapping.pairs.start);
    char where[PATH_CAP + 32], sub[PATH_CAP], full[2 * PATH_CAP], known[512];
    int rc;

    section_text(disp, rel, where, sizeof where);
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &map->data.mapping.pairs.start[i];
        yaml_node_t *k = pair_key(c, p), *v = pair_value(c, p);
        const kb_schema_key *key;
        size_t off;

        rc = check_key(c, map, i, where);
        if (rc)
            return rc;
        if ((size_t)snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "." : "", scalar(k)) >=
            sizeof sub)
            return ld_fail(c, k, "key '%.64s...' is too long", scalar(k));
        snprintf(full, sizeof full, "%s%s%s", disp, disp[0] ? "." : "", sub);
        key = kb_schema_find(sc, sub, &off);
        if (key) {
            if (v->type != YAML_SCALAR_NODE)
                return ld_fail(c, v, "expected a scalar value for %s, got %s", full,
                               node_kind(v));
            rc = kb_schema_parse(key, full, scalar(v), is_quoted(v), (char *)base + off, c->eb);
            if (rc) {
                kb_err_prefix(c->eb, "%s:%zu:%zu", c->file, (size_t)v->start_mark.line + 1,
                              (size_t)v->start_mark.column + 1);
                return rc;
            }
        } else if (kb_schema_is_section(sc, sub)) {
            if (is_null_node(v))
                continue;
            if (v->type != YAML_MAPPING_NODE)
                return ld_fail(c, v, "expected a mapping for section '%s', got %s", full,
                               node_kind(v));
            rc = walk_map(c, sc, disp, base, v, sub);
            if (rc)
                return rc;
        } else {
            kb_schema_children(sc, rel, known, sizeof known);
            char kbuf[80];
            return ld_fail(c, k, "unknown key %s %s (known: %s)",
                           kb_config_key_shown(scalar(k), kbuf, sizeof kbuf), where, known);
        }
    }
    return 0;
}

int kb_config_valid_name(const char *s)
{
    if (!s || !s[0] || strlen(s) >= KB_CFG_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!(*s == '_' || *s == '-' || (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') ||
              (*s >= 'A' && *s <= 'Z')))
            return 0;
    return 1;
}

const char *kb_config_key_shown(const char *k, char *buf, size_t n)
{
    size_t len = k ? strlen(k) : 0;
    int ok = len > 0 && len < KB_CFG_NAME_MAX;
    for (size_t i = 0; ok && i < len; i++)
        ok = k[i] == '_' || k[i] == '-' || k[i] == '.' || (k[i] >= '0' && k[i] <= '9') ||
             (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z');
    if (ok)
        snprintf(buf, n, "'%s'", k);
    else
        snprintf(buf, n, "(not shown: not a key name)");
    return buf;
}

/* A section of named entries: each key is an entry name, each value one scope instance. */
static int load_entries(const ld_ctx *c, const kb_cfg_section *sec, yaml_node_t *map)
{
    size_t n = (size_t)(map->data.mapping.pairs.top - map->data.mapping.pairs.start);
    char disp[PATH_CAP], where[PATH_CAP + 32];
    int rc;

    snprintf(where, sizeof where, "in section '%s'", sec->disp);
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &map->data.mapping.pairs.start[i];
        yaml_node_t *k = pair_key(c, p), *v = pair_value(c, p);
        void *base;

        rc = check_key(c, map, i, where);
        if (rc)
            return rc;
        if (!kb_config_valid_name(scalar(k)))
            return ld_fail(c, k, "invalid %s name '%.64s' (use 1-%d letters, digits, '_' or "
                           "'-')", sec->entry_what, scalar(k), KB_CFG_NAME_MAX - 1);
        if (!is_null_node(v) && v->type != YAML_MAPPING_NODE)
            return ld_fail(c, v, "expected a mapping for %s '%s', got %s", sec->entry_what,
                           scalar(k), node_kind(v));
        base = sec->entry(sec->ud, scalar(k), (int)k->start_mark.line + 1, c->eb);
        if (!base) {
            kb_err_prefix(c->eb, "%s:%zu:%zu", c->file, (size_t)k->start_mark.line + 1,
                          (size_t)k->start_mark.column + 1);
            return KB_ERR_CONFIG;
        }
        if (is_null_node(v))
            continue;
        snprintf(disp, sizeof disp, "%s.%s", sec->disp, scalar(k));
        rc = walk_map(c, sec->scope, disp, base, v, "");
        if (rc)
            return rc;
    }
    return 0;
}

/* A section that is a list of text items (`plugins: [a.so, b.so]`). */
static int load_items(const ld_ctx *c, const kb_cfg_section *sec, yaml_node_t *seq)
{
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        yaml_node_t *v = yaml_document_get_node(c->doc, *it);
        int rc;

        if (!v || v->type != YAML_SCALAR_NODE || !scalar(v)[0])
            return ld_fail(c, v ? v : seq, "section '%s': expected a list of names, got %s",
                           sec->disp, v ? node_kind(v) : "nothing");
        rc = sec->item(sec->ud, scalar(v), c->eb);
        if (rc) {
            kb_err_prefix(c->eb, "%s:%zu:%zu", c->file, (size_t)v->start_mark.line + 1,
                          (size_t)v->start_mark.column + 1);
            return rc;
        }
    }
    return 0;
}

typedef struct sections {
    const kb_cfg_section *v;
    size_t n;
} sections;

static int load_sections_root(const ld_ctx *c, void *target, yaml_node_t *root)
{
    const sections *ss = target;
    size_t n = (size_t)(root->data.mapping.pairs.top - root->data.mapping.pairs.start);
    char known[256];
    int rc;

    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &root->data.mapping.pairs.start[i];
        yaml_node_t *k = pair_key(c, p), *v = pair_value(c, p);
        const kb_cfg_section *sec = NULL;

        rc = check_key(c, root, i, "at the top level");
        if (rc)
            return rc;
        for (size_t j = 0; j < ss->n && !sec; j++)
            if (strcmp(scalar(k), ss->v[j].key) == 0)
                sec = &ss->v[j];
        if (!sec) {
            known[0] = '\0';
            for (size_t j = 0; j < ss->n; j++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                         j ? ", " : "", ss->v[j].key);
            char kbuf[80];
            return ld_fail(c, k, "unknown key %s at the top level (known: %s)",
                           kb_config_key_shown(scalar(k), kbuf, sizeof kbuf), known);
        }
        if (is_null_node(v))
            continue;
        if (sec->item) {
            if (v->type != YAML_SEQUENCE_NODE)
                return ld_fail(c, v, "expected a list for section '%s', got %s", sec->disp,
                               node_kind(v));
            rc = load_items(c, sec, v);
            if (rc)
                return rc;
            continue;
        }
        if (v->type != YAML_MAPPING_NODE)
            return ld_fail(c, v, "expected a mapping for section '%s', got %s", sec->disp,
                           node_kind(v));
        rc = sec->entry ? load_entries(c, sec, v) : walk_map(c, sec->scope, sec->disp, sec->base, v, "");
        if (rc)
            return rc;
    }
    return 0;
}

static int load_topo_root(const ld_ctx *c, void *target, yaml_node_t *root)
{
    return walk_map(c, &kb_schema_topo, "", target, root, "");
}

typedef int (*root_fn)(const ld_ctx *c, void *target, yaml_node_t *root);

static int yaml_fail(kb_errbuf *eb, const char *path, const yaml_parser_t *ps)
{
    const yaml_mark_t *m = &ps->problem_mark;

    if (ps->context)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s:%zu:%zu: YAML syntax error: %s (%s at line %zu)",
                          path, m->line + 1, m->column + 1, ps->problem ? ps->problem : "?",
                          ps->context, ps->context_mark.line + 1);
    return kb_err_set(eb, KB_ERR_CONFIG, "%s:%zu:%zu: YAML syntax error: %s", path, m->line + 1,
                      m->column + 1, ps->problem ? ps->problem : "?");
}

/* Parses the file at path and hands its root mapping to fn (an empty file changes nothing). */
static int load_file(const char *path, root_fn fn, void *target, kb_errbuf *eb)
{
    FILE *f = NULL;
    yaml_parser_t ps;
    yaml_document_t doc, extra;
    int have_ps = 0, have_doc = 0, rc = 0;
    struct stat st;
    yaml_node_t *root;
    ld_ctx c;

    f = fopen(path, "rb");
    if (!f) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot read: %s", path, strerror(EISDIR));
        goto out;
    }
    if (!yaml_parser_initialize(&ps)) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "%s: cannot create a YAML parser", path);
        goto out;
    }
    have_ps = 1;
    yaml_parser_set_input_file(&ps, f);
    if (!yaml_parser_load(&ps, &doc)) {
        rc = yaml_fail(eb, path, &ps);
        goto out;
    }
    have_doc = 1;
    root = yaml_document_get_root_node(&doc);
    if (!root)
        goto out; /* empty file */
    if (!yaml_parser_load(&ps, &extra)) {
        rc = yaml_fail(eb, path, &ps);
        goto out;
    }
    if (yaml_document_get_root_node(&extra)) {
        yaml_mark_t m = extra.start_mark;
        yaml_document_delete(&extra);
        rc = kb_err_set(eb, KB_ERR_CONFIG, "%s:%zu:%zu: a second YAML document is not supported",
                        path, m.line + 1, m.column + 1);
        goto out;
    }
    yaml_document_delete(&extra);
    c.doc = &doc;
    c.file = path;
    c.eb = eb;
    if (is_null_node(root))
        goto out;
    if (root->type != YAML_MAPPING_NODE) {
        rc = ld_fail(&c, root, "expected a mapping at the top level, got %s", node_kind(root));
        goto out;
    }
    rc = fn(&c, target, root);
out:
    if (have_doc)
        yaml_document_delete(&doc);
    if (have_ps)
        yaml_parser_delete(&ps);
    if (f)
        fclose(f);
    return rc;
}

int kb_config_load_topology(kb_config *cfg, const char *path, kb_errbuf *eb)
{
    kb_topo_cfg work;
    int rc;

    if (!cfg || !path)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_config_load_topology: NULL argument");
    work = cfg->topo;
    rc = load_file(path, load_topo_root, &work, eb);
    if (rc == 0) {
        cfg->topo = work;
        snprintf(cfg->topo_path, sizeof cfg->topo_path, "%s", path);
    }
    return rc;
}

int kb_config_load_sections(const char *path, const kb_cfg_section *secs, size_t n,
                            kb_errbuf *eb)
{
    sections ss = { secs, n };

    if (!path || (n && !secs))
        return kb_err_set(eb, KB_ERR_INVAL, "kb_config_load_sections: NULL argument");
    return load_file(path, load_sections_root, &ss, eb);
}

/* --------------------------------------------------------------------------------------- */
/* --set                                                                                    */

static char *trim(char *s)
{
    char *e;

    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
        *--e = '\0';
    return s;
}

/* Error for a path that is neither a key nor a section of sc; names the nearest section. */
static int set_unknown(const kb_schema_scope *sc, const char *disp, const char *rel,
                       kb_errbuf *eb)
{
    char near[PATH_CAP], full[2 * PATH_CAP];
    char *dot;

    snprintf(full, sizeof full, "%s%s%s", disp, disp[0] && rel[0] ? "." : "", rel);
    snprintf(near, sizeof near, "%s", rel);
    while ((dot = strrchr(near, '.')) != NULL) {
        *dot = '\0';
        if (kb_schema_is_section(sc, near))
            return kb_err_set(eb, KB_ERR_CONFIG, "unknown key '%s' (nearest section: '%s%s%s')",
                              full, disp, disp[0] ? "." : "", near);
    }
    if (disp[0])
        return kb_err_set(eb, KB_ERR_CONFIG, "unknown key '%s' (nearest section: '%s')", full,
                          disp);
    return kb_err_set(eb, KB_ERR_CONFIG, "unknown key '%s' (top-level sections: system, host, "
                      "sip, cube, pe, ccl)", full);
}

int kb_config_set_in_scope(const kb_schema_scope *sc, const char *disp, void *base,
                           const char *rel, const char *value, int quoted, kb_errbuf *eb)
{
    const kb_schema_key *k;
    char full[2 * PATH_CAP];
    size_t off;

    k = kb_schema_find(sc, rel, &off);
    if (!k) {
        if (rel[0] && kb_schema_is_section(sc, rel))
            return kb_err_set(eb, KB_ERR_CONFIG, "'%s%s%s' is a section, not a key", disp,
                              disp[0] ? "." : "", rel);
        return set_unknown(sc, disp, rel, eb);
    }
    snprintf(full, sizeof full, "%s%s%s", disp, disp[0] ? "." : "", rel);
    return kb_schema_parse(k, full, value, quoted, (char *)base + off, eb);
}

int kb_config_parse_assignment(const char *assignment, char *buf, size_t cap, char **path,
                               char **value, int *quoted, kb_errbuf *eb)
{
    char *eq;
    size_t vlen;

    *quoted = 0;
    if (strlen(assignment) >= cap)
        return kb_err_set(eb, KB_ERR_CONFIG, "assignment is too long (at most %zu characters)",
                          cap - 1);
    memcpy(buf, assignment, strlen(assignment) + 1);
    eq = strchr(buf, '=');
    if (!eq)
        return kb_err_set(eb, KB_ERR_CONFIG, "expected KEY=VALUE (for example "
                          "system.sips.count=4)");
    *eq = '\0';
    *path = trim(buf);
    *value = trim(eq + 1);
    vlen = strlen(*value);
    /* The shell usually eats quotes; when they survive they mean "a string", as in YAML. */
    if (vlen >= 2 && ((*value)[0] == '"' || (*value)[0] == '\'') && (*value)[vlen - 1] == (*value)[0]) {
        (*value)[vlen - 1] = '\0';
        (*value)++;
        *quoted = 1;
    }
    if (!(*path)[0])
        return kb_err_set(eb, KB_ERR_CONFIG, "missing key before '='");
    return 0;
}

int kb_config_set(kb_config *cfg, const char *assignment, kb_errbuf *eb)
{
    char buf[1024];
    char *path, *value;
    int quoted, rc;

    if (!cfg || !assignment)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_config_set: NULL argument");
    rc = kb_config_parse_assignment(assignment, buf, sizeof buf, &path, &value, &quoted, eb);
    if (rc)
        goto fail;
    if (strncmp(path, "ccl.", 4) == 0) {
        rc = kb_err_set(eb, KB_ERR_CONFIG, "'%s' is a collective-library key (ccl.yaml): set it "
                        "with kb_ccl_config_set", path);
        goto fail;
    }
    rc = kb_config_set_in_scope(&kb_schema_topo, "", &cfg->topo, path, value, quoted, eb);
    if (rc)
        goto fail;
    return 0;
fail:
    kb_err_prefix(eb, "--set %s", assignment);
    return rc;
}

/* --------------------------------------------------------------------------------------- */
/* Cross-field validation                                                                   */

static int in_list(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return 1;
    return 0;
}

/* "PATH = V is out of range RANGE" for a topology key that a configuration built in code put
 * outside its schema range (files and kb_config_set refuse those values with this message
 * first), so that every range error states the whole range. */
static int range_error(const char *path, double v, kb_errbuf *eb)
{
    char num[32], range[80];
    size_t off;
    const kb_schema_key *k = kb_schema_find(&kb_schema_topo, path, &off);
    assert(k);
    if (k->type == KB_ST_DOUBLE)
        kb_schema_num_text(v, num, sizeof num);
    else
        snprintf(num, sizeof num, "%.0f", v);
    return kb_err_set(eb, KB_ERR_CONFIG, "%s = %s is out of range %s", path, num,
                      kb_schema_range_text(k, range, sizeof range));
}

static int check_link(const char *name, const kb_cfg_link *l, kb_errbuf *eb)
{
    char path[64];
    /* Written as negations so that NaN fails too. */
    if (!(l->bandwidth_gbps >= KB_CFG_MIN_RATE)) {
        snprintf(path, sizeof path, "%s.bandwidth_gbps", name);
        return range_error(path, l->bandwidth_gbps, eb);
    }
    if (!(l->latency_ns >= 0.0)) {
        snprintf(path, sizeof path, "%s.latency_ns", name);
        return range_error(path, l->latency_ns, eb);
    }
    return 0;
}

static int check_size(const char *name, uint64_t v, uint64_t lo, uint64_t hi, const char *win,
                      kb_errbuf *eb)
{
    if (v < lo || v > hi)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s = %llu does not fit: must be %llu..%llu (%s)",
                          name, (unsigned long long)v, (unsigned long long)lo,
                          (unsigned long long)hi, win);
    return 0;
}

static int validate_topo(const kb_topo_cfg *t, kb_errbuf *eb)
{
    static const struct {
        const char *name;
        size_t off;
    } links[] = {
        {"system.inter_sip_link", offsetof(kb_topo_cfg, inter_sip)},
        {"host.pcie", offsetof(kb_topo_cfg, pcie)},
        {"sip.ucie", offsetof(kb_topo_cfg, ucie)},
        {"cube.noc", offsetof(kb_topo_cfg, noc)},
        {"cube.sram", offsetof(kb_topo_cfg, sram)},
        {"cube.hbm", offsetof(kb_topo_cfg, hbm)},
        {"pe.tcm", offsetof(kb_topo_cfg, tcm)},
    };
    int cubes = kb_topo_cubes_per_sip(t), pes = kb_topo_pes_per_cube(t), rc;

    if (t->sips_count < 1 || t->sips_count > 256)
        return range_error("system.sips.count", t->sips_count, eb);
    if (kb_topo_sip_kind(t) < 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "system.sips.topology '%s' is not a SIP topology",
                          t->sips_topology);
    if (t->cube_mesh_width < 1 || t->cube_mesh_height < 1 || cubes > 32)
        return kb_err_set(eb, KB_ERR_CONFIG, "sip.cube_mesh %dx%d = %d cubes, must be 1..32",
                          t->cube_mesh_width, t->cube_mesh_height, cubes);
    if (strcmp(t->pe_layout, "corners") != 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "cube.pe_layout '%s' is not supported (corners)",
                          t->pe_layout);
    if (t->corners < 1 || t->pe_per_corner < 1 || pes > 16)
        return kb_err_set(eb, KB_ERR_CONFIG, "cube.corners * cube.pe_per_corner = %d * %d = %d "
                          "PEs per cube, must be 1..16", t->corners, t->pe_per_corner, pes);
    if (!in_list(t->switch_arbitration, kb_schema_switch_arbitrations))
        return kb_err_set(eb, KB_ERR_CONFIG, "system.switch.arbitration '%s' is not an "
                          "arbitration (route, per_sip)", t->switch_arbitration);
    if (!in_list(t->io_completions, kb_schema_io_completions))
        return kb_err_set(eb, KB_ERR_CONFIG, "sip.io_cpu.completions '%s' is not a way to "
                          "gather completions (per_cube, tree)", t->io_completions);
    if (!in_list(t->noc_topology, kb_schema_noc_topologies))
        return kb_err_set(eb, KB_ERR_CONFIG, "cube.noc.topology '%s' is not a NoC topology "
                          "(mesh, crossbar, bus)", t->noc_topology);
    if (t->noc_width < 0 || t->noc_height < 0 ||
        (t->noc_width > 0 && t->noc_height > 0 && t->noc_width * t->noc_height != pes) ||
        (t->noc_width > 0 && t->noc_height == 0 && pes % t->noc_width != 0) ||
        (t->noc_height > 0 && t->noc_width == 0 && pes % t->noc_height != 0))
        return kb_err_set(eb, KB_ERR_CONFIG, "cube.noc.width x cube.noc.height = %d x %d does not "
                          "hold the cube's %d PEs (one router per PE: width * height = %d; 0 = "
                          "derived)", t->noc_width, t->noc_height, pes, pes);
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        rc = check_link(links[i].name,
                        (const kb_cfg_link *)(const void *)((const char *)t + links[i].off), eb);
        if (rc)
            return rc;
    }
    if ((rc = check_size("pe.tcm.size_bytes", t->tcm_size_bytes, 1, PE_RANGE_BYTES,
                         "the 128 MiB tcm range", eb)) != 0 ||
        (rc = check_size("pe.scratch.size_bytes", t->scratch_size_bytes, 0, PE_RANGE_BYTES,
                         "the 128 MiB scratch range", eb)) != 0 ||
        (rc = check_size("pe.ipcq.area_bytes", t->ipcq_area_bytes, 1, PE_RANGE_BYTES,
                         "the 128 MiB ipcq range", eb)) != 0 ||
        (rc = check_size("cube.hbm.size_bytes", t->hbm_size_bytes, (uint64_t)pes,
                         HBM_WINDOW_BYTES, "the 128 GiB HBM window, at least a byte per PE",
                         eb)) != 0 ||
        (rc = check_size("cube.sram.size_bytes", t->sram_size_bytes, 1, SRAM_WINDOW_BYTES,
                         "the 512 MiB SRAM window", eb)) != 0)
        return rc;
    if (t->tcm_scheduler_reserved_bytes >= t->tcm_size_bytes)
        return kb_err_set(eb, KB_ERR_CONFIG, "pe.tcm.scheduler_reserved_bytes = %llu must be "
                          "less than pe.tcm.size_bytes = %llu",
                          (unsigned long long)t->tcm_scheduler_reserved_bytes,
                          (unsigned long long)t->tcm_size_bytes);
    if (t->dma_channels < 1)
        return range_error("pe.dma.channels", t->dma_channels, eb);
    if (!(t->dma_bandwidth_gbps >= KB_CFG_MIN_RATE))
        return range_error("pe.dma.bandwidth_gbps", t->dma_bandwidth_gbps, eb);
    if (!(t->math_lanes_per_ns >= KB_CFG_MIN_RATE))
        return range_error("pe.math.lanes_per_ns", t->math_lanes_per_ns, eb);
    if (!(t->gemm_flops_per_ns >= KB_CFG_MIN_RATE))
        return range_error("pe.gemm.flops_per_ns", t->gemm_flops_per_ns, eb);
    const struct {
        const char *key;
        double v;
    } speedups[] = { { "int8_speedup", t->gemm_int8_speedup },
                     { "fp8_speedup", t->gemm_fp8_speedup },
                     { "mxint8_speedup", t->gemm_mxint8_speedup },
                     { "sparse_speedup", t->gemm_sparse_speedup } };
    for (size_t i = 0; i < sizeof speedups / sizeof speedups[0]; i++)
        if (!(t->gemm_flops_per_ns * speedups[i].v >= KB_CFG_MIN_RATE))
            return kb_err_set(eb, KB_ERR_CONFIG, "pe.gemm.%s = %g gives a rate of %g flops per "
                              "ns with pe.gemm.flops_per_ns = %g, below the smallest one a "
                              "unit can have (%g)", speedups[i].key, speedups[i].v,
                              t->gemm_flops_per_ns * speedups[i].v, t->gemm_flops_per_ns,
                              KB_CFG_MIN_RATE);
    if (t->sched_tile_m < 1)
        return range_error("pe.scheduler.tile_m", t->sched_tile_m, eb);
    if (t->sched_tile_n < 1)
        return range_error("pe.scheduler.tile_n", t->sched_tile_n, eb);
    if (t->sched_tile_k < 1)
        return range_error("pe.scheduler.tile_k", t->sched_tile_k, eb);
    return 0;
}

int kb_topo_sip_kind(const kb_topo_cfg *t)
{
    for (int k = 0; k < KB_SIPTOPO_COUNT; k++)
        if (strcmp(t->sips_topology, kb_schema_sip_topologies[k]) == 0)
            return k;
    return KB_ERR_CONFIG;
}

int kb_topo_switch_per_sip(const kb_topo_cfg *t)
{
    return strcmp(t->switch_arbitration, "per_sip") == 0;
}

kb_noc_kind kb_topo_noc_kind(const kb_topo_cfg *t)
{
    if (strcmp(t->noc_topology, "crossbar") == 0)
        return KB_NOC_CROSSBAR;
    return strcmp(t->noc_topology, "bus") == 0 ? KB_NOC_BUS : KB_NOC_MESH;
}

void kb_topo_noc_dims(const kb_topo_cfg *t, int *w, int *h)
{
    int pes = kb_topo_pes_per_cube(t);
    if (t->noc_width > 0 && t->noc_height > 0) {
        *w = t->noc_width;
        *h = t->noc_height;
    } else if (t->noc_width > 0) {
        *w = t->noc_width;
        *h = pes / t->noc_width;
    } else if (t->noc_height > 0) {
        *h = t->noc_height;
        *w = pes / t->noc_height;
    } else {
        int best = 1;
        for (int d = 1; d * d <= pes; d++)
            if (pes % d == 0)
                best = d;
        *h = best;
        *w = pes / best;
    }
}

int kb_config_validate(const kb_config *cfg, kb_errbuf *eb)
{
    if (!cfg)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_config_validate: NULL config");
    return validate_topo(&cfg->topo, eb);
}
