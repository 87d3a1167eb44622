/* The running task's read set and the epoch it reads (worker_read_sets.c): which
 * pages, at which versions, the task has been shown.
 *
 * Lock: the read set's own (against end_task on the task's thread); the epoch and
 * the task's sequence number are atomics. Calls no other worker file. */
#ifndef CLAMOR_WORKER_READ_SETS_H
#define CLAMOR_WORKER_READ_SETS_H
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* An empty read set over npages pages, resident mode; -1 when memory is out. */
int rs_init(uint64_t npages);
/* The epoch the running task reads. */
uint32_t rs_epoch(void);
/* Exact read sets: every task starts with the range unmapped. */
int rs_exact(void);
/* Page p is read at version v, which serves epochs up to hi: into the task's read set
 * (exact mode) or the resident set. */
void rs_record(uint64_t p, uint32_t v, uint32_t hi);
/* Resident mode: the pages of n rows of row_bytes at arena `offsets` (pages of ps bytes)
 * were read at the task's epoch without being mapped (clamor.gather): they join the
 * resident set without a version, which the driver reads at each task's epoch. */
void rs_record_rows(const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint64_t ps);
/* Resident mode: page p leaves the resident set (its version is no longer current). */
void rs_unrecord(uint64_t p);
/* Resident mode: page p, resident at an older version, now shows version v (the
 * driver wrote it between stages and its mapping stayed). 0: done; -1: p is not
 * resident (or exact mode), nothing changed. */
int rs_advance(uint64_t p, uint32_t v);
/* Whether the running task has recorded page p already. */
int rs_seen_by_task(uint64_t p);
/* Resident mode: the version + 1 page p is resident at, 0 if none; unlocked: a hint. */
uint32_t rs_resident(uint64_t p);
/* A task at `epoch` starts: its read set is empty. 1: the resident pages serve
 * `epoch` and their mappings may stay; 0: the range must be unmapped whole (exact
 * mode, or an epoch they do not serve), and rs_clear_resident called. */
int rs_begin_task(uint32_t epoch);
/* The range was unmapped whole: no page is resident. */
void rs_clear_resident(void);

#pragma GCC visibility pop

#endif
