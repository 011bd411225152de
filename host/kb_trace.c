/*
 * kb_trace — Chrome trace-event recording and output (kb_trace.h). Resource threads are named
 * after the machine's own names for its resources (kb_machine_each_res, walked once and
 * sorted by address), each found once and then cached in an open-addressing map.
 */
#include "kb_trace.h"

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
    const char *name;
    kb_time t0, t1;
    uint64_t bytes;
} tev;

typedef struct tthread {
    uint32_t pid, tid;
    char name[64];
} tthread;

typedef struct rslot {
    const kb_res *r;
    uint32_t thread; /* index into threads */
} rslot;

/* Every resource of the machine with its thread name, sorted by address (built once, on the
 * first resource event, from kb_machine_each_res: the machine's own names for them). */
typedef struct rname {
    const kb_res *r;
    uint32_t pid;
    char name[64];
} rname;

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
};

int kb_trace_create(kb_trace **out, kb_errbuf *eb)
{
    kb_trace *t = calloc(1, sizeof *t);
    *out = t;
    if (!t)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the trace");
    t->next_link_tid = KB_TRACE_LINK_TID0;
    return 0;
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

static void push_ev(kb_trace *t, uint32_t pid, uint32_t tid, const char *name, kb_time t0,
                    kb_time t1, uint64_t bytes)
{
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
    t->ev[t->nev++] = (tev){ pid, tid, name, t0, t1, bytes };
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
            t->oom = 1;
            return 0;
        }
        t->th = n;
        t->capth = cap;
    }
    t->th[t->nth].pid = pid;
    t->th[t->nth].tid = tid;
    snprintf(t->th[t->nth].name, sizeof t->th[t->nth].name, "%s", name);
    return (uint32_t)t->nth++;
}

void kb_trace_pe(kb_trace *t, unsigned gsip, unsigned cube, int pe, const char *name, kb_time t0,
                 kb_time t1, uint64_t bytes)
{
    char tn[64];
    uint32_t tid;
    if (!t)
        return;
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
    push_ev(t, gsip, tid, name, t0, t1, bytes);
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
    e->pid = (uint32_t)strtoul(where + 3, NULL, 10); /* where starts with "sip<N>" */
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

/* Name and SIP of a resource of the machine. */
static void res_name(kb_trace *t, const kb_res *r, uint32_t *pid, char *buf, size_t n)
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
    rname key = { r, 0, "" };
    const rname *e = t->rnames ? bsearch(&key, t->rnames, t->nrnames, sizeof key, rname_cmp)
                               : NULL;
    *pid = e ? e->pid : 0;
    snprintf(buf, n, "%s", e ? e->name : r->name ? r->name : "resource");
}

void kb_trace_res(kb_trace *t, const kb_res *r, kb_time t0, kb_time t1, uint64_t bytes)
{
    size_t h;
    if (!t)
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
    h = ((uintptr_t)r >> 4) * 0x9e3779b97f4a7c15u & (t->mapcap - 1);
    while (t->map[h].r && t->map[h].r != r)
        h = (h + 1) & (t->mapcap - 1);
    if (!t->map[h].r) {
        char name[64];
        uint32_t pid;
        res_name(t, r, &pid, name, sizeof name);
        t->map[h].r = r;
        t->map[h].thread = add_thread(t, pid, t->next_link_tid++, name);
        t->mapn++;
    }
    const tthread *th = &t->th[t->map[h].thread];
    push_ev(t, th->pid, th->tid, r->name ? r->name : "busy", t0, t1, bytes);
}

static int put(FILE *f, cJSON *o, int *first)
{
    char *s = cJSON_PrintUnformatted(o);
    int ok = s && fputs(*first ? "\n" : ",\n", f) >= 0 && fputs(s, f) >= 0;
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
    fputs("{\"displayTimeUnit\": \"ns\", \"traceEvents\": [", f);
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
            bad |= put(f, o, &first);
        }
        cJSON *o = cJSON_CreateObject(), *args = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", "thread_name");
        cJSON_AddStringToObject(o, "ph", "M");
        cJSON_AddNumberToObject(o, "pid", t->th[i].pid);
        cJSON_AddNumberToObject(o, "tid", t->th[i].tid);
        cJSON_AddStringToObject(args, "name", t->th[i].name);
        cJSON_AddItemToObject(o, "args", args);
        bad |= put(f, o, &first);
    }
    for (size_t i = 0; i < t->nev && !bad; i++) {
        const tev *e = &t->ev[i];
        cJSON *o = cJSON_CreateObject(), *args = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", e->name);
        cJSON_AddStringToObject(o, "cat", e->tid >= KB_TRACE_LINK_TID0 ? "link" : "pe");
        cJSON_AddStringToObject(o, "ph", "X");
        cJSON_AddNumberToObject(o, "ts", (double)e->t0 / 1e6);
        cJSON_AddNumberToObject(o, "dur", (double)(e->t1 - e->t0) / 1e6);
        cJSON_AddNumberToObject(o, "pid", e->pid);
        cJSON_AddNumberToObject(o, "tid", e->tid);
        cJSON_AddNumberToObject(args, "bytes", (double)e->bytes);
        cJSON_AddItemToObject(o, "args", args);
        bad |= put(f, o, &first);
    }
    bad |= fputs("\n]}\n", f) < 0;
    return kb_atomic_commit(&af, bad, eb);
}
