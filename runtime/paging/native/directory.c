/* The driver's page directory: see directory.h. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "directory.h"

_Static_assert(CL_MAX_WORKERS % 64 == 0 && CL_MAX_WORKERS <= 65536, "holder ids are uint16, bitmaps whole words");
_Static_assert(sizeof(dir_entry) == 16, "a directory entry is 16 bytes");

static uint64_t rnd(void) {
    static __thread uint64_t s;
    if (!s && getrandom(&s, sizeof s, 0) != sizeof s) s = (uint64_t)(uintptr_t)&s;
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
}

int cl_dir_init(cl_dir *d, uint64_t npages, uint64_t *bytes_stat, uint64_t *bitmaps_stat) {
    memset(d, 0, sizeof *d);
    d->npages = npages, d->bytes = bytes_stat, d->bitmaps = bitmaps_stat;
    d->dir = calloc(npages, sizeof *d->dir);
    d->max_chunks = (npages + DIR_CHUNK - 1) / DIR_CHUNK;
    d->chunks = calloc(d->max_chunks, sizeof *d->chunks);
    pthread_mutex_init(&d->pool, NULL);
    *d->bytes = npages * sizeof *d->dir + d->max_chunks * sizeof *d->chunks;
    return d->dir && d->chunks ? 0 : -1;
}

void cl_dir_free(cl_dir *d) {
    if (d->chunks)
        for (uint64_t c = 0; c < d->max_chunks; c++) free(d->chunks[c]);
    free(d->chunks), free(d->dir);
    d->chunks = NULL, d->dir = NULL;
}

void cl_dir_set_live(cl_dir *d, uint32_t w, int live) {
    if (w >= CL_MAX_WORKERS) return;
    __atomic_store_n(&d->redirect_load[w], 0, __ATOMIC_RELAXED); /* a new (or no) page server */
    if (live) atomic_fetch_or_explicit(&d->live[w / 64], 1ull << (w % 64), memory_order_release);
    else atomic_fetch_and(&d->live[w / 64], ~(1ull << (w % 64)));
}

/* Directory operations. Page p's stripe lock is held for all but the pool's. */

static holder_bits *bits_at(const cl_dir *d, uint32_t i) { return &d->chunks[i / DIR_CHUNK][i % DIR_CHUNK]; }

/* A zeroed bitmap's index, or UINT32_MAX when memory is out. */
static uint32_t bits_take(cl_dir *d) {
    uint32_t i = UINT32_MAX;
    pthread_mutex_lock(&d->pool);
    if (d->bits_free) {
        i = d->bits_free - 1;
        d->bits_free = (uint32_t)bits_at(d, i)->w[0];
    } else if ((uint64_t)d->bits_used / DIR_CHUNK < d->max_chunks) {
        uint32_t c = d->bits_used / DIR_CHUNK;
        if (!d->chunks[c] && (d->chunks[c] = malloc(DIR_CHUNK * sizeof(holder_bits))))
            __atomic_fetch_add(d->bytes, DIR_CHUNK * sizeof(holder_bits), __ATOMIC_RELAXED);
        if (d->chunks[c]) i = d->bits_used++;
    }
    pthread_mutex_unlock(&d->pool);
    if (i != UINT32_MAX) {
        memset(bits_at(d, i), 0, sizeof(holder_bits));
        __atomic_fetch_add(d->bitmaps, 1, __ATOMIC_RELAXED);
    }
    return i;
}

static void bits_give(cl_dir *d, uint32_t i) {
    pthread_mutex_lock(&d->pool);
    bits_at(d, i)->w[0] = d->bits_free; /* the free list goes through the first word */
    d->bits_free = i + 1;
    pthread_mutex_unlock(&d->pool);
    __atomic_fetch_sub(d->bitmaps, 1, __ATOMIC_RELAXED);
}

static uint32_t big_of(const dir_entry *e) { return (uint32_t)e->id[0] | (uint32_t)e->id[1] << 16; }
static holder_bits *big(const cl_dir *d, const dir_entry *e) { return e->n & DIR_BIG ? bits_at(d, big_of(e)) : NULL; }

static int has(const cl_dir *d, const dir_entry *e, uint32_t w) {
    holder_bits *b = big(d, e);
    if (b) return (int)(b->w[w / 64] >> (w % 64) & 1);
    for (int i = 0; i < e->n; i++)
        if (e->id[i] == w) return 1;
    return 0;
}

void cl_dir_add(cl_dir *d, uint64_t p, uint32_t w) {
    if (w >= CL_MAX_WORKERS) return;
    dir_entry *e = &d->dir[p];
    if (has(d, e, w)) return;
    holder_bits *b = big(d, e);
    if (!b && e->n == DIR_INLINE) { /* the 8th holder: the page moves to a bitmap */
        uint32_t i = bits_take(d);
        if (i == UINT32_MAX) return; /* a hint lost: see the header */
        b = bits_at(d, i);
        for (int k = 0; k < DIR_INLINE; k++) b->w[e->id[k] / 64] |= 1ull << (e->id[k] % 64);
        e->id[0] = (uint16_t)i, e->id[1] = (uint16_t)(i >> 16);
        e->n |= DIR_BIG;
    }
    if (b) b->w[w / 64] |= 1ull << (w % 64);
    else e->id[e->n] = (uint16_t)w;
    __atomic_store_n(&e->n, e->n + 1, __ATOMIC_RELAXED); /* read unlocked: holders_of */
    uint64_t end = atomic_load_explicit(&d->end, memory_order_relaxed);
    while (p + 1 > end && !atomic_compare_exchange_weak(&d->end, &end, p + 1)) {}
}

void cl_dir_remove(cl_dir *d, uint64_t p, uint32_t w) {
    if (w >= CL_MAX_WORKERS) return;
    dir_entry *e = &d->dir[p];
    holder_bits *b = big(d, e);
    if (!b) {
        for (int i = 0; i < e->n; i++)
            if (e->id[i] == w) {
                e->id[i] = e->id[e->n - 1];
                __atomic_store_n(&e->n, e->n - 1, __ATOMIC_RELAXED);
                return;
            }
        return;
    }
    uint64_t bit = 1ull << (w % 64);
    if (!(b->w[w / 64] & bit)) return;
    b->w[w / 64] &= ~bit;
    uint16_t n = e->n - 1; /* still | DIR_BIG */
    if ((n & ~DIR_BIG) <= DIR_INLINE / 2) { /* few enough to be inline again */
        uint32_t i = big_of(e), k = 0;
        for (int j = 0; j < DIR_WORDS; j++)
            for (uint64_t x = b->w[j]; x; x &= x - 1) e->id[k++] = (uint16_t)(j * 64 + __builtin_ctzll(x));
        bits_give(d, i);
        n = (uint16_t)k;
    }
    __atomic_store_n(&e->n, n, __ATOMIC_RELAXED);
}

void cl_dir_clear(cl_dir *d, uint64_t p) {
    dir_entry *e = &d->dir[p];
    if (e->n & DIR_BIG) bits_give(d, big_of(e));
    __atomic_store_n(&e->n, 0, __ATOMIC_RELAXED);
}

uint32_t cl_dir_list(const cl_dir *d, uint64_t p, uint16_t *out) {
    const dir_entry *e = &d->dir[p];
    holder_bits *b = big(d, e);
    uint32_t k = 0;
    if (b) {
        for (int j = 0; j < DIR_WORDS; j++)
            for (uint64_t x = b->w[j]; x; x &= x - 1) out[k++] = (uint16_t)(j * 64 + __builtin_ctzll(x));
        return k;
    }
    for (; k < e->n; k++) { /* insertion sort of at most 7 */
        uint16_t v = e->id[k];
        uint32_t j = k;
        for (; j && out[j - 1] > v; j--) out[j] = out[j - 1];
        out[j] = v;
    }
    return k;
}

static int is_live(const cl_dir *d, uint32_t w) {
    return (int)(atomic_load_explicit(&d->live[w / 64], memory_order_acquire) >> (w % 64) & 1);
}

/* The k-th (from 0) set bit of x; x has more than k. */
static uint32_t nth_bit(uint64_t x, uint32_t k) {
    while (k--) x &= x - 1;
    return (uint32_t)__builtin_ctzll(x);
}

/* A holder of page p other than `client` to redirect it to: two random choices among the
 * live ones, the one with fewer outstanding redirects wins (the paper's "power of two
 * choices": a holder that is still sending, or still waiting for its own copy, is
 * chosen less). -1: none. */
int64_t cl_dir_pick(cl_dir *d, uint64_t p, uint32_t client) {
    const dir_entry *e = &d->dir[p];
    holder_bits *b = big(d, e);
    uint32_t choice[2];
    if (!b) {
        uint32_t cand[DIR_INLINE], n = 0;
        for (int i = 0; i < e->n; i++)
            if (e->id[i] != client && is_live(d, e->id[i])) cand[n++] = e->id[i];
        if (!n) return -1;
        for (int k = 0; k < 2; k++) choice[k] = cand[rnd() % n];
    } else {
        uint64_t m[DIR_WORDS];
        uint32_t n = 0;
        for (int j = 0; j < DIR_WORDS; j++) {
            m[j] = b->w[j] & atomic_load_explicit(&d->live[j], memory_order_acquire);
            if ((uint32_t)j == client / 64) m[j] &= ~(1ull << (client % 64));
            n += (uint32_t)__builtin_popcountll(m[j]);
        }
        if (!n) return -1;
        for (int k = 0; k < 2; k++) {
            uint32_t r = (uint32_t)(rnd() % n), j = 0;
            for (uint32_t c; r >= (c = (uint32_t)__builtin_popcountll(m[j])); j++) r -= c;
            choice[k] = j * 64 + nth_bit(m[j], r);
        }
    }
    uint64_t l0 = __atomic_load_n(&d->redirect_load[choice[0]], __ATOMIC_RELAXED);
    uint64_t l1 = __atomic_load_n(&d->redirect_load[choice[1]], __ATOMIC_RELAXED);
    uint32_t c = l0 <= l1 ? choice[0] : choice[1];
    __atomic_fetch_add(&d->redirect_load[c], 1, __ATOMIC_RELAXED);
    return c;
}

/* Why the client becomes a holder at the redirect, not at its CL_HAVE: in a burst every
 * worker asks for p before anyone has it, and without this each would be sent to the
 * first holder (or to the driver). The redirected peer may itself still be waiting for
 * its copy; it waits a bounded time (worker_pending.c), and a client whose peer fails
 * asks the driver again (cl_dir_failed), so a wrong hint costs time, never bytes.
 * Chains cannot wait in a circle: for one page, a client only ever waits for holders
 * listed before it; across pages, a worker fetches its redirected pages in ascending
 * order (worker_fetch.c). */
int64_t cl_dir_redirect(cl_dir *d, uint64_t p, uint32_t client) {
    int64_t pick = cl_dir_pick(d, p, client);
    if (pick >= 0) cl_dir_add(d, p, client);
    return pick;
}

void cl_dir_served(cl_dir *d, uint32_t peer) {
    if (peer >= CL_MAX_WORKERS) return;
    uint64_t n = __atomic_load_n(&d->redirect_load[peer], __ATOMIC_RELAXED);
    while (n && !__atomic_compare_exchange_n(&d->redirect_load[peer], &n, n - 1, 1, __ATOMIC_RELAXED,
                                             __ATOMIC_RELAXED)) {} /* never below 0: reset by set_live */
}

void cl_dir_failed(cl_dir *d, uint64_t p, uint32_t peer) {
    cl_dir_remove(d, p, peer);
    cl_dir_served(d, peer);
}

