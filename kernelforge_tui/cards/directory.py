"""Load and save card directories: `card.toml` plus one `.npz` per stored input set."""

from __future__ import annotations

import importlib.util
import os
import threading
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
from pydantic import ValidationError

from kernelforge_tui.cards import references, stress
from kernelforge_tui.cards.dtypes import FLOATING, NUMPY, STORAGE, from_storage, to_storage
from kernelforge_tui.cards.errors import CardError, from_validation_error, read_toml
from kernelforge_tui.cards.model import InputSet, OperatorCard, TensorSpec
from kernelforge_tui.cards.plan import resolve_in
from kernelforge_tui.errors import not_utf8

MANIFEST = "card.toml"

Arrays = dict[str, np.ndarray]
SetMaker = Callable[[], tuple[Arrays, Arrays]]
"""Makes one input set on the host: its (inputs, reference outputs)."""
T = TypeVar("T")

SET_MEMORY_FACTOR = 6
"""Host memory one set takes while it is made, beyond its own arrays, in multiples of its bytes: float32 and
float64 working copies of its data tensors and the reference's temporaries (5.2 measured, for a 1 GB bf16 card)."""


@dataclass(frozen=True)
class Card:
    """A loaded card: the manifest and the directory its files live in."""

    spec: OperatorCard
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    def file(self, name: str, field: str) -> Path:
        """A file the manifest names in `field`. It must live inside the card directory: a path that leaves it
        (absolute, `..`, or a symlink out) is refused, since a card is a directory a person can read and review,
        and its reference is Python that runs."""
        path = (self.root / name).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise CardError(
                self.manifest,
                field,
                f"{name!r} is outside the card directory",
                "keep the card's files inside it (no absolute paths, '..', or symlinks that lead out)",
            )
        return path

    def baseline_source(self) -> str:
        """The baseline kernel's CUDA source."""
        if self.spec.baseline is None:
            raise CardError(self.manifest, "baseline", "this card has no baseline kernel", "add [baseline]")
        path = self.file(self.spec.baseline.source, "baseline.source")
        if not path.is_file():
            raise CardError(self.manifest, "baseline.source", f"{path.name} not found", "add the file or fix the name")
        try:
            return path.read_bytes().decode()
        except UnicodeDecodeError as exc:
            raise CardError(path, None, not_utf8(exc), "save it as UTF-8") from None

    def input_set(self, which: InputSet) -> tuple[Arrays, Arrays]:
        """(inputs, reference outputs) of one set: read from its file, or drawn from its seed."""
        if which.seed is not None:
            inputs = self.draw(which.seed)
            return inputs, self.reference(inputs)
        assert which.file is not None
        path = self.file(which.file, f"input_sets.{which.name}.file")
        try:
            with zipfile.ZipFile(path) as archive:
                inputs = {spec.name: _read_member(path, archive, spec, self.spec.sizes) for spec in self.spec.inputs}
                outputs = {spec.name: _read_member(path, archive, spec, self.spec.sizes) for spec in self.spec.outputs}
        except FileNotFoundError:
            raise CardError(
                path, None, "input set file not found", "restore it or drop the set from card.toml"
            ) from None
        except (OSError, zipfile.BadZipFile) as exc:
            raise CardError(path, None, f"not a readable .npz file ({exc})", "re-create the set") from None
        return inputs, outputs

    def stress_sets(self) -> Iterator[tuple[str, Arrays, Arrays]]:
        """(name, inputs, reference outputs) of each stress set the card runs (cards/stress.py), made one at a
        time."""
        for label, make in self.stress_makers():
            yield label, *make()

    def stress_makers(self) -> list[tuple[str, SetMaker]]:
        """Each stress set the card runs, as its label and a function that makes its (inputs, reference outputs)
        on top of one draw of the card's distribution from its stress seed. The draw is made once, by the first
        maker called; the makers may run side by side (`make_side_by_side`)."""
        base = _Once(lambda: self.draw(self.spec.stress.seed))

        def maker(name: str) -> SetMaker:
            def make() -> tuple[Arrays, Arrays]:
                inputs = stress.draw(self.spec, name, base())
                return inputs, self.reference(inputs)

            return make

        return [(planned.label, maker(planned.name)) for planned in stress.running(self.spec)]

    def draw(self, seed: int) -> Arrays:
        """Fresh inputs from a seed: by the card's `[reference] inputs` function when it has one, else from each
        tensor's distribution (`draw_inputs`)."""
        where = self.spec.reference.inputs
        if where is None:
            return draw_inputs(self.spec, seed)
        with np.errstate(all="ignore"):
            raw = self._function(where, "reference.inputs", "(sizes, seed) -> dict of inputs")(
                dict(self.spec.sizes), seed
            )
        if not isinstance(raw, dict):
            raise CardError(self.manifest, "reference.inputs", f"it returned {type(raw).__name__}", "return a dict")
        drawn: Arrays = {}
        for spec in self.spec.inputs:
            if spec.name not in raw:
                raise CardError(
                    self.manifest, "reference.inputs", f"it drew no input {spec.name!r}", "draw every input"
                )
            array = np.asarray(raw[spec.name])
            if array.shape != spec.dims(self.spec.sizes) or array.dtype != NUMPY[spec.dtype]:
                raise CardError(
                    self.manifest,
                    "reference.inputs",
                    f"{spec.name} drawn as {array.dtype}{list(array.shape)}, the card says "
                    f"{spec.dtype}{list(spec.dims(self.spec.sizes))}",
                    "draw each input with the card's dtype and shape",
                )
            drawn[spec.name] = np.ascontiguousarray(array)
        return drawn

    def _function(self, function: str, field: str, signature: str) -> Callable[..., Any]:
        """A built-in reference by name, or `file.py:name` in the card directory."""
        if ":" not in function:
            builtin = references.BUILTIN if field == "reference.function" else {}
            if function not in builtin:
                fix = f"use one of {sorted(builtin)} or 'file.py:function'" if builtin else "use 'file.py:function'"
                raise CardError(self.manifest, field, f"no built-in reference {function!r}", fix)
            return references.BUILTIN[function]
        file_name, _, name = function.partition(":")
        path = self.file(file_name, field)
        module_spec = importlib.util.spec_from_file_location(f"kernelforge_card_ref_{path.stem}", path)
        if module_spec is None or module_spec.loader is None or not path.is_file():
            raise CardError(self.manifest, field, f"{file_name} not found", "add the file beside card.toml")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        fn = getattr(module, name, None)
        if not callable(fn):
            raise CardError(path, name, "no such function", f"define {name}{signature}")
        return fn  # type: ignore[no-any-return]

    def reference(self, inputs: Arrays) -> Arrays:
        """Reference outputs for any inputs, rounded to the output dtypes. Overflow, NaN and inf are computed
        as IEEE arithmetic says, silently: stress sets hold them on purpose, and the result is the expectation."""
        ref = self.spec.reference
        if ref.kind != "numpy" or ref.function is None:
            raise CardError(
                self.manifest,
                "reference.kind",
                "no host reference for fresh inputs",
                "give a numpy reference function (the baseline reference runs on the GPU)",
            )
        with np.errstate(all="ignore"):
            raw = self._function(ref.function, "reference.function", "(inputs, sizes) -> dict of outputs")(
                inputs, dict(self.spec.sizes)
            )
            result: Arrays = {}
            for spec in self.spec.outputs:
                if spec.name not in raw:
                    raise CardError(
                        self.manifest,
                        "reference.function",
                        f"it returned no output {spec.name!r}",
                        "return a dict with every output",
                    )
                result[spec.name] = np.ascontiguousarray(
                    np.asarray(raw[spec.name]).astype(NUMPY[spec.dtype], copy=False).reshape(spec.dims(self.spec.sizes))
                )
        return result


READ_CHUNK = 1 << 20
"""Bytes decompressed at a time from an .npz member, so reading one never holds more than its array and a chunk."""
NPY_HEADER_BYTES = 1 << 16
"""Room for the header of an .npy member beyond its data: numpy's own reader refuses headers over 10,000 bytes."""
MAX_STORED_SET_BYTES = 64 << 20
"""A card's input set whose tensors take more than this is drawn from its seed when the card is loaded, not stored as
.npz (`kernelforge new` always, `kernelforge capture --max-set-mib` by default): a 4096 x 32768 bf16 set would be
hundreds of MB on disk."""


def _read_member(path: Path, archive: zipfile.ZipFile, spec: TensorSpec, sizes: dict[str, int]) -> np.ndarray:
    """One array of a stored set, checked against the card before its data is read: the member may hold no more
    than the card's shape needs and a header, the .npy header's dtype and shape must be the card's, and its data
    exactly the bytes that shape needs. So a truncated file, a header that declares terabytes, or a member that
    inflates beyond its array is a CardError naming the file and the array, never a MemoryError or a member
    decompressed whole (reads stop at the size the archive declares)."""
    names = set(archive.namelist())
    member = next((m for m in (f"{spec.name}.npy", spec.name) if m in names), None)
    if member is None:
        raise CardError(path, spec.name, "array missing", f"store {spec.name!r} in every input set")
    redo = "re-capture the set or fix the sizes in card.toml"
    expected = spec.dims(sizes)
    flat = np.empty(spec.numel(sizes), STORAGE[spec.dtype])
    data = flat.view(np.uint8)
    size = archive.getinfo(member).file_size
    if size > len(data) + NPY_HEADER_BYTES:
        raise CardError(path, spec.name, f"holds {size} bytes where its shape {expected} needs {len(data)}", redo)
    try:
        with archive.open(member) as stream:
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
            else:
                raise CardError(path, spec.name, f".npy format {version} is not supported", "re-create the set")
            if dtype != STORAGE[spec.dtype]:
                raise CardError(
                    path,
                    spec.name,
                    f"stored as {dtype}, expected {STORAGE[spec.dtype]} for {spec.dtype}",
                    "store the array with the dtype card.toml declares",
                )
            if tuple(shape) != expected:
                raise CardError(path, spec.name, f"shape {tuple(shape)} but card.toml says {expected}", redo)
            held = size - stream.tell()
            if held != len(data):
                raise CardError(path, spec.name, f"holds {held} bytes of data where its shape needs {len(data)}", redo)
            got = 0
            while got < len(data):
                chunk = stream.read(min(READ_CHUNK, len(data) - got))
                if not chunk:
                    raise CardError(path, spec.name, f"ends after {got} of {len(data)} bytes", redo)
                data[got : got + len(chunk)] = np.frombuffer(chunk, np.uint8)
                got += len(chunk)
    except (ValueError, SyntaxError, tokenize.TokenError, EOFError, zlib.error, zipfile.BadZipFile) as exc:
        raise CardError(path, spec.name, f"not a readable .npy member ({exc})", "re-create the set") from None
    array = from_storage(flat, spec.dtype).reshape(expected, order="F" if fortran else "C")
    return np.ascontiguousarray(array)


def draw_inputs(spec: OperatorCard, seed: int) -> Arrays:
    """Fresh inputs of the card's shapes, dtypes and value distributions, from a seed."""
    rng = np.random.default_rng(seed)
    arrays: Arrays = {}
    for tensor in spec.inputs:
        dims = tensor.dims(spec.sizes)
        dist = tensor.distribution
        values: np.ndarray
        if dist.kind == "normal":
            values = rng.standard_normal(dims, dtype=np.float32)
            values *= np.float32(dist.std)  # in place: the same float32 arithmetic as `values * std + mean`
            values += np.float32(dist.mean)  # (also turns the generator's rare -0.0 into +0.0, as before)
        elif dist.kind == "uniform":
            values = rng.uniform(dist.low, dist.high, dims).astype(np.float32)
        else:
            values = rng.integers(int(dist.low), int(dist.high), dims)
        if tensor.dtype not in FLOATING and dist.kind != "randint":
            values = np.rint(values)
        arrays[tensor.name] = np.ascontiguousarray(values.astype(NUMPY[tensor.dtype], copy=False))
    return arrays


def load_card(path: Path) -> Card:
    """Read and check a card directory (or its card.toml)."""
    root = path.parent if path.is_file() or path.name == MANIFEST else path
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise CardError(manifest, None, "no card manifest here", "point at a card directory holding card.toml")
    data = read_toml(manifest, "point at a card directory holding card.toml")
    try:
        spec = OperatorCard.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(manifest, exc) from None
    card = Card(spec=spec, root=root)
    if spec.baseline is not None:
        resolve_in(manifest, spec.baseline.plan, spec, "baseline.plan")
    for which in spec.input_sets:
        if which.file is None:
            continue
        field = f"input_sets.{which.name}.file"
        stored = card.file(which.file, field)
        if not stored.is_file():
            raise CardError(
                manifest, field, f"{which.file} not found", "restore the file, or use `seed = N` to draw the set"
            )
        if not zipfile.is_zipfile(stored):
            raise CardError(manifest, field, f"{which.file} is not an .npz (zip) file", "re-create the set")
    if spec.baseline is not None and not card.file(spec.baseline.source, "baseline.source").is_file():
        raise CardError(manifest, "baseline.source", f"{spec.baseline.source} not found", "add the kernel file")
    if spec.reference.function is not None and ":" in spec.reference.function:
        card.file(spec.reference.function.partition(":")[0], "reference.function")
    return card


def save_card(spec: OperatorCard, root: Path, stored_sets: dict[str, tuple[Arrays, Arrays]]) -> Card:
    """Write card.toml and the .npz of each stored set (name -> (inputs, outputs))."""
    root.mkdir(parents=True, exist_ok=True)
    for which in spec.input_sets:
        if which.file is None:
            continue
        inputs, outputs = stored_sets[which.name]
        arrays = {t.name: to_storage(inputs[t.name], t.dtype) for t in spec.inputs}
        arrays |= {t.name: to_storage(outputs[t.name], t.dtype) for t in spec.outputs}
        _write_npz(root / which.file, arrays)
    (root / MANIFEST).write_text(to_toml(spec.model_dump(mode="json", exclude_defaults=True)))
    return load_card(root)


def _write_npz(path: Path, arrays: Arrays) -> None:
    """Like np.savez_compressed, but byte-for-byte reproducible (fixed member timestamps), so that
    re-writing a card from the same data leaves git with nothing to commit."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            member = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            member.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(member, "w", force_zip64=True) as stream:
                np.lib.format.write_array(stream, np.ascontiguousarray(array), allow_pickle=False)


def _toml_string(value: str) -> str:
    """A TOML basic string (multi-line when the text has line breaks), every control character escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(
        ch if ch == "\n" or (ord(ch) >= 0x20 and ord(ch) != 0x7F) else f"\\u{ord(ch):04x}" for ch in escaped
    )
    if "\n" in value:
        return '"""\n' + escaped + '"""'
    return '"' + escaped + '"'


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def to_toml(data: dict[str, object]) -> str:
    """A small TOML writer for manifests: scalars first, then tables and arrays of tables."""
    lines: list[str] = []
    tables: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append(f"\n[{key}]")
            tables += [f"{k} = {_toml_value(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                tables.append(f"\n[[{key}]]")
                tables += [f"{k} = {_toml_value(v)}" for k, v in item.items()]
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines + tables) + "\n"


class _Once(Generic[T]):
    """A value made at the first call and shared by every later one, from any thread."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._made: list[T] = []

    def __call__(self) -> T:
        with self._lock:
            if not self._made:
                self._made.append(self._make())
            return self._made[0]


def available_memory() -> int | None:
    """The host memory free now, in bytes, where the system says (Linux); else None."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def side_by_side(jobs: int, set_bytes: int, free_bytes: int | None) -> int:
    """How many of `jobs` sets to make at once: one a CPU, and as many as half the free memory holds once every
    set's own arrays are counted, at SET_MEMORY_FACTOR times a set's bytes each; at least one. Half: the other
    GPUs' workers may be loading cards too."""
    count = min(jobs, os.cpu_count() or 1)
    if free_bytes is not None:
        count = min(count, (free_bytes // 2 - jobs * set_bytes) // max(1, SET_MEMORY_FACTOR * set_bytes))
    return max(1, count)


def make_side_by_side(makers: Sequence[Callable[[], T]], set_bytes: int, at_once: int | None = None) -> list[T]:
    """Every maker's result, in order, made on threads: drawing, stressing and referencing a large card's sets
    is NumPy and torch work that leaves the GIL, and one after another it took minutes for a 1 GB card. As
    many at once as `side_by_side` says, unless `at_once` is given. The first error (in order) is raised here, and
    the makers not started by then never start."""
    workers = at_once or side_by_side(len(makers), set_bytes, available_memory())
    if workers == 1:
        return [make() for make in makers]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="card-set") as pool:
        futures = [pool.submit(make) for make in makers]
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()
