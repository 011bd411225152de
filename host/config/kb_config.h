/*
 * kb_config — kbcl's configuration: the machine (configs/topology.yaml) and the collective
 * library (configs/ccl.yaml), loaded with libyaml against a typed schema.
 *
 * Every field has a default (the two configs/ files hold the same defaults, documented in
 * place), a type, a range and a unit in its name (_ns, _gbps = GB/s = bytes/ns, _bytes,
 * _per_ns). Loading rejects unknown keys, wrong types and out-of-range values with a message
 * "FILE:LINE:COLUMN: ..." (1-based line and column of the offending node), and reports YAML
 * syntax errors (bad indentation ...) the same way. kb_config_set() applies one "a.b.c=value"
 * override with the same checks; topology keys are top-level (system.sips.count), ccl keys
 * start with "ccl." (ccl.defaults.n_slots). kb_config_validate() checks cross-field rules.
 *
 * Ownership: a kb_config is a plain struct the caller owns; strings inside are fixed arrays,
 * the algorithm table is a fixed array, so there is nothing to free (kb_config_fini exists
 * for symmetry and future heap members).
 */
#ifndef KB_CONFIG_H
#define KB_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"

#define KB_CFG_NAME_MAX 64
#define KB_CFG_MAX_ALGOS 32

/* A link or memory port: bandwidth and latency. */
typedef struct kb_cfg_link {
    double bandwidth_gbps; /* GB/s (= bytes per ns), > 0 */
    double latency_ns;     /* >= 0 */
} kb_cfg_link;

typedef struct kb_topo_cfg {
    /* system */
    int sips_count;                          /* system.sips.count, 1..256 */
    char sips_topology[KB_CFG_NAME_MAX];     /* system.sips.topology: ring_1d torus_2d mesh_2d mesh_2d_no_wrap */
    double switch_overhead_ns;               /* system.switch.overhead_ns */
    kb_cfg_link inter_sip;                   /* system.inter_sip_link.{bandwidth_gbps,latency_ns} */
    /* host */
    kb_cfg_link pcie;                        /* host.pcie.{bandwidth_gbps,latency_ns} */
    double pcie_ep_overhead_ns;              /* host.pcie_ep.overhead_ns */
    double host_overhead_ns;                 /* host.overhead_ns: host-side cost per command */
    /* sip */
    double io_cpu_overhead_ns;               /* sip.io_cpu.overhead_ns */
    int cube_mesh_width, cube_mesh_height;   /* sip.cube_mesh.{width,height}, product 1..32 */
    kb_cfg_link ucie;                        /* sip.ucie.{bandwidth_gbps,latency_ns} */
    /* cube */
    double m_cpu_overhead_ns;                /* cube.m_cpu.overhead_ns */
    kb_cfg_link noc;                         /* cube.noc.{bandwidth_gbps,latency_ns} */
    uint64_t sram_size_bytes;                /* cube.sram.size_bytes */
    kb_cfg_link sram;                        /* cube.sram.{bandwidth_gbps,latency_ns} */
    uint64_t hbm_size_bytes;                 /* cube.hbm.size_bytes (split evenly into PE slices) */
    kb_cfg_link hbm;                         /* cube.hbm.{bandwidth_gbps,latency_ns}, per PE slice port */
    char pe_layout[KB_CFG_NAME_MAX];         /* cube.pe_layout: corners */
    int corners;                             /* cube.corners, >= 1 */
    int pe_per_corner;                       /* cube.pe_per_corner, >= 1; corners*pe_per_corner <= 16 */
    /* pe */
    double pe_cpu_overhead_ns;               /* pe.cpu.overhead_ns: issue cost of every tl call */
    double dma_setup_ns;                     /* pe.dma.setup_ns: fixed cost per DMA */
    double dma_bandwidth_gbps;               /* pe.dma.bandwidth_gbps: engine throughput */
    int dma_channels;                        /* pe.dma.channels: virtual channels, >= 1 */
    double math_fixed_ns;                    /* pe.math.fixed_ns */
    double math_lanes_per_ns;                /* pe.math.lanes_per_ns: elements per ns */
    double gemm_fixed_ns;                    /* pe.gemm.fixed_ns */
    double gemm_flops_per_ns;                /* pe.gemm.flops_per_ns (2*M*N*K flops per gemm) */
    int sched_tile_m, sched_tile_n, sched_tile_k; /* pe.scheduler.tile_{m,n,k}: SchedulerV2 tiles */
    uint64_t tcm_size_bytes;                 /* pe.tcm.size_bytes (<= 128 MiB) */
    uint64_t tcm_scheduler_reserved_bytes;   /* pe.tcm.scheduler_reserved_bytes (< size) */
    kb_cfg_link tcm;                         /* pe.tcm.{bandwidth_gbps,latency_ns} */
    uint64_t scratch_size_bytes;             /* pe.scratch.size_bytes (<= 128 MiB) */
    uint64_t ipcq_area_bytes;                /* pe.ipcq.area_bytes: IPCQ ring area (<= 128 MiB) */
    double ipcq_overhead_ns;                 /* pe.ipcq.overhead_ns: per send/recv */
    double ipcq_credit_latency_ns;           /* pe.ipcq.credit_latency_ns */
} kb_topo_cfg;

/* ccl.yaml: defaults and per-algorithm overrides. 0 / "" in an algorithm entry = inherit. */
typedef struct kb_ccl_params {
    char algorithm[KB_CFG_NAME_MAX];   /* defaults only: the algorithm to run */
    char buffer_kind[16];              /* tcm | hbm | sram */
    int backpressure;                  /* bool */
    int n_slots;                       /* >= 1 */
    uint64_t slot_size;                /* bytes, >= 16 */
    uint64_t vc_chunk_size;            /* bytes */
    uint64_t ipcq_credit_size_bytes;   /* bytes */
    int world_size;                    /* 0 = derive (SIP count); > 0 = legacy rank = PE */
    int64_t n_elem;                    /* elements per rank tile, 0 = bench default */
} kb_ccl_params;

typedef struct kb_ccl_algo {
    char name[KB_CFG_NAME_MAX];        /* key under algorithms: */
    char module[KB_CFG_NAME_MAX];      /* algorithm implementation (kernel) name */
    char topology[KB_CFG_NAME_MAX];
    char mapper[KB_CFG_NAME_MAX];
    char validator[KB_CFG_NAME_MAX];
    int root_cube;                     /* -1 = unset */
    kb_ccl_params p;                   /* overrides; unset fields are 0 / "" / -1 (backpressure) */
    int line;                          /* where it was defined, for messages */
} kb_ccl_algo;

typedef struct kb_ccl_cfg {
    kb_ccl_params defaults;
    kb_ccl_algo algos[KB_CFG_MAX_ALGOS];
    int nalgos;
} kb_ccl_cfg;

typedef struct kb_config {
    kb_topo_cfg topo;
    kb_ccl_cfg ccl;
    char topo_path[512];   /* "" = built-in defaults */
    char ccl_path[512];
} kb_config;

/* Fills every field with its default (the built-in default machine; no algorithms). */
void kb_config_defaults(kb_config *cfg);
void kb_config_fini(kb_config *cfg);

/* Loads a topology file over cfg->topo (fields not in the file keep their current values). */
int kb_config_load_topology(kb_config *cfg, const char *path, kb_errbuf *eb);
/* Loads a ccl file over cfg->ccl. */
int kb_config_load_ccl(kb_config *cfg, const char *path, kb_errbuf *eb);

/* Applies "a.b.c=value" (topology keys, or ccl.<...> keys, incl. ccl.algorithms.<name>.<key>). */
int kb_config_set(kb_config *cfg, const char *assignment, kb_errbuf *eb);

/* Cross-field checks (mesh size, PE count, sizes fit their PhysAddr windows ...). */
int kb_config_validate(const kb_config *cfg, kb_errbuf *eb);

/* Looks up an algorithm entry by name; NULL when absent. */
const kb_ccl_algo *kb_config_find_algo(const kb_config *cfg, const char *name);

/*
 * Effective parameters of an algorithm: its overrides on top of the defaults (the
 * algorithm > defaults precedence of DESIGN §8). algo may be NULL (defaults only).
 */
kb_ccl_params kb_config_algo_params(const kb_config *cfg, const kb_ccl_algo *algo);

/* Derived counts. */
static inline int kb_topo_pes_per_cube(const kb_topo_cfg *t) { return t->corners * t->pe_per_corner; }
static inline int kb_topo_cubes_per_sip(const kb_topo_cfg *t) { return t->cube_mesh_width * t->cube_mesh_height; }
static inline int kb_topo_total_pes(const kb_topo_cfg *t)
{
    return t->sips_count * kb_topo_cubes_per_sip(t) * kb_topo_pes_per_cube(t);
}

/*
 * Calls fn for every schema key (dotted path, type name, default as text, doc) in file order;
 * used by `kbcl config --keys` and the docs check.
 */
typedef void (*kb_config_key_fn)(const char *path, const char *type, const char *dflt,
                                 const char *doc, void *ud);
void kb_config_foreach_key(kb_config_key_fn fn, void *ud);

#endif
