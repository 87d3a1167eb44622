/* Read sets for the worker pager (worker_pager.c), and what stays mapped between tasks.
 *
 * Resident mode (the default): mappings stay across tasks and stages while their
 * versions serve the task's epoch, so a repeated stage faults no more than plain
 * shared memory; pages the driver wrote are unmapped page by page before the next
 * stage (clamor_worker_invalidate), and a write during a stage is shot down. A task's
 * read set is the resident set: every page mapped since the range was last unmapped
 * whole, at its version, a superset of what the task touched.
 *
 * Exact mode: at task start every mapping is zapped while the cache stays, so the
 * first touch of a cached page raises a cheap MINOR fault: the per-task read set is
 * recorded exactly. */

#include "worker_pager.h"

void record(uint64_t p, uint32_t v, uint32_t hi) {
    uint32_t seq = atomic_load(&W.task_seq);
    if (W.readmark[p] == seq && (W.exact || W.res_ver1[p] == v + 1)) return;
    W.readmark[p] = seq;
    pthread_mutex_lock(&W.rs_lock);
    if (!W.exact) {
        if (W.res_ver1[p] != v + 1) {
            W.res_n += !W.res_ver1[p];
            W.res_ver1[p] = v + 1;
            W.res_gen++;
        }
        if (v > W.res_lo) W.res_lo = v;
        if (hi < W.res_hi) W.res_hi = hi;
    } else {
        if (W.rs_n == W.rs_cap) {
            W.rs_cap = W.rs_cap ? 2 * W.rs_cap : 1024;
            W.rs_pages = realloc(W.rs_pages, W.rs_cap * sizeof *W.rs_pages);
            W.rs_vers = realloc(W.rs_vers, W.rs_cap * sizeof *W.rs_vers);
        }
        W.rs_pages[W.rs_n] = p;
        W.rs_vers[W.rs_n++] = v;
    }
    pthread_mutex_unlock(&W.rs_lock);
}

/* Resident mode: page p leaves the resident set (its version is no longer current). */
static void unrecord(uint64_t p) {
    pthread_mutex_lock(&W.rs_lock);
    if (W.res_ver1[p]) {
        W.res_ver1[p] = 0;
        W.res_n--;
        W.res_gen++;
    }
    pthread_mutex_unlock(&W.rs_lock);
}

void clamor_worker_set_exact_read_sets(int exact) { W.exact = exact; }

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
    pthread_mutex_lock(&W.rs_lock);
    if (!W.exact) {
        memset(W.res_ver1, 0, touched * sizeof *W.res_ver1);
        W.res_n = 0, W.res_gen++;
        W.res_lo = 0, W.res_hi = CL_OPEN_ENDED;
    }
    pthread_mutex_unlock(&W.rs_lock);
    ADD(unmap_all, 1);
}

/* A task at `epoch` starts. Exact mode unmaps everything, so that the task's first touch
 * of each page faults and is recorded. Resident mode keeps every mapping while the
 * resident pages serve `epoch` (none newer than it, none valid only before it): the
 * driver's writes since were invalidated page by page before the stage started
 * (clamor_worker_invalidate), and a write during the stage is shot down. A replay at an
 * older epoch, or the first task after one, unmaps everything instead. */
void clamor_worker_begin_task(uint32_t epoch) {
    atomic_store(&W.epoch, epoch);
    atomic_fetch_add(&W.task_seq, 1);
    atomic_store(&W.last_direct, UINT64_MAX); /* a task's scans are its own */
    pthread_mutex_lock(&W.rs_lock);
    W.rs_n = 0;
    int keep = !W.exact && W.res_lo <= epoch && epoch <= W.res_hi;
    pthread_mutex_unlock(&W.rs_lock);
    if (!keep) unmap_all();
}

uint64_t clamor_worker_end_task(uint64_t *pages, uint32_t *versions, uint64_t cap) {
    pthread_mutex_lock(&W.rs_lock);
    uint64_t n = W.exact ? W.rs_n : W.res_n, k = n < cap ? n : cap;
    if (k && W.exact) {
        memcpy(pages, W.rs_pages, k * sizeof *pages);
        memcpy(versions, W.rs_vers, k * sizeof *versions);
    } else if (k) {
        uint64_t touched = atomic_load(&W.touched), i = 0;
        for (uint64_t p = 0; p < touched && i < k; p++)
            if (W.res_ver1[p]) pages[i] = p, versions[i++] = W.res_ver1[p] - 1;
    }
    pthread_mutex_unlock(&W.rs_lock);
    return n;
}

uint64_t clamor_worker_read_set_generation(void) {
    pthread_mutex_lock(&W.rs_lock);
    uint64_t g = W.exact ? 0 : W.res_gen;
    pthread_mutex_unlock(&W.rs_lock);
    return g;
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
        if (W.cver1[p]) dropped |= evict(p, 0); /* the driver cleared its holder bits itself */
        if (!W.exact) unrecord(p);
        if (dropped) ADD(invalidations, 1);
    }
    if (W.zero_copy) pthread_mutex_unlock(&W.map_lock);
}
