/*
 * kb_machine — builds the simulated hardware from the topology config and times data and
 * command movement over it (see kb_machine.h for the route rules and docs/timing-model.md
 * for the formulas). Everything is allocated at creation; timing calls allocate nothing.
 * Limits: one gateway cube (cube 0) per SIP for inter-SIP traffic; SIP grids for torus/mesh
 * topologies use the most square w x h factorisation of the SIP count; one router per PE.
 */
#include "kb_machine.h"


#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_wire.h"

#define KB_VA_BASE (UINT64_C(1) << 40)
#define KB_VA_SIZE (UINT64_C(1) << 46)

/* Zeroed arrays of structs holding kb_res, which is cache-line aligned (free with free()). */
static void *zalloc_lines(size_t n, size_t size)
{
    size_t bytes;
    void *p;
    if (n == 0 || size > SIZE_MAX / n)
        return NULL;
    bytes = (n * size + 63u) & ~(size_t)63u;
    p = aligned_alloc(64, bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

static void link_init(kb_res *r, const char *name, const kb_cfg_link *l)
{
    kb_res_init(r, name, l->bandwidth_gbps, kb_time_from_ns(l->latency_ns), 0);
}

static void cpu_init(kb_res *r, const char *name, double overhead_ns)
{
    kb_res_init(r, name, 0.0, 0, kb_time_from_ns(overhead_ns));
}

static int make_alloc(kb_alloc **out, const char *what, unsigned gsip, unsigned cube, int pe,
                      kb_pa base, uint64_t size, kb_errbuf *eb)
{
    char name[96];

    if (pe >= 0)
        snprintf(name, sizeof name, "%s sip%u/cube%u/pe%d", what, gsip, cube, pe);
    else
        snprintf(name, sizeof name, "%s sip%u/cube%u", what, gsip, cube);
    if (!kb_pa_valid(base))
        return kb_err_set(eb, KB_ERR_RANGE, "%s: base address outside the PhysAddr space", name);
    *out = kb_alloc_create(name, base, size);
    return *out ? 0 : kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating %s", name);
}

static int build_pe(kb_machine *m, kb_pe_hw *p, unsigned gsip, unsigned cube, unsigned pe,
                    kb_errbuf *eb)
{
    const kb_topo_cfg *c = &m->cfg;
    int rc;

    p->gsip = gsip;
    p->cube = cube;
    p->pe = (uint16_t)pe; /* pes per cube are a few */
    p->gid = (unsigned)(((int)gsip * m->ncubes + (int)cube) * m->npes + (int)pe);
    p->router = kb_machine_pe_router(m, pe);
    cpu_init(&p->cpu, "pe_cpu", c->pe_cpu_overhead_ns);
    p->ndma = (uint8_t)(c->dma_channels > 0 ? c->dma_channels : 1); /* at most 64 */
    p->dma = zalloc_lines((size_t)p->ndma, sizeof *p->dma);
    if (!p->dma)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the machine");
    for (int i = 0; i < p->ndma; i++) {
        kb_res_init(&p->dma[i], "pe_dma", c->dma_bandwidth_gbps, 0,
                    kb_time_from_ns(c->dma_setup_ns));
        /* a channel works through its transfers in issue order */
        kb_res_set_ordered(&p->dma[i]);
    }
    for (int i = p->ndma; i < KB_DMA_INL; i++)
        p->dma_free[i] = KB_TIME_MAX; /* no channel: never the one free first */
    p->dma_next = 0;
    for (int i = 0; i < KB_PE_NEXT_RES; i++)
        p->next_res[i] = &p->dma[0];
    p->next_way = NULL;
    /* rates in items/ns play the role of bytes/ns: a use of n elements (flops) takes n / rate */
    kb_res_init(&p->math, "pe_math", c->math_lanes_per_ns, 0, kb_time_from_ns(c->math_fixed_ns));
    kb_res_init(&p->gemm, "pe_gemm", c->gemm_flops_per_ns, 0, kb_time_from_ns(c->gemm_fixed_ns));
    link_init(&p->tcm_port, "tcm", &c->tcm);
    link_init(&p->hbm_port, "hbm", &c->hbm);
    link_init(&p->tcm_wr, "tcm", &c->tcm);
    link_init(&p->hbm_wr, "hbm", &c->hbm);
    rc = make_alloc(&p->hbm, "hbm slice", gsip, cube, (int)pe,
                    kb_pa_pe_hbm(gsip, cube, pe, 0, m->hbm_slice_bytes), m->hbm_slice_bytes, eb);
    if (rc == 0)
        rc = make_alloc(&p->tcm, "tcm", gsip, cube, (int)pe, kb_pa_pe_tcm(gsip, cube, pe, 0),
                        c->tcm_size_bytes - c->tcm_scheduler_reserved_bytes, eb);
    if (rc == 0)
        rc = make_alloc(&p->ipcq, "ipcq area", gsip, cube, (int)pe,
                        kb_pa_pe_ipcq(gsip, cube, pe, 0), c->ipcq_area_bytes, eb);
    if (rc == 0)
        rc = make_alloc(&p->scratch, "scratch", gsip, cube, (int)pe,
                        kb_pa_pe_scratch(gsip, cube, pe, 0), c->scratch_size_bytes, eb);
    return rc;
}

static void free_pe(kb_pe_hw *p)
{
    for (int i = 0; i < KB_ROUTE_MEMO_WAYS; i++)
        free(p->routes[i].far);
    free(p->dma);
    kb_alloc_destroy(p->hbm);
    kb_alloc_destroy(p->tcm);
    kb_alloc_destroy(p->ipcq);
    kb_alloc_destroy(p->scratch);
}

/* Most square factorisation n = w * h with w >= h. */
static void grid_dims(int n, int *w, int *h)
{
    int best = 1;
    for (int d = 1; d * d <= n; d++)
        if (n % d == 0)
            best = d;
    *h = best;
    *w = n / best;
}

static void sip_add_link(kb_machine *m, kb_sip_hw *s, int peer)
{
    assert(s->nlinks < 4 && peer >= 0 && peer < m->nsips); /* E, W, N, S at most */
    kb_sip_link *l = &s->links[s->nlinks++];
    l->peer = peer;
    link_init(&l->link, "inter_sip", &m->cfg.inter_sip);
    /* the switch sits on every inter-SIP hop: its overhead is latency */
    l->link.latency += kb_time_from_ns(m->cfg.switch_overhead_ns);
    l->link.part_end = 1; /* kb_machine_dma_first: a route's SIP part ends here */
}

static int build_sip_links(kb_machine *m, kb_errbuf *eb)
{
    int kind = kb_topo_sip_kind(&m->cfg);
    int n = m->nsips;
    int wrap = kind != KB_SIPTOPO_MESH_2D_NO_WRAP;

    if (kind < 0)
        return kb_err_set(eb, KB_ERR_CONFIG, "system.sips.topology: unknown topology '%s'",
                          m->cfg.sips_topology);
    m->sip_topo = (kb_sip_topo)kind;
    m->per_sip = kb_topo_switch_per_sip(&m->cfg);
    m->io_tree = strcmp(m->cfg.io_completions, "tree") == 0;
    if (m->sip_topo == KB_SIPTOPO_RING_1D) {
        m->sip_grid_w = n;
        m->sip_grid_h = 1;
    } else {
        grid_dims(n, &m->sip_grid_w, &m->sip_grid_h);
    }
    /* the grid holds every SIP once (the leaders' rings and chains rely on it) */
    assert(m->sip_grid_w * m->sip_grid_h == n);
    if (n == 1)
        return 0;
    int w = m->sip_grid_w, h = m->sip_grid_h;
    for (int i = 0; i < n; i++) {
        kb_sip_hw *s = &m->sips[i];
        int x = i % w, y = i / w;
        /* E, W, N, S in that order; a missing neighbour (no wrap / 1-wide) is skipped */
        if (w > 1 && (wrap || x + 1 < w))
            sip_add_link(m, s, y * w + (x + 1) % w);
        if (w > 1 && (wrap || x > 0))
            sip_add_link(m, s, y * w + (x + w - 1) % w);
        if (h > 1 && (wrap || y > 0))
            sip_add_link(m, s, ((y + h - 1) % h) * w + x);
        if (h > 1 && (wrap || y + 1 < h))
            sip_add_link(m, s, ((y + 1) % h) * w + x);
    }
    /* next-hop table by BFS from every source (deterministic link order) */
    m->sip_next = malloc((size_t)n * (size_t)n);
    int *queue = malloc(sizeof(int) * (size_t)n);
    if (!m->sip_next || !queue) {
        free(queue);
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory building SIP routes");
    }
    for (int src = 0; src < n; src++) {
        uint8_t *nh = &m->sip_next[(size_t)src * (size_t)n];
        memset(nh, 0xfe, (size_t)n);
        nh[src] = 0xff;
        int qh = 0, qt = 0;
        for (int li = 0; li < m->sips[src].nlinks; li++) {
            int p = m->sips[src].links[li].peer;
            if (nh[p] == 0xfe) {
                nh[p] = (uint8_t)li;
                queue[qt++] = p;
            }
        }
        while (qh < qt) {
            int u = queue[qh++];
            for (int li = 0; li < m->sips[u].nlinks; li++) {
                int p = m->sips[u].links[li].peer;
                if (nh[p] == 0xfe) {
                    nh[p] = nh[u];
                    queue[qt++] = p;
                }
            }
        }
        for (int d = 0; d < n; d++)
            assert(nh[d] != 0xfe); /* every topology built above is connected */
    }
    free(queue);
    return 0;
}

int kb_machine_create(const kb_topo_cfg *cfg, kb_machine **out, kb_errbuf *eb)
{
    kb_machine *m = calloc(1, sizeof *m);
    int rc = 0;

    *out = NULL;
    if (!m)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the machine");
    m->cfg = *cfg;
    m->nsips = cfg->sips_count;
    m->ncubes = kb_topo_cubes_per_sip(cfg);
    m->npes = kb_topo_pes_per_cube(cfg);
    m->mesh_w = cfg->cube_mesh_width;
    m->mesh_h = cfg->cube_mesh_height;
    m->hbm_slice_bytes = cfg->hbm_size_bytes / (uint64_t)m->npes;
    m->host_overhead = kb_time_from_ns(cfg->host_overhead_ns);
    m->noc = kb_topo_noc_kind(cfg);
    kb_topo_noc_dims(cfg, &m->noc_w, &m->noc_h);
    if (m->noc_w * m->noc_h != m->npes) { /* a config kb_config_validate would refuse */
        rc = kb_err_set(eb, KB_ERR_CONFIG, "cube.noc.width x height = %d x %d does not hold %d "
                        "PEs", m->noc_w, m->noc_h, m->npes);
        goto fail;
    }
    /* the UCIe links attach at the middle of the edge they face (rounded down) */
    m->noc_edge[KB_MESH_E] = ((m->noc_h - 1) / 2) * m->noc_w + m->noc_w - 1;
    m->noc_edge[KB_MESH_W] = ((m->noc_h - 1) / 2) * m->noc_w;
    m->noc_edge[KB_MESH_N] = (m->noc_w - 1) / 2;
    m->noc_edge[KB_MESH_S] = (m->noc_h - 1) * m->noc_w + (m->noc_w - 1) / 2;
    if (m->nsips < 1 || m->nsips > KB_MAX_GSIPS || m->ncubes < 1 || m->ncubes > KB_MAX_CUBES ||
        m->npes < 1 || m->npes > KB_MAX_PES) {
        rc = kb_err_set(eb, KB_ERR_RANGE,
                        "machine size out of range: %d SIPs (1..%d), %d cubes per SIP (1..%d), "
                        "%d PEs per cube (1..%d)",
                        m->nsips, KB_MAX_GSIPS, m->ncubes, KB_MAX_CUBES, m->npes, KB_MAX_PES);
        goto fail;
    }
    m->sips = zalloc_lines((size_t)m->nsips, sizeof *m->sips);
    m->pe_by_gid = calloc((size_t)m->nsips * (size_t)m->ncubes * (size_t)m->npes,
                          sizeof *m->pe_by_gid);
    if (!m->sips || !m->pe_by_gid) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the machine");
        goto fail;
    }
    for (int s = 0; s < m->nsips; s++) {
        kb_sip_hw *sip = &m->sips[s];
        sip->gsip = (unsigned)s;
        link_init(&sip->pcie, "pcie", &cfg->pcie);
        cpu_init(&sip->pcie_ep, "pcie_ep", cfg->pcie_ep_overhead_ns);
        cpu_init(&sip->io_cpu, "io_cpu", cfg->io_cpu_overhead_ns);
        sip->mmu = kb_mmu_create();
        sip->va = kb_alloc_create("virtual address space", KB_VA_BASE, KB_VA_SIZE);
        sip->cubes = zalloc_lines((size_t)m->ncubes, sizeof *sip->cubes);
        if (!sip->mmu || !sip->va || !sip->cubes) {
            rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the machine");
            goto fail;
        }
        for (int c = 0; c < m->ncubes; c++) {
            kb_cube_hw *cube = &sip->cubes[c];
            cube->gsip = (unsigned)s;
            cube->cube = (unsigned)c;
            cube->x = (unsigned)(c % m->mesh_w);
            cube->y = (unsigned)(c / m->mesh_w);
            cpu_init(&cube->m_cpu, "m_cpu", cfg->m_cpu_overhead_ns);
            link_init(&cube->noc, "noc", &cfg->noc);
            link_init(&cube->sram_port, "sram", &cfg->sram);
            link_init(&cube->sram_wr, "sram", &cfg->sram);
            if (m->noc != KB_NOC_BUS) {
                int nl = m->npes * (m->noc == KB_NOC_MESH ? 4 : 2);
                cube->noc_links = zalloc_lines((size_t)nl, sizeof *cube->noc_links);
                if (!cube->noc_links) {
                    rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the machine");
                    goto fail;
                }
                for (int i = 0; i < nl; i++)
                    link_init(&cube->noc_links[i], "noc", &cfg->noc);
                if (m->noc == KB_NOC_CROSSBAR) /* one traversal, one hop of latency: egress */
                    for (int i = 1; i < nl; i += 2)
                        cube->noc_links[i].latency = 0;
            }
            for (int d = 0; d < 4; d++)
                link_init(&cube->ucie_out[d], "ucie", &cfg->ucie);
            rc = make_alloc(&cube->sram, "sram", (unsigned)s, (unsigned)c, -1,
                            kb_pa_cube_sram((unsigned)s, (unsigned)c, 0), cfg->sram_size_bytes, eb);
            if (rc)
                goto fail;
            cube->pes = zalloc_lines((size_t)m->npes, sizeof *cube->pes);
            if (!cube->pes) {
                rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory creating the machine");
                goto fail;
            }
            for (int p = 0; p < m->npes; p++) {
                rc = build_pe(m, &cube->pes[p], (unsigned)s, (unsigned)c, (unsigned)p, eb);
                if (rc)
                    goto fail;
                m->pe_by_gid[cube->pes[p].gid] = &cube->pes[p];
            }
        }
    }
    rc = build_sip_links(m, eb);
    if (rc)
        goto fail;
    *out = m;
    return 0;
fail:
    kb_machine_destroy(m);
    return rc;
}

void kb_machine_destroy(kb_machine *m)
{
    if (!m)
        return;
    for (int s = 0; m->sips && s < m->nsips; s++) {
        kb_sip_hw *sip = &m->sips[s];
        for (int c = 0; sip->cubes && c < m->ncubes; c++) {
            kb_cube_hw *cube = &sip->cubes[c];
            for (int p = 0; cube->pes && p < m->npes; p++)
                free_pe(&cube->pes[p]);
            free(cube->pes);
            free(cube->noc_links);
            kb_alloc_destroy(cube->sram);
        }
        free(sip->cubes);
        kb_mmu_destroy(sip->mmu);
        kb_alloc_destroy(sip->va);
    }
    free(m->sips);
    free(m->pe_by_gid);
    free(m->sip_next);
    free(m);
}

/* Where an address lives: SIP, cube, PE (-1 for cube-level memories) and its port. */
int kb_machine_pe_router(const kb_machine *m, unsigned pe)
{
    int w = m->noc_w, y = (int)pe / w, x = (int)pe % w;
    assert((int)pe < m->noc_w * m->noc_h);
    return y * w + (y % 2 ? w - 1 - x : x); /* snake: odd rows run right to left */
}

/* Where an address lives: SIP, cube, PE (-1 for cube-level memories), its router and ports. */
typedef struct loc {
    unsigned gsip, cube;
    int pe;
    int pe_local;  /* in a PE's TCM ranges */
    int router;    /* the NoC router its port attaches to */
    kb_res *port;  /* read side (and the write side with bus) */
    kb_res *wport; /* write side */
} loc;

static KB_COLD int not_memory(kb_pa pa, kb_errbuf *eb)
{
    char buf[96];
    return kb_err_set(eb, KB_ERR_RANGE, "address %s is not memory of this machine",
                      kb_pa_format(pa, buf, sizeof buf));
}

static int locate(kb_machine *m, kb_pa pa, loc *l, kb_errbuf *eb)
{
    /* hot path: field extraction without kb_pa_decode's validation, which the slow path
     * (an error message) does */
    unsigned gsip = kb_pa_gsip(pa), cube = kb_pa_cube(pa);
    int duplex = m->noc != KB_NOC_BUS;

    if (pa > KB_PA_MAX || gsip >= (unsigned)m->nsips || cube >= (unsigned)m->ncubes)
        goto fail;
    l->gsip = gsip;
    l->cube = cube;
    kb_cube_hw *c = &m->sips[gsip].cubes[cube];
    if (kb_pa_is_hbm(pa)) {
        uint64_t pe = kb_pa_hbm_offset(pa) / m->hbm_slice_bytes;
        if (pe >= (uint64_t)m->npes)
            goto fail;
        l->pe = (int)pe;
        l->pe_local = 0;
        l->router = c->pes[pe].router;
        l->port = &c->pes[pe].hbm_port;
        l->wport = duplex ? &c->pes[pe].hbm_wr : l->port;
        return 0;
    }
    if ((pa >> 29) & 1u) /* ext bit: reserved */
        goto fail;
    switch (kb_pa_unit_of(pa)) {
    case KB_UNIT_PE: {
        unsigned pe = kb_pa_pe_of(pa);
        if (pe >= (unsigned)m->npes || ((pa & (KB_SUB_OFFSET_BYTES - 1)) >> 27) >= KB_PE_NRANGES)
            goto fail;
        l->pe = (int)pe;
        l->pe_local = 1;
        l->router = c->pes[pe].router;
        l->port = &c->pes[pe].tcm_port;
        l->wport = duplex ? &c->pes[pe].tcm_wr : l->port;
        return 0;
    }
    case KB_UNIT_SRAM:
        if (kb_pa_pe_of(pa) != 0)
            goto fail;
        l->pe = -1;
        l->pe_local = 0;
        l->router = 0;
        l->port = &c->sram_port;
        l->wport = duplex ? &c->sram_wr : l->port;
        return 0;
    default:
        break;
    }
fail:
    return not_memory(pa, eb);
}

kb_res *kb_machine_port(kb_machine *m, kb_pa pa, kb_errbuf *eb)
{
    loc l;
    return locate(m, pa, &l, eb) == 0 ? l.port : NULL;
}

typedef struct route {
    kb_res **path;
    int n, max;
} route;

static int add(route *r, kb_res *res)
{
    for (int i = 0; i < r->n; i++)
        if (r->path[i] == res)
            return 0;
    if (r->n >= r->max)
        return -1;
    r->path[r->n++] = res;
    return 0;
}

/* UCIe egress links of the XY route cube a -> cube b inside one SIP (the bus model). */
static int add_xy(kb_machine *m, route *r, kb_sip_hw *sip, unsigned a, unsigned b)
{
    int x = (int)(a % (unsigned)m->mesh_w), y = (int)(a / (unsigned)m->mesh_w);
    int bx = (int)(b % (unsigned)m->mesh_w), by = (int)(b / (unsigned)m->mesh_w);
    assert(a < (unsigned)m->ncubes && b < (unsigned)m->ncubes); /* the walk stays in the mesh */
    while (x != bx) {
        int d = bx > x ? KB_MESH_E : KB_MESH_W;
        if (add(r, &sip->cubes[y * m->mesh_w + x].ucie_out[d]))
            return -1;
        x += bx > x ? 1 : -1;
    }
    while (y != by) {
        int d = by > y ? KB_MESH_S : KB_MESH_N;
        if (add(r, &sip->cubes[y * m->mesh_w + x].ucie_out[d]))
            return -1;
        y += by > y ? 1 : -1;
    }
    return 0;
}

static int add_sips(kb_machine *m, route *r, unsigned a, unsigned b)
{
    while (a != b) {
        uint8_t li = m->sip_next[(size_t)a * (size_t)m->nsips + b];
        assert(li < m->sips[a].nlinks); /* the SIPs are connected: every next hop is a link */
        kb_sip_link *l = &m->sips[a].links[li];
        if (add(r, &l->link))
            return -1;
        a = (unsigned)l->peer;
    }
    return 0;
}

/* Cube-to-cube part of a bus route, possibly across SIPs through the gateway cubes. */
static int add_between(kb_machine *m, route *r, unsigned sa, unsigned ca, unsigned sb,
                       unsigned cb)
{
    if (sa == sb)
        return add_xy(m, r, &m->sips[sa], ca, cb);
    if (add_xy(m, r, &m->sips[sa], ca, 0) || add_sips(m, r, sa, sb) ||
        add_xy(m, r, &m->sips[sb], 0, cb))
        return -1;
    return 0;
}

/* NoC links of one cube from router a to router b (mesh: XY; crossbar: out, in). */
static int add_noc(kb_machine *m, route *r, kb_cube_hw *c, int a, int b)
{
    if (a == b)
        return 0;
    assert(a >= 0 && a < m->npes && b >= 0 && b < m->npes); /* routers, one per PE */
    if (m->noc == KB_NOC_CROSSBAR)
        return add(r, &c->noc_links[a * 2]) || add(r, &c->noc_links[b * 2 + 1]) ? -1 : 0;
    int w = m->noc_w, x = a % w, y = a / w, bx = b % w, by = b / w;
    while (x != bx) {
        int d = bx > x ? KB_MESH_E : KB_MESH_W;
        if (add(r, &c->noc_links[(y * w + x) * 4 + d]))
            return -1;
        x += bx > x ? 1 : -1;
    }
    while (y != by) {
        int d = by > y ? KB_MESH_S : KB_MESH_N;
        if (add(r, &c->noc_links[(y * w + x) * 4 + d]))
            return -1;
        y += by > y ? 1 : -1;
    }
    return 0;
}

static int opposite(int d) { return d ^ 1; } /* E<->W, N<->S */

/*
 * Network part of a route inside one SIP: router ra of cube a to router rb of cube b. Between
 * cubes the XY cube route is taken; in every cube on it the data cross the NoC from where they
 * entered (or started) to the edge router of the next UCIe link (or the end).
 */
static int add_path(kb_machine *m, route *r, kb_sip_hw *sip, unsigned a, int ra, unsigned b,
                    int rb)
{
    int x = (int)(a % (unsigned)m->mesh_w), y = (int)(a / (unsigned)m->mesh_w);
    int bx = (int)(b % (unsigned)m->mesh_w), by = (int)(b / (unsigned)m->mesh_w);
    assert(a < (unsigned)m->ncubes && b < (unsigned)m->ncubes);
    while (x != bx || y != by) {
        int d = x != bx ? (bx > x ? KB_MESH_E : KB_MESH_W) : (by > y ? KB_MESH_S : KB_MESH_N);
        kb_cube_hw *c = &sip->cubes[y * m->mesh_w + x];
        if (add_noc(m, r, c, ra, m->noc_edge[d]) || add(r, &c->ucie_out[d]))
            return -1;
        x += d == KB_MESH_E ? 1 : d == KB_MESH_W ? -1 : 0;
        y += d == KB_MESH_S ? 1 : d == KB_MESH_N ? -1 : 0;
        ra = m->noc_edge[opposite(d)];
    }
    return add_noc(m, r, &sip->cubes[b], ra, rb);
}

/* Network part between any two routers of the machine: across SIPs through the hubs of the
 * gateway cubes. */
static int add_net(kb_machine *m, route *r, unsigned sa, unsigned ca, int ra, unsigned sb,
                   unsigned cb, int rb)
{
    if (sa == sb)
        return add_path(m, r, &m->sips[sa], ca, ra, cb, rb);
    if (add_path(m, r, &m->sips[sa], ca, ra, 0, 0) || add_sips(m, r, sa, sb) ||
        add_path(m, r, &m->sips[sb], 0, 0, cb, rb))
        return -1;
    return 0;
}

/* The route of the bus model (kept exactly as it was before the NoC became a network). */
static int build_route_bus(kb_machine *m, const kb_pe_hw *issuer, const loc *ls, const loc *ld,
                           int has_dst, route *r)
{
    if (issuer) {
        int local = ls->pe_local && ld->pe_local && ls->gsip == issuer->gsip &&
                    ld->gsip == issuer->gsip && ls->cube == issuer->cube &&
                    ld->cube == issuer->cube && ls->pe == (int)issuer->pe &&
                    ld->pe == (int)issuer->pe;
        kb_cube_hw *cs = &m->sips[ls->gsip].cubes[ls->cube];
        kb_cube_hw *cd = &m->sips[ld->gsip].cubes[ld->cube];
        if (add(r, &issuer->dma[0]) || add(r, ls->port))
            return -1;
        if (!local) {
            if (add(r, &cs->noc) ||
                add_between(m, r, ls->gsip, ls->cube, ld->gsip, ld->cube) || add(r, &cd->noc))
                return -1;
        }
        return add(r, ld->port);
    }
    if (has_dst) { /* host write: PCIe into the SIP's gateway cube, then to the memory */
        kb_sip_hw *sip = &m->sips[ld->gsip];
        return add(r, &sip->pcie) || add(r, &sip->pcie_ep) || add_xy(m, r, sip, 0, ld->cube) ||
               add(r, &sip->cubes[ld->cube].noc) || add(r, ld->port) ? -1 : 0;
    }
    kb_sip_hw *sip = &m->sips[ls->gsip]; /* host read */
    return add(r, ls->port) || add(r, &sip->cubes[ls->cube].noc) ||
           add_xy(m, r, sip, ls->cube, 0) || add(r, &sip->pcie_ep) || add(r, &sip->pcie) ? -1 : 0;
}

/* The route between two located addresses (has_src/has_dst: which of them exist). */
static int build_route(kb_machine *m, const kb_pe_hw *issuer, const loc *ls, const loc *ld,
                       int has_src, int has_dst, kb_res **path, int max, kb_errbuf *eb)
{
    route r = { path, 0, max };
    int rc;

    (void)has_src;
    if (m->noc == KB_NOC_BUS) {
        rc = build_route_bus(m, issuer, ls, ld, has_dst, &r);
    } else if (issuer) {
        /* the engine (its first channel: kb_machine_dma takes the one free first), the read
         * side of the source, the network, the write side of the destination */
        rc = add(&r, &issuer->dma[0]) || add(&r, ls->port) ||
             add_net(m, &r, ls->gsip, ls->cube, ls->router, ld->gsip, ld->cube, ld->router) ||
             add(&r, ld->wport);
    } else if (has_dst) { /* host write: PCIe into the gateway cube's hub, then the memory */
        kb_sip_hw *sip = &m->sips[ld->gsip];
        rc = add(&r, &sip->pcie) || add(&r, &sip->pcie_ep) ||
             add_path(m, &r, sip, 0, 0, ld->cube, ld->router) || add(&r, ld->wport);
    } else { /* host read */
        kb_sip_hw *sip = &m->sips[ls->gsip];
        rc = add(&r, ls->port) || add_path(m, &r, sip, ls->cube, ls->router, 0, 0) ||
             add(&r, &sip->pcie_ep) || add(&r, &sip->pcie);
    }
    if (rc)
        return kb_err_set(eb, KB_ERR_RANGE, "route longer than %d resources", max);
    return r.n;
}

/* Locates both ends (each may be KB_PA_INVALID_ADDR for the host side). */
static int locate_ends(kb_machine *m, const kb_pe_hw *issuer, kb_pa pa_src, kb_pa pa_dst,
                       loc *ls, loc *ld, kb_errbuf *eb)
{
    int has_src = pa_src != KB_PA_INVALID_ADDR, has_dst = pa_dst != KB_PA_INVALID_ADDR;
    int rc;

    if ((!has_src && !has_dst) || (issuer && (!has_src || !has_dst)))
        return kb_err_set(eb, KB_ERR_INVAL, "a DMA needs a source and a destination address");
    if (has_src && (rc = locate(m, pa_src, ls, eb)) != 0)
        return rc;
    if (has_dst && (rc = locate(m, pa_dst, ld, eb)) != 0)
        return rc;
    return 0;
}

int kb_machine_route(kb_machine *m, const kb_pe_hw *issuer, kb_pa pa_src, kb_pa pa_dst,
                     kb_res **path, int max, kb_errbuf *eb)
{
    loc ls, ld;
    int rc = locate_ends(m, issuer, pa_src, pa_dst, &ls, &ld, eb);

    if (rc)
        return rc;
    return build_route(m, issuer, &ls, &ld, pa_src != KB_PA_INVALID_ADDR,
                       pa_dst != KB_PA_INVALID_ADDR, path, max, eb);
}

void kb_machine_observe(kb_machine *m, kb_res_observer_fn fn, void *ud)
{
    m->res_observer = fn;
    m->res_observer_ud = fn ? ud : NULL;
}

/* After pe's channels' mirrors moved: the channel a transfer takes now (kb_machine_dma_channel;
 * the unused mirrors hold KB_TIME_MAX), which a kernel's hints name too. */
static KB_ALWAYS_INLINE void dma_next_set(kb_pe_hw *pe)
{
    int best = 0;
    for (int i = 1; i < KB_DMA_INL; i++)
        best = pe->dma_free[i] < pe->dma_free[best] ? i : best;
    pe->dma_next = (uint8_t)best;
    pe->next_res[0] = &pe->dma[best];
}

/* kb_machine_dma's tail: reserve the route (whose first resource is one of issuer's channels
 * when issuer is not NULL: its mirror follows), and tell the observer when one is attached. */
static KB_ALWAYS_INLINE void reserve_path(kb_machine *m, kb_pe_hw *issuer, kb_res *const *path,
                                          int n, kb_time now, uint64_t nbytes, kb_time *t_start,
                                          kb_time *t_end)
{
    *t_end = kb_res_path_reserve(path, n, now, nbytes, t_start);
    assert(*t_start >= now && *t_end >= *t_start);
    assert(!issuer || (path[0] >= issuer->dma && path[0] < issuer->dma + issuer->ndma));
    if (issuer && issuer->ndma <= KB_DMA_INL) {
        issuer->dma_free[path[0] - issuer->dma] = path[0]->free_at;
        dma_next_set(issuer);
    }
    if (m->res_observer)
        for (int i = 0; i < n; i++)
            m->res_observer(m->res_observer_ud, path[i], *t_start,
                            *t_start + kb_res_occupancy(path[i], nbytes), nbytes);
}

/*
 * Route memo keys. An address in some PE's TCM ranges is keyed by its bits above the range
 * offset (pa >> 27, tagged): they name the PE and the range, hence the ports, so a hit needs
 * no locate (and the address was validated when the entry was made); one in a PE's HBM slice
 * by its SIP, cube and slice (hbm_key, tagged). Any other end (SRAM) is keyed by its (read)
 * port, found by locate. A remembered route's first resource is the engine's
 * first channel; the DMA puts the channel it takes there.
 */
#define KB_KEY_TCM_ (UINT64_C(1) << 63)
#define KB_KEY_HBM_ (UINT64_C(1) << 62)

static int tcm_shaped(kb_pa pa)
{
    return !kb_pa_is_hbm(pa) && kb_pa_unit_of(pa) == KB_UNIT_PE && !((pa >> 29) & 1u) &&
           ((pa & (KB_SUB_OFFSET_BYTES - 1)) >> 27) < KB_PE_NRANGES && pa <= KB_PA_MAX;
}

/* An address in some PE's HBM slice is keyed by its SIP, cube and slice (locate's port for
 * it, named without reading the machine's tables); 0 for any other address. */
static uint64_t hbm_key(const kb_machine *m, kb_pa pa)
{
    unsigned gsip = kb_pa_gsip(pa), cube = kb_pa_cube(pa);
    if (!kb_pa_is_hbm(pa) || pa > KB_PA_MAX || gsip >= (unsigned)m->nsips ||
        cube >= (unsigned)m->ncubes)
        return 0;
    uint64_t slice = kb_pa_hbm_offset(pa) / m->hbm_slice_bytes;
    if (slice >= (uint64_t)m->npes)
        return 0;
    return KB_KEY_HBM_ | (uint64_t)gsip << 40 | (uint64_t)cube << 20 | slice;
}

/* pa's memo key; port: its port where the caller has located it, else NULL (found here, for
 * an end that is neither TCM- nor HBM-shaped). 0: not memory of this machine. */
static uint64_t route_key(kb_machine *m, kb_pa pa, const kb_res *port)
{
    uint64_t k;
    loc l;
    if (tcm_shaped(pa))
        return (pa >> 27) | KB_KEY_TCM_;
    if ((k = hbm_key(m, pa)) != 0)
        return k;
    if (!port)
        port = locate(m, pa, &l, NULL) == 0 ? l.port : NULL;
    return (uint64_t)(uintptr_t)port;
}

/*
 * A DMA whose route is not in the issuer's memo (or issued by the host), and refused ones:
 * locates both ends, builds the route, remembers it if short enough, reserves it. Kept out of
 * line so that the route buffer and the ends' locs are not part of the hot path's stack frame
 * (a memo hit runs at the bottom of a kernel fiber's calls, on lines cold at every resume).
 */
/* A kernel's DMA out of its SIP in a launch forked over the SIPs: refused, for the SIP it
 * would book is another thread's. */
static KB_COLD int sip_bound_fail(const kb_machine *m, const kb_pe_hw *issuer, kb_pa src,
                                  kb_pa dst, kb_errbuf *eb)
{
    (void)m;
    return kb_err_set(eb, KB_ERR_RANGE, "a DMA from sip%u to sip%u issued on sip%u: in a launch "
                      "run over SIP partitions (Phase-1 threads) a kernel reaches other SIPs "
                      "only through IPCQ sends; run with one thread (no --threads)",
                      kb_pa_gsip(src), kb_pa_gsip(dst), issuer->gsip);
}

static KB_NOINLINE int dma_slow(kb_machine *m, kb_pe_hw *issuer, kb_pa pa_src, kb_pa pa_dst,
                                uint64_t nbytes, kb_time now, kb_time *t_start, kb_time *t_end,
                                kb_errbuf *eb)
{
    int has_src = pa_src != KB_PA_INVALID_ADDR, has_dst = pa_dst != KB_PA_INVALID_ADDR;
    kb_res *buf[KB_MAX_ROUTE];
    loc l_src, l_dst;
    const loc *ls = &l_src, *ld = &l_dst;
    int rc = locate_ends(m, issuer, pa_src, pa_dst, &l_src, &l_dst, eb);
    if (rc)
        return rc;

    /* bound to its SIP, a PE meets every route here (kb_machine_bind_sips emptied the memos),
     * and this keeps the other SIPs out */
    if (issuer && m->sip_bound && (ls->gsip != issuer->gsip || ld->gsip != issuer->gsip))
        return sip_bound_fail(m, issuer, pa_src, pa_dst, eb);
    int n = build_route(m, issuer, ls, ld, has_src, has_dst, buf, KB_MAX_ROUTE, eb);
    if (n < 0)
        return n;
    if (issuer && n <= KB_ROUTE_MEMO_MAX) {
        unsigned i = issuer->route_next++ % KB_ROUTE_MEMO_WAYS;
        kb_route_way *w = &issuer->routes[i];
        if (n > KB_ROUTE_MEMO_LEN && w->far_cap < n) { /* a buffer for it, or no memo */
            kb_res **f = realloc(w->far, (size_t)n * sizeof *f);
            if (f) {
                w->far = f;
                w->far_cap = n;
            }
        }
        if (n <= KB_ROUTE_MEMO_LEN || w->far_cap >= n) {
            issuer->route_src[i] = route_key(m, pa_src, ls->port);
            issuer->route_dst[i] = route_key(m, pa_dst, ld->port);
            w->n = n;
            memcpy(kb_route_way_path(w), buf, (size_t)n * sizeof *buf);
            if (issuer->next_way == w)
                issuer->next_way = NULL; /* another route in it: the next hit names that */
        }
    }
    /* a PE's route starts at its engine's first channel: the DMA swaps in the one it takes */
    assert(!issuer || (n >= 1 && buf[0] == &issuer->dma[0]));
    if (issuer)
        buf[0] = kb_machine_dma_channel(issuer);
    reserve_path(m, issuer, buf, n, now, nbytes, t_start, t_end);
    return 0;
}

/* Whether pa is in the TCM ranges of pe (what locate would map to pe->tcm_port). */
static int in_own_tcm(const kb_pe_hw *pe, kb_pa pa)
{
    return kb_pa_in_pe_window(pa, kb_pa_pe_window(pe->gsip, pe->cube, pe->pe)) &&
           ((pa & (KB_SUB_OFFSET_BYTES - 1)) >> 27) < KB_PE_NRANGES;
}

int kb_machine_dma(kb_machine *m, kb_pe_hw *issuer, kb_pa pa_src, kb_pa pa_dst, uint64_t nbytes,
                   kb_time now, kb_time *t_start, kb_time *t_end, kb_errbuf *eb)
{
    if (issuer) {
        if (in_own_tcm(issuer, pa_src) && in_own_tcm(issuer, pa_dst)) {
            /* a copy inside the issuer's own TCM: no lookups (the TCM's read and write sides;
             * one port for both with bus) */
            kb_res *const local[3] = { kb_machine_dma_channel(issuer), &issuer->tcm_port,
                                       &issuer->tcm_wr };
            reserve_path(m, issuer, local, m->noc == KB_NOC_BUS ? 2 : 3, now, nbytes, t_start,
                         t_end);
            return 0;
        }
        uint64_t ks = route_key(m, pa_src, NULL), kd = route_key(m, pa_dst, NULL);
        for (int i = 0; ks && kd && i < KB_ROUTE_MEMO_WAYS; i++) {
            kb_route_way *w = &issuer->routes[i];
            if (issuer->route_src[i] == ks && issuer->route_dst[i] == kd && w->n > 0) {
                kb_res **path = kb_route_way_path(w);
                path[0] = kb_machine_dma_channel(issuer);
                reserve_path(m, issuer, path, w->n, now, nbytes, t_start, t_end);
                if (issuer->next_way != w) {
                    int n = w->n; /* the engine, two ends and what joins them */
                    issuer->next_res[1] = path[n > 1 ? 1 : 0];
                    issuer->next_res[2] = path[n > 2 ? n - 2 : 0];
                    issuer->next_res[3] = path[n - 1];
                    issuer->next_way = w;
                }
                return 0;
            }
        }
    }
    /* errors, routes not in the memo, host transfers */
    return dma_slow(m, issuer, pa_src, pa_dst, nbytes, now, t_start, t_end, eb);
}

void kb_machine_bind_sips(kb_machine *m, int on)
{
    m->sip_bound = on;
    if (!on)
        return;
    /* a remembered route may cross SIPs: forget them all (the memo is a cache, its routes are
     * built again the same) */
    for (int s = 0; s < m->nsips; s++)
        for (int c = 0; c < m->ncubes; c++)
            for (int p = 0; p < m->npes; p++) {
                kb_pe_hw *pe = &m->sips[s].cubes[c].pes[p];
                for (int i = 0; i < KB_ROUTE_MEMO_WAYS; i++) {
                    pe->routes[i].n = 0;
                    pe->route_src[i] = pe->route_dst[i] = 0;
                }
                pe->next_way = NULL;
            }
}

/* ---- DMA by parts (system.switch.arbitration per_sip) ---- */

static kb_time lat_sum(kb_res *const *path, int n)
{
    kb_time l = 0;
    for (int i = 0; i < n; i++)
        l += path[i]->latency;
    return l;
}

/* Books path[0, n) at now as the leg's next part: the tail leaves it no earlier than it came
 * in (the previous part's tail + this part's latency); moves the head on. */
static void book_part(kb_machine *m, kb_pe_hw *issuer, kb_dma_leg *leg, kb_res *const *path,
                      int n, kb_time now)
{
    kb_time ts, te, lat = lat_sum(path, n);
    reserve_path(m, issuer, path, n, now, leg->nbytes, &ts, &te);
    leg->t_end = leg->part == 0 || te > leg->t_end + lat ? te : leg->t_end + lat;
    leg->t_start = ts;
    leg->t_head = ts + lat;
    leg->part++;
}

/* Books the first part of a route that leaves the issuing SIP and notes where the data go
 * (out of line: the route buffer stays off the fibers' hot frames). */
static KB_NOINLINE int dma_first_parts(kb_machine *m, kb_pe_hw *issuer, const loc *ls,
                                       const loc *ld, uint64_t nbytes, kb_time now,
                                       kb_dma_leg *leg, kb_errbuf *eb)
{
    kb_res *buf[KB_MAX_ROUTE];
    int n = build_route(m, issuer, ls, ld, 1, 1, buf, KB_MAX_ROUTE, eb), c = 0;
    if (n < 0)
        return n;
    buf[0] = kb_machine_dma_channel(issuer);
    while (c < n && !buf[c]->part_end)
        c++;
    /* a route between SIPs crosses a link and ends in the destination SIP */
    assert(c < n - 1 && buf[c] == &m->sips[ls->gsip].links[m->sip_next[(size_t)ls->gsip *
                                                            (size_t)m->nsips + ld->gsip]].link);
    leg->nbytes = nbytes;
    leg->part = 0;
    leg->nparts = kb_machine_sip_hops(m, ls->gsip, ld->gsip) + 1;
    leg->at = m->sips[ls->gsip].links[m->sip_next[(size_t)ls->gsip * (size_t)m->nsips +
                                                  ld->gsip]].peer;
    leg->dst_sip = ld->gsip;
    leg->dst_cube = ld->cube;
    leg->dst_router = ld->router;
    leg->dst_port = m->noc == KB_NOC_BUS ? ld->port : ld->wport;
    book_part(m, issuer, leg, buf, c + 1, now); /* the first part: from a channel */
    return 0;
}

int kb_machine_dma_first(kb_machine *m, kb_pe_hw *issuer, kb_pa pa_src, kb_pa pa_dst,
                         uint64_t nbytes, kb_time now, kb_dma_leg *leg, kb_errbuf *eb)
{
    loc ls, ld;
    int rc;

    leg->part = leg->nparts = 0;
    /* both ends in the issuer's SIP (the address says which SIP): the route memo's path */
    if (m->per_sip && issuer &&
        (kb_pa_gsip(pa_src) != issuer->gsip || kb_pa_gsip(pa_dst) != issuer->gsip)) {
        if ((rc = locate_ends(m, issuer, pa_src, pa_dst, &ls, &ld, eb)) != 0)
            return rc;
        /* from the issuer's SIP into another (a read of another SIP's memory is booked
         * whole: its first part would be that SIP's) */
        if (ls.gsip == issuer->gsip && ld.gsip != ls.gsip)
            return dma_first_parts(m, issuer, &ls, &ld, nbytes, now, leg, eb);
    }
    return kb_machine_dma(m, issuer, pa_src, pa_dst, nbytes, now, &leg->t_start, &leg->t_end,
                          eb);
}

void kb_machine_dma_next(kb_machine *m, kb_dma_leg *leg, kb_time now)
{
    kb_sip_hw *sip = &m->sips[leg->at];
    kb_res *buf[KB_MAX_ROUTE];

    assert(kb_dma_leg_more(leg) && now >= leg->t_head);
    if ((unsigned)leg->at != leg->dst_sip) { /* passing through: the SIP's egress link */
        kb_sip_link *l = &sip->links[m->sip_next[(size_t)leg->at * (size_t)m->nsips +
                                                 leg->dst_sip]];
        kb_res *link = &l->link;
        book_part(m, NULL, leg, &link, 1, now);
        leg->at = l->peer;
        return;
    }
    /* the destination SIP's part: the same resources as the suffix of build_route's route */
    route r = { buf, 0, KB_MAX_ROUTE };
    int rc = m->noc == KB_NOC_BUS
                 ? add_xy(m, &r, sip, 0, leg->dst_cube) ||
                       add(&r, &sip->cubes[leg->dst_cube].noc) || add(&r, leg->dst_port)
                 : add_path(m, &r, sip, 0, 0, leg->dst_cube, leg->dst_router) ||
                       add(&r, leg->dst_port);
    assert(rc == 0 && r.n > 0); /* shorter than the whole route, which was built */
    (void)rc;
    book_part(m, NULL, leg, buf, r.n, now);
    assert(!kb_dma_leg_more(leg));
}

/* ---- command path ---- */

/* Store-and-forward hops of a command message over the network from router ra of cube a to
 * router rb of cube b (one SIP); with bus, the UCIe links of the XY route only. */
static kb_time cmd_hops(kb_machine *m, kb_sip_hw *sip, unsigned a, int ra, unsigned b, int rb,
                        kb_time t, uint64_t bytes)
{
    kb_res *path[KB_MAX_ROUTE];
    route r = { path, 0, KB_MAX_ROUTE };
    int rc = m->noc == KB_NOC_BUS ? add_xy(m, &r, sip, a, b) : add_path(m, &r, sip, a, ra, b, rb);
    assert(rc == 0);
    (void)rc;
    for (int i = 0; i < r.n; i++)
        t = kb_res_hop(path[i], t, bytes);
    return t;
}

kb_time kb_machine_cmd_host_to_iocpu(kb_machine *m, unsigned gsip, kb_time t, uint64_t bytes)
{
    kb_sip_hw *sip = &m->sips[gsip];
    t = kb_res_hop(&sip->pcie, t + m->host_overhead, bytes);
    t = kb_res_hop(&sip->pcie_ep, t, bytes);
    return kb_res_hop(&sip->io_cpu, t, bytes);
}

kb_time kb_machine_cmd_at_iocpu(kb_machine *m, unsigned gsip, kb_time t, uint64_t bytes)
{
    return kb_res_hop(&m->sips[gsip].io_cpu, t, bytes);
}

kb_time kb_machine_cmd_iocpu_to_mcpu(kb_machine *m, unsigned gsip, unsigned cube, kb_time t,
                                     uint64_t bytes)
{
    kb_sip_hw *sip = &m->sips[gsip];
    t = cmd_hops(m, sip, 0, 0, cube, 0, t, bytes);
    return kb_res_hop(&sip->cubes[cube].m_cpu, t, bytes);
}

kb_time kb_machine_cmd_mcpu_to_pe(kb_machine *m, kb_pe_hw *pe, kb_time t, uint64_t bytes)
{
    kb_sip_hw *sip = &m->sips[pe->gsip];
    if (m->noc == KB_NOC_BUS)
        t = kb_res_hop(&sip->cubes[pe->cube].noc, t, bytes);
    else
        t = cmd_hops(m, sip, pe->cube, 0, pe->cube, pe->router, t, bytes);
    return kb_res_hop(&pe->cpu, t, bytes);
}

kb_time kb_machine_cmd_pe_to_mcpu(kb_machine *m, kb_pe_hw *pe, kb_time t, uint64_t bytes)
{
    kb_sip_hw *sip = &m->sips[pe->gsip];
    kb_cube_hw *cube = &sip->cubes[pe->cube];
    if (m->noc == KB_NOC_BUS)
        t = kb_res_hop(&cube->noc, t, bytes);
    else
        t = cmd_hops(m, sip, pe->cube, pe->router, pe->cube, 0, t, bytes);
    return kb_res_hop(&cube->m_cpu, t, bytes);
}

kb_time kb_machine_cmd_mcpu_to_iocpu(kb_machine *m, unsigned gsip, unsigned cube, kb_time t,
                                     uint64_t bytes)
{
    kb_sip_hw *sip = &m->sips[gsip];
    t = cmd_hops(m, sip, cube, 0, 0, 0, t, bytes);
    return kb_res_hop(&sip->io_cpu, t, bytes);
}

kb_time kb_machine_cmd_mcpu_to_mcpu(kb_machine *m, unsigned gsip, unsigned from, unsigned to,
                                    kb_time t, uint64_t bytes)
{
    kb_sip_hw *sip = &m->sips[gsip];
    t = cmd_hops(m, sip, from, 0, to, 0, t, bytes);
    return kb_res_hop(&sip->cubes[to].m_cpu, t, bytes);
}

kb_time kb_machine_cmd_iocpu_to_host(kb_machine *m, unsigned gsip, kb_time t, uint64_t bytes)
{
    kb_sip_hw *sip = &m->sips[gsip];
    t = kb_res_hop(&sip->pcie_ep, t, bytes);
    return kb_res_hop(&sip->pcie, t, bytes);
}

int kb_machine_cube_hops(const kb_machine *m, unsigned a, unsigned b)
{
    int ax = (int)(a % (unsigned)m->mesh_w), ay = (int)(a / (unsigned)m->mesh_w);
    int bx = (int)(b % (unsigned)m->mesh_w), by = (int)(b / (unsigned)m->mesh_w);
    return abs(ax - bx) + abs(ay - by);
}

int kb_machine_sip_hops(const kb_machine *m, unsigned a, unsigned b)
{
    int hops = 0;
    while (a != b) {
        uint8_t li = m->sip_next[(size_t)a * (size_t)m->nsips + b];
        assert(li < m->sips[a].nlinks);
        a = (unsigned)m->sips[a].links[li].peer;
        hops++;
    }
    return hops;
}

/* `where` of NoC link i of a cube (after the cube's own "sipS/cubeC"). */
static void noc_link_where(const kb_machine *m, int i, char *buf, size_t n, const char *cube)
{
    static const int dx[4] = { 1, -1, 0, 0 }, dy[4] = { 0, 0, -1, 1 };
    if (m->noc == KB_NOC_CROSSBAR) {
        snprintf(buf, n, "%s r%d %s", cube, i / 2, i % 2 ? "in" : "out");
        return;
    }
    int r = i / 4, d = i % 4, x = r % m->noc_w, y = r / m->noc_w;
    snprintf(buf, n, "%s (%d,%d)->(%d,%d)", cube, x, y, x + dx[d], y + dy[d]);
}

/* Whether mesh link i leads to a router (not off the grid's edge). */
static int noc_link_exists(const kb_machine *m, int i)
{
    if (m->noc == KB_NOC_CROSSBAR)
        return 1;
    int r = i / 4, d = i % 4, x = r % m->noc_w, y = r / m->noc_w;
    return d == KB_MESH_E ? x + 1 < m->noc_w : d == KB_MESH_W ? x > 0
           : d == KB_MESH_N ? y > 0 : y + 1 < m->noc_h;
}

/* SIP s's resources in kb_machine_each_res's order; `where` only when named (else ""). */
static void each_res_sip(const kb_machine *m, int s, kb_res_visit_fn fn, void *ud, int named)
{
    char where[64] = "", cw[32] = "";
    int duplex = m->noc != KB_NOC_BUS;
    const kb_sip_hw *sip = &m->sips[s];
    if (named)
        snprintf(where, sizeof where, "sip%d", s);
    fn(ud, &sip->pcie, where);
    fn(ud, &sip->pcie_ep, where);
    fn(ud, &sip->io_cpu, where);
    for (int l = 0; l < sip->nlinks; l++) {
        if (named)
            snprintf(where, sizeof where, "sip%d->sip%d (link %d)", s, sip->links[l].peer, l);
        fn(ud, &sip->links[l].link, where);
    }
    for (int c = 0; c < m->ncubes; c++) {
        const kb_cube_hw *cb = &sip->cubes[c];
        if (named)
            snprintf(cw, sizeof cw, "sip%d/cube%d", s, c);
        fn(ud, &cb->m_cpu, cw);
        if (!duplex) {
            fn(ud, &cb->noc, cw);
        } else {
            int nl = m->npes * (m->noc == KB_NOC_MESH ? 4 : 2);
            for (int i = 0; i < nl; i++) {
                if (!noc_link_exists(m, i))
                    continue;
                if (named)
                    noc_link_where(m, i, where, sizeof where, cw);
                fn(ud, &cb->noc_links[i], where);
            }
        }
        fn(ud, &cb->sram_port, cw);
        if (duplex) {
            if (named)
                snprintf(where, sizeof where, "%s wr", cw);
            fn(ud, &cb->sram_wr, where);
        }
        for (int d = 0; d < 4; d++) {
            if (named)
                snprintf(where, sizeof where, "%s %c", cw, "EWNS"[d]);
            fn(ud, &cb->ucie_out[d], where);
        }
        for (int p = 0; p < m->npes; p++) {
            const kb_pe_hw *pe = &cb->pes[p];
            if (named)
                snprintf(where, sizeof where, "%s/pe%d", cw, p);
            fn(ud, &pe->cpu, where);
            for (int i = 0; i < pe->ndma; i++)
                fn(ud, &pe->dma[i], where);
            fn(ud, &pe->math, where);
            fn(ud, &pe->gemm, where);
            fn(ud, &pe->tcm_port, where);
            fn(ud, &pe->hbm_port, where);
            if (duplex) {
                if (named)
                    snprintf(where, sizeof where, "%s/pe%d wr", cw, p);
                fn(ud, &pe->tcm_wr, where);
                fn(ud, &pe->hbm_wr, where);
            }
        }
    }
}

void kb_machine_each_res(const kb_machine *m, kb_res_visit_fn fn, void *ud)
{
    for (int s = 0; s < m->nsips; s++)
        each_res_sip(m, s, fn, ud, 1);
}

/* A run over several processes: what a reservation changes in a resource, out and back. */
static void res_save(void *ud, const kb_res *r, const char *where)
{
    kb_wire *w = ud;
    (void)where;
    kb_wire_u64(w, r->free_at);
    kb_wire_u64(w, r->hole_lo);
    kb_wire_u64(w, r->hole_hi);
    kb_wire_u64(w, r->memo_occ);
    kb_wire_u64(w, r->bytes);
    kb_wire_u64(w, r->busy);
    kb_wire_u32(w, r->memo_key);
}

static void res_load(void *ud, const kb_res *cr, const char *where)
{
    kb_wire_rd *rd = ud;
    kb_res *r = (kb_res *)cr; /* the machine kb_machine_sip_load was given, not const */
    (void)where;
    r->free_at = kb_wire_get_u64(rd);
    r->hole_lo = kb_wire_get_u64(rd);
    r->hole_hi = kb_wire_get_u64(rd);
    r->memo_occ = kb_wire_get_u64(rd);
    r->bytes = kb_wire_get_u64(rd);
    r->busy = kb_wire_get_u64(rd);
    r->memo_key = kb_wire_get_u32(rd);
}

void kb_machine_sip_save(const kb_machine *m, int s, kb_wire *w)
{
    each_res_sip(m, s, res_save, w, 0);
}

void kb_machine_sip_load(kb_machine *m, int s, kb_wire_rd *r)
{
    each_res_sip(m, s, res_load, r, 0);
    for (int c = 0; c < m->ncubes; c++) /* the channels' mirrors follow what was loaded */
        for (int p = 0; p < m->npes; p++) {
            kb_pe_hw *pe = &m->sips[s].cubes[c].pes[p];
            if (pe->ndma <= KB_DMA_INL) {
                for (int i = 0; i < pe->ndma; i++)
                    pe->dma_free[i] = pe->dma[i].free_at;
                dma_next_set(pe);
            }
        }
}

uint32_t kb_machine_port_id(const kb_machine *m, const kb_dma_leg *leg)
{
    const kb_cube_hw *cb = &m->sips[leg->dst_sip].cubes[leg->dst_cube];
    const char *p = (const char *)leg->dst_port;
    if (leg->dst_port == &cb->sram_port)
        return 0;
    if (leg->dst_port == &cb->sram_wr)
        return 1;
    for (int i = 0; i < m->npes; i++) {
        const char *b = (const char *)&cb->pes[i];
        if (p >= b && p < b + sizeof cb->pes[i])
            return 2u + (uint32_t)i * (uint32_t)sizeof cb->pes[i] + (uint32_t)(p - b);
    }
    assert(!"a leg's port is in its destination cube");
    return UINT32_MAX;
}

kb_res *kb_machine_port_at(kb_machine *m, const kb_dma_leg *leg, uint32_t id)
{
    kb_cube_hw *cb;
    if (leg->dst_sip >= (unsigned)m->nsips || leg->dst_cube >= (unsigned)m->ncubes)
        return NULL;
    cb = &m->sips[leg->dst_sip].cubes[leg->dst_cube];
    if (id == 0)
        return &cb->sram_port;
    if (id == 1)
        return &cb->sram_wr;
    id -= 2;
    uint32_t pe = id / (uint32_t)sizeof cb->pes[0], off = id % (uint32_t)sizeof cb->pes[0];
    if (pe >= (uint32_t)m->npes || off % _Alignof(kb_res) != 0 ||
        off + sizeof(kb_res) > sizeof cb->pes[0])
        return NULL;
    return (kb_res *)((char *)&cb->pes[pe] + off);
}
