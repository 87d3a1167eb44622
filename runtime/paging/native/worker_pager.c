/* The worker pager: its fault handler, its page server and its API (api.h).
 *
 * The arena range (worker_mappings.c) is registered with userfaultfd for MISSING
 * and MINOR faults. A touch of a page that is not mapped raises a fault: the handler
 * thread here (native, never the GIL) maps it in place from the driver's memfd
 * (zero copy, on the driver's host), or from the page cache (worker_cache.c),
 * fetching (page, epoch) first when the cache lacks it (worker_fetch.c), and records
 * it in the task's read set (worker_read_sets.c). A fault in a block read densely
 * maps its aligned FAULT_AROUND_BYTES block of current pages at once (fault-around,
 * resident mode).
 *
 * The worker's native state is split by owner and lock, one file each, layered: this
 * file -> fetching (worker_fetch.c, worker_pending.c) -> the mappings
 * (worker_mappings.c) -> the cache, the read set and the connections (worker_cache.c,
 * worker_read_sets.c, worker_conn.c) -> worker_base.c. A file calls only the layers
 * below it; docs/architecture.md ("The native pager's state") lists what each owns,
 * and tests/test_imports.py checks the includes.
 */
#include <errno.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "page_server.h"
#include "pager_common.h"
#include "worker_base.h"
#include "worker_cache.h"
#include "worker_conn.h"
#include "worker_fetch.h"
#include "worker_mappings.h"
#include "worker_pending.h"
#include "worker_read_sets.h"

/* The fault handler's and the API's own state; start sets it, nothing else writes it. */
static struct {
    int running;
    uint64_t size, ps, npages;
    pthread_t thread; /* the fault handler */
    cl_server *server;
} P;

/* ------------------------------------------------------- fault handler -- */

/* Fault-around for cached pages (resident mode, a worker that copies pages): maps the
 * other pages of p's aligned block that are cached for E and not resident yet (pages
 * read ahead, say), one UFFDIO_CONTINUE per run. */
static void map_cached_around(uint64_t p, uint32_t E) {
    uint64_t per, lo, hi;
    maps_block_of(p, &per, &lo, &hi);
    for (uint64_t q = lo, start = lo; q <= hi; q++) {
        uint32_t v, until;
        if (q < hi && q != p && rs_resident(q) != cache_peek(q) && cache_for(q, E, &v, &until) == 1) {
            cache_referenced(q);
            rs_record(q, v, until);
            maps_mark_touched(q);
            ADD(faultaround_pages, 1);
            continue;
        }
        if (q > start) maps_cached_run(start, q);
        start = q + 1;
    }
}

/* Resolves a fault that needs no fetch: the page mapped in place (zero copy) or from
 * the cache. 1: done; 0: it must be fetched (a stale cached version is evicted). */
static int resolve_locally(uint64_t p, uint64_t flags, uint64_t addr) {
    maps_mark_touched(p);
    uint32_t E = rs_epoch(), v, hi;
    if (maps_zero_copy() && maps_direct(p, E, addr, 0) == 0) return 1;
    int state = cache_for(p, E, &v, &hi);
    if (state == 1) {
        if (flags & UFFD_PAGEFAULT_FLAG_MINOR) ADD(soft_faults, 1);
        cache_referenced(p);
        rs_record(p, v, hi);
        if (!rs_exact() && !maps_zero_copy()) map_cached_around(p, E);
        maps_cached(p);
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
    fetch_page(p, E, &v, &hi);
    cache_install(p, v, hi);
    pending_mark(&p, 1, 0);
    ADD(pages_fetched, 1), ADD(bytes_fetched, P.ps);
    rs_record(p, v, hi);
    maps_cached(p);
    if (!maps_zero_copy()) fetch_maybe_read_ahead(p, E);
}

/* A batch of faults read at once (several threads of a task faulting together): those
 * that need a fetch go out as one pipelined stream instead of a round trip each. */
static void on_faults(const struct uffd_msg *msgs, int n) {
    uint64_t need[16], addr[16], flags[16];
    int k = 0;
    const uint64_t base = (uint64_t)(uintptr_t)maps_base();
    fetch_lock();
    for (int i = 0; i < n; i++) {
        if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
        uint64_t a = msgs[i].arg.pagefault.address, p = (a - base) / P.ps;
        if (p >= P.npages || resolve_locally(p, msgs[i].arg.pagefault.flags, a)) continue;
        addr[k] = a, flags[k] = msgs[i].arg.pagefault.flags, need[k++] = p;
    }
    if (k > 1) {
        uint64_t pages[16];
        memcpy(pages, need, (size_t)k * sizeof *pages);
        fetch_sort_pages(pages, (uint64_t)k);
        uint64_t u = 0;
        for (int i = 0; i < k; i++)
            if (!u || pages[u - 1] != pages[i]) pages[u++] = pages[i];
        if (u > 1) fetch_missing(pages, u, rs_epoch(), FETCH_FAULT);
    }
    for (int i = 0; i < k; i++) resolve_fault(need[i], flags[i], addr[i]); /* what the batch left */
    fetch_unlock();
}

static void *fault_main(void *arg) {
    (void)arg;
    const int uffd = maps_uffd();
    struct pollfd pfd = {uffd, POLLIN, 0};
    for (;;) {
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR) break;
        struct uffd_msg msgs[16];
        ssize_t n = read(uffd, msgs, sizeof msgs);
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

int clamor_worker_start(int worker_id, uint64_t arena_size, uint64_t page_size, const uint8_t *token,
                        size_t token_len, const char *driver_host, int driver_port,
                        const char *shm_arena_path, const char *shm_state_path, const char *shm_zap_path,
                        const char *bind_host,
                        int readahead, const clamor_tls_pem *tls, char *err, size_t errlen) {
    if (P.running) return CL_ERR("the worker pager is already running");
    if (worker_id < 0 || worker_id >= CL_MAX_WORKERS)
        return CL_ERR("worker id %d is outside 0..%d", worker_id, CL_MAX_WORKERS - 1);
    if (!cl_is_pow2(page_size) || page_size < 4096 || page_size > (8u << 20))
        return CL_ERR("page size %llu is not a power of two between 4 KiB and 8 MiB", (unsigned long long)page_size);
    if (!arena_size || arena_size % page_size)
        return CL_ERR("arena size %llu is not a multiple of the page size", (unsigned long long)arena_size);
    memset(&P, 0, sizeof P);
    P.size = arena_size, P.ps = page_size, P.npages = arena_size / page_size;
    worker_base_reset(worker_id);
    if (conn_init(token, token_len, driver_host, driver_port, tls, err, errlen)) return -1;
    /* Read-write for zero copy only because userfaultfd registers only mappings that
     * could be made writable; the range itself stays PROT_READ. */
    int shm = shm_arena_path && *shm_arena_path, zero_copy = shm && shm_zap_path && *shm_zap_path;
    if (shm && conn_open_shm(shm_arena_path, shm_state_path, zero_copy, P.npages, page_size, err, errlen)) return -1;
    if (cache_init(page_size, P.npages, conn_tell_dropped, pending_arrived, err, errlen)) return -1;
    if (rs_init(P.npages) || pending_init(P.npages)) return CL_ERR("out of memory for the page tables");
    if (fetch_init(page_size, P.npages, readahead, err, errlen)) return -1;
    if (maps_init(arena_size, page_size, zero_copy, shm_zap_path, err, errlen)) return -1;
    if (pthread_create(&P.thread, NULL, fault_main, NULL)) return CL_ERR("cannot start the fault handler thread");
    pthread_detach(P.thread);
    if (maps_start_shootdowns(err, errlen)) return -1;
    clamor_worker_stats *st = worker_stats();
    cl_service svc = {
        .page_size = P.ps, .num_pages = P.npages, .answer = answer, .have = NULL,
        .pages_served = &st->pages_served, .bytes_served = &st->bytes_served,
        .auth_failures = &st->auth_failures, .bad_requests = &st->bad_requests,
    };
    P.server = cl_server_start(bind_host, 0, token, token_len, conn_tls(), &svc, err, errlen);
    if (!P.server) return -1;
    P.running = 1;
    return cl_server_port(P.server);
}

void *clamor_worker_base(void) { return P.running ? maps_base() : NULL; }
int clamor_worker_port(void) { return P.running ? cl_server_port(P.server) : -1; }

void clamor_worker_get_stats(clamor_worker_stats *out) { *out = *worker_stats(); }

int clamor_worker_touch(uint64_t offset, uint64_t length) {
    if (!P.running || offset > P.size || length > P.size - offset) return -1;
    volatile const uint8_t *ro = maps_base();
    uint8_t sink = 0;
    for (uint64_t p = offset / P.ps; length && p * P.ps < offset + length; p++) sink ^= ro[p * P.ps];
    (void)sink;
    return 0;
}

uint64_t clamor_worker_prefetch(const uint64_t *pages, uint64_t n) {
    return P.running && n ? fetch_prefetch(pages, n) : 0;
}

int clamor_worker_gather(const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint8_t *out) {
    return !P.running ? -1 : n ? fetch_gather(offsets, n, row_bytes, out) : 0;
}

int64_t clamor_worker_prefetch_rows(uint64_t start, int64_t stride, uint64_t row_bytes, const int64_t *rows,
                                    uint64_t n, int64_t axis_len) {
    return P.running && n && row_bytes ? fetch_prefetch_rows(start, stride, row_bytes, rows, n, axis_len) : 0;
}

/* ----------------------------------------------------- tasks and stages -- */

/* Unmaps the whole range (the cache stays), so that every page faults again: each task
 * of exact mode, or a task whose epoch the resident pages do not serve. */
static void unmap_all(void) {
    maps_unmap_all();
    rs_clear_resident();
    ADD(unmap_all, 1);
}

/* A task at `epoch` starts. Exact mode unmaps everything, so that the task's first touch
 * of each page faults and is recorded; resident mode keeps the mappings while they serve
 * `epoch` (rs_begin_task). */
void clamor_worker_begin_task(uint32_t epoch) {
    int keep = rs_begin_task(epoch);
    maps_new_task();
    if (!keep) unmap_all();
}

/* The driver wrote these pages since the last stage and sealed them for `epoch`. A page
 * mapped in place from the driver's page cache stays mapped and its read-set version
 * advances: the mapping already shows the new bytes (no unmap, no fault again). Other
 * mappings in place and cached copies go (invalidations), and they leave the resident
 * set. Runs between attempts, never during one. */
void clamor_worker_invalidate(uint32_t epoch, const uint64_t *pages, uint64_t n) {
    uint8_t *outcome = n ? malloc(n) : NULL;
    if (n && !outcome) die(EXIT_PAGE_ERROR, "out of memory invalidating pages", n);
    maps_invalidate_direct(pages, n, epoch, outcome);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = pages[i];
        if (p >= P.npages || outcome[i] == MAP_ADVANCED) continue;
        int dropped = outcome[i] == MAP_DROPPED;
        if (cache_peek(p)) dropped |= cache_evict(p, 0); /* the driver cleared its holder bits itself */
        if (!rs_exact()) rs_unrecord(p);
        if (dropped) ADD(invalidations, 1);
    }
    free(outcome);
}
