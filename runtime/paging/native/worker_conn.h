/* The worker's connections to the driver (worker_conn.c): the page protocol's TCP
 * connection to the driver, those to peers, and on the driver's host its arena memfd
 * and page state table, mapped here.
 *
 * Lock: the fetch lock (worker_fetch.h) serialises every use of the driver connection
 * and the peer connections. The memfd and the state table are read-only here.
 * Calls no other worker file but worker_base. */
#ifndef CLAMOR_WORKER_CONN_H
#define CLAMOR_WORKER_CONN_H
#include <stddef.h>
#include <stdint.h>

#include "clamor.h"
#include "protocol.h"

#define DRIVER_TIMEOUT_MS 60000
#define PEER_TIMEOUT_MS 5000

#pragma GCC visibility push(hidden)

/* Where the driver's page server is, the token and TLS material to show it and the
 * peers (`tls` NULL: plaintext); nothing is connected yet. -1 and a message on failure. */
int conn_init(const uint8_t *token, size_t token_len, const char *driver_host, int driver_port,
              const clamor_tls_pem *tls, char *err, size_t errlen);
/* On the driver's host: opens its arena memfd (read-write where zero copy maps it in
 * place, else read-only) and maps it read-only whole (npages of page_size), and its page
 * state table of npages words. */
int conn_open_shm(const char *arena_path, const char *state_path, int writable, uint64_t npages,
                  uint64_t page_size, char *err, size_t errlen);

/* The TLS context (NULL: plaintext), which this worker's page server serves with too. */
cl_tls_ctx *conn_tls(void);

/* The driver connection, made (again) if needed; a driver that cannot be reached
 * exits the worker (EXIT_DRIVER_UNREACHABLE). `page`: what it was needed for. */
int conn_driver(uint64_t page);
/* The driver connection broke: the next conn_driver makes a new one. */
void conn_reset_driver(void);
/* CL_HAVE: this worker holds page p at version v, got from the driver's memfd
 * (source 0) or peer source - 1; or (dropped) no longer holds p. */
void conn_tell(uint64_t p, uint32_t v, uint32_t source);
void conn_tell_dropped(uint64_t p);

/* The connection to peer `peer` at ip:port (kept between requests, made anew when the
 * peer's address changed); -1 if it is this worker, out of range or unreachable. */
int conn_peer(uint32_t peer, uint32_t ip, uint32_t port);
/* The connection to `peer` as it stands (-1: none), and closing it. */
int conn_peer_fd(uint32_t peer);
void conn_peer_close(uint32_t peer);

/* The driver's arena memfd (-1: not on its host), and page p's state word there
 * (version << 1 | dirty: pager_common.h). */
int conn_shm_fd(void);
uint64_t conn_shm_state(uint64_t p);
/* Starts bringing page p's state word into the cache (a scattered read soon). */
void conn_shm_prefetch(uint64_t p);
/* The driver's arena memfd mapped read-only (NULL: not on its host). Its bytes are a
 * page's version only while the page's state word says so (check, copy, check again). */
const uint8_t *conn_shm_view(void);

#pragma GCC visibility pop

#endif
