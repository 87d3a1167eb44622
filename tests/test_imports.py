"""The package's import graph: one way, no circles (README, "Architecture").

Every ``import`` statement counts, also those inside functions (lazy imports) and
under ``TYPE_CHECKING``: a circle that only closes at run time is still a circle
for the reader. The views (widgets/) and the server extension (extension/) never
import the kernel: the kernel hands the views what they need, and the registry of
running clusters that both read lives in the runtime.
"""

from __future__ import annotations

import ast
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
    {"errors", "exitcodes", "stage", "credentials", "deadlines"},  # the shared vocabulary
    {"paging"},
    {"net"},
    {"storage", "data"},
    {"observe"},
    {"scheduling", "worker", "launchers"},
    {"cluster_inspection", "cluster_workers", "futures", "joblib_backend"},
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
