"""Python face of the native pagers (runtime/paging/native/driver_pager.c, worker_pager.c).

`DriverPager` and `WorkerPager` implement the `DriverPaging` / `WorkerPaging`
protocols of `paging_api`: the control plane calls them at stage and task
boundaries, while page faults, fetches and page serving all happen in native
threads. This module only checks inputs, turns C errors into exceptions and
converts counters into plain dicts.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any

import numpy as np
from clamor.runtime.credentials import TLSMaterial
from clamor.runtime.errors import ClamorError
from clamor.runtime.paging import arena, read_sets
from clamor.runtime.paging.native import _native
from clamor.runtime.paging.page_client import (
    ERR_BAD_REQUEST,
    ERR_NO_VERSION,
    ERR_PAGE_RANGE,
)
from clamor.runtime.paging.paging_api import PagingConfig, PagingInfo, PagingKind

ffi, lib = _native.ffi, _native.lib

TRANSPORTS = ("auto", "shm", "shm-copy", "tcp")
#: How workers record read sets (docs/paging.md, "Read sets").
READ_SET_MODES = ("resident", "exact")
#: A resident read set lists whole aligned blocks of this many bytes that hold a resident
#: page (the fault-around block): sparse lookups leave pages resident here and there,
#: and a run per page made every report megabytes (docs/paging.md, "Read sets").
READ_SET_BLOCK = 2 << 20
_ERRLEN = 512
MIN_CACHE_PAGES = 4  # a non-zero page-cache budget is never below this many pages
#: Worker ids are ``0 .. MAX_WORKERS - 1`` (1,024): the driver's page directory records
#: holders as 16-bit ids with a 1,024-bit set per hot page, and same-host zero copy has
#: one shoot-down slot per id (native/api.h: CLAMOR_MAX_WORKERS).
MAX_WORKERS = int(lib.CLAMOR_MAX_WORKERS)
WORKER_LIMIT_REASON = (
    f"the driver's page directory tracks which workers hold each page for at most "
    f"{MAX_WORKERS:,} workers (ids 0..{MAX_WORKERS - 1})"
)
_worker_pager: WorkerPager | None = None


class PagingError(ClamorError):
    """The native pager could not start or was misused."""


def _struct_dict(cdata: Any, ctype: str) -> dict[str, int]:
    return {name: int(getattr(cdata, name)) for name, _ in ffi.typeof(ctype).fields}


def _tls_pem(tls: TLSMaterial | None) -> tuple[Any, list]:
    """A ``clamor_tls_pem *`` for the native side (NULL without TLS) and the buffers it points into."""
    if tls is None:
        return ffi.NULL, []
    if not isinstance(tls, TLSMaterial):
        raise TypeError(f"tls must be a TLSMaterial or None, not {type(tls).__name__}")
    parts = []
    for name in ("ca", "cert", "key"):
        pem = getattr(tls, name)
        if not isinstance(pem, bytes) or b"-----BEGIN" not in pem:
            raise ValueError(f"TLS {name} must be PEM bytes")
        parts.append(ffi.from_buffer(pem))
    pem = ffi.new("clamor_tls_pem *")
    pem.ca, pem.ca_len = parts[0], len(parts[0])
    pem.cert, pem.cert_len = parts[1], len(parts[1])
    pem.key, pem.key_len = parts[2], len(parts[2])
    return pem, parts


def _is_local(host: str) -> bool:
    """True when `host` names this machine (so shared memory can be used)."""
    if host in ("127.0.0.1", "localhost", socket.gethostname()):
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


class DriverPager:
    """The driver's pager: versions, write tracking, directory and page server.

    One per process (the native side is a singleton), owned by a `Cluster`.
    With ``tls``, every page-protocol connection in the cluster (to the driver
    and between workers) is mutual TLS with the cluster CA, then the token.
    """

    def __init__(
        self,
        *,
        page_size: arena.Size | None = None,
        token: bytes,
        host: str = "127.0.0.1",
        transport: str = "auto",
        replication: bool = True,
        readahead: bool = True,
        read_sets: str = "resident",
        tls: TLSMaterial | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if read_sets not in READ_SET_MODES:
            raise ValueError(f"read_sets must be one of {READ_SET_MODES}, not {read_sets!r}")
        if page_size:
            page_size = arena.check_page_size(page_size)  # a ValueError, before anything starts
        if not token:
            raise ValueError("the page protocol needs a non-empty cluster token")
        if lib.clamor_driver_port() >= 0:
            raise PagingError(
                "the driver pager is already running: another clamor.Cluster shares this "
                "process's arena; close it first (one paging cluster per process)"
            )
        arena.get_arena()
        self.page_size = page_size or arena.page_size()  # in bytes: checked above
        self.arena_size = int(lib.clamor_arena_size())
        self.host, self.transport = host, transport
        self.readahead = readahead
        self.read_sets = read_sets
        self._token = bytes(token)
        self.tls = tls
        pem, _keep = _tls_pem(tls)
        err = ffi.new("char[]", _ERRLEN)
        port = lib.clamor_driver_start(
            self.page_size, self._token, len(self._token), host.encode(), 0, int(replication), pem, err, _ERRLEN
        )
        if port < 0:
            raise PagingError(f"cannot start the driver pager: {ffi.string(err).decode()}")
        self.port = int(port)
        self._closed = False
        self._final_stats: dict | None = None

    # -- DriverPaging -----------------------------------------------------
    def worker_config(self, worker_id: int, host: str) -> PagingConfig:
        if not 0 <= worker_id < MAX_WORKERS:
            raise PagingError(f"worker id {worker_id} is past the limit: {WORKER_LIMIT_REASON}")
        shm = {}
        if self.transport in ("shm", "shm-copy") or (self.transport == "auto" and _is_local(host)):
            pid = os.getpid()
            shm["shm_arena_path"] = f"/proc/{pid}/fd/{lib.clamor_arena_fd()}"
            shm["shm_state_path"] = f"/proc/{pid}/fd/{lib.clamor_driver_state_fd()}"
            if self.transport != "shm-copy":  # map the arena's pages instead of copying them
                shm["shm_zap_path"] = f"/proc/{pid}/fd/{lib.clamor_driver_zap_fd()}"
        return PagingConfig(
            kind=PagingKind.ARENA, arena_size=self.arena_size, page_size=self.page_size,
            driver_host=self.host, driver_page_port=self.port, bind_host=host,
            readahead=self.readahead, read_sets=self.read_sets,
            tls=self.tls,  # the config travels over the (then TLS) control plane
            **shm,
        )  # fmt: skip

    def worker_ready(self, worker_id: int, info: PagingInfo) -> None:
        if lib.clamor_driver_set_peer(worker_id, info.host.encode(), int(info.page_port)):
            raise PagingError(f"worker {worker_id}: bad page server address {info.host}:{info.page_port}")
        if info.shm and not info.zero_copy:
            lib.clamor_driver_note_shm_copies()

    def begin_stage(self) -> tuple[int, np.ndarray]:
        self._check_open()
        epoch = int(lib.clamor_driver_begin_stage())
        n = int(lib.clamor_driver_invalidated(ffi.NULL, 0))
        pages = np.empty(n, np.uint64)
        if n:
            lib.clamor_driver_invalidated(ffi.from_buffer("uint64_t[]", pages), n)
        return epoch, pages

    def end_stage(self) -> None:
        lib.clamor_driver_end_stage()

    def sealed(self) -> np.ndarray | None:
        n = int(lib.clamor_driver_sealed(ffi.NULL, 0))
        if n == 2**64 - 1:
            return None
        pages = np.empty(n, np.uint64)
        if n:
            lib.clamor_driver_sealed(ffi.from_buffer("uint64_t[]", pages), n)
        return pages

    def versions_at(self, runs: bytes, epoch: int) -> np.ndarray:
        words = np.frombuffer(runs, np.uint64)  # two a run: the first page, the count
        total = int(np.frombuffer(runs, read_sets.RUN)["count"].sum()) if runs else 0
        out = np.empty(total, np.uint32)
        n = int(lib.clamor_driver_versions_at(ffi.from_buffer("uint64_t[]", words), len(words) // 2,
                                              max(0, min(int(epoch), 2**32 - 1)),
                                              ffi.from_buffer("uint32_t[]", out), total))  # fmt: skip
        if n != total:
            raise PagingError(f"a resident read set outside the arena, or the pager is closed (epoch {epoch})")
        return out

    def worker_lost(self, worker_id: int) -> None:
        lib.clamor_driver_drop_worker(worker_id)

    def trim_versions(self, floor: int) -> int:
        """Free the version-log entries no epoch >= ``floor`` reads; return the bytes freed.

        Stages at older epochs are refused from then on (never served wrong bytes).
        """
        return int(lib.clamor_driver_trim_log(max(0, min(int(floor), 2**32 - 1))))

    def release(self, epoch: int) -> None:
        """No stage reads epochs ``<= epoch`` any more (no lineage or checkpoint pins
        them): until the next stage the driver's writes are not copied into the version
        log, and on Linux 6.7+ not even trapped (async write-protect, PAGEMAP_SCAN)."""
        lib.clamor_driver_release(max(0, min(int(epoch), 2**32 - 1)))

    def retain(self, epoch: int) -> bool:
        """Epoch ``epoch`` is needed again: undo its release; ``False`` if a write since
        kept no copy of what it replaced (that epoch's versions are gone)."""
        return lib.clamor_driver_retain(max(0, min(int(epoch), 2**32 - 1))) == 0

    def version_log_bytes(self) -> int:
        if self._final_stats is not None:
            return self._final_stats["version_log_bytes"]
        out = ffi.new("clamor_driver_stats *")
        lib.clamor_driver_get_stats(out)
        return int(out.version_log_bytes)

    def stats(self) -> dict:
        """The counters; after :meth:`close`, their last values."""
        if self._final_stats is not None:
            return self._final_stats
        out = ffi.new("clamor_driver_stats *")
        lib.clamor_driver_get_stats(out)
        raw = _struct_dict(out[0], "clamor_driver_stats")
        return {
            "page_size": raw["page_size"],
            "arena_bytes": self.arena_size,
            "epoch": raw["epoch"],
            "bytes_served_by_driver": raw["bytes_served"] + raw["shm_bytes"],
            "bytes_served_by_peers": raw["peer_bytes"],
            "bytes_mapped": raw["mapped_bytes"],
            "invalidations": raw["invalidations"],
            "version_log_bytes": raw["version_log_bytes"],
            "write_tracking": "async" if raw["async_write_tracking"] else "trap",
            "driver": raw,
        }

    def close(self) -> None:
        """Stop the page server and free the tables. The native side waits for calls in
        flight on other threads; calls after this find no pages (``page_stats`` and
        ``cached_bytes`` empty, ``stats`` the last values, the rest ``PagingError``)."""
        if not self._closed:
            self._closed = True
            self._final_stats = self.stats()
            lib.clamor_driver_stop()

    def _check_open(self) -> None:
        if self._closed:
            raise PagingError("the driver pager is closed (its cluster was closed)")

    # -- inspection -------------------------------------------------------
    def page_stats(self, first: int = 0, count: int | None = None) -> dict[str, np.ndarray]:
        """Per-page counters for pages [first, first + count)."""
        if count is None:
            count = self.used_pages() - first
        count = max(0, int(count))
        arrays = {
            "requests": np.zeros(count, np.uint64),
            "driver_bytes": np.zeros(count, np.uint64),
            "peer_bytes": np.zeros(count, np.uint64),
            "holders": np.zeros(count, np.uint32),
            "version": np.zeros(count, np.uint32),
        }
        if count:
            ptr = {k: ffi.from_buffer(("uint64_t[]" if v.dtype == np.uint64 else "uint32_t[]"), v) for k, v in arrays.items()}
            lib.clamor_driver_page_stats(
                first, count, ptr["requests"], ptr["driver_bytes"], ptr["peer_bytes"], ptr["holders"], ptr["version"]
            )
        return arrays

    def cached_bytes(self, reads: tuple[tuple[int, int], ...]) -> dict[int, int]:
        """Worker -> bytes of the pages of these arena byte ranges ``(offset, nbytes)``
        whose current version it caches, by the directory (placement by pages)."""
        held = []
        for offset, nbytes in reads:
            first = int(offset) // self.page_size
            count = max(0, -(-(int(offset) + int(nbytes)) // self.page_size) - first)
            if count:
                held.append(self.page_holders(first, count)[1])
        pages = np.bincount(np.concatenate(held)) if held else np.zeros(0, np.int64)  # per worker
        return {int(w): int(pages[w]) * self.page_size for w in np.flatnonzero(pages)}

    def page_holders(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The directory for pages ``[first, first + count)``: how many workers hold each
        page's current version (``uint32``, 0 past the arena's end), and those workers'
        ids, ascending, page after page (``uint16``): page ``i``'s are
        ``ids[offsets[i]:offsets[i + 1]]`` with ``offsets = np.r_[0, np.cumsum(counts, dtype=np.int64)]``."""
        count = max(0, int(count))
        counts = np.zeros(count, np.uint32)
        if not count:
            return counts, np.zeros(0, np.uint16)
        room = 2 * count
        while True:
            ids = np.zeros(max(room, 1), np.uint16)
            total = int(lib.clamor_driver_page_holders(
                first, count, ffi.from_buffer("uint32_t[]", counts), ffi.from_buffer("uint16_t[]", ids), room
            ))  # fmt: skip
            if total <= room:
                return counts, ids[:total]
            room = total + total // 4  # holders came meanwhile: ask again with room for them

    def used_pages(self) -> int:
        """Pages up to the arena's high-water mark (everything ever handed out)."""
        return -(-arena.arena_stats()["high_water"] // self.page_size)

    def read_version(self, page: int, epoch: int) -> bytes:
        """The bytes of `page` as a task of stage `epoch` reads them (from the version log if needed)."""
        out = bytearray(self.page_size)
        self.read_version_into(page, epoch, out)
        return bytes(out)

    def read_version_into(self, page: int, epoch: int, out: Any) -> None:
        """:meth:`read_version` into ``out``, a writable buffer of a page (no copy made);
        :class:`PagingError` once the pager is closed or the version is gone."""
        self._check_open()
        rc = lib.clamor_driver_read_version(page, epoch, ffi.from_buffer("uint8_t[]", out, require_writable=True))
        if rc < 0:
            raise PagingError(f"page {page} at epoch {epoch}: {'page out of range' if rc == -2 else 'no such version'}")


class WorkerPager:
    """A worker's pager: the read-only arena range, its fault handler and page server."""

    def __init__(self, worker_id: int, config: PagingConfig, token: bytes) -> None:
        """``token``: the cluster token, the worker's own (the driver never sends it)."""
        global _worker_pager
        if _worker_pager is not None:
            raise PagingError("this process already has a worker pager")
        self.worker_id = worker_id
        self.page_size = int(config.page_size)
        self.arena_size = int(config.arena_size)
        self.bind_host = config.bind_host
        tls = config.tls
        pem, _keep = _tls_pem(tls)
        err = ffi.new("char[]", _ERRLEN)
        shm_arena = config.shm_arena_path.encode()
        shm_state = config.shm_state_path.encode()
        shm_zap = config.shm_zap_path.encode()
        port = lib.clamor_worker_start(
            worker_id, self.arena_size, self.page_size, token, len(token),
            config.driver_host.encode(), int(config.driver_page_port),
            shm_arena, shm_state, shm_zap, self.bind_host.encode(), int(bool(config.readahead)),
            pem, err, _ERRLEN,
        )  # fmt: skip
        if port < 0:
            raise PagingError(f"worker {worker_id}: cannot start the pager: {ffi.string(err).decode()}")
        self.port = int(port)
        self.uses_shm = bool(shm_arena)
        self.zero_copy = bool(shm_zap)
        self.tls = tls is not None
        self.cache_limit_pages = cache_limit_pages(int(config.page_cache_bytes), self.page_size)
        lib.clamor_worker_set_cache_limit(self.cache_limit_pages)
        lib.clamor_worker_set_exact_read_sets(int(config.read_sets == "exact"))
        self._read_set: tuple[int, bytes] = (0, b"")  # (generation, runs) of the last resident read set
        self._runs = np.empty(2 * 1024, np.uint64)  # room for the resident read set's runs (grows)
        self._read_set_block = max(1, READ_SET_BLOCK // config.page_size)  # pages a resident run is made of
        base = lib.clamor_worker_base()
        view = np.frombuffer(ffi.buffer(base, self.arena_size), dtype=np.uint8)
        view.flags.writeable = False
        self._bytes = view
        self._base = int(ffi.cast("uintptr_t", base))
        _worker_pager = self

    def info(self) -> PagingInfo:
        return PagingInfo(host=self.bind_host, page_port=self.port, shm=self.uses_shm,
                          zero_copy=self.zero_copy, tls=self.tls, cache_limit_pages=self.cache_limit_pages)  # fmt: skip

    def begin_task(self, epoch: int) -> None:
        lib.clamor_worker_begin_task(epoch)

    def end_task(self) -> tuple[bytes, bool]:
        """The task's read set, packed as runs (:mod:`~clamor.runtime.paging.read_sets`),
        and whether it is the resident one (no versions: the driver reads them).

        In resident mode it is the same from task to task until a page is mapped or
        dropped, so it is read and packed again only when its generation changed."""
        generation = int(lib.clamor_worker_read_set_generation())
        if generation:  # resident mode: the runs come packed from the native side
            if generation != self._read_set[0]:
                self._read_set = (generation, self._resident_runs())
            return self._read_set[1], True
        n = int(lib.clamor_worker_end_task(ffi.NULL, ffi.NULL, 0))
        if n == 0:  # a task that read no arena page (tiny tasks; resident mode before any)
            return b"", False
        pages, versions = ffi.new("uint64_t[]", n), ffi.new("uint32_t[]", n)
        n = min(n, int(lib.clamor_worker_end_task(pages, versions, n)))
        p = np.frombuffer(ffi.buffer(pages, 8 * n), dtype=np.uint64)
        v = np.frombuffer(ffi.buffer(versions, 4 * n), dtype=np.uint32)
        order = np.argsort(p, kind="stable")  # exact mode: in the order first touched
        return read_sets.encode(p[order], v[order]), False

    def _resident_runs(self) -> bytes:
        """The resident read set as :data:`read_sets.RUN` records, whole blocks of
        :data:`READ_SET_BLOCK` bytes, one pass in C (the set can span every page of a
        large array: encoding it page by page here cost a millisecond a task)."""
        while True:
            n = int(lib.clamor_worker_resident_runs(self._read_set_block, ffi.from_buffer("uint64_t[]", self._runs),
                                                    len(self._runs) // 2))  # fmt: skip
            if 2 * n <= len(self._runs):
                return self._runs[: 2 * max(n, 0)].tobytes()
            self._runs = np.empty(4 * n, np.uint64)  # kept: a fresh large buffer is fresh pages to fault in

    def invalidate(self, epoch: int, pages: np.ndarray) -> None:
        buf = np.ascontiguousarray(pages, np.uint64)
        lib.clamor_worker_invalidate(epoch, ffi.from_buffer("uint64_t[]", buf), len(buf))

    def stats(self) -> dict:
        out = ffi.new("clamor_worker_stats *")
        lib.clamor_worker_get_stats(out)
        return _struct_dict(out[0], "clamor_worker_stats")

    def array(self, offset: int, shape: tuple, dtype: np.dtype, strides: tuple) -> np.ndarray:
        """A read-only, zero-copy view of arena bytes at `offset` (pages fault in on touch)."""
        return np.ndarray(shape, dtype=dtype, buffer=self._bytes, offset=offset, strides=strides)

    def offset_of(self, x: np.ndarray) -> int | None:
        """The arena offset of ``x``'s data, or None if it lies outside this worker's arena
        mapping (``ctypes.data``: a quarter of ``__array_interface__``'s cost, which
        matters to a prefetch of a few rows)."""
        offset = x.ctypes.data - self._base
        return offset if 0 <= offset < self.arena_size else None

    def contains(self, x: np.ndarray) -> bool:
        """Whether ``x``'s data lies in this worker's arena mapping."""
        return self.offset_of(x) is not None

    def prefetch(self, pages: np.ndarray) -> int:
        """Make these pages (sorted, unique) resident for the running task, as one
        pipelined stream; how many are (the rest fault in as usual)."""
        pages = np.ascontiguousarray(pages, dtype=np.uint64)
        if not len(pages):
            return 0
        return int(lib.clamor_worker_prefetch(ffi.from_buffer("uint64_t[]", pages), len(pages)))

    def prefetch_rows(self, start: int, stride: int, row_bytes: int, rows: np.ndarray, axis_len: int) -> int:
        """Like :meth:`prefetch` for rows ``rows`` (of ``axis_len``; negative ones count
        from the end) of an array at arena offset ``start``, each ``row_bytes`` long, one
        every ``stride`` bytes: small rows bring in just their OS pages where that is
        cheaper (mapped in place on the driver's host), and pages mapped already are
        skipped without a system call."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        n = int(lib.clamor_worker_prefetch_rows(start, stride, row_bytes, ffi.from_buffer("int64_t[]", rows),
                                                 len(rows), axis_len))  # fmt: skip
        if n < 0:
            raise IndexError(f"index out of bounds for an axis of length {axis_len}")
        return n

    def gather(self, offsets: np.ndarray, row_bytes: int, out: np.ndarray) -> bool:
        """Copy the ``row_bytes`` at each arena offset into ``out`` (C-contiguous), as the
        running task's epoch reads them, without their pages (from the driver's memory on
        its host, else asked of the driver); ``False`` where this worker does not (exact
        read sets): the caller reads the rows through the arena instead."""
        offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
        rc = int(lib.clamor_worker_gather(ffi.from_buffer("uint64_t[]", offsets), len(offsets), row_bytes,
                                          ffi.from_buffer("uint8_t[]", out, require_writable=True)))  # fmt: skip
        if rc == -2:
            raise PagingError("a row to gather lies outside the arena")
        if rc > 0:
            why = _ROWS_REFUSED.get(rc, f"error {rc}")
            raise PagingError(f"the driver refused to send rows of {row_bytes} bytes: {why}")
        return rc == 0

    def touch(self, offset: int, length: int) -> None:
        """Fault in [offset, offset + length) now, e.g. before handing it to a system call."""
        if lib.clamor_worker_touch(offset, length):
            raise PagingError(f"range {offset}+{length} is outside the arena")


#: Why the driver refused a CL_ROWS request.
_ROWS_REFUSED = {ERR_BAD_REQUEST: "a bad request", ERR_PAGE_RANGE: "a row lies outside its arena",
                 ERR_NO_VERSION: "it no longer keeps the versions of the task's epoch"}  # fmt: skip


def cache_limit_pages(budget_bytes: int, page_size: int) -> int:
    """The page-cache limit in whole pages for a budget in bytes (0: unlimited).

    Rounded down, so the cache stays within the budget, but never below
    MIN_CACHE_PAGES: the read-ahead batch is a quarter of the limit, and a
    fault handler needs a page to evict besides the one it is installing.
    """
    if budget_bytes < 0:
        raise ValueError(f"page_cache_bytes must be >= 0, not {budget_bytes}")
    if budget_bytes == 0:
        return 0
    return max(MIN_CACHE_PAGES, budget_bytes // page_size)


def worker_pager() -> WorkerPager | None:
    """This process's worker pager, if it is a worker."""
    return _worker_pager


def selected_rows(n: int, index: Any, what: str = "prefetch") -> np.ndarray:
    """The rows of an axis of length ``n`` that ``index`` selects (int64; negative and
    out-of-bounds ones are the native side's to resolve and refuse), without building an
    ``arange(n)`` (a 10^8-row weight vector would cost 800 MB per call)."""
    if isinstance(index, slice):
        return np.arange(*index.indices(n))
    if isinstance(index, range):
        return np.arange(index.start, index.stop, index.step)
    idx = np.asarray(index)
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise IndexError(f"boolean index of shape {idx.shape} does not match an axis of length {n}")
        return np.flatnonzero(idx)
    if idx.dtype.kind not in "iu":
        raise IndexError(f"{what} indices must be integers, a slice or a boolean mask, not {idx.dtype}")
    if idx.dtype.kind == "u" and idx.size and int(idx.max()) >= n:  # would wrap around as int64
        raise IndexError(f"index out of bounds for an axis of length {n}")
    return idx.ravel()


def contiguous_rows(array: Any, index: Any, what: str) -> np.ndarray | None:
    """The rows of ``array`` that ``index`` selects along the first axis (int64, negative
    ones resolved), where each row is one run of bytes and the index is one numpy reads
    row by row; else ``None``. ``IndexError`` for a row out of bounds."""
    if not isinstance(array, np.ndarray) or not array.ndim or isinstance(index, tuple) or array.dtype.hasobject:
        return None
    inner = array.shape[1:]
    contiguous = tuple(array.itemsize * math.prod(inner[i + 1:]) for i in range(len(inner)))
    if array.strides[1:] != contiguous and math.prod(inner) > 1:
        return None  # a row is not one run of bytes
    n = array.shape[0]
    rows = selected_rows(n, index, what).astype(np.int64, copy=False)
    rows = np.where(rows < 0, rows + n, rows)
    if len(rows) and (rows.min() < 0 or rows.max() >= n):
        bad = rows[(rows < 0) | (rows >= n)][0]
        raise IndexError(f"index {bad} is out of bounds for axis 0 with size {n}")
    return rows


def rows_layout(array: np.ndarray, index: Any, rows: np.ndarray) -> tuple[tuple[int, ...], int]:
    """For rows ``rows`` that ``index`` selects (:func:`contiguous_rows`): the shape of
    ``array[index]`` (an integer index keeps its own shape) and the bytes of one row."""
    lead = np.shape(index) if np.asarray(index).dtype.kind in "iu" else (len(rows),)
    return lead + array.shape[1:], array.itemsize * math.prod(array.shape[1:])


def prefetch(array: np.ndarray, index: Any = None) -> int:
    """Bring in the arena pages that ``array[index]`` reads (all of ``array`` without an
    index) now, as one pipelined stream, instead of one page fault per page.

    For a task that knows its indices up front (lookups, a gather, a partition of an
    arena array)::

        def task(ids):
            clamor.prefetch(table, ids)      # one stream of requests, not len(ids) faults
            return table[ids].sum()

    ``index`` selects along the first axis: integers, a slice or a boolean mask. Returns
    how many pages are resident; elsewhere than on a worker, or for an array outside the
    arena, it does nothing and returns 0. The pages count in the task's read set.
    """
    pager = _worker_pager
    if pager is None or not isinstance(array, np.ndarray) or array.size == 0:
        return 0
    start = pager.offset_of(array)
    if start is None:
        return 0
    ps = pager.page_size
    if index is None or array.ndim == 0:
        low = sum(min(0, (n - 1) * st) for n, st in zip(array.shape, array.strides))
        high = sum(max(0, (n - 1) * st) for n, st in zip(array.shape, array.strides)) + array.itemsize
        first, last = (start + low) // ps, (start + high - 1) // ps
        return pager.prefetch(np.arange(first, last + 1, dtype=np.uint64))
    rows = selected_rows(array.shape[0], index)
    if rows.size == 0:
        return 0
    row_bytes = max(1, array.itemsize * math.prod(array.shape[1:]))
    return pager.prefetch_rows(start, array.strides[0], row_bytes, rows, array.shape[0])
