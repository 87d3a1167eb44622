"""The on-disk format of checkpoints (runtime/data/checkpoint.py), both directions.

A checkpoint is a directory, written as ``path + ".tmp"`` and renamed to ``path``
once every file in it is complete and synced, so that a crash never leaves half a
checkpoint under ``path``::

    manifest.json      format, version, created, epoch, page_size, arena_page_size,
                       arena_size, allocations [[offset, size], ...], pages,
                       variables {file, names, bytes, sha256},
                       datasets {name: {partitions, was (its repr), files [{file, bytes, sha256}]}}
    pages.bin          sparse: page p's bytes at offset p * page_size; holes for the
                       pages outside every live block and for all-zero pages
    pages.idx.npy      uint64 rows (page, crc32, flags), one per page covering a live
                       block; flag 1: the page is all zero (a hole in pages.bin)
    variables.pkl      the pickled dict of variables (arena arrays as ArenaRefs)
    datasets/K/I.pkl   partition I of the K-th dataset, pickled by value

The pages file is an image of the used part of the arena: arena offset = file offset.
"""

from __future__ import annotations

import errno
import hashlib
import io
import itertools
import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterator

import numpy as np
from clamor.runtime.errors import ClamorError

FORMAT = "clamor-checkpoint"
VERSION = 1
MANIFEST, PAGES, INDEX, VARIABLES, DATASETS = (
    "manifest.json", "pages.bin", "pages.idx.npy", "variables.pkl", "datasets",
)  # fmt: skip
ZERO_PAGE = 1  # index flag: the page is all zero (a hole in pages.bin)
CHUNK_BYTES = 8 << 20  # pages are read and written in runs of at most this much


class CheckpointError(ClamorError):
    """A checkpoint could not be written, or a directory is not a complete, intact one."""


# --- writing ---------------------------------------------------------------------------


def write_file(directory: str, name: str, data: bytes) -> dict:
    """Write ``data`` durably to ``directory/name``; its ``bytes`` and ``sha256``."""
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install(tmp: str, path: str) -> None:
    """Rename the complete ``tmp`` to ``path``, replacing an older checkpoint there (moved
    to ``path + ".old"`` for the instant between the two renames, then deleted)."""
    old = path + ".old"
    if os.path.lexists(path):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path))
    shutil.rmtree(old, ignore_errors=True)


def page_runs(blocks: list[tuple[int, int]], page_size: int) -> list[tuple[int, int]]:
    """The pages ``[first, end)`` covering the blocks, merged into disjoint sorted runs."""
    runs: list[list[int]] = []
    for off, size in sorted(blocks):
        first, end = off // page_size, -(-(off + size) // page_size)
        if runs and first <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([first, end])
    return [(a, b) for a, b in runs]


def write_pages(
    tmp: str,
    blocks: list[tuple[int, int]],
    ps: int,
    read: Callable[[int, np.ndarray], None],
    maybe_data: Callable[[int, int], np.ndarray] | None = None,
) -> dict:
    """Write every page covering ``blocks`` to the pages file (``read(page, out)`` fills
    ``out`` with a page's bytes), all-zero pages as holes, then the index. Returns the
    manifest's ``pages`` entry. ``maybe_data(first, stop)``: a boolean per page, False
    for pages known to be zero, which are not read (reading never-written memory of a
    memfd would allocate it)."""
    runs = page_runs(blocks, ps)
    end = runs[-1][1] if runs else 0
    per_chunk = max(1, CHUNK_BYTES // ps)
    buf = np.empty(per_chunk * ps, np.uint8)
    zero_crc = zlib.crc32(bytes(ps))
    rows: list[np.ndarray] = []
    with open(os.path.join(tmp, PAGES), "wb") as f:
        fd = f.fileno()
        os.ftruncate(fd, end * ps)
        for first, stop in runs:
            wanted = maybe_data(first, stop) if maybe_data else np.ones(stop - first, bool)
            for p0 in range(first, stop, per_chunk):
                k = min(per_chunk, stop - p0)
                pages = buf[: k * ps].reshape(k, ps)
                nonzero = wanted[p0 - first : p0 - first + k].copy()
                for j in np.flatnonzero(nonzero).tolist():
                    read(p0 + j, pages[j])
                    nonzero[j] = pages[j].view(np.uint64).any()
                chunk = np.zeros((k, 3), np.uint64)
                chunk[:, 0] = np.arange(p0, p0 + k)
                chunk[:, 2] = np.where(nonzero, 0, ZERO_PAGE)
                for j in range(k):
                    chunk[j, 1] = zlib.crc32(pages[j]) if nonzero[j] else zero_crc
                for a, b in true_runs(nonzero):
                    os.pwrite(fd, pages[a:b].reshape(-1), (p0 + a) * ps)
                rows.append(chunk)
        os.fsync(fd)
    index = np.concatenate(rows) if rows else np.zeros((0, 3), np.uint64)
    out = io.BytesIO()
    np.save(out, index)
    info = write_file(tmp, INDEX, out.getvalue())
    zero = int((index[:, 2] & ZERO_PAGE).sum()) if len(index) else 0
    return {"file": PAGES, "bytes": end * ps, "count": len(index), "zero": zero,
            "index": INDEX, "index_sha256": info["sha256"]}  # fmt: skip


def data_mask(fd: int, first: int, stop: int, ps: int) -> np.ndarray:
    """Per page of ``[first, stop)`` of the file ``fd``: False where the file has a hole
    (never written: zero), True where it may hold data (``SEEK_DATA``/``SEEK_HOLE``)."""
    mask = np.zeros(stop - first, bool)
    pos, end = first * ps, stop * ps
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here to the end of the file
                break
            return np.ones(stop - first, bool)  # no hole detection here: read everything
        if data >= end:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        mask[data // ps - first : -(-hole // ps) - first] = True
        pos = hole
    return mask


def true_runs(mask: np.ndarray) -> Iterator[tuple[int, int]]:
    """The ``[a, b)`` runs of True in a boolean vector."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return zip(edges[::2].tolist(), edges[1::2].tolist())


# --- reading ---------------------------------------------------------------------------


def _corrupt(path: str, what: str) -> CheckpointError:
    return CheckpointError(f"{path} is not an intact clamor checkpoint: {what}")


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the complete checkpoint at ``path``, checked: format and version
    known, every field present, every file there with its recorded size.
    :class:`CheckpointError` says what is wrong (missing, unfinished, corrupt)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        hint = ""
        if os.path.isdir(path + ".tmp"):
            hint = f" ({path}.tmp is an unfinished one: its process stopped while writing it)"
        elif os.path.isdir(path + ".old"):
            hint = f" ({path}.old is the previous one: replacing it was interrupted)"
        raise CheckpointError(f"no checkpoint at {path}{hint}")
    try:
        with open(os.path.join(path, MANIFEST), "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise _corrupt(path, f"{MANIFEST} is missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _corrupt(path, f"{MANIFEST} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _corrupt(path, f"{MANIFEST} does not describe a {FORMAT}")
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {manifest.get('version')!r}; this clamor "
            f"reads version {VERSION}"
        )
    try:
        _check_fields(path, manifest)
    except (KeyError, TypeError, ValueError) as exc:
        raise _corrupt(path, f"{MANIFEST} is incomplete ({type(exc).__name__}: {exc})") from None
    return manifest


def _check_fields(path: str, m: dict) -> None:
    for key in ("epoch", "page_size", "arena_page_size", "arena_size"):
        if not isinstance(m[key], int) or m[key] < 0:
            raise ValueError(f"{key} = {m[key]!r}")
    blocks = [(int(o), int(s)) for o, s in m["allocations"]]
    if any(o % 4096 or s <= 0 or s % 4096 for o, s in blocks):
        raise ValueError("allocations not in whole 4 KiB units")
    if any(a[0] + a[1] > b[0] for a, b in itertools.pairwise(blocks)):
        raise ValueError("allocations overlap or are not sorted")
    files = [(m["pages"]["file"], m["pages"]["bytes"]), (m["pages"]["index"], None)]
    files.append((m["variables"]["file"], m["variables"]["bytes"]))
    for ds in m["datasets"].values():
        if len(ds["files"]) != ds["partitions"]:
            raise ValueError("a dataset's partition files are missing")
        files += [(f["file"], f["bytes"]) for f in ds["files"]]
    for name, size in files:
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise _corrupt(path, f"{name} is missing")
        if size is not None and os.path.getsize(full) != size:
            raise _corrupt(path, f"{name} has {os.path.getsize(full)} bytes, not {size}")


def read_file(path: str, entry: dict) -> bytes:
    """The bytes of the file an ``entry`` (``file``, ``sha256``) names, checked."""
    with open(os.path.join(path, entry["file"]), "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise _corrupt(path, f"{entry['file']} does not match its checksum")
    return data


def read_index(path: str, manifest: dict) -> np.ndarray:
    """The pages index (rows: page, crc32, flags), checked against its checksum."""
    entry = {"file": manifest["pages"]["index"], "sha256": manifest["pages"]["index_sha256"]}
    try:
        index = np.load(io.BytesIO(read_file(path, entry)), allow_pickle=False)
    except ValueError as exc:
        raise _corrupt(path, f"bad pages index ({exc})") from None
    if index.ndim != 2 or index.shape[1] != 3 or len(index) != manifest["pages"]["count"]:
        raise _corrupt(path, "bad pages index shape")
    return index


def read_pages(path: str, manifest: dict, skip_zero: Callable[[int], bool]) -> Iterator[tuple[int, np.ndarray]]:
    """``(first page, pages)`` chunks of the pages covering the allocations, each page
    checked against its CRC. All-zero pages for which ``skip_zero(page)`` is true are
    not read (their chunk is cut there)."""
    ps = manifest["page_size"]
    index = read_index(path, manifest)
    where = {int(p): i for i, p in enumerate(index[:, 0])}
    blocks = [(int(o), int(s)) for o, s in manifest["allocations"]]
    per_chunk = max(1, CHUNK_BYTES // ps) if ps else 1
    with open(os.path.join(path, manifest["pages"]["file"]), "rb") as f:
        for first, stop in page_runs(blocks, ps):
            p = first
            while p < stop:
                rows = []
                while p < stop and len(rows) < per_chunk:
                    row = where.get(p)
                    if row is None:
                        raise _corrupt(path, f"page {p} is missing from the pages index")
                    if index[row, 2] & ZERO_PAGE and skip_zero(p):
                        p += 1
                        break
                    rows.append(row)
                    p += 1
                if not rows:
                    continue
                start = int(index[rows[0], 0])
                data = np.empty((len(rows), ps), np.uint8)
                f.seek(start * ps)
                if f.readinto(memoryview(data).cast("B")) != data.nbytes:
                    raise _corrupt(path, f"{manifest['pages']['file']} is truncated")
                for j, row in enumerate(rows):
                    if zlib.crc32(data[j]) != int(index[row, 1]):
                        raise _corrupt(path, f"page {start + j} does not match its CRC")
                yield start, data


def open_image(path: str | os.PathLike) -> np.ndarray:
    """The checkpointed arena as a read-only byte array (index = arena offset), without
    restoring anything: for inspection and tests."""
    path = os.path.abspath(os.fspath(path))
    manifest = read_manifest(path)
    if not manifest["pages"]["bytes"]:
        return np.zeros(0, np.uint8)
    return np.memmap(os.path.join(path, manifest["pages"]["file"]), np.uint8, "r")
