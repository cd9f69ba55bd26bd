"""`kernelforge bench` on the simulated backend: the card selection, the runner (one run per card, a card no template
serves recorded as such, never searched), the report files with their plots, resuming after `kill -9` without
rerunning finished cards, `--list`, the vendor timing's check, and the bench guide's task table against the registry.
Only vector_add at 2^10 (and stand-ins made from it) runs, so the file stays fast."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.console import Console

from kernelforge_tui.cli.bench import list_tasks, markdown_table, parse_scales, render_progress
from kernelforge_tui.cli.bench_report import NO_MATPLOTLIB, PLOTS, per_task_chart, write_report
from kernelforge_tui.cli.main import main
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.bench import (
    RUNS,
    SIMULATED_VENDOR,
    BenchCard,
    BenchManifest,
    BenchOptions,
    VendorResult,
    load_manifest,
    open_manifest,
    plan_cards,
    run_bench,
    vendor_result,
)
from kernelforge_tui.engine.vendor_timer import VendorTimer
from kernelforge_tui.errors import BadInput
from kernelforge_tui.gpu.statistics import robust_stats
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.store import RunStore
from kernelforge_tui.suite import cards, registry
from kernelforge_tui.suite.score import CardResult, Scored, score_card
from kernelforge_tui.suite.task import Precision, Task, Vendor
from kernelforge_tui.suite.vendor_timing import VendorReply, VendorRequest, time_calls, time_interleaved, time_vendor
from kernelforge_tui.vocabulary.evaluation import Ceilings, EvalResult, Evaluation, SetCheck
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
VECTOR_ADD = registry.task("vector_add")
SMALL = 2**10


def kernelforge(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelforge_tui.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | {"COLUMNS": "200"},
    )


@pytest.fixture
def unserved(monkeypatch: pytest.MonkeyPatch) -> Task:
    """vector_add under the family `other`, which no template serves."""
    task = dataclasses.replace(VECTOR_ADD, name="bench_unserved", family="other", vendor=None)
    monkeypatch.setitem(registry.TASKS, task.name, task)
    return task


def no_template(task: Task) -> str:
    why = TemplateProposer().cannot_serve(cards.spec(task, "float32", SMALL))
    assert why is not None
    return f"no template: the templates proposer {why}"


def test_scales_and_selection() -> None:
    assert parse_scales(["10,14", "22", "14"]) == [2**10, 2**14, 2**22]
    for bad in ("9", "23", "ten"):
        with pytest.raises(BadInput, match="--scales"):
            parse_scales([bad])
    planned = plan_cards(BenchOptions(tasks=["vector_add"], precisions=["bfloat16"], scales=[SMALL]))
    assert [(c.card, c.flops, c.bytes) for c in planned] == [("vector_add_bf16_s10", 1024, 3 * 1024 * 2)]
    assert len(plan_cards(BenchOptions(tasks=["vector_add"]))) == 2 * len(VECTOR_ADD.scales)
    with pytest.raises(BadInput, match="matches no task"):
        plan_cards(BenchOptions(tasks=["no_such_task*"]))


def test_simulated_bench_runs_scores_reports_and_skips_what_is_done(tmp_path: Path, unserved: Task) -> None:
    out = tmp_path / "bench"
    options = BenchOptions(
        tasks=["vector_add", unserved.name], precisions=["float32"], scales=[SMALL], iterations=3, simulate=True
    )
    lines: list[str] = []
    manifest = asyncio.run(run_bench(out, load_settings(), options, lambda _m, line: lines.append(line)))
    searched, skipped = manifest.cards
    assert searched.state == "finished" and searched.candidates == 3 and "iteration budget" in searched.reason
    assert searched.budget is not None and searched.budget.max_iterations == 3
    assert searched.budget.max_minutes == pytest.approx(2.0 - 0.25, abs=0.01)  # the task's 2 min less a start-up
    assert searched.baseline_us == pytest.approx(100, rel=0.05) and searched.best_us is not None
    assert searched.vendor == VendorResult(library="PyTorch (elementwise)", note=SIMULATED_VENDOR)
    assert skipped.state == "no-template"
    assert skipped.reason == no_template(unserved)
    assert not (out / RUNS / skipped.card).exists(), "a card no template serves is not a one-node search"
    assert any(f"{skipped.card}: no template" in line for line in lines)
    assert manifest.simulated_ceiling_us == pytest.approx(100 / 8)  # the simulated backend's baseline / top speedup

    report = write_report(load_manifest(out), out)
    for name in ("report.md", "results.csv", "results.json", *(f"{p}.{s}" for p in PLOTS for s in ("png", "svg"))):
        assert (report / name).stat().st_size > 0, name
    assert (report / "speedup.png").read_bytes().startswith(b"\x89PNG")
    summary = json.loads((report / "results.json").read_text())
    speedup = (searched.baseline_us or 0) / searched.best_us
    assert summary["suite_score"] == pytest.approx((1024 * speedup + 1024 * 1.0) / 2048)  # no template: 1.0x
    assert summary["simulated"] and [c["status"] for c in summary["cards"]] == ["searched", "no-template"]
    assert (report / "results.csv").read_text().count("\n") == 3
    text = (report / "report.md").read_text()
    assert "SIMULATED" in text and "Suite score" in text and "## Where no template helped" in text
    assert f"- {unserved.name} (other): {skipped.reason}" in text

    with RunStore.open(out / RUNS / searched.card, readonly=True) as store:
        nodes = store.run_info().node_count
    again = asyncio.run(run_bench(out, load_settings(), options))
    assert again.cards[0].wall_seconds == searched.wall_seconds, "a finished card is not run again"
    with RunStore.open(out / RUNS / searched.card, readonly=True) as store:
        assert store.run_info().node_count == nodes
    with pytest.raises(BadInput, match="was simulated: rerun it with --simulate"):
        open_manifest(out, options.model_copy(update={"simulate": False}), [])


def test_a_gpu_report_without_matplotlib_has_every_number_and_says_how_to_get_the_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A measured bench's report, made by hand: the ceilings named, the vendor beside ours (a win, a disagreement),
    every number in the table; without matplotlib everything but the plots, and how to get them."""
    ceilings = Ceilings(
        gpu_name="NVIDIA H200", copy_gbps=4000.0, fma_tflops=60.0, capability=(9, 0), sm_count=132, l2_bytes=60 << 20
    )
    fast = BenchCard(card="vector_add_fp32_s10", task="vector_add", family="elementwise", precision="float32",
                     scale=SMALL, flops=1024, bytes=12288, state="finished", baseline_us=10.0, best_us=5.0,
                     vendor=VendorResult(library="torch.add", median_us=6.0, agrees=True))  # fmt: skip
    disagrees = VendorResult(library="torch.add", median_us=4.0, agrees=False)
    slow = fast.model_copy(
        update={"card": "vector_add_bf16_s10", "precision": "bfloat16", "bytes": 6144, "vendor": disagrees}
    )
    manifest = BenchManifest(options=BenchOptions(), gpu_name="NVIDIA H200", ceilings=ceilings, cards=[fast, slow])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    report = write_report(manifest, tmp_path)
    text = (report / "report.md").read_text()
    assert NO_MATPLOTLIB in text and not list(report.glob("*.png"))
    assert "SIMULATED" not in text and "copy 4000 GB/s, FMA 60.0 TFLOP/s for fp32 cards" in text
    assert "bf16 cards are held to the tensor-core rate, 960 TFLOP/s" in text
    assert "- vector_add fp32 2^10: 5 us against torch.add 6 us (1.20x faster)" in text  # the only win
    assert "| vector_add | elementwise | bf16 | 2^10 | 1.02e+03 | 6.14e+03 | 10 | 5 | 2.00x | 1 | 0 | 0% | torch.add " \
           "(disagrees with the reference) | 4 | 1.25 |  |" in text  # fmt: skip
    summary = json.loads((report / "results.json").read_text())
    assert summary["suite_score"] == pytest.approx(2.0) and summary["ceilings"]["gpu_name"] == "NVIDIA H200"
    fp32 = summary["cards"][0]
    assert fp32["roofline_share"] == pytest.approx(12288 / 4000e3 / 5.0)  # 12 kB at 4000 GB/s over 5 us
    assert fp32["vendor_ratio"] == pytest.approx(5 / 6) and fp32["achieved_gbps"] == pytest.approx(12288 / 5e3)
    assert (report / "results.csv").read_text().splitlines()[1].startswith("vector_add,elementwise,float32,10,")


def _card_state(out: Path) -> list[tuple[str, str]]:
    try:
        return [(c.card, c.state) for c in load_manifest(out).cards]
    except BadInput:  # not written yet
        return []


def test_kill_9_mid_bench_then_rerun_resumes_without_rerunning_finished_cards(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["bench", "--simulate", "--tasks", "vector_add", "--scales", "10", "--budget-iters", "4", "-o", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelforge_tui.cli", *args, "--simulate-seconds", "0.2", "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    second = out / RUNS / "vector_add_bf16_s10"
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            states = dict(_card_state(out))
            if states.get("vector_add_bf16_s10") == "running" and (second / "run.sqlite").exists():
                with RunStore.open(second, readonly=True) as store:
                    info = store.run_info()
                if info.node_count - info.in_flight_count >= 2:
                    break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the bench and any nvcc it started
        proc.wait()
    killed = load_manifest(out)
    first = killed.cards[0]
    assert [c.state for c in killed.cards] == ["finished", "running"]
    with RunStore.open(second, readonly=True) as store:
        measured_before = {n.id: n.speedup for n in store.nodes() if n.speedup is not None}

    rerun = kernelforge(*args)  # the same command, one line per event (not a terminal)
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    assert "vector_add_bf16_s10 on GPU 0: resuming its run" in rerun.stdout  # a simulated bench's one GPU
    assert "vector_add_fp32_s10 on GPU 0: searching" not in rerun.stdout and "suite score" in rerun.stdout
    done = load_manifest(out)
    assert [c.state for c in done.cards] == ["finished", "finished"]
    assert done.cards[0].model_dump() == first.model_dump(), "the finished card was not touched"
    with RunStore.open(second, readonly=True) as store:
        after = {n.id: n.speedup for n in store.nodes()}
        assert store.run_info().node_count == 5  # its 4 candidates in all, over both sessions, and the baseline
    assert all(after[i] == speedup for i, speedup in measured_before.items()), "what was measured is kept"
    summary = json.loads((out / "report" / "results.json").read_text())
    assert [c["card"] for c in summary["cards"]] == ["vector_add_fp32_s10", "vector_add_bf16_s10"]
    assert all(c["speedup"] is not None for c in summary["cards"])


def test_list_names_each_task_with_its_template_or_why_none(unserved: Task, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list", "--json", "--tasks", "vector_add"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row == {
        "task": "vector_add",
        "family": "elementwise",
        "precisions": ["fp32", "bf16"],
        "no_bf16": "",
        "scales": [10, 14, 18, 22],
        "check": VECTOR_ADD.check,
        "vendor": "PyTorch (elementwise)",
        "template": "template",
    }
    (fake,) = list_tasks([unserved])
    assert fake.template == no_template(unserved)
    assert fake.vendor is None


def test_the_vendor_is_checked_against_the_card_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    bf16 = cards.write(VECTOR_ADD, "bfloat16", SMALL, tmp_path)
    reply = time_vendor(VendorRequest(card_dir=bf16.root, device="cpu"))
    assert (reply.library, reply.agrees, reply.error, reply.samples_us) == ("PyTorch (elementwise)", True, "", [])
    wrong = dataclasses.replace(
        VECTOR_ADD, name="bench_wrong_vendor", vendor=Vendor("wrong", lambda torch, t, s: {"c": t["a"] - t["b"]})
    )
    monkeypatch.setitem(registry.TASKS, wrong.name, wrong)
    reply = time_vendor(VendorRequest(card_dir=cards.write(wrong, "float32", SMALL, tmp_path).root, device="cpu"))
    assert reply.agrees is False and re.match(r"c: \d+ of 1024 elements outside rtol=", reply.check)
    summary = vendor_result("lib", VendorReply(library="lib", samples_us=[3.0, 1.0, 2.0, 100.0, 2.5], agrees=True))
    assert (summary.median_us, summary.reps, summary.agrees) == (2.5, 5, True)


def test_one_vendor_process_serves_a_lane_and_is_replaced_after_an_error(tmp_path: Path) -> None:
    """The lane's timer answers card after card from one process (torch imported once); an error ends that process
    and the next request gets a fresh one; a process that dies without a reply is the reply's error."""
    pytest.importorskip("torch")
    first, second = (cards.write(VECTOR_ADD, p, SMALL, tmp_path) for p in ("float32", "bfloat16"))

    async def scenario() -> tuple[list[VendorReply], int, int | None]:
        timer = VendorTimer()
        try:
            replies = [await timer.time(VendorRequest(card_dir=c.root, device="cpu")) for c in (first, second)]
            one_process = timer.started
            replies.append(await timer.time(VendorRequest(card_dir=tmp_path / "missing", device="cpu")))
            assert timer.process is None, "an error ends the process"
            replies.append(await timer.time(VendorRequest(card_dir=first.root, device="cpu")))
            assert timer.process is not None
            timer.process.kill()  # dies between two cards: the next request is the error, then a fresh process
            await timer.process.wait()
            replies.append(await timer.time(VendorRequest(card_dir=first.root, device="cpu")))
            return replies, one_process, timer.started
        finally:
            await timer.close()

    replies, one_process, started = asyncio.run(scenario())
    assert [r.agrees for r in replies[:2]] == [True, True] and one_process == 1
    assert replies[2].agrees is None and "missing" in replies[2].error
    assert replies[3].agrees is True and replies[4].agrees is True
    assert started == 3, "one process for the first two cards, one after the error, one after the death"


def test_a_vendor_process_that_exits_without_a_reply_is_the_error(tmp_path: Path) -> None:
    """A process that dies on a request (a faulting vendor call) says so with its last stderr lines."""

    async def scenario() -> VendorReply:
        dies = (
            "import sys; sys.stdin.readline(); sys.stderr.write('CUDA error: an illegal memory access\\n'); sys.exit(7)"
        )
        timer = VendorTimer(timeout_s=60, argv=[sys.executable, "-c", dies])
        try:
            return await timer.time(VendorRequest(card_dir=tmp_path, device="cpu"))
        finally:
            await timer.close()

    reply = asyncio.run(scenario())
    assert reply.error == "the vendor timing exited 7 without a reply: CUDA error: an illegal memory access"


def test_the_bench_guide_task_table_is_the_registry() -> None:
    """The bench guide's suite table is `kernelforge bench --list --markdown`: regenerate it after adding a task."""
    readme = (ROOT / "docs" / "guides" / "bench.md").read_text()
    match = re.search(r"<!-- suite-tasks:start -->\n(.*?)\n<!-- suite-tasks:end -->", readme, re.DOTALL)
    assert match is not None, "docs/guides/bench.md lacks the suite task table's markers"
    expected = markdown_table(list_tasks(list(registry.TASKS.values())))
    assert match.group(1) == expected, "docs/guides/bench.md is stale: paste `kernelforge bench --list --markdown`"


def _suite_baselines() -> ModuleType:
    return load_script(ROOT / "bench" / "suite_baselines.py")


def test_suite_baselines_script_selects_cards_and_writes_its_summary(tmp_path: Path) -> None:
    """The GPU script's parts that need no GPU: its options, the cards it checks, the summary of a pass and a fail."""
    script = _suite_baselines()
    args = script.parse_args(
        ["--tasks", "vector_add", "--precision", "fp32", "--scales", "10,14", "--out", str(tmp_path)]
    )
    ok_card, failed_card = script.selected(args)
    assert (ok_card.card, failed_card.card) == ("vector_add_fp32_s10", "vector_add_fp32_s14")
    with pytest.raises(SystemExit):
        script.parse_args(["--tasks", "vector_add"])  # --out is required
    timed = EvalResult(ok=True, candidate=robust_stats([2.0, 3.0, 4.0]), checks=[SetCheck(name="seed_1", ok=True)] * 5)
    reason = "set stress:nan: c: 3 of 16384 elements NaN where the reference is finite | first at 7"
    checks = [
        script.check_of(ok_card, Evaluation(ok=True, result=timed), 1.5),
        script.check_of(failed_card, Evaluation(ok=False, failure="mismatch", reason=reason), 2.0),
    ]
    script.write_summary(checks, 3, tmp_path)
    summary = json.loads((tmp_path / script.JSON_NAME).read_text())
    assert (summary["cards"], summary["checked"], summary["passed"]) == (3, 2, 1)
    assert summary["results"][0] | {"seconds": 0} == {
        "card": "vector_add_fp32_s10", "task": "vector_add", "precision": "float32", "log2_scale": 10, "ok": True,
        "failure": None, "reason": "", "median_us": 3.0, "sets": 5, "seconds": 0,
    }  # fmt: skip
    table = (tmp_path / script.MD_NAME).read_text().splitlines()
    assert "1 of 2 checked cards pass (3 selected)." in table
    rows = [line for line in table if line.startswith("| vector_add")]
    assert rows[0].startswith("| vector_add_fp32_s14 | FAIL | - | 0 | mismatch: set stress:nan:")  # failures first
    assert "\\| first at 7" in rows[0] and rows[1] == "| vector_add_fp32_s10 | pass | 3 us | 5 |  |"


def test_the_live_view_counts_cards_and_tasks_and_shows_each_best() -> None:
    def bench_card(name: str, state: str, scale: int = SMALL, best: float | None = None) -> BenchCard:
        return BenchCard.model_validate(
            {"card": f"{name}_fp32_s{scale.bit_length() - 1}", "task": name, "family": "elementwise",
             "precision": "float32", "scale": scale, "flops": 1, "bytes": 1, "state": state, "best_speedup": best,
             "wall_seconds": 30.0}
        )  # fmt: skip

    manifest = BenchManifest(
        options=BenchOptions(simulate=True, minutes_per_task=2.0),
        cards=[
            bench_card("vector_add", "finished", best=2.5),
            bench_card("vector_add", "running", scale=2**14, best=1.25),
            bench_card("unserved", "no-template"),
        ],
    )
    console = Console(record=True, width=200)
    console.print(render_progress(manifest, "vector_add_fp32_s14: best 1.25x (node 3)"))
    text = console.export_text()
    assert "SIMULATED cards 2/3, tasks 1/2; now vector_add_fp32_s14; at most 1.0 min of budget left" in text
    assert "fp32 s10 2.50x  fp32 s14 1.25x" in text and "fp32 s10 no template" in text
    assert "vector_add_fp32_s14: best 1.25x (node 3)" in text


class _FakeCuda:
    """Just enough of torch for `time_calls`: events that record into a log and measure 2 us, a scratch buffer whose
    fill is the L2 flush."""

    int32 = "int32"

    def __init__(self) -> None:
        self.log: list[str] = []
        self.cuda = self

    def empty(self, count: int, dtype: str, device: str) -> _FakeCuda:
        assert count * 4 == 256 * 1024 * 1024 and device == "cuda"
        return self

    def fill_(self, value: int) -> None:
        self.log.append("flush")

    def Event(self, enable_timing: bool) -> _FakeCuda:  # torch.cuda.Event
        assert enable_timing
        return self

    def record(self) -> None:
        self.log.append("event")

    def elapsed_time(self, end: _FakeCuda) -> float:
        return 0.002  # milliseconds

    def synchronize(self) -> None:
        self.log.append("sync")


def test_vendor_calls_are_timed_the_worker_way() -> None:
    """Warm-up, then each timed call after an L2 flush between two events, a synchronisation per batch of ten."""
    torch = _FakeCuda()
    samples = time_calls(torch, lambda: torch.log.append("call"), VendorRequest(card_dir=Path("."), reps=12))
    assert samples == [2.0] * 12
    timed = ["flush", "event", "call", "event"]
    assert torch.log == ["call"] * 3 + ["sync"] + timed * 10 + ["sync"] + timed * 2 + ["sync"]


def test_two_calls_are_interleaved_each_after_its_own_flush_the_order_turned_every_repetition() -> None:
    """As the worker times a candidate with its baseline: neither always runs first, and each call is flushed."""
    torch = _FakeCuda()
    calls = {"vendor": lambda: torch.log.append("vendor"), "kernel": lambda: torch.log.append("kernel")}
    samples = time_interleaved(torch, calls, VendorRequest(card_dir=Path("."), reps=3))
    assert samples == {"vendor": [2.0] * 3, "kernel": [2.0] * 3}
    timed = [call for call in torch.log if call in ("vendor", "kernel")][6:]  # after three warm-up calls of each
    assert timed == ["vendor", "kernel", "kernel", "vendor", "vendor", "kernel"]
    flushed = [i for i, call in enumerate(torch.log) if call in ("vendor", "kernel") and i > 6]
    assert all(torch.log[i - 2 : i] == ["flush", "event"] for i in flushed)


def test_the_speedup_plot_reads_wins_and_losses_on_a_log_axis_with_a_colour_per_scale() -> None:
    """A 100x win must not flatten a 1.2x one: the axis is logarithmic, bars start at 1.0x (a loss points left), and
    each scale keeps its colour in every panel, also where a panel lacks some scales (sorting's extra ones)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    def card(precision: Precision, scale: int, speedup: float) -> Scored:
        result = CardResult(
            task="t", family="f", precision=precision, scale=scale, flops=1, bytes=1, status="searched",
            baseline_us=100.0, best_us=100.0 / speedup,
        )  # fmt: skip
        return score_card(result)

    rows = [card("float32", 2**10, 1.0), card("float32", 2**12, 80.0), card("bfloat16", 2**12, 1.0 / 1.2)]
    rows.append(card("bfloat16", 2**22, 125.0))
    figure = per_task_chart(rows, lambda r: r.speedup, "speedup", 1.0, log=True)
    try:
        fp32, bf16 = figure.axes
        assert fp32.get_xscale() == "log" and bf16.get_xscale() == "log"
        spans = sorted(tuple(sorted((p.get_x(), p.get_x() + p.get_width()))) for p in bf16.patches)
        assert spans == [(pytest.approx(1 / 1.2), 1.0), (1.0, pytest.approx(125.0))], "bars start at 1.0x"

        def colours(ax: Any) -> dict[str, object]:
            return {c.get_label(): tuple(c.patches[0].get_facecolor()) for c in ax.containers if c.patches}

        ours, theirs = colours(fp32), colours(bf16)
        assert ours["2^12"] == theirs["2^12"], "a scale keeps its colour in every panel"
        assert len({ours["2^10"], ours["2^12"], theirs["2^22"]}) == 3, "one colour per scale"
    finally:
        plt.close(figure)
