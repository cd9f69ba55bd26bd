"""What a call costs: tokens times the model's price, in integer nano-dollars so that costs add up exactly."""

from __future__ import annotations

from kernelforge_tui.config import Price
from kernelforge_tui.llm.types import Usage

NANOUSD_PER_USD_PER_MTOK = 1000
"""A price of 1 USD per million tokens is 1000 nano-dollars per token."""


def cost_nanousd(usage: Usage | None, price: Price | None) -> int:
    """The call's cost; 0 when the server reported no usage or the model has no price (a local server)."""
    if usage is None or price is None:
        return 0
    per_in = round(price.input * NANOUSD_PER_USD_PER_MTOK)
    per_out = round(price.output * NANOUSD_PER_USD_PER_MTOK)
    return usage.input_tokens * per_in + usage.output_tokens * per_out
