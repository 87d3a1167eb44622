/* The worker pager.
 *
 * The arena range is a read-only shared mapping of a private cache memfd,
 * registered with userfaultfd for MISSING and MINOR faults; fetched pages
 * are written into the memfd itself. A touch of a page that is not cached raises a MISSING fault: the
 * handler thread here (native, never the GIL) fetches (page, epoch) and maps
 * it with UFFDIO_CONTINUE.
 *
 * Read sets, and what stays mapped between tasks, are in worker_read_sets.c. A
 * fault in a block read densely maps its aligned FAULT_AROUND_BYTES block of
 * current pages at once (fault-around, resident mode).
 *
 * Pages enter the cache through the file, never through a mapping: writing
 * through a mapping traps once per 4 KiB to allocate and map, which costs
 * more than the copy itself (bench/paging.py). Same-host pages come with
 * copy_file_range from the driver's memfd, network pages are received into
 * a warm buffer and written with pwrite.
 *
 * Zero copy on the driver's host: the range maps the driver's arena memfd
 * itself, registered the same way. A fault on a page whose driver bytes are the
 * version the task's epoch reads (sealed at or before it, not written since) is
 * resolved by mapping the driver's page (UFFDIO_CONTINUE): no copy, no cache
 * slot. Otherwise (the driver wrote it during this epoch, an older epoch is
 * replayed, a hole) that one page of the range is re-pointed at the cache memfd
 * and the right version is copied in as below. The driver shoots a mapped page
 * down before its first write lands (pager_common.h); the shoot-down thread here
 * unmaps it under map_lock, which the fault handler holds while it maps.
 *
 * Fetch order: own cache -> the driver's memfd on this host (seqlock-checked
 * against the driver's page state table) -> the driver over TCP, which may
 * REDIRECT to a peer holding the page -> the driver again, NO_REDIRECT, if
 * that peer fails. A driver that cannot be reached makes the worker exit
 * with status 70 rather than hang.
 *
 * Cache limit (clamor_worker_set_cache_limit): before a page enters a full
 * cache, CLOCK (second chance) evicts one. Every fault (minor or missing) and
 * every install sets the page's reference bit; the hand sweeps page numbers
 * below clock_end, clears set bits and evicts the first cached page whose bit
 * is clear. Eviction punches the page out of the memfd, which also unmaps it,
 * so a later touch faults MISSING and fetches it again; the driver is told
 * (CL_HAVE_DROPPED) so it stops redirecting peers here for that page. Only the
 * fault handler thread installs and evicts for room, so the hand needs no lock.
 */
#include "worker_pager.h"

worker_state W;

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
    const uint64_t piece = (uint64_t)sysconf(_SC_PAGESIZE);
    while (at < end) {
        struct uffdio_continue c = {.range = {at, end - at}};
        if (ioctl(W.uffd, UFFDIO_CONTINUE, &c) == 0) return 0; /* mapped to the end, and woken */
        if (errno == EAGAIN && c.mapped > 0) {
            at += (uint64_t)c.mapped; /* stopped short at a mapped piece: EEXIST next */
        } else if (errno == EEXIST) {
            at += piece; /* the first piece is mapped already */
        } else if (errno == EFAULT && holes) {
            struct uffdio_zeropage z = {.range = {at, piece}};
            if (ioctl(W.uffd, UFFDIO_ZEROPAGE, &z) == 0) at += piece;
            else if (errno != EEXIST) return -1; /* EEXIST: the driver just wrote it; map that */
        } else {
            return -1;
        }
    }
    return 0;
}

static int try_map(uint64_t p, int holes) {
    uint64_t at = (uint64_t)(uintptr_t)(W.ro + p * W.ps);
    return try_map_range(at, at + W.ps, holes);
}

static void map_page(uint64_t p) {
    if (try_map(p, 0) == 0) return;
    cl_log("worker %d: mapping page %llu failed: %s", worker_id(), (unsigned long long)p, strerror(errno));
    struct uffdio_range r = {(uint64_t)(uintptr_t)(W.ro + p * W.ps), W.ps};
    ioctl(W.uffd, UFFDIO_WAKE, &r);
}

/* ------------------------------------------------ same-host zero copy -- */

/* Points page p of the range at `fd` (the driver's memfd or the cache memfd) and
 * registers it again: a fresh mapping has no userfaultfd registration. */
static int remap(uint64_t p, int fd) {
    uint8_t *at = W.ro + p * W.ps;
    if (mmap(at, W.ps, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, (off_t)(p * W.ps)) == MAP_FAILED)
        return -1;
    struct uffdio_register r = {
        .range = {(uint64_t)(uintptr_t)at, W.ps},
        .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR,
    };
    return ioctl(W.uffd, UFFDIO_REGISTER, &r);
}

/* Page p's aligned FAULT_AROUND_BYTES block: [lo, hi) of `per` pages (fewer at the end). */
static void block_of(uint64_t p, uint64_t *per, uint64_t *lo, uint64_t *hi) {
    *per = FAULT_AROUND_BYTES / W.ps ? FAULT_AROUND_BYTES / W.ps : 1;
    *lo = p - p % *per;
    *hi = *lo + *per < W.npages ? *lo + *per : W.npages;
}

/* Claims page q for mapping in place at epoch E: sets q's bit in our shared bitmap
 * *before* reading its state (pager_common.h), then returns the version the driver's
 * bytes hold if that is the one E reads, else 0 with the bit cleared. A page that was
 * mapped already (its bit set) and is no longer current is unmapped here: clearing its
 * bit alone would let a shoot-down in flight skip it. map_lock held. */
static uint32_t claim_direct(uint64_t q, uint32_t E) {
    const uint64_t bit = 1ull << (q & 63);
    uint64_t before = atomic_fetch_or(&W.mapped[q >> 6], bit);
    uint64_t s = atomic_load(&W.shm_state[q]);
    if (!(s & 1) && (s >> 1) && (s >> 1) <= E) return (uint32_t)(s >> 1);
    if (before & bit) madvise(W.ro + q * W.ps, W.ps, MADV_DONTNEED);
    atomic_fetch_and(&W.mapped[q >> 6], ~bit);
    return 0;
}

/* Page q, claimed at version v, is recorded and counted: before the mapping wakes the
 * task, which may then end and report at once. */
static void count_direct(uint64_t q, uint32_t v, int first) {
    rs_record(q, v, CL_OPEN_ENDED);
    mark_touched(q);
    if (first) atomic_fetch_add_explicit(&W.maps[q], 1, memory_order_relaxed); /* hotness */
    if (W.mapped_ver1[q] != v + 1) { /* a version mapped for the first time, like a fetch */
        W.mapped_ver1[q] = v + 1;
        atomic_fetch_add_explicit(&W.zap->maps, 1, memory_order_relaxed);
        ADD(pages_mapped, 1);
    } else {
        ADD(soft_faults, 1);
    }
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
    block_of(p, &per, &lo, &hi);
    for (uint64_t q = lo; q < hi; q++) resident += q != p && rs_resident(q);
    if (resident < (per / 4 > 2 ? per / 4 : 2)) return try_map(p, 1);
    int ok = -1;
    for (uint64_t q = lo, start = lo; q <= hi; q++) {
        int take = 0;
        if (q == p) {
            take = 1;
        } else if (q < hi && !W.private_page[q] && !(atomic_load(&W.mapped[q >> 6]) & (1ull << (q & 63)))) {
            uint32_t v = claim_direct(q, E);
            if (v) count_direct(q, v, 1), ADD(faultaround_pages, 1), take = 1;
        }
        if (take) continue;
        if (q > start) { /* the run [start, q) */
            uint64_t a = (uint64_t)(uintptr_t)(W.ro + start * W.ps), b = (uint64_t)(uintptr_t)(W.ro + q * W.ps);
            int mapped = try_map_range(a, b, 1) == 0;
            if (start <= p && p < q) ok = mapped ? 0 : -1;
            if (!mapped)
                for (uint64_t r = start; r < q; r++) atomic_fetch_and(&W.mapped[r >> 6], ~(1ull << (r & 63)));
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
int map_direct(uint64_t p, uint32_t E, uint64_t at, uint64_t len) {
    int mapped = 0, was_private = 0;
    pthread_mutex_lock(&W.map_lock);
    uint32_t v = claim_direct(p, E);
    if (v) {
        was_private = W.private_page[p];
        if (!was_private || remap(p, W.shm_fd) == 0) {
            W.private_page[p] = 0;
            const uint64_t os_page = (uint64_t)sysconf(_SC_PAGESIZE);
            int first = !rs_seen_by_task(p); /* this task's first touch */
            count_direct(p, v, first);
            if (len && !was_private) {
                uint64_t lo = at & ~(os_page - 1), hi = (at + len + os_page - 1) & ~(os_page - 1);
                mapped = try_map_range(lo, hi, 1) == 0;
            } else if (at && !rs_exact()) {
                mapped = map_around(p, E) == 0;
            } else if (at && first && !was_private && W.ps > os_page
                       && atomic_exchange(&W.last_direct, p + 1) != p) { /* not a scan */
                at &= ~(os_page - 1);
                mapped = try_map_range(at, at + os_page, 1) == 0;
                ADD(subpage_maps, 1);
            } else {
                mapped = try_map(p, 1) == 0;
            }
        }
        if (!mapped) atomic_fetch_and(&W.mapped[p >> 6], ~(1ull << (p & 63)));
    }
    pthread_mutex_unlock(&W.map_lock);
    if (!mapped) return -1;
    if (was_private) cache_evict(p, 1); /* its copy is no longer what the range shows */
    return 0;
}

/* Maps page p from the cache (where it was just installed or found). */
void map_cached(uint64_t p) {
    if (W.zero_copy && !W.private_page[p]) {
        pthread_mutex_lock(&W.map_lock);
        if (remap(p, cache_fd()))
            die(EXIT_PAGE_ERROR, "cannot map a private copy of a page (too many mappings? vm.max_map_count)", p);
        W.private_page[p] = 1;
        pthread_mutex_unlock(&W.map_lock);
    }
    map_page(p);
}

/* Answers the driver's shoot-downs: unmaps the page if we map it from the driver. */
static void *zap_main(void *arg) {
    (void)arg;
    uint32_t seen = atomic_load(&W.zap->req);
    for (;;) {
        uint32_t r = atomic_load(&W.zap->req);
        if (r == seen) {
            cl_futex_wait(&W.zap->req, seen, -1);
            continue;
        }
        seen = r;
        uint64_t p = atomic_load(&W.zap->page), bit = 1ull << (p & 63);
        if (p < W.npages) {
            pthread_mutex_lock(&W.map_lock);
            if (atomic_load(&W.mapped[p >> 6]) & bit) {
                madvise(W.ro + p * W.ps, W.ps, MADV_DONTNEED);
                atomic_fetch_and(&W.mapped[p >> 6], ~bit);
                ADD(shootdowns, 1);
            }
            pthread_mutex_unlock(&W.map_lock);
        }
        atomic_store(&W.zap->ack, r);
        cl_futex_wake(&W.zap->ack);
    }
    return NULL;
}

/* ------------------------------------------------------- fault handler -- */



/* Fault-around for cached pages (resident mode, a worker that copies pages): maps the
 * other pages of p's aligned block that are cached for E and not resident yet (pages
 * read ahead, say), one UFFDIO_CONTINUE per run. */
static void map_cached_around(uint64_t p, uint32_t E) {
    uint64_t per, lo, hi;
    block_of(p, &per, &lo, &hi);
    for (uint64_t q = lo, start = lo; q <= hi; q++) {
        uint32_t v, until;
        if (q < hi && q != p && rs_resident(q) != cache_peek(q) && cache_for(q, E, &v, &until) == 1) {
            cache_referenced(q);
            rs_record(q, v, until);
            mark_touched(q);
            ADD(faultaround_pages, 1);
            continue;
        }
        if (q > start)
            try_map_range((uint64_t)(uintptr_t)(W.ro + start * W.ps), (uint64_t)(uintptr_t)(W.ro + q * W.ps), 0);
        start = q + 1;
    }
}

/* Page p may be mapped from now on: unmap_all unmaps [0, touched). */
void mark_touched(uint64_t p) {
    uint64_t t = atomic_load(&W.touched);
    while (p + 1 > t && !atomic_compare_exchange_weak(&W.touched, &t, p + 1)) {}
}

/* Resolves a fault that needs no fetch: the page mapped in place (zero copy) or from
 * the cache. 1: done; 0: it must be fetched (a stale cached version is evicted). */
static int resolve_locally(uint64_t p, uint64_t flags, uint64_t addr) {
    mark_touched(p);
    uint32_t E = rs_epoch(), v, hi;
    if (W.zero_copy && map_direct(p, E, addr, 0) == 0) return 1;
    int state = cache_for(p, E, &v, &hi);
    if (state == 1) {
        if (flags & UFFD_PAGEFAULT_FLAG_MINOR) ADD(soft_faults, 1);
        cache_referenced(p);
        rs_record(p, v, hi);
        if (!rs_exact() && !W.zero_copy) map_cached_around(p, E);
        map_cached(p);
        return 1;
    }
    if (state == 0) cache_evict(p, 0); /* cached, but a different version than this epoch reads */
    return 0;
}

static void resolve_fault(uint64_t p, uint64_t flags, uint64_t addr) {
    if (resolve_locally(p, flags, addr)) return; /* also: fetched by the batch it came in */
    uint32_t E = rs_epoch(), v, hi;
    ADD(faults, 1);
    cache_make_room(p);
    /* Pending from before the request until installed: the driver may list us as p's
     * holder as soon as it answers, and peers redirected here wait for our copy. */
    pending_mark(&p, 1, 1);
    fetch(p, E, &v, &hi);
    cache_install(p, v, hi);
    pending_mark(&p, 1, 0);
    ADD(pages_fetched, 1), ADD(bytes_fetched, W.ps);
    rs_record(p, v, hi);
    map_cached(p);
    if (!W.zero_copy) maybe_read_ahead(p, E);
}

/* A batch of faults read at once (several threads of a task faulting together): those
 * that need a fetch go out as one pipelined stream instead of a round trip each. */
static void on_faults(const struct uffd_msg *msgs, int n) {
    uint64_t need[16], addr[16], flags[16];
    int k = 0;
    pthread_mutex_lock(&W.fetch_lock);
    for (int i = 0; i < n; i++) {
        if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
        uint64_t a = msgs[i].arg.pagefault.address, p = (a - (uint64_t)(uintptr_t)W.ro) / W.ps;
        if (p >= W.npages || resolve_locally(p, msgs[i].arg.pagefault.flags, a)) continue;
        addr[k] = a, flags[k] = msgs[i].arg.pagefault.flags, need[k++] = p;
    }
    if (k > 1) {
        uint64_t pages[16];
        memcpy(pages, need, (size_t)k * sizeof *pages);
        qsort_pages(pages, (uint64_t)k);
        uint64_t u = 0;
        for (int i = 0; i < k; i++)
            if (!u || pages[u - 1] != pages[i]) pages[u++] = pages[i];
        if (u > 1) fetch_missing(pages, u, rs_epoch(), 0);
    }
    for (int i = 0; i < k; i++) resolve_fault(need[i], flags[i], addr[i]); /* what the batch left */
    pthread_mutex_unlock(&W.fetch_lock);
}

static void *fault_main(void *arg) {
    (void)arg;
    struct pollfd pfd = {W.uffd, POLLIN, 0};
    for (;;) {
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR) break;
        struct uffd_msg msgs[16];
        ssize_t n = read(W.uffd, msgs, sizeof msgs);
        if (n > 0) on_faults(msgs, (int)(n / (ssize_t)sizeof msgs[0]));
    }
    return NULL;
}

/* --------------------------------------------------------- page server -- */

/* A page not held yet but being fetched here (the driver listed us as a holder-to-be)
 * is waited for, a bounded time (worker_pending.c). */
static void answer(void *ctx, uint32_t client, const cl_msg *req, uint64_t p, int may_redirect,
                   uint8_t *buf, cl_answer *a) {
    (void)ctx, (void)client, (void)may_redirect;
    uint32_t v, hi, E = req->epoch;
    for (int waited = 0;; waited = 1) {
        int got = cache_read(p, E, buf, &v, &hi);
        if (got == 1) break;
        if (got < 0 || waited || !pending_wait(p, E)) {
            a->kind = CL_ANSWER_ERROR;
            a->error = CL_ERR_NOT_HELD;
            return;
        }
    }
    a->kind = CL_ANSWER_PAGE;
    a->version = v;
    a->valid_until = hi;
}

/* ----------------------------------------------------------- interface -- */

static void *map_file(const char *path, uint64_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

int clamor_worker_start(int worker_id, uint64_t arena_size, uint64_t page_size, const uint8_t *token,
                        size_t token_len, const char *driver_host, int driver_port,
                        const char *shm_arena_path, const char *shm_state_path, const char *shm_zap_path,
                        const char *bind_host,
                        int readahead, const clamor_tls_pem *tls, char *err, size_t errlen) {
    if (W.running) return CL_ERR("the worker pager is already running");
    if (worker_id < 0 || worker_id >= CL_MAX_WORKERS)
        return CL_ERR("worker id %d is outside 0..%d", worker_id, CL_MAX_WORKERS - 1);
    if (!cl_is_pow2(page_size) || page_size < 4096 || page_size > (8u << 20))
        return CL_ERR("page size %llu is not a power of two between 4 KiB and 8 MiB", (unsigned long long)page_size);
    if (!arena_size || arena_size % page_size)
        return CL_ERR("arena size %llu is not a multiple of the page size", (unsigned long long)arena_size);
    memset(&W, 0, sizeof W);
    worker_base_reset(worker_id);
    W.size = arena_size, W.ps = page_size, W.npages = arena_size / page_size;
    W.readahead = readahead, W.drv_fd = -1, W.shm_fd = -1, W.drv_port = driver_port, W.ra_window = 4;
    W.last_missing = UINT64_MAX - 1;
    for (int i = 0; i < CL_MAX_WORKERS; i++) W.peer_fd[i] = -1;
    W.token = malloc(token_len ? token_len : 1);
    memcpy(W.token, token, token_len);
    W.token_len = token_len;
    if (cl_resolve(driver_host, &W.drv_ip)) return CL_ERR("cannot resolve the driver host %s", driver_host);
    if (tls) {
        W.tls = cl_tls_new(tls->ca, tls->ca_len, tls->cert, tls->cert_len, tls->key, tls->key_len, err, errlen);
        if (!W.tls) return -1;
    }
    pthread_mutex_init(&W.map_lock, NULL);
    pthread_mutex_init(&W.fetch_lock, NULL);
    if (shm_arena_path && *shm_arena_path) {
        /* Read-write for zero copy only because userfaultfd registers only mappings
         * that could be made writable; the range itself stays PROT_READ. */
        int zero_copy = shm_zap_path && *shm_zap_path;
        W.shm_fd = open(shm_arena_path, (zero_copy ? O_RDWR : O_RDONLY) | O_CLOEXEC);
        W.shm_state = map_file(shm_state_path, W.npages * sizeof(uint64_t));
        if (W.shm_fd < 0 || !W.shm_state)
            return CL_ERR("cannot map the driver's shared memory (%s): %s", shm_arena_path, strerror(errno));
        if (zero_copy) {
            int fd = open(shm_zap_path, O_RDWR | O_CLOEXEC);
            void *area = fd < 0 ? MAP_FAILED
                                : mmap(NULL, cl_zap_area_bytes(W.npages), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            /* Our bitmap starts zeroed and takes no memory until we map pages: punched out
             * of the memfd (stores of zeros would allocate all of it). */
            int zeroed = area != MAP_FAILED
                         && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                      (off_t)cl_zap_bits_offset(W.npages, worker_id), (off_t)cl_zap_bits_bytes(W.npages)) == 0;
            if (fd >= 0) close(fd);
            W.private_page = calloc(W.npages, 1);
            W.mapped_ver1 = calloc(W.npages, sizeof *W.mapped_ver1);
            if (area == MAP_FAILED || !W.private_page || !W.mapped_ver1)
                return CL_ERR("cannot map the driver's shoot-down area (%s): %s", shm_zap_path, strerror(errno));
            W.zap_head = cl_zap_head_of(area);
            W.zap = cl_zap_slot_of(area, worker_id);
            W.mapped = cl_zap_bits(area, W.npages, worker_id);
            W.maps = cl_zap_maps(area, W.npages);
            W.zero_copy = 1;
            if (!zeroed)
                for (uint64_t i = 0; i < cl_zap_words(W.npages); i++) atomic_store(&W.mapped[i], 0);
        }
    }
    if (cache_init(page_size, W.npages, tell_dropped, pending_arrived, err, errlen)) return -1;
    W.ro = mmap(NULL, arena_size, PROT_READ, MAP_SHARED | MAP_NORESERVE, W.zero_copy ? W.shm_fd : cache_fd(), 0);
    if (W.ro == MAP_FAILED)
        return CL_ERR("cannot reserve %llu bytes for the arena: %s", (unsigned long long)arena_size, strerror(errno));
    W.pending = calloc(W.npages, 1);
    if (rs_init(W.npages) || !W.pending) return CL_ERR("out of memory for the page tables");
    W.buf = malloc(page_size);
    if (!W.buf) return CL_ERR("out of memory for a page buffer");
    memset(W.buf, 0, page_size); /* warm: received pages never fault here */
    W.uffd = cl_uffd_open(UFFD_FEATURE_MINOR_SHMEM, err, errlen);
    if (W.uffd < 0) return -1;
    if (cl_uffd_register(W.uffd, W.ro, arena_size, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR, err, errlen))
        return -1;
    if (pthread_create(&W.thread, NULL, fault_main, NULL)) return CL_ERR("cannot start the fault handler thread");
    pthread_detach(W.thread);
    if (W.zero_copy) {
        pthread_t zap;
        if (pthread_create(&zap, NULL, zap_main, NULL)) return CL_ERR("cannot start the shoot-down thread");
        pthread_detach(zap);
        /* The driver looks at slots below head.slots: raised past us before our pid is
         * published and before any bit of ours is set (pager_common.h). */
        uint32_t slots = atomic_load(&W.zap_head->slots);
        while (slots < (uint32_t)worker_id + 1 && !atomic_compare_exchange_weak(&W.zap_head->slots, &slots, (uint32_t)worker_id + 1)) {}
        atomic_store(&W.zap->pid, (int32_t)getpid()); /* from now on the driver asks us */
    }
    cl_service svc = {
        .page_size = W.ps, .num_pages = W.npages, .answer = answer, .have = NULL,
        .pages_served = &worker_stats()->pages_served, .bytes_served = &worker_stats()->bytes_served,
        .auth_failures = &worker_stats()->auth_failures, .bad_requests = &worker_stats()->bad_requests,
    };
    W.server = cl_server_start(bind_host, 0, token, token_len, W.tls, &svc, err, errlen);
    if (!W.server) return -1;
    W.running = 1;
    return cl_server_port(W.server);
}

void *clamor_worker_base(void) { return W.running ? W.ro : NULL; }
int clamor_worker_port(void) { return W.running ? cl_server_port(W.server) : -1; }

void clamor_worker_get_stats(clamor_worker_stats *out) { *out = *worker_stats(); }

int clamor_worker_touch(uint64_t offset, uint64_t length) {
    if (!W.running || offset > W.size || length > W.size - offset) return -1;
    volatile const uint8_t *ro = W.ro;
    uint8_t sink = 0;
    for (uint64_t p = offset / W.ps; length && p * W.ps < offset + length; p++) sink ^= ro[p * W.ps];
    (void)sink;
    return 0;
}

/* ----------------------------------------------------- tasks and stages -- */

/* Unmaps the whole range (the cache stays), so that every page faults again: each task
 * of exact mode, or a task whose epoch the resident pages do not serve. */
static void unmap_all(void) {
    uint64_t touched = atomic_load(&W.touched);
    if (W.zero_copy) pthread_mutex_lock(&W.map_lock);
    if (touched) madvise(W.ro, touched * W.ps, MADV_DONTNEED);
    if (W.zero_copy) {
        for (uint64_t i = 0; i < cl_zap_words(touched); i++) atomic_store(&W.mapped[i], 0);
        pthread_mutex_unlock(&W.map_lock);
    }
    rs_clear_resident();
    ADD(unmap_all, 1);
}

/* A task at `epoch` starts. Exact mode unmaps everything, so that the task's first touch
 * of each page faults and is recorded; resident mode keeps the mappings while they serve
 * `epoch` (rs_begin_task). */
void clamor_worker_begin_task(uint32_t epoch) {
    int keep = rs_begin_task(epoch);
    atomic_store(&W.last_direct, UINT64_MAX); /* a task's scans are its own */
    if (!keep) unmap_all();
}

/* The driver wrote these pages since the last stage: their cached copies and their
 * mappings in place go (they show the new bytes, under an old version), and they leave
 * the resident set. Runs between attempts, never during one. */
void clamor_worker_invalidate(uint32_t epoch, const uint64_t *pages, uint64_t n) {
    (void)epoch;
    if (W.zero_copy) pthread_mutex_lock(&W.map_lock);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = pages[i], bit = 1ull << (p & 63);
        if (p >= W.npages) continue;
        int dropped = 0;
        if (W.zero_copy && (atomic_load(&W.mapped[p >> 6]) & bit)) {
            madvise(W.ro + p * W.ps, W.ps, MADV_DONTNEED);
            atomic_fetch_and(&W.mapped[p >> 6], ~bit);
            dropped = 1;
        }
        if (cache_peek(p)) dropped |= cache_evict(p, 0); /* the driver cleared its holder bits itself */
        if (!rs_exact()) rs_unrecord(p);
        if (dropped) ADD(invalidations, 1);
    }
    if (W.zero_copy) pthread_mutex_unlock(&W.map_lock);
}
