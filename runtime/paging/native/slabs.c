/* Small requests: 64 KiB slabs carved from the extents at 64 KiB alignment, one
 * size class per slab, a bitmap of its objects, and a list per class of slabs
 * with free objects. A slab table indexed by offset >> 16 (A.slabs) finds a
 * pointer's slab; an empty slab goes back to the extents. The caller holds
 * A.lock. */

#include <stdlib.h>

#include "arena_alloc.h"

static uint8_t class_lut[SMALL_MAX / MIN_OBJ + 1]; /* (n + 15) / 16 -> class */

void slab_classes_init(void)
{
    for (unsigned c = 0, i = 0; i <= SMALL_MAX / MIN_OBJ; i++) {
        while (class_size[c] < i * MIN_OBJ)
            c++;
        class_lut[i] = (uint8_t)c;
    }
}

static void list_push(slab_t **head, slab_t *s)
{
    s->prev = NULL;
    s->next = *head;
    if (*head)
        (*head)->prev = s;
    *head = s;
}

static void list_remove(slab_t **head, slab_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        *head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static slab_t *slab_new(unsigned cls)
{
    int64_t u = ext_take(SLAB_UNITS, SLAB_UNITS);
    if (u < 0)
        return NULL;
    slab_t *s = calloc(1, sizeof *s);
    if (!s) {
        ext_give((uint64_t)u, SLAB_UNITS);
        return NULL;
    }
    s->unit = (uint32_t)u;
    s->cls = (uint16_t)cls;
    s->nobj = (uint16_t)(SLAB_BYTES / class_size[cls]);
    s->nfree = s->nobj;
    /* Mark the bit positions past the last object as taken. */
    unsigned w = s->nobj / 64, b = s->nobj % 64;
    if (w < SLAB_WORDS && b)
        s->bits[w] = ~(uint64_t)0 << b, w++;
    for (; w < SLAB_WORDS; w++)
        s->bits[w] = ~(uint64_t)0;
    A.slabs[(uint64_t)u / SLAB_UNITS] = s;
    list_push(&A.partial[cls], s);
    return s;
}

void *small_alloc(uint64_t n, uint64_t *usable)
{
    unsigned cls = class_lut[(n + MIN_OBJ - 1) / MIN_OBJ];
    slab_t *s = A.partial[cls];
    if (!s && !(s = slab_new(cls)))
        return NULL;
    for (unsigned w = s->hint; w < SLAB_WORDS; w++) {
        uint64_t freebits = ~s->bits[w];
        if (!freebits)
            continue;
        unsigned b = (unsigned)__builtin_ctzll(freebits);
        s->bits[w] |= (uint64_t)1 << b;
        s->hint = (uint16_t)w;
        if (--s->nfree == 0)
            list_remove(&A.partial[cls], s);
        A.used += class_size[cls];
        A.allocations++;
        *usable = class_size[cls];
        uint64_t off = (uint64_t)s->unit * UNIT + (uint64_t)(w * 64 + b) * class_size[cls];
        return A.base + off;
    }
    /* Unreachable: a slab on the partial list has a free bit at or above hint. */
    return NULL;
}

/* Free a slab object at `off` inside slab `s`; 0, or -1 if not a live object. */
int small_free(slab_t *s, uint64_t off)
{
    uint64_t rel = off - (uint64_t)s->unit * UNIT, size = class_size[s->cls];
    if (rel % size)
        return -1;
    uint64_t idx = rel / size;
    if (idx >= s->nobj)
        return -1;
    unsigned w = (unsigned)(idx / 64), b = (unsigned)(idx % 64);
    if (!(s->bits[w] >> b & 1))
        return -1;
    s->bits[w] &= ~((uint64_t)1 << b);
    if (w < s->hint)
        s->hint = (uint16_t)w;
    if (s->nfree++ == 0)
        list_push(&A.partial[s->cls], s);
    A.used -= size;
    A.allocations--;
    if (s->nfree == s->nobj) {
        list_remove(&A.partial[s->cls], s);
        A.slabs[s->unit / SLAB_UNITS] = NULL;
        ext_give(s->unit, SLAB_UNITS);
        free(s);
    }
    return 0;
}
