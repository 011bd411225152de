/*
 * test_sched — kb_sim and kb_sync: event ordering and tie-breaking, the current-time FIFO,
 * fibers (sleep, block/wake), signals, latches, bounded queues, deadlock reports, stop codes,
 * many fibers, determinism, teardown with blocked fibers, and bounded runs (kb_sim_run_until,
 * kb_sim_next: windows of any width fire what one run fires). Fibers only record what they see;
 * all assertions run outside the run (a failed cmocka assertion longjmps, which must not
 * happen on a fiber stack).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kb_err.h"
#include "kb_sim.h"
#include "kb_sync.h"
#include "kb_test_util.h"

/* ---------------------------------------------------------------- helpers */

typedef struct rec {
    kb_time t;
    long id;
} rec;

typedef struct trace {
    rec *r;
    size_t n, cap;
} trace;

static void trace_add(trace *tr, kb_time t, long id)
{
    if (tr->n == tr->cap) {
        tr->cap = tr->cap ? 2 * tr->cap : 64;
        tr->r = realloc(tr->r, tr->cap * sizeof *tr->r);
        if (!tr->r)
            abort(); /* may run on a fiber stack: no cmocka longjmp here */
    }
    tr->r[tr->n].t = t;
    tr->r[tr->n].id = id;
    tr->n++;
}

static void trace_free(trace *tr)
{
    free(tr->r);
    memset(tr, 0, sizeof *tr);
}

static void expect_trace(const trace *tr, const rec *want, size_t n)
{
    assert_int_equal(tr->n, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(tr->r[i].id, want[i].id);
        assert_int_equal(tr->r[i].t, want[i].t);
    }
}

/* ---------------------------------------------------------------- event ordering */

typedef struct order_ctx {
    trace tr;
    kbt_rng rng;
    long next_id;   /* insertion counter: ids increase in kb_sim_at call order */
    long budget;    /* events still allowed to schedule more */
} order_ctx;

static void order_ev(kb_sim *sim, void *a, void *b)
{
    order_ctx *c = a;

    trace_add(&c->tr, kb_sim_now(sim), (long)(intptr_t)b);
    /* Fan out with random delays, a quarter of them zero (FIFO path). */
    for (int k = 0; k < 2 && c->budget > 0; k++, c->budget--) {
        kb_time dt = kbt_rng_below(&c->rng, 4) == 0 ? 0 : (kb_time)kbt_rng_below(&c->rng, 50);
        assert_int_equal(kb_sim_after(sim, dt, order_ev, c, (void *)(intptr_t)c->next_id++), 0);
    }
}

/* Times never decrease; at equal times events fire in insertion order (ids increase). */
static void check_order(const order_ctx *c, size_t want_n)
{
    assert_int_equal(c->tr.n, want_n);
    for (size_t i = 1; i < c->tr.n; i++) {
        assert_true(c->tr.r[i].t >= c->tr.r[i - 1].t);
        if (c->tr.r[i].t == c->tr.r[i - 1].t)
            assert_true(c->tr.r[i].id > c->tr.r[i - 1].id);
    }
}

static void test_heap_random_order(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    order_ctx c = {{0}, {12345}, 0, 0};
    const int n = 20000;

    (void)state;
    assert_non_null(sim);
    /* Many ties: 20000 events over 997 distinct times, inserted in random time order. */
    for (int i = 0; i < n; i++)
        assert_int_equal(kb_sim_at(sim, (kb_time)kbt_rng_below(&c.rng, 997), order_ev, &c,
                                   (void *)(intptr_t)c.next_id++), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    check_order(&c, (size_t)n);
    assert_int_equal(kb_sim_events(sim), (uint64_t)n);
    assert_int_equal(kb_sim_now(sim), c.tr.r[n - 1].t);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

/* Events scheduling events (heap and FIFO mixed, grows the arrays from inside the run). */
static void test_heap_nested_random_order(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    order_ctx c = {{0}, {777}, 0, 30000};

    (void)state;
    for (int i = 0; i < 10; i++)
        assert_int_equal(kb_sim_at(sim, i * 3, order_ev, &c, (void *)(intptr_t)c.next_id++), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    check_order(&c, 30010);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

/*
 * Delays spread over every store of the queue: 0 (FIFO), inside the current 0.512 ns slot,
 * and uniform over 0..100 us on a 1 ns grid (the wheel spans 33.6 us: wheel and far heap;
 * ties are common).
 */
static void wide_ev(kb_sim *sim, void *a, void *b)
{
    order_ctx *c = a;

    trace_add(&c->tr, kb_sim_now(sim), (long)(intptr_t)b);
    for (int k = 0; k < 2 && c->budget > 0; k++, c->budget--) {
        uint64_t r = kbt_rng_below(&c->rng, 4);
        kb_time dt = r == 0 ? 0 : r == 1 ? (kb_time)kbt_rng_below(&c->rng, 4) * 64
                                         : (kb_time)kbt_rng_below(&c->rng, 100000) * 1000;
        assert_int_equal(kb_sim_after(sim, dt, wide_ev, c, (void *)(intptr_t)c->next_id++), 0);
    }
}

/* Runs the wide_ev cascade from 16 seeds on sim into c (40 016 events, in order). */
static void wide_run(kb_sim *sim, order_ctx *c)
{
    assert_non_null(sim);
    *c = (order_ctx){ { 0 }, { 4242 }, 0, 40000 };
    /* seeds far apart and out of order: the first ones land in the far heap */
    for (int i = 0; i < 16; i++)
        assert_int_equal(kb_sim_at(sim, (kb_time)((i * 7) % 16) * 3000000, wide_ev, c,
                                   (void *)(intptr_t)c->next_id++), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    check_order(c, 40016);
    assert_int_equal(kb_sim_events(sim), 40016u);
}

static void test_queue_wheel_and_far_order(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    order_ctx c;

    (void)state;
    wide_run(sim, &c);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

/* The wheel's slot width sets only the speed: the same cascade (every store, ties common)
 * fires the same events at the same times in the same order at any width, from 16 ps slots
 * (a 1 us horizon: most events pass through the far heap) to 1 us slots (one slot holds
 * dozens, in random time order); widths out of range are refused. */
static void test_slot_widths_same_order(void **state)
{
    static const unsigned shifts[] = { KB_SIM_SLOT_SHIFT_MIN, KB_SIM_SLOT_SHIFT_DEFAULT, 12, 14,
                                       KB_SIM_SLOT_SHIFT_MAX };
    order_ctx ref = { 0 };

    (void)state;
    for (size_t k = 0; k < sizeof shifts / sizeof *shifts; k++) {
        kb_sim *sim = kb_sim_create(&(kb_sim_opts){ .slot_shift = shifts[k] });
        order_ctx c;
        wide_run(sim, &c);
        if (k == 0) {
            ref = c;
        } else {
            for (size_t i = 0; i < c.tr.n; i++) {
                assert_int_equal(c.tr.r[i].t, ref.tr.r[i].t);
                assert_int_equal(c.tr.r[i].id, ref.tr.r[i].id);
            }
            trace_free(&c.tr);
        }
        kb_sim_destroy(sim);
    }
    trace_free(&ref.tr);
    assert_null(kb_sim_create(&(kb_sim_opts){ .slot_shift = KB_SIM_SLOT_SHIFT_MIN - 1 }));
    assert_null(kb_sim_create(&(kb_sim_opts){ .slot_shift = KB_SIM_SLOT_SHIFT_MAX + 1 }));
}

typedef struct fifo_ctx {
    trace tr;
} fifo_ctx;

static void fifo_leaf(kb_sim *sim, void *a, void *b)
{
    trace_add(&((fifo_ctx *)a)->tr, kb_sim_now(sim), (long)(intptr_t)b);
}

static void fifo_b(kb_sim *sim, void *a, void *b)
{
    fifo_leaf(sim, a, b);
    kb_sim_at(sim, 100, fifo_leaf, a, (void *)(intptr_t)'C'); /* into the heap, for time 100 */
}

static void fifo_a(kb_sim *sim, void *a, void *b)
{
    fifo_leaf(sim, a, b);
    kb_sim_after(sim, 0, fifo_leaf, a, (void *)(intptr_t)'D'); /* FIFO at 100 */
    kb_sim_at(sim, 100, fifo_leaf, a, (void *)(intptr_t)'E');  /* also FIFO: now == 100 */
}

/* C (scheduled for 100 at time 50) must fire before D (scheduled at 100 with delay 0). */
static void test_fifo_after_heap_at_same_time(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    fifo_ctx c = {{0}};
    const rec want[] = {{0, 'Z'}, {50, 'B'}, {100, 'A'}, {100, 'F'}, {100, 'C'},
                        {100, 'D'}, {100, 'E'}};

    (void)state;
    assert_int_equal(kb_sim_at(sim, 100, fifo_a, &c, (void *)(intptr_t)'A'), 0);
    assert_int_equal(kb_sim_at(sim, 50, fifo_b, &c, (void *)(intptr_t)'B'), 0);
    assert_int_equal(kb_sim_at(sim, 100, fifo_leaf, &c, (void *)(intptr_t)'F'), 0);
    assert_int_equal(kb_sim_after(sim, 0, fifo_leaf, &c, (void *)(intptr_t)'Z'), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want, sizeof want / sizeof want[0]);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

static void tie_push(kb_sim *sim, void *a, void *b)
{
    fifo_leaf(sim, a, b);
    kb_sim_at(sim, kb_ns(1000000), fifo_leaf, a, (void *)(intptr_t)'B'); /* 1 us ahead: the wheel */
}

/*
 * A is pushed 1 ms ahead (beyond the wheel: the far heap), B for the same time 1 us before
 * it (into the wheel): A was inserted first, so it fires first, though the wheel hands its
 * slot over before the far heap does.
 */
static void test_far_and_wheel_tie(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    fifo_ctx c = {{0}};
    const kb_time t = kb_ns(1000000);
    const rec want[] = {{1, 'Z'}, {t - kb_ns(1000), 'P'}, {t, 'A'}, {t, 'B'}};

    (void)state;
    /* Z keeps the wheel's cursor at slot 0 (a lone event would take it along), so A and P go
     * to the far heap */
    assert_int_equal(kb_sim_at(sim, 1, fifo_leaf, &c, (void *)(intptr_t)'Z'), 0);
    assert_int_equal(kb_sim_at(sim, t, fifo_leaf, &c, (void *)(intptr_t)'A'), 0);
    assert_int_equal(kb_sim_at(sim, t - kb_ns(1000), tie_push, &c, (void *)(intptr_t)'P'), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want, sizeof want / sizeof want[0]);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

static void nop_ev(kb_sim *sim, void *a, void *b)
{
    (void)sim;
    (void)a;
    (void)b;
}

static void past_ev(kb_sim *sim, void *a, void *b)
{
    int *rc = a;
    (void)b;
    rc[0] = kb_sim_at(sim, kb_sim_now(sim) - 1, nop_ev, NULL, NULL);
    rc[1] = kb_sim_after(sim, -5, nop_ev, NULL, NULL);
    rc[2] = kb_sim_run(sim); /* no re-entry */
}

static void test_at_in_past_is_inval(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    int rc[3] = {1, 1, 1};

    (void)state;
    assert_int_equal(kb_sim_at(sim, -1, nop_ev, NULL, NULL), KB_ERR_INVAL);
    assert_int_equal(kb_sim_at(sim, 100, past_ev, rc, NULL), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    assert_int_equal(rc[0], KB_ERR_INVAL);
    assert_int_equal(rc[1], KB_ERR_INVAL);
    assert_int_equal(rc[2], KB_ERR_STATE);
    assert_int_equal(kb_sim_now(sim), 100);
    assert_int_equal(kb_sim_at(sim, 50, nop_ev, NULL, NULL), KB_ERR_INVAL);
    assert_int_equal(kb_sim_at(sim, 100, NULL, NULL, NULL), KB_ERR_INVAL);
    assert_int_equal(kb_sim_after(sim, KB_TIME_MAX, nop_ev, NULL, NULL), KB_ERR_INVAL);
    assert_int_equal(kb_sim_events(sim), 1);
    kb_sim_destroy(sim);
    kb_sim_destroy(NULL);
}

/* ---------------------------------------------------------------- fibers */

typedef struct sleep_ctx {
    trace tr;
    kb_fiber *self_seen;
    kb_fiber *cur_in_callback;
    void *udata_seen;
} sleep_ctx;

static void sleeper(kb_sim *sim, void *arg)
{
    sleep_ctx *c = arg;

    c->self_seen = kb_fiber_current(sim);
    c->udata_seen = kb_fiber_udata(c->self_seen);
    trace_add(&c->tr, kb_sim_now(sim), 0);
    kb_fiber_sleep(sim, kb_ns(10));
    trace_add(&c->tr, kb_sim_now(sim), 1);
    kb_fiber_sleep(sim, 0);
    trace_add(&c->tr, kb_sim_now(sim), 2);
    kb_fiber_sleep(sim, kb_time_from_ns(2.5));
    trace_add(&c->tr, kb_sim_now(sim), 3);
    kb_fiber_sleep(sim, 1);
    trace_add(&c->tr, kb_sim_now(sim), 4);
}

static void who_runs(kb_sim *sim, void *a, void *b)
{
    (void)b;
    ((sleep_ctx *)a)->cur_in_callback = kb_fiber_current(sim);
}

static void test_fiber_sleep_exact(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    sleep_ctx c = {{0}, NULL, (kb_fiber *)(void *)&c, NULL}; /* non-NULL until seen */
    const rec want[] = {{0, 0}, {10000, 1}, {10000, 2}, {12500, 3}, {12501, 4}};
    int marker;
    kb_fiber *f;

    (void)state;
    f = kb_fiber_spawn(sim, sleeper, &c, "sleeper");
    assert_non_null(f);
    assert_string_equal(kb_fiber_name(f), "sleeper");
    kb_fiber_set_udata(f, &marker);
    assert_ptr_equal(kb_fiber_udata(f), &marker);
    assert_int_equal(kb_sim_live_fibers(sim), 1);
    assert_null(kb_fiber_current(sim));
    assert_int_equal(kb_sim_at(sim, 5, who_runs, &c, NULL), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want, sizeof want / sizeof want[0]);
    assert_ptr_equal(c.self_seen, f);
    assert_ptr_equal(c.udata_seen, &marker);
    assert_null(c.cur_in_callback);
    assert_int_equal(kb_sim_now(sim), 12501);
    assert_int_equal(kb_sim_switches(sim), 5);
    assert_int_equal(kb_sim_events(sim), 6);
    assert_int_equal(kb_sim_live_fibers(sim), 0);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

/* ---- kb_fiber_sleep_then: callback and resume as two adjacent events ---- */

typedef struct then_ctx {
    trace tr;
    int stop_in_cb;
    int rc_inval;
} then_ctx;

static void then_mark(kb_sim *sim, void *a, void *b)
{
    then_ctx *c = a;
    trace_add(&c->tr, kb_sim_now(sim), (long)(intptr_t)b);
}

static void then_cb(kb_sim *sim, void *a, void *b)
{
    then_ctx *c = a;
    trace_add(&c->tr, kb_sim_now(sim), (long)(intptr_t)b);
    /* pushed now, for now: after the fiber's resume (FIFO after queued events) */
    kb_sim_at(sim, kb_sim_now(sim), then_mark, c, (void *)(intptr_t)40);
    if (c->stop_in_cb)
        kb_sim_stop(sim, 9);
}

static void then_fiber(kb_sim *sim, void *arg)
{
    then_ctx *c = arg;
    trace_add(&c->tr, kb_sim_now(sim), 1);
    /* an event already pending at 100 fires first; one pushed after us at 100 fires after us */
    kb_sim_at(sim, 100, then_mark, c, (void *)(intptr_t)20);
    c->rc_inval = kb_fiber_sleep_then(sim, kb_sim_now(sim), then_cb, c, (void *)(intptr_t)99);
    assert_int_equal(kb_fiber_sleep_then(sim, 100, then_cb, c, (void *)(intptr_t)30), 0);
    trace_add(&c->tr, kb_sim_now(sim), 35); /* the resume */
    kb_fiber_sleep(sim, 50);
    trace_add(&c->tr, kb_sim_now(sim), 50);
}

static void then_late(kb_sim *sim, void *a, void *b)
{
    (void)b;
    kb_sim_at(sim, 100, then_mark, a, (void *)(intptr_t)38); /* same time, later seq */
}

static void test_fiber_sleep_then(void **state)
{
    const rec want[] = {{0, 1}, {100, 20}, {100, 30}, {100, 35}, {100, 38}, {100, 40},
                        {150, 50}};
    for (int stop = 0; stop < 2; stop++) {
        kb_sim *sim = kb_sim_create(NULL);
        then_ctx c = {{0}, stop, 0};
        (void)state;
        assert_non_null(kb_fiber_spawn(sim, then_fiber, &c, "then"));
        assert_int_equal(kb_sim_at(sim, 10, then_late, &c, NULL), 0);
        if (stop) {
            /* stopped in the callback: the resume has not fired, and is first in line */
            assert_int_equal(kb_sim_run(sim), 9);
            assert_int_equal(c.tr.n, 3);
            assert_int_equal(kb_sim_run(sim), 0);
        } else {
            assert_int_equal(kb_sim_run(sim), 0);
        }
        expect_trace(&c.tr, want, sizeof want / sizeof want[0]);
        assert_int_equal(c.rc_inval, KB_ERR_INVAL);
        /* spawn, late, mark 20, callback, resume, mark 38, mark 40, the sleep's resume */
        assert_int_equal(kb_sim_events(sim), 8);
        trace_free(&c.tr);
        kb_sim_destroy(sim);
    }
}

/* Block + wake_at from a callback; waking a fiber that is not blocked does nothing. */
typedef struct wake_ctx {
    kb_fiber *f;
    trace tr;
} wake_ctx;

static void blocker(kb_sim *sim, void *arg)
{
    wake_ctx *c = arg;
    kb_fiber_block(sim, "manual", c);
    trace_add(&c->tr, kb_sim_now(sim), 1);
    kb_fiber_sleep(sim, 100);
    trace_add(&c->tr, kb_sim_now(sim), 2);
}

static void waker(kb_sim *sim, void *a, void *b)
{
    wake_ctx *c = a;
    (void)b;
    kb_fiber_wake_at(sim, c->f, kb_sim_now(sim) + 40);
    kb_fiber_wake(sim, c->f); /* already woken: ignored */
}

static void late_waker(kb_sim *sim, void *a, void *b)
{
    wake_ctx *c = a;
    (void)b;
    kb_fiber_wake(sim, c->f); /* sleeping, not blocked: ignored */
}

static void test_fiber_block_wake_at(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    wake_ctx c = {NULL, {0}};
    const rec want[] = {{60, 1}, {160, 2}};

    (void)state;
    c.f = kb_fiber_spawn(sim, blocker, &c, "blocker");
    assert_non_null(c.f);
    kb_sim_at(sim, 20, waker, &c, NULL);
    kb_sim_at(sim, 100, late_waker, &c, NULL);
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want, sizeof want / sizeof want[0]);
    assert_int_equal(kb_sim_switches(sim), 3);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

/* ---------------------------------------------------------------- queues */

typedef struct pp_ctx {
    kb_queue ab, ba;
    trace tr;
} pp_ctx;

static void ping(kb_sim *sim, void *arg)
{
    pp_ctx *c = arg;
    for (long i = 0; i < 4; i++) {
        kb_fiber_sleep(sim, kb_ns(10));
        kb_queue_put(sim, &c->ab, (void *)(intptr_t)(i + 1));
        trace_add(&c->tr, kb_sim_now(sim), 100 + i);
        long v = (long)(intptr_t)kb_queue_get(sim, &c->ba);
        trace_add(&c->tr, kb_sim_now(sim), 200 + v);
    }
}

static void pong(kb_sim *sim, void *arg)
{
    pp_ctx *c = arg;
    for (int i = 0; i < 4; i++) {
        long v = (long)(intptr_t)kb_queue_get(sim, &c->ab);
        trace_add(&c->tr, kb_sim_now(sim), 300 + v);
        kb_fiber_sleep(sim, kb_ns(3));
        kb_queue_put(sim, &c->ba, (void *)(intptr_t)(v * 10));
    }
}

static void test_queue_ping_pong(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    pp_ctx c;
    const rec want[] = {
        {10000, 100}, {10000, 301}, {13000, 210},
        {23000, 101}, {23000, 302}, {26000, 220},
        {36000, 102}, {36000, 303}, {39000, 230},
        {49000, 103}, {49000, 304}, {52000, 240},
    };

    (void)state;
    memset(&c, 0, sizeof c);
    assert_int_equal(kb_queue_init(&c.ab, 1), 0);
    assert_int_equal(kb_queue_init(&c.ba, 1), 0);
    assert_non_null(kb_fiber_spawn(sim, ping, &c, "ping"));
    assert_non_null(kb_fiber_spawn(sim, pong, &c, "pong"));
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want, sizeof want / sizeof want[0]);
    assert_int_equal(kb_sim_live_fibers(sim), 0);
    kb_queue_fini(&c.ab);
    kb_queue_fini(&c.ba);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

typedef struct pc_ctx {
    kb_queue q;
    trace tr;
    int try_rc[3];
} pc_ctx;

static void producer(kb_sim *sim, void *arg)
{
    pc_ctx *c = arg;
    for (long i = 0; i < 4; i++) {
        kb_queue_put(sim, &c->q, (void *)(intptr_t)i);
        trace_add(&c->tr, kb_sim_now(sim), 10 + i);
    }
}

static void consumer(kb_sim *sim, void *arg)
{
    pc_ctx *c = arg;
    for (int i = 0; i < 4; i++) {
        long v = (long)(intptr_t)kb_queue_get(sim, &c->q);
        trace_add(&c->tr, kb_sim_now(sim), 20 + v);
        kb_fiber_sleep(sim, kb_ns(5));
    }
}

static void early_getter(kb_sim *sim, void *arg)
{
    pc_ctx *c = arg;
    long v = (long)(intptr_t)kb_queue_get(sim, &c->q);
    trace_add(&c->tr, kb_sim_now(sim), 30 + v);
}

static void cb_try_put(kb_sim *sim, void *a, void *b)
{
    pc_ctx *c = a;
    void *item = NULL;
    c->try_rc[0] = kb_queue_try_get(sim, &c->q, &item); /* empty */
    c->try_rc[1] = kb_queue_try_put(sim, &c->q, b);     /* wakes the getter */
    c->try_rc[2] = kb_queue_try_put(sim, &c->q, b);     /* full (cap 1) */
}

static void test_queue_blocks_both_ways(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    pc_ctx c;
    /* Full queue blocks the producer; each get lets exactly one more put through. */
    const rec want1[] = {{0, 10}, {0, 20}, {0, 11}, {5000, 21}, {5000, 12},
                         {10000, 22}, {10000, 13}, {15000, 23}};
    /* Empty queue blocks the getter until a callback puts at 22 ns; then try_* report state. */
    const rec want2[] = {{22000, 37}};
    void *left = NULL;

    (void)state;
    memset(&c, 0, sizeof c);
    assert_int_equal(kb_queue_init(&c.q, 0), KB_ERR_INVAL);
    assert_int_equal(kb_queue_init(&c.q, 1), 0);
    assert_non_null(kb_fiber_spawn(sim, producer, &c, "producer"));
    assert_non_null(kb_fiber_spawn(sim, consumer, &c, "consumer"));
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want1, sizeof want1 / sizeof want1[0]);
    assert_int_equal(kb_sim_now(sim), 20000);
    assert_int_equal(c.q.count, 0);

    c.tr.n = 0;
    assert_non_null(kb_fiber_spawn(sim, early_getter, &c, "getter"));
    assert_int_equal(kb_sim_after(sim, 2000, cb_try_put, &c, (void *)(intptr_t)7), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want2, 1);
    assert_int_equal(c.try_rc[0], KB_ERR_STATE);
    assert_int_equal(c.try_rc[1], 0);
    assert_int_equal(c.try_rc[2], KB_ERR_STATE);
    /* The getter took the item; the second try_put found the queue full and was refused. */
    assert_int_equal(kb_queue_try_get(sim, &c.q, &left), KB_ERR_STATE);
    assert_null(left);
    assert_int_equal(kb_queue_try_put(sim, &c.q, &c), 0);
    assert_int_equal(kb_queue_try_get(sim, &c.q, &left), 0);
    assert_ptr_equal(left, &c);
    kb_queue_fini(&c.q);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

/* ---------------------------------------------------------------- signals and latches */

typedef struct sig_ctx {
    kb_signal s;
    kb_latch l;
    trace tr;
    long id_next;
} sig_ctx;

static void sig_waiter(kb_sim *sim, void *arg)
{
    sig_ctx *c = arg;
    long id = c->id_next++;
    kb_signal_wait(sim, &c->s);
    trace_add(&c->tr, kb_sim_now(sim), id);
}

static void sig_late_waiter(kb_sim *sim, void *arg)
{
    sig_ctx *c = arg;
    kb_fiber_sleep(sim, kb_ns(50));
    kb_signal_wait(sim, &c->s); /* already fired: returns at once */
    trace_add(&c->tr, kb_sim_now(sim), 99);
}

static void cb_fire(kb_sim *sim, void *a, void *b)
{
    (void)b;
    kb_signal_fire(sim, &((sig_ctx *)a)->s);
}

static void test_signal_many_waiters(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    sig_ctx c;
    const rec want[] = {{42000, 0}, {42000, 1}, {42000, 2}, {50000, 99}};

    (void)state;
    memset(&c, 0, sizeof c);
    kb_signal_init(&c.s);
    for (int i = 0; i < 3; i++)
        assert_non_null(kb_fiber_spawn(sim, sig_waiter, &c, "waiter"));
    assert_non_null(kb_fiber_spawn(sim, sig_late_waiter, &c, "late"));
    kb_sim_at(sim, kb_ns(42), cb_fire, &c, NULL);
    kb_sim_at(sim, kb_ns(45), cb_fire, &c, NULL); /* second fire: nothing to do */
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want, sizeof want / sizeof want[0]);
    assert_int_equal(c.s.fired, 1);
    assert_null(c.s.waiters.head);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

static void latch_waiter(kb_sim *sim, void *arg)
{
    sig_ctx *c = arg;
    kb_latch_wait(sim, &c->l);
    trace_add(&c->tr, kb_sim_now(sim), 1);
    kb_latch_add(&c->l, 1);
    kb_latch_wait(sim, &c->l);
    trace_add(&c->tr, kb_sim_now(sim), 2);
}

static void latch_worker(kb_sim *sim, void *arg)
{
    sig_ctx *c = arg;
    long id = c->id_next++;
    static const kb_time delay[] = {5000, 15000, 10000, 30000};
    kb_fiber_sleep(sim, delay[id]);
    kb_latch_done(sim, &c->l);
}

static void test_latch(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    sig_ctx c;
    const rec want[] = {{15000, 1}, {30000, 2}};

    (void)state;
    memset(&c, 0, sizeof c);
    kb_latch_init(&c.l, 3);
    assert_non_null(kb_fiber_spawn(sim, latch_waiter, &c, "lw"));
    for (int i = 0; i < 4; i++)
        assert_non_null(kb_fiber_spawn(sim, latch_worker, &c, "worker"));
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want, sizeof want / sizeof want[0]);
    assert_int_equal(c.l.count, 0);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

/* ---------------------------------------------------------------- deadlock, stop */

typedef struct dl_ctx {
    kb_signal never;
    kb_queue q;
    char names[4][64];
    const char *what[4];
    const void *obj[4];
    int n;
} dl_ctx;

static void dl_sig(kb_sim *sim, void *arg) { kb_signal_wait(sim, &((dl_ctx *)arg)->never); }
static void dl_get(kb_sim *sim, void *arg) { (void)kb_queue_get(sim, &((dl_ctx *)arg)->q); }
static void dl_ok(kb_sim *sim, void *arg)
{
    (void)arg;
    kb_fiber_sleep(sim, 77);
}

static void collect_blocked(const kb_fiber *f, const char *what, const void *obj, void *ud)
{
    dl_ctx *c = ud;
    if (c->n < 4) {
        strcpy(c->names[c->n], kb_fiber_name(f));
        c->what[c->n] = what;
        c->obj[c->n] = obj;
    }
    c->n++;
}

static void test_deadlock_report(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    dl_ctx c;
    const char *longname = "a-very-long-fiber-name-that-goes-past-47-characters-for-sure";

    (void)state;
    memset(&c, 0, sizeof c);
    kb_signal_init(&c.never);
    assert_int_equal(kb_queue_init(&c.q, 2), 0);
    assert_non_null(kb_fiber_spawn(sim, dl_get, &c, longname));
    assert_non_null(kb_fiber_spawn(sim, dl_ok, &c, "finishes"));
    assert_non_null(kb_fiber_spawn(sim, dl_sig, &c, "stuck-one"));
    assert_int_equal(kb_sim_run(sim), KB_ERR_DEADLOCK);
    assert_int_equal(kb_sim_now(sim), 77);
    assert_int_equal(kb_sim_live_fibers(sim), 2);
    kb_sim_foreach_blocked(sim, collect_blocked, &c);
    assert_int_equal(c.n, 2);
    assert_int_equal(strlen(c.names[0]), 47);
    assert_memory_equal(c.names[0], longname, 47);
    assert_string_equal(c.what[0], "queue get");
    assert_ptr_equal(c.obj[0], &c.q);
    assert_string_equal(c.names[1], "stuck-one");
    assert_string_equal(c.what[1], "signal");
    assert_ptr_equal(c.obj[1], &c.never);
    /* Running again changes nothing: still deadlocked. */
    assert_int_equal(kb_sim_run(sim), KB_ERR_DEADLOCK);
    kb_sim_destroy(sim); /* frees the blocked fibers without running them */
    kb_queue_fini(&c.q);
}

typedef struct stop_ctx {
    trace tr;
} stop_ctx;

static void cb_stop(kb_sim *sim, void *a, void *b)
{
    trace_add(&((stop_ctx *)a)->tr, kb_sim_now(sim), 1);
    kb_sim_stop(sim, (int)(intptr_t)b);
}

static void cb_mark(kb_sim *sim, void *a, void *b)
{
    trace_add(&((stop_ctx *)a)->tr, kb_sim_now(sim), (long)(intptr_t)b);
}

static void fiber_stopper(kb_sim *sim, void *arg)
{
    stop_ctx *c = arg;
    kb_fiber_sleep(sim, 500);
    kb_sim_stop(sim, 3);
    trace_add(&c->tr, kb_sim_now(sim), 5); /* the step finishes before run returns */
    kb_fiber_sleep(sim, 10);
    trace_add(&c->tr, kb_sim_now(sim), 6);
}

static void test_stop_with_code(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    stop_ctx c = {{0}};
    const rec want1[] = {{10, 1}};
    const rec want2[] = {{10, 1}, {10, 2}, {20, 3}, {500, 5}};
    const rec want3[] = {{10, 1}, {10, 2}, {20, 3}, {500, 5}, {510, 6}};

    (void)state;
    kb_sim_at(sim, 10, cb_stop, &c, (void *)(intptr_t)7);
    kb_sim_at(sim, 10, cb_mark, &c, (void *)(intptr_t)2);
    kb_sim_at(sim, 20, cb_mark, &c, (void *)(intptr_t)3);
    assert_non_null(kb_fiber_spawn(sim, fiber_stopper, &c, "stopper"));
    assert_int_equal(kb_sim_run(sim), 7);
    assert_int_equal(kb_sim_now(sim), 10);
    expect_trace(&c.tr, want1, 1);
    assert_int_equal(kb_sim_run(sim), 3);
    expect_trace(&c.tr, want2, 4);
    assert_int_equal(kb_sim_run(sim), 0);
    expect_trace(&c.tr, want3, 5);
    /* A stop requested outside a run makes the next run return at once. */
    kb_sim_at(sim, 600, cb_mark, &c, (void *)(intptr_t)8);
    kb_sim_stop(sim, KB_ERR_STATE);
    assert_int_equal(kb_sim_run(sim), KB_ERR_STATE);
    assert_int_equal(c.tr.n, 5);
    assert_int_equal(kb_sim_run(sim), 0);
    assert_int_equal(c.tr.n, 6);
    trace_free(&c.tr);
    kb_sim_destroy(sim);
}

/* ---------------------------------------------------------------- scale, determinism */

typedef struct many_ctx {
    long started, done;
    kb_time last;
} many_ctx;

static void many_fn(kb_sim *sim, void *arg)
{
    many_ctx *c = arg;
    kb_fiber_sleep(sim, (kb_time)(1 + (c->started++ % 100)) * 1000);
    kb_fiber_sleep(sim, 1);
    c->done++;
    if (kb_sim_now(sim) > c->last)
        c->last = kb_sim_now(sim);
}

static void test_many_fibers(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    many_ctx c = {0, 0, 0};
    const int n = 20000;

    (void)state;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n; i++)
            assert_non_null(kb_fiber_spawn(sim, many_fn, &c, "many"));
        assert_int_equal(kb_sim_live_fibers(sim), (size_t)n);
        assert_int_equal(kb_sim_run(sim), 0);
        assert_int_equal(kb_sim_live_fibers(sim), 0);
    }
    assert_int_equal(c.done, 2 * n);
    assert_int_equal(kb_sim_switches(sim), (uint64_t)(6 * n));
    assert_int_equal(kb_sim_events(sim), (uint64_t)(6 * n));
    /* Fiber i sleeps (1 + i % 100) ns + 1 ps; round two starts where round one ended. */
    assert_int_equal(c.last, 2 * (kb_ns(100) + 1));
    kb_sim_destroy(sim);
}

typedef struct det_ctx {
    trace tr;
    kb_queue q;
    kb_signal go;
    kbt_rng rng;
    const void *vec[KB_FIBER_HOT_VEC]; /* the workers' kb_fiber_set_hot_vec vector */
} det_ctx;

static void det_ev(kb_sim *sim, void *a, void *b)
{
    det_ctx *c = a;
    long id = (long)(intptr_t)b;
    trace_add(&c->tr, kb_sim_now(sim), id);
    if (id == 5)
        kb_signal_fire(sim, &c->go);
    if (id < 400)
        kb_sim_after(sim, (kb_time)kbt_rng_below(&c->rng, 3000), det_ev, c,
                     (void *)(intptr_t)(id + 7));
}

static void det_worker(kb_sim *sim, void *arg)
{
    det_ctx *c = arg;
    kb_signal_wait(sim, &c->go);
    for (int i = 0; i < 20; i++) {
        long here = i;
        /* the vector changes between resumes, to a line of this stack and back */
        c->vec[1] = i % 2 ? (const void *)&here : (const void *)c;
        kb_fiber_sleep(sim, (kb_time)kbt_rng_below(&c->rng, 700));
        kb_queue_put(sim, &c->q, (void *)(intptr_t)i);
        trace_add(&c->tr, kb_sim_now(sim), 1000 + i);
    }
}

static void det_reader(kb_sim *sim, void *arg)
{
    det_ctx *c = arg;
    for (int i = 0; i < 60; i++) {
        long v = (long)(intptr_t)kb_queue_get(sim, &c->q);
        trace_add(&c->tr, kb_sim_now(sim), 2000 + v);
        kb_fiber_sleep(sim, (kb_time)kbt_rng_below(&c->rng, 500));
    }
}

/* hints: give every fiber prefetch hints (kb_fiber_set_hot, and a vector the workers change as
 * they run: kb_fiber_set_hot_vec), one of each an address that nothing maps, and prefetch the
 * wheel's next slots (kb_sim_opts.prefetch_slots): a hint is never read, so the run must not
 * change */
static void det_scenario(trace *out, int hints)
{
    kb_sim_opts so = { .prefetch_slots = 1 };
    kb_sim *sim = kb_sim_create(hints ? &so : NULL);
    det_ctx c;
    kb_fiber *f[4];

    memset(&c, 0, sizeof c);
    c.rng.s = 99;
    kb_signal_init(&c.go);
    assert_int_equal(kb_queue_init(&c.q, 2), 0);
    for (int i = 0; i < 3; i++)
        assert_non_null(f[i] = kb_fiber_spawn(sim, det_worker, &c, "w"));
    assert_non_null(f[3] = kb_fiber_spawn(sim, det_reader, &c, "r"));
    for (int i = 0; hints && i < 4; i++) {
        const void *hot[KB_FIBER_HOT] = { (const void *)(uintptr_t)64, f[(i + 1) % 4] };
        assert_int_equal(kb_fiber_set_hot(f[i], hot, i % 2 ? KB_FIBER_HOT : 1), 0);
    }
    for (int i = 0; i < KB_FIBER_HOT_VEC; i++)
        c.vec[i] = i == 2 ? (const void *)(uintptr_t)64 : (const void *)&c;
    for (int i = 0; hints && i < 4; i++)
        assert_int_equal(kb_fiber_set_hot_vec(f[i], c.vec), 0);
    if (hints) {
        const void *hot[KB_FIBER_HOT + 1] = { 0 };
        const void *holed[KB_FIBER_HOT_VEC] = { &c, &c, NULL, &c };
        assert_int_equal(kb_fiber_set_hot(f[0], hot, KB_FIBER_HOT + 1), KB_ERR_INVAL);
        assert_int_equal(kb_fiber_set_hot(f[0], NULL, 1), KB_ERR_INVAL);
        assert_int_equal(kb_fiber_set_hot_vec(f[0], holed), KB_ERR_INVAL); /* keeps c.vec */
        assert_int_equal(kb_fiber_set_hot_vec(f[3], NULL), 0);              /* none again */
    }
    for (long i = 0; i < 7; i++)
        kb_sim_at(sim, (kb_time)kbt_rng_below(&c.rng, 100), det_ev, &c, (void *)(intptr_t)i);
    if (hints) {
        /* warm a neighbour engine through the run (kb_sim_warm_next): fibers blocked, sleeping
         * and not started, with hints, one of each an unmapped address. Then the neighbour goes
         * and the engine runs again: the walk held for the one run only (under ASan a walk that
         * outlived it reads freed records) */
        kb_sim *nb = kb_sim_create(NULL);
        dl_ctx d;
        const void *hot[KB_FIBER_HOT] = { (const void *)(uintptr_t)64, &d };
        memset(&d, 0, sizeof d);
        kb_signal_init(&d.never);
        assert_non_null(nb);
        for (int i = 0; i < 40; i++) {
            kb_fiber *g = kb_fiber_spawn(nb, i % 2 ? dl_sig : dl_ok, &d, "nb");
            assert_non_null(g);
            assert_int_equal(kb_fiber_set_hot(g, hot, i % 3), 0);
            if (i % 4 == 0)
                assert_int_equal(kb_fiber_set_hot_vec(g, c.vec), 0);
        }
        assert_int_equal(kb_sim_run_until(nb, 50), 0); /* started: blocked and sleeping */
        kb_sim_warm_next(sim, sim);                  /* itself: no walk */
        kb_sim_warm_next(sim, NULL);
        kb_sim_warm_next(sim, nb);
        assert_int_equal(kb_sim_run_until(sim, 1000), 0);
        kb_sim_destroy(nb);
    }
    assert_int_equal(kb_sim_run(sim), 0);
    kb_queue_fini(&c.q);
    kb_sim_destroy(sim);
    *out = c.tr;
}

static void test_determinism(void **state)
{
    trace t1, t2;

    (void)state;
    det_scenario(&t1, 0);
    det_scenario(&t2, 1);
    assert_true(t1.n > 400);
    assert_int_equal(t1.n, t2.n);
    for (size_t i = 0; i < t1.n; i++) {
        assert_int_equal(t1.r[i].t, t2.r[i].t);
        assert_int_equal(t1.r[i].id, t2.r[i].id);
    }
    trace_free(&t1);
    trace_free(&t2);
}

/* Destroy with blocked and sleeping fibers and pending events: ASan checks nothing leaks. */
static void test_destroy_with_blocked(void **state)
{
    kb_sim *sim = kb_sim_create(&(kb_sim_opts){.fiber_stack_bytes = 100000});
    dl_ctx c;

    (void)state;
    memset(&c, 0, sizeof c);
    kb_signal_init(&c.never);
    for (int i = 0; i < 100; i++)
        assert_non_null(kb_fiber_spawn(sim, dl_sig, &c, "blocked"));
    for (int i = 0; i < 10; i++)
        assert_non_null(kb_fiber_spawn(sim, dl_ok, &c, "sleeps"));
    for (int i = 0; i < 1000; i++)
        assert_int_equal(kb_sim_at(sim, 10 + i, nop_ev, NULL, NULL), 0);
    kb_sim_destroy(sim);

    /* Same, after running part-way: some blocked, some never started. */
    sim = kb_sim_create(NULL);
    for (int i = 0; i < 50; i++)
        assert_non_null(kb_fiber_spawn(sim, dl_sig, &c, "blocked"));
    assert_int_equal(kb_sim_run(sim), KB_ERR_DEADLOCK);
    for (int i = 0; i < 50; i++)
        assert_non_null(kb_fiber_spawn(sim, dl_ok, &c, "never-started"));
    assert_int_equal(kb_sim_live_fibers(sim), 100);
    kb_sim_destroy(sim);
}

/* ---------------------------------------------------------------- stack guard */

static int guard_pipe = -1;

/* Frames of ~1 KiB each, written so that the recursion really uses the stack; each frame
 * hands its buffer to the next, so no compiler can turn the recursion into a loop. */
static unsigned deep(unsigned depth, unsigned stop, volatile unsigned char *up)
{
    volatile unsigned char buf[1024];
    for (size_t i = 0; i < sizeof buf; i += 64)
        buf[i] = (unsigned char)(depth + (up ? up[i] : 0));
    if (depth == 4 && write(guard_pipe, "4", 1) != 1)
        _exit(3);
    return depth >= stop ? buf[0] : deep(depth + 1, stop, buf) + buf[64];
}

static void overflow_fiber(kb_sim *sim, void *arg)
{
    (void)sim;
    /* 16 KiB of stack: 20 frames go ~4 KiB below its low end, into the guard page, and
     * without one into the neighbouring stack's (mapped) top page */
    deep(0, (unsigned)(uintptr_t)arg, NULL);
}

static void idle_fiber(kb_sim *sim, void *arg)
{
    (void)arg;
    kb_fiber_sleep(sim, 1);
}

/* A fiber that runs off the low end of its stack dies on the guard page (SIGSEGV; under
 * AddressSanitizer, its stack-overflow report) instead of overwriting another fiber's stack. */
static void test_stack_guard(void **state)
{
    int fds[2], status;
    char c = 0;
    pid_t pid;

    (void)state;
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kb_sim *sim = kb_sim_create(&(kb_sim_opts){.fiber_stack_bytes = 16384});
        close(fds[0]);
        guard_pipe = fds[1];
        signal(SIGSEGV, SIG_DFL);
        if (!sim || !kb_fiber_spawn(sim, idle_fiber, NULL, "below") ||
            !kb_fiber_spawn(sim, overflow_fiber, (void *)(uintptr_t)20, "overflows"))
            _exit(2);
        kb_sim_run(sim);
        _exit(0); /* the overflow went unnoticed */
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], &c, 1), 1); /* it ran, to depth 4 at least */
    close(fds[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(c, '4');
#ifdef __SANITIZE_ADDRESS__
    assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                                        WEXITSTATUS(status) != 2 && WEXITSTATUS(status) != 3));
#else
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGSEGV);
#endif
}


/* ---------------------------------------------------------------- bounded runs */

/* A cascade: each event records itself and, while budget lasts, schedules children at
 * delays from a fixed generator (0, within the slot, the wheel's horizon and past it), so
 * every store (FIFO, near run, wheel, far heap) holds events at every limit. */
typedef struct casc {
    trace tr;
    uint64_t rng;
    long next_id, budget;
} casc;

static uint64_t casc_draw(casc *c)
{
    c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
    return c->rng >> 33;
}

static void casc_ev(kb_sim *sim, void *a, void *b)
{
    casc *c = a;
    static const kb_time span[4] = { 1, 600, 40000000, 90000000 }; /* ps */
    trace_add(&c->tr, kb_sim_now(sim), (long)(intptr_t)b);
    for (int k = 0; k < 2 && c->budget > 0; k++, c->budget--) {
        uint64_t r = casc_draw(c);
        kb_time dt = (kb_time)(r % 7 == 0 ? 0 : casc_draw(c) % (uint64_t)span[r % 4]);
        if (kb_sim_after(sim, dt, casc_ev, c, (void *)(intptr_t)c->next_id++) != 0)
            abort();
    }
}

static void casc_start(kb_sim *sim, casc *c, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->rng = seed;
    c->budget = 20000;
    for (long i = 0; i < 16; i++)
        if (kb_sim_at(sim, (kb_time)(casc_draw(c) % 50000), casc_ev, c, (void *)(intptr_t)i) != 0)
            abort();
    c->next_id = 16;
}

/* kb_sim_run_until in windows of any width fires exactly what one kb_sim_run fires, in the
 * same order (also with wider wheel slots); kb_sim_next names the time of the next event each
 * window starts with. */
static void test_run_until_windows(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        /* the windowed engine's slots 0.512 ns, 4.1 ns and 1 us wide */
        unsigned shift = seed == 1 ? 0 : seed == 2 ? 12 : KB_SIM_SLOT_SHIFT_MAX;
        kb_sim *one = kb_sim_create(NULL);
        kb_sim *win = kb_sim_create(&(kb_sim_opts){ .slot_shift = shift });
        casc a, b;
        kb_time t, limit = 0;
        assert_non_null(one);
        assert_non_null(win);
        casc_start(one, &a, seed);
        casc_start(win, &b, seed);
        assert_int_equal(kb_sim_run(one), 0);
        uint64_t w = seed * 977;
        while (kb_sim_next(win, &t)) {
            size_t before = b.tr.n;
            assert_true(t >= limit); /* nothing left behind before the last limit */
            w = w * 6364136223846793005ull + 1;
            /* widths from 1 ps to past the wheel's horizon, and limits on the event itself */
            limit = (w >> 60) == 0 ? t : t + 1 + (kb_time)((w >> 20) % (1u << ((w >> 40) % 28)));
            assert_int_equal(kb_sim_run_until(win, limit), 0);
            if (limit > t)
                assert_true(b.tr.n > before && b.tr.r[before].t == t);
            for (size_t i = before; i < b.tr.n; i++)
                assert_true(b.tr.r[i].t < limit);
        }
        assert_int_equal(kb_sim_blocked(win), 0);
        assert_int_equal(b.tr.n, a.tr.n);
        assert_int_equal(kb_sim_events(win), kb_sim_events(one));
        for (size_t i = 0; i < a.tr.n; i++) {
            assert_int_equal(b.tr.r[i].t, a.tr.r[i].t);
            assert_int_equal(b.tr.r[i].id, a.tr.r[i].id);
        }
        trace_free(&a.tr);
        trace_free(&b.tr);
        kb_sim_destroy(one);
        kb_sim_destroy(win);
    }
}

/* A stop inside a bounded run returns its code; an empty engine has no next event. */
static void stop_ev(kb_sim *sim, void *a, void *b)
{
    (void)a;
    (void)b;
    kb_sim_stop(sim, 42);
}

static void test_run_until_stop_and_empty(void **state)
{
    kb_sim *sim = kb_sim_create(NULL);
    kb_time t = -1;
    (void)state;
    assert_non_null(sim);
    assert_int_equal(kb_sim_next(sim, &t), 0);
    assert_int_equal(kb_sim_at(sim, 1000, stop_ev, NULL, NULL), 0);
    assert_int_equal(kb_sim_at(sim, 3000, stop_ev, NULL, NULL), 0);
    assert_int_equal(kb_sim_run_until(sim, 500), 0);
    assert_int_equal(kb_sim_now(sim), 0);
    assert_int_equal(kb_sim_next(sim, &t), 1);
    assert_int_equal(t, 1000);
    assert_int_equal(kb_sim_run_until(sim, 5000), 42);
    assert_int_equal(kb_sim_now(sim), 1000);
    assert_int_equal(kb_sim_next(sim, &t), 1);
    assert_int_equal(t, 3000);
    kb_sim_destroy(sim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heap_random_order),
        cmocka_unit_test(test_stack_guard),
        cmocka_unit_test(test_heap_nested_random_order),
        cmocka_unit_test(test_queue_wheel_and_far_order),
        cmocka_unit_test(test_slot_widths_same_order),
        cmocka_unit_test(test_fifo_after_heap_at_same_time),
        cmocka_unit_test(test_far_and_wheel_tie),
        cmocka_unit_test(test_at_in_past_is_inval),
        cmocka_unit_test(test_fiber_sleep_exact),
        cmocka_unit_test(test_fiber_sleep_then),
        cmocka_unit_test(test_fiber_block_wake_at),
        cmocka_unit_test(test_queue_ping_pong),
        cmocka_unit_test(test_queue_blocks_both_ways),
        cmocka_unit_test(test_signal_many_waiters),
        cmocka_unit_test(test_latch),
        cmocka_unit_test(test_deadlock_report),
        cmocka_unit_test(test_stop_with_code),
        cmocka_unit_test(test_many_fibers),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_destroy_with_blocked),
        cmocka_unit_test(test_run_until_windows),
        cmocka_unit_test(test_run_until_stop_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
