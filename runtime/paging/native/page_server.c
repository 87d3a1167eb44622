/* Native page server shared by the driver and the workers. */
#include "page_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IDLE_TIMEOUT_MS (24 * 3600 * 1000) /* connections are long-lived */
#define HANDSHAKE_TIMEOUT_MS 5000
/* Connections served at once before they prove the token: a flood of idle ones beyond it
 * is closed at once, so it cannot hold the process's file descriptors and threads. */
#define PENDING_LIMIT 64
/* How often the acceptor, idle, joins finished connection threads and closes their fds. */
#define REAP_INTERVAL_MS 1000

typedef struct conn {
    pthread_t thread;
    int fd;
    char ip[INET_ADDRSTRLEN]; /* the client's, for log lines */
    atomic_int done;
    struct cl_server *server;
    struct conn *next;
} conn;

struct cl_server {
    int listen_fd, port;
    uint8_t *token;
    size_t token_len;
    cl_tls_ctx *tls; /* NULL: plaintext */
    cl_service svc;
    pthread_t acceptor;
    pthread_mutex_t lock;
    conn *conns;
    atomic_int stopping;
    atomic_int pending; /* connections not through their handshake yet */
};

static void count(uint64_t *counter, uint64_t n) {
    if (counter) __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

static int send_error(int fd, uint64_t page, uint32_t code) {
    cl_msg e = cl_make(CL_ERROR, page, 0, code);
    return cl_send_msg(fd, &e, NULL);
}

/* Answers one GET (possibly a batch); returns -1 when the connection must close. */
static int serve_get(cl_server *s, int fd, uint32_t client, const cl_msg *req, uint8_t *buf) {
    const cl_service *svc = &s->svc;
    uint64_t n = req->aux ? req->aux : 1;
    if (req->length != 0 || n > CL_MAX_BATCH) {
        count(svc->bad_requests, 1);
        send_error(fd, req->page, CL_ERR_BAD_REQUEST);
        return -1;
    }
    if (req->page >= svc->num_pages || n > svc->num_pages - req->page) {
        count(svc->bad_requests, 1);
        return send_error(fd, req->page, CL_ERR_PAGE_RANGE);
    }
    /* A batch is answered page by page, each PAGE or (with CL_GET_BATCH_REDIRECT) REDIRECT. */
    int may_redirect = (n == 1 || (req->flags & CL_GET_BATCH_REDIRECT)) && !(req->flags & CL_GET_NO_REDIRECT);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t page = req->page + i;
        cl_answer a = {0};
        svc->answer(svc->ctx, client, req, page, may_redirect, buf, &a);
        if (a.kind == CL_ANSWER_ERROR) {
            if (a.error == CL_ERR_BAD_REQUEST || a.error == CL_ERR_NO_VERSION) count(svc->bad_requests, 1);
            return send_error(fd, page, a.error);
        }
        if (a.kind == CL_ANSWER_REDIRECT) {
            cl_msg r = cl_make(CL_REDIRECT, page, a.version, a.peer_id);
            r.aux2 = a.peer_ip;
            r.flags = a.peer_port;
            if (cl_send_msg(fd, &r, NULL)) return -1;
            continue;
        }
        cl_msg p = cl_make(CL_PAGE, page, a.version, a.valid_until);
        p.length = svc->page_size;
        if (cl_send_msg(fd, &p, buf)) return -1;
        count(svc->pages_served, 1);
        count(svc->bytes_served, svc->page_size);
    }
    return 0;
}

/* Answers one CL_ROWS: reads the rows' offsets, checks that each row lies in the arena,
 * and sends their bytes as the owner reads them at the request's epoch. A request that
 * breaks the framing or the limits closes the connection (-1); one the owner refuses (an
 * epoch it cannot serve) is answered CL_ERROR and the connection stays. */
static int serve_rows(cl_server *s, int fd, uint32_t client, const cl_msg *req) {
    const cl_service *svc = &s->svc;
    uint64_t n = req->aux, row = req->aux2, arena = svc->num_pages * svc->page_size;
    if (!svc->rows || !n || !row || n > CL_MAX_ROWS || n * row > CL_MAX_ROWS_BYTES || req->length != 8 * n) {
        count(svc->bad_requests, 1);
        send_error(fd, 0, CL_ERR_BAD_REQUEST);
        return -1;
    }
    uint64_t *offsets = malloc(8 * n);
    uint8_t *out = malloc(n * row);
    int rc = -1;
    if (!offsets || !out || cl_recv_all(fd, offsets, 8 * n)) goto done;
    uint32_t error = 0;
    for (uint64_t i = 0; i < n && !error; i++)
        if (offsets[i] > arena || row > arena - offsets[i]) error = CL_ERR_PAGE_RANGE;
    if (!error) error = svc->rows(svc->ctx, client, req->epoch, offsets, n, row, out);
    if (error) {
        count(svc->bad_requests, 1);
        rc = send_error(fd, 0, error);
        goto done;
    }
    cl_msg a = cl_make(CL_ROWS, 0, req->epoch, (uint32_t)n);
    a.length = n * row;
    rc = cl_send_msg(fd, &a, out);
    if (!rc) count(svc->rows_served, n), count(svc->bytes_served, n * row);
done:
    free(offsets);
    free(out);
    return rc;
}

/* Logs a refused connection; at most LOG_BURST lines per LOG_WINDOW seconds,
 * so a flood of bad clients cannot flood the log. */
#define LOG_BURST 10
#define LOG_WINDOW 10
static void log_refusal(const char *ip, const char *why) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static time_t window;
    static unsigned logged, suppressed;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&lock);
    if (now.tv_sec - window >= LOG_WINDOW) window = now.tv_sec, logged = 0;
    int show = logged < LOG_BURST;
    unsigned skipped = show ? suppressed : 0;
    if (show) logged++, suppressed = 0;
    else suppressed++;
    pthread_mutex_unlock(&lock);
    if (!show) return;
    if (skipped)
        cl_log("page server: refused a connection from %s: %s (%u similar messages suppressed)", ip, why, skipped);
    else
        cl_log("page server: refused a connection from %s: %s", ip, why);
}

static void *conn_main(void *arg) {
    conn *c = arg;
    cl_server *s = c->server;
    uint32_t client = CL_ANY_CLIENT;
    char why[300] = "authentication failed", reason[256];
    cl_set_timeouts(c->fd, HANDSHAKE_TIMEOUT_MS);
    int refused = 0;
    if (s->tls && cl_tls_accept(s->tls, c->fd, reason, sizeof reason)) {
        snprintf(why, sizeof why, "TLS handshake failed: %s", reason);
        refused = 1;
    }
    if (refused || cl_server_handshake(c->fd, s->token, s->token_len, &client)) {
        atomic_fetch_sub(&s->pending, 1);
        if (!atomic_load(&s->stopping)) {
            log_refusal(c->ip, why);
            count(s->svc.auth_failures, 1);
        }
        goto out;
    }
    atomic_fetch_sub(&s->pending, 1);
    cl_set_timeouts(c->fd, IDLE_TIMEOUT_MS);
    uint8_t *buf = malloc(s->svc.page_size);
    if (!buf) goto out;
    for (;;) {
        cl_msg m;
        int rc = cl_recv_msg(c->fd, &m);
        if (rc == -1) break;
        if (rc == -2) {
            count(s->svc.bad_requests, 1);
            send_error(c->fd, 0, CL_ERR_BAD_REQUEST);
            break;
        }
        if (m.type == CL_GET) {
            if (serve_get(s, c->fd, client, &m, buf)) break;
        } else if (m.type == CL_ROWS) {
            if (serve_rows(s, c->fd, client, &m)) break;
        } else if (m.type == CL_HAVE && m.length == 0 && s->svc.have) {
            if (m.page < s->svc.num_pages) s->svc.have(s->svc.ctx, client, &m);
            else count(s->svc.bad_requests, 1);
        } else {
            count(s->svc.bad_requests, 1);
            send_error(c->fd, m.page, CL_ERR_BAD_REQUEST);
            break;
        }
    }
    free(buf);
out:
    cl_hangup(c->fd);
    atomic_store(&c->done, 1);
    return NULL;
}

/* Joins finished connection threads; with `all`, every thread. Lock held. */
static void reap(cl_server *s, int all) {
    conn **pp = &s->conns;
    while (*pp) {
        conn *c = *pp;
        if (all || atomic_load(&c->done)) {
            if (all) shutdown(c->fd, SHUT_RDWR);
            pthread_join(c->thread, NULL);
            cl_close(c->fd);
            *pp = c->next;
            free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void *accept_main(void *arg) {
    cl_server *s = arg;
    for (;;) {
        struct pollfd ready = {.fd = s->listen_fd, .events = POLLIN};
        if (poll(&ready, 1, REAP_INTERVAL_MS) == 0) { /* idle: free what ended meanwhile */
            if (atomic_load(&s->stopping)) break;
            pthread_mutex_lock(&s->lock);
            reap(s, 0);
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        struct sockaddr_in sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
        if (atomic_load(&s->stopping)) {
            if (fd >= 0) close(fd);
            break;
        }
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
                if (errno == EMFILE || errno == ENFILE) usleep(10000);
                continue;
            }
            break;
        }
        char ip[INET_ADDRSTRLEN];
        if (!inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip)) strcpy(ip, "?");
        if (atomic_load(&s->pending) >= PENDING_LIMIT) {
            close(fd);
            log_refusal(ip, "too many connections still proving the token");
            continue;
        }
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->server = s;
        memcpy(c->ip, ip, sizeof ip);
        pthread_mutex_lock(&s->lock);
        reap(s, 0);
        atomic_fetch_add(&s->pending, 1);
        if (pthread_create(&c->thread, NULL, conn_main, c)) {
            atomic_fetch_sub(&s->pending, 1);
            close(fd);
            free(c);
        } else {
            c->next = s->conns;
            s->conns = c;
        }
        pthread_mutex_unlock(&s->lock);
    }
    return NULL;
}

cl_server *cl_server_start(const char *host, int port, const uint8_t *token, size_t token_len,
                           cl_tls_ctx *tls, const cl_service *service, char *err, size_t errlen) {
    cl_server *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->svc = *service;
    s->token = malloc(token_len ? token_len : 1);
    memcpy(s->token, token, token_len);
    s->token_len = token_len;
    pthread_mutex_init(&s->lock, NULL);
    s->listen_fd = cl_listen(host, port, &s->port, err, errlen);
    if (s->listen_fd < 0) goto fail;
    if (pthread_create(&s->acceptor, NULL, accept_main, s)) {
        snprintf(err, errlen, "cannot start the page server thread");
        close(s->listen_fd);
        goto fail;
    }
    cl_tls_ref(tls);
    s->tls = tls;
    return s;
fail:
    free(s->token);
    free(s);
    return NULL;
}

int cl_server_port(const cl_server *s) { return s->port; }

void cl_server_stop(cl_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
    shutdown(s->listen_fd, SHUT_RDWR);
    pthread_join(s->acceptor, NULL);
    close(s->listen_fd);
    pthread_mutex_lock(&s->lock);
    reap(s, 1);
    pthread_mutex_unlock(&s->lock);
    cl_tls_free(s->tls);
    free(s->token);
    free(s);
}
