/* Fetching pages for the worker pager (worker_pager.c): from the driver's memfd on
 * this host, from the driver over TCP (which may REDIRECT to a peer holding the page),
 * from that peer; read-ahead after sequential faults; and prefetch of a task's known
 * pages with many requests in flight. The callers hold fetch_lock. */

#include "worker_pager.h"

/* ------------------------------------------------------------ fetching -- */

/* Connects to a page server: TLS first when the cluster uses it, then the token. */
static int connect_authenticated(uint32_t ip, int port, int timeout_ms) {
    int fd = cl_connect(ip, port, timeout_ms);
    if (fd < 0) return -1;
    char why[256];
    if (W.tls && cl_tls_connect(W.tls, fd, why, sizeof why)) {
        cl_log("worker %d: TLS handshake with %u.%u.%u.%u:%d failed: %s", worker_id(), ip >> 24, (ip >> 16) & 255,
               (ip >> 8) & 255, ip & 255, port, why);
        cl_close(fd);
        return -1;
    }
    if (cl_client_handshake(fd, W.token, W.token_len, (uint32_t)worker_id())) {
        cl_close(fd);
        return -1;
    }
    return fd;
}

static void reset_driver(void) {
    cl_close(W.drv_fd);
    W.drv_fd = -1;
}

int driver(uint64_t page) {
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
void tell_dropped(uint64_t p) {
    cl_msg h = cl_make(CL_HAVE, p, 0, 0);
    h.flags = CL_HAVE_DROPPED;
    if (cl_send_msg(driver(p), &h, NULL)) reset_driver();
}

static int recv_page(int fd, const cl_msg *m, uint64_t p) {
    if (m->type != CL_PAGE || m->page != p || m->length != W.ps) return -1;
    if (cl_recv_all(fd, W.buf, W.ps)) return -1;
    if (cache_write(p, W.buf)) die(EXIT_PAGE_ERROR, "cannot write the page cache (out of memory?)", p);
    return 0;
}

static int fetch_shm(uint64_t p, uint32_t E, uint32_t *v) {
    if (W.shm_fd < 0) return -1;
    uint64_t s1 = atomic_load_explicit(&W.shm_state[p], memory_order_acquire);
    if ((s1 & 1) || (s1 >> 1) == 0 || (s1 >> 1) > E) return -1;
    if (cache_copy_from(W.shm_fd, p)) return -1;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&W.shm_state[p], memory_order_relaxed) != s1) return -1;
    *v = (uint32_t)(s1 >> 1);
    return 0;
}

/* The connection to peer `peer` at ip:port (kept between requests, made anew when the
 * peer's address changed); NULL if it is this worker, out of range or unreachable. */
static int *peer_connection(uint32_t peer, uint32_t ip, uint32_t port) {
    if (peer >= CL_MAX_WORKERS || peer == (uint32_t)worker_id()) return NULL;
    int *fd = &W.peer_fd[peer];
    if (*fd >= 0 && (W.peer_ip[peer] != ip || W.peer_port[peer] != port)) cl_close(*fd), *fd = -1;
    if (*fd < 0) {
        *fd = connect_authenticated(ip, (int)port, PEER_TIMEOUT_MS);
        if (*fd < 0) return NULL;
        W.peer_ip[peer] = ip, W.peer_port[peer] = port;
    }
    return fd;
}

static int fetch_peer(uint32_t peer, uint32_t ip, uint32_t port, uint64_t p, uint32_t E,
                      uint32_t *v, uint32_t *hi) {
    int *fd = peer_connection(peer, ip, port);
    if (!fd) return -1;
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

/* Fetches the latest version <= E of page p into its cache slot (the caller installs it,
 * with p marked pending meanwhile: see resolve_fault). */
void fetch(uint64_t p, uint32_t E, uint32_t *v, uint32_t *hi) {
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
            cache_make_room(p + i);
            if (fetch_shm(p + i, E, &v)) return;
            cache_install(p + i, v, CL_OPEN_ENDED);
            tell_driver(p + i, v, 0);
            ADD(from_shm, 1), ADD(readahead_pages, 1), ADD(pages_fetched, 1), ADD(bytes_fetched, W.ps);
        }
        return;
    }
    /* Over TCP: one batch, whose pages the driver may redirect to peers that hold them
     * (or are being sent them): a burst of workers scanning the same pages fans out. */
    uint64_t *pages = malloc(n * sizeof *pages);
    if (!pages) return; /* the pages are simply fetched on demand */
    for (uint64_t i = 0; i < n; i++) pages[i] = p + i;
    fetch_missing(pages, n, E, FETCH_READAHEAD);
    free(pages);
}

void maybe_read_ahead(uint64_t p, uint32_t E) {
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
    uint64_t limit = cache_limit();
    if (limit && max > limit / 4) max = limit / 4; /* never evicts what it just fetched */
    uint64_t n = 0;
    while (n < W.ra_window && n < max && p + 1 + n < W.npages && !cache_peek(p + 1 + n)) n++;
    if (!n) return;
    read_ahead(p + 1, n, E);
    W.last_missing = p + n;
    W.ra_window = W.ra_window * 2 < max ? W.ra_window * 2 : max;
}

/* ------------------------------------------------------------ prefetch -- */

static int by_page(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
void qsort_pages(uint64_t *pages, uint64_t n) { qsort(pages, n, sizeof *pages, by_page); }

/* A page the driver redirected to a peer holding it (or being sent it). */
typedef struct {
    uint64_t page;
    uint32_t peer, ip, port;
    int *fd; /* the connection to the peer; NULL once it failed */
} redirected;

/* Installs page p (answer m on fd) as `mode` says (FETCH_*): for a fault or a prefetch it
 * is recorded in the read set and mapped (which wakes the threads faulting on it); read
 * ahead, it is only cached. */
static int take_page(int fd, const cl_msg *m, uint64_t p, int mode) {
    cache_make_room(p);
    if (recv_page(fd, m, p)) return -1;
    cache_install(p, m->epoch, m->aux);
    if (mode == FETCH_READAHEAD) {
        ADD(readahead_pages, 1);
    } else {
        rs_record(p, m->epoch, m->aux);
        map_cached(p);
        if (mode == FETCH_PREFETCH) ADD(prefetched_pages, 1);
        else ADD(faults, 1), ADD(pipelined_faults, 1);
    }
    ADD(pages_fetched, 1), ADD(bytes_fetched, W.ps);
    return 0;
}

/* Fetches pages (sorted; none cached for E) from the driver with up to PREFETCH_WINDOW
 * GETs in flight, consecutive pages batched into one GET (CL_GET_BATCH_REDIRECT), and
 * installs them. Any page may be answered with REDIRECT to a peer that holds it (how hot
 * pages replicate): those go into `redir` (room for n, in page order). A page the driver
 * refuses, or that a broken connection leaves out, is fetched on its fault. Returns how
 * many it installed; *nredir says how many were redirected. */
static uint64_t fetch_pipelined(const uint64_t *pages, uint64_t n, uint32_t E, redirected *redir,
                                uint64_t *nredir, int mode) {
    struct { uint64_t first, n; } q[PREFETCH_WINDOW];
    uint64_t next = 0, head = 0, len = 0, got = 0;
    *nredir = 0;
    int fd = driver(pages[0]);
    cl_msg m;
    while (next < n || len) {
        while (len < PREFETCH_WINDOW && next < n) { /* keep the window full */
            uint64_t first = pages[next], k = 1;
            while (next + k < n && pages[next + k] == first + k && k < CL_MAX_BATCH) k++;
            cl_msg g = cl_make(CL_GET, first, E, (uint32_t)k);
            g.flags = k > 1 ? CL_GET_BATCH_REDIRECT : 0;
            if (cl_send_msg(fd, &g, NULL)) goto io_error;
            q[(head + len) % PREFETCH_WINDOW].first = first, q[(head + len) % PREFETCH_WINDOW].n = k;
            len++, next += k;
            if (mode != FETCH_READAHEAD) ADD(prefetch_requests, 1);
        }
        uint64_t first = q[head].first, k = q[head].n;
        head = (head + 1) % PREFETCH_WINDOW, len--;
        for (uint64_t i = 0; i < k; i++) { /* the answers of one GET, in order */
            if (cl_recv_msg(fd, &m)) goto io_error;
            if (m.type == CL_ERROR) break; /* the rest of this GET is not answered */
            if (m.type == CL_REDIRECT) {
                redir[(*nredir)++] = (redirected){first + i, m.aux, m.aux2, m.flags, NULL};
                ADD(redirects, 1);
                continue;
            }
            if (take_page(fd, &m, first + i, mode)) goto io_error;
            ADD(from_driver, 1);
            got++;
        }
    }
    return got;
io_error:
    reset_driver();
    return got;
}

/* Page p from the driver itself, now (NO_REDIRECT), after its redirect to `failed`
 * (peer id + 1) failed, which the driver drops from p's holders. 1: installed. */
static int from_driver_instead(uint64_t p, uint32_t E, uint32_t failed, int mode) {
    ADD(peer_fallbacks, 1);
    int fd = driver(p);
    cl_msg g = cl_make(CL_GET, p, E, 1), m;
    g.flags = CL_GET_NO_REDIRECT;
    g.aux2 = failed;
    if (cl_send_msg(fd, &g, NULL) || cl_recv_msg(fd, &m)) goto io_error;
    if (m.type != CL_PAGE) return 0; /* refused: left to its fault */
    if (take_page(fd, &m, p, mode)) goto io_error;
    ADD(from_driver, 1);
    return 1;
io_error:
    reset_driver();
    return 0;
}

/* Fetches the redirected pages r[0..n) (in page order) from their peers: every GET is
 * sent first, each peer's as one stream, then the answers are read in page order, so
 * this worker only ever waits for the lowest page it lacks. That order is what keeps
 * holders-to-be from waiting in a circle: a peer waiting here for page a may itself be
 * waited for, but only for pages above a (or for a, which a chain of earlier holders
 * ending at one the driver served brings). A page a peer fails to send (it died, hung,
 * timed out waiting for its own copy, or dropped it) is fetched from the driver at
 * once, before the next, for the same reason. Returns how many it installed. */
static uint64_t fetch_from_peers(redirected *r, uint64_t n, uint32_t E, int mode) {
    uint64_t got = 0, unreachable[CL_MAX_WORKERS / 64] = {0}; /* connect once per peer */
    for (uint64_t i = 0; i < n; i++) { /* connect and send */
        uint32_t w = r[i].peer;
        r[i].fd = w < CL_MAX_WORKERS && !(unreachable[w / 64] >> (w % 64) & 1) ? peer_connection(w, r[i].ip, r[i].port) : NULL;
        if (!r[i].fd) {
            if (w < CL_MAX_WORKERS) unreachable[w / 64] |= 1ull << (w % 64);
            continue;
        }
        cl_msg g = cl_make(CL_GET, r[i].page, E, 1);
        g.flags = CL_GET_NO_REDIRECT;
        if (cl_send_msg(*r[i].fd, &g, NULL)) cl_close(*r[i].fd), *r[i].fd = -1, r[i].fd = NULL;
    }
    for (uint64_t i = 0; i < n; i++) { /* receive in page order */
        cl_msg m;
        int *fd = r[i].fd;
        if (fd && *fd >= 0 && cl_recv_msg(*fd, &m) == 0) {
            if (m.type != CL_ERROR) {
                if (take_page(*fd, &m, r[i].page, mode) == 0) {
                    tell_driver(r[i].page, m.epoch, r[i].peer + 1);
                    ADD(from_peers, 1);
                    got++;
                    continue;
                }
                cl_close(*fd), *fd = -1; /* broken mid-page */
            }
        } else if (fd && *fd >= 0) {
            cl_close(*fd), *fd = -1; /* died or hung up: its later pages fail too */
        }
        got += (uint64_t)from_driver_instead(r[i].page, E, r[i].peer + 1, mode);
    }
    return got;
}

/* Fetches `missing` (sorted, none cached): from the driver, and what it redirects from
 * the peers holding it (fetch_from_peers). The pages are pending meanwhile: the driver
 * lists us as their holder at once, and peers redirected here wait for our copy. */
uint64_t fetch_missing(const uint64_t *missing, uint64_t m, uint32_t E, int mode) {
    redirected *redir = malloc(m * sizeof *redir);
    if (!redir) return 0;
    pending_mark(missing, m, 1);
    uint64_t nredir = 0, done = fetch_pipelined(missing, m, E, redir, &nredir, mode);
    if (nredir) done += fetch_from_peers(redir, nredir, E, mode);
    pending_mark(missing, m, 0);
    free(redir);
    return done;
}

uint64_t clamor_worker_prefetch(const uint64_t *pages, uint64_t n) {
    if (!W.running || !n) return 0;
    uint32_t E = rs_epoch();
    uint64_t *missing = malloc(n * sizeof *missing), m = 0, done = 0;
    if (!missing) return 0;
    uint64_t limit = cache_limit();
    pthread_mutex_lock(&W.fetch_lock);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = pages[i];
        uint32_t v, hi;
        if (p >= W.npages || (i && p <= pages[i - 1])) continue; /* sorted and unique only */
        mark_touched(p);
        if (W.zero_copy && map_direct(p, E, 0, 0) == 0) {
            ADD(prefetched_pages, 1), done++;
        } else if (cache_for(p, E, &v, &hi) == 1) {
            cache_referenced(p);
            rs_record(p, v, hi);
            map_cached(p);
            done++;
        } else if (!limit || m < limit / 2) { /* never more than the cache keeps */
            missing[m++] = p;
        }
    }
    for (uint64_t i = 0; i < m; i++)
        if (cache_peek(missing[i])) cache_evict(missing[i], 0); /* cached, but another version */
    if (m) done += fetch_missing(missing, m, E, 1);
    pthread_mutex_unlock(&W.fetch_lock);
    free(missing);
    return done;
}

/* Prefetch of the OS pages a task reads (sorted, unique OS page numbers of the arena):
 * on the driver's host each is mapped in place alone, one page-table entry per looked-up
 * row instead of a fault each; a page that needs a copy, or any page on a copying worker,
 * goes through clamor_worker_prefetch whole. Returns how many arena pages are resident. */
uint64_t clamor_worker_prefetch_pieces(const uint64_t *pieces, uint64_t n) {
    if (!W.running || !n) return 0;
    const uint64_t os_page = (uint64_t)sysconf(_SC_PAGESIZE), per = W.ps / os_page;
    uint64_t *whole = malloc(n * sizeof *whole), k = 0, done = 0, last = UINT64_MAX;
    if (!whole) return 0;
    uint32_t E = rs_epoch();
    for (uint64_t i = 0, j; i < n; i = j) {
        uint64_t p = pieces[i] / per;
        for (j = i + 1; j < n && pieces[j] == pieces[j - 1] + 1 && pieces[j] / per == p;) j++;
        if (p >= W.npages) break;
        if (W.zero_copy) {
            mark_touched(p);
            uint64_t at = (uint64_t)(uintptr_t)W.ro + pieces[i] * os_page;
            if (map_direct(p, E, at, (j - i) * os_page) == 0) {
                if (p != last) ADD(prefetched_pages, 1), done++, last = p;
                continue;
            }
        }
        if (!k || whole[k - 1] != p) whole[k++] = p;
    }
    if (k) done += clamor_worker_prefetch(whole, k);
    free(whole);
    return done;
}
