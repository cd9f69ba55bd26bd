"""The command line's rough edges, as a user in a shell meets them: output piped into `head`, a node id that is not
one, a bad budget, `--version`, tables read through a pipe. Each runs the real `kernelforge` in a process, with
standard output a pipe and no COLUMNS set, as in a script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelforge_tui.cli.main import version
from tests.conftest import EXAMPLES

RUNS = EXAMPLES / "runs"
CARD = EXAMPLES / "cards" / "vector_add_f32"


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run(
        [sys.executable, "-m", "kernelforge_tui.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # one line even through a pipe, where the console had wrapped it at 80
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def test_output_cut_by_head_ends_quietly() -> None:
    """`kernelforge profile RUN NODE --json | head`: the reader goes away while the JSON (a saved ncu profile, ~150 kB,
    more than a pipe holds) is still being written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kernelforge_tui.cli", "profile", str(RUNS / "rms_norm_bf16_profiled"), "82", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(10).startswith(b"{")
    process.stdout.close()  # what head does after its lines
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, stderr  # 128 + SIGPIPE, as a shell reports a tool cut by head
    assert stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit


def test_broken_pipe_elsewhere_is_still_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BrokenPipeError that is not about standard output (a worker's pipe) keeps its traceback."""
    from kernelforge_tui.cli import main as main_module

    def broken(*_: object) -> int:
        raise BrokenPipeError("a worker's stdin")

    monkeypatch.setitem(main_module.COMMANDS, "runs", broken)
    with pytest.raises(BrokenPipeError):
        main_module.main(["runs"])


def test_profile_names_a_node_that_is_not_a_number() -> None:
    line = one_line(piped("profile", str(RUNS / "softmax_bf16"), "abc"), 2, "node 'abc' is not a node id")
    assert "the run's best is node 54" in line and "card.toml" not in line


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--budget-iters", "-5", ["--budget-iters -5", "0 or more"]),
        ("--budget-minutes", "nan", ["--budget-minutes nan", "finite"]),
        ("--budget-money", "-1", ["--budget-money -1", "0 or more"]),
        ("--budget-tokens", "-3", ["--budget-tokens -3", "0 or more"]),
        ("--simulate-seconds", "-1", ["--simulate-seconds -1", "0 or more"]),
    ],
)
def test_a_bad_cap_is_one_line_naming_its_option(option: str, value: str, words: list[str]) -> None:
    line = one_line(piped("optimize", str(CARD), "--simulate", option, value), 2, *words)
    assert "pydantic" not in line and "http" not in line and "input_value" not in line


def test_version() -> None:
    done = piped("--version")
    assert done.returncode == 0 and done.stdout == f"kernelforge {version()}\n"
    assert version()[0].isdigit()


def test_runs_piped_keeps_every_column_whole() -> None:
    done = piped("runs", "--root", str(RUNS))
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    for words in ("rms_norm_bf16_profiled", "rms_norm_bf16_16384x4096", "softmax_bf16_4096x32768", "NVIDIA H200"):
        assert words in done.stdout
    assert "19.3x (node 82)" in done.stdout and "2026-11-30" in done.stdout


# ---- the README and the cards guide say what the commands and the cards are ---------------------------------------

README = (EXAMPLES.parent / "README.md").read_text()


def test_the_readme_command_table_lists_every_command() -> None:
    from kernelforge_tui.cli.main import COMMANDS

    table = [line for line in README.splitlines() if line.startswith("| `kernelforge ")]
    for command in COMMANDS:
        assert any(f"`kernelforge {command} " in row or f"/ `kernelforge {command} " in row for row in table), command
    assert any("`kernelforge --version`" in row for row in table)


def test_the_cards_guide_example_names_the_card_files() -> None:
    card = EXAMPLES / "cards" / "softmax_bf16_small"
    guide = (EXAMPLES.parent / "docs" / "guides" / "cards.md").read_text()
    example = guide[guide.index("examples/cards/softmax_bf16_small/\n") :]
    example = example[: example.index("[stress]")]
    for name in ("card.toml", "baseline.cu", "candidates/"):
        assert name in example
    files = [
        word.strip('"') for line in example.splitlines() if line.startswith("file = ") for word in line.split()[2:3]
    ]
    assert files and all((card / name).is_file() for name in files), files
    assert "captured_*.npz" in example and any(card.glob("captured_*.npz"))


# ---- eval: a plan that cannot launch on the card is bad input -------------------------------------------------

KERNEL = CARD / "candidates" / "vec4_grid_stride.cu"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ('args = ["zz"]', ["args.0", "'zz' is neither a tensor", "pass a tensor (a, b, c)", "sizes (n)"]),
        ("block = [2048]", ["block", "1024 threads per block"]),
        ('grid = ["cdiv(n, 0)"]', ["grid.0", "division by zero"]),
        ("block = [true]", ["block.0", "true is a bool, not an integer"]),
        ("shared_bytes = 1e9", ["shared_bytes", "a float, not an integer"]),
    ],
)
def test_eval_refuses_a_plan_that_does_not_fit_the_card_as_bad_input(
    tmp_path: Path, change: str, words: list[str]
) -> None:
    """Exit 2 and one line naming the plan file and its field, for value errors as for schema errors; the kernel is
    never built (so this holds without nvcc or a GPU)."""
    key = change.split(" = ")[0]
    lines = [line for line in KERNEL.with_suffix(".plan.toml").read_text().splitlines() if not line.startswith(key)]
    plan = tmp_path / "bad.plan.toml"
    plan.write_text("\n".join([*lines, change]) + "\n")
    one_line(piped("eval", str(CARD), str(KERNEL), "--plan", str(plan)), 2, str(plan), *words, "Fix:")
    done = piped("eval", str(CARD), str(KERNEL), "--plan", str(plan), "--json")
    reply = json.loads(done.stdout)
    assert done.returncode == 2 and reply["ok"] is False and reply["error"] == "bad-input", reply
