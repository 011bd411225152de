/*
 * kb_machine — the simulated hardware: SIPs, cubes and PEs with their timing resources,
 * memories (allocators over PhysAddr ranges) and routes.
 *
 * The machine is built once from a kb_topo_cfg. Every link, memory port, CPU and engine is a
 * kb_res (sched/kb_res.h). Data moves are timed by reserving the whole route at once
 * (pipelined, see kb_res_path_reserve), or, between SIPs with system.switch.arbitration
 * per_sip, part by part as the data reach each SIP (kb_machine_dma_first); command messages (kernel launches, completions,
 * installs) hop store-and-forward through the CPUs and links of the command path.
 * docs/timing-model.md states every formula; this file is its implementation.
 *
 * The cube NoC (cube.noc.topology) is a network of routers, one per PE (mesh: a w x h grid
 * with a link resource per direction between neighbours and dimension-ordered XY routing;
 * crossbar: an egress and an ingress port per router), or, as before issue #29, one resource
 * per cube that every transfer touching the cube crosses (bus). PE p sits at router p in
 * snake order (row 0 left to right, row 1 right to left, ...), so consecutive PEs are
 * neighbours; its HBM slice port, TCM port and DMA engine attach there. The M_CPU, the SRAM
 * and, in cube 0, the SIP's PCIe endpoint and inter-SIP links attach at router 0 (the hub);
 * each UCIe link at the edge router facing its direction (the middle of that edge, rounded
 * down). With a network, memory ports are full duplex (a read side and a write side, each at
 * the port's bandwidth, as AXI's read and write channels); with bus one resource carries both.
 *
 * Routes of a DMA issued by a PE (or by the host), in order:
 *   issuing engine (a channel of PE_DMA, or the SIP's PCIe link + PCIe EP for host transfers)
 *   -> source memory port (read side)
 *   -> NoC links from the source's router to the destination's; between cubes, to the edge
 *      router of the first UCIe hop of the XY (dimension-ordered) cube route, the UCIe egress
 *      link, across each cube passed through from its entry router to its exit router, ...;
 *      across SIPs, to the source SIP's gateway cube 0 hub, the inter-SIP links of the shortest
 *      SIP path (each through the switch), and from the destination SIP's cube 0 hub
 *   -> destination memory port (write side).
 * bus routes: engine -> source port -> source cube NoC -> UCIe links -> destination cube NoC ->
 * destination port, the NoC skipped for a copy inside the issuing PE's TCM ranges. A resource
 * appears at most once in a route.
 *
 * PE_DMA has pe.dma.channels channels, each an ordered resource (setup + bytes at
 * pe.dma.bandwidth_gbps): a DMA takes the channel that is free first (the lowest-numbered of
 * equals), so a PE's transfers overlap on its channels and share its ports and links.
 *
 * Sizes: PEs per cube <= 16, cubes per SIP <= 32, SIPs <= 256 (PhysAddr limits).
 * Ownership: kb_machine_create allocates everything; kb_machine_destroy frees it.
 */
#ifndef KB_MACHINE_H
#define KB_MACHINE_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kb_addr.h"
#include "kb_alloc.h"
#include "kb_config.h"
#include "kb_err.h"
#include "kb_mmu.h"
#include "kb_res.h"

/* The longest route any machine kbcl accepts can need: two SIPs' cube paths (32 cubes
 * crossed, 15 NoC links each, 31 UCIe hops) and 128 inter-SIP hops, with engine and ports. */
#define KB_MAX_ROUTE 1160
#define KB_DMA_INL 4          /* DMA channels whose free times kb_pe_hw keeps in its first line */
#define KB_ROUTE_MEMO_WAYS 4  /* routes remembered per issuing PE */
#define KB_ROUTE_MEMO_LEN 24  /* longest route kept in a memo way itself: any route between
                               * neighbouring cubes, most inside one SIP */
#define KB_PE_NEXT_RES 4      /* KB_FIBER_HOT_VEC: kb_pe_hw.next_res feeds a kernel's hints */
#define KB_ROUTE_MEMO_MAX 128 /* longest remembered route (longer: in the way's own buffer) */

/* A route remembered by kb_machine_dma (its end keys are in kb_pe_hw.route_src/dst);
 * n = 0: unused. Its own line pair: a short route's pointers share the line with n. */
/* Told of one reservation: resource r busy over [t0, t1) for `bytes` bytes. */
typedef void (*kb_res_observer_fn)(void *ud, const kb_res *r, kb_time t0, kb_time t1,
                                   uint64_t bytes);

typedef struct kb_route_way {
    _Alignas(64) int n;
    kb_res *path[KB_ROUTE_MEMO_LEN];
    /* a longer route (up to KB_ROUTE_MEMO_MAX: across cubes and SIPs) is kept here instead,
     * owned by the way (far_cap entries, NULL until one is); kb_route_way_path says where */
    kb_res **far;
    int far_cap;
} kb_route_way;

/* The remembered path of way w (n resources). */
static inline kb_res **kb_route_way_path(kb_route_way *w)
{
    return w->n <= KB_ROUTE_MEMO_LEN ? w->path : w->far;
}

enum { KB_MESH_E = 0, KB_MESH_W = 1, KB_MESH_N = 2, KB_MESH_S = 3 };

/* The first cache line holds what kernels, the IPCQ and a DMA read on every operation (a DMA:
 * the channels and their free times); each resource's hot fields have a line of their own
 * (kb_res). At thousands of PEs every line a step touches is a cache miss. */
typedef struct kb_pe_hw {
    unsigned gsip, cube;
    uint16_t pe;
    uint8_t ndma;      /* 1 .. 64 (pe.dma.channels) */
    uint8_t dma_next;  /* with up to KB_DMA_INL channels: the one a transfer takes now (the
                        * free first, the lowest of equals), kept with dma_free; next_res[0]
                        * names it again on the hint line, which a channel choice never reads */
    uint32_t ipcq_wired; /* IPCQ layer: bit d set = direction d wired (copy of its state's;
                          * while an install runs, the directions it has met so far) */
    void *ipcq_state;  /* owned by the IPCQ layer (ccl/); NULL until installed */
    kb_res *dma;       /* PE_DMA channels [ndma], each setup + bandwidth, ordered (owned) */
    /* with up to KB_DMA_INL channels, each one's free_at again, side by side: choosing a
     * channel reads this line, not one line per channel. Only reservations by this PE move a
     * channel, and each one copies the channel's new free_at here (kb_machine.c: reserve_path);
     * with more channels it is unused and the choice reads the channels */
    kb_time dma_free[KB_DMA_INL];
    /* second line: set up once, read off the hot paths */
    unsigned gid;      /* global PE index (gsip*cubes + cube)*pes + pe */
    int router;        /* the cube NoC router its port and engine attach to */
    unsigned route_next; /* round-robin victim in routes[] */
    kb_alloc *hbm, *tcm, *ipcq, *scratch; /* allocators over PhysAddr ranges */
    kb_res cpu;        /* PE_CPU: issue cost of each kernel operation */
    kb_res math;       /* PE_MATH vector unit */
    kb_res gemm;       /* PE_GEMM matrix unit */
    kb_res tcm_port;   /* TCM (tcm, ipcq and scratch ranges): reads, and writes with bus */
    kb_res hbm_port;   /* this PE's HBM slice: reads, and writes with bus */
    kb_res tcm_wr;     /* the write sides of both ports (mesh, crossbar) */
    kb_res hbm_wr;
    /* kb_machine_dma's route memo: routes are fixed for a machine's lifetime and a kernel
     * moves data along a handful of them, so building one (its duplicate checks and mesh
     * walk) once per pair of ports is enough */
    /* end keys of routes[i] (kb_machine.c: route_key), in one line: a lookup reads this line
     * and the hit's path, whichever way hits (with 1 024 PEs and more every line a DMA
     * touches is a cache miss) */
    /* (one _Alignas per declaration: on a declaration of two arrays it aligns each, which put
     * them on two lines) */
    _Alignas(64) uint64_t route_src[KB_ROUTE_MEMO_WAYS];
    uint64_t route_dst[KB_ROUTE_MEMO_WAYS];
    kb_route_way routes[KB_ROUTE_MEMO_WAYS];
    /* The resources this PE's next DMA will likely reserve, for its kernel's prefetch hints
     * (kb_fiber_set_hot_vec; a resume finds them cold at thousands of PEs, behind the route
     * memo): [0] the channel it would take now (channel 0 with more than KB_DMA_INL), [1..3]
     * the source port, last link and destination port of the last remembered route it used
     * (next_way; NULL: none since its way was refilled). Never NULL; only ever read as hints. */
    _Alignas(64) kb_res *next_res[KB_PE_NEXT_RES];
    const kb_route_way *next_way;
} kb_pe_hw;

_Static_assert(offsetof(kb_pe_hw, gid) == 64, "a DMA's channel choice is in kb_pe_hw's first line");
_Static_assert(offsetof(kb_pe_hw, route_dst) - offsetof(kb_pe_hw, route_src) ==
                   KB_ROUTE_MEMO_WAYS * sizeof(uint64_t) &&
               offsetof(kb_pe_hw, route_src) % 64 == 0 && 2 * KB_ROUTE_MEMO_WAYS * 8 <= 64,
               "a route memo lookup reads its keys from one line");

typedef struct kb_cube_hw {
    unsigned gsip, cube, x, y;
    kb_res m_cpu;
    kb_res noc;          /* the whole NoC with topology bus; unused otherwise */
    kb_res sram_port;    /* reads, and writes with bus */
    kb_res sram_wr;      /* writes (mesh, crossbar) */
    kb_res ucie_out[4];  /* egress links toward E, W, N, S (unused where the mesh ends) */
    /* NoC links (owned; NULL with bus): mesh [router * 4 + d], the link out of a router
     * toward E W N S (unused where the grid ends); crossbar [router * 2 + {0 out, 1 in}] */
    kb_res *noc_links;
    kb_alloc *sram;
    kb_pe_hw *pes;       /* [pes_per_cube] */
} kb_cube_hw;

typedef struct kb_sip_link {
    int peer;            /* neighbouring SIP, -1 = none */
    kb_res link;         /* egress link to it (includes the switch overhead as latency) */
} kb_sip_link;

typedef struct kb_sip_hw {
    unsigned gsip;
    kb_res pcie;         /* host <-> SIP link */
    kb_res pcie_ep;      /* PCIe endpoint: per-message overhead */
    kb_res io_cpu;       /* per-message overhead */
    kb_sip_link links[4];
    int nlinks;
    kb_cube_hw *cubes;   /* [cubes_per_sip] */
    kb_mmu *mmu;         /* VA -> PA for every PE of this SIP */
    kb_alloc *va;        /* this SIP's virtual address space */
} kb_sip_hw;

typedef struct kb_machine {
    kb_topo_cfg cfg;
    int nsips, ncubes, npes;  /* per system / per SIP / per cube */
    int mesh_w, mesh_h;
    int sip_grid_w, sip_grid_h; /* SIP topology grid (ring: n x 1) */
    kb_noc_kind noc;          /* cube.noc.topology */
    int noc_w, noc_h;         /* routers per row / column (mesh; crossbar: the same grid) */
    int noc_edge[4];          /* router of the UCIe link toward E, W, N, S */
    uint64_t hbm_slice_bytes;
    kb_time host_overhead;
    kb_sip_hw *sips;
    kb_pe_hw **pe_by_gid;     /* [nsips*ncubes*npes] */
    uint8_t *sip_next;        /* [nsips*nsips]: link index toward dst, 0xff = self */
    /* when set, called for every resource a DMA reserves (the trace recorder attaches
     * here; the machine does not know who listens) */
    kb_res_observer_fn res_observer;
    void *res_observer_ud;    /* not owned */
    kb_sip_topo sip_topo;     /* system.sips.topology (last: the fields above keep their
                               * offsets for compiled plugins) */
    int per_sip;              /* system.switch.arbitration per_sip (kb_machine_dma_first) */
    int sip_bound;            /* kb_machine_bind_sips */
    int io_tree;              /* sip.io_cpu.completions tree (kb_runtime_launch.c) */
} kb_machine;

int kb_machine_create(const kb_topo_cfg *cfg, kb_machine **out, kb_errbuf *eb);
/* Attaches (fn != NULL) or detaches an observer of resource reservations. */
void kb_machine_observe(kb_machine *m, kb_res_observer_fn fn, void *ud);
void kb_machine_destroy(kb_machine *m);

static inline kb_pe_hw *kb_machine_pe(const kb_machine *m, unsigned gsip, unsigned cube,
                                      unsigned pe)
{
    assert(gsip < (unsigned)m->nsips && cube < (unsigned)m->ncubes && pe < (unsigned)m->npes);
    return &m->sips[gsip].cubes[cube].pes[pe];
}

/* The memory port that serves pa, or NULL (with a message) for unmapped kinds. */
kb_res *kb_machine_port(kb_machine *m, kb_pa pa, kb_errbuf *eb);

/*
 * Calls fn for every resource of the machine, in a fixed order: per SIP its PCIe link, PCIe
 * endpoint, IO_CPU and inter-SIP links, then per cube its M_CPU, NoC (the bus, or each link),
 * SRAM port(s) and UCIe links, then per PE its CPU, DMA channels, MATH and GEMM units, TCM
 * and HBM ports (read side, then write side). `where` ("sip0", "sip0/cube3",
 * "sip0/cube3/pe2", "sip0/cube3 (1,0)->(2,0)" for a mesh link, "sip0/cube3/pe2 wr" for a
 * write side) lives until fn returns; r->name is the kind. Resources visited one after the
 * other with the same kind and `where` are one unit of parallel servers (a DMA engine's
 * channels): whoever sums them adds their bandwidths.
 */
typedef void (*kb_res_visit_fn)(void *ud, const kb_res *r, const char *where);
void kb_machine_each_res(const kb_machine *m, kb_res_visit_fn fn, void *ud);

/*
 * Builds the route of a DMA of pa_src -> pa_dst issued by `issuer` (NULL = the host, through
 * the destination SIP's PCIe; for host reads pass the source SIP via pa_src). Returns the
 * number of resources written to path[], or a negative error.
 */
int kb_machine_route(kb_machine *m, const kb_pe_hw *issuer, kb_pa pa_src, kb_pa pa_dst,
                     kb_res **path, int max, kb_errbuf *eb);

/* Times a DMA: reserves the route at `now`; t_start and t_end receive the interval. */
int kb_machine_dma(kb_machine *m, kb_pe_hw *issuer, kb_pa pa_src, kb_pa pa_dst, uint64_t nbytes,
                   kb_time now, kb_time *t_start, kb_time *t_end, kb_errbuf *eb);

/*
 * A DMA booked part by part (system.switch.arbitration per_sip). The route is cut after each
 * inter-SIP link: the issuing SIP's part (engine, source port, network to the gateway, its
 * egress link), each SIP passed through (its egress link), the destination SIP's part
 * (network from its gateway, write port). kb_machine_dma_first books the first part at `now`;
 * the caller books each later one with kb_machine_dma_next at the time its head arrives
 * (leg->t_head), so no part is booked before its SIP sees the data: the switch buffers what a
 * busy part is not yet taking. A part's tail leaves it at max(its own reservation's end, the
 * previous part's tail + its latency), which on an idle route is the whole route's closed form
 * (timing-model.md §2.4). With arbitration route, for a host transfer, a route inside one SIP,
 * or a read of another SIP's memory the first part is the whole route, booked as
 * kb_machine_dma books it, and the leg has no parts left.
 */
typedef struct kb_dma_leg {
    kb_time t_start;           /* the latest part's start */
    kb_time t_end;             /* when the tail has crossed the latest part (the last: the DMA's
                                * end) */
    kb_time t_head;            /* when the head reaches the next part (while parts are left) */
    uint64_t nbytes;
    int part, nparts;          /* parts booked, of nparts (0 of 0: booked whole) */
    int at;                    /* the SIP of the next part */
    unsigned dst_sip, dst_cube; /* where the data go: the last part's end */
    int dst_router;
    kb_res *dst_port;          /* the destination's write side (bus: its one port) */
} kb_dma_leg;

/* 1 while the leg has parts left to book. */
static inline int kb_dma_leg_more(const kb_dma_leg *leg) { return leg->part < leg->nparts; }

/*
 * While a launch runs forked over the SIPs (docs/parallel.md), on: a PE's DMA may then book
 * its own SIP's resources only, the others being other threads', so kb_machine_dma refuses
 * one that reaches another SIP's memory (KB_ERR_RANGE, naming both SIPs); a send between SIPs
 * goes by parts (kb_machine_dma_first), whose first part is the issuer's. Turning it on
 * forgets every remembered route, so that none that crosses SIPs skips the check.
 */
void kb_machine_bind_sips(kb_machine *m, int on);

/*
 * A run over several processes (docs/parallel.md): what a launch's partitions changed in SIP
 * s's resources (their reservations and statistics), written by the process that ran the SIP
 * and read by the others, in kb_machine_each_res's order. Route memos are caches and stay.
 */
struct kb_wire;
struct kb_wire_rd;
void kb_machine_sip_save(const kb_machine *m, int s, struct kb_wire *w);
void kb_machine_sip_load(kb_machine *m, int s, struct kb_wire_rd *r);
/* The port a leg's data go to as a number within its destination cube, and back (NULL for a
 * number that names no port there): a leg crossing to another process. */
uint32_t kb_machine_port_id(const kb_machine *m, const struct kb_dma_leg *leg);
kb_res *kb_machine_port_at(kb_machine *m, const struct kb_dma_leg *leg, uint32_t id);

int kb_machine_dma_first(kb_machine *m, kb_pe_hw *issuer, kb_pa pa_src, kb_pa pa_dst,
                         uint64_t nbytes, kb_time now, kb_dma_leg *leg, kb_errbuf *eb);
/* Books leg's next part at `now` (its head's arrival, >= leg->t_head) and moves leg on. A leg
 * holds no memory: each later part is built from where the data go. */
void kb_machine_dma_next(kb_machine *m, kb_dma_leg *leg, kb_time now);

/*
 * Command path, one store-and-forward step at a time (each returns the arrival time at the
 * next component). A CPU hop starts at max(arrival, the CPU's free time) and takes its
 * overhead; links add latency + bytes/bandwidth. The launch code composes them and fans out:
 * one message host -> IO_CPU, one per cube IO_CPU -> M_CPU, one per PE M_CPU -> PE_CPU;
 * completions are aggregated the other way (per cube at M_CPU, per SIP at IO_CPU).
 */
kb_time kb_machine_cmd_host_to_iocpu(kb_machine *m, unsigned gsip, kb_time t, uint64_t bytes);
/* A command already waiting in the IO_CPU's queue (a device launch queue): its overhead only. */
kb_time kb_machine_cmd_at_iocpu(kb_machine *m, unsigned gsip, kb_time t, uint64_t bytes);
kb_time kb_machine_cmd_iocpu_to_mcpu(kb_machine *m, unsigned gsip, unsigned cube, kb_time t,
                                     uint64_t bytes);
kb_time kb_machine_cmd_mcpu_to_pe(kb_machine *m, kb_pe_hw *pe, kb_time t, uint64_t bytes);
kb_time kb_machine_cmd_pe_to_mcpu(kb_machine *m, kb_pe_hw *pe, kb_time t, uint64_t bytes);
kb_time kb_machine_cmd_mcpu_to_iocpu(kb_machine *m, unsigned gsip, unsigned cube, kb_time t,
                                     uint64_t bytes);
kb_time kb_machine_cmd_iocpu_to_host(kb_machine *m, unsigned gsip, kb_time t, uint64_t bytes);
/* A completion from one cube's M_CPU to another's (sip.io_cpu.completions tree): the UCIe hops
 * between them, then the receiving M_CPU. */
kb_time kb_machine_cmd_mcpu_to_mcpu(kb_machine *m, unsigned gsip, unsigned from, unsigned to,
                                    kb_time t, uint64_t bytes);

/* The NoC router of PE pe (snake order) in the w-wide grid. */
int kb_machine_pe_router(const kb_machine *m, unsigned pe);

/* The DMA channel a transfer issued now would take: the one free first, the lowest of equals. */
static inline kb_res *kb_machine_dma_channel(kb_pe_hw *pe)
{
    int best = 0;
    if (pe->ndma <= KB_DMA_INL)
        return &pe->dma[pe->dma_next];
    for (int i = 1; i < pe->ndma; i++)
        best = pe->dma[i].free_at < pe->dma[best].free_at ? i : best;
    return &pe->dma[best];
}

/* Number of UCIe hops between two cubes of a SIP (XY routing) / SIP hops between SIPs. */
int kb_machine_cube_hops(const kb_machine *m, unsigned cube_a, unsigned cube_b);
int kb_machine_sip_hops(const kb_machine *m, unsigned sip_a, unsigned sip_b);

#endif
