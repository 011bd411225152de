/*
 * kb_trace — Chrome trace-event recording and output (kb_trace.h). Resource threads are named
 * after the machine's own names for its resources (kb_machine_each_res, walked once and
 * sorted by address), each found once and then cached in an open-addressing map together
 * with whether the filter's places keep it, so a resource event costs one lookup either way.
 */
#include "kb_trace.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kb_atomic_file.h"
#include "kb_machine.h"

#define KB_TRACE_LINK_TID0 100000u

typedef struct tev {
    uint32_t pid, tid;
    uint32_t cat;
    const char *name;
    kb_time t0, t1;
    uint64_t bytes;
} tev;

typedef struct tthread {
    uint32_t pid, tid;
    char name[64];
} tthread;

#define NO_THREAD UINT32_MAX

typedef struct rslot {
    const kb_res *r;
    uint32_t thread; /* index into threads; NO_THREAD until its first kept event */
    int keep;        /* the filter's places keep it */
} rslot;

/* Every resource of the machine with its thread name and place (SIP, cube, PE; -1 where its
 * name has none), sorted by address (built once, on the first resource event, from
 * kb_machine_each_res: the machine's own names for them). */
typedef struct rname {
    const kb_res *r;
    uint32_t pid;
    int place[3];
    char name[64];
} rname;

/* One place term of a filter: per level (SIP, cube, PE) an inclusive range; lo = -1: any. */
typedef struct tplace {
    int lo[3], hi[3];
} tplace;

#define MAX_PLACES 64

struct kb_trace {
    const kb_machine *m;
    tev *ev;
    size_t nev, capev;
    tthread *th;
    size_t nth, capth;
    rslot *map;
    size_t mapcap, mapn;
    uint32_t next_link_tid;
    rname *rnames;            /* every resource's name, by address (owned) */
    size_t nrnames;
    char **names;             /* interned names (owned) */
    size_t nnames, capnames;
    int oom;
    /* the filter: categories kept (a bit each; all when none was named), places (any when
     * none was named), the window [w0, w1) */
    unsigned cats;
    tplace places[MAX_PLACES];
    int nplaces;
    kb_time w0, w1;
    size_t offered;
    uint64_t written;
};

static const char *const cat_names[KB_TRACE_NCATS] = { "kernel", "dma", "ipcq", "compute",
                                                       "res" };

const char *kb_trace_cat_name(kb_trace_cat c)
{
    return (unsigned)c < KB_TRACE_NCATS ? cat_names[c] : "?";
}

int kb_trace_create(kb_trace **out, kb_errbuf *eb)
{
    kb_trace *t = calloc(1, sizeof *t);
    *out = t;
    if (!t)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the trace");
    t->next_link_tid = KB_TRACE_LINK_TID0;
    t->cats = (1u << KB_TRACE_NCATS) - 1;
    t->w0 = 0;
    t->w1 = KB_TIME_MAX;
    return 0;
}

#define FILTER_HELP "terms: kernel, dma, ipcq, compute, res, or a place sipR[/cubeR[/peR]] " \
                    "with R = N, N-M or *; e.g. sip0/cube0,kernel,ipcq"

/* One level of a place, "cube3", "cube0-7" or "cube*", into [lo, hi] (lo = -1: any). */
static int parse_level(const char *s, size_t n, const char *word, int *lo, int *hi)
{
    size_t w = strlen(word), i;
    long a = 0, b;
    if (n < w + 1 || strncmp(s, word, w) != 0)
        return -1;
    s += w;
    n -= w;
    if (n == 1 && *s == '*') {
        *lo = *hi = -1;
        return 0;
    }
    for (i = 0; i < n && isdigit((unsigned char)s[i]) && a < 1000000; i++)
        a = a * 10 + (s[i] - '0');
    if (i == 0 || a >= 1000000)
        return -1;
    b = a;
    if (i < n) {
        size_t j = i + 1;
        if (s[i] != '-' || j == n)
            return -1;
        for (b = 0; j < n && isdigit((unsigned char)s[j]) && b < 1000000; j++)
            b = b * 10 + (s[j] - '0');
        if (j < n || b >= 1000000 || b < a)
            return -1;
    }
    *lo = (int)a;
    *hi = (int)b;
    return 0;
}

int kb_trace_set_filter(kb_trace *t, const char *spec, kb_errbuf *eb)
{
    static const char *const levels[3] = { "sip", "cube", "pe" };
    unsigned cats = 0;
    int nplaces = 0;
    const char *p = spec;

    if (!*spec)
        return kb_err_set(eb, KB_ERR_USAGE, "an empty filter (" FILTER_HELP ")");
    for (;;) {
        size_t n = strcspn(p, ",");
        int k, found = 0;
        for (k = 0; k < KB_TRACE_NCATS; k++)
            if (strlen(cat_names[k]) == n && !strncmp(p, cat_names[k], n)) {
                cats |= 1u << k;
                found = 1;
            }
        if (!found) {
            tplace pl;
            const char *q = p, *end = p + n;
            int ok = n > 0;
            for (k = 0; k < 3; k++)
                pl.lo[k] = pl.hi[k] = -1;
            for (int lv = 0; ok; lv++) {
                const char *slash = memchr(q, '/', (size_t)(end - q));
                size_t m = slash ? (size_t)(slash - q) : (size_t)(end - q);
                if (lv == 3)
                    ok = 0; /* a fourth level */
                else if (!(m == 1 && *q == '*')) /* a bare * is any, as is sip*, cube* */
                    ok = parse_level(q, m, levels[lv], &pl.lo[lv], &pl.hi[lv]) == 0;
                if (!slash)
                    break;
                q = slash + 1;
            }
            if (!ok)
                return kb_err_set(eb, KB_ERR_USAGE, "'%.*s' is not a category or a place (%s)",
                                  (int)(n > 64 ? 64 : n), p, FILTER_HELP);
            if (nplaces == MAX_PLACES)
                return kb_err_set(eb, KB_ERR_USAGE, "more than %d places", MAX_PLACES);
            t->places[nplaces++] = pl;
        }
        if (!p[n])
            break;
        p += n + 1;
    }
    t->cats = cats ? cats : (1u << KB_TRACE_NCATS) - 1;
    t->nplaces = nplaces;
    return 0;
}

void kb_trace_set_window(kb_trace *t, kb_time t0, kb_time t1)
{
    t->w0 = t0;
    t->w1 = t1;
}

/* Whether the places keep an event at (sip, cube, pe); -1 = the place has no such level. */
static int place_kept(const kb_trace *t, const int at[3])
{
    if (!t->nplaces)
        return 1;
    for (int i = 0; i < t->nplaces; i++) {
        int ok = 1;
        for (int k = 0; k < 3 && ok; k++)
            ok = t->places[i].lo[k] < 0 ||
                 (at[k] >= t->places[i].lo[k] && at[k] <= t->places[i].hi[k]);
        if (ok)
            return 1;
    }
    return 0;
}

static int in_window(const kb_trace *t, kb_time t0, kb_time t1)
{
    return t0 < t->w1 && (t1 > t->w0 || (t1 == t0 && t0 >= t->w0));
}

void kb_trace_destroy(kb_trace *t)
{
    if (!t)
        return;
    free(t->ev);
    free(t->th);
    free(t->map);
    free(t->rnames);
    for (size_t i = 0; i < t->nnames; i++)
        free(t->names[i]);
    free(t->names);
    free(t);
}

const char *kb_trace_intern(kb_trace *t, const char *name)
{
    /* kernels per run are few: a linear search is enough */
    for (size_t i = t->nnames; i-- > 0;)
        if (!strcmp(t->names[i], name))
            return t->names[i];
    if (t->nnames == t->capnames) {
        size_t cap = t->capnames ? t->capnames * 2 : 16;
        char **n = realloc(t->names, cap * sizeof *n);
        if (!n) {
            t->oom = 1;
            return NULL;
        }
        t->names = n;
        t->capnames = cap;
    }
    char *copy = strdup(name);
    if (!copy) {
        t->oom = 1;
        return NULL;
    }
    t->names[t->nnames++] = copy;
    return copy;
}

void kb_trace_set_machine(kb_trace *t, const kb_machine *m) { t->m = m; }
size_t kb_trace_events(const kb_trace *t) { return t->nev; }
size_t kb_trace_events_offered(const kb_trace *t) { return t->offered; }
uint64_t kb_trace_bytes(const kb_trace *t) { return t->written; }

static void push_ev(kb_trace *t, uint32_t pid, uint32_t tid, kb_trace_cat cat, const char *name,
                    kb_time t0, kb_time t1, uint64_t bytes)
{
    /* kb_trace_write names the category and writes t1 - t0 as the duration */
    assert((unsigned)cat < KB_TRACE_NCATS && t0 <= t1);
    if (t->nev == t->capev) {
        size_t cap = t->capev ? t->capev * 2 : 4096;
        tev *n = realloc(t->ev, cap * sizeof *n);
        if (!n) {
            t->oom = 1;
            return;
        }
        t->ev = n;
        t->capev = cap;
    }
    t->ev[t->nev++] = (tev){ pid, tid, (uint32_t)cat, name, t0, t1, bytes };
}

static uint32_t add_thread(kb_trace *t, uint32_t pid, uint32_t tid, const char *name)
{
    for (size_t i = 0; i < t->nth; i++)
        if (t->th[i].pid == pid && t->th[i].tid == tid)
            return (uint32_t)i;
    if (t->nth == t->capth) {
        size_t cap = t->capth ? t->capth * 2 : 256;
        tthread *n = realloc(t->th, cap * sizeof *n);
        if (!n) {
            t->oom = 1; /* kb_trace_write reports it */
            return NO_THREAD;
        }
        t->th = n;
        t->capth = cap;
    }
    t->th[t->nth].pid = pid;
    t->th[t->nth].tid = tid;
    snprintf(t->th[t->nth].name, sizeof t->th[t->nth].name, "%s", name);
    return (uint32_t)t->nth++;
}

void kb_trace_pe(kb_trace *t, kb_trace_cat cat, unsigned gsip, unsigned cube, int pe,
                 const char *name, kb_time t0, kb_time t1, uint64_t bytes)
{
    char tn[64];
    uint32_t tid;
    if (!t)
        return;
    t->offered++;
    {
        int at[3] = { (int)gsip, pe < 0 ? -1 : (int)cube, pe };
        if (!(t->cats >> cat & 1u) || !in_window(t, t0, t1) || !place_kept(t, at))
            return;
    }
    if (pe < 0) {
        tid = 0;
        snprintf(tn, sizeof tn, "host");
    } else {
        int npes = t->m ? t->m->npes : 16;
        tid = (uint32_t)((int)cube * npes + pe + 1);
        snprintf(tn, sizeof tn, "cube%u/pe%d", cube, pe);
    }
    /* the thread list is small (PEs of the run); names are set once */
    if (t->nth == 0 || t->th[t->nth - 1].pid != gsip || t->th[t->nth - 1].tid != tid)
        add_thread(t, gsip, tid, tn);
    push_ev(t, gsip, tid, cat, name, t0, t1, bytes);
}

typedef struct name_walk {
    rname *v;
    size_t n, cap;
    char prev[48];
    int chan;
    int oom;
} name_walk;

static void name_visit(void *ud, const kb_res *r, const char *where)
{
    name_walk *w = ud;
    char key[48]; /* + an 11-character channel number fits rname.name */
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 1024;
        rname *n = realloc(w->v, cap * sizeof *n);
        if (!n) {
            w->oom = 1;
            return;
        }
        w->v = n;
        w->cap = cap;
    }
    snprintf(key, sizeof key, "%s %s", where, r->name ? r->name : "?");
    w->chan = strcmp(key, w->prev) == 0 ? w->chan + 1 : 0;
    snprintf(w->prev, sizeof w->prev, "%s", key);
    rname *e = &w->v[w->n++];
    e->r = r;
    /* where starts with "sip<N>", then maybe "/cube<N>", then maybe "/pe<N>" */
    {
        char *end;
        e->place[0] = (int)strtol(where + 3, &end, 10);
        e->place[1] = e->place[2] = -1;
        if (!strncmp(end, "/cube", 5)) {
            e->place[1] = (int)strtol(end + 5, &end, 10);
            if (!strncmp(end, "/pe", 3))
                e->place[2] = (int)strtol(end + 3, &end, 10);
        }
    }
    e->pid = (uint32_t)e->place[0];
    if (w->chan)
        snprintf(e->name, sizeof e->name, "%s%d", key, w->chan);
    else
        snprintf(e->name, sizeof e->name, "%s", key);
    /* the first of an engine's channels is named like the engine; a second one renames it */
    if (w->chan == 1)
        snprintf(w->v[w->n - 2].name, sizeof e->name, "%s0", key);
}

static int rname_cmp(const void *a, const void *b)
{
    const rname *x = a, *y = b;
    return (uintptr_t)x->r < (uintptr_t)y->r ? -1 : (uintptr_t)x->r > (uintptr_t)y->r;
}

/* Name, SIP and place of a resource of the machine. */
static void res_name(kb_trace *t, const kb_res *r, uint32_t *pid, int place[3], char *buf,
                     size_t n)
{
    if (t->m && !t->rnames && !t->oom) {
        name_walk w = { 0 };
        kb_machine_each_res(t->m, name_visit, &w);
        if (w.oom) {
            free(w.v);
            t->oom = 1;
        } else {
            qsort(w.v, w.n, sizeof *w.v, rname_cmp);
            t->rnames = w.v;
            t->nrnames = w.n;
        }
    }
    rname key = { r, 0, { 0, -1, -1 }, "" };
    const rname *e = t->rnames ? bsearch(&key, t->rnames, t->nrnames, sizeof key, rname_cmp)
                               : NULL;
    *pid = e ? e->pid : 0;
    memcpy(place, e ? e->place : key.place, sizeof key.place);
    snprintf(buf, n, "%s", e ? e->name : r->name ? r->name : "resource");
}

void kb_trace_res(kb_trace *t, const kb_res *r, kb_time t0, kb_time t1, uint64_t bytes)
{
    size_t h;
    if (!t)
        return;
    t->offered++;
    if (!(t->cats >> KB_TRACE_RES & 1u) || !in_window(t, t0, t1))
        return;
    if (t->mapn * 2 >= t->mapcap) {
        size_t cap = t->mapcap ? t->mapcap * 2 : 1024;
        rslot *nm = calloc(cap, sizeof *nm);
        if (!nm) {
            t->oom = 1;
            return;
        }
        for (size_t i = 0; i < t->mapcap; i++) {
            if (!t->map[i].r)
                continue;
            size_t j = ((uintptr_t)t->map[i].r >> 4) * 0x9e3779b97f4a7c15u & (cap - 1);
            while (nm[j].r)
                j = (j + 1) & (cap - 1);
            nm[j] = t->map[i];
        }
        free(t->map);
        t->map = nm;
        t->mapcap = cap;
    }
    /* a power-of-two table at most half full: the probe below finds r or a free slot */
    assert(t->mapcap && !(t->mapcap & (t->mapcap - 1)) && t->mapn * 2 < t->mapcap);
    h = ((uintptr_t)r >> 4) * 0x9e3779b97f4a7c15u & (t->mapcap - 1);
    while (t->map[h].r && t->map[h].r != r)
        h = (h + 1) & (t->mapcap - 1);
    if (!t->map[h].r) {
        t->map[h].r = r;
        t->map[h].thread = NO_THREAD;
        t->mapn++;
        if (t->nplaces) {
            char name[64];
            uint32_t pid;
            int at[3];
            res_name(t, r, &pid, at, name, sizeof name);
            t->map[h].keep = place_kept(t, at);
        } else {
            t->map[h].keep = 1;
        }
    }
    if (!t->map[h].keep)
        return;
    /* the thread (and its tid) only once the resource has an event in the trace */
    if (t->map[h].thread == NO_THREAD) {
        char name[64];
        uint32_t pid;
        int at[3];
        res_name(t, r, &pid, at, name, sizeof name);
        t->map[h].thread = add_thread(t, pid, t->next_link_tid++, name);
        if (t->map[h].thread == NO_THREAD)
            return; /* out of memory, flagged: the event cannot name its thread */
    }
    const tthread *th = &t->th[t->map[h].thread];
    push_ev(t, th->pid, th->tid, KB_TRACE_RES, r->name ? r->name : "busy", t0, t1, bytes);
}

static int put(kb_trace *t, FILE *f, cJSON *o, int *first)
{
    char *s = cJSON_PrintUnformatted(o);
    int ok = s && fputs(*first ? "\n" : ",\n", f) >= 0 && fputs(s, f) >= 0;
    if (ok)
        t->written += 2 - (uint64_t)*first + strlen(s);
    *first = 0;
    cJSON_free(s);
    cJSON_Delete(o);
    return ok ? 0 : -1;
}

int kb_trace_write(kb_trace *t, const char *path, kb_errbuf *eb)
{
    kb_atomic_file af;
    FILE *f;
    int first = 1, bad = 0, rc;

    if (t->oom)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory while recording the trace");
    if ((rc = kb_atomic_open(&af, path, eb)) != 0)
        return rc;
    f = af.f;
    static const char head[] = "{\"displayTimeUnit\": \"ns\", \"traceEvents\": [";
    static const char tail[] = "\n]}\n";
    t->written = sizeof head - 1 + sizeof tail - 1;
    fputs(head, f);
    /* processes (SIPs) and threads (PEs, host, links) */
    for (size_t i = 0; i < t->nth && !bad; i++) {
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            seen |= t->th[j].pid == t->th[i].pid;
        if (!seen) {
            char pn[32];
            cJSON *o = cJSON_CreateObject(), *args = cJSON_CreateObject();
            snprintf(pn, sizeof pn, "SIP %u", t->th[i].pid);
            cJSON_AddStringToObject(o, "name", "process_name");
            cJSON_AddStringToObject(o, "ph", "M");
            cJSON_AddNumberToObject(o, "pid", t->th[i].pid);
            cJSON_AddStringToObject(args, "name", pn);
            cJSON_AddItemToObject(o, "args", args);
            bad |= put(t, f, o, &first);
        }
        cJSON *o = cJSON_CreateObject(), *args = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", "thread_name");
        cJSON_AddStringToObject(o, "ph", "M");
        cJSON_AddNumberToObject(o, "pid", t->th[i].pid);
        cJSON_AddNumberToObject(o, "tid", t->th[i].tid);
        cJSON_AddStringToObject(args, "name", t->th[i].name);
        cJSON_AddItemToObject(o, "args", args);
        bad |= put(t, f, o, &first);
    }
    for (size_t i = 0; i < t->nev && !bad; i++) {
        const tev *e = &t->ev[i];
        cJSON *o = cJSON_CreateObject(), *args = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", e->name);
        cJSON_AddStringToObject(o, "cat", cat_names[e->cat]);
        cJSON_AddStringToObject(o, "ph", "X");
        cJSON_AddNumberToObject(o, "ts", (double)e->t0 / 1e6);
        cJSON_AddNumberToObject(o, "dur", (double)(e->t1 - e->t0) / 1e6);
        cJSON_AddNumberToObject(o, "pid", e->pid);
        cJSON_AddNumberToObject(o, "tid", e->tid);
        cJSON_AddNumberToObject(args, "bytes", (double)e->bytes);
        cJSON_AddItemToObject(o, "args", args);
        bad |= put(t, f, o, &first);
    }
    bad |= fputs(tail, f) < 0;
    return kb_atomic_commit(&af, bad, eb);
}
