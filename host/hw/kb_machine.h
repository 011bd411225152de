/*
 * kb_machine — the simulated hardware: SIPs, cubes and PEs with their timing resources,
 * memories (allocators over PhysAddr ranges) and routes.
 *
 * The machine is built once from a kb_topo_cfg. Every link, memory port, CPU and engine is a
 * kb_res (sched/kb_res.h). Data moves are timed by reserving the whole route at once
 * (pipelined, see kb_res_path_reserve); command messages (kernel launches, completions,
 * installs) hop store-and-forward through the CPUs of the command path. docs/timing-model.md
 * states every formula; this file is its implementation.
 *
 * Routes of a DMA issued by a PE (or by the host), in order:
 *   issuing engine (PE_DMA, or the SIP's PCIe link + PCIe EP for host transfers)
 *   -> source memory port -> source cube NoC
 *   -> UCIe egress links along XY (dimension-ordered) routing to the destination cube, or, across
 *      SIPs, to the source SIP's gateway cube 0, then the inter-SIP links of the shortest SIP path
 *      (each through the switch) and from the destination SIP's cube 0 to the destination cube
 *   -> destination cube NoC -> destination memory port.
 * A transfer whose both ends are inside the issuing PE (TCM ranges) skips the NoC. A resource
 * appears at most once in a route.
 *
 * Sizes: PEs per cube <= 16, cubes per SIP <= 32, SIPs <= 256 (PhysAddr limits).
 * Ownership: kb_machine_create allocates everything; kb_machine_destroy frees it.
 */
#ifndef KB_MACHINE_H
#define KB_MACHINE_H

#include <stdint.h>

#include "kb_addr.h"
#include "kb_alloc.h"
#include "kb_config.h"
#include "kb_err.h"
#include "kb_mmu.h"
#include "kb_res.h"

#define KB_MAX_ROUTE 96
#define KB_ROUTE_MEMO_WAYS 4  /* routes remembered per issuing PE */
#define KB_ROUTE_MEMO_LEN 12  /* longest remembered route: any route inside one SIP */

/* A route remembered by kb_machine_dma (its end keys are in kb_pe_hw.route_src/dst);
 * n = 0: unused. Its own line pair: a short route's pointers share the line with n. */
/* Told of one reservation: resource r busy over [t0, t1) for `bytes` bytes. */
typedef void (*kb_res_observer_fn)(void *ud, const kb_res *r, kb_time t0, kb_time t1,
                                   uint64_t bytes);

typedef struct kb_route_way {
    _Alignas(64) int n;
    kb_res *path[KB_ROUTE_MEMO_LEN];
} kb_route_way;

enum { KB_MESH_E = 0, KB_MESH_W = 1, KB_MESH_N = 2, KB_MESH_S = 3 };

/* The first cache line holds what kernels and the IPCQ read on every operation; each
 * resource's hot fields have a line of their own (kb_res). */
typedef struct kb_pe_hw {
    unsigned gsip, cube, pe, gid;  /* gid: global PE index (gsip*cubes + cube)*pes + pe */
    void *ipcq_state;  /* owned by the IPCQ layer (ccl/); NULL until installed */
    kb_alloc *hbm, *tcm, *ipcq, *scratch; /* allocators over PhysAddr ranges */
    unsigned route_next; /* round-robin victim in routes[] */
    uint32_t ipcq_wired; /* IPCQ layer: bit d set = direction d wired (copy of its state's;
                          * while an install runs, the directions it has met so far) */
    kb_res cpu;        /* PE_CPU: issue cost of each kernel operation */
    kb_res dma;        /* PE_DMA engine: setup + bandwidth */
    kb_res math;       /* PE_MATH vector unit */
    kb_res gemm;       /* PE_GEMM matrix unit */
    kb_res tcm_port;   /* TCM (tcm, ipcq and scratch ranges) */
    kb_res hbm_port;   /* this PE's HBM slice */
    /* kb_machine_dma's route memo: routes are fixed for a machine's lifetime and a kernel
     * moves data along a handful of them, so building one (its duplicate checks and mesh
     * walk) once per pair of ports is enough */
    /* end keys of routes[i] (kb_machine.c: route_key), in one line: a lookup reads this line
     * and the hit's path, whichever way hits (with 1 024 PEs and more every line a DMA
     * touches is a cache miss) */
    _Alignas(64) uint64_t route_src[KB_ROUTE_MEMO_WAYS], route_dst[KB_ROUTE_MEMO_WAYS];
    kb_route_way routes[KB_ROUTE_MEMO_WAYS];
} kb_pe_hw;

typedef struct kb_cube_hw {
    unsigned gsip, cube, x, y;
    kb_res m_cpu;
    kb_res noc;
    kb_res sram_port;
    kb_res ucie_out[4];  /* egress links toward E, W, N, S (unused where the mesh ends) */
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
    uint64_t hbm_slice_bytes;
    kb_time host_overhead;
    kb_sip_hw *sips;
    kb_pe_hw **pe_by_gid;     /* [nsips*ncubes*npes] */
    uint8_t *sip_next;        /* [nsips*nsips]: link index toward dst, 0xff = self */
    /* when set, called for every resource a DMA reserves (the trace recorder attaches
     * here; the machine does not know who listens) */
    kb_res_observer_fn res_observer;
    void *res_observer_ud;    /* not owned */
} kb_machine;

int kb_machine_create(const kb_topo_cfg *cfg, kb_machine **out, kb_errbuf *eb);
/* Attaches (fn != NULL) or detaches an observer of resource reservations. */
void kb_machine_observe(kb_machine *m, kb_res_observer_fn fn, void *ud);
void kb_machine_destroy(kb_machine *m);

static inline kb_pe_hw *kb_machine_pe(const kb_machine *m, unsigned gsip, unsigned cube,
                                      unsigned pe)
{
    return &m->sips[gsip].cubes[cube].pes[pe];
}

/* The memory port that serves pa, or NULL (with a message) for unmapped kinds. */
kb_res *kb_machine_port(kb_machine *m, kb_pa pa, kb_errbuf *eb);

/*
 * Calls fn for every resource of the machine, in a fixed order: per SIP its PCIe link, PCIe
 * endpoint, IO_CPU and inter-SIP links, then per cube its M_CPU, NoC, SRAM port and UCIe
 * links, then per PE its CPU, DMA engine, MATH and GEMM units, TCM and HBM ports. `where`
 * ("sip0", "sip0/cube3", "sip0/cube3/pe2") lives until fn returns; r->name is the kind.
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
 * Command path, one store-and-forward step at a time (each returns the arrival time at the
 * next component). A CPU hop starts at max(arrival, the CPU's free time) and takes its
 * overhead; links add latency + bytes/bandwidth. The launch code composes them and fans out:
 * one message host -> IO_CPU, one per cube IO_CPU -> M_CPU, one per PE M_CPU -> PE_CPU;
 * completions are aggregated the other way (per cube at M_CPU, per SIP at IO_CPU).
 */
kb_time kb_machine_cmd_host_to_iocpu(kb_machine *m, unsigned gsip, kb_time t, uint64_t bytes);
kb_time kb_machine_cmd_iocpu_to_mcpu(kb_machine *m, unsigned gsip, unsigned cube, kb_time t,
                                     uint64_t bytes);
kb_time kb_machine_cmd_mcpu_to_pe(kb_machine *m, kb_pe_hw *pe, kb_time t, uint64_t bytes);
kb_time kb_machine_cmd_pe_to_mcpu(kb_machine *m, kb_pe_hw *pe, kb_time t, uint64_t bytes);
kb_time kb_machine_cmd_mcpu_to_iocpu(kb_machine *m, unsigned gsip, unsigned cube, kb_time t,
                                     uint64_t bytes);
kb_time kb_machine_cmd_iocpu_to_host(kb_machine *m, unsigned gsip, kb_time t, uint64_t bytes);

/* Number of UCIe hops between two cubes of a SIP (XY routing) / SIP hops between SIPs. */
int kb_machine_cube_hops(const kb_machine *m, unsigned cube_a, unsigned cube_b);
int kb_machine_sip_hops(const kb_machine *m, unsigned sip_a, unsigned sip_b);

#endif
