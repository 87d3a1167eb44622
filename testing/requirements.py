"""What a test needs from the machine, and what happens when it is missing.

``make test`` installs every program the suite drives for real (``make test-deps``:
Chromium, iproute2, OpenSSH, Node.js and configurable-http-proxy; ``pip install
-e '.[test]'``: Playwright and the Python peers), so a missing one is a broken
set-up, not a reason to run less: the test fails and names the install step. A
test skips only for what no install step can fix (not root, or no permission to
make network namespaces), and says why (``pytest -rs`` prints it).

Imports pytest when called: only tests call these.
"""

from __future__ import annotations

import importlib.util
import shutil

INSTALL = "`make test` installs it (`make test-deps`, or pip install -e '.[test]')"


def _missing(what: str) -> None:
    import pytest

    pytest.fail(f"{what}: {INSTALL}", pytrace=False)


def _cannot(why: str) -> None:
    import pytest

    pytest.skip(why)


def chromium_path() -> str | None:
    """Debian's ``chromium`` (or ``chromium-browser``), if installed."""
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    return None


def require_chromium() -> str:
    """The Chromium executable for a Playwright test (fails if it or Playwright is missing)."""
    path = chromium_path()
    if path is None:
        _missing("no chromium executable")
    if importlib.util.find_spec("playwright") is None:
        _missing("no playwright module")
    return path  # type: ignore[return-value]


def require_program(name: str) -> str:
    """The path of program ``name`` on PATH (fails if missing)."""
    path = shutil.which(name)
    if path is None:
        _missing(f"{name!r} is not on PATH")
    return path  # type: ignore[return-value]
