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
    return CardError(path, loc or None, message, "correct this value")
