/*
 * sweep_out — the output of `kbcl sweep`: a point's outcome as one CSV or JSON Lines row, the
 * header, opening the output, and --resume, which reads the rows already there. Rows are
 * written whole with one write() to an O_APPEND file, so an interrupted sweep leaves at most
 * one partial last line, which --resume cuts off before it skips the points already present.
 * Limits: rows are one line each (newlines in messages become spaces); resume trusts rows
 * whose point index and swept values match this sweep file and refuses a file written by a
 * different grid or with other columns; an output that is one of the sweep's inputs is refused.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kb_sweep_int.h"

/* The decoder_layer time split's columns (kb_sweep_int.h). */
const char *const kbcl_sweep_split_cols[SW_NSPLIT] = { "compute_ns", "memory_ns", "comm_ns",
                                                       "launch_ns", "tokens_per_s" };

/* Row status of an outcome: "ok", the lower-case KB_ERR_* name, or "crash". */
const char *kbcl_sweep_status_name(int rc)
{
    const char *name = kb_err_name(rc);
    if (rc == SW_CRASH)
        return "crash";
    return name ? name : "error";
}

/* ---------------------------------------------------------------- rows --------------- */

static int csv_needs_quotes(const char *s)
{
    return strpbrk(s, ",\"\n\r") != NULL || (*s && (s[0] == ' ' || s[strlen(s) - 1] == ' '));
}

/* Appends one CSV field (with its separator) to buf; returns the new length or -1. */
static int csv_put(char *buf, size_t n, int len, const char *s, int first)
{
    if (len < 0 || (size_t)len >= n)
        return -1;
    if (!first)
        len += snprintf(buf + len, n - (size_t)len, ",");
    if (!csv_needs_quotes(s))
        return len + snprintf(buf + len, (size_t)len < n ? n - (size_t)len : 0, "%s", s);
    if ((size_t)len + 1 < n)
        buf[len++] = '"';
    for (; *s && (size_t)len + 2 < n; s++) {
        if (*s == '"')
            buf[len++] = '"';
        buf[len++] = *s;
    }
    if ((size_t)len + 1 < n)
        buf[len++] = '"';
    buf[len] = 0;
    return len;
}

/* The fixed columns after the swept ones, in TC_* order; the decoder split columns, when the
 * sweep has them, go before verified. bound_ns, efficiency and bound_resource (issue #29)
 * sit with the other measured columns; the roofline's (issue #32) come last, after error, so
 * that every earlier column keeps its place. A file without them has a different header,
 * which --resume refuses rather than mix two column sets in one file. */
static const char *const tail_cols[] = { "bench", "size_bytes", "sim_time_ns", "algbw_gbps",
                                         "busbw_gbps", "bound_ns", "efficiency",
                                         "bound_resource", "events", "wall_ms", "verified",
                                         "status", "error", "roofline_ns", "roofline_bound",
                                         "roofline_efficiency" };
enum { TC_BENCH, TC_SIZE, TC_SIM, TC_ALGBW, TC_BUSBW, TC_BOUND, TC_EFF, TC_BOUND_RES, TC_EVENTS,
       TC_WALL, TC_VERIFIED, TC_STATUS, TC_ERROR, TC_ROOF, TC_ROOF_BOUND, TC_ROOF_EFF, N_TAIL };
_Static_assert(sizeof tail_cols / sizeof tail_cols[0] == N_TAIL, "one name per TC_* column");

/* Text columns (JSON strings); verified is a boolean and the rest are numbers. */
static int tail_is_text(int i)
{
    return i == TC_BENCH || i == TC_BOUND_RES || i == TC_STATUS || i == TC_ERROR ||
           i == TC_ROOF_BOUND;
}

/* The headers kbcl has written: the current one, and those of before the roofline columns
 * and before the bound columns, so that --resume can say why such a file does not fit. */
enum { HDR_NO_BOUND, HDR_NO_ROOF, HDR_NOW };

static char *csv_header_cols(const sw_plan *p, int version)
{
    size_t n = 512;
    char *buf;
    int len = 0;
    for (int a = 0; a < p->nax; a++)
        n += 3 + 2 * strlen(p->ax[a].name);
    if (!(buf = malloc(n)))
        return NULL;
    len = csv_put(buf, n, 0, "point", 1);
    for (int a = 0; a < p->nax; a++)
        len = csv_put(buf, n, len, p->ax[a].name, 0);
    for (int i = 0; i < N_TAIL; i++) {
        if (i == TC_VERIFIED && p->split_cols)
            for (int k = 0; k < SW_NSPLIT; k++)
                len = csv_put(buf, n, len, kbcl_sweep_split_cols[k], 0);
        if ((version > HDR_NO_BOUND || i < TC_BOUND || i > TC_BOUND_RES) &&
            (version > HDR_NO_ROOF || i < TC_ROOF))
            len = csv_put(buf, n, len, tail_cols[i], 0);
    }
    snprintf(buf + len, n - (size_t)len, "\n");
    return buf;
}

static char *csv_header(const sw_plan *p)
{
    return csv_header_cols(p, HDR_NOW);
}

static void fmt_num(char *b, size_t n, int have, double v)
{
    if (have)
        snprintf(b, n, "%.12g", v);
    else
        b[0] = 0;
}

/* The row of one outcome, "\n"-terminated (malloc'd). */
char *kbcl_sweep_format_row(const sw_plan *p, const sw_outcome *o, int jsonl)
{
    char num[N_TAIL][48], split[SW_NSPLIT][48];
    const char *val[N_TAIL]; /* every tail column as text, "" when empty */
    int ok = o->rc == 0;

    for (int i = 0; i < N_TAIL; i++) {
        num[i][0] = 0;
        val[i] = num[i];
    }
    for (int k = 0; k < SW_NSPLIT; k++)
        fmt_num(split[k], sizeof split[k], ok && o->have_split, o->split[k]);
    val[TC_BENCH] = p->bench ? p->bench : "ccl_allreduce";
    fmt_num(num[TC_SIZE], sizeof num[TC_SIZE], ok && o->have_size, o->size_bytes);
    fmt_num(num[TC_SIM], sizeof num[TC_SIM], ok, o->sim_time_ns);
    fmt_num(num[TC_ALGBW], sizeof num[TC_ALGBW], ok && o->have_algbw, o->algbw);
    fmt_num(num[TC_BUSBW], sizeof num[TC_BUSBW], ok && o->have_busbw, o->busbw);
    fmt_num(num[TC_BOUND], sizeof num[TC_BOUND], ok && o->have_bound, o->bound_ns);
    fmt_num(num[TC_EFF], sizeof num[TC_EFF], ok && o->have_bound, o->efficiency);
    if (ok && o->have_bound)
        val[TC_BOUND_RES] = o->bound_resource;
    fmt_num(num[TC_ROOF], sizeof num[TC_ROOF], ok && o->have_roofline, o->roofline_ns);
    fmt_num(num[TC_ROOF_EFF], sizeof num[TC_ROOF_EFF], ok && o->have_roofline,
            o->roofline_efficiency);
    if (ok && o->have_roofline)
        val[TC_ROOF_BOUND] = o->roofline_bound;
    if (ok)
        snprintf(num[TC_EVENTS], sizeof num[TC_EVENTS], "%llu", o->events);
    if (ok)
        snprintf(num[TC_WALL], sizeof num[TC_WALL], "%.3f", o->wall_ms);
    val[TC_VERIFIED] = o->rc || o->verified < 0 ? "" : o->verified ? "true" : "false";
    val[TC_STATUS] = ok ? "ok" : kbcl_sweep_status_name(o->rc);
    val[TC_ERROR] = o->msg;
    if (jsonl) {
        cJSON *r = cJSON_CreateObject();
        char *text, *line;
        cJSON_AddNumberToObject(r, "point", o->point);
        for (int a = 0; a < p->nax; a++) {
            const char *v = kbcl_sweep_point_val(p, o->point, a);
            char canon[32];
            /* a number only when it prints back as the same text ("010" stays a string) */
            snprintf(canon, sizeof canon, "%lld", strtoll(v, NULL, 10));
            if (kbcl_sweep_is_int_text(v) && strlen(v) < 16 && !strcmp(canon, v))
                cJSON_AddNumberToObject(r, p->ax[a].name, (double)strtoll(v, NULL, 10));
            else
                cJSON_AddStringToObject(r, p->ax[a].name, v);
        }
        /* the keys in the CSV's column order; an empty value is null */
        for (int i = 0; i < N_TAIL; i++) {
            for (int k = 0; i == TC_VERIFIED && p->split_cols && k < SW_NSPLIT; k++) {
                if (split[k][0])
                    cJSON_AddRawToObject(r, kbcl_sweep_split_cols[k], split[k]);
                else
                    cJSON_AddNullToObject(r, kbcl_sweep_split_cols[k]);
            }
            if (!*val[i])
                cJSON_AddNullToObject(r, tail_cols[i]);
            else if (i == TC_VERIFIED)
                cJSON_AddBoolToObject(r, tail_cols[i], val[i][0] == 't');
            else if (tail_is_text(i))
                cJSON_AddStringToObject(r, tail_cols[i], val[i]);
            else
                cJSON_AddRawToObject(r, tail_cols[i], val[i]);
        }
        text = cJSON_PrintUnformatted(r);
        cJSON_Delete(r);
        if (!text)
            return NULL;
        line = kbcl_sweep_asprintf("%s\n", text);
        cJSON_free(text);
        return line;
    }
    {
        size_t n = 1024 + 2 * sizeof o->msg + 2 * sizeof o->bound_resource +
                   2 * strlen(val[TC_BENCH]);
        char *buf, idx[16];
        int len;
        for (int a = 0; a < p->nax; a++)
            n += 3 + 2 * strlen(kbcl_sweep_point_val(p, o->point, a));
        if (!(buf = malloc(n)))
            return NULL;
        snprintf(idx, sizeof idx, "%d", o->point);
        len = csv_put(buf, n, 0, idx, 1);
        for (int a = 0; a < p->nax; a++)
            len = csv_put(buf, n, len, kbcl_sweep_point_val(p, o->point, a), 0);
        for (int i = 0; i < N_TAIL; i++) {
            for (int k = 0; i == TC_VERIFIED && p->split_cols && k < SW_NSPLIT; k++)
                len = csv_put(buf, n, len, split[k], 0);
            len = csv_put(buf, n, len, val[i], 0);
        }
        snprintf(buf + len, n - (size_t)len, "\n");
        return buf;
    }
}

/* ---------------------------------------------------------------- resume -------------- */

/* Splits one CSV line (no newline) into at most max fields, in place. Returns the count. */
static int csv_split(char *line, char **f, int max)
{
    int n = 0;
    char *r = line, *w = line;
    for (;;) {
        char *start = w;
        if (*r == '"') {
            r++;
            for (;;) {
                if (!*r)
                    break;
                if (*r == '"' && r[1] == '"') {
                    *w++ = '"';
                    r += 2;
                } else if (*r == '"') {
                    r++;
                    break;
                } else {
                    *w++ = *r++;
                }
            }
            while (*r && *r != ',')
                *w++ = *r++;
        } else {
            while (*r && *r != ',')
                *w++ = *r++;
        }
        if (n < max)
            f[n] = start;
        n++;
        if (!*r) {
            *w = 0;
            break;
        }
        r++;
        *w++ = 0;
    }
    return n;
}

static char *read_fd(int fd, size_t *len)
{
    struct stat st;
    char *buf;
    size_t got = 0;
    if (fstat(fd, &st) != 0 || !(buf = malloc((size_t)st.st_size + 1)))
        return NULL;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    buf[got] = 0;
    *len = got;
    return buf;
}

/* One existing row: checks it belongs to this sweep and marks its point done. */
static int resume_row(sw_ctx *c, int lineno, int point, const char *const *vals,
                      const char *verified, const char *status, kb_errbuf *eb)
{
    const sw_plan *p = c->plan;
    if (point < 0 || point >= p->npoints)
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: point %d is not a point of %s (it has %d); "
                          "was the file written by another sweep? Use a new --out",
                          c->out_path, lineno, point, p->file, p->npoints);
    for (int a = 0; a < p->nax; a++)
        if (strcmp(vals[a], kbcl_sweep_point_val(p, point, a)))
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: point %d has %s=%s but point %d of %s "
                              "has %s=%s (the grid changed?); use a new --out", c->out_path,
                              lineno, point, p->ax[a].name, vals[a], point, p->file,
                              p->ax[a].name, kbcl_sweep_point_val(p, point, a));
    if (c->done[point])
        return 0; /* a duplicate from a hand-edited file: the first row stands */
    c->done[point] = 1;
    c->ndone_before++;
    if (!strcmp(status, kb_err_name(KB_ERR_NOFIT)))
        c->n_nofit++;
    else if (strcmp(status, "ok"))
        c->n_err++;
    else if (!strcmp(verified, "false"))
        c->n_verify_fail++;
    else
        c->n_ok++;
    return 0;
}

static int resume_csv(sw_ctx *c, char *text, kb_errbuf *eb)
{
    const sw_plan *p = c->plan;
    int ncol = 1 + p->nax + N_TAIL + (p->split_cols ? SW_NSPLIT : 0), lineno = 1, rc = 0;
    int cver = 1 + p->nax + (p->split_cols ? SW_NSPLIT : 0) + TC_VERIFIED; /* status: next */
    char **f = calloc((size_t)ncol, sizeof *f), *hdr = csv_header(p), *line = text, *nl;
    if (!f || !hdr) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    nl = strchr(line, '\n');
    if (!nl)
        goto out; /* empty file: the header is written as for a new one */
    if ((size_t)(nl - line + 1) != strlen(hdr) || strncmp(line, hdr, strlen(hdr))) {
        static const char *const missing[] = {
            "the bound_ns, efficiency, bound_resource and roofline columns",
            "the roofline_ns, roofline_bound and roofline_efficiency columns" };
        int version = -1;
        /* this grid's columns as an older kbcl wrote them: the generic message would list two
         * near-identical headers and hide that only the version differs. The file is left as
         * it is either way. */
        for (int v = HDR_NO_BOUND; v < HDR_NOW && version < 0; v++) {
            char *old = csv_header_cols(p, v);
            if (old && (size_t)(nl - line + 1) == strlen(old) && !strncmp(line, old, strlen(old)))
                version = v;
            free(old);
        }
        if (version >= 0) {
            rc = kb_err_set(eb, KB_ERR_USAGE, "%s:1: the file was written by an older kbcl "
                            "sweep, without %s; --resume does not rewrite it: use a new --out "
                            "(or run the sweep again without --resume)", c->out_path,
                            missing[version]);
        } else {
            hdr[strlen(hdr) - 1] = 0;
            rc = kb_err_set(eb, KB_ERR_USAGE, "%s:1: header %.*s does not match this sweep's "
                            "columns (%s); use a new --out", c->out_path, (int)(nl - line),
                            line, hdr);
        }
        goto out;
    }
    for (line = nl + 1; (nl = strchr(line, '\n')); line = nl + 1) {
        int n, point;
        lineno++;
        *nl = 0;
        if (!*line)
            continue;
        n = csv_split(line, f, ncol);
        if (n != ncol || !kbcl_sweep_is_int_text(f[0])) {
            rc = kb_err_set(eb, KB_ERR_USAGE, "%s:%d: not a row of this sweep (%d fields, "
                            "expected %d)", c->out_path, lineno, n, ncol);
            goto out;
        }
        point = (int)strtol(f[0], NULL, 10);
        if ((rc = resume_row(c, lineno, point, (const char *const *)f + 1, f[cver],
                             f[cver + 1], eb)) != 0)
            goto out;
    }
out:
    free(f);
    free(hdr);
    return rc;
}

static int resume_jsonl(sw_ctx *c, char *text, kb_errbuf *eb)
{
    const sw_plan *p = c->plan;
    char num[SW_MAX_AXES][40];
    const char *vals[SW_MAX_AXES];
    int lineno = 0, rc = 0;
    char *nl;
    for (char *line = text; (nl = strchr(line, '\n')); line = nl + 1) {
        cJSON *r, *it;
        int point;
        lineno++;
        *nl = 0;
        if (!*line)
            continue;
        r = cJSON_Parse(line);
        it = cJSON_GetObjectItemCaseSensitive(r, "point");
        if (!r || !cJSON_IsNumber(it)) {
            cJSON_Delete(r);
            return kb_err_set(eb, KB_ERR_USAGE, "%s:%d: not a row of a sweep (no \"point\")",
                              c->out_path, lineno);
        }
        point = it->valueint;
        for (int a = 0; a < p->nax; a++) {
            it = cJSON_GetObjectItemCaseSensitive(r, p->ax[a].name);
            if (cJSON_IsString(it)) {
                vals[a] = it->valuestring;
            } else if (cJSON_IsNumber(it)) {
                snprintf(num[a], sizeof num[a], "%.17g", it->valuedouble);
                vals[a] = num[a];
            } else {
                vals[a] = "(missing)";
            }
        }
        it = cJSON_GetObjectItemCaseSensitive(r, "verified");
        rc = resume_row(c, lineno, point, vals, cJSON_IsFalse(it) ? "false" : "",
                        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r, "status"))
                            ? cJSON_GetObjectItemCaseSensitive(r, "status")->valuestring
                            : "", eb);
        cJSON_Delete(r);
        if (rc)
            return rc;
    }
    return 0;
}

/* 1 when the n bytes at s begin as the string w does (or w begins with all of them). */
static int prefix_match(const char *s, size_t n, const char *w)
{
    size_t m = strlen(w);
    return !strncmp(s, w, n < m ? n : m);
}

/* A partial last line (n bytes at s, no newline) that --resume may cut: the start of this
 * sweep's header when it is the file's only line, else the start of a row. Anything else
 * means the file is not this sweep's output, and it is left as it is. */
static int partial_line_ok(const sw_ctx *c, const char *s, size_t n, int first, kb_errbuf *eb)
{
    int ok;
    if (c->jsonl) {
        ok = prefix_match(s, n, "{\"point\":");
    } else if (first) {
        char *hdr = csv_header(c->plan);
        if (!hdr)
            return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        ok = prefix_match(s, n, hdr);
        free(hdr);
    } else {
        ok = s[0] >= '0' && s[0] <= '9';
    }
    if (ok)
        return 0;
    return kb_err_set(eb, KB_ERR_USAGE, "%s: %s is not %s of this sweep; --resume leaves the "
                      "file as it is: use a new --out", c->out_path,
                      first ? "its first line" : "its last line",
                      first ? (c->jsonl ? "a row" : "the header") : "a row");
}

/*
 * --resume's reading of the existing output (text: its len bytes and a NUL): the whole file is
 * checked before anything of it is cut. Its whole lines must be this sweep's rows, whose
 * points it marks done, and a partial last line what an interrupted run leaves; *keep is the
 * length without that line. A NUL byte is refused: the line functions would stop at it and
 * take the rows after it for absent (run again) or for part of the partial line (cut).
 */
static int resume_scan(sw_ctx *c, char *text, size_t len, size_t *keep, kb_errbuf *eb)
{
    const char *nul = memchr(text, 0, len), *nl;
    int rc;

    if (nul) {
        size_t line = 1;
        for (const char *q = text; q < nul; q++)
            line += *q == '\n';
        return kb_err_set(eb, KB_ERR_USAGE, "%s:%zu: a NUL byte: not the output of kbcl sweep; "
                          "--resume leaves the file as it is: use a new --out", c->out_path,
                          line);
    }
    *keep = len && text[len - 1] != '\n'
                ? ((nl = strrchr(text, '\n')) ? (size_t)(nl - text) + 1 : 0)
                : len;
    if (*keep < len && (rc = partial_line_ok(c, text + *keep, len - *keep, *keep == 0, eb)) != 0)
        return rc;
    text[*keep] = 0;
    return c->jsonl ? resume_jsonl(c, text, eb) : resume_csv(c, text, eb);
}

/* The output against every input of the sweep: its plan, the files the plan names, the
 * plugins and the default configurations (a sweep that wrote over one of them would lose it
 * before its first point ran). */
int kbcl_sweep_check_out(const sw_ctx *c, const char *plan_file, const char *const *plugins,
                         int nplugins, kb_errbuf *eb)
{
    char tbuf[4096], cbuf[4096];
    const sw_plan *p = c->plan;
    const char *ins[6 + KBCL_MAX_PLUGIN_ARGS] = {
        plan_file, p->topology, p->ccl, p->model,
        kbcl_default_config("topology.yaml", tbuf, sizeof tbuf),
        kbcl_default_config("ccl.yaml", cbuf, sizeof cbuf),
    };
    int n = 6;
    for (int i = 0; i < nplugins; i++)
        ins[n++] = plugins[i];
    return kbcl_check_output("--out", c->out_path, ins, n, eb);
}

/*
 * Opens the output (rank 0 only). With resume, cuts a partial last line (a row whose write
 * was cut short by a kill), then marks the points the file already holds.
 */
int kbcl_sweep_output_open(sw_ctx *c, int resume, kb_errbuf *eb)
{
    char *text = NULL, *hdr = NULL;
    size_t len = 0;
    int rc = 0;

    if (!c->out_path) {
        c->fd = STDOUT_FILENO;
        if (!c->jsonl && (!(hdr = csv_header(c->plan)) || kbcl_write_all(c->fd, hdr, strlen(hdr))))
            rc = kb_err_set(eb, KB_ERR_IO, "stdout: write failed");
        goto out;
    }
    c->fd = open(c->out_path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (resume ? 0 : O_TRUNC),
                 0644);
    if (c->fd < 0) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot open: %s", c->out_path, strerror(errno));
        goto out;
    }
    /* A POSIX record lock, not flock(): forked workers do not inherit it, so the lock goes
     * with the sweep process itself (a flock would live on in a worker that a kill -9 of the
     * sweep left dying, and a --resume right after would find the file locked). */
    struct flock lk = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
    if (fcntl(c->fd, F_SETLK, &lk) != 0) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: another kbcl sweep is writing it", c->out_path);
        goto out;
    }
    if (resume) {
        size_t keep;
        if (!(text = read_fd(c->fd, &len))) {
            rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot read: %s", c->out_path, strerror(errno));
            goto out;
        }
        if ((rc = resume_scan(c, text, len, &keep, eb)) != 0)
            goto out;
        if (keep < len) {
            if (ftruncate(c->fd, (off_t)keep) != 0) {
                rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot cut the partial last line: %s",
                                c->out_path, strerror(errno));
                goto out;
            }
            if (!c->quiet)
                fprintf(stderr, "kbcl sweep: %s: removed a partial last row (%zu bytes) left "
                        "by an interrupted run\n", c->out_path, len - keep);
            len = keep;
        }
    }
    if (!len && !c->jsonl &&
        (!(hdr = csv_header(c->plan)) || kbcl_write_all(c->fd, hdr, strlen(hdr)) != 0))
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot write the header: %s", c->out_path,
                        hdr ? strerror(errno) : "out of memory");
out:
    free(text);
    free(hdr);
    return rc;
}

/* ---------------------------------------------------------------- the format ---------- */

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The output's format, from its name: JSON Lines for .jsonl and .json, else CSV. */
int kbcl_sweep_out_is_jsonl(const char *path)
{
    return path && (ends_with(path, ".jsonl") || ends_with(path, ".json"));
}

int kbcl_sweep_resume_check(kbcl_sweep_plan *p, const char *out, int *ndone, size_t *keep,
                            kb_errbuf *eb)
{
    sw_ctx c;
    char *text = NULL;
    size_t len = 0, kept = 0;
    int rc;

    memset(&c, 0, sizeof c);
    c.fd = -1;
    if (ndone)
        *ndone = 0;
    if (keep)
        *keep = 0;
    if (!p || !out) {
        rc = kb_err_set(eb, KB_ERR_INVAL, "kbcl_sweep_resume_check: NULL argument");
        goto out;
    }
    c.plan = p;
    c.out_path = out;
    c.jsonl = kbcl_sweep_out_is_jsonl(out);
    c.quiet = 1;
    if (!(c.done = calloc((size_t)p->npoints, 1))) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((c.fd = open(out, O_RDONLY | O_CLOEXEC)) < 0 || !(text = read_fd(c.fd, &len))) {
        rc = kb_err_set(eb, KB_ERR_IO, "%s: cannot read: %s", out, strerror(errno));
        goto out;
    }
    if ((rc = resume_scan(&c, text, len, &kept, eb)) == 0) {
        if (ndone)
            *ndone = c.ndone_before;
        if (keep)
            *keep = kept;
    }
out:
    if (c.fd >= 0)
        close(c.fd);
    free(c.done);
    free(text);
    return rc;
}
