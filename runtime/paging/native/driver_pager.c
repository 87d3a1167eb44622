/* The driver pager.
 *
 * Versions: every stage submission (begin_stage) is a new epoch E. Pages
 * written since the previous submission get version E; all handed-out
 * pages are then write-protected with userfaultfd (no signal handler, so
 * Python's faulthandler is never involved). The first driver write to a
 * protected page faults into the handler thread here, which copies the old
 * contents into the version log as (page, old version), marks the page
 * dirty and unprotects it. The running stage keeps being served the sealed
 * version from the log; the new contents become the next version.
 *
 * Same-host zero copy: workers on this host map the arena's pages instead of
 * copying them. Before the first write to a page in an epoch lands during a
 * running stage, the write handler marks it dirty and has every same-host worker
 * that maps it unmap it (shoot_down; the protocol is in pager_common.h), so a
 * running task goes on reading the sealed version, now from the version log.
 * Between stages nothing is shot down: every task unmaps all pages when it starts.
 *
 * Directory: which workers hold (or are being sent) the current version of each
 * page. A GET for a page that some other worker holds is answered with REDIRECT to
 * one of them (two random choices, fewer outstanding redirects wins) and the client
 * is listed at once (cl_dir_redirect: a burst fans out as a tree); a client whose
 * redirect failed asks again with NO_REDIRECT. A worker that evicts a page for
 * room says so (CL_HAVE with CL_HAVE_DROPPED).
 *
 * The directory's layout is in directory.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "clamor.h"
#include "page_server.h"
#include "pager_common.h"
#include "directory.h"
#include "write_tracking.h"

#define FL_PROTECTED 1
#define STOPPED_WAIT_MS 100
#define FL_DIRTY 2
#define FL_WRITTEN 4 /* written while no old version was needed (no copy, maybe no trap) */
#define UFFD_FEATURE_WP_UNPOPULATED_ (1 << 13) /* newer than the build headers */

typedef struct logent {
    uint32_t version, valid_until;
    struct logent *next;
    uint8_t data[];
} logent;

typedef struct {
    uint32_t ip, port;
} peer;

_Static_assert(CL_MAX_WORKERS == CLAMOR_MAX_WORKERS, "protocol.h and api.h disagree on the worker limit");

static struct {
    int running;
    uint8_t *base;
    uint64_t ps, npages;
    int uffd, stop_efd, state_fd, zap_fd;
    void *zap; /* the shoot-down area, shared with same-host workers */
    pthread_t wp_thread;
    _Atomic uint64_t *state; /* version << 1 | dirty; read by same-host workers */
    uint32_t *version;
    uint8_t *flags;
    cl_dir dir; /* which workers hold each page (directory.h) */
    uint64_t *requests, *driver_bytes, *peer_bytes;
    logent **log;
    cl_stripes stripes;
    pthread_mutex_t stage; /* serialises begin_stage with the write handler */
    _Atomic uint32_t epoch;
    _Atomic uint32_t floor; /* epochs below it are no longer served: their versions were freed */
    _Atomic uint32_t released; /* no stage reads epochs <= it any more: writes need no copy */
    int wrote_uncopied;        /* since the last release: a write that kept no old bytes */
    cl_wtrack *wt;             /* async write tracking; NULL where the kernel lacks it */
    uint64_t *inval, ninval, inval_cap;
    int replication;
    peer peers[CL_MAX_WORKERS];
    cl_server *server;
    cl_tls_ctx *tls; /* NULL: plaintext page protocol */
    clamor_driver_stats st;
} D;

#define ADD(field, n) __atomic_fetch_add(&D.st.field, (n), __ATOMIC_RELAXED)

/* The close order of the Python-facing API: every clamor_driver_* call below holds
 * `api` for reading while it touches D; start and stop hold it for writing. A call
 * racing a stop therefore sees either the running tables or D.running == 0 (and
 * answers "not running"), never freed memory. Outside D, so free_tables' memset
 * leaves it alone. The page server's and the write handler's threads take no part:
 * stop ends them before it frees anything. */
static pthread_rwlock_t api = PTHREAD_RWLOCK_INITIALIZER;
#define API_READ() pthread_rwlock_rdlock(&api)
#define API_WRITE() pthread_rwlock_wrlock(&api)
#define API_DONE() pthread_rwlock_unlock(&api)

static int write_protect(uint64_t first, uint64_t n, int on) {
    struct uffdio_writeprotect wp = {
        .range = {(uint64_t)(uintptr_t)(D.base + first * D.ps), n * D.ps},
        .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
    };
    if (ioctl(D.uffd, UFFDIO_WRITEPROTECT, &wp)) {
        cl_log("write-protect of pages %llu+%llu failed: %s", (unsigned long long)first,
               (unsigned long long)n, strerror(errno));
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------ write tracking -- */

/* The state letter of process `pid` (R, S, T for stopped, ...), or 0 when it is gone
 * (no such process, a zombie, dead). */
static char process_state(int32_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char *paren = strrchr(buf, ')');
    if (!paren || paren[1] != ' ') return 0;
    return paren[2] == 'Z' || paren[2] == 'X' ? 0 : paren[2];
}

/* Every same-host worker that maps page p from the arena unmaps it before the
 * first write to p lands; the caller has marked p dirty. A worker that exits
 * meanwhile is not waited for. One that is stopped (SIGSTOP: Cluster.slow_worker's
 * throttle, a debugger) is continued after STOPPED_WAIT_MS: the writer may be a
 * Python thread holding the GIL, which the throttle's thread needs to continue it. */
static void shoot_down(uint64_t p) {
    if (!D.zap) return;
    atomic_thread_fence(memory_order_seq_cst); /* the dirty mark before reading the bits */
    const uint64_t bit = 1ull << (p & 63);
    const int slots = cl_zap_slots(D.zap); /* after the fence too: see pager_common.h */
    int32_t pid[CL_MAX_WORKERS];
    uint32_t want[CL_MAX_WORKERS];
    for (int w = 0; w < slots; w++) { /* ask all of them, then wait */
        cl_zap_slot *z = cl_zap_slot_of(D.zap, w);
        pid[w] = atomic_load(&z->pid);
        if (!pid[w] || !(atomic_load(&cl_zap_bits(D.zap, D.npages, w)[p >> 6]) & bit)) {
            pid[w] = 0;
            continue;
        }
        atomic_store(&z->page, p);
        want[w] = atomic_load(&z->req) + 1;
        atomic_store(&z->req, want[w]);
        cl_futex_wake(&z->req);
        ADD(shootdowns, 1);
    }
    for (int w = 0; w < slots; w++) {
        if (!pid[w]) continue;
        cl_zap_slot *z = cl_zap_slot_of(D.zap, w);
        for (int waited = 0;; waited += 10) {
            uint32_t a = atomic_load(&z->ack);
            if (a == want[w] || atomic_load(&z->pid) != pid[w]) break;
            char state = process_state(pid[w]);
            if (!state) break;
            if ((state == 'T' || state == 't') && waited >= STOPPED_WAIT_MS) {
                kill(pid[w], SIGCONT);
                ADD(stopped_continued, 1);
            }
            cl_futex_wait(&z->ack, a, 10);
        }
    }
}

/* Pages [0, hw) hold everything the arena ever handed out. */
static uint64_t high_water_pages(void) {
    clamor_arena_stats as;
    clamor_arena_get_stats(&as);
    uint64_t hw = (as.high_water + D.ps - 1) / D.ps;
    return hw > D.npages ? D.npages : hw;
}

/* The async tracker's finds: pages written with no trap (or touched mid-switch). */
static void mark_written(uint64_t first, uint64_t n) {
    for (uint64_t p = first; p < first + n && p < D.npages; p++) {
        pthread_mutex_t *m = cl_stripe(&D.stripes, p);
        pthread_mutex_lock(m);
        D.flags[p] |= FL_WRITTEN;
        pthread_mutex_unlock(m);
    }
}

/* No stage is running and none will read the current epoch again (Python said so with
 * clamor_driver_release): a write needs no copy of the old bytes. Stage lock held. */
static int no_version_needed(void) {
    return !__atomic_load_n(&D.st.stage_running, __ATOMIC_ACQUIRE) && atomic_load(&D.released) >= atomic_load(&D.epoch);
}

/* The first write to a protected page since its version was sealed. Needed old bytes
 * are copied into the version log first; otherwise the page's chunk of the arena goes
 * over to async tracking (no more traps there until the next stage), or, where the
 * kernel lacks it, the page is just unprotected. */
static void on_write_fault(uint64_t addr) {
    uint64_t p = (addr - (uint64_t)(uintptr_t)D.base) / D.ps;
    if (p >= D.npages) return;
    pthread_mutex_lock(&D.stage);
    pthread_mutex_t *m = cl_stripe(&D.stripes, p);
    if (D.wt && cl_wtrack_is_async(D.wt, cl_wtrack_chunk_of(D.wt, p))) {
        mark_written(p, 1); /* a trap from before the switch, whose unregister woke the writer */
        pthread_mutex_unlock(&D.stage);
        return;
    }
    pthread_mutex_lock(m);
    int fresh = (D.flags[p] & FL_PROTECTED) && !(D.flags[p] & FL_DIRTY);
    if (fresh && no_version_needed()) {
        D.wrote_uncopied = 1;
        pthread_mutex_unlock(m);
        if (D.wt && cl_wtrack_to_async(D.wt, cl_wtrack_chunk_of(D.wt, p), high_water_pages(), mark_written) == 0) {
            ADD(async_switches, 1);
            mark_written(p, 1);
            pthread_mutex_unlock(&D.stage);
            return;
        }
        pthread_mutex_lock(m);
        D.flags[p] |= FL_WRITTEN;
        ADD(uncopied_writes, 1);
    } else if (fresh) {
        logent *e = malloc(sizeof *e + D.ps);
        if (!e) {
            cl_log("out of memory copying page %llu into the version log", (unsigned long long)p);
            abort();
        }
        e->version = D.version[p], e->valid_until = CL_OPEN_ENDED;
        memcpy(e->data, D.base + p * D.ps, D.ps);
        e->next = D.log[p];
        D.log[p] = e;
        D.flags[p] |= FL_DIRTY;
        atomic_store_explicit(&D.state[p], ((uint64_t)D.version[p] << 1) | 1, memory_order_release);
        /* Between stages no task is reading: each task unmaps everything when it starts
         * (begin_task), so only a write during a running stage needs the shoot-down. The
         * stage lock held here orders this test with begin_stage. */
        if (__atomic_load_n(&D.st.stage_running, __ATOMIC_ACQUIRE)) shoot_down(p);
        ADD(cow_copies, 1);
        ADD(version_log_bytes, D.ps);
        ADD(version_log_entries, 1);
    }
    D.flags[p] &= ~FL_PROTECTED;
    write_protect(p, 1, 0); /* also wakes the writer */
    pthread_mutex_unlock(m);
    pthread_mutex_unlock(&D.stage);
}

static void *wp_main(void *arg) {
    (void)arg;
    struct pollfd fds[2] = {{D.uffd, POLLIN, 0}, {D.stop_efd, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
        if (fds[1].revents) break;
        struct uffd_msg msgs[16];
        ssize_t n = read(D.uffd, msgs, sizeof msgs);
        if (n <= 0) continue;
        for (ssize_t i = 0; i < n / (ssize_t)sizeof msgs[0]; i++)
            if (msgs[i].event == UFFD_EVENT_PAGEFAULT)
                on_write_fault(msgs[i].arg.pagefault.address);
    }
    return NULL;
}

/* Chunks under async tracking go back to traps; what was written in them, and every
 * page unprotected before, is marked written. Their pages below hw are protected now. */
static void end_async_tracking(uint64_t hw) {
    if (!D.wt) return;
    for (uint64_t c = 0; c < cl_wtrack_chunks(D.wt); c++) {
        if (!cl_wtrack_is_async(D.wt, c)) continue;
        cl_wtrack_to_sync(D.wt, c, hw, mark_written);
        for (uint64_t p = cl_wtrack_first_page(D.wt, c); p < hw && cl_wtrack_chunk_of(D.wt, p) == c; p++) {
            if (!(D.flags[p] & FL_PROTECTED)) D.flags[p] |= FL_WRITTEN;
            D.flags[p] |= FL_PROTECTED;
        }
    }
}

static int written(uint64_t p) { return !(D.flags[p] & FL_PROTECTED) || (D.flags[p] & FL_WRITTEN); }

static uint32_t begin_stage(void) {
    pthread_mutex_lock(&D.stage);
    uint64_t hw = high_water_pages();
    uint32_t E = atomic_load(&D.epoch) + 1;
    end_async_tracking(hw);
    /* Protect first, so no write can slip between sealing and protecting. */
    for (uint64_t p = 0; p < hw;) {
        if (D.flags[p] & FL_PROTECTED) { p++; continue; }
        uint64_t q = p;
        while (q < hw && !(D.flags[q] & FL_PROTECTED)) q++;
        write_protect(p, q - p, 1);
        p = q;
    }
    D.ninval = 0;
    for (uint64_t p = 0; p < hw; p++) {
        if (!written(p)) continue;
        pthread_mutex_t *m = cl_stripe(&D.stripes, p);
        pthread_mutex_lock(m);
        if (D.flags[p] & FL_WRITTEN) ADD(pages_written, 1);
        if ((D.flags[p] & FL_DIRTY) && D.log[p]) D.log[p]->valid_until = E - 1;
        if (cl_dir_count(&D.dir, p)) {
            if (D.ninval == D.inval_cap) {
                D.inval_cap = D.inval_cap ? 2 * D.inval_cap : 1024;
                D.inval = realloc(D.inval, D.inval_cap * sizeof *D.inval);
            }
            D.inval[D.ninval++] = p;
            cl_dir_clear(&D.dir, p);
        }
        D.version[p] = E;
        D.flags[p] = FL_PROTECTED;
        atomic_store_explicit(&D.state[p], (uint64_t)E << 1, memory_order_release);
        pthread_mutex_unlock(m);
    }
    ADD(invalidations, D.ninval);
    atomic_store(&D.epoch, E);
    __atomic_store_n(&D.st.stage_running, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&D.stage);
    return E;
}

uint32_t clamor_driver_begin_stage(void) {
    API_READ();
    uint32_t E = D.running ? begin_stage() : 0;
    API_DONE();
    return E;
}

uint64_t clamor_driver_invalidated(uint64_t *out, uint64_t cap) {
    API_READ();
    uint64_t n = D.ninval < cap ? D.ninval : cap;
    if (out && n) memcpy(out, D.inval, n * sizeof *out);
    n = D.ninval;
    API_DONE();
    return n;
}

void clamor_driver_end_stage(void) { __atomic_store_n(&D.st.stage_running, 0, __ATOMIC_RELEASE); }

/* No stage will read epochs <= E any more (lineage and checkpoints need none of them;
 * attempts still running from E are discarded): until the next stage, the driver's
 * writes need no copy of the old bytes, and go untrapped where the kernel can. */
void clamor_driver_release(uint32_t E) {
    API_READ();
    if (D.running) {
        pthread_mutex_lock(&D.stage);
        if (E > atomic_load(&D.released)) {
            atomic_store(&D.released, E);
            D.wrote_uncopied = 0;
        }
        pthread_mutex_unlock(&D.stage);
    }
    API_DONE();
}

/* Epoch E is needed again after all (Cluster.keep_versions): undoes a release of it
 * if no write since went without a copy. 0: its versions are all there; -1: gone. */
int clamor_driver_retain(uint32_t E) {
    API_READ();
    int rc = -1;
    if (D.running) {
        pthread_mutex_lock(&D.stage);
        if (E > atomic_load(&D.released)) rc = 0;
        else if (!D.wrote_uncopied) atomic_store(&D.released, E ? E - 1 : 0), rc = 0;
        pthread_mutex_unlock(&D.stage);
    }
    API_DONE();
    return rc;
}

/* Frees the log entries no epoch >= floor can read. Walking a page's log newest
 * first: a dirty page's head (its sealed current version) is kept; then every
 * entry newer than floor, and the first one at or below it (what epoch `floor`
 * itself reads). Requests for epochs below the floor get NO_VERSION from now on. */
static uint64_t trim_log(uint32_t floor) {
    uint32_t old = atomic_load(&D.floor);
    while (floor > old && !atomic_compare_exchange_weak(&D.floor, &old, floor)) {
    }
    floor = atomic_load(&D.floor);
    uint64_t freed = 0;
    for (uint64_t p = 0; p < D.npages; p++) {
        if (!D.log[p]) continue;
        pthread_mutex_t *m = cl_stripe(&D.stripes, p);
        pthread_mutex_lock(m);
        logent **link = &D.log[p];
        if ((D.flags[p] & FL_DIRTY) && *link) link = &(*link)->next;
        if (D.version[p] > floor) {
            while (*link && (*link)->version > floor) link = &(*link)->next;
            if (*link) link = &(*link)->next;
        }
        for (logent *e = *link, *next; e; e = next) {
            next = e->next;
            free(e);
            freed++;
        }
        *link = NULL;
        pthread_mutex_unlock(m);
    }
    __atomic_fetch_sub(&D.st.version_log_bytes, freed * D.ps, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&D.st.version_log_entries, freed, __ATOMIC_RELAXED);
    return freed * D.ps;
}

uint64_t clamor_driver_trim_log(uint32_t floor) {
    API_READ();
    uint64_t freed = D.running ? trim_log(floor) : 0;
    API_DONE();
    return freed;
}

/* --------------------------------------------------------- page server -- */

/* Resolves (page, epoch) to the bytes of the latest version <= epoch. Stripe lock held. */
static void resolve(uint64_t p, uint32_t E, uint8_t *buf, cl_answer *a) {
    uint32_t v = D.version[p];
    a->kind = CL_ANSWER_PAGE;
    if (v <= E) {
        const uint8_t *src = (D.flags[p] & FL_DIRTY) ? D.log[p]->data : D.base + p * D.ps;
        memcpy(buf, src, D.ps);
        a->version = v;
        a->valid_until = CL_OPEN_ENDED;
        return;
    }
    uint32_t older_than = v;
    for (logent *e = D.log[p]; e; e = e->next) {
        if (e->version <= E) {
            memcpy(buf, e->data, D.ps);
            a->version = e->version;
            a->valid_until = e->valid_until;
            return;
        }
        older_than = e->version;
    }
    /* The page was first handed out after epoch E: it was never written then. */
    memset(buf, 0, D.ps);
    a->version = 0;
    a->valid_until = older_than - 1;
}

static void answer(void *ctx, uint32_t client, const cl_msg *req, uint64_t p, int may_redirect,
                   uint8_t *buf, cl_answer *a) {
    (void)ctx;
    uint32_t E = req->epoch;
    if (E == 0 || E > atomic_load(&D.epoch) || E < atomic_load(&D.floor)) {
        a->kind = CL_ANSWER_ERROR;
        a->error = CL_ERR_NO_VERSION;
        return;
    }
    ADD(requests, 1);
    pthread_mutex_t *m = cl_stripe(&D.stripes, p);
    pthread_mutex_lock(m);
    D.requests[p]++;
    if (req->aux2 && req->aux2 <= CL_MAX_WORKERS) cl_dir_failed(&D.dir, p, req->aux2 - 1); /* its redirect failed */
    int worker = client < CL_MAX_WORKERS;
    if (D.version[p] <= E && may_redirect && D.replication && worker && cl_dir_count(&D.dir, p)) {
        int64_t pick = cl_dir_redirect(&D.dir, p, client); /* the client is a holder-to-be now */
        if (pick >= 0) {
            uint32_t peer_id = (uint32_t)pick;
            a->kind = CL_ANSWER_REDIRECT;
            a->version = D.version[p];
            a->peer_id = peer_id;
            a->peer_ip = D.peers[peer_id].ip;
            a->peer_port = D.peers[peer_id].port;
            pthread_mutex_unlock(m);
            ADD(redirects, 1);
            return;
        }
    }
    resolve(p, E, buf, a);
    if (worker && a->version == D.version[p]) cl_dir_add(&D.dir, p, client);
    D.driver_bytes[p] += D.ps;
    pthread_mutex_unlock(m);
}

/* CL_HAVE: a worker got a page from shared memory or a peer (no driver GET saw
 * it), or with CL_HAVE_DROPPED evicted one: the directory follows either way. */
static void have(void *ctx, uint32_t client, const cl_msg *msg) {
    (void)ctx;
    uint64_t p = msg->page;
    pthread_mutex_t *m = cl_stripe(&D.stripes, p);
    pthread_mutex_lock(m);
    if (msg->flags & CL_HAVE_DROPPED) {
        cl_dir_remove(&D.dir, p, client);
        pthread_mutex_unlock(m);
        ADD(evictions_told, 1);
        return;
    }
    if (D.version[p] == msg->epoch) cl_dir_add(&D.dir, p, client); /* ignores ids past the limit */
    if (msg->aux == 0) {
        D.requests[p]++;
        D.driver_bytes[p] += D.ps;
        ADD(shm_bytes, D.ps);
    } else {
        D.peer_bytes[p] += D.ps, ADD(peer_bytes, D.ps);
        cl_dir_served(&D.dir, msg->aux - 1); /* that peer's redirect is done */
    }
    pthread_mutex_unlock(m);
}

/* ----------------------------------------------------------- lifecycle -- */

static void free_tables(void) {
    if (D.log)
        for (uint64_t p = 0; p < D.npages; p++)
            for (logent *e = D.log[p], *next; e; e = next) next = e->next, free(e);
    cl_dir_free(&D.dir);
    free(D.log), free(D.version), free(D.flags), free(D.requests);
    free(D.driver_bytes), free(D.peer_bytes), free(D.inval);
    if (D.state) munmap((void *)D.state, D.npages * sizeof *D.state);
    if (D.state_fd >= 0) close(D.state_fd);
    if (D.zap) munmap(D.zap, cl_zap_area_bytes(D.npages));
    if (D.zap_fd >= 0) close(D.zap_fd);
    cl_wtrack_free(D.wt); /* before the sync userfaultfd: it may hold chunks */
    if (D.uffd >= 0) close(D.uffd); /* also lifts every write protection */
    if (D.stop_efd >= 0) close(D.stop_efd);
    cl_tls_free(D.tls);
    memset(&D, 0, sizeof D);
    D.uffd = D.stop_efd = D.state_fd = D.zap_fd = -1;
}

static int start(uint64_t page_size, const uint8_t *token, size_t token_len, const char *bind_host,
                 int port, int replication, const clamor_tls_pem *tls, char *err, size_t errlen) {
    if (D.running) return CL_ERR("the driver pager is already running");
    if (!clamor_arena_exists()) return CL_ERR("the arena does not exist yet");
    if (!cl_is_pow2(page_size) || page_size < 4096 || page_size > (8u << 20))
        return CL_ERR("page size %llu is not a power of two between 4 KiB and 8 MiB",
                      (unsigned long long)page_size);
    memset(&D, 0, sizeof D);
    D.uffd = D.stop_efd = D.state_fd = D.zap_fd = -1;
    if (tls) {
        D.tls = cl_tls_new(tls->ca, tls->ca_len, tls->cert, tls->cert_len, tls->key, tls->key_len, err, errlen);
        if (!D.tls) return -1;
    }
    D.base = clamor_arena_base();
    D.ps = page_size;
    D.npages = clamor_arena_size() / page_size;
    D.replication = replication;
    D.st.page_size = page_size;
    D.st.num_pages = D.npages;
    cl_stripes_init(&D.stripes);
    pthread_mutex_init(&D.stage, NULL);
    D.version = calloc(D.npages, sizeof *D.version);
    D.flags = calloc(D.npages, 1);
    int dir_ok = cl_dir_init(&D.dir, D.npages, &D.st.directory_bytes, &D.st.holder_bitmaps) == 0;
    D.requests = calloc(D.npages, sizeof *D.requests);
    D.driver_bytes = calloc(D.npages, sizeof *D.driver_bytes);
    D.peer_bytes = calloc(D.npages, sizeof *D.peer_bytes);
    D.log = calloc(D.npages, sizeof *D.log);
    if (!D.version || !D.flags || !dir_ok || !D.requests || !D.driver_bytes || !D.peer_bytes || !D.log) {
        free_tables();
        return CL_ERR("out of memory for the page tables of %llu pages", (unsigned long long)D.npages);
    }
    D.state_fd = memfd_create("clamor-page-state", MFD_CLOEXEC);
    if (D.state_fd < 0 || ftruncate(D.state_fd, (off_t)(D.npages * sizeof *D.state))) {
        free_tables();
        return CL_ERR("cannot create the page state table: %s", strerror(errno));
    }
    D.state = mmap(NULL, D.npages * sizeof *D.state, PROT_READ | PROT_WRITE, MAP_SHARED, D.state_fd, 0);
    if (D.state == MAP_FAILED) {
        D.state = NULL;
        free_tables();
        return CL_ERR("cannot map the page state table: %s", strerror(errno));
    }
    D.zap_fd = memfd_create("clamor-page-zap", MFD_CLOEXEC);
    if (D.zap_fd < 0 || ftruncate(D.zap_fd, (off_t)cl_zap_area_bytes(D.npages))) {
        free_tables();
        return CL_ERR("cannot create the shoot-down area: %s", strerror(errno));
    }
    D.zap = mmap(NULL, cl_zap_area_bytes(D.npages), PROT_READ | PROT_WRITE, MAP_SHARED, D.zap_fd, 0);
    if (D.zap == MAP_FAILED) {
        D.zap = NULL;
        free_tables();
        return CL_ERR("cannot map the shoot-down area: %s", strerror(errno));
    }
    D.uffd = cl_uffd_open(UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_WP_UNPOPULATED_, err, errlen);
    if (D.uffd < 0) D.uffd = cl_uffd_open(UFFD_FEATURE_WP_HUGETLBFS_SHMEM, err, errlen);
    if (D.uffd < 0 || cl_uffd_register(D.uffd, D.base, D.npages * D.ps, UFFDIO_REGISTER_MODE_WP, err, errlen)) {
        free_tables();
        return -1;
    }
    char why[256];
    const char *mode = getenv("CLAMOR_WRITE_TRACKING"); /* "trap": never async (tests, doubts) */
    D.wt = mode && !strcmp(mode, "trap") ? NULL : cl_wtrack_new(D.uffd, D.base, D.ps, D.npages, why, sizeof why);
    D.st.async_write_tracking = D.wt != NULL;
    D.stop_efd = eventfd(0, EFD_CLOEXEC);
    if (pthread_create(&D.wp_thread, NULL, wp_main, NULL)) {
        free_tables();
        return CL_ERR("cannot start the write-tracking thread");
    }
    cl_service svc = {
        .page_size = D.ps, .num_pages = D.npages, .answer = answer, .have = have,
        .pages_served = &D.st.pages_served, .bytes_served = &D.st.bytes_served,
        .auth_failures = &D.st.auth_failures, .bad_requests = &D.st.bad_requests,
    };
    D.server = cl_server_start(bind_host, port, token, token_len, D.tls, &svc, err, errlen);
    if (!D.server) {
        uint64_t one = 1;
        if (write(D.stop_efd, &one, sizeof one) < 0) {}
        pthread_join(D.wp_thread, NULL);
        free_tables();
        return -1;
    }
    D.running = 1;
    return cl_server_port(D.server);
}

int clamor_driver_start(uint64_t page_size, const uint8_t *token, size_t token_len,
                        const char *bind_host, int port, int replication, const clamor_tls_pem *tls,
                        char *err, size_t errlen) {
    API_WRITE();
    int rc = start(page_size, token, token_len, bind_host, port, replication, tls, err, errlen);
    API_DONE();
    return rc;
}

int clamor_driver_port(void) {
    API_READ();
    int port = D.running ? cl_server_port(D.server) : -1;
    API_DONE();
    return port;
}

int clamor_driver_zap_fd(void) {
    API_READ();
    int fd = D.running ? D.zap_fd : -1;
    API_DONE();
    return fd;
}

int clamor_driver_state_fd(void) {
    API_READ();
    int fd = D.running ? D.state_fd : -1;
    API_DONE();
    return fd;
}

/* Ends the page server and the write handler, then frees the tables once no API
 * call is inside them; calls after this answer "not running". Idempotent. */
void clamor_driver_stop(void) {
    API_WRITE();
    if (D.running) {
        D.running = 0;
        cl_server_stop(D.server);
        uint64_t one = 1;
        if (write(D.stop_efd, &one, sizeof one) < 0) {}
        pthread_join(D.wp_thread, NULL);
        free_tables();
    }
    API_DONE();
}

int clamor_driver_set_peer(int id, const char *host, int port) {
    if (id < 0 || id >= CL_MAX_WORKERS) return -1;
    uint32_t ip;
    if (cl_resolve(host, &ip)) return -1;
    API_READ();
    int rc = -1;
    if (D.running) {
        D.peers[id] = (peer){ip, (uint32_t)port};
        cl_dir_set_live(&D.dir, (uint32_t)id, 1);
        rc = 0;
    }
    API_DONE();
    return rc;
}

void clamor_driver_drop_worker(int id) {
    if (id < 0 || id >= CL_MAX_WORKERS) return;
    API_READ();
    if (D.running) {
        cl_dir_set_live(&D.dir, (uint32_t)id, 0); /* no redirects to it from now on */
        atomic_store(&cl_zap_slot_of(D.zap, id)->pid, 0); /* not waited for from now on */
        /* Pages with no holders are skipped unlocked; a page that gains one meanwhile
         * gains a live worker (this one is no longer redirected to, see cl_dir_pick). */
        uint64_t end = atomic_load(&D.dir.end);
        for (uint64_t p = 0; p < end; p++)
            if (cl_dir_count(&D.dir, p)) {
                pthread_mutex_t *m = cl_stripe(&D.stripes, p);
                pthread_mutex_lock(m);
                cl_dir_remove(&D.dir, p, (uint32_t)id);
                pthread_mutex_unlock(m);
            }
    }
    API_DONE();
}

/* The counters; after a stop, the last values (stop keeps nothing: zeros). */
void clamor_driver_get_stats(clamor_driver_stats *out) {
    API_READ();
    *out = D.st;
    out->epoch = atomic_load(&D.epoch);
    if (D.zap)
        for (int w = 0, slots = cl_zap_slots(D.zap); w < slots; w++)
            out->mapped_bytes += atomic_load_explicit(&cl_zap_slot_of(D.zap, w)->maps, memory_order_relaxed) * D.ps;
    API_DONE();
}

uint64_t clamor_driver_page_stats(uint64_t first, uint64_t n, uint64_t *requests, uint64_t *driver_bytes,
                                  uint64_t *peer_bytes, uint32_t *holders, uint32_t *version) {
    API_READ();
    if (!D.running || first >= D.npages) n = 0;
    else if (n > D.npages - first) n = D.npages - first;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = first + i;
        requests[i] = D.requests[p] + (D.zap ? atomic_load_explicit(&cl_zap_maps(D.zap, D.npages)[p], memory_order_relaxed) : 0);
        driver_bytes[i] = D.driver_bytes[p];
        peer_bytes[i] = D.peer_bytes[p];
        holders[i] = cl_dir_count(&D.dir, p);
        version[i] = D.version[p];
    }
    API_DONE();
    return n;
}

uint64_t clamor_driver_page_holders(uint64_t first, uint64_t n, uint32_t *counts, uint16_t *ids, uint64_t cap) {
    API_READ();
    uint64_t total = 0, end = D.running && first < D.npages ? D.npages - first : 0;
    uint16_t one[CL_MAX_WORKERS];
    for (uint64_t i = 0; i < n; i++) {
        uint32_t k = 0;
        if (i < end) {
            uint64_t p = first + i;
            pthread_mutex_t *m = cl_stripe(&D.stripes, p);
            pthread_mutex_lock(m);
            k = cl_dir_list(&D.dir, p, one);
            pthread_mutex_unlock(m);
        }
        counts[i] = k;
        for (uint32_t j = 0; j < k; j++, total++)
            if (total < cap) ids[total] = one[j];
    }
    API_DONE();
    return total;
}

static int read_version(uint64_t page, uint32_t epoch, uint8_t *out) {
    if (!D.running || page >= D.npages) return -CL_ERR_PAGE_RANGE;
    if (epoch == 0 || epoch > atomic_load(&D.epoch) || epoch < atomic_load(&D.floor))
        return -CL_ERR_NO_VERSION;
    cl_answer a;
    pthread_mutex_t *m = cl_stripe(&D.stripes, page);
    pthread_mutex_lock(m);
    resolve(page, epoch, out, &a);
    pthread_mutex_unlock(m);
    return (int)a.version;
}

int clamor_driver_read_version(uint64_t page, uint32_t epoch, uint8_t *out) {
    API_READ();
    int rc = read_version(page, epoch, out);
    API_DONE();
    return rc;
}
