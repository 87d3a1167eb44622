"""A team JupyterHub on one machine whose servers run the Clamor kernel.

    jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

Every user gets a single-user Jupyter server (JupyterLab) with the "Clamor (Python 3)"
kernel and the ``clamor.extension`` REST API and dashboards (under
``/user/NAME/clamor/``, behind the Hub's login). Where the workers run is chosen in
the notebook, not here (deploy/jupyterhub/README.md):

* per-user workers (the default): each kernel starts its own local worker processes,
  as the user, or SSH workers with ``clamor.runtime.launchers.ssh.SSHLauncher(hosts)``;
* a shared worker pool: kernels borrow workers from one Dask cluster through
  ``clamor.runtime.launchers.dask.DaskLauncher(client)``; set ``CLAMOR_HUB_POOL`` to its
  scheduler address and every server gets ``DASK_SCHEDULER_ADDRESS``, so
  ``dask.distributed.Client()`` connects to it with no arguments.

Every knob is an environment variable, so the same file serves a real team and the
test suite (tests/deploy/test_jupyterhub.py runs it on 127.0.0.1 with throw-away
users). Defaults are for a team machine:

=============================  =====================================================
CLAMOR_HUB_IP                  proxy's public address ("" = all interfaces)
CLAMOR_HUB_PORT                proxy's public port (8000)
CLAMOR_HUB_BASE_URL            URL prefix of the whole hub ("/")
CLAMOR_HUB_HUB_IP / _HUB_PORT  the Hub's own API, for the proxy and servers
                               (127.0.0.1 / 8081)
CLAMOR_HUB_PROXY_API_PORT      configurable-http-proxy's REST API on 127.0.0.1 (8001)
CLAMOR_HUB_STATE_DIR           database, cookie secret, proxy pid file
                               (/srv/jupyterhub)
CLAMOR_HUB_AUTHENTICATOR       an authenticator entry point or class: "pam"
                               (default: the machine's accounts), "native"
                               (jupyterhub-nativeauthenticator), "github" or
                               "generic-oauth" (oauthenticator), "shared-password",
                               "dummy" (tests only)
CLAMOR_HUB_PASSWORD            the password of "dummy" / "shared-password"
CLAMOR_HUB_USERS               allowed users, comma or space separated
CLAMOR_HUB_ADMINS              admin users
CLAMOR_HUB_ALLOW_ALL           1: anyone the authenticator accepts may log in
CLAMOR_HUB_SPAWNER             a spawner entry point or class: "localprocess"
                               (default: each server runs as the user's Unix
                               account), "simple" (tests only: every server runs as
                               the Hub's user, homes from CLAMOR_HUB_HOME), "systemd",
                               "docker"
CLAMOR_HUB_HOME                home directory template of "simple" ("{username}")
CLAMOR_HUB_SERVICE_TOKEN       if set: an API token for a "clamor-admin" service
                               (create users, start servers, issue tokens), for
                               scripts and tests
CLAMOR_HUB_POOL                the shared pool's Dask scheduler address (optional;
                               e.g. tcp://pool-host:8786)
CLAMOR_HUB_POOL_WORKERS        N > 0: the Hub runs the pool itself on this machine
                               (a Dask scheduler on 127.0.0.1:CLAMOR_HUB_POOL_PORT,
                               default 8786, and N Dask worker processes), as the
                               account CLAMOR_HUB_POOL_USER (required if the Hub
                               runs as root, except with the "simple" spawner)
CLAMOR_HUB_SPAWN_TIMEOUT       seconds a server may take to start (120)
CLAMOR_HUB_ENABLE_EXTENSION    0: rely on the extension's own enablement only (1)
CLAMOR_HUB_SERVER_ARGS         extra single-user server arguments (shell syntax)
=============================  =====================================================

Clamor needs userfaultfd: users other than root need ``sysctl
vm.unprivileged_userfaultfd=1`` on this machine (the README says why and how).
"""

from __future__ import annotations

import os
import re
import shlex
import sys

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file


def _env(name: str, default: str = "") -> str:
    """``CLAMOR_HUB_<name>``, stripped, or ``default`` when unset or empty."""
    return os.environ.get(f"CLAMOR_HUB_{name}", "").strip() or default


def _names(name: str) -> set[str]:
    """A comma- or space-separated list of user names."""
    return {n for n in re.split(r"[\s,]+", _env(name)) if n}


def _flag(name: str, default: bool) -> bool:
    return _env(name, "1" if default else "0").lower() in {"1", "true", "yes", "on"}


def _port(name: str, default: int) -> int:
    value = _env(name, str(default))
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"CLAMOR_HUB_{name} must be a TCP port number, not {value!r}")
    return int(value)


# --- network: the proxy faces users; the Hub API and the proxy API stay local ---
ip = _env("IP")
prefix = _env("BASE_URL").strip("/")
base_url = f"/{prefix}/" if prefix else "/"
c.JupyterHub.bind_url = f"http://{ip}:{_port('PORT', 8000)}{base_url}"
c.JupyterHub.hub_bind_url = f"http://{_env('HUB_IP', '127.0.0.1')}:{_port('HUB_PORT', 8081)}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{_port('PROXY_API_PORT', 8001)}"
# For HTTPS on a real team machine, either put the hub behind a TLS-terminating
# reverse proxy, or:  c.JupyterHub.ssl_cert = "/etc/letsencrypt/.../fullchain.pem"
#                     c.JupyterHub.ssl_key = "/etc/letsencrypt/.../privkey.pem"

# --- state: the database, the cookie secret and the proxy's pid file ---
state = os.path.abspath(_env("STATE_DIR", "/srv/jupyterhub"))
os.makedirs(state, mode=0o700, exist_ok=True)
c.JupyterHub.db_url = f"sqlite:///{os.path.join(state, 'jupyterhub.sqlite')}"
c.JupyterHub.cookie_secret_file = os.path.join(state, "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = os.path.join(state, "jupyterhub-proxy.pid")
c.JupyterHub.cleanup_servers = True  # stopping the Hub stops every server (and kernel)

# --- who may log in ---
c.JupyterHub.authenticator_class = _env("AUTHENTICATOR", "pam")
password = _env("PASSWORD")
if password:
    c.DummyAuthenticator.password = password
    c.SharedPasswordAuthenticator.user_password = password
c.Authenticator.allowed_users = _names("USERS")
c.Authenticator.admin_users = _names("ADMINS")
c.Authenticator.allow_all = _flag("ALLOW_ALL", False)
# A team without Unix accounts on the machine:
#   CLAMOR_HUB_AUTHENTICATOR=native (pip install jupyterhub-nativeauthenticator): users
#   sign up on the hub, an admin authorizes them:
#     c.NativeAuthenticator.open_signup = False
#   or OAuth (pip install oauthenticator), e.g. CLAMOR_HUB_AUTHENTICATOR=github:
#     c.GitHubOAuthenticator.oauth_callback_url = "https://hub.example.org/hub/oauth_callback"
#     c.GitHubOAuthenticator.client_id = os.environ["OAUTH_CLIENT_ID"]
#     c.GitHubOAuthenticator.client_secret = os.environ["OAUTH_CLIENT_SECRET"]
#     c.GitHubOAuthenticator.allowed_organizations = {"my-team"}
# With the default "localprocess" spawner every hub user must also be a Unix account
# here (LocalGitHubOAuthenticator etc. can create them: create_system_users = True);
# otherwise use a spawner with its own isolation ("docker", or "systemd" with
# dynamic users).
# Nobody but admins may log in until CLAMOR_HUB_USERS or CLAMOR_HUB_ALLOW_ALL is set.

# --- an API token for automation (and the tests): the "clamor-admin" service ---
services: list[dict] = []
roles: list[dict] = []
service_token = _env("SERVICE_TOKEN")
if service_token:
    services.append({"name": "clamor-admin", "api_token": service_token})
    roles.append({
        "name": "clamor-admin",
        "description": "create users, start and stop their servers, issue their tokens",
        "scopes": ["admin:users", "admin:servers", "tokens"],
        "services": ["clamor-admin"],
    })  # fmt: skip

# --- the single-user servers ---
spawner = _env("SPAWNER", "localprocess")
c.JupyterHub.spawner_class = spawner
c.Spawner.default_url = "/lab"
timeout = int(_env("SPAWN_TIMEOUT", "120"))
c.Spawner.start_timeout = timeout
c.Spawner.http_timeout = timeout
# The servers (and so the kernels and the local workers) keep the arena settings of
# the Hub's environment, and JUPYTER_PATH for a shared kernelspec directory.
c.Spawner.env_keep = [
    # LocalProcessSpawner's defaults (setting env_keep replaces them), then Clamor's
    "CONDA_DEFAULT_ENV", "CONDA_ROOT", "JUPYTERHUB_SINGLEUSER_APP", "LANG", "LC_ALL",
    "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "VIRTUAL_ENV",
    "JUPYTER_PATH", "JUPYTER_CONFIG_PATH",
    "CLAMOR_ARENA_SIZE", "CLAMOR_PAGE_SIZE", "CLAMOR_LOG_LEVEL", "CLAMOR_WORKERS",
]  # fmt: skip

# --- the shared worker pool (optional): a Dask cluster the kernels borrow workers from ---
spawner_is_simple = spawner in {"simple", "jupyterhub.spawner.SimpleLocalProcessSpawner"}
pool = _env("POOL")
pool_workers = int(_env("POOL_WORKERS", "0"))
if pool_workers > 0:
    # The Hub runs the pool itself, as two managed services on this machine.
    pool_port = _port("POOL_PORT", 8786)
    pool = pool or f"tcp://127.0.0.1:{pool_port}"
    pool_user = _env("POOL_USER")
    if os.geteuid() == 0 and not pool_user and not spawner_is_simple:
        raise ValueError(
            "CLAMOR_HUB_POOL_WORKERS: the Hub runs as root, so the pool would too and every "
            "user could run code as root through it; set CLAMOR_HUB_POOL_USER to an "
            "unprivileged account to run the pool as"
        )
    python = _env("POOL_PYTHON", sys.executable)
    pool_services = [
        {"name": "dask-pool-scheduler",
         "command": [python, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                     "--port", str(pool_port), "--no-dashboard"]},
        {"name": "dask-pool-workers",
         "command": [python, "-m", "distributed.cli.dask_worker", pool,
                     "--nworkers", str(pool_workers), "--nthreads", "1", "--host", "127.0.0.1",
                     "--no-dashboard"]},
    ]  # fmt: skip
    for service in pool_services:
        if pool_user:
            service["user"] = pool_user
    services += pool_services
if pool:  # every server (and kernel) gets it: dask.distributed.Client() connects to it
    c.Spawner.environment = {"DASK_SCHEDULER_ADDRESS": pool}
c.JupyterHub.services = services
c.JupyterHub.load_roles = roles

args: list[str] = []
if _flag("ENABLE_EXTENSION", True):
    # The package enables clamor.extension through jupyter_server_config.d; saying it
    # here too keeps the dashboards on when the servers' config path differs.
    args.append("--ServerApp.jpserver_extensions=clamor.extension=True")
# The kernel the launcher offers first; notebooks name their own kernel.
args.append("--MappingKernelManager.default_kernel_name=clamor")
if spawner_is_simple:
    # Tests only: no isolation, every server runs as the Hub's user.
    c.SimpleLocalProcessSpawner.home_dir_template = _env("HOME", "/tmp/{username}")
    if os.geteuid() == 0:
        args.append("--allow-root")
args += shlex.split(_env("SERVER_ARGS"))
c.Spawner.args = args
# Limits per user on a shared machine (enforced by "systemd" / "docker", advisory
# for "localprocess"): c.Spawner.mem_limit = "16G"; c.Spawner.cpu_limit = 4.0
# Idle servers (and their workers) can be culled with jupyterhub-idle-culler:
#   c.JupyterHub.services.append({"name": "idle-culler",
#       "command": [sys.executable, "-m", "jupyterhub_idle_culler", "--timeout=3600"]})
#   c.JupyterHub.load_roles.append({"name": "idle-culler", "services": ["idle-culler"],
#       "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]})
