/* The worker pager's counters, id and exit (worker_base.h). */
#include <string.h>
#include <unistd.h>

#include "protocol.h"
#include "worker_base.h"

static struct {
    int id;
    clamor_worker_stats st;
} B;

void worker_base_reset(int id) {
    memset(&B, 0, sizeof B);
    B.id = id;
}

int worker_id(void) { return B.id; }

clamor_worker_stats *worker_stats(void) { return &B.st; }

void die(int status, const char *why, uint64_t page) {
    cl_log("worker %d: %s (page %llu); exiting with status %d", B.id, why, (unsigned long long)page, status);
    _exit(status);
}
