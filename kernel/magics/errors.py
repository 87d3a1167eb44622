"""Short, readable errors for the magics (never a stack dump).

IPython shows an exception that has a ``_render_traceback_()`` method with the
lines it returns (ipyparallel's engines do the same). A failing action is shown
as the frames of the cell (on the worker, with the cell's own line numbers and
lines) and the exception, without the runtime's frames; ``%clamor traceback``
prints the full text. An interrupted action says that the cluster is still usable.
"""

from __future__ import annotations

import contextlib
import os
import re
import traceback
from collections.abc import Iterator
from typing import Any

from clamor.kernel.magics.cells import is_cell_file, line_of
from clamor.runtime import errors as runtime_errors
from IPython import get_ipython
from IPython.core.error import UsageError

INTERRUPTED = "interrupted; the cluster is still usable"

_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.*)$')
#: The files ipykernel (``.../ipykernel_<pid>/<hash>.py``) and IPython (``<ipython-input-...>``)
#: compile plain cells as: the user's frames, like the magics' own cell files.
_NOTEBOOK_CELL = re.compile(r"(^<ipython-input-|/ipykernel_\d+/[0-9a-f]+\.py$)")
_HEADER = "Traceback (most recent call last):"

#: The full text of the last error shown in short form (``%clamor traceback``).
last_full_traceback = ""


class ShortError(Exception):
    """Stands for an exception whose own attributes cannot be set (``__slots__``)."""

    def __init__(self, original: BaseException, lines: list[str]) -> None:
        super().__init__(str(original))
        self.original = original
        self.lines = lines

    def _render_traceback_(self) -> list[str]:
        return self.lines


def shorten(exc: BaseException) -> BaseException:
    """``exc`` made to print in short form in IPython; raise what this returns."""
    global last_full_traceback
    if isinstance(exc, KeyboardInterrupt):
        lines = [INTERRUPTED]
    else:
        lines = short_lines(exc)
    last_full_traceback = full_text(exc)
    try:
        exc._render_traceback_ = lambda: lines  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        return ShortError(exc, lines)
    return exc


@contextlib.contextmanager
def short() -> Iterator[None]:
    """Re-raise what the block raises (but a ``UsageError``) in short form."""
    try:
        yield
    except UsageError:
        raise
    except (Exception, KeyboardInterrupt) as exc:  # re-raised, shortened
        shortened = shorten(exc)
        if shortened is exc:
            raise  # as it was (cause and remote traceback kept), printed in short form
        raise shortened from exc


def install(shell: Any) -> None:
    """Show the errors of Clamor's calls in plain cells (``cluster.run(...)``,
    ``ds.collect()``) as the magics show theirs: a task's error by the cell's frames on
    the worker, a Ctrl-C of an action in one line; ``%clamor traceback`` has the rest.
    Every other exception is shown as IPython always does."""

    def show(self: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> None:
        if not hasattr(value, "_render_traceback_") and _from_clamor(value):
            value = shorten(value)
            etype = type(value)
        self.showtraceback((etype, value, tb), tb_offset=tb_offset)

    shell.set_custom_exc((Exception, KeyboardInterrupt), show)


_RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(runtime_errors.__file__)))


def _from_clamor(exc: BaseException) -> bool:
    """Whether ``exc`` comes out of Clamor: a task's error (its remote traceback attached),
    Clamor's own error, or a Ctrl-C that hit an action waiting in the runtime."""
    if getattr(exc, "remote_traceback", "") or isinstance(exc, runtime_errors.ClamorError):
        return True
    if isinstance(exc, KeyboardInterrupt):
        return any(f.filename.startswith(_RUNTIME) for f in traceback.extract_tb(exc.__traceback__))
    return False


def full_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    remote = getattr(exc, "remote_traceback", "")
    if remote and remote not in text:
        text = f"{remote.rstrip()}\n\n(on the driver:)\n{text}"
    return text


def short_lines(exc: BaseException) -> list[str]:
    """The frames of the cell (remote ones if the task failed on a worker) and the exception."""
    remote = getattr(exc, "remote_traceback", "")
    if remote:
        frames, tail = remote_frames(remote)
    else:
        frames, tail = local_frames(exc), []
    if not tail:
        tail = exception_only(exc)
    out = []
    if frames:
        where = "on a worker" if remote else "in the driver"
        out.append(f"Traceback of the cell, {where} (most recent call last):")
        out.extend(frames)
    out.extend(tail)
    return ["\n".join(out)]


def exception_only(exc: BaseException) -> list[str]:
    """``Type: message`` (without the module of clamor's own exception types) and notes."""
    lines = [line.rstrip("\n") for line in traceback.format_exception_only(exc)]
    qualified = f"{type(exc).__module__}.{type(exc).__qualname__}"
    if lines and lines[-1].startswith(qualified) and type(exc).__module__.startswith("clamor."):
        lines[-1] = type(exc).__qualname__ + lines[-1][len(qualified) :]
    return lines


def _cell(filename: str) -> bool:
    """Whether ``filename`` is a notebook cell's: a ``%%clamor`` body or a plain cell."""
    return is_cell_file(filename) or bool(_NOTEBOOK_CELL.search(filename))


def _named(line: str) -> str:
    """A frame line with a plain cell's file shown as IPython shows it (``Cell In[3]``)."""
    match = _FRAME.match(line)
    shell = get_ipython()
    if match is None or shell is None or not _NOTEBOOK_CELL.search(match["file"]):
        return line
    try:
        name = shell.compile.format_code_name(match["file"])
    except Exception:  # noqa: BLE001 - another compiler: the file name then
        name = None
    if not name:
        return line
    return f'  {" ".join(name)}, line {match["line"]}, in {match["name"]}'


def remote_frames(text: str) -> tuple[list[str], list[str]]:
    """Parse a formatted traceback: the frame lines from the first cell frame on (source
    lines added from this process's linecache when missing), and the exception lines."""
    lines = text.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if line == _HEADER]
    if not starts:
        return [], []
    body = lines[starts[-1] + 1 :]  # the last traceback of a chain is the raised one
    frames: list[list[str]] = []
    tail: list[str] = []
    for line in body:
        if _FRAME.match(line):
            frames.append([line])
        elif line.startswith("    ") and frames and not tail:
            frames[-1].append(line)
        else:
            tail.append(line)
    first = next((i for i, f in enumerate(frames) if _cell(_FRAME.match(f[0])["file"])), None)
    if first is None:
        return [], tail
    out: list[str] = []
    for frame in frames[first:]:
        match = _FRAME.match(frame[0])
        out.extend(frame)
        if len(frame) == 1 and _cell(match["file"]):
            source = line_of(match["file"], int(match["line"]))
            if source:
                out.append(f"    {source}")
    return [_named(line) for line in out], tail


def local_frames(exc: BaseException) -> list[str]:
    """The driver-side frames of ``exc`` from the first cell frame on."""
    stack = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(stack) if _cell(f.filename)), None)
    if first is None:
        return []
    return [_named(line) for line in "".join(traceback.format_list(stack[first:])).rstrip("\n").splitlines()]


class CellSyntaxError(Exception):
    """A syntax error in a ``%%clamor`` cell body, found before anything was sent.

    Not a ``SyntaxError`` subclass: IPython would print the stack of the magic's own
    frames for one. Shown as Python shows a syntax error, with the cell's line number;
    the original is ``error``.
    """

    def __init__(self, error: SyntaxError) -> None:
        super().__init__(str(error))
        self.error = error

    def _render_traceback_(self) -> list[str]:
        lines = [line.rstrip("\n") for line in traceback.format_exception_only(self.error)]
        return ["\n".join(lines)]
