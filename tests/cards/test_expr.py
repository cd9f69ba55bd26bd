"""The safe integer-expression evaluator and launch-plan resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge_tui.cards import expr
from kernelforge_tui.cards.errors import CardError
from kernelforge_tui.cards.model import (
    InputSet,
    LaunchPlan,
    OperatorCard,
    OutputSpec,
    Reference,
    TensorSpec,
)
from kernelforge_tui.cards.plan import MAX_SHARED_BYTES, load_plan, plan_for_kernel, resolve

SIZES = {"rows": 4096, "cols": 32768, "n": 10}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (7, 7),
        ("42", 42),
        ("rows", 4096),
        ("rows * cols", 4096 * 32768),
        ("2 ** 25", 2**25),
        ("-n + 3", -7),
        ("(n + 2) % 4", 0),
        ("n // 3", 3),
        ("cols / 4", 8192),
        ("cdiv(n, 4)", 3),
        ("cdiv(12, 4)", 3),
        ("round_up(n, 8)", 16),
        ("round_up(16, 8)", 16),
        ("min(n, 4)", 4),
        ("max(n, 4)", 10),
        ("min(cdiv(rows * cols, 4 * 256), 132 * 8)", 1056),
        ("  n  ", 10),
    ],
)
def test_values(text: str | int, value: int) -> None:
    assert expr.evaluate(text, SIZES) == value


def test_names_excludes_functions() -> None:
    assert expr.names("cdiv(rows, 4) + max(cols, n)") == {"rows", "cols", "n"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n.bit_length()", "a call of anything but cdiv"),
        ("rows.__class__", "attribute access"),
        ("abs(n)", "function 'abs' is not allowed"),
        ("__import__('os')", "function '__import__' is not allowed"),
        ("(lambda: 1)()", "not allowed"),
        ("lambda: 1", "a lambda"),
        ("'abc'", "the string 'abc'"),
        ("1.5 * n", "the float 1.5"),
        ("nope + 1", "unknown size 'nope' (known sizes: cols, n, rows)"),
        ("n / 3", "10 / 3 is not an integer; use cdiv(10, 3) or 10 // 3"),
        ("n // 0", "division by zero"),
        ("n / 0", "division by zero"),
        ("n % 0", "modulo by zero"),
        ("cdiv(n, 0)", "division by zero"),
        ("1" * 300, "longer than 256"),
        ("n[0]", "indexing"),
        ("n if n else 1", "conditional"),
        ("n < 4", "comparison"),
        ("(n := 3)", "assignment"),
        ("cdiv(n, b=2)", "keyword"),
        ("min(n)", "min() takes 2 arguments, got 1"),
        ("n ** 65", "exponent 65 out of range"),
        ("2 ** 62 * 4", "overflows 64 bits"),
        ("n +", "cannot parse"),
        ("1\x00", "cannot parse"),
        ("True", "not allowed"),
    ],
)
def test_rejections(text: str, message: str) -> None:
    with pytest.raises(expr.ExprError) as info:
        expr.evaluate(text, SIZES)
    assert message in str(info.value)


def test_rejections_teach_the_syntax() -> None:
    with pytest.raises(expr.ExprError, match="cdiv"):
        expr.evaluate("open('x')", SIZES)


# --- plans ------------------------------------------------------------------------------------------


def card() -> OperatorCard:
    return OperatorCard(
        name="softmax_test",
        family="softmax",
        sizes={"rows": 4096, "cols": 32768},
        inputs=[TensorSpec(name="x", dtype="float32", shape=["rows", "cols"])],
        outputs=[OutputSpec(name="y", dtype="float32", shape=["rows", "cols"])],
        input_sets=[InputSet(name="s", seed=1)],
        reference=Reference(function="softmax"),
    )


def plan(**changes: object) -> LaunchPlan:
    fields: dict[str, object] = {
        "entry": "softmax_rows",
        "grid": ["rows"],
        "block": [1024],
        "shared_bytes": "32 * 4",
        "args": ["x", "y", "rows", "cols", "rows * cols:i64", "cols:u32"],
    }
    return LaunchPlan.model_validate(fields | changes)


def test_good_plan_resolves_to_numbers() -> None:
    launch = resolve(plan(), card())
    assert launch.grid == (4096, 1, 1)
    assert launch.block == (1024, 1, 1)
    assert launch.threads_per_block == 1024
    assert launch.shared_bytes == 128
    kinds = [(a.kind, a.name, a.scalar_type, a.value) for a in launch.args]
    assert kinds == [
        ("tensor", "x", "", 0),
        ("tensor", "y", "", 0),
        ("scalar", "rows", "int32", 4096),
        ("scalar", "cols", "int32", 32768),
        ("scalar", "rows * cols", "int64", 4096 * 32768),
        ("scalar", "cols", "uint32", 32768),
    ]


def test_two_dimensional_launch() -> None:
    launch = resolve(plan(grid=["cdiv(cols, 32)", "cdiv(rows, 8)"], block=[32, 8]), card())
    assert launch.grid == (1024, 512, 1)
    assert launch.block == (32, 8, 1)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"block": [2048]}, "1024 threads per block"),
        ({"block": [64, 32]}, "1024 threads per block"),
        ({"block": [1, 1, 128]}, "1024 threads per block"),
        ({"block": [0]}, "block: evaluates to (0, 1, 1). Fix: make every dimension >= 1"),
        ({"grid": ["rows", 70000]}, "exceeds the limits"),
        ({"grid": [2**31]}, "exceeds the limits"),
        ({"grid": ["rows - 4096"]}, "grid: evaluates to (0, 1, 1)"),
        ({"shared_bytes": 227 * 1024 + 1}, "shared_bytes"),
        ({"shared_bytes": -1}, "shared_bytes"),
        ({"args": ["x", "z"]}, "args.1: 'z' is neither a tensor of the card nor a formula over its sizes (unknown: z)"),
        (
            {"args": ["x", "y", "rows * cols * 16"]},
            "args.2: 'rows * cols * 16' = 2147483648 does not fit int32. Fix: use ':i64'",
        ),
        ({"args": ["x", "y", "-rows:u32"]}, "does not fit uint32"),
        ({"args": ["x", "y", "rows:i16"]}, "type suffix 'i16'. Fix: use one of"),
        ({"grid": ["rows / 3"]}, "grid.0: 4096 / 3 is not an integer"),
        (
            {"grid": ["cdiv(rows, 0)"]},
            "grid.0: division by zero in cdiv(). Fix: write an integer formula over the card's sizes (cols, rows)",
        ),
    ],
)
def test_bad_plans_are_rejected(changes: dict[str, object], message: str) -> None:
    with pytest.raises(expr.ExprError) as info:
        resolve(plan(**changes), card())
    assert message in str(info.value)


def test_shared_memory_limit_is_hoppers() -> None:
    assert resolve(plan(shared_bytes=MAX_SHARED_BYTES), card()).shared_bytes == 227 * 1024


def test_plan_model_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="C identifier"):
        plan(entry="not-an-identifier")
    with pytest.raises(ValueError):
        plan(grid=[1, 1, 1, 1])
    with pytest.raises(ValueError):
        plan(block=[])


def test_plan_for_kernel_finds_the_plan_beside_it(tmp_path: Path) -> None:
    kernel = tmp_path / "softmax_v2.cu"
    kernel.write_text('extern "C" __global__ void softmax_rows() {}\n')
    (tmp_path / "softmax_v2.plan.toml").write_text(
        'entry = "softmax_rows"\ngrid = ["rows"]\nblock = [256]\nargs = ["x", "y", "cols"]\n'
    )
    found = plan_for_kernel(kernel)
    assert found.entry == "softmax_rows"
    assert resolve(found, card()).block == (256, 1, 1)
    explicit = tmp_path / "other.toml"
    explicit.write_text('entry = "k2"\ngrid = [1]\nblock = [32]\nargs = []\n')
    assert plan_for_kernel(kernel, explicit).entry == "k2"


def test_missing_plan_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(CardError) as info:
        plan_for_kernel(tmp_path / "lonely.cu")
    assert info.value.path == tmp_path / "lonely.plan.toml"
    assert "lonely.plan.toml" in info.value.fix


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("entry = ", None, "not valid TOML"),
        ('entry = "k"\ngrid = [1]\nblock = [32]\nargs = []\nthreads = 3\n', "threads", "unknown field"),
        ('entry = "k"\ngrid = [1]\nblock = [32]\n', "args", "required field is missing"),
        ('entry = "k"\ngrid = [1.5]\nblock = [32]\nargs = []\n', "grid.0", ""),
        ('entry = "k"\ngrid = [true]\nblock = [32]\nargs = []\n', "grid.0", "true is a bool, not an integer"),
        ('entry = "k"\ngrid = [1]\nblock = [32.0]\nargs = []\n', "block.0", "32.0 is a float, not an integer"),
        ('entry = "k"\ngrid = [1]\nblock = [32]\nshared_bytes = false\nargs = []\n', "shared_bytes", "a bool"),
    ],
)
def test_bad_plan_files(tmp_path: Path, text: str, field: str | None, problem: str) -> None:
    path = tmp_path / "k.plan.toml"
    path.write_text(text)
    with pytest.raises(CardError) as info:
        load_plan(path)
    assert info.value.path == path
    assert info.value.field == field or (field and info.value.field and info.value.field.startswith(field))
    assert problem in info.value.problem
    assert info.value.fix


@pytest.mark.parametrize(
    ("plan_text", "field", "words"),
    [
        ('args = ["zz"]', "args.0", ["'zz' is neither a tensor", "pass a tensor (x, y)", "sizes (cols, rows)"]),
        ('args = ["x", "rows * cols * 16"]', "args.1", ["does not fit int32", "':i64'"]),
        ('grid = ["cdiv(rows, 0)"]', "grid.0", ["division by zero"]),
        ("block = [2048]", "block", ["1024 threads per block"]),
        ("shared_bytes = 1_000_000", "shared_bytes", ["outside 0..232448"]),
    ],
)
def test_a_plan_file_that_does_not_fit_the_card_names_the_file_and_the_field(
    tmp_path: Path, plan_text: str, field: str, words: list[str]
) -> None:
    """A plan given on the command line that cannot launch on the card is bad input (a CardError, exit 2), like
    a plan that is not valid TOML, and says what the field may hold."""
    fields = {"entry": '"k"', "grid": '["rows"]', "block": "[256]", "args": '["x", "y"]'}
    key, _, value = plan_text.partition(" = ")
    path = tmp_path / "k.plan.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in (fields | {key: value}).items()))
    with pytest.raises(CardError) as info:
        plan_for_kernel(tmp_path / "k.cu", card=card())
    assert info.value.exit_code == 2
    assert info.value.path == path and info.value.field == field
    assert all(word in str(info.value) for word in words), str(info.value)
    assert plan_for_kernel(tmp_path / "k.cu").entry == "k"  # without the card only the file's schema is checked
