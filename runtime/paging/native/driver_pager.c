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
 * Between stages nothing is shot down: the next stage starts by invalidating every
 * written page on the same-host workers, which keep their mappings across tasks.
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
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver_state.h"

cl_driver_state D;
pthread_rwlock_t api = PTHREAD_RWLOCK_INITIALIZER;

/* --------------------------------------------------------- page server -- */

/* Resolves (page, epoch) to the bytes of the latest version <= epoch. Stripe lock held. */
static void resolve(uint64_t p, uint32_t E, uint8_t *buf, cl_answer *a) {
    uint32_t v = D.version[p];
    a->kind = CL_ANSWER_PAGE;
    if (v <= E) {
        const uint8_t *src = (D.flags[p] & FL_DIRTY) ? D.log[p]->data : D.view + p * D.ps;
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
    if (D.view) munmap((void *)D.view, D.npages * D.ps);
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
    D.view = mmap(NULL, D.npages * D.ps, PROT_READ, MAP_SHARED, clamor_arena_fd(), 0);
    if (D.view == MAP_FAILED) {
        D.view = NULL;
        free_tables();
        return CL_ERR("cannot map the arena for the page server: %s", strerror(errno));
    }
    /* MINOR_SHMEM: async chunks can be parked at stage starts (write_tracking.h). */
    const uint64_t wp = UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_WP_UNPOPULATED_;
    D.uffd = cl_uffd_open(wp | UFFD_FEATURE_MINOR_SHMEM, err, errlen);
    int can_park = D.uffd >= 0;
    if (D.uffd < 0) D.uffd = cl_uffd_open(wp, err, errlen);
    if (D.uffd < 0) D.uffd = cl_uffd_open(UFFD_FEATURE_WP_HUGETLBFS_SHMEM, err, errlen);
    if (D.uffd < 0 || cl_uffd_register(D.uffd, D.base, D.npages * D.ps, UFFDIO_REGISTER_MODE_WP, err, errlen)) {
        free_tables();
        return -1;
    }
    char why[256];
    const char *mode = getenv("CLAMOR_WRITE_TRACKING"); /* "trap": never async (tests, doubts) */
    D.wt = mode && !strcmp(mode, "trap") ? NULL : cl_wtrack_new(D.uffd, can_park, D.base, D.ps, D.npages, why,
                                                                          sizeof why);
    D.st.async_write_tracking = D.wt != NULL;
    D.stop_efd = eventfd(0, EFD_CLOEXEC);
    if (pthread_create(&D.wp_thread, NULL, cl_driver_fault_main, NULL)) {
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
