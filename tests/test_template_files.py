"""The templates' CUDA files: the renderer's directives do what kernelforge_tui/proposers/templates/source.py says,
and the wheel carries every file, so an installed package renders what a checkout renders."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest

from kernelforge_tui.proposers.templates import source

from .conftest import ROOT

CUDA = files("kernelforge_tui.proposers.templates") / "cuda"
FILES = {
    "piece.cuh": "//@ a note\n__device__ __forceinline__ float twice(float v) { return $k * v; }\n",
    "kernel.cu": (
        '// $what costs $$1\n#include "piece.cuh"\n//@if fast\n#define FAST 1\n//@else\n#define FAST 0\n//@end\n'
        "#define K $k\n"
    ),
    "open.cu": "//@if fast\nx\n",
}


@pytest.fixture
def fake_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "read", FILES.__getitem__)


@pytest.mark.usefixtures("fake_files")
def test_a_render_fills_values_picks_pieces_includes_and_drops_notes() -> None:
    assert source.render("kernel.cu", what="a copy", k=2, fast=True) == (
        "// a copy costs $1\n__device__ __forceinline__ float twice(float v) { return 2 * v; }\n#define FAST 1\n"
        "#define K 2\n"
    )
    assert "#define FAST 0\n" in source.render("kernel.cu", what="x", k=2, fast=False)


@pytest.mark.usefixtures("fake_files")
def test_a_missing_value_or_an_open_piece_raises() -> None:
    with pytest.raises(KeyError, match="what"):
        source.render("kernel.cu", k=2, fast=True)
    with pytest.raises(ValueError, match="without its //@end"):
        source.render("open.cu", fast=True)


def test_the_wheel_carries_every_cuda_file_and_renders_as_the_checkout(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("kernelforge_tui-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    shipped = {f"kernelforge_tui/proposers/templates/cuda/{f.name}" for f in CUDA.iterdir()}
    assert any(name.endswith(".cu") for name in shipped) and any(name.endswith(".cuh") for name in shipped)
    assert shipped <= names
    code = (
        "import sys; import kernelforge_tui.proposers.templates.source as s; "
        "print(s.__file__); print(''.join(s.read(n) for n in sys.argv[1:]), end='')"
    )
    env = os.environ | {"PYTHONPATH": str(tmp_path / "site")}
    ordered = sorted(f.name for f in CUDA.iterdir())
    found = subprocess.run([sys.executable, "-c", code, *ordered], cwd=tmp_path, env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert found.returncode == 0, found.stderr[-2000:]
    where, text = found.stdout.split("\n", 1)
    assert Path(where).is_relative_to(tmp_path / "site")
    assert text == "".join(source.read(name) for name in ordered)


def test_every_cuda_file_is_rendered_by_some_template_or_shared_file() -> None:
    """No file left behind by a move: each is named by a template module or included by another file."""
    modules = files("kernelforge_tui.proposers.templates")
    python = "".join(f.read_text() for f in modules.iterdir() if f.name.endswith(".py"))
    cuda = "".join(f.read_text() for f in CUDA.iterdir())
    unused = [f.name for f in CUDA.iterdir() if f'"{f.name}"' not in python + cuda]
    assert unused == []
