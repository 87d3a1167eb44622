/* Free space of the arena: an address-ordered array of extents (start, length)
 * in 4 KiB units, kept coalesced. Allocation is first fit (live data stays packed
 * at low offsets); a freed block merges with its neighbours, found by binary
 * search. The caller holds A.lock. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena_alloc.h"

int ext_reserve(size_t extra)
{
    if (A.next + extra <= A.ext_cap)
        return 0;
    size_t cap = A.ext_cap ? A.ext_cap * 2 : 64;
    while (cap < A.next + extra)
        cap *= 2;
    extent_t *e = realloc(A.ext, cap * sizeof *e);
    if (!e)
        return -1;
    A.ext = e;
    A.ext_cap = cap;
    return 0;
}

void ext_remove(size_t i)
{
    memmove(&A.ext[i], &A.ext[i + 1], (A.next - i - 1) * sizeof *A.ext);
    A.next--;
}

void ext_insert(size_t i, uint64_t start, uint64_t len) /* capacity reserved */
{
    memmove(&A.ext[i + 1], &A.ext[i], (A.next - i) * sizeof *A.ext);
    A.ext[i].start = (uint32_t)start;
    A.ext[i].len = (uint32_t)len;
    A.next++;
}

/* Index of the first free extent starting after `unit`. */
size_t ext_upper(uint64_t unit)
{
    size_t lo = 0, hi = A.next;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (A.ext[mid].start > unit)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

void bump_high_water(uint64_t end_unit)
{
    if (end_unit * UNIT > A.high_water)
        A.high_water = end_unit * UNIT;
}

/* First fit of `n` units aligned to `align` units; -1 if nothing fits. */
int64_t ext_take(uint64_t n, uint64_t align)
{
    if (n == 0 || n > A.nunits)
        return -1;
    if (ext_reserve(1) < 0) /* a split may need one more slot */
        return -1;
    for (size_t i = 0; i < A.next; i++) {
        uint64_t s = A.ext[i].start, l = A.ext[i].len;
        if (l < n)
            continue;
        uint64_t a = (s + align - 1) & ~(align - 1);
        if (a + n > s + l)
            continue;
        uint64_t front = a - s, back = s + l - (a + n);
        if (front == 0 && back == 0) {
            ext_remove(i);
        } else if (front == 0) {
            A.ext[i].start = (uint32_t)(a + n);
            A.ext[i].len = (uint32_t)back;
        } else if (back == 0) {
            A.ext[i].len = (uint32_t)front;
        } else {
            A.ext[i].len = (uint32_t)front;
            ext_insert(i + 1, a + n, back);
        }
        bump_high_water(a + n);
        return (int64_t)a;
    }
    return -1;
}

/* Return [s, s+n) to the free extents, merging with its neighbours. */
void ext_give(uint64_t s, uint64_t n)
{
    size_t i = ext_upper(s);
    int prev = i > 0 && (uint64_t)A.ext[i - 1].start + A.ext[i - 1].len == s;
    int next = i < A.next && s + n == A.ext[i].start;
    if (prev && next) {
        A.ext[i - 1].len += (uint32_t)(n + A.ext[i].len);
        ext_remove(i);
    } else if (prev) {
        A.ext[i - 1].len += (uint32_t)n;
    } else if (next) {
        A.ext[i].start = (uint32_t)s;
        A.ext[i].len += (uint32_t)n;
    } else if (ext_reserve(1) == 0) {
        ext_insert(i, s, n);
    } else {
        /* Out of heap memory for the extent table: the units leak (they
         * stay unusable), the arena itself stays consistent. */
        fprintf(stderr, "clamor arena: out of memory, leaking %llu KiB\n",
                (unsigned long long)(n * UNIT / 1024));
    }
}
