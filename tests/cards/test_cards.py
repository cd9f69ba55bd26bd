"""Operator cards: round trips, the example cards, errors that name file, field and fix, and kernels that build."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tomllib
import tracemalloc
import zipfile
from pathlib import Path
from types import ModuleType

import ml_dtypes
import numpy as np
import pytest

from kernelforge_tui.cards import CardError, load_card, plan_for_kernel, resolve, save_card
from kernelforge_tui.cards.directory import Arrays, Card, draw_inputs, to_toml
from kernelforge_tui.cards.model import (
    BaselineSpec,
    Cost,
    Distribution,
    InputSet,
    LaunchPlan,
    OperatorCard,
    OutputSpec,
    Reference,
    StressSpec,
    TensorSpec,
    Tolerance,
)
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CARDS = ROOT / "examples" / "cards"
KERNELS = ROOT / "examples" / "kernels"
CHEATS = KERNELS / "cheats"
EXAMPLE_CARDS = sorted(p.parent.name for p in CARDS.glob("*/card.toml"))
SMALL_CARDS = [name for name in EXAMPLE_CARDS if any((CARDS / name).glob("*.npz"))]
ALL_KERNELS = sorted({*CARDS.rglob("*.cu"), *KERNELS.rglob("*.cu")})


def matches(out: np.ndarray, ref: np.ndarray, tol: Tolerance) -> bool:
    """The card's rule, everywhere (the worker's, on the host)."""
    return bool(tol.accepts(out, ref).all())


def make_cards() -> ModuleType:
    return load_script(CARDS / "make_cards.py")


# --- round trip -------------------------------------------------------------------------------------


def tiny_spec(**changes: object) -> OperatorCard:
    fields: dict[str, object] = {
        "name": "tiny_rms_norm",
        "family": "rms_norm",
        "description": 'rms norm with "quotes", a back\\slash,\na second line and a tab\tand \x01 control',
        "sizes": {"rows": 3, "cols": 5},
        "inputs": [
            TensorSpec(name="x", dtype="bfloat16", shape=["rows", "cols"]),
            TensorSpec(name="w", dtype="bfloat16", shape=["cols"], distribution=Distribution(kind="uniform")),
            TensorSpec(name="idx", dtype="int32", shape=[2], distribution=Distribution(kind="randint", low=0, high=9)),
        ],
        "outputs": [
            OutputSpec(name="y", dtype="bfloat16", shape=["rows", "cols"], tolerance=Tolerance(rtol=0.02, atol=1e-6)),
            OutputSpec(name="count", dtype="int64", shape=["rows"]),
            OutputSpec(name="y32", dtype="float32", shape=["rows", "cols"]),
        ],
        "cost": Cost(flops="4 * rows * cols", bytes="4 * rows * cols + 2 * cols"),
        "input_sets": [InputSet(name="captured", file="captured.npz"), InputSet(name="fresh", seed=7)],
        "reference": Reference(function="ref.py:reference"),
        "baseline": BaselineSpec(
            plan=LaunchPlan(entry="k", grid=["rows"], block=[32], args=["x", "w", "y", "rows * cols:i64"])
        ),
        "stress": StressSpec(seed=11, skip={"tiny": 'a reason with "quotes"'}),
    }
    return OperatorCard.model_validate(fields | changes)


def tiny_arrays(spec: OperatorCard) -> tuple[Arrays, Arrays]:
    inputs = draw_inputs(spec, 3)
    rng = np.random.default_rng(5)
    outputs = {
        "y": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
        "count": np.arange(3, dtype=np.int64),
        "y32": rng.standard_normal((3, 5)).astype(np.float32),
    }
    return inputs, outputs


def write_tiny(root: Path) -> tuple[Card, Arrays, Arrays]:
    spec = tiny_spec()
    root.mkdir(parents=True, exist_ok=True)
    (root / "baseline.cu").write_text('extern "C" __global__ void k() {}\n')
    (root / "ref.py").write_text(
        "def reference(inputs, sizes):\n"
        "    x = inputs['x'].astype('float32')\n"
        "    return {'y': x, 'count': x.sum(axis=1).astype('int64') * 0, 'y32': x}\n"
    )
    inputs, outputs = tiny_arrays(spec)
    return save_card(spec, root, {"captured": (inputs, outputs)}), inputs, outputs


def test_round_trip(tmp_path: Path) -> None:
    card, inputs, outputs = write_tiny(tmp_path / "tiny")
    loaded = load_card(tmp_path / "tiny")
    assert loaded.spec == tiny_spec()
    assert card.spec == loaded.spec
    got_in, got_out = loaded.input_set(loaded.spec.input_sets[0])
    for name, array in [*inputs.items(), *outputs.items()]:
        got = got_in.get(name, got_out.get(name))
        assert got is not None
        assert got.dtype == array.dtype, name
        assert got.shape == array.shape, name
        assert got.tobytes() == array.tobytes(), name  # bit-identical, bf16 included
    assert got_in["x"].dtype == np.dtype(ml_dtypes.bfloat16)
    # the seed set is drawn and referenced on the fly, reproducibly
    fresh_in, fresh_out = loaded.input_set(loaded.spec.input_sets[1])
    again_in, _ = loaded.input_set(loaded.spec.input_sets[1])
    assert fresh_in["x"].tobytes() == again_in["x"].tobytes()
    assert fresh_in["idx"].dtype == np.int32 and np.all((fresh_in["idx"] >= 0) & (fresh_in["idx"] < 9))
    assert fresh_out["y"].dtype == np.dtype(ml_dtypes.bfloat16) and fresh_out["count"].dtype == np.int64


def test_saving_is_reproducible(tmp_path: Path) -> None:
    write_tiny(tmp_path / "a")
    write_tiny(tmp_path / "b")
    for name in ("card.toml", "captured.npz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_manifest_is_plain_toml(tmp_path: Path) -> None:
    write_tiny(tmp_path / "tiny")
    data = tomllib.loads((tmp_path / "tiny" / "card.toml").read_text())
    assert data["description"] == tiny_spec().description
    assert data["sizes"] == {"rows": 3, "cols": 5}


# --- the example cards ------------------------------------------------------------------------------


def test_the_example_cards_are_there() -> None:
    assert set(EXAMPLE_CARDS) >= {
        "vector_add_f32",
        "softmax_f32_4096x32768",
        "softmax_bf16_4096x32768",
        "softmax_f32_small",
        "softmax_bf16_small",
        "rms_norm_bf16_16384x4096",
        "rms_norm_bf16_small",
        "layer_norm_f32_small",
        "layer_norm_bf16_small",
    }


DRAWN_ELEMENTS = 2**24
"""Example cards of up to this many elements have a seeded set drawn and their reference run here; a larger one (a
bench card: 10-20 s of float64 reference on one core) shares its reference with a small card that does (checked)."""


def _elements(spec: OperatorCard) -> int:
    return sum(t.numel(spec.sizes) for t in [*spec.inputs, *spec.outputs])


def _checked_by_a_smaller_card(spec: OperatorCard) -> bool:
    """Whether an example card of at most DRAWN_ELEMENTS has the same reference and output dtypes (so this test runs
    that reference)."""
    kind = (spec.reference, [t.dtype for t in spec.outputs])
    others = [load_card(CARDS / name).spec for name in EXAMPLE_CARDS if name != spec.name]
    return any((s.reference, [t.dtype for t in s.outputs]) == kind and _elements(s) <= DRAWN_ELEMENTS for s in others)


@pytest.mark.parametrize("name", EXAMPLE_CARDS)
def test_example_card_loads_with_a_reference(name: str) -> None:
    card = load_card(CARDS / name)
    spec = card.spec
    assert spec.name == name
    assert spec.baseline is not None and "__global__" in card.baseline_source()
    assert spec.bytes_moved() > 0 and spec.flops() > 0
    minimum = sum(t.numel(spec.sizes) * np.dtype(np_dtype(t.dtype)).itemsize for t in [*spec.inputs, *spec.outputs])
    assert spec.bytes_moved() == minimum, "cost.bytes: every input read once, every output written once"
    resolve(spec.baseline.plan, spec)
    candidates = sorted((CARDS / name / "candidates").glob("*.cu"))
    assert candidates, "every example card has at least one hand-written candidate"
    for kernel in candidates:
        launch = resolve(plan_for_kernel(kernel), spec)
        assert re.search(rf"__global__ void (__launch_bounds__\(\d+\) )?{launch.entry}\(", kernel.read_text())
    if _elements(spec) > DRAWN_ELEMENTS and _checked_by_a_smaller_card(spec):
        return
    seed_set = next(s for s in spec.input_sets if s.seed is not None)
    inputs, outputs = card.input_set(seed_set)
    for out_spec in spec.outputs:
        out = outputs[out_spec.name]
        assert out.shape == out_spec.dims(spec.sizes)
        assert out.dtype == np_dtype(out_spec.dtype)
        assert not np.isnan(out.astype(np.float32)).any()
    for in_spec in spec.inputs:
        assert inputs[in_spec.name].shape == in_spec.dims(spec.sizes)
        assert inputs[in_spec.name].dtype == np_dtype(in_spec.dtype)


def np_dtype(name: str) -> np.dtype[np.generic]:
    from kernelforge_tui.cards.dtypes import NUMPY

    return NUMPY[name]


@pytest.mark.parametrize("name", SMALL_CARDS)
def test_stored_sets_agree_with_the_reference(name: str) -> None:
    card = load_card(CARDS / name)
    stored = [s for s in card.spec.input_sets if s.file is not None]
    assert len(stored) >= 2
    for which in stored:
        assert (CARDS / name / str(which.file)).stat().st_size < 400_000
        inputs, outputs = card.input_set(which)
        fresh = card.reference(inputs)
        for tensor in card.spec.outputs:
            assert fresh[tensor.name].tobytes() == outputs[tensor.name].tobytes()


def test_make_cards_reproduces_the_committed_small_cards(tmp_path: Path) -> None:
    module = make_cards()
    for example in module.examples():
        if example.spec.name not in SMALL_CARDS and example.spec.name != "vector_add_f32":
            continue
        module.write(example, tmp_path)
        for path in (CARDS / example.spec.name).rglob("*"):
            if path.is_file():
                twin = tmp_path / example.spec.name / path.relative_to(CARDS / example.spec.name)
                assert twin.read_bytes() == path.read_bytes(), f"{path}: re-run examples/cards/make_cards.py"


def test_softmax_tolerances_separate_fp16_math_from_fp32_math() -> None:
    """fp16 exponentials must fail the fp32 card and pass the bf16 card; a reordered fp32 sum passes."""

    def softmax_fp16_exp(x: np.ndarray) -> np.ndarray:  # the half_precision*.cu kernels' math
        x = x.astype(np.float32)
        e = np.exp((x - x.max(axis=-1, keepdims=True) + 8).astype(np.float16)).astype(np.float32)
        out: np.ndarray = e / e.sum(axis=-1, keepdims=True, dtype=np.float32)
        return out

    def softmax_reordered(x: np.ndarray) -> np.ndarray:  # float32 throughout, sums backwards
        x = x.astype(np.float32)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        out: np.ndarray = e / np.cumsum(e[:, ::-1], axis=-1, dtype=np.float32)[:, -1:]
        return out

    for name, fp16_passes in (("softmax_f32_small", False), ("softmax_bf16_small", True)):
        card = load_card(CARDS / name)
        tol = card.spec.outputs[0].effective_tolerance()
        for which in card.spec.input_sets:
            inputs, outputs = card.input_set(which)
            ref = outputs["y"]
            assert matches(softmax_fp16_exp(inputs["x"]).astype(ref.dtype), ref, tol) is fp16_passes, which.name
            assert matches(softmax_reordered(inputs["x"]).astype(ref.dtype), ref, tol), which.name


# --- malformed cards --------------------------------------------------------------------------------

GOOD = """\
name = "bad_card"
family = "softmax"

[sizes]
rows = 2
cols = 3

[[inputs]]
name = "x"
dtype = "float32"
shape = ["rows", "cols"]

[[outputs]]
name = "y"
dtype = "float32"
shape = ["rows", "cols"]

[[input_sets]]
name = "captured"
file = "captured.npz"

[reference]
function = "softmax"
"""


BASELINE = '\n[baseline]\nsource = "SOURCE"\nplan = { entry = "k", grid = [1], block = [32], args = [] }\n'


def write_card(root: Path, text: str, arrays: dict[str, np.ndarray] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "card.toml").write_text(text)
    if arrays is None:
        arrays = {"x": np.zeros((2, 3), np.float32), "y": np.zeros((2, 3), np.float32)}
    np.savez(root / "captured.npz", **arrays)  # type: ignore[arg-type]
    return root


def test_the_good_card_is_good(tmp_path: Path) -> None:
    card = load_card(write_card(tmp_path, GOOD))
    inputs, outputs = card.input_set(card.spec.input_sets[0])
    assert inputs["x"].shape == (2, 3) and outputs["y"].dtype == np.float32


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ('family = "softmax"', 'family = "softmax', None, "not valid TOML"),
        ('family = "softmax"', 'family = "softmax"\ncolour = "red"', "colour", "unknown field"),
        ('name = "bad_card"\n', "", "name", "required field is missing"),
        (
            'shape = ["rows", "cols"]\n\n[[outputs]]',
            'shape = ["rows", "depth"]\n\n[[outputs]]',
            "inputs.x.shape",
            "depth",
        ),
        ("rows = 2", "rows = 0", "sizes.rows", "not positive"),
        ("rows = 2", "rows = -3", "sizes.rows", "not positive"),
        ('name = "y"', 'name = "x"', "inputs/outputs/sizes", "names used twice"),
        ('name = "y"', 'name = "rows"', "inputs/outputs/sizes", "names used twice"),
        (
            'name = "captured"\nfile = "captured.npz"',
            'name = "captured"\nfile = "captured.npz"\n\n[[input_sets]]\nname = "captured"\nseed = 1',
            "input_sets",
            "names used twice",
        ),
        (
            'dtype = "float32"\nshape = ["rows", "cols"]\n\n[[input_sets]]',
            'dtype = "int32"\nshape = ["rows", "cols"]\ntolerance = { rtol = 1e-5, atol = 1e-8 }\n\n[[input_sets]]',
            "outputs.y.tolerance",
            "int32",
        ),
        ('file = "captured.npz"', 'file = "captured.npz"\nseed = 4', "input_sets.0", "exactly one"),
        ('file = "captured.npz"', 'file = "elsewhere.npz"', "input_sets.captured.file", "not found"),
        ('family = "softmax"', 'family = "softmax"\n\n[cost]\nbytes = "rows * depth"', "cost.bytes", "depth"),
        (
            'dtype = "float32"\nshape = ["rows", "cols"]\n\n[[outputs]]',
            'dtype = "float33"\nshape = ["rows", "cols"]\n\n[[outputs]]',
            "inputs.0.dtype",
            "",
        ),
        ('function = "softmax"', 'kind = "numpy"', "reference", "needs `function`"),
        (
            'family = "softmax"',
            'family = "softmax"\n\n[baseline]\nsource = "gone.cu"\nplan = { entry = "k", '
            "grid = [1], block = [32], args = [] }",
            "baseline.source",
            "gone.cu",
        ),
        ("rows = 2", 'rows = "2"', "sizes.rows", "'2' is a str, not an integer"),  # sizes are strict integers
        ("rows = 2", "rows = 2.0", "sizes.rows", "2.0 is a float, not an integer"),
        ("rows = 2", "rows = true", "sizes.rows", "true is a bool, not an integer"),
        ('shape = ["rows", "cols"]', 'shape = ["rows", true]', "inputs.0.shape.1", "true is a bool"),
        ('file = "captured.npz"', "seed = 1.0", "input_sets.0.seed", "1.0 is a float"),
        (
            'dtype = "float32"',
            'dtype = "float32"\ndistribution = { std = -1e400 }',
            "inputs.0.distribution.std",
            "not a finite number",
        ),
        (
            'dtype = "float32"',
            'dtype = "float32"\ndistribution = { std = -1.0 }',
            "inputs.0.distribution.std",
            "greater than or equal to 0",
        ),
        (
            'dtype = "float32"',
            'dtype = "float32"\ndistribution = { mean = nan }',
            "inputs.0.distribution.mean",
            "not a finite number",
        ),
        (
            'dtype = "float32"',
            'dtype = "float32"\ndistribution = { kind = "randint", low = 3, high = 3 }',
            "inputs.0.distribution.high",
            "an empty range",
        ),
        (
            'dtype = "float32"\nshape = ["rows", "cols"]\n\n[[input_sets]]',
            'dtype = "float32"\nshape = ["rows", "cols"]\ntolerance = { rtol = inf, atol = 0 }\n\n[[input_sets]]',
            "outputs.0.tolerance.rtol",
            "not a finite number",
        ),
        (
            "[reference]",
            BASELINE.replace("SOURCE", "baseline.cu").replace("grid = [1]", 'grid = ["cdiv(rows,0)"]') + "[reference]",
            "baseline.plan.grid.0",
            "division by zero in cdiv()",
        ),
        (
            "[reference]",
            BASELINE.replace("SOURCE", "baseline.cu").replace("args = []", 'args = ["x", "zz"]') + "[reference]",
            "baseline.plan.args.1",
            "'zz' is neither a tensor",
        ),
    ],
)
def test_malformed_cards_say_file_field_and_fix(
    tmp_path: Path, old: str, new: str, field: str | None, words: str
) -> None:
    assert old in GOOD
    root = write_card(tmp_path / "card", GOOD.replace(old, new, 1))
    with pytest.raises(CardError) as info:
        load_card(root)
    error = info.value
    assert error.path == root / "card.toml"
    assert error.field == field
    assert words in error.problem
    assert error.fix
    assert str(root / "card.toml") in str(error) and "Fix:" in str(error)


@pytest.mark.parametrize(
    ("arrays", "field", "words"),
    [
        ({"x": np.zeros((3, 2), np.float32), "y": np.zeros((2, 3), np.float32)}, "x", "shape (3, 2)"),
        ({"x": np.zeros((2, 3), np.float64), "y": np.zeros((2, 3), np.float32)}, "x", "float64"),
        ({"x": np.zeros((2, 3), np.float32)}, "y", "array missing"),
    ],
)
def test_inconsistent_sets_say_file_field_and_fix(
    tmp_path: Path, arrays: dict[str, np.ndarray], field: str, words: str
) -> None:
    card = load_card(write_card(tmp_path, GOOD, arrays))
    with pytest.raises(CardError) as info:
        card.input_set(card.spec.input_sets[0])
    assert info.value.path == tmp_path / "captured.npz"
    assert info.value.field == field
    assert words in info.value.problem
    assert info.value.fix


def test_bf16_stored_as_float_is_rejected(tmp_path: Path) -> None:
    text = GOOD.replace('dtype = "float32"', 'dtype = "bfloat16"')
    card = load_card(write_card(tmp_path, text))  # float32 arrays where bf16 bits (uint16) belong
    with pytest.raises(CardError) as info:
        card.input_set(card.spec.input_sets[0])
    assert info.value.field == "x" and "uint16" in info.value.problem


def write_members(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> None:
    """An .npz with the given raw members (a crafted header, data short of or beyond what it declares)."""
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(f"{name}.npy", data)


def npy(array: np.ndarray, shape: tuple[int, ...] | None = None, extra: bytes = b"") -> bytes:
    """An .npy file of `array`, its header declaring `shape` (default: its own), followed by `extra` bytes."""
    out = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(array)
    np.lib.format.write_array_header_1_0(out, header | {"shape": shape or array.shape})
    return out.getvalue() + array.tobytes() + extra


ZEROS = np.zeros((2, 3), np.float32)
BOMB = 8 << 20
"""The bytes a crafted member inflates to: far more than the card's 24-byte arrays, small enough for CI."""


@pytest.mark.parametrize(
    ("x", "words"),
    [
        (npy(ZEROS, (1 << 20, 1 << 20)), "shape (1048576, 1048576) but card.toml says (2, 3)"),  # 4 TiB, no data
        (
            npy(np.zeros(BOMB // 4, np.float32), (1024, BOMB // 4096)),
            f"holds {128 + BOMB} bytes where its shape (2, 3)",
        ),
        (npy(ZEROS, extra=bytes(BOMB)), f"holds {152 + BOMB} bytes where its shape (2, 3) needs 24"),
        (npy(ZEROS, extra=bytes(100)), "holds 124 bytes of data where its shape needs 24"),
        (npy(ZEROS)[:-8], "holds 16 bytes of data where its shape needs 24"),
        (b"\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'fortran_order': False", "not a readable .npy member"),
        (b"PK not an npy", "not a readable .npy member"),
    ],
    ids=["huge-shape", "inflating", "trailing-bomb", "trailing", "truncated", "cut-header", "not-npy"],
)
def test_a_set_member_is_checked_against_the_card_before_its_data_is_read(tmp_path: Path, x: bytes, words: str) -> None:
    """A crafted member (a header declaring terabytes, a zip bomb, data short of or beyond its header) is a card
    error naming the file and the array, found from the .npy header and the member's size: nothing is inflated
    beyond the card's arrays."""
    card = load_card(write_card(tmp_path, GOOD))
    write_members(tmp_path / "captured.npz", {"x": x, "y": npy(ZEROS)})
    tracemalloc.start()
    try:
        with pytest.raises(CardError) as info:
            card.input_set(card.spec.input_sets[0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (info.value.path, info.value.field) == (tmp_path / "captured.npz", "x")
    assert words in info.value.problem and info.value.exit_code == 2, info.value.problem
    assert peak < BOMB // 8, f"{peak} bytes held while refusing it"


def test_a_damaged_or_truncated_set_is_a_card_error(tmp_path: Path) -> None:
    card = load_card(write_card(tmp_path, GOOD))
    path = tmp_path / "captured.npz"
    write_members(path, {"x": npy(ZEROS + 1), "y": npy(ZEROS)}, zipfile.ZIP_STORED)
    stored = path.read_bytes()
    at = stored.index((ZEROS + 1).tobytes())
    path.write_bytes(stored[:at] + bytes(4) + stored[at + 4 :])  # the member's CRC no longer matches its data
    with pytest.raises(CardError) as info:
        card.input_set(card.spec.input_sets[0])
    assert (info.value.path, info.value.field) == (path, "x") and "Bad CRC-32" in info.value.problem
    path.write_bytes(path.read_bytes()[:100])  # cut short after the card was loaded (a copy in progress)
    with pytest.raises(CardError) as info:
        card.input_set(card.spec.input_sets[0])
    assert info.value.path == path and "not a readable .npz file" in info.value.problem


def test_a_fortran_ordered_set_reads_as_the_same_array(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    card = load_card(write_card(tmp_path, GOOD, {"x": np.asfortranarray(x), "y": x}))
    inputs, _ = card.input_set(card.spec.input_sets[0])
    assert (inputs["x"] == x).all() and inputs["x"].flags.c_contiguous and inputs["x"].flags.writeable


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CardError) as info:
        load_card(tmp_path / "nowhere")
    assert info.value.path == tmp_path / "nowhere" / "card.toml"
    assert "card.toml" in info.value.fix
    card = load_card(write_card(tmp_path / "c", GOOD))
    (tmp_path / "c" / "captured.npz").unlink()
    with pytest.raises(CardError, match="input set file not found"):
        card.input_set(card.spec.input_sets[0])
    (tmp_path / "c" / "captured.npz").write_text("not a zip")
    with pytest.raises(CardError, match=r"not a readable \.npz"):
        card.input_set(card.spec.input_sets[0])


def test_unknown_reference_function(tmp_path: Path) -> None:
    card = load_card(write_card(tmp_path, GOOD.replace('function = "softmax"', 'function = "nope"')))
    with pytest.raises(CardError) as info:
        card.reference({"x": np.zeros((2, 3), np.float32)})
    assert info.value.field == "reference.function" and "softmax" in info.value.fix


def test_an_inputs_function_draws_every_seeded_fresh_and_stress_set(tmp_path: Path) -> None:
    """Structured inputs (a permutation here) come from the card's `inputs` function, never from distributions."""
    text = GOOD.replace('function = "softmax"', 'function = "softmax"\ninputs = "draw.py:inputs"')
    text = text.replace('file = "captured.npz"', "seed = 3").replace("cols = 3", "cols = 1000")
    card = load_card(write_card(tmp_path, text))
    (tmp_path / "draw.py").write_text(
        "import numpy as np\n"
        "def inputs(sizes, seed):\n"
        "    rng = np.random.default_rng(seed)\n"
        "    rows = [rng.permutation(sizes['cols']) for _ in range(sizes['rows'])]\n"
        "    return {'x': np.stack(rows).astype(np.float32)}\n"
    )
    inputs, outputs = card.input_set(card.spec.input_sets[0])
    assert (np.sort(inputs["x"], axis=1) == np.arange(1000)).all() and outputs["y"].shape == (2, 1000)
    assert not (card.draw(4)["x"] == inputs["x"]).all() and (card.draw(3)["x"] == inputs["x"]).all()
    equal = dict((name, x) for name, x, _ in card.stress_sets())["stress:equal-rows"]["x"]
    assert (equal == equal[:, :1]).all(), "stress values still go on top of the drawn inputs"
    (tmp_path / "draw.py").write_text("import numpy as np\ndef inputs(sizes, seed):\n    return {'x': np.zeros(3)}\n")
    with pytest.raises(CardError, match=r"drawn as float64\[3\], the card says float32\[2, 1000\]"):
        card.draw(1)


def test_to_toml_rejects_what_it_cannot_write() -> None:
    with pytest.raises(TypeError):
        to_toml({"x": object()})


# --- files a card names, and files that cannot be read ------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ('file = "captured.npz"', "seed = -1", "input_sets.0.seed", "greater than or equal to 0"),
        ('function = "softmax"', 'function = "softmax"\n\n[stress]\nseed = -1', "stress.seed", "greater than or equal"),
        ("rows = 2\ncols = 3", "rows = 1048576\ncols = 1048576", "inputs.x.shape", "4.1e+03 GiB, over the limit"),
        ("rows = 2\ncols = 3", "rows = 4294967296\ncols = 4294967296", "inputs.x.shape", "over the limit of 256 GiB"),
        ('file = "captured.npz"', 'file = "../outside.npz"', "input_sets.captured.file", "outside the card"),
        ('function = "softmax"', 'function = "../outside.py:softmax"', "reference.function", "outside the card"),
        ("[reference]", BASELINE.replace("SOURCE", "../outside.cu") + "[reference]", "baseline.source", "outside"),
        ("[reference]", BASELINE.replace("SOURCE", "ABSOLUTE") + "[reference]", "baseline.source", "outside"),
    ],
)
def test_cards_that_reach_outside_or_overflow_are_refused(
    tmp_path: Path, old: str, new: str, field: str, words: str
) -> None:
    for name in ("outside.npz", "outside.py", "outside.cu"):  # they exist: the path alone is refused
        shutil.copy(CARDS / "softmax_bf16_small" / "baseline.cu", tmp_path / name)
    assert old in GOOD
    text = GOOD.replace(old, new.replace("ABSOLUTE", str(tmp_path / "outside.cu")), 1)
    root = write_card(tmp_path / "card", text)
    with pytest.raises(CardError) as info:
        load_card(root)
    assert (info.value.field, info.value.path) == (field, root / "card.toml")
    assert words in info.value.problem and info.value.exit_code == 2


def test_a_symlink_out_of_the_card_is_refused(tmp_path: Path) -> None:
    root = write_card(tmp_path / "card", GOOD.replace("[reference]", BASELINE.replace("SOURCE", "baseline.cu")
                                                      + "[reference]"))  # fmt: skip
    (tmp_path / "secret.cu").write_text('extern "C" __global__ void k() {}\n')
    (root / "baseline.cu").symlink_to(tmp_path / "secret.cu")
    with pytest.raises(CardError) as info:
        load_card(root)
    assert info.value.field == "baseline.source" and "outside the card directory" in info.value.problem
    card = Card(spec=OperatorCard.model_validate(tomllib.loads((root / "card.toml").read_text())), root=root)
    with pytest.raises(CardError, match="outside the card directory"):
        card.baseline_source()  # a Card made without load_card is held to the same rule when it reads the file
    (root / "baseline.cu").unlink()
    (root / "kernels").mkdir()
    shutil.move(tmp_path / "secret.cu", root / "kernels" / "k.cu")
    (root / "baseline.cu").symlink_to(root / "kernels" / "k.cu")  # a symlink that stays inside is fine
    assert "__global__" in load_card(root).baseline_source()


def test_a_reference_module_outside_the_card_never_runs(tmp_path: Path) -> None:
    root = write_card(tmp_path / "card", GOOD)
    (tmp_path / "evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\ndef softmax(i, s): return i\n")
    spec = OperatorCard.model_validate(
        tomllib.loads(GOOD.replace('function = "softmax"', 'function = "../evil.py:softmax"'))
    )
    with pytest.raises(CardError, match="outside the card directory"):
        Card(spec=spec, root=root).reference({"x": np.zeros((2, 3), np.float32)})
    assert not (tmp_path / "ran").exists()


def test_unreadable_manifests_plans_and_sets_are_card_errors(tmp_path: Path) -> None:
    root = write_card(tmp_path / "card", GOOD)
    (root / "captured.npz").write_text("not a zip")
    with pytest.raises(CardError) as info:
        load_card(root)  # refused on load, before anything is built or sent to a GPU
    assert info.value.field == "input_sets.captured.file" and "not an .npz" in info.value.problem
    (root / "card.toml").write_bytes(GOOD.replace("bad_card", "bad_\xe9_card").encode("latin-1"))
    with pytest.raises(CardError) as info:
        load_card(root)
    assert info.value.path == root / "card.toml" and info.value.problem == "not UTF-8 text (byte 0xe9 at offset 12)"
    kernel = tmp_path / "k.cu"
    (tmp_path / "k.plan.toml").mkdir()
    with pytest.raises(CardError) as info:
        plan_for_kernel(kernel)
    assert info.value.path == tmp_path / "k.plan.toml" and "a directory" in info.value.problem
    (tmp_path / "other.plan.toml").write_bytes(b'entry = "k\xff"\n')
    with pytest.raises(CardError, match="not UTF-8 text"):
        plan_for_kernel(kernel, tmp_path / "other.plan.toml")


# --- kernels ----------------------------------------------------------------------------------------

EXPECT = re.compile(r"^// expect: (mismatch|out_of_bounds|timeout|input_modified|pass) -- ", re.MULTILINE)
ALLOWED_INCLUDES = {"cuda_bf16.h", "cuda_fp16.h", "stdint.h"}


def test_every_example_kernel_has_a_plan_that_resolves() -> None:
    for kernel in ALL_KERNELS:
        text = kernel.read_text()
        assert set(re.findall(r'#include\s*[<"]([^>"]+)[>"]', text)) <= ALLOWED_INCLUDES, kernel
        assert 'extern "C" __global__' in text, kernel
        if kernel.name == "baseline.cu" and kernel.parent.parent == CARDS:
            continue
        if kernel.parent.parent == KERNELS and kernel.parent.name != "cheats":
            continue  # the canonical copies; their card copies are checked with their plans
        launch_plan = plan_for_kernel(kernel)
        assert re.search(rf"\b{launch_plan.entry}\(", text), kernel
        card_dir = CARDS / (kernel.parent.name if kernel.parent.parent == CHEATS else kernel.parent.parent.name)
        resolve(launch_plan, load_card(card_dir).spec)


def test_every_cheat_says_what_must_catch_it() -> None:
    cheats = sorted(CHEATS.rglob("*.cu"))
    assert {p.stem for p in CHEATS.joinpath("vector_add_f32").glob("*.cu")} >= {
        "wrong_answer",
        "never_writes",
        "first_row_only",
        "out_of_bounds",
        "infinite_loop",
        "caching",
        "modifies_input",
    }
    assert {p.stem for p in CHEATS.joinpath("softmax_bf16_small").glob("*.cu")} >= {
        "wrong_answer",
        "never_writes",
        "first_row_only",
        "out_of_bounds",
        "infinite_loop",
        "caching",
        "modifies_input",
        "half_precision_bf16",
    }
    assert (CHEATS / "softmax_f32_small" / "half_precision.cu").is_file()
    for cheat in cheats:
        assert len(EXPECT.findall(cheat.read_text())) == 1, f"{cheat}: needs one '// expect: <check> -- why' line"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_every_example_kernel_compiles_without_warnings(tmp_path: Path) -> None:
    sources = {kernel.read_bytes(): kernel for kernel in ALL_KERNELS}  # card copies compile once
    jobs = []
    for index, kernel in enumerate(sources.values()):
        cmd = ["nvcc", "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v,-warn-spills,-warn-lmem-usage"]
        cmd += ["-Werror", "all-warnings", "-o", str(tmp_path / f"{index}.cubin"), str(kernel)]
        jobs.append((kernel, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for kernel, job in jobs:
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, f"{kernel}:\n{output}"
        assert "warning" not in output.lower(), f"{kernel}:\n{output}"
        assert re.search(r"\b0 bytes spill stores", output), f"{kernel} spills:\n{output}"
