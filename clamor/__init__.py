"""Clamor for Jupyter: cluster computing over demand-paged notebook objects.

Objects built in the notebook live in a shared arena; tasks ship references
to them, and workers fetch only the pages they touch. This module is the
curated public API and nothing else.
"""

from clamor.runtime.cluster import Cluster
from clamor.runtime.data.accumulators import Accumulator
from clamor.runtime.data.checkpoint import CheckpointError, restore
from clamor.runtime.data.dataset import Dataset
from clamor.runtime.errors import (
    ArenaExhaustedError,
    ClamorError,
    MissingPartitionError,
    SerializationError,
    TaskError,
    WorkerLostError,
)
from clamor.runtime.launchers.dask import DaskLauncher
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
from clamor.runtime.paging.pager import prefetch

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext clamor``: the %clamor / %%clamor magics and the live views in any
    IPython kernel."""
    from clamor.kernel.magics import load_ipython_extension as load

    load(ipython)

__all__ = [
    "Accumulator",
    "ArenaExhaustedError",
    "ArenaRef",
    "CheckpointError",
    "ClamorError",
    "Cluster",
    "DaskLauncher",
    "Dataset",
    "MissingPartitionError",
    "SSHLauncher",
    "SerializationError",
    "TaskError",
    "WorkerLostError",
    "array",
    "asarray",
    "configure",
    "empty",
    "empty_like",
    "in_arena",
    "prefetch",
    "restore",
    "shared",
]
