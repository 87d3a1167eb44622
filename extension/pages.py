"""The dashboard pages: the widgets' Bokeh views as standalone documents, kept live.

A page request builds the view (:mod:`clamor.widgets`) in its own Bokeh
``Document``, draws a snapshot into it and embeds it (``bokeh.embed.json_item``)
in an HTML page that loads BokehJS from this server (no CDN: there may be no
internet). The server keeps the document as a :class:`LiveDocument`; the page
polls ``clamor/api/live/{session}`` about twice a second, and each poll draws
the newest snapshot into the server's document and answers with the resulting
Bokeh ``PATCH-DOC`` events (only the columns and properties that changed), which
the page applies to its copy: the same mechanism as a Bokeh server, over
polling. Zoom, pan and the heatmap's toggle stay as the user set them.
"""

from __future__ import annotations

import html
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import bokeh
from clamor.runtime.observe.snapshots import ClusterSnapshot

#: Page name -> what it shows (the index's links, in this order).
VIEWS = {
    "dashboard": "Dashboard",
    "heatmap": "Page heatmap",
    "replication": "Replication",
    "timeline": "Task timeline",
    "lineage": "Lineage",
}
#: Milliseconds between the page's polls.
POLL_MS = 500


def make_view(name: str, snapshot: ClusterSnapshot, var: str | None = None) -> Any:
    """A fresh widgets view ``name`` (see :data:`VIEWS`); ``var``: the heatmap's variable.
    ``KeyError`` for an unknown view or variable."""
    from clamor.widgets.dashboard_view import Dashboard
    from clamor.widgets.heatmap_view import PageHeatmap
    from clamor.widgets.lineage_view import LineageView
    from clamor.widgets.replication_view import ReplicationView
    from clamor.widgets.timeline_view import TimelineView

    if var is not None and var not in snapshot.pages.variables:
        known = ", ".join(sorted(snapshot.pages.variables)) or "none"
        raise KeyError(f"no arena variable {var!r} (known: {known})")
    span = None if var is None else snapshot.pages.variables[var]
    factories: dict[str, Callable[[], Any]] = {
        "dashboard": lambda: Dashboard(variable=var, span=span),
        "heatmap": lambda: PageHeatmap(variable=var, span=span, width=900, height=420),
        "replication": lambda: ReplicationView(width=900, height=300),
        "timeline": lambda: TimelineView(width=1000, height=360),
        "lineage": lambda: LineageView(width=1000, height=480),
    }
    if name not in factories:
        raise KeyError(f"no view {name!r} (views: {', '.join(VIEWS)})")
    return factories[name]()


class LiveDocument:
    """A view in its own Bokeh document, and the changes not yet sent to the page."""

    def __init__(self, kernel_id: str, name: str, view: Any, snapshot: ClusterSnapshot) -> None:
        from bokeh.document import Document

        self.kernel_id, self.name, self.view = kernel_id, name, view
        self.id = secrets.token_urlsafe(16)
        self.lock = threading.Lock()
        self.used = time.monotonic()
        self.seq = snapshot.seq
        self.title = f"Clamor {VIEWS.get(name, name)} · kernel {kernel_id[:8]}"
        self.document = Document(title=self.title)
        self.view.update(snapshot)
        self.document.add_root(view.root)
        self._events: list[Any] = []
        self.document.on_change(self._collect)

    def _collect(self, event: Any) -> None:
        self._events.append(event)

    def item(self) -> dict[str, Any]:
        """The document as ``bokeh.embed.json_item`` data (buffers inline: plain JSON)."""
        from bokeh.embed import json_item

        with self.lock:
            item = json_item(self.view.root)
            self.document.title = self.title  # json_item blanks it
            self._events.clear()  # the page gets all of it now
            return json.loads(json.dumps(item))

    def patch(self, snapshot: ClusterSnapshot) -> dict[str, Any] | None:
        """Draw ``snapshot`` and return the changes as a ``PATCH-DOC`` body (None: nothing)."""
        from bokeh.core.serialization import Serializer

        with self.lock:
            self.used = time.monotonic()
            if snapshot.seq == self.seq and not self._events:
                return None
            self.seq = snapshot.seq
            self.document.hold("combine")
            try:
                self.view.update(snapshot)
            finally:
                self.document.unhold()
            events, self._events[:] = list(self._events), []
            if not events:
                return None
            models = self.document.models
            serializer = Serializer(references=models.synced_references, deferred=False)
            patch = {"events": serializer.encode(events)}
            models.flush_synced(lambda model: not serializer.has_ref(model))
            return patch


class LiveDocuments:
    """The open pages' documents by session id; the least recently polled go first when
    there are more than ``limit``, and any not polled for ``idle`` seconds."""

    def __init__(self, limit: int = 32, idle: float = 300.0) -> None:
        self.limit, self.idle = limit, idle
        self._docs: OrderedDict[str, LiveDocument] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, doc: LiveDocument) -> None:
        with self._lock:
            self._docs[doc.id] = doc
            self._expire()

    def get(self, session: str) -> LiveDocument | None:
        with self._lock:
            doc = self._docs.get(session)
            if doc is not None:
                self._docs.move_to_end(session)
            self._expire()
            return doc

    def drop(self, kernel_ids: set[str] | None = None) -> None:
        """Forget the documents of clusters not in ``kernel_ids`` (all when None)."""
        with self._lock:
            for key, doc in list(self._docs.items()):
                if kernel_ids is None or doc.kernel_id not in kernel_ids:
                    del self._docs[key]

    def __len__(self) -> int:
        return len(self._docs)

    def _expire(self) -> None:
        now = time.monotonic()
        for key, doc in list(self._docs.items()):
            if len(self._docs) > self.limit or now - doc.used > self.idle:
                del self._docs[key]


def bokeh_script_urls(root: Any, static_url: str) -> tuple[list[str], list[str]]:
    """The BokehJS files ``root`` needs, under ``static_url`` (this server's copy of
    bokeh's static folder), and the inline scripts that go with them."""
    from bokeh.embed.bundle import bundle_for_objs_and_resources
    from bokeh.resources import Resources

    bundle = bundle_for_objs_and_resources([root], Resources(mode="server", root_url=static_url))
    files = [getattr(u, "url", str(u)).replace(static_url + "static/", static_url, 1)
             + f"?v={bokeh.__version__}" for u in bundle.js_files]  # fmt: skip
    return files, list(bundle.js_raw)


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` breaks out)."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 12px 18px; color: #222; }
nav { font-size: 14px; margin-bottom: 10px; }
nav a { margin-right: 10px; }
nav a.current { font-weight: bold; text-decoration: none; color: #222; }
#clamor-state { font-size: 12px; color: #666; margin-left: 12px; }
#clamor-state.error { color: #D55E00; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; }
code { font-size: 12px; }
"""

_LIVE_JS = """
(function () {
  const cfg = JSON.parse(document.getElementById("clamor-config").textContent);
  const item = JSON.parse(document.getElementById("clamor-doc").textContent);
  const state = document.getElementById("clamor-state");
  function show(text, error) { state.textContent = text; state.className = error ? "error" : ""; }
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  Bokeh.embed.embed_item(item, "clamor-view").then(async function () {
    const doc = Bokeh.documents[Bokeh.documents.length - 1];
    window.clamorDocument = doc;
    window.clamorUpdates = 0;
    let delay = cfg.poll_ms;
    for (;;) {
      await sleep(delay);
      let reply;
      try {
        reply = await fetch(cfg.live_url, {credentials: "same-origin", cache: "no-store"});
      } catch (err) { show("server unreachable; retrying", true); delay = 2000; continue; }
      if (reply.status === 410) { show("page expired; reloading", true); location.reload(); return; }
      if (reply.status === 404) { show("the cluster is gone (kernel shut down or cluster closed)", true); return; }
      if (reply.status === 403) { show("not authorized (logged out?)", true); return; }
      let body = {};
      try { body = await reply.json(); } catch (err) { body = {}; }
      if (!reply.ok) { show(body.message || ("HTTP " + reply.status), true); delay = 2000; continue; }
      delay = cfg.poll_ms;
      if (body.patch) { doc.apply_json_patch(body.patch); window.clamorUpdates += 1; }
      show("live · snapshot " + body.seq + " · " + new Date(body.time * 1000).toLocaleTimeString());
    }
  });
})();
"""


def page_html(*, title: str, nav: str, item: dict[str, Any], scripts: list[str], raw: list[str],
              live_url: str, css: str) -> str:  # fmt: skip
    """A standalone page embedding ``item`` (a json_item) and polling ``live_url``."""
    tags = "\n".join(f'<script src="{html.escape(url)}"></script>' for url in scripts)
    inline = "\n".join(f"<script>{code}</script>" for code in raw)
    config = {"live_url": live_url, "poll_ms": POLL_MS}
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)}</title>
{tags}
{inline}
<style>{_STYLE}</style>
</head><body>
<nav>{nav}<span id="clamor-state">loading…</span></nav>
<div id="clamor-view" class="clamor-view clamor-{html.escape(css)}"></div>
<script type="application/json" id="clamor-config">{_script_json(config)}</script>
<script type="application/json" id="clamor-doc">{_script_json(item)}</script>
<script>{_LIVE_JS}</script>
</body></html>
"""


def nav_html(base: str, kernel_id: str, current: str, var: str | None = None) -> str:
    """Links to the index and to each view of this cluster."""
    query = "" if var is None else f"?var={html.escape(var, quote=True)}"
    links = [f'<a href="{base}clamor/">Clamor clusters</a>']
    for name, label in VIEWS.items():
        path = f"{base}clamor/dashboard/{kernel_id}" + ("" if name == "dashboard" else f"/{name}")
        cls = ' class="current"' if name == current else ""
        links.append(f'<a href="{html.escape(path)}{query}"{cls}>{label}</a>')
    return " ".join(links) + f" · kernel <code>{html.escape(kernel_id)}</code>"


def index_html(base: str, rows: list[dict[str, Any]]) -> str:
    """The list of this server's clusters, each with links to its views and API."""
    if rows:
        body = [("<table><tr><th>kernel</th><th>name</th><th>state</th><th>workers</th>"
                "<th>scheduler</th><th>started</th><th>views</th><th>API</th></tr>")]  # fmt: skip
        for r in rows:
            kid = html.escape(r["kernel_id"])
            views = " ".join(
                f'<a href="{base}clamor/dashboard/{kid}{"" if n == "dashboard" else "/" + n}">{n}</a>'
                for n in VIEWS
            )
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created"]))
            body.append(
                f"<tr><td><code>{kid}</code></td><td>{html.escape(str(r.get('kernel_name') or ''))}</td>"
                f"<td>{html.escape(str(r.get('execution_state') or ''))}</td><td>{r['workers']}</td>"
                f"<td><code>{html.escape(r['address'])}</code></td><td>{started}</td><td>{views}</td>"
                f'<td><a href="{base}clamor/api/clusters/{kid}">summary</a></td></tr>'
            )
        body.append("</table>")
        content = "\n".join(body)
    else:
        content = ("<p>No running kernel of this server has a Clamor cluster. Start one in a "
                   "notebook on the Clamor kernel (<code>%clamor start -n 2</code>, or use "
                   "<code>cluster</code>).</p>")  # fmt: skip
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Clamor clusters</title>
<style>{_STYLE}</style></head><body>
<h2>Clamor clusters</h2>
{content}
<p><a href="{base}clamor/api/clusters">clamor/api/clusters</a> (JSON)</p>
</body></html>
"""
