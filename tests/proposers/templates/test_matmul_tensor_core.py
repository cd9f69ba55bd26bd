"""The matmul template's tensor-core strategy (bf16/fp16 mma.sync fed by ldmatrix from a cp.async ring).

Its rules and canonical forms, its levers, the seeds (tensor cores first, on the suite's cards and the 4096^3 one),
nvcc builds of its variants without spills and within shared memory, and NumPy models of its tiling built from the
same `TensorCoreTiling` that gives the kernel its constants: every output of odd shapes written by exactly one
thread's fragment and one epilogue store, every input element copied once per K tile, and the swizzle a
permutation of each shared row under which every ldmatrix phase reads 8 distinct bank groups. That the kernels
compute the products is the GPU's to prove (no CPU stand-in runs mma.sync).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Literal

import numpy as np
import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import MAX_SHARED_BYTES, resolve
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.proposers.templates.matmul import CHUNK, MatmulParams, MatmulTemplate, TensorCoreTiling
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Precision
from tests.conftest import typed

TEMPLATE = MatmulTemplate()
SEED: Params = {
    "strategy": "tc", "bm": 128, "bn": 128, "bk": 32, "tm": 1, "tn": 1, "layout": "strided", "vec": 8, "pad": 0,
    "wm": 64, "wn": 32, "stages": 4, "swizzle": "xor", "minb": 2,
}  # fmt: skip


def card(name: str, precision: Precision | Literal["float16"] = "bfloat16", scale: int = 2**10) -> OperatorCard:
    """The suite's card; fp16 (not a suite precision) is its bf16 card with the tensors' dtype changed."""
    spec = cards.spec(task(name), "bfloat16" if precision == "float16" else precision, scale, beyond=scale > 2**22)
    if precision != "float16":
        return spec
    data = spec.model_dump()
    for tensor in [*data["inputs"], *data["outputs"]]:
        tensor["dtype"] = "float16"
    return OperatorCard.model_validate(data)


def sized(m: int, n: int, k: int, precision: Precision = "bfloat16") -> OperatorCard:
    """matrix_mul with other sizes (the template reads sizes only)."""
    return card("matrix_mul", precision).model_copy(update={"sizes": {"M": m, "N": n, "K": k}})


def tc(**changes: int | str) -> Params:
    return {**SEED, **changes}


def test_the_rules_of_the_tensor_core_strategy() -> None:
    odd = sized(100, 40, 24)
    assert TEMPLATE.problem(odd, typed(TEMPLATE, odd, tc())) is None, (
        "edges are predicated: tiles need not divide the sizes"
    )
    assert "multiples of 8" in str(TEMPLATE.problem(sized(100, 44, 24), typed(TEMPLATE, sized(100, 44, 24), tc())))
    assert "multiples of 8" in str(TEMPLATE.problem(sized(100, 40, 20), typed(TEMPLATE, sized(100, 40, 20), tc())))
    assert "k16" in str(TEMPLATE.problem(odd, typed(TEMPLATE, odd, tc(bk=8))))
    assert "does not divide block tile" in str(TEMPLATE.problem(odd, typed(TEMPLATE, odd, tc(bm=32, wm=64))))
    assert "registers" in str(TEMPLATE.problem(odd, typed(TEMPLATE, odd, tc(bn=256, wn=64, stages=3)))), (
        "8 warps of 64x64 at minb 2"
    )
    assert TEMPLATE.problem(odd, typed(TEMPLATE, odd, tc(bn=256, wn=64, stages=3, minb=1))) is None
    assert "shared memory" in str(TEMPLATE.problem(odd, typed(TEMPLATE, odd, tc(bm=256, bn=256, bk=64, wn=64, minb=1))))
    assert "at most 16" in str(TEMPLATE.problem(odd, typed(TEMPLATE, odd, tc(bm=256, bn=256, wm=32, wn=32, minb=1))))
    fp32 = sized(100, 40, 24, "float32")
    assert TEMPLATE.space(fp32)["strategy"] == ("fma",) and "bf16 or fp16" in str(
        TEMPLATE.problem(fp32, typed(TEMPLATE, fp32, tc()))
    )
    # Each strategy fixes the other's parameters, so twins compare equal.
    assert TEMPLATE.valid(odd, tc(tm=4, tn=2, layout="blocked", vec=2, pad=1)) == typed(TEMPLATE, odd, SEED)
    fma = TEMPLATE.seed_params(odd)[-1]
    assert fma["strategy"] == "fma"
    square = card("square_matrix_mul")
    assert TEMPLATE.valid(square, {**fma, "wm": 64, "stages": 4, "swizzle": "pad"}) == typed(TEMPLATE, square, fma)


def test_the_levers_reach_tensor_cores_tiles_and_stages() -> None:
    bf16 = card("square_matrix_mul")
    compute = [lever.param for lever in TEMPLATE.levers_of(bf16, "compute")]
    latency = [lever.param for lever in TEMPLATE.levers_of(bf16, "memory_latency")]
    assert compute[:5] == ["strategy", "bm", "bn", "wm", "wn"] and {"stages", "swizzle"} <= set(compute)
    assert latency[:2] == ["stages", "minb"]
    fp32 = [lever.param for lever in TEMPLATE.levers_of(card("square_matrix_mul", "float32"), "compute")]
    assert not {"strategy", "wm", "stages", "swizzle"} & set(fp32), "one value each: nothing to move"


@pytest.mark.parametrize("precision", ["bfloat16", "float32"])
def test_the_seeds_start_with_tensor_cores_at_every_scale(precision: Precision) -> None:
    specs = [card(name, precision, scale) for name in ("matrix_mul", "square_matrix_mul") for scale in cards_scales()]
    specs.append(card("square_matrix_mul", precision, 2**24))
    for spec in specs:
        seeds = TemplateProposer().seeds(spec)
        strategies = [p.params["strategy"] for p in seeds]
        if precision == "bfloat16":
            assert seeds[0].params == SEED, spec.name
            assert strategies[:5] == ["tc"] * 5 and "fma" in strategies[5:], "CUDA-core kernels stay on offer"
        else:
            assert set(strategies) == {"fma"}, spec.name
        for proposal in seeds:
            args = resolve(proposal.plan, spec).args
            errors = [e for e in check_source(proposal.source, proposal.plan.entry, args=args) if e.severity == "error"]
            assert not errors, (spec.name, proposal.params, errors)


def cards_scales() -> tuple[int, ...]:
    return (2**10, 2**22)


BUILT: list[tuple[Precision | Literal["float16"], Params]] = [
    *(("bfloat16", p) for p in TEMPLATE.seed_params(card("square_matrix_mul"))[:5]),
    ("bfloat16", tc(swizzle="pad", bk=64, stages=3)),
    ("bfloat16", tc(bm=64, bn=64, bk=16, wm=16, wn=64, stages=2, minb=1)),
    ("float16", tc()),
]
"""The tc seeds, the padded rows with the widest K tile, the thinnest warp tile with the narrowest K tile, fp16."""


def test_tensor_core_variants_build_without_spills_for_the_suite_and_4096_cards(sm90_builder: Builder) -> None:
    """A source depends on the params and dtype only (sizes are arguments), so one build serves the 2^10, 2^22 and
    4096^3 cards; each card's arguments must match it, and its plan's shared memory must resolve."""
    jobs = []
    for precision, params in BUILT:
        specs = [card(n, precision, s) for n in ("matrix_mul", "square_matrix_mul") for s in cards_scales()]
        specs.append(card("square_matrix_mul", precision, 2**24))
        assert all(TEMPLATE.valid(spec, params) == typed(TEMPLATE, spec, params) for spec in specs), params
        source = TEMPLATE.render(specs[0], typed(TEMPLATE, specs[0], params))[0]
        for spec in specs:
            assert TEMPLATE.render(spec, typed(TEMPLATE, spec, params))[0] == source
            launch = resolve(plan := TEMPLATE.render(spec, typed(TEMPLATE, spec, params))[1], spec)
            assert 0 < launch.shared_bytes <= MAX_SHARED_BYTES and launch.threads_per_block == tiling(params).threads
        jobs.append((params, source, plan, resolve(plan, specs[-1]).args))

    async def build_all() -> list[str]:
        results = await asyncio.gather(*(sm90_builder.build(s, p.entry, a) for _, s, p, a in jobs))
        problems = []
        for (params, _, plan, _), result in zip(jobs, results, strict=True):
            stats = result.ptxas.get(plan.entry)
            if not result.ok or stats is None:
                problems.append(f"{params}: {result.log[-1500:]}")
            elif stats.spill_store_bytes or stats.spill_load_bytes or stats.stack_frame_bytes:
                problems.append(f"{params}: spills {stats}")
            elif stats.shared_bytes or stats.registers > tiling(params).register_budget(int(params["minb"])):
                problems.append(f"{params}: static shared or registers over the budget {stats}")
        return problems

    assert asyncio.run(build_all()) == []


# -- NumPy models of the tiling -------------------------------------------------------------------------------------


def tiling(params: Params) -> TensorCoreTiling:
    return TensorCoreTiling.of(MatmulParams.model_validate(params))


def test_the_source_takes_its_constants_from_the_tiling() -> None:
    """The models below read `TensorCoreTiling`; the kernel must be built from the same numbers."""
    for params in (tc(), tc(swizzle="pad", bk=16, bn=32, wn=16, wm=32, bm=64)):
        t = tiling(params)
        source, plan = TEMPLATE.render(card("matrix_mul"), typed(TEMPLATE, card("matrix_mul"), params))
        defines = dict(re.findall(r"#define (\w+) (\d+)\n", source))
        a_shift, a_mask = t.xor_bits(t.bk // CHUNK)
        b_shift, b_mask = t.xor_bits(t.bn // CHUNK)
        expected = {
            "BM": t.bm, "BN": t.bn, "BK": t.bk, "WM": t.wm, "WN": t.wn, "WARPS_N": t.warps_n, "MI": t.mi,
            "NI": t.ni, "STAGES": t.stages, "THREADS": t.threads, "A_STRIDE": t.a_stride, "B_STRIDE": t.b_stride,
            "C_STRIDE": t.c_stride, "A_SHIFT": a_shift, "A_MASK": a_mask, "B_SHIFT": b_shift, "B_MASK": b_mask,
        }  # fmt: skip
        assert {k: int(defines[k]) for k in expected} == expected
        assert plan.shared_bytes == t.shared_bytes(2) and plan.block == [t.threads]


ODD_SHAPES = [(100, 40, 24), (1, 8, 8), (129, 264, 40), (64, 32, 16)]
TILINGS = [tc(), tc(bm=64, bn=64, wm=32, wn=32, bk=16), tc(bm=32, bn=256, wm=16, wn=64, bk=64, minb=1)]


def grid_of(t: TensorCoreTiling, m: int, n: int) -> list[tuple[int, int]]:
    return list(itertools.product(range(-(-m // t.bm)), range(-(-n // t.bn))))


@pytest.mark.parametrize("params", TILINGS, ids=lambda p: f"{p['bm']}x{p['bn']}x{p['bk']}")
def test_every_output_of_odd_shapes_is_one_fragment_and_one_store(params: Params) -> None:
    """mma m16n8k16's C fragment: lane l holds (l/4, 2(l%4)+{0,1}) and the same 8 rows down, of each of a warp's
    mi x ni tiles; warps lie warps_n to a row of warps. The epilogue's 16-byte chunks cover C's tile."""
    t = tiling(params)
    lane = np.arange(32)
    for m, n, _ in ODD_SHAPES:
        fragments = np.zeros((m, n), int)
        stores = np.zeros((m, n), int)
        for by, bx in grid_of(t, m, n):
            for warp in range(t.threads // 32):
                top, left = by * t.bm + warp // t.warps_n * t.wm, bx * t.bn + warp % t.warps_n * t.wn
                for i, j, half, pair in itertools.product(range(t.mi), range(t.ni), (0, 8), (0, 1)):
                    rows = top + i * 16 + lane // 4 + half
                    cols = left + j * 8 + lane % 4 * 2 + pair
                    keep = (rows < m) & (cols < n)
                    np.add.at(fragments, (rows[keep], cols[keep]), 1)
            chunks = np.arange(t.bm * t.bn // CHUNK)
            rows, cols = by * t.bm + chunks // (t.bn // CHUNK), bx * t.bn + chunks % (t.bn // CHUNK) * CHUNK
            keep = (rows < m) & (cols < n)
            for e in range(CHUNK):
                np.add.at(stores, (rows[keep], cols[keep] + e), 1)
        assert (fragments == 1).all() and (stores == 1).all(), (m, n, params)


@pytest.mark.parametrize("params", TILINGS, ids=lambda p: f"{p['bm']}x{p['bn']}x{p['bk']}")
def test_every_input_element_is_copied_once_per_k_tile_and_the_rest_is_zero_filled(params: Params) -> None:
    t = tiling(params)
    for m, n, k in ODD_SHAPES:
        a_copies, b_copies = np.zeros((m, k), int), np.zeros((k, n), int)
        for kt in range(-(-k // t.bk)):
            a_chunk = np.arange(t.bm * t.bk // CHUNK)
            a_rows, a_cols = a_chunk // (t.bk // CHUNK), kt * t.bk + a_chunk % (t.bk // CHUNK) * CHUNK
            b_chunk = np.arange(t.bk * t.bn // CHUNK)
            b_rows, b_cols = kt * t.bk + b_chunk // (t.bn // CHUNK), b_chunk % (t.bn // CHUNK) * CHUNK
            for by, bx in grid_of(t, m, n):
                if bx == 0:
                    keep = (by * t.bm + a_rows < m) & (a_cols < k)
                    for e in range(CHUNK):
                        np.add.at(a_copies, (by * t.bm + a_rows[keep], a_cols[keep] + e), 1)
                if by == 0:
                    keep = (b_rows < k) & (bx * t.bn + b_cols < n)
                    for e in range(CHUNK):
                        np.add.at(b_copies, (b_rows[keep], bx * t.bn + b_cols[keep] + e), 1)
        assert (a_copies == 1).all() and (b_copies == 1).all(), (m, n, k, params)


def bank_groups(t: TensorCoreTiling, rows: np.ndarray, chunks: np.ndarray, width: int, stride: int) -> np.ndarray:
    """The 16-byte bank group (of 8) an element offset from the kernel's `at` falls in."""
    shift, mask = t.xor_bits(width // CHUNK)
    offsets = rows * stride + ((chunks ^ ((rows >> shift) & mask)) << 3)
    groups: np.ndarray = offsets * 2 // 16 % 8
    return groups


@pytest.mark.parametrize("swizzle", ["xor", "pad"])
def test_the_shared_layouts_are_permutations_and_ldmatrix_phases_are_conflict_free(swizzle: str) -> None:
    """Every bk and bn of the space: chunk c of row r lands in its own slot of row r, and the 8 addresses of an
    ldmatrix phase (8 consecutive rows, one chunk) fall in 8 distinct bank groups, for A and for B."""
    for bk, bn in itertools.product((16, 32, 64), (16, 32, 64, 128, 256)):
        t = tiling(tc(bk=bk, bn=bn, swizzle=swizzle))
        for width, stride in ((bk, t.a_stride), (bn, t.b_stride)):
            shift, mask = t.xor_bits(width // CHUNK)
            rows, chunks = np.meshgrid(np.arange(64), np.arange(width // CHUNK), indexing="ij")
            slots = chunks ^ ((rows >> shift) & mask)
            assert (np.sort(slots, axis=1) == chunks).all(), (bk, bn, swizzle)
            for top, chunk in itertools.product(range(0, 64, 8), range(width // CHUNK)):
                phase = np.arange(top, top + 8)
                groups = bank_groups(t, phase, np.full(8, chunk), width, stride)
                assert len(set(groups.tolist())) == 8, (bk, bn, swizzle, width, top, chunk)
