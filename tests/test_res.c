/*
 * test_res — kb_res: exact occupancy arithmetic, pipelined paths, FIFO queuing and hops.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kb_res.h"

/* 100 GB/s = 100 000 bytes/us: 1 byte = 10 ps exactly. */
static void test_init_rounds_bandwidth(void **state)
{
    kb_res r;

    (void)state;
    kb_res_init(&r, "link", 100.0, kb_ns(5), 0);
    assert_int_equal(r.bytes_per_us, 100000);
    assert_int_equal(r.latency, 5000);
    assert_int_equal(r.fixed, 0);
    assert_int_equal(r.free_at, 0);
    assert_int_equal(r.bytes, 0);
    assert_string_equal(r.name, "link");

    kb_res_init(&r, "frac", 12.3456, 0, 0); /* 12345.6 bytes/us -> 12346 */
    assert_int_equal(r.bytes_per_us, 12346);
    kb_res_init(&r, "half", 0.0005, 0, 0); /* below 1 byte/us rounds up to 1 */
    assert_int_equal(r.bytes_per_us, 1);
    kb_res_init(&r, "tiny", 1e-9, 0, 0); /* positive never becomes infinite */
    assert_int_equal(r.bytes_per_us, 1);
    kb_res_init(&r, "inf", 0.0, 0, 0);
    assert_int_equal(r.bytes_per_us, 0);
    assert_int_equal(kb_res_occupancy(&r, 1u << 30), 0);
}

static void test_occupancy_closed_form(void **state)
{
    kb_res r;

    (void)state;
    /* 3 GB/s = 3000 bytes/us: n bytes take ceil(n * 1000 / 3) ps; fixed 7 ps. */
    kb_res_init(&r, "cpu", 3.0, 0, 7);
    assert_int_equal(kb_res_occupancy(&r, 0), 7);
    assert_int_equal(kb_res_occupancy(&r, 1), 7 + 334);     /* 333.33 -> 334 */
    assert_int_equal(kb_res_occupancy(&r, 2), 7 + 667);     /* 666.67 -> 667 */
    assert_int_equal(kb_res_occupancy(&r, 3), 7 + 1000);    /* exact */
    assert_int_equal(kb_res_occupancy(&r, 3001), 7 + 1000334);
    assert_int_equal(kb_res_occupancy(&r, 4096), 7 + 1365334); /* 1365333.33 */
    for (uint64_t n = 0; n < 5000; n += 7) {
        uint64_t num = n * 1000000u;
        kb_time want = 7 + (kb_time)(num / 3000 + (num % 3000 != 0));
        assert_int_equal(kb_res_occupancy(&r, n), want);
    }
}

/* n up to 2^44 and beyond: n * 1e6 overflows 64 bits, the result must still be exact. */
static void test_bw_time_large_sizes(void **state)
{
    uint64_t n44 = UINT64_C(1) << 44;

    (void)state;
    /* 1 TB/s = 1e6 bytes/us: exactly 1 ps per byte. */
    assert_int_equal(kb_bw_time(1000000, n44), (kb_time)n44);
    /* 7 bytes/us: 2^44 = 7 * 2513169434916 + 4 -> 2513169434916e6 + ceil(4e6 / 7). */
    assert_int_equal(kb_bw_time(7, n44), INT64_C(2513169434916000000) + 571429);
    /* (2^44 + 1) * 1e6 / 3000 = 5864062014805666.67 */
    assert_int_equal(kb_bw_time(3000, n44 + 1), INT64_C(5864062014805667));
    /* Results past KB_TIME_MAX saturate. */
    assert_int_equal(kb_bw_time(1, n44), KB_TIME_MAX);
    assert_int_equal(kb_bw_time(0, n44), 0);
    /* A bandwidth so large that r * 1e6 overflows takes the long-multiplication path:
     * 2^62 * 1e6 / (3 * 2^61) = 666666.67. */
    assert_int_equal(kb_bw_time(UINT64_C(3) << 61, UINT64_C(1) << 62), 666667);
    assert_int_equal(kb_bw_time(UINT64_MAX, UINT64_MAX - 1), 1000000);
    assert_int_equal(kb_bw_time(UINT64_MAX, 1), 1);
}

/* Idle 3-hop path, no fixed costs: end - now == sum(latency) + ceil(n * 1e6 / min bpu). */
static void test_idle_path_closed_form(void **state)
{
    kb_res a, b, c;
    kb_res *path[3] = {&a, &b, &c};
    const kb_time now = kb_ns(1000);
    kb_time start = -1, end;

    (void)state;
    kb_res_init(&a, "a", 200.0, kb_ns(10), 0);
    kb_res_init(&b, "b", 37.0, kb_ns(3), 0);  /* bottleneck: 37000 bytes/us */
    kb_res_init(&c, "c", 100.0, 1500, 0);
    end = kb_res_path_reserve(path, 3, now, 1000001, &start);
    assert_int_equal(start, now);
    /* 1000001e6 / 37000 = 27027054.05 -> 27027055 */
    assert_int_equal(end - now, 10000 + 3000 + 1500 + 27027055);
    /* Each resource is busy for its own occupancy from start. */
    assert_int_equal(a.free_at, now + 5000005);  /* 1000001e6 / 200000 = 5000005 */
    assert_int_equal(b.free_at, now + 27027055);
    assert_int_equal(c.free_at, now + 10000010);
    assert_int_equal(a.bytes, 1000001);
    assert_int_equal(b.bytes, 1000001);
    assert_int_equal(c.busy, 10000010);
}

/* Back-to-back transfers on a shared path queue FIFO: the second starts when it is free. */
static void test_path_fifo_queuing(void **state)
{
    kb_res link, port;
    kb_res *path[2] = {&link, &port};
    kb_time s1, s2, s3, e1, e2, e3;

    (void)state;
    kb_res_init(&link, "link", 100.0, kb_ns(2), 0); /* 10 ps/byte */
    kb_res_init(&port, "port", 50.0, 0, 1000);      /* 20 ps/byte + 1 ns */
    e1 = kb_res_path_reserve(path, 2, 0, 1000, &s1);
    assert_int_equal(s1, 0);
    assert_int_equal(e1, 2000 + 21000); /* max(10000, 21000) */
    /* Requested at 5 ns: both busy; port frees last, at 21 ns. */
    e2 = kb_res_path_reserve(path, 2, kb_ns(5), 1000, &s2);
    assert_int_equal(s2, 21000);
    assert_int_equal(e2, 21000 + 2000 + 21000);
    /* Requested long after: starts immediately. */
    e3 = kb_res_path_reserve(path, 2, kb_ns(100), 10, &s3);
    assert_int_equal(s3, kb_ns(100));
    assert_int_equal(e3, kb_ns(100) + 2000 + 1200);
    assert_int_equal(link.bytes, 2010);
    assert_int_equal(port.bytes, 2010);
    assert_int_equal(link.busy, 10000 + 10000 + 100);
    assert_int_equal(port.busy, 21000 + 21000 + 1200);
    /* Only the start time is optional. A zero-byte use (the port's 1 ns) requested at 0 fits
     * the gaps the third transfer left (link [31, 100) ns, port [42, 100) ns): it starts at
     * 42 ns, where both are idle, instead of queueing behind 101.2 ns. */
    assert_int_equal(kb_res_path_reserve(path, 2, 0, 0, NULL), 42000 + 2000 + 1000);
}

/*
 * A transfer that waits for one resource of its path leaves the others idle until it starts;
 * a later request that fits such a gap on every resource of its path takes it (a link serves
 * whatever is ready while it is idle), one that does not queues first-come first-served.
 */
static void test_path_backfill(void **state)
{
    kb_res dma_a, dma_b, noc;
    kb_res *pa[2] = {&dma_a, &noc}, *pb[2] = {&dma_b, &noc};
    kb_time s;

    (void)state;
    kb_res_init(&dma_a, "dma_a", 100.0, 0, 0); /* 10 ps/byte */
    kb_res_init(&dma_b, "dma_b", 100.0, 0, 0);
    kb_res_init(&noc, "noc", 100.0, 0, 0);
    /* A's engine is busy until 10 ns; A's second transfer starts there and holds the NoC
     * [10, 20) ns: the NoC is idle in [0, 10) */
    assert_int_equal(kb_res_hop(&dma_a, 0, 1000), 10000);
    assert_int_equal(kb_res_path_reserve(pa, 2, 0, 1000, &s), 20000);
    assert_int_equal(s, 10000);
    /* B's 400 bytes (4 ns) at 1 ns fit the gap: start at once */
    assert_int_equal(kb_res_path_reserve(pb, 2, kb_ns(1), 400, &s), 5000);
    assert_int_equal(s, 1000);
    /* 600 more bytes at 2 ns: the gap left is [5, 10) ns, 5 ns < 6 ns: they queue behind A */
    assert_int_equal(kb_res_path_reserve(pb, 2, kb_ns(2), 600, &s), 26000);
    assert_int_equal(s, 20000);
    /* 500 bytes at 3 ns: 5 ns fit both gaps (NoC [5, 10) ns, B's engine [5, 20) ns) */
    assert_int_equal(kb_res_path_reserve(pb, 2, kb_ns(3), 500, &s), 10000);
    assert_int_equal(s, 5000);
    assert_int_equal(noc.bytes, 1000 + 400 + 600 + 500);
    assert_int_equal(noc.busy, 10000 + 4000 + 6000 + 5000);
}

/* Store-and-forward chain: each hop starts when the message arrived and the resource is free. */
static void test_hop_chain(void **state)
{
    kb_res cpu, wire;
    kb_time t;

    (void)state;
    kb_res_init(&cpu, "cpu", 0.0, 0, kb_ns(50)); /* pure per-message cost */
    kb_res_init(&wire, "wire", 25.0, kb_ns(100), 0); /* 40 ps/byte */
    t = kb_res_hop(&cpu, 0, 256);
    assert_int_equal(t, 50000);
    t = kb_res_hop(&wire, t, 256);
    assert_int_equal(t, 50000 + 10240 + 100000);
    assert_int_equal(wire.free_at, 50000 + 10240); /* latency does not occupy */
    /* A second message arriving at 10 ns waits for the cpu (free at 50 ns), then the wire
     * (free at 60.24 ns) is free again by the time it gets there (100 ns). */
    t = kb_res_hop(&cpu, kb_ns(10), 256);
    assert_int_equal(t, 100000);
    t = kb_res_hop(&wire, t, 256);
    assert_int_equal(t, 100000 + 10240 + 100000);
    /* A third one arriving at the wire at 101 ns queues behind the second (110.24 ns). */
    t = kb_res_hop(&wire, kb_ns(101), 1);
    assert_int_equal(t, 110240 + 40 + 100000);
    assert_int_equal(cpu.bytes, 512);
    assert_int_equal(cpu.busy, 100000);
    assert_int_equal(wire.bytes, 513);
}

/* Fractional GB/s: 1.5 GB/s = 1500 bytes/us -> 666.67 ps per byte. */
static void test_fractional_gbps(void **state)
{
    kb_res r;
    kb_res *path[1] = {&r};

    (void)state;
    kb_res_init(&r, "slow", 1.5, 0, 0);
    assert_int_equal(r.bytes_per_us, 1500);
    assert_int_equal(kb_res_occupancy(&r, 1), 667);
    assert_int_equal(kb_res_occupancy(&r, 3), 2000);
    assert_int_equal(kb_res_occupancy(&r, 1000), 666667);
    assert_int_equal(kb_res_path_reserve(path, 1, 0, 1000, NULL), 666667);
    kb_res_init(&r, "odd", 0.0333, 0, 0); /* 33.3 -> 33 bytes/us */
    assert_int_equal(r.bytes_per_us, 33);
    assert_int_equal(kb_res_occupancy(&r, 100), 3030304); /* 3030303.03 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rounds_bandwidth),
        cmocka_unit_test(test_occupancy_closed_form),
        cmocka_unit_test(test_bw_time_large_sizes),
        cmocka_unit_test(test_idle_path_closed_form),
        cmocka_unit_test(test_path_fifo_queuing),
        cmocka_unit_test(test_path_backfill),
        cmocka_unit_test(test_hop_chain),
        cmocka_unit_test(test_fractional_gbps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
