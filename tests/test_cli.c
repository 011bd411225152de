/*
 * End-to-end tests of the kbcl binary (path in $KBCL_BIN, set by CTest): exit codes, the
 * result line, JSON contents and determinism, config errors naming file and line.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kb_bench.h"
#include "kb_cli.h"
#include "kb_test_util.h"

/* The JSON file a run wrote, parsed (the caller deletes it). */
static cJSON *json_of(const char *name)
{
    char *text = kbt_slurp(name);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

/* The JSON without its wall-clock fields, printed canonically. */
static char *json_without_wall(const char *name)
{
    cJSON *j = json_of(name);
    cJSON_DeleteItemFromObject(j, "wall_ms");
    cJSON_DeleteItemFromObject(j, "phase1_ms");
    cJSON_DeleteItemFromObject(j, "events_per_s");
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(j, "replay"), "ms");
    char *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return out;
}

static int setup(void **s)
{
    (void)s;
    return kbt_workdir_make("kbcl-cli");
}

static int teardown(void **s)
{
    (void)s;
    return kbt_workdir_remove();
}

static void check_verified_json(const char *bench)
{
    char out[8192];
    int rc = kbt_kbcl(out, sizeof out, "run --bench %s --device ref --verify-data --json %s.json",
                      bench, bench);
    if (rc != 0)
        fail_msg("%s", out);
    /* the first line is the bench's result line, ending in " OK" (sanitizer builds may
     * print "==pid==" notes before it) */
    char *line = out;
    while (line[0] == '=' && line[1] == '=' && strchr(line, '\n'))
        line = strchr(line, '\n') + 1;
    char *nl = strchr(line, '\n');
    assert_non_null(nl);
    assert_true(nl - line >= 3 && memcmp(nl - 3, " OK", 3) == 0);

    char name[64];
    snprintf(name, sizeof name, "%s.json", bench);
    char *text = kbt_slurp(name);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    cJSON *t = cJSON_GetObjectItem(j, "sim_time_ns");
    assert_true(cJSON_IsNumber(t) && t->valuedouble > 0);
    cJSON *w = cJSON_GetObjectItem(j, "wall_ms"), *p1 = cJSON_GetObjectItem(j, "phase1_ms");
    cJSON *ev = cJSON_GetObjectItem(j, "events"), *eps = cJSON_GetObjectItem(j, "events_per_s");
    assert_true(cJSON_IsNumber(w) && cJSON_IsNumber(p1) && cJSON_IsNumber(ev) &&
                cJSON_IsNumber(eps));
    assert_true(p1->valuedouble > 0 && p1->valuedouble <= w->valuedouble);
    /* the loop's event rate is the events over the loop's time */
    double want = ev->valuedouble / (p1->valuedouble / 1e3);
    assert_true(eps->valuedouble > 0.999 * want && eps->valuedouble < 1.001 * want);
    cJSON *d = cJSON_GetObjectItem(j, "data_digest");
    assert_true(cJSON_IsString(d) && strlen(d->valuestring) == 16);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "verified")));
    double sim = t->valuedouble;
    cJSON_Delete(j);

    /* a second identical run: byte-identical apart from the wall-clock fields */
    snprintf(name, sizeof name, "%s2.json", bench);
    rc = kbt_kbcl(out, sizeof out, "run --bench %s --device ref --verify-data --json %s", bench,
                  name);
    assert_int_equal(rc, 0);
    char *a = json_without_wall(name), *b;
    snprintf(name, sizeof name, "%s.json", bench);
    b = json_without_wall(name);
    assert_string_equal(a, b);
    free(a);
    free(b);

    /* timing only: same simulated time */
    rc = kbt_kbcl(out, sizeof out, "run --bench %s --device none --json none.json", bench);
    assert_int_equal(rc, 0);
    text = kbt_slurp("none.json");
    j = cJSON_Parse(text);
    free(text);
    assert_true(cJSON_GetObjectItem(j, "sim_time_ns")->valuedouble == sim);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "verified")));
    cJSON_Delete(j);
}

static void test_gemm(void **s) { (void)s; check_verified_json("gemm"); }
static void test_va_offset(void **s) { (void)s; check_verified_json("va_offset"); }
static void test_gpt3_qkv(void **s) { (void)s; check_verified_json("gpt3_qkv"); }

static void test_usage(void **s)
{
    static char out[65536]; /* all of kbcl list: a full buffer would end it with SIGPIPE */
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s", ""), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "--help"), 0);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --help"), 0);
    assert_non_null(strstr(out, "--verify-data"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "frobnicate"), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench nope"), 2);
    assert_non_null(strstr(out, "unknown bench 'nope'"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --device quantum"), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --param m=0"), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --param zz=4"), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --set cube.nope=1"), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --set system.sips.count=abc"), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "list"), 0);
    assert_non_null(strstr(out, "gpt3_qkv"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench va_offset --param k=100"), 2);
}

/* The line of out that starts with prefix (up to its newline, into line), or fails. */
static void line_of(const char *out, const char *prefix, char *line, size_t n)
{
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, prefix, strlen(prefix))) {
            size_t len = strchr(l, '\n') ? (size_t)(strchr(l, '\n') - l) : strlen(l);
            snprintf(line, n, "%.*s", (int)len, l);
            return;
        }
    fail_msg("no line starting '%s' in:\n%s", prefix, out);
}

/*
 * kbcl list --set / --topology lists what a run with the same options sees: an entry made by
 * --set, another world size, the SIP count of a rank = SIP world; what run refuses, it refuses.
 */
static void test_list_set(void **s)
{
    static char out[65536];
    char line[512];
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "list --set system.sips.count=4 "
                              "--set ccl.algorithms.mine.module=ring_rsag_allreduce "
                              "--set ccl.algorithms.mine.topology=ring_1d "
                              "--set ccl.algorithms.ring_rsag_allreduce.world_size=12"), 0);
    line_of(out, "  mine ", line, sizeof line);
    assert_non_null(strstr(line, " ring_rsag_allreduce "));
    assert_non_null(strstr(line, " 4 SIPs "));
    assert_non_null(strstr(line, " rank = SIP, lanes"));
    line_of(out, "  hierarchical_allreduce_sip ", line, sizeof line);
    assert_non_null(strstr(line, " 4 SIPs "));
    line_of(out, "  ring_rsag_allreduce ", line, sizeof line);
    assert_non_null(strstr(line, " 12 "));
    assert_non_null(strstr(line, " rank = PE"));
    /* the shipped machine: 2 SIPs */
    assert_int_equal(kbt_kbcl(out, sizeof out, "list"), 0);
    line_of(out, "  hierarchical_allreduce_sip ", line, sizeof line);
    assert_non_null(strstr(line, " 2 SIPs "));
    /* refused as kbcl run refuses them */
    assert_int_equal(kbt_kbcl(out, sizeof out, "list --set nope=1"), 2);
    kbt_msg_has(out, "kbcl list: --set nope=1: unknown key 'nope'");
    assert_int_equal(kbt_kbcl(out, sizeof out, "list --set "
                              "ccl.algorithms.ring_rsag_allreduce.channels=200"), 2);
    kbt_msg_has(out, "kbcl list: ccl.algorithms.ring_rsag_allreduce: channels = 200 but a SIP "
                     "has 128 PEs");
    assert_int_equal(kbt_kbcl(out, sizeof out, "list --topology missing.yaml"), 2);
    kbt_msg_has(out, "kbcl list: ");
    kbt_msg_has(out, "missing.yaml");
    assert_int_equal(kbt_kbcl(out, sizeof out, "list --set"), 2);
}

/*
 * kbcl list names every entry of configs/ccl.yaml (the names --algorithm takes) and marks the
 * default with '*'. The entries are read here from the file's text, not through the loader,
 * so an entry the loader dropped would show up as missing.
 */
static void test_list_entries(void **s)
{
    static char out[65536];
    char path[4096], prefix[160], line[512], def[128] = "";
    char *yaml, *l, *next;
    int in_algos = 0, in_defaults = 0, nentries = 0, nstars = 0;
    (void)s;
    if (!kbt_source_path("configs/ccl.yaml", path, sizeof path))
        skip();
    assert_int_equal(kbt_kbcl(out, sizeof out, "list"), 0);
    yaml = kbt_read_file(path);
    for (l = yaml; l && *l; l = next) {
        char name[128];
        next = strchr(l, '\n');
        if (next)
            *next++ = 0;
        if (l[0] != ' ' && l[0] != '#' && l[0]) {
            in_algos = !strncmp(l, "algorithms:", 11);
            in_defaults = !strncmp(l, "defaults:", 9);
        } else if (in_defaults && sscanf(l, "  algorithm: %127[A-Za-z0-9_]", def) == 1) {
            continue;
        } else if (in_algos && l[0] == ' ' && l[1] == ' ' && l[2] != ' ' && l[2] != '#' &&
                   sscanf(l + 2, "%127[A-Za-z0-9_]:", name) == 1) {
            /* an entry: "  NAME:" at the entry indent, its line of the listing starts with
             * the marker column then the name and a space */
            int is_def = !strcmp(name, def);
            snprintf(prefix, sizeof prefix, "%c %s ", is_def ? '*' : ' ', name);
            line_of(out, prefix, line, sizeof line);
            nentries++;
        }
    }
    free(yaml);
    assert_true(def[0]);
    assert_true(nentries >= 20); /* the file as shipped: the parse above found its entries */
    for (l = out; (l = strstr(l, "\n* ")) != NULL; l++)
        nstars++;
    assert_int_equal(nstars, 1);
    /* what a line says: module, collective, topology, world size, rank model */
    line_of(out, "* ring_allreduce_tcm ", line, sizeof line);
    assert_non_null(strstr(line, " ring_allreduce "));
    assert_non_null(strstr(line, " all_reduce "));
    assert_non_null(strstr(line, " ring_1d "));
    assert_non_null(strstr(line, " 256 "));
    assert_non_null(strstr(line, " rank = PE"));
    line_of(out, "  hierarchical_allreduce_sip ", line, sizeof line);
    assert_non_null(strstr(line, " SIPs "));
    assert_non_null(strstr(line, " rank = SIP, process group"));
    /* the headings say which section holds entries and which modules */
    kbt_msg_has(out, "ccl.yaml entries (");
    kbt_msg_has(out, "collective modules, rank = PE form");
    kbt_msg_has(out, "collective modules, rank = SIP process-group forms");
    /* --algorithm's help points at the listing */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --help"), 0);
    kbt_msg_has(out, "an entry of ccl.yaml (kbcl\n                       list shows them");

    /* --ccl FILE: its entries, exactly as a table, and a default that is not an entry */
    kbt_write_file("list.yaml", "defaults:\n  algorithm: tree7\nalgorithms:\n"
                                "  tree7:\n    module: tree_allreduce\n    topology: tree_binary\n"
                                "    world_size: 7\n"
                                "  lanes_ring:\n    module: ring_allreduce\n    topology: ring_1d\n"
                                "  pg:\n    module: intercube_allreduce\n    topology: none\n"
                                "  ghost:\n    module: no_such_module\n    world_size: 4\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "list --ccl list.yaml"), 0);
    kbt_msg_has(out, "ccl.yaml entries (list.yaml): ");
    kbt_msg_has(out, "\n  entry       module               collective      topology     "
                     "world size  rank model\n"
                     "* tree7       tree_allreduce       all_reduce      tree_binary  "
                     "7           rank = PE\n"
                     "  lanes_ring  ring_allreduce       all_reduce      ring_1d      "
                     "2 SIPs      rank = SIP, lanes\n"
                     "  pg          intercube_allreduce  all_reduce      none         "
                     "2 SIPs      rank = SIP, process group\n"
                     "  ghost       no_such_module       -               -            "
                     "4           unknown module (a plugin not loaded?)\n");
    kbt_write_file("list2.yaml", "defaults:\n  algorithm: elsewhere\nalgorithms:\n"
                                 "  one:\n    module: ring_allreduce\n    world_size: 8\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "list --ccl list2.yaml"), 0);
    kbt_msg_has(out, "  one  ");
    kbt_msg_has(out, "the default, 'elsewhere', is not an entry of this file");
    assert_null(strstr(out, "\n* "));
}

static void test_config_errors(void **s)
{
    char out[8192];
    (void)s;
    kbt_write_file("unknown.yaml", "system:\n  sips:\n    count: 2\n    bogus: 1\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --topology unknown.yaml"), 2);
    assert_non_null(strstr(out, "unknown.yaml:4:"));
    assert_non_null(strstr(out, "bogus"));

    kbt_write_file("type.yaml", "cube:\n  sram:\n    size_bytes: lots\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --topology type.yaml"), 2);
    assert_non_null(strstr(out, "type.yaml:3:"));

    kbt_write_file("indent.yaml", "system:\n  sips:\n      count: 2\n    topology: ring_1d\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --topology indent.yaml"), 2);
    assert_non_null(strstr(out, "indent.yaml:4:"));

    assert_int_equal(kbt_kbcl(out, sizeof out, "run --topology missing.yaml"), 2);
    assert_non_null(strstr(out, "missing.yaml"));
}

static void test_sim_errors(void **s)
{
    char out[8192];
    (void)s;
    /* a 65536 x 128 f16 block (16 MiB) loaded into the PE's 8 MiB scratch: exit 3 with the
     * reason (gemm of any size tiles its output instead, so it no longer fails) */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench va_offset --param m=65536 "
                                               "--param k=16384 --device none"), 3);
    assert_non_null(strstr(out, "scratch"));
    assert_non_null(strstr(out, "sip0/cube0/pe0"));
}


/* The collective matrix of the seed's end-to-end tests, with the exact pass lines. */
static void test_ccl_matrix(void **s)
{
    static const struct {
        const char *args, *line;
    } cases[] = {
        { "--algorithm ring_allreduce_tcm --world-size 8 --n-elem 32", "  ring_allreduce_tcm (ws=8): 8 OK" },
        { "--algorithm ring_allreduce_hbm --world-size 8 --n-elem 32", "  ring_allreduce_hbm (ws=8): 8 OK" },
        { "--algorithm ring_allreduce_sram --world-size 8 --n-elem 32", "  ring_allreduce_sram (ws=8): 8 OK" },
        { "--algorithm ring_allreduce_tcm --world-size 16 --n-elem 16", "  ring_allreduce_tcm (ws=16): 16 OK" },
        { "--algorithm mesh_allreduce_4 --world-size 4 --n-elem 16", "  mesh_allreduce_4 (ws=4): 4 OK" },
        { "--algorithm tree_allreduce_7 --world-size 7 --n-elem 16", "  tree_allreduce_7 (ws=7): 7 OK" },
        { "--algorithm ring_allreduce_tcm --world-size 2 --n-elem 8", "  ring_allreduce_tcm (ws=2): 2 OK" },
        { "--algorithm ring_allreduce_tcm --world-size 256 --n-elem 8", "  ring_allreduce_tcm (ws=256): 256 OK" },
        { "--algorithm hierarchical_allreduce --world-size 256 --n-elem 16", "  hierarchical_allreduce (ws=256): 256 OK" },
        /* its lanes form (a tile that streams, 2 SIPs x 16 cubes x 8 PEs) and, on a partial
         * cube, the chain form over hierarchical_lanes' fallback wiring */
        { "--algorithm hierarchical_allreduce --world-size 256 --size 1000006", "  hierarchical_allreduce (ws=256): 256 OK" },
        { "--algorithm hierarchical_allreduce --world-size 12 --size 1000006", "  hierarchical_allreduce (ws=12): 12 OK" },
        { "--algorithm ring_rsag_allreduce --world-size 8 --n-elem 64", "  ring_rsag_allreduce (ws=8): 8 OK" },
        { "--algorithm ring_rsag_allreduce --world-size 256 --n-elem 256", "  ring_rsag_allreduce (ws=256): 256 OK" },
        { "--algorithm ring_allreduce_tcm --world-size 8 --n-elem 32 --set ccl.defaults.n_slots=1", "  ring_allreduce_tcm (ws=8): 8 OK" },
    };
    static char out[1 << 16];
    (void)s;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = kbt_kbcl(out, sizeof out,
                          "run --bench ccl_allreduce --device ref --verify-data %s", cases[i].args);
        if (rc != 0 || !strstr(out, cases[i].line))
            fail_msg("%s: exit %d\n%s", cases[i].args, rc, out);
    }
}

/*
 * The other collectives end to end: every shipped entry verifies on 2, 3 and 8 ranks at sizes
 * of one element per rank (nccl-tests' smallest), an odd count and one past a 4 KiB slot; the
 * rooted ones at --root 2 too; and the JSON reports nccl-tests' size and count.
 */
static void test_coll_entries(void **s)
{
    static const char *const entries[] = {
        "ring_allgather", "ring_reducescatter", "p2p_sendrecv", "ring_broadcast",
        "tree_broadcast", "ring_reduce", "tree_reduce", "pairwise_alltoall", "rd_allgather",
        "rh_reducescatter",
    };
    static const int worlds[] = { 2, 3, 8 };
    static const int counts[] = { 1, 37, 3001 };
    static char out[1 << 16];
    char line[128];
    (void)s;
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++)
        for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                int ws = worlds[w], chunked = e < 2 || e >= 7;
                long long size = 2LL * counts[c] * (chunked ? ws : 1);
                int rooted = e >= 3 && e <= 6; /* the broadcasts and reduces */
                const char *root = rooted ? (ws > 2 ? "--root 2" : "--root 1") : "";
                int rc = kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --device ref "
                                  "--verify-data --algorithm %s --world-size %d --size %lld %s "
                                  "--set ccl.defaults.slot_size=4096 --json coll.json",
                                  entries[e], ws, size, root);
                snprintf(line, sizeof line, "  %s (ws=%d): %d OK", entries[e], ws, ws);
                if (rc != 0 || !strstr(out, line))
                    fail_msg("%s ws %d size %lld %s: exit %d\n%s", entries[e], ws, size, root,
                             rc, out);
                char *text = kbt_slurp("coll.json");
                cJSON *j = cJSON_Parse(text);
                free(text);
                assert_non_null(j);
                assert_true(cJSON_GetObjectItem(j, "size_bytes")->valuedouble == (double)size);
                assert_true(cJSON_GetObjectItem(j, "n_elem")->valuedouble == counts[c]);
                cJSON_Delete(j);
            }
    /* a root outside the world, and a root for a kind that has none, are config errors */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --algorithm "
                              "ring_broadcast --world-size 4 --root 4"), 2);
    assert_non_null(strstr(out, "root 4 is not a rank of a world of 4"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --algorithm "
                              "ring_allgather --world-size 4 --root 1"), 2);
    assert_non_null(strstr(out, "the all_gather kind has no root"));
    /* an all_gather size is rounded as nccl-tests rounds it: count = size / (ws * 2), at
     * least 1; the reported size is the one that count gives */
    static const struct { long long size; int ws; double count; } rounds[] = {
        { 4, 3, 1 }, { 1000006, 3, 166667 }, { 2, 256, 1 },
    };
    for (size_t i = 0; i < sizeof rounds / sizeof rounds[0]; i++) {
        assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm ring_allgather "
                                  "--world-size %d --size %lld --device ref --verify-data "
                                  "--set ccl.defaults.slot_size=4096 --json round.json",
                                  rounds[i].ws, rounds[i].size), 0);
        snprintf(line, sizeof line, "  ring_allgather (ws=%d): %d OK", rounds[i].ws,
                 rounds[i].ws);
        assert_non_null(strstr(out, line));
        char *text = kbt_slurp("round.json");
        cJSON *j = cJSON_Parse(text);
        free(text);
        assert_non_null(j);
        assert_true(cJSON_GetObjectItem(j, "n_elem")->valuedouble == rounds[i].count);
        assert_true(cJSON_GetObjectItem(j, "size_bytes")->valuedouble ==
                    rounds[i].count * 2 * rounds[i].ws);
        cJSON_Delete(j);
    }
}

/*
 * Rank = SIP (--world-size 0): an entry whose module has no process-group form runs its rank =
 * PE kernel in lanes over every PE of each SIP (kb_ccl_lanes.h). Every such entry verifies on
 * 1 and 3 SIPs for counts of 1 (one lane busy), 37 (fewer than the 128 lanes) and 3001 (not a
 * multiple of them), the rooted ones at the last SIP; the result counts ranks. The full mesh
 * runs on 16 SIPs and, rank = PE, on 256 ranks; rings beyond the IPCQ area are refused with
 * the numbers.
 */
static void test_coll_lanes(void **s)
{
    static const char *const entries[] = {
        "ring_allgather", "ring_reducescatter", "p2p_sendrecv", "ring_broadcast",
        "tree_broadcast", "ring_reduce", "tree_reduce", "pairwise_alltoall", "rd_allgather",
        "rh_reducescatter", "rhd_allreduce", "ring_rsag_allreduce", "ring_allreduce_tcm",
        "tree_allreduce_7", "dbtree_allreduce",
    };
    static const int sips[] = { 1, 3 };
    static const int counts[] = { 1, 37, 3001 };
    static char out[1 << 16];
    char line[128];
    (void)s;
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++)
        for (size_t w = 0; w < sizeof sips / sizeof sips[0]; w++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                int ws = sips[w], chunked = e < 2 || (e >= 7 && e <= 9);
                long long size = 2LL * counts[c] * (chunked ? ws : 1);
                int rooted = e >= 3 && e <= 6;
                char root[32] = "";
                if (rooted)
                    snprintf(root, sizeof root, "--root %d", ws - 1);
                int rc = kbt_kbcl(out, sizeof out, "run --bench ccl --device ref --verify-data "
                                  "--algorithm %s --world-size 0 --set system.sips.count=%d "
                                  "--size %lld %s --set ccl.defaults.slot_size=4096 "
                                  "--json lanes.json", entries[e], ws, size, root);
                snprintf(line, sizeof line, "  %s (ws=%d): %d OK", entries[e], ws, ws);
                if (rc != 0 || !strstr(out, line))
                    fail_msg("%s on %d SIPs, size %lld %s: exit %d\n%s", entries[e], ws, size,
                             root, rc, out);
                char *text = kbt_slurp("lanes.json");
                cJSON *j = cJSON_Parse(text);
                free(text);
                assert_non_null(j);
                assert_true(cJSON_GetObjectItem(j, "n_elem")->valuedouble == counts[c]);
                assert_true(cJSON_GetObjectItem(j, "world_size")->valuedouble == ws);
                cJSON_Delete(j);
            }
    /* a full mesh of 16 SIPs: 15 peer directions per lane PE */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm pairwise_alltoall "
                              "--world-size 0 --set system.sips.count=16 --size 2 --device ref "
                              "--verify-data"), 0);
    assert_non_null(strstr(out, "  pairwise_alltoall (ws=16): 16 OK"));
    /* rank = PE on 256 ranks (255 peer directions per PE), and a mesh whose rings do not fit
     * the IPCQ area */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm pairwise_alltoall "
                              "--world-size 256 --size 2 --device ref --verify-data"), 0);
    assert_non_null(strstr(out, "  pairwise_alltoall (ws=256): 256 OK"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm pairwise_alltoall "
                              "--world-size 256 --size 2 "
                              "--set ccl.algorithms.pairwise_alltoall.slot_size=16384"), 3);
    assert_non_null(strstr(out, "needs 255 rx rings (255 of them peer directions) of 4 slots x "
                                "16384 bytes = 16711680 bytes, but the PE's IPCQ area in TCM "
                                "(pe.ipcq.area_bytes) has 8388608 bytes"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm mesh_allreduce_4 "
                              "--world-size 0 --set system.sips.count=2 --size 2"), 2);
    assert_non_null(strstr(out, "square"));
}

/*
 * The two-H100 machine (configs/machines/h100x2-nvlink.yaml, docs/validation.md) loads with no
 * unknown key, and every collective of its ccl file verifies at 1 MiB; the all_reduce's
 * 1 GiB run is bound by the NVLink bundle.
 */
static void test_h100_machine(void **s)
{
    static const char *const entries[] = {
        "nccl_ring_allreduce", "nccl_ring_allgather", "nccl_ring_reducescatter",
        "nccl_ring_broadcast", "nccl_ring_reduce", "nccl_alltoall", "nccl_tree_allreduce",
    };
    static char out[1 << 16];
    char topo[1024], ccl[1024], line[128];
    (void)s;
    assert_true(kbt_source_path("configs/machines/h100x2-nvlink.yaml", topo, sizeof topo));
    assert_true(kbt_source_path("configs/machines/h100x2-nccl.yaml", ccl, sizeof ccl));
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++) {
        int rc = kbt_kbcl(out, sizeof out, "run --topology %s --ccl %s --algorithm %s --size 1M "
                          "--device ref --verify-data", topo, ccl, entries[e]);
        snprintf(line, sizeof line, "  %s (ws=2): 2 OK", entries[e]);
        if (rc != 0 || !strstr(out, line))
            fail_msg("%s: exit %d\n%s", entries[e], rc, out);
    }
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --topology %s --ccl %s --size 1G "
                              "--device none", topo, ccl), 0);
    kbt_msg_has(out, "by inter_sip sip0->sip1 (link 0): efficiency 0.98");
}

/* Value of "  KEY   VALUE" in a run's output, -1 if absent. */
static long long printed_ll(const char *out, const char *key)
{
    const char *p = strstr(out, key);
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/*
 * ccl.yaml `channels` (NCCL's channels): a lanes run on only the SIP's first C PEs. A 2-SIP
 * ring_rsag of 64 KiB fits one slot per lane and step, so it sends 2 steps x 2 SIPs x C
 * messages: 16 with 4 channels, 512 with every PE (128); 3 channels (the count does not split
 * evenly) and 1 verify too. More channels than a SIP's PEs is a configuration error.
 */
static void test_lanes_channels(void **s)
{
    static char out[1 << 16];
    static const int channels[] = { 4, 3, 1, 0 };
    static const long long messages[] = { 16, 12, 4, 512 };
    (void)s;
    for (size_t i = 0; i < sizeof channels / sizeof channels[0]; i++) {
        int rc = kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm ring_rsag_allreduce "
                          "--world-size 0 --size 64K --device ref --verify-data "
                          "--set ccl.algorithms.ring_rsag_allreduce.channels=%d", channels[i]);
        if (rc != 0 || !strstr(out, "  ring_rsag_allreduce (ws=2): 2 OK"))
            fail_msg("channels %d: exit %d\n%s", channels[i], rc, out);
        assert_int_equal(printed_ll(out, "  ipcq_messages "), messages[i]);
    }
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm ring_rsag_allreduce "
                              "--world-size 0 --size 64K "
                              "--set ccl.algorithms.ring_rsag_allreduce.channels=129"), 2);
    kbt_msg_has(out, "ccl.algorithms.ring_rsag_allreduce: channels = 129 but a SIP has 128 PEs");
}

/* The shipped ring_allgather and ring_reducescatter are ring_rsag_allreduce's two halves,
 * step for step (same 1 MiB slots, the same slices, partials in the tile's dtype read in place
 * in the receive slot, the next own slice loaded while the current one is combined): on 256
 * ranks at --size 64M, timing-only, each takes 0.45-0.55 of rsag's time (half its traffic)
 * and its busbw is within 10 % of rsag's (issue #14). Both halves are bound by the cubes'
 * NoCs, which carry every hop's send and its copy-out or own load; the combine that lies
 * between a reduce-scatter slice's arrival and its send hides behind the other PEs' traffic
 * now that a link serves what is ready while it would idle (kb_res's gaps). Their times add
 * up to rsag's within 0.5 % (rsag's all-gather starts as its reduce-scatter drains). */
static void test_rsag_halves(void **s)
{
    static const char *const entries[] = { "ring_allgather", "ring_reducescatter",
                                            "ring_rsag_allreduce" };
    static const double want[] = { 2278856.94, 2254049.125, 4523131.75 };
    static char out[1 << 14];
    double t[3], bw[3];
    (void)s;
    for (int e = 0; e < 3; e++) {
        /* the figures of the model before issue #29 (docs/performance.md), whose switch
         * booked a route between SIPs at once */
        assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm %s --size 64M "
                                  "--device none --set cube.noc.topology=bus --set "
                                  "pe.dma.channels=1 --set ccl.defaults.posted_sends=false "
                                  "--set system.switch.arbitration=route "
                                  "--json half.json", entries[e]), 0);
        char *text = kbt_slurp("half.json");
        cJSON *j = cJSON_Parse(text);
        free(text);
        assert_non_null(j);
        t[e] = cJSON_GetObjectItem(j, "sim_time_ns")->valuedouble;
        bw[e] = cJSON_GetObjectItem(j, "busbw_gbps")->valuedouble;
        assert_true(cJSON_GetObjectItem(j, "size_bytes")->valuedouble == 64.0 * 1048576);
        cJSON_Delete(j);
        if (t[e] != want[e])
            fail_msg("%s: sim_time %.3f ns, expected %.3f", entries[e], t[e], want[e]);
    }
    assert_true(fabs(t[0] + t[1] - t[2]) < 5e-3 * t[2]);
    for (int e = 0; e < 2; e++) {
        assert_true(t[e] >= 0.45 * t[2] && t[e] <= 0.55 * t[2]);
        assert_true(fabs(bw[e] - bw[2]) <= 0.10 * bw[2]);
    }
}

/* The busiest resource of the measured region: gemm 256^3 on one PE is 8 SchedulerV2 steps of
 * 128^3 on PE_GEMM, each fixed 16 ns + 2*128^3 / 4096 flops/ns = 1040 ns, so PE_GEMM is
 * reserved 8320 ns of the region exactly; the 256-rank ring at 64 MiB per rank keeps the
 * inter-SIP link busy, as the bus model (before issue #29) kept the first cube's NoC (every
 * hop's send and copy-out or own load crossed it). */
static void test_busiest(void **s)
{
    static char out[1 << 14];
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --device none --json b.json"), 0);
    assert_non_null(strstr(out, "  busiest    pe_gemm sip0/cube0/pe0, reserved "));
    cJSON *j = json_of("b.json");
    assert_string_equal(cJSON_GetObjectItem(j, "busiest_resource")->valuestring,
                        "pe_gemm sip0/cube0/pe0");
    double t = cJSON_GetObjectItem(j, "sim_time_ns")->valuedouble;
    double f = cJSON_GetObjectItem(j, "busiest_busy_frac")->valuedouble;
    assert_true(fabs(f * t - 8320.0) < 1e-6);
    /* the bound: 2 * 256^3 flops at 4096 flops/ns, 8 192 ns (test_bench's test_bound) */
    assert_non_null(strstr(out, "  bound      8192.000 ns by pe_gemm sip0/cube0/pe0: "
                                "efficiency 0.599\n"));
    assert_true(cJSON_GetObjectItem(j, "bound_ns")->valuedouble == 8192.0);
    assert_string_equal(cJSON_GetObjectItem(j, "bound_resource")->valuestring,
                        "pe_gemm sip0/cube0/pe0");
    assert_true(fabs(cJSON_GetObjectItem(j, "efficiency")->valuedouble - 8192.0 / t) < 1e-12);
    cJSON_Delete(j);
    /* a 256-rank ring at 64 MiB per rank keeps the inter-SIP link busy (the model before issue
     * #29 had the cube's shared NoC there) */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm ring_rsag_allreduce "
                              "--size 64M --device none --json b.json"), 0);
    j = json_of("b.json");
    assert_string_equal(cJSON_GetObjectItem(j, "busiest_resource")->valuestring,
                        "inter_sip sip0->sip1 (link 0)");
    assert_string_equal(cJSON_GetObjectItem(j, "bound_resource")->valuestring,
                        "inter_sip sip0->sip1 (link 0)");
    f = cJSON_GetObjectItem(j, "busiest_busy_frac")->valuedouble;
    assert_true(f > 0.95 && f <= 1.0);
    assert_true(cJSON_GetObjectItem(j, "efficiency")->valuedouble > 0.95);
    cJSON_Delete(j);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm ring_rsag_allreduce "
                              "--size 64M --device none --set cube.noc.topology=bus "
                              "--set pe.dma.channels=1 --set ccl.defaults.posted_sends=false "
                              "--json b.json"), 0);
    j = json_of("b.json");
    assert_string_equal(cJSON_GetObjectItem(j, "busiest_resource")->valuestring,
                        "noc sip0/cube0");
    cJSON_Delete(j);
}

static void test_ccl_failures(void **s)
{
    static char out[1 << 16];
    (void)s;
    /* every PE only receives: deadlock, exit 3, with the pointer dump */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ipcq_deadlock"), 3);
    assert_non_null(strstr(out, "deadlock"));
    assert_non_null(strstr(out, "my_head=0 my_tail=0 peer_head_cache=0 peer_tail_cache=0"));
    assert_non_null(strstr(out, "ipcq recv W"));
    /* a non-square mesh is a configuration error */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --algorithm "
                              "mesh_allreduce_4 --world-size 6"), 2);
    assert_non_null(strstr(out, "square"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --algorithm nope"), 2);
    /* the trace prints one line per send and per receive */
    setenv("KBCL_CCL_TRACE", "1", 1);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --algorithm "
                              "ring_allreduce_tcm --world-size 2 --n-elem 8 --quiet"), 0);
    unsetenv("KBCL_CCL_TRACE");
    assert_non_null(strstr(out, " send E 16B seq=0 sip0/cube0/pe0"));
    assert_non_null(strstr(out, " recv W 16B seq=0 sip0/cube0/pe1"));
}


/* Sizes as users write them: bytes with K, M, G = 2^10, 2^20, 2^30; anything else refused. */
static void test_size_parse(void **s)
{
    static const struct {
        const char *text;
        int64_t bytes;
    } good[] = {
        { "8", 8 }, { "1K", 1024 }, { "1M", 1 << 20 }, { "1G", INT64_C(1) << 30 },
        { "64k", 65536 }, { "3m", 3 << 20 }, { "2g", INT64_C(2) << 30 }, { "1000", 1000 },
        { "4294967296G", INT64_C(1) << 62 },
    };
    static const char *const bad[] = { "", "0", "0K", "-8", "+8", "1.5K", "1KB", "1KiB", "K",
                                       " 8", "8 ", "0x10", "1T", "1e3", "8B", "4294967297G",
                                       "99999999999999999999" };
    (void)s;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t v = -1;
        if (kbcl_parse_size(good[i].text, &v) != 0 || v != good[i].bytes)
            fail_msg("'%s': got %lld, expected %lld", good[i].text, (long long)v,
                     (long long)good[i].bytes);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = -1;
        if (kbcl_parse_size(bad[i], &v) == 0)
            fail_msg("'%s' accepted as %lld", bad[i], (long long)v);
    }
    assert_int_equal(kbcl_parse_size(NULL, &(int64_t){ 0 }), -1);
}

/* nccl-tests' size per collective kind and its inverse (the count of a size). */
static void test_coll_size(void **s)
{
    int64_t c = -1;
    (void)s;
    /* one buffer: size = count * elem */
    assert_int_equal(kb_bench_coll_size(KB_COLL_ALLREDUCE, 8, 32, 2), 64);
    assert_int_equal(kb_bench_coll_size(KB_COLL_BROADCAST, 8, 32, 2), 64);
    assert_int_equal(kb_bench_coll_size(KB_COLL_REDUCE, 8, 32, 2), 64);
    assert_int_equal(kb_bench_coll_size(KB_COLL_SENDRECV, 8, 32, 4), 128);
    /* the ws-rank buffer: all_gather's receive, reduce_scatter's send, all_to_all's either */
    assert_int_equal(kb_bench_coll_size(KB_COLL_ALLGATHER, 8, 32, 2), 512);
    assert_int_equal(kb_bench_coll_size(KB_COLL_REDUCE_SCATTER, 8, 32, 2), 512);
    assert_int_equal(kb_bench_coll_size(KB_COLL_ALLTOALL, 8, 32, 2), 512);
    assert_int_equal(kb_bench_coll_size(KB_COLL_ALLREDUCE, 0, 32, 2), 0);
    assert_int_equal(kb_bench_coll_size(KB_COLL_NKINDS, 8, 32, 2), 0);

    assert_int_equal(kb_bench_coll_count(KB_COLL_ALLREDUCE, 256, 16, 2, &c), 0);
    assert_int_equal(c, 8);
    assert_int_equal(kb_bench_coll_count(KB_COLL_ALLREDUCE, 256, INT64_C(1) << 30, 2, &c), 0);
    assert_int_equal(c, INT64_C(1) << 29);
    assert_int_equal(kb_bench_coll_count(KB_COLL_ALLGATHER, 8, 512, 2, &c), 0);
    assert_int_equal(c, 32);
    assert_int_equal(kb_bench_coll_count(KB_COLL_ALLTOALL, 8, 1024, 4, &c), 0);
    assert_int_equal(c, 32);
    /* not whole elements, or not whole elements per rank: refused (nccl-tests rounds down) */
    assert_int_equal(kb_bench_coll_count(KB_COLL_ALLREDUCE, 8, 15, 2, &c), -1);
    assert_int_equal(kb_bench_coll_count(KB_COLL_REDUCE_SCATTER, 8, 8, 2, &c), -1);
    assert_int_equal(kb_bench_coll_count(KB_COLL_ALLREDUCE, 8, 0, 2, &c), -1);
    assert_int_equal(kb_bench_coll_count(KB_COLL_NKINDS, 8, 16, 2, &c), -1);
}

/* The "size(B)  count" row of the human table. */
static void assert_table_row(const char *out, const char *size, const char *count)
{
    char want[96];
    snprintf(want, sizeof want, "  %12s %10s   f16    sum    -1 ", size, count);
    if (!strstr(out, want))
        fail_msg("no table row '%s' in:\n%s", want, out);
}

/* --size S runs exactly what --n-elem S/2 runs (f16 all-reduce) and reports size_bytes. */
static void test_size_run(void **s)
{
    static char out[1 << 16];
    char *a, *b;
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --algorithm ring_allreduce_tcm --world-size 8 "
                              "--n-elem 32 --verify-data --json n.json"), 0);
    assert_table_row(out, "64", "32");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --algorithm ring_allreduce_tcm --world-size 8 "
                              "--size 64 --verify-data --json s.json"), 0);
    assert_table_row(out, "64", "32");
    assert_non_null(strstr(out, "  size_bytes 64\n"));
    a = json_without_wall("n.json");
    b = json_without_wall("s.json");
    assert_string_equal(a, b); /* same time, events, digest, n_elem and size_bytes */
    assert_non_null(strstr(b, "\"n_elem\":32,\"size_bytes\":64,"));
    free(a);
    free(b);
    /* suffixes: 1K = 1024 bytes = 512 f16 elements */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --algorithm ring_allreduce_tcm --world-size 4 "
                              "--size 1K --verify-data --json k.json"), 0);
    assert_table_row(out, "1024", "512");
    a = kbt_slurp("k.json");
    assert_non_null(strstr(a, "\"size_bytes\":\t1024,"));
    free(a);
    /* rank = SIP: the rank's elements are split over its 128 shards (PEs) */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --algorithm hierarchical_allreduce_sip "
                              "--size 512 --verify-data"), 0);
    assert_table_row(out, "512", "256");
    /* the same whole number of elements on each shard: the count rounds down to a multiple
     * of 128, at least one element per shard (nccl-tests' rounding, per shard) */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --algorithm hierarchical_allreduce_sip "
                              "--size 130 --verify-data"), 0);
    assert_table_row(out, "256", "128");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --algorithm hierarchical_allreduce_sip "
                              "--size 1000 --verify-data"), 0);
    assert_table_row(out, "768", "384");

    /* usage errors, exit 2, before anything runs */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --size 16 --n-elem 8"), 2);
    kbt_msg_has(out, "--size and --n-elem both give the message size: use one");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --size 15"), 2);
    kbt_msg_has(out, "--size 15: not a whole number of 2-byte elements");
    static const char *const bad[] = { "0", "-8", "1.5K", "8X", "1KB", "''" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(kbt_kbcl(out, sizeof out, "run --size %s", bad[i]), 2);
        kbt_msg_has(out, "expected a positive number of bytes, optionally with K, M or G");
    }
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --size"), 2);
    kbt_msg_has(out, "--size needs a value");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --size 16"), 2);
    kbt_msg_has(out, "--size: bench 'gemm' takes no size (ccl_allreduce does");
}

/* --trace: Chrome trace-event JSON with complete events for PEs and links, inside the run. */
static void test_trace(void **s)
{
    char out[8192];
    (void)s;
    int rc = kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --algorithm ring_allreduce_tcm "
                      "--world-size 8 --n-elem 32 --verify-data --trace trace.json "
                      "--json trace_run.json");
    if (rc != 0)
        fail_msg("%s", out);
    char *text = kbt_slurp("trace_run.json");
    cJSON *run = cJSON_Parse(text);
    free(text);
    assert_non_null(run);
    double end_us = cJSON_GetObjectItem(run, "sim_end_ns")->valuedouble / 1000.0;
    assert_true(end_us > 0);
    cJSON_Delete(run);

    text = kbt_slurp("trace.json");
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    cJSON *evs = cJSON_GetObjectItem(j, "traceEvents");
    assert_true(cJSON_IsArray(evs));
    int pe = 0, link = 0, sends = 0, kernels = 0, names = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        if (!strcmp(ph, "M")) {
            names++;
            continue;
        }
        assert_string_equal(ph, "X");
        double ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
        double dur = cJSON_GetObjectItem(e, "dur")->valuedouble;
        const char *cat = cJSON_GetObjectItem(e, "cat")->valuestring;
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(e, "pid")));
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(e, "tid")));
        if (!(ts >= 0 && dur >= 0 && ts + dur <= end_us + 1e-6))
            fail_msg("event %s at %.6f+%.6f us outside the run (0..%.6f us)", name, ts, dur, end_us);
        pe += !strcmp(cat, "kernel") || !strcmp(cat, "dma") || !strcmp(cat, "ipcq") ||
              !strcmp(cat, "compute");
        link += !strcmp(cat, "res");
        if (!strcmp(name, "ipcq send E"))
            assert_string_equal(cat, "ipcq");
        if (!strcmp(name, "ring_allreduce_tcm"))
            assert_string_equal(cat, "kernel");
        sends += !strcmp(name, "ipcq send E");
        kernels += !strcmp(name, "ring_allreduce_tcm");
    }
    assert_true(names > 8);        /* process and thread names */
    assert_true(link > 0);
    assert_int_equal(sends, 8 * 7); /* every rank sends 7 times on E */
    assert_int_equal(kernels, 8);  /* one kernel span per PE */
    assert_true(pe > sends);
    cJSON_Delete(j);
}

/* One X event of a trace, as the filter sees it. */
typedef struct trace_ev {
    const char *cat, *thread;
    int pid, tid;
    double ts, end; /* us */
} trace_ev;

/* The X events of trace file name (*n of them) with their threads' names; the array points
 * into *doc (the caller deletes both). */
static trace_ev *trace_events(const char *name, cJSON **doc, int *n)
{
    cJSON *evs, *e, **threads = NULL;
    int cap = 0, nthreads = 0;
    trace_ev *v = NULL;
    *doc = json_of(name);
    evs = cJSON_GetObjectItem(*doc, "traceEvents");
    assert_true(cJSON_IsArray(evs));
    *n = 0;
    cJSON_ArrayForEach(e, evs)
        if (!strcmp(cJSON_GetObjectItem(e, "name")->valuestring, "thread_name")) {
            threads = realloc(threads, (size_t)(nthreads + 1) * sizeof *threads);
            assert_non_null(threads);
            threads[nthreads++] = e;
        }
    cJSON_ArrayForEach(e, evs) {
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X"))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 1024;
            v = realloc(v, (size_t)cap * sizeof *v);
            assert_non_null(v);
        }
        trace_ev *t = &v[(*n)++];
        t->cat = cJSON_GetObjectItem(e, "cat")->valuestring;
        t->pid = cJSON_GetObjectItem(e, "pid")->valueint;
        t->tid = cJSON_GetObjectItem(e, "tid")->valueint;
        t->ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
        t->end = t->ts + cJSON_GetObjectItem(e, "dur")->valuedouble;
        t->thread = "";
        for (int i = 0; i < nthreads; i++) /* its thread's name */
            if (cJSON_GetObjectItem(threads[i], "pid")->valueint == t->pid &&
                cJSON_GetObjectItem(threads[i], "tid")->valueint == t->tid)
                t->thread = cJSON_GetObjectItem(cJSON_GetObjectItem(threads[i], "args"),
                                                "name")->valuestring;
    }
    free(threads);
    return v;
}

/* What a filter of sip0/cube1, ipcq and kernel events and a window keep: an event of those
 * categories on a PE thread of cube 1 (tids 9..16 with 8 PEs per cube) overlapping [w0, w1). */
static int kept_cube1(const trace_ev *e, double w0, double w1)
{
    return (!strcmp(e->cat, "ipcq") || !strcmp(e->cat, "kernel")) && e->pid == 0 &&
           e->tid >= 9 && e->tid <= 16 && e->ts < w1 && (e->end > w0 || e->end == e->ts);
}

/* "trace FILE: N events, M bytes": N and M from a run's output (M the file's size). */
static void trace_line(const char *out, const char *file, long *events, long *bytes)
{
    char head[128];
    snprintf(head, sizeof head, "  trace      %s: ", file);
    const char *l = strstr(out, head);
    assert_non_null(l);
    assert_int_equal(sscanf(l + strlen(head), "%ld events, %ld bytes", events, bytes), 2);
    char *text = kbt_slurp(file);
    assert_non_null(text);
    assert_int_equal((long)strlen(text), *bytes);
    free(text);
}

/*
 * --trace-filter and --trace-window keep exactly the events of the named categories and
 * places that overlap the window (the same events a full trace has there), the run says how
 * large its trace came out, and a filter or window that does not parse is an exit-2 error.
 */
static void test_trace_filter(void **s)
{
    static char out[8192];
    const char *run = "run --bench ccl_allreduce --algorithm ring_allreduce_tcm --world-size 16 "
                      "--n-elem 64 --device none";
    cJSON *full_doc, *doc;
    trace_ev *full, *got;
    int nfull, ngot, want = 0, nres = 0;
    long events, bytes, fevents, fbytes;
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace full.json", run), 0);
    trace_line(out, "full.json", &fevents, &fbytes);
    assert_null(strstr(out, "left out"));
    full = trace_events("full.json", &full_doc, &nfull);
    assert_int_equal(nfull, fevents);
    /* a window of the middle of the run: where cube 1's ranks send */
    double w0 = 1e300, w1 = 0;
    for (int i = 0; i < nfull; i++)
        if (!strcmp(full[i].cat, "ipcq") && full[i].pid == 0 && full[i].tid >= 9 &&
            full[i].tid <= 16) {
            w0 = full[i].ts < w0 ? full[i].ts : w0;
            w1 = full[i].end > w1 ? full[i].end : w1;
        }
    assert_true(w0 < w1);
    w1 = w0 + (w1 - w0) / 2; /* the first half of them */
    for (int i = 0; i < nfull; i++)
        want += kept_cube1(&full[i], w0, w1);
    assert_true(want > 8);

    /* the window in ns: whole ns around the us figures the trace has */
    long a = (long)floor(w0 * 1000.0), b = (long)ceil(w1 * 1000.0);
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace cut.json --trace-filter "
                              "sip0/cube1,ipcq,kernel --trace-window %ld:%ld", run, a, b), 0);
    trace_line(out, "cut.json", &events, &bytes);
    got = trace_events("cut.json", &doc, &ngot);
    assert_int_equal(ngot, events);
    assert_true(bytes < fbytes / 10);
    {
        char left[96];
        snprintf(left, sizeof left, "(%ld more left out by --trace-filter/--trace-window)",
                 fevents - events);
        kbt_msg_has(out, left);
    }
    want = 0;
    for (int i = 0; i < nfull; i++)
        want += kept_cube1(&full[i], a / 1000.0, b / 1000.0);
    assert_int_equal(ngot, want);
    for (int i = 0; i < ngot; i++)
        if (!kept_cube1(&got[i], a / 1000.0, b / 1000.0))
            fail_msg("event %s on %d/%d at %.6f us kept", got[i].cat, got[i].pid, got[i].tid,
                     got[i].ts);
    free(got);
    cJSON_Delete(doc);

    /* resources by place: a PE's own (its DMA engine, memory ports, units) and nothing else */
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace res.json --trace-filter "
                              "res,sip0/cube1/pe2", run), 0);
    got = trace_events("res.json", &doc, &ngot);
    for (int i = 0; i < nfull; i++)
        nres += !strcmp(full[i].cat, "res") && !strncmp(full[i].thread, "sip0/cube1/pe2 ", 15);
    assert_true(nres > 0);
    assert_int_equal(ngot, nres);
    for (int i = 0; i < ngot; i++) {
        assert_string_equal(got[i].cat, "res");
        assert_int_equal(strncmp(got[i].thread, "sip0/cube1/pe2 ", 15), 0);
    }
    free(got);
    cJSON_Delete(doc);
    free(full);
    cJSON_Delete(full_doc);

    /* what does not parse is refused before the run */
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace t.json --trace-filter sip0/cub1",
                              run), 2);
    kbt_msg_has(out, "kbcl: --trace-filter sip0/cub1: 'sip0/cub1' is not a category or a place "
                     "(terms: kernel, dma, ipcq, compute, res, or a place sipR[/cubeR[/peR]] "
                     "with R = N, N-M or *; e.g. sip0/cube0,kernel,ipcq)");
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace t.json --trace-filter "
                              "kernel,sip0/cube3-1", run), 2);
    kbt_msg_has(out, "kbcl: --trace-filter kernel,sip0/cube3-1: 'sip0/cube3-1' is not");
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace t.json --trace-filter "
                              "sip0/cube0/pe0/x", run), 2);
    kbt_msg_has(out, "'sip0/cube0/pe0/x' is not a category or a place");
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace t.json --trace-filter kernels",
                              run), 2);
    kbt_msg_has(out, "'kernels' is not a category or a place");
    static const char *const windows[] = { "5:2", "100", "-1:5", "a:b", "1:2:3", "7:7" };
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        char msg[256];
        assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace t.json --trace-window %s", run,
                                  windows[i]), 2);
        snprintf(msg, sizeof msg, "kbcl: --trace-window %s: expected START:END in simulated ns "
                 "with START < END, either side may be left out (e.g. 0:5000, 1000: or "
                 ":2500.5)", windows[i]);
        kbt_msg_has(out, msg);
    }
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace-filter kernel", run), 2);
    kbt_msg_has(out, "kbcl: --trace-filter: there is no trace to limit (add --trace FILE)");
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace-window 0:", run), 2);
    kbt_msg_has(out, "kbcl: --trace-window: there is no trace to limit (add --trace FILE)");
    assert_null(kbt_slurp("t.json"));
}

/*
 * An output that cannot be written is named as the user gave it, never as kbcl's temporary
 * file, with the reason; what can be seen before the run (a missing folder, a folder given as
 * the file) is refused before it.
 */
static void test_output_errors(void **s)
{
    char out[8192];
    const char *run = "run --bench ccl_allreduce --algorithm ring_allreduce_tcm --world-size 8 "
                      "--n-elem 8 --device none --quiet";
    (void)s;
    /* root may write in /proc: then the temporary file is what fails, after the run; others
     * are told before it */
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --json /proc/version", run), 2);
    kbt_msg_has(out, "/proc/version: cannot write it: ");
    kbt_msg_has(out, "folder /proc");
    assert_null(strstr(out, ".tmp"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace /proc/version", run), 2);
    kbt_msg_has(out, "/proc/version: cannot write it: ");
    assert_null(strstr(out, ".tmp"));
    /* written in place (not a regular file), and the write's own reason */
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --json /dev/full", run), 2);
    kbt_msg_has(out, "kbcl: /dev/full: write failed: No space left on device");
    /* before the run */
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --json /nonexistent/r.json", run), 2);
    kbt_msg_has(out, "kbcl run: --json /nonexistent/r.json: cannot write it: its folder "
                     "/nonexistent: No such file or directory");
    assert_null(strstr(out, "ring_allreduce_tcm (ws=8)"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace /tmp", run), 2);
    kbt_msg_has(out, "kbcl run: --trace /tmp: cannot write it: it is a folder");
    kbt_write_file("plain", "x\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "%s --trace plain/t.json", run), 2);
    kbt_msg_has(out, "kbcl run: --trace plain/t.json: cannot write it: plain is not a folder");
    kbt_write_file("r.csv", "point,x\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "report r.csv -o /nonexistent/r.html"), 2);
    kbt_msg_has(out, "kbcl report: the page /nonexistent/r.html: cannot write it: its folder "
                     "/nonexistent: No such file or directory");
}

/* --param values out of their range say the range. */
static void test_param_range(void **s)
{
    char out[8192];
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --device none --param m=0"), 2);
    kbt_msg_has(out, "kbcl: --param m=0: m = 0 is out of range [1, 65536]");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --device none --param m=x"), 2);
    kbt_msg_has(out, "kbcl: --param m=x: expected an integer in [1, 65536] for m");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --device none --param q=1"), 2);
    kbt_msg_has(out, "kbcl: --param q=1: expected NAME=INTEGER with NAME a parameter of 'gemm' "
                     "(kbcl list shows them)");
}

/*
 * Out of host memory (an address-space limit on the run's process): the message says how
 * many bytes were asked for and for what, and what to try instead; exit 3.
 */
static void test_out_of_memory(void **s)
{
#if defined(__SANITIZE_ADDRESS__)
    (void)s;
    skip(); /* the sanitizer's shadow memory does not fit under the limit */
#else
    char out[8192];
    int fd[2], st;
    size_t len = 0;
    ssize_t got;
    pid_t pid;
    (void)s;
    assert_int_equal(pipe(fd), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* 150 MiB: the program and its simulation fit, the 8 ranks' 16 MiB buffers do not */
        struct rlimit rl = { 150u << 20, 150u << 20 };
        if (chdir(kbt_workdir()) != 0 || setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(99);
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        execl(kbt_kbcl_bin(), "kbcl", "run", "--algorithm", "ring_allreduce_tcm", "--world-size",
              "8", "--size", "16M", "--verify-data", (char *)NULL);
        _exit(98);
    }
    close(fd[1]);
    while (len + 1 < sizeof out && (got = read(fd[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)got;
    out[len] = 0;
    close(fd[0]);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) != 3)
        fail_msg("exit %d: %s", WEXITSTATUS(st), out);
    kbt_msg_has(out, "kbcl: out of host memory: ");
    kbt_msg_has(out, " bytes (");
    kbt_msg_has(out, " MiB) could not be allocated; --device none runs timing only, without the "
                     "data (and without --verify-data), or try a smaller size\n");
#endif
}

/* bench-self's per-bench Phase-2 rows, on ref: every shipped bench runs on the device and on
 * ref in children and their digests agree. */
static void test_bench_self_phase2(void **s)
{
    cJSON *p2 = NULL;
    kb_errbuf eb;
    (void)s;
    assert_int_equal(kbcl_bench_phase2("ref", 1, &p2, &eb), 0);
    assert_null(cJSON_GetObjectItem(p2, "setup")); /* set-up rows are OpenCL's */
    cJSON *b = cJSON_GetObjectItem(p2, "benches");
    assert_int_equal(cJSON_GetArraySize(b), 7);
    for (int i = 0; i < 7; i++) {
        cJSON *r = cJSON_GetArrayItem(b, i);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")));
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "digest_matches_ref")));
        assert_true(cJSON_GetObjectItem(r, "wall_ms")->valuedouble > 0);
        assert_true(cJSON_GetObjectItem(r, "replay_ms")->valuedouble > 0);
    }
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(b, 5), "bench")->valuestring,
                        "ccl_allreduce ring_allreduce_tcm ws256 n8");
    cJSON_Delete(p2);
}

/*
 * A seeded all-reduce verified on the device (kb_vquery.h): 16 ranks x 64 KiB, whose inputs
 * are generated there (GEN records: nothing goes up) and whose check and digest are answered
 * there: only the answers come down (16 tiles x 64 bytes + 16, then 8), with the verdict and
 * the digest of --device ref (the block digest: 1 MiB of results).
 */
static void ccl_on_device(const char *json)
{
    char out[8192], cmd[300];
    snprintf(cmd, sizeof cmd, "run --bench ccl_allreduce --algorithm ring_rsag_allreduce "
             "--world-size 16 --size 64K --device cpu --verify-data --json %s", json);
    if (kbt_kbcl(out, sizeof out, cmd) != 0)
        fail_msg("%s", out);
    assert_non_null(strstr(out, "ring_rsag_allreduce (ws=16): 16 OK"));
    char *text = kbt_slurp(json);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "replay"), "transfers");
    assert_string_equal(cJSON_GetObjectItem(j, "data_digest")->valuestring, "bda608cb75bf0525");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "verified")));
    assert_int_equal(cJSON_GetObjectItem(t, "upload_bytes")->valuedouble, 0);
    assert_int_equal(cJSON_GetObjectItem(t, "download_bytes")->valuedouble, 16 * 64 + 16 + 8);
    cJSON_Delete(j);
    /* the host's check of the same run */
    snprintf(cmd, sizeof cmd, "run --bench ccl_allreduce --algorithm ring_rsag_allreduce "
             "--world-size 16 --size 64K --device ref --verify-data");
    assert_int_equal(kbt_kbcl(out, sizeof out, cmd), 0);
    assert_non_null(strstr(out, "digest     bda608cb75bf0525"));
}

/* The digest, verdict and device transfers of a run's JSON report; the caller frees *j. */
static cJSON *run_json(const char *cmd, const char *json, cJSON **transfers)
{
    char out[8192];
    if (kbt_kbcl(out, sizeof out, "%s --json %s", cmd, json) != 0)
        fail_msg("%s", out);
    char *text = kbt_slurp(json);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "verified")));
    *transfers = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "replay"), "transfers");
    return j;
}

/* On an OpenCL CPU device (PoCL in CI): the run reports its device-resident transfers, and
 * only the inputs go up and only what the check reads comes down. */
static void test_device_transfers(void **s)
{
    char out[8192];
    (void)s;
    if (kbt_kbcl(out, sizeof out, "devices") != 0 || !strstr(out, "[CPU]"))
        skip();
    int rc = kbt_kbcl(out, sizeof out,
                      "run --bench va_offset --device cpu --verify-data --json cpu.json");
    if (rc != 0)
        fail_msg("%s", out);
    assert_non_null(strstr(out, "  device     set-up "));
    char *text = kbt_slurp("cpu.json");
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    cJSON *rp = cJSON_GetObjectItem(j, "replay"), *t = cJSON_GetObjectItem(rp, "transfers");
    assert_non_null(t);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(rp, "program_cache")));
    assert_true(cJSON_GetObjectItem(rp, "setup_ms")->valuedouble > 0);
    /* the set-up ran beside the simulation: what the run waited for is part of its wall */
    double wait = cJSON_GetObjectItem(rp, "setup_wait_ms")->valuedouble;
    assert_true(wait >= 0.0 && wait <= cJSON_GetObjectItem(j, "wall_ms")->valuedouble);
    /* va_offset: a 64 x 1024 f16 input generated on the device (GEN records: nothing up),
     * copied shard by shard into a 64 x 1024 output that the check reads: 128 KiB down */
    assert_int_equal(cJSON_GetObjectItem(rp, "payload_bytes")->valuedouble, 0);
    assert_int_equal(cJSON_GetObjectItem(t, "upload_bytes")->valuedouble, 0);
    assert_int_equal(cJSON_GetObjectItem(t, "download_bytes")->valuedouble, 131072);
    assert_int_equal(cJSON_GetObjectItem(t, "moves")->valuedouble, 0);
    assert_string_equal(cJSON_GetObjectItem(j, "data_digest")->valuestring, "0b0c1e2b05459353");
    cJSON_Delete(j);
    /* the tiny decoder: its rope tables and its weights' maps are the host's bytes; what goes
     * up is exactly that payload */
    char model[1024], cmd[1200];
    assert_non_null(kbt_source_path("configs/models/tiny.yaml", model, sizeof model));
    snprintf(cmd, sizeof cmd, "run --bench decoder_layer --model %s --param seq=16 --device cpu "
             "--verify-data", model);
    j = run_json(cmd, "dec.json", &t);
    rp = cJSON_GetObjectItem(j, "replay");
    assert_true(cJSON_GetObjectItem(rp, "payload_bytes")->valuedouble > 0);
    assert_true(cJSON_GetObjectItem(t, "upload_bytes")->valuedouble ==
                cJSON_GetObjectItem(rp, "payload_bytes")->valuedouble);
    cJSON_Delete(j);
    ccl_on_device("ccl_cpu.json");
    /* A device that is missing is still a device error (exit 4) naming what exists, though
     * the set-up runs in the background: the run waits for it before reporting. */
    kbt_kbcl(out, sizeof out, "devices");
    if (strstr(out, "[GPU]"))
        return;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --device gpu --verify-data"), 4);
    assert_non_null(strstr(out, "no OpenCL GPU device; found: "));
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --device gpu"), 4);
}

/* system.switch.arbitration per_sip: a collective whose messages cross SIPs over routes of
 * one and two SIP hops (recursive halving-doubling on 4 SIPs of a ring) verifies with the same
 * digest as with route, says which arbitration it had, and its timing moves. */
static void test_switch_per_sip(void **s)
{
    static const char *const arb[2] = { "route", "per_sip" };
    char cmd[256], name[32], digest[2][17];
    double sim[2];
    (void)s;
    for (int k = 0; k < 2; k++) {
        cJSON *transfers;
        snprintf(cmd, sizeof cmd, "run --algorithm rhd_allreduce --world-size 32 --size 4K "
                 "--device ref --verify-data --set system.sips.count=4 --set "
                 "sip.cube_mesh.width=2 --set sip.cube_mesh.height=1 --set "
                 "system.switch.arbitration=%s", arb[k]);
        snprintf(name, sizeof name, "arb_%s.json", arb[k]);
        cJSON *j = run_json(cmd, name, &transfers);
        cJSON *mach = cJSON_GetObjectItem(j, "machine");
        assert_string_equal(cJSON_GetObjectItem(mach, "switch_arbitration")->valuestring, arb[k]);
        cJSON *d = cJSON_GetObjectItem(j, "data_digest");
        assert_true(cJSON_IsString(d) && strlen(d->valuestring) == 16);
        memcpy(digest[k], d->valuestring, 17);
        sim[k] = cJSON_GetObjectItem(j, "sim_time_ns")->valuedouble;
        cJSON_Delete(j);
    }
    assert_string_equal(digest[0], digest[1]);
    assert_true(sim[0] != sim[1]);
}

/*
 * --threads N|auto (docs/parallel.md): with per_sip, the collective's launch runs partitioned
 * and says so, and its JSON holds the same simulated time at 1 and 3 threads and by default
 * (auto: the online CPUs); --threads 0 runs one engine; with route nothing can run
 * partitioned and a run asked for threads says why (one that was not says nothing); a count
 * out of 0..64 is a usage error.
 */
static void test_threads(void **s)
{
    char out[8192];
    static const char *const opt[4] = { "--threads 1", "--threads 3", "", "--threads 0" };
    double sim[4];
    (void)s;
    for (int k = 0; k < 4; k++) {
        char json[32];
        snprintf(json, sizeof json, "threads_%d.json", k);
        if (kbt_kbcl(out, sizeof out, "run --algorithm rhd_allreduce --world-size 32 --size 4K "
                     "--device none --set system.sips.count=4 --set sip.cube_mesh.width=2 --set "
                     "sip.cube_mesh.height=1 --set system.switch.arbitration=per_sip %s "
                     "--json %s", opt[k], json) != 0)
            fail_msg("%s", out);
        char *text = kbt_slurp(json);
        cJSON *j = cJSON_Parse(text);
        free(text);
        assert_non_null(j);
        sim[k] = cJSON_GetObjectItem(j, "sim_time_ns")->valuedouble;
        if (k == 3) { /* one engine: no partitions, no thread fields */
            assert_null(cJSON_GetObjectItem(j, "forked_launches"));
            assert_null(strstr(out, "ran partitioned"));
            cJSON_Delete(j);
            continue;
        }
        kbt_msg_has(out, "launch(es) ran partitioned over the SIPs");
        if (k == 1) { /* more threads than the CPUs the run may use: a note says so */
            cpu_set_t set;
            int usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 64;
            if (usable < 3)
                kbt_msg_has(out, "note: 3 Phase-1 threads on ");
            else
                assert_null(strstr(out, "Phase-1 threads on"));
        }
        assert_int_equal(cJSON_GetObjectItem(j, "forked_launches")->valueint, 1);
        int th = cJSON_GetObjectItem(j, "phase1_threads")->valueint;
        assert_true(k == 2 ? th >= 1 : th == 1 + 2 * k);
        cJSON_Delete(j);
    }
    assert_true(sim[0] == sim[1] && sim[1] == sim[2] && sim[2] == sim[3]);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --algorithm rhd_allreduce --world-size 32 "
                              "--size 4K --device none --set system.sips.count=4 --threads 2"), 0);
    kbt_msg_has(out, "threads    2: no launch ran partitioned");
    kbt_msg_has(out, "system.switch.arbitration=per_sip");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --algorithm rhd_allreduce --world-size 32 "
                              "--size 4K --device none --set system.sips.count=4"), 0);
    assert_null(strstr(out, "no launch ran partitioned"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --device none --threads 65"), 2);
    kbt_msg_has(out, "--threads 65: Phase-1 threads, 0 (one engine, no partitions) to 64, or "
                "auto (the CPUs this process may use)");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --device none --threads 2x"), 2);
    kbt_msg_has(out, "--threads 2x: Phase-1 threads");
}

/*
 * The resident arena in blocks (#33: it grows by adding device buffers, never by copying) on
 * PoCL, with KBCL_ARENA_BLOCK capping a block at 64 MiB so that the 256-rank all-reduce of
 * 1 MiB per rank (520 MiB of device data) spans nine blocks: verified, --device ref's digest
 * (82a977cc9b0a8f25, docs/phase2.md), nothing moved on the device. And 16 ranks under a 4 MiB
 * cap, against a --device ref run.
 */
static void test_arena_blocks(void **s)
{
    char out[8192];
    cJSON *t, *j;
    (void)s;
    if (kbt_kbcl(out, sizeof out, "devices") != 0 || !strstr(out, "[CPU]"))
        skip();
    setenv("KBCL_ARENA_BLOCK", "64M", 1);
    j = run_json("run --bench ccl --algorithm ring_rsag_allreduce --size 1M --device cpu "
                 "--verify-data", "blocks.json", &t);
    assert_string_equal(cJSON_GetObjectItem(j, "data_digest")->valuestring, "82a977cc9b0a8f25");
    assert_int_equal(cJSON_GetObjectItem(t, "arena_blocks")->valuedouble, 9);
    assert_int_equal(cJSON_GetObjectItem(t, "arena_bytes")->valuedouble, 9.0 * (64 << 20));
    assert_int_equal(cJSON_GetObjectItem(t, "moves")->valuedouble, 0);
    assert_int_equal(cJSON_GetObjectItem(t, "move_bytes")->valuedouble, 0);
    cJSON_Delete(j);
    setenv("KBCL_ARENA_BLOCK", "4M", 1);
    j = run_json("run --bench ccl --algorithm ring_rsag_allreduce --world-size 16 --size 1M "
                 "--device cpu --verify-data", "blocks16.json", &t);
    unsetenv("KBCL_ARENA_BLOCK");
    assert_true(cJSON_GetObjectItem(t, "arena_blocks")->valuedouble > 4);
    assert_int_equal(cJSON_GetObjectItem(t, "move_bytes")->valuedouble, 0);
    char digest[32];
    snprintf(digest, sizeof digest, "%s", cJSON_GetObjectItem(j, "data_digest")->valuestring);
    cJSON_Delete(j);
    j = run_json("run --bench ccl --algorithm ring_rsag_allreduce --world-size 16 --size 1M "
                 "--device ref --verify-data", "blocks16_ref.json", &t);
    assert_string_equal(cJSON_GetObjectItem(j, "data_digest")->valuestring, digest);
    cJSON_Delete(j);
}

/* Sends a malformed request (64 bytes of 0xff) to the server at sock and reads until it closes
 * the connection. */
static void devd_send_garbage(const char *sock)
{
    struct sockaddr_un a = { 0 };
    unsigned char junk[64], buf[256];
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    a.sun_family = AF_UNIX;
    assert_true(strlen(sock) < sizeof a.sun_path);
    memcpy(a.sun_path, sock, strlen(sock) + 1);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    memset(junk, 0xff, sizeof junk);
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    shutdown(fd, SHUT_WR);
    while (read(fd, buf, sizeof buf) > 0)
        ;
    close(fd);
}

/* Waits up to 10 s for file to hold text; the file's text (caller frees) or a failure. */
static char *wait_for_text(const char *file, const char *text)
{
    for (int i = 0; i < 1000; i++) {
        char *t = kbt_slurp(file);
        if (t && strstr(t, text))
            return t;
        free(t);
        usleep(10000);
    }
    fail_msg("%s never held '%s'", file, text);
    return NULL;
}

/* The device server end to end (PoCL in CI): `kbcl devd --detach` sets the CPU device up once;
 * a run with --device cpu then goes through it (same digest and transfers as in process, no
 * set-up of its own); KBCL_DEVD=off keeps a run in process; a second server for the same
 * device is refused; --status and --stop say and do what they should; with no server, a
 * --device run starts one on first use (KBCL_DEVD_AUTO=0: it does not); a run larger than the
 * device is refused at its tensors. */
static void test_device_server(void **s)
{
    char out[8192], dir[400];
    (void)s;
    if (kbt_kbcl(out, sizeof out, "devices") != 0 || !strstr(out, "[CPU]"))
        skip();
    snprintf(dir, sizeof dir, "%s/devd", kbt_workdir());
    setenv("KBCL_DEVD_DIR", dir, 1);
    unsetenv("KBCL_DEVD");
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --status --device cpu"), 1);
    assert_non_null(strstr(out, "no server for cpu at "));
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --device cpu --detach --idle-exit 120"), 0);
    assert_non_null(strstr(out, "kbcl devd: serving cpu ("));
    assert_non_null(strstr(out, "/devd/cpu.sock, pid "));
    assert_non_null(strstr(out, "; log "));
    assert_non_null(strstr(out, "/devd/cpu.sock.log\n"));
    /* detached, the server's lines go to its log, with the time: a malformed request's */
    char sock[600];
    snprintf(sock, sizeof sock, "%s/cpu.sock", dir);
    devd_send_garbage(sock);
    char *log = wait_for_text("devd/cpu.sock.log", "closed the connection of pid ");
    assert_non_null(strstr(log, ": unknown request 4294967295\n"));
    assert_non_null(strstr(log, " kbcl devd["));
    free(log);
    struct stat lst;
    char logp[600];
    kbt_path(logp, sizeof logp, "devd/cpu.sock.log");
    assert_int_equal(stat(logp, &lst), 0);
    assert_int_equal(lst.st_mode & 0777, 0600);
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --device cpu --detach"), 2);
    assert_non_null(strstr(out, "a device server already listens at "));
    int rc = kbt_kbcl(out, sizeof out,
                      "run --bench va_offset --device cpu --verify-data --json devd.json");
    if (rc != 0)
        fail_msg("%s", out);
    char *text = kbt_slurp("devd.json");
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    cJSON *rp = cJSON_GetObjectItem(j, "replay"), *t = cJSON_GetObjectItem(rp, "transfers");
    assert_non_null(strstr(cJSON_GetObjectItem(rp, "device_desc")->valuestring,
                           " via kbcl devd"));
    assert_string_equal(cJSON_GetObjectItem(j, "data_digest")->valuestring, "0b0c1e2b05459353");
    assert_int_equal(cJSON_GetObjectItem(t, "upload_bytes")->valuedouble, 0); /* generated */
    assert_int_equal(cJSON_GetObjectItem(t, "download_bytes")->valuedouble, 131072);
    assert_true(cJSON_GetObjectItem(rp, "launches")->valuedouble > 0);
    cJSON_Delete(j);
    ccl_on_device("ccl_devd.json"); /* the queries through the server */
    /* Pipelined: a cut every 100 of the 1 248 records, each part handed to the server while
     * the simulation goes on; the same verdict, digest and transfers as one flush at the end
     * (and as ref, which only marks the cuts). How many cuts find the connection made (it is
     * made beside the simulation) varies from run to run; test_bench counts them exactly. */
    rc = kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --algorithm ring_rsag_allreduce "
                  "--world-size 16 --size 64K --device cpu --verify-data --replay-cut 100 "
                  "--json cut.json");
    if (rc != 0)
        fail_msg("%s", out);
    text = kbt_slurp("cut.json");
    j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    rp = cJSON_GetObjectItem(j, "replay");
    t = cJSON_GetObjectItem(rp, "transfers");
    assert_string_equal(cJSON_GetObjectItem(j, "data_digest")->valuestring, "bda608cb75bf0525");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "verified")));
    assert_int_equal(cJSON_GetObjectItem(rp, "records")->valuedouble, 1248);
    assert_true(cJSON_GetObjectItem(rp, "flushes")->valuedouble >= 1);
    assert_int_equal(cJSON_GetObjectItem(t, "upload_bytes")->valuedouble, 0);
    assert_int_equal(cJSON_GetObjectItem(t, "download_bytes")->valuedouble, 16 * 64 + 16 + 8);
    cJSON_Delete(j);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --algorithm "
                              "ring_rsag_allreduce --world-size 16 --size 64K --device ref "
                              "--verify-data --replay-cut 100 --json cutref.json"), 0);
    assert_non_null(strstr(out, "digest     bda608cb75bf0525"));
    text = kbt_slurp("cutref.json");
    j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "replay"), "flushes")->valuedouble,
                     1);
    cJSON_Delete(j);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench va_offset --replay-cut 1e3"), 2);
    assert_non_null(strstr(out, "--replay-cut 1e3: a record count"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --status --device cpu"), 0);
    assert_non_null(strstr(out, "0 session(s) open"));
    setenv("KBCL_DEVD", "off", 1);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench va_offset --device cpu --verify-data"),
                     0);
    assert_null(strstr(out, "via kbcl devd"));
    unsetenv("KBCL_DEVD");
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --stop --device cpu"), 0);
    assert_non_null(strstr(out, "stops once its sessions end"));
    for (int i = 0; i < 100 && kbt_kbcl(out, sizeof out, "devd --status --device cpu") == 0; i++)
        usleep(50000);
    if (!strstr(out, "no server for cpu"))
        fail_msg("after --stop: %s", out);
    /* started on first use: with no server, a --device run starts one in the background
     * (the test environment says KBCL_DEVD_AUTO=0; a user's does not) and goes through it, and
     * so does the next run; KBCL_DEVD_AUTO=0 keeps a run in process and starts nothing */
    setenv("KBCL_DEVD_AUTO", "1", 1);
    setenv("KBCL_DEVD_IDLE", "60", 1);
    for (int k = 0; k < 2; k++) {
        rc = kbt_kbcl(out, sizeof out, "run --bench va_offset --device cpu --verify-data "
                      "--json auto.json");
        if (rc != 0)
            fail_msg("run %d with the server started on first use: %s", k, out);
        text = kbt_slurp("auto.json");
        j = cJSON_Parse(text);
        free(text);
        assert_non_null(j);
        rp = cJSON_GetObjectItem(j, "replay");
        if (!strstr(cJSON_GetObjectItem(rp, "device_desc")->valuestring, " via kbcl devd"))
            fail_msg("run %d: device %s", k, cJSON_GetObjectItem(rp, "device_desc")->valuestring);
        assert_string_equal(cJSON_GetObjectItem(j, "data_digest")->valuestring,
                            "0b0c1e2b05459353");
        cJSON_Delete(j);
    }
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --status --device cpu"), 0);
    assert_non_null(strstr(out, "kbcl devd: serving cpu ("));
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --stop --device cpu"), 0);
    for (int i = 0; i < 100 && kbt_kbcl(out, sizeof out, "devd --status --device cpu") == 0; i++)
        usleep(50000);
    setenv("KBCL_DEVD_AUTO", "0", 1);
    unsetenv("KBCL_DEVD_IDLE");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench va_offset --device cpu --verify-data "
                              "--json inproc.json"), 0);
    text = kbt_slurp("inproc.json");
    j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    assert_null(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "replay"),
                                           "device_desc")->valuestring, "via kbcl devd"));
    cJSON_Delete(j);
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --status --device cpu"), 1);
    setenv("KBCL_DEVD", "off", 1);
    unsetenv("KBCL_DEVD_DIR");
    /* a run that cannot fit the device stops at its tensors, before its kernels, with both
     * figures and the exit status of a device error (256 GiB of rank buffers) */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm ring_rsag_allreduce "
                              "--world-size 256 --size 1G --device cpu --verify-data"), 4);
    kbt_msg_has(out, "kbcl: the run does not fit the device's memory: tensor 'tiles': the run's "
                     "tensors need ");
    kbt_msg_has(out, " of device memory, ");
    kbt_msg_has(out, " with the arena's slack, and ");
    kbt_msg_has(out, " of it for a run's arena: a smaller size fits, or --device ref");
}

/* ccl.defaults.backpressure=false (docs/collectives.md, "Backpressure"): senders overwrite
 * slots not yet read, so the sums are wrong and the run says so (exit 1), on a ring of any
 * length; it used to stop with an IPCQ invariant error (exit 3) once more credits were on
 * their way than a ring holds. */
static void test_no_backpressure(void **s)
{
    char out[8192];
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --verify-data "
                              "--algorithm ring_allreduce_hbm --world-size 16 --set "
                              "ccl.defaults.n_slots=1 --set ccl.defaults.backpressure=false "
                              "--quiet"), 1);
    kbt_msg_has(out, "  [FAIL] ring_allreduce_hbm (ws=16): got mean=-20.9683, expected=-22.6436 "
                     "(16 of 16 ranks wrong, first: rank 0 element 0 = -23.8438, expected "
                     "-34.125)");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl_allreduce --verify-data "
                              "--algorithm ring_allreduce_hbm --world-size 64 --set "
                              "ccl.defaults.backpressure=false --quiet"), 1);
    kbt_msg_has(out, "  [FAIL] ring_allreduce_hbm (ws=64): ");
    assert_null(strstr(out, "found no sending queue"));
}

/* A device-server folder that is a file: the server refuses to start and says why (it used
 * to report a server already listening, with a pid it never read). Needs no device: the
 * check comes before the device is set up. */
static void test_devd_dir_is_a_file(void **s)
{
    char out[8192], file[400];
    (void)s;
    kbt_write_file("devd_file", "x\n");
    snprintf(file, sizeof file, "%s/devd_file", kbt_workdir());
    setenv("KBCL_DEVD_DIR", file, 1);
    assert_int_equal(kbt_kbcl(out, sizeof out, "devd --device cpu"), 2);
    kbt_msg_has(out, "kbcl devd: cannot serve at ");
    kbt_msg_has(out, "/devd_file/cpu.sock: Not a directory");
    assert_null(strstr(out, "already listens"));
    unsetenv("KBCL_DEVD_DIR");
}

/* --json and --trace never overwrite an input of the run, nor each other: exit 2 before
 * anything runs, the file unchanged. */
static void test_outputs_not_inputs(void **s)
{
    char out[8192];
    (void)s;
    kbt_write_file("in.yaml", "system:\n  sips:\n    count: 2\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --device none --topology "
                              "in.yaml --json in.yaml"), 2);
    kbt_msg_has(out, "kbcl run: --json in.yaml is the same file as in.yaml, which this "
                     "command reads or writes: give another file");
    char *text = kbt_slurp("in.yaml");
    assert_non_null(text);
    assert_string_equal(text, "system:\n  sips:\n    count: 2\n");
    free(text);
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench gemm --device none --json o.json "
                              "--trace o.json"), 2);
    kbt_msg_has(out, "kbcl run: --trace o.json is the same file as o.json");
    assert_null(kbt_slurp("o.json"));
}

/* A bench that runs no collective refuses the collective's options by name instead of
 * ignoring them (gemm's rows of a world_size sweep used to be identical). */
static void test_options_the_bench_takes(void **s)
{
    char out[8192];
    (void)s;
    static const char *const opts[][2] = {
        { "--world-size 4", "--world-size" }, { "--algorithm ring_allreduce_tcm", "--algorithm" },
        { "--root 1", "--root" }, { "--dtype f32", "--dtype" }, { "--op max", "--op" },
        { "--n-elem 8", "--n-elem" }, { "--buffer-kind hbm", "--buffer-kind" },
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        char cmd[256], msg[256];
        snprintf(cmd, sizeof cmd, "run --bench gemm --device none %s", opts[i][0]);
        assert_int_equal(kbt_kbcl(out, sizeof out, cmd), 2);
        snprintf(msg, sizeof msg, "kbcl: %s: bench 'gemm' runs no collective and takes no %s "
                 "(its options are --param ones: kbcl list shows them)", opts[i][1], opts[i][1]);
        kbt_msg_has(out, msg);
    }
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench va_offset --device none "
                              "--world-size 8"), 2);
    kbt_msg_has(out, "--world-size: bench 'va_offset' runs no collective");
    /* decoder_layer reads --dtype as its number format */
    char path[1024], cmd[1400];
    if (kbt_source_path("configs/models/tiny.yaml", path, sizeof path)) {
        snprintf(cmd, sizeof cmd, "run --bench decoder_layer --model %s --dtype int8 "
                 "--device none --quiet", path);
        assert_int_equal(kbt_kbcl(out, sizeof out, cmd), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_va_offset),
        cmocka_unit_test(test_gpt3_qkv),
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_list_entries),
        cmocka_unit_test(test_list_set),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_sim_errors),
        cmocka_unit_test(test_ccl_matrix),
        cmocka_unit_test(test_coll_entries),
        cmocka_unit_test(test_coll_lanes),
        cmocka_unit_test(test_lanes_channels),
        cmocka_unit_test(test_h100_machine),
        cmocka_unit_test(test_rsag_halves),
        cmocka_unit_test(test_busiest),
        cmocka_unit_test(test_no_backpressure),
        cmocka_unit_test(test_devd_dir_is_a_file),
        cmocka_unit_test(test_outputs_not_inputs),
        cmocka_unit_test(test_options_the_bench_takes),
        cmocka_unit_test(test_ccl_failures),
        cmocka_unit_test(test_trace),
        cmocka_unit_test(test_trace_filter),
        cmocka_unit_test(test_output_errors),
        cmocka_unit_test(test_param_range),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_size_parse),
        cmocka_unit_test(test_coll_size),
        cmocka_unit_test(test_size_run),
        cmocka_unit_test(test_switch_per_sip),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_bench_self_phase2),
        cmocka_unit_test(test_device_transfers),
        cmocka_unit_test(test_arena_blocks),
        cmocka_unit_test(test_device_server),
    };
    /* a device server the user runs must not serve these runs (test_device_server starts
     * its own, in the scratch folder) */
    setenv("KBCL_DEVD", "off", 1);
    return cmocka_run_group_tests(tests, setup, teardown);
}
