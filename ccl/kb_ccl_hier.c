/*
 * kb_ccl_hier — the lanes forms of hierarchical_allreduce, for tiles that stream on a world of
 * whole cubes (and whole SIPs beyond one) wired by hierarchical_lanes: a chain form for long
 * tiles, a ring form for the others.
 *
 * Chain form (a world of several SIPs, a tile of at least F slots on F PEs per SIP): the PEs
 * of each SIP form one flat ring (kb_topo_cube_ring's cube order, each cube's PEs in index
 * order; KB_LANES_NEXT / KB_LANES_PREV), whose place 0 is the gateway: the PE of cube 0 at
 * the router of the inter-SIP links. The tile streams in slices of one slot of f32 down a
 * reduce chain from place 1 round to the gateway (each PE adds its own slice to the running
 * sum and sends it on in f32), the gateway gathers the SIP's sums in blocks, its
 * cross-SIP threads reduce-scatter each block among the S gateways (f32) and all-gather it
 * back in the tile's dtype (each gateway rounds its piece once into the tile), and a broadcast
 * chain hands each finished block from the gateway back round the ring (each PE sends a slice
 * on from its receive slot while storing it into its tile). Why one gateway: every byte that
 * crosses SIPs is then one stream between two PEs at the SIPs' hub routers, with no NoC or
 * UCIe link on its route. When 128 PEs each queued their share for the inter-SIP link, each
 * transfer was reserved from when the link would take it, tens of µs ahead, and held its DMA
 * channel and the NoC and UCIe links of its route from then on in front of the in-SIP traffic
 * (timing-model §2.1, one idle gap per resource); the in-SIP rings stalled behind it and the
 * link idled half the time (efficiency 0.49 at 1 GiB on 256 ranks, docs/performance.md). Here
 * the gateway's DMA channels hold at most its three cross-SIP threads' next slices, and
 * the chains keep up with the link: a PE moves about 10 bytes per tile element over its DMA
 * channels and adds one element, the gateway 9 bytes and 1.5 elements, against 1.5 bytes per
 * tile byte on the link. The price is the chains' fill and drain, 2F hops of a slice each
 * (about 0.3 ms on 256 ranks), which is why short tiles take the ring form.
 *
 * Ring form (shorter tiles): the tile is cut into blocks. A block is reduce-scattered in three
 * ring levels, every PE carrying an equal share at each: the P PEs of a cube (E/W), then each
 * PE's share among the PEs of its index in the SIP's C cubes (N/S), then that share's share
 * among the PEs at its place in the S SIPs (global_E/W); each PE then holds 1/(P*C*S) of the
 * block summed over the world, rounds it once into the tile, and three all-gathers in the
 * tile's dtype hand the pieces back out, level by level. Four threads per PE (tl_fork; NCCL's
 * channels) take the blocks in turn: threads 0 and 1 on the named directions, in opposite
 * directions round each ring (thread 0 sends E, N, global_E; thread 1 W, S, global_W), threads
 * 2 and 3 the same on the peer directions that hierarchical_lanes wires as a second copy (two
 * threads when they are not wired). Each thread starts once the one before it has reduced its
 * first block inside the SIP. A PE's share of a block lives in scratch
 * (KB_CCL_HIER_SHARE_BYTES of f32 per thread), which sets the block size.
 *
 * Both: partial sums travel in f32 (the sums of the seeded data are exact, so every PE ends
 * with the same bits as the plain sum); finished values move in the tile's dtype. Rings run
 * step by step as ring_rsag's streamed form does: slices of one slot, a window of them in
 * flight, received partials read in place, sends posted.
 * Limits: sum only (the rank = PE registry does not mark hierarchical_allreduce typed); runs
 * only with posted sends (ccl.yaml posted_sends), a tile past kb_ccl_stream_block and a
 * whole world; the caller takes the chain-of-leaders form (kb_ccl_algos.c) otherwise.
 */
#include "kb_ccl.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "kb_runtime_ext.h"
#include "kb_sync.h"

#define KB_CCL_HIER_SHARE_BYTES ((uint64_t)1 << 20)
#define HIER_MAX_SLICES 64
#define HIER_PREFETCH 2   /* own slices loaded ahead: two loads on two DMA channels at once */
/* The gateway's cross-SIP threads: a block's reduce-scatter, add and all-gather take about
 * three of its link times end to end, so two threads leave the link idle (efficiency 0.71 at
 * 64 MiB on 256 ranks against 0.78 with three); a fourth gains nothing. */
#define HIER_XTHREADS 3
/* Its block buffers (f32): one being summed, the others crossing. */
#define HIER_XBUFS (2 * HIER_XTHREADS)
/* Gateway blocks of this many reduce-chain slices (128 Ki elements at 128 KiB slots): a
 * block's cross-SIP messages fill the queues' windows of 4 slots. */
#define HIER_XBLOCK_SLICES 4

/* One level's ring as a thread runs it: g members, this PE at v along the ring's direction
 * (it sends to v + 1 on `out` and receives from v - 1 on `in`). */
typedef struct hring {
    int64_t g, v;
    kb_dir out, in;
    uint64_t slot; /* bytes per slice (f32 ones: slot / 4 elements) */
    int64_t win;   /* slices in flight per step */
} hring;

/* What the PE's threads share. */
typedef struct hier {
    const kb_kargs *a;
    kb_va tile;
    kb_dtype dt;
    int op;
    int64_t n;                /* tile elements */
    /* the ring form */
    int64_t nb, nblk;         /* elements per block, blocks */
    int64_t P, C, p, c;       /* PEs per cube, cubes per SIP; this PE's place in them */
    int nt;                   /* threads: 2, or 4 with the peer directions wired */
    /* both */
    int64_t S, s;             /* SIPs; this PE's */
    /* the chain form */
    int64_t F, f;             /* PEs per SIP (the flat ring); this PE's place on it */
    uint64_t slot;
    int64_t win;              /* slices in flight per queue: the queues' slot count */
    int64_t wr, wb;           /* elements per slice: reduce chain (a slot of f32), broadcast */
    int64_t xb, nxb;          /* gateway blocks: elements each, count */
    kb_val buf[HIER_XBUFS];   /* the gateway's block sums (f32), block b in buf[b % XBUFS] */
    kb_signal *ready, *done;  /* per block: summed in the SIP; final in the gateway's tile */
} hier;

/* A reduce-scatter's own data: the tile (dt, loaded slice by slice) or a local f32 value. */
typedef struct hsrc {
    int local;
    kb_va va;     /* tile: the region's first element */
    kb_val buf;   /* local: the region, 1 x len */
} hsrc;

static kb_val slice_view(kb_tl *tl, kb_val v, int64_t off, int64_t len)
{
    return tl_view(tl, v, 0, (uint32_t)off, 1, (uint32_t)len);
}

/* Elements of slice j of chunk c of a region of len elements cut g ways (0 past its end);
 * its offset in the region. */
static int64_t hslice(int64_t len, int64_t g, int64_t c, int64_t W, int64_t j, int64_t *off)
{
    uint32_t co, cl;
    kb_ccl_chunk(len, g, ((c % g) + g) % g, &co, &cl);
    int64_t sl = kb_ccl_piece((int64_t)cl, W, j, off);
    *off += (int64_t)co;
    return sl;
}

static int64_t chunk_len(int64_t len, int64_t g, int64_t c)
{
    uint32_t co, cl;
    kb_ccl_chunk(len, g, ((c % g) + g) % g, &co, &cl);
    return (int64_t)cl;
}

/* Own slice j of chunk c: a load started now from the tile (ready at *rdy), or a view. */
static kb_val own_slice(kb_tl *tl, const hier *h, const hsrc *src, int64_t len, int64_t g,
                        int64_t c, int64_t W, int64_t j, int64_t *rdy)
{
    int64_t off, sl = hslice(len, g, c, W, j, &off);
    if (src->local) {
        *rdy = 0;
        return slice_view(tl, src->buf, off, sl);
    }
    return tl_load_async(tl, kb_ccl_elem_va(src->va, off, h->dt), KB_SHAPE1(sl), h->dt, rdy);
}

/* The (step, slice) after (*s, *j) in a pass over slices [s0, s0 + k) whose slice of chunk
 * v-s-1 exists; 0 past the last step. */
static int rs_next(int64_t len, int64_t g, int64_t v, int64_t W, int64_t s0, int64_t k,
                   int64_t *s, int64_t *j)
{
    int64_t off;
    for (;;) {
        if (++*j == k) {
            *j = 0;
            ++*s;
        }
        if (*s + 1 >= g)
            return 0;
        if (hslice(len, g, v - *s - 1, W, s0 + *j, &off) != 0)
            return 1;
    }
}

/*
 * Reduce-scatter of a region of len elements over ring R (rsag_block's schedule, f32
 * partials): step 0 sends chunk v (raw from the tile in its dtype, or f32 from a local
 * region); step s receives chunk v-s-1's partial, adds the own slice and sends it on; in the
 * last step chunk v+1's total goes into res (1 x its length; may be the local region's own
 * view of that chunk: the sum is made in place).
 */
static void h_rs(kb_tl *tl, const hier *h, const hring *R, int64_t len, const hsrc *src,
                 kb_val res)
{
    int64_t g = R->g, v = R->v, W = (int64_t)(R->slot / 4u), off, sl;
    kb_dtype raw = src->local ? KB_F32 : h->dt; /* step 0's messages */
    int64_t maxc = chunk_len(len, g, 0), nsl = (maxc + W - 1) / W;
    int64_t per = R->win < HIER_MAX_SLICES ? R->win : HIER_MAX_SLICES;
    kb_ipcq_req *rq[HIER_MAX_SLICES];

    assert(g >= 2 && per >= 1); /* a level of one member has no ring: the callers skip it */
    for (int64_t s0 = 0; s0 < nsl; s0 += per) {
        int64_t k = nsl - s0 < per ? nsl - s0 : per;
        /* own slices from the tile are loaded HIER_PREFETCH items ahead of their combine,
         * in the order the steps take them (slices of chunk v-s-1 that exist, by step) */
        kb_val pf[HIER_PREFETCH];
        int64_t pf_rdy[HIER_PREFETCH], ps = 0, pj = -1, pn = 0, ph = 0;
        for (; !src->local && pn < HIER_PREFETCH && rs_next(len, g, v, W, s0, k, &ps, &pj);
             pn++)
            pf[pn] = own_slice(tl, h, src, len, g, v - ps - 1, W, s0 + pj, &pf_rdy[pn]);
        for (int64_t j = 0; j < k; j++) /* step 0's incoming: chunk v-1 */
            rq[j] = (sl = hslice(len, g, v - 1, W, s0 + j, &off)) != 0
                        ? tl_recv_view_async(tl, R->in, KB_SHAPE1(sl), raw) : NULL;
        for (int64_t j = 0; j < k; j++) {
            if ((sl = hslice(len, g, v, W, s0 + j, &off)) == 0)
                continue;
            kb_val mine = src->local ? slice_view(tl, src->buf, off, sl)
                                     : tl_ref(tl, kb_ccl_elem_va(src->va, off, h->dt),
                                              KB_SHAPE1(sl), h->dt);
            kb_ccl_send(tl, R->out, mine);
        }
        for (int64_t s = 0; s + 1 < g; s++) {
            int64_t c = v - s - 1, last = s + 2 == g;
            for (int64_t j = 0; j < k; j++) {
                if (!rq[j])
                    continue;
                int64_t rdy;
                kb_val own;
                if (src->local) {
                    own = own_slice(tl, h, src, len, g, c, W, s0 + j, &rdy);
                } else { /* the oldest prefetched one is this slice's; the next one starts */
                    own = pf[ph];
                    rdy = pf_rdy[ph];
                    if (rs_next(len, g, v, W, s0, k, &ps, &pj))
                        pf[ph] = own_slice(tl, h, src, len, g, v - ps - 1, W, s0 + pj,
                                           &pf_rdy[ph]);
                    ph = (ph + 1) % HIER_PREFETCH;
                }
                kb_val in = tl_wait(tl, rq[j]);
                tl_wait_time(tl, rdy);
                if (last) { /* chunk v+1's total, into its place in res */
                    int64_t o0;
                    (void)hslice(len, g, c, W, 0, &o0);
                    sl = hslice(len, g, c, W, s0 + j, &off);
                    tl_binary_into(tl, KB_BIN_ADD, slice_view(tl, res, off - o0, sl), own, in);
                    tl_recv_release(tl, R->in, in);
                    rq[j] = NULL;
                } else {
                    kb_val red = kb_ccl_combine(tl, h->op, own, in);
                    tl_recv_release(tl, R->in, in);
                    rq[j] = (sl = hslice(len, g, c - 1, W, s0 + j, &off)) != 0
                                ? tl_recv_view_async(tl, R->in, KB_SHAPE1(sl), KB_F32) : NULL;
                    kb_ccl_send_free(tl, R->out, red);
                }
                if (!src->local)
                    tl_free(tl, own);
            }
            /* slices the next chunk has beyond this one's (chunks differ by one element) */
            for (int64_t j = 0; !last && j < k; j++)
                if (!rq[j] && hslice(len, g, c, W, s0 + j, &off) == 0 &&
                    (sl = hslice(len, g, c - 1, W, s0 + j, &off)) != 0)
                    rq[j] = tl_recv_view_async(tl, R->in, KB_SHAPE1(sl), KB_F32);
        }
    }
}

/* All-gather of the tile region [base, base + len) over ring R in the tile's dtype: this PE
 * holds chunk v+1; step s forwards the chunk it received last, each slice as it lands. */
static void h_ag(kb_tl *tl, const hier *h, const hring *R, kb_va base, int64_t len)
{
    int64_t g = R->g, v = R->v, W = (int64_t)(R->slot / kb_dtype_size(h->dt)), off, sl;
    int64_t maxc = chunk_len(len, g, 0), nsl = (maxc + W - 1) / W;
    int64_t per = R->win < HIER_MAX_SLICES ? R->win : HIER_MAX_SLICES;
    kb_ipcq_req *rq[HIER_MAX_SLICES];

    assert(g >= 2 && per >= 1);
    for (int64_t s0 = 0; s0 < nsl; s0 += per) {
        int64_t k = nsl - s0 < per ? nsl - s0 : per;
        for (int64_t j = 0; j < k; j++)
            rq[j] = (sl = hslice(len, g, v, W, s0 + j, &off)) != 0
                        ? tl_recv_into_async(tl, R->in, kb_ccl_elem_va(base, off, h->dt),
                                             KB_SHAPE1(sl), h->dt)
                        : NULL;
        for (int64_t j = 0; j < k; j++)
            if ((sl = hslice(len, g, v + 1, W, s0 + j, &off)) != 0)
                kb_ccl_send(tl, R->out, tl_ref(tl, kb_ccl_elem_va(base, off, h->dt),
                                               KB_SHAPE1(sl), h->dt));
        for (int64_t s = 0; s + 1 < g; s++) {
            int64_t c = v - s, last = s + 2 == g;
            for (int64_t j = 0; j < k; j++) {
                if (!rq[j])
                    continue;
                (void)tl_wait(tl, rq[j]);
                rq[j] = NULL;
                if (last)
                    continue;
                if ((sl = hslice(len, g, c - 1, W, s0 + j, &off)) != 0)
                    rq[j] = tl_recv_into_async(tl, R->in, kb_ccl_elem_va(base, off, h->dt),
                                               KB_SHAPE1(sl), h->dt);
                if ((sl = hslice(len, g, c, W, s0 + j, &off)) != 0)
                    kb_ccl_send(tl, R->out, tl_ref(tl, kb_ccl_elem_va(base, off, h->dt),
                                                   KB_SHAPE1(sl), h->dt));
            }
            for (int64_t j = 0; !last && j < k; j++)
                if (!rq[j] && hslice(len, g, c, W, s0 + j, &off) == 0 &&
                    (sl = hslice(len, g, c - 1, W, s0 + j, &off)) != 0)
                    rq[j] = tl_recv_into_async(tl, R->in, kb_ccl_elem_va(base, off, h->dt),
                                               KB_SHAPE1(sl), h->dt);
        }
    }
}

/* Ring of g members with this PE at physical index i, run forward or backward. */
static hring ring_of(const hier *h, int64_t g, int64_t i, int back, kb_dir fwd, kb_dir bwd)
{
    hring r = { g, back ? (g - i) % g : i, back ? bwd : fwd, back ? fwd : bwd, h->slot, h->win };
    assert(i >= 0 && i < g);
    return r;
}

/* A thread's start: each thread but the first starts once the one before it has reduced its
 * first block inside the SIP, so that the threads take turns on the inter-SIP link instead of
 * all waiting on it at once (started together they stay in step). */
typedef struct hthread {
    const hier *h;
    int t;
    kb_signal go;       /* fired by thread t - 1 */
    struct hthread *next;
} hthread;

/* One thread's blocks: b = t, t + 2, ... (every PE's thread t takes the same ones). */
static void hier_blocks(kb_tl *tl, const hier *h, int t, hthread *me)
{
    kb_sim *sim = tl_sim(tl);
    int back = t % 2, peer = t >= 2; /* threads 2 and 3: the peer directions' copy */
    hring L1 = ring_of(h, h->P, h->p, back, peer ? KB_LANES_PEER_E : KB_DIR_E,
                       peer ? KB_LANES_PEER_W : KB_DIR_W);
    hring L2 = ring_of(h, h->C, h->c, back, peer ? KB_LANES_PEER_N : KB_DIR_N,
                       peer ? KB_LANES_PEER_S : KB_DIR_S);
    hring L3 = ring_of(h, h->S, h->s, back, peer ? KB_LANES_PEER_GE : KB_DIR_GLOBAL_E,
                       peer ? KB_LANES_PEER_GW : KB_DIR_GLOBAL_W);
    int64_t smax = (h->nb + h->P - 1) / h->P;
    kb_val share = kb_tl_scratch_val(tl, 1, (uint32_t)smax, KB_F32, "hierarchical_allreduce");
    int first = 1;
    if (t > 0)
        kb_signal_wait(sim, &me->go);

    for (int64_t b = t; b < h->nblk; b += h->nt) {
        int64_t b0, nb = kb_ccl_piece(h->n, h->nb, b, &b0);
        uint32_t o1 = 0, l1 = (uint32_t)nb, o2 = 0, l2, o3 = 0, l3;
        kb_va blk = kb_ccl_elem_va(h->tile, b0, h->dt);
        if (h->P > 1) {
            kb_ccl_chunk(nb, h->P, (L1.v + 1) % h->P, &o1, &l1);
            assert(l1 <= smax); /* the PE's chunk of the block fits its share buffer */
            hsrc src = { 0, blk, { 0 } };
            if (l1)
                h_rs(tl, h, &L1, nb, &src, slice_view(tl, share, 0, l1));
            else
                h_rs(tl, h, &L1, nb, &src, share); /* takes part; holds nothing */
        } else { /* one PE per cube: its block, in f32 */
            kb_val x = tl_load(tl, blk, KB_SHAPE1(nb), h->dt), z = tl_full(tl, KB_SHAPE1(1), 0.0f);
            tl_binary_into(tl, KB_BIN_ADD, slice_view(tl, share, 0, nb), x, z);
            tl_free(tl, x);
            tl_free(tl, z);
        }
        l2 = l1;
        if (h->C > 1) {
            kb_ccl_chunk(l1, h->C, (L2.v + 1) % h->C, &o2, &l2);
            hsrc src = { 1, 0, l1 ? slice_view(tl, share, 0, l1) : share };
            h_rs(tl, h, &L2, l1, &src, l2 ? slice_view(tl, share, o2, l2) : share);
        }
        l3 = l2;
        if (h->S > 1) {
            kb_ccl_chunk(l2, h->S, (L3.v + 1) % h->S, &o3, &l3);
            hsrc src = { 1, 0, l2 ? slice_view(tl, share, o2, l2) : share };
            h_rs(tl, h, &L3, l2, &src, l3 ? slice_view(tl, share, o2 + o3, l3) : share);
        }
        if (first && me->next)
            kb_signal_fire(sim, &me->next->go);
        first = 0;
        /* this PE's piece of the block is complete: rounded once into the tile */
        if (l3)
            tl_store(tl, kb_ccl_elem_va(blk, (int64_t)o1 + o2 + o3, h->dt),
                     slice_view(tl, share, o2 + o3, l3));
        if (h->S > 1)
            h_ag(tl, h, &L3, kb_ccl_elem_va(blk, (int64_t)o1 + o2, h->dt), l2);
        if (h->C > 1)
            h_ag(tl, h, &L2, kb_ccl_elem_va(blk, o1, h->dt), l1);
        if (h->P > 1)
            h_ag(tl, h, &L1, blk, nb);
    }
    if (first && me->next) /* no block at all */
        kb_signal_fire(sim, &me->next->go);
    tl_free(tl, share);
}

static void hier_thread(kb_tl *tl, void *arg)
{
    hthread *ht = arg;
    hier_blocks(tl, ht->h, ht->t, ht);
}

/* The reduce chain (every PE's main thread): chain member i = f - 1 (mod F) receives slice j
 * of the running sum from member i - 1, adds its own slice and sends it on in f32; the head
 * (f = 1) sends its raw slices, the gateway (f = 0, the last member) adds into the block's
 * buffer and hands each full block to the cross-SIP threads. */
static void hier_reduce(kb_tl *tl, hier *h)
{
    kb_sim *sim = tl_sim(tl);
    int64_t i = (h->f + h->F - 1) % h->F, W = h->wr, nsl = (h->n + W - 1) / W, off, sl;
    int gw = i == h->F - 1;
    kb_dir out = KB_LANES_NEXT, in = KB_LANES_PREV;
    if (i == 0) {
        for (int64_t j = 0; j < nsl; j++) {
            sl = kb_ccl_piece(h->n, W, j, &off);
            kb_ccl_send(tl, out, tl_ref(tl, kb_ccl_elem_va(h->tile, off, h->dt), KB_SHAPE1(sl),
                                        h->dt));
        }
        return;
    }
    kb_dtype idt = i == 1 ? h->dt : KB_F32;
    int64_t per = h->win < HIER_MAX_SLICES ? h->win : HIER_MAX_SLICES;
    kb_ipcq_req *rq[HIER_MAX_SLICES];
    kb_val pf[HIER_PREFETCH];
    int64_t prdy[HIER_PREFETCH];
    for (int64_t j = 0; j < per && j < nsl; j++)
        rq[j] = tl_recv_view_async(tl, in, KB_SHAPE1(kb_ccl_piece(h->n, W, j, &off)), idt);
    for (int64_t j = 0; j < HIER_PREFETCH && j < nsl; j++) {
        sl = kb_ccl_piece(h->n, W, j, &off);
        pf[j] = tl_load_async(tl, kb_ccl_elem_va(h->tile, off, h->dt), KB_SHAPE1(sl), h->dt,
                              &prdy[j]);
    }
    for (int64_t j = 0; j < nsl; j++) {
        sl = kb_ccl_piece(h->n, W, j, &off);
        int64_t b = off / h->xb;
        /* a gateway block is whole slices: a slice never straddles two of them */
        assert(b < h->nxb && (off + sl - 1) / h->xb == b);
        if (gw && off % h->xb == 0 && b >= HIER_XBUFS) /* the buffer's last block is out */
            kb_signal_wait(sim, &h->done[b - HIER_XBUFS]);
        kb_val own = pf[j % HIER_PREFETCH];
        int64_t rdy = prdy[j % HIER_PREFETCH];
        kb_val v = tl_wait(tl, rq[j % per]);
        tl_wait_time(tl, rdy);
        kb_val red = { 0 };
        if (gw)
            tl_binary_into(tl, KB_BIN_ADD, slice_view(tl, h->buf[b % HIER_XBUFS], off - b * h->xb,
                                                      sl), own, v);
        else
            red = kb_ccl_combine(tl, h->op, own, v);
        tl_recv_release(tl, in, v);
        tl_free(tl, own);
        int64_t o2, s2;
        if (j + per < nsl)
            rq[j % per] = tl_recv_view_async(
                tl, in, KB_SHAPE1(kb_ccl_piece(h->n, W, j + per, &o2)), idt);
        if (j + HIER_PREFETCH < nsl) {
            s2 = kb_ccl_piece(h->n, W, j + HIER_PREFETCH, &o2);
            pf[j % HIER_PREFETCH] = tl_load_async(tl, kb_ccl_elem_va(h->tile, o2, h->dt),
                                                  KB_SHAPE1(s2), h->dt, &prdy[j % HIER_PREFETCH]);
        }
        if (!gw)
            kb_ccl_send_free(tl, out, red);
        else if (off + sl == h->n || (off + sl) % h->xb == 0) /* the block is summed */
            kb_signal_fire(sim, &h->ready[b]);
    }
}

/* A gateway's cross-SIP thread t: blocks b = t, t + HIER_XTHREADS, ... once summed inside
 * the SIP, reduce-scattered among the S gateways (f32), each gateway's piece rounded once into
 * the tile, all-gathered back in the tile's dtype. Threads 0 and 1 run the gateways' ring in
 * opposite directions on global_E/W, thread 2 on their peer copy. */
typedef struct hx {
    hier *h;
    int t;
} hx;

static void hier_cross(kb_tl *tl, void *arg)
{
    hx *x = arg;
    hier *h = x->h;
    kb_sim *sim = tl_sim(tl);
    int t = x->t, back = t % 2, copy = t / 2 % 2;
    hring L = ring_of(h, h->S, h->s, back, copy ? KB_LANES_PEER_GE : KB_DIR_GLOBAL_E,
                      copy ? KB_LANES_PEER_GW : KB_DIR_GLOBAL_W);
    for (int64_t b = t; b < h->nxb; b += HIER_XTHREADS) {
        kb_signal_wait(sim, &h->ready[b]);
        int64_t b0, len = kb_ccl_piece(h->n, h->xb, b, &b0);
        kb_val bv = h->buf[b % HIER_XBUFS];
        kb_va blk = kb_ccl_elem_va(h->tile, b0, h->dt);
        uint32_t o3, l3;
        kb_ccl_chunk(len, h->S, (L.v + 1) % h->S, &o3, &l3);
        hsrc src = { 1, 0, slice_view(tl, bv, 0, len) };
        h_rs(tl, h, &L, len, &src, l3 ? slice_view(tl, bv, o3, l3) : bv);
        if (l3)
            tl_store(tl, kb_ccl_elem_va(blk, o3, h->dt), slice_view(tl, bv, o3, l3));
        h_ag(tl, h, &L, blk, len);
        kb_signal_fire(sim, &h->done[b]);
    }
}

/* The broadcast chain: the gateway sends each finished block on toward f = F - 1, F - 2, ...,
 * every PE receives it into its tile and forwards it, but the last (f = 1). */
static void hier_bcast(kb_tl *tl, void *arg)
{
    hier *h = arg;
    kb_sim *sim = tl_sim(tl);
    int64_t W = h->wb, nsl = (h->n + W - 1) / W, off, sl;
    kb_dir out = KB_LANES_PREV, in = KB_LANES_NEXT;
    if (h->f == 0) {
        for (int64_t j = 0; j < nsl; j++) {
            sl = kb_ccl_piece(h->n, W, j, &off);
            if (off % h->xb == 0)
                kb_signal_wait(sim, &h->done[off / h->xb]);
            kb_ccl_send(tl, out, tl_ref(tl, kb_ccl_elem_va(h->tile, off, h->dt), KB_SHAPE1(sl),
                                        h->dt));
        }
        return;
    }
    /* each slice read in place: sent on from the slot while it is stored into the tile */
    int64_t per = h->win < HIER_MAX_SLICES ? h->win : HIER_MAX_SLICES;
    kb_ipcq_req *rq[HIER_MAX_SLICES];
    for (int64_t j = 0; j < per && j < nsl; j++)
        rq[j] = tl_recv_view_async(tl, in, KB_SHAPE1(kb_ccl_piece(h->n, W, j, &off)), h->dt);
    for (int64_t j = 0; j < nsl; j++) {
        sl = kb_ccl_piece(h->n, W, j, &off);
        kb_val v = tl_wait(tl, rq[j % per]);
        int64_t sent = h->f != 1 ? tl_send_async(tl, out, v) : 0;
        tl_store(tl, kb_ccl_elem_va(h->tile, off, h->dt), v);
        tl_wait_time(tl, sent); /* the send has read the slot */
        tl_recv_release(tl, in, v);
        if (j + per < nsl)
            rq[j % per] = tl_recv_view_async(
                tl, in, KB_SHAPE1(kb_ccl_piece(h->n, W, j + per, &off)), h->dt);
    }
}

/* The ring form, h's levels (P, C, S and this PE's s) set: its ring places, slots and
 * blocks, then its threads. */
static void hier_ring_form(kb_tl *tl, hier *h, const kb_ccl_geom *geo, int cubes, int64_t r)
{
    h->p = r % h->P;
    h->c = kb_topo_cube_pos((int)(r / h->P % h->C), (int)h->C, h->C == cubes ? geo->mesh_w : 0);
    h->slot = tl_slot_size(tl, KB_DIR_W);
    h->win = (int64_t)tl_slot_count(tl, KB_DIR_W);
    if (h->P < 2) {
        h->slot = tl_slot_size(tl, h->C > 1 ? KB_DIR_S : KB_DIR_GLOBAL_W);
        h->win = (int64_t)tl_slot_count(tl, h->C > 1 ? KB_DIR_S : KB_DIR_GLOBAL_W);
    }
    h->nb = (int64_t)(KB_CCL_HIER_SHARE_BYTES / 4u) * h->P;
    if (h->nb > h->n)
        h->nb = h->n;
    h->nblk = (h->n + h->nb - 1) / h->nb;
    kb_dir probe = h->P > 1 ? KB_LANES_PEER_W : h->C > 1 ? KB_LANES_PEER_S : KB_LANES_PEER_GW;
    h->nt = kb_ipcq_is_wired(tl_ctx(tl), tl_pe(tl), probe) ? 4 : 2;
    hthread ht[4];
    kb_tl *th[4] = { NULL };
    int nt = h->nblk < h->nt ? (int)h->nblk : h->nt;
    for (int t = 0; t < nt; t++) {
        ht[t].h = h;
        ht[t].t = t;
        kb_signal_init(&ht[t].go);
        ht[t].next = t + 1 < nt ? &ht[t + 1] : NULL;
    }
    for (int t = 1; t < nt; t++)
        th[t] = tl_fork(tl, hier_thread, &ht[t]);
    hier_blocks(tl, h, 0, &ht[0]);
    for (int t = 1; t < h->nt; t++)
        if (th[t])
            tl_join(tl, th[t]);
}

int kb_ccl_hier_lanes(kb_tl *tl, const kb_kargs *a, kb_va mine, int64_t n)
{
    int cubes = tl_num_programs(tl, 1);
    const kb_machine *m = kb_ctx_machine(tl_ctx(tl));
    kb_ccl_geom geo = { m->npes, cubes, 0, m->mesh_w }; /* as kb_ccl_install builds it */
    int64_t ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl);
    int P, C, S;
    hier h;

    if (!(a->i[KB_CCL_ARG_FLAGS] & KB_CCL_FLAG_LANES) || !kb_ipcq_posted(tl_ctx(tl)) ||
        !kb_ccl_stream_block(tl, n, 4) || !kb_topo_lanes_shape((int)ws, &geo, &P, &C, &S))
        return 0;
    memset(&h, 0, sizeof h);
    h.a = a;
    h.tile = mine;
    h.dt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];
    h.op = (int)a->i[KB_CCL_ARG_OP];
    h.n = n;
    h.S = S, h.s = r / ((int64_t)P * C);
    h.P = P, h.C = C;
    h.F = (int64_t)P * C;
    /* the chain form exists to keep the inter-SIP link busy; on one SIP the ring form runs.
     * Across SIPs its fill and drain (2F hops of a slice) against the ring form's slower
     * steady state: the measured crossover lies near F slots per tile (8-16 MiB at 256
     * ranks). */
    if (h.F < 2 || S < 2 ||
        (uint64_t)n * kb_dtype_size(h.dt) < (uint64_t)h.F * tl_slot_size(tl, KB_LANES_NEXT)) {
        hier_ring_form(tl, &h, &geo, cubes, r);
        return 1;
    }
    h.slot = tl_slot_size(tl, KB_LANES_NEXT);
    h.f = kb_topo_lanes_flat_pos((int)r, &geo, P, C);
    h.win = (int64_t)tl_slot_count(tl, KB_LANES_NEXT);
    h.wr = (int64_t)(h.slot / 4u);
    /* broadcast slices of as many elements (half a slot of f16): a hop forwards a slice as
     * soon as it lands, so shorter ones drain the chain sooner (1 294 against 1 358 µs with
     * whole slots at 64 MiB on 256 ranks) */
    h.wb = h.wr;
    h.xb = HIER_XBLOCK_SLICES * h.wr; /* whole slices of both chains */
    h.nxb = (n + h.xb - 1) / h.xb;
    kb_tl *th[HIER_XTHREADS + 1];
    hx xs[HIER_XTHREADS];
    int nth = 0;
    if (h.f == 0) {
        h.ready = calloc((size_t)h.nxb, sizeof *h.ready);
        h.done = calloc((size_t)h.nxb, sizeof *h.done);
        if (!h.ready || !h.done)
            tl_fail(tl, KB_ERR_NOMEM, "hierarchical_allreduce: %lld block signals",
                    (long long)h.nxb);
        for (int64_t b = 0; b < h.nxb; b++) {
            kb_signal_init(&h.ready[b]);
            kb_signal_init(&h.done[b]);
        }
        for (int k = 0; k < HIER_XBUFS; k++)
            h.buf[k] = kb_tl_scratch_val(tl, 1, (uint32_t)h.xb, KB_F32, "hierarchical_allreduce");
        for (int t = 0; t < HIER_XTHREADS; t++) {
            xs[t].h = &h;
            xs[t].t = t;
            th[nth++] = tl_fork(tl, hier_cross, &xs[t]);
        }
    }
    th[nth++] = tl_fork(tl, hier_bcast, &h);
    hier_reduce(tl, &h);
    for (int t = 0; t < nth; t++)
        tl_join(tl, th[t]);
    if (h.f == 0) {
        for (int k = 0; k < HIER_XBUFS; k++)
            tl_free(tl, h.buf[k]);
        free(h.ready);
        free(h.done);
    }
    return 1;
}
