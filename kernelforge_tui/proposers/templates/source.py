"""The templates' CUDA files (cuda/*.cu, cuda/*.cuh) and their renderer, kernelforge_tui.cuda_files, which says how
a file's `$name`s, `//@if` pieces and `#include "NAME.cuh"`s render."""

from __future__ import annotations

from kernelforge_tui.cuda_files import CudaFiles, Value

CUDA = CudaFiles(__package__)
render = CUDA.render

__all__ = ["CUDA", "Value", "render"]
