/* The driver's write handler and stage starts (driver_versions.c): the trapping
 * userfaultfd and its thread, async write tracking (write_tracking.h), which epochs
 * no stage reads any more, and sealing a new epoch.
 *
 * Lock: the stage lock, private to driver_versions.c: a stage start, a release or a
 * retain against the write handler. Below it: the page table (driver_pages.h). */
#ifndef CLAMOR_DRIVER_VERSIONS_H
#define CLAMOR_DRIVER_VERSIONS_H
#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* Write-protects the arena [base, base + npages * ps) with a new userfaultfd and starts
 * the write handler's thread. -1 and a message on failure (nothing is left running;
 * versions_free frees what was made). */
int versions_start(uint8_t *base, uint64_t ps, uint64_t npages, char *err, size_t errlen);
/* Ends the write handler's thread (after a successful versions_start). */
void versions_stop(void);
/* Frees the trackers and closes the userfaultfd, which lifts every write protection. */
void versions_free(void);

/* clamor_driver_begin_stage, clamor_driver_release and clamor_driver_retain (api.h). */
uint32_t versions_begin_stage(void);
void versions_release(uint32_t E);
int versions_retain(uint32_t E);
/* clamor_driver_write_rows (offsets checked here; the pager is running). */
int versions_write_rows(const int64_t *offsets, uint64_t n, const uint8_t *values, uint64_t row_bytes);

#pragma GCC visibility pop

#endif
