"""The one error a provider call raises on purpose, with a kind that says whether trying again can help.

Why kinds and not text: the retry loop, the search and `doctor` decide on the kind; the message is for people and
names the provider and the fix. No message ever carries an API key: a provider's error text is cut short and any
copy of the key in it is masked before it goes into a message.
"""

from __future__ import annotations

from typing import Literal

from kernelforge_tui.errors import BadInput, KernelForgeError

LlmErrorKind = Literal[
    "no_key",
    "auth",
    "not_found",
    "redirect",
    "bad_request",
    "too_large",
    "rate_limited",
    "server",
    "dropped",
    "idle",
    "timeout",
    "protocol",
    "refused",
    "budget",
]
RETRYABLE: frozenset[LlmErrorKind] = frozenset({"rate_limited", "server", "dropped", "idle"})
FATAL: frozenset[LlmErrorKind] = frozenset({"auth", "no_key"})
"""Kinds every later call to the provider would repeat (a refused or missing key): they end the whole run."""


class LlmError(KernelForgeError):
    """A provider call that failed: `provider: problem. Fix: fix.`"""

    def __init__(
        self,
        provider: str,
        kind: LlmErrorKind,
        problem: str,
        fix: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        attempts: int = 1,
    ) -> None:
        self.provider = provider
        self.kind: LlmErrorKind = kind
        self.problem = problem
        self.fix = fix
        self.status = status
        self.retry_after_s = retry_after_s
        self.attempts = attempts
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{provider}: {problem}{tries}. Fix: {fix}.")

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def after(self, attempts: int) -> LlmError:
        """The same error, saying how many attempts were made."""
        return LlmError(
            self.provider,
            self.kind,
            self.problem,
            self.fix,
            status=self.status,
            retry_after_s=self.retry_after_s,
            attempts=attempts,
        )


class FatalLlmError(BadInput):
    """A provider error that no later call can escape (`FATAL`: the key is refused or not set): it stops the whole
    run at once with the fix (exit code 2), rather than failing expansion after expansion, each paid for. Not an
    LlmError, so that no role's fallback (an analysis without the analyst, a kernel without a judge) swallows it."""

    def __init__(self, error: LlmError) -> None:
        self.error = error
        super().__init__(str(error))
