/* A native page server: an accept thread plus one thread per authenticated
 * connection. It validates every request (page range, batch size, framing)
 * and asks its owner (driver or worker pager) for the answer to each page. */
#ifndef CLAMOR_PAGE_SERVER_H
#define CLAMOR_PAGE_SERVER_H
#include <pthread.h>
#include <stdint.h>
#include "protocol.h"

typedef enum { CL_ANSWER_PAGE, CL_ANSWER_REDIRECT, CL_ANSWER_ERROR } cl_answer_kind;

typedef struct {
    cl_answer_kind kind;
    uint32_t version;      /* PAGE, REDIRECT */
    uint32_t valid_until;  /* PAGE */
    uint32_t peer_id;      /* REDIRECT */
    uint32_t peer_ip;      /* REDIRECT, host order */
    uint32_t peer_port;    /* REDIRECT */
    uint32_t error;        /* ERROR */
} cl_answer;

typedef struct {
    uint64_t page_size;
    uint64_t num_pages;
    /* Fills `buf` (page_size bytes) for a PAGE answer. `may_redirect` is 0 for
     * requests flagged CL_GET_NO_REDIRECT and for batches without CL_GET_BATCH_REDIRECT. */
    void (*answer)(void *ctx, uint32_t client, const cl_msg *req, uint64_t page,
                   int may_redirect, uint8_t *buf, cl_answer *out);
    /* CL_HAVE notifications (a page got elsewhere, or dropped: CL_HAVE_DROPPED);
     * NULL where the server does not keep a directory. */
    void (*have)(void *ctx, uint32_t client, const cl_msg *m);
    /* CL_ROWS: fills `out` with n rows of row_bytes at arena `offsets` (checked to lie in
     * the arena), as epoch E reads them; 0, or a cl_error code. NULL where the server
     * does not answer rows (a worker's). */
    uint32_t (*rows)(void *ctx, uint32_t client, uint32_t E, const uint64_t *offsets, uint64_t n,
                     uint64_t row_bytes, uint8_t *out);
    void *ctx;
    uint64_t *pages_served, *bytes_served, *auth_failures, *bad_requests, *rows_served;
} cl_service;

typedef struct cl_server cl_server;

/* With `tls` (a reference is taken), every connection must complete mutual TLS
 * before the token handshake; NULL serves plaintext. */
cl_server *cl_server_start(const char *host, int port, const uint8_t *token, size_t token_len,
                           cl_tls_ctx *tls, const cl_service *service, char *err, size_t errlen);
int cl_server_port(const cl_server *s);
/* Closes the listener and every connection and joins all threads. */
void cl_server_stop(cl_server *s);
#endif
