"""A plan's tensor maps resolved against a card: the extent and strides are the tensor's, never the plan's; what the
TMA cannot take is refused at the plan's field with the fix; a plan without maps serialises as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.build.source_policy import DEFAULT_ALLOWED_INCLUDES
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.cards.plan import PlanError, load_plan, resolve

CARD = OperatorCard.model_validate(
    {
        "name": "scale_bf16",
        "family": "elementwise",
        "sizes": {"rows": 48, "cols": 1000, "odd": 999},
        "inputs": [
            {"name": "x", "dtype": "bfloat16", "shape": ["rows", "cols"]},
            {"name": "z", "dtype": "bfloat16", "shape": ["rows", "odd"]},
        ],
        "outputs": [{"name": "y", "dtype": "bfloat16", "shape": ["rows", "cols"]}],
        "input_sets": [{"name": "seed_1", "seed": 1}],
        "reference": {"kind": "numpy", "function": "reference.py:reference"},
    }
)


def plan(**map_x: Any) -> LaunchPlan:
    spec = {"tensor": "x", "box": [64, 16], "swizzle": 128} | map_x
    return LaunchPlan.model_validate(
        {"entry": "k", "grid": [1], "block": [128], "args": ["map_x", "y", "rows"], "tensor_maps": {"map_x": spec}}
    )


def test_the_map_spans_the_tensor_as_the_card_lays_it_out() -> None:
    launch = resolve(plan(box=[64, 16, 1]), CARD)
    arg = launch.args[0]
    assert (arg.kind, arg.name) == ("tensor_map", "x") and arg.tensor_map is not None
    made = arg.tensor_map
    assert (made.dims, made.strides, made.box) == ((1000, 48, 1), (2000, 96000), (64, 16, 1))
    assert (made.data_type, made.swizzle, made.l2_promotion) == (9, 3, 2)  # bf16, 128 bytes, 128 bytes
    assert made.nbytes == 48 * 1000 * 2


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"box": [64, 300]}, "tensor_maps.map_x.box", "outside 1..256"),
        ({"box": [64]}, "tensor_maps.map_x.box", "1 dims for a tensor of rank 2"),
        ({"box": [128, 16]}, "tensor_maps.map_x.box.0", "256 bytes, wider than the 128-byte swizzle"),
        ({"box": [4, 16], "swizzle": 0}, "tensor_maps.map_x.box.0", "make it a multiple of 16 bytes"),
        ({"tensor": "w"}, "tensor_maps.map_x.tensor", "'w' is not a tensor of the card"),
        ({"tensor": "z"}, "tensor_maps.map_x", "a stride of 1998 bytes"),
    ],
)
def test_what_a_tma_cannot_take_is_refused_at_its_field(changes: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(PlanError) as caught:
        resolve(plan(**changes), CARD)
    assert caught.value.field == field and words in str(caught.value)


def test_a_map_no_argument_passes_or_named_like_a_tensor_is_refused() -> None:
    unused = plan().model_copy(update={"args": ["x", "y", "rows"]})
    with pytest.raises(PlanError, match=r"\['map_x'\] are passed by no argument"):
        resolve(unused, CARD)
    clashing = LaunchPlan.model_validate(
        {"entry": "k", "grid": [1], "block": [1], "args": ["y"], "tensor_maps": {"y": {"tensor": "x", "box": [8, 1]}}}
    )
    with pytest.raises(PlanError, match="name a tensor or size of the card"):
        resolve(clashing, CARD)


def test_a_plan_file_declares_maps_and_a_plan_without_them_serialises_as_before(tmp_path: Path) -> None:
    path = tmp_path / "k.plan.toml"
    path.write_text(
        'entry = "k"\ngrid = [1]\nblock = [128]\nargs = ["map_x", "y", "rows"]\n'
        '[tensor_maps.map_x]\ntensor = "x"\nbox = [64, 16]\nswizzle = 128\n'
    )
    assert load_plan(path) == plan()
    bare = LaunchPlan(entry="k", grid=[1], block=[1], args=["x"])
    assert bare.model_dump_json() == '{"entry":"k","grid":[1],"block":[1],"shared_bytes":0,"args":["x"]}'


def test_the_source_check_wants_a_grid_constant_map_where_the_plan_passes_one() -> None:
    args = resolve(plan(), CARD).args
    head = 'extern "C" __global__ void k('
    tail = ", __nv_bfloat16* y, int rows) {}"
    good = check_source(head + "const __grid_constant__ CUtensorMap map_x" + tail, "k", DEFAULT_ALLOWED_INCLUDES, args)
    assert [p for p in good if p.severity == "error"] == []
    for wrong, words in (
        ("const CUtensorMap map_x", "declare it `const __grid_constant__ CUtensorMap map_x`"),
        ("const __nv_bfloat16* map_x", "declare it `const __grid_constant__ CUtensorMap map_x`"),
    ):
        found = check_source(head + wrong + tail, "k", DEFAULT_ALLOWED_INCLUDES, args)
        assert any(p.rule == "plan-mismatch" and words in p.message for p in found), found
    pointer_args = resolve(plan().model_copy(update={"args": ["x", "y", "rows"], "tensor_maps": {}}), CARD).args
    found = check_source(
        head + "const __grid_constant__ CUtensorMap x" + tail, "k", DEFAULT_ALLOWED_INCLUDES, pointer_args
    )
    assert any("receives one of the plan's tensor_maps" in p.message for p in found), found
