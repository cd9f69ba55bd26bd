"""A card from a spec: a natural-language description, a Python/NumPy reference and example sizes (`kernelforge new`).

Why this shape: a person knows what the operator does and can write it in NumPy; the rest of a card (tensor shapes,
output names, input sets with reference outputs, cost) follows from running that reference. The reference file is
copied into the card, so the card stays a directory a person can read; inputs default to every size in order as the
shape, and outputs are found by running the reference on small random inputs at two sets of distinct sizes and
matching each returned dimension to the size it follows (a dimension that keeps its value is a constant).

A reference takes the card's `(inputs, sizes)` (parameters named exactly so), or the inputs as keyword arguments named
like the tensors (sizes too, where a parameter is named like one). It returns a dict of outputs, one array, or a tuple
of arrays. Anything but a card-style function returning a dict is wrapped by a small generated module
(`reference_adapter.py`) that calls it and names what it returns.

Nothing is half-written: everything goes into a temporary directory beside the destination, which is checked with
`load_card` and renamed into place only at the end; any failure removes it.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal, get_args

import numpy as np
from pydantic import ValidationError

from kernelforge_tui.cards import expr
from kernelforge_tui.cards.directory import (
    MANIFEST,
    MAX_STORED_SET_BYTES,
    Arrays,
    Card,
    draw_inputs,
    load_card,
    save_card,
)
from kernelforge_tui.cards.dtypes import FLOATING, NUMPY, DType
from kernelforge_tui.cards.errors import from_validation_error
from kernelforge_tui.cards.model import (
    IDENT,
    BaselineSpec,
    Cost,
    InputSet,
    LaunchPlan,
    OperatorCard,
    OpFamily,
    OutputSpec,
    Reference,
    StressSpec,
    TensorSpec,
)
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.errors import FieldError

PROBE_MAX_ELEMENTS = 1 << 21
"""The probe's inputs stay under this many elements each (the probe sizes shrink when a tensor has many dims)."""
ADAPTER = "reference_adapter.py"
BASELINE = "baseline.cu"
STRESS_SEED = 1000
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
FAMILIES: tuple[str, ...] = get_args(OpFamily)
DTYPES: tuple[str, ...] = get_args(DType)


class SpecError(FieldError):
    """A spec, option or reference that cannot make a card (bad input: exit code 2); names the option and the fix."""


@dataclass(frozen=True)
class TensorDecl:
    """A tensor as `--input x=rows,cols` or `--output y:float32=rows` declares it."""

    name: str
    dims: tuple[str | int, ...] | None
    """None: found by running the reference (outputs only)."""
    dtype: str | None = None
    """None: the card's --dtype (or an integer output's own dtype)."""


@dataclass(frozen=True)
class CardRequest:
    """Everything `kernelforge new` was given."""

    name: str
    spec: str
    reference: Path
    function: str
    sizes: dict[str, int]
    dtype: str
    family: str = "other"
    inputs: tuple[TensorDecl, ...] = ()
    outputs: tuple[TensorDecl, ...] = ()
    sets: int = 2
    flops: str | int = 0


# ---- parsing the options -------------------------------------------------------------------------------------------


def split_top(text: str) -> list[str]:
    """`text` split at commas outside parentheses (a dim may be `cdiv(rows, 32)`)."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        current.append(ch)
    parts.append("".join(current).strip())
    return parts


def parse_sizes(text: str) -> dict[str, int]:
    """`rows=4096,cols=32768` (values may be integer formulas such as 2**15), in order."""
    fix = "write NAME=INTEGER pairs separated by commas, e.g. --sizes rows=4096,cols=32768"
    sizes: dict[str, int] = {}
    for part in split_top(text):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name or not value.strip():
            raise SpecError("--sizes", None, f"{part!r} is not NAME=INTEGER", fix)
        if not IDENT.match(name):
            raise SpecError("--sizes", None, f"{name!r} is not a name", "use letters, digits and '_' (rows, cols, n)")
        if name in sizes:
            raise SpecError("--sizes", None, f"{name!r} is given twice", "give each size once")
        try:
            number = expr.evaluate(value.strip(), {})
        except expr.ExprError:
            raise SpecError("--sizes", None, f"{name}={value.strip()!r} is not an integer", fix) from None
        if number <= 0:
            raise SpecError("--sizes", None, f"{name}={number} is not positive", "sizes are integers >= 1")
        sizes[name] = number
    return sizes


def check_dtype(dtype: str, option: str = "--dtype") -> str:
    if dtype not in DTYPES:
        raise SpecError(option, None, f"unknown dtype {dtype!r}", f"use one of {', '.join(DTYPES)}")
    return dtype


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise SpecError("--family", None, f"unknown family {family!r}", f"use one of {', '.join(FAMILIES)}")
    return family


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise SpecError("NAME", None, f"{name!r} cannot name a card directory", "use letters, digits, '_', '-' and '.'")
    return name


def parse_tensor(text: str, option: str) -> TensorDecl:
    """`x=rows,cols`, `idx:int32=rows`, or (outputs) a bare name whose shape is found by running the reference."""
    head, sep, dims_text = text.partition("=")
    name, colon, dtype = head.strip().partition(":")
    fix = f"write {option} NAME=DIM,DIM (dims are sizes or formulas over them), or NAME:DTYPE=DIM,DIM"
    if not IDENT.match(name):
        raise SpecError(option, None, f"{name!r} is not a tensor name", fix)
    if colon:
        check_dtype(dtype.strip(), option)
    if not sep:
        if option == "--input":
            raise SpecError(option, None, f"{text!r} gives no shape", fix)
        return TensorDecl(name, None, dtype.strip() if colon else None)
    dims: list[str | int] = []
    for dim in split_top(dims_text) if dims_text.strip() else []:
        if not dim:
            raise SpecError(option, None, f"{text!r} has an empty dimension", fix)
        dims.append(int(dim) if dim.isdigit() else dim)
    return TensorDecl(name, tuple(dims), dtype.strip() if colon else None)


def parse_reference(text: str) -> tuple[Path, str]:
    """`ref.py:function`."""
    path, sep, function = text.rpartition(":")
    if not sep or not path or not function:
        raise SpecError("--reference", None, f"{text!r} is not FILE.py:FUNCTION", "e.g. --reference ref.py:softmax")
    if not IDENT.match(function):
        raise SpecError("--reference", None, f"{function!r} is not a function name", "e.g. --reference ref.py:softmax")
    return Path(path), function


# ---- the reference -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UserReference:
    """The user's function, and how the card calls it."""

    file_name: str
    function: str
    fn: Callable[..., object]
    style: Literal["card", "keywords"]
    parameters: tuple[str, ...] = ()
    """Keyword style: the names it takes (tensors and sizes)."""
    required: tuple[str, ...] = ()
    """Keyword style: the names it must be given."""
    any_keyword: bool = False
    """Keyword style: it takes **kwargs."""

    @property
    def where(self) -> str:
        return f"{self.file_name}:{self.function}"

    def call(self, inputs: Arrays, sizes: dict[str, int]) -> object:
        if self.style == "card":
            return self.fn(inputs, dict(sizes))
        passed: dict[str, object] = dict(inputs)
        passed |= {name: value for name, value in sizes.items() if name in self.parameters}
        return self.fn(**passed)


def _import(path: Path) -> ModuleType:
    module_spec = importlib.util.spec_from_file_location(f"kernelforge_new_ref_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise SpecError("--reference", None, f"{path.name} cannot be imported", "give a Python (.py) file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        raise SpecError(
            "--reference",
            None,
            f"importing {path.name} raised {type(exc).__name__}: {exc}",
            "fix the file: it must import on its own, with installed packages only (NumPy)",
        ) from None
    return module


def load_reference(path: Path, function: str) -> UserReference:
    """The function `function` of the Python file at `path`, and whether it takes (inputs, sizes) or keywords."""
    module = _import(path)
    fn = getattr(module, function, None)
    if not callable(fn):
        defined = sorted(
            name
            for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")
        )
        raise SpecError(
            "--reference",
            None,
            f"{path.name} has no function {function!r}",
            f"name one of its functions ({', '.join(defined) or 'it defines none'}) after the colon",
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise SpecError(
            "--reference", None, f"{path.name}:{function} has no readable signature", "define it with `def`"
        ) from None
    params = list(signature.parameters.values())
    if [p.name for p in params] == ["inputs", "sizes"]:
        return UserReference(path.name, function, fn, "card")
    positional_only = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    if positional_only or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        raise SpecError(
            "--reference",
            None,
            f"{path.name}:{function} takes positional-only arguments ({', '.join(positional_only) or '*args'})",
            "take (inputs, sizes), or ordinary parameters named like the tensors",
        )
    named = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return UserReference(
        path.name,
        function,
        fn,
        "keywords",
        parameters=tuple(p.name for p in named),
        required=tuple(p.name for p in named if p.default is inspect.Parameter.empty),
        any_keyword=len(named) < len(params),
    )


def check_dims(decls: Sequence[TensorDecl], sizes: dict[str, int], option: str) -> None:
    """Every declared dim a formula over the --sizes that gives a positive length."""
    for decl in decls:
        for dim in decl.dims or ():
            try:
                value = expr.evaluate(dim, sizes)
            except expr.ExprError as exc:
                raise SpecError(
                    option, None, f"{decl.name}: {exc}", f"use the sizes given with --sizes ({', '.join(sizes)})"
                ) from None
            if value <= 0:
                raise SpecError(option, None, f"{decl.name}: {dim} is {value}", "every dimension must be >= 1")


def input_decls(request: CardRequest, ref: UserReference) -> list[TensorDecl]:
    """The card's inputs: as declared, or the reference's tensor parameters (`x` for a card-style one), each shaped
    by every size in order."""
    every_size = tuple(request.sizes)
    if ref.style == "card":
        return list(request.inputs) or [TensorDecl("x", every_size)]
    if request.inputs:
        for decl in request.inputs:
            if decl.name not in ref.parameters and not ref.any_keyword:
                raise SpecError(
                    "--input",
                    None,
                    f"{ref.where} takes no argument {decl.name!r} (it takes {', '.join(ref.parameters) or 'none'})",
                    "name each --input like a parameter of the function",
                )
        given = {d.name for d in request.inputs} | set(request.sizes)
        missing = [name for name in ref.required if name not in given]
        if missing:
            raise SpecError(
                "--input",
                None,
                f"{ref.where} needs {', '.join(missing)}, which is neither an --input nor a size",
                f"add --input {missing[0]}=DIM,DIM (or a size named {missing[0]})",
            )
        return list(request.inputs)
    tensors = [name for name in ref.required if name not in request.sizes]
    if not tensors:
        raise SpecError(
            "--reference",
            None,
            f"{ref.where} takes no tensor (its parameters: {', '.join(ref.parameters) or 'none'})",
            "give it one parameter per input tensor, or take (inputs, sizes) and declare them with --input",
        )
    return [TensorDecl(name, every_size) for name in tensors]


# ---- finding the outputs -------------------------------------------------------------------------------------------


def probe_sizes(sizes: Sequence[str], inputs: Sequence[TensorDecl]) -> list[dict[str, int]]:
    """Two assignments of small sizes, distinct within each and different for every size between the two (odd and
    even multiples of 8: 40, 56, 72, ... and 48, 64, 80, ...), smaller ones (4k+2 and 4k) where a tensor would be
    too big."""
    for first, second in (
        ([8 * (2 * i + 5) for i in range(len(sizes))], [16 * (i + 3) for i in range(len(sizes))]),
        ([4 * i + 6 for i in range(len(sizes))], [4 * i + 8 for i in range(len(sizes))]),
    ):
        probes = [dict(zip(sizes, first, strict=True)), dict(zip(sizes, second, strict=True))]
        try:
            fits = all(_numel(d.dims or (), probe) <= PROBE_MAX_ELEMENTS for d in inputs for probe in probes)
        except expr.ExprError:
            fits = False
        if fits:
            return probes
    return probes


def _numel(dims: Sequence[str | int], sizes: dict[str, int]) -> int:
    count = 1
    for dim in dims:
        count *= expr.evaluate(dim, sizes)
    return count


def random_inputs(decls: Sequence[TensorDecl], sizes: dict[str, int], dtype: str, seed: int) -> Arrays:
    """Small normal(0, 1) inputs (rounded for integer dtypes), as `draw_inputs` draws a card's."""
    rng = np.random.default_rng(seed)
    arrays: Arrays = {}
    for decl in decls:
        kind = decl.dtype or dtype
        dims = tuple(expr.evaluate(dim, sizes) for dim in decl.dims or ())
        values = rng.standard_normal(dims, dtype=np.float32)
        if kind not in FLOATING:
            values = np.rint(values)
        arrays[decl.name] = np.ascontiguousarray(values.astype(NUMPY[kind]))
    return arrays


def returned_arrays(ref: UserReference, result: object, names: Sequence[str]) -> dict[str, np.ndarray]:
    """What the reference returned, named: a dict's keys; else `names` (the --output order, or y / y0, y1, ...)."""
    if isinstance(result, dict):
        values = {str(k): v for k, v in result.items()}
    else:
        items = list(result) if isinstance(result, (tuple, list)) else [result]
        if names and len(names) != len(items):
            raise SpecError(
                "--output",
                None,
                f"{ref.where} returned {len(items)} arrays and {len(names)} --output names were given",
                "give one --output per returned array, in order",
            )
        chosen = list(names) or (["y"] if len(items) == 1 else [f"y{i}" for i in range(len(items))])
        values = dict(zip(chosen, items, strict=True))
    arrays: dict[str, np.ndarray] = {}
    for name, value in values.items():
        array = np.asarray(value)
        if array.dtype.kind not in "biuf" and array.dtype.name not in DTYPES:
            raise SpecError(
                "--reference",
                None,
                f"{ref.where} returned {name!r} as {type(value).__name__} ({array.dtype}), not a numeric array",
                "return NumPy arrays: a dict of outputs, one array, or a tuple of arrays",
            )
        arrays[name] = array
    if not arrays:
        raise SpecError("--reference", None, f"{ref.where} returned no outputs", "return at least one array")
    return arrays


def _run(ref: UserReference, inputs: Arrays, sizes: dict[str, int], names: Sequence[str]) -> Returned:
    try:
        with np.errstate(all="ignore"):
            result = ref.call(inputs, sizes)
    except Exception as exc:
        shapes = ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in inputs.items())
        raise SpecError(
            "--reference",
            None,
            f"{ref.where} raised {type(exc).__name__}: {exc} (inputs: {shapes}; sizes: {sizes})",
            "fix the function; if its inputs are not one tensor per parameter shaped by every size, declare them "
            "with --input NAME=DIM,DIM",
        ) from None
    return Returned(returned_arrays(ref, result, names), isinstance(result, dict))


@dataclass(frozen=True)
class Returned:
    arrays: dict[str, np.ndarray]
    as_dict: bool


def _match_dims(name: str, shapes: list[tuple[int, ...]], probes: list[dict[str, int]]) -> tuple[str | int, ...]:
    """The shape formula of an output seen with `shapes` at `probes`: each dim a size, or a constant."""
    if len({len(s) for s in shapes}) != 1:
        raise SpecError(
            "--output",
            None,
            f"output {name!r} changed rank between sizes ({' vs '.join(map(str, shapes))})",
            f"give its shape with --output {name}=DIM,DIM",
        )
    dims: list[str | int] = []
    for axis, values in enumerate(zip(*shapes, strict=True)):
        if len(set(values)) == 1 and len(probes) > 1:
            dims.append(values[0])
            continue
        matches = [
            {size for size, v in probe.items() if v == value} for probe, value in zip(probes, values, strict=True)
        ]
        common = set.intersection(*matches)
        if len(common) == 1:
            dims.append(common.pop())
        elif len(probes) == 1 and not common:
            dims.append(values[0])
        else:
            seen = "; ".join(
                f"{value} at {', '.join(f'{k}={v}' for k, v in probe.items())}"
                for probe, value in zip(probes, values, strict=True)
            )
            problem = f"could be any of {', '.join(sorted(common))}" if common else "follows no size"
            raise SpecError(
                "--output",
                None,
                f"output {name!r}: dimension {axis} ({seen}) {problem}",
                f"give its shape with --output {name}=DIM,DIM (dims are sizes or formulas such as rows*cols)",
            )
    return tuple(dims)


def output_decls(
    request: CardRequest, ref: UserReference, inputs: Sequence[TensorDecl]
) -> tuple[list[TensorDecl], bool]:
    """The card's outputs with their shapes and dtypes (an integer output keeps its own), and whether the reference
    returns a dict."""
    declared = {d.name: d for d in request.outputs}
    order = [d.name for d in request.outputs]
    probes = probe_sizes(list(request.sizes), inputs)
    try:
        seen = [
            _run(ref, random_inputs(inputs, probe, request.dtype, 7 + i), probe, order)
            for i, probe in enumerate(probes)
        ]
    except SpecError as first:
        try:  # the reference may need the real sizes' relations (divisibility, equal sizes): probe there once
            probes = [dict(request.sizes)]
            seen = [_run(ref, random_inputs(inputs, probes[0], request.dtype, 7), probes[0], order)]
        except SpecError:
            raise first from None
    names = list(seen[0].arrays)
    missing = [name for name in order if name not in names]
    if missing:
        raise SpecError(
            "--output",
            None,
            f"{ref.where} returned no {', '.join(map(repr, missing))} (it returned {', '.join(names)})",
            "name the outputs as the function's returned dict does",
        )
    taken = set(request.sizes) | {d.name for d in inputs}
    outputs: list[TensorDecl] = []
    for name in order + [n for n in names if n not in order]:
        if not IDENT.match(name):
            raise SpecError("--reference", None, f"output name {name!r} is not an identifier", "use letters, digits, _")
        if name in taken:
            raise SpecError(
                "--output",
                None,
                f"output name {name!r} is also an input or a size",
                "return it under another name (or, for returned arrays, name them with --output NEWNAME in order)",
            )
        returned = seen[0].arrays[name].dtype
        own = returned.name if returned.kind in "biu" and returned.name in DTYPES else None
        decl = declared.get(name)
        shapes = [tuple(s.arrays[name].shape) for s in seen]
        if decl is not None and decl.dims is not None:
            dims = decl.dims
            for probe, shape in zip(probes, shapes, strict=True):
                expected = tuple(expr.evaluate(dim, probe) for dim in dims)
                if expected != shape:
                    at = ", ".join(f"{k}={v}" for k, v in probe.items())
                    raise SpecError(
                        "--output",
                        None,
                        f"at {at} {ref.where} returned {name!r} shaped {shape}, and --output {name} says {expected}",
                        f"correct --output {name}=DIM,DIM",
                    )
        else:
            dims = _match_dims(name, shapes, probes)
        outputs.append(TensorDecl(name, dims, (decl.dtype if decl else None) or own or request.dtype))
    return outputs, seen[0].as_dict


# ---- the card ------------------------------------------------------------------------------------------------------


def _dims_formula(dims: Sequence[str | int]) -> str:
    parts = [str(d) if isinstance(d, int) or IDENT.match(d) else f"({d})" for d in dims]
    return "*".join(parts) or "1"


def bytes_formula(tensors: Sequence[TensorSpec]) -> str:
    """The bytes a kernel must move at least: every tensor once, e.g. `4*rows*cols` for a bf16 x and y."""
    per_shape: dict[str, int] = {}
    for tensor in tensors:
        shape = _dims_formula(tensor.shape)
        per_shape[shape] = per_shape.get(shape, 0) + NUMPY[tensor.dtype].itemsize
    return " + ".join(f"{count}*{shape}" for shape, count in per_shape.items())


def adapter_source(ref: UserReference, user_file: str, outputs: Sequence[str]) -> str:
    """The generated module that gives the card its (inputs, sizes) -> dict reference."""
    call = (
        f"_module.{ref.function}(inputs, dict(sizes))"
        if ref.style == "card"
        else f"_module.{ref.function}(**inputs, **{{k: v for k, v in sizes.items() if k in _PARAMETERS}})"
    )
    return f'''"""Written by `kernelforge new`: the card's reference. It calls {ref.function}() from {user_file}
and names what it returns, so the card can call it as (inputs, sizes) -> dict of outputs.
Edit {user_file}, not this file."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("kernelforge_card_user_ref", Path(__file__).with_name({user_file!r}))
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

_PARAMETERS = {sorted(ref.parameters)!r}
OUTPUTS = {list(outputs)!r}


def reference(inputs, sizes):
    result = {call}
    if isinstance(result, dict):
        return result
    if not isinstance(result, (tuple, list)):
        result = (result,)
    return dict(zip(OUTPUTS, result, strict=True))
'''


@dataclass
class CardDraft:
    """A card being built in `work` (a temporary directory beside `dest`): the manifest without its baseline, and
    the stored sets with their reference outputs."""

    request: CardRequest
    dest: Path
    work: Path
    spec: OperatorCard
    stored: dict[str, tuple[Arrays, Arrays]] = field(default_factory=dict)
    reference_source: str = ""
    """The reference file's text (the baseline prompt shows it)."""

    def finish(self, source: str, plan: LaunchPlan) -> Card:
        """Write the baseline and the manifest, check the card with `load_card`, and move it into place."""
        try:
            resolve(plan, self.spec)
        except expr.ExprError as exc:
            raise SpecError(
                "--plan", None, f"the baseline's plan does not fit the card: {exc}", "fix the plan"
            ) from None
        (self.work / BASELINE).write_text(source)
        spec = self.spec.model_copy(update={"baseline": BaselineSpec(source=BASELINE, plan=plan)})
        spec = OperatorCard.model_validate(spec.model_dump())
        save_card(spec, self.work, self.stored)
        try:
            self.work.rename(self.dest)
        except OSError as exc:
            raise SpecError(
                "-o", None, f"cannot move the card to {self.dest} ({exc.strerror})", "pick another directory with -o"
            ) from None
        return load_card(self.dest)


def destination(request: CardRequest, out: Path | None) -> Path:
    dest = out if out is not None else Path(request.name)
    if dest.exists():
        raise SpecError(
            "-o", None, f"{dest} already exists", "pick another directory with -o, or remove that one first"
        )
    if not dest.parent.is_dir():
        raise SpecError("-o", None, f"{dest.parent} is not a directory", "create it first, or pick another -o")
    return dest


@contextmanager
def drafting(request: CardRequest, out: Path | None = None) -> Iterator[CardDraft]:
    """Build the card in a temporary directory beside its destination: the reference copied (and wrapped), inputs
    and outputs found, the stored sets drawn and referenced through the card's own reference. The caller adds the
    baseline with `CardDraft.finish`; leaving the block without finishing, or with an error, removes everything."""
    dest = destination(request, out)
    if not request.reference.is_file():
        raise SpecError(
            "--reference",
            None,
            f"{request.reference}: no such file",
            "give the Python file that holds the reference, as FILE.py:FUNCTION",
        )
    if request.sets < 1:
        raise SpecError("--sets", None, f"{request.sets} input sets", "give at least 1")
    work = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:12]}.new"
    work.mkdir()  # as the user's umask says (mkdtemp would make it private)
    try:
        yield _draft(request, dest, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _draft(request: CardRequest, dest: Path, work: Path) -> CardDraft:
    user_file = request.reference.name if request.reference.name not in (ADAPTER, MANIFEST) else "user_reference.py"
    try:
        text = request.reference.read_bytes().decode()
    except UnicodeDecodeError:
        raise SpecError("--reference", None, f"{request.reference} is not UTF-8 text", "save it as UTF-8") from None
    (work / user_file).write_text(text)
    check_dims(request.inputs, request.sizes, "--input")
    check_dims(request.outputs, request.sizes, "--output")
    ref = load_reference(work / user_file, request.function)
    inputs = input_decls(request, ref)
    outputs, as_dict = output_decls(request, ref, inputs)
    if ref.style == "card" and as_dict:
        function = f"{user_file}:{request.function}"
    else:
        (work / ADAPTER).write_text(adapter_source(ref, user_file, [o.name for o in outputs]))
        function = f"{ADAPTER}:reference"
    tensors = [TensorSpec(name=d.name, dtype=d.dtype or request.dtype, shape=list(d.dims or ())) for d in inputs]
    results = [OutputSpec(name=d.name, dtype=d.dtype or request.dtype, shape=list(d.dims or ())) for d in outputs]
    set_bytes = sum(t.nbytes(request.sizes) for t in [*tensors, *results])
    stored = set_bytes <= MAX_STORED_SET_BYTES
    sets = [InputSet(name=f"set_{i}", file=f"set_{i}.npz") for i in range(1, request.sets + 1)] if stored else []
    sets += [InputSet(name=f"seed_{i}", seed=i) for i in range(request.sets + 1 if stored else 1, request.sets + 2)]
    try:
        spec = OperatorCard.model_validate(
            {
                "name": request.name,
                "family": request.family,
                "description": request.spec,
                "sizes": request.sizes,
                "inputs": tensors,
                "outputs": results,
                "cost": Cost(flops=request.flops, bytes=bytes_formula([*tensors, *results])),
                "input_sets": sets,
                "reference": Reference(kind="numpy", function=function),
                "stress": StressSpec(seed=STRESS_SEED),
            }
        )
    except ValidationError as exc:
        problem = from_validation_error(Path(MANIFEST), exc)
        raise SpecError("the card", problem.field, problem.problem, _option_fix(problem.field, problem.fix)) from None
    draft = CardDraft(request, dest, work, spec, reference_source=text)
    card = Card(spec=spec, root=work)
    for i, which in enumerate(sets, start=1):
        if which.file is not None:
            inputs_i = draw_inputs(spec, i)
            draft.stored[which.name] = (inputs_i, _reference(card, ref, inputs_i))
    if not stored:  # the card's own reference runs once at the card's sizes, as the worker will run it
        _reference(card, ref, draw_inputs(spec, 1))
    return draft


def _reference(card: Card, ref: UserReference, inputs: Arrays) -> Arrays:
    """Reference outputs through the card's own reference (the copied file, or the adapter around it)."""
    try:
        return card.reference(inputs)
    except Exception as exc:
        raise SpecError(
            "--reference",
            None,
            f"{ref.where} raised {type(exc).__name__} at the card's sizes: {exc}",
            "fix the function so it runs at the --sizes given",
        ) from None


def _option_fix(field_name: str | None, fix: str) -> str:
    if field_name and field_name.startswith("cost.flops"):
        return f"{fix} (--flops)"
    return fix
