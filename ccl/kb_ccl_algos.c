/*
 * kb_ccl_algos — the collective algorithms as kernels over the tl + IPCQ API, and their
 * registry entries (kb_ccl.h). Every rank's tile is n f16 elements; partial sums travel in f32
 * (exact for kb_ccl_inputs' data) and are rounded once when stored. All algorithms run in
 * the rank = PE world (kb_ccl_layout_whole); hierarchical_allreduce also serves the
 * rank = SIP process group (its rank = SIP form is at the end of this file). The registry of
 * every built-in algorithm, both rank models, is this file's algos[].
 *
 *  hello_send             each rank sends its tile E and keeps what arrives from W
 *  ring_allreduce         the seed's ring: p-1 rounds, each forwards the tile it last got
 *  ring_rsag_allreduce    bandwidth-optimal ring: reduce-scatter then all-gather of p chunks
 *                         (each rank sends 2(p-1)/p of the data)
 *  mesh_allreduce         ring along each row (E/W) then along each column (N/S); k x k world
 *  tree_allreduce         binary tree in heap order: reduce to rank 0, broadcast back
 *  hierarchical_allreduce bidirectional chain reduce inside each cube (E/W) and among the
 *                         cubes' PE 0 (N/S), ring among SIP leaders (global_E/W), chain
 *                         broadcast back down
 *
 * Every one runs at any tile size: a tile whose messages fit one slot (and whose f32 sums fit
 * KB_CCL_STREAM_BYTES) takes the whole-tile code; a larger one streams with scratch bounded by
 * a few slot-sized slices (ring, rsag, tree and hierarchical slice by slice, mesh block by
 * block through kb_ccl_run_tile; docs/collectives.md §4).
 */
#include <assert.h>
#include <string.h>

#include "kb_ccl.h"
#include "kb_dist_algo.h"

static kb_dtype dt_of(kb_val v) { return (kb_dtype)v.dtype; }

/* acc + in, releasing the previous accumulator unless it is `keep`. */
static kb_val accumulate(kb_tl *tl, kb_val acc, kb_val in, kb_val keep)
{
    kb_val s = tl_add(tl, acc, in);
    if (acc.pa != keep.pa)
        tl_free(tl, acc);
    tl_free(tl, in);
    return s;
}

/* accumulate for op: a new partial result acc (op) in, written in dtype dt; acc is released
 * unless it is keep. */
static kb_val combine_op(kb_tl *tl, int op, kb_val acc, kb_val in, kb_val keep, kb_dtype dt)
{
    kb_val s = kb_ccl_combine_as(tl, op, acc, in, dt);
    if (acc.pa != keep.pa)
        tl_free(tl, acc);
    tl_free(tl, in);
    return s;
}

/* ---- hello_send ---- */

static void hello_send(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N];
    kb_va mine = kb_ccl_my_tile(tl, a);
    if (a->i[KB_CCL_ARG_WS] < 2)
        return;
    kb_val v = tl_load(tl, mine, KB_SHAPE1(n), KB_F16);
    kb_ccl_sendrecv_into(tl, KB_DIR_E, v, KB_DIR_W, mine, KB_SHAPE1(n), KB_F16);
}

/* ---- ring ---- */

/* The whole ring over the n elements at `mine` (the tile, or one block of it). */
static void ring_tile(kb_tl *tl, const kb_kargs *a, kb_va mine, int64_t n)
{
    int64_t ws = a->i[KB_CCL_ARG_WS];
    kb_val v0 = tl_load(tl, mine, KB_SHAPE1(n), KB_F16), acc = v0, cur = v0;

    for (int64_t step = 0; step + 1 < ws; step++) {
        kb_val in = kb_ccl_sendrecv(tl, KB_DIR_E, cur, (kb_val){ 0 }, KB_DIR_W, KB_SHAPE1(n),
                                    KB_F16);
        kb_val s = tl_add(tl, acc, in);
        if (acc.pa != v0.pa)
            tl_free(tl, acc);
        if (cur.pa != v0.pa)
            tl_free(tl, cur);
        acc = s;
        cur = in;
    }
    tl_store(tl, mine, acc);
    /* nothing is allocated after this: a streamed tile's next block starts from free scratch */
    if (cur.pa != v0.pa && cur.pa != acc.pa)
        tl_free(tl, cur);
    if (acc.pa != v0.pa)
        tl_free(tl, acc);
    tl_free(tl, v0);
}

/* Slices a streamed block holds at most (one posted receive each per direction). */
#define STREAM_MAX_SLICES 64
/* Scratch ring_allreduce's streamed form gives a block's f32 sums with posted sends. */
#define KB_CCL_RING_SUMS_BYTES ((uint64_t)4 << 20)

/* Slices per block of a streamed form whose slices take `scale` x slot bytes of scratch each:
 * as many as KB_CCL_STREAM_BYTES holds, 1 to STREAM_MAX_SLICES. */
static int64_t stream_per(uint64_t slot, uint64_t scale)
{
    int64_t per = (int64_t)(KB_CCL_STREAM_BYTES / (slot * scale));
    return per < 1 ? 1 : per > STREAM_MAX_SLICES ? STREAM_MAX_SLICES : per;
}

/*
 * The streamed ring, for tiles longer than a slot: blocks of `per` slices of one slot of f16
 * each. Step 0 sends the rank's own slices straight from the tile; every later step forwards
 * each slice as soon as it has arrived (NCCL's recvSend), so a slice moves on to the next hop
 * while the following ones still arrive, and adds it to that slice's f32 sum. The own slice
 * is loaded when its first neighbour slice comes; the last step stores the sum. The next
 * step's receive of a slice is posted when the slice is consumed, which keeps the queue's
 * posted receives in arrival order. Scratch: per sums and two receives per slice.
 */
static void ring_block(kb_tl *tl, kb_va mine, int64_t n, int64_t ws, int64_t S, int64_t per,
                       kb_ipcq_req **rq, kb_val *acc)
{
    int64_t off, len;

    for (int64_t j = 0; j < per; j++)
        rq[j] = (len = kb_ccl_piece(n, S, j, &off)) != 0
                    ? tl_recv_async(tl, KB_DIR_W, KB_SHAPE1(len), KB_F16)
                    : NULL;
    for (int64_t j = 0; j < per; j++)
        if ((len = kb_ccl_piece(n, S, j, &off)) != 0)
            kb_ccl_send(tl, KB_DIR_E,
                        tl_ref(tl, kb_ccl_elem_va(mine, off, KB_F16), KB_SHAPE1(len), KB_F16));
    int posted = kb_ipcq_posted(tl_ctx(tl));
    for (int64_t s = 0; s + 1 < ws; s++) {
        int last = s + 2 == ws;
        for (int64_t j = 0; j < per && (len = kb_ccl_piece(n, S, j, &off)) != 0; j++) {
            kb_va va = kb_ccl_elem_va(mine, off, KB_F16);
            kb_val in = tl_wait(tl, rq[j]), sum;
            int64_t landed = 0; /* a posted forward reads `in` until then */
            rq[j] = last ? NULL : tl_recv_async(tl, KB_DIR_W, KB_SHAPE1(len), KB_F16);
            if (!last && posted)
                landed = tl_send_async(tl, KB_DIR_E, in);
            else if (!last)
                tl_send(tl, KB_DIR_E, in);
            if (s == 0) {
                kb_val own = tl_load(tl, va, KB_SHAPE1(len), KB_F16);
                sum = tl_add(tl, own, in);
                tl_free(tl, own);
            } else if (posted) { /* in place: no 1 MiB sums churning scratch beside held
                                  * receives (fragmentation) */
                tl_binary_into(tl, KB_BIN_ADD, acc[j], acc[j], in);
                sum = acc[j];
            } else {
                sum = tl_add(tl, acc[j], in);
                tl_free(tl, acc[j]);
            }
            tl_free_after(tl, in, landed);
            acc[j] = sum;
            if (last) {
                tl_store(tl, va, sum);
                tl_free(tl, sum);
            }
        }
    }
    /* the last step posts nothing: the next block's receives start the queue afresh */
    for (int64_t j = 0; j < per; j++)
        assert(!rq[j]);
}

/* The streamed forms (here and below) are out of line: inlined, their slice arrays would
 * widen the frames of the whole-tile kernels, whose cold stacks every resume touches. */
static KB_NOINLINE void ring_streamed(kb_tl *tl, int64_t n, int64_t ws, kb_va mine)
{
    uint64_t slot = kb_ipcq_slot_size(tl_ctx(tl));
    /* a slice: one slot of f16; its scratch: an f32 sum (2 slots) and two receives */
    int64_t S = (int64_t)(slot / 2u), per = stream_per(slot, 4), off, len;
    if (kb_ipcq_posted(tl_ctx(tl))) {
        /* posted sends: the queue's window of slices per block, each at most what lets their
         * f32 sums (kept across every step) fit in KB_CCL_RING_SUMS_BYTES of scratch */
        per = (int64_t)tl_slot_count(tl, KB_DIR_E);
        per = per < STREAM_MAX_SLICES ? per : STREAM_MAX_SLICES;
        int64_t cap = (int64_t)(KB_CCL_RING_SUMS_BYTES / 4u) / per;
        S = kb_ccl_slice_elems(slot, per, n < cap * per ? n : cap * per, 2);
        S = S < cap ? S : cap;
    }
    int64_t blk = per * S;
    kb_ipcq_req *rq[STREAM_MAX_SLICES];
    kb_val acc[STREAM_MAX_SLICES];
    assert(per >= 1 && per <= STREAM_MAX_SLICES && S >= 1);

    for (int64_t b = 0; (len = kb_ccl_piece(n, blk, b, &off)) != 0; b++)
        ring_block(tl, kb_ccl_elem_va(mine, off, KB_F16), len, ws, S, per, rq, acc);
}

/* Messages are f16 tiles: a tile longer than a slot streams (ring_streamed); one rank only
 * loads and stores, block by block. */
static void ring_allreduce(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS];

    if (ws >= 2 && kb_ccl_stream_block(tl, n, 2)) {
        ring_streamed(tl, n, ws, kb_ccl_my_tile(tl, a));
        return;
    }
    kb_ccl_run_tile(tl, a, kb_ccl_my_tile(tl, a), n, KB_F16, 2, ring_tile);
}

static uint64_t tile_f16(int64_t n, int ws) { (void)ws; return (uint64_t)n * 2u; }
static uint64_t tile_f32(int64_t n, int ws) { (void)ws; return (uint64_t)n * 4u; }

/* ---- reduce-scatter + all-gather ring ---- */

static void chunk_of(int64_t n, int64_t ws, int64_t c, uint32_t *off, uint32_t *len)
{
    kb_ccl_chunk(n, ws, c, off, len);
}

/* A bound on the loops' counts (ws - 1 steps each way), not a machine's: 256 SIPs of 128 PEs
 * (the most the physical address's SIP field names) fit twice. Issue #34 runs 16 384 ranks. */
#define KB_RSAG_MAX_WS 65536

/*
 * The streamed form, for tiles whose chunks do not fit one slot (NCCL's ring protocol). The
 * tile is cut into ws chunks as the whole-tile form cuts it (kb_ccl_chunk: chunk c's
 * reduction chain starts at rank c whatever the slot size, which is what the host reference
 * emulates), each chunk into slices of one slot of the tile's dtype, and block b is slices
 * [b * per, (b + 1) * per) of every chunk. Every reduce-scatter step moves a chunk slice by
 * slice — load the rank's own slice, take the incoming partial where it lies in the receive
 * slot (tl_recv_view_async), combine in f32 rounding to the dtype as it is written, hand the
 * slot back, send the result on (recvReduceSend) — so a slice travels on to the next hop
 * while the following ones are still arriving; the own slice is loaded before the wait, while
 * the neighbour's slice is still on its way. The receives of the next step are posted as the
 * current step consumes its slices, keeping the queue's posted requests in arrival order;
 * scratch holds a chunk's slices at most, whatever the tile's size.
 */
typedef struct rsag_blk {
    int64_t n, ws, r;           /* tile elements, world, rank */
    kb_va tile;                 /* the rank's tile */
    kb_dtype dt;                /* the tile's dtype */
    int op;                     /* kb_ccl_op */
    int64_t W;                  /* elements of a slice: one slot of dt */
    int64_t s0;                 /* the block's first slice of every chunk */
} rsag_blk;

/* Elements of slice s0 + j of chunk c (0 past its end), and its tile offset. */
static int64_t slice_of(const rsag_blk *b, int64_t c, int64_t j, int64_t *off)
{
    uint32_t co, cl;
    chunk_of(b->n, b->ws, ((c % b->ws) + b->ws) % b->ws, &co, &cl);
    int64_t len = kb_ccl_piece((int64_t)cl, b->W, b->s0 + j, off);
    *off += (int64_t)co;
    return len;
}

static kb_va tile_at(const rsag_blk *b, int64_t off) { return kb_ccl_elem_va(b->tile, off, b->dt); }

/* Posts the receive of slice j of chunk c: a reduce-scatter slice read in place (a view of
 * the slot), or an all-gather slice into the tile. */
static kb_ipcq_req *rsag_post(kb_tl *tl, const rsag_blk *b, int64_t c, int64_t j, int into)
{
    int64_t off, len = slice_of(b, c, j, &off);
    if (!len)
        return NULL;
    return into ? tl_recv_into_async(tl, KB_DIR_W, tile_at(b, off), KB_SHAPE1(len), b->dt)
                : tl_recv_view_async(tl, KB_DIR_W, KB_SHAPE1(len), b->dt);
}

/* The (step, slice) after (*s, *j) that the reduce-scatter combines (a non-empty slice of
 * chunk r-s-1); 0 past the last step. */
static int rsag_next(const rsag_blk *b, int64_t per, int64_t *s, int64_t *j)
{
    int64_t off;
    for (;;) {
        if (++*j == per) {
            *j = 0;
            ++*s;
        }
        if (*s + 1 >= b->ws)
            return 0;
        if (slice_of(b, b->r - *s - 1, *j, &off) != 0)
            return 1;
    }
}

/* Starts the load of the own slice j of step s (chunk r-s-1); its data are there at *ready. */
static kb_val rsag_own(kb_tl *tl, const rsag_blk *b, int64_t s, int64_t j, int64_t *ready)
{
    int64_t off, len = slice_of(b, b->r - s - 1, j, &off);
    return tl_load_async(tl, tile_at(b, off), KB_SHAPE1(len), b->dt, ready);
}

static void rsag_block(kb_tl *tl, const rsag_blk *b, int64_t per, kb_ipcq_req **rq)
{
    int64_t ws = b->ws, r = b->r, off, len;

    /* reduce-scatter: step 0 sends the rank's own chunk r; step s receives chunk r-s-1's
     * partial, combines it with the own slice and sends it on, until the last step holds
     * chunk r+1 complete */
    for (int64_t j = 0; j < per; j++)
        rq[j] = rsag_post(tl, b, r - 1, j, 0);
    for (int64_t j = 0; j < per; j++)
        if ((len = slice_of(b, r, j, &off)) != 0)
            kb_ccl_send(tl, KB_DIR_E, tl_ref(tl, tile_at(b, off), KB_SHAPE1(len), b->dt));
    /* the own slice of the next (step, slice) is loaded while this one is combined: PE_DMA
     * and PE_MATH work at once, as the all-gather's copy-out runs beside its send */
    int64_t ns = 0, nj = -1, rdy, nrdy = 0;
    kb_val nxt = { 0 };
    if (rsag_next(b, per, &ns, &nj))
        nxt = rsag_own(tl, b, ns, nj, &nrdy);
    for (int64_t s = 0; s + 1 < ws; s++) {
        int64_t c = r - s - 1, last = s + 2 == ws;
        for (int64_t j = 0; j < per; j++) {
            if (!rq[j])
                continue;
            len = slice_of(b, c, j, &off);
            kb_val own = nxt;
            rdy = nrdy;
            if (rsag_next(b, per, &ns, &nj))
                nxt = rsag_own(tl, b, ns, nj, &nrdy);
            kb_val in = tl_wait(tl, rq[j]), red;
            tl_wait_time(tl, rdy);
            if (last) { /* chunk r+1 is complete: f32, rounded once as it is stored */
                red = kb_ccl_combine(tl, b->op, own, in);
                tl_recv_release(tl, KB_DIR_W, in);
                rq[j] = NULL;
                red = kb_ccl_finish(tl, b->op, red, ws);
                tl_store(tl, tile_at(b, off), red);
            } else {
                red = kb_ccl_combine_as(tl, b->op, own, in, b->dt);
                tl_recv_release(tl, KB_DIR_W, in);
                rq[j] = rsag_post(tl, b, c - 1, j, 0); /* next step's */
                kb_ccl_send_free(tl, KB_DIR_E, red);
                red.scratch = 0; /* handed to the send */
            }
            tl_free(tl, own);
            tl_free(tl, red);
        }
        /* slices the next chunk has beyond this one's (chunks differ by one element) */
        for (int64_t j = 0; !last && j < per; j++)
            if (!rq[j] && slice_of(b, c, j, &off) == 0)
                rq[j] = rsag_post(tl, b, c - 1, j, 0);
    }
    /*
     * All-gather in the same slices: step 0 sends chunk r+1 and receives chunk r into the
     * tile; step s forwards chunk r-s+1 slice by slice as it lands, but the last. It starts
     * once the block's reduce-scatter is done (one chunk's bubble per block).
     */
    for (int64_t j = 0; j < per; j++)
        rq[j] = rsag_post(tl, b, r, j, 1);
    for (int64_t j = 0; j < per; j++)
        if ((len = slice_of(b, r + 1, j, &off)) != 0)
            kb_ccl_send(tl, KB_DIR_E, tl_ref(tl, tile_at(b, off), KB_SHAPE1(len), b->dt));
    for (int64_t s = 0; s + 1 < ws; s++) {
        int64_t c = r - s, last = s + 2 == ws;
        for (int64_t j = 0; j < per; j++) {
            if (!rq[j])
                continue;
            (void)tl_wait(tl, rq[j]);
            rq[j] = last ? NULL : rsag_post(tl, b, c - 1, j, 1);
            if (!last && (len = slice_of(b, c, j, &off)) != 0)
                kb_ccl_send(tl, KB_DIR_E, tl_ref(tl, tile_at(b, off), KB_SHAPE1(len), b->dt));
        }
        for (int64_t j = 0; !last && j < per; j++)
            if (!rq[j] && slice_of(b, c, j, &off) == 0)
                rq[j] = rsag_post(tl, b, c - 1, j, 1);
    }
    /* every receive the block posted was taken: none is left for the next block's slots */
    for (int64_t j = 0; j < per; j++)
        assert(!rq[j]);
}


static KB_NOINLINE void rsag_streamed(kb_tl *tl, int64_t n, int64_t ws, int64_t r, kb_va mine,
                          kb_dtype dt, int op)
{
    uint64_t slot = tl_slot_size(tl, KB_DIR_E);
    int64_t win = (int64_t)tl_slot_count(tl, KB_DIR_E);
    int posted = kb_ipcq_posted(tl_ctx(tl));
    /* posted: slices of a chunk per block up to the ring's window (below), each a slot or,
     * for chunks of fewer slots than the window, chunk / window; scratch holds three slices
     * whatever `per` is (the next own slice in flight, the current one, the result being
     * sent), each freed as soon as it is used. Not posted (the kernel before issue #29):
     * slices of a slot, as many per block as KB_CCL_STREAM_BYTES holds. */
    int64_t W = posted ? kb_ccl_slice_elems(slot, win, tl_cdiv(n, ws), kb_dtype_size(dt))
                       : (int64_t)(slot / kb_dtype_size(dt));
    int64_t per = posted ? STREAM_MAX_SLICES : stream_per(slot, 1);
    /* step 0 sends a block's own slices before taking any in, and a neighbour holding its
     * views while it sends takes in none of them: no more than the ring's window */
    if (per > win)
        per = win;
    int64_t nsl = tl_cdiv(tl_cdiv(n, ws), W); /* slices of the longest chunk */
    kb_ipcq_req *rq[STREAM_MAX_SLICES];

    if (nsl < per)
        per = nsl;
    assert(per <= STREAM_MAX_SLICES); /* rq[] */
    for (int64_t s0 = 0; s0 < nsl; s0 += per) {
        rsag_blk b = { n, ws, r, mine, dt, op, W, s0 };
        rsag_block(tl, &b, nsl - s0 < per ? nsl - s0 : per, rq);
    }
}


/* The whole-tile form's reduce-scatter: with the tile in scratch, ws - 1 steps of one message
 * each; returns the rank's reduced chunk (own = (r + 1) mod ws), not yet finished. Each phase
 * is a function of its own (KB_NOINLINE): every step a kernel's fiber writes its stack from
 * the loop's frame down to the deepest call, and with one frame for the set-up and both
 * phases an all-gather step went down through the reduce-scatter's temporaries too (16 stack
 * lines a step instead of 11; docs/parallel.md "Lines per step"). */
static KB_NOINLINE kb_val rsag_reduce_scatter(kb_tl *tl, int64_t n, int64_t ws, int64_t r,
                                              kb_val tile, int op)
{
    kb_dtype tdt = (kb_dtype)tile.dtype;
    uint32_t off, len;
    /*
     * Chunk c's running sum lives in `part` only while this rank holds it: in step s the rank
     * sends chunk (r - s) and receives chunk (r - s - 1), so the running sum received in one
     * step is the one sent in the next. Step 0 sends the raw chunk; every partial travels in
     * the tile's dtype (combined in f32, rounded as it is written), the last one is rounded
     * once as it is stored.
     */
    kb_val part;
    chunk_of(n, ws, ((r % ws) + ws) % ws, &off, &len);
    part = kb_val_slice(tile, off, len);
    /* with n < ws some chunks are empty: both neighbours skip them (same chunk_of) */
    for (int64_t s = 0; s + 1 < ws; s++) {
        int64_t rc = ((r - s - 1) % ws + ws) % ws;
        uint32_t slen = len;
        kb_val sent = part, in;
        chunk_of(n, ws, rc, &off, &len);
        /* kb_ccl_sendrecv's order (send, free, receive), without its path for messages
         * longer than a slot, which this form never has: its temporaries deepened every
         * step's stack by a line */
        if (slen)
            tl_send(tl, KB_DIR_E, sent);
        if (sent.scratch)
            tl_free(tl, sent);
        if (!len) {
            part = kb_val_slice(tile, off, 0);
            continue;
        }
        in = tl_recv(tl, KB_DIR_W, KB_SHAPE1(len), tdt);
        part = combine_op(tl, op, kb_val_slice(tile, off, len), in, tile,
                          s + 2 == ws ? KB_F32 : tdt);
    }
    return part;
}

/* The whole-tile form's all-gather: every rank's reduced chunk, stored at `mine`, goes round
 * the ring into every other rank's tile. */
static KB_NOINLINE void rsag_all_gather(kb_tl *tl, int64_t n, int64_t ws, int64_t r, kb_va mine,
                                        kb_dtype tdt)
{
    uint64_t es = kb_dtype_size(tdt);
    for (int64_t s = 0; s + 1 < ws; s++) {
        int64_t sc = ((r + 1 - s) % ws + ws) % ws, rc = ((r - s) % ws + ws) % ws;
        uint32_t soff, slen, off, len;
        chunk_of(n, ws, sc, &soff, &slen);
        chunk_of(n, ws, rc, &off, &len);
        if (slen && len) {
            kb_ccl_sendrecv_into(tl, KB_DIR_E,
                                 tl_ref(tl, mine + (kb_va)soff * es, KB_SHAPE1(slen), tdt),
                                 KB_DIR_W, mine + (kb_va)off * es, KB_SHAPE1(len), tdt);
            continue;
        }
        if (slen)
            tl_send(tl, KB_DIR_E, tl_ref(tl, mine + (kb_va)soff * es, KB_SHAPE1(slen), tdt));
        if (len)
            tl_recv_into(tl, KB_DIR_W, mine + (kb_va)off * es, KB_SHAPE1(len), tdt);
    }
}

static void ring_rsag_allreduce(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N], ws = a->i[KB_CCL_ARG_WS];
    int64_t r = kb_ccl_rank(tl);
    kb_va mine = kb_ccl_my_tile(tl, a);
    kb_dtype tdt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];
    int op = (int)a->i[KB_CCL_ARG_OP];
    uint64_t es = kb_dtype_size(tdt);

    /* the whole-tile path holds the tile in scratch: a tile past half of it streams too,
     * though its chunks fit a slot (8 MiB of f16 per rank on 256 ranks) */
    if (ws >= 2 && ((uint64_t)((n + ws - 1) / ws) * es > tl_slot_size(tl, KB_DIR_E) ||
                    (uint64_t)n * es > kb_ctx_machine(tl_ctx(tl))->cfg.scratch_size_bytes / 2u)) {
        rsag_streamed(tl, n, ws, r, mine, tdt, op);
        return;
    }
    /* every chunk fits one slot: the whole tile in scratch, one message per step */
    kb_val tile = tl_load(tl, mine, KB_SHAPE1(n), tdt);
    uint32_t off, len;

    if (ws < 2) {
        tl_store(tl, mine, tile);
        return;
    }
    kb_val part = rsag_reduce_scatter(tl, n, ws, r, tile, op);
    /* this rank now holds the full sum of chunk (r + 1) mod ws: store it, then all-gather */
    int64_t own = (r + 1) % ws;
    chunk_of(n, ws, own, &off, &len);
    assert(part.cols == len);
    if (len) {
        part = kb_ccl_finish(tl, op, part, ws);
        tl_store(tl, mine + (kb_va)off * es, part);
    }
    if (part.scratch)
        tl_free(tl, part);
    rsag_all_gather(tl, n, ws, r, mine, tdt);
}

static uint64_t rsag_msg(int64_t n, int ws)
{
    return (uint64_t)((n + ws - 1) / ws) * 4u;
}

static int rsag_check(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb)
{
    (void)g;
    if (ws > KB_RSAG_MAX_WS)
        return kb_err_set(eb, KB_ERR_CONFIG, "ring_rsag_allreduce: world size %d > %d", ws,
                          KB_RSAG_MAX_WS);
    (void)n; /* n < ws is fine: the empty chunks are skipped on both sides */
    return 0;
}

/* ---- mesh ---- */

/* Ring all-reduce of `acc` among the k members of a row (E/W) or column (N/S). */
static kb_val ring_phase(kb_tl *tl, kb_val acc, int64_t k, kb_dir out, kb_dir in_dir, kb_val keep)
{
    kb_val cur = acc;
    for (int64_t s = 0; s + 1 < k; s++) {
        kb_val in = kb_ccl_sendrecv(tl, out, cur, (kb_val){ 0 }, in_dir,
                                    KB_SHAPE2(acc.rows, acc.cols), dt_of(cur));
        kb_val sum = tl_add(tl, acc, in);
        if (acc.pa != keep.pa && acc.pa != cur.pa)
            tl_free(tl, acc);
        if (cur.pa != keep.pa)
            tl_free(tl, cur);
        acc = sum;
        cur = in;
    }
    if (cur.pa != keep.pa && cur.pa != acc.pa)
        tl_free(tl, cur);
    return acc;
}

static int64_t isqrt64(int64_t x)
{
    int64_t k = 0;
    while ((k + 1) * (k + 1) <= x)
        k++;
    return k;
}

static void mesh_tile(kb_tl *tl, const kb_kargs *a, kb_va mine, int64_t n)
{
    int64_t k = isqrt64(a->i[KB_CCL_ARG_WS]);
    kb_val v0 = tl_load(tl, mine, KB_SHAPE1(n), KB_F16);
    kb_val row = ring_phase(tl, v0, k, KB_DIR_E, KB_DIR_W, v0);
    /* the column phase moves f32 row sums; start from an f32 copy so dtypes agree */
    kb_val row32 = row.dtype == KB_F32 ? row : tl_scale(tl, row, 1.0f, 0.0f);
    kb_val all = ring_phase(tl, row32, k, KB_DIR_S, KB_DIR_N, v0);
    tl_store(tl, mine, all);
    if (all.pa != v0.pa)
        tl_free(tl, all);
    tl_free(tl, v0);
}

/* Both ring phases step through kb_ccl_sendrecv, so a block's messages (f32 at most) may be
 * longer than a slot; a larger tile runs block by block. */
static void mesh_allreduce(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    kb_ccl_run_tile(tl, a, kb_ccl_my_tile(tl, a), a->i[KB_CCL_ARG_N], KB_F16, 4, mesh_tile);
}

static int mesh_check(int ws, int64_t n, const kb_ccl_geom *g, kb_errbuf *eb)
{
    int64_t k = isqrt64(ws);
    (void)g;
    (void)n;
    if (k * k != ws)
        return kb_err_set(eb, KB_ERR_CONFIG, "mesh_allreduce needs a square world size, got %d",
                          ws);
    return 0;
}

/* ---- tree ---- */

static void tree_tile(kb_tl *tl, const kb_kargs *a, kb_va mine, int64_t n)
{
    int64_t ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl);
    kb_val v0 = tl_load(tl, mine, KB_SHAPE1(n), KB_F16);
    kb_val acc = tl_scale(tl, v0, 1.0f, 0.0f); /* f32 partial sums travel up */
    int has_l = 2 * r + 1 < ws, has_r = 2 * r + 2 < ws;

    if (has_l)
        acc = accumulate(tl, acc, tl_recv(tl, KB_DIR_CHILD_LEFT, KB_SHAPE1(n), KB_F32), v0);
    if (has_r)
        acc = accumulate(tl, acc, tl_recv(tl, KB_DIR_CHILD_RIGHT, KB_SHAPE1(n), KB_F32), v0);
    if (r > 0) {
        tl_send(tl, KB_DIR_PARENT, acc);
        tl_free(tl, acc);
        acc = tl_recv(tl, KB_DIR_PARENT, KB_SHAPE1(n), KB_F32);
    }
    if (has_l)
        tl_send(tl, KB_DIR_CHILD_LEFT, acc);
    if (has_r)
        tl_send(tl, KB_DIR_CHILD_RIGHT, acc);
    tl_store(tl, mine, acc);
    tl_free(tl, acc);
    tl_free(tl, v0);
}

/*
 * The streamed tree, for tiles longer than a slot: slices of one slot of f32 flow through the
 * tree as a pipeline. In its step k a rank reduces slice k (its own, loaded from the tile,
 * plus its children's sums) and sends it up, then takes the total of slice k - lag from its
 * parent, sends it down and stores it, where lag is the rank's depth (the root sends each
 * total down at once). One more step of lag per level is what keeps the pipeline from
 * blocking with any n_slots: a parent in step k' < k sends totals up to k' - lag(parent)
 * <= k - lag(child), all of which the child has consumed or is about to, and a child
 * waiting for total k - lag(child) has it sent by a parent that already holds slice k.
 * Scratch: a slice and its two children's, whatever the tile's size.
 */
static kb_val tree_up(kb_tl *tl, kb_va va, int64_t len, int has_l, int has_r)
{
    kb_val v0 = tl_load(tl, va, KB_SHAPE1(len), KB_F16), acc = tl_scale(tl, v0, 1.0f, 0.0f);

    tl_free(tl, v0);
    for (int c = 0; c < 2; c++) {
        if (!(c ? has_r : has_l))
            continue;
        kb_val in = tl_recv(tl, c ? KB_DIR_CHILD_RIGHT : KB_DIR_CHILD_LEFT, KB_SHAPE1(len),
                            KB_F32);
        kb_val sum = tl_add(tl, acc, in);
        tl_free(tl, acc);
        tl_free(tl, in);
        acc = sum;
    }
    return acc;
}

static void tree_down(kb_tl *tl, kb_va va, kb_val v, int has_l, int has_r)
{
    if (has_l)
        tl_send(tl, KB_DIR_CHILD_LEFT, v);
    if (has_r)
        tl_send(tl, KB_DIR_CHILD_RIGHT, v);
    tl_store(tl, va, v);
    tl_free(tl, v);
}

static KB_NOINLINE void tree_streamed(kb_tl *tl, int64_t n, int64_t ws, int64_t r, kb_va mine)
{
    int64_t S = (int64_t)(kb_ipcq_slot_size(tl_ctx(tl)) / 4u), nsl = (n + S - 1) / S;
    int64_t lag = 0, off, len;
    int has_l = 2 * r + 1 < ws, has_r = 2 * r + 2 < ws;

    for (int64_t q = r; q > 0; q = (q - 1) / 2)
        lag++; /* the rank's depth */
    for (int64_t k = 0; k < nsl + lag; k++) {
        if ((len = kb_ccl_piece(n, S, k, &off)) != 0) {
            kb_va va = kb_ccl_elem_va(mine, off, KB_F16);
            kb_val acc = tree_up(tl, va, len, has_l, has_r);
            if (r == 0) {
                tree_down(tl, va, acc, has_l, has_r);
                continue;
            }
            tl_send(tl, KB_DIR_PARENT, acc);
            tl_free(tl, acc);
        }
        if (r > 0 && k >= lag && (len = kb_ccl_piece(n, S, k - lag, &off)) != 0)
            tree_down(tl, kb_ccl_elem_va(mine, off, KB_F16),
                      tl_recv(tl, KB_DIR_PARENT, KB_SHAPE1(len), KB_F32), has_l, has_r);
    }
}

/* Messages are f32 tiles: a tile longer than a slot streams (tree_streamed). */
static void tree_allreduce(kb_tl *tl, const kb_kargs *a)
{
    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;
    int64_t n = a->i[KB_CCL_ARG_N];

    if (kb_ccl_stream_block(tl, n, 4)) {
        tree_streamed(tl, n, a->i[KB_CCL_ARG_WS], kb_ccl_rank(tl), kb_ccl_my_tile(tl, a));
        return;
    }
    tree_tile(tl, a, kb_ccl_my_tile(tl, a), n);
}

/* ---- hierarchical ---- */

/*
 * Chain reduce of `acc` to member 0 of a ring of g members (my id i): members 1..h pass
 * partial sums down via `dec`, members h+1..g-1 pass them up via `inc` (g-1 wraps to 0);
 * member 0 receives the left chain on `inc` and the right chain on `dec`. Returns the sum on
 * member 0, the partial sum elsewhere (already sent).
 */
static kb_val chain_reduce(kb_tl *tl, kb_val acc, int i, int g, kb_dir inc, kb_dir dec, kb_val keep)
{
    int h = g / 2;
    kb_shape s = KB_SHAPE2(acc.rows, acc.cols);
    assert(i >= 0 && i < g);
    if (g < 2)
        return acc;
    if (i == 0) {
        acc = accumulate(tl, acc, tl_recv(tl, inc, s, KB_F32), keep);
        if (g - 1 >= h + 1)
            acc = accumulate(tl, acc, tl_recv(tl, dec, s, KB_F32), keep);
        return acc;
    }
    if (i <= h) {
        if (i + 1 <= h)
            acc = accumulate(tl, acc, tl_recv(tl, inc, s, KB_F32), keep);
        tl_send(tl, dec, acc);
    } else {
        if (i - 1 >= h + 1)
            acc = accumulate(tl, acc, tl_recv(tl, dec, s, KB_F32), keep);
        tl_send(tl, inc, acc);
    }
    return acc;
}

/* Inverse of chain_reduce: member 0's value flows back out along both chains. A member
 * other than 0 releases its partial sum (sent during the reduce) once the total has come. */
static kb_val chain_bcast(kb_tl *tl, kb_val v, int i, int g, kb_dir inc, kb_dir dec)
{
    int h = g / 2;
    kb_shape s = KB_SHAPE2(v.rows, v.cols);
    if (g < 2)
        return v;
    if (i == 0) {
        tl_send(tl, inc, v);
        if (g - 1 >= h + 1)
            tl_send(tl, dec, v);
        return v;
    }
    kb_val part = v;
    if (i <= h) {
        v = tl_recv(tl, dec, s, KB_F32);
        if (i + 1 <= h)
            tl_send(tl, inc, v);
    } else {
        v = tl_recv(tl, inc, s, KB_F32);
        if (i - 1 >= h + 1)
            tl_send(tl, dec, v);
    }
    tl_free(tl, part);
    return v;
}

/* The SIP leaders' all-reduce: two exchange once (a + b == b + a bitwise); three or more
 * reduce-scatter + all-gather so that every leader holds the same bits. */
static kb_val sip_allreduce(kb_tl *tl, kb_val acc, int S, kb_va va, kb_dtype dt, kb_val keep)
{
    if (S < 3)
        return ring_phase(tl, acc, S, KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W, keep);
    assert(acc.pa != keep.pa);
    return kb_ccl_ring_allreduce_val(tl, acc, S, tl_program_id(tl, 2), KB_DIR_GLOBAL_E,
                                     KB_DIR_GLOBAL_W, va, dt);
}

/*
 * The chains' lengths at this rank: ranks fill the PEs in linear order (kb_ccl_rank), so the
 * world's last cube and last SIP may be partial. *gp: the ranks of this rank's cube; *gc: the
 * cubes of its SIP that hold a rank (their PE 0 form the cube chain). Whole cubes and SIPs
 * give the launch grid's P and C.
 */
static void hier_chains(kb_tl *tl, const kb_kargs *a, int *gp, int *gc)
{
    int64_t ws = a->i[KB_CCL_ARG_WS], r = kb_ccl_rank(tl);
    int64_t P = tl_num_programs(tl, 0), per_sip = P * tl_num_programs(tl, 1);
    int64_t in_cube = ws - (r - tl_program_id(tl, 0)), in_sip = ws - r / per_sip * per_sip;
    *gp = (int)(in_cube < P ? in_cube : P);
    *gc = (int)(((in_sip < per_sip ? in_sip : per_sip) + P - 1) / P);
}

/* The member index of this PE's cube in the chain over the SIP's cubes: its index, or, wired by
 * hierarchical_lanes on a whole world, its step in kb_topo_cube_ring (where N and S lead). */
static int hier_cube_member(kb_tl *tl, const kb_kargs *a)
{
    int cube = tl_program_id(tl, 1), cubes = tl_num_programs(tl, 1), P, C, S;
    const kb_machine *m = kb_ctx_machine(tl_ctx(tl));
    kb_ccl_geom g = { m->npes, cubes, 0, m->mesh_w }; /* as kb_ccl_install builds it */
    if (!(a->i[KB_CCL_ARG_FLAGS] & KB_CCL_FLAG_LANES) ||
        !kb_topo_lanes_shape((int)a->i[KB_CCL_ARG_WS], &g, &P, &C, &S))
        return cube;
    return kb_topo_cube_pos(cube, C, C == cubes ? g.mesh_w : 0);
}

static void hierarchical_tile(kb_tl *tl, const kb_kargs *a, kb_va mine, int64_t n)
{
    int P, C, S = (int)a->i[KB_CCL_ARG_SIPS];
    int pe = tl_program_id(tl, 0), cube = hier_cube_member(tl, a);
    hier_chains(tl, a, &P, &C);
    assert(pe < P && cube < C); /* a PE that holds a rank is a member of both chains */
    kb_val v0 = tl_load(tl, mine, KB_SHAPE1(n), (kb_dtype)a->i[KB_CCL_ARG_DTYPE]);
    kb_val acc = tl_scale(tl, v0, 1.0f, 0.0f);

    acc = chain_reduce(tl, acc, pe, P, KB_DIR_E, KB_DIR_W, v0);
    if (pe == 0) {
        acc = chain_reduce(tl, acc, cube, C, KB_DIR_N, KB_DIR_S, v0);
        if (cube == 0 && S > 1)
            acc = sip_allreduce(tl, acc, S, mine, (kb_dtype)a->i[KB_CCL_ARG_DTYPE], v0);
        acc = chain_bcast(tl, acc, cube, C, KB_DIR_N, KB_DIR_S);
    }
    acc = chain_bcast(tl, acc, pe, P, KB_DIR_E, KB_DIR_W);
    tl_store(tl, mine, acc);
    tl_free(tl, acc);
    tl_free(tl, v0);
}

/*
 * The streamed form, for tiles longer than a slot. The two chain levels form a tree rooted at
 * the SIP leaders: a PE's parent is its chain neighbour toward member 0 (a cube's PE 0: its
 * cube-chain neighbour's PE 0). Slices of one slot of f32 flow through it as a pipeline like
 * tree_streamed's: in step k a rank reduces slice k (its own plus its children's) and sends it
 * up, or, as a SIP leader, combines it around the SIP ring and sends the total straight down;
 * then it takes slice k - depth's total from its parent, sends it down and stores it. One step
 * of lag per level keeps the pipeline from blocking with any n_slots (see tree_streamed).
 */
typedef struct hier_node {
    kb_dir up;                  /* KB_DIR_NONE: a SIP leader */
    kb_dir down[4];             /* children, in chain_reduce's order */
    int ndown, depth;
} hier_node;

/* Member i of a chain of g (chain_reduce's shape): its parent and children directions. */
static void chain_links(hier_node *h, int i, int g, kb_dir inc, kb_dir dec, int *up)
{
    int half = g / 2;
    assert(i >= 0 && i < g);
    if (g < 2)
        return;
    if (i == 0) {
        h->down[h->ndown++] = inc;
        if (g - 1 >= half + 1)
            h->down[h->ndown++] = dec;
        return;
    }
    if (i <= half) {
        if (i + 1 <= half)
            h->down[h->ndown++] = inc;
        h->up = dec;
        h->depth += i;
    } else {
        if (i - 1 >= half + 1)
            h->down[h->ndown++] = dec;
        h->up = inc;
        h->depth += g - i;
    }
    *up = 1;
}

static KB_NOINLINE void hier_streamed(kb_tl *tl, const kb_kargs *a, kb_va mine, int64_t n)
{
    int P, C, S = (int)a->i[KB_CCL_ARG_SIPS], pe = tl_program_id(tl, 0);
    int cube = hier_cube_member(tl, a);
    kb_dtype dt = (kb_dtype)a->i[KB_CCL_ARG_DTYPE];
    int64_t SL = (int64_t)(kb_ipcq_slot_size(tl_ctx(tl)) / 4u), nsl = (n + SL - 1) / SL;
    int64_t off, len;
    hier_node h = { KB_DIR_NONE, { KB_DIR_E }, 0, 0 };
    int has_up = 0;

    hier_chains(tl, a, &P, &C);
    chain_links(&h, pe, P, KB_DIR_E, KB_DIR_W, &has_up);
    if (pe == 0) {
        hier_node c = { KB_DIR_NONE, { KB_DIR_E }, 0, 0 };
        chain_links(&c, cube, C, KB_DIR_N, KB_DIR_S, &has_up);
        h.up = c.up;
        h.depth = c.depth;
        for (int d = 0; d < c.ndown; d++)
            h.down[h.ndown++] = c.down[d];
    } else {
        /* depth below the cube's PE 0 plus that PE's depth in the cube chain */
        int half = C / 2;
        h.depth += cube == 0 || C < 2 ? 0 : cube <= half ? cube : C - cube;
    }
    /* only a SIP leader has no parent, and it is where the pipeline starts (depth 0) */
    assert(h.ndown <= 4 && (has_up || h.depth == 0));
    for (int64_t k = 0; k < nsl + h.depth; k++) {
        if ((len = kb_ccl_piece(n, SL, k, &off)) != 0) {
            kb_va va = kb_ccl_elem_va(mine, off, dt);
            kb_val v0 = tl_load(tl, va, KB_SHAPE1(len), dt), acc = tl_scale(tl, v0, 1.0f, 0.0f);
            tl_free(tl, v0);
            for (int d = 0; d < h.ndown; d++) {
                kb_val in = tl_recv(tl, h.down[d], KB_SHAPE1(len), KB_F32);
                kb_val sum = tl_add(tl, acc, in);
                tl_free(tl, acc);
                tl_free(tl, in);
                acc = sum;
            }
            if (!has_up) {
                if (S > 1) /* keeps nothing else: v0 is gone */
                    acc = sip_allreduce(tl, acc, S, va, dt, (kb_val){ 0 });
                for (int d = h.ndown - 1; d >= 0; d--)
                    tl_send(tl, h.down[d], acc);
                tl_store(tl, va, acc);
                tl_free(tl, acc);
                continue;
            }
            tl_send(tl, h.up, acc);
            tl_free(tl, acc);
        }
        if (has_up && k >= h.depth && (len = kb_ccl_piece(n, SL, k - h.depth, &off)) != 0) {
            kb_val v = tl_recv(tl, h.up, KB_SHAPE1(len), KB_F32);
            for (int d = h.ndown - 1; d >= 0; d--)
                tl_send(tl, h.down[d], v);
            tl_store(tl, kb_ccl_elem_va(mine, off, dt), v);
            tl_free(tl, v);
        }
    }
}

/* Messages are f32: a tile longer than a slot streams (hier_streamed). */
static void hierarchical_allreduce(kb_tl *tl, const kb_kargs *a)
{
    int64_t n = a->i[KB_CCL_ARG_N];

    if (kb_ccl_idle(tl, a)) /* a grid PE past the last rank (KB_CCL_ANY_WORLD) */
        return;

    if (kb_ccl_hier_lanes(tl, a, kb_ccl_my_tile(tl, a), n))
        return;
    if (kb_ccl_stream_block(tl, n, 4)) {
        hier_streamed(tl, a, kb_ccl_my_tile(tl, a), n);
        return;
    }
    hierarchical_tile(tl, a, kb_ccl_my_tile(tl, a), n);
}

/* ---- registry ---- */

static const kb_ccl_algo_impl hello_send_algo = {
    .module = "hello_send",
    .summary = "each rank sends its tile east and keeps what arrives from the west",
    .kind = KB_COLL_SENDRECV,
    .topology = "ring_1d",
    .kernel = hello_send,
    .max_msg_bytes = tile_f16,
    .reference = kb_ccl_ref_shift_east,
    .flags = KB_CCL_ANY_WORLD,
};
static const kb_ccl_algo_impl ring_algo = {
    .module = "ring_allreduce",
    .summary = "ring all-reduce: p-1 rounds forwarding the last received tile",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "ring_1d",
    .kernel = ring_allreduce,
    .max_msg_bytes = tile_f16,
    .reference = kb_ccl_ref_allreduce,
    .flags = KB_CCL_ANY_WORLD,
};
static const kb_ccl_algo_impl rsag_algo = {
    .module = "ring_rsag_allreduce",
    .summary = "bandwidth-optimal ring: reduce-scatter + all-gather, 2(p-1)/p of the data per rank",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "ring_1d",
    .kernel = ring_rsag_allreduce,
    .check = rsag_check,
    .max_msg_bytes = rsag_msg,
    .reference = kb_ccl_ref_allreduce,
    .flags = KB_CCL_ANY_WORLD | KB_CCL_TYPED,
    .ordered = kb_ccl_ref_ring_allreduce,
};
static const kb_ccl_algo_impl mesh_algo = {
    .module = "mesh_allreduce",
    .summary = "row ring (E/W) then column ring (N/S) on a square k x k world",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "mesh_2d",
    .kernel = mesh_allreduce,
    .check = mesh_check,
    .max_msg_bytes = tile_f32,
    .reference = kb_ccl_ref_allreduce,
    .flags = KB_CCL_ANY_WORLD,
};
static const kb_ccl_algo_impl tree_algo = {
    .module = "tree_allreduce",
    .summary = "binary tree: reduce to rank 0, broadcast back (any size the rank = PE layout takes)",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "tree_binary",
    .kernel = tree_allreduce,
    .max_msg_bytes = tile_f32,
    .reference = kb_ccl_ref_allreduce,
    .flags = KB_CCL_ANY_WORLD,
};
static const kb_ccl_algo_impl hierarchical_algo = {
    .module = "hierarchical_allreduce",
    .summary = "3 levels: lanes (reduce-scatter in the cube, across cubes, across SIPs, every PE a share) for long tiles, chains for short ones",
    .kind = KB_COLL_ALLREDUCE,
    .topology = "hierarchical_lanes",
    .kernel = hierarchical_allreduce,
    .max_msg_bytes = tile_f32,
    .reference = kb_ccl_ref_allreduce,
    .flags = KB_CCL_ANY_WORLD,
    .sip = &kb_ccl_sip_hierarchical,
};

/* The registry of built-in algorithms, in `kbcl list` order (each rank model's section lists
 * the entries placed in it). An algorithm in a file of its own exports its entry (declared in
 * kb_ccl.h) and gets one line here. */
static const kb_ccl_algo_impl *const algos[] = {
    &hello_send_algo, &ring_algo, &rsag_algo, &mesh_algo, &tree_algo, &kb_ccl_algo_intercube,
    &hierarchical_algo,
    &kb_ccl_algo_ring_allgather, &kb_ccl_algo_ring_reducescatter, &kb_ccl_algo_p2p_sendrecv,
    &kb_ccl_algo_ring_broadcast, &kb_ccl_algo_ring_reduce, &kb_ccl_algo_tree_broadcast,
    &kb_ccl_algo_tree_reduce, &kb_ccl_algo_pairwise_alltoall, &kb_ccl_algo_rd_allgather,
    &kb_ccl_algo_rh_reducescatter, &kb_ccl_algo_rhd_allreduce, &kb_ccl_algo_dbtree_allreduce,
};

const kb_ccl_algo_impl *kb_ccl_algo_at(int i)
{
    if (i < 0 || (size_t)i >= sizeof algos / sizeof algos[0])
        return NULL;
    return algos[i];
}

const kb_ccl_algo_impl *kb_ccl_algo_find(const char *module)
{
    for (int i = 0; kb_ccl_algo_at(i); i++)
        if (!strcmp(algos[i]->module, module))
            return algos[i];
    return NULL;
}

/* ---- hierarchical_allreduce's rank = SIP form (kb_dist_algo.h) ---- */

/*
 * The same kernel over every PE of every SIP: a rank's tensor is one block per PE (rows over
 * the cubes and PEs), and the PEs run as the ranks of a rank = PE world of ws * PEs-per-SIP.
 */
static int hier_install(kb_ctx *ctx, const kb_ipcq_cfg *cfg, int ws)
{
    kb_machine *m = kb_ctx_machine(ctx);
    kb_ccl_layout l;
    int per = m->ncubes * m->npes;
    int rc = kb_ccl_layout_whole(m, ws * per, &l, kb_ctx_err(ctx));
    if (rc)
        return rc;
    /* the lane rings of kb_dist_all_reduce_shards too, where the ring area has room for two
     * more rings on the PE with the most (a leader: E, W, N, S, global_E, global_W); a failed
     * install leaves nothing behind, so the plain one follows */
    if (ws > 1 && kb_ccl_install_lanes(ctx, "hierarchical_3level", &l, cfg, per) == 0)
        return 0;
    return kb_ccl_install(ctx, "hierarchical_3level", &l, cfg);
}

static kb_dp_policy hier_policy(const kb_machine *m)
{
    (void)m;
    return kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, 0, 0);
}

static int hier_shards(const kb_machine *m) { return m->ncubes * m->npes; }

static int hier_validate(kb_ctx *ctx, kb_tensor *const *t, int ws, const char *what)
{
    return kb_dist_check_sip_local(ctx, t, ws, hier_shards(kb_ctx_machine(ctx)), what,
                                   "rows over every PE", NULL);
}

static int hier_args(kb_ctx *ctx, const kb_dist_launch *l, kb_kargs *a)
{
    kb_machine *m = kb_ctx_machine(ctx);
    assert(l->rank >= 0 && l->rank < l->ws);
    a->ptr[KB_CCL_PTR_TILE] = kb_tensor_va(l->t);
    a->i[KB_CCL_ARG_N] = l->n;
    a->i[KB_CCL_ARG_WS] = l->ws * m->ncubes * m->npes;
    a->i[KB_CCL_ARG_PES] = m->npes;
    a->i[KB_CCL_ARG_CUBES] = m->ncubes;
    a->i[KB_CCL_ARG_SIPS] = l->ws;
    a->i[KB_CCL_ARG_DTYPE] = kb_tensor_dtype(l->t);
    return 0;
}

static kb_grid hier_grid(const kb_machine *m, int ws)
{
    return (kb_grid){ m->npes, m->ncubes, ws, 0 };
}

const kb_ccl_sip_form kb_ccl_sip_hierarchical = {
    .summary = "every PE: chains in each cube and across cubes, ring across SIPs (the rank = PE kernel)",
    .mapper = "all_pes",
    .validator = "multi_pe_sip_local",
    .kernel = hierarchical_allreduce,
    .install = hier_install,
    .policy = hier_policy,
    .shards = hier_shards,
    .validate = hier_validate,
    .args = hier_args,
    .grid = hier_grid,
    .reference = kb_ccl_ref_allreduce,
};
