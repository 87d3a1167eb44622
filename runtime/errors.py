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


class TaskCrashedError(TaskError):
    """A task was running each time its worker was lost, as often as the cluster allows
    (a task that kills its process: a segfault, ``os._exit``, the OOM killer): its stage
    fails with this instead of taking more workers. ``how``: how the last worker ended;
    ``stage``: the stage's name, when the executor knows it."""

    def __init__(self, index: int, losses: int, how: str, stage: str = "") -> None:
        self.index, self.losses, self.how, self.stage = index, losses, how, stage
        self.count = 1  # tasks in the attempt (a fused one runs several)
        super().__init__("TaskCrashedError", self._describe())

    def _describe(self) -> str:
        where = f" of stage {self.stage!r}" if self.stage else ""
        what = f"task {self.index}" if self.count == 1 else (
            f"tasks {self.index}-{self.index + self.count - 1} (run as one fused attempt)")
        return (f"{what}{where} was running each time its worker was lost, "
                f"{self.losses} times (the limit): the last time {self.how}")  # fmt: skip

    def name_stage(self, stage: str, chunk: tuple[int, int] | None = None) -> None:
        """Say which stage the task belongs to (the scheduler knows stages by number) and,
        for a fused stage, which tasks its attempt ran (``(first index, count)``)."""
        self.stage = stage
        if chunk is not None:
            self.index, self.count = chunk
        self.message = self._describe()
        self.args = (f"{self.type_name}: {self.message}",)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (type(self), (self.index, self.losses, self.how, self.stage))


class WorkerLostError(ClamorError):
    """A worker process died or became unreachable (``how``: exit status, signal, ...)."""

    def __init__(self, worker_id: int, how: str) -> None:
        super().__init__(f"worker {worker_id} was lost: {how}")
        self.worker_id = worker_id
        self.how = how

    def __reduce__(self):
        return (type(self), (self.worker_id, self.how))


class ActionTimeoutError(ClamorError, TimeoutError):
    """An action ran past its ``timeout`` (or the cluster's ``action_timeout``): its stage
    was cancelled and its running tasks stopped; the cluster stays usable."""


class NoWorkersError(WorkerLostError):
    """No live worker is left to run a stage (every one was lost, none replaced yet)."""

    def __init__(self, what: str, cause: str = "") -> None:
        ClamorError.__init__(self, f"cannot run {what}: no live workers are left" + (f" (last: {cause})" if cause else ""))
        self.worker_id, self.how, self.what, self.cause_text = None, "no live workers are left", what, cause

    def __reduce__(self):
        return (type(self), (self.what, self.cause_text))


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
