"""`kernelforge export` from recorded runs on a machine without a GPU (nvcc builds for real, as in CI)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernelforge_tui.cards import plan_for_kernel
from kernelforge_tui.cast.export import export
from kernelforge_tui.cast.manifest import read_package
from kernelforge_tui.cli.main import main
from kernelforge_tui.gpu.detect import detect_gpus
from kernelforge_tui.vocabulary.nodes import NodeStatus
from tests.support.fixtures.cast.cast_support import EXAMPLES, make_run
from tests.support.nvcc_marks import needs_nvcc

CARD = EXAMPLES / "cards" / "softmax_bf16_small"
KERNEL = CARD / "candidates" / "block_row_bf16.cu"


def _run(tmp_path: Path, candidate_us: float = 10.0, baseline_us: float = 100.0, **kwargs: object) -> Path:
    run_dir = tmp_path / "run"
    make_run(run_dir, CARD, KERNEL.read_text(), plan_for_kernel(KERNEL), candidate_us, baseline_us, **kwargs)  # type: ignore[arg-type]
    return run_dir


@needs_nvcc
def test_export_writes_a_package_from_a_run(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    manifest = export(run_dir, tmp_path / "model.cast", sanitize=False, arch="sm_90")
    package = read_package(tmp_path / "model.cast")
    assert package.manifest == manifest
    assert manifest.stamp is None and any("--no-sanitize" in n for n in manifest.notes)
    (kernel,) = manifest.kernels
    guard = kernel.guard
    assert guard.overload == "aten::_softmax.default"
    assert [(t.name, t.shape, t.dtype, t.strides, t.alignment) for t in guard.inputs] == [
        ("x", (21, 1003), "bfloat16", (1003, 1), 256)
    ]
    assert [(t.name, t.shape, t.dtype) for t in guard.outputs] == [("y", (21, 1003), "bfloat16")]
    assert {a.name: a.accepts for a in guard.args if a.tensor is None} == {"dim": [-1, 1], "half_to_float": [False]}
    assert guard.capability == (9, 0) and kernel.cubin_arch == "sm_90"
    assert kernel.launch.entry == "softmax_block_row_bf16"
    assert (kernel.launch.grid, kernel.launch.block) == ((21, 1, 1), (128, 1, 1))
    assert [(a.name, a.value) for a in kernel.launch.args if a.kind == "scalar"] == [("rows", 21), ("cols", 1003)]
    assert kernel.tolerances["y"].rtol == pytest.approx(0.016)
    cubin = package.member(kernel.files.cubin)
    ptx = package.member(kernel.files.ptx).decode()
    assert cubin.startswith(b"\x7fELF")
    assert ".entry softmax_block_row_bf16" in ptx and ".target sm_90" in ptx
    assert package.member(kernel.files.source).decode() == KERNEL.read_text()
    assert sorted(Path(s).name for s in kernel.files.sets) == ["captured_0.npz", "captured_1.npz"]
    latency = kernel.latency
    assert latency.speedup_vs_baseline == pytest.approx(10.0, rel=0.05)
    assert latency.interval_vs_baseline is not None and latency.interval_vs_baseline[0] > 1
    assert latency.kernel_us is None and latency.eager_us is None  # nothing ran on a GPU
    assert kernel.provenance.run_id == "run" and kernel.provenance.node_id == 1
    assert [(a.variant, a.decision, a.kernel) for a in manifest.audit] == [("softmax_bf16_small", "kernel", kernel.id)]


@needs_nvcc
def test_stored_sets_too_large_to_carry_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelforge_tui.cast import export as exporting

    monkeypatch.setattr(exporting, "MAX_SET_BYTES", 1024)
    manifest = export(_run(tmp_path), tmp_path / "model.cast", sanitize=False, arch="sm_90")
    (kernel,) = manifest.kernels
    assert kernel.files.sets == []
    (note,) = [n for n in manifest.notes if "stored set" in n]
    assert note.startswith("softmax_bf16_small: its 2 stored set(s) take ")
    assert note.endswith("more than the 0 MiB a package carries: checked on fresh draws and stress sets only")


@needs_nvcc
def test_a_kernel_within_the_noise_of_the_baseline_falls_back_with_why(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, candidate_us=100.0, baseline_us=100.5)
    manifest = export(run_dir, tmp_path / "model.cast", sanitize=False)
    assert manifest.kernels == []
    (audit,) = manifest.audit
    assert audit.decision == "fallback"
    assert "not faster than the card's baseline beyond the noise" in audit.reason


@needs_nvcc
def test_a_simulated_run_proves_nothing(tmp_path: Path) -> None:
    manifest = export(_run(tmp_path, backend="simulated"), tmp_path / "m.cast", sanitize=False)
    assert manifest.kernels == [] and "not measured on a GPU" in manifest.audit[0].reason


@needs_nvcc
def test_an_unproven_node_is_not_exported(tmp_path: Path) -> None:
    manifest = export(_run(tmp_path, status=NodeStatus.BUILT), tmp_path / "m.cast", sanitize=False)
    assert manifest.kernels == [] and "not proven correct" in manifest.audit[0].reason


def _rms_norm_run(tmp_path: Path) -> Path:
    """A run of a card no aten call is known for: it exports no kernel."""
    card = EXAMPLES / "cards" / "rms_norm_bf16_small"
    kernel = EXAMPLES / "kernels" / "rms_norm" / "block_row.cu"
    run_dir = tmp_path / "run"
    plan = plan_for_kernel(next(card.glob("candidates/*.cu")))
    make_run(run_dir, card, kernel.read_text(), plan, 10.0, 100.0)
    return run_dir


def test_a_card_without_an_aten_twin_is_audited(tmp_path: Path) -> None:
    manifest = export(_rms_norm_run(tmp_path), tmp_path / "m.cast", sanitize=False)
    assert manifest.kernels == []
    assert "no aten call is known for a hand-written rms_norm card" in manifest.audit[0].reason


def test_an_export_of_no_kernel_leaves_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.cast"
    code = main(["export", str(_rms_norm_run(tmp_path)), "-o", str(out), "--no-sanitize", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 1 and summary["package"] is None and summary["kernels"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # neither m.cast nor a temporary left


@needs_nvcc
def test_the_recorded_h200_run_exports(tmp_path: Path) -> None:
    # A schema-1 run recorded on the H200; its card directory is absolute (it need not exist here).
    run_dir = tmp_path / "softmax_bf16"
    shutil.copytree(EXAMPLES / "runs" / "softmax_bf16", run_dir)
    manifest = export(run_dir, tmp_path / "m.cast", sanitize=False)
    (kernel,) = manifest.kernels
    assert kernel.provenance.node_id == 54 and kernel.provenance.search_gpu == "NVIDIA H200"
    assert kernel.guard.inputs[0].shape == (4096, 32768)
    assert kernel.launch.shared_bytes == 65536 and kernel.latency.speedup_vs_baseline == pytest.approx(68.04, rel=1e-3)


@pytest.mark.skipif(bool(detect_gpus()), reason="this machine has a GPU")
def test_export_without_a_gpu_refuses_unless_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _run(tmp_path)
    code = main(["export", str(run_dir), "-o", str(tmp_path / "m.cast"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3 and out["error"] == "no-gpu"
    assert "--no-sanitize, which writes a package not checked on a GPU yet: the loader refuses it" in out["message"]
    assert not (tmp_path / "m.cast").exists()


@needs_nvcc
def test_the_cli_exports_with_no_sanitize_a_package_not_checked_on_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _run(tmp_path)
    code = main(["export", str(run_dir), "-o", str(tmp_path / "m.cast"), "--no-sanitize", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verified"] is False and len(out["kernels"]) == 1
    assert out["kernels"][0]["serves"] == ["eager", "compile"]
    assert out["audit"][0]["decision"] == "kernel"
    assert out["audit"][0]["reason"] == "proven in the search; not checked on a GPU yet (--no-sanitize)"


def test_the_cli_names_a_target_that_is_neither_run_nor_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["export", str(tmp_path), "-o", str(tmp_path / "m.cast"), "--no-sanitize", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and "capture.json" in out["message"]
