"""Parsing ``%clamor`` / ``%%clamor`` lines: one argparse parser per subcommand.

A malformed line raises IPython's ``UsageError`` with the problem and the
subcommand's usage (IPython prints it without a traceback); an unknown
subcommand lists the valid ones.
"""

from __future__ import annotations

import argparse
import difflib
import shlex

from IPython.core.error import UsageError

#: ``%%clamor`` subcommands (cell magics): name -> (default --as names, summary).
CELL_COMMANDS: dict[str, tuple[str, str]] = {
    "map": ("x", "the body's value for each element x (lazy)"),
    "filter": ("x", "the elements for which the body is true (lazy)"),
    "flat_map": ("x", "the elements of the body's value for each element x (lazy)"),
    "map_partitions": ("x", "the body's value for each partition x (lazy)"),
    "reduce": ("a,b", "the body combines two values a and b (an action: runs now)"),
}

#: ``%clamor`` subcommands (line magics): name -> summary.
LINE_COMMANDS: dict[str, str] = {
    "start": "start a cluster (closes the running one)",
    "status": "workers, pids, liveness, tasks, pages fetched",
    "scale": "grow or shrink the running cluster to N workers",
    "stop": "shut the cluster down",
    "kill": "SIGKILL a worker (fault injection)",
    "slow": "make a worker FACTOR times slower (1 restores it)",
    "checkpoint": "write the arena and variables to PATH in the background",
    "restore": "bring a checkpoint's variables back into the namespace",
    "config": "show or change settings (key=value ...)",
    "lineage": "the lineage graph of a dataset (--text: one line per partition)",
    "traceback": "the full traceback of the last error a magic shortened",
    "heatmap": "live page heatmap of VAR (or of the whole arena)",
    "replication": "live bytes served by the driver vs peers, holders per page",
    "timeline": "live per-worker task bars: failures, recomputation, speculation",
    "dashboard": "all the live views together (lineage of DS if given)",
    "help": "this list",
}

WIDGET_COMMANDS = ("heatmap", "replication", "timeline", "dashboard")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of printing and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        raise UsageError((message or "").strip() or self.format_usage().rstrip())


def _parser(name: str, description: str, cell: bool = False) -> _Parser:
    prog = f"%%clamor {name}" if cell else f"%clamor {name}"
    return _Parser(prog=prog, description=description, add_help=False, exit_on_error=False)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _worker_id(text: str) -> int:
    try:
        value = int(text.removeprefix("w"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a worker id (see %clamor status)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a worker id (see %clamor status)")
    return value


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"the factor must be at least 1 (1 restores), got {text}")
    return value


def _build() -> dict[str, _Parser]:
    parsers: dict[str, _Parser] = {}
    for name, (default_as, summary) in CELL_COMMANDS.items():
        p = _parser(name, summary, cell=True)
        p.add_argument("source", metavar="SRC", help="a dataset, array or sequence in the namespace")
        p.add_argument("--as", dest="names", metavar="a,b" if name == "reduce" else "x",
                       default=default_as, help=f"the body's variable name(s) (default {default_as})")
        p.add_argument("--into", metavar="NAME", default=None,
                       help="the variable that receives the result (default: _)")
        p.add_argument("--partitions", metavar="N", type=_positive_int, default=None,
                       help="partitions of a sequence; a dataset is repartitioned")  # fmt: skip
        p.add_argument("--background", action="store_true",
                       help="run it now, off the kernel's thread: the result is a future "
                            "(collected, for a dataset) and the cell returns at once")  # fmt: skip
        parsers[name] = p

    p = _parser("start", LINE_COMMANDS["start"])
    p.add_argument("-n", "--workers", metavar="N", type=_positive_int, default=None)
    p.add_argument("-f", "--force", action="store_true", help="even if persisted datasets exist")
    parsers["start"] = p
    p = _parser("scale", LINE_COMMANDS["scale"])
    p.add_argument("workers", metavar="N", type=_positive_int)
    parsers["scale"] = p
    for name in ("status", "stop", "traceback", "help", *WIDGET_COMMANDS):
        parsers[name] = _parser(name, LINE_COMMANDS[name])
    parsers["heatmap"].add_argument("var", metavar="VAR", nargs="?")
    parsers["dashboard"].add_argument("dataset", metavar="DS", nargs="?")
    p = _parser("kill", LINE_COMMANDS["kill"])
    p.add_argument("worker", metavar="WORKER", type=_worker_id)
    parsers["kill"] = p
    p = _parser("slow", LINE_COMMANDS["slow"])
    p.add_argument("worker", metavar="WORKER", type=_worker_id)
    p.add_argument("factor", metavar="FACTOR", type=_factor, nargs="?", default=10.0)
    parsers["slow"] = p
    p = _parser("checkpoint", LINE_COMMANDS["checkpoint"])
    p.add_argument("path", metavar="PATH")
    p.add_argument("names", metavar="VAR", nargs="*")
    parsers["checkpoint"] = p
    p = _parser("restore", LINE_COMMANDS["restore"])
    p.add_argument("path", metavar="PATH")
    parsers["restore"] = p
    p = _parser("config", LINE_COMMANDS["config"])
    p.add_argument("settings", metavar="key=value", nargs="*")
    parsers["config"] = p
    p = _parser("lineage", LINE_COMMANDS["lineage"])
    p.add_argument("dataset", metavar="DS")
    p.add_argument("--text", action="store_true", help="a table, not the graph widget")
    parsers["lineage"] = p
    return parsers


PARSERS = _build()


def split(line: str) -> list[str]:
    """Shell-like words of a magic line (quotes allowed); UsageError if unbalanced."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot parse {line!r}: {exc}") from None


def unknown(word: str, valid: list[str], what: str) -> UsageError:
    close = difflib.get_close_matches(word, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return UsageError(f"unknown {what} {word!r}{hint}; valid: {', '.join(valid)}")


def parse(command: str, words: list[str]) -> argparse.Namespace | None:
    """The arguments of ``command``; ``None`` after printing its help for ``-h``/``--help``."""
    parser = PARSERS[command]
    if "-h" in words or "--help" in words:
        print(parser.format_help().rstrip())
        return None
    try:
        return parser.parse_args(words)
    except argparse.ArgumentError as exc:
        parser.error(str(exc))
        raise  # unreachable: error() raises


def usage(command: str) -> str:
    return PARSERS[command].format_usage().strip().removeprefix("usage: ")


def summary(cells: bool = True, lines: bool = True) -> str:
    """The subcommands' usage and what they do (the magic's help)."""
    width = max(len(usage(c)) for c in [*CELL_COMMANDS, *LINE_COMMANDS])
    rows = [f"  {usage(c):<{width}}  {CELL_COMMANDS[c][1]}" for c in CELL_COMMANDS if cells]
    rows += [f"  {usage(c):<{width}}  {LINE_COMMANDS[c]}" for c in LINE_COMMANDS if lines]
    return "\n".join(rows)
