"""The GPU worker: a long-lived subprocess (one per GPU) that runs untrusted kernels for the search.

Why a subprocess: a candidate that faults (illegal address) poisons its CUDA context, and one that spins
forever can only be stopped by killing its process. The search lives in another process, so neither
costs it anything: the client sees the worker die, restarts it, and records a typed failure.

Protocol: JSON lines on stdin/stdout (see protocol.py). Anything else the worker or CUDA prints goes
to stderr, because stdout is moved to a private descriptor before pycuda is imported.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from kernelforge_tui.cards.dtypes import FLOATING, NUMPY, POISON_BITS
from kernelforge_tui.cards.model import OperatorCard, TensorSpec
from kernelforge_tui.cards.store import Arrays, Card, draw_inputs, load_card
from kernelforge_tui.config import EvalSettings
from kernelforge_tui.gpu.protocol import (
    CardLoaded,
    Crash,
    Evaluate,
    KernelRef,
    LoadCard,
    MeasureCeilings,
    ReplyEnvelope,
    RequestEnvelope,
    WorkerFailure,
)
from kernelforge_tui.models.evaluation import Ceilings, EvalResult, SetCheck, Timing
from kernelforge_tui.models.nodes import FailureKind

GUARD_BYTES = 64 * 1024
"""Canary bytes before and after every candidate-visible buffer: a write past the end lands here."""
CANARY = 0xA7
COMPARE_RESULT_BYTES = 40
SCALAR_NUMPY = {"int32": np.int32, "int64": np.int64, "uint32": np.uint32, "uint64": np.uint64, "float32": np.float32}
PREPARED_CODE = {"int32": "i", "int64": "q", "uint32": "I", "uint64": "Q", "float32": "f"}


class CandidateFault(Exception):
    """A CUDA error while a candidate ran: its context can no longer be trusted."""


@dataclass
class Guarded:
    """A device buffer with canary regions on both sides."""

    alloc: Any
    nbytes: int

    @property
    def ptr(self) -> int:
        return int(self.alloc) + GUARD_BYTES


@dataclass
class DeviceSet:
    """One input set on the device: working inputs (guarded), pristine copies, reference outputs."""

    name: str
    inputs: dict[str, Guarded]
    pristine: dict[str, Any]
    references: dict[str, Any]


@dataclass
class LoadedKernel:
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
    scratch: Any
    device_bytes: int
    kernels: dict[str, LoadedKernel] = field(default_factory=dict)


def _robust_stats(samples: list[float]) -> Timing:
    values = np.sort(np.asarray(samples))
    median = float(np.median(values))
    q25, q75 = np.percentile(values, [25, 75])
    return Timing(
        median_us=median,
        p10_us=float(np.percentile(values, 10)),
        p90_us=float(np.percentile(values, 90)),
        cv=float((q75 - q25) / 1.349 / median) if median > 0 else 0.0,
        reps=len(samples),
    )


def _median_settled(samples: list[float], target: float) -> bool:
    """The standard error of the median (1.2533 sigma / sqrt n, sigma from the IQR) is under target."""
    stats = _robust_stats(samples)
    return 1.2533 * stats.cv / math.sqrt(len(samples)) < target


class Worker:
    """Owns the CUDA context, the loaded card and the helper kernels."""

    def __init__(self) -> None:
        import pycuda.driver as drv

        drv.init()
        self.drv = drv
        self.device = drv.Device(int(os.environ.get("KERNELFORGE_WORKER_DEVICE", "0")))
        self.context = self.device.make_context()
        self.stream = drv.Stream()
        self.state: State | None = None
        self.helpers: Any = None
        self.helpers_path: Path | None = None
        self.compare_result = drv.mem_alloc(COMPARE_RESULT_BYTES)
        self.count_result = drv.mem_alloc(16)

    # -- helpers -------------------------------------------------------------------------------------
    def _helpers(self, path: Path) -> Any:
        if self.helpers_path != path:
            self.helpers = self.drv.module_from_file(str(path))
            self.helpers_path = path
        return self.helpers

    def _grid_for(self, n: int) -> tuple[int, int, int]:
        sms = int(self.device.get_attribute(self.drv.device_attribute.MULTIPROCESSOR_COUNT))
        return (max(1, min((n + 255) // 256, sms * 8)), 1, 1)

    def _count_diff(self, a: int, b: int | None, value: int, nbytes: int) -> tuple[int, int]:
        """(how many bytes differ, the first one) between a and b (or a and a constant byte)."""
        self.drv.memset_d32_async(self.count_result, 0, 2, self.stream)
        self.drv.memset_d32_async(int(self.count_result) + 8, 0xFFFFFFFF, 2, self.stream)
        fn = self.helpers.get_function("kf_count_diff")
        fn(
            np.uintp(a),
            np.uintp(b or 0),
            np.uint8(value),
            np.int64(nbytes),
            self.count_result,
            block=(256, 1, 1),
            grid=self._grid_for(nbytes),
            stream=self.stream,
        )
        host = np.zeros(2, dtype=np.uint64)
        self.drv.memcpy_dtoh_async(host, self.count_result, self.stream)
        self._sync()
        return int(host[0]), int(host[1])

    def _sync(self) -> None:
        try:
            self.stream.synchronize()
        except self.drv.Error as exc:
            raise CandidateFault(str(exc)) from None

    def _alloc(self, nbytes: int) -> Any:
        return self.drv.mem_alloc(max(nbytes, 1))

    def _guarded(self, nbytes: int) -> Guarded:
        buffer = Guarded(self.drv.mem_alloc(nbytes + 2 * GUARD_BYTES), nbytes)
        self.drv.memset_d8(int(buffer.alloc), CANARY, GUARD_BYTES)
        self.drv.memset_d8(buffer.ptr + nbytes, CANARY, GUARD_BYTES)
        return buffer

    # -- card ----------------------------------------------------------------------------------------
    def load_card(self, request: LoadCard) -> CardLoaded:
        started = time.perf_counter()
        self._helpers(request.helpers_cubin)
        self.state = None
        card = load_card(request.card_dir)
        spec = card.spec
        host_reference = spec.reference.kind == "numpy"
        host_sets: list[tuple[str, Arrays, Arrays | None]] = []
        for which in spec.input_sets:
            if which.file is not None or host_reference:
                host_sets.append((which.name, *card.input_set(which)))
            else:
                host_sets.append((which.name, draw_inputs(spec, which.seed or 0), None))
        for k in range(request.settings.fresh_seeds):
            inputs = draw_inputs(spec, request.fresh_seed + k)
            host_sets.append((f"fresh-{k}", inputs, card.reference(inputs) if host_reference else None))
        need = self._bytes_needed(spec, len(host_sets), request.settings.flush_bytes)
        free, total = self.drv.mem_get_info()
        if need > free:
            raise MemoryError(
                f"the card needs {need / 1e9:.1f} GB on the GPU, {free / 1e9:.1f} GB of "
                f"{total / 1e9:.1f} GB is free: use smaller sizes or fewer fresh sets"
            )
        out_buffers = {t.name: self._guarded(_nbytes(t, spec)) for t in spec.outputs}
        sets = [self._upload_set(name, spec, inputs, refs) for name, inputs, refs in host_sets]
        self.state = State(
            card=card,
            settings=request.settings,
            sets=sets,
            outputs=out_buffers,
            first_outputs={name: self._alloc(buf.nbytes) for name, buf in out_buffers.items()},
            scratch=self._alloc(request.settings.flush_bytes),
            device_bytes=need,
        )
        if spec.reference.kind == "baseline":
            if request.baseline is None:
                raise ValueError("the card's reference is its baseline kernel, but no baseline was given")
            self._baseline_references(request.baseline)
        self.context.synchronize()
        return CardLoaded(sets=[s.name for s in sets], device_bytes=need, seconds=time.perf_counter() - started)

    @staticmethod
    def _bytes_needed(spec: OperatorCard, n_sets: int, flush_bytes: int) -> int:
        ins = sum(_nbytes(t, spec) for t in spec.inputs)
        outs = sum(_nbytes(t, spec) for t in spec.outputs)
        return n_sets * (2 * ins + outs) + 2 * outs + flush_bytes

    def _upload_set(self, name: str, spec: OperatorCard, inputs: Arrays, refs: Arrays | None) -> DeviceSet:
        working: dict[str, Guarded] = {}
        pristine: dict[str, Any] = {}
        for tensor in spec.inputs:
            array = np.ascontiguousarray(inputs[tensor.name])
            working[tensor.name] = self._guarded(array.nbytes)
            self.drv.memcpy_htod(working[tensor.name].ptr, array)
            pristine[tensor.name] = self._alloc(array.nbytes)
            self.drv.memcpy_htod(pristine[tensor.name], array)
        references: dict[str, Any] = {}
        for tensor in spec.outputs:
            references[tensor.name] = self._alloc(_nbytes(tensor, spec))
            if refs is not None:
                self.drv.memcpy_htod(references[tensor.name], np.ascontiguousarray(refs[tensor.name]))
        return DeviceSet(name=name, inputs=working, pristine=pristine, references=references)

    def _baseline_references(self, baseline: KernelRef) -> None:
        """References for seeded and fresh sets from the baseline kernel, for cards without a host reference."""
        state = self._state()
        kernel = self._kernel(baseline)
        stored = {w.name for w in state.card.spec.input_sets if w.file}
        for device_set in state.sets:
            if device_set.name in stored:
                continue
            self._launch(kernel, device_set)
            self._sync()
            for name, buffer in state.outputs.items():
                self.drv.memcpy_dtod(device_set.references[name], buffer.ptr, buffer.nbytes)

    def _state(self) -> State:
        if self.state is None:
            raise RuntimeError("no card loaded: send load_card first")
        return self.state

    # -- kernels -------------------------------------------------------------------------------------
    def _kernel(self, ref: KernelRef) -> LoadedKernel:
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
            types = "".join("P" if a.kind == "tensor" else PREPARED_CODE[a.scalar_type] for a in ref.launch.args)
            function.prepare(types)
            state.kernels[key] = LoadedKernel(function=function, ref=ref, module=module)
        return state.kernels[key]

    def _launch(self, kernel: LoadedKernel, device_set: DeviceSet) -> None:
        state = self._state()
        values: list[Any] = []
        for arg in kernel.ref.launch.args:
            if arg.kind == "tensor":
                buffer = device_set.inputs.get(arg.name) or state.outputs[arg.name]
                values.append(np.uintp(buffer.ptr))
            else:
                values.append(SCALAR_NUMPY[arg.scalar_type](arg.value))
        launch = kernel.ref.launch
        kernel.function.prepared_async_call(
            launch.grid, launch.block, self.stream, *values, shared_size=launch.shared_bytes
        )

    def _poison_outputs(self) -> None:
        state = self._state()
        for tensor in state.card.spec.outputs:
            buffer = state.outputs[tensor.name]
            _memset_pattern(self.drv, buffer.ptr, buffer.nbytes, tensor.dtype, self.stream)

    # -- checks --------------------------------------------------------------------------------------
    def _compare(self, device_set: DeviceSet) -> SetCheck:
        state = self._state()
        spec = state.card.spec
        total = SetCheck(name=device_set.name, ok=True)
        for tensor in spec.outputs:
            buffer = state.outputs[tensor.name]
            numel = tensor.numel(spec.sizes)
            total.numel += numel
            if tensor.dtype not in FLOATING:
                bad_bytes, first = self._count_diff(
                    buffer.ptr, int(device_set.references[tensor.name]), 0, buffer.nbytes
                )
                if bad_bytes:
                    itemsize = buffer.nbytes // numel
                    total.ok = False
                    total.bad += max(1, bad_bytes // itemsize)
                    total.first_bad_index = first // itemsize
                    total.reason = f"{tensor.name}: integer output differs from the reference"
                continue
            tol = tensor.effective_tolerance()
            self.drv.memset_d32_async(self.compare_result, 0, COMPARE_RESULT_BYTES // 4, self.stream)
            self.drv.memset_d32_async(int(self.compare_result) + 16, 0xFFFFFFFF, 2, self.stream)
            fn = self.helpers.get_function(f"kf_compare_{tensor.dtype}")
            fn(
                np.uintp(buffer.ptr),
                device_set.references[tensor.name],
                np.int64(numel),
                np.float64(tol.rtol),
                np.float64(tol.atol),
                self.compare_result,
                block=(256, 1, 1),
                grid=self._grid_for(numel),
                stream=self.stream,
            )
            host = np.zeros(5, dtype=np.uint64)
            self.drv.memcpy_dtoh_async(host, self.compare_result, self.stream)
            self._sync()
            bad, nan_out, first = int(host[0]), int(host[1]), int(host[2])
            max_abs, max_ratio = host[3:5].view(np.float64)
            total.bad += bad
            total.unwritten += nan_out
            total.max_abs_error = max(total.max_abs_error, float(max_abs))
            total.max_error_ratio = max(total.max_error_ratio, float(max_ratio))
            if bad:
                total.ok = False
                total.first_bad_index = first
                row = _row_of(first, tensor.dims(spec.sizes))
                if nan_out == numel:
                    total.reason = f"{tensor.name} was never written (all {numel} elements still hold the NaN poison)"
                elif nan_out:
                    total.reason = (
                        f"{tensor.name}: {nan_out} of {numel} elements never written or NaN "
                        f"(first at index {first}{row})"
                    )
                else:
                    total.reason = (
                        f"{tensor.name}: {bad} of {numel} elements outside rtol={tol.rtol:g}, "
                        f"atol={tol.atol:g} (worst {float(max_ratio):.3g}x the tolerance; "
                        f"first at index {first}{row})"
                    )
        return total

    def _stray_writes(self) -> str:
        """Describe writes into any canary region, or return ''."""
        state = self._state()
        buffers = [(f"output {n}", b) for n, b in state.outputs.items()]
        buffers += [(f"input {n} of set {s.name}", b) for s in state.sets for n, b in s.inputs.items()]
        for label, buffer in buffers:
            before, _ = self._count_diff(int(buffer.alloc), None, CANARY, GUARD_BYTES)
            after, first = self._count_diff(buffer.ptr + buffer.nbytes, None, CANARY, GUARD_BYTES)
            if before or after:
                where = f"{after} bytes past the end (first at +{first})" if after else f"{before} bytes before it"
                return f"wrote outside its buffers: {where} of {label}"
        return ""

    def _modified_inputs(self, device_set: DeviceSet) -> str:
        for name, buffer in device_set.inputs.items():
            changed, first = self._count_diff(buffer.ptr, int(device_set.pristine[name]), 0, buffer.nbytes)
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
                ok=False, failure="launch", reason=f"CUDA error while the candidate ran: {exc}", fatal=True
            )
        except self.drv.Error as exc:
            result = EvalResult(ok=False, failure="launch", reason=f"{type(exc).__name__}: {exc}", fatal=True)
        result.gpu_seconds = time.perf_counter() - started
        return result

    def _evaluate(self, request: Evaluate) -> EvalResult:
        state = self._state()
        try:
            candidate = self._kernel(request.candidate)
        except self.drv.Error as exc:
            return EvalResult(ok=False, failure="launch", reason=f"cannot load the kernel: {exc}")
        checks: list[SetCheck] = []
        for index, device_set in enumerate(state.sets):
            failure = self._run_checked(candidate, device_set, checks)
            if failure is not None:
                return failure
            if index == 0:
                for name, buffer in state.outputs.items():
                    self.drv.memcpy_dtod_async(state.first_outputs[name], buffer.ptr, buffer.nbytes, self.stream)
        failure = self._run_checked(candidate, state.sets[0], checks, label=f"{state.sets[0].name} (second run)")
        if failure is not None:
            failure.reason = "the second run on the same inputs disagrees (a race?): " + failure.reason
            return failure
        deterministic = all(
            self._count_diff(buffer.ptr, int(state.first_outputs[name]), 0, buffer.nbytes)[0] == 0
            for name, buffer in state.outputs.items()
        )
        result = EvalResult(ok=True, checks=checks, deterministic=deterministic)
        if request.time_it:
            self._time(request, candidate, result)
        return result

    def _run_checked(
        self, kernel: LoadedKernel, device_set: DeviceSet, checks: list[SetCheck], label: str | None = None
    ) -> EvalResult | None:
        """Poison, launch, and check one set; a failed result, or None when the set passed."""
        self._poison_outputs()
        self._launch(kernel, device_set)
        self._sync()
        stray = self._stray_writes()
        if stray:
            return EvalResult(ok=False, failure="cheat", reason=stray, checks=checks, fatal=True)
        modified = self._modified_inputs(device_set)
        if modified:
            return EvalResult(ok=False, failure="cheat", reason=modified, checks=checks, fatal=True)
        check = self._compare(device_set)
        if label:
            check.name = label
        checks.append(check)
        if not check.ok:
            return EvalResult(ok=False, failure="mismatch", reason=f"set {check.name}: {check.reason}", checks=checks)
        return None

    def _time(self, request: Evaluate, candidate: LoadedKernel, result: EvalResult) -> None:
        """Interleaved, L2-flushed timing of candidate and baseline on the first set, then the checks on it."""
        state = self._state()
        settings = state.settings
        first = state.sets[0]
        kernels = [("candidate", candidate)]
        if request.baseline is not None:
            kernels.append(("baseline", self._kernel(request.baseline)))
        samples: dict[str, list[float]] = {name: [] for name, _ in kernels}
        for _, kernel in kernels:  # warm-up: module load, instruction cache, clocks
            for _ in range(3):
                self._launch(kernel, first)
        self._sync()
        started = time.perf_counter()
        batch = 10
        while True:
            events = []
            for i in range(batch):
                for name, kernel in kernels if i % 2 == 0 else kernels[::-1]:
                    if name == "candidate":
                        self._poison_outputs()
                    self.drv.memset_d32_async(state.scratch, i, settings.flush_bytes // 4, self.stream)
                    begin, end = self.drv.Event(), self.drv.Event()
                    begin.record(self.stream)
                    self._launch(kernel, first)
                    end.record(self.stream)
                    events.append((name, begin, end))
            self._sync()
            for name, begin, end in events:
                samples[name].append(end.time_since(begin) * 1000.0)
            reps = len(samples["candidate"])
            settled = all(_median_settled(s, settings.target_rel_error) for s in samples.values())
            spent = time.perf_counter() - started
            if reps >= settings.max_reps or spent > settings.timing_budget_s or (reps >= settings.min_reps and settled):
                break
        # Batches are even, so the candidate ran last (on poisoned outputs): its final timed output must
        # still be right, or it skipped work on repeats.
        check = self._compare(first)
        if not check.ok:
            result.ok, result.failure = False, FailureKind.CHEAT
            result.reason = f"its output during the timed runs was wrong: {check.reason}"
            return
        result.candidate = _robust_stats(samples["candidate"])
        if "baseline" in samples:
            result.baseline = _robust_stats(samples["baseline"])
            result.speedup = result.baseline.median_us / result.candidate.median_us
        seconds = result.candidate.median_us * 1e-6
        if request.bytes_moved:
            result.achieved_gbps = request.bytes_moved / seconds / 1e9
        if request.flops:
            result.achieved_tflops = request.flops / seconds / 1e12

    # -- ceilings ------------------------------------------------------------------------------------
    def measure_ceilings(self, request: MeasureCeilings) -> Ceilings:
        helpers = self._helpers(request.helpers_cubin)
        attr = self.drv.device_attribute
        sms = self.device.get_attribute(attr.MULTIPROCESSOR_COUNT)
        nbytes = 1 << 30
        src, dst = self.drv.mem_alloc(nbytes), self.drv.mem_alloc(nbytes)
        self.drv.memset_d32(src, 0x3F800000, nbytes // 4)
        copy = helpers.get_function("kf_copy")
        copy_us = self._median_us(lambda: self.drv.memcpy_dtod_async(dst, src, nbytes, self.stream), 20)
        for waves in (2, 4, 8, 16):  # the best of several launch shapes, and of the driver's own copy
            grid = (sms * waves, 1, 1)
            copy_us = min(copy_us, self._median_us(
                lambda grid=grid: copy(src, dst, np.int64(nbytes // 16), block=(256, 1, 1), grid=grid,
                                       stream=self.stream), 20))  # fmt: skip
        fma = helpers.get_function("kf_fma_peak")
        iters, threads = 1 << 14, 256
        fma_tflops = 0.0
        for blocks in (sms * 4, sms * 8, sms * 16):
            us = self._median_us(
                lambda blocks=blocks: fma(dst, np.int32(iters), np.float32(1.0), block=(threads, 1, 1),
                                          grid=(blocks, 1, 1), stream=self.stream), 10)  # fmt: skip
            fma_tflops = max(fma_tflops, 2 * 8 * iters * blocks * threads / (us * 1e-6) / 1e12)
        major, minor = self.device.compute_capability()
        return Ceilings(
            gpu_name=self.device.name(),
            copy_gbps=2 * nbytes / (copy_us * 1e-6) / 1e9,
            fma_tflops=fma_tflops,
            capability=(major, minor),
            sm_count=sms,
            l2_bytes=self.device.get_attribute(attr.L2_CACHE_SIZE),
        )

    def _median_us(self, run: Any, reps: int) -> float:
        for _ in range(3):
            run()
        times = []
        for _ in range(reps):
            begin, end = self.drv.Event(), self.drv.Event()
            begin.record(self.stream)
            run()
            end.record(self.stream)
            end.synchronize()
            times.append(end.time_since(begin) * 1000.0)
        return float(np.median(times))


def _nbytes(tensor: TensorSpec, spec: OperatorCard) -> int:
    return tensor.numel(spec.sizes) * NUMPY[tensor.dtype].itemsize


def _row_of(index: int, dims: tuple[int, ...]) -> str:
    if len(dims) < 2:
        return ""
    return f", row {index // math.prod(dims[1:])}"


def _memset_pattern(drv: Any, ptr: int, nbytes: int, dtype: str, stream: Any) -> None:
    """Fill a buffer with the dtype's poison pattern (NaN for floats)."""
    itemsize = NUMPY[dtype].itemsize
    bits = POISON_BITS[dtype]
    if itemsize == 1:
        drv.memset_d8_async(ptr, bits, nbytes, stream)
    elif itemsize == 2:
        drv.memset_d16_async(ptr, bits, nbytes // 2, stream)
    elif itemsize == 4:
        drv.memset_d32_async(ptr, bits, nbytes // 4, stream)
    else:  # 8-byte types: a repeated 16-bit NaN prefix is still a NaN double, and an unlikely integer
        drv.memset_d16_async(ptr, bits >> 48, nbytes // 2, stream)


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer requests until stdin closes; exit at once after a fatal result."""
    worker = Worker()
    for line in requests:
        if not line.strip():
            continue
        request = RequestEnvelope.model_validate_json(line).request
        if isinstance(request, Crash):
            os._exit(7)
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
