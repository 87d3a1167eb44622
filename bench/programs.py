"""The child names of a broadcast-table workload (``lookups.py``, ``streaming.py``):
which system each runs, the name its rows carry, and :func:`open_session`, which
starts it.

A child name is a system (``clamor``, ``dask``, ``ray``, ``ipyparallel``: their
sessions in ``peers.py``), a peer's second program (``ray-values``: the driver gathers
``table[keys]`` and ships only those values with each task) or a limit (``numpy``,
``shm``: ``limits.py``). The parent runs each in its own child process (the workload
script with ``--child NAME``), marked through its environment
(:data:`harness.CHILD_MARKER`) so :mod:`harness` can sweep whatever the child leaves
behind; a child streams its rows to a file as it finishes them, so a system that hangs
later keeps what it measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from limits import NumpySession, SharedMemorySession
from peers import (
    WORKERS,
    ClamorSession,
    DaskSession,
    IpyparallelSession,
    RaySession,
    Session,
    ray_store_bytes,
)

if TYPE_CHECKING:
    from clamor.testing.netns import Network

#: The measured systems, Clamor first.
SYSTEMS = ("clamor", "dask", "ray", "ipyparallel")
PEERS = SYSTEMS[1:]
#: The peers' second program, child names: the driver gathers ``table[keys]`` and ships
#: only those values with each task (the knowledge Clamor's tasks have: their keys).
VALUES = tuple(f"{peer}-values" for peer in PEERS)
#: The physical limits on this machine: one numpy process; ``WORKERS`` processes over one
#: ``multiprocessing.shared_memory`` table.
LIMITS = ("numpy", "shm")
#: Every child name a broadcast-table workload runs, in the order it runs them.
PROGRAMS = ("clamor", "ray", "ray-values", "dask", "dask-values", "ipyparallel",
            "ipyparallel-values", "shm", "numpy")  # fmt: skip
#: The name each child's rows carry (a limit's starts with "limit: ").
LABELS = {**{f"{peer}-values": f"{peer} (ship keys' values)" for peer in PEERS},
          "numpy": "limit: numpy, one process",
          "shm": f"limit: shared memory, {WORKERS} processes"}  # fmt: skip


def label(system: str) -> str:
    """The row name of child ``system`` (``ray-values`` -> ``ray (ship keys' values)``)."""
    return LABELS.get(system, system)


def base(system: str) -> str:
    """The system child ``system`` runs on (``ray-values`` -> ``ray``)."""
    return system.removesuffix("-values")


def ships_values(system: str) -> bool:
    return system.endswith("-values")


def is_limit(system: str) -> bool:
    return system in LIMITS


def family(name: str) -> str:
    """The peer a row name belongs to (``ray (ship keys' values)`` -> ``ray``)."""
    return name.split(" (")[0]


def open_session(system: str, network: Network | None = None, data_bytes: int | None = None,
                 **clamor_options: Any) -> Session:  # fmt: skip
    """Start ``system`` (a child name: ``ray-values`` starts ``ray``) with ``WORKERS``
    workers (raises if it cannot): local ones, or with ``network`` (network mode,
    ``network.py``) one on each of its simulated hosts; a limit always here, locally.
    ``data_bytes``: the largest table it will hold (Ray's object stores are sized for it)."""
    system = base(system)
    if system == "numpy":
        return NumpySession()
    if system == "shm":
        return SharedMemorySession()
    if network is not None and len(network.hosts) != WORKERS:
        raise ValueError(f"network mode runs one worker per host: {WORKERS} hosts, not "
                         f"{len(network.hosts)}")  # fmt: skip
    if system == "clamor":
        return ClamorSession(network, **clamor_options)
    if system == "ray":
        stores = 1 if network is None else len(network.hosts) + 1  # the head's, each node's
        store = None if data_bytes is None else ray_store_bytes(data_bytes, stores)
        return RaySession(network, object_store_memory=store)
    sessions = {"dask": DaskSession, "ipyparallel": IpyparallelSession}
    return sessions[system](network)
