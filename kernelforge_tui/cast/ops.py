"""Each packaged kernel as an operator of its own, `torch.ops.kernelforge.<name>`: what a compiled graph calls in
place of the aten call the kernel was proven for (`cast.compiled`), and what a person may call directly.

The operator takes the kernel's input tensors (the guard's, in its order) and returns its outputs, fresh tensors
from torch's allocator, launched on torch's current stream through the runtime's own launch (`KernelRunner.run`):
no host sync, no allocation outside torch, one driver call (`cuLaunchKernelEx`, which a CUDA graph captures like
any launch). Its guard is the package's (`KernelRunner.check`), decided once per signature of its tensors (shape,
strides, dtype, device) and kept; per call only the pointers' alignment is checked. A call its guard refuses (another
shape or dtype, a misaligned view, another device or architecture, a disabled kernel) runs the original aten
call, with the guard's scalar arguments, and is counted with its reason. Its fake implementation gives the
outputs' shapes, strides and dtypes from the guard for the proven signature, and the original operator's for any
other (FakeTensorMode, `torch.compile`).

The operators live as long as the process (a compiled graph may outlive the package's `with` block): each is named
by its kernel's content (guard, launch and cubin digest), so a package opened again finds its operators defined and
points them at its own runners.
"""

from __future__ import annotations

import hashlib
import keyword
import re
import threading
from typing import TYPE_CHECKING, Any

from kernelforge_tui.cast.runtime import KernelRunner, _count, aten_call, tensors_signature

if TYPE_CHECKING:
    import torch

NAMESPACE = "kernelforge"

_OPS: dict[str, KernelOp] = {}
_LOCK = threading.Lock()
_LIBRARY: list[Any] = []
"""The one torch.library fragment of the namespace, made at the first operator (kept: compiled graphs call it)."""


def op_name(runner: KernelRunner) -> str:
    """`_softmax_<12 hex>`: the overload's name and a digest of what the kernel is (its guard, its launch, its
    cubin): one name for one kernel, across packages."""
    entry = runner.entry
    cubin = entry.files.sha256.get(entry.files.cubin, entry.files.cubin)
    text = f"{entry.guard.model_dump_json()}|{entry.launch.model_dump_json()}|{cubin}"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", entry.guard.overload.partition("::")[2].partition(".")[0]) or "kernel"
    return f"{stem}_{digest}"


def _parameter(name: str, taken: set[str]) -> str:
    """A card tensor's name as a schema parameter: an identifier, not a keyword, unique."""
    made = re.sub(r"\W", "_", name) or "t"
    if made[0].isdigit() or keyword.iskeyword(made):
        made = f"t_{made}"
    while made in taken:
        made += "_"
    taken.add(made)
    return made


class KernelOp:
    """One kernel as `torch.ops.kernelforge.<name>.default`: the guarded launch, its fallback, its fake."""

    def __init__(self, name: str, runner: KernelRunner) -> None:
        self.name = name
        self.runner = runner
        """The package's runner this operator launches (the latest package opened with this kernel)."""
        self.decisions: dict[tuple[Any, ...], int | str] = {}
        """Per signature of the operator's tensors: the device index to launch on, or why the guard refuses it."""
        guard = runner.entry.guard
        taken: set[str] = set()
        self.inputs = [spec.name for _, spec, _ in runner.tensor_args]
        params = ", ".join(f"Tensor {_parameter(n, taken)}" for n in self.inputs)
        returns = "Tensor" if len(guard.outputs) == 1 else f"({', '.join('Tensor' for _ in guard.outputs)})"
        self.schema = f"{name}({params}) -> {returns}"
        self.key = tuple((tuple(spec.shape), tuple(spec.strides), dtype) for _, spec, dtype in runner.tensor_args)
        """The proven signature's (shape, strides, dtype) per tensor, for the fake implementation."""
        self.layouts = [
            (tuple(t.shape), tuple(t.strides), dtype)
            for t, (_, dtype) in zip(guard.outputs, runner.outputs, strict=True)
        ]

    @property
    def overload(self) -> Any:
        """`torch.ops.kernelforge.<name>.default`."""
        import torch

        return getattr(getattr(torch.ops, NAMESPACE), self.name).default

    def original(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        """The aten call the kernel stands in for, with these tensors and the guard's scalar arguments."""
        op, args, kwargs = aten_call(self.runner.entry, dict(zip(self.inputs, tensors, strict=True)))
        return op(*args, **kwargs)

    def run(self, *tensors: torch.Tensor) -> Any:
        """The CPU and CUDA implementation: the kernel where its guard admits the call, else the original."""
        runner = self.runner
        try:
            decided = self.decisions[tensors_signature(tensors)]
        except KeyError:
            decided = self.decide(tensors)
        if isinstance(decided, int) and not runner.disabled:
            pointers: list[int] = []
            for t, alignment in zip(tensors, runner.alignments, strict=True):
                pointer = t.data_ptr()
                if pointer % alignment:
                    break
                pointers.append(pointer)
            else:
                result = runner.run(decided, list(tensors), pointers)
                runner.compiled_calls += 1
                return result
        return self.refused(tensors)

    def decide(self, tensors: tuple[torch.Tensor, ...]) -> int | str:
        """The guard's decision on this signature (kept for the next call): the device index, or why not."""
        _, args, kwargs = aten_call(self.runner.entry, dict(zip(self.inputs, tensors, strict=True)))
        admitted = self.runner.check(args, kwargs, "signature")
        decided: int | str = admitted if isinstance(admitted, str) else max(admitted[0].get_device(), 0)
        if len(self.decisions) < MAX_DECISIONS:
            self.decisions[tensors_signature(tensors)] = decided
        return decided

    def refused(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        """The original call, counted with the guard's reason for this very call (pointers included); its outputs
        laid out as the fake implementation says: the guard's strides (a channels-last card's output stays so),
        else contiguous."""
        _, args, kwargs = aten_call(self.runner.entry, dict(zip(self.inputs, tensors, strict=True)))
        reason = self.runner.check(args, kwargs)
        assert isinstance(reason, str), "a call refused by its signature, pointers or disabling is refused here"
        _count(self.runner.fallbacks, reason)
        result = self.original(tensors)
        if isinstance(result, tuple):
            return tuple(self._laid_out(t, layout) for t, layout in zip(result, self.layouts, strict=True))
        return self._laid_out(result, self.layouts[0])

    @staticmethod
    def _laid_out(t: torch.Tensor, layout: tuple[tuple[int, ...], tuple[int, ...], Any]) -> torch.Tensor:
        """`t` in the guard's strides where it has the guard's shape, else contiguous."""
        shape, strides, _ = layout
        if tuple(t.shape) != shape:
            return t.contiguous()
        if tuple(t.stride()) == strides:
            return t
        import torch

        return torch.empty_strided(shape, strides, dtype=t.dtype, device=t.device).copy_(t)

    def fake(self, *tensors: torch.Tensor) -> Any:
        """Outputs as the kernel writes them for the proven signature, else as the original operator's."""
        import torch

        if tuple((tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors) != self.key:
            return self.original(tensors)
        device = tensors[0].device
        outs = [
            torch.empty_strided(shape, strides, dtype=dtype, device=device) for shape, strides, dtype in self.layouts
        ]
        return outs[0] if len(outs) == 1 else tuple(outs)


MAX_DECISIONS = 256
"""Signatures whose decision an operator keeps."""


def kernel_op(runner: KernelRunner) -> KernelOp:
    """The operator of `runner`'s kernel, defined at its first use and pointed at this runner."""
    import torch

    name = op_name(runner)
    with _LOCK:
        op = _OPS.get(name)
        if op is not None:
            op.runner = runner
            op.decisions.clear()
            return op
        if not _LIBRARY:
            make_library: Any = torch.library.Library
            _LIBRARY.append(make_library(NAMESPACE, "FRAGMENT"))
        library = _LIBRARY[0]
        op = KernelOp(name, runner)
        library.define(op.schema)
        torch.library.register_fake(f"{NAMESPACE}::{name}", op.fake, lib=library)
        for key in ("CPU", "CUDA"):
            library.impl(name, op.run, key)
        _OPS[name] = op
        return op
