"""The package's CUDA files (the templates', the suite's baselines, the captured cards' baselines): the renderer's
directives do what kernelforge_tui/cuda_files.py says, and the wheel carries every file, so an installed package
renders what a checkout renders."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest

from kernelforge_tui.capture.baselines import CUDA as CAPTURE
from kernelforge_tui.cuda_files import CudaFiles
from kernelforge_tui.proposers.templates.source import CUDA as TEMPLATES
from kernelforge_tui.suite.task import BASELINES
from tests.conftest import ROOT

PACKAGES = (TEMPLATES, BASELINES, CAPTURE)
FILES = {
    "piece.cuh": "//@ a note\n__device__ __forceinline__ float twice(float v) { return $k * v; }\n",
    "kernel.cu": (
        '// $what costs $$1\n#include "piece.cuh"\n//@if fast\n#define FAST 1\n//@else\n#define FAST 0\n//@end\n'
        "#define K $k\n"
    ),
    "nested.cu": 'if (x) {\n    #include "piece.cuh"\n}\n#include "common.cuh"\n',
    "open.cu": "//@if fast\nx\n",
}


class FakeFiles(CudaFiles):
    """Files held in memory, for the renderer's own tests."""

    def __init__(self, texts: dict[str, str], shared: CudaFiles | None = None) -> None:
        super().__init__("fake", shared)
        self.texts = texts

    def names(self) -> list[str]:
        return sorted(self.texts)

    def read(self, name: str) -> str:
        return self.texts[name]


FAKE = FakeFiles(FILES, shared=FakeFiles({"common.cuh": "#define COMMON $k\n"}))


def test_a_render_fills_values_picks_pieces_includes_and_drops_notes() -> None:
    assert FAKE.render("kernel.cu", what="a copy", k=2, fast=True) == (
        "// a copy costs $1\n__device__ __forceinline__ float twice(float v) { return 2 * v; }\n#define FAST 1\n"
        "#define K 2\n"
    )
    assert "#define FAST 0\n" in FAKE.render("kernel.cu", what="x", k=2, fast=False)


def test_an_include_is_indented_as_its_line_and_found_in_the_shared_files() -> None:
    assert FAKE.render("nested.cu", k=3) == (
        "if (x) {\n    __device__ __forceinline__ float twice(float v) { return 3 * v; }\n}\n#define COMMON 3\n"
    )


def test_a_missing_value_or_an_open_piece_raises() -> None:
    with pytest.raises(KeyError, match="what"):
        FAKE.render("kernel.cu", k=2, fast=True)
    with pytest.raises(ValueError, match="without its //@end"):
        FAKE.render("open.cu", fast=True)


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
    shipped = {f"{p.package.replace('.', '/')}/cuda/{name}" for p in PACKAGES for name in p.names()}
    assert all(any(name.endswith(".cu") for name in p.names()) for p in PACKAGES)
    assert shipped <= names
    assert "kernelforge_tui/cast/cpp/launcher.cpp" in names  # the compiled launcher is built from the installed file
    code = (
        "import sys; from kernelforge_tui.cuda_files import CudaFiles; import kernelforge_tui as k; print(k.__file__); "
        "print(''.join(CudaFiles(p).read(n) for p, n in zip(sys.argv[1::2], sys.argv[2::2])), end='')"
    )
    env = os.environ | {"PYTHONPATH": str(tmp_path / "site")}
    ordered = [(p, name) for p in PACKAGES for name in p.names()]
    arguments = [text for p, name in ordered for text in (p.package, name)]
    found = subprocess.run([sys.executable, "-c", code, *arguments], cwd=tmp_path, env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert found.returncode == 0, found.stderr[-2000:]
    where, text = found.stdout.split("\n", 1)
    assert Path(where).is_relative_to(tmp_path / "site")
    assert text == "".join(p.read(name) for p, name in ordered)


def test_every_cuda_file_is_rendered_by_its_package_or_included_by_another_file() -> None:
    """No file left behind by a move: each is named by its package's modules or included by another file."""
    cuda = "".join(p.read(name) for p in PACKAGES for name in p.names())
    unused = []
    for p in PACKAGES:
        python = "".join(f.read_text() for f in files(p.package).iterdir() if f.name.endswith(".py"))
        unused += [f"{p.package}: {name}" for name in p.names() if f'"{name}"' not in python + cuda]
    assert unused == []
