/* The driver's arena: one memfd-backed MAP_SHARED region per process and a
 * thread-safe allocator over it (see api.h).
 *
 * Design
 * - Space is managed in 4 KiB units. Free space is an address-ordered array
 *   of extents (start, length), kept coalesced: free() finds its neighbours
 *   by binary search and merges with them. Allocation is first fit, which
 *   keeps live data packed at low offsets (fewer pages for workers to fetch,
 *   a low high-water mark). Blocks of at least `large_align` bytes (the page
 *   size) start on a `large_align` boundary.
 * - A per-unit table (`blen`) gives the length of the extent block starting
 *   at each unit, which is all free() needs.
 * - Requests of at most 32 KiB (and below `large_align`) come from 64 KiB
 *   slabs, one size class per slab, carved from the extent allocator at
 *   64 KiB alignment. A slab table indexed by offset >> 16 finds a pointer's
 *   slab; a bitmap per slab tracks its objects. Empty slabs go back.
 * - All metadata lives outside the arena (malloc'd, or anonymous mmap for
 *   the big tables so that they stay lazily zero). Allocating and freeing
 *   never read or write arena memory: its pages may be write-protected by
 *   the pager or held by workers. The only writes are calloc's zeroing (of
 *   the part of the block below the high-water mark; memory above it has
 *   never been handed out and fresh memfd pages are zero) and realloc's
 *   copy, both done after the lock is released so that a write fault that
 *   blocks (a page held by a running stage) never blocks other allocators.
 *
 * Files: this one holds the state, creation, the API and the self check; the
 * extent allocator is extents.c, the slabs slabs.c (both declared in
 * arena_alloc.h, hidden from the module's exports).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clamor.h"
#include "arena_alloc.h"
#include "arena_internal.h"
#include "pager_common.h"

arena_state_t A = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1,
};

/* ------------------------------------------------------------ helpers -- */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static inline int ready(void)
{
    return atomic_load_explicit(&A.created, memory_order_acquire) &&
           !atomic_load_explicit(&A.orphaned, memory_order_relaxed);
}

static void *map_zeroed(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void atfork_prepare(void) { pthread_mutex_lock(&A.lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&A.lock); }
static void atfork_child(void)
{
    atomic_store(&A.orphaned, 1);
    pthread_mutex_unlock(&A.lock);
}

/* ------------------------------------------------- allocation (locked) -- */

static void *large_alloc(uint64_t n, uint64_t *usable)
{
    uint64_t units = (n + UNIT - 1) >> UNIT_SHIFT;
    if (units > A.nunits)
        return NULL;
    int64_t u = ext_take(units, n >= A.large_align ? A.align_units : 1);
    if (u < 0)
        return NULL;
    A.blen[u] = (uint32_t)units;
    A.used += units * UNIT;
    A.allocations++;
    *usable = units * UNIT;
    return A.base + (uint64_t)u * UNIT;
}

static void *alloc_locked(uint64_t n, uint64_t *usable)
{
    if (n == 0)
        n = 1; /* a unique, valid pointer */
    void *p = n <= A.small_limit ? small_alloc(n, usable) : large_alloc(n, usable);
    if (!p)
        A.last_failed = n;
    return p;
}

/* Usable size of the live block at offset `off` (0 if none); *slab_out is
 * set to its slab for slab objects, NULL for extent blocks. */
static uint64_t block_locked(uint64_t off, slab_t **slab_out)
{
    *slab_out = NULL;
    if (off >= A.size)
        return 0;
    slab_t *s = A.slabs[off >> SLAB_SHIFT];
    if (s) {
        uint64_t rel = off - (uint64_t)s->unit * UNIT, size = class_size[s->cls];
        if (rel % size || rel / size >= s->nobj)
            return 0;
        uint64_t idx = rel / size;
        if (!(s->bits[idx / 64] >> (idx % 64) & 1))
            return 0;
        *slab_out = s;
        return size;
    }
    if (off & (UNIT - 1))
        return 0;
    return (uint64_t)A.blen[off >> UNIT_SHIFT] * UNIT;
}

static void free_locked(void *ptr)
{
    uint64_t off = (uint64_t)((uint8_t *)ptr - A.base);
    slab_t *s;
    uint64_t size = block_locked(off, &s);
    if (!size)
        return; /* not a live block: ignore (double free or foreign pointer) */
    if (s) {
        small_free(s, off);
        return;
    }
    uint64_t u = off >> UNIT_SHIFT, units = A.blen[u];
    A.blen[u] = 0;
    A.used -= units * UNIT;
    A.allocations--;
    ext_give(u, units);
}

/* ------------------------------------------------------------ the API -- */

int clamor_arena_create(uint64_t size, uint64_t large_align, char *err, size_t errlen)
{
    if (size == 0 || size % UNIT) {
        set_err(err, errlen, "arena size must be a positive multiple of 4096 bytes, not %llu",
                (unsigned long long)size);
        return -1;
    }
    if (size / UNIT > UINT32_MAX) {
        set_err(err, errlen, "arena size %llu is too large (at most 16 TiB)",
                (unsigned long long)size);
        return -1;
    }
    if (large_align < UNIT || large_align > MAX_LARGE_ALIGN || (large_align & (large_align - 1))) {
        set_err(err, errlen, "large_align must be a power of two between 4 KiB and 8 MiB, not %llu",
                (unsigned long long)large_align);
        return -1;
    }

    pthread_mutex_lock(&A.lock);
    if (atomic_load(&A.created)) {
        pthread_mutex_unlock(&A.lock);
        set_err(err, errlen, "arena already exists");
        return -1;
    }

    /* At least CL_PMD_BYTES: the driver's write tracking moves 64 MiB chunks' page
     * tables with mremap, a table at a time only where both ends are aligned to it. */
    uint64_t align = large_align > SLAB_BYTES ? large_align : SLAB_BYTES;
    if (align < CL_PMD_BYTES) align = CL_PMD_BYTES;
    uint64_t nunits = size / UNIT;
    size_t blen_bytes = nunits * sizeof(uint32_t);
    size_t slabs_bytes = ((size + SLAB_BYTES - 1) / SLAB_BYTES) * sizeof(slab_t *);
    uint8_t *reserve = MAP_FAILED, *base = NULL;
    uint32_t *blen = NULL;
    slab_t **slabs = NULL;
    extent_t *ext = NULL;

    int fd = memfd_create("clamor-arena", MFD_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, "memfd_create: %s", strerror(errno));
        goto fail;
    }
    if (ftruncate(fd, (off_t)size) < 0) {
        set_err(err, errlen, "ftruncate(%llu): %s", (unsigned long long)size, strerror(errno));
        goto fail;
    }
    /* Map the memfd at an aligned address, so that offset alignment and address
     * alignment agree. */
    reserve = cl_reserve_aligned(size, align);
    if (reserve == MAP_FAILED) {
        set_err(err, errlen, "cannot reserve %llu bytes of address space: %s",
                (unsigned long long)(size + align), strerror(errno));
        goto fail;
    }
    base = reserve;
    if (mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        set_err(err, errlen, "mmap of the arena: %s", strerror(errno));
        goto fail;
    }
    reserve = MAP_FAILED; /* base..base+size is the arena now */

    blen = map_zeroed(blen_bytes);
    slabs = map_zeroed(slabs_bytes);
    ext = malloc(64 * sizeof *ext);
    if (!blen || !slabs || !ext) {
        set_err(err, errlen, "out of memory for the arena's metadata");
        munmap(base, size);
        base = NULL;
        goto fail;
    }

    slab_classes_init();

    A.fd = fd;
    A.base = base;
    A.size = size;
    A.nunits = nunits;
    A.large_align = large_align;
    A.align_units = large_align / UNIT;
    A.small_limit = large_align - 1 < SMALL_MAX ? large_align - 1 : SMALL_MAX;
    A.ext = ext;
    A.ext_cap = 64;
    A.next = 1;
    A.ext[0].start = 0;
    A.ext[0].len = (uint32_t)nunits;
    A.blen = blen;
    A.blen_bytes = blen_bytes;
    A.slabs = slabs;
    A.slabs_bytes = slabs_bytes;
    A.used = A.high_water = A.allocations = A.last_failed = 0;
    static int atfork_done;
    if (!atfork_done) {
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        atfork_done = 1;
    }
    atomic_store_explicit(&A.created, 1, memory_order_release);
    pthread_mutex_unlock(&A.lock);
    return 0;

fail:
    if (reserve != MAP_FAILED)
        munmap(reserve, size);
    if (blen)
        munmap(blen, blen_bytes);
    if (slabs)
        munmap(slabs, slabs_bytes);
    free(ext);
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&A.lock);
    return -1;
}

int clamor_arena_exists(void) { return atomic_load_explicit(&A.created, memory_order_acquire); }

void *clamor_arena_base(void) { return clamor_arena_exists() ? A.base : NULL; }

uint64_t clamor_arena_size(void) { return clamor_arena_exists() ? A.size : 0; }

int clamor_arena_fd(void) { return clamor_arena_exists() ? A.fd : -1; }

int clamor_arena_internal_usable(void) { return ready(); }

void *clamor_arena_alloc(uint64_t nbytes)
{
    if (!ready())
        return NULL;
    uint64_t usable;
    pthread_mutex_lock(&A.lock);
    void *p = alloc_locked(nbytes, &usable);
    pthread_mutex_unlock(&A.lock);
    return p;
}

void *clamor_arena_calloc(uint64_t nmemb, uint64_t size)
{
    if (!ready())
        return NULL;
    uint64_t n, usable, hw;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        pthread_mutex_lock(&A.lock);
        A.last_failed = UINT64_MAX;
        pthread_mutex_unlock(&A.lock);
        return NULL;
    }
    pthread_mutex_lock(&A.lock);
    hw = A.high_water; /* memory at or above it has never been handed out */
    uint8_t *p = alloc_locked(n, &usable);
    pthread_mutex_unlock(&A.lock);
    if (p) {
        uint64_t off = (uint64_t)(p - A.base);
        uint64_t end = off + (n ? n : 1);
        if (off < hw)
            memset(p, 0, (size_t)((end < hw ? end : hw) - off));
    }
    return p;
}

void *clamor_arena_realloc(void *ptr, uint64_t nbytes)
{
    if (!ptr)
        return clamor_arena_alloc(nbytes);
    if (!ready() || !clamor_arena_contains(ptr))
        return NULL;
    uint64_t n = nbytes ? nbytes : 1, off = (uint64_t)((uint8_t *)ptr - A.base), usable;
    slab_t *s;

    pthread_mutex_lock(&A.lock);
    uint64_t old = block_locked(off, &s);
    if (!old) {
        pthread_mutex_unlock(&A.lock);
        return NULL; /* not a live block */
    }
    int small = n <= A.small_limit;
    if (s && small && n <= old && n >= old / 2) {
        pthread_mutex_unlock(&A.lock);
        return ptr;
    }
    if (!s && !small && (n < A.large_align || (off / UNIT) % A.align_units == 0)) {
        uint64_t u = off >> UNIT_SHIFT, units = A.blen[u];
        uint64_t want = (n + UNIT - 1) >> UNIT_SHIFT;
        if (want <= units) { /* shrink in place: give back the tail */
            if (want < units && ext_reserve(1) == 0) {
                ext_give(u + want, units - want);
                A.blen[u] = (uint32_t)want;
                A.used -= (units - want) * UNIT;
            }
            pthread_mutex_unlock(&A.lock);
            return ptr;
        }
        size_t i = ext_upper(u); /* grow in place into a free extent right after */
        if (i < A.next && A.ext[i].start == u + units && A.ext[i].len >= want - units) {
            uint64_t extra = want - units;
            if (A.ext[i].len == extra) {
                ext_remove(i);
            } else {
                A.ext[i].start += (uint32_t)extra;
                A.ext[i].len -= (uint32_t)extra;
            }
            bump_high_water(u + want);
            A.blen[u] = (uint32_t)want;
            A.used += extra * UNIT;
            pthread_mutex_unlock(&A.lock);
            return ptr;
        }
    }
    uint8_t *p = alloc_locked(n, &usable);
    pthread_mutex_unlock(&A.lock);
    if (!p)
        return NULL; /* the old block is untouched */
    memcpy(p, ptr, (size_t)(n < old ? n : old));
    pthread_mutex_lock(&A.lock);
    free_locked(ptr);
    pthread_mutex_unlock(&A.lock);
    return p;
}

void clamor_arena_free(void *ptr)
{
    if (!ptr || !ready() || !clamor_arena_contains(ptr))
        return;
    pthread_mutex_lock(&A.lock);
    free_locked(ptr);
    pthread_mutex_unlock(&A.lock);
}

int clamor_arena_contains(const void *ptr)
{
    if (!clamor_arena_exists())
        return 0;
    const uint8_t *p = ptr;
    return p >= A.base && p < A.base + A.size;
}

uint64_t clamor_arena_block_size(const void *ptr)
{
    if (!clamor_arena_contains(ptr))
        return 0;
    slab_t *s;
    pthread_mutex_lock(&A.lock);
    uint64_t size = block_locked((uint64_t)((const uint8_t *)ptr - A.base), &s);
    pthread_mutex_unlock(&A.lock);
    return size;
}

void clamor_arena_get_stats(clamor_arena_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!clamor_arena_exists())
        return;
    pthread_mutex_lock(&A.lock);
    out->size = A.size;
    out->used = A.used;
    out->free = A.size - A.used;
    out->high_water = A.high_water;
    out->allocations = A.allocations;
    out->large_align = A.large_align;
    out->last_failed_request = A.last_failed;
    pthread_mutex_unlock(&A.lock);
}

/* -------------------------------------------------------- self check -- */

int clamor_arena_internal_check(char *err, size_t errlen)
{
    if (!clamor_arena_exists()) {
        set_err(err, errlen, "no arena");
        return -1;
    }
    int rc = -1;
    pthread_mutex_lock(&A.lock);
    uint64_t pos = 0, used = 0, blocks = 0, max_end = 0;
    for (size_t i = 0; i <= A.next; i++) {
        uint64_t gap_end = i < A.next ? A.ext[i].start : A.nunits;
        if (i < A.next) {
            if (A.ext[i].len == 0 || (uint64_t)A.ext[i].start + A.ext[i].len > A.nunits) {
                set_err(err, errlen, "extent %zu out of range", i);
                goto out;
            }
            if (i > 0 && (uint64_t)A.ext[i - 1].start + A.ext[i - 1].len >= A.ext[i].start) {
                set_err(err, errlen, "extents %zu and %zu overlap or are not coalesced", i - 1, i);
                goto out;
            }
        }
        while (pos < gap_end) { /* the gap must be tiled by live blocks and slabs */
            slab_t *s = A.slabs[pos / SLAB_UNITS];
            if (s && s->unit == pos) {
                unsigned live = 0;
                for (unsigned k = 0; k < s->nobj; k++)
                    live += s->bits[k / 64] >> (k % 64) & 1;
                if (live != (unsigned)(s->nobj - s->nfree) || live == 0) {
                    set_err(err, errlen, "slab at unit %llu: %u live, nfree %u of %u",
                            (unsigned long long)pos, live, s->nfree, s->nobj);
                    goto out;
                }
                used += (uint64_t)live * class_size[s->cls];
                blocks += live;
                pos += SLAB_UNITS;
            } else if (A.blen[pos]) {
                used += (uint64_t)A.blen[pos] * UNIT;
                blocks++;
                pos += A.blen[pos];
            } else {
                set_err(err, errlen, "unit %llu is neither free nor in a live block",
                        (unsigned long long)pos);
                goto out;
            }
            max_end = pos;
        }
        if (pos != gap_end) {
            set_err(err, errlen, "live block crossing unit %llu overlaps a free extent",
                    (unsigned long long)gap_end);
            goto out;
        }
        if (i < A.next)
            pos = (uint64_t)A.ext[i].start + A.ext[i].len;
    }
    if (used != A.used || blocks != A.allocations) {
        set_err(err, errlen, "counters: used %llu vs %llu, blocks %llu vs %llu",
                (unsigned long long)used, (unsigned long long)A.used,
                (unsigned long long)blocks, (unsigned long long)A.allocations);
        goto out;
    }
    if (max_end * UNIT > A.high_water) {
        set_err(err, errlen, "live data beyond the high-water mark");
        goto out;
    }
    rc = 0;
out:
    pthread_mutex_unlock(&A.lock);
    return rc;
}

/* -------------------------------------------------------- checkpoints --
 * runtime/data/checkpoint.py saves the arena's live extent blocks and re-creates
 * them at the same offsets in a fresh process, so that arrays rebuilt from
 * ArenaRefs land where they were and later allocations never overlap them.
 * Slab objects (requests below the page size) are not listed: an ArenaRef
 * only ever names an array of at least a page, which is an extent block. */

uint64_t clamor_arena_list_blocks(uint64_t *offsets, uint64_t *sizes, uint64_t cap)
{
    if (!ready())
        return 0;
    uint64_t n = 0;
    pthread_mutex_lock(&A.lock);
    uint64_t pos = 0;
    for (size_t i = 0; i <= A.next; i++) {
        uint64_t gap_end = i < A.next ? A.ext[i].start : A.nunits;
        while (pos < gap_end) { /* the gap is tiled by live blocks and slabs */
            slab_t *s = A.slabs[pos / SLAB_UNITS];
            if (s && s->unit == pos) {
                pos += SLAB_UNITS;
            } else if (A.blen[pos]) {
                if (n < cap) {
                    offsets[n] = pos * UNIT;
                    sizes[n] = (uint64_t)A.blen[pos] * UNIT;
                }
                n++;
                pos += A.blen[pos];
            } else {
                pos++; /* unreachable when the metadata is consistent */
            }
        }
        if (i < A.next)
            pos = (uint64_t)A.ext[i].start + A.ext[i].len;
    }
    pthread_mutex_unlock(&A.lock);
    return n;
}

int clamor_arena_reserve(uint64_t offset, uint64_t nbytes, char *err, size_t errlen)
{
    if (!ready()) {
        set_err(err, errlen, "the arena does not exist (or belongs to the parent process)");
        return -1;
    }
    if (offset % UNIT || nbytes == 0 || nbytes % UNIT) {
        set_err(err, errlen, "block %llu+%llu is not a whole number of 4 KiB units",
                (unsigned long long)offset, (unsigned long long)nbytes);
        return -1;
    }
    if (offset > A.size || nbytes > A.size - offset) {
        set_err(err, errlen, "block %llu+%llu lies beyond the arena's end (%llu bytes)",
                (unsigned long long)offset, (unsigned long long)nbytes,
                (unsigned long long)A.size);
        return -1;
    }
    uint64_t u = offset / UNIT, n = nbytes / UNIT;
    if (n > UINT32_MAX) {
        set_err(err, errlen, "block of %llu bytes is too large", (unsigned long long)nbytes);
        return -1;
    }
    pthread_mutex_lock(&A.lock);
    size_t i = ext_upper(u);
    if (i == 0 || (uint64_t)A.ext[i - 1].start + A.ext[i - 1].len < u + n) {
        pthread_mutex_unlock(&A.lock);
        set_err(err, errlen, "bytes %llu..%llu of the arena are already in use",
                (unsigned long long)offset, (unsigned long long)(offset + nbytes));
        return -1;
    }
    if (ext_reserve(1) < 0) {
        pthread_mutex_unlock(&A.lock);
        set_err(err, errlen, "out of memory for the arena's metadata");
        return -1;
    }
    i--;
    uint64_t s = A.ext[i].start, l = A.ext[i].len;
    uint64_t front = u - s, back = s + l - (u + n);
    if (front == 0 && back == 0) {
        ext_remove(i);
    } else if (front == 0) {
        A.ext[i].start = (uint32_t)(u + n);
        A.ext[i].len = (uint32_t)back;
    } else if (back == 0) {
        A.ext[i].len = (uint32_t)front;
    } else {
        A.ext[i].len = (uint32_t)front;
        ext_insert(i + 1, u + n, back);
    }
    bump_high_water(u + n);
    A.blen[u] = (uint32_t)n;
    A.used += n * UNIT;
    A.allocations++;
    pthread_mutex_unlock(&A.lock);
    return 0;
}
