/*
 * kb_ipcq_recv — the IPCQ's receive path and the credits it returns (part of the IPCQ,
 * protocol in kb_ipcq.h; shared names in kb_ipcq_int.h): tl_recv, tl_recv_into, their async
 * forms, views of a slot (tl_recv_view_async, tl_recv_release) and tl_wait. A receive posts one
 * request per chunk of its message; when a chunk's meta token has arrived (kb_ipcq_meta_arrive,
 * scheduled by the send path) the receiver's DMA copies the slot out and the slot's credit goes
 * back to the sending queue pair as an arrival time, without an event of its own; the waiting
 * kernel resumes at the end of the message's last copy-out. Limits: a receive must name the
 * size its matching send has (else the run fails with both sizes); views are released in the
 * order they were received, and their slots' credits wait until then.
 */
#include "kb_ipcq_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Op names of records and blocked fibers (static strings: records keep the pointer); every
 * peer direction shares the last one (the record's PE and addresses tell the peer). */
/* Op names of records and blocked fibers (static strings: records keep the pointer); every
 * peer direction shares the last one (the record's PE and addresses tell the peer). */
static const char *const recv_names[KB_NDIRS + 1] = {
    "ipcq recv E", "ipcq recv W", "ipcq recv N", "ipcq recv S", "ipcq recv global_E",
    "ipcq recv global_W", "ipcq recv global_N", "ipcq recv global_S", "ipcq recv parent",
    "ipcq recv child_left", "ipcq recv child_right", "ipcq recv peer",
};

static void msg_put(ipcq_part *p, msg *m)
{
    m->next = p->free_msgs;
    p->free_msgs = m;
}

static kb_ipcq_req *req_get(ipcq_part *p)
{
    if (!p->free_reqs) {
        kb_ipcq_req *r = kb_ipcq_pool_chunk(p, sizeof *r, KB_IPCQ_POOL_CHUNK);
        if (!r)
            return NULL;
        for (int i = 0; i < KB_IPCQ_POOL_CHUNK; i++) {
            r[i].next = p->free_reqs;
            p->free_reqs = &r[i];
        }
    }
    kb_ipcq_req *r = p->free_reqs;
    p->free_reqs = r->next;
    return r; /* post sets every field */
}

static void req_put(ipcq_part *p, kb_ipcq_req *r)
{
    r->next = p->free_reqs;
    p->free_reqs = r;
}

/*
 * Credits travel without events of their own: the receiver appends {arrival, seq} to the
 * sending queue pair (found by its peer_rx_base, as the protocol matches credits), and the
 * sender takes in those that have arrived whenever it looks at its counters (a send, the
 * deadlock dump, kb_ipcq_counters_of). A sender blocked on credits is woken at the next
 * arrival. The observable behaviour is the event-per-credit protocol's. (Between SIPs with
 * per_sip a credit is an event: credit_out.)
 */
static int credit_send(kb_sim *sim, qp *q, uint64_t seq, kb_time t)
{
    if (!q)
        return KB_ERR_STATE;
    if (q->cr_n == q->n_slots && !q->sys->cfg.backpressure) {
        /* without backpressure the sender runs ahead and never waits for a credit, so more
         * than a ring's worth can be on the way: the oldest is counted as arrived */
        q->peer_tail_cache++;
        q->cr_head = q->cr_head + 1 == q->n_slots ? 0 : q->cr_head + 1;
        q->cr_n--;
    }
    if (q->cr_n == q->n_slots || seq != q->peer_tail_cache + q->cr_n)
        return KB_ERR_STATE; /* more credits than slots, or out of order: an invariant broke */
    uint32_t at = (q->cr_head + q->cr_n++) % q->n_slots;
    q->cr_t[at] = t;
    if (q->cr_waiter && q->cr_n == 1) {
        kb_fiber_wake_at(sim, q->cr_waiter, t);
        q->cr_waiter = NULL;
    }
    return 0;
}

static KB_NOINLINE int record_recv(kb_ctx *ctx, const qp *q, const kb_ipcq_req *r, kb_pa slot,
                                   kb_time t_start, kb_time t_end, const char *name)
{
    copy_desc c = { kb_opnd_make(r->dst, r->rows, r->cols, r->dst_dt),
                    kb_opnd_make(slot, r->rows, r->cols, r->dt), t_start, t_end };
    return kb_ipcq_record_copy(ctx, q->rx_pe->gid, &c, name);
}

static KB_COLD void recv_size_mismatch(kb_sim *sim, qp *q, const kb_ipcq_req *r, uint64_t si)
{
    kb_ctx_fail_in(q->sys->ctx, sim, KB_ERR_INVAL,
                   "kernel %s on sip%u/cube%u/pe%u: tl_recv %s expects %llu bytes but "
                   "message %llu from the peer has %llu", tl_kernel_name(r->tl),
                   q->rx_pe->gsip, q->rx_pe->cube, q->rx_pe->pe,
                   DIRL(q->dir), (unsigned long long)r->nbytes,
                   (unsigned long long)q->my_tail, (unsigned long long)q->slot_bytes[si]);
}

/* rc: KB_ERR_NOMEM (no event for a credit), KB_ERR_RANGE (a credit between SIPs sooner than
 * a partitioned run's lookahead), else a broken credit invariant */
static KB_COLD void credit_fail(kb_sim *sim, qp *q, int rc)
{
    if (rc == KB_ERR_NOMEM)
        kb_ctx_fail_in(q->sys->ctx, sim, rc, "out of memory sending an IPCQ credit");
    else if (rc == KB_ERR_RANGE) /* a partitioned run's premise broke */
        kb_ctx_fail_in(q->sys->ctx, sim, rc, "IPCQ: a credit from sip%u/cube%u/pe%u %s reaches "
                       "the sender's SIP sooner than the partitions' lookahead",
                       q->owner->pe->gsip, q->owner->pe->cube, q->owner->pe->pe, DIRL(q->dir));
    else
        kb_ctx_fail_in(q->sys->ctx, sim, KB_ERR_STATE, "IPCQ: a credit from sip%u/cube%u/pe%u "
                       "%s found no sending queue", q->owner->pe->gsip, q->owner->pe->cube,
                       q->owner->pe->pe, DIRL(q->dir));
}

/* A credit between SIPs with per_sip arriving (an event: a, the receiving queue pair; b, the
 * slot's sequence number). */
void kb_ipcq_credit_arrive(kb_sim *sim, void *a, void *b)
{
    qp *q = a;
    if (credit_send(sim, q->cred_q, (uint64_t)(uintptr_t)b, kb_sim_now(sim)) != 0)
        credit_fail(sim, q, KB_ERR_STATE);
}

_Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "credit_arrive carries a seq in a pointer");

/* A credit crossing to another process: the receiving queue pair and the seq. */
size_t kb_ipcq_credit_enc(void *ud, void *a, void *b, uint8_t *buf)
{
    kb_wire w;
    size_t n;
    (void)ud;
    kb_wire_init(&w);
    kb_ipcq_qp_put(&w, a);
    kb_wire_u64(&w, (uint64_t)(uintptr_t)b);
    n = w.oom ? 0 : w.n;
    assert(n > 0 && n <= KB_PSIM_WIRE_MAX);
    memcpy(buf, w.p, n);
    kb_wire_free(&w);
    return n;
}

int kb_ipcq_credit_dec(void *ud, kb_sim *to, const uint8_t *buf, size_t n, void **a, void **b)
{
    kb_wire_rd r;
    (void)to;
    kb_wire_rd_init(&r, buf, n);
    qp *q = kb_ipcq_qp_get(ud, &r);
    uint64_t seq = kb_wire_get_u64(&r);
    if (!q || !kb_wire_rd_ok(&r) || !kb_wire_rd_done(&r))
        return KB_ERR_STATE;
    *a = q;
    *b = (void *)(uintptr_t)seq;
    return 0;
}

/*
 * The credit of slot seq reaches the sending queue pair at t: its arrival time goes into the
 * sender's ring now, or, between SIPs with per_sip, an event at t brings it (no earlier than
 * the one before, so credits stay in order), so that no SIP writes another's state before the
 * credit could have got there. 0, or nonzero when it cannot be sent.
 */
static int credit_out(kb_sim *sim, qp *q, uint64_t seq, kb_time t)
{
    /* cr_event (set at install only with per_sip, between SIPs) is on a line the caller has
     * read */
    if (!q->cr_event)
        return credit_send(sim, q->cred_q, seq, t);
    if (!q->cred_q)
        return KB_ERR_STATE;
    q->cr_last = t > q->cr_last ? t : q->cr_last;
    return kb_ctx_post(q->sys->ctx, sim, q->rx_pe->gsip, q->cred_q->owner->pe->gsip, q->cr_last,
                       kb_ipcq_credit_arrive, q, (void *)(uintptr_t)seq);
}

/*
 * Slot seq is free from t on (its credit reaches the sender then). Slots are credited in
 * order: on a queue pair that never had a view this is the credit itself, as it always was;
 * with no view held it is sent at once too; behind a held view it waits in cr_defer, and the release of the view sends every credit that is then known, each
 * no earlier than the one before it. 0, or the context has failed.
 */
static int credit_free(kb_sim *sim, qp *q, uint64_t seq, kb_time t)
{
    int rc;
    if (!q->cr_defer) {
        if ((rc = credit_out(sim, q, seq, t)) != 0) {
            credit_fail(sim, q, rc);
            return -1;
        }
        return 0;
    }
    q->cr_defer[seq % q->rx_n_slots] = t;
    kb_time prev = 0;
    while (q->cr_next < q->my_tail && q->cr_defer[q->cr_next % q->rx_n_slots] >= 0) {
        kb_time at = q->cr_defer[q->cr_next % q->rx_n_slots];
        prev = at > prev ? at : prev;
        q->cr_defer[q->cr_next % q->rx_n_slots] = -1;
        if ((rc = credit_out(sim, q, q->cr_next, prev)) != 0) {
            credit_fail(sim, q, rc);
            return -1;
        }
        q->cr_next++;
    }
    return 0;
}

/* Starts the copy-out of every posted receive whose data has arrived. */
static void progress(kb_sim *sim, qp *q)
{
    ipcq_sys *sys = q->sys;
    kb_ctx *ctx = sys->ctx;
    while (q->pend_head && q->peer_head_cache > q->my_tail) {
        kb_ipcq_req *r = q->pend_head;
        q->pend_head = r->next;
        if (!q->pend_head)
            q->pend_tail = NULL;
        uint64_t si = q->my_tail % q->rx_n_slots;
        kb_pa slot = q->my_rx_base + si * q->rx_slot_size;
        if (q->slot_bytes[si] != r->nbytes) {
            /* the receive names another shape/dtype than the send it matches */
            recv_size_mismatch(sim, q, r, si);
            return;
        }
        kb_time now = kb_sim_now(sim), t0 = r->t_post > now ? r->t_post : now;
        kb_time t_start, t_end;
        r->seq = q->my_tail++;
        assert(q->my_tail <= q->peer_head_cache);
        if (r->view) { /* no copy: the value is the slot, held until tl_recv_release */
            r->val.pa = slot;
            r->t_done = t0;
            r->done = 1;
            r->left = 0;
            q->cr_defer[r->seq % q->rx_n_slots] = -1;
            if (r->waiter)
                kb_fiber_wake_at(sim, r->waiter, t0);
            continue;
        }
        int rc = kb_machine_dma(kb_ctx_machine(ctx), q->rx_pe, slot, r->dst, r->nbytes, t0, &t_start,
                                &t_end, NULL);
        assert(rc == 0); /* both ends were validated when the receive was posted */
        (void)rc;
        /* the copy's end is known now: the credit leaves then and, after the message's last
         * chunk, the waiting kernel resumes then, with no event of its own for the completion */
        kb_ipcq_req *h = r->head;
        if (t_end > h->t_done)
            h->t_done = t_end;
        int last = --h->left == 0;
        if (last)
            h->done = 1;
        if (kb_ctx_records(ctx) &&
            record_recv(ctx, q, r, slot, t_start, t_end, recv_names[name_ix(q->rx_dir)]) != 0) {
            kb_ctx_fail_in(ctx, sim, KB_ERR_NOMEM, "out of memory in an IPCQ receive");
            return;
        }
        if (credit_free(sim, q, r->seq, t_end + q->credit_delay) != 0)
            return;
        if (last && h->waiter)
            kb_fiber_wake_at(sim, h->waiter, h->t_done);
    }
}

void kb_ipcq_meta_arrive(kb_sim *sim, void *a, void *b)
{
    msg *m = a;
    qp *q = m->to;
    (void)b;
    assert(m->addr >= q->my_rx_base &&
           m->addr < q->my_rx_base + (uint64_t)q->rx_n_slots * q->rx_slot_size);
    q->slot_bytes[(m->addr - q->my_rx_base) / q->rx_slot_size] = (uint32_t)m->nbytes;
    q->peer_head_cache++;
    /* with backpressure a sender never gets more than n_slots ahead of the receiver */
    assert(!q->sys->cfg.backpressure || q->peer_head_cache - q->my_tail <= q->rx_n_slots);
    progress(sim, q);
    if (m->parts)
        kb_ipcq_parts_put(rx_part(q), m);
    else
        msg_put(rx_part(q), m);
}

/* sync: the caller waits right away, so the posting overhead is folded into that wait */
static kb_ipcq_req *post(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt, int into, kb_va va,
                         const char *op, int sync, int view)
{
    qp *q = wired_qp(tl, dir, op);
    ipcq_sys *sys = q->sys;
    uint64_t n = (uint64_t)s.rows * s.cols, per;
    uint64_t nbytes = n * kb_dtype_size(dt);
    kb_ipcq_req *r;

    if (s.rows == 0 || s.cols == 0 || (unsigned)dt >= KB_NDTYPES)
        tl_fail(tl, KB_ERR_INVAL, "%s %s: empty shape or bad dtype", op, DIRL(dir));
    r = req_get(my_part(tl));
    if (!r)
        tl_fail(tl, KB_ERR_NOMEM, "out of memory");
    r->q = q;
    r->tl = tl;
    r->rows = s.rows;
    r->cols = s.cols;
    r->dt = dt;
    r->nbytes = nbytes;
    r->seq = 0;
    r->t_done = 0;
    r->done = 0;
    r->view = 0;
    r->left = 1;
    r->waiter = NULL;
    r->head = r;
    r->sib = NULL;
    r->next = NULL;
    if (into) {
        kb_tensor *t;
        kb_tl_translate(tl, va, 1, op, &t);
        r->dst_dt = t ? kb_tensor_dtype(t) : dt;
        r->dst = kb_tl_translate(tl, va, n * kb_dtype_size(r->dst_dt), op, NULL);
        r->val = (kb_val){ 0 };
    } else if (view && nbytes <= q->rx_slot_size &&
               kb_pa_in_pe_window(q->my_rx_base, kb_pa_pe_window(tl_pe(tl)->gsip,
                                                                tl_pe(tl)->cube, tl_pe(tl)->pe))) {
        /* a view: the value will be the slot itself (progress sets its pa) */
        if (!q->cr_defer) {
            q->cr_defer = malloc((size_t)q->rx_n_slots * sizeof *q->cr_defer);
            if (!q->cr_defer)
                tl_fail(tl, KB_ERR_NOMEM, "out of memory");
            for (uint32_t k = 0; k < q->rx_n_slots; k++)
                q->cr_defer[k] = -1;
            q->cr_next = q->my_tail;
        }
        r->view = 1;
        r->dst = 0;
        r->val = (kb_val){ 0 };
        r->val.rows = s.rows;
        r->val.cols = s.cols;
        r->val.dtype = (uint8_t)dt;
        r->dst_dt = dt;
    } else {
        /* filled in place: copying a returned kb_val costs a store-forwarding stall */
        r->dst = kb_tl_scratch_alloc(tl, nbytes, op);
        r->val.pa = r->dst;
        r->val.rows = s.rows;
        r->val.cols = s.cols;
        r->val.dtype = (uint8_t)dt;
        r->val.scratch = 1;
        r->val.pad_ = 0;
        r->val.ld = 0; /* contiguous (a recycled request holds its last value's stride) */
        r->dst_dt = dt;
    }
    r->t_post = kb_sim_now(tl_sim(tl)) + kb_tl_issue_cost(tl) + sys->ipcq_ovh;
    if (nbytes > q->rx_slot_size) {
        /*
         * A message of several chunks (the sender cuts it the same way): the head receives
         * the first, one more request per chunk, all posted now so that each chunk is copied
         * out and credited as soon as it lands, without the kernel.
         */
        size_t ses = kb_dtype_size(dt), des = kb_dtype_size(r->dst_dt);
        kb_ipcq_req *prev = r;
        per = chunk_elems(q->rx_slot_size, dt);
        r->rows = 1;
        r->cols = (uint32_t)per;
        r->nbytes = per * ses;
        r->left = (uint32_t)((n + per - 1) / per);
        for (uint64_t off = per; off < n; off += per) {
            uint64_t len = n - off < per ? n - off : per;
            kb_ipcq_req *c = req_get(my_part(tl));
            if (!c)
                tl_fail(tl, KB_ERR_NOMEM, "out of memory");
            *c = *r;
            c->dst = r->dst + off * des;
            c->cols = (uint32_t)len;
            c->nbytes = len * ses;
            c->left = 0;
            c->val = (kb_val){ 0 };
            c->sib = NULL;
            prev->sib = c;
            prev = c;
        }
    }
    for (kb_ipcq_req *c = r; c; c = c->sib) {
        if (q->pend_tail)
            q->pend_tail->next = c;
        else
            q->pend_head = c;
        q->pend_tail = c;
    }
    progress(tl_sim(tl), q);
    if (!sync)
        kb_tl_wait_until(tl, r->t_post);
    return r;
}

kb_ipcq_req *tl_recv_async(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt)
{
    return post(tl, dir, s, dt, 0, 0, "tl_recv_async", 0, 0);
}

kb_ipcq_req *tl_recv_view_async(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt)
{
    return post(tl, dir, s, dt, 0, 0, "tl_recv_view_async", 0, 1);
}

void tl_recv_release(kb_tl *tl, kb_dir dir, kb_val v)
{
    if (v.scratch) { /* a view that fell back to a copy */
        tl_free(tl, v);
        return;
    }
    qp *q = wired_qp(tl, dir, "tl_recv_release");
    if (!q->cr_defer || q->cr_next >= q->my_tail ||
        q->my_rx_base + (q->cr_next % q->rx_n_slots) * q->rx_slot_size != v.pa ||
        q->cr_defer[q->cr_next % q->rx_n_slots] >= 0)
        tl_fail(tl, KB_ERR_INVAL, "tl_recv_release %s: the value is not the oldest held view "
                "of this direction (views are released in the order they were received)",
                DIRL(dir));
    /* the slot is free once the kernel's reads of it are done, i.e. now */
    if (credit_free(tl_sim(tl), q, q->cr_next, kb_sim_now(tl_sim(tl)) + q->credit_delay) != 0)
        tl_fail(tl, KB_ERR_STATE, "tl_recv_release: %s", kb_ctx_err(tl_ctx(tl))->msg);
}

kb_ipcq_req *tl_recv_into_async(kb_tl *tl, kb_dir dir, kb_va va, kb_shape s, kb_dtype dt)
{
    return post(tl, dir, s, dt, 1, va, "tl_recv_into_async", 0, 0);
}

kb_val tl_wait(kb_tl *tl, kb_ipcq_req *r)
{
    kb_val v;
    if (!r)
        tl_fail(tl, KB_ERR_INVAL, "tl_wait: no request");
    if (r->tl != tl)
        tl_fail(tl, KB_ERR_INVAL, "tl_wait: request belongs to another kernel");
    if (!r->done) {
        r->waiter = kb_fiber_current(tl_sim(tl));
        kb_fiber_block(tl_sim(tl), recv_names[name_ix(r->q->rx_dir)], r->q); /* woken at t_done */
    } else {
        kb_tl_wait_until(tl, r->t_done);
    }
    ipcq_part *p = my_part(tl);
    p->recvs++;
    if (kb_ctx_trace(tl_ctx(tl))) {
        uint64_t bytes = 0; /* the whole message: its chunks' bytes */
        for (const kb_ipcq_req *c = r; c; c = c->sib)
            bytes += c->nbytes;
        trace(tl_ctx(tl), "recv", tl_pe(tl), r->q->rx_dir, bytes, r->seq);
    }
    v = r->val;
    while (r) { /* the message's chunk requests, head first */
        kb_ipcq_req *next = r->sib;
        req_put(p, r);
        r = next;
    }
    return v;
}

uint64_t tl_slot_size(kb_tl *tl, kb_dir d)
{
    return wired_qp(tl, d, "tl_slot_size")->slot_size;
}

uint32_t tl_slot_count(kb_tl *tl, kb_dir d)
{
    return wired_qp(tl, d, "tl_slot_count")->n_slots;
}

kb_val tl_recv(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt)
{
    return tl_wait(tl, post(tl, dir, s, dt, 0, 0, "tl_recv", 1, 0));
}

void tl_recv_into(kb_tl *tl, kb_dir dir, kb_va va, kb_shape s, kb_dtype dt)
{
    tl_wait(tl, post(tl, dir, s, dt, 1, va, "tl_recv_into", 1, 0));
}
