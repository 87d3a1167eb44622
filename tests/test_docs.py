"""The documentation that ships with the code (docs/*.md) stays true: its examples run.

The fences of a page, by their language:

- ```` ```python ````: **runnable**. Every such block of a page is run, in page order,
  each as a script in a fresh interpreter (an example must be complete: its imports,
  its own cluster), all in one temporary working directory per page, so a later block
  may read what an earlier one wrote (a checkpoint, then its restore "in a fresh
  process"). Each must finish in ``BLOCK_TIMEOUT`` seconds and exit with status 0;
  examples use small clusters and small data to stay fast.
- ```` ```python ```` right after a line ``<!-- not run: REASON -->``: shown only, for
  what this machine cannot do (SSH hosts, a Slurm cluster); it must still compile.
- ```` ```ipython ````: notebook cells (``%%clamor`` magics). Skipped by design: they
  need a kernel; ``tests/kernel/`` runs the magics and the notebooks for real.
- anything else (``bash``, ``text``...): not run.

The expected output written in comments is for the reader; where it matters, the
example prints something the test checks (``EXPECTED`` below).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = ["user-guide.md", "paging.md", "deployment.md"]
BLOCK_TIMEOUT = 120

_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(\S.*?)\s*-->\s*$")


@dataclasses.dataclass
class Block:
    page: str
    line: int
    language: str
    code: str
    not_run: str | None  # the reason, for a python block that is only shown

    @property
    def runnable(self) -> bool:
        return self.language == "python" and self.not_run is None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    text = (DOCS / page).read_text()
    found = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = _NOT_RUN.search(before)
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                           reason.group(1) if reason else None))  # fmt: skip
    return found


#: Lines each page's runnable examples must print, in this order (a check that the
#: examples do what their comments say, beyond not failing).
EXPECTED = {
    "user-guide.md": ["[0, 1]", "6", "65536", "536870912", "True False", "True", "100.0", "145.0", "0.0", "1.0",
                      "(0, 2)", "100000", "[0, 4, 16, 36, 64]", "5050", "(42, [])", "3", "45.0",
                      "[100 100 100 100 100 100 100 100 100 100]", "[0. 1. 2.]",
                      "[0.0, 500000.0, 1000000.0, 1500000.0]", "[0, 1, 4, 9, 16]", "ZeroDivisionError", "{'C': 0.1}",
                      "raised in the driver",
                      "True", "True", "2", "3 3", "stopped after 1 s", "next"],
    "paging.md": ["0.0", "1.0", "[0.0]", "True", "-0.5", "[ReadSet([(0, 1), (3, 1)])]", "32 0", "True 1000", "0",
                  "auto True False",
                  "tcp False True"],
    "deployment.md": ["[True, True]", "['worker-0.log', 'worker-1.log']", "4950"],
}  # fmt: skip


def _run(block: Block, cwd: Path) -> str:
    """Run ``block`` as a script; its output. One that runs past ``BLOCK_TIMEOUT`` is
    aborted with every thread's traceback written out (faulthandler), to say where."""
    script = cwd / f"example_line_{block.line}.py"
    script.write_text(block.code)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    with subprocess.Popen([sys.executable, script.name], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            stdout, stderr = process.communicate()
            pytest.fail(f"the example at {block} ran past {BLOCK_TIMEOUT} s:\n{stdout}\n{stderr}")
    assert process.returncode == 0, f"the example at {block} failed:\n{block.code}\n{stdout}\n{stderr}"
    return stdout


@pytest.mark.slow  # clusters in fresh interpreters: 40-120 s on 2 cores
@pytest.mark.parametrize("page", PAGES)
def test_the_runnable_examples_run(page: str, tmp_path: Path) -> None:
    runnable = [b for b in blocks(page) if b.runnable]
    printed: list[str] = []
    for block in runnable:
        printed += _run(block, tmp_path).splitlines()
    missing, at = [], 0
    for line in EXPECTED[page]:
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            missing.append(line)
    assert missing == [], f"{page}: not printed (in order): {missing}\nprinted: {printed}"


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_compiles_and_says_why_it_is_not_run(page: str) -> None:
    for block in blocks(page):
        if block.language == "python":
            compile(block.code, str(block), "exec")
        if block.not_run is not None:
            assert block.language == "python", f"{block}: only python blocks are marked 'not run'"


def test_the_extractor_finds_the_kinds_of_block() -> None:
    guide = blocks("user-guide.md")
    assert sum(b.runnable for b in guide) >= 8
    assert any(b.language == "ipython" and "%%clamor map" in b.code for b in guide)
    assert {b.language for b in blocks("deployment.md")} >= {"python", "bash"}
    assert any(b.not_run for b in blocks("deployment.md"))


def test_the_readme_links_the_docs() -> None:
    readme = (REPO / "README.md").read_text()
    for page in [*PAGES, "architecture.md"]:
        assert f"docs/{page}" in readme, page
        assert (DOCS / page).exists()


def test_the_paging_page_lists_every_transport() -> None:
    from clamor.runtime.paging.pager import TRANSPORTS

    text = (DOCS / "paging.md").read_text()
    assert all(f'`"{t}"`' in text for t in TRANSPORTS), TRANSPORTS


def test_the_size_forms_the_guide_promises() -> None:
    from clamor.runtime.paging.arena import to_bytes

    assert to_bytes("256KiB", "x") == to_bytes("256K", "x") == to_bytes("256KB", "x") == 262144
    assert to_bytes("4GiB", "x") == 4 << 30 and to_bytes(1048576, "x") == 1048576
    with pytest.raises(ValueError):
        to_bytes("1.5GiB", "x")
    assert '`"256KiB"`, `"256K"` and `"256KB"` are all' in (DOCS / "user-guide.md").read_text()
