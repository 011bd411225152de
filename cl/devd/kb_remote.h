/*
 * kb_remote — the client side of the device server (kb_devd.h; the protocol and the socket
 * helpers it shares with the server: kb_devd_proto.h): a Phase-2 backend whose
 * device lives in a `kbcl devd` process. It is device-resident: the kb_resident bookkeeping
 * (which simulated bytes live where, what is dirty) stays in this process, and its device
 * primitives become requests; a flush's batches travel as one request and run on the
 * server's clone of its OpenCL backend, so the replay and the results are those of the
 * in-process OpenCL backend on the same device. It is pipelined (kb_backend_ops.sync): a
 * flush returns once its records are sent, the server replays them while this process goes
 * on, and the next request reads the reply first; a failed replay fails every later request.
 *
 * Requests carry at most KB_DEVD_MAX_MSG bytes: larger uploads, copied downloads and payloads
 * go in several requests, and a larger flush in parts (KB_DEVD_MORE). The payload and staging
 * memfds are sealed against shrinking (F_SEAL_SHRINK), which the server requires of them.
 *
 * Limits: only resident flushes (kb_replay_flush's path); a host-arena flush (bench-self's
 * synthetic batches) is refused — those make their backend in process. A lost connection is
 * a device error for the flush or pull that saw it, and every later one.
 */
#ifndef KB_REMOTE_H
#define KB_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "kb_devd_proto.h"
#include "kb_err.h"
#include "kb_opencl.h"
#include "kb_replay.h"

/*
 * Connects to the server at `path` and opens a session. Owner of *out: the caller
 * (ops->destroy). KB_ERR_NOTFOUND when nothing listens there (no socket file, a stale one, or
 * a server that closes the connection unanswered because it is stopping:
 * the caller then sets its device up in process); KB_ERR_DEVICE for a server that answered
 * wrongly or could not make a session (the message says why); KB_ERR_STATE for one that is
 * not to be trusted: its folder fails kb_devd_dir_check, or the socket or the process
 * listening on it (SO_PEERCRED) is another user's; KB_ERR_IO when the path cannot be reached.
 * kb_backend_for_device sets its device up in process after any of them, the message in its
 * device note.
 */
int kb_remote_backend_create(const char *path, kb_backend *out, char *desc, size_t desc_n,
                             kb_errbuf *eb);

int kb_remote_is(const kb_backend *be);
uint64_t kb_remote_launches(const kb_backend *be);
double kb_remote_kernel_ms(const kb_backend *be);
/* The set-up as this process saw it: context_ms is the connection and session, cache the
 * server's program cache state, note names the server's socket. */
int kb_remote_setup_of(const kb_backend *be, kb_opencl_setup *out);

/* Asks the server at `path` who it is, without a session. KB_ERR_NOTFOUND: none there. */
int kb_remote_hello(const char *path, kb_devd_hello *out, kb_errbuf *eb);
/* Asks the server at `path` to stop (it exits once its sessions end). */
int kb_remote_shutdown(const char *path, kb_errbuf *eb);

#endif
