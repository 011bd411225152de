/*
 * test_config — kb_config: built-in defaults, the shipped topology.yaml and ccl.yaml, error
 * messages with FILE:LINE:COLUMN for bad YAML, --set overrides, algorithm > defaults
 * precedence and the cross-field validation. Temporary YAML files are created with mkstemp in
 * /tmp and removed by each test. Tests that need the source tree read KBCL_SOURCE_DIR (set by
 * CTest) and are skipped without it.
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

#include "kb_config.h"

/* Writes text to a new temp file; path receives its name. */
static void write_tmp(const char *text, char path[64])
{
    int fd;
    size_t len = strlen(text);

    snprintf(path, 64, "/tmp/kbcl_test_config_XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
}

/* Loads text as a topology (ccl = 0) or ccl (ccl = 1) file into cfg; eb gets the message. */
static int load_text(kb_config *cfg, int ccl, const char *text, char path[64], kb_errbuf *eb)
{
    int rc;

    write_tmp(text, path);
    rc = ccl ? kb_config_load_ccl(cfg, path, eb) : kb_config_load_topology(cfg, path, eb);
    unlink(path);
    return rc;
}

/* Asserts that a load of text fails with KB_ERR_CONFIG and a message "PATH:loc..." + part. */
static void expect_load_error(int ccl, const char *text, const char *loc, const char *part)
{
    kb_config cfg, before;
    kb_errbuf eb = {{0}};
    char path[64], head[128];

    kb_config_defaults(&cfg);
    before = cfg;
    assert_int_equal(load_text(&cfg, ccl, text, path, &eb), KB_ERR_CONFIG);
    snprintf(head, sizeof head, "%s:%s", path, loc);
    if (strncmp(eb.msg, head, strlen(head)) != 0 || !strstr(eb.msg, part))
        fail_msg("message '%s' lacks '%s' or '%s'", eb.msg, head, part);
    /* A failed load changes nothing. */
    assert_memory_equal(&cfg, &before, sizeof cfg);
}

static const char *source_path(const char *rel, char *buf, size_t cap)
{
    const char *dir = getenv("KBCL_SOURCE_DIR");

    if (!dir)
        return NULL;
    snprintf(buf, cap, "%s/%s", dir, rel);
    return buf;
}

static void test_defaults(void **state)
{
    kb_config cfg;
    kb_errbuf eb = {{0}};

    (void)state;
    kb_config_defaults(&cfg);
    assert_int_equal(cfg.topo.sips_count, 2);
    assert_string_equal(cfg.topo.sips_topology, "ring_1d");
    assert_true(cfg.topo.switch_overhead_ns == 5.0);
    assert_true(cfg.topo.inter_sip.bandwidth_gbps == 100.0);
    assert_true(cfg.topo.inter_sip.latency_ns == 500.0);
    assert_true(cfg.topo.pcie.bandwidth_gbps == 64.0 && cfg.topo.pcie.latency_ns == 1000.0);
    assert_true(cfg.topo.pcie_ep_overhead_ns == 100.0 && cfg.topo.host_overhead_ns == 1000.0);
    assert_true(cfg.topo.io_cpu_overhead_ns == 200.0);
    assert_int_equal(cfg.topo.cube_mesh_width, 4);
    assert_int_equal(cfg.topo.cube_mesh_height, 4);
    assert_true(cfg.topo.ucie.bandwidth_gbps == 256.0 && cfg.topo.ucie.latency_ns == 20.0);
    assert_true(cfg.topo.m_cpu_overhead_ns == 50.0);
    assert_true(cfg.topo.noc.bandwidth_gbps == 512.0 && cfg.topo.noc.latency_ns == 5.0);
    assert_int_equal(cfg.topo.sram_size_bytes, 33554432u);
    assert_true(cfg.topo.sram.bandwidth_gbps == 1024.0 && cfg.topo.sram.latency_ns == 10.0);
    assert_int_equal(cfg.topo.hbm_size_bytes, UINT64_C(51539607552));
    assert_true(cfg.topo.hbm.bandwidth_gbps == 256.0 && cfg.topo.hbm.latency_ns == 100.0);
    assert_string_equal(cfg.topo.pe_layout, "corners");
    assert_int_equal(cfg.topo.corners, 4);
    assert_int_equal(cfg.topo.pe_per_corner, 2);
    assert_true(cfg.topo.pe_cpu_overhead_ns == 2.0);
    assert_true(cfg.topo.dma_setup_ns == 20.0 && cfg.topo.dma_bandwidth_gbps == 128.0);
    assert_int_equal(cfg.topo.dma_channels, 4);
    assert_true(cfg.topo.math_fixed_ns == 4.0 && cfg.topo.math_lanes_per_ns == 64.0);
    assert_true(cfg.topo.gemm_fixed_ns == 16.0 && cfg.topo.gemm_flops_per_ns == 4096.0);
    assert_int_equal(cfg.topo.sched_tile_m, 128);
    assert_int_equal(cfg.topo.sched_tile_n, 128);
    assert_int_equal(cfg.topo.sched_tile_k, 128);
    assert_int_equal(cfg.topo.tcm_size_bytes, 16777216u);
    assert_int_equal(cfg.topo.tcm_scheduler_reserved_bytes, 4194304u);
    assert_true(cfg.topo.tcm.bandwidth_gbps == 1024.0 && cfg.topo.tcm.latency_ns == 2.0);
    assert_int_equal(cfg.topo.scratch_size_bytes, 8388608u);
    assert_int_equal(cfg.topo.ipcq_area_bytes, 1048576u);
    assert_true(cfg.topo.ipcq_overhead_ns == 10.0 && cfg.topo.ipcq_credit_latency_ns == 20.0);
    assert_int_equal(kb_topo_pes_per_cube(&cfg.topo), 8);
    assert_int_equal(kb_topo_cubes_per_sip(&cfg.topo), 16);
    assert_int_equal(kb_topo_total_pes(&cfg.topo), 256);

    assert_string_equal(cfg.ccl.defaults.algorithm, "ring_allreduce_tcm");
    assert_string_equal(cfg.ccl.defaults.buffer_kind, "tcm");
    assert_int_equal(cfg.ccl.defaults.backpressure, 1);
    assert_int_equal(cfg.ccl.defaults.n_slots, 4);
    assert_int_equal(cfg.ccl.defaults.slot_size, 4096);
    assert_int_equal(cfg.ccl.defaults.vc_chunk_size, 256);
    assert_int_equal(cfg.ccl.defaults.ipcq_credit_size_bytes, 16);
    assert_int_equal(cfg.ccl.defaults.world_size, 0);
    assert_int_equal(cfg.ccl.defaults.n_elem, 0);
    assert_int_equal(cfg.ccl.nalgos, 0);
    assert_string_equal(cfg.topo_path, "");
    assert_null(kb_config_find_algo(&cfg, "ring_allreduce_tcm"));
    assert_int_equal(kb_config_validate(&cfg, &eb), 0);
    kb_config_fini(&cfg);
    kb_config_fini(NULL);
}

static void test_shipped_topology_equals_defaults(void **state)
{
    kb_config dflt, cfg;
    kb_errbuf eb = {{0}};
    char path[1024];

    (void)state;
    if (!source_path("configs/topology.yaml", path, sizeof path))
        skip();
    kb_config_defaults(&dflt);
    /*
     * Load over an all-zero struct: every field must come from the file (no default is 0),
     * and each must equal the built-in default.
     */
    memset(&cfg, 0, sizeof cfg);
    if (kb_config_load_topology(&cfg, path, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_memory_equal(&cfg.topo, &dflt.topo, sizeof cfg.topo);
    assert_string_equal(cfg.topo_path, path);
}

static void check_algo(const kb_config *cfg, const char *name, const char *module,
                       const char *topology, const char *mapper, const char *validator,
                       const char *buffer_kind, int world_size, int64_t n_elem)
{
    const kb_ccl_algo *a = kb_config_find_algo(cfg, name);
    kb_ccl_params p;

    if (!a)
        fail_msg("algorithm %s missing", name);
    assert_string_equal(a->name, name);
    assert_string_equal(a->module, module);
    assert_string_equal(a->topology, topology);
    assert_string_equal(a->mapper, mapper);
    assert_string_equal(a->validator, validator);
    assert_int_equal(a->root_cube, -1);
    assert_true(a->line > 0);
    p = kb_config_algo_params(cfg, a);
    assert_string_equal(p.algorithm, name);
    assert_string_equal(p.buffer_kind, buffer_kind);
    assert_int_equal(p.world_size, world_size);
    assert_int_equal(p.n_elem, n_elem);
    assert_int_equal(p.n_slots, 4);
    assert_int_equal(p.backpressure, 1);
}

static void test_shipped_ccl(void **state)
{
    kb_config dflt, cfg;
    kb_errbuf eb = {{0}};
    char path[1024];

    (void)state;
    if (!source_path("configs/ccl.yaml", path, sizeof path))
        skip();
    kb_config_defaults(&dflt);
    kb_config_defaults(&cfg);
    if (kb_config_load_ccl(&cfg, path, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_memory_equal(&cfg.ccl.defaults, &dflt.ccl.defaults, sizeof cfg.ccl.defaults);
    assert_int_equal(cfg.ccl.nalgos, 9);
    check_algo(&cfg, "ring_allreduce_tcm", "ring_allreduce", "ring_1d", "all_pes",
               "single_shard_per_rank", "tcm", 256, 8);
    check_algo(&cfg, "ring_allreduce_hbm", "ring_allreduce", "ring_1d", "all_pes",
               "single_shard_per_rank", "hbm", 256, 8);
    check_algo(&cfg, "ring_allreduce_sram", "ring_allreduce", "ring_1d", "all_pes",
               "single_shard_per_rank", "sram", 256, 8);
    check_algo(&cfg, "mesh_allreduce_4", "mesh_allreduce", "mesh_2d", "all_pes",
               "single_shard_per_rank", "tcm", 4, 0);
    check_algo(&cfg, "tree_allreduce_7", "tree_allreduce", "tree_binary", "all_pes",
               "single_shard_per_rank", "tcm", 7, 0);
    check_algo(&cfg, "hierarchical_allreduce", "hierarchical_allreduce", "hierarchical_3level",
               "all_pes", "multi_pe_sip_local", "tcm", 256, 0);
    check_algo(&cfg, "hierarchical_allreduce_sip", "hierarchical_allreduce",
               "hierarchical_3level", "all_pes", "multi_pe_sip_local", "tcm", 0, 0);
    check_algo(&cfg, "ring_rsag_allreduce", "ring_rsag_allreduce", "ring_1d", "all_pes",
               "single_shard_per_rank", "tcm", 256, 256);
    check_algo(&cfg, "intercube_allreduce", "intercube_allreduce", "none", "pe0_all_cubes",
               "multi_pe_sip_local", "tcm", 0, 0);
    if (kb_config_validate(&cfg, &eb) != 0)
        fail_msg("%s", eb.msg);
}

typedef struct doc_ctx {
    const char *text;
    int nkeys, missing;
    char first_missing[128];
} doc_ctx;

static void doc_key(const char *path, const char *type, const char *dflt, const char *doc,
                    void *ud)
{
    doc_ctx *d = ud;

    assert_non_null(type);
    assert_non_null(dflt);
    assert_true(doc && doc[0]);
    d->nkeys++;
    if (!strstr(d->text, path) && d->missing++ == 0)
        snprintf(d->first_missing, sizeof d->first_missing, "%s", path);
}

static void test_docs_cover_every_key(void **state)
{
    char path[1024];
    doc_ctx d = {0};
    FILE *f;
    char *text;
    long len;

    (void)state;
    if (!source_path("docs/config-reference.md", path, sizeof path))
        skip();
    f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    text = calloc(1, (size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    d.text = text;
    kb_config_foreach_key(doc_key, &d);
    free(text);
    /* 45 topology keys + 9 ccl.defaults + 5 entry-only + 8 entry overrides. */
    assert_int_equal(d.nkeys, 67);
    if (d.missing)
        fail_msg("%d keys missing from docs/config-reference.md, first: %s", d.missing,
                 d.first_missing);
}

typedef struct order_ctx {
    int n;
    char first[64], last[64], algo_module_type[32], algo_nslots_dflt[64];
} order_ctx;

static void order_key(const char *path, const char *type, const char *dflt, const char *doc,
                      void *ud)
{
    order_ctx *o = ud;

    (void)doc;
    if (o->n++ == 0)
        snprintf(o->first, sizeof o->first, "%s", path);
    snprintf(o->last, sizeof o->last, "%s", path);
    if (strcmp(path, "ccl.algorithms.<name>.module") == 0)
        snprintf(o->algo_module_type, sizeof o->algo_module_type, "%s", type);
    if (strcmp(path, "ccl.algorithms.<name>.n_slots") == 0)
        snprintf(o->algo_nslots_dflt, sizeof o->algo_nslots_dflt, "%s", dflt);
}

static void test_foreach_key_order(void **state)
{
    order_ctx o = {0};

    (void)state;
    kb_config_foreach_key(order_key, &o);
    kb_config_foreach_key(NULL, NULL);
    assert_int_equal(o.n, 67);
    assert_string_equal(o.first, "system.sips.count");
    assert_string_equal(o.last, "ccl.algorithms.<name>.n_elem");
    assert_string_equal(o.algo_module_type, "string");
    assert_string_equal(o.algo_nslots_dflt, "inherits ccl.defaults.n_slots");
}

static void test_partial_file_keeps_other_fields(void **state)
{
    kb_config cfg;
    kb_errbuf eb = {{0}};
    char path[64];

    (void)state;
    kb_config_defaults(&cfg);
    assert_int_equal(load_text(&cfg, 0,
                               "# a comment\n"
                               "system:\n"
                               "  sips: {count: 4, topology: torus_2d}\n"
                               "pe:\n"
                               "  dma:\n"
                               "    bandwidth_gbps: 200\n"
                               "    setup_ns: 12.5\n"
                               "  tcm: {size_bytes: 0x2000000}\n"
                               "ccl_unused_section_is_not_here: ~\n",
                               path, &eb),
                     KB_ERR_CONFIG);
    /* The unknown top-level key above made the whole load fail: nothing changed. */
    assert_int_equal(cfg.topo.sips_count, 2);
    assert_non_null(strstr(eb.msg, ":9:1: unknown key 'ccl_unused_section_is_not_here' at the "
                                   "top level (known: system, host, sip, cube, pe)"));

    assert_int_equal(load_text(&cfg, 0,
                               "system:\n"
                               "  sips: {count: 4, topology: torus_2d}\n"
                               "pe:\n"
                               "  dma:\n"
                               "    bandwidth_gbps: 200\n"
                               "    setup_ns: 12.5\n"
                               "  tcm: {size_bytes: 0x2000000}\n"
                               "host:\n",
                               path, &eb),
                     0);
    assert_int_equal(cfg.topo.sips_count, 4);
    assert_string_equal(cfg.topo.sips_topology, "torus_2d");
    assert_true(cfg.topo.dma_bandwidth_gbps == 200.0);
    assert_true(cfg.topo.dma_setup_ns == 12.5);
    assert_int_equal(cfg.topo.tcm_size_bytes, 0x2000000u);
    /* Untouched fields keep their values. */
    assert_int_equal(cfg.topo.dma_channels, 4);
    assert_int_equal(cfg.topo.cube_mesh_width, 4);
    assert_string_equal(cfg.topo_path, path);
    assert_int_equal(kb_topo_total_pes(&cfg.topo), 512);
}

static void test_unknown_key(void **state)
{
    (void)state;
    expect_load_error(0,
                      "cube:\n"
                      "  sram:\n"
                      "    size_bytes: 5\n"
                      "  foo: 1\n",
                      "4:3: ",
                      "unknown key 'foo' in section 'cube' (known: m_cpu, noc, sram, hbm, "
                      "pe_layout, corners, pe_per_corner)");
    expect_load_error(0, "cube:\n  sram:\n    sise_bytes: 5\n", "3:5: ",
                      "unknown key 'sise_bytes' in section 'cube.sram' (known: size_bytes, "
                      "bandwidth_gbps, latency_ns)");
    expect_load_error(1, "defaults:\n  n_slot: 5\n", "2:3: ",
                      "unknown key 'n_slot' in section 'ccl.defaults'");
    /* `algorithm` belongs to defaults only. */
    expect_load_error(1, "algorithms:\n  a:\n    module: m\n    algorithm: b\n", "4:5: ",
                      "unknown key 'algorithm' in section 'ccl.algorithms.a' (known: module, "
                      "topology, mapper, validator, root_cube, buffer_kind, backpressure, "
                      "n_slots, slot_size, vc_chunk_size, ipcq_credit_size_bytes, world_size, "
                      "n_elem)");
    expect_load_error(1, "default:\n  n_slots: 5\n", "1:1: ",
                      "unknown key 'default' at the top level (known: defaults, algorithms)");
}

static void test_wrong_types(void **state)
{
    (void)state;
    expect_load_error(0, "cube:\n  sram:\n    size_bytes: abc\n", "3:17: ",
                      "expected an integer for cube.sram.size_bytes, got 'abc'");
    expect_load_error(0, "cube:\n  sram:\n    size_bytes: \"5\"\n", "3:17: ",
                      "expected an integer for cube.sram.size_bytes, got the quoted string '5'");
    expect_load_error(0, "cube:\n  corners: 1.5\n", "2:12: ",
                      "expected an integer for cube.corners, got '1.5'");
    expect_load_error(0, "host:\n  overhead_ns: fast\n", "2:16: ",
                      "expected a number for host.overhead_ns, got 'fast'");
    expect_load_error(0, "host:\n  overhead_ns: '7'\n", "2:16: ",
                      "expected a number for host.overhead_ns, got the quoted string '7'");
    expect_load_error(1, "defaults:\n  backpressure: 1\n", "2:17: ",
                      "expected a boolean (true or false) for ccl.defaults.backpressure, got '1'");
    expect_load_error(0, "system:\n  sips:\n    topology: ring_3d\n", "3:15: ",
                      "invalid value 'ring_3d' for system.sips.topology (allowed: ring_1d, "
                      "torus_2d, mesh_2d, mesh_2d_no_wrap)");
    expect_load_error(0, "system:\n  sips:\n    count:\n", "3:11: ",
                      "missing value for system.sips.count");
    /* A mapping where a scalar belongs and vice versa; a sequence. */
    expect_load_error(0, "cube:\n  corners:\n    a: 1\n", "3:5: ",
                      "expected a scalar value for cube.corners, got a mapping");
    expect_load_error(0, "cube:\n  sram: 5\n", "2:9: ",
                      "expected a mapping for section 'cube.sram', got a scalar");
    expect_load_error(0, "cube: [1, 2]\n", "1:7: ",
                      "expected a mapping for section 'cube', got a sequence");
    expect_load_error(0, "- 1\n- 2\n", "1:1: ",
                      "expected a mapping at the top level, got a sequence");
    expect_load_error(1, "algorithms:\n  a: 5\n", "2:6: ",
                      "expected a mapping for algorithm 'a', got a scalar");
    expect_load_error(1, "algorithms:\n  a.b:\n    module: m\n", "2:3: ",
                      "invalid algorithm name 'a.b'");
}

static void test_out_of_range_and_duplicates(void **state)
{
    (void)state;
    expect_load_error(0, "cube:\n  corners: 0\n", "2:12: ",
                      "cube.corners = 0 is out of range [1, 16]");
    expect_load_error(0, "system:\n  sips:\n    count: 257\n", "3:12: ",
                      "system.sips.count = 257 is out of range [1, 256]");
    expect_load_error(0, "pe:\n  tcm:\n    size_bytes: 134217729\n", "3:17: ",
                      "pe.tcm.size_bytes = 134217729 is out of range [1, 134217728]");
    expect_load_error(0, "cube:\n  noc:\n    bandwidth_gbps: 0\n", "3:21: ",
                      "cube.noc.bandwidth_gbps = 0 is out of range (must be > 0)");
    expect_load_error(0, "cube:\n  noc:\n    latency_ns: -1\n", "3:17: ",
                      "cube.noc.latency_ns = -1 is out of range (must be >= 0)");
    expect_load_error(1, "defaults:\n  slot_size: 8\n", "2:14: ",
                      "ccl.defaults.slot_size = 8 is out of range [16, 134217728]");
    expect_load_error(0, "cube:\n  corners: 2\n  corners: 3\n", "3:3: ",
                      "duplicate key 'corners' in section 'cube' (first at line 2)");
    expect_load_error(1, "algorithms:\n  a:\n    module: m\n  a:\n    module: n\n", "4:3: ",
                      "duplicate key 'a' in section 'ccl.algorithms' (first at line 2)");
}

static void test_yaml_syntax_errors(void **state)
{
    (void)state;
    /* Broken indentation: the third key is indented less than its siblings. */
    expect_load_error(0,
                      "cube:\n"
                      "  sram:\n"
                      "    size_bytes: 5\n"
                      "   latency_ns: 3\n",
                      "4:4: ", "YAML syntax error: did not find expected key");
    expect_load_error(0, "cube:\n  sram: {size_bytes: 5\n", "3:1: ", "YAML syntax error: ");
    expect_load_error(0, "cube:\n\tcorners: 4\n", "2:1: ", "YAML syntax error: ");
    expect_load_error(0, "cube: {corners: 4}\n---\ncube: {corners: 2}\n", "2:1: ",
                      "a second YAML document is not supported");
}

static void test_missing_file_and_empty_file(void **state)
{
    kb_config cfg, before;
    kb_errbuf eb = {{0}};
    char path[64];

    (void)state;
    kb_config_defaults(&cfg);
    before = cfg;
    assert_int_equal(kb_config_load_topology(&cfg, "/nonexistent/kbcl/topo.yaml", &eb),
                     KB_ERR_IO);
    assert_string_equal(eb.msg, "/nonexistent/kbcl/topo.yaml: cannot open: No such file or "
                                "directory");
    assert_int_equal(kb_config_load_ccl(&cfg, "/nonexistent/ccl.yaml", NULL), KB_ERR_IO);
    assert_int_equal(kb_config_load_ccl(&cfg, "/tmp", &eb), KB_ERR_IO);
    assert_int_equal(kb_config_load_topology(NULL, "x", &eb), KB_ERR_INVAL);
    assert_memory_equal(&cfg, &before, sizeof cfg);
    /* An empty file (or only comments) is a valid file that changes nothing. */
    assert_int_equal(load_text(&cfg, 0, "# nothing\n", path, &eb), 0);
    assert_int_equal(load_text(&cfg, 1, "", path, &eb), 0);
    assert_memory_equal(&cfg.topo, &before.topo, sizeof cfg.topo);
    assert_memory_equal(&cfg.ccl, &before.ccl, sizeof cfg.ccl);
}

static void expect_set_error(kb_config *cfg, const char *assignment, const char *msg)
{
    kb_config before = *cfg;
    kb_errbuf eb = {{0}};

    assert_int_equal(kb_config_set(cfg, assignment, &eb), KB_ERR_CONFIG);
    assert_string_equal(eb.msg, msg);
    assert_memory_equal(cfg, &before, sizeof before);
}

static void test_set(void **state)
{
    kb_config cfg;
    kb_errbuf eb = {{0}};
    const kb_ccl_algo *a;

    (void)state;
    kb_config_defaults(&cfg);
    assert_int_equal(kb_config_set(&cfg, "system.sips.count=4", &eb), 0);
    assert_int_equal(cfg.topo.sips_count, 4);
    assert_int_equal(kb_config_set(&cfg, "cube.noc.latency_ns = 7.5", &eb), 0);
    assert_true(cfg.topo.noc.latency_ns == 7.5);
    assert_int_equal(kb_config_set(&cfg, "cube.noc.bandwidth_gbps=300", &eb), 0);
    assert_true(cfg.topo.noc.bandwidth_gbps == 300.0);
    assert_int_equal(kb_config_set(&cfg, "system.sips.topology=torus_2d", &eb), 0);
    assert_string_equal(cfg.topo.sips_topology, "torus_2d");
    assert_int_equal(kb_config_set(&cfg, "cube.hbm.size_bytes=68719476736", &eb), 0);
    assert_int_equal(cfg.topo.hbm_size_bytes, UINT64_C(68719476736));
    assert_int_equal(kb_config_set(&cfg, "ccl.defaults.backpressure=false", &eb), 0);
    assert_int_equal(cfg.ccl.defaults.backpressure, 0);
    assert_int_equal(kb_config_set(&cfg, "ccl.defaults.n_elem=1024", &eb), 0);
    assert_int_equal(cfg.ccl.defaults.n_elem, 1024);
    assert_int_equal(kb_config_set(&cfg, "ccl.defaults.algorithm='mine'", &eb), 0);
    assert_string_equal(cfg.ccl.defaults.algorithm, "mine");

    /* A new algorithm entry is created with every override unset. */
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.mine.module=ring_allreduce", &eb), 0);
    assert_int_equal(cfg.ccl.nalgos, 1);
    a = kb_config_find_algo(&cfg, "mine");
    assert_non_null(a);
    assert_string_equal(a->module, "ring_allreduce");
    assert_int_equal(a->root_cube, -1);
    assert_int_equal(a->p.backpressure, -1);
    assert_int_equal(a->p.n_slots, 0);
    assert_string_equal(a->p.buffer_kind, "");
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.mine.root_cube=3", &eb), 0);
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.mine.backpressure=true", &eb), 0);
    assert_int_equal(cfg.ccl.nalgos, 1);
    assert_int_equal(a->root_cube, 3);
    assert_int_equal(a->p.backpressure, 1);
    assert_int_equal(kb_config_validate(&cfg, &eb), 0);

    expect_set_error(&cfg, "system.sips.count=abc",
                     "--set system.sips.count=abc: expected an integer for system.sips.count, "
                     "got 'abc'");
    expect_set_error(&cfg, "system.sips.count=0",
                     "--set system.sips.count=0: system.sips.count = 0 is out of range [1, 256]");
    expect_set_error(&cfg, "pe.tcm.size_bytes=99999999999999999999",
                     "--set pe.tcm.size_bytes=99999999999999999999: pe.tcm.size_bytes = "
                     "99999999999999999999 is out of range [1, 134217728]");
    expect_set_error(&cfg, "pe.dma.setup_ns=nan",
                     "--set pe.dma.setup_ns=nan: expected a number for pe.dma.setup_ns, got 'nan'");
    expect_set_error(&cfg, "system.sips.count=",
                     "--set system.sips.count=: missing value for system.sips.count");
    expect_set_error(&cfg, "system.sips.count=\"4\"",
                     "--set system.sips.count=\"4\": expected an integer for system.sips.count, "
                     "got the quoted string '4'");
    expect_set_error(&cfg, "ccl.defaults.backpressure=maybe",
                     "--set ccl.defaults.backpressure=maybe: expected a boolean (true or false) "
                     "for ccl.defaults.backpressure, got 'maybe'");
    expect_set_error(&cfg, "cube.sram.sise=5",
                     "--set cube.sram.sise=5: unknown key 'cube.sram.sise' (nearest section: "
                     "'cube.sram')");
    expect_set_error(&cfg, "bogus.key=5",
                     "--set bogus.key=5: unknown key 'bogus.key' (top-level sections: system, "
                     "host, sip, cube, pe, ccl)");
    expect_set_error(&cfg, "cube.sram=5", "--set cube.sram=5: 'cube.sram' is a section, not a key");
    expect_set_error(&cfg, "system.sips.count",
                     "--set system.sips.count: expected KEY=VALUE (for example "
                     "system.sips.count=4)");
    expect_set_error(&cfg, "=4", "--set =4: missing key before '='");
    expect_set_error(&cfg, "ccl.defaults.nslots=4",
                     "--set ccl.defaults.nslots=4: unknown key 'ccl.defaults.nslots' (nearest "
                     "section: 'ccl.defaults')");
    expect_set_error(&cfg, "ccl.foo=4",
                     "--set ccl.foo=4: unknown key 'ccl.foo' (nearest section: 'ccl', which "
                     "has: defaults, algorithms)");
    expect_set_error(&cfg, "ccl.algorithms.mine=4",
                     "--set ccl.algorithms.mine=4: expected ccl.algorithms.<name>.<key>, got "
                     "'ccl.algorithms.mine'");
    expect_set_error(&cfg, "ccl.algorithms.b@d.module=x",
                     "--set ccl.algorithms.b@d.module=x: invalid algorithm name 'b@d' (use 1-63 "
                     "letters, digits, '_' or '-')");
    /* Bad key or value for a new entry: no entry is left behind. */
    expect_set_error(&cfg, "ccl.algorithms.fresh.bogus=1",
                     "--set ccl.algorithms.fresh.bogus=1: unknown key "
                     "'ccl.algorithms.fresh.bogus' (nearest section: 'ccl.algorithms.fresh')");
    expect_set_error(&cfg, "ccl.algorithms.fresh.n_slots=0",
                     "--set ccl.algorithms.fresh.n_slots=0: ccl.algorithms.fresh.n_slots = 0 is "
                     "out of range [1, 4096]");
    expect_set_error(&cfg, "ccl.algorithms.fresh.algorithm=x",
                     "--set ccl.algorithms.fresh.algorithm=x: unknown key "
                     "'ccl.algorithms.fresh.algorithm' (nearest section: "
                     "'ccl.algorithms.fresh')");
    expect_set_error(&cfg, "ccl.algorithms.fresh.topology=ring_9d",
                     "--set ccl.algorithms.fresh.topology=ring_9d: invalid value 'ring_9d' for "
                     "ccl.algorithms.fresh.topology (allowed: ring_1d, ring_1d_unidir, mesh_2d, "
                     "torus_2d, mesh_2d_no_wrap, tree_binary, hierarchical_3level, none)");
    assert_int_equal(cfg.ccl.nalgos, 1);
    assert_null(kb_config_find_algo(&cfg, "fresh"));
    assert_int_equal(kb_config_set(&cfg, NULL, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_config_set(&cfg, "x=1", NULL), KB_ERR_CONFIG);
}

static void test_set_fills_algorithm_table(void **state)
{
    kb_config cfg;
    kb_errbuf eb = {{0}};
    char assign[128];

    (void)state;
    kb_config_defaults(&cfg);
    for (int i = 0; i < KB_CFG_MAX_ALGOS; i++) {
        snprintf(assign, sizeof assign, "ccl.algorithms.a%d.module=m", i);
        assert_int_equal(kb_config_set(&cfg, assign, &eb), 0);
    }
    assert_int_equal(cfg.ccl.nalgos, KB_CFG_MAX_ALGOS);
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.a5.n_slots=2", &eb), 0);
    expect_set_error(&cfg, "ccl.algorithms.one_more.module=m",
                     "--set ccl.algorithms.one_more.module=m: cannot add algorithm 'one_more': "
                     "at most 32 algorithms");
}

static void test_algorithm_override_precedence(void **state)
{
    kb_config cfg;
    kb_errbuf eb = {{0}};
    char path[64];
    const kb_ccl_algo *a, *b;
    kb_ccl_params p;

    (void)state;
    kb_config_defaults(&cfg);
    if (load_text(&cfg, 1,
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
    a = kb_config_find_algo(&cfg, "a");
    b = kb_config_find_algo(&cfg, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->line, 7);
    assert_int_equal(b->line, 14);
    assert_int_equal(a->root_cube, 5);

    p = kb_config_algo_params(&cfg, a);
    assert_string_equal(p.algorithm, "a");
    assert_string_equal(p.buffer_kind, "hbm");
    assert_int_equal(p.backpressure, 0);
    assert_int_equal(p.n_slots, 2);
    assert_int_equal(p.slot_size, 64);
    assert_int_equal(p.vc_chunk_size, 256);   /* inherited */
    assert_int_equal(p.world_size, 2);        /* defaults override */
    p = kb_config_algo_params(&cfg, b);
    assert_string_equal(p.buffer_kind, "sram");
    assert_int_equal(p.backpressure, 1);
    assert_int_equal(p.n_slots, 6);
    assert_int_equal(p.slot_size, 4096);
    assert_int_equal(p.world_size, 7);        /* algorithm override beats defaults */
    p = kb_config_algo_params(&cfg, NULL);
    assert_string_equal(p.algorithm, "a");
    assert_int_equal(p.n_slots, 6);

    /* --set on defaults reaches entries without an override only. */
    assert_int_equal(kb_config_set(&cfg, "ccl.defaults.n_slots=9", &eb), 0);
    assert_int_equal(kb_config_algo_params(&cfg, a).n_slots, 2);
    assert_int_equal(kb_config_algo_params(&cfg, b).n_slots, 9);
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.b.n_slots=3", &eb), 0);
    assert_int_equal(kb_config_algo_params(&cfg, b).n_slots, 3);

    /* A second file merges into existing entries and adds new ones. */
    if (load_text(&cfg, 1, "algorithms:\n  b:\n    n_elem: 16\n  c:\n    module: x\n", path,
                  &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_int_equal(cfg.ccl.nalgos, 3);
    b = kb_config_find_algo(&cfg, "b");
    assert_string_equal(b->module, "tree_allreduce");
    assert_int_equal(b->p.n_elem, 16);
    assert_int_equal(b->p.n_slots, 3);
    assert_int_equal(b->line, 2);
    assert_int_equal(kb_config_validate(&cfg, &eb), 0);
}

static void expect_invalid(const kb_config *cfg, const char *part)
{
    kb_errbuf eb = {{0}};

    assert_int_equal(kb_config_validate(cfg, &eb), KB_ERR_CONFIG);
    if (!strstr(eb.msg, part))
        fail_msg("message '%s' lacks '%s'", eb.msg, part);
}

static void test_validate(void **state)
{
    kb_config base, cfg;
    kb_errbuf eb = {{0}};

    (void)state;
    kb_config_defaults(&base);
    assert_int_equal(kb_config_validate(NULL, &eb), KB_ERR_INVAL);

    cfg = base;
    assert_int_equal(kb_config_set(&cfg, "sip.cube_mesh.width=8", &eb), 0);
    assert_int_equal(kb_config_set(&cfg, "sip.cube_mesh.height=8", &eb), 0);
    expect_invalid(&cfg, "sip.cube_mesh 8x8 = 64 cubes, must be 1..32");

    cfg = base;
    assert_int_equal(kb_config_set(&cfg, "cube.pe_per_corner=5", &eb), 0);
    expect_invalid(&cfg, "cube.corners * cube.pe_per_corner = 4 * 5 = 20 PEs per cube, "
                         "must be 1..16");

    cfg = base;
    assert_int_equal(kb_config_set(&cfg, "pe.tcm.scheduler_reserved_bytes=16777216", &eb), 0);
    expect_invalid(&cfg, "pe.tcm.scheduler_reserved_bytes = 16777216 must be less than "
                         "pe.tcm.size_bytes = 16777216");

    cfg = base;
    cfg.topo.sips_count = 300;
    expect_invalid(&cfg, "system.sips.count = 300 must be 1..256");

    cfg = base;
    snprintf(cfg.topo.sips_topology, sizeof cfg.topo.sips_topology, "hypercube");
    expect_invalid(&cfg, "system.sips.topology 'hypercube' is not a SIP topology");

    cfg = base;
    cfg.topo.hbm_size_bytes = (UINT64_C(1) << 37) + 1;
    expect_invalid(&cfg, "cube.hbm.size_bytes = 137438953473 does not fit");

    cfg = base;
    cfg.topo.scratch_size_bytes = (UINT64_C(1) << 27) + 1;
    expect_invalid(&cfg, "pe.scratch.size_bytes = 134217729 does not fit");

    cfg = base;
    cfg.topo.ucie.bandwidth_gbps = 0.0;
    expect_invalid(&cfg, "sip.ucie.bandwidth_gbps = 0 must be > 0");

    cfg = base;
    cfg.ccl.defaults.n_slots = 0;
    expect_invalid(&cfg, "ccl.defaults: n_slots = 0 must be >= 1");

    cfg = base;
    cfg.ccl.defaults.slot_size = 8;
    expect_invalid(&cfg, "ccl.defaults: slot_size = 8 must be >= 16 bytes");

    cfg = base;
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.x.n_slots=2", &eb), 0);
    assert_int_equal(kb_config_set(&cfg, "ccl.defaults.algorithm=x", &eb), 0);
    expect_invalid(&cfg, "ccl.algorithms.x has no module");
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.x.module=ring_allreduce", &eb), 0);
    assert_int_equal(kb_config_validate(&cfg, &eb), 0);
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.x.root_cube=16", &eb), 0);
    expect_invalid(&cfg, "ccl.algorithms.x: root_cube = 16 but a SIP has 16 cubes");
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.x.root_cube=15", &eb), 0);
    assert_int_equal(kb_config_set(&cfg, "ccl.algorithms.x.world_size=257", &eb), 0);
    expect_invalid(&cfg, "x: world_size = 257 exceeds the machine's 256 PEs");
    assert_int_equal(kb_config_set(&cfg, "system.sips.count=3", &eb), 0);
    assert_int_equal(kb_config_validate(&cfg, &eb), 0);
    assert_int_equal(kb_config_set(&cfg, "ccl.defaults.algorithm=nope", &eb), 0);
    expect_invalid(&cfg, "ccl.defaults.algorithm 'nope' is not defined under algorithms");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_shipped_topology_equals_defaults),
        cmocka_unit_test(test_shipped_ccl),
        cmocka_unit_test(test_docs_cover_every_key),
        cmocka_unit_test(test_foreach_key_order),
        cmocka_unit_test(test_partial_file_keeps_other_fields),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_out_of_range_and_duplicates),
        cmocka_unit_test(test_yaml_syntax_errors),
        cmocka_unit_test(test_missing_file_and_empty_file),
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_set_fills_algorithm_table),
        cmocka_unit_test(test_algorithm_override_precedence),
        cmocka_unit_test(test_validate),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
