"""What a call costs: tokens times the model's price, in integer nano-dollars so that costs add up exactly; and what
an attempt is counted as when the provider did not say what it used.

Why estimate at all: a server bills an attempt it accepted even when the stream breaks, stalls or is cancelled before
its usage arrives (OpenAI reports usage only at the end), and a money cap that counts such attempts as 0 never holds.
The estimate is an upper bound, so the cap errs toward stopping early: CHARS_PER_TOKEN characters of prompt per
input token (tokenizers give 3.5 to 4 for code and English), and for a reply cut short the whole output cap, since
the tokens a model generated but did not stream (hidden reasoning, text after the break) are unknown. A reply that
ended but reported no usage is all there is: its text is counted the same way as the prompt.
"""

from __future__ import annotations

import math

from kernelforge_tui.config import Price
from kernelforge_tui.llm.types import ChatRequest, Usage

NANOUSD_PER_USD_PER_MTOK = 1000
"""A price of 1 USD per million tokens is 1000 nano-dollars per token."""
CHARS_PER_TOKEN = 3
"""Characters counted as one token in an estimate: fewer than tokenizers give, so an estimate errs high."""


def cost_nanousd(usage: Usage | None, price: Price | None) -> int:
    """The call's cost; 0 when it used nothing or the model has no price (a local server). Cached input tokens are
    billed at the cache prices (`LlmSettings.price` fills them in; a price without them bills them as input)."""
    if usage is None or price is None:
        return 0

    def per_token(usd_per_mtok: float | None) -> int:
        return round((price.input if usd_per_mtok is None else usd_per_mtok) * NANOUSD_PER_USD_PER_MTOK)

    uncached = max(0, usage.input_tokens - usage.cache_write_tokens - usage.cache_read_tokens)
    return (
        uncached * per_token(price.input)
        + usage.cache_write_tokens * per_token(price.cache_write)
        + usage.cache_read_tokens * per_token(price.cache_read)
        + usage.output_tokens * per_token(price.output)
    )


def output_cap(request: ChatRequest) -> int:
    """The most output tokens the request allows: `max_completion_tokens` where the model is configured with it
    (OpenAI's reasoning models, whose hidden reasoning counts against it), else `max_tokens`."""
    cap = request.extra.get("max_completion_tokens")
    return cap if isinstance(cap, int) and cap > 0 else request.max_tokens


def estimated_usage(request: ChatRequest, reported: Usage | None, reply_chars: int | None) -> Usage:
    """An attempt's usage where the provider did not report all of it: what it did report (Anthropic's input
    tokens at the start of the stream), the prompt's estimate for input it did not, and for output the reply's
    estimate (`reply_chars`: the reply ended) or the request's output cap (None: it was cut short)."""
    prompt_chars = sum(len(m.content) for m in request.messages)
    output = output_cap(request) if reply_chars is None else math.ceil(reply_chars / CHARS_PER_TOKEN)
    if reported is None:
        return Usage(input_tokens=math.ceil(prompt_chars / CHARS_PER_TOKEN), output_tokens=output, estimated=True)
    return reported.model_copy(update={"output_tokens": max(reported.output_tokens, output), "estimated": True})
