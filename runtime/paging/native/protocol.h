/* The page protocol: fixed 40-byte little-endian headers, an HMAC-SHA256
 * challenge over the cluster token at the start of every connection, and
 * blocking socket helpers shared by the page servers and the fault handler. */
#ifndef CLAMOR_PROTOCOL_H
#define CLAMOR_PROTOCOL_H
#include <stddef.h>
#include <stdint.h>

#define CL_MAGIC 0x504d4c43u /* "CLMP" */
#define CL_PROTO_VERSION 1
#define CL_NONCE 32
#define CL_MAC 32
#define CL_ANY_CLIENT 0xffffffffu   /* a client that is not a worker */
#define CL_OPEN_ENDED 0xffffffffu   /* valid_until of a page's current version */
#define CL_MAX_BATCH 1024           /* pages in one read-ahead request */
#define CL_MAX_WORKERS 1024         /* worker ids 0..1023: CLAMOR_MAX_WORKERS (api.h) says why */
#define CL_MAX_ROWS (1u << 20)      /* rows in one CL_ROWS request */
#define CL_MAX_ROWS_BYTES (64u << 20) /* bytes of rows in one CL_ROWS answer */

enum cl_type {
    CL_HELLO = 1,    /* server -> client: nonce */
    CL_AUTH = 2,     /* client -> server: aux=client id; nonce, mac */
    CL_AUTH_OK = 3,  /* server -> client: mac */
    CL_GET = 4,      /* page, epoch, aux=count, flags, aux2=failed peer + 1 */
    CL_PAGE = 5,     /* page, epoch=version, aux=valid_until; payload: the page */
    CL_REDIRECT = 6, /* page, epoch=version, aux=peer id, aux2=peer IPv4, flags=peer port */
    CL_ERROR = 7,    /* page, aux=error code */
    CL_HAVE = 8,     /* client -> driver: page, epoch=version, aux=source (0 shm, peer + 1),
                        flags=cl_have_flags */
    CL_ROWS = 9,     /* client -> driver: epoch, aux=rows, aux2=row bytes; payload: each row's
                        arena offset (uint64). driver -> client: epoch, aux=rows; payload: the
                        rows' bytes at the latest version <= epoch, in order */
};

enum cl_error {
    CL_ERR_BAD_REQUEST = 1,
    CL_ERR_PAGE_RANGE = 2,
    CL_ERR_NO_VERSION = 3,
    CL_ERR_NOT_HELD = 4,
    CL_ERR_AUTH = 5,
};

/* CL_GET_BATCH_REDIRECT: each page of a batch may be answered with REDIRECT instead of
 * PAGE (the client handles both, in order); without it only one-page GETs are. */
enum cl_get_flags { CL_GET_NO_REDIRECT = 1, CL_GET_BATCH_REDIRECT = 2 };

/* CL_HAVE_DROPPED: the client evicted the page for room and no longer holds any
 * version of it (epoch and aux unused); the driver clears its holder bit so it
 * never redirects a peer there. */
enum cl_have_flags { CL_HAVE_DROPPED = 1 };

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint64_t page;
    uint32_t epoch;
    uint32_t aux;
    uint32_t flags;
    uint32_t aux2;
    uint64_t length;
} cl_msg;

#define CL_HEADER 40

/* Socket I/O. Each helper goes through the fd's TLS session when it has one
 * (cl_tls_accept / cl_tls_connect), else straight to the socket. */
int cl_send_all(int fd, const void *buf, size_t len);
int cl_recv_all(int fd, void *buf, size_t len);
/* Sends a header (converted to little-endian) followed by `length` payload bytes. */
int cl_send_msg(int fd, const cl_msg *m, const void *payload);
/* Receives a header; -1 on I/O error, -2 on a bad magic or protocol version. */
int cl_recv_msg(int fd, cl_msg *m);
cl_msg cl_make(uint16_t type, uint64_t page, uint32_t epoch, uint32_t aux);
const char *cl_error_name(uint32_t code);

int cl_listen(const char *host, int port, int *bound_port, char *err, size_t errlen);
int cl_connect(uint32_t ipv4_host_order, int port, int timeout_ms);
int cl_resolve(const char *host, uint32_t *ipv4_host_order);
void cl_set_timeouts(int fd, int timeout_ms);

/* Handshakes: 0 on success, -1 on failure (the server also replies CL_ERROR). */
int cl_client_handshake(int fd, const uint8_t *token, size_t token_len, uint32_t client_id);
int cl_server_handshake(int fd, const uint8_t *token, size_t token_len, uint32_t *client_id);

/* ---------------------------------------------------------------- TLS --
 * (tls.c) Optional mutual TLS. A context holds the cluster CA, certificate and
 * key (PEM in memory); a handshake attaches a session to the fd, which every
 * I/O helper above then uses. Sockets that may carry TLS are ended with
 * cl_hangup (sends close_notify, shuts the socket) and closed with cl_close. */
#define CL_TLS_NAME "clamor-cluster" /* the name in the cluster certificate */
typedef struct ssl_ctx_st cl_tls_ctx;
cl_tls_ctx *cl_tls_new(const char *ca, size_t ca_len, const char *cert, size_t cert_len,
                       const char *key, size_t key_len, char *err, size_t errlen);
void cl_tls_ref(cl_tls_ctx *ctx);
void cl_tls_free(cl_tls_ctx *ctx);
/* 0 on success; -1 with the reason in `why` (the fd is left open, without TLS). */
int cl_tls_accept(cl_tls_ctx *ctx, int fd, char *why, size_t whylen);
int cl_tls_connect(cl_tls_ctx *ctx, int fd, char *why, size_t whylen);
void *cl_tls_of(int fd); /* the fd's SSL session, NULL for plaintext */
int cl_tls_write_all(void *ssl, const void *buf, size_t len);
int cl_tls_read_all(void *ssl, void *buf, size_t len);
void cl_hangup(int fd);
void cl_close(int fd);

void cl_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
