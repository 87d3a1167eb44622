/* The driver's page table (driver_pages.h): versions, the version log, the directory
 * and the per-page counters, and the page server's answers from them. How versions
 * work: driver_pager.c's opening comment. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clamor.h"
#include "directory.h"
#include "driver_base.h"
#include "driver_map_ahead.h"
#include "driver_pages.h"
#include "driver_zap.h"
#include "pager_common.h"

typedef struct logent {
    uint32_t version, valid_until;
    struct logent *next;
    uint8_t data[];
} logent;

static struct {
    uint64_t ps, npages;
    const uint8_t *view; /* the arena's memfd mapped again, read-only and untracked: the page server
                            and the version log read here, never faulting on a parked chunk */
    uint8_t *rw;         /* and writable, untracked: clamor_driver_write_rows writes here */
    int state_fd;
    _Atomic uint64_t *state; /* version << 1 | dirty; read by same-host workers */
    uint32_t *version;
    uint8_t *flags;
    logent **log;        /* per page: its sealed older versions, newest first */
    cl_dir dir;          /* which workers hold each page (directory.h) */
    uint64_t *requests, *driver_bytes, *peer_bytes;
    cl_stripes stripes;  /* the page locks */
    _Atomic uint32_t epoch;
    _Atomic uint32_t floor; /* epochs below it are no longer served: their versions were freed */
    uint64_t *inval, ninval, inval_cap; /* what the last stage start invalidated */
    uint64_t *sealed, nsealed, sealed_cap; /* every page whose version it changed */
    int sealed_lost;                       /* ... not all listed (out of memory) */
    _Atomic int shm_copies; /* a worker copies pages from the memfd: its notices come late */
} T = {.state_fd = -1};

int pages_init(uint64_t ps, uint64_t npages, char *err, size_t errlen) {
    memset(&T, 0, sizeof T);
    T.state_fd = -1;
    T.ps = ps, T.npages = npages;
    cl_stripes_init(&T.stripes);
    T.version = calloc(npages, sizeof *T.version);
    T.flags = calloc(npages, 1);
    clamor_driver_stats *st = driver_stats();
    int dir_ok = cl_dir_init(&T.dir, npages, &st->directory_bytes, &st->holder_bitmaps) == 0;
    T.requests = calloc(npages, sizeof *T.requests);
    T.driver_bytes = calloc(npages, sizeof *T.driver_bytes);
    T.peer_bytes = calloc(npages, sizeof *T.peer_bytes);
    T.log = calloc(npages, sizeof *T.log);
    if (!T.version || !T.flags || !dir_ok || !T.requests || !T.driver_bytes || !T.peer_bytes || !T.log)
        return CL_ERR("out of memory for the page tables of %llu pages", (unsigned long long)npages);
    T.state_fd = memfd_create("clamor-page-state", MFD_CLOEXEC);
    if (T.state_fd < 0 || ftruncate(T.state_fd, (off_t)(npages * sizeof *T.state)))
        return CL_ERR("cannot create the page state table: %s", strerror(errno));
    T.state = mmap(NULL, npages * sizeof *T.state, PROT_READ | PROT_WRITE, MAP_SHARED, T.state_fd, 0);
    if (T.state == MAP_FAILED) {
        T.state = NULL;
        return CL_ERR("cannot map the page state table: %s", strerror(errno));
    }
    T.view = mmap(NULL, npages * ps, PROT_READ, MAP_SHARED, clamor_arena_fd(), 0);
    if (T.view == MAP_FAILED) {
        T.view = NULL;
        return CL_ERR("cannot map the arena for the page server: %s", strerror(errno));
    }
    T.rw = mmap(NULL, npages * ps, PROT_READ | PROT_WRITE, MAP_SHARED, clamor_arena_fd(), 0);
    if (T.rw == MAP_FAILED) {
        T.rw = NULL;
        return CL_ERR("cannot map the arena for untracked writes: %s", strerror(errno));
    }
    return map_ahead_init(T.view, T.rw, npages * ps, err, errlen);
}

void pages_free(void) {
    map_ahead_free(); /* before T.view and T.rw go */
    if (T.log)
        for (uint64_t p = 0; p < T.npages; p++)
            for (logent *e = T.log[p], *next; e; e = next) next = e->next, free(e);
    cl_dir_free(&T.dir);
    free(T.log), free(T.version), free(T.flags), free(T.requests);
    free(T.driver_bytes), free(T.peer_bytes), free(T.inval), free(T.sealed);
    if (T.state) munmap((void *)T.state, T.npages * sizeof *T.state);
    if (T.state_fd >= 0) close(T.state_fd);
    if (T.view) munmap((void *)T.view, T.npages * T.ps);
    if (T.rw) munmap(T.rw, T.npages * T.ps);
    memset(&T, 0, sizeof T);
    T.state_fd = -1;
}

int pages_state_fd(void) { return T.state_fd; }
uint32_t pages_epoch(void) { return atomic_load(&T.epoch); }

int pages_serves(uint32_t E) { return !(E == 0 || E > atomic_load(&T.epoch) || E < atomic_load(&T.floor)); }

void pages_lock(uint64_t p) { pthread_mutex_lock(cl_stripe(&T.stripes, p)); }
void pages_unlock(uint64_t p) { pthread_mutex_unlock(cl_stripe(&T.stripes, p)); }

/* --------------------------------------------------------- page server -- */

/* Where the bytes of page p's latest version <= epoch E lie (NULL: zeros, the page was
 * first handed out after E), with that version and the last epoch it serves. Page lock held. */
static const uint8_t *source_at(uint64_t p, uint32_t E, uint32_t *version, uint32_t *valid_until) {
    uint32_t v = T.version[p];
    if (v <= E) {
        *version = v, *valid_until = CL_OPEN_ENDED;
        return (T.flags[p] & FL_DIRTY) ? T.log[p]->data : T.view + p * T.ps;
    }
    uint32_t older_than = v;
    for (logent *e = T.log[p]; e; e = e->next) {
        if (e->version <= E) {
            *version = e->version, *valid_until = e->valid_until;
            return e->data;
        }
        older_than = e->version;
    }
    *version = 0, *valid_until = older_than - 1;
    return NULL;
}

/* Resolves (page, epoch) to the bytes of the latest version <= epoch. Page lock held. */
static void resolve(uint64_t p, uint32_t E, uint8_t *buf, cl_answer *a) {
    a->kind = CL_ANSWER_PAGE;
    const uint8_t *src = source_at(p, E, &a->version, &a->valid_until);
    if (src) memcpy(buf, src, T.ps);
    else memset(buf, 0, T.ps);
}

void pages_answer(uint32_t client, uint32_t E, uint32_t failed, uint64_t p, int may_redirect,
                  uint8_t *buf, cl_answer *a) {
    pthread_mutex_t *m = cl_stripe(&T.stripes, p);
    pthread_mutex_lock(m);
    T.requests[p]++;
    if (failed && failed <= CL_MAX_WORKERS) cl_dir_failed(&T.dir, p, failed - 1); /* its redirect failed */
    int worker = client < CL_MAX_WORKERS;
    if (T.version[p] <= E && may_redirect && worker && cl_dir_count(&T.dir, p)) {
        int64_t pick = cl_dir_redirect(&T.dir, p, client); /* the client is a holder-to-be now */
        if (pick >= 0) {
            a->kind = CL_ANSWER_REDIRECT;
            a->version = T.version[p];
            a->peer_id = (uint32_t)pick;
            pthread_mutex_unlock(m);
            return;
        }
    }
    resolve(p, E, buf, a);
    if (worker && a->version == T.version[p]) cl_dir_add(&T.dir, p, client);
    T.driver_bytes[p] += T.ps;
    pthread_mutex_unlock(m);
}

void pages_read_rows(uint32_t E, const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint8_t *out) {
    for (uint64_t i = 0; i < n; i++) {
        for (uint64_t at = offsets[i], end = at + row_bytes; at < end;) { /* a row may span pages */
            uint64_t p = at / T.ps, in = at % T.ps, len = T.ps - in < end - at ? T.ps - in : end - at;
            uint32_t v, hi;
            pthread_mutex_t *m = cl_stripe(&T.stripes, p);
            pthread_mutex_lock(m);
            const uint8_t *src = source_at(p, E, &v, &hi);
            if (src) memcpy(out, src + in, len);
            else memset(out, 0, len);
            T.requests[p]++;
            T.driver_bytes[p] += len;
            pthread_mutex_unlock(m);
            out += len, at += len;
        }
    }
}

void pages_have(uint32_t client, const cl_msg *msg) {
    uint64_t p = msg->page;
    pthread_mutex_t *m = cl_stripe(&T.stripes, p);
    pthread_mutex_lock(m);
    if (msg->flags & CL_HAVE_DROPPED) {
        cl_dir_remove(&T.dir, p, client);
        pthread_mutex_unlock(m);
        ADD(evictions_told, 1);
        return;
    }
    if (T.version[p] == msg->epoch) cl_dir_add(&T.dir, p, client); /* ignores ids past the limit */
    if (msg->aux == 0) {
        T.requests[p]++;
        T.driver_bytes[p] += T.ps;
        ADD(shm_bytes, T.ps);
    } else {
        T.peer_bytes[p] += T.ps, ADD(peer_bytes, T.ps);
        cl_dir_served(&T.dir, msg->aux - 1); /* that peer's redirect is done */
    }
    pthread_mutex_unlock(m);
}

void pages_set_live(uint32_t w, int live) { cl_dir_set_live(&T.dir, w, live); }

/* Pages with no holders are skipped unlocked; a page that gains one meanwhile gains a
 * live worker (the caller stopped redirecting to w first, see cl_dir_pick). */
void pages_forget_holder(uint32_t w) {
    uint64_t end = atomic_load(&T.dir.end);
    for (uint64_t p = 0; p < end; p++)
        if (cl_dir_count(&T.dir, p)) {
            pthread_mutex_t *m = cl_stripe(&T.stripes, p);
            pthread_mutex_lock(m);
            cl_dir_remove(&T.dir, p, w);
            pthread_mutex_unlock(m);
        }
}

uint64_t pages_stats(uint64_t first, uint64_t n, uint64_t *requests, uint64_t *driver_bytes,
                     uint64_t *peer_bytes, uint32_t *holders, uint32_t *version) {
    if (first >= T.npages) n = 0;
    else if (n > T.npages - first) n = T.npages - first;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = first + i;
        requests[i] = T.requests[p] + zap_page_maps(p);
        driver_bytes[i] = T.driver_bytes[p];
        peer_bytes[i] = T.peer_bytes[p];
        holders[i] = cl_dir_count(&T.dir, p);
        version[i] = T.version[p];
    }
    return n;
}

uint64_t pages_holders(uint64_t first, uint64_t n, uint32_t *counts, uint16_t *ids, uint64_t cap) {
    uint64_t total = 0, end = first < T.npages ? T.npages - first : 0;
    uint16_t one[CL_MAX_WORKERS];
    for (uint64_t i = 0; i < n; i++) {
        uint32_t k = 0;
        if (i < end) {
            uint64_t p = first + i;
            pthread_mutex_t *m = cl_stripe(&T.stripes, p);
            pthread_mutex_lock(m);
            k = cl_dir_list(&T.dir, p, one);
            pthread_mutex_unlock(m);
        }
        counts[i] = k;
        for (uint32_t j = 0; j < k; j++, total++)
            if (total < cap) ids[total] = one[j];
    }
    return total;
}

int pages_read_version(uint64_t page, uint32_t epoch, uint8_t *out) {
    if (page >= T.npages) return -CL_ERR_PAGE_RANGE;
    if (!pages_serves(epoch)) return -CL_ERR_NO_VERSION;
    cl_answer a;
    pthread_mutex_t *m = cl_stripe(&T.stripes, page);
    pthread_mutex_lock(m);
    resolve(page, epoch, out, &a);
    pthread_mutex_unlock(m);
    return (int)a.version;
}

/* The version page p has at epoch E: the latest sealed version <= E (0: none then). */
static uint32_t version_at(uint64_t p, uint32_t E) {
    uint32_t v = __atomic_load_n(&T.version[p], __ATOMIC_RELAXED);
    if (v <= E) return v; /* the common case: not sealed again since E */
    pthread_mutex_t *m = cl_stripe(&T.stripes, p);
    pthread_mutex_lock(m);
    v = 0;
    for (logent *e = T.log[p]; e; e = e->next)
        if (e->version <= E) {
            v = e->version;
            break;
        }
    pthread_mutex_unlock(m);
    return v;
}

int64_t pages_versions_at(const uint64_t *runs, uint64_t n, uint32_t E, uint32_t *out, uint64_t cap) {
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t first = runs[2 * i], count = runs[2 * i + 1] & 0xffffffffu;
        if (first > T.npages || count > T.npages - first) return -1;
        for (uint64_t p = first; p < first + count; p++, k++)
            if (k < cap) out[k] = version_at(p, E);
    }
    return (int64_t)k;
}

/* ------------------------------------------------------- write handler -- */

int pages_fresh(uint64_t p) { return (T.flags[p] & FL_PROTECTED) && !(T.flags[p] & FL_DIRTY); }
int pages_protected(uint64_t p) { return (T.flags[p] & FL_PROTECTED) != 0; }

int pages_first_write(uint64_t p, int keep_old) {
    int fresh = pages_fresh(p), uncopied = 0;
    if (fresh && !keep_old) {
        uncopied = 1;
        T.flags[p] |= FL_WRITTEN;
        ADD(uncopied_writes, 1);
    } else if (fresh) {
        logent *e = malloc(sizeof *e + T.ps);
        if (!e) {
            cl_log("out of memory copying page %llu into the version log", (unsigned long long)p);
            abort();
        }
        e->version = T.version[p], e->valid_until = CL_OPEN_ENDED;
        memcpy(e->data, T.view + p * T.ps, T.ps);
        e->next = T.log[p];
        T.log[p] = e;
        T.flags[p] |= FL_DIRTY;
        atomic_store_explicit(&T.state[p], ((uint64_t)T.version[p] << 1) | 1, memory_order_release);
        /* Between stages no task is reading: the pages written are invalidated on the
         * workers before the next stage's tasks run (pages_seal lists them), so only a
         * write during a running stage needs the shoot-down. The stage lock, which the
         * caller holds, orders this test with the stage start. */
        if (__atomic_load_n(&driver_stats()->stage_running, __ATOMIC_ACQUIRE)) zap_shoot_down(p);
        ADD(cow_copies, 1);
        ADD(version_log_bytes, T.ps);
        ADD(version_log_entries, 1);
    }
    T.flags[p] &= ~FL_PROTECTED;
    return uncopied;
}

void pages_still_protected(uint64_t p) { T.flags[p] |= FL_PROTECTED; }

void pages_mark_written(uint64_t first, uint64_t n) {
    for (uint64_t p = first; p < first + n && p < T.npages; p++) {
        pthread_mutex_t *m = cl_stripe(&T.stripes, p);
        pthread_mutex_lock(m);
        T.flags[p] |= FL_WRITTEN;
        pthread_mutex_unlock(m);
    }
}

void pages_touch(uint64_t offset) { (void)*(volatile const uint8_t *)(T.view + offset); }

void pages_write(uint64_t offset, const uint8_t *src, uint64_t n) { memcpy(T.rw + offset, src, n); }

/* --------------------------------------------------------- stage start -- */

/* Whether pages p..p+7 (p a multiple of 8, all below hw) are protected and unwritten, their
 * flags FL_PROTECTED alone: a stage start's scans skip such pages 8 at a time. */
static int eight_untouched(uint64_t p) {
    uint64_t w;
    memcpy(&w, T.flags + p, sizeof w);
    return w == 0x0101010101010101ull * FL_PROTECTED;
}

void pages_each_unprotected(uint64_t hw, void (*protect)(uint64_t first, uint64_t n)) {
    for (uint64_t p = 0; p < hw;) {
        if (!(p & 7) && p + 8 <= hw && eight_untouched(p)) { p += 8; continue; }
        if (T.flags[p] & FL_PROTECTED) { p++; continue; }
        uint64_t q = p;
        while (q < hw && !(T.flags[q] & FL_PROTECTED)) q++;
        protect(p, q - p);
        p = q;
    }
}

void pages_reprotect(uint64_t first, uint64_t end) {
    for (uint64_t p = first; p < end; p++) {
        if (!(T.flags[p] & FL_PROTECTED)) T.flags[p] |= FL_WRITTEN;
        T.flags[p] |= FL_PROTECTED;
    }
}

/* Unprotected (a trap let the write through), or written untrapped (async tracking, or
 * clamor_driver_write_rows, which leaves it protected: copied or not). */
static int written(uint64_t p) { return !(T.flags[p] & FL_PROTECTED) || (T.flags[p] & (FL_WRITTEN | FL_DIRTY)); }

void pages_note_shm_copies(void) { atomic_store(&T.shm_copies, 1); }

/* Workers that copy pages are told of the written pages they hold (the directory);
 * same-host workers keep pages mapped in place across stages, which show the new bytes
 * under the old version, so they are told of every written page. So are workers that
 * copy pages from the memfd: such a copy reaches the directory by a notice
 * (CL_HAVE) that may arrive after this stage start, and the copy would stay.
 * seal_page seals one written page at epoch E, listing it to invalidate where so. */
static void seal_page(uint64_t p, uint32_t E, int same_host) {
    pthread_mutex_t *m = cl_stripe(&T.stripes, p);
    pthread_mutex_lock(m);
    if (T.flags[p] & FL_WRITTEN) ADD(pages_written, 1);
    if ((T.flags[p] & FL_DIRTY) && T.log[p]) T.log[p]->valid_until = E - 1;
    if (cl_dir_count(&T.dir, p) || (same_host && T.version[p])) { /* a page never sealed was never mapped */
        if (T.ninval == T.inval_cap) {
            T.inval_cap = T.inval_cap ? 2 * T.inval_cap : 1024;
            T.inval = realloc(T.inval, T.inval_cap * sizeof *T.inval);
        }
        T.inval[T.ninval++] = p;
        cl_dir_clear(&T.dir, p);
    }
    T.version[p] = E;
    T.flags[p] = FL_PROTECTED;
    atomic_store_explicit(&T.state[p], (uint64_t)E << 1, memory_order_release);
    pthread_mutex_unlock(m);
}

/* How many written pages ahead of the one being sealed have their state prefetched. */
#define SEAL_AHEAD 8

void pages_seal(uint32_t E, uint64_t hw, int same_host) {
    same_host = same_host || atomic_load(&T.shm_copies);
    T.ninval = T.nsealed = 0, T.sealed_lost = 0;
    /* The written pages first, in one pass over the flags; then each is sealed with the
     * state of those SEAL_AHEAD further on on its way into the cache. A sparse update (a
     * parameter server's rows) writes pages far apart, each page's state lies in five
     * arrays, and waiting for each of those misses in turn was most of a stage start. */
    for (uint64_t p = 0; p < hw; p++) {
        if (!(p & 7) && p + 8 <= hw && eight_untouched(p)) { p += 7; continue; } /* none written */
        if (!written(p)) continue;
        if (T.nsealed == T.sealed_cap) {
            uint64_t cap = T.sealed_cap ? 2 * T.sealed_cap : 1024, *more = realloc(T.sealed, cap * sizeof *more);
            if (!more) { /* no list: seal them all in one pass (none is sealed yet), unlisted */
                T.sealed_lost = 1;
                for (uint64_t q = 0; q < hw; q++)
                    if (written(q)) seal_page(q, E, same_host);
                goto sealed;
            }
            T.sealed = more, T.sealed_cap = cap;
        }
        T.sealed[T.nsealed++] = p;
    }
    for (uint64_t i = 0; i < T.nsealed; i++) {
        if (i + SEAL_AHEAD < T.nsealed) {
            uint64_t q = T.sealed[i + SEAL_AHEAD];
            __builtin_prefetch(&T.state[q], 1);
            __builtin_prefetch(&T.version[q], 1);
            __builtin_prefetch(&T.log[q], 0);
            __builtin_prefetch(&T.dir.dir[q], 1);
            __builtin_prefetch(cl_stripe(&T.stripes, q), 1);
        }
        seal_page(T.sealed[i], E, same_host);
    }
sealed:
    ADD(invalidations, T.ninval);
    atomic_store(&T.epoch, E);
}

uint64_t pages_sealed(uint64_t *out, uint64_t cap) {
    if (T.sealed_lost) return UINT64_MAX;
    uint64_t n = T.nsealed < cap ? T.nsealed : cap;
    if (out && n) memcpy(out, T.sealed, n * sizeof *out);
    return T.nsealed;
}

uint64_t pages_invalidated(uint64_t *out, uint64_t cap) {
    uint64_t n = T.ninval < cap ? T.ninval : cap;
    if (out && n) memcpy(out, T.inval, n * sizeof *out);
    return T.ninval;
}

/* Walking a page's log newest first: a dirty page's head (its sealed current version)
 * is kept; then every entry newer than floor, and the first one at or below it (what
 * epoch `floor` itself reads). Requests for epochs below the floor get NO_VERSION from
 * now on. */
uint64_t pages_trim_log(uint32_t floor) {
    uint32_t old = atomic_load(&T.floor);
    while (floor > old && !atomic_compare_exchange_weak(&T.floor, &old, floor)) {
    }
    floor = atomic_load(&T.floor);
    uint64_t freed = 0;
    for (uint64_t p = 0; p < T.npages; p++) {
        if (!T.log[p]) continue;
        pthread_mutex_t *m = cl_stripe(&T.stripes, p);
        pthread_mutex_lock(m);
        logent **link = &T.log[p];
        if ((T.flags[p] & FL_DIRTY) && *link) link = &(*link)->next;
        if (T.version[p] > floor) {
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
    __atomic_fetch_sub(&driver_stats()->version_log_bytes, freed * T.ps, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&driver_stats()->version_log_entries, freed, __ATOMIC_RELAXED);
    return freed * T.ps;
}
