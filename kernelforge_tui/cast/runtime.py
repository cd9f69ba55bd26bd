"""The .cast runtime: `with kernelforge_tui.cast.load("model.cast"):` runs the package's kernels in place of exactly
the aten operator variants they were proven for, inside an unmodified PyTorch model.

How: for each aten overload the package covers, a kernel is registered for the CUDA dispatch key
(`torch.library`), and the overload's own CUDA kernel is kept (`torch.library.get_kernel`). Every call checks the
guard (the tensors' shapes, dtypes, strides, alignment and device, the scalar arguments, the device's
architecture); a call that passes runs the generated kernel on torch's current stream in torch's own context, with
outputs from torch's allocator; any other call goes to the original kernel. Leaving the `with` block restores the
operators. Counters say, per kernel, how many calls it ran and why others fell back; `report()` prints them.

Trust: a package is used only on a machine like the one it was verified on (architecture, driver major, CUDA,
torch); anything else is refused with what differs and the command that re-verifies it here. `KERNELFORGE_CAST=off`
turns everything off (the package is not even read). Shadow mode (`shadow_every=N` or `KERNELFORGE_CAST_SHADOW=N`)
also runs the original operator on one hit in N and disables, with a warning, a kernel that ever disagrees.

Needs torch and a CUDA driver binding (cuda-bindings or pycuda, `cast.driver`), and nothing else of kernelforge's
beyond `cast.manifest` and `cast.driver`.
"""

from __future__ import annotations

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
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

import kernelforge_tui
from kernelforge_tui.cast import driver as drivers
from kernelforge_tui.cast.manifest import (
    AtenArg,
    CastError,
    KernelEntry,
    Machine,
    Package,
    TensorGuard,
    Tolerance,
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
VERIFY_HELP = (
    "re-verify it on this machine: `kernelforge verify {path}` (re-runs every kernel's checks and re-stamps it)"
)

_ACTIVE: set[str] = set()
"""Overloads a Cast has registered in this process: two at once would chain unpredictably."""
_ACTIVE_LOCK = threading.Lock()


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


class OverloadStats(BaseModel):
    overload: str
    uncovered: dict[str, int]
    """Calls no kernel's shapes and dtypes cover, by reason: they ran the original operator."""


class CastStats(BaseModel):
    package: str
    active: bool
    note: str = ""
    """Why the package is not active (turned off, no CUDA device), or the machine it was verified on."""
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


def _count(counter: Counter[str], reason: str) -> None:
    if reason in counter or len(counter) < MAX_REASONS:
        counter[reason] += 1
    else:
        counter["other reasons"] += 1


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


def _plain(value: Any) -> Any:
    """A non-plain argument as the manifest writes it: a dtype, device, layout or memory format by its name, a tuple
    as a list; anything else as it is (and then it matches nothing)."""
    if isinstance(value, tuple):
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


def view_problem(tensor: TensorGuard) -> str:
    """'' when the kernel may take the call's tensor as it is: its strides row-major (dims of size 1 aside, as torch
    decides contiguity) and its card shape the same number of elements. Then the card's view of it (a contiguous
    reshape) starts at the same address and lays the elements out in the same order, so the launch passes the
    tensor's own pointer and no copy is made. Else why not."""
    if len(tensor.strides) != len(tensor.shape):
        return f"{tensor.name} has {len(tensor.strides)} strides for {len(tensor.shape)} dims"
    step = 1
    for dim, stride in zip(reversed(tensor.shape), reversed(tensor.strides), strict=True):
        if dim != 1 and stride != step:
            return f"{tensor.name} has strides {list(tensor.strides)} for shape {list(tensor.shape)}, not row-major"
        step *= dim
    if _numel(tensor.kernel_shape) != _numel(tensor.shape):
        return f"{tensor.name}'s card shape {list(tensor.kernel_shape)} does not hold the call's {list(tensor.shape)}"
    return ""


class KernelRunner:
    """One accepted kernel: its guard, compiled for fast checks, its functions per device, and its counters."""

    def __init__(
        self,
        package: Package,
        entry: KernelEntry,
        binding: str | None = None,
        *,
        device_type: str = "cuda",
        driver: drivers.Driver | None = None,
    ) -> None:
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
        self.functions: dict[int, Any] = {}
        self.capabilities: dict[int, tuple[int, int]] = {}
        self.hits = 0
        self.fallbacks: Counter[str] = Counter()
        self.shadow_checks = 0
        self.disabled = ""
        self._load_lock = threading.Lock()

    # -- the guard ---------------------------------------------------------------------------------------------
    def check(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor] | str:
        """The call's input tensors when the guard admits it, else why not (one short reason)."""
        import torch

        tensors: list[torch.Tensor] = []
        for arg, spec, dtype in self.tensor_args:
            t = _argument(args, kwargs, arg)
            if not isinstance(t, torch.Tensor):
                return f"{arg.name} is not a tensor"
            if t.shape != spec.shape:
                return f"shape {arg.name}{list(t.shape)} (kernel: {list(spec.shape)})"
            if t.dtype is not dtype:
                return f"dtype {arg.name} {str(t.dtype).removeprefix('torch.')} (kernel: {spec.dtype})"
            if t.is_cuda is not self.on_cuda:
                return f"{arg.name} on {t.device.type}, not a {self.device_type.upper()} device"
            if t.stride() != spec.strides:
                return f"strides {arg.name}{list(t.stride())} (kernel: contiguous {list(spec.strides)})"
            if t.data_ptr() % spec.alignment:
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

    # -- the launch --------------------------------------------------------------------------------------------
    def driver(self) -> drivers.Driver:
        if self._driver is None:
            self._driver = drivers.driver(self._binding)
        return self._driver

    def _function(self, device: int) -> Any:
        with self._load_lock:
            if device not in self.functions:
                entry = self.entry
                image = self.package.kernel_file(entry, entry.files.cubin)
                self.functions[device] = self.driver().load(
                    device, image, entry.launch.entry, entry.launch.shared_bytes, entry.launch.args
                )
            return self.functions[device]

    def launch(self, tensors: list[torch.Tensor]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Run the kernel on admitted inputs: outputs from torch's allocator in the call's shapes, launched on torch's
        current stream. The kernel gets each tensor as its card's row-major view, which for the admitted (row-major)
        tensors is their own data pointer (`view_problem`): nothing is reshaped or copied on the hot path."""
        import torch

        device = tensors[0].device
        index = device.index or 0
        function = self.functions.get(index)
        if function is None:
            function = self._function(index)
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs]
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        pointers = [(outs[i] if is_out else tensors[i]).data_ptr() for is_out, i in self.order]
        launch = self.entry.launch
        assert self._driver is not None  # set by _function
        self._driver.launch(function, launch.grid, launch.block, launch.shared_bytes, stream, pointers)
        return outs[0] if self.single else tuple(outs)

    def stats(self) -> KernelStats:
        return KernelStats(
            kernel=self.entry.id,
            variant=self.entry.variant,
            call=self.entry.guard.describe(),
            hits=self.hits,
            fallbacks=dict(self.fallbacks),
            shadow_checks=self.shadow_checks,
            disabled=self.disabled,
        )


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CastError(f"unknown dtype {name!r} in the package")
    return dtype


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
        self.reasons: dict[Any, str] = {}
        """Uncovered calls' reasons by (shape, dtype): formatting one costs more than the rest of a refusal."""
        op = getattr(getattr(getattr(torch.ops, namespace), name), which)
        self.tensor_positions = [
            i for i, a in enumerate(op._schema.arguments) if not a.kwarg_only and str(a.type) == "Tensor"
        ]

    def __call__(self, keyset: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        first = _argument(args, kwargs, self.first_tensor)
        runners = self.by_key.get(tuple(first.shape)) if isinstance(first, torch.Tensor) else None
        if runners is None:
            key = (first.shape, first.dtype) if isinstance(first, torch.Tensor) else None
            reason = self.reasons.get(key)
            if reason is None:
                if isinstance(first, torch.Tensor):
                    reason = f"shape {list(first.shape)} {str(first.dtype).removeprefix('torch.')}"
                else:
                    reason = f"{self.first_tensor.name} is not a tensor"
                if len(self.reasons) < 4 * MAX_REASONS:
                    self.reasons[key] = reason
            _count(self.uncovered, reason)
            return self.fallback(keyset, args, kwargs)
        reason = ""
        for runner in runners:
            admitted = runner.check(args, kwargs)
            if isinstance(admitted, str):
                reason = admitted
                continue
            try:
                result = runner.launch(admitted)
            except drivers.LaunchUnsupported as exc:
                _count(runner.fallbacks, str(exc))
                return self.fallback(keyset, args, kwargs)
            runner.hits += 1
            every = self.cast.shadow_every
            capturing = runner.device_type == "cuda" and torch.cuda.is_current_stream_capturing()
            if every and runner.hits % every == 0 and not capturing:
                return self.shadow(runner, keyset, args, kwargs, result)
            return result
        if len(runners) == 1:
            _count(runners[0].fallbacks, reason)
        else:
            _count(self.uncovered, reason)
        return self.fallback(keyset, args, kwargs)

    def fallback(self, keyset: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """The original kernel. A Python number where the schema has a Tensor (a wrapped scalar, `x + 1.5`) comes
        back to a 0-dim tensor of the dtype a wrapped number has, so type promotion is unchanged."""
        import torch

        fixed = list(args)
        for i in self.tensor_positions:
            if i < len(fixed) and isinstance(fixed[i], bool | int | float | complex):
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
        return self.original.call_boxed(keyset, *fixed, **kwargs)

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
                runner.disabled = f"at hit {runner.hits}: output {spec.name}: {problem}"
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
        self._overrides: list[_Override] = []

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

    def activate(self) -> None:
        """Register a kernel for each overload the package covers (nothing when inactive or already active)."""
        if self.package is None or self._library is not None or not self.runners:
            return
        import torch

        groups: dict[str, list[KernelRunner]] = {}
        for runner in self.runners:
            groups.setdefault(runner.entry.guard.overload, []).append(runner)
        with _ACTIVE_LOCK:
            taken = sorted(set(groups) & _ACTIVE)
            if taken:
                raise CastError(
                    f"{self.path}: another loaded package already overrides {', '.join(taken)}: leave its `with` "
                    "block first (two packages over one operator cannot be chained safely)"
                )
            overrides = [_Override(self, overload, runners, self.dispatch_key) for overload, runners in groups.items()]
            make_library: Callable[..., Any] = torch.library.Library
            library = make_library("aten", "IMPL")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": on purpose
                for override in overrides:
                    library.impl(override.impl_name, override, self.dispatch_key, with_keyset=True)
            _ACTIVE.update(groups)
            self._library = library
            self._overrides = overrides

    def deactivate(self) -> None:
        """Put the original operators back. `Library._destroy` is the one private torch API used here: it is how
        torch's own scoped libraries unregister, and waiting for the garbage collector would leave the kernels in."""
        if self._library is None:
            return
        with _ACTIVE_LOCK:
            self._library._destroy()
            self._library = None
            for override in self._overrides:
                _ACTIVE.discard(override.overload)

    def stats(self) -> CastStats:
        overloads = [OverloadStats(overload=o.overload, uncovered=dict(o.uncovered)) for o in self._overrides]
        return CastStats(
            package=str(self.path),
            active=self.package is not None and bool(self.runners),
            note=self.note,
            kernels=[r.stats() for r in self.runners],
            overloads=overloads,
        )

    def report(self) -> str:
        """The counters, for people: per kernel its hits and fallbacks by reason, per overload the calls no kernel
        covers."""
        stats = self.stats()
        lines = [f"kernelforge cast: {self.path}" + (f" ({stats.note})" if stats.note else "")]
        for k in stats.kernels:
            fell = sum(k.fallbacks.values())
            line = f"  {k.kernel}: {k.call}: {k.hits} hits, {fell} fallbacks"
            if k.shadow_checks:
                line += f", {k.shadow_checks} shadow checks"
            lines.append(line)
            lines += [f"      {n} x {reason}" for reason, n in sorted(k.fallbacks.items(), key=lambda kv: -kv[1])]
            if k.disabled:
                lines.append(f"      DISABLED {k.disabled}")
        for o in stats.overloads:
            if o.uncovered:
                lines.append(f"  {o.overload}: {sum(o.uncovered.values())} calls no kernel covers (original operator)")
                lines += [f"      {n} x {reason}" for reason, n in sorted(o.uncovered.items(), key=lambda kv: -kv[1])]
        lines.append(f"  total: {stats.hits} calls ran generated kernels, {stats.fallbacks} fell back")
        return "\n".join(lines)

    def print_report(self, stream: Any = None) -> None:
        print(self.report(), file=stream or sys.stderr)


def load(
    path: Path | str,
    *,
    shadow_every: int | None = None,
    machine: Machine | None = None,
    dispatch_key: str = "CUDA",
    binding: str | None = None,
    device_type: str = "cuda",
    driver: drivers.Driver | None = None,
) -> Cast:
    """Open a package for use in a `with` block. Refuses (CastError) an unverified package and one verified on a
    machine that differs from this one; returns an inactive Cast (every call eager, the report says why) when
    KERNELFORGE_CAST=off or there is no CUDA device.

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
    package = read_package(path)
    stamp = package.manifest.stamp
    if stamp is None:
        raise CastError(
            f"{path} is not verified (exported with --no-sanitize, or its last verification passed no kernel): "
            f"{VERIFY_HELP.format(path=path)} on a machine with the GPU it is for"
        )
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


def run_with(path: Path | str, body: Callable[[], Any], **options: Any) -> tuple[Any, Cast]:
    """Run `body()` with the package loaded; (its result, the Cast with its counters)."""
    cast = load(path, **options)
    with cast:
        result = body()
    return result, cast
