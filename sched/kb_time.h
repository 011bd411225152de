/*
 * kb_time — simulated time.
 *
 * Time is an integer count of picoseconds in an int64_t (about 106 days of simulated time).
 * The engine never uses floating-point time, so the same inputs give the same event order and
 * the same numbers on every machine. Configuration values given in ns (possibly fractional)
 * are converted once, at load time, with kb_time_from_ns() (round to nearest picosecond).
 */
#ifndef KB_TIME_H
#define KB_TIME_H

#include <math.h>
#include <stdint.h>

#include "kbcl_base.h" /* kb_time, kb_ns, kb_time_to_ns */

/* Fractional nanoseconds from a config file -> picoseconds, rounded to nearest. */
static inline kb_time kb_time_from_ns(double ns) { return (kb_time)llround(ns * 1000.0); }

#endif
