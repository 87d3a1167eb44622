"""The page heatmap: a cell per arena page, coloured by accesses.

One cell per page of a variable (or of the whole used arena), laid out row-major
in a grid. When there are more pages than ``max_cells``, each cell stands for a
contiguous bucket of pages (summed counters, largest holders/version) and its
hover says which pages. A toggle recolours the cells by driver-served bytes,
peer-served bytes or replication factor (holders) in the browser alone: every
metric has its own precomputed ``color_<metric>`` column (0..1, log-scaled for
counters, -1 for an untouched page) and the toggle only swaps the glyph's field.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.layouts import column
from bokeh.models import (
    ColorBar,
    ColumnDataSource,
    CustomJS,
    Div,
    FixedTicker,
    HoverTool,
    LinearColorMapper,
    RadioButtonGroup,
    Range1d,
)
from bokeh.palettes import Blues256, Greens256, Oranges256, Viridis256
from bokeh.plotting import figure
from clamor.runtime.observe.snapshots import ClusterSnapshot, PageSnapshot
from clamor.runtime.paging.arena import format_bytes
from clamor.widgets.base import View, set_data

#: The colourings the toggle offers: ``(metric, label, palette)``; counters are log-scaled.
METRICS = (
    ("requests", "accesses", Viridis256),
    ("driver_bytes", "driver bytes", tuple(reversed(Oranges256))),
    ("peer_bytes", "peer bytes", tuple(reversed(Greens256))),
    ("holders", "replication", tuple(reversed(Blues256))),
)
_NAMES = tuple(m for m, _, _ in METRICS)
#: Summed over a bucket of pages; the other fields take the bucket's largest value.
_SUMMED = ("requests", "driver_bytes", "peer_bytes")
_UNTOUCHED = "#eeeeee"
_FLOOR = 0.15  # the smallest non-zero value still gets a visible colour


def _legend_title(metric: str) -> str:
    label = next(label for m, label, _ in METRICS if m == metric)
    scale = "" if metric == "holders" else ", log scale"
    return f"{label} per cell{scale} (grey: none)"


def _range(values: np.ndarray, metric: str) -> tuple[str, str]:
    """The legend's two labels: the palette's start (just above none) and its end (the
    most a cell has: :func:`scaled` maps it to 1)."""
    high = int(values.max()) if len(values) else 0
    if not high:
        return "none yet", ""
    return "> 0", format_bytes(high) if metric in ("driver_bytes", "peer_bytes") else f"{high:,}"


def scaled(values: np.ndarray, log: bool = True) -> np.ndarray:
    """``values`` mapped to ``[_FLOOR, 1]`` (log1p for counters), ``-1`` where zero."""
    v = values.astype(np.float64)
    top = float(v.max()) if len(v) else 0.0
    if top <= 0:
        return np.full(len(v), -1.0, np.float32)
    if log:
        v, top = np.log1p(v), np.log1p(top)
    out = _FLOOR + (1 - _FLOOR) * v / top
    return np.where(values > 0, out, -1.0).astype(np.float32)


def owners(pages: PageSnapshot, first: np.ndarray, last: np.ndarray) -> list[str]:
    """The variable owning each cell's pages ``[first, last]`` (``"a…b"`` when a bucket
    straddles two), vectorized: a sorted search over the variables' spans."""
    if not pages.variables or not len(first):
        return [""] * len(first)
    spans = sorted(pages.variables.items(), key=lambda kv: kv[1][0])
    names = np.array([n for n, _ in spans] + [""], dtype=object)
    starts = np.array([s[0] for _, s in spans])
    ends = np.array([s[1] for _, s in spans])

    def which(p: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, p, side="right") - 1
        inside = (i >= 0) & (p < ends[i.clip(0)])
        return np.where(inside, i, len(spans))

    a, b = which(first), which(last)
    out = names[a]
    straddle = (a != b) & (b < len(spans))
    out[straddle & (a == len(spans))] = names[b[straddle & (a == len(spans))]]
    both = straddle & (a < len(spans))
    out[both] = names[a[both]] + "…" + names[b[both]]
    return out.tolist()


class Grid:
    """``pages`` bucketed into at most ``max_cells`` cells laid out in ``columns`` columns."""

    def __init__(self, pages: PageSnapshot, columns: int, max_cells: int) -> None:
        n = len(pages)
        self.n = n
        self.k = k = max(1, -(-n // max(1, max_cells)))
        self.cells = cells = -(-n // k)
        self.cols = max(1, min(columns, cells))
        self.rows = max(1, -(-cells // self.cols))
        idx = np.arange(cells)
        self.first = pages.first_page + idx * k
        self.count = np.minimum(k, n - idx * k)
        self.x, self.y = idx % self.cols, idx // self.cols
        self.fields: dict[str, np.ndarray] = {}
        for name in ("requests", "driver_bytes", "peer_bytes", "holders", "version"):
            values = getattr(pages, name)
            if k > 1:
                padded = np.zeros(cells * k, values.dtype)
                padded[:n] = values
                values = padded.reshape(cells, k)
                values = values.sum(axis=1) if name in _SUMMED else values.max(axis=1)
            self.fields[name] = values

    def image(self, name: str = "requests") -> np.ndarray:
        """The field as a ``rows x cols`` float image, NaN past the last cell."""
        img = np.full(self.rows * self.cols, np.nan)
        img[: self.cells] = self.fields[name]
        return img.reshape(self.rows, self.cols)


class PageHeatmap(View):
    """Pages of ``variable`` (or of ``span`` = ``(first, end)`` pages, or of the whole used
    arena) as a grid of ``columns`` columns of at most ``max_cells`` cells."""

    title = "arena pages"

    def __init__(self, variable: str | None = None, span: tuple[int, int] | None = None,
                 columns: int = 64, max_cells: int = 4096, width: int = 600,
                 height: int = 260) -> None:  # fmt: skip
        self.variable = variable
        self.span = span
        self.columns = columns
        self.max_cells = max_cells
        if variable is not None:
            self.title = f"pages of {variable}"
        elif span is not None:
            self.title = f"pages {span[0]}–{span[1] - 1}"
        self._k = 1
        self.source = ColumnDataSource(data=self._data(Grid(self._empty(), columns, max_cells), self._empty()))
        self.mappers = {
            m: LinearColorMapper(palette=p, low=0, high=1, low_color=_UNTOUCHED, nan_color=_UNTOUCHED)
            for m, _, p in METRICS
        }  # fmt: skip
        self.figure = figure(
            title=self.title, width=width, height=height, tools="", toolbar_location=None,
            x_range=Range1d(-0.5, 0.5), y_range=Range1d(0.5, -0.5),  # row 0 on top
            css_classes=["clamor-heatmap"], min_border=4,
        )  # fmt: skip
        self.figure.axis.visible = False
        self.figure.grid.visible = False
        self.figure.outline_line_color = None
        self.renderer = self.figure.rect(
            "x", "y", width=0.92, height=0.92, source=self.source, line_color=None,
            fill_color={"field": "color_requests", "transform": self.mappers["requests"]},
        )  # fmt: skip
        self.glyph = self.renderer.glyph
        self.hover = HoverTool(renderers=[self.renderer], tooltips=self._tooltips(1))
        self.figure.add_tools(self.hover)
        # The colour legend: the palette from the least (but not none: grey) to the most
        # a cell has of the metric shown, labelled with those values (set at each update).
        self.legend_source = ColumnDataSource(data={"low": ["none yet"] * len(_NAMES), "high": [""] * len(_NAMES)})
        self.legend = ColorBar(
            color_mapper=self.mappers["requests"], ticker=FixedTicker(ticks=[_FLOOR, 1.0]),
            major_label_overrides={_FLOOR: "none yet", 1.0: ""}, orientation="horizontal", height=8,
            title=_legend_title("requests"), title_text_font_size="10px",
            major_label_text_font_size="10px", padding=4, location=(0, 0),
        )  # fmt: skip
        self.figure.add_layout(self.legend, "below")
        self.toggle = RadioButtonGroup(labels=[label for _, label, _ in METRICS], active=0)
        self.toggle.js_on_change("active", CustomJS(
            args={"glyph": self.glyph, "names": list(_NAMES), "mappers": [self.mappers[m] for m in _NAMES],
                  "legend": self.legend, "labels": self.legend_source,
                  "titles": [_legend_title(m) for m in _NAMES], "floor": _FLOOR},
            code="const i = cb_obj.active;"
                 "glyph.fill_color = {field: 'color_' + names[i], transform: mappers[i]};"
                 "legend.color_mapper = mappers[i]; legend.title = titles[i];"
                 "legend.major_label_overrides = new Map([[floor, labels.data.low[i]], "
                 "[1, labels.data.high[i]]]);",
        ))  # fmt: skip
        self.totals = Div(text="", styles={"font-size": "11px", "color": "#555"})
        self.root = column(self.toggle, self.totals, self.figure)

    # --- the colouring ---

    @property
    def metric(self) -> str:
        """What colours the cells: ``requests``, ``driver_bytes``, ``peer_bytes`` or ``holders``."""
        return _NAMES[self.toggle.active]

    @metric.setter
    def metric(self, name: str) -> None:
        if name not in _NAMES:
            raise ValueError(f"metric must be one of {_NAMES}, not {name!r}")
        self.toggle.active = _NAMES.index(name)  # the browser follows through the CustomJS
        self.glyph.fill_color = {"field": f"color_{name}", "transform": self.mappers[name]}
        self._show_legend()

    def _show_legend(self) -> None:
        """The legend of the metric shown: its palette, its title, its least and most."""
        i, name = self.toggle.active, self.metric
        labels = {_FLOOR: self.legend_source.data["low"][i], 1.0: self.legend_source.data["high"][i]}
        if self.legend.color_mapper is not self.mappers[name]:
            self.legend.color_mapper = self.mappers[name]
        if self.legend.title != _legend_title(name):
            self.legend.title = _legend_title(name)
        if dict(self.legend.major_label_overrides) != labels:
            self.legend.major_label_overrides = labels

    # --- snapshots ---

    def pages(self, snapshot: ClusterSnapshot) -> PageSnapshot:
        """The pages this view shows."""
        pages = snapshot.pages
        span = self.span
        if span is None and self.variable is not None:
            span = pages.variables.get(self.variable, (0, 0))  # an unknown name shows nothing
        return pages if span is None else pages.select(*span)

    def update(self, snapshot: ClusterSnapshot) -> None:
        pages = self.pages(snapshot)
        grid = Grid(pages, self.columns, self.max_cells)
        set_data(self.source, self._data(grid, pages))  # only the columns that changed
        x_end, y_start = grid.cols - 0.5, grid.rows - 0.5
        if self.figure.x_range.end != x_end or self.figure.y_range.start != y_start:
            self.figure.x_range.end, self.figure.y_range.start = x_end, y_start
        if grid.k != self._k:
            self._k = grid.k
            self.hover.tooltips = self._tooltips(grid.k)
        text = self._totals(grid, pages)
        if self.totals.text != text:
            self.totals.text = text
        ranges = [_range(grid.fields[m], m) for m in _NAMES]
        labels = {"low": [low for low, _ in ranges], "high": [high for _, high in ranges]}
        if dict(self.legend_source.data) != labels:
            self.legend_source.data = labels
        self._show_legend()

    def summary(self, snapshot: ClusterSnapshot) -> str:
        pages = self.pages(snapshot)
        req = pages.requests
        driver, peer = int(pages.driver_bytes.sum()), int(pages.peer_bytes.sum())
        lines = [
            (f"{self.title}: {len(pages)} pages of {format_bytes(pages.page_size)}, "
             f"{int((req > 0).sum())} accessed ({int(req.sum())} requests)"),
            (f"served: {format_bytes(driver)} by the driver, {format_bytes(peer)} by peers; "
             f"max holders {int(pages.holders.max()) if len(pages) else 0}"),
        ]
        hot = np.argsort(-req.astype(np.int64), kind="stable")[:5]
        hot = hot[req[hot] > 0]
        if len(hot):
            first = pages.first_page + hot
            names = owners(pages, first, first)
            lines.append("hottest: " + ", ".join(
                f"page {p} ({name or '-'}) {int(req[i])}"
                for p, i, name in zip(first.tolist(), hot.tolist(), names)
            ))  # fmt: skip
        return "\n".join(lines)

    def draw(self, snapshot: ClusterSnapshot, ax: Any) -> None:
        from matplotlib import colormaps

        pages = self.pages(snapshot)
        grid = Grid(pages, self.columns, self.max_cells)
        img = grid.image("requests")
        cmap = colormaps["viridis"].with_extremes(bad="white", under=_UNTOUCHED)
        shown = np.where(img > 0, np.log1p(np.nan_to_num(img)), -1.0)
        shown[np.isnan(img)] = np.nan
        ax.imshow(shown, cmap=cmap, vmin=0, vmax=max(1e-9, float(np.nanmax(shown, initial=0))),
                  aspect="auto", interpolation="nearest")  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_xlabel(self._totals(grid, pages), fontsize=8, loc="left")

    # --- helpers ---

    def _empty(self) -> PageSnapshot:
        z = np.zeros(0, np.uint64)
        return PageSnapshot(0, 0, z, z, z, z.astype(np.uint32), z.astype(np.uint32))

    def _data(self, grid: Grid, pages: PageSnapshot) -> dict[str, Any]:
        f = grid.fields
        data: dict[str, Any] = dict(
            page=grid.first, pages=grid.count, last=grid.first + grid.count - 1, x=grid.x, y=grid.y,
            variable=owners(pages, grid.first, grid.first + grid.count - 1), **f,
        )  # fmt: skip
        for m in _NAMES:
            data[f"color_{m}"] = scaled(f[m], log=m != "holders")
        return data

    @staticmethod
    def _tooltips(k: int) -> list[tuple[str, str]]:
        return [
            ("page" if k == 1 else "pages", "@page" if k == 1 else "@page–@last (@pages pages)"),
            ("variable", "@variable"),
            ("version", "@version"),
            ("holders", "@holders"),
            ("requests", "@requests"),
            ("driver", "@driver_bytes{0.0 b}"),
            ("peers", "@peer_bytes{0.0 b}"),
        ]

    @staticmethod
    def _totals(grid: Grid, pages: PageSnapshot) -> str:
        per = f" ({grid.k} per cell)" if grid.k > 1 else ""
        mh = int(pages.holders.max()) if len(pages) else 0
        return (f"{grid.n} pages{per} · {int((pages.requests > 0).sum())} accessed · "
                f"driver {format_bytes(int(pages.driver_bytes.sum()))} · "
                f"peers {format_bytes(int(pages.peer_bytes.sum()))} · max holders {mh}")  # fmt: skip
