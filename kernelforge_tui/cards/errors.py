"""Card errors that name the file, the field and the fix."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kernelforge_tui.errors import FieldError, not_utf8


class CardError(FieldError):
    """A card (or plan) file that cannot be used as it is (bad input: exit code 2)."""

    def __init__(self, path: Path, field: str | None, problem: str, fix: str) -> None:
        self.path = path
        super().__init__(path, field, problem, fix)


class FieldProblem(ValueError):
    """Raised by a model validator for a rule that spans fields: it names the field and the fix itself."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}")


def from_validation_error(path: Path, exc: ValidationError) -> CardError:
    """The first pydantic error as a CardError (its location is the field)."""
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first["loc"] if part not in ("function-after",))
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, FieldProblem):
        return CardError(path, ".".join(p for p in (loc, cause.field) if p), cause.problem, cause.fix)
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return CardError(path, loc, "unknown field", "remove it or check its spelling")
    if first["type"] == "missing":
        return CardError(path, loc, "required field is missing", "add it")
    if first["type"] == "finite_number":
        return CardError(path, loc, "not a finite number (inf, nan, or beyond the float range)", "give a finite number")
    return CardError(path, loc or None, message, "correct this value")


def read_toml(path: Path, missing_fix: str) -> dict[str, Any]:
    """A manifest's or plan's TOML as data (always UTF-8, whatever the locale); every way the file can fail to read
    is a CardError naming it."""
    try:
        return tomllib.loads(path.read_bytes().decode())
    except FileNotFoundError:
        raise CardError(path, None, "file not found", missing_fix) from None
    except IsADirectoryError:
        raise CardError(path, None, "a directory, not a file", "point at the TOML file itself") from None
    except OSError as exc:
        raise CardError(path, None, f"cannot be read ({exc.strerror})", "check its permissions") from None
    except UnicodeDecodeError as exc:
        raise CardError(path, None, not_utf8(exc), "save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise CardError(path, None, f"not valid TOML: {exc}", "fix the TOML syntax") from None
