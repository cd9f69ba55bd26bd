"""How verify decides on one kernel from the GPU check and the sanitizer (their runs are on the GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge_tui.cast import verify
from kernelforge_tui.cast.manifest import AuditEntry
from kernelforge_tui.cast.probe import KernelCheck, SetOutcome
from kernelforge_tui.cast.sanitizer import ToolResult
from tests.support.fixtures.cast.cast_support import softmax_entry

TIMED = {"timed": True, "kernel_us": 10.0, "eager_us": 20.0, "speedup": 2.0, "reps": 40}


def _tools(monkeypatch: pytest.MonkeyPatch, failing: str = "") -> list[str]:
    ran: list[str] = []

    def run_tool(sanitizer: str, tool: str, package: Path, kernel: str) -> ToolResult:
        ran.append(tool)
        ok = tool != failing
        summary = "ERROR SUMMARY: 0 errors" if ok else "ERROR SUMMARY: 8 errors"
        return ToolResult(tool=tool, ok=ok, summary=summary, report=f"{tool} report", seconds=1.0)  # type: ignore[arg-type]

    monkeypatch.setattr(verify, "run_tool", run_tool)
    return ran


def _judge(check: KernelCheck) -> tuple[object, dict[str, str], dict[str, bytes]]:
    entry, _ = softmax_entry()
    dropped: dict[str, str] = {}
    files: dict[str, bytes] = {}
    kept = verify._judge(entry, check, Path("staged.cast"), "cs", files, dropped, lambda _: None)
    return kept, dropped, files


def test_a_kernel_that_passes_everything_keeps_its_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _tools(monkeypatch)
    check = KernelCheck(
        kernel="k0-softmax", ok=True, sets=[SetOutcome(name="s", ok=True)], interval=(1.8, 2.2), faster=True, **TIMED
    )
    kept, dropped, files = _judge(check)
    assert ran == ["memcheck", "racecheck", "initcheck"] and dropped == {}
    assert [c.name for c in kept.checks] == ["correctness", "memcheck", "racecheck", "initcheck", "timing"]  # type: ignore[attr-defined]
    assert kept.latency.speedup_vs_eager == 2.0 and kept.latency.eager_us == 20.0  # type: ignore[attr-defined]
    assert files["reports/k0-softmax/racecheck.txt"] == b"racecheck report"


def test_an_unsafe_kernel_is_reported_unsafe_even_when_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    _tools(monkeypatch, failing="memcheck")
    check = KernelCheck(kernel="k0-softmax", ok=True, interval=(0.4, 0.6), faster=False, **TIMED)
    kept, dropped, _ = _judge(check)
    assert kept is None
    assert dropped["k0-softmax"].startswith("compute-sanitizer memcheck: ERROR SUMMARY: 8 errors")


def test_a_kernel_no_faster_than_eager_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    _tools(monkeypatch)
    check = KernelCheck(kernel="k0-softmax", ok=True, interval=(0.95, 1.05), faster=False, **TIMED)
    kept, dropped, _ = _judge(check)
    assert kept is None and "not faster than eager PyTorch beyond the noise" in dropped["k0-softmax"]


def test_a_disagreeing_kernel_never_reaches_the_sanitizer(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _tools(monkeypatch)
    kept, dropped, _ = _judge(KernelCheck(kernel="k0-softmax", ok=False, reason="set fresh:7001: disagrees"))
    assert kept is None and ran == [] and dropped == {"k0-softmax": "set fresh:7001: disagrees"}


def test_the_audit_follows_the_verdicts() -> None:
    entry, _ = softmax_entry()
    line = AuditEntry(variant="v", decision="kernel", reason="proven in the search", kernel=entry.id)
    left_out = verify._audit(line, {entry.id: "compute-sanitizer racecheck: ..."}, [])
    assert (left_out.decision, left_out.kernel) == ("fallback", None)
    assert left_out.reason == "left out: compute-sanitizer racecheck: ..."
    fallback = AuditEntry(variant="w", decision="fallback", reason="a fused pattern")
    assert verify._audit(fallback, {}, []) == fallback
