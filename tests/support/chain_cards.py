"""Chain cards written out by hand, as `kernelforge capture` records them on a GPU ([chain]: the calls and their
wiring), at a model's sizes: the golden renders of the chain templates (tests/proposers/templates/test_golden.py) and
the tests that need a chain card without a capture (tests/cast/test_chains.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kernelforge_tui.cards.model import OperatorCard


def _input(name: str) -> dict[str, Any]:
    return {"path": "", "kind": "input", "input": name}


def _step(index: int, out: int = 0) -> dict[str, Any]:
    return {"path": "", "kind": "step", "step": index, "out": out}


def _scalar(value: object) -> dict[str, Any]:
    return {"path": "", "kind": "scalar", "value": value}


def _call(op: str, *args: dict[str, Any], results: int = 1) -> dict[str, Any]:
    return {"op": op, "args": [{**a, "path": f"args[{k}]"} for k, a in enumerate(args)], "results": results}


def chain_card(
    pattern: str,
    family: str,
    dtype: str,
    sizes: dict[str, int],
    inputs: dict[str, list[str]],
    calls: list[dict[str, Any]],
    output: tuple[int, int],
    y: list[str],
    kept_sum: tuple[int, int] | None = None,
) -> OperatorCard:
    """`kept_sum`: the chain writes its residual sum s (that step's result) before y."""
    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]
    outputs = {**({"s": kept_sum} if kept_sum else {}), "y": output}
    return OperatorCard.model_validate(
        {
            "name": f"{pattern}_{short}_{'x'.join(str(v) for v in sizes.values())}",
            "family": family,
            "sizes": sizes,
            "inputs": [{"name": n, "dtype": dtype, "shape": s} for n, s in inputs.items()],
            "outputs": [{"name": name, "dtype": dtype, "shape": y} for name in outputs],
            "input_sets": [{"name": "s", "seed": 1}],
            "reference": {"function": "reference.py:reference"},
            "chain": {"pattern": pattern, "steps": calls, "outputs": outputs, "rounded": True},
        }
    )


def residual_layer_norm(dtype: str, rows: int, cols: int) -> OperatorCard:
    row, col = ["rows", "cols"], ["cols"]
    calls = [
        _call("aten.add.Tensor", _input("x"), _input("r")),
        _call(
            "aten.native_layer_norm.default",
            _step(0),
            _scalar([cols]),
            _input("w"),
            _input("b"),
            _scalar(1e-5),
            results=3,
        ),
    ]
    inputs = {"x": row, "r": row, "w": col, "b": col}
    return chain_card(
        "residual_layer_norm", "layer_norm", dtype, {"rows": rows, "cols": cols}, inputs, calls, (1, 0), row
    )


def residual_rms_norm(dtype: str, rows: int, cols: int) -> OperatorCard:
    """What CUDA records: F.rms_norm as one aten._fused_rms_norm call (y, rstd)."""
    row = ["rows", "cols"]
    calls = [
        _call("aten.add.Tensor", _input("x"), _input("r")),
        _call("aten._fused_rms_norm.default", _step(0), _scalar([cols]), _input("w"), _scalar(1e-6), results=2),
    ]
    inputs = {"x": row, "r": row, "w": ["cols"]}
    return chain_card("residual_rms_norm", "rms_norm", dtype, {"rows": rows, "cols": cols}, inputs, calls, (1, 0), row)


def residual_sum_rms_norm(dtype: str, rows: int, cols: int) -> OperatorCard:
    """A Llama block's residual stream on CUDA: x + r, which the next residual add reads too, then its rms norm."""
    row = ["rows", "cols"]
    calls = [
        _call("aten.add.Tensor", _input("x"), _input("r")),
        _call("aten._fused_rms_norm.default", _step(0), _scalar([cols]), _input("w"), _scalar(1e-6), results=2),
    ]
    inputs = {"x": row, "r": row, "w": ["cols"]}
    sizes = {"rows": rows, "cols": cols}
    return chain_card("residual_sum_rms_norm", "rms_norm", dtype, sizes, inputs, calls, (1, 0), row, (0, 0))


def batch_norm_add_relu(dtype: str, n: int, c: int, hw: int, channels_last: bool) -> OperatorCard:
    """A ResNet bottleneck's last batch norm, `out += identity`, ReLU(inplace=True)."""
    laid = ["n", "hw", "c"] if channels_last else ["n", "c", "hw"]
    calls = [
        _call(
            "aten.native_batch_norm.default",
            *map(_input, ("x", "w", "b", "mean", "var")),
            _scalar(False),
            _scalar(0.1),
            _scalar(1e-5),
            results=3,
        ),
        _call("aten.add_.Tensor", _step(0), _input("r")),
        _call("aten.relu_.default", _step(1)),
    ]
    inputs = {"x": laid, **{stat: ["c"] for stat in ("w", "b", "mean", "var")}, "r": laid}
    sizes = {"n": n, "c": c, "hw": hw}
    return chain_card("batch_norm_add_relu", "elementwise", dtype, sizes, inputs, calls, (2, 0), laid)


def scale_mask_softmax(dtype: str, heads: int, seq: int) -> OperatorCard:
    """softmax(x * 0.125 + mask) over [heads, seq, seq] scores, a causal mask [seq, seq] shared by every head."""
    row = ["rows", "cols"]
    sizes = {"rows": heads * seq, "cols": seq, "mask_rows": seq, "heads": heads, "seq": seq}
    calls = [
        _call("aten.mul.Tensor", _input("x"), _scalar(0.125)),
        _call("aten.add.Tensor", _step(0), _input("mask")),
        _call("aten._softmax.default", _step(1), _scalar(-1), _scalar(False)),
    ]
    inputs = {"x": row, "mask": ["mask_rows", "cols"]}
    return chain_card("scale_mask_softmax", "softmax", dtype, sizes, inputs, calls, (2, 0), row)


def bias_gelu(dtype: str, rows: int, cols: int) -> OperatorCard:
    row = ["rows", "cols"]
    calls = [_call("aten.add.Tensor", _input("x"), _input("b")), _call("aten.gelu.default", _step(0))]
    inputs = {"x": row, "b": ["cols"]}
    return chain_card("bias_gelu", "elementwise", dtype, {"rows": rows, "cols": cols}, inputs, calls, (1, 0), row)


def group_norm_silu(dtype: str, n: int, c: int, hw: int, groups: int) -> OperatorCard:
    nchw = ["n", "c", "h", "w"]
    sizes = {"n": n, "c": c, "h": hw, "w": hw, "groups": groups}
    calls = [
        _call(
            "aten.native_group_norm.default",
            _input("x"),
            _input("gamma"),
            _input("beta"),
            _scalar(n),
            _scalar(c),
            _scalar(hw * hw),
            _scalar(groups),
            _scalar(1e-5),
            results=3,
        ),
        _call("aten.silu.default", _step(0)),
    ]
    inputs = {"x": nchw, "gamma": ["c"], "beta": ["c"]}
    return chain_card("group_norm_silu", "group_norm", dtype, sizes, inputs, calls, (1, 0), nchw)


def chain_cards() -> Iterator[OperatorCard]:
    """Each chain template's cards: a decoder's and a diffusion block's sizes in bf16, small ones in fp32."""
    yield residual_layer_norm("bfloat16", 16384, 4096)
    yield residual_layer_norm("float32", 96, 40)
    yield residual_rms_norm("bfloat16", 16384, 4096)
    yield residual_sum_rms_norm("bfloat16", 2048, 2048)
    yield batch_norm_add_relu("bfloat16", 32, 256, 56 * 56, channels_last=True)
    yield batch_norm_add_relu("float32", 2, 8, 36, channels_last=False)
    yield scale_mask_softmax("bfloat16", 32, 1024)
    yield scale_mask_softmax("float32", 4, 24)
    yield bias_gelu("bfloat16", 16384, 4096)
    yield bias_gelu("float32", 6, 20)
    yield group_norm_silu("bfloat16", 4, 512, 64, 32)
    yield group_norm_silu("float32", 2, 16, 6, 4)
