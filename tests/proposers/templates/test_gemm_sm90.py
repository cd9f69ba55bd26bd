"""The Hopper CUTLASS GEMM template: which cards it reads how, what it refuses, and one real sandboxed nvcc build of
a render (sm_90a, the CUTLASS headers of the `cutlass` extra) whose cubin holds the entry the plan launches."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build import cutlass_headers
from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.build.source_policy import DEFAULT_ALLOWED_INCLUDES
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.cli.capture import template_problem
from kernelforge_tui.proposers.templates.gemm_sm90 import GemmParams, GemmSm90Template, layout_of
from kernelforge_tui.proposers.templates.proposer import template_for
from kernelforge_tui.vocabulary.evaluation import BuildResult
from tests.support.cutlass_marks import needs_cutlass
from tests.support.nvcc_marks import needs_nvcc

pytestmark = [needs_cutlass, pytest.mark.xdist_group(__name__)]  # its module fixture builds once, on one worker
TEMPLATE = GemmSm90Template()


def gemm_card(
    a: list[str],
    b: list[str],
    sizes: dict[str, int],
    *,
    bias: bool = False,
    name: str = "mm_bf16",
    dtype: str = "bfloat16",
) -> OperatorCard:
    lead = ["batch"] if "batch" in sizes else []
    inputs: list[dict[str, Any]] = [
        {"name": "a", "dtype": dtype, "shape": [*lead, *a]},
        {"name": "b", "dtype": dtype, "shape": [*lead, *b]},
    ]
    if bias:
        inputs.append({"name": "bias", "dtype": dtype, "shape": ["N"]})
    return OperatorCard.model_validate(
        {
            "name": name,
            "family": "matmul",
            "sizes": sizes,
            "inputs": inputs,
            "outputs": [{"name": "y", "dtype": dtype, "shape": [*lead, "M", "N"]}],
            "input_sets": [{"name": "seed_1", "seed": 1}],
            "reference": {"kind": "numpy", "function": "reference.py:reference"},
        }
    )


def baddbmm_card(c: list[str | int], **scalars: float) -> OperatorCard:
    """A captured baddbmm's card (capture/families.py): a [batch, M, K], b [batch, K, N], c in its broadcast, the
    call with its beta and alpha where given (`kwargs.NAME`)."""
    card = gemm_card(["M", "K"], ["K", "N"], {"batch": 8, "M": 256, "N": 128, "K": 64}, name="baddbmm_bf16")
    args: list[dict[str, Any]] = [{"path": f"args[{i}]", "kind": "input", "input": n} for i, n in enumerate("cab")]
    args += [{"path": f"kwargs.{name}", "kind": "scalar", "value": value} for name, value in scalars.items()]
    fields = card.model_dump()
    fields["inputs"].append({**fields["inputs"][0], "name": "c", "shape": c})
    return OperatorCard.model_validate({**fields, "call": {"op": "aten.baddbmm.default", "args": args}})


BADDBMM = baddbmm_card(["M", "N"], beta=0.5, alpha=2.0)
"""c [M, N], broadcast over the batch."""
LINEAR = gemm_card(["M", "K"], ["N", "K"], {"M": 2048, "N": 5632, "K": 2048}, bias=True, name="linear_gelu_bf16")
COOPERATIVE = GemmParams(
    tile_m=128, tile_n=128, tile_k=64, schedule="cooperative", swizzle=1, mainloop="cp_async", cluster_m=1, cluster_n=1
)
TMA = COOPERATIVE.but(mainloop="tma")


def test_the_card_says_each_operands_layout_by_the_order_of_its_dims() -> None:
    layout = layout_of(LINEAR)
    assert not isinstance(layout, str)
    assert (layout.a_row_major, layout.b_row_major, layout.bias, layout.activation) == (True, False, True, "gelu")
    batched = layout_of(gemm_card(["K", "M"], ["K", "N"], {"batch": 4, "M": 64, "N": 64, "K": 64}))
    assert not isinstance(batched, str)
    assert (batched.a_row_major, batched.b_row_major, batched.batched, batched.activation) == (False, True, True, "")
    # a dims order that is not a matrix product's is refused, not guessed
    assert "expects one of" in str(layout_of(gemm_card(["M", "N"], ["K", "N"], {"M": 8, "N": 8, "K": 8})))


def test_a_baddbmm_reads_beta_alpha_and_cs_broadcast_from_the_card() -> None:
    layout = layout_of(BADDBMM)
    assert not isinstance(layout, str) and layout.scaled is not None
    assert (layout.scaled.beta, layout.scaled.alpha) == (0.5, 2.0)
    assert (layout.scaled.row_stride, layout.scaled.batch_stride) == (128, 0)  # c [M, N]: every batch the same
    source, plan = TEMPLATE.render(BADDBMM, COOPERATIVE)
    for define in ("ALPHA 2.0f", "BETA 0.5f", "C_ROW_STRIDE 128", "C_BATCH_STRIDE 0", "HAS_BIAS 1"):
        assert f"#define {define}\n" in source, define
    assert plan.args == ["a", "b", "c", "y", "M", "N", "K", "batch"]
    rows = layout_of(baddbmm_card(["batch", 1, "N"]))  # c [batch, 1, N]: one row a batch, beta and alpha 1
    assert not isinstance(rows, str) and rows.scaled == rows.scaled.but(beta=1.0, alpha=1.0, row_stride=0)
    assert rows.scaled.batch_stride == 128
    unread = TEMPLATE.render(baddbmm_card(["batch", "M", "N"], beta=0.0), COOPERATIVE)
    assert "#define HAS_BIAS 0\n" in unread[0] and "c" not in unread[1].args  # beta 0: c is not read
    assert "c broadcast along N is not served" in str(TEMPLATE.unsupported(baddbmm_card(["batch", "M", 1])))
    assert "records no aten.baddbmm call" in str(TEMPLATE.unsupported(BADDBMM.model_copy(update={"call": None})))


def test_what_the_kernel_cannot_copy_is_refused_before_a_build() -> None:
    odd_k = gemm_card(["M", "K"], ["N", "K"], {"M": 64, "N": 64, "K": 100})
    assert "K = 100 is not a multiple of 8" in str(TEMPLATE.unsupported(odd_k))
    odd_n = gemm_card(["M", "K"], ["K", "N"], {"M": 64, "N": 36, "K": 64})
    assert "N = 36 is not a multiple of 8" in str(TEMPLATE.unsupported(odd_n))
    # the same N is fine where b's contiguous dim is K: tails of M, N and K are predicated by the kernel
    assert TEMPLATE.unsupported(gemm_card(["M", "K"], ["N", "K"], {"M": 1000, "N": 36, "K": 1000})) is None
    fp32 = gemm_card(["M", "K"], ["K", "N"], {"M": 64, "N": 64, "K": 64}, dtype="float32")
    assert "fp32 is the matmul template's" in str(TEMPLATE.unsupported(fp32))
    assert "tile_m >= 128" in str(TEMPLATE.problem(LINEAR, COOPERATIVE.but(tile_m=64)))
    assert "accumulators" in str(TEMPLATE.problem(LINEAR, COOPERATIVE.but(tile_m=256, tile_n=256)))
    assert TEMPLATE.problem(LINEAR, COOPERATIVE.but(schedule="pingpong", tile_m=64, tile_n=256)) is None


def test_a_render_passes_the_source_check_with_the_cutlass_root_and_only_with_it() -> None:
    source, plan = TEMPLATE.render(LINEAR, COOPERATIVE)
    launch = resolve(plan, LINEAR)
    assert launch.grid == (132, 1, 1) and launch.block == (384, 1, 1)
    assert [a.name for a in launch.args] == ["a", "b", "bias", "y", "M", "N", "K", "1"]
    allowed = DEFAULT_ALLOWED_INCLUDES | {"cute/*", "cutlass/*"}
    errors = [p for p in check_source(source, "kf_gemm", allowed, launch.args) if p.severity == "error"]
    assert errors == []
    refused = {p.rule for p in check_source(source, "kf_gemm", DEFAULT_ALLOWED_INCLUDES, launch.args)}
    assert refused == {"include-not-allowed"}
    assert "GELU" in source and "KernelCpAsyncWarpSpecializedCooperative" in source


def test_a_tma_render_passes_maps_the_plan_declares_and_a_cluster_a_2d_grid() -> None:
    source, plan = TEMPLATE.render(LINEAR, TMA.but(tile_n=256, cluster_m=2))
    launch = resolve(plan, LINEAR)
    assert [(a.kind, a.name) for a in launch.args][:3] == [("tensor_map", "a"), ("tensor_map", "b"), ("tensor", "bias")]
    assert launch.grid == (2 * min(8 * 22, 66), 1, 1)  # 8 x 22 clusters of 2 along M, at most 66 at a time
    assert TEMPLATE.render(LINEAR, TMA.but(cluster_n=2))[1].grid == ["min(cdiv(M, 128) * cdiv(N, 256) * 1, 66) * 1", 2]
    allowed = DEFAULT_ALLOWED_INCLUDES | {"cute/*", "cutlass/*"}
    assert [p for p in check_source(source, "kf_gemm", allowed, launch.args) if p.severity == "error"] == []
    assert "KernelTmaWarpSpecializedCooperative" in source and "__cluster_dims__(CLUSTER_M, CLUSTER_N, 1)" in source
    assert "__cluster_dims__" not in TEMPLATE.render(LINEAR, TMA)[0].split("#include")[-1]
    assert "TMA multicast: cp.async keeps the cluster 1x1" in str(
        TEMPLATE.problem(LINEAR, COOPERATIVE.but(cluster_m=2))
    )
    assert "1x1, 2x1 or 1x2" in str(TEMPLATE.problem(LINEAR, TMA.but(cluster_m=2, cluster_n=2)))


BUILDS = {
    "cp.async pingpong, baddbmm": (BADDBMM, COOPERATIVE.but(schedule="pingpong", tile_n=128)),
    "tma 2x1 cluster": (LINEAR, TMA.but(tile_n=256, cluster_m=2)),
}


BROKEN = "cp.async, TILE_K 40"
"""A render CUTLASS refuses (its wgmma K tile must be a multiple of 16): its first error is a static_assert in a
CUTLASS header, several instantiations below the candidate's line."""


@pytest.fixture(scope="module")
def built(cubin_cache: Path) -> dict[str, BuildResult]:
    """One sandboxed build of a cp.async render (a baddbmm's epilogue) and of a TMA render (bias and GELU), side by
    side (~30 s on two cores), and of the broken render (the front end only: ~7 s), over the session's cubin
    cache."""
    builder = Builder(arch="sm_90", cache_dir=cubin_cache, timeout_s=240)
    renders = {name: TEMPLATE.render(card, params) for name, (card, params) in BUILDS.items()}
    source, plan = TEMPLATE.render(LINEAR, COOPERATIVE)
    renders[BROKEN] = (source.replace("#define TILE_K 64", "#define TILE_K 40"), plan)

    async def all_of_them() -> list[BuildResult]:
        cards = [*(card for card, _ in BUILDS.values()), LINEAR]
        args = [resolve(plan, card).args for (_, plan), card in zip(renders.values(), cards, strict=True)]
        jobs = [builder.build(source, "kf_gemm", a) for (source, _), a in zip(renders.values(), args, strict=True)]
        return list(await asyncio.gather(*jobs))

    return dict(zip(renders, asyncio.run(all_of_them()), strict=True))


@needs_nvcc
@pytest.mark.parametrize("which", list(BUILDS))
def test_a_render_builds_for_sm90a_in_the_sandbox(built: dict[str, BuildResult], which: str) -> None:
    result = built[which]
    assert result.ok, result.log[-3000:]
    assert result.cubin_path is not None and Path(result.cubin_path).stat().st_size > 10_000
    stats = result.ptxas["kf_gemm"]
    assert stats.registers <= 168  # __launch_bounds__(384, 1): 65536 / 384, rounded down to 8
    assert "sm_90a" in result.log


@needs_nvcc
def test_cutlass_refusing_a_render_tells_the_debugger_why_at_the_candidates_line(built: dict[str, BuildResult]) -> None:
    result = built[BROKEN]
    assert not result.ok and result.failure == "compile error"
    first = next(d for d in result.diagnostics if d.severity == "error")
    assert first.file == "candidate.cu" and first.line is not None and first.source_line is not None
    assert 'static assertion failed with "Tile_K must be a multiple of 16."' in first.message
    assert first.message.startswith("in cute/arch/mma_sm90.hpp(")
    assert "instantiation of" not in result.log and len(result.log) < 2000  # the cause, not the backtrace


def test_the_template_library_serves_a_captured_product_and_says_why_not_without_cutlass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(template_for(LINEAR), GemmSm90Template)
    assert all(TEMPLATE.valid(LINEAR, seed) is not None for seed in TEMPLATE.seed_params(LINEAR))
    monkeypatch.setattr(cutlass_headers, "package_root", lambda: None)
    assert template_for(LINEAR) is None
    why = str(template_problem(LINEAR))
    assert "gemm_sm90: the CUTLASS/CuTe headers are not installed" in why and "[cutlass]" in why
