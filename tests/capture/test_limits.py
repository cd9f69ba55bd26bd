"""`kernelforge capture` at its edges: a model that never returns (--timeout), Ctrl-C, an output directory that
cannot be made, and the ranked table's numbering."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from kernelforge_tui.capture import ranking
from kernelforge_tui.capture.manifest import CaptureManifest, Variant, VariantStatus
from kernelforge_tui.cli.capture import render_capture
from kernelforge_tui.cli.main import main

if os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    import torch  # noqa: F401
else:
    pytest.importorskip("torch", reason="capture needs torch (CI installs it: .ci/run)")

ROOT = Path(__file__).resolve().parents[2]

ENDLESS = """import time

import torch


def build(device):
    end = time.monotonic() + 60  # never, for the test (a capture without a limit fails after a minute, not hangs)
    while time.monotonic() < end:  # and it swallows every Exception on its way
        try:
            torch.ones(4).sum()
        except Exception:
            pass
"""

SLEEPS = """import pathlib
import time

import torch


def build(device):
    pathlib.Path("started").touch()
    time.sleep(120)
"""

TOUCHES = """import pathlib

import torch


def build(device):
    pathlib.Path(__file__).with_name("ran").touch()
    return torch.nn.Identity(), (torch.ones(4),)
"""


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_model_that_never_returns_is_stopped_by_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "endless.py"
    model.write_text(ENDLESS)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGALRM)
    code, error = run_json(["capture", str(model), "-o", str(out), "--device", "cpu", "--timeout", "0.5"], capsys)
    assert code == 2 and error["error"] == "bad-input"
    message = str(error["message"])
    assert message.startswith("the model did not finish within --timeout 0.5 s (stopped while importing the model")
    assert "raise --timeout" in message and "[capture]" in message
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    monkeypatch.setenv("KERNELFORGE_CAPTURE__TIMEOUT_S", "0.5")  # the config's default, without --timeout
    code, error = run_json(["capture", str(model), "-o", str(out), "--device", "cpu"], capsys)
    assert code == 2 and "within --timeout 0.5 s" in str(error["message"])
    code, error = run_json(["capture", str(model), "-o", str(out), "--timeout", "0"], capsys)
    assert code == 2 and "above 0" in str(error["message"])


def _capture_then_sigint(model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The capture command in a real process, sent SIGINT once the model is running (SIGINT at its default, which a
    background job of a non-interactive shell would not have)."""
    command = [sys.executable, "-m", "kernelforge_tui.cli", "capture", str(model), "-o", str(out), "--device", "cpu"]
    process = subprocess.Popen(
        [*command, *extra],
        cwd=model.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"COLUMNS": "200", "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    started = model.parent / "started"
    waited = 0
    while not started.exists() and process.poll() is None and waited < 1200:
        time.sleep(0.1)
        waited += 1
    assert started.exists(), process.communicate(timeout=30)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path: Path) -> None:
    model = tmp_path / "sleeps.py"
    model.write_text(SLEEPS)
    out = tmp_path / "old.capture"
    out.mkdir()
    (out / "capture.json").write_text("kept")
    result = _capture_then_sigint(model, out, "--force")
    assert result.returncode == 130, result
    assert result.stderr == ""  # no traceback
    lines = [line for line in result.stdout.splitlines() if not line.startswith("building the model")]
    assert lines == [
        "error: capture interrupted while importing the model file and building the model: nothing was written; "
        f"{out} is as it was"
    ]
    assert (out / "capture.json").read_text() == "kept"


@pytest.mark.parametrize("blocker", ["a file in the way", "the directory exists"])
def test_the_output_directory_is_checked_before_the_model_runs(
    blocker: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "touches.py"
    model.write_text(TOUCHES)
    if blocker == "a file in the way":
        (tmp_path / "plain").write_text("")
        out, words = tmp_path / "plain" / "sub" / "out", f"cannot be made: {tmp_path / 'plain'} is not a directory"
    else:
        out, words = tmp_path / "out", "exists: pass --force"
        out.mkdir()
    code, error = run_json(["capture", str(model), "-o", str(out), "--device", "cpu"], capsys)
    assert code == 2 and words in str(error["message"])
    assert not (tmp_path / "ran").exists()  # refused before the model ran


def _variant(vid: str, status: VariantStatus, share: float, saving: float = 0.0) -> Variant:
    return Variant(
        id=vid,
        rank=0,
        kind="op",
        op="aten.op",
        title=f"aten.op {vid}",
        steps=[],
        calls=1,
        time_us=share * 100,
        share=share,
        status=status,
        card=f"card_{vid}" if status == "card" else None,
        template=True,
        expected_speedup=2.0 if saving else 1.0,
        expected_saving=saving,
    )


def test_the_table_ranks_its_rows_one_to_n() -> None:
    """A card with nothing to save, views that take time, and more unsupported variants than the table lists: the
    rows shown are still ranks 1..n."""
    variants = [
        _variant("v01", "card", 0.20, saving=0.10),
        _variant("v02", "card", 0.01),  # k = 1: nothing to save, still a card
        _variant("v03", "no-kernel", 0.15),
        *(_variant(f"v{k:02d}", "unsupported", 0.04 - k / 1000) for k in range(4, 20)),
    ]
    manifest = CaptureManifest(
        kernelforge_version="0",
        torch_version="0",
        model_file="m.py",
        entry="build",
        device="cpu",
        device_name="cpu",
        timing="cpu-wall",
        timing_note="",
        repeats=1,
        total_time_us=100.0,
        forward_wall_us=100.0,
        calls=len(variants),
        created_at=0.0,
        variants=ranking.ranked(variants),
    )
    console = Console(width=250, record=True)
    render_capture(manifest, Path("m.capture"), console)
    rows = [line.split("│") for line in console.export_text().splitlines() if line.startswith("│")]
    ranks = [int(cells[1]) for cells in rows if cells[1].strip().isdigit()]
    assert len(ranks) == 2 + 12 and ranks == list(range(1, len(ranks) + 1))
    assert [v.rank for v in manifest.variants] == list(range(1, len(variants) + 1))
