"""Card errors that name the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError


class CardError(Exception):
    """A card (or plan) file that cannot be used as it is."""

    def __init__(self, path: Path, field: str | None, problem: str, fix: str) -> None:
        self.path = path
        self.field = field
        self.problem = problem
        self.fix = fix
        where = f"{path}" + (f": {field}" if field else "")
        super().__init__(f"{where}: {problem}. Fix: {fix}.")


def from_validation_error(path: Path, exc: ValidationError) -> CardError:
    """The first pydantic error as a CardError (its location is the field)."""
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first["loc"] if part not in ("function-after",))
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return CardError(path, loc, "unknown field", "remove it or check its spelling")
    if first["type"] == "missing":
        return CardError(path, loc, "required field is missing", "add it")
    return CardError(path, loc or None, message, "correct this value")
