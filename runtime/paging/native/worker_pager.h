/* The worker pager's private state and the pieces its files share: worker_pager.c
 * (the range, the cache table, zero copy, the fault handler, the page server, the API),
 * worker_read_sets.c (read sets, what stays mapped between tasks) and worker_fetch.c
 * (fetching pages: own host, driver, peers, read-ahead, prefetch).
 * Not part of the API (api.h); nothing here is visible outside the native module. */
#ifndef CLAMOR_WORKER_PAGER_H
#define CLAMOR_WORKER_PAGER_H

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clamor.h"
#include "page_server.h"
#include "pager_common.h"
#include "worker_base.h"
#include "worker_cache.h"
#include "worker_read_sets.h"

#define DRIVER_TIMEOUT_MS 60000
#define PEER_TIMEOUT_MS 5000
#define READAHEAD_BYTES (16u << 20)
#define PREFETCH_WINDOW 32 /* prefetch GETs in flight on the driver connection */
#define FAULT_AROUND_BYTES (2u << 20) /* resident mode: a fault maps its aligned block of current pages */

typedef struct {
    int running;
    uint8_t *ro;
    uint64_t size, ps, npages;
    int uffd;
    pthread_t thread;
    uint8_t *token;
    size_t token_len;
    uint32_t drv_ip;
    int drv_port, drv_fd;
    int shm_fd;         /* the driver's arena memfd, when on the same host */
    const _Atomic uint64_t *shm_state;
    uint8_t *buf;       /* one page, warm: network pages land here first */
    int peer_fd[CL_MAX_WORKERS];
    uint32_t peer_ip[CL_MAX_WORKERS], peer_port[CL_MAX_WORKERS];
    int readahead;
    uint8_t *pending;  /* pages the fetch paths are after right now (worker_pending.c) */
    _Atomic uint64_t touched;
    _Atomic uint64_t last_direct; /* zero copy: the page of the last fault mapped in place, + 1 */
    uint64_t last_missing, ra_window;
    int zero_copy;            /* the range maps the driver's memfd (same host) */
    uint8_t *private_page;    /* zero copy: 1 where the range maps the cache memfd instead */
    uint32_t *mapped_ver1;    /* zero copy: version + 1 of the page last counted as mapped */
    _Atomic uint64_t *mapped; /* zero copy: our bitmap of pages mapped from the driver (shared) */
    cl_zap_head *zap_head;    /* zero copy: the shoot-down area's head (shared with the driver) */
    cl_zap_slot *zap;         /* zero copy: our shoot-down slot (shared with the driver) */
    _Atomic uint32_t *maps;   /* zero copy: per page, mappings from the driver (shared) */
    pthread_mutex_t map_lock; /* zero copy: mapping from the driver vs. shoot-downs */
    pthread_mutex_t fetch_lock; /* the fault handler vs. a task thread's prefetch: the driver
                                 * connection, the cache tables, the CLOCK hand */
    int run;
    cl_server *server;
    cl_tls_ctx *tls; /* NULL: plaintext page protocol */
} worker_state;

#pragma GCC visibility push(hidden)

extern worker_state W;

void map_cached(uint64_t p);
int map_direct(uint64_t p, uint32_t E, uint64_t at, uint64_t len);
/* Fetches pages (sorted, none cached for E) as pipelined streams from the driver and
 * the peers it redirects to, and installs them as `mode` says (FETCH_*); how many it
 * installed. Fetch lock held. */
uint64_t fetch_missing(const uint64_t *pages, uint64_t n, uint32_t E, int mode);
void qsort_pages(uint64_t *pages, uint64_t n);
void mark_touched(uint64_t p);
void tell_dropped(uint64_t p);
int driver(uint64_t page);
void fetch(uint64_t p, uint32_t E, uint32_t *v, uint32_t *hi);
void maybe_read_ahead(uint64_t p, uint32_t E);
/* worker_pending.c: pages being fetched, which the page server may wait for. */
void pending_mark(const uint64_t *pages, uint64_t n, int on);
void pending_arrived(void);
int pending_wait(uint64_t p, uint32_t E);
/* How fetch_missing installs a page: for a fault (mapped, recorded in the read set), for
 * clamor.prefetch (the same, counted as prefetched), or read ahead (cached only). */
enum { FETCH_FAULT = 0, FETCH_PREFETCH = 1, FETCH_READAHEAD = 2 };

#pragma GCC visibility pop

#endif
