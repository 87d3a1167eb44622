"""What ``pip install clamor-jupyter`` is, and what it is not (pyproject.toml).

The package without extras is the runtime: all a worker host needs, and all that
``import clamor`` and ``clamor.Cluster`` load. The kernel, the magics, the live views
and the jupyter-server extension come with ``[jupyter]``; without it they fail with
:class:`~clamor.runtime.errors.MissingExtraError`, which names the install command.

Each check runs in a fresh interpreter (``sys.modules`` of this one holds the whole
test suite). A missing Jupyter is simulated by a ``sys.meta_path`` finder, installed by
a ``sitecustomize`` on ``PYTHONPATH`` so that the workers the driver starts hide the
same packages. The slow test installs the repository into a new virtual environment
for real (pip builds the native module and downloads the runtime's dependencies).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: What the runtime must never import: the Jupyter stack of the [jupyter] extra.
JUPYTER = ("jupyter", "IPython", "ipykernel", "ipywidgets", "bokeh", "matplotlib", "nbclient",
           "nbformat", "notebook", "traitlets", "tornado", "zmq")  # fmt: skip
#: Driver-only parts of the runtime (tests/test_imports.py): a worker running plain
#: ``cluster.run`` tasks loads none of them.
DRIVER_PARTS = ("clamor.runtime.cluster", "clamor.runtime.scheduling", "clamor.runtime.launchers",
                "clamor.runtime.observe", "clamor.runtime.data")  # fmt: skip
INSTALL = 'pip install "clamor-jupyter[jupyter]"'

HIDE = '''
import sys

HIDDEN = {hidden!r}  # top-level names starting so


class _Hidden:
    """Simulates an install without these packages (tests/test_packaging.py)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0].startswith(HIDDEN):
            raise ImportError(f"{{name}} is hidden by the test", name=name)
        return None


sys.meta_path.insert(0, _Hidden())
'''


def _jupyter_modules(names: list[str]) -> list[str]:
    return sorted(n for n in names if n.split(".")[0].startswith(JUPYTER))


def _python(code: str, tmp_path: Path | None = None, hidden: tuple[str, ...] = (),
            timeout: float = 120) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``code`` in a fresh interpreter (and its workers) with ``hidden`` packages
    hidden; returns the finished process (stdout, stderr as text)."""
    env = dict(os.environ)
    if hidden:
        assert tmp_path is not None
        site = tmp_path / "hide"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(HIDE.format(hidden=tuple(hidden)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


# --- the runtime loads no Jupyter -----------------------------------------------------


def test_import_clamor_and_its_public_names_load_no_jupyter() -> None:
    done = _python("""
        import json, sys
        import clamor
        for name in clamor.__all__:
            getattr(clamor, name)
        import clamor.runtime.worker.process, clamor.runtime.worker.tasks
        print(json.dumps(sorted(sys.modules)))
    """)
    assert done.returncode == 0, done.stderr
    assert _jupyter_modules(json.loads(done.stdout)) == []


def test_the_worker_module_loads_no_jupyter() -> None:
    """``python -m clamor.runtime.worker`` as the launchers run it, up to its argument parsing."""
    done = _python("""
        import json, runpy, sys
        sys.argv = ["clamor-worker", "--help"]
        try:
            runpy.run_module("clamor.runtime.worker", run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
        print(json.dumps(sorted(sys.modules)), file=sys.stderr)
    """)
    assert done.returncode == 0, done.stderr
    assert "--connect" in done.stdout  # the worker's usage: its module ran
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert _jupyter_modules(loaded) == []
    assert sorted(m for m in loaded if m.startswith(DRIVER_PARTS)) == []


def test_a_running_worker_loads_no_jupyter_and_no_driver_code() -> None:
    """A started worker after a ``cluster.run`` task (what it unpickles counts too)."""
    import clamor

    def loaded() -> list[str]:
        return sorted(sys.modules)

    with clamor.Cluster(workers=1) as cluster:
        modules = cluster.run(loaded)
    assert "clamor.runtime.worker.tasks" in modules
    assert _jupyter_modules(modules) == []
    assert sorted(m for m in modules if m.startswith(DRIVER_PARTS)) == []


def test_a_cluster_runs_with_the_jupyter_stack_missing(tmp_path: Path) -> None:
    """Driver and workers without any Jupyter package: the runtime alone works."""
    done = _python("""
        import clamor
        with clamor.Cluster(workers=1) as cluster:
            print(cluster.run(sum, [1, 2, 3]))
            print(sum(cluster.parallelize(range(10), 2).map(lambda x: x * x).collect()))
    """, tmp_path, hidden=JUPYTER)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6", "285"]


# --- the Jupyter parts say which extra they need --------------------------------------

#: The parts of the [jupyter] extra, each as a user meets it: (label, code).
ENTRY_POINTS = [
    ("kernel", "import clamor.kernel.kernel"),
    ("kernel app", "import runpy; runpy.run_module('clamor.kernel', run_name='__main__')"),
    ("clamor command", "from clamor.kernel.cli import main; main(['install-kernel'])"),
    ("magics", "import clamor; clamor.load_ipython_extension(object())"),
    ("views", "import clamor.widgets"),
    ("a view module", "import clamor.widgets.heatmap_view"),
    ("server extension", "import clamor.extension.app"),
]


@pytest.mark.parametrize("code", [code for _, code in ENTRY_POINTS],
                         ids=[label for label, _ in ENTRY_POINTS])  # fmt: skip
def test_the_jupyter_parts_name_the_extra_when_it_is_missing(tmp_path: Path, code: str) -> None:
    done = _python(code, tmp_path, hidden=JUPYTER)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("clamor.runtime.errors.MissingExtraError: "), done.stderr
    assert INSTALL in last


def test_the_message_names_what_is_missing(tmp_path: Path) -> None:
    done = _python("import clamor.widgets", tmp_path, hidden=("bokeh", "matplotlib"))
    last = done.stderr.strip().splitlines()[-1]
    assert "the live views (clamor.widgets) needs bokeh, matplotlib, which are not installed" in last


def test_the_dask_launcher_names_its_extra(tmp_path: Path) -> None:
    done = _python("import clamor; clamor.DaskLauncher('tcp://127.0.0.1:1')", tmp_path,
                   hidden=("distributed", "dask"))  # fmt: skip
    assert 'pip install "clamor-jupyter[dask]"' in done.stderr.strip().splitlines()[-1]


def test_the_missing_extra_error_is_an_import_error_that_pickles() -> None:
    import pickle

    from clamor.runtime.errors import ClamorError, MissingExtraError

    err = pickle.loads(pickle.dumps(MissingExtraError("the kernel", ["ipykernel"])))
    assert isinstance(err, ImportError) and isinstance(err, ClamorError)
    assert err.name == "ipykernel" and INSTALL in str(err)


# --- pyproject.toml -------------------------------------------------------------------


def _requirement_names(requirements: list[str]) -> set[str]:
    import re

    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_dependencies_are_the_runtime_and_the_extras_the_rest() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = _requirement_names(project["dependencies"])
    assert runtime == {"numpy", "cffi", "cloudpickle", "grpcio", "protobuf", "psutil", "fsspec",
                       "cryptography"}  # fmt: skip
    extras = project["optional-dependencies"]
    assert {"ipykernel", "ipython", "jupyter-client", "jupyter-server", "jupyterlab", "notebook",
            "bokeh", "jupyter-bokeh", "ipywidgets", "matplotlib"} <= _requirement_names(extras["jupyter"])  # fmt: skip
    assert "clamor-jupyter[jupyter,dask]" in extras["test"]  # `make test` installs .[test]
    assert _requirement_names(extras["dask"]) == {"distributed"}


def test_the_oldest_versions_cover_every_floor() -> None:
    """``make test-oldest`` pins each floor of pyproject.toml (testing/oldest-versions.txt)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    floors = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        floors |= {r for r in extra if not r.startswith("clamor-jupyter")}
    pinned = {line.split("==")[0].lower().replace("_", "-")
              for line in (REPO / "testing" / "oldest-versions.txt").read_text().splitlines()
              if line and not line.startswith("#")}  # fmt: skip
    assert _requirement_names(sorted(floors)) - pinned == set()


# --- a real install ---------------------------------------------------------------------

#: What the copy of the repository for ``pip install`` leaves out (build outputs, caches).
_NOT_COPIED = shutil.ignore_patterns(".git", "node_modules", "build", "dist", "*.egg-info",
                                     "__pycache__", "*.so", ".venv*", ".pytest_cache", ".ruff_cache",
                                     ".make-installed", "bench", "notebooks", "tests")  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pip_install_without_extras_is_a_working_runtime_without_jupyter(tmp_path: Path) -> None:
    """``pip install <repo>`` into a new virtual environment (no system site packages):
    a 2-worker cluster runs there, and the Jupyter stack is not importable. About 1-2
    minutes with pip's cache warm (pip compiles the native module, downloads the wheels)."""
    source = tmp_path / "clamor-jupyter"
    shutil.copytree(REPO, source, ignore=_NOT_COPIED)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
                         capture_output=True, text=True, timeout=480, check=False)  # fmt: skip
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    check = textwrap.dedent("""
        import importlib.util, json, sys
        import clamor
        with clamor.Cluster(workers=2) as cluster:
            squares = cluster.parallelize(range(100), 4).map(lambda x: x * x).collect()
            ran = cluster.run_stage([(w, sum, ([w, 1],)) for w in cluster.workers])
        absent = {m: importlib.util.find_spec(m) is None for m in ("jupyter_server", "IPython", "bokeh")}
        print(json.dumps({"sum": sum(squares), "ran": ran, "absent": absent,
                          "clamor": clamor.__file__}))
    """)
    done = subprocess.run([str(python), "-c", check], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["sum"] == 328350 and out["ran"] == [1, 2]
    assert out["absent"] == {"jupyter_server": True, "IPython": True, "bokeh": True}
    assert out["clamor"].startswith(str(venv))  # the installed copy, not this checkout
