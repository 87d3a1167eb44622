/* NEP 49 numpy memory handler that places numpy data buffers in the arena.
 *
 * `with clamor.shared():` pushes this handler (PyDataMem_SetHandler sets a
 * context variable, so it applies to the current thread / context only) and
 * pops it on exit. Every array records the handler that allocated it and is
 * freed through that same handler, whatever is current at that time. The
 * "clamor_arena_large" variant sends only requests of at least a threshold
 * to the arena and smaller ones to libc (the kernel's notebook arrays in the
 * arena by default).
 *
 * The allocator hooks run with whatever numpy holds (usually the GIL) and
 * never touch the Python C-API. Pointers that are not in the arena go to
 * libc (defensive: numpy may hand the current handler memory it got from
 * malloc). In a forked child the arena belongs to the parent, so new
 * allocations there go to the heap.
 *
 * cffi releases the GIL around calls into this module: the three API
 * functions take it back with PyGILState_Ensure before using Python or
 * numpy, and never leave a Python exception pending (they print it and
 * return an error code instead).
 */
#define PY_SSIZE_T_CLEAN
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <Python.h>
#include <numpy/arrayobject.h>

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "clamor.h"
#include "arena_internal.h"

static void *h_malloc(void *ctx, size_t size)
{
    (void)ctx;
    if (!clamor_arena_internal_usable())
        return malloc(size ? size : 1);
    return clamor_arena_alloc(size);
}

static void *h_calloc(void *ctx, size_t nelem, size_t elsize)
{
    (void)ctx;
    if (!clamor_arena_internal_usable())
        return calloc(nelem ? nelem : 1, elsize ? elsize : 1);
    return clamor_arena_calloc(nelem, elsize);
}

static void *h_realloc(void *ctx, void *ptr, size_t new_size)
{
    (void)ctx;
    if (!ptr)
        return h_malloc(ctx, new_size);
    if (!clamor_arena_contains(ptr))
        return realloc(ptr, new_size ? new_size : 1);
    if (clamor_arena_internal_usable())
        return clamor_arena_realloc(ptr, new_size);
    /* Forked child: copy the parent's arena block to the heap, leave it be. */
    uint64_t old = clamor_arena_block_size(ptr);
    void *p = malloc(new_size ? new_size : 1);
    if (p && old)
        memcpy(p, ptr, new_size < old ? new_size : (size_t)old);
    return p;
}

static void h_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    (void)size;
    if (!ptr)
        return;
    if (clamor_arena_contains(ptr))
        clamor_arena_free(ptr); /* a no-op in a forked child */
    else
        free(ptr);
}

static PyDataMem_Handler clamor_handler = {
    "clamor_arena",
    1,
    {
        NULL,
        h_malloc,
        h_calloc,
        h_realloc,
        h_free,
    },
};

/* The large-only variant: requests below `min` bytes go to libc. `min` is
 * carried in the allocator's ctx, one handler struct per threshold (see
 * large_handler); the struct is never freed, as arrays keep pointing at it. */
#define LARGE_MIN(ctx) ((size_t)(uintptr_t)(ctx))

static void *hl_malloc(void *ctx, size_t size)
{
    if (size < LARGE_MIN(ctx))
        return malloc(size ? size : 1);
    return h_malloc(ctx, size);
}

static void *hl_calloc(void *ctx, size_t nelem, size_t elsize)
{
    size_t total;
    if (__builtin_mul_overflow(nelem, elsize, &total))
        return NULL;
    if (total < LARGE_MIN(ctx))
        return calloc(nelem ? nelem : 1, elsize ? elsize : 1);
    return h_calloc(ctx, nelem, elsize);
}

static void *hl_realloc(void *ctx, void *ptr, size_t new_size)
{
    /* A heap block growing past the threshold moves to the arena. `ptr` came
     * from this handler's malloc (numpy reallocates through the handler that
     * allocated), so malloc_usable_size applies. */
    if (ptr && new_size >= LARGE_MIN(ctx) && !clamor_arena_contains(ptr) &&
        clamor_arena_internal_usable()) {
        void *p = clamor_arena_alloc(new_size);
        if (!p)
            return NULL;
        size_t old = malloc_usable_size(ptr);
        memcpy(p, ptr, old < new_size ? old : new_size);
        free(ptr);
        return p;
    }
    if (!ptr)
        return hl_malloc(ctx, new_size);
    return h_realloc(ctx, ptr, new_size);
}

#define LARGE_CACHE 8
static PyDataMem_Handler *large_cache[LARGE_CACHE];

/* The handler for threshold `min` (> 0); the caller holds the GIL. */
static PyDataMem_Handler *large_handler(uint64_t min)
{
    for (int i = 0; i < LARGE_CACHE && large_cache[i]; i++)
        if (LARGE_MIN(large_cache[i]->allocator.ctx) == min)
            return large_cache[i];
    PyDataMem_Handler *h = malloc(sizeof *h);
    if (!h)
        return NULL;
    *h = (PyDataMem_Handler){
        "clamor_arena_large",
        1,
        {(void *)(uintptr_t)min, hl_malloc, hl_calloc, hl_realloc, h_free},
    };
    for (int i = 0; i < LARGE_CACHE; i++)
        if (!large_cache[i]) {
            large_cache[i] = h;
            break;
        }
    return h; /* past LARGE_CACHE thresholds: not cached, still never freed */
}

static int numpy_ready;

/* Import numpy's C API; the caller holds the GIL. 0 or -1 (exception printed). */
static int init_locked(void)
{
    if (numpy_ready)
        return 0;
    if (_import_array() < 0) {
        PyErr_Print();
        return -1;
    }
    numpy_ready = 1;
    return 0;
}

int clamor_numpy_handler_init(void)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = init_locked();
    PyGILState_Release(g);
    return rc;
}

/* Push `handler`, or the large-only one for `min` when handler is NULL. */
static void *push(PyDataMem_Handler *handler, uint64_t min)
{
    PyObject *previous = NULL;
    PyGILState_STATE g = PyGILState_Ensure();
    if (!handler)
        handler = large_handler(min);
    if (handler && init_locked() == 0) {
        PyObject *capsule = PyCapsule_New(handler, "mem_handler", NULL);
        if (capsule) {
            previous = PyDataMem_SetHandler(capsule); /* new reference */
            Py_DECREF(capsule); /* numpy's context variable holds its own */
        }
        if (!previous)
            PyErr_Print();
    }
    PyGILState_Release(g);
    return previous;
}

void *clamor_numpy_handler_push(void)
{
    return push(&clamor_handler, 0);
}

void *clamor_numpy_handler_push_large(uint64_t min_bytes)
{
    return push(NULL, min_bytes ? min_bytes : 1);
}

int clamor_numpy_handler_pop(void *previous)
{
    if (!previous)
        return -1;
    int rc = 0;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *current = PyDataMem_SetHandler((PyObject *)previous);
    if (current) {
        Py_DECREF(current);
    } else {
        PyErr_Print();
        rc = -1;
    }
    Py_DECREF((PyObject *)previous);
    PyGILState_Release(g);
    return rc;
}
