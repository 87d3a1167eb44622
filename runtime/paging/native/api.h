/* The public C API of clamor's native module.
 *
 * This file is read twice: by the C compiler (through clamor.h) and by cffi's
 * cdef (build.py strips the preprocessor lines), so it holds only plain
 * declarations. Every function is safe to call without the GIL unless its
 * comment says otherwise. Errors: functions returning int use 0 for success
 * and -1 for failure with a message in the caller's `err` buffer.
 */

/* ---------------------------------------------------------------- arena --
 * One arena per process: a contiguous virtual region divided into pages.
 * On the driver it is backed by a memfd (shared with same-host workers);
 * the allocator's metadata lives outside the arena (malloc'd), so that
 * allocating and freeing never write to arena pages. */

typedef struct {
    uint64_t size;              /* bytes reserved */
    uint64_t used;              /* bytes in live blocks (rounded sizes) */
    uint64_t free;              /* size - used */
    uint64_t high_water;        /* first byte never handed out (offset) */
    uint64_t allocations;       /* live blocks */
    uint64_t large_align;       /* alignment of blocks >= large_align */
    uint64_t last_failed_request; /* bytes of the last request that failed, 0 if none */
} clamor_arena_stats;

int clamor_arena_create(uint64_t size, uint64_t large_align, char *err, size_t errlen);
int clamor_arena_exists(void);
void *clamor_arena_base(void);
uint64_t clamor_arena_size(void);
int clamor_arena_fd(void);
void *clamor_arena_alloc(uint64_t nbytes);
void *clamor_arena_calloc(uint64_t nmemb, uint64_t size);
void *clamor_arena_realloc(void *ptr, uint64_t nbytes);
void clamor_arena_free(void *ptr);
int clamor_arena_contains(const void *ptr);
uint64_t clamor_arena_block_size(const void *ptr);
void clamor_arena_get_stats(clamor_arena_stats *out);

/* NEP 49 numpy memory handler routing numpy allocations to the arena.
 * These take the GIL themselves (cffi releases it around calls). The
 * `_large` variant routes only requests of at least `min_bytes` bytes
 * there (smaller ones go to libc). */
int clamor_numpy_handler_init(void);
void *clamor_numpy_handler_push(void);
void *clamor_numpy_handler_push_large(uint64_t min_bytes);
int clamor_numpy_handler_pop(void *previous);

/* ------------------------------------------------------------------ TLS --
 * Optional mutual TLS on every page-protocol connection: the cluster CA, and
 * the certificate and private key every server and client presents (PEM text
 * in memory, not necessarily NUL-terminated). Pass NULL for plaintext. */

typedef struct {
    const char *ca;
    size_t ca_len;
    const char *cert;
    size_t cert_len;
    const char *key;
    size_t key_len;
} clamor_tls_pem;

/* ----------------------------------------------------------- driver pager --
 * Write tracking, page versions, the version log, the directory of which
 * worker holds which page, and the driver's page server thread. */

typedef struct {
    uint64_t page_size;
    uint64_t num_pages;
    uint64_t epoch;
    uint64_t requests;          /* GET requests received */
    uint64_t redirects;         /* answered with REDIRECT */
    uint64_t pages_served;
    uint64_t bytes_served;      /* by the driver's page server (TCP) */
    uint64_t shm_bytes;         /* read by same-host workers from the memfd */
    uint64_t peer_bytes;        /* reported by workers as served by peers */
    uint64_t cow_copies;        /* pages copied into the version log */
    uint64_t version_log_bytes;
    uint64_t version_log_entries;
    uint64_t invalidations;     /* page invalidations announced */
    uint64_t auth_failures;
    uint64_t bad_requests;
    uint64_t stage_running;
    uint64_t evictions_told;    /* CL_HAVE_DROPPED notices: a worker evicted a page for room */
    uint64_t shootdowns;        /* same-host workers told to unmap a page before a write */
    uint64_t stopped_continued; /* stopped workers continued (SIGCONT) so they could unmap */
    uint64_t mapped_bytes;      /* page versions same-host workers mapped in place (zero copy), in bytes */
    uint64_t async_write_tracking; /* 1: writes no stage needs the old bytes of go untrapped (Linux 6.7+) */
    uint64_t async_switches;    /* arena chunks moved to async write tracking */
    uint64_t parks;             /* async chunks parked at a stage start (write_tracking.h) */
    uint64_t park_runs;         /* parkings: a run of adjacent async chunks goes in one */
    uint64_t unparks;           /* parked chunks touched and moved back whole */
    uint64_t parked_faults;     /* pages of parked chunks mapped one by one (old versions needed) */
    uint64_t uncopied_writes;   /* trapped first writes that needed no copy (no async tracking) */
    uint64_t pages_written;     /* pages found written with no copy, at stage starts */
    uint64_t directory_bytes;   /* the directory: 16 bytes a page, plus its holder bitmaps' pool */
    uint64_t holder_bitmaps;    /* pages held by more than 7 workers (a 128-byte bitmap each) */
    uint64_t direct_writes;     /* rows written by clamor_driver_write_rows (no write trap) */
    uint64_t rows_served;       /* rows sent for CL_ROWS (clamor.gather on workers that copy pages) */
    uint64_t bytes_mapped_ahead; /* of the arena, where clamor.write writes (driver_map_ahead.h) */
} clamor_driver_stats;

/* Workers a cluster can have: worker ids are 0 .. CLAMOR_MAX_WORKERS - 1. The driver's
 * directory keeps page holders as 16-bit ids with 1,024-bit sets for hot pages, and
 * same-host zero copy has a shoot-down slot per id (directory.h, pager_common.h). */
enum { CLAMOR_MAX_WORKERS = 1024 };

int clamor_driver_start(uint64_t page_size, const uint8_t *token, size_t token_len,
                        const char *bind_host, int port, int replication,
                        const clamor_tls_pem *tls, char *err, size_t errlen);
int clamor_driver_port(void);
int clamor_driver_state_fd(void);
/* The shoot-down area of same-host zero copy (pager_common.h); -1 when not running. */
int clamor_driver_zap_fd(void);
void clamor_driver_stop(void);
uint32_t clamor_driver_begin_stage(void);
uint64_t clamor_driver_invalidated(uint64_t *out, uint64_t cap);
/* The pages whose version the last stage start changed (every page written since the one
 * before, sorted): up to `cap` into out; how many there are (UINT64_MAX: not known). A
 * resident read set's versions at the new epoch are those at the last one but for these
 * (ReadSetCache.at). */
uint64_t clamor_driver_sealed(uint64_t *out, uint64_t cap);
void clamor_driver_end_stage(void);
/* No stage reads epochs <= epoch any more: the driver's writes need no old copies
 * until the next stage (and go untrapped where the kernel has async write-protect). */
void clamor_driver_release(uint32_t epoch);
/* Epoch `epoch` is needed again: 0 if its versions are all still there (the release
 * is undone), -1 if a write since kept no copy. */
int clamor_driver_retain(uint32_t epoch);
/* The driver writes `n` rows of `row_bytes` bytes, row i from values + i * row_bytes to
 * arena offset offsets[i] (in order: a row given twice ends with its last bytes), through
 * an untracked mapping of the arena: no write trap per page. Each page the rows cover
 * first gets what a trapped first write gets (its old bytes into the version log where
 * a stage or lineage needs them; the next stage invalidates it), and no stage starts
 * until the bytes are in. 0: written; 1: not written (no pager runs, or a stage runs,
 * whose readers a write must shoot down: write the ordinary way); -1: a row outside
 * the arena (nothing written). */
int clamor_driver_write_rows(const int64_t *offsets, uint64_t n, const uint8_t *values, uint64_t row_bytes);
int clamor_driver_set_peer(int worker_id, const char *host, int port);
/* A worker copies pages from the arena's memfd (transport "shm-copy"): its copies reach
 * the directory by notices that can come after the next stage start, so from now on
 * every written page is invalidated on every worker, as with workers that map in place. */
void clamor_driver_note_shm_copies(void);
void clamor_driver_drop_worker(int worker_id);
void clamor_driver_get_stats(clamor_driver_stats *out);
uint64_t clamor_driver_page_stats(uint64_t first, uint64_t n, uint64_t *requests,
                                  uint64_t *driver_bytes, uint64_t *peer_bytes,
                                  uint32_t *holders, uint32_t *version);
int clamor_driver_read_version(uint64_t page, uint32_t epoch, uint8_t *out);
/* The version each page of a worker's resident read set (clamor_worker_resident_runs:
 * runs of pages, no versions) has at `epoch`, page after page, up to `cap` into out.
 * Returns how many pages the runs hold; -1 for a run outside the arena, or when no pager
 * runs. Exact while no newer epoch dropped a version <= epoch: the executor asks before
 * the next stage start. */
int64_t clamor_driver_versions_at(const uint64_t *runs, uint64_t n, uint32_t epoch, uint32_t *out, uint64_t cap);
/* The directory's holders of pages [first, first + n): counts[i] workers hold the
 * current version of page first + i (0 past the arena's end), and their ids, ascending,
 * page after page, go into ids, the first `cap` of them. Returns how many ids there
 * were: more than cap means the list was cut (call again with room for them). */
uint64_t clamor_driver_page_holders(uint64_t first, uint64_t n, uint32_t *counts, uint16_t *ids, uint64_t cap);
/* Frees version-log entries that no epoch >= floor reads; returns the bytes freed.
 * The floor only rises; requests for older epochs are refused from then on. */
uint64_t clamor_driver_trim_log(uint32_t floor);

/* Exit statuses of a worker whose fault handler cannot go on (the faulting
 * thread cannot be given an exception); runtime/exitcodes.py names them. */
enum {
    CLAMOR_EXIT_DRIVER_UNREACHABLE = 70,
    CLAMOR_EXIT_PAGE_ERROR = 73
};

/* ----------------------------------------------------------- worker pager --
 * The reserved arena range, the userfaultfd handler thread that fetches and
 * installs pages read-only, per-task read sets, and the worker's page server. */

typedef struct {
    uint64_t faults;            /* missing-page faults (a fetch was needed) */
    uint64_t soft_faults;       /* minor faults on cached or mapped pages (read-set tracking) */
    uint64_t pipelined_faults;  /* faults of several threads fetched together in one stream */
    uint64_t subpage_maps;      /* first touches that mapped one OS page of a larger page in place */
    uint64_t pages_fetched;
    uint64_t bytes_fetched;
    uint64_t from_shm;          /* pages copied from the driver's memfd */
    uint64_t from_driver;       /* pages received from the driver over TCP */
    uint64_t from_peers;        /* pages received from peers */
    uint64_t redirects;
    uint64_t peer_fallbacks;    /* redirects whose peer failed: refetched from the driver */
    uint64_t readahead_pages;
    uint64_t cached_pages;
    uint64_t invalidations;
    uint64_t pages_served;      /* by this worker's page server to peers */
    uint64_t bytes_served;
    uint64_t auth_failures;
    uint64_t bad_requests;
    uint64_t evictions;         /* pages evicted to stay under the cache limit (not invalidations) */
    uint64_t cache_limit_pages; /* 0: unlimited */
    uint64_t pages_mapped;      /* zero copy: page versions mapped from the driver (first mapping; later ones are soft faults) */
    uint64_t shootdowns;        /* zero copy: pages unmapped before a driver write */
    uint64_t prefetched_pages;  /* made resident by clamor_worker_prefetch (mapped or fetched) */
    uint64_t prefetch_requests; /* GET requests prefetch sent (runs of pages batched, pipelined) */
    uint64_t pending_waits;     /* peer requests this page server held until its own copy arrived */
    uint64_t pending_timeouts;  /* ... of which it answered NOT_HELD after the bounded wait */
    uint64_t faultaround_pages; /* pages mapped with a faulting neighbour in its aligned block, without a fault of their own */
    uint64_t unmap_all;         /* task starts that unmapped the whole range (exact read sets, or an epoch its mappings do not serve) */
    uint64_t updated_in_place;  /* zero copy: pages the driver wrote between stages that stayed mapped, showing the new version */
    uint64_t rows_gathered;     /* rows clamor_worker_gather copied (from the driver's memory on its host, or asked of it) */
    uint64_t rows_from_driver;  /* ... of which asked of the driver (CL_ROWS) */
    uint64_t shm_row_bytes;     /* bytes of the rest: copied from the driver's memory on its host */
} clamor_worker_stats;

int clamor_worker_start(int worker_id, uint64_t arena_size, uint64_t page_size,
                        const uint8_t *token, size_t token_len,
                        const char *driver_host, int driver_port,
                        const char *shm_arena_path, const char *shm_state_path,
                        const char *shm_zap_path, const char *bind_host, int readahead,
                        const clamor_tls_pem *tls, char *err, size_t errlen);
void *clamor_worker_base(void);
int clamor_worker_port(void);
/* Read sets (worker_read_sets.c): exact (each task starts with the range unmapped and records
 * the pages it faults) or resident (the default: mappings stay across tasks while their
 * versions serve the task's epoch, and a task's read set is every page resident since). */
void clamor_worker_set_exact_read_sets(int exact);
void clamor_worker_begin_task(uint32_t epoch);
/* Exact mode: the running (or last) task's read set, in the order first touched: fills up
 * to `cap` pairs and returns how many there are (0 in resident mode: see below). */
uint64_t clamor_worker_end_task(uint64_t *pages, uint32_t *versions, uint64_t cap);
/* Resident mode: the resident read set as runs of pages, two words a run (the first page;
 * the count, with a zero version in the high half: read_sets.RUN's layout on a
 * little-endian machine): every aligned block of `block` pages that holds a resident
 * page, whole (a superset: scattered lookups leave a page resident here and there, and a
 * run each would be a report of megabytes). No versions: a page shows the version the
 * driver's page has at the task's epoch, which the driver reads itself
 * (clamor_driver_versions_at). Fills up to `cap` runs and returns how many there are; -1
 * in exact mode (use clamor_worker_end_task). */
int64_t clamor_worker_resident_runs(uint64_t block, uint64_t *runs, uint64_t cap);
/* Resident mode: a number that changes whenever the resident read set does (0 in exact
 * mode), so that an unchanged set need not be read and encoded again. */
uint64_t clamor_worker_read_set_generation(void);
void clamor_worker_invalidate(uint32_t epoch, const uint64_t *pages, uint64_t n);
void clamor_worker_get_stats(clamor_worker_stats *out);
int clamor_worker_touch(uint64_t offset, uint64_t length);
/* Caps the page cache at `pages` pages (0: unlimited); call after start. Pages
 * beyond it are evicted with CLOCK before a new one is installed, and the
 * driver's directory is told. Lowering it takes effect at the next install. */
void clamor_worker_set_cache_limit(uint64_t pages);
/* Makes pages (sorted, unique page numbers) resident for the running task, recorded in its
 * read set: mapped from the driver (same host), from the cache, or fetched from the driver
 * with many requests in flight. Returns how many are resident; the others fault as usual. */
uint64_t clamor_worker_prefetch(const uint64_t *pages, uint64_t n);
/* The same for the rows a task reads of an array at arena offset `start`: row r (of
 * `axis_len`; a negative one counts from the end) is the `row_bytes` at start + r *
 * stride. Rows of at most an OS page go by their OS pages, larger ones by arena pages;
 * pages already mapped in place are skipped. -1: a row is out of bounds (nothing done). */
int64_t clamor_worker_prefetch_rows(uint64_t start, int64_t stride, uint64_t row_bytes, const int64_t *rows,
                                    uint64_t n, int64_t axis_len);
/* Copies the rows a task reads into `out`, without bringing in their pages, where the
 * worker keeps resident read sets: row i is the `row_bytes` at arena offset offsets[i], as
 * the task's epoch reads it. On the driver's host, a row whose pages the driver's memory
 * shows at that epoch is copied from it (its pages' state words checked before and after);
 * every other row is asked of the driver in CL_ROWS requests (a large gather in several).
 * The pages join the resident read set. 0: done; -1: not here (no pager, exact read sets:
 * make the pages resident and read them instead); -2: a row leaves the arena; a cl_error
 * code > 0: the driver refused (CL_ERR_NO_VERSION: the epoch is gone). */
int clamor_worker_gather(const uint64_t *offsets, uint64_t n, uint64_t row_bytes, uint8_t *out);

/* ---------------------------------------------------------- checkpoints --
 * (runtime/data/checkpoint.py; issue 4 item 5) Save and re-create the arena's
 * live extent blocks at the same offsets. Slab objects (requests below the
 * page size) are not listed: ArenaRefs only name arrays of at least a page.
 *
 * list_blocks: fills up to `cap` (offset, size) pairs, in offset order, and
 * returns how many blocks there are (call again with a larger buffer if that
 * is more than `cap`). Sizes are the blocks' usable sizes (4 KiB multiples).
 * reserve: marks [offset, offset + nbytes) as one live block, as if it had
 * been allocated there (free it with clamor_arena_free(base + offset)); -1
 * and a message if the range is not 4 KiB aligned, leaves the arena, or
 * overlaps anything already allocated. */
uint64_t clamor_arena_list_blocks(uint64_t *offsets, uint64_t *sizes, uint64_t cap);
int clamor_arena_reserve(uint64_t offset, uint64_t nbytes, char *err, size_t errlen);
