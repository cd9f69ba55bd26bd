"""The torch-free parts of capture on recorded calls: fused patterns and when they must not fuse, card families and
their refusals, the expected-speedup estimate, the entry forms, fitted distributions, the manifest's version check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.capture import families, patterns, ranking
from kernelforge_tui.capture.calls import Call, Group, group_calls, link
from kernelforge_tui.capture.cards import fit
from kernelforge_tui.capture.loader import Entry
from kernelforge_tui.capture.manifest import ArgSpec, CaptureError, TensorMeta, load_capture
from kernelforge_tui.cli.capture import parse_kwargs
from kernelforge_tui.errors import BadInput


def meta(shape: list[int], dtype: str = "bfloat16", contiguous: bool = True) -> TensorMeta:
    stride = [int(np.prod(shape[k + 1 :])) for k in range(len(shape))]
    return TensorMeta(shape=shape, stride=stride, dtype=dtype, device="cpu", contiguous=contiguous)


def tensor(path: str, m: TensorMeta, source: tuple[int, int]) -> ArgSpec:
    return ArgSpec(path=path, kind="tensor", tensor=m, source=source)


def scalar(path: str, value: object) -> ArgSpec:
    return ArgSpec(path=path, kind="scalar", value=value)  # type: ignore[arg-type]


def swiglu(extra_reader: bool) -> list[Call]:
    """gate -> silu -> mul(silu, up) [-> add(silu, silu) reading the silu output a second time]."""
    m = meta([4, 8])
    calls = [
        Call(0, "aten.silu.default", [tensor("args[0]", m, (-1, 0))], [m]),
        Call(1, "aten.mul.Tensor", [tensor("args[0]", m, (0, 0)), tensor("args[1]", m, (-2, 0))], [m]),
    ]
    if extra_reader:
        calls.append(Call(2, "aten.add.Tensor", [tensor("args[0]", m, (0, 0)), tensor("args[1]", m, (1, 0))], [m]))
    link(calls)
    return calls


def test_silu_mul_fuses_only_when_the_silu_output_has_no_other_reader() -> None:
    assert patterns.find(swiglu(False)) == [("silu_mul", [0, 1])]
    assert patterns.find(swiglu(True)) == []  # the model reads silu(gate) elsewhere: fusing would lose it
    calls = swiglu(False)
    calls[0].model_outputs.add(0)
    assert patterns.find(calls) == []  # the model returns it


def rms_calls(eps: float = 1e-6, second_reader: bool = False) -> list[Call]:
    """x.float() -> pow 2 -> mean(-1, keepdim) -> add eps -> rsqrt -> mul(xf, r) -> mul(w) -> to(bf16)."""
    x, xf, row = meta([2, 3, 8]), meta([2, 3, 8], "float32"), meta([2, 3, 1], "float32")
    w = meta([8])
    calls = [
        Call(
            0,
            "aten._to_copy.default",
            [tensor("args[0]", x, (-1, 0)), ArgSpec(path="kwargs.dtype", kind="dtype", value="float32")],
            [xf],
        ),
        Call(1, "aten.pow.Tensor_Scalar", [tensor("args[0]", xf, (0, 0)), scalar("args[1]", 2)], [xf]),
        Call(
            2, "aten.mean.dim", [tensor("args[0]", xf, (1, 0)), scalar("args[1]", [-1]), scalar("args[2]", True)], [row]
        ),
        Call(3, "aten.add.Tensor", [tensor("args[0]", row, (2, 0)), scalar("args[1]", eps)], [row]),
        Call(4, "aten.rsqrt.default", [tensor("args[0]", row, (3, 0))], [row]),
        Call(5, "aten.mul.Tensor", [tensor("args[0]", xf, (0, 0)), tensor("args[1]", row, (4, 0))], [xf]),
        Call(6, "aten.mul.Tensor", [tensor("args[0]", w, (-2, 0)), tensor("args[1]", xf, (5, 0))], [xf]),
        Call(
            7,
            "aten._to_copy.default",
            [tensor("args[0]", xf, (6, 0)), ArgSpec(path="kwargs.dtype", kind="dtype", value="bfloat16")],
            [x],
        ),
    ]
    if second_reader:
        calls.append(Call(8, "aten.sum.default", [tensor("args[0]", row, (4, 0))], [meta([], "float32")]))
    link(calls)
    return calls


def test_a_decomposed_rms_norm_is_one_card() -> None:
    calls = rms_calls()
    matches = patterns.find(calls)
    assert matches == [("rms_norm", list(range(8)))]
    groups, trace = group_calls(calls, matches)
    chains = [g for g in groups if g.kind == "pattern"]
    assert len(groups) == 9 and chains == [groups[1]]  # listed after the variant of its first call
    assert [groups[g].kind for g in trace] == ["op"] * 8  # every call stays a variant of its own (eager's)
    plan = families.plan(chains[0])
    assert isinstance(plan, families.CardPlan)
    assert plan.family == "rms_norm" and plan.sizes == {"rows": 6, "cols": 8} and plan.template_problem is None
    bindings = {b.tensor: (b.step, b.path) for b in plan.bindings()}
    assert bindings == {"x": (0, "args[0]"), "w": (6, "args[0]"), "y": (7, "out[0]")}
    assert "1e-06f" in plan.source  # the baseline carries the op's eps
    assert patterns.find(rms_calls(second_reader=True)) == []  # rsqrt's output is read outside the chain
    other_eps = families.plan(group_calls(calls := rms_calls(eps=1e-5), patterns.find(calls))[0][1])
    assert isinstance(other_eps, families.CardPlan) and "eps 1e-05" in str(other_eps.template_problem)


def one(op: str, args: list[ArgSpec], outputs: list[TensorMeta | None], inplace: bool = False) -> Group:
    calls = [Call(0, op, args, outputs, inplace=inplace)]
    link(calls)
    groups, _ = group_calls(calls, [])
    return groups[0]


def test_families_and_their_refusals() -> None:
    m = meta([4, 4, 6])
    softmax = families.plan(
        one(
            "aten._softmax.default",
            [tensor("args[0]", m, (-1, 0)), scalar("args[1]", -1), scalar("args[2]", False)],
            [m],
        )
    )
    assert isinstance(softmax, families.CardPlan) and softmax.sizes == {"rows": 16, "cols": 6}
    other_dim = families.plan(
        one(
            "aten._softmax.default",
            [tensor("args[0]", m, (-1, 0)), scalar("args[1]", 1), scalar("args[2]", False)],
            [m],
        )
    )
    assert isinstance(other_dim, families.NoCard) and "the family reduces the last axis" in other_dim.reason
    strided = TensorMeta(shape=[4, 4, 6], stride=[24, 1, 4], dtype="bfloat16", device="cpu", contiguous=False)
    refused = families.plan(one("aten.relu.default", [tensor("args[0]", strided, (-1, 0))], [m]))
    assert isinstance(refused, families.NoCard) and refused.reason.startswith("non-contiguous x")
    inplace = families.plan(one("aten.relu_.default", [tensor("args[0]", m, (-1, 0))], [m], inplace=True))
    assert isinstance(inplace, families.NoCard) and inplace.reason.startswith("in-place")
    ints = meta([4, 4, 6], "int64")
    integer = families.plan(one("aten.relu.default", [tensor("args[0]", ints, (-1, 0))], [ints]))
    assert isinstance(integer, families.NoCard) and "dtype int64" in integer.reason
    alpha = families.plan(
        one(
            "aten.add.Tensor",
            [tensor("args[0]", m, (-1, 0)), tensor("args[1]", m, (-2, 0)), scalar("kwargs.alpha", 2)],
            [m],
        )
    )
    assert isinstance(alpha, families.NoCard) and "alpha" in alpha.reason
    pool = families.plan(
        one(
            "aten.mean.dim",
            [tensor("args[0]", meta([2, 3, 5, 5]), (-1, 0)), scalar("args[1]", [-1, -2]), scalar("args[2]", True)],
            [meta([2, 3, 1, 1])],
        )
    )
    assert isinstance(pool, families.CardPlan) and pool.family == "pooling" and pool.tensors[1].dims == ["n", "c", 1, 1]
    row_mean = families.plan(
        one(
            "aten.mean.dim",
            [tensor("args[0]", m, (-1, 0)), scalar("args[1]", [-1]), scalar("args[2]", True)],
            [meta([4, 4, 1])],
        )
    )
    assert isinstance(row_mean, families.NoCard) and "only NCHW planes" in row_mean.reason
    unknown = families.plan(one("aten.erfinv.default", [tensor("args[0]", m, (-1, 0))], [m]))
    assert isinstance(unknown, families.NoCard) and unknown.reason == "no card family for aten.erfinv.default"


def test_estimates() -> None:
    prior = ranking.estimate(
        family="softmax",
        op="softmax",
        pattern=False,
        per_call_us=100.0,
        card_bytes=1000,
        eager_bytes=1000,
        copy_gbps=None,
    )
    assert prior.speedup == pytest.approx(0.88 / 0.52) and prior.how.startswith("prior")
    # measured: 1 GB at 88% of 4000 GB/s takes ~284 us (+2 us floor); eager took 1000 us
    measured = ranking.estimate(
        family="softmax",
        op="softmax",
        pattern=False,
        per_call_us=1000.0,
        card_bytes=10**9,
        eager_bytes=10**9,
        copy_gbps=4000.0,
    )
    assert measured.speedup == pytest.approx(1000 / (10**9 / (0.88 * 4000 * 1e3) + 2.0))
    tiny = ranking.estimate(
        family="elementwise",
        op="add",
        pattern=False,
        per_call_us=2.5,
        card_bytes=4096,
        eager_bytes=4096,
        copy_gbps=4000.0,
    )
    assert tiny.speedup == pytest.approx(2.5 / (4096 / (0.88 * 4000 * 1e3) + 2.0))  # at the launch floor: ~1
    assert ranking.saving(0.5, 2.0) == pytest.approx(0.25) and ranking.saving(0.3, 1.0) == 0.0


def test_entries_and_kwargs() -> None:
    assert Entry.parse("build") == Entry("build") and str(Entry.parse("make:inputs")) == "make:inputs"
    with pytest.raises(BadInput, match="--entry"):
        Entry.parse("a:b:c")
    assert parse_kwargs(["size=small", "width=16", "flag=True", "shape=[2, 3]"]) == {
        "size": "small",
        "width": 16,
        "flag": True,
        "shape": [2, 3],
    }
    with pytest.raises(BadInput, match="NAME=VALUE"):
        parse_kwargs(["nothing"])


def test_fitted_distributions() -> None:
    normal, note = fit([np.array([-1.0, 1.0, 3.0])], "float32")
    assert normal.kind == "normal" and normal.mean == pytest.approx(1.0) and not note
    positive, _ = fit([np.array([0.5, 2.0]), np.array([1.0])], "bfloat16")
    assert (positive.kind, positive.low, positive.high) == ("uniform", 0.5, 2.0)
    constant, note = fit([np.ones(5)], "float32")
    assert (constant.low, constant.high) == (0.75, 1.25) and "constant" in note


def test_a_manifest_of_another_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / "capture.json").write_text(json.dumps({"format_version": 2}))
    with pytest.raises(CaptureError, match="format_version"):
        load_capture(tmp_path)
    (tmp_path / "capture.json").write_text("{")
    with pytest.raises(CaptureError, match="not readable as JSON"):
        load_capture(tmp_path)
