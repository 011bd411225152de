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
 * table (one line per combination of the other swept keys) and one line plot per part.
 * Only rows with status ok are plotted; a quantity is an x axis only when it takes more than
 * one value (world_size, and size_bytes or, in files from before it, n_elem); other sweeps get
 * the table only; rows must be single lines.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kb_ccl.h"
#include "kb_ccl_reg.h"
#include "kb_cli.h"
#include "kb_dist_algo.h"

/* ---------------------------------------------------------------- text building ------- */

typedef struct sb {
    char *s;
    size_t len, cap;
    int oom;
} sb;

static void sb_printf(sb *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_printf(sb *b, const char *fmt, ...)
{
    va_list ap;
    int n;
    if (b->oom)
        return;
    va_start(ap, fmt);
    n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if (!b->s || b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *s;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        if (!(s = realloc(b->s, cap))) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
        va_start(ap, fmt);
        vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* Appends n bytes of s. */
static void sb_putn(sb *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *p;
        while (cap < b->len + n + 1)
            cap *= 2;
        if (!(p = realloc(b->s, cap))) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void sb_puts(sb *b, const char *s)
{
    sb_putn(b, s, strlen(s));
}

/* HTML/XML-escaped text: runs of plain characters in one copy (the rows table escapes every
 * cell of every row). */
static void sb_esc(sb *b, const char *s)
{
    for (;;) {
        size_t n = strcspn(s, "&<>\"");
        sb_putn(b, s, n);
        s += n;
        switch (*s) {
        case '&': sb_puts(b, "&amp;"); break;
        case '<': sb_puts(b, "&lt;"); break;
        case '>': sb_puts(b, "&gt;"); break;
        case '"': sb_puts(b, "&quot;"); break;
        default: return;
        }
        s++;
    }
}

/* ---------------------------------------------------------------- reading rows -------- */

typedef struct rtable {
    int ncol, nrow, caprow;
    char **col;        /* column names */
    char ***cell;      /* nrow x ncol, "" for missing */
} rtable;

static void rtable_free(rtable *t)
{
    for (int r = 0; r < t->nrow; r++) {
        for (int c = 0; c < t->ncol; c++)
            free(t->cell[r][c]);
        free(t->cell[r]);
    }
    for (int c = 0; c < t->ncol; c++)
        free(t->col[c]);
    free(t->cell);
    free(t->col);
}

static char *dupstr(const char *s)
{
    char *d = malloc(strlen(s) + 1);
    if (d)
        strcpy(d, s);
    return d;
}

static int col_index(const rtable *t, const char *name)
{
    for (int c = 0; c < t->ncol; c++)
        if (!strcmp(t->col[c], name))
            return c;
    return -1;
}

static int add_col(rtable *t, const char *name)
{
    char **col = realloc(t->col, (size_t)(t->ncol + 1) * sizeof *col);
    if (!col)
        return -1;
    t->col = col;
    if (!(t->col[t->ncol] = dupstr(name)))
        return -1;
    /* rows read so far get an empty cell */
    for (int r = 0; r < t->nrow; r++) {
        char **row = realloc(t->cell[r], (size_t)(t->ncol + 1) * sizeof *row);
        if (!row)
            return -1;
        t->cell[r] = row;
        if (!(row[t->ncol] = dupstr("")))
            return -1;
    }
    return t->ncol++;
}

static char **add_row(rtable *t)
{
    char **row;
    if (t->nrow == t->caprow) {
        int cap = t->caprow ? 2 * t->caprow : 64;
        char ***cell = realloc(t->cell, (size_t)cap * sizeof *cell);
        if (!cell)
            return NULL;
        t->cell = cell;
        t->caprow = cap;
    }
    if (!(row = calloc((size_t)(t->ncol ? t->ncol : 1), sizeof *row)))
        return NULL;
    t->cell[t->nrow++] = row;
    return row;
}

/* Splits a CSV line in place (quotes as RFC 4180, no embedded newlines); returns the count. */
static int split_csv(char *line, char **f, int max)
{
    int n = 0;
    char *r = line, *w = line;
    for (;;) {
        char *start = w;
        int quoted = *r == '"';
        if (quoted)
            r++;
        while (*r) {
            if (quoted && *r == '"' && r[1] == '"') {
                *w++ = '"';
                r += 2;
            } else if (quoted && *r == '"') {
                quoted = 0;
                r++;
            } else if (!quoted && *r == ',') {
                break;
            } else {
                *w++ = *r++;
            }
        }
        if (n < max)
            f[n] = start;
        n++;
        if (!*r) {
            *w = 0;
            return n;
        }
        r++;
        *w++ = 0;
    }
}

static int read_table(const char *path, rtable *t, kb_errbuf *eb)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL, *line, *nl, **fld = NULL;
    long sz;
    int lineno = 0, rc = 0, jsonl;
    size_t plen = strlen(path);

    memset(t, 0, sizeof *t);
    if (!f)
        return kb_err_set(eb, KB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        !(text = malloc((size_t)sz + 1)) || fread(text, 1, (size_t)sz, f) != (size_t)sz) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot read", path);
        goto out;
    }
    text[sz] = 0;
    jsonl = (plen >= 6 && !strcmp(path + plen - 6, ".jsonl")) ||
            (plen >= 5 && !strcmp(path + plen - 5, ".json")) || text[0] == '{';
    /* a partial last line (an interrupted sweep) is ignored */
    for (line = text; (nl = strchr(line, '\n')); line = nl + 1) {
        lineno++;
        *nl = 0;
        if (nl > line && nl[-1] == '\r')
            nl[-1] = 0;
        if (!*line)
            continue;
        if (jsonl) {
            cJSON *o = cJSON_Parse(line), *it;
            char **row;
            if (!cJSON_IsObject(o)) {
                cJSON_Delete(o);
                rc = kb_err_set(eb, KB_ERR_USAGE, "%s:%d: not a JSON object", path, lineno);
                goto out;
            }
            cJSON_ArrayForEach(it, o) {
                if (col_index(t, it->string) < 0 && add_col(t, it->string) < 0) {
                    cJSON_Delete(o);
                    rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                    goto out;
                }
            }
            if (!(row = add_row(t))) {
                cJSON_Delete(o);
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                goto out;
            }
            for (int c = 0; c < t->ncol; c++) {
                char num[64];
                const char *v = "";
                it = cJSON_GetObjectItemCaseSensitive(o, t->col[c]);
                if (cJSON_IsString(it))
                    v = it->valuestring;
                else if (cJSON_IsNumber(it))
                    snprintf(num, sizeof num, "%.12g", it->valuedouble), v = num;
                else if (cJSON_IsBool(it))
                    v = cJSON_IsTrue(it) ? "true" : "false";
                row[c] = dupstr(v);
            }
            cJSON_Delete(o);
            continue;
        }
        if (!t->col) {
            int n = 1;
            char **tmp;
            for (const char *q = line; *q; q++) /* splitting edits the line: size first */
                n += *q == ',';
            if (!(tmp = calloc((size_t)n, sizeof *tmp))) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                goto out;
            }
            n = split_csv(line, tmp, n);
            for (int c = 0; c < n; c++)
                if (add_col(t, tmp[c]) < 0) {
                    free(tmp);
                    rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                    goto out;
                }
            free(tmp);
            if (!(fld = calloc((size_t)t->ncol, sizeof *fld))) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                goto out;
            }
            continue;
        }
        {
            int n = split_csv(line, fld, t->ncol);
            char **row;
            if (n != t->ncol) {
                rc = kb_err_set(eb, KB_ERR_USAGE, "%s:%d: %d fields, the header has %d", path,
                                lineno, n, t->ncol);
                goto out;
            }
            if (!(row = add_row(t))) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                goto out;
            }
            for (int c = 0; c < t->ncol; c++)
                row[c] = dupstr(fld[c]);
        }
    }
    for (int r = 0; r < t->nrow; r++)
        for (int c = 0; c < t->ncol; c++)
            if (!t->cell[r][c]) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                goto out;
            }
    if (col_index(t, "point") < 0)
        rc = kb_err_set(eb, KB_ERR_USAGE, "%s: no 'point' column: not the output of kbcl sweep",
                        path);
out:
    free(fld);
    free(text);
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- plots --------------- */

static const char *const palette[] = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                       "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" };
#define NPAL ((int)(sizeof palette / sizeof palette[0]))

/* The columns kbcl sweep writes after the swept ones; everything else except point is swept. */
static int is_fixed_col(const char *name)
{
    static const char *const fixed[] = { "point", "bench", "size_bytes", "sim_time_ns",
                                         "algbw_gbps", "busbw_gbps", "events", "wall_ms",
                                         "verified", "status", "error", "compute_ns",
                                         "memory_ns", "comm_ns", "tokens_per_s", "bound_ns",
                                         "efficiency", "bound_resource", "roofline_ns",
                                         "roofline_bound", "roofline_efficiency" };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(name, fixed[i]))
            return 1;
    return 0;
}

/* A point of a plot: its row's position in point order (pos) breaks ties, so that every sort
 * below gives one order whatever qsort does with equal keys. */
typedef struct pt {
    double x, y;
    int row, pos, series, panel;
} pt;

typedef struct plotdata {
    int nseries;
    char **series;        /* names, global order (first appearance by point) */
    int *row_series;      /* per row: series index, -1 when the row is not plotted */
    int *order;           /* rows sorted by point */
    int *pos;             /* per row: its place in order */
    /* the rows' bound for the points' tooltips: the table and its bound_ns, efficiency and
     * bound_resource columns (-1 when a file from before them has none) */
    const rtable *t;
    int cbound, ceff, cbres;
    double **num;         /* per column: its cells as numbers (strtod), read once on first use */
    int oom;
} plotdata;

/* Column c's cells as numbers (strtod: 0 for text, as the cells were always read), converted
 * once per column: plots read the same columns again for every panel and every group. NULL
 * (and pd->oom) when out of memory. */
static const double *col_num(plotdata *pd, int c)
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

/* The y label of the efficiency plots. */
#define EFF_LABEL "efficiency (bound / sim time)"

/* How a plot's y axis is scaled. */
enum {
    Y_LINEAR,   /* linear from zero */
    Y_AUTO,     /* logarithmic (decades) when the values span more than 30x, else linear */
    Y_FRACTION, /* 0 .. 1 (further only if a value exceeds 1): an efficiency, so that plots
                 * compare at a glance and a low one does not look high on its own scale */
};

typedef struct axis {
    double lo, hi;        /* data range mapped to the axis (log10/log2 units when log) */
    int log;              /* 0 linear, 2 log2, 10 log10 */
} axis;

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
static void svg_xtick(sb *b, double x, const char *lab)
{
    sb_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e6e6e6\"/>"
              "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#444\"/>",
              x, MT, x, PH - MB, x, PH - MB, x, PH - MB + (lab ? 5 : 3));
    if (lab)
        sb_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x,
                  PH - MB + 18, lab);
    else
        sb_printf(b, "\n");
}

/* A horizontal grid line at y with its tick and label left of the plot area. */
static void svg_ytick(sb *b, double y, const char *lab)
{
    sb_printf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>"
              "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#444\"/>",
              ML, y, PW - MR, y, ML - 5, y, ML, y);
    sb_printf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", ML - 8,
              y + 4, lab);
}

/* The bound of row r for a point's tooltip: "; efficiency 0.599 (bound 8192 ns by pe_gemm
 * sip0/cube0/pe0)", without the efficiency in a plot of it; nothing when the row has none. */
static void svg_bound_tip(sb *b, const plotdata *pd, int r, int is_eff_plot)
{
    const char *eff = pd->ceff >= 0 ? pd->t->cell[r][pd->ceff] : "";
    const char *bound = pd->cbound >= 0 ? pd->t->cell[r][pd->cbound] : "";
    const char *res = pd->cbres >= 0 ? pd->t->cell[r][pd->cbres] : "";
    if (!*eff || !*bound)
        return;
    if (is_eff_plot)
        sb_printf(b, "; bound %.6g ns", strtod(bound, NULL));
    else
        sb_printf(b, "; efficiency %.3g (bound %.6g ns", strtod(eff, NULL), strtod(bound, NULL));
    if (*res) {
        sb_printf(b, " by ");
        sb_esc(b, res);
    }
    if (!is_eff_plot)
        sb_printf(b, ")");
}

/* One line plot of pts (npts, sorted by series, then x, then point) as an <svg> element;
 * xbytes: x is a size in bytes, labelled with binary units. The legend names the series the
 * plot has, each in its color of every plot. */
static void svg_plot(sb *b, const plotdata *pd, const char *title, const char *xlabel,
                     int xbytes, const char *ylabel, const pt *pts, int npts, int ymode)
{
    axis xa = { 0, 1, 2 }, ya = { 0, 1, 0 };
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    char lab[64];
    int width = PW, height = PH, nleg = 0;

    for (int i = 0; i < npts; i++) {
        xmin = fmin(xmin, pts[i].x);
        xmax = fmax(xmax, pts[i].x);
        ymin = fmin(ymin, pts[i].y);
        ymax = fmax(ymax, pts[i].y);
    }
    /* x: log2 over whole powers of two around the data */
    xa.lo = floor(log2(xmin));
    xa.hi = ceil(log2(xmax));
    if (xa.hi <= xa.lo)
        xa.lo -= 1, xa.hi += 1;
    /* y: log10 over whole decades when the data spans more than 30x, else linear from 0 */
    if (ymode == Y_AUTO && ymin > 0 && ymax / ymin > 30) {
        ya.log = 10;
        ya.lo = floor(log10(ymin));
        ya.hi = ceil(log10(ymax));
    } else {
        double st = nice_step(ymax > 0 ? ymax : 1);
        ya.lo = 0;
        ya.hi = ceil((ymax > 0 ? ymax : 1) / st) * st;
        if (ymode == Y_FRACTION && ymax <= 1)
            ya.hi = 1;
    }
    /* the legend column grows with the longest name (about 7 px per character) and the
     * picture with the number of names */
    for (int i = 0; i < npts; i++) {
        const char *name = pd->series[pts[i].series];
        if (i > 0 && pts[i].series == pts[i - 1].series)
            continue;
        nleg++;
        if (PW - MR + 56 + 7 * (int)strlen(name) > width)
            width = PW - MR + 56 + 7 * (int)strlen(name);
    }
    if (MT + 20 + 20 * nleg > height)
        height = MT + 20 + 20 * nleg;
    sb_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"%d\" "
              "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\" "
              "role=\"img\" aria-label=\"", width, height, width, height);
    sb_esc(b, title);
    sb_printf(b, "\">\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n",
              width, height);
    sb_printf(b, "<text x=\"%d\" y=\"20\" font-size=\"14\" font-weight=\"bold\">", ML);
    sb_esc(b, title);
    sb_printf(b, "</text>\n");
    /* grid and ticks */
    if (xbytes) {
        /* a grid line per power of two; labels on every step-th one, counted from 1 B, so that
         * 1 KiB, 1 MiB, 1 GiB get theirs once labels thin out, and at most 8 labels fit the
         * width (8 B .. 1 GiB: 32 B, 1 KiB, 32 KiB, 1 MiB, 32 MiB, 1 GiB) */
        double span = xa.hi - xa.lo;
        int step = span <= 8 ? 1 : span <= 16 ? 2 : span <= 40 ? 5 : 10;
        for (int e = (int)xa.lo; e <= (int)xa.hi; e++) {
            fmt_bytes(lab, sizeof lab, ldexp(1.0, e));
            svg_xtick(b, tx(&xa, ldexp(1.0, e)), e % step ? NULL : lab);
        }
    } else {
        for (int e = (int)xa.lo; e <= (int)xa.hi; e++) {
            int step = xa.hi - xa.lo > 12 ? 2 : 1;
            if ((e - (int)xa.lo) % step)
                continue;
            snprintf(lab, sizeof lab, "%.0f", ldexp(1.0, e));
            svg_xtick(b, tx(&xa, ldexp(1.0, e)), lab);
        }
    }
    if (ya.log) {
        for (int e = (int)ya.lo; e <= (int)ya.hi; e++)
            for (int m = 1; m <= 5; m += (m == 1 ? 1 : 3)) { /* 1, 2, 5 per decade */
                double v = m * pow(10, e);
                if ((m > 1 && (ya.hi - ya.lo > 3 || e == (int)ya.hi)))
                    continue;
                fmt_tick(lab, sizeof lab, v);
                svg_ytick(b, ty(&ya, v), lab);
            }
    } else {
        double st = nice_step(ya.hi);
        for (int k = 0; k * st <= ya.hi * (1 + 1e-9); k++) {
            fmt_tick(lab, sizeof lab, k * st);
            svg_ytick(b, ty(&ya, k * st), lab);
        }
    }
    sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
              "stroke=\"#444\"/>\n", ML, MT, PW - ML - MR, PH - MT - MB);
    sb_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">",
              (ML + PW - MR) / 2, PH - 12);
    sb_esc(b, xlabel);
    sb_printf(b, " (log2 scale)</text>\n<text transform=\"translate(16 %d) rotate(-90)\" "
              "text-anchor=\"middle\" font-size=\"13\">", (MT + PH - MB) / 2);
    sb_esc(b, ylabel);
    sb_printf(b, "%s</text>\n", ya.log ? " (log scale)" : "");
    /* one polyline per series, points in x order, then its points with their tooltips */
    for (int i0 = 0, i1; i0 < npts; i0 = i1) {
        int s = pts[i0].series;
        const char *color = palette[s % NPAL];
        for (i1 = i0; i1 < npts && pts[i1].series == s; i1++)
            ;
        sb_printf(b, "<polyline class=\"series\" fill=\"none\" stroke-width=\"2\" "
                  "stroke=\"%s\" points=\"", color);
        for (int i = i0; i < i1; i++)
            sb_printf(b, "%s%.1f,%.1f", i > i0 ? " " : "", tx(&xa, pts[i].x), ty(&ya, pts[i].y));
        sb_puts(b, "\"/>\n");
        for (int i = i0; i < i1; i++) {
            sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>",
                      tx(&xa, pts[i].x), ty(&ya, pts[i].y), color);
            sb_esc(b, pd->series[s]);
            if (xbytes)
                fmt_bytes(lab, sizeof lab, pts[i].x);
            else
                snprintf(lab, sizeof lab, "%g", pts[i].x);
            sb_printf(b, ": %s %s, ", xlabel, lab);
            sb_esc(b, ylabel);
            sb_printf(b, " %.6g", pts[i].y);
            svg_bound_tip(b, pd, pts[i].row, ymode == Y_FRACTION);
            sb_printf(b, "</title></circle>\n");
        }
    }
    /* legend: the plot's series in their global order, each in its color of every plot */
    for (int i = 0, k = 0; i < npts; i++) {
        int s = pts[i].series, y = MT + 10 + 20 * k;
        if (i > 0 && s == pts[i - 1].series)
            continue;
        k++;
        sb_printf(b, "<g class=\"legend\"><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" "
                  "stroke=\"%s\" stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">", PW - MR + 16, y,
                  PW - MR + 40, y, palette[s % NPAL], PW - MR + 46, y + 4);
        sb_esc(b, pd->series[s]);
        sb_puts(b, "</text></g>\n");
    }
    sb_printf(b, "</svg>\n");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The sorted distinct numbers of column c over the plotted rows (out holds nrow); a "nan"
 * cell is no value (it equals nothing, not even a panel of its own). */
static int distinct_values(plotdata *pd, int c, double *out)
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

/* How many different values column c takes over the plotted rows (0 when c < 0). */
static int n_distinct(plotdata *pd, int c)
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

/* Which columns are sizes in bytes: size_bytes (the panel title says "size = 1 KiB"). */
static int is_bytes_col(const rtable *t, int c)
{
    return c >= 0 && !strcmp(t->col[c], "size_bytes");
}

/*
 * Plots metric column ycol (scaled by yscale) against xcol, one plot per value of panelcol
 * (or a single plot when panelcol < 0). The points of every panel are gathered in one pass
 * over the rows and sorted once, so that the work grows with the rows, not with rows times
 * panels or series.
 */
static void plot_group(sb *b, const rtable *t, plotdata *pd, int xcol, int ycol,
                       double yscale, int panelcol, const char *what, const char *xlabel,
                       const char *ylabel, int ymode, int *nplots)
{
    double *panels = malloc((size_t)(t->nrow + 1) * sizeof *panels);
    pt *pts = malloc((size_t)(t->nrow + 1) * sizeof *pts);
    const double *xv = col_num(pd, xcol), *yv = col_num(pd, ycol);
    const double *pv = panelcol >= 0 ? col_num(pd, panelcol) : NULL;
    int npanel = 1, npts = 0;

    if (!panels || !pts || !xv || !yv || (panelcol >= 0 && !pv)) {
        b->oom = 1;
        goto out;
    }
    if (panelcol >= 0)
        npanel = distinct_values(pd, panelcol, panels);
    for (int r = 0; r < t->nrow; r++) {
        double x, y;
        const double *k = NULL;
        if (pd->row_series[r] < 0 || !*t->cell[r][xcol] || !*t->cell[r][ycol])
            continue;
        /* every plotted row's panel value is one of panels[] (distinct over the same rows) */
        if (panelcol >= 0 && (isnan(pv[r]) ||
                              !(k = bsearch(&pv[r], panels, (size_t)npanel, sizeof *panels, cmp_double))))
            continue;
        x = xv[r];
        y = yv[r] * yscale;
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
        if (is_bytes_col(t, panelcol)) {
            char v[32];
            fmt_bytes(v, sizeof v, panels[k]);
            snprintf(title, sizeof title, "%s, size = %s", what, v);
        } else if (panelcol >= 0) {
            snprintf(title, sizeof title, "%s, %s = %g", what, t->col[panelcol], panels[k]);
        } else {
            snprintf(title, sizeof title, "%s", what);
        }
        svg_plot(b, pd, title, xlabel, is_bytes_col(t, xcol), ylabel, pts + i0, i1 - i0,
                 ymode);
        (*nplots)++;
    }
out:
    free(panels);
    free(pts);
}

/* ---------------------------------------------------------------- collectives --------- */

/* The collective kind of each row's algorithm (-1: none, or not an entry of the shipped
 * ccl.yaml with a built-in module), looked up once per distinct name. */
static int row_kinds(const rtable *t, int calg, int *kind)
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
            const kb_dist_algo *d = e ? kb_ccl_reg_find_dist(NULL, e->module) : NULL;
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
static void glossary(sb *b, int bus, int eff)
{
    if (!bus && !eff)
        return;
    sb_puts(b, "<h2 id=\"terms\">Terms</h2>\n<dl class=\"terms\">\n");
    if (bus) {
        static const int ns[] = { 2, 3, 8, 256 };
        int shown[KB_COLL_NKINDS] = { 0 };
        sb_puts(b, "<dt><b>algbw</b> (GB/s)</dt><dd>algorithm bandwidth: size_bytes / "
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
                sb_printf(b, "%s%s", nk++ ? ", " : nf++ ? "; " : "",
                          kb_coll_name((kb_coll_kind)k));
            }
            if (nk)
                sb_printf(b, " %s", busbw_form[f]);
        }
        sb_puts(b, ". That is the traffic per rank of a bandwidth-optimal algorithm of the "
                "collective, so busbw compares across world sizes and across the algorithms "
                "of one collective, not across collectives.</dd>\n");
    }
    if (eff)
        sb_puts(b, "<dt><b>efficiency</b> (a fraction, 0..1)</dt><dd>bound_ns / sim_time_ns: "
                "bound_ns is the time the run's busiest resource (bound_resource: a link, a "
                "NoC, HBM, a PE's unit or DMA engine) needs for what it carried at its "
                "bandwidth, which no schedule of the same traffic can beat; 1 means that "
                "resource was busy for the whole simulated time.</dd>\n");
    sb_puts(b, "</dl>\n");
}

typedef struct rowkey {
    long point;
    int row;
} rowkey;

static int cmp_point(const void *a, const void *b)
{
    const rowkey *p = a, *q = b;
    if (p->point != q->point)
        return p->point < q->point ? -1 : 1;
    return (p->row > q->row) - (p->row < q->row);
}

/* FNV-1a: the series table's hash. */
static size_t str_hash(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)h;
}

static int render(const rtable *t, const char *src, sb *b, kb_errbuf *eb)
{
    plotdata pd;
    int cpoint = col_index(t, "point"), cstatus = col_index(t, "status");
    int cws = col_index(t, "world_size"), cne = col_index(t, "n_elem");
    int csz = col_index(t, "size"), cbytes = col_index(t, "size_bytes"), cx;
    int ctime = col_index(t, "sim_time_ns"), cbus = col_index(t, "busbw_gbps");
    int cbench = col_index(t, "bench"), cver = col_index(t, "verified");
    int csplit[3] = { col_index(t, "compute_ns"), col_index(t, "memory_ns"),
                      col_index(t, "comm_ns") };
    int ctps = col_index(t, "tokens_per_s"), ceff = col_index(t, "efficiency");
    int ctp = csplit[0] >= 0 && csplit[1] >= 0 && csplit[2] >= 0
                  ? col_index(t, "system.sips.count") : -1;
    int nok = 0, nerr = 0, nbad = 0, nplots = 0, rc = 0;
    int *series_cols = NULL, nsc = 0, *htab = NULL, *first = NULL, *byser = NULL;
    size_t hmask = 1;
    rowkey *keys = NULL;

    memset(&pd, 0, sizeof pd);
    pd.t = t;
    pd.cbound = col_index(t, "bound_ns");
    pd.ceff = ceff;
    pd.cbres = col_index(t, "bound_resource");
    pd.row_series = malloc((size_t)(t->nrow + 1) * sizeof *pd.row_series);
    pd.order = malloc((size_t)(t->nrow + 1) * sizeof *pd.order);
    pd.series = calloc((size_t)(t->nrow + 1), sizeof *pd.series);
    pd.pos = malloc((size_t)(t->nrow + 1) * sizeof *pd.pos);
    pd.num = calloc((size_t)(t->ncol + 1), sizeof *pd.num);
    series_cols = malloc((size_t)(t->ncol + 1) * sizeof *series_cols);
    keys = malloc((size_t)(t->nrow + 1) * sizeof *keys);
    while (hmask < 2 * (size_t)t->nrow)
        hmask <<= 1;
    htab = malloc(hmask * sizeof *htab);
    hmask--;
    if (!pd.row_series || !pd.order || !pd.series || !series_cols || !pd.pos || !pd.num ||
        !keys || !htab) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t h = 0; h <= hmask; h++)
        htab[h] = -1;
    /* rows by point index, rows of one point in file order */
    for (int r = 0; r < t->nrow; r++) {
        keys[r].point = strtol(t->cell[r][cpoint], NULL, 10);
        keys[r].row = r;
    }
    qsort(keys, (size_t)t->nrow, sizeof *keys, cmp_point);
    for (int i = 0; i < t->nrow; i++) {
        pd.order[i] = keys[i].row;
        pd.pos[keys[i].row] = i;
    }
    /* series: the swept keys other than the x axes and panels, "algorithm" first */
    {
        int calg = col_index(t, "algorithm");
        if (calg >= 0)
            series_cols[nsc++] = calg;
        for (int c = 0; c < t->ncol; c++)
            if (!is_fixed_col(t->col[c]) && c != cws && c != cne && c != csz && c != calg &&
                c != ctp)
                series_cols[nsc++] = c;
    }
    for (int i = 0; i < t->nrow; i++) {
        int r = pd.order[i], s;
        size_t h;
        char name[512];
        size_t len = 0;
        pd.row_series[r] = -1;
        if (i > 0 && !strcmp(t->cell[r][cpoint], t->cell[pd.order[i - 1]][cpoint]))
            continue; /* a duplicated point: the first row stands */
        if (cstatus >= 0 && strcmp(t->cell[r][cstatus], "ok")) {
            nerr++;
            continue;
        }
        nok++;
        if (cver >= 0 && !strcmp(t->cell[r][cver], "false"))
            nbad++;
        name[0] = 0;
        for (int k = 0; k < nsc && len < sizeof name; k++) {
            int c = series_cols[k];
            if (!strcmp(t->col[c], "algorithm")) /* the usual case: just the name */
                len += (size_t)snprintf(name + len, sizeof name - len, "%s%s", k ? ", " : "",
                                        t->cell[r][c]);
            else /* a config key by its last part: n_slots=1, not ccl.defaults.n_slots=1 */
                len += (size_t)snprintf(name + len, sizeof name - len, "%s%s=%s",
                                        k ? ", " : "", strrchr(t->col[c], '.')
                                                           ? strrchr(t->col[c], '.') + 1
                                                           : t->col[c], t->cell[r][c]);
        }
        if (!nsc)
            snprintf(name, sizeof name, "%s", cbench >= 0 ? t->cell[r][cbench] : "all");
        /* open addressing on the name's hash: a sweep may have as many series as rows */
        h = str_hash(name) & hmask;
        while ((s = htab[h]) >= 0 && strcmp(pd.series[s], name))
            h = (h + 1) & hmask;
        if (s < 0) {
            if (!(pd.series[pd.nseries] = dupstr(name))) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                goto out;
            }
            s = htab[h] = pd.nseries++;
        }
        pd.row_series[r] = s;
    }

    sb_printf(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
              "<title>kbcl sweep report: ");
    sb_esc(b, src);
    sb_printf(b, "</title>\n<style>\n"
              "body{font-family:sans-serif;margin:24px;color:#222}\n"
              "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}\n"
              "svg.plot{display:block;margin:12px 0;border:1px solid #ddd}\n"
              "table{border-collapse:collapse;font-size:12px}\n"
              "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}\n"
              "th{background:#f3f3f3}tr.err td{background:#fde}tr.bad td{background:#fec}\n"
              "</style>\n</head>\n<body>\n<h1>kbcl sweep report: ");
    sb_esc(b, src);
    sb_printf(b, "</h1>\n<p>%d rows: %d ok (%d failed verification), %d errors.", t->nrow, nok,
              nbad, nerr);
    if (nerr)
        sb_printf(b, " Rows with errors are not plotted; they are red in the table.");
    sb_printf(b, "</p>\n");

    /* the message size: size_bytes (nccl-tests' size per rank) when the rows have it, else
     * the n_elem column of files from before it */
    cx = cne;
    if (cbytes >= 0)
        for (int r = 0; r < t->nrow; r++)
            if (pd.row_series[r] >= 0 && *t->cell[r][cbytes]) {
                cx = cbytes;
                break;
            }
    {
        int any_bus = 0, any_eff = 0;
        int ws_varies = n_distinct(&pd, cws) > 1, size_varies = n_distinct(&pd, cx) > 1;
        const char *xsize = cx == cbytes ? "message size (bytes per rank)"
                                         : "n_elem (elements per rank)";
        for (int r = 0; cbus >= 0 && r < t->nrow; r++)
            any_bus |= pd.row_series[r] >= 0 && *t->cell[r][cbus];
        /* older result files have no efficiency column; rows without a bound leave it empty */
        for (int r = 0; ceff >= 0 && r < t->nrow; r++)
            any_eff |= pd.row_series[r] >= 0 && *t->cell[r][ceff];
        glossary(b, any_bus, any_eff);
        if (ctime >= 0 && ws_varies) {
            sb_printf(b, "<h2 id=\"time\">Simulated time vs world size</h2>\n");
            plot_group(b, t, &pd, cws, ctime, 1e-3, cx, "sim time vs world size",
                       "world size (ranks)", "sim time (us)", Y_AUTO, &nplots);
        }
        if (any_bus && ws_varies) {
            sb_printf(b, "<h2 id=\"busbw\">Bus bandwidth vs world size</h2>\n");
            plot_group(b, t, &pd, cws, cbus, 1, cx, "busbw vs world size",
                       "world size (ranks)", "busbw (GB/s)", Y_LINEAR, &nplots);
        }
        if (any_eff && ws_varies) {
            sb_printf(b, "<h2 id=\"efficiency\">Efficiency vs world size</h2>\n");
            plot_group(b, t, &pd, cws, ceff, 1, cx, "efficiency vs world size",
                       "world size (ranks)", EFF_LABEL, Y_FRACTION, &nplots);
        }
        /* nccl-tests' view: busbw against size (linear, it levels off at the link rate),
         * then time against size (log when it spans decades) */
        int *kind = malloc((size_t)(t->nrow + 1) * sizeof *kind);
        int *all = pd.row_series, *mine = malloc((size_t)(t->nrow + 1) * sizeof *mine);
        int nkinds = kind && mine ? row_kinds(t, col_index(t, "algorithm"), kind) : 0;
        if (any_bus && size_varies && nkinds > 1) {
            /* one group per collective, in kb_coll_kind order: busbw is comparable within a
             * collective (nccl-tests' factor), its level differs across them */
            for (int k = 0; k < KB_COLL_NKINDS; k++) {
                int any = 0;
                char what[96];
                for (int r = 0; r < t->nrow; r++) {
                    mine[r] = kind[r] == k ? all[r] : -1;
                    any |= mine[r] >= 0;
                }
                if (!any)
                    continue;
                sb_printf(b, "<h2 id=\"busbw-size-%s\">Bus bandwidth vs message size: %s</h2>\n",
                          kb_coll_name((kb_coll_kind)k), kb_coll_name((kb_coll_kind)k));
                snprintf(what, sizeof what, "%s busbw vs message size",
                         kb_coll_name((kb_coll_kind)k));
                pd.row_series = mine;
                plot_group(b, t, &pd, cx, cbus, 1, cws, what, xsize, "busbw (GB/s)", Y_LINEAR,
                           &nplots);
                pd.row_series = all;
            }
        } else if (any_bus && size_varies) {
            sb_printf(b, "<h2 id=\"busbw-size\">Bus bandwidth vs message size</h2>\n");
            plot_group(b, t, &pd, cx, cbus, 1, cws, "busbw vs message size", xsize,
                       "busbw (GB/s)", Y_LINEAR, &nplots);
        }
        free(kind);
        free(mine);
        if (ctime >= 0 && size_varies) {
            sb_printf(b, "<h2 id=\"size\">Simulated time vs message size</h2>\n");
            plot_group(b, t, &pd, cx, ctime, 1e-3, cws, "sim time vs message size", xsize,
                       "sim time (us)", Y_AUTO, &nplots);
        }
        /* one plot per world size with every series, as busbw against size, but not split
         * by collective: an efficiency is a fraction of the run's own bound, so it compares
         * across kinds where busbw (nccl-tests' factor per kind) does not */
        if (any_eff && size_varies) {
            sb_printf(b, "<h2 id=\"efficiency-size\">Efficiency vs message size</h2>\n");
            plot_group(b, t, &pd, cx, ceff, 1, cws, "efficiency vs message size", xsize,
                       EFF_LABEL, Y_FRACTION, &nplots);
        }
    }
    if (ctp >= 0 && n_distinct(&pd, ctp) > 1) {
        static const char *const part[3] = { "compute", "memory", "communication" };
        static const char *const colr[3] = { "#1f77b4", "#ff7f0e", "#d62728" };
        double tmax = 0;
        sb_printf(b, "<h2 id=\"split\">Decoder layer: time split vs TP size</h2>\n"
                  "<p>Simulated time of the layer split into compute, memory and "
                  "communication (docs/decoder.md), per TP size (system.sips.count), one "
                  "group per combination of the other swept keys. Bars: ");
        for (int k = 0; k < 3; k++)
            sb_printf(b, "<span style=\"color:%s\">&#9632; %s</span> ", colr[k], part[k]);
        sb_printf(b, "</p>\n<table>\n<tr><th>series</th><th>TP</th><th>compute (us)</th>"
                  "<th>memory (us)</th><th>comm (us)</th><th>total (us)</th>"
                  "<th>tokens/s</th>%s<th>split</th></tr>\n",
                  ceff >= 0 ? "<th>efficiency</th>" : "");
        for (int r = 0; r < t->nrow; r++)
            if (pd.row_series[r] >= 0) {
                double tot = 0;
                for (int k = 0; k < 3; k++)
                    tot += strtod(t->cell[r][csplit[k]], NULL);
                tmax = fmax(tmax, tot);
            }
        /* the rows of each series in point order, in one pass (first[s] .. first[s + 1]
         * of byser) rather than one pass over all rows per series */
        first = calloc((size_t)pd.nseries + 2, sizeof *first);
        byser = malloc((size_t)(t->nrow + 1) * sizeof *byser);
        if (!first || !byser) {
            rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
            goto out;
        }
        for (int r = 0; r < t->nrow; r++)
            if (pd.row_series[r] >= 0)
                first[pd.row_series[r] + 2]++;
        for (int s = 0; s < pd.nseries; s++)
            first[s + 2] += first[s + 1];
        for (int i = 0; i < t->nrow; i++)
            if (pd.row_series[pd.order[i]] >= 0)
                byser[first[pd.row_series[pd.order[i]] + 1]++] = pd.order[i];
        for (int s = 0; s < pd.nseries; s++) {
            double tps[KB_MAX_GSIPS];
            int rows_s[KB_MAX_GSIPS], n = 0;
            /* this series' first KB_MAX_GSIPS rows (by point) by TP size */
            for (int i = first[s]; i < first[s + 1] && n < KB_MAX_GSIPS; i++) {
                int r = byser[i], j;
                double v = strtod(t->cell[r][ctp], NULL);
                for (j = n; j > 0 && tps[j - 1] > v; j--)
                    tps[j] = tps[j - 1], rows_s[j] = rows_s[j - 1];
                tps[j] = v;
                rows_s[j] = r;
                n++;
            }
            for (int i = 0; i < n; i++) {
                int r = rows_s[i];
                double v[3], tot = 0, x = 0;
                for (int k = 0; k < 3; k++)
                    tot += (v[k] = strtod(t->cell[r][csplit[k]], NULL));
                sb_printf(b, "<tr><td style=\"text-align:left\">");
                sb_esc(b, pd.series[s]);
                sb_printf(b, "</td><td>%g</td><td>%.3f</td><td>%.3f</td><td>%.3f</td>"
                          "<td>%.3f</td><td>%s</td>", tps[i], v[0] * 1e-3, v[1] * 1e-3,
                          v[2] * 1e-3, tot * 1e-3, ctps >= 0 ? t->cell[r][ctps] : "");
                if (ceff >= 0 && *t->cell[r][ceff])
                    sb_printf(b, "<td>%.3f</td>", strtod(t->cell[r][ceff], NULL));
                else if (ceff >= 0)
                    sb_printf(b, "<td></td>");
                sb_printf(b, "<td>");
                sb_printf(b, "<svg width=\"320\" height=\"12\">");
                for (int k = 0; k < 3; k++) {
                    double w = tmax > 0 ? v[k] / tmax * 320.0 : 0;
                    sb_printf(b, "<rect x=\"%.2f\" y=\"0\" width=\"%.2f\" height=\"12\" "
                              "fill=\"%s\"/>", x, w, colr[k]);
                    x += w;
                }
                sb_printf(b, "</svg></td></tr>\n");
            }
        }
        sb_printf(b, "</table>\n");
        for (int k = 0; k < 3; k++) {
            char what[64], ylab[64];
            snprintf(what, sizeof what, "%s time vs TP size", part[k]);
            snprintf(ylab, sizeof ylab, "%s (us)", part[k]);
            plot_group(b, t, &pd, ctp, csplit[k], 1e-3, -1, what, "TP size (SIPs)", ylab,
                       Y_LINEAR, &nplots);
        }
    }
    if (!nplots)
        sb_printf(b, "<p>No plots: they need ok rows in which the world size or the message "
                  "size (size_bytes, n_elem) takes more than one value.</p>\n");

    sb_printf(b, "<h2 id=\"rows\">Rows</h2>\n<table>\n<tr>");
    for (int c = 0; c < t->ncol; c++) {
        sb_printf(b, "<th>");
        sb_esc(b, t->col[c]);
        sb_printf(b, "</th>");
    }
    sb_printf(b, "</tr>\n");
    for (int i = 0; i < t->nrow; i++) {
        int r = pd.order[i];
        int err = cstatus >= 0 && strcmp(t->cell[r][cstatus], "ok");
        int bad = cver >= 0 && !strcmp(t->cell[r][cver], "false");
        sb_printf(b, "<tr%s>", err ? " class=\"err\"" : bad ? " class=\"bad\"" : "");
        for (int c = 0; c < t->ncol; c++) {
            sb_printf(b, "<td>");
            sb_esc(b, t->cell[r][c]);
            sb_printf(b, "</td>");
        }
        sb_printf(b, "</tr>\n");
    }
    sb_printf(b, "</table>\n<p>Generated by kbcl %s report.</p>\n</body>\n</html>",
              KBCL_VERSION);
    if (b->oom || pd.oom)
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
out:
    for (int s = 0; s < pd.nseries; s++)
        free(pd.series[s]);
    free(pd.series);
    free(pd.row_series);
    free(pd.order);
    free(pd.pos);
    for (int c = 0; pd.num && c < t->ncol; c++)
        free(pd.num[c]);
    free(pd.num);
    free(series_cols);
    free(keys);
    free(htab);
    free(first);
    free(byser);
    return rc;
}

int kbcl_report_render(const char *in, char **html, kb_errbuf *eb)
{
    rtable t;
    sb b = { NULL, 0, 0, 0 };
    int rc;

    *html = NULL;
    if ((rc = read_table(in, &t, eb)) == 0 && (rc = render(&t, in, &b, eb)) == 0) {
        *html = b.s;
        b.s = NULL;
    }
    rtable_free(&t);
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
