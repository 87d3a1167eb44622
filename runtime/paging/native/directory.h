/* The driver's page directory: which workers hold the current version of each page,
 * private to driver_pages.c (which answers a GET with REDIRECT to one of them).
 *
 * Its layout, for up to CL_MAX_WORKERS (1,024) workers. A bitset per
 * page would be 128 bytes for every page of the arena (1 GiB for a 32 GiB arena of
 * 4 KiB pages), nearly all of it for pages with no or one holder; a list per page
 * would make hot pages, the ones replication is for, cost time per holder. So each
 * page has a 16-byte entry (dir_entry): the number of holders and, up to
 * DIR_INLINE (7) of them, their ids (uint16); a page with more holders than that
 * keeps them in a 1,024-bit bitmap of its own (holder_bits, 128 bytes) from a pool
 * in chunks, and the entry keeps the bitmap's index instead. Every operation is
 * bounded by a constant whatever the number of workers: a scan of at most 7 ids,
 * or of the bitmap's 16 words (add, drop, two random choices among the live
 * holders, count). Memory: 16 bytes per page (the old 64-bit set was 8), plus 128
 * bytes per page held by more than 7 workers at once; a bitmap goes back to the
 * pool when its page is invalidated or falls to DIR_INLINE / 2 holders (not at
 * DIR_INLINE: a page around 7 holders would take and return one all the time).
 * The entry of page p and its bitmap are guarded by p's stripe lock; the pool by
 * its own lock, taken inside a stripe lock. The directory is a hint: a holder it
 * misses costs a redirect (if the pool cannot grow, a holder past DIR_INLINE is
 * not recorded), one it wrongly lists costs the client a NOT_HELD and a retry with
 * NO_REDIRECT, never wrong bytes. Worker ids at or past CL_MAX_WORKERS are never
 * recorded (their clients are served like non-workers).
 */
#ifndef CLAMOR_DIRECTORY_H
#define CLAMOR_DIRECTORY_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "protocol.h"

#define DIR_INLINE 7
#define DIR_WORDS (CL_MAX_WORKERS / 64)
#define DIR_CHUNK 1024 /* holder bitmaps per pool chunk (128 KiB) */
#define DIR_BIG 0x8000 /* in dir_entry.n: the holders are in a bitmap */

typedef struct {
    uint16_t n;               /* how many workers hold the page's current version, | DIR_BIG */
    uint16_t id[DIR_INLINE];  /* their ids; with DIR_BIG, id[0] | id[1] << 16 is their bitmap */
} dir_entry;

typedef struct {
    uint64_t w[DIR_WORDS];
} holder_bits;

typedef struct {
    dir_entry *dir;          /* per page: its holders */
    uint64_t npages;
    _Atomic uint64_t end;    /* pages at or past it have never had a holder */
    holder_bits **chunks;    /* the pool of holder bitmaps, DIR_CHUNK per chunk */
    uint64_t max_chunks;     /* enough for a bitmap for every page */
    uint32_t bits_used, bits_free; /* bitmaps handed out ever; the free list's head + 1 (0: empty) */
    pthread_mutex_t pool;
    _Atomic uint64_t live[DIR_WORDS]; /* workers with a page server to redirect to */
    uint64_t redirect_load[CL_MAX_WORKERS]; /* per worker: redirects to it not yet served */
    uint64_t *bytes, *bitmaps; /* the driver's stats: directory_bytes, holder_bitmaps */
} cl_dir;

/* The directory of npages pages, all without holders; -1 when memory is out. */
int cl_dir_init(cl_dir *d, uint64_t npages, uint64_t *bytes_stat, uint64_t *bitmaps_stat);
void cl_dir_free(cl_dir *d);

/* Page p's stripe lock is held for these (the pool has its own lock). */
void cl_dir_add(cl_dir *d, uint64_t p, uint32_t w);
void cl_dir_remove(cl_dir *d, uint64_t p, uint32_t w);
void cl_dir_clear(cl_dir *d, uint64_t p);
/* Page p's holders, ascending, into out (room for CL_MAX_WORKERS); how many. */
uint32_t cl_dir_list(const cl_dir *d, uint64_t p, uint16_t *out);
/* A live holder of p other than `client` to redirect it to (two random choices, fewer
 * outstanding redirects wins); -1: none. */
int64_t cl_dir_pick(cl_dir *d, uint64_t p, uint32_t client);
/* Fan-out: picks as cl_dir_pick and, when it finds one, lists `client` as a holder of p
 * at once (a holder-to-be: its page server waits for its copy, see worker_pending.c), so
 * that a burst of requests for p spreads over a tree of peers instead of one. */
int64_t cl_dir_redirect(cl_dir *d, uint64_t p, uint32_t client);
/* One redirect to `peer` ended: the client got the page (its CL_HAVE) or gave up. */
void cl_dir_served(cl_dir *d, uint32_t peer);
/* The client's redirect to `peer` for p failed: p is no longer held there. */
void cl_dir_failed(cl_dir *d, uint64_t p, uint32_t peer);

/* Read without the stripe lock: a hint. */
static inline uint16_t cl_dir_count(const cl_dir *d, uint64_t p) {
    return __atomic_load_n(&d->dir[p].n, __ATOMIC_RELAXED) & ~DIR_BIG;
}
/* Worker w has (1) or no longer has (0) a page server to redirect to. */
void cl_dir_set_live(cl_dir *d, uint32_t w, int live);

#endif
