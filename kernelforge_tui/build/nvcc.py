"""Build stage: compile a candidate to a cubin with nvcc, asynchronously, behind a content-hash cache.

Why a cubin: the harness loads the entry point by name and launches it from a LaunchPlan, so no line
of generated code runs on the host. Why a cache: the search proposes the same source again (repairs,
resumed runs), and a failed build is remembered as failed so a broken candidate is not rebuilt; a build
that failed for reasons outside the source (a timeout, a signal such as the OOM killer's, a sandbox that
could not start) is not remembered.

Untrusted source is checked (off the event loop, `build.source_check`) before nvcc sees it, nvcc runs in the
sandbox of `build.sandbox`, and its output is read by `build.nvcc_output`: the log and diagnostics kept are only
what it says about the candidate and what ptxas and nvcc say.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from kernelforge_tui.atomic import write_atomic
from kernelforge_tui.build.cubin_check import CubinError, cubin_use
from kernelforge_tui.build.cutlass_headers import ALLOWED_PATTERNS, CutlassHeaders, find_cutlass, uses_cutlass
from kernelforge_tui.build.nvcc_output import (
    OutputCap,
    candidate_messages,
    host_paths_removed,
    parse_diagnostics,
    parse_ptxas,
    tool_signal,
)
from kernelforge_tui.build.sandbox import (
    SETUP_FAILED,
    Limits,
    SandboxStatus,
    read_only_paths,
    sandbox_command,
    sandbox_env,
    sandbox_status,
)
from kernelforge_tui.build.source_check import check_source, included_headers
from kernelforge_tui.build.source_policy import DEFAULT_ALLOWED_INCLUDES, MAX_SOURCE_BYTES
from kernelforge_tui.build.source_problem import SourceProblem
from kernelforge_tui.cards.plan import ResolvedArg
from kernelforge_tui.config import MAX_DIAGNOSTICS, MAX_GLOBAL_BYTES, MAX_LOG_BYTES
from kernelforge_tui.config import cache_dir as default_cache_root
from kernelforge_tui.gpu.detect import detect_gpus
from kernelforge_tui.vocabulary.evaluation import (
    MAX_DIAGNOSTIC_CHARS,
    SOURCE_NAME,
    BuildFailure,
    BuildResult,
    Diagnostic,
)

CACHE_FORMAT = 3
"""Bump when the cache entry or the compile command changes meaning: old entries stop matching.
2: logs keep only messages about the candidate; the cubin size cap is part of the key.
3: output caps, host paths removed, heap calls and globals refused; every cap is part of the key."""

MAX_CUBIN_BYTES = 16 << 20
"""Cubins over this size are refused: an honest kernel's is KBs; a huge one means embedded data."""
BUILD_DIR_PREFIX = "kernelforge-build-"
"""A build directory is `kernelforge-build-PID-XXXX`: the PID says whether its process is still alive."""
_BUILD_DIR = re.compile(rf"{re.escape(BUILD_DIR_PREFIX)}(\d+)-\w+")
READ_CHUNK = 1 << 16
NOT_CACHED: frozenset[BuildFailure] = frozenset({"timeout", "killed", "sandbox"})
"""Failures that say nothing permanent about the source: the next request builds again."""

DEFAULT_ARCH = "sm_90"
DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-lineinfo")
CUTLASS_FLAGS: tuple[str, ...] = ("--expt-relaxed-constexpr", "-DNDEBUG")
"""Added for a source that includes CUTLASS/CuTe: CuTe calls constexpr host functions from device code (without the
flag each call is a warning, hundreds a build), and NDEBUG keeps its device asserts (printf and a global string
each) out of the kernel."""
NVCC_MISSING_HELP = (
    "nvcc not found: install the CUDA toolkit and put nvcc on PATH (or set CUDA_HOME), "
    "or set build.nvcc in config.toml / KERNELFORGE_BUILD__NVCC to the nvcc path"
)


_VERSION = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")


@cache
def nvcc_version(nvcc: str) -> str:
    """The toolkit version of `nvcc` such as "13.0.88" (part of the cache key); cached per path.

    Raises OSError when nvcc cannot run and ValueError when its output has no version.
    """
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30, check=False)
    match = _VERSION.search(out.stdout)
    if match is None:
        raise ValueError(f"cannot read a version from `{nvcc} --version`: {out.stdout.strip()[-200:]}")
    return match.group(3)


def detect_arch() -> str | None:
    """The first GPU's target such as "sm_90"; None without nvidia-smi or a GPU."""
    gpus = detect_gpus()
    return gpus[0].arch if gpus else None


def find_nvcc(configured: str | None = None) -> str | None:
    """The nvcc to use: the configured path, else nvcc on PATH, else $CUDA_HOME/bin/nvcc."""
    if configured:
        return configured if os.access(configured, os.X_OK) else shutil.which(configured)
    found = shutil.which("nvcc")
    if found is not None:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = Path(home, "bin", "nvcc") if home else None
    return str(candidate) if candidate is not None and os.access(candidate, os.X_OK) else None


class Builder:
    """Compiles candidates with nvcc, a bounded number at a time, and caches cubins by content hash."""

    def __init__(
        self,
        nvcc: str | None = None,
        arch: str | None = None,
        flags: Sequence[str] = DEFAULT_FLAGS,
        timeout_s: float = 60.0,
        max_parallel: int | None = None,
        cache_dir: Path | None = None,
        work_dir: Path | None = None,
        allowed_includes: frozenset[str] = DEFAULT_ALLOWED_INCLUDES,
        max_source_bytes: int = MAX_SOURCE_BYTES,
        max_cubin_bytes: int = MAX_CUBIN_BYTES,
        sandbox: SandboxStatus | None = None,
        max_log_bytes: int = MAX_LOG_BYTES,
        max_diagnostics: int = MAX_DIAGNOSTICS,
        max_global_bytes: int = MAX_GLOBAL_BYTES,
        cutlass: CutlassHeaders | Literal["installed"] | None = "installed",
    ) -> None:
        """Arguments mirror `BuildSettings`; `work_dir` holds the per-build temp dirs (system temp by default).

        `sandbox` defaults to the best this machine offers (`sandbox_status()`, probed at the first build),
        with a CPU-time limit a little over `timeout_s`. `cutlass`: the CUTLASS/CuTe include tree candidates may
        include from ("installed": the `nvidia-cutlass` wheel's, found at the first build; None: none).
        """
        self.nvcc = find_nvcc(nvcc)
        self.flags = tuple(flags)
        self.timeout_s = timeout_s
        self.cache_dir = cache_dir if cache_dir is not None else default_cache_root() / "cubin"
        self.work_dir = work_dir
        self.allowed_includes = allowed_includes
        self.max_source_bytes = max_source_bytes
        self.max_cubin_bytes = max_cubin_bytes
        self.sandbox = sandbox
        self.max_log_bytes = max_log_bytes
        self.max_diagnostics = max_diagnostics
        self.max_global_bytes = max_global_bytes
        self._swept = False
        self._cutlass = cutlass
        self._arch = arch
        self._slots = asyncio.Semaphore(max_parallel or os.cpu_count() or 2)
        self._key_locks: dict[str, asyncio.Lock] = {}

    async def arch(self) -> str:
        """The configured target, else the GPU's (detected once), else sm_90."""
        if self._arch is None:
            self._arch = await asyncio.to_thread(detect_arch) or DEFAULT_ARCH
        return self._arch

    async def sandboxing(self) -> SandboxStatus:
        """The sandbox builds run in (the machine's best, probed once, unless one was given)."""
        if self.sandbox is None:
            found = await asyncio.to_thread(sandbox_status)
            self.sandbox = found.model_copy(update={"limits": Limits(cpu_seconds=math.ceil(self.timeout_s) + 10)})
        return self.sandbox

    async def toolchain(self) -> tuple[str | None, str | None]:
        """(nvcc, its version) that builds here: nvcc None when there is none, the version None when it does not run.
        The version is part of every cache key; a cluster's builder answers for the nvcc of its workers."""
        if self.nvcc is None:
            return None, None
        try:
            return self.nvcc, await asyncio.to_thread(nvcc_version, self.nvcc)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return self.nvcc, None

    def adopt(self, result: BuildResult, cubin: bytes | None) -> BuildResult:
        """A build made elsewhere (on a cluster worker), its cubin written into this cache: the result as if built
        here. The entry's metadata is stored by `build` (a failure outside the source is not), or by `remember`."""
        result = self._bounded(result)
        if not result.ok or cubin is None:
            return result.model_copy(update={"cubin_path": None})
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        target = self.cache_dir / f"{result.key}.cubin"
        write_atomic(target, cubin)
        return result.model_copy(update={"cubin_path": target})

    def remember(self, result: BuildResult, cubin: bytes | None) -> BuildResult:
        """`adopt`, then store the entry: the next `build` of the same source finds it without nvcc."""
        adopted = self.adopt(result, cubin)
        if adopted.failure not in NOT_CACHED:
            self._store(adopted)
        return adopted

    def cutlass_headers(self) -> CutlassHeaders | None:
        """The CUTLASS/CuTe tree candidates may include, or None (found and hashed once, in a build's thread)."""
        if self._cutlass == "installed":
            self._cutlass = find_cutlass()
        return self._cutlass

    def cache_key(self, source: str, entry: str, arch: str, version: str, cutlass: CutlassHeaders | None = None) -> str:
        """sha256 over everything that changes the cubin or the verdict; for a source that includes CUTLASS, its
        headers' version and tree hash too."""
        caps = [self.max_cubin_bytes, self.max_log_bytes, self.max_diagnostics, self.max_global_bytes]
        headers = [cutlass.version, cutlass.tree_hash] if cutlass is not None else []
        payload = json.dumps([CACHE_FORMAT, version, arch, self.flags, entry, caps, source, *headers])
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def _check(
        self, source: str, entry: str, args: Sequence[ResolvedArg] | None, arch: str, version: str
    ) -> tuple[str, str, list[SourceProblem]]:
        """The cache key, the target the source builds for, and the blocking source problems (run in a thread: a
        source may be megabytes). A source that includes CUTLASS builds for the arch-specific target (sm_90a: wgmma
        and setmaxnreg exist only there)."""
        cutlass = self.cutlass_headers()
        allowed = self.allowed_includes | ALLOWED_PATTERNS if cutlass is not None else self.allowed_includes
        problems = check_source(source, entry, allowed, args, self.max_source_bytes)
        if cutlass is None or not uses_cutlass(included_headers(source)):
            cutlass = None
        target = arch_specific(arch) if cutlass is not None else arch
        key = self.cache_key(source, entry, target, version, cutlass)
        return key, target, [p for p in problems if p.severity == "error"]

    async def build(self, source: str, entry: str, args: Sequence[ResolvedArg] | None = None) -> BuildResult:
        """Check, then compile (or fetch from the cache) one candidate; failures are results, not exceptions.

        `args`, the resolved launch plan's arguments, are checked against the entry's parameters.
        """
        started = time.perf_counter()
        arch = await self.arch()
        nvcc, version = await self.toolchain()
        key, target, problems = await asyncio.to_thread(self._check, source, entry, args, arch, version or "no nvcc")
        if problems:
            refused = BuildResult(
                ok=False,
                key=key,
                failure="source check",
                seconds=time.perf_counter() - started,
                diagnostics=[_from_problem(p, source) for p in problems],
                log="\n".join(f"{SOURCE_NAME}:{p.line}:{p.column}: {p.rule}: {p.message}" for p in problems),
            )
            return self._bounded(refused)
        if nvcc is None or version is None:
            help_text = NVCC_MISSING_HELP if nvcc is None else f"{nvcc} does not run; {NVCC_MISSING_HELP}"
            return BuildResult(
                ok=False,
                key=key,
                failure="nvcc missing",
                seconds=time.perf_counter() - started,
                log=help_text,
                diagnostics=[Diagnostic(file="nvcc", severity="error", message=help_text)],
            )

        lock = self._key_locks.setdefault(key, asyncio.Lock())
        async with lock:  # the same candidate requested twice at once compiles once
            hit = self._load(key)
            if hit is not None:
                return hit.model_copy(update={"cached": True, "seconds": time.perf_counter() - started})
            result = self._bounded(await self.compile(nvcc, source, target, key))
            if result.failure not in NOT_CACHED:
                self._store(result)
        return result.model_copy(update={"seconds": time.perf_counter() - started})

    async def compile(self, nvcc: str, source: str, arch: str, key: str) -> BuildResult:
        """nvcc on this machine, in its sandbox; a subclass may build elsewhere (a cluster) or not at all."""
        sandbox = await self.sandboxing()
        async with self._slots:
            if self.work_dir is not None:
                self.work_dir.mkdir(parents=True, exist_ok=True)
            if not self._swept:
                self._swept = True
                await asyncio.to_thread(remove_stale_build_dirs, self.work_dir or Path(tempfile.gettempdir()))
            prefix = f"{BUILD_DIR_PREFIX}{os.getpid()}-"
            with tempfile.TemporaryDirectory(prefix=prefix, dir=self.work_dir) as tmp:
                work, scratch = Path(tmp, "work"), Path(tmp, "root")
                work.mkdir()
                scratch.mkdir()
                Path(work, SOURCE_NAME).write_text(source, encoding="utf-8")
                read_only = read_only_paths(nvcc)
                cutlass = self.cutlass_headers()
                uses = cutlass is not None and uses_cutlass(included_headers(source))
                target = arch_specific(arch) if uses else arch  # also where a cluster worker got the plain arch
                nvcc_command = [nvcc, "-cubin", f"-arch={target}", "--std=c++17", "-Xptxas", "-v", *self.flags]
                readable = [cutlass.root] if cutlass is not None and uses else []  # its messages reach the debugger
                for root in readable:
                    nvcc_command += [*CUTLASS_FLAGS, "-I", str(root)]
                    read_only.append(str(root))
                nvcc_command += ["-o", "kernel.cubin", SOURCE_NAME]
                command = sandbox_command(nvcc_command, work, scratch, read_only, sandbox)
                # The sandbox's TMPDIR keeps nvcc's intermediates in the build dir: a killed build leaves nothing.
                spawn = asyncio.ensure_future(
                    asyncio.create_subprocess_exec(
                        *command,
                        cwd=work,
                        env=sandbox_env(nvcc, work),
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                try:
                    proc = await asyncio.shield(spawn)
                except asyncio.CancelledError:
                    # Cancelled while asyncio connects the pipes: nvcc already runs (and may have children).
                    # Unshielded, asyncio would kill nvcc alone and leave its children; take the group down.
                    with contextlib.suppress(OSError):
                        await _kill_group(await spawn)
                    raise
                leftovers = asyncio.create_task(_kill_leftovers(proc))
                cap = OutputCap(self.max_log_bytes, self.max_diagnostics)
                try:
                    async with asyncio.timeout(self.timeout_s):  # not wait_for: 3.11's could swallow a cancel
                        await _read_bounded(proc, cap)
                except TimeoutError:
                    await _kill_group(proc)
                    return build_failure(key, "timeout", f"nvcc ran longer than {self.timeout_s:g} s and was stopped")
                except BaseException:  # cancelled: no nvcc may outlive the search that asked for it
                    await _kill_group(proc)
                    raise
                finally:
                    leftovers.cancel()
                raw = host_paths_removed(cap.text(), work)
                if cap.overflowed:
                    return self._overflowed(key, cap, candidate_messages(raw, readable), source)
                return self._result(key, proc.returncode, raw, source, work, sandbox, readable)

    def _overflowed(self, key: str, cap: OutputCap, log: str, source: str) -> BuildResult:
        """A build stopped because its output went over a cap: refused, its first messages kept (cached: the
        same source floods again)."""
        message = cap.overflow_message()
        overflow = Diagnostic(file="nvcc", severity="error", message=message)
        return BuildResult(
            ok=False,
            key=key,
            failure="compile error",
            diagnostics=[overflow, *parse_diagnostics(log, source)],
            log=f"{log}kernelforge: {message}\n",
        )

    def _result(
        self,
        key: str,
        status: int | None,
        raw: str,
        source: str,
        work: Path,
        sandbox: SandboxStatus,
        readable: Sequence[Path],
    ) -> BuildResult:
        """Judge a finished nvcc: sandbox trouble, a signal, a compile error, an oversized cubin, or a cubin."""
        if (status == SETUP_FAILED and "kernelforge sandbox:" in raw) or raw.startswith("bwrap: "):
            return build_failure(key, "sandbox", f"the nvcc sandbox did not start: {raw.strip()[-300:]}")
        # A signal: the status (negative; 128 + n through bubblewrap or a shell) or nvcc's word about a tool.
        number = -status if status is not None and status < 0 else tool_signal(raw)
        if number is None and status is not None and 128 < status <= 128 + signal.SIGRTMAX:
            number = status - 128
        if number is not None:
            return build_failure(key, "killed", _killed_message(number, sandbox.limits))
        log = candidate_messages(raw, readable)
        diagnostics = parse_diagnostics(log, source)
        ptxas = parse_ptxas(log)
        cubin = Path(work, "kernel.cubin")
        if status != 0 or not cubin.is_file():
            if not any(d.severity == "error" for d in diagnostics):
                diagnostics.append(
                    Diagnostic(file="nvcc", severity="error", message=f"nvcc exited with status {status}")
                )
            return BuildResult(
                ok=False, key=key, failure="compile error", diagnostics=diagnostics, log=log, ptxas=ptxas
            )
        size = cubin.stat().st_size
        data = cubin.read_bytes() if size <= self.max_cubin_bytes else b""
        refusal = (
            f"the cubin is {size} bytes, over the cap of {self.max_cubin_bytes} bytes: a kernel's code is KBs; "
            "keep data out of the source"
            if size > self.max_cubin_bytes
            else self._device_use_refusal(data)
        )
        if refusal is not None:
            diagnostics.append(Diagnostic(file="nvcc", severity="error", message=refusal))
            return BuildResult(
                ok=False,
                key=key,
                failure="compile error",
                diagnostics=diagnostics,
                log=f"{log}{refusal}\n",
                ptxas=ptxas,
            )
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        target = self.cache_dir / f"{key}.cubin"
        write_atomic(target, data)
        return BuildResult(ok=True, key=key, cubin_path=target, diagnostics=diagnostics, log=log, ptxas=ptxas)

    def _device_use_refusal(self, cubin: bytes) -> str | None:
        """Why the built cubin is refused for what it asks of the device (heap calls, huge globals), or None."""
        try:
            use = cubin_use(cubin)
        except CubinError as exc:
            return f"the cubin cannot be read ({exc}): build with the configured nvcc"
        if use.heap_calls:
            return (
                f"the kernel calls the device heap ({', '.join(use.heap_calls)}): malloc, free, new and delete "
                "(in any spelling) are not allowed; use the buffers and shared memory the launch plan provides"
            )
        if use.global_bytes > self.max_global_bytes:
            return (
                f"the kernel's __device__ globals take {use.global_bytes} bytes, over the cap of "
                f"{self.max_global_bytes} bytes: keep data in the launch plan's buffers, not in globals"
            )
        return None

    def _bounded(self, result: BuildResult) -> BuildResult:
        return result.bounded(self.max_log_bytes, self.max_diagnostics)

    def _max_entry_bytes(self) -> int:
        """The largest cache entry a result bounded by this builder's caps can make (JSON may escape each
        character to six); a bigger file is a miss, never read."""
        texts = self.max_log_bytes + self.max_diagnostics * (2 * MAX_DIAGNOSTIC_CHARS + 512)
        return 8 * texts + (1 << 20)

    def _load(self, key: str) -> BuildResult | None:
        meta = self.cache_dir / f"{key}.json"
        try:
            if meta.stat().st_size > self._max_entry_bytes():
                return None  # made under other caps (or by an older kernelforge): built again, then replaced
            result = BuildResult.model_validate_json(meta.read_bytes())
        except (OSError, ValidationError):
            return None
        if result.ok and (result.cubin_path is None or not result.cubin_path.is_file()):
            return None
        return result

    def _store(self, result: BuildResult) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.cache_dir / f"{result.key}.json", result.model_dump_json(indent=1).encode("utf-8"))


def arch_specific(arch: str) -> str:
    """The arch-specific target of a CUDA arch ("sm_90" -> "sm_90a"), which Hopper's wgmma and setmaxnreg need; the
    cubin then loads on that compute capability alone, which is where the worker runs it."""
    return arch if arch.endswith("a") else f"{arch}a"


def remove_stale_build_dirs(root: Path) -> list[Path]:
    """Remove this user's build directories under `root` whose process is gone (killed with -9 mid-build):
    the directory name holds the PID. Directories of live processes, of other users or without a PID stay."""
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _BUILD_DIR.fullmatch(entry.name)
        try:
            mine = entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid()
        except OSError:
            continue
        if match is not None and mine and not _alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process holds the PID
    return True


def build_failure(key: str, failure: BuildFailure, message: str) -> BuildResult:
    """A failed build that produced no nvcc output of its own: the message is its log and its one diagnostic."""
    return BuildResult(
        ok=False,
        key=key,
        failure=failure,
        log=message,
        diagnostics=[Diagnostic(file="nvcc", severity="error", message=message)],
    )


def _killed_message(number: int, limits: Limits) -> str:
    """Why the signal probably came: the limit it stands for, or the OOM killer."""
    reasons = {
        signal.SIGKILL: "out of memory (the OOM killer?)",
        signal.SIGXCPU: f"over the CPU-time limit of {limits.cpu_seconds} s",
        signal.SIGXFSZ: f"wrote a file over the limit of {limits.file_bytes >> 20} MiB",
        signal.SIGSEGV: f"crashed, perhaps at the address-space limit of {limits.address_space_bytes >> 20} MiB",
        signal.SIGABRT: f"aborted, perhaps out of memory under the limit of {limits.address_space_bytes >> 20} MiB",
    }
    try:
        name, why = signal.Signals(number).name, reasons.get(signal.Signals(number), "stopped from outside")
    except ValueError:
        name, why = f"signal {number}", "stopped from outside"
    return f"nvcc (or a tool it ran) was killed by {name}: {why}; not cached, a new request builds again"


def _from_problem(problem: SourceProblem, source: str) -> Diagnostic:
    lines = source.splitlines()
    return Diagnostic(
        line=problem.line,
        column=problem.column,
        severity=problem.severity,
        message=f"{problem.message} [{problem.rule}]",
        source_line=lines[problem.line - 1] if 0 < problem.line <= len(lines) else None,
    )


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kill nvcc and its children (cicc, ptxas, ...), which share its session, and reap nvcc."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


async def _read_bounded(proc: asyncio.subprocess.Process, cap: OutputCap) -> None:
    """Read nvcc's output into `cap` until it ends, then reap nvcc; over a cap, kill its group at once."""
    assert proc.stdout is not None
    while chunk := await proc.stdout.read(READ_CHUNK):
        if not cap.feed(chunk):
            await _kill_group(proc)
            return
    await proc.wait()


async def _kill_leftovers(proc: asyncio.subprocess.Process) -> None:
    """Once nvcc has exited, kill what it left in its group: a killed nvcc's cicc would hold its output open.

    Polled: asyncio reports the exit only after the output closes.
    """
    while proc.returncode is None:
        await asyncio.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
