"""What is kept of a build's output, as it is read and when it is stored: no nvcc needed (see tests/build/test_nvcc.py
for the flood through the real compiler)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge_tui.build.cubin_check import CubinError, cubin_use
from kernelforge_tui.build.nvcc_output import OutputCap, candidate_messages, host_paths_removed, parse_diagnostics
from kernelforge_tui.config import MAX_DIAGNOSTICS, MAX_LOG_BYTES
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.proposers.sections import diagnostics_text
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.evaluation import (
    MAX_DIAGNOSTIC_CHARS,
    BuildResult,
    Diagnostic,
    Evaluation,
)
from kernelforge_tui.vocabulary.nodes import NodeOutcome, NodeStatus
from tests.engine.test_search import make_card, toy_kernel


def test_the_cap_counts_messages_across_chunks() -> None:
    cap = OutputCap(max_bytes=1 << 20, max_messages=3)
    assert cap.feed(b"candidate.cu(1): warning: a\n  echo\n  ^\n\ncandi")
    assert cap.feed(b"date.cu(1): warning: b\n  echo\n")  # the second message, begun in the chunk before
    assert cap.messages == 2
    assert not cap.feed(b"candidate.cu(1): warning: c\ncandidate.cu(1): warning: d\n  echo\n")
    assert cap.overflowed and cap.messages == 4
    assert cap.text().endswith("warning: c\n") and "warning: d" not in cap.text()


def test_the_cap_keeps_whole_lines_under_its_bytes() -> None:
    cap = OutputCap(max_bytes=100, max_messages=1000)
    assert not cap.feed(b"ptxas info : x\n" * 20)
    assert cap.read_bytes == 300 and len(cap.text()) <= 100 and cap.text().endswith("x\n")
    assert "300 bytes read" in cap.overflow_message()


def test_host_build_paths_become_the_candidates_name() -> None:
    work = Path("/tmp/kernelforge-build-12-abc/work")
    line = f"ptxas {work}/tmpxft_00002097_00000000-6_candidate.ptx, line 23; error   : Unknown symbol '%r99'"
    assert host_paths_removed(line, work) == "ptxas candidate.ptx, line 23; error   : Unknown symbol '%r99'"
    assert host_paths_removed(f"cd {work.parent}", work) == "cd kernelforge-build"


def huge_build() -> BuildResult:
    line = "x" * (10 * MAX_DIAGNOSTIC_CHARS)
    diagnostics = [Diagnostic(severity="warning", message=line, source_line=line) for _ in range(300)]
    return BuildResult(ok=False, key="k", failure="compile error", log="é" * (3 << 20), diagnostics=diagnostics)


def test_a_build_result_is_bounded() -> None:
    bounded = huge_build().bounded()
    assert len(bounded.log.encode()) <= MAX_LOG_BYTES + 100 and "characters of the log dropped" in bounded.log
    assert len(bounded.diagnostics) == MAX_DIAGNOSTICS + 1
    assert bounded.diagnostics[-1].message == f"{300 - MAX_DIAGNOSTICS} more diagnostics dropped"
    assert all(len(d.message) < MAX_DIAGNOSTIC_CHARS + 100 for d in bounded.diagnostics)
    small = BuildResult(ok=True, key="k", log="fine\n")
    assert small.bounded() is small


def test_a_stored_build_is_bounded(tmp_path: Path) -> None:
    """A huge build log (from any builder) stored with its node stays a row SQLite takes and replays small."""
    store = RunStore.create(tmp_path / "run", make_card(tmp_path / "card"), "simulated", "none", RunSettings())
    k = toy_kernel(128, 1)
    node = store.add_node(None, k.source, k.plan)
    evaluation = Evaluation(ok=False, failure="compile", reason="compile error", build=huge_build())
    store.finish_node(node.id, evaluation, NodeOutcome(status=NodeStatus.FAILED, failure="compile"), {})
    stored = store.evaluation(node.id)
    assert stored is not None and stored.build is not None
    assert len(stored.model_dump_json()) < 2 * MAX_LOG_BYTES + MAX_DIAGNOSTICS * 3 * MAX_DIAGNOSTIC_CHARS


def test_a_damaged_cubin_is_an_error() -> None:
    with pytest.raises(CubinError):
        cubin_use(b"not an elf")
    with pytest.raises(CubinError):
        cubin_use(b"\x7fELF\x02\x01" + b"\0" * 58 + b"\xff" * 8)


# nvcc 13's output for a gemm_sm90 render whose TILE_K was set to 40 (the CUTLASS 4.2 headers' root replaced)
CUTLASS_LOG = Path(__file__).parents[1] / "support" / "fixtures" / "cutlass_static_assert.log"


def test_a_cutlass_error_reaches_the_debugger_as_its_cause_at_the_candidates_line() -> None:
    root = Path("/opt/cutlass/include")
    log = CUTLASS_LOG.read_text().replace("CUTLASS_ROOT", str(root))
    kept = candidate_messages(log, [root])
    assert kept.splitlines()[0] == (
        "kernelforge: error in header cute/arch/mma_sm90.hpp(1312), reached from line 73: "
        'static assertion failed with "Tile_K must be a multiple of 16."'
    )
    assert "instantiation of" not in kept and str(root) not in kept and len(kept) < 1000  # no backtrace
    source = "\n".join(f"line {n}" for n in range(1, 100))
    first = parse_diagnostics(kept, source)[0]
    assert (first.file, first.line, first.severity) == ("candidate.cu", 73, "error")
    assert (
        first.message
        == 'in cute/arch/mma_sm90.hpp(1312): static assertion failed with "Tile_K must be a multiple of 16."'
    )
    shown = diagnostics_text(parse_diagnostics(kept, source))
    assert shown.splitlines()[:2] == [
        'candidate.cu:73: error: in cute/arch/mma_sm90.hpp(1312): static assertion failed with "Tile_K must be a '
        'multiple of 16."',
        "    73 | line 73",
    ]
    # any other header's text stays withheld, as before
    assert (
        candidate_messages(log).splitlines()[0] == "kernelforge withheld: error in another file, reached from line 73"
    )
    assert candidate_messages(log, [Path("/opt/other")]).splitlines()[0].startswith("kernelforge withheld")
