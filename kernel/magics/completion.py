"""Tab completion for ``%clamor`` and ``%%clamor`` (IPython's ``complete_command`` hook).

``%clamor st<TAB>`` gives ``start``, ``status``, ``stop``; after a subcommand, its
arguments: dataset names for ``lineage``, worker ids for ``kill``/``slow``,
``key=`` for ``config``, variable names for ``checkpoint``. ``%%clamor m<TAB>``
gives ``map``, ``map_partitions``; then source names and the options.
"""

from __future__ import annotations

from typing import Any

from clamor.kernel import session
from clamor.kernel.magics import parsing
from clamor.runtime.data.dataset import Dataset

__all__ = ["complete_cell", "complete_line", "register"]

_CELL_OPTIONS = ["--as", "--into", "--partitions"]


def _words(event: Any) -> tuple[list[str], str]:
    """The words before the one being completed (magic name excluded), and that one."""
    text = getattr(event, "text_until_cursor", "") or ""
    if not text.lstrip().startswith(event.command):  # IPython 8 may pass just the token's start
        text = event.line
    words = text.split()
    current = "" if text.endswith((" ", "\t")) else (words.pop() if words else "")
    return words[1:], current


def _user_names(shell: Any, test) -> list[str]:
    hidden = set(getattr(shell, "user_ns_hidden", {}) or {})
    return sorted(n for n, v in shell.user_ns.items() if not n.startswith("_") and n not in hidden and test(v))


def _workers() -> list[str]:
    cluster = session.current()
    if cluster is None:
        return []
    try:
        return [str(w) for w in cluster.workers]
    except Exception:  # noqa: BLE001 - completion never raises
        return []


def complete_line(shell: Any, event: Any) -> list[str]:
    before, _ = _words(event)
    if not before:
        return list(parsing.LINE_COMMANDS) + list(parsing.CELL_COMMANDS if event.line.startswith("%%") else [])
    command = before[0]
    if command in ("lineage", "dashboard") and len(before) == 1:
        return _user_names(shell, lambda v: isinstance(v, Dataset))
    if command in ("kill", "slow") and len(before) == 1:
        return _workers()
    if command == "config":
        return [f"{key}=" for key in session.OPTIONS]
    if command in ("checkpoint", "heatmap") and len(before) >= (2 if command == "checkpoint" else 1):
        return _user_names(shell, lambda v: True)
    if command in ("start", "scale"):
        return ["-n", "--force"] if command == "start" else ["--force"]
    return []


def complete_cell(shell: Any, event: Any) -> list[str]:
    before, _ = _words(event)
    if not before:
        return list(parsing.CELL_COMMANDS)
    if before[0] not in parsing.CELL_COMMANDS:
        return complete_line(shell, event)
    if before[-1] in ("--as", "--into", "--partitions"):
        return []
    from clamor.kernel.magics.magics import _is_source

    sources = _user_names(shell, _is_source)
    return sources + _CELL_OPTIONS if len(before) == 1 else _CELL_OPTIONS


def register(ipython: Any) -> None:
    ipython.set_hook("complete_command", complete_line, str_key="%clamor")
    ipython.set_hook("complete_command", complete_cell, str_key="%%clamor")
