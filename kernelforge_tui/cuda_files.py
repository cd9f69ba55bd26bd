"""The package's CUDA files (PACKAGE/cuda/*.cu, *.cuh, read through importlib.resources) and their small renderer:
the templates' kernels, the suite's baselines and the captured cards' baselines are files, never Python strings.

Why this renderer and not a C preprocessor pass: a candidate is one self-contained device-only source, built with
`nvcc -cubin` in a sandbox that sees no package file, and its text is what a run store and the GPU runs vouched
for. So the files hold the text a render gives, and the renderer only fills in what Python decides:
- what the kernel needs as a compile-time constant stays a `#define NAME $name` line of the file, and the kernel
  uses NAME (the preprocessor at build time does the rest, as `#if` does inside a kernel);
- `$name` (string.Template: `$$` is a dollar) only where a value lands in text the preprocessor cannot reach: the
  header comment, `__launch_bounds__`, a `#define`'s value, a typedef's type;
- `//@if name` ... `//@else` ... `//@end` lines keep a piece in the renders whose `name` is true and drop it from
  the others (a piece some renders lack, which an `#if` would leave in the text);
- `#include "NAME.cuh"` pastes the shared file in (rendered with the same values, each of its lines indented as
  the `#include` is; from the `shared` package's files where the package has no such file): the shared device
  pieces are `__device__ __forceinline__` functions and structs written once there, never pasted strings;
- `//@ ...` lines are notes for the reader of the file and are dropped.
A missing value or an unbalanced `//@if` raises (a file and its caller disagree: a bug, not bad input).
"""

from __future__ import annotations

import re
import textwrap
from functools import cache
from importlib.resources import files
from string import Template

Value = str | int | float | bool

_INCLUDE = re.compile(r'#include "(\w+\.cuh)"')


class CudaFiles:
    """The CUDA files of one package: `read` gives a file's text, `render` the kernel it makes with some values."""

    def __init__(self, package: str, shared: CudaFiles | None = None) -> None:
        self.package = package
        self.shared = shared

    def names(self) -> list[str]:
        """Every CUDA file of the package, sorted."""
        found = files(self.package).joinpath("cuda").iterdir()
        return sorted(f.name for f in found if f.name.endswith((".cu", ".cuh")))

    def read(self, name: str) -> str:
        """The text of one of the package's CUDA files (cuda/NAME)."""
        return _read(self.package, name)

    def render(self, name: str, /, **values: Value) -> str:
        """The file with its `//@if` pieces chosen, its shared files included and its `$name`s filled in."""
        kept: list[str] = []
        taking: list[bool] = []
        for line in self.read(name).splitlines(keepends=True):
            directive = line.strip()
            if directive.startswith("//@if "):
                taking.append(bool(values[directive.removeprefix("//@if ").strip()]))
            elif directive == "//@else":
                taking[-1] = not taking[-1]
            elif directive == "//@end":
                taking.pop()
            elif directive.startswith("//@") or not all(taking):
                continue
            elif included := _INCLUDE.fullmatch(directive):
                owner = self if self.shared is None or included[1] in self.names() else self.shared
                kept.append(textwrap.indent(owner.render(included[1], **values), line[: line.index("#")]))
            else:
                kept.append(Template(line).substitute(values))
        if taking:
            raise ValueError(f"{self.package}: cuda/{name}: an //@if without its //@end")
        return "".join(kept)


@cache
def _read(package: str, name: str) -> str:
    return (files(package) / "cuda" / name).read_text(encoding="utf-8")
