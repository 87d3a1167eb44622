"""``ClamorKernel``: an IPython kernel that is the cluster's driver.

Lifecycle only, like ipyparallel's engine kernel; everything else is IPython's:

- start: create the arena (``--ClamorKernel.arena_size`` / ``page_size``, or
  ``CLAMOR_ARENA_SIZE`` / ``CLAMOR_PAGE_SIZE``), load the ``%clamor`` magics and the
  views (``clamor.widgets``, which the magics load), put
  ``clamor`` and ``cluster`` in the user namespace. ``cluster`` is a lazy proxy:
  the local workers start on its first use, so an idle kernel has none.
- each cell: numpy arrays of at least a page that the cell allocates go to the
  arena (``clamor.kernel.arena_default``; ``%clamor config arena_default=false``).
- shutdown and restart: close the session's cluster. A crashed or SIGKILLed
  kernel leaves no workers either (they die with their parent: PR_SET_PDEATHSIG
  and a watchdog on the driver's pid).
- interrupt: ipykernel raises ``KeyboardInterrupt`` in the cell; the runtime
  cancels the running stage and the cluster stays usable.
"""

from __future__ import annotations

from typing import Any

from clamor.kernel import arena_default, registration, session
from clamor.kernel.lazy import LazyCluster
from clamor.runtime.errors import MissingExtraError
from clamor.runtime.paging import arena

try:
    from ipykernel.ipkernel import IPythonKernel
    from traitlets import Integer
except ImportError as exc:  # `pip install clamor-jupyter` alone: the runtime, no kernel
    raise MissingExtraError.of("the Clamor kernel", exc) from exc

import clamor

__all__ = ["ClamorKernel"]


class ClamorKernel(IPythonKernel):
    """The Clamor (Python 3) kernel: an IPython kernel plus the driver's lifecycle."""

    implementation = "clamor"
    implementation_version = clamor.__version__

    arena_size = Integer(
        None, allow_none=True, help="Bytes of address space for the arena (default 32 GiB)."
    ).tag(config=True)
    page_size = Integer(
        None, allow_none=True, help="The arena's page size, a power of two (default 256 KiB)."
    ).tag(config=True)

    @property
    def banner(self) -> str:  # type: ignore[override]
        return (
            (super().banner or "")
            + f"Clamor {clamor.__version__}: `cluster` starts local workers on first use; "
            "%clamor? for the magics.\n"
        )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        arena.configure(arena_size=self.arena_size, page_size=self.page_size)
        arena.get_arena()
        self.shell.push({"clamor": clamor, "cluster": LazyCluster()}, interactive=False)
        registration.watch(self.shell)  # so the server extension finds the user's clusters
        try:
            from clamor.kernel.magics import load_ipython_extension

            load_ipython_extension(self.shell)
        except Exception:  # the kernel stays usable without its magics
            self.log.exception("cannot load the %clamor magics")

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        """Run the cell with its large numpy allocations in the arena."""
        with arena_default.cell_allocations():
            return await super().do_execute(
                code,
                silent,
                store_history,
                user_expressions,
                allow_stdin,
                cell_meta=cell_meta,
                cell_id=cell_id,
            )

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Close the cluster (its workers exit) before the kernel goes."""
        try:
            session.close()
        except Exception:
            self.log.exception("closing the Clamor cluster failed")
        return super().do_shutdown(restart)
