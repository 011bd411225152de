/*
 * kb_ipcq_int — what the files of the IPCQ share with each other and nobody else: the queue
 * pairs, a PE's IPCQ state, receive requests, meta tokens and the per-context system, the
 * lookups and small steps both data paths take (a direction's queue pair, taking in arrived
 * credits, the trace line), and the functions one file calls in another. The files: kb_ipcq.c
 * (direction names, queries and counters, the deadlock dump, traces and records of IPCQ copies,
 * the pools' memory), kb_ipcq_install.c (wiring: the context's IPCQ system and kb_ipcq_install),
 * kb_ipcq_send.c (tl_send), kb_ipcq_recv.c (receives and the credits they return) and
 * kb_ipcq_dist.c (the IPCQ in a run over several processes). The
 * static inline helpers here are on the send and receive paths: they stay visible to their
 * callers so that the paths cost what they did in one file. Internal: not installed
 * (CMakeLists.txt leaves it out of include/kbcl) and included by those files only.
 */
#ifndef KB_IPCQ_INT_H
#define KB_IPCQ_INT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kb_ipcq.h"
#include "kb_runtime_ext.h"
#include "kb_sync.h"

#define KB_IPCQ_POOL_CHUNK 256

typedef struct ipcq_sys ipcq_sys;
typedef struct pe_state pe_state;

#define KB_QP_INLINE_SLOTS 4 /* rings up to this many slots keep their arrays in the qp */

/*
 * A queue pair, laid out by role in whole cache lines: a 256-PE collective is bound by cache
 * misses, and a step touches the sending side of one queue pair and the receiving side of
 * another. The arrays of small rings live inside the struct.
 *
 * The matches the protocol makes by address are resolved once at install (rings are fixed and
 * disjoint): tok_q is the peer's queue pair whose ring holds peer_rx_base (where this one's
 * tokens land), cred_q the peer's queue pair whose peer_rx_base is my_rx_base (where this
 * one's credits go); NULL where no queue pair matches.
 *
 * Credits in flight are kept as arrival times only: a receiver frees slots in order (seq =
 * my_tail++), so the k-th credit to arrive is for seq k and taking one in FIFO order moves
 * peer_tail_cache on by exactly one.
 */
typedef struct qp {
    /* line 1: the sending side */
    uint64_t my_head, peer_tail_cache;
    kb_pa peer_rx_base;
    struct qp *tok_q;
    kb_time *cr_t;            /* [n_slots] ring of credit arrival times (cr_inl or the heap) */
    uint64_t slot_size;
    uint32_t n_slots, cr_head, cr_n;
    uint8_t wired;
    uint8_t parts;            /* sends go by parts (per_sip, the peer in another SIP) */
    uint16_t dir;             /* a named direction or a peer direction (< KB_IPCQ_MAX_DIRS) */
    /* line 2 */
    _Alignas(64) kb_time cr_inl[KB_QP_INLINE_SLOTS];
    kb_pe_hw *peer;
    kb_fiber *cr_waiter;      /* the sender blocked on credits, woken at the next arrival */
    kb_time tok_last;         /* when the last token sent reaches the peer: tokens of a queue
                               * arrive in order though its chunks' DMAs may take different
                               * channels and end out of order */
    /* line 3: the receiving side */
    _Alignas(64) kb_pa my_rx_base;
    uint64_t peer_head_cache, my_tail;
    kb_ipcq_req *pend_head, *pend_tail;
    struct qp *cred_q;
    kb_time credit_delay;
    kb_pe_hw *rx_pe;          /* the owner's PE, which issues the copy-outs */
    /* line 4 */
    _Alignas(64) uint32_t *slot_bytes; /* [n_slots]: size of the message in each slot */
    uint32_t sb_inl[KB_QP_INLINE_SLOTS];
    uint64_t rx_slot_size;    /* slot_size, n_slots and dir again, on the receiving side's lines */
    uint32_t rx_n_slots;
    uint16_t rx_dir;
    /* system.switch.arbitration per_sip, the receiving side of a queue pair between SIPs:
     * its credits travel as events (kb_ipcq_recv.c: credit_out). Always equal to `parts`
     * (line 1, set with it at install): every credit reads it, here on a line the receive
     * path touches anyway, not the sending side's */
    uint8_t cr_event;
    pe_state *owner;
    struct ipcq_sys *sys;
    /* views (tl_recv_view_async): slots are credited in order, so while a view holds slot
     * seq, later slots' credits wait in cr_defer[seq % n_slots] (-1: not yet known) until
     * the view is released; cr_next is the seq of the next credit to send. NULL until the
     * queue pair's first view. */
    kb_time *cr_defer;
    uint64_t cr_next;
    /* system.switch.arbitration per_sip, a queue pair between SIPs: the latest head time at
     * each part of its route ([nparts], from the pool; NULL until its first send), so that
     * its chunks cross every part in the order they were sent */
    kb_time *part_head;
    /* the receiving side of a queue pair between SIPs with per_sip (cr_event): each credit
     * no earlier than the one before */
    kb_time cr_last;
} qp;

_Static_assert(offsetof(qp, cr_event) / 64 == offsetof(qp, sys) / 64 &&
                   offsetof(qp, sys) / 64 == offsetof(qp, slot_bytes) / 64,
               "a credit reads cr_event on the receiving side's second line");

_Static_assert(KB_IPCQ_MAX_DIRS <= UINT16_MAX, "a queue pair keeps its direction in 16 bits");

/*
 * A PE's IPCQ state: queue pairs for its wired directions only, in direction order, the named
 * ones first (a ring PE wires two to four of the eleven, a full mesh's PE ws - 1 peer
 * directions, and every page of per-PE state is a page fault when a launch installs hundreds
 * of PEs). Named direction d is found by its bit in `wired`; peer direction KB_DIR_PEER(k) by
 * peer_ix[k - peer_lo] (UINT32_MAX: not wired), a table over the span of the PE's peer
 * directions only. Carved from one block per install.
 */
struct pe_state {
    kb_pe_hw *pe;
    ipcq_sys *sys;
    uint32_t wired;    /* named directions, bit d */
    uint32_t nq;       /* queue pairs: named, then peer */
    uint32_t npeer;    /* wired peer directions */
    uint32_t peer_lo, peer_span;
    uint32_t *peer_ix; /* [peer_span], in the state's block; NULL without peer directions */
    qp q[];            /* [nq] */
};

/* Set bits (no POPCNT in baseline x86-64: the portable bit trick). */
static inline unsigned bits_set(uint32_t x)
{
    x = x - ((x >> 1) & UINT32_C(0x55555555));
    x = (x & UINT32_C(0x33333333)) + ((x >> 2) & UINT32_C(0x33333333));
    x = (x + (x >> 4)) & UINT32_C(0x0f0f0f0f);
    return (x * UINT32_C(0x01010101)) >> 24;
}

/* Bits of mask below bit d (< 32): the index of direction d's queue pair among the wired. */
static inline unsigned rank_below(uint32_t mask, unsigned d)
{
    return bits_set(mask & ((UINT32_C(1) << d) - 1u));
}

/* Peer direction d's queue pair (d >= KB_NDIRS), or NULL where it is not wired. */
static inline qp *peer_qp(const pe_state *ps, unsigned d)
{
    uint32_t k = d - KB_NDIRS - ps->peer_lo;
    if (d < KB_NDIRS + ps->peer_lo || k >= ps->peer_span || ps->peer_ix[k] == UINT32_MAX)
        return NULL;
    return (qp *)&ps->q[ps->peer_ix[k]];
}

/* Direction d's queue pair, or NULL where d is not wired. */
static inline qp *qp_of(const pe_state *ps, int d)
{
    if (!ps || d < 0)
        return NULL;
    if ((unsigned)d >= KB_NDIRS)
        return peer_qp(ps, (unsigned)d);
    if (!(ps->wired >> d & 1u))
        return NULL;
    return (qp *)&ps->q[rank_below(ps->wired, (unsigned)d)];
}

/*
 * A posted receive of one chunk (one slot's worth). A message of k chunks is k requests
 * chained by `sib` from its head, the handle tl_recv_async returns; the head counts the
 * chunks not yet copied out and holds the message's completion.
 */
struct kb_ipcq_req {
    /* two cache lines: what posting, progress and the wait touch */
    qp *q;
    kb_tl *tl;
    kb_val val;          /* scratch value of the whole message (tl_recv; head only) */
    kb_pa dst;           /* where this chunk's slot is copied */
    uint32_t rows, cols; /* this chunk's shape (a whole one-chunk message keeps its own) */
    uint8_t dt, dst_dt;  /* kb_dtype of the message and of the destination */
    uint8_t done;        /* head: every copy-out is issued (the last ends at t_done) */
    uint8_t view;        /* a view: the slot is read in place, credited at tl_recv_release */
    uint32_t left;       /* head: chunks not yet copied out */
    uint64_t nbytes, seq;
    kb_time t_post;
    kb_time t_done;      /* head: end of the message's last copy-out, once done */
    kb_fiber *waiter;
    kb_ipcq_req *head;   /* the message this chunk belongs to */
    kb_ipcq_req *sib;    /* the message's next chunk */
    kb_ipcq_req *next;   /* the queue pair's pending list */
};

typedef struct msg {
    qp *to;              /* the receiving queue pair (matched by addr at install) */
    kb_pa addr;
    uint64_t seq;
    uint64_t nbytes;
    struct msg *next;
    uint8_t parts;       /* the msg of a parts_msg: goes back to the parts pool */
} msg;

_Static_assert(sizeof(msg) <= 64, "a msg is one cache line");

/* A chunk sent by parts (per_sip arbitration, between SIPs): its msg, the sending queue pair
 * and the DMA's parts still to book (kb_ipcq_part_arrive). Apart from msg so that the common
 * msg stays one line. */
typedef struct parts_msg {
    msg m;               /* first: kb_ipcq_meta_arrive gets &m */
    qp *from;
    kb_dma_leg leg;
} parts_msg;

typedef struct chunk {
    struct chunk *next;
} chunk;

/*
 * What one SIP's PEs take from the IPCQ's pools and count, one per SIP, so that a run split by
 * SIP (docs/parallel.md) has each SIP touch its own: a msg comes from the sender's SIP and goes
 * back to the receiver's; requests and their counts are the receiver's; sends are the
 * sender's. Lines of their own (no false sharing between SIPs).
 */
typedef struct ipcq_part {
    _Alignas(64) msg *free_msgs;
    msg *free_parts;       /* parts_msgs, linked through their msg */
    kb_ipcq_req *free_reqs;
    chunk *chunks;         /* pool memory, freed at destroy */
    uint64_t sends, recvs; /* chunks sent, messages received */
    uint64_t msgs;         /* messages sent (tl_send calls) */
    uint64_t dir_bytes[KB_NDIRS + 1]; /* bytes sent per named direction; [KB_NDIRS]: peers */
} ipcq_part;

struct ipcq_sys {
    kb_ctx *ctx;
    kb_ipcq_cfg cfg;
    kb_time ipcq_ovh, credit_lat;
    int per_sip;          /* system.switch.arbitration per_sip: sends between SIPs by parts */
    pe_state **pes;       /* installed, in install order */
    size_t npes, cappes;
    void **blocks;        /* pe_state blocks, one per install, freed at destroy */
    size_t nblocks;
    ipcq_part *part;      /* [nparts]: one per SIP of the machine */
    int nparts;
};

/* The pools and counts of the SIP of an installed PE's state (the calling kernel's: my_part). */
static inline ipcq_part *part_of(const pe_state *ps)
{
    return &ps->sys->part[ps->pe->gsip];
}

/* kb_ipcq.c: the named directions' names, "E" .. "child_right". */
extern const char *const kb_ipcq_dir_names[KB_NDIRS];

/* Index into the op-name tables (kb_ipcq_send.c, kb_ipcq_recv.c): a named direction's own,
 * KB_NDIRS for every peer one. */
static inline unsigned name_ix(unsigned d) { return d < KB_NDIRS ? d : KB_NDIRS; }

/* A direction's label for messages: a compound literal lives to the end of the enclosing
 * block, i.e. the statement that prints it. */
#define DIRL(d) kb_dir_label((kb_dir)(d), (char[KB_DIR_LABEL_LEN]){ 0 }, KB_DIR_LABEL_LEN)

/* The context's IPCQ system (NULL before its first install). */
static inline ipcq_sys *sys_of(kb_ctx *ctx) { return kb_ctx_ext(ctx, KB_EXT_IPCQ); }

/* part_of for the calling kernel's PE (my_part) and for a queue pair's receiving side
 * (rx_part), found from lines the send and receive paths read anyway (the system, the PE's
 * first line; the queue pair's receiving lines) rather than from the pe_state's own, which no
 * step reads otherwise: with thousands of PEs every line a step touches is a cache miss. */
static inline ipcq_part *my_part(kb_tl *tl)
{
    assert(sys_of(tl_ctx(tl)) == ((const pe_state *)tl_pe(tl)->ipcq_state)->sys);
    return &sys_of(tl_ctx(tl))->part[tl_pe(tl)->gsip];
}

static inline ipcq_part *rx_part(const qp *q)
{
    assert(q->rx_pe == q->owner->pe && q->sys == q->owner->sys);
    return &q->sys->part[q->rx_pe->gsip];
}

/* Elements of dtype dt per chunk: as many whole elements as one slot holds. */
static inline uint64_t chunk_elems(uint64_t slot_size, kb_dtype dt)
{
    return slot_size / kb_dtype_size(dt);
}

/* Takes in the credits that have arrived by `now` (a send, the dump and kb_ipcq_counters_of
 * look at the counters only through it; see qp for why one credit is one step). */
static inline void credits_take(qp *q, kb_time now)
{
    while (q->cr_n && q->cr_t[q->cr_head] <= now) {
        q->peer_tail_cache++; /* the credit for seq peer_tail_cache (see qp) */
        q->cr_head = q->cr_head + 1 == q->n_slots ? 0 : q->cr_head + 1;
        q->cr_n--;
    }
    /* a credit frees a slot that a send filled */
    assert(q->cr_n <= q->n_slots && q->peer_tail_cache + q->cr_n <= q->my_head);
}

/* kb_ipcq.c. A block of n pool items of `item` bytes, owned by the part (freed with the
 * IPCQ), or NULL. */
void *kb_ipcq_pool_chunk(ipcq_part *p, size_t item, size_t n);

/* kb_ipcq_send.c. q's per-part head floors ([nparts], zeros; their count just before them),
 * set as q->part_head; NULL when out of memory. */
kb_time *kb_ipcq_part_heads(qp *q, uint64_t nparts);

/*
 * A run over several processes (kb_ext_dist, docs/parallel.md). kb_ipcq_dist.c: a queue
 * pair as (PE, index) on the wire and back (NULL: no such queue pair); the system's part in
 * the run (registered with the context when the system is made). kb_ipcq_send.c and
 * kb_ipcq_recv.c: the codecs of their messages between SIPs.
 */
void kb_ipcq_qp_put(struct kb_wire *w, const qp *q);
qp *kb_ipcq_qp_get(ipcq_sys *sys, struct kb_wire_rd *r);
int kb_ipcq_dist_attach(ipcq_sys *sys);
void kb_ipcq_credit_arrive(kb_sim *sim, void *a, void *b);
size_t kb_ipcq_part_enc(void *ud, void *a, void *b, uint8_t *buf);
int kb_ipcq_part_dec(void *ud, kb_sim *to, const uint8_t *buf, size_t n, void **a, void **b);
size_t kb_ipcq_credit_enc(void *ud, void *a, void *b, uint8_t *buf);
int kb_ipcq_credit_dec(void *ud, kb_sim *to, const uint8_t *buf, size_t n, void **a,
                       void **b);

/* kb_ipcq.c. The context's deadlock dump (kb_dump_fn): every queue pair's pointers. */
void kb_ipcq_dump(kb_ctx *ctx, char *buf, size_t n, void *ud);

/* kb_ipcq.c. One line of the IPCQ trace (kb_ctx_trace) for a send or a receive. */
KB_NOINLINE void kb_ipcq_trace_line(FILE *f, kb_ctx *ctx, const char *what, const kb_pe_hw *pe,
                                    kb_dir d, uint64_t nbytes, uint64_t seq);

/* kb_ipcq.c. Fails the kernel: direction d is not wired on its PE (the message lists those
 * that are). */
KB_COLD void kb_ipcq_not_wired(kb_tl *tl, kb_dir d, const char *op);

/* The trace line of a send or receive, when the context traces (the test stays in line). */
static inline void trace(kb_ctx *ctx, const char *what, const kb_pe_hw *pe, kb_dir d,
                         uint64_t nbytes, uint64_t seq)
{
    if (kb_ctx_trace(ctx))
        kb_ipcq_trace_line(kb_ctx_trace(ctx), ctx, what, pe, d, nbytes, seq);
}

/* Direction d's queue pair on the calling kernel's PE; fails the kernel where d is not wired. */
static inline qp *wired_qp(kb_tl *tl, kb_dir d, const char *op)
{
    pe_state *ps = tl_pe(tl)->ipcq_state;
    /* the PE's copy of the bitmask: it shares a line with ipcq_state */
    uint32_t wired = tl_pe(tl)->ipcq_wired;
    if ((unsigned)d < KB_NDIRS) {
        if (wired >> d & 1u)
            return &ps->q[rank_below(wired, (unsigned)d)];
    } else if (ps) {
        qp *q = peer_qp(ps, (unsigned)d);
        if (q)
            return q;
    }
    kb_ipcq_not_wired(tl, d, op);
    return NULL;
}

/* An IPCQ copy's operands and times, built by the caller only when records are wanted. */
typedef struct copy_desc {
    kb_opnd dst, src;
    kb_time t_start, t_end;
} copy_desc;

/* kb_ipcq.c. Records an IPCQ copy (out of line: timing-only runs never build a record).
 * 0 or KB_ERR_NOMEM. */
KB_NOINLINE int kb_ipcq_record_copy(kb_ctx *ctx, uint32_t pe, const copy_desc *c,
                                    const char *name);

/* kb_ipcq_send.c. Puts a parts_msg (m->parts) back in part p's pool. */
void kb_ipcq_parts_put(ipcq_part *p, msg *m);

/* kb_ipcq_recv.c. A meta token's arrival at the receiving queue pair (an event: a, the msg;
 * the send path schedules it when the chunk's DMA ends). */
void kb_ipcq_meta_arrive(kb_sim *sim, void *a, void *b);
/* kb_ipcq_send.c. The head of a chunk sent between SIPs reaches the next part of its route
 * (per_sip arbitration; an event: a, the msg): books that part, then the next, and the last
 * part schedules the token. */
void kb_ipcq_part_arrive(kb_sim *sim, void *a, void *b);

#endif
