/* Small pieces shared by the driver and worker pagers. */
#ifndef CLAMOR_PAGER_COMMON_H
#define CLAMOR_PAGER_COMMON_H
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "protocol.h"

#define CL_STRIPES 1024

/* Striped locks guard per-page metadata without one lock per page. */
typedef struct { pthread_mutex_t m[CL_STRIPES]; } cl_stripes;

static inline void cl_stripes_init(cl_stripes *s) {
    for (int i = 0; i < CL_STRIPES; i++) pthread_mutex_init(&s->m[i], NULL);
}
static inline pthread_mutex_t *cl_stripe(cl_stripes *s, uint64_t page) {
    return &s->m[page % CL_STRIPES];
}

static inline int cl_is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* What one page-table entry of the level above the pages covers (x86-64, arm64 with
 * 4 KiB pages): mremap moves page tables a table at a time only where both ends are
 * aligned to it, else entry by entry. */
#define CL_PMD_BYTES (2ull << 20)

/* len bytes of reserved (PROT_NONE) address space starting on an `align` boundary (a
 * power of two); MAP_FAILED if there is none. Map over it with MAP_FIXED. */
static inline uint8_t *cl_reserve_aligned(uint64_t len, uint64_t align) {
    uint8_t *r = mmap(NULL, len + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return MAP_FAILED;
    uint8_t *a = (uint8_t *)(((uintptr_t)r + align - 1) & ~(uintptr_t)(align - 1));
    if (a > r) munmap(r, (size_t)(a - r));
    munmap(a + len, (size_t)(r + align - a));
    return a;
}

#define CL_ERR(...) (snprintf(err, errlen, __VA_ARGS__), -1)

/* Opens a userfaultfd with the requested features; -1 and a message on failure. */
int cl_uffd_open(uint64_t features, char *err, size_t errlen);
int cl_uffd_register(int uffd, void *base, uint64_t len, uint64_t mode, char *err, size_t errlen);

/* ---------------------------------------------------- same-host zero copy --
 * Workers on the driver's host map the driver's arena pages instead of copying
 * them. Before the driver's first write to a page during an epoch (its write
 * handler), every same-host worker that maps the page unmaps it ("shoot-down"),
 * so a running task never sees bytes newer than its epoch. The shoot-down area
 * is one memfd of the driver, mapped read-write by the driver and by each
 * same-host worker: a head, CL_MAX_WORKERS slots, then one bitmap per worker
 * slot of the pages it maps from the driver, then a count per page of such
 * mappings. A worker sets a page's bit before it checks the page's state and
 * maps it; the driver marks the page dirty before it reads the bits (both
 * sequentially consistent), so either the worker sees the write coming and
 * copies the old version instead, or the driver sees the bit and waits for the
 * worker to unmap.
 *
 * Sized for CL_MAX_WORKERS slots, paid for by the workers that attach: the memfd
 * is sparse (no memory until a page of it is touched), every bitmap starts on its
 * own OS page, a worker zeroes its bitmap by punching it out of the memfd, and
 * the driver reads only the slots below head.slots. A worker raises head.slots
 * past its id (seq_cst) before it publishes its pid and before it sets any bit;
 * the driver reads head.slots after its dirty mark and fence, so a worker it does
 * not look at set its bit after the dirty mark and sees it (the argument above).
 * A 32 GiB arena of 4 KiB pages thus costs 1 MiB per attached worker and about
 * 64 KiB of slots, not 1 GiB for 1,024 possible workers. */
typedef struct {
    _Atomic uint32_t slots; /* 1 + the highest worker id that ever attached */
    uint8_t pad[60];
} cl_zap_head;

typedef struct {
    _Atomic uint32_t req;  /* futex word: the driver bumps it to ask */
    _Atomic uint32_t ack;  /* futex word: the worker sets it to req when done */
    _Atomic int32_t pid;   /* the attached worker process; 0: none */
    uint32_t unused;
    _Atomic uint64_t page; /* the page to unmap */
    _Atomic uint64_t maps; /* pages this worker mapped from the driver, ever */
    uint8_t pad[32];
} cl_zap_slot;

#define CL_ZAP_ALIGN 4096 /* bitmaps start on their own (4 KiB or larger) OS page */
static inline uint64_t cl_zap_round(uint64_t n) { return (n + CL_ZAP_ALIGN - 1) / CL_ZAP_ALIGN * CL_ZAP_ALIGN; }
static inline uint64_t cl_zap_words(uint64_t npages) { return (npages + 63) / 64; }
/* One worker's bitmap: its offset in the area, and its size rounded to whole pages. */
static inline uint64_t cl_zap_bits_bytes(uint64_t npages) { return cl_zap_round(cl_zap_words(npages) * sizeof(uint64_t)); }
static inline uint64_t cl_zap_bits_offset(uint64_t npages, int worker) {
    return cl_zap_round(sizeof(cl_zap_head) + CL_MAX_WORKERS * sizeof(cl_zap_slot)) + (uint64_t)worker * cl_zap_bits_bytes(npages);
}
static inline uint64_t cl_zap_area_bytes(uint64_t npages) {
    return cl_zap_bits_offset(npages, CL_MAX_WORKERS) + npages * sizeof(uint32_t);
}
static inline cl_zap_head *cl_zap_head_of(void *area) { return (cl_zap_head *)area; }
static inline cl_zap_slot *cl_zap_slot_of(void *area, int worker) {
    return (cl_zap_slot *)((cl_zap_head *)area + 1) + worker;
}
static inline _Atomic uint64_t *cl_zap_bits(void *area, uint64_t npages, int worker) {
    return (_Atomic uint64_t *)((uint8_t *)area + cl_zap_bits_offset(npages, worker));
}
/* Per page: how many times workers mapped it from the driver (the heatmap's
 * requests of zero copy, which sends the driver no message). */
static inline _Atomic uint32_t *cl_zap_maps(void *area, uint64_t npages) {
    return (_Atomic uint32_t *)((uint8_t *)area + cl_zap_bits_offset(npages, CL_MAX_WORKERS));
}
/* The slots the driver looks at: every worker that attached is below it. */
static inline int cl_zap_slots(void *area) {
    uint32_t n = atomic_load(&cl_zap_head_of(area)->slots);
    return n < CL_MAX_WORKERS ? (int)n : CL_MAX_WORKERS;
}

/* futex on a shared (not process-private) word; waits at most timeout_ms. */
static inline void cl_futex_wait(_Atomic uint32_t *word, uint32_t seen, int timeout_ms) {
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, timeout_ms < 0 ? NULL : &ts, NULL, 0);
}
static inline void cl_futex_wake(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
#endif
