"""The %clamor / %%clamor magics: they parse and delegate, they do not schedule.

``%load_ext clamor`` (or the Clamor kernel) calls :func:`load_ipython_extension`.
Modules: ``magics`` (the Magics class, the cell operations), ``commands`` (line
subcommands), ``parsing``, ``cells`` (compiling cell bodies; imported by workers,
so this package's ``__init__`` stays free of IPython imports), ``errors`` (short
tracebacks), ``progress`` (the progress bar, also for the kernel), ``completion``.
"""

from __future__ import annotations

from typing import Any

_loaded: set[int] = set()


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and their tab completion in ``ipython`` (idempotent)."""
    from clamor.kernel.magics.completion import register
    from clamor.kernel.magics.magics import ClamorMagics

    ipython.register_magics(ClamorMagics)
    if id(ipython) not in _loaded:
        register(ipython)
        _loaded.add(id(ipython))

