/*
 * kb_psim — partitions of a discrete-event run on threads, in conservative windows (API and
 * the ordering argument in kb_psim.h).
 *
 * A window is two phases separated by barriers. Phase A: each thread delivers the messages
 * for its partitions (sorted by time, sender, sender's order) and notes each partition's
 * earliest pending time. Every thread then reads all of them and computes the same decision:
 * stop (an error, a stop code), end (nothing pending) or the window's end, T + lookahead, or
 * the earliest stop-the-world operation's time when that comes first. Phase B: each thread
 * runs its partitions up to the window's end (kb_sim_run_until); then, when the window ended
 * at an operation's time, thread 0 runs the operations due and a third barrier releases the
 * others. The
 * partitions a thread runs are a fixed block of indices, and nothing a thread does depends on
 * another thread's timing, so the run is the same for every thread count. The per-partition
 * results each phase writes live in separate arrays, so that a thread still reading one
 * phase's results never races with a thread writing the next phase's.
 */
#include "kb_psim.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kb_err.h"
#include "kb_wire.h"

typedef struct ps_msg {
    kb_time t;
    uint64_t seq; /* the sender's post count: its order */
    int from;
    kb_event_fn fn;
    void *a, *b;
} ps_msg;

/* Messages from one partition to another, in post order; written by the sender's thread in
 * phase B (or before the run), read and emptied by the receiver's in phase A. */
typedef struct ps_box {
    ps_msg *v;
    size_t n, cap;
} ps_box;

/* A stop-the-world operation asked for by a partition (kb_psim_sync_at); kept in the asking
 * partition's list (its thread's only) until it runs. */
typedef struct ps_sync {
    kb_time t;
    uint64_t seq; /* the asker's request count: its order */
    kb_psim_sync_fn fn;
    void *ud;
} ps_sync;

typedef struct ps_syncs {
    ps_sync *v;
    size_t n, cap;
    uint64_t asked;
} ps_syncs;

/* A message function's codec (kb_psim_codec), for messages between processes. */
typedef struct ps_codec {
    kb_event_fn fn;
    kb_psim_enc_fn enc;
    kb_psim_dec_fn dec;
    void *ud;
} ps_codec;

/* Sense-counting barrier for a fixed number of threads: spins, then yields (the host may run
 * fewer cores than threads). */
typedef struct ps_barrier {
    atomic_uint count, gen;
    unsigned n;
} ps_barrier;

struct kb_psim {
    int nparts, nthreads;
    kb_time look;
    kb_sim **part;
    ps_box *box;        /* box[to * nparts + from] */
    /* sent[to * words + from / 64], bit from % 64: `from` has messages for `to` (set by the
     * sender at its first message of a window, so a receiver looks at its senders only) */
    atomic_ullong *sent;
    size_t words;
    uint64_t *posted;   /* per sender: messages posted (the next seq) */
    /* per partition: phase A's results (delivery error, earliest pending time) and phase B's
     * (run_until's code) */
    int *rc_a, *rc_b, *has, *has_s;
    kb_time *next, *next_s; /* earliest event; earliest operation (phase A's results) */
    ps_syncs *sync;     /* per partition: its pending stop-the-world operations */
    int in_sync;        /* a sync operation is running (on thread 0, every partition still) */
    kb_time sync_t;     /* ... at this time */
    uint64_t syncs;     /* sync operations run so far */
    ps_barrier bar;
    int run_threads;    /* threads of the current run (fewer when one could not start) */
    int result;         /* the run's code, decided identically by every thread */
    atomic_int go;      /* 1: the started threads may begin; -1: they must quit */
    uint64_t windows;
    int running;
    int warm;           /* kb_psim_opts.warm */
    kb_psim_window_fn wfn; /* kb_psim_on_window */
    void *wud;
    int wrc;
    /* several processes (kb_psim_net): this one runs partitions [plo, phi) (all without a
     * net); the exchange after every window fills the arrays above for every partition */
    int has_net;
    kb_psim_net net;
    int plo, phi;
    ps_codec *codec;
    int ncodec;
    uint64_t *blocked;  /* per partition: its blocked fibers, as of the last exchange */
    int xrc;            /* the last exchange's code (thread 0 writes, all read) */
    uint64_t *ev_all, *sw_all, *post_all; /* per partition, gathered as a run ends */
};

typedef struct ps_worker {
    kb_psim *ps;
    int k;
    ps_msg *buf; /* delivery sort buffer, this thread's */
    size_t cap;
} ps_worker;

static void bar_wait(ps_barrier *b)
{
    unsigned g = atomic_load_explicit(&b->gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) + 1 == b->n) {
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->gen, 1, memory_order_release);
        return;
    }
    for (unsigned spin = 0; atomic_load_explicit(&b->gen, memory_order_acquire) == g; spin++)
        if (spin >= 256)
            sched_yield();
}

int kb_psim_create(const kb_psim_opts *o, kb_psim **out)
{
    kb_psim *ps;
    size_t P;

    *out = NULL;
    if (!o || o->parts < 1 || o->threads < 1 || o->lookahead <= 0 ||
        o->parts > KB_PSIM_MAX_PARTS ||
        (o->net && (o->net->nranks < 1 || o->net->rank < 0 || o->net->rank >= o->net->nranks ||
                    !o->net->allgather)))
        return KB_ERR_INVAL;
    if (!(ps = calloc(1, sizeof *ps)))
        return KB_ERR_NOMEM;
    P = (size_t)o->parts;
    ps->nparts = o->parts;
    ps->plo = 0;
    ps->phi = o->parts;
    if (o->net) {
        ps->has_net = 1;
        ps->net = *o->net;
        ps->plo = (int)((int64_t)ps->net.rank * o->parts / ps->net.nranks);
        ps->phi = (int)((int64_t)(ps->net.rank + 1) * o->parts / ps->net.nranks);
    }
    {
        int local = ps->phi - ps->plo;
        ps->nthreads = o->threads < local ? o->threads : local > 0 ? local : 1;
    }
    if (ps->nthreads > KB_PSIM_MAX_THREADS)
        ps->nthreads = KB_PSIM_MAX_THREADS;
    ps->look = o->lookahead;
    ps->warm = o->warm;
    ps->part = calloc(P, sizeof *ps->part);
    ps->box = calloc(P * P, sizeof *ps->box);
    ps->words = (P + 63) / 64;
    ps->sent = calloc(P * ps->words, sizeof *ps->sent); /* zero bits: atomics may be calloc'd */
    ps->posted = calloc(P, sizeof *ps->posted);
    ps->rc_a = calloc(P, sizeof *ps->rc_a);
    ps->rc_b = calloc(P, sizeof *ps->rc_b);
    ps->has = calloc(P, sizeof *ps->has);
    ps->next = calloc(P, sizeof *ps->next);
    ps->sync = calloc(P, sizeof *ps->sync);
    ps->has_s = calloc(P, sizeof *ps->has_s);
    ps->next_s = calloc(P, sizeof *ps->next_s);
    ps->blocked = calloc(P, sizeof *ps->blocked);
    if (!ps->part || !ps->box || !ps->sent || !ps->posted || !ps->rc_a || !ps->rc_b ||
        !ps->has || !ps->next || !ps->sync || !ps->has_s || !ps->next_s || !ps->blocked)
        goto fail;
    if (ps->has_net && (!(ps->ev_all = calloc(P, sizeof *ps->ev_all)) ||
                        !(ps->sw_all = calloc(P, sizeof *ps->sw_all)) ||
                        !(ps->post_all = calloc(P, sizeof *ps->post_all))))
        goto fail;
    for (size_t i = 0; i < P; i++)
        if (!(ps->part[i] = kb_sim_create(o->sim)))
            goto fail;
    *out = ps;
    return 0;
fail:
    kb_psim_destroy(ps);
    return KB_ERR_NOMEM;
}

void kb_psim_destroy(kb_psim *ps)
{
    if (!ps)
        return;
    assert(!ps->running); /* not from inside its own run */
    if (ps->part)
        for (int i = 0; i < ps->nparts; i++)
            kb_sim_destroy(ps->part[i]);
    if (ps->box)
        for (size_t i = 0; i < (size_t)ps->nparts * (size_t)ps->nparts; i++)
            free(ps->box[i].v);
    if (ps->sync)
        for (int i = 0; i < ps->nparts; i++)
            free(ps->sync[i].v);
    free(ps->sync);
    free(ps->part);
    free(ps->box);
    free(ps->sent);
    free(ps->posted);
    free(ps->rc_a);
    free(ps->rc_b);
    free(ps->has);
    free(ps->next);
    free(ps->has_s);
    free(ps->next_s);
    free(ps->blocked);
    free(ps->codec);
    free(ps->ev_all);
    free(ps->sw_all);
    free(ps->post_all);
    free(ps);
}

kb_sim *kb_psim_part(kb_psim *ps, int i)
{
    assert(i >= 0 && i < ps->nparts);
    return ps->part[i];
}

void kb_psim_on_window(kb_psim *ps, kb_psim_window_fn fn, void *ud)
{
    assert(!ps->running);
    ps->wfn = fn;
    ps->wud = ud;
}

int kb_psim_parts(const kb_psim *ps) { return ps->nparts; }
int kb_psim_owns(const kb_psim *ps, int i) { return i >= ps->plo && i < ps->phi; }
int kb_psim_ranks(const kb_psim *ps) { return ps->has_net ? ps->net.nranks : 1; }

int kb_psim_owner(const kb_psim *ps, int i)
{
    int r = 0;
    /* the first rank whose block ends after i (an empty block ends where it starts) */
    while (ps->has_net && (int)((int64_t)(r + 1) * ps->nparts / ps->net.nranks) <= i)
        r++;
    return r;
}

int kb_psim_codec(kb_psim *ps, kb_event_fn fn, kb_psim_enc_fn enc, kb_psim_dec_fn dec,
                  void *ud)
{
    if (!fn || !enc || !dec || ps->running)
        return KB_ERR_INVAL;
    ps_codec *v = realloc(ps->codec, (size_t)(ps->ncodec + 1) * sizeof *v);
    if (!v)
        return KB_ERR_NOMEM;
    ps->codec = v;
    v[ps->ncodec++] = (ps_codec){ fn, enc, dec, ud };
    return 0;
}

/* The codec of fn's messages: its index, or -1. */
static int codec_of(const kb_psim *ps, kb_event_fn fn)
{
    for (int i = 0; i < ps->ncodec; i++)
        if (ps->codec[i].fn == fn)
            return i;
    return -1;
}
int kb_psim_threads(const kb_psim *ps) { return ps->nthreads; }
kb_time kb_psim_lookahead(const kb_psim *ps) { return ps->look; }
uint64_t kb_psim_windows(const kb_psim *ps) { return ps->windows; }
uint64_t kb_psim_syncs(const kb_psim *ps) { return ps->syncs; }

uint64_t kb_psim_part_events(const kb_psim *ps, int i)
{
    return ps->has_net ? ps->ev_all[i] : kb_sim_events(ps->part[i]);
}

uint64_t kb_psim_events(const kb_psim *ps)
{
    uint64_t n = 0;
    for (int i = 0; i < ps->nparts; i++)
        n += kb_psim_part_events(ps, i);
    return n;
}

uint64_t kb_psim_switches(const kb_psim *ps)
{
    uint64_t n = 0;
    for (int i = 0; i < ps->nparts; i++)
        n += ps->has_net ? ps->sw_all[i] : kb_sim_switches(ps->part[i]);
    return n;
}

uint64_t kb_psim_messages(const kb_psim *ps)
{
    uint64_t n = 0;
    for (int i = 0; i < ps->nparts; i++)
        n += ps->has_net ? ps->post_all[i] : ps->posted[i];
    return n;
}

/* Makes room for `need` elements of `size` bytes in the array *v of *cap: doubles it (from
 * 16) as far as needed. 0 or KB_ERR_NOMEM (the array as it was). */
static int grow(void **v, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *nv = realloc(*v, c * size);
    if (!nv)
        return KB_ERR_NOMEM;
    *v = nv;
    *cap = c;
    return 0;
}

int kb_psim_post(kb_psim *ps, int from, int to, kb_time t, kb_event_fn fn, void *a, void *b)
{
    if (from < 0 || from >= ps->nparts || to < 0 || to >= ps->nparts || !fn)
        return KB_ERR_INVAL;
    if (from == to)
        return kb_sim_at(ps->part[to], t, fn, a, b);
    if (ps->has_net && !kb_psim_owns(ps, to) && codec_of(ps, fn) < 0)
        return KB_ERR_INVAL;
    kb_time now = kb_sim_now(ps->part[from]);
    if (t < now || t - now < ps->look)
        return KB_ERR_RANGE;
    ps_box *bx = &ps->box[(size_t)to * (size_t)ps->nparts + (size_t)from];
    if (grow((void **)&bx->v, &bx->cap, bx->n + 1, sizeof *bx->v) != 0)
        return KB_ERR_NOMEM;
    if (bx->n == 0) /* other senders set other bits of the word: atomically */
        atomic_fetch_or_explicit(&ps->sent[(size_t)to * ps->words + (size_t)from / 64],
                                 1ull << (from % 64), memory_order_relaxed);
    assert(bx->n < bx->cap);
    bx->v[bx->n++] = (ps_msg){ t, ps->posted[from]++, from, fn, a, b };
    return 0;
}

int kb_psim_sync_at(kb_psim *ps, int from, kb_time t, kb_psim_sync_fn fn, void *ud)
{
    if (from < 0 || from >= ps->nparts || !fn)
        return KB_ERR_INVAL;
    if (ps->has_net)
        return KB_ERR_STATE;
    if (ps->in_sync) { /* from a sync operation: any later time */
        if (t <= ps->sync_t)
            return KB_ERR_RANGE;
    } else {
        kb_time now = kb_sim_now(ps->part[from]);
        if (t < now || t - now < ps->look)
            return KB_ERR_RANGE;
    }
    ps_syncs *q = &ps->sync[from];
    if (grow((void **)&q->v, &q->cap, q->n + 1, sizeof *q->v) != 0)
        return KB_ERR_NOMEM;
    assert(q->n < q->cap);
    q->v[q->n++] = (ps_sync){ t, q->asked++, fn, ud };
    return 0;
}

/* Partition i's earliest pending operation: 1 and *t, or 0 when it has none. */
static int next_sync(const kb_psim *ps, int i, kb_time *t)
{
    int any = 0;
    for (size_t k = 0; k < ps->sync[i].n; k++)
        if (!any || ps->sync[i].v[k].t < *t) {
            *t = ps->sync[i].v[k].t;
            any = 1;
        }
    return any;
}

/* Thread 0, every partition still at or before t: the operations due at t, partition by
 * partition in request order (an operation may ask for more, at later times). */
static void run_syncs(kb_psim *ps, kb_time t)
{
    ps->in_sync = 1;
    ps->sync_t = t;
    for (int i = 0; i < ps->nparts; i++) {
        ps_syncs *q = &ps->sync[i];
        for (;;) {
            size_t best = q->n;
            for (size_t k = 0; k < q->n; k++)
                if (q->v[k].t == t && (best == q->n || q->v[k].seq < q->v[best].seq))
                    best = k;
            if (best == q->n)
                break;
            ps_sync op = q->v[best];
            q->v[best] = q->v[--q->n]; /* order is kept by seq, not by place */
            ps->syncs++;
            op.fn(ps, t, op.ud);
        }
    }
    ps->in_sync = 0;
}

static int msg_cmp(const void *x, const void *y)
{
    const ps_msg *p = x, *q = y;
    if (p->t != q->t)
        return p->t < q->t ? -1 : 1;
    if (p->from != q->from)
        return p->from < q->from ? -1 : 1;
    return p->seq < q->seq ? -1 : p->seq > q->seq;
}

/* Phase A for partition `to`: its messages scheduled in (time, sender, order). */
static int deliver(ps_worker *w, int to)
{
    kb_psim *ps = w->ps;
    ps_box *row = &ps->box[(size_t)to * (size_t)ps->nparts];
    atomic_ullong *bits = &ps->sent[(size_t)to * ps->words];
    size_t m = 0;
    for (size_t wd = 0; wd < ps->words; wd++) {
        /* the barrier ordered the senders' writes before this: relaxed is enough */
        uint64_t b = atomic_exchange_explicit(&bits[wd], 0, memory_order_relaxed);
        for (; b; b &= b - 1) {
            ps_box *bx = &row[wd * 64 + (size_t)__builtin_ctzll(b)];
            if (grow((void **)&w->buf, &w->cap, m + bx->n, sizeof *w->buf) != 0)
                return KB_ERR_NOMEM;
            memcpy(w->buf + m, bx->v, bx->n * sizeof *w->buf);
            m += bx->n;
            bx->n = 0;
        }
    }
    if (m == 0)
        return 0;
    qsort(w->buf, m, sizeof *w->buf, msg_cmp);
    for (size_t i = 0; i < m; i++) {
        /* a message is posted at least the lookahead ahead, so past this window's end */
        assert(w->buf[i].t >= kb_sim_now(ps->part[to]));
        int rc = kb_sim_at(ps->part[to], w->buf[i].t, w->buf[i].fn, w->buf[i].a, w->buf[i].b);
        /* t >= the window's end > the receiver's clock: only memory can fail */
        assert(rc == 0 || rc == KB_ERR_NOMEM);
        if (rc)
            return rc;
    }
    return 0;
}

/* The first nonzero code in index order, or 0. */
static int first_rc(const int *rc, int n)
{
    for (int i = 0; i < n; i++)
        if (rc[i])
            return rc[i];
    return 0;
}

/* The j-th partition of [lo, hi) a thread takes in a window: forward in one window, backward in
 * the next. A thread's last partitions of a window are its first of the next, while their
 * events, fibers and resources may still be in its caches (one thread over 32 SIPs cycles
 * through far more than its L2 each window). Any order gives the same run: a window's
 * partitions only post into boxes that the next delivery sorts. */
static int serp(int lo, int hi, unsigned window, int j)
{
    return window & 1u ? hi - 1 - j : lo + j;
}

/* Runs the j-th partition of [lo, hi) in window `win` up to `end`, warming the one after it
 * (kb_psim_opts.warm; a window's last is the next window's first, warm already). */
static int run_part(kb_psim *ps, int lo, int hi, unsigned win, int j, kb_time end)
{
    kb_sim *s = ps->part[serp(lo, hi, win, j)];

    if (ps->warm && j + 1 < hi - lo)
        kb_sim_warm_next(s, ps->part[serp(lo, hi, win, j + 1)]);
    return kb_sim_run_until(s, end);
}

/* One thread's share of the run: partitions [lo, hi). Returns when the run is decided. */
static void work(ps_worker *w)
{
    kb_psim *ps = w->ps;
    int T = ps->run_threads, P = ps->nparts;
    int lo = (int)((int64_t)w->k * P / T), hi = (int)((int64_t)(w->k + 1) * P / T);
    assert(!ps->has_net);
    assert(T >= 1 && T <= P && lo < hi); /* every thread has a partition */
    for (unsigned win = 0;; win++) {
        for (int j = 0; j < hi - lo; j++) {
            int i = serp(lo, hi, win, j);
            ps->rc_a[i] = deliver(w, i);
            ps->has[i] = kb_sim_next(ps->part[i], &ps->next[i]);
            ps->has_s[i] = next_sync(ps, i, &ps->next_s[i]);
        }
        bar_wait(&ps->bar);
        int rc = first_rc(ps->rc_a, P), any = 0;
        kb_time tmin = KB_TIME_MAX, ts = KB_TIME_MAX;
        int sync = 0;
        for (int i = 0; i < P; i++) {
            if (ps->has[i] && (!any || ps->next[i] < tmin)) {
                tmin = ps->next[i];
                any = 1;
            }
            if (ps->has_s[i] && (!sync || ps->next_s[i] < ts)) {
                ts = ps->next_s[i];
                sync = 1;
            }
        }
        if (rc || (!any && !sync)) {
            if (w->k == 0) {
                size_t blocked = 0;
                for (int i = 0; i < P; i++)
                    blocked += kb_sim_blocked(ps->part[i]);
                ps->result = rc ? rc : blocked ? KB_ERR_DEADLOCK : 0;
            }
            return;
        }
        kb_time end = tmin > KB_TIME_MAX - ps->look ? KB_TIME_MAX : tmin + ps->look;
        if (!any || (sync && ts < end)) /* a sync ends the window at its time */
            end = ts;
        if (w->k == 0)
            ps->windows++;
        for (int j = 0; j < hi - lo; j++) {
            ps->rc_b[serp(lo, hi, win, j)] = run_part(ps, lo, hi, win, j, end);
        }
        bar_wait(&ps->bar);
        if ((rc = first_rc(ps->rc_b, P)) != 0) {
            if (w->k == 0)
                ps->result = rc;
            return;
        }
        if (ps->wfn) { /* every partition still: the window's hook */
            if (w->k == 0)
                ps->wrc = ps->wfn(ps, end, ps->wud);
            bar_wait(&ps->bar);
            if (ps->wrc) {
                if (w->k == 0)
                    ps->result = ps->wrc;
                return;
            }
        }
        if (sync && end == ts) { /* every partition has fired what comes before ts */
            if (w->k == 0)
                run_syncs(ps, ts);
            bar_wait(&ps->bar);
        }
    }
}

/* ---- several processes (kb_psim_net) ---- */

/* The start of process r's block of partitions. */
static int block_lo(const kb_psim *ps, int r)
{
    return (int)((int64_t)r * ps->nparts / ps->net.nranks);
}

/*
 * Thread 0, every partition still (after a window, or before the first): hands every process
 * this one's partitions' state (code, earliest pending event or undelivered message, blocked
 * fibers) and its messages to other processes' partitions, then reads everybody's: the state of
 * every partition, the messages for this process's partitions put in their boxes, and the
 * earliest message time of every partition wherever it runs. Every process ends with the same
 * arrays, so decides alike. `wrc` is this process's window hook's code. 0 or an error (which
 * every process then sees or itself meets in the collective).
 */
static int exchange(kb_psim *ps, int wrc)
{
    kb_wire w;
    void *all = NULL;
    size_t *counts = NULL;
    uint8_t buf[KB_PSIM_WIRE_MAX];
    int rc = 0, R = ps->net.nranks, P = ps->nparts;

    kb_wire_init(&w);
    kb_wire_u32(&w, (uint32_t)wrc);
    for (int i = ps->plo; i < ps->phi; i++) {
        kb_time t = 0;
        int has = kb_sim_next(ps->part[i], &t);
        for (int f = 0; f < P; f++) { /* from this process's partitions, not yet delivered */
            const ps_box *bx = &ps->box[(size_t)i * (size_t)P + (size_t)f];
            for (size_t k = 0; k < bx->n; k++)
                if (!has || bx->v[k].t < t) {
                    t = bx->v[k].t;
                    has = 1;
                }
        }
        kb_wire_u32(&w, (uint32_t)ps->rc_b[i]);
        kb_wire_u32(&w, (uint32_t)has);
        kb_wire_u64(&w, t);
        kb_wire_u64(&w, kb_sim_blocked(ps->part[i]));
    }
    for (int to = 0; to < P; to++) {
        if (kb_psim_owns(ps, to))
            continue;
        for (int f = ps->plo; f < ps->phi; f++) {
            ps_box *bx = &ps->box[(size_t)to * (size_t)P + (size_t)f];
            for (size_t k = 0; k < bx->n; k++) {
                const ps_msg *m = &bx->v[k];
                int c = codec_of(ps, m->fn); /* kb_psim_post refused a message without one */
                assert(c >= 0);
                size_t n = ps->codec[c].enc(ps->codec[c].ud, m->a, m->b, buf);
                assert(n <= sizeof buf);
                kb_wire_u32(&w, (uint32_t)to);
                kb_wire_u32(&w, (uint32_t)f);
                kb_wire_u64(&w, m->t);
                kb_wire_u64(&w, m->seq);
                kb_wire_u32(&w, (uint32_t)c);
                kb_wire_u32(&w, (uint32_t)n);
                kb_wire_put(&w, buf, n);
            }
            bx->n = 0;
        }
    }
    kb_wire_u32(&w, UINT32_MAX); /* the end of the messages */
    if ((rc = kb_wire_ok(&w)) != 0)
        goto done;
    if (!(counts = calloc((size_t)R, sizeof *counts))) {
        rc = KB_ERR_NOMEM;
        goto done;
    }
    if ((rc = ps->net.allgather(ps->net.ud, w.p, w.n, &all, counts)) != 0)
        goto done;
    /* two passes: every partition's own state first, then every message's time on top */
    ps->wrc = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        size_t off = 0;
        for (int r = 0; r < R && rc == 0; r++) {
            kb_wire_rd rd;
            int lo = block_lo(ps, r), hi = block_lo(ps, r + 1);
            kb_wire_rd_init(&rd, (const uint8_t *)all + off, counts[r]);
            off += counts[r];
            uint32_t their_wrc = kb_wire_get_u32(&rd);
            if (pass == 0 && their_wrc && !ps->wrc)
                ps->wrc = (int)their_wrc;
            for (int i = lo; i < hi; i++) {
                int prc = (int)kb_wire_get_u32(&rd), has = (int)kb_wire_get_u32(&rd);
                kb_time t = kb_wire_get_u64(&rd);
                uint64_t blk = kb_wire_get_u64(&rd);
                if (pass == 0) {
                    ps->rc_b[i] = prc;
                    ps->has[i] = has;
                    ps->next[i] = t;
                    ps->blocked[i] = blk;
                }
            }
            for (;;) {
                uint32_t to = kb_wire_get_u32(&rd);
                if (to == UINT32_MAX || !kb_wire_rd_ok(&rd))
                    break;
                uint32_t from = kb_wire_get_u32(&rd);
                kb_time t = kb_wire_get_u64(&rd);
                uint64_t seq = kb_wire_get_u64(&rd);
                uint32_t c = kb_wire_get_u32(&rd), n = kb_wire_get_u32(&rd);
                if (to >= (uint32_t)P || from >= (uint32_t)P || c >= (uint32_t)ps->ncodec ||
                    n > sizeof buf) {
                    rc = KB_ERR_STATE;
                    break;
                }
                kb_wire_get(&rd, buf, n);
                if (pass == 0)
                    continue;
                if (!ps->has[to] || t < ps->next[to]) {
                    ps->next[to] = t;
                    ps->has[to] = 1;
                }
                if (!kb_psim_owns(ps, (int)to))
                    continue;
                ps_box *bx = &ps->box[(size_t)to * (size_t)P + from];
                ps_msg m = { t, seq, (int)from, ps->codec[c].fn, NULL, NULL };
                if ((rc = ps->codec[c].dec(ps->codec[c].ud, ps->part[to], buf, n, &m.a,
                                           &m.b)) != 0 ||
                    (rc = grow((void **)&bx->v, &bx->cap, bx->n + 1, sizeof *bx->v)) != 0)
                    break;
                if (bx->n == 0)
                    atomic_fetch_or_explicit(&ps->sent[(size_t)to * ps->words + from / 64],
                                             1ull << (from % 64), memory_order_relaxed);
                bx->v[bx->n++] = m;
            }
            if (rc == 0 && !kb_wire_rd_ok(&rd))
                rc = KB_ERR_STATE; /* a short blob: the processes do not run the same run */
        }
    }
done:
    free(all);
    free(counts);
    kb_wire_free(&w);
    return rc;
}

/* One thread's share of a run over several processes: this process's partitions [plo, phi)
 * split between its threads; thread 0 makes the exchanges. */
static void work_net(ps_worker *w)
{
    kb_psim *ps = w->ps;
    int T = ps->run_threads, P = ps->nparts, L = ps->phi - ps->plo;
    int lo = ps->plo + (int)((int64_t)w->k * L / T);
    int hi = ps->plo + (int)((int64_t)(w->k + 1) * L / T);
    if (w->k == 0)
        ps->xrc = exchange(ps, 0);
    bar_wait(&ps->bar);
    for (unsigned win = 0;; win++) {
        int rc = ps->xrc ? ps->xrc : first_rc(ps->rc_b, P), any = 0;
        kb_time tmin = KB_TIME_MAX;
        if (!rc)
            rc = ps->wrc;
        for (int i = 0; i < P; i++)
            if (ps->has[i] && (!any || ps->next[i] < tmin)) {
                tmin = ps->next[i];
                any = 1;
            }
        if (rc || !any) {
            if (w->k == 0) {
                uint64_t blocked = 0;
                for (int i = 0; i < P; i++)
                    blocked += ps->blocked[i];
                ps->result = rc ? rc : blocked ? KB_ERR_DEADLOCK : 0;
            }
            return;
        }
        kb_time end = tmin > KB_TIME_MAX - ps->look ? KB_TIME_MAX : tmin + ps->look;
        if (w->k == 0)
            ps->windows++;
        bar_wait(&ps->bar); /* everyone has read the exchange's arrays */
        /* every delivery before any run: a run posts into other partitions' boxes */
        for (int j = 0; j < hi - lo; j++) {
            int i = serp(lo, hi, win, j);
            ps->rc_a[i] = deliver(w, i);
        }
        bar_wait(&ps->bar);
        for (int j = 0; j < hi - lo; j++) {
            int i = serp(lo, hi, win, j);
            ps->rc_b[i] = ps->rc_a[i] ? ps->rc_a[i] : run_part(ps, lo, hi, win, j, end);
        }
        bar_wait(&ps->bar);
        if (w->k == 0)
            ps->xrc = exchange(ps, ps->wfn ? ps->wfn(ps, end, ps->wud) : 0);
        bar_wait(&ps->bar);
    }
}

/* As a run over several processes ends: every partition's events, switches and posts. */
static int gather_counts(kb_psim *ps)
{
    kb_wire w;
    void *all = NULL;
    size_t *counts = calloc((size_t)ps->net.nranks, sizeof *counts);
    int rc;
    kb_wire_init(&w);
    for (int i = ps->plo; i < ps->phi; i++) {
        kb_wire_u64(&w, kb_sim_events(ps->part[i]));
        kb_wire_u64(&w, kb_sim_switches(ps->part[i]));
        kb_wire_u64(&w, ps->posted[i]);
    }
    rc = counts ? kb_wire_ok(&w) : KB_ERR_NOMEM;
    if (rc == 0)
        rc = ps->net.allgather(ps->net.ud, w.p, w.n, &all, counts);
    if (rc == 0) {
        kb_wire_rd rd;
        size_t total = 0;
        for (int r = 0; r < ps->net.nranks; r++)
            total += counts[r];
        kb_wire_rd_init(&rd, all, total);
        for (int i = 0; i < ps->nparts; i++) {
            ps->ev_all[i] = kb_wire_get_u64(&rd);
            ps->sw_all[i] = kb_wire_get_u64(&rd);
            ps->post_all[i] = kb_wire_get_u64(&rd);
        }
        if (!kb_wire_rd_ok(&rd) || !kb_wire_rd_done(&rd))
            rc = KB_ERR_STATE;
    }
    free(all);
    free(counts);
    kb_wire_free(&w);
    return rc;
}

static void *thread_main(void *arg)
{
    ps_worker *w = arg;
    int g;
    while ((g = atomic_load_explicit(&w->ps->go, memory_order_acquire)) == 0)
        sched_yield();
    if (g > 0) {
        if (w->ps->has_net)
            work_net(w);
        else
            work(w);
    }
    return NULL;
}

int kb_psim_run(kb_psim *ps)
{
    int T = ps->nthreads, started = 1, rc;
    pthread_t th[KB_PSIM_MAX_THREADS];
    ps_worker *ws;

    if (ps->running)
        return KB_ERR_STATE;
    if (!(ws = calloc((size_t)T, sizeof *ws)))
        return KB_ERR_NOMEM;
    ps->running = 1;
    atomic_store(&ps->go, 0);
    for (int k = 0; k < T; k++) {
        ws[k].ps = ps;
        ws[k].k = k;
    }
    /* a thread that cannot start leaves its partitions to the others: the blocks change,
     * the result does not */
    for (int k = 1; k < T && started == k; k++)
        if (pthread_create(&th[k], NULL, thread_main, &ws[k]) == 0)
            started++;
    assert(started >= 1 && started <= T);
    ps->run_threads = started;
    ps->bar.n = (unsigned)started;
    atomic_store(&ps->bar.count, 0);
    ps->result = 0;
    ps->wrc = 0;
    memset(ps->rc_b, 0, (size_t)ps->nparts * sizeof *ps->rc_b);
    atomic_store_explicit(&ps->go, 1, memory_order_release);
    if (ps->has_net)
        work_net(&ws[0]);
    else
        work(&ws[0]);
    for (int k = 1; k < started; k++)
        pthread_join(th[k], NULL);
    rc = ps->result;
    if (ps->has_net) { /* collective, so after any result: every process calls it */
        int grc = gather_counts(ps);
        if (rc == 0)
            rc = grc;
    }
    for (int k = 0; k < T; k++)
        free(ws[k].buf);
    free(ws);
    ps->running = 0;
    return rc;
}
