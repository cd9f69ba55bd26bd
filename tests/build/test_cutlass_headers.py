"""CUTLASS/CuTe for candidates: the source check allows exactly the include tree's two roots and refuses everything it
refused before; the build adds the tree read-only (sm_90a, CUTLASS's flags) only for sources that include it; the
tree's version and hash enter those sources' cache keys; doctor says whether the headers are here."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernelforge_tui.build import cutlass_headers
from kernelforge_tui.build.cutlass_headers import ALLOWED_PATTERNS, CutlassHeaders, headers_at
from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source, included_headers
from kernelforge_tui.build.source_policy import DEFAULT_ALLOWED_INCLUDES
from kernelforge_tui.cli.doctor import cutlass_check
from tests.support.cutlass_marks import needs_cutlass
from tests.support.nvcc_marks import needs_nvcc

WITH_CUTLASS = DEFAULT_ALLOWED_INCLUDES | ALLOWED_PATTERNS
KERNEL = 'extern "C" __global__ void kf(float* y) {{ y[0] = {value}; }}\n'
ESCAPES = {
    "#include <cute/../../../etc/passwd>\n": "include-not-allowed",
    "#include <cutlass_extra/x.h>\n": "include-not-allowed",
    "#include <cstdio>\n": "include-not-allowed",
    "#include <cub/device/device_reduce.cuh>\n": "include-not-allowed",
    "#include_next <cute/tensor.hpp>\n": "directive-not-allowed",
    "#if __has_include(<cute/tensor.hpp>)\n#endif\n": "directive-not-allowed",
    "#define H <cute/tensor.hpp>\n#include H\n": "include-not-allowed",
    "#include <cute/tensor.hpp>\n__device__ void f() { void* p = malloc(4); }\n": "forbidden-call",
    "#include <cute/tensor.hpp>\n__global__ void g() {}\n__device__ void f() { g<<<1, 1>>>(); }\n": "host-launch",
}
"""A source and the rule that still refuses it with the CUTLASS roots allowed."""


def errors(source: str, allowed: frozenset[str]) -> list[tuple[int, str]]:
    found = check_source(source + KERNEL.format(value=1), "kf", allowed)
    return [(p.line, p.rule) for p in found if p.severity == "error"]


def test_the_two_roots_are_allowed_with_the_headers() -> None:
    source = "#include <cute/tensor.hpp>\n#include <cutlass/gemm/collective/collective_builder.hpp>\n"
    assert errors(source, WITH_CUTLASS) == []
    assert [rule for _, rule in errors(source, DEFAULT_ALLOWED_INCLUDES)] == ["include-not-allowed"] * 2


@pytest.mark.parametrize("source", ESCAPES)
def test_everything_refused_before_is_refused_with_the_headers(source: str) -> None:
    refused = errors(source, WITH_CUTLASS)
    assert ESCAPES[source] in {rule for _, rule in refused}
    assert set(refused) <= set(errors(source, DEFAULT_ALLOWED_INCLUDES))  # nothing new, only a legal include less


def test_without_the_headers_a_cutlass_include_says_how_to_install_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cutlass_headers, "package_root", lambda: None)
    [problem] = [
        p for p in check_source("#include <cute/tensor.hpp>\n" + KERNEL.format(value=1), "kf") if p.severity == "error"
    ]
    assert "CUTLASS/CuTe headers are not installed" in problem.message and "[cutlass]" in problem.message
    check = cutlass_check()
    assert not check.ok and "[cutlass]" in check.fix


def test_the_includes_are_read_as_the_preprocessor_reads_them() -> None:
    source = "#inc\\\nlude <cute/a.hpp>\n// #include <cutlass/b.h>\n/* c */ # include <stdint.h>\n"
    assert included_headers(source) == ["cute/a.hpp", "stdint.h"]


def fake_tree(root: Path, value: str) -> CutlassHeaders:
    """A two-root include tree whose cute/value.hpp defines KF_VALUE."""
    (root / "cute").mkdir(parents=True)
    (root / "cutlass").mkdir()
    (root / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n"
    )
    (root / "cute" / "value.hpp").write_text(f"#define KF_VALUE {value}\n")
    headers = headers_at(root)
    assert headers is not None and headers.version == "4.2.0"
    return headers


def test_the_tree_enters_the_cache_key_of_sources_that_include_it(tmp_path: Path) -> None:
    one, two = fake_tree(tmp_path / "one", "1.0f"), fake_tree(tmp_path / "two", "2.0f")
    assert one.tree_hash != two.tree_hash
    cutlass_source = "#include <cute/value.hpp>\n" + KERNEL.format(value="KF_VALUE")
    plain = KERNEL.format(value=1)

    def key(source: str, headers: CutlassHeaders | None) -> str:
        builder = Builder(nvcc="/nonexistent/nvcc", arch="sm_90", cutlass=headers, cache_dir=tmp_path / "cache")
        return asyncio.run(builder.build(source, "kf")).key

    assert key(cutlass_source, one) != key(cutlass_source, two)
    assert key(plain, one) == key(plain, two) == key(plain, None)  # other candidates' cached builds stay valid


@needs_nvcc
def test_the_sandboxed_build_reads_the_tree_for_sm_90a(tmp_path: Path) -> None:
    headers = fake_tree(tmp_path / "tree", "2.0f")
    builder = Builder(arch="sm_90", cutlass=headers, cache_dir=tmp_path / "cache")
    result = asyncio.run(builder.build("#include <cute/value.hpp>\n" + KERNEL.format(value="KF_VALUE"), "kf"))
    assert result.ok, result.log
    assert "for 'sm_90a'" in result.log
    assert builder.nvcc is not None  # a cluster worker's compile is given the run's plain arch, and targets sm_90a too
    direct = asyncio.run(
        builder.compile(builder.nvcc, "#include <cute/value.hpp>\n" + KERNEL.format(value=4), "sm_90", "k")
    )
    assert direct.ok and "for 'sm_90a'" in direct.log
    plain = asyncio.run(builder.build(KERNEL.format(value=3), "kf"))
    assert plain.ok and "for 'sm_90'" in plain.log  # a source without CUTLASS keeps the configured target
    without = Builder(arch="sm_90", cutlass=None, cache_dir=tmp_path / "cache2")
    refused = asyncio.run(without.build("#include <cute/value.hpp>\n" + KERNEL.format(value="KF_VALUE"), "kf"))
    assert refused.failure == "source check"


@needs_cutlass
def test_doctor_names_the_installed_version() -> None:
    check = cutlass_check()
    assert check.ok and "CUTLASS 4.2.0 (4.2.0.0)" in check.detail
