/*
 * test_psim — kb_psim: a PHOLD model (entities spread over partitions pass events to random
 * entities, with ties at equal times inside and across partitions) gives the same per-entity
 * digests, events, messages and windows for every thread count, with and without
 * stop-the-world snapshots; messages and operations earlier than the lookahead are refused;
 * stop codes, deadlocks and fibers woken from another partition.
 * Handlers only record; assertions run outside the run.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kb_err.h"
#include "kb_psim.h"
#include "kb_test_net.h"

#define LOOK 5000 /* ps */

/* ---------------------------------------------------------------- PHOLD */

typedef struct phold phold;
typedef struct ent {
    phold *w;
    int id, part;
    uint64_t rng, hash;
    long count;
} ent;

struct phold {
    kb_psim *ps;
    ent *e;
    int n, per;        /* entities, per partition */
    long limit;        /* hops of every starting event */
    long stop_at;      /* entity 0 stops its partition at this count (0: never) */
    int errors;        /* posts refused (must stay 0) */
    /* stop-the-world snapshots every `every` ps (0: none): the digest of every entity so far,
     * and any partition seen with an event due before the snapshot's time (must stay 0) */
    kb_time every;
    uint64_t snap[64];
    int nsnap, early, kicks;
    /* the window hook (0: none; else the call that returns 9, or -1: none does): its calls,
     * and the entities' digest at every window's end folded in call order */
    int hook_stop, hooks;
    uint64_t hook_digest;
};

static uint64_t draw(ent *e)
{
    e->rng ^= e->rng << 13;
    e->rng ^= e->rng >> 7;
    e->rng ^= e->rng << 17;
    return e->rng;
}

/* b: the hops the event has left; at 0 it is absorbed */
static void phold_ev(kb_sim *sim, void *a, void *b)
{
    ent *e = a;
    phold *w = e->w;
    kb_time now = kb_sim_now(sim);
    long hops = (long)(intptr_t)b;
    /* the digest depends on the order of the entity's events, ties included */
    e->hash = (e->hash ^ (uint64_t)now ^ ((uint64_t)hops << 40)) * 0x100000001b3ull;
    e->count++;
    if (w->stop_at && e->id == 0 && e->count == w->stop_at)
        kb_sim_stop(sim, 7);
    if (hops == 0)
        return;
    uint64_t r = draw(e);
    ent *to = &w->e[r % (uint64_t)w->n];
    /* delays on a 1 ns grid, so that events meet at equal times */
    kb_time dt = (kb_time)((r >> 32) % 4) * 1000;
    if (to->part != e->part)
        dt += LOOK;
    if (kb_psim_post(w->ps, e->part, to->part, now + dt, phold_ev, to,
                     (void *)(intptr_t)(hops - 1)) != 0)
        w->errors++;
}

typedef struct result {
    uint64_t digest, events, messages, windows, syncs, snap[64];
    int rc, nsnap;
} result;

/* A snapshot: every partition stands still with nothing due before t; the entities' digests
 * folded in entity order; then a new starting event for entity 0 (as a host's launch would
 * touch a SIP), and the next snapshot. */
static void snapshot(kb_psim *ps, kb_time t, void *ud)
{
    phold *w = ud;
    uint64_t d = 0;
    for (int i = 0; i < kb_psim_parts(ps); i++) {
        kb_time nx;
        if ((kb_sim_next(kb_psim_part(ps, i), &nx) && nx < t) || kb_sim_now(kb_psim_part(ps, i)) > t)
            w->early++;
    }
    for (int i = 0; i < w->n; i++)
        d = (d ^ w->e[i].hash ^ (uint64_t)w->e[i].count) * 0x100000001b3ull;
    if (w->nsnap < 64)
        w->snap[w->nsnap++] = d;
    if (w->kicks++ < 8 && kb_sim_at(kb_psim_part(ps, 0), t, phold_ev, &w->e[0],
                                     (void *)(intptr_t)w->limit) != 0)
        w->errors++;
    if (w->nsnap < 64 && kb_psim_sync_at(ps, 0, t + w->every, snapshot, w) != 0)
        w->errors++;
}

/* After every window: every partition still, nothing due before t, no clock past it. */
static int window_hook(kb_psim *ps, kb_time t, void *ud)
{
    phold *w = ud;
    for (int i = 0; i < kb_psim_parts(ps); i++) {
        kb_time nx;
        if ((kb_sim_next(kb_psim_part(ps, i), &nx) && nx < t) || kb_sim_now(kb_psim_part(ps, i)) >= t)
            w->early++;
    }
    for (int i = 0; i < w->n; i++)
        w->hook_digest = (w->hook_digest ^ w->e[i].hash ^ (uint64_t)t) * 0x100000001b3ull;
    return ++w->hooks == w->hook_stop ? 9 : 0;
}

/* Entity i, spread over `parts` partitions. */
static void ent_init(phold *w, int i, int parts)
{
    ent *e = &w->e[i];
    e->w = w;
    e->id = i;
    e->part = i % parts;
    e->rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    e->hash = 0xcbf29ce484222325ull;
}

/* Its two starting events, the second at a time another entity also uses: 0 or kb_sim_at's
 * code. */
static int ent_start(phold *w, ent *e, long limit)
{
    int rc = kb_sim_at(kb_psim_part(w->ps, e->part), (kb_time)(e->id % 5) * 1000, phold_ev, e,
                       (void *)(intptr_t)limit);
    return rc ? rc : kb_sim_at(kb_psim_part(w->ps, e->part), 3000, phold_ev, e,
                               (void *)(intptr_t)limit);
}

static result run_phold_every(int parts, int per, int threads, long limit, long stop_at,
                              kb_time every, phold *hook)
{
    phold w = { 0 };
    result res = { 0 };
    kb_psim_opts o = { .parts = parts, .threads = threads, .lookahead = LOOK };
    assert_int_equal(kb_psim_create(&o, &w.ps), 0);
    w.n = parts * per;
    w.per = per;
    w.limit = limit;
    w.stop_at = stop_at;
    w.e = calloc((size_t)w.n, sizeof *w.e);
    assert_non_null(w.e);
    for (int i = 0; i < w.n; i++) {
        ent_init(&w, i, parts);
        assert_int_equal(ent_start(&w, &w.e[i], limit), 0);
    }
    w.every = every;
    if (hook) {
        w.hook_stop = hook->hook_stop;
        kb_psim_on_window(w.ps, window_hook, &w);
    }
    if (every)
        assert_int_equal(kb_psim_sync_at(w.ps, 0, every, snapshot, &w), 0);
    res.rc = kb_psim_run(w.ps);
    assert_int_equal(w.errors, 0);
    assert_int_equal(w.early, 0);
    res.nsnap = w.nsnap;
    memcpy(res.snap, w.snap, sizeof res.snap);
    res.syncs = kb_psim_syncs(w.ps);
    for (int i = 0; i < w.n; i++)
        res.digest = (res.digest ^ w.e[i].hash ^ (uint64_t)w.e[i].count) * 0x100000001b3ull;
    res.events = kb_psim_events(w.ps);
    res.messages = kb_psim_messages(w.ps);
    res.windows = kb_psim_windows(w.ps);
    if (hook) {
        hook->hooks = w.hooks;
        hook->hook_digest = w.hook_digest;
    }
    kb_psim_destroy(w.ps);
    free(w.e);
    return res;
}

static result run_phold(int parts, int per, int threads, long limit, long stop_at)
{
    return run_phold_every(parts, per, threads, limit, stop_at, 0, NULL);
}

/* Threads 1, 2, 3, 4, 8 and 64 over 8 partitions: the same run; and the closed form of the
 * event count (2n starting events of limit hops: each fires limit + 1 times). */
static void test_phold_threads(void **state)
{
    (void)state;
    const int parts = 8, per = 16;
    const long limit = 300;
    result r1 = run_phold(parts, per, 1, limit, 0);
    assert_int_equal(r1.rc, 0);
    assert_int_equal(r1.events, 2u * (uint64_t)(parts * per) * (uint64_t)(limit + 1));
    assert_true(r1.messages > 0 && r1.windows > 1);
    const int th[] = { 2, 3, 4, 8, 64 };
    for (size_t k = 0; k < sizeof th / sizeof th[0]; k++) {
        result r = run_phold(parts, per, th[k], limit, 0);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.digest, r1.digest);
        assert_int_equal(r.events, r1.events);
        assert_int_equal(r.messages, r1.messages);
        assert_int_equal(r.windows, r1.windows);
    }
    /* one partition: no messages, one window per lookahead of events at most */
    result one = run_phold(1, 64, 4, 50, 0);
    assert_int_equal(one.rc, 0);
    assert_int_equal(one.messages, 0);
    assert_int_equal(one.events, 2u * 64u * 51u);
}

/* A stop ends the run after the window it happened in, with its code, the same everywhere. */
static void test_phold_stop(void **state)
{
    (void)state;
    result r1 = run_phold(4, 8, 1, 500, 100);
    assert_int_equal(r1.rc, 7);
    assert_true(r1.events < 2u * 32u * 501u);
    for (int t = 2; t <= 4; t++) {
        result r = run_phold(4, 8, t, 500, 100);
        assert_int_equal(r.rc, 7);
        assert_int_equal(r.digest, r1.digest);
        assert_int_equal(r.events, r1.events);
    }
}

/* Stop-the-world snapshots every 7 ns (the lookahead is 5): each sees every partition
 * still, with nothing due before it, and adds an event (8 in all); the snapshots' digests,
 * the events and the windows are the same for every thread count, and the event count is
 * the closed form plus the 8 added tokens' hops. */
static void test_phold_syncs(void **state)
{
    (void)state;
    const long limit = 200;
    result r1 = run_phold_every(8, 16, 1, limit, 0, 7000, NULL);
    assert_int_equal(r1.rc, 0);
    assert_int_equal(r1.events, (2u * 128u + 8u) * (uint64_t)(limit + 1));
    assert_int_equal(r1.nsnap, 64);
    assert_int_equal(r1.syncs, 64);
    assert_true(r1.snap[0] != r1.snap[63]);
    for (int t = 2; t <= 8; t *= 2) {
        result r = run_phold_every(8, 16, t, limit, 0, 7000, NULL);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.digest, r1.digest);
        assert_int_equal(r.events, r1.events);
        assert_int_equal(r.windows, r1.windows);
        assert_int_equal(r.nsnap, r1.nsnap);
        assert_memory_equal(r.snap, r1.snap, sizeof r.snap);
    }
}

/* ---------------------------------------------------------------- several processes */

/* phold_ev's message between processes: the entity's id and the hops left. */
static size_t phold_enc(void *ud, void *a, void *b, uint8_t *buf)
{
    const ent *e = a;
    int64_t v[2] = { e->id, (int64_t)(intptr_t)b };
    (void)ud;
    memcpy(buf, v, sizeof v);
    return sizeof v;
}

static int phold_dec(void *ud, kb_sim *to, const uint8_t *buf, size_t n, void **a, void **b)
{
    phold *w = ud;
    int64_t v[2];
    (void)to;
    if (n != sizeof v)
        return KB_ERR_STATE;
    memcpy(v, buf, sizeof v);
    if (v[0] < 0 || v[0] >= w->n)
        return KB_ERR_STATE;
    *a = &w->e[v[0]];
    *b = (void *)(intptr_t)v[1];
    return 0;
}

/*
 * The PHOLD run over the processes of `net` (no cmocka in here: children run it too): every
 * process starts its own partitions' entities, the run goes, and the entities' hashes are
 * gathered so that every process computes the whole digest. rc -100 on a broken harness.
 */
static result run_phold_net(kbt_net *net, int parts, int per, int threads, long limit,
                            long stop_at, phold *hook)
{
    phold w = { 0 };
    result res = { 0 };
    kb_psim_net pn = { net->rank, net->nranks, kbt_net_allgather, net };
    kb_psim_opts o = { .parts = parts, .threads = threads, .lookahead = LOOK, .net = &pn };
    res.rc = -100;
    if (kb_psim_create(&o, &w.ps) != 0)
        return res;
    w.n = parts * per;
    w.per = per;
    w.limit = limit;
    w.stop_at = stop_at;
    if (!(w.e = calloc((size_t)w.n, sizeof *w.e)) ||
        kb_psim_codec(w.ps, phold_ev, phold_enc, phold_dec, &w) != 0)
        goto out;
    for (int i = 0; i < w.n; i++) {
        ent_init(&w, i, parts);
        if (kb_psim_owns(w.ps, w.e[i].part) && ent_start(&w, &w.e[i], limit) != 0)
            goto out;
    }
    if (hook) {
        w.hook_stop = hook->hook_stop;
        kb_psim_on_window(w.ps, window_hook, &w);
    }
    int rc = kb_psim_run(w.ps);
    /* every entity's hash and count from the process that ran it */
    uint64_t *mine = calloc((size_t)w.n * 2, sizeof *mine);
    size_t counts[KBT_NET_MAX];
    void *all = NULL;
    if (!mine)
        goto out;
    for (int i = 0; i < w.n; i++)
        if (kb_psim_owns(w.ps, w.e[i].part)) {
            mine[2 * i] = w.e[i].hash;
            mine[2 * i + 1] = (uint64_t)w.e[i].count;
        }
    if (kbt_net_allgather(net, mine, (size_t)w.n * 2 * sizeof *mine, &all, counts) == 0) {
        const uint64_t *v = all;
        for (int i = 0; i < w.n; i++) {
            int r = kb_psim_owner(w.ps, w.e[i].part);
            const uint64_t *x = v + (size_t)r * (size_t)w.n * 2 + 2 * (size_t)i;
            res.digest = (res.digest ^ x[0] ^ x[1]) * 0x100000001b3ull;
        }
        res.rc = rc;
        res.events = kb_psim_events(w.ps);
        res.messages = kb_psim_messages(w.ps);
        res.windows = kb_psim_windows(w.ps);
        if (w.errors || w.early)
            res.rc = -101;
    }
    if (hook)
        hook->hooks = w.hooks;
    free(all);
    free(mine);
out:
    kb_psim_destroy(w.ps);
    free(w.e);
    return res;
}

/* The same runs over 1, 2 and 3 processes (forked here, as mpirun would start them), with 1
 * and 2 threads each: every process ends with the one-process run's digest, events, messages and
 * windows; a stop's code reaches every process; the window hook runs on every process once per
 * window. */
static void test_phold_processes(void **state)
{
    (void)state;
    const int parts = 8, per = 16;
    const long limit = 300;
    result r1 = run_phold(parts, per, 1, limit, 0);
    result s1 = run_phold(4, 8, 1, 500, 100);
    phold h1 = { .hook_stop = -1 };
    (void)run_phold_every(parts, per, 1, limit, 0, 0, &h1);
    for (int ranks = 1; ranks <= 3; ranks++)
        for (int th = 1; th <= 2; th++) {
            kbt_net net;
            assert_int_equal(kbt_net_start(&net, ranks), 0);
            phold h = { .hook_stop = -1 };
            result r = run_phold_net(&net, parts, per, th, limit, 0, &h);
            result s = run_phold_net(&net, 4, 8, th, 500, 100, NULL);
            int ok = r.rc == 0 && r.digest == r1.digest && r.events == r1.events &&
                     r.messages == r1.messages && r.windows == r1.windows &&
                     h.hooks == h1.hooks && s.rc == 7 && s.digest == s1.digest &&
                     s.events == s1.events;
            if (net.rank != 0)
                kbt_net_finish(&net, ok ? 0 : 1);
            assert_int_equal(r.rc, 0);
            assert_int_equal(r.digest, r1.digest);
            assert_int_equal(r.events, r1.events);
            assert_int_equal(r.messages, r1.messages);
            assert_int_equal(r.windows, r1.windows);
            assert_int_equal(h.hooks, h1.hooks);
            assert_int_equal(s.rc, 7);
            assert_int_equal(s.digest, s1.digest);
            assert_int_equal(s.events, s1.events);
            assert_int_equal(kbt_net_finish(&net, 0), 0);
        }
}

/* ---------------------------------------------------------------- refusals */

typedef struct early {
    kb_psim *ps;
    int rc[8];
    kb_time ran_at;
} early;

static void noop_sync(kb_psim *ps, kb_time t, void *ud)
{
    (void)ps;
    (void)t;
    (void)ud;
}

/* A sync may ask for a later one, not for one at its own time. */
static void early_sync(kb_psim *ps, kb_time t, void *ud)
{
    early *e = ud;
    e->ran_at = t;
    e->rc[6] = kb_psim_sync_at(ps, 1, t, early_sync, e);
    e->rc[7] = kb_psim_sync_at(ps, 1, t + 1, noop_sync, NULL);
}

static void noop_ev(kb_sim *sim, void *a, void *b)
{
    (void)sim;
    (void)a;
    (void)b;
}

static void early_ev(kb_sim *sim, void *a, void *b)
{
    early *e = a;
    kb_time now = kb_sim_now(sim);
    (void)b;
    e->rc[0] = kb_psim_post(e->ps, 0, 1, now + LOOK - 1, noop_ev, NULL, NULL);
    e->rc[1] = kb_psim_post(e->ps, 0, 1, now + LOOK, noop_ev, NULL, NULL);
    e->rc[2] = kb_psim_post(e->ps, 0, 2, now + LOOK, noop_ev, NULL, NULL);
    e->rc[3] = kb_psim_post(e->ps, 0, 0, now, noop_ev, NULL, NULL); /* local: no lookahead */
    e->rc[4] = kb_psim_sync_at(e->ps, 0, now + LOOK - 1, early_sync, e);
    e->rc[5] = kb_psim_sync_at(e->ps, 0, now + LOOK, early_sync, e);
}

static void test_post_refusals(void **state)
{
    kb_psim *ps = NULL;
    early e = { 0 };
    (void)state;
    assert_int_equal(kb_psim_create(&(kb_psim_opts){ .parts = 0, .threads = 1, .lookahead = 1 },
                                    &ps), KB_ERR_INVAL);
    assert_null(ps);
    assert_int_equal(kb_psim_create(&(kb_psim_opts){ .parts = 2, .threads = 1, .lookahead = 0 },
                                    &ps), KB_ERR_INVAL);
    assert_int_equal(kb_psim_create(&(kb_psim_opts){ .parts = 2, .threads = 4, .lookahead = LOOK },
                                    &ps), 0);
    assert_int_equal(kb_psim_threads(ps), 2);
    assert_int_equal(kb_psim_lookahead(ps), LOOK);
    e.ps = ps;
    assert_int_equal(kb_sim_at(kb_psim_part(ps, 0), 100, early_ev, &e, NULL), 0);
    assert_int_equal(kb_psim_run(ps), 0);
    assert_int_equal(e.rc[0], KB_ERR_RANGE);
    assert_int_equal(e.rc[1], 0);
    assert_int_equal(e.rc[2], KB_ERR_INVAL);
    assert_int_equal(e.rc[3], 0);
    assert_int_equal(e.rc[4], KB_ERR_RANGE);
    assert_int_equal(e.rc[5], 0);
    assert_int_equal(e.rc[6], KB_ERR_RANGE);
    assert_int_equal(e.rc[7], 0);
    assert_int_equal(e.ran_at, 100 + LOOK);
    assert_int_equal(kb_psim_syncs(ps), 2);
    assert_int_equal(kb_psim_messages(ps), 1);
    assert_int_equal(kb_psim_events(ps), 3); /* early_ev, the local noop, the delivered one */
    assert_int_equal(kb_sim_now(kb_psim_part(ps, 1)), 100 + LOOK);
    kb_psim_destroy(ps);
    kb_psim_destroy(NULL);
}

/* ---------------------------------------------------------------- fibers */

typedef struct waiter {
    kb_fiber *f;
    kb_time woke;
} waiter;

static void waiter_fiber(kb_sim *sim, void *arg)
{
    waiter *w = arg;
    kb_fiber_block(sim, "a message from partition 1", w);
    w->woke = kb_sim_now(sim);
}

static void wake_ev(kb_sim *sim, void *a, void *b)
{
    (void)b;
    kb_fiber_wake(sim, ((waiter *)a)->f);
}

typedef struct sender {
    kb_psim *ps;
    waiter *w;
    int rc;
} sender;

static void sender_fiber(kb_sim *sim, void *arg)
{
    sender *s = arg;
    kb_fiber_sleep(sim, 12345);
    s->rc = kb_psim_post(s->ps, 1, 0, kb_sim_now(sim) + LOOK, wake_ev, s->w, NULL);
}

/* A fiber blocked in partition 0 is woken by a message from a fiber of partition 1, at the
 * message's time; a fiber nobody wakes is a deadlock. */
static void test_fibers_across(void **state)
{
    (void)state;
    for (int threads = 1; threads <= 2; threads++) {
        kb_psim *ps;
        waiter w = { 0 }, lost = { 0 };
        sender s = { 0 };
        assert_int_equal(kb_psim_create(&(kb_psim_opts){ .parts = 2, .threads = threads,
                                                         .lookahead = LOOK },
                                        &ps), 0);
        s.ps = ps;
        s.w = &w;
        w.f = kb_fiber_spawn(kb_psim_part(ps, 0), waiter_fiber, &w, "waiter");
        assert_non_null(w.f);
        assert_non_null(kb_fiber_spawn(kb_psim_part(ps, 1), sender_fiber, &s, "sender"));
        assert_int_equal(kb_psim_run(ps), 0);
        assert_int_equal(s.rc, 0);
        assert_int_equal(w.woke, 12345 + LOOK);
        lost.f = kb_fiber_spawn(kb_psim_part(ps, 1), waiter_fiber, &lost, "lost");
        assert_non_null(lost.f);
        assert_int_equal(kb_psim_run(ps), KB_ERR_DEADLOCK);
        kb_psim_destroy(ps);
    }
}

/* kb_psim_opts.warm: a thread walks the fibers of the partition it runs next (their records,
 * what they blocked on and their hint lines) while it runs one. Fibers that sleep, post to the
 * next partition, block until a message wakes them and end at different windows: the same run,
 * warm or not, at 1, 2 and 4 threads. */
#define WARM_P 4
#define WARM_F 12

typedef struct warm_run {
    kb_psim *ps;
    struct warm_fib {
        struct warm_run *r;
        kb_fiber *f;
        int part, k, wakes, blocked;
        const void *vec[KB_FIBER_HOT_VEC];
    } fib[WARM_P][WARM_F];
    uint64_t h[WARM_P]; /* each partition's own: only its thread writes it */
    int rc;
} warm_run;

static void warm_wake_ev(kb_sim *sim, void *a, void *b)
{
    struct warm_fib *w = a;
    w->r->h[w->part] = (w->r->h[w->part] ^ (uint64_t)kb_sim_now(sim) ^ (uint64_t)(uintptr_t)b) *
                       0x100000001b3ull;
    if (w->blocked) {
        w->blocked = 0;
        kb_fiber_wake(sim, w->f);
    } else {
        w->wakes++; /* running, sleeping or ended: kept for its next block */
    }
}

static void warm_fiber(kb_sim *sim, void *arg)
{
    struct warm_fib *w = arg;
    warm_run *r = w->r;
    int n = w->k % 4 == 3 ? 10 : 30; /* some end early */
    for (int i = 0; i < n; i++) {
        long here = i;
        w->vec[1] = i % 2 ? (const void *)&here : (const void *)w; /* a line of its stack */
        kb_fiber_sleep(sim, (kb_time)((w->part * 7 + w->k * 13 + i * 5) % 900 + 1) * 10);
        r->h[w->part] = (r->h[w->part] ^ (uint64_t)kb_sim_now(sim)) * 0x100000001b3ull;
        if (i % 3 == 0) {
            int to = (w->part + 1) % WARM_P;
            int rc = kb_psim_post(r->ps, w->part, to, kb_sim_now(sim) + LOOK, warm_wake_ev,
                                  &r->fib[to][(w->k + i) % WARM_F], (void *)(intptr_t)i);
            if (rc)
                r->rc = rc;
        }
        if (i % 5 == 4 && w->k % 2 == 0) { /* blocks until a message wakes it */
            if (w->wakes > 0)
                w->wakes--;
            else {
                w->blocked = 1;
                kb_fiber_block(sim, "a message", w);
            }
        }
    }
}

static uint64_t warm_scenario(int threads, int warm, uint64_t *events)
{
    warm_run *r = calloc(1, sizeof *r);
    uint64_t d = 0;
    assert_non_null(r);
    assert_int_equal(kb_psim_create(&(kb_psim_opts){ .parts = WARM_P, .threads = threads,
                                                     .lookahead = LOOK, .warm = warm },
                                    &r->ps), 0);
    for (int p = 0; p < WARM_P; p++)
        for (int k = 0; k < WARM_F; k++) {
            struct warm_fib *w = &r->fib[p][k];
            const void *hot[KB_FIBER_HOT] = { (const void *)(uintptr_t)64, r };
            w->r = r;
            w->part = p;
            w->k = k;
            for (int i = 0; i < KB_FIBER_HOT_VEC; i++)
                w->vec[i] = i == 2 ? (const void *)(uintptr_t)64 : (const void *)r;
            w->f = kb_fiber_spawn(kb_psim_part(r->ps, p), warm_fiber, w, "warm");
            assert_non_null(w->f);
            assert_int_equal(kb_fiber_set_hot(w->f, hot, k % 3), 0);
            if (k % 2)
                assert_int_equal(kb_fiber_set_hot_vec(w->f, w->vec), 0);
        }
    int rc = kb_psim_run(r->ps);
    assert_true(rc == 0 || rc == KB_ERR_DEADLOCK); /* a fiber may wait for a message never sent */
    assert_int_equal(r->rc, 0);
    for (int p = 0; p < WARM_P; p++)
        d = (d ^ r->h[p]) * 0x100000001b3ull;
    d = (d ^ (uint64_t)rc) * 0x100000001b3ull;
    *events = kb_psim_events(r->ps);
    assert_true(kb_psim_windows(r->ps) > 10);
    kb_psim_destroy(r->ps);
    free(r);
    return d;
}

static void test_warm_same_run(void **state)
{
    (void)state;
    uint64_t e1, e;
    uint64_t d1 = warm_scenario(1, 0, &e1);
    assert_true(e1 > (uint64_t)WARM_P * WARM_F * 20);
    for (int threads = 1; threads <= 4; threads *= 2)
        for (int warm = 0; warm <= 1; warm++) {
            assert_int_equal(warm_scenario(threads, warm, &e), d1);
            assert_int_equal(e, e1);
        }
}

/* The window hook: once per window, after it, with every partition still and nothing due
 * before the window's end; the same calls and states at 1, 3 and 8 threads; a nonzero return
 * ends the run with that code at that window. */
static void test_window_hook(void **state)
{
    phold h1 = { .hook_stop = -1 };
    (void)state;
    result r1 = run_phold_every(8, 16, 1, 40, 0, 0, &h1);
    assert_int_equal(r1.rc, 0);
    assert_true(h1.hooks > 10);
    assert_int_equal((uint64_t)h1.hooks, r1.windows);
    for (int t = 3; t <= 8; t += 5) {
        phold h = { .hook_stop = -1 };
        result r = run_phold_every(8, 16, t, 40, 0, 0, &h);
        assert_int_equal(h.hooks, h1.hooks);
        assert_true(h.hook_digest == h1.hook_digest);
        assert_true(r.digest == r1.digest);
    }
    phold hs = { .hook_stop = 5 };
    result rs = run_phold_every(8, 16, 3, 40, 0, 0, &hs);
    assert_int_equal(rs.rc, 9);
    assert_int_equal(hs.hooks, 5);
    assert_int_equal(rs.windows, 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_phold_threads),
        cmocka_unit_test(test_phold_stop),
        cmocka_unit_test(test_phold_syncs),
        cmocka_unit_test(test_phold_processes),
        cmocka_unit_test(test_post_refusals),
        cmocka_unit_test(test_fibers_across),
        cmocka_unit_test(test_warm_same_run),
        cmocka_unit_test(test_window_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
