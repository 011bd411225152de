/*
 * kb_ccl_coll — the collectives other than all-reduce as rank = PE kernels over tl + IPCQ,
 * with their registry entries (kb_ccl.h): all_gather, reduce_scatter, broadcast, reduce,
 * all_to_all and send/recv, as nccl-tests defines them (docs/collectives.md §4).
 *
 *  ring_allgather      p-1 steps around ring_1d: forward the chunk received last
 *  ring_reducescatter  p-1 steps around ring_1d: receive a partial sum, add the own chunk,
 *                      send it on; rank r ends with the sum of chunk r
 *  p2p_sendrecv        rank r sends its tile to r+1 and receives r-1's (ring_1d)
 *  ring_broadcast      a pipelined chain from the root around ring_1d
 *  ring_reduce         a pipelined chain around ring_1d that ends at the root
 *  tree_broadcast      a pipelined binary tree hanging from the root (tree_binary)
 *  tree_reduce         the same tree, partial sums flowing up to the root
 *  pairwise_alltoall   ws - 1 pairwise exchanges over full_mesh
 *  rd_allgather        recursive doubling over hypercube (MPI's fold for non-powers of two)
 *  rh_reducescatter    recursive halving over hypercube (the same fold), f32 partial sums
 *  rhd_allreduce       recursive halving-doubling (Rabenseifner): rh + recursive doubling
 *
 * Tiles (kb_coll_kind): a rank's tile is its whole buffer, n = nccl-tests' size / element
 * size (f16 unless a KB_CCL_TYPED kernel gets another dtype in KB_CCL_ARG_DTYPE; the
 * reducing ones of those also take KB_CCL_ARG_OP); the chunked kinds (all_gather, reduce_scatter, all_to_all) have n = ws * count,
 * chunk c at [c * count, (c + 1) * count), and run in place as NCCL's in-place calls do. Every
 * kernel moves its data slice by slice, a slice being as many elements as one slot holds
 * (f16 for data that is only moved, f32 for partial sums), so every message fits one slot,
 * scratch holds at most KB_CCL_STREAM_BYTES of slices whatever n is, and a slice travels on to
 * the next hop while the following ones are still arriving (the pipelining of NCCL's ring and
 * tree protocols). Partial sums travel in f32 and are rounded once when stored.
 *
 * Limits: rd_allgather, rh_reducescatter and rhd_allreduce need floor(log2 ws) + 1 directions
 * (ws < 2048) and as many rings per PE in the IPCQ area (rd's and rhd's doubling messages
 * are ranges of chunks, which IPCQ carries as slot-sized chunks); pairwise_alltoall needs a
 * direct queue to every peer: ws - 1 peer directions per PE (full_mesh, any ws), whose
 * (ws - 1) * n_slots * slot_size bytes of rings must fit the PE's IPCQ area (the install
 * says so with the numbers where they do not; ccl.yaml's entry takes 4 x 8 KiB slots, which
 * fit 255 peers in 8 MiB).
 */
#include <assert.h>
#include <string.h>

#include "kb_ccl.h"

/* Receives posted ahead into tensor memory (they hold no scratch). */
#define COLL_MAX_POSTED 64
/* Receive slots a posted broadcast holds at most while their forwards land. */
#define COLL_MAX_HELD 16

/* Receives of whole slots into scratch posted ahead: as many as KB_CCL_STREAM_BYTES holds. */
static int64_t scratch_window(uint64_t slot)
{
    int64_t w = (int64_t)(KB_CCL_STREAM_BYTES / slot);
    return w < 1 ? 1 : w > COLL_MAX_POSTED ? COLL_MAX_POSTED : w;
}

static int64_t mod(int64_t a, int64_t m) { return (a % m + m) % m; }

/* Elements of one slice: a slot of elements of esz bytes. */
static int64_t slice_elems(kb_tl *tl, uint32_t esz)
{
    int64_t S = (int64_t)(kb_ipcq_slot_size(tl_ctx(tl)) / esz);
    return S < 1 ? 1 : S;
}

static kb_va at(kb_va tile, int64_t i) { return kb_ccl_elem_va(tile, i, KB_F16); }

static kb_val ref16(kb_tl *tl, kb_va tile, int64_t off, int64_t len)
{
    return tl_ref(tl, at(tile, off), KB_SHAPE1(len), KB_F16);
}

/* The same for a tile of dtype dt (the KB_CCL_TYPED kernels). */
static kb_va atd(kb_va tile, int64_t i, kb_dtype dt) { return kb_ccl_elem_va(tile, i, dt); }

static kb_val refd(kb_tl *tl, kb_va tile, int64_t off, int64_t len, kb_dtype dt)
{
    return tl_ref(tl, atd(tile, off, dt), KB_SHAPE1(len), dt);
}

/* ---- ring all_gather ---- */

/*
 * One block: elements [b0, b0 + bl) of every chunk, in slices of S. Step 0 sends the own
 * chunk r; step s receives chunk r-s-1 straight into the tile and forwards it (HBM -> peer
 * ring -> HBM), slice by slice, posting the next step's receive of a slice as it consumes it.
 */
static void ag_block(kb_tl *tl, kb_va tile, int64_t ws, int64_t r, int64_t cnt, int64_t b0,
                     int64_t bl, int64_t S, kb_dtype dt)
{
    kb_ipcq_req *rq[COLL_MAX_POSTED];
    int64_t nsl = (bl + S - 1) / S, off, len;

    assert(nsl <= COLL_MAX_POSTED); /* a block is at most COLL_MAX_POSTED slices */
    for (int64_t j = 0; j < nsl; j++) {
        len = kb_ccl_piece(bl, S, j, &off);
        rq[j] = tl_recv_into_async(tl, KB_DIR_W, atd(tile, mod(r - 1, ws) * cnt + b0 + off, dt),
                                   KB_SHAPE1(len), dt);
    }
    for (int64_t j = 0; j < nsl; j++) {
        len = kb_ccl_piece(bl, S, j, &off);
        kb_ccl_send(tl, KB_DIR_E, refd(tl, tile, r * cnt + b0 + off, len, dt));
    }
    for (int64_t s = 0; s + 1 < ws; s++) {
        int64_t c = mod(r - s - 1, ws), last = s + 2 == ws;
        for (int64_t j = 0; j < nsl; j++) {
            len = kb_ccl_piece(bl, S, j, &off);
            (void)tl_wait(tl, rq[j]);
            if (last)
                continue;
            rq[j] = tl_recv_into_async(tl, KB_DIR_W, atd(tile, mod(c - 1, ws) * cnt + b0 + off, dt),
                                       KB_SHAPE1(len), dt);
            kb_ccl_send(tl, KB_DIR_E, refd(tl, tile, c * cnt + b0 + off, len, dt));
        }
    }
}

static void ring_allgather(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl);
    kb_dtype dt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];
    int64_t cnt = n / ws, S = slice_elems(tl, (uint32_t)kb_dtype_size(dt)), off, len;
    kb_va tile = kb_ccl_my_tile(tl, a);

    assert(cnt * ws == n); /* the chunked kinds' tile is ws chunks (ag_check) */
    if (ws < 2)
        return;
    /* posted sends: a chunk of fewer slots than the ring's window travels as `window` slices
     * (kb_ccl_slice_elems), so a step keeps the window in flight instead of one slot-sized
     * slice per hop; not posted, slices of a slot (the kernel before posted sends) */
    if (kb_ipcq_posted(tl_ctx(tl)))
        S = kb_ccl_slice_elems(kb_ipcq_slot_size(tl_ctx(tl)), (int64_t)tl_slot_count(tl, KB_DIR_E),
                               cnt, kb_dtype_size(dt));
    int64_t blk = S * COLL_MAX_POSTED;
    for (int64_t b = 0; (len = kb_ccl_piece(cnt, blk, b, &off)) != 0; b++)
        ag_block(tl, tile, ws, r, cnt, off, len, S, dt);
}

/* ---- ring reduce_scatter ---- */

/*
 * One block of every chunk, in slices of one slot of the tile's dtype. Step s sends chunk
 * r-s-1 (step 0: the raw chunk from the tile; later: the partial result just made) and
 * receives chunk r-s-2's partial; it loads the own slice (before the wait: the neighbour's
 * slice is still on its way), combines it with the partial where that lies in the receive
 * slot (a view), in f32 rounded to the dtype as it is written, hands the slot back and sends
 * the result on; the last step receives chunk r and stores its total, rounded once (NCCL's
 * recvReduceSend, then recvReduceCopy).
 */
/* Starts the load of the own slice j of reduce-scatter step s (chunk r-s-2) of a block; its
 * data are there at *ready. */
static kb_val rs_own(kb_tl *tl, kb_va tile, int64_t ws, int64_t r, int64_t cnt, int64_t b0,
                     int64_t bl, int64_t S, kb_dtype dt, int64_t s, int64_t j, int64_t *ready)
{
    int64_t off, len = kb_ccl_piece(bl, S, j, &off);
    return tl_load_async(tl, atd(tile, mod(r - s - 2, ws) * cnt + b0 + off, dt), KB_SHAPE1(len),
                         dt, ready);
}

static void rs_block(kb_tl *tl, kb_va tile, int64_t ws, int64_t r, int64_t cnt, int64_t b0,
                     int64_t bl, int64_t S, kb_dtype dt, int op)
{
    kb_ipcq_req *rq[COLL_MAX_POSTED];
    int64_t nsl = (bl + S - 1) / S, off, len;

    assert(nsl <= COLL_MAX_POSTED); /* w <= COLL_MAX_POSTED slices per block */
    for (int64_t j = 0; j < nsl; j++) {
        len = kb_ccl_piece(bl, S, j, &off);
        rq[j] = tl_recv_view_async(tl, KB_DIR_W, KB_SHAPE1(len), dt);
    }
    for (int64_t j = 0; j < nsl; j++) {
        len = kb_ccl_piece(bl, S, j, &off);
        kb_ccl_send(tl, KB_DIR_E, refd(tl, tile, mod(r - 1, ws) * cnt + b0 + off, len, dt));
    }
    /* the own slice of the next (step, slice) is loaded while this one is combined: PE_DMA
     * and PE_MATH work at once, as the all-gather's copy-out runs beside its send */
    int64_t rdy, nrdy = 0;
    kb_val nxt = rs_own(tl, tile, ws, r, cnt, b0, bl, S, dt, 0, 0, &nrdy);
    for (int64_t s = 0; s + 1 < ws; s++) {
        int64_t c = mod(r - s - 2, ws), last = s + 2 == ws;
        for (int64_t j = 0; j < nsl; j++) {
            len = kb_ccl_piece(bl, S, j, &off);
            kb_val own = nxt;
            rdy = nrdy;
            if (j + 1 < nsl || !last)
                nxt = rs_own(tl, tile, ws, r, cnt, b0, bl, S, dt, j + 1 < nsl ? s : s + 1,
                             j + 1 < nsl ? j + 1 : 0, &nrdy);
            kb_val in = tl_wait(tl, rq[j]), red;
            tl_wait_time(tl, rdy);
            if (last) {
                red = kb_ccl_combine(tl, op, own, in);
                tl_recv_release(tl, KB_DIR_W, in);
                red = kb_ccl_finish(tl, op, red, ws);
                tl_store(tl, atd(tile, c * cnt + b0 + off, dt), red);
            } else {
                red = kb_ccl_combine_as(tl, op, own, in, dt);
                tl_recv_release(tl, KB_DIR_W, in);
                rq[j] = tl_recv_view_async(tl, KB_DIR_W, KB_SHAPE1(len), dt);
                if (kb_ipcq_posted(tl_ctx(tl))) {
                    /* posted: red's scratch goes back once the send has read it */
                    kb_ccl_send_free(tl, KB_DIR_E, red);
                    tl_free(tl, own);
                    continue;
                }
                tl_send(tl, KB_DIR_E, red);
            }
            tl_free(tl, own);
            tl_free(tl, red);
        }
    }
}

static void ring_reducescatter(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl);
    kb_dtype dt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];
    int64_t cnt = n / ws, S = slice_elems(tl, (uint32_t)kb_dtype_size(dt));
    uint64_t slot = kb_ipcq_slot_size(tl_ctx(tl));
    assert(cnt * ws == n); /* rs_check */
    /* slices per block: a scratch window of own loads and results, and no more than the
     * ring's slots (step 0 sends them all before a neighbour, holding its views, takes any).
     * Posted sends (rsag_streamed's rule): the ring's whole window per block, as scratch then
     * holds three slices whatever the block is (the next own slice in flight, the current
     * one, the result just posted), and slices of chunk / window for chunks of fewer slots
     * than the window (kb_ccl_slice_elems), so every step keeps the window in flight; not
     * posted, slot-sized slices as many as KB_CCL_STREAM_BYTES holds (the kernel before). */
    int64_t w = scratch_window(slot), off, len;
    kb_va tile = kb_ccl_my_tile(tl, a);
    int op = (int)a->i[KB_CCL_ARG_OP];

    if (ws < 2) /* one rank: every op leaves the tile as it is (avg: x / 1) */
        return;
    int64_t win = (int64_t)tl_slot_count(tl, KB_DIR_E);
    if (kb_ipcq_posted(tl_ctx(tl))) {
        S = kb_ccl_slice_elems(slot, win, cnt, kb_dtype_size(dt));
        w = COLL_MAX_POSTED;
    }
    if (w > win)
        w = win;
    for (int64_t b = 0; (len = kb_ccl_piece(cnt, S * w, b, &off)) != 0; b++)
        rs_block(tl, tile, ws, r, cnt, off, len, S, dt, op);
}

/* ---- send/recv ---- */

/*
 * In place, slice by slice: a slice is loaded before its receive is posted (the incoming
 * slice lands where it was), then sent; a slice's receive is collected COLL_MAX_POSTED
 * slices later, so sends and copy-outs overlap. A tile that fits one slot is: load, post,
 * send, wait.
 *
 * With posted sends (p2p_posted) a slice goes straight from the tile (no load into scratch:
 * one DMA less per slice), a window of them in flight, and its receive is posted `lag`
 * slices later, once the send has landed: the copy-out that overwrites the slice is then
 * requested after the send has read it, which Phase 2's start order needs (a send's DMA
 * starts after its issue when its route is busy). Iteration j posts slice j - lag's receive
 * before it sends slice j: that send waits for the peer to consume slice j - n_slots, whose
 * receive the peer posted at the start of its own iteration j - n_slots + lag <= j, so
 * with lag <= n_slots no rank waits on one that waits on it.
 */
static void p2p_posted(kb_tl *tl, kb_va tile, int64_t n, kb_dtype dt)
{
    int64_t win = (int64_t)tl_slot_count(tl, KB_DIR_E);
    int64_t S = kb_ccl_slice_elems(kb_ipcq_slot_size(tl_ctx(tl)), win, n, kb_dtype_size(dt));
    int64_t nsl = (n + S - 1) / S, lag = win < COLL_MAX_POSTED ? win : COLL_MAX_POSTED - 1;
    int64_t off, len, land[COLL_MAX_POSTED];
    kb_ipcq_req *rq[COLL_MAX_POSTED];

    /* land[i % COLL_MAX_POSTED] is read lag iterations after slice i's send wrote it, before
     * slice i + COLL_MAX_POSTED's send overwrites it */
    assert(lag >= 1 && lag < COLL_MAX_POSTED);
    /* iteration j collects the receive posted COLL_MAX_POSTED slices before i = j - lag,
     * posts i's and sends slice j */
    for (int64_t j = 0; j < nsl + lag + COLL_MAX_POSTED; j++) {
        int64_t i = j - lag, w = i - COLL_MAX_POSTED;
        if (w >= 0 && w < nsl)
            (void)tl_wait(tl, rq[w % COLL_MAX_POSTED]);
        if (i >= 0 && i < nsl) {
            len = kb_ccl_piece(n, S, i, &off);
            tl_wait_time(tl, land[i % COLL_MAX_POSTED]);
            rq[i % COLL_MAX_POSTED] = tl_recv_into_async(tl, KB_DIR_W, atd(tile, off, dt),
                                                         KB_SHAPE1(len), dt);
        }
        if (j < nsl) {
            len = kb_ccl_piece(n, S, j, &off);
            land[j % COLL_MAX_POSTED] = tl_send_async(tl, KB_DIR_E, refd(tl, tile, off, len, dt));
        }
    }
}

static void p2p_sendrecv(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    kb_dtype dt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];
    int64_t n = a->i[KB_CCL_ARG_N], S = slice_elems(tl, (uint32_t)kb_dtype_size(dt));
    int64_t nsl = (n + S - 1) / S, off, len;
    kb_va tile = kb_ccl_my_tile(tl, a);
    kb_ipcq_req *rq[COLL_MAX_POSTED];

    if (a->i[KB_CCL_ARG_WS] < 2)
        return;
    if (kb_ipcq_posted(tl_ctx(tl))) {
        p2p_posted(tl, tile, n, dt);
        return;
    }
    for (int64_t j = 0; j < nsl + COLL_MAX_POSTED; j++) {
        if (j >= COLL_MAX_POSTED && j - COLL_MAX_POSTED < nsl)
            (void)tl_wait(tl, rq[(j - COLL_MAX_POSTED) % COLL_MAX_POSTED]);
        if (j >= nsl)
            continue;
        len = kb_ccl_piece(n, S, j, &off);
        kb_val v = tl_load(tl, atd(tile, off, dt), KB_SHAPE1(len), dt);
        rq[j % COLL_MAX_POSTED] = tl_recv_into_async(tl, KB_DIR_W, atd(tile, off, dt),
                                                     KB_SHAPE1(len), dt);
        tl_send(tl, KB_DIR_E, v);
        tl_free(tl, v);
    }
}

/* ---- broadcast ---- */

/*
 * Elements per slice of a pipelined chain or tree `hops` deep whose messages carry elements
 * of es bytes (posted sends): the pipeline fills in about `hops` slice times, so slices of
 * n / (8 hops) keep the fill within an eighth of the stream; kb_ccl_slice_elems keeps them
 * between KB_CCL_MIN_SLICE_BYTES (below which a window of n_slots slices no longer covers
 * a slow hop's credit round trip) and one slot.
 */
static int64_t chain_slice(kb_tl *tl, int64_t hops, int64_t n, size_t es)
{
    return kb_ccl_slice_elems(kb_ipcq_slot_size(tl_ctx(tl)), 8 * (hops > 1 ? hops : 1), n, es);
}

/* The simulated time now: the kernel sees a DMA's completion (its status) once past its end. */
static int64_t now_ps(kb_tl *tl) { return (int64_t)kb_sim_now(tl_sim(tl)); }

/*
 * Whether a ring of ws ranks crosses SIPs (ranks fill the grid's SIPs in turn) over an
 * inter-SIP link narrower than one DMA channel: that link then bounds a chain around it.
 */
static int ring_sip_bound(kb_tl *tl, int64_t ws)
{
    const kb_machine *m = kb_ctx_machine(tl_ctx(tl));
    return ws > (int64_t)tl_num_programs(tl, 0) * tl_num_programs(tl, 1) &&
           m->cfg.inter_sip.bandwidth_gbps < m->cfg.dma_bandwidth_gbps;
}

/*
 * A rank that receives its slices from `up` into the tile and forwards each one to its `nd`
 * downstream directions as soon as it has landed; the root (up = KB_DIR_NONE) sends them from
 * the tile. Receives are posted COLL_MAX_POSTED slices ahead; a chain or tree has no cycle,
 * so nothing waits on itself.
 */
static void bcast_flow(kb_tl *tl, kb_va tile, int64_t n, kb_dtype dt, kb_dir up,
                       const kb_dir *down, int nd)
{
    int64_t S = slice_elems(tl, (uint32_t)kb_dtype_size(dt)), nsl = (n + S - 1) / S, off, len;
    kb_ipcq_req *rq[COLL_MAX_POSTED];

    if (up != KB_DIR_NONE)
        for (int64_t j = 0; j < nsl && j < COLL_MAX_POSTED; j++) {
            len = kb_ccl_piece(n, S, j, &off);
            rq[j] = tl_recv_into_async(tl, up, atd(tile, off, dt), KB_SHAPE1(len), dt);
        }
    for (int64_t j = 0; j < nsl; j++) {
        len = kb_ccl_piece(n, S, j, &off);
        if (up != KB_DIR_NONE) {
            (void)tl_wait(tl, rq[j % COLL_MAX_POSTED]);
            int64_t nx = j + COLL_MAX_POSTED, xo, xl = kb_ccl_piece(n, S, nx, &xo);
            if (xl)
                rq[nx % COLL_MAX_POSTED] = tl_recv_into_async(tl, up, atd(tile, xo, dt),
                                                              KB_SHAPE1(xl), dt);
        }
        for (int d = 0; d < nd; d++)
            tl_send(tl, down[d], refd(tl, tile, off, len, dt));
    }
}

/*
 * bcast_flow with posted sends, for a chain `hops` deep: slices of chain_slice, every send
 * posted (the root's straight from the tile). A rank below the root takes one of two forms:
 *  - copy-out: its slices land in the tile (the receive's copy-out runs on its
 *    DMA channels without the kernel) and each is forwarded from there once it has landed;
 *    a hop costs two DMAs, and the rank's kernel only posts and waits;
 *  - views: it reads each slice in its receive slot and forwards it from there before it
 *    stores it into the tile, so a hop costs one DMA; but the store (tl_store waits for its
 *    DMA) takes the kernel one slice's DMA time per slice, which caps the rank at one DMA
 *    channel's rate. The slot goes back (its credit) once the store is done and every
 *    forward of it has landed: a forward's DMA may start later than its issue (its route
 *    busy), and the upstream rank's next write into the slot must not start before it.
 *    Views are held in order and released as soon as their forwards have landed; at most
 *    n_slots - 1 stay held after a slice, so the upstream rank always has a slot to send
 *    the next one into and the wait for it never waits on this rank.
 * Views save the fill hops x one slice's DMA and cost up to the rate above one channel's:
 * nothing where a link narrower than a DMA channel bounds the chain anyway (link_bound),
 * else, as a chain inside a SIP runs at about two channels' rate, about half a slice's DMA
 * per slice. So views where link_bound or nsl < 2 hops (measured on the shipped machine:
 * 64 ranks, 4 MiB: 85 us in views, 110 us copy-out; 16 MiB: 223 and 185 us).
 */
static void bcast_posted(kb_tl *tl, kb_va tile, int64_t n, kb_dtype dt, kb_dir up,
                         const kb_dir *down, int nd, int64_t hops, int link_bound)
{
    int64_t S = chain_slice(tl, hops, n, kb_dtype_size(dt)), nsl = (n + S - 1) / S, off, len;
    int views = link_bound || nsl < 2 * hops;
    kb_ipcq_req *rq[COLL_MAX_POSTED];
    kb_val hv[COLL_MAX_HELD];
    int64_t ht[COLL_MAX_HELD];
    int hh = 0, hn = 0, cap = 0;

    if (up != KB_DIR_NONE) {
        cap = (int)tl_slot_count(tl, up) - 1; /* held after a slice; one more during it */
        cap = cap > COLL_MAX_HELD - 1 ? COLL_MAX_HELD - 1 : cap;
        for (int64_t j = 0; j < nsl && j < COLL_MAX_POSTED; j++) {
            len = kb_ccl_piece(n, S, j, &off);
            rq[j] = views ? tl_recv_view_async(tl, up, KB_SHAPE1(len), dt)
                          : tl_recv_into_async(tl, up, atd(tile, off, dt), KB_SHAPE1(len), dt);
        }
    }
    for (int64_t j = 0; j < nsl; j++) {
        len = kb_ccl_piece(n, S, j, &off);
        if (up == KB_DIR_NONE || !views) {
            if (up != KB_DIR_NONE)
                (void)tl_wait(tl, rq[j % COLL_MAX_POSTED]);
            for (int d = 0; d < nd; d++)
                (void)tl_send_async(tl, down[d], refd(tl, tile, off, len, dt));
        } else {
            kb_val v = tl_wait(tl, rq[j % COLL_MAX_POSTED]);
            int64_t landed = 0;
            for (int d = 0; d < nd; d++) {
                int64_t t = tl_send_async(tl, down[d], v);
                landed = t > landed ? t : landed;
            }
            tl_store(tl, atd(tile, off, dt), v);
            int i = (hh + hn++) % COLL_MAX_HELD;
            assert(hn <= COLL_MAX_HELD); /* cap + 1 at most: the ring of held views */
            hv[i] = v;
            ht[i] = landed;
            while (hn && (hn > cap || ht[hh] <= now_ps(tl))) {
                tl_wait_time(tl, ht[hh]);
                tl_recv_release(tl, up, hv[hh]);
                hh = (hh + 1) % COLL_MAX_HELD;
                hn--;
            }
        }
        int64_t nx = j + COLL_MAX_POSTED, xo, xl = kb_ccl_piece(n, S, nx, &xo);
        if (up != KB_DIR_NONE && xl)
            rq[nx % COLL_MAX_POSTED] =
                views ? tl_recv_view_async(tl, up, KB_SHAPE1(xl), dt)
                      : tl_recv_into_async(tl, up, atd(tile, xo, dt), KB_SHAPE1(xl), dt);
    }
    for (; hn; hn--, hh = (hh + 1) % COLL_MAX_HELD) {
        tl_wait_time(tl, ht[hh]);
        tl_recv_release(tl, up, hv[hh]);
    }
}

/* Depth of a binary heap over ws ranks (its deepest node's). */
static int64_t tree_depth(int64_t ws)
{
    int64_t h = 0;
    while (((int64_t)2 << h) <= ws)
        h++;
    return h;
}

/* Posted sends: the chain's pipeline (bcast_posted). */
static void ring_broadcast(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t ws = a->i[KB_CCL_ARG_WS], v = mod(kb_ccl_rank(tl) - a->i[KB_CCL_ARG_ROOT], ws);
    kb_dir e = KB_DIR_E, up = v == 0 ? KB_DIR_NONE : KB_DIR_W;
    assert(a->i[KB_CCL_ARG_ROOT] >= 0 && a->i[KB_CCL_ARG_ROOT] < ws); /* kb_ccl_job_check_opts */
    kb_va tile = kb_ccl_my_tile(tl, a);
    kb_dtype dt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];

    if (ws < 2)
        return;
    if (kb_ipcq_posted(tl_ctx(tl)))
        bcast_posted(tl, tile, a->i[KB_CCL_ARG_N], dt, up, &e, v + 1 < ws, ws - 1,
                     ring_sip_bound(tl, ws));
    else
        bcast_flow(tl, tile, a->i[KB_CCL_ARG_N], dt, up, &e, v + 1 < ws);
}

/* Heap position v of a binary tree over ws ranks: its children's directions. */
static int tree_children(int64_t v, int64_t ws, kb_dir down[2])
{
    int nd = 0;
    if (2 * v + 1 < ws)
        down[nd++] = KB_DIR_CHILD_LEFT;
    if (2 * v + 2 < ws)
        down[nd++] = KB_DIR_CHILD_RIGHT;
    return nd;
}

/* Blocking sends whatever posted_sends says: tree_binary's edges share the UCIe links, and
 * bcast_posted there measured slower than this form at 32 to 128 ranks (up to 1.45x at 128,
 * 64 MiB) though twice as fast at 3 and 7; at 256 both are bound by the inter-SIP link. */
static void tree_broadcast(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t ws = a->i[KB_CCL_ARG_WS], v = mod(kb_ccl_rank(tl) - a->i[KB_CCL_ARG_ROOT], ws);
    kb_dir down[2];
    int nd = tree_children(v, ws, down);

    if (ws < 2)
        return;
    bcast_flow(tl, kb_ccl_my_tile(tl, a), a->i[KB_CCL_ARG_N], (kb_dtype)a->i[KB_CCL_ARG_DTYPE],
               v == 0 ? KB_DIR_NONE : KB_DIR_PARENT, down, nd);
}

/* ---- reduce ---- */

/*
 * A rank of a reduction flowing toward the root: per f32 slice, the partial sums of its
 * `nin` upstream directions (in[k], arriving as dtype dt[k]) are added to its own slice
 * (loaded from the tile) and sent on `out`, or stored by the root (out = KB_DIR_NONE). A rank
 * with no upstream sends its raw f16 slices straight from the tile. Receives are posted a
 * scratch window ahead.
 *
 * Posted sends (reduce_posted): slices of chain_slice in the partials' dtype pdt; the
 * upstream partials are read in their receive slots (views: no copy-out) and released once
 * combined, the rank's own slice is loaded (tl_load_async) while the slice before is
 * combined, and the partial goes on as a posted send whose scratch goes back once the send
 * has read it (kb_ccl_send_free). A rank with no upstream posts its raw slices from the tile.
 * The root still combines and then stores each slice (tl_store waits for its DMA), so its
 * PE_MATH and PE_DMA take turns: the chain's rate is at most the root's.
 */
static void reduce_posted(kb_tl *tl, kb_va tile, int64_t n, const kb_dir *in,
                          const kb_dtype *dt, int nin, kb_dir out, kb_dtype tdt, int op,
                          int64_t ws, kb_dtype pdt, int64_t hops)
{
    uint64_t slot = kb_ipcq_slot_size(tl_ctx(tl));
    int64_t S = chain_slice(tl, hops, n, kb_dtype_size(pdt)), nsl = (n + S - 1) / S;
    int64_t W = scratch_window(slot), off, len, rdy, nrdy = 0;
    kb_ipcq_req *rq[2][COLL_MAX_POSTED];

    if (!nin) {
        for (int64_t j = 0; j < nsl; j++) {
            len = kb_ccl_piece(n, S, j, &off);
            (void)tl_send_async(tl, out, refd(tl, tile, off, len, tdt));
        }
        return;
    }
    if (W > 1)
        W /= nin; /* a view that cannot be read in place is a copy into scratch */
    for (int64_t j = 0; j < nsl && j < W; j++)
        for (int k = 0; k < nin; k++) {
            len = kb_ccl_piece(n, S, j, &off);
            rq[k][j] = tl_recv_view_async(tl, in[k], KB_SHAPE1(len), dt[k]);
        }
    kb_val nxt = tl_load_async(tl, atd(tile, 0, tdt), KB_SHAPE1(kb_ccl_piece(n, S, 0, &off)),
                               tdt, &nrdy);
    for (int64_t j = 0; j < nsl; j++) {
        len = kb_ccl_piece(n, S, j, &off);
        kb_val acc = nxt;
        int64_t xo, xl = kb_ccl_piece(n, S, j + 1, &xo);
        rdy = nrdy;
        if (xl)
            nxt = tl_load_async(tl, atd(tile, xo, tdt), KB_SHAPE1(xl), tdt, &nrdy);
        for (int k = 0; k < nin; k++) {
            kb_val x = tl_wait(tl, rq[k][j % W]);
            if (k == 0)
                tl_wait_time(tl, rdy);
            kb_val s = k + 1 == nin && out != KB_DIR_NONE ? kb_ccl_combine_as(tl, op, acc, x, pdt)
                                                       : kb_ccl_combine(tl, op, acc, x);
            tl_recv_release(tl, in[k], x);
            tl_free(tl, acc);
            acc = s;
            xl = kb_ccl_piece(n, S, j + W, &xo);
            if (xl)
                rq[k][j % W] = tl_recv_view_async(tl, in[k], KB_SHAPE1(xl), dt[k]);
        }
        if (out == KB_DIR_NONE) {
            acc = kb_ccl_finish(tl, op, acc, ws);
            tl_store(tl, atd(tile, off, tdt), acc);
            tl_free(tl, acc);
        } else {
            kb_ccl_send_free(tl, out, acc);
        }
    }
}

static void reduce_flow(kb_tl *tl, kb_va tile, int64_t n, const kb_dir *in, const kb_dtype *dt,
                        int nin, kb_dir out, kb_dtype tdt, int op, int64_t ws, kb_dtype pdt,
                        int64_t hops)
{
    uint64_t slot = kb_ipcq_slot_size(tl_ctx(tl));
    int64_t S = slice_elems(tl, 4), nsl = (n + S - 1) / S, W = scratch_window(slot), off, len;
    kb_ipcq_req *rq[2][COLL_MAX_POSTED];

    assert(nin >= 0 && nin <= 2); /* a chain has one upstream rank, a binary tree two */
    if (kb_ipcq_posted(tl_ctx(tl))) {
        reduce_posted(tl, tile, n, in, dt, nin, out, tdt, op, ws, pdt, hops);
        return;
    }

    if (nin > 0 && W > 1)
        W /= nin; /* the window's scratch is shared by the upstream directions */
    for (int64_t j = 0; j < nsl && j < W; j++)
        for (int k = 0; k < nin; k++) {
            len = kb_ccl_piece(n, S, j, &off);
            rq[k][j] = tl_recv_async(tl, in[k], KB_SHAPE1(len), dt[k]);
        }
    for (int64_t j = 0; j < nsl; j++) {
        len = kb_ccl_piece(n, S, j, &off);
        if (!nin) {
            tl_send(tl, out, refd(tl, tile, off, len, tdt));
            continue;
        }
        kb_val acc = tl_load(tl, atd(tile, off, tdt), KB_SHAPE1(len), tdt);
        for (int k = 0; k < nin; k++) {
            kb_val x = tl_wait(tl, rq[k][j % W]);
            int64_t xo, xl = kb_ccl_piece(n, S, j + W, &xo);
            if (xl)
                rq[k][(j + W) % W] = tl_recv_async(tl, in[k], KB_SHAPE1(xl), dt[k]);
            /* the partial that goes on is written in pdt (the ring: the tile's dtype) */
            kb_val s = k + 1 == nin && out != KB_DIR_NONE ? kb_ccl_combine_as(tl, op, acc, x, pdt)
                                                       : kb_ccl_combine(tl, op, acc, x);
            tl_free(tl, acc);
            tl_free(tl, x);
            acc = s;
        }
        if (out == KB_DIR_NONE) {
            acc = kb_ccl_finish(tl, op, acc, ws);
            tl_store(tl, atd(tile, off, tdt), acc);
        } else {
            tl_send(tl, out, acc);
        }
        tl_free(tl, acc);
    }
}

/* Chain v = 1 -> 2 -> ... -> ws-1 -> 0 (the root) on E: rank v = 1 starts with raw slices. */
static void ring_reduce(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t ws = a->i[KB_CCL_ARG_WS], v = mod(kb_ccl_rank(tl) - a->i[KB_CCL_ARG_ROOT], ws);
    kb_dir w = KB_DIR_W;
    kb_dtype tdt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];
    kb_dtype dt = tdt; /* what the west neighbour sends: raw or partial, in the tile's dtype */

    if (ws < 2) /* one rank: every op leaves the tile as it is (avg: x / 1) */
        return;
    reduce_flow(tl, kb_ccl_my_tile(tl, a), a->i[KB_CCL_ARG_N], &w, &dt, v == 1 ? 0 : 1,
                v == 0 ? KB_DIR_NONE : KB_DIR_E, tdt, (int)a->i[KB_CCL_ARG_OP], ws, tdt, ws - 1);
}

static void tree_reduce(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t ws = a->i[KB_CCL_ARG_WS], v = mod(kb_ccl_rank(tl) - a->i[KB_CCL_ARG_ROOT], ws);
    kb_dir in[2];
    kb_dtype dt[2];
    int nin = tree_children(v, ws, in);
    assert(a->i[KB_CCL_ARG_ROOT] >= 0 && a->i[KB_CCL_ARG_ROOT] < ws); /* kb_ccl_job_check_opts */

    kb_dtype tdt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];

    if (ws < 2) /* one rank: every op leaves the tile as it is (avg: x / 1) */
        return;
    for (int k = 0; k < nin; k++) { /* a leaf child sends its raw tile dtype */
        int64_t c = 2 * v + 1 + k;
        dt[k] = 2 * c + 1 < ws ? KB_F32 : tdt;
    }
    reduce_flow(tl, kb_ccl_my_tile(tl, a), a->i[KB_CCL_ARG_N], in, dt, nin,
                v == 0 ? KB_DIR_NONE : KB_DIR_PARENT, tdt, (int)a->i[KB_CCL_ARG_OP], ws, KB_F32,
                tree_depth(ws));
}

/* ---- all_to_all ---- */

/*
 * Step k = 0 .. ws-1 pairs rank r with p = (k - r) mod ws (a symmetric round-robin: p's
 * partner in step k is r); p == r is the rank's idle step. The pair swaps chunks in place:
 * r sends its chunk p and receives p's chunk r into chunk p, slice by slice (each slice
 * loaded before its receive is posted), on the full_mesh direction that leads to p.
 */
static kb_dir mesh_dir(int64_t r, int64_t p, int64_t ws)
{
    assert(p != r); /* full_mesh has no queue from a rank to itself */
    return KB_DIR_PEER(mod(p - r, ws) - 1);
}

static void pairwise_alltoall(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl);
    kb_dtype dt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];
    int64_t cnt = n / ws, S = slice_elems(tl, (uint32_t)kb_dtype_size(dt));
    int64_t nsl = (cnt + S - 1) / S, off, len;
    kb_va tile = kb_ccl_my_tile(tl, a);
    kb_ipcq_req *rq[COLL_MAX_POSTED];

    assert(cnt * ws == n); /* a2a_check */
    for (int64_t k = 0; k < ws; k++) {
        int64_t p = mod(k - r, ws);
        if (p == r)
            continue;
        kb_dir d = mesh_dir(r, p, ws);
        for (int64_t j = 0; j < nsl + COLL_MAX_POSTED; j++) {
            if (j >= COLL_MAX_POSTED && j - COLL_MAX_POSTED < nsl)
                (void)tl_wait(tl, rq[(j - COLL_MAX_POSTED) % COLL_MAX_POSTED]);
            if (j >= nsl)
                continue;
            len = kb_ccl_piece(cnt, S, j, &off);
            kb_va va = atd(tile, p * cnt + off, dt);
            kb_val v = tl_load(tl, va, KB_SHAPE1(len), dt);
            rq[j % COLL_MAX_POSTED] = tl_recv_into_async(tl, d, va, KB_SHAPE1(len), dt);
            tl_send(tl, d, v);
            tl_free(tl, v);
        }
    }
}

/* ---- recursive doubling all_gather ---- */

/* First chunk of survivor v's block (hypercube topology): a folded pair's two chunks or the
 * rank's own; first_chunk(2^d) = ws. */
static int64_t first_chunk(int64_t v, int64_t rem) { return v < rem ? 2 * v : v + rem; }

/* Posts the receive of chunks [c0, c1) into the tile from d; NULL when empty. */
static kb_ipcq_req *post_chunks(kb_tl *tl, kb_dir d, kb_va tile, int64_t cnt, int64_t c0,
                                int64_t c1, kb_dtype dt)
{
    return c1 > c0 ? tl_recv_into_async(tl, d, atd(tile, c0 * cnt, dt),
                                        KB_SHAPE1((c1 - c0) * cnt), dt)
                   : NULL;
}

static void send_chunks(kb_tl *tl, kb_dir d, kb_va tile, int64_t cnt, int64_t c0, int64_t c1,
                        kb_dtype dt)
{
    if (c1 > c0)
        tl_send(tl, d, refd(tl, tile, c0 * cnt, (c1 - c0) * cnt, dt));
}

/*
 * MPI's recursive doubling with the fold for any world size (hypercube topology): a rank
 * below 2*rem with an even number hands its chunk to r+1 and, at the end, gets every other
 * chunk back from it; the 2^d survivors exchange in step k with the survivor v ^ 2^k the
 * block of 2^k survivors' chunks they hold (a contiguous range of chunks), so the data held
 * doubles each step. Messages go HBM -> peer ring -> HBM and travel as chunks of a slot
 * (receives posted first).
 */
static void rd_allgather(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl), cnt = n / ws;
    int d = kb_topo_hypercube_dims((int)ws);
    int64_t rem = ws - ((int64_t)1 << d);
    kb_dir fold = (kb_dir)d;
    kb_va tile = kb_ccl_my_tile(tl, a);
    kb_dtype dt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];

    assert(cnt * ws == n); /* rd_check */
    if (ws < 2)
        return;
    if (r < 2 * rem && !(r & 1)) { /* folded: give the chunk, get the rest */
        kb_ipcq_req *lo = post_chunks(tl, fold, tile, cnt, 0, r, dt);
        kb_ipcq_req *hi = post_chunks(tl, fold, tile, cnt, r + 1, ws, dt);
        send_chunks(tl, fold, tile, cnt, r, r + 1, dt);
        if (lo)
            (void)tl_wait(tl, lo);
        (void)tl_wait(tl, hi);
        return;
    }
    if (r < 2 * rem)
        tl_recv_into(tl, fold, atd(tile, (r - 1) * cnt, dt), KB_SHAPE1(cnt), dt);
    int64_t v = r < 2 * rem ? r / 2 : r - rem;
    for (int k = 0; k < d; k++) {
        int64_t w = (int64_t)1 << k, vb = v & ~(w - 1), pb = vb ^ w;
        int64_t m0 = first_chunk(vb, rem), m1 = first_chunk(vb + w, rem);
        int64_t p0 = first_chunk(pb, rem), p1 = first_chunk(pb + w, rem);
        kb_ccl_sendrecv_into(tl, (kb_dir)k, refd(tl, tile, m0 * cnt, (m1 - m0) * cnt, dt),
                             (kb_dir)k, atd(tile, p0 * cnt, dt), KB_SHAPE1((p1 - p0) * cnt), dt);
    }
    if (r < 2 * rem) { /* the folded partner r-1 gets everything but its own chunk */
        send_chunks(tl, fold, tile, cnt, 0, r - 1, dt);
        send_chunks(tl, fold, tile, cnt, r, ws, dt);
    }
}

/* ---- recursive halving reduce_scatter ---- */

#define RH_MAX_WS 2048 /* the hypercube's directions (kb_topo_hypercube_dims + 1 <= KB_NDIRS) */

/*
 * One block: elements [b0, b0 + bl) of every chunk, one piece (value) per chunk, so a range
 * of chunks is a list of pieces and every message is one piece (at most a slot of f32).
 * MPI's recursive halving with the fold (hypercube topology): a rank below 2*rem with an
 * even number sends its raw pieces to r+1 and gets its chunk's total back at the end; r+1
 * adds them to its own. The 2^d survivors then halve: in step k = d-1 .. 0 survivor v keeps
 * the half of its range of survivors' blocks that holds its own, sends the other half to
 * v ^ 2^k and adds what v ^ 2^k sends of its half (receives posted first). Survivor v ends
 * with the totals of its block, chunks [first_chunk(v), first_chunk(v + 1)): it stores chunk
 * r and, folded, sends chunk r-1 to r-1. Partial sums travel in f32 (raw f16 before a rank's
 * first addition) and are rounded once when stored.
 */
/* Piece b (pieces of S elements) of chunk c of a tile of n elements cut into ws balanced
 * chunks (kb_ccl_chunk; for the chunked kinds chunk c is [c * count, (c + 1) * count)):
 * its length (0 past the chunk's end) and its tile offset in *off. */
static int64_t rh_piece(int64_t n, int64_t ws, int64_t c, int64_t b, int64_t S, int64_t *off)
{
    uint32_t co, cl;
    kb_ccl_chunk(n, ws, c, &co, &cl);
    int64_t len = kb_ccl_piece((int64_t)cl, S, b, off);
    *off += (int64_t)co;
    return len;
}

static void rh_block(kb_tl *tl, kb_va tile, int64_t ws, int64_t r, int64_t n, int64_t b,
                     int64_t S, int keep, kb_val *acc, kb_ipcq_req **rq)
{
    int d = kb_topo_hypercube_dims((int)ws);
    int64_t rem = ws - ((int64_t)1 << d), off, len;
    kb_dir fold = (kb_dir)d;

    if (r < 2 * rem && !(r & 1)) { /* folded: hand over the raw pieces, get chunk r back */
        kb_ipcq_req *back = NULL;
        if ((len = rh_piece(n, ws, r, b, S, &off)) != 0)
            back = tl_recv_async(tl, fold, KB_SHAPE1(len), KB_F32);
        for (int64_t c = 0; c < ws; c++)
            if ((len = rh_piece(n, ws, c, b, S, &off)) != 0)
                tl_send(tl, fold, ref16(tl, tile, off, len));
        if (back) {
            kb_val v = tl_wait(tl, back);
            rh_piece(n, ws, r, b, S, &off);
            tl_store(tl, at(tile, off), v);
            tl_free(tl, v);
        }
        return;
    }
    /* acc[c]: the partial result of chunk c's piece while this rank holds it */
    if (r < 2 * rem) {
        for (int64_t c = 0; c < ws; c++)
            if ((len = rh_piece(n, ws, c, b, S, &off)) != 0)
                rq[c] = tl_recv_async(tl, fold, KB_SHAPE1(len), KB_F16);
        for (int64_t c = 0; c < ws; c++) {
            if ((len = rh_piece(n, ws, c, b, S, &off)) == 0)
                continue;
            kb_val in = tl_wait(tl, rq[c]);
            kb_val own = tl_load(tl, at(tile, off), KB_SHAPE1(len), KB_F16);
            acc[c] = tl_add(tl, own, in);
            tl_free(tl, own);
            tl_free(tl, in);
        }
    } else {
        for (int64_t c = 0; c < ws; c++)
            if ((len = rh_piece(n, ws, c, b, S, &off)) != 0)
                acc[c] = tl_load(tl, at(tile, off), KB_SHAPE1(len), KB_F16);
    }
    int64_t v = r < 2 * rem ? r / 2 : r - rem;
    for (int k = d - 1; k >= 0; k--) {
        int64_t w = (int64_t)1 << k, mine = v & ~(w - 1), other = mine ^ w;
        int64_t m0 = first_chunk(mine, rem), m1 = first_chunk(mine + w, rem);
        int64_t o0 = first_chunk(other, rem), o1 = first_chunk(other + w, rem);
        /* what the partner sends: raw f16 before its first addition (a survivor that did not
         * fold, in the first step), else f32 sums */
        int64_t pv = v ^ w, pr = pv < rem ? 2 * pv + 1 : pv + rem;
        kb_dtype in_dt = k == d - 1 && pr >= 2 * rem ? KB_F16 : KB_F32;
        for (int64_t c = m0; c < m1; c++)
            if ((len = rh_piece(n, ws, c, b, S, &off)) != 0)
                rq[c] = tl_recv_async(tl, (kb_dir)k, KB_SHAPE1(len), in_dt);
        for (int64_t c = o0; c < o1; c++)
            if (rh_piece(n, ws, c, b, S, &off) != 0) {
                tl_send(tl, (kb_dir)k, acc[c]);
                tl_free(tl, acc[c]);
            }
        for (int64_t c = m0; c < m1; c++) {
            if (rh_piece(n, ws, c, b, S, &off) == 0)
                continue;
            kb_val in = tl_wait(tl, rq[c]);
            kb_val sum = tl_add(tl, acc[c], in);
            tl_free(tl, acc[c]);
            tl_free(tl, in);
            acc[c] = sum;
        }
    }
    int64_t c0 = first_chunk(v, rem), c1 = first_chunk(v + 1, rem);
    for (int64_t c = c0; c < c1; c++) {
        /* a survivor's block is its own chunk and, folded, its partner's r - 1 */
        assert(c == r || (r < 2 * rem && c == r - 1));
        if (rh_piece(n, ws, c, b, S, &off) == 0)
            continue;
        if (c == r || keep) /* keep: the all-reduce stores the partner's total too */
            tl_store(tl, at(tile, off), acc[c]);
        if (c != r) /* the folded partner's chunk r-1 */
            tl_send(tl, fold, acc[c]);
        tl_free(tl, acc[c]);
    }
}

/* The reduce-scatter of rh_reducescatter and rhd_allreduce: every piece b of every chunk;
 * keep: a folded pair's survivor stores its partner's total too (the all-gather sends it). */
static void rh_phase(kb_tl *tl, kb_va tile, int64_t ws, int64_t r, int64_t n, int keep)
{
    /* a block's pieces: one slot of f32 each at most, all ws of them within
     * KB_CCL_STREAM_BYTES of scratch */
    int64_t S = slice_elems(tl, 4), cap = (int64_t)(KB_CCL_STREAM_BYTES / 4u) / ws;
    int64_t longest = (n + ws - 1) / ws;
    kb_val acc[RH_MAX_WS];
    kb_ipcq_req *rq[RH_MAX_WS];

    assert(ws <= RH_MAX_WS); /* rh_check, rhd_check */
    if (cap < S)
        S = cap > 0 ? cap : 1;
    for (int64_t b = 0; b * S < longest; b++)
        rh_block(tl, tile, ws, r, n, b, S, keep, acc, rq);
}

static void rh_reducescatter(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS];

    if (ws < 2)
        return;
    rh_phase(tl, kb_ccl_my_tile(tl, a), ws, kb_ccl_rank(tl), n, 0);
}

/* ---- recursive halving-doubling all_reduce ---- */

/* Tile offset of chunk c of a tile of n elements in ws balanced chunks (c = ws: n). */
static int64_t chunk_at(int64_t n, int64_t ws, int64_t c)
{
    uint32_t co, cl;
    if (c >= ws)
        return n;
    kb_ccl_chunk(n, ws, c, &co, &cl);
    return (int64_t)co;
}

/* Sends elements [e0, e1) of the tile on d (nothing when empty). */
static void send_span(kb_tl *tl, kb_dir d, kb_va tile, int64_t e0, int64_t e1)
{
    if (e1 > e0)
        tl_send(tl, d, ref16(tl, tile, e0, e1 - e0));
}

static kb_ipcq_req *post_span(kb_tl *tl, kb_dir d, kb_va tile, int64_t e0, int64_t e1)
{
    return e1 > e0 ? tl_recv_into_async(tl, d, at(tile, e0), KB_SHAPE1(e1 - e0), KB_F16) : NULL;
}

/*
 * Rabenseifner's all-reduce as MPI implements it for any world size: the recursive-halving
 * reduce-scatter above (rh_phase: rank r ends with chunk r's total in its tile, chunks being
 * the tile cut into ws balanced ones), then recursive doubling of the totals (rd_allgather's
 * exchange on contiguous chunk ranges) and the unfold: a folded rank gets every chunk but its
 * own from r+1. 2(p-1)/p of the data per rank for a power of two, in log2(p) steps each way.
 */
static void rhd_allreduce(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl);
    int d = kb_topo_hypercube_dims((int)ws);
    int64_t rem = ws - ((int64_t)1 << d);
    kb_dir fold = (kb_dir)d;
    kb_va tile = kb_ccl_my_tile(tl, a);

    if (ws < 2)
        return;
    rh_phase(tl, tile, ws, r, n, 1);
    if (r < 2 * rem && !(r & 1)) { /* folded: every chunk but its own comes back */
        kb_ipcq_req *lo = post_span(tl, fold, tile, 0, chunk_at(n, ws, r));
        kb_ipcq_req *hi = post_span(tl, fold, tile, chunk_at(n, ws, r + 1), n);
        if (lo)
            (void)tl_wait(tl, lo);
        if (hi)
            (void)tl_wait(tl, hi);
        return;
    }
    int64_t v = r < 2 * rem ? r / 2 : r - rem;
    for (int k = 0; k < d; k++) {
        int64_t w = (int64_t)1 << k, vb = v & ~(w - 1), pb = vb ^ w;
        int64_t m0 = chunk_at(n, ws, first_chunk(vb, rem));
        int64_t m1 = chunk_at(n, ws, first_chunk(vb + w, rem));
        int64_t p0 = chunk_at(n, ws, first_chunk(pb, rem));
        int64_t p1 = chunk_at(n, ws, first_chunk(pb + w, rem));
        kb_ipcq_req *rq = post_span(tl, (kb_dir)k, tile, p0, p1);
        send_span(tl, (kb_dir)k, tile, m0, m1);
        if (rq)
            (void)tl_wait(tl, rq);
    }
    if (r < 2 * rem) { /* the folded partner r-1 gets everything but its own chunk */
        send_span(tl, fold, tile, 0, chunk_at(n, ws, r - 1));
        send_span(tl, fold, tile, chunk_at(n, ws, r), n);
    }
}

/* ---- checks, message sizes, entries ---- */

static int chunked_check(const char *who, int ws, int64_t n, kb_errbuf *eb)
{
    if (ws < 1 || n % ws)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: a tile of %lld elements is not %d chunks "
                          "(the tile is world size x count)", who, (long long)n, ws);
    return 0;
}

static int ag_check(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb)
{
    (void)g;
    return chunked_check("ring_allgather", ws, n, eb);
}

static int rs_check(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb)
{
    (void)g;
    return chunked_check("ring_reducescatter", ws, n, eb);
}

static int rd_check(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb)
{
    (void)g;
    return chunked_check("rd_allgather", ws, n, eb);
}

static int rh_check(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb)
{
    (void)g;
    if (ws > RH_MAX_WS)
        return kb_err_set(eb, KB_ERR_CONFIG, "rh_reducescatter: world size %d > %d (the "
                          "hypercube's directions)", ws, RH_MAX_WS);
    return chunked_check("rh_reducescatter", ws, n, eb);
}

static int rhd_check(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb)
{
    (void)g;
    (void)n; /* any n: chunks shorter than the world are empty on both sides */
    if (ws > RH_MAX_WS)
        return kb_err_set(eb, KB_ERR_CONFIG, "rhd_allreduce: world size %d > %d (the "
                          "hypercube's directions)", ws, RH_MAX_WS);
    return 0;
}

/* the doubling's last exchange and the unfold move (almost) the whole f16 tile */
static uint64_t rhd_msg(int64_t n, int ws) { (void)ws; return (uint64_t)n * 2u; }

/* Any world size: the full mesh's ws - 1 peer directions are bounded by the machine's PEs
 * and the IPCQ area, which the topology and the install check with their own messages. */
static int a2a_check(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb)
{
    (void)g;
    return chunked_check("pairwise_alltoall", ws, n, eb);
}

/* Largest messages: one slice, i.e. a chunk (or the tile) of f16 or f32 up to a slot; the
 * mock runtime sizes its slots with these, so its runs use one slice per chunk. */
static uint64_t tile16(int64_t n, int ws) { (void)ws; return (uint64_t)n * 2u; }
static uint64_t tile32(int64_t n, int ws) { (void)ws; return (uint64_t)n * 4u; }
static uint64_t chunk16(int64_t n, int ws) { return (uint64_t)(n / (ws > 0 ? ws : 1)) * 2u; }
static uint64_t chunk32(int64_t n, int ws) { return (uint64_t)(n / (ws > 0 ? ws : 1)) * 4u; }
/* recursive doubling's last step and the unfold move (almost) the whole tile */
static uint64_t whole16(int64_t n, int ws) { (void)ws; return (uint64_t)n * 2u; }

const kb_ccl_algo_impl kb_ccl_algo_ring_allgather = {
    .module = "ring_allgather",
    .summary = "ring: p-1 steps forwarding the chunk received last, (p-1)/p of the buffer per rank",
    .kind = KB_COLL_ALLGATHER,
    .topology = "ring_1d",
    .kernel = ring_allgather,
    .check = ag_check,
    .max_msg_bytes = chunk16,
    .reference = kb_ccl_ref_allgather,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
};
const kb_ccl_algo_impl kb_ccl_algo_ring_reducescatter = {
    .module = "ring_reducescatter",
    .summary = "ring: p-1 steps of receive, add the own chunk, send on; rank r keeps chunk r's sum",
    .kind = KB_COLL_REDUCE_SCATTER,
    .topology = "ring_1d",
    .kernel = ring_reducescatter,
    .check = rs_check,
    .max_msg_bytes = chunk16,
    .reference = kb_ccl_ref_reduce_scatter,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
    .ordered = kb_ccl_ref_ring_reduce_scatter,
};
const kb_ccl_algo_impl kb_ccl_algo_p2p_sendrecv = {
    .module = "p2p_sendrecv",
    .summary = "rank r sends its tile to r+1 and receives r-1's, slice by slice",
    .kind = KB_COLL_SENDRECV,
    .topology = "ring_1d",
    .kernel = p2p_sendrecv,
    .max_msg_bytes = tile16,
    .reference = kb_ccl_ref_shift_east,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
};
const kb_ccl_algo_impl kb_ccl_algo_ring_broadcast = {
    .module = "ring_broadcast",
    .summary = "pipelined chain from the root around the ring, slice by slice",
    .kind = KB_COLL_BROADCAST,
    .topology = "ring_1d",
    .kernel = ring_broadcast,
    .max_msg_bytes = tile16,
    .reference = kb_ccl_ref_broadcast,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
};
const kb_ccl_algo_impl kb_ccl_algo_ring_reduce = {
    .module = "ring_reduce",
    .summary = "pipelined chain around the ring ending at the root, partials in the tile's dtype",
    .kind = KB_COLL_REDUCE,
    .topology = "ring_1d",
    .kernel = ring_reduce,
    .max_msg_bytes = tile32,
    .reference = kb_ccl_ref_reduce,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
    .ordered = kb_ccl_ref_ring_reduce,
};
const kb_ccl_algo_impl kb_ccl_algo_tree_broadcast = {
    .module = "tree_broadcast",
    .summary = "pipelined binary tree hanging from the root, slice by slice",
    .kind = KB_COLL_BROADCAST,
    .topology = "tree_binary",
    .kernel = tree_broadcast,
    .max_msg_bytes = tile16,
    .reference = kb_ccl_ref_broadcast,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
};
const kb_ccl_algo_impl kb_ccl_algo_tree_reduce = {
    .module = "tree_reduce",
    .summary = "pipelined binary tree: f32 partial sums flow up to the root",
    .kind = KB_COLL_REDUCE,
    .topology = "tree_binary",
    .kernel = tree_reduce,
    .max_msg_bytes = tile32,
    .reference = kb_ccl_ref_reduce,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
};
const kb_ccl_algo_impl kb_ccl_algo_pairwise_alltoall = {
    .module = "pairwise_alltoall",
    .summary = "ws-1 pairwise chunk swaps over a full mesh (ws-1 peer queues per PE)",
    .kind = KB_COLL_ALLTOALL,
    .topology = "full_mesh",
    .kernel = pairwise_alltoall,
    .check = a2a_check,
    .max_msg_bytes = chunk16,
    .reference = kb_ccl_ref_alltoall,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
};
const kb_ccl_algo_impl kb_ccl_algo_rh_reducescatter = {
    .module = "rh_reducescatter",
    .summary = "recursive halving (MPI's fold for any world size): log2(p) exchanges of halving ranges, f32 sums",
    .kind = KB_COLL_REDUCE_SCATTER,
    .topology = "hypercube",
    .kernel = rh_reducescatter,
    .check = rh_check,
    .max_msg_bytes = chunk32,
    .reference = kb_ccl_ref_reduce_scatter,
    .flags = KB_CCL_ANY_WORLD,
};
const kb_ccl_algo_impl kb_ccl_algo_rhd_allreduce = {
    .module = "rhd_allreduce",
    .summary = "recursive halving-doubling (Rabenseifner; MPI's fold for any world size): rh reduce-scatter + rd all-gather",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "hypercube",
    .kernel = rhd_allreduce,
    .check = rhd_check,
    .max_msg_bytes = rhd_msg,
    .reference = kb_ccl_ref_allreduce,
    .flags = KB_CCL_ANY_WORLD,
};
const kb_ccl_algo_impl kb_ccl_algo_rd_allgather = {
    .module = "rd_allgather",
    .summary = "recursive doubling (MPI's fold for any world size): log2(p) exchanges of doubling blocks",
    .kind = KB_COLL_ALLGATHER,
    .topology = "hypercube",
    .kernel = rd_allgather,
    .check = rd_check,
    .max_msg_bytes = whole16,
    .reference = kb_ccl_ref_allgather,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
};
