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
 * that maps it unmap it (zap_shoot_down; the protocol is in pager_common.h), so a
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
 *
 * The driver's native state is split by owner and lock, one file each, layered: this
 * file (the API, start and stop under the `api` lock, the page server's callbacks,
 * the workers' addresses) -> the write handler and stage starts (driver_versions.c,
 * the stage lock) -> the page table (driver_pages.c, the page locks) -> the
 * shoot-down area (driver_zap.c) and the directory (directory.c) -> driver_base.c.
 * A file calls only the layers below it; docs/architecture.md ("The native pager's
 * state") lists what each owns, and tests/test_imports.py checks the includes.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "clamor.h"
#include "driver_base.h"
#include "driver_map_ahead.h"
#include "driver_pages.h"
#include "driver_versions.h"
#include "driver_zap.h"
#include "page_server.h"
#include "pager_common.h"

typedef struct {
    uint32_t ip, port;
} peer;

/* The lifecycle, the page server and the workers' addresses. */
static struct {
    int running;
    uint64_t ps;
    int replication;
    peer peers[CL_MAX_WORKERS];
    cl_server *server;
    cl_tls_ctx *tls; /* NULL: plaintext page protocol */
} S;

/* The close order of the Python-facing API: every clamor_driver_* call below holds
 * `api` for reading while it touches the pager's state; start and stop hold it for
 * writing. A call racing a stop therefore sees either the running tables or
 * S.running == 0 (and answers "not running"), never freed memory. The page server's
 * and the write handler's threads take no part: stop ends them before it frees
 * anything. */
static pthread_rwlock_t api = PTHREAD_RWLOCK_INITIALIZER;
#define API_READ() pthread_rwlock_rdlock(&api)
#define API_WRITE() pthread_rwlock_wrlock(&api)
#define API_DONE() pthread_rwlock_unlock(&api)

/* --------------------------------------------------------- page server -- */

static void answer(void *ctx, uint32_t client, const cl_msg *req, uint64_t p, int may_redirect,
                   uint8_t *buf, cl_answer *a) {
    (void)ctx;
    if (!pages_serves(req->epoch)) {
        a->kind = CL_ANSWER_ERROR;
        a->error = CL_ERR_NO_VERSION;
        return;
    }
    ADD(requests, 1);
    pages_answer(client, req->epoch, req->aux2, p, may_redirect && S.replication, buf, a);
    if (a->kind == CL_ANSWER_REDIRECT) {
        a->peer_ip = S.peers[a->peer_id].ip;
        a->peer_port = S.peers[a->peer_id].port;
        ADD(redirects, 1);
    }
}

/* CL_ROWS: a task's rows at its epoch, read where they lie (no page is sent, none held). */
static uint32_t rows(void *ctx, uint32_t client, uint32_t E, const uint64_t *offsets, uint64_t n,
                     uint64_t row_bytes, uint8_t *out) {
    (void)ctx, (void)client;
    if (!pages_serves(E)) return CL_ERR_NO_VERSION;
    pages_read_rows(E, offsets, n, row_bytes, out);
    return 0;
}

/* CL_HAVE: a worker got a page from shared memory or a peer (no driver GET saw
 * it), or with CL_HAVE_DROPPED evicted one: the directory follows either way. */
static void have(void *ctx, uint32_t client, const cl_msg *msg) {
    (void)ctx;
    pages_have(client, msg);
}

/* ----------------------------------------------------------- lifecycle -- */

/* Frees everything start made; counters and all go back to zero. */
static void free_all(void) {
    pages_free();
    zap_free();
    versions_free(); /* also lifts every write protection */
    cl_tls_free(S.tls);
    memset(&S, 0, sizeof S);
    driver_base_reset();
}

static int start(uint64_t page_size, const uint8_t *token, size_t token_len, const char *bind_host,
                 int port, int replication, const clamor_tls_pem *tls, char *err, size_t errlen) {
    if (S.running) return CL_ERR("the driver pager is already running");
    if (!clamor_arena_exists()) return CL_ERR("the arena does not exist yet");
    if (!cl_is_pow2(page_size) || page_size < 4096 || page_size > (8u << 20))
        return CL_ERR("page size %llu is not a power of two between 4 KiB and 8 MiB",
                      (unsigned long long)page_size);
    memset(&S, 0, sizeof S);
    driver_base_reset();
    if (tls) {
        S.tls = cl_tls_new(tls->ca, tls->ca_len, tls->cert, tls->cert_len, tls->key, tls->key_len, err, errlen);
        if (!S.tls) return -1;
    }
    const uint64_t npages = clamor_arena_size() / page_size;
    S.ps = page_size;
    S.replication = replication;
    clamor_driver_stats *st = driver_stats();
    st->page_size = page_size;
    st->num_pages = npages;
    if (pages_init(page_size, npages, err, errlen) || zap_init(npages, err, errlen)
        || versions_start(clamor_arena_base(), page_size, npages, err, errlen)) {
        free_all();
        return -1;
    }
    cl_service svc = {
        .page_size = page_size, .num_pages = npages, .answer = answer, .have = have, .rows = rows,
        .pages_served = &st->pages_served, .bytes_served = &st->bytes_served, .rows_served = &st->rows_served,
        .auth_failures = &st->auth_failures, .bad_requests = &st->bad_requests,
    };
    S.server = cl_server_start(bind_host, port, token, token_len, S.tls, &svc, err, errlen);
    if (!S.server) {
        versions_stop();
        free_all();
        return -1;
    }
    S.running = 1;
    return cl_server_port(S.server);
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
    int port = S.running ? cl_server_port(S.server) : -1;
    API_DONE();
    return port;
}

int clamor_driver_zap_fd(void) {
    API_READ();
    int fd = S.running ? zap_fd() : -1;
    API_DONE();
    return fd;
}

int clamor_driver_state_fd(void) {
    API_READ();
    int fd = S.running ? pages_state_fd() : -1;
    API_DONE();
    return fd;
}

/* Ends the page server and the write handler, then frees the tables once no API
 * call is inside them; calls after this answer "not running". Idempotent. */
void clamor_driver_stop(void) {
    API_WRITE();
    if (S.running) {
        S.running = 0;
        cl_server_stop(S.server);
        versions_stop();
        free_all();
    }
    API_DONE();
}

void clamor_driver_note_shm_copies(void) {
    API_READ();
    if (S.running) pages_note_shm_copies();
    API_DONE();
}

int clamor_driver_set_peer(int id, const char *host, int port) {
    if (id < 0 || id >= CL_MAX_WORKERS) return -1;
    uint32_t ip;
    if (cl_resolve(host, &ip)) return -1;
    API_READ();
    int rc = -1;
    if (S.running) {
        S.peers[id] = (peer){ip, (uint32_t)port};
        pages_set_live((uint32_t)id, 1);
        rc = 0;
    }
    API_DONE();
    return rc;
}

void clamor_driver_drop_worker(int id) {
    if (id < 0 || id >= CL_MAX_WORKERS) return;
    API_READ();
    if (S.running) {
        pages_set_live((uint32_t)id, 0); /* no redirects to it from now on */
        zap_forget_worker(id);           /* not waited for from now on */
        pages_forget_holder((uint32_t)id);
    }
    API_DONE();
}

/* ---------------------------------------------------------- inspection -- */

/* The counters; after a stop, the last values (stop keeps nothing: zeros). */
void clamor_driver_get_stats(clamor_driver_stats *out) {
    API_READ();
    *out = *driver_stats();
    out->epoch = pages_epoch();
    out->mapped_bytes += zap_mapped_pages() * S.ps;
    API_DONE();
}

uint64_t clamor_driver_page_stats(uint64_t first, uint64_t n, uint64_t *requests, uint64_t *driver_bytes,
                                  uint64_t *peer_bytes, uint32_t *holders, uint32_t *version) {
    API_READ();
    n = S.running ? pages_stats(first, n, requests, driver_bytes, peer_bytes, holders, version) : 0;
    API_DONE();
    return n;
}

uint64_t clamor_driver_page_holders(uint64_t first, uint64_t n, uint32_t *counts, uint16_t *ids, uint64_t cap) {
    API_READ();
    uint64_t total = pages_holders(first, n, counts, ids, cap); /* none when not running */
    API_DONE();
    return total;
}

int clamor_driver_read_version(uint64_t page, uint32_t epoch, uint8_t *out) {
    API_READ();
    int rc = S.running ? pages_read_version(page, epoch, out) : -CL_ERR_PAGE_RANGE;
    API_DONE();
    return rc;
}

int64_t clamor_driver_versions_at(const uint64_t *runs, uint64_t n, uint32_t epoch, uint32_t *out, uint64_t cap) {
    API_READ();
    int64_t k = S.running ? pages_versions_at(runs, n, epoch, out, cap) : -1;
    API_DONE();
    return k;
}

/* -------------------------------------------------------------- stages -- */

uint32_t clamor_driver_begin_stage(void) {
    API_READ();
    uint32_t E = S.running ? versions_begin_stage() : 0;
    API_DONE();
    return E;
}

uint64_t clamor_driver_sealed(uint64_t *out, uint64_t cap) {
    API_READ();
    uint64_t n = pages_sealed(out, cap);
    API_DONE();
    return n;
}

uint64_t clamor_driver_invalidated(uint64_t *out, uint64_t cap) {
    API_READ();
    uint64_t n = pages_invalidated(out, cap);
    API_DONE();
    return n;
}

void clamor_driver_end_stage(void) { __atomic_store_n(&driver_stats()->stage_running, 0, __ATOMIC_RELEASE); }

void clamor_driver_release(uint32_t E) {
    API_READ();
    if (S.running) versions_release(E);
    API_DONE();
}

int clamor_driver_write_rows(const int64_t *offsets, uint64_t n, const uint8_t *values, uint64_t row_bytes) {
    API_READ();
    uint64_t faults = map_ahead_faults();
    int rc = S.running ? versions_write_rows(offsets, n, values, row_bytes) : 1;
    if (rc == 0) map_ahead_rows(offsets, n, faults);
    API_DONE();
    return rc;
}

int clamor_driver_retain(uint32_t E) {
    API_READ();
    int rc = S.running ? versions_retain(E) : -1;
    API_DONE();
    return rc;
}

uint64_t clamor_driver_trim_log(uint32_t floor) {
    API_READ();
    uint64_t freed = S.running ? pages_trim_log(floor) : 0;
    API_DONE();
    return freed;
}
