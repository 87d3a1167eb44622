"""cffi API-mode build of clamor's native module (`clamor.runtime.paging.native._native`).

Self-contained: setup.py names this file in `cffi_modules`, and `python
runtime/paging/native/build.py` builds the module in place for development. The
cdef is api.h itself with its preprocessor lines removed, so the C header
and the Python binding can never disagree.
"""

from __future__ import annotations

import os
import pathlib

import cffi
import numpy

HERE = pathlib.Path(__file__).resolve().parent
SOURCES = [
    "arena.c",
    "extents.c",
    "slabs.c",
    "numpy_handler.c",
    "protocol.c",
    "uffd.c",
    "page_server.c",
    "driver_base.c",
    "directory.c",
    "driver_zap.c",
    "driver_map_ahead.c",
    "driver_pages.c",
    "driver_versions.c",
    "driver_pager.c",
    "write_tracking.c",
    "worker_base.c",
    "worker_cache.c",
    "worker_conn.c",
    "worker_read_sets.c",
    "worker_mappings.c",
    "worker_fetch.c",
    "worker_pending.c",
    "worker_pager.c",
    "tls.c",
]


def _cdef() -> str:
    lines = (HERE / "api.h").read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


ffibuilder = cffi.FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "clamor.runtime.paging.native._native",
    '#include "clamor.h"\n',
    # setuptools insists on sources relative to setup.py's directory.
    sources=[os.path.relpath(HERE / name) for name in SOURCES],
    include_dirs=[str(HERE), numpy.get_include()],
    libraries=["ssl", "crypto", "pthread"],
    # numpy's headers need the full C API; cffi defaults to the limited one.
    define_macros=[("_CFFI_NO_LIMITED_API", None), ("_GNU_SOURCE", None)],
    extra_compile_args=["-O2", "-Wall", "-Wno-unused-function", "-std=gnu11"],
    py_limited_api=False,
)

if __name__ == "__main__":
    os.chdir(HERE.parent.parent)
    ffibuilder.compile(tmpdir="build/cffi", verbose=False)
