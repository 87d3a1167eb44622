"""jupyter-server extension: REST API and dashboard pages for Clamor clusters.

Enabled by default (``jupyter_server_config.d/clamor.json``); routes under the
server's ``base_url``: ``clamor/`` (index), ``clamor/dashboard/{kernel_id}[/VIEW]``
and ``clamor/api/clusters[/...]``. See :mod:`clamor.extension.app`.
"""

from __future__ import annotations

from typing import Any

from clamor.runtime.errors import require_extra

# Enabled by a config file that even `pip install clamor-jupyter` (no extras) installs:
# a jupyter-server there logs this instead of a bare ModuleNotFoundError.
require_extra("the jupyter-server extension (clamor.extension)", ("jupyter_server", "bokeh"))


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """How jupyter-server finds the extension app (``jupyter server extension list``)."""
    from clamor.extension.app import ClamorExtension

    return [{"module": "clamor.extension", "app": ClamorExtension}]
