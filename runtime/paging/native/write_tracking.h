/* Async write tracking of the driver's arena, private to driver_versions.c.
 *
 * The driver learns of its first write to a page in an epoch from a userfaultfd
 * write-protect trap: a round trip through the handler thread per page (~20 us).
 * That trap is needed while old versions must be kept (a stage is running, or
 * lineage or a checkpoint may read the epoch): the old bytes are copied before the
 * write lands. When nothing will read them, the driver only needs to know which
 * pages changed by the next stage, and Linux 6.7+ tells that without a trap:
 * a range registered with UFFD_FEATURE_WP_ASYNC has its write-protect bit cleared
 * by the kernel on a write, and PAGEMAP_SCAN lists the pages written.
 *
 * The arena is switched between the two userfaultfds in chunks (CL_WT_CHUNK_BYTES),
 * a chunk when the driver first writes into it while no old version is needed, and
 * back at the next stage. A switch moves the chunk's page tables aside with
 * mremap(MREMAP_DONTUNMAP) first: what they say (written or not) goes with them,
 * and the chunk starts empty, so a page touched while it is registered with
 * neither userfaultfd shows up as present; such pages count as written. No write
 * goes unseen, whichever thread makes it.
 *
 * Parking (a stage starts while a chunk is async): instead of going back to traps,
 * which empties the chunk and costs the next driver write a refault per page, the
 * chunk's page tables are moved aside whole, keeping their async registration; the
 * written pages in them are listed and write-protected again on the way. The chunk
 * itself stays empty, registered MISSING | MINOR | WP with the sync userfaultfd, so
 * any driver touch of it traps. The first touch when no old version is needed moves
 * the tables back with one mremap (unpark: async again, nothing refaults); while
 * versions are needed the driver pager maps the touched pages one by one
 * (UFFDIO_CONTINUE), keeping the rest parked. The page server and the version log
 * read the arena through their own mapping, so they never touch a parked chunk. */
#ifndef CLAMOR_WRITE_TRACKING_H
#define CLAMOR_WRITE_TRACKING_H
#include <stdint.h>

#define CL_WT_CHUNK_BYTES (64ull << 20)

typedef struct cl_wtrack cl_wtrack;

/* `can_park`: `sync_fd` has UFFD_FEATURE_MINOR_SHMEM, so chunks can be parked. */

/* Called with runs of pages [first, first + n) found written (or touched while
 * their chunk was between the two userfaultfds). */
typedef void (*cl_wt_mark)(uint64_t first, uint64_t n);

/* The tracker of the arena [base, base + npages * ps), whose every page is registered
 * for write-protect with `sync_fd` (not owned). NULL where the kernel lacks async
 * write-protect or PAGEMAP_SCAN; `why` then says which. */
cl_wtrack *cl_wtrack_new(int sync_fd, int can_park, uint8_t *base, uint64_t ps, uint64_t npages, char *why,
                         size_t whylen);
void cl_wtrack_free(cl_wtrack *t);

uint64_t cl_wtrack_chunk_of(const cl_wtrack *t, uint64_t page);
int cl_wtrack_is_async(const cl_wtrack *t, uint64_t chunk);
int cl_wtrack_is_parked(const cl_wtrack *t, uint64_t chunk);
uint64_t cl_wtrack_chunks(const cl_wtrack *t);
uint64_t cl_wtrack_first_page(const cl_wtrack *t, uint64_t chunk);

/* Moves `chunk` to async tracking: write-protects its pages below `hw` without traps
 * from now on. Pages touched during the switch are marked. -1 if the chunk could not
 * be switched (it is then as before). */
int cl_wtrack_to_async(cl_wtrack *t, uint64_t chunk, uint64_t hw, cl_wt_mark mark);

/* Moves `chunk` back to trapping write-protect, every page below `hw` protected;
 * marks the pages written while it was async (and during the switch). */
void cl_wtrack_to_sync(cl_wtrack *t, uint64_t chunk, uint64_t hw, cl_wt_mark mark);

/* Parks the `n` async chunks from `chunk` on (adjacent: one mremap, one scan, one
 * registration for all), marking the pages written while they were async; -1 if they
 * could not be (they are then async as before: park them one by one, or move them to
 * sync). A run spanning several mappings cannot be moved in one mremap. */
int cl_wtrack_park(cl_wtrack *t, uint64_t chunk, uint64_t n, cl_wt_mark mark);

/* Moves a parked `chunk`'s page tables back: async again, waiters on it woken. -1 if
 * the mremap failed (it stays parked). */
int cl_wtrack_unpark(cl_wtrack *t, uint64_t chunk);

#endif
