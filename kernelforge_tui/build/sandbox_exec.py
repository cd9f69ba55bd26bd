"""Run one command under resource limits, optionally in fresh user, mount, pid, network, IPC and UTS namespaces.

Why a script of its own: it runs between fork and exec of nvcc, as `python -I -S sandbox_exec.py SPEC --
COMMAND...`, so it imports nothing but the standard library (Python has no os.unshare before 3.12: the
system calls go through ctypes). A helper process, not a `preexec_fn`, because the build runs next to
threads, where code between fork and exec may deadlock.

With `isolate` in SPEC it builds a new root on a tmpfs: the listed host paths bound read-only (every mount
under them made read-only too), the work directory bound read-write, a few devices and an empty /tmp (no
/proc: nvcc does not need it); then it pivots into that root and drops the old one, so nothing else of the
host's file system is reachable. The command runs as pid 1 of its own pid namespace: when it ends (or is killed with its
process group) every process it started ends too. Exit status: the command's, or its signal re-raised;
125 with a `kernelforge sandbox:` line on stderr when the sandbox itself cannot be set up.

The helper stays the command's parent, in a process group of its own, and dies with the process that started it
(SPEC's `parent`): the kernel sends it SIGTERM then (PR_SET_PDEATHSIG), and it kills its whole group, so nvcc's
children (cicc, ptxas) go too; the command itself gets SIGKILL if the helper goes first.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import re
import resource
import signal
import sys

SETUP_FAILED = 125

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203}
# Flags a bind mount inherits and, in a user namespace, may not drop when it is remounted read-only.
LOCKED_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
LIMITS = {
    "address_space_bytes": resource.RLIMIT_AS,
    "cpu_seconds": resource.RLIMIT_CPU,
    "file_bytes": resource.RLIMIT_FSIZE,
    "processes": resource.RLIMIT_NPROC,
}

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The sandbox could not be set up (reported on stderr, exit status 125)."""


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encoded = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    _call(_libc.mount(encoded[0], encoded[1], encoded[2], ctypes.c_ulong(flags), encoded[3]), f"mount {target}")


def set_limits(limits: dict[str, int]) -> None:
    """Hard and soft limits; `processes` counts on top of the processes this user already runs."""
    for name, value in limits.items():
        if name == "processes":
            uid = os.getuid()
            value += sum(1 for e in os.scandir("/proc") if e.name.isdigit() and _owner(e.path) == uid)
        resource.setrlimit(LIMITS[name], (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _owner(path: str) -> int:
    try:
        return os.stat(path).st_uid
    except OSError:
        return -1


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mount_points(under: str) -> list[tuple[str, int]]:
    """Mount points at or below `under` with their locked flags, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040 is a blank
            if point == under or point.startswith(under.rstrip("/") + "/"):
                flags = sum(LOCKED_FLAGS.get(option, 0) for option in fields[5].split(","))
                found.append((point, flags))
    return found


def _bind(source: str, target: str, read_only: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        for point, flags in _mount_points(target):
            _mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | flags)


def _enter_namespaces() -> None:
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    _call(_libc.unshare(flags), "unshare (user namespaces unavailable?)")
    _write("/proc/self/setgroups", "deny")
    # Root outside is an ordinary user inside: the command keeps no capability across exec.
    inside = uid or 1000
    _write("/proc/self/uid_map", f"{inside} {uid} 1")
    _write("/proc/self/gid_map", f"{gid or 1000} {gid} 1")


def _build_root(root: str, read_only: list[str], work: str) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    for path in read_only:
        if os.path.islink(path):
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            os.symlink(os.readlink(path), root + path)
        elif os.path.exists(path):
            _bind(path, root + path, read_only=True)
    for device in ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"):
        _bind(device, root + device, read_only=False)
    _bind(work, root + work, read_only=False)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise SetupError(f"pivot_root: unknown system call number on {platform.machine()}")
    os.chdir(root)
    _call(_libc.syscall(number, b".", b"."), "pivot_root")  # the old root now sits under the new one
    _call(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _die_with_parent(parent: int) -> None:
    """SIGTERM when `parent` ends, and on SIGTERM the whole process group killed (this helper included)."""
    with contextlib.suppress(OSError):  # already a group leader (started in a session of its own)
        os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, lambda number, frame: os.killpg(os.getpgrp(), signal.SIGKILL))
    _call(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl")
    if os.getppid() != parent:  # it ended before the line above
        raise SetupError(f"the process that started the sandbox ({parent}) is gone")


def _wait(child: int) -> None:
    """Leave as the child left: its exit status, or its signal raised again here."""
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP cannot be handled anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def main(argv: list[str]) -> None:
    spec = json.loads(argv[1])
    command = argv[argv.index("--") + 1 :]
    isolate = spec.get("isolate")
    for number in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; the command must not inherit that
        signal.signal(number, signal.SIG_DFL)
    try:
        _die_with_parent(spec["parent"])
        set_limits(spec["limits"])
        if isolate:
            _enter_namespaces()
        alive, held = os.pipe()  # EOF on `alive` once this process (the only holder of `held`) is gone
        child = os.fork()
        if child:
            os.close(alive)
            _wait(child)
        os.close(held)
        _call(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        os.set_blocking(alive, False)
        with contextlib.suppress(BlockingIOError):
            if os.read(alive, 1) == b"":
                raise SetupError("the helper ended before its child was set up")
        os.close(alive)
        if isolate:
            _build_root(isolate["root"], isolate["read_only"], isolate["work"])
        _call(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
        os.chdir(spec["cwd"])
    except (SetupError, OSError) as exc:
        print(f"kernelforge sandbox: {exc}", file=sys.stderr, flush=True)
        os._exit(SETUP_FAILED)
    try:
        os.execv(command[0], command)
    except OSError as exc:
        print(f"kernelforge sandbox: cannot run {command[0]}: {exc}", file=sys.stderr, flush=True)
        os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main(sys.argv)
