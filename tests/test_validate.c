/*
 * End-to-end tests of `kbcl validate` through the real binary ($KBCL_BIN, set by CTest), on
 * the shipped default machine and configs/ccl.yaml. The predictions P come from `kbcl run
 * --bench ccl --algorithm A --world-size 0 --size S --device none --json`, the job validate
 * must build for a row; the data files then hold measurements P x 1.05 and P x 0.8, so the
 * error figures are known exactly: (P - 1.05 P) / 1.05 P = -4.7619 %, (P - 0.8 P) / 0.8 P =
 * +25 %. Checked: every printed column and summary figure, the exit status against
 * --threshold and --min-bytes and against --ratio, prediction-only rows, comments, quoted
 * labels, the --json document, identical output from identical runs, each data-file, option and
 * configuration error with its FILE:LINE and exit status 2, and a row whose run fails (3).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kb_test_util.h"

/* The rows run with the ring all-reduce as one rank per SIP: --world-size 0, as an --set
 * (validate leaves world sizes to the ccl file). */
#define RSAG "ring_rsag_allreduce"
#define WS0 "--set ccl.algorithms." RSAG ".world_size=0"
#define HEADER "collective,bytes,measured_us,algorithm,label\n"

static double p1m_us, p8m_us; /* predictions, microseconds: 1 MiB and 8 MiB per rank */
static char out[1 << 16];

/* sim_time_ns / 1000 of `kbcl run --bench ccl --algorithm RSAG --world-size 0 --size size`. */
static double predicted_us(const char *size)
{
    char *text;
    cJSON *j, *t;
    double us;
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm " RSAG
                              " --world-size 0 --size %s --device none --quiet --json p.json",
                              size), 0);
    text = kbt_slurp("p.json");
    assert_non_null(text);
    j = cJSON_Parse(text);
    assert_non_null(j);
    t = cJSON_GetObjectItem(j, "sim_time_ns");
    assert_true(cJSON_IsNumber(t) && t->valuedouble > 0);
    us = t->valuedouble / 1000.0;
    cJSON_Delete(j);
    free(text);
    return us;
}

static int setup(void **state)
{
    (void)state;
    if (kbt_workdir_make("kbcl-validate") != 0)
        return -1;
    p1m_us = predicted_us("1M");
    p8m_us = predicted_us("8M");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return kbt_workdir_remove();
}

/* The line of text that starts with `start` (copied into line), failing without one. */
static void line_starting(const char *text, const char *start, char *line, size_t n)
{
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (!strncmp(l, start, strlen(start))) {
            const char *e = strchr(l, '\n');
            size_t len = e ? (size_t)(e - l) : strlen(l);
            assert_true(len < n);
            memcpy(line, l, len);
            line[len] = 0;
            return;
        }
    }
    fail_msg("no line starting '%s' in:\n%s", start, text);
}

/* Fails unless text has a line exactly equal to want. */
static void has_line(const char *text, const char *want)
{
    char line[2048];
    line_starting(text, want, line, sizeof line);
    if (strcmp(line, want))
        fail_msg("line '%s', expected '%s'", line, want);
}

/* Asserts the whitespace-separated words of the table row starting with `label`. */
static void row_words(const char *text, const char *label, const char *const *want, int n)
{
    char line[2048], *save = NULL, *w;
    int i = 0;
    line_starting(text, label, line, sizeof line);
    for (w = strtok_r(line, " ", &save); w; w = strtok_r(NULL, " ", &save), i++) {
        assert_true(i < n);
        if (strcmp(w, want[i]))
            fail_msg("row '%s': word %d is '%s', expected '%s'", label, i, w, want[i]);
    }
    assert_int_equal(i, n);
}

/*
 * The main table: an 8 MiB row measured at P x 1.05 (-4.8 %), a 1 MiB row at P x 0.8
 * (+25.0 %), a prediction-only row, and comments, a blank line and a quoted label between
 * them. Lines: 1-2 comments, 3 header, 4 the 8 MiB row, 5 a comment, 6 blank, 7 the 1 MiB
 * row, 8 the prediction-only row.
 */
static void write_main_table(void)
{
    char text[1024];
    snprintf(text, sizeof text,
             "# measured on no machine: P x 1.05 and P x 0.8\n"
             "   # an indented comment\n"
             "label,collective,algorithm,bytes,measured_us\n" /* columns in another order */
             "default,all_reduce," RSAG ",8M,%.17g\n"
             "# a comment between rows\n"
             "\n"
             "\"ring, NCCL_ALGO=Ring\",all_reduce," RSAG ",1048576,%.17g\n"
             "predicted,all_reduce," RSAG ",1M,\n",
             p8m_us * 1.05, p1m_us * 0.8);
    kbt_write_file("data.csv", text);
}

static void test_table_and_summary(void **state)
{
    char m8[32], m1[32], p8[32], p1[32];
    (void)state;
    write_main_table();
    snprintf(m8, sizeof m8, "%.3f", p8m_us * 1.05);
    snprintf(m1, sizeof m1, "%.3f", p1m_us * 0.8);
    snprintf(p8, sizeof p8, "%.3f", p8m_us);
    snprintf(p1, sizeof p1, "%.3f", p1m_us);
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv " WS0), 0);
    {
        const char *w[] = { "label", "collective", "bytes", "size", "algorithm", "measured_us",
                            "predicted_us", "error_%" };
        row_words(out, "label ", w, 8);
    }
    {
        const char *w[] = { "default", "all_reduce", "8388608", "8", "MiB", RSAG, m8, p8,
                            "-4.8" };
        row_words(out, "default ", w, 9);
    }
    {
        const char *w[] = { "ring,", "NCCL_ALGO=Ring", "all_reduce", "1048576", "1", "MiB",
                            RSAG, m1, p1, "+25.0" };
        row_words(out, "ring, NCCL_ALGO=Ring ", w, 10);
    }
    {
        const char *w[] = { "predicted", "all_reduce", "1048576", "1", "MiB", RSAG, "-", p1,
                            "-" };
        row_words(out, "predicted ", w, 9);
    }
    /* rows in the file's order */
    assert_true(strstr(out, "default ") < strstr(out, "ring, NCCL") &&
                strstr(out, "ring, NCCL") < strstr(out, "predicted "));
    has_line(out, "measured rows: 2 of 3 (1 prediction-only, not counted)");
    has_line(out, "rows >= 8 MiB: 1 measured, mean |error| 4.8 %, worst 4.8 % at data.csv:4 "
                  "(default all_reduce 8 MiB " RSAG ")");
    /* mean of 4.7619 and 25 */
    has_line(out, "all measured rows: 2 measured, mean |error| 14.9 %, worst 25.0 % at "
                  "data.csv:7 (ring, NCCL_ALGO=Ring all_reduce 1 MiB " RSAG ")");
    assert_null(strstr(out, "threshold"));
    /* the wall time only on stderr */
    assert_null(strstr(out, " s\n"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate data.csv " WS0), 0);
    assert_non_null(strstr(out, "kbcl validate: 3 rows simulated in "));

    /* --quiet: the summary alone */
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate data.csv --quiet " WS0), 0);
    assert_null(strstr(out, "predicted_us"));
    assert_null(strstr(out, "simulated in"));
    assert_non_null(strstr(out, "rows >= 8 MiB: 1 measured, mean |error| 4.8 %"));
}

static void test_threshold(void **state)
{
    (void)state;
    write_main_table();
    /* only the -4.8 % row is >= 8 MiB */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --threshold 6 " WS0), 0);
    has_line(out, "threshold 6 %: passed (worst |error| 4.8 % over the rows >= 8 MiB)");
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --threshold 4 " WS0), 1);
    has_line(out, "threshold 4 %: FAILED: data.csv:4 (default all_reduce 8 MiB " RSAG ") is off "
                  "by 4.8 %, 0.8 points above it");
    assert_null(strstr(out, "FAILED: data.csv:7"));
    /* --min-bytes 1M takes the +25 % row in: it alone is above 20 */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --min-bytes 1M "
                                 "--threshold 20 " WS0), 1);
    has_line(out, "rows >= 1 MiB: 2 measured, mean |error| 14.9 %, worst 25.0 % at data.csv:7 "
                  "(ring, NCCL_ALGO=Ring all_reduce 1 MiB " RSAG ")");
    has_line(out, "threshold 20 %: FAILED: data.csv:7 (ring, NCCL_ALGO=Ring all_reduce 1 MiB "
                  RSAG ") is off by 25.0 %, 5.0 points above it");
    assert_null(strstr(out, "FAILED: data.csv:4"));
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --min-bytes 1048576 "
                                 "--threshold 25.5 " WS0), 0);
    has_line(out, "threshold 25.5 %: passed (worst |error| 25.0 % over the rows >= 1 MiB)");
    /* above every row: nothing measured to judge */
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate data.csv --min-bytes 16M "
                              "--threshold 10 " WS0), 2);
    kbt_msg_has(out, "kbcl validate: data.csv: no measured row of at least 16 MiB "
                     "(--min-bytes): nothing to judge --threshold 10 against");
    assert_null(strstr(out, "predicted_us")); /* refused before anything ran */
    /* without a threshold that is only a summary line */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --min-bytes 16M " WS0), 0);
    has_line(out, "rows >= 16 MiB: no measured row");
}

static void test_prediction_only(void **state)
{
    (void)state;
    /* other collectives too: their entries' own world sizes (256 PEs, 8 for all_to_all) */
    kbt_write_file("pred.csv", HEADER
                   "all_reduce,8M,," RSAG ",default\n"
                   "all_gather,64K,,ring_allgather,default\n"
                   "all_to_all,64K,,pairwise_alltoall,default\n"
                   "all_reduce,64K,,intercube_allreduce,sip\n");
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate pred.csv " WS0), 0);
    has_line(out, "measured rows: 0 of 4 (4 prediction-only, not counted)");
    has_line(out, "rows >= 8 MiB: no measured row");
    has_line(out, "all measured rows: no measured row");
    {
        char p8[32];
        const char *w[] = { "default", "all_reduce", "8388608", "8", "MiB", RSAG, "-", p8,
                            "-" };
        snprintf(p8, sizeof p8, "%.3f", p8m_us);
        row_words(out, "default  all_reduce", w, 9);
    }
    assert_non_null(strstr(out, "ring_allgather"));
    assert_non_null(strstr(out, "pairwise_alltoall"));
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate pred.csv --threshold 10 " WS0), 2);
    kbt_msg_has(out, "no measured row of at least 8 MiB (--min-bytes): nothing to judge");
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!cJSON_IsNumber(v))
        fail_msg("JSON key '%s' is not a number", key);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!cJSON_IsString(v))
        fail_msg("JSON key '%s' is not a string", key);
    return v->valuestring;
}

/* Equal to 1e-12 relative: cJSON prints a double with 15 digits when they read back within
 * its epsilon, not always the very same double. */
static int near(double a, double b)
{
    return fabs(a - b) <= 1e-12 * fabs(b);
}

static void test_json(void **state)
{
    char *text, *again, first[sizeof out];
    cJSON *j, *rows, *r, *sum, *large, *all;
    (void)state;
    write_main_table();
    /* written on exit 1 too: the threshold failed, the document is whole */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --threshold 4 --json v.json "
                                 WS0), 1);
    memcpy(first, out, sizeof out);
    text = kbt_slurp("v.json");
    assert_non_null(text);
    j = cJSON_Parse(text);
    assert_non_null(j);
    assert_string_equal(str(j, "data"), "data.csv");
    assert_non_null(strstr(str(j, "topology"), "configs/topology.yaml"));
    assert_non_null(strstr(str(j, "ccl"), "configs/ccl.yaml"));
    rows = cJSON_GetObjectItem(j, "rows");
    assert_int_equal(cJSON_GetArraySize(rows), 3);

    r = cJSON_GetArrayItem(rows, 0);
    assert_int_equal((int)num(r, "line"), 4);
    assert_string_equal(str(r, "label"), "default");
    assert_string_equal(str(r, "collective"), "all_reduce");
    assert_string_equal(str(r, "algorithm"), RSAG);
    assert_int_equal((int64_t)num(r, "bytes"), 8 << 20);
    assert_true(near(num(r, "measured_us"), p8m_us * 1.05));
    assert_true(near(num(r, "predicted_us"), p8m_us));
    assert_true(fabs(num(r, "error_pct") - (1 / 1.05 - 1) * 100) < 1e-9);

    r = cJSON_GetArrayItem(rows, 1);
    assert_int_equal((int)num(r, "line"), 7);
    assert_string_equal(str(r, "label"), "ring, NCCL_ALGO=Ring");
    assert_true(near(num(r, "predicted_us"), p1m_us));
    assert_true(fabs(num(r, "error_pct") - 25.0) < 1e-9);

    r = cJSON_GetArrayItem(rows, 2);
    assert_int_equal((int)num(r, "line"), 8);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(r, "measured_us")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(r, "error_pct")));
    assert_true(near(num(r, "predicted_us"), p1m_us));

    sum = cJSON_GetObjectItem(j, "summary");
    assert_int_equal((int64_t)num(sum, "min_bytes"), 8 << 20);
    assert_true(num(sum, "threshold_pct") == 4);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(sum, "pass")));
    large = cJSON_GetObjectItem(sum, "large");
    assert_int_equal((int)num(large, "measured_rows"), 1);
    assert_int_equal((int)num(large, "worst_line"), 4);
    assert_true(fabs(num(large, "worst_abs_error_pct") - (1 - 1 / 1.05) * 100) < 1e-9);
    assert_true(fabs(num(large, "mean_abs_error_pct") - (1 - 1 / 1.05) * 100) < 1e-9);
    all = cJSON_GetObjectItem(sum, "all");
    assert_int_equal((int)num(all, "measured_rows"), 2);
    assert_int_equal((int)num(all, "worst_line"), 7);
    assert_true(fabs(num(all, "worst_abs_error_pct") - 25.0) < 1e-9);
    assert_true(fabs(num(all, "mean_abs_error_pct") - ((1 - 1 / 1.05) * 100 + 25) / 2) < 1e-9);
    cJSON_Delete(j);

    /* identical runs: identical stdout and JSON, byte for byte */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --threshold 4 --json "
                                 "v2.json " WS0), 1);
    assert_string_equal(out, first);
    again = kbt_slurp("v2.json");
    assert_non_null(again);
    assert_string_equal(again, text);
    free(again);
    free(text);

    /* no threshold: null threshold and verdict */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --json v3.json " WS0), 0);
    text = kbt_slurp("v3.json");
    j = cJSON_Parse(text);
    assert_non_null(j);
    sum = cJSON_GetObjectItem(j, "summary");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(sum, "threshold_pct")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(sum, "pass")));
    cJSON_Delete(j);
    free(text);

    /* never over an input */
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate data.csv --json data.csv " WS0), 2);
    kbt_msg_has(out, "--json data.csv is the same file as data.csv");
    text = kbt_slurp("data.csv");
    assert_non_null(strstr(text, "# measured on no machine"));
    free(text);
}

/* A data file `text` gives exit 2 and a message containing `msg`, before anything ran. */
static void data_error(const char *text, const char *msg)
{
    kbt_write_file("bad.csv", text);
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate bad.csv " WS0), 2);
    if (!strstr(out, msg))
        fail_msg("for\n%s\nthe output\n%s\nlacks '%s'", text, out, msg);
    assert_null(strstr(out, "predicted_us"));
}

/* --ratio: every measured row, whatever its size, within a factor of R either way. */
static void test_ratio(void **state)
{
    cJSON *j, *sum;
    char *text;
    (void)state;
    write_main_table();
    /* predicted / measured: 1/1.05 at 8 MiB, 1.25 at 1 MiB */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --ratio 1.3 " WS0), 0);
    has_line(out, "ratio 1.3: passed (farthest data.csv:7 (ring, NCCL_ALGO=Ring all_reduce 1 MiB "
                  RSAG "), predicted 1.250 x measured)");
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --ratio 1.2 " WS0), 1);
    has_line(out, "ratio 1.2: FAILED: data.csv:7 (ring, NCCL_ALGO=Ring all_reduce 1 MiB " RSAG
                  ") predicts 1.250 x its measurement");
    assert_null(strstr(out, "FAILED: data.csv:4"));
    /* below 1 too, and --min-bytes does not narrow it */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --ratio 1.04 "
                                     "--min-bytes 16M " WS0), 1);
    has_line(out, "ratio 1.04: FAILED: data.csv:4 (default all_reduce 8 MiB " RSAG
                  ") predicts 0.952 x its measurement");
    /* with --threshold: both verdicts, either failing fails */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --threshold 6 "
                                     "--ratio 1.2 " WS0), 1);
    has_line(out, "threshold 6 %: passed (worst |error| 4.8 % over the rows >= 8 MiB)");
    /* the JSON summary */
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate data.csv --ratio 1.3 --json "
                                     "r.json " WS0), 0);
    text = kbt_slurp("r.json");
    j = cJSON_Parse(text);
    assert_non_null(j);
    sum = cJSON_GetObjectItem(j, "summary");
    assert_true(num(sum, "ratio") == 1.3);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(sum, "ratio_pass")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(sum, "threshold_pct")));
    cJSON_Delete(j);
    free(text);
    /* usage: a factor below 1, nothing measured to judge */
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate data.csv --ratio 0.5 " WS0), 2);
    kbt_msg_has(out, "kbcl validate: --ratio needs a factor >= 1, e.g. 2 (got '0.5')");
    kbt_write_file("pred1.csv", HEADER "all_reduce,8M,," RSAG ",default\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate pred1.csv --ratio 2 " WS0), 2);
    kbt_msg_has(out, "kbcl validate: pred1.csv: no measured row: nothing to judge --ratio 2 "
                     "against");
}

static void test_data_errors(void **state)
{
    (void)state;
    data_error("collective,bytes,measured_us,algorithm\nall_reduce,1M,1," RSAG "\n",
               "kbcl validate: bad.csv:1: the header has no column 'label' (expected "
               "collective,bytes,measured_us,algorithm,label in any order)");
    data_error("# c\ncollective,bytes,measured_us,algorithm,label,ranks\n",
               "kbcl validate: bad.csv:2: unknown column 'ranks' in the header");
    data_error("collective,bytes,bytes,algorithm,label\n",
               "kbcl validate: bad.csv:1: column 'bytes' appears twice in the header");
    /* comment lines count: the bad row is line 4 */
    data_error("# one\ncollective,bytes,measured_us,algorithm,label\n# two\n"
               "all_reduce,1.5M,1," RSAG ",x\n",
               "kbcl validate: bad.csv:4: bytes '1.5M': expected a positive number of bytes");
    data_error(HEADER "all_reduce,0,1," RSAG ",x\n", "bad.csv:2: bytes '0': expected");
    data_error(HEADER "all_reduce,1M,1," RSAG ",x\nall_reduce,1M,-3," RSAG ",x\n",
               "kbcl validate: bad.csv:3: measured_us '-3': expected a positive number of "
               "microseconds");
    data_error(HEADER "all_reduce,1M,0," RSAG ",x\n", "bad.csv:2: measured_us '0'");
    data_error(HEADER "all_reduce,1M,nan," RSAG ",x\n", "bad.csv:2: measured_us 'nan'");
    data_error(HEADER "all_reduce,1M,12us," RSAG ",x\n", "bad.csv:2: measured_us '12us'");
    data_error(HEADER "all_gather,1M,1," RSAG ",x\n",
               "kbcl validate: bad.csv:2: collective all_gather, but entry '" RSAG "' of ");
    data_error(HEADER "all_gather,1M,1," RSAG ",x\n", "configs/ccl.yaml runs all_reduce");
    data_error(HEADER "allreduce,1M,1," RSAG ",x\n",
               "kbcl validate: bad.csv:2: collective 'allreduce': expected an nccl-tests name");
    data_error(HEADER "all_reduce,1M,1,no_such_algo,x\n",
               "kbcl validate: bad.csv:2: algorithm 'no_such_algo' is not an entry of ");
    data_error(HEADER "all_reduce,1M,1,,x\n", "bad.csv:2: the algorithm is empty");
    data_error(HEADER "all_reduce,1M,1," RSAG "\n",
               "kbcl validate: bad.csv:2: 4 fields, the header has 5");
    data_error(HEADER "all_reduce,1M,1," RSAG ",x,y\n", "bad.csv:2: 6 fields, the header has 5");
    data_error(HEADER "all_reduce,1M,1," RSAG ",\"x\n",
               "bad.csv:2: a quoted field without its closing quote");
    data_error("", "kbcl validate: bad.csv:1: no header line (the file is empty");
    data_error("# only\n\n# comments\n", "kbcl validate: bad.csv:3: no header line (only "
               "comments and blank lines");
    data_error(HEADER "# no rows\n", "kbcl validate: bad.csv:1: no data rows after the header");
    /* what kbcl run checks of the row's job, at the row: 3 bytes of f16 */
    data_error(HEADER "all_reduce,1M,1," RSAG ",x\nall_reduce,3,1," RSAG ",x\n",
               "kbcl validate: bad.csv:3: algorithm " RSAG ", bytes 3: --size 3: not a whole "
               "number of 2-byte elements");
    /* a later row's error stops validate before the first row runs */
    assert_null(strstr(out, "1048576"));
}

static void test_option_errors(void **state)
{
    (void)state;
    kbt_write_file("ok.csv", HEADER "all_reduce,1M,1," RSAG ",x\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate"), 2);
    kbt_msg_has(out, "usage: kbcl validate DATA.csv");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate --help"), 0);
    kbt_msg_has(out, "usage: kbcl validate DATA.csv [--topology FILE] [--ccl FILE] "
                     "[--set KEY=VALUE ...]");
    kbt_msg_has(out, "collective,bytes,measured_us,algorithm,label");
    assert_int_equal(kbt_kbcl(out, sizeof out, "--help"), 0);
    kbt_msg_has(out, "  validate ");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate missing.csv"), 2);
    kbt_msg_has(out, "kbcl validate: missing.csv: cannot read");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv other.csv"), 2);
    kbt_msg_has(out, "unexpected argument 'other.csv'");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --world-size 2"), 2);
    kbt_msg_has(out, "--world-size: not an option of validate: each row's entry decides");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --size 1M"), 2);
    kbt_msg_has(out, "--size: not an option of validate");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --algorithm " RSAG), 2);
    kbt_msg_has(out, "--algorithm: not an option of validate");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --device ref"), 2);
    kbt_msg_has(out, "--device: not an option of validate: validate runs timing only");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --threshold -1"), 2);
    kbt_msg_has(out, "--threshold needs a percentage >= 0");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --threshold ten"), 2);
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --min-bytes 8X"), 2);
    kbt_msg_has(out, "--min-bytes 8X: expected a positive number of bytes");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --set"), 2);
    kbt_msg_has(out, "--set needs a value");
    /* configuration errors are the configuration's, not a row's */
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --set no.such.key=1"), 2);
    kbt_msg_has(out, "kbcl validate: --set no.such.key=1");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --topology missing.yaml"), 2);
    kbt_msg_has(out, "kbcl validate: missing.yaml");
    /* the entries are those of --ccl: one that lacks the row's */
    kbt_write_file("small-ccl.yaml", "algorithms:\n  mine:\n    module: ring_allreduce\n"
                                     "    topology: ring_1d\n    world_size: 4\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate ok.csv --ccl small-ccl.yaml"), 2);
    kbt_msg_has(out, "kbcl validate: ok.csv:2: algorithm '" RSAG "' is not an entry of "
                     "small-ccl.yaml");
    kbt_write_file("mine.csv", HEADER "all_reduce,64K,,mine,x\n");
    assert_int_equal(kbt_kbcl_stdout(out, sizeof out, "validate mine.csv --ccl small-ccl.yaml"), 0);
    kbt_msg_has(out, "mine");
    kbt_msg_has(out, "small-ccl.yaml");
}

/* A row whose run fails (here: its entry's IPCQ rings do not fit the PE's area, which only
 * the run finds) stops validate with kbcl run's status, 3, naming the row; the rows before it
 * were printed, no summary is. */
static void test_run_failure(void **state)
{
    (void)state;
    kbt_write_file("fails.csv", HEADER "all_reduce,64K,,intercube_allreduce,first\n"
                                "all_reduce,1M,1," RSAG ",second\n");
    assert_int_equal(kbt_kbcl(out, sizeof out, "validate fails.csv --set ccl.algorithms." RSAG
                              ".n_slots=64"), 3);
    kbt_msg_has(out, "kbcl validate: fails.csv:3 (second all_reduce 1 MiB " RSAG "): simulated "
                     "memory exhausted: IPCQ install");
    kbt_msg_has(out, "first   all_reduce");
    assert_null(strstr(out, "measured rows:"));
    /* and the same job as kbcl run gives that status too */
    assert_int_equal(kbt_kbcl(out, sizeof out, "run --bench ccl --algorithm " RSAG " --size 1M "
                              "--device none --set ccl.algorithms." RSAG ".n_slots=64"), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_and_summary),
        cmocka_unit_test(test_threshold),
        cmocka_unit_test(test_ratio),
        cmocka_unit_test(test_prediction_only),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_data_errors),
        cmocka_unit_test(test_option_errors),
        cmocka_unit_test(test_run_failure),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
