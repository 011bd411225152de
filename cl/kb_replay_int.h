/*
 * kb_replay_int — what the files of the Phase-2 replay share with each other and nobody else:
 * the record checks that the planner and the flush call. The files: kb_replay.c (the planner:
 * order, batches, arena), kb_replay_check.c (what a record must satisfy to be planned or run)
 * and kb_replay_flush.c (a flush: the plan, the backend's run, the write-back). Internal: not
 * installed (CMakeLists.txt leaves it out of include/kbcl) and included by those files only.
 */
#ifndef KB_REPLAY_INT_H
#define KB_REPLAY_INT_H

#include <stddef.h>

#include "kb_err.h"
#include "kb_oplog.h"
#include "kb_replay.h"

/* Record r is well formed: a known kind, its source count, operands whose dtype, space, stride
 * and span are valid, shapes that fit the kind (the planner's per-record check). 0, or
 * KB_ERR_INVAL with a message naming the record. */
int kb_replay_check_rec(const kb_rec *r, kb_errbuf *eb);

/* Every payload source of recs[0..n) lies inside the first payload_bytes of the payload. 0,
 * or KB_ERR_INVAL with a message naming the first record that does not. */
int kb_replay_check_payload(const kb_rec *const *recs, size_t n, size_t payload_bytes,
                            kb_errbuf *eb);

#endif
