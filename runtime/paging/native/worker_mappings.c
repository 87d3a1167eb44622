/* The worker's arena range and what it maps (worker_mappings.h).
 *
 * The arena range is a read-only shared mapping of the cache's private memfd,
 * registered with userfaultfd for MISSING and MINOR faults; fetched pages are
 * written into the memfd itself and mapped with UFFDIO_CONTINUE.
 *
 * Zero copy on the driver's host: the range maps the driver's arena memfd
 * itself, registered the same way. A fault on a page whose driver bytes are the
 * version the task's epoch reads (sealed at or before it, not written since) is
 * resolved by mapping the driver's page (UFFDIO_CONTINUE): no copy, no cache
 * slot. Otherwise (the driver wrote it during this epoch, an older epoch is
 * replayed, a hole) that one page of the range is re-pointed at the cache memfd
 * and the right version is copied in. The driver shoots a mapped page down
 * before its first write lands (pager_common.h); the shoot-down thread here
 * unmaps it under map_lock, which is held while a page is mapped from the driver.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pager_common.h"
#include "worker_base.h"
#include "worker_cache.h"
#include "worker_conn.h"
#include "worker_mappings.h"
#include "worker_read_sets.h"

static struct {
    uint8_t *ro;              /* the range */
    uint64_t size, ps, npages;
    int uffd;
    int zero_copy;            /* the range maps the driver's memfd (same host) */
    uint8_t *private_page;    /* zero copy: 1 where the range maps the cache memfd instead */
    uint32_t *mapped_ver1;    /* zero copy: version + 1 of the page last counted as mapped */
    _Atomic uint64_t *mapped; /* zero copy: our bitmap of pages mapped from the driver (shared) */
    _Atomic uint64_t *pieces; /* zero copy: per OS page of the range, mapped from the driver (a hint) */
    uint64_t os_page;
    cl_zap_head *zap_head;    /* zero copy: the shoot-down area's head (shared with the driver) */
    cl_zap_slot *zap;         /* zero copy: our shoot-down slot (shared with the driver) */
    _Atomic uint32_t *maps;   /* zero copy: per page, mappings from the driver (shared) */
    pthread_mutex_t map_lock; /* zero copy: mapping from the driver vs. shoot-downs */
    _Atomic uint64_t touched; /* every page ever mapped is below it */
    _Atomic uint64_t last_direct; /* zero copy: the page of the last fault mapped in place, + 1 */
} M;

/* Joins the driver's shoot-down area: our slot, our bitmap (zeroed), the per-page counts. */
static int join_zap_area(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    void *area = fd < 0 ? MAP_FAILED
                        : mmap(NULL, cl_zap_area_bytes(M.npages), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    /* Our bitmap starts zeroed and takes no memory until we map pages: punched out
     * of the memfd (stores of zeros would allocate all of it). */
    int zeroed = area != MAP_FAILED
                 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                              (off_t)cl_zap_bits_offset(M.npages, worker_id()), (off_t)cl_zap_bits_bytes(M.npages)) == 0;
    if (fd >= 0) close(fd);
    M.private_page = calloc(M.npages, 1);
    M.pieces = calloc(cl_zap_words(M.size / M.os_page), sizeof *M.pieces);
    M.mapped_ver1 = calloc(M.npages, sizeof *M.mapped_ver1);
    if (area == MAP_FAILED || !M.private_page || !M.mapped_ver1 || !M.pieces)
        return CL_ERR("cannot map the driver's shoot-down area (%s): %s", path, strerror(errno));
    M.zap_head = cl_zap_head_of(area);
    M.zap = cl_zap_slot_of(area, worker_id());
    M.mapped = cl_zap_bits(area, M.npages, worker_id());
    M.maps = cl_zap_maps(area, M.npages);
    M.zero_copy = 1;
    if (!zeroed)
        for (uint64_t i = 0; i < cl_zap_words(M.npages); i++) atomic_store(&M.mapped[i], 0);
    return 0;
}

int maps_init(uint64_t size, uint64_t ps, int zero_copy, const char *zap_path, char *err, size_t errlen) {
    memset(&M, 0, sizeof M);
    M.size = size, M.ps = ps, M.npages = size / ps, M.os_page = (uint64_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_init(&M.map_lock, NULL);
    if (zero_copy && join_zap_area(zap_path, err, errlen)) return -1;
    M.ro = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_NORESERVE, M.zero_copy ? conn_shm_fd() : cache_fd(), 0);
    if (M.ro == MAP_FAILED)
        return CL_ERR("cannot reserve %llu bytes for the arena: %s", (unsigned long long)size, strerror(errno));
    M.uffd = cl_uffd_open(UFFD_FEATURE_MINOR_SHMEM, err, errlen);
    if (M.uffd < 0) return -1;
    return cl_uffd_register(M.uffd, M.ro, size, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR, err, errlen);
}

uint8_t *maps_base(void) { return M.ro; }
int maps_uffd(void) { return M.uffd; }
int maps_zero_copy(void) { return M.zero_copy; }
void maps_new_task(void) { atomic_store(&M.last_direct, UINT64_MAX); }

/* ------------------------------------------- OS pages mapped in place -- */

/* Bits [first, end) of the pieces bitmap: set (`on`), cleared, or whether all are set. */
static int pieces_bits(uint64_t first, uint64_t end, int on, int test) {
    for (uint64_t b = first; b < end;) {
        uint64_t w = b >> 6, lo = b & 63, n = end - b < 64 - lo ? end - b : 64 - lo;
        uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << lo;
        if (test) {
            if ((atomic_load_explicit(&M.pieces[w], memory_order_relaxed) & mask) != mask) return 0;
        } else if (on) {
            atomic_fetch_or_explicit(&M.pieces[w], mask, memory_order_relaxed);
        } else {
            atomic_fetch_and_explicit(&M.pieces[w], ~mask, memory_order_relaxed);
        }
        b += n;
    }
    return 1;
}

/* Page p is no longer mapped from the driver (or never was): its bit and its pieces' go. */
static void forget_direct(uint64_t p) {
    atomic_fetch_and(&M.mapped[p >> 6], ~(1ull << (p & 63)));
    const uint64_t per = M.ps / M.os_page;
    pieces_bits(p * per, (p + 1) * per, 0, 0);
}

int maps_has_pieces(uint64_t first, uint64_t n) {
    if (!M.zero_copy || !n) return 0;
    uint64_t p = first / (M.ps / M.os_page);
    return (atomic_load(&M.mapped[p >> 6]) & (1ull << (p & 63))) && pieces_bits(first, first + n, 0, 1);
}

/* ---------------------------------------------------------- the range -- */

/* Maps a cached page into the read-only range and wakes its faulting threads.
 * A page can be found partly mapped (a task-start zap racing a mapping of the
 * same page): UFFDIO_CONTINUE then stops with EEXIST at the first mapped 4 KiB
 * piece, having mapped only what came before it. The rest is mapped piece by
 * piece, skipping the mapped ones; giving up at EEXIST instead leaves a faulting
 * thread on an unmapped piece that faults again forever (seen in bench/lookups.py
 * --network: a worker spinning at 100 % with UFFDIO_CONTINUE -> EEXIST). */
/* Maps page p of the range from its file's page cache. A piece not in the file
 * (EFAULT: a hole, never written) is filled with a zero page when `holes` is
 * set (the driver's memfd: a hole reads as zeros, and a driver write to it traps
 * like any other), else it fails. */
static int try_map_range(uint64_t at, uint64_t end, int holes) {
    const uint64_t piece = M.os_page, base = (uint64_t)(uintptr_t)M.ro;
    while (at < end) {
        struct uffdio_continue c = {.range = {at, end - at}};
        if (ioctl(M.uffd, UFFDIO_CONTINUE, &c) == 0) { /* mapped to the end, and woken */
            if (holes && M.pieces) pieces_bits((at - base) / piece, (end - base) / piece, 1, 0);
            return 0;
        }
        if (errno == EAGAIN && c.mapped > 0) {
            at += (uint64_t)c.mapped; /* stopped short at a mapped piece: EEXIST next */
        } else if (errno == EEXIST) {
            at += piece; /* the first piece is mapped already */
        } else if (errno == EFAULT && holes) {
            struct uffdio_zeropage z = {.range = {at, piece}};
            if (ioctl(M.uffd, UFFDIO_ZEROPAGE, &z) == 0) at += piece;
            else if (errno != EEXIST) return -1; /* EEXIST: the driver just wrote it; map that */
        } else {
            return -1;
        }
    }
    return 0;
}

static int try_map(uint64_t p, int holes) {
    uint64_t at = (uint64_t)(uintptr_t)(M.ro + p * M.ps);
    return try_map_range(at, at + M.ps, holes);
}

static void map_page(uint64_t p) {
    if (try_map(p, 0) == 0) return;
    cl_log("worker %d: mapping page %llu failed: %s", worker_id(), (unsigned long long)p, strerror(errno));
    struct uffdio_range r = {(uint64_t)(uintptr_t)(M.ro + p * M.ps), M.ps};
    ioctl(M.uffd, UFFDIO_WAKE, &r);
}

/* ------------------------------------------------ same-host zero copy -- */

/* Points page p of the range at `fd` (the driver's memfd or the cache memfd) and
 * registers it again: a fresh mapping has no userfaultfd registration. */
static int remap(uint64_t p, int fd) {
    uint8_t *at = M.ro + p * M.ps;
    if (mmap(at, M.ps, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, (off_t)(p * M.ps)) == MAP_FAILED)
        return -1;
    struct uffdio_register r = {
        .range = {(uint64_t)(uintptr_t)at, M.ps},
        .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR,
    };
    return ioctl(M.uffd, UFFDIO_REGISTER, &r);
}

/* Page p's aligned FAULT_AROUND_BYTES block: [lo, hi) of `per` pages (fewer at the end). */
void maps_block_of(uint64_t p, uint64_t *per, uint64_t *lo, uint64_t *hi) {
    *per = FAULT_AROUND_BYTES / M.ps ? FAULT_AROUND_BYTES / M.ps : 1;
    *lo = p - p % *per;
    *hi = *lo + *per < M.npages ? *lo + *per : M.npages;
}

/* Claims page q for mapping in place at epoch E: sets q's bit in our shared bitmap
 * *before* reading its state (pager_common.h), then returns the version the driver's
 * bytes hold if that is the one E reads, else 0 with the bit cleared. A page that was
 * mapped already (its bit set) and is no longer current is unmapped here: clearing its
 * bit alone would let a shoot-down in flight skip it. map_lock held. */
static uint32_t claim_direct(uint64_t q, uint32_t E) {
    const uint64_t bit = 1ull << (q & 63);
    uint64_t before = atomic_fetch_or(&M.mapped[q >> 6], bit);
    uint64_t s = conn_shm_state(q);
    if (!(s & 1) && (s >> 1) && (s >> 1) <= E) return (uint32_t)(s >> 1);
    if (before & bit) madvise(M.ro + q * M.ps, M.ps, MADV_DONTNEED);
    forget_direct(q);
    return 0;
}

/* Page q shows version v in place: counted as mapped if that version is new to it (like
 * a fetch). 1: it was. */
static int count_version(uint64_t q, uint32_t v) {
    if (M.mapped_ver1[q] == v + 1) return 0;
    M.mapped_ver1[q] = v + 1;
    atomic_fetch_add_explicit(&M.zap->maps, 1, memory_order_relaxed);
    ADD(pages_mapped, 1);
    return 1;
}

/* Page q, claimed at version v, is recorded and counted: before the mapping wakes the
 * task, which may then end and report at once. */
static void count_direct(uint64_t q, uint32_t v, int first) {
    rs_record(q, v, CL_OPEN_ENDED);
    maps_mark_touched(q);
    if (first) atomic_fetch_add_explicit(&M.maps[q], 1, memory_order_relaxed); /* hotness */
    if (!count_version(q, v)) ADD(soft_faults, 1);
}

/* Fault-around (resident mode): maps page p, claimed at epoch E, and, once the block is
 * seen to be read densely (a quarter of its pages, at least 2, resident already), the
 * other pages of its aligned FAULT_AROUND_BYTES block that are current for E and not
 * mapped yet, in one UFFDIO_CONTINUE per run of such pages: a dense first pass takes a
 * few faults a block, not one or two a page, while sparse lookups still map just what
 * they touch. The neighbours count as mapped and read (the read set is resident pages).
 * 0: p is mapped. map_lock held. */
static int map_around(uint64_t p, uint32_t E) {
    uint64_t per, lo, hi, resident = 0;
    maps_block_of(p, &per, &lo, &hi);
    for (uint64_t q = lo; q < hi; q++) resident += q != p && rs_resident(q);
    if (resident < (per / 4 > 2 ? per / 4 : 2)) return try_map(p, 1);
    int ok = -1;
    for (uint64_t q = lo, start = lo; q <= hi; q++) {
        int take = 0;
        if (q == p) {
            take = 1;
        } else if (q < hi && !M.private_page[q] && !(atomic_load(&M.mapped[q >> 6]) & (1ull << (q & 63)))) {
            uint32_t v = claim_direct(q, E);
            if (v) count_direct(q, v, 1), ADD(faultaround_pages, 1), take = 1;
        }
        if (take) continue;
        if (q > start) { /* the run [start, q) */
            uint64_t a = (uint64_t)(uintptr_t)(M.ro + start * M.ps), b = (uint64_t)(uintptr_t)(M.ro + q * M.ps);
            int mapped = try_map_range(a, b, 1) == 0;
            if (start <= p && p < q) ok = mapped ? 0 : -1;
            if (!mapped)
                for (uint64_t r = start; r < q; r++) forget_direct(r);
        }
        start = q + 1;
    }
    return ok;
}

/* Maps the driver's own page p for a task at epoch E if the driver's bytes are the
 * version E reads. 0: mapped (and recorded); -1: the caller copies instead.
 * `at`: the faulting address, or 0 for the whole page (prefetch). `len` > 0: map
 * exactly the OS pages of [at, at + len) (a prefetch that knows which bytes the task
 * reads). A fault in resident mode maps p's block (map_around). With exact read sets,
 * where every task unmaps everything first, a task's first fault on a page larger than
 * the OS page maps just the OS page around `at`: a sparse lookup then installs one
 * page-table entry, not 64 (256 KiB pages); a second fault on the page, or a first one
 * right after a fault on the page before it (a scan), maps all of it. */
int maps_direct(uint64_t p, uint32_t E, uint64_t at, uint64_t len) {
    int mapped = 0, was_private = 0;
    pthread_mutex_lock(&M.map_lock);
    uint32_t v = claim_direct(p, E);
    if (v) {
        was_private = M.private_page[p];
        if (!was_private || remap(p, conn_shm_fd()) == 0) {
            M.private_page[p] = 0;
            const uint64_t os_page = M.os_page;
            int first = !rs_seen_by_task(p); /* this task's first touch */
            count_direct(p, v, first);
            if (len && !was_private) {
                uint64_t lo = at & ~(os_page - 1), hi = (at + len + os_page - 1) & ~(os_page - 1);
                mapped = try_map_range(lo, hi, 1) == 0;
            } else if (at && !rs_exact()) {
                mapped = map_around(p, E) == 0;
            } else if (at && first && !was_private && M.ps > os_page
                       && atomic_exchange(&M.last_direct, p + 1) != p) { /* not a scan */
                at &= ~(os_page - 1);
                mapped = try_map_range(at, at + os_page, 1) == 0;
                ADD(subpage_maps, 1);
            } else {
                mapped = try_map(p, 1) == 0;
            }
        }
        if (!mapped) forget_direct(p);
    }
    pthread_mutex_unlock(&M.map_lock);
    if (!mapped) return -1;
    if (was_private) cache_evict(p, 1); /* its copy is no longer what the range shows */
    return 0;
}

/* Maps page p from the cache (where it was just installed or found). */
void maps_cached(uint64_t p) {
    if (M.zero_copy && !M.private_page[p]) {
        pthread_mutex_lock(&M.map_lock);
        if (remap(p, cache_fd()))
            die(EXIT_PAGE_ERROR, "cannot map a private copy of a page (too many mappings? vm.max_map_count)", p);
        M.private_page[p] = 1;
        pthread_mutex_unlock(&M.map_lock);
    }
    map_page(p);
}

/* Answers the driver's shoot-downs: unmaps the page if we map it from the driver. */
static void *zap_main(void *arg) {
    (void)arg;
    uint32_t seen = atomic_load(&M.zap->req);
    for (;;) {
        uint32_t r = atomic_load(&M.zap->req);
        if (r == seen) {
            cl_futex_wait(&M.zap->req, seen, -1);
            continue;
        }
        seen = r;
        uint64_t p = atomic_load(&M.zap->page), bit = 1ull << (p & 63);
        if (p < M.npages) {
            pthread_mutex_lock(&M.map_lock);
            if (atomic_load(&M.mapped[p >> 6]) & bit) {
                madvise(M.ro + p * M.ps, M.ps, MADV_DONTNEED);
                forget_direct(p);
                ADD(shootdowns, 1);
            }
            pthread_mutex_unlock(&M.map_lock);
        }
        atomic_store(&M.zap->ack, r);
        cl_futex_wake(&M.zap->ack);
    }
    return NULL;
}

void maps_count_read(uint64_t p) {
    if (M.maps) atomic_fetch_add_explicit(&M.maps[p], 1, memory_order_relaxed);
}

void maps_prefetch_count(uint64_t p) {
    if (M.maps) __builtin_prefetch(&M.maps[p], 1);
}

/* Page p may be mapped from now on: maps_unmap_all unmaps [0, touched). */
void maps_mark_touched(uint64_t p) {
    uint64_t t = atomic_load(&M.touched);
    while (p + 1 > t && !atomic_compare_exchange_weak(&M.touched, &t, p + 1)) {}
}


void maps_cached_run(uint64_t first, uint64_t end) {
    try_map_range((uint64_t)(uintptr_t)(M.ro + first * M.ps), (uint64_t)(uintptr_t)(M.ro + end * M.ps), 0);
}

void maps_unmap_all(void) {
    uint64_t touched = atomic_load(&M.touched);
    if (M.zero_copy) pthread_mutex_lock(&M.map_lock);
    if (touched) madvise(M.ro, touched * M.ps, MADV_DONTNEED);
    if (M.zero_copy) {
        for (uint64_t i = 0; i < cl_zap_words(touched); i++) atomic_store(&M.mapped[i], 0);
        pieces_bits(0, touched * (M.ps / M.os_page), 0, 0);
        pthread_mutex_unlock(&M.map_lock);
    }
}

/* Whether page p, mapped from the driver, may stay mapped now that the driver wrote it
 * between stages: the range shows the driver's page cache there (not a private copy),
 * so the driver's bytes, and they are the version sealed for `epoch`. (A hole mapped
 * with UFFDIO_ZEROPAGE is no exception: on shared memory that puts a zeroed page into
 * the driver's memfd itself, which the driver's write then fills.) The read set then
 * records that version. map_lock held. */
static int advance_direct(uint64_t p, uint32_t epoch) {
    if (M.private_page[p]) return 0;
    uint64_t s = conn_shm_state(p);
    uint32_t v = (uint32_t)(s >> 1);
    if ((s & 1) || !v || v > epoch || rs_advance(p, v)) return 0;
    count_version(p, v);
    ADD(updated_in_place, 1);
    return 1;
}

void maps_invalidate_direct(const uint64_t *pages, uint64_t n, uint32_t epoch, uint8_t *outcome) {
    memset(outcome, MAP_UNTOUCHED, n);
    if (!M.zero_copy) return;
    uint64_t run_start = 0, run = 0; /* pages[run_start..+run) go, consecutive */
    pthread_mutex_lock(&M.map_lock);
    for (uint64_t i = 0; i <= n; i++) {
        uint64_t p = i < n ? pages[i] : UINT64_MAX;
        int mapped = p < M.npages && (atomic_load(&M.mapped[p >> 6]) & (1ull << (p & 63)));
        if (mapped && advance_direct(p, epoch)) {
            outcome[i] = MAP_ADVANCED;
            mapped = 0;
        }
        if (run && (!mapped || p != pages[run_start] + run)) { /* the run ends before i */
            madvise(M.ro + pages[run_start] * M.ps, run * M.ps, MADV_DONTNEED);
            run = 0;
        }
        if (!mapped) continue;
        forget_direct(p);
        outcome[i] = MAP_DROPPED;
        if (!run++) run_start = i;
    }
    pthread_mutex_unlock(&M.map_lock);
}

int maps_start_shootdowns(char *err, size_t errlen) {
    if (!M.zero_copy) return 0;
    pthread_t zap;
    if (pthread_create(&zap, NULL, zap_main, NULL)) return CL_ERR("cannot start the shoot-down thread");
    pthread_detach(zap);
    /* The driver looks at slots below head.slots: raised past us before our pid is
     * published and before any bit of ours is set (pager_common.h). */
    const uint32_t id = (uint32_t)worker_id();
    uint32_t slots = atomic_load(&M.zap_head->slots);
    while (slots < id + 1 && !atomic_compare_exchange_weak(&M.zap_head->slots, &slots, id + 1)) {}
    atomic_store(&M.zap->pid, (int32_t)getpid()); /* from now on the driver asks us */
    return 0;
}
