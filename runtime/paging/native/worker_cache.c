/* The worker's page cache (worker_cache.h).
 *
 * Pages enter the cache through the file, never through a mapping: writing
 * through a mapping traps once per 4 KiB to allocate and map, which costs
 * more than the copy itself (bench/paging.py). Same-host pages come with
 * copy_file_range from the driver's memfd, network pages are received into
 * a warm buffer and written with pwrite.
 *
 * Cache limit (clamor_worker_set_cache_limit): before a page enters a full
 * cache, CLOCK (second chance) evicts one. Every fault (minor or missing) and
 * every install sets the page's reference bit; the hand sweeps page numbers
 * below clock_end, clears set bits and evicts the first cached page whose bit
 * is clear. Eviction punches the page out of the memfd, which also unmaps it,
 * so a later touch faults MISSING and fetches it again; the driver is told
 * (CL_HAVE_DROPPED) so it stops redirecting peers here for that page. Only the
 * fetch lock's holders install and evict for room, so the hand needs no lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pager_common.h"
#include "worker_base.h"
#include "worker_cache.h"

static struct {
    uint64_t ps, npages;
    int fd;                   /* the memfd: page p's bytes at p * ps */
    uint32_t *ver1;           /* cached version + 1; 0 = not cached */
    uint32_t *valid;          /* last epoch the cached bytes are valid for */
    cl_stripes stripes;       /* a page's ver1 and valid */
    uint64_t *refbits;        /* CLOCK reference bits, one per page */
    uint64_t hand, clock_end; /* the hand sweeps [0, clock_end): past every page installed */
    void (*dropped)(uint64_t p);
    void (*installed)(void);
} C;

int cache_init(uint64_t ps, uint64_t npages, void (*dropped)(uint64_t p), void (*installed)(void),
               char *err, size_t errlen) {
    memset(&C, 0, sizeof C);
    C.ps = ps, C.npages = npages, C.dropped = dropped, C.installed = installed;
    cl_stripes_init(&C.stripes);
    C.fd = memfd_create("clamor-page-cache", MFD_CLOEXEC);
    if (C.fd < 0 || ftruncate(C.fd, (off_t)(npages * ps)))
        return CL_ERR("cannot create the page cache: %s", strerror(errno));
    C.ver1 = calloc(npages, sizeof *C.ver1);
    C.valid = calloc(npages, sizeof *C.valid);
    C.refbits = calloc((npages + 63) / 64, sizeof *C.refbits);
    if (!C.ver1 || !C.valid || !C.refbits) return CL_ERR("out of memory for the page tables");
    return 0;
}

int cache_fd(void) { return C.fd; }

uint64_t cache_limit(void) { return __atomic_load_n(&worker_stats()->cache_limit_pages, __ATOMIC_RELAXED); }

void clamor_worker_set_cache_limit(uint64_t pages) {
    __atomic_store_n(&worker_stats()->cache_limit_pages, pages, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- table -- */

int cache_for(uint64_t p, uint32_t E, uint32_t *v, uint32_t *hi) {
    pthread_mutex_t *m = cl_stripe(&C.stripes, p);
    pthread_mutex_lock(m);
    uint32_t v1 = C.ver1[p];
    *v = v1 - 1;
    *hi = C.valid[p];
    pthread_mutex_unlock(m);
    if (!v1) return -1;
    return (*v <= E && E <= *hi) ? 1 : 0;
}

uint32_t cache_peek(uint64_t p) { return __atomic_load_n(&C.ver1[p], __ATOMIC_RELAXED); }

void cache_referenced(uint64_t p) { C.refbits[p >> 6] |= 1ull << (p & 63); }

void cache_install(uint64_t p, uint32_t v, uint32_t hi) {
    pthread_mutex_t *m = cl_stripe(&C.stripes, p);
    pthread_mutex_lock(m);
    if (!C.ver1[p]) ADD(cached_pages, 1);
    C.ver1[p] = v + 1;
    C.valid[p] = hi;
    pthread_mutex_unlock(m);
    cache_referenced(p);
    if (p + 1 > C.clock_end) C.clock_end = p + 1;
    C.installed(); /* peers may be waiting for it (worker_pending.c) */
}

/* The table entry goes first (under the stripe lock that cache_read reads it under),
 * so a peer asking from then on gets NOT_HELD, never a half-punched page. */
int cache_evict(uint64_t p, int tell) {
    pthread_mutex_t *m = cl_stripe(&C.stripes, p);
    pthread_mutex_lock(m);
    int held = C.ver1[p] != 0;
    C.ver1[p] = 0;
    pthread_mutex_unlock(m);
    if (!held) return 0;
    __atomic_fetch_sub(&worker_stats()->cached_pages, 1, __ATOMIC_RELAXED);
    if (tell) C.dropped(p);
    fallocate(C.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(p * C.ps), (off_t)C.ps);
    return 1;
}

/* CLOCK: each step of the hand clears a reference bit set by an earlier fault, skips an
 * uncached page or evicts, so the cost is O(1) amortised per install when the cache is
 * dense in [0, clock_end). Two full sweeps always find a victim unless only `keep` is
 * cached; the step bound only guards against a limit below 2. */
void cache_make_room(uint64_t keep) {
    uint64_t limit = cache_limit();
    if (!limit) return;
    for (uint64_t steps = 0; __atomic_load_n(&worker_stats()->cached_pages, __ATOMIC_RELAXED) >= limit;) {
        if (C.clock_end == 0 || steps++ > 2 * C.clock_end + 2) return;
        uint64_t p = C.hand;
        C.hand = p + 1 >= C.clock_end ? 0 : p + 1;
        if (p == keep || !__atomic_load_n(&C.ver1[p], __ATOMIC_RELAXED)) continue;
        uint64_t bit = 1ull << (p & 63);
        if (C.refbits[p >> 6] & bit) {
            C.refbits[p >> 6] &= ~bit; /* second chance */
            continue;
        }
        if (cache_evict(p, 1)) ADD(evictions, 1);
    }
}

/* ----------------------------------------------------------------- bytes -- */

int cache_write(uint64_t p, const uint8_t *src) {
    for (uint64_t done = 0; done < C.ps;) {
        ssize_t n = pwrite(C.fd, src + done, C.ps - done, (off_t)(p * C.ps + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        done += (uint64_t)n;
    }
    return 0;
}

int cache_copy_from(int fd, uint64_t p) {
    loff_t in = (loff_t)(p * C.ps), out = in;
    for (uint64_t left = C.ps; left;) {
        ssize_t n = copy_file_range(fd, &in, C.fd, &out, left, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        left -= (uint64_t)n;
    }
    return 0;
}

int cache_read(uint64_t p, uint32_t E, uint8_t *buf, uint32_t *v, uint32_t *hi) {
    pthread_mutex_t *m = cl_stripe(&C.stripes, p);
    pthread_mutex_lock(m);
    uint32_t v1 = C.ver1[p];
    *v = v1 - 1, *hi = C.valid[p];
    if (!(v1 && v1 - 1 <= E && E <= *hi)) {
        pthread_mutex_unlock(m);
        return 0;
    }
    ssize_t n = pread(C.fd, buf, C.ps, (off_t)(p * C.ps));
    pthread_mutex_unlock(m);
    return n == (ssize_t)C.ps ? 1 : -1;
}
