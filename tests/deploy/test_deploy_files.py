"""The deployment recipes in deploy/ are well-formed: YAML parses and says what the
READMEs promise, the Hub config loads into a real JupyterHub application with the
settings its environment variables ask for, and the shell script is valid bash."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from jupyterhub.app import JupyterHub

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
HUB_CONFIG = DEPLOY / "jupyterhub" / "jupyterhub_config.py"


def _load_hub_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str):
    """The config JupyterHub gets from jupyterhub_config.py with ``CLAMOR_HUB_*`` = ``env``."""
    for key in [k for k in os.environ if k.startswith("CLAMOR_HUB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("CLAMOR_HUB_STATE_DIR", str(tmp_path / "state"))
    for key, value in env.items():
        monkeypatch.setenv(f"CLAMOR_HUB_{key}", value)
    app = JupyterHub()
    app.load_config_file(str(HUB_CONFIG))
    return app.config


def test_every_yaml_file_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert {f.name for f in files} >= {
        "values.yaml", "dask-gateway-values.yaml", "uffd-sysctl-daemonset.yaml"
    }  # fmt: skip
    for path in files:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert documents, f"{path} is empty"
        assert all(isinstance(d, dict) for d in documents), path


def test_the_kubernetes_values_run_clamor_in_notebooks_and_worker_pods() -> None:
    hub = yaml.safe_load((DEPLOY / "kubernetes" / "values.yaml").read_text())
    gateway = yaml.safe_load((DEPLOY / "kubernetes" / "dask-gateway-values.yaml").read_text())
    singleuser = hub["singleuser"]
    assert singleuser["image"]["name"].endswith("clamor-singleuser")
    assert gateway["gateway"]["backend"]["image"] == singleuser["image"]  # same Python + clamor
    # userfaultfd: not blocked by seccomp in either container
    notebook_sc = hub["hub"]["config"]["KubeSpawner"]["container_security_context"]
    worker_sc = gateway["gateway"]["backend"]["worker"]["extraContainerConfig"]["securityContext"]
    for sc in (notebook_sc, worker_sc):
        assert sc["seccompProfile"]["type"] in ("Unconfined", "Localhost")
        assert sc["allowPrivilegeEscalation"] is False
    # notebooks and worker pods may reach each other, through the label the gateway sets
    label = {"clamor.io/worker": "true"}
    assert repr(label)[1:-1] in gateway["gateway"]["extraConfig"]["clamor"].replace('"', "'")
    policy = singleuser["networkPolicy"]
    assert {"podSelector": {"matchLabels": label}} in policy["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": label}} in policy["egress"][0]["to"]
    # the two halves of the gateway's JupyterHub auth agree on the service
    assert "dask-gateway" in hub["hub"]["services"]
    assert gateway["gateway"]["auth"]["type"] == "jupyterhub"
    daemonset = yaml.safe_load((DEPLOY / "kubernetes" / "uffd-sysctl-daemonset.yaml").read_text())
    assert daemonset["kind"] == "DaemonSet"
    init = daemonset["spec"]["template"]["spec"]["initContainers"][0]
    assert "vm.unprivileged_userfaultfd=1" in " ".join(init["command"])


def test_the_hub_config_defaults_are_for_a_team_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = _load_hub_config(monkeypatch, tmp_path, USERS="alice, bob carol", ADMINS="alice")
    assert config.JupyterHub.authenticator_class == "pam"
    assert config.JupyterHub.spawner_class == "localprocess"
    assert config.JupyterHub.bind_url == "http://:8000/"
    assert config.JupyterHub.hub_bind_url == "http://127.0.0.1:8081"
    assert config.Authenticator.allowed_users == {"alice", "bob", "carol"}
    assert config.Authenticator.admin_users == {"alice"}
    assert config.Authenticator.allow_all is False
    assert config.JupyterHub.db_url == f"sqlite:///{tmp_path / 'state' / 'jupyterhub.sqlite'}"
    assert config.JupyterHub.services == [] and config.JupyterHub.load_roles == []
    args = config.Spawner.args
    assert "--ServerApp.jpserver_extensions=clamor.extension=True" in args
    assert "--MappingKernelManager.default_kernel_name=clamor" in args
    assert "--allow-root" not in args  # servers run as their users
    assert {"PATH", "JUPYTER_PATH", "CLAMOR_ARENA_SIZE"} <= set(config.Spawner.env_keep)


def test_the_hub_config_for_tests_and_the_shared_pool(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = _load_hub_config(
        monkeypatch, tmp_path, IP="127.0.0.1", PORT="18000", BASE_URL="team",
        AUTHENTICATOR="dummy", SPAWNER="simple", HOME=str(tmp_path / "{username}"),
        SERVICE_TOKEN="t0ken", POOL_WORKERS="3", POOL_PORT="18786",
    )  # fmt: skip
    assert config.JupyterHub.bind_url == "http://127.0.0.1:18000/team/"
    assert config.SimpleLocalProcessSpawner.home_dir_template == str(tmp_path / "{username}")
    assert ("--allow-root" in config.Spawner.args) == (os.geteuid() == 0)
    services = {s["name"]: s for s in config.JupyterHub.services}
    assert services["clamor-admin"]["api_token"] == "t0ken"
    assert config.JupyterHub.load_roles[0]["services"] == ["clamor-admin"]
    assert "--nworkers" in services["dask-pool-workers"]["command"]
    assert "tcp://127.0.0.1:18786" in services["dask-pool-workers"]["command"]
    assert config.Spawner.environment == {"DASK_SCHEDULER_ADDRESS": "tcp://127.0.0.1:18786"}


def test_the_hub_config_refuses_a_root_pool_and_bad_ports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="CLAMOR_HUB_PORT must be a TCP port"):
        _load_hub_config(monkeypatch, tmp_path, PORT="http")
    if os.geteuid() == 0:
        with pytest.raises(ValueError, match="CLAMOR_HUB_POOL_USER"):
            _load_hub_config(monkeypatch, tmp_path, POOL_WORKERS="2")
    config = _load_hub_config(monkeypatch, tmp_path, POOL_WORKERS="2", POOL_USER="daskpool")
    assert {s.get("user") for s in config.JupyterHub.services} == {"daskpool"}


def test_the_shell_scripts_are_valid_bash() -> None:
    scripts = [*DEPLOY.rglob("*.sbatch"), *(DEPLOY.parent / "runtime" / "launchers").glob("*.sbatch")]
    assert scripts
    for script in scripts:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                              check=False)  # fmt: skip
        assert done.returncode == 0, f"{script}: {done.stderr}"


def test_the_dockerfile_installs_the_kernelspec_and_the_extension() -> None:
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert "clamor.kernel.cli install-kernel --sys-prefix" in text
    assert "jupyter server extension enable --sys-prefix clamor.extension" in text
