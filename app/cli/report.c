/*
 * kbcl report — renders the rows of a `kbcl sweep` (CSV or JSON Lines) as one self-contained
 * HTML page: inline SVG line plots (simulated time and busbw against world size, one plot per
 * message size; busbw and time against message size, one plot per world size, as nccl-tests
 * users plot them; log2 x axes, sizes labelled B/KiB/MiB/GiB; one line per algorithm, or per
 * combination of the other swept keys; when the algorithms are collectives of more than one
 * kind, busbw against message size gets one group of plots per collective, the kind of each
 * algorithm coming from the shipped ccl.yaml and the registries), the efficiency (bound_ns /
 * sim_time_ns, how close a run came to its busiest resource's bound) against world size and
 * message size on a fixed 0..1 axis, and a table of every row. Each plot's legend names the
 * series it draws (a series keeps its color in every plot); a Terms section defines algbw,
 * busbw (with each collective's factor) and efficiency. Points' tooltips carry the
 * efficiency and the bound's resource when the rows have them. The work grows with the rows
 * (and their sorts): series are found by hashing, each group of plots is one pass over the
 * rows and one sort of its points, numbers are read once per column. No scripts, fonts or
 * network: the file opens anywhere and is byte-for-byte the same for the same rows. Limits:
 * rows with the decoder_layer time split (compute_ns, memory_ns, comm_ns) and a
 * system.sips.count axis also get the split against the TP size: stacked bars per row of a
 * table (one line per combination of the other swept keys), one line plot per part and, when
 * the rows have it, the roofline efficiency against the TP size (one line per format).
 * Only rows with status ok are plotted; a quantity is an x axis only when it takes more than
 * one value (world_size, and size_bytes or, in files from before it, n_elem); other sweeps get
 * the table only; rows must be single lines. This file writes the page and its sections; the
 * rows are read and indexed in report_table.c, the plots drawn in report_svg.c, into the text
 * of report_text.c (what they share: kb_report_int.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_ccl.h"
#include "kb_ccl_reg.h"
#include "kb_cli.h"
#include "kb_dist_algo.h"
#include "kb_report_int.h"

/* ---------------------------------------------------------------- collectives --------- */

/* The collective kind of each row's algorithm (-1: none, or not an entry of the shipped
 * ccl.yaml with a built-in module), looked up once per distinct name. */
static int row_kinds(const rp_table *t, int calg, int *kind)
{
    kb_ccl_cfg *cfg = malloc(sizeof *cfg);
    char buf[4096];
    kb_errbuf eb;
    const char *path = kbcl_default_config("ccl.yaml", buf, sizeof buf);
    int nkinds = 0, seen[KB_COLL_NKINDS] = { 0 };
    for (int r = 0; r < t->nrow; r++)
        kind[r] = -1;
    if (!cfg)
        return 0;
    kb_ccl_config_defaults(cfg);
    if (calg >= 0 && path && kb_ccl_config_load(cfg, path, &eb) == 0)
        for (int r = 0; r < t->nrow; r++) {
            const kb_ccl_algo *e = kb_ccl_config_find(cfg, t->cell[r][calg]);
            const kb_ccl_algo_impl *a = e ? kb_ccl_reg_find_algo(NULL, e->module) : NULL;
            const kb_ccl_algo_impl *d = e ? kb_ccl_reg_find_dist(NULL, e->module) : NULL;
            kind[r] = a ? (int)a->kind : d ? (int)d->kind : -1;
            if (kind[r] >= 0 && !seen[kind[r]]++)
                nkinds++;
        }
    free(cfg);
    return nkinds;
}

/* ---------------------------------------------------------------- the page ------------ */

/* The bus factors as nccl-tests writes them, n the world size. */
static const char *const busbw_form[] = { "2(n-1)/n", "(n-1)/n", "1" };

static double busbw_form_value(int form, int n)
{
    return form == 0 ? 2.0 * (n - 1) / n : form == 1 ? (n - 1.0) / n : 1.0;
}

/*
 * What the plotted quantities mean, with units: algbw and busbw when the rows have busbw,
 * efficiency when they have one. The factor of each collective is read from
 * kb_coll_busbw_factor, the one that computed the rows' busbw, by the form it takes over world
 * sizes, so that the page cannot name another factor than the one used.
 */
static void glossary(rp_buf *b, int bus, int eff, int reff)
{
    if (!bus && !eff && !reff)
        return;
    rp_puts(b, "<h2 id=\"terms\">Terms</h2>\n<dl class=\"terms\">\n");
    if (bus) {
        static const int ns[] = { 2, 3, 8, 256 };
        int shown[KB_COLL_NKINDS] = { 0 };
        rp_puts(b, "<dt><b>algbw</b> (GB/s)</dt><dd>algorithm bandwidth: size_bytes / "
                "sim_time_ns, the bytes of one rank's buffer (nccl-tests' size) over the "
                "simulated time; bytes per ns are GB/s (10<sup>9</sup> bytes/s).</dd>\n"
                "<dt><b>busbw</b> (GB/s)</dt><dd>bus bandwidth, nccl-tests' definition: algbw "
                "&times; the bus factor of the algorithm's collective, for n ranks (the world "
                "size): ");
        for (int f = 0, nf = 0; f < (int)(sizeof busbw_form / sizeof busbw_form[0]); f++) {
            int nk = 0;
            for (int k = 0; k < KB_COLL_NKINDS; k++) {
                int same = 1;
                for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
                    same &= fabs(kb_coll_busbw_factor((kb_coll_kind)k, ns[i]) -
                                 busbw_form_value(f, ns[i])) < 1e-12;
                if (!same || shown[k])
                    continue;
                shown[k] = 1;
                rp_printf(b, "%s%s", nk++ ? ", " : nf++ ? "; " : "",
                          kb_coll_name((kb_coll_kind)k));
            }
            if (nk)
                rp_printf(b, " %s", busbw_form[f]);
        }
        rp_puts(b, ". That is the traffic per rank of a bandwidth-optimal algorithm of the "
                "collective, so busbw compares across world sizes and across the algorithms "
                "of one collective, not across collectives.</dd>\n");
    }
    if (eff)
        rp_puts(b, "<dt><b>efficiency</b> (a fraction, 0..1)</dt><dd>bound_ns / sim_time_ns: "
                "bound_ns is the time the run's busiest resource (bound_resource: a link, a "
                "NoC, HBM, a PE's unit or DMA engine) needs for what it carried at its "
                "bandwidth, which no schedule of the same traffic can beat; 1 means that "
                "resource was busy for the whole simulated time.</dd>\n");
    if (reff)
        rp_puts(b, "<dt><b>roofline efficiency</b> (a fraction, 0..1)</dt><dd>roofline_ns / "
                "sim_time_ns: roofline_ns is the workload's lower bound on the machine, the "
                "largest of its flops at the units' peak, its minimum memory traffic at the "
                "memories' aggregate bandwidth and its minimum link traffic at the links' "
                "(roofline_bound says which), whatever the schedule or placement "
                "(docs/decoder.md, Roofline); 1 would be a run at that bound.</dd>\n");
    rp_puts(b, "</dl>\n");
}

/* The page's head and its first paragraph: how many rows, how many ok, failed and errors. */
static void page_head(rp_buf *b, const char *src, const rp_plotdata *pd)
{
    rp_printf(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
              "<title>kbcl sweep report: ");
    rp_esc(b, src);
    rp_printf(b, "</title>\n<style>\n"
              "body{font-family:sans-serif;margin:24px;color:#222}\n"
              "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}\n"
              "svg.plot{display:block;margin:12px 0;border:1px solid #ddd}\n"
              "table{border-collapse:collapse;font-size:12px}\n"
              "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}\n"
              "th{background:#f3f3f3}tr.err td{background:#fde}tr.bad td{background:#fec}\n"
              "</style>\n</head>\n<body>\n<h1>kbcl sweep report: ");
    rp_esc(b, src);
    rp_printf(b, "</h1>\n<p>%d rows: %d ok (%d failed verification), %d errors.", pd->t->nrow,
              pd->nok, pd->nbad, pd->nerr);
    if (pd->nerr)
        rp_printf(b, " Rows with errors are not plotted; they are red in the table.");
    rp_printf(b, "</p>\n");
}

/* What the plotted rows have, which decides the page's sections of plots. */
typedef struct page_axes {
    int cx;               /* the message size column */
    const char *xsize;    /* its axis label */
    int ws_varies, size_varies;
    int any_bus, any_eff; /* a plotted row has busbw, an efficiency */
} page_axes;

static void find_axes(rp_plotdata *pd, page_axes *ax)
{
    const rp_table *t = pd->t;
    const rp_cols *c = pd->c;

    /* the message size: size_bytes (nccl-tests' size per rank) when the rows have it, else
     * the n_elem column of files from before it */
    ax->cx = c->n_elem;
    if (c->bytes >= 0)
        for (int r = 0; r < t->nrow; r++)
            if (pd->row_series[r] >= 0 && *t->cell[r][c->bytes]) {
                ax->cx = c->bytes;
                break;
            }
    ax->xsize = ax->cx == c->bytes ? "message size (bytes per rank)"
                                   : "n_elem (elements per rank)";
    ax->ws_varies = rp_n_distinct(pd, c->ws) > 1;
    ax->size_varies = rp_n_distinct(pd, ax->cx) > 1;
    ax->any_bus = ax->any_eff = 0;
    for (int r = 0; c->busbw >= 0 && r < t->nrow; r++)
        ax->any_bus |= pd->row_series[r] >= 0 && *t->cell[r][c->busbw];
    /* older result files have no efficiency column; rows without a bound leave it empty */
    for (int r = 0; c->eff >= 0 && r < t->nrow; r++)
        ax->any_eff |= pd->row_series[r] >= 0 && *t->cell[r][c->eff];
}

/* Simulated time, busbw and efficiency against the world size, one plot per message size. */
static void plots_vs_world(rp_buf *b, rp_plotdata *pd, const page_axes *ax, int *nplots)
{
    const rp_cols *c = pd->c;

    if (c->time >= 0) {
        rp_printf(b, "<h2 id=\"time\">Simulated time vs world size</h2>\n");
        rp_plot_group(b, pd, &(rp_plotspec){ c->ws, c->time, 1e-3, ax->cx,
                                             "sim time vs world size", "world size (ranks)",
                                             "sim time (us)", Y_AUTO }, nplots);
    }
    if (ax->any_bus) {
        rp_printf(b, "<h2 id=\"busbw\">Bus bandwidth vs world size</h2>\n");
        rp_plot_group(b, pd, &(rp_plotspec){ c->ws, c->busbw, 1, ax->cx, "busbw vs world size",
                                             "world size (ranks)", "busbw (GB/s)", Y_LINEAR },
                      nplots);
    }
    if (ax->any_eff) {
        rp_printf(b, "<h2 id=\"efficiency\">Efficiency vs world size</h2>\n");
        rp_plot_group(b, pd, &(rp_plotspec){ c->ws, c->eff, 1, ax->cx,
                                             "efficiency vs world size", "world size (ranks)",
                                             EFF_LABEL, Y_FRACTION }, nplots);
    }
}

/* Busbw against message size, one group of plots per collective in kb_coll_kind order, when
 * the algorithms are collectives of more than one kind: busbw is comparable within a
 * collective (nccl-tests' factor), its level differs across them. Returns 0 when it drew
 * nothing (one kind, or out of memory), for the caller to draw one group of every row. */
static int busbw_by_kind(rp_buf *b, rp_plotdata *pd, const page_axes *ax, int *nplots)
{
    const rp_table *t = pd->t;
    int *kind = malloc((size_t)(t->nrow + 1) * sizeof *kind);
    int *all = pd->row_series, *mine = malloc((size_t)(t->nrow + 1) * sizeof *mine);
    int nkinds = kind && mine ? row_kinds(t, pd->c->algorithm, kind) : 0;

    for (int k = 0; nkinds > 1 && k < KB_COLL_NKINDS; k++) {
        int any = 0;
        char what[96];
        for (int r = 0; r < t->nrow; r++) {
            mine[r] = kind[r] == k ? all[r] : -1;
            any |= mine[r] >= 0;
        }
        if (!any)
            continue;
        rp_printf(b, "<h2 id=\"busbw-size-%s\">Bus bandwidth vs message size: %s</h2>\n",
                  kb_coll_name((kb_coll_kind)k), kb_coll_name((kb_coll_kind)k));
        snprintf(what, sizeof what, "%s busbw vs message size", kb_coll_name((kb_coll_kind)k));
        pd->row_series = mine;
        rp_plot_group(b, pd, &(rp_plotspec){ ax->cx, pd->c->busbw, 1, pd->c->ws, what,
                                             ax->xsize, "busbw (GB/s)", Y_LINEAR }, nplots);
        pd->row_series = all;
    }
    free(kind);
    free(mine);
    return nkinds > 1;
}

/* nccl-tests' view, one plot per world size: busbw against size (linear, it levels off at
 * the link rate), then time against size (log when it spans decades), then efficiency. */
static void plots_vs_size(rp_buf *b, rp_plotdata *pd, const page_axes *ax, int *nplots)
{
    const rp_cols *c = pd->c;

    if (ax->any_bus && !busbw_by_kind(b, pd, ax, nplots)) {
        rp_printf(b, "<h2 id=\"busbw-size\">Bus bandwidth vs message size</h2>\n");
        rp_plot_group(b, pd, &(rp_plotspec){ ax->cx, c->busbw, 1, c->ws,
                                             "busbw vs message size", ax->xsize,
                                             "busbw (GB/s)", Y_LINEAR }, nplots);
    }
    if (c->time >= 0) {
        rp_printf(b, "<h2 id=\"size\">Simulated time vs message size</h2>\n");
        rp_plot_group(b, pd, &(rp_plotspec){ ax->cx, c->time, 1e-3, c->ws,
                                             "sim time vs message size", ax->xsize,
                                             "sim time (us)", Y_AUTO }, nplots);
    }
    /* every series in one plot per world size, as busbw against size, but not split by
     * collective: an efficiency is a fraction of the run's own bound, so it compares across
     * kinds where busbw (nccl-tests' factor per kind) does not */
    if (ax->any_eff) {
        rp_printf(b, "<h2 id=\"efficiency-size\">Efficiency vs message size</h2>\n");
        rp_plot_group(b, pd, &(rp_plotspec){ ax->cx, c->eff, 1, c->ws,
                                             "efficiency vs message size", ax->xsize,
                                             EFF_LABEL, Y_FRACTION }, nplots);
    }
}

/* The terms, then the plots against world size and against message size, each section when
 * its quantity varies over the plotted rows. */
static void page_plots(rp_buf *b, rp_plotdata *pd, int *nplots)
{
    page_axes ax;

    find_axes(pd, &ax);
    /* the roofline's efficiency is plotted in the decoder's split section (TP size axis) */
    glossary(b, ax.any_bus, ax.any_eff,
             pd->c->tp >= 0 && pd->c->reff >= 0 && rp_n_distinct(pd, pd->c->tp) > 1);
    if (ax.ws_varies)
        plots_vs_world(b, pd, &ax, nplots);
    if (ax.size_varies)
        plots_vs_size(b, pd, &ax, nplots);
}

/* ---------------------------------------------------------------- the time split ------ */

/* launch: files from before the command path had its own part lack it (then 0) */
static const char *const split_part[RP_NSPLIT] = { "compute", "memory", "communication",
                                                   "launch" };
static const char *const split_color[RP_NSPLIT] = { "#1f77b4", "#ff7f0e", "#d62728",
                                                    "#7f7f7f" };

/* Part k of row r's split in ns (0 where the file has no such column). */
static double split_val(const rp_plotdata *pd, int r, int k)
{
    int c = pd->c->split[k];
    return c >= 0 ? strtod(pd->t->cell[r][c], NULL) : 0;
}

/* The parts the file has: the launch part only in files written since it was split off. */
static int split_parts(const rp_cols *c)
{
    return c->split[3] >= 0 ? 4 : 3;
}

/* The split section's heading, its legend of bar colors and the table's header. */
static void split_head(rp_buf *b, const rp_cols *c)
{
    rp_printf(b, "<h2 id=\"split\">Decoder layer: time split vs TP size</h2>\n"
              "<p>Simulated time of the layer split into compute, memory, "
              "communication%s (docs/decoder.md), per TP size (system.sips.count), one "
              "group per combination of the other swept keys. Bars: ",
              split_parts(c) > 3 ? " and the launches' command path" : "");
    for (int k = 0; k < split_parts(c); k++)
        rp_printf(b, "<span style=\"color:%s\">&#9632; %s</span> ", split_color[k],
                  split_part[k]);
    rp_printf(b, "</p>\n<table>\n<tr><th>series</th><th>TP</th><th>compute (us)</th>"
              "<th>memory (us)</th><th>comm (us)</th>%s<th>total (us)</th>"
              "<th>tokens/s</th>%s<th>split</th></tr>\n",
              split_parts(c) > 3 ? "<th>launch (us)</th>" : "",
              c->eff >= 0 ? "<th>efficiency</th>" : "");
}

/* The longest total time of a plotted row: the bars' full width. */
static double split_tmax(const rp_plotdata *pd)
{
    double tmax = 0;
    for (int r = 0; r < pd->t->nrow; r++)
        if (pd->row_series[r] >= 0) {
            double tot = 0;
            for (int k = 0; k < split_parts(pd->c); k++)
                tot += split_val(pd, r, k);
            tmax = fmax(tmax, tot);
        }
    return tmax;
}

/* The plotted rows of each series in point order, in one pass: series s's are byser[first[s]]
 * .. byser[first[s + 1] - 1] (rather than one pass over all rows per series). The caller
 * frees both, also on failure. */
static int rows_by_series(const rp_plotdata *pd, int **firstp, int **byserp)
{
    const rp_table *t = pd->t;
    int *first = *firstp = calloc((size_t)pd->nseries + 2, sizeof *first);
    int *byser = *byserp = malloc((size_t)(t->nrow + 1) * sizeof *byser);

    if (!first || !byser)
        return KB_ERR_NOMEM;
    for (int r = 0; r < t->nrow; r++)
        if (pd->row_series[r] >= 0)
            first[pd->row_series[r] + 2]++;
    for (int s = 0; s < pd->nseries; s++)
        first[s + 2] += first[s + 1];
    for (int i = 0; i < t->nrow; i++)
        if (pd->row_series[pd->order[i]] >= 0)
            byser[first[pd->row_series[pd->order[i]] + 1]++] = pd->order[i];
    return 0;
}

/* Row r of series s in the split table: its parts, total, tokens/s and efficiency, and its
 * stacked bar (tmax the full width). */
static void split_row(rp_buf *b, const rp_plotdata *pd, int s, int r, double tp, double tmax)
{
    const rp_table *t = pd->t;
    const rp_cols *c = pd->c;
    double v[RP_NSPLIT], tot = 0, x = 0;
    int np = split_parts(c);

    for (int k = 0; k < np; k++)
        tot += (v[k] = split_val(pd, r, k));
    rp_printf(b, "<tr><td style=\"text-align:left\">");
    rp_esc(b, pd->series[s]);
    rp_printf(b, "</td><td>%g</td>", tp);
    for (int k = 0; k < np; k++)
        rp_printf(b, "<td>%.3f</td>", v[k] * 1e-3);
    rp_printf(b, "<td>%.3f</td><td>%s</td>", tot * 1e-3,
              c->tps >= 0 ? t->cell[r][c->tps] : "");
    if (c->eff >= 0 && *t->cell[r][c->eff])
        rp_printf(b, "<td>%.3f</td>", strtod(t->cell[r][c->eff], NULL));
    else if (c->eff >= 0)
        rp_printf(b, "<td></td>");
    rp_printf(b, "<td>");
    rp_printf(b, "<svg width=\"320\" height=\"12\">");
    for (int k = 0; k < np; k++) {
        double w = tmax > 0 ? v[k] / tmax * 320.0 : 0;
        rp_printf(b, "<rect x=\"%.2f\" y=\"0\" width=\"%.2f\" height=\"12\" "
                  "fill=\"%s\"/>", x, w, split_color[k]);
        x += w;
    }
    rp_printf(b, "</svg></td></tr>\n");
}

/* The table rows of series s, whose rows in point order are rows[0 .. n - 1]: its first
 * KB_MAX_GSIPS of them, by TP size. */
static void split_series(rp_buf *b, const rp_plotdata *pd, int s, const int *rows, int n,
                         double tmax)
{
    double tps[KB_MAX_GSIPS];
    int rows_s[KB_MAX_GSIPS], m = 0;

    for (int i = 0; i < n && m < KB_MAX_GSIPS; i++) {
        int r = rows[i], j;
        double v = strtod(pd->t->cell[r][pd->c->tp], NULL);
        for (j = m; j > 0 && tps[j - 1] > v; j--)
            tps[j] = tps[j - 1], rows_s[j] = rows_s[j - 1];
        tps[j] = v;
        rows_s[j] = r;
        m++;
    }
    for (int i = 0; i < m; i++)
        split_row(b, pd, s, rows_s[i], tps[i], tmax);
}

/* The decoder layer's time split against the TP size: a table of stacked bars (one line per
 * row, grouped by series), then one line plot per part. */
static int page_split(rp_buf *b, rp_plotdata *pd, int *nplots, kb_errbuf *eb)
{
    int *first = NULL, *byser = NULL, rc = 0;
    double tmax;

    split_head(b, pd->c);
    tmax = split_tmax(pd);
    if (rows_by_series(pd, &first, &byser) != 0) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int s = 0; s < pd->nseries; s++)
        split_series(b, pd, s, byser + first[s], first[s + 1] - first[s], tmax);
    rp_printf(b, "</table>\n");
    for (int k = 0; k < split_parts(pd->c); k++) {
        char what[64], ylab[64];
        snprintf(what, sizeof what, "%s time vs TP size", split_part[k]);
        snprintf(ylab, sizeof ylab, "%s (us)", split_part[k]);
        rp_plot_group(b, pd, &(rp_plotspec){ pd->c->tp, pd->c->split[k], 1e-3, -1, what,
                                             "TP size (SIPs)", ylab, Y_LINEAR }, nplots);
    }
    /* how close each format (each series) comes to the layer's roofline at each TP size */
    if (pd->c->reff >= 0)
        rp_plot_group(b, pd, &(rp_plotspec){ pd->c->tp, pd->c->reff, 1, -1,
                                             "roofline efficiency vs TP size", "TP size (SIPs)",
                                             "roofline efficiency (roofline / sim time)",
                                             Y_FRACTION }, nplots);
out:
    free(first);
    free(byser);
    return rc;
}

/* ---------------------------------------------------------------- the rows ------------ */

/* The table of every row in point order: rows not ok are marked err, rows that failed
 * verification bad (their colors are in the page's style). */
static void page_rows(rp_buf *b, const rp_plotdata *pd)
{
    const rp_table *t = pd->t;
    const rp_cols *c = pd->c;

    rp_printf(b, "<h2 id=\"rows\">Rows</h2>\n<table>\n<tr>");
    for (int k = 0; k < t->ncol; k++) {
        rp_printf(b, "<th>");
        rp_esc(b, t->col[k]);
        rp_printf(b, "</th>");
    }
    rp_printf(b, "</tr>\n");
    for (int i = 0; i < t->nrow; i++) {
        int r = pd->order[i];
        int err = c->status >= 0 && strcmp(t->cell[r][c->status], "ok");
        int bad = c->verified >= 0 && !strcmp(t->cell[r][c->verified], "false");
        rp_printf(b, "<tr%s>", err ? " class=\"err\"" : bad ? " class=\"bad\"" : "");
        for (int k = 0; k < t->ncol; k++) {
            rp_printf(b, "<td>");
            rp_esc(b, t->cell[r][k]);
            rp_printf(b, "</td>");
        }
        rp_printf(b, "</tr>\n");
    }
    rp_printf(b, "</table>\n");
}

static int render(const rp_table *t, const char *src, rp_buf *b, kb_errbuf *eb)
{
    rp_cols c;
    rp_plotdata pd;
    int nplots = 0, rc;

    rp_cols_find(t, &c);
    if ((rc = rp_plotdata_build(&pd, t, &c, eb)) != 0)
        goto out;
    page_head(b, src, &pd);
    page_plots(b, &pd, &nplots);
    if (c.tp >= 0 && rp_n_distinct(&pd, c.tp) > 1 && (rc = page_split(b, &pd, &nplots, eb)) != 0)
        goto out;
    if (!nplots)
        rp_printf(b, "<p>No plots: they need ok rows in which the world size or the message "
                  "size (size_bytes, n_elem) takes more than one value.</p>\n");
    page_rows(b, &pd);
    rp_printf(b, "<p>Generated by kbcl %s report.</p>\n</body>\n</html>", KBCL_VERSION);
    if (b->oom || pd.oom)
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
out:
    rp_plotdata_free(&pd);
    return rc;
}

int kbcl_report_render(const char *in, char **html, kb_errbuf *eb)
{
    rp_table t;
    rp_buf b = { NULL, 0, 0, 0 };
    int rc;

    *html = NULL;
    if ((rc = rp_table_read(in, &t, eb)) == 0 && (rc = render(&t, in, &b, eb)) == 0) {
        *html = b.s;
        b.s = NULL;
    }
    rp_table_free(&t);
    free(b.s);
    return rc;
}

static void usage_report(FILE *f)
{
    fputs("usage: kbcl report RESULTS.csv|RESULTS.jsonl [-o REPORT.html]\n"
          "\n"
          "Renders the rows of kbcl sweep as one self-contained HTML page (inline SVG plots of\n"
          "sim time, busbw and efficiency (bound_ns / sim_time_ns) against world size and\n"
          "against message size, size_bytes on a log2 axis in B/KiB/MiB/GiB, one line per\n"
          "algorithm, a legend per plot of its lines; the terms algbw, busbw and efficiency\n"
          "defined; and a table of the rows).\n"
          "  -o, --out FILE   the page (default: RESULTS with its extension replaced by .html)\n",
          f);
}

int kbcl_cmd_report(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    char outbuf[4096], *html = NULL;
    kb_errbuf eb = { { 0 } };
    int rc;

    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_report(stdout);
            return 0;
        } else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] == '-' || in) {
            fprintf(stderr, "kbcl report: unexpected argument '%s' (see kbcl report --help)\n",
                    argv[i]);
            return KBCL_EXIT_USAGE;
        } else {
            in = argv[i];
        }
    }
    if (!in) {
        usage_report(stderr);
        return KBCL_EXIT_USAGE;
    }
    if (!out) {
        const char *dot = strrchr(in, '.'), *slash = strrchr(in, '/');
        int stem = dot && (!slash || dot > slash) ? (int)(dot - in) : (int)strlen(in);
        snprintf(outbuf, sizeof outbuf, "%.*s.html", stem, in);
        out = outbuf;
    }
    const char *ins[1] = { in };
    if ((rc = kbcl_check_output("the page", out, ins, 1, &eb)) == 0 &&
        (rc = kbcl_report_render(in, &html, &eb)) == 0)
        rc = kbcl_write_atomic(out, html, &eb);
    free(html);
    if (rc) {
        fprintf(stderr, "kbcl report: %s\n", eb.msg);
        return KBCL_EXIT_USAGE;
    }
    return 0;
}
