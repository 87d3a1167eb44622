/* Mapping ahead where clamor.write writes, the driver's side (driver_map_ahead.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "driver_base.h"
#include "driver_map_ahead.h"
#include "pager_common.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; newer than some build headers */
#endif
#define REGION_SHIFT 21 /* 2 MiB a region: one mincore call */
#define REGION_BYTES (1ull << REGION_SHIFT)
#define SYS_PAGE 4096

enum { NONE, WANTED, MAPPED };

static struct {
    const uint8_t *view;
    uint8_t *rw;
    uint64_t bytes, nregions;
    _Atomic uint8_t *regions; /* NONE, WANTED (a write reached it), MAPPED (or given up) */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int started, stop, wanted; /* under lock; wanted: regions may be WANTED */
    pthread_t thread;
} A = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

int map_ahead_init(const uint8_t *view, uint8_t *rw, uint64_t bytes, char *err, size_t errlen) {
    A.view = view, A.rw = rw, A.bytes = bytes;
    A.nregions = (bytes + REGION_BYTES - 1) >> REGION_SHIFT;
    A.regions = calloc(A.nregions ? A.nregions : 1, 1);
    A.started = A.stop = A.wanted = 0;
    if (!A.regions) return CL_ERR("out of memory for %llu regions", (unsigned long long)A.nregions);
    return 0;
}

/* Map the pages the memfd holds in region r into rw; 0, or -1 if the kernel cannot. */
static int map_region(uint64_t r) {
    unsigned char resident[REGION_BYTES / SYS_PAGE];
    uint64_t at = r << REGION_SHIFT, n = (A.bytes - at < REGION_BYTES ? A.bytes - at : REGION_BYTES) / SYS_PAGE;
    if (mincore((void *)(A.view + at), n * SYS_PAGE, resident)) return -1;
    for (uint64_t i = 0, j; i < n; i = j) {
        for (j = i; j < n && (resident[j] & 1) == (resident[i] & 1); j++) {}
        if (!(resident[i] & 1)) continue;
        if (madvise(A.rw + at + i * SYS_PAGE, (j - i) * SYS_PAGE, MADV_POPULATE_WRITE)) return -1;
        ADD(bytes_mapped_ahead, (j - i) * SYS_PAGE);
    }
    return 0;
}

static void *map_ahead(void *unused) {
    (void)unused;
    int works = sysconf(_SC_PAGESIZE) == SYS_PAGE;
    pthread_mutex_lock(&A.lock);
    while (!A.stop) {
        if (!A.wanted) {
            pthread_cond_wait(&A.wake, &A.lock);
            continue;
        }
        A.wanted = 0;
        pthread_mutex_unlock(&A.lock);
        for (uint64_t r = 0; r < A.nregions && !__atomic_load_n(&A.stop, __ATOMIC_RELAXED); r++) {
            if (atomic_load_explicit(&A.regions[r], memory_order_relaxed) != WANTED) continue;
            if (works && map_region(r)) works = 0; /* e.g. a kernel before 5.14: writes fault as before */
            atomic_store_explicit(&A.regions[r], MAPPED, memory_order_relaxed);
        }
        pthread_mutex_lock(&A.lock);
    }
    pthread_mutex_unlock(&A.lock);
    return NULL;
}

uint64_t map_ahead_faults(void) {
    struct rusage ru;
    return getrusage(RUSAGE_THREAD, &ru) ? 0 : (uint64_t)ru.ru_minflt;
}

void map_ahead_rows(const int64_t *offsets, uint64_t n, uint64_t faults) {
    /* many faults: pages the view wrote since their region was mapped (or holes) */
    uint8_t again = map_ahead_faults() - faults > n / 16 + 8 ? MAPPED : NONE;
    int wanted = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = (uint64_t)offsets[i] >> REGION_SHIFT;
        if (r >= A.nregions) continue;
        uint8_t state = atomic_load_explicit(&A.regions[r], memory_order_relaxed);
        if (state == NONE || state == again) {
            atomic_store_explicit(&A.regions[r], WANTED, memory_order_relaxed);
            wanted = 1;
        }
    }
    if (!wanted) return;
    pthread_mutex_lock(&A.lock);
    A.wanted = 1;
    if (!A.started && !A.stop) A.started = pthread_create(&A.thread, NULL, map_ahead, NULL) == 0;
    pthread_cond_signal(&A.wake);
    pthread_mutex_unlock(&A.lock);
}

void map_ahead_free(void) {
    pthread_mutex_lock(&A.lock);
    A.stop = 1;
    int started = A.started;
    pthread_cond_signal(&A.wake);
    pthread_mutex_unlock(&A.lock);
    if (started) pthread_join(A.thread, NULL);
    free((void *)A.regions);
    A.regions = NULL, A.nregions = 0, A.started = 0, A.view = NULL, A.rw = NULL;
}
