/* The driver pager's page versions: write traps, parked chunks, stage starts and the
 * version log (how it works: driver_pager.c's opening comment, write_tracking.h). */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "driver_state.h"

#define STOPPED_WAIT_MS 100

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
    D.marked += n;
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

/* Page p's first write since its version was sealed (stripe lock held, then the page
 * unprotected by the caller): keeps the old bytes where a stage or lineage needs them. */
static void first_write(uint64_t p) {
    int fresh = (D.flags[p] & FL_PROTECTED) && !(D.flags[p] & FL_DIRTY);
    if (fresh && no_version_needed()) {
        D.wrote_uncopied = 1;
        D.flags[p] |= FL_WRITTEN;
        ADD(uncopied_writes, 1);
    } else if (fresh) {
        logent *e = malloc(sizeof *e + D.ps);
        if (!e) {
            cl_log("out of memory copying page %llu into the version log", (unsigned long long)p);
            abort();
        }
        e->version = D.version[p], e->valid_until = CL_OPEN_ENDED;
        memcpy(e->data, D.view + p * D.ps, D.ps);
        e->next = D.log[p];
        D.log[p] = e;
        D.flags[p] |= FL_DIRTY;
        atomic_store_explicit(&D.state[p], ((uint64_t)D.version[p] << 1) | 1, memory_order_release);
        /* Between stages no task is reading: the pages written are invalidated on the
         * workers before the next stage's tasks run (begin_stage lists them), so only a
         * write during a running stage needs the shoot-down. The stage lock held here
         * orders this test with begin_stage. */
        if (__atomic_load_n(&D.st.stage_running, __ATOMIC_ACQUIRE)) shoot_down(p);
        ADD(cow_copies, 1);
        ADD(version_log_bytes, D.ps);
        ADD(version_log_entries, 1);
    }
    D.flags[p] &= ~FL_PROTECTED;
}

/* A trapped write to a protected page (stage lock held). Where no old version is
 * needed, the page's chunk goes over to async tracking (no more traps there until the
 * next stage): a parked chunk by moving its tables back, a trapping one by switching.
 * Else, or where the kernel lacks async write-protect, first_write. */
static void on_write_fault(uint64_t p) {
    pthread_mutex_t *m = cl_stripe(&D.stripes, p);
    uint64_t c = D.wt ? cl_wtrack_chunk_of(D.wt, p) : 0;
    if (D.wt && cl_wtrack_is_async(D.wt, c)) {
        mark_written(p, 1); /* a trap from before the switch, whose unregister woke the writer */
        return;
    }
    pthread_mutex_lock(m);
    int fresh = (D.flags[p] & FL_PROTECTED) && !(D.flags[p] & FL_DIRTY);
    pthread_mutex_unlock(m);
    if (fresh && no_version_needed() && D.wt) {
        ADD(async_switches, 1); /* counted before the switch wakes the writer (it may read the stats) */
        D.wrote_uncopied = 1;
        if (cl_wtrack_is_parked(D.wt, c) ? cl_wtrack_unpark(D.wt, c) == 0
                                         : cl_wtrack_to_async(D.wt, c, high_water_pages(), mark_written) == 0) {
            mark_written(p, 1);
            return;
        }
        __atomic_fetch_sub(&D.st.async_switches, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(m);
    first_write(p);
    write_protect(p, 1, 0); /* also wakes the writer */
    pthread_mutex_unlock(m);
}

/* A touch of a parked chunk at `addr` (a MISSING or MINOR fault; stage lock held). Where
 * no old version is needed, the chunk is unparked whole. Else only the touched OS page is
 * mapped into it (UFFDIO_CONTINUE; its arena page's other OS pages fault on their own),
 * write-protected unless this first write unprotects its arena page. */
static void on_parked_fault(uint64_t addr, int write) {
    const uint64_t os_page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t off = (addr & ~(os_page - 1)) - (uint64_t)(uintptr_t)D.base, p = off / D.ps;
    struct uffdio_range page = {(uint64_t)(uintptr_t)D.base + off, os_page};
    uint64_t c = D.wt ? cl_wtrack_chunk_of(D.wt, p) : 0;
    if (!D.wt || !cl_wtrack_is_parked(D.wt, c)) { /* unparked since the fault: that woke it, or this does */
        ioctl(D.uffd, UFFDIO_WAKE, &page);
        return;
    }
    if (no_version_needed()) {
        ADD(unparks, 1); /* counted before the unpark wakes the faulting thread (it may read the stats) */
        if (cl_wtrack_unpark(D.wt, c) == 0) {
            D.wrote_uncopied |= write; /* a read leaves the chunk async, unwritten: see retain */
            return;
        }
        __atomic_fetch_sub(&D.st.unparks, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_t *m = cl_stripe(&D.stripes, p);
    pthread_mutex_lock(m);
    (void)*(volatile const uint8_t *)(D.view + off); /* an OS page never written comes to be */
    if (write) first_write(p);
    struct uffdio_continue cont = {.range = page, .mode = (D.flags[p] & FL_PROTECTED) ? UFFDIO_CONTINUE_MODE_WP : 0};
    ADD(parked_faults, 1); /* before the mapping wakes the faulting thread */
    int rc;
    while ((rc = ioctl(D.uffd, UFFDIO_CONTINUE, &cont)) && errno == EAGAIN) /* the mappings are changing */
        cont.mapped = 0;
    if (rc && errno == EEXIST) ioctl(D.uffd, UFFDIO_WAKE, &page); /* another fault mapped it */
    else if (rc) {
        cl_log("cannot map page %llu of a parked chunk: %s", (unsigned long long)p, strerror(errno));
        abort(); /* the faulting thread would wait forever */
    }
    pthread_mutex_unlock(m);
}

/* A fault reported by the trapping userfaultfd: a write to a protected page, or a
 * touch of a parked chunk. */
static void on_fault(const struct uffd_msg *msg) {
    uint64_t p = (msg->arg.pagefault.address - (uint64_t)(uintptr_t)D.base) / D.ps;
    if (p >= D.npages) return;
    pthread_mutex_lock(&D.stage);
    if (msg->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) on_write_fault(p);
    else on_parked_fault(msg->arg.pagefault.address, !!(msg->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE));
    pthread_mutex_unlock(&D.stage);
}

void *cl_driver_fault_main(void *arg) {
    (void)arg;
    struct pollfd fds[2] = {{D.uffd, POLLIN, 0}, {D.stop_efd, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
        if (fds[1].revents) break;
        struct uffd_msg msgs[16];
        ssize_t n = read(D.uffd, msgs, sizeof msgs);
        if (n <= 0) continue;
        for (ssize_t i = 0; i < n / (ssize_t)sizeof msgs[0]; i++)
            if (msgs[i].event == UFFD_EVENT_PAGEFAULT) on_fault(&msgs[i]);
    }
    return NULL;
}

/* Chunks under async tracking are parked (or, where that fails, go back to traps);
 * what was written in them, and every page unprotected before, is marked written.
 * Their pages below hw are protected now. */
static void end_async_tracking(uint64_t hw) {
    if (!D.wt) return;
    for (uint64_t c = 0; c < cl_wtrack_chunks(D.wt); c++) {
        if (!cl_wtrack_is_async(D.wt, c)) continue;
        if (cl_wtrack_park(D.wt, c, mark_written) == 0) ADD(parks, 1);
        else cl_wtrack_to_sync(D.wt, c, hw, mark_written);
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
    /* Workers that copy pages are told of the written pages they hold (the directory);
     * same-host workers keep pages mapped in place across stages, which show the new
     * bytes under the old version, so they are told of every written page. */
    const int same_host = D.zap && cl_zap_slots(D.zap) > 0;
    for (uint64_t p = 0; p < hw; p++) {
        if (!written(p)) continue;
        pthread_mutex_t *m = cl_stripe(&D.stripes, p);
        pthread_mutex_lock(m);
        if (D.flags[p] & FL_WRITTEN) ADD(pages_written, 1);
        if ((D.flags[p] & FL_DIRTY) && D.log[p]) D.log[p]->valid_until = E - 1;
        if (cl_dir_count(&D.dir, p) || (same_host && D.version[p])) { /* a page never sealed was never mapped */
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
        if (E <= atomic_load(&D.released) && !D.wrote_uncopied) {
            /* Chunks a read unparked are async: writes there from now on must trap, and
             * one written meanwhile means an uncopied write after all. */
            uint64_t before = D.marked;
            end_async_tracking(high_water_pages());
            D.wrote_uncopied = D.marked != before;
        }
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
