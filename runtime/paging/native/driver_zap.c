/* The shoot-down area of same-host zero copy, the driver's side (driver_zap.h). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver_base.h"
#include "driver_zap.h"
#include "pager_common.h"

#define STOPPED_WAIT_MS 100

static struct {
    uint64_t npages;
    int fd;     /* the memfd; -1: none */
    void *area; /* mapped here */
} Z = {.fd = -1};

int zap_init(uint64_t npages, char *err, size_t errlen) {
    Z.npages = npages;
    Z.fd = memfd_create("clamor-page-zap", MFD_CLOEXEC);
    if (Z.fd < 0 || ftruncate(Z.fd, (off_t)cl_zap_area_bytes(npages)))
        return CL_ERR("cannot create the shoot-down area: %s", strerror(errno));
    Z.area = mmap(NULL, cl_zap_area_bytes(npages), PROT_READ | PROT_WRITE, MAP_SHARED, Z.fd, 0);
    if (Z.area == MAP_FAILED) {
        Z.area = NULL;
        return CL_ERR("cannot map the shoot-down area: %s", strerror(errno));
    }
    return 0;
}

void zap_free(void) {
    if (Z.area) munmap(Z.area, cl_zap_area_bytes(Z.npages));
    if (Z.fd >= 0) close(Z.fd);
    Z.area = NULL, Z.fd = -1, Z.npages = 0;
}

int zap_fd(void) { return Z.fd; }

int zap_same_host(void) { return Z.area && cl_zap_slots(Z.area) > 0; }

void zap_forget_worker(int id) {
    if (Z.area) atomic_store(&cl_zap_slot_of(Z.area, id)->pid, 0);
}

uint64_t zap_mapped_pages(void) {
    uint64_t n = 0;
    if (Z.area)
        for (int w = 0, slots = cl_zap_slots(Z.area); w < slots; w++)
            n += atomic_load_explicit(&cl_zap_slot_of(Z.area, w)->maps, memory_order_relaxed);
    return n;
}

uint64_t zap_page_maps(uint64_t p) {
    return Z.area ? atomic_load_explicit(&cl_zap_maps(Z.area, Z.npages)[p], memory_order_relaxed) : 0;
}

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

/* A worker that is stopped (SIGSTOP: Cluster.slow_worker's throttle, a debugger) is
 * continued after STOPPED_WAIT_MS: the writer may be a Python thread holding the GIL,
 * which the throttle's thread needs to continue it. */
void zap_shoot_down(uint64_t p) {
    if (!Z.area) return;
    atomic_thread_fence(memory_order_seq_cst); /* the dirty mark before reading the bits */
    const uint64_t bit = 1ull << (p & 63);
    const int slots = cl_zap_slots(Z.area); /* after the fence too: see pager_common.h */
    int32_t pid[CL_MAX_WORKERS];
    uint32_t want[CL_MAX_WORKERS];
    for (int w = 0; w < slots; w++) { /* ask all of them, then wait */
        cl_zap_slot *z = cl_zap_slot_of(Z.area, w);
        pid[w] = atomic_load(&z->pid);
        if (!pid[w] || !(atomic_load(&cl_zap_bits(Z.area, Z.npages, w)[p >> 6]) & bit)) {
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
        cl_zap_slot *z = cl_zap_slot_of(Z.area, w);
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

