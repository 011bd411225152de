/*
 * kb_schema — the table of every topology key (path, type, offset, default, range, doc) and
 * the scalar parser that enforces it and the layers' own tables (ccl/kb_ccl_config.c).
 * kb_config.c walks YAML documents and --set paths against these tables;
 * docs/config-reference.md lists them.
 * Integer ranges are stored as doubles, which is exact for every bound used here (< 2^53).
 * Defaults are "defaults, not measurements": a plausible accelerator, not a measured one.
 */
#include "kb_schema.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kb_config.h"

#define MIB (1048576.0)
#define GIB (1073741824.0)
#define MAX_NS 1e9   /* one simulated second: anything above is surely a unit mistake */
#define MAX_GBPS 1e6 /* 1 PB/s */
#define MIN_GBPS KB_CFG_MIN_RATE

#define T_ kb_topo_cfg
/* A link or memory port: bandwidth_gbps and latency_ns under section p. */
#define K_LINK(p, f, bw, lat, what)                                                         \
    KB_SCHEMA_DBL(T_, p ".bandwidth_gbps", f.bandwidth_gbps, bw, MIN_GBPS, MAX_GBPS,                \
          what " bandwidth (GB/s = bytes per ns)"),                                         \
    KB_SCHEMA_DBL(T_, p ".latency_ns", f.latency_ns, lat, 0.0, MAX_NS, what " latency (ns)")

const char *const kb_schema_sip_topologies[KB_SIPTOPO_COUNT + 1] = {
    [KB_SIPTOPO_RING_1D] = "ring_1d", [KB_SIPTOPO_TORUS_2D] = "torus_2d",
    [KB_SIPTOPO_MESH_2D] = "mesh_2d", [KB_SIPTOPO_MESH_2D_NO_WRAP] = "mesh_2d_no_wrap", NULL
};
static const char *const pe_layouts[] = {"corners", NULL};
const char *const kb_schema_noc_topologies[] = {"mesh", "crossbar", "bus", NULL};
const char *const kb_schema_switch_arbitrations[] = {"route", "per_sip", NULL};
const char *const kb_schema_io_completions[] = {"per_cube", "tree", NULL};

/* In configs/topology.yaml order, the machine's hierarchy from the outside in: system > host >
 * sip > cube > pe (key listings and the docs check follow it). */
static const kb_schema_key topo_keys[] = {
    KB_SCHEMA_INT(T_, "system.sips.count", sips_count, "2", 1, 256,
          "number of SIPs (devices = ranks) in the system (count)"),
    KB_SCHEMA_ENUM(T_, "system.sips.topology", sips_topology, "ring_1d", kb_schema_sip_topologies,
           "how the SIPs are linked through the switch (name)"),
    KB_SCHEMA_DBL(T_, "system.switch.overhead_ns", switch_overhead_ns, "5", 0.0, MAX_NS,
          "switch traversal cost per inter-SIP hop (ns)"),
    KB_SCHEMA_ENUM(T_, "system.switch.arbitration", switch_arbitration, "per_sip",
           kb_schema_switch_arbitrations,
           "when a transfer that leaves its SIP books the rest of its route: route (all of it "
           "at once, from one start) or per_sip (each SIP's part when the data's head reaches "
           "it; the switch buffers) (name)"),
    K_LINK("system.inter_sip_link", inter_sip, "100", "500", "inter-SIP link"),
    K_LINK("host.pcie", pcie, "64", "1000", "host-to-SIP PCIe link"),
    KB_SCHEMA_DBL(T_, "host.pcie_ep.overhead_ns", pcie_ep_overhead_ns, "100", 0.0, MAX_NS,
          "PCIe endpoint processing cost per command (ns)"),
    KB_SCHEMA_DBL(T_, "host.overhead_ns", host_overhead_ns, "1000", 0.0, MAX_NS,
          "host-side software cost per command (ns)"),
    KB_SCHEMA_DBL(T_, "sip.io_cpu.overhead_ns", io_cpu_overhead_ns, "200", 0.0, MAX_NS,
          "IO_CPU forwarding cost per command (ns)"),
    KB_SCHEMA_ENUM(T_, "sip.io_cpu.completions", io_completions, "per_cube",
           kb_schema_io_completions,
           "how a launch's completion reaches the IO_CPU: per_cube (every cube's M_CPU reports, "
           "the IO_CPU handles the reports one by one) or tree (the M_CPUs combine them up a "
           "binary tree over the cubes, cube c reporting to cube (c-1)/2, and cube 0's alone "
           "reaches the IO_CPU) (name)"),
    KB_SCHEMA_INT(T_, "sip.cube_mesh.width", cube_mesh_width, "4", 1, 32,
          "cubes per row of the SIP's cube mesh (count; width*height <= 32)"),
    KB_SCHEMA_INT(T_, "sip.cube_mesh.height", cube_mesh_height, "4", 1, 32,
          "cubes per column of the SIP's cube mesh (count; width*height <= 32)"),
    K_LINK("sip.ucie", ucie, "256", "20", "cube-to-cube UCIe link"),
    KB_SCHEMA_DBL(T_, "cube.m_cpu.overhead_ns", m_cpu_overhead_ns, "50", 0.0, MAX_NS,
          "M_CPU forwarding cost per command (ns)"),
    KB_SCHEMA_ENUM(T_, "cube.noc.topology", noc_topology, "mesh", kb_schema_noc_topologies,
           "the cube NoC: mesh (routers, XY routing), crossbar, or bus (one resource per cube, "
           "half-duplex memory ports: the model before issue #29) (name)"),
    KB_SCHEMA_INT(T_, "cube.noc.width", noc_width, "0", 0, 16,
          "mesh routers per row; 0 = derived (count; width*height = PEs per cube)"),
    KB_SCHEMA_INT(T_, "cube.noc.height", noc_height, "0", 0, 16,
          "mesh routers per column; 0 = derived (count; width*height = PEs per cube)"),
    K_LINK("cube.noc", noc, "512", "5", "cube NoC link (per direction; bus: the whole NoC)"),
    KB_SCHEMA_U64(T_, "cube.sram.size_bytes", sram_size_bytes, "33554432", 1, 512 * MIB,
          "cube SRAM capacity (bytes, <= 512 MiB)"),
    K_LINK("cube.sram", sram, "1024", "10", "cube SRAM port"),
    KB_SCHEMA_U64(T_, "cube.hbm.size_bytes", hbm_size_bytes, "51539607552", 1, 128 * GIB,
          "HBM stack capacity per cube, split evenly into PE slices (bytes, <= 128 GiB)"),
    K_LINK("cube.hbm", hbm, "256", "100", "HBM port of one PE slice"),
    KB_SCHEMA_ENUM(T_, "cube.pe_layout", pe_layout, "corners", pe_layouts,
           "how PEs are placed in the cube (name)"),
    KB_SCHEMA_INT(T_, "cube.corners", corners, "4", 1, 16,
          "PE groups (corners) per cube (count; corners*pe_per_corner <= 16)"),
    KB_SCHEMA_INT(T_, "cube.pe_per_corner", pe_per_corner, "2", 1, 16,
          "PEs per corner (count; corners*pe_per_corner <= 16)"),
    KB_SCHEMA_DBL(T_, "pe.cpu.overhead_ns", pe_cpu_overhead_ns, "2", 0.0, MAX_NS,
          "PE_CPU issue cost of every tl call (ns)"),
    KB_SCHEMA_DBL(T_, "pe.dma.setup_ns", dma_setup_ns, "20", 0.0, MAX_NS,
          "fixed PE_DMA cost per transfer (ns)"),
    KB_SCHEMA_DBL(T_, "pe.dma.bandwidth_gbps", dma_bandwidth_gbps, "128", MIN_GBPS, MAX_GBPS,
          "PE_DMA throughput of one channel (GB/s = bytes per ns)"),
    KB_SCHEMA_INT(T_, "pe.dma.channels", dma_channels, "4", 1, 64,
          "PE_DMA channels that transfer concurrently (count)"),
    KB_SCHEMA_DBL(T_, "pe.math.fixed_ns", math_fixed_ns, "4", 0.0, MAX_NS,
          "fixed PE_MATH cost per vector op (ns)"),
    KB_SCHEMA_DBL(T_, "pe.math.lanes_per_ns", math_lanes_per_ns, "64", MIN_GBPS, 1e9,
          "PE_MATH throughput (elements per ns)"),
    KB_SCHEMA_DBL(T_, "pe.gemm.fixed_ns", gemm_fixed_ns, "16", 0.0, MAX_NS,
          "fixed PE_GEMM cost per gemm (ns)"),
    KB_SCHEMA_DBL(T_, "pe.gemm.flops_per_ns", gemm_flops_per_ns, "4096", MIN_GBPS, 1e12,
          "PE_GEMM throughput (flops per ns; a gemm is 2*M*N*K flops)"),
    /* number formats (issue #16): rates relative to flops_per_ns (the f16/bf16 rate) */
    KB_SCHEMA_POS(T_, "pe.gemm.int8_speedup", gemm_int8_speedup, "2", 64,
          "PE_GEMM int8 rate / flops_per_ns (factor)"),
    KB_SCHEMA_POS(T_, "pe.gemm.fp8_speedup", gemm_fp8_speedup, "2", 64,
          "PE_GEMM fp8 (e4m3, e5m2) rate / flops_per_ns (factor)"),
    KB_SCHEMA_POS(T_, "pe.gemm.mxint8_speedup", gemm_mxint8_speedup, "2", 64,
          "PE_GEMM MXINT8 rate / flops_per_ns (factor)"),
    KB_SCHEMA_POS(T_, "pe.gemm.sparse_speedup", gemm_sparse_speedup, "2", 64,
          "PE_GEMM 2:4-sparse rate / the dense rate of the same format (factor)"),
    KB_SCHEMA_INT(T_, "pe.scheduler.tile_m", sched_tile_m, "128", 1, 65536,
          "SchedulerV2 gemm tile rows (elements)"),
    KB_SCHEMA_INT(T_, "pe.scheduler.tile_n", sched_tile_n, "128", 1, 65536,
          "SchedulerV2 gemm tile columns (elements)"),
    KB_SCHEMA_INT(T_, "pe.scheduler.tile_k", sched_tile_k, "128", 1, 65536,
          "SchedulerV2 gemm tile depth (elements)"),
    KB_SCHEMA_U64(T_, "pe.tcm.size_bytes", tcm_size_bytes, "16777216", 1, 128 * MIB,
          "TCM capacity per PE (bytes, <= 128 MiB)"),
    KB_SCHEMA_U64(T_, "pe.tcm.scheduler_reserved_bytes", tcm_scheduler_reserved_bytes, "4194304", 0,
          128 * MIB, "TCM bytes reserved for SchedulerV2 tiles (bytes, < pe.tcm.size_bytes)"),
    K_LINK("pe.tcm", tcm, "1024", "2", "TCM port"),
    KB_SCHEMA_U64(T_, "pe.scratch.size_bytes", scratch_size_bytes, "8388608", 0, 128 * MIB,
          "scratch memory per PE (bytes, <= 128 MiB)"),
    KB_SCHEMA_U64(T_, "pe.ipcq.area_bytes", ipcq_area_bytes, "8388608", 1, 128 * MIB,
          "IPCQ ring area per PE (bytes, <= 128 MiB)"),
    KB_SCHEMA_DBL(T_, "pe.ipcq.overhead_ns", ipcq_overhead_ns, "10", 0.0, MAX_NS,
          "PE_IPCQ cost per send or recv (ns)"),
    KB_SCHEMA_DBL(T_, "pe.ipcq.credit_latency_ns", ipcq_credit_latency_ns, "20", 0.0, MAX_NS,
          "time for a credit to travel back to the sender (ns)"),
};
#undef T_

const kb_schema_scope kb_schema_topo = {
    "", {topo_keys, NULL}, {KB_SCHEMA_NKEYS(topo_keys), 0}, {0, 0}, NULL};

const kb_schema_key *kb_schema_at(const kb_schema_scope *sc, size_t idx, size_t *off)
{
    for (int t = 0; t < 2; t++) {
        for (size_t i = 0; sc->tab[t] && i < sc->n[t]; i++) {
            const kb_schema_key *k = &sc->tab[t][i];
            if (t == 1 && sc->skip && strcmp(k->path, sc->skip) == 0)
                continue;
            if (idx-- == 0) {
                if (off)
                    *off = k->off + sc->adj[t];
                return k;
            }
        }
    }
    return NULL;
}

const kb_schema_key *kb_schema_find(const kb_schema_scope *sc, const char *rel, size_t *off)
{
    const kb_schema_key *k;
    size_t o;

    for (size_t i = 0; (k = kb_schema_at(sc, i, &o)) != NULL; i++) {
        if (strcmp(k->path, rel) == 0) {
            if (off)
                *off = o;
            return k;
        }
    }
    return NULL;
}

/* If rel is a proper prefix of path ending at a '.', returns the rest after the dot. */
static const char *under(const char *path, const char *rel)
{
    size_t n = strlen(rel);

    if (n == 0)
        return path;
    if (strncmp(path, rel, n) == 0 && path[n] == '.')
        return path + n + 1;
    return NULL;
}

int kb_schema_is_section(const kb_schema_scope *sc, const char *rel)
{
    const kb_schema_key *k;

    for (size_t i = 0; (k = kb_schema_at(sc, i, NULL)) != NULL; i++)
        if (under(k->path, rel))
            return 1;
    return 0;
}

void kb_schema_children(const kb_schema_scope *sc, const char *rel, char *buf, size_t cap)
{
    const kb_schema_key *k;
    size_t len = 0;

    if (cap == 0)
        return;
    buf[0] = '\0';
    for (size_t i = 0; (k = kb_schema_at(sc, i, NULL)) != NULL; i++) {
        const char *rest = under(k->path, rel);
        const char *dot;
        size_t clen;
        int seen = 0;

        if (!rest)
            continue;
        dot = strchr(rest, '.');
        clen = dot ? (size_t)(dot - rest) : strlen(rest);
        /* Skip components already listed by an earlier key of the same section. */
        for (size_t j = 0; j < i && !seen; j++) {
            const char *r2 = under(kb_schema_at(sc, j, NULL)->path, rel);
            seen = r2 && strncmp(r2, rest, clen) == 0 && (r2[clen] == '.' || r2[clen] == '\0');
        }
        if (seen)
            continue;
        if (len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s%.*s", len ? ", " : "", (int)clen,
                                    rest);
    }
}

void kb_schema_type_text(const kb_schema_key *k, char *buf, size_t cap)
{
    static const char *const names[] = {"int", "int64", "uint64", "double", "bool", "string"};
    size_t len;

    if (k->type != KB_ST_ENUM) {
        assert((unsigned)k->type < sizeof names / sizeof names[0]);
        snprintf(buf, cap, "%s", names[k->type]);
        return;
    }
    len = (size_t)snprintf(buf, cap, "enum:");
    for (const char *const *a = k->allowed; *a && len < cap; a++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", a == k->allowed ? " " : "|", *a);
}

const char *kb_schema_num_text(double v, char *buf, size_t cap)
{
    char t[40], *e;
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, v);
        if (strtod(t, NULL) == v)
            break;
    }
    /* "1e+06" -> "1e6", "1e-05" -> "1e-5": the form the docs and the files use */
    if ((e = strchr(t, 'e')) != NULL) {
        char *d = e + 1, *q = e + 1;
        if (*q == '+')
            q++;
        else if (*q == '-')
            *d++ = *q++;
        while (*q == '0' && q[1])
            q++;
        memmove(d, q, strlen(q) + 1);
    }
    snprintf(buf, cap, "%s", t);
    return buf;
}

const char *kb_schema_range_text(const kb_schema_key *k, char *buf, size_t cap)
{
    char lo[32], hi[32];
    if (k->type == KB_ST_DOUBLE) {
        kb_schema_num_text(k->lo, lo, sizeof lo);
        kb_schema_num_text(k->hi, hi, sizeof hi);
    } else { /* integers in full: 134217728, not 1.34e8 */
        snprintf(lo, sizeof lo, "%.0f", k->lo);
        snprintf(hi, sizeof hi, "%.0f", k->hi);
    }
    snprintf(buf, cap, "%s%s, %s]", k->lo_open ? "(" : "[", lo, hi);
    return buf;
}

static int is_null(const char *s)
{
    return s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* Decimal or 0x-hex integer with optional sign, nothing else; -2 when it overflows int64. */
static int parse_i64(const char *s, int64_t *out)
{
    const char *p = s;
    char *end;
    long long v;
    int base = 10;

    if (*p == '+' || *p == '-')
        p++;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
        base = 16;
    if (!isxdigit((unsigned char)p[base == 16 ? 2 : 0]))
        return -1;
    errno = 0;
    v = strtoll(s, &end, base);
    if (*end != '\0')
        return -1;
    if (errno == ERANGE)
        return -2;
    *out = (int64_t)v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    double v;

    if (s[0] == '\0' || isspace((unsigned char)s[0]))
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno == ERANGE || *end != '\0' || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"true", "yes", "on"};
    static const char *const no[] = {"false", "no", "off"};

    for (size_t i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

static void allowed_text(const char *const *al, char *buf, size_t cap)
{
    size_t len = 0;

    buf[0] = '\0';
    for (; *al && len < cap; al++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", *al);
}

int kb_schema_parse(const kb_schema_key *k, const char *full, const char *text, int quoted,
                    void *dst, kb_errbuf *eb)
{
    char list[256], range[80], num[32];
    int64_t iv;
    double dv;
    int bv, rc;
    size_t len;

    if (!quoted && is_null(text))
        return kb_err_set(eb, KB_ERR_CONFIG, "missing value for %s", full);
    switch (k->type) {
    case KB_ST_INT:
    case KB_ST_INT64:
    case KB_ST_U64:
        if (quoted)
            return kb_err_set(eb, KB_ERR_CONFIG,
                              "expected an integer for %s, got the quoted string '%.64s'", full,
                              text);
        rc = parse_i64(text, &iv);
        if (rc == -1)
            return kb_err_set(eb, KB_ERR_CONFIG, "expected an integer for %s, got '%.64s'", full,
                              text);
        if (rc == -2 || (double)iv < k->lo || (double)iv > k->hi)
            return kb_err_set(eb, KB_ERR_CONFIG, "%s = %.64s is out of range %s", full, text,
                              kb_schema_range_text(k, range, sizeof range));
        if (k->type == KB_ST_INT) {
            int v = (int)iv;
            memcpy(dst, &v, sizeof v);
        } else if (k->type == KB_ST_INT64) {
            memcpy(dst, &iv, sizeof iv);
        } else {
            uint64_t v = (uint64_t)iv;
            memcpy(dst, &v, sizeof v);
        }
        return 0;
    case KB_ST_DOUBLE:
        if (quoted)
            return kb_err_set(eb, KB_ERR_CONFIG,
                              "expected a number for %s, got the quoted string '%.64s'", full,
                              text);
        if (parse_double(text, &dv) != 0)
            return kb_err_set(eb, KB_ERR_CONFIG, "expected a number for %s, got '%.64s'", full,
                              text);
        if ((k->lo_open ? dv <= k->lo : dv < k->lo) || dv > k->hi)
            return kb_err_set(eb, KB_ERR_CONFIG, "%s = %s is out of range %s", full,
                              kb_schema_num_text(dv, num, sizeof num),
                              kb_schema_range_text(k, range, sizeof range));
        memcpy(dst, &dv, sizeof dv);
        return 0;
    case KB_ST_BOOL:
        if (quoted || parse_bool(text, &bv) != 0)
            return kb_err_set(eb, KB_ERR_CONFIG, "expected a boolean (true or false) for %s, "
                              "got %s'%.64s'", full, quoted ? "the quoted string " : "", text);
        memcpy(dst, &bv, sizeof bv);
        return 0;
    case KB_ST_STRING:
    case KB_ST_ENUM:
        /* KB_SCHEMA_STR / _ENUM record the field's capacity, and an enum its names */
        assert(k->size > 0 && (k->type != KB_ST_ENUM || k->allowed));
        len = strlen(text);
        if (len == 0)
            return kb_err_set(eb, KB_ERR_CONFIG, "missing value for %s", full);
        if (len >= k->size)
            return kb_err_set(eb, KB_ERR_CONFIG, "value for %s is too long (%zu characters, "
                              "at most %zu)", full, len, k->size - 1);
        if (k->type == KB_ST_ENUM) {
            const char *const *a = k->allowed;
            while (*a && strcmp(*a, text) != 0)
                a++;
            if (!*a) {
                allowed_text(k->allowed, list, sizeof list);
                return kb_err_set(eb, KB_ERR_CONFIG, "invalid value '%.64s' for %s (allowed: %s)",
                                  text, full, list);
            }
        } else {
            for (const char *p = text; *p; p++)
                if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
                    return kb_err_set(eb, KB_ERR_CONFIG, "invalid character '%c' in value "
                                      "'%.64s' for %s (allowed: letters, digits, '_', '-', '.')",
                                      *p, text, full);
        }
        memset(dst, 0, k->size);
        memcpy(dst, text, len);
        return 0;
    }
    return kb_err_set(eb, KB_ERR_CONFIG, "internal: bad type for %s", full);
}

void kb_schema_apply_defaults(const kb_schema_scope *sc, void *base)
{
    const kb_schema_key *k;
    size_t off;

    for (size_t i = 0; (k = kb_schema_at(sc, i, &off)) != NULL; i++) {
        int rc = kb_schema_parse(k, k->path, k->dflt, 0, (char *)base + off, NULL);

        /* The built-in defaults must satisfy their own schema (test_config checks it too). */
        assert(rc == 0);
        (void)rc;
    }
}
