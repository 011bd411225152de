/*
 * kb_res — bandwidth resources reserved at request time (semantics in kb_res.h).
 *
 * All arithmetic is integral: a bandwidth is an integer number of bytes per microsecond, so the
 * time to move n bytes, n * 1e6 / bytes_per_us ps, is a rational number that is rounded up
 * exactly. n * 1e6 would overflow 64 bits for n >= 2^44, so n is split into a quotient and a
 * remainder by bytes_per_us first; the remainder part never overflows for realistic
 * bandwidths and falls back to a shift-and-add long multiplication for absurd ones. Times
 * saturate at KB_TIME_MAX instead of wrapping. Limits: a resource serves one reservation at a
 * time (no priorities, no preemption) and remembers one idle gap only, the latest (requests
 * come in nondecreasing `now` order, so older gaps are mostly in the past): a transfer that
 * would fit an older gap queues instead. Callers must request in nondecreasing `now` order.
 */
#include "kb_res.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>

#define KB_PS_PER_US_ UINT64_C(1000000)

#if defined(__GNUC__)
#define KB_RES_NOINLINE __attribute__((noinline))
#define KB_RES_INLINE inline __attribute__((always_inline))
#else
#define KB_RES_NOINLINE
#define KB_RES_INLINE inline
#endif

static kb_time add_sat(kb_time a, kb_time b)
{
    return b > 0 && a > KB_TIME_MAX - b ? KB_TIME_MAX : a + b;
}

/* ceil(r * 1e6 / d) for r < d, without overflow for any d. */
static uint64_t ceil_mul_1e6_div(uint64_t r, uint64_t d)
{
    uint64_t q = 0, rem = 0;

    if (r <= UINT64_MAX / KB_PS_PER_US_) {
        uint64_t x = r * KB_PS_PER_US_;
        return x / d + (x % d != 0);
    }
    /* Invariant: r * (bits of 1e6 consumed so far) == q * d + rem, rem < d. */
    for (int bit = 19; bit >= 0; bit--) {
        q <<= 1;
        if (rem >= d - rem) {
            rem -= d - rem;
            q++;
        } else {
            rem += rem;
        }
        if ((KB_PS_PER_US_ >> bit) & 1u) {
            if (rem >= d - r) {
                rem -= d - r;
                q++;
            } else {
                rem += r;
            }
        }
    }
    return q + (rem != 0);
}

kb_time kb_bw_time(uint64_t bytes_per_us, uint64_t nbytes)
{
    uint64_t q, r;

    if (bytes_per_us == 0 || nbytes == 0)
        return 0;
    q = nbytes / bytes_per_us;
    r = nbytes % bytes_per_us;
    if (q > (uint64_t)KB_TIME_MAX / KB_PS_PER_US_)
        return KB_TIME_MAX;
    return add_sat((kb_time)(q * KB_PS_PER_US_), (kb_time)ceil_mul_1e6_div(r, bytes_per_us));
}

/*
 * Non-positive or NaN bandwidth means infinite (bytes_per_us = 0); a positive one rounds to
 * at least 1 byte/us so that a tiny bandwidth never turns into an infinite one.
 */
void kb_res_init(kb_res *r, const char *name, double bandwidth_gbps, kb_time latency,
                 kb_time fixed)
{
    double bpu = bandwidth_gbps * 1000.0;

    r->free_at = 0;
    r->hole_lo = r->hole_hi = 0;
    r->ordered = 0;
    r->fixed = fixed;
    r->latency = latency;
    if (!(bpu > 0.0))
        r->bytes_per_us = 0;
    else if (bpu >= 9.0e18)
        r->bytes_per_us = UINT64_C(9000000000000000000);
    else if (bpu < 1.0)
        r->bytes_per_us = 1;
    else
        r->bytes_per_us = (uint64_t)llround(bpu);
    r->bytes = 0;
    r->busy = 0;
    r->name = name;
    r->part_end = 0;
    r->memo_key = 0;
    r->memo_occ = 0;
}

kb_time kb_res_occupancy(const kb_res *r, uint64_t nbytes)
{
    return add_sat(r->fixed, kb_bw_time(r->bytes_per_us, nbytes));
}

/* kb_res_occupancy through the resource's one-entry memo (reservations only). */
static KB_RES_NOINLINE kb_time occupancy_compute(kb_res *r, uint64_t nbytes)
{
    if (nbytes >= UINT32_MAX)
        return kb_res_occupancy(r, nbytes);
    r->memo_occ = kb_res_occupancy(r, nbytes);
    r->memo_key = (uint32_t)nbytes + 1;
    return r->memo_occ;
}

/* In line: the hit is a compare and a load, less than a call's own cost. */
static KB_RES_INLINE kb_time occupancy_memo(kb_res *r, uint64_t nbytes)
{
    return r->memo_key == nbytes + 1 ? r->memo_occ : occupancy_compute(r, nbytes);
}

/* add_sat for operands known to be >= 0 (times, occupancies, latencies): branch-free. */
static kb_time add_nn(kb_time a, kb_time b)
{
    uint64_t s = (uint64_t)a + (uint64_t)b; /* < 2^64: both are <= KB_TIME_MAX */
    assert(a >= 0 && b >= 0);
    return s > (uint64_t)KB_TIME_MAX ? KB_TIME_MAX : (kb_time)s;
}

static void account(kb_res *r, uint64_t nbytes, kb_time occ)
{
    r->bytes += nbytes;
    r->busy = add_nn(r->busy, occ);
}

void kb_res_set_ordered(kb_res *r)
{
    r->ordered = 1;
    r->hole_lo = r->hole_hi = 0;
}

/* Earliest start >= t at which r can take occ: t itself when r is free by then, a start inside
 * its idle gap when the use fits there, else the end of its reservations. */
static kb_time earliest(const kb_res *r, kb_time t, kb_time occ)
{
    if (r->free_at <= t)
        return t;
    kb_time e = r->hole_lo > t ? r->hole_lo : t;
    if (e < r->hole_hi && r->hole_hi - e >= occ)
        return e;
    return r->free_at;
}

/* Books [start, start + occ) on r: at or after free_at (the gap before it becomes the hole,
 * unless r is ordered), or inside the hole (its later remainder stays a hole: requests come
 * in time order; its earlier part when nothing is left after). */
static void book(kb_res *r, kb_time start, kb_time occ)
{
    kb_time end = add_nn(start, occ);
    if (start >= r->free_at) {
        if (start > r->free_at && !r->ordered) {
            r->hole_lo = r->free_at;
            r->hole_hi = start;
        }
        r->free_at = end;
    } else if (end < r->hole_hi) {
        r->hole_lo = end;
    } else {
        r->hole_hi = start;
    }
    /* the one idle gap lies before the end of the reservations */
    assert(r->hole_lo <= r->hole_hi && r->hole_hi <= r->free_at);
}

/* 1 when r's gap can take occ at some start >= t (kb_res_set_ordered: never). */
static int gap_fits(const kb_res *r, kb_time t, kb_time occ)
{
    kb_time e = r->hole_lo > t ? r->hole_lo : t;
    return e < r->hole_hi && r->hole_hi - e >= occ;
}

/*
 * The earliest t >= from at which every resource of the path can take its share, idle gaps
 * included: each round moves t to the latest of the resources' earliest starts, which only
 * moves later; a few rounds reach it, else the first-come first-served start (fifo, where all
 * are free). Out of line: only requests that would wait and may fit a gap come here.
 */
static KB_RES_NOINLINE kb_time backfill(kb_res *const *path, int n_path, kb_time from,
                                        uint64_t nbytes, kb_time fifo)
{
    kb_time t = from;
    for (int it = 0; it < 4; it++) {
        kb_time u = t;
        for (int i = 0; i < n_path; i++) {
            kb_time e = earliest(path[i], t, occupancy_memo(path[i], nbytes));
            u = e > u ? e : u;
        }
        if (u == t)
            return t;
        t = u;
    }
    return fifo;
}

kb_time kb_res_path_reserve(kb_res *const *path, int n_path, kb_time now, uint64_t nbytes,
                            kb_time *t_start)
{
    kb_time fifo = now, blocked = now, lat = 0, occ_max = 0;

    /* with thousands of PEs the resources' lines are cold: ask for them all at once, before
     * the loop's branches on their times can serialize the misses */
    for (int i = 0; i < n_path; i++)
        __builtin_prefetch(path[i], 1);
    /* fifo: where every resource is free; blocked: no start before the end of a busy
     * resource whose gap cannot take this use at any time from now on */
    for (int i = 0; i < n_path; i++) {
        const kb_res *r = path[i];
        assert(r);
        if (r->free_at > now) {
            fifo = r->free_at > fifo ? r->free_at : fifo;
            if (r->free_at > blocked && !gap_fits(r, now, occupancy_memo(path[i], nbytes)))
                blocked = r->free_at;
        }
    }
    kb_time start = blocked < fifo ? backfill(path, n_path, blocked, nbytes, fifo) : fifo;
    assert(start >= now); /* nothing is booked in the past */
    for (int i = 0; i < n_path; i++) {
        kb_res *r = path[i];
        kb_time occ = occupancy_memo(r, nbytes);
        book(r, start, occ);
        account(r, nbytes, occ);
        lat = add_nn(lat, r->latency);
        occ_max = occ > occ_max ? occ : occ_max;
    }
    if (t_start)
        *t_start = start;
    return add_nn(add_nn(start, lat), occ_max);
}

kb_time kb_res_hop(kb_res *r, kb_time t_arrive, uint64_t nbytes)
{
    kb_time start = r->free_at > t_arrive ? r->free_at : t_arrive;
    kb_time occ = occupancy_memo(r, nbytes);

    book(r, start, occ);
    account(r, nbytes, occ);
    return add_nn(add_nn(start, occ), r->latency);
}
