/* The shoot-down area of same-host zero copy, the driver's side (driver_zap.c; the
 * protocol is in pager_common.h): the memfd same-host workers map, through which the
 * driver asks them to unmap a page before its first write lands.
 *
 * No lock of its own: the area is shared memory, its words atomics and futexes.
 * zap_shoot_down runs on the write handler's thread. Calls no other driver file but
 * driver_base. */
#ifndef CLAMOR_DRIVER_ZAP_H
#define CLAMOR_DRIVER_ZAP_H
#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* The area for an arena of npages pages, no worker attached; -1 and a message on failure. */
int zap_init(uint64_t npages, char *err, size_t errlen);
void zap_free(void);
/* The memfd workers map (clamor_driver_zap_fd); -1 when there is none. */
int zap_fd(void);
/* Whether a worker on this host ever attached (it may map pages in place). */
int zap_same_host(void);
/* Every same-host worker that maps page p unmaps it before this returns (the caller has
 * marked p dirty); a worker that exits meanwhile is not waited for. */
void zap_shoot_down(uint64_t p);
/* Worker `id` is gone: it is not asked any more. */
void zap_forget_worker(int id);
/* Page versions same-host workers mapped in place, ever: all pages, or page p's. */
uint64_t zap_mapped_pages(void);
uint64_t zap_page_maps(uint64_t p);

#pragma GCC visibility pop

#endif
