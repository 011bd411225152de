/*
 * kb_ipcq — PE_IPCQ queue pairs, install, and tl_send / tl_recv (protocol in kb_ipcq.h).
 *
 * Everything on the data path is event-driven and allocation-free after warm-up: meta
 * tokens are small messages from a free list, receive requests likewise, credits ride on the
 * sending queue pair. The protocol matches a meta token to the receiver's ring containing its
 * dst_addr and a credit to the sender's queue pair with the matching peer_rx_base; rings are
 * fixed and disjoint, so both matches are resolved once at install (tok_q, cred_q). Limits:
 * one install per PE for the lifetime of a context.
 */
#include "kb_ipcq.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_runtime_ext.h"
#include "kb_sync.h"

#define KB_IPCQ_POOL_CHUNK 256
#define KB_IPCQ_CMD_BYTES 64u

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
    pe_state *owner;
    struct ipcq_sys *sys;
    /* views (tl_recv_view_async): slots are credited in order, so while a view holds slot
     * seq, later slots' credits wait in cr_defer[seq % n_slots] (-1: not yet known) until
     * the view is released; cr_next is the seq of the next credit to send. NULL until the
     * queue pair's first view. */
    kb_time *cr_defer;
    uint64_t cr_next;
} qp;

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

/* A PE new to an install gathers its named directions in its ipcq_wired; this bit marks one
 * that has met only peer directions so far (the install sorts those out by PE). */
#define PEER_MARK (UINT32_C(1) << 31)
#define NAMED_MASK ((UINT32_C(1) << KB_NDIRS) - 1u)
_Static_assert(KB_NDIRS < 31, "named directions and the peer mark share a 32-bit mask");
_Static_assert(KB_IPCQ_MAX_DIRS <= UINT16_MAX, "a queue pair keeps its direction in 16 bits");

/* Set bits (no POPCNT in baseline x86-64: the portable bit trick). */
static unsigned bits_set(uint32_t x)
{
    x = x - ((x >> 1) & UINT32_C(0x55555555));
    x = (x & UINT32_C(0x33333333)) + ((x >> 2) & UINT32_C(0x33333333));
    x = (x + (x >> 4)) & UINT32_C(0x0f0f0f0f);
    return (x * UINT32_C(0x01010101)) >> 24;
}

/* Bits of mask below bit d (< 32): the index of direction d's queue pair among the wired. */
static unsigned rank_below(uint32_t mask, unsigned d)
{
    return bits_set(mask & ((UINT32_C(1) << d) - 1u));
}

/* Peer direction d's queue pair (d >= KB_NDIRS), or NULL where it is not wired. */
static qp *peer_qp(const pe_state *ps, unsigned d)
{
    uint32_t k = d - KB_NDIRS - ps->peer_lo;
    if (d < KB_NDIRS + ps->peer_lo || k >= ps->peer_span || ps->peer_ix[k] == UINT32_MAX)
        return NULL;
    return (qp *)&ps->q[ps->peer_ix[k]];
}

/* Direction d's queue pair, or NULL where d is not wired. */
static qp *qp_of(const pe_state *ps, int d)
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
} msg;

typedef struct chunk {
    struct chunk *next;
} chunk;

struct ipcq_sys {
    kb_ctx *ctx;
    kb_ipcq_cfg cfg;
    kb_time ipcq_ovh, credit_lat;
    pe_state **pes;       /* installed, in install order */
    size_t npes, cappes;
    msg *free_msgs;
    kb_ipcq_req *free_reqs;
    chunk *chunks;        /* pool memory, freed at destroy */
    void **blocks;        /* pe_state blocks, one per install, freed at destroy */
    size_t nblocks;
    uint64_t sends, recvs; /* chunks sent, messages received */
    uint64_t msgs;         /* messages sent (tl_send calls) */
    uint64_t dir_bytes[KB_NDIRS + 1]; /* bytes sent per named direction; [KB_NDIRS]: peers */
};

static const char *const dir_names[KB_NDIRS] = {
    "E", "W", "N", "S", "global_E", "global_W", "global_N", "global_S",
    "parent", "child_left", "child_right",
};
/* Op names of records and blocked fibers (static strings: records keep the pointer); every
 * peer direction shares the last one (the record's PE and addresses tell the peer). */
static const char *const recv_names[KB_NDIRS + 1] = {
    "ipcq recv E", "ipcq recv W", "ipcq recv N", "ipcq recv S", "ipcq recv global_E",
    "ipcq recv global_W", "ipcq recv global_N", "ipcq recv global_S", "ipcq recv parent",
    "ipcq recv child_left", "ipcq recv child_right", "ipcq recv peer",
};
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

/* Index into the name tables above: a named direction's own, KB_NDIRS for every peer one. */
static inline unsigned name_ix(unsigned d) { return d < KB_NDIRS ? d : KB_NDIRS; }

const char *kb_dir_name(kb_dir d)
{
    if ((unsigned)d < KB_NDIRS)
        return dir_names[d];
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

/* A direction's label for messages: a compound literal lives to the end of the enclosing
 * block, i.e. the statement that prints it. */
#define DIRL(d) kb_dir_label((kb_dir)(d), (char[KB_DIR_LABEL_LEN]){ 0 }, KB_DIR_LABEL_LEN)

int kb_dir_from_name(const char *name)
{
    for (int i = 0; i < KB_NDIRS; i++)
        if (strcmp(name, dir_names[i]) == 0)
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

/* ---- state and pools ---- */

static kb_alloc *ring_allocator(kb_ctx *ctx, kb_pe_hw *pe, kb_mem_kind kind)
{
    switch (kind) {
    case KB_MEM_HBM:
        return pe->hbm;
    case KB_MEM_SRAM:
        return kb_ctx_machine(ctx)->sips[pe->gsip].cubes[pe->cube].sram;
    default:
        return pe->ipcq;
    }
}

/* Returns a PE's rings and ring arrays and unhooks it; the state's memory is its block's. */
static void free_pe_state(ipcq_sys *sys, pe_state *ps)
{
    for (uint32_t k = 0; k < ps->nq; k++) {
        qp *q = &ps->q[k];
        if (q->wired)
            kb_alloc_free(ring_allocator(sys->ctx, ps->pe, sys->cfg.buffer_kind),
                          q->my_rx_base, NULL);
        if (q->slot_bytes != q->sb_inl)
            free(q->slot_bytes);
        if (q->cr_t != q->cr_inl)
            free(q->cr_t);
        free(q->cr_defer);
        q->cr_defer = NULL;
    }
    ps->pe->ipcq_state = NULL;
    ps->pe->ipcq_wired = 0;
}

static void sys_destroy(void *p)
{
    ipcq_sys *sys = p;
    for (size_t i = 0; i < sys->npes; i++)
        free_pe_state(sys, sys->pes[i]);
    free(sys->pes);
    for (size_t i = 0; i < sys->nblocks; i++)
        free(sys->blocks[i]);
    free(sys->blocks);
    while (sys->chunks) {
        chunk *c = sys->chunks;
        sys->chunks = c->next;
        free(c);
    }
    free(sys);
}

static void *pool_chunk(ipcq_sys *sys, size_t item, size_t n)
{
    /* chunk header padded to keep items aligned */
    size_t hdr = (sizeof(chunk) + 15u) & ~(size_t)15u;
    chunk *c = malloc(hdr + item * n);
    if (!c)
        return NULL;
    c->next = sys->chunks;
    sys->chunks = c;
    return (char *)c + hdr;
}

static msg *msg_get(ipcq_sys *sys)
{
    if (!sys->free_msgs) {
        msg *m = pool_chunk(sys, sizeof *m, KB_IPCQ_POOL_CHUNK);
        if (!m)
            return NULL;
        for (int i = 0; i < KB_IPCQ_POOL_CHUNK; i++) {
            m[i].next = sys->free_msgs;
            sys->free_msgs = &m[i];
        }
    }
    msg *m = sys->free_msgs;
    sys->free_msgs = m->next;
    return m;
}

static void msg_put(ipcq_sys *sys, msg *m)
{
    m->next = sys->free_msgs;
    sys->free_msgs = m;
}

static kb_ipcq_req *req_get(ipcq_sys *sys)
{
    if (!sys->free_reqs) {
        kb_ipcq_req *r = pool_chunk(sys, sizeof *r, KB_IPCQ_POOL_CHUNK);
        if (!r)
            return NULL;
        for (int i = 0; i < KB_IPCQ_POOL_CHUNK; i++) {
            r[i].next = sys->free_reqs;
            sys->free_reqs = &r[i];
        }
    }
    kb_ipcq_req *r = sys->free_reqs;
    sys->free_reqs = r->next;
    return r; /* post sets every field */
}

static void req_put(ipcq_sys *sys, kb_ipcq_req *r)
{
    r->next = sys->free_reqs;
    sys->free_reqs = r;
}

static void credits_take(qp *q, kb_time now)
{
    while (q->cr_n && q->cr_t[q->cr_head] <= now) {
        q->peer_tail_cache++; /* the credit for seq peer_tail_cache (see qp) */
        q->cr_head = q->cr_head + 1 == q->n_slots ? 0 : q->cr_head + 1;
        q->cr_n--;
    }
    /* a credit frees a slot that a send filled */
    assert(q->cr_n <= q->n_slots && q->peer_tail_cache + q->cr_n <= q->my_head);
}

static void dump(kb_ctx *ctx, char *buf, size_t n, void *ud)
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

static ipcq_sys *sys_of(kb_ctx *ctx) { return kb_ctx_ext(ctx, KB_EXT_IPCQ); }

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

/* ---- install ---- */

/* The queue pair of `ps` whose rx ring holds addr / whose peer ring starts at rx_base. */
static qp *ring_holding(pe_state *ps, kb_pa addr)
{
    for (uint32_t k = 0; ps && k < ps->nq; k++) {
        qp *q = &ps->q[k];
        if (q->wired && addr >= q->my_rx_base &&
            addr < q->my_rx_base + (uint64_t)q->n_slots * q->slot_size)
            return q;
    }
    return NULL;
}

static qp *sender_into(pe_state *ps, kb_pa rx_base)
{
    for (uint32_t k = 0; ps && k < ps->nq; k++)
        if (ps->q[k].wired && ps->q[k].peer_rx_base == rx_base)
            return &ps->q[k];
    return NULL;
}


static void fmt_pe(const kb_pe_hw *pe, char *buf, size_t n)
{
    snprintf(buf, n, "sip%u/cube%u/pe%u", pe->gsip, pe->cube, pe->pe);
}

typedef struct range {
    kb_pa base;
    uint64_t len;
    const kb_pe_hw *pe;
    int dir;
} range;

static int range_cmp(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

static kb_time route_latency(kb_ctx *ctx, kb_pe_hw *from, kb_pa src, kb_pa dst)
{
    kb_res *path[KB_MAX_ROUTE];
    kb_time lat = 0;
    int n = kb_machine_route(kb_ctx_machine(ctx), from, src, dst, path, KB_MAX_ROUTE, NULL);
    for (int i = 0; i < n; i++)
        lat += path[i]->latency;
    return lat;
}

/*
 * One install on its way: its links, the PEs new to it (in order of first link, which is the
 * order of the install messages) and what has been made for them so far, which rollback()
 * undoes. The steps below run in order; each returns 0 or a set error.
 */
typedef struct install {
    kb_ctx *ctx;
    kb_errbuf *eb;
    ipcq_sys *sys;
    const kb_ipcq_cfg *cfg;
    const kb_ipcq_link *links;
    size_t n;
    kb_pe_hw **pes;      /* [n] the new PEs */
    pe_state **states;   /* [n] their states, once made */
    size_t npes;
    struct plink *pl;    /* the links on peer directions, by (PE, direction); NULL if none */
    size_t npl;
    void *block;         /* the states' memory (sys owns it once committed) */
    int made_states;
} install;

/* A link on a peer direction, as count_links sorts them out by PE. */
typedef struct plink {
    unsigned gid;
    unsigned dir;
} plink;

static int plink_cmp(const void *a, const void *b)
{
    const plink *x = a, *y = b;
    if (x->gid != y->gid)
        return x->gid < y->gid ? -1 : 1;
    return x->dir < y->dir ? -1 : x->dir > y->dir;
}

/* The first of pl[0..n) (sorted) on PE gid. */
static size_t plink_first(const plink *pl, size_t n, unsigned gid)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pl[mid].gid < gid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static const char *area_name(kb_mem_kind kind)
{
    switch (kind) {
    case KB_MEM_HBM:
        return "the PE's HBM slice";
    case KB_MEM_SRAM:
        return "the cube SRAM";
    default:
        return "the PE's IPCQ area in TCM (pe.ipcq.area_bytes)";
    }
}

/* KB_ERR_NOSPACE with the numbers unless `nrings` rings of cfg fit next to what the ring
 * allocator of pe already holds. */
static int fit_check(kb_ctx *ctx, const kb_ipcq_cfg *cfg, kb_pe_hw *pe, uint64_t nrings,
                     uint64_t npeer, kb_errbuf *eb)
{
    kb_alloc *al = ring_allocator(ctx, pe, cfg->buffer_kind);
    uint64_t ring = (uint64_t)cfg->n_slots * cfg->slot_size;
    uint64_t size = kb_alloc_size(al), used = kb_alloc_used(al), free_b = size - used;
    char a[48];
    /* rings are 64-byte aligned: round each up, as the allocator does */
    uint64_t ring_al = (ring + 63u) & ~UINT64_C(63);
    if (nrings == 0 || (ring_al <= free_b && nrings <= free_b / ring_al))
        return 0;
    fmt_pe(pe, a, sizeof a);
    return kb_err_set(eb, KB_ERR_NOSPACE, "IPCQ install: %s needs %llu rx rings (%llu of them "
                      "peer directions) of %d slots x %llu bytes = %llu bytes, but %s has %llu "
                      "bytes (%llu free): use fewer or smaller slots (n_slots, slot_size) or a "
                      "larger area", a, (unsigned long long)nrings, (unsigned long long)npeer,
                      cfg->n_slots, (unsigned long long)cfg->slot_size,
                      (unsigned long long)(nrings * ring), area_name(cfg->buffer_kind),
                      (unsigned long long)size, (unsigned long long)free_b);
}

int kb_ipcq_check_fit(kb_ctx *ctx, const kb_ipcq_cfg *cfg, kb_pe_hw *pe, int64_t ndirs)
{
    uint64_t n = ndirs > 0 ? (uint64_t)ndirs : 0;
    return fit_check(ctx, cfg, pe, n, n, kb_ctx_err(ctx));
}

/* The context's IPCQ system, made by its first install; later installs must repeat its
 * configuration. */
static int attach_sys(install *in)
{
    const kb_ipcq_cfg *cfg = in->cfg;
    ipcq_sys *sys = sys_of(in->ctx);

    if (cfg->n_slots < 1 || cfg->slot_size < 16 || cfg->slot_size > UINT32_MAX)
        return kb_err_set(in->eb, KB_ERR_RANGE, "IPCQ install: n_slots %d (>= 1), slot_size "
                          "%llu (16 .. 4 GiB - 1)", cfg->n_slots,
                          (unsigned long long)cfg->slot_size);
    if (!sys) {
        sys = calloc(1, sizeof *sys);
        if (!sys)
            return kb_err_set(in->eb, KB_ERR_NOMEM, "out of memory");
        sys->ctx = in->ctx;
        sys->cfg = *cfg;
        sys->ipcq_ovh = kb_time_from_ns(kb_ctx_config(in->ctx)->topo.ipcq_overhead_ns);
        sys->credit_lat = kb_time_from_ns(kb_ctx_config(in->ctx)->topo.ipcq_credit_latency_ns);
        kb_ctx_set_ext(in->ctx, KB_EXT_IPCQ, sys, sys_destroy);
        kb_ctx_set_deadlock_dump(in->ctx, dump, sys);
    } else if (sys->cfg.n_slots != cfg->n_slots || sys->cfg.slot_size != cfg->slot_size ||
               sys->cfg.buffer_kind != cfg->buffer_kind ||
               sys->cfg.backpressure != cfg->backpressure) { /* fields: padding may differ */
        return kb_err_set(in->eb, KB_ERR_STATE,
                          "IPCQ install: a context uses one IPCQ configuration");
    }
    in->sys = sys;
    return 0;
}

/*
 * The wired directions of each PE (a PE installed before, or a direction twice, is an error).
 * A PE new to this install gathers them in its own ipcq_wired while its ipcq_state is still
 * NULL: outside an install a PE without a state has no wired direction, so a non-zero set
 * marks a PE this install has already met.
 */
static int count_links(install *in)
{
    char a[48];
    for (size_t i = 0; i < in->n; i++) {
        const kb_ipcq_link *l = &in->links[i];
        kb_pe_hw *pe = l->pe;
        if ((unsigned)l->dir >= KB_IPCQ_MAX_DIRS || (unsigned)l->peer_dir >= KB_IPCQ_MAX_DIRS)
            return kb_err_set(in->eb, KB_ERR_INVAL, "IPCQ install: bad direction in link %zu", i);
        if (pe->ipcq_state) {
            fmt_pe(pe, a, sizeof a);
            return kb_err_set(in->eb, KB_ERR_STATE, "IPCQ install: %s is already installed (a "
                              "second install on a PE is not allowed)", a);
        }
        if (!pe->ipcq_wired)
            in->pes[in->npes++] = pe;
        if ((unsigned)l->dir >= KB_NDIRS) { /* sorted out below */
            if (!in->pl && !(in->pl = malloc(in->n * sizeof *in->pl)))
                return kb_err_set(in->eb, KB_ERR_NOMEM, "out of memory");
            in->pl[in->npl++] = (plink){ pe->gid, (unsigned)l->dir };
            pe->ipcq_wired |= PEER_MARK;
            continue;
        }
        if (pe->ipcq_wired >> l->dir & 1u) {
            fmt_pe(pe, a, sizeof a);
            return kb_err_set(in->eb, KB_ERR_INVAL, "IPCQ install: %s direction %s appears "
                              "twice", a, dir_names[l->dir]);
        }
        pe->ipcq_wired |= UINT32_C(1) << l->dir;
    }
    assert(in->npes <= in->n);
    if (in->npl) {
        qsort(in->pl, in->npl, sizeof *in->pl, plink_cmp);
        for (size_t i = 1; i < in->npl; i++) {
            if (plink_cmp(&in->pl[i - 1], &in->pl[i]) == 0) {
                const kb_machine *m = kb_ctx_machine(in->ctx);
                unsigned g = in->pl[i].gid, per_sip = m->ncubes * m->npes;
                return kb_err_set(in->eb, KB_ERR_INVAL, "IPCQ install: sip%u/cube%u/pe%u "
                                  "direction %s appears twice", g / per_sip,
                                  g % per_sip / m->npes, g % m->npes, DIRL(in->pl[i].dir));
            }
        }
    }
    return 0;
}

/* The new PEs' states, in one block (each starts on a cache line: queue pairs are aligned). */
static int make_states(install *in)
{
    ipcq_sys *sys = in->sys;
    size_t total = 0, off = 0;

    for (size_t j = 0; j < in->npes; j++) {
        kb_pe_hw *pe = in->pes[j];
        total += sizeof(pe_state) + (size_t)bits_set(pe->ipcq_wired & NAMED_MASK) * sizeof(qp);
        if (pe->ipcq_wired & PEER_MARK) { /* its peer queue pairs and their table */
            size_t f = plink_first(in->pl, in->npl, pe->gid), e = f;
            while (e < in->npl && in->pl[e].gid == pe->gid)
                e++;
            size_t span = in->pl[e - 1].dir - in->pl[f].dir + 1u;
            total += (e - f) * sizeof(qp) + ((span * sizeof(uint32_t) + 63u) & ~(size_t)63u);
        }
    }
    /* room for the block in sys->blocks now, so that the commit cannot fail on it */
    void **nb = realloc(sys->blocks, (sys->nblocks + 1) * sizeof *nb);
    if (!nb)
        return kb_err_set(in->eb, KB_ERR_NOMEM, "out of memory");
    sys->blocks = nb;
    in->block = aligned_alloc(64, total ? total : 64);
    if (!in->block)
        return kb_err_set(in->eb, KB_ERR_NOMEM, "out of memory");
    memset(in->block, 0, total);
    for (size_t j = 0; j < in->npes; j++) {
        kb_pe_hw *pe = in->pes[j];
        pe_state *ps = (pe_state *)(void *)((char *)in->block + off);
        ps->pe = pe;
        ps->sys = sys;
        ps->wired = pe->ipcq_wired & NAMED_MASK;
        ps->nq = bits_set(ps->wired);
        if (pe->ipcq_wired & PEER_MARK) {
            size_t f = plink_first(in->pl, in->npl, pe->gid), e = f;
            while (e < in->npl && in->pl[e].gid == pe->gid)
                e++;
            ps->npeer = (uint32_t)(e - f);
            ps->peer_lo = in->pl[f].dir - KB_NDIRS;
            ps->peer_span = in->pl[e - 1].dir - in->pl[f].dir + 1u;
            ps->peer_ix = (uint32_t *)(void *)((char *)ps + sizeof(pe_state) +
                                               (size_t)(ps->nq + ps->npeer) * sizeof(qp));
            for (uint32_t k = 0; k < ps->peer_span; k++)
                ps->peer_ix[k] = UINT32_MAX;
            for (size_t t = f; t < e; t++) /* after the named ones, in direction order */
                ps->peer_ix[in->pl[t].dir - KB_NDIRS - ps->peer_lo] = ps->nq + (uint32_t)(t - f);
            ps->nq += ps->npeer;
            off += ((size_t)ps->peer_span * sizeof(uint32_t) + 63u) & ~(size_t)63u;
        }
        off += sizeof(pe_state) + (size_t)ps->nq * sizeof(qp);
        pe->ipcq_wired = ps->wired; /* the mark's job is done */
        pe->ipcq_state = ps;
        in->states[j] = ps;
    }
    assert(off == total);
    in->made_states = 1;
    return 0;
}

/* Each new PE's rings fit its ring area (a message with the numbers where they do not,
 * before a ring is allocated; a shared SRAM can still run out in alloc_rings). */
static int check_fit(install *in)
{
    for (size_t j = 0; j < in->npes; j++) {
        const pe_state *ps = in->states[j];
        int rc = fit_check(in->ctx, in->cfg, in->pes[j], ps->nq, ps->npeer, in->eb);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Every link's rx ring (where its peer's sends land) and its ring arrays. */
static int alloc_rings(install *in)
{
    const kb_ipcq_cfg *cfg = in->cfg;
    char a[48];

    for (size_t i = 0; i < in->n; i++) {
        kb_pe_hw *pe = in->links[i].pe;
        pe_state *ps = pe->ipcq_state;
        qp *q = qp_of(ps, in->links[i].dir);
        kb_alloc *al = ring_allocator(in->ctx, pe, cfg->buffer_kind);
        kb_errbuf aeb;
        uint64_t base;
        assert(q && !q->wired); /* count_links let each direction through once */
        if (kb_alloc_alloc(al, (uint64_t)cfg->n_slots * cfg->slot_size, 64, &base, &aeb) != 0) {
            fmt_pe(pe, a, sizeof a);
            return kb_err_set(in->eb, KB_ERR_NOSPACE, "IPCQ install: rx ring of %s %s (%d x "
                              "%llu bytes) in %s: %s", a, DIRL(in->links[i].dir), cfg->n_slots,
                              (unsigned long long)cfg->slot_size, area_name(cfg->buffer_kind),
                              aeb.msg);
        }
        if (cfg->n_slots <= KB_QP_INLINE_SLOTS) {
            q->slot_bytes = q->sb_inl;
            q->cr_t = q->cr_inl;
        } else {
            q->slot_bytes = calloc((size_t)cfg->n_slots, sizeof *q->slot_bytes);
            q->cr_t = calloc((size_t)cfg->n_slots, sizeof *q->cr_t);
        }
        if (!q->slot_bytes || !q->cr_t) {
            /* not wired yet: rollback frees only the rings of wired queue pairs */
            free(q->slot_bytes);
            free(q->cr_t);
            q->slot_bytes = NULL;
            q->cr_t = NULL;
            kb_alloc_free(al, base, NULL);
            return kb_err_set(in->eb, KB_ERR_NOMEM, "out of memory");
        }
        q->wired = 1;
        q->dir = (uint16_t)in->links[i].dir;
        q->owner = ps;
        q->rx_pe = pe;
        q->sys = in->sys;
        q->n_slots = (uint32_t)cfg->n_slots;
        q->slot_size = cfg->slot_size;
        q->rx_n_slots = q->n_slots;
        q->rx_dir = q->dir;
        q->rx_slot_size = q->slot_size;
        q->my_rx_base = base;
    }
    return 0;
}

/*
 * Pairs every link with the peer's ring of the reverse direction, then resolves the protocol's
 * address matches (tok_q, cred_q; see qp), which need every pairing of this install made.
 */
static int pair_links(install *in)
{
    const kb_ipcq_link *links = in->links;
    char a[48], b[48];

    for (size_t i = 0; i < in->n; i++) {
        qp *q = qp_of(links[i].pe->ipcq_state, links[i].dir);
        const qp *pq = qp_of(links[i].peer->ipcq_state, links[i].peer_dir);
        assert(q && q->wired);
        if (!pq || !pq->wired) {
            fmt_pe(links[i].pe, a, sizeof a);
            fmt_pe(links[i].peer, b, sizeof b);
            return kb_err_set(in->eb, KB_ERR_INVAL, "IPCQ install: %s %s -> %s, but %s has no "
                              "%s queue pointing back", a, DIRL(links[i].dir), b, b,
                              DIRL(links[i].peer_dir));
        }
        q->peer = links[i].peer;
        q->peer_rx_base = pq->my_rx_base;
    }
    for (size_t i = 0; i < in->n; i++) {
        qp *q = qp_of(links[i].pe->ipcq_state, links[i].dir);
        q->credit_delay = in->sys->credit_lat +
                          route_latency(in->ctx, q->peer, q->peer_rx_base, q->my_rx_base);
        q->tok_q = ring_holding(q->peer->ipcq_state, q->peer_rx_base);
        q->cred_q = sender_into(q->peer->ipcq_state, q->my_rx_base);
    }
    return 0;
}

/* rx rings must be disjoint, this install's and the earlier ones' (they come from allocators:
 * this guards the invariant the address matches rest on). */
static int check_disjoint(install *in)
{
    ipcq_sys *sys = in->sys;
    size_t total = in->n, k = 0;
    range *rs;
    char a[48], b[48];
    int rc = 0;

    for (size_t i = 0; i < sys->npes; i++)
        total += sys->pes[i]->nq;
    rs = malloc((total ? total : 1) * sizeof *rs);
    if (!rs)
        return kb_err_set(in->eb, KB_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < sys->npes; i++)
        for (uint32_t j = 0; j < sys->pes[i]->nq; j++) {
            const qp *q = &sys->pes[i]->q[j];
            rs[k++] = (range){ q->my_rx_base, (uint64_t)q->n_slots * q->slot_size,
                               sys->pes[i]->pe, q->dir };
        }
    for (size_t i = 0; i < in->n; i++) {
        const qp *q = qp_of(in->links[i].pe->ipcq_state, in->links[i].dir);
        rs[k++] = (range){ q->my_rx_base, (uint64_t)q->n_slots * q->slot_size, in->links[i].pe,
                           (int)in->links[i].dir };
    }
    assert(k == total);
    qsort(rs, k, sizeof *rs, range_cmp);
    for (size_t i = 1; i < k; i++) {
        if (rs[i].base < rs[i - 1].base + rs[i - 1].len) {
            fmt_pe(rs[i - 1].pe, a, sizeof a);
            fmt_pe(rs[i].pe, b, sizeof b);
            rc = kb_err_set(in->eb, KB_ERR_STATE, "IPCQ install: rx rings of %s %s and %s %s "
                            "overlap", a, DIRL(rs[i - 1].dir), b, DIRL(rs[i].dir));
            break;
        }
    }
    free(rs);
    return rc;
}

/* The new states join the system, which owns their block from here on. */
static int commit(install *in)
{
    ipcq_sys *sys = in->sys;
    if (sys->npes + in->npes > sys->cappes) {
        size_t cap = (sys->npes + in->npes) * 2;
        pe_state **np = realloc(sys->pes, cap * sizeof *np);
        if (!np)
            return kb_err_set(in->eb, KB_ERR_NOMEM, "out of memory");
        sys->pes = np;
        sys->cappes = cap;
    }
    for (size_t i = 0; i < in->npes; i++)
        sys->pes[sys->npes++] = in->states[i];
    sys->blocks[sys->nblocks++] = in->block; /* make_states made the room */
    in->block = NULL;
    return 0;
}

/*
 * Times the install messages host -> IO_CPU -> M_CPU -> PE_IPCQ and the acks aggregated back
 * per cube and per SIP, and blocks the calling fiber until the last ack (nothing to time
 * outside a fiber). The new PEs come SIP by SIP and cube by cube in first-link order.
 */
static void time_install(install *in)
{
    kb_sim *sim = kb_ctx_sim(in->ctx);
    kb_machine *m = kb_ctx_machine(in->ctx);
    kb_pe_hw **pes = in->pes;
    size_t npes = in->npes;

    if (!kb_fiber_current(sim))
        return;
    kb_time now = kb_sim_now(sim), t_done = now;
    for (size_t i = 0; i < npes;) {
        unsigned gsip = pes[i]->gsip;
        kb_time t_io = kb_machine_cmd_host_to_iocpu(m, gsip, now, KB_IPCQ_CMD_BYTES);
        kb_time t_sip = t_io;
        while (i < npes && pes[i]->gsip == gsip) {
            unsigned cube = pes[i]->cube;
            kb_time t_m = kb_machine_cmd_iocpu_to_mcpu(m, gsip, cube, t_io, KB_IPCQ_CMD_BYTES);
            kb_time t_cube = t_m;
            while (i < npes && pes[i]->gsip == gsip && pes[i]->cube == cube) {
                kb_time t = kb_machine_cmd_mcpu_to_pe(m, pes[i], t_m, KB_IPCQ_CMD_BYTES);
                t = kb_machine_cmd_pe_to_mcpu(m, pes[i], t + in->sys->ipcq_ovh,
                                              KB_IPCQ_CMD_BYTES);
                t_cube = t > t_cube ? t : t_cube;
                i++;
            }
            kb_time t = kb_machine_cmd_mcpu_to_iocpu(m, gsip, cube, t_cube, KB_IPCQ_CMD_BYTES);
            t_sip = t > t_sip ? t : t_sip;
        }
        kb_time t = kb_machine_cmd_iocpu_to_host(m, gsip, t_sip, KB_IPCQ_CMD_BYTES);
        t_done = t > t_done ? t : t_done;
    }
    if (t_done > now)
        kb_fiber_sleep(sim, t_done - now);
}

/* Undoes a failed install: its PEs are as they were before it (no state, nothing wired). */
static void rollback(install *in)
{
    for (size_t i = 0; i < in->npes; i++) {
        if (in->made_states) {
            free_pe_state(in->sys, in->states[i]);
        } else {
            assert(!in->pes[i]->ipcq_state);
            in->pes[i]->ipcq_wired = 0;
        }
    }
    free(in->block);
    in->block = NULL;
}

int kb_ipcq_install(kb_ctx *ctx, const kb_ipcq_cfg *cfg, const kb_ipcq_link *links, size_t n)
{
    install in = { .ctx = ctx, .eb = kb_ctx_err(ctx), .cfg = cfg, .links = links, .n = n };
    int rc = attach_sys(&in);

    if (rc != 0)
        return rc;
    in.pes = calloc(n ? n : 1, sizeof *in.pes);
    in.states = calloc(n ? n : 1, sizeof *in.states);
    if (!in.pes || !in.states) {
        rc = kb_err_set(in.eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = count_links(&in)) != 0 || (rc = make_states(&in)) != 0 ||
        (rc = check_fit(&in)) != 0 || (rc = alloc_rings(&in)) != 0 || (rc = pair_links(&in)) != 0 ||
        (rc = check_disjoint(&in)) != 0 || (rc = commit(&in)) != 0)
        goto out;
    time_install(&in);
out:
    if (rc != 0)
        rollback(&in);
    free(in.pes);
    free(in.states);
    free(in.pl);
    return rc;
}

/* ---- data path ---- */

static KB_NOINLINE void trace_line(FILE *f, kb_ctx *ctx, const char *what, const kb_pe_hw *pe,
                                   kb_dir d, uint64_t nbytes, uint64_t seq)
{
    fprintf(f, "ipcq t=%.3fns %s %s %lluB seq=%llu sip%u/cube%u/pe%u\n",
            kb_time_to_ns(kb_sim_now(kb_ctx_sim(ctx))), what, DIRL(d),
            (unsigned long long)nbytes, (unsigned long long)seq, pe->gsip, pe->cube, pe->pe);
}

static inline void trace(kb_ctx *ctx, const char *what, const kb_pe_hw *pe, kb_dir d,
                         uint64_t nbytes, uint64_t seq)
{
    if (kb_ctx_trace(ctx))
        trace_line(kb_ctx_trace(ctx), ctx, what, pe, d, nbytes, seq);
}

static KB_COLD void not_wired(kb_tl *tl, kb_dir d, const char *op)
{
    pe_state *ps = tl_pe(tl)->ipcq_state;
    char wired[200] = "";
    size_t len = 0;
    for (int i = 0; ps && i < KB_NDIRS; i++) {
        if (qp_of(ps, i)) {
            int w = snprintf(wired + len, sizeof wired - len, "%s%s", len ? " " : "", dir_names[i]);
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
    not_wired(tl, d, op);
    return NULL;
}

/*
 * Credits travel without events of their own: the receiver appends {arrival, seq} to the
 * sending queue pair (found by its peer_rx_base, as the protocol matches credits), and the
 * sender takes in those that have arrived whenever it looks at its counters (a send, the
 * deadlock dump, kb_ipcq_counters_of). A sender blocked on credits is woken at the next
 * arrival. The observable behaviour is the event-per-credit protocol's.
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


/* An IPCQ copy's operands and times, built by the caller only when records are wanted. */
typedef struct copy_desc {
    kb_opnd dst, src;
    kb_time t_start, t_end;
} copy_desc;

/* Records an IPCQ copy (out of line: timing-only runs never build a record). 0 or NOMEM. */
static KB_NOINLINE int record_copy(kb_ctx *ctx, uint32_t pe, const copy_desc *c, const char *name)
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

/* The records of a send and of a receive's copy-out (out of line: their descriptors would
 * otherwise sit in the hot frames). */
static KB_NOINLINE int record_send(kb_ctx *ctx, kb_tl *tl, kb_pa dst, const kb_val *v,
                                   kb_time t_start, kb_time t_end, const char *name)
{
    copy_desc c = { kb_opnd_make(dst, v->rows, v->cols, (kb_dtype)v->dtype),
                    kb_opnd_make(v->pa, v->rows, v->cols, (kb_dtype)v->dtype), t_start, t_end };
    return record_copy(ctx, tl_pe(tl)->gid, &c, name);
}

static KB_NOINLINE int record_recv(kb_ctx *ctx, const qp *q, const kb_ipcq_req *r, kb_pa slot,
                                   kb_time t_start, kb_time t_end, const char *name)
{
    copy_desc c = { kb_opnd_make(r->dst, r->rows, r->cols, r->dst_dt),
                    kb_opnd_make(slot, r->rows, r->cols, r->dt), t_start, t_end };
    return record_copy(ctx, q->rx_pe->gid, &c, name);
}

static KB_COLD void recv_size_mismatch(kb_ctx *ctx, qp *q, const kb_ipcq_req *r, uint64_t si)
{
    if (!kb_ctx_failed(ctx))
        kb_err_set(kb_ctx_err(ctx), KB_ERR_INVAL,
                   "kernel %s on sip%u/cube%u/pe%u: tl_recv %s expects %llu bytes but "
                   "message %llu from the peer has %llu", tl_kernel_name(r->tl),
                   q->rx_pe->gsip, q->rx_pe->cube, q->rx_pe->pe,
                   DIRL(q->dir), (unsigned long long)r->nbytes,
                   (unsigned long long)q->my_tail, (unsigned long long)q->slot_bytes[si]);
    kb_ctx_fail(ctx, KB_ERR_INVAL);
}

static KB_COLD void credit_fail(qp *q)
{
    kb_ctx *ctx = q->sys->ctx;
    kb_err_set(kb_ctx_err(ctx), KB_ERR_STATE, "IPCQ: a credit from sip%u/cube%u/pe%u %s found "
               "no sending queue", q->owner->pe->gsip, q->owner->pe->cube, q->owner->pe->pe,
               DIRL(q->dir));
    kb_ctx_fail(ctx, KB_ERR_STATE);
}

/*
 * Slot seq is free from t on (its credit reaches the sender then). Slots are credited in
 * order: on a queue pair that never had a view this is the credit itself, as it always was;
 * with no view held it is sent at once too; behind a held view it waits in cr_defer, and the release of the view sends every credit that is then known, each
 * no earlier than the one before it. 0, or the context has failed.
 */
static int credit_free(qp *q, uint64_t seq, kb_time t)
{
    kb_sim *sim = kb_ctx_sim(q->sys->ctx);
    if (!q->cr_defer) {
        if (credit_send(sim, q->cred_q, seq, t) != 0) {
            credit_fail(q);
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
        if (credit_send(sim, q->cred_q, q->cr_next, prev) != 0) {
            credit_fail(q);
            return -1;
        }
        q->cr_next++;
    }
    return 0;
}

/* Starts the copy-out of every posted receive whose data has arrived. */
static void progress(qp *q)
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
            recv_size_mismatch(ctx, q, r, si);
            return;
        }
        kb_time now = kb_sim_now(kb_ctx_sim(ctx)), t0 = r->t_post > now ? r->t_post : now;
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
                kb_fiber_wake_at(kb_ctx_sim(ctx), r->waiter, t0);
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
            kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory in an IPCQ receive");
            kb_ctx_fail(ctx, KB_ERR_NOMEM);
            return;
        }
        if (credit_free(q, r->seq, t_end + q->credit_delay) != 0)
            return;
        if (last && h->waiter)
            kb_fiber_wake_at(kb_ctx_sim(ctx), h->waiter, h->t_done);
    }
}

static void meta_arrive(kb_sim *sim, void *a, void *b)
{
    msg *m = a;
    qp *q = m->to;
    (void)sim;
    (void)b;
    assert(m->addr >= q->my_rx_base &&
           m->addr < q->my_rx_base + (uint64_t)q->rx_n_slots * q->rx_slot_size);
    q->slot_bytes[(m->addr - q->my_rx_base) / q->rx_slot_size] = (uint32_t)m->nbytes;
    q->peer_head_cache++;
    /* with backpressure a sender never gets more than n_slots ahead of the receiver */
    assert(!q->sys->cfg.backpressure || q->peer_head_cache - q->my_tail <= q->rx_n_slots);
    progress(q);
    msg_put(q->sys, m);
}

/* Why a send's DMA failed (the route was refused: recomputed with a message). */
static KB_COLD void send_route_fail(kb_tl *tl, kb_dir dir, kb_pa src, kb_pa dst)
{
    char op[16 + KB_DIR_LABEL_LEN];
    snprintf(op, sizeof op, "tl_send %s", DIRL(dir));
    kb_tl_dma_fail(tl, src, dst, op);
}

/* Elements of dtype dt per chunk: as many whole elements as one slot holds. */
static inline uint64_t chunk_elems(uint64_t slot_size, kb_dtype dt)
{
    return slot_size / kb_dtype_size(dt);
}

/* Blocks the sender until the queue pair has a free slot (with backpressure). */
static KB_ALWAYS_INLINE void wait_credit(kb_tl *tl, qp *q, ipcq_sys *sys, kb_dir dir)
{
    kb_sim *sim = kb_ctx_sim(tl_ctx(tl));
    credits_take(q, kb_sim_now(sim));
    while (sys->cfg.backpressure && q->my_head - q->peer_tail_cache >= (uint64_t)q->n_slots) {
        if (q->cr_n) { /* a credit is on its way: wait for it */
            kb_tl_wait_until(tl, q->cr_t[q->cr_head]);
        } else {
            q->cr_waiter = kb_fiber_current(sim);
            kb_fiber_block(sim, send_wait_names[name_ix(dir)], q);
        }
        credits_take(q, kb_sim_now(sim));
    }
    assert(!sys->cfg.backpressure || q->my_head - q->peer_tail_cache < q->n_slots);
}

/*
 * One chunk of a send: DMA `len` elements of v from element `off` into the next slot of the
 * peer's ring, issued at t_issue; its token reaches the receiver when the DMA ends. `last`:
 * the sender resumes then too (one queue entry for both). Returns the DMA's end.
 */
static KB_ALWAYS_INLINE kb_time send_chunk(kb_tl *tl, qp *q, ipcq_sys *sys, kb_dir dir,
                                           const kb_val *v, uint64_t off, uint64_t len,
                                           int whole, kb_time t_issue, int last)
{
    kb_ctx *ctx = tl_ctx(tl);
    size_t es = kb_dtype_size((kb_dtype)v->dtype);
    uint64_t nbytes = len * es;
    kb_pa src = v->pa + off * es;
    kb_time t_start, t_end;
    kb_pa dst = q->peer_rx_base + (q->my_head % (uint64_t)q->n_slots) * q->slot_size;
    uint64_t seq = q->my_head++;
    if (kb_machine_dma(kb_ctx_machine(ctx), tl_pe(tl), src, dst, nbytes, t_issue, &t_start,
                       &t_end, NULL) != 0)
        send_route_fail(tl, dir, src, dst);
    /* the token (and the sender, after the last chunk) goes no earlier than the one before */
    kb_time t_tok = t_end > q->tok_last ? t_end : q->tok_last;
    q->tok_last = t_tok;
    if (kb_ctx_records(ctx)) {
        /* a chunk of a longer message is a flat run of elements of the contiguous value */
        kb_val part = *v;
        part.pa = src;
        if (!whole) {
            part.rows = 1;
            part.cols = (uint32_t)len;
        }
        if (record_send(ctx, tl, dst, &part, t_start, t_end, send_names[name_ix(dir)]) != 0)
            tl_fail(tl, KB_ERR_NOMEM, "out of memory recording an op");
    }
    msg *m = msg_get(sys);
    if (!m)
        tl_fail(tl, KB_ERR_NOMEM, "out of memory");
    if (!q->tok_q)
        tl_fail(tl, KB_ERR_STATE, "tl_send %s: the peer has no ring at the destination",
                DIRL(dir));
    m->to = q->tok_q;
    m->addr = dst;
    m->seq = seq;
    m->nbytes = nbytes;
    sys->sends++;
    sys->dir_bytes[name_ix(dir)] += nbytes;
    trace(ctx, "send", tl_pe(tl), dir, nbytes, seq);
    if (last && t_tok > kb_sim_now(kb_ctx_sim(ctx))) {
        /* the token arrives when the DMA ends, which is also when the sender goes on: one
         * queue entry for both (kb_fiber_sleep_then keeps their order) */
        if (kb_fiber_sleep_then(kb_ctx_sim(ctx), t_tok, meta_arrive, m, NULL) != 0)
            tl_fail(tl, KB_ERR_STATE, "tl_send: cannot wait for the DMA");
    } else if (kb_sim_at(kb_ctx_sim(ctx), t_tok, meta_arrive, m, NULL) != 0) {
        tl_fail(tl, KB_ERR_NOMEM, "out of memory");
    }
    return t_tok;
}

/*
 * A message longer than a slot travels as slot-sized chunks through the credit window: the
 * IPCQ engine issues a chunk as soon as a slot is free (the first one after the call's issue
 * cost), so with n_slots > 1 chunk k+1 is in flight while the receiver copies out chunk k.
 * Returns when the last chunk's DMA has ended (the value may then be reused), or, `async`,
 * once the last chunk is issued, with the time its token lands.
 */
static kb_time send_msg(kb_tl *tl, kb_dir dir, kb_val v, int async, const char *op)
{
    qp *q = wired_qp(tl, dir, op);
    ipcq_sys *sys = sys_of(tl_ctx(tl)); /* not through q or the pe_state: other lines */
    kb_sim *sim = kb_ctx_sim(tl_ctx(tl));
    uint64_t n = (uint64_t)v.rows * v.cols;
    kb_time t_issue = 0, t_last = 0;

    if (!kb_val_contiguous(v))
        tl_fail(tl, KB_ERR_INVAL, "%s %s: the value is a strided view (row stride %u, %u "
                "columns); tl_copy it into a contiguous value first", op, DIRL(dir), v.ld,
                v.cols);
    sys->msgs++;
    if (n * kb_dtype_size((kb_dtype)v.dtype) <= q->slot_size) { /* the protocol as it was */
        wait_credit(tl, q, sys, dir);
        t_issue = kb_sim_now(sim) + kb_tl_issue_cost(tl) + sys->ipcq_ovh;
        if (!async)
            return send_chunk(tl, q, sys, dir, &v, 0, n, 1, t_issue, 1);
        t_last = send_chunk(tl, q, sys, dir, &v, 0, n, 1, t_issue, 0);
        kb_tl_wait_until(tl, t_issue);
        return t_last;
    }
    uint64_t per = chunk_elems(q->slot_size, (kb_dtype)v.dtype);
    for (uint64_t off = 0; off < n; off += per) {
        uint64_t len = n - off < per ? n - off : per;
        wait_credit(tl, q, sys, dir);
        kb_time now = kb_sim_now(sim);
        if (off == 0)
            t_issue = now + kb_tl_issue_cost(tl) + sys->ipcq_ovh;
        else if (now > t_issue)
            t_issue = now;
        t_last = send_chunk(tl, q, sys, dir, &v, off, len, 0, t_issue, 0);
    }
    kb_tl_wait_until(tl, async ? t_issue : t_last);
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
    r = req_get(sys);
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
    r->t_post = kb_sim_now(kb_ctx_sim(tl_ctx(tl))) + kb_tl_issue_cost(tl) + sys->ipcq_ovh;
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
            kb_ipcq_req *c = req_get(sys);
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
    progress(q);
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
    if (credit_free(q, q->cr_next, kb_sim_now(kb_ctx_sim(tl_ctx(tl))) + q->credit_delay) != 0)
        tl_fail(tl, KB_ERR_STATE, "tl_recv_release: %s", kb_ctx_err(tl_ctx(tl))->msg);
}

kb_ipcq_req *tl_recv_into_async(kb_tl *tl, kb_dir dir, kb_va va, kb_shape s, kb_dtype dt)
{
    return post(tl, dir, s, dt, 1, va, "tl_recv_into_async", 0, 0);
}

kb_val tl_wait(kb_tl *tl, kb_ipcq_req *r)
{
    ipcq_sys *sys;
    kb_val v;
    if (!r)
        tl_fail(tl, KB_ERR_INVAL, "tl_wait: no request");
    if (r->tl != tl)
        tl_fail(tl, KB_ERR_INVAL, "tl_wait: request belongs to another kernel");
    sys = r->q->sys;
    if (!r->done) {
        r->waiter = kb_fiber_current(kb_ctx_sim(tl_ctx(tl)));
        kb_fiber_block(kb_ctx_sim(tl_ctx(tl)), recv_names[name_ix(r->q->rx_dir)], r->q); /* woken at t_done */
    } else {
        kb_tl_wait_until(tl, r->t_done);
    }
    sys->recvs++;
    if (kb_ctx_trace(tl_ctx(tl))) {
        uint64_t bytes = 0; /* the whole message: its chunks' bytes */
        for (const kb_ipcq_req *c = r; c; c = c->sib)
            bytes += c->nbytes;
        trace(tl_ctx(tl), "recv", tl_pe(tl), r->q->rx_dir, bytes, r->seq);
    }
    v = r->val;
    while (r) { /* the message's chunk requests, head first */
        kb_ipcq_req *next = r->sib;
        req_put(sys, r);
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

void kb_ipcq_counts(kb_ctx *ctx, uint64_t *msgs, uint64_t *chunks)
{
    const ipcq_sys *sys = sys_of(ctx);
    *msgs = sys ? sys->msgs : 0;
    *chunks = sys ? sys->sends : 0;
}

uint64_t kb_ipcq_dir_bytes(kb_ctx *ctx, kb_dir dir)
{
    const ipcq_sys *sys = sys_of(ctx);
    return sys && (unsigned)dir < KB_NDIRS ? sys->dir_bytes[dir] : 0;
}

uint64_t kb_ipcq_peer_bytes(kb_ctx *ctx)
{
    const ipcq_sys *sys = sys_of(ctx);
    return sys ? sys->dir_bytes[KB_NDIRS] : 0;
}

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

kb_val tl_recv(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt)
{
    return tl_wait(tl, post(tl, dir, s, dt, 0, 0, "tl_recv", 1, 0));
}

void tl_recv_into(kb_tl *tl, kb_dir dir, kb_va va, kb_shape s, kb_dtype dt)
{
    tl_wait(tl, post(tl, dir, s, dt, 1, va, "tl_recv_into", 1, 0));
}
