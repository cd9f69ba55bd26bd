"""How nvcc runs: under resource limits always, and cut off from the host's files where the machine allows.

Why: the source check keeps directives that read host files out of a candidate; this is the second wall,
for what the check might miss and for compiler bugs. Modes, best first:

- "bwrap": bubblewrap is on PATH and works: nvcc sees the toolkit and system directories read-only, its
  work directory read-write, an empty /tmp and a minimal /dev, in new namespaces (no network), and dies
  with the search.
- "namespaces": no bubblewrap, but unprivileged user namespaces work: `sandbox_exec` builds the same kind
  of root itself (user, mount, pid, network, IPC and UTS namespaces; pivot_root).
- "limits": neither works: nvcc can read what this user can read; the directive guard alone keeps host
  files out of the build, with the limits and a scrubbed environment.

In every mode the nvcc process tree runs under limits on address space, CPU time, file size and number of
processes, set by `sandbox_exec` before it executes nvcc (or bwrap), with the environment reduced to PATH,
TMPDIR, HOME and the locale. The helper dies with the process that started it and takes nvcc's whole process
group with it: a `kill -9` of the search leaves no compiler running.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

SANDBOX_EXEC = Path(__file__).with_name("sandbox_exec.py")
SETUP_FAILED = 125
"""Exit status of `sandbox_exec` when it cannot set the sandbox up (its stderr says why)."""
SYSTEM_READ_ONLY: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
)
"""What the compiler driver, the host preprocessor (gcc) and their libraries need; the toolkit comes on top."""

SandboxMode = Literal["bwrap", "namespaces", "limits"]


class Limits(BaseModel):
    """Resource limits for every process of one build (set with setrlimit, inherited by children)."""

    model_config = ConfigDict(frozen=True)

    address_space_bytes: int = 4 << 30
    """Per process; a cub-heavy kernel needs well under 1 GiB. `#include_next "/dev/zero"` once took 7 GiB."""
    cpu_seconds: int = 70
    """A backstop behind the build timeout (60 s by default): a Builder makes it its timeout + 10 s."""
    file_bytes: int = 256 << 20
    """Largest file a build may write (the preprocessed source, PTX, the cubin)."""
    processes: int = 256
    """Processes this user may start on top of those it runs already (the kernel counts them per user)."""


class SandboxStatus(BaseModel):
    """What protects the host when nvcc runs, for `kernelforge doctor` and the builder."""

    mode: SandboxMode
    reason: str
    """Why this mode: what was found, or why the better modes did not work."""
    bwrap: str | None = None
    limits: Limits = Limits()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def description(self) -> str:
        """One line for people."""
        limits = self.limits
        bounds = (
            f"limits: {limits.address_space_bytes >> 20} MiB address space, {limits.cpu_seconds} s CPU, "
            f"{limits.file_bytes >> 20} MiB files, {limits.processes} more processes"
        )
        where = {
            "bwrap": f"bubblewrap ({self.bwrap}): toolkit and system read-only, no other host files, no network",
            "namespaces": "own namespaces: toolkit and system read-only, no other host files, no network",
            "limits": "NO file isolation (the directive guard keeps host files out); scrubbed environment",
        }[self.mode]
        return f"nvcc sandbox: {where}; {bounds}; {self.reason}"


def read_only_paths(nvcc: str) -> list[str]:
    """Host paths nvcc may read: the system directories and the toolkit that holds `nvcc` (its bin's parent)."""
    real = Path(nvcc).resolve()
    toolkit = real.parent.parent if real.parent.parent != real.parent else real.parent
    paths = list(SYSTEM_READ_ONLY)
    if not any(toolkit == Path(p) or Path(p) in toolkit.parents for p in paths):
        paths.append(str(toolkit))
    return paths


def sandbox_env(nvcc: str, work: Path) -> dict[str, str]:
    """The whole environment nvcc gets: nothing from the caller's (no tokens, no proxies, no LD_PRELOAD)."""
    return {
        "PATH": f"{Path(nvcc).parent}:/usr/local/bin:/usr/bin:/bin",
        "TMPDIR": str(work),
        "HOME": str(work),
        "LC_ALL": "C",
        "LANG": "C",
    }


def bwrap_command(bwrap: str, command: Sequence[str], work: Path, read_only: Sequence[str]) -> list[str]:
    """bubblewrap's argv: new namespaces, a tmpfs root with `read_only` bound read-only and `work` read-write."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL", "--tmpfs", "/tmp", "--dev", "/dev"]
    for path in read_only:
        host = Path(path)
        if host.is_symlink():
            argv += ["--symlink", str(host.readlink()), path]
        elif host.exists():
            argv += ["--ro-bind", path, path]
    argv += ["--bind", str(work), str(work), "--chdir", str(work), "--", *command]
    return argv


def sandbox_command(
    command: Sequence[str], work: Path, scratch: Path, read_only: Sequence[str], status: SandboxStatus
) -> list[str]:
    """The argv that runs `command` in `work` the way `status` says; `scratch` is an empty private directory."""
    isolate: dict[str, object] | None = None
    if status.mode == "bwrap" and status.bwrap is not None:
        command = bwrap_command(status.bwrap, command, work, read_only)
    elif status.mode == "namespaces":
        isolate = {"root": str(scratch), "read_only": list(read_only), "work": str(work)}
    spec = {"limits": status.limits.model_dump(), "isolate": isolate, "cwd": str(work), "parent": os.getpid()}
    return [sys.executable, "-I", "-S", str(SANDBOX_EXEC), json.dumps(spec), "--", *command]


def probe(mode: SandboxMode, bwrap: str | None = None) -> str | None:
    """None when `true` runs in `mode` on this machine; else the reason it does not."""
    true = shutil.which("true") or "/bin/true"
    status = SandboxStatus(mode=mode, reason="probe", bwrap=bwrap)
    with tempfile.TemporaryDirectory(prefix="kernelforge-sandbox-probe-") as tmp:
        work, scratch = Path(tmp, "work"), Path(tmp, "root")
        work.mkdir()
        scratch.mkdir()
        argv = sandbox_command([true], work, scratch, read_only_paths(true), status)
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=30, check=False, env=sandbox_env(true, work)
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


@cache
def sandbox_status() -> SandboxStatus:
    """The best mode this machine supports (probed once per process, in well under a second)."""
    bwrap = shutil.which("bwrap")
    bwrap_failed = probe("bwrap", bwrap) if bwrap is not None else "bubblewrap (bwrap) is not on PATH"
    if bwrap_failed is None:
        return SandboxStatus(mode="bwrap", reason="bubblewrap works here", bwrap=bwrap)
    namespaces_failed = probe("namespaces", None)
    if namespaces_failed is None:
        return SandboxStatus(mode="namespaces", reason=f"{bwrap_failed}; user namespaces work")
    return SandboxStatus(
        mode="limits",
        reason=f"{bwrap_failed}; user namespaces do not work ({namespaces_failed}). "
        "Fix: install bubblewrap (apt-get install bubblewrap) or allow unprivileged user namespaces",
    )
