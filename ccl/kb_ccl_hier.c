/*
 * kb_ccl_hier — the lanes form of hierarchical_allreduce: bandwidth-optimal at every level
 * and pipelined, for tiles that stream on a world of whole cubes (and whole SIPs beyond one)
 * wired by hierarchical_lanes.
 *
 * The tile is cut into blocks. A block is reduce-scattered in three ring levels, every PE
 * carrying an equal share at each: the P PEs of a cube (E/W), then each PE's share among the
 * PEs of its index in the SIP's C cubes (N/S), then that share's share among the PEs at its
 * place in the S SIPs (global_E/W); each PE then holds 1/(P*C*S) of the block summed over the
 * world, rounds it once into the tile, and three all-gathers in the tile's dtype hand the
 * pieces back out, level by level. Partial sums travel in f32 (the sums of the seeded data are
 * exact, so every PE ends with the same bits as the plain sum); the all-gathers move the
 * tile's dtype. Each level is a ring step by step as ring_rsag's streamed form runs it:
 * slices of one slot, a window of them in flight, received partials read in place, sends
 * posted.
 *
 * Four threads per PE (tl_fork; NCCL's channels) take the blocks in turn: threads 0 and 1 on
 * the named directions, in opposite directions round each ring (thread 0 sends E, N,
 * global_E; thread 1 W, S, global_W), threads 2 and 3 the same on the peer directions that
 * hierarchical_lanes wires as a second copy (two threads when they are not wired). Each thread
 * starts once the one before it has reduced its first block inside the SIP, so that while
 * one waits on the slow level (the inter-SIP link) the others reduce their blocks inside the
 * cubes, and every link carries traffic both ways. A PE's share of a block lives in scratch
 * (KB_CCL_HIER_SHARE_BYTES of f32 per thread), which sets the block size. The cubes' ring
 * follows kb_topo_cube_ring (one UCIe hop per step).
 * What holds it back (docs/performance.md, "The interconnect"): a block's in-cube work is
 * about as long as its share of the inter-SIP link, and the threads' transfers queued for
 * that link are reserved from when it will take them, holding their DMA channel and their
 * NoC and UCIe links from then on in front of the in-cube traffic, so a thread takes several
 * times longer per block than alone and the link idles between the threads' turns
 * (efficiency about 0.5 at 1 GiB per rank on 256 ranks; a staged schedule and more idle
 * gaps per resource were tried, 0.49-0.62).
 * Limits: sum only (the rank = PE registry does not mark hierarchical_allreduce typed); runs
 * only with posted sends (ccl.yaml posted_sends), a tile past kb_ccl_stream_block and a
 * whole world; the caller takes the chain form otherwise.
 */
#include "kb_ccl.h"

#include <string.h>

#include "kb_runtime_ext.h"
#include "kb_sync.h"

#define KB_CCL_HIER_SHARE_BYTES ((uint64_t)1 << 20)
#define HIER_MAX_SLICES 64
#define HIER_PREFETCH 2   /* own slices loaded ahead: two loads on two DMA channels at once */

/* One level's ring as a thread runs it: g members, this PE at v along the ring's direction
 * (it sends to v + 1 on `out` and receives from v - 1 on `in`). */
typedef struct hring {
    int64_t g, v;
    kb_dir out, in;
} hring;

/* What the PE's threads share (read-only once set). */
typedef struct hier {
    const kb_kargs *a;
    kb_va tile;
    kb_dtype dt;
    int op;
    int64_t n, nb, nblk;      /* tile elements, elements per block, blocks */
    int64_t P, C, S, p, c, s; /* levels and this PE's place in them */
    uint64_t slot;
    int64_t win;              /* slices in flight per ring step: the queues' slot count */
    int nt;                   /* threads: 2, or 4 with the peer directions wired */
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
    int64_t g = R->g, v = R->v, W = (int64_t)(h->slot / 4u), off, sl;
    kb_dtype raw = src->local ? KB_F32 : h->dt; /* step 0's messages */
    int64_t maxc = chunk_len(len, g, 0), nsl = (maxc + W - 1) / W;
    int64_t per = h->win < HIER_MAX_SLICES ? h->win : HIER_MAX_SLICES;
    kb_ipcq_req *rq[HIER_MAX_SLICES];

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
    int64_t g = R->g, v = R->v, W = (int64_t)(h->slot / kb_dtype_size(h->dt)), off, sl;
    int64_t maxc = chunk_len(len, g, 0), nsl = (maxc + W - 1) / W;
    int64_t per = h->win < HIER_MAX_SLICES ? h->win : HIER_MAX_SLICES;
    kb_ipcq_req *rq[HIER_MAX_SLICES];

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

/* Ring of g members with this PE at physical index i, run forward (thread 0) or backward. */
static hring ring_of(int64_t g, int64_t i, int back, kb_dir fwd, kb_dir bwd)
{
    hring r = { g, back ? (g - i) % g : i, back ? bwd : fwd, back ? fwd : bwd };
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
    kb_sim *sim = kb_ctx_sim(tl_ctx(tl));
    int back = t % 2, peer = t >= 2; /* threads 2 and 3: the peer directions' copy */
    hring L1 = ring_of(h->P, h->p, back, peer ? KB_DIR_PEER(0) : KB_DIR_E,
                       peer ? KB_DIR_PEER(5) : KB_DIR_W);
    hring L2 = ring_of(h->C, h->c, back, peer ? KB_DIR_PEER(1) : KB_DIR_N,
                       peer ? KB_DIR_PEER(4) : KB_DIR_S);
    hring L3 = ring_of(h->S, h->s, back, peer ? KB_DIR_PEER(2) : KB_DIR_GLOBAL_E,
                       peer ? KB_DIR_PEER(3) : KB_DIR_GLOBAL_W);
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
    h.P = P, h.C = C, h.S = S;
    h.p = r % P, h.s = r / (P * C);
    h.c = kb_topo_cube_pos((int)(r / P % C), C, C == cubes ? geo.mesh_w : 0); /* its ring step */
    h.slot = tl_slot_size(tl, KB_DIR_W);
    h.win = (int64_t)tl_slot_count(tl, KB_DIR_W);
    if (P < 2) {
        h.slot = tl_slot_size(tl, C > 1 ? KB_DIR_S : KB_DIR_GLOBAL_W);
        h.win = (int64_t)tl_slot_count(tl, C > 1 ? KB_DIR_S : KB_DIR_GLOBAL_W);
    }
    h.nb = (int64_t)(KB_CCL_HIER_SHARE_BYTES / 4u) * P;
    if (h.nb > n)
        h.nb = n;
    h.nblk = (n + h.nb - 1) / h.nb;
    kb_dir probe = P > 1 ? KB_DIR_PEER(5) : C > 1 ? KB_DIR_PEER(4) : KB_DIR_PEER(3);
    h.nt = kb_ipcq_is_wired(tl_ctx(tl), tl_pe(tl), probe) ? 4 : 2;
    hthread ht[4];
    kb_tl *th[4] = { NULL };
    int nt = h.nblk < h.nt ? (int)h.nblk : h.nt;
    for (int t = 0; t < nt; t++) {
        ht[t].h = &h;
        ht[t].t = t;
        kb_signal_init(&ht[t].go);
        ht[t].next = t + 1 < nt ? &ht[t + 1] : NULL;
    }
    for (int t = 1; t < nt; t++)
        th[t] = tl_fork(tl, hier_thread, &ht[t]);
    hier_blocks(tl, &h, 0, &ht[0]);
    for (int t = 1; t < h.nt; t++)
        if (th[t])
            tl_join(tl, th[t]);
    return 1;
}
