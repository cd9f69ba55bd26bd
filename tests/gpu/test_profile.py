"""Profiling: the ncu CSV parser, the bottleneck classifier, the roofline, and the Profiler's error paths.

The CSV fixtures under tests/support/fixtures/ncu/*.csv were captured on the H200 by scripts/capture_ncu_fixtures.sh
with the Profiler's exact ncu command line; where they are absent (a checkout before the capture) those
tests skip and the synthetic samples below, written in ncu's raw-page layout, still run.
"""

from __future__ import annotations

import asyncio
import math
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import OperatorCard, load_card, save_card
from kernelforge_tui.cards.plan import ResolvedLaunch, load_plan, resolve
from kernelforge_tui.config import Settings
from kernelforge_tui.gpu.detect import GpuInfo
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.gpu.ncu.csv_report import normalise, parse_csv
from kernelforge_tui.gpu.ncu.hardware import ClassifierSettings, analyse, classify, roofline, stall_reasons
from kernelforge_tui.gpu.ncu.run import (
    NcuMissing,
    NcuNotPermitted,
    NcuUnsupported,
    ProfileFailed,
    Profiler,
    ProfileSettings,
    ProfileTimeout,
)
from kernelforge_tui.gpu.ncu.service import BuiltKernel, ProfilingService, build_for_profile
from kernelforge_tui.vocabulary.evaluation import BuildResult, Ceilings, EvalResult, PtxasStats, Timing
from kernelforge_tui.vocabulary.profiles import HardwareReport

FIXTURES = Path(__file__).parents[1] / "support" / "fixtures" / "ncu"
CARDS = FIXTURES / "cards"
EXPECTED = {"stream_copy": "memory_bandwidth", "uncoalesced": "memory_latency", "fma_chain": "compute"}
H200 = Ceilings(gpu_name="NVIDIA H200", copy_gbps=4250.0, fma_tflops=60.0, capability=(9, 0), sm_count=132,
                l2_bytes=60 * 1024 * 1024)  # fmt: skip

ID_COLUMNS = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
              "Grid Size", "Device", "CC"]  # fmt: skip


def raw_csv(kernel: str, metrics: dict[str, tuple[str, str]]) -> str:
    """ncu's raw page: ==PROF== lines, a header, a units row, one row per launch (all fields quoted)."""
    header = ID_COLUMNS + list(metrics)
    units = [""] * len(ID_COLUMNS) + [unit for unit, _ in metrics.values()]
    values = ["0", "4242", "python3.12", "127.0.0.1", kernel, "1", "7", "(256, 1, 1)", "(32768, 1, 1)", "0", "9.0"]
    values += [value for _, value in metrics.values()]

    def line(cells: list[str]) -> str:
        return ",".join(f'"{c}"' for c in cells)

    return (
        "==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
        f'==PROF== Profiling "{kernel}" - 0: 0%....50%....100% - 38 passes\n'
        "==PROF== Disconnected from process 4242\n"
        f"{line(header)}\n{line(units)}\n{line(values)}\n"
    )


STALLS = {
    f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio": ("", value)
    for reason, value in [("long_scoreboard", "412.5"), ("wait", "3.1"), ("selected", "1"), ("no_instruction", "0.4"),
                          ("lg_throttle", "0.02"), ("long_scoreboard_not_issued", "99")]
}  # fmt: skip

LATENCY_SAMPLE = raw_csv(
    "uncoalesced_chase",
    {
        "gpu__time_duration.sum": ("nsecond", "2,841,216"),
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "0.41"),
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "3.12"),
        "dram__bytes.sum": ("byte", "150,994,944"),
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "1.07"),
        "lts__t_sector_hit_rate.pct": ("%", "12.5"),
        "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "3.12"),
        "sm__maximum_warps_per_active_cycle_pct": ("%", "100"),
        "smsp__warps_eligible.avg.per_cycle_active": ("warp", "0.0024"),
        "smsp__issue_active.avg.pct_of_peak_sustained_active": ("%", "0.24"),
        "launch__waves_per_multiprocessor": ("", "0.02"),
        "launch__registers_per_thread": ("register/thread", "22"),
        "launch__grid_size": ("", "16"),
        "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": ("sector", "4,195,328"),
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": ("", "131,104"),
        **STALLS,
    },
)
BANDWIDTH_SAMPLE = raw_csv(
    "stream_copy",
    {
        "gpu__time_duration.sum": ("usecond", "70.5"),
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "14.2"),
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "91.8"),
        "dram__bytes.sum": ("Mbyte", "268.44"),
        "dram__bytes.sum.per_second": ("Tbyte/second", "3.81"),
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "91.8"),
        "lts__t_sector_hit_rate.pct": ("%", "0.4"),
        "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": ("sector", "4,194,304"),
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": ("request", "262,144"),
        "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": ("sector", "4,194,304"),
        "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": ("request", "262,144"),
        "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "81.0"),
        "sm__cycles_elapsed.avg.per_second": ("Ghz", "1.755"),
        "launch__shared_mem_per_block_static": ("Kbyte/block", "0"),
    },
)
COMPUTE_SAMPLE = raw_csv(
    "fma_chain",
    {
        "gpu__time_duration.sum": ("msecond", "0.301"),
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "88.6"),
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "1.5"),
        "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": ("%", "44.5"),
        "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "88.9"),
        "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active": ("%", "5.6"),
        "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active": ("%", "5.6"),
        "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active": ("%", "0.01"),
        "smsp__issue_active.avg.pct_of_peak_sustained_active": ("%", "94.0"),
        "sm__inst_executed.avg.per_cycle_active": ("inst/cycle", "3.76"),
        "smsp__inst_executed.sum": ("inst", "290,000,000"),
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": ("inst", "8,858,370,048"),
        "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": ("inst", "2,162,688"),
        "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": ("inst", "0"),
    },
)
SAMPLES = {"uncoalesced": LATENCY_SAMPLE, "stream_copy": BANDWIDTH_SAMPLE, "fma_chain": COMPUTE_SAMPLE}


# -- parsing ---------------------------------------------------------------------------------------------


def test_raw_page_values_are_unscaled_and_typed() -> None:
    [kernel] = parse_csv(BANDWIDTH_SAMPLE)
    assert kernel.kernel == "stream_copy"
    m = kernel.metrics
    assert m["gpu__time_duration.sum"].value == pytest.approx(70.5e-6)
    assert m["gpu__time_duration.sum"].unit == "seconds"
    assert m["dram__bytes.sum"].value == pytest.approx(268.44e6)
    assert m["dram__bytes.sum"].unit == "bytes"
    assert m["dram__bytes.sum"].raw_unit == "Mbyte"
    assert m["dram__bytes.sum.per_second"].value == pytest.approx(3.81e12)
    assert m["dram__bytes.sum.per_second"].unit == "bytes/second"
    assert m["sm__cycles_elapsed.avg.per_second"].unit == "hertz"
    assert m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"].value == 4194304
    assert m["dram__throughput.avg.pct_of_peak_sustained_elapsed"].unit == "percent"
    assert m["dram__bytes.sum"].section == "MemoryWorkloadAnalysis"
    assert m["sm__throughput.avg.pct_of_peak_sustained_elapsed"].section == "SpeedOfLight"
    assert m["sm__warps_active.avg.pct_of_peak_sustained_active"].section == "Occupancy"
    assert "Kernel Name" not in m and "Block Size" not in m


def test_units_are_normalised() -> None:
    assert normalise(12.5, "%") == (12.5, "percent")
    assert normalise(2.0, "Kbyte") == (2000.0, "bytes")
    assert normalise(3.0, "usecond") == (3.0 * 1e-6, "seconds")
    assert normalise(1.5, "Gbyte/second") == (1.5e9, "bytes/second")
    assert normalise(1.98, "cycle/nsecond") == (1.98 / 1e-9, "hertz")
    assert normalise(7.0, "cycle") == (7.0, "cycles")
    assert normalise(22.0, "register/thread") == (22.0, "count")
    assert normalise(48.0, "Kbyte/block") == (48000.0, "bytes")
    assert normalise(4.0, "sector/request") == (4.0, "ratio")
    assert normalise(9.0, "inst") == (9.0, "count")
    assert normalise(9.0, "") == (9.0, "count")


def test_details_page_is_read_too() -> None:
    text = (
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","1","python3","h","k","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","GPU Speed Of Light Throughput",'
        '"Memory Throughput","%","91.20"\n'
        '"0","1","python3","h","k","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","GPU Speed Of Light Throughput",'
        '"Duration","usecond","1,204.10"\n'
        '"0","1","python3","h","k","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics",'
        '"dram__bytes.sum","Gbyte","1.5"\n'
    )
    [kernel] = parse_csv(text)
    assert kernel.metrics["Memory Throughput"].section == "SpeedOfLight"
    assert kernel.metrics["Duration"].value == pytest.approx(1204.1e-6)
    assert kernel.metrics["dram__bytes.sum"].value == pytest.approx(1.5e9)
    assert kernel.metrics["dram__bytes.sum"].section == "MemoryWorkloadAnalysis"


def test_output_without_csv_parses_to_nothing() -> None:
    assert parse_csv("==PROF== Connected to process 1\n==ERROR== something\n") == []


# -- classification -----------------------------------------------------------------------------------------


def test_classify_rule_and_threshold() -> None:
    assert classify(29.9, 29.9)[0] == "memory_latency"
    assert classify(30.0, 5.0)[0] == "compute"
    assert classify(5.0, 30.0)[0] == "memory_bandwidth"
    assert classify(60.0, 70.0)[0] == "memory_bandwidth"
    assert classify(70.0, 60.0)[0] == "compute"
    assert classify(40.0, 45.0, threshold_pct=50.0)[0] == "memory_latency"
    assert "30%" in classify(1, 2)[1]


def _analysed(text: str, **kwargs: object) -> HardwareReport:
    [kernel] = parse_csv(text)
    return analyse({n: m.value for n, m in kernel.metrics.items()}, kernel=kernel.kernel, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_synthetic_samples_classify(name: str) -> None:
    assert _analysed(SAMPLES[name]).bottleneck == EXPECTED[name]


def test_latency_report_names_occupancy_eligible_warps_and_stalls() -> None:
    report = _analysed(LATENCY_SAMPLE)
    labels = [m.label for m in report.key_metrics]
    assert labels[:4] == ["achieved occupancy", "eligible warps per cycle", "issue slots busy", "waves per SM"]
    assert [s.label for s in report.stalls] == ["long_scoreboard", "wait", "no_instruction"]
    assert report.summary().startswith("memory-latency-bound: SM 0%, memory 3% of peak; achieved occupancy 3.1%")
    assert "top stall long_scoreboard" in report.summary()


def test_bandwidth_report_names_dram_bytes_per_request_and_l2() -> None:
    report = _analysed(BANDWIDTH_SAMPLE, counted_bytes=268435456)
    metrics = {m.label: m for m in report.key_metrics}
    assert metrics["DRAM throughput"].value == pytest.approx(91.8)
    assert metrics["DRAM bytes"].note == "1.00x the card's counted bytes"
    assert metrics["global load bytes per request"].value == pytest.approx(512.0)
    assert metrics["DRAM bandwidth"].value == pytest.approx(268.44e6 / 70.5e-6)
    assert "L2 hit rate" in metrics


def test_compute_report_names_pipes_issue_and_mix() -> None:
    report = _analysed(COMPUTE_SAMPLE)
    labels = [m.label for m in report.key_metrics]
    assert labels[:2] == ["fma pipe", "alu pipe"]
    assert report.key_metrics[0].value == pytest.approx(88.9)
    mix = next(m for m in report.key_metrics if m.label == "fp32 thread instructions")
    assert mix.note.startswith("FFMA 100%")


def test_threshold_is_configurable() -> None:
    report = _analysed(COMPUTE_SAMPLE, settings=ClassifierSettings(threshold_pct=95.0))
    assert report.bottleneck == "memory_latency"
    assert report.threshold_pct == 95.0


def test_stall_reasons_skip_selected_and_not_issued() -> None:
    values = {name: float(value) for name, (_, value) in STALLS.items()}
    assert [s.label for s in stall_reasons(values, top=10)] == [
        "long_scoreboard", "wait", "no_instruction", "lg_throttle",
    ]  # fmt: skip


def test_roofline_of_a_copy_and_an_fma_kernel() -> None:
    copy = roofline(0, 268435456, 70.5e-6, H200, "measured")
    assert copy.bound == "memory"
    assert copy.arithmetic_intensity == 0
    assert copy.achieved_gbps == pytest.approx(268435456 / 70.5e-6 / 1e9)
    assert copy.share_of_attainable == pytest.approx(268435456 / 70.5e-6 / 4250e9)
    assert copy.ridge_point == pytest.approx(60e12 / 4250e9)
    fma = roofline(17716740096, 4325376, 301e-6, H200, "ncu")
    assert fma.bound == "compute"
    assert fma.attainable_tflops == pytest.approx(60.0)
    assert fma.share_of_attainable == pytest.approx(17716740096 / 301e-6 / 60e12)
    report = _analysed(COMPUTE_SAMPLE, flops=17716740096, counted_bytes=4325376, ceilings=H200)
    assert report.roofline is not None and report.roofline.time_source == "ncu"
    assert report.roofline.seconds == pytest.approx(301e-6)
    assert "of the compute roof" in report.summary()
    measured = _analysed(COMPUTE_SAMPLE, flops=17716740096, counted_bytes=4325376, ceilings=H200, measured_us=250.0)
    assert measured.roofline is not None and measured.roofline.seconds == pytest.approx(250e-6)


def test_a_16_bit_card_is_held_to_the_tensor_core_roof(tmp_path: Path) -> None:
    """On the H200 the matmul template's tensor-core kernels ran at 5.4x the FP32 FMA rate and the worker's ceiling
    check refused them as cheats: a card with a bf16 or fp16 input is held to the dense tensor-core rate (16x the
    FMA rate on sm_90; the largest known ratio, 32, on an architecture not listed), an fp32 card to the FMA rate."""
    assert H200.compute_tflops(["float32", "int64"]) == 60.0
    assert H200.compute_tflops(["bfloat16", "bfloat16"]) == pytest.approx(960.0)
    assert H200.compute_tflops(["int32", "float16"]) == pytest.approx(960.0)
    assert H200.model_copy(update={"capability": (12, 1)}).compute_tflops(["bfloat16"]) == pytest.approx(1920.0)
    flops = 2 * 4096**3
    tc = roofline(flops, 3 * 2 * 4096**2, 400e-6, H200, "measured", ["bfloat16", "bfloat16"])
    assert tc.bound == "compute" and tc.attainable_tflops == pytest.approx(960.0)
    assert tc.share_of_attainable == pytest.approx(flops / 400e-6 / 960e12)
    spec = OperatorCard.model_validate(
        {
            "name": "mm", "family": "matmul", "sizes": {"n": 4096},
            "inputs": [{"name": k, "dtype": "bfloat16", "shape": ["n", "n"]} for k in ("a", "b")],
            "outputs": [{"name": "c", "dtype": "bfloat16", "shape": ["n", "n"]}],
            "input_sets": [{"name": "s", "seed": 1}], "reference": {"function": "x"},
            "cost": {"flops": "2 * n * n * n"},
        }
    )  # fmt: skip
    gpu = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-0", capability="9.0", driver="1", memory_mib=1)
    evaluator = Evaluator(save_card(spec, tmp_path, {}), Builder(arch="sm_90"), Settings(), gpu, worker=object())  # type: ignore[arg-type]
    evaluator.ceilings = H200
    built = BuildResult(ok=True, key="k")

    def timed_at(tflops: float) -> EvalResult:
        us = flops / (tflops * 1e12) * 1e6
        return EvalResult(ok=True, candidate=Timing(median_us=us, p10_us=us, p90_us=us, cv=0.0, reps=20))

    tensor_core = evaluator._judge(timed_at(5.4 * 60.0), built)
    assert tensor_core.ok and tensor_core.ceiling_share == pytest.approx(5.4 / 16)
    skipped = evaluator._judge(timed_at(20 * 60.0), built)
    assert not skipped.ok and skipped.failure == "cheat" and "125% of the speed physics allows" in skipped.reason


def test_analyse_needs_speed_of_light() -> None:
    with pytest.raises(ValueError, match="SpeedOfLight"):
        analyse({"dram__bytes.sum": 1.0})


# -- the real H200 captures -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_capture_parses_and_classifies(name: str) -> None:
    path = FIXTURES / f"{name}.csv"
    if not path.is_file():
        pytest.skip(f"{path.name} not captured yet (scripts/capture_ncu_fixtures.sh on the GPU machine)")
    kernels = parse_csv(path.read_text())
    assert len(kernels) == 1
    [kernel] = kernels
    assert kernel.kernel.startswith(load_card(CARDS / name).spec.baseline.plan.entry)  # type: ignore[union-attr]
    for required in ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes.sum",
                     "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active"):  # fmt: skip
        assert required in kernel.metrics, required
    card = load_card(CARDS / name).spec
    report = analyse(
        {n: m.value for n, m in kernel.metrics.items()}, kernel=kernel.kernel, flops=card.flops(),
        counted_bytes=card.bytes_moved(), ceilings=H200,
    )  # fmt: skip
    assert report.bottleneck == EXPECTED[name], report.lines()
    assert report.roofline is not None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_details_page_classifies_the_same(name: str) -> None:
    """The details page of the same profile (section labels, short rows without rule columns) reads too."""
    path = FIXTURES / "h200" / f"{name}.details.csv"
    if not path.is_file():
        pytest.skip(f"{path.name} not captured yet")
    [kernel] = parse_csv(path.read_text())
    assert kernel.metrics["Duration"].unit == "seconds"
    assert kernel.metrics["Memory Throughput"].section == "SpeedOfLight"
    report = analyse({n: m.value for n, m in kernel.metrics.items()}, kernel=kernel.kernel)
    assert report.bottleneck == EXPECTED[name]


# -- running ncu: error paths with a fake ncu ---------------------------------------------------------------------


LAUNCH = ResolvedLaunch(entry="stream_copy", grid=(1, 1, 1), block=(32, 1, 1), shared_bytes=0, args=[])


def fake_ncu(tmp_path: Path, body: str) -> Path:
    """An executable `ncu` that answers --version and otherwise runs `body` (bash)."""
    path = tmp_path / "bin" / "ncu"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = "--version" ]; then echo "NVIDIA (R) Nsight Compute Command Line Profiler"; '
        'echo "Version 2025.3.0.0 (build 36273991) (public-release)"; exit 0; fi\n' + body
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


async def test_missing_ncu_is_a_typed_error_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(NcuMissing) as caught:
        await Profiler(ProfileSettings(ncu=str(tmp_path / "no" / "ncu"))).profile(
            tmp_path, tmp_path / "k.cubin", LAUNCH
        )
    assert "install Nsight Compute" in caught.value.fix
    assert "not found" in str(caught.value)


async def test_counters_not_permitted(tmp_path: Path) -> None:
    ncu = fake_ncu(tmp_path, 'echo "==PROF== Connected to process 1"\n'
                   'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU '
                   'Performance Counters on the target device 0." >&2\nexit 1\n')  # fmt: skip
    with pytest.raises(NcuNotPermitted) as caught:
        await Profiler(ProfileSettings(ncu=str(ncu))).profile(tmp_path, tmp_path / "k.cubin", LAUNCH)
    assert "NVreg_RestrictProfilingToAdminUsers=0" in caught.value.fix
    assert "not permitted" in caught.value.message


async def test_library_not_loaded_is_unsupported(tmp_path: Path) -> None:
    ncu = fake_ncu(tmp_path, 'echo "==ERROR== LibraryNotLoaded: failed to load the injection library"; exit 1\n')
    with pytest.raises(NcuUnsupported, match="LibraryNotLoaded"):
        await Profiler(ProfileSettings(ncu=str(ncu))).profile(tmp_path, tmp_path / "k.cubin", LAUNCH)


async def test_no_kernel_profiled(tmp_path: Path) -> None:
    ncu = fake_ncu(tmp_path, 'echo "==WARNING== No kernels were profiled."; exit 0\n')
    with pytest.raises(ProfileFailed, match="no launch of a kernel named 'stream_copy'"):
        await Profiler(ProfileSettings(ncu=str(ncu))).profile(tmp_path, tmp_path / "k.cubin", LAUNCH)


async def test_time_limit_kills_the_whole_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    ncu = fake_ncu(tmp_path, f"sleep 60 &\necho $! > {marker}\nwait\n")
    started = time.perf_counter()
    with pytest.raises(ProfileTimeout) as caught:
        await Profiler(ProfileSettings(ncu=str(ncu), timeout_s=1.0)).profile(tmp_path, tmp_path / "k.cubin", LAUNCH)
    assert time.perf_counter() - started < 15
    assert "timeout_s" in caught.value.fix
    child = int(marker.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        await asyncio.sleep(0.1)
    assert not _alive(child), "the ncu's child process survived the time limit"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.is_file() and status.read_text().split()[2] == "Z")


async def test_a_report_from_a_fake_ncu(tmp_path: Path) -> None:
    sample = tmp_path / "sample.csv"
    sample.write_text(BANDWIDTH_SAMPLE)
    args = tmp_path / "args.txt"
    ncu = fake_ncu(tmp_path, f'printf "%s\\n" "$@" > {args}\ncat {sample}\n')
    report = await Profiler(ProfileSettings(ncu=str(ncu))).profile(tmp_path / "card", tmp_path / "k.cubin", LAUNCH)
    assert report.kernel == "stream_copy"
    assert report.ncu_version.startswith("Version 2025.3")
    assert report.value("dram__bytes.sum") == pytest.approx(268.44e6)
    assert report.seconds > 0
    argv = args.read_text().splitlines()
    assert argv[:2] == ["--clock-control", "none"]
    assert argv[argv.index("--kernel-name") + 1] == "stream_copy"
    assert argv[argv.index("--launch-count") + 1] == "1"
    assert argv[argv.index("--page") + 1] == "raw"
    assert "kernelforge_tui.gpu.ncu.launch" in argv
    assert ResolvedLaunch.model_validate_json(argv[argv.index("--launch") + 1]) == LAUNCH
    assert {"SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats", "WarpStateStats"} <= {
        argv[i + 1] for i, a in enumerate(argv) if a == "--section"
    }


async def test_unknown_raw_metric_retries_with_sections_only(tmp_path: Path) -> None:
    sample = tmp_path / "sample.csv"
    sample.write_text(COMPUTE_SAMPLE)
    ncu = fake_ncu(
        tmp_path,
        'for a in "$@"; do if [ "$a" = --metrics ]; then echo "==ERROR== Failed to find metric l1tex__t_requests.sum"; '
        f"exit 1; fi; done\ncat {sample}\n",
    )
    report = await Profiler(ProfileSettings(ncu=str(ncu))).profile(tmp_path, tmp_path / "k.cubin", LAUNCH)
    assert report.kernel == "fma_chain"
    assert any("l1tex__t_requests.sum" in w for w in report.warnings)


GPU = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-test", capability="9.0", driver="0", memory_mib=1)


async def test_one_profiling_service_asks_ncu_its_version_once_and_classifies(tmp_path: Path) -> None:
    """The service keeps its Profiler (lock, `ncu --version`) across profiles, as one per GPU lane must."""
    sample, versions = tmp_path / "sample.csv", tmp_path / "versions"
    sample.write_text(BANDWIDTH_SAMPLE)
    ncu = tmp_path / "ncu"
    ncu.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = "--version" ]; then echo asked >> {versions}; echo "Version 2025.3"; exit 0; fi\n'
        f"cat {sample}\n"
    )
    ncu.chmod(0o755)
    card = load_card(CARDS / "stream_copy")
    build = BuildResult(ok=True, key="k", ptxas={"stream_copy": PtxasStats(registers=16)})
    kernel = BuiltKernel(build=build, cubin=tmp_path / "k.cubin", launch=LAUNCH)
    service = ProfilingService(card, ProfileSettings(ncu=str(ncu)), GPU, H200)
    first = await service.profile(kernel, measured_us=70.0)
    second = await service.profile(kernel)
    assert versions.read_text().splitlines() == ["asked"]
    assert first.profile.ncu_version == second.profile.ncu_version == "Version 2025.3"
    assert first.hardware.bottleneck == "memory_bandwidth" and first.ptxas == PtxasStats(registers=16)
    assert first.hardware.roofline is not None and first.hardware.roofline.time_source == "measured"
    assert second.hardware.roofline is not None and second.hardware.roofline.time_source == "ncu"


async def test_a_candidate_that_does_not_build_is_not_profiled() -> None:
    from kernelforge_tui.build.nvcc import Builder

    card = load_card(CARDS / "stream_copy")
    assert card.spec.baseline is not None
    with pytest.raises(ProfileFailed, match="the candidate cannot be profiled: source check"):
        await build_for_profile(card, Builder(arch="sm_90"), "this is not CUDA", card.spec.baseline.plan)


def test_print_command_is_the_profilers_command() -> None:
    """The capture script runs exactly what this prints."""
    card = CARDS / "stream_copy"
    out = subprocess.run(
        [sys.executable, "-m", "kernelforge_tui.gpu.ncu.run", str(card), "/tmp/x.cubin", "--print-command"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[1:3] == ["--clock-control", "none"]
    assert out[out.index("--kernel-name") + 1] == "stream_copy"
    launch = ResolvedLaunch.model_validate_json(out[-1])
    spec = load_card(card).spec
    assert spec.baseline is not None
    assert launch == resolve(spec.baseline.plan, spec)


def test_profile_launch_refuses_a_missing_cubin() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kernelforge_tui.gpu.ncu.launch", str(CARDS / "stream_copy"), "/nonexistent.cubin",
         "--plan", str(CARDS / "stream_copy" / "baseline.plan.toml")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert "no cubin" in result.stderr
    assert result.stdout == ""


def test_fixture_cards_resolve() -> None:
    """The GPU tests and the capture script use these cards: they must load (every file inside the card) and
    their baseline plan must match the plan file the capture script passes."""
    for name in EXPECTED:
        card = load_card(CARDS / name)
        spec = card.spec
        assert spec.baseline is not None
        assert spec.baseline.plan == load_plan(CARDS / name / "baseline.plan.toml")
        launch = resolve(spec.baseline.plan, spec)
        assert launch.entry in card.baseline_source()
        assert math.prod(launch.grid) * math.prod(launch.block) > 0


# -- on the GPU machine ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_profiling_the_fixture_kernels_gives_their_classes(name: str) -> None:
    """Through the profiling service the search and `kernelforge profile` use: build, ncu over ncu.launch
    (the worker's public launch API), classification."""
    from kernelforge_tui.build.nvcc import Builder
    from kernelforge_tui.gpu.detect import require_gpu

    card = load_card(CARDS / name)
    assert card.spec.baseline is not None
    kernel = await build_for_profile(card, Builder(arch="sm_90"), card.baseline_source(), card.spec.baseline.plan)
    profiled = await ProfilingService(card, ProfileSettings(), require_gpu()[0], H200).profile(kernel)
    hardware = profiled.hardware
    print(f"{name}: {hardware.summary()} (profiled in {profiled.profile.seconds:.1f} s)")
    assert hardware.bottleneck == EXPECTED[name], hardware.lines()
    assert profiled.ptxas is not None and profiled.ptxas.registers > 0


# -- the CLI ------------------------------------------------------------------------------------------------------


def test_cli_prints_a_nodes_saved_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernelforge_tui.cli.main import main
    from kernelforge_tui.config import Settings
    from kernelforge_tui.store import RunStore
    from kernelforge_tui.vocabulary.profiles import NodeProfile, ProfileReport

    card = load_card(CARDS / "stream_copy")
    assert card.spec.baseline is not None
    [kernel] = parse_csv(BANDWIDTH_SAMPLE)
    report = ProfileReport(kernel=kernel.kernel, metrics=kernel.metrics, ncu_version="2025.3", seconds=4.2)
    hardware = analyse(report, flops=0, counted_bytes=card.spec.bytes_moved(), ceilings=H200, measured_us=70.0)
    run_dir = tmp_path / "run"
    with RunStore.create(run_dir, card, "gpu", "NVIDIA H200", Settings()) as store:
        node = store.add_node(None, card.baseline_source(), card.spec.baseline.plan)
        store.save_profile(node.id, NodeProfile(profile=report, hardware=hardware))
    assert main(["profile", str(run_dir), str(node.id)]) == 0
    out = capsys.readouterr().out
    assert "memory-bandwidth-bound" in out
    assert "DRAM throughput" in out
    assert "of the memory roof" in out
    assert main(["profile", str(run_dir), str(node.id), "--json"]) == 0
    saved = NodeProfile.model_validate_json(capsys.readouterr().out)
    assert saved.hardware.bottleneck == "memory_bandwidth"
    assert main(["profile", str(run_dir), "99"]) == 2
