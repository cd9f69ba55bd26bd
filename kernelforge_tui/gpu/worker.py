"""The GPU worker: a long-lived subprocess (one per GPU) that runs untrusted kernels for the search.

Why a subprocess: a candidate that faults (illegal address) poisons its CUDA context, and one that spins
forever can only be stopped by killing its process. The search lives in another process, so neither
costs it anything: the client sees the worker die, restarts it, and records a typed failure.

Protocol: JSON lines on stdin/stdout (see protocol.py). Anything else the worker or CUDA prints goes
to stderr, because stdout is moved to a private descriptor before pycuda is imported.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TextIO

import numpy as np

from kernelforge_tui import tensor_maps
from kernelforge_tui.cards.directory import Arrays, Card, load_card, make_side_by_side
from kernelforge_tui.cards.dtypes import FLOATING
from kernelforge_tui.cards.model import InputSet, OperatorCard
from kernelforge_tui.config import EvalSettings
from kernelforge_tui.gpu.checks import (
    FIRST_RUN,
    FRESH_PREFIX,
    SECOND_RUN,
    Fill,
    Prefill,
    WrongLaunch,
    add_timings,
    bytes_needed,
    describe,
    fill_for,
    set_check,
    stale_source,
    timed_failure,
    timed_fill,
)
from kernelforge_tui.gpu.device import CandidateFault, GpuDevice, Guarded, Records
from kernelforge_tui.gpu.protocol import (
    CardLoaded,
    Evaluate,
    KernelRef,
    LoadCard,
    MeasureCeilings,
    ReplyEnvelope,
    RequestEnvelope,
    WorkerFailure,
)
from kernelforge_tui.gpu.statistics import median_settled
from kernelforge_tui.vocabulary.evaluation import Ceilings, EvalResult, SetCheck
from kernelforge_tui.vocabulary.nodes import FailureKind

HostMaker = Callable[[], tuple[Arrays, Arrays | None]]
"""Makes one set on the host: its inputs, and its reference outputs where they come from the host."""

TIMED_BATCH = 10
"""Timed launches of each kernel between two waits for the GPU; their checks are read back together."""
SCALAR_NUMPY = {"int32": np.int32, "int64": np.int64, "uint32": np.uint32, "uint64": np.uint64, "float32": np.float32}
PREPARED_CODE = {
    "tensor": "P",
    "tensor_map": "map",
    "int32": "i",
    "int64": "q",
    "uint32": "I",
    "uint64": "Q",
    "float32": "f",
}
"""Each argument's code in the kernel's parameter buffer (`tensor_maps.struct_format`), by scalar type or kind."""


@dataclass
class DeviceSet:
    """One input set on the device: working inputs (guarded), pristine copies, reference outputs."""

    name: str
    inputs: dict[str, Guarded]
    pristine: dict[str, Any]
    references: dict[str, Any]


@dataclass
class LoadedKernel:
    """A kernel's module and prepared function, loaded once per card (`Worker.load_kernel`)."""

    function: Any
    ref: KernelRef
    module: Any


@dataclass
class State:
    card: Card
    settings: EvalSettings
    sets: list[DeviceSet]
    outputs: dict[str, Guarded]
    first_outputs: dict[str, Any]
    rng: np.random.Generator
    """Draws the seed of each NOISE prefill (seeded from the load's fresh seed, which no kernel can know)."""
    stale_set: int | None
    """The set whose references STALE prefills copy (checks.stale_source)."""
    records: Records
    """One helper record per output and timed launch of a batch (the checks of a single run use the first ones)."""
    scratch: Any
    device_bytes: int
    kernels: dict[str, LoadedKernel] = field(default_factory=dict)


def host_set(card: Card, which: InputSet, reference: bool) -> tuple[Arrays, Arrays | None]:
    """(inputs, reference outputs) of one of the card's sets on the host; a seeded set's references only when
    `reference` (with a baseline reference they come from the GPU, and a profiled launch needs none)."""
    if which.file is not None:
        return card.input_set(which)
    return drawn_set(card, which.seed or 0, reference)


def drawn_set(card: Card, seed: int, reference: bool) -> tuple[Arrays, Arrays | None]:
    """(inputs, reference outputs or None) of a set drawn from `seed`."""
    inputs = card.draw(seed)
    return inputs, card.reference(inputs) if reference else None


def host_makers(card: Card, fresh_seeds: int, fresh_seed: int) -> list[tuple[str, HostMaker]]:
    """The name and maker of every set a loaded card holds, in order: the card's own, `fresh_seeds` drawn from
    `fresh_seed` on, then the family's stress sets ("stress:<set>", cards/stress.py)."""
    host_reference = card.spec.reference.kind == "numpy"
    makers: list[tuple[str, HostMaker]] = [
        (which.name, partial(host_set, card, which, host_reference)) for which in card.spec.input_sets
    ]
    for k in range(fresh_seeds):
        makers.append((f"{FRESH_PREFIX}{k}", partial(drawn_set, card, fresh_seed + k, host_reference)))
    return makers + card.stress_makers()


class Worker:
    """Owns the loaded card and runs candidates on it: the checks, the timing, and one-off launches."""

    def __init__(self) -> None:
        import pycuda.driver as drv

        self.drv = drv
        self.gpu = GpuDevice(drv)
        self.state: State | None = None

    # -- card ----------------------------------------------------------------------------------------
    def load_card(self, request: LoadCard) -> CardLoaded:
        """Upload every input set (the card's, then fresh ones) with its references, and the output buffers."""
        started = time.perf_counter()
        self.gpu.load_helpers(request.helpers_cubin)
        self.state = None
        card = load_card(request.card_dir)
        spec = card.spec
        makers = host_makers(card, request.settings.fresh_seeds, request.fresh_seed)
        made = make_side_by_side([make for _, make in makers], spec.set_bytes())
        host_sets = [(name, inputs, refs) for (name, _), (inputs, refs) in zip(makers, made, strict=True)]
        need = bytes_needed(spec, len(host_sets), request.settings.flush_bytes)
        free, total = self.drv.mem_get_info()
        if need > free:
            raise MemoryError(
                f"the card needs {need / 1e9:.1f} GB on the GPU, {free / 1e9:.1f} GB of "
                f"{total / 1e9:.1f} GB is free: use smaller sizes or fewer fresh sets"
            )
        out_buffers = self._output_buffers(spec)
        sets = [self._upload_set(name, spec, inputs, refs) for name, inputs, refs in host_sets]
        self.state = State(
            card=card,
            settings=request.settings,
            sets=sets,
            outputs=out_buffers,
            first_outputs={name: self.gpu.alloc(buf.nbytes) for name, buf in out_buffers.items()},
            rng=np.random.default_rng(request.fresh_seed),
            stale_set=stale_source([s.name for s in sets]),
            records=self.gpu.records(TIMED_BATCH * len(spec.outputs)),
            scratch=self.gpu.alloc(request.settings.flush_bytes),
            device_bytes=need,
        )
        if spec.reference.kind == "baseline":
            if request.baseline is None:
                raise ValueError("the card's reference is its baseline kernel, but no baseline was given")
            self._baseline_references(request.baseline)
        self.gpu.context.synchronize()
        return CardLoaded(sets=[s.name for s in sets], device_bytes=need, seconds=time.perf_counter() - started)

    def load_input_set(self, card: Card, which: InputSet) -> None:
        """Load one of the card's input sets and the output buffers, without references, fresh sets or the
        flush scratch: what a single profiled launch needs (`ncu.launch`)."""
        inputs, _ = host_set(card, which, reference=False)
        self.state = State(
            card=card,
            settings=EvalSettings(fresh_seeds=0),
            sets=[self._upload_set(which.name, card.spec, inputs, None)],
            outputs=self._output_buffers(card.spec),
            first_outputs={},
            rng=np.random.default_rng(),
            stale_set=None,
            records=self.gpu.records(len(card.spec.outputs)),
            scratch=None,
            device_bytes=0,
        )
        self.gpu.context.synchronize()

    def _output_buffers(self, spec: OperatorCard) -> dict[str, Guarded]:
        return {t.name: self.gpu.guarded(t.nbytes(spec.sizes)) for t in spec.outputs}

    def _upload_set(self, name: str, spec: OperatorCard, inputs: Arrays, refs: Arrays | None) -> DeviceSet:
        working: dict[str, Guarded] = {}
        pristine: dict[str, Any] = {}
        for tensor in spec.inputs:
            array = np.ascontiguousarray(inputs[tensor.name])
            working[tensor.name] = self.gpu.guarded(array.nbytes)
            self.drv.memcpy_htod(working[tensor.name].ptr, array)
            pristine[tensor.name] = self.gpu.alloc(array.nbytes)
            self.drv.memcpy_htod(pristine[tensor.name], array)
        references: dict[str, Any] = {}
        for tensor in spec.outputs:
            references[tensor.name] = self.gpu.alloc(tensor.nbytes(spec.sizes))
            if refs is not None:
                self.drv.memcpy_htod(references[tensor.name], np.ascontiguousarray(refs[tensor.name]))
        return DeviceSet(name=name, inputs=working, pristine=pristine, references=references)

    def _baseline_references(self, baseline: KernelRef) -> None:
        """References for seeded and fresh sets from the baseline kernel, for cards without a host reference."""
        state = self._state()
        kernel = self.load_kernel(baseline)
        stored = {w.name for w in state.card.spec.input_sets if w.file}
        for device_set in state.sets:
            if device_set.name in stored:
                continue
            self._launch(kernel, device_set)
            self.gpu.sync()
            for name, buffer in state.outputs.items():
                self.drv.memcpy_dtod(device_set.references[name], buffer.ptr, buffer.nbytes)

    def _state(self) -> State:
        if self.state is None:
            raise RuntimeError("no card loaded: send load_card first")
        return self.state

    # -- kernels -------------------------------------------------------------------------------------
    def load_kernel(self, ref: KernelRef) -> LoadedKernel:
        """Load a built kernel for the loaded card (kept while the card is, up to a few at a time)."""
        state = self._state()
        key = f"{ref.cubin}:{ref.launch.model_dump_json()}"
        if key not in state.kernels:
            if len(state.kernels) > 8:
                state.kernels.clear()
            module = self.drv.module_from_file(str(ref.cubin))
            function = module.get_function(ref.launch.entry)
            if ref.launch.shared_bytes > 48 * 1024:
                function.set_attribute(
                    self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, ref.launch.shared_bytes
                )
            function.prepare(
                tensor_maps.struct_format([PREPARED_CODE[a.scalar_type or a.kind] for a in ref.launch.args])
            )
            state.kernels[key] = LoadedKernel(function=function, ref=ref, module=module)
        return state.kernels[key]

    def launch_once(self, kernel: LoadedKernel) -> None:
        """Poison the outputs as before a checked run, launch on the first loaded set and wait for it:
        exactly one launch of the kernel (a profiler catches it); CandidateFault if it faults."""
        self._prefill(FIRST_RUN)
        self._launch(kernel, self._state().sets[0])
        self.gpu.sync()

    def close(self) -> None:
        """Release the CUDA context (the process exits next)."""
        self.gpu.close()

    def _launch(self, kernel: LoadedKernel, device_set: DeviceSet) -> None:
        state = self._state()
        values: list[Any] = []
        for arg in kernel.ref.launch.args:
            if arg.kind == "scalar":
                values.append(SCALAR_NUMPY[arg.scalar_type](arg.value))
                continue
            buffer = device_set.inputs.get(arg.name) or state.outputs[arg.name]
            if arg.tensor_map is None:
                values.append(np.uintp(buffer.ptr))
            else:  # encoded over this set's own buffer: a map holds its tensor's address
                values.append(tensor_maps.encode(arg.tensor_map, buffer.ptr, buffer.nbytes))
        launch = kernel.ref.launch
        kernel.function.prepared_async_call(
            launch.grid, launch.block, self.gpu.stream, *values, shared_size=launch.shared_bytes
        )

    def _prefill(self, fill: Fill) -> None:
        """Fill the outputs before a launch: the poison, another set's references, or fresh noise (checks.Prefill)."""
        state = self._state()
        spec = state.card.spec
        for tensor in spec.outputs:
            buffer = state.outputs[tensor.name]
            if fill.prefill is Prefill.POISON:
                self.gpu.poison(buffer.ptr, buffer.nbytes, tensor.dtype)
            elif fill.prefill is Prefill.NOISE:
                seed = int(state.rng.integers(0, 2**63))
                self.gpu.noise(buffer.ptr, tensor.numel(spec.sizes), tensor.dtype, seed)
            else:
                assert fill.stale_set is not None
                self.gpu.copy(buffer.ptr, state.sets[fill.stale_set].references[tensor.name], buffer.nbytes)

    # -- checks --------------------------------------------------------------------------------------
    def _queue_checks(self, device_set: DeviceSet, first_record: int) -> None:
        """Queue the compare of each output against the set's reference, into records from `first_record` on:
        on the stream after the launch, with no wait, so a timed launch's check never stalls the timing."""
        state = self._state()
        spec = state.card.spec
        for k, tensor in enumerate(spec.outputs):
            record = state.records.ptr(first_record + k)
            buffer = state.outputs[tensor.name]
            reference = device_set.references[tensor.name]
            if tensor.dtype in FLOATING:
                tol = tensor.effective_tolerance()
                self.gpu.queue_compare(record, buffer.ptr, reference, tensor.numel(spec.sizes), tensor.dtype, tol)
            else:
                self.gpu.queue_count_diff(record, buffer.ptr, int(reference), 0, buffer.nbytes)

    def _compare(self, device_set: DeviceSet, fill: Fill) -> SetCheck:
        """Each output against the set's reference, on the GPU; `fill` is what the outputs held before."""
        state = self._state()
        outputs = len(state.card.spec.outputs)
        self._queue_checks(device_set, 0)
        return set_check(state.card.spec, device_set.name, fill, self.gpu.read(state.records, outputs))

    def _stray_writes(self) -> str:
        """Describe writes into any canary region of the outputs or of any set's inputs, or return ''."""
        state = self._state()
        buffers = [(f"output {n}", b) for n, b in state.outputs.items()]
        buffers += [(f"input {n} of set {s.name}", b) for s in state.sets for n, b in s.inputs.items()]
        return self.gpu.stray_writes(buffers)

    def _modified_inputs(self, device_set: DeviceSet) -> str:
        for name, buffer in device_set.inputs.items():
            changed, first = self.gpu.count_diff(buffer.ptr, int(device_set.pristine[name]), 0, buffer.nbytes)
            if changed:
                return f"modified its input {name!r} ({changed} bytes changed, first at byte {first})"
        return ""

    # -- evaluation ----------------------------------------------------------------------------------
    def evaluate(self, request: Evaluate) -> EvalResult:
        started = time.perf_counter()
        try:
            result = self._evaluate(request)
        except CandidateFault as exc:
            result = EvalResult(
                ok=False, failure=FailureKind.LAUNCH, reason=f"CUDA error while the candidate ran: {exc}", fatal=True
            )
        except self.drv.Error as exc:
            reason = f"{type(exc).__name__}: {exc}"
            result = EvalResult(ok=False, failure=FailureKind.LAUNCH, reason=reason, fatal=True)
        except tensor_maps.TensorMapError as exc:  # before any launch of the candidate: the context is sound
            result = EvalResult(ok=False, failure=FailureKind.LAUNCH, reason=f"its plan's tensor map: {exc}")
        result.gpu_seconds = time.perf_counter() - started
        return result

    def _evaluate(self, request: Evaluate) -> EvalResult:
        """Every set from the poison; the first set again from another set's results; then the timing."""
        state = self._state()
        try:
            candidate = self.load_kernel(request.candidate)
        except self.drv.Error as exc:
            return EvalResult(ok=False, failure=FailureKind.LAUNCH, reason=f"cannot load the kernel: {exc}")
        checks: list[SetCheck] = []
        for index, device_set in enumerate(state.sets):
            failure = self._run_checked(candidate, device_set, FIRST_RUN, checks)
            if failure is not None:
                return failure
            if index == 0:
                for name, buffer in state.outputs.items():
                    self.gpu.copy(state.first_outputs[name], buffer.ptr, buffer.nbytes)
        first = state.sets[0]
        second = fill_for(SECOND_RUN, state.stale_set)
        failure = self._run_checked(candidate, first, second, checks, label=f"{first.name} (second run)")
        if failure is not None:
            if failure.failure == FailureKind.MISMATCH:
                started_from = describe(second, [s.name for s in state.sets])
                failure.reason = (
                    f"the second run on the same inputs, started from {started_from} instead of the NaN poison, "
                    f"disagrees (its output depends on what the buffer held before, or it races): {failure.reason}"
                )
            return failure
        deterministic = all(
            self.gpu.count_diff(buffer.ptr, int(state.first_outputs[name]), 0, buffer.nbytes)[0] == 0
            for name, buffer in state.outputs.items()
        )
        result = EvalResult(ok=True, checks=checks, deterministic=deterministic)
        if request.time_it:
            self._time(request, candidate, result)
        return result

    def _run_checked(
        self, kernel: LoadedKernel, device_set: DeviceSet, fill: Fill, checks: list[SetCheck], label: str = ""
    ) -> EvalResult | None:
        """Prefill, launch, and check one set; a failed result, or None when the set passed."""
        self._prefill(fill)
        self._launch(kernel, device_set)
        self.gpu.sync()
        stray = self._stray_writes()
        if stray:
            return EvalResult(ok=False, failure=FailureKind.CHEAT, reason=stray, checks=checks, fatal=True)
        modified = self._modified_inputs(device_set)
        if modified:
            return EvalResult(ok=False, failure=FailureKind.CHEAT, reason=modified, checks=checks, fatal=True)
        check = self._compare(device_set, fill)
        if label:
            check.name = label
        checks.append(check)
        if not check.ok:
            reason = f"set {check.name}: {check.reason}"
            return EvalResult(ok=False, failure=FailureKind.MISMATCH, reason=reason, checks=checks)
        return None

    def _time(self, request: Evaluate, candidate: LoadedKernel, result: EvalResult) -> None:
        """Interleaved, L2-flushed timing of candidate and baseline on the first set; every timed launch of the
        candidate is prefilled before its flush and checked after its end event, outside what is timed."""
        state = self._state()
        settings = state.settings
        first = state.sets[0]
        outputs = len(state.card.spec.outputs)
        kernels = [("candidate", candidate)]
        if request.baseline is not None:
            kernels.append(("baseline", self.load_kernel(request.baseline)))
        samples: dict[str, list[float]] = {name: [] for name, _ in kernels}
        for _, kernel in kernels:  # warm-up: module load, instruction cache, clocks
            for _ in range(3):
                self._launch(kernel, first)
        self.gpu.sync()
        started = time.perf_counter()
        wrong: list[WrongLaunch] = []
        while not wrong:
            events = []
            fills = []
            for i in range(TIMED_BATCH):
                for name, kernel in kernels if i % 2 == 0 else kernels[::-1]:
                    if name == "candidate":
                        fills.append(timed_fill(len(samples["candidate"]) + i, state.stale_set))
                        self._prefill(fills[-1])
                    self.drv.memset_d32_async(state.scratch, i, settings.flush_bytes // 4, self.gpu.stream)
                    begin, end = self.drv.Event(), self.drv.Event()
                    begin.record(self.gpu.stream)
                    self._launch(kernel, first)
                    end.record(self.gpu.stream)
                    events.append((name, begin, end))
                    if name == "candidate":
                        self._queue_checks(first, i * outputs)
            records = self.gpu.read(state.records, TIMED_BATCH * outputs)
            done = len(samples["candidate"])
            for i, fill in enumerate(fills):
                check = set_check(state.card.spec, first.name, fill, records[i * outputs : (i + 1) * outputs])
                if not check.ok:
                    wrong.append(WrongLaunch(number=done + i + 1, fill=fill, check=check))
            for name, begin, end in events:
                samples[name].append(end.time_since(begin) * 1000.0)
            reps = len(samples["candidate"])
            settled = all(median_settled(s, settings.target_rel_error) for s in samples.values())
            spent = time.perf_counter() - started
            if reps >= settings.max_reps or spent > settings.timing_budget_s or (reps >= settings.min_reps and settled):
                break
        tampered = self._stray_writes() or self._modified_inputs(first)
        if tampered:
            result.ok, result.failure, result.fatal = False, FailureKind.CHEAT, True
            result.reason = f"while it was timed, it {tampered}"
        elif wrong:
            result.ok, result.failure = False, FailureKind.CHEAT
            result.reason = timed_failure(wrong, len(samples["candidate"]), [s.name for s in state.sets])
        else:
            add_timings(result, samples, request.bytes_moved, request.flops)

    # -- ceilings ------------------------------------------------------------------------------------
    def measure_ceilings(self, request: MeasureCeilings) -> Ceilings:
        return self.gpu.measure_ceilings(request.helpers_cubin)


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer requests until stdin closes; exit at once after a fatal result."""
    worker = Worker()
    for line in requests:
        if not line.strip():
            continue
        request = RequestEnvelope.model_validate_json(line).request
        reply: EvalResult | CardLoaded | Ceilings | WorkerFailure
        try:
            if isinstance(request, LoadCard):
                reply, kind = worker.load_card(request), "card"
            elif isinstance(request, Evaluate):
                reply, kind = worker.evaluate(request), "eval"
            else:
                reply, kind = worker.measure_ceilings(request), "ceilings"
        except Exception as exc:  # the client turns this into a clear, typed error
            reply, kind = WorkerFailure(error=f"{type(exc).__name__}: {exc}"), "failure"
        replies.write(ReplyEnvelope(reply=reply, kind=kind).model_dump_json() + "\n")
        replies.flush()
        if isinstance(reply, EvalResult) and reply.fatal:
            os._exit(3)


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
