"""What a new user meets first (issue 34): the resume hint that works, tables at 80 columns, bundled example runs that
open read-only (and `runs copy`), and card paths recorded relative to the run."""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shlex
import shutil
import sqlite3
from pathlib import Path

import pytest
from rich.console import Console

from kernelforge_tui.cli import bench as bench_cli
from kernelforge_tui.cli import doctor as doctor_cli
from kernelforge_tui.cli.main import build_parser, main
from kernelforge_tui.cli.runs import cmd_runs
from kernelforge_tui.config import data_dir, kernels_dir
from kernelforge_tui.engine.at_rest import steer_at_rest
from kernelforge_tui.store import DB_NAME, EXAMPLE_MARK, RunStore, StoreError, copy_run
from kernelforge_tui.store.files import connect
from kernelforge_tui.vocabulary.commands import BanSubtree
from tests.conftest import EXAMPLES

RUNS = EXAMPLES / "runs"
EXAMPLE_RUNS = sorted(p.parent for p in RUNS.glob(f"*/{DB_NAME}"))
CARD = EXAMPLES / "cards" / "vector_add_f32"


def console80() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=80, color_system=None), out


def tree_state(run_dir: Path) -> dict[str, str]:
    """Every file in the run's directory with a hash of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.iterdir())}


# ---- the resume hint -------------------------------------------------------------------------------------------


def test_the_resume_hint_of_a_simulated_run_is_a_command_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert main(["optimize", str(CARD), "--simulate", "--budget-iters", "1", "--run-dir", str(run_dir)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("resume or extend it with: kernelforge optimize --resume"), line
    command = shlex.split(line.split(": ", 1)[1])
    assert "--simulate" in command and command[command.index("--budget-iters") + 1] == "2"  # the cap it spent, raised
    assert main([*command[1:], "--json"]) == 0  # the printed command itself continues the run


# ---- tables at 80 columns --------------------------------------------------------------------------------------


def test_runs_at_80_columns_keeps_every_run_name_whole() -> None:
    console, out = console80()
    args = build_parser().parse_args(["runs", "--root", str(RUNS)])
    assert cmd_runs(args, console) == 0
    text = out.getvalue()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    for run in EXAMPLE_RUNS:
        assert f"│ {run.name} " in text  # whole, on one line
    assert "left out at this width:" in text


def test_doctor_at_80_columns_prints_each_fix_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    fix = "/a/long/path/to/a/virtual/environment/bin/python -m pip install -e '/a/long/checkout/path[gpu]'"
    checks = [doctor_cli.Check(name="pycuda", ok=False, detail="not installed", fix=fix)]
    monkeypatch.setattr(doctor_cli, "doctor_checks", lambda cluster=None: checks)
    console, out = console80()
    doctor_cli.cmd_doctor(argparse.Namespace(cluster=None, json=False), console)
    assert f"fix pycuda: {fix}" in out.getvalue().splitlines()  # one line, soft-wrapped by the terminal only
    assert "…" not in out.getvalue()


def test_bench_list_is_one_line_a_task_at_80_columns_and_offers_simulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_cli, "detect_gpus", lambda: [])
    console, out = console80()
    args = build_parser().parse_args(["bench", "--list"])
    assert bench_cli.cmd_bench(args, console) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("no GPU here? kernelforge bench --simulate")
    assert all(len(line) <= 80 for line in lines)
    tasks = [r.task for r in bench_cli.list_tasks(bench_cli.select([]))]
    assert len(lines) == len(tasks) + 4  # the hint, the title, the header, one line a task, the footer
    assert [line.split()[0] for line in lines[3:-1]] == tasks  # every name whole, first on its line


# ---- bundled examples open read-only ---------------------------------------------------------------------------


@pytest.mark.parametrize("run_dir", EXAMPLE_RUNS, ids=lambda p: p.name)
def test_an_example_run_is_read_without_writing_and_refuses_writers(run_dir: Path) -> None:
    before = tree_state(run_dir)
    with RunStore.open(run_dir, readonly=True) as store:
        store.nodes()
        assert store.read_only_reason is not None and "kernelforge runs copy" in store.read_only_reason
    connect(run_dir / DB_NAME, readonly=True).close()  # how other readers (cast export) open it
    for write in (lambda: RunStore.open(run_dir), lambda: RunStore.resume(run_dir)):
        with pytest.raises(StoreError, match=r"opens read-only: copy it .*kernelforge runs copy"):
            write()
    with pytest.raises(StoreError, match="kernelforge runs copy"):  # the TUI's b/t keys at rest
        steer_at_rest(run_dir, BanSubtree(node_id=1))
    assert tree_state(run_dir) == before  # no WAL index, no writer.lock, not a byte of run.sqlite


def test_a_run_marked_as_an_example_is_read_only_anywhere(tmp_path: Path) -> None:
    run_dir = copy_run(RUNS / "softmax_bf16", tmp_path / "marked")
    (run_dir / EXAMPLE_MARK).write_text("an example\n")
    with pytest.raises(StoreError, match="is an example shipped with kernelforge"):
        RunStore.resume(run_dir)
    assert not (run_dir / "writer.lock").exists()


def test_runs_copy_gives_a_writable_run_on_the_same_card(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = RUNS / "softmax_bf16"
    dest = tmp_path / "mine" / "softmax"
    assert main(["runs", "copy", str(source), str(dest)]) == 0
    assert f"copied to {dest}" in capsys.readouterr().out
    assert not (dest / EXAMPLE_MARK).exists() and not (dest / "writer.lock").exists()
    card = (EXAMPLES / "cards" / "softmax_bf16_4096x32768").resolve()
    assert recorded(dest) == os.path.relpath(card, dest.resolve())  # the same card, relative to the copy
    with RunStore.open(source, readonly=True) as original, RunStore.resume(dest) as copy:
        assert copy.read_only_reason is None
        assert copy.run_info().run_id == "softmax" and copy.run_info().node_count == original.run_info().node_count
        assert copy.card_dir() == original.card_dir() == EXAMPLES / "cards" / "softmax_bf16_4096x32768"
        copy.set_banned(1, True)  # steerable
    assert main(["runs", "copy", str(source), str(dest)]) == 2  # never over a run


def test_the_tuis_export_default_is_under_the_data_dir() -> None:
    assert kernels_dir() == data_dir() / "kernels"


# ---- card paths relative to the run ----------------------------------------------------------------------------


def recorded(run_dir: Path) -> str:
    conn = sqlite3.connect(f"{(run_dir / DB_NAME).as_uri()}?immutable=1", uri=True)
    try:
        return str(conn.execute("SELECT card_dir FROM run").fetchone()[0])
    finally:
        conn.close()


def test_the_bundled_examples_record_their_card_relative_to_the_run() -> None:
    assert EXAMPLE_RUNS
    for run_dir in EXAMPLE_RUNS:
        assert not Path(recorded(run_dir)).is_absolute(), run_dir


def test_show_of_an_example_suggests_an_eval_of_the_card_in_this_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", str(RUNS / "softmax_bf16"), "-o", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    card = EXAMPLES / "cards" / "softmax_bf16_4096x32768"
    assert f"kernelforge eval {card} kernel.cu --plan plan.toml" in out
    assert (card / "card.toml").is_file()


def test_a_new_run_records_its_card_relative_and_finds_it_after_both_move(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(CARD, project / "cards" / "va")
    run_dir = project / "runs" / "r"
    command = ["optimize", str(project / "cards" / "va"), "--simulate", "--budget-iters", "0"]
    assert main([*command, "--run-dir", str(run_dir), "--json"]) == 0
    assert recorded(run_dir) == "../../cards/va"
    moved = tmp_path / "elsewhere"
    project.rename(moved)
    with RunStore.open(moved / "runs" / "r", readonly=True) as store:
        assert store.card_dir() == moved / "cards" / "va"


def test_an_old_absolute_card_path_is_found_again_under_the_run_s_parents(tmp_path: Path) -> None:
    """A run recorded on another machine: its absolute path does not exist here, the same tail does."""
    checkout = tmp_path / "checkout"
    shutil.copytree(CARD, checkout / "examples" / "cards" / "vector_add_f32")
    run_dir = copy_run(RUNS / "softmax_bf16", checkout / "examples" / "runs" / "old")
    conn = sqlite3.connect(run_dir / DB_NAME)
    conn.execute("UPDATE run SET card_dir = '/home/someone/kf/examples/cards/vector_add_f32'")
    conn.commit()
    conn.close()
    with RunStore.open(run_dir, readonly=True) as store:
        assert store.card_dir() == checkout / "examples" / "cards" / "vector_add_f32"
