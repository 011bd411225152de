/*
 * kb_roofline — the lower bound a workload's own work sets on a machine (docs/decoder.md,
 * "Roofline"): the time its units need for its flops at their peak, its memory ports for the
 * bytes they must move, and each level of links for the bytes that must cross it. The three
 * can overlap, so the largest is the bound (roofline_ns) and names what bounds it (compute,
 * memory or comm); a simulated run can only be slower.
 *
 * This module holds the machine side: an accumulator the layers above feed with what their
 * workload must do, and the arithmetic that turns it into times with the rates of the loaded
 * machine (its kb_res bandwidths, the gemm unit's per-format rate of kb_tl_q.h):
 *  - compute: flops of a number format spread over P PEs take flops / (P x the format's
 *    PE_GEMM rate); calls add up (one gemm unit does them one after another);
 *  - memory (HBM): bytes pinned to a PE's HBM slice (only its port can serve them) take
 *    bytes / port bandwidth on that port, and every byte together over the P PEs' ports
 *    bytes / (P x bandwidth); reads and writes use the two sides of a full-duplex port apart,
 *    one side with topology bus; the larger of the two forms;
 *  - comm: three levels of links, each with groups: SIPs (their inter-SIP links), cubes
 *    (UCIe links, and the inter-SIP links of the gateway cube 0) and PEs (the NoC links out of
 *    the PE's router and the UCIe or inter-SIP links attached there; no PE level with the bus
 *    NoC). A group's `cut` bytes must leave (or enter) it: cut / its egress bandwidth; `total`
 *    bytes must cross the level somewhere: total / the egress bandwidth of every group in use.
 *    Links are symmetric (a group's ingress equals its egress). The last byte still crosses a
 *    link after it leaves, so a level with traffic takes that plus one link latency; and data
 *    that must travel h hops of a level take h latencies: `depth` hops per step, the steps one
 *    after another (a chain of dependent collectives), the largest of a step's.
 * The host is not a path (collectives never route through it) and fixed per-use costs (DMA
 * setup, a unit's fixed_ns) are not limits of the machine, so neither is counted.
 * Ownership: an accumulator belongs to its creator (kb_roofline_acc_destroy) and borrows the
 * machine, which must outlive it.
 */
#ifndef KB_ROOFLINE_H
#define KB_ROOFLINE_H

#include <stdint.h>

#include "kb_err.h"
#include "kb_machine.h"
#include "kb_tl_q.h"
#include "kbcl_runtime.h" /* kb_roofline */

typedef struct kb_roofline_acc kb_roofline_acc;

int kb_roofline_acc_create(const kb_machine *m, kb_roofline_acc **out, kb_errbuf *eb);
void kb_roofline_acc_destroy(kb_roofline_acc *a);
const kb_machine *kb_roofline_machine(const kb_roofline_acc *a);

/* Global PE index (sip, cube, pe) as kb_pe_hw.gid numbers it. */
static inline int kb_roofline_gid(const kb_machine *m, int sip, int cube, int pe)
{
    return (sip * m->ncubes + cube) * m->npes + pe;
}

/* flops of fmt (2:4 sparse or not) on the gemm units of `pes` PEs; tl_dot's work (any dtype)
 * is KB_QF_F16 dense: the unit's base rate. */
void kb_roofline_flops(kb_roofline_acc *a, kb_qfmt fmt, int sparse, double flops, int pes);
/* HBM bytes read and written in PE gid's slice. */
void kb_roofline_mem_pe(kb_roofline_acc *a, int gid, double rd, double wr);
/* HBM bytes the layout spreads over the PEs in use (they count in the aggregate only). */
void kb_roofline_mem_spread(kb_roofline_acc *a, double rd, double wr);
/* The PEs in use, whose ports every byte shares in the aggregate; 0 (the default): the PEs
 * with pinned bytes. Every byte added must lie on them. */
void kb_roofline_mem_pes(kb_roofline_acc *a, int pes);

/* Levels: the group of PE gid, the number of groups, a group's egress in GB/s (INFINITY for
 * an unlimited link; 0 when the group has no link or the level is not modelled), the hops
 * of the level between two PEs (0 when the level does not separate them, or, at the PE
 * level, when they are in different cubes: the cube level counts those). */
int kb_roofline_group(const kb_machine *m, int level, int gid);
int kb_roofline_ngroups(const kb_machine *m, int level);
double kb_roofline_egress_gbps(const kb_machine *m, int level, int group);
int kb_roofline_hops(const kb_machine *m, int level, int gid_a, int gid_b);
/* 0 when the level is not modelled on this machine (the PE level with the bus NoC). */
int kb_roofline_level_modelled(const kb_machine *m, int level);

/* Bytes that must leave (or enter) `group`; bytes that must cross the level among the groups
 * marked in use; a group in use; a step of `hops` hops (steps numbered from 0, in order). */
void kb_roofline_cut(kb_roofline_acc *a, int level, int group, double bytes);
void kb_roofline_total(kb_roofline_acc *a, int level, double bytes);
void kb_roofline_use(kb_roofline_acc *a, int level, int group);
void kb_roofline_depth(kb_roofline_acc *a, int level, int step, int hops);

/* The bound of what was added. */
void kb_roofline_result(const kb_roofline_acc *a, kb_roofline *out);

/*
 * tl_gemm's C (m x n) = A (m x k) @ B (k x n) with elements of es bytes over `pes` PEs (c_gid
 * among them): 2mnk flops at the base rate over them; A and B read once from their HBM
 * slices (spread over the PEs); C written once into PE c_gid's slice (the gemm bench's
 * layout). The stores of C from the other PEs also cross c_gid's router, which is not counted:
 * a schedule could trade them against c_gid's share of the flops.
 */
void kb_roofline_gemm(kb_roofline_acc *a, uint64_t m, uint64_t n, uint64_t k, uint64_t es,
                      int pes, int c_gid);

#endif
