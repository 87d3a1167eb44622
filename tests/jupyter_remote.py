"""A small client for a running Jupyter server, and a real server for tests.

Shared by the extension tests (tests/extension/) and the JupyterHub tests
(tests/deploy/): they import it by basename after putting ``tests/`` on
``sys.path`` (pytest does that for modules next to a test; other folders do
``sys.path.insert(0, str(Path(__file__).parents[1]))``).

    with start_jupyter_server(base_url="/prefix/") as server:
        with RemoteKernel(server.url, server.token) as kernel:
            print(kernel.execute("print(1 + 1)"))              # "2\\n"
        status, body = api_get(server.url + "api/status", server.token)

:class:`RemoteKernel` talks the kernel protocol over the server's websocket
(``api/kernels/{id}/channels``, JSON messages), like a notebook front end does.
:func:`start_jupyter_server` runs ``python -m jupyter_server`` on 127.0.0.1 with
a token, a base_url, a temporary root, config and runtime directory, and stops it
with every process it started (kernels, their workers) at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import psutil
import websocket

__all__ = [
    "JupyterServer",
    "RemoteExecutionError",
    "RemoteKernel",
    "api_get",
    "api_request",
    "free_port",
    "start_jupyter_server",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class RemoteExecutionError(RuntimeError):
    """Code run in a remote kernel raised; the message holds the remote traceback."""

    def __init__(self, ename: str, evalue: str, traceback: list[str]) -> None:
        self.ename, self.evalue = ename, evalue
        self.traceback = _ANSI.sub("", "\n".join(traceback))
        super().__init__(f"{ename}: {evalue}\n{self.traceback}")


def api_request(
    url: str,
    token: str | None = None,
    method: str = "GET",
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
    follow_redirects: bool = False,
) -> tuple[int, str, dict[str, str]]:
    """``(status, body text, headers)`` of one HTTP request; ``body`` is sent as JSON.
    HTTP errors are returned, not raised; redirects are not followed unless asked."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"token {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    handlers = [] if follow_redirects else [_NoRedirect()]
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout) as reply:
            return reply.status, reply.read().decode("utf-8", "replace"), dict(reply.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace"), dict(err.headers or {})


def api_get(url: str, token: str | None = None, timeout: float = 30.0) -> tuple[int, str]:
    """``(status, body text)`` of a GET (with ``Authorization: token ...`` when given)."""
    status, text, _ = api_request(url, token, timeout=timeout)
    return status, text


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 30x comes back as an HTTPError: the caller sees it


class RemoteKernel:
    """A kernel started in a Jupyter server over REST, driven over its websocket.

    ``server_url``: the server's root with its base_url (``http://127.0.0.1:PORT/base/``);
    ``token``: an API token of the server (or a JupyterHub token for a user server).
    """

    def __init__(self, server_url: str, token: str, kernel_name: str = "clamor",
                 startup_timeout: float = 120.0) -> None:  # fmt: skip
        self.server_url = server_url if server_url.endswith("/") else server_url + "/"
        self.token = token
        self.session = uuid.uuid4().hex
        self._ws: websocket.WebSocket | None = None
        status, text, _ = api_request(
            self.server_url + "api/kernels", token, "POST", {"name": kernel_name}
        )
        if status != 201:
            raise RuntimeError(f"starting kernel {kernel_name!r} failed: HTTP {status}: {text}")
        self.kernel_id: str = json.loads(text)["id"]
        try:
            self._connect(startup_timeout)
        except BaseException:
            self.shutdown()
            raise

    # --- the websocket ---

    def _connect(self, timeout: float) -> None:
        ws_url = re.sub(r"^http", "ws", self.server_url)
        url = f"{ws_url}api/kernels/{self.kernel_id}/channels?session_id={self.session}"
        deadline = time.monotonic() + timeout
        self._ws = websocket.create_connection(
            url, header=[f"Authorization: token {self.token}"], timeout=timeout,
            suppress_origin=True,
        )  # fmt: skip
        # the kernel may still be starting: ask for its info until it answers
        while True:
            msg_id = self._send("kernel_info_request", {})
            try:
                self._wait_reply(msg_id, min(5.0, max(0.1, deadline - time.monotonic())))
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"kernel {self.kernel_id} did not answer in {timeout} s")

    def _send(self, msg_type: str, content: dict, channel: str = "shell") -> str:
        assert self._ws is not None
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "username": "test", "session": self.session,
                  "msg_type": msg_type, "version": "5.3",
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}  # fmt: skip
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content,
                   "channel": channel, "buffers": []}  # fmt: skip
        self._ws.send(json.dumps(message))
        return msg_id

    def _recv(self, deadline: float) -> dict | None:
        """The next message, or None when ``deadline`` passed."""
        assert self._ws is not None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        self._ws.settimeout(remaining)
        try:
            frame = self._ws.recv()
        except websocket.WebSocketTimeoutException:
            return None
        if isinstance(frame, bytes):
            return None  # a binary (buffers) message: nothing this client reads
        return json.loads(frame)

    def _wait_reply(self, msg_id: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while (msg := self._recv(deadline)) is not None:
            if msg.get("channel") == "shell" and msg["parent_header"].get("msg_id") == msg_id:
                return msg
        raise TimeoutError(f"no reply to {msg_id} in {timeout} s")

    # --- running code ---

    def execute(self, code: str, timeout: float = 120.0) -> str:
        """Run ``code``; its printed output and results (``text/plain``), concatenated.

        Raises :class:`RemoteExecutionError` (the remote traceback) if it raised, and
        ``TimeoutError`` (after interrupting the kernel) if it ran longer than ``timeout``.
        """
        msg_id = self._send("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,  # a request sent right after an error is not aborted (ipykernel#609)
        })  # fmt: skip
        deadline = time.monotonic() + timeout
        out: list[str] = []
        error: dict | None = None
        replied = idle = False
        while not (replied and idle):
            msg = self._recv(deadline)
            if msg is None:
                self.interrupt()
                raise TimeoutError(f"the cell did not finish in {timeout} s; output so far:\n"
                                   + "".join(out))  # fmt: skip
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if msg.get("channel") == "shell" and kind == "execute_reply":
                replied = True
                if content.get("status") == "error":
                    error = error or content
            elif kind == "stream":
                out.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                text = content.get("data", {}).get("text/plain")
                if text:
                    out.append(text + "\n")
            elif kind == "error":
                error = content
            elif kind == "status" and content.get("execution_state") == "idle":
                idle = True
        if error is not None:
            raise RemoteExecutionError(error.get("ename", "Error"), error.get("evalue", ""),
                                       error.get("traceback", []))  # fmt: skip
        return "".join(out)

    def run_notebook(self, path: str | os.PathLike, timeout: float = 600.0) -> list[str]:
        """Run every code cell of the ``.ipynb`` at ``path`` in order (in the notebook's
        directory); each cell's output. Stops at the first cell that raises."""
        notebook = json.loads(Path(path).read_text())
        folder = str(Path(path).resolve().parent)
        self.execute(f"import os as _os; _os.chdir({folder!r}); del _os", timeout=30)
        deadline = time.monotonic() + timeout
        outputs = []
        for cell in notebook.get("cells", []):
            if cell.get("cell_type") != "code":
                continue
            source = cell["source"]
            source = "".join(source) if isinstance(source, list) else source
            if not source.strip():
                continue
            outputs.append(self.execute(source, timeout=max(1.0, deadline - time.monotonic())))
        return outputs

    def interrupt(self) -> None:
        api_request(f"{self.server_url}api/kernels/{self.kernel_id}/interrupt", self.token, "POST", {})

    def shutdown(self) -> None:
        """Close the websocket and shut the kernel down (idempotent)."""
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self._ws.close()
            self._ws = None
        if self.kernel_id:
            api_request(f"{self.server_url}api/kernels/{self.kernel_id}", self.token, "DELETE",
                        timeout=60)  # fmt: skip

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


# --- a real server for tests ---


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """A ``jupyter_server`` subprocess; :attr:`url` includes the base_url."""

    def __init__(self, proc: subprocess.Popen, url: str, token: str, root_dir: Path,
                 runtime_dir: Path, log_path: Path, workdir: Path) -> None:  # fmt: skip
        self.proc, self.url, self.token = proc, url, token
        self.root_dir, self.runtime_dir, self.log_path = root_dir, runtime_dir, log_path
        self._workdir = workdir

    def log(self) -> str:
        """What the server wrote so far (stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGTERM: it shuts its kernels down), then kill whatever it
        started that is still running (kernels, workers); remove the temporary folders."""
        if self.proc.poll() is None:
            try:
                tree = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.Error:
                tree = []
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            _kill_all(tree)
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _kill_all(procs: list[psutil.Process], grace: float = 5.0) -> None:
    """Give ``procs`` ``grace`` seconds to exit on their own, then SIGKILL and reap them."""
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            for child in p.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def start_jupyter_server(
    base_url: str = "/",
    token: str | None = None,
    extensions: dict[str, bool] | None = None,
    config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    timeout: float = 60.0,
) -> JupyterServer:
    """Start ``python -m jupyter_server`` on 127.0.0.1 (a free port) and wait until it answers.

    ``extensions``: ``ServerApp.jpserver_extensions`` (default: ``clamor.extension``
    enabled, whatever the installed config says); ``config``: more JSON config for
    ``jupyter_server_config.json`` (merged per section); ``env``: more environment.
    The config and runtime directories are temporary (user config is not read), so
    kernels write their connection and registry files there. Use it as a context
    manager, or call :meth:`JupyterServer.stop`.
    """
    base_url = "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"
    token = token or uuid.uuid4().hex
    workdir = Path(tempfile.mkdtemp(prefix="clamor-jupyter-"))
    root_dir, config_dir, runtime_dir = (workdir / n for n in ("root", "config", "runtime"))
    for d in (root_dir, config_dir, runtime_dir):
        d.mkdir(mode=0o700)
    settings: dict[str, Any] = {"ServerApp": {
        "jpserver_extensions": {"clamor.extension": True, **(extensions or {})},
    }}  # fmt: skip
    for section, values in (config or {}).items():
        settings.setdefault(section, {}).update(values)
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(settings, indent=1))
    port = free_port()
    command = [
        sys.executable, "-m", "jupyter_server",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.base_url={base_url}",
        f"--ServerApp.root_dir={root_dir}", "--ServerApp.open_browser=False",
        "--ServerApp.allow_root=True", *(args or []),
    ]  # fmt: skip
    environment = {**os.environ, "JUPYTER_CONFIG_DIR": str(config_dir),
                   "JUPYTER_RUNTIME_DIR": str(runtime_dir), **(env or {})}  # fmt: skip
    environment.pop("JUPYTER_TOKEN", None)
    log_path = workdir / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                cwd=root_dir, start_new_session=True)  # fmt: skip
    server = JupyterServer(proc, f"http://127.0.0.1:{port}{base_url}", token, root_dir,
                           runtime_dir, log_path, workdir)  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited ({proc.returncode}):\n{server.log()}")
            with contextlib.suppress(OSError):
                if api_get(server.url + "api/status", token, timeout=5)[0] == 200:
                    return server
            if time.monotonic() > deadline:
                raise TimeoutError(f"jupyter server did not start in {timeout} s:\n{server.log()}")
            time.sleep(0.2)
    except BaseException:
        server.stop()
        raise


@contextlib.contextmanager
def jupyter_server(**kwargs: Any) -> Iterator[JupyterServer]:
    """:func:`start_jupyter_server` as a context manager (stops it at the end)."""
    server = start_jupyter_server(**kwargs)
    try:
        yield server
    finally:
        server.stop()
