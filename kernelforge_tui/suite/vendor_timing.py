"""Time a suite task's vendor implementation (cuBLAS, cuSPARSE, cuFFT, CUB through torch) on a card's inputs.

    echo '{"card_dir": "DIR", "reps": 100}' | python -m kernelforge_tui.suite.vendor_timing

Why a subprocess: torch is an optional extra that only suite/, capture/ and cast/ may import, and a vendor call that
faults must not take the bench with it. Each request line on stdin gets one reply line (JSON) on stdout, until stdin
closes: the bench keeps one such process per GPU, so torch's import and CUDA start-up (seconds) are paid once, not
once per card. The reply holds every timed launch; the bench summarises them with the worker's statistics
(`gpu.statistics.robust_stats`), so ours and the vendor's medians are read the same way.

Timed the way the GPU worker times kernels (`time_interleaved`): on the card's first input set, three untimed
warm-up calls, then each call between a pair of CUDA events on the current stream, the L2 evicted before every call
by writing a scratch buffer larger than it (`EvalSettings.flush_bytes`, a different value each time, as the worker's
memset does), in batches of ten synchronised once. The worker interleaves a candidate with the card's baseline;
here a vendor call has no partner, so its repetitions run back to back (`cast.beside` gives it our kernel as one, on
the same tensors). The vendor's outputs are checked against the card's reference at the card's tolerance (integer
outputs exactly), and the reply says whether they agree and where not.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.directory import Arrays, Card, load_card
from kernelforge_tui.cards.dtypes import FLOATING, NUMPY
from kernelforge_tui.config import EvalSettings
from kernelforge_tui.errors import install_fix
from kernelforge_tui.suite.registry import task as suite_task
from kernelforge_tui.suite.task import Task

WARMUP = 3
BATCH = 10


class VendorRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    card_dir: Path
    reps: int = Field(default=100, ge=1)
    """Timed calls (after the warm-up)."""
    device: str = "cuda"
    """"cuda:N" times on GPU N (a bench's other GPUs run other cards); "cpu" checks the vendor's outputs without
    timing them (tests, machines without a GPU)."""
    flush_bytes: int = EvalSettings().flush_bytes


class VendorReply(BaseModel):
    library: str = ""
    samples_us: list[float] = Field(default_factory=list)
    """Every timed call in order (none on the CPU)."""
    agrees: bool | None = None
    """The vendor's outputs match the card's reference (None when they were not compared)."""
    check: str = ""
    """What the comparison found, in words."""
    error: str = ""
    """Why nothing could be timed or compared (no torch, no vendor for the task, a failing call)."""


def task_of(card: Card) -> Task:
    """The suite task a card was written from (its name is `<task>_<precision>_s<log2 scale>`)."""
    name = card.spec.name.rsplit("_", 2)[0]
    return suite_task(name)


def to_torch(torch: Any, array: np.ndarray, device: str) -> Any:
    """A NumPy array as a torch tensor on `device`; bf16 goes through its 16-bit pattern (torch reads no ml_dtypes)."""
    if array.dtype == NUMPY["bfloat16"]:
        bits = torch.from_numpy(np.ascontiguousarray(array).view(np.int16))
        return bits.view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


def to_numpy(torch: Any, tensor: Any) -> np.ndarray:
    tensor = tensor.detach().contiguous().cpu()
    if tensor.dtype == torch.bfloat16:
        return np.asarray(tensor.view(torch.int16).numpy().view(NUMPY["bfloat16"]))
    return np.asarray(tensor.numpy())


def agreement(card: Card, outputs: Mapping[str, np.ndarray], references: Arrays) -> tuple[bool, str]:
    """Whether the vendor's outputs match the references: floats within the card's tolerance (the rule the worker
    applies), integers exactly; and what was found, in words."""
    problems = []
    for spec in card.spec.outputs:
        if spec.name not in outputs:
            problems.append(f"{spec.name}: the vendor returned no such output")
            continue
        got, want = np.asarray(outputs[spec.name]), references[spec.name]
        if got.size != want.size:
            problems.append(f"{spec.name}: {got.size} elements, the card has {want.size}")
            continue
        got = got.reshape(want.shape)
        if spec.dtype in FLOATING:
            tolerance = spec.effective_tolerance()
            bad = int(np.count_nonzero(~tolerance.accepts(got, want)))
            if bad:
                problems.append(
                    f"{spec.name}: {bad} of {want.size} elements outside rtol={tolerance.rtol:g}, "
                    f"atol={tolerance.atol:g}"
                )
        else:
            bad = int(np.count_nonzero(got.astype(np.int64) != want.astype(np.int64)))
            if bad:
                problems.append(f"{spec.name}: {bad} of {want.size} elements differ (integers must match exactly)")
    if problems:
        return False, "; ".join(problems)
    return True, "every output matches the card's reference at its tolerance"


@dataclass
class VendorCall:
    """The vendor's call on a card's first input set, as torch tensors on the request's device."""

    card: Card
    torch: Any
    tensors: dict[str, Any]
    references: Arrays
    call: Callable[[], Mapping[str, Any]]

    def check(self) -> tuple[bool, str]:
        """One call's outputs against the card's references."""
        return self.agrees(self.call())

    def agrees(self, outputs: Mapping[str, Any]) -> tuple[bool, str]:
        """Output tensors (the vendor's, or a kernel's on the same inputs) against the card's references
        (`agreement`)."""
        return agreement(self.card, {k: to_numpy(self.torch, v) for k, v in outputs.items()}, self.references)


def vendor_call(request: VendorRequest, reply: VendorReply) -> VendorCall | None:
    """The card's vendor call, ready to run; None, with the reply's error saying why, where there is none (no
    vendor for the task, no torch). Sets the reply's library, and the current GPU for `cuda:N`."""
    card = load_card(request.card_dir)
    task = task_of(card)
    vendor = task.vendor
    if vendor is None:
        reply.error = f"task {task.name} has no vendor implementation"
        return None
    reply.library = vendor.library
    try:
        import torch
    except ImportError:
        reply.error = f"torch is not installed here: {install_fix('torch')} to time the vendor libraries"
        return None
    if request.device.startswith("cuda:"):
        torch.cuda.set_device(request.device)  # the events and synchronisations of `time_interleaved` act on this GPU
    inputs, references = card.input_set(card.spec.input_sets[0])
    tensors = {name: to_torch(torch, array, request.device) for name, array in inputs.items()}
    sizes = dict(card.spec.sizes)
    return VendorCall(card, torch, tensors, references, lambda: vendor.run(torch, tensors, sizes))


def time_vendor(request: VendorRequest) -> VendorReply:
    """Check and time the vendor's implementation of the card's task (see the module's docstring)."""
    reply = VendorReply()
    prepared = vendor_call(request, reply)
    if prepared is None:
        return reply
    try:
        reply.agrees, reply.check = prepared.check()
        if request.device.startswith("cuda"):
            reply.samples_us = time_calls(prepared.torch, prepared.call, request)
    except Exception as exc:  # the vendor call itself failed (an unsupported dtype, out of memory): say so
        reply.error = f"{type(exc).__name__}: {exc}"
    return reply


def time_calls(torch: Any, call: Callable[[], object], request: VendorRequest) -> list[float]:
    """`request.reps` calls, each between CUDA events after the L2 flush, synchronised once per batch; in us."""
    return time_interleaved(torch, {"call": call}, request)["call"]


def time_interleaved(
    torch: Any, calls: Mapping[str, Callable[[], object]], request: VendorRequest
) -> dict[str, list[float]]:
    """`request.reps` timed calls of each, in us: every repetition runs each call once, between CUDA events after
    the L2 flush, the order turned every other repetition (as the worker interleaves a candidate and its baseline:
    neither always follows the other); synchronised once per batch of ten repetitions."""
    scratch = torch.empty(request.flush_bytes // 4, dtype=torch.int32, device=request.device)
    order = list(calls)
    for name in order:
        for _ in range(WARMUP):
            calls[name]()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in order}
    done = 0
    while done < request.reps:
        events = []
        for i in range(min(BATCH, request.reps - done)):
            for name in order if (done + i) % 2 == 0 else order[::-1]:
                scratch.fill_(done + i)
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                calls[name]()
                end.record()
                events.append((name, begin, end))
        torch.cuda.synchronize()
        for name, begin, end in events:
            samples[name].append(begin.elapsed_time(end) * 1000.0)
        done = len(samples[order[0]])
    return samples


def serve(answer: Callable[[str], BaseModel], failed: Callable[[str], BaseModel]) -> int:
    """Answer request lines from stdin, one reply line each, until stdin closes; a request that cannot be served
    (no such card, a bad line) is `failed(why)`'s reply, and the next one is served."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = answer(line)
        except Exception as exc:  # a bad request or card: said in the reply, the process serves the next one
            reply = failed(f"{type(exc).__name__}: {exc}")
        sys.stdout.write(reply.model_dump_json() + "\n")
        sys.stdout.flush()
    return 0


def main() -> int:
    return serve(lambda line: time_vendor(VendorRequest.model_validate_json(line)), lambda why: VendorReply(error=why))


if __name__ == "__main__":
    sys.exit(main())
