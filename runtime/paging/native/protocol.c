/* Page protocol: framing, HMAC handshake and socket helpers. */
#include "protocol.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

void cl_log(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "clamor[%d]: %s\n", (int)getpid(), line);
}

int cl_send_all(int fd, const void *buf, size_t len) {
    void *ssl = cl_tls_of(fd);
    if (ssl) return cl_tls_write_all(ssl, buf, len);
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int cl_recv_all(int fd, void *buf, size_t len) {
    void *ssl = cl_tls_of(fd);
    if (ssl) return cl_tls_read_all(ssl, buf, len);
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_WAITALL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void to_wire(const cl_msg *m, uint8_t out[CL_HEADER]) {
    uint32_t u32;
    uint16_t u16;
    uint64_t u64;
    u32 = htole32(m->magic); memcpy(out + 0, &u32, 4);
    u16 = htole16(m->version); memcpy(out + 4, &u16, 2);
    u16 = htole16(m->type); memcpy(out + 6, &u16, 2);
    u64 = htole64(m->page); memcpy(out + 8, &u64, 8);
    u32 = htole32(m->epoch); memcpy(out + 16, &u32, 4);
    u32 = htole32(m->aux); memcpy(out + 20, &u32, 4);
    u32 = htole32(m->flags); memcpy(out + 24, &u32, 4);
    u32 = htole32(m->aux2); memcpy(out + 28, &u32, 4);
    u64 = htole64(m->length); memcpy(out + 32, &u64, 8);
}

static void from_wire(const uint8_t in[CL_HEADER], cl_msg *m) {
    uint32_t u32;
    uint16_t u16;
    uint64_t u64;
    memcpy(&u32, in + 0, 4); m->magic = le32toh(u32);
    memcpy(&u16, in + 4, 2); m->version = le16toh(u16);
    memcpy(&u16, in + 6, 2); m->type = le16toh(u16);
    memcpy(&u64, in + 8, 8); m->page = le64toh(u64);
    memcpy(&u32, in + 16, 4); m->epoch = le32toh(u32);
    memcpy(&u32, in + 20, 4); m->aux = le32toh(u32);
    memcpy(&u32, in + 24, 4); m->flags = le32toh(u32);
    memcpy(&u32, in + 28, 4); m->aux2 = le32toh(u32);
    memcpy(&u64, in + 32, 8); m->length = le64toh(u64);
}

cl_msg cl_make(uint16_t type, uint64_t page, uint32_t epoch, uint32_t aux) {
    cl_msg m = {CL_MAGIC, CL_PROTO_VERSION, type, page, epoch, aux, 0, 0, 0};
    return m;
}

/* TLS: the header and the start of the payload go in one full record. */
static int tls_send_msg(void *ssl, const uint8_t hdr[CL_HEADER], const cl_msg *m, const void *payload) {
    uint8_t record[16384];
    size_t len = payload ? m->length : 0;
    size_t first = len < sizeof record - CL_HEADER ? len : sizeof record - CL_HEADER;
    memcpy(record, hdr, CL_HEADER);
    if (first) memcpy(record + CL_HEADER, payload, first);
    if (cl_tls_write_all(ssl, record, CL_HEADER + first)) return -1;
    return len > first ? cl_tls_write_all(ssl, (const uint8_t *)payload + first, len - first) : 0;
}

int cl_send_msg(int fd, const cl_msg *m, const void *payload) {
    uint8_t hdr[CL_HEADER];
    to_wire(m, hdr);
    void *ssl = cl_tls_of(fd);
    if (ssl) return tls_send_msg(ssl, hdr, m, payload);
    struct iovec iov[2] = {{hdr, CL_HEADER}, {(void *)payload, payload ? m->length : 0}};
    size_t total = CL_HEADER + iov[1].iov_len;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = payload ? 2 : 1};
    ssize_t n;
    do {
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return -1;
    if ((size_t)n == total) return 0;
    /* Short write: finish the rest plainly. */
    size_t done = (size_t)n;
    if (done < CL_HEADER) {
        if (cl_send_all(fd, hdr + done, CL_HEADER - done)) return -1;
        done = CL_HEADER;
    }
    return payload ? cl_send_all(fd, (const char *)payload + (done - CL_HEADER), total - done) : 0;
}

int cl_recv_msg(int fd, cl_msg *m) {
    uint8_t hdr[CL_HEADER];
    if (cl_recv_all(fd, hdr, CL_HEADER)) return -1;
    from_wire(hdr, m);
    if (m->magic != CL_MAGIC || m->version != CL_PROTO_VERSION) return -2;
    return 0;
}

const char *cl_error_name(uint32_t code) {
    switch (code) {
    case CL_ERR_BAD_REQUEST: return "bad request";
    case CL_ERR_PAGE_RANGE: return "page out of range";
    case CL_ERR_NO_VERSION: return "no such page version";
    case CL_ERR_NOT_HELD: return "page not held";
    case CL_ERR_AUTH: return "authentication failed";
    default: return "unknown error";
    }
}

/* ------------------------------------------------------------ sockets -- */

void cl_set_timeouts(int fd, int timeout_ms) {
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int cl_resolve(const char *host, uint32_t *ipv4) {
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1) {
        *ipv4 = ntohl(a.s_addr);
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return -1;
    *ipv4 = ntohl(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr);
    freeaddrinfo(res);
    return 0;
}

int cl_listen(const char *host, int port, int *bound_port, char *err, size_t errlen) {
    uint32_t ip;
    if (cl_resolve(host, &ip)) {
        snprintf(err, errlen, "cannot resolve bind host %s", host);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(ip)};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128)) {
        snprintf(err, errlen, "bind %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *bound_port = ntohs(sa.sin_port);
    return fd;
}

int cl_connect(uint32_t ipv4, int port, int timeout_ms) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(ipv4)};
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) && errno != EINPROGRESS) goto fail;
    struct pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, timeout_ms) != 1) goto fail;
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr) goto fail;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    cl_set_timeouts(fd, timeout_ms);
    return fd;
fail:
    close(fd);
    return -1;
}

/* ---------------------------------------------------------- handshake -- */

static void mac(const uint8_t *token, size_t token_len, char role, const uint8_t *a,
                const uint8_t *b, uint8_t out[CL_MAC]) {
    uint8_t msg[1 + 2 * CL_NONCE];
    msg[0] = (uint8_t)role;
    memcpy(msg + 1, a, CL_NONCE);
    memcpy(msg + 1 + CL_NONCE, b, CL_NONCE);
    unsigned int len = CL_MAC;
    HMAC(EVP_sha256(), token, (int)token_len, msg, sizeof msg, out, &len);
}

static int nonce(uint8_t out[CL_NONCE]) {
    return getrandom(out, CL_NONCE, 0) == CL_NONCE ? 0 : -1;
}

int cl_client_handshake(int fd, const uint8_t *token, size_t token_len, uint32_t client_id) {
    cl_msg m;
    uint8_t ns[CL_NONCE], body[CL_NONCE + CL_MAC], expect[CL_MAC], got[CL_MAC];
    if (cl_recv_msg(fd, &m) || m.type != CL_HELLO || m.length != CL_NONCE) return -1;
    if (cl_recv_all(fd, ns, CL_NONCE) || nonce(body)) return -1;
    mac(token, token_len, 'C', ns, body, body + CL_NONCE);
    cl_msg auth = cl_make(CL_AUTH, 0, 0, client_id);
    auth.length = sizeof body;
    if (cl_send_msg(fd, &auth, body)) return -1;
    if (cl_recv_msg(fd, &m) || m.type != CL_AUTH_OK || m.length != CL_MAC) return -1;
    if (cl_recv_all(fd, got, CL_MAC)) return -1;
    mac(token, token_len, 'S', body, ns, expect);
    return CRYPTO_memcmp(got, expect, CL_MAC) == 0 ? 0 : -1;
}

int cl_server_handshake(int fd, const uint8_t *token, size_t token_len, uint32_t *client_id) {
    cl_msg m;
    uint8_t ns[CL_NONCE], body[CL_NONCE + CL_MAC], expect[CL_MAC];
    if (nonce(ns)) return -1;
    cl_msg hello = cl_make(CL_HELLO, 0, 0, 0);
    hello.length = CL_NONCE;
    if (cl_send_msg(fd, &hello, ns)) return -1;
    if (cl_recv_msg(fd, &m) || m.type != CL_AUTH || m.length != sizeof body) goto refuse;
    if (cl_recv_all(fd, body, sizeof body)) return -1;
    mac(token, token_len, 'C', ns, body, expect);
    if (CRYPTO_memcmp(body + CL_NONCE, expect, CL_MAC) != 0) goto refuse;
    mac(token, token_len, 'S', body, ns, expect);
    cl_msg ok = cl_make(CL_AUTH_OK, 0, 0, 0);
    ok.length = CL_MAC;
    if (cl_send_msg(fd, &ok, expect)) return -1;
    *client_id = m.aux;
    return 0;
refuse:;
    cl_msg e = cl_make(CL_ERROR, 0, 0, CL_ERR_AUTH);
    cl_send_msg(fd, &e, NULL);
    return -1;
}
