"""Cell bodies of ``%%clamor`` compiled into functions that ship to the workers.

The body is compiled once, in the driver, as the body of a function of the
element (``x``, or the names given with ``--as``); as in IPython, when the last
statement is an expression its value is the result. The file name is
``<clamor-cell-N>`` and the line numbers are the cell's own (the magic line is
line 1), and the source is registered in :mod:`linecache` in the driver *and*,
when the function is unpickled, on the worker, so tracebacks show the lines.

The function's globals are a snapshot of the names the body reads from the
user namespace, taken when the magic runs (a later rebinding of a notebook
variable does not change a dataset already defined; a change inside an object
does). cloudpickle ships the function by value; arena arrays among those
globals travel as references and are demand-paged by the workers.

This module imports only the standard library: workers import it to register
the source of a cell.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import dis
import itertools
import linecache
import types
from collections.abc import Mapping, Sequence

#: Prefix of the file names of compiled cells.
CELL_FILE_PREFIX = "<clamor-cell-"

_numbers = itertools.count(1)
_GLOBAL_OPS = {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"}


def is_cell_file(filename: str) -> bool:
    return filename.startswith(CELL_FILE_PREFIX)


def register_source(filename: str, source: str) -> CellSource:
    """Make ``linecache`` (hence ``traceback``) know the lines of ``filename``."""
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)  # mtime None: kept
    return CellSource(filename, source)


@dataclasses.dataclass(frozen=True)
class CellSource:
    """Kept in the function's ``__dict__``: unpickling it registers the source."""

    filename: str
    source: str

    def __reduce__(self):
        return (register_source, (self.filename, self.source))


@dataclasses.dataclass(frozen=True)
class CompiledCell:
    """A compiled body: ``fn`` (ready to ship), the ``captured`` global names, where
    the source is (``filename``) and the ``source`` as registered."""

    fn: types.FunctionType
    captured: tuple[str, ...]
    filename: str
    source: str


class EmptyCellError(ValueError):
    """The cell has no statement."""


def compile_cell(
    body: str,
    params: Sequence[str],
    namespace: Mapping[str, object],
    *,
    kind: str = "map",
    header: str = "",
) -> CompiledCell:
    """Compile ``body`` into a function of ``params`` whose globals are the names it
    reads from ``namespace``. ``header``: the magic's line (line 1 of the cell).

    Raises ``SyntaxError`` (file name and line number of the cell) or
    :class:`EmptyCellError`; never runs any of the body.
    """
    filename = f"{CELL_FILE_PREFIX}{next(_numbers)}>"
    source = f"{header.rstrip()}\n{body}"
    cell_source = register_source(filename, source)
    name = f"<clamor {kind}>"
    tree = ast.parse("\n" + body, filename, "exec")  # line 1 is the magic's line
    statements = tree.body
    if not statements:
        raise EmptyCellError("the cell body is empty: write the code to run for each element")
    last = statements[-1]
    if isinstance(last, ast.Expr):
        statements[-1] = ast.copy_location(ast.Return(value=last.value), last)
    func = ast.parse(f"def cell({', '.join(params)}): pass").body[0]  # any Python version's fields
    func.body = statements
    ast.copy_location(func, statements[0])
    module = ast.Module(body=[func], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec", dont_inherit=True)
    inner = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    inner = inner.replace(co_name=name, co_qualname=name)
    captured = tuple(sorted(n for n in global_names(inner) if n in namespace))
    scope: dict[str, object] = {n: namespace[n] for n in captured}
    scope["__builtins__"] = builtins
    scope["__name__"] = "__main__"  # cloudpickle: ship by value, like notebook code
    fn = types.FunctionType(inner, scope, name)
    fn.__qualname__ = name
    fn._clamor_source = cell_source
    return CompiledCell(fn, captured, filename, source)


def global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the code nested in it) reads or writes."""
    names = {
        ins.argval for ins in dis.get_instructions(code) if ins.opname in _GLOBAL_OPS
    }
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return names


def check_identifiers(names: Sequence[str], what: str) -> tuple[str, ...]:
    """``names`` if they are distinct Python identifiers (not keywords), else ValueError."""
    import keyword

    for n in names:
        if not n.isidentifier() or keyword.iskeyword(n):
            raise ValueError(f"{what}: {n!r} is not a valid variable name")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: the names must differ")
    return tuple(names)


def line_of(filename: str, lineno: int) -> str:
    """The stripped source line ``lineno`` of a registered cell ('' if unknown)."""
    return linecache.getline(filename, lineno).strip()


__all__ = [
    "CELL_FILE_PREFIX",
    "CellSource",
    "CompiledCell",
    "EmptyCellError",
    "check_identifiers",
    "compile_cell",
    "global_names",
    "is_cell_file",
    "line_of",
    "register_source",
]
