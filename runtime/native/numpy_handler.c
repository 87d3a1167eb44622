/* NEP 49 numpy memory handler that places numpy data buffers in the arena.
 *
 * `with clamor.shared():` pushes this handler (PyDataMem_SetHandler sets a
 * context variable, so it applies to the current thread / context only) and
 * pops it on exit. Every array records the handler that allocated it and is
 * freed through that same handler, whatever is current at that time.
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

void *clamor_numpy_handler_push(void)
{
    PyObject *previous = NULL;
    PyGILState_STATE g = PyGILState_Ensure();
    if (init_locked() == 0) {
        PyObject *capsule = PyCapsule_New(&clamor_handler, "mem_handler", NULL);
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
