"""The JupyterLab extension (labextension/) is installed and enabled: JupyterLab lists it
"enabled OK" in this environment, and a wheel ships the prebuilt files where JupyterLab
looks. The build is committed; ``make labextension`` rebuilds it when its sources change
(npm ci, tsc, @jupyterlab/builder), and ``make install`` copies it into this environment
(labextension/develop.py: an editable install copies no data files);
tests/extension/test_labextension_browser.py drives it in a browser."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAME = "clamor-jupyter-labextension"
SOURCE = REPO / "labextension"
BUILT = SOURCE / "clamor_labextension"
INSTALL = "`make install` builds it and copies it into this environment"


def test_jupyter_labextension_list_shows_it_enabled_and_ok() -> None:
    # `-m jupyterlab.labextensions`, not `jupyter labextension`: jupyter's dispatcher runs
    # the first `jupyter-labextension` on PATH, which may belong to another Python
    out = subprocess.run([sys.executable, "-m", "jupyterlab.labextensions", "list"],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    lines = [line.split() for line in text.splitlines() if NAME in line.split()]
    assert lines, f"JupyterLab does not list {NAME} ({INSTALL}):\n{text}"
    version = json.loads((SOURCE / "package.json").read_text())["version"]
    assert lines[0][:4] == [NAME, f"v{version}", "enabled", "OK"], text
    assert "(python, clamor-jupyter)" in text, text  # install.json: pip owns it


def test_the_build_is_a_federated_extension_the_wheel_ships() -> None:
    package = json.loads((BUILT / "package.json").read_text())
    build = package["jupyterlab"]["_build"]
    assert (BUILT / build["load"]).is_file()  # static/remoteEntry.<hash>.js
    assert build["extension"] == "./extension" and build["style"] == "./style"
    # JupyterLab's packages come from the page (shared singletons, never bundled), at
    # ranges every JupyterLab 4 satisfies, whatever version the build ran against
    shared = package["jupyterlab"]["sharedPackages"]
    assert shared["@jupyterlab/application"] == {"bundled": False, "singleton": True,
                                                 "requiredVersion": "^4.0.0"}  # fmt: skip
    remote = (BUILT / build["load"]).read_text()
    assert '"@jupyterlab/application",!1,[1,4,0,0]' in remote
    data_files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    dest = f"share/jupyter/labextensions/{NAME}"
    assert data_files[dest] == ["labextension/clamor_labextension/package.json", "labextension/install.json"]
    assert data_files[f"{dest}/static"] == ["labextension/clamor_labextension/static/*"]
    assert json.loads((SOURCE / "install.json").read_text())["packageName"] == "clamor-jupyter"


def test_the_committed_build_is_built_from_these_sources() -> None:
    """The prebuilt extension is committed (so that `pip install ".[jupyter]"` ships it with
    no Node.js); sources.sha256 names the sources it was built from, hashed as the
    Makefile hashes them. Changed a source? `make labextension` rebuilds it."""
    import hashlib

    names = ["package.json", "package-lock.json", "tsconfig.json", "install.json"]
    paths = [SOURCE / n for n in names] + list((SOURCE / "src").glob("*.ts")) + list((SOURCE / "style").iterdir())
    ordered = sorted(paths, key=lambda p: str(p.relative_to(REPO)).encode())
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in ordered)).hexdigest()
    assert (BUILT / "sources.sha256").read_text().strip() == digest, "run `make labextension`"
