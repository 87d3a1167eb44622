/* Fetching pages (worker_fetch.c): from the driver's memfd on this host, from the
 * driver over TCP and the peers it redirects to; read-ahead; prefetch of a task's
 * known pages; a gather's rows without their pages.
 *
 * Lock: the fetch lock, held by the fault handler for each batch of faults and by a
 * task's prefetch. It serialises the driver and peer connections (worker_conn.h), the
 * cache's CLOCK hand (worker_cache.h) and the read-ahead state here. Below it: the
 * mappings, the cache, the read set, the connections and the pending pages
 * (worker_pending.h, beside it in the same layer). */
#ifndef CLAMOR_WORKER_FETCH_H
#define CLAMOR_WORKER_FETCH_H
#include <stddef.h>
#include <stdint.h>

/* How fetch_missing installs a page: for a fault (mapped, recorded in the read set), for
 * clamor.prefetch (the same, counted as prefetched), or read ahead (cached only). */
enum { FETCH_FAULT = 0, FETCH_PREFETCH = 1, FETCH_READAHEAD = 2 };

#pragma GCC visibility push(hidden)

/* -1 and a message when memory is out. `readahead`: read ahead after sequential faults. */
int fetch_init(uint64_t ps, uint64_t npages, int readahead, char *err, size_t errlen);
void fetch_lock(void);
void fetch_unlock(void);

/* Fetches the latest version <= E of page p into its cache slot; the caller installs it
 * (cache_install), with p marked pending meanwhile (worker_pending.h). Fetch lock held. */
void fetch_page(uint64_t p, uint32_t E, uint32_t *v, uint32_t *hi);
/* Fetches pages (sorted, none cached for E) as pipelined streams from the driver and
 * the peers it redirects to, and installs them as `mode` says (FETCH_*); how many it
 * installed. Fetch lock held. */
uint64_t fetch_missing(const uint64_t *pages, uint64_t n, uint32_t E, int mode);
/* After page p was fetched for a fault at epoch E: reads ahead if the faults run
 * sequentially. Fetch lock held. */
void fetch_maybe_read_ahead(uint64_t p, uint32_t E);
void fetch_sort_pages(uint64_t *pages, uint64_t n);

/* clamor_worker_prefetch (api.h), and the same for OS pages, of a running pager,
 * n > 0; they take the fetch lock. */
uint64_t fetch_prefetch(const uint64_t *pages, uint64_t n);
uint64_t fetch_prefetch_pieces(const uint64_t *pieces, uint64_t n);
/* clamor_worker_prefetch_rows (api.h). */
int64_t fetch_prefetch_rows(uint64_t start, int64_t stride, uint64_t row_bytes, const int64_t *rows, uint64_t n,
                            int64_t axis_len);
/* clamor_worker_gather (api.h), of a running pager; it takes the fetch lock. */
int fetch_gather(const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint8_t *out);

#pragma GCC visibility pop

#endif
