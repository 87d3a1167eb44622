"""The extension is found by jupyter-server and enabled by default: the config file the
package ships (and ``clamor install-kernel`` writes for editable installs) enables it."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from clamor.kernel import cli
from jupyter_server.extension.config import ExtensionConfigManager
from jupyter_server.extension.manager import ExtensionPackage

REPO = Path(__file__).resolve().parents[2]
SHIPPED = "jupyter-config/jupyter_server_config.d/clamor.json"


def test_the_shipped_config_enables_the_extension_and_is_installed_as_data() -> None:
    assert json.loads((REPO / SHIPPED).read_text()) == cli.SERVER_EXTENSION_CONFIG
    data_files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    assert data_files["etc/jupyter/jupyter_server_config.d"] == [SHIPPED]


def test_install_kernel_enables_it_at_its_prefix(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "clamor.kernel.cli", "install-kernel", "--prefix",
                          str(tmp_path)], capture_output=True, text=True, check=True)  # fmt: skip
    config = tmp_path / "etc" / "jupyter"
    assert str(config / "jupyter_server_config.d" / "clamor.json") in out.stdout
    enabled = ExtensionConfigManager(read_config_path=[str(config)]).get_jpserver_extensions()
    assert enabled == {"clamor.extension": True}
    assert (tmp_path / "share" / "jupyter" / "kernels" / "clamor" / "kernel.json").exists()


def test_jupyter_server_finds_the_extension_app() -> None:
    package = ExtensionPackage(name="clamor.extension", enabled=True)
    assert package.validate()
    [point] = package.extension_points.values()
    assert point.app is not None and point.app.name == "clamor"


@pytest.mark.slow
def test_jupyter_server_extension_list_shows_it_enabled(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    path = cli.enable_server_extension(user=True)
    assert path == str(tmp_path / "jupyter_server_config.d" / "clamor.json")
    # `-m jupyter_server`, not `jupyter server`: jupyter's dispatcher runs the first
    # `jupyter-server` on PATH, which may belong to another Python.
    out = subprocess.run([sys.executable, "-m", "jupyter_server", "extension", "list"],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    text = out.stdout + out.stderr
    lines = [line for line in text.splitlines() if "clamor.extension" in line]
    assert any("enabled" in line for line in lines), text
    assert any("OK" in line for line in lines), text
