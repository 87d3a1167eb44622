/* Async write tracking of the driver's arena: see write_tracking.h. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pager_common.h"
#include "write_tracking.h"

/* Newer than the build machine's headers, perhaps (Linux 6.7 uapi). */
#ifndef PAGEMAP_SCAN
#define PAGE_IS_WRITTEN (1 << 1)
#define PAGE_IS_PRESENT (1 << 3)
struct page_region {
    uint64_t start, end, categories;
};
struct pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif
#ifndef PM_SCAN_WP_MATCHING
#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
#endif
#ifndef UFFDIO_REGISTER_MODE_MINOR
#define UFFDIO_REGISTER_MODE_MINOR ((__u64)1 << 2)
#endif
#define WT_FEATURE_WP_UNPOPULATED (1 << 13)
#define WT_FEATURE_WP_ASYNC (1 << 15)
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

enum { WT_SYNC, WT_ASYNC, WT_PARKED };

struct cl_wtrack {
    uint8_t *base;
    uint64_t ps, npages, chunk_pages, nchunks;
    int sync_fd, async_fd, pagemap_fd, stop_efd;
    uint8_t *state;    /* per chunk: WT_SYNC, WT_ASYNC or WT_PARKED */
    uint8_t *scratch;  /* CL_WT_CHUNK_BYTES of reserved address space for a chunk's page tables */
    uint8_t *parking;  /* the arena's size of reserved address space: chunk c's tables while parked
                          lie at the same offset; MAP_FAILED where chunks cannot be parked */
    pthread_t drainer;
};

static int wp_ioctl(int uffd, uint8_t *addr, uint64_t len, unsigned long req) {
    if (!len) return 0;
    if (req == UFFDIO_WRITEPROTECT) {
        struct uffdio_writeprotect wp = {.range = {(uint64_t)(uintptr_t)addr, len}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
        return ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);
    }
    if (req == UFFDIO_REGISTER) {
        struct uffdio_register r = {.range = {(uint64_t)(uintptr_t)addr, len}, .mode = UFFDIO_REGISTER_MODE_WP};
        return ioctl(uffd, UFFDIO_REGISTER, &r);
    }
    struct uffdio_range r = {(uint64_t)(uintptr_t)addr, len};
    return ioctl(uffd, UFFDIO_UNREGISTER, &r);
}

/* Marks the pages of [start, end) (of a mapping whose first page is arena page
 * `first`) that are in `category`: how many, or -1 if the scan failed. `flags`:
 * PAGEMAP_SCAN's (PM_SCAN_WP_MATCHING: write-protect what it finds). */
static int64_t scan_flags(cl_wtrack *t, uint8_t *start, uint8_t *end, uint64_t flags, uint64_t category, uint64_t first,
                          cl_wt_mark mark) {
    struct page_region vec[256];
    struct pm_scan_arg a = {
        .size = sizeof a, .flags = flags, .start = (uint64_t)(uintptr_t)start, .end = (uint64_t)(uintptr_t)end,
        .vec = (uint64_t)(uintptr_t)vec, .vec_len = 256, .category_mask = category, .return_mask = category,
    };
    int64_t found = 0;
    while (a.start < a.end) {
        long n = ioctl(t->pagemap_fd, PAGEMAP_SCAN, &a);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        for (long i = 0; i < n; i++) {
            uint64_t lo = (vec[i].start - (uint64_t)(uintptr_t)start) / t->ps;
            uint64_t hi = (vec[i].end - (uint64_t)(uintptr_t)start + t->ps - 1) / t->ps;
            mark(first + lo, hi - lo);
            found += (int64_t)(hi - lo);
        }
        a.start = a.walk_end;
    }
    return found;
}

static int64_t scan(cl_wtrack *t, uint8_t *start, uint8_t *end, uint64_t category, uint64_t first, cl_wt_mark mark) {
    return scan_flags(t, start, end, 0, category, first, mark);
}

/* Reads (and drops) the async userfaultfd's messages: the mremap of a chunk that it
 * tracks waits until its UFFD_EVENT_REMAP is read. Takes no lock. */
static void *drain_main(void *arg) {
    cl_wtrack *t = arg;
    struct pollfd fds[2] = {{t->async_fd, POLLIN, 0}, {t->stop_efd, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
        if (fds[1].revents) break;
        struct uffd_msg msgs[16];
        if (read(t->async_fd, msgs, sizeof msgs) < 0 && errno != EAGAIN && errno != EINTR) break;
    }
    return NULL;
}

cl_wtrack *cl_wtrack_new(int sync_fd, int can_park, uint8_t *base, uint64_t ps, uint64_t npages, char *why,
                         size_t whylen) {
    cl_wtrack *t = calloc(1, sizeof *t);
    if (!t) return snprintf(why, whylen, "out of memory"), NULL;
    t->base = base, t->ps = ps, t->npages = npages, t->sync_fd = sync_fd;
    t->chunk_pages = CL_WT_CHUNK_BYTES > ps ? CL_WT_CHUNK_BYTES / ps : 1;
    t->nchunks = (npages + t->chunk_pages - 1) / t->chunk_pages;
    t->async_fd = t->pagemap_fd = t->stop_efd = -1;
    t->scratch = t->parking = MAP_FAILED;
    char err[256];
    size_t errlen = sizeof err;
    t->async_fd = cl_uffd_open(UFFD_FEATURE_WP_HUGETLBFS_SHMEM | WT_FEATURE_WP_UNPOPULATED | WT_FEATURE_WP_ASYNC
                                   | UFFD_FEATURE_EVENT_REMAP, err, errlen);
    if (t->async_fd < 0) {
        snprintf(why, whylen, "no async write-protect (Linux 6.7+): %s", err);
        goto fail;
    }
    t->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    struct pm_scan_arg probe = {.size = sizeof probe, .start = (uint64_t)(uintptr_t)base,
                                .end = (uint64_t)(uintptr_t)base, .category_mask = PAGE_IS_WRITTEN};
    if (t->pagemap_fd < 0 || ioctl(t->pagemap_fd, PAGEMAP_SCAN, &probe) < 0) {
        snprintf(why, whylen, "no PAGEMAP_SCAN (Linux 6.7+): %s", strerror(errno));
        goto fail;
    }
    t->state = calloc(t->nchunks, 1);
    /* Aligned as the arena is, so that parking a chunk moves its page tables a table at
     * a time: entry by entry it cost 0.25 ms per 64 MiB chunk of 4 KiB pages (2-core VM). */
    t->scratch = cl_reserve_aligned(t->chunk_pages * ps, CL_PMD_BYTES);
    if (can_park) t->parking = cl_reserve_aligned(npages * ps, CL_PMD_BYTES);
    t->stop_efd = eventfd(0, EFD_CLOEXEC);
    if (!t->state || t->scratch == MAP_FAILED || t->stop_efd < 0) {
        snprintf(why, whylen, "cannot set up async write tracking: %s", strerror(errno));
        goto fail;
    }
    if (pthread_create(&t->drainer, NULL, drain_main, t)) {
        snprintf(why, whylen, "cannot start the async write tracking thread");
        close(t->stop_efd), t->stop_efd = -1;
        goto fail;
    }
    return t;
fail:
    cl_wtrack_free(t);
    return NULL;
}

/* Ends the drainer and closes the async userfaultfd (which lifts its protection).
 * The arena stays as it is: the driver pager closes the sync one after this. */
void cl_wtrack_free(cl_wtrack *t) {
    if (!t) return;
    if (t->stop_efd >= 0) {
        uint64_t one = 1;
        if (write(t->stop_efd, &one, sizeof one) < 0) {}
        pthread_join(t->drainer, NULL);
        close(t->stop_efd);
    }
    if (t->scratch != MAP_FAILED) munmap(t->scratch, t->chunk_pages * t->ps);
    if (t->parking != MAP_FAILED) munmap(t->parking, t->npages * t->ps); /* parked tables go; the memfd keeps the bytes */
    if (t->pagemap_fd >= 0) close(t->pagemap_fd);
    if (t->async_fd >= 0) close(t->async_fd);
    free(t->state);
    free(t);
}

uint64_t cl_wtrack_chunk_of(const cl_wtrack *t, uint64_t page) { return page / t->chunk_pages; }
int cl_wtrack_is_async(const cl_wtrack *t, uint64_t chunk) { return chunk < t->nchunks && t->state[chunk] == WT_ASYNC; }
int cl_wtrack_is_parked(const cl_wtrack *t, uint64_t chunk) { return chunk < t->nchunks && t->state[chunk] == WT_PARKED; }
uint64_t cl_wtrack_chunks(const cl_wtrack *t) { return t->nchunks; }
uint64_t cl_wtrack_first_page(const cl_wtrack *t, uint64_t chunk) { return chunk * t->chunk_pages; }

/* The chunk's first page, its address and length, and the length of its part below hw. */
static uint8_t *chunk_range(const cl_wtrack *t, uint64_t c, uint64_t hw, uint64_t *first, uint64_t *len, uint64_t *hwlen) {
    *first = c * t->chunk_pages;
    uint64_t n = t->npages - *first < t->chunk_pages ? t->npages - *first : t->chunk_pages;
    uint64_t below = hw > *first ? hw - *first : 0;
    *len = n * t->ps;
    *hwlen = (below < n ? below : n) * t->ps;
    return t->base + *first * t->ps;
}

/* Wakes the threads waiting on a trap in [a, a + len) of the sync userfaultfd. */
static void wake_sync(cl_wtrack *t, uint8_t *a, uint64_t len) {
    struct uffdio_range wake = {(uint64_t)(uintptr_t)a, len};
    ioctl(t->sync_fd, UFFDIO_WAKE, &wake);
}

/* Moves the chunk's page tables to the scratch area; the chunk stays mapped, empty. */
static int move_aside(cl_wtrack *t, uint8_t *a, uint64_t len) {
    void *r = mremap(a, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, t->scratch);
    return r == MAP_FAILED ? -1 : 0;
}

/* Gives [at, at + len) of a reserved area (the scratch area, a parking slot) its
 * empty, reserved address space back: what was moved there is dropped. */
static void clear_reserved(uint8_t *at, uint64_t len) {
    void *r = mmap(at, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (r == MAP_FAILED) cl_log("async write tracking: cannot reset a reserved area: %s", strerror(errno));
}

/* Registers [a, a + len) with `uffd` and write-protects its first hwlen bytes. If
 * that fails, with the sync userfaultfd instead (the chunk is then as before). */
static int take_over(cl_wtrack *t, int uffd, uint8_t *a, uint64_t len, uint64_t hwlen) {
    if (wp_ioctl(uffd, a, len, UFFDIO_REGISTER) == 0 && wp_ioctl(uffd, a, hwlen, UFFDIO_WRITEPROTECT) == 0) return 0;
    cl_log("async write tracking: cannot hand a chunk over: %s", strerror(errno));
    wp_ioctl(uffd, a, len, UFFDIO_UNREGISTER);
    if (wp_ioctl(t->sync_fd, a, len, UFFDIO_REGISTER) || wp_ioctl(t->sync_fd, a, hwlen, UFFDIO_WRITEPROTECT)) {
        cl_log("async write tracking: cannot restore write-protection: %s", strerror(errno));
        abort(); /* versions would silently go wrong */
    }
    return -1;
}

int cl_wtrack_to_async(cl_wtrack *t, uint64_t c, uint64_t hw, cl_wt_mark mark) {
    uint64_t first, len, hwlen;
    uint8_t *a = chunk_range(t, c, hw, &first, &len, &hwlen);
    if (t->state[c] != WT_SYNC) return t->state[c] == WT_ASYNC ? 0 : -1;
    /* The sync side's state lives in the driver's flags: what moves aside is not read. */
    if (move_aside(t, a, len)) {
        cl_log("async write tracking: mremap failed (%s); staying with traps", strerror(errno));
        return -1;
    }
    /* mremap may already have dropped the registration (no UFFD_FEATURE_EVENT_REMAP on
     * the sync side), so the writers waiting on a trap in the chunk are woken here. */
    wp_ioctl(t->sync_fd, a, len, UFFDIO_UNREGISTER);
    wake_sync(t, a, len);
    int rc = take_over(t, t->async_fd, a, len, hwlen);
    if (scan(t, a, a + len, PAGE_IS_PRESENT, first, mark) < 0) mark(first, len / t->ps);
    clear_reserved(t->scratch, t->chunk_pages * t->ps);
    if (rc == 0) t->state[c] = WT_ASYNC;
    else mark(first, len / t->ps); /* written while unprotected, for all we know */
    return rc;
}

void cl_wtrack_to_sync(cl_wtrack *t, uint64_t c, uint64_t hw, cl_wt_mark mark) {
    uint64_t first, len, hwlen;
    uint8_t *a = chunk_range(t, c, hw, &first, &len, &hwlen);
    if (t->state[c] != WT_ASYNC) return;
    if (move_aside(t, a, len) == 0) { /* its written bits go with it (UFFD_FEATURE_EVENT_REMAP) */
        if (scan(t, t->scratch, t->scratch + hwlen, PAGE_IS_WRITTEN, first, mark) < 0) mark(first, len / t->ps);
    } else {
        cl_log("async write tracking: mremap failed (%s); every page of the chunk counts as written", strerror(errno));
        mark(first, len / t->ps);
    }
    wp_ioctl(t->async_fd, a, len, UFFDIO_UNREGISTER);
    if (take_over(t, t->sync_fd, a, len, hwlen)) mark(first, len / t->ps);
    if (scan(t, a, a + len, PAGE_IS_PRESENT, first, mark) < 0) mark(first, len / t->ps);
    clear_reserved(t->scratch, t->chunk_pages * t->ps);
    t->state[c] = WT_SYNC;
}

/* Moves a parked chunk's page tables from its slot back to [a, a + len), replacing what
 * is there, and frees the slot's address space for the next parking. -1: mremap failed. */
static int move_back(uint8_t *slot, uint8_t *a, uint64_t len) {
    if (mremap(slot, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, a) == MAP_FAILED) return -1;
    clear_reserved(slot, len);
    return 0;
}

int cl_wtrack_park(cl_wtrack *t, uint64_t c, uint64_t n, cl_wt_mark mark) {
    if (t->parking == MAP_FAILED || !n || c + n > t->nchunks) return -1;
    for (uint64_t i = c; i < c + n; i++)
        if (t->state[i] != WT_ASYNC) return -1;
    uint64_t first, len, last_first, last_len, hwlen;
    uint8_t *a = chunk_range(t, c, 0, &first, &len, &hwlen);
    chunk_range(t, c + n - 1, 0, &last_first, &last_len, &hwlen);
    len = (last_first - first) * t->ps + last_len;
    uint8_t *slot = t->parking + first * t->ps;
    if (mremap(a, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, slot) == MAP_FAILED) {
        /* a run over several mappings: EFAULT, nothing moved; the caller parks chunks */
        if (n == 1 || errno != EFAULT) cl_log("async write tracking: cannot park a chunk (%s); back to traps", strerror(errno));
        return -1;
    }
    /* The tables came along with their async registration (UFFD_FEATURE_EVENT_REMAP):
     * list the pages written and write-protect them again, for when the chunk is back. */
    if (scan_flags(t, slot, slot + len, PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC, PAGE_IS_WRITTEN, first, mark) < 0) {
        cl_log("async write tracking: cannot rearm a parked chunk (%s); back to traps", strerror(errno));
        if (move_back(slot, a, len)) abort(); /* the chunk would stay empty and untracked */
        return -1;
    }
    wp_ioctl(t->async_fd, a, len, UFFDIO_UNREGISTER);
    struct uffdio_register r = {.range = {(uint64_t)(uintptr_t)a, len},
                                .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR
                                        | UFFDIO_REGISTER_MODE_WP};
    if (ioctl(t->sync_fd, UFFDIO_REGISTER, &r)) {
        cl_log("async write tracking: cannot register a parked chunk (%s); back to traps", strerror(errno));
        if (move_back(slot, a, len)) abort(); /* the chunk would stay empty and untracked */
        mark(first, len / t->ps); /* untracked for a moment */
        return -1;
    }
    /* Pages another thread touched between the mremap and the registration are
     * mapped in the chunk, untracked: count them written and protect them. Only
     * then: protecting the empty chunk would fill it with markers (~2 ms). */
    int64_t touched = scan(t, a, a + len, PAGE_IS_PRESENT, first, mark);
    if (touched < 0) mark(first, len / t->ps);
    if (touched && wp_ioctl(t->sync_fd, a, len, UFFDIO_WRITEPROTECT)) {
        cl_log("async write tracking: cannot protect a parked chunk: %s", strerror(errno));
        abort(); /* versions would silently go wrong */
    }
    memset(t->state + c, WT_PARKED, n);
    return 0;
}

int cl_wtrack_unpark(cl_wtrack *t, uint64_t c) {
    uint64_t first, len, hwlen;
    uint8_t *a = chunk_range(t, c, 0, &first, &len, &hwlen);
    if (t->state[c] != WT_PARKED) return t->state[c] == WT_ASYNC ? 0 : -1;
    uint8_t *slot = t->parking + first * t->ps;
    /* Replaces the empty chunk (and its sync registration) in one step: a thread sees
     * either the parked chunk, and traps, or the async one. */
    if (move_back(slot, a, len)) {
        cl_log("async write tracking: cannot unpark a chunk: %s", strerror(errno));
        return -1;
    }
    t->state[c] = WT_ASYNC;
    wake_sync(t, a, len);
    return 0;
}
