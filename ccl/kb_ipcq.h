/*
 * kb_ipcq — the PE_IPCQ model: credit-based queues between PEs, and the kernel-side
 * send/recv calls.
 *
 * Each PE that an install plan wires holds one queue pair per wired direction: the eleven named
 * ones (E W N S, global_E/W/N/S, parent, child_left, child_right) and peer directions
 * KB_DIR_PEER(k) = KB_NDIRS + k ("peer<k>", k = 0 .. KB_IPCQ_MAX_PEER_DIRS - 1), which the
 * full_mesh topology uses (direction KB_DIR_PEER(o - 1) leads to rank r + o mod ws). Queue
 * pairs exist for wired directions only, so a ring install pays for its two and a full mesh of
 * 256 ranks for 255; every ring must fit the PE's ring area (an install that does not fit
 * fails with the bytes it needs). A queue pair knows its peer endpoint
 * (PE, peer rx ring base, n_slots, slot_size), its own rx ring (a real allocation in TCM's ipcq
 * range, the PE's HBM slice or the cube SRAM, per buffer_kind) and four counters: my_head
 * (sends issued), my_tail (receives consumed), peer_head_cache (data tokens seen) and
 * peer_tail_cache (credits seen).
 *
 *  send: blocks while my_head - peer_tail_cache >= n_slots (backpressure); DMAs the value
 *        into peer_rx_base + (my_head mod n_slots) * slot_size; when that DMA completes, a meta
 *        token {dst_addr, sender_seq, nbytes} reaches the receiving PE, which finds the queue
 *        pair whose rx ring contains dst_addr (by address, not by sender coordinates: in a
 *        2-rank ring E and W lead to the same peer) and raises its peer_head_cache.
 *  recv: a posted receive completes when peer_head_cache > my_tail: the slot
 *        my_rx_base + (my_tail mod n_slots) * slot_size is COPIED OUT (to a scratch value or a
 *        destination address) by the receiver's DMA, my_tail advances, and when the copy has
 *        finished a credit {consumer_seq, dst_rx_base_pa} goes back to the sender (after
 *        pe.ipcq.credit_latency_ns plus the route's link latencies), which matches it by its
 *        peer_rx_base and raises peer_tail_cache. Slot reuse rule: a slot is only credited
 *        after the copy that reads it has completed, so no send can overwrite a slot that is
 *        still being read (tested with n_slots = 1).
 *  messages of any size: a value longer than a slot travels as chunks of as many whole
 *        elements as a slot holds, each one slot's message through the credit window (its
 *        own DMA, token and credit). The IPCQ engine issues chunk k+1 as soon as a slot is
 *        free, so it is in flight while the receiver copies out chunk k; a receive posts one
 *        request per chunk at once, so chunks are copied out and credited as they land. A
 *        message that fits one slot is exactly the one-slot protocol above. n_slots and
 *        slot_size are performance parameters, never size limits.
 * tl_recv_async / tl_recv_into_async post a receive that completes in the background; tl_wait
 * collects it. A ring step must post its receive before a send that needs more chunks than
 * the window holds (kb_ccl_sendrecv does), or every rank blocks in its send.
 * Costs: each call pays pe.cpu.overhead_ns + pe.ipcq.overhead_ns before its first DMA; every
 * chunk's DMA pays pe.dma.setup_ns on the engine.
 * Misuse (unwired direction, a receive that names another size than the message) stops the
 * run with a message naming the PE, the direction and the wired directions. A deadlock report includes every wired queue
 * pair's counters. With a trace stream set (KBCL_CCL_TRACE=1), every send/recv prints one line.
 */
#ifndef KB_IPCQ_H
#define KB_IPCQ_H

#include <stdint.h>

#include "kb_runtime.h"
#include "kb_tl.h"
#include "kbcl_ccl.h" /* kb_dir and the kernel side */

/* IPCQ's name for what it returns (and stops a kernel with) for a direction that has no queue
 * pair on the PE; the message names the PE, the direction and the wired ones. */
#define KB_ERR_DIRECTION KB_ERR_UNWIRED

#define KB_IPCQ_MAX_PEER_DIRS 65000
#define KB_IPCQ_MAX_DIRS (KB_NDIRS + KB_IPCQ_MAX_PEER_DIRS)
/* Room for any direction's name with kb_dir_label ("peer64999" and its NUL). */
#define KB_DIR_LABEL_LEN 16

/* A named direction's name ("E", "global_W", "child_left" ...); "peer" for any peer
 * direction (kb_dir_label tells which), "?" past KB_IPCQ_MAX_DIRS. */
const char *kb_dir_name(kb_dir d);
/* Any direction's full name into buf (n >= KB_DIR_LABEL_LEN): the named ones as kb_dir_name,
 * peer direction k as "peer<k>"; returns buf. What messages, traces and dumps print. */
const char *kb_dir_label(kb_dir d, char *buf, size_t n);
/* The direction a name (kb_dir_label's) stands for; -1 when unknown. */
int kb_dir_from_name(const char *name);
/* The preferred reverse direction (E<->W, N<->S, global_E<->global_W, children->parent);
 * -1 for parent (either child may point back) and for peer directions (their reverse depends
 * on the world: kb_topo_reverse). */
int kb_dir_opposite(kb_dir d);

typedef struct kb_ipcq_link {
    kb_pe_hw *pe;
    kb_dir dir;
    kb_pe_hw *peer;
    kb_dir peer_dir;
} kb_ipcq_link;

/*
 * Installs IPCQ on every PE named in links[0..n): allocates one rx ring per (PE, direction),
 * pairs every link with its peer's ring, checks that no PE is installed twice and that rx
 * ranges are disjoint, and times the install messages host -> PE_IPCQ on the command path
 * (blocks the calling host fiber). Errors leave nothing installed.
 */
int kb_ipcq_install(kb_ctx *ctx, const kb_ipcq_cfg *cfg, const kb_ipcq_link *links, size_t n);

/* Messages sent (tl_send calls) and the slot-sized chunks they travelled as, since the
 * context's first install (0 and 0 before it): what Phase 1's host time per chunk is
 * measured against. */
void kb_ipcq_counts(kb_ctx *ctx, uint64_t *msgs, uint64_t *chunks);
/* Bytes sent so far on named direction `dir` by every PE (chunks' payloads; 0 before install);
 * kb_ipcq_peer_bytes: on every peer direction together. */
uint64_t kb_ipcq_dir_bytes(kb_ctx *ctx, kb_dir dir);
uint64_t kb_ipcq_peer_bytes(kb_ctx *ctx);

/* KB_ERR_NOSPACE (message with the numbers) unless `ndirs` rings of the configuration fit
 * the ring area of `pe` (pe.ipcq.area_bytes of TCM, the PE's HBM slice or the cube SRAM, per
 * buffer_kind) next to what is allocated there: what an install plan checks before it builds
 * a full mesh's links. The install itself checks each PE the same way. */
int kb_ipcq_check_fit(kb_ctx *ctx, const kb_ipcq_cfg *cfg, kb_pe_hw *pe, int64_t ndirs);
/* Wired named directions of a PE as a bitmask (bit d = direction d); 0 when not installed. */
uint32_t kb_ipcq_wired(kb_ctx *ctx, const kb_pe_hw *pe);
/* Whether direction d (named or peer) is wired on the PE; kb_ipcq_peer_wired counts the
 * PE's wired peer directions. */
int kb_ipcq_is_wired(kb_ctx *ctx, const kb_pe_hw *pe, kb_dir d);
int kb_ipcq_peer_wired(kb_ctx *ctx, const kb_pe_hw *pe);
/* Counters of a queue pair, for tests and reports; KB_ERR_DIRECTION when not wired. */
typedef struct kb_ipcq_counters {
    uint64_t my_head, my_tail, peer_head_cache, peer_tail_cache;
    kb_pa my_rx_base, peer_rx_base;
    const kb_pe_hw *peer;
} kb_ipcq_counters;
int kb_ipcq_counters_of(kb_ctx *ctx, const kb_pe_hw *pe, kb_dir d, kb_ipcq_counters *out);

#endif
