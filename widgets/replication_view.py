"""The replication view: who serves the pages, and how many copies they have.

Left, the bytes served by the driver and by peer workers so far, and the bytes workers
on the driver's host mapped in place without a copy (cumulative steps over the
snapshots' history, seconds since its first point): with replication on, the peers'
line climbs while the driver's flattens; on one host, only the mapped line moves. Right,
how many of the pages ever requested have copies on 0, 1, 2, ... workers now (none when
they are mapped in place, which its title then says). The header gives the peers' share.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import (
    BasicTicker,
    ColumnDataSource,
    Div,
    HoverTool,
    NumeralTickFormatter,
)
from bokeh.plotting import figure
from clamor.runtime.observe.snapshots import ClusterSnapshot
from clamor.runtime.paging.arena import format_bytes
from clamor.widgets.base import COLORS, View, set_data


def served(snapshot: ClusterSnapshot) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(seconds since the first point, driver bytes, peer bytes, bytes mapped in
    place)``, cumulative, ending with the snapshot's totals (appended when the history
    lags behind or is empty)."""
    points = [(*p, 0)[:4] for p in snapshot.history]  # an older history has no mapped bytes
    now = tuple(int(snapshot.totals.get(k, 0)) for k in ("bytes_served_by_driver", "bytes_served_by_peers",
                                                          "bytes_mapped"))  # fmt: skip
    if not points or tuple(points[-1][1:]) != now:
        points.append((max(snapshot.time, points[-1][0]) if points else snapshot.time, *now))
    t, driver, peers, mapped = (np.array(c) for c in zip(*points))
    return t.astype(np.float64) - t[0], driver.astype(np.int64), peers.astype(np.int64), mapped.astype(np.int64)


def holder_counts(snapshot: ClusterSnapshot) -> np.ndarray:
    """``counts[h]``: pages requested at least once that have ``h`` holders now."""
    pages = snapshot.pages
    return np.bincount(pages.holders[pages.requests > 0].astype(np.int64), minlength=1)


def peer_share(snapshot: ClusterSnapshot) -> tuple[float, int]:
    """The share of bytes served by peers, and the bytes served in all."""
    driver = int(snapshot.totals.get("bytes_served_by_driver", 0))
    peers = int(snapshot.totals.get("bytes_served_by_peers", 0))
    total = driver + peers
    return (peers / total if total else 0.0), total


class ReplicationView(View):
    """Driver vs peer bytes over time, and pages per number of holders."""

    title = "replication"

    def __init__(self, width: int = 600, height: int = 220) -> None:
        self.history_source = ColumnDataSource(data={"t": [], "driver": [], "peers": [], "mapped": []})
        self.holders_source = ColumnDataSource(data={"holders": [], "pages": []})
        self.header = Div(text="no bytes served yet", styles={"font-size": "12px"})

        self.history = figure(
            width=width - width * 11 // 30, height=height, tools="", toolbar_location=None,
            min_border=4, x_axis_label="seconds", y_axis_label="bytes read by workers",
        )  # fmt: skip
        lines = [
            self.history.step("t", key, source=self.history_source, mode="after", line_width=2,
                              color=COLORS[key], legend_label=label, line_dash=dash)
            for key, label, dash in (("driver", "served by the driver", "solid"),
                                     ("peers", "served by peers", "solid"),
                                     ("mapped", "mapped in place (no copy)", "dashed"))
        ]  # fmt: skip
        self.history.y_range.start = self.history.x_range.start = 0  # no negative axis when all is 0
        self.history.yaxis.formatter = NumeralTickFormatter(format="0 b")
        self.history.legend.location = "top_left"
        self.history.legend.label_text_font_size = "10px"
        self.history.add_tools(HoverTool(renderers=lines[:1], mode="vline", tooltips=[
            ("t", "@t{0.0} s"), ("driver", "@driver{0.0 b}"), ("peers", "@peers{0.0 b}"),
            ("mapped", "@mapped{0.0 b}")]))  # fmt: skip

        self.holders = figure(
            width=width * 11 // 30, height=height, tools="", toolbar_location=None,
            min_border=4, x_axis_label="copies held", y_axis_label="pages requested",
        )  # fmt: skip
        self.holders.x_range.start = -0.5
        bars = self.holders.vbar(x="holders", top="pages", width=0.8, source=self.holders_source,
                                 color=COLORS["held"])  # fmt: skip
        self.holders.xaxis.ticker = BasicTicker(min_interval=1, num_minor_ticks=0)
        self.holders.xgrid.visible = False
        self.holders.y_range.start = 0
        self.holders.add_tools(HoverTool(renderers=[bars], tooltips="@pages page(s) with @holders holder(s)"))

        self.root = column(self.header, row(self.history, self.holders), css_classes=["clamor-replication"])

    def update(self, snapshot: ClusterSnapshot) -> None:
        t, driver, peers, mapped = served(snapshot)
        set_data(self.history_source, {"t": t, "driver": driver, "peers": peers, "mapped": mapped})
        counts = holder_counts(snapshot)
        set_data(self.holders_source, {"holders": np.arange(len(counts)), "pages": counts})
        title = self._holders_title(counts, int(mapped[-1]))
        if self.holders.title.text != title:
            self.holders.title.text = title
        text = self._header(snapshot)
        if self.header.text != text:
            self.header.text = text

    def summary(self, snapshot: ClusterSnapshot) -> str:
        counts = holder_counts(snapshot)
        spread = ", ".join(f"{h}: {int(c)}" for h, c in enumerate(counts) if c)
        return "\n".join([
            self._header(snapshot),
            f"pages requested: {int(counts.sum())}; by holders {spread or '-'}",
        ])  # fmt: skip

    def draw(self, snapshot: ClusterSnapshot, ax: Any) -> None:
        """Both charts side by side inside ``ax`` (as insets, so one axes suffices)."""
        ax.axis("off")
        title = ax.get_title(loc="left")
        ax.set_title(f"{title}: {self._header(snapshot)}" if title else self._header(snapshot),
                     fontsize=9, loc="left")  # fmt: skip
        left, right = ax.inset_axes([0.06, 0.14, 0.56, 0.8]), ax.inset_axes([0.72, 0.14, 0.28, 0.8])
        t, driver, peers, mapped = served(snapshot)
        for values, key, style in ((driver, "driver", "-"), (peers, "peers", "-"), (mapped, "mapped", "--")):
            left.step(t, values / 2**20, where="post", color=COLORS[key], label=key, lw=1.5, ls=style)
        left.set_xlabel("seconds", fontsize=8)
        left.set_ylabel("MiB read by workers", fontsize=8)
        left.legend(fontsize=7, loc="upper left", frameon=False)
        counts = holder_counts(snapshot)
        right.bar(np.arange(len(counts)), counts, color=COLORS["held"], width=0.8)
        right.set_xticks(np.arange(len(counts)))
        right.set_xlabel("holders", fontsize=8)
        right.set_ylabel("pages requested", fontsize=8)
        for a in (left, right):
            a.tick_params(labelsize=7)
            a.spines[["top", "right"]].set_visible(False)

    @staticmethod
    def _holders_title(counts: np.ndarray, mapped: int) -> str:
        """Says why the holders chart is empty when it is: on the driver's host the
        workers map its pages in place and keep no copies to replicate."""
        if counts[1:].any():
            return ""
        return "mapped in place: no copies" if mapped else "no copies yet"

    @staticmethod
    def _header(snapshot: ClusterSnapshot) -> str:
        share, total = peer_share(snapshot)
        mapped = int(snapshot.totals.get("bytes_mapped", 0))
        in_place = f"; mapped in place (zero copy, no replica needed) {format_bytes(mapped)}" if mapped else ""
        if not total:
            return ("no bytes served yet" if not mapped else "no bytes served") + in_place
        return f"peers served {share:.0%} of {format_bytes(total)}" + in_place
