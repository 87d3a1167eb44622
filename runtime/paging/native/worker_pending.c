/* Pages a worker is fetching right now ("pending"), so that its page server can wait
 * for one instead of answering NOT_HELD.
 *
 * Why: the driver lists a worker as a holder of a page as soon as it sends it the page
 * or redirects it to a peer for it (cl_dir_redirect), so that a burst (every worker
 * touching the same pages at stage start) fans out over a tree of peers. A peer
 * redirected to such a holder-to-be asks before the copy has arrived; the holder's
 * page server then waits, at most PENDING_WAIT_MS, for its own fetch to install the
 * page, and answers NOT_HELD after that (the asker falls back to the driver).
 *
 * The fetch paths (worker_fetch.c) mark the pages they are after with pending_mark
 * before the first request and clear them when they return, installed or not; an
 * install wakes the waiters (the cache's `installed` callback, given at cache_init).
 * A wait can never close a circle for long: see cl_dir_redirect (directory.c), and the
 * ascending order of fetch_missing's peer phase; the bound is for what remains (a
 * holder that hangs, or lost its copy). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "worker_base.h"
#include "worker_cache.h"
#include "worker_pending.h"

#define PENDING_WAIT_MS 2000 /* below PEER_TIMEOUT_MS (worker_conn.h), the asker's receive timeout */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct {
    pthread_mutex_t lock;   /* the marks and the waiters */
    pthread_cond_t arrived; /* broadcast at an install, and when marks are cleared */
    int waiters;
    uint64_t npages;
    uint8_t *pending;       /* per page: 1 while being fetched */
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void init(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&P.arrived, &a);
}

int pending_init(uint64_t npages) {
    P.npages = npages;
    P.pending = calloc(npages, 1);
    return P.pending ? 0 : -1;
}

void pending_mark(const uint64_t *pages, uint64_t n, int on) {
    pthread_once(&once, init);
    pthread_mutex_lock(&P.lock);
    for (uint64_t i = 0; i < n; i++)
        if (pages[i] < P.npages) P.pending[pages[i]] = (uint8_t)on;
    if (!on && P.waiters) pthread_cond_broadcast(&P.arrived); /* those never installed: stop waiting */
    pthread_mutex_unlock(&P.lock);
}

void pending_arrived(void) {
    pthread_once(&once, init);
    pthread_mutex_lock(&P.lock);
    if (P.waiters) pthread_cond_broadcast(&P.arrived);
    pthread_mutex_unlock(&P.lock);
}

/* Waits at most PENDING_WAIT_MS. */
int pending_wait(uint64_t p, uint32_t E) {
    pthread_once(&once, init);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += PENDING_WAIT_MS / 1000;
    until.tv_nsec += (long)(PENDING_WAIT_MS % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    uint32_t v, hi;
    int held = 0, waited = 0;
    pthread_mutex_lock(&P.lock);
    while (!(held = cache_for(p, E, &v, &hi) == 1) && P.pending[p]) {
        P.waiters++, waited = 1;
        int rc = pthread_cond_timedwait(&P.arrived, &P.lock, &until);
        P.waiters--;
        if (rc == ETIMEDOUT) {
            held = cache_for(p, E, &v, &hi) == 1;
            break;
        }
    }
    pthread_mutex_unlock(&P.lock);
    if (waited) ADD(pending_waits, 1);
    if (waited && !held) ADD(pending_timeouts, 1);
    return held;
}
