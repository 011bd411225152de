/*
 * kb_ipcq — PE_IPCQ queue pairs (protocol in kb_ipcq.h): direction names, the IPCQ system's
 * queries and counters, its diagnostics (the deadlock dump of every queue pair's pointers, the
 * trace lines, the records of IPCQ copies, the message for a direction that is not wired) and
 * the pools' memory. The module's other files: kb_ipcq_install.c (wiring: a context's IPCQ
 * system, kb_ipcq_install and its checks), kb_ipcq_send.c (tl_send: chunks, meta tokens, the
 * credit wait) and kb_ipcq_recv.c (tl_recv and its variants: posted receives, copy-outs, the
 * credits they return); what they share is in kb_ipcq_int.h.
 *
 * Everything on the data path is event-driven and allocation-free after warm-up: meta
 * tokens are small messages from a free list, receive requests likewise, credits ride on the
 * sending queue pair. The protocol matches a meta token to the receiver's ring containing its
 * dst_addr and a credit to the sender's queue pair with the matching peer_rx_base; rings are
 * fixed and disjoint, so both matches are resolved once at install (tok_q, cred_q). Limits:
 * one install per PE for the lifetime of a context.
 */
#include "kb_ipcq_int.h"

#include <stdlib.h>
#include <string.h>

const char *const kb_ipcq_dir_names[KB_NDIRS] = {
    "E", "W", "N", "S", "global_E", "global_W", "global_N", "global_S",
    "parent", "child_left", "child_right",
};

const char *kb_dir_name(kb_dir d)
{
    if ((unsigned)d < KB_NDIRS)
        return kb_ipcq_dir_names[d];
    return (unsigned)d < KB_IPCQ_MAX_DIRS ? "peer" : "?";
}

const char *kb_dir_label(kb_dir d, char *buf, size_t n)
{
    if ((unsigned)d >= KB_NDIRS && (unsigned)d < KB_IPCQ_MAX_DIRS)
        snprintf(buf, n, "peer%u", (unsigned)d - KB_NDIRS);
    else
        snprintf(buf, n, "%s", kb_dir_name(d));
    return buf;
}

int kb_dir_from_name(const char *name)
{
    for (int i = 0; i < KB_NDIRS; i++)
        if (strcmp(name, kb_ipcq_dir_names[i]) == 0)
            return i;
    if (strncmp(name, "peer", 4) == 0 && name[4] >= '0' && name[4] <= '9' &&
        (name[4] != '0' || name[5] == '\0')) { /* digits only, no leading zero */
        unsigned long k = 0;
        for (const char *c = name + 4; *c; c++) {
            if (*c < '0' || *c > '9' || k >= KB_IPCQ_MAX_PEER_DIRS)
                return -1;
            k = k * 10 + (unsigned long)(*c - '0');
        }
        return k < KB_IPCQ_MAX_PEER_DIRS ? KB_NDIRS + (int)k : -1;
    }
    return -1;
}

int kb_dir_opposite(kb_dir d)
{
    static const int opp[KB_NDIRS] = {
        KB_DIR_W, KB_DIR_E, KB_DIR_S, KB_DIR_N,
        KB_DIR_GLOBAL_W, KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_S, KB_DIR_GLOBAL_N,
        -1, KB_DIR_PARENT, KB_DIR_PARENT,
    };
    return (unsigned)d < KB_NDIRS ? opp[d] : -1;
}

void *kb_ipcq_pool_chunk(ipcq_part *p, size_t item, size_t n)
{
    /* chunk header padded to keep items aligned */
    size_t hdr = (sizeof(chunk) + 15u) & ~(size_t)15u;
    chunk *c = malloc(hdr + item * n);
    if (!c)
        return NULL;
    c->next = p->chunks;
    p->chunks = c;
    return (char *)c + hdr;
}

void kb_ipcq_dump(kb_ctx *ctx, char *buf, size_t n, void *ud)
{
    ipcq_sys *sys = ud;
    size_t len = 0;
    int w;
    (void)ctx;
    w = snprintf(buf, n, "IPCQ pointers (my_head my_tail peer_head_cache peer_tail_cache):");
    len = w > 0 ? (size_t)w : 0;
    for (size_t i = 0; i < sys->npes && len < n; i++) {
        pe_state *ps = sys->pes[i];
        for (uint32_t k = 0; k < ps->nq && len < n; k++) {
            qp *q = &ps->q[k]; /* direction order */
            credits_take(q, kb_sim_now(kb_ctx_sim(sys->ctx)));
            w = snprintf(buf + len, n - len,
                         "\n  sip%u/cube%u/pe%u %-10s my_head=%llu my_tail=%llu "
                         "peer_head_cache=%llu peer_tail_cache=%llu",
                         ps->pe->gsip, ps->pe->cube, ps->pe->pe, DIRL(q->dir),
                         (unsigned long long)q->my_head, (unsigned long long)q->my_tail,
                         (unsigned long long)q->peer_head_cache,
                         (unsigned long long)q->peer_tail_cache);
            len += w > 0 ? (size_t)w : 0;
        }
    }
}

uint32_t kb_ipcq_wired(kb_ctx *ctx, const kb_pe_hw *pe)
{
    (void)ctx;
    const pe_state *ps = pe->ipcq_state;
    return ps ? ps->wired : 0;
}

int kb_ipcq_is_wired(kb_ctx *ctx, const kb_pe_hw *pe, kb_dir d)
{
    (void)ctx;
    return qp_of(pe->ipcq_state, (int)d) != NULL;
}

int kb_ipcq_peer_wired(kb_ctx *ctx, const kb_pe_hw *pe)
{
    (void)ctx;
    const pe_state *ps = pe->ipcq_state;
    return ps ? (int)ps->npeer : 0;
}

int kb_ipcq_counters_of(kb_ctx *ctx, const kb_pe_hw *pe, kb_dir d, kb_ipcq_counters *out)
{
    qp *q = qp_of(pe->ipcq_state, (int)d);
    if (!q)
        return KB_ERR_DIRECTION;
    credits_take(q, kb_sim_now(kb_ctx_sim(ctx)));
    out->my_head = q->my_head;
    out->my_tail = q->my_tail;
    out->peer_head_cache = q->peer_head_cache;
    out->peer_tail_cache = q->peer_tail_cache;
    out->my_rx_base = q->my_rx_base;
    out->peer_rx_base = q->peer_rx_base;
    out->peer = q->peer;
    return 0;
}

void kb_ipcq_counts(kb_ctx *ctx, uint64_t *msgs, uint64_t *chunks)
{
    const ipcq_sys *sys = sys_of(ctx);
    *msgs = *chunks = 0;
    for (int i = 0; sys && i < sys->nparts; i++) {
        *msgs += sys->part[i].msgs;
        *chunks += sys->part[i].sends;
    }
}

/* Bytes sent on named direction d (KB_NDIRS: every peer direction), over every SIP. */
static uint64_t dir_bytes(kb_ctx *ctx, unsigned d)
{
    const ipcq_sys *sys = sys_of(ctx);
    uint64_t b = 0;
    for (int i = 0; sys && i < sys->nparts; i++)
        b += sys->part[i].dir_bytes[d];
    return b;
}

uint64_t kb_ipcq_dir_bytes(kb_ctx *ctx, kb_dir dir)
{
    return (unsigned)dir < KB_NDIRS ? dir_bytes(ctx, (unsigned)dir) : 0;
}

uint64_t kb_ipcq_peer_bytes(kb_ctx *ctx) { return dir_bytes(ctx, KB_NDIRS); }

uint64_t kb_ipcq_slot_size(kb_ctx *ctx)
{
    const ipcq_sys *sys = sys_of(ctx);
    return sys ? sys->cfg.slot_size : 0;
}

int kb_ipcq_posted(kb_ctx *ctx)
{
    const ipcq_sys *sys = sys_of(ctx);
    return sys ? sys->cfg.posted : 0;
}

KB_NOINLINE void kb_ipcq_trace_line(FILE *f, kb_ctx *ctx, const char *what, const kb_pe_hw *pe,
                                    kb_dir d, uint64_t nbytes, uint64_t seq)
{
    fprintf(f, "ipcq t=%.3fns %s %s %lluB seq=%llu sip%u/cube%u/pe%u\n",
            kb_time_to_ns(kb_sim_now(kb_ctx_sim(ctx))), what, DIRL(d),
            (unsigned long long)nbytes, (unsigned long long)seq, pe->gsip, pe->cube, pe->pe);
}

KB_COLD void kb_ipcq_not_wired(kb_tl *tl, kb_dir d, const char *op)
{
    pe_state *ps = tl_pe(tl)->ipcq_state;
    char wired[200] = "";
    size_t len = 0;
    for (int i = 0; ps && i < KB_NDIRS; i++) {
        if (qp_of(ps, i)) {
            int w = snprintf(wired + len, sizeof wired - len, "%s%s", len ? " " : "",
                             kb_ipcq_dir_names[i]);
            len += w > 0 ? (size_t)w : 0;
        }
    }
    if (ps && ps->npeer && len < sizeof wired) { /* a full mesh's are many: their range */
        int w = snprintf(wired + len, sizeof wired - len, "%s%u peer directions in peer%u..peer%u",
                         len ? " and " : "", ps->npeer, ps->peer_lo,
                         ps->peer_lo + ps->peer_span - 1u);
        len += w > 0 ? (size_t)w : 0;
    }
    tl_fail(tl, KB_ERR_DIRECTION, "%s: direction %s is not wired on this PE (wired: %s)", op,
            DIRL(d), len ? wired : "none");
}

KB_NOINLINE int kb_ipcq_record_copy(kb_ctx *ctx, uint32_t pe, const copy_desc *c,
                                    const char *name)
{
    kb_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.t_start = c->t_start;
    rec.t_end = c->t_end;
    rec.kind = KB_REC_COPY;
    rec.nsrc = 1;
    rec.pe = pe;
    rec.dst = c->dst;
    rec.src[0] = c->src;
    return kb_ctx_record_as(ctx, &rec, name);
}
