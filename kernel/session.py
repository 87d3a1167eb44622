"""The process's current cluster and the kernel's settings.

One paging cluster may exist per process (README, "Deliberate differences"), so
the kernel, the magics and the widgets share it through this module::

    from clamor.kernel import session
    cluster = session.get()          # the running cluster; starts the default one if none
    session.start(workers=4)         # (re)start: closes the previous cluster first
    session.current()                # the running cluster or None (never starts one)
    session.set_config("partitions", 8)
    session.close()

``config`` holds the settings of ``%clamor config``; :data:`OPTIONS` describes them.
The cluster options (``transport``, ``speculation``, ...) apply at the next
:func:`start`. The cluster is closed at interpreter exit (``atexit``), quietly.
In a kernel a Jupyter server started, the current cluster is registered for the
server's dashboards and REST API while it runs (:mod:`clamor.kernel.registration`).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from clamor.kernel import registration
from clamor.runtime.cluster import Cluster
from clamor.runtime.errors import ClamorError
from clamor.runtime.observe import cluster_registry
from clamor.runtime.paging.arena import to_bytes
from clamor.runtime.paging.memory import SPILL_POLICIES

logger = logging.getLogger("clamor.kernel.session")

__all__ = [
    "OPTIONS",
    "close",
    "config",
    "current",
    "default_workers",
    "get",
    "reset_config",
    "set_config",
    "start",
    "use",
]


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting: its default, a converter/validator (raises ValueError with the
    expected kind), a one-line description and whether ``Cluster()`` takes it."""

    default: Any
    check: Callable[[Any], Any]
    doc: str
    cluster: bool = False


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_NONE = {"none", "default", ""}


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError("true or false")


def _number(kind: type, low: float, optional: bool, what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
            if optional:
                return None
            raise ValueError(what)
        if isinstance(value, bool):
            raise ValueError(what)  # noqa: TRY004 - set_config reports every bad value alike
        try:
            number = kind(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise ValueError(what) from None
        if kind is int and isinstance(value, float) and value != number:
            raise ValueError(what)
        if number < low:
            raise ValueError(what)
        return number

    return check


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, str) and value.strip() in choices:
            return value.strip()
        raise ValueError("one of " + ", ".join(choices))

    return check


def _size(value: Any) -> int | str | None:
    """A memory size (``"4GiB"``, bytes) or none (the default)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return None
    try:
        to_bytes(value.strip() if isinstance(value, str) else value, "worker_memory")
    except (TypeError, ValueError):
        raise ValueError("a size such as 4GiB, or none (a fair share of this host's memory)") from None
    return value.strip() if isinstance(value, str) else value


def _path(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return None
    if isinstance(value, str | os.PathLike):
        return os.fspath(value)
    raise ValueError("a directory path or none")


#: Every key of :data:`config`.
OPTIONS: dict[str, Option] = {
    "workers": Option(None, _number(int, 1, True, "a positive int or none (one per core)"),
                      "workers of the default cluster (none: one per core)"),
    "partitions": Option(None, _number(int, 1, True, "a positive int or none (two per worker)"),
                         "partitions when a magic parallelizes a sequence (none: two per worker)"),
    "progress": Option(True, _boolean, "show a live progress bar during long actions"),
    "progress_delay": Option(1.0, _number(float, 0, False, "a number of seconds >= 0"),
                             "seconds an action runs before its progress bar appears"),
    "arena_default": Option(True, _boolean, "in the Clamor kernel, numpy arrays of at least a "
                            "page that a cell makes go to the arena"),
    "transport": Option("auto", _choice("auto", "shm", "tcp"), "how workers fetch pages", True),
    "replication": Option(True, _boolean, "redirect page requests to peers holding the page", True),
    "readahead": Option(True, _boolean, "batch sequential page faults", True),
    "read_sets": Option("resident", _choice("resident", "exact"), "resident: workers keep pages "
                        "mapped across tasks (a repeated stage takes no fault); exact: per-task "
                        "read sets, a fault per page per task", True),
    "speculation": Option(True, _boolean, "speculative copies of straggling tasks", True),
    "speculation_factor": Option(2.0, _number(float, 1, False, "a number >= 1"),
                                 "a task is a straggler after this many times its stage's median", True),
    "fuse": Option(True, _boolean, "run a stage of tiny tasks in chunks, an attempt a chunk", True),
    "timeout": Option(60.0, _number(float, 0.1, False, "a number of seconds > 0"),
                      "seconds to wait for the workers to start", True),
    "log_dir": Option(None, _path, "where worker logs go (none: the kernel's output)", True),
    "host": Option("127.0.0.1", str, "address the scheduler and page server listen on "
                   "(one that remote workers can reach)", True),
    "tls": Option(False, _boolean, "mutual TLS on gRPC and the page protocol (multi-host)", True),
    "worker_memory": Option(None, _size, "each worker's memory budget, split between page cache "
                            "and kept partitions (none: a fair share of this host's memory)", True),
    "spill": Option("peer", _choice(*SPILL_POLICIES), "where partitions beyond a worker's budget "
                    "go: peer (the one with most free memory, then disk) or disk", True),
    "restarts": Option(None, _number(int, 0, True, "a whole number >= 0, or none (the default)"),
                       "lost workers replaced a minute (none: as many as the cluster has, at "
                       "least 3; 0: never)", True),
    "action_timeout": Option(None, _number(float, 0.001, True, "a number of seconds > 0, or none"),
                             "seconds an action may run before its tasks are stopped (none: no "
                             "limit)", True),
}  # fmt: skip

#: The current settings (read freely; change them with :func:`set_config`).
config: dict[str, Any] = {key: option.default for key, option in OPTIONS.items()}

_lock = threading.RLock()
_cluster: Cluster | None = None


def set_config(key: str, value: Any) -> Any:
    """Validate and store one setting; returns the stored value. Strings are converted
    (``"4"``, ``"off"``, ``"none"``), so ``%clamor config`` can pass its text through.
    ``KeyError`` for an unknown key, ``ValueError`` for a bad value (both name it)."""
    option = OPTIONS.get(key)
    if option is None:
        raise KeyError(f"unknown config key {key!r}; keys: {', '.join(OPTIONS)}")
    try:
        checked = option.check(value)
    except ValueError as exc:
        raise ValueError(f"config {key!r} needs {exc}, got {value!r}") from None
    with _lock:
        config[key] = checked
    return checked


def reset_config() -> None:
    """Every setting back to its default."""
    with _lock:
        config.update({key: option.default for key, option in OPTIONS.items()})


def default_workers() -> int:
    """How many workers :func:`get` starts: ``config["workers"]``, else the
    ``CLAMOR_WORKERS`` environment variable (set by a deployment, e.g. JupyterHub),
    else one per core this process may use (a container's CPU quota included)."""
    if config["workers"]:
        return config["workers"]
    env = os.environ.get("CLAMOR_WORKERS", "").strip()
    if env:
        try:
            return OPTIONS["workers"].check(env) or usable_cores()
        except ValueError as exc:
            raise ValueError(f"CLAMOR_WORKERS={env!r}: expected {exc}") from None
    return usable_cores()


def usable_cores() -> int:
    """Cores this process may run on, capped by a cgroup v2 CPU quota (containers)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores or 1, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores or 1


def _is_open(cluster: Cluster | None) -> bool:
    return cluster is not None and not getattr(cluster, "closed", False)


def current() -> Cluster | None:
    """The running cluster, or ``None`` (one closed by its owner counts as none)."""
    global _cluster
    with _lock:
        if _cluster is not None and not _is_open(_cluster):
            cluster_registry.withdraw(_cluster)
            _cluster = None
        return _cluster


def get(start: bool = True) -> Cluster:
    """The running cluster; if none, start the default one (``start=True``) or raise
    :class:`~clamor.runtime.errors.ClamorError` (``start=False``)."""
    with _lock:
        cluster = current()
        if cluster is not None:
            return cluster
        if not start:
            raise ClamorError("no cluster is running (start one with %clamor start -n N)")
        return _start(None, {})


def start(workers: int | None = None, **options: Any) -> Cluster:
    """Start a cluster of ``workers`` (default :func:`default_workers`) local workers with
    the cluster options of :data:`config`, overridden by ``options`` (any ``Cluster``
    keyword). A running cluster is closed first (its datasets cannot be used after)."""
    return _start(workers, options)


def _start(workers: int | None, options: dict[str, Any]) -> Cluster:
    if workers is not None:
        workers = OPTIONS["workers"].check(workers)
    kwargs = {key: config[key] for key, option in OPTIONS.items() if option.cluster}
    kwargs.update(options)
    with _lock:
        close()
        global _cluster
        _cluster = Cluster(workers or default_workers(), **kwargs)
        registration.publish(_cluster)  # the server's dashboards find it (extension/)
        return _cluster


def use(cluster: Cluster) -> Cluster:
    """Make an existing open ``cluster`` (e.g. one built in the notebook with
    ``clamor.Cluster()``) the current one, without starting or closing anything."""
    if not isinstance(cluster, Cluster):
        raise TypeError(f"use() needs a clamor.Cluster, got {type(cluster).__name__}")
    if not _is_open(cluster):
        raise ClamorError("that cluster is closed")
    global _cluster
    with _lock:
        _cluster = cluster
    registration.publish(cluster)
    return cluster


def close() -> None:
    """Close the current cluster, if any (waits for a checkpoint being written)."""
    global _cluster
    with _lock:
        cluster, _cluster = _cluster, None
    if cluster is not None:
        cluster_registry.withdraw(cluster)
        cluster.close()


def _close_at_exit() -> None:
    try:
        close()
    except BaseException:  # never fail the interpreter's exit
        logger.debug("closing the cluster at exit failed", exc_info=True)


atexit.register(_close_at_exit)
