"""Where datasets start: driver data, integer ranges, text and ``.npy`` files (fsspec).

Each factory returns a :class:`~clamor.runtime.data.plan.Source` plan node whose op
computes a partition inside a task. Files are read by the tasks themselves:
the driver only lists them, checks they exist and reads the ``.npy`` header,
so a missing file or a bad header fails at the call, before any stage.
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import logging
import math
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from clamor.runtime.data.ops import bounds
from clamor.runtime.data.plan import Source, new_node_id
from clamor.runtime.net import shipping
from clamor.runtime.paging import arena
from clamor.runtime.paging.pager import prefetch
from clamor.runtime.stage import StageRunner, TaskContext

if TYPE_CHECKING:  # imported where files are listed: a worker that reads none never loads it
    import fsspec

logger = logging.getLogger("clamor.dataset")

#: ``parallelize`` data pickled larger than this goes to the driver's partition store
#: (tasks fetch their own chunk) instead of travelling inside every task.
INLINE_LIMIT = 1 << 20
#: Default split size of files.
SPLIT_BYTES = 64 << 20


def default_partitions(runner: StageRunner, nbytes: int = 0) -> int:
    """Two partitions per live worker, more if ``nbytes`` exceeds :data:`SPLIT_BYTES` each."""
    return max(1, 2 * len(runner.workers), math.ceil(nbytes / SPLIT_BYTES))


def _check_partitions(partitions: int) -> int:
    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    return partitions


# --- parallelize ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChunksOp:
    """Partition ``i`` is ``chunks[i]`` (inlined), or the driver's partition ``driver_keys + (i,)``."""

    chunks: tuple | None
    driver_keys: tuple | None = None

    def compute(self, ctx: TaskContext, i: int) -> Any:
        if self.chunks is not None:
            chunk = self.chunks[i]
            if isinstance(chunk, np.ndarray):
                prefetch(chunk)  # a slice of an arena array: its pages in one stream
            return chunk
        return ctx.input(self.driver_keys + (i,))

    def reads(self, i: int) -> tuple[tuple[int, int], ...]:
        """The arena range partition ``i`` reads, when it is a slice of an arena array."""
        chunk = None if self.chunks is None else self.chunks[i]
        if isinstance(chunk, np.ndarray) and chunk.nbytes and arena.in_arena(chunk):
            return ((arena.arena_offset(chunk), int(chunk.nbytes)),)
        return ()


@dataclasses.dataclass(frozen=True)
class RangeOp:
    """Partition ``i`` of ``n`` contiguous slices of a ``range`` (itself a ``range``)."""

    whole: range
    n: int

    def compute(self, ctx: TaskContext, i: int) -> range:
        return self.whole[slice(*bounds(len(self.whole), self.n, i))]


def _pickled_size(chunk: Any) -> int:
    if isinstance(chunk, np.ndarray) and not chunk.dtype.hasobject:
        by_ref = arena.in_arena(chunk) and chunk.nbytes >= arena.page_size()
        return 64 if by_ref else chunk.nbytes
    return len(shipping.dumps(chunk))


def _drop(runner_ref: weakref.ref, keys: list) -> None:
    runner = runner_ref()
    if runner is not None:
        try:
            runner.drop(keys)
        except Exception:
            logger.debug("could not drop %d parallelize partitions", len(keys), exc_info=True)


def parallelize(runner: StageRunner, data: Any, partitions: int | None = None) -> Source:
    """``data`` cut into contiguous partitions: array slices along axis 0 (an arena
    array's slices travel as references), ``range`` slices, or lists.

    Default partitions: two per worker, but no more than elements. Data pickled
    larger than :data:`INLINE_LIMIT` in all is kept by the driver, one partition
    per chunk, and dropped when the plan node is collected.
    """
    if isinstance(data, range):
        return range_source(runner, data, partitions)
    if not isinstance(data, np.ndarray):
        data = list(data)
    if partitions is None:
        partitions = min(default_partitions(runner), max(1, len(data)))
    n = _check_partitions(partitions)
    chunks = tuple(data[slice(*bounds(len(data), n, i))] for i in range(n))
    if sum(_pickled_size(c) for c in chunks) <= INLINE_LIMIT:
        return Source(n=n, name="parallelize", op=ChunksOp(chunks))
    node_id = new_node_id()
    prefix = ("par", node_id)
    for i, chunk in enumerate(chunks):
        runner.put(prefix + (i,), chunk)
    node = Source(n=n, name="parallelize", op=ChunksOp(None, prefix), driver_keys=prefix, id=node_id)
    finalizer = weakref.finalize(node, _drop, weakref.ref(runner), [prefix + (i,) for i in range(n)])
    finalizer.atexit = False
    return node


def range_source(runner: StageRunner, whole: range, partitions: int | None = None) -> Source:
    """Partitions of ``whole``, each a ``range`` (default: two per worker, at most one per element)."""
    if partitions is None:
        partitions = min(default_partitions(runner), max(1, len(whole)))
    n = _check_partitions(partitions)
    return Source(n=n, name="range", op=RangeOp(whole, n))


# --- files --------------------------------------------------------------------------------


def _expand(url: str | list[str]) -> tuple[fsspec.AbstractFileSystem, list[str], list[int]]:
    """The file system, the files ``url`` names (a file, a directory, a glob, or a list
    of them; sorted) and their sizes. ``FileNotFoundError`` naming ``url`` if none exist."""
    import fsspec.core

    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("no file given")
    fs, _ = fsspec.core.url_to_fs(urls[0])
    paths: list[str] = []
    for u in urls:
        _, path = fsspec.core.url_to_fs(u)
        if _glob.has_magic(path):
            found = sorted(p for p in fs.glob(path) if fs.isfile(p))
        elif fs.isdir(path):
            found = sorted(p for p in fs.ls(path, detail=False) if fs.isfile(p))
        elif fs.isfile(path):
            found = [path]
        else:
            found = []
        if not found:
            raise FileNotFoundError(f"no such file: {u}")
        paths += found
    return fs, paths, [int(fs.size(p)) for p in paths]


@dataclasses.dataclass(frozen=True)
class TextOp:
    """Partition ``i``: the lines that *start* in the ``i``-th of ``n`` byte ranges of the
    files laid end to end. A task opens each file it needs, seeks, and skips the line
    under way at its start, so every line belongs to exactly one partition."""

    fs: fsspec.AbstractFileSystem
    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    n: int
    encoding: str = "utf-8"

    def compute(self, ctx: TaskContext, i: int) -> list[str]:
        start, stop = bounds(sum(self.sizes), self.n, i)
        lines: list[str] = []
        offset = 0
        for path, size in zip(self.paths, self.sizes):
            lo, hi = max(start - offset, 0), min(stop - offset, size)
            if lo < hi:
                lines += self._read(path, lo, hi)
            offset += size
        return lines

    def _read(self, path: str, lo: int, hi: int) -> list[str]:
        out = []
        with self.fs.open(path, "rb") as f:
            pos = 0
            if lo > 0:
                f.seek(lo - 1)
                pos = lo - 1 + len(f.readline())  # the first line start at or after lo
            while pos < hi:
                line = f.readline()
                if not line:
                    break
                pos += len(line)
                out.append(line.rstrip(b"\n").removesuffix(b"\r").decode(self.encoding))
        return out


def text_source(
    runner: StageRunner, url: str | list[str], partitions: int | None = None, encoding: str = "utf-8"
) -> Source:
    """Lines of the files ``url`` names, without their line ending (``\\n`` or ``\\r\\n``)."""
    fs, paths, sizes = _expand(url)
    n = _check_partitions(default_partitions(runner, sum(sizes)) if partitions is None else partitions)
    return Source(n=n, name="read_text", op=TextOp(fs, tuple(paths), tuple(sizes), n, encoding))


@dataclasses.dataclass(frozen=True)
class NpyOp:
    """Partition ``i``: rows ``bounds(shape[0], n, i)`` of a C-ordered ``.npy`` file whose
    data starts at byte ``offset``."""

    fs: fsspec.AbstractFileSystem
    path: str
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    n: int

    def compute(self, ctx: TaskContext, i: int) -> np.ndarray:
        lo, hi = bounds(self.shape[0], self.n, i)
        out = np.empty((hi - lo,) + self.shape[1:], self.dtype)
        if out.nbytes:
            buf = memoryview(out.reshape(-1).view(np.uint8))
            with self.fs.open(self.path, "rb") as f:
                f.seek(self.offset + lo * (out.nbytes // (hi - lo)))
                got = 0
                while got < len(buf):
                    k = f.readinto(buf[got:])
                    if not k:
                        raise ValueError(f"{self.path}: the .npy file is truncated")
                    got += k
        return out


def read_npy_header(fs: fsspec.AbstractFileSystem, path: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` of a ``.npy`` file, or ``ValueError`` if it is not
    one whose rows can be read by range (object arrays, Fortran order, 0-d, truncated)."""
    fmt = np.lib.format
    with fs.open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except ValueError as exc:
            raise ValueError(f"{path} is not a readable .npy file: {exc}") from exc
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError(f"{path}: arrays of Python objects cannot be read by rows")
    if not shape:
        raise ValueError(f"{path}: a 0-d array has no rows")
    if fortran and len(shape) > 1:
        raise ValueError(f"{path}: Fortran-ordered arrays cannot be read by rows; save it in C order")
    expected = offset + math.prod(shape) * dtype.itemsize
    if fs.size(path) < expected:
        raise ValueError(f"{path}: the .npy file is truncated ({fs.size(path)} of {expected} bytes)")
    return tuple(shape), dtype, offset


def npy_source(runner: StageRunner, url: str, partitions: int | None = None) -> Source:
    """The rows of one ``.npy`` file, as array partitions."""
    fs, paths, sizes = _expand(url)
    if len(paths) != 1:
        raise ValueError(f"read_npy reads one file; {url!r} names {len(paths)}")
    shape, dtype, offset = read_npy_header(fs, paths[0])
    if partitions is None:
        partitions = min(default_partitions(runner, sizes[0]), max(1, shape[0]))
    n = _check_partitions(partitions)
    return Source(n=n, name="read_npy", op=NpyOp(fs, paths[0], offset, shape, dtype, n))

