"""Nsight Compute profiling of one candidate launch: run ncu in its own process, parse its CSV into typed metrics.

Why a subprocess per profile: ncu replays the kernel dozens of times (one pass per group of counters)
and may hang or be refused counters; the search must never wait on it nor be harmed by it. The launch
goes through `profile_launch`, which uses the GPU worker's own launch code, so what is profiled is what
was timed. ncu runs with `--clock-control none` (the H200 box needs it; the timings it reports are then
at the GPU's real clocks, like the worker's) and its default cache control (caches flushed before each
pass, like the L2 flush before each timed launch).

Output format: `--csv --page raw --print-units base`: one column per metric under its raw name, which
is stable across ncu versions (the labels of the details page are not), with units unscaled. The parser
also reads the details page (`Section Name, Metric Name, Metric Unit, Metric Value` rows), so reports
exported by hand can be read too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import io
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.plan import ResolvedLaunch
from kernelforge_tui.config import ProfileSettings as ProfileSettings

Unit = Literal["percent", "bytes", "bytes/second", "seconds", "cycles", "hertz", "ratio", "count"]
"""Canonical units: values are converted to these (Kbyte -> bytes, usecond -> seconds, Ghz -> hertz)."""

SECTIONS: tuple[str, ...] = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
    "ComputeWorkloadAnalysis",
)
"""The ncu sections collected: throughput vs peak, memory, occupancy, launch, stalls, issue, pipes."""

RAW_METRICS: tuple[str, ...] = (
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__time_duration.sum",
    "dram__bytes.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__t_sectors.sum",
    "l1tex__t_requests.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "lts__t_sector_hit_rate.pct",
    "smsp__inst_executed.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "launch__registers_per_thread",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
)
"""Raw metrics on top of the sections (most are in them already; listing them makes sure they are there)."""

SECTION_OF_PREFIX: tuple[tuple[str, str], ...] = (
    ("launch__occupancy", "Occupancy"),
    ("sm__maximum_warps", "Occupancy"),
    ("sm__warps_active", "Occupancy"),
    ("achieved_occupancy", "Occupancy"),
    ("launch__", "LaunchStats"),
    ("smsp__average_warp", "WarpStateStats"),
    ("smsp__pcsamp", "WarpStateStats"),
    ("smsp__thread_inst_executed_per", "WarpStateStats"),
    ("smsp__warps_eligible", "SchedulerStats"),
    ("smsp__warps_active", "SchedulerStats"),
    ("smsp__issue", "SchedulerStats"),
    ("smsp__maximum_warps", "SchedulerStats"),
    ("sm__inst_executed_pipe", "ComputeWorkloadAnalysis"),
    ("sm__pipe", "ComputeWorkloadAnalysis"),
    ("sm__instruction_throughput", "ComputeWorkloadAnalysis"),
    ("smsp__sass", "InstructionStats"),
    ("sm__sass", "InstructionStats"),
    ("smsp__inst_executed", "InstructionStats"),
    ("sm__inst_executed", "ComputeWorkloadAnalysis"),
    ("sm__throughput", "SpeedOfLight"),
    ("gpu__compute_memory", "SpeedOfLight"),
    ("gpu__time_duration", "SpeedOfLight"),
    ("gpc__cycles_elapsed", "SpeedOfLight"),
    ("gpu__dram_throughput", "SpeedOfLight"),
    ("dram__", "MemoryWorkloadAnalysis"),
    ("lts__", "MemoryWorkloadAnalysis"),
    ("l1tex__", "MemoryWorkloadAnalysis"),
)
"""The raw page has no section column: metrics are placed by their name's prefix (first match wins)."""

DETAILS_SECTIONS = {
    "GPU Speed Of Light Throughput": "SpeedOfLight",
    "Memory Workload Analysis": "MemoryWorkloadAnalysis",
    "Occupancy": "Occupancy",
    "Launch Statistics": "LaunchStats",
    "Warp State Statistics": "WarpStateStats",
    "Scheduler Statistics": "SchedulerStats",
    "Compute Workload Analysis": "ComputeWorkloadAnalysis",
}


class Metric(BaseModel):
    """One measured value, in a canonical unit."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The raw metric name (raw page) or the section's label (details page)."""
    section: str
    value: float
    unit: Unit
    raw_unit: str = ""
    """The unit as ncu printed it, before conversion."""


class ProfileReport(BaseModel):
    """What ncu measured on one launch of one kernel."""

    kernel: str
    metrics: dict[str, Metric]
    launch: ResolvedLaunch | None = None
    ncu_version: str = ""
    command: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    """Wall time of the ncu run: the cost of profiling this candidate."""
    warnings: list[str] = Field(default_factory=list)

    def value(self, name: str) -> float | None:
        """A metric's value in its canonical unit, or None where ncu did not report it."""
        metric = self.metrics.get(name)
        return metric.value if metric is not None else None

    def values(self) -> dict[str, float]:
        """name -> value: what the reward and the classifier read."""
        return {name: m.value for name, m in self.metrics.items()}


# -- errors ----------------------------------------------------------------------------------------------


class ProfileError(RuntimeError):
    """Profiling did not produce a report; `fix` says what to do about it."""

    kind = "failed"

    def __init__(self, message: str, fix: str = "", output: str = "") -> None:
        super().__init__(message + (f" Fix: {fix}" if fix else ""))
        self.message = message
        self.fix = fix
        self.output = output


class NcuMissing(ProfileError):
    kind = "missing"


class NcuNotPermitted(ProfileError):
    kind = "not_permitted"


class NcuUnsupported(ProfileError):
    kind = "unsupported"


class ProfileTimeout(ProfileError):
    kind = "timeout"


class ProfilingUnavailable(ProfileError):
    """The backend cannot profile at all (the simulated backend runs no GPU: it makes up no ncu numbers)."""

    kind = "unavailable"


class ProfileFailed(ProfileError):
    kind = "failed"


PERMISSION_FIX = (
    "run the profiler as root, or let all users read the counters: put "
    "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d/nvidia-profiling.conf and "
    "reload the driver (or reboot); in a container, start it with --cap-add=SYS_ADMIN. "
    "See https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


def diagnose(output: str, returncode: int | None, entry: str) -> ProfileError | None:
    """Map ncu's known failure messages to a typed error with its fix; None where nothing is recognised."""
    if "ERR_NVGPUCTRPERM" in output or "permission to access NVIDIA GPU Performance Counters" in output:
        return NcuNotPermitted(
            "ncu is not permitted to read the GPU's performance counters on this machine "
            "(ERR_NVGPUCTRPERM: the driver restricts profiling to administrators).",
            PERMISSION_FIX,
            output,
        )
    if "LibraryNotLoaded" in output or ("Failed to load" in output and "injection" in output.lower()):
        return NcuUnsupported(
            "ncu could not load its profiling library into the launched process (LibraryNotLoaded): the "
            "Nsight Compute version does not match the driver, or its libraries are incomplete.",
            "use the ncu of a CUDA toolkit the installed driver supports (nvidia-smi shows the driver's CUDA "
            "version), or update the driver; check `ncu --version`",
            output,
        )
    if re.search(r"(profiling is )?not supported on (this|the) (device|GPU)|Device not supported", output, re.I):
        return NcuUnsupported(
            "ncu says profiling is not supported on this GPU (a GPU newer than this Nsight Compute, or a "
            "virtual GPU / MIG slice without profiling).",
            "install a newer Nsight Compute (the one in the newest CUDA toolkit); on vGPU or MIG, enable "
            "profiling for the instance or profile on a full GPU",
            output,
        )
    if "No kernels were profiled" in output:
        return ProfileFailed(
            f"ncu saw no launch of a kernel named {entry!r}.",
            "check that the plan's entry names the kernel's __global__ function (extern \"C\" keeps the "
            "name unmangled), and that the launch itself works (`kernelforge eval`)",
            output,
        )
    return None


UNKNOWN_METRIC = re.compile(r"(Failed to find metric|metric[^\n]*(not found|unknown|invalid))", re.I)


# -- parsing -----------------------------------------------------------------------------------------------

PREFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
BASE_WORDS = {
    "byte": "bytes",
    "bytes": "bytes",
    "second": "seconds",
    "s": "seconds",
    "cycle": "cycles",
    "hz": "hertz",
    "Hz": "hertz",
}
PER_THING = {"thread", "block", "warp", "sm", "SM", "request", "instruction", "inst"}


def _scaled(word: str) -> tuple[str, float]:
    """(base word, scale) of one unit word: 'Kbyte' -> ('bytes', 1e3), 'usecond' -> ('seconds', 1e-6)."""
    if word in BASE_WORDS:
        return BASE_WORDS[word], 1.0
    if len(word) > 1 and word[0] in PREFIXES and word[1:] in BASE_WORDS:
        return BASE_WORDS[word[1:]], PREFIXES[word[0]]
    return word, 1.0


def normalise(value: float, unit: str) -> tuple[float, Unit]:
    """Convert a value in an ncu unit into a canonical unit."""
    unit = unit.strip()
    if unit in ("%", "pct", "percent"):
        return value, "percent"
    if "/" in unit:
        top, _, bottom = unit.partition("/")
        top_word, top_scale = _scaled(top)
        bottom_word, bottom_scale = _scaled(bottom)
        scale = top_scale / bottom_scale
        if top_word == "bytes" and bottom_word == "seconds":
            return value * scale, "bytes/second"
        if top_word == "cycles" and bottom_word == "seconds":
            return value * scale, "hertz"
        if top_word == "bytes" and bottom_word in PER_THING:
            return value * top_scale, "bytes"
        if bottom_word in ("thread", "block", "SM", "sm"):
            return value * scale, "count"
        return value * scale, "ratio"
    word, scale = _scaled(unit)
    if word in ("bytes", "seconds", "cycles", "hertz"):
        return value * scale, word  # type: ignore[return-value]
    return value, "count"


def section_of(name: str) -> str:
    for prefix, section in SECTION_OF_PREFIX:
        if name.startswith(prefix):
            return section
    return "raw"


def _number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "")
    if not cleaned or cleaned.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(cleaned)
    except ValueError:
        return None


class ParsedKernel(BaseModel):
    """The metrics of one profiled launch in an ncu CSV."""

    kernel: str
    metrics: dict[str, Metric]


RAW_ID_COLUMNS = {
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context", "Stream",
    "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value",
    "Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup",
}  # fmt: skip


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's output: from the header row (it names 'Kernel Name') on, ==PROF== lines dropped."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("==")]
    for index, line in enumerate(lines):
        if '"Kernel Name"' in line or line.startswith('"ID"'):
            return list(csv.reader(io.StringIO("\n".join(lines[index:]))))
    return []


def parse_csv(text: str) -> list[ParsedKernel]:
    """Parse `ncu --csv` output (raw or details page) into one ParsedKernel per profiled launch."""
    rows = _csv_rows(text)
    if not rows:
        return []
    header = rows[0]
    if "Metric Name" in header and "Metric Value" in header:
        return _parse_details(header, rows[1:])
    return _parse_raw(header, rows[1:])


def _parse_raw(header: list[str], rows: list[list[str]]) -> list[ParsedKernel]:
    """Raw page: a units row, then one row per launch with one column per metric."""
    if not rows:
        return []
    units = rows[0] if rows[0] and rows[0][0].strip() == "" else [""] * len(header)
    body = rows[1:] if units is rows[0] else rows
    name_at = header.index("Kernel Name") if "Kernel Name" in header else None
    kernels: list[ParsedKernel] = []
    for row in body:
        metrics: dict[str, Metric] = {}
        for column, (name, cell) in enumerate(zip(header, row, strict=False)):
            if name in RAW_ID_COLUMNS:
                continue
            number = _number(cell)
            if number is None:
                continue
            raw_unit = units[column] if column < len(units) else ""
            value, unit = normalise(number, raw_unit)
            metrics[name] = Metric(name=name, section=section_of(name), value=value, unit=unit, raw_unit=raw_unit)
        kernel = row[name_at] if name_at is not None and name_at < len(row) else ""
        kernels.append(ParsedKernel(kernel=kernel, metrics=metrics))
    return kernels


def _parse_details(header: list[str], rows: list[list[str]]) -> list[ParsedKernel]:
    """Details page: one row per (launch, section, metric); raw `--metrics` come under their raw names."""
    at = {name: i for i, name in enumerate(header)}
    kernels: dict[str, ParsedKernel] = {}
    needed = max(at[name] for name in ("Metric Name", "Metric Value") if name in at)
    for row in rows:
        if len(row) <= needed:  # rule columns at the end are often left off
            continue
        launch_id = row[at["ID"]] if "ID" in at else "0"
        parsed = kernels.setdefault(
            launch_id, ParsedKernel(kernel=row[at["Kernel Name"]] if "Kernel Name" in at else "", metrics={})
        )
        number = _number(row[at["Metric Value"]])
        name = row[at["Metric Name"]].strip()
        if number is None or not name:
            continue
        raw_unit = row[at["Metric Unit"]] if "Metric Unit" in at and at["Metric Unit"] < len(row) else ""
        value, unit = normalise(number, raw_unit)
        label = row[at["Section Name"]] if "Section Name" in at and at["Section Name"] < len(row) else ""
        section = DETAILS_SECTIONS.get(label, section_of(name) if "__" in name else label or "raw")
        parsed.metrics.setdefault(name, Metric(name=name, section=section, value=value, unit=unit, raw_unit=raw_unit))
    return list(kernels.values())


# -- running ncu ---------------------------------------------------------------------------------------------


def find_ncu(explicit: str | None = None) -> str | None:
    """ncu from the settings, PATH, $CUDA_HOME/bin or /usr/local/cuda/bin."""
    if explicit:
        return explicit if Path(explicit).is_file() or shutil.which(explicit) else None
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "ncu").is_file():
            return str(Path(root) / "bin" / "ncu")
    return None


def ncu_command(
    ncu: str,
    entry: str,
    target: Sequence[str],
    sections: Sequence[str] = SECTIONS,
    metrics: Sequence[str] = RAW_METRICS,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The exact ncu command line: one launch of `entry` in the target program, raw CSV to stdout."""
    command = [ncu, "--clock-control", "none", "--target-processes", "all",
               "--kernel-name", entry, "--launch-count", "1"]  # fmt: skip
    for section in sections:
        command += ["--section", section]
    if metrics:
        command += ["--metrics", ",".join(metrics)]
    command += ["--csv", "--page", "raw", "--print-units", "base", *extra_args]
    return [*command, *target]


def launcher_command(python: str, card_dir: Path, cubin: Path, launch: ResolvedLaunch) -> list[str]:
    """The program ncu runs: profile_launch, which launches the kernel once through the worker's code."""
    return [python, "-m", "kernelforge_tui.gpu.profile_launch", str(card_dir), str(cubin),
            "--launch", launch.model_dump_json()]  # fmt: skip


async def _run(command: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> tuple[int, str, str]:
    """Run a command in its own session; kill its whole process group when the time limit passes."""
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(env), start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), 10)
        raise
    assert process.returncode is not None
    return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")


class Profiler:
    """Profiles candidates with ncu, one at a time, each in its own process group."""

    def __init__(
        self,
        settings: ProfileSettings | None = None,
        *,
        gpu_index: int = 0,
        python: str = sys.executable,
        gpu_lock: asyncio.Lock | None = None,
    ) -> None:
        """`gpu_lock`: pass the evaluator's lock to keep ncu's replays from overlapping timed launches on the
        same GPU (they would disturb each other); by default profiles only wait for each other."""
        self.settings = settings or ProfileSettings()
        self.gpu_index = gpu_index
        self.python = python
        self.lock = gpu_lock or asyncio.Lock()
        self._version: str | None = None

    def ncu(self) -> str:
        ncu = find_ncu(self.settings.ncu)
        if ncu is None:
            raise NcuMissing(
                "Nsight Compute (ncu) was not found, so candidates cannot be profiled "
                "(searching and timing work without it).",
                "install Nsight Compute (it comes with the CUDA toolkit, or as the nsight-compute package), put "
                "it on PATH, or set its path in the profile settings (ncu = '/usr/local/cuda/bin/ncu')",
            )
        return ncu

    async def version(self) -> str:
        """`ncu --version`'s last line, once."""
        if self._version is None:
            try:
                _, out, _ = await _run([self.ncu(), "--version"], 30, os.environ)
            except TimeoutError:
                out = ""
            lines = [line.strip() for line in out.splitlines() if line.strip()]
            self._version = lines[-1] if lines else "unknown"
        return self._version

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(self.gpu_index), PYTHONUNBUFFERED="1")
        return env

    def command(
        self, card_dir: Path, cubin: Path, launch: ResolvedLaunch, *, metrics: bool = True, ncu: str | None = None
    ) -> list[str]:
        s = self.settings
        return ncu_command(
            ncu or self.ncu(), launch.entry, launcher_command(self.python, card_dir, cubin, launch),
            s.sections, s.metrics if metrics else (), s.extra_args,
        )  # fmt: skip

    async def profile(self, card_dir: Path, cubin: Path, launch: ResolvedLaunch) -> ProfileReport:
        """Profile one launch of a built candidate; a typed ProfileError when no report comes."""
        version = await self.version()
        async with self.lock:
            started = time.perf_counter()
            report = await self._attempt(card_dir, cubin, launch, metrics=True)
            if isinstance(report, str):  # an unknown raw metric: the sections alone still classify
                warning = report
                report = await self._attempt(card_dir, cubin, launch, metrics=False)
                if isinstance(report, str):
                    raise ProfileFailed(report)
                report.warnings.append(warning)
            report.seconds = time.perf_counter() - started
        report.ncu_version = version
        return report

    async def _attempt(
        self, card_dir: Path, cubin: Path, launch: ResolvedLaunch, *, metrics: bool
    ) -> ProfileReport | str:
        command = self.command(card_dir, cubin, launch, metrics=metrics)
        try:
            code, out, err = await _run(command, self.settings.timeout_s, self.environment())
        except TimeoutError:
            raise ProfileTimeout(
                f"ncu did not finish within {self.settings.timeout_s:g} s and was killed.",
                "raise the profile time limit (profile settings: timeout_s), or profile on smaller sizes: "
                "ncu replays the kernel once per counter pass",
            ) from None
        output = out + "\n" + err
        problem = diagnose(output, code, launch.entry)
        if problem is not None:
            raise problem
        if metrics and UNKNOWN_METRIC.search(output):
            line = next((x for x in output.splitlines() if UNKNOWN_METRIC.search(x)), "unknown metric")
            return f"this ncu lacks a requested raw metric ({line.strip()}); profiled with the sections only"
        kernels = [k for k in parse_csv(out) if k.metrics]
        if not kernels:
            tail = " | ".join(line for line in output.strip().splitlines()[-6:])
            raise ProfileFailed(
                f"ncu exited with code {code} and reported no metrics for {launch.entry!r}: {tail}",
                "run the command by hand to see why: " + " ".join(command[:12]) + " ...",
                output,
            )
        kernel = kernels[0]
        warnings = [line.strip() for line in output.splitlines() if line.startswith("==WARNING==")]
        return ProfileReport(
            kernel=kernel.kernel or launch.entry, metrics=kernel.metrics, launch=launch, command=command,
            warnings=warnings,
        )  # fmt: skip


# -- command line (used by scripts/capture_ncu_fixtures.sh) ---------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`--print-command`: the exact ncu argv, one per line; otherwise profile and print the report as JSON."""
    from kernelforge_tui.cards.plan import load_plan, resolve
    from kernelforge_tui.cards.store import load_card

    parser = argparse.ArgumentParser(prog="python -m kernelforge_tui.gpu.profile")
    parser.add_argument("card", type=Path)
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--plan", type=Path, help="launch plan TOML (default: the card's baseline plan)")
    parser.add_argument("--print-command", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    card = load_card(args.card)
    if args.plan is not None:
        plan = load_plan(args.plan)
    elif card.spec.baseline is not None:
        plan = card.spec.baseline.plan
    else:
        parser.error("give --plan (the card has no baseline plan)")
    launch = resolve(plan, card.spec)
    profiler = Profiler(ProfileSettings(timeout_s=args.timeout))
    if args.print_command:
        ncu = find_ncu() or "ncu"
        print("\n".join(profiler.command(card.root.resolve(), args.cubin.resolve(), launch, ncu=ncu)))
        return 0
    try:
        report = asyncio.run(profiler.profile(card.root.resolve(), args.cubin.resolve(), launch))
    except ProfileError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(report.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
