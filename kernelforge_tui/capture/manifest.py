"""The capture directory's manifest (`capture.json`): what a model ran, grouped into variants, ranked by the time a
faster kernel could save, and the operator card made for each variant the product can optimise.

Why a versioned pydantic manifest beside plain card directories: the cards are what the search reads (each is an
ordinary card a person can open, `kernelforge optimize` alone), the manifest is what ties them back to the model:
which aten call (or fused pattern of calls) a card stands for, with the exact shapes, strides, dtypes and scalar
arguments a runtime must match before it may call a kernel in its place, how often it ran and what share of the
model's time it took. Nothing here imports torch: the CLI, the search driver and the `.cast` exporter read it on
machines without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernelforge_tui.cards.model import OpFamily
from kernelforge_tui.errors import BadInput, FieldError

FORMAT_VERSION: Literal[1] = 1
MANIFEST = "capture.json"
"""The manifest's file name in a capture directory (one card directory per carded variant lies beside it)."""

Scalar = str | int | float | bool | None
Json = Scalar | list[Scalar]
"""A scalar argument as it is stored: numbers, booleans, None, strings (a dtype is "bfloat16", a device "cuda:0",
a layout or memory format its torch name), and flat lists of them."""

VariantStatus = Literal["card", "unsupported", "no-kernel"]
Timing = Literal["cuda-profiler", "cuda-events", "cpu-wall"]


class Strict(BaseModel):
    """Unknown keys are errors: a manifest from a newer kernelforge fails loudly rather than half-read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorMeta(Strict):
    """One tensor as an aten call saw it (the guard a runtime checks before it calls a kernel instead)."""

    shape: list[int]
    stride: list[int]
    dtype: str
    """torch's name without the `torch.` prefix: float32, bfloat16, float16, int64, bool, ..."""
    device: str
    """`cpu`, `cuda:0`, ..."""
    contiguous: bool
    """Row-major contiguous (`Tensor.is_contiguous()`): the only layout a card's tensors have."""
    storage_offset: int = 0
    alignment: int = 0
    """The largest power of two (at most 256) dividing the data pointer in bytes, the smallest over every call of the
    variant (0: not recorded). Vector kernels need 16."""

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


class ArgSpec(Strict):
    """One argument of an aten call: its place (`args[0]`, `args[1][2]`, `kwargs.dtype`) and what was passed."""

    path: str
    kind: Literal["tensor", "scalar", "float", "none", "dtype", "device", "layout", "memory_format", "list", "other"]
    """`float`: a non-finite float, its value "inf", "-inf" or "nan" (JSON has no such numbers); `list`: a list that
    holds tensors, its value the length and its items the arguments at `path[0]`, `path[1]`, ...; `dtype`, `device`,
    `layout`, `memory_format`: torch's name as value (bfloat16, cuda:0, strided, contiguous_format)."""
    tensor: TensorMeta | None = None
    value: Json = None
    """The value of a scalar (or its repr for kind other: a Python object aten took that is not stored as data)."""
    source: tuple[int, int] | None = None
    """Inside a pattern: (step, output index) of the earlier step that produced this tensor; None for tensors that
    come from outside the pattern."""


class Step(Strict):
    """One aten call of a variant: a plain variant has one, a fused pattern several (in the order they ran)."""

    op: str
    """The overload, e.g. `aten._softmax.default`, `aten.native_group_norm.default`."""
    args: list[ArgSpec]
    outputs: list[TensorMeta | None]
    """What the call returned, flattened (None for a non-tensor result)."""
    inplace: bool = False
    view: bool = False


class Binding(Strict):
    """Where a card tensor lives in the captured call(s): an input is an argument of a step, an output a result of a
    step. The card holds it reshaped to its own shape (`card_shape`); the op saw `op_shape` (same elements, same
    order: both are row-major; or, with an `order`, the card's array is the op's tensor as it lies in memory)."""

    tensor: str
    role: Literal["input", "output"]
    step: int
    path: str
    """`args[0]`-style for inputs; `out[0]` for outputs."""
    op_shape: list[int]
    card_shape: list[int]
    order: list[int] = Field(default_factory=list)
    """The op's dims in the order they lie in memory, outermost first, where that is not row-major: the card's array
    is the op's tensor permuted by it (a transposed view [..., n - 1, n - 2], a channels-last NCHW tensor
    [0, 2, 3, 1]); empty: row-major."""

    @model_validator(mode="before")
    @classmethod
    def _transposed(cls, data: object) -> object:
        """A manifest written before `order` said `transposed: true` for a view with its last two dims swapped."""
        if isinstance(data, dict) and "transposed" in data:
            data = dict(data)
            rank = len(data.get("op_shape", []))
            data["order"] = [*range(rank - 2), rank - 1, rank - 2] if data.pop("transposed") else []
        return data

    @property
    def transposed(self) -> bool:
        """The op saw the card's array with its last two dims swapped (a matrix product's transposed operand)."""
        rank = len(self.order)
        return rank >= 2 and self.order == [*range(rank - 2), rank - 1, rank - 2]


class Variant(Strict):
    """One variant: calls to one overload (or one fused pattern) with one call pattern: the same shapes, strides,
    dtypes, device and scalar arguments."""

    id: str
    """`v01`, `v02`, ... in order of first appearance in the forward pass (stable whatever the ranking)."""
    rank: int
    """1 = the largest expected saving."""
    kind: Literal["op", "pattern"]
    """op: one aten call; pattern: a fused chain of calls (`capture.patterns`)."""
    op: str
    """The overload for an op; the pattern's name (rms_norm, silu_mul, residual_layer_norm, bias_gelu,
    scale_mask_softmax, group_norm_silu, ...) for a pattern."""
    title: str
    """One line for tables: `aten._softmax.default bf16 [2, 16, 1024, 1024]`."""
    steps: list[Step]
    calls: int
    """Calls (or matched pattern instances) per forward pass."""
    instances: list[list[int]] = Field(default_factory=list)
    """A pattern's: the aten calls (indices into the forward pass, as `trace` counts them) of each instance. Each of
    those calls is a variant of its own too (the trace names it): eager PyTorch replaces single calls, a graph pass
    a whole chain."""
    time_us: float
    """Measured time of all its calls in one forward pass (device time on CUDA, CPU time on the CPU): for a
    pattern, every call of every instance, so its share overlaps the shares of its calls' own variants."""
    share: float
    """time_us / the model's total operator time: its share of the eager time."""
    bytes_per_call: int = 0
    """Bytes its card's tensors take (every input read, every output written once): the least a kernel moves."""
    family: OpFamily | None = None
    status: VariantStatus
    reason: str = ""
    """Why there is no card (unsupported), or what a card's making decided (notes)."""
    card: str | None = None
    """The card's directory, relative to the capture directory."""
    bindings: list[Binding] = Field(default_factory=list)
    template: bool = False
    """The built-in template proposer has a kernel family for the card (the offline search can improve it)."""
    template_note: str = ""
    expected_speedup: float = 1.0
    """k: how much faster a good kernel for it is expected to be than eager (`ranking.py` says how it is estimated)."""
    expected_saving: float = 0.0
    """share * (1 - 1/k): the share of the model's time a k-times faster kernel saves (Amdahl)."""
    estimate: str = ""
    """How expected_speedup was estimated, in words."""
    replaceable: bool = False
    """A single aten call a runtime can override (torch.library) with the card's kernel; a fused pattern replaces
    several calls and needs the runtime to match all of them."""

    @property
    def time_per_call_us(self) -> float:
        return self.time_us / self.calls if self.calls else 0.0


class CaptureManifest(Strict):
    """`capture.json`: a captured model, its variants ranked by expected saving (best first)."""

    format_version: Literal[1] = FORMAT_VERSION
    kernelforge_version: str
    torch_version: str
    model_file: str
    entry: str
    """`build` (one function returning (model, inputs)) or `make_model:make_inputs`."""
    entry_kwargs: dict[str, Json] = Field(default_factory=dict)
    device: str
    device_name: str
    capability: str | None = None
    """`9.0` on an H200; None on the CPU."""
    timing: Timing
    timing_note: str
    repeats: int
    """Forward passes timed (the variant times are their mean)."""
    total_time_us: float
    """Per forward pass, every operator call's time summed: the denominator of every share."""
    forward_wall_us: float
    """One eager forward pass without the capture hook, wall clock (synchronised on CUDA): host overhead included."""
    calls: int
    """aten calls per forward pass."""
    copy_gbps: float | None = None
    """Device-to-device copy bandwidth measured with torch at capture (CUDA only): the ceiling the estimates use."""
    created_at: float
    variants: list[Variant]
    trace: list[str] = Field(default_factory=list)
    """The variant id of every aten call of one forward pass, in order: each call's own variant (a pattern lists
    its calls in `Variant.instances`)."""

    def variant(self, variant_id: str) -> Variant:
        for variant in self.variants:
            if variant.id == variant_id:
                return variant
        raise KeyError(variant_id)

    def carded(self) -> list[Variant]:
        """Variants with a card, best expected saving first."""
        return [v for v in self.variants if v.status == "card"]


class CaptureError(FieldError):
    """A capture directory (or its manifest) that cannot be used as it is (bad input: exit code 2)."""


def is_capture_dir(path: Path) -> bool:
    """Whether `path` is a capture directory (holds a capture manifest)."""
    return (path / MANIFEST).is_file()


def load_capture(path: Path) -> CaptureManifest:
    """Read and check `path/capture.json` (or the manifest itself)."""
    root = path.parent if path.name == MANIFEST else path
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise CaptureError(
            manifest, None, "no capture manifest here", "point at a directory `kernelforge capture` made"
        )
    try:
        data = json.loads(manifest.read_bytes().decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaptureError(manifest, None, f"not readable as JSON ({exc})", "capture the model again") from None
    version = data.get("format_version") if isinstance(data, dict) else None
    if version != FORMAT_VERSION:
        raise CaptureError(
            manifest,
            "format_version",
            f"{version!r} is not a format this kernelforge reads ({FORMAT_VERSION})",
            "capture the model again with this version",
        )
    try:
        return CaptureManifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CaptureError(manifest, where, str(first["msg"]), "capture the model again") from None


def save_capture(manifest: CaptureManifest, root: Path) -> Path:
    """Write `root/capture.json` (indented, defaults left out: a person reads it)."""
    path = root / MANIFEST
    data = {"format_version": manifest.format_version, **manifest.model_dump(mode="json", exclude_defaults=True)}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def card_dir(root: Path, variant: Variant) -> Path:
    """The card directory of a carded variant; BadInput when it has none."""
    if variant.card is None:
        raise BadInput(f"variant {variant.id} ({variant.title}) has no card: {variant.reason}")
    return root / variant.card
