/* Pages this worker is fetching right now (worker_pending.c), which its page server
 * may wait for. Lock: its own. Below it: the cache (worker_cache.h). */
#ifndef CLAMOR_WORKER_PENDING_H
#define CLAMOR_WORKER_PENDING_H
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* No page pending, of npages; -1 when memory is out. */
int pending_init(uint64_t npages);
/* Marks (on) or clears pages[0..n) as being fetched by this worker. */
void pending_mark(const uint64_t *pages, uint64_t n, int on);
/* A page was installed: wake the page server threads waiting for one. */
void pending_arrived(void);
/* In a page server thread: page p is not cached for epoch E; waits while this worker is
 * fetching it, a bounded time. 1: it is cached for E now; 0: it is not. */
int pending_wait(uint64_t p, uint32_t E);

#pragma GCC visibility pop

#endif
