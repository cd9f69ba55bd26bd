"""`kernelforge optimize CAPTURE_DIR`: one simulated search per variant (real nvcc builds of the captured cards'
baselines and template candidates, no GPU), in order of expected saving, within one budget split by it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.capture.manifest import CaptureManifest, load_capture, save_capture
from kernelforge_tui.cli.main import main
from kernelforge_tui.config import Settings
from kernelforge_tui.engine import capture_search
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.capture_search import REPORT, CaptureOptimizeOptions, plan_variants, split_budget
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.runs import RunInfo

if os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    import torch  # noqa: F401
else:
    pytest.importorskip("torch", reason="capture needs torch (CI installs it: .ci/run)")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[CaptureManifest, Path]:
    from kernelforge_tui.capture.run import CaptureRequest, capture_model
    from kernelforge_tui.cli.capture import template_problem

    out = tmp_path_factory.mktemp("resnet") / "resnet.capture"
    request = CaptureRequest(ROOT / "examples" / "models" / "resnet_block.py", out, device="cpu", repeats=1)
    capture_model(request, template_check=template_problem)
    return load_capture(out), out


def test_optimize_a_capture_directory_simulated(
    captured: tuple[CaptureManifest, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    manifest, root = captured
    code = main(["optimize", str(root), "--simulate", "--budget-iters", "7", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report == json.loads((root / REPORT).read_text()) | {"projected_saving": report["projected_saving"]}
    searched = [r["variant"] for r in report["results"]]
    ranked = [v.id for v in manifest.variants if v.status == "card" and v.template]
    assert searched == ranked  # every templated card, best expected saving first
    skipped = {s["variant"]: s["reason"] for s in report["skipped"]}
    batch_norm = next(v for v in manifest.variants if v.card and v.card.startswith("batch_norm_bf16"))
    assert "no batch norm family" in skipped[batch_norm.id]  # no template for it: the offline search skips it
    budgets = [r["budget"]["max_iterations"] for r in report["results"] if r["state"] != "not-run"]
    assert budgets[0] >= budgets[-1] and sum(r["candidates"] for r in report["results"]) <= 7
    first = report["results"][0]
    assert first["state"] == "finished" and first["best_speedup"] > 0 and Path(first["run_dir"]).parent == root / "runs"
    with RunStore.open(Path(first["run_dir"]), readonly=True) as store:
        assert store.card_dir().resolve() == (root / first["card"]).resolve()
        assert store.run_info().backend == "simulated"
    assert report["simulated"] and report["comparable"] and "SIMULATED" in report["note"]
    saving = sum(r["saving_us"] for r in report["results"])
    assert report["projected_saving"] == pytest.approx(saving / manifest.total_time_us)
    for r in report["results"]:
        if r["best_speedup"]:
            assert r["projected_us_per_call"] == pytest.approx(
                min(r["eager_us_per_call"], r["eager_us_per_call"] / r["best_speedup"])
            )


def test_optimize_live_lines_and_table(
    captured: tuple[CaptureManifest, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    _, root = captured
    code = main(
        ["optimize", str(root), "--simulate", "--budget-iters", "2", "--top", "1", "--root", str(root / "other")]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert ": searching" in out and "SIMULATED projected end-to-end saving" in out and "beyond --top 1" in out
    assert list((root / "other").iterdir())  # the runs went where --root said


def test_without_a_gpu_or_simulate_it_stops_at_once(
    captured: tuple[CaptureManifest, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, root = captured
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi
    code = main(["optimize", str(root), "--budget-iters", "2", "--root", str(root / "gpu"), "--json"])
    out = capsys.readouterr().out
    assert code == 3 and json.loads(out)["error"] == "no-gpu"
    report = json.loads((root / REPORT).read_text())
    assert [r["state"] for r in report["results"]][:2] == ["failed", "pending"]  # the first stopped, none ran after
    assert not report["comparable"] and "captured on the CPU" in report["note"]


def test_another_proposer_may_serve_cards_the_templates_cannot(captured: tuple[CaptureManifest, Path]) -> None:
    manifest, root = captured
    chosen, _ = plan_variants(manifest, root, CaptureOptimizeOptions(proposer="module:Class"))
    assert any(v.card and v.card.startswith("batch_norm") for v in chosen)
    pool = next(v.id for v in manifest.variants if v.card and v.card.startswith("avg_pool"))
    norm = next(v.id for v in manifest.variants if v.card and v.card.startswith("batch_norm_bf16"))
    chosen, skipped = plan_variants(manifest, root, CaptureOptimizeOptions(variants=[pool, norm]))
    assert [v.id for v in chosen] == [pool] and [s.variant for s in skipped] == [norm]
    with pytest.raises(BadInput, match="no variant v99"):
        plan_variants(manifest, root, CaptureOptimizeOptions(variants=["v99"]))


def test_split_budget_by_expected_saving() -> None:
    total = Budget(max_iterations=100, max_minutes=10.0)
    nothing = Budget(max_iterations=0, max_minutes=0.0)
    first = split_budget(total, nothing, 3.0, 4.0)
    assert first is not None and first.max_iterations == 75 and first.max_minutes == pytest.approx(7.5)
    second = split_budget(total, Budget(max_iterations=40, max_minutes=2.0), 1.0, 1.0)
    assert second is not None and second.max_iterations == 60 and second.max_minutes == pytest.approx(8.0)
    assert split_budget(total, Budget(max_iterations=100, max_minutes=2.0), 1.0, 1.0) is None
    assert split_budget(Budget(), nothing, 1.0, 2.0) == Budget()


def test_one_run_dir_for_many_runs_is_refused(
    captured: tuple[CaptureManifest, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, root = captured
    code = main(["optimize", str(root), "--simulate", "--run-dir", str(root / "one"), "--json"])
    assert code == 2 and "use --root" in json.loads(capsys.readouterr().out)["message"]


def _nothing_to_save(manifest: CaptureManifest, root: Path, dest: Path) -> Path:
    """A copy of the capture whose carded variants all run at the copy ceiling already (k = 1, as the H200 measured
    the diffusion block's SiLUs and add)."""
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns("runs", "other", "gpu", REPORT))
    variants = [
        v.model_copy(
            update={
                "expected_speedup": 1.0,
                "expected_saving": 0.0,
                "estimate": f"measured: {v.time_per_call_us:.3g} us per call against more to move its bytes",
            }
        )
        if v.status == "card"
        else v
        for v in manifest.variants
    ]
    save_capture(manifest.model_copy(update={"variants": variants}), dest)
    return dest


def test_nothing_worth_searching_is_a_report_not_a_failure(
    captured: tuple[CaptureManifest, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """On the H200 the diffusion block's carded variants all had k = 1 and `optimize` failed ("no variant to
    search"): it now exits 0, its report says nothing is worth searching and why, and runs nothing."""
    manifest, root = captured
    copy = _nothing_to_save(manifest, root, tmp_path / "flat.capture")
    code = main(["optimize", str(copy), "--simulate", "--budget-iters", "4", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report["results"] == [] and report["projected_saving"] == 0 and not report["comparable"]
    assert report["note"].startswith("nothing worth searching: every carded variant (")
    assert "variants without a card" not in report["note"]  # its convolutions are carded: every kernel is
    carded = {v.id for v in manifest.variants if v.status == "card"}
    skipped = {s["variant"]: s["reason"] for s in report["skipped"]}
    assert set(skipped) == carded  # batch norm too: no proposer can win time that is not there
    assert all(r.startswith("nothing to save (k = 1); measured: ") for r in skipped.values())
    assert json.loads((copy / REPORT).read_text())["note"] == report["note"] and not (copy / "runs").exists()

    code = main(["optimize", str(copy), "--simulate", "--budget-iters", "4"])
    out = capsys.readouterr().out
    assert code == 0 and "projected saving: none (nothing worth searching" in " ".join(out.split())
    assert "nothing to save (k = 1)" in out


def test_a_search_that_overruns_its_share_leaves_the_next_ones_their_time(
    captured: tuple[CaptureManifest, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the H200 the decoder's softmax search was given 0.86 of 1 minute and took 66 s of wall time (starting and
    closing its backend count against the minutes, not against its own cap), so the silu_mul search never ran. The
    minutes are now shared after keeping the later searches' start-up and shortest search aside, and each search's
    cap leaves room for its own start-up (measured after the first search)."""
    _, root = captured
    clock = [0.0]
    budgets: list[float] = []

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return clock[0]

        @staticmethod
        def time() -> float:
            return 1e9 + clock[0]

    async def search(_searches: Any, _variant: Any, budget: Budget, result: Any) -> RunInfo:
        budgets.append(budget.max_minutes)
        clock[0] += budget.max_minutes * 60 + 14.0  # its whole cap, and 14 s of start-up and closing
        result.candidates = 3
        return RunInfo(
            run_id="r",
            run_dir=root,
            card_name=result.card,
            family="x",
            gpu_name="H200",
            backend="gpu",
            state="finished",
            reason="time budget reached",
            started_at=0.0,
            active_seconds=budget.max_minutes * 60,
        )

    monkeypatch.setattr(capture_search, "time", Clock)
    monkeypatch.setattr(capture_search, "_search", search)
    options = CaptureOptimizeOptions(budget=Budget(max_minutes=2.0), simulate=True, root=root / "unused")
    report = asyncio.run(capture_search.optimize_capture(root, Settings(), options))
    assert [r.state for r in report.results] == ["finished"] * len(report.results) and len(report.results) == 5
    assert all(b >= capture_search.MIN_MINUTES for b in budgets)
    assert clock[0] <= 2.0 * 60 + 1.0  # the whole optimise within its minutes
    assert [r.wall_seconds for r in report.results] == pytest.approx([b * 60 + 14.0 for b in budgets])


def test_split_budget_keeps_a_reserve_for_the_later_searches() -> None:
    total = Budget(max_minutes=1.0, max_iterations=100)
    first = split_budget(total, Budget(max_minutes=0.0, max_iterations=0), 0.861, 1.0, reserve_minutes=0.3)
    assert first is not None and first.max_minutes == pytest.approx(0.7 * 0.861)
    assert first.max_iterations == 86  # the reserve is minutes only


def test_on_a_cluster_the_variants_are_searched_at_once(captured: tuple[CaptureManifest, Path], tmp_path: Path) -> None:
    """One search per variant, as many at once as the cluster has GPUs (one GPU each), within the one budget."""
    from tests.engine.cluster.test_cluster import cluster_settings, local_cluster

    # equal expected savings: the budget is split by them, and the capture's CPU timings move with the machine's
    # load (a loaded CI run gave one variant 94% of them, so all 8 iterations, and the next none)
    root = tmp_path / "resnet.capture"
    shutil.copytree(captured[1], root)
    manifest = load_capture(root)
    equal = [v.model_copy(update={"expected_saving": 1.0}) for v in manifest.variants]
    save_capture(manifest.model_copy(update={"variants": equal}), root)
    with local_cluster(2) as cluster:
        options = CaptureOptimizeOptions(
            budget=Budget(max_iterations=8), simulate=True, simulate_seconds=0.3, cluster=cluster.scheduler_address,
            root=tmp_path / "runs",
        )  # fmt: skip
        report = asyncio.run(capture_search.optimize_capture(root, cluster_settings(), options))
    runs = [r for r in report.results if r.run_dir is not None]
    states = [(r.variant, r.state, r.reason) for r in report.results]
    assert len(runs) >= 2 and all(r.state == "finished" for r in runs), states
    assert sum(r.candidates for r in report.results) <= 8
    spans, measured = [], set()
    for result in runs:
        assert result.run_dir is not None
        with RunStore.open(result.run_dir, readonly=True) as store:
            info = store.run_info()
            spans.append((info.started_at, info.ended_at or 0.0))
            measured |= {store.evaluation(n.id).measured_on for n in store.nodes()}  # type: ignore[union-attr]
    first, second = sorted(spans)[:2]
    assert second[0] < first[1], "the first two variants' searches overlap in time"
    assert len(measured) == 2 and all("(worker tcp://" in str(m) for m in measured)
