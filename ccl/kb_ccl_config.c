/*
 * kb_ccl_config — ccl.yaml's schema (the key tables), loading, --set, validation and the
 * context attachment (kb_ccl_config.h). The YAML walking is host's (kb_config_load_sections);
 * this file only says which keys exist and what they mean.
 */
#include "kb_ccl_config.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_ccl.h"

#define MIB (1048576.0)

/* buffer_kind names and the memory each one means (same order) */
static const char *const buffer_kinds[] = {"tcm", "hbm", "sram", NULL};
static const kb_mem_kind buffer_mems[] = {KB_MEM_TCM, KB_MEM_HBM, KB_MEM_SRAM};

#define P_ kb_ccl_params
/* ccl.yaml `defaults`; also the override keys of an algorithm entry (minus `algorithm`). */
static const kb_schema_key param_keys[] = {
    KB_SCHEMA_STR(P_, "algorithm", algorithm, "ring_allreduce_tcm",
                  "the algorithm entry to run (name under algorithms:)"),
    KB_SCHEMA_ENUM(P_, "buffer_kind", buffer_kind, "tcm", buffer_kinds,
                   "memory that holds the IPCQ receive slots (name)"),
    KB_SCHEMA_BOOL(P_, "backpressure", backpressure, "true",
                   "senders wait for credits when the receiver's slots are full (bool)"),
    KB_SCHEMA_BOOL(P_, "posted_sends", posted_sends, "true",
                   "streamed collectives post their sends and keep a queue's window of slices "
                   "in flight; false: each send waits for its DMA, the kernels before issue #29 "
                   "(bool)"),
    KB_SCHEMA_BOOL(P_, "small_lanes", small_lanes, "true",
                   "the process group's all_reduce_shards sends latency-bound blocks whole both "
                   "ways round the lane rings and adds them in rank order; false: always the "
                   "ring reduce-scatter + all-gather, as before 2026-12-04 (bool)"),
    KB_SCHEMA_INT(P_, "n_slots", n_slots, "4", 1, 4096, "IPCQ receive slots per direction (count)"),
    KB_SCHEMA_U64(P_, "slot_size", slot_size, "262144", 16, 128 * MIB, "bytes per IPCQ slot (bytes)"),
    KB_SCHEMA_INT(P_, "world_size", world_size, "0", 0, 1048576,
                  "ranks; 0 = derive (SIP count), > 0 = rank = PE (count)"),
    KB_SCHEMA_I64(P_, "n_elem", n_elem, "0", 0, 1099511627776.0,
                  "elements per rank tile; 0 = the bench default (elements)"),
    KB_SCHEMA_INT(P_, "channels", channels, "0", 0, 4096,
                  "rank = SIP lanes: the SIP's first that many PEs (grid order) carry the "
                  "collective, NCCL's channels; 0 = every PE (count)"),
};
#undef P_

#define A_ kb_ccl_algo
/* Keys only an algorithm entry has; the defaults shown mean "unset". */
static const kb_schema_key algo_keys[] = {
    KB_SCHEMA_STR(A_, "module", module, "(required)",
                  "implementation (kernel) the entry runs (name; kbcl list shows them)"),
    KB_SCHEMA_ENUM(A_, "topology", topology, "(unset)", kb_topo_names,
                   "rank topology the algorithm is wired for (name)"),
    KB_SCHEMA_INT(A_, "root_cube", root_cube, "-1 (unset)", 0, 31,
                  "cube that collects the reduction, < cubes per SIP (index)"),
    KB_SCHEMA_INT(A_, "root", root, "-1 (unset)", 0, 1048575,
                  "root rank of a broadcast or reduce, < the world size; unset = 0 (rank)"),
    KB_SCHEMA_ENUM(A_, "op", op, "(unset)", kb_ccl_op_names,
                   "reduction of an all_reduce, reduce_scatter or reduce (sum, prod, max, min, "
                   "avg); unset = sum"),
    KB_SCHEMA_ENUM(A_, "dtype", dtype, "(unset)", kb_ccl_dtype_names,
                   "tile element type (f16, bf16, f32); unset = f16"),
};
#undef A_

static const kb_schema_scope scope_defaults = {
    "ccl.defaults", {param_keys, NULL}, {KB_SCHEMA_NKEYS(param_keys), 0}, {0, 0}, NULL};
static const kb_schema_scope scope_algo = {
    "ccl.algorithms.<name>",
    {algo_keys, param_keys},
    {KB_SCHEMA_NKEYS(algo_keys), KB_SCHEMA_NKEYS(param_keys)},
    {0, offsetof(kb_ccl_algo, p)},
    "algorithm"};

void kb_ccl_config_defaults(kb_ccl_cfg *c)
{
    /* zero first so that string tails and padding compare equal with memcmp */
    memset(c, 0, sizeof *c);
    kb_schema_apply_defaults(&scope_defaults, &c->defaults);
}

const kb_ccl_algo *kb_ccl_config_find(const kb_ccl_cfg *c, const char *name)
{
    if (!c || !name)
        return NULL;
    for (int i = 0; i < c->nalgos; i++)
        if (strcmp(c->algos[i].name, name) == 0)
            return &c->algos[i];
    return NULL;
}

kb_ccl_params kb_ccl_config_params(const kb_ccl_cfg *c, const kb_ccl_algo *entry)
{
    kb_ccl_params r = c->defaults;
    const kb_ccl_params *o;

    if (!entry)
        return r;
    o = &entry->p;
    /* the effective `algorithm` is the entry itself, whatever defaults.algorithm says */
    snprintf(r.algorithm, sizeof r.algorithm, "%s", entry->name);
    if (o->buffer_kind[0])
        memcpy(r.buffer_kind, o->buffer_kind, sizeof r.buffer_kind);
    if (o->backpressure >= 0)
        r.backpressure = o->backpressure;
    if (o->posted_sends >= 0)
        r.posted_sends = o->posted_sends;
    if (o->small_lanes >= 0)
        r.small_lanes = o->small_lanes;
    if (o->n_slots > 0)
        r.n_slots = o->n_slots;
    if (o->slot_size > 0)
        r.slot_size = o->slot_size;
    if (o->world_size > 0)
        r.world_size = o->world_size;
    if (o->n_elem > 0)
        r.n_elem = o->n_elem;
    if (o->channels > 0)
        r.channels = o->channels;
    return r;
}

void kb_ccl_config_foreach_key(kb_config_key_fn fn, void *ud)
{
    if (!fn)
        return;
    kb_config_foreach_scope(&scope_defaults, NULL, fn, ud);
    kb_config_foreach_scope(&scope_algo, &scope_defaults, fn, ud);
}

/* The entry called name, created (all overrides unset) when new; NULL when the table is full. */
static kb_ccl_algo *algo_get(kb_ccl_cfg *c, const char *name, int line)
{
    kb_ccl_algo *a;

    for (int i = 0; i < c->nalgos; i++)
        if (strcmp(c->algos[i].name, name) == 0)
            return &c->algos[i];
    if (c->nalgos >= KB_CFG_MAX_ALGOS)
        return NULL;
    a = &c->algos[c->nalgos++];
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    a->root_cube = -1;
    a->root = -1;
    a->p.backpressure = -1;
    a->p.posted_sends = -1;
    a->p.small_lanes = -1;
    a->line = line;
    return a;
}

static void *entry_of(void *ud, const char *name, int line, kb_errbuf *eb)
{
    kb_ccl_algo *a = algo_get(ud, name, line);
    if (!a)
        kb_err_set(eb, KB_ERR_CONFIG, "too many algorithms (at most %d)", KB_CFG_MAX_ALGOS);
    else
        a->line = line;
    return a;
}

/* `plugins:` items: the file being loaded and the configuration they go to. */
typedef struct plugin_ud {
    kb_ccl_cfg *c;
    const char *file;
} plugin_ud;

static int plugin_item(void *ud, const char *value, kb_errbuf *eb)
{
    plugin_ud *pu = ud;
    kb_ccl_cfg *c = pu->c;
    const char *slash = strrchr(pu->file, '/');
    char full[KB_CCL_PLUGIN_PATH_MAX + 1];
    int n;

    if (value[0] == '/' || !slash)
        n = snprintf(full, sizeof full, "%s", value);
    else
        n = snprintf(full, sizeof full, "%.*s/%s", (int)(slash - pu->file), pu->file, value);
    if (n < 0 || n >= KB_CCL_PLUGIN_PATH_MAX)
        return kb_err_set(eb, KB_ERR_CONFIG, "plugins: path '%s' is too long (at most %d "
                          "bytes once resolved)", value, KB_CCL_PLUGIN_PATH_MAX - 1);
    for (int i = 0; i < c->nplugins; i++)
        if (!strcmp(c->plugins[i], full))
            return 0;
    if (c->nplugins >= KB_CCL_MAX_PLUGINS)
        return kb_err_set(eb, KB_ERR_CONFIG, "plugins: at most %d", KB_CCL_MAX_PLUGINS);
    memcpy(c->plugins[c->nplugins++], full, (size_t)n + 1);
    return 0;
}

int kb_ccl_config_load(kb_ccl_cfg *c, const char *path, kb_errbuf *eb)
{
    kb_ccl_cfg *work = NULL;
    int rc;

    if (!c || !path)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_ccl_config_load: NULL argument");
    /* on the heap: the algorithm table is large for a fiber stack */
    work = malloc(sizeof *work);
    if (!work)
        return kb_err_set(eb, KB_ERR_NOMEM, "%s: out of memory", path);
    *work = *c;
    plugin_ud pu = { work, path };
    const kb_cfg_section secs[] = {
        { "defaults", "ccl.defaults", &scope_defaults, &work->defaults, NULL, NULL, NULL, NULL },
        { "algorithms", "ccl.algorithms", &scope_algo, NULL, entry_of, work, "algorithm", NULL },
        { "plugins", "ccl.plugins", NULL, NULL, NULL, &pu, "plugin", plugin_item },
    };
    rc = kb_config_load_sections(path, secs, sizeof secs / sizeof secs[0], eb);
    if (rc == 0) {
        *c = *work;
        snprintf(c->path, sizeof c->path, "%s", path);
    }
    free(work);
    return rc;
}

static int set_path(kb_ccl_cfg *c, const char *path, const char *value, int quoted,
                    kb_errbuf *eb)
{
    static const char algos_pfx[] = "algorithms.";
    char name[KB_CFG_NAME_MAX + 1], disp[2 * KB_CFG_NAME_MAX];
    const char *rel, *dot;
    kb_ccl_algo *a;
    int created, rc;

    if (strncmp(path, "defaults.", 9) == 0)
        return kb_config_set_in_scope(&scope_defaults, "ccl.defaults", &c->defaults, path + 9,
                                      value, quoted, eb);
    if (strncmp(path, algos_pfx, sizeof algos_pfx - 1) != 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "unknown key 'ccl.%s' (nearest section: 'ccl', "
                          "which has: defaults, algorithms)", path);
    rel = path + sizeof algos_pfx - 1;
    dot = strchr(rel, '.');
    if (!dot || (size_t)(dot - rel) >= sizeof name)
        return kb_err_set(eb, KB_ERR_CONFIG, "expected ccl.algorithms.<name>.<key>, got 'ccl.%s'",
                          path);
    memcpy(name, rel, (size_t)(dot - rel));
    name[dot - rel] = '\0';
    rel = dot + 1;
    if (!kb_config_valid_name(name))
        return kb_err_set(eb, KB_ERR_CONFIG, "invalid algorithm name '%s' (use 1-%d letters, "
                          "digits, '_' or '-')", name, KB_CFG_NAME_MAX - 1);
    snprintf(disp, sizeof disp, "ccl.algorithms.%s", name);
    if (!kb_schema_find(&scope_algo, rel, NULL))
        return kb_config_set_in_scope(&scope_algo, disp, NULL, rel, value, quoted, eb);
    created = kb_ccl_config_find(c, name) == NULL;
    a = algo_get(c, name, 0);
    if (!a)
        return kb_err_set(eb, KB_ERR_CONFIG, "cannot add algorithm '%s': at most %d algorithms",
                          name, KB_CFG_MAX_ALGOS);
    rc = kb_config_set_in_scope(&scope_algo, disp, a, rel, value, quoted, eb);
    if (rc && created) {
        /* the new entry is the last one: undo it, leaving the slot as unused slots are */
        assert(a == &c->algos[c->nalgos - 1]);
        memset(a, 0, sizeof *a);
        c->nalgos--;
    }
    return rc;
}

int kb_ccl_config_set(kb_ccl_cfg *c, const char *assignment, kb_errbuf *eb)
{
    char buf[1024];
    char *path, *value;
    int quoted, rc;

    if (!c || !assignment)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_ccl_config_set: NULL argument");
    rc = kb_config_parse_assignment(assignment, buf, sizeof buf, &path, &value, &quoted, eb);
    if (rc == 0 && strncmp(path, "ccl.", 4) != 0)
        rc = kb_err_set(eb, KB_ERR_CONFIG, "'%s' is not a collective-library key (those start "
                        "with ccl.)", path);
    if (rc == 0)
        rc = set_path(c, path + 4, value, quoted, eb);
    /* the queue's performance knobs given for a run reach every entry, also one that ships
     * its own tuning (the ring entries' slot size): a later entry-level --set still wins */
    if (rc == 0) {
        int ns = !strcmp(path, "ccl.defaults.n_slots"), ss = !strcmp(path, "ccl.defaults.slot_size");
        for (int i = 0; (ns || ss) && i < c->nalgos; i++) {
            if (ns)
                c->algos[i].p.n_slots = 0;
            else
                c->algos[i].p.slot_size = 0;
        }
    }
    if (rc)
        kb_err_prefix(eb, "--set %s", assignment);
    return rc;
}

/* "WHO: KEY = V is out of range RANGE" for a parameter that a configuration built in code put
 * outside its schema range (files and --set refuse those values first, with the range too). */
static int range_error(const char *who, const char *key, double v, kb_errbuf *eb)
{
    char range[80];
    size_t off;
    const kb_schema_key *k = kb_schema_find(&scope_defaults, key, &off);
    return kb_err_set(eb, KB_ERR_CONFIG, "%s: %s = %.0f is out of range %s", who, key, v,
                      k ? kb_schema_range_text(k, range, sizeof range) : "");
}

/* Checks effective parameters p; who names the algorithm or "ccl.defaults". */
static int validate_params(const kb_ccl_params *p, const char *who, kb_errbuf *eb)
{
    int known = 0;
    for (int i = 0; buffer_kinds[i]; i++)
        known |= strcmp(p->buffer_kind, buffer_kinds[i]) == 0;
    if (!known)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: buffer_kind '%s' must be tcm, hbm or sram", who,
                          p->buffer_kind);
    if (p->n_slots < 1)
        return range_error(who, "n_slots", p->n_slots, eb);
    if (p->slot_size < 16)
        return range_error(who, "slot_size", (double)p->slot_size, eb);
    if (p->world_size < 0)
        return range_error(who, "world_size", p->world_size, eb);
    if (p->n_elem < 0)
        return range_error(who, "n_elem", (double)p->n_elem, eb);
    if (p->channels < 0)
        return range_error(who, "channels", p->channels, eb);
    return 0;
}

int kb_ccl_config_validate(const kb_ccl_cfg *c, const kb_topo_cfg *t, kb_errbuf *eb)
{
    const kb_ccl_algo *sel;
    kb_ccl_params eff;
    char who[KB_CFG_NAME_MAX + 32];
    int rc;

    if (!c || !t)
        return kb_err_set(eb, KB_ERR_INVAL, "kb_ccl_config_validate: NULL argument");
    rc = validate_params(&c->defaults, "ccl.defaults", eb);
    if (rc)
        return rc;
    for (int i = 0; i < c->nalgos; i++) {
        const kb_ccl_algo *a = &c->algos[i];

        snprintf(who, sizeof who, "ccl.algorithms.%s", a->name);
        if (!a->module[0])
            return kb_err_set(eb, KB_ERR_CONFIG, "%s has no module", who);
        if (a->topology[0] && kb_topo_find(a->topology) < 0)
            return kb_err_set(eb, KB_ERR_CONFIG, "%s: unknown topology '%s'", who, a->topology);
        if (a->root_cube >= kb_topo_cubes_per_sip(t))
            return kb_err_set(eb, KB_ERR_CONFIG, "%s: root_cube = %d but a SIP has %d cubes", who,
                              a->root_cube, kb_topo_cubes_per_sip(t));
        eff = kb_ccl_config_params(c, a);
        rc = validate_params(&eff, who, eb);
        if (rc)
            return rc;
        if (eff.channels > kb_topo_cubes_per_sip(t) * kb_topo_pes_per_cube(t))
            return kb_err_set(eb, KB_ERR_CONFIG, "%s: channels = %d but a SIP has %d PEs", who,
                              eff.channels, kb_topo_cubes_per_sip(t) * kb_topo_pes_per_cube(t));
    }
    /*
     * The selected algorithm must exist once any are defined (with none, a caller runs a
     * built-in bench), and its world must fit the machine: a rank = PE world at most.
     */
    sel = kb_ccl_config_find(c, c->defaults.algorithm);
    if (c->nalgos > 0 && !sel)
        return kb_err_set(eb, KB_ERR_CONFIG, "ccl.defaults.algorithm '%s' is not defined under "
                          "algorithms", c->defaults.algorithm);
    eff = kb_ccl_config_params(c, sel);
    if (eff.world_size > kb_topo_total_pes(t))
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: world_size = %d exceeds the machine's %d PEs "
                          "(system.sips.count * cubes * PEs per cube)", eff.algorithm,
                          eff.world_size, kb_topo_total_pes(t));
    return 0;
}

int kb_ccl_config_ipcq(const kb_ccl_params *p, kb_ipcq_cfg *out, kb_errbuf *eb)
{
    memset(out, 0, sizeof *out);
    out->n_slots = p->n_slots;
    out->slot_size = p->slot_size;
    out->backpressure = p->backpressure != 0;
    out->posted = p->posted_sends != 0;
    for (int i = 0; buffer_kinds[i]; i++)
        if (strcmp(p->buffer_kind, buffer_kinds[i]) == 0) {
            out->buffer_kind = buffer_mems[i];
            return 0;
        }
    return kb_err_set(eb, KB_ERR_CONFIG, "buffer_kind '%s' (tcm, hbm, sram)", p->buffer_kind);
}

int kb_ccl_config_attach(kb_ctx *ctx, const kb_ccl_cfg *c)
{
    kb_ccl_cfg *copy = kb_ctx_ext(ctx, KB_EXT_CCL_CONFIG);
    if (copy) {
        *copy = *c;
        return 0;
    }
    copy = malloc(sizeof *copy);
    if (!copy)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    *copy = *c;
    kb_ctx_set_ext(ctx, KB_EXT_CCL_CONFIG, copy, free);
    return 0;
}

const kb_ccl_cfg *kb_ccl_config_of(kb_ctx *ctx)
{
    const kb_ccl_cfg *c = kb_ctx_ext(ctx, KB_EXT_CCL_CONFIG);
    if (!c) {
        kb_ccl_cfg dflt;
        kb_ccl_config_defaults(&dflt);
        if (kb_ccl_config_attach(ctx, &dflt) != 0)
            return NULL;
        c = kb_ctx_ext(ctx, KB_EXT_CCL_CONFIG);
    }
    return c;
}
