/* Mapping ahead where clamor.write writes (driver_map_ahead.c). The driver writes rows
 * through an untracked mapping of the arena of its own (driver_pages.c's T.rw): the
 * user's view mapped the pages it wrote, but that mapping did not, so each page's first
 * write there faults (about 2 us on a VM; a Zipf-distributed update keeps reaching new
 * pages for hundreds of iterations, where a peer's plain array takes none). A thread of
 * its own maps the pages the memfd holds, 2 MiB at a time, in each region a write
 * reached: the writes after it do not fault. Holes stay unmapped (mapping one would
 * allocate it). */
#ifndef CLAMOR_DRIVER_MAP_AHEAD_H
#define CLAMOR_DRIVER_MAP_AHEAD_H
#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* `view` (read-only) and `rw`: two mappings of the arena's `bytes`. No thread yet.
 * -1 and a message on failure. */
int map_ahead_init(const uint8_t *view, uint8_t *rw, uint64_t bytes, char *err, size_t errlen);
/* This thread's page faults so far (before a write, for map_ahead_rows). */
uint64_t map_ahead_faults(void);
/* Rows were written at these arena offsets (`faults`: map_ahead_faults before): their
 * regions are mapped ahead, on the thread, which starts at the first call. Once each;
 * again if the write faulted on many pages (the view wrote them since, into a region
 * mapped when they were holes). */
void map_ahead_rows(const int64_t *offsets, uint64_t n, uint64_t faults);
/* Stop and join the thread; forget the regions. Before the mappings go. */
void map_ahead_free(void);

#pragma GCC visibility pop
#endif
