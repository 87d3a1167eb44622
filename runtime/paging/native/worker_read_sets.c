/* Read sets for the worker pager (worker_read_sets.h).
 *
 * Resident mode (the default): mappings stay across tasks and stages while their
 * versions serve the task's epoch, so a repeated stage faults no more than plain
 * shared memory; a page the driver wrote between stages stays mapped and advances to
 * its new version before the next stage (clamor_worker_invalidate: its mapping shows
 * the driver's bytes), and a write during a stage is shot down. A task's
 * read set is the resident set: every page mapped since the range was last unmapped
 * whole, at its version, a superset of what the task touched.
 *
 * Exact mode: at task start every mapping is zapped while the cache stays, so the
 * first touch of a cached page raises a cheap MINOR fault: the per-task read set is
 * recorded exactly.
 *
 * What a task start and an invalidation unmap is the fault handler's file's
 * (worker_pager.c), which tells this one. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "clamor.h"
#include "protocol.h"
#include "worker_read_sets.h"

static struct {
    _Atomic uint32_t epoch, task_seq; /* the running task's epoch, and its number */
    uint32_t *readmark;        /* per page: the task_seq of the task that last recorded it */
    int exact;                 /* exact read sets: every task starts with the range unmapped */
    pthread_mutex_t lock;      /* the read sets below, against end_task */
    uint64_t *pages, n, cap;   /* exact mode: this task's pages, as first touched */
    uint32_t *vers;
    uint32_t *res_ver1;        /* resident mode: version + 1 of each page resident since the last unmap_all */
    uint64_t res_n, res_gen;   /* how many; bumped at every change */
    uint64_t res_end;          /* every resident page is below it */
    uint64_t npages;
    uint32_t res_lo, res_hi;   /* the epochs every resident page serves: [newest version, earliest valid-until] */
    uint64_t *gathered;        /* resident mode: a bit per page clamor.gather read rows of since the last
                                  unmap_all (not mapped: its version is the driver's at the task's epoch) */
} R;

int rs_init(uint64_t npages) {
    memset(&R, 0, sizeof R);
    pthread_mutex_init(&R.lock, NULL);
    R.res_hi = CL_OPEN_ENDED;
    R.npages = npages;
    R.readmark = calloc(npages, sizeof *R.readmark);
    R.res_ver1 = calloc(npages, sizeof *R.res_ver1);
    R.gathered = calloc((npages + 63) / 64, sizeof *R.gathered);
    return R.readmark && R.res_ver1 && R.gathered ? 0 : -1;
}

uint32_t rs_epoch(void) { return atomic_load(&R.epoch); }
int rs_exact(void) { return R.exact; }
int rs_seen_by_task(uint64_t p) { return R.readmark[p] == atomic_load(&R.task_seq); }
uint32_t rs_resident(uint64_t p) { return R.res_ver1[p]; }

void rs_record(uint64_t p, uint32_t v, uint32_t hi) {
    uint32_t seq = atomic_load(&R.task_seq);
    if (R.readmark[p] == seq && (R.exact || R.res_ver1[p] == v + 1)) return;
    R.readmark[p] = seq;
    pthread_mutex_lock(&R.lock);
    if (!R.exact) {
        if (R.res_ver1[p] != v + 1) {
            R.res_n += !R.res_ver1[p];
            R.res_ver1[p] = v + 1;
            R.res_gen++;
            if (p + 1 > R.res_end) R.res_end = p + 1;
        }
        if (v > R.res_lo) R.res_lo = v;
        if (hi < R.res_hi) R.res_hi = hi;
    } else {
        if (R.n == R.cap) {
            R.cap = R.cap ? 2 * R.cap : 1024;
            R.pages = realloc(R.pages, R.cap * sizeof *R.pages);
            R.vers = realloc(R.vers, R.cap * sizeof *R.vers);
        }
        R.pages[R.n] = p;
        R.vers[R.n++] = v;
    }
    pthread_mutex_unlock(&R.lock);
}

void rs_record_rows(const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint64_t ps) {
    pthread_mutex_lock(&R.lock);
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t p = offsets[i] / ps, last = (offsets[i] + row_bytes - 1) / ps; p <= last; p++) {
            uint64_t bit = 1ull << (p % 64);
            if (R.gathered[p / 64] & bit) continue;
            R.gathered[p / 64] |= bit;
            R.res_gen++;
            if (p + 1 > R.res_end) R.res_end = p + 1;
        }
    pthread_mutex_unlock(&R.lock);
}

void rs_unrecord(uint64_t p) {
    pthread_mutex_lock(&R.lock);
    if (R.res_ver1[p]) {
        R.res_ver1[p] = 0;
        R.res_n--;
        R.res_gen++;
    }
    pthread_mutex_unlock(&R.lock);
}

int rs_advance(uint64_t p, uint32_t v) {
    pthread_mutex_lock(&R.lock);
    int ok = !R.exact && R.res_ver1[p];
    if (ok && R.res_ver1[p] != v + 1) {
        R.res_ver1[p] = v + 1;
        R.res_gen++;
        if (v > R.res_lo) R.res_lo = v; /* an older epoch is no longer served */
    }
    pthread_mutex_unlock(&R.lock);
    return ok ? 0 : -1;
}

void clamor_worker_set_exact_read_sets(int exact) { R.exact = exact; }

/* Resident mode keeps every mapping while the resident pages serve `epoch` (none newer
 * than it, none valid only before it): the driver's writes since were invalidated page
 * by page before the stage started (clamor_worker_invalidate), and a write during the
 * stage is shot down. A replay at an older epoch, or the first task after one, unmaps
 * everything instead. */
int rs_begin_task(uint32_t epoch) {
    atomic_store(&R.epoch, epoch);
    atomic_fetch_add(&R.task_seq, 1);
    pthread_mutex_lock(&R.lock);
    R.n = 0;
    int keep = !R.exact && R.res_lo <= epoch && epoch <= R.res_hi;
    pthread_mutex_unlock(&R.lock);
    return keep;
}

void rs_clear_resident(void) {
    pthread_mutex_lock(&R.lock);
    if (!R.exact) {
        memset(R.res_ver1, 0, R.res_end * sizeof *R.res_ver1);
        memset(R.gathered, 0, (R.res_end + 63) / 64 * sizeof *R.gathered);
        R.res_n = 0, R.res_gen++, R.res_end = 0;
        R.res_lo = 0, R.res_hi = CL_OPEN_ENDED;
    }
    pthread_mutex_unlock(&R.lock);
}

uint64_t clamor_worker_end_task(uint64_t *pages, uint32_t *versions, uint64_t cap) {
    pthread_mutex_lock(&R.lock);
    uint64_t n = R.exact ? R.n : 0, k = n < cap ? n : cap;
    if (k) {
        memcpy(pages, R.pages, k * sizeof *pages);
        memcpy(versions, R.vers, k * sizeof *versions);
    }
    pthread_mutex_unlock(&R.lock);
    return n;
}

/* Whether a page of [lo, hi) is resident, or was gathered from (lock held). */
static int block_resident(uint64_t lo, uint64_t hi) {
    for (uint64_t p = lo; p < hi && p < R.res_end; p++)
        if (R.res_ver1[p] || (R.gathered[p / 64] >> (p % 64) & 1)) return 1;
    return 0;
}

int64_t clamor_worker_resident_runs(uint64_t block, uint64_t *runs, uint64_t cap) {
    if (!block) block = 1;
    pthread_mutex_lock(&R.lock);
    int64_t n = R.exact ? -1 : 0;
    uint64_t first = 0, end = 0; /* the run being built, [first, end); none while end == 0 */
    for (uint64_t lo = 0; n >= 0 && lo < R.res_end; lo += block) {
        uint64_t hi = lo + block < R.npages ? lo + block : R.npages;
        if (!block_resident(lo, hi)) continue;
        if (end && lo == end && hi - first <= UINT32_MAX) {
            end = hi;
            continue;
        }
        if (end && (uint64_t)n < cap) runs[2 * n] = first, runs[2 * n + 1] = end - first;
        n += end != 0;
        first = lo, end = hi;
    }
    if (n >= 0 && end) {
        if ((uint64_t)n < cap) runs[2 * n] = first, runs[2 * n + 1] = end - first;
        n++;
    }
    pthread_mutex_unlock(&R.lock);
    return n;
}

uint64_t clamor_worker_read_set_generation(void) {
    pthread_mutex_lock(&R.lock);
    uint64_t g = R.exact ? 0 : R.res_gen;
    pthread_mutex_unlock(&R.lock);
    return g;
}
