"""The .cast package: a zip holding a versioned manifest (this module's models) and, per accepted kernel, its
cubin, its PTX, its CUDA source and its card.

Why a zip with a manifest: a person can unzip and read it, and the runtime needs nothing but this module, torch
and a CUDA driver binding to use it. Why versioned: a package outlives the kernelforge that wrote it; a reader
meets a format it does not know with a message naming both versions, never a half-understood package.

Reading is untrusted input: the manifest and the stamp are checked first, every member is capped by its declared
size and by the bytes it actually inflates to (`ReadLimits`), and every member's sha256 is checked on opening. The
stamp carries a digest over the manifest and every member (`content_digest`); it holds no secret, so it proves
that the contents are the ones stamped (an edit after verification, or a stamp typed into the JSON, is refused),
not who stamped them.

Only the standard library, pydantic, `kernelforge_tui.atomic` and `kernelforge_tui.tensor_maps` (both standard
library and pydantic only) are imported here: the runtime (`cast.runtime`) reads packages with it.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from kernelforge_tui.atomic import write_atomic
from kernelforge_tui.tensor_maps import TensorMap

FORMAT: Literal["kernelforge.cast"] = "kernelforge.cast"
FormatVersion = Literal[2, 3]
FORMAT_VERSION: Literal[3] = 3
"""Bump when a reader of the old version would misread a new package; readers refuse other versions by name.
Version 2 binds the stamp to the contents (`Stamp.digest`): version-1 packages are refused, to be exported again.
Version 3 adds each kernel's calls per forward pass (`KernelEntry.per_forward`); version-2 packages are read as
they are, their calls per forward unknown (`manifest_json` keeps their stamps matching)."""
READ_VERSIONS: tuple[int, ...] = (2, 3)
MANIFEST_NAME = "manifest.json"
DEFAULT_ALIGNMENT = 256
"""Bytes. Every buffer a kernel was proven on started 256-byte aligned (the GPU worker's buffers, torch's
allocator): a pointer that is not (a view that starts mid-row) was never tried, so the guard refuses it."""

Plain = bool | int | float | str | None
Scalar = bool | int | float | str | list[Plain] | None
"""A scalar argument of an aten call as Python passes it, or a list of them (`int[]` arguments); a dtype, device or
memory format by its name without the `torch.` prefix. pydantic's smart unions keep JSON's types: 1 stays an int,
true a bool, 1.0 a float (the guard compares types too: True is not 1 there)."""


VERIFY_HELP = (
    "re-verify it on this machine: `kernelforge verify {path}` (re-runs every kernel's checks and re-stamps it)"
)
NOT_CHECKED = "not checked on a GPU yet"
"""A package with no stamp: exported with --no-sanitize, its kernels proven in the search but not yet by the
package's own checks through the runtime on a GPU (agreement and timing against eager, compute-sanitizer). Not
"unverified", which reads as failed: a kernel that fails those checks is left out of the package, and a verify that
passes no kernel writes nothing."""
UNCHECKED_HELP = (
    "its kernels were proven in the search but not yet through the runtime on a GPU, so the loader refuses it until "
    "`kernelforge verify {path}` passes on a machine with the GPU it is for"
)


class CastError(Exception):
    """A package that cannot be used as it is: the message says what is wrong and what to do."""


class Model(BaseModel):
    """Strict and frozen: an unknown key in a manifest is an error, never silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorGuard(Model):
    """One tensor of the call, exactly as the kernel was proven on it."""

    name: str
    """The card's tensor name (the launch plan's argument name)."""
    shape: tuple[int, ...]
    dtype: str
    """torch's name for the dtype: float32, bfloat16, float16, ..."""
    strides: tuple[int, ...]
    """In elements; the cards are row-major, so these are the contiguous strides."""
    alignment: int = DEFAULT_ALIGNMENT
    """The data pointer must be a multiple of this many bytes."""
    card_shape: tuple[int, ...] | None = None
    """The card's shape for the same elements in the same (row-major) order, where it differs from the call's: the
    kernel reads and writes the tensor as this (a softmax over the last axis of [2, 16, 1024, 1024] is a
    [32768, 1024] card). None: the card's shape is `shape`. The guard and the aten call take `shape`; the card's
    stored and drawn sets are in `kernel_shape`."""

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        """The shape the kernel sees: the card's."""
        return self.shape if self.card_shape is None else self.card_shape


class AtenArg(Model):
    """One argument of the aten operator, in schema order: a card input, or a scalar with the values accepted."""

    name: str
    """The schema's name for it (`self`, `dim`, `half_to_float`)."""
    position: int | None
    """Its index among the positional arguments; None for a keyword-only argument."""
    tensor: str | None = None
    """The card input it binds (a TensorGuard's name); None for a scalar."""
    accepts: list[Scalar] = Field(default_factory=list)
    """A scalar's accepted values: the call must pass one of them (a softmax over the last axis of a 2-D tensor
    accepts dim -1 and 1)."""
    default: Scalar = None
    has_default: bool = False
    """Whether the schema has a default, which a call may leave out (Python kernels receive no default kwargs)."""
    link: tuple[int, int] | None = None
    """In a chain's call (`ChainStep`): the result (step, index) of an earlier call of the chain it reads."""


class Guard(Model):
    """What a call must be for the kernel to run it; any other call goes to the original operator."""

    overload: str
    """The aten overload, `aten::NAME.OVERLOAD` (e.g. `aten::_softmax.default`)."""
    args: list[AtenArg]
    inputs: list[TensorGuard]
    outputs: list[TensorGuard]
    """The returned tensors in order, allocated by the runtime with torch's allocator."""
    capability: tuple[int, int]
    """The device's compute capability, (9, 0) for sm_90: the cubin is for exactly this architecture."""

    def describe(self) -> str:
        return describe_call(self.overload, self.inputs)


def describe_call(overload: str, inputs: list[TensorGuard]) -> str:
    """`aten::_softmax.default(x[2x16x1024x1024] bfloat16 as [32768x1024])`: the call's shapes, and the card's
    where they differ."""

    def one(t: TensorGuard) -> str:
        view = f" as [{'x'.join(map(str, t.card_shape))}]" if t.card_shape not in (None, t.shape) else ""
        return f"{t.name}[{'x'.join(map(str, t.shape))}] {t.dtype}{view}"

    return f"{overload}({', '.join(one(t) for t in inputs)})"


class ChainStep(Model):
    """One aten call of a fused chain: its overload and arguments, each a card input (`tensor`), an earlier call's
    result (`link`) or a scalar (`accepts`: the one value it passed)."""

    overload: str
    """`aten::NAME.OVERLOAD`."""
    args: list[AtenArg]
    results: int = 1
    """How many results it returns (more than one: a graph reads them through getitem)."""


class Chain(Model):
    """The aten calls a fused chain's kernel stands for, in the order they ran (the card's [chain]): only a graph
    pass replaces them, all at once (`cast.fused`); eager runs them one by one."""

    pattern: str
    """residual_layer_norm, bias_gelu, scale_mask_softmax, group_norm_silu, silu_mul, ..."""
    steps: list[ChainStep]
    outputs: list[tuple[int, int]]
    """Per guard output, the (step, result index) it is; every other result is read by later calls only."""

    def describe(self) -> str:
        return " -> ".join(step.overload.removeprefix("aten::") for step in self.steps)

    @property
    def partial(self) -> bool:
        """One call of whose results the kernel computes some (an attention's output, not the logsumexp it keeps
        for backward), not several calls fused."""
        return len(self.steps) == 1

    @property
    def kind(self) -> str:
        """What it is, in the audit's words."""
        return "part of one call's results" if self.partial else "a fused chain"


class LaunchArg(Model):
    kind: Literal["tensor", "scalar"]
    name: str
    scalar_type: str = ""
    """int32, int64, uint32, uint64 or float32 for a scalar."""
    value: int | float = 0
    tensor_map: TensorMap | None = None
    """For a tensor the kernel takes as a TMA map: the map, encoded by the driver over the tensor of each launch (its
    pointer is passed like any tensor's, and the guard admits only the card's shape, which the map spans)."""

    @model_serializer(mode="wrap")
    def _without_no_map(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """An argument without a map serialises as before maps existed: packages without map kernels stay readable
        by the runtimes that came before."""
        data: dict[str, object] = handler(self)
        if self.tensor_map is None:
            data.pop("tensor_map", None)
        return data


class ResolvedArgLike(Protocol):
    """What `launch_arg` reads of a resolved plan's argument (cards.plan.ResolvedArg, not imported here)."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def scalar_type(self) -> str: ...
    @property
    def value(self) -> int: ...
    @property
    def tensor_map(self) -> TensorMap | None: ...


def launch_arg(arg: ResolvedArgLike) -> LaunchArg:
    """A resolved plan's argument as the package launches it: a tensor map travels as its tensor, with the map."""
    kind: Literal["tensor", "scalar"] = "scalar" if arg.kind == "scalar" else "tensor"
    return LaunchArg(kind=kind, name=arg.name, scalar_type=arg.scalar_type, value=arg.value, tensor_map=arg.tensor_map)


class Launch(Model):
    """The launch, resolved at export from the card's sizes: the guard admits exactly those shapes."""

    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: list[LaunchArg]


class Tolerance(Model):
    """|out - eager| <= atol + rtol * |eager| everywhere; NaN only where eager is NaN, inf only where it is."""

    rtol: float
    atol: float


class Latency(Model):
    """What the kernel costs against eager PyTorch and against the card's baseline, with the 95% intervals."""

    kernel_us: float | None = None
    """Median device time of one call through the runtime, L2 flushed, at the last verification."""
    eager_us: float | None = None
    """The original operator's median in the same process, interleaved with the kernel's."""
    speedup_vs_eager: float | None = None
    interval_vs_eager: tuple[float, float] | None = None
    reps: int = 0
    measured_on: str = ""
    """The GPU the eager comparison ran on."""
    search_us: float | None = None
    """The kernel's median in the search (the GPU worker), beside the card's baseline."""
    baseline_us: float | None = None
    speedup_vs_baseline: float | None = None
    interval_vs_baseline: tuple[float, float] | None = None


CheckName = Literal["correctness", "timing", "memcheck", "racecheck", "initcheck"]
SanitizerTool = Literal["memcheck", "racecheck", "initcheck"]
SANITIZER_TOOLS: tuple[SanitizerTool, ...] = ("memcheck", "racecheck", "initcheck")
Verifier = Literal["export", "verify"]


class CheckRecord(Model):
    """One check a kernel passed or failed at the last verification."""

    name: CheckName
    ok: bool
    detail: str
    report: str | None = None
    """The tool's report inside the package (`reports/...`), where one was kept."""


class Provenance(Model):
    """Where the kernel came from."""

    run_id: str
    run_dir: str
    node_id: int
    card_name: str
    card_sha256: str
    source_sha256: str
    search_gpu: str
    """The GPU the search measured on (the run's)."""
    proposer: str = ""
    mutation: str = ""
    nvcc_version: str = ""
    kernelforge_version: str = ""
    exported_at: float = 0.0


class KernelFiles(Model):
    """Members of the zip and their sha256, checked before anything is loaded."""

    cubin: str
    ptx: str
    source: str
    card: str
    sets: list[str] = Field(default_factory=list)
    """The card's stored input sets (.npz), when small enough to carry (real captured data)."""
    sha256: dict[str, str]


class PerForward(Model):
    """How often one forward pass of the captured model makes the calls a kernel's guard admits, counted at export
    from the capture: what the time a kernel saves per call is multiplied by for the time it saves per forward."""

    calls: int
    """Calls per forward pass (a chain's kernel: instances of the chain), summed over the captured variants whose
    calls its guard admits."""
    variants: list[str]
    """Those variants' ids (`v27`; the kernel's own first)."""


class KernelEntry(Model):
    """One accepted kernel: the variant it serves, its guard and launch, its files and its evidence."""

    id: str
    variant: str
    """The captured variant (or card) it serves: its name in the audit."""
    guard: Guard
    launch: Launch
    tolerances: dict[str, Tolerance]
    """Per output: how far from eager it may be (the card's tolerance)."""
    cubin_arch: str
    """The architecture the cubin was built for (sm_90)."""
    files: KernelFiles
    latency: Latency
    checks: list[CheckRecord] = Field(default_factory=list)
    provenance: Provenance
    chain: Chain | None = None
    """A fused chain's kernel: the calls it replaces (its guard's overload is `kernelforge::<pattern>`, its args the
    card inputs in order)."""
    per_forward: PerForward | None = None
    """None: not known: exported from a run (one card, no forward pass), or a package of format version 2."""

    @property
    def serves(self) -> list[str]:
        """Where it runs: a single call's kernel in eager and in compiled graphs, a chain's in compiled graphs only."""
        return ["compile"] if self.chain is not None else ["eager", "compile"]

    @property
    def saved_per_call_us(self) -> float | None:
        """Eager's median less the kernel's at the last verification (a chain's eager: all its calls, replayed);
        None before a GPU timed it."""
        lat = self.latency
        return None if lat.kernel_us is None or lat.eager_us is None else lat.eager_us - lat.kernel_us

    @property
    def saved_per_forward_us(self) -> float | None:
        """`saved_per_call_us` times the calls per forward pass; None where either is not known."""
        per_call = self.saved_per_call_us
        return None if per_call is None or self.per_forward is None else per_call * self.per_forward.calls


class AuditEntry(Model):
    """For every captured variant: does a generated kernel run it, or the original operator, and why."""

    variant: str
    overload: str | None = None
    call: str = ""
    """Its shapes and dtypes in words."""
    decision: Literal["kernel", "fallback"]
    reason: str
    card: str | None = None
    """The variant's card (its directory in a capture, its name for a run); None for a variant without one."""
    kernel: str | None = None
    run: str | None = None
    node: int | None = None


class Machine(Model):
    """What a package was verified on; the loader refuses a machine that differs in any of the compared fields."""

    gpu_name: str
    capability: tuple[int, int]
    driver_version: str
    """The NVIDIA driver, e.g. 570.124.06 (its major, 570, is compared)."""
    cuda_version: str
    """The CUDA version torch was built with (torch.version.cuda), compared as major.minor."""
    torch_version: str
    """Compared exactly: eager kernels, and so the comparison and the timing against them, change with torch."""
    binding: str = ""
    """The CUDA driver binding the runtime used (cuda-bindings or pycuda) and its version."""
    kernelforge_version: str = ""
    copy_gbps: float | None = None
    """Bytes read plus written per second (GB/s) of a device-to-device copy, measured by the export's GPU check
    (not compared): what the compile pass times the memory traffic of a split fusion at."""

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def driver_major(self) -> str:
        return self.driver_version.split(".")[0]

    @property
    def cuda_minor(self) -> str:
        return ".".join(self.cuda_version.split(".")[:2])

    def describe(self) -> str:
        return (
            f"{self.gpu_name} ({self.arch}, driver {self.driver_version}, CUDA {self.cuda_version}, "
            f"torch {self.torch_version})"
        )

    def differences(self, other: Machine) -> list[str]:
        """What differs from `other` (this is the package's machine, `other` the one here), in words."""
        found: list[str] = []
        if self.capability != other.capability:
            found.append(f"GPU architecture {self.arch} there, {other.arch} here")
        if self.driver_major != other.driver_major:
            found.append(f"driver major {self.driver_major} there, {other.driver_major} here")
        if self.cuda_minor != other.cuda_minor:
            found.append(f"CUDA {self.cuda_minor} there, {other.cuda_minor} here")
        if self.torch_version != other.torch_version:
            found.append(f"torch {self.torch_version} there, {other.torch_version} here")
        return found


class Stamp(Model):
    """The last verification: the machine, when, by which command, whether compute-sanitizer ran, and the contents
    it was made for."""

    machine: Machine
    at: float
    by: Verifier
    sanitizer: bool
    digest: str = ""
    """`content_digest` of the package it stamps, filled in by `write_package`: a reader refuses a stamp that does
    not match the contents."""


class PackageSource(Model):
    kind: Literal["run", "capture"]
    path: str


class CastManifest(Model):
    """manifest.json."""

    format: Literal["kernelforge.cast"] = FORMAT
    format_version: FormatVersion = FORMAT_VERSION
    created_at: float
    kernelforge_version: str
    source: PackageSource
    kernels: list[KernelEntry]
    audit: list[AuditEntry]
    stamp: Stamp | None = None
    """None: not checked on a GPU yet (exported with --no-sanitize): the loader refuses it until `kernelforge verify`
    has passed on a GPU."""
    notes: list[str] = Field(default_factory=list)


def kernel_line(manifest: CastManifest, kernel: KernelEntry, counters: str = "", used_in: str | None = None) -> str:
    """One kernel in words, the same in `kernelforge export`, `cast.report()` and `kernelforge run`: its call, the
    runtime's `counters` (hits, fallbacks), where it is used (`used_in`, from the counters; without, where it can
    run), and the time it saved per call and per forward pass at its last verification, on the GPU of the stamp."""
    chain = kernel.chain
    parts = [counters] if counters else []
    if used_in is None:
        parts.append(f"serves: compile only ({chain.kind})" if chain else "serves: eager and compile")
    else:
        parts.append(f"used in: {used_in}" + (f" ({chain.kind}: compile only)" if chain else ""))
    lat, per_call = kernel.latency, kernel.saved_per_call_us
    if lat.kernel_us is None or lat.eager_us is None or per_call is None:
        base = f" ({lat.speedup_vs_baseline:.2f}x the card's baseline in the search)" if lat.speedup_vs_baseline else ""
        parts.append(f"not timed against eager yet{base}")
    else:
        calls = f" for its {len(chain.steps)} calls" if chain else ""
        where = f" on {manifest.stamp.machine.gpu_name}" if manifest.stamp is not None else ""
        parts.append(
            f"{per_call:.1f} us saved per call ({lat.kernel_us:.1f} vs eager {lat.eager_us:.1f} us{calls} at "
            f"verification{where})"
        )
    forward = kernel.per_forward
    if forward is None:
        why = "package from an older export" if manifest.format_version < 3 else "exported from a run, not a capture"
        parts.append(f"calls per forward unknown ({why})")
    else:
        unit = ("chain" if chain else "call") + ("" if forward.calls == 1 else "s")
        saved = kernel.saved_per_forward_us
        parts.append(
            f"{forward.calls} {unit} per forward ({', '.join(forward.variants)})"
            + (f": {saved:.1f} us saved per forward" if saved is not None else "")
        )
    return f"  {kernel.id}: {kernel.guard.describe()}: " + "; ".join(parts)


class ReadLimits(Model):
    """What a reader takes from a package before refusing it: a zip bomb is refused, never inflated. The defaults
    hold any package `kernelforge export` writes (it refuses to write one they would not)."""

    members: int = 4096
    """Members in the zip (a kernel has four files, its stored sets and three sanitizer reports)."""
    member_bytes: int = 256 << 20
    """Bytes of one member once inflated (a cubin is capped at 16 MiB at build, stored sets at 32 MiB a kernel)."""
    total_bytes: int = 2 << 30
    """Bytes of all members once inflated."""

    def check_sizes(self, path: Path, sizes: Sequence[tuple[str, int]], fix: str) -> None:
        """CastError, ending with `fix`, when the members (name, inflated size) are too many, one too large, or
        too large together."""
        if len(sizes) > self.members:
            raise CastError(f"{path}: {len(sizes)} members, more than the {self.members} a package may hold: {fix}")
        for name, size in sizes:
            if size > self.member_bytes:
                raise CastError(
                    f"{path}: {name}: {size} bytes, more than the {self.member_bytes} a member may hold: {fix}"
                )
        total = sum(size for _, size in sizes)
        if total > self.total_bytes:
            largest = max(sizes, key=lambda s: s[1])[0]
            raise CastError(
                f"{path}: {total} bytes in all, more than the {self.total_bytes} a package may hold (the largest "
                f"member: {largest}): {fix}"
            )


DEFAULT_LIMITS = ReadLimits()
NOT_OURS = "not a package kernelforge wrote; export it again"

StampPolicy = Literal["check", "require", "ignore"]
"""What a reader asks of the stamp. check: one that is there must match the contents. require: also refuse a package
not checked on a GPU yet (no stamp), before any member is read (the runtime). ignore: not looked at (verify, which
replaces it)."""


class Package:
    """An opened .cast file: its manifest and its other members, every hash the manifest records checked on
    opening."""

    def __init__(self, path: Path, manifest: CastManifest, members: dict[str, bytes]) -> None:
        self.path = path
        self.manifest = manifest
        self._members = members

    def member(self, name: str) -> bytes:
        """A member's bytes; CastError when it is missing."""
        if name not in self._members:
            raise CastError(f"{self.path}: {name} is missing from the package: export it again")
        return self._members[name]

    @property
    def members(self) -> dict[str, bytes]:
        return dict(self._members)


def manifest_json(manifest: CastManifest, indent: int | None = None) -> str:
    """The manifest as its format version writes it. A version-2 manifest keeps exactly the keys it was read with
    (pydantic's unset fields left out): a field added since, at its default, stays out, so a version-2 package keeps
    the text its stamp's digest was taken over (and a version-2 reader can still read it)."""
    return manifest.model_dump_json(indent=indent, exclude_unset=manifest.format_version == 2)


def content_digest(manifest: CastManifest, hashes: Mapping[str, str]) -> str:
    """sha256 over the manifest (the stamp's own digest left blank) and every member's name and sha256 (`hashes`,
    the manifest itself not among them): what a stamp is bound to."""
    blank = manifest.stamp.model_copy(update={"digest": ""}) if manifest.stamp is not None else None
    text = manifest_json(manifest.model_copy(update={"stamp": blank}))
    lines = [f"{MANIFEST_NAME} {sha256(text.encode())}", *(f"{name} {hashes[name]}" for name in sorted(hashes))]
    return sha256("\n".join(lines).encode())


def _inflate(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, allowed: int) -> bytes:
    """A member's bytes, read as a stream and stopped one byte past `allowed`: a size its header understates is
    caught by the bytes themselves."""
    if info.flag_bits & 0x1:
        raise CastError(f"{path}: {info.filename} is encrypted: {NOT_OURS}")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise CastError(
            f"{path}: {info.filename} is compressed with zip method {info.compress_type} (packages are stored or "
            "deflated): export it again"
        )
    try:
        with archive.open(info) as stream:
            data = stream.read(allowed + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise CastError(
            f"{path}: {info.filename}: its data does not match its zip header ({exc}): the file is damaged; "
            "export it again"
        ) from None
    if len(data) > allowed:
        raise CastError(
            f"{path}: {info.filename} inflates past {allowed} bytes, more than its header says or the package may "
            f"hold: {NOT_OURS}"
        )
    return data


def read_package(path: Path | str, *, stamp: StampPolicy = "check", limits: ReadLimits = DEFAULT_LIMITS) -> Package:
    """Open a .cast file: CastError for a file that is not a package of a known version, one over `limits`, a
    member that does not match its recorded sha256, and a stamp (per `stamp`) missing or not matching the contents.
    The manifest and the stamp are read first; no member is read whole before it is known to fit."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            infos = [info for info in archive.infolist() if not info.is_dir()]
            limits.check_sizes(path, [(info.filename, info.file_size) for info in infos], NOT_OURS)
            names = Counter(info.filename for info in infos)
            twice = sorted(name for name, n in names.items() if n > 1)
            if twice:
                raise CastError(f"{path}: {twice[0]} is in the zip twice: {NOT_OURS}")
            if MANIFEST_NAME not in names:
                raise CastError(f"{path}: not a .cast package (no {MANIFEST_NAME} inside)")
            budget = limits.total_bytes
            by_name = {info.filename: info for info in infos}
            text = _inflate(path, archive, by_name[MANIFEST_NAME], min(limits.member_bytes, budget))
            manifest = _manifest(path, text)
            if stamp == "require" and manifest.stamp is None:
                raise CastError(
                    f"{path} is {NOT_CHECKED} (exported with --no-sanitize): {UNCHECKED_HELP.format(path=path)}"
                )
            budget -= len(text)
            members: dict[str, bytes] = {}
            for info in infos:
                if info.filename != MANIFEST_NAME:
                    data = _inflate(path, archive, info, min(limits.member_bytes, budget))
                    budget -= len(data)
                    members[info.filename] = data
    except FileNotFoundError:
        raise CastError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise CastError(f"{path}: not a .cast package (not a readable zip: {exc})") from None
    hashes = {name: sha256(data) for name, data in members.items()}
    _check_hashes(path, manifest, hashes)
    if stamp != "ignore" and manifest.stamp is not None and manifest.stamp.digest != content_digest(manifest, hashes):
        raise CastError(
            f"{path}: its stamp does not match its contents (the manifest or a member changed after verification, "
            f"or the stamp was not written by kernelforge verify): {VERIFY_HELP.format(path=path)}"
        )
    return Package(path, manifest, members)


def _manifest(path: Path, text: bytes) -> CastManifest:
    try:
        raw = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CastError(f"{path}: {MANIFEST_NAME} is not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CastError(f"{path}: not a .cast package ({MANIFEST_NAME} has no format {FORMAT!r})")
    version = raw.get("format_version")
    if version not in READ_VERSIONS or type(version) is not int:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        fix = "upgrade kernelforge" if newer else "export it again with this kernelforge"
        known = " and ".join(map(str, READ_VERSIONS))
        raise CastError(f"{path}: package format version {version}, this kernelforge reads versions {known}: {fix}")
    try:
        return CastManifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CastError(
            f"{path}: {MANIFEST_NAME}: {where}: {first['msg']} ({exc.error_count()} problem(s)): export it again"
        ) from None


def _check_hashes(path: Path, manifest: CastManifest, hashes: Mapping[str, str]) -> None:
    """Every file a kernel names is in the package, has a recorded sha256, and matches it."""
    for kernel in manifest.kernels:
        files = kernel.files
        for name in (files.cubin, files.ptx, files.source, files.card, *files.sets, *files.sha256):
            if name not in hashes:
                raise CastError(f"{path}: {name} is missing from the package: export it again")
            recorded = files.sha256.get(name)
            if recorded is None:
                raise CastError(f"{path}: kernel {kernel.id}: {name} has no sha256 in the manifest: export it again")
            if hashes[name] != recorded:
                raise CastError(
                    f"{path}: {name} does not match its sha256 in the manifest: the file was changed; export it again"
                )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def package_bytes(manifest: CastManifest, files: dict[str, bytes], path: Path = Path("package")) -> bytes:
    """The zip: manifest first, then the files in name order, fixed timestamps (the same inputs give the same
    bytes). Cubins and PTX are deflated; .npz sets are already compressed. A stamp is bound to these contents
    (`content_digest`); CastError for a package a reader with the default limits would refuse."""
    if manifest.stamp is not None:  # over the manifest as a reader will validate it (model_copy does not)
        read_back = CastManifest.model_validate(json.loads(manifest_json(manifest)))
        digest = content_digest(read_back, {name: sha256(data) for name, data in files.items()})
        manifest = manifest.model_copy(update={"stamp": manifest.stamp.model_copy(update={"digest": digest})})
    buffer = io.BytesIO()
    text = manifest_json(manifest, indent=1).encode()
    sizes = [(MANIFEST_NAME, len(text)), *((name, len(data)) for name, data in files.items())]
    DEFAULT_LIMITS.check_sizes(path, sizes, "more than a reader takes: export fewer kernels into one package")
    with zipfile.ZipFile(buffer, "w") as archive:
        entries = [(MANIFEST_NAME, text)]
        entries += sorted(files.items())
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if name.endswith(".npz") else zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def write_package(path: Path, manifest: CastManifest, files: dict[str, bytes]) -> None:
    """Write atomically (a temporary file renamed into place): a reader never sees half a package."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, package_bytes(manifest, files, path))
