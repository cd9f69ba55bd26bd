"""The .cast runtime: `with kernelforge_tui.cast.load("model.cast"):` runs the package's kernels in place of exactly
the aten operator variants they were proven for, inside an unmodified PyTorch model.

How: for each aten overload the package covers, a kernel is registered for the CUDA dispatch key
(`torch.library`), and the overload's own CUDA kernel is kept (`torch.library.get_kernel`). Every call checks the
guard (the tensors' shapes, dtypes, strides, alignment and device, the scalar arguments, the device's
architecture); a call that passes runs the generated kernel on torch's current stream in torch's own context, with
outputs from torch's allocator; any other call goes to the original kernel. Leaving the `with` block restores the
operators. Counters say, per kernel, how many calls it ran and why others fell back; `report()` prints them. A
fused chain's kernel (`KernelEntry.chain`) stands for several calls, which eager PyTorch makes one at a time: it
registers no override, and only the compile path uses it (`cast.fused`).

The hot path (a hit) does per call only what changes between calls; everything else is decided once: the guard's
decision per call signature (each tensor's shape, strides, dtype and device, the other arguments as they are:
`signature_of`) is kept, so a call of a decided signature costs one dict lookup and, for a hit, its pointers against
the alignment (one modulo each); the output is `torch.empty_like` of an input of its shape, strides and dtype (else
`torch.empty`); the stream is torch's raw current stream (one C call); the launch writes the pointers into a
prepared argument block and makes one driver call with prepared arguments (`driver.ctypes_launcher`). A refused
signature costs the same lookup before the original kernel. A call the hot path does not take (keywords, a new
signature, a misaligned pointer) goes through the full guard (`KernelRunner.check`), which says why it refuses.
Where the compiled launcher is built (`cast.launcher`), a C++ kernel in front of this one replays these decisions
without entering Python (a hit's launch, a refusal's original kernel) and hands it only what it has not seen; its
counts are settled into these counters when they are read (`KERNELFORGE_CAST_LAUNCHER=off`: the Python path only).

Trust: a package is used only with a stamp that matches its contents and every member's sha256 checked, all at
`load()`, and only on a machine like the one it was verified on (architecture, driver major, CUDA, torch); anything
else is refused with what differs and the command that re-verifies it here. `KERNELFORGE_CAST=off`
turns everything off (the package is not even read). Shadow mode (`shadow_every=N` or `KERNELFORGE_CAST_SHADOW=N`)
also runs the original operator on one hit in N and disables, with a warning, a kernel that ever disagrees.

Needs torch and a CUDA driver binding (cuda-bindings or pycuda, `cast.driver`), and nothing else of kernelforge's
beyond `cast.manifest` and `cast.driver`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

import kernelforge_tui
from kernelforge_tui.cast import driver as drivers
from kernelforge_tui.cast import launcher as launchers
from kernelforge_tui.cast.manifest import (
    DEFAULT_LIMITS,
    VERIFY_HELP,
    AtenArg,
    CastError,
    Chain,
    KernelEntry,
    Machine,
    Package,
    ReadLimits,
    TensorGuard,
    Tolerance,
    kernel_line,
    read_package,
)

if TYPE_CHECKING:
    import torch

ENV_SWITCH = "KERNELFORGE_CAST"
"""`off` (or 0, false, no): load() returns an inactive Cast without reading the package; every call runs eagerly."""
ENV_SHADOW = "KERNELFORGE_CAST_SHADOW"
"""N: shadow mode, one hit in N also runs the original operator and is compared (when load() is given none)."""
OFF_VALUES = frozenset({"off", "0", "false", "no"})
MAX_REASONS = 16
"""Distinct fallback reasons kept per counter; more are counted under "other reasons"."""
MAX_DECISIONS = 256
"""Call signatures whose guard decision an overload keeps (a program with shapes without end decides the rest per
call)."""

Where = Literal["call", "signature", "graph"]
"""What `KernelRunner.check` sees: a call, a call's signature (pointers unchecked) or a graph node's FakeTensors."""

_ACTIVE: set[str] = set()
"""Overloads a Cast has registered in this process: two at once would chain unpredictably."""
_ACTIVE_LOCK = threading.Lock()
ACTIVE_CASTS: list[Cast] = []
"""The packages in force, innermost last: the one `torch.compile(backend="kernelforge")` uses when given none."""


# -- the machine ----------------------------------------------------------------------------------------------


def driver_version_text() -> str:
    """The NVIDIA driver version (570.124.06) from the kernel module, else the driver API's CUDA version."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text(errors="replace")
    except OSError:
        text = ""
    found = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
    if found:
        return found.group(1)
    version = drivers.driver().driver_version()
    return f"cuda{version // 1000}.{version % 1000 // 10}"


def probe_machine(device: int | None = None) -> Machine | None:
    """This machine as a package's stamp describes one, for `device` (default: torch's current); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device is None else device
    major, minor = torch.cuda.get_device_capability(index)
    return Machine(
        gpu_name=torch.cuda.get_device_name(index),
        capability=(major, minor),
        driver_version=driver_version_text(),
        cuda_version=str(torch.version.cuda or "none"),
        torch_version=str(torch.__version__),
        binding=drivers.driver().name,
        kernelforge_version=kernelforge_tui.__version__,
    )


# -- counters --------------------------------------------------------------------------------------------------


class KernelStats(BaseModel):
    kernel: str
    variant: str
    call: str
    hits: int
    fallbacks: dict[str, int]
    """Calls of this variant's shapes that fell back, by reason (misaligned, on another device, disabled, ...)."""
    shadow_checks: int = 0
    disabled: str = ""
    compiled_calls: int = 0
    """Calls of its kernelforge op that ran the kernel: a compiled graph's (once per capture under CUDA graphs,
    whose replays call nothing), or a direct call."""
    graph_nodes: int = 0
    """Nodes of compiled graphs the compile path gave to the kernel (`torch.compile(backend="kernelforge")`); a
    chain's kernel counts each chain it replaced once."""
    serves: list[str] = Field(default_factory=lambda: ["eager", "compile"])
    """Where it can run (`KernelEntry.serves`): a fused chain's kernel in compiled graphs only."""
    graph_refused: dict[str, int] = Field(default_factory=dict)
    """A chain's kernel: the chains of compiled graphs it matched and left to Inductor, by reason (a single
    kernel's are its overload's, `OverloadStats.graph_refused`)."""

    @property
    def used_in(self) -> str:
        """Where the kernel ran or was compiled in: eager, compile, both, or unused."""
        eager, compiled = self.hits > 0, self.graph_nodes > 0 or self.compiled_calls > 0
        return "both" if eager and compiled else "eager" if eager else "compile" if compiled else "unused"


class OverloadStats(BaseModel):
    overload: str
    uncovered: dict[str, int]
    """Calls no kernel's shapes and dtypes cover, by reason: they ran the original operator."""
    graph_refused: dict[str, int] = Field(default_factory=dict)
    """Nodes of compiled graphs the compile path left to Inductor, by reason."""


class CastStats(BaseModel):
    package: str
    active: bool
    note: str = ""
    """Why the package is not active (turned off, no CUDA device), or the machine it was verified on."""
    launcher: str = ""
    """How eager hits launch: "compiled" (the C++ launcher replays the guard's decisions), else "Python path: " and
    why (turned off, shadow mode, no compiler, a binding without function handles, not active)."""
    kernels: list[KernelStats] = Field(default_factory=list)
    overloads: list[OverloadStats] = Field(default_factory=list)

    @property
    def hits(self) -> int:
        return sum(k.hits for k in self.kernels)

    @property
    def fallbacks(self) -> int:
        return sum(sum(k.fallbacks.values()) for k in self.kernels) + sum(
            sum(o.uncovered.values()) for o in self.overloads
        )


Decision = tuple["KernelRunner | None", int, "Counter[str]", str]
"""The guard's decision for a call signature: (the runner, the device index, its fallbacks, "") for one it admits,
else (None, 0, the counter the refusal is counted in, why)."""


Signature = Callable[[tuple[Any, ...]], tuple[Any, ...]]
"""A call's arguments to what the guard's decision on them depends on (`signature_of`)."""


def signature_of(schema: Any) -> Signature:
    """The signature of a call of an operator with this schema (a FunctionSchema): what `check` decides on, the
    data pointers aside. Each tensor's (shape, strides, dtype, device); every other argument as it is, with its
    type where the schema says Scalar (the dispatcher hands an `int`, `bool` or `float` argument over as exactly
    that type, but a Scalar as the caller's bool, int or float, and True == 1 == 1.0 in a dict). Raises
    AttributeError for a number where the schema has a Tensor (a wrapped scalar), TypeError (when hashed) for an
    unhashable argument (a list), IndexError for too few arguments: the full guard decides those calls."""
    kinds = [str(a.type) for a in schema.arguments if not a.kwarg_only]  # Tensor, Optional[Tensor], number, ...
    tensors = tuple(i for i, kind in enumerate(kinds) if kind in ("Tensor", "Optional[Tensor]"))
    typed = tuple(i for i, kind in enumerate(kinds) if "number" in kind or "Scalar" in kind)
    if tensors == (0,) and not typed:  # most overloads: one tensor first, the rest plain

        def first(args: tuple[Any, ...]) -> tuple[Any, ...]:
            t = args[0]
            return (t.shape, t.stride(), t.dtype, t.device, args[1:])

        return first

    def general(args: tuple[Any, ...]) -> tuple[Any, ...]:
        parts = list(args)
        for i in tensors:
            if i < len(parts) and parts[i] is not None:
                t = parts[i]
                parts[i] = (t.shape, t.stride(), t.dtype, t.device)
        for i in typed:
            if i < len(parts):
                parts[i] = (type(parts[i]), parts[i])
        return tuple(parts)

    return general


def tensors_signature(tensors: tuple[Any, ...]) -> tuple[Any, ...]:
    """The signature of a call that passes tensors only (a kernelforge op's)."""
    if len(tensors) == 1:
        t = tensors[0]
        return (t.shape, t.stride(), t.dtype, t.device)
    return tuple([(t.shape, t.stride(), t.dtype, t.device) for t in tensors])


def _counted(counts: dict[str, int], prefix: str = "") -> list[str]:
    """A report's lines for counts by reason, the most frequent first."""
    return [f"      {n} x {prefix}{reason}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])]


def _count(counter: Counter[str], reason: str, calls: int = 1) -> None:
    if reason in counter or len(counter) < MAX_REASONS:
        counter[reason] += calls
    else:
        counter["other reasons"] += calls


# -- comparison ------------------------------------------------------------------------------------------------


def disagreement(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> str:
    """'' where `out` matches `ref` (eager) within the tolerance everywhere, as the checks at export decide: NaN
    only where eager is NaN, an infinity only where eager has the same; else what is wrong, in words."""
    import torch

    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"shape/dtype {tuple(out.shape)} {out.dtype} where eager gives {tuple(ref.shape)} {ref.dtype}"
    wide = torch.float64 if ref.dtype in (torch.float64, torch.float32) else torch.float32
    if not ref.is_floating_point():
        bad = int((out != ref).sum().item())
        return f"{bad} of {ref.numel()} elements differ (compared exactly)" if bad else ""
    o, e = out.to(wide), ref.to(wide)
    close = (o - e).abs() <= tol.atol + tol.rtol * e.abs()
    infinite = torch.isinf(e) | torch.isinf(o)
    ok = torch.where(torch.isnan(e), torch.isnan(o), torch.where(infinite, o == e, close))
    bad = int((~ok).sum().item())
    if not bad:
        return ""
    first = int((~ok).flatten().nonzero()[0].item())
    return (
        f"{bad} of {ref.numel()} elements outside rtol {tol.rtol:g}, atol {tol.atol:g} "
        f"(first at flat index {first}: {o.flatten()[first].item():.6g}, "
        f"where eager gives {e.flatten()[first].item():.6g})"
    )


# -- one kernel ------------------------------------------------------------------------------------------------


class _Missing:
    def __repr__(self) -> str:
        return "(not given)"


MISSING = _Missing()


_PLAIN = frozenset({bool, int, float, str, type(None), list})
_NUMBERS = (bool, int, float, complex)


def _plain(value: Any) -> Any:
    """A non-plain argument as the manifest writes it: a dtype, device, layout or memory format by its name, a tuple
    or a list subclass (an FX graph's immutable_list: `mean.dim`'s dims, `layer_norm`'s shape) as a list; anything
    else as it is (and then it matches nothing)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if type(value).__module__.startswith("torch"):
        return str(value).removeprefix("torch.")
    return value


def _accept_set(accepts: Sequence[Any]) -> frozenset[tuple[type, Any]] | None:
    """(type, value) pairs for a set lookup; None when a value is unhashable (a list): then compared one by one."""
    try:
        return frozenset((type(a), a) for a in accepts)
    except TypeError:
        return None


def _accepted(value: Any, accepted: frozenset[tuple[type, Any]] | None, accepts: Sequence[Any] = ()) -> bool:
    """Whether the value, of the same type, is one of the accepted (True is not 1 here)."""
    try:
        if accepted is not None:
            return (type(value), value) in accepted
    except TypeError:  # an unhashable value (a list) cannot be in a set of hashable ones
        return False
    return any(type(value) is type(a) and value == a for a in accepts)


def _argument(args: Sequence[Any], kwargs: dict[str, Any], spec: AtenArg) -> Any:
    if spec.position is not None and spec.position < len(args):
        return args[spec.position]
    if spec.name in kwargs:
        return kwargs[spec.name]
    return spec.default if spec.has_default else MISSING


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _merges(parts: Sequence[int], whole: Sequence[int]) -> bool:
    """Whether `whole` is `parts` with runs of neighbouring dims multiplied together (dims of 1 anywhere)."""
    rest = [p for p in parts if p != 1]
    for dim in (d for d in whole if d != 1):
        product = 1
        while rest and product < dim:
            product *= rest.pop(0)
        if product != dim:
            return False
    return not rest


def view_problem(tensor: TensorGuard) -> str:
    """'' when the kernel may take the call's tensor as it is: its strides row-major (dims of size 1 aside, as torch
    decides contiguity), or dense in another order whose memory the card's shape reads row-major (channels-last
    [n, c, h, w] as the card's [n, h * w, c]: capture holds such a tensor as it lies in memory), and its card shape
    the same number of elements. Then the card's view of it starts at the same address and lays the elements out in
    the same order, so the launch passes the tensor's own pointer and no copy is made. Else why not."""
    if len(tensor.strides) != len(tensor.shape):
        return f"{tensor.name} has {len(tensor.strides)} strides for {len(tensor.shape)} dims"
    dims = sorted((d for d in range(len(tensor.shape)) if tensor.shape[d] != 1), key=lambda d: -tensor.strides[d])
    step = 1
    for d in reversed(dims):
        if tensor.strides[d] != step:
            step = -1
            break
        step *= tensor.shape[d]
    row_major = dims == sorted(dims)
    if step < 0 or not (row_major or _merges([tensor.shape[d] for d in dims], tensor.kernel_shape)):
        return f"{tensor.name} has strides {list(tensor.strides)} for shape {list(tensor.shape)}, not row-major"
    if _numel(tensor.kernel_shape) != _numel(tensor.shape):
        return f"{tensor.name}'s card shape {list(tensor.kernel_shape)} does not hold the call's {list(tensor.shape)}"
    return ""


class KernelRunner:
    """One accepted kernel: its guard, its functions per device, and its counters.

    One guard, `check()`, for every path: a call (eager, through the override or the kernelforge op), a call's
    signature (what the hot path caches: everything but the data pointers, which it checks per call), and a node of
    a graph being compiled (FakeTensors: the alignment from the storage offset)."""

    def __init__(
        self,
        package: Package,
        entry: KernelEntry,
        binding: str | None = None,
        *,
        device_type: str = "cuda",
        driver: drivers.Driver | None = None,
    ) -> None:
        import torch

        self.entry = entry
        self.package = package
        self._binding = binding
        self._driver = driver
        self.device_type = device_type
        guard = entry.guard
        for tensor in [*guard.inputs, *guard.outputs]:
            problem = view_problem(tensor)
            if problem:
                raise CastError(f"{package.path}: kernel {entry.id}: {problem}: export it again")
        by_name = {t.name: t for t in guard.inputs}
        self.tensor_args: list[tuple[AtenArg, TensorGuard, torch.dtype]] = []
        self.scalar_args: list[tuple[AtenArg, frozenset[tuple[type, Any]] | None]] = []
        for arg in guard.args:
            if arg.tensor is not None:
                spec = by_name[arg.tensor]
                self.tensor_args.append((arg, spec, _torch_dtype(spec.dtype)))
            else:
                self.scalar_args.append((arg, _accept_set(arg.accepts)))
        self.on_cuda = device_type == "cuda"
        self.key = tuple(self.tensor_args[0][1].shape) if self.tensor_args else ()
        self.positional = 1 + max((a.position for a in guard.args if a.position is not None), default=-1)
        self.keywords = {a.name for a in guard.args if a.position is None}
        self.outputs = [(tuple(t.shape), _torch_dtype(t.dtype)) for t in guard.outputs]
        inputs = [spec.name for _, spec, _ in self.tensor_args]
        outputs = [t.name for t in guard.outputs]
        self.order: list[tuple[bool, int]] = []
        """Per tensor parameter of the kernel: (is an output, index among the inputs or the outputs)."""
        for param in entry.launch.args:
            if param.kind != "tensor":
                continue
            if param.name in outputs:
                self.order.append((True, outputs.index(param.name)))
            else:
                self.order.append((False, inputs.index(param.name)))
        self.single = len(self.outputs) == 1
        self.plan = tuple(len(inputs) + i if is_out else i for is_out, i in self.order)
        """Per tensor parameter of the kernel: its index among the inputs followed by the outputs."""
        self.functions: dict[int, Any] = {}
        self.capabilities: dict[int, tuple[int, int]] = {}
        self.hits = 0
        self.fallbacks: Counter[str] = Counter()
        self.shadow_checks = 0
        self.disabled = ""
        self.replays: list[launchers.Replay] = []
        """The compiled launcher's kernels that replay its calls (while its package is active)."""
        self._load_lock = threading.Lock()
        self.compiled_calls = 0
        """Calls of its kernelforge op that ran the kernel (a compiled graph's, or a direct call)."""
        self.graph_nodes = 0
        """Graph nodes the compile path replaced with its op."""
        self.graph_refused: Counter[str] = Counter()
        """A chain's kernel: the chains of compiled graphs it matched and left to Inductor, by reason."""
        # -- made once for the hot path --
        self._tensor_type = torch.Tensor
        self.launchers: dict[int, drivers.Launcher] = {}
        """Per device index: the driver's prepared launch (function, grid, block, shared memory, argument block)."""
        self.alignments = tuple(spec.alignment for _, spec, _ in self.tensor_args)
        self.placed: tuple[tuple[int, int], ...] | None = None
        """Each tensor argument's (position, alignment), where every one is positional: what the hot path takes
        from a call of a decided signature."""
        if all(arg.position is not None for arg, _, _ in self.tensor_args):
            self.placed = tuple((int(arg.position or 0), spec.alignment) for arg, spec, _ in self.tensor_args)
        self.alloc: list[tuple[int, tuple[int, ...], torch.dtype]] = []
        """Per output: the input whose shape, strides and dtype it has (-1: none), its shape and dtype. An output
        like an input is `torch.empty_like` of it (the cheapest allocation from Python), else `torch.empty`."""
        for spec, (shape, dtype) in zip(guard.outputs, self.outputs, strict=True):
            like = next(
                (
                    i
                    for i, (_, s, d) in enumerate(self.tensor_args)
                    if (tuple(s.shape), tuple(s.strides), d) == (shape, tuple(spec.strides), dtype)
                ),
                -1,
            )
            self.alloc.append((like, shape, dtype))
        self._like, self._shape, self._dtype = self.alloc[0] if self.alloc else (-1, (), torch.float32)
        self.in_order = self.plan == tuple(range(len(inputs) + len(outputs)))
        """The kernel takes every input in the guard's order, then every output."""
        self._empty_like = torch.empty_like
        self._empty = torch.empty
        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._stream: Callable[[int], int]
        if not self.on_cuda:
            self._stream = _no_stream
        elif raw_stream is not None:
            self._stream = raw_stream  # torch's current stream as its cudaStream_t, one C call
        else:
            self._stream = _current_stream

    # -- the guard ---------------------------------------------------------------------------------------------
    def check(self, args: Sequence[Any], kwargs: dict[str, Any], where: Where = "call") -> list[torch.Tensor] | str:
        """The call's input tensors when the guard admits it, else why not (one short reason). `where` says what
        the alignment is checked on: a call's data pointers; nothing, for a call's signature (the cached hot path
        checks the pointers of every call it takes); a graph's FakeTensors, their storage offsets (a storage starts
        aligned: torch's allocators give 512 bytes on CUDA, and the op checks the pointers again when it runs)."""
        tensors: list[torch.Tensor] = []
        for arg, spec, dtype in self.tensor_args:
            t = _argument(args, kwargs, arg)
            if not isinstance(t, self._tensor_type):
                return f"{arg.name} is not a tensor"
            if t.shape != spec.shape:
                return f"shape {arg.name}{list(t.shape)} (kernel: {list(spec.shape)})"
            if t.dtype is not dtype:
                return f"dtype {arg.name} {str(t.dtype).removeprefix('torch.')} (kernel: {spec.dtype})"
            if t.is_cuda is not self.on_cuda:
                return f"{arg.name} on {t.device.type}, not a {self.device_type.upper()} device"
            if t.stride() != spec.strides:
                return f"strides {arg.name}{list(t.stride())} (kernel: contiguous {list(spec.strides)})"
            if where != "signature":
                offset = t.data_ptr() if where == "call" else t.storage_offset() * t.element_size()
                if offset % spec.alignment:
                    return f"{arg.name} not {spec.alignment}-byte aligned (a view that starts mid-buffer)"
            tensors.append(t)
        if len(args) > self.positional or any(name not in self.keywords for name in kwargs):
            return "more arguments than the captured call passed"
        for scalar, accepted in self.scalar_args:
            value = _argument(args, kwargs, scalar)
            if type(value) not in _PLAIN:
                value = _plain(value)
            if not _accepted(value, accepted, scalar.accepts):
                return f"{scalar.name}={value!r} (kernel: {' or '.join(map(repr, scalar.accepts))})"
        device = max(tensors[0].get_device(), 0)
        for t in tensors[1:]:
            if max(t.get_device(), 0) != device:
                return "tensors on different devices"
        capability = self.capabilities.get(device)
        if capability is None:
            if self.device_type == "cuda":
                import torch

                major, minor = torch.cuda.get_device_capability(device)
                capability = self.capabilities[device] = (major, minor)
            else:  # a stand-in device (tests): no architecture to compare
                capability = self.capabilities[device] = self.entry.guard.capability
        if capability != self.entry.guard.capability:
            have, need = capability, self.entry.guard.capability
            return f"device {device} is sm_{have[0]}{have[1]}, the kernel is for sm_{need[0]}{need[1]}"
        if self.disabled:
            return "disabled: disagreed with eager in shadow mode"
        return tensors

    def disable(self, why: str) -> None:
        """Every later call goes to the original operator, with this reason (the compiled launcher's replays of
        its calls are dropped, so they reach the Python guard, which refuses them)."""
        self.disabled = why
        for replay in self.replays:
            replay.forget(self)

    # -- the launch --------------------------------------------------------------------------------------------
    def driver(self) -> drivers.Driver:
        if self._driver is None:
            self._driver = drivers.driver(self._binding)
        return self._driver

    def _function(self, device: int) -> Any:
        with self._load_lock:
            if device not in self.functions:
                entry = self.entry
                image = self.package.member(entry.files.cubin)
                self.functions[device] = self.driver().load(
                    device, image, entry.launch.entry, entry.launch.shared_bytes, entry.launch.args
                )
            return self.functions[device]

    def _launcher(self, device: int) -> drivers.Launcher:
        """The launch for `device`, prepared once: the binding's own (`launcher`, one driver call and nothing
        rebuilt per launch) where it has one, else its `launch` with the plan's fixed arguments bound."""
        launcher = self.launchers.get(device)
        if launcher is None:
            function = self._function(device)
            driver = self.driver()
            plan = self.entry.launch
            prepare = getattr(driver, "launcher", None)
            if prepare is not None:
                launcher = prepare(function, plan.grid, plan.block, plan.shared_bytes)
            else:

                def launcher(stream: int, pointers: list[int]) -> None:
                    driver.launch(function, plan.grid, plan.block, plan.shared_bytes, stream, pointers)

            self.launchers[device] = launcher
        return launcher

    def function_handle(self, device: int) -> int:
        """The kernel's CUfunction on `device` as an integer, loaded first (as its first launch would load it): what
        the compiled launcher launches."""
        return launchers.function_handle(self.driver(), self._function(device))

    def run(
        self, device: int, tensors: list[torch.Tensor], pointers: list[int] | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Run the kernel on admitted inputs on device index `device` (`pointers`: theirs, where the guard has
        them): outputs from torch's allocator in the call's shapes, launched on torch's current stream. The kernel
        gets each tensor as its card's row-major view, which for the admitted (row-major) tensors is their own data
        pointer (`view_problem`): nothing is reshaped or copied on the hot path."""
        launcher = self.launchers.get(device)
        if launcher is None:
            launcher = self._launcher(device)
        if self.single:  # every template writes one output
            like = self._like
            if like >= 0 and type(tensors[like]) is self._tensor_type:  # a subclass's own empty_like is not ours
                out = self._empty_like(tensors[like])
            else:
                out = self._empty(self._shape, dtype=self._dtype, device=tensors[0].device)
            if pointers is not None and self.in_order:
                launcher(self._stream(device), [*pointers, out.data_ptr()])
                return out
            outs = [out]
        else:
            outs = []
            for like, shape, dtype in self.alloc:
                if like >= 0 and type(tensors[like]) is self._tensor_type:
                    outs.append(self._empty_like(tensors[like]))
                else:
                    outs.append(self._empty(shape, dtype=dtype, device=tensors[0].device))
        both = tensors + outs
        launcher(self._stream(device), [both[i].data_ptr() for i in self.plan])
        return outs[0] if self.single else tuple(outs)

    def launch(self, tensors: list[torch.Tensor]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """`run()` on the device of the first tensor (inputs `check()` admitted)."""
        return self.run(max(tensors[0].get_device(), 0), tensors)

    def stats(self) -> KernelStats:
        return KernelStats(
            kernel=self.entry.id,
            variant=self.entry.variant,
            call=self.entry.guard.describe(),
            hits=self.hits,
            fallbacks=dict(self.fallbacks),
            shadow_checks=self.shadow_checks,
            disabled=self.disabled,
            compiled_calls=self.compiled_calls,
            graph_nodes=self.graph_nodes,
            serves=self.entry.serves,
            graph_refused=dict(self.graph_refused),
        )


def _no_stream(device: int) -> int:
    return 0


def _current_stream(device: int) -> int:
    import torch

    return int(torch.cuda.current_stream(device).cuda_stream)


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CastError(f"unknown dtype {name!r} in the package")
    return dtype


def aten_call(entry: KernelEntry, tensors: dict[str, torch.Tensor]) -> tuple[Any, list[Any], dict[str, Any]]:
    """(the overload, args, kwargs) of the captured call, with the given tensors in place; for a fused chain, the
    replay of its calls (`ChainReplay`) and the card inputs in the guard's order."""
    if entry.chain is not None:
        names = [arg.tensor for arg in entry.guard.args if arg.tensor is not None]
        return ChainReplay(entry.chain, names), [tensors[name] for name in names], {}
    op = resolve_overload(entry.guard.overload)
    args, kwargs = call_arguments(op, entry.guard.args, lambda arg: tensors[str(arg.tensor)])
    return op, args, kwargs


def resolve_overload(overload: str) -> Any:
    """torch's OpOverload for `aten::NAME.OVERLOAD`."""
    import torch

    namespace, name, which = split_overload(overload)
    return getattr(getattr(getattr(torch.ops, namespace), name), which)


def call_arguments(
    op: Any, guard_args: Sequence[AtenArg], tensor: Callable[[AtenArg], Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The args and kwargs that call `op` as the guard's arguments say: a tensor argument's value from `tensor`
    (a card input, or a chain's earlier result), a scalar's its accepted value, dtypes, layouts, memory formats and
    devices as torch's objects."""
    import torch

    # real_type: the JIT's own type of a ScalarType, Layout or MemoryFormat argument is int
    schema = {i: str(a.real_type) for i, a in enumerate(op._schema.arguments)}
    named = {a.name: str(a.real_type) for a in op._schema.arguments}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for arg in guard_args:
        if arg.tensor is not None or arg.link is not None:
            value: Any = tensor(arg)
        else:
            value = arg.accepts[0]
            kind = schema.get(arg.position, "") if arg.position is not None else named.get(arg.name, "")
            if isinstance(value, str) and ("ScalarType" in kind or "Layout" in kind or "MemoryFormat" in kind):
                value = getattr(torch, value)
            elif isinstance(value, str) and "Device" in kind:
                value = torch.device(value)
        if arg.position is None:
            kwargs[arg.name] = value
        else:
            while len(args) < arg.position:
                args.append(None)
            args.append(value)
    return args, kwargs


class ChainReplay:
    """A fused chain's aten calls, run one after another on the card inputs (given in the guard's order): what its
    kernel stands for, and what runs where the kernel does not (a call its op's guard refuses, another signature's
    fake, the checks' eager reference)."""

    def __init__(self, chain: Chain, names: list[str]) -> None:
        self.chain = chain
        self.names = names
        self.ops = [resolve_overload(step.overload) for step in chain.steps]

    def __call__(self, *inputs: Any) -> Any:
        tensors = dict(zip(self.names, inputs, strict=True))
        results: list[list[Any]] = []

        def value(arg: AtenArg) -> Any:
            if arg.tensor is not None:
                return tensors[arg.tensor]
            assert arg.link is not None
            step, index = arg.link
            return results[step][index]

        for op, step in zip(self.ops, self.chain.steps, strict=True):
            args, kwargs = call_arguments(op, step.args, value)
            out = op(*args, **kwargs)
            results.append(list(out) if isinstance(out, (tuple, list)) else [out])
        outputs = [results[step][index] for step, index in self.chain.outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


# -- one overload ----------------------------------------------------------------------------------------------


def split_overload(overload: str) -> tuple[str, str, str]:
    """`aten::add.Tensor` -> ("aten", "add", "Tensor"); `aten::_softmax.default` -> ("aten", "_softmax", "default")."""
    namespace, _, rest = overload.partition("::")
    name, _, which = rest.partition(".")
    if not namespace or not name:
        raise CastError(f"{overload!r} is not an operator overload (aten::NAME.OVERLOAD)")
    return namespace, name, which or "default"


class _Override:
    """The kernel registered for one overload: it picks the runner whose shapes match, checks its guard, and
    launches it, or calls the overload's original kernel."""

    def __init__(self, cast: Cast, overload: str, runners: list[KernelRunner], dispatch_key: str) -> None:
        import torch

        self.cast = cast
        self.overload = overload
        namespace, name, which = split_overload(overload)
        self.qualified = f"{namespace}::{name}" + ("" if which == "default" else f".{which}")
        self.impl_name = name if which == "default" else f"{name}.{which}"
        self.original = torch.library.get_kernel(self.qualified, dispatch_key)
        self.by_key: dict[tuple[int, ...], list[KernelRunner]] = {}
        for runner in runners:
            self.by_key.setdefault(runner.key, []).append(runner)
        self.first_tensor = runners[0].tensor_args[0][0]
        self.uncovered: Counter[str] = Counter()
        self.graph_refused: Counter[str] = Counter()
        """Graph nodes of this overload the compile path left to Inductor, by reason."""
        op = getattr(getattr(getattr(torch.ops, namespace), name), which)
        self.tensor_positions = [
            i for i, a in enumerate(op._schema.arguments) if not a.kwarg_only and str(a.type) == "Tensor"
        ]
        self.tensor_type = torch.Tensor
        self.capturing: Callable[[], bool] = torch.cuda.is_current_stream_capturing
        self.signature = signature_of(op._schema)
        self.decisions: dict[tuple[Any, ...], Decision] = {}
        """The guard's decision per call signature (`signature_of`): what the hot path looks up."""
        self.replay: launchers.Replay | None = None
        """The compiled launcher's kernel, made at the first activation that uses it; while it is attached (in
        front of this one), `slow` tells it each decision."""

    def kernel(self) -> Callable[..., Any]:
        """The function torch.library calls for every call of the overload: the hot path inline (a plain function,
        cheaper to call than an object), anything it cannot take to `slow`. The dispatcher passes an aten call's
        arguments positionally, keyword-only ones aside: a call without keywords whose signature the guard has
        decided before costs a dict lookup, and a hit its pointers' alignment; the rest goes to `slow`."""
        decisions, slow, shadow, fallback = self.decisions, self.slow, self.shadow, self.fallback
        cast, capturing, signature = self.cast, self.capturing, self.signature
        unsupported = drivers.LaunchUnsupported

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs:
                try:
                    decided = decisions.get(signature(args))
                except (AttributeError, IndexError, TypeError):  # the full guard decides (`signature_of`)
                    decided = None
                if decided is not None:
                    runner, index, counter, reason = decided
                    if runner is None:
                        _count(counter, reason)
                        return fallback(keyset, args, kwargs)
                    tensors: list[Any] = []
                    pointers: list[int] = []
                    for position, alignment in runner.placed or ():
                        t = args[position]
                        pointer = t.data_ptr()
                        if pointer % alignment:
                            break
                        tensors.append(t)
                        pointers.append(pointer)
                    else:
                        if not runner.disabled:
                            try:
                                result = runner.run(index, tensors, pointers)
                            except unsupported as exc:
                                _count(runner.fallbacks, str(exc))
                                return fallback(keyset, args, kwargs)
                            runner.hits += 1
                            every = cast.shadow_every
                            if every and runner.hits % every == 0 and not (runner.on_cuda and capturing()):
                                return shadow(runner, keyset, args, kwargs, result)
                            return result
            return slow(keyset, args, kwargs)

        return kernel

    def make_replay(self, dispatch_key: str) -> None:
        """The compiled launcher's kernel, made once (before this override's kernel is registered the first time:
        it keeps the overload's original kernel)."""
        if self.replay is None:
            self.replay = launchers.Replay(self.overload, dispatch_key)
            for runners in self.by_key.values():
                for runner in runners:
                    runner.replays.append(self.replay)

    def attach(self) -> None:
        """Put the compiled launcher's kernel in front of this one (registered just before). The Python decisions
        kept so far are dropped, so that a signature the C++ table does not hold reaches `slow` and is told to it
        (a block without the launcher may have decided it)."""
        assert self.replay is not None
        self.replay.attach()
        self.decisions.clear()

    def detach(self) -> None:
        """Take the compiled launcher's kernel out of the dispatcher (its table stays for the next block)."""
        if self.replay is not None and self.replay.attached:
            self.replay.detach()

    def settle(self) -> None:
        """The calls the compiled launcher replayed since the last settle, added to the Python counters."""
        if self.replay is None:
            return
        for runner, counter, reason, calls in self.replay.drain():
            if runner is not None:
                runner.hits += calls
            else:
                _count(counter, reason, calls)

    def choose(
        self, args: Sequence[Any], kwargs: dict[str, Any], where: Where = "call"
    ) -> tuple[KernelRunner | None, list[torch.Tensor] | str]:
        """The runner whose guard admits the call (`KernelRunner.check`, `where` as there) and its input tensors;
        else why not, with the runner that refused it where only one could have taken it (None: no kernel covers
        the call's shapes, or several refused it)."""
        first = _argument(args, kwargs, self.first_tensor)
        if not isinstance(first, self.tensor_type):
            return None, f"{self.first_tensor.name} is not a tensor"
        runners = self.by_key.get(tuple(first.shape))
        if runners is None:
            return None, f"shape {list(first.shape)} {str(first.dtype).removeprefix('torch.')}"
        reason = ""
        for runner in runners:
            admitted = runner.check(args, kwargs, where)
            if not isinstance(admitted, str):
                return runner, admitted
            reason = admitted
        return (runners[0] if len(runners) == 1 else None), reason

    def slow(self, keyset: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """The full guard, for any call the hot path did not take: it decides the call's signature once (kept for
        the hot path: calls without keywords, up to MAX_DECISIONS signatures) and then the call itself (its
        pointers' alignment), and says why it refuses one."""
        runner, decided = self.choose(args, kwargs, "signature")
        if not kwargs and len(self.decisions) < MAX_DECISIONS:
            with contextlib.suppress(AttributeError, IndexError, TypeError):  # not kept (`signature_of`)
                key = self.signature(tuple(args))
                if isinstance(decided, str):
                    counter = self.uncovered if runner is None else runner.fallbacks
                    self.decisions[key] = (None, 0, counter, decided)
                    if self.replay is not None and self.replay.attached:
                        self.replay.refuse(counter, decided)
                elif runner is not None and runner.placed is not None:
                    device = max(decided[0].get_device(), 0)
                    self.decisions[key] = (runner, device, runner.fallbacks, "")
                    if self.replay is not None and self.replay.attached:
                        self.replay.admit(runner, runner.function_handle(device), runner.placed)
        if runner is not None and not isinstance(decided, str):
            decided = runner.check(args, kwargs)
        if isinstance(decided, str):
            _count(self.uncovered if runner is None else runner.fallbacks, decided)
            return self.fallback(keyset, args, kwargs)
        assert runner is not None
        return self.hit(runner, keyset, args, kwargs, max(decided[0].get_device(), 0), decided)

    def hit(
        self,
        runner: KernelRunner,
        keyset: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        device: int,
        tensors: list[torch.Tensor],
    ) -> Any:
        """Launch an admitted call and count it (shadowed one in N): what `kernel()` does inline for its hits."""
        try:
            result = runner.run(device, tensors)
        except drivers.LaunchUnsupported as exc:
            _count(runner.fallbacks, str(exc))
            return self.fallback(keyset, args, kwargs)
        runner.hits += 1
        every = self.cast.shadow_every
        if every and runner.hits % every == 0 and not (runner.on_cuda and self.capturing()):
            return self.shadow(runner, keyset, args, kwargs, result)
        return result

    def fallback(self, keyset: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """The original kernel. A Python number where the schema has a Tensor (a wrapped scalar, `x + 1.5`) comes
        back to a 0-dim tensor of the dtype a wrapped number has, so type promotion is unchanged."""
        for i in self.tensor_positions:
            if i < len(args) and isinstance(args[i], _NUMBERS):
                return self.original.call_boxed(keyset, *self._wrapped(args), **kwargs)
        return self.original.call_boxed(keyset, *args, **kwargs)

    def _wrapped(self, args: Sequence[Any]) -> list[Any]:
        import torch

        fixed = list(args)
        for i in self.tensor_positions:
            if i < len(fixed) and isinstance(fixed[i], _NUMBERS):
                value = fixed[i]
                dtype = (
                    torch.bool
                    if isinstance(value, bool)
                    else torch.int64
                    if isinstance(value, int)
                    else torch.get_default_dtype()
                    if isinstance(value, float)
                    else torch.complex64
                )
                fixed[i] = torch.tensor(value, dtype=dtype)
        return fixed

    def shadow(
        self, runner: KernelRunner, keyset: Any, args: Sequence[Any], kwargs: dict[str, Any], result: Any
    ) -> Any:
        """Run the original too and compare; on a disagreement disable the kernel, warn, and return eager's."""
        runner.shadow_checks += 1
        eager = self.fallback(keyset, args, kwargs)
        outs = [result] if runner.single else list(result)
        refs = [eager] if runner.single else list(eager)
        for spec, out, ref in zip(runner.entry.guard.outputs, outs, refs, strict=True):
            problem = disagreement(out, ref, runner.entry.tolerances[spec.name])
            if problem:
                runner.disable(f"at hit {runner.hits}: output {spec.name}: {problem}")
                warnings.warn(
                    f"kernelforge cast: kernel {runner.entry.id} ({runner.entry.guard.describe()}) disagreed with "
                    f"eager PyTorch in shadow mode and is disabled for the rest of this run: {runner.disabled}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return eager
        return result


# -- the package -----------------------------------------------------------------------------------------------


class Cast:
    """A loaded package: a context manager that puts its kernels in place and takes them out again."""

    def __init__(
        self,
        path: Path,
        package: Package | None,
        *,
        note: str = "",
        shadow_every: int = 0,
        dispatch_key: str = "CUDA",
        binding: str | None = None,
        device_type: str = "cuda",
        driver: drivers.Driver | None = None,
    ) -> None:
        self.path = path
        self.package = package
        self.note = note
        self.shadow_every = shadow_every
        self.dispatch_key = dispatch_key
        self.runners: list[KernelRunner] = []
        if package is not None:
            self.runners = [
                KernelRunner(package, entry, binding, device_type=device_type, driver=driver)
                for entry in package.manifest.kernels
            ]
        self._library: Any = None
        self._overrides: list[_Override] | None = None
        self.launcher = "not activated yet"
        """'' where the compiled launcher replays the hits (`cast.launcher`) in the last (or current) activation,
        else why the Python path serves them."""

    @property
    def active(self) -> bool:
        return self._library is not None

    def __enter__(self) -> Cast:
        self.activate()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.deactivate()

    def overrides(self) -> list[_Override]:
        """One per overload the package's single-call kernels cover, made once: their decisions and counters last
        across `with` blocks, and the compile path asks them too (`cast.compiled`). A chain's kernel has none: eager
        PyTorch runs a chain's calls one by one."""
        if self._overrides is None:
            groups: dict[str, list[KernelRunner]] = {}
            for runner in self.runners:  # a chain's kernel replaces several calls: compiled graphs only
                if runner.entry.chain is None:
                    groups.setdefault(runner.entry.guard.overload, []).append(runner)
            self._overrides = [_Override(self, o, runners, self.dispatch_key) for o, runners in groups.items()]
        return self._overrides

    def activate(self) -> None:
        """Register a kernel for each overload the package covers (nothing when inactive or already active)."""
        if self.package is None or self._library is not None or not self.runners:
            return
        import torch

        overrides = self.overrides()
        with _ACTIVE_LOCK:
            taken = sorted({o.overload for o in overrides} & _ACTIVE)
            if taken:
                raise CastError(
                    f"{self.path}: another loaded package already overrides {', '.join(taken)}: leave its `with` "
                    "block first (two packages over one operator cannot be chained safely)"
                )
            self.launcher = self._launcher()
            try:  # before the Python kernels are registered: each replay keeps its overload's original kernel
                for override in overrides if not self.launcher else ():
                    override.make_replay(self.dispatch_key)
            except RuntimeError as exc:
                self.launcher = f"the compiled launcher refused the overloads: {str(exc).splitlines()[0]}"
            make_library: Callable[..., Any] = torch.library.Library
            library = make_library("aten", "IMPL")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": on purpose
                for override in overrides:
                    library.impl(override.impl_name, override.kernel(), self.dispatch_key, with_keyset=True)
            try:
                for override in overrides if not self.launcher else ():
                    override.attach()
            except RuntimeError as exc:  # the Python kernels stay in force, alone
                for override in overrides:
                    override.detach()
                self.launcher = f"the compiled launcher could not be registered: {str(exc).splitlines()[0]}"
            _ACTIVE.update(o.overload for o in overrides)
            self._library = library
            ACTIVE_CASTS.append(self)

    def deactivate(self) -> None:
        """Put the original operators back. `Library._destroy` is the one private torch API used here: it is how
        torch's own scoped libraries unregister, and waiting for the garbage collector would leave the kernels in."""
        if self._library is None:
            return
        with _ACTIVE_LOCK:
            for override in self.overrides():
                override.detach()
            self._library._destroy()
            self._library = None
            for override in self.overrides():
                _ACTIVE.discard(override.overload)
            ACTIVE_CASTS.remove(self)

    def _launcher(self) -> str:
        """'' where the compiled launcher can replay this package's hits, else why the Python path serves them."""
        switch = os.environ.get(launchers.ENV_LAUNCHER, "").strip().lower()
        if switch in OFF_VALUES:
            return f"turned off by {launchers.ENV_LAUNCHER}={os.environ[launchers.ENV_LAUNCHER]}"
        if self.shadow_every:
            return "shadow mode compares hits with eager in Python"
        if not self.overrides():
            return "no kernel stands for an eager call (fused chains serve compiled graphs only)"
        try:
            plain = sorted({r.driver().name for r in self.runners if not launchers.gives_handles(r.driver())})
        except CastError as exc:
            return str(exc)
        if plain:
            return f"the {', '.join(plain)} binding gives no CUfunction handle (cuda-bindings does)"
        return launchers.load_library()

    def stats(self) -> CastStats:
        for override in self._overrides or ():
            override.settle()
        overloads = [
            OverloadStats(overload=o.overload, uncovered=dict(o.uncovered), graph_refused=dict(o.graph_refused))
            for o in self._overrides or ()
        ]
        return CastStats(
            package=str(self.path),
            active=self.package is not None and bool(self.runners),
            note=self.note,
            launcher="compiled" if not self.launcher else f"Python path: {self.launcher}",
            kernels=[r.stats() for r in self.runners],
            overloads=overloads,
        )

    def report(self, forwards: int | None = None) -> str:
        """The counters, for people: per kernel its hits and fallbacks by reason, where it was used (eager, compile,
        both) and what the package measured it to save per call and per forward pass (`kernel_line`, as `kernelforge
        export` says it); per overload the calls no kernel covers and the graph nodes the compile path left to
        Inductor. `forwards`: how many forward passes the counters span, where the caller knows (the runtime sees
        calls, not forwards): each kernel's calls per forward observed, beside the capture's count."""
        stats = self.stats()
        lines = [f"kernelforge cast: {self.path}" + (f" ({stats.note})" if stats.note else "")]
        lines.append(f"  launcher: {stats.launcher}")
        for runner, k in zip(self.runners, stats.kernels, strict=True):
            counters = f"{k.hits} hits, {sum(k.fallbacks.values())} fallbacks"
            if k.shadow_checks:
                counters += f", {k.shadow_checks} shadow checks"
            if k.graph_nodes or k.compiled_calls:
                counters += f"; compiled: {k.graph_nodes} graph nodes, {k.compiled_calls} op calls"
            if forwards:
                counters += (
                    f"; observed {(k.hits + k.compiled_calls) / forwards:.2f} calls per forward over {forwards} "
                    "forwards (a CUDA graph's replays call nothing: not counted)"
                )
            lines.append(kernel_line(runner.package.manifest, runner.entry, counters, k.used_in))
            lines += _counted(k.fallbacks)
            lines += _counted(k.graph_refused, "left to Inductor: ")
            if k.disabled:
                lines.append(f"      DISABLED {k.disabled}")
        for o in stats.overloads:
            if o.uncovered:
                lines.append(f"  {o.overload}: {sum(o.uncovered.values())} calls no kernel covers (original operator)")
                lines += _counted(o.uncovered)
            if o.graph_refused:
                left = sum(o.graph_refused.values())
                lines.append(f"  {o.overload}: {left} graph nodes left to Inductor")
                lines += _counted(o.graph_refused)
        compiled = sum(k.compiled_calls for k in stats.kernels)
        lines.append(
            f"  total: {stats.hits} calls ran generated kernels, {stats.fallbacks} fell back"
            + (f"; {compiled} compiled-graph calls ran them" if compiled else "")
        )
        return "\n".join(lines)

    def print_report(self, stream: Any = None, forwards: int | None = None) -> None:
        print(self.report(forwards), file=stream or sys.stderr)


def load(
    path: Path | str,
    *,
    shadow_every: int | None = None,
    machine: Machine | None = None,
    dispatch_key: str = "CUDA",
    binding: str | None = None,
    device_type: str = "cuda",
    driver: drivers.Driver | None = None,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Cast:
    """Open a package for use in a `with` block. Refuses (CastError) a package not checked on a GPU yet (before
    reading its members), one over `limits`, one whose stamp or any member's sha256 does not match its contents, and
    one verified on a machine that differs from this one; returns an inactive Cast (every call eager, the report says
    why) when KERNELFORGE_CAST=off or there is no CUDA device.

    `machine`: what to compare the stamp against (default: this machine, probed through torch). `binding`:
    "cuda-bindings" or "pycuda" (default: the first installed). For tests on a CPU-only build: `dispatch_key`
    (where the kernels are registered, CUDA), `device_type` (what the guard admits, cuda) and `driver` (a stand-in
    for the CUDA binding) exercise the guards, the dispatch and the counters without a GPU.
    """
    path = Path(path)
    switch = os.environ.get(ENV_SWITCH, "").strip().lower()
    if switch in OFF_VALUES:
        return Cast(path, None, note=f"turned off by {ENV_SWITCH}={os.environ[ENV_SWITCH]}: every call runs eagerly")
    every = shadow_every
    if every is None:
        raw = os.environ.get(ENV_SHADOW, "").strip()
        try:
            every = int(raw) if raw else 0
        except ValueError:
            raise CastError(f"{ENV_SHADOW}={raw!r} is not a whole number (shadow one call in N: give N)") from None
    if every < 0:
        raise CastError(f"shadow_every must be >= 0 (0: off), not {every}")
    package = read_package(path, stamp="require", limits=limits)
    stamp = package.manifest.stamp
    assert stamp is not None  # read_package requires one
    here = machine if machine is not None else probe_machine()
    if here is None:
        warnings.warn(
            f"kernelforge cast: no CUDA device here, so {path} runs nothing: every call runs eagerly",
            RuntimeWarning,
            stacklevel=2,
        )
        return Cast(path, None, note="no CUDA device: every call runs eagerly")
    differences = stamp.machine.differences(here)
    if differences:
        raise CastError(
            f"{path} was verified on {stamp.machine.describe()}; this machine differs: {'; '.join(differences)}. "
            f"A kernel proven there is not proven here: {VERIFY_HELP.format(path=path)}"
        )
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp.at))
    note = f"verified on {stamp.machine.describe()} by {stamp.by} at {when}"
    return Cast(
        path,
        package,
        note=note,
        shadow_every=every,
        dispatch_key=dispatch_key,
        binding=binding,
        device_type=device_type,
        driver=driver,
    )
