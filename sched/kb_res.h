/*
 * kb_res — bandwidth resources (links, memory ports, engines) reserved at request time.
 *
 * A resource has a fixed per-use occupancy (`fixed`, e.g. a CPU's per-message overhead), a
 * bandwidth (bytes per microsecond, i.e. GB/s x 1000, an integer so time stays integral) and a
 * latency that delays the end of a use without occupying the resource. Using it for n bytes
 * occupies it for fixed + ceil(n * 1e6 / bytes_per_us) ps.
 *
 * Reservations are made at request time, in request order, without queue events. Two ways to
 * use a chain:
 *  - kb_res_path_reserve(): a pipelined (cut-through) transfer over several resources at once:
 *    it starts at the earliest t >= now at which every resource of the path can take its own
 *    occupancy (each is busy for its occupancy from t); end = t + sum(latency) +
 *    max(occupancy). For an idle path with no fixed costs: end - now = sum(latency) +
 *    n / min(bandwidth), the closed form the docs state.
 *  - kb_res_hop(): one store-and-forward hop (a message through a CPU or a link), to chain.
 * A link or port is free after its last reservation (free_at) and in one idle gap before it
 * (the latest gap a reservation left, [hole_lo, hole_hi)): a transfer that has to wait for one
 * resource of its path books the others from that later start, which leaves them idle until
 * then, and a later path request that fits in such a gap on every resource of its path takes
 * it instead of queueing behind (a link serves whatever is ready while it is idle). Ordered
 * resources (kb_res_set_ordered: DMA engines) never fill gaps, and kb_res_hop (CPUs, compute
 * units, store-and-forward hops) serves in request order. Otherwise a busy resource serves
 * transfers first-come first-served.
 * No floating point; every duration rounds up to whole picoseconds.
 */
#ifndef KB_RES_H
#define KB_RES_H

#include <stdint.h>

#include "kb_time.h"

/*
 * Everything a reservation reads or writes is in the first cache line and the struct is
 * line-aligned, so a reservation costs one line per resource (with thousands of PEs each
 * such line is a cache miss): the gap, the ordered flag, the occupancy memo and the
 * statistics included. `fixed` and `bytes_per_us` are read only when the memo misses.
 */
typedef struct kb_res {
    _Alignas(64) kb_time free_at; /* when the current reservation ends */
    kb_time hole_lo, hole_hi; /* the latest idle gap before free_at (empty: hole_hi <= hole_lo) */
    kb_time latency;        /* added to the end of each use, ps; does not occupy */
    /* the last occupancy computed by a reservation: transfers repeat sizes, and the exact
     * division is the dearest part of a reservation. memo_key = nbytes + 1 (0 = none: a
     * zero-initialised resource has no memo; sizes of 4 GiB and more are never memoised).
     * Set fixed/bytes_per_us only via kb_res_init. */
    kb_time memo_occ;
    /* statistics */
    uint64_t bytes;
    kb_time busy;           /* total occupancy */
    uint32_t memo_key;
    uint32_t ordered;       /* serves strictly in request order, never fills a gap */
    /* second line: read when the memo misses */
    kb_time fixed;          /* occupancy per use, ps */
    uint64_t bytes_per_us;  /* 0 = infinite bandwidth */
    const char *name;       /* static or owned by whoever owns the resource */
    /* a route booked part by part ends a part after this resource (kb_machine: an inter-SIP
     * link under system.switch.arbitration per_sip); kb_res_init clears it */
    uint32_t part_end;
} kb_res;

/* gbps is GB/s (1e9 bytes/s = bytes/ns); fractional values are rounded to bytes/us. */
void kb_res_init(kb_res *r, const char *name, double bandwidth_gbps, kb_time latency,
                 kb_time fixed);

/* Makes r an engine that serves its uses strictly in request order (a DMA engine working
 * through its descriptors): a later request never starts before an earlier one, so messages
 * it carries on one route arrive in the order they were sent. */
void kb_res_set_ordered(kb_res *r);

/* Occupancy for n bytes: fixed + ceil(n * 1e6 / bytes_per_us) ps (exact integer math). */
kb_time kb_res_occupancy(const kb_res *r, uint64_t nbytes);

/* Pure transfer time of n bytes at bytes_per_us, rounded up (0 when bandwidth is infinite). */
kb_time kb_bw_time(uint64_t bytes_per_us, uint64_t nbytes);

/*
 * Reserves a pipelined transfer of n bytes over path[0..n_path) requested at `now`.
 * Returns the completion time; *t_start (may be NULL) receives the start time.
 */
kb_time kb_res_path_reserve(kb_res *const *path, int n_path, kb_time now, uint64_t nbytes,
                            kb_time *t_start);

/* One store-and-forward use: starts at max(t_arrive, free_at); returns start+occupancy+latency. */
kb_time kb_res_hop(kb_res *r, kb_time t_arrive, uint64_t nbytes);

#endif
