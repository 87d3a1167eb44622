/* Fetching pages for the worker pager (worker_fetch.h): from the driver's memfd on
 * this host, from the driver over TCP (which may REDIRECT to a peer holding the page),
 * from that peer; read-ahead after sequential faults; prefetch of a task's known
 * pages with many requests in flight; and a gather's rows without their pages: copied
 * from the driver's memory on its host (no lock: it only reads), else asked of the
 * driver (CL_ROWS). Everything else here runs under the fetch lock.
 *
 * Fetch order: own cache -> the driver's memfd on this host (seqlock-checked
 * against the driver's page state table) -> the driver over TCP, which may
 * REDIRECT to a peer holding the page -> the driver again, NO_REDIRECT, if
 * that peer fails. A driver that cannot be reached makes the worker exit
 * with status 70 rather than hang (worker_conn.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pager_common.h"
#include "worker_base.h"
#include "worker_cache.h"
#include "worker_conn.h"
#include "worker_fetch.h"
#include "worker_mappings.h"
#include "worker_pending.h"
#include "worker_read_sets.h"

#define READAHEAD_BYTES (16u << 20)
#define PREFETCH_WINDOW 32 /* prefetch GETs in flight on the driver connection */

static struct {
    uint64_t ps, npages;
    pthread_mutex_t lock;        /* the fetch lock: the fault handler vs. a task thread's prefetch */
    uint8_t *buf;                /* one page, warm: network pages land here first */
    int readahead;               /* read ahead after sequential faults */
    uint64_t last_missing, ra_window; /* read-ahead: the last page faulted, the pages to fetch next */
    int run;                     /* read-ahead: sequential faults in a row */
} F;

int fetch_init(uint64_t ps, uint64_t npages, int readahead, char *err, size_t errlen) {
    memset(&F, 0, sizeof F);
    F.ps = ps, F.npages = npages, F.readahead = readahead, F.ra_window = 4;
    F.last_missing = UINT64_MAX - 1;
    pthread_mutex_init(&F.lock, NULL);
    F.buf = malloc(ps);
    if (!F.buf) return CL_ERR("out of memory for a page buffer");
    memset(F.buf, 0, ps); /* warm: received pages never fault here */
    return 0;
}

void fetch_lock(void) { pthread_mutex_lock(&F.lock); }
void fetch_unlock(void) { pthread_mutex_unlock(&F.lock); }

/* ------------------------------------------------------------ fetching -- */

static int recv_page(int fd, const cl_msg *m, uint64_t p) {
    if (m->type != CL_PAGE || m->page != p || m->length != F.ps) return -1;
    if (cl_recv_all(fd, F.buf, F.ps)) return -1;
    if (cache_write(p, F.buf)) die(EXIT_PAGE_ERROR, "cannot write the page cache (out of memory?)", p);
    return 0;
}

/* Whether a page state word (version << 1 | dirty) says the driver's memory shows the
 * version epoch E reads: sealed at or before E, not written since. */
static int shm_serves(uint64_t state, uint32_t E) { return !(state & 1) && (state >> 1) && (state >> 1) <= E; }

static int fetch_shm(uint64_t p, uint32_t E, uint32_t *v) {
    if (conn_shm_fd() < 0) return -1;
    uint64_t s1 = conn_shm_state(p);
    if (!shm_serves(s1, E)) return -1;
    if (cache_copy_from(conn_shm_fd(), p)) return -1;
    atomic_thread_fence(memory_order_acquire);
    if (conn_shm_state(p) != s1) return -1;
    *v = (uint32_t)(s1 >> 1);
    return 0;
}

static int fetch_peer(uint32_t peer, uint32_t ip, uint32_t port, uint64_t p, uint32_t E,
                      uint32_t *v, uint32_t *hi) {
    int fd = conn_peer(peer, ip, port);
    if (fd < 0) return -1;
    cl_msg g = cl_make(CL_GET, p, E, 1), m;
    g.flags = CL_GET_NO_REDIRECT;
    if (cl_send_msg(fd, &g, NULL) || cl_recv_msg(fd, &m)) goto broken;
    if (m.type == CL_ERROR) return -1;
    if (recv_page(fd, &m, p)) goto broken;
    *v = m.epoch, *hi = m.aux;
    return 0;
broken:
    conn_peer_close(peer);
    return -1;
}

/* Fetches the latest version <= E of page p into its cache slot (the caller installs it,
 * with p marked pending meanwhile: see worker_pager.c's resolve_fault). */
void fetch_page(uint64_t p, uint32_t E, uint32_t *v, uint32_t *hi) {
    if (fetch_shm(p, E, v) == 0) {
        *hi = CL_OPEN_ENDED;
        ADD(from_shm, 1);
        conn_tell(p, *v, 0);
        return;
    }
    uint32_t failed = 0;
    for (int io_errors = 0;;) {
        int fd = conn_driver(p);
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
                conn_tell(p, *v, m.aux + 1);
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
        conn_reset_driver();
        if (++io_errors == 5) die(EXIT_DRIVER_UNREACHABLE, "lost the connection to the driver", p);
    }
}

/* Fetches pages [p, p + n) (none cached) in one request, after a sequential run. */
static void read_ahead(uint64_t p, uint64_t n, uint32_t E) {
    if (conn_shm_fd() >= 0) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t v;
            cache_make_room(p + i);
            if (fetch_shm(p + i, E, &v)) return;
            cache_install(p + i, v, CL_OPEN_ENDED);
            conn_tell(p + i, v, 0);
            ADD(from_shm, 1), ADD(readahead_pages, 1), ADD(pages_fetched, 1), ADD(bytes_fetched, F.ps);
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

void fetch_maybe_read_ahead(uint64_t p, uint32_t E) {
    if (p == F.last_missing + 1) {
        F.run++;
    } else {
        F.run = 0;
        F.ra_window = 4;
    }
    F.last_missing = p;
    if (!F.readahead || F.run < 2) return;
    uint64_t max = READAHEAD_BYTES / F.ps;
    if (max < 1) max = 1;
    if (max > CL_MAX_BATCH) max = CL_MAX_BATCH;
    uint64_t limit = cache_limit();
    if (limit && max > limit / 4) max = limit / 4; /* never evicts what it just fetched */
    uint64_t n = 0;
    while (n < F.ra_window && n < max && p + 1 + n < F.npages && !cache_peek(p + 1 + n)) n++;
    if (!n) return;
    read_ahead(p + 1, n, E);
    F.last_missing = p + n;
    F.ra_window = F.ra_window * 2 < max ? F.ra_window * 2 : max;
}

/* ------------------------------------------------------------ prefetch -- */

static int by_page(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
void fetch_sort_pages(uint64_t *pages, uint64_t n) { qsort(pages, n, sizeof *pages, by_page); }

/* A page the driver redirected to a peer holding it (or being sent it). */
typedef struct {
    uint64_t page;
    uint32_t peer, ip, port;
    int sent; /* its GET went out on the peer's connection */
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
        maps_cached(p);
        if (mode == FETCH_PREFETCH) ADD(prefetched_pages, 1);
        else ADD(faults, 1), ADD(pipelined_faults, 1);
    }
    ADD(pages_fetched, 1), ADD(bytes_fetched, F.ps);
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
    int fd = conn_driver(pages[0]);
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
                redir[(*nredir)++] = (redirected){first + i, m.aux, m.aux2, m.flags, 0};
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
    conn_reset_driver();
    return got;
}

/* Page p from the driver itself, now (NO_REDIRECT), after its redirect to `failed`
 * (peer id + 1) failed, which the driver drops from p's holders. 1: installed. */
static int from_driver_instead(uint64_t p, uint32_t E, uint32_t failed, int mode) {
    ADD(peer_fallbacks, 1);
    int fd = conn_driver(p);
    cl_msg g = cl_make(CL_GET, p, E, 1), m;
    g.flags = CL_GET_NO_REDIRECT;
    g.aux2 = failed;
    if (cl_send_msg(fd, &g, NULL) || cl_recv_msg(fd, &m)) goto io_error;
    if (m.type != CL_PAGE) return 0; /* refused: left to its fault */
    if (take_page(fd, &m, p, mode)) goto io_error;
    ADD(from_driver, 1);
    return 1;
io_error:
    conn_reset_driver();
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
        int fd = w < CL_MAX_WORKERS && !(unreachable[w / 64] >> (w % 64) & 1) ? conn_peer(w, r[i].ip, r[i].port) : -1;
        if (fd < 0) {
            if (w < CL_MAX_WORKERS) unreachable[w / 64] |= 1ull << (w % 64);
            continue;
        }
        cl_msg g = cl_make(CL_GET, r[i].page, E, 1);
        g.flags = CL_GET_NO_REDIRECT;
        if (cl_send_msg(fd, &g, NULL)) conn_peer_close(w);
        else r[i].sent = 1;
    }
    for (uint64_t i = 0; i < n; i++) { /* receive in page order */
        cl_msg m;
        int fd = r[i].sent ? conn_peer_fd(r[i].peer) : -1; /* -1 once it failed, for every later page */
        if (fd >= 0 && cl_recv_msg(fd, &m) == 0) {
            if (m.type != CL_ERROR) {
                if (take_page(fd, &m, r[i].page, mode) == 0) {
                    conn_tell(r[i].page, m.epoch, r[i].peer + 1);
                    ADD(from_peers, 1);
                    got++;
                    continue;
                }
                conn_peer_close(r[i].peer); /* broken mid-page */
            }
        } else if (fd >= 0) {
            conn_peer_close(r[i].peer); /* died or hung up: its later pages fail too */
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

uint64_t fetch_prefetch(const uint64_t *pages, uint64_t n) {
    uint32_t E = rs_epoch();
    const uint64_t per = F.ps / (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t *missing = malloc(n * sizeof *missing), m = 0, done = 0;
    if (!missing) return 0;
    uint64_t limit = cache_limit();
    pthread_mutex_lock(&F.lock);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = pages[i];
        uint32_t v, hi;
        if (p >= F.npages || (i && p <= pages[i - 1])) continue; /* sorted and unique only */
        if (maps_has_pieces(p * per, per)) { /* mapped in place already: nothing to do */
            done++;
            continue;
        }
        maps_mark_touched(p);
        if (maps_zero_copy() && maps_direct(p, E, 0, 0) == 0) {
            ADD(prefetched_pages, 1), done++;
        } else if (cache_for(p, E, &v, &hi) == 1) {
            cache_referenced(p);
            rs_record(p, v, hi);
            maps_cached(p);
            done++;
        } else if (!limit || m < limit / 2) { /* never more than the cache keeps */
            missing[m++] = p;
        }
    }
    for (uint64_t i = 0; i < m; i++)
        if (cache_peek(missing[i])) cache_evict(missing[i], 0); /* cached, but another version */
    if (m) done += fetch_missing(missing, m, E, FETCH_PREFETCH);
    pthread_mutex_unlock(&F.lock);
    free(missing);
    return done;
}

/* Prefetch of the OS pages a task reads (sorted, unique OS page numbers of the arena):
 * on the driver's host each is mapped in place alone, one page-table entry per looked-up
 * row instead of a fault each; a page that needs a copy, or any page on a copying worker,
 * goes through fetch_prefetch whole. Returns how many arena pages are resident. */
uint64_t fetch_prefetch_pieces(const uint64_t *pieces, uint64_t n) {
    const uint64_t os_page = (uint64_t)sysconf(_SC_PAGESIZE), per = F.ps / os_page;
    uint64_t *whole = malloc(n * sizeof *whole), k = 0, done = 0, last = UINT64_MAX;
    if (!whole) return 0;
    uint32_t E = rs_epoch();
    for (uint64_t i = 0, j; i < n; i = j) {
        uint64_t p = pieces[i] / per;
        for (j = i + 1; j < n && pieces[j] == pieces[j - 1] + 1 && pieces[j] / per == p;) j++;
        if (p >= F.npages) break;
        if (maps_has_pieces(pieces[i], j - i)) { /* mapped in place already */
            if (p != last) done++, last = p;
            continue;
        }
        if (maps_zero_copy()) {
            maps_mark_touched(p);
            uint64_t at = (uint64_t)(uintptr_t)maps_base() + pieces[i] * os_page;
            if (maps_direct(p, E, at, (j - i) * os_page) == 0) {
                if (p != last) ADD(prefetched_pages, 1), done++, last = p;
                continue;
            }
        }
        if (!k || whole[k - 1] != p) whole[k++] = p;
    }
    if (k) done += fetch_prefetch(whole, k);
    free(whole);
    return done;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int64_t fetch_prefetch_rows(uint64_t start, int64_t stride, uint64_t row_bytes, const int64_t *rows, uint64_t n,
                            int64_t axis_len) {
    const uint64_t os_page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t unit = row_bytes <= os_page && os_page < F.ps ? os_page : F.ps;
    uint64_t cap = 2 * n + 16, k = 0, *units = malloc(cap * sizeof *units);
    if (!units) return 0;
    for (uint64_t i = 0; i < n; i++) {
        int64_t r = rows[i] < 0 ? rows[i] + axis_len : rows[i];
        if (r < 0 || r >= axis_len) {
            free(units);
            return -1;
        }
        uint64_t at = (uint64_t)((int64_t)start + r * stride);
        for (uint64_t u = at / unit, last = (at + row_bytes - 1) / unit; u <= last; u++) {
            if (k == cap) {
                uint64_t *more = realloc(units, 2 * cap * sizeof *units);
                if (!more) break;
                units = more, cap *= 2;
            }
            units[k++] = u;
        }
    }
    qsort(units, k, sizeof *units, cmp_u64);
    uint64_t m = 0;
    for (uint64_t i = 0; i < k; i++)
        if (!m || units[i] != units[m - 1]) units[m++] = units[i];
    uint64_t done = !m ? 0 : unit == F.ps ? fetch_prefetch(units, m) : fetch_prefetch_pieces(units, m);
    free(units);
    return (int64_t)done;
}

/* ---------------------------------------------------------------- rows -- */

/* One CL_ROWS exchange: k rows (within the protocol's limits) into out. 0, or the
 * driver's cl_error code; a broken connection is made again, five times at most. */
static int rows_request(const uint64_t *offsets, uint64_t k, uint64_t row_bytes, uint32_t E, uint8_t *out) {
    for (int io_errors = 0;;) {
        int fd = conn_driver(offsets[0] / F.ps);
        cl_msg g = cl_make(CL_ROWS, 0, E, (uint32_t)k), m;
        g.aux2 = (uint32_t)row_bytes;
        g.length = 8 * k;
        if (cl_send_msg(fd, &g, offsets) || cl_recv_msg(fd, &m)) goto io_error;
        if (m.type == CL_ERROR) {
            if (m.aux != CL_ERR_NO_VERSION && m.aux != CL_ERR_PAGE_RANGE) conn_reset_driver(); /* it hung up */
            return m.aux ? (int)m.aux : CL_ERR_BAD_REQUEST;
        }
        if (m.type != CL_ROWS || m.aux != k || m.length != k * row_bytes || cl_recv_all(fd, out, k * row_bytes))
            goto io_error;
        return 0;
    io_error:
        conn_reset_driver();
        if (++io_errors == 5) die(EXIT_DRIVER_UNREACHABLE, "lost the connection to the driver", offsets[0] / F.ps);
    }
}

/* Whether pages [first, last] all show a version epoch E reads in the driver's memory:
 * sealed at or before E and not written since (their state words). */
static int shm_current(uint64_t first, uint64_t last, uint32_t E) {
    for (uint64_t p = first; p <= last; p++)
        if (!shm_serves(conn_shm_state(p), E)) return 0;
    return 1;
}

/* How many rows ahead gather_shm starts the cache misses of a row (its state word, its
 * bytes, its page's request counter). */
#define GATHER_AHEAD 8

/* On the driver's host: copies the rows whose pages the driver's memory shows at epoch E
 * straight from it, checking their state words before and after (a seqlock: the driver
 * marks a page dirty before a write lands, and a new version is a newer epoch than E).
 * The indices of the rows it could not copy go into `missed`; how many. */
static uint64_t gather_shm(const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint32_t E, uint8_t *out,
                           uint64_t *missed) {
    const uint8_t *view = conn_shm_view();
    uint64_t m = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i + GATHER_AHEAD < n) { /* rows lie far apart: start the misses of one further on */
            uint64_t ahead = offsets[i + GATHER_AHEAD];
            conn_shm_prefetch(ahead / F.ps);
            maps_prefetch_count(ahead / F.ps);
            __builtin_prefetch(view + ahead, 0);
        }
        uint64_t first = offsets[i] / F.ps, last = (offsets[i] + row_bytes - 1) / F.ps;
        int ok = shm_current(first, last, E);
        if (ok) {
            memcpy(out + i * row_bytes, view + offsets[i], row_bytes);
            atomic_thread_fence(memory_order_acquire);
            ok = shm_current(first, last, E);
        }
        if (!ok) missed[m++] = i;
        else
            for (uint64_t p = first; p <= last; p++) maps_count_read(p); /* the heat map's request */
    }
    return m;
}

/* Asks the driver for rows `idx` (indices into offsets, n of them) and puts each in its
 * place in `out`. 0, or the driver's cl_error code. Fetch lock held. */
static int gather_driver(const uint64_t *offsets, const uint64_t *idx, uint64_t n, uint64_t row_bytes, uint32_t E,
                         uint8_t *out) {
    uint64_t per = CL_MAX_ROWS_BYTES / row_bytes < CL_MAX_ROWS ? CL_MAX_ROWS_BYTES / row_bytes : CL_MAX_ROWS;
    uint64_t chunk = n < per ? n : per, *at = idx ? malloc(chunk * sizeof *at) : NULL;
    uint8_t *rows = idx ? malloc(chunk * row_bytes) : NULL;
    int rc = idx && (!at || !rows) ? -1 : 0;
    for (uint64_t done = 0; done < n && !rc; done += chunk) {
        uint64_t k = n - done < chunk ? n - done : chunk;
        if (!idx) {
            rc = rows_request(offsets + done, k, row_bytes, E, out + done * row_bytes);
            continue;
        }
        for (uint64_t j = 0; j < k; j++) at[j] = offsets[idx[done + j]];
        rc = rows_request(at, k, row_bytes, E, rows);
        for (uint64_t j = 0; !rc && j < k; j++) memcpy(out + idx[done + j] * row_bytes, rows + j * row_bytes, row_bytes);
    }
    if (!rc) ADD(rows_from_driver, n);
    free(at);
    free(rows);
    return rc;
}

int fetch_gather(const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint8_t *out) {
    if (rs_exact() || !row_bytes || row_bytes > CL_MAX_ROWS_BYTES) return -1;
    const uint64_t arena = F.npages * F.ps;
    for (uint64_t i = 0; i < n; i++)
        if (offsets[i] > arena || row_bytes > arena - offsets[i]) return -2;
    uint32_t E = rs_epoch();
    uint64_t *missed = NULL, m = n;
    if (conn_shm_view()) { /* the driver's host: from its memory, what it shows at E */
        missed = malloc(n * sizeof *missed);
        if (!missed) return -1;
        m = gather_shm(offsets, n, row_bytes, E, out, missed);
    }
    int rc = 0;
    if (m) { /* the rest (all of them on another host) from the driver */
        pthread_mutex_lock(&F.lock);
        rc = gather_driver(offsets, missed, m, row_bytes, E, out);
        pthread_mutex_unlock(&F.lock);
    }
    free(missed);
    if (rc) return rc;
    rs_record_rows(offsets, n, row_bytes, F.ps);
    ADD(rows_gathered, n), ADD(shm_row_bytes, (n - m) * row_bytes);
    return 0;
}
