/*
 * kb_ipcq_install — the IPCQ's wiring (part of the IPCQ, kb_ipcq.h; shared names in
 * kb_ipcq_int.h): a context's IPCQ system, made by its first install (later ones must repeat
 * its configuration) and destroyed with the context, and kb_ipcq_install, which checks the
 * links (directions, PEs installed before, directions twice), gives each new PE a state with a
 * queue pair per wired direction (one block per install), checks that the rings fit the ring
 * area, allocates them, pairs every link with its peer's reverse direction, resolves the
 * protocol's address matches (tok_q, cred_q), checks that all rx rings are disjoint, and times
 * the install messages and acks on the command path; a failure at any step leaves the PEs as
 * they were. Limits: one install per PE for the lifetime of a context; every install of a
 * context uses one IPCQ configuration.
 */
#include "kb_ipcq_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define KB_IPCQ_CMD_BYTES 64u

/* A PE new to an install gathers its named directions in its ipcq_wired; this bit marks one
 * that has met only peer directions so far (the install sorts those out by PE). */
#define PEER_MARK (UINT32_C(1) << 31)
#define NAMED_MASK ((UINT32_C(1) << KB_NDIRS) - 1u)
_Static_assert(KB_NDIRS < 31, "named directions and the peer mark share a 32-bit mask");

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
    for (int i = 0; sys->part && i < sys->nparts; i++)
        while (sys->part[i].chunks) {
            chunk *c = sys->part[i].chunks;
            sys->part[i].chunks = c->next;
            free(c);
        }
    free(sys->part);
    free(sys);
}

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
        sys->per_sip = kb_ctx_machine(in->ctx)->per_sip;
        sys->nparts = kb_ctx_machine(in->ctx)->nsips;
        sys->part = aligned_alloc(_Alignof(ipcq_part), (size_t)sys->nparts * sizeof *sys->part);
        if (!sys->part) {
            free(sys);
            return kb_err_set(in->eb, KB_ERR_NOMEM, "out of memory");
        }
        memset(sys->part, 0, (size_t)sys->nparts * sizeof *sys->part);
        kb_ctx_set_ext(in->ctx, KB_EXT_IPCQ, sys, sys_destroy);
        kb_ipcq_dist_attach(sys); /* a valid slot and two messages: cannot fail */
        kb_ctx_set_deadlock_dump(in->ctx, kb_ipcq_dump, sys);
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
                              "twice", a, kb_ipcq_dir_names[l->dir]);
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
        q->cr_event = q->parts = in->sys->per_sip && q->peer->gsip != links[i].pe->gsip;
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
