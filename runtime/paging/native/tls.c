/* Optional TLS on page-protocol connections (OpenSSL libssl, TLS 1.2 or newer).
 *
 * A connection keeps its plain `int fd` everywhere; a TLS connection also has
 * an SSL object, found by fd in a table here, and protocol.c's I/O helpers
 * route through it. The table is only consulted once some connection of the
 * process used TLS, so plaintext clusters pay one predictable branch.
 *
 * Sockets are driven through a small custom BIO: send() with MSG_NOSIGNAL
 * (a peer gone mid-write must not raise SIGPIPE) and recv() that retries only
 * on EINTR, so a socket timeout fails the call instead of looping.
 *
 * Both ends present the cluster certificate and verify the peer's against the
 * cluster CA and the name CL_TLS_NAME (mutual TLS); the HMAC token handshake
 * then runs inside the TLS session.
 */
#include "protocol.h"

#include <errno.h>
#include <limits.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ----------------------------------------------------------- fd table -- */

#define CHUNK_BITS 10
#define CHUNK (1 << CHUNK_BITS)
#define CHUNKS 1024 /* TLS connections on fds below 2^20 */

/* Slots are atomic: an fd closed by one thread may be reused by another, which
 * must see its slot cleared (cl_close clears it before closing the fd). */
typedef _Atomic(SSL *) ssl_slot;
static _Atomic(ssl_slot *) table[CHUNKS];
static atomic_int tls_used; /* set once any connection of this process used TLS */

void *cl_tls_of(int fd) {
    if (!atomic_load_explicit(&tls_used, memory_order_relaxed) || fd < 0) return NULL;
    unsigned c = (unsigned)fd >> CHUNK_BITS;
    if (c >= CHUNKS) return NULL;
    ssl_slot *chunk = atomic_load_explicit(&table[c], memory_order_acquire);
    return chunk ? atomic_load_explicit(&chunk[fd & (CHUNK - 1)], memory_order_acquire) : NULL;
}

/* The slot of `fd`, allocating its chunk; NULL if fd is too large or out of memory. */
static ssl_slot *slot(int fd) {
    unsigned c = (unsigned)fd >> CHUNK_BITS;
    if (fd < 0 || c >= CHUNKS) return NULL;
    ssl_slot *chunk = atomic_load_explicit(&table[c], memory_order_acquire);
    if (!chunk) {
        ssl_slot *fresh = calloc(CHUNK, sizeof *fresh);
        if (!fresh) return NULL;
        if (atomic_compare_exchange_strong(&table[c], &chunk, fresh)) chunk = fresh;
        else free(fresh); /* another thread installed it: `chunk` holds theirs */
    }
    return &chunk[fd & (CHUNK - 1)];
}

/* -------------------------------------------------------- socket BIO -- */

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static int bio_fd(BIO *b) { return (int)(intptr_t)BIO_get_data(b); }

static int bio_write(BIO *b, const char *buf, int len) {
    for (;;) {
        ssize_t n = send(bio_fd(b), buf, (size_t)len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        return n < 0 ? -1 : (int)n;
    }
}

static int bio_read(BIO *b, char *buf, int len) {
    for (;;) {
        ssize_t n = recv(bio_fd(b), buf, (size_t)len, 0);
        if (n < 0 && errno == EINTR) continue;
#ifdef BIO_FLAGS_IN_EOF
        if (n == 0) BIO_set_flags(b, BIO_FLAGS_IN_EOF);
#endif
        return n < 0 ? -1 : (int)n;
    }
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)num, (void)ptr;
    switch (cmd) {
    case BIO_CTRL_FLUSH: return 1;
#ifdef BIO_FLAGS_IN_EOF
    case BIO_CTRL_EOF: return BIO_test_flags(b, BIO_FLAGS_IN_EOF) != 0;
#endif
    default: return 0;
    }
}

static int bio_create(BIO *b) {
    BIO_set_init(b, 1);
    return 1;
}

static void bio_init_method(void) {
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "clamor socket");
    if (!m || !BIO_meth_set_write(m, bio_write) || !BIO_meth_set_read(m, bio_read) ||
        !BIO_meth_set_ctrl(m, bio_ctrl) || !BIO_meth_set_create(m, bio_create)) {
        BIO_meth_free(m);
        return;
    }
    bio_method = m;
}

/* ------------------------------------------------------------ context -- */

static int describe_openssl(char *err, size_t errlen, const char *what) {
    unsigned long e = ERR_peek_last_error();
    char reason[256] = "unknown reason";
    if (e) ERR_error_string_n(e, reason, sizeof reason);
    snprintf(err, errlen, "%s: %s", what, reason);
    ERR_clear_error();
    return -1;
}

/* Never prompts for a pass phrase: an encrypted key is an error. */
static int no_password(char *buf, int size, int rwflag, void *u) {
    (void)buf, (void)size, (void)rwflag, (void)u;
    return 0;
}

static BIO *mem_bio(const char *pem, size_t len) {
    return len <= INT_MAX ? BIO_new_mem_buf(pem, (int)len) : NULL;
}

static int load_ca(SSL_CTX *ctx, const char *pem, size_t len, char *err, size_t errlen) {
    BIO *bio = mem_bio(pem, len);
    if (!bio) return describe_openssl(err, errlen, "TLS CA certificate");
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    int n = 0;
    X509 *x;
    while ((x = PEM_read_bio_X509(bio, NULL, no_password, NULL))) {
        int ok = X509_STORE_add_cert(store, x);
        X509_free(x);
        if (!ok) {
            BIO_free(bio);
            return describe_openssl(err, errlen, "TLS CA certificate");
        }
        n++;
    }
    BIO_free(bio);
    ERR_clear_error(); /* the loop ends with a "no start line" error */
    if (!n) {
        snprintf(err, errlen, "TLS CA certificate: no PEM certificate found");
        return -1;
    }
    return 0;
}

static int load_cert(SSL_CTX *ctx, const char *pem, size_t len, char *err, size_t errlen) {
    BIO *bio = mem_bio(pem, len);
    X509 *leaf = bio ? PEM_read_bio_X509(bio, NULL, no_password, NULL) : NULL;
    if (!leaf || SSL_CTX_use_certificate(ctx, leaf) != 1) {
        X509_free(leaf);
        BIO_free(bio);
        return describe_openssl(err, errlen, "TLS certificate");
    }
    X509_free(leaf);
    X509 *extra; /* intermediate certificates, if the PEM holds a chain */
    while ((extra = PEM_read_bio_X509(bio, NULL, no_password, NULL))) {
        if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) {
            X509_free(extra);
            BIO_free(bio);
            return describe_openssl(err, errlen, "TLS certificate chain");
        }
    }
    BIO_free(bio);
    ERR_clear_error();
    return 0;
}

static int load_key(SSL_CTX *ctx, const char *pem, size_t len, char *err, size_t errlen) {
    BIO *bio = mem_bio(pem, len);
    EVP_PKEY *key = bio ? PEM_read_bio_PrivateKey(bio, NULL, no_password, NULL) : NULL;
    BIO_free(bio);
    if (!key) return describe_openssl(err, errlen, "TLS private key");
    if (SSL_CTX_use_PrivateKey(ctx, key) != 1) {
        EVP_PKEY_free(key);
        return describe_openssl(err, errlen, "TLS private key does not match the certificate");
    }
    EVP_PKEY_free(key);
    if (SSL_CTX_check_private_key(ctx) != 1) return describe_openssl(err, errlen, "TLS private key does not match the certificate");
    return 0;
}

cl_tls_ctx *cl_tls_new(const char *ca, size_t ca_len, const char *cert, size_t cert_len,
                       const char *key, size_t key_len, char *err, size_t errlen) {
    pthread_once(&bio_once, bio_init_method);
    if (!bio_method) {
        describe_openssl(err, errlen, "cannot create the TLS socket BIO");
        return NULL;
    }
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_method());
    if (!ctx) {
        describe_openssl(err, errlen, "cannot create a TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    /* A peer's EOF without close_notify is a plain end of stream: every message is
     * length-framed, so truncation is caught by the framing, and the connection is
     * then closed with a close_notify rather than a decode_error alert. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF |
                                SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* Forward-secret AEAD only; AES-128-GCM first, the cheapest with AES-NI (pages
     * are bulk data: it costs a quarter less than AES-256-GCM). */
    if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256") != 1 ||
        SSL_CTX_set_cipher_list(ctx, "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                                     "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                                     "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305") != 1) {
        SSL_CTX_free(ctx);
        describe_openssl(err, errlen, "cannot set the TLS cipher suites");
        return NULL;
    }
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
    if (load_ca(ctx, ca, ca_len, err, errlen) || load_cert(ctx, cert, cert_len, err, errlen) ||
        load_key(ctx, key, key_len, err, errlen)) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

void cl_tls_ref(cl_tls_ctx *ctx) {
    if (ctx) SSL_CTX_up_ref(ctx);
}

void cl_tls_free(cl_tls_ctx *ctx) { SSL_CTX_free(ctx); }

/* --------------------------------------------------------- connections -- */

static void describe_failure(SSL *ssl, int rc, char *why, size_t whylen) {
    int saved = errno;
    long verify = SSL_get_verify_result(ssl);
    unsigned long e = ERR_peek_last_error();
    if (verify != X509_V_OK) {
        snprintf(why, whylen, "peer certificate refused: %s", X509_verify_cert_error_string(verify));
    } else if (e) {
        char reason[200];
        ERR_error_string_n(e, reason, sizeof reason);
        snprintf(why, whylen, "%s", reason);
    } else if (SSL_get_error(ssl, rc) == SSL_ERROR_SYSCALL && rc < 0) {
        snprintf(why, whylen, "%s", saved == EAGAIN ? "timed out" : strerror(saved));
    } else {
        snprintf(why, whylen, "connection closed during the handshake");
    }
    ERR_clear_error();
}

static int handshake(cl_tls_ctx *ctx, int fd, int server, char *why, size_t whylen) {
    ERR_clear_error();
    ssl_slot *where = slot(fd);
    SSL *ssl = where ? SSL_new(ctx) : NULL;
    BIO *bio = ssl ? BIO_new(bio_method) : NULL;
    if (!bio) {
        SSL_free(ssl);
        snprintf(why, whylen, "cannot set up TLS on fd %d", fd);
        ERR_clear_error();
        return -1;
    }
    BIO_set_data(bio, (void *)(intptr_t)fd);
    SSL_set_bio(ssl, bio, bio);
    /* Both ends check the peer's certificate name (and CA, via the context). */
    if (SSL_set1_host(ssl, CL_TLS_NAME) != 1 || (!server && SSL_set_tlsext_host_name(ssl, CL_TLS_NAME) != 1)) {
        describe_failure(ssl, 0, why, whylen);
        SSL_free(ssl);
        return -1;
    }
    int rc = server ? SSL_accept(ssl) : SSL_connect(ssl);
    if (rc != 1) {
        describe_failure(ssl, rc, why, whylen);
        SSL_free(ssl);
        return -1;
    }
    SSL_free(atomic_exchange(where, ssl)); /* NULL: closed fds leave the table through cl_close */
    atomic_store(&tls_used, 1);
    return 0;
}

int cl_tls_accept(cl_tls_ctx *ctx, int fd, char *why, size_t whylen) { return handshake(ctx, fd, 1, why, whylen); }
int cl_tls_connect(cl_tls_ctx *ctx, int fd, char *why, size_t whylen) { return handshake(ctx, fd, 0, why, whylen); }

/* After an I/O error the session may only be dropped: cl_hangup then sends nothing
 * (OpenSSL forbids SSL_shutdown after a fatal error). A close_notify received is no error. */
static int io_failed(SSL *ssl, int rc) {
    if (SSL_get_error(ssl, rc) != SSL_ERROR_ZERO_RETURN) SSL_set_quiet_shutdown(ssl, 1);
    ERR_clear_error();
    return -1;
}

int cl_tls_write_all(void *ssl, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        int n = SSL_write(ssl, p, len > INT_MAX ? INT_MAX : (int)len);
        if (n <= 0) return io_failed(ssl, n);
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int cl_tls_read_all(void *ssl, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        int n = SSL_read(ssl, p, len > INT_MAX ? INT_MAX : (int)len);
        if (n <= 0) return io_failed(ssl, n);
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

void cl_hangup(int fd) {
    SSL *ssl = cl_tls_of(fd);
    if (ssl) {
        SSL_shutdown(ssl); /* close_notify; never waits for the peer's */
        ERR_clear_error();
    }
    shutdown(fd, SHUT_RDWR);
}

void cl_close(int fd) {
    if (fd < 0) return;
    if (cl_tls_of(fd)) SSL_free(atomic_exchange(slot(fd), NULL));
    close(fd);
}
