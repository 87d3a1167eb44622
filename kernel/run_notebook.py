"""Run a notebook headless on the Clamor kernel and print what its cells print.

    python -m clamor.kernel.run_notebook notebooks/kdtree.ipynb [--output run.ipynb]

Cells run in order with nbclient, in the notebook's directory, on the installed
kernelspec (``clamor install-kernel``); each cell's text output is printed as
soon as the cell finishes. The first failing cell stops the run with its
traceback and exit status 1. ``make demo`` uses this.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clamor.kernel.cli import DEFAULT_NAME
from clamor.runtime.errors import MissingExtraError

__all__ = ["cell_text", "main", "run"]


def cell_text(cell: Any) -> str:
    """The text a code cell showed: its streams, results and errors (plain text)."""
    parts = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain")
            if text:
                parts.append(text if text.endswith("\n") else text + "\n")
        elif kind == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts)


def run(
    path: str | Path,
    *,
    kernel_name: str = DEFAULT_NAME,
    timeout: float = 300,
    echo: Callable[[str], None] | None = None,
) -> Any:
    """Execute the notebook at ``path``; return the executed ``NotebookNode``.

    ``timeout``: seconds per cell. ``echo``: called with each code cell's header
    and text output as it finishes. Raises nbclient's ``CellExecutionError`` on
    the first cell that fails.
    """
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as exc:
        raise MissingExtraError.of("running a notebook", exc) from exc

    path = Path(path)
    nb = nbformat.read(path, as_version=4)

    def executed(cell: Any, cell_index: int, **_: Any) -> None:
        if echo is None or cell.cell_type != "code":
            return
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
        echo(f"--- [{cell_index}] {first[:90]}\n{cell_text(cell)}")

    client = NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=timeout,
        startup_timeout=120,
        resources={"metadata": {"path": str(path.parent.resolve())}},
        on_cell_executed=executed,
    )
    return client.execute()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m clamor.kernel.run_notebook NOTEBOOK``."""
    parser = argparse.ArgumentParser(
        prog="python -m clamor.kernel.run_notebook", description=__doc__.split("\n")[0]
    )
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--kernel", default=DEFAULT_NAME, help="kernelspec name (default: clamor)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per cell")
    parser.add_argument("--output", type=Path, help="also save the executed notebook here")
    args = parser.parse_args(argv)

    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    from nbclient.exceptions import CellExecutionError

    try:
        KernelSpecManager().get_kernel_spec(args.kernel)
    except NoSuchKernel:
        print(f"no kernelspec {args.kernel!r}: run `clamor install-kernel`", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        nb = run(args.notebook, kernel_name=args.kernel, timeout=args.timeout,
                 echo=lambda text: print(text, end="", flush=True))
    except CellExecutionError as exc:
        print(f"\n{args.notebook} failed:\n{exc}", file=sys.stderr)
        return 1
    if args.output is not None:
        import nbformat

        nbformat.write(nb, args.output)
    print(f"--- {args.notebook} ran on kernel {args.kernel!r} in "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
