/*
 * report_table.c — the rows `kbcl report` draws from: a results file of kbcl sweep (CSV with
 * RFC 4180 quotes, or JSON Lines, told apart by the name or a leading '{') read into a table
 * of text cells, the columns the page uses found by name, and the rows indexed for plotting:
 * sorted by point, each ok row given its series (the combination of the swept keys that are
 * no axis or panel, found by hashing, so that a sweep may have as many series as rows). The
 * work grows with the rows and their one sort. Limits: rows are single lines (no newline in
 * a quoted field); a partial last line, as an interrupted sweep leaves, is ignored; a file
 * without a 'point' column is refused; a series name is cut at 511 bytes.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kb_report_int.h"

void rp_table_free(rp_table *t)
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

int rp_col(const rp_table *t, const char *name)
{
    for (int c = 0; c < t->ncol; c++)
        if (!strcmp(t->col[c], name))
            return c;
    return -1;
}

static int add_col(rp_table *t, const char *name)
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

static char **add_row(rp_table *t)
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

int rp_table_read(const char *path, rp_table *t, kb_errbuf *eb)
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
                if (rp_col(t, it->string) < 0 && add_col(t, it->string) < 0) {
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
    if (rp_col(t, "point") < 0)
        rc = kb_err_set(eb, KB_ERR_USAGE, "%s: no 'point' column: not the output of kbcl sweep",
                        path);
out:
    free(fld);
    free(text);
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- indexing rows ------- */

void rp_cols_find(const rp_table *t, rp_cols *c)
{
    c->point = rp_col(t, "point");
    c->status = rp_col(t, "status");
    c->verified = rp_col(t, "verified");
    c->bench = rp_col(t, "bench");
    c->algorithm = rp_col(t, "algorithm");
    c->ws = rp_col(t, "world_size");
    c->n_elem = rp_col(t, "n_elem");
    c->size = rp_col(t, "size");
    c->bytes = rp_col(t, "size_bytes");
    c->time = rp_col(t, "sim_time_ns");
    c->busbw = rp_col(t, "busbw_gbps");
    c->split[0] = rp_col(t, "compute_ns");
    c->split[1] = rp_col(t, "memory_ns");
    c->split[2] = rp_col(t, "comm_ns");
    c->split[3] = rp_col(t, "launch_ns");
    c->tps = rp_col(t, "tokens_per_s");
    c->eff = rp_col(t, "efficiency");
    c->bound = rp_col(t, "bound_ns");
    c->bres = rp_col(t, "bound_resource");
    c->reff = rp_col(t, "roofline_efficiency");
    /* the TP size is an axis of the decoder layer's time split only */
    c->tp = c->split[0] >= 0 && c->split[1] >= 0 && c->split[2] >= 0
                ? rp_col(t, "system.sips.count") : -1;
}

/* The columns kbcl sweep writes after the swept ones; everything else except point is swept. */
static int is_fixed_col(const char *name)
{
    static const char *const fixed[] = { "point", "bench", "size_bytes", "sim_time_ns",
                                         "algbw_gbps", "busbw_gbps", "events", "wall_ms",
                                         "verified", "status", "error", "compute_ns",
                                         "memory_ns", "comm_ns", "launch_ns", "tokens_per_s",
                                         "bound_ns", "efficiency", "bound_resource", "roofline_ns",
                                         "roofline_bound", "roofline_efficiency" };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(name, fixed[i]))
            return 1;
    return 0;
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

/* pd->order and pd->pos: rows by point index, rows of one point in file order. */
static int order_rows(rp_plotdata *pd)
{
    const rp_table *t = pd->t;
    rowkey *keys = malloc((size_t)(t->nrow + 1) * sizeof *keys);
    if (!keys)
        return KB_ERR_NOMEM;
    for (int r = 0; r < t->nrow; r++) {
        keys[r].point = strtol(t->cell[r][pd->c->point], NULL, 10);
        keys[r].row = r;
    }
    qsort(keys, (size_t)t->nrow, sizeof *keys, cmp_point);
    for (int i = 0; i < t->nrow; i++) {
        pd->order[i] = keys[i].row;
        pd->pos[keys[i].row] = i;
    }
    free(keys);
    return 0;
}

/* The columns that name a row's series (cols holds ncol): the swept keys other than the x
 * axes and panels, "algorithm" first. Returns their count. */
static int series_columns(const rp_table *t, const rp_cols *c, int *cols)
{
    int n = 0;
    if (c->algorithm >= 0)
        cols[n++] = c->algorithm;
    for (int k = 0; k < t->ncol; k++)
        if (!is_fixed_col(t->col[k]) && k != c->ws && k != c->n_elem && k != c->size &&
            k != c->algorithm && k != c->tp)
            cols[n++] = k;
    return n;
}

/* Row r's series name (cut at size - 1 bytes): its values of the series columns, the bench
 * when there are none. */
static void series_name(const rp_table *t, int r, const int *cols, int ncols, int cbench,
                        char *name, size_t size)
{
    size_t len = 0;
    name[0] = 0;
    for (int k = 0; k < ncols && len < size; k++) {
        int c = cols[k];
        if (!strcmp(t->col[c], "algorithm")) /* the usual case: just the name */
            len += (size_t)snprintf(name + len, size - len, "%s%s", k ? ", " : "",
                                    t->cell[r][c]);
        else /* a config key by its last part: n_slots=1, not ccl.defaults.n_slots=1 */
            len += (size_t)snprintf(name + len, size - len, "%s%s=%s",
                                    k ? ", " : "", strrchr(t->col[c], '.')
                                                       ? strrchr(t->col[c], '.') + 1
                                                       : t->col[c], t->cell[r][c]);
    }
    if (!ncols)
        snprintf(name, size, "%s", cbench >= 0 ? t->cell[r][cbench] : "all");
}

/* pd->row_series, pd->series and the row counts, in point order: the first row of a point
 * stands, rows not ok get no series. */
static int assign_series(rp_plotdata *pd, const int *cols, int ncols, kb_errbuf *eb)
{
    const rp_table *t = pd->t;
    const rp_cols *c = pd->c;
    size_t hmask = 1;
    int *htab, rc = 0;

    while (hmask < 2 * (size_t)t->nrow)
        hmask <<= 1;
    if (!(htab = malloc(hmask * sizeof *htab)))
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    hmask--;
    for (size_t h = 0; h <= hmask; h++)
        htab[h] = -1;
    for (int i = 0; i < t->nrow; i++) {
        int r = pd->order[i], s;
        size_t h;
        char name[512];
        pd->row_series[r] = -1;
        if (i > 0 && !strcmp(t->cell[r][c->point], t->cell[pd->order[i - 1]][c->point]))
            continue; /* a duplicated point: the first row stands */
        if (c->status >= 0 && strcmp(t->cell[r][c->status], "ok")) {
            pd->nerr++;
            continue;
        }
        pd->nok++;
        if (c->verified >= 0 && !strcmp(t->cell[r][c->verified], "false"))
            pd->nbad++;
        series_name(t, r, cols, ncols, c->bench, name, sizeof name);
        /* open addressing on the name's hash: a sweep may have as many series as rows */
        h = str_hash(name) & hmask;
        while ((s = htab[h]) >= 0 && strcmp(pd->series[s], name))
            h = (h + 1) & hmask;
        if (s < 0) {
            if (!(pd->series[pd->nseries] = dupstr(name))) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                goto out;
            }
            s = htab[h] = pd->nseries++;
        }
        pd->row_series[r] = s;
    }
out:
    free(htab);
    return rc;
}

int rp_plotdata_build(rp_plotdata *pd, const rp_table *t, const rp_cols *c, kb_errbuf *eb)
{
    int *cols = NULL, rc = 0;

    memset(pd, 0, sizeof *pd);
    pd->t = t;
    pd->c = c;
    pd->row_series = malloc((size_t)(t->nrow + 1) * sizeof *pd->row_series);
    pd->order = malloc((size_t)(t->nrow + 1) * sizeof *pd->order);
    pd->series = calloc((size_t)(t->nrow + 1), sizeof *pd->series);
    pd->pos = malloc((size_t)(t->nrow + 1) * sizeof *pd->pos);
    pd->num = calloc((size_t)(t->ncol + 1), sizeof *pd->num);
    cols = malloc((size_t)(t->ncol + 1) * sizeof *cols);
    if (!pd->row_series || !pd->order || !pd->series || !pd->pos || !pd->num || !cols ||
        order_rows(pd) != 0) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    rc = assign_series(pd, cols, series_columns(t, c, cols), eb);
out:
    free(cols);
    return rc;
}

void rp_plotdata_free(rp_plotdata *pd)
{
    for (int s = 0; s < pd->nseries; s++)
        free(pd->series[s]);
    free(pd->series);
    free(pd->row_series);
    free(pd->order);
    free(pd->pos);
    for (int c = 0; pd->num && c < pd->t->ncol; c++)
        free(pd->num[c]);
    free(pd->num);
}
