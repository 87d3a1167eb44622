"""A real browser on a real Jupyter server, for the end-to-end widget tests.

``jupyterlab(root)`` starts JupyterLab 4 (which also serves Notebook 7) on
127.0.0.1 with a random token and private runtime, config, settings and
workspaces folders, so nothing leaks in from, or out to, the machine's Jupyter
set-up; on exit it shuts the server and every process it started (kernels and
their workers included) down. ``chromium()`` drives the system's headless
Chromium through Playwright (no browser download). The remaining helpers open
a notebook, run it, wait for it, and read Bokeh canvases: Bokeh 3 renders into
open shadow roots, so the JavaScript here walks them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from clamor.testing.requirements import require_chromium

REPO = Path(__file__).resolve().parents[2]
VIEWPORT = {"width": 1400, "height": 1000}
#: The Bokeh figures' css_classes; the dashboard widget's class is DASHBOARD.
VIEW_CLASSES = ("clamor-heatmap", "clamor-replication", "clamor-timeline", "clamor-lineage")
DASHBOARD = "clamor-dashboard"

#: JupyterLab settings for a test: render every cell (no virtual scrolling, so all
#: prompts are in the DOM) and no news or update checks (no network, no pop-ups).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def artifacts_dir() -> Path:
    """Where screenshots go: ``$CLAMOR_ARTIFACTS/browser`` (default tests/artifacts/browser)."""
    base = Path(os.environ.get("CLAMOR_ARTIFACTS", REPO / "tests" / "artifacts"))
    out = base / "browser"
    out.mkdir(parents=True, exist_ok=True)
    return out


@dataclass
class Lab:
    """A running Jupyter server: its base URL (ends in "/"), token and root folder."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, method: str, path: str, timeout: float = 5.0) -> Any:
        """Call the server's REST API (``path`` relative to ``/api/``); JSON or None."""
        request = urllib.request.Request(
            f"{self.url}api/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
            data=b"" if method in ("POST", "PUT", "PATCH") else None,
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def page_url(self, path: str) -> str:
        """``path`` (e.g. ``lab/tree/x.ipynb``) under the base URL, with the token."""
        return f"{self.url}{path}?token={self.token}"

    def kernels(self) -> list[dict[str, Any]]:
        """The server's running kernels, as ``/api/kernels`` reports them."""
        return self.api("GET", "kernels")

    def shutdown_kernels(self, timeout: float = 20.0) -> None:
        """Shut every kernel down (so the next test starts a fresh one, and only one)."""
        for session in self.api("GET", "sessions"):
            self.api("DELETE", f"sessions/{session['id']}", timeout=timeout)
        for kernel in self.kernels():
            self.api("DELETE", f"kernels/{kernel['id']}", timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyterlab(
    root_dir: Path, *, kernel: str = "clamor", env: dict[str, str] | None = None, timeout: float = 60.0,
    base_url: str = "/",
) -> Iterator[Lab]:
    """Start JupyterLab on ``root_dir`` (default kernel ``kernel``) under ``base_url`` (as
    behind JupyterHub's proxy: ``/user/NAME/``); stop it and its kernels after."""
    base_url = "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"
    state = Path(tempfile.mkdtemp(prefix="clamor-lab-"))
    settings, workspaces = state / "settings", state / "workspaces"
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    workspaces.mkdir()
    port, token = _free_port(), secrets.token_hex(16)
    args = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
        f"--ServerApp.base_url={base_url}",
        f"--MappingKernelManager.default_kernel_name={kernel}",
        "--LabApp.expose_app_in_browser=True", "--JupyterNotebookApp.expose_app_in_browser=True",
        f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={workspaces}",
        f"--JupyterNotebookApp.user_settings_dir={settings}",
        f"--JupyterNotebookApp.workspaces_dir={workspaces}",
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    if os.getuid() == 0:
        args.append("--allow-root")
    environ = {**os.environ, **(env or {})}
    environ.update(
        JUPYTER_RUNTIME_DIR=str(state / "runtime"),
        JUPYTER_CONFIG_DIR=str(state / "config"),
    )
    log = state / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True
        )
    lab = Lab(f"http://127.0.0.1:{port}{base_url}", token, Path(root_dir), process, log)
    try:
        _wait_until_up(lab, timeout)
        yield lab
    finally:
        _stop(lab)
        shutil.rmtree(state, ignore_errors=True)


def _wait_until_up(lab: Lab, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({lab.process.returncode}):\n{server_log(lab)}")
        try:
            lab.api("GET", "status", timeout=2)
            return
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise TimeoutError(f"JupyterLab did not answer within {timeout:.0f} s:\n{server_log(lab)}")


def server_log(lab: Lab, tail: int = 4000) -> str:
    """The end of the server's log (for failure messages)."""
    try:
        return lab.log.read_text(errors="replace")[-tail:]
    except OSError:
        return ""


def _stop(lab: Lab) -> None:
    """Shut the server down via its API, then make sure it and all it started are gone.

    Kernels run in sessions of their own (jupyter_client), so killing the server's
    process group would miss them: their process ids are taken from the tree first.
    """
    try:
        started = psutil.Process(lab.process.pid).children(recursive=True)
    except psutil.Error:
        started = []
    try:
        lab.api("POST", "shutdown", timeout=5)
        lab.process.wait(timeout=15)
    except (OSError, urllib.error.URLError, subprocess.TimeoutExpired):
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if lab.process.poll() is None:
            try:
                os.killpg(lab.process.pid, sig)
                lab.process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
    alive = [p for p in started if p.is_running() and p.pid != os.getpid()]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless system Chromium under Playwright (``executable_path``: nothing downloaded)."""
    from playwright.sync_api import sync_playwright

    path = require_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Any) -> Any:
    """A page with the fixed viewport; console errors and page errors are kept on ``page.errors``."""
    page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: m.type == "error" and page.errors.append(f"console: {m.text}"))
    return page


def open_notebook(page: Any, lab: Lab, name: str, ui: str = "lab", timeout: float = 120.0) -> None:
    """Open ``name`` in JupyterLab (``ui="lab"``) or Notebook 7 (``"notebook"``); wait for its kernel
    (a kernel start on a busy 2-core machine has taken more than 45 s)."""
    path = f"lab/tree/{name}" if ui == "lab" else f"notebooks/{name}"
    page.goto(lab.page_url(path), timeout=timeout * 1000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout * 1000)
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
        timeout=timeout * 1000,
    )


def run_all(page: Any) -> None:
    """Start Run > Run All Cells (the promise is not awaited: it settles when all cells ran)."""
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


#: JavaScript: every element matching a selector, looking inside open shadow roots too
#: (Bokeh 3 renders each view, and its canvases, into a shadow root).
_DEEP = """
const deepAll = (root, selector, found = []) => {
  for (const el of root.querySelectorAll('*')) {
    if (el.matches(selector)) found.push(el);
    if (el.shadowRoot) deepAll(el.shadowRoot, selector, found);
  }
  return found;
};
const below = (host, selector) => {
  const found = deepAll(host, selector);
  if (host.shadowRoot) deepAll(host.shadowRoot, selector, found);
  return found;
};
const pixels = (canvas) => {
  const w = canvas.width, h = canvas.height;
  if (!w || !h) return null;
  let ctx = canvas.getContext('2d');
  if (!ctx) {  // a WebGL canvas: copy it onto a 2d one
    const copy = document.createElement('canvas');
    copy.width = w; copy.height = h;
    ctx = copy.getContext('2d');
    ctx.drawImage(canvas, 0, 0);
  }
  return new Uint32Array(ctx.getImageData(0, 0, w, h).data.buffer);
};
const canvasInfo = (canvas) => {
  const px = pixels(canvas);
  const info = {width: canvas.width, height: canvas.height, colours: 0, painted: 0, hash: 0};
  if (!px) return info;
  const colours = new Set();
  let hash = 0x811c9dc5;
  for (let i = 0; i < px.length; i++) {
    const v = px[i];
    if (v !== px[0]) info.painted++;
    if (colours.size < 4096) colours.add(v);
    hash = Math.imul(hash ^ v, 0x01000193) >>> 0;
  }
  info.colours = colours.size;
  info.hash = hash;
  return info;
};
// rows of data in the visible glyph renderers drawn inside host (from BokehJS's own views)
const dataRows = (host) => {
  const index = window.Bokeh && window.Bokeh.index;
  if (!index || !index.all_views) return null;
  let rows = 0;
  for (const view of index.all_views()) {
    const source = view.model && view.model.visible !== false && view.model.data_source;
    if (!source) continue;
    let up = view;
    while (up && up.el !== host) up = up.parent;
    if (up) rows += source.get_length() || 0;
  }
  return rows;
};
const viewInfo = (selector) => deepAll(document, selector).map((host) => {
  const rect = host.getBoundingClientRect();
  const canvases = below(host, 'canvas').map(canvasInfo);
  let hash = 0x811c9dc5;
  for (const c of canvases) hash = Math.imul(hash ^ c.hash, 0x01000193) >>> 0;
  return {width: rect.width, height: rect.height, canvases, hash, rows: dataRows(host),
          colours: Math.max(0, ...canvases.map((c) => c.colours)),
          painted: canvases.reduce((n, c) => n + c.painted, 0)};
});
// the index of the code cell executing (the first one marked [*]; the rest are queued), or -1
const running = () => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt'))
  .findIndex((p) => p.textContent.includes('*'));
"""


def views(page: Any, selector: str) -> list[dict[str, Any]]:
    """For each element matching ``selector`` (shadow roots included): its size, the rows of
    data its visible glyphs draw (None without BokehJS), and over its canvases (each listed):
    the most distinct colours (1 = blank), the pixels unlike each one's first, a pixel hash."""
    return page.evaluate(f"(selector) => {{ {_DEEP} return viewInfo(selector); }}", selector)


def start_sampling(page: Any, selector: str, every_ms: int = 100) -> None:
    """Record, in the page, ``selector``'s pixel hash and which cell runs, every ``every_ms``:
    in-page sampling does not miss a short stage between two round trips."""
    page.evaluate(
        f"""([selector, every]) => {{ {_DEEP}
        window.__clamorSamples = [];
        window.__clamorSampler = setInterval(() => {{
          const [view] = viewInfo(selector);
          window.__clamorSamples.push({{t: performance.now(), cell: running(),
            hash: view ? view.hash : null, colours: view ? view.colours : 0,
            size: view ? view.canvases.map((c) => `${{c.width}}x${{c.height}}`).join(',') : ''}});
        }}, every);
        }}""",
        [selector, every_ms],
    )


def stop_sampling(page: Any) -> list[dict[str, Any]]:
    """Stop the sampler; its samples: ``t`` (ms), ``cell`` (index of the code cell running,
    -1 for none), and the first match's ``hash`` (None before it exists), ``colours`` and
    canvas ``size``."""
    return page.evaluate(
        "() => { clearInterval(window.__clamorSampler); return window.__clamorSamples; }"
    )


def wait_until_run(page: Any, timeout: float = 120.0) -> None:
    """Wait until the kernel is idle with every code cell run (``[n]:``), or, after a cell
    failed (Run All then drops the cells queued after it), with none left running."""
    page.wait_for_function(
        """() => {
          const panel = window.jupyterapp.shell.currentWidget;
          if (panel.sessionContext.session.kernel.status !== 'idle') return false;
          const prompts = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt'))
            .map((p) => p.textContent.trim());
          if (prompts.length === 0 || prompts.some((p) => p.includes('*'))) return false;
          if (prompts.every((p) => /^\\[\\d+\\]:?$/.test(p))) return true;
          return Array.from(panel.content.model.cells).some((cell) => cell.type === 'code'
            && cell.outputs.toJSON().some((out) => out.output_type === 'error'));
        }""",
        timeout=timeout * 1000,
        polling=250,
    )


def cell_errors(page: Any) -> list[str]:
    """Error outputs of the open notebook (from its model) and tracebacks or widget errors shown."""
    return page.evaluate(
        """() => {
          const found = [];
          const notebook = window.jupyterapp.shell.currentWidget.content;
          for (const cell of notebook.model.cells) {
            if (cell.type !== 'code') continue;
            for (const out of cell.outputs.toJSON()) {
              if (out.output_type === 'error') found.push(`${out.ename}: ${out.evalue}`);
            }
          }
          const stderr = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';
          for (const el of document.querySelectorAll(stderr)) {
            if (el.textContent.includes('Traceback')) found.push(el.textContent.slice(0, 2000));
          }
          return found;
        }"""
    ) + widget_errors(page)


def widget_errors(page: Any) -> list[str]:
    """The message of each widget that failed to render (shown once its error box is clicked)."""
    found = []
    boxes = page.locator(".jupyter-widgets-error-widget")
    for i in range(boxes.count()):
        box = boxes.nth(i)
        parent = box.locator("xpath=..")
        box.click()
        found.append("widget error: " + parent.inner_text().strip()[:2000])
    return found
