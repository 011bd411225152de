/*
 * kbcl — the whole public API of kbcl in one include (docs/api.md): errors and time
 * (kbcl_base.h), element types (kbcl_dtype.h), the host runtime (kbcl_runtime.h), the kernel
 * language (kbcl_tl.h), collectives (kbcl_ccl.h) and plugins with their benches
 * (kbcl_plugin.h). These are the only headers `cmake --install` puts into include/kbcl, and
 * the functions they declare are the only ones the kbcl executable exports to plugins.
 */
#ifndef KBCL_H
#define KBCL_H

#include "kbcl_base.h"
#include "kbcl_ccl.h"
#include "kbcl_dtype.h"
#include "kbcl_plugin.h"
#include "kbcl_runtime.h"
#include "kbcl_tl.h"

#endif
