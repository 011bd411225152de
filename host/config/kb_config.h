/*
 * kb_config — the machine's configuration (configs/topology.yaml), loaded with libyaml against
 * a typed schema (kb_schema.h), and the schema-driven YAML loader the layers above reuse for
 * their own files (the collective library's ccl.yaml lives in ccl/kb_ccl_config.h).
 *
 * Every field has a default (the two configs/ files hold the same defaults, documented in
 * place), a type, a range and a unit in its name (_ns, _gbps = GB/s = bytes/ns, _bytes,
 * _per_ns). Loading rejects unknown keys, wrong types and out-of-range values with a message
 * "FILE:LINE:COLUMN: ..." (1-based line and column of the offending node), and reports YAML
 * syntax errors (bad indentation ...) the same way. kb_config_set() applies one "a.b.c=value"
 * override with the same checks (topology keys are top-level: system.sips.count).
 * kb_config_validate() checks cross-field rules.
 *
 * Ownership: a kb_config is a plain struct the caller owns; strings inside are fixed arrays,
 * so there is nothing to free (kb_config_fini exists for symmetry and future heap members).
 */
#ifndef KB_CONFIG_H
#define KB_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"
#include "kb_schema.h"
#include "kbcl_runtime.h" /* kb_config_create, _set, _load_topology */

#define KB_CFG_NAME_MAX 64
/* The smallest bandwidth (GB/s) or rate (items per ns) a resource can have: kb_res counts
 * whole bytes (items) per microsecond. Smaller values are errors, not rounded up. */
#define KB_CFG_MIN_RATE 0.001

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
    char switch_arbitration[KB_CFG_NAME_MAX]; /* system.switch.arbitration: route per_sip */
    kb_cfg_link inter_sip;                   /* system.inter_sip_link.{bandwidth_gbps,latency_ns} */
    /* host */
    kb_cfg_link pcie;                        /* host.pcie.{bandwidth_gbps,latency_ns} */
    double pcie_ep_overhead_ns;              /* host.pcie_ep.overhead_ns */
    double host_overhead_ns;                 /* host.overhead_ns: host-side cost per command */
    /* sip */
    double io_cpu_overhead_ns;               /* sip.io_cpu.overhead_ns */
    char io_completions[KB_CFG_NAME_MAX];    /* sip.io_cpu.completions: per_cube tree */
    int cube_mesh_width, cube_mesh_height;   /* sip.cube_mesh.{width,height}, product 1..32 */
    kb_cfg_link ucie;                        /* sip.ucie.{bandwidth_gbps,latency_ns} */
    /* cube */
    double m_cpu_overhead_ns;                /* cube.m_cpu.overhead_ns */
    kb_cfg_link noc;                         /* cube.noc.{bandwidth_gbps,latency_ns}: per link */
    char noc_topology[KB_CFG_NAME_MAX];      /* cube.noc.topology: mesh crossbar bus */
    int noc_width, noc_height;               /* cube.noc.{width,height}: routers of the mesh,
                                              * 0 = derived from the PE count */
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
    double dma_bandwidth_gbps;               /* pe.dma.bandwidth_gbps: per channel */
    int dma_channels;                        /* pe.dma.channels: concurrent channels, >= 1 */
    double math_fixed_ns;                    /* pe.math.fixed_ns */
    double math_lanes_per_ns;                /* pe.math.lanes_per_ns: elements per ns */
    double gemm_fixed_ns;                    /* pe.gemm.fixed_ns */
    double gemm_flops_per_ns;                /* pe.gemm.flops_per_ns (2*M*N*K flops per gemm) */
    /* pe.gemm.{int8,fp8,mxint8,sparse}_speedup: number-format rates (kb_tl_q) */
    double gemm_int8_speedup, gemm_fp8_speedup, gemm_mxint8_speedup, gemm_sparse_speedup;
    int sched_tile_m, sched_tile_n, sched_tile_k; /* pe.scheduler.tile_{m,n,k}: SchedulerV2 tiles */
    uint64_t tcm_size_bytes;                 /* pe.tcm.size_bytes (<= 128 MiB) */
    uint64_t tcm_scheduler_reserved_bytes;   /* pe.tcm.scheduler_reserved_bytes (< size) */
    kb_cfg_link tcm;                         /* pe.tcm.{bandwidth_gbps,latency_ns} */
    uint64_t scratch_size_bytes;             /* pe.scratch.size_bytes (<= 128 MiB) */
    uint64_t ipcq_area_bytes;                /* pe.ipcq.area_bytes: IPCQ ring area (<= 128 MiB) */
    double ipcq_overhead_ns;                 /* pe.ipcq.overhead_ns: per send/recv */
    double ipcq_credit_latency_ns;           /* pe.ipcq.credit_latency_ns */
} kb_topo_cfg;

typedef struct kb_config {
    kb_topo_cfg topo;
    char topo_path[512];   /* "" = built-in defaults */
} kb_config;

/* Fills every field with its default (the built-in default machine). */
void kb_config_defaults(kb_config *cfg);
void kb_config_fini(kb_config *cfg);

/* kb_config_load_topology and kb_config_set (kbcl_runtime.h) work on the struct as well:
 * loading a topology file changes only the keys it names, and a "ccl." key is an error naming
 * kb_ccl_config_set. */

/* Cross-field checks (mesh size, PE count, sizes fit their PhysAddr windows ...). */
int kb_config_validate(const kb_config *cfg, kb_errbuf *eb);

/* Derived counts. */
static inline int kb_topo_pes_per_cube(const kb_topo_cfg *t) { return t->corners * t->pe_per_corner; }
static inline int kb_topo_cubes_per_sip(const kb_topo_cfg *t) { return t->cube_mesh_width * t->cube_mesh_height; }
/* How the SIPs are linked through the switch (system.sips.topology); kb_schema_sip_topologies
 * holds their names in this order. mesh_2d wraps like torus_2d; mesh_2d_no_wrap does not. */
typedef enum kb_sip_topo {
    KB_SIPTOPO_RING_1D = 0, KB_SIPTOPO_TORUS_2D, KB_SIPTOPO_MESH_2D, KB_SIPTOPO_MESH_2D_NO_WRAP,
    KB_SIPTOPO_COUNT
} kb_sip_topo;
/* system.sips.topology parsed: a kb_sip_topo, or KB_ERR_CONFIG for a name that is none (one
 * kb_config_validate refuses). The machine parses it once (kb_machine.sip_topo). */
int kb_topo_sip_kind(const kb_topo_cfg *t);
/* 1 when a transfer that leaves its SIP books each SIP's part of its route when the data's
 * head reaches that part (system.switch.arbitration per_sip), 0 when it books the whole route
 * at once (route, the default). */
int kb_topo_switch_per_sip(const kb_topo_cfg *t);
/* The cube NoC's model (cube.noc.topology). */
typedef enum kb_noc_kind { KB_NOC_MESH = 0, KB_NOC_CROSSBAR, KB_NOC_BUS } kb_noc_kind;
kb_noc_kind kb_topo_noc_kind(const kb_topo_cfg *t);
/* The mesh's routers per row and column: the configured ones, or (0) the most square
 * w x h = PEs per cube with w >= h (8 PEs: 4 x 2). Valid only for a validated config. */
void kb_topo_noc_dims(const kb_topo_cfg *t, int *w, int *h);
static inline int kb_topo_total_pes(const kb_topo_cfg *t)
{
    return t->sips_count * kb_topo_cubes_per_sip(t) * kb_topo_pes_per_cube(t);
}

/*
 * Calls fn for every topology key (dotted path, type name, default as text, doc) in file
 * order; used by the docs check (tests/test_config.c).
 */
typedef void (*kb_config_key_fn)(const char *path, const char *type, const char *dflt,
                                 const char *doc, void *ud);
void kb_config_foreach_key(kb_config_key_fn fn, void *ud);

/* ---- for the layers above: their own schema-driven files and --set keys ---- */

/* The same for one scope; a key that `inherits` also has shows "inherits <prefix>.<key>". */
void kb_config_foreach_scope(const kb_schema_scope *sc, const kb_schema_scope *inherits,
                             kb_config_key_fn fn, void *ud);

/*
 * One top-level section of a schema-driven YAML file: either one scope instance (`base`), or
 * a mapping of named entries (`entry` != NULL), each a scope instance whose storage entry()
 * returns (creating it when new; NULL with a message in eb when it cannot), or a list of
 * plain text items (`item` != NULL, scope NULL): item() takes each one in order and returns 0
 * or an error code with a message in eb (the loader prefixes FILE:LINE:COLUMN).
 */
typedef void *(*kb_cfg_entry_fn)(void *ud, const char *name, int line, kb_errbuf *eb);
typedef int (*kb_cfg_item_fn)(void *ud, const char *value, kb_errbuf *eb);
typedef struct kb_cfg_section {
    const char *key;              /* top-level key ("defaults") */
    const char *disp;             /* prefix of full paths in messages ("ccl.defaults") */
    const kb_schema_scope *scope;
    void *base;                   /* plain section: the struct it fills */
    kb_cfg_entry_fn entry;        /* named entries: storage of one entry */
    void *ud;
    const char *entry_what;       /* "algorithm": what an entry is called in messages */
    kb_cfg_item_fn item;          /* list section: takes one item */
} kb_cfg_section;

/* Loads the file's sections into their targets (in place: callers that need all-or-nothing
 * load into a copy). Errors carry FILE:LINE:COLUMN like the topology loader's. */
int kb_config_load_sections(const char *path, const kb_cfg_section *secs, size_t n,
                            kb_errbuf *eb);

/* Splits "key = value" into buf (trimmed; surviving quotes mean a string: *quoted = 1). */
int kb_config_parse_assignment(const char *assignment, char *buf, size_t cap, char **path,
                               char **value, int *quoted, kb_errbuf *eb);
/* Parses value into the key at relative path rel of scope sc (base = the scope's struct);
 * disp prefixes full paths in messages. Unknown keys name the nearest section. */
int kb_config_set_in_scope(const kb_schema_scope *sc, const char *disp, void *base,
                           const char *rel, const char *value, int quoted, kb_errbuf *eb);
/* 1 when s is a valid entry name: 1..KB_CFG_NAME_MAX-1 letters, digits, '_' or '-'. */
int kb_config_valid_name(const char *s);
/* A key from a file as an error message may show it: "'key'" when it could be a key of a
 * kbcl file (letters, digits, '_', '-', '.', under 64 characters), else a phrase that shows
 * none of it, so that pointing kbcl at any other file never prints that file's bytes. buf
 * (n >= 72) holds the result; returns buf. */
const char *kb_config_key_shown(const char *k, char *buf, size_t n);

#endif
