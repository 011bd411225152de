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

#endif
