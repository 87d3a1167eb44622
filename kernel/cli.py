"""The ``clamor`` command: install the "Clamor (Python 3)" kernelspec for Jupyter.

    clamor install-kernel [--user | --sys-prefix | --prefix P] [--name clamor] [--no-server-extension]
    clamor uninstall-kernel [--name clamor]

The kernelspec ships as package data (``clamor/kernel/kernelspec``); installing
fills in its ``argv`` with this interpreter (``sys.executable -m clamor.kernel -f
{connection_file}``), so the kernel runs in the environment it was installed from.
Without a location option it goes to the user's Jupyter data directory.

``install-kernel`` also enables the jupyter-server extension (extension/) at the
same level (``etc/jupyter/jupyter_server_config.d/clamor.json``): a regular
install ships that file as data, an editable install (``pip install -e``) does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from importlib import resources
from pathlib import Path

from clamor.runtime.errors import MissingExtraError

try:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
except ImportError as exc:  # `pip install clamor-jupyter` alone: the runtime, no kernel
    raise MissingExtraError.of("the `clamor` command (the Jupyter kernelspec)", exc) from exc

__all__ = ["DEFAULT_NAME", "enable_server_extension", "install", "is_installed", "kernel_argv",
           "main", "uninstall"]  # fmt: skip

#: The kernel name notebooks refer to (``metadata.kernelspec.name``).
DEFAULT_NAME = "clamor"


def kernel_argv(python: str | None = None) -> list[str]:
    """The command Jupyter runs to start the kernel (``{connection_file}`` filled by Jupyter)."""
    return [python or sys.executable, "-m", "clamor.kernel", "-f", "{connection_file}"]


def install(
    name: str = DEFAULT_NAME,
    *,
    user: bool = False,
    prefix: str | None = None,
    display_name: str | None = None,
) -> str:
    """Install the kernelspec as ``name``; return the directory it was installed to.

    ``user``: the user's Jupyter data dir; ``prefix``: ``PREFIX/share/jupyter/kernels``
    (``sys.prefix`` for the current environment); neither: the system-wide location.
    An existing kernelspec of that name is replaced.
    """
    source = resources.files("clamor.kernel") / "kernelspec"
    with tempfile.TemporaryDirectory(prefix="clamor-kernelspec-") as tmp:
        for item in source.iterdir():
            if item.is_file():
                (Path(tmp) / item.name).write_bytes(item.read_bytes())
        spec_path = Path(tmp) / "kernel.json"
        spec = json.loads(spec_path.read_text())
        spec["argv"] = kernel_argv()
        if display_name:
            spec["display_name"] = display_name
        spec_path.write_text(json.dumps(spec, indent=1) + "\n")
        return KernelSpecManager().install_kernel_spec(
            tmp, kernel_name=name, user=user, prefix=prefix
        )


#: What ``jupyter_server_config.d/clamor.json`` holds (as jupyter-config/ in the repository).
SERVER_EXTENSION_CONFIG = {"ServerApp": {"jpserver_extensions": {"clamor.extension": True}}}


def enable_server_extension(*, user: bool = False, prefix: str | None = None) -> str:
    """Write ``jupyter_server_config.d/clamor.json`` (the extension enabled) into the user's
    Jupyter config dir (``user``), ``PREFIX/etc/jupyter`` or the system one; its path."""
    from jupyter_core.paths import SYSTEM_CONFIG_PATH, jupyter_config_dir

    if user:
        root = Path(jupyter_config_dir())
    elif prefix:
        root = Path(prefix) / "etc" / "jupyter"
    else:
        root = Path(SYSTEM_CONFIG_PATH[0])
    path = root / "jupyter_server_config.d" / "clamor.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(SERVER_EXTENSION_CONFIG, indent=2) + "\n")
    return str(path)


def is_installed(name: str = DEFAULT_NAME) -> bool:
    """Whether Jupyter finds kernelspec ``name`` and it runs this interpreter."""
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return False
    return spec.argv == kernel_argv()


def uninstall(name: str = DEFAULT_NAME) -> str | None:
    """Remove kernelspec ``name`` (the one Jupyter finds first); its directory, or None."""
    try:
        return KernelSpecManager().remove_kernel_spec(name)
    except NoSuchKernel:
        return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clamor",
        description="Clamor for Jupyter: cluster computing over demand-paged notebook objects.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    inst = commands.add_parser(
        "install-kernel",
        help='install the "Clamor (Python 3)" Jupyter kernelspec',
        description='Install the "Clamor (Python 3)" kernelspec, running this Python '
        f"({sys.executable}). Default location: the user's Jupyter data directory.",
    )
    where = inst.add_mutually_exclusive_group()
    where.add_argument(
        "--user", action="store_true", help="for the current user (the default)"
    )
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help=f"into this environment ({sys.prefix}/share/jupyter/kernels)",
    )
    where.add_argument("--prefix", metavar="P", help="into P/share/jupyter/kernels")
    where.add_argument(
        "--system", action="store_true", help="system-wide (e.g. /usr/local/share/jupyter)"
    )
    inst.add_argument(
        "--name", default=DEFAULT_NAME, help=f"kernel name (default: {DEFAULT_NAME})"
    )
    inst.add_argument("--display-name", help='shown in Jupyter (default: "Clamor (Python 3)")')
    inst.add_argument("--no-server-extension", action="store_true",
                      help="do not enable the jupyter-server extension (dashboards, REST API)")  # fmt: skip
    rm = commands.add_parser("uninstall-kernel", help="remove the Clamor kernelspec")
    rm.add_argument("--name", default=DEFAULT_NAME, help=f"kernel name (default: {DEFAULT_NAME})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``clamor`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "install-kernel":
        prefix = sys.prefix if args.sys_prefix else args.prefix
        user = not (args.system or prefix)
        path = install(args.name, user=user, prefix=prefix, display_name=args.display_name)
        print(f"Installed kernelspec {args.name} in {path}")
        if not args.no_server_extension:
            config = enable_server_extension(user=user, prefix=prefix)
            print(f"Enabled the jupyter-server extension clamor.extension in {config}")
        return 0
    if args.command == "uninstall-kernel":
        path = uninstall(args.name)
        if path is None:
            print(f"No kernelspec {args.name} is installed", file=sys.stderr)
            return 1
        print(f"Removed kernelspec {args.name} from {path}")
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
