/*
 * test_config — kb_config, the machine's configuration: built-in defaults, the shipped
 * topology.yaml, error messages with FILE:LINE:COLUMN for bad YAML, --set overrides of
 * topology keys (and the refusal of ccl.* keys, which belong to ccl.yaml: test_ccl_config),
 * the key listing against docs/config-reference.md and the cross-field validation. Temporary
 * YAML files are created with mkstemp in /tmp and removed by each test. Tests that need the
 * source tree read KBCL_SOURCE_DIR (set by CTest) and are skipped without it.
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

#include "kb_test_util.h"

/* Number of topology keys (kb_schema.c's topo_keys). */
#define N_TOPO_KEYS 54 /* 45 + pe.gemm.{int8,fp8,mxint8,sparse}_speedup + cube.noc.{topology,width,height}
                        * + system.switch.arbitration + sip.io_cpu.completions */

/* Loads text as a topology file into cfg; eb gets the message. */
static int load_text(kb_config *cfg, const char *text, char path[64], kb_errbuf *eb)
{
    int rc;

    kbt_tmp_file("kbcl_test_config", text, path);
    rc = kb_config_load_topology(cfg, path, eb);
    unlink(path);
    return rc;
}

/* Asserts that a load of text fails with KB_ERR_CONFIG and a message "PATH:loc..." + part. */
static void expect_load_error(const char *text, const char *loc, const char *part)
{
    kb_config cfg, before;
    kb_errbuf eb = {{0}};
    char path[64];

    kb_config_defaults(&cfg);
    before = cfg;
    assert_int_equal(load_text(&cfg, text, path, &eb), KB_ERR_CONFIG);
    kbt_msg_at(eb.msg, path, loc, part);
    /* A failed load changes nothing. */
    assert_memory_equal(&cfg, &before, sizeof cfg);
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
    assert_string_equal(cfg.topo.switch_arbitration, "per_sip");
    assert_string_equal(cfg.topo.io_completions, "per_cube");
    assert_int_equal(kb_topo_switch_per_sip(&cfg.topo), 1);
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
    assert_int_equal(cfg.topo.ipcq_area_bytes, 8388608u);
    assert_true(cfg.topo.ipcq_overhead_ns == 10.0 && cfg.topo.ipcq_credit_latency_ns == 20.0);
    assert_int_equal(kb_topo_pes_per_cube(&cfg.topo), 8);
    assert_int_equal(kb_topo_cubes_per_sip(&cfg.topo), 16);
    assert_int_equal(kb_topo_total_pes(&cfg.topo), 256);

    assert_string_equal(cfg.topo_path, "");
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
    if (!kbt_source_path("configs/topology.yaml", path, sizeof path))
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
    if (kb_config_validate(&cfg, &eb) != 0)
        fail_msg("%s", eb.msg);
}

static void test_docs_cover_every_key(void **state)
{
    char path[1024];
    kbt_doc_keys d = {0};
    char *text;

    (void)state;
    if (!kbt_source_path("docs/config-reference.md", path, sizeof path))
        skip();
    text = kbt_read_file(path);
    d.text = text;
    /* The topology keys; the ccl keys are test_ccl_config's. */
    kb_config_foreach_key(kbt_doc_key, &d);
    free(text);
    assert_int_equal(d.nkeys, N_TOPO_KEYS);
    if (d.missing)
        fail_msg("%d keys missing from docs/config-reference.md, first: %s", d.missing,
                 d.first_missing);
}

typedef struct order_ctx {
    int n, nccl;
    char first[64], last[64], topo_type[96], topo_dflt[64], hbm_type[32], hbm_dflt[64];
} order_ctx;

static void order_key(const char *path, const char *type, const char *dflt, const char *doc,
                      void *ud)
{
    order_ctx *o = ud;

    (void)doc;
    if (o->n++ == 0)
        snprintf(o->first, sizeof o->first, "%s", path);
    snprintf(o->last, sizeof o->last, "%s", path);
    if (strncmp(path, "ccl", 3) == 0)
        o->nccl++;
    if (strcmp(path, "system.sips.topology") == 0) {
        snprintf(o->topo_type, sizeof o->topo_type, "%s", type);
        snprintf(o->topo_dflt, sizeof o->topo_dflt, "%s", dflt);
    }
    if (strcmp(path, "cube.hbm.size_bytes") == 0) {
        snprintf(o->hbm_type, sizeof o->hbm_type, "%s", type);
        snprintf(o->hbm_dflt, sizeof o->hbm_dflt, "%s", dflt);
    }
}

static void test_foreach_key_order(void **state)
{
    order_ctx o = {0};

    (void)state;
    kb_config_foreach_key(order_key, &o);
    kb_config_foreach_key(NULL, NULL);
    assert_int_equal(o.n, N_TOPO_KEYS);
    assert_string_equal(o.first, "system.sips.count");
    assert_string_equal(o.last, "pe.ipcq.credit_latency_ns");
    /* Topology keys only: ccl.yaml's keys are listed by kb_ccl_config_foreach_key. */
    assert_int_equal(o.nccl, 0);
    assert_string_equal(o.topo_type, "enum: ring_1d|torus_2d|mesh_2d|mesh_2d_no_wrap");
    assert_string_equal(o.topo_dflt, "ring_1d");
    assert_string_equal(o.hbm_type, "uint64");
    assert_string_equal(o.hbm_dflt, "51539607552");
}

static void test_partial_file_keeps_other_fields(void **state)
{
    kb_config cfg;
    kb_errbuf eb = {{0}};
    char path[64];

    (void)state;
    kb_config_defaults(&cfg);
    assert_int_equal(load_text(&cfg,
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

    assert_int_equal(load_text(&cfg,
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
    expect_load_error("cube:\n"
                      "  sram:\n"
                      "    size_bytes: 5\n"
                      "  foo: 1\n",
                      "4:3: ",
                      "unknown key 'foo' in section 'cube' (known: m_cpu, noc, sram, hbm, "
                      "pe_layout, corners, pe_per_corner)");
    expect_load_error("cube:\n  sram:\n    sise_bytes: 5\n", "3:5: ",
                      "unknown key 'sise_bytes' in section 'cube.sram' (known: size_bytes, "
                      "bandwidth_gbps, latency_ns)");
    /* ccl.yaml's sections are not topology sections. */
    expect_load_error("defaults:\n  n_slots: 4\n", "1:1: ",
                      "unknown key 'defaults' at the top level (known: system, host, sip, cube, "
                      "pe)");
    expect_load_error("ccl:\n  defaults:\n    n_slots: 4\n", "1:1: ",
                      "unknown key 'ccl' at the top level (known: system, host, sip, cube, pe)");
    /* another file given as a config (a shadow-like line parses as one long key): the
     * message names the place, never the file's bytes */
    expect_load_error("root:$6$salt$hash:19000:0:99999:7:::\n", "1:1: ",
                      "unknown key (not shown: not a key name) at the top level (known: system, "
                      "host, sip, cube, pe)");
    expect_load_error("cube:\n  a b c: 1\n", "2:3: ",
                      "unknown key (not shown: not a key name) in section 'cube'");
}

static void test_wrong_types(void **state)
{
    (void)state;
    expect_load_error("cube:\n  sram:\n    size_bytes: abc\n", "3:17: ",
                      "expected an integer for cube.sram.size_bytes, got 'abc'");
    expect_load_error("cube:\n  sram:\n    size_bytes: \"5\"\n", "3:17: ",
                      "expected an integer for cube.sram.size_bytes, got the quoted string '5'");
    expect_load_error("cube:\n  corners: 1.5\n", "2:12: ",
                      "expected an integer for cube.corners, got '1.5'");
    expect_load_error("host:\n  overhead_ns: fast\n", "2:16: ",
                      "expected a number for host.overhead_ns, got 'fast'");
    expect_load_error("host:\n  overhead_ns: '7'\n", "2:16: ",
                      "expected a number for host.overhead_ns, got the quoted string '7'");
    expect_load_error("system:\n  sips:\n    topology: ring_3d\n", "3:15: ",
                      "invalid value 'ring_3d' for system.sips.topology (allowed: ring_1d, "
                      "torus_2d, mesh_2d, mesh_2d_no_wrap)");
    expect_load_error("system:\n  sips:\n    count:\n", "3:11: ",
                      "missing value for system.sips.count");
    /* A mapping where a scalar belongs and vice versa; a sequence. */
    expect_load_error("cube:\n  corners:\n    a: 1\n", "3:5: ",
                      "expected a scalar value for cube.corners, got a mapping");
    expect_load_error("cube:\n  sram: 5\n", "2:9: ",
                      "expected a mapping for section 'cube.sram', got a scalar");
    expect_load_error("cube: [1, 2]\n", "1:7: ",
                      "expected a mapping for section 'cube', got a sequence");
    expect_load_error("- 1\n- 2\n", "1:1: ",
                      "expected a mapping at the top level, got a sequence");
}

static void test_out_of_range_and_duplicates(void **state)
{
    (void)state;
    expect_load_error("cube:\n  corners: 0\n", "2:12: ",
                      "cube.corners = 0 is out of range [1, 16]");
    expect_load_error("system:\n  sips:\n    count: 257\n", "3:12: ",
                      "system.sips.count = 257 is out of range [1, 256]");
    expect_load_error("pe:\n  tcm:\n    size_bytes: 134217729\n", "3:17: ",
                      "pe.tcm.size_bytes = 134217729 is out of range [1, 134217728]");
    expect_load_error("cube:\n  noc:\n    bandwidth_gbps: 0\n", "3:21: ",
                      "cube.noc.bandwidth_gbps = 0 is out of range [0.001, 1e6]");
    /* below a resource's resolution (1 byte per microsecond): refused, not raised to it */
    expect_load_error("cube:\n  noc:\n    bandwidth_gbps: 1e-300\n", "3:21: ",
                      "cube.noc.bandwidth_gbps = 1e-300 is out of range [0.001, 1e6]");
    expect_load_error("pe:\n  math:\n    lanes_per_ns: 0.0001\n", "3:19: ",
                      "pe.math.lanes_per_ns = 0.0001 is out of range [0.001, 1e9]");
    expect_load_error("cube:\n  noc:\n    latency_ns: -1\n", "3:17: ",
                      "cube.noc.latency_ns = -1 is out of range [0, 1e9]");
    expect_load_error("cube:\n  corners: 2\n  corners: 3\n", "3:3: ",
                      "duplicate key 'corners' in section 'cube' (first at line 2)");
    expect_load_error("system:\n  sips: {count: 2}\nsystem:\n  sips: {count: 3}\n", "3:1: ",
                      "duplicate key 'system' at the top level (first at line 1)");
}

/* A number format's rate (flops_per_ns x its speedup) below a unit's resolution is a
 * validation error naming the key, not a rate raised to 0.001 flops per ns. */
static void test_rate_resolution(void **state)
{
    kb_config cfg;
    kb_errbuf eb = {{0}};
    (void)state;
    kb_config_defaults(&cfg);
    cfg.topo.gemm_int8_speedup = 1e-300;
    assert_int_equal(kb_config_validate(&cfg, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "pe.gemm.int8_speedup = 1e-300 gives a rate of 4.096e-297 flops per "
                        "ns with pe.gemm.flops_per_ns = 4096, below the smallest one a unit "
                        "can have (0.001)");
    kb_config_defaults(&cfg);
    cfg.topo.ucie.bandwidth_gbps = 0.0005;
    assert_int_equal(kb_config_validate(&cfg, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "sip.ucie.bandwidth_gbps = 0.0005 is out of range [0.001, 1e6]");
    cfg.topo.ucie.bandwidth_gbps = 0.001;
    assert_int_equal(kb_config_validate(&cfg, &eb), 0);
    kb_config_fini(&cfg);
}

static void test_yaml_syntax_errors(void **state)
{
    (void)state;
    /* Broken indentation: the third key is indented less than its siblings. */
    expect_load_error("cube:\n"
                      "  sram:\n"
                      "    size_bytes: 5\n"
                      "   latency_ns: 3\n",
                      "4:4: ", "YAML syntax error: did not find expected key");
    expect_load_error("cube:\n  sram: {size_bytes: 5\n", "3:1: ", "YAML syntax error: ");
    expect_load_error("cube:\n\tcorners: 4\n", "2:1: ", "YAML syntax error: ");
    expect_load_error("cube: {corners: 4}\n---\ncube: {corners: 2}\n", "2:1: ",
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
    assert_int_equal(kb_config_load_topology(&cfg, "/nonexistent/topo.yaml", NULL), KB_ERR_IO);
    assert_int_equal(kb_config_load_topology(&cfg, "/tmp", &eb), KB_ERR_IO);
    assert_string_equal(eb.msg, "/tmp: cannot read: Is a directory");
    assert_int_equal(kb_config_load_topology(NULL, "x", &eb), KB_ERR_INVAL);
    assert_int_equal(kb_config_load_topology(&cfg, NULL, &eb), KB_ERR_INVAL);
    assert_memory_equal(&cfg, &before, sizeof cfg);
    /* An empty file (or only comments, or a null document) is a valid file that changes
     * nothing but the path it remembers. */
    assert_int_equal(load_text(&cfg, "# nothing\n", path, &eb), 0);
    assert_string_equal(cfg.topo_path, path);
    assert_int_equal(load_text(&cfg, "", path, &eb), 0);
    assert_int_equal(load_text(&cfg, "~\n", path, &eb), 0);
    assert_memory_equal(&cfg.topo, &before.topo, sizeof cfg.topo);
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
    assert_int_equal(kb_topo_sip_kind(&cfg.topo), KB_SIPTOPO_TORUS_2D);
    assert_int_equal(kb_config_set(&cfg, "system.sips.topology='mesh_2d'", &eb), 0);
    assert_string_equal(cfg.topo.sips_topology, "mesh_2d");
    assert_int_equal(kb_topo_sip_kind(&cfg.topo), KB_SIPTOPO_MESH_2D);
    assert_int_equal(kb_config_set(&cfg, "cube.hbm.size_bytes=68719476736", &eb), 0);
    assert_int_equal(cfg.topo.hbm_size_bytes, UINT64_C(68719476736));
    assert_int_equal(kb_config_set(&cfg, "pe.tcm.size_bytes=0x2000000", &eb), 0);
    assert_int_equal(cfg.topo.tcm_size_bytes, 0x2000000u);
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
    /* floating-point keys state their whole range as integer ones do, whichever side the
     * value is past; an exclusive lower bound is "(" */
    expect_set_error(&cfg, "pe.dma.bandwidth_gbps=2e6",
                     "--set pe.dma.bandwidth_gbps=2e6: pe.dma.bandwidth_gbps = 2e6 is out of "
                     "range [0.001, 1e6]");
    expect_set_error(&cfg, "pe.dma.bandwidth_gbps=0.0009",
                     "--set pe.dma.bandwidth_gbps=0.0009: pe.dma.bandwidth_gbps = 0.0009 is out "
                     "of range [0.001, 1e6]");
    expect_set_error(&cfg, "cube.noc.latency_ns=1000000000.5",
                     "--set cube.noc.latency_ns=1000000000.5: cube.noc.latency_ns = "
                     "1000000000.5 is out of range [0, 1e9]");
    expect_set_error(&cfg, "pe.gemm.int8_speedup=0",
                     "--set pe.gemm.int8_speedup=0: pe.gemm.int8_speedup = 0 is out of range "
                     "(0, 64]");
    expect_set_error(&cfg, "pe.gemm.flops_per_ns=2e12",
                     "--set pe.gemm.flops_per_ns=2e12: pe.gemm.flops_per_ns = 2e12 is out of "
                     "range [0.001, 1e12]");
    expect_set_error(&cfg, "system.sips.count=",
                     "--set system.sips.count=: missing value for system.sips.count");
    expect_set_error(&cfg, "system.sips.count=\"4\"",
                     "--set system.sips.count=\"4\": expected an integer for system.sips.count, "
                     "got the quoted string '4'");
    expect_set_error(&cfg, "system.sips.topology=ring_9d",
                     "--set system.sips.topology=ring_9d: invalid value 'ring_9d' for "
                     "system.sips.topology (allowed: ring_1d, torus_2d, mesh_2d, "
                     "mesh_2d_no_wrap)");
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

    /* ccl.yaml's keys are the collective library's: kb_ccl_config_set applies them. */
    expect_set_error(&cfg, "ccl.defaults.n_slots=4",
                     "--set ccl.defaults.n_slots=4: 'ccl.defaults.n_slots' is a "
                     "collective-library key (ccl.yaml): set it with kb_ccl_config_set");
    expect_set_error(&cfg, "ccl.algorithms.mine.module=ring_allreduce",
                     "--set ccl.algorithms.mine.module=ring_allreduce: "
                     "'ccl.algorithms.mine.module' is a collective-library key (ccl.yaml): set "
                     "it with kb_ccl_config_set");
    expect_set_error(&cfg, " ccl.foo = 4",
                     "--set  ccl.foo = 4: 'ccl.foo' is a collective-library key (ccl.yaml): set "
                     "it with kb_ccl_config_set");

    assert_int_equal(kb_config_set(&cfg, NULL, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_config_set(NULL, "system.sips.count=4", &eb), KB_ERR_INVAL);
    assert_int_equal(kb_config_set(&cfg, "x=1", NULL), KB_ERR_CONFIG);
    assert_int_equal(kb_config_set(&cfg, "ccl.defaults.n_slots=4", NULL), KB_ERR_CONFIG);
}

static void expect_invalid(const kb_config *cfg, const char *part)
{
    kb_errbuf eb = {{0}};

    assert_int_equal(kb_config_validate(cfg, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, part);
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
    expect_invalid(&cfg, "system.sips.count = 300 is out of range [1, 256]");

    /* a configuration built in code is held to the ranges its keys have in files */
    cfg = base;
    cfg.topo.dma_channels = 0;
    expect_invalid(&cfg, "pe.dma.channels = 0 is out of range [1, 64]");
    cfg = base;
    cfg.topo.sched_tile_k = 0;
    expect_invalid(&cfg, "pe.scheduler.tile_k = 0 is out of range [1, 65536]");
    cfg = base;
    cfg.topo.gemm_flops_per_ns = 0.0001;
    expect_invalid(&cfg, "pe.gemm.flops_per_ns = 0.0001 is out of range [0.001, 1e12]");
    cfg = base;
    cfg.topo.hbm.latency_ns = -0.5;
    expect_invalid(&cfg, "cube.hbm.latency_ns = -0.5 is out of range [0, 1e9]");

    cfg = base;
    snprintf(cfg.topo.sips_topology, sizeof cfg.topo.sips_topology, "hypercube");
    assert_int_equal(kb_topo_sip_kind(&cfg.topo), KB_ERR_CONFIG);
    expect_invalid(&cfg, "system.sips.topology 'hypercube' is not a SIP topology");

    cfg = base;
    snprintf(cfg.topo.switch_arbitration, sizeof cfg.topo.switch_arbitration, "wormhole");
    expect_invalid(&cfg, "system.switch.arbitration 'wormhole' is not an arbitration");
    cfg = base;
    assert_int_equal(kb_config_set(&cfg, "system.switch.arbitration=per_sip", &eb), 0);
    assert_int_equal(kb_topo_switch_per_sip(&cfg.topo), 1);
    assert_int_not_equal(kb_config_set(&cfg, "system.switch.arbitration=circuit", &eb), 0);
    assert_non_null(strstr(eb.msg, "system.switch.arbitration"));

    cfg = base;
    snprintf(cfg.topo.io_completions, sizeof cfg.topo.io_completions, "gossip");
    expect_invalid(&cfg, "sip.io_cpu.completions 'gossip' is not a way to gather completions "
                   "(per_cube, tree)");
    cfg = base;
    assert_int_equal(kb_config_set(&cfg, "sip.io_cpu.completions=tree", &eb), 0);
    assert_string_equal(cfg.topo.io_completions, "tree");

    cfg = base;
    cfg.topo.hbm_size_bytes = (UINT64_C(1) << 37) + 1;
    expect_invalid(&cfg, "cube.hbm.size_bytes = 137438953473 does not fit");

    cfg = base;
    cfg.topo.scratch_size_bytes = (UINT64_C(1) << 27) + 1;
    expect_invalid(&cfg, "pe.scratch.size_bytes = 134217729 does not fit");

    cfg = base;
    cfg.topo.ucie.bandwidth_gbps = 0.0;
    expect_invalid(&cfg, "sip.ucie.bandwidth_gbps = 0 is out of range [0.001, 1e6]");

    /* A machine with more SIPs and a smaller cube mesh is fine. */
    cfg = base;
    assert_int_equal(kb_config_set(&cfg, "system.sips.count=3", &eb), 0);
    assert_int_equal(kb_config_set(&cfg, "sip.cube_mesh.width=2", &eb), 0);
    assert_int_equal(kb_config_validate(&cfg, &eb), 0);
    assert_int_equal(kb_topo_total_pes(&cfg.topo), 3 * 8 * 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_shipped_topology_equals_defaults),
        cmocka_unit_test(test_docs_cover_every_key),
        cmocka_unit_test(test_foreach_key_order),
        cmocka_unit_test(test_partial_file_keeps_other_fields),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_out_of_range_and_duplicates),
        cmocka_unit_test(test_rate_resolution),
        cmocka_unit_test(test_yaml_syntax_errors),
        cmocka_unit_test(test_missing_file_and_empty_file),
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_validate),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
