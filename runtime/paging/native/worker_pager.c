/* The worker pager.
 *
 * The arena range is a read-only shared mapping of a private cache memfd,
 * registered with userfaultfd for MISSING and MINOR faults; fetched pages
 * are written into the memfd itself. A touch of a page that is not cached raises a MISSING fault: the
 * handler thread here (native, never the GIL) fetches (page, epoch) and maps
 * it with UFFDIO_CONTINUE. At task start every mapping is zapped while the
 * cache stays, so the first touch of a cached page raises a cheap MINOR
 * fault: that is how the per-task read set is recorded exactly.
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

#define EXIT_DRIVER_UNREACHABLE CLAMOR_EXIT_DRIVER_UNREACHABLE
#define EXIT_PAGE_ERROR CLAMOR_EXIT_PAGE_ERROR
#define DRIVER_TIMEOUT_MS 60000
#define PEER_TIMEOUT_MS 5000
#define READAHEAD_BYTES (16u << 20)
#define PREFETCH_WINDOW 32 /* prefetch GETs in flight on the driver connection */

static struct {
    int running, id;
    uint8_t *ro;
    uint64_t size, ps, npages;
    int cache_fd, uffd;
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
    uint32_t *cver1;  /* cached version + 1; 0 = not cached */
    uint32_t *cvalid; /* last epoch the cached bytes are valid for */
    uint32_t *readmark;
    cl_stripes stripes;
    _Atomic uint32_t epoch, task_seq;
    pthread_mutex_t rs_lock;
    uint64_t *rs_pages, rs_n, rs_cap;
    uint32_t *rs_vers;
    _Atomic uint64_t touched;
    uint64_t *refbits;          /* CLOCK reference bits, one per page */
    uint64_t hand, clock_end;   /* the hand sweeps [0, clock_end): past every page installed */
    uint64_t last_missing, ra_window;
    int zero_copy;            /* the range maps the driver's memfd (same host) */
    uint8_t *private_page;    /* zero copy: 1 where the range maps the cache memfd instead */
    uint32_t *mapped_ver1;    /* zero copy: version + 1 of the page last counted as mapped */
    _Atomic uint64_t *mapped; /* zero copy: our bitmap of pages mapped from the driver (shared) */
    cl_zap_slot *zap;         /* zero copy: our shoot-down slot (shared with the driver) */
    _Atomic uint32_t *maps;   /* zero copy: per page, mappings from the driver (shared) */
    pthread_mutex_t map_lock; /* zero copy: mapping from the driver vs. shoot-downs */
    pthread_mutex_t fetch_lock; /* the fault handler vs. a task thread's prefetch: the driver
                                 * connection, the cache tables, the CLOCK hand */
    int run;
    cl_server *server;
    cl_tls_ctx *tls; /* NULL: plaintext page protocol */
    clamor_worker_stats st;
} W;

#define ADD(field, n) __atomic_fetch_add(&W.st.field, (n), __ATOMIC_RELAXED)

static void die(int status, const char *why, uint64_t page) {
    cl_log("worker %d: %s (page %llu); exiting with status %d", W.id, why,
           (unsigned long long)page, status);
    _exit(status);
}

/* --------------------------------------------------------- cache table -- */

static int cached_for(uint64_t p, uint32_t E, uint32_t *v, uint32_t *hi) {
    pthread_mutex_t *m = cl_stripe(&W.stripes, p);
    pthread_mutex_lock(m);
    uint32_t v1 = W.cver1[p];
    *v = v1 - 1;
    *hi = W.cvalid[p];
    pthread_mutex_unlock(m);
    if (!v1) return -1;
    return (*v <= E && E <= *hi) ? 1 : 0;
}

static void referenced(uint64_t p) { W.refbits[p >> 6] |= 1ull << (p & 63); }

static void install(uint64_t p, uint32_t v, uint32_t hi) {
    pthread_mutex_t *m = cl_stripe(&W.stripes, p);
    pthread_mutex_lock(m);
    if (!W.cver1[p]) ADD(cached_pages, 1);
    W.cver1[p] = v + 1;
    W.cvalid[p] = hi;
    pthread_mutex_unlock(m);
    referenced(p);
    if (p + 1 > W.clock_end) W.clock_end = p + 1;
}

static void tell_dropped(uint64_t p);

/* Drops page p from the cache; with `tell`, the driver's directory too. The
 * table entry goes first (under the stripe lock that answer() reads it under),
 * so a peer asking from then on gets NOT_HELD, never a half-punched page.
 * Returns whether p was cached (only the caller that cleared it counts it). */
static int evict(uint64_t p, int tell) {
    pthread_mutex_t *m = cl_stripe(&W.stripes, p);
    pthread_mutex_lock(m);
    int held = W.cver1[p] != 0;
    W.cver1[p] = 0;
    pthread_mutex_unlock(m);
    if (!held) return 0;
    __atomic_fetch_sub(&W.st.cached_pages, 1, __ATOMIC_RELAXED);
    if (tell) tell_dropped(p);
    fallocate(W.cache_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(p * W.ps), (off_t)W.ps);
    return 1;
}

/* Makes room for one more page under the cache limit, never evicting `keep`
 * (the page about to be installed). CLOCK: each step of the hand clears a
 * reference bit set by an earlier fault, skips an uncached page or evicts, so
 * the cost is O(1) amortised per install when the cache is dense in
 * [0, clock_end). Two full sweeps always find a victim unless only `keep` is
 * cached; the step bound only guards against a limit below 2. */
static void make_room(uint64_t keep) {
    uint64_t limit = __atomic_load_n(&W.st.cache_limit_pages, __ATOMIC_RELAXED);
    if (!limit) return;
    for (uint64_t steps = 0; __atomic_load_n(&W.st.cached_pages, __ATOMIC_RELAXED) >= limit;) {
        if (W.clock_end == 0 || steps++ > 2 * W.clock_end + 2) return;
        uint64_t p = W.hand;
        W.hand = p + 1 >= W.clock_end ? 0 : p + 1;
        if (p == keep || !__atomic_load_n(&W.cver1[p], __ATOMIC_RELAXED)) continue;
        uint64_t bit = 1ull << (p & 63);
        if (W.refbits[p >> 6] & bit) {
            W.refbits[p >> 6] &= ~bit; /* second chance */
            continue;
        }
        if (evict(p, 1)) ADD(evictions, 1);
    }
}

static void record(uint64_t p, uint32_t v) {
    uint32_t seq = atomic_load(&W.task_seq);
    if (W.readmark[p] == seq) return;
    W.readmark[p] = seq;
    pthread_mutex_lock(&W.rs_lock);
    if (W.rs_n == W.rs_cap) {
        W.rs_cap = W.rs_cap ? 2 * W.rs_cap : 1024;
        W.rs_pages = realloc(W.rs_pages, W.rs_cap * sizeof *W.rs_pages);
        W.rs_vers = realloc(W.rs_vers, W.rs_cap * sizeof *W.rs_vers);
    }
    W.rs_pages[W.rs_n] = p;
    W.rs_vers[W.rs_n++] = v;
    pthread_mutex_unlock(&W.rs_lock);
}

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
static int try_map(uint64_t p, int holes) {
    const uint64_t piece = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t at = (uint64_t)(uintptr_t)(W.ro + p * W.ps);
    const uint64_t end = at + W.ps;
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

static void map_page(uint64_t p) {
    if (try_map(p, 0) == 0) return;
    cl_log("worker %d: mapping page %llu failed: %s", W.id, (unsigned long long)p, strerror(errno));
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

/* Maps the driver's own page p for a task at epoch E if the driver's bytes are
 * the version E reads. 0: mapped (and recorded); -1: the caller copies instead. */
static int map_direct(uint64_t p, uint32_t E) {
    const uint64_t bit = 1ull << (p & 63);
    int mapped = 0, was_private = 0;
    pthread_mutex_lock(&W.map_lock);
    atomic_fetch_or(&W.mapped[p >> 6], bit); /* before the state check: see pager_common.h */
    uint64_t s = atomic_load(&W.shm_state[p]);
    if (!(s & 1) && (s >> 1) && (s >> 1) <= E) {
        was_private = W.private_page[p];
        if (!was_private || remap(p, W.shm_fd) == 0) {
            W.private_page[p] = 0;
            /* Recorded and counted before the mapping wakes the task, which may then end
             * and report at once. */
            uint32_t v = (uint32_t)(s >> 1);
            record(p, v);
            atomic_fetch_add_explicit(&W.maps[p], 1, memory_order_relaxed); /* hotness: every mapping */
            if (W.mapped_ver1[p] != v + 1) { /* a version mapped for the first time, like a fetch */
                W.mapped_ver1[p] = v + 1;
                atomic_fetch_add_explicit(&W.zap->maps, 1, memory_order_relaxed);
                ADD(pages_mapped, 1);
            } else {
                ADD(soft_faults, 1);
            }
            mapped = try_map(p, 1) == 0;
        }
    }
    if (!mapped) atomic_fetch_and(&W.mapped[p >> 6], ~bit);
    pthread_mutex_unlock(&W.map_lock);
    if (!mapped) return -1;
    if (was_private) evict(p, 1); /* its copy is no longer what the range shows */
    return 0;
}

/* Maps page p from the cache (where it was just installed or found). */
static void map_cached(uint64_t p) {
    if (W.zero_copy && !W.private_page[p]) {
        pthread_mutex_lock(&W.map_lock);
        if (remap(p, W.cache_fd))
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

/* ------------------------------------------------------------ fetching -- */

/* Connects to a page server: TLS first when the cluster uses it, then the token. */
static int connect_authenticated(uint32_t ip, int port, int timeout_ms) {
    int fd = cl_connect(ip, port, timeout_ms);
    if (fd < 0) return -1;
    char why[256];
    if (W.tls && cl_tls_connect(W.tls, fd, why, sizeof why)) {
        cl_log("worker %d: TLS handshake with %u.%u.%u.%u:%d failed: %s", W.id, ip >> 24, (ip >> 16) & 255,
               (ip >> 8) & 255, ip & 255, port, why);
        cl_close(fd);
        return -1;
    }
    if (cl_client_handshake(fd, W.token, W.token_len, (uint32_t)W.id)) {
        cl_close(fd);
        return -1;
    }
    return fd;
}

static void reset_driver(void) {
    cl_close(W.drv_fd);
    W.drv_fd = -1;
}

static int driver(uint64_t page) {
    for (int attempt = 0; W.drv_fd < 0; attempt++) {
        if (attempt == 10) die(EXIT_DRIVER_UNREACHABLE, "cannot reach the driver's page server", page);
        if (attempt) usleep(200000u * (unsigned)attempt);
        W.drv_fd = connect_authenticated(W.drv_ip, W.drv_port, DRIVER_TIMEOUT_MS);
    }
    return W.drv_fd;
}

static void tell_driver(uint64_t p, uint32_t v, uint32_t source) {
    cl_msg h = cl_make(CL_HAVE, p, v, source);
    if (cl_send_msg(driver(p), &h, NULL)) reset_driver();
}

/* On the fault thread's own driver connection, so it stays ordered with the
 * GETs and HAVEs for the same page. A notice lost with a broken connection
 * only leaves a stale holder bit: a peer redirected here gets NOT_HELD and
 * falls back to the driver. */
static void tell_dropped(uint64_t p) {
    cl_msg h = cl_make(CL_HAVE, p, 0, 0);
    h.flags = CL_HAVE_DROPPED;
    if (cl_send_msg(driver(p), &h, NULL)) reset_driver();
}

static int write_cache(uint64_t p, const uint8_t *src) {
    for (uint64_t done = 0; done < W.ps;) {
        ssize_t n = pwrite(W.cache_fd, src + done, W.ps - done, (off_t)(p * W.ps + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        done += (uint64_t)n;
    }
    return 0;
}

static int recv_page(int fd, const cl_msg *m, uint64_t p) {
    if (m->type != CL_PAGE || m->page != p || m->length != W.ps) return -1;
    if (cl_recv_all(fd, W.buf, W.ps)) return -1;
    if (write_cache(p, W.buf)) die(EXIT_PAGE_ERROR, "cannot write the page cache (out of memory?)", p);
    return 0;
}

static int copy_from_driver_memfd(uint64_t p) {
    loff_t in = (loff_t)(p * W.ps), out = in;
    for (uint64_t left = W.ps; left;) {
        ssize_t n = copy_file_range(W.shm_fd, &in, W.cache_fd, &out, left, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        left -= (uint64_t)n;
    }
    return 0;
}

static int fetch_shm(uint64_t p, uint32_t E, uint32_t *v) {
    if (W.shm_fd < 0) return -1;
    uint64_t s1 = atomic_load_explicit(&W.shm_state[p], memory_order_acquire);
    if ((s1 & 1) || (s1 >> 1) == 0 || (s1 >> 1) > E) return -1;
    if (copy_from_driver_memfd(p)) return -1;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&W.shm_state[p], memory_order_relaxed) != s1) return -1;
    *v = (uint32_t)(s1 >> 1);
    return 0;
}

static int fetch_peer(uint32_t peer, uint32_t ip, uint32_t port, uint64_t p, uint32_t E,
                      uint32_t *v, uint32_t *hi) {
    if (peer >= CL_MAX_WORKERS || peer == (uint32_t)W.id) return -1;
    int *fd = &W.peer_fd[peer];
    if (*fd >= 0 && (W.peer_ip[peer] != ip || W.peer_port[peer] != port)) cl_close(*fd), *fd = -1;
    if (*fd < 0) {
        *fd = connect_authenticated(ip, (int)port, PEER_TIMEOUT_MS);
        if (*fd < 0) return -1;
        W.peer_ip[peer] = ip, W.peer_port[peer] = port;
    }
    cl_msg g = cl_make(CL_GET, p, E, 1), m;
    g.flags = CL_GET_NO_REDIRECT;
    if (cl_send_msg(*fd, &g, NULL) || cl_recv_msg(*fd, &m)) goto broken;
    if (m.type == CL_ERROR) return -1;
    if (recv_page(*fd, &m, p)) goto broken;
    *v = m.epoch, *hi = m.aux;
    return 0;
broken:
    cl_close(*fd), *fd = -1;
    return -1;
}

/* Fetches the latest version <= E of page p into its cache slot. */
static void fetch(uint64_t p, uint32_t E, uint32_t *v, uint32_t *hi) {
    if (fetch_shm(p, E, v) == 0) {
        *hi = CL_OPEN_ENDED;
        ADD(from_shm, 1);
        tell_driver(p, *v, 0);
        return;
    }
    uint32_t failed = 0;
    for (int io_errors = 0;;) {
        int fd = driver(p);
        cl_msg g = cl_make(CL_GET, p, E, 1), m;
        g.flags = failed ? CL_GET_NO_REDIRECT : 0;
        g.aux2 = failed;
        if (cl_send_msg(fd, &g, NULL) || cl_recv_msg(fd, &m)) goto io_error;
        if (m.type == CL_PAGE) {
            if (recv_page(fd, &m, p)) goto io_error;
            *v = m.epoch, *hi = m.aux;
            ADD(from_driver, 1);
            return;
        }
        if (m.type == CL_REDIRECT && !failed) {
            ADD(redirects, 1);
            if (fetch_peer(m.aux, m.aux2, m.flags, p, E, v, hi) == 0) {
                ADD(from_peers, 1);
                tell_driver(p, *v, m.aux + 1);
                return;
            }
            ADD(peer_fallbacks, 1);
            failed = m.aux + 1;
            continue;
        }
        if (m.type == CL_ERROR) {
            char why[128];
            snprintf(why, sizeof why, "the driver refused a page at epoch %u: %s", E, cl_error_name(m.aux));
            die(EXIT_PAGE_ERROR, why, p);
        }
    io_error:
        reset_driver();
        if (++io_errors == 5) die(EXIT_DRIVER_UNREACHABLE, "lost the connection to the driver", p);
    }
}

/* Fetches pages [p, p + n) (none cached) in one request, after a sequential run. */
static void read_ahead(uint64_t p, uint64_t n, uint32_t E) {
    if (W.shm_fd >= 0) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t v;
            make_room(p + i);
            if (fetch_shm(p + i, E, &v)) return;
            install(p + i, v, CL_OPEN_ENDED);
            tell_driver(p + i, v, 0);
            ADD(from_shm, 1), ADD(readahead_pages, 1), ADD(pages_fetched, 1), ADD(bytes_fetched, W.ps);
        }
        return;
    }
    int fd = driver(p);
    cl_msg g = cl_make(CL_GET, p, E, (uint32_t)n), m;
    g.flags = CL_GET_NO_REDIRECT;
    if (cl_send_msg(fd, &g, NULL)) goto io_error;
    for (uint64_t i = 0; i < n; i++) {
        if (cl_recv_msg(fd, &m)) goto io_error;
        if (m.type == CL_ERROR) return;
        make_room(p + i);
        if (recv_page(fd, &m, p + i)) goto io_error;
        install(p + i, m.epoch, m.aux);
        ADD(from_driver, 1), ADD(readahead_pages, 1), ADD(pages_fetched, 1), ADD(bytes_fetched, W.ps);
    }
    return;
io_error:
    reset_driver(); /* the pages not received are simply fetched on demand */
}

static void maybe_read_ahead(uint64_t p, uint32_t E) {
    if (p == W.last_missing + 1) {
        W.run++;
    } else {
        W.run = 0;
        W.ra_window = 4;
    }
    W.last_missing = p;
    if (!W.readahead || W.run < 2) return;
    uint64_t max = READAHEAD_BYTES / W.ps;
    if (max < 1) max = 1;
    if (max > CL_MAX_BATCH) max = CL_MAX_BATCH;
    uint64_t limit = __atomic_load_n(&W.st.cache_limit_pages, __ATOMIC_RELAXED);
    if (limit && max > limit / 4) max = limit / 4; /* never evicts what it just fetched */
    uint64_t n = 0;
    while (n < W.ra_window && n < max && p + 1 + n < W.npages && !W.cver1[p + 1 + n]) n++;
    if (!n) return;
    read_ahead(p + 1, n, E);
    W.last_missing = p + n;
    W.ra_window = W.ra_window * 2 < max ? W.ra_window * 2 : max;
}

/* ------------------------------------------------------- fault handler -- */

static void resolve_fault(uint64_t p, uint64_t flags);

/* Page p may be mapped from now on: task starts unmap [0, touched). */
static void mark_touched(uint64_t p) {
    uint64_t t = atomic_load(&W.touched);
    while (p + 1 > t && !atomic_compare_exchange_weak(&W.touched, &t, p + 1)) {}
}

static void on_fault(uint64_t addr, uint64_t flags) {
    uint64_t p = (addr - (uint64_t)(uintptr_t)W.ro) / W.ps;
    if (p >= W.npages) return;
    pthread_mutex_lock(&W.fetch_lock);
    resolve_fault(p, flags);
    pthread_mutex_unlock(&W.fetch_lock);
}

static void resolve_fault(uint64_t p, uint64_t flags) {
    mark_touched(p);
    uint32_t E = atomic_load(&W.epoch), v, hi;
    if (W.zero_copy && map_direct(p, E) == 0) return;
    int state = cached_for(p, E, &v, &hi);
    if (state == 1) {
        if (flags & UFFD_PAGEFAULT_FLAG_MINOR) ADD(soft_faults, 1);
        referenced(p);
        record(p, v);
        map_cached(p);
        return;
    }
    if (state == 0) evict(p, 0); /* cached, but a different version than this epoch reads */
    ADD(faults, 1);
    make_room(p);
    fetch(p, E, &v, &hi);
    install(p, v, hi);
    ADD(pages_fetched, 1), ADD(bytes_fetched, W.ps);
    record(p, v);
    map_cached(p);
    if (!W.zero_copy) maybe_read_ahead(p, E);
}

static void *fault_main(void *arg) {
    (void)arg;
    struct pollfd pfd = {W.uffd, POLLIN, 0};
    for (;;) {
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR) break;
        struct uffd_msg msgs[16];
        ssize_t n = read(W.uffd, msgs, sizeof msgs);
        if (n <= 0) continue;
        for (ssize_t i = 0; i < n / (ssize_t)sizeof msgs[0]; i++)
            if (msgs[i].event == UFFD_EVENT_PAGEFAULT)
                on_fault(msgs[i].arg.pagefault.address, msgs[i].arg.pagefault.flags);
    }
    return NULL;
}

/* ------------------------------------------------------------ prefetch -- */

/* Fetches pages (sorted; none cached for E) from the driver with up to PREFETCH_WINDOW
 * GETs in flight, consecutive pages batched into one GET, and installs them. A page the
 * driver refuses, or that a broken connection leaves out, is fetched on its fault. */
static void fetch_pipelined(const uint64_t *pages, uint64_t n, uint32_t E) {
    struct { uint64_t first, n; } q[PREFETCH_WINDOW];
    uint64_t next = 0, head = 0, len = 0;
    int fd = driver(pages[0]);
    cl_msg m;
    while (next < n || len) {
        while (len < PREFETCH_WINDOW && next < n) { /* keep the window full */
            uint64_t first = pages[next], k = 1;
            while (next + k < n && pages[next + k] == first + k && k < CL_MAX_BATCH) k++;
            cl_msg g = cl_make(CL_GET, first, E, (uint32_t)k);
            g.flags = CL_GET_NO_REDIRECT;
            if (cl_send_msg(fd, &g, NULL)) goto io_error;
            q[(head + len) % PREFETCH_WINDOW].first = first, q[(head + len) % PREFETCH_WINDOW].n = k;
            len++, next += k;
            ADD(prefetch_requests, 1);
        }
        uint64_t first = q[head].first, k = q[head].n;
        head = (head + 1) % PREFETCH_WINDOW, len--;
        for (uint64_t i = 0; i < k; i++) { /* the answers of one GET, in order */
            if (cl_recv_msg(fd, &m)) goto io_error;
            if (m.type == CL_ERROR) break; /* the rest of this GET is not answered */
            make_room(first + i);
            if (recv_page(fd, &m, first + i)) goto io_error;
            install(first + i, m.epoch, m.aux);
            record(first + i, m.epoch);
            map_cached(first + i);
            ADD(from_driver, 1), ADD(prefetched_pages, 1), ADD(pages_fetched, 1), ADD(bytes_fetched, W.ps);
        }
    }
    return;
io_error:
    reset_driver();
}

uint64_t clamor_worker_prefetch(const uint64_t *pages, uint64_t n) {
    if (!W.running || !n) return 0;
    uint32_t E = atomic_load(&W.epoch);
    uint64_t *missing = malloc(n * sizeof *missing), m = 0, done = 0;
    if (!missing) return 0;
    uint64_t limit = __atomic_load_n(&W.st.cache_limit_pages, __ATOMIC_RELAXED);
    pthread_mutex_lock(&W.fetch_lock);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = pages[i];
        uint32_t v, hi;
        if (p >= W.npages || (i && p <= pages[i - 1])) continue; /* sorted and unique only */
        mark_touched(p);
        if (W.zero_copy && map_direct(p, E) == 0) {
            ADD(prefetched_pages, 1), done++;
        } else if (cached_for(p, E, &v, &hi) == 1) {
            referenced(p);
            record(p, v);
            map_cached(p);
            done++;
        } else if (!limit || m < limit / 2) { /* never more than the cache keeps */
            missing[m++] = p;
        }
    }
    for (uint64_t i = 0; i < m; i++)
        if (W.cver1[missing[i]]) evict(missing[i], 0); /* cached, but another version */
    if (m) {
        uint64_t before = W.st.prefetched_pages;
        fetch_pipelined(missing, m, E);
        done += W.st.prefetched_pages - before;
    }
    pthread_mutex_unlock(&W.fetch_lock);
    free(missing);
    return done;
}

/* --------------------------------------------------------- page server -- */

static void answer(void *ctx, uint32_t client, const cl_msg *req, uint64_t p, int may_redirect,
                   uint8_t *buf, cl_answer *a) {
    (void)ctx, (void)client, (void)may_redirect;
    pthread_mutex_t *m = cl_stripe(&W.stripes, p);
    pthread_mutex_lock(m);
    uint32_t v1 = W.cver1[p], hi = W.cvalid[p], E = req->epoch;
    if (!v1 || v1 - 1 > E || E > hi) {
        pthread_mutex_unlock(m);
        a->kind = CL_ANSWER_ERROR;
        a->error = CL_ERR_NOT_HELD;
        return;
    }
    ssize_t n = pread(W.cache_fd, buf, W.ps, (off_t)(p * W.ps));
    pthread_mutex_unlock(m);
    if (n != (ssize_t)W.ps) {
        a->kind = CL_ANSWER_ERROR;
        a->error = CL_ERR_NOT_HELD;
        return;
    }
    a->kind = CL_ANSWER_PAGE;
    a->version = v1 - 1;
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
    W.id = worker_id, W.size = arena_size, W.ps = page_size, W.npages = arena_size / page_size;
    W.readahead = readahead, W.drv_fd = -1, W.shm_fd = -1, W.drv_port = driver_port, W.ra_window = 4;
    W.last_missing = UINT64_MAX - 1;
    for (int i = 0; i < CL_MAX_WORKERS; i++) W.peer_fd[i] = -1;
    W.token = malloc(token_len ? token_len : 1);
    memcpy(W.token, token, token_len);
    W.token_len = token_len;
    cl_stripes_init(&W.stripes);
    pthread_mutex_init(&W.rs_lock, NULL);
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
            if (fd >= 0) close(fd);
            W.private_page = calloc(W.npages, 1);
            W.mapped_ver1 = calloc(W.npages, sizeof *W.mapped_ver1);
            if (area == MAP_FAILED || !W.private_page || !W.mapped_ver1)
                return CL_ERR("cannot map the driver's shoot-down area (%s): %s", shm_zap_path, strerror(errno));
            W.zap = cl_zap_slot_of(area, worker_id);
            W.mapped = cl_zap_bits(area, W.npages, worker_id);
            W.maps = cl_zap_maps(area, W.npages);
            W.zero_copy = 1;
        }
    }
    W.cache_fd = memfd_create("clamor-page-cache", MFD_CLOEXEC);
    if (W.cache_fd < 0 || ftruncate(W.cache_fd, (off_t)arena_size))
        return CL_ERR("cannot create the page cache: %s", strerror(errno));
    W.ro = mmap(NULL, arena_size, PROT_READ, MAP_SHARED | MAP_NORESERVE, W.zero_copy ? W.shm_fd : W.cache_fd, 0);
    if (W.ro == MAP_FAILED)
        return CL_ERR("cannot reserve %llu bytes for the arena: %s", (unsigned long long)arena_size, strerror(errno));
    W.cver1 = calloc(W.npages, sizeof *W.cver1);
    W.cvalid = calloc(W.npages, sizeof *W.cvalid);
    W.readmark = calloc(W.npages, sizeof *W.readmark);
    W.refbits = calloc((W.npages + 63) / 64, sizeof *W.refbits);
    if (!W.cver1 || !W.cvalid || !W.readmark || !W.refbits) return CL_ERR("out of memory for the page tables");
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
        for (uint64_t i = 0; i < cl_zap_words(W.npages); i++) atomic_store(&W.mapped[i], 0);
        pthread_t zap;
        if (pthread_create(&zap, NULL, zap_main, NULL)) return CL_ERR("cannot start the shoot-down thread");
        pthread_detach(zap);
        atomic_store(&W.zap->pid, (int32_t)getpid()); /* from now on the driver asks us */
    }
    cl_service svc = {
        .page_size = W.ps, .num_pages = W.npages, .answer = answer, .have = NULL,
        .pages_served = &W.st.pages_served, .bytes_served = &W.st.bytes_served,
        .auth_failures = &W.st.auth_failures, .bad_requests = &W.st.bad_requests,
    };
    W.server = cl_server_start(bind_host, 0, token, token_len, W.tls, &svc, err, errlen);
    if (!W.server) return -1;
    W.running = 1;
    return cl_server_port(W.server);
}

void *clamor_worker_base(void) { return W.running ? W.ro : NULL; }
int clamor_worker_port(void) { return W.running ? cl_server_port(W.server) : -1; }

void clamor_worker_begin_task(uint32_t epoch) {
    atomic_store(&W.epoch, epoch);
    atomic_fetch_add(&W.task_seq, 1);
    pthread_mutex_lock(&W.rs_lock);
    W.rs_n = 0;
    pthread_mutex_unlock(&W.rs_lock);
    uint64_t touched = atomic_load(&W.touched);
    if (W.zero_copy) pthread_mutex_lock(&W.map_lock);
    if (touched) madvise(W.ro, touched * W.ps, MADV_DONTNEED); /* cache stays; mappings go */
    if (W.zero_copy) {
        for (uint64_t i = 0; i < cl_zap_words(touched); i++) atomic_store(&W.mapped[i], 0);
        pthread_mutex_unlock(&W.map_lock);
    }
}

uint64_t clamor_worker_end_task(uint64_t *pages, uint32_t *versions, uint64_t cap) {
    pthread_mutex_lock(&W.rs_lock);
    uint64_t n = W.rs_n, k = n < cap ? n : cap;
    if (k) {
        memcpy(pages, W.rs_pages, k * sizeof *pages);
        memcpy(versions, W.rs_vers, k * sizeof *versions);
    }
    pthread_mutex_unlock(&W.rs_lock);
    return n;
}

void clamor_worker_invalidate(uint32_t epoch, const uint64_t *pages, uint64_t n) {
    (void)epoch;
    for (uint64_t i = 0; i < n; i++)
        if (pages[i] < W.npages && W.cver1[pages[i]]) {
            evict(pages[i], 0); /* the driver cleared its holder bits itself */
            ADD(invalidations, 1);
        }
}

void clamor_worker_set_cache_limit(uint64_t pages) {
    __atomic_store_n(&W.st.cache_limit_pages, pages, __ATOMIC_RELAXED);
}

void clamor_worker_get_stats(clamor_worker_stats *out) { *out = W.st; }

int clamor_worker_touch(uint64_t offset, uint64_t length) {
    if (!W.running || offset > W.size || length > W.size - offset) return -1;
    volatile const uint8_t *ro = W.ro;
    uint8_t sink = 0;
    for (uint64_t p = offset / W.ps; length && p * W.ps < offset + length; p++) sink ^= ro[p * W.ps];
    (void)sink;
    return 0;
}
