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

typedef enum kb_dir {
    KB_DIR_E = 0, KB_DIR_W, KB_DIR_N, KB_DIR_S,
    KB_DIR_GLOBAL_E, KB_DIR_GLOBAL_W, KB_DIR_GLOBAL_N, KB_DIR_GLOBAL_S,
    KB_DIR_PARENT, KB_DIR_CHILD_LEFT, KB_DIR_CHILD_RIGHT,
    KB_NDIRS
} kb_dir;

/* IPCQ's name for what it returns (and stops a kernel with) for a direction that has no queue
 * pair on the PE; the message names the PE, the direction and the wired ones. */
#define KB_ERR_DIRECTION KB_ERR_UNWIRED

/* Peer directions: KB_DIR_PEER(k), k < KB_IPCQ_MAX_PEER_DIRS (a queue pair keeps its
 * direction in 16 bits); KB_IPCQ_MAX_DIRS bounds every direction. */
#define KB_DIR_PEER(k) ((kb_dir)(KB_NDIRS + (k)))
/* No direction: a kernel's sentinel for "no parent" / "no output" (never wired). */
#define KB_DIR_NONE ((kb_dir)-1)
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

typedef struct kb_ipcq_cfg {
    int n_slots;              /* >= 1 */
    uint64_t slot_size;       /* bytes per slot */
    kb_mem_kind buffer_kind;  /* where rx rings live */
    int backpressure;         /* 0 = never block on credits (unsafe; for experiments) */
    int posted;               /* ccl.yaml posted_sends: streamed kernels post their sends
                               * (kb_ccl_send) and keep a window of slices in flight */
} kb_ipcq_cfg;

/* One directed link of an install: `pe` sends on `dir` into `peer`'s ring of `peer_dir`. */
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

/* Bytes per slot of the queue pair on direction d of the kernel's PE (stops the run when d
 * is not wired): a message longer than this travels as several chunks. */
uint64_t tl_slot_size(kb_tl *tl, kb_dir d);
/* Slots of the peer's ring that a send on d may fill ahead of the peer's receives (n_slots):
 * a kernel that holds received slots (views) while it sends must not send more than this
 * ahead of what its neighbour can take in without it. */
uint32_t tl_slot_count(kb_tl *tl, kb_dir d);

/* The context's slot size (one IPCQ configuration per context), 0 before any install: what a
 * ring step compares its messages with, without a direction lookup. */
uint64_t kb_ipcq_slot_size(kb_ctx *ctx);
/* The context's kb_ipcq_cfg.posted (0 before any install). */
int kb_ipcq_posted(kb_ctx *ctx);

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

/* ---- kernel side ---- */

typedef struct kb_ipcq_req kb_ipcq_req;

void tl_send(kb_tl *tl, kb_dir dir, kb_val v);
/* The same send, posted: the kernel goes on once its last chunk is issued (after the call's
 * issue cost and any wait for credits) and gets the time that chunk lands at the peer, when
 * the value has been read (NCCL's posted put). The value must stay valid until then in
 * Phase 1 terms: scratch freed earlier may be reused, which Phase 2 replays in start order. */
int64_t tl_send_async(kb_tl *tl, kb_dir dir, kb_val v);
kb_val tl_recv(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt);
/* Receives straight into the tensor memory at va (no scratch value). */
void tl_recv_into(kb_tl *tl, kb_dir dir, kb_va va, kb_shape s, kb_dtype dt);
kb_ipcq_req *tl_recv_async(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt);
/* The same, straight into the tensor memory at va; tl_wait returns an empty value. */
kb_ipcq_req *tl_recv_into_async(kb_tl *tl, kb_dir dir, kb_va va, kb_shape s, kb_dtype dt);
kb_val tl_wait(kb_tl *tl, kb_ipcq_req *req);
/*
 * A receive read in place: when the message fits one slot and the ring is in this PE's own
 * TCM, tl_wait returns a value that IS the receive slot (no copy-out: the wait ends when the
 * data are there, at max(post, arrival)), and the slot stays the kernel's until
 * tl_recv_release hands it back (its credit leaves then). Compute ops read it like any local
 * value; never tl_free it, and release a direction's views in the order they were received.
 * Otherwise (a longer message, a ring in HBM or SRAM) it is tl_recv_async, and
 * tl_recv_release frees the copy. What NCCL's reduce-from-the-receive-buffer is here.
 */
kb_ipcq_req *tl_recv_view_async(kb_tl *tl, kb_dir dir, kb_shape s, kb_dtype dt);
void tl_recv_release(kb_tl *tl, kb_dir dir, kb_val v);

#endif
