"""Loading the user's model file and calling its entry, with the user's own errors.

The entry (`--entry`):
- `build` (the default), one function: `build(**kwargs) -> (model, example_inputs)`.
- `make_model:make_inputs`, two functions: `make_model(**kwargs) -> model`, `make_inputs(**kwargs) -> inputs`.

Each function gets, by keyword, those of `device` and the `--kwarg NAME=VALUE` values it declares (or all of them
when it takes `**kwargs`). The model is any callable (an `nn.Module` usually); inputs are a tuple or list (positional
arguments), a dict (keyword arguments) or a single value (one argument). Call `.eval()` in the entry for inference:
the capture runs the model as it is given, under `torch.no_grad()`.

Why trimmed tracebacks: when the model file fails to import, to build or to run, the user needs their own error at
their own line, not frames of importlib, of this package or of torch's dispatcher. `UserCodeError` keeps the frames
from the model's directory (and the last frame inside a library the user called, which names what was called) and the
exception's own message.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import linecache
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType

from kernelforge_tui.errors import BadInput

PACKAGE_DIR = Path(__file__).resolve().parent.parent


class UserCodeError(BadInput):
    """The model file raised (importing it, building the model or running it): its error at its line (exit 2)."""

    def __init__(self, stage: str, model_file: Path, exc: BaseException) -> None:
        self.stage = stage
        self.model_file = model_file
        self.exc_type = type(exc).__name__
        self.frames, mine = user_frames(exc.__traceback__, model_file)
        last = self.frames[mine - 1] if mine else None
        where = f"{last.filename}:{last.lineno}" if last is not None else str(model_file)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        shown: list[str] = []
        if isinstance(exc, SyntaxError) and exc.filename:
            self.frames = self.frames[:mine]  # the rest is the compiler's way in (importlib), not where the error is
            where, detail, shown = _syntax_error(exc, model_file)
        lines = [f"{where}: {stage} failed: {detail}", *shown]
        if self.frames:
            lines.append("Traceback (the model's frames, and where the error was raised):")
            lines += [line.rstrip("\n") for line in traceback.format_list(self.frames)]
        self.where = where
        self.detail = detail
        super().__init__("\n".join(lines))


def _syntax_error(exc: SyntaxError, model_file: Path) -> tuple[str, str, list[str]]:
    """Where a SyntaxError is (FILE:LINE:COLUMN, the file as the user named it when it is the model file), its
    message, and the offending line with a caret under the column: the error is in the source, so no frame shows it."""
    filename = str(exc.filename)
    with contextlib.suppress(OSError):
        if Path(filename).resolve() == model_file.resolve():
            filename = str(model_file)
    where = filename + "".join(f":{n}" for n in (exc.lineno, exc.offset) if n)
    detail = f"{type(exc).__name__}: {exc.msg}"
    text = (exc.text or "").rstrip("\r\n")
    if not text.strip():
        return where, detail, []
    code = text.lstrip()
    column = max(0, (exc.offset or 1) - 1 - (len(text) - len(code)))
    width = 1
    if exc.end_lineno == exc.lineno and exc.end_offset and exc.offset and exc.end_offset > exc.offset:
        width = exc.end_offset - exc.offset
    return where, detail, [f"    {code}", "    " + " " * column + "^" * width]


def _is_source(filename: str) -> bool:
    """A frame of a real file: not `<frozen importlib._bootstrap>` or `<string>`, which name no file (and which a
    relative resolve would place in the working directory, the model's own, often)."""
    return not filename.startswith("<")


def _is_user(filename: str, user_dir: Path) -> bool:
    if not _is_source(filename):
        return False
    try:
        path = Path(filename).resolve()
    except (OSError, RuntimeError):
        return False
    if path.is_relative_to(PACKAGE_DIR):
        return False
    if any(part in ("site-packages", "dist-packages") for part in path.parts):
        return False
    return path.is_relative_to(user_dir)


def user_frames(tb: TracebackType | None, model_file: Path) -> tuple[list[traceback.FrameSummary], int]:
    """The frames of the model's own files (its directory, outside this package and installed libraries), then the
    deepest frame of a file outside this package below the last of them when the error was raised deeper (inside
    torch, say: it names what failed, e.g. nn.Linear's forward); no frame of kernelforge's own, none of importlib's.
    With the count of user frames."""
    frames = traceback.extract_tb(tb)
    user_dir = model_file.resolve().parent
    kept: list[traceback.FrameSummary] = []
    last_user = -1
    for k, frame in enumerate(frames):
        if _is_user(frame.filename, user_dir):
            kept.append(frame)
            last_user = k
    count = len(kept)
    for frame in reversed(frames[last_user + 1 :]):
        if _is_source(frame.filename) and not Path(frame.filename).resolve().is_relative_to(PACKAGE_DIR):
            kept.append(frame)
            break
    return kept, count


@dataclass(frozen=True)
class Entry:
    """What `--entry` names: one function returning (model, inputs), or two."""

    model_fn: str
    inputs_fn: str | None = None

    @classmethod
    def parse(cls, text: str) -> Entry:
        model_fn, sep, inputs_fn = text.partition(":")
        names = [model_fn] + ([inputs_fn] if sep else [])
        if not all(n.isidentifier() for n in names):
            raise BadInput(f"--entry {text!r}: give a function name (build) or two (make_model:make_inputs)")
        return cls(model_fn, inputs_fn or None)

    def __str__(self) -> str:
        return self.model_fn + (f":{self.inputs_fn}" if self.inputs_fn else "")


@contextlib.contextmanager
def _model_dir_on_path(model_file: Path) -> Iterator[None]:
    """The model's directory first on sys.path while it imports (its sibling modules resolve, as with `python FILE`)."""
    directory = str(model_file.resolve().parent)
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(directory)


def import_model_file(model_file: Path) -> ModuleType:
    """Import the user's file as a fresh module; UserCodeError when it raises."""
    if not model_file.is_file():
        raise BadInput(f"{model_file}: no such file (give the Python file that builds the model)")
    if model_file.suffix != ".py":
        raise BadInput(f"{model_file}: not a .py file (give the Python file that builds the model)")
    name = f"kernelforge_capture_{model_file.stem}"
    spec = importlib.util.spec_from_file_location(name, model_file.resolve())
    if spec is None or spec.loader is None:
        raise BadInput(f"{model_file}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    linecache.checkcache(str(model_file.resolve()))
    with _model_dir_on_path(model_file):
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            sys.modules.pop(name, None)
            raise UserCodeError("import", model_file, exc) from None
    return module


def _function(module: ModuleType, name: str, model_file: Path, entry: Entry) -> Callable[..., object]:
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise BadInput(
            f"{model_file}: no function {name!r} (--entry {entry}); its functions: {', '.join(defined) or 'none'}. "
            "Define build(device) returning (model, example_inputs), or pass --entry MAKE_MODEL:MAKE_INPUTS"
        )
    if not callable(fn):
        raise BadInput(f"{model_file}: {name} is a {type(fn).__name__}, not a function (--entry {entry})")
    return fn  # type: ignore[no-any-return]


def _kwargs_for(fn: Callable[..., object], offered: dict[str, object]) -> dict[str, object]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(offered)
    return {k: v for k, v in offered.items() if k in params}


def _call(stage: str, model_file: Path, fn: Callable[..., object], offered: dict[str, object]) -> object:
    try:
        return fn(**_kwargs_for(fn, offered))
    except (Exception, SystemExit) as exc:
        raise UserCodeError(stage, model_file, exc) from None


@dataclass(frozen=True)
class Built:
    model: Callable[..., object]
    args: tuple[object, ...]
    kwargs: dict[str, object]


def build(model_file: Path, entry: Entry, offered: dict[str, object]) -> Built:
    """Import the file, call the entry, and check what it returned."""
    module = import_model_file(model_file)
    if entry.inputs_fn is None:
        result = _call(f"{entry.model_fn}()", model_file, _function(module, entry.model_fn, model_file, entry), offered)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise BadInput(
                f"{model_file}: {entry.model_fn}() returned {type(result).__name__}; return (model, example_inputs), "
                "or pass --entry MAKE_MODEL:MAKE_INPUTS"
            )
        model, inputs = result
    else:
        model = _call(f"{entry.model_fn}()", model_file, _function(module, entry.model_fn, model_file, entry), offered)
        inputs = _call(
            f"{entry.inputs_fn}()", model_file, _function(module, entry.inputs_fn, model_file, entry), offered
        )
    if not callable(model):
        raise BadInput(f"{model_file}: the model is a {type(model).__name__}, not callable (an nn.Module, a function)")
    if isinstance(inputs, dict):
        return Built(model, (), {str(k): v for k, v in inputs.items()})
    if isinstance(inputs, (tuple, list)):
        return Built(model, tuple(inputs), {})
    return Built(model, (inputs,), {})


def run_model(built: Built, model_file: Path) -> object:
    """One forward pass; UserCodeError when the model raises (the recorder's own bugs are re-raised as they are)."""
    try:
        return built.model(*built.args, **built.kwargs)
    except RecorderBug as bug:
        raise bug.error from None
    except (Exception, SystemExit) as exc:
        raise UserCodeError("the forward pass", model_file, exc) from None


class RecorderBug(Exception):
    """An error in kernelforge's own hook while the model ran: not the user's fault, so it keeps its traceback."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        super().__init__(str(error))
