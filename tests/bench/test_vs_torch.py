"""bench/vs_torch.py without a GPU: the workload table against the issue's, each torch workload captured on the CPU at
a small shape into its one card, the suite cards at the goal's sizes (nothing drawn), the torch timing path with a
stand-in timer and a compiler that fails, the table's shares, ratios and goals on hand-computed numbers, --report,
and the whole bench on the simulated backend (real nvcc builds), continued on a second call.

Only the GPU calls themselves are not run here: `time_calls` (CUDA events), the torch and vendor subprocesses and
the GPU worker.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch", reason="capture needs torch (CI installs it: .ci/run)")

from kernelforge_tui.capture.loader import Entry, build
from kernelforge_tui.capture.run import CaptureRequest, capture_model
from kernelforge_tui.cards.directory import draw_inputs
from kernelforge_tui.cast.beside import BesideReply, BesideRequest
from kernelforge_tui.cli.capture import template_problem
from kernelforge_tui.config import Settings
from kernelforge_tui.engine.bench import VendorResult
from kernelforge_tui.errors import KernelForgeError
from kernelforge_tui.gpu.detect import GpuInfo
from kernelforge_tui.store import RunStore
from kernelforge_tui.suite.registry import task
from kernelforge_tui.vocabulary.evaluation import Ceilings
from tests.store.test_store import profile_of
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


vs = load_script(ROOT / "bench" / "vs_torch.py")

ISSUE = {
    # workload: (shape, dtype, eager share, torch.compile share, goal share), as the issue's table has them
    "softmax": ((4096, 32768), "bfloat16", 0.52, 0.45, 0.90),
    "layer_norm": ((16384, 4096), "bfloat16", 0.59, 0.66, 0.85),
    "rms_norm": ((16384, 4096), "bfloat16", 0.76, 0.83, 0.90),
    "group_norm": ((8, 512, 128, 128), "bfloat16", 0.16, 0.38, 0.75),
    "gelu": ((2**28,), "bfloat16", 0.74, 0.66, 0.88),
    "avg_pool": ((256, 2048, 7, 7), "bfloat16", 0.10, 0.24, 0.60),
    "silu_mul": ((16384, 11008), "bfloat16", 0.27, 1.01, 0.95),
    "stencil": ((8192, 8192), "float32", 0.12, 0.77, 0.85),
}
SMALL = {
    "softmax": [8, 64],
    "layer_norm": [8, 64],
    "rms_norm": [8, 64],
    "group_norm": [2, 64, 4, 4],
    "gelu": [1024],
    "avg_pool": [2, 16, 7, 7],
    "silu_mul": [8, 64],
}
CARDS = {
    # workload: (family, card name at the small shape, inputs, outputs)
    "softmax": ("softmax", "softmax_bf16_8x64", ["x"], ["y"]),
    "layer_norm": ("layer_norm", "layer_norm_bf16_8x64", ["x", "w", "b"], ["y"]),
    "rms_norm": ("rms_norm", "rms_norm_bf16_8x64", ["x", "w"], ["y"]),
    "group_norm": ("group_norm", "group_norm_bf16_2x64x4x4", ["x", "gamma", "beta"], ["y", "mean", "rstd"]),
    "gelu": ("elementwise", "gelu_bf16_1024", ["x"], ["y"]),
    "avg_pool": ("pooling", "avg_pool_bf16_2x16x7x7", ["x"], ["y"]),
    "silu_mul": ("elementwise", "silu_mul_bf16_8x64", ["gate", "up"], ["y"]),
}


def test_the_workload_table_is_the_issues() -> None:
    assert [w.name for w in vs.WORKLOADS] == [*ISSUE, "spmv_csr", "matmul"]
    for name, (shape, dtype, eager, compiled, goal) in ISSUE.items():
        w = vs.BY_NAME[name]
        assert (w.shape, w.dtype, w.eager_share, w.compile_share) == (shape, dtype, eager, compiled), name
        assert (w.goal.kind, w.goal.at_least, w.goal.strict) == ("ceiling", goal, False), name
    assert vs.BY_NAME["stencil"].task == "stencil_2d" and not vs.BY_NAME["stencil"].vendor
    spmv, matmul = vs.BY_NAME["spmv_csr"], vs.BY_NAME["matmul"]
    assert (spmv.task, spmv.dtype, spmv.vendor) == ("spmv_csr", "float32", True)
    assert (spmv.goal.kind, spmv.goal.at_least, spmv.goal.strict) == ("vendor", 1.0, True)  # faster than cuSPARSE
    assert (matmul.dtype, matmul.vendor) == ("bfloat16", True)
    assert (matmul.goal.kind, matmul.goal.at_least, matmul.goal.strict) == ("vendor", 0.5, False)
    assert [w.name for w in vs.select(["matmul", "gelu"])] == ["gelu", "matmul"]  # the table's order
    with pytest.raises(KernelForgeError, match=r"no workload 'conv'.*softmax"):
        vs.select(["conv"])


@pytest.mark.parametrize("name", list(SMALL))
def test_each_torch_workload_captures_to_its_one_card(name: str, tmp_path: Path) -> None:
    w = vs.BY_NAME[name]
    out = tmp_path / name
    capture_model(vs.capture_request(w.entry, SMALL[name], out, "cpu"), template_check=template_problem)
    card = vs.the_card(w, out, SMALL[name])
    family, card_name, inputs, outputs = CARDS[name]
    assert (card.spec.family, card.spec.name) == (family, card_name)
    assert [t.name for t in card.spec.inputs] == inputs and [t.name for t in card.spec.outputs] == outputs
    if name == "group_norm":
        assert card.spec.sizes["groups"] == 32
    if name == "rms_norm":
        assert "eps 1e-06" in card.spec.description  # the workload's eps (the templates' eps for rms_norm)


@pytest.fixture(scope="module")
def softmax_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("softmax") / "capture"
    capture_model(vs.capture_request("softmax", [8, 64], out, "cpu"), template_check=template_problem)
    return out


def test_a_capture_that_is_not_the_workloads_card_is_refused(softmax_capture: Path, tmp_path: Path) -> None:
    with pytest.raises(vs.CardProblem, match=r"family softmax \(wanted layer_norm\).*inputs \('x',\)"):
        vs.the_card(vs.BY_NAME["layer_norm"], softmax_capture, [8, 64])
    with pytest.raises(vs.CardProblem, match=r"elements 512 \(wanted 1024\)"):
        vs.the_card(vs.BY_NAME["softmax"], softmax_capture, [8, 128])
    with pytest.raises(vs.CardProblem, match="made 2 cards"):
        vs.the_card(
            vs.BY_NAME["softmax"], _capture(tmp_path, "torch.nn.functional.gelu(torch.softmax(x, -1))"), [8, 64]
        )
    wide_eps = _capture(tmp_path, "torch.nn.functional.layer_norm(x, (64,), x[0] + 1, x[1], eps=1e-3)")
    with pytest.raises(vs.CardProblem, match=r"the templates cannot serve layer_norm_bf16_8x64: eps 0\.001"):
        vs.the_card(vs.BY_NAME["layer_norm"], wide_eps, [8, 64])


def _capture(tmp_path: Path, expression: str) -> Path:
    """A one-line model of x [8, 64] (bf16) captured on the CPU."""
    model = tmp_path / f"model_{len(list(tmp_path.iterdir()))}.py"
    model.write_text(
        "import torch\n\n"
        "def build(device):\n"
        "    x = torch.randn(8, 64, dtype=torch.bfloat16)\n"
        f"    return (lambda x: {expression}), (x,)\n"
    )
    out = model.with_suffix(".capture")
    capture_model(CaptureRequest(model, out, device="cpu"), template_check=template_problem)
    return out


def test_the_torch_stencil_is_the_suite_stencil() -> None:
    """What eager and torch.compile time for the stencil computes the card's reference (boundary copied)."""
    built = build(vs.MODELS, Entry("stencil"), {"device": "cpu", "shape": [12, 20]})
    (u,) = built.args
    with torch.no_grad():
        v = built.model(u)
    expected = task("stencil_2d").reference({"u": u.numpy()}, {"ny": 12, "nx": 20})["v"]
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-6, atol=1e-6)
    assert np.array_equal(v.numpy()[0], u.numpy()[0]) and not np.array_equal(v.numpy()[1:-1], u.numpy()[1:-1])


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_the_suite_cards_are_written_at_the_goal_sizes_without_drawing_them(tmp_path: Path) -> None:
    w = vs.BY_NAME
    stencil = vs.write_suite_card(task("stencil_2d"), "float32", w["stencil"].scale, tmp_path)
    spmv = vs.write_suite_card(task("spmv_csr"), "float32", w["spmv_csr"].scale, tmp_path)
    matmul = vs.write_suite_card(task("square_matrix_mul"), "bfloat16", w["matmul"].scale, tmp_path)
    assert (stencil.spec.name, stencil.spec.sizes) == ("stencil_2d_fp32_s26", {"ny": 8192, "nx": 8192})
    assert stencil.spec.bytes_moved() == 2 * 4 * 8192 * 8192
    assert (spmv.spec.name, spmv.spec.sizes) == ("spmv_csr_fp32_s26", {"nrows": 2**22, "ncols": 2**22, "nnz": 2**26})
    assert spmv.spec.bytes_moved() == 4 * 2**26 * 2 + 4 * (2**22 + 1) + 4 * 2**22 * 2  # values, col_idx, row_ptr, x, y
    assert (matmul.spec.name, matmul.spec.sizes) == ("square_matrix_mul_bf16_s24", {"n": 4096})
    assert matmul.spec.flops() == 2 * 4096**3 and matmul.spec.bytes_moved() == 3 * 2 * 4096**2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(c.spec.name for c in (stencil, spmv, matmul))
    for card in (stencil, spmv, matmul):
        assert template_problem(card.spec) is None
        assert all(s.seed is not None for s in card.spec.input_sets)  # seeded: drawn where they are used
        files = _files(card.root)
        assert sorted(files) == ["baseline.cu", "card.toml", "reference.py"] and sum(files.values()) < 64 << 10
        assert "scale 2^2" in (card.root / "reference.py").read_text()
    assert "scale 2^26" in (spmv.root / "reference.py").read_text()
    assert task("spmv_csr").vendor.library.startswith("cuSPARSE")  # type: ignore[union-attr]
    assert task("square_matrix_mul").vendor.library.startswith("cuBLAS")  # type: ignore[union-attr]


def test_a_suite_card_beyond_the_scales_draws_and_references_at_its_sizes(tmp_path: Path) -> None:
    for _ in range(2):  # written twice into the same place: replaced
        card = vs.write_suite_card(task("stencil_2d"), "float32", 2**8, tmp_path)
    assert card.spec.sizes == {"ny": 16, "nx": 16} and card.spec.bytes_moved() == 2 * 4 * 256
    inputs = draw_inputs(card.spec, 3)
    assert inputs["u"].shape == (16, 16)
    assert card.reference(inputs)["v"].shape == (16, 16)
    assert vs.write_suite_card(task("stencil_2d"), "float32", 2**10, tmp_path).spec.name == "stencil_2d_fp32_s10"


class CountingTimer:
    """Stands in for `time_calls` (CUDA events): calls the model a few times and returns fixed samples."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, torch_module: Any, call: Any, request: Any) -> list[float]:
        for _ in range(3):
            call()
            self.calls += 1
        return [3.0, 1.0, 2.0]


def test_the_torch_side_captures_times_and_reports_a_failing_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("inductor exploded")

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(torch.compiler, "reset", lambda: None)
    request = vs.TorchRequest(
        workload="silu_mul",
        entry="silu_mul",
        shape=[8, 64],
        capture=True,
        card_dir=tmp_path / "capture",
        modes=["eager", "compile"],
        reps=3,
        flush_bytes=1 << 20,
        device="cpu",
    )
    timer = CountingTimer()
    reply = vs.measure_torch(request, timer)
    assert reply.capture_error == "" and timer.calls == 3
    assert vs.the_card(vs.BY_NAME["silu_mul"], tmp_path / "capture", [8, 64]).spec.name == "silu_mul_bf16_8x64"
    assert reply.samples_us == {"eager": [3.0, 1.0, 2.0]} and "eager" in reply.first_call_s
    eager, compiled = vs.timed("eager", reply, "eager"), vs.timed("torch.compile", reply, "compile")
    assert (eager.median_us, eager.reps, eager.error) == (2.0, 3, "")
    assert compiled.median_us is None and compiled.error == "RuntimeError: inductor exploded"
    died = vs.TorchReply(died="the torch subprocess exited -9 without a reply: Killed")
    assert vs.timed("eager", died, "eager").error.endswith("Killed")


CEILINGS = Ceilings(gpu_name="H200", copy_gbps=4000.0, fma_tflops=60.0, capability=(9, 0), sm_count=132, l2_bytes=1)


def _result(name: str, torch_us: dict[str, float | str], ours_us: float | None, nbytes: int = 2**30) -> Any:
    """A workload's result with hand-chosen times: a number is a median, a string a failure."""
    cells = {
        mode: vs.Timed(what=mode, median_us=v) if isinstance(v, float) else vs.Timed(what=mode, error=v)
        for mode, v in torch_us.items()
    }
    if "vendor" in cells:
        cells["vendor"].what = "cuBLAS (torch.mm)" if name == "matmul" else "cuSPARSE (torch.sparse)"
    ours = None if ours_us is None else vs.Ours(run_dir=Path("r"), state="finished", best_us=ours_us, speedup=2.0)
    return vs.WorkloadResult(
        workload=name, card=f"{name}_card", bytes=nbytes, gpu=0, ceilings=CEILINGS, torch=cells, ours=ours
    )


def test_shares_ratios_and_goals_on_hand_computed_numbers() -> None:
    softmax = vs.BY_NAME["softmax"]
    # 2^30 bytes at 4000 GB/s: 268.435456 us. Ours at 300 us reaches 89.48%, 0.52 points short of 90%, which needs
    # 268.435456 / 0.9 = 298.26 us.
    missed = _result(
        "softmax", {"eager": 500.0, "compile": 400.0, "max-autotune": "BackendCompilerFailed: boom"}, 300.0
    )
    figures = vs.numbers(softmax, missed)
    assert figures.copy_us == pytest.approx(268.435456)
    assert figures.shares == pytest.approx({"eager": 0.536871, "compile": 0.671089, "ours": 0.894785}, abs=1e-6)
    assert (figures.ours_over_eager, figures.best_torch, figures.ours_over_best_torch) == (0.6, "compile", 0.75)
    assert figures.goal_met is False
    assert figures.goal_words == "missed by 0.5 points: 89.5% < 90%; needs <= 298.3 us, has 300 us (1.01x the time)"
    cells = dict(zip(vs.HEADER, vs.row(softmax, missed), strict=True))
    assert cells["eager us (share)"] == "500 (54%)" and cells["torch.compile us (share)"] == "400 (67%)"
    assert cells["max-autotune us (share)"] == "failed: BackendCompilerFailed: boom"
    assert cells["ours us (share)"] == "300 (89%)" and cells["MB"] == "1,074"
    assert (cells["ours / eager"], cells["ours / best torch"]) == ("0.60", "0.75")
    assert cells["issue: eager / compile"] == "52% / 45%" and cells["goal"] == ">= 90% of the copy ceiling"
    assert cells["met"] == "no: " + figures.goal_words
    met = _result("softmax", {"eager": 500.0}, 280.0)
    assert vs.numbers(softmax, met).goal_words == "met: 95.9% >= 90%"
    assert dict(zip(vs.HEADER, vs.row(softmax, met), strict=True))["met"] == "yes"
    assert vs.numbers(softmax, _result("softmax", {}, None)).goal_met is None
    no_ceiling = vs.numbers(softmax, missed.model_copy(update={"ceilings": None}))
    assert (no_ceiling.goal_met, no_ceiling.goal_words, no_ceiling.shares) == (
        None,
        "not measured: no copy ceiling",
        {},
    )

    spmv = vs.BY_NAME["spmv_csr"]
    slower = vs.numbers(spmv, _result("spmv_csr", {"vendor": 44.0}, 119.0))
    assert slower.goal_met is False
    assert slower.goal_words == (
        "missed: cuSPARSE (torch.sparse) / ours = 0.37, needs > 1; needs < 44 us, has 119 us (2.70x the time)"
    )
    assert vs.numbers(spmv, _result("spmv_csr", {"vendor": 44.0}, 44.0)).goal_met is False  # level is not faster
    assert vs.numbers(spmv, _result("spmv_csr", {"vendor": 44.0}, 40.0)).goal_met is True

    matmul = vs.BY_NAME["matmul"]
    assert vs.numbers(matmul, _result("matmul", {"vendor": 180.0}, 360.0)).goal_met is True  # exactly half of cuBLAS
    half = vs.numbers(matmul, _result("matmul", {"vendor": 180.0}, 400.0))
    assert half.goal_met is False and "needs <= 360 us, has 400 us" in half.goal_words
    assert half.copy_us is None and half.shares == {}  # compute-bound: no share of the copy ceiling
    cells = dict(zip(vs.HEADER, vs.row(matmul, _result("matmul", {"vendor": 180.0}, 400.0)), strict=True))
    assert cells["eager us (share)"] == "cuBLAS (torch.mm): 180" and cells["ours us (share)"] == "400"
    assert cells["ours / eager"] == cells["ours / best torch"] == "2.22"
    assert cells["torch.compile us (share)"] == "-" and cells["issue: eager / compile"] == "-"


def test_the_vendor_goals_are_judged_side_by_side_where_both_sides_were_timed() -> None:
    """Apart, ours (44 us in the worker) is not faster than cuSPARSE (44 us in torch's process); side by side on the
    same tensors the times decide. A side that was not timed (it disagreed with the card) leaves the apart verdict,
    and the notes say why."""
    spmv = vs.BY_NAME["spmv_csr"]
    apart = _result("spmv_csr", {"vendor": 44.0}, 44.0)
    vendor = vs.Timed(what="cuSPARSE (torch.sparse)", median_us=47.0, cv=0.001, reps=30)
    slower = apart.model_copy(
        update={"beside": vs.Beside(node=3, vendor=vendor, ours=vs.Timed(what="ours", median_us=47.5))}
    )
    figures = vs.numbers(spmv, slower)
    assert figures.goal_met is False and figures.goal_words.startswith(
        "missed: side by side, cuSPARSE (torch.sparse) / ours = 0.989, needs > 1; needs < 47 us, has 47.5 us"
    )
    assert figures.ours_us == 44.0  # the table's ours column stays the search's own time
    faster = apart.model_copy(
        update={"beside": vs.Beside(node=3, vendor=vendor, ours=vs.Timed(what="ours", median_us=46.0))}
    )
    assert vs.numbers(spmv, faster).goal_met is True
    wrong = vs.beside_result(
        3,
        "cuSPARSE (torch.sparse)",
        BesideReply(agrees=True, kernel_agrees=False, kernel_check="y: 5 of 9 elements outside rtol=1e-05"),
    )
    assert not wrong.measured and wrong.ours.median_us is None
    unjudged = apart.model_copy(update={"beside": wrong})
    assert vs.numbers(spmv, unjudged).goal_words.startswith("missed: cuSPARSE (torch.sparse) / ours = 1,")
    words = vs.beside_words(wrong)
    assert "cuSPARSE (torch.sparse): not timed: ours disagrees with the card's reference" in words
    assert "ours: y: 5 of 9 elements outside rtol=1e-05" in words


def test_a_vendor_that_disagrees_is_timed_and_says_so() -> None:
    cell = vs.vendor_timed(
        VendorResult(library="cuSPARSE (torch.sparse)", median_us=44.0, reps=100, agrees=False, note="y: 3 of 9 off")
    )
    assert cell.median_us == 44.0 and cell.note == "disagrees with the card's reference: y: 3 of 9 off"
    failed = vs.vendor_timed(VendorResult(library="cuBLAS", note="RuntimeError: no bf16"))
    assert failed.median_us is None and failed.error == "RuntimeError: no bf16"


def test_report_rebuilds_the_table_from_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = vs.Manifest(
        options=vs.Options(minutes=1.0, reps=50),
        gpus=["0: NVIDIA H200"],
        results=[
            _result("softmax", {"eager": 500.0, "compile": 400.0, "max-autotune": 350.0}, 300.0),
            _result("matmul", {"vendor": 180.0}, 400.0, nbytes=3 * 2 * 4096**2),
        ],
    )
    vs.save_manifest(manifest, tmp_path)
    assert vs.main(["--report", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    written = (tmp_path / vs.TABLE).read_text()
    assert printed == written == vs.table(manifest)
    lines = written.splitlines()
    assert "| softmax | softmax_card | 1,074 | 500 (54%) | 400 (67%) | 350 (77%) | 300 (89%) | 0.60 | 0.86 |" in written
    assert sum(line.startswith("| matmul |") for line in lines) == 1
    assert json.loads((tmp_path / vs.MANIFEST).read_text())["table"][0]["shares"]["ours"] == pytest.approx(0.894785)
    assert (
        "1 min of search per card" in written
        and "over 50 calls" in written
        and "Copy ceilings: GPU 0 (H200) 4,000 GB/s." in written
    )


FAKE_GPU = GpuInfo(index=0, name="simulated", uuid="GPU-none", capability="9.0", driver="0", memory_mib=1)


class StandIns:
    """The torch subprocess run in this process on the CPU (small shapes, a stand-in timer), and the vendor."""

    def __init__(self) -> None:
        self.torch_requests: list[Any] = []
        self.vendor_cards: list[Path] = []
        self.beside_requests: list[BesideRequest] = []

    async def torch(self, request: Any, gpu: int | None) -> Any:
        self.torch_requests.append(request)
        return vs.measure_torch(request.model_copy(update={"device": "cpu"}), CountingTimer())

    async def vendor(self, card_dir: Path, gpu: int | None, reps: int, flush_bytes: int) -> VendorResult:
        self.vendor_cards.append(card_dir)
        return VendorResult(library="cuSPARSE (torch.sparse)", median_us=44.0, reps=reps, agrees=True)

    async def beside(self, request: BesideRequest, gpu: int | None) -> BesideReply:
        """Side by side the vendor takes 50 us and ours 48: faster, where apart (44 us) ours is not."""
        self.beside_requests.append(request)
        samples = {"samples_us": [50.0] * request.reps, "kernel_samples_us": [48.0] * request.reps}
        return BesideReply(library="cuSPARSE (torch.sparse)", agrees=True, kernel_agrees=True, **samples)


def test_the_bench_end_to_end_on_the_simulated_backend_and_continued(tmp_path: Path) -> None:
    """Capture, torch's times, the searches (simulated: real builds, invented times) and the manifest; a second
    call on the same directory reuses every finished part."""
    workloads = [vs.BY_NAME["softmax"].model_copy(update={"shape": (8, 64)}), vs.BY_NAME["spmv_csr"]]
    options = vs.Options(workloads=["softmax", "spmv_csr"], minutes=1.0, iterations=1, compile=False)
    stand_ins = StandIns()
    lines: list[str] = []

    def bench() -> Any:
        manifest = vs.open_manifest(tmp_path, options)
        b = vs.Bench(
            tmp_path, Settings(), manifest, lines.append, True, stand_ins.torch, stand_ins.vendor, stand_ins.beside
        )
        asyncio.run(b.run(workloads, [FAKE_GPU]))
        return b.manifest

    manifest = bench()
    softmax, spmv = manifest.result("softmax"), manifest.result("spmv_csr")
    assert softmax.error == "" and softmax.card == "softmax_bf16_8x64" and softmax.bytes == 2 * 2 * 8 * 64
    assert softmax.card_dir == tmp_path / vs.CAPTURES / "softmax" / "softmax_bf16_8x64"
    assert softmax.torch["eager"].median_us == 2.0 and set(softmax.torch) == {"eager"}
    assert spmv.card == "spmv_csr_fp32_s26" and spmv.torch["vendor"].median_us == 44.0
    for result in (softmax, spmv):
        assert result.ours is not None and result.ours.state == "finished" and result.ours.best_us is not None
        assert result.ours.run_dir == tmp_path / vs.RUNS / result.workload and result.gpu == 0
        with RunStore.open(result.ours.run_dir, readonly=True) as store:
            assert store.run_info().backend == "simulated"
    assert vs.load_manifest(tmp_path) == manifest
    # spmv's best kernel, built again from its node's source, timed beside cuSPARSE; the verdict reads that timing.
    (request,) = stand_ins.beside_requests
    assert spmv.ours is not None and spmv.beside is not None and spmv.beside.node == spmv.ours.best_node
    assert request.cubin.is_file() and request.launch.entry == "kf_spmv_csr" and request.card_dir == spmv.card_dir
    assert (spmv.beside.vendor.median_us, spmv.beside.ours.median_us) == (50.0, 48.0)
    figures = vs.numbers(vs.BY_NAME["spmv_csr"], spmv)
    assert figures.goal_met is True
    assert figures.goal_words == "met: side by side, cuSPARSE (torch.sparse) / ours = 1.04 > 1"
    assert "ours / cuSPARSE (torch.sparse) = 0.960" in vs.table(manifest)
    assert [len(stand_ins.torch_requests), len(stand_ins.vendor_cards)] == [1, 1]
    assert stand_ins.torch_requests[0].capture and stand_ins.torch_requests[0].modes == ["eager"]
    assert any("softmax on GPU 0: softmax_bf16_8x64: searching" in line for line in lines)

    candidates = softmax.ours.candidates
    lines.clear()
    again = bench()
    # nothing measured twice
    assert [len(stand_ins.torch_requests), len(stand_ins.vendor_cards), len(stand_ins.beside_requests)] == [1, 1, 1]
    assert again.result("softmax").ours.candidates == candidates  # type: ignore[union-attr]
    assert not any("searching" in line or "resuming" in line for line in lines)
    assert again.result("softmax").error == "" and again.result("spmv_csr").error == ""
    assert again.result("softmax").wall_seconds > softmax.wall_seconds


def test_the_table_says_what_the_best_kernels_profile_says(tmp_path: Path) -> None:
    """Where a goal is missed the table's notes say what is in the way: the best kernel's Nsight Compute class and
    headline numbers, from the run's store (none is made up for a run that was not profiled)."""
    workloads = [vs.BY_NAME["softmax"].model_copy(update={"shape": (8, 64)})]
    # 12 candidates: the simulated timings hash the sources, and a few of them may all come out slower.
    options = vs.Options(workloads=["softmax"], minutes=1.0, iterations=12, compile=False)
    stand_ins = StandIns()
    manifest = vs.open_manifest(tmp_path, options)
    bench = vs.Bench(
        tmp_path, Settings(), manifest, lambda _line: None, True, stand_ins.torch, stand_ins.vendor, stand_ins.beside
    )
    asyncio.run(bench.run(workloads, [FAKE_GPU]))
    result = bench.manifest.result("softmax")
    assert result.ours is not None and result.ours.best_node is not None and result.ours.profile == ""
    assert "profile" not in vs.table(bench.manifest)  # the simulated run was not profiled
    with RunStore.open(result.ours.run_dir, readonly=True) as store:
        best = store.node_record(result.ours.best_node).params
    assert best and result.ours.params == best  # which kernel won, kept in the bench's record and said in its notes
    said = ", ".join(f"{name} {value}" for name, value in best.items())
    assert f"the best kernel: {said}" in vs.table(bench.manifest)
    with RunStore.resume(result.ours.run_dir) as store:
        store.save_profile(result.ours.best_node, profile_of("softmax_rows"))
    result.ours = vs.ours(result.ours.run_dir)
    assert result.ours.profile == "memory-bandwidth-bound: SM 10%, memory 90% of peak"
    assert "the best kernel's profile: memory-bandwidth-bound: SM 10%, memory 90% of peak" in vs.table(bench.manifest)


def test_a_search_cut_short_is_resumed_on_the_next_call_and_a_spent_one_is_not(tmp_path: Path) -> None:
    """The bench cancelled mid-search (Ctrl-C) leaves its run resumable: the same call continues that run to its
    cap, keeping what was measured, instead of searching afresh. A run whose cap is spent is not resumed again."""
    workloads = [vs.BY_NAME["softmax"].model_copy(update={"shape": (8, 64)})]
    options = vs.Options(workloads=["softmax"], minutes=1.0, iterations=3, compile=False)
    stand_ins = StandIns()
    run_dir = tmp_path / vs.RUNS / "softmax"
    lines: list[str] = []

    def bench() -> Any:
        manifest = vs.open_manifest(tmp_path, options)
        return vs.Bench(
            tmp_path, Settings(), manifest, lines.append, True, stand_ins.torch, stand_ins.vendor, stand_ins.beside
        )

    async def cut_short() -> None:
        running = asyncio.create_task(bench().run(workloads, [FAKE_GPU]))
        while not running.done():
            if (run_dir / "run.sqlite").is_file():
                with RunStore.open(run_dir, readonly=True) as store:
                    info = store.run_info()
                if info.node_count - info.in_flight_count >= 2:
                    break
            await asyncio.sleep(0.02)
        assert not running.done(), "the search ended before it could be cut short"
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(cut_short())
    with RunStore.open(run_dir, readonly=True) as store:
        assert store.run_info().state != "finished"
        measured = {n.id: n.speedup for n in store.nodes() if n.speedup is not None}
    lines.clear()
    again = bench()
    asyncio.run(again.run(workloads, [FAKE_GPU]))
    assert any("softmax on GPU 0: softmax_bf16_8x64: resuming its run" in line for line in lines)
    assert not any("searching" in line for line in lines)
    ours = again.manifest.result("softmax").ours
    assert ours is not None and ours.state == "finished" and ours.candidates == 3  # the cap over both sessions
    with RunStore.open(run_dir, readonly=True) as store:
        after = {n.id: n.speedup for n in store.nodes()}
    assert all(after[i] == speedup for i, speedup in measured.items()), "what was measured is kept"

    with RunStore.resume(run_dir) as store:  # as if cut short just as its last candidate was measured
        store.set_state("interrupted", "killed")
    lines.clear()
    asyncio.run(bench().run(workloads, [FAKE_GPU]))
    assert any("softmax: its run is not resumed (run " in line and "its results so far stand" in line for line in lines)
