/* The worker's arena range and what it maps (worker_mappings.c): the range itself and
 * its userfaultfd, pages mapped from the cache, and on the driver's host the zero-copy
 * mappings of the driver's own pages with the shoot-down slot the driver asks through.
 *
 * Lock: map_lock, private to worker_mappings.c: mapping a page from the driver
 * against a shoot-down. Below it: the cache (worker_cache.h), the read set
 * (worker_read_sets.h) and the connections (worker_conn.h), for the driver's memfd
 * and state table. */
#ifndef CLAMOR_WORKER_MAPPINGS_H
#define CLAMOR_WORKER_MAPPINGS_H
#include <stddef.h>
#include <stdint.h>

#define FAULT_AROUND_BYTES (2u << 20) /* resident mode: a fault maps its aligned block of current pages */

#pragma GCC visibility push(hidden)

/* Reserves the range (size bytes of pages of ps bytes) and registers it with a new
 * userfaultfd. With `zero_copy` (the driver's memfd is open: conn_open_shm) the range
 * maps the driver's memfd and joins the shoot-down area at zap_path; else it maps the
 * cache's memfd. -1 and a message on failure. */
int maps_init(uint64_t size, uint64_t ps, int zero_copy, const char *zap_path, char *err, size_t errlen);
/* Zero copy: starts the shoot-down thread and tells the driver to ask it from now on.
 * Call once the fault handler runs. */
int maps_start_shootdowns(char *err, size_t errlen);
uint8_t *maps_base(void);
int maps_uffd(void);
int maps_zero_copy(void);
/* Page p's aligned FAULT_AROUND_BYTES block: [lo, hi) of `per` pages (fewer at the end). */
void maps_block_of(uint64_t p, uint64_t *per, uint64_t *lo, uint64_t *hi);

/* Zero copy: a task read page p without mapping it (a gather's row copied from the
 * driver's memory): it counts in the page's hotness as a mapping does. */
void maps_count_read(uint64_t p);
/* Starts bringing page p's request counter into the cache (maps_count_read soon). */
void maps_prefetch_count(uint64_t p);
/* Page p may be mapped from now on: maps_unmap_all unmaps [0, touched). */
void maps_mark_touched(uint64_t p);
/* A task starts: its scans are its own (maps_direct). */
void maps_new_task(void);
/* Zero copy: maps the driver's own page p for a task at epoch E if the driver's bytes are
 * the version E reads, and records it in the read set. 0: mapped; -1: the caller copies
 * it instead. `at`: the faulting address, 0 for the whole page; `len` > 0: map exactly
 * the OS pages of [at, at + len). */
int maps_direct(uint64_t p, uint32_t E, uint64_t at, uint64_t len);
/* Zero copy: whether the OS pages [first, first + n) of the range, all of one arena
 * page, are mapped from the driver now (a hint for prefetch, which may then skip them: an
 * unmapped one would fault as usual). */
int maps_has_pieces(uint64_t first, uint64_t n);
/* Maps page p from the cache (where it was just installed or found) and wakes the
 * threads faulting on it. */
void maps_cached(uint64_t p);
/* Maps the cached pages [first, end) in one go, as far as they are cached. */
void maps_cached_run(uint64_t first, uint64_t end);
/* Unmaps the whole range (the cache stays). */
void maps_unmap_all(void);
enum { MAP_UNTOUCHED, MAP_DROPPED, MAP_ADVANCED };
/* Zero copy: the driver wrote pages[0..n) between stages and sealed them for `epoch`.
 * A page mapped from the driver whose mapping shows its page cache stays mapped: it
 * shows the new bytes, which are the current version (MAP_ADVANCED, the read set
 * follows). Others mapped from the driver (a private copy, or not yet the version
 * sealed) are unmapped, one madvise for each run of consecutive pages (MAP_DROPPED); the rest are
 * MAP_UNTOUCHED. outcome[i] says which. */
void maps_invalidate_direct(const uint64_t *pages, uint64_t n, uint32_t epoch, uint8_t *outcome);

#pragma GCC visibility pop

#endif
