"""Whether nvcc is here: tests that build with it skip without it (CI has it, .ci/run)."""

from __future__ import annotations

import pytest

from kernelforge_tui.build.nvcc import find_nvcc

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed (CI has it)")
