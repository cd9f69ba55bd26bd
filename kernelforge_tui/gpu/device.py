"""The CUDA primitives the GPU worker is built from: its context and stream, guarded buffers, byte and value
comparisons run on the GPU by the trusted helper kernels, output fills, and the ceilings measurement.

Why apart from `worker.py`: the worker decides what runs and what is checked; this only moves and compares
bytes. pycuda's driver module is handed in by the worker, the one module that imports pycuda.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from kernelforge_tui.cards.dtypes import NUMPY, POISON_BITS
from kernelforge_tui.cards.model import Tolerance
from kernelforge_tui.gpu.checks import CompareCounts
from kernelforge_tui.vocabulary.evaluation import Ceilings

GUARD_BYTES = 64 * 1024
"""Canary bytes before and after every candidate-visible buffer: a write past the end lands here."""
CANARY = 0xA7
RECORD_WORDS = 8
"""A helper's result record in 8-byte words: CompareResult (three counters, two doubles as bits, three more
counters), or kf_count_diff's count and first index in its first two words."""
RECORD_BYTES = 8 * RECORD_WORDS


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
class Records:
    """Result records of the helper kernels on the device, one per check, read back in one copy: the checks of
    many launches queue on the stream with no wait between them."""

    alloc: Any
    count: int

    def ptr(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise IndexError(f"record {index} of {self.count}")
        return int(self.alloc) + index * RECORD_BYTES


class GpuDevice:
    """One GPU's context, stream and helper kernels (`helpers.cu`), and what the worker does with them."""

    def __init__(self, drv: Any) -> None:
        """`drv`: pycuda.driver, imported by the worker."""
        drv.init()
        self.drv = drv
        self.device = drv.Device(int(os.environ.get("KERNELFORGE_WORKER_DEVICE", "0")))
        self.context = self.device.make_context()
        self.stream = drv.Stream()
        self.helpers: Any = None
        self.helpers_path: Path | None = None
        self.record = self.records(1)
        """The record of the checks that are read at once (`count_diff`, `compare`)."""

    def load_helpers(self, path: Path) -> Any:
        """The helper kernels' module, loaded once per cubin."""
        if self.helpers_path != path:
            self.helpers = self.drv.module_from_file(str(path))
            self.helpers_path = path
        return self.helpers

    def close(self) -> None:
        self.context.pop()

    # -- memory ----------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Any:
        return self.drv.mem_alloc(max(nbytes, 1))

    def guarded(self, nbytes: int) -> Guarded:
        buffer = Guarded(self.drv.mem_alloc(nbytes + 2 * GUARD_BYTES), nbytes)
        self.drv.memset_d8(int(buffer.alloc), CANARY, GUARD_BYTES)
        self.drv.memset_d8(buffer.ptr + nbytes, CANARY, GUARD_BYTES)
        return buffer

    def records(self, count: int) -> Records:
        return Records(self.drv.mem_alloc(count * RECORD_BYTES), count)

    def read(self, records: Records, count: int) -> np.ndarray:
        """The first `count` records, as uint64 words (count x RECORD_WORDS), once the stream has finished."""
        host = np.zeros((count, RECORD_WORDS), dtype=np.uint64)
        self.drv.memcpy_dtoh_async(host, records.alloc, self.stream)
        self.sync()
        return host

    def poison(self, ptr: int, nbytes: int, dtype: str) -> None:
        """Fill a buffer with the dtype's poison pattern (NaN for floats), on the stream."""
        itemsize = NUMPY[dtype].itemsize
        bits = POISON_BITS[dtype]
        if itemsize == 1:
            self.drv.memset_d8_async(ptr, bits, nbytes, self.stream)
        elif itemsize == 2:
            self.drv.memset_d16_async(ptr, bits, nbytes // 2, self.stream)
        elif itemsize == 4:
            self.drv.memset_d32_async(ptr, bits, nbytes // 4, self.stream)
        else:  # 8-byte types: their pattern repeats 16 bits (a NaN double, an unlikely integer)
            self.drv.memset_d16_async(ptr, bits & 0xFFFF, nbytes // 2, self.stream)

    def noise(self, ptr: int, numel: int, dtype: str, seed: int) -> None:
        """Fill a buffer with random finite values drawn from `seed` (`kf_noise_<dtype>`), on the stream."""
        fn = self.helpers.get_function(f"kf_noise_{dtype}")
        grid = self.grid_for(numel)
        fn(np.uintp(ptr), np.int64(numel), np.uint64(seed), block=(256, 1, 1), grid=grid, stream=self.stream)

    def copy(self, dst: Any, src: Any, nbytes: int) -> None:
        """Device to device, on the stream."""
        self.drv.memcpy_dtod_async(dst, src, nbytes, self.stream)

    def sync(self) -> None:
        """Wait for the stream; a CUDA error here came from a candidate (CandidateFault)."""
        try:
            self.stream.synchronize()
        except self.drv.Error as exc:
            raise CandidateFault(str(exc)) from None

    # -- comparisons on the GPU ------------------------------------------------------------------------------
    def grid_for(self, n: int) -> tuple[int, int, int]:
        sms = int(self.device.get_attribute(self.drv.device_attribute.MULTIPROCESSOR_COUNT))
        return (max(1, min((n + 255) // 256, sms * 8)), 1, 1)

    def _clear(self, record: int, first_word: int) -> None:
        """Zero a record but for the word of the first bad index, all ones: what the helpers count into."""
        self.drv.memset_d32_async(record, 0, RECORD_WORDS * 2, self.stream)
        self.drv.memset_d32_async(record + 8 * first_word, 0xFFFFFFFF, 2, self.stream)

    def queue_count_diff(self, record: int, a: int, b: int | None, value: int, nbytes: int) -> None:
        """Count into `record` (words 0 and 1) the bytes where a differs from b (or from a constant byte)."""
        self._clear(record, first_word=1)
        fn = self.helpers.get_function("kf_count_diff")
        fn(
            np.uintp(a),
            np.uintp(b or 0),
            np.uint8(value),
            np.int64(nbytes),
            np.uintp(record),
            block=(256, 1, 1),
            grid=self.grid_for(nbytes),
            stream=self.stream,
        )

    def count_diff(self, a: int, b: int | None, value: int, nbytes: int) -> tuple[int, int]:
        """(how many bytes differ, the first one) between a and b (or a and a constant byte)."""
        self.queue_count_diff(self.record.ptr(0), a, b, value, nbytes)
        words = self.read(self.record, 1)[0]
        return int(words[0]), int(words[1])

    def stray_writes(self, buffers: list[tuple[str, Guarded]]) -> str:
        """Describe the first write into a canary region of the labelled buffers, or return ''."""
        for label, buffer in buffers:
            before, _ = self.count_diff(int(buffer.alloc), None, CANARY, GUARD_BYTES)
            after, first = self.count_diff(buffer.ptr + buffer.nbytes, None, CANARY, GUARD_BYTES)
            if before or after:
                where = f"{after} bytes past the end (first at +{first})" if after else f"{before} bytes before it"
                return f"wrote outside its buffers: {where} of {label}"
        return ""

    def queue_compare(self, record: int, out: int, reference: Any, numel: int, dtype: str, tol: Tolerance) -> None:
        """Count into `record` how a floating-point output differs from its reference (`kf_compare_<dtype>`)."""
        self._clear(record, first_word=2)
        fn = self.helpers.get_function(f"kf_compare_{dtype}")
        fn(
            np.uintp(out),
            np.uintp(int(reference)),
            np.int64(numel),
            np.float64(tol.rtol),
            np.float64(tol.atol),
            np.uint64(POISON_BITS[dtype]),
            np.uintp(record),
            block=(256, 1, 1),
            grid=self.grid_for(numel),
            stream=self.stream,
        )

    def compare(self, out: int, reference: Any, numel: int, dtype: str, tol: Tolerance) -> CompareCounts:
        """A floating-point output against its reference within the tolerance, read at once."""
        self.queue_compare(self.record.ptr(0), out, reference, numel, dtype, tol)
        return CompareCounts.from_words(self.read(self.record, 1)[0])

    # -- ceilings --------------------------------------------------------------------------------------------
    def measure_ceilings(self, helpers_cubin: Path) -> Ceilings:
        """Copy bandwidth and FP32 FMA rate: the best of several launch shapes (and of the driver's own copy); with
        them the SM's resources as the driver reports them (the agents' prompts describe the GPU from these)."""
        helpers = self.load_helpers(helpers_cubin)
        attr = self.drv.device_attribute
        sms = self.device.get_attribute(attr.MULTIPROCESSOR_COUNT)
        nbytes = 1 << 30
        src, dst = self.drv.mem_alloc(nbytes), self.drv.mem_alloc(nbytes)
        self.drv.memset_d32(src, 0x3F800000, nbytes // 4)
        copy = helpers.get_function("kf_copy")
        copy_us = self._median_us(lambda: self.drv.memcpy_dtod_async(dst, src, nbytes, self.stream), 20)
        n16 = np.int64(nbytes // 16)
        for waves in (2, 4, 8, 16):
            grid = (sms * waves, 1, 1)
            launch = partial(copy, src, dst, n16, block=(256, 1, 1), grid=grid, stream=self.stream)
            copy_us = min(copy_us, self._median_us(launch, 20))
        fma = helpers.get_function("kf_fma_peak")
        iters, threads = 1 << 14, 256
        fma_tflops = 0.0
        for blocks in (sms * 4, sms * 8, sms * 16):
            grid = (blocks, 1, 1)
            launch = partial(
                fma, dst, np.int32(iters), np.float32(1.0), block=(threads, 1, 1), grid=grid, stream=self.stream
            )
            us = self._median_us(launch, 10)
            fma_tflops = max(fma_tflops, 2 * 8 * iters * blocks * threads / (us * 1e-6) / 1e12)
        major, minor = self.device.compute_capability()
        return Ceilings(
            gpu_name=self.device.name(),
            copy_gbps=2 * nbytes / (copy_us * 1e-6) / 1e9,
            fma_tflops=fma_tflops,
            capability=(major, minor),
            sm_count=sms,
            l2_bytes=self.device.get_attribute(attr.L2_CACHE_SIZE),
            shared_per_sm_bytes=self.device.get_attribute(attr.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
            shared_per_block_bytes=self.device.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            registers_per_sm=self.device.get_attribute(attr.MAX_REGISTERS_PER_MULTIPROCESSOR),
            threads_per_sm=self.device.get_attribute(attr.MAX_THREADS_PER_MULTIPROCESSOR),
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
