"""The live dashboard in a real browser: JupyterLab 4 and Notebook 7, headless Chromium.

The test starts JupyterLab on 127.0.0.1 (see ``browser.jupyterlab``), opens the demo
notebook in Chromium, runs all its cells and, while they run, samples the page heatmap's
pixels in the page. It asserts that the dashboard and the four views rendered non-blank
Bokeh canvases, that the heatmap changed while the stage ran, and that no cell failed;
screenshots go to ``$CLAMOR_ARTIFACTS/browser`` (default ``tests/artifacts/browser``).

Until ``notebooks/kdtree.ipynb`` has its ``%clamor dashboard`` cell, a stand-in notebook
(a Bokeh layout with the views' CSS classes, fed from a thread) runs on "python3".
Without Chromium or Playwright the tests fail: ``make test`` installs both.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser import (
    DASHBOARD,
    REPO,
    VIEW_CLASSES,
    Lab,
    artifacts_dir,
    cell_errors,
    chromium,
    jupyterlab,
    new_page,
    open_notebook,
    run_all,
    server_log,
    start_sampling,
    stop_sampling,
    views,
    wait_until_run,
)
from clamor.testing.requirements import require_chromium

pytestmark = pytest.mark.slow

DEMO = REPO / "notebooks" / "kdtree.ipynb"


@dataclass(frozen=True)
class Case:
    """A notebook to run in the browser, the kernelspec it runs on, and folders it reads."""

    notebook: Path
    kernel: str
    data: tuple[Path, ...] = ()


def demo_has_dashboard() -> bool:
    """Whether the demo notebook shows the dashboard (then the test runs it, not the stand-in)."""
    return "%clamor dashboard" in DEMO.read_text()


STANDIN_BUILD = """\
import threading, time
import numpy as np
from bokeh.io import output_notebook
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource
from bokeh.plotting import figure
from bokeh.resources import INLINE
from jupyter_bokeh import BokehModel

output_notebook(INLINE, hide_banner=True)  # BokehJS for jupyter_bokeh, without a CDN
n = 16
xs, ys = np.meshgrid(np.arange(n), np.arange(n))
heat = ColumnDataSource(dict(x=xs.ravel(), y=ys.ravel(), c=["#dddddd"] * n * n))
figures = {}
for name in ["heatmap", "replication", "timeline", "lineage"]:
    figures[name] = figure(width=500, height=260, title=name, css_classes=[f"clamor-{name}"])
figures["heatmap"].rect("x", "y", 1, 1, fill_color="c", line_color=None, source=heat)
figures["replication"].line([0, 1, 2, 3], [0, 2, 1, 3])
figures["timeline"].hbar(y=[0, 1], left=[0, 1], right=[2, 3], height=0.5)
figures["lineage"].scatter([0, 1, 2], [0, 1, 0], size=12)
f = figures
dashboard = BokehModel(column(row(f["heatmap"], f["replication"]), row(f["timeline"], f["lineage"])))
dashboard.add_class("clamor-dashboard")
dashboard"""

STANDIN_STAGE = """\
def feed(stop):  # a publisher thread, like the runtime's, while the cell blocks
    rng = np.random.default_rng(0)
    while not stop.is_set():
        heat.data = dict(heat.data, c=[f"#{v:02x}40{255 - v:02x}" for v in rng.integers(0, 255, n * n)])
        time.sleep(0.2)
stop = threading.Event()
feeder = threading.Thread(target=feed, args=(stop,), daemon=True)
feeder.start()
time.sleep(4)
stop.set()
feeder.join()
print("stage done")"""


def write_standin(path: Path) -> Path:
    """A notebook shaped like the demo's dashboard part, for the python3 kernel."""
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(STANDIN_BUILD), nbformat.v4.new_code_cell(STANDIN_STAGE)]
    )
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    """The demo notebook once it has its dashboard cell, the stand-in until then (or with
    ``CLAMOR_BROWSER_STANDIN=1``, to check this harness apart from the widgets)."""
    if demo_has_dashboard() and not os.environ.get("CLAMOR_BROWSER_STANDIN"):
        return Case(DEMO, "clamor", (REPO / "notebooks" / "data",))
    return Case(write_standin(tmp_path_factory.mktemp("standin") / "standin.ipynb"), "python3")


@pytest.fixture(scope="module")
def kernel_env(case: Case, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for the server: a temporary Clamor kernelspec when none is installed."""
    if case.kernel != "clamor":
        return {}
    from clamor.kernel import cli

    if cli.is_installed(cli.DEFAULT_NAME):
        return {}
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    cli.install(cli.DEFAULT_NAME, prefix=str(prefix))
    paths = [str(prefix / "share" / "jupyter"), os.environ.get("JUPYTER_PATH", "")]
    return {"JUPYTER_PATH": os.pathsep.join(p for p in paths if p)}


@pytest.fixture(scope="module")
def lab(
    case: Case, kernel_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lab]:
    """JupyterLab on a folder holding a copy of the notebook, without its stored outputs."""
    require_chromium()
    root = tmp_path_factory.mktemp("lab-root")
    nb = nbformat.read(case.notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, root / case.notebook.name)
    for folder in case.data:
        shutil.copytree(folder, root / folder.name)
    with jupyterlab(root, kernel=case.kernel, env=kernel_env) as server:
        try:
            yield server
        finally:  # the kernels' and workers' stderr: what a failed run needs looked at
            shutil.copyfile(server.log, artifacts_dir() / "server.log")


@pytest.fixture(scope="module")
def browser(lab: Lab) -> Iterator[Any]:
    """One headless Chromium for the module's tests."""
    with chromium() as instance:
        yield instance


@pytest.fixture
def page(browser: Any, lab: Lab) -> Iterator[Any]:
    """A fresh page; afterwards the page closes and the kernels it started shut down."""
    page = new_page(browser)
    yield page
    page.close()
    lab.shutdown_kernels()


def run_notebook(page: Any, lab: Lab, case: Case, ui: str) -> list[dict[str, Any]]:
    """Open the notebook in ``ui``, run all cells, wait; the heatmap samples taken meanwhile."""
    name = case.notebook.name
    try:
        open_notebook(page, lab, name, ui=ui)
        start_sampling(page, ".clamor-heatmap")
        run_all(page)
        wait_until_run(page, timeout=120)
    except Exception:
        page.screenshot(path=artifacts_dir() / f"{ui}-failed.png")
        print(server_log(lab), *page.errors, sep="\n")
        raise
    return stop_sampling(page)


def check_views(page: Any, prefix: str) -> dict[str, dict[str, Any]]:
    """Each view, with a painted canvas and data drawn; one element screenshot each."""
    found = {}
    for cls in VIEW_CLASSES:
        matches = [view for view in views(page, f".{cls}") if view["canvases"]]
        assert matches, f"no element of class {cls} with a canvas"
        view = matches[0]
        assert view["width"] > 50 and view["height"] > 50, (cls, view)
        assert view["colours"] > 2 and view["painted"] > 500, f"{cls} canvas is blank: {view}"
        assert view["rows"], f"{cls} draws no data: {view}"
        name = cls.removeprefix("clamor-")
        page.locator(f".{cls}").first.screenshot(path=artifacts_dir() / f"{prefix}{name}.png")
        found[cls] = view
    return found


def run_and_check(page: Any, lab: Lab, case: Case, ui: str, prefix: str) -> list[dict]:
    """Run the notebook in ``ui``; no cell failed, one dashboard, every view drew data.
    Returns the heatmap samples taken while cells ran."""
    samples = run_notebook(page, lab, case, ui)
    out = artifacts_dir()
    page.screenshot(path=out / f"{prefix or 'jupyterlab-'}end.png", full_page=True)
    errors = cell_errors(page)
    assert not errors, "\n\n".join(errors + page.errors)
    dashboard = page.locator(f".{DASHBOARD}")
    assert dashboard.count() == 1
    dashboard.scroll_into_view_if_needed()
    page.screenshot(path=out / f"{prefix.rstrip('-') or 'jupyterlab'}.png", full_page=True)
    dashboard.screenshot(path=out / f"{prefix}dashboard.png")
    check_views(page, prefix)
    return samples


@pytest.mark.timeout(180)
def test_dashboard_is_live_in_jupyterlab(page: Any, lab: Lab, case: Case) -> None:
    samples = run_and_check(page, lab, case, "lab", "")
    # The heatmap changed while one cell (the stage) ran: distinct pictures of a painted
    # canvas of one size (a first paint, or a resize alone, does not count).
    painted = [s for s in samples if s["cell"] >= 0 and s["hash"] is not None and s["colours"] > 2]
    assert painted, f"the heatmap was never painted while cells ran ({len(samples)} samples)"
    size = painted[-1]["size"]
    pictures: dict[int, set[int]] = {}
    for s in painted:
        if s["size"] == size:
            pictures.setdefault(s["cell"], set()).add(s["hash"])
    changes = {cell: len(hashes) for cell, hashes in pictures.items()}
    assert max(changes.values()) >= 2, f"the heatmap did not change while a cell ran: {changes}"
    # Saved with its dashboard, the notebook stays small: BokehJS is loaded from the
    # server extension, not inlined in the outputs (it was 2 x 4 MB).
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    saved = lab.root / case.notebook.name
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and b"clamor/static/bokeh/js/" not in saved.read_bytes():
        time.sleep(0.5)
    text = saved.read_bytes()
    assert b"clamor/static/bokeh/js/" in text, "the notebook was not saved with its outputs"
    assert len(text) < 1 << 20, f"the saved notebook holds {len(text):,} bytes"


@pytest.mark.timeout(180)
def test_dashboard_renders_in_notebook7(page: Any, lab: Lab, case: Case) -> None:
    run_and_check(page, lab, case, "notebook", "notebook7-")
