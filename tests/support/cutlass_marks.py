"""Whether the CUTLASS/CuTe headers (the `cutlass` extra) are here: tests that need them skip without them, except
where KERNELFORGE_REQUIRE_CUTLASS is set (CI installs the headers, .ci/run), where their absence fails the run."""

from __future__ import annotations

import os

import pytest

from kernelforge_tui.build.cutlass_headers import cutlass_problem

PROBLEM = cutlass_problem()
if PROBLEM is not None and os.environ.get("KERNELFORGE_REQUIRE_CUTLASS"):
    raise RuntimeError(f"KERNELFORGE_REQUIRE_CUTLASS is set, but {PROBLEM}")

needs_cutlass = pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))
