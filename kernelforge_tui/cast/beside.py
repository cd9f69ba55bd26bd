"""A searched kernel timed beside its suite task's vendor library, in one process, on the same torch tensors.

    echo '{"card_dir": "DIR", "cubin": "K.cubin", "launch": {...}, "reps": 100}' | python -m kernelforge_tui.cast.beside

Why: the search times a candidate in the GPU worker (its own CUDA context, every buffer an allocation of its own
with guard regions) and the bench times the vendor in torch's process (torch's allocator), so a ratio of the two
carries where each one's buffers lie. On the H200 that alone moved one cubin on one matrix by about 1% (spmv_csr,
2^22 rows: 467.5 us in exact allocations, 473 in guarded ones, 471.5 in allocations rounded to 2 MB). Here the
kernel and the vendor read the very same input tensors and are interleaved, as the worker interleaves a candidate
with its baseline (`vendor_timing.time_interleaved`: the L2 flushed before every call, the order turned every other
repetition), so the ratio holds nothing but the two implementations. The kernel runs through the runtime's own
launch (`cast.driver`, on torch's current stream), as an exported package runs it; its outputs, NaN (or -1) before
the launch, must match the card's references at its tolerance, and the vendor's too, or nothing is timed.

Speaks as `vendor_timing` does: one request line (JSON) in, one reply line out, until stdin closes; the bench keeps
it in a `VendorTimer` with this module as the command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from kernelforge_tui.cards.dtypes import FLOATING, NUMPY
from kernelforge_tui.cards.plan import ResolvedLaunch
from kernelforge_tui.cast.driver import driver
from kernelforge_tui.cast.manifest import launch_arg
from kernelforge_tui.suite.vendor_timing import (
    VendorCall,
    VendorReply,
    VendorRequest,
    serve,
    time_interleaved,
    to_torch,
    vendor_call,
)


class BesideRequest(VendorRequest):
    cubin: Path
    """The kernel, built for this GPU."""
    launch: ResolvedLaunch
    """Its launch on the card, resolved (grid, block, shared memory, the arguments in order)."""


class BesideReply(VendorReply):
    """The vendor's fields as `vendor_timing` fills them, and the kernel's."""

    kernel_samples_us: list[float] = Field(default_factory=list)
    """Every timed launch of the kernel, in order (interleaved with `samples_us`)."""
    kernel_agrees: bool | None = None
    kernel_check: str = ""


def time_beside(request: BesideRequest) -> BesideReply:
    """Check the kernel and the vendor on the card's first set, then time both, interleaved (module docstring)."""
    reply = BesideReply()
    if not request.device.startswith("cuda"):
        reply.error = f"a kernel runs on a GPU: device {request.device!r} cannot time one"
        return reply
    prepared = vendor_call(request, reply)
    if prepared is None:
        return reply
    try:
        reply.agrees, reply.check = prepared.check()
        kernel, outputs = kernel_call(prepared, request)
        kernel()
        reply.kernel_agrees, reply.kernel_check = prepared.agrees(outputs)
        if reply.agrees and reply.kernel_agrees:
            samples = time_interleaved(prepared.torch, {"vendor": prepared.call, "kernel": kernel}, request)
            reply.samples_us, reply.kernel_samples_us = samples["vendor"], samples["kernel"]
    except Exception as exc:  # a call that fails, a kernel that does not load or faults: said, nothing timed
        reply.error = f"{type(exc).__name__}: {exc}"
    return reply


def kernel_call(prepared: VendorCall, request: BesideRequest) -> tuple[Callable[[], None], dict[str, Any]]:
    """The kernel's launch on the vendor's input tensors, and its output tensors (poisoned: NaN for floats, -1 for
    integers, so a kernel that skips an element is caught by the check)."""
    torch, spec, launch = prepared.torch, prepared.card.spec, request.launch
    sizes = dict(spec.sizes)
    outputs = {
        t.name: to_torch(
            torch, np.full(t.dims(sizes), np.nan if t.dtype in FLOATING else -1, dtype=NUMPY[t.dtype]), request.device
        )
        for t in spec.outputs
    }
    tensors = {**prepared.tensors, **outputs}
    args = [launch_arg(a) for a in launch.args]
    missing = [a.name for a in args if a.kind == "tensor" and a.name not in tensors]
    if missing:
        raise ValueError(f"the launch names tensors the card does not have: {', '.join(missing)}")
    device = torch.cuda.current_device()
    binding = driver()
    function = binding.load(device, request.cubin.read_bytes(), launch.entry, launch.shared_bytes, args)
    pointers = [int(tensors[a.name].data_ptr()) for a in args if a.kind == "tensor"]
    stream = int(torch.cuda.current_stream(device).cuda_stream)

    def run() -> None:
        binding.launch(function, launch.grid, launch.block, launch.shared_bytes, stream, pointers)

    return run, outputs


def main() -> int:
    return serve(lambda line: time_beside(BesideRequest.model_validate_json(line)), lambda why: BesideReply(error=why))


if __name__ == "__main__":
    sys.exit(main())
