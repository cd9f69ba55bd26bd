"""Nsight Compute profiling of one candidate launch: run ncu in its own process group, typed errors when it fails.

Why a subprocess per profile: ncu replays the kernel dozens of times (one pass per group of counters)
and may hang or be refused counters; the search must never wait on it nor be harmed by it. The launch
goes through `ncu.launch`, which uses the GPU worker's own launch code, so what is profiled is what
was timed. ncu runs with `--clock-control none` (the H200 box needs it; the timings it reports are then
at the GPU's real clocks, like the worker's) and its default cache control (caches flushed before each
pass, like the L2 flush before each timed launch). Its CSV is read by `ncu.csv_report`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelforge_tui.cards.plan import ResolvedLaunch
from kernelforge_tui.config import NCU_RAW_METRICS, NCU_SECTIONS
from kernelforge_tui.config import ProfileSettings as ProfileSettings
from kernelforge_tui.errors import CheckFailed
from kernelforge_tui.gpu.ncu.csv_report import parse_csv
from kernelforge_tui.vocabulary.profiles import ProfileReport

# -- errors ----------------------------------------------------------------------------------------------


class ProfileError(CheckFailed):
    """Profiling did not produce a report; `fix` says what to do about it (exit code 1)."""

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
    sections: Sequence[str] = NCU_SECTIONS,
    metrics: Sequence[str] = NCU_RAW_METRICS,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The exact ncu command line: one launch of `entry` in the target program, raw CSV to stdout."""
    command = [ncu, "--clock-control", "none", "--target-processes", "all"]
    command += ["--kernel-name", entry, "--launch-count", "1"]
    for section in sections:
        command += ["--section", section]
    if metrics:
        command += ["--metrics", ",".join(metrics)]
    command += ["--csv", "--page", "raw", "--print-units", "base", *extra_args]
    return [*command, *target]


def launcher_command(python: str, card_dir: Path, cubin: Path, launch: ResolvedLaunch) -> list[str]:
    """The program ncu runs: ncu.launch, which launches the kernel once through the worker's code."""
    module = "kernelforge_tui.gpu.ncu.launch"
    return [python, "-m", module, str(card_dir), str(cubin), "--launch", launch.model_dump_json()]


async def _run(command: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> tuple[int, str, str]:
    """Run a command in its own session; kill its whole process group when the time limit passes."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout_s):
            stdout, stderr = await process.communicate()
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            async with asyncio.timeout(10):
                await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")


class Profiler:
    """Profiles candidates with ncu, one at a time, each in its own process group."""

    def __init__(
        self, settings: ProfileSettings | None = None, *, gpu_index: int = 0, python: str = sys.executable
    ) -> None:
        self.settings = settings or ProfileSettings()
        self.gpu_index = gpu_index
        self.python = python
        self.lock = asyncio.Lock()
        """Profiles on this Profiler's GPU wait for each other (keep one Profiler per GPU: `ProfilingService`)."""
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
            ncu or self.ncu(),
            launch.entry,
            launcher_command(self.python, card_dir, cubin, launch),
            s.sections,
            s.metrics if metrics else (),
            s.extra_args,
        )

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
            kernel=kernel.kernel or launch.entry,
            metrics=kernel.metrics,
            launch=launch,
            command=command,
            warnings=warnings,
        )


# -- command line (used by scripts/capture_ncu_fixtures.sh) ---------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`--print-command`: the exact ncu argv, one per line; otherwise profile and print the report as JSON."""
    from kernelforge_tui.cards.directory import load_card
    from kernelforge_tui.cards.plan import load_plan, resolve

    parser = argparse.ArgumentParser(prog="python -m kernelforge_tui.gpu.ncu.run")
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
