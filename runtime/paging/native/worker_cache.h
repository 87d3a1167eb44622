/* The worker's page cache (worker_cache.c): a private memfd holding one copy of each
 * cached page at its offset in the arena, the table of which version each copy is and
 * which epochs it serves, and CLOCK eviction under the cache limit.
 *
 * Locks: a page's entry is guarded by its stripe lock (the page server reads entries
 * from its own threads). The CLOCK hand and the reference bits are used only with the
 * fetch lock held (worker_fetch.h): by the fault handler thread, or a task's prefetch.
 *
 * The cache calls no file above it; what it must tell them (a page installed, a page
 * dropped) goes through the two callbacks given to cache_init. */
#ifndef CLAMOR_WORKER_CACHE_H
#define CLAMOR_WORKER_CACHE_H
#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* An empty cache of npages pages of ps bytes. `dropped(p)`: page p was evicted for room
 * or to map it in place, and the driver's directory must hear of it; `installed()`: a
 * page was installed (threads may be waiting for one). -1 and a message on failure. */
int cache_init(uint64_t ps, uint64_t npages, void (*dropped)(uint64_t p), void (*installed)(void),
               char *err, size_t errlen);
int cache_fd(void);
/* The cache limit in pages (clamor_worker_set_cache_limit; 0: unlimited). */
uint64_t cache_limit(void);

/* 1: page p is cached in a version that serves epoch E (*v, *hi: the version and the
 * last epoch it serves); 0: cached in another; -1: not cached. */
int cache_for(uint64_t p, uint32_t E, uint32_t *v, uint32_t *hi);
/* The cached version of p + 1, 0 when not cached; read without the lock: a hint. */
uint32_t cache_peek(uint64_t p);
/* Page p was used: CLOCK gives it a second chance. Fetch lock held. */
void cache_referenced(uint64_t p);
/* Page p's bytes are in the memfd (cache_write, cache_copy_from): it is cached at
 * version v, serving epochs up to hi. Fetch lock held. */
void cache_install(uint64_t p, uint32_t v, uint32_t hi);
/* Drops page p; with `tell`, the driver's directory too (the `dropped` callback). 1: p
 * was cached (only the caller that cleared it counts it). */
int cache_evict(uint64_t p, int tell);
/* Makes room for one more page under the cache limit, never evicting `keep`. Fetch
 * lock held. */
void cache_make_room(uint64_t keep);

/* Page p's bytes into the memfd, from memory or from another file at the same offset
 * (the driver's memfd). 0, or -1 on an error. */
int cache_write(uint64_t p, const uint8_t *src);
int cache_copy_from(int fd, uint64_t p);
/* For the page server: page p's bytes into buf if cached for epoch E (read under its
 * stripe lock, so never a page half evicted). 1: read (*v, *hi as cache_for); 0: not
 * cached for E; -1: the read failed. */
int cache_read(uint64_t p, uint32_t E, uint8_t *buf, uint32_t *v, uint32_t *hi);

#pragma GCC visibility pop

#endif
