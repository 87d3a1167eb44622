"""Serialization of tasks and results between the driver and the workers.

Tasks are pickled with cloudpickle plus one rule: a numpy array
whose buffer lies in the driver's arena travels as an `ArenaRef` (offset,
shape, dtype, strides) and the worker rebuilds a zero-copy, read-only view
over its own arena mapping, whose pages fault in on first touch. Objects that
hold such arrays (sklearn trees, dicts, user classes) therefore ship as a few
bytes plus references. Arrays smaller than a page travel by value: sending
them is cheaper than a page fault. Payloads are bounded by the control plane's
message size (:func:`check_payload_size`), and a task's exception travels back as
its pickle plus its traceback text (:func:`encode_exception` / :func:`decode_exception`).

Code objects travel with ``marshal`` rather than cloudpickle's reducer: since
cloudpickle 3.1.3 that reducer renames every file ``<dynamic-code>`` (for
deterministic pickles), and a worker's traceback then no longer names the cell
(``<clamor-cell-N>``) or notebook input its lines come from. Driver and workers
run the same Python (cloudpickle's bytecode needs it too), so marshal is safe.
"""

from __future__ import annotations

import contextlib
import io
import marshal
import pickle
import sys
import traceback
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import cloudpickle
import numpy as np
from clamor.runtime.errors import RemoteTraceback, SerializationError, TaskError
from clamor.runtime.net.transport import MAX_MESSAGE_BYTES
from clamor.runtime.paging import arena
from clamor.runtime.paging.pager import worker_pager

if TYPE_CHECKING:
    from clamor.runtime.stage import TaskContext


class ArenaRef(NamedTuple):
    """Where an arena array lives: enough to rebuild a view on any process."""

    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...]


def arena_ref(x: np.ndarray) -> ArenaRef:
    """The reference for an arena array (`ValueError` if `x` is not in the arena)."""
    return ArenaRef(arena.arena_offset(x), x.shape, x.dtype, x.strides)


def rebuild(ref: ArenaRef) -> np.ndarray:
    """The array `ref` names, as seen by this process.

    On a worker: a read-only view of its demand-paged arena. In the driver
    (e.g. a task unpickled locally): a read-only view of the driver's arena.
    """
    pager = worker_pager()
    if pager is not None:
        return pager.array(ref.offset, ref.shape, ref.dtype, ref.strides)
    view = arena.view(ref.offset, ref.shape, ref.dtype, ref.strides)
    view.flags.writeable = False
    return view


def _rebuild(offset: int, shape: tuple, dtype: np.dtype, strides: tuple) -> np.ndarray:
    return rebuild(ArenaRef(offset, shape, dtype, strides))


def _imported_submodules(code: types.CodeType, top_level_dependencies: Any) -> list[types.ModuleType]:
    """cloudpickle's ``_find_imported_submodules`` by lookups instead of a scan.

    cloudpickle pickles a function by value with the imported submodules its code can
    reach through a package it names (``np.linalg`` through ``np``): a submodule counts
    when every part of its name after the package's is a name in the code. It finds them
    by scanning all of ``sys.modules`` once per package the function names: about a
    millisecond a function in a notebook with 2,000 modules imported, paid for every
    stage's program (cloudpipe/cloudpickle#576). Here the candidates are built from the
    code's names instead, one dictionary lookup each, extending only names that are
    imported (a package is in ``sys.modules`` before its submodules are).
    """
    names = set(code.co_names)
    found: list[types.ModuleType] = []
    for package in top_level_dependencies:
        if not (isinstance(package, types.ModuleType) and getattr(package, "__package__", None)):
            continue
        frontier = [package.__name__]
        while frontier:
            parent = frontier.pop()
            for name in names:
                module = sys.modules.get(f"{parent}.{name}")
                if module is not None:
                    found.append(module)
                    frontier.append(f"{parent}.{name}")
    return found


if callable(getattr(cloudpickle.cloudpickle, "_find_imported_submodules", None)):
    cloudpickle.cloudpickle._find_imported_submodules = _imported_submodules


class _Pickler(cloudpickle.Pickler):
    def __init__(
        self, file: io.BytesIO, min_ref_bytes: int | None, buffer_callback: Callable | None = None
    ) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffer_callback)
        self.min_ref_bytes = min_ref_bytes

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is np.ndarray
            and not obj.dtype.hasobject
            and arena.in_arena(obj)  # first: never creates an arena (workers have none)
            and obj.nbytes >= (self.min_ref_bytes or arena.page_size())
        ):
            return _rebuild, tuple(arena_ref(obj))
        if type(obj) is np.ndarray and _plain(obj):
            return _frombuffer, (pickle.PickleBuffer(obj), obj.dtype.str, obj.shape)
        if type(obj) is types.CodeType:
            return marshal.loads, (marshal.dumps(obj),)  # keeps co_filename (module docstring)
        return super().reducer_override(obj)


def _plain(a: np.ndarray) -> bool:
    """Whether ``a`` is C-contiguous with a dtype of numbers, booleans or strings that its
    ``str`` names exactly (no metadata): it then pickles as its bytes and that string."""
    return a.flags.c_contiguous and a.dtype.kind in "biufcSU" and not a.dtype.metadata


def _frombuffer(data: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array pickled by :func:`_plain`'s rule, as numpy's own pickle rebuilds it: over
    the unpickled buffer (writeable where the original was).

    numpy's reduction pickles the dtype object too, a few objects more, each through
    the pickler's Python hooks: an 8 KiB array took 31 us to pickle that way and takes
    14 us this way (2-core VM), on the driver's path for every task it ships with."""
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def dumps(obj: object, min_ref_bytes: int | None = None) -> bytes:
    """Serialize `obj` (closures included); arena arrays of at least `min_ref_bytes`
    (default: the arena's page size; a cluster passes its own) by reference."""
    buf = io.BytesIO()
    _Pickler(buf, min_ref_bytes).dump(obj)
    return buf.getvalue()


def dumps_out_of_band(obj: object) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Like `dumps`, but large buffers (array data) stay out of the pickle, uncopied,
    for a transport that sends them as they are (runtime/storage/bulk.py); `loads(data, buffers)`."""
    buf, buffers = io.BytesIO(), []
    _Pickler(buf, None, buffers.append).dump(obj)
    return buf.getvalue(), buffers


def loads(data: bytes, buffers: Sequence | None = None) -> object:
    """Inverse of `dumps` (and of `dumps_out_of_band`, given its buffers)."""
    return pickle.loads(data, buffers=buffers)


# --- task payloads: fail at submission, naming the culprit -------------------------


def pack_task(
    fn: Callable, args: tuple = (), kwargs: dict | None = None, min_ref_bytes: int | None = None
) -> bytes:
    """``dumps((fn, args, kwargs))``, or a :class:`SerializationError` naming the culprit."""
    kwargs = kwargs or {}
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    try:
        data = dumps((fn, tuple(args), kwargs), min_ref_bytes)
    except Exception as exc:
        culprit = _find_unpicklable(fn, args, kwargs)
        raise SerializationError(
            f"cannot ship {name} to a worker: {culprit or 'the task'} cannot be pickled "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return check_payload_size(data, f"the task {name} with its arguments")


#: The last program packed: ``(program, min_ref_bytes, inputs, data)`` (see :func:`_inputs`).
_last_program: tuple | None = None


def pack_program(program: object, min_ref_bytes: int | None = None) -> bytes:
    """``dumps(program)`` for a stage, or a :class:`SerializationError` naming the culprit.

    The same plain function packed again, with the very same immutable inputs, gives
    the bytes of last time (an iterative loop runs one stage program many times, and
    pickling it again would be a noticeable part of a short stage)."""
    global _last_program
    inputs = _inputs(program)
    last = _last_program
    if (inputs is not None and last is not None and last[0] is program and last[1] == min_ref_bytes
            and len(last[2]) == len(inputs) and all(a is b for a, b in zip(last[2], inputs))):  # fmt: skip
        return last[3]
    try:
        data = dumps(program, min_ref_bytes)
    except Exception as exc:
        name = getattr(program, "__qualname__", None) or type(program).__qualname__
        culprit = _find_unpicklable(program, (), {})
        raise SerializationError(
            f"cannot ship {name} to the workers: {culprit or 'the stage'} cannot be pickled "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    data = check_payload_size(data, "the stage's program")
    if inputs is not None:
        _last_program = (program, min_ref_bytes, inputs, data)  # holds them: no id is reused
    return data


_FROZEN = (int, float, complex, str, bytes, bool, type(None), range, types.ModuleType,
           types.BuiltinFunctionType, types.CodeType)  # fmt: skip


def _frozen(value: object) -> bool:
    """Whether ``value`` pickles the same for as long as it lives (immutable all through)."""
    if isinstance(value, _FROZEN):
        return True
    return type(value) in (tuple, frozenset) and all(_frozen(v) for v in value)


def _inputs(program: object) -> tuple | None:
    """Everything the pickle of ``program`` depends on, if it is a plain function whose
    inputs are all immutable (code, names, defaults, closure cells, the globals its code
    names): the same objects then pickle to the same bytes. ``None`` otherwise (a
    mutable global such as a list or an array, a helper function, an attribute set on
    it ...): it is pickled every time."""
    if type(program) is not types.FunctionType or program.__dict__ or program.__annotations__:
        return None
    f: types.FunctionType = program
    values: list[object] = [f.__code__, f.__name__, f.__qualname__, f.__module__, f.__doc__,
                            f.__defaults__]  # fmt: skip
    for name, value in sorted((f.__kwdefaults__ or {}).items()):  # flat: the same objects
        values += (name, value)
    try:
        values += [cell.cell_contents for cell in f.__closure__ or ()]
    except ValueError:  # an empty cell
        return None
    names, codes = set(), [f.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for name in sorted(names):  # the names are the code's own (interned) strings
        if name in f.__globals__:
            values += (name, f.__globals__[name])
    return tuple(values) if all(_frozen(v) for v in values) else None


class PackedCalls(NamedTuple):
    """A stage's calls, pickled by :func:`pack_calls`."""

    #: The objects that several calls pass (the function, a model, a tree, a table), once.
    shared: bytes
    #: One per call (a task's ``TaskSpec.payload``): the rest, naming the shared by position.
    payloads: list[bytes]


class _CallPickler(_Pickler):
    """Pickles a call, writing each object of the shared section as its position there."""

    def __init__(self, file: io.BytesIO, min_ref_bytes: int | None, shared: dict[int, int]) -> None:
        super().__init__(file, min_ref_bytes)
        self.shared = shared

    def persistent_id(self, obj: Any) -> int | None:
        return self.shared.get(id(obj))


def _sharable(value: object) -> bool:
    return not isinstance(value, int | float | complex | type(None))  # bool is an int


def pack_calls(
    calls: Sequence[tuple[Callable, tuple, dict | None]], min_ref_bytes: int | None = None
) -> PackedCalls:
    """Pickle ``(fn, args, kwargs)`` calls for one stage, or raise the
    :class:`SerializationError` of :func:`pack_task` naming the culprit.

    The function and the arguments that more than one call passes (the same object) are
    pickled once, into the shared section; each call's payload names them by position.
    So 56 queries over one k-d tree ship the tree once, not 56 times. Every call still
    gets copies of its own mutable arguments, as if it were pickled alone
    (:class:`CallRunner`).
    """
    counts: dict[int, int] = {}
    objects: dict[int, object] = {}
    for fn, args, kwargs in calls:
        mine = {id(v): v for v in (fn, *args, *(kwargs or {}).values()) if _sharable(v)}
        for key, value in mine.items():
            counts[key] = counts.get(key, 0) + 1
            objects[key] = value
    shared = [objects[key] for key, n in counts.items() if n > 1]
    positions = {id(value): i for i, value in enumerate(shared)}
    try:
        shared_data = dumps(tuple(shared), min_ref_bytes) if shared else b""
        payloads = []
        for fn, args, kwargs in calls:
            buf = io.BytesIO()
            _CallPickler(buf, min_ref_bytes, positions).dump((fn, tuple(args), kwargs or {}))
            payloads.append(buf.getvalue())
    except Exception:
        for fn, args, kwargs in calls:  # raises for the first call that cannot be pickled
            pack_task(fn, args, kwargs, min_ref_bytes)
        raise
    check_payload_size(shared_data + b"".join(payloads), "the stage's calls together")
    return PackedCalls(shared_data, payloads)


class CallRunner:
    """The program of a stage of packed calls (``Cluster.run_stage``, futures): task ``i``
    runs the call in its payload (``ctx.payload``) with the shared section's objects. It
    lives here rather than with the cluster so that a worker that unpickles it imports
    none of the driver's modules (scheduler, datasets, launchers).

    A worker unpickles the shared section once per stage where nothing in it can be
    changed by a call: functions (a worker loads a function once, as Dask's and Ray's
    do: its globals and defaults then live on between the stage's calls there, as they
    do between calls in one process), classes, modules, read-only arrays (arena
    references) and immutable values. Otherwise afresh for each call: a list or a
    writable array that every call is passed is each call's own copy. Unpickling a
    function again for each call was about a quarter of a worker's busy time in a stage
    of short calls.
    """

    def __init__(self, shared: bytes = b"") -> None:
        self.shared = shared
        self._kept: tuple | None = None

    def __getstate__(self) -> dict:
        return {"shared": self.shared}

    def __setstate__(self, state: dict) -> None:
        self.shared, self._kept = state["shared"], None

    def __call__(self, ctx: TaskContext) -> Any:
        unpickler = pickle.Unpickler(io.BytesIO(ctx.payload))
        unpickler.persistent_load = self._shared_objects().__getitem__
        fn, args, kwargs = unpickler.load()
        return fn(*args, **kwargs)

    def _shared_objects(self) -> tuple:
        if self._kept is not None:
            return self._kept
        objects = loads(self.shared) if self.shared else ()
        if all(_unchangeable(o) for o in objects):
            self._kept = objects
        return objects


def _unchangeable(obj: object) -> bool:
    """Whether a call cannot change ``obj`` for the calls after it, except through a
    function's own state (see :class:`CallRunner`): what :func:`_frozen` says, and
    functions, classes and read-only arrays too."""
    if _frozen(obj) or isinstance(obj, types.FunctionType | type):
        return True
    if type(obj) is np.ndarray:
        return not obj.flags.writeable and not obj.dtype.hasobject
    return type(obj) in (tuple, frozenset) and all(_unchangeable(o) for o in obj)


def _picklable(obj: object) -> bool:
    try:
        dumps(obj)
        return True
    except Exception:  # noqa: BLE001 - whatever the pickler raises
        return False


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _parts(fn: object) -> list[tuple[str, object]]:
    """The objects a function drags along when pickled by value: captured variables, globals,
    defaults; the items of a list, tuple or dict; the attributes of another object."""
    if isinstance(fn, list | tuple):
        return [(f"item {i} of a {type(fn).__name__}", x) for i, x in enumerate(fn)]
    if isinstance(fn, dict):
        return [(f"value {k!r} of a dict", v) for k, v in fn.items()]
    if not isinstance(fn, types.FunctionType):
        attrs = getattr(fn, "__dict__", None)
        owner = type(fn).__qualname__
        return [(f"attribute {k!r} of a {owner}", v) for k, v in (attrs or {}).items()]
    name = fn.__qualname__
    parts = [
        (f"variable {var!r} captured by {name}", cell.cell_contents)
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())
        if _cell_filled(cell)
    ]
    parts += [
        (f"global {var!r} used by {name}", fn.__globals__[var])
        for var in sorted(_global_names(fn.__code__))
        if var in fn.__globals__
    ]
    parts += [(f"a default argument of {name}", d) for d in fn.__defaults__ or ()]
    parts += [(f"keyword default {k!r} of {name}", v) for k, v in (fn.__kwdefaults__ or {}).items()]
    return parts


def _cell_filled(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _find_unpicklable(fn: Callable, args: Sequence, kwargs: dict) -> str | None:
    """Describe the innermost object that fails to pickle, e.g. "variable 'lock' captured by f"."""

    def search(label: str, obj: object, depth: int, seen: set[int]) -> str | None:
        if id(obj) in seen or _picklable(obj):
            return None
        seen.add(id(obj))
        if depth < 6:
            for sub_label, sub in _parts(obj):
                found = search(sub_label, sub, depth + 1, seen)
                if found:
                    return found
        return f"{label} (a {type(obj).__module__}.{type(obj).__qualname__})"

    candidates = [("the function", fn)]
    candidates += [(f"argument {i}", a) for i, a in enumerate(args)]
    candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    seen: set[int] = set()
    for label, obj in candidates:
        found = search(label, obj, 0, seen)
        if found:
            return found
    return None


# --- payload sizes and remote exceptions ---------------------------------------------

#: Largest pickled task or result: the message limit minus room for the other fields.
MAX_PAYLOAD_BYTES = MAX_MESSAGE_BYTES - 1024 * 1024


def check_payload_size(data: bytes, what: str) -> bytes:
    """Return ``data``, or raise :class:`SerializationError` if it exceeds the message limit."""
    if len(data) > MAX_PAYLOAD_BYTES:
        raise SerializationError(
            f"{what} is {len(data) / 2**20:.1f} MiB once pickled, over the "
            f"{MAX_PAYLOAD_BYTES / 2**20:.0f} MiB limit of a control-plane message; "
            "keep large data in the shared arena rather than shipping it by value"
        )
    return data


def encode_exception(exc: BaseException) -> dict[str, Any]:
    """Fields of a ``RunTaskReply`` describing ``exc`` (pickled form, traceback text, type, message)."""
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb  # drop the worker's frame
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        blob = dumps(exc)
        if len(blob) > MAX_PAYLOAD_BYTES // 2:
            blob = b""
    except Exception:  # noqa: BLE001 - unpicklable: the driver gets a TaskError
        blob = b""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001
        message = "<unprintable>"
    cls = type(exc)
    return {
        "error": blob,
        "traceback": text,
        "error_type": f"{cls.__module__}.{cls.__qualname__}",
        "error_message": message,
    }


def decode_exception(blob: bytes, tb: str, type_name: str, message: str) -> Exception:
    """Re-create a task's exception in the driver, with the remote traceback attached.

    The same type when it unpickles to an ``Exception``; otherwise a :class:`TaskError`.
    The traceback is both ``exc.remote_traceback`` and ``exc.__cause__`` (a
    :class:`RemoteTraceback`).
    """
    exc: Exception | None = None
    if blob:
        try:
            obj = loads(blob)
        except Exception:  # noqa: BLE001 - e.g. a class the driver cannot import
            obj = None
        if isinstance(obj, Exception):
            exc = obj
    if exc is None:
        exc = TaskError(type_name, message, tb)
    with contextlib.suppress(AttributeError):  # exceptions with __slots__ or read-only attributes
        exc.__cause__ = RemoteTraceback(tb)
        exc.remote_traceback = tb
    return exc
