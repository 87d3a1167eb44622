"""Checkpoints: the arena, named variables and persisted datasets, written in the
background while the notebook keeps running, and brought back in a fresh process
(after SDG and Sparkle). The files are described in ``checkpoint_files``.

``start(cluster, path, variables, datasets)`` returns at once with a
:class:`CheckpointHandle`. What it saves is the state *at the call*:

- the arena, copy-on-write: the call seals a new epoch with the driver pager's
  stage protocol, between two stages (every used page becomes write-protected;
  the first later driver write to a page copies its old bytes into the version
  log), then a background thread writes each page as of that epoch
  (``DriverPager.read_version_into``). The epoch stays pinned in the cluster's
  version keeper until the pages are written;
- the allocator's live blocks (``arena.live_blocks``), so that a restore
  re-creates them at the same offsets and later allocations never overlap them;
- the variables, pickled during the call with ``shipping.dumps``: arena arrays of
  at least a page inside them (a KDTree built under ``clamor.shared()``) travel
  as ``ArenaRef``s and are rebuilt over the restored arena, writable;
- the partitions of persisted datasets, fetched from the workers in the
  background (persisted partitions never change, so a later fetch is exact).

``restore(path)`` in a fresh process creates the arena with the saved geometry
(or uses the existing one if it is large enough), reserves the saved blocks at
their offsets (``CheckpointError`` if any byte of them is already in use),
copies the pages into them checking every page's CRC, and unpickles the
variables. A restored block belongs to the arrays rebuilt over it and is freed
when the last of them is collected; blocks no variable refers to are freed at
once (nothing can reach them) unless ``keep_unreferenced=True``. Datasets come
back as lists of partition values, or, given a cluster, as fresh persisted
datasets with exactly those partitions (their old lineage is not restored).

The module reaches a cluster only through :class:`CheckpointHost`, what a ``Cluster``
offers it (seal and release an epoch, read a page at an epoch, fetch a partition, its
:class:`CheckpointLog`); and the arena only through ``runtime/paging/arena.py``.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import io
import json
import os
import pickle
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from clamor.runtime.data import checkpoint_files as files
from clamor.runtime.data.checkpoint_files import CheckpointError, read_manifest
from clamor.runtime.errors import ClamorError, SerializationError
from clamor.runtime.net import shipping
from clamor.runtime.paging import arena
from clamor.runtime.stage import PartitionKey

if TYPE_CHECKING:
    from clamor.runtime.data.dataset import Dataset

__all__ = [
    "CheckpointError",
    "CheckpointHandle",
    "CheckpointHost",
    "CheckpointLog",
    "Restored",
    "read_manifest",
    "restore",
    "start",
]

_BY_VALUE = 1 << 62  # min_ref_bytes that sends every array by value


# --- what a cluster offers, and its log of checkpoints -------------------------------

_lock = threading.Lock()
_paths: set[str] = set()  # the directories being written, in this process


class CheckpointLog:
    """A cluster's checkpoints: those being written, and the epoch of the last that completed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[CheckpointHandle] = set()
        #: The epoch of the last checkpoint that completed (``None``: none did). Its arena
        #: pages, variables and datasets are on disk.
        self.latest: int | None = None

    def pinned(self) -> list[int]:
        """Epochs of checkpoints whose pages are still being written: the version log keeps
        what they read until then."""
        with self._lock:
            return sorted(h.epoch for h in self._pending if h._pinned)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the checkpoints in progress to finish; False on timeout. A cluster calls
        this before stopping its pager: the writers read it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            handles = list(self._pending)
        for handle in handles:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not handle.wait(left):
                return False
        return True

    def _started(self, handle: CheckpointHandle) -> None:
        with self._lock:
            self._pending.add(handle)

    def _ended(self, handle: CheckpointHandle, completed: bool) -> None:
        with self._lock:
            self._pending.discard(handle)
            if completed:
                self.latest = max(handle.epoch, self.latest or 0)


class CheckpointHost(Protocol):
    """What a cluster offers this module (``Cluster`` is one)."""

    checkpoints: CheckpointLog

    def seal_epoch(self) -> int | None:
        """Seal a new arena epoch between two stages and pin its page versions; ``None``
        if the cluster keeps no versions (its paging has no version log)."""
        ...

    def release_epoch(self, epoch: int) -> None:
        """Unpin an epoch :meth:`seal_epoch` gave."""
        ...

    def read_page(self, page: int, epoch: int, out: np.ndarray) -> None:
        """Page ``page`` as epoch ``epoch`` reads it, into ``out`` (raises once it is gone)."""
        ...

    def fetch(self, key: PartitionKey) -> Any:
        """A partition's value, brought to the driver."""
        ...

    def put(self, key: PartitionKey, value: Any) -> None:
        """Keep ``value`` in the driver as partition ``key``."""
        ...

    @property
    def page_size(self) -> int: ...


# --- the handle ----------------------------------------------------------------------


class CheckpointHandle:
    """A checkpoint being written in the background. ``epoch``: the arena epoch it saves
    (0 without a pager: then the pages were copied before ``start`` returned)."""

    def __init__(self, path: str, epoch: int) -> None:
        self.path = path
        self.epoch = epoch
        self.started = time.time()
        self._pinned = epoch > 0  # until its pages are written (epoch 0: no pager)
        self._future: concurrent.futures.Future = concurrent.futures.Future()

    def done(self) -> bool:
        """Whether it finished, successfully or not."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it finishes; False if ``timeout`` seconds passed first."""
        concurrent.futures.wait([self._future], timeout)
        return self._future.done()

    def result(self, timeout: float | None = None) -> dict:
        """The manifest once complete; raises its :class:`CheckpointError` if it failed,
        ``TimeoutError`` if it is still running after ``timeout`` seconds."""
        return self._future.result(timeout)

    @property
    def error(self) -> BaseException | None:
        """Why it failed; ``None`` while running or after success."""
        return self._future.exception() if self._future.done() else None

    def add_done_callback(self, fn: Callable[[CheckpointHandle], None]) -> None:
        """Call ``fn(handle)`` when it finishes (at once if it has)."""
        self._future.add_done_callback(lambda _: fn(self))

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self.error else "done")
        return f"<CheckpointHandle {self.path} epoch {self.epoch} {state}>"


# --- start ---------------------------------------------------------------------------


def start(
    cluster: CheckpointHost | None,
    path: str | os.PathLike,
    variables: dict[str, Any] | None = None,
    datasets: dict[str, Any] | None = None,
) -> CheckpointHandle:
    """Begin writing a checkpoint of the arena, ``variables`` and the persisted
    ``datasets`` to the directory ``path`` (replaced when the new one is complete).

    Returns once the state is sealed: the variables are pickled, the arena's epoch is
    sealed copy-on-write (after a stage running in another thread reaches its barrier)
    and datasets not computed yet are computed (one action). The
    pages and the partitions are written by a background thread; the notebook may go
    on writing arena arrays. ``cluster`` may be ``None`` (or a cluster without an
    arena pager): then the pages are copied before this returns. Errors found here
    (an unpicklable variable, a dataset that is not persisted, an unwritable path)
    raise at once; later ones end up in ``handle.error``.
    """
    path = os.path.abspath(os.fspath(path))
    variables, datasets = dict(variables or {}), dict(datasets or {})
    _check_datasets(cluster, datasets)
    with _lock:
        if path in _paths:
            raise CheckpointError(f"a checkpoint to {path} is already being written")
        _paths.add(path)
    writer: _Writer | None = None
    try:
        tmp = path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # the remains of a crashed checkpoint
        os.makedirs(tmp)
        _compute_missing(datasets)
        writer = _Writer(cluster, path, variables, datasets)
        writer.seal()
        threading.Thread(target=writer.run, name="clamor-checkpoint", daemon=False).start()
        return writer.handle
    except BaseException:
        if writer is not None:
            writer._finish(completed=False)  # sealed (perhaps), but the thread did not start
        with _lock:
            _paths.discard(path)
        shutil.rmtree(path + ".tmp", ignore_errors=True)
        raise


def _check_datasets(cluster: CheckpointHost | None, datasets: dict[str, Any]) -> None:
    from clamor.runtime.data.dataset import Dataset

    for name, ds in datasets.items():
        if not isinstance(name, str):
            raise TypeError(f"dataset names must be strings, not {type(name).__name__}")
        if not isinstance(ds, Dataset):
            raise TypeError(f"dataset {name!r} is a {type(ds).__name__}, not a Dataset")
        if cluster is None or ds._runner is not cluster:
            raise ValueError(f"dataset {name!r} does not belong to the cluster being checkpointed")
        if not ds.is_persisted:
            raise CheckpointError(
                f"dataset {name!r} is not persisted: call .persist() on it before checkpointing "
                "(a checkpoint saves kept partitions, not lineage)"
            )


def _compute_missing(datasets: dict[str, Any]) -> None:
    """Compute persisted datasets whose partitions are not all held yet (one action each)."""
    for name, ds in datasets.items():
        if None in ds.locations():
            ds.count()
        if None in ds.locations():
            raise CheckpointError(f"dataset {name!r}: some partitions are held by no worker")


def _pickle_variables(variables: dict[str, Any]) -> bytes:
    """The variables pickled as one dict (objects they share stay shared); arena arrays of
    at least a page as ArenaRefs. A failure names the variable."""
    for name in variables:
        if not isinstance(name, str):
            raise TypeError(f"variable names must be strings, not {type(name).__name__}")
    min_ref = arena.page_size() if arena.exists() else None
    try:
        return shipping.dumps(variables, min_ref)
    except Exception as exc:
        for name, value in variables.items():
            try:
                shipping.dumps(value, min_ref)
            except Exception as inner:
                raise SerializationError(
                    f"cannot checkpoint variable {name!r} (a {type(value).__qualname__}): "
                    f"{type(inner).__name__}: {inner}"
                ) from inner
        raise SerializationError(f"cannot pickle the variables: {exc}") from exc


class _Writer:
    """Seals the state (in the caller's thread), then writes it (in the background)."""

    def __init__(
        self, cluster: CheckpointHost | None, path: str, variables: dict[str, Any], datasets: dict[str, Any]
    ) -> None:
        self.cluster, self.path, self.tmp = cluster, path, path + ".tmp"
        self.names = sorted(variables)
        self.variables, self.datasets = _pickle_variables(variables), datasets
        self.handle: CheckpointHandle | None = None
        self.pinned: int | None = None  # the epoch sealed, until its pages are written
        self.epoch, self.blocks, self.page_size = 0, [], 0
        self.pages: dict = {}

    def seal(self) -> None:
        """Fix the epoch and the live blocks. With a cluster that keeps page versions: a new
        epoch, sealed between two stages, pinned until the pages are written; else the
        pages are copied now."""
        epoch = self.cluster.seal_epoch() if self.cluster is not None else None
        if epoch is None:
            self.blocks = arena.live_blocks()
            self.page_size = arena.page_size()
            whole = arena.view(0, (arena.get_arena().size,), np.uint8)
            ps = self.page_size
            self.pages = files.write_pages(self.tmp, self.blocks, ps, lambda p, out: out.__setitem__(
                slice(None), whole[p * ps : (p + 1) * ps]), _holes(ps))  # fmt: skip
        else:
            self.pinned = self.epoch = epoch
            self.blocks = arena.live_blocks()
            self.page_size = self.cluster.page_size
        self.handle = CheckpointHandle(self.path, self.epoch)
        if self.cluster is not None:
            self.cluster.checkpoints._started(self.handle)

    def run(self) -> None:
        handle = self.handle
        assert handle is not None
        try:
            manifest = self._write()
        except BaseException as exc:  # noqa: BLE001 - reported through the handle
            shutil.rmtree(self.tmp, ignore_errors=True)
            error = CheckpointError(f"checkpoint to {self.path} failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            self._finish(completed=False)
            handle._future.set_exception(error)
        else:
            self._finish(completed=True)
            handle._future.set_result(manifest)

    def _unpin(self) -> None:
        if self.pinned is not None and self.cluster is not None:
            self.cluster.release_epoch(self.pinned)
        self.pinned = None
        if self.handle is not None:
            self.handle._pinned = False

    def _finish(self, completed: bool) -> None:
        """Unpin the epoch, let go of the datasets, free the path for the next checkpoint."""
        self._unpin()
        self.datasets = {}
        if self.handle is not None and self.cluster is not None:
            self.cluster.checkpoints._ended(self.handle, completed)
        with _lock:
            _paths.discard(self.path)

    def _write(self) -> dict:
        if self.pinned is not None:
            cluster, epoch = self.cluster, self.epoch

            def read(page: int, out: np.ndarray) -> None:
                try:
                    cluster.read_page(page, epoch, out)
                except ClamorError as exc:
                    raise CheckpointError(f"page {page} as of epoch {epoch} is no longer available: {exc}") from exc

            self.pages = files.write_pages(
                self.tmp, self.blocks, self.page_size, read, _holes(self.page_size)
            )
            self._unpin()  # the version log may drop what the epoch read from now on
        variables = {"file": files.VARIABLES, "names": self.names}
        variables.update(files.write_file(self.tmp, files.VARIABLES, self.variables))
        datasets = {name: self._write_dataset(k, ds) for k, (name, ds) in enumerate(self.datasets.items())}
        a = arena.get_arena()
        manifest = {
            "format": files.FORMAT,
            "version": files.VERSION,
            "created": time.time(),
            "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "epoch": self.epoch,
            "page_size": self.page_size,
            "arena_page_size": a.page_size,
            "arena_size": a.size,
            "allocations": [[off, size] for off, size in self.blocks],
            "pages": self.pages,
            "variables": variables,
            "datasets": datasets,
            "python": sys.version.split()[0],
            "numpy": np.__version__,
        }
        files.write_file(self.tmp, files.MANIFEST, json.dumps(manifest, indent=1).encode())
        files.fsync_dir(self.tmp)
        files.install(self.tmp, self.path)
        return manifest

    def _write_dataset(self, k: int, ds: Dataset) -> dict:
        from clamor.runtime.data.plan import persist_key

        assert self.cluster is not None  # datasets belong to the cluster (start checks)
        os.makedirs(os.path.join(self.tmp, files.DATASETS, str(k)), exist_ok=True)
        entries = []
        for i in range(ds.num_partitions):
            value = self.cluster.fetch(persist_key(ds.id, i))
            name = f"{files.DATASETS}/{k}/{i}.pkl"
            data = shipping.dumps(value, _BY_VALUE)
            entries.append({"file": name, **files.write_file(self.tmp, name, data)})
        return {"partitions": ds.num_partitions, "files": entries, "was": _describe(ds)}


def _holes(ps: int) -> Callable[[int, int], np.ndarray]:
    """Which arena pages may hold data: a hole of the arena's memfd has never been
    written (the driver never punches holes into it), so it was zero at any epoch, and
    a page written since the epoch is not a hole any more but read from the version log."""
    fd = arena.get_arena().fd
    return lambda first, stop: files.data_mask(fd, first, stop, ps)


def _describe(ds: Dataset) -> str:
    """The dataset's repr (its lineage, for the manifest's reader)."""
    try:
        return repr(ds)
    except Exception:  # noqa: BLE001 - a description is not worth failing for
        return f"<Dataset {ds.id}>"


# --- restore -------------------------------------------------------------------------


@dataclasses.dataclass
class Restored:
    """What :func:`restore` brought back. ``variables``: name -> object; ``partitions``:
    dataset name -> its partition values; ``datasets``: the same as persisted datasets of
    the cluster given to :func:`restore`, else the lists of ``partitions``; ``blocks``:
    the arena blocks re-created ``(offset, size)``; ``epoch``: the epoch checkpointed."""

    path: str
    epoch: int
    variables: dict[str, Any]
    partitions: dict[str, list[Any]]
    datasets: dict[str, Any]
    manifest: dict
    blocks: list[tuple[int, int]]
    _owners: dict = dataclasses.field(default_factory=dict, repr=False)

    def __getitem__(self, name: str) -> Any:
        return self.variables[name]

    def to_datasets(self, cluster: CheckpointHost) -> dict[str, Any]:
        """The saved datasets as fresh persisted datasets of ``cluster``: partition ``i``
        is the saved partition ``i``; computed (kept on the workers) by the first action."""
        return {name: _dataset(cluster, parts) for name, parts in self.partitions.items()}


def restore(path: str | os.PathLike, cluster: CheckpointHost | None = None, *,
            keep_unreferenced: bool = False) -> Restored:  # fmt: skip
    """Bring the checkpoint at ``path`` back into this process's arena.

    Without an arena yet, one is created with the checkpoint's size and page size;
    an existing arena is used if it is large enough (its page size may differ). The
    checkpoint's blocks are re-created at their offsets, so arrays land where they
    were. ``cluster``: also make the datasets persisted datasets of it (else they are
    lists of partition values; see :meth:`Restored.to_datasets`). ``keep_unreferenced``:
    keep the blocks no variable refers to (by default they are freed).
    :class:`CheckpointError` for a missing, unfinished or corrupt checkpoint, or an
    arena already holding data where the checkpoint's blocks go.
    """
    path = os.path.abspath(os.fspath(path))
    manifest = read_manifest(path)
    blocks = [(int(o), int(s)) for o, s in manifest["allocations"]]
    high_water = _prepare_arena(path, manifest, blocks)
    owners = _reserve(path, blocks)  # the blocks are freed when their owners are collected
    whole = arena.view(0, (arena.get_arena().size,), np.uint8)
    ps = manifest["page_size"]
    for first, data in files.read_pages(path, manifest, lambda p: p * ps >= high_water):
        _copy_into_blocks(whole, blocks, first * ps, data.reshape(-1))
    arrays = _BlockArrays(path, blocks, owners)
    try:
        payload = files.read_file(path, manifest["variables"])
        variables = _Unpickler(io.BytesIO(payload), arrays.rebuild).load()
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"cannot unpickle the variables of {path}: {type(exc).__name__}: {exc}"
        ) from exc
    partitions: dict[str, list[Any]] = {}
    for name, entry in manifest["datasets"].items():
        try:
            partitions[name] = [pickle.loads(files.read_file(path, f)) for f in entry["files"]]
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"cannot unpickle dataset {name!r} of {path}: {exc}") from exc
    restored = Restored(path, manifest["epoch"], variables, partitions, dict(partitions), manifest,
                        blocks, owners if keep_unreferenced else {})  # fmt: skip
    if cluster is not None:
        restored.datasets = restored.to_datasets(cluster)
    return restored


def _prepare_arena(path: str, manifest: dict, blocks: list[tuple[int, int]]) -> int:
    """Create the arena with the checkpoint's geometry if there is none yet; check it is
    large enough. Returns its high-water mark (memory above it is still zero)."""
    needed = max((o + s for o, s in blocks), default=0)
    if not arena.exists():
        size = max(manifest["arena_size"], needed)
        arena.configure(arena_size=size, page_size=manifest["arena_page_size"])
    current = arena.get_arena()
    if current.size < needed:
        raise CheckpointError(
            f"cannot restore {path}: its arrays reach offset {arena.format_bytes(needed)} but this "
            f"process's arena has {arena.format_bytes(current.size)}; restore in a fresh process"
        )
    return arena.arena_stats()["high_water"]


def _reserve(path: str, blocks: list[tuple[int, int]]) -> dict[int, np.ndarray]:
    """Re-create the blocks, all or none; per block, the array that owns it (it is freed
    when the last array over it is collected)."""
    owners: dict[int, np.ndarray] = {}
    try:
        for off, size in blocks:
            owners[off] = arena.adopt(off, size)
    except ClamorError as exc:
        owners.clear()  # frees those made so far
        raise CheckpointError(
            f"cannot restore {path}: {exc}: this process's arena already holds data where the "
            "checkpoint's arrays go (restore in a fresh process, before creating arena arrays)"
        ) from None
    return owners


def _copy_into_blocks(whole: np.ndarray, blocks: list[tuple[int, int]], lo: int, data: np.ndarray) -> None:
    """Copy the parts of ``data`` (arena bytes from offset ``lo``) that fall in ``blocks``:
    the rest of a page may belong to this process's own allocations."""
    hi = lo + len(data)
    k = max(0, bisect.bisect_right(blocks, (lo, 1 << 62)) - 1)
    for off, size in blocks[k:]:
        if off >= hi:
            break
        a, b = max(off, lo), min(off + size, hi)
        if a < b:
            whole[a:b] = data[a - lo : b - lo]


class _BlockArrays:
    """Rebuilds ArenaRefs as writable arrays over the restored blocks, keeping each
    block's owner alive through the arrays' base."""

    def __init__(self, path: str, blocks: list[tuple[int, int]], owners: dict[int, np.ndarray]) -> None:
        self.path, self.blocks, self.owners = path, blocks, owners
        self.starts = [off for off, _ in blocks]

    def rebuild(self, offset: int, shape: tuple, dtype: Any, strides: tuple) -> np.ndarray:
        dtype = np.dtype(dtype)
        k = bisect.bisect_right(self.starts, offset) - 1
        lo = offset + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
        hi = offset + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + dtype.itemsize
        if k < 0 or not (self.starts[k] <= lo and hi <= self.starts[k] + self.blocks[k][1]):
            raise CheckpointError(
                f"{self.path}: a variable refers to arena bytes {offset}.. outside the "
                "checkpoint's blocks (the checkpoint is inconsistent)"
            )
        start = self.blocks[k][0]
        return np.ndarray(shape, dtype, buffer=self.owners[start], offset=offset - start, strides=strides)


class _Unpickler(pickle.Unpickler):
    """Unpickles variables with ArenaRefs rebuilt by ``rebuild`` instead of as the
    read-only views that ``shipping`` gives in the driver."""

    def __init__(self, file: io.BytesIO, rebuild: Callable[..., np.ndarray]) -> None:
        super().__init__(file)
        self._rebuild = rebuild

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("clamor.runtime.net.shipping", "_rebuild"):
            return self._rebuild
        return super().find_class(module, name)


def _dataset(cluster: CheckpointHost, parts: list[Any]) -> Any:
    """A persisted dataset of ``cluster`` whose partition ``i`` is ``parts[i]`` (kept in
    the driver's partition store if large, like ``parallelize`` does)."""
    from clamor.runtime.data import plan, sources
    from clamor.runtime.data.dataset import Dataset

    n = len(parts)
    if sum(sources._pickled_size(p) for p in parts) <= sources.INLINE_LIMIT:
        node = plan.Source(n=n, name="restored", op=sources.ChunksOp(tuple(parts)))
    else:
        node_id = plan.new_node_id()
        prefix = ("restored", node_id)
        for i, part in enumerate(parts):
            cluster.put(prefix + (i,), part)
        op = sources.ChunksOp(None, prefix)
        node = plan.Source(n=n, name="restored", op=op, driver_keys=prefix, id=node_id)
        keys = [prefix + (i,) for i in range(n)]
        weakref.finalize(node, sources._drop, weakref.ref(cluster), keys).atexit = False
    return Dataset(cluster, node).persist()
