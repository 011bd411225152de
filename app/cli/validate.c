/*
 * kbcl validate — holds kbcl's predictions against a real machine's measurements. A data file
 * (CSV: collective, bytes, measured_us, algorithm, label; docs in usage_validate) lists
 * measured collective times, e.g. nccl-tests' on a real box; every row runs as
 * `kbcl run --bench ccl --algorithm A --size BYTES --device none` would run it (the same job,
 * timing only), in the file's order, and the command prints measured, predicted and the
 * signed error per row, then the mean and worst absolute error over the measured rows of at
 * least --min-bytes (the sizes where a bandwidth model is judged) and over all measured rows.
 * With --threshold PCT the exit status says whether the worst of the large rows is within it,
 * with --ratio R whether every measured row's prediction is within a factor of R of its
 * measurement (the band of the latency-bound sizes), so CI can hold a machine description to
 * a measured table.
 *
 * Everything that can be checked without simulating is checked before the first row runs:
 * the data file, the configuration, each row's entry and that its collective is the row's,
 * and every row's job as `kbcl run` checks it; a long validation never dies on row 40 of a
 * typo. The table is printed as rows finish; it holds no wall-clock figure, so the same
 * inputs give the same stdout (and --json) byte for byte.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kb_ccl.h"
#include "kb_ccl_reg.h"
#include "kb_cli.h"
#include "kb_dist_algo.h"

/* A data file larger than this is not a table of measurements: refused rather than read. */
#define VAL_MAX_FILE (16u << 20)
#define VAL_DEFAULT_MIN_BYTES (INT64_C(8) << 20)
/* Fields a line may have: more than the 5 columns, so that an extra column is named as one. */
#define VAL_MAX_FIELDS 64
#define VAL_STR_(x) #x
#define VAL_STR(x) VAL_STR_(x)

/* The columns of a data file, in the order the messages list them. */
enum { COL_COLLECTIVE, COL_BYTES, COL_MEASURED, COL_ALGORITHM, COL_LABEL, NCOLS };
static const char *const col_names[NCOLS] = { "collective", "bytes", "measured_us", "algorithm",
                                              "label" };
#define VAL_COLS_HELP "collective,bytes,measured_us,algorithm,label in any order"

typedef struct val_row {
    int line;                   /* 1-based line in the data file */
    const char *label, *collective, *bytes_text, *algorithm; /* point into val_data.text */
    int kind;                   /* kb_coll_kind of collective */
    int64_t bytes;
    int measured;               /* 0: a prediction-only row (measured_us empty) */
    double measured_us;
    double sim_time_ns;         /* the run's; valid once the row ran */
    double error_pct;           /* (predicted - measured) / measured * 100, measured rows */
} val_row;

typedef struct val_data {
    const char *path;
    char *text;                 /* the file, cut into NUL-terminated fields in place */
    val_row *rows;
    int nrows;
} val_data;

/* A summary over a set of measured rows: how many, mean |error|, the worst row. */
typedef struct val_stats {
    int n;
    double mean_abs, worst_abs;
    const val_row *worst;
} val_stats;

static void usage_validate(FILE *f)
{
    fputs("usage: kbcl validate DATA.csv [--topology FILE] [--ccl FILE] [--set KEY=VALUE ...]\n"
          "                     [--threshold PCT] [--min-bytes SIZE] [--ratio R] [--json FILE]\n"
          "                     [--quiet]\n"
          "\n"
          "Runs every row of DATA.csv, in order, as `kbcl run --bench ccl --algorithm A --size\n"
          "BYTES --device none` would (timing only), and prints per row the measured time, the\n"
          "predicted one (sim_time) and the error (predicted - measured) / measured, then the\n"
          "mean and worst absolute error over the measured rows of at least --min-bytes and\n"
          "over all measured rows.\n"
          "\n"
          "  --topology FILE    machine description (default configs/topology.yaml)\n"
          "  --ccl FILE         collective library config whose entries the algorithm column\n"
          "                     names (default configs/ccl.yaml)\n"
          "  --set KEY=VALUE    override a config key for every row (repeatable)\n"
          "  --buffer-kind K, --root R, --op OP, --dtype T\n"
          "                     as kbcl run: applied to every row's entry\n"
          "  --threshold PCT    exit 1 when the worst |error| over the measured rows of at\n"
          "                     least --min-bytes is above PCT percent (default: no threshold)\n"
          "  --min-bytes SIZE   the rows the first summary line and --threshold judge\n"
          "                     (default 8M; K, M, G = 2^10, 2^20, 2^30)\n"
          "  --ratio R          exit 1 when a measured row of any size is off by more than a\n"
          "                     factor of R >= 1: predicted / measured outside [1/R, R]\n"
          "                     (default: no ratio)\n"
          "  --json FILE        write the rows and the summary as JSON (atomically; never over\n"
          "                     an input)\n"
          "  --quiet            print only the summary, no table, nothing on stderr but errors\n"
          "  --plugin FILE.so   load a plugin (repeatable; docs/plugins.md)\n"
          "\n"
          "DATA.csv: lines starting with # are comments; the first other line is the header,\n"
          "the columns " VAL_COLS_HELP ":\n"
          "  collective   nccl-tests' name: all_reduce, all_gather, reduce_scatter, broadcast,\n"
          "               reduce, all_to_all (or sendrecv); must be the entry's collective\n"
          "  bytes        nccl-tests' size per rank (--size): 8, 64K, 1M, 1G\n"
          "  measured_us  the measured time in microseconds; empty = a prediction-only row\n"
          "               (printed, not counted)\n"
          "  algorithm    the ccl file's entry that runs the row (--algorithm); its world size\n"
          "               is the entry's\n"
          "  label        free text shown per row (e.g. default, ring); \"quoted\" may hold commas\n"
          "exit codes: 0 every row ran (and the worst large-row error is within --threshold,\n"
          "            every row within --ratio), 1 above --threshold or outside --ratio, 2\n"
          "            usage, data-file (FILE:LINE) or config error, or --threshold with no\n"
          "            measured row of at least --min-bytes (--ratio with none at all); a row\n"
          "            whose run fails stops validate with kbcl run's status (3 simulation\n"
          "            error)\n",
          f);
}

/* ---------------------------------------------------------------- the data file -------- */

/* "1 MiB", "8 B", "1.5 KiB": bytes for a reader, exact when a whole number of the unit. */
static void human_size(char *buf, size_t n, int64_t bytes)
{
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int u = 0;
    while (u < 4 && bytes >= (INT64_C(1) << (10 * (u + 1))))
        u++;
    if (bytes % (INT64_C(1) << (10 * u)) == 0)
        snprintf(buf, n, "%lld %s", (long long)(bytes >> (10 * u)), units[u]);
    else
        snprintf(buf, n, "%.1f %s", (double)bytes / (double)(INT64_C(1) << (10 * u)), units[u]);
}

/* The file into a NUL-terminated buffer (*out, malloc'd). */
static int read_text(const char *path, char **out, kb_errbuf *eb)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;

    *out = NULL;
    if (!f)
        return kb_err_set(eb, KB_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    for (;;) {
        if (len + 4096 + 1 > cap) {
            char *nb;
            cap = cap ? cap * 2 : 8192;
            if (!(nb = realloc(buf, cap))) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "%s: out of memory reading it", path);
                goto out;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, 4096, f);
        len += got;
        if (len > VAL_MAX_FILE) {
            rc = kb_err_set(eb, KB_ERR_USAGE, "%s: larger than %u MiB: not a table of "
                            "measurements", path, VAL_MAX_FILE >> 20);
            goto out;
        }
        if (got < 4096)
            break;
    }
    if (ferror(f)) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        goto out;
    }
    buf[len] = '\0';
    /* a NUL would end a line early and hide the rest of it from every check */
    if (strlen(buf) != len) {
        int line = 1;
        for (const char *p = buf; *p; p++)
            line += *p == '\n';
        rc = kb_err_set(eb, KB_ERR_USAGE, "%s:%d: a NUL byte: not a text file", path, line);
        goto out;
    }
    *out = buf;
    buf = NULL;
out:
    fclose(f);
    free(buf);
    return rc;
}

/*
 * Cuts one line into comma-separated fields in place (fields[0..*n), each NUL-terminated).
 * Unquoted fields lose the blanks around them; a field in double quotes keeps its text as is,
 * commas included, with "" for a quote. 0, or -1 with the reason in *why.
 */
static int split_fields(char *line, char **fields, int max, int *n, const char **why)
{
    char *r = line, *w = line;
    *n = 0;
    for (;;) {
        char c;
        while (*r == ' ' || *r == '\t')
            r++;
        if (*n == max) {
            *why = "more than " VAL_STR(VAL_MAX_FIELDS) " fields";
            return -1;
        }
        fields[(*n)++] = w;
        if (*r == '"') {
            for (r++;; r++) {
                if (*r == '\0') {
                    *why = "a quoted field without its closing quote";
                    return -1;
                }
                if (*r == '"' && r[1] == '"')
                    *w++ = *r++;
                else if (*r == '"')
                    break;
                else
                    *w++ = *r;
            }
            for (r++; *r == ' ' || *r == '\t'; r++)
                ;
            if (*r != ',' && *r != '\0') {
                *why = "text after a quoted field's closing quote";
                return -1;
            }
        } else {
            char *start = w;
            while (*r != ',' && *r != '\0')
                *w++ = *r++;
            while (w > start && (w[-1] == ' ' || w[-1] == '\t'))
                w--;
        }
        c = *r; /* read before the terminator may overwrite it (w can equal r) */
        *w++ = '\0';
        if (c == '\0')
            return 0;
        r++;
    }
}

/* 1 when s is a plain decimal number (digits, one point, an exponent): no sign, hex, inf or
 * nan, which strtod would take. */
static int plain_decimal(const char *s)
{
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        digits++;
    if (*s == '.')
        for (s++; *s >= '0' && *s <= '9'; s++)
            digits++;
    if (!digits)
        return 0;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (*s < '0' || *s > '9')
            return 0;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    return *s == '\0';
}

/* The header's fields into col[COL_*] = field index. */
static int parse_header(const val_data *d, int line, char **f, int n, int col[NCOLS],
                        kb_errbuf *eb)
{
    for (int c = 0; c < NCOLS; c++)
        col[c] = -1;
    for (int i = 0; i < n; i++) {
        int c = 0;
        while (c < NCOLS && strcmp(f[i], col_names[c]))
            c++;
        if (c == NCOLS)
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: unknown column '%s' in the header "
                              "(expected " VAL_COLS_HELP ")", d->path, line, f[i]);
        if (col[c] >= 0)
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: column '%s' appears twice in the header",
                              d->path, line, f[i]);
        col[c] = i;
    }
    for (int c = 0; c < NCOLS; c++)
        if (col[c] < 0)
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: the header has no column '%s' (expected "
                              VAL_COLS_HELP ")", d->path, line, col_names[c]);
    return 0;
}

/* One data line's fields into row. */
static int parse_row(const val_data *d, int line, char **f, int n, const int col[NCOLS],
                     val_row *row, kb_errbuf *eb)
{
    const char *meas;

    if (n != NCOLS)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: %d field%s, the header has %d (" 
                          VAL_COLS_HELP ")", d->path, line, n, n == 1 ? "" : "s", NCOLS);
    memset(row, 0, sizeof *row);
    row->line = line;
    row->collective = f[col[COL_COLLECTIVE]];
    row->bytes_text = f[col[COL_BYTES]];
    row->algorithm = f[col[COL_ALGORITHM]];
    row->label = f[col[COL_LABEL]];
    meas = f[col[COL_MEASURED]];
    row->kind = -1;
    for (int k = 0; k < KB_COLL_NKINDS; k++)
        if (!strcmp(row->collective, kb_coll_name((kb_coll_kind)k)))
            row->kind = k;
    if (row->kind < 0)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: collective '%s': expected an nccl-tests "
                          "name: all_reduce, all_gather, reduce_scatter, broadcast, reduce, "
                          "all_to_all or sendrecv", d->path, line, row->collective);
    if (kbcl_parse_size(row->bytes_text, &row->bytes) != 0)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: bytes '%s': " KBCL_SIZE_HELP, d->path, line,
                          row->bytes_text);
    if (meas[0]) {
        char *end;
        errno = 0;
        row->measured_us = strtod(meas, &end);
        if (!plain_decimal(meas) || errno || *end || !(row->measured_us > 0) ||
            !isfinite(row->measured_us))
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: measured_us '%s': expected a positive "
                              "number of microseconds (e.g. 12.5), or nothing for a "
                              "prediction-only row", d->path, line, meas);
        row->measured = 1;
    }
    if (!row->algorithm[0])
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: the algorithm is empty: name an entry of "
                          "the ccl file (kbcl list shows them)", d->path, line);
    return 0;
}

/* Reads and checks the data file into d (free with data_fini). */
static int data_load(val_data *d, const char *path, kb_errbuf *eb)
{
    char *fields[VAL_MAX_FIELDS], *line, *next;
    const char *why;
    int col[NCOLS], header = 0, lineno = 0, cap = 0, n, rc;

    memset(d, 0, sizeof *d);
    d->path = path;
    if ((rc = read_text(path, &d->text, eb)) != 0)
        return rc;
    line = d->text;
    /* a UTF-8 byte order mark, which spreadsheets write, is not part of the first column */
    if (!strncmp(line, "\xEF\xBB\xBF", 3))
        line += 3;
    /* stops at the end of the text: after a final newline there is no further line */
    for (; line && *line; line = next) {
        size_t len;
        const char *p;
        lineno++;
        if ((next = strchr(line, '\n')) != NULL)
            *next++ = '\0';
        len = strlen(line);
        if (len && line[len - 1] == '\r')
            line[len - 1] = '\0';
        for (p = line; *p == ' ' || *p == '\t'; p++)
            ;
        if (*p == '#' || *p == '\0')
            continue; /* comments and blank lines are no rows */
        if (split_fields(line, fields, VAL_MAX_FIELDS, &n, &why) != 0)
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: %s", path, lineno, why);
        if (!header) {
            if ((rc = parse_header(d, lineno, fields, n, col, eb)) != 0)
                return rc;
            header = lineno;
            continue;
        }
        if (d->nrows == cap) {
            val_row *nr;
            cap = cap ? cap * 2 : 64;
            if (!(nr = realloc(d->rows, (size_t)cap * sizeof *nr)))
                return kb_err_set(eb, KB_ERR_NOMEM, "%s: out of memory", path);
            d->rows = nr;
        }
        if ((rc = parse_row(d, lineno, fields, n, col, &d->rows[d->nrows], eb)) != 0)
            return rc;
        d->nrows++;
    }
    if (!header)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: no header line (%s; expected "
                          VAL_COLS_HELP ")", path, lineno > 0 ? lineno : 1,
                          lineno > 0 ? "only comments and blank lines" : "the file is empty");
    if (!d->nrows)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: no data rows after the header", path,
                          header);
    return 0;
}

static void data_fini(val_data *d)
{
    free(d->rows);
    free(d->text);
}

/* ---------------------------------------------------------------- the configuration ---- */

/* What every row shares: the machine and the collective library loaded once, as the rows'
 * jobs borrow them (kbcl_job.base_*), and the same with --set applied, where the rows'
 * entries are looked up. */
typedef struct val_cfg {
    kb_config *cfg, *cfg_set;
    kb_ccl_cfg *ccl, *ccl_set;
    const char *topo_file, *ccl_file;   /* the files read; NULL = the built-in defaults */
    char topo_path[4096], ccl_path[4096]; /* their names for messages and output */
    char topo_buf[4096], ccl_buf[4096];
} val_cfg;

static int cfg_load(val_cfg *vc, const kbcl_job *job, kb_errbuf *eb)
{
    int rc;

    /* zeroed: cfg_fini may meet them before they are filled */
    if (!(vc->cfg = calloc(1, sizeof *vc->cfg)) ||
        !(vc->cfg_set = calloc(1, sizeof *vc->cfg_set)) ||
        !(vc->ccl = calloc(1, sizeof *vc->ccl)) || !(vc->ccl_set = calloc(1, sizeof *vc->ccl_set)))
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    kb_config_defaults(vc->cfg);
    kb_ccl_config_defaults(vc->ccl);
    /* the files kbcl_job_prepare would read */
    vc->topo_file = job->topology ? job->topology
                                  : kbcl_default_config("topology.yaml", vc->topo_buf,
                                                        sizeof vc->topo_buf);
    vc->ccl_file = job->ccl ? job->ccl
                            : kbcl_default_config("ccl.yaml", vc->ccl_buf, sizeof vc->ccl_buf);
    snprintf(vc->topo_path, sizeof vc->topo_path, "%s",
             vc->topo_file ? vc->topo_file : "the built-in machine");
    snprintf(vc->ccl_path, sizeof vc->ccl_path, "%s",
             vc->ccl_file ? vc->ccl_file : "the built-in ccl defaults");
    if ((rc = kbcl_configs_load(vc->topo_file, vc->ccl_file, job->plugins, vc->cfg, vc->ccl,
                                eb)) != 0)
        return rc;
    *vc->cfg_set = *vc->cfg;
    *vc->ccl_set = *vc->ccl;
    /* a bad --set is one error here, not one per row */
    for (int i = 0; i < job->nsets; i++)
        if ((rc = kbcl_config_set(vc->cfg_set, vc->ccl_set, job->sets[i], eb)) != 0)
            return KB_ERR_USAGE;
    if ((rc = kb_config_validate(vc->cfg_set, eb)) != 0)
        return KB_ERR_USAGE;
    return 0;
}

static void cfg_fini(val_cfg *vc)
{
    if (vc->cfg)
        kb_config_fini(vc->cfg);
    if (vc->cfg_set)
        kb_config_fini(vc->cfg_set);
    free(vc->cfg);
    free(vc->cfg_set);
    free(vc->ccl);
    free(vc->ccl_set);
}

/* The row's job: the command's options, with its entry and size. */
static kbcl_job row_job(const kbcl_job *base, const val_cfg *vc, const val_row *r)
{
    kbcl_job j = *base;
    j.algorithm = r->algorithm;
    j.size = r->bytes_text;
    j.base_cfg = vc->cfg;
    j.base_ccl = vc->ccl;
    return j;
}

/* That the row's entry exists and runs the row's collective, then every check `kbcl run`
 * makes of its job. */
static int row_check(const val_data *d, const val_cfg *vc, const kbcl_job *base,
                     const val_row *r, kb_errbuf *eb)
{
    const kb_ccl_algo *e = kb_ccl_config_find(vc->ccl_set, r->algorithm);
    const kb_ccl_algo_impl *a;
    const kb_ccl_algo_impl *da;
    kbcl_result res;
    kbcl_job j;
    int kind, rc;

    if (!e)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: algorithm '%s' is not an entry of %s "
                          "(kbcl list --ccl FILE shows them)", d->path, r->line, r->algorithm,
                          vc->ccl_path);
    a = kb_ccl_reg_find_algo(vc->ccl_set->reg, e->module);
    da = kb_ccl_reg_find_dist(vc->ccl_set->reg, e->module);
    /* the kind bench_ccl runs the entry as (kbcl list's collective column) */
    kind = a ? (int)a->kind : da ? (int)da->kind : -1;
    if (kind < 0)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: entry '%s' of %s names module '%s', which "
                          "no collective implements (a plugin not loaded?)", d->path, r->line,
                          r->algorithm, vc->ccl_path, e->module);
    if (kind != r->kind)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: collective %s, but entry '%s' of %s runs "
                          "%s", d->path, r->line, r->collective, r->algorithm, vc->ccl_path,
                          kb_coll_name((kb_coll_kind)kind));
    j = row_job(base, vc, r);
    rc = kbcl_job_prepare(&j, &res, eb);
    kbcl_result_fini(&res);
    if (rc) /* kbcl run's message, about the options the row stands for */
        kb_err_prefix(eb, "%s:%d: algorithm %s, bytes %s", d->path, r->line, r->algorithm,
                      r->bytes_text);
    return rc;
}

/* ---------------------------------------------------------------- results -------------- */

/* A measured row's predicted / measured. */
static double row_ratio(const val_row *r) { return 1.0 + r->error_pct / 100.0; }

/* Whether every measured row is within a factor of R (predicted / measured in [1/R, R]). */
static int ratio_ok(const val_data *d, double R)
{
    for (int i = 0; i < d->nrows; i++)
        if (d->rows[i].measured &&
            (row_ratio(&d->rows[i]) > R || row_ratio(&d->rows[i]) * R < 1.0))
            return 0;
    return 1;
}

/* Mean and worst |error| over the measured rows of at least min_bytes. */
static val_stats stats(const val_data *d, int64_t min_bytes)
{
    val_stats s = { 0, 0, 0, NULL };
    double sum = 0;
    for (int i = 0; i < d->nrows; i++) {
        const val_row *r = &d->rows[i];
        double e = fabs(r->error_pct);
        if (!r->measured || r->bytes < min_bytes)
            continue;
        s.n++;
        sum += e;
        if (!s.worst || e > s.worst_abs) { /* the first of equals: file order decides */
            s.worst_abs = e;
            s.worst = r;
        }
    }
    s.mean_abs = s.n ? sum / s.n : 0;
    return s;
}

/* "FILE:LINE (label collective 1 MiB algorithm)": a row for a reader. */
static void row_name(char *buf, size_t n, const val_data *d, const val_row *r)
{
    char hs[32];
    human_size(hs, sizeof hs, r->bytes);
    snprintf(buf, n, "%s:%d (%s%s%s %s %s)", d->path, r->line, r->label,
             r->label[0] ? " " : "", r->collective, hs, r->algorithm);
}

/* A signed percentage to one decimal, never "-0.0". */
static void fmt_pct(char *buf, size_t n, double pct)
{
    snprintf(buf, n, "%+.1f", fabs(pct) < 0.05 ? 0.0 : pct);
}

typedef struct val_widths {
    int label, algorithm;
} val_widths;

static void print_header(const val_widths *w)
{
    printf("%-*s  %-14s  %12s  %9s  %-*s  %13s  %13s  %8s\n", w->label, "label", "collective",
           "bytes", "size", w->algorithm, "algorithm", "measured_us", "predicted_us",
           "error_%");
}

static void print_row(const val_widths *w, const val_row *r)
{
    char hs[32], meas[32] = "-", err[32] = "-";
    human_size(hs, sizeof hs, r->bytes);
    if (r->measured) {
        snprintf(meas, sizeof meas, "%.3f", r->measured_us);
        fmt_pct(err, sizeof err, r->error_pct);
    }
    printf("%-*s  %-14s  %12lld  %9s  %-*s  %13s  %13.3f  %8s\n", w->label, r->label,
           r->collective, (long long)r->bytes, hs, w->algorithm, r->algorithm, meas,
           r->sim_time_ns / 1000.0, err);
}

static void print_stats(const char *what, const val_data *d, const val_stats *s)
{
    char name[1024];
    if (!s->n) {
        printf("%s: no measured row\n", what);
        return;
    }
    row_name(name, sizeof name, d, s->worst);
    printf("%s: %d measured, mean |error| %.1f %%, worst %.1f %% at %s\n", what, s->n,
           s->mean_abs, s->worst_abs, name);
}

static cJSON *stats_json(const val_stats *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "measured_rows", s->n);
    if (s->n) {
        cJSON_AddNumberToObject(o, "mean_abs_error_pct", s->mean_abs);
        cJSON_AddNumberToObject(o, "worst_abs_error_pct", s->worst_abs);
        cJSON_AddNumberToObject(o, "worst_line", s->worst->line);
    } else {
        cJSON_AddNullToObject(o, "mean_abs_error_pct");
        cJSON_AddNullToObject(o, "worst_abs_error_pct");
        cJSON_AddNullToObject(o, "worst_line");
    }
    return o;
}

/* The whole result as JSON text (cJSON_free it), or NULL out of memory. */
static char *result_json(const val_data *d, const val_cfg *vc, int64_t min_bytes,
                         double threshold, double ratio, const val_stats *large,
                         const val_stats *all)
{
    cJSON *root = cJSON_CreateObject(), *rows = cJSON_CreateArray(), *sum;
    char *out;

    cJSON_AddStringToObject(root, "kbcl_version", KBCL_VERSION);
    cJSON_AddStringToObject(root, "data", d->path);
    cJSON_AddStringToObject(root, "topology", vc->topo_path);
    cJSON_AddStringToObject(root, "ccl", vc->ccl_path);
    for (int i = 0; i < d->nrows; i++) {
        const val_row *r = &d->rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "line", r->line);
        cJSON_AddStringToObject(o, "label", r->label);
        cJSON_AddStringToObject(o, "collective", r->collective);
        cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
        cJSON_AddStringToObject(o, "algorithm", r->algorithm);
        if (r->measured) {
            cJSON_AddNumberToObject(o, "measured_us", r->measured_us);
        } else {
            cJSON_AddNullToObject(o, "measured_us");
        }
        cJSON_AddNumberToObject(o, "predicted_us", r->sim_time_ns / 1000.0);
        if (r->measured)
            cJSON_AddNumberToObject(o, "error_pct", r->error_pct);
        else
            cJSON_AddNullToObject(o, "error_pct");
        cJSON_AddItemToArray(rows, o);
    }
    cJSON_AddItemToObject(root, "rows", rows);
    sum = cJSON_AddObjectToObject(root, "summary");
    cJSON_AddNumberToObject(sum, "min_bytes", (double)min_bytes);
    cJSON_AddItemToObject(sum, "large", stats_json(large));
    cJSON_AddItemToObject(sum, "all", stats_json(all));
    if (threshold >= 0) {
        cJSON_AddNumberToObject(sum, "threshold_pct", threshold);
        cJSON_AddBoolToObject(sum, "pass", large->worst_abs <= threshold);
    } else {
        cJSON_AddNullToObject(sum, "threshold_pct");
        cJSON_AddNullToObject(sum, "pass");
    }
    if (ratio > 0) {
        cJSON_AddNumberToObject(sum, "ratio", ratio);
        cJSON_AddBoolToObject(sum, "ratio_pass", ratio_ok(d, ratio));
    } else {
        cJSON_AddNullToObject(sum, "ratio");
        cJSON_AddNullToObject(sum, "ratio_pass");
    }
    out = cJSON_Print(root);
    cJSON_Delete(root);
    return out;
}

/* ---------------------------------------------------------------- the command --------- */

/* Job options that the data file or validate itself decides, refused by name with why. */
static int refuse_job_options(const kbcl_job *j, kb_errbuf *eb)
{
    const struct {
        const char *given, *opt, *why;
    } no[] = {
        { j->bench, "--bench", "validate runs the ccl bench" },
        { j->algorithm, "--algorithm", "each row's algorithm column names its entry" },
        { j->size, "--size", "each row's bytes column is its size" },
        { j->n_elem, "--n-elem", "each row's bytes column is its size" },
        { j->world_size, "--world-size", "each row's entry decides its world size (--set "
          "ccl.algorithms.NAME.world_size=N changes one entry's)" },
        { j->device, "--device", "validate runs timing only (--device none)" },
        { j->verify ? "" : NULL, "--verify-data", "validate runs timing only (--device none)" },
        { j->replay_cut, "--replay-cut", "validate runs timing only (--device none)" },
        { j->trace_path, "--trace", "validate writes no trace (kbcl run --trace does, for one "
          "row)" },
        { j->trace_filter, "--trace-filter", "validate writes no trace" },
        { j->trace_window, "--trace-window", "validate writes no trace" },
        { j->model, "--model", "the ccl bench takes no model file" },
        { j->nparams ? "" : NULL, "--param", "the ccl bench's sizes are the data file's" },
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (no[i].given)
            return kb_err_set(eb, KB_ERR_USAGE, "%s: not an option of validate: %s", no[i].opt,
                              no[i].why);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The options of `kbcl validate`; job holds the kbcl run options it shares, and the plugins
 * once loaded (borrowed from the command). */
typedef struct val_args {
    const char *data_path, *json_path;
    const char *files[KBCL_MAX_PLUGIN_ARGS]; /* --plugin */
    int nfiles;
    double threshold;                         /* percent; -1 = none */
    double ratio;                             /* >= 1; 0 = none */
    int64_t min_bytes;
    int quiet;
    kbcl_job job;
} val_args;

/* Parses the command line into *a (validate's own options, then the job's: ccl bench, timing
 * only). Returns -1 to go on, else the exit code (after --help or a usage error). */
static int parse_args(int argc, char **argv, val_args *a)
{
    kb_errbuf eb = { { 0 } };

    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        int k = kbcl_job_option(&a->job, argc, argv, &i, &eb);
        if (k < 0) {
            fprintf(stderr, "kbcl validate: %s\n", eb.msg);
            return KBCL_EXIT_USAGE;
        }
        if (k)
            continue;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage_validate(stdout);
            return 0;
        } else if (!strcmp(s, "--threshold")) {
            char *end = NULL;
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            errno = 0;
            a->threshold = v ? strtod(v, &end) : -1;
            if (!v || !plain_decimal(v) || errno || *end || !isfinite(a->threshold)) {
                fprintf(stderr, "kbcl validate: --threshold needs a percentage >= 0, e.g. 10 "
                        "(got '%s')\n", v ? v : "");
                return KBCL_EXIT_USAGE;
            }
        } else if (!strcmp(s, "--ratio")) {
            char *end = NULL;
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            errno = 0;
            a->ratio = v ? strtod(v, &end) : 0;
            if (!v || !plain_decimal(v) || errno || *end || !isfinite(a->ratio) ||
                a->ratio < 1) {
                fprintf(stderr, "kbcl validate: --ratio needs a factor >= 1, e.g. 2 (got "
                        "'%s')\n", v ? v : "");
                return KBCL_EXIT_USAGE;
            }
        } else if (!strcmp(s, "--min-bytes")) {
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            if (!v || kbcl_parse_size(v, &a->min_bytes) != 0) {
                fprintf(stderr, "kbcl validate: --min-bytes %s: " KBCL_SIZE_HELP "\n",
                        v ? v : "");
                return KBCL_EXIT_USAGE;
            }
        } else if (!strcmp(s, "--json")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kbcl validate: --json needs a file name\n");
                return KBCL_EXIT_USAGE;
            }
            a->json_path = argv[++i];
        } else if (!strcmp(s, "--quiet") || !strcmp(s, "-q")) {
            a->quiet = 1;
        } else if (!strcmp(s, "--plugin")) {
            if (i + 1 >= argc || a->nfiles >= KBCL_MAX_PLUGIN_ARGS) {
                fprintf(stderr, "kbcl validate: --plugin needs a file (at most %d)\n",
                        KBCL_MAX_PLUGIN_ARGS);
                return KBCL_EXIT_USAGE;
            }
            a->files[a->nfiles++] = argv[++i];
        } else if (s[0] == '-' || a->data_path) {
            fprintf(stderr, "kbcl validate: unexpected argument '%s' (see kbcl validate "
                    "--help)\n", s);
            return KBCL_EXIT_USAGE;
        } else {
            a->data_path = s;
        }
    }
    if (!a->data_path) {
        usage_validate(stderr);
        return KBCL_EXIT_USAGE;
    }
    if (refuse_job_options(&a->job, &eb) != 0) {
        fprintf(stderr, "kbcl validate: %s\n", eb.msg);
        return KBCL_EXIT_USAGE;
    }
    a->job.bench = "ccl";
    a->job.device = "none";
    return -1;
}

/* The inputs, before any row runs: the data file (and that --threshold has rows to judge),
 * the plugins (*ps, the caller destroys them), the configuration, and that --json names no
 * input. */
static int load_inputs(val_args *a, val_data *d, val_cfg *vc, kb_plugins **ps, kb_errbuf *eb)
{
    const char *ins[3 + KBCL_MAX_PLUGIN_ARGS];
    int nins = 0, rc;

    if ((rc = data_load(d, a->data_path, eb)) != 0)
        return rc;
    /* only the count of the large rows is known yet: it decides the threshold */
    if (a->threshold >= 0 && stats(d, a->min_bytes).n == 0) {
        char mb[32];
        human_size(mb, sizeof mb, a->min_bytes);
        return kb_err_set(eb, KB_ERR_USAGE, "%s: no measured row of at least %s (--min-bytes): "
                          "nothing to judge --threshold %g against", a->data_path, mb,
                          a->threshold);
    }
    if (a->ratio > 0 && stats(d, 1).n == 0)
        return kb_err_set(eb, KB_ERR_USAGE, "%s: no measured row: nothing to judge --ratio %g "
                          "against", a->data_path, a->ratio);
    if ((rc = kb_plugins_create(ps, eb)) != 0 ||
        (rc = kbcl_plugins_load_cli(*ps, a->files, a->nfiles, eb)) != 0)
        return rc;
    a->job.plugins = *ps;
    if ((rc = cfg_load(vc, &a->job, eb)) != 0)
        return rc;
    ins[nins++] = a->data_path;
    ins[nins++] = vc->topo_file;
    ins[nins++] = vc->ccl_file;
    for (int i = 0; i < a->nfiles; i++)
        ins[nins++] = a->files[i];
    return kbcl_check_output("--json", a->json_path, ins, nins, eb);
}

/* Every row's checks (row_check), and the table's column widths for its labels and
 * algorithms. */
static int check_rows(const val_args *a, const val_data *d, const val_cfg *vc, val_widths *w,
                      kb_errbuf *eb)
{
    int rc;

    for (int i = 0; i < d->nrows; i++) {
        const val_row *r = &d->rows[i];
        if ((rc = row_check(d, vc, &a->job, r, eb)) != 0)
            return rc;
        if ((int)strlen(r->label) > w->label)
            w->label = (int)strlen(r->label);
        if ((int)strlen(r->algorithm) > w->algorithm)
            w->algorithm = (int)strlen(r->algorithm);
    }
    return 0;
}

/* Runs the rows in order, each row's time and error printed as it finishes (unless quiet).
 * Returns 0, or the exit code of the first row that failed, its message printed. */
static int run_rows(const val_args *a, val_data *d, const val_cfg *vc, const val_widths *w,
                    kb_errbuf *eb)
{
    if (!a->quiet) {
        printf("data %s; machine %s; ccl %s\n", a->data_path, vc->topo_path, vc->ccl_path);
        print_header(w);
        fflush(stdout);
    }
    for (int i = 0; i < d->nrows; i++) {
        val_row *r = &d->rows[i];
        kbcl_job j = row_job(&a->job, vc, r);
        kbcl_result res;
        char name[1024];
        int rc = kbcl_job_run(&j, &res, eb);

        if (rc) {
            row_name(name, sizeof name, d, r);
            if (res.rep.report) /* a deadlock: the whole report, as kbcl run prints it */
                fprintf(stderr, "kbcl validate: %s: %s: at the end of the run:%s\n", name,
                        kb_strerror(rc), res.rep.report);
            else
                fprintf(stderr, "kbcl validate: %s: %s: %s\n", name, kb_strerror(rc), eb->msg);
            kbcl_result_fini(&res);
            return kbcl_exit_code(rc);
        }
        r->sim_time_ns = res.rep.sim_time_ns;
        kbcl_result_fini(&res);
        if (r->measured)
            r->error_pct = (r->sim_time_ns / 1000.0 - r->measured_us) / r->measured_us * 100.0;
        if (!a->quiet) {
            print_row(w, r);
            fflush(stdout); /* a long validation shows each row as it finishes */
        }
    }
    return 0;
}

/* The summary lines: how many rows were measured, the large rows' and all measured rows'
 * errors. */
static void print_summary(const val_args *a, const val_data *d, const val_stats *large,
                          const val_stats *all)
{
    int nmeas = 0;
    char what[64], mb[32];

    human_size(mb, sizeof mb, a->min_bytes);
    for (int i = 0; i < d->nrows; i++)
        nmeas += d->rows[i].measured;
    printf("measured rows: %d of %d (%d prediction-only, not counted)\n", nmeas, d->nrows,
           d->nrows - nmeas);
    snprintf(what, sizeof what, "rows >= %s", mb);
    print_stats(what, d, large);
    print_stats("all measured rows", d, all);
}

/* --threshold's verdict over the large rows, each row above it named. Returns 0 or
 * KBCL_EXIT_VERIFY. */
static int judge_threshold(const val_args *a, const val_data *d, const val_stats *large)
{
    char mb[32];

    human_size(mb, sizeof mb, a->min_bytes);
    if (large->worst_abs <= a->threshold) {
        printf("threshold %g %%: passed (worst |error| %.1f %% over the rows >= %s)\n",
               a->threshold, large->worst_abs, mb);
        return 0;
    }
    for (int i = 0; i < d->nrows; i++) {
        const val_row *r = &d->rows[i];
        char name[1024];
        if (!r->measured || r->bytes < a->min_bytes || fabs(r->error_pct) <= a->threshold)
            continue;
        row_name(name, sizeof name, d, r);
        printf("threshold %g %%: FAILED: %s is off by %.1f %%, %.1f points above it\n",
               a->threshold, name, fabs(r->error_pct), fabs(r->error_pct) - a->threshold);
    }
    return KBCL_EXIT_VERIFY;
}

/* --ratio's verdict over every measured row, the farthest named when it passes, each row
 * outside named when it does not. Returns 0 or KBCL_EXIT_VERIFY. */
static int judge_ratio(const val_args *a, const val_data *d)
{
    char name[1024];
    const val_row *far = NULL;
    double farf = 0;

    for (int i = 0; i < d->nrows; i++) {
        const val_row *r = &d->rows[i];
        double q = r->measured ? row_ratio(r) : 0, f = q >= 1 ? q : q > 0 ? 1 / q : INFINITY;
        if (!r->measured)
            continue;
        if (!far || f > farf) {
            far = r;
            farf = f;
        }
        if (f > a->ratio) {
            row_name(name, sizeof name, d, r);
            printf("ratio %g: FAILED: %s predicts %.3f x its measurement\n", a->ratio, name, q);
        }
    }
    if (!ratio_ok(d, a->ratio))
        return KBCL_EXIT_VERIFY;
    row_name(name, sizeof name, d, far);
    printf("ratio %g: passed (farthest %s, predicted %.3f x measured)\n", a->ratio, name,
           row_ratio(far));
    return 0;
}

/* The --json file, written atomically. Returns 0 or the exit code, its message printed. */
static int write_json(const val_args *a, const val_data *d, const val_cfg *vc,
                      const val_stats *large, const val_stats *all, kb_errbuf *eb)
{
    char *text = result_json(d, vc, a->min_bytes, a->threshold, a->ratio, large, all);
    int code = 0;

    if (!text) {
        fprintf(stderr, "kbcl validate: out of memory writing JSON\n");
        code = KBCL_EXIT_SIM;
    } else if (kbcl_write_atomic(a->json_path, text, eb) != 0) {
        fprintf(stderr, "kbcl validate: %s\n", eb->msg);
        code = KBCL_EXIT_USAGE;
    }
    cJSON_free(text);
    return code;
}

int kbcl_cmd_validate(int argc, char **argv)
{
    double t0 = now_s();
    int code, rc;
    kb_plugins *ps = NULL;
    kb_errbuf eb = { { 0 } };
    val_args a;
    val_data d;
    val_cfg vc;
    val_stats large, all;
    val_widths w = { 5, 9 };

    memset(&a, 0, sizeof a);
    a.threshold = -1;
    a.min_bytes = VAL_DEFAULT_MIN_BYTES;
    memset(&d, 0, sizeof d);
    memset(&vc, 0, sizeof vc);
    if ((code = parse_args(argc, argv, &a)) >= 0)
        return code;

    /* everything that can fail without simulating, before the first row runs */
    if ((rc = load_inputs(&a, &d, &vc, &ps, &eb)) != 0 ||
        (rc = check_rows(&a, &d, &vc, &w, &eb)) != 0)
        goto fail;
    if ((code = run_rows(&a, &d, &vc, &w, &eb)) != 0)
        goto out;
    large = stats(&d, a.min_bytes);
    all = stats(&d, 1);
    print_summary(&a, &d, &large, &all);
    if (a.threshold >= 0)
        code = judge_threshold(&a, &d, &large);
    if (a.ratio > 0 && (rc = judge_ratio(&a, &d)) != 0)
        code = rc;
    if (a.json_path && (rc = write_json(&a, &d, &vc, &large, &all, &eb)) != 0)
        code = rc;
    if (!a.quiet) /* the only wall-clock figure: stderr, out of the deterministic table */
        fprintf(stderr, "kbcl validate: %d rows simulated in %.1f s\n", d.nrows, now_s() - t0);
    goto out;
fail:
    fprintf(stderr, "kbcl validate: %s\n", eb.msg);
    code = kbcl_exit_code(rc);
out:
    cfg_fini(&vc);
    data_fini(&d);
    kb_plugins_destroy(ps);
    return code;
}
