/* The driver pager's ground floor, below every other driver_*.c file: its counters
 * (what clamor_driver_get_stats copies). The files above it and the layers they form
 * are listed in docs/architecture.md ("The native pager's state"). Private to the
 * native module. */
#ifndef CLAMOR_DRIVER_BASE_H
#define CLAMOR_DRIVER_BASE_H
#include "clamor.h"
#include "protocol.h"

_Static_assert(CL_MAX_WORKERS == CLAMOR_MAX_WORKERS, "protocol.h and api.h disagree on the worker limit");

#pragma GCC visibility push(hidden)

/* Every counter zero (a start, and a stop: stop keeps nothing). */
void driver_base_reset(void);
/* The counters. Every file adds to them with ADD (atomic, relaxed); stage_running, a
 * state kept among them, is stored and loaded with release and acquire. */
clamor_driver_stats *driver_stats(void);

#pragma GCC visibility pop

#define ADD(field, n) __atomic_fetch_add(&driver_stats()->field, (n), __ATOMIC_RELAXED)

#endif
