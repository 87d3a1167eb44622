/* The worker pager's ground floor, below every other worker_*.c file: its counters
 * (what clamor_worker_get_stats copies), its id for log lines, and the way out when
 * the fault handler cannot go on. The files above it and the layers they form are
 * listed in docs/architecture.md ("The native pager's state"). Not part of the API
 * (api.h); nothing here is visible outside the native module. */
#ifndef CLAMOR_WORKER_BASE_H
#define CLAMOR_WORKER_BASE_H
#include <stdint.h>

#include "clamor.h"

#define EXIT_DRIVER_UNREACHABLE CLAMOR_EXIT_DRIVER_UNREACHABLE
#define EXIT_PAGE_ERROR CLAMOR_EXIT_PAGE_ERROR

#pragma GCC visibility push(hidden)

/* A fresh start of the worker pager: every counter zero. */
void worker_base_reset(int worker_id);
int worker_id(void);
/* The counters. Every file adds to them with ADD (atomic, relaxed); the cache limit,
 * a setting kept among them, is read with an atomic load. */
clamor_worker_stats *worker_stats(void);
/* Logs why and exits the process with `status` (api.h's CLAMOR_EXIT_*): the faulting
 * thread cannot be given an exception. */
void die(int status, const char *why, uint64_t page);

#pragma GCC visibility pop

#define ADD(field, n) __atomic_fetch_add(&worker_stats()->field, (n), __ATOMIC_RELAXED)

#endif
