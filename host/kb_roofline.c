/*
 * kb_roofline — the accumulator and the machine's rates behind a workload's lower bound
 * (kb_roofline.h states the model; docs/decoder.md derives the formulas).
 */
#include "kb_roofline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


typedef struct roof_level {
    int ngroups, modelled;
    double *cut, *cap;        /* per group: bytes that must cross its edge; its egress GB/s */
    uint8_t *used;            /* per group: in use by a `total` */
    double total;             /* bytes that must cross the level */
    double latency_ns;        /* one link of the level */
    int step;                 /* depth: the current step, its largest hops, the steps before */
    long step_hops, done_hops;
} roof_level;

struct kb_roofline_acc {
    const kb_machine *m;      /* borrowed */
    double compute_ns;
    int npes, mem_pes;
    double *rd, *wr;          /* per PE: HBM bytes pinned to its slice */
    double spread_rd, spread_wr;
    roof_level lv[KB_ROOF_NLEVELS];
};

const char *kb_roofline_bound_name(kb_roof_bound b)
{
    return b == KB_ROOF_COMPUTE ? "compute" : b == KB_ROOF_MEMORY ? "memory"
           : b == KB_ROOF_COMM ? "comm" : "";
}

const char *kb_roofline_level_name(int level)
{
    return level == KB_ROOF_SIP ? "inter_sip" : level == KB_ROOF_CUBE ? "ucie"
           : level == KB_ROOF_PE ? "noc" : "";
}

double kb_roofline_efficiency(const kb_roofline *r, double sim_ns)
{
    return sim_ns > 0.0 && r->ns > 0.0 ? r->ns / sim_ns : 0.0;
}

const kb_machine *kb_roofline_machine(const kb_roofline_acc *a) { return a->m; }

/* A resource's bandwidth in GB/s (bytes per ns) as the engine has it: whole bytes per us. */
static double rate(const kb_res *r)
{
    return r->bytes_per_us ? (double)r->bytes_per_us / 1000.0 : INFINITY;
}

/* ---------------------------------------------------------------- geometry ------------ */

int kb_roofline_level_modelled(const kb_machine *m, int level)
{
    return level != KB_ROOF_PE || m->noc != KB_NOC_BUS;
}

int kb_roofline_ngroups(const kb_machine *m, int level)
{
    return level == KB_ROOF_SIP ? m->nsips : level == KB_ROOF_CUBE ? m->nsips * m->ncubes
                                                                   : m->nsips * m->ncubes * m->npes;
}

int kb_roofline_group(const kb_machine *m, int level, int gid)
{
    return level == KB_ROOF_SIP ? gid / (m->ncubes * m->npes)
           : level == KB_ROOF_CUBE ? gid / m->npes : gid;
}

/* A SIP's inter-SIP egress: one link per neighbour (with two SIPs in a ring the E and W links
 * reach the same peer and routing only ever takes the first). */
static double sip_egress(const kb_machine *m, int s)
{
    const kb_sip_hw *sip = &m->sips[s];
    double e = 0.0;
    for (int l = 0; l < sip->nlinks; l++) {
        int dup = 0;
        for (int k = 0; k < l; k++)
            dup |= sip->links[k].peer == sip->links[l].peer;
        if (!dup)
            e += rate(&sip->links[l].link);
    }
    return e;
}

/* Whether cube c has a neighbour in mesh direction d (no wrap). */
static int cube_has(const kb_machine *m, int c, int d)
{
    int x = c % m->mesh_w, y = c / m->mesh_w;
    return d == KB_MESH_E ? x + 1 < m->mesh_w : d == KB_MESH_W ? x > 0
           : d == KB_MESH_N ? y > 0 : y + 1 < m->mesh_h;
}

static double pe_egress(const kb_machine *m, int s, int c, int p)
{
    const kb_cube_hw *cb = &m->sips[s].cubes[c];
    int r = kb_machine_pe_router(m, (unsigned)p), x = r % m->noc_w, y = r / m->noc_w;
    double e = 0.0;
    if (m->noc == KB_NOC_BUS)
        return 0.0;
    if (m->noc == KB_NOC_CROSSBAR) {
        e += m->npes > 1 ? rate(&cb->noc_links[r * 2]) : 0.0;
    } else {
        int has[4] = { x + 1 < m->noc_w, x > 0, y > 0, y + 1 < m->noc_h };
        for (int d = 0; d < 4; d++)
            if (has[d])
                e += rate(&cb->noc_links[r * 4 + d]);
    }
    for (int d = 0; d < 4; d++)
        if (m->noc_edge[d] == r && cube_has(m, c, d))
            e += rate(&cb->ucie_out[d]);
    if (c == 0 && r == 0)
        e += sip_egress(m, s);
    return e;
}

double kb_roofline_egress_gbps(const kb_machine *m, int level, int group)
{
    if (level == KB_ROOF_SIP)
        return sip_egress(m, group);
    if (level == KB_ROOF_CUBE) {
        int s = group / m->ncubes, c = group % m->ncubes;
        double e = c == 0 ? sip_egress(m, s) : 0.0;
        for (int d = 0; d < 4; d++)
            if (cube_has(m, c, d))
                e += rate(&m->sips[s].cubes[c].ucie_out[d]);
        return e;
    }
    return pe_egress(m, group / (m->ncubes * m->npes), group / m->npes % m->ncubes,
                     group % m->npes);
}

int kb_roofline_hops(const kb_machine *m, int level, int a, int b)
{
    int per_sip = m->ncubes * m->npes;
    int sa = a / per_sip, sb = b / per_sip, ca = a / m->npes % m->ncubes,
        cb = b / m->npes % m->ncubes;
    if (level == KB_ROOF_SIP)
        return sa == sb ? 0 : kb_machine_sip_hops(m, (unsigned)sa, (unsigned)sb);
    if (level == KB_ROOF_CUBE)
        return sa == sb ? kb_machine_cube_hops(m, (unsigned)ca, (unsigned)cb)
                        : kb_machine_cube_hops(m, (unsigned)ca, 0) +
                              kb_machine_cube_hops(m, 0, (unsigned)cb);
    if (sa != sb || ca != cb || a == b || m->noc == KB_NOC_BUS)
        return 0;
    if (m->noc == KB_NOC_CROSSBAR)
        return 1;
    int ra = kb_machine_pe_router(m, (unsigned)(a % m->npes)),
        rb = kb_machine_pe_router(m, (unsigned)(b % m->npes));
    return abs(ra % m->noc_w - rb % m->noc_w) + abs(ra / m->noc_w - rb / m->noc_w);
}

/* ---------------------------------------------------------------- accumulator ---------- */

void kb_roofline_acc_destroy(kb_roofline_acc *a)
{
    if (!a)
        return;
    for (int l = 0; l < KB_ROOF_NLEVELS; l++) {
        free(a->lv[l].cut);
        free(a->lv[l].cap);
        free(a->lv[l].used);
    }
    free(a->rd);
    free(a->wr);
    free(a);
}

int kb_roofline_acc_create(const kb_machine *m, kb_roofline_acc **out, kb_errbuf *eb)
{
    const kb_topo_cfg *c = &m->cfg;
    const double lat[KB_ROOF_NLEVELS] = { c->inter_sip.latency_ns + c->switch_overhead_ns,
                                          c->ucie.latency_ns, c->noc.latency_ns };
    kb_roofline_acc *a = calloc(1, sizeof *a);
    int rc = KB_ERR_NOMEM;

    *out = NULL;
    if (!a)
        goto fail;
    a->m = m;
    a->npes = m->nsips * m->ncubes * m->npes;
    if (!(a->rd = calloc((size_t)a->npes, sizeof *a->rd)) ||
        !(a->wr = calloc((size_t)a->npes, sizeof *a->wr)))
        goto fail;
    for (int l = 0; l < KB_ROOF_NLEVELS; l++) {
        roof_level *v = &a->lv[l];
        v->ngroups = kb_roofline_ngroups(m, l);
        v->modelled = kb_roofline_level_modelled(m, l);
        v->latency_ns = lat[l];
        if (!(v->cut = calloc((size_t)v->ngroups, sizeof *v->cut)) ||
            !(v->cap = calloc((size_t)v->ngroups, sizeof *v->cap)) ||
            !(v->used = calloc((size_t)v->ngroups, 1)))
            goto fail;
        for (int g = 0; g < v->ngroups; g++)
            v->cap[g] = kb_roofline_egress_gbps(m, l, g);
    }
    *out = a;
    return 0;
fail:
    kb_roofline_acc_destroy(a);
    return kb_err_set(eb, rc, "roofline: out of memory for a machine of %d PEs",
                      m->nsips * m->ncubes * m->npes);
}

void kb_roofline_flops(kb_roofline_acc *a, kb_qfmt fmt, int sparse, double flops, int pes)
{
    uint64_t per_us = kb_qgemm_flops_per_us(&a->m->cfg, fmt, sparse);
    if (flops > 0.0 && pes > 0)
        a->compute_ns += flops / ((double)pes * (double)per_us / 1000.0);
}

void kb_roofline_mem_pe(kb_roofline_acc *a, int gid, double rd, double wr)
{
    if (gid >= 0 && gid < a->npes) {
        a->rd[gid] += rd;
        a->wr[gid] += wr;
    }
}

void kb_roofline_mem_spread(kb_roofline_acc *a, double rd, double wr)
{
    a->spread_rd += rd;
    a->spread_wr += wr;
}

void kb_roofline_mem_pes(kb_roofline_acc *a, int pes) { a->mem_pes = pes; }

void kb_roofline_cut(kb_roofline_acc *a, int level, int group, double bytes)
{
    a->lv[level].cut[group] += bytes;
}

void kb_roofline_total(kb_roofline_acc *a, int level, double bytes)
{
    a->lv[level].total += bytes;
}

void kb_roofline_use(kb_roofline_acc *a, int level, int group)
{
    a->lv[level].used[group] = 1;
}

void kb_roofline_depth(kb_roofline_acc *a, int level, int step, int hops)
{
    roof_level *v = &a->lv[level];
    if (step != v->step) {
        v->done_hops += v->step_hops;
        v->step_hops = 0;
        v->step = step;
    }
    if (hops > v->step_hops)
        v->step_hops = hops;
}

/* ---------------------------------------------------------------- result -------------- */

/* Both sides of a full-duplex port carry their own direction; the bus model's one side
 * carries both. */
static double port_ns(int duplex, double rd, double wr, double rb, double wb)
{
    return duplex ? fmax(rd / rb, wr / wb) : (rd + wr) / rb;
}

static double memory_ns(const kb_roofline_acc *a)
{
    const kb_machine *m = a->m;
    int duplex = m->noc != KB_NOC_BUS, used = 0;
    const kb_pe_hw *pe0 = m->pe_by_gid[0];
    double worst = 0.0, rd = a->spread_rd, wr = a->spread_wr;
    for (int g = 0; g < a->npes; g++) {
        if (a->rd[g] <= 0.0 && a->wr[g] <= 0.0)
            continue;
        const kb_pe_hw *pe = m->pe_by_gid[g];
        worst = fmax(worst, port_ns(duplex, a->rd[g], a->wr[g], rate(&pe->hbm_port),
                                    rate(duplex ? &pe->hbm_wr : &pe->hbm_port)));
        rd += a->rd[g];
        wr += a->wr[g];
        used++;
    }
    int pes = a->mem_pes > 0 ? a->mem_pes : used;
    if (pes > 0 && (rd > 0.0 || wr > 0.0))
        worst = fmax(worst, port_ns(duplex, rd, wr, pes * rate(&pe0->hbm_port),
                                    pes * rate(duplex ? &pe0->hbm_wr : &pe0->hbm_port)));
    return worst;
}

/* A level's time: its busiest edge or its whole traffic over the capacity in use, plus the
 * last byte's link; at least its dependent hops' latencies. */
static double level_ns(const roof_level *v)
{
    double bw = 0.0, cap = 0.0;
    if (!v->modelled)
        return 0.0;
    for (int g = 0; g < v->ngroups; g++) {
        if (v->cut[g] > 0.0)
            bw = fmax(bw, v->cap[g] > 0.0 ? v->cut[g] / v->cap[g] : INFINITY);
        if (v->used[g])
            cap += v->cap[g];
    }
    if (v->total > 0.0)
        bw = fmax(bw, cap > 0.0 ? v->total / cap : INFINITY);
    double t = bw > 0.0 ? bw + v->latency_ns : 0.0;
    return fmax(t, (double)(v->done_hops + v->step_hops) * v->latency_ns);
}

void kb_roofline_result(const kb_roofline_acc *a, kb_roofline *out)
{
    memset(out, 0, sizeof *out);
    out->comm_level = -1;
    out->compute_ns = a->compute_ns;
    out->memory_ns = memory_ns(a);
    for (int l = 0; l < KB_ROOF_NLEVELS; l++) {
        double t = level_ns(&a->lv[l]);
        if (t > out->comm_ns) {
            out->comm_ns = t;
            out->comm_level = l;
        }
    }
    out->ns = fmax(out->compute_ns, fmax(out->memory_ns, out->comm_ns));
    out->bound = out->ns <= 0.0 ? KB_ROOF_NONE
                 : out->compute_ns == out->ns ? KB_ROOF_COMPUTE
                 : out->memory_ns == out->ns ? KB_ROOF_MEMORY : KB_ROOF_COMM;
}

void kb_roofline_gemm(kb_roofline_acc *a, uint64_t m, uint64_t n, uint64_t k, uint64_t es,
                      int pes, int c_gid)
{
    kb_roofline_flops(a, KB_QF_F16, 0, 2.0 * (double)m * (double)n * (double)k, pes);
    kb_roofline_mem_spread(a, (double)(m * k + k * n) * (double)es, 0.0);
    kb_roofline_mem_pe(a, c_gid, 0.0, (double)(m * n) * (double)es);
    kb_roofline_mem_pes(a, pes);
}
