"""`kernelforge verify` (and the checks at the end of `export`): every kernel of a package checked on this machine's
GPU, the failures left out with their reports, the package stamped with this machine.

The checks, per kernel: a cubin for this GPU's architecture (built again from the carried source when the package
was made for another); agreement with the original operator on stored, fresh and stress inputs at the weakest
alignment the guard admits, through the runtime's own guard and launch (`cast.probe check`, a process of its own);
faster than the original operator beyond the timing noise; compute-sanitizer memcheck, racecheck and initcheck
over one launch each (`cast.sanitizer`). A kernel that fails any of them becomes a fallback in the audit, with the
reason; the package keeps the others and the stamp says where they were proven.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from kernelforge_tui.cast.manifest import (
    NOT_CHECKED,
    SANITIZER_TOOLS,
    AuditEntry,
    CastError,
    CastManifest,
    CheckRecord,
    KernelEntry,
    Machine,
    Stamp,
    Verifier,
    read_package,
    sha256,
    write_package,
)
from kernelforge_tui.cast.probe import KernelCheck, ProbeResult
from kernelforge_tui.cast.sanitizer import find_sanitizer, run_tool
from kernelforge_tui.errors import CheckFailed
from kernelforge_tui.gpu.detect import NoGpuError, detect_gpus

Progress = Callable[[str], None]
CHECKS = "agreement and timing against eager PyTorch, compute-sanitizer memcheck, racecheck and initcheck, on the GPU"
EXPORT_NO_GPU_HELP = (
    f"every kernel is checked before it goes into a package ({CHECKS}). Run this on the machine with the GPU the "
    f"package is for; or export with --no-sanitize, which writes a package {NOT_CHECKED}: the loader refuses it "
    "until `kernelforge verify PACKAGE` passes on a GPU"
)
VERIFY_NO_GPU_HELP = (
    f"verify runs every kernel's checks ({CHECKS}): run it on a machine with the GPU the package is for, "
    "with torch, a CUDA driver binding and the CUDA toolkit installed"
)
PROBE_TIMEOUT_S = 3600.0


def require_gpu_tools(help_text: str) -> None:
    """NoGpuError (exit 3) naming what is missing (a GPU, torch, a CUDA driver binding, compute-sanitizer), then
    `help_text`: what the command needs them for and what to do."""
    if not detect_gpus():
        raise NoGpuError(f"no NVIDIA GPU here (nvidia-smi lists none): {help_text}")
    if importlib.util.find_spec("torch") is None:
        raise NoGpuError(f"torch is not installed (pip install torch): {help_text}")
    bindings = [name for name in ("cuda", "pycuda") if importlib.util.find_spec(name) is not None]
    if not bindings:
        raise NoGpuError(f"no CUDA driver binding (pip install cuda-bindings, or pycuda): {help_text}")
    if find_sanitizer() is None:
        raise NoGpuError(
            "compute-sanitizer not found (it comes with the CUDA toolkit: put its bin/ on PATH or set CUDA_HOME): "
            f"{help_text}"
        )


def run_probe(package: Path, kernels: list[str], progress: Progress) -> tuple[dict[str, KernelCheck], Machine | None]:
    """`cast.probe check` until every kernel has a result; a kernel that took the process down is failed with why."""
    results: dict[str, KernelCheck] = {}
    machine = None
    remaining = list(kernels)
    with tempfile.TemporaryDirectory(prefix="kernelforge-probe-") as tmp:
        while remaining:
            out = Path(tmp) / f"result-{len(results)}.json"
            argv = [sys.executable, "-m", "kernelforge_tui.cast.probe", "check", str(package), "--out", str(out)]
            for kernel in remaining:
                argv += ["--kernel", kernel]
            progress(f"checking {len(remaining)} kernel(s) against eager PyTorch on the GPU")
            try:
                done = subprocess.run(
                    argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False, start_new_session=True
                )
                returncode, stderr = done.returncode, done.stderr
            except subprocess.TimeoutExpired:
                returncode, stderr = -1, f"the check ran longer than {PROBE_TIMEOUT_S:g} s"
            try:
                found = ProbeResult.model_validate_json(out.read_text())
            except (OSError, ValidationError):
                found = ProbeResult(machine=None)
            if found.machine is None:  # it never got as far as describing the machine: nothing ran
                raise CheckFailed(f"the GPU check did not start (exit {returncode}): {stderr.strip()[-800:]}")
            machine = machine or found.machine
            for check in found.kernels:
                results[check.kernel] = check
            remaining = [k for k in remaining if k not in results]
            if remaining and returncode == 0:
                raise CheckFailed(f"the GPU check skipped {remaining}: {stderr.strip()[-500:]}")
            if remaining:  # the process died inside the first kernel it had no result for
                culprit = remaining.pop(0)
                tail = stderr.strip()[-500:]
                results[culprit] = KernelCheck(
                    kernel=culprit, ok=False, reason=f"the check process died while it ran (exit {returncode}): {tail}"
                )
    return results, machine


def _rebuild(entry: KernelEntry, files: dict[str, bytes], arch: str) -> KernelEntry:
    """A cubin (and PTX) for this GPU from the carried source, when the package was made for another."""
    import asyncio

    from kernelforge_tui.build.nvcc import Builder
    from kernelforge_tui.cards.plan import ResolvedArg
    from kernelforge_tui.cast.export import build_ptx, capability_of

    source = files[entry.files.source].decode()
    builder = Builder(arch=arch)
    args = [
        ResolvedArg(kind=a.kind, name=a.name, scalar_type=a.scalar_type, value=int(a.value)) for a in entry.launch.args
    ]
    result = asyncio.run(builder.build(source, entry.launch.entry, args))
    if not result.ok or result.cubin_path is None:
        raise CheckFailed(f"could not be built for {arch}: {result.log.strip()[-300:]}")
    files[entry.files.cubin] = result.cubin_path.read_bytes()
    files[entry.files.ptx] = build_ptx(source, arch, builder.flags)
    hashes = dict(entry.files.sha256)
    hashes[entry.files.cubin] = sha256(files[entry.files.cubin])
    hashes[entry.files.ptx] = sha256(files[entry.files.ptx])
    guard = entry.guard.model_copy(update={"capability": capability_of(arch)})
    return entry.model_copy(
        update={"cubin_arch": arch, "guard": guard, "files": entry.files.model_copy(update={"sha256": hashes})}
    )


def verify(
    path: Path, out: Path | None = None, *, by: Verifier = "verify", progress: Progress = lambda _: None
) -> CastManifest:
    """Check every kernel of the package at `path` here; write the stamped package to `out` (default: in place).
    The package is read (and refused, CastError) before anything asks for a GPU; its old stamp is not looked at,
    since every check runs again. A package of no kernel is refused, and when no kernel passes nothing is written
    (the manifest returned says why): the file at `path` (or `out`) stays as it was."""
    from kernelforge_tui.build.nvcc import detect_arch

    package = read_package(path, stamp="ignore")
    if not package.manifest.kernels:
        raise CastError(
            f"{path} holds no kernel (its audit says why each variant runs the original operators): there is "
            "nothing to verify, and the file is left as it was"
        )
    require_gpu_tools(VERIFY_NO_GPU_HELP if by == "verify" else EXPORT_NO_GPU_HELP)
    manifest = package.manifest
    files = package.members
    arch = detect_arch()
    assert arch is not None  # require_gpu_tools found a GPU
    sanitizer = find_sanitizer()
    assert sanitizer is not None
    dropped: dict[str, str] = {}
    candidates: list[KernelEntry] = []
    for entry in manifest.kernels:
        if entry.cubin_arch != arch:
            progress(f"{entry.id}: built for {entry.cubin_arch}, this GPU is {arch}: building it again from its source")
            try:
                entry = _rebuild(entry, files, arch)
            except (CheckFailed, OSError, subprocess.TimeoutExpired) as exc:
                dropped[entry.id] = str(exc)
                continue
        candidates.append(entry)
    with tempfile.TemporaryDirectory(prefix="kernelforge-verify-") as tmp:
        staged = Path(tmp) / "staged.cast"
        write_package(staged, manifest.model_copy(update={"kernels": candidates, "stamp": None}), files)
        checks, machine = run_probe(staged, [e.id for e in candidates], progress)
        kept: list[KernelEntry] = []
        for entry in candidates:
            kept_entry = _judge(entry, checks[entry.id], staged, sanitizer, files, dropped, progress)
            if kept_entry is not None:
                kept.append(kept_entry)
    if machine is None:
        raise CheckFailed("the GPU check could not describe this machine (torch sees no CUDA device?)")
    audit = [_audit(a, dropped, kept) for a in manifest.audit]
    stamp = Stamp(machine=machine, at=time.time(), by=by, sanitizer=True)
    notes = [n for n in manifest.notes if "--no-sanitize" not in n]
    result = manifest.model_copy(update={"kernels": kept, "audit": audit, "stamp": stamp, "notes": notes})
    if not kept:  # a package of no kernel would replace one that another machine may still prove
        return result
    used = {name for entry in kept for name in entry.files.sha256} | {n for n in files if n.startswith("reports/")}
    write_package(out or path, result, {n: d for n, d in files.items() if n in used})
    return result


def _judge(
    entry: KernelEntry,
    check: KernelCheck,
    staged: Path,
    sanitizer: str,
    files: dict[str, bytes],
    dropped: dict[str, str],
    progress: Progress,
) -> KernelEntry | None:
    """Correctness (from the probe), then the sanitizer, then the timing: an unsafe kernel is reported as unsafe
    even when it is also slow."""
    records: list[CheckRecord] = []
    if not check.ok:
        dropped[entry.id] = check.reason
        progress(f"{entry.id}: left out: {check.reason}")
        return None
    progress(f"{entry.id}: agrees with eager PyTorch on {len(check.sets)} input sets")
    records.append(
        CheckRecord(
            name="correctness",
            ok=True,
            detail=f"agrees with eager PyTorch on {len(check.sets)} input sets: "
            + ", ".join(s.name for s in check.sets),
        )
    )
    for tool in SANITIZER_TOOLS:
        progress(f"{entry.id}: compute-sanitizer --tool {tool}")
        outcome = run_tool(sanitizer, tool, staged, entry.id)
        report = f"reports/{entry.id}/{tool}.txt"
        files[report] = outcome.report.encode()
        detail = f"{outcome.summary} ({outcome.seconds:.0f} s)"
        progress(f"{entry.id}: {tool}: {'passed' if outcome.ok else 'FAILED'}: {detail}")
        records.append(CheckRecord(name=tool, ok=outcome.ok, detail=detail, report=report))
        if not outcome.ok:
            dropped[entry.id] = f"compute-sanitizer {tool}: {outcome.summary} (report: {report})"
            return None
    if check.timed and check.interval is not None and check.speedup is not None:
        low, high = check.interval
        detail = (
            f"{check.speedup:.3f}x eager ({check.kernel_us:.2f} us vs {check.eager_us:.2f} us, "
            f"95% interval {low:.3f}-{high:.3f}, {check.reps} interleaved reps, L2 flushed)"
        )
        progress(f"{entry.id}: timing: {detail}")
        if not check.faster:
            dropped[entry.id] = f"not faster than eager PyTorch beyond the noise here: {detail}"
            return None
        records.append(CheckRecord(name="timing", ok=True, detail=detail))
    latency = entry.latency.model_copy(
        update={
            "kernel_us": check.kernel_us,
            "eager_us": check.eager_us,
            "speedup_vs_eager": check.speedup,
            "interval_vs_eager": check.interval,
            "reps": check.reps,
        }
    )
    return entry.model_copy(update={"checks": records, "latency": latency})


def _audit(entry: AuditEntry, dropped: dict[str, str], kept: list[KernelEntry]) -> AuditEntry:
    if entry.kernel is None:
        return entry
    if entry.kernel in dropped:
        return entry.model_copy(
            update={"decision": "fallback", "reason": f"left out: {dropped[entry.kernel]}", "kernel": None}
        )
    for kernel in kept:
        if kernel.id == entry.kernel:
            summary = "; ".join(f"{c.name}: {c.detail}" for c in kernel.checks)
            return entry.model_copy(update={"reason": f"proven in the search and here: {summary}"})
    return entry
