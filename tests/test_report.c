/*
 * `kbcl report` at scale (issue #35): a synthetic 40 000-row sweep result (the header of a
 * real collectives sweep, made-up but consistent numbers: busbw = algbw x the collective's
 * factor) rendered by the real binary ($KBCL_BIN), and the page checked for completeness:
 * every plot, every point, a line and a legend entry per series and plot, the rows table.
 * The rows are written shuffled, so that the page's point order is the report's own sort.
 * No wall-clock assertion: scripts/report-scale.sh measures the time. And a decoder sweep's
 * rows: the time split against the TP size and the roofline efficiency per format.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_ccl.h"
#include "kb_test_util.h"

/* 8 algorithms (ccl.yaml entries of 6 collectives) x 25 sizes x 200 world sizes */
static const struct {
    const char *name;
    kb_coll_kind kind;
} algs[] = {
    { "ring_allreduce_tcm", KB_COLL_ALLREDUCE }, { "ring_rsag_allreduce", KB_COLL_ALLREDUCE },
    { "ring_allgather", KB_COLL_ALLGATHER },     { "rd_allgather", KB_COLL_ALLGATHER },
    { "ring_reducescatter", KB_COLL_REDUCE_SCATTER },
    { "ring_broadcast", KB_COLL_BROADCAST },     { "pairwise_alltoall", KB_COLL_ALLTOALL },
    { "p2p_sendrecv", KB_COLL_SENDRECV },
};
#define NALG ((int)(sizeof algs / sizeof algs[0]))
#define NKINDS 6
#define NSIZE 25
#define NWS 200
#define NROWS (NALG * NSIZE * NWS)
#define ERR_EVERY 1000 /* every 1000th point is an error row (not plotted) */

static int count_str(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Writes the rows, point p at place perm(p) of the file (a fixed permutation). */
static void write_rows(const char *name)
{
    char (*line)[320] = malloc((size_t)NROWS * sizeof *line), path[512];
    FILE *f;
    kbt_path(path, sizeof path, name);
    f = fopen(path, "w");
    assert_non_null(line);
    assert_non_null(f);
    fprintf(f, "point,algorithm,world_size,size,bench,size_bytes,sim_time_ns,algbw_gbps,"
               "busbw_gbps,bound_ns,efficiency,bound_resource,events,wall_ms,verified,status,"
               "error\n");
    for (int p = 0; p < NROWS; p++) {
        int a = p / (NSIZE * NWS), ws = 2 + 2 * (p / NSIZE % NWS), k = p % NSIZE;
        long long sz = 8LL << k;
        double t = 2000.0 + 40.0 * ws * (1 + a) + (double)sz / (10.0 + a);
        double algbw = (double)sz / t, bound = t * (0.2 + 0.7 * ((a * 7 + ws + k) % 97) / 97.0);
        int err = p % ERR_EVERY == ERR_EVERY - 1;
        /* 7919 is prime to NROWS: p -> p * 7919 mod NROWS is a permutation */
        snprintf(line[(long long)p * 7919 % NROWS], sizeof line[0],
                 "%d,%s,%d,%lld,ccl,%lld,%.3f,%.9g,%.9g,%.3f,%.9g,pe_dma sip0/cube0/pe%d,%d,1.5,,"
                 "%s,%s\n", p, algs[a].name, ws, sz, sz, t, algbw,
                 algbw * kb_coll_busbw_factor(algs[a].kind, ws), bound, bound / t, ws % 8,
                 100 + ws, err ? "error" : "ok", err ? "deadlock" : "");
    }
    for (int i = 0; i < NROWS; i++)
        fputs(line[i], f);
    assert_int_equal(fclose(f), 0);
    free(line);
}

/* `kbcl report NAME.csv -o NAME.html` in the work folder: the page (the caller frees it). */
static char *render(const char *name)
{
    char out[4096], cmd[256];
    snprintf(cmd, sizeof cmd, "report %s.csv -o %s.html", name, name);
    if (kbt_kbcl(out, sizeof out, cmd) != 0)
        fail_msg("%s", out);
    snprintf(cmd, sizeof cmd, "%s.html", name);
    char *html = kbt_slurp(cmd);
    assert_non_null(html);
    return html;
}

static void test_report_40k(void **s)
{
    char want[256];
    char *html, *plot, *end;
    int nok = NROWS - NROWS / ERR_EVERY;
    (void)s;
    write_rows("big.csv");
    html = render("big");
    snprintf(want, sizeof want, "<p>%d rows: %d ok (0 failed verification), %d errors.", NROWS,
             nok, NROWS / ERR_EVERY);
    kbt_msg_has(html, want);
    /* plots: time, busbw, efficiency vs world size per size; busbw vs size per world size
     * for each collective; time and efficiency vs size per world size */
    assert_int_equal(count_str(html, "<svg "), 3 * NSIZE + NKINDS * NWS + 2 * NWS);
    /* every ok row is a point in each of its six plots */
    assert_int_equal(count_str(html, "<circle "), 6 * nok);
    /* a line per series in each plot, and the legend names exactly those: all 8 algorithms
     * where every collective shares a plot, a collective's own in its busbw plots (all 8 in
     * each would be NKINDS * NWS * NALG entries there) */
    assert_int_equal(count_str(html, "<polyline class=\"series\""),
                     3 * NSIZE * NALG + NWS * NALG + 2 * NWS * NALG);
    assert_int_equal(count_str(html, "<g class=\"legend\">"),
                     3 * NSIZE * NALG + NWS * NALG + 2 * NWS * NALG);
    plot = strstr(html, "aria-label=\"all_gather busbw vs message size, world_size = 200\"");
    assert_non_null(plot);
    end = strstr(plot, "</svg>");
    assert_non_null(end);
    *end = 0;
    assert_int_equal(count_str(plot, "<g class=\"legend\">"), 2);
    assert_int_equal(count_str(plot, "\">ring_allgather</text></g>"), 1);
    assert_int_equal(count_str(plot, "\">rd_allgather</text></g>"), 1);
    assert_int_equal(count_str(plot, "<polyline "), 2);
    assert_int_equal(count_str(plot, "<circle "), 2 * NSIZE);
    *end = '<';
    /* the rows table: a header and every row, sorted by point */
    assert_int_equal(count_str(html, "<tr"), 1 + NROWS);
    assert_int_equal(count_str(html, "<tr class=\"err\">"), NROWS / ERR_EVERY);
    {
        const char *first = strstr(html, "<tr><td>0</td>"), *second = strstr(html, "<tr><td>1</td>");
        const char *ok = strstr(html, "<tr><td>39998</td>");
        const char *last = strstr(html, "<tr class=\"err\"><td>39999</td>");
        assert_true(first && second && ok && last);
        assert_true(first < second && second < ok && ok < last);
    }
    kbt_msg_has(html, "<h2 id=\"terms\">Terms</h2>");
    free(html);
}

/* A decoder sweep's rows (TP size x format, with the time split and the roofline): the split
 * section, and in it the roofline efficiency against the TP size, one line per format, each
 * point at its row's value on the 0..1 axis. */
static void test_report_decoder(void **s)
{
    static const char *const fmt[] = { "f16", "int8", "fp8e4m3" };
    char path[512];
    char *html, *plot, *end;
    FILE *f;
    (void)s;
    kbt_path(path, sizeof path, "dec.csv");
    assert_non_null(f = fopen(path, "w"));
    fprintf(f, "point,system.sips.count,dtype,bench,size_bytes,sim_time_ns,algbw_gbps,"
               "busbw_gbps,bound_ns,efficiency,bound_resource,events,wall_ms,compute_ns,"
               "memory_ns,comm_ns,tokens_per_s,verified,status,error,roofline_ns,"
               "roofline_bound,roofline_efficiency\n");
    for (int p = 0; p < 12; p++) {
        int tp = 1 << (p / 3), k = p % 3;
        double t = 400000.0 / tp + 1000.0 * k, rl = 20000.0 / tp;
        fprintf(f, "%d,%d,%s,decoder_layer,,%.3f,,,%.3f,%.9g,pe_dma sip0/cube0/pe0,100,1.0,"
                   "%.3f,%.3f,%.3f,%.3f,,ok,,%.3f,compute,%.9g\n", p, tp, fmt[k], t, t / 10,
                0.1, t / 10, t / 2, t / 3, 128e9 / t, rl, rl / t);
    }
    assert_int_equal(fclose(f), 0);
    html = render("dec");
    kbt_msg_has(html, "<h2 id=\"split\">Decoder layer: time split vs TP size</h2>");
    kbt_msg_has(html, "<dt><b>roofline efficiency</b> (a fraction, 0..1)</dt>");
    plot = strstr(html, "aria-label=\"roofline efficiency vs TP size\"");
    assert_non_null(plot);
    assert_non_null(end = strstr(plot, "</svg>"));
    *end = 0;
    assert_int_equal(count_str(plot, "<g class=\"legend\">"), 3);
    for (int k = 0; k < 3; k++) {
        char want[64];
        snprintf(want, sizeof want, "\">dtype=%s</text></g>", fmt[k]);
        assert_int_equal(count_str(plot, want), 1);
    }
    assert_int_equal(count_str(plot, "<polyline class=\"series\""), 3);
    assert_int_equal(count_str(plot, "<circle "), 12);
    kbt_msg_has(plot, "roofline efficiency (roofline / sim time)");
    *end = '<';
    free(html);
}

/* A sweep written since the command path has its own part (launch_ns): a fourth column and
 * bar part, and the total the sum of the four. */
static void test_report_decoder_launch(void **s)
{
    char path[512];
    char *html;
    FILE *f;
    (void)s;
    kbt_path(path, sizeof path, "decl.csv");
    assert_non_null(f = fopen(path, "w"));
    fprintf(f, "point,system.sips.count,bench,sim_time_ns,compute_ns,memory_ns,comm_ns,"
               "launch_ns,tokens_per_s,status\n");
    fprintf(f, "0,2,decoder_layer,10000,1000,2000,3000,4000,12800000,ok\n");
    fprintf(f, "1,4,decoder_layer,6000,500,1500,2500,1500,21333333,ok\n");
    assert_int_equal(fclose(f), 0);
    html = render("decl");
    kbt_msg_has(html, "<th>comm (us)</th><th>launch (us)</th><th>total (us)</th>");
    kbt_msg_has(html, "<td>2</td><td>1.000</td><td>2.000</td><td>3.000</td><td>4.000</td>"
                      "<td>10.000</td>");
    kbt_msg_has(html, "<td>4</td><td>0.500</td><td>1.500</td><td>2.500</td><td>1.500</td>"
                      "<td>6.000</td>");
    kbt_msg_has(html, "aria-label=\"launch time vs TP size\"");
    free(html);
}

static int setup(void **s)
{
    (void)s;
    return kbt_workdir_make("kbcl-report");
}

static int teardown(void **s)
{
    (void)s;
    return kbt_workdir_remove();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_40k),
        cmocka_unit_test(test_report_decoder),
        cmocka_unit_test(test_report_decoder_launch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
