/* The driver pager's state, shared by its two halves (private to them):
 * driver_versions.c (write traps, page versions, stage starts) and driver_pager.c
 * (the page server, start and stop, inspection). driver_pager.c's opening comment
 * says how it works. */
#ifndef CLAMOR_DRIVER_STATE_H
#define CLAMOR_DRIVER_STATE_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "clamor.h"
#include "directory.h"
#include "page_server.h"
#include "pager_common.h"
#include "write_tracking.h"

#define FL_PROTECTED 1
#define FL_DIRTY 2
#define FL_WRITTEN 4 /* written while no old version was needed (no copy, maybe no trap) */
#define UFFD_FEATURE_WP_UNPOPULATED_ (1 << 13) /* newer than the build headers */
#ifndef UFFDIO_CONTINUE_MODE_WP
#define UFFDIO_CONTINUE_MODE_WP ((__u64)1 << 1)
#endif

typedef struct logent {
    uint32_t version, valid_until;
    struct logent *next;
    uint8_t data[];
} logent;

typedef struct {
    uint32_t ip, port;
} peer;

_Static_assert(CL_MAX_WORKERS == CLAMOR_MAX_WORKERS, "protocol.h and api.h disagree on the worker limit");

typedef struct {
    int running;
    uint8_t *base;
    const uint8_t *view; /* the arena's memfd mapped again, read-only and untracked: the page server
                            and the version log read here, never faulting on a parked chunk */
    uint64_t ps, npages;
    int uffd, stop_efd, state_fd, zap_fd;
    void *zap; /* the shoot-down area, shared with same-host workers */
    pthread_t wp_thread;
    _Atomic uint64_t *state; /* version << 1 | dirty; read by same-host workers */
    uint32_t *version;
    uint8_t *flags;
    cl_dir dir; /* which workers hold each page (directory.h) */
    uint64_t *requests, *driver_bytes, *peer_bytes;
    logent **log;
    cl_stripes stripes;
    pthread_mutex_t stage; /* serialises begin_stage with the write handler */
    _Atomic uint32_t epoch;
    _Atomic uint32_t floor; /* epochs below it are no longer served: their versions were freed */
    _Atomic uint32_t released; /* no stage reads epochs <= it any more: writes need no copy */
    int wrote_uncopied;        /* since the last release: a write that kept no old bytes */
    uint64_t marked;           /* pages mark_written was told of (stage lock held) */
    cl_wtrack *wt;             /* async write tracking; NULL where the kernel lacks it */
    uint64_t *inval, ninval, inval_cap;
    int replication;
    peer peers[CL_MAX_WORKERS];
    cl_server *server;
    cl_tls_ctx *tls; /* NULL: plaintext page protocol */
    clamor_driver_stats st;
} cl_driver_state;

extern cl_driver_state D __attribute__((visibility("hidden")));

#define ADD(field, n) __atomic_fetch_add(&D.st.field, (n), __ATOMIC_RELAXED)


/* The close order of the Python-facing API: every clamor_driver_* call below holds
 * `api` for reading while it touches D; start and stop hold it for writing. A call
 * racing a stop therefore sees either the running tables or D.running == 0 (and
 * answers "not running"), never freed memory. Outside D, so free_tables' memset
 * leaves it alone. The page server's and the write handler's threads take no part:
 * stop ends them before it frees anything. */
extern pthread_rwlock_t api __attribute__((visibility("hidden")));
#define API_READ() pthread_rwlock_rdlock(&api)
#define API_WRITE() pthread_rwlock_wrlock(&api)
#define API_DONE() pthread_rwlock_unlock(&api)

/* The write handler thread (driver_versions.c): serves the trapping userfaultfd. */
void *cl_driver_fault_main(void *arg) __attribute__((visibility("hidden")));

#endif
