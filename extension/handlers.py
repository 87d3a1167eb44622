"""Tornado handlers of the extension: the REST API, the pages and BokehJS.

Every handler is a ``JupyterHandler`` behind ``@tornado.web.authenticated`` and
``@authorized`` (resource ``kernels``: these routes show the state of the server's
kernels), so the server's identity provider and authorizer decide, as for its own
routes; under JupyterHub another user's token gets 403. API handlers answer JSON,
errors included (404: no such cluster, 503: the cluster does not answer); pages
redirect an anonymous browser to the login page.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
from typing import Any

from clamor.extension import api, pages
from clamor.extension.clusters import ClusterSource, ClusterUnavailable, NoSuchCluster
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

AUTH_RESOURCE = "kernels"
#: A kernel id in a route (Jupyter's are UUIDs).
KERNEL = r"(?P<kernel_id>[\w-]+)"


class _Base(ExtensionHandlerMixin):
    """What every handler shares: the cluster source and the live documents."""

    auth_resource = AUTH_RESOURCE

    @property
    def clusters(self) -> ClusterSource:
        return self.extensionapp.clusters  # type: ignore[attr-defined]

    @property
    def live(self) -> pages.LiveDocuments:
        return self.extensionapp.live_documents  # type: ignore[attr-defined]

    def raise_http(self, exc: Exception) -> None:
        """Our errors as HTTP errors (404 / 503) with their message."""
        if isinstance(exc, NoSuchCluster):
            raise web.HTTPError(404, str(exc)) from None
        if isinstance(exc, ClusterUnavailable):
            raise web.HTTPError(503, str(exc)) from None
        raise exc

    async def query(self, kernel_id: str, kind: str) -> Any:
        try:
            return await self.clusters.query(kernel_id, kind)
        except (NoSuchCluster, ClusterUnavailable) as exc:
            self.raise_http(exc)

    def cluster_rows(self) -> list[dict[str, Any]]:
        """The listing: one row per cluster of a running kernel of this server."""
        rows = []
        km = self.serverapp.kernel_manager
        for kernel_id, entry in sorted(self.clusters.entries().items()):
            try:
                kernel = km.get_kernel(kernel_id)
                name, state = kernel.kernel_name, getattr(kernel, "execution_state", None)
            except KeyError:
                continue
            base = f"{self.base_url}clamor/"
            rows.append({
                "kernel_id": kernel_id, "kernel_name": name, "execution_state": state,
                "pid": entry.pid, "address": entry.address, "workers": entry.workers,
                "created": entry.created,
                "api_url": f"{base}api/clusters/{kernel_id}",
                "dashboard_url": f"{base}dashboard/{kernel_id}",
            })  # fmt: skip
        return rows


class _Api(_Base, APIHandler):
    def write_json(self, body: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body, allow_nan=False))


class ClustersHandler(_Api):
    """``clamor/api/clusters``: the clusters of this server's running kernels."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.write_json({"clusters": self.cluster_rows()})


class ClusterHandler(_Api):
    """``clamor/api/clusters/{id}``: the cluster's summary (workers, stages, tasks, bytes)."""

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        entry = self._entry(kernel_id)
        stats, snapshot = await asyncio.gather(self.query(kernel_id, "stats"),
                                               self.query(kernel_id, "snapshot"))  # fmt: skip
        self.write_json(api.summary(kernel_id, entry.address, stats, snapshot))

    def _entry(self, kernel_id: str) -> Any:
        try:
            return self.clusters.entry(kernel_id)
        except NoSuchCluster as exc:
            self.raise_http(exc)


class ClusterPartHandler(_Api):
    """``clamor/api/clusters/{id}/(workers|pages|lineage|tasks)``."""

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str, part: str) -> None:
        if part == "workers":
            snapshot, stats = await asyncio.gather(self.query(kernel_id, "snapshot"),
                                                   self.query(kernel_id, "stats"))  # fmt: skip
            self.write_json(api.workers(snapshot, stats))
            return
        snapshot = await self.query(kernel_id, "snapshot")
        if part == "pages":
            try:
                body = api.pages(snapshot, self.get_argument("var", None))
            except KeyError as exc:
                raise web.HTTPError(404, exc.args[0]) from None
        elif part == "lineage":
            body = api.lineage(snapshot)
        else:
            stage = self.get_argument("stage", None)
            try:
                body = api.tasks(snapshot, None if stage is None else int(stage))
            except ValueError:
                raise web.HTTPError(400, f"stage must be an integer, got {stage!r}") from None
        self.write_json(body)


class LiveHandler(_Api):
    """``clamor/api/live/{session}``: what changed in a page's view since its last poll."""

    _track_activity = False  # an open dashboard is not user activity (idle culling)

    @web.authenticated
    @authorized
    async def get(self, session: str) -> None:
        doc = self.live.get(session)
        if doc is None:
            raise web.HTTPError(410, "this page's view expired: reload the page")
        snapshot = await self.query(doc.kernel_id, "snapshot")
        loop = asyncio.get_running_loop()
        patch = await loop.run_in_executor(self.clusters.pool, doc.patch, snapshot)
        self.write_json({"seq": snapshot.seq, "time": snapshot.time, "patch": patch})


class IndexHandler(_Base, JupyterHandler):
    """``clamor/``: the clusters, with links to their views."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(pages.index_html(self.base_url, self.cluster_rows()))


class DashboardHandler(_Base, JupyterHandler):
    """``clamor/dashboard/{id}[/{view}][?var=NAME]``: a view as a live standalone page."""

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str, view: str | None = None) -> None:
        view = view or "dashboard"
        try:
            snapshot = await self.clusters.query(kernel_id, "snapshot")
        except NoSuchCluster as exc:
            raise web.HTTPError(404, str(exc)) from None
        except ClusterUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from None
        var = self.get_argument("var", None)
        loop = asyncio.get_running_loop()
        try:
            text = await loop.run_in_executor(self.clusters.pool, self._render, kernel_id, view, var,
                                              snapshot)  # fmt: skip
        except KeyError as exc:
            raise web.HTTPError(404, exc.args[0]) from None
        self.set_header("Cache-Control", "no-store")
        self.finish(text)

    def _render(self, kernel_id: str, view: str, var: str | None, snapshot: Any) -> str:
        doc = pages.LiveDocument(kernel_id, view, pages.make_view(view, snapshot, var), snapshot)
        item = doc.item()
        self.live.add(doc)
        static = f"{self.base_url}clamor/static/bokeh/"
        scripts, raw = pages.bokeh_script_urls(doc.view.root, static)
        return pages.page_html(
            title=doc.title, nav=pages.nav_html(self.base_url, kernel_id, view, var),
            item=item, scripts=scripts, raw=raw, css=getattr(doc.view, "css", view),
            live_url=f"{self.base_url}clamor/api/live/{doc.id}",
        )  # fmt: skip

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """A short page saying what went wrong (e.g. the cluster is closed)."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{status_code}</title>"
                    f"</head><body><h2>{status_code} {html.escape(self._reason)}</h2>"
                    f"<p>{html.escape(str(message))}</p>"
                    f"<p><a href='{self.base_url}clamor/'>Clamor clusters</a></p></body></html>")  # fmt: skip


class BokehStaticHandler(_Base, JupyterHandler, web.StaticFileHandler):
    """``clamor/static/bokeh/...``: BokehJS from the installed bokeh (no CDN, no internet)."""

    @web.authenticated
    @authorized
    def head(self, path: str) -> Any:  # type: ignore[override]
        return web.StaticFileHandler.head(self, path)

    @web.authenticated
    @authorized
    def get(self, path: str, include_body: bool = True) -> Any:  # type: ignore[override]
        return web.StaticFileHandler.get(self, path, include_body)


def bokeh_static_dir() -> str:
    """bokeh's own static folder (``js/bokeh.min.js`` and friends)."""
    from bokeh.util.paths import bokehjs_path

    return os.fspath(bokehjs_path())


def handlers() -> list[tuple]:
    """The routes, relative to the server's base_url (the extension app prefixes it)."""
    return [
        (r"/clamor/?", IndexHandler),
        (r"/clamor/api/clusters/?", ClustersHandler),
        (rf"/clamor/api/clusters/{KERNEL}/?", ClusterHandler),
        (rf"/clamor/api/clusters/{KERNEL}/(?P<part>workers|pages|lineage|tasks)/?", ClusterPartHandler),
        (r"/clamor/api/live/(?P<session>[\w-]+)", LiveHandler),
        (rf"/clamor/dashboard/{KERNEL}/?", DashboardHandler),
        (rf"/clamor/dashboard/{KERNEL}/(?P<view>{'|'.join(pages.VIEWS)})/?", DashboardHandler),
        (r"/clamor/static/bokeh/(.*)", BokehStaticHandler, {"path": bokeh_static_dir()}),
    ]
