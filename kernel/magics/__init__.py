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
    """Register the magics and their tab completion in ``ipython``, and the live views
    (``clamor.widgets``) with them when their packages are installed (idempotent).
    Without IPython: :class:`~clamor.runtime.errors.MissingExtraError` (the ``[jupyter]`` extra)."""
    import logging

    from clamor.runtime.errors import require_extra

    require_extra("the %clamor magics", ("IPython",))
    from clamor.kernel.magics import errors, progress
    from clamor.kernel.magics.completion import register
    from clamor.kernel.magics.magics import ClamorMagics
    from clamor.kernel.magics.views import load_views

    ipython.register_magics(ClamorMagics)
    if id(ipython) not in _loaded:
        register(ipython)
        errors.install(ipython)
        progress.watch_cells(ipython)
        _loaded.add(id(ipython))
    try:
        load_views()
    except ImportError as exc:  # the view commands say what is missing when used
        logging.getLogger("clamor.kernel").info("the live views are not available: %s", exc)

