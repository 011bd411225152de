/*
 * End-to-end tests of `kbcl sweep` and `kbcl report` through the real binary ($KBCL_BIN, set
 * by CTest): the rows and their values, --jobs 2 against --jobs 1, JSON Lines, config-key
 * axes, exclude:, error rows and exit codes, kill -9 / SIGINT mid-sweep then --resume, the
 * repair of a partial last row, sweep-file errors naming file:line, the bound columns
 * (bound_ns, efficiency, bound_resource) against `kbcl run --json`, and the HTML report.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kb_ccl.h"
#include "kb_cli.h"
#include "kb_test_util.h"

static int count_lines(const char *text)
{
    int n = 0;
    for (; *text; text++)
        n += *text == '\n';
    return n;
}

static int count_str(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/*
 * The rows of a CSV result without the wall_ms column (the only one that differs between
 * identical runs), sorted by point, one "\n"-terminated line each (malloc'd). Fields before
 * wall_ms never hold commas, so cutting at commas is exact there.
 */
static char *canonical_rows(const char *name, int *nrows)
{
    char *text = kbt_slurp(name), *line, *nl, *out;
    char **rows;
    int wall = -1, n = 0, cap = count_lines(text ? text : "") + 1;
    size_t len = 0;

    assert_non_null(text);
    rows = calloc((size_t)cap, sizeof *rows);
    out = calloc(strlen(text) + 1, 1);
    assert_true(rows && out);
    for (line = text; (nl = strchr(line, '\n')); line = nl + 1) {
        char *f = line, *cut_from, *cut_to;
        int col = 0;
        *nl = 0;
        if (wall < 0) { /* header */
            for (char *c = line; c; col++) {
                if (!strncmp(c, "wall_ms,", 8))
                    wall = col;
                if ((c = strchr(c, ',')))
                    c++;
            }
            assert_true(wall > 0);
            continue;
        }
        for (col = 0; col < wall; col++) {
            f = strchr(f, ',');
            assert_non_null(f);
            f++;
        }
        cut_from = f;
        cut_to = strchr(f, ',');
        assert_non_null(cut_to);
        memmove(cut_from, cut_to + 1, strlen(cut_to + 1) + 1);
        /* insertion by point index keeps the output sorted */
        {
            int j = n++;
            long p = strtol(line, NULL, 10);
            while (j > 0 && strtol(rows[j - 1], NULL, 10) > p) {
                rows[j] = rows[j - 1];
                j--;
            }
            rows[j] = line;
        }
    }
    for (int i = 0; i < n; i++)
        len += (size_t)sprintf(out + len, "%s\n", rows[i]);
    *nrows = n;
    free(rows);
    free(text);
    return out;
}

/* Asserts that no point index appears twice in the canonical rows. */
static void assert_unique_points(const char *rows, int n)
{
    long prev = -1;
    const char *l = rows;
    for (int i = 0; i < n; i++) {
        long p = strtol(l, NULL, 10);
        assert_true(p > prev);
        prev = p;
        l = strchr(l, '\n') + 1;
    }
}

/* 2 algorithms x 2 world sizes x 1 tile size: points 0..3 in file order. */
static const char *small_yaml =
    "# test sweep\n"
    "bench: ccl_allreduce\n"
    "device: ref\n"
    "verify: true\n"
    "grid:\n"
    "  algorithm: [ring_allreduce_tcm, ring_rsag_allreduce]\n"
    "  world_size: [8, 16]\n"
    "  n_elem: [16]\n";

/* 8 points; the world_size 64 ones take long enough to be interrupted. */
static const char *long_yaml =
    "bench: ccl_allreduce\n"
    "verify: true\n"
    "algorithm: ring_allreduce_hbm\n"
    "grid:\n"
    "  n_elem: [8, 16, 32, 64]\n"
    "  world_size: [8, 64]\n";

static int setup(void **s)
{
    (void)s;
    assert_int_equal(kbt_workdir_make("kbcl_test_sweep"), 0);
    kbt_write_file("small.yaml", small_yaml);
    kbt_write_file("long.yaml", long_yaml);
    return 0;
}

static int teardown(void **s)
{
    (void)s;
    return kbt_workdir_remove();
}

/* sim_time_ns and events of one `kbcl run`, printed as the sweep prints them. */
static void run_one(const char *args, char *sim, size_t n, char *events, size_t m)
{
    char out[4096];
    char *json;
    cJSON *j;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run %s --json one.json --quiet", args), 0);
    json = kbt_slurp("one.json");
    j = cJSON_Parse(json);
    assert_non_null(j);
    snprintf(sim, n, "%.12g", cJSON_GetObjectItem(j, "sim_time_ns")->valuedouble);
    snprintf(events, m, "%.0f", cJSON_GetObjectItem(j, "events")->valuedouble);
    cJSON_Delete(j);
    free(json);
}

/* The roofline of the last run_one (its one.json) as the sweep prints it: roofline_ns,
 * roofline_bound, roofline_efficiency, comma-separated. */
static void last_roofline(char *out, size_t n)
{
    char *json = kbt_slurp("one.json");
    cJSON *j = cJSON_Parse(json);
    assert_non_null(j);
    snprintf(out, n, "%.12g,%s,%.12g", cJSON_GetObjectItem(j, "roofline_ns")->valuedouble,
             cJSON_GetObjectItem(j, "roofline_bound")->valuestring,
             cJSON_GetObjectItem(j, "roofline_efficiency")->valuedouble);
    cJSON_Delete(j);
    free(json);
}

/*
 * The value of column `name` of a CSV row, by the file's header line: the fields before error
 * hold no commas or quotes in these tests, so cutting at commas is exact.
 */
static void csv_field(const char *header, const char *row, const char *name, char *out,
                      size_t n)
{
    const char *h = header, *eol = strchr(header, '\n'), *f = row, *end;
    size_t len = strlen(name);
    int col = -1;
    for (int i = 0; h && h < eol; i++) {
        if (!strncmp(h, name, len) && (h[len] == ',' || h[len] == '\n')) {
            col = i;
            break;
        }
        if ((h = strchr(h, ',')))
            h++;
    }
    if (col < 0)
        fail_msg("no column '%s' in %.*s", name, (int)(eol - header), header);
    for (int i = 0; i < col; i++) {
        f = strchr(f, ',');
        assert_non_null(f);
        f++;
    }
    end = f + strcspn(f, ",\n");
    snprintf(out, n, "%.*s", (int)(end - f), f);
}

/* The bound of one `kbcl run --json`: bound_ns and efficiency as the sweep prints numbers
 * (%.12g), its resource, and the numbers themselves. */
static void run_bound(const char *args, char *bound, char *eff, char *res, size_t n,
                      double *bound_v, double *eff_v)
{
    char out[4096];
    char *json;
    cJSON *j, *b, *e, *r;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run %s --json one.json --quiet", args), 0);
    json = kbt_slurp("one.json");
    j = cJSON_Parse(json);
    assert_non_null(j);
    b = cJSON_GetObjectItem(j, "bound_ns");
    e = cJSON_GetObjectItem(j, "efficiency");
    r = cJSON_GetObjectItem(j, "bound_resource");
    assert_true(cJSON_IsNumber(b) && cJSON_IsNumber(e) && cJSON_IsString(r));
    snprintf(bound, n, "%.12g", b->valuedouble);
    snprintf(eff, n, "%.12g", e->valuedouble);
    snprintf(res, n, "%s", r->valuestring);
    *bound_v = b->valuedouble;
    *eff_v = e->valuedouble;
    cJSON_Delete(j);
    free(json);
}

static void test_rows(void **s)
{
    char out[8192], sim[64], ev[64], want[256], roof[128];
    char *csv;
    int n;
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out r1.csv --jobs 1"), 0);
    assert_non_null(strstr(out, "4 points: 4 ok, 0 failed verification, 0 errors"));
    assert_int_equal(count_str(out, "verified"), 4); /* one plain line per point (no TTY) */
    csv = kbt_slurp("r1.csv");
    assert_non_null(csv);
    assert_int_equal(count_lines(csv), 5);
    assert_int_equal(strncmp(csv, "point,algorithm,world_size,n_elem,bench,size_bytes,"
                             "sim_time_ns,algbw_gbps,busbw_gbps,bound_ns,efficiency,"
                             "bound_resource,events,wall_ms,verified,status,error,roofline_ns,"
                             "roofline_bound,roofline_efficiency\n",
                             strlen("point,algorithm,world_size,n_elem,bench,size_bytes,"
                                    "sim_time_ns,algbw_gbps,busbw_gbps,bound_ns,efficiency,"
                                    "bound_resource,events,wall_ms,verified,status,error,"
                                    "roofline_ns,roofline_bound,roofline_efficiency\n")),
                     0);
    free(csv);
    csv = canonical_rows("r1.csv", &n);
    assert_int_equal(n, 4);
    /* every point: its keys, verified, ok, and the same numbers as `kbcl run` */
    {
        static const char *const alg[4] = { "ring_allreduce_tcm", "ring_allreduce_tcm",
                                             "ring_rsag_allreduce", "ring_rsag_allreduce" };
        static const int ws[4] = { 8, 16, 8, 16 };
        const char *l = csv;
        for (int i = 0; i < 4; i++) {
            char args[256], prefix[128];
            snprintf(args, sizeof args, "--bench ccl_allreduce --algorithm %s --world-size %d "
                     "--n-elem 16 --verify-data", alg[i], ws[i]);
            run_one(args, sim, sizeof sim, ev, sizeof ev);
            /* size_bytes: 16 f16 elements */
            snprintf(prefix, sizeof prefix, "%d,%s,%d,16,ccl_allreduce,32,%s,", i, alg[i], ws[i],
                     sim);
            assert_int_equal(strncmp(l, prefix, strlen(prefix)), 0);
            last_roofline(roof, sizeof roof);
            snprintf(want, sizeof want, ",%s,true,ok,,%s\n", ev, roof);
            l = strchr(l, '\n') + 1;
            assert_int_equal(strncmp(l - strlen(want), want, strlen(want)), 0);
        }
    }
    free(csv);
}

static void test_jobs2_equals_jobs1(void **s)
{
    char out[8192];
    char *a, *b;
    int na, nb;
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out j1.csv --jobs 1 --quiet"),
                     0);
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out j2.csv --jobs 2 --quiet"),
                     0);
    assert_null(strstr(out, "kbcl sweep")); /* --quiet: no progress, no summary */
    assert_null(strstr(out, "point "));
    a = canonical_rows("j1.csv", &na);
    b = canonical_rows("j2.csv", &nb);
    assert_int_equal(na, 4);
    assert_int_equal(nb, 4);
    assert_string_equal(a, b);
    free(a);
    free(b);
}

static void test_jsonl(void **s)
{
    char out[8192];
    char *text, *line, *nl;
    int n = 0;
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out r.jsonl --jobs 2 --quiet"),
                     0);
    text = kbt_slurp("r.jsonl");
    assert_non_null(text);
    assert_int_equal(count_lines(text), 4);
    for (line = text; (nl = strchr(line, '\n')); line = nl + 1) {
        cJSON *r;
        int p;
        *nl = 0;
        r = cJSON_Parse(line);
        assert_non_null(r);
        p = cJSON_GetObjectItem(r, "point")->valueint;
        assert_true(p >= 0 && p < 4);
        assert_string_equal(cJSON_GetObjectItem(r, "algorithm")->valuestring,
                            p < 2 ? "ring_allreduce_tcm" : "ring_rsag_allreduce");
        assert_int_equal(cJSON_GetObjectItem(r, "world_size")->valueint, p % 2 ? 16 : 8);
        assert_int_equal(cJSON_GetObjectItem(r, "n_elem")->valueint, 16);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "verified")));
        assert_string_equal(cJSON_GetObjectItem(r, "status")->valuestring, "ok");
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(r, "error")));
        assert_true(cJSON_GetObjectItem(r, "busbw_gbps")->valuedouble > 0);
        n |= 1 << p;
        cJSON_Delete(r);
    }
    assert_int_equal(n, 0xf); /* each point exactly once */
    free(text);
}

/* A config key as an axis reaches the run: each row equals `kbcl run --set KEY=VALUE`. */
static void test_config_axis_and_exclude(void **s)
{
    char out[8192], sim[64], ev[64], prefix[128];
    char *rows;
    const char *l;
    int n;
    (void)s;
    kbt_write_file("cfg.yaml", "algorithm: ring_allreduce_tcm\n"
                               "world_size: 8\n"
                               "n_elem: 16\n"
                               "grid:\n"
                               "  ccl.defaults.n_slots: [1, 4]\n"
                               "  buffer_kind: [tcm, hbm]\n"
                               "exclude:\n"
                               "  - {ccl.defaults.n_slots: 4, buffer_kind: hbm}\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep cfg.yaml --out cfg.csv --quiet"), 0);
    rows = canonical_rows("cfg.csv", &n);
    assert_int_equal(n, 3); /* 2 x 2 minus the excluded point; indices stay contiguous */
    l = rows;
    {
        static const char *const slots[3] = { "1", "1", "4" };
        static const char *const kind[3] = { "tcm", "hbm", "tcm" };
        for (int i = 0; i < 3; i++) {
            char args[256];
            snprintf(args, sizeof args, "--algorithm ring_allreduce_tcm --world-size 8 "
                     "--n-elem 16 --buffer-kind %s --set ccl.defaults.n_slots=%s", kind[i],
                     slots[i]);
            run_one(args, sim, sizeof sim, ev, sizeof ev);
            snprintf(prefix, sizeof prefix, "%d,%s,%s,ccl_allreduce,32,%s,", i, slots[i],
                     kind[i], sim);
            assert_int_equal(strncmp(l, prefix, strlen(prefix)), 0);
            l = strchr(l, '\n') + 1;
        }
    }
    free(rows);
}

/* A failing point is a row with its error, not a crash; the sweep exits 3. */
static void test_error_row(void **s)
{
    char out[8192];
    char *csv;
    (void)s;
    kbt_write_file("err.yaml", "algorithm: mesh_allreduce_4\n"
                               "n_elem: 16\n"
                               "grid:\n"
                               "  world_size: [4, 12]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep err.yaml --out err.csv --jobs 2"), 3);
    assert_non_null(strstr(out, "2 points: 1 ok, 0 failed verification, 1 errors"));
    csv = kbt_slurp("err.csv");
    assert_int_equal(count_lines(csv), 3);
    {
        /* point 1: no numbers and no bound (size_bytes .. wall_ms, verified empty), the
         * error's code name (the ccl layer picks it), its message */
        const char *row = strstr(csv, "\n1,12,ccl_allreduce,,,,,,,,,,,");
        assert_non_null(row);
        row += strlen("\n1,12,ccl_allreduce,,,,,,,,,,,");
        assert_true(strncmp(row, "ok,", 3) != 0 && strchr(row, ',') - row >= 2);
        /* the message has a comma: CSV-quoted */
        assert_non_null(strstr(row, ",\"mesh_allreduce needs a square world size, got 12\""
                                    ",,,\n")); /* and no roofline */
    }
    free(csv);
    /* --resume keeps the error row (it is a result) and exits 3 again without running */
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep err.yaml --out err.csv --resume"), 3);
    assert_non_null(strstr(out, "2 points, 0 to run"));
    csv = kbt_slurp("err.csv");
    assert_int_equal(count_lines(csv), 3);
    free(csv);
}

/*
 * OpenCL points run in device workers that keep their backend from point to point, mixed with
 * one-point workers for ref points: every row is verified, and each configuration gives the
 * same simulated time and events on both devices (rows ordered device-fastest). A device that
 * does not exist makes every one of its points an error row (the worker answers each).
 */
static void test_device_workers(void **s)
{
    char out[8192];
    char *rows, *l;
    int n;
    (void)s;
    if (kbt_kbcl(out, sizeof out, "devices") != 0 || !strstr(out, "[CPU]"))
        skip();
    kbt_write_file("dev.yaml", "bench: ccl_allreduce\n"
                               "verify: true\n"
                               "n_elem: 16\n"
                               "grid:\n"
                               "  algorithm: [ring_allreduce_tcm, ring_rsag_allreduce]\n"
                               "  world_size: [8, 16]\n"
                               "  device: [ref, cpu]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep dev.yaml --out dev.csv --jobs 2"), 0);
    assert_non_null(strstr(out, "8 points: 8 ok, 0 failed verification, 0 errors"));
    rows = canonical_rows("dev.csv", &n);
    assert_int_equal(n, 8);
    l = rows;
    for (int i = 0; i < 4; i++) {
        /* "point,algorithm,world_size,device,bench,size_bytes,sim,...": compare from bench on */
        char *r1 = l, *r2 = strchr(r1, '\n') + 1;
        l = strchr(r2, '\n') + 1;
        const char *a = strstr(r1, ",ref,ccl_allreduce,"), *b = strstr(r2, ",cpu,ccl_allreduce,");
        assert_non_null(a);
        assert_non_null(b);
        a += strlen(",ref");
        b += strlen(",cpu");
        assert_int_equal(strncmp(a, b, (size_t)(strchr(a, '\n') - a)), 0);
        assert_non_null(strstr(r1, ",true,ok,"));
    }
    free(rows);
    /* a point too large for its device is a row that says so (status nofit, the bytes in
     * its message), not an error: the sweep exits 0 and counts it apart */
    kbt_write_file("fit.yaml", "bench: ccl_allreduce\n"
                               "verify: true\n"
                               "device: cpu\n"
                               "algorithm: ring_rsag_allreduce\n"
                               "world_size: 256\n"
                               "grid:\n"
                               "  size: [1K, 1G]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep fit.yaml --out fit.csv"), 0);
    kbt_msg_has(out, "2 points: 1 ok, 0 failed verification, 0 errors, 1 too large for the "
                     "device");
    char *fit = kbt_slurp("fit.csv");
    assert_int_equal(count_lines(fit), 3);
    assert_int_equal(count_str(fit, ",true,ok,"), 1);
    assert_int_equal(count_str(fit, ",nofit,\"tensor 'tiles': the run's tensors need "), 1);
    free(fit);
    /* --resume counts the row as it was */
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep fit.yaml --out fit.csv --resume"), 0);
    kbt_msg_has(out, "2 points: 1 ok, 0 failed verification, 0 errors, 1 too large for the "
                     "device (2 from earlier runs)");
    kbt_kbcl(out, sizeof out, "devices");
    if (strstr(out, "[GPU]"))
        return;
    kbt_write_file("nogpu.yaml", "bench: ccl_allreduce\n"
                                 "device: gpu\n"
                                 "n_elem: 16\n"
                                 "algorithm: ring_allreduce_tcm\n"
                                 "grid:\n"
                                 "  world_size: [8, 16, 32]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep nogpu.yaml --out nogpu.csv --jobs 2"), 3);
    assert_non_null(strstr(out, "3 points: 0 ok, 0 failed verification, 3 errors"));
    char *csv = kbt_slurp("nogpu.csv");
    assert_int_equal(count_lines(csv), 4);
    assert_int_equal(count_str(csv, ",device,no OpenCL GPU device"), 3);
    free(csv);
}

static pid_t spawn_sweep(const char *args)
{
    char cmd[2048];
    pid_t pid;
    snprintf(cmd, sizeof cmd, "exec '%s' %s >/dev/null 2>&1", kbt_kbcl_bin(), args);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (chdir(kbt_workdir()) != 0)
            _exit(127);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits until name holds at least `lines` complete lines (or 120 s pass). */
static void wait_lines(const char *name, int lines)
{
    struct timespec ts = { 0, 2000000 };
    for (int i = 0; i < 60000; i++) {
        char *t = kbt_slurp(name);
        int n = t ? count_lines(t) : 0;
        free(t);
        if (n >= lines)
            return;
        nanosleep(&ts, NULL);
    }
    fail_msg("%s never reached %d lines", name, lines);
}

static void test_kill9_then_resume(void **s)
{
    char out[8192];
    char *ref, *got, *t;
    int nref, ngot, st;
    pid_t pid;
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep long.yaml --out ref.csv --jobs 2 --quiet"),
                     0);
    ref = canonical_rows("ref.csv", &nref);
    assert_int_equal(nref, 8);

    pid = spawn_sweep("sweep long.yaml --out k.csv --jobs 1");
    wait_lines("k.csv", 2); /* the header and the first row */
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    t = kbt_slurp("k.csv");
    assert_true(count_lines(t) >= 2);
    free(t);
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep long.yaml --out k.csv --resume --jobs 1"), 0);
    got = canonical_rows("k.csv", &ngot);
    assert_int_equal(ngot, 8);
    assert_unique_points(got, ngot);
    assert_string_equal(got, ref);
    free(got);

    /* SIGINT: the sweep stops, exits 130 with whole rows only, and resumes the same way */
    pid = spawn_sweep("sweep long.yaml --out i.csv --jobs 2");
    wait_lines("i.csv", 2);
    kill(pid, SIGINT);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 130);
    t = kbt_slurp("i.csv");
    assert_true(strlen(t) > 0 && t[strlen(t) - 1] == '\n');
    free(t);
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep long.yaml --out i.csv --resume --jobs 2"), 0);
    got = canonical_rows("i.csv", &ngot);
    assert_int_equal(ngot, 8);
    assert_string_equal(got, ref);
    free(got);
    free(ref);
}

/* A row cut short (what kill -9 during a write leaves) is removed and its point rerun. */
static void test_partial_last_line(void **s)
{
    char out[8192];
    char *full, *ref, *got;
    size_t len;
    int nref, ngot;
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out p.csv --quiet"), 0);
    ref = canonical_rows("p.csv", &nref);
    full = kbt_slurp("p.csv");
    len = strlen(full);
    full[len - 9] = 0; /* the last row loses its tail and its newline */
    kbt_write_file("p.csv", full);
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out p.csv --resume"), 0);
    assert_non_null(strstr(out, "removed a partial last row"));
    assert_non_null(strstr(out, "4 points, 1 to run"));
    got = canonical_rows("p.csv", &ngot);
    assert_int_equal(ngot, 4);
    assert_string_equal(got, ref);
    free(got);
    free(full);

    /* a cut header is removed too and the sweep starts over */
    kbt_write_file("p.csv", "point,algo");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out p.csv --resume --quiet"), 0);
    got = canonical_rows("p.csv", &ngot);
    assert_string_equal(got, ref);
    free(got);
    free(ref);
}

static void test_sweep_file_errors(void **s)
{
    char out[8192];
    (void)s;
    kbt_write_file("bad.yaml",
                   "bench: ccl_allreduce\ngrid:\n  algorithm: [ring_allreduce_tcm, x\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    assert_non_null(strstr(out, "bad.yaml:4:1: YAML syntax error"));
    kbt_write_file("bad.yaml",
                   "bench: ccl_allreduce\ngrid:\n  algorithm: [ring_allreduce_tcm, nosuch]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    assert_non_null(strstr(out, "bad.yaml:3:35: algorithm: no entry 'nosuch' in ccl.yaml"));
    kbt_write_file("bad.yaml", "verify: true\nworld_sizes: [8]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml"), 2);
    assert_non_null(strstr(out, "bad.yaml:2:1: unknown key 'world_sizes'"));
    kbt_write_file("bad.yaml", "grid:\n  system.sips.count: [1, two]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml"), 2);
    assert_non_null(strstr(out, "bad.yaml:2:26: "));
    assert_non_null(strstr(out, "system.sips.count"));
    kbt_write_file("bad.yaml", "grid:\n  n_elem: [8]\nexclude:\n  - {world_size: 8}\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml"), 2);
    assert_non_null(strstr(out, "bad.yaml:4:6: exclude: 'world_size' is not an axis"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --resume"), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep missing.yaml"), 2);
    assert_non_null(strstr(out, "missing.yaml: cannot open"));
    /* --resume refuses a file written by a different grid */
    kbt_write_file("other.csv", "point,algorithm,world_size,n_elem,bench,size_bytes,sim_time_ns,"
                                "algbw_gbps,busbw_gbps,bound_ns,efficiency,bound_resource,events,"
                                "wall_ms,verified,status,error,roofline_ns,roofline_bound,"
                                "roofline_efficiency\n"
                                "1,ring_allreduce_tcm,64,16,ccl_allreduce,32,1,1,1,1,1,pcie sip0,"
                                "1,1,true,ok,,1,comm,1\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out other.csv --resume"), 2);
    assert_non_null(strstr(out, "other.csv:2: point 1 has world_size=64"));
    /* a key twice in one map is an error at the second, as in every other kbcl file */
    kbt_write_file("dup.yaml", "bench: ccl_allreduce\nbench: gemm\ngrid:\n  n_elem: [16]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep dup.yaml --out dup.csv"), 2);
    kbt_msg_has(out, "dup.yaml:2:1: duplicate key 'bench' (first at line 1)");
    kbt_write_file("dup.yaml", "bench: ccl_allreduce\ngrid:\n  n_elem: [16]\nset:\n"
                               "  system.sips.count: 2\n  system.sips.count: 4\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep dup.yaml --out dup.csv"), 2);
    kbt_msg_has(out, "dup.yaml:6:3: set: duplicate key 'system.sips.count' (first at line 5)");
    kbt_write_file("dup.yaml", "bench: gemm\ngrid:\n  world_size: [1]\nparams:\n  m: 16\n"
                               "  m: 32\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep dup.yaml --out dup.csv"), 2);
    kbt_msg_has(out, "dup.yaml:6:3: params: duplicate key 'm' (first at line 5)");
    /* a bench without a collective takes none of its axes or keys */
    kbt_write_file("g_ws.yaml", "bench: gemm\ngrid:\n  world_size: [1, 2]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep g_ws.yaml --out g_ws.csv"), 2);
    kbt_msg_has(out, "g_ws.yaml:3:16: world_size: bench 'gemm' runs no collective and takes "
                     "no world_size (its options are params: and param.NAME axes; kbcl list "
                     "shows them)");
    kbt_write_file("g_alg.yaml", "bench: gemm\nalgorithm: ring_allreduce_tcm\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep g_alg.yaml --out g_alg.csv"), 2);
    kbt_msg_has(out, "g_alg.yaml:2:12: algorithm: bench 'gemm' runs no collective");
}

/* The exit status of `kbcl sweep FILE --out OUT`, its messages in out, and that OUT is left
 * as it was: absent, or byte for byte what it held. */
static int sweep_refused(char *out, size_t n, const char *file, const char *out_file,
                         const char *before)
{
    int rc = kbt_kbcl(out, n, "sweep %s --out %s", file, out_file);
    char *after = kbt_slurp(out_file);
    if (before) {
        assert_non_null(after);
        assert_string_equal(after, before);
    } else {
        assert_null(after);
    }
    free(after);
    return rc;
}

/*
 * What `kbcl run` would refuse before it simulates is refused for every point before the first
 * one runs (exit 2, the point named by its number and axis values), and the output is not
 * created, or not touched: a point that only a combination of values breaks (here the last
 * one's machine is too small for the entry's world size), a model file that does not load, a
 * parameter value out of its range.
 */
static void test_points_checked_first(void **s)
{
    char out[8192];
    const char *keep = "point,system.sips.count,n_elem,bench\n0,2,8,ccl_allreduce\n";
    (void)s;
    kbt_write_file("pc_late.yaml", "bench: ccl_allreduce\n"
                                "device: none\n"
                                "algorithm: ring_allreduce_tcm\n"
                                "grid:\n"
                                "  system.sips.count: [4, 2, 1]\n"
                                "  n_elem: [8, 16]\n");
    assert_int_equal(sweep_refused(out, sizeof out, "pc_late.yaml", "pc_late.csv", NULL), 2);
    kbt_msg_has(out, "kbcl sweep: pc_late.yaml: point 4 of 6 (system.sips.count=1, n_elem=8) "
                     "cannot run, so no point was run: ring_allreduce_tcm: world_size = 256 "
                     "exceeds the machine's 128 PEs (system.sips.count * cubes * PEs per "
                     "cube)\n");
    assert_null(strstr(out, "[1/6]"));
    kbt_write_file("pc_late.csv", keep);
    assert_int_equal(sweep_refused(out, sizeof out, "pc_late.yaml", "pc_late.csv", keep), 2);
    kbt_msg_has(out, "point 4 of 6 (system.sips.count=1, n_elem=8) cannot run");
    /* --resume reads the file only after every point passed */
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep pc_late.yaml --out pc_late.csv --resume"), 2);
    kbt_msg_has(out, "point 4 of 6 (system.sips.count=1, n_elem=8) cannot run");
    char *after = kbt_slurp("pc_late.csv");
    assert_string_equal(after, keep);
    free(after);

    /* the model file is every point's: a missing key is an error where the file names it */
    kbt_write_file("pc_cut.yaml", "model:\n  name: cut\n  d_model: 64\n  n_heads: 4\n"
                               "  n_kv_heads: 2\n  head_dim: 16\n");
    kbt_write_file("pc_m.yaml", "bench: decoder_layer\n"
                             "device: none\n"
                             "model: pc_cut.yaml\n"
                             "grid:\n"
                             "  system.sips.count: [1, 2]\n");
    assert_int_equal(sweep_refused(out, sizeof out, "pc_m.yaml", "pc_m.csv", NULL), 2);
    kbt_msg_has(out, "kbcl sweep: pc_m.yaml:3:8: model: ");
    kbt_msg_has(out, "pc_cut.yaml: model.mlp_hidden is missing: a model file names the layer's "
                     "shape");
    kbt_write_file("pc_m.yaml", "bench: decoder_layer\n"
                             "device: none\n"
                             "model: nosuch.yaml\n"
                             "grid:\n"
                             "  system.sips.count: [1, 2]\n");
    assert_int_equal(sweep_refused(out, sizeof out, "pc_m.yaml", "pc_m.csv", NULL), 2);
    kbt_msg_has(out, "kbcl sweep: pc_m.yaml:3:8: model: ");
    kbt_msg_has(out, "nosuch.yaml: cannot open: No such file or directory");
    kbt_write_file("pc_m.yaml", "bench: decoder_layer\n"
                             "device: none\n"
                             "grid:\n"
                             "  system.sips.count: [1, 2]\n");
    assert_int_equal(sweep_refused(out, sizeof out, "pc_m.yaml", "pc_m.csv", NULL), 2);
    kbt_msg_has(out, "kbcl sweep: pc_m.yaml:1:8: bench 'decoder_layer' needs a model file "
                     "(model: FILE, e.g. ../models/gemma2-2b.yaml)");

    /* parameter values, in params: and on an axis, against their ranges */
    kbt_write_file("pc_p.yaml", "bench: gemm\n"
                             "device: none\n"
                             "grid:\n"
                             "  param.m: [64, 128, 0]\n");
    assert_int_equal(sweep_refused(out, sizeof out, "pc_p.yaml", "pc_p.csv", NULL), 2);
    kbt_msg_has(out, "kbcl sweep: pc_p.yaml:4:22: param.m = 0 is out of range [1, 65536]\n");
    kbt_write_file("pc_p.yaml", "bench: gemm\n"
                             "device: none\n"
                             "params:\n"
                             "  k: 70000\n"
                             "grid:\n"
                             "  param.m: [64]\n");
    assert_int_equal(sweep_refused(out, sizeof out, "pc_p.yaml", "pc_p.csv", NULL), 2);
    kbt_msg_has(out, "kbcl sweep: pc_p.yaml:4:6: params: k = 70000 is out of range [1, 65536]\n");
    /* a config value out of its range, floating-point included, says the range */
    kbt_write_file("pc_c.yaml", "bench: ccl_allreduce\n"
                             "device: none\n"
                             "grid:\n"
                             "  pe.dma.bandwidth_gbps: [64, 2e6]\n");
    assert_int_equal(sweep_refused(out, sizeof out, "pc_c.yaml", "pc_c.csv", NULL), 2);
    kbt_msg_has(out, "kbcl sweep: pc_c.yaml:4:31: --set pe.dma.bandwidth_gbps=2e6: "
                     "pe.dma.bandwidth_gbps = 2e6 is out of range [0.001, 1e6]\n");
    /* an output in a folder that does not exist, before anything runs */
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep pc_late.yaml --out /nonexistent/o.csv"), 2);
    kbt_msg_has(out, "kbcl sweep: pc_late.yaml: point 4 of 6");
    kbt_write_file("pc_ok.yaml", "bench: gemm\ndevice: none\ngrid:\n  param.m: [64]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep pc_ok.yaml --out /nonexistent/o.csv"), 2);
    kbt_msg_has(out, "kbcl sweep: --out /nonexistent/o.csv: cannot write it: its folder "
                     "/nonexistent: No such file or directory\n");
}

/*
 * configs/sweeps/allreduce-sizes.yaml: its size list is 8 B to 1 GiB in x4 steps (and the 1 GiB
 * end point); the file itself, with a size list that fits one IPCQ slot, runs: a size axis
 * whose rows carry size_bytes and equal `kbcl run --n-elem size/2`.
 */
/* op and dtype axes: every combination runs and verifies, in its own row; the f32 rows move
 * the same bytes with half the elements; an unknown value names the axis. */
static void test_op_dtype_axes(void **s)
{
    char out[8192];
    char *csv;
    (void)s;
    kbt_write_file("od.yaml", "bench: ccl\n"
                              "algorithm: ring_reducescatter\n"
                              "world_size: 5\n"
                              "size: 4K\n"
                              "verify: true\n"
                              "set:\n"
                              "  ccl.defaults.slot_size: 4096\n"
                              "grid:\n"
                              "  op: [sum, prod, max, min, avg]\n"
                              "  dtype: [f16, bf16, f32]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep od.yaml --out od.csv --jobs 2"), 0);
    assert_non_null(strstr(out, "15 points: 15 ok, 0 failed verification, 0 errors"));
    csv = kbt_slurp("od.csv");
    assert_int_equal(count_lines(csv), 16);
    assert_non_null(strstr(csv, "point,op,dtype,"));
    assert_non_null(strstr(csv, "\n14,avg,f32,ccl,"));
    free(csv);
    kbt_write_file("od2.yaml", "bench: ccl\nalgorithm: ring_reducescatter\nworld_size: 5\n"
                               "grid:\n  op: [sum, mean]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep od2.yaml --out od2.csv"), 2);
    assert_non_null(strstr(out, "op: unknown op 'mean' (sum, prod, max, min, avg)"));
}

/* Runs the shipped sweep configs/sweeps/<name> with --jobs 2 into `csv_out`, checks that all
 * `points` are ok, and returns the CSV (the caller frees it). Skips where the source tree is
 * not there. */
static char *run_shipped_sweep(const char *name, int points, const char *csv_out)
{
    char path[4096], out[16384], rel[128], want[96];
    snprintf(rel, sizeof rel, "configs/sweeps/%s", name);
    if (!kbt_source_path(rel, path, sizeof path))
        skip();
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep %s --jobs 2 --out %s", path, csv_out), 0);
    snprintf(want, sizeof want, "%d points: %d ok, 0 failed verification, 0 errors", points,
             points);
    if (!strstr(out, want))
        fail_msg("no '%s' in:\n%s", want, out);
    return kbt_slurp(csv_out);
}

/* configs/sweeps/collectives.yaml: 7 collectives x 10 sizes (1K .. 256M) on 256 ranks, every
 * point ok, and the report has one busbw-vs-size group per collective. */
static void test_collectives_sweep(void **s)
{
    static const char *const kinds[] = { "all_reduce", "all_gather", "reduce_scatter",
                                         "broadcast", "reduce", "all_to_all", "sendrecv" };
    char out[16384], want[160];
    char *html, *csv;
    (void)s;
    csv = run_shipped_sweep("collectives.yaml", 70, "coll.csv");
    assert_non_null(strstr(csv, ",pairwise_alltoall,256,256M,ccl,268435456,"));
    assert_non_null(strstr(csv, ",ring_allgather,256,1K,ccl,1024,"));
    free(csv);
    assert_int_equal(kbt_kbcl(out, sizeof out, "report coll.csv -o coll.html"), 0);
    html = kbt_slurp("coll.html");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        snprintf(want, sizeof want, "<h2 id=\"busbw-size-%s\">Bus bandwidth vs message size: "
                 "%s</h2>", kinds[k], kinds[k]);
        if (!strstr(html, want))
            fail_msg("no '%s' in the report", want);
    }
    assert_null(strstr(html, "<h2 id=\"busbw-size\">"));
    free(html);
}

/* configs/sweeps/switch-arbitration.yaml: 3 all-reduces x 4 sizes x both arbitrations on 8
 * SIPs of a torus, every point ok, with the two arbitrations' times of one point as they are
 * (timing-model.md 12 quotes the pair at 1 024 ranks; this is its 256-rank form). */
static void test_switch_arbitration_sweep(void **s)
{
    char *csv;
    (void)s;
    csv = run_shipped_sweep("switch-arbitration.yaml", 24, "sw.csv");
    assert_non_null(strstr(csv, ",ring_rsag_allreduce,16K,route,ccl,16384,654303.75,"));
    assert_non_null(strstr(csv, ",ring_rsag_allreduce,16K,per_sip,ccl,16384,396137.25,"));
    free(csv);
}

static void test_size_axis(void **s)
{
    char path[4096], out[16384], sim[64], ev[64], prefix[160];
    char *yaml, *line, *end, *copy, *rows;
    const char *l;
    int64_t want = 8;
    int n = 0, nrows;
    (void)s;
    if (!kbt_source_path("configs/sweeps/allreduce-sizes.yaml", path, sizeof path))
        skip();
    yaml = kbt_read_file(path);
    assert_non_null(strstr(yaml, "\ndevice: none\n"));
    assert_non_null(strstr(yaml, "\nworld_size: 256\n"));
    assert_non_null(strstr(yaml, "\n  algorithm: [ring_allreduce_tcm, ring_rsag_allreduce, "
                                 "tree_allreduce_7, hierarchical_allreduce]\n"));
    line = strstr(yaml, "\n  size: [");
    assert_non_null(line);
    line += strlen("\n  size: [");
    end = strstr(line, "]\n");
    assert_non_null(end);
    *end = 0;
    for (char *tok = strtok(line, ", "); tok; tok = strtok(NULL, ", ")) {
        int64_t v;
        assert_int_equal(kbcl_parse_size(tok, &v), 0);
        if (want > (INT64_C(1) << 30)) /* past 512M: the end point */
            want = INT64_C(1) << 30;
        if (v != want)
            fail_msg("size %d is %s = %lld, expected %lld", n, tok, (long long)v,
                     (long long)want);
        want *= 4;
        n++;
    }
    assert_int_equal(n, 15);
    free(yaml);

    /* the same file with sizes that fit one 4 KiB slot */
    yaml = kbt_read_file(path);
    line = strstr(yaml, "\n  size: [") + 1;
    end = strchr(line, '\n');
    copy = malloc(strlen(yaml) + 64);
    assert_non_null(copy);
    sprintf(copy, "%.*s  size: [8, 128, 1K]%s", (int)(line - yaml), yaml, end);
    kbt_write_file("sizes.yaml", copy);
    free(copy);
    free(yaml);
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep sizes.yaml --out sizes.csv --jobs 2"), 0);
    kbt_msg_has(out, "12 points: 12 ok");
    rows = kbt_slurp("sizes.csv");
    assert_int_equal(strncmp(rows, "point,algorithm,size,bench,size_bytes,sim_time_ns,", 50), 0);
    free(rows);
    rows = canonical_rows("sizes.csv", &nrows);
    assert_int_equal(nrows, 12);
    l = rows;
    {
        static const char *const alg[4] = { "ring_allreduce_tcm", "ring_rsag_allreduce",
                                             "tree_allreduce_7", "hierarchical_allreduce" };
        static const char *const size[3] = { "8", "128", "1K" };
        static const int bytes[3] = { 8, 128, 1024 };
        for (int i = 0; i < 12; i++) {
            const char *a = alg[i / 3];
            int k = i % 3;
            if (i == 4 || i == 9) { /* a few: the same numbers as --n-elem size/2 */
                char args[256];
                snprintf(args, sizeof args, "--algorithm %s --world-size 256 --n-elem %d "
                         "--device none", a, bytes[k] / 2);
                run_one(args, sim, sizeof sim, ev, sizeof ev);
                snprintf(prefix, sizeof prefix, "%d,%s,%s,ccl_allreduce,%d,%s,", i, a, size[k],
                         bytes[k], sim);
            } else {
                snprintf(prefix, sizeof prefix, "%d,%s,%s,ccl_allreduce,%d,", i, a, size[k],
                         bytes[k]);
            }
            if (strncmp(l, prefix, strlen(prefix)))
                fail_msg("row '%.*s' does not start with '%s'", (int)(strchr(l, '\n') - l), l,
                         prefix);
            assert_non_null(strstr(l, ",,ok,,")); /* not verified (device none), ok */
            l = strchr(l, '\n') + 1;
        }
    }
    free(rows);

    /* JSON Lines: size as written (a number when it is one), size_bytes a number */
    kbt_write_file("sz.yaml", "algorithm: ring_allreduce_tcm\nworld_size: 4\nverify: true\n"
                              "grid:\n  size: [64, 2K]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep sz.yaml --out sz.jsonl --quiet"), 0);
    rows = kbt_slurp("sz.jsonl");
    assert_non_null(strstr(rows, "\"size\":64,\"bench\":\"ccl_allreduce\",\"size_bytes\":64,"));
    assert_non_null(strstr(rows, "\"size\":\"2K\",\"bench\":\"ccl_allreduce\","
                                 "\"size_bytes\":2048,"));
    free(rows);

    /* errors at the place they are written, exit 2, nothing run */
    kbt_write_file("bad.yaml", "n_elem: 8\ngrid:\n  size: [16, 1K]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    kbt_msg_has(out, "bad.yaml:3:10: n_elem and size both give the message size: use one");
    kbt_write_file("bad.yaml", "grid:\n  n_elem: [8]\n  size: [16]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    kbt_msg_has(out, "bad.yaml:3:10: n_elem and size both give the message size");
    kbt_write_file("bad.yaml", "size: 16\ngrid:\n  n_elem: [8]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    kbt_msg_has(out, "bad.yaml:1:7: n_elem and size both give the message size");
    kbt_write_file("bad.yaml", "grid:\n  size: [16, 1Q]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    kbt_msg_has(out, "bad.yaml:2:14: size: '1Q': expected a positive number of bytes, "
                     "optionally with K, M or G");
    kbt_write_file("bad.yaml", "size: 15\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    kbt_msg_has(out, "bad.yaml:1:7: size: '15' is not a whole number of 2-byte elements");
    kbt_write_file("bad.yaml", "bench: gemm\ngrid:\n  size: [0]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    kbt_msg_has(out, "bad.yaml:3:10: size: '0': expected a positive number of bytes");
    kbt_write_file("bad.yaml", "bench: gemm\ngrid:\n  size: [16]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    kbt_msg_has(out, "bad.yaml:3:10: size: bench 'gemm' takes no size");
    kbt_write_file("bad.yaml", "grid:\n  sizes: [16]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep bad.yaml --out x.csv"), 2);
    kbt_msg_has(out, "grid: unknown axis 'sizes' (axes: algorithm, world_size, n_elem, size, ");
}

static void test_report(void **s)
{
    char out[8192];
    char *html, *again;
    (void)s;
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out rep.csv --quiet"), 0);
    assert_int_equal(kbt_kbcl(out, sizeof out, "report rep.csv -o rep.html"), 0);
    html = kbt_slurp("rep.html");
    assert_non_null(html);
    /* time, busbw and efficiency vs world size, one plot per message size (n_elem 16 = 32
     * bytes); the size takes one value, so nothing is plotted against it */
    assert_int_equal(count_str(html, "<svg "), 3);
    assert_int_equal(count_str(html, "sim time vs world size, size = 32 B"), 2); /* title, label */
    assert_int_equal(count_str(html, "busbw vs world size, size = 32 B"), 2);
    assert_int_equal(count_str(html, "efficiency vs world size, size = 32 B"), 2);
    assert_non_null(strstr(html, "<h2 id=\"efficiency\">Efficiency vs world size</h2>"));
    assert_null(strstr(html, "vs message size"));
    /* the legend of every plot names each algorithm (bound_resource is no series key) */
    assert_int_equal(count_str(html, "<g class=\"legend\">"), 6);
    assert_int_equal(count_str(html, "\">ring_allreduce_tcm</text></g>"), 3);
    assert_int_equal(count_str(html, "\">ring_rsag_allreduce</text></g>"), 3);
    /* every point of the time and busbw plots names its efficiency and bound */
    assert_int_equal(count_str(html, "; efficiency "), 8);
    assert_int_equal(count_str(html, "<th>efficiency</th>"), 1); /* the rows table */
    assert_int_equal(count_str(html, "<tr>"), 5); /* header + 4 rows */
    /* self-contained: nothing to run or fetch */
    assert_null(strstr(html, "<script"));
    assert_null(strstr(html, "src="));
    assert_null(strstr(html, "<link"));
    /* deterministic: rendering again (to the default name rep.html) gives the same bytes */
    assert_int_equal(kbt_kbcl(out, sizeof out, "report rep.csv"), 0);
    again = kbt_slurp("rep.html");
    assert_string_equal(html, again);
    free(again);
    assert_int_equal(kbt_kbcl(out, sizeof out, "report nosuch.csv -o x.html"), 2);
    free(html);
}

/*
 * A size sweep as nccl-tests users plot it: busbw and time against the message size on a
 * log2 axis labelled in B/KiB/MiB/GiB, one line per algorithm; with world sizes too, one
 * plot per world size (and per size for the world-size plots).
 */
static void test_report_sizes(void **s)
{
    char out[8192], want[512], eff[64], bound[64], res[128];
    char *html, *csv, *effplot;
    const char *row;
    (void)s;
    kbt_write_file("rs.yaml", "world_size: 8\n"
                              "grid:\n"
                              "  algorithm: [ring_allreduce_tcm, ring_rsag_allreduce]\n"
                              "  size: [64, 256, 1K, 4K]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep rs.yaml --out rs.csv --quiet"), 0);
    assert_int_equal(kbt_kbcl(out, sizeof out, "report rs.csv -o rs.html"), 0);
    html = kbt_slurp("rs.html");
    assert_non_null(html);
    /* no world_size column: busbw vs size, time vs size, then efficiency vs size */
    assert_int_equal(count_str(html, "<svg "), 3);
    assert_non_null(strstr(html, "<h2 id=\"busbw-size\">Bus bandwidth vs message size</h2>"));
    assert_non_null(strstr(html, "<h2 id=\"size\">Simulated time vs message size</h2>"));
    assert_non_null(strstr(html, "<h2 id=\"efficiency-size\">Efficiency vs message size</h2>"));
    assert_true(strstr(html, "aria-label=\"busbw vs message size\"") <
                strstr(html, "aria-label=\"sim time vs message size\""));
    assert_true(strstr(html, "aria-label=\"sim time vs message size\"") <
                strstr(html, "aria-label=\"efficiency vs message size\""));
    /* the x axis: its label (log2) and byte ticks */
    assert_int_equal(count_str(html, ">message size (bytes per rank) (log2 scale)</text>"), 3);
    assert_int_equal(count_str(html, "text-anchor=\"middle\">64 B</text>"), 3);
    assert_int_equal(count_str(html, "text-anchor=\"middle\">1 KiB</text>"), 3);
    assert_int_equal(count_str(html, "text-anchor=\"middle\">4 KiB</text>"), 3);
    assert_int_equal(count_str(html, ">busbw (GB/s)</text>"), 1);
    assert_int_equal(count_str(html, ">efficiency (bound / sim time)</text>"), 1);
    /* one line per algorithm in each plot, through its four sizes */
    assert_int_equal(count_str(html, "<polyline class=\"series\""), 6);
    assert_int_equal(count_str(html, "\">ring_allreduce_tcm</text></g>"), 3);
    assert_int_equal(count_str(html, "\">ring_rsag_allreduce</text></g>"), 3);
    /* the efficiency plot: a 0..1 axis (ticks 0, 0.2, ... 1), and point 2
     * (ring_allreduce_tcm, 1K) shows its row's efficiency, bound and resource; the other
     * plots' points name them too */
    row = strstr(html, "aria-label=\"efficiency vs message size\"");
    assert_non_null(row);
    effplot = strdup(row);
    *strstr(effplot, "</svg>") = 0;
    assert_non_null(strstr(effplot, "text-anchor=\"end\">0.2</text>"));
    assert_non_null(strstr(effplot, "text-anchor=\"end\">1</text>"));
    assert_null(strstr(effplot, "text-anchor=\"end\">1.2</text>"));
    csv = kbt_slurp("rs.csv");
    row = strstr(csv, "\n2,ring_allreduce_tcm,1K,") + 1;
    csv_field(csv, row, "efficiency", eff, sizeof eff);
    csv_field(csv, row, "bound_ns", bound, sizeof bound);
    csv_field(csv, row, "bound_resource", res, sizeof res);
    assert_true(strtod(eff, NULL) > 0 && strtod(eff, NULL) <= 1 && *res);
    snprintf(want, sizeof want, "<title>ring_allreduce_tcm: message size (bytes per rank) "
             "1 KiB, efficiency (bound / sim time) %.6g; bound %.6g ns by %s</title>",
             strtod(eff, NULL), strtod(bound, NULL), res);
    if (count_str(effplot, want) != 1)
        fail_msg("no '%s' in the efficiency plot", want);
    snprintf(want, sizeof want, "; efficiency %.3g (bound %.6g ns by %s)</title>",
             strtod(eff, NULL), strtod(bound, NULL), res);
    assert_true(count_str(html, want) >= 2); /* busbw and time at 1 KiB (others may match) */
    free(effplot);
    free(csv);
    assert_int_equal(count_str(html, "<title>ring_allreduce_tcm: message size (bytes per rank) "
                                     "1 KiB, busbw (GB/s) "), 1);
    assert_int_equal(count_str(html, "<title>ring_rsag_allreduce: message size (bytes per rank) "
                                     "4 KiB, sim time (us) "), 1);
    assert_int_equal(count_str(html, "<circle "), 24);
    free(html);

    /* world sizes too: busbw/time vs world size per size, busbw/time vs size per world size */
    kbt_write_file("rsw.yaml", "grid:\n"
                               "  algorithm: [ring_allreduce_tcm, ring_rsag_allreduce]\n"
                               "  world_size: [4, 8]\n"
                               "  size: [64, 1K]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep rsw.yaml --out rsw.jsonl --quiet"), 0);
    assert_int_equal(kbt_kbcl(out, sizeof out, "report rsw.jsonl -o rsw.html"), 0);
    html = kbt_slurp("rsw.html");
    assert_non_null(html);
    assert_int_equal(count_str(html, "<svg "), 12);
    assert_int_equal(count_str(html, "sim time vs world size, size = 64 B"), 2);
    assert_int_equal(count_str(html, "busbw vs world size, size = 1 KiB"), 2);
    assert_int_equal(count_str(html, "efficiency vs world size, size = 1 KiB"), 2);
    assert_int_equal(count_str(html, "busbw vs message size, world_size = 4"), 2);
    assert_int_equal(count_str(html, "sim time vs message size, world_size = 8"), 2);
    assert_int_equal(count_str(html, "efficiency vs message size, world_size = 8"), 2);
    assert_int_equal(count_str(html, "<polyline class=\"series\""), 24);
    free(html);

    /* rows from before size_bytes: the message size is n_elem, in elements */
    kbt_write_file("old.csv", "point,algorithm,n_elem,bench,sim_time_ns,algbw_gbps,busbw_gbps,"
                              "events,wall_ms,verified,status,error\n"
                              "0,a,8,ccl_allreduce,100,0.1,0.2,1,1,true,ok,\n"
                              "1,a,64,ccl_allreduce,200,0.4,0.8,1,1,true,ok,\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "report old.csv -o old.html"), 0);
    html = kbt_slurp("old.html");
    assert_int_equal(count_str(html, "<svg "), 2);
    assert_int_equal(count_str(html, ">n_elem (elements per rank) (log2 scale)</text>"), 2);
    assert_int_equal(count_str(html, "text-anchor=\"middle\">64</text>"), 2);
    assert_null(strstr(html, "fficiency")); /* no column: no plot, no tooltip part */
    free(html);
}

/*
 * Two collectives in one result (rows written here, no simulation): busbw against size is one
 * plot per collective, and each plot's legend names the series that plot draws, in their
 * color of every plot; the page defines algbw, busbw (with the factors kb_coll_busbw_factor
 * computed the rows' busbw with) and efficiency.
 */
static void test_report_legends_terms(void **s)
{
    static const char *const hdr =
        "point,algorithm,world_size,size,bench,size_bytes,sim_time_ns,algbw_gbps,busbw_gbps,"
        "bound_ns,efficiency,bound_resource,events,wall_ms,verified,status,error\n";
    char out[8192];
    char *html, *plot, *end;
    (void)s;
    {
        char text[2048];
        snprintf(text, sizeof text, "%s"
                 "0,ring_allreduce_tcm,4,1K,ccl,1024,1000,1.024,1.536,500,0.5,pcie sip0,10,1,,ok,\n"
                 "1,ring_allreduce_tcm,4,4K,ccl,4096,2000,2.048,3.072,1500,0.75,pcie sip0,10,1,,ok,\n"
                 "2,ring_allgather,4,1K,ccl,1024,1500,0.682667,0.512,300,0.2,pcie sip0,10,1,,ok,\n"
                 "3,ring_allgather,4,4K,ccl,4096,2500,1.6384,1.2288,1000,0.4,pcie sip0,10,1,,ok,\n",
                 hdr);
        kbt_write_file("two.csv", text);
    }
    assert_int_equal(kbt_kbcl(out, sizeof out, "report two.csv -o two.html"), 0);
    html = kbt_slurp("two.html");
    assert_non_null(html);
    /* busbw vs size per collective, then time and efficiency vs size with both */
    assert_int_equal(count_str(html, "<svg "), 4);
    assert_int_equal(count_str(html, "<g class=\"legend\">"), 6);
    assert_int_equal(count_str(html, "\">ring_allreduce_tcm</text></g>"), 3);
    assert_int_equal(count_str(html, "\">ring_allgather</text></g>"), 3);
    /* the all_gather plot: its one series, first in the legend, in its color of the plots
     * both series share (the second color), and a picture of the usual height */
    plot = strstr(html, "aria-label=\"all_gather busbw vs message size, world_size = 4\"");
    assert_non_null(plot);
    end = strstr(plot, "</svg>");
    *end = 0;
    assert_int_equal(count_str(plot, "<g class=\"legend\">"), 1);
    kbt_msg_has(plot, "<g class=\"legend\"><line x1=\"546\" y1=\"44\" x2=\"570\" y2=\"44\" "
                      "stroke=\"#d62728\" stroke-width=\"3\"/><text x=\"576\" y=\"48\">"
                      "ring_allgather</text></g>");
    kbt_msg_has(plot, "height=\"380\"");
    *end = '<';
    /* the terms, before the plots */
    assert_true(strstr(html, "<h2 id=\"terms\">Terms</h2>") < strstr(html, "<svg "));
    kbt_msg_has(html, "<dt><b>algbw</b> (GB/s)</dt><dd>algorithm bandwidth: size_bytes / "
                      "sim_time_ns");
    kbt_msg_has(html, "<dt><b>busbw</b> (GB/s)</dt><dd>bus bandwidth, nccl-tests' definition: "
                      "algbw &times; the bus factor of the algorithm's collective, for n ranks "
                      "(the world size): all_reduce 2(n-1)/n; all_gather, reduce_scatter, "
                      "all_to_all (n-1)/n; broadcast, reduce, sendrecv 1. ");
    kbt_msg_has(html, "<dt><b>efficiency</b> (a fraction, 0..1)</dt><dd>bound_ns / "
                      "sim_time_ns: ");
    /* the factors the page names are the ones the rows were computed with */
    for (int n = 2; n <= 256; n *= 2) {
        assert_true(kb_coll_busbw_factor(KB_COLL_ALLREDUCE, n) == 2.0 * (n - 1) / n);
        assert_true(kb_coll_busbw_factor(KB_COLL_ALLGATHER, n) == (n - 1.0) / n);
        assert_true(kb_coll_busbw_factor(KB_COLL_REDUCE_SCATTER, n) == (n - 1.0) / n);
        assert_true(kb_coll_busbw_factor(KB_COLL_ALLTOALL, n) == (n - 1.0) / n);
        assert_true(kb_coll_busbw_factor(KB_COLL_BROADCAST, n) == 1.0);
        assert_true(kb_coll_busbw_factor(KB_COLL_REDUCE, n) == 1.0);
        assert_true(kb_coll_busbw_factor(KB_COLL_SENDRECV, n) == 1.0);
    }
    free(html);
}

/*
 * bound_ns, efficiency and bound_resource: every row carries the bound `kbcl run --json`
 * reports for the same point, in CSV and in JSON Lines, empty (null) on an error row; a file
 * with this header resumes, one with the header from before the bound columns is refused
 * and left as it is.
 */
static void test_bound_columns(void **s)
{
    static const char *const hdr = "point,param.m,bench,size_bytes,sim_time_ns,algbw_gbps,"
                                   "busbw_gbps,bound_ns,efficiency,bound_resource,events,"
                                   "wall_ms,verified,status,error,roofline_ns,roofline_bound,"
                                   "roofline_efficiency\n";
    static const char *const m[2] = { "256", "512" };
    char out[8192], args[128], bound[64], eff[64], res[128], got[128], sim[64];
    double bound_v[2], eff_v[2];
    char *csv, *rows, *text, *line, *nl, *before, *after;
    const char *l;
    int n, seen = 0;
    (void)s;
    kbt_write_file("gemm.yaml", "bench: gemm\ngrid:\n  param.m: [256, 512]\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep gemm.yaml --out g.csv --jobs 2 --quiet"),
                     0);
    csv = kbt_slurp("g.csv");
    assert_non_null(csv);
    assert_int_equal(strncmp(csv, hdr, strlen(hdr)), 0);
    rows = canonical_rows("g.csv", &n);
    assert_int_equal(n, 2);
    l = rows;
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "--bench gemm --param m=%s", m[i]);
        run_bound(args, bound, eff, res, sizeof bound, &bound_v[i], &eff_v[i]);
        csv_field(csv, l, "bound_ns", got, sizeof got);
        assert_string_equal(got, bound);
        csv_field(csv, l, "efficiency", got, sizeof got);
        assert_string_equal(got, eff);
        /* efficiency = bound_ns / sim_time_ns of the same row, at most 1 */
        csv_field(csv, l, "sim_time_ns", sim, sizeof sim);
        assert_true(fabs(strtod(got, NULL) - bound_v[i] / strtod(sim, NULL)) <= 1e-11);
        assert_true(eff_v[i] > 0 && eff_v[i] <= 1);
        csv_field(csv, l, "bound_resource", got, sizeof got);
        assert_string_equal(got, res);
        l = strchr(l, '\n') + 1;
    }
    /* the gemm is bound by its one PE's cube unit, whose time doubles with m */
    assert_true(bound_v[0] == 8192 && bound_v[1] == 16384);
    /* and so is its roofline: 2·m·256·256 flops at 4096 per ns, over the same row's time
     * (the file's rows: canonical_rows drops wall_ms, before these columns) */
    for (int i = 0; i < 2; i++) {
        char key[16];
        snprintf(key, sizeof key, "\n%d,", i);
        l = strstr(csv, key);
        assert_non_null(l);
        l++;
        csv_field(csv, l, "roofline_ns", got, sizeof got);
        assert_string_equal(got, i ? "16384" : "8192");
        csv_field(csv, l, "roofline_bound", got, sizeof got);
        assert_string_equal(got, "compute");
        csv_field(csv, l, "sim_time_ns", sim, sizeof sim);
        csv_field(csv, l, "roofline_efficiency", got, sizeof got);
        assert_true(fabs(strtod(got, NULL) - (i ? 16384.0 : 8192.0) / strtod(sim, NULL)) <=
                    1e-11);
    }
    assert_non_null(strstr(rows, ",8192,"));
    assert_int_equal(count_str(rows, ",pe_gemm sip0/cube0/pe0,"), 2);
    free(rows);

    /* JSON Lines: numbers and a string, the same values */
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep gemm.yaml --out g.jsonl --quiet"), 0);
    text = kbt_slurp("g.jsonl");
    for (line = text; (nl = strchr(line, '\n')); line = nl + 1) {
        cJSON *r, *b, *e, *res_it;
        int p;
        *nl = 0;
        r = cJSON_Parse(line);
        assert_non_null(r);
        p = cJSON_GetObjectItem(r, "point")->valueint;
        assert_true(p == 0 || p == 1);
        b = cJSON_GetObjectItem(r, "bound_ns");
        e = cJSON_GetObjectItem(r, "efficiency");
        res_it = cJSON_GetObjectItem(r, "bound_resource");
        assert_true(cJSON_IsNumber(b) && cJSON_IsNumber(e) && cJSON_IsString(res_it));
        assert_true(b->valuedouble == bound_v[p]);
        assert_true(fabs(e->valuedouble - eff_v[p]) <= 1e-11 * eff_v[p]); /* %.12g */
        assert_string_equal(res_it->valuestring, "pe_gemm sip0/cube0/pe0");
        seen |= 1 << p;
        cJSON_Delete(r);
    }
    assert_int_equal(seen, 3);
    free(text);

    /* an error row has no bound: null in JSON Lines (the CSV: test_error_row) */
    kbt_write_file("berr.yaml", "algorithm: mesh_allreduce_4\nn_elem: 16\nworld_size: 12\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep berr.yaml --out berr.jsonl --quiet"), 3);
    text = kbt_slurp("berr.jsonl");
    assert_non_null(strstr(text, "\"bound_ns\":null,\"efficiency\":null,"
                                 "\"bound_resource\":null,"));
    free(text);

    /* --resume with this header: the missing point is run, the rows equal the full run */
    rows = canonical_rows("g.csv", &n);
    text = kbt_slurp("g.csv");
    *(strchr(strchr(text, '\n') + 1, '\n') + 1) = 0; /* the header and the first row */
    kbt_write_file("g.csv", text);
    free(text);
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep gemm.yaml --out g.csv --resume"), 0);
    kbt_msg_has(out, "2 points, 1 to run");
    text = canonical_rows("g.csv", &n);
    assert_int_equal(n, 2);
    assert_string_equal(text, rows);
    free(text);
    free(rows);

    /* the header of a kbcl from before the bound columns: refused, the file untouched */
    kbt_write_file("g_old.csv", "point,param.m,bench,size_bytes,sim_time_ns,algbw_gbps,"
                                "busbw_gbps,events,wall_ms,verified,status,error\n"
                                "0,256,gemm,,13680,,,9,1.000,,ok,\n");
    before = kbt_slurp("g_old.csv");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep gemm.yaml --out g_old.csv --resume"), 2);
    kbt_msg_has(out, "g_old.csv:1: the file was written by an older kbcl sweep, without the "
                     "bound_ns, efficiency, bound_resource and roofline columns; --resume does "
                     "not rewrite it: use a new --out");
    after = kbt_slurp("g_old.csv");
    assert_string_equal(before, after);
    free(before);
    free(after);
    /* and one from before the roofline columns */
    kbt_write_file("g_old.csv", "point,param.m,bench,size_bytes,sim_time_ns,algbw_gbps,"
                                "busbw_gbps,bound_ns,efficiency,bound_resource,events,"
                                "wall_ms,verified,status,error\n"
                                "0,256,gemm,,13680,,,8192,0.6,pe_gemm sip0/cube0/pe0,9,1.000,,"
                                "ok,\n");
    before = kbt_slurp("g_old.csv");
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep gemm.yaml --out g_old.csv --resume"), 2);
    kbt_msg_has(out, "g_old.csv:1: the file was written by an older kbcl sweep, without the "
                     "roofline_ns, roofline_bound and roofline_efficiency columns; --resume "
                     "does not rewrite it: use a new --out");
    after = kbt_slurp("g_old.csv");
    assert_string_equal(before, after);
    free(before);
    free(after);
    free(csv);
}

/* Values no sweep writes but an edited file may hold: an infinite size (1e999 in JSON, inf in
 * a CSV) or a NaN is left out of the plots, whose axes stay finite, and kept in the table.
 * The infinite x made the log2 axis end at infinity: no ticks, points at x = inf (and an
 * undefined conversion; found by the csv fuzz target,
 * tests/fuzz/corpus/csv/regress-infinite-size.jsonl). */
static void test_report_nonfinite(void **s)
{
    char out[8192];
    char *html;
    static const char *const files[2][2] = {
        { "nf.jsonl",
          "{\"point\":0,\"algorithm\":\"a\",\"size_bytes\":64,\"sim_time_ns\":100,"
          "\"busbw_gbps\":1,\"status\":\"ok\"}\n"
          "{\"point\":1,\"algorithm\":\"a\",\"size_bytes\":1024,\"sim_time_ns\":200,"
          "\"busbw_gbps\":2,\"status\":\"ok\"}\n"
          "{\"point\":2,\"algorithm\":\"a\",\"size_bytes\":1e999,\"sim_time_ns\":300,"
          "\"busbw_gbps\":3,\"status\":\"ok\"}\n" },
        { "nf.csv",
          "point,algorithm,size_bytes,sim_time_ns,busbw_gbps,status\n"
          "0,a,64,100,1,ok\n1,a,1024,200,2,ok\n2,a,inf,300,3,ok\n3,a,nan,400,4,ok\n"
          "4,a,-inf,500,5,ok\n" },
    };
    (void)s;
    for (int i = 0; i < 2; i++) {
        char cmd[64];
        kbt_write_file(files[i][0], files[i][1]);
        snprintf(cmd, sizeof cmd, "report %s -o nf.html", files[i][0]);
        assert_int_equal(kbt_kbcl(out, sizeof out, "%s", cmd), 0);
        html = kbt_slurp("nf.html");
        assert_non_null(html);
        assert_true(count_str(html, "text-anchor=\"middle\">64 B</text>") >= 1);
        assert_true(count_str(html, "text-anchor=\"middle\">1 KiB</text>") >= 1);
        assert_null(strstr(html, "\"inf\""));
        assert_null(strstr(html, "\"-inf\""));
        assert_null(strstr(html, "nan\""));
        assert_non_null(strstr(html, "<td>inf</td>")); /* the row is in the table */
        free(html);
    }
}

/* An input is never lost (issue #35's "data lost" cases): --resume refuses a file that is not
 * this sweep's output before it cuts anything, and no output may be one of the inputs. Each
 * refusal exits 2 and leaves the file byte for byte as it was. */
static void refused_unchanged(const char *cmd, const char *file, const char *msg)
{
    char out[8192];
    char *before = kbt_slurp(file), *after;
    assert_non_null(before);
    assert_int_equal(kbt_kbcl(out, sizeof out, cmd), 2);
    kbt_msg_has(out, msg);
    after = kbt_slurp(file);
    assert_non_null(after);
    assert_string_equal(before, after);
    free(before);
    free(after);
}

static void test_no_data_loss(void **s)
{
    char out[8192];
    (void)s;
    /* a file of notes, no newline: not a partial header of this sweep */
    kbt_write_file("notes.csv", "my notes");
    refused_unchanged("sweep small.yaml --resume --out notes.csv", "notes.csv",
                      "notes.csv: its first line is not the header of this sweep; --resume "
                      "leaves the file as it is: use a new --out");
    /* a foreign CSV whose last line is partial: refused by its header, the last line kept */
    kbt_write_file("foreign.csv", "a,b\n1,2\n3,");
    refused_unchanged("sweep small.yaml --resume --out foreign.csv", "foreign.csv",
                      "foreign.csv:1: header a,b does not match this sweep's columns");
    /* this sweep's header, then a partial line that is no row */
    assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --out ok.csv --quiet"), 0);
    char *rows = kbt_slurp("ok.csv");
    assert_non_null(rows);
    size_t n = strlen(rows) + 16;
    char *bad = malloc(n);
    assert_non_null(bad);
    snprintf(bad, n, "%snotes", rows);
    kbt_write_file("tail.csv", bad);
    refused_unchanged("sweep small.yaml --resume --out tail.csv", "tail.csv",
                      "tail.csv: its last line is not a row of this sweep");
    free(bad);
    free(rows);
    /* a JSON-lines file that is not this sweep's */
    kbt_write_file("notes.jsonl", "{\"x\": 1}");
    refused_unchanged("sweep small.yaml --resume --out notes.jsonl", "notes.jsonl",
                      "notes.jsonl: its first line is not a row of this sweep");
    /* a NUL byte inside a row, whole rows after it and a partial last line: the line
     * functions stopped at the NUL, took everything after it for the partial line and cut
     * the whole rows with it. Refused, the file kept byte for byte. */
    {
        char *ok = kbt_slurp("ok.csv"), *nl, path[512], *back;
        size_t nok, nback;
        FILE *f;
        assert_non_null(ok);
        nl = strchr(strchr(ok, '\n') + 1, '\n'); /* the end of the first row */
        assert_non_null(nl);
        kbt_path(path, sizeof path, "nul.csv");
        f = fopen(path, "wb");
        assert_non_null(f);
        fwrite(ok, 1, (size_t)(nl + 1 - ok), f);  /* the header and row 0 */
        fwrite("1\0x\n", 1, 4, f);                  /* a damaged line with a NUL */
        fputs(nl + 1, f);                          /* the other rows */
        fputs("3,", f);                            /* and a partial last line */
        fclose(f);
        nok = (size_t)(nl + 1 - ok) + 4 + strlen(nl + 1) + 2;
        assert_int_equal(kbt_kbcl(out, sizeof out, "sweep small.yaml --resume --out nul.csv"), 2);
        kbt_msg_has(out, "nul.csv:3: a NUL byte: not the output of kbcl sweep; --resume leaves "
                         "the file as it is: use a new --out");
        f = fopen(path, "rb");
        assert_non_null(f);
        back = malloc(nok + 1);
        assert_non_null(back);
        nback = fread(back, 1, nok + 1, f);
        fclose(f);
        assert_int_equal(nback, nok);
        assert_memory_equal(back, ok, (size_t)(nl + 1 - ok));
        assert_memory_equal(back + (nl + 1 - ok), "1\0x\n", 4);
        free(back);
        free(ok);
    }
    /* outputs over inputs: the sweep's plan, the report's table (named or by default) */
    refused_unchanged("sweep small.yaml --out small.yaml", "small.yaml",
                      "--out small.yaml is the same file as small.yaml, which this command "
                      "reads or writes: give another file");
    refused_unchanged("sweep small.yaml --out ./small.yaml --quiet", "small.yaml",
                      "--out ./small.yaml is the same file as small.yaml");
    refused_unchanged("report ok.csv -o ok.csv", "ok.csv",
                      "the page ok.csv is the same file as ok.csv");
    assert_int_equal(kbt_kbcl(out, sizeof out, "report ok.csv -o page.html"), 0);
    refused_unchanged("report page.html", "page.html",
                      "the page page.html is the same file as page.html");
}

/* The ETA of the progress bar (kbcl_sweep_eta), exact: means and halves of whole seconds. */
static void test_eta(void **s)
{
    (void)s;
    /* nothing finished yet: no estimate */
    assert_true(kbcl_sweep_eta(5, 2, 0, 0.0, NULL, 0) == -1.0);
    /* mean 10 s; 6 waiting, running for 3 s (7 left) and for 12 s (0 left): 67 s over 2 jobs */
    const double run2[2] = { 3.0, 12.0 };
    assert_true(kbcl_sweep_eta(6, 2, 4, 40.0, run2, 2) == 33.5);
    /* the sweep: the 1 GiB point has run 106 s, the others took 2 s, none waits: the
     * estimate is gone, not 0:00 */
    const double big[1] = { 106.0 };
    assert_true(kbcl_sweep_eta(0, 4, 9, 18.0, big, 1) == -1.0);
    /* a running point's own remainder bounds the estimate from below (0.5 s, not 0.5 / 4) */
    const double almost[1] = { 1.5 };
    assert_true(kbcl_sweep_eta(0, 4, 9, 18.0, almost, 1) == 0.5);
    /* one waiting point takes a whole mean, however many jobs are free */
    assert_true(kbcl_sweep_eta(1, 8, 2, 20.0, NULL, 0) == 10.0);
    /* no running points known (MPI): the waiting ones over the jobs */
    assert_true(kbcl_sweep_eta(3, 2, 2, 8.0, NULL, 0) == 6.0);
    /* done */
    assert_true(kbcl_sweep_eta(0, 2, 3, 9.0, NULL, 0) == 0.0);
    /* jobs 0 counts as 1 */
    assert_true(kbcl_sweep_eta(3, 0, 1, 2.0, NULL, 0) == 6.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eta),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_jobs2_equals_jobs1),
        cmocka_unit_test(test_jsonl),
        cmocka_unit_test(test_config_axis_and_exclude),
        cmocka_unit_test(test_error_row),
        cmocka_unit_test(test_device_workers),
        cmocka_unit_test(test_kill9_then_resume),
        cmocka_unit_test(test_partial_last_line),
        cmocka_unit_test(test_no_data_loss),
        cmocka_unit_test(test_report_nonfinite),
        cmocka_unit_test(test_sweep_file_errors),
        cmocka_unit_test(test_points_checked_first),
        cmocka_unit_test(test_bound_columns),
        cmocka_unit_test(test_op_dtype_axes),
        cmocka_unit_test(test_collectives_sweep),
        cmocka_unit_test(test_switch_arbitration_sweep),
        cmocka_unit_test(test_size_axis),
        cmocka_unit_test(test_report),
        cmocka_unit_test(test_report_sizes),
        cmocka_unit_test(test_report_legends_terms),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
