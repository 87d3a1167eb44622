/* Small pieces shared by the driver and worker pagers. */
#ifndef CLAMOR_PAGER_COMMON_H
#define CLAMOR_PAGER_COMMON_H
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CL_STRIPES 1024

/* Striped locks guard per-page metadata without one lock per page. */
typedef struct { pthread_mutex_t m[CL_STRIPES]; } cl_stripes;

static inline void cl_stripes_init(cl_stripes *s) {
    for (int i = 0; i < CL_STRIPES; i++) pthread_mutex_init(&s->m[i], NULL);
}
static inline pthread_mutex_t *cl_stripe(cl_stripes *s, uint64_t page) {
    return &s->m[page % CL_STRIPES];
}

static inline int cl_is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

#define CL_ERR(...) (snprintf(err, errlen, __VA_ARGS__), -1)

/* Opens a userfaultfd with the requested features; -1 and a message on failure. */
int cl_uffd_open(uint64_t features, char *err, size_t errlen);
int cl_uffd_register(int uffd, void *base, uint64_t len, uint64_t mode, char *err, size_t errlen);
#endif
