/*
 * report_svg.c — the line plots of `kbcl report`: for a group of plots (a metric against an x
 * column, one plot per value of a panel column), the points gathered from the indexed rows in
 * one pass and one sort, then per plot one inline <svg>: a log2 x axis (sizes in bytes
 * labelled B/KiB/MiB/GiB), a y axis linear from zero, in decades when the values span more
 * than 30x, or 0..1 for an efficiency; one polyline per series in its color of every plot,
 * each point with a tooltip (its series, x and y, and the row's bound when it has one), and a
 * legend of the plot's series. Limits: the x axis holds positive finite values only (other
 * points are left out); a NaN panel value is no panel; the picture is 760 x 380 px, wider
 * for long series names and taller for many.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_report_int.h"

static const char *const palette[] = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                       "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" };
#define NPAL ((int)(sizeof palette / sizeof palette[0]))

/* A point of a plot: its row's position in point order (pos) breaks ties, so that every sort
 * below gives one order whatever qsort does with equal keys. */
typedef struct pt {
    double x, y;
    int row, pos, series, panel;
} pt;

/* Column c's cells as numbers (strtod: 0 for text, as the cells were always read), converted
 * once per column: plots read the same columns again for every panel and every group. NULL
 * (and pd->oom) when out of memory. */
static const double *col_num(rp_plotdata *pd, int c)
{
    if (!pd->num[c]) {
        double *v = malloc((size_t)(pd->t->nrow + 1) * sizeof *v);
        if (!v) {
            pd->oom = 1;
            return NULL;
        }
        for (int r = 0; r < pd->t->nrow; r++)
            v[r] = strtod(pd->t->cell[r][c], NULL);
        pd->num[c] = v;
    }
    return pd->num[c];
}

/* Which columns are sizes in bytes: size_bytes (the panel title says "size = 1 KiB"). */
static int is_bytes_col(const rp_table *t, int c)
{
    return c >= 0 && !strcmp(t->col[c], "size_bytes");
}

typedef struct axis {
    double lo, hi;        /* data range mapped to the axis (log10/log2 units when log) */
    int log;              /* 0 linear, 2 log2, 10 log10 */
} axis;

/* One plot being drawn: its points (sorted by series, then x, then point), its axes. */
typedef struct plot {
    const rp_plotdata *pd;
    const rp_plotspec *ps;
    const pt *pts;
    int npts;
    int xbytes;           /* x is a size in bytes, labelled with binary units */
    axis xa, ya;
} plot;

#define PW 760   /* svg width */
#define PH 380
#define ML 78    /* plot area margins */
#define MR 230   /* legend column */
#define MT 34
#define MB 52

static double tx(const axis *a, double v)
{
    double u = a->log == 2 ? log2(v) : a->log == 10 ? log10(v) : v;
    return ML + (u - a->lo) / (a->hi - a->lo) * (PW - ML - MR);
}

static double ty(const axis *a, double v)
{
    double u = a->log == 10 ? log10(v) : v;
    return PH - MB - (u - a->lo) / (a->hi - a->lo) * (PH - MT - MB);
}

static void fmt_tick(char *b, size_t n, double v)
{
    if (v != 0 && (fabs(v) >= 1e6 || fabs(v) < 1e-3))
        snprintf(b, n, "%.0e", v);
    else
        snprintf(b, n, "%g", v);
}

/* A byte count with a binary unit: "8 B", "1 KiB", "1.5 MiB", "1 GiB". */
static void fmt_bytes(char *b, size_t n, double v)
{
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    int u = 0;
    while (u < 5 && fabs(v) >= 1024) {
        v /= 1024;
        u++;
    }
    snprintf(b, n, "%g %s", v, unit[u]);
}

/* Nice linear step (1, 2 or 5 times a power of ten) for about 5 ticks over span. */
static double nice_step(double span)
{
    double raw = span / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* A vertical grid line at x with its tick and label (none when lab is NULL) under the plot
 * area. */
static void svg_xtick(rp_buf *b, double x, const char *lab)
{
    rp_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e6e6e6\"/>"
              "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#444\"/>",
              x, MT, x, PH - MB, x, PH - MB, x, PH - MB + (lab ? 5 : 3));
    if (lab)
        rp_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x,
                  PH - MB + 18, lab);
    else
        rp_printf(b, "\n");
}

/* A horizontal grid line at y with its tick and label left of the plot area. */
static void svg_ytick(rp_buf *b, double y, const char *lab)
{
    rp_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>"
              "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#444\"/>",
              ML, y, PW - MR, y, ML - 5, y, ML, y);
    rp_printf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", ML - 8,
              y + 4, lab);
}

/* The bound of row r for a point's tooltip: "; efficiency 0.599 (bound 8192 ns by pe_gemm
 * sip0/cube0/pe0)", without the efficiency in a plot of it; nothing when the row has none. */
static void svg_bound_tip(rp_buf *b, const rp_plotdata *pd, int r, int is_eff_plot)
{
    const rp_cols *c = pd->c;
    const char *eff = c->eff >= 0 ? pd->t->cell[r][c->eff] : "";
    const char *bound = c->bound >= 0 ? pd->t->cell[r][c->bound] : "";
    const char *res = c->bres >= 0 ? pd->t->cell[r][c->bres] : "";
    if (!*eff || !*bound)
        return;
    if (is_eff_plot)
        rp_printf(b, "; bound %.6g ns", strtod(bound, NULL));
    else
        rp_printf(b, "; efficiency %.3g (bound %.6g ns", strtod(eff, NULL), strtod(bound, NULL));
    if (*res) {
        rp_printf(b, " by ");
        rp_esc(b, res);
    }
    if (!is_eff_plot)
        rp_printf(b, ")");
}

/* The axes over the plot's points: x log2 over whole powers of two around them; y as the
 * spec's ymode says, over whole decades or linear from 0 to a whole step. */
static void fit_axes(plot *p)
{
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;

    p->xa = (axis){ 0, 1, 2 };
    p->ya = (axis){ 0, 1, 0 };
    for (int i = 0; i < p->npts; i++) {
        xmin = fmin(xmin, p->pts[i].x);
        xmax = fmax(xmax, p->pts[i].x);
        ymin = fmin(ymin, p->pts[i].y);
        ymax = fmax(ymax, p->pts[i].y);
    }
    /* x: log2 over whole powers of two around the data */
    p->xa.lo = floor(log2(xmin));
    p->xa.hi = ceil(log2(xmax));
    if (p->xa.hi <= p->xa.lo)
        p->xa.lo -= 1, p->xa.hi += 1;
    /* y: log10 over whole decades when the data spans more than 30x, else linear from 0 */
    if (p->ps->ymode == Y_AUTO && ymin > 0 && ymax / ymin > 30) {
        p->ya.log = 10;
        p->ya.lo = floor(log10(ymin));
        p->ya.hi = ceil(log10(ymax));
    } else {
        double st = nice_step(ymax > 0 ? ymax : 1);
        p->ya.lo = 0;
        p->ya.hi = ceil((ymax > 0 ? ymax : 1) / st) * st;
        if (p->ps->ymode == Y_FRACTION && ymax <= 1)
            p->ya.hi = 1;
    }
}

/* The picture's size: the legend column grows with the longest name (about 7 px per
 * character) and the picture with the number of names. */
static void plot_size(const plot *p, int *width, int *height)
{
    int nleg = 0;

    *width = PW;
    *height = PH;
    for (int i = 0; i < p->npts; i++) {
        const char *name = p->pd->series[p->pts[i].series];
        if (i > 0 && p->pts[i].series == p->pts[i - 1].series)
            continue;
        nleg++;
        if (PW - MR + 56 + 7 * (int)strlen(name) > *width)
            *width = PW - MR + 56 + 7 * (int)strlen(name);
    }
    if (MT + 20 + 20 * nleg > *height)
        *height = MT + 20 + 20 * nleg;
}

/* The x grid, ticks and labels. */
static void svg_xgrid(rp_buf *b, const plot *p)
{
    const axis *xa = &p->xa;
    char lab[64];

    if (p->xbytes) {
        /* a grid line per power of two; labels on every step-th one, counted from 1 B, so that
         * 1 KiB, 1 MiB, 1 GiB get theirs once labels thin out, and at most 8 labels fit the
         * width (8 B .. 1 GiB: 32 B, 1 KiB, 32 KiB, 1 MiB, 32 MiB, 1 GiB) */
        double span = xa->hi - xa->lo;
        int step = span <= 8 ? 1 : span <= 16 ? 2 : span <= 40 ? 5 : 10;
        for (int e = (int)xa->lo; e <= (int)xa->hi; e++) {
            fmt_bytes(lab, sizeof lab, ldexp(1.0, e));
            svg_xtick(b, tx(xa, ldexp(1.0, e)), e % step ? NULL : lab);
        }
    } else {
        for (int e = (int)xa->lo; e <= (int)xa->hi; e++) {
            int step = xa->hi - xa->lo > 12 ? 2 : 1;
            if ((e - (int)xa->lo) % step)
                continue;
            snprintf(lab, sizeof lab, "%.0f", ldexp(1.0, e));
            svg_xtick(b, tx(xa, ldexp(1.0, e)), lab);
        }
    }
}

/* The y grid, ticks and labels: 1, 2, 5 per decade on a log axis (1 only over more than
 * three decades), a nice step on a linear one. */
static void svg_ygrid(rp_buf *b, const axis *ya)
{
    char lab[64];

    if (ya->log) {
        for (int e = (int)ya->lo; e <= (int)ya->hi; e++)
            for (int m = 1; m <= 5; m += (m == 1 ? 1 : 3)) { /* 1, 2, 5 per decade */
                double v = m * pow(10, e);
                if ((m > 1 && (ya->hi - ya->lo > 3 || e == (int)ya->hi)))
                    continue;
                fmt_tick(lab, sizeof lab, v);
                svg_ytick(b, ty(ya, v), lab);
            }
    } else {
        double st = nice_step(ya->hi);
        for (int k = 0; k * st <= ya->hi * (1 + 1e-9); k++) {
            fmt_tick(lab, sizeof lab, k * st);
            svg_ytick(b, ty(ya, k * st), lab);
        }
    }
}

/* The plot area's frame and the axis labels. */
static void svg_frame(rp_buf *b, const plot *p)
{
    rp_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
              "stroke=\"#444\"/>\n", ML, MT, PW - ML - MR, PH - MT - MB);
    rp_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">",
              (ML + PW - MR) / 2, PH - 12);
    rp_esc(b, p->ps->xlabel);
    rp_printf(b, " (log2 scale)</text>\n<text transform=\"translate(16 %d) rotate(-90)\" "
              "text-anchor=\"middle\" font-size=\"13\">", (MT + PH - MB) / 2);
    rp_esc(b, p->ps->ylabel);
    rp_printf(b, "%s</text>\n", p->ya.log ? " (log scale)" : "");
}

/* The points i0 .. i1 of one series with their tooltips. */
static void svg_points(rp_buf *b, const plot *p, int i0, int i1, const char *color)
{
    const pt *pts = p->pts;
    char lab[64];

    for (int i = i0; i < i1; i++) {
        rp_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>",
                  tx(&p->xa, pts[i].x), ty(&p->ya, pts[i].y), color);
        rp_esc(b, p->pd->series[pts[i].series]);
        if (p->xbytes)
            fmt_bytes(lab, sizeof lab, pts[i].x);
        else
            snprintf(lab, sizeof lab, "%g", pts[i].x);
        rp_printf(b, ": %s %s, ", p->ps->xlabel, lab);
        rp_esc(b, p->ps->ylabel);
        rp_printf(b, " %.6g", pts[i].y);
        svg_bound_tip(b, p->pd, pts[i].row, p->ps->ymode == Y_FRACTION);
        rp_printf(b, "</title></circle>\n");
    }
}

/* One polyline per series, points in x order, then its points with their tooltips. */
static void svg_lines(rp_buf *b, const plot *p)
{
    const pt *pts = p->pts;

    for (int i0 = 0, i1; i0 < p->npts; i0 = i1) {
        int s = pts[i0].series;
        const char *color = palette[s % NPAL];
        for (i1 = i0; i1 < p->npts && pts[i1].series == s; i1++)
            ;
        rp_printf(b, "<polyline class=\"series\" fill=\"none\" stroke-width=\"2\" "
                  "stroke=\"%s\" points=\"", color);
        for (int i = i0; i < i1; i++)
            rp_printf(b, "%s%.1f,%.1f", i > i0 ? " " : "", tx(&p->xa, pts[i].x),
                      ty(&p->ya, pts[i].y));
        rp_puts(b, "\"/>\n");
        svg_points(b, p, i0, i1, color);
    }
}

/* The legend: the plot's series in their global order, each in its color of every plot. */
static void svg_legend(rp_buf *b, const plot *p)
{
    for (int i = 0, k = 0; i < p->npts; i++) {
        int s = p->pts[i].series, y = MT + 10 + 20 * k;
        if (i > 0 && s == p->pts[i - 1].series)
            continue;
        k++;
        rp_printf(b, "<g class=\"legend\"><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" "
                  "stroke=\"%s\" stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">", PW - MR + 16, y,
                  PW - MR + 40, y, palette[s % NPAL], PW - MR + 46, y + 4);
        rp_esc(b, p->pd->series[s]);
        rp_puts(b, "</text></g>\n");
    }
}

/* One line plot of pts (npts, sorted by series, then x, then point) as an <svg> element. The
 * legend names the series the plot has, each in its color of every plot. */
static void svg_plot(rp_buf *b, const rp_plotdata *pd, const rp_plotspec *ps,
                     const char *title, const pt *pts, int npts)
{
    plot p = { pd, ps, pts, npts, is_bytes_col(pd->t, ps->x), { 0, 1, 2 }, { 0, 1, 0 } };
    int width, height;

    fit_axes(&p);
    plot_size(&p, &width, &height);
    rp_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"%d\" "
              "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\" "
              "role=\"img\" aria-label=\"", width, height, width, height);
    rp_esc(b, title);
    rp_printf(b, "\">\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n",
              width, height);
    rp_printf(b, "<text x=\"%d\" y=\"20\" font-size=\"14\" font-weight=\"bold\">", ML);
    rp_esc(b, title);
    rp_printf(b, "</text>\n");
    svg_xgrid(b, &p);
    svg_ygrid(b, &p.ya);
    svg_frame(b, &p);
    svg_lines(b, &p);
    svg_legend(b, &p);
    rp_printf(b, "</svg>\n");
}

/* ---------------------------------------------------------------- groups of plots ----- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The sorted distinct numbers of column c over the plotted rows (out holds nrow); a "nan"
 * cell is no value (it equals nothing, not even a panel of its own). */
static int distinct_values(rp_plotdata *pd, int c, double *out)
{
    const double *v = col_num(pd, c);
    int n = 0, m = 0;
    if (!v)
        return 0;
    for (int r = 0; r < pd->t->nrow; r++)
        if (pd->row_series[r] >= 0 && !isnan(v[r]))
            out[n++] = v[r];
    qsort(out, (size_t)n, sizeof *out, cmp_double);
    for (int i = 0; i < n; i++)
        if (!m || out[i] != out[m - 1])
            out[m++] = out[i];
    return m;
}

/* Points by panel, series, x, then point: each plot's points in one run, each series' in a
 * run of it, in x order (ties in point order). */
static int cmp_pt(const void *a, const void *b)
{
    const pt *p = a, *q = b;
    if (p->panel != q->panel)
        return p->panel < q->panel ? -1 : 1;
    if (p->series != q->series)
        return p->series < q->series ? -1 : 1;
    if (p->x != q->x)
        return p->x < q->x ? -1 : 1;
    return (p->pos > q->pos) - (p->pos < q->pos);
}

int rp_n_distinct(rp_plotdata *pd, int c)
{
    double *v;
    int n;
    if (c < 0)
        return 0;
    if (!(v = malloc((size_t)(pd->t->nrow + 1) * sizeof *v))) {
        pd->oom = 1;
        return 0;
    }
    n = distinct_values(pd, c, v);
    free(v);
    return n;
}

void rp_plot_group(rp_buf *b, rp_plotdata *pd, const rp_plotspec *ps, int *nplots)
{
    const rp_table *t = pd->t;
    double *panels = malloc((size_t)(t->nrow + 1) * sizeof *panels);
    pt *pts = malloc((size_t)(t->nrow + 1) * sizeof *pts);
    const double *xv = col_num(pd, ps->x), *yv = col_num(pd, ps->y);
    const double *pv = ps->panel >= 0 ? col_num(pd, ps->panel) : NULL;
    int npanel = 1, npts = 0;

    if (!panels || !pts || !xv || !yv || (ps->panel >= 0 && !pv)) {
        b->oom = 1;
        goto out;
    }
    if (ps->panel >= 0)
        npanel = distinct_values(pd, ps->panel, panels);
    for (int r = 0; r < t->nrow; r++) {
        double x, y;
        const double *k = NULL;
        if (pd->row_series[r] < 0 || !*t->cell[r][ps->x] || !*t->cell[r][ps->y])
            continue;
        /* every plotted row's panel value is one of panels[] (distinct over the same rows) */
        if (ps->panel >= 0 &&
            (isnan(pv[r]) ||
             !(k = bsearch(&pv[r], panels, (size_t)npanel, sizeof *panels, cmp_double))))
            continue;
        x = xv[r];
        y = yv[r] * ps->yscale;
        /* a log2 x axis holds positive finite values only: an infinite one (1e999 in a JSON
         * row, "inf" in a CSV) made the axis end at infinity, converted to int (undefined;
         * found by tests/fuzz/fuzz_csv.c) */
        if (!(x > 0) || !isfinite(x) || !isfinite(y))
            continue;
        pts[npts++] = (pt){ x, y, r, pd->pos[r], pd->row_series[r],
                            k ? (int)(k - panels) : 0 };
    }
    qsort(pts, (size_t)npts, sizeof *pts, cmp_pt);
    for (int i0 = 0, i1; i0 < npts; i0 = i1) {
        int k = pts[i0].panel;
        char title[256];
        for (i1 = i0; i1 < npts && pts[i1].panel == k; i1++)
            ;
        if (is_bytes_col(t, ps->panel)) {
            char v[32];
            fmt_bytes(v, sizeof v, panels[k]);
            snprintf(title, sizeof title, "%s, size = %s", ps->what, v);
        } else if (ps->panel >= 0) {
            snprintf(title, sizeof title, "%s, %s = %g", ps->what, t->col[ps->panel],
                     panels[k]);
        } else {
            snprintf(title, sizeof title, "%s", ps->what);
        }
        svg_plot(b, pd, ps, title, pts + i0, i1 - i0);
        (*nplots)++;
    }
out:
    free(panels);
    free(pts);
}
