/* The arena allocator's private state and the two allocators that arena.c
 * builds on: free extents of 4 KiB units (extents.c) and 64 KiB slabs of one size
 * class each for small requests (slabs.c). Callers hold A.lock. Not part of the
 * API (api.h); nothing here is visible outside the native module. */
#ifndef CLAMOR_ARENA_ALLOC_H
#define CLAMOR_ARENA_ALLOC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define UNIT_SHIFT 12
#define UNIT ((uint64_t)1 << UNIT_SHIFT)
#define SLAB_SHIFT 16
#define SLAB_BYTES ((uint64_t)1 << SLAB_SHIFT)
#define SLAB_UNITS (SLAB_BYTES >> UNIT_SHIFT)
#define SMALL_MAX 32768u
#define MIN_OBJ 16u
#define SLAB_WORDS (SLAB_BYTES / MIN_OBJ / 64)
#define MAX_LARGE_ALIGN ((uint64_t)8 << 20)

/* Size classes: multiples of 16 below 64, of 64 from there on (so objects of
 * 64 bytes or more are 64-byte aligned), about 4 classes per doubling. */
static const uint32_t class_size[] = {
    16,    32,    48,    64,    128,   192,   256,   320,   384,
    448,   512,   640,   768,   896,   1024,  1280,  1536,  1792,
    2048,  2560,  3072,  3584,  4096,  5120,  6144,  7168,  8192,
    10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768,
};
#define NCLASSES (sizeof class_size / sizeof class_size[0])

typedef struct {
    uint32_t start; /* in units */
    uint32_t len;   /* in units, > 0 */
} extent_t;

typedef struct slab {
    struct slab *prev, *next; /* list of slabs of this class with free objects */
    uint32_t unit;            /* first unit of the slab */
    uint16_t cls, nobj, nfree, hint; /* hint: lowest word that may have a free bit */
    uint64_t bits[SLAB_WORDS];       /* 1 = allocated (or beyond nobj) */
} slab_t;

typedef struct {
    pthread_mutex_t lock;
    atomic_int created;
    atomic_int orphaned;  /* forked child: the allocator state belongs to the parent */
    int fd;
    uint8_t *base;
    uint64_t size, nunits;
    uint64_t large_align, align_units;
    uint64_t small_limit; /* largest request served from slabs */

    extent_t *ext;        /* free extents, sorted by start, coalesced */
    size_t next, ext_cap;
    uint32_t *blen;       /* per unit: length of the live extent block starting there */
    size_t blen_bytes;
    slab_t **slabs;       /* per 64 KiB: the slab there, or NULL */
    size_t slabs_bytes;
    slab_t *partial[NCLASSES];

    uint64_t used, high_water, allocations, last_failed;
} arena_state_t;

#pragma GCC visibility push(hidden)

/* The one arena of this process (arena.c). */
extern arena_state_t A;

/* extents.c: free space as address-ordered, coalesced extents. */
int ext_reserve(size_t extra);
void ext_remove(size_t i);
void ext_insert(size_t i, uint64_t start, uint64_t len); /* capacity reserved */
size_t ext_upper(uint64_t unit);
void bump_high_water(uint64_t end_unit);
int64_t ext_take(uint64_t n, uint64_t align);
void ext_give(uint64_t s, uint64_t n);

/* slabs.c: requests up to A.small_limit, from 64 KiB slabs of one size class. */
void slab_classes_init(void);
void *small_alloc(uint64_t n, uint64_t *usable);
int small_free(slab_t *s, uint64_t off);

#pragma GCC visibility pop

#endif
