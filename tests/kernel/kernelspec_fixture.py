"""The "clamor" kernelspec for the kernel and notebook tests.

``make test`` installs it first (``clamor install-kernel --sys-prefix``). When it is
missing, or runs another interpreter, the tests install it into a temporary prefix
and put that prefix first on ``JUPYTER_PATH`` for the session (jupyter_client reads
the variable at each lookup, and kernels inherit it), so they never depend on, nor
change, the machine's Jupyter set-up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from clamor.kernel import cli


@pytest.fixture(scope="session")
def clamor_kernelspec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The name of a kernelspec that starts the Clamor kernel with this interpreter."""
    if cli.is_installed(cli.DEFAULT_NAME):
        yield cli.DEFAULT_NAME
        return
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    with pytest.MonkeyPatch.context() as mp:
        paths = [str(prefix / "share" / "jupyter"), os.environ.get("JUPYTER_PATH", "")]
        mp.setenv("JUPYTER_PATH", os.pathsep.join(p for p in paths if p))
        cli.install(cli.DEFAULT_NAME, prefix=str(prefix))
        assert cli.is_installed(cli.DEFAULT_NAME)
        yield cli.DEFAULT_NAME
