"""`kernelforge new`: a card from a spec, a NumPy reference and example sizes, end to end through the CLI; the
baseline given, or written by a scripted model on the loopback server and really built with nvcc (one repair
request); every bad input one line with its fix, and nothing left behind."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.cards import load_card
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cli.main import main
from tests.support.fakes.llm_server import LlmServer, Reply

SPEC = "y = softmax(x) over the last axis of x[rows, cols]; bf16 in and out, fp32 math."
REFERENCE = '''import numpy as np


def softmax(x):
    """Keyword style: the input named like the tensor."""
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_card(inputs, sizes):
    """The card's own style."""
    return {"y": softmax(inputs["x"])}


def row_max(x, cols):
    """A reduction, and a size passed by name."""
    assert x.shape[-1] == cols
    return x.astype(np.float32).max(axis=-1)


def halves(x):
    """An output no size describes: cols / 2."""
    return x[:, ::2].astype(np.float32)


def argmax(x):
    return x.astype(np.float32).argmax(axis=-1).astype(np.int32)


def broken(x):
    raise ValueError("this reference is broken")
'''
KERNEL = """#include <cuda_bf16.h>

extern "C" __global__ void softmax_naive(const __nv_bfloat16* x, __nv_bfloat16* y, int rows, int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) {
        return;
    }
    const __nv_bfloat16* xr = x + (long long)row * cols;
    __nv_bfloat16* yr = y + (long long)row * cols;
    float m = __bfloat162float(xr[0]);
    for (int j = 1; j < cols; ++j) {
        m = fmaxf(m, __bfloat162float(xr[j]));
    }
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) {
        s += expf(__bfloat162float(xr[j]) - m);
    }
    for (int j = 0; j < cols; ++j) {
        yr[j] = __float2bfloat16_rn(expf(__bfloat162float(xr[j]) - m) / s);
    }
}
"""
PLAN = {"entry": "softmax_naive", "grid": ["cdiv(rows, 32)"], "block": [32], "args": ["x", "y", "rows", "cols"]}
PLAN_TOML = 'entry = "softmax_naive"\ngrid = ["cdiv(rows, 32)"]\nblock = [32]\nargs = ["x", "y", "rows", "cols"]\n'


def reply_text(source: str, plan: dict[str, object] = PLAN, prose: str = "One thread per row, three passes.") -> str:
    return f"{prose}\n```cuda\n{source}```\n```json\n{json.dumps(plan)}\n```\n"


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages hold paths: a wide terminal keeps each on one line."""
    monkeypatch.setenv("COLUMNS", "1000")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "softmax.cu").write_text(KERNEL)
    (tmp_path / "softmax.plan.toml").write_text(PLAN_TOML)
    (tmp_path / "cards").mkdir()
    return tmp_path


@pytest.fixture
def server() -> Iterator[LlmServer]:
    with LlmServer() as running:
        yield running


def configure_llm(server: LlmServer) -> None:
    Path(os.environ["KERNELFORGE_CONFIG"]).write_text(
        f'[[llm.providers]]\nname = "local"\nprotocol = "openai"\nbase_url = "{server.url}/v1"\n'
        "timeouts = { connect_s = 2, idle_s = 5, total_s = 20 }\n"
        '[[llm.models]]\nname = "coder"\nprovider = "local"\nmodel = "kernel-coder-1"\n'
        "price = { input = 2.0, output = 8.0 }\n"
    )


def new(
    capsys: pytest.CaptureFixture[str], work: Path, *extra: str, function: str = "softmax", name: str = "softmax_new"
) -> tuple[int, str]:
    args = [
        "new",
        name,
        "--spec",
        SPEC,
        "--reference",
        f"{work / 'ref.py'}:{function}",
        "--sizes",
        "rows=37,cols=1003",
        "--dtype",
        "bfloat16",
        "-o",
        str(work / "cards" / name),
        *extra,
    ]
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def nothing_left(work: Path) -> bool:
    return list((work / "cards").iterdir()) == []


def test_new_with_a_given_baseline_writes_a_card_that_loads(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = new(capsys, work, "--baseline", str(work / "softmax.cu"), "--family", "softmax", "--json")
    assert code == 0, out
    reply = json.loads(out)
    card = load_card(work / "cards" / "softmax_new")
    spec = card.spec
    assert reply["card_dir"] == str(card.root) and reply["baseline"]["author"] == "given"
    assert spec.description == SPEC and spec.family == "softmax" and dict(spec.sizes) == {"rows": 37, "cols": 1003}
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [("x", "bfloat16", ["rows", "cols"])]
    assert [(t.name, t.dtype, t.shape) for t in spec.outputs] == [("y", "bfloat16", ["rows", "cols"])]
    assert spec.cost.bytes == "4*rows*cols" and spec.bytes_moved() == 4 * 37 * 1003 and spec.flops() == 0
    assert (card.root / "ref.py").read_text() == REFERENCE  # copied, and the card's reference wraps it
    assert spec.reference.function == "reference_adapter.py:reference"
    assert card.baseline_source() == KERNEL
    assert spec.baseline is not None and spec.baseline.plan.entry == "softmax_naive"
    assert [s.name for s in spec.input_sets] == ["set_1", "set_2", "seed_3"]
    for which in spec.input_sets:  # stored and seeded sets: reference outputs as an independent softmax gives them
        inputs, outputs = card.input_set(which)
        expected = softmax64(inputs["x"]).astype(NUMPY["bfloat16"])
        assert outputs["y"].dtype == NUMPY["bfloat16"]
        np.testing.assert_array_equal(outputs["y"].astype(np.float32), expected.astype(np.float32))
    first, _ = card.input_set(spec.input_sets[0])
    second, _ = card.input_set(spec.input_sets[1])
    assert not np.array_equal(first["x"], second["x"])  # distinct seeds
    stress = list(card.stress_sets())  # the family's stress sets run through the card's reference
    assert stress and all(np.isfinite(ref["y"].astype(np.float32)).any() for _, _, ref in stress)
    assert [p.name for p in (work / "cards").iterdir()] == ["softmax_new"]  # no temp dir left


def test_a_card_style_reference_is_used_as_it_is(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = new(capsys, work, "--baseline", str(work / "softmax.cu"), function="softmax_card")
    assert code == 0, out
    spec = load_card(work / "cards" / "softmax_new").spec
    assert spec.reference.function == "ref.py:softmax_card" and spec.family == "other"
    assert [t.name for t in spec.inputs] == ["x"] and [t.name for t in spec.outputs] == ["y"]


def test_output_shapes_and_dtypes_are_found_by_running_the_reference(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row_max = work / "rowmax.cu"
    row_max.write_text(
        "#include <cuda_bf16.h>\n"
        'extern "C" __global__ void row_max(const __nv_bfloat16* x, __nv_bfloat16* y0, int rows, int cols) {\n'
        "    const int row = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (row >= rows) return;\n"
        "    float m = __bfloat162float(x[(long long)row * cols]);\n"
        "    for (int j = 1; j < cols; ++j) m = fmaxf(m, __bfloat162float(x[(long long)row * cols + j]));\n"
        "    y0[row] = __float2bfloat16_rn(m);\n"
        "}\n"
    )
    (work / "rowmax.plan.toml").write_text(
        'entry = "row_max"\ngrid = ["cdiv(rows, 32)"]\nblock = [32]\nargs = ["x", "y0", "rows", "cols"]\n'
    )
    code, out = new(capsys, work, "--baseline", str(row_max), "--output", "y0", function="row_max", name="rm")
    assert code == 0, out
    spec = load_card(work / "cards" / "rm").spec
    assert [(t.name, t.shape, t.dtype) for t in spec.outputs] == [("y0", ["rows"], "bfloat16")]
    assert spec.cost.bytes == "2*rows*cols + 2*rows"

    argmax = work / "argmax.cu"
    argmax.write_text(
        "#include <cuda_bf16.h>\n"
        'extern "C" __global__ void argmax(const __nv_bfloat16* x, int* idx, int rows, int cols) {\n'
        "    const int row = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (row >= rows) return;\n"
        "    int best = 0;\n"
        "    const __nv_bfloat16* xr = x + (long long)row * cols;\n"
        "    for (int j = 1; j < cols; ++j)\n"
        "        if (__bfloat162float(xr[j]) > __bfloat162float(xr[best])) best = j;\n"
        "    idx[row] = best;\n"
        "}\n"
    )
    (work / "argmax.plan.toml").write_text(
        'entry = "argmax"\ngrid = ["cdiv(rows, 32)"]\nblock = [32]\nargs = ["x", "idx", "rows", "cols"]\n'
    )
    code, out = new(capsys, work, "--baseline", str(argmax), "--output", "idx", function="argmax", name="am")
    assert code == 0, out
    spec = load_card(work / "cards" / "am").spec
    assert [(t.name, t.shape, t.dtype) for t in spec.outputs] == [("idx", ["rows"], "int32")]  # its own dtype
    assert spec.cost.bytes == "2*rows*cols + 4*rows"


def test_an_output_no_size_describes_asks_for_output(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = new(capsys, work, "--baseline", str(work / "softmax.cu"), function="halves", name="h")
    assert code == 2
    assert "--output y=" in out and "follows no size" in out
    assert nothing_left(work)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("--reference", "missing.py:softmax"), ("no such file", "FILE.py:FUNCTION")),
        (("--reference", "ref.py:nope"), ("has no function 'nope'", "softmax_card")),
        (("--reference", "ref.py:broken"), ("raised ValueError: this reference is broken", "Fix:")),
        (("--sizes", "rows=37,cols"), ("'cols' is not NAME=INTEGER", "rows=4096,cols=32768")),
        (("--sizes", "rows=37,cols=-3"), ("not positive", "Fix:")),
        (("--sizes", "rows=37,cols=abc"), ("is not an integer", "Fix:")),
        (("--dtype", "bf16"), ("unknown dtype 'bf16'", "bfloat16")),
        (("--family", "softmaxx"), ("unknown family 'softmaxx'", "softmax")),
        (("--input", "x=rows,colls"), ("unknown size", "colls")),
        (("--flops", "5*rowz"), ("cost.flops", "--flops")),
    ],
)
def test_bad_input_is_one_line_naming_the_fix_and_writes_nothing(
    work: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str], words: tuple[str, ...]
) -> None:
    option, value = change
    if option == "--reference":
        value = str(work / value)
    extra = ["--baseline", str(work / "softmax.cu"), "--json"]
    if option in ("--sizes", "--dtype", "--reference"):
        args = [
            "new",
            "bad",
            "--spec",
            SPEC,
            "--reference",
            f"{work / 'ref.py'}:softmax",
            "--sizes",
            "rows=37,cols=1003",
            "--dtype",
            "bfloat16",
            "-o",
            str(work / "cards" / "bad"),
            *extra,
        ]
        args[args.index(option) + 1] = value
        code = main(args)
        out = capsys.readouterr().out
    else:
        code, out = new(capsys, work, *extra, option, value, name="bad")
    reply = json.loads(out)
    assert code == 2 and reply["ok"] is False and reply["error"] == "bad-input", reply
    for word in words:
        assert word in reply["message"], reply["message"]
    assert "Fix:" in reply["message"]
    assert nothing_left(work)


def test_an_existing_directory_is_refused_and_left_alone(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (work / "cards" / "softmax_new").mkdir()
    (work / "cards" / "softmax_new" / "mine.txt").write_text("keep me")
    code, out = new(capsys, work, "--baseline", str(work / "softmax.cu"))
    assert code == 2 and "already exists" in out and "-o" in out
    assert [p.name for p in (work / "cards" / "softmax_new").iterdir()] == ["mine.txt"]
    assert [p.name for p in (work / "cards").iterdir()] == ["softmax_new"]


def test_no_baseline_and_no_llm_says_what_to_pass_or_configure(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = new(capsys, work)
    assert code == 2
    assert "--baseline" in out and "[[llm.models]]" in out and "config.toml" in out
    assert nothing_left(work)


def test_a_given_baseline_that_does_not_compile_writes_nothing(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (work / "softmax.cu").write_text(KERNEL.replace("fmaxf(m,", "fmaxf(m"))
    code, out = new(capsys, work, "--baseline", str(work / "softmax.cu"))
    assert code == 1 and "does not compile" in out
    assert nothing_left(work)


def test_the_coder_model_writes_a_baseline_that_nvcc_builds(
    work: Path, capsys: pytest.CaptureFixture[str], server: LlmServer
) -> None:
    configure_llm(server)
    text = reply_text(KERNEL)
    server.script(Reply(chunks=(text[:50], text[50:]), input_tokens=1200, output_tokens=400))
    code, out = new(capsys, work, "--family", "softmax", "--json")
    assert code == 0, out
    reply = json.loads(out)
    card = load_card(work / "cards" / "softmax_new")
    assert card.baseline_source() == KERNEL and card.spec.baseline is not None
    assert card.spec.baseline.plan.model_dump(exclude_defaults=True) == PLAN
    baseline = reply["baseline"]
    assert baseline["author"] == "coder" and baseline["llm_calls"] == 1 and baseline["registers"] is not None
    assert baseline["input_tokens"] == 1200 and baseline["output_tokens"] == 400
    assert baseline["cost_usd"] == pytest.approx((1200 * 2.0 + 400 * 8.0) / 1e6)
    [sent] = server.requests
    system, user = (m["content"] for m in sent.body["messages"])
    assert "[prompt baseline.v1]" in system and "obviously correct" in system and "```cuda" in system
    assert SPEC in user and "def softmax(x)" in user and "rows = 37" in user and "bfloat16" in user


def test_a_baseline_that_does_not_compile_gets_one_repair_with_the_compiler_errors(
    work: Path, capsys: pytest.CaptureFixture[str], server: LlmServer
) -> None:
    configure_llm(server)
    broken = KERNEL.replace("float s = 0.0f;", "float s = 0.0f")
    server.script(Reply(chunks=(reply_text(broken),)), Reply(chunks=(reply_text(KERNEL),)))
    code, out = new(capsys, work)
    assert code == 0, out
    assert load_card(work / "cards" / "softmax_new").baseline_source() == KERNEL
    assert len(server.requests) == 2
    repair = server.requests[1].body["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert repair[2]["content"] == reply_text(broken)
    assert "did not compile" in repair[3]["content"] and "error" in repair[3]["content"]
    assert "written by coder" in out and "2 call(s)" in out


def test_a_malformed_reply_gets_one_repair_then_gives_up_with_nothing_written(
    work: Path, capsys: pytest.CaptureFixture[str], server: LlmServer
) -> None:
    configure_llm(server)
    no_plan = f"```cuda\n{KERNEL}```\n"
    server.script(Reply(chunks=(no_plan,)), Reply(chunks=(reply_text(KERNEL.replace("{\n    const int", "{ oops")),)))
    code, out = new(capsys, work)
    assert code == 1
    assert len(server.requests) == 2
    assert "could not be used" in server.requests[1].body["messages"][3]["content"]
    assert "after one repair request" in out and "--baseline" in out
    assert nothing_left(work)


def test_a_provider_that_refuses_the_key_ends_new_with_nothing_written(
    work: Path, capsys: pytest.CaptureFixture[str], server: LlmServer
) -> None:
    configure_llm(server)
    server.script(Reply(status=401, error="bad key"))
    code, out = new(capsys, work)
    assert code == 2 and "the key was refused" in out  # a refused key is the setup's to fix, as bad input
    assert nothing_left(work)


def test_declared_inputs_and_outputs_are_checked_against_what_the_reference_does(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    declared = ("--input", "x:float32=rows,cols", "--output", "y:float32=rows,cols")
    (work / "f32.cu").write_text(KERNEL.replace("__nv_bfloat16", "float").replace("__bfloat162float", ""))
    (work / "f32.plan.toml").write_text(PLAN_TOML)
    code, out = new(capsys, work, "--baseline", str(work / "f32.cu"), *declared, function="softmax_card")
    assert code == 0, out
    spec = load_card(work / "cards" / "softmax_new").spec
    assert [(t.name, t.dtype) for t in [*spec.inputs, *spec.outputs]] == [("x", "float32"), ("y", "float32")]
    assert spec.reference.function == "ref.py:softmax_card"  # it returns the dict the card wants

    wrong = ("--output", "y=cols,rows")
    code, out = new(capsys, work, "--baseline", str(work / "softmax.cu"), *wrong, "--json", name="wrong")
    assert code == 2 and "returned 'y' shaped (40, 56), and --output y says (56, 40)" in json.loads(out)["message"]


def test_sizes_may_be_formulas_and_large_cards_draw_their_sets_from_seeds(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["new", "big", "--spec", SPEC, "--reference", f"{work / 'ref.py'}:softmax", "--dtype", "bfloat16"]
    args += ["--sizes", "rows=2**12,cols=2**13", "-o", str(work / "cards" / "big")]
    args += ["--baseline", str(work / "softmax.cu"), "--json"]
    code = main(args)
    reply = json.loads(capsys.readouterr().out)
    assert code == 0, reply
    assert reply["stored_sets"] == [] and reply["seeded_sets"] == ["seed_1", "seed_2", "seed_3"]  # 128 MiB a set
    card = load_card(work / "cards" / "big")
    assert dict(card.spec.sizes) == {"rows": 4096, "cols": 8192}
    assert not list(card.root.glob("*.npz"))
