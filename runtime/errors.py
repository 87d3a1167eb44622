"""Exceptions of the Clamor runtime."""


class ClamorError(Exception):
    """Base class of every error raised by Clamor."""


class ArenaExhaustedError(ClamorError, MemoryError):
    """The shared arena has no free block large enough for an allocation."""


# --- control plane (runtime/cluster.py, runtime/worker/process.py) -------------------


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised on a worker.

    Set as ``__cause__`` of the re-raised exception (as ``concurrent.futures``
    does), so the remote frames print above the driver's own traceback.
    """

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb.rstrip()}\n"""'


class TaskError(ClamorError):
    """A task failed with an exception that could not be re-created in the driver."""

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return (type(self), (self.type_name, self.message, self.remote_traceback))


class WorkerLostError(ClamorError):
    """A worker process died or became unreachable (``how``: exit status, signal, ...)."""

    def __init__(self, worker_id: int, how: str) -> None:
        super().__init__(f"worker {worker_id} was lost: {how}")
        self.worker_id = worker_id
        self.how = how

    def __reduce__(self):
        return (type(self), (self.worker_id, self.how))


class SerializationError(ClamorError, TypeError):
    """A task, its arguments or its result cannot be serialized (nothing was sent)."""


class MissingPartitionError(ClamorError):
    """A task needs partitions that no live worker holds (their holder was lost)."""

    def __init__(self, keys: list) -> None:
        shown = ", ".join(repr(k) for k in keys[:5]) + (" ..." if len(keys) > 5 else "")
        super().__init__(f"{len(keys)} partition(s) are held by no live worker: {shown}")
        self.keys = list(keys)

    def __reduce__(self):
        return (type(self), (self.keys,))


# --- optional parts (pyproject.toml's extras) ---------------------------------------


class MissingExtraError(ClamorError, ImportError):
    """A part of Clamor whose packages come with an extra was used without them.

    ``pip install clamor-jupyter`` is the runtime alone (what a worker host needs); the
    kernel, the magics, the live views and the jupyter-server extension need the
    ``[jupyter]`` extra, :class:`~clamor.runtime.launchers.dask.DaskLauncher` ``[dask]``.
    """

    def __init__(self, what: str, missing: str | list[str], extra: str = "jupyter") -> None:
        names = [missing] if isinstance(missing, str) else list(missing)
        verb = "is" if len(names) == 1 else "are"
        super().__init__(f"{what} needs {', '.join(names)}, which {verb} not installed here: "
                         f'pip install "clamor-jupyter[{extra}]"', name=names[0])  # fmt: skip
        self.what = what
        self.missing = names
        self.extra = extra

    def __reduce__(self):
        return (type(self), (self.what, self.missing, self.extra))

    @classmethod
    def of(cls, what: str, exc: ImportError, extra: str = "jupyter") -> "MissingExtraError":
        """The error for ``exc``, an ``ImportError`` of one of the extra's packages."""
        return cls(what, exc.name or str(exc), extra)


def require_extra(what: str, modules: tuple[str, ...], extra: str = "jupyter") -> None:
    """Raise :class:`MissingExtraError` naming the ``modules`` (top-level names) that
    cannot be imported here; ``what`` is the part that needs them."""
    import importlib.util

    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder refused it, or a broken half-import
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise MissingExtraError(what, missing, extra)


#: What the kernel and the magics import (the ``[jupyter]`` extra).
KERNEL_PACKAGES = ("IPython", "ipykernel", "jupyter_client", "traitlets")
#: What the live views (``clamor.widgets``) import (the ``[jupyter]`` extra).
VIEW_PACKAGES = ("bokeh", "jupyter_bokeh", "ipywidgets", "matplotlib")
