/* The worker's connections to the driver and its peers (worker_conn.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pager_common.h"
#include "worker_base.h"
#include "worker_conn.h"

static struct {
    uint8_t *token;
    size_t token_len;
    cl_tls_ctx *tls; /* NULL: plaintext page protocol */
    uint32_t drv_ip;
    int drv_port, drv_fd;
    int peer_fd[CL_MAX_WORKERS];
    uint32_t peer_ip[CL_MAX_WORKERS], peer_port[CL_MAX_WORKERS];
    int shm_fd; /* the driver's arena memfd, when on the same host */
    const _Atomic uint64_t *shm_state;
    const uint8_t *shm_view; /* the memfd mapped read-only whole: a gather copies rows from it */
} N;

int conn_init(const uint8_t *token, size_t token_len, const char *driver_host, int driver_port,
              const clamor_tls_pem *tls, char *err, size_t errlen) {
    memset(&N, 0, sizeof N);
    N.drv_fd = -1, N.shm_fd = -1, N.drv_port = driver_port;
    for (int i = 0; i < CL_MAX_WORKERS; i++) N.peer_fd[i] = -1;
    N.token = malloc(token_len ? token_len : 1);
    memcpy(N.token, token, token_len);
    N.token_len = token_len;
    if (cl_resolve(driver_host, &N.drv_ip)) return CL_ERR("cannot resolve the driver host %s", driver_host);
    if (tls) {
        N.tls = cl_tls_new(tls->ca, tls->ca_len, tls->cert, tls->cert_len, tls->key, tls->key_len, err, errlen);
        if (!N.tls) return -1;
    }
    return 0;
}

static void *map_fd(int fd, uint64_t len) {
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void *map_file(const char *path, uint64_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    void *p = map_fd(fd, len);
    close(fd);
    return p;
}

int conn_open_shm(const char *arena_path, const char *state_path, int writable, uint64_t npages,
                  uint64_t page_size, char *err, size_t errlen) {
    N.shm_fd = open(arena_path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    N.shm_state = map_file(state_path, npages * sizeof(uint64_t));
    N.shm_view = N.shm_fd < 0 ? NULL : map_fd(N.shm_fd, npages * page_size);
    if (N.shm_fd < 0 || !N.shm_state || !N.shm_view)
        return CL_ERR("cannot map the driver's shared memory (%s): %s", arena_path, strerror(errno));
    return 0;
}

cl_tls_ctx *conn_tls(void) { return N.tls; }

int conn_shm_fd(void) { return N.shm_fd; }

const uint8_t *conn_shm_view(void) { return N.shm_view; }

uint64_t conn_shm_state(uint64_t p) { return atomic_load(&N.shm_state[p]); }
void conn_shm_prefetch(uint64_t p) { __builtin_prefetch(&N.shm_state[p], 0); }

/* Connects to a page server: TLS first when the cluster uses it, then the token. */
static int connect_authenticated(uint32_t ip, int port, int timeout_ms) {
    int fd = cl_connect(ip, port, timeout_ms);
    if (fd < 0) return -1;
    char why[256];
    if (N.tls && cl_tls_connect(N.tls, fd, why, sizeof why)) {
        cl_log("worker %d: TLS handshake with %u.%u.%u.%u:%d failed: %s", worker_id(), ip >> 24, (ip >> 16) & 255,
               (ip >> 8) & 255, ip & 255, port, why);
        cl_close(fd);
        return -1;
    }
    if (cl_client_handshake(fd, N.token, N.token_len, (uint32_t)worker_id())) {
        cl_close(fd);
        return -1;
    }
    return fd;
}

void conn_reset_driver(void) {
    cl_close(N.drv_fd);
    N.drv_fd = -1;
}

int conn_driver(uint64_t page) {
    for (int attempt = 0; N.drv_fd < 0; attempt++) {
        if (attempt == 10) die(EXIT_DRIVER_UNREACHABLE, "cannot reach the driver's page server", page);
        if (attempt) usleep(200000u * (unsigned)attempt);
        N.drv_fd = connect_authenticated(N.drv_ip, N.drv_port, DRIVER_TIMEOUT_MS);
    }
    return N.drv_fd;
}

void conn_tell(uint64_t p, uint32_t v, uint32_t source) {
    cl_msg h = cl_make(CL_HAVE, p, v, source);
    if (cl_send_msg(conn_driver(p), &h, NULL)) conn_reset_driver();
}

/* On the fault thread's own driver connection, so it stays ordered with the
 * GETs and HAVEs for the same page. A notice lost with a broken connection
 * only leaves a stale holder bit: a peer redirected here gets NOT_HELD and
 * falls back to the driver. */
void conn_tell_dropped(uint64_t p) {
    cl_msg h = cl_make(CL_HAVE, p, 0, 0);
    h.flags = CL_HAVE_DROPPED;
    if (cl_send_msg(conn_driver(p), &h, NULL)) conn_reset_driver();
}

int conn_peer(uint32_t peer, uint32_t ip, uint32_t port) {
    if (peer >= CL_MAX_WORKERS || peer == (uint32_t)worker_id()) return -1;
    int *fd = &N.peer_fd[peer];
    if (*fd >= 0 && (N.peer_ip[peer] != ip || N.peer_port[peer] != port)) cl_close(*fd), *fd = -1;
    if (*fd < 0) {
        *fd = connect_authenticated(ip, (int)port, PEER_TIMEOUT_MS);
        if (*fd < 0) return -1;
        N.peer_ip[peer] = ip, N.peer_port[peer] = port;
    }
    return *fd;
}

int conn_peer_fd(uint32_t peer) { return peer < CL_MAX_WORKERS ? N.peer_fd[peer] : -1; }

void conn_peer_close(uint32_t peer) {
    if (peer < CL_MAX_WORKERS && N.peer_fd[peer] >= 0) cl_close(N.peer_fd[peer]), N.peer_fd[peer] = -1;
}
