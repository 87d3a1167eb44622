"""``%clamor heatmap | replication | timeline | lineage | dashboard``: show the live views.

The views live in ``clamor.widgets``, which never imports the kernel: loading the
magics imports them (:func:`load_views`), tells them how to find the session's
cluster and registers them here. These commands resolve names in the notebook and delegate. In a terminal
IPython the views print their text summary instead of a widget, and
``%clamor lineage DS`` prints its one-line-per-partition table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clamor.kernel.magics import errors
from clamor.kernel.magics.commands import table
from clamor.kernel.magics.progress import in_notebook
from clamor.runtime.data.dataset import Dataset
from clamor.runtime.paging import arena, arena_names
from IPython.core.error import UsageError

#: What ``clamor.widgets`` registered: ``heatmap``, ``timeline``, ... -> function.
_VIEWS: dict[str, Callable[..., Any]] = {}


def register(**functions: Callable[..., Any]) -> None:
    """Make ``%clamor NAME`` show ``functions[NAME](...)``."""
    _VIEWS.update(functions)


def load_views() -> None:
    """Import the views, tell them how to find this session's cluster, register them
    (``ImportError`` without the widget packages)."""
    from clamor.kernel.lazy import resolve

    from clamor import widgets

    widgets.attach(resolve=resolve, in_notebook=in_notebook)
    register(heatmap=widgets.heatmap, replication=widgets.replication, timeline=widgets.timeline,
             lineage=widgets.lineage, dashboard=widgets.dashboard)  # fmt: skip


class ViewCommands:
    """A mixin of ``ClamorMagics`` (``self.shell``, ``self.cluster()``)."""

    shell: Any

    def _view(self, view: str) -> Callable[..., Any]:
        if view not in _VIEWS:
            try:
                load_views()
            except ImportError as exc:
                raise UsageError(f"%clamor {view} needs the widget packages (bokeh, "
                                 f"jupyter_bokeh, ipywidgets): {exc}") from None  # fmt: skip
        return _VIEWS[view]

    def _display(self, view: str, **kwargs: Any) -> None:
        from IPython.display import display

        with errors.short():
            display(self._view(view)(live=in_notebook(), **kwargs))

    def _dataset(self, name: str) -> Dataset:
        ns = self.shell.user_ns
        ds = ns.get(name)
        if not isinstance(ds, Dataset):
            names = sorted(n for n, v in ns.items() if isinstance(v, Dataset) and not n.startswith("_"))
            what = "no variable" if name not in ns else f"{type(ds).__name__}, not a dataset:"
            listing = ", ".join(names) or "none"
            raise UsageError(f"{what} {name!r}; datasets here: {listing}")
        return ds

    def _span(self, name: str, page_size: int) -> tuple[int, int]:
        """The pages of arena array ``name`` (or of the arena arrays inside object ``name``)."""
        ns = self.shell.user_ns
        if name not in ns:
            raise UsageError(f"no variable {name!r}")
        value = ns[name]
        if hasattr(value, "nbytes") and arena.in_arena(value):
            return arena.page_span(value, page_size)
        spans = arena_names.variable_spans({name: value}, page_size).values()
        if not spans:
            raise UsageError(f"{name!r} ({type(value).__name__}) holds no arena arrays: create it "
                             "in the Clamor kernel, or inside `with clamor.shared():`")  # fmt: skip
        return min(a for a, _ in spans), max(b for _, b in spans)

    def cmd_heatmap(self, args: Any) -> None:
        cluster = self.cluster()  # type: ignore[attr-defined]
        span = None if args.var is None else self._span(args.var, cluster.page_size)
        self._display("heatmap", cluster=cluster, span=span, name=args.var)

    def cmd_replication(self, args: Any) -> None:
        self._display("replication", cluster=self.cluster())  # type: ignore[attr-defined]

    def cmd_timeline(self, args: Any) -> None:
        self._display("timeline", cluster=self.cluster())  # type: ignore[attr-defined]

    def cmd_dashboard(self, args: Any) -> None:
        ds = None if args.dataset is None else self._dataset(args.dataset)
        self._display("dashboard", cluster=None if ds else self.cluster(), ds=ds)  # type: ignore[attr-defined]

    def cmd_lineage(self, args: Any) -> None:
        ds = self._dataset(args.dataset)
        if in_notebook() and not args.text:
            self._display("lineage", ds=ds)
            return
        with errors.short():
            graph = ds.lineage()
        print(f"lineage of {args.dataset} = {ds!r}")
        mine = [n for n in graph.nodes if n.dataset == ds.id]
        rows = [[n.index, n.state, "-" if n.holder is None else n.holder,
                 "-" if n.epoch is None else n.epoch, len(n.read_set), " > ".join(n.ops)]
                for n in mine]  # fmt: skip
        print(table(["partition", "state", "holder", "epoch", "pages read", "ops"], rows))
        ancestors: dict[int, list] = {}
        for n in graph.nodes:
            if n.dataset != ds.id:
                ancestors.setdefault(n.dataset, []).append(n)
        for dataset_id, nodes in ancestors.items():
            states: dict[str, int] = {}
            for n in nodes:
                states[n.state] = states.get(n.state, 0) + 1
            counts = ", ".join(f"{v} {k}" for k, v in states.items())
            print(f"  from dataset {dataset_id} ({nodes[0].name}): {len(nodes)} partitions, {counts}")
