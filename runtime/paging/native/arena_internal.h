/* Internal helpers of the arena, shared between arena.c and numpy_handler.c.
 * Not part of the public API (api.h) and not seen by cffi's cdef. */
#ifndef CLAMOR_ARENA_INTERNAL_H
#define CLAMOR_ARENA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this process may allocate from the arena: it exists and this is
 * not a forked child of the process that created it (a child shares the
 * MAP_SHARED pages with its parent but owns only a stale private copy of
 * the allocator's metadata, so it must neither allocate nor free). */
int clamor_arena_internal_usable(void);

/* Consistency check of the allocator's metadata for tests: free extents
 * sorted, disjoint and coalesced; the gaps between them tiled exactly by
 * live blocks and slabs; byte and block counters matching. Returns 0, or
 * -1 with a description in err. Exported (callable through ctypes). */
int clamor_arena_internal_check(char *err, size_t errlen);

#endif
