"""`kernelforge export`: a run's (or a capture's runs') proven kernels into a .cast package.

What goes in: per variant, the run's kernel (a node the user marked for export, else the promoted best), only
where the search proved it correct and faster than the card's baseline beyond the timing noise; built again with
nvcc (the sandboxed builder) as a cubin for the target architecture and as PTX; its launch resolved from the card's
sizes; its guard from the captured call (or, for a hand-written card, the built-in binding); its card and small
stored input sets, so that `kernelforge verify` can re-check it anywhere; from a capture, the calls of one forward
pass its guard admits (`cast.capture.per_forward`). Every variant gets an audit line: kernel, or fallback and why.

What is checked after: `cast.verify` runs every kernel on the GPU against eager PyTorch (agreement on stored,
fresh and stress inputs; timing, which must beat eager beyond the noise) and under compute-sanitizer (memcheck,
racecheck, initcheck). A kernel that fails is left out, with the report, and the package is stamped with the
machine. Without a GPU, export refuses unless told `--no-sanitize`: it then writes a package not checked on a GPU yet
(no stamp), which the loader refuses until `kernelforge verify` passes on a GPU.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

import kernelforge_tui
from kernelforge_tui.atomic import replacing
from kernelforge_tui.build.nvcc import DEFAULT_ARCH, Builder, detect_arch, find_nvcc, nvcc_version
from kernelforge_tui.build.sandbox import read_only_paths, sandbox_command, sandbox_env, sandbox_status
from kernelforge_tui.cards.directory import Card, load_card
from kernelforge_tui.cards.errors import CardError
from kernelforge_tui.cards.expr import ExprError
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.cast.bindings import CallBinding, from_card
from kernelforge_tui.cast.manifest import (
    NOT_CHECKED,
    AuditEntry,
    CastManifest,
    Guard,
    KernelEntry,
    KernelFiles,
    Latency,
    Launch,
    PackageSource,
    PerForward,
    Provenance,
    Tolerance,
    launch_arg,
    sha256,
    write_package,
)
from kernelforge_tui.errors import BadInput, CheckFailed
from kernelforge_tui.gpu.statistics import speedup_interval
from kernelforge_tui.store import RunStore, StoreError
from kernelforge_tui.store.files import connect, db_file, named
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.nodes import MEASURED, NodeRecord

MAX_SET_BYTES = 32 << 20
"""Stored input sets travel in the package up to this size per kernel (real captured data is the best test)."""

Progress = Callable[[str], None]


class ExportError(BadInput):
    """Nothing to export, or a target that is neither a run nor a capture (exit code 2)."""


@dataclass
class Found:
    """One variant's kernel as the search left it, before the export's checks."""

    variant: str
    binding: CallBinding
    card: Card
    card_json: str
    sets_note: str
    run_dir: Path
    run_id: str
    gpu_name: str
    node: NodeRecord
    evaluation: Evaluation | None
    per_forward: PerForward | None = None
    """The calls per forward pass it covers, where a capture counted them."""


@dataclass
class Collected:
    found: list[Found] = field(default_factory=list)
    audit: list[AuditEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    """The variants in the order the audit lists them (a capture's ranking); empty: as they come."""


# -- reading runs ------------------------------------------------------------------------------------------------


def run_card(run_dir: Path, store: RunStore) -> tuple[Card, str, str]:
    """(the card the run searched, its JSON as the run recorded it, a note about its stored sets). The run's record
    is the truth: the card directory is used for its stored sets only while it still says the same."""
    with named(run_dir / "run.sqlite"):
        conn = connect(db_file(run_dir), readonly=True)
        try:
            card_json = str(conn.execute("SELECT card_json FROM run").fetchone()[0])
        finally:
            conn.close()
    spec = OperatorCard.model_validate_json(card_json)
    root = store.card_dir()
    if not any(s.file is not None for s in spec.input_sets):
        return Card(spec=spec, root=root), card_json, ""  # nothing stored to carry: the run's record is enough
    try:
        on_disk = load_card(root)
    except CardError:
        return Card(spec=spec, root=root), card_json, f"card directory {root} not found: stored sets not carried"
    if on_disk.spec != spec:
        return Card(spec=spec, root=root), card_json, f"{root} changed since the run: its stored sets not carried"
    return on_disk, card_json, ""


def chosen_node(store: RunStore) -> tuple[NodeRecord | None, str]:
    """The node to export: one the user marked for export (the newest), else the run's best; and why none."""
    marked = [n for n in store.nodes() if n.export]
    if marked:
        return store.node_record(marked[-1].id), ""
    best = store.run_info().best_node_id
    if best is None:
        return None, "the run has no measured kernel"
    return store.node_record(best), ""


def refusal(node: NodeRecord, evaluation: Evaluation | None) -> str:
    """'' when the node is proven correct and faster than the card's baseline beyond the noise; else why not."""
    if node.status not in MEASURED:
        why = f" ({node.failure}: {node.reason[:200]})" if node.failure else ""
        return f"node {node.id} is {node.status}{why}: not proven correct"
    result = evaluation.result if evaluation is not None else None
    if result is None or not result.ok:
        return f"node {node.id} has no passing evaluation stored"
    if result.candidate is None or result.baseline is None:
        return f"node {node.id} was not timed against the card's baseline"
    low, high = speedup_interval(result.candidate, result.baseline)
    speedup = result.baseline.median_us / result.candidate.median_us
    if low <= 1.0:
        return (
            f"node {node.id} is not faster than the card's baseline beyond the noise "
            f"({speedup:.3f}x, 95% interval {low:.3f}-{high:.3f})"
        )
    return ""


def collect_run(run_dir: Path, binding_for: Callable[[OperatorCard], CallBinding | str] = from_card) -> Collected:
    """The one kernel of a run, or its audit line saying why there is none."""
    collected = Collected()
    try:
        store = RunStore.open(run_dir, readonly=True)
    except StoreError as exc:
        raise ExportError(str(exc)) from None
    with store:
        info = store.run_info()
        card, card_json, sets_note = run_card(run_dir, store)
        binding = binding_for(card.spec)
        node, why = chosen_node(store)
        evaluation = store.evaluation(node.id) if node is not None else None
    variant = card.spec.name
    if isinstance(binding, str):
        collected.audit.append(
            AuditEntry(variant=variant, decision="fallback", reason=binding, card=card.spec.name, run=info.run_id)
        )
        return collected
    common = {
        "variant": variant,
        "overload": binding.overload,
        "call": binding.call,
        "card": card.spec.name,
        "run": info.run_id,
    }
    if node is None:
        collected.audit.append(AuditEntry(**common, decision="fallback", reason=why))
        return collected
    refused = refusal(node, evaluation)
    if info.backend != "gpu":
        refused = f"the run was not measured on a GPU (backend {info.backend!r}: invented timings), so proves nothing"
    if refused:
        collected.audit.append(AuditEntry(**common, decision="fallback", reason=refused, node=node.id))
        return collected
    collected.found.append(
        Found(
            variant=variant,
            binding=binding,
            card=card,
            card_json=card_json,
            sets_note=sets_note,
            run_dir=run_dir,
            run_id=info.run_id,
            gpu_name=info.gpu_name,
            node=node,
            evaluation=evaluation,
        )
    )
    if sets_note:
        collected.notes.append(f"{variant}: {sets_note}")
    return collected


# -- building ----------------------------------------------------------------------------------------------------


def capability_of(arch: str) -> tuple[int, int]:
    found = re.fullmatch(r"sm_(\d+)(\d)[a-z]?", arch)
    if found is None:
        raise BadInput(f"--arch {arch!r} is not a CUDA architecture like sm_90")
    return int(found.group(1)), int(found.group(2))


def build_ptx(source: str, arch: str, flags: Sequence[str], timeout_s: float = 120.0) -> bytes:
    """PTX for the architecture's virtual target (compute_90 for sm_90), compiled in the same sandbox as cubins
    (after the builder checked the same source)."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise CheckFailed("nvcc not found: export builds every kernel again (cubin and PTX); install the CUDA toolkit")
    virtual = "compute_" + arch.removeprefix("sm_")
    with tempfile.TemporaryDirectory(prefix="kernelforge-ptx-") as tmp:
        work, scratch = Path(tmp, "work"), Path(tmp, "root")
        work.mkdir()
        scratch.mkdir()
        (work / "candidate.cu").write_text(source)
        command = [nvcc, "-ptx", f"-arch={virtual}", "--std=c++17", *flags, "-o", "kernel.ptx", "candidate.cu"]
        argv = sandbox_command(command, work, scratch, read_only_paths(nvcc), sandbox_status())
        done = subprocess.run(
            argv, cwd=work, env=sandbox_env(nvcc, work), capture_output=True, text=True, timeout=timeout_s, check=False
        )
        ptx = work / "kernel.ptx"
        if done.returncode != 0 or not ptx.is_file():
            raise CheckFailed(f"nvcc -ptx failed ({done.returncode}): {(done.stdout + done.stderr).strip()[-400:]}")
        return ptx.read_bytes()


def build_cubin(builder: Builder, found: Found) -> bytes:
    launch = resolve(found.node.plan, found.card.spec)
    result = asyncio.run(builder.build(found.node.source, launch.entry, launch.args))
    if not result.ok or result.cubin_path is None:
        raise CheckFailed(f"the build failed ({result.failure}): {result.log.strip()[-400:]}")
    return result.cubin_path.read_bytes()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60]


def stored_sets(found: Found) -> list[tuple[str, Path]]:
    """(name, file) of the card's stored input sets, where they can be carried (the card directory unchanged)."""
    if found.sets_note:
        return []
    return [
        (s.name, found.card.file(s.file, f"input_sets.{s.name}.file"))
        for s in found.card.spec.input_sets
        if s.file is not None
    ]


def sets_left_behind(found: Found) -> str:
    """Why the stored sets stay out of the package (too large), or ''."""
    stored = stored_sets(found)
    size = sum(p.stat().st_size for _, p in stored)
    if not stored or size <= MAX_SET_BYTES:
        return ""
    return (
        f"its {len(stored)} stored set(s) take {size / 2**20:.0f} MiB, more than the {MAX_SET_BYTES >> 20} MiB a "
        "package carries: checked on fresh draws and stress sets only"
    )


def make_entry(
    found: Found, index: int, cubin: bytes, ptx: bytes, arch: str, nvcc: str
) -> tuple[KernelEntry, dict[str, bytes]]:
    """The manifest entry and the files of one kernel (proven in the search, not checked on a GPU yet)."""
    spec = found.card.spec
    kernel_id = f"k{index}-{_slug(found.variant)}"
    resolved = resolve(found.node.plan, spec)
    launch = Launch(
        entry=resolved.entry,
        grid=resolved.grid,
        block=resolved.block,
        shared_bytes=resolved.shared_bytes,
        args=[launch_arg(a) for a in resolved.args],
    )
    base = f"kernels/{kernel_id}"
    files: dict[str, bytes] = {
        f"{base}/kernel.cubin": cubin,
        f"{base}/kernel.ptx": ptx,
        f"{base}/kernel.cu": found.node.source.encode(),
        f"{base}/card.json": found.card_json.encode(),
    }
    sets: list[str] = []
    stored = stored_sets(found)
    if stored and sum(p.stat().st_size for _, p in stored) <= MAX_SET_BYTES:
        for which, path in stored:
            name = f"{base}/sets/{which}.npz"
            files[name] = path.read_bytes()
            sets.append(name)
    result = found.evaluation.result if found.evaluation is not None else None
    latency = Latency()
    if result is not None and result.candidate is not None and result.baseline is not None:
        latency = Latency(
            search_us=result.candidate.median_us,
            baseline_us=result.baseline.median_us,
            speedup_vs_baseline=result.baseline.median_us / result.candidate.median_us,
            interval_vs_baseline=speedup_interval(result.candidate, result.baseline),
        )
    guard = Guard(
        overload=found.binding.overload,
        args=found.binding.args,
        inputs=found.binding.inputs,
        outputs=found.binding.outputs,
        capability=capability_of(arch),
    )
    entry = KernelEntry(
        id=kernel_id,
        variant=found.variant,
        guard=guard,
        launch=launch,
        tolerances={
            t.name: Tolerance(rtol=t.effective_tolerance().rtol, atol=t.effective_tolerance().atol)
            for t in spec.outputs
        },
        cubin_arch=arch,
        files=KernelFiles(
            cubin=f"{base}/kernel.cubin",
            ptx=f"{base}/kernel.ptx",
            source=f"{base}/kernel.cu",
            card=f"{base}/card.json",
            sets=sets,
            sha256={name: sha256(data) for name, data in files.items()},
        ),
        latency=latency,
        chain=found.binding.chain,
        per_forward=found.per_forward,
        provenance=Provenance(
            run_id=found.run_id,
            run_dir=str(found.run_dir),
            node_id=found.node.id,
            card_name=spec.name,
            card_sha256=sha256(found.card_json.encode()),
            source_sha256=sha256(found.node.source.encode()),
            search_gpu=found.gpu_name,
            proposer=found.node.proposer,
            mutation=found.node.mutation,
            nvcc_version=nvcc,
            kernelforge_version=kernelforge_tui.__version__,
            exported_at=time.time(),
        ),
    )
    return entry, files


def admits(kernel: CallBinding, other: CallBinding) -> bool:
    """Whether every call `other` binds passes `kernel`'s guard too: the same overload (a chain: the same calls),
    tensors (shape, dtype, strides, card view) and arguments, each scalar value `other` accepts among the kernel's
    (of the same type), its alignment a multiple of the kernel's. Export counts with it the captured variants a
    kernel covers (another storage offset, a larger alignment)."""
    if (kernel.overload, kernel.chain) != (other.overload, other.chain) or len(kernel.args) != len(other.args):
        return False
    for mine, theirs in zip(kernel.args, other.args, strict=True):
        if mine.model_dump(exclude={"accepts"}) != theirs.model_dump(exclude={"accepts"}):
            return False
        if not all(any(type(v) is type(a) and v == a for a in mine.accepts) for v in theirs.accepts):
            return False
    if (len(kernel.inputs), len(kernel.outputs)) != (len(other.inputs), len(other.outputs)):
        return False
    pairs = zip([*kernel.inputs, *kernel.outputs], [*other.inputs, *other.outputs], strict=True)
    return all(
        mine.model_dump(exclude={"alignment"}) == theirs.model_dump(exclude={"alignment"})
        and theirs.alignment % mine.alignment == 0
        for mine, theirs in pairs
    )


def compile_only(binding: CallBinding) -> str:
    """What the audit says of a fused chain's kernel ('' for a single call's): where it runs, and where not."""
    chain = binding.chain
    if chain is None:
        return ""
    replace = 'torch.compile(backend="kernelforge") and cast.compile replace'
    if chain.partial:
        return (
            f"; compile only: {chain.describe()} also returns results the card does not compute, which an eager "
            f"override would have to return; {replace} the call where nothing reads them"
        )
    calls = f"a fused chain of {len(chain.steps)} calls ({chain.describe()})"
    return f"; compile only: {calls}, which {replace}; eager runs the calls one by one"


# -- the command -------------------------------------------------------------------------------------------------


def collect(target: Path, runs: Sequence[Path] = ()) -> tuple[Collected, PackageSource]:
    """A run directory, or a capture directory (its variants' runs found under `runs`)."""
    if (target / "run.sqlite").is_file():
        return collect_run(target), PackageSource(kind="run", path=str(target))
    if (target / "capture.json").is_file():
        from kernelforge_tui.cast.capture import collect_capture

        return collect_capture(target, runs), PackageSource(kind="capture", path=str(target))
    raise ExportError(
        f"{target} is neither a run (no run.sqlite) nor a capture directory (no capture.json): give a run directory "
        "or id (`kernelforge runs` lists them) or a directory `kernelforge capture` wrote"
    )


def export(
    target: Path,
    out: Path,
    *,
    runs: Sequence[Path] = (),
    arch: str | None = None,
    sanitize: bool = True,
    progress: Progress = lambda _: None,
) -> CastManifest:
    """Write the package to `out` and return its manifest. With `sanitize`, every kernel is checked on this machine's
    GPU (`cast.verify`) before the package is stamped; without, the package is written not checked on a GPU yet. It
    is made under a temporary name and moved to `out` only when it holds a kernel: a package of none is never left
    behind."""
    if sanitize:
        from kernelforge_tui.cast.verify import EXPORT_NO_GPU_HELP, require_gpu_tools

        require_gpu_tools(EXPORT_NO_GPU_HELP)
    collected, source = collect(target, runs)
    target_arch = arch or detect_arch() or DEFAULT_ARCH
    if sanitize and arch is not None and arch != detect_arch():
        raise BadInput(f"--arch {arch} is not this GPU's ({detect_arch()}): the checks run here; drop --arch")
    builder = Builder(arch=target_arch)
    nvcc = find_nvcc()
    version = nvcc_version(nvcc) if nvcc else ""
    kernels: list[KernelEntry] = []
    files: dict[str, bytes] = {}
    audit = list(collected.audit)
    for index, found in enumerate(collected.found):
        progress(f"building {found.variant} (run {found.run_id}, node {found.node.id}) for {target_arch}")
        try:
            cubin = build_cubin(builder, found)
            ptx = build_ptx(found.node.source, target_arch, builder.flags)
            entry, entry_files = make_entry(found, index, cubin, ptx, target_arch, version)
        except (CheckFailed, ExprError, CardError, ValidationError, OSError, subprocess.TimeoutExpired) as exc:
            audit.append(
                AuditEntry(
                    variant=found.variant,
                    overload=found.binding.overload,
                    call=found.binding.call,
                    decision="fallback",
                    reason=f"could not be built for {target_arch}: {exc}",
                    card=found.card.spec.name,
                    run=found.run_id,
                    node=found.node.id,
                )
            )
            continue
        kernels.append(entry)
        files.update(entry_files)
        left = sets_left_behind(found)
        if left:
            collected.notes.append(f"{found.variant}: {left}")
        audit.append(
            AuditEntry(
                variant=found.variant,
                overload=found.binding.overload,
                call=found.binding.call,
                decision="kernel",
                reason="proven in the search; "
                + ("checks below" if sanitize else f"{NOT_CHECKED} (--no-sanitize)")
                + compile_only(found.binding),
                card=found.card.spec.name,
                kernel=entry.id,
                run=found.run_id,
                node=found.node.id,
            )
        )
    if collected.order:  # the capture's order (its ranking), kernels in their places
        place = {variant: i for i, variant in enumerate(collected.order)}
        audit.sort(key=lambda a: place.get(a.variant, len(place)))
    notes = list(collected.notes)
    if not sanitize:
        notes.append(
            "exported with --no-sanitize: not run under compute-sanitizer nor compared with eager PyTorch; the loader "
            "refuses it until `kernelforge verify` passes on a GPU"
        )
    manifest = CastManifest(
        created_at=time.time(),
        kernelforge_version=kernelforge_tui.__version__,
        source=source,
        kernels=kernels,
        audit=audit,
        notes=notes,
    )
    with replacing(out, tag="export") as staged:
        write_package(staged, manifest, files)
        if sanitize and kernels:
            from kernelforge_tui.cast.verify import verify

            manifest = verify(staged, by="export", progress=progress)
        if not manifest.kernels:  # no kernel proven: `out` stays as it was
            staged.unlink()
    return manifest
