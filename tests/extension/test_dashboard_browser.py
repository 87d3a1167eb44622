"""The extension's dashboard pages in a real browser (headless system Chromium): BokehJS
loads from the server under its base_url, the document renders, and it follows a stage
while it runs (the page's polls apply the server's patches)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clamor.testing.requirements import require_chromium
from jupyter_remote import JupyterServer, RemoteKernel, start_jupyter_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))
from kernelspec_fixture import clamor_kernelspec  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow
OTHERS_OFF = {name: False for name in ("jupyterlab", "notebook", "notebook_shim", "ipyparallel",
                                       "jupyter_lsp", "jupyter_server_terminals")}  # fmt: skip

#: 16 tasks of half a second on 2 workers: long enough to be seen running.
STAGE = """\
ds = cluster.parallelize(list(range(16)), 16)
ds.map(lambda i: (time.sleep(0.5), float(table[i * 100_000:(i + 1) * 100_000].sum()))[1]).collect()
"""

#: The dashboard's status line (a Bokeh Div with css class clamor-status), read from the
#: page's copy of the document.
STATUS_JS = """() => {
  for (const m of window.clamorDocument.all_models)
    if (m.css_classes && m.css_classes.includes("clamor-status")) return m.text;
  return null;
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def lab(clamor_kernelspec: str) -> Iterator[tuple[JupyterServer, RemoteKernel]]:  # noqa: F811
    with (
        start_jupyter_server(base_url="/jh/user/ann/", extensions=OTHERS_OFF) as server,
        RemoteKernel(server.url, server.token, clamor_kernelspec) as kernel,
    ):
        kernel.execute("%clamor start -n 2\nimport numpy as np, time\n"
                       "table = np.arange(2_000_000, dtype=np.float64)", timeout=180)  # fmt: skip
        yield server, kernel


def open_page(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("window.clamorDocument !== undefined", timeout=30_000)
    return page, errors


def test_dashboard_follows_a_running_stage(browser: Any, lab: tuple[JupyterServer, RemoteKernel]) -> None:
    server, kernel = lab
    # the token in the URL logs the browser in (a cookie) for the page's own requests
    page, errors = open_page(browser, f"{server.url}clamor/dashboard/{kernel.kernel_id}?token={server.token}")
    assert page.evaluate(STATUS_JS).startswith("2 workers")
    stage = threading.Thread(target=kernel.execute, args=(STAGE,))
    stage.start()
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        while stage.is_alive() and time.monotonic() < deadline:
            seen.add(page.evaluate(STATUS_JS))
            time.sleep(0.1)
    finally:
        stage.join(120)
    page.wait_for_function(f"({STATUS_JS})().includes('idle')", timeout=30_000)
    assert any("stage" in text and "/16 tasks" in text for text in seen), seen  # live mid-stage
    assert page.evaluate("window.clamorUpdates") >= 2
    assert page.text_content("#clamor-state").startswith("live")
    assert errors == []
    page.close()


def test_each_view_renders(browser: Any, lab: tuple[JupyterServer, RemoteKernel]) -> None:
    server, kernel = lab
    for view in ("heatmap", "replication", "timeline", "lineage"):
        page, errors = open_page(browser, f"{server.url}clamor/dashboard/{kernel.kernel_id}/{view}"
                                          f"?token={server.token}")  # fmt: skip
        # Bokeh 3 draws into canvases inside shadow roots: at least one has been drawn
        drawn = page.evaluate("""() => {
          const walk = (root) => [...root.querySelectorAll('*')].flatMap(
            (e) => [e, ...(e.shadowRoot ? walk(e.shadowRoot) : [])]);
          return walk(document).filter((e) => e.tagName === 'CANVAS' && e.width > 0).length;
        }""")
        assert drawn > 0, view
        assert errors == [], (view, errors)
        page.close()
