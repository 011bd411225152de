/*
 * test_ccl_config — kb_ccl_config, the collective library's configuration (ccl.yaml): built-in
 * defaults, the shipped configs/ccl.yaml and its nine algorithm entries, error messages with
 * FILE:LINE:COLUMN for bad YAML (unknown keys, including the removed mapper, validator,
 * vc_chunk_size and ipcq_credit_size_bytes; wrong types; ranges; duplicates; bad entry names),
 * all-or-nothing loads, --set overrides of ccl.* keys, the 32-entry table, entry > defaults
 * precedence, merging a second file, the key listing against docs/config-reference.md (both
 * ways: every ccl key is documented and every documented ccl key exists) and the cross-field
 * validation against the machine (root_cube, world_size). Temporary YAML files are created
 * with mkstemp in /tmp and removed by each test. Tests that need the source tree read
 * KBCL_SOURCE_DIR (set by CTest) and are skipped without it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kb_ccl_config.h"
#include "kb_config.h"

#include "kb_test_util.h"

/* ccl keys: 7 under defaults; an entry has 4 keys of its own and overrides the other 6. */
#define N_CCL_DEFAULTS_KEYS 10
#define N_CCL_ENTRY_KEYS (6 + 9)
#define N_CCL_KEYS (N_CCL_DEFAULTS_KEYS + N_CCL_ENTRY_KEYS)

/* An algorithm entry's keys, in the order unknown-key messages list them. */
#define ENTRY_KNOWN                                                                          \
    "(known: module, topology, root_cube, root, op, dtype, buffer_kind, backpressure, posted_sends, small_lanes, n_slots, "   \
    "slot_size, "                                                                            \
    "world_size, n_elem, channels)"
#define DEFAULTS_KNOWN                                                                       \
    "(known: algorithm, buffer_kind, backpressure, posted_sends, small_lanes, n_slots, slot_size, world_size, " \
    "n_elem, channels)"

/* Loads text as a ccl.yaml into c; eb gets the message. */
static int load_text(kb_ccl_cfg *c, const char *text, char path[64], kb_errbuf *eb)
{
    int rc;

    kbt_tmp_file("kbcl_test_ccl_config", text, path);
    rc = kb_ccl_config_load(c, path, eb);
    unlink(path);
    return rc;
}

/*
 * Asserts that a load of text over c fails with KB_ERR_CONFIG and a message "PATH:loc..." +
 * part, and that c is unchanged (a load is all or nothing).
 */
static void expect_load_error_over(kb_ccl_cfg *c, const char *text, const char *loc,
                                   const char *part)
{
    kb_ccl_cfg *before = malloc(sizeof *before);
    kb_errbuf eb = {{0}};
    char path[64];

    assert_non_null(before);
    *before = *c;
    assert_int_equal(load_text(c, text, path, &eb), KB_ERR_CONFIG);
    kbt_msg_at(eb.msg, path, loc, part);
    assert_memory_equal(c, before, sizeof *c);
    free(before);
}

/* The same over the built-in defaults. */
static void expect_load_error(const char *text, const char *loc, const char *part)
{
    kb_ccl_cfg c;

    kb_ccl_config_defaults(&c);
    expect_load_error_over(&c, text, loc, part);
}


/* The built-in machine, for validation. */
static kb_topo_cfg default_topo(void)
{
    kb_config m;

    kb_config_defaults(&m);
    return m.topo;
}

static void test_defaults(void **state)
{
    kb_ccl_cfg c;
    kb_ccl_params p;
    kb_topo_cfg t = default_topo();
    kb_errbuf eb = {{0}};

    (void)state;
    kb_ccl_config_defaults(&c);
    assert_string_equal(c.defaults.algorithm, "ring_allreduce_tcm");
    assert_string_equal(c.defaults.buffer_kind, "tcm");
    assert_int_equal(c.defaults.backpressure, 1);
    assert_int_equal(c.defaults.n_slots, 4);
    assert_int_equal(c.defaults.slot_size, 262144);
    assert_int_equal(c.defaults.world_size, 0);
    assert_int_equal(c.defaults.n_elem, 0);
    assert_int_equal(c.nalgos, 0);
    assert_string_equal(c.path, "");
    assert_null(kb_ccl_config_find(&c, "ring_allreduce_tcm"));
    assert_null(kb_ccl_config_find(&c, NULL));
    assert_null(kb_ccl_config_find(NULL, "ring_allreduce_tcm"));
    /* Without an entry the effective parameters are the defaults. */
    p = kb_ccl_config_params(&c, NULL);
    assert_memory_equal(&p, &c.defaults, sizeof p);
    /* No entries: the selected algorithm need not exist (a caller runs a built-in bench). */
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), 0);
}

static void check_algo(const kb_ccl_cfg *c, const char *name, const char *module,
                       const char *topology, const char *buffer_kind, int world_size,
                       int64_t n_elem, uint64_t slot_size)
{
    const kb_ccl_algo *a = kb_ccl_config_find(c, name);
    kb_ccl_params p;

    if (!a)
        fail_msg("algorithm %s missing", name);
    assert_string_equal(a->name, name);
    assert_string_equal(a->module, module);
    assert_string_equal(a->topology, topology);
    assert_int_equal(a->root_cube, -1);
    assert_true(a->line > 0);
    /* The shipped entries leave these to the defaults (but the rings' slot size: slot_size
     * 0 here = the default's) */
    assert_int_equal(a->p.backpressure, -1);
    assert_int_equal(a->p.n_slots, 0);
    assert_int_equal(a->p.slot_size, slot_size);
    assert_string_equal(a->p.algorithm, "");
    p = kb_ccl_config_params(c, a);
    assert_string_equal(p.algorithm, name);
    assert_string_equal(p.buffer_kind, buffer_kind);
    assert_int_equal(p.world_size, world_size);
    assert_int_equal(p.n_elem, n_elem);
    assert_int_equal(p.n_slots, 4);
    assert_int_equal(p.slot_size, slot_size ? slot_size : 262144);
    assert_int_equal(p.backpressure, 1);
}

static void test_shipped_ccl(void **state)
{
    static const char *const order[] = {
        "ring_allreduce_tcm", "ring_allreduce_hbm", "ring_allreduce_sram",
        "mesh_allreduce_4", "tree_allreduce_7", "hierarchical_allreduce",
        "hierarchical_allreduce_sip", "ring_rsag_allreduce", "intercube_allreduce",
        "ring_allgather", "ring_reducescatter", "p2p_sendrecv", "ring_broadcast",
        "tree_broadcast", "ring_reduce", "tree_reduce", "pairwise_alltoall", "rd_allgather",
        "rh_reducescatter", "rhd_allreduce", "dbtree_allreduce",
    };
    const int norder = (int)(sizeof order / sizeof order[0]);
    kb_ccl_cfg dflt, c;
    kb_topo_cfg t = default_topo();
    kb_errbuf eb = {{0}};
    char path[1024];

    (void)state;
    if (!kbt_source_path("configs/ccl.yaml", path, sizeof path))
        skip();
    kb_ccl_config_defaults(&dflt);
    /*
     * Load over an all-zero struct: the file's defaults section must give every non-zero
     * default, each equal to the built-in one.
     */
    memset(&c, 0, sizeof c);
    if (kb_ccl_config_load(&c, path, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_memory_equal(&c.defaults, &dflt.defaults, sizeof c.defaults);
    assert_string_equal(c.path, path);
    assert_int_equal(c.nalgos, norder);
    for (int i = 0; i < norder; i++) {
        assert_string_equal(c.algos[i].name, order[i]);
        if (i > 0)
            assert_true(c.algos[i].line > c.algos[i - 1].line);
    }
    check_algo(&c, "ring_allreduce_tcm", "ring_allreduce", "ring_1d", "tcm", 256, 8, 1048576);
    check_algo(&c, "ring_allreduce_hbm", "ring_allreduce", "ring_1d", "hbm", 256, 8, 0);
    check_algo(&c, "ring_allreduce_sram", "ring_allreduce", "ring_1d", "sram", 256, 8, 0);
    check_algo(&c, "mesh_allreduce_4", "mesh_allreduce", "mesh_2d", "tcm", 4, 0, 0);
    check_algo(&c, "tree_allreduce_7", "tree_allreduce", "tree_binary", "tcm", 7, 0, 0);
    check_algo(&c, "hierarchical_allreduce", "hierarchical_allreduce", "hierarchical_lanes",
               "tcm", 256, 0, 131072);
    check_algo(&c, "hierarchical_allreduce_sip", "hierarchical_allreduce",
               "hierarchical_3level", "tcm", 0, 0, 0);
    check_algo(&c, "ring_rsag_allreduce", "ring_rsag_allreduce", "ring_1d", "tcm", 256, 256,
               1048576);
    check_algo(&c, "intercube_allreduce", "intercube_allreduce", "none", "tcm", 0, 0, 0);
    /* the other collectives: each entry is named after its module */
    for (int i = 9; i < norder; i++) {
        const kb_ccl_algo *a = kb_ccl_config_find(&c, order[i]);
        assert_non_null(a);
        assert_string_equal(a->module, order[i]);
        assert_int_equal(a->root, -1);
    }
    /* rsag's halves take its 1 MiB slots */
    check_algo(&c, "ring_allgather", "ring_allgather", "ring_1d", "tcm", 256, 0, 1048576);
    check_algo(&c, "ring_reducescatter", "ring_reducescatter", "ring_1d", "tcm", 256, 0,
               1048576);
    check_algo(&c, "tree_reduce", "tree_reduce", "tree_binary", "tcm", 256, 0, 0);
    check_algo(&c, "pairwise_alltoall", "pairwise_alltoall", "full_mesh", "tcm", 8, 0, 8192);
    if (kb_ccl_config_validate(&c, &t, &eb) != 0)
        fail_msg("%s", eb.msg);

    /* Over the built-in defaults the result is the same. */
    kb_ccl_config_defaults(&dflt);
    if (kb_ccl_config_load(&dflt, path, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_memory_equal(&dflt, &c, sizeof c);

    /* --set ccl.defaults.slot_size / n_slots reach entries that ship their own; a later
     * entry-level --set wins again */
    const kb_ccl_algo *rs = kb_ccl_config_find(&c, "ring_rsag_allreduce");
    assert_int_equal(kb_ccl_config_params(&c, rs).slot_size, 1048576);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.slot_size=16", &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.n_slots=1", &eb), 0);
    assert_int_equal(kb_ccl_config_params(&c, rs).slot_size, 16);
    assert_int_equal(kb_ccl_config_params(&c, rs).n_slots, 1);
    assert_int_equal(kb_ccl_config_params(&c, kb_ccl_config_find(&c, "ring_allreduce_tcm")).slot_size,
                     16);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.ring_rsag_allreduce.slot_size=4096",
                                       &eb), 0);
    assert_int_equal(kb_ccl_config_params(&c, rs).slot_size, 4096);
    assert_int_equal(kb_ccl_config_params(&c, kb_ccl_config_find(&c, "ring_allreduce_tcm")).slot_size,
                     16);
}

static int is_key_char(char ch)
{
    return ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
}

/*
 * Appends to stale (", "-separated, no repeats) every key path in text that starts with
 * prefix but is not one of d's keys.
 */
static void find_stale(const kbt_doc_keys *d, const char *text, const char *prefix,
                       char *stale, size_t cap)
{
    size_t plen = strlen(prefix);

    for (const char *s = strstr(text, prefix); s; s = strstr(s + plen, prefix)) {
        char key[128];
        size_t n = 0;
        int known = 0;

        while (plen + n < sizeof key - 1 && is_key_char(s[plen + n]))
            n++;
        if (n == 0)
            continue;
        snprintf(key, sizeof key, "%s%.*s", prefix, (int)n, s + plen);
        for (int i = 0; i < d->nkeys && i < KBT_DOC_KEYS_MAX && !known; i++)
            known = strcmp(d->keys[i], key) == 0;
        if (!known && !strstr(stale, key))
            snprintf(stale + strlen(stale), cap - strlen(stale), "%s%s", stale[0] ? ", " : "",
                     key);
    }
}

static void test_docs_cover_every_key(void **state)
{
    char path[1024], stale[1024] = "";
    kbt_doc_keys d = {0};
    char *text;

    (void)state;
    if (!kbt_source_path("docs/config-reference.md", path, sizeof path))
        skip();
    text = kbt_read_file(path);
    d.text = text;
    /* The ccl keys; the topology keys are test_config's. */
    kb_ccl_config_foreach_key(kbt_doc_key, &d);
    assert_int_equal(d.nkeys, N_CCL_KEYS);
    /* ... and the other way round: every ccl key the page names is a key. */
    find_stale(&d, text, "ccl.defaults.", stale, sizeof stale);
    find_stale(&d, text, "ccl.algorithms.<name>.", stale, sizeof stale);
    free(text);
    if (d.missing)
        fail_msg("%d keys missing from docs/config-reference.md, first: %s", d.missing,
                 d.first_missing);
    if (stale[0])
        fail_msg("docs/config-reference.md names keys that do not exist: %s", stale);
}

typedef struct order_ctx {
    int n;
    char paths[N_CCL_KEYS + 8][64];
    char module_type[32], module_dflt[32], topology_type[160], root_dflt[32];
    char dflt_nslots[32], algo_nslots_dflt[64], algo_kind_type[64];
} order_ctx;

static void order_key(const char *path, const char *type, const char *dflt, const char *doc,
                      void *ud)
{
    order_ctx *o = ud;

    (void)doc;
    if (o->n < N_CCL_KEYS + 8)
        snprintf(o->paths[o->n], sizeof o->paths[0], "%s", path);
    o->n++;
    if (strcmp(path, "ccl.algorithms.<name>.module") == 0) {
        snprintf(o->module_type, sizeof o->module_type, "%s", type);
        snprintf(o->module_dflt, sizeof o->module_dflt, "%s", dflt);
    }
    if (strcmp(path, "ccl.algorithms.<name>.topology") == 0)
        snprintf(o->topology_type, sizeof o->topology_type, "%s", type);
    if (strcmp(path, "ccl.algorithms.<name>.root_cube") == 0)
        snprintf(o->root_dflt, sizeof o->root_dflt, "%s", dflt);
    if (strcmp(path, "ccl.defaults.n_slots") == 0)
        snprintf(o->dflt_nslots, sizeof o->dflt_nslots, "%s", dflt);
    if (strcmp(path, "ccl.algorithms.<name>.n_slots") == 0)
        snprintf(o->algo_nslots_dflt, sizeof o->algo_nslots_dflt, "%s", dflt);
    if (strcmp(path, "ccl.algorithms.<name>.buffer_kind") == 0)
        snprintf(o->algo_kind_type, sizeof o->algo_kind_type, "%s", type);
}

static void test_foreach_key_order(void **state)
{
    static const char *const expect[N_CCL_KEYS] = {
        "ccl.defaults.algorithm",
        "ccl.defaults.buffer_kind",
        "ccl.defaults.backpressure",
        "ccl.defaults.posted_sends",
        "ccl.defaults.small_lanes",
        "ccl.defaults.n_slots",
        "ccl.defaults.slot_size",
        "ccl.defaults.world_size",
        "ccl.defaults.n_elem",
        "ccl.defaults.channels",
        "ccl.algorithms.<name>.module",
        "ccl.algorithms.<name>.topology",
        "ccl.algorithms.<name>.root_cube",
        "ccl.algorithms.<name>.root",
        "ccl.algorithms.<name>.op",
        "ccl.algorithms.<name>.dtype",
        "ccl.algorithms.<name>.buffer_kind",
        "ccl.algorithms.<name>.backpressure",
        "ccl.algorithms.<name>.posted_sends",
        "ccl.algorithms.<name>.small_lanes",
        "ccl.algorithms.<name>.n_slots",
        "ccl.algorithms.<name>.slot_size",
        "ccl.algorithms.<name>.world_size",
        "ccl.algorithms.<name>.n_elem",
        "ccl.algorithms.<name>.channels",
    };
    order_ctx o = {0};

    (void)state;
    kb_ccl_config_foreach_key(order_key, &o);
    kb_ccl_config_foreach_key(NULL, NULL);
    assert_int_equal(o.n, N_CCL_KEYS);
    /* Exactly these, in this order: no `algorithm` in an entry, no removed key. */
    for (int i = 0; i < N_CCL_KEYS; i++)
        assert_string_equal(o.paths[i], expect[i]);
    assert_string_equal(o.module_type, "string");
    assert_string_equal(o.module_dflt, "(required)");
    assert_string_equal(o.topology_type, "enum: ring_1d|ring_1d_unidir|mesh_2d|torus_2d|"
                                         "mesh_2d_no_wrap|tree_binary|hierarchical_3level|none|"
                                         "full_mesh|hypercube|double_binary_tree|hierarchical_lanes");
    assert_string_equal(o.root_dflt, "-1 (unset)");
    assert_string_equal(o.dflt_nslots, "4");
    assert_string_equal(o.algo_nslots_dflt, "inherits ccl.defaults.n_slots");
    assert_string_equal(o.algo_kind_type, "enum: tcm|hbm|sram");
}

static void test_unknown_key(void **state)
{
    (void)state;
    expect_load_error("defaults:\n  n_slot: 5\n", "2:3: ",
                      "unknown key 'n_slot' in section 'ccl.defaults' " DEFAULTS_KNOWN);
    /* `algorithm` belongs to defaults only. */
    expect_load_error("algorithms:\n  a:\n    module: m\n    algorithm: b\n", "4:5: ",
                      "unknown key 'algorithm' in section 'ccl.algorithms.a' " ENTRY_KNOWN);
    expect_load_error("default:\n  n_slots: 5\n", "1:1: ",
                      "unknown key 'default' at the top level (known: defaults, algorithms, plugins)");
    /* Topology sections are not ccl.yaml sections. */
    expect_load_error("system:\n  sips:\n    count: 2\n", "1:1: ",
                      "unknown key 'system' at the top level (known: defaults, algorithms, plugins)");
    expect_load_error("defaults:\n  buffer:\n    kind: tcm\n", "2:3: ",
                      "unknown key 'buffer' in section 'ccl.defaults' " DEFAULTS_KNOWN);
}

/* `plugins:` records shared objects, resolved against the file's folder, each once, in order;
 * the loading is the application's. */
static void test_plugins_list(void **state)
{
    kb_ccl_cfg c;
    kb_errbuf eb = {{0}};
    char path[64], want[128];
    (void)state;
    kb_ccl_config_defaults(&c);
    assert_int_equal(c.nplugins, 0);
    assert_null(c.reg);
    assert_int_equal(load_text(&c, "plugins: [libone.so, /abs/two.so, sub/three.so, libone.so]\n",
                               path, &eb), 0);
    assert_int_equal(c.nplugins, 3);
    snprintf(want, sizeof want, "%.*s/libone.so", (int)(strrchr(path, '/') - path), path);
    assert_string_equal(c.plugins[0], want);
    assert_string_equal(c.plugins[1], "/abs/two.so");
    snprintf(want, sizeof want, "%.*s/sub/three.so", (int)(strrchr(path, '/') - path), path);
    assert_string_equal(c.plugins[2], want);
    /* a second file adds to the list; an empty list changes nothing */
    assert_int_equal(load_text(&c, "plugins:\n  - /abs/two.so\n  - /abs/four.so\n", path, &eb), 0);
    assert_int_equal(c.nplugins, 4);
    assert_string_equal(c.plugins[3], "/abs/four.so");
    assert_int_equal(load_text(&c, "plugins: []\n", path, &eb), 0);
    assert_int_equal(load_text(&c, "plugins:\n", path, &eb), 0);
    assert_int_equal(c.nplugins, 4);
    expect_load_error("plugins: libone.so\n", "1:10: ",
                      "expected a list for section 'ccl.plugins', got a scalar");
    expect_load_error("plugins:\n  - [a.so]\n", "2:5: ",
                      "section 'ccl.plugins': expected a list of names, got a sequence");
    expect_load_error("plugins:\n  - a.so\n  - ''\n", "3:5: ",
                      "section 'ccl.plugins': expected a list of names, got a scalar");
    expect_load_error("plugins: [a, b, c, d, e, f, g, h, i]\n", "1:35: ", "plugins: at most 8");
}

/* mapper, validator, vc_chunk_size and ipcq_credit_size_bytes did nothing and were removed. */
static void test_removed_keys_are_unknown(void **state)
{
    static const char *const entry_only[] = {"mapper", "validator"};
    static const char *const params[] = {"vc_chunk_size", "ipcq_credit_size_bytes"};
    char text[256], part[512], assign[128], msg[512];
    kb_ccl_cfg c, before;
    kb_errbuf eb = {{0}};

    (void)state;
    for (size_t i = 0; i < 2; i++) {
        /* In a file: FILE:LINE:COLUMN of the key. */
        snprintf(text, sizeof text, "algorithms:\n  a:\n    module: m\n    %s: all_pes\n",
                 entry_only[i]);
        snprintf(part, sizeof part, "unknown key '%s' in section 'ccl.algorithms.a' %s",
                 entry_only[i], ENTRY_KNOWN);
        expect_load_error(text, "4:5: ", part);
        snprintf(text, sizeof text, "defaults:\n  n_slots: 2\n  %s: x\n", entry_only[i]);
        snprintf(part, sizeof part, "unknown key '%s' in section 'ccl.defaults' %s",
                 entry_only[i], DEFAULTS_KNOWN);
        expect_load_error(text, "3:3: ", part);

        snprintf(text, sizeof text, "defaults:\n  n_slots: 2\n  %s: 256\n", params[i]);
        snprintf(part, sizeof part, "unknown key '%s' in section 'ccl.defaults' %s", params[i],
                 DEFAULTS_KNOWN);
        expect_load_error(text, "3:3: ", part);
        snprintf(text, sizeof text, "algorithms:\n  a:\n    module: m\n    %s: 256\n",
                 params[i]);
        snprintf(part, sizeof part, "unknown key '%s' in section 'ccl.algorithms.a' %s",
                 params[i], ENTRY_KNOWN);
        expect_load_error(text, "4:5: ", part);
    }
    /* A file in the old format (mapper/validator in every entry) fails at the first one. */
    expect_load_error("defaults:\n"
                      "  n_slots: 2\n"
                      "algorithms:\n"
                      "  ring_allreduce_tcm:\n"
                      "    module: ring_allreduce\n"
                      "    topology: ring_1d\n"
                      "    mapper: all_pes\n"
                      "    validator: single_shard_per_rank\n",
                      "7:5: ",
                      "unknown key 'mapper' in section 'ccl.algorithms.ring_allreduce_tcm' "
                      ENTRY_KNOWN);

    /* Through --set: the same keys are unknown, and no entry is created or changed. */
    kb_ccl_config_defaults(&c);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.module=ring_allreduce", &eb), 0);
    for (size_t i = 0; i < 2; i++) {
        const char *keys[2] = {entry_only[i], params[i]};

        for (size_t j = 0; j < 2; j++) {
            static const char *const names[] = {"x", "fresh"};

            for (size_t n = 0; n < 2; n++) {
                before = c;
                snprintf(assign, sizeof assign, "ccl.algorithms.%s.%s=1", names[n], keys[j]);
                snprintf(msg, sizeof msg, "--set %s: unknown key 'ccl.algorithms.%s.%s' (nearest "
                         "section: 'ccl.algorithms.%s')", assign, names[n], keys[j], names[n]);
                assert_int_equal(kb_ccl_config_set(&c, assign, &eb), KB_ERR_CONFIG);
                assert_string_equal(eb.msg, msg);
                assert_memory_equal(&c, &before, sizeof c);
            }
            before = c;
            snprintf(assign, sizeof assign, "ccl.defaults.%s=1", keys[j]);
            snprintf(msg, sizeof msg, "--set %s: unknown key 'ccl.defaults.%s' (nearest "
                     "section: 'ccl.defaults')", assign, keys[j]);
            assert_int_equal(kb_ccl_config_set(&c, assign, &eb), KB_ERR_CONFIG);
            assert_string_equal(eb.msg, msg);
            assert_memory_equal(&c, &before, sizeof c);
        }
    }
    assert_int_equal(c.nalgos, 1);
    assert_null(kb_ccl_config_find(&c, "fresh"));
}

static void test_wrong_types(void **state)
{
    (void)state;
    expect_load_error("defaults:\n  backpressure: 1\n", "2:17: ",
                      "expected a boolean (true or false) for ccl.defaults.backpressure, got '1'");
    expect_load_error("defaults:\n  backpressure: 'true'\n", "2:17: ",
                      "expected a boolean (true or false) for ccl.defaults.backpressure, got the "
                      "quoted string 'true'");
    expect_load_error("defaults:\n  n_slots: four\n", "2:12: ",
                      "expected an integer for ccl.defaults.n_slots, got 'four'");
    expect_load_error("defaults:\n  buffer_kind: dram\n", "2:16: ",
                      "invalid value 'dram' for ccl.defaults.buffer_kind (allowed: tcm, hbm, "
                      "sram)");
    expect_load_error("defaults:\n  algorithm: a/b\n", "2:14: ",
                      "invalid character '/' in value 'a/b' for ccl.defaults.algorithm");
    expect_load_error("algorithms:\n  a:\n    module: m\n    topology: ring_9d\n", "4:15: ",
                      "invalid value 'ring_9d' for ccl.algorithms.a.topology (allowed: ring_1d, "
                      "ring_1d_unidir, mesh_2d, torus_2d, mesh_2d_no_wrap, tree_binary, "
                      "hierarchical_3level, none, full_mesh, hypercube, double_binary_tree, "
                      "hierarchical_lanes)");
    expect_load_error("algorithms:\n  a:\n    module:\n", "3:12: ",
                      "missing value for ccl.algorithms.a.module");
    /* A mapping where a scalar belongs and vice versa; a sequence. */
    expect_load_error("defaults:\n  n_slots:\n    a: 1\n", "3:5: ",
                      "expected a scalar value for ccl.defaults.n_slots, got a mapping");
    expect_load_error("defaults: 5\n", "1:11: ",
                      "expected a mapping for section 'ccl.defaults', got a scalar");
    expect_load_error("algorithms: [a, b]\n", "1:13: ",
                      "expected a mapping for section 'ccl.algorithms', got a sequence");
    expect_load_error("- 1\n- 2\n", "1:1: ",
                      "expected a mapping at the top level, got a sequence");
    expect_load_error("algorithms:\n  a: 5\n", "2:6: ",
                      "expected a mapping for algorithm 'a', got a scalar");
}

static void test_bad_entry_names(void **state)
{
    char text[160], name[80];

    (void)state;
    expect_load_error("algorithms:\n  a.b:\n    module: m\n", "2:3: ",
                      "invalid algorithm name 'a.b' (use 1-63 letters, digits, '_' or '-')");
    expect_load_error("algorithms:\n  b@d:\n    module: m\n", "2:3: ",
                      "invalid algorithm name 'b@d'");
    expect_load_error("algorithms:\n  '':\n    module: m\n", "2:3: ",
                      "invalid algorithm name ''");
    expect_load_error("algorithms:\n  [a]:\n    module: m\n", "2:3: ",
                      "expected a plain key in section 'ccl.algorithms', got a sequence");
    /* 63 characters is the longest name. */
    memset(name, 'n', 64);
    name[64] = '\0';
    snprintf(text, sizeof text, "algorithms:\n  %s:\n    module: m\n", name);
    expect_load_error(text, "2:3: ", "invalid algorithm name 'nnnn");
    name[63] = '\0';
    {
        kb_ccl_cfg c;
        kb_errbuf eb = {{0}};
        char path[64];

        kb_ccl_config_defaults(&c);
        snprintf(text, sizeof text, "algorithms:\n  %s:\n    module: m\n", name);
        if (load_text(&c, text, path, &eb) != 0)
            fail_msg("%s", eb.msg);
        assert_non_null(kb_ccl_config_find(&c, name));
    }
}

static void test_out_of_range_and_duplicates(void **state)
{
    (void)state;
    expect_load_error("defaults:\n  slot_size: 8\n", "2:14: ",
                      "ccl.defaults.slot_size = 8 is out of range [16, 134217728]");
    expect_load_error("defaults:\n  n_slots: 0\n", "2:12: ",
                      "ccl.defaults.n_slots = 0 is out of range [1, 4096]");
    expect_load_error("defaults:\n  world_size: -1\n", "2:15: ",
                      "ccl.defaults.world_size = -1 is out of range [0, 1048576]");
    expect_load_error("algorithms:\n  a:\n    root_cube: 32\n", "3:16: ",
                      "ccl.algorithms.a.root_cube = 32 is out of range [0, 31]");
    expect_load_error("algorithms:\n  a:\n    n_slots: 4097\n", "3:14: ",
                      "ccl.algorithms.a.n_slots = 4097 is out of range [1, 4096]");
    expect_load_error("algorithms:\n  a:\n    module: m\n  a:\n    module: n\n", "4:3: ",
                      "duplicate key 'a' in section 'ccl.algorithms' (first at line 2)");
    expect_load_error("defaults:\n  n_slots: 2\n  n_slots: 3\n", "3:3: ",
                      "duplicate key 'n_slots' in section 'ccl.defaults' (first at line 2)");
    expect_load_error("algorithms:\n  a:\n    module: m\n    module: n\n", "4:5: ",
                      "duplicate key 'module' in section 'ccl.algorithms.a' (first at line 3)");
    expect_load_error("defaults:\n  n_slots: 2\ndefaults:\n  n_slots: 3\n", "3:1: ",
                      "duplicate key 'defaults' at the top level (first at line 1)");
}

static void test_yaml_syntax_errors(void **state)
{
    (void)state;
    /* Broken indentation: the third key is indented less than its siblings. */
    expect_load_error("algorithms:\n"
                      "  a:\n"
                      "    module: m\n"
                      "   n_slots: 3\n",
                      "4:4: ", "YAML syntax error: did not find expected key");
    expect_load_error("defaults: {n_slots: 5\n", "2:1: ", "YAML syntax error: ");
    expect_load_error("defaults: {n_slots: 4}\n---\ndefaults: {n_slots: 2}\n", "2:1: ",
                      "a second YAML document is not supported");
}

/* A load is all or nothing: an error after good entries leaves the earlier state. */
static void test_failed_load_changes_nothing(void **state)
{
    kb_ccl_cfg c;
    kb_errbuf eb = {{0}};
    char path[64];

    (void)state;
    kb_ccl_config_defaults(&c);
    if (load_text(&c, "algorithms:\n  keep:\n    module: ring_allreduce\n", path, &eb) != 0)
        fail_msg("%s", eb.msg);
    expect_load_error_over(&c,
                           "defaults:\n"
                           "  n_slots: 9\n"
                           "algorithms:\n"
                           "  keep:\n"
                           "    n_slots: 3\n"
                           "  new_one:\n"
                           "    module: m\n"
                           "    n_slots: 0\n",
                           "8:14: ", "ccl.algorithms.new_one.n_slots = 0 is out of range");
    assert_int_equal(c.nalgos, 1);
    assert_int_equal(c.defaults.n_slots, 4);
    assert_int_equal(c.algos[0].p.n_slots, 0);
    assert_string_equal(c.path, path);
}

static void test_missing_file_and_empty_file(void **state)
{
    kb_ccl_cfg c, before;
    kb_topo_cfg t = default_topo();
    kb_errbuf eb = {{0}};
    char path[64];

    (void)state;
    kb_ccl_config_defaults(&c);
    before = c;
    assert_int_equal(kb_ccl_config_load(&c, "/nonexistent/kbcl/ccl.yaml", &eb), KB_ERR_IO);
    assert_string_equal(eb.msg, "/nonexistent/kbcl/ccl.yaml: cannot open: No such file or "
                                "directory");
    assert_int_equal(kb_ccl_config_load(&c, "/nonexistent/ccl.yaml", NULL), KB_ERR_IO);
    assert_int_equal(kb_ccl_config_load(&c, "/tmp", &eb), KB_ERR_IO);
    assert_string_equal(eb.msg, "/tmp: cannot read: Is a directory");
    assert_int_equal(kb_ccl_config_load(NULL, "x", &eb), KB_ERR_INVAL);
    assert_int_equal(kb_ccl_config_load(&c, NULL, &eb), KB_ERR_INVAL);
    assert_memory_equal(&c, &before, sizeof c);
    /* An empty file (or only comments, or empty sections) is a valid file that changes
     * nothing but the path it remembers. */
    assert_int_equal(load_text(&c, "", path, &eb), 0);
    assert_string_equal(c.path, path);
    assert_int_equal(load_text(&c, "# nothing\n", path, &eb), 0);
    assert_int_equal(load_text(&c, "defaults:\nalgorithms: ~\n", path, &eb), 0);
    assert_memory_equal(&c.defaults, &before.defaults, sizeof c.defaults);
    assert_int_equal(c.nalgos, 0);
    assert_memory_equal(c.algos, before.algos, sizeof c.algos);
    /* An entry without keys exists (and fails validation for lack of a module). */
    assert_int_equal(load_text(&c, "algorithms:\n  bare:\n", path, &eb), 0);
    assert_int_equal(c.nalgos, 1);
    assert_int_equal(kb_ccl_config_find(&c, "bare")->line, 2);
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), KB_ERR_CONFIG);
    assert_string_equal(eb.msg, "ccl.algorithms.bare has no module");
}

static void expect_set_error(kb_ccl_cfg *c, const char *assignment, const char *msg)
{
    kb_ccl_cfg *before = malloc(sizeof *before);
    kb_errbuf eb = {{0}};

    assert_non_null(before);
    *before = *c;
    assert_int_equal(kb_ccl_config_set(c, assignment, &eb), KB_ERR_CONFIG);
    assert_string_equal(eb.msg, msg);
    assert_memory_equal(c, before, sizeof *c);
    free(before);
}

static void test_set(void **state)
{
    kb_ccl_cfg c;
    kb_topo_cfg t = default_topo();
    kb_errbuf eb = {{0}};
    const kb_ccl_algo *a;

    (void)state;
    kb_ccl_config_defaults(&c);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.backpressure=false", &eb), 0);
    assert_int_equal(c.defaults.backpressure, 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.n_elem=1024", &eb), 0);
    assert_int_equal(c.defaults.n_elem, 1024);
    assert_int_equal(kb_ccl_config_set(&c, " ccl.defaults.n_slots = 0x10 ", &eb), 0);
    assert_int_equal(c.defaults.n_slots, 16);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.buffer_kind=hbm", &eb), 0);
    assert_string_equal(c.defaults.buffer_kind, "hbm");
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.algorithm='mine'", &eb), 0);
    assert_string_equal(c.defaults.algorithm, "mine");

    /* A new algorithm entry is created with every override unset. */
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.mine.module=ring_allreduce", &eb), 0);
    assert_int_equal(c.nalgos, 1);
    a = kb_ccl_config_find(&c, "mine");
    assert_non_null(a);
    assert_string_equal(a->module, "ring_allreduce");
    assert_string_equal(a->topology, "");
    assert_int_equal(a->root_cube, -1);
    assert_int_equal(a->root, -1);
    assert_int_equal(a->p.backpressure, -1);
    assert_int_equal(a->p.n_slots, 0);
    assert_int_equal(a->p.slot_size, 0);
    assert_int_equal(a->p.world_size, 0);
    assert_int_equal(a->p.n_elem, 0);
    assert_string_equal(a->p.buffer_kind, "");
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.mine.root_cube=3", &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.mine.root=5", &eb), 0);
    assert_int_equal(a->root, 5);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.mine.backpressure=true", &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.mine.topology=tree_binary", &eb), 0);
    assert_int_equal(c.nalgos, 1);
    assert_int_equal(a->root_cube, 3);
    assert_int_equal(a->p.backpressure, 1);
    assert_string_equal(a->topology, "tree_binary");
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), 0);

    expect_set_error(&c, "ccl.defaults.backpressure=maybe",
                     "--set ccl.defaults.backpressure=maybe: expected a boolean (true or false) "
                     "for ccl.defaults.backpressure, got 'maybe'");
    expect_set_error(&c, "ccl.defaults.n_slots=",
                     "--set ccl.defaults.n_slots=: missing value for ccl.defaults.n_slots");
    expect_set_error(&c, "ccl.defaults.n_slots=\"4\"",
                     "--set ccl.defaults.n_slots=\"4\": expected an integer for "
                     "ccl.defaults.n_slots, got the quoted string '4'");
    expect_set_error(&c, "ccl.defaults.slot_size=8",
                     "--set ccl.defaults.slot_size=8: ccl.defaults.slot_size = 8 is out of range "
                     "[16, 134217728]");
    expect_set_error(&c, "ccl.defaults.buffer_kind=dram",
                     "--set ccl.defaults.buffer_kind=dram: invalid value 'dram' for "
                     "ccl.defaults.buffer_kind (allowed: tcm, hbm, sram)");
    expect_set_error(&c, "ccl.defaults.nslots=4",
                     "--set ccl.defaults.nslots=4: unknown key 'ccl.defaults.nslots' (nearest "
                     "section: 'ccl.defaults')");
    expect_set_error(&c, "ccl.foo=4",
                     "--set ccl.foo=4: unknown key 'ccl.foo' (nearest section: 'ccl', which "
                     "has: defaults, algorithms)");
    expect_set_error(&c, "ccl.defaults=4",
                     "--set ccl.defaults=4: unknown key 'ccl.defaults' (nearest section: 'ccl', "
                     "which has: defaults, algorithms)");
    expect_set_error(&c, "ccl.algorithms.mine=4",
                     "--set ccl.algorithms.mine=4: expected ccl.algorithms.<name>.<key>, got "
                     "'ccl.algorithms.mine'");
    expect_set_error(&c, "ccl.algorithms.b@d.module=x",
                     "--set ccl.algorithms.b@d.module=x: invalid algorithm name 'b@d' (use 1-63 "
                     "letters, digits, '_' or '-')");
    /* Not a ccl key, or not an assignment. */
    expect_set_error(&c, "system.sips.count=4",
                     "--set system.sips.count=4: 'system.sips.count' is not a collective-library "
                     "key (those start with ccl.)");
    expect_set_error(&c, "ccl.defaults.n_slots",
                     "--set ccl.defaults.n_slots: expected KEY=VALUE (for example "
                     "system.sips.count=4)");
    expect_set_error(&c, "=4", "--set =4: missing key before '='");
    /* Bad key or value for a new entry: no entry is left behind. */
    expect_set_error(&c, "ccl.algorithms.fresh.bogus=1",
                     "--set ccl.algorithms.fresh.bogus=1: unknown key "
                     "'ccl.algorithms.fresh.bogus' (nearest section: 'ccl.algorithms.fresh')");
    expect_set_error(&c, "ccl.algorithms.fresh.n_slots=0",
                     "--set ccl.algorithms.fresh.n_slots=0: ccl.algorithms.fresh.n_slots = 0 is "
                     "out of range [1, 4096]");
    expect_set_error(&c, "ccl.algorithms.fresh.algorithm=x",
                     "--set ccl.algorithms.fresh.algorithm=x: unknown key "
                     "'ccl.algorithms.fresh.algorithm' (nearest section: "
                     "'ccl.algorithms.fresh')");
    expect_set_error(&c, "ccl.algorithms.fresh.topology=ring_9d",
                     "--set ccl.algorithms.fresh.topology=ring_9d: invalid value 'ring_9d' for "
                     "ccl.algorithms.fresh.topology (allowed: ring_1d, ring_1d_unidir, mesh_2d, "
                     "torus_2d, mesh_2d_no_wrap, tree_binary, hierarchical_3level, none, full_mesh, hypercube, double_binary_tree, hierarchical_lanes)");
    expect_set_error(&c, "ccl.algorithms.fresh.root_cube=32",
                     "--set ccl.algorithms.fresh.root_cube=32: ccl.algorithms.fresh.root_cube = "
                     "32 is out of range [0, 31]");
    /* A bad value for an existing entry leaves it as it was. */
    expect_set_error(&c, "ccl.algorithms.mine.backpressure=2",
                     "--set ccl.algorithms.mine.backpressure=2: expected a boolean (true or "
                     "false) for ccl.algorithms.mine.backpressure, got '2'");
    assert_int_equal(c.nalgos, 1);
    assert_null(kb_ccl_config_find(&c, "fresh"));
    assert_int_equal(kb_ccl_config_set(&c, NULL, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_ccl_config_set(NULL, "ccl.defaults.n_slots=4", &eb), KB_ERR_INVAL);
    assert_int_equal(kb_ccl_config_set(&c, "x=1", NULL), KB_ERR_CONFIG);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.n_slots=x", NULL), KB_ERR_CONFIG);
}

static void test_set_fills_algorithm_table(void **state)
{
    kb_ccl_cfg c;
    kb_errbuf eb = {{0}};
    char assign[128];

    (void)state;
    kb_ccl_config_defaults(&c);
    for (int i = 0; i < KB_CFG_MAX_ALGOS; i++) {
        snprintf(assign, sizeof assign, "ccl.algorithms.a%d.module=m", i);
        assert_int_equal(kb_ccl_config_set(&c, assign, &eb), 0);
    }
    assert_int_equal(KB_CFG_MAX_ALGOS, 32);
    assert_int_equal(c.nalgos, KB_CFG_MAX_ALGOS);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.a5.n_slots=2", &eb), 0);
    assert_int_equal(kb_ccl_config_find(&c, "a5")->p.n_slots, 2);
    expect_set_error(&c, "ccl.algorithms.one_more.module=m",
                     "--set ccl.algorithms.one_more.module=m: cannot add algorithm 'one_more': "
                     "at most 32 algorithms");
}

static void test_load_fills_algorithm_table(void **state)
{
    kb_ccl_cfg c;
    kb_errbuf eb = {{0}};
    char text[2048], path[64];
    size_t len;

    (void)state;
    len = (size_t)snprintf(text, sizeof text, "algorithms:\n");
    for (int i = 0; i < KB_CFG_MAX_ALGOS; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "  a%d: {module: m}\n", i);
    kb_ccl_config_defaults(&c);
    if (load_text(&c, text, path, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_int_equal(c.nalgos, KB_CFG_MAX_ALGOS);
    /* Loading the same file again merges into the same 32 entries. */
    if (load_text(&c, text, path, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_int_equal(c.nalgos, KB_CFG_MAX_ALGOS);

    /* A 33rd entry is an error at its name; the load changes nothing. */
    snprintf(text + len, sizeof text - len, "  one_more: {module: m}\n");
    kb_ccl_config_defaults(&c);
    expect_load_error_over(&c, text, "34:3: ", "too many algorithms (at most 32)");
    assert_int_equal(c.nalgos, 0);
}

static void test_algorithm_override_precedence(void **state)
{
    kb_ccl_cfg c;
    kb_topo_cfg t = default_topo();
    kb_errbuf eb = {{0}};
    char path[64];
    const kb_ccl_algo *a, *b;
    kb_ccl_params p;

    (void)state;
    kb_ccl_config_defaults(&c);
    if (load_text(&c,
                  "defaults:\n"
                  "  algorithm: a\n"
                  "  n_slots: 6\n"
                  "  world_size: 2\n"
                  "  buffer_kind: sram\n"
                  "algorithms:\n"
                  "  a:\n"
                  "    module: ring_allreduce\n"
                  "    n_slots: 2\n"
                  "    buffer_kind: hbm\n"
                  "    backpressure: false\n"
                  "    slot_size: 64\n"
                  "    root_cube: 5\n"
                  "  b:\n"
                  "    module: tree_allreduce\n"
                  "    world_size: 7\n",
                  path, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_string_equal(c.path, path);
    a = kb_ccl_config_find(&c, "a");
    b = kb_ccl_config_find(&c, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->line, 7);
    assert_int_equal(b->line, 14);
    assert_int_equal(a->root_cube, 5);

    p = kb_ccl_config_params(&c, a);
    assert_string_equal(p.algorithm, "a");
    assert_string_equal(p.buffer_kind, "hbm");
    assert_int_equal(p.backpressure, 0);
    assert_int_equal(p.n_slots, 2);
    assert_int_equal(p.slot_size, 64);
    assert_int_equal(p.n_elem, 0);            /* inherited */
    assert_int_equal(p.world_size, 2);        /* defaults override */
    p = kb_ccl_config_params(&c, b);
    assert_string_equal(p.algorithm, "b");    /* the entry, whatever defaults.algorithm says */
    assert_string_equal(p.buffer_kind, "sram");
    assert_int_equal(p.backpressure, 1);
    assert_int_equal(p.n_slots, 6);
    assert_int_equal(p.slot_size, 262144);
    assert_int_equal(p.world_size, 7);        /* algorithm override beats defaults */
    p = kb_ccl_config_params(&c, NULL);
    assert_string_equal(p.algorithm, "a");
    assert_int_equal(p.n_slots, 6);
    assert_string_equal(p.buffer_kind, "sram");

    /* --set on defaults reaches entries without an override only ... */
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.buffer_kind=tcm", &eb), 0);
    assert_string_equal(kb_ccl_config_params(&c, a).buffer_kind, "hbm");
    assert_string_equal(kb_ccl_config_params(&c, NULL).buffer_kind, "tcm");
    /* ... but the queue's performance parameters reach every entry */
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.n_slots=9", &eb), 0);
    assert_int_equal(kb_ccl_config_params(&c, a).n_slots, 9);
    assert_int_equal(kb_ccl_config_params(&c, a).slot_size, 64);
    assert_int_equal(kb_ccl_config_params(&c, b).n_slots, 9);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.b.n_slots=3", &eb), 0);
    assert_int_equal(kb_ccl_config_params(&c, b).n_slots, 3);
    /* An entry's backpressure: false overrides defaults' true, and true overrides false. */
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.backpressure=false", &eb), 0);
    assert_int_equal(kb_ccl_config_params(&c, b).backpressure, 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.b.backpressure=true", &eb), 0);
    assert_int_equal(kb_ccl_config_params(&c, b).backpressure, 1);
    assert_int_equal(kb_ccl_config_params(&c, a).backpressure, 0);

    /* A second file merges into existing entries and adds new ones. */
    if (load_text(&c, "algorithms:\n  b:\n    n_elem: 16\n  c:\n    module: x\n", path,
                  &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_int_equal(c.nalgos, 3);
    assert_string_equal(c.path, path);
    b = kb_ccl_config_find(&c, "b");
    assert_string_equal(b->module, "tree_allreduce");
    assert_string_equal(c.algos[2].name, "c");
    assert_int_equal(b->p.n_elem, 16);
    assert_int_equal(b->p.n_slots, 3);
    assert_int_equal(b->p.world_size, 7);
    assert_int_equal(b->line, 2);
    assert_int_equal(kb_ccl_config_find(&c, "a")->root_cube, 5);
    assert_int_equal(c.defaults.n_slots, 9);
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), 0);
}

static void expect_invalid(const kb_ccl_cfg *c, const kb_topo_cfg *t, const char *part)
{
    kb_errbuf eb = {{0}};

    assert_int_equal(kb_ccl_config_validate(c, t, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, part);
}

static void test_validate(void **state)
{
    kb_ccl_cfg base, c;
    kb_config m;
    kb_topo_cfg t = default_topo();
    kb_errbuf eb = {{0}};

    (void)state;
    kb_ccl_config_defaults(&base);
    assert_int_equal(kb_ccl_config_validate(NULL, &t, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_ccl_config_validate(&base, NULL, &eb), KB_ERR_INVAL);

    c = base;
    c.defaults.n_slots = 0;
    expect_invalid(&c, &t, "ccl.defaults: n_slots = 0 is out of range [1, 4096]");

    c = base;
    c.defaults.slot_size = 8;
    expect_invalid(&c, &t, "ccl.defaults: slot_size = 8 is out of range [16, 134217728]");

    c = base;
    snprintf(c.defaults.buffer_kind, sizeof c.defaults.buffer_kind, "dram");
    expect_invalid(&c, &t, "ccl.defaults: buffer_kind 'dram' must be tcm, hbm or sram");

    c = base;
    c.defaults.n_elem = -1;
    expect_invalid(&c, &t, "ccl.defaults: n_elem = -1 is out of range [0, 1099511627776]");

    /* With no entries, the defaults' world must still fit the machine. */
    c = base;
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.world_size=257", &eb), 0);
    expect_invalid(&c, &t, "ring_allreduce_tcm: world_size = 257 exceeds the machine's 256 PEs");

    c = base;
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.n_slots=2", &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.algorithm=x", &eb), 0);
    expect_invalid(&c, &t, "ccl.algorithms.x has no module");
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.module=ring_allreduce", &eb), 0);
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), 0);
    /* channels: at most the PEs of a SIP (128 on the default machine), inherited or not */
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.channels=128", &eb), 0);
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.channels=129", &eb), 0);
    expect_invalid(&c, &t, "ccl.algorithms.x: channels = 129 but a SIP has 128 PEs");
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.channels=24", &eb), 0);
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), 0);
    assert_int_equal(kb_ccl_config_params(&c, &c.algos[0]).channels, 24);
    assert_int_not_equal(kb_ccl_config_set(&c, "ccl.defaults.channels=-1", &eb), 0);
    kbt_msg_has(eb.msg, "channels");
    c.defaults.channels = 0;
    c.algos[0].p.channels = 0;
    /* An entry's effective parameters are checked too. */
    c.algos[0].p.slot_size = 8;
    expect_invalid(&c, &t, "ccl.algorithms.x: slot_size = 8 is out of range [16, 134217728]");
    c.algos[0].p.slot_size = 0;
    snprintf(c.algos[0].topology, sizeof c.algos[0].topology, "ring_9d");
    expect_invalid(&c, &t, "ccl.algorithms.x: unknown topology 'ring_9d'");
    c.algos[0].topology[0] = '\0';
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), 0);

    /* root_cube against the machine's cubes per SIP. */
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.root_cube=16", &eb), 0);
    expect_invalid(&c, &t, "ccl.algorithms.x: root_cube = 16 but a SIP has 16 cubes");
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.root_cube=15", &eb), 0);
    assert_int_equal(kb_ccl_config_validate(&c, &t, &eb), 0);
    kb_config_defaults(&m);
    assert_int_equal(kb_config_set(&m, "sip.cube_mesh.width=2", &eb), 0);
    expect_invalid(&c, &m.topo, "ccl.algorithms.x: root_cube = 15 but a SIP has 8 cubes");
    assert_int_equal(kb_config_set(&m, "sip.cube_mesh.width=8", &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.root_cube=31", &eb), 0);
    assert_int_equal(kb_ccl_config_validate(&c, &m.topo, &eb), 0);

    /* world_size against the machine's PEs (system.sips.count * cubes * PEs per cube). */
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.root_cube=15", &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.world_size=257", &eb), 0);
    expect_invalid(&c, &t, "x: world_size = 257 exceeds the machine's 256 PEs");
    kb_config_defaults(&m);
    assert_int_equal(kb_config_set(&m, "system.sips.count=3", &eb), 0);
    assert_int_equal(kb_ccl_config_validate(&c, &m.topo, &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.x.world_size=385", &eb), 0);
    expect_invalid(&c, &m.topo, "x: world_size = 385 exceeds the machine's 384 PEs");
    /* Only the selected entry's world must fit. */
    assert_int_equal(kb_ccl_config_set(&c, "ccl.algorithms.y.module=tree_allreduce", &eb), 0);
    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.algorithm=y", &eb), 0);
    assert_int_equal(kb_ccl_config_validate(&c, &m.topo, &eb), 0);

    assert_int_equal(kb_ccl_config_set(&c, "ccl.defaults.algorithm=nope", &eb), 0);
    expect_invalid(&c, &m.topo, "ccl.defaults.algorithm 'nope' is not defined under algorithms");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_shipped_ccl),
        cmocka_unit_test(test_docs_cover_every_key),
        cmocka_unit_test(test_foreach_key_order),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_plugins_list),
        cmocka_unit_test(test_removed_keys_are_unknown),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_bad_entry_names),
        cmocka_unit_test(test_out_of_range_and_duplicates),
        cmocka_unit_test(test_yaml_syntax_errors),
        cmocka_unit_test(test_failed_load_changes_nothing),
        cmocka_unit_test(test_missing_file_and_empty_file),
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_set_fills_algorithm_table),
        cmocka_unit_test(test_load_fills_algorithm_table),
        cmocka_unit_test(test_algorithm_override_precedence),
        cmocka_unit_test(test_validate),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
