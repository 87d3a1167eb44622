/* The driver's page table (driver_pages.c): per page, its version, its flags, its
 * version log (the sealed older versions), its state word in the table same-host
 * workers read, its holders (the directory, directory.h) and its request counters;
 * the epoch and the floor below which versions are gone; what the last stage start
 * invalidated. The page server's answers and the inspection calls read it here.
 *
 * Lock: the page's stripe lock guards everything of one page (page server threads,
 * the write handler and a stage start each take it). A page's flags change only under
 * the stage lock (driver_versions.c) besides; FL_DIRTY, which the page server reads,
 * also under the page lock. The epoch and the floor are atomics. Below it: the
 * shoot-down area (driver_zap.h) and the directory (directory.h). */
#ifndef CLAMOR_DRIVER_PAGES_H
#define CLAMOR_DRIVER_PAGES_H
#include <stddef.h>
#include <stdint.h>

#include "page_server.h"

#define FL_PROTECTED 1
#define FL_DIRTY 2
#define FL_WRITTEN 4 /* written while no old version was needed (no copy, maybe no trap) */

#pragma GCC visibility push(hidden)

/* The table of npages pages of ps bytes, none handed out, with the state table's memfd
 * and a read-only, untracked mapping of the arena (the page server and the version log
 * read there, never faulting on a parked chunk). -1 and a message on failure; pages_free
 * then frees what was made. */
int pages_init(uint64_t ps, uint64_t npages, char *err, size_t errlen);
void pages_free(void);
/* The page state table's memfd (clamor_driver_state_fd). */
int pages_state_fd(void);
uint32_t pages_epoch(void);
/* Whether epoch E can be served: 0 < E <= the epoch, and not below the floor. */
int pages_serves(uint32_t E);

/* ---- the page server's side */
/* A GET of page p at epoch E from `client` (a worker id, or not one), whose redirect to
 * peer `failed` - 1 failed (0: none). With `may_redirect`, a page some other worker holds
 * is answered with REDIRECT to it (a->peer_id; the caller fills in its address), and the
 * client is listed as a holder-to-be; else its bytes (buf) at the latest version <= E. */
void pages_answer(uint32_t client, uint32_t E, uint32_t failed, uint64_t p, int may_redirect,
                  uint8_t *buf, cl_answer *a);
/* CL_ROWS at epoch E: n rows of row_bytes at arena `offsets` (in the arena) into `out`,
 * each page's part at its latest version <= E; the pages count the requests and bytes.
 * The caller has checked that E is served. */
void pages_read_rows(uint32_t E, const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint8_t *out);
/* CL_HAVE from `client`: it got a page elsewhere, or dropped one. */
void pages_have(uint32_t client, const cl_msg *msg);
/* Worker w has (1) or no longer has (0) a page server to redirect to. */
void pages_set_live(uint32_t w, int live);
/* Worker w holds no page any more. */
void pages_forget_holder(uint32_t w);
/* clamor_driver_page_stats, clamor_driver_page_holders, clamor_driver_read_version. */
uint64_t pages_stats(uint64_t first, uint64_t n, uint64_t *requests, uint64_t *driver_bytes,
                     uint64_t *peer_bytes, uint32_t *holders, uint32_t *version);
uint64_t pages_holders(uint64_t first, uint64_t n, uint32_t *counts, uint16_t *ids, uint64_t cap);
int pages_read_version(uint64_t page, uint32_t epoch, uint8_t *out);
/* clamor_driver_versions_at. */
int64_t pages_versions_at(const uint64_t *runs, uint64_t n, uint32_t E, uint32_t *out, uint64_t cap);

/* ---- the write handler's side */
void pages_lock(uint64_t p);
void pages_unlock(uint64_t p);
/* Page lock held: p is protected and its current version not copied yet. */
int pages_fresh(uint64_t p);
/* Page lock held: p is write-protected. */
int pages_protected(uint64_t p);
/* Page p's first write since its version was sealed (page lock held; the caller
 * unprotects it): a fresh page's old bytes go into the version log if `keep_old`, and
 * same-host workers that map it unmap it while a stage runs. 1: the write kept no copy. */
int pages_first_write(uint64_t p, int keep_old);
/* Page lock held: p's first write (pages_first_write) went through the untracked
 * mapping, so the arena's own mapping of it stays write-protected (no ioctl at the
 * next stage start to protect it again). */
void pages_still_protected(uint64_t p);
/* A worker copies pages from the arena's memfd (same host, no zero copy): from now on
 * pages_seal lists every written page, as for workers that map in place. */
void pages_note_shm_copies(void);
/* Pages [first, first + n) were written untrapped (async tracking). */
void pages_mark_written(uint64_t first, uint64_t n);
/* Touches the arena's bytes at `offset` through the untracked mapping: an OS page never
 * written comes to be. */
void pages_touch(uint64_t offset);
/* Copies n bytes to arena offset `offset` through a writable, untracked mapping (no
 * write trap, no page marked: the caller does that first, and has checked that the
 * range lies in the arena). */
void pages_write(uint64_t offset, const uint8_t *src, uint64_t n);

/* ---- a stage start (stage lock held) */
/* Calls protect(first, n) for each run of unprotected pages below hw. */
void pages_each_unprotected(uint64_t hw, void (*protect)(uint64_t first, uint64_t n));
/* Pages [first, end) are write-protected again; those that were not count as written. */
void pages_reprotect(uint64_t first, uint64_t end);
/* Seals epoch E: every page below hw written since the last stage gets version E (its
 * log head, if any, becomes valid until E - 1), and the pages some worker may hold a
 * stale copy of are listed (pages_invalidated; with `same_host`, every written page that
 * was ever sealed, since same-host workers keep pages mapped across stages). Then E is
 * the epoch. */
void pages_seal(uint32_t E, uint64_t hw, int same_host);
/* The pages the last stage start listed: up to cap into out; how many there are. */
uint64_t pages_invalidated(uint64_t *out, uint64_t cap);
/* The pages whose version the last stage start changed (every written page): up to cap
 * into out; how many there are (UINT64_MAX: not known, memory ran out). */
uint64_t pages_sealed(uint64_t *out, uint64_t cap);
/* Frees the log entries no epoch >= floor can read; the bytes freed. */
uint64_t pages_trim_log(uint32_t floor);

#pragma GCC visibility pop

#endif
