"""Masking a provider's API key out of everything that comes back from it.

Why at the provider: a server may echo the key (in an error, in a reply). Masking the reply where it enters, before
any consumer sees it, keeps the key out of every copy made of it afterwards (the calls and nodes stored, the
events, the screen), and the same function masks error text and the prompts recorded. A stream is masked piece by
piece, holding back a tail that could begin a key, so a key split across two pieces is masked too.
"""

from __future__ import annotations

MASK = "***"
MIN_SECRET_CHARS = 8
"""Shorter values are placeholders that local servers accept ("EMPTY", "ollama"), not secrets; masking them
would rewrite ordinary words in the kernels written."""


class Masker:
    """Replaces every copy of its secrets with `MASK`: `masker(text)` for whole text, `feed`/`flush` for a stream."""

    def __init__(self, *secrets: str | None) -> None:
        kept = {s for s in secrets if s is not None and len(s) >= MIN_SECRET_CHARS}
        self.secrets = tuple(sorted(kept, key=len, reverse=True))
        self._held = ""

    def __repr__(self) -> str:
        return f"Masker({len(self.secrets)} secrets)"

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text

    def feed(self, piece: str) -> str:
        """The stream's next piece, masked, less a tail that could begin a secret: that tail comes with the next
        piece, or from `flush` at the end. Text cut short (an error body read up to a limit) is fed and not
        flushed, so that no beginning of a secret remains."""
        text = self(self._held + piece)
        keep = self._prefix_tail(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What `feed` held back, at the end of the stream (it is no whole secret)."""
        held, self._held = self._held, ""
        return held

    def _prefix_tail(self, text: str) -> int:
        """The length of the longest end of `text` that is the beginning of a secret."""
        return max(
            (n for s in self.secrets for n in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:n])),
            default=0,
        )
