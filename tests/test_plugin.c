/*
 * test_plugin — plugins (kb_plugin.h, docs/plugins.md): the loader in process (this test
 * program exports kbcl's symbols as the kbcl binary does, so a plugin resolves them here):
 * loading and unloading the example plugin (build/examples/libmy_ring.so, $KBCL_EXAMPLE_PLUGIN)
 * and what it adds, every refusal (no file, not a shared object, no init symbol, no ABI
 * symbol, another ABI version, an entry without a head, of a newer version or of no version's
 * size, a built-in's name for an algorithm or a bench, a name another plugin has, an init that
 * refuses) each a KB_ERR_CONFIG naming the file and the symbol or entry, with the set
 * unchanged; an entry built before a field was appended (it loads); folders and lists of KBCL_PLUGIN_PATH; jobs that run a
 * plugin's algorithms in both rank models and its bench through kbcl_job_run, with plugins
 * named by ccl.yaml relative to it. Then the kbcl binary end to end ($KBCL_BIN): the exit
 * status 2 and message of each refusal, `kbcl list --plugin`, `kbcl run --plugin`,
 * KBCL_PLUGIN_PATH, and a sweep file with plugins: whose every row is ok. The test plugins
 * are tests/plugin_test.c's variants, in $KBCL_TEST_PLUGINS.
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

#include "kb_cli.h"
#include "kb_plugin.h"
#include "kb_test_util.h"

static char example[1024], pdir[1024];

/* A test plugin variant's file. */
static const char *variant(const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "%s/libplugin_%s.so", pdir, name);
    return buf;
}

static int setup(void **s)
{
    const char *e = getenv("KBCL_EXAMPLE_PLUGIN"), *d = getenv("KBCL_TEST_PLUGINS");
    (void)s;
    if (!e || !d)
        return -1;
    snprintf(example, sizeof example, "%s", e);
    snprintf(pdir, sizeof pdir, "%s", d);
    return kbt_workdir_make("kbcl-plugin");
}

static int teardown(void **s)
{
    (void)s;
    return kbt_workdir_remove();
}

/* ---- the loader in process ---- */

static void test_load_and_unload(void **state)
{
    kb_plugins *ps = NULL;
    kb_errbuf eb = {{0}};
    const kb_plugin_info *pi;
    char rel[1200];
    (void)state;
    assert_int_equal(kb_plugins_create(&ps, &eb), 0);
    assert_null(kb_plugins_at(ps, 0));
    assert_null(kb_plugins_find_bench(ps, "my_scale"));
    assert_ptr_equal(kb_plugins_find_bench(ps, "gemm"), kb_bench_find("gemm"));
    assert_int_equal(kb_plugins_load(ps, example, &eb), 0);
    pi = kb_plugins_at(ps, 0);
    assert_non_null(pi);
    assert_null(kb_plugins_at(ps, 1));
    assert_string_equal(pi->name, "my_ring");
    assert_non_null(strstr(pi->path, "libmy_ring.so"));
    assert_int_equal(pi->nalgos, 1);
    assert_null(pi->algos[0]->sip); /* runs at rank = SIP in lanes */
    assert_int_equal(pi->nbenches, 1);
    assert_string_equal(pi->algos[0]->module, "my_ring");
    assert_int_equal(pi->algos[0]->flags, KB_CCL_ANY_WORLD);
    assert_ptr_equal(kb_plugins_find_bench(ps, "my_scale"), pi->benches[0]);
    assert_ptr_equal(kb_ccl_reg_find_algo(kb_plugins_ccl(ps), "my_ring"), pi->algos[0]);
    assert_null(kb_ccl_reg_find_algo(NULL, "my_ring")); /* never a global */
    /* the same file again, also by another spelling of its path: loaded once */
    snprintf(rel, sizeof rel, "%.*s/./%s", (int)(strrchr(example, '/') - example), example,
             strrchr(example, '/') + 1);
    assert_int_equal(kb_plugins_load(ps, example, &eb), 0);
    assert_int_equal(kb_plugins_load(ps, rel, &eb), 0);
    assert_null(kb_plugins_at(ps, 1));
    /* the example's algorithm through the mock runtime, as its author would test it */
    {
        float in[12 * 40], out[12 * 40];
        kb_ccl_inputs(in, 5, 0, 12, 40);
        assert_int_equal(kb_ccl_mock_run_algo(pi->algos[0], NULL, 12, 40, 0, NULL, in, out, &eb), 0);
        for (int i = 0; i < 40; i++) {
            float want = 0.0f;
            for (int r = 0; r < 12; r++)
                want += in[r * 40 + i];
            for (int r = 0; r < 12; r++)
                assert_true(out[r * 40 + i] == kb_f16_to_f32(kb_f32_to_f16(want)));
        }
    }
    kb_plugins_destroy(ps); /* unloads it */
    kb_plugins_destroy(NULL);
}

/* Every refusal: KB_ERR_CONFIG, a message naming the file and `what`, the set unchanged. */
static void test_refusals(void **state)
{
    static const struct { const char *variant, *what; } cases[] = {
        { "noinit", "not a kbcl plugin: it defines no symbol kbcl_plugin_init" },
        { "noabi", "not a kbcl plugin: it defines no symbol kbcl_plugin_abi" },
        { "abi99", "plugin ABI mismatch: kbcl_plugin_abi = 99, this kbcl speaks ABI 11" },
        { "clash", "'ring_rsag_allreduce' clashes with kbcl's built-in module" },
        { "benchclash", "bench 'gemm' clashes with kbcl's built-in bench" },
        { "dup", "algorithm 'my_ring' is already registered" },
        { "refuse", "kbcl_plugin_init refused to load: plugin_refuse wants a GPU" },
        { "newer", "algorithm 'my_newer': built for version 2 of its entry, newer "
                   "than this kbcl's 1: rebuild the plugin against this kbcl's headers" },
        { "nohead", "algorithm 'my_headless': no entry head (write .head = "
                    "KB_CCL_ALGO_HEAD" },
        { "badsize", "algorithm 'my_badsize': an entry of 40 bytes is no version 1 "
                     "entry" },
    };
    char file[1200];
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kb_plugins *ps = NULL;
        kb_errbuf eb = {{0}};
        assert_int_equal(kb_plugins_create(&ps, &eb), 0);
        assert_int_equal(kb_plugins_load(ps, example, &eb), 0);
        variant(cases[i].variant, file, sizeof file);
        assert_int_equal(kb_plugins_load(ps, file, &eb), KB_ERR_CONFIG);
        kbt_msg_has(eb.msg, file);
        kbt_msg_has(eb.msg, cases[i].what);
        assert_null(kb_plugins_at(ps, 1));
        assert_null(kb_ccl_reg_algo_at(kb_plugins_ccl(ps), 1));
        assert_null(kb_ccl_reg_find_algo(kb_plugins_ccl(ps), "never_registered"));
        kb_plugins_destroy(ps);
    }
    {
        kb_plugins *ps = NULL;
        kb_errbuf eb = {{0}};
        assert_int_equal(kb_plugins_create(&ps, &eb), 0);
        assert_int_equal(kb_plugins_load(ps, "/nonexistent.so", &eb), KB_ERR_CONFIG);
        kbt_msg_has(eb.msg, "/nonexistent.so: cannot load plugin: No such file or directory");
        assert_int_equal(kb_plugins_load(ps, "/etc/hostname", &eb), KB_ERR_CONFIG);
        kbt_msg_has(eb.msg, "/etc/hostname: not a loadable shared object");
        assert_null(kb_plugins_at(ps, 0));
        kb_plugins_destroy(ps);
    }
}

/* An entry built before a field was appended loads: the loader's copy has this kbcl's size and
 * the missing field zero (kb_ccl_algo_impl.ordered: NULL, the plain reference). */
static void test_older_entry(void **state)
{
    kb_plugins *ps = NULL;
    kb_errbuf eb = {{0}};
    const kb_ccl_algo_impl *a;
    char file[1200];
    (void)state;
    assert_int_equal(kb_plugins_create(&ps, &eb), 0);
    if (kb_plugins_load(ps, variant("old", file, sizeof file), &eb) != 0)
        fail_msg("%s", eb.msg);
    a = kb_ccl_reg_find_algo(kb_plugins_ccl(ps), "my_old");
    assert_non_null(a);
    assert_ptr_equal(a, kb_plugins_at(ps, 0)->algos[0]);
    assert_int_equal(a->head.size, sizeof(kb_ccl_algo_impl));
    assert_int_equal(a->head.version, KB_CCL_ALGO_VERSION);
    assert_null(a->ordered);
    assert_ptr_equal(a->reference, kb_ccl_ref_allreduce);
    assert_string_equal(a->topology, "ring_1d");
    kb_plugins_destroy(ps);
}

/* KBCL_PLUGIN_PATH's lists: folders load their *.so files, empty elements are skipped. */
static void test_load_list(void **state)
{
    kb_plugins *ps = NULL;
    kb_errbuf eb = {{0}};
    char list[2400], file[1200];
    (void)state;
    assert_int_equal(kb_plugins_create(&ps, &eb), 0);
    snprintf(list, sizeof list, "::%.*s:", (int)(strrchr(example, '/') - example), example);
    assert_int_equal(kb_plugins_load_list(ps, list, &eb), 0);
    assert_non_null(kb_plugins_at(ps, 0));
    assert_string_equal(kb_plugins_at(ps, 0)->name, "my_ring");
    snprintf(list, sizeof list, "%s:%s", variant("sip", file, sizeof file), "/nonexistent.so");
    assert_int_equal(kb_plugins_load_list(ps, list, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "/nonexistent.so");
    assert_non_null(kb_plugins_at(ps, 1)); /* what loaded before the error stays */
    assert_string_equal(kb_plugins_at(ps, 1)->name, "plugin_sip");
    assert_int_equal(kb_plugins_load_list(ps, "", &eb), 0);
    assert_int_equal(kb_plugins_load_list(ps, NULL, &eb), 0);
    kb_plugins_destroy(ps);
}

/* Runs one job with the set ps; returns kbcl_job_run's code, the result in *res. */
static int run_job(kb_plugins *ps, kbcl_job *job, kbcl_result *res, kb_errbuf *eb)
{
    job->plugins = ps;
    job->device = "ref";
    job->verify = 1;
    return kbcl_job_run(job, res, eb);
}

/* A plugin's rank = PE algorithm on 12 ranks (a partial cube), its rank = SIP algorithm and
 * its bench, through the job path `kbcl run` takes. */
static void test_jobs(void **state)
{
    kb_plugins *ps = NULL;
    kb_errbuf eb = {{0}};
    kbcl_result *res = calloc(1, sizeof *res);
    char file[1200];
    kbcl_job job;
    (void)state;
    assert_non_null(res);
    assert_int_equal(kb_plugins_create(&ps, &eb), 0);
    assert_int_equal(kb_plugins_load(ps, example, &eb), 0);
    assert_int_equal(kb_plugins_load(ps, variant("sip", file, sizeof file), &eb), 0);

    memset(&job, 0, sizeof job);
    job.bench = "ccl";
    job.algorithm = "my_ring";
    job.world_size = "12";
    job.n_elem = "40";
    if (run_job(ps, &job, res, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_string_equal(res->rep.res.line, "  my_ring (ws=12)");
    assert_int_equal(res->rep.res.verified, 1);
    assert_string_equal(res->rep.res.ok_text, "12 OK");
    kbcl_result_fini(res);

    memset(&job, 0, sizeof job);
    job.bench = "ccl";
    job.algorithm = "my_sip";
    job.sets[job.nsets++] = "system.sips.count=2";
    if (run_job(ps, &job, res, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_string_equal(res->rep.res.line, "  my_sip (ws=2)");
    assert_int_equal(res->rep.res.verified, 1);
    kbcl_result_fini(res);

    memset(&job, 0, sizeof job);
    job.bench = "my_scale";
    job.params[job.nparams++] = "pes=8";
    if (run_job(ps, &job, res, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_int_equal(res->rep.res.verified, 1);
    kbcl_result_fini(res);

    /* without the set: the plugin's names are unknown */
    memset(&job, 0, sizeof job);
    job.bench = "my_scale";
    assert_int_equal(run_job(NULL, &job, res, &eb), KB_ERR_USAGE);
    kbt_msg_has(eb.msg, "unknown bench 'my_scale'");
    kbcl_result_fini(res);
    kb_plugins_destroy(ps);
    free(res);
}

/* ccl.yaml's plugins: load relative to the file; a set that cannot take them refuses. */
static void test_ccl_yaml_plugins(void **state)
{
    kb_plugins *ps = NULL;
    kb_errbuf eb = {{0}};
    kbcl_result *res = calloc(1, sizeof *res);
    char path[600], cmd[2600];
    kbcl_job job;
    (void)state;
    assert_non_null(res);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/lib' && ln -sf '%s' '%s/lib/libmine.so'",
             kbt_workdir(), example, kbt_workdir());
    assert_int_equal(system(cmd), 0);
    kbt_write_file("ccl.yaml", "plugins: [lib/libmine.so]\n");
    kbt_path(path, sizeof path, "ccl.yaml");
    assert_int_equal(kb_plugins_create(&ps, &eb), 0);
    memset(&job, 0, sizeof job);
    job.ccl = path;
    job.algorithm = "my_ring";
    job.world_size = "3";
    job.n_elem = "8";
    if (run_job(ps, &job, res, &eb) != 0)
        fail_msg("%s", eb.msg);
    assert_int_equal(res->rep.res.verified, 1);
    assert_non_null(kb_plugins_at(ps, 0));
    kbcl_result_fini(res);
    memset(&job, 0, sizeof job);
    job.ccl = path;
    job.algorithm = "my_ring";
    assert_int_equal(run_job(NULL, &job, res, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "lib/libmine.so: this program loads no plugins");
    kbcl_result_fini(res);
    kbt_write_file("bad.yaml", "plugins: [lib/nothere.so]\n");
    kbt_path(path, sizeof path, "bad.yaml");
    memset(&job, 0, sizeof job);
    job.ccl = path;
    assert_int_equal(run_job(ps, &job, res, &eb), KB_ERR_CONFIG);
    kbt_msg_has(eb.msg, "bad.yaml: plugins");
    kbt_msg_has(eb.msg, "lib/nothere.so: cannot load plugin");
    kbcl_result_fini(res);
    kb_plugins_destroy(ps);
    free(res);
}

/* ---- the kbcl binary ---- */

static void test_cli_refusals(void **state)
{
    static const char *const bad[] = { "noinit", "abi99", "clash", "benchclash" };
    static const char *const why[] = { "kbcl_plugin_init", "kbcl_plugin_abi = 99",
                                       "ring_rsag_allreduce", "bench 'gemm'" };
    char out[8192], file[1200];
    (void)state;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --plugin /nonexistent.so"), 2);
    kbt_msg_has(out, "/nonexistent.so: cannot load plugin");
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --plugin /etc/hostname"), 2);
    kbt_msg_has(out, "/etc/hostname: not a loadable shared object");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        variant(bad[i], file, sizeof file);
        assert_int_equal(kbt_kbcl(out, sizeof out, "run --plugin '%s' --bench gemm", file), 2);
        kbt_msg_has(out, file);
        kbt_msg_has(out, why[i]);
        assert_int_equal(kbt_kbcl(out, sizeof out, "list --plugin '%s'", file), 2);
        kbt_msg_has(out, why[i]);
        assert_int_equal(kbt_kbcl(out, sizeof out, "sweep --plugin '%s' nothing.yaml", file), 2);
        kbt_msg_has(out, why[i]);
    }
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --plugin"), 2);
}

static void test_cli_run_and_list(void **state)
{
    char out[16384];
    int rc;
    (void)state;
    rc = kbt_kbcl(out, sizeof out, "list --plugin '%s'", example);
    if (rc != 0)
        fail_msg("%s", out);
    kbt_msg_has(out, "  my_ring                  all_reduce     ring passing f32 running sums");
    kbt_msg_has(out, "[plugin my_ring]");
    kbt_msg_has(out, "      rank = PE algorithm   my_ring\n");
    kbt_msg_has(out, "      bench                 my_scale\n");
    rc = kbt_kbcl(out, sizeof out, "run --plugin '%s' --bench ccl --algorithm my_ring "
                  "--world-size 12 --size 64K --device ref --verify-data", example);
    if (rc != 0)
        fail_msg("%s", out);
    kbt_msg_has(out, "  my_ring (ws=12): 12 OK\n");
    /* KBCL_PLUGIN_PATH: the folder of the example */
    {
        char dir[1100];
        snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(example, '/') - example), example);
        setenv("KBCL_PLUGIN_PATH", dir, 1);
        rc = kbt_kbcl(out, sizeof out, "run --bench my_scale --verify-data --quiet");
        unsetenv("KBCL_PLUGIN_PATH");
        if (rc != 0)
            fail_msg("%s", out);
        kbt_msg_has(out, "  my_scale (32x64 f16 over 4 PEs): OK\n");
    }
    /* without the plugin the names are unknown */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench my_scale"), 2);
}

/* A sweep file with plugins: (relative to it) over a grid: every row ok. */
static void test_cli_sweep(void **state)
{
    char out[16384], cmd[2600];
    char *rows;
    int rc, nrows = 0;
    (void)state;
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/plug' && ln -sf '%s' '%s/plug/libmy_ring.so'",
             kbt_workdir(), example, kbt_workdir());
    assert_int_equal(system(cmd), 0);
    kbt_write_file("sw.yaml", "bench: ccl\n"
                              "plugins: [plug/libmy_ring.so]\n"
                              "algorithm: my_ring\n"
                              "verify: true\n"
                              "grid:\n"
                              "  world_size: [3, 8, 12]\n"
                              "  size: [2K, 64K]\n");
    rc = kbt_kbcl(out, sizeof out, "sweep sw.yaml --jobs 2 --out sw.csv --quiet");
    if (rc != 0)
        fail_msg("%s", out);
    rows = kbt_slurp("sw.csv");
    assert_non_null(rows);
    for (char *l = strchr(rows, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        nrows++;
        if (!strstr(l + 1, ",true,ok,"))
            fail_msg("row %d is not ok: %s", nrows, l + 1);
    }
    assert_int_equal(nrows, 6);
    free(rows);
    /* a plugin of the sweep file that is missing: an error at its line */
    kbt_write_file("bad.yaml", "bench: ccl\nplugins:\n  - plug/nothere.so\ngrid:\n"
                               "  world_size: [3]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml"), 2);
    kbt_msg_has(out, "bad.yaml:3:5: plugins: plug/nothere.so: cannot load plugin");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_and_unload),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_older_entry),
        cmocka_unit_test(test_load_list),
        cmocka_unit_test(test_jobs),
        cmocka_unit_test(test_ccl_yaml_plugins),
        cmocka_unit_test(test_cli_refusals),
        cmocka_unit_test(test_cli_run_and_list),
        cmocka_unit_test(test_cli_sweep),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
