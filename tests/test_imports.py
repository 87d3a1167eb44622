"""The package's import graph: one way, no circles (README, "Architecture").

Every ``import`` statement counts, also those inside functions (lazy imports) and
under ``TYPE_CHECKING``: a circle that only closes at run time is still a circle
for the reader. The views (widgets/) and the server extension (extension/) never
import the kernel: the kernel hands the views what they need, and the registry of
running clusters that both read lives in the runtime.
"""

from __future__ import annotations

import ast
import re
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    """``clamor.x.y`` -> its file, from the package list and folder map in pyproject.toml
    (a subpackage without its own entry lies in its parent's folder)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = config["package-dir"]
    modules = {}
    for package in config["packages"]:
        parent = max((p for p in folders if package == p or package.startswith(p + ".")), key=len)
        folder = REPO / folders[parent] / package[len(parent) + 1 :].replace(".", "/")
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports (a name imported from a package counts
    as its module when it is one, else as the package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                     for a in node.names]  # fmt: skip
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_real_files():
    edges = graph()
    assert "clamor.runtime.cluster" in edges and "clamor.widgets" in edges
    assert "clamor.runtime.scheduling.executor" in edges["clamor.runtime.cluster"]


def test_there_is_no_import_circle():
    assert circles(graph()) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_views_and_the_server_extension_do_not_import_the_kernel():
    edges = graph()
    offending = {
        module: sorted(t for t in targets if t.startswith("clamor.kernel"))
        for module, targets in edges.items()
        if module.startswith(("clamor.widgets", "clamor.extension"))
    }
    assert {m: t for m, t in offending.items() if t} == {}


#: The runtime's parts, lowest first (docs/architecture.md). A part imports only from
#: the layers below it; parts side by side in one layer never import each other.
RUNTIME_LAYERS = [
    {"errors", "exitcodes", "stage", "credentials", "deadlines", "resources"},  # the shared vocabulary
    {"paging"},
    {"net"},
    {"storage", "data"},
    {"observe"},
    {"scheduling", "worker", "launchers"},
    {"cluster_workers"},
    {"cluster_inspection", "futures", "joblib_backend"},
    {"cluster"},
]


def _runtime_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "runtime" else None


def test_every_runtime_part_has_a_layer():
    layered = set().union(*RUNTIME_LAYERS)
    assert {_runtime_part(m) for m in graph()} - {None} == layered


def test_the_runtime_parts_import_one_way():
    layer = {part: i for i, parts in enumerate(RUNTIME_LAYERS) for part in parts}
    wrong = []
    for module, targets in graph().items():
        source = _runtime_part(module)
        for target in map(_runtime_part, targets):
            if source and target and source != target and layer[target] >= layer[source]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_a_worker_process_loads_no_driver_code():
    edges = graph()
    seen, todo = set(), ["clamor.runtime.worker.process"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges[module])
    driver = {"scheduling", "observe", "launchers", "cluster", "cluster_inspection", "cluster_workers", "data"}
    assert sorted(m for m in seen if _runtime_part(m) in driver or not m.startswith("clamor.runtime")) == []


# -- the native pager's C files (runtime/paging/native) ------------------------------
#
# The same rules for the C side, read from the `#include "..."` lines: a file is named by
# its stem (worker_cache.c and worker_cache.h are one part), and a part includes only
# headers of the layers below it (docs/architecture.md, "The native pager's state").
# Each part of the pagers owns its state and its lock and is reached through the
# functions of its header, so an include stands for a call.

NATIVE = REPO / "runtime" / "paging" / "native"

#: Below both pagers, lowest first: the public API (api.h), the page protocol and its
#: server, the userfaultfd and futex helpers, the arena allocator and its numpy handler.
NATIVE_SHARED_LAYERS = [
    {"api", "protocol", "arena_alloc", "arena_internal"},
    {"clamor", "pager_common", "page_server", "tls", "extents", "slabs"},
    {"uffd", "arena", "numpy_handler"},
]
#: The worker pager, lowest first: fault handling -> fetch -> the mappings -> the cache.
WORKER_PAGER_LAYERS = [
    {"worker_base"},  # counters, the worker's id, exiting
    {"worker_cache", "worker_read_sets", "worker_conn"},  # the page cache; the task's read set; the connections
    {"worker_mappings", "worker_pending"},  # the range and its zero-copy mappings; pages being fetched
    {"worker_fetch"},  # fetching, read-ahead, prefetch (the fetch lock)
    {"worker_pager"},  # the fault handler, the page server's answers, the API
]
#: The driver pager, lowest first.
DRIVER_PAGER_LAYERS = [
    {"driver_base"},  # counters
    {"driver_zap", "directory", "write_tracking", "driver_map_ahead"},  # the shoot-down area; page holders;
    # async write tracking; mapping ahead where clamor.write writes
    {"driver_pages"},  # the page table and its page locks: versions, the version log, holders
    {"driver_versions"},  # the write handler and stage starts (the stage lock)
    {"driver_pager"},  # the API and its lock, start and stop, the page server's callbacks
]


def native_layers() -> dict[str, int]:
    """Each C part's layer: the shared ones first, then each pager's above them."""
    base = len(NATIVE_SHARED_LAYERS)
    layer = {part: i for i, parts in enumerate(NATIVE_SHARED_LAYERS) for part in parts}
    for layers in (WORKER_PAGER_LAYERS, DRIVER_PAGER_LAYERS):
        layer.update({part: base + i for i, parts in enumerate(layers) for part in parts})
    return layer


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def c_includes(folder: Path) -> dict[str, set[str]]:
    """Part -> the parts whose headers it includes (``#include "..."`` of its .c and .h)."""
    edges: dict[str, set[str]] = {}
    for path in sorted([*folder.glob("*.c"), *folder.glob("*.h")]):
        targets = {Path(name).stem for name in _INCLUDE.findall(path.read_text())}
        edges.setdefault(path.stem, set()).update(targets - {path.stem})
    return edges


def wrong_way(edges: dict[str, set[str]], layer: dict[str, int]) -> list[str]:
    """Includes of a part at the same layer or above, or between the two pagers."""
    side = {part: name for name, layers in (("worker", WORKER_PAGER_LAYERS), ("driver", DRIVER_PAGER_LAYERS))
            for parts in layers for part in parts}  # fmt: skip
    wrong = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            across = source in side and target in side and side[source] != side[target]
            if layer[target] >= layer[source] or across:
                wrong.append(f"{source} -> {target}")
    return wrong


def test_the_c_graph_is_read_from_the_real_files():
    edges = c_includes(NATIVE)
    assert {"worker_pager", "worker_fetch", "worker_cache", "driver_pager", "driver_pages"} <= set(edges)
    assert "worker_fetch" in edges["worker_pager"] and "worker_cache" in edges["worker_fetch"]


def test_every_c_part_has_a_layer_and_includes_what_exists():
    edges = c_includes(NATIVE)
    assert set(edges) == set(native_layers())
    assert set().union(*edges.values()) <= set(edges)


def test_there_is_no_include_circle():
    assert circles(c_includes(NATIVE)) == []


def test_the_c_parts_include_one_way():
    assert wrong_way(c_includes(NATIVE), native_layers()) == []


def test_the_c_check_finds_a_circle_and_a_wrong_way_include():
    files = {
        "worker_pager.c": '#include "worker_fetch.h"\n',
        "worker_fetch.h": "",
        "worker_fetch.c": '#include "worker_fetch.h"\n#include "worker_cache.h"\n',
        "worker_cache.h": "",
        "worker_cache.c": '#include "worker_cache.h"\n  #  include "worker_pager.h"\n#include <stdint.h>\n',
        "worker_pager.h": "",
        "driver_pages.c": '#include "worker_base.h"\n',
        "worker_base.h": "",
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        edges = c_includes(Path(tmp))
    assert edges["worker_cache"] == {"worker_pager"} and edges["worker_fetch"] == {"worker_cache"}
    assert circles(edges) == [["worker_cache", "worker_fetch", "worker_pager"]]
    assert wrong_way(edges, native_layers()) == ["driver_pages -> worker_base", "worker_cache -> worker_pager"]
