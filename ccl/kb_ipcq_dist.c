/*
 * kb_ipcq_dist — the IPCQ's part in a run spread over several processes (kb_ext_dist in
 * kb_runtime_ext.h, docs/parallel.md): after a forked launch, the process that ran a SIP hands
 * the others the IPCQ state of that SIP's PEs (their queue pairs' counters, credit rings, slot
 * sizes and views' deferred credits, and the SIP's counts), and every process hands on the two
 * fields a queue pair's peer SIPs write (when its last token lands, and its chunks' head at
 * each part of their route), which only grow, so the others take the larger. Limits: a launch
 * must end with no receive request pending and no sender waiting for credits (a kernel that
 * returns has none; after a failed launch the state only feeds the reports, and those are
 * passed over); a queue pair crosses as its PE and its index there, which every process
 * shares because every process makes the same installs.
 */
#include <stdlib.h>
#include <string.h>

#include "kb_ipcq_int.h"

void kb_ipcq_qp_put(kb_wire *w, const qp *q)
{
    kb_wire_u32(w, q->owner->pe->gid);
    kb_wire_u32(w, (uint32_t)(q - q->owner->q));
}

qp *kb_ipcq_qp_get(ipcq_sys *sys, kb_wire_rd *r)
{
    const kb_machine *m = kb_ctx_machine(sys->ctx);
    uint32_t gid = kb_wire_get_u32(r), ix = kb_wire_get_u32(r);
    if (!kb_wire_rd_ok(r) || gid >= (uint32_t)(m->nsips * m->ncubes * m->npes))
        return NULL;
    pe_state *ps = m->pe_by_gid[gid]->ipcq_state;
    return ps && ix < ps->nq ? &ps->q[ix] : NULL;
}

static void put_times(kb_wire *w, const kb_time *t, uint32_t n)
{
    kb_wire_put(w, t, (size_t)n * sizeof *t);
}

static int dist_save(void *ext, const uint8_t *own, int failed, kb_wire *w)
{
    ipcq_sys *sys = ext;
    for (int s = 0; s < sys->nparts; s++)
        if (own[s]) {
            const ipcq_part *p = &sys->part[s];
            kb_wire_u64(w, p->sends);
            kb_wire_u64(w, p->recvs);
            kb_wire_u64(w, p->msgs);
            kb_wire_put(w, p->dir_bytes, sizeof p->dir_bytes);
        }
    for (size_t i = 0; i < sys->npes; i++) {
        const pe_state *ps = sys->pes[i];
        if (!own[ps->pe->gsip])
            continue;
        for (uint32_t k = 0; k < ps->nq; k++) {
            const qp *q = &ps->q[k];
            if (!failed && (q->pend_head || q->cr_waiter))
                return KB_ERR_UNSUPPORTED; /* a launch left a request or a waiter behind */
            kb_wire_u64(w, q->my_head);
            kb_wire_u64(w, q->peer_tail_cache);
            kb_wire_u32(w, q->cr_head);
            kb_wire_u32(w, q->cr_n);
            put_times(w, q->cr_t, q->n_slots);
            kb_wire_u64(w, q->my_tail);
            kb_wire_u64(w, q->peer_head_cache);
            kb_wire_u64(w, q->cr_next);
            kb_wire_u64(w, q->cr_last);
            kb_wire_put(w, q->slot_bytes, (size_t)q->rx_n_slots * sizeof *q->slot_bytes);
            kb_wire_u32(w, q->cr_defer != NULL);
            if (q->cr_defer)
                put_times(w, q->cr_defer, q->rx_n_slots);
        }
    }
    /* what other SIPs write: from every process, the largest wins */
    for (size_t i = 0; i < sys->npes; i++) {
        const pe_state *ps = sys->pes[i];
        for (uint32_t k = 0; k < ps->nq; k++) {
            const qp *q = &ps->q[k];
            uint64_t np = q->part_head ? (uint64_t)q->part_head[-1] : 0;
            kb_wire_u64(w, q->tok_last);
            kb_wire_u64(w, np);
            put_times(w, q->part_head, (uint32_t)np);
        }
    }
    return kb_wire_ok(w);
}

static int dist_load(void *ext, const uint8_t *theirs, kb_wire_rd *r)
{
    ipcq_sys *sys = ext;
    for (int s = 0; s < sys->nparts; s++)
        if (theirs[s]) {
            ipcq_part *p = &sys->part[s];
            p->sends = kb_wire_get_u64(r);
            p->recvs = kb_wire_get_u64(r);
            p->msgs = kb_wire_get_u64(r);
            kb_wire_get(r, p->dir_bytes, sizeof p->dir_bytes);
        }
    for (size_t i = 0; i < sys->npes; i++) {
        pe_state *ps = sys->pes[i];
        if (!theirs[ps->pe->gsip])
            continue;
        for (uint32_t k = 0; k < ps->nq; k++) {
            qp *q = &ps->q[k];
            q->my_head = kb_wire_get_u64(r);
            q->peer_tail_cache = kb_wire_get_u64(r);
            q->cr_head = kb_wire_get_u32(r);
            q->cr_n = kb_wire_get_u32(r);
            kb_wire_get(r, q->cr_t, (size_t)q->n_slots * sizeof *q->cr_t);
            q->my_tail = kb_wire_get_u64(r);
            q->peer_head_cache = kb_wire_get_u64(r);
            q->cr_next = kb_wire_get_u64(r);
            q->cr_last = kb_wire_get_u64(r);
            kb_wire_get(r, q->slot_bytes, (size_t)q->rx_n_slots * sizeof *q->slot_bytes);
            if (kb_wire_get_u32(r)) {
                if (!q->cr_defer &&
                    !(q->cr_defer = malloc((size_t)q->rx_n_slots * sizeof *q->cr_defer)))
                    return KB_ERR_NOMEM;
                kb_wire_get(r, q->cr_defer, (size_t)q->rx_n_slots * sizeof *q->cr_defer);
            }
            if (!kb_wire_rd_ok(r))
                return KB_ERR_STATE;
        }
    }
    for (size_t i = 0; i < sys->npes; i++) {
        pe_state *ps = sys->pes[i];
        for (uint32_t k = 0; k < ps->nq; k++) {
            qp *q = &ps->q[k];
            kb_time tok = kb_wire_get_u64(r);
            uint64_t np = kb_wire_get_u64(r);
            q->tok_last = tok > q->tok_last ? tok : q->tok_last;
            if (np == 0)
                continue;
            if ((q->part_head && (uint64_t)q->part_head[-1] != np) || np > 64)
                return KB_ERR_STATE;
            if (!q->part_head && !kb_ipcq_part_heads(q, np))
                return KB_ERR_NOMEM;
            for (uint64_t j = 0; j < np; j++) {
                kb_time h = kb_wire_get_u64(r);
                q->part_head[j] = h > q->part_head[j] ? h : q->part_head[j];
            }
            if (!kb_wire_rd_ok(r))
                return KB_ERR_STATE;
        }
    }
    return kb_wire_rd_ok(r) ? 0 : KB_ERR_STATE;
}

int kb_ipcq_dist_attach(ipcq_sys *sys)
{
    kb_ext_dist d = { dist_save, dist_load, 2,
                      { { kb_ipcq_part_arrive, kb_ipcq_part_enc, kb_ipcq_part_dec },
                        { kb_ipcq_credit_arrive, kb_ipcq_credit_enc, kb_ipcq_credit_dec } } };
    return kb_ctx_set_ext_dist(sys->ctx, KB_EXT_IPCQ, &d);
}
