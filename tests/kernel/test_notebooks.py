"""Every notebook in notebooks/ runs end to end on the Clamor kernel, without an error.

The notebooks assert their own results; nbclient raises on the first failing cell.
Each runs with the installed "clamor" kernelspec (see kernelspec_fixture), in the
notebooks folder, with bounded per-cell and start-up timeouts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest
from clamor.kernel.run_notebook import run
from kernelspec_fixture import clamor_kernelspec  # noqa: F401 - a fixture

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_there_are_demo_notebooks_and_they_match_their_generator() -> None:
    spec = importlib.util.spec_from_file_location("make_notebooks", NOTEBOOKS / "make_notebooks.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert {p.name for p in ALL} == set(generator.NOTEBOOKS)
    for path in ALL:
        on_disk = nbformat.read(path, as_version=4)
        built = generator.build(generator.NOTEBOOKS[path.name])
        assert [c.source for c in on_disk.cells] == [c.source for c in built.cells], (
            f"{path.name} differs from notebooks/make_notebooks.py: run it again"
        )
        assert on_disk.metadata.kernelspec.name == "clamor"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_runs_without_errors(path: Path, clamor_kernelspec: str) -> None:  # noqa: F811
    nb = run(path, kernel_name=clamor_kernelspec, timeout=120)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{path.name}: {out.get('ename')}: {out.get('evalue')}"
            if out.output_type == "stream" and out.name == "stderr":
                assert "Traceback" not in out.text, f"{path.name}: {out.text}"
