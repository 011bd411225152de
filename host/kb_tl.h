/*
 * kb_tl — the kernel language, as kbcl's own layers see it: the public API (kbcl_tl.h) and
 * the PE a kernel runs on, for the IPCQ and collective layers.
 */
#ifndef KB_TL_H
#define KB_TL_H

#include "kb_runtime.h"
#include "kbcl_tl.h"

/* The PE a kernel runs on (its units, ports and queues). */
kb_pe_hw *tl_pe(kb_tl *tl);
/* The simulation the kernel's fiber runs in: what its waits, wakes and events go to. Today every
 * kernel's is its context's (kb_ctx_sim); a run split by SIP (docs/parallel.md) gives each SIP
 * its own, so kernel-side code asks this, never the context. */
kb_sim *tl_sim(kb_tl *tl);

#endif
