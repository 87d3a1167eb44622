"""``%clamor`` and ``%%clamor``: parse the line, then delegate to the runtime.

The cell magics compile their body once in the driver (cells.py), turn the source
variable into a dataset and call the dataset's method; only ``reduce`` runs a
stage. The line magics (commands.py) manage the session's cluster.
"""

from __future__ import annotations

import collections.abc
import contextvars
import threading
from typing import Any

import numpy as np
from clamor.kernel import session
from clamor.kernel.magics import errors, parsing
from clamor.kernel.magics.cells import EmptyCellError, check_identifiers, compile_cell
from clamor.kernel.magics.commands import LineCommands
from clamor.kernel.magics.progress import progress
from clamor.kernel.magics.views import ViewCommands
from clamor.runtime.cluster import Cluster
from clamor.runtime.data.dataset import Dataset
from clamor.runtime.futures import ClusterFuture
from clamor.runtime.net import shipping
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

_DOC = """Clamor: data-parallel stages over demand-paged notebook objects.

Cell magics (the body runs on the workers; the value of its last expression is the
result, as in IPython; the names it uses are taken from the notebook when the cell
runs, and arena arrays among them travel as references, paged in on demand):

{cells}

Line magics:

{lines}

SRC: a dataset, or a numpy array or sequence (parallelized into N partitions, default
config partitions). The result goes to NAME (default _) and is the cell's output;
map, filter, flat_map and map_partitions are lazy (they define a dataset), reduce runs
now. Errors raised by the body show the cell's own line numbers; %clamor traceback
prints the full text. A magic used before any cluster exists starts the default one
(config workers, default one per core). `scale N` grows or shrinks the running cluster
to N workers: the same cluster, its datasets go on. `start` while a cluster runs restarts
it: datasets of the old cluster cannot be used any more, and it refuses while persisted
datasets are in the namespace unless given --force.

Examples:

    %%clamor map points --as p --into norms
    np.sqrt((p ** 2).sum())

    %%clamor reduce norms --as a,b
    max(a, b)

    %clamor status
    %clamor checkpoint /tmp/ck tree norms
"""


def _is_source(value: Any) -> bool:
    if isinstance(value, Dataset | np.ndarray | collections.abc.Set):
        return True
    return isinstance(value, collections.abc.Sequence) and not isinstance(value, str | bytes | bytearray)


@magics_class
class ClamorMagics(LineCommands, ViewCommands, Magics):
    """The ``%clamor`` line magic and the ``%%clamor`` cell magic."""

    @line_cell_magic
    def clamor(self, line: str, cell: str | None = None) -> None:
        words = parsing.split(line)
        if cell is None:
            return self._line(words)
        return self._cell(line, words, cell)

    clamor.__doc__ = _DOC.format(cells=parsing.summary(lines=False), lines=parsing.summary(cells=False))

    # --- dispatch ---

    def _line(self, words: list[str]) -> None:
        if not words:
            print(f"usage: %clamor SUBCOMMAND ... (or %%clamor OP SRC in a cell)\n{parsing.summary()}")
            return
        command, rest = words[0], words[1:]
        if command in parsing.CELL_COMMANDS:
            raise UsageError(f"{command} needs a cell body: write the code below\n"
                             f"  {parsing.usage(command)}")  # fmt: skip
        if command not in parsing.LINE_COMMANDS:
            raise parsing.unknown(command, list(parsing.LINE_COMMANDS), "subcommand")
        args = parsing.parse(command, rest)
        if args is not None:
            getattr(self, f"cmd_{command}")(args)

    def _cell(self, line: str, words: list[str], cell: str) -> None:
        if not words:
            raise UsageError("%%clamor needs an operation and a source, e.g. %%clamor map SRC\n"
                             + parsing.summary(lines=False))  # fmt: skip
        command, rest = words[0], words[1:]
        if command in parsing.LINE_COMMANDS:
            if cell.strip():
                raise UsageError(f"{command} is a line magic and takes no cell body: %clamor {line}")
            return self._line(words)
        if command not in parsing.CELL_COMMANDS:
            raise parsing.unknown(command, list(parsing.CELL_COMMANDS), "operation")
        args = parsing.parse(command, rest)
        if args is not None:
            self._run_cell(command, args, line, cell)

    # --- the cell operations ---

    def _run_cell(self, kind: str, args: Any, line: str, body: str) -> None:
        ns = self.shell.user_ns
        params = self._params(kind, args.names)
        if args.into is not None:
            check_name(args.into, "--into")
        source = resolve_source(ns, args.source, self.hidden())
        try:
            compiled = compile_cell(body, params, ns, kind=kind, header=f"%%clamor {line}")
        except EmptyCellError as exc:
            raise UsageError(f"{exc}\n  {parsing.usage(kind)}") from None
        except SyntaxError as exc:
            raise errors.CellSyntaxError(exc) from None
        # a dataset runs on its own cluster; a sequence needs one (the default starts now)
        cluster = source._runner if isinstance(source, Dataset) else self.cluster()
        with errors.short():  # an unpicklable closure fails here, naming the variable
            shipping.pack_task(compiled.fn, (), None, getattr(cluster, "page_size", None) or None)
        with errors.short():
            dataset = to_dataset(source, args.source, cluster, args.partitions)
            if args.background:
                result = in_background(cluster, kind, dataset, compiled.fn)
            elif kind == "reduce":
                with progress(cluster):
                    result = dataset.reduce(compiled.fn)
            else:
                result = getattr(dataset, kind)(compiled.fn)
        if args.into is not None:
            ns[args.into] = result
        self._show(result)

    @staticmethod
    def _params(kind: str, names: str) -> tuple[str, ...]:
        wanted = 2 if kind == "reduce" else 1
        parts = tuple(n.strip() for n in names.split(","))
        if len(parts) != wanted:
            example = "--as a,b" if wanted == 2 else "--as x"
            raise UsageError(f"{kind} binds {wanted} name{'s' if wanted > 1 else ''} ({example}), "
                             f"got {names!r}\n  {parsing.usage(kind)}")  # fmt: skip
        try:
            return check_identifiers(parts, "--as")
        except ValueError as exc:
            raise UsageError(f"{exc}\n  {parsing.usage(kind)}") from None

    def _show(self, result: Any) -> None:
        """The cell's output: Out[n], ``_`` and the display, as for a cell's last expression."""
        hook = getattr(self.shell, "displayhook", None)
        if hook is not None:
            hook(result)
        elif result is not None:
            print(repr(result))

    # --- the session's cluster ---

    def hidden(self) -> set[str]:
        return set(getattr(self.shell, "user_ns_hidden", {}) or {})

    def cluster(self, start: bool = True) -> Cluster | None:
        """The session's cluster; adopts one the notebook opened itself; starts the
        default one if none exists and ``start``."""
        cluster = session.current()
        if cluster is None:
            for value in list(self.shell.user_ns.values()):
                if isinstance(value, Cluster) and not getattr(value, "closed", False):
                    return session.use(value)
        if cluster is None and start:
            print(f"starting the default cluster: {session.default_workers()} workers "
                  "(%clamor start -n N chooses)")  # fmt: skip
            with errors.short():
                cluster = session.get()
        return cluster


def in_background(cluster: Cluster, kind: str, dataset: Dataset, fn: Any) -> ClusterFuture:
    """``--background``: run the cell's work on a thread of its own, with its progress bar
    in the cell's output; a future of the result (a dataset's collected elements, or the
    reduced value). The cluster runs one stage at a time: later cells' actions wait."""
    future = ClusterFuture()
    future.set_running_or_notify_cancel()

    def work() -> None:
        try:
            with progress(cluster, delay=0.0):
                value = dataset.reduce(fn) if kind == "reduce" else getattr(dataset, kind)(fn).collect()
        except BaseException as exc:  # noqa: BLE001 - the future carries it, short
            future.set_exception(errors.shorten(exc))
        else:
            future.set_result(value)

    context = contextvars.copy_context()  # output (the bar) goes to this cell
    threading.Thread(target=context.run, args=(work,), name="clamor-background", daemon=True).start()
    return future


def check_name(name: str, what: str) -> str:
    try:
        return check_identifiers([name], what)[0]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def candidates(ns: dict, hidden: set[str]) -> list[str]:
    """Names of the datasets, arrays and sequences in the namespace."""
    return sorted(n for n, v in ns.items() if not n.startswith("_") and n not in hidden and _is_source(v))


def resolve_source(ns: dict, name: str, hidden: set[str] = frozenset()) -> Any:
    """The value named ``name`` (``a`` or ``a.b``) if it is a dataset, array or sequence."""
    head, *attrs = name.split(".")
    here = candidates(ns, hidden)
    listing = f"datasets and arrays here: {', '.join(here)}" if here else "no datasets, arrays or sequences here yet"
    if head not in ns:
        raise UsageError(f"no variable {head!r}; {listing}")
    value = ns[head]
    for i, attr in enumerate(attrs):
        try:
            value = getattr(value, attr)
        except AttributeError:
            raise UsageError(f"{'.'.join([head, *attrs[:i]])!r} has no attribute {attr!r}") from None
    if not _is_source(value):
        raise UsageError(
            f"{name!r} ({type(value).__name__}) is not a dataset, array or sequence; {listing}"
        )
    return value


def to_dataset(source: Any, name: str, cluster: Cluster, partitions: int | None) -> Dataset:
    """``source`` as a dataset of ``cluster``; a dataset is repartitioned if ``partitions`` differs."""
    if isinstance(source, Dataset):
        if getattr(source._runner, "closed", False):
            raise UsageError(f"dataset {name!r} belongs to a cluster that was stopped; build it again")
        if partitions is not None and partitions != source.num_partitions:
            return source.repartition(partitions)
        return source
    return cluster.parallelize(source, partitions or session.config["partitions"])
