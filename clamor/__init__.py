"""Clamor for Jupyter: cluster computing over demand-paged notebook objects.

Objects built in the notebook live in a shared arena; tasks ship references
to them, and workers fetch only the pages they touch. This module is the
curated public API and nothing else.

Its names are imported on first use (PEP 562): a worker process imports
``clamor.runtime.worker.process`` and with it this package, and must not load
the driver's modules (scheduler, datasets, launchers) nor, ever, Jupyter:
``pip install clamor-jupyter`` is the runtime alone, the kernel, the magics and
the views come with ``pip install "clamor-jupyter[jupyter]"``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "Cluster": "clamor.runtime.cluster",
    "Accumulator": "clamor.runtime.data.accumulators",
    "CheckpointError": "clamor.runtime.data.checkpoint",
    "restore": "clamor.runtime.data.checkpoint",
    "Dataset": "clamor.runtime.data.dataset",
    "ActionTimeoutError": "clamor.runtime.errors",
    "ArenaExhaustedError": "clamor.runtime.errors",
    "ClamorError": "clamor.runtime.errors",
    "MissingExtraError": "clamor.runtime.errors",
    "MissingPartitionError": "clamor.runtime.errors",
    "NoWorkersError": "clamor.runtime.errors",
    "SerializationError": "clamor.runtime.errors",
    "TaskCrashedError": "clamor.runtime.errors",
    "TaskError": "clamor.runtime.errors",
    "WorkerLostError": "clamor.runtime.errors",
    "DaskLauncher": "clamor.runtime.launchers.dask",
    "LocalLauncher": "clamor.runtime.launchers.local",
    "SSHLauncher": "clamor.runtime.launchers.ssh",
    "SlurmLauncher": "clamor.runtime.launchers.slurm",
    "ArenaRef": "clamor.runtime.net.shipping",
    "array": "clamor.runtime.paging.arena",
    "asarray": "clamor.runtime.paging.arena",
    "configure": "clamor.runtime.paging.arena",
    "empty": "clamor.runtime.paging.arena",
    "empty_like": "clamor.runtime.paging.arena",
    "in_arena": "clamor.runtime.paging.arena",
    "shared": "clamor.runtime.paging.arena",
    "gather": "clamor.runtime.paging.gather",
    "prefetch": "clamor.runtime.paging.pager",
    "write": "clamor.runtime.paging.writes",
}

#: Subpackages reachable as attributes without their own import (``clamor.widgets.dashboard``).
_SUBPACKAGES = ("runtime", "kernel", "widgets", "extension", "demo", "testing")

if TYPE_CHECKING:
    from clamor.runtime.cluster import Cluster
    from clamor.runtime.data.accumulators import Accumulator
    from clamor.runtime.data.checkpoint import CheckpointError, restore
    from clamor.runtime.data.dataset import Dataset
    from clamor.runtime.errors import (
        ActionTimeoutError,
        ArenaExhaustedError,
        ClamorError,
        MissingExtraError,
        MissingPartitionError,
        NoWorkersError,
        SerializationError,
        TaskCrashedError,
        TaskError,
        WorkerLostError,
    )
    from clamor.runtime.launchers.dask import DaskLauncher
    from clamor.runtime.launchers.local import LocalLauncher
    from clamor.runtime.launchers.slurm import SlurmLauncher
    from clamor.runtime.launchers.ssh import SSHLauncher
    from clamor.runtime.net.shipping import ArenaRef
    from clamor.runtime.paging.arena import (
        array,
        asarray,
        configure,
        empty,
        empty_like,
        in_arena,
        shared,
    )
    from clamor.runtime.paging.gather import gather
    from clamor.runtime.paging.pager import prefetch
    from clamor.runtime.paging.writes import write


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext clamor``: the %clamor / %%clamor magics and the live views in any
    IPython kernel."""
    from clamor.kernel.magics import load_ipython_extension as load

    load(ipython)


__all__ = [
    "Accumulator",
    "ActionTimeoutError",
    "ArenaExhaustedError",
    "ArenaRef",
    "CheckpointError",
    "ClamorError",
    "Cluster",
    "DaskLauncher",
    "Dataset",
    "LocalLauncher",
    "MissingExtraError",
    "MissingPartitionError",
    "NoWorkersError",
    "SSHLauncher",
    "SerializationError",
    "SlurmLauncher",
    "TaskCrashedError",
    "TaskError",
    "WorkerLostError",
    "array",
    "asarray",
    "configure",
    "empty",
    "empty_like",
    "gather",
    "in_arena",
    "prefetch",
    "restore",
    "shared",
    "write",
]
