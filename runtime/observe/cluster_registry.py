"""Where a notebook server finds its kernels' clusters.

The jupyter-server extension (extension/) runs in the server process, the
cluster in the kernel. When the kernel's cluster starts, the kernel writes
``clamor-cluster-<kernel_id>.json`` into Jupyter's runtime directory (where the
server keeps the kernels' connection files), private to the user (mode 0600,
like the connection files): the kernel id, the kernel's pid, the scheduler's
address and the cluster's credentials (token, TLS material). The extension reads
it to query the cluster's ``Observer`` service (clamor.runtime.observe.observer). The
entry goes when the cluster closes, is collected, or the kernel exits; one a
SIGKILLed kernel leaves behind names a dead pid, which readers ignore and remove.

Both sides import this module; it sits in the runtime, below the kernel and the
server extension. Only kernels started by a Jupyter server have an id (their
connection file is ``kernel-<id>.json``): the kernel's side of registration
(:mod:`clamor.kernel.registration`) finds it, and writes nothing elsewhere.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import stat
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Protocol

import psutil
from clamor.runtime.credentials import Credentials

logger = logging.getLogger("clamor.registry")

__all__ = ["Entry", "entry_path", "publish", "published", "read_entries", "registry_dir", "withdraw"]

PREFIX = "clamor-cluster-"
_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Entry:
    """One registered cluster."""

    kernel_id: str
    pid: int
    address: str
    credentials: Credentials = dataclasses.field(repr=False)
    workers: int
    created: float
    path: Path

    @property
    def alive(self) -> bool:
        """Whether the kernel process that wrote the entry still runs."""
        return psutil.pid_exists(self.pid)


def registry_dir() -> Path:
    """Jupyter's runtime directory (``JUPYTER_RUNTIME_DIR`` or the user's default)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir())


def entry_path(kernel: str, directory: str | os.PathLike | None = None) -> Path:
    return Path(directory or registry_dir()) / f"{PREFIX}{kernel}.json"


# --- the kernel's side ---

class Registered(Protocol):
    """What the registry reads of a cluster (``Cluster`` is one)."""

    @property
    def address(self) -> str: ...

    @property
    def credentials(self) -> Credentials: ...

    @property
    def workers(self) -> list[int]: ...


_lock = threading.Lock()
_published: dict[int, tuple[weakref.ref, Path, weakref.finalize]] = {}


def publish(cluster: Registered, kernel: str, directory: str | os.PathLike | None = None) -> Path | None:
    """Register ``cluster`` for kernel ``kernel`` (its id); the entry's path, or None when it
    cannot be written. The kernel side (clamor.kernel.registration) finds the id."""
    path = entry_path(kernel, directory)
    body = {
        "version": _VERSION,
        "kernel_id": kernel,
        "pid": os.getpid(),
        "address": cluster.address,
        "credentials": cluster.credentials.serialize(),
        "workers": len(getattr(cluster, "workers", ()) or ()),
        "created": time.time(),
    }
    try:
        _write_private(path, json.dumps(body))
    except OSError as exc:
        logger.warning("cannot register the cluster for the server's dashboards (%s): %s", path, exc)
        return None
    with _lock:
        for key, (ref, old, finalizer) in list(_published.items()):
            if old == path or ref() is None:  # one entry per kernel: a new cluster replaces it
                finalizer.detach()
                del _published[key]
        finalizer = weakref.finalize(cluster, _remove, path, body["created"])
        finalizer.atexit = True
        _published[id(cluster)] = (weakref.ref(cluster), path, finalizer)
    return path


def update(cluster: Registered) -> None:
    """Rewrite ``cluster``'s entry, if this process published one, with its worker count
    now (after ``Cluster.scale``): the server's cluster list reads the count there."""
    with _lock:
        entry = _published.get(id(cluster))
    if entry is None or entry[0]() is not cluster:
        return
    path = entry[1]
    try:
        body = json.loads(path.read_text())
        body["workers"] = len(cluster.workers)
        _write_private(path, json.dumps(body))
    except (OSError, ValueError) as exc:
        logger.warning("cannot update the cluster's entry for the server's dashboards (%s): %s", path, exc)


def published() -> list[Any]:
    """The clusters this process has registered that still exist."""
    with _lock:
        return [c for ref, _, _ in _published.values() if (c := ref()) is not None]


def withdraw(cluster: Registered | None = None) -> None:
    """Remove ``cluster``'s entry (every entry this process wrote when ``cluster`` is None)."""
    with _lock:
        keys = list(_published) if cluster is None else [id(cluster)]
        items = [_published.pop(k) for k in keys if k in _published]
    for _, _, finalizer in items:
        finalizer()  # removes the file (once)


def _remove(path: Path, created: float) -> None:
    """Remove ``path`` if it is still the entry written at ``created`` (a newer cluster of the
    same kernel may have replaced it)."""
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("created") == created:
            path.unlink()


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by this user only: a new 0600 file
    (``O_EXCL``) in a 0700 directory if it must create it, renamed onto ``path``."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


atexit.register(withdraw)


# --- the server's side ---


def read_entries(directories: list[str | os.PathLike] | None = None,
                 remove_stale: bool = True) -> dict[str, Entry]:  # fmt: skip
    """The entries in ``directories`` (default: :func:`registry_dir`) by kernel id.

    Files that another user owns or that others may read or write are refused (their
    credentials could be forged, and a forged address would make the reader show a
    stranger's reply as its kernel's); unreadable ones are skipped; those of dead processes are removed
    (``remove_stale``) and left out.
    """
    entries: dict[str, Entry] = {}
    for directory in directories or [registry_dir()]:
        try:
            paths = sorted(Path(directory).glob(f"{PREFIX}*.json"))
        except OSError:
            continue
        for path in paths:
            entry = _read(path)
            if entry is None:
                continue
            if not entry.alive:
                if remove_stale:
                    with contextlib.suppress(OSError):
                        path.unlink()
                continue
            old = entries.get(entry.kernel_id)
            if old is None or entry.created > old.created:
                entries[entry.kernel_id] = entry
    return entries


def _read(path: Path) -> Entry | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning("ignoring %s: it must belong to this user with mode 0600", path)
            return None
        try:
            body = json.loads(f.read())
            return Entry(
                kernel_id=str(body["kernel_id"]),
                pid=int(body["pid"]),
                address=str(body["address"]),
                credentials=Credentials.parse(body["credentials"]),
                workers=int(body.get("workers", 0)),
                created=float(body.get("created", 0.0)),
                path=path,
            )
        except (ValueError, KeyError, TypeError) as exc:
            logger.debug("ignoring malformed %s: %s", path, exc)
            return None
