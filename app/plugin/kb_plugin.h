/*
 * kb_plugin — the plugin loader (kb_plugin.c): its whole interface is public, in
 * kbcl_plugin.h (the ABI a plugin is built against, the entries it registers and the
 * kb_plugins set a host program loads plugins into); this header adds what kbcl's own layers
 * use with it. How a load goes: the loader dlopen()s the file (RTLD_NOW | RTLD_LOCAL: every
 * undefined symbol is resolved at once, none of the plugin's leaks into the next plugin),
 * reads kbcl_plugin_abi and refuses the plugin unless it is KB_PLUGIN_ABI_VERSION, before any
 * of its code runs; then calls kbcl_plugin_init once. What init adds is checked as it comes
 * and kept only when init returns 0 and no entry was refused: a refused load keeps nothing,
 * no entry, no handle. The collectives join the set's kb_ccl_reg (kb_ccl_reg.h), after the
 * built-ins, which can never be shadowed.
 */
#ifndef KB_PLUGIN_H
#define KB_PLUGIN_H

#include "kb_bench.h"
#include "kb_ccl.h"
#include "kb_ccl_reg.h"
#include "kb_dist_algo.h"
#include "kbcl_plugin.h"

#endif
