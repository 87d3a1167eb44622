/* The driver pager's write handler and stage starts (driver_versions.h): write traps,
 * parked chunks, which epochs are released, and sealing a new epoch (how it works:
 * driver_pager.c's opening comment, write_tracking.h). The page table it updates is
 * driver_pages.c's. */
#include <errno.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "driver_base.h"
#include "driver_pages.h"
#include "driver_versions.h"
#include "driver_zap.h"
#include "pager_common.h"
#include "write_tracking.h"

#define UFFD_FEATURE_WP_UNPOPULATED_ (1 << 13) /* newer than the build headers */
#ifndef UFFDIO_CONTINUE_MODE_WP
#define UFFDIO_CONTINUE_MODE_WP ((__u64)1 << 1)
#endif

static struct {
    uint8_t *base; /* the arena */
    uint64_t ps, npages;
    int uffd, stop_efd;
    pthread_t thread;          /* the write handler */
    cl_wtrack *wt;             /* async write tracking; NULL where the kernel lacks it */
    pthread_mutex_t stage;     /* serialises stage starts, releases and retains with the write handler */
    _Atomic uint32_t released; /* no stage reads epochs <= it any more: writes need no copy */
    int wrote_uncopied;        /* since the last release: a write that kept no old bytes */
    uint64_t marked;           /* pages mark_written was told of (stage lock held) */
} V = {.uffd = -1, .stop_efd = -1};

static int write_protect(uint64_t first, uint64_t n, int on) {
    struct uffdio_writeprotect wp = {
        .range = {(uint64_t)(uintptr_t)(V.base + first * V.ps), n * V.ps},
        .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
    };
    if (ioctl(V.uffd, UFFDIO_WRITEPROTECT, &wp)) {
        cl_log("write-protect of pages %llu+%llu failed: %s", (unsigned long long)first,
               (unsigned long long)n, strerror(errno));
        return -1;
    }
    return 0;
}

static void protect(uint64_t first, uint64_t n) { write_protect(first, n, 1); }

/* Pages [0, hw) hold everything the arena ever handed out. */
static uint64_t high_water_pages(void) {
    clamor_arena_stats as;
    clamor_arena_get_stats(&as);
    uint64_t hw = (as.high_water + V.ps - 1) / V.ps;
    return hw > V.npages ? V.npages : hw;
}

/* The async tracker's finds: pages written with no trap (or touched mid-switch). */
static void mark_written(uint64_t first, uint64_t n) {
    V.marked += n;
    pages_mark_written(first, n);
}

/* No stage is running and none will read the current epoch again (Python said so with
 * clamor_driver_release): a write needs no copy of the old bytes. Stage lock held. */
static int no_version_needed(void) {
    return !__atomic_load_n(&driver_stats()->stage_running, __ATOMIC_ACQUIRE)
           && atomic_load(&V.released) >= pages_epoch();
}

/* Page p's first write since its version was sealed (page lock held, then the page
 * unprotected by the caller): keeps the old bytes where a stage or lineage needs them. */
static void first_write(uint64_t p) {
    if (pages_first_write(p, !(pages_fresh(p) && no_version_needed()))) V.wrote_uncopied = 1;
}

/* ------------------------------------------------------ write tracking -- */

/* A trapped write to a protected page (stage lock held). Where no old version is
 * needed, the page's chunk goes over to async tracking (no more traps there until the
 * next stage): a parked chunk by moving its tables back, a trapping one by switching.
 * Else, or where the kernel lacks async write-protect, first_write. */
static void on_write_fault(uint64_t p) {
    uint64_t c = V.wt ? cl_wtrack_chunk_of(V.wt, p) : 0;
    if (V.wt && cl_wtrack_is_async(V.wt, c)) {
        mark_written(p, 1); /* a trap from before the switch, whose unregister woke the writer */
        return;
    }
    pages_lock(p);
    int fresh = pages_fresh(p);
    pages_unlock(p);
    if (fresh && no_version_needed() && V.wt) {
        ADD(async_switches, 1); /* counted before the switch wakes the writer (it may read the stats) */
        V.wrote_uncopied = 1;
        if (cl_wtrack_is_parked(V.wt, c) ? cl_wtrack_unpark(V.wt, c) == 0
                                         : cl_wtrack_to_async(V.wt, c, high_water_pages(), mark_written) == 0) {
            mark_written(p, 1);
            return;
        }
        __atomic_fetch_sub(&driver_stats()->async_switches, 1, __ATOMIC_RELAXED);
    }
    pages_lock(p);
    first_write(p);
    write_protect(p, 1, 0); /* also wakes the writer */
    pages_unlock(p);
}

/* A touch of a parked chunk at `addr` (a MISSING or MINOR fault; stage lock held). Where
 * no old version is needed, the chunk is unparked whole. Else only the touched OS page is
 * mapped into it (UFFDIO_CONTINUE; its arena page's other OS pages fault on their own),
 * write-protected unless this first write unprotects its arena page. */
static void on_parked_fault(uint64_t addr, int write) {
    const uint64_t os_page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t off = (addr & ~(os_page - 1)) - (uint64_t)(uintptr_t)V.base, p = off / V.ps;
    struct uffdio_range page = {(uint64_t)(uintptr_t)V.base + off, os_page};
    uint64_t c = V.wt ? cl_wtrack_chunk_of(V.wt, p) : 0;
    if (!V.wt || !cl_wtrack_is_parked(V.wt, c)) { /* unparked since the fault: that woke it, or this does */
        ioctl(V.uffd, UFFDIO_WAKE, &page);
        return;
    }
    if (no_version_needed()) {
        ADD(unparks, 1); /* counted before the unpark wakes the faulting thread (it may read the stats) */
        if (cl_wtrack_unpark(V.wt, c) == 0) {
            V.wrote_uncopied |= write; /* a read leaves the chunk async, unwritten: see retain */
            return;
        }
        __atomic_fetch_sub(&driver_stats()->unparks, 1, __ATOMIC_RELAXED);
    }
    pages_lock(p);
    pages_touch(off); /* an OS page never written comes to be */
    if (write) first_write(p);
    struct uffdio_continue cont = {.range = page, .mode = pages_protected(p) ? UFFDIO_CONTINUE_MODE_WP : 0};
    ADD(parked_faults, 1); /* before the mapping wakes the faulting thread */
    int rc;
    while ((rc = ioctl(V.uffd, UFFDIO_CONTINUE, &cont)) && errno == EAGAIN) /* the mappings are changing */
        cont.mapped = 0;
    if (rc && errno == EEXIST) ioctl(V.uffd, UFFDIO_WAKE, &page); /* another fault mapped it */
    else if (rc) {
        cl_log("cannot map page %llu of a parked chunk: %s", (unsigned long long)p, strerror(errno));
        abort(); /* the faulting thread would wait forever */
    }
    pages_unlock(p);
}

/* A fault reported by the trapping userfaultfd: a write to a protected page, or a
 * touch of a parked chunk. */
static void on_fault(const struct uffd_msg *msg) {
    uint64_t p = (msg->arg.pagefault.address - (uint64_t)(uintptr_t)V.base) / V.ps;
    if (p >= V.npages) return;
    pthread_mutex_lock(&V.stage);
    if (msg->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) on_write_fault(p);
    else on_parked_fault(msg->arg.pagefault.address, !!(msg->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE));
    pthread_mutex_unlock(&V.stage);
}

/* The write handler thread: serves the trapping userfaultfd until stopped. */
static void *fault_main(void *arg) {
    (void)arg;
    struct pollfd fds[2] = {{V.uffd, POLLIN, 0}, {V.stop_efd, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
        if (fds[1].revents) break;
        struct uffd_msg msgs[16];
        ssize_t n = read(V.uffd, msgs, sizeof msgs);
        if (n <= 0) continue;
        for (ssize_t i = 0; i < n / (ssize_t)sizeof msgs[0]; i++)
            if (msgs[i].event == UFFD_EVENT_PAGEFAULT) on_fault(&msgs[i]);
    }
    return NULL;
}

/* Chunks under async tracking are parked (or, where that fails, go back to traps);
 * what was written in them, and every page unprotected before, is marked written.
 * Their pages below hw are protected now. A run of adjacent async chunks is parked in
 * one go where it is one mapping: a park's syscalls cost about 0.3 ms, and a driver
 * writing all over a large array leaves every chunk of it async (2-core VM). */
static void end_async_tracking(uint64_t hw) {
    if (!V.wt) return;
    const uint64_t chunks = cl_wtrack_chunks(V.wt);
    for (uint64_t c = 0, n; c < chunks; c += n) {
        n = 1;
        if (!cl_wtrack_is_async(V.wt, c)) continue;
        while (c + n < chunks && cl_wtrack_is_async(V.wt, c + n)) n++;
        if (n > 1 && cl_wtrack_park(V.wt, c, n, mark_written) == 0) {
            ADD(parks, n);
            ADD(park_runs, 1);
        } else {
            for (uint64_t i = c; i < c + n; i++) {
                if (cl_wtrack_park(V.wt, i, 1, mark_written) == 0) {
                    ADD(parks, 1);
                    ADD(park_runs, 1);
                } else cl_wtrack_to_sync(V.wt, i, hw, mark_written);
            }
        }
        uint64_t next = cl_wtrack_first_page(V.wt, c + n);
        pages_reprotect(cl_wtrack_first_page(V.wt, c), next < hw ? next : hw);
    }
}

/* ----------------------------------------------------------- lifecycle -- */

int versions_start(uint8_t *base, uint64_t ps, uint64_t npages, char *err, size_t errlen) {
    memset(&V, 0, sizeof V);
    V.uffd = V.stop_efd = -1;
    V.base = base, V.ps = ps, V.npages = npages;
    pthread_mutex_init(&V.stage, NULL);
    /* MINOR_SHMEM: async chunks can be parked at stage starts (write_tracking.h). */
    const uint64_t wp = UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_WP_UNPOPULATED_;
    V.uffd = cl_uffd_open(wp | UFFD_FEATURE_MINOR_SHMEM, err, errlen);
    int can_park = V.uffd >= 0;
    if (V.uffd < 0) V.uffd = cl_uffd_open(wp, err, errlen);
    if (V.uffd < 0) V.uffd = cl_uffd_open(UFFD_FEATURE_WP_HUGETLBFS_SHMEM, err, errlen);
    if (V.uffd < 0 || cl_uffd_register(V.uffd, base, npages * ps, UFFDIO_REGISTER_MODE_WP, err, errlen)) return -1;
    char why[256];
    const char *mode = getenv("CLAMOR_WRITE_TRACKING"); /* "trap": never async (tests, doubts) */
    V.wt = mode && !strcmp(mode, "trap") ? NULL : cl_wtrack_new(V.uffd, can_park, base, ps, npages, why, sizeof why);
    driver_stats()->async_write_tracking = V.wt != NULL;
    V.stop_efd = eventfd(0, EFD_CLOEXEC);
    if (pthread_create(&V.thread, NULL, fault_main, NULL)) return CL_ERR("cannot start the write-tracking thread");
    return 0;
}

void versions_stop(void) {
    uint64_t one = 1;
    if (write(V.stop_efd, &one, sizeof one) < 0) {}
    pthread_join(V.thread, NULL);
}

void versions_free(void) {
    cl_wtrack_free(V.wt); /* before the sync userfaultfd: it may hold chunks */
    if (V.uffd >= 0) close(V.uffd); /* also lifts every write protection */
    if (V.stop_efd >= 0) close(V.stop_efd);
    memset(&V, 0, sizeof V);
    V.uffd = V.stop_efd = -1;
}

/* -------------------------------------------------------------- stages -- */

uint32_t versions_begin_stage(void) {
    pthread_mutex_lock(&V.stage);
    uint64_t hw = high_water_pages();
    uint32_t E = pages_epoch() + 1;
    end_async_tracking(hw);
    /* Protect first, so no write can slip between sealing and protecting. */
    pages_each_unprotected(hw, protect);
    pages_seal(E, hw, zap_same_host());
    __atomic_store_n(&driver_stats()->stage_running, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&V.stage);
    return E;
}

/* No stage will read epochs <= E any more (lineage and checkpoints need none of them;
 * attempts still running from E are discarded): until the next stage, the driver's
 * writes need no copy of the old bytes, and go untrapped where the kernel can. */
void versions_release(uint32_t E) {
    pthread_mutex_lock(&V.stage);
    if (E > atomic_load(&V.released)) {
        atomic_store(&V.released, E);
        V.wrote_uncopied = 0;
    }
    pthread_mutex_unlock(&V.stage);
}

/* clamor_driver_write_rows: every page the rows cover has its first write (as a trap
 * would: first_write), then the bytes go in through the untracked mapping, all under the
 * stage lock, so no stage seals an epoch between the two. Refused (1) while a stage runs:
 * its same-host readers would have to be shot down page by page, which traps do. */
int versions_write_rows(const int64_t *offsets, uint64_t n, const uint8_t *values, uint64_t row_bytes) {
    const uint64_t size = V.npages * V.ps;
    for (uint64_t i = 0; i < n; i++)
        if (offsets[i] < 0 || (uint64_t)offsets[i] > size || row_bytes > size - (uint64_t)offsets[i]) return -1;
    pthread_mutex_lock(&V.stage);
    if (__atomic_load_n(&driver_stats()->stage_running, __ATOMIC_ACQUIRE)) {
        pthread_mutex_unlock(&V.stage);
        return 1;
    }
    for (uint64_t i = 0; i < n && row_bytes; i++) {
        uint64_t first = (uint64_t)offsets[i] / V.ps, last = ((uint64_t)offsets[i] + row_bytes - 1) / V.ps;
        for (uint64_t p = first; p <= last; p++) {
            pages_lock(p);
            if (pages_fresh(p)) {
                first_write(p);
                pages_still_protected(p);
            }
            pages_unlock(p);
        }
    }
    for (uint64_t i = 0; i < n; i++) pages_write((uint64_t)offsets[i], values + i * row_bytes, row_bytes);
    ADD(direct_writes, n);
    pthread_mutex_unlock(&V.stage);
    return 0;
}

/* Epoch E is needed again after all (Cluster.keep_versions): undoes a release of it
 * if no write since went without a copy. 0: its versions are all there; -1: gone. */
int versions_retain(uint32_t E) {
    int rc = -1;
    pthread_mutex_lock(&V.stage);
    if (E <= atomic_load(&V.released) && !V.wrote_uncopied) {
        /* Chunks a read unparked are async: writes there from now on must trap, and
         * one written meanwhile means an uncopied write after all. */
        uint64_t before = V.marked;
        end_async_tracking(high_water_pages());
        V.wrote_uncopied = V.marked != before;
    }
    if (E > atomic_load(&V.released)) rc = 0;
    else if (!V.wrote_uncopied) atomic_store(&V.released, E ? E - 1 : 0), rc = 0;
    pthread_mutex_unlock(&V.stage);
    return rc;
}
