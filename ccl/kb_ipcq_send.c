/*
 * kb_ipcq_send — the IPCQ's send path (part of the IPCQ, protocol in kb_ipcq.h; shared names in
 * kb_ipcq_int.h): tl_send and tl_send_async. A send waits for a credit while the window is
 * full (with backpressure), DMAs each chunk into the next slot of the peer's ring, records it
 * when records are wanted, and schedules its meta token's arrival at the receiver
 * (kb_ipcq_meta_arrive, kb_ipcq_recv.c) for when the DMA ends, no earlier than the queue's
 * previous token; the sender's own resume after the last chunk shares that event. Between SIPs
 * with system.switch.arbitration per_sip the DMA is booked part by part (kb_machine_dma_first,
 * then kb_ipcq_part_arrive per later part), the token is scheduled by the last part, and the
 * sender is done when its chunk has left its SIP. Limits: the value must be contiguous; a
 * chunk holds as many whole elements as one slot.
 */
#include "kb_ipcq_int.h"

#include <assert.h>
#include <string.h>

/* Op names of records and blocked fibers (static strings: records keep the pointer); every
 * peer direction shares the last one (the record's PE and addresses tell the peer). */
static const char *const send_names[KB_NDIRS + 1] = {
    "ipcq send E", "ipcq send W", "ipcq send N", "ipcq send S", "ipcq send global_E",
    "ipcq send global_W", "ipcq send global_N", "ipcq send global_S", "ipcq send parent",
    "ipcq send child_left", "ipcq send child_right", "ipcq send peer",
};
static const char *const send_wait_names[KB_NDIRS + 1] = {
    "ipcq credit E", "ipcq credit W", "ipcq credit N", "ipcq credit S", "ipcq credit global_E",
    "ipcq credit global_W", "ipcq credit global_N", "ipcq credit global_S", "ipcq credit parent",
    "ipcq credit child_left", "ipcq credit child_right", "ipcq credit peer",
};

/* Pops a msg off the free list *head, first refilling it with a chunk of pool items of `size`
 * bytes, each with its msg first (a msg, or a parts_msg); NULL when out of memory. */
static msg *msg_pop(ipcq_part *p, msg **head, size_t size)
{
    if (!*head) {
        char *c = kb_ipcq_pool_chunk(p, size, KB_IPCQ_POOL_CHUNK);
        if (!c)
            return NULL;
        for (int i = 0; i < KB_IPCQ_POOL_CHUNK; i++) {
            msg *m = (msg *)(void *)(c + (size_t)i * size);
            m->next = *head;
            *head = m;
        }
    }
    msg *m = *head;
    *head = m->next;
    return m;
}

/* The records of a send and of a receive's copy-out (out of line: their descriptors would
 * otherwise sit in the hot frames). */
static KB_NOINLINE int record_send(kb_ctx *ctx, kb_tl *tl, kb_pa dst, const kb_val *v,
                                   kb_time t_start, kb_time t_end, const char *name)
{
    copy_desc c = { kb_opnd_make(dst, v->rows, v->cols, (kb_dtype)v->dtype),
                    kb_opnd_make(v->pa, v->rows, v->cols, (kb_dtype)v->dtype), t_start, t_end };
    return kb_ipcq_record_copy(ctx, tl_pe(tl)->gid, &c, name);
}

/* Why a send's DMA failed (the route was refused: recomputed with a message). */
static KB_COLD void send_route_fail(kb_tl *tl, kb_dir dir, kb_pa src, kb_pa dst)
{
    char op[16 + KB_DIR_LABEL_LEN];
    snprintf(op, sizeof op, "tl_send %s", DIRL(dir));
    kb_tl_dma_fail(tl, src, dst, op);
}

/* The send path's refusals that name the direction (out of line: the label's buffer would
 * otherwise sit in the hot frames, and every byte of those is a stack line per step). */
static KB_COLD _Noreturn void send_no_ring(kb_tl *tl, kb_dir dir)
{
    tl_fail(tl, KB_ERR_STATE, "tl_send %s: the peer has no ring at the destination", DIRL(dir));
}

static KB_COLD _Noreturn void send_strided(kb_tl *tl, kb_dir dir, const char *op, kb_val v)
{
    tl_fail(tl, KB_ERR_INVAL, "%s %s: the value is a strided view (row stride %u, %u columns); "
            "tl_copy it into a contiguous value first", op, DIRL(dir), v.ld, v.cols);
}

/* wait_credit's wait: the window is full (out of line: a blocking loop in the send's frame
 * would widen it, and every byte of a kernel's frames is a stack line per step). */
static KB_NOINLINE void wait_credit_slow(kb_tl *tl, qp *q, ipcq_sys *sys, kb_dir dir)
{
    kb_sim *sim = tl_sim(tl);
    while (sys->cfg.backpressure && q->my_head - q->peer_tail_cache >= (uint64_t)q->n_slots) {
        if (q->cr_n) { /* a credit is on its way: wait for it */
            kb_tl_wait_until(tl, q->cr_t[q->cr_head]);
        } else {
            q->cr_waiter = kb_fiber_current(sim);
            kb_fiber_block(sim, send_wait_names[name_ix(dir)], q);
        }
        credits_take(q, kb_sim_now(sim));
    }
}

/* Blocks the sender until the queue pair has a free slot (with backpressure). */
static KB_ALWAYS_INLINE void wait_credit(kb_tl *tl, qp *q, ipcq_sys *sys, kb_dir dir)
{
    credits_take(q, kb_sim_now(tl_sim(tl)));
    if (sys->cfg.backpressure && q->my_head - q->peer_tail_cache >= (uint64_t)q->n_slots)
        wait_credit_slow(tl, q, sys, dir);
    assert(!sys->cfg.backpressure || q->my_head - q->peer_tail_cache < q->n_slots);
}

/* The record of a chunk's copy, for the replay (out of line: timing-only runs build none). */
static KB_NOINLINE void record_chunk(kb_tl *tl, kb_dir dir, const kb_val *v, kb_pa src,
                                     kb_pa dst, uint64_t len, int whole, kb_time t_start,
                                     kb_time t_end)
{
    /* a chunk of a longer message is a flat run of elements of the contiguous value */
    kb_val part = *v;
    part.pa = src;
    if (!whole) {
        part.rows = 1;
        part.cols = (uint32_t)len;
    }
    if (record_send(tl_ctx(tl), tl, dst, &part, t_start, t_end, send_names[name_ix(dir)]) != 0)
        tl_fail(tl, KB_ERR_NOMEM, "out of memory recording an op");
}

void kb_ipcq_parts_put(ipcq_part *p, msg *m)
{
    assert(m->parts);
    m->next = p->free_parts;
    p->free_parts = m;
}

/* A chunk's msg (from the parts pool for a chunk sent by parts), filled and counted. */
static KB_ALWAYS_INLINE msg *chunk_msg(kb_tl *tl, qp *q, kb_dir dir, kb_pa dst, uint64_t seq,
                                       uint64_t nbytes, int parts)
{
    ipcq_part *p = my_part(tl);
    msg *m = parts ? msg_pop(p, &p->free_parts, sizeof(parts_msg))
                   : msg_pop(p, &p->free_msgs, sizeof(msg));
    if (!m)
        tl_fail(tl, KB_ERR_NOMEM, "out of memory");
    m->parts = (uint8_t)parts;
    if (!q->tok_q)
        send_no_ring(tl, dir);
    m->to = q->tok_q;
    m->addr = dst;
    m->seq = seq;
    m->nbytes = nbytes;
    p->sends++;
    p->dir_bytes[name_ix(dir)] += nbytes;
    trace(tl_ctx(tl), "send", tl_pe(tl), dir, nbytes, seq);
    return m;
}

kb_time *kb_ipcq_part_heads(qp *q, uint64_t nparts)
{
    /* the count first, so that a run over several processes can hand the heads on */
    kb_time *h = kb_ipcq_pool_chunk(part_of(q->owner), sizeof(kb_time), (size_t)nparts + 1);
    if (!h)
        return NULL;
    memset(h, 0, ((size_t)nparts + 1) * sizeof(kb_time));
    h[0] = nparts;
    return q->part_head = h + 1;
}

/* When the head of q's chunk reaches the leg's next part: no earlier than the head of q's
 * previous chunk there (a later chunk may have found a gap the earlier one did not), so that
 * the chunks book every part, and land, in the order they were sent. 0 when out of memory. */
static kb_time part_head(qp *q, const kb_dma_leg *leg)
{
    if (!q->part_head && !kb_ipcq_part_heads(q, (uint64_t)leg->nparts))
        return 0;
    kb_time *h = &q->part_head[leg->part];
    *h = leg->t_head > *h ? leg->t_head : *h;
    return *h;
}

/* rc: KB_ERR_RANGE (a part's event sooner than the lookahead: a partitioned run's broken
 * premise), else out of memory */
static KB_COLD void part_fail(kb_sim *sim, kb_ctx *ctx, int rc)
{
    if (rc == KB_ERR_RANGE)
        kb_ctx_fail_in(ctx, sim, rc, "IPCQ: a send between SIPs reaches its next part sooner "
                       "than the least inter-SIP link latency (the partitions' lookahead)");
    else
        kb_ctx_fail_in(ctx, sim, KB_ERR_NOMEM, "out of memory in an IPCQ send between SIPs");
}

/* Schedules the arrival of m's head at its leg's next part, at t, in that part's SIP (from
 * SIP `from`, where the code runs): 0 or an error code. */
static int part_post(kb_ctx *ctx, kb_sim *sim, unsigned from, parts_msg *m, kb_time t)
{
    if (t == 0)
        return KB_ERR_NOMEM;
    return kb_ctx_post(ctx, sim, from, (unsigned)m->leg.at, t, kb_ipcq_part_arrive, m, NULL);
}

void kb_ipcq_part_arrive(kb_sim *sim, void *a, void *b)
{
    parts_msg *m = a;
    qp *q = m->from;
    kb_time now = kb_sim_now(sim);
    unsigned here = (unsigned)m->leg.at; /* the SIP of the part booked now */
    int rc;
    (void)b;
    kb_machine_dma_next(kb_ctx_machine(q->sys->ctx), &m->leg, now);
    if (kb_dma_leg_more(&m->leg)) {
        if ((rc = part_post(q->sys->ctx, sim, here, m, part_head(q, &m->leg))) != 0)
            part_fail(sim, q->sys->ctx, rc);
        return;
    }
    /* the last part: the token lands when the tail has, no earlier than the one before */
    kb_time t_tok = m->leg.t_end > q->tok_last ? m->leg.t_end : q->tok_last;
    q->tok_last = t_tok;
    if (t_tok == now)
        kb_ipcq_meta_arrive(sim, &m->m, NULL);
    else if (kb_sim_at(sim, t_tok, kb_ipcq_meta_arrive, &m->m, NULL) != 0)
        part_fail(sim, q->sys->ctx, KB_ERR_NOMEM);
}

/*
 * A chunk's DMA with per_sip arbitration. Inside the SIP it is one reservation, as without:
 * *t_start, *t_end, and 0 (the caller goes on). Out of the SIP its first part is booked; the
 * next is booked when the head gets there (kb_ipcq_part_arrive), and the token is scheduled by
 * the last. The sender is done with the chunk when its tail has left the first part: that is
 * what it waits for (`last`) and what *ret gets; 1. Its record spans the first part. Out of
 * line: the leg stays off the hot frames.
 */
static KB_NOINLINE int send_parts(kb_tl *tl, qp *q, kb_dir dir, const kb_val *v,
                                  uint64_t off, uint64_t len, int whole, kb_pa dst, uint64_t seq,
                                  kb_time t_issue, int last, kb_time *t_start, kb_time *t_end,
                                  kb_time *ret)
{
    kb_ctx *ctx = tl_ctx(tl);
    size_t es = kb_dtype_size((kb_dtype)v->dtype);
    kb_pa src = v->pa + off * es;
    kb_dma_leg leg;
    if (kb_machine_dma_first(kb_ctx_machine(ctx), tl_pe(tl), src, dst, len * es, t_issue, &leg,
                             NULL) != 0)
        send_route_fail(tl, dir, src, dst);
    *t_start = leg.t_start;
    *t_end = leg.t_end;
    if (!kb_dma_leg_more(&leg))
        return 0;
    if (kb_ctx_records(ctx))
        record_chunk(tl, dir, v, src, dst, len, whole, leg.t_start, leg.t_end);
    parts_msg *m = (parts_msg *)chunk_msg(tl, q, dir, dst, seq, len * es, 1);
    m->from = q;
    m->leg = leg;
    int rc = part_post(ctx, tl_sim(tl), tl_pe(tl)->gsip, m, part_head(q, &leg));
    if (rc != 0)
        tl_fail(tl, rc, "tl_send %s: %s scheduling the chunk's next part", DIRL(dir),
                kb_strerror(rc));
    if (last)
        kb_tl_wait_until(tl, leg.t_end);
    *ret = leg.t_end;
    return 1;
}

/*
 * One chunk of a send: DMA `len` elements of v from element `off` into the next slot of the
 * peer's ring, issued at t_issue; its token reaches the receiver when the DMA ends. `last`:
 * the sender resumes then too (one queue entry for both). Returns the DMA's end.
 */
static KB_ALWAYS_INLINE kb_time send_chunk(kb_tl *tl, qp *q, kb_dir dir, const kb_val *v,
                                           uint64_t off, uint64_t len, int whole,
                                           kb_time t_issue, int last)
{
    kb_ctx *ctx = tl_ctx(tl);
    size_t es = kb_dtype_size((kb_dtype)v->dtype);
    uint64_t nbytes = len * es;
    kb_pa src = v->pa + off * es;
    kb_time t_start, t_end;
    kb_pa dst = q->peer_rx_base + (q->my_head % (uint64_t)q->n_slots) * q->slot_size;
    uint64_t seq = q->my_head++;
    if (q->parts) {
        kb_time ret;
        if (send_parts(tl, q, dir, v, off, len, whole, dst, seq, t_issue, last, &t_start,
                       &t_end, &ret))
            return ret;
    } else if (kb_machine_dma(kb_ctx_machine(ctx), tl_pe(tl), src, dst, nbytes, t_issue,
                              &t_start, &t_end, NULL) != 0) {
        send_route_fail(tl, dir, src, dst);
    }
    /* the token (and the sender, after the last chunk) goes no earlier than the one before */
    kb_time t_tok = t_end > q->tok_last ? t_end : q->tok_last;
    q->tok_last = t_tok;
    if (kb_ctx_records(ctx))
        record_chunk(tl, dir, v, src, dst, len, whole, t_start, t_end);
    msg *m = chunk_msg(tl, q, dir, dst, seq, nbytes, 0);
    if (last && t_tok > kb_sim_now(tl_sim(tl))) {
        /* the token arrives when the DMA ends, which is also when the sender goes on: one
         * queue entry for both (kb_fiber_sleep_then keeps their order) */
        if (kb_fiber_sleep_then(tl_sim(tl), t_tok, kb_ipcq_meta_arrive, m, NULL) != 0)
            tl_fail(tl, KB_ERR_STATE, "tl_send: cannot wait for the DMA");
    } else if (kb_sim_at(tl_sim(tl), t_tok, kb_ipcq_meta_arrive, m, NULL) != 0) {
        tl_fail(tl, KB_ERR_NOMEM, "out of memory");
    }
    return t_tok;
}

/*
 * A message longer than a slot travels as slot-sized chunks through the credit window: the
 * IPCQ engine issues a chunk as soon as a slot is free (the first one after the call's issue
 * cost), so with n_slots > 1 chunk k+1 is in flight while the receiver copies out chunk k.
 * Returns when the last chunk's DMA has ended (the value may then be reused), or, `async`,
 * once the last chunk is issued, with the time its token lands. Out of line: its loop would
 * widen the frame of every send (send_msg).
 */
static KB_NOINLINE kb_time send_long(kb_tl *tl, qp *q, ipcq_sys *sys, kb_dir dir,
                                     const kb_val *v, int async)
{
    kb_sim *sim = tl_sim(tl);
    uint64_t n = (uint64_t)v->rows * v->cols;
    uint64_t per = chunk_elems(q->slot_size, (kb_dtype)v->dtype);
    kb_time t_issue = 0, t_last = 0;
    for (uint64_t off = 0; off < n; off += per) {
        uint64_t len = n - off < per ? n - off : per;
        wait_credit(tl, q, sys, dir);
        kb_time now = kb_sim_now(sim);
        if (off == 0)
            t_issue = now + kb_tl_issue_cost(tl) + sys->ipcq_ovh;
        else if (now > t_issue)
            t_issue = now;
        t_last = send_chunk(tl, q, dir, v, off, len, 0, t_issue, 0);
    }
    kb_tl_wait_until(tl, async ? t_issue : t_last);
    return t_last;
}

/* A send: one chunk when the message fits a slot (the protocol as it was), else send_long.
 * Returns when the message's (last) DMA has ended, or, `async`, once it is issued, with the
 * time its (last) token lands. */
static kb_time send_msg(kb_tl *tl, kb_dir dir, kb_val v, int async, const char *op)
{
    qp *q = wired_qp(tl, dir, op);
    ipcq_sys *sys = sys_of(tl_ctx(tl)); /* not through q or the pe_state: other lines */
    uint64_t n = (uint64_t)v.rows * v.cols;

    if (!kb_val_contiguous(v))
        send_strided(tl, dir, op, v);
    my_part(tl)->msgs++;
    if (n * kb_dtype_size((kb_dtype)v.dtype) > q->slot_size)
        return send_long(tl, q, sys, dir, &v, async);
    wait_credit(tl, q, sys, dir);
    kb_time t_issue = kb_sim_now(tl_sim(tl)) + kb_tl_issue_cost(tl) + sys->ipcq_ovh;
    kb_time t_last = send_chunk(tl, q, dir, &v, 0, n, 1, t_issue, !async);
    if (async)
        kb_tl_wait_until(tl, t_issue);
    return t_last;
}

void tl_send(kb_tl *tl, kb_dir dir, kb_val v)
{
    (void)send_msg(tl, dir, v, 0, "tl_send");
}

int64_t tl_send_async(kb_tl *tl, kb_dir dir, kb_val v)
{
    return send_msg(tl, dir, v, 1, "tl_send_async");
}

/* ---- a chunk by parts crossing to another process (kb_ext_dist; docs/parallel.md) ---- */

size_t kb_ipcq_part_enc(void *ud, void *a, void *b, uint8_t *buf)
{
    ipcq_sys *sys = ud;
    parts_msg *m = a;
    kb_machine *mc = kb_ctx_machine(sys->ctx);
    kb_wire w;
    uint8_t *p;
    size_t n;
    (void)b;
    kb_wire_init(&w);
    kb_ipcq_qp_put(&w, m->m.to);
    kb_wire_u64(&w, m->m.addr);
    kb_wire_u64(&w, m->m.seq);
    kb_wire_u64(&w, m->m.nbytes);
    kb_ipcq_qp_put(&w, m->from);
    kb_wire_u64(&w, m->leg.t_start);
    kb_wire_u64(&w, m->leg.t_end);
    kb_wire_u64(&w, m->leg.t_head);
    kb_wire_u64(&w, m->leg.nbytes);
    kb_wire_u32(&w, (uint32_t)m->leg.part);
    kb_wire_u32(&w, (uint32_t)m->leg.nparts);
    kb_wire_u32(&w, (uint32_t)m->leg.at);
    kb_wire_u32(&w, m->leg.dst_sip);
    kb_wire_u32(&w, m->leg.dst_cube);
    kb_wire_u32(&w, (uint32_t)m->leg.dst_router);
    kb_wire_u32(&w, kb_machine_port_id(mc, &m->leg));
    /* it fires in the other process: back to its sender's pool here */
    kb_ipcq_parts_put(part_of(m->from->owner), &m->m);
    p = w.p;
    n = w.oom ? 0 : w.n;
    assert(n > 0 && n <= KB_PSIM_WIRE_MAX);
    memcpy(buf, p, n);
    kb_wire_free(&w);
    return n;
}

int kb_ipcq_part_dec(void *ud, kb_sim *to, const uint8_t *buf, size_t n, void **a, void **b)
{
    ipcq_sys *sys = ud;
    kb_machine *mc = kb_ctx_machine(sys->ctx);
    kb_wire_rd r;
    parts_msg x;
    (void)to;
    memset(&x, 0, sizeof x);
    kb_wire_rd_init(&r, buf, n);
    x.m.to = kb_ipcq_qp_get(sys, &r);
    x.m.addr = kb_wire_get_u64(&r);
    x.m.seq = kb_wire_get_u64(&r);
    x.m.nbytes = kb_wire_get_u64(&r);
    x.from = kb_ipcq_qp_get(sys, &r);
    x.leg.t_start = kb_wire_get_u64(&r);
    x.leg.t_end = kb_wire_get_u64(&r);
    x.leg.t_head = kb_wire_get_u64(&r);
    x.leg.nbytes = kb_wire_get_u64(&r);
    x.leg.part = (int)kb_wire_get_u32(&r);
    x.leg.nparts = (int)kb_wire_get_u32(&r);
    x.leg.at = (int)kb_wire_get_u32(&r);
    x.leg.dst_sip = kb_wire_get_u32(&r);
    x.leg.dst_cube = kb_wire_get_u32(&r);
    x.leg.dst_router = (int)kb_wire_get_u32(&r);
    x.leg.dst_port = kb_machine_port_at(mc, &x.leg, kb_wire_get_u32(&r));
    if (!kb_wire_rd_ok(&r) || !kb_wire_rd_done(&r) || !x.m.to || !x.from || !x.leg.dst_port ||
        x.leg.at < 0 || x.leg.at >= sys->nparts)
        return KB_ERR_STATE;
    ipcq_part *p = &sys->part[x.leg.at]; /* the SIP whose partition books the next part */
    msg *m = msg_pop(p, &p->free_parts, sizeof(parts_msg));
    if (!m)
        return KB_ERR_NOMEM;
    x.m.parts = 1;
    x.m.next = NULL;
    *(parts_msg *)(void *)m = x;
    *a = m;
    *b = NULL;
    return 0;
}
