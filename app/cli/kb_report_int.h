/*
 * kb_report_int.h — what the files of `kbcl report` share among themselves and no one else,
 * under rp_ names: the text buffer the page is written into (report_text.c), the rows of a
 * sweep's results as read and indexed for plotting (report_table.c), and the line plots
 * (report_svg.c) that the page (report.c) places. Its limits are theirs: rows are single
 * lines, a series name is cut at 511 bytes. Internal to app/cli/: the API for tests and fuzz
 * targets is kb_cli.h (kbcl_report_render).
 */
#ifndef KB_REPORT_INT_H
#define KB_REPORT_INT_H

#include <stddef.h>

#include "kb_cli.h"

/* ---------------------------------------------------------------- report_text.c ------- */

/* A growing NUL-terminated text. An allocation that fails sets oom and every later append is
 * dropped, so that a writer checks once, at the end. Owns s (free it). */
typedef struct rp_buf {
    char *s;
    size_t len, cap;
    int oom;
} rp_buf;

void rp_printf(rp_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends n bytes of s. */
void rp_putn(rp_buf *b, const char *s, size_t n);
void rp_puts(rp_buf *b, const char *s);
/* HTML/XML-escaped text. */
void rp_esc(rp_buf *b, const char *s);

/* ---------------------------------------------------------------- report_table.c ------ */

/* The rows of a results file as text. Owns every name and cell (rp_table_free). */
typedef struct rp_table {
    int ncol, nrow, caprow;
    char **col;        /* column names */
    char ***cell;      /* nrow x ncol, "" for missing */
} rp_table;

/* Reads a CSV or JSON Lines file of kbcl sweep (a partial last line is ignored). t is
 * freeable with rp_table_free whatever it returns. */
int rp_table_read(const char *path, rp_table *t, kb_errbuf *eb);
void rp_table_free(rp_table *t);
/* The index of column name, or -1. */
int rp_col(const rp_table *t, const char *name);

#define RP_NSPLIT 4 /* the decoder's time split: compute, memory, comm, launch */

/* The columns the page reads, by index; -1 where the file has none (files from before a
 * column was written lack it). */
typedef struct rp_cols {
    int point, status, verified, bench, algorithm;
    int ws, n_elem, size, bytes;  /* world_size, n_elem, size, size_bytes */
    int time, busbw;              /* sim_time_ns, busbw_gbps */
    int split[RP_NSPLIT];         /* compute_ns, memory_ns, comm_ns, launch_ns */
    int tps;                      /* tokens_per_s */
    int eff, bound, bres;         /* efficiency, bound_ns, bound_resource */
    int reff;                     /* roofline_efficiency */
    int tp;                       /* system.sips.count, only when the rows have the split */
} rp_cols;

void rp_cols_find(const rp_table *t, rp_cols *c);

/* The rows as the plots see them: their order, their series, their numbers. Borrows t and
 * c; owns the rest (rp_plotdata_free). */
typedef struct rp_plotdata {
    const rp_table *t;
    const rp_cols *c;
    int nseries;
    char **series;        /* names, global order (first appearance by point) */
    int *row_series;      /* per row: series index, -1 when the row is not plotted */
    int *order;           /* rows sorted by point */
    int *pos;             /* per row: its place in order */
    double **num;         /* per column: its cells as numbers (strtod), read once on first use */
    int nok, nerr, nbad;  /* rows ok (plotted), not ok, ok but failed verification */
    int oom;
} rp_plotdata;

/*
 * Orders the rows by point (a duplicated point: the first row stands) and gives each ok row a
 * series: the values of the swept keys other than the x axes and panels, "algorithm" first,
 * found by hashing, so that the work grows with the rows. pd is freeable with
 * rp_plotdata_free whatever it returns.
 */
int rp_plotdata_build(rp_plotdata *pd, const rp_table *t, const rp_cols *c, kb_errbuf *eb);
void rp_plotdata_free(rp_plotdata *pd);

/* ---------------------------------------------------------------- report_svg.c -------- */

/* The y label of the efficiency plots. */
#define EFF_LABEL "efficiency (bound / sim time)"

/* How a plot's y axis is scaled. */
enum {
    Y_LINEAR,   /* linear from zero */
    Y_AUTO,     /* logarithmic (decades) when the values span more than 30x, else linear */
    Y_FRACTION, /* 0 .. 1 (further only if a value exceeds 1): an efficiency, so that plots
                 * compare at a glance and a low one does not look high on its own scale */
};

/* A group of plots: metric column y (times yscale) against column x, one plot per value of
 * column panel (-1: a single plot). */
typedef struct rp_plotspec {
    int x, y;
    double yscale;        /* to the plotted unit: 1e-3 for ns shown in us */
    int panel;
    const char *what;     /* the plots' title, before the panel's value */
    const char *xlabel, *ylabel;
    int ymode;            /* Y_* */
} rp_plotspec;

/* Appends the group's plots, one <svg> each, and counts them in *nplots. The points of every
 * panel are gathered in one pass over the rows and sorted once, so that the work grows with
 * the rows, not with rows times panels or series. */
void rp_plot_group(rp_buf *b, rp_plotdata *pd, const rp_plotspec *ps, int *nplots);
/* How many different values column c takes over the plotted rows (0 when c < 0). */
int rp_n_distinct(rp_plotdata *pd, int c);

#endif
