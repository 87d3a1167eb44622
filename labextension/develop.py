"""Install the prebuilt JupyterLab extension into a Jupyter data directory (editable installs).

A wheel ships the extension as data (pyproject.toml's data-files put it in
``{sys.prefix}/share/jupyter/labextensions/clamor-jupyter-labextension``); an editable
install (``pip install -e``) copies no data files, so ``make install`` runs this instead:
it copies the build output, ``labextension/clamor_labextension``, there (each time: a
rebuild is picked up by the next ``make install``). JupyterLab then lists it as enabled.
``--link`` links it instead, as ``jupyter labextension develop`` does, so a rebuild needs
no reinstall; but jupyter-server before 2.11 or so refuses (403) to serve files through a
link that leads out of the labextensions directory, so copying is the default.

    python labextension/develop.py [--sys-prefix | --user | --prefix P] [--link] [--remove]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

NAME = "clamor-jupyter-labextension"
BUILT = Path(__file__).resolve().parent / "clamor_labextension"


def destination(prefix: str | None = None, user: bool = False) -> Path:
    """Where JupyterLab looks for the extension: ``PREFIX/share/jupyter/labextensions/NAME``
    (``sys.prefix`` by default) or, with ``user``, the user's Jupyter data directory."""
    if user:
        from jupyter_core.paths import jupyter_data_dir

        return Path(jupyter_data_dir()) / "labextensions" / NAME
    return Path(prefix or sys.prefix) / "share" / "jupyter" / "labextensions" / NAME


def install(dest: Path, link: bool = False) -> Path:
    """Copy (or link) the build output to ``dest``, replacing what is there."""
    if not (BUILT / "package.json").is_file() or not (BUILT / "install.json").is_file():
        raise SystemExit(f"{BUILT} is not built: run `make labextension` (npm ci, then the build)")
    remove(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if link:
        dest.symlink_to(BUILT, target_is_directory=True)
    else:
        shutil.copytree(BUILT, dest)
    return dest


def remove(dest: Path) -> None:
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.is_dir():
        shutil.rmtree(dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sys-prefix", action="store_true", help=f"into {sys.prefix} (the default)")
    where.add_argument("--user", action="store_true", help="into the user's Jupyter data directory")
    where.add_argument("--prefix", metavar="P", help="into P/share/jupyter/labextensions")
    parser.add_argument("--link", action="store_true", help="link instead of copying")
    parser.add_argument("--remove", action="store_true", help="remove it from there instead")
    args = parser.parse_args(argv)
    dest = destination(args.prefix, args.user)
    if args.remove:
        remove(dest)
        print(f"removed {dest}")
    else:
        print(f"{'linked' if args.link else 'copied'} {install(dest, args.link)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
