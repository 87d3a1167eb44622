"""The driver's shared arena, as seen from Python.

Objects that workers should demand-page instead of receiving a copy live in one
memfd-backed region per process. This module is the typed
face of the C allocator in ``runtime/paging/native/arena.c``: it creates the arena
lazily, places numpy arrays in it (``array``, ``empty``, ``asarray``,
``empty_like``), routes every numpy allocation of a block of code to it
(``shared()``), and turns the C allocator's failures into Python exceptions.

Addresses leave the process only as byte offsets into the arena
(``arena_offset``), never as raw pointers.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from clamor.runtime.errors import ArenaExhaustedError, ClamorError
from clamor.runtime.paging.native import _native

__all__ = [
    "DEFAULT_ARENA_SIZE",
    "DEFAULT_PAGE_SIZE",
    "Arena",
    "arena_offset",
    "arena_stats",
    "array",
    "asarray",
    "configure",
    "empty",
    "empty_like",
    "format_bytes",
    "get_arena",
    "in_arena",
    "shared",
]

ffi = _native.ffi
lib = _native.lib

DEFAULT_ARENA_SIZE = 32 << 30
DEFAULT_PAGE_SIZE = 256 << 10
MIN_PAGE_SIZE = 4 << 10
MAX_PAGE_SIZE = 8 << 20

_lock = threading.Lock()
_config: dict[str, int | None] = {"arena_size": None, "page_size": None}
_arena: Arena | None = None


@dataclass(frozen=True)
class Arena:
    """The process's arena: where it is mapped and how it is divided into pages."""

    base: int  # address of offset 0 (only meaningful in this process)
    size: int  # bytes reserved
    page_size: (
        int  # unit of demand paging; blocks of at least this size are page-aligned
    )
    fd: int  # the memfd backing it (same-host workers map it)

    @property
    def num_pages(self) -> int:
        return self.size // self.page_size

    def stats(self) -> dict[str, int]:
        """Allocator counters (see ``arena_stats``)."""
        return arena_stats()


# ----------------------------------------------------------------- sizes --

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def format_bytes(n: int) -> str:
    """Human-readable binary size: ``512 B``, ``1.5 KiB``, ``31.9 GiB``."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def parse_size(text: str, name: str) -> int:
    """Parse ``"32G"``, ``"256KiB"``, ``"1048576"`` (binary multiples) from an env var."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise ValueError(f"{name}={text!r} is not a size (e.g. 32GiB, 256K, 1048576)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


#: A size option: a number of bytes, or a string such as ``"256KiB"``, ``"4GiB"``, ``"512M"``.
Size = int | str


def to_bytes(size: Size, what: str) -> int:
    """``"4GiB"``, ``"512M"`` or an int, as a positive number of bytes (every size option
    of the API reads its value with this, so they all accept the same forms)."""
    if isinstance(size, bool) or not isinstance(size, int | str):
        raise TypeError(f"{what} must be a size like '4GiB' or a number of bytes, not {size!r}")
    n = parse_size(size, what) if isinstance(size, str) else size
    if n <= 0:
        raise ValueError(f"{what} must be positive, not {size!r}")
    return n


def check_page_size(page_size: Size) -> int:
    page_size = to_bytes(page_size, "page_size")
    if not (MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE) or page_size & (page_size - 1):
        raise ValueError(
            f"page size must be a power of two between 4 KiB and 8 MiB, not {page_size}"
        )
    return page_size


def _check_arena_size(arena_size: Size) -> int:
    return to_bytes(arena_size, "arena_size")


def _resolve() -> tuple[int, int]:
    """The (arena_size, page_size) to create the arena with: configure() > env > defaults.

    The arena size is rounded up to a whole number of pages.
    """
    page_size = _config["page_size"]
    if page_size is None:
        env = os.environ.get("CLAMOR_PAGE_SIZE")
        page_size = parse_size(env, "CLAMOR_PAGE_SIZE") if env else DEFAULT_PAGE_SIZE
        page_size = check_page_size(page_size)
    arena_size = _config["arena_size"]
    if arena_size is None:
        env = os.environ.get("CLAMOR_ARENA_SIZE")
        arena_size = (
            parse_size(env, "CLAMOR_ARENA_SIZE") if env else DEFAULT_ARENA_SIZE
        )
        arena_size = _check_arena_size(arena_size)
    arena_size = -(-arena_size // page_size) * page_size
    return arena_size, page_size


# ------------------------------------------------------------- the arena --


def configure(arena_size: Size | None = None, page_size: Size | None = None) -> None:
    """Set the arena's size and page size before it is first used.

    Defaults come from ``CLAMOR_ARENA_SIZE`` (32 GiB) and ``CLAMOR_PAGE_SIZE``
    (256 KiB). The arena is reserved address space backed by a sparse memfd, so
    a large size costs nothing until written. Once the arena exists its geometry
    is fixed: asking for different values raises ``ClamorError``; repeating the
    current ones is a no-op.
    """
    if page_size is not None:
        page_size = check_page_size(page_size)
    if arena_size is not None:
        arena_size = _check_arena_size(arena_size)
    with _lock:
        if _arena is not None:
            wanted_page = page_size if page_size is not None else _arena.page_size
            wanted_size = arena_size if arena_size is not None else _arena.size
            wanted_size = -(-wanted_size // wanted_page) * wanted_page
            if wanted_page != _arena.page_size or wanted_size != _arena.size:
                raise ClamorError(
                    "the arena already exists "
                    f"({format_bytes(_arena.size)}, pages of {format_bytes(_arena.page_size)}); "
                    "configure() must be called before the arena is first used "
                    "(restart the kernel to change its size or page size)"
                )
            return
        if arena_size is not None:
            _config["arena_size"] = arena_size
        if page_size is not None:
            _config["page_size"] = page_size


def get_arena() -> Arena:
    """The process's arena, created on first use with the configured geometry."""
    global _arena
    arena = _arena
    if arena is not None:
        return arena
    with _lock:
        if _arena is None:
            if not lib.clamor_arena_exists():
                size, page_size = _resolve()
                err = ffi.new("char[256]")
                if lib.clamor_arena_create(size, page_size, err, len(err)) != 0:
                    raise ClamorError(
                        f"cannot create the clamor arena ({format_bytes(size)}): "
                        + ffi.string(err).decode(errors="replace")
                    )
            else:  # created by C code (or another binding) before us: adopt it
                stats = _raw_stats()
                size, page_size = int(stats.size), int(stats.large_align)
            if lib.clamor_numpy_handler_init() != 0:
                raise ClamorError(
                    "cannot import numpy's C API for the arena's memory handler"
                )
            _arena = Arena(
                base=int(ffi.cast("uintptr_t", lib.clamor_arena_base())),
                size=size,
                page_size=page_size,
                fd=int(lib.clamor_arena_fd()),
            )
        return _arena


def _raw_stats() -> Any:
    out = ffi.new("clamor_arena_stats *")
    lib.clamor_arena_get_stats(out)
    return out


def arena_stats() -> dict[str, int]:
    """Allocator counters: size, used, free, high_water, allocations, large_align,
    last_failed_request (all in bytes except ``allocations``), plus page_size."""
    arena = get_arena()
    s = _raw_stats()
    return {
        "size": int(s.size),
        "used": int(s.used),
        "free": int(s.free),
        "high_water": int(s.high_water),
        "allocations": int(s.allocations),
        "large_align": int(s.large_align),
        "last_failed_request": int(s.last_failed_request),
        "page_size": arena.page_size,
    }


def _exhausted(requested: int) -> ArenaExhaustedError:
    s = _raw_stats()
    free, size = int(s.free), int(s.size)
    why = (
        " (no free block that large: the free space is fragmented)"
        if requested <= free
        else ""
    )
    err = ArenaExhaustedError(
        f"cannot allocate {format_bytes(requested)} in the clamor arena: "
        f"{format_bytes(free)} free of {format_bytes(size)}{why}; free some shared arrays, "
        "or give the next session a larger arena (configure(arena_size=...) before first "
        "use, or CLAMOR_ARENA_SIZE)"
    )
    err.requested = requested
    err.free = free
    err.size = size
    return err


# ---------------------------------------------------- the numpy handler --


@contextlib.contextmanager
def shared(*, min_bytes: int | None = None) -> Iterator[Arena]:
    """Place every numpy allocation made inside the block in the arena.

    This is the drop-in allocator of Clamor for numpy: third-party code (an
    sklearn KDTree, say) runs unmodified and its arrays become shareable by
    reference. It applies to the current thread (numpy keeps the handler in a
    context variable), nests, and restores the previous handler on exit, even
    on error. Arrays keep the handler that allocated them, so they may outlive
    the block. A ``MemoryError`` caused by the arena running out is re-raised as
    ``ArenaExhaustedError`` naming the requested and free bytes.

    ``min_bytes``: only allocations of at least this many bytes go to the arena
    (e.g. the page size: the arrays that ship by reference); smaller ones stay in
    ordinary memory.
    """
    arena = get_arena()
    failed_before = int(_raw_stats().last_failed_request)
    if min_bytes is None:
        previous = lib.clamor_numpy_handler_push()
    else:
        previous = lib.clamor_numpy_handler_push_large(max(int(min_bytes), 1))
    if previous == ffi.NULL:
        raise ClamorError("cannot install the arena's numpy memory handler")
    try:
        yield arena
    except ArenaExhaustedError:
        raise
    except MemoryError as exc:
        requested = _arena_failure(exc, failed_before)
        if requested is None:
            raise
        raise _exhausted(requested) from exc
    finally:
        lib.clamor_numpy_handler_pop(previous)


def _arena_failure(exc: MemoryError, failed_before: int) -> int | None:
    """The request size if ``exc`` comes from the arena allocator, else None.

    The C allocator records the size of its last failed request; numpy's
    allocation errors carry the size they asked for (``_total_size``).
    """
    failed = int(_raw_stats().last_failed_request)
    if not failed:
        return None
    numpy_size = getattr(exc, "_total_size", None)
    if numpy_size is not None and max(int(numpy_size), 1) == failed:
        return int(numpy_size)
    return failed if failed != failed_before else None


# --------------------------------------------------------------- arrays --


def _check_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(
            f"dtype {dt} holds Python object pointers, which mean nothing outside this "
            "process; it cannot be shared through the arena"
        )
    return dt


def empty(shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
    """An uninitialized array in the arena (an ordinary ndarray owning its data)."""
    dt = _check_dtype(dtype)
    with shared():
        return np.empty(shape, dtype=dt, order=order)


def array(
    shape: Any, dtype: Any = float, fill: Any = 0, order: str = "C"
) -> np.ndarray:
    """A new array in the arena, filled with ``fill`` (zero by default).

    Zero-filled arrays come from fresh arena memory without touching it where
    possible, so a huge ``array(...)`` costs no physical memory until written.
    """
    dt = _check_dtype(dtype)
    with shared():
        if isinstance(fill, (int, float, complex, np.number, np.bool_)) and fill == 0:
            return np.zeros(shape, dtype=dt, order=order)
        return np.full(shape, fill, dtype=dt, order=order)


def asarray(x: Any, dtype: Any = None) -> np.ndarray:
    """``x`` itself if it is an array already in the arena, else a copy in the arena.

    The copy keeps ``x``'s memory layout (C or Fortran order) and, unless
    ``dtype`` is given, its dtype.
    """
    if (
        isinstance(x, np.ndarray)
        and in_arena(x)
        and (dtype is None or np.dtype(dtype) == x.dtype)
    ):
        return x
    if dtype is not None:
        _check_dtype(dtype)
    with shared():
        out = np.array(x, dtype=dtype, copy=True, order="K", subok=False)
    if out.dtype.hasobject:
        raise TypeError(
            "the data converts to an object array, which holds Python object pointers and "
            "cannot be shared through the arena; pass a numeric dtype"
        )
    return out


def empty_like(x: Any, dtype: Any = None, shape: Any = None) -> np.ndarray:
    """An uninitialized arena array with the shape and dtype of ``x`` (or those given)."""
    if dtype is not None:
        _check_dtype(dtype)
    elif isinstance(x, np.ndarray):
        _check_dtype(x.dtype)
    with shared():
        out = np.empty_like(x, dtype=dtype, shape=shape, subok=False)
    if out.dtype.hasobject:
        raise TypeError("object arrays cannot be shared through the arena")
    return out


# ------------------------------------------------------------ addresses --


def _data_address(x: Any) -> int | None:
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    try:
        view = memoryview(x)
    except TypeError:
        return None
    return np.asarray(view).__array_interface__["data"][0]


def in_arena(x: Any) -> bool:
    """Whether ``x``'s data (an ndarray or any buffer) lies in this process's arena."""
    if not lib.clamor_arena_exists():
        return False
    addr = _data_address(x)
    return addr is not None and bool(
        lib.clamor_arena_contains(ffi.cast("void *", addr))
    )


def arena_offset(x: Any) -> int:
    """Byte offset of ``x``'s data pointer from the arena's base.

    This, not the pointer, is what travels to workers: each process maps the
    arena at its own address. Raises ``ValueError`` if ``x`` is not in the arena.
    """
    addr = _data_address(x)
    if addr is None:
        raise TypeError(f"{type(x).__name__} does not expose a data buffer")
    if not lib.clamor_arena_exists() or not lib.clamor_arena_contains(
        ffi.cast("void *", addr)
    ):
        raise ValueError("the array's data is not in the clamor arena")
    return addr - int(ffi.cast("uintptr_t", lib.clamor_arena_base()))


def page_size() -> int:
    """The arena's page size (what blocks of at least a page are aligned to)."""
    return get_arena().page_size


def view(offset: int, shape: tuple, dtype: Any, strides: tuple | None = None) -> np.ndarray:
    """A zero-copy view of arena bytes at ``offset`` (bounds-checked by numpy)."""
    arena = get_arena()
    whole = np.frombuffer(ffi.buffer(lib.clamor_arena_base(), arena.size), dtype=np.uint8)
    return np.ndarray(shape, dtype=dtype, buffer=whole, offset=offset, strides=strides)


def page_span(x: Any, page_size: int) -> tuple[int, int]:
    """The pages ``[first, end)`` that the arena array ``x`` occupies."""
    start = arena_offset(x)
    return start // page_size, -(-(start + max(x.nbytes, 1)) // page_size)


# ---------------------------------------------------------- checkpoints --
# What runtime/data/checkpoint.py needs of the arena (the checkpoint block of api.h).


def live_blocks() -> list[tuple[int, int]]:
    """The live extent blocks ``(offset, usable size)`` in offset order.

    Every array of at least a page is one of them (or a view into one); slab
    objects (allocations below the page size) are not listed.
    """
    if not lib.clamor_arena_exists():
        return []
    cap = 64
    while True:
        offsets, sizes = ffi.new("uint64_t[]", cap), ffi.new("uint64_t[]", cap)
        n = int(lib.clamor_arena_list_blocks(offsets, sizes, cap))
        if n <= cap:
            return [(int(offsets[i]), int(sizes[i])) for i in range(n)]
        cap = 2 * n  # blocks were added between the two calls: ask again


def reserve(offset: int, nbytes: int) -> None:
    """Mark ``[offset, offset + nbytes)`` (4 KiB aligned) as one live block, as if it had
    been allocated there; ``ClamorError`` if any of it is in use or outside the arena."""
    get_arena()
    err = ffi.new("char[256]")
    if lib.clamor_arena_reserve(offset, nbytes, err, len(err)) != 0:
        raise ClamorError(ffi.string(err).decode(errors="replace"))


def release(offset: int) -> None:
    """Free the block that starts at ``offset`` (e.g. one made by :func:`reserve`)."""
    lib.clamor_arena_free(ffi.cast("char *", lib.clamor_arena_base()) + offset)


def adopt(offset: int, nbytes: int) -> np.ndarray:
    """Re-create a block at ``offset`` (as :func:`reserve`) and return a writable uint8
    array over it that owns it: the block is freed when the last array over it (views
    included) is collected. A restored checkpoint's arrays are views of these."""
    reserve(offset, nbytes)
    owner = ffi.gc(ffi.cast("char *", lib.clamor_arena_base()) + offset, lib.clamor_arena_free)
    return np.frombuffer(ffi.buffer(owner, nbytes), np.uint8)  # the buffer keeps the owner


def exists() -> bool:
    """Whether this process has created its arena (a worker never does)."""
    return bool(lib.clamor_arena_exists())
