"""Issue 14's benchmark: our searched kernels against eager PyTorch and torch.compile on eight workloads, and the
suite's spmv_csr and tiled matmul against cuSPARSE and cuBLAS, on the GPUs of one machine, in one table.

    python bench/vs_torch.py --out DIR [--workloads NAME ...] [--minutes 10] [--gpus N] [--reps 100] [--no-compile]
                             [--iters N]
    python bench/vs_torch.py --report DIR      # the table again from DIR/vs_torch.json (no GPU, no torch)

Per workload, on one GPU (up to --gpus N workloads at once, one per GPU, in the table's order):
1. Its card. A torch workload is captured by the product's own path (`capture.run.capture_model`, what `kernelforge
   capture` runs) from its model in bench/vs_torch_models.py at the goal's shape, on that GPU, into
   DIR/captures/<workload>; the capture must give exactly the one card the goal names (`the_card`), else the workload
   records why and is not searched. The stencil (no torch op to capture), spmv and matmul are suite cards at the
   goal's size (`write_suite_card`: the goals lie beyond the suite's scales) under DIR/cards.
2. Torch's times, on that GPU: eager, torch.compile (default) and torch.compile(mode="max-autotune") of the same model
   on the same inputs, timed by the suite's `vendor_timing.time_calls` (the worker's way: CUDA events, the L2 flushed
   before each call, the median of --reps calls) in a subprocess of this script pinned to the GPU
   (CUDA_VISIBLE_DEVICES, as the evaluation worker is): a compiler that fails or dies is a cell of the table, not
   the end of the bench, and the subprocess's GPU memory is given back before the search. spmv and matmul are timed
   against their task's vendor (cuSPARSE through torch.sparse, cuBLAS through torch.mm) by the bench's `VendorTimer`,
   checked against the card's reference first. The capture runs in the same subprocess, before the timing.
3. The search, as `kernelforge optimize CARD --budget-minutes M` runs it (`engine.setup.prepare_run`, the template
   proposer), pinned to the GPU (`RunOptions.gpus`), its run store in DIR/runs/<workload>: `kernelforge open
   DIR/runs/<workload>` shows it. Ours is the run's promoted best (the baseline itself when nothing beat it).

Shares are of the copy ceiling the GPU worker measured on the card's GPU (bytes read and written once, at the copy
bandwidth, over the time). The goals and the issue's eager and torch.compile shares are data (`WORKLOADS`). The
table goes to stdout, DIR/vs_torch.md, and every number to DIR/vs_torch.json, rewritten after every step. Rerun the
same command on the same DIR to continue: a finished run, a capture and torch's times already measured are reused,
a run cut short is resumed from its store. The manifest's file, the directory's one-writer lock, the GPU lanes and
each card's search or resume are `kernelforge bench`'s own (`engine.bench`), so the two benches resume alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernelforge_tui.capture import load_capture
from kernelforge_tui.capture.run import CaptureRequest
from kernelforge_tui.cards import load_card
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cast.beside import BesideReply, BesideRequest
from kernelforge_tui.config import Settings, load_settings
from kernelforge_tui.engine.backend import EvaluationBackend, make_builder
from kernelforge_tui.engine.bench import (
    CARDS,
    RUNS,
    VendorResult,
    bench_lock,
    gpu_ceilings,
    read_manifest,
    recorded,
    search_card,
    vendor_result,
    write_manifest,
)
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.setup import RunOptions, run_lanes
from kernelforge_tui.engine.vendor_timer import VendorTimer
from kernelforge_tui.errors import KernelForgeError, NoGpu
from kernelforge_tui.gpu.detect import GpuInfo, require_gpu
from kernelforge_tui.gpu.evaluate import build_candidate, cached_ceilings
from kernelforge_tui.gpu.statistics import robust_stats
from kernelforge_tui.store import RunStore, UnreadableRecord
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task as suite_task
from kernelforge_tui.suite.task import Precision, Task
from kernelforge_tui.suite.vendor_timing import VendorReply, VendorRequest, task_of
from kernelforge_tui.vocabulary.evaluation import Ceilings, Evaluation
from kernelforge_tui.vocabulary.events import BestImproved
from kernelforge_tui.vocabulary.nodes import ParamValue

SCRIPT = Path(__file__).resolve()
MODELS = SCRIPT.with_name("vs_torch_models.py")
MANIFEST = "vs_torch.json"
TABLE = "vs_torch.md"
CAPTURES = "captures"
TORCH = "torch"
"""DIR/torch/<workload>.request.json, .reply.json and .log: what each torch subprocess was asked, answered, printed."""
DEFAULT_MINUTES = 10.0
DEFAULT_REPS = 100
TORCH_TIMEOUT_S = 3600.0
"""A torch subprocess (capture, eager, two compiles) that has not answered in this long is killed: max-autotune's
compile alone takes minutes, an hour is a hang."""
PROPOSER = "templates"

Mode = Literal["eager", "compile", "max-autotune"]
MODES: tuple[Mode, ...] = ("eager", "compile", "max-autotune")
COMPILE_MODE: dict[Mode, str | None] = {"compile": None, "max-autotune": "max-autotune"}
"""torch.compile's `mode` per compiled mode (None: its default; eager is the model itself)."""
MODE_WORDS: dict[Mode, str] = {
    "eager": "eager",
    "compile": "torch.compile",
    "max-autotune": 'torch.compile(mode="max-autotune")',
}


# ---- the workloads ------------------------------------------------------------------------------------------------


class Goal(BaseModel):
    """What the issue asks of ours on a workload. `ceiling`: ours reaches `at_least` of the copy ceiling. `vendor`:
    the vendor's time over ours is at least `at_least` (strictly more when `strict`: "faster than")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["ceiling", "vendor"]
    at_least: float
    strict: bool = False
    words: str


class Workload(BaseModel):
    """One row of the issue's table: the card it becomes, how torch runs it, what ours must reach."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    what: str
    dtype: Precision
    family: str
    op: str
    """The card's name before its dtype (`silu_mul_bf16_...`), or the suite task's name."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    entry: str | None = None
    """The model's entry function in bench/vs_torch_models.py: captured (unless `task`) and timed eager/compiled."""
    shape: tuple[int, ...] = ()
    """The model's input shape (every input of silu_mul)."""
    task: str | None = None
    """A suite task whose card this is, at `scale` (elements of its main tensor)."""
    scale: int | None = None
    vendor: bool = False
    """Torch's side is the suite task's vendor library (cuSPARSE, cuBLAS), not the model's eager and compiled runs."""
    eager_share: float | None = None
    compile_share: float | None = None
    """The shares of the copy ceiling the issue measured for eager PyTorch and torch.compile."""
    goal: Goal

    @property
    def captured(self) -> bool:
        return self.task is None


def _share_goal(share: float) -> Goal:
    return Goal(kind="ceiling", at_least=share, words=f">= {share:.0%} of the copy ceiling")


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="softmax",
        what="softmax over rows [4096 x 32768]",
        dtype="bfloat16",
        family="softmax",
        op="softmax",
        inputs=("x",),
        outputs=("y",),
        entry="softmax",
        shape=(4096, 32768),
        eager_share=0.52,
        compile_share=0.45,
        goal=_share_goal(0.90),
    ),
    Workload(
        name="layer_norm",
        what="layer_norm [16384 x 4096], weight and bias",
        dtype="bfloat16",
        family="layer_norm",
        op="layer_norm",
        inputs=("x", "w", "b"),
        outputs=("y",),
        entry="layer_norm",
        shape=(16384, 4096),
        eager_share=0.59,
        compile_share=0.66,
        goal=_share_goal(0.85),
    ),
    Workload(
        name="rms_norm",
        what="rms_norm [16384 x 4096], weight, eps 1e-6",
        dtype="bfloat16",
        family="rms_norm",
        op="rms_norm",
        inputs=("x", "w"),
        outputs=("y",),
        entry="rms_norm",
        shape=(16384, 4096),
        eager_share=0.76,
        compile_share=0.83,
        goal=_share_goal(0.90),
    ),
    Workload(
        name="group_norm",
        what="group_norm [8 x 512 x 128 x 128], 32 groups, weight and bias",
        dtype="bfloat16",
        family="group_norm",
        op="group_norm",
        inputs=("x", "gamma", "beta"),
        outputs=("y", "mean", "rstd"),
        entry="group_norm",
        shape=(8, 512, 128, 128),
        eager_share=0.16,
        compile_share=0.38,
        goal=_share_goal(0.75),
    ),
    Workload(
        name="gelu",
        what="gelu (exact, erf) over 2^28 elements",
        dtype="bfloat16",
        family="elementwise",
        op="gelu",
        inputs=("x",),
        outputs=("y",),
        entry="gelu",
        shape=(2**28,),
        eager_share=0.74,
        compile_share=0.66,
        goal=_share_goal(0.88),
    ),
    Workload(
        name="avg_pool",
        what="adaptive_avg_pool2d [256 x 2048 x 7 x 7] to 1x1",
        dtype="bfloat16",
        family="pooling",
        op="avg_pool",
        inputs=("x",),
        outputs=("y",),
        entry="avg_pool",
        shape=(256, 2048, 7, 7),
        eager_share=0.10,
        compile_share=0.24,
        goal=_share_goal(0.60),
    ),
    Workload(
        name="silu_mul",
        what="silu(gate) * up, fused, gate and up [16384 x 11008]",
        dtype="bfloat16",
        family="elementwise",
        op="silu_mul",
        inputs=("gate", "up"),
        outputs=("y",),
        entry="silu_mul",
        shape=(16384, 11008),
        eager_share=0.27,
        compile_share=1.01,
        goal=_share_goal(0.95),
    ),
    Workload(
        name="stencil",
        what="5-point 2D stencil (Jacobi step), fp32 [8192 x 8192]: the suite's stencil_2d; torch: slices of u",
        dtype="float32",
        family="stencil",
        op="stencil_2d",
        inputs=("u",),
        outputs=("v",),
        entry="stencil",
        shape=(8192, 8192),
        task="stencil_2d",
        scale=2**26,
        eager_share=0.12,
        compile_share=0.77,
        goal=_share_goal(0.85),
    ),
    Workload(
        name="spmv_csr",
        what="the suite's spmv_csr, fp32, 2^22 rows (nnz 2^26), against cuSPARSE",
        dtype="float32",
        family="sparse",
        op="spmv_csr",
        inputs=("values", "col_idx", "row_ptr", "x"),
        outputs=("y",),
        task="spmv_csr",
        scale=2**26,
        vendor=True,
        goal=Goal(kind="vendor", at_least=1.0, strict=True, words="faster than cuSPARSE"),
    ),
    Workload(
        name="matmul",
        what="the suite's tiled matmul, bf16, 4096^3 (square_matrix_mul), against cuBLAS",
        dtype="bfloat16",
        family="matmul",
        op="square_matrix_mul",
        inputs=("A", "B"),
        outputs=("C",),
        task="square_matrix_mul",
        scale=2**24,
        vendor=True,
        goal=Goal(kind="vendor", at_least=0.5, words=">= 50% of cuBLAS (cuBLAS time / ours)"),
    ),
)
BY_NAME = {w.name: w for w in WORKLOADS}


def select(names: Sequence[str]) -> list[Workload]:
    """The named workloads in the table's order (every one when none is named); KernelForgeError for an unknown
    name, listing the known ones."""
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise KernelForgeError(f"no workload {unknown[0]!r}: choose among {', '.join(BY_NAME)}")
    return [w for w in WORKLOADS if not names or w.name in names]


# ---- cards ----------------------------------------------------------------------------------------------------------


class CardProblem(KernelForgeError):
    """A capture that did not give the one card its workload names."""


def capture_request(entry: str, shape: Sequence[int], out: Path, device: str) -> CaptureRequest:
    """How a workload's model is captured: as `kernelforge capture bench/vs_torch_models.py --entry ENTRY --kwarg
    shape=[...] --device DEVICE -o OUT --force` (the CPU tests capture small shapes)."""
    return CaptureRequest(
        model_file=MODELS, out=out, entry=entry, kwargs={"shape": list(shape)}, device=device, force=True
    )


def the_card(workload: Workload, capture_dir: Path, shape: Sequence[int]) -> Card:
    """The capture's one card, checked to be the card the workload names (family, op, dtype, tensors, its first
    input of the captured `shape`'s elements, served by the templates); CardProblem saying what differs. A fused
    chain's calls are carded one by one beside the chain (eager replaces single calls): a chain is the card, and
    the checks below say whether it is the workload's."""
    manifest = load_capture(capture_dir)
    carded = manifest.carded()
    carded = [v for v in carded if v.kind == "pattern"] or carded
    if len(carded) != 1:
        made = ", ".join(f"{v.card} ({v.family})" for v in carded) or "none"
        raise CardProblem(f"{workload.name}: the capture made {len(carded)} cards ({made}), not one {workload.op}")
    variant = carded[0]
    card = load_card(capture_dir / str(variant.card))
    spec = card.spec
    found: dict[str, object] = {
        "family": spec.family,
        "op": spec.name.rsplit("_", 2)[0],  # `<op>_<dtype>_<shape>`
        "dtype": spec.inputs[0].dtype,
        "elements": spec.inputs[0].numel(spec.sizes),
        "inputs": tuple(t.name for t in spec.inputs),
        "outputs": tuple(t.name for t in spec.outputs),
    }
    wanted: dict[str, object] = {
        "family": workload.family,
        "op": workload.op,
        "dtype": workload.dtype,
        "elements": math.prod(shape),
        "inputs": workload.inputs,
        "outputs": workload.outputs,
    }
    differ = [f"{key} {found[key]} (wanted {wanted[key]})" for key in wanted if found[key] != wanted[key]]
    if differ:
        raise CardProblem(f"{workload.name}: the captured card {spec.name} has " + ", ".join(differ))
    if not variant.template:
        raise CardProblem(f"{workload.name}: the templates cannot serve {spec.name}: {variant.template_note}")
    return card


def write_suite_card(task: Task, precision: Precision, scale: int, parent: Path) -> Card:
    """The task's card at `scale` in `parent/<task>_<precision>_s<log2 scale>`, also beyond the task's scales (the
    goals lie at 2^24, 4096^3, and 2^26, 8192^2 and 2^22 rows; the suite's tasks stop at 2^22). Nothing is drawn
    here: the card's sets are seeded and drawn where they are used."""
    return suite_cards.write(task, precision, scale, parent, beyond=True)


def _log2(value: int) -> int:
    return value.bit_length() - 1


# ---- torch's side: the subprocess -----------------------------------------------------------------------------------


class TorchRequest(BaseModel):
    """What one torch subprocess does: capture the workload's model (when `capture`), then time it in `modes`."""

    model_config = ConfigDict(extra="forbid")

    workload: str
    entry: str
    shape: list[int]
    capture: bool
    card_dir: Path
    """The capture directory to write (`capture`), else the card the times belong to (time_calls's request names
    it; nothing is read from it)."""
    modes: list[Mode]
    reps: int = Field(default=DEFAULT_REPS, ge=1)
    flush_bytes: int
    device: str = "cuda"
    """"cuda": the subprocess sees the lane's GPU only."""


class TorchReply(BaseModel):
    torch_version: str = ""
    device_name: str = ""
    capture_error: str = ""
    died: str = ""
    """Why the subprocess gave no reply of its own (it crashed or hung): nothing it did came back."""
    samples_us: dict[Mode, list[float]] = Field(default_factory=dict)
    first_call_s: dict[Mode, float] = Field(default_factory=dict)
    """The first call's wall time (torch.compile's compilation, for the compiled modes)."""
    errors: dict[Mode, str] = Field(default_factory=dict)


Timer = Callable[[Any, Callable[[], object], VendorRequest], list[float]]
"""`vendor_timing.time_calls`'s signature: (torch, call, request) -> every call's time in us."""


def measure_torch(request: TorchRequest, timer: Timer | None = None) -> TorchReply:
    """Capture (when asked) and time the workload's model in each mode, in this process; an error in one mode is
    that mode's error. `timer` replaces `time_calls` (the CPU tests: it needs CUDA)."""
    import torch

    from kernelforge_tui.capture.loader import Entry, build
    from kernelforge_tui.capture.run import capture_model
    from kernelforge_tui.cli.capture import template_problem
    from kernelforge_tui.suite.vendor_timing import time_calls

    cuda = request.device.startswith("cuda")
    reply = TorchReply(
        torch_version=str(torch.__version__), device_name=torch.cuda.get_device_name() if cuda else request.device
    )
    if request.capture:
        try:
            capture_model(
                capture_request(request.entry, request.shape, request.card_dir, request.device),
                template_check=template_problem,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
        except Exception as exc:  # the capture's own failure: said in the reply; the timing still runs
            reply.capture_error = f"{type(exc).__name__}: {exc}"
    built = build(MODELS, Entry(request.entry), {"device": request.device, "shape": request.shape})
    timing = VendorRequest(
        card_dir=request.card_dir, reps=request.reps, device=request.device, flush_bytes=request.flush_bytes
    )
    with torch.no_grad():
        for mode in request.modes:
            try:
                if mode == "eager":
                    model = built.model
                else:
                    torch.compiler.reset()  # each mode compiles afresh, not from the previous mode's cache
                    model = torch.compile(built.model, mode=COMPILE_MODE[mode])
                began = time.perf_counter()
                model(*built.args, **built.kwargs)
                if cuda:
                    torch.cuda.synchronize()
                reply.first_call_s[mode] = time.perf_counter() - began
                call = _caller(model, built.args, built.kwargs)
                reply.samples_us[mode] = (timer or time_calls)(torch, call, timing)
            except Exception as exc:  # a compiler that fails is the cell's content, not the end of the bench
                reply.errors[mode] = f"{type(exc).__name__}: {exc}"
    return reply


def _caller(model: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object]) -> Callable[[], object]:
    return lambda: model(*args, **kwargs)


def torch_worker(request_file: Path) -> int:
    """`--torch-worker REQUEST`: answer one request into the reply file beside it."""
    request = TorchRequest.model_validate_json(request_file.read_text())
    reply = measure_torch(request)
    _reply_file(request_file).write_text(reply.model_dump_json(indent=1) + "\n")
    return 0


def _reply_file(request_file: Path) -> Path:
    return request_file.with_name(request_file.name.replace(".request.", ".reply."))


async def torch_subprocess(request: TorchRequest, gpu: int | None, folder: Path) -> TorchReply:
    """The request answered by `python bench/vs_torch.py --torch-worker` pinned to `gpu`; a crash or a hang is the
    reply's `died`, with the last lines of its log (DIR/torch/<workload>.log)."""
    folder.mkdir(parents=True, exist_ok=True)
    request_file = folder / f"{request.workload}.request.json"
    request_file.write_text(request.model_dump_json(indent=1) + "\n")
    reply_file = _reply_file(request_file)
    reply_file.unlink(missing_ok=True)
    log = folder / f"{request.workload}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    with log.open("w") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "--torch-worker",
            str(request_file),
            stdout=sink,
            stderr=sink,
            env=env,
            start_new_session=True,
        )
        hung = False
        try:
            await asyncio.wait_for(process.wait(), TORCH_TIMEOUT_S)
        except BaseException as exc:  # a hang (killed here) or the bench's own end (killed, and passed on)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
            await process.wait()
            if not isinstance(exc, TimeoutError):
                raise
            hung = True
    if reply_file.exists():
        return TorchReply.model_validate_json(reply_file.read_text())
    ended = f"was killed after {TORCH_TIMEOUT_S:g} s" if hung else f"exited {process.returncode}"
    tail = " | ".join(line for line in log.read_text(errors="replace").splitlines()[-4:] if line.strip())
    return TorchReply(died=f"the torch subprocess {ended} without a reply: {tail}")


# ---- the manifest ---------------------------------------------------------------------------------------------------


class Timed(BaseModel):
    """One of torch's times: the median of its calls (the worker's statistics), or why there is none."""

    what: str
    median_us: float | None = None
    cv: float | None = None
    reps: int = 0
    first_call_s: float | None = None
    error: str = ""
    note: str = ""


class Ours(BaseModel):
    """The search's run as its store records it."""

    run_dir: Path
    state: str
    reason: str = ""
    candidates: int = 0
    best_node: int | None = None
    best_us: float | None = None
    baseline_us: float | None = None
    speedup: float | None = None
    """Over the card's baseline."""
    profile: str = ""
    """What Nsight Compute said of the best kernel (`HardwareReport.summary`): what is in the way of the goal."""
    params: dict[str, ParamValue] = Field(default_factory=dict)
    """The best kernel's template parameters (its strategy, tiles, widths): which kernel won, kept with the numbers
    even where the run's store is not."""


class Beside(BaseModel):
    """Ours and the vendor timed in one process on the same tensors, interleaved (`cast.beside`), after the
    search: the ratio without where each one's buffers lie."""

    node: int
    """The run's best node, the kernel timed."""
    vendor: Timed
    ours: Timed

    @property
    def measured(self) -> bool:
        return self.vendor.median_us is not None and self.ours.median_us is not None


class WorkloadResult(BaseModel):
    workload: str
    card: str | None = None
    card_dir: Path | None = None
    bytes: int | None = None
    flops: int | None = None
    gpu: int | None = None
    """The GPU (nvidia-smi's index) of the latest session's work on the workload."""
    gpu_name: str = ""
    ceilings: Ceilings | None = None
    """The copy and FMA ceilings the GPU worker measured on the card's GPU."""
    torch_version: str = ""
    torch: dict[str, Timed] = Field(default_factory=dict)
    """By mode (eager, compile, max-autotune), or `vendor`."""
    ours: Ours | None = None
    beside: Beside | None = None
    """spmv and matmul: the best kernel and the vendor side by side (the goal's verdict reads this when measured)."""
    error: str = ""
    """Why the workload has no card or no search."""
    wall_seconds: float = 0.0


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workloads: list[str] = Field(default_factory=list)
    minutes: float = Field(default=DEFAULT_MINUTES, ge=0)
    iterations: int | None = Field(default=None, ge=0)
    gpus: int | None = Field(default=None, ge=1)
    reps: int = Field(default=DEFAULT_REPS, ge=1)
    compile: bool = True

    @property
    def modes(self) -> list[Mode]:
        return list(MODES) if self.compile else ["eager"]


class Numbers(BaseModel):
    """One row of the table as numbers (derived from a WorkloadResult: `numbers`)."""

    workload: str
    card: str | None
    bytes: int | None
    copy_gbps: float | None
    copy_us: float | None
    """The card's bytes at the copy ceiling: the time a share is of (None for matmul: compute-bound)."""
    times_us: dict[str, float]
    """Medians by mode (eager, compile, max-autotune), or `vendor`, and `ours`."""
    shares: dict[str, float]
    """The same keys' shares of the copy ceiling."""
    ours_us: float | None
    ours_over_eager: float | None
    """Ours over eager's time (spmv, matmul: over the vendor's); below 1: ours is faster."""
    best_torch: str | None
    ours_over_best_torch: float | None
    goal: str
    goal_met: bool | None
    goal_words: str


class Manifest(BaseModel):
    """DIR/vs_torch.json: the options of the latest session and every workload's numbers."""

    format_version: Literal[1] = 1
    options: Options
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    gpus: list[str] = Field(default_factory=list)
    """The GPUs the latest session ran on (index: name)."""
    results: list[WorkloadResult] = Field(default_factory=list)
    table: list[Numbers] = Field(default_factory=list)
    """The table's numbers, derived from `results` at every save (for readers of the JSON; --report recomputes)."""

    def result(self, name: str) -> WorkloadResult:
        for result in self.results:
            if result.workload == name:
                return result
        result = WorkloadResult(workload=name)
        self.results.append(result)
        return result


def load_manifest(out: Path) -> Manifest:
    """The bench recorded in `out`; BadInput when there is none or it does not read."""
    return read_manifest(out / MANIFEST, Manifest, f"python bench/vs_torch.py --out {out}")


def save_manifest(manifest: Manifest, out: Path) -> None:
    """The table's numbers derived again, then the manifest written as the product's bench writes its own."""
    manifest.table = [numbers(BY_NAME[r.workload], r) for r in manifest.results]
    write_manifest(out / MANIFEST, manifest)


def timed(what: str, reply: TorchReply, mode: Mode) -> Timed:
    """A mode's cell from the subprocess's reply: its samples summarised, or its error."""
    if mode in reply.errors or mode not in reply.samples_us:
        return Timed(what=what, error=reply.errors.get(mode) or reply.died or "not measured")
    stats = robust_stats(reply.samples_us[mode])
    return Timed(
        what=what, median_us=stats.median_us, cv=stats.cv, reps=stats.reps, first_call_s=reply.first_call_s.get(mode)
    )


def vendor_timed(result: VendorResult) -> Timed:
    """The vendor's cell; a vendor that disagrees with the card's reference is timed but says so."""
    disagrees = result.agrees is False
    return Timed(
        what=result.library,
        median_us=result.median_us,
        cv=result.cv,
        reps=result.reps,
        error="" if result.median_us is not None else result.note or "not measured",
        note=f"disagrees with the card's reference: {result.note}" if disagrees else result.note,
    )


# ---- the run --------------------------------------------------------------------------------------------------------


TorchMeasure = Callable[[TorchRequest, int | None], Awaitable[TorchReply]]
VendorMeasure = Callable[[Path, int | None, int, int], Awaitable[VendorResult]]
BesideMeasure = Callable[[BesideRequest, int | None], Awaitable[BesideReply]]
BESIDE_COMMAND = [sys.executable, "-m", "kernelforge_tui.cast.beside"]


async def vendor_subprocess(card_dir: Path, gpu: int | None, reps: int, flush_bytes: int) -> VendorResult:
    """The task's vendor on the card, checked and timed by the bench's vendor timing process pinned to `gpu`."""
    timer = VendorTimer(gpu)
    try:
        reply = await timer.time(VendorRequest(card_dir=card_dir, reps=reps, flush_bytes=flush_bytes))
    finally:
        await timer.close()
    vendor = task_of(load_card(card_dir)).vendor
    return vendor_result(vendor.library if vendor is not None else "", reply)


async def beside_subprocess(request: BesideRequest, gpu: int | None) -> BesideReply:
    """The kernel and the card's vendor timed side by side by `cast.beside` in a process pinned to `gpu`."""
    timer = VendorTimer(gpu, argv=BESIDE_COMMAND)
    try:
        return await timer.time_as(request, BesideReply)
    finally:
        await timer.close()


def beside_result(node: int, library: str, reply: BesideReply) -> Beside:
    """The reply's two sides as table cells (a side that disagrees with the card's reference is not timed)."""
    ours = VendorReply(
        samples_us=reply.kernel_samples_us, agrees=reply.kernel_agrees, check=reply.kernel_check, error=reply.error
    )
    sides = [vendor_timed(vendor_result(library, reply)), vendor_timed(vendor_result("ours", ours))]
    for side, agrees, other in zip(sides, (reply.agrees, reply.kernel_agrees), sides[::-1], strict=True):
        if side.median_us is None and agrees and not reply.error:
            side.error = f"not timed: {other.what} disagrees with the card's reference"
    return Beside(node=node, vendor=sides[0], ours=sides[1])


class Bench:
    """Runs the selected workloads over the GPUs' lanes and keeps the manifest (one writer: the lanes are tasks of
    one event loop and change it between awaits)."""

    def __init__(
        self,
        out: Path,
        settings: Settings,
        manifest: Manifest,
        say: Callable[[str], None],
        simulate: bool = False,
        torch_measure: TorchMeasure | None = None,
        vendor_measure: VendorMeasure | None = None,
        beside_measure: BesideMeasure | None = None,
    ) -> None:
        """`simulate` and the measures are for the CPU tests: the simulated backend (real nvcc builds, invented
        timings) and in-process stand-ins for the subprocesses."""
        self.out = out
        self.settings = settings
        self.manifest = manifest
        self.say_line = say
        self.simulate = simulate
        self.torch_measure = torch_measure or self._torch_subprocess
        self.vendor_measure = vendor_measure or vendor_subprocess
        self.beside_measure = beside_measure or beside_subprocess

    def say(self, line: str) -> None:
        save_manifest(self.manifest, self.out)
        self.say_line(line)

    async def _torch_subprocess(self, request: TorchRequest, gpu: int | None) -> TorchReply:
        return await torch_subprocess(request, gpu, self.out / TORCH)

    async def run(self, workloads: list[Workload], gpus: list[GpuInfo]) -> None:
        """Every workload, one per GPU at a time, each reusing what is done; one lane's end (Ctrl-C, no GPU) stops
        the others, their workloads resumable."""
        self.manifest.gpus = [f"{g.index}: {g.name}" for g in gpus]
        queue = iter(workloads)
        self.say(f"{len(workloads)} workloads on {len(gpus)} GPU(s): {', '.join(self.manifest.gpus)}")
        await run_lanes(self._lane(gpu, queue) for gpu in gpus)
        self.manifest.ended_at = time.time()
        self.say("done")

    async def _lane(self, gpu: GpuInfo, queue: Iterator[Workload]) -> None:
        for workload in queue:
            result = self.manifest.result(workload.name)
            began = time.monotonic()
            try:
                await self._workload(workload, result, gpu)
            finally:
                result.wall_seconds += time.monotonic() - began
                self.say(f"{workload.name} on GPU {gpu.index}: {_status(result)}")

    async def _workload(self, workload: Workload, result: WorkloadResult, gpu: GpuInfo) -> None:
        result.gpu, result.gpu_name = gpu.index, gpu.name
        card = await self._card_and_torch(workload, result, gpu)
        if card is None:
            return
        result.card, result.card_dir = card.spec.name, card.root
        result.bytes, result.flops = card.spec.bytes_moved(), card.spec.flops()
        result.error = ""
        try:
            await self._search(workload, result, card, gpu)
        except (asyncio.CancelledError, NoGpu):
            raise
        except Exception as exc:  # this card's failure (its baseline fails) must not end the other workloads
            result.error = f"search: {type(exc).__name__}: {exc}"

    async def _card_and_torch(self, workload: Workload, result: WorkloadResult, gpu: GpuInfo) -> Card | None:
        """The workload's card (captured, reused, or written from the suite) and torch's missing times."""
        options = self.manifest.options
        flush = self.settings.eval.flush_bytes
        card: Card | None = None
        if workload.task is not None:
            assert workload.scale is not None
            card = write_suite_card(suite_task(workload.task), workload.dtype, workload.scale, self.out / CARDS)
        elif result.card_dir is not None and (result.card_dir / "card.toml").is_file():
            card = load_card(result.card_dir)
        if workload.vendor:
            if "vendor" not in result.torch or result.torch["vendor"].median_us is None:
                assert card is not None
                self.say(f"{workload.name} on GPU {gpu.index}: timing the vendor")
                result.torch["vendor"] = vendor_timed(
                    await self.vendor_measure(card.root, gpu.index, options.reps, flush)
                )
            return card
        missing = [m for m in options.modes if m not in result.torch]
        capture_dir = self.out / CAPTURES / workload.name
        if card is None or missing:
            assert workload.entry is not None
            self.say(
                f"{workload.name} on GPU {gpu.index}: "
                + ("capturing, " if card is None else "")
                + (f"timing {', '.join(missing)}" if missing else "")
            )
            request = TorchRequest(
                workload=workload.name,
                entry=workload.entry,
                shape=list(workload.shape),
                capture=card is None,
                card_dir=capture_dir if card is None else card.root,
                modes=missing,
                reps=options.reps,
                flush_bytes=flush,
            )
            reply = await self.torch_measure(request, gpu.index)
            result.torch_version = reply.torch_version or result.torch_version
            for mode in missing:
                result.torch[mode] = timed(MODE_WORDS[mode], reply, mode)
            if card is None:
                try:
                    if reply.capture_error or reply.died:
                        raise CardProblem(f"{workload.name}: the capture failed: {reply.capture_error or reply.died}")
                    card = the_card(workload, capture_dir, workload.shape)
                except KernelForgeError as exc:
                    result.error = str(exc)
        return card

    async def _search(self, workload: Workload, result: WorkloadResult, card: Card, gpu: GpuInfo) -> None:
        """The card searched (or its finished run reused, or its run resumed) on the lane's GPU, as the product's
        bench searches its cards."""
        options = self.manifest.options
        run_dir = self.out / RUNS / workload.name
        info = recorded(run_dir)
        if info is None or info.state != "finished":
            run_options = RunOptions(
                budget=Budget(max_minutes=options.minutes, max_iterations=options.iterations),
                proposer=PROPOSER,
                simulate=self.simulate,
                gpus=None if self.simulate else [gpu.index],
            )
            verb = "resuming its run" if info is not None else f"searching ({options.minutes:g} min)"
            self.say(f"{workload.name} on GPU {gpu.index}: {card.spec.name}: {verb}")

            def on_best(event: BestImproved) -> None:
                self.say(f"{workload.name} on GPU {gpu.index}: best {event.speedup:.3g}x (node {event.node_id})")

            def on_end(backend: EvaluationBackend) -> None:
                result.ceilings = gpu_ceilings(backend) or result.ceilings

            end = await search_card(
                card.root, run_dir, self.settings, run_options, on_best, on_end, resume=info is not None
            )
            if end.refused:
                self.say(f"{workload.name}: its run is {end.reason}")
        result.ceilings = result.ceilings or cached_ceilings(gpu.uuid)
        result.ours = ours(run_dir)
        if workload.vendor:
            await self._beside(workload, result, card, gpu)

    async def _beside(self, workload: Workload, result: WorkloadResult, card: Card, gpu: GpuInfo) -> None:
        """The run's best kernel timed beside the vendor (`cast.beside`), once per best node."""
        assert result.ours is not None
        node = result.ours.best_node
        if node is None or (result.beside is not None and result.beside.node == node and result.beside.measured):
            return
        library = result.torch["vendor"].what if "vendor" in result.torch else "vendor"
        with RunStore.open(result.ours.run_dir, readonly=True) as store:
            source, plan = store.node_source(node)
        prepared = await build_candidate(card, make_builder(self.settings), source, plan)
        if isinstance(prepared, Evaluation):
            failed = Timed(what="ours", error=f"the best kernel did not build again: {prepared.reason}")
            result.beside = Beside(node=node, vendor=Timed(what=library, error="not timed"), ours=failed)
            return
        built, launch = prepared
        assert built.cubin_path is not None
        self.say(f"{workload.name} on GPU {gpu.index}: timing ours (node {node}) beside the vendor")
        request = BesideRequest(
            card_dir=card.root,
            reps=self.manifest.options.reps,
            flush_bytes=self.settings.eval.flush_bytes,
            cubin=built.cubin_path,
            launch=launch,
        )
        result.beside = beside_result(node, library, await self.beside_measure(request, gpu.index))


def ours(run_dir: Path) -> Ours:
    """The run's promoted best, and the profile of it when one was taken (profiling is on in the search)."""
    with RunStore.open(run_dir, readonly=True) as store:
        info = store.run_info()
        try:
            saved = store.profile(info.best_node_id) if info.best_node_id is not None else None
        except UnreadableRecord:
            saved = None
        params = store.node_record(info.best_node_id).params if info.best_node_id is not None else {}
    best, speedup = info.best_latency_us, info.best_speedup
    return Ours(
        profile=saved.hardware.summary() if saved is not None else "",
        params=params,
        run_dir=info.run_dir,
        state=info.state,
        reason=info.reason,
        candidates=max(0, info.node_count - 1),
        best_node=info.best_node_id,
        best_us=best,
        baseline_us=best * speedup if best is not None and speedup is not None else None,
        speedup=speedup,
    )


def _status(result: WorkloadResult) -> str:
    if result.error:
        return result.error
    if result.ours is None or result.ours.best_us is None:
        return "no search"
    return f"{result.card}: ours {result.ours.best_us:.4g} us ({result.ours.state}: {result.ours.reason})"


def open_manifest(out: Path, options: Options) -> Manifest:
    """The bench in `out` continued with these options (its results kept), or a new one."""
    if not (out / MANIFEST).exists():
        return Manifest(options=options)
    manifest = load_manifest(out)
    manifest.options = options
    manifest.ended_at = None
    return manifest


async def run_bench(
    out: Path,
    settings: Settings,
    options: Options,
    say: Callable[[str], None],
    gpus: list[GpuInfo] | None = None,
    **stand_ins: Any,
) -> Manifest:
    """Run (or continue) the bench in `out` on `gpus` (default: --gpus N of those detected; NoGpuError without
    one). `stand_ins` are Bench's test hooks."""
    workloads = select(options.workloads)
    if gpus is None:
        detected = require_gpu()
        gpus = detected[: options.gpus or len(detected)]
    with bench_lock(out):
        bench = Bench(out, settings, open_manifest(out, options), say, **stand_ins)
        await bench.run(workloads, gpus)
        return bench.manifest


# ---- the table ------------------------------------------------------------------------------------------------------


def copy_us(moved_bytes: int, ceilings: Ceilings) -> float:
    """The time the bytes take at the measured copy bandwidth (read and written once)."""
    return moved_bytes / (ceilings.copy_gbps * 1e3)


def numbers(workload: Workload, result: WorkloadResult) -> Numbers:
    """The table's numbers for one workload: times, shares of the copy ceiling (none for matmul), the ratios of
    ours to torch, and the goal's verdict."""
    keys = ["vendor"] if workload.vendor else list(MODES)
    times = {k: t.median_us for k in keys if (t := result.torch.get(k)) is not None and t.median_us is not None}
    mine = result.ours.best_us if result.ours is not None else None
    floor = None
    if result.ceilings is not None and result.bytes is not None and workload.family != "matmul":
        floor = copy_us(result.bytes, result.ceilings)
    all_times = {**times, **({"ours": mine} if mine is not None else {})}
    best = min(times, key=lambda k: times[k]) if times else None
    met, words = verdict(workload, result, mine, floor)
    return Numbers(
        workload=workload.name,
        card=result.card,
        bytes=result.bytes,
        copy_gbps=result.ceilings.copy_gbps if result.ceilings is not None else None,
        copy_us=floor,
        times_us=all_times,
        shares={k: floor / t for k, t in all_times.items() if floor is not None and t > 0},
        ours_us=mine,
        ours_over_eager=_over(mine, times.get(keys[0])),
        best_torch=best,
        ours_over_best_torch=_over(mine, times[best] if best is not None else None),
        goal=workload.goal.words,
        goal_met=met,
        goal_words=words,
    )


def _over(mine: float | None, other: float | None) -> float | None:
    return mine / other if mine is not None and other else None


def verdict(
    workload: Workload, result: WorkloadResult, mine: float | None, floor: float | None
) -> tuple[bool | None, str]:
    """Whether ours (`mine` us) meets the workload's goal (None: not measured), and by how much it misses it;
    `floor` is the card's bytes at the copy ceiling."""
    goal = workload.goal
    if mine is None:
        return None, "not measured: no search"
    if goal.kind == "ceiling":
        if floor is None:
            return None, "not measured: no copy ceiling"
        reached = floor / mine
        if reached >= goal.at_least:
            return True, f"met: {reached:.1%} >= {goal.at_least:.0%}"
        needed = floor / goal.at_least
        return False, (
            f"missed by {100 * (goal.at_least - reached):.1f} points: {reached:.1%} < {goal.at_least:.0%}; "
            f"needs <= {needed:.4g} us, has {mine:.4g} us ({mine / needed:.2f}x the time)"
        )
    vendor, how = result.torch.get("vendor"), ""
    if result.beside is not None and result.beside.measured:
        assert result.beside.ours.median_us is not None
        vendor, mine, how = result.beside.vendor, result.beside.ours.median_us, "side by side, "
    if vendor is None or vendor.median_us is None:
        return None, "not measured: no vendor time"
    ratio = vendor.median_us / mine
    met = ratio > goal.at_least if goal.strict else ratio >= goal.at_least
    sign = ">" if goal.strict else ">="
    if met:
        return True, f"met: {how}{vendor.what} / ours = {ratio:.3g} {sign} {goal.at_least:g}"
    needed = vendor.median_us / goal.at_least
    return False, (
        f"missed: {how}{vendor.what} / ours = {ratio:.3g}, needs {sign} {goal.at_least:g}; needs "
        f"{'<' if goal.strict else '<='} {needed:.4g} us, has {mine:.4g} us ({mine / needed:.2f}x the time)"
    )


def _cell(figures: Numbers, key: str, timing: Timed | None) -> str:
    """A time with its share, or why it is missing."""
    if key not in figures.times_us:
        return f"failed: {_clip(timing.error)}" if timing is not None and timing.error else "-"
    reached = figures.shares.get(key)
    return f"{figures.times_us[key]:.4g}" + (f" ({reached:.0%})" if reached is not None else "")


def _clip(text: str, limit: int = 60) -> str:
    line = text.splitlines()[0] if text else ""
    return (line[: limit - 3] + "...") if len(line) > limit else line


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def row(workload: Workload, result: WorkloadResult) -> list[str]:
    """One workload's cells, in `HEADER`'s order."""
    figures = numbers(workload, result)
    if workload.vendor:
        vendor = result.torch.get("vendor")
        library = vendor.what if vendor is not None else "vendor"
        cells = [f"{library}: {_cell(figures, 'vendor', vendor)}", "-", "-"]
        issue = "-"
    else:
        cells = [_cell(figures, m, result.torch.get(m)) for m in MODES]
        issue = f"{workload.eager_share:.0%} / {workload.compile_share:.0%}"
    met = {True: "yes", False: f"no: {figures.goal_words}", None: f"- ({figures.goal_words})"}[figures.goal_met]
    return [
        workload.name,
        result.card or (f"none: {_clip(result.error, 40)}" if result.error else "-"),
        f"{result.bytes / 1e6:,.0f}" if result.bytes is not None else "-",
        *cells,
        _cell(figures, "ours", None),
        _ratio(figures.ours_over_eager),
        _ratio(figures.ours_over_best_torch),
        issue,
        workload.goal.words,
        met,
    ]


HEADER = [
    "workload",
    "card",
    "MB",
    "eager us (share)",
    "torch.compile us (share)",
    "max-autotune us (share)",
    "ours us (share)",
    "ours / eager",
    "ours / best torch",
    "issue: eager / compile",
    "goal",
    "met",
]


def table(manifest: Manifest) -> str:
    """The Markdown report: the table, then what it rests on (the ceilings, the notes, every failure in full)."""
    lines = [
        "# Ours against PyTorch (bench/vs_torch.py)",
        "",
        f"Template proposer, {manifest.options.minutes:g} min of search per card"
        + (f", {manifest.options.iterations} candidates at most" if manifest.options.iterations is not None else "")
        + f"; torch timed over {manifest.options.reps} calls (median, L2 flushed before each)"
        + ("" if manifest.options.compile else "; torch.compile not run (--no-compile)")
        + f". GPUs: {', '.join(manifest.gpus) or '-'}.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "| " + " | ".join("---" for _ in HEADER) + " |",
    ]
    results = {r.workload: r for r in manifest.results}
    shown = [w for w in WORKLOADS if w.name in results]
    for workload in shown:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row(workload, results[workload.name])) + " |")
    lines += [
        "",
        "Times in us; a share is of the copy ceiling the GPU worker measured on the card's GPU (the card's bytes read "
        "and written once at that bandwidth, over the time). Ratios are of times (below 1: ours is faster); best "
        "torch is the fastest of torch's columns. spmv and matmul compare with their task's vendor (in the eager "
        "column); matmul has no share: a bf16 product is compute-bound on tensor cores, so ours is held to cuBLAS. "
        "Their goals are judged side by side where that was measured (the notes): the best kernel and the vendor "
        "timed in one process on the same tensors, interleaved, since apart each is timed on buffers laid out its own "
        "way (the worker's guarded allocations, torch's allocator), which alone moves a time by about 1%.",
    ]
    ceilings = {f"GPU {r.gpu} ({r.ceilings.gpu_name})": r.ceilings.copy_gbps for r in results.values() if r.ceilings}
    if ceilings:
        lines.append("Copy ceilings: " + "; ".join(f"{gpu} {gbps:,.0f} GB/s" for gpu, gbps in ceilings.items()) + ".")
    notes = []
    for workload in shown:
        result = results[workload.name]
        if result.error:
            notes.append(f"- {workload.name}: {result.error}")
        for mode, timing in result.torch.items():
            if timing.error:
                notes.append(f"- {workload.name}, {timing.what}: {timing.error}")
            elif timing.note and mode == "vendor":
                notes.append(f"- {workload.name}, {timing.what}: {timing.note}")
        if result.beside is not None:
            notes.append(f"- {workload.name}: {beside_words(result.beside)}")
        if result.ours is not None:
            how = f"{result.ours.state}: {result.ours.reason}" if result.ours.reason else result.ours.state
            profile = f"; the best kernel's profile: {result.ours.profile}" if result.ours.profile else ""
            params = ", ".join(f"{name} {value}" for name, value in result.ours.params.items())
            kernel = f"; the best kernel: {params}" if params else ""
            notes.append(
                f"- {workload.name}: run {result.ours.run_dir} ({how}; {result.ours.candidates} candidates, "
                f"{result.ours.speedup or 1:.3g}x over the card's baseline{kernel}{profile})"
            )
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def beside_words(beside: Beside) -> str:
    """The side-by-side timing in words: both times and their ratio, or why a side has none."""
    sides = []
    for side in (beside.vendor, beside.ours):
        if side.median_us is None:
            sides.append(f"{side.what}: {_clip(side.error, 200)}")
        else:
            sides.append(f"{side.what} {side.median_us:.4g} us (cv {side.cv or 0:.2%}, {side.reps} calls)")
    ratio = ""
    if beside.measured:
        assert beside.ours.median_us is not None and beside.vendor.median_us is not None
        ratio = f": ours / {beside.vendor.what} = {beside.ours.median_us / beside.vendor.median_us:.3f}"
    return (
        f"side by side (cast.beside: one process, the same tensors, interleaved; node {beside.node}): "
        + ", ".join(sides)
        + ratio
    )


def write_table(manifest: Manifest, out: Path) -> str:
    text = table(manifest)
    (out / TABLE).write_text(text)
    return text


# ---- the command ----------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, metavar="DIR", help="where the captures, cards, runs and table go")
    parser.add_argument("--workloads", nargs="+", default=[], metavar="NAME", help=f"of {', '.join(BY_NAME)}")
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES, help="search budget per card (10)")
    parser.add_argument("--iters", type=int, default=None, metavar="N", help="cap each card's candidates too")
    parser.add_argument("--gpus", type=int, default=None, metavar="N", help="cards at once, one per GPU (all)")
    parser.add_argument("--reps", type=int, default=DEFAULT_REPS, help="torch calls timed per mode (100)")
    parser.add_argument("--no-compile", action="store_true", help="time eager PyTorch only (quick runs)")
    parser.add_argument("--report", type=Path, metavar="DIR", help="the table again from DIR/vs_torch.json")
    parser.add_argument("--torch-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.out is None and args.report is None and args.torch_worker is None:
        parser.error("give --out DIR (or --report DIR)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.torch_worker is not None:
        return torch_worker(args.torch_worker)
    if args.report is not None:
        try:
            print(write_table(load_manifest(args.report), args.report), end="")
        except KernelForgeError as exc:
            print(f"vs_torch: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        options = Options(
            workloads=args.workloads,
            minutes=args.minutes,
            iterations=args.iters,
            gpus=args.gpus,
            reps=args.reps,
            compile=not args.no_compile,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"vs_torch: --{first['loc'][0]} {first['input']}: {first['msg'].lower()}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - started:7.1f} s] {line}", flush=True)

    try:
        manifest = asyncio.run(run_bench(args.out, load_settings(), options, say))
    except KernelForgeError as exc:
        print(f"vs_torch: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vs_torch: interrupted; rerun the same command to continue from {args.out}", file=sys.stderr)
        return 130
    print(write_table(manifest, args.out), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
