"""Reading a kernel out of a model's reply, strictly: exactly one fenced CUDA block and exactly one fenced JSON launch
plan that validates as a LaunchPlan and resolves against the card.

Why strict: a reply that is half prose, two alternative kernels or a plan naming a tensor the card lacks would
otherwise reach nvcc or the GPU as a guess. The error says what was wrong in words a follow-up message can carry
back to the model (one repair request), and nothing here runs what the model wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import ValidationError

from kernelforge_tui.cards.expr import ExprError
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.llm.client import Malformed

FENCE = re.compile(r"^```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^```", re.S | re.M)
CUDA_TAGS = frozenset({"cuda", "cu", "c++", "cpp", "c", "cuh"})
JSON_TAGS = frozenset({"json"})
REPLY_FORMAT = (
    "Answer with exactly one ```cuda fenced block holding the whole kernel source (device code only: __global__ "
    "and __device__ functions, no host code, no main) and exactly one ```json fenced block holding the launch plan: "
    '{"entry": "<kernel name>", "grid": [...], "block": [...], "shared_bytes": <int or formula>, "args": [...]}. '
    "Grid, block and shared_bytes are integers or formulas over the card's sizes (cdiv(a, b) rounds up); args "
    "bind the kernel's parameters in order: a tensor's name passes its device pointer, a size name or formula "
    "passes an int (suffix :i64 for 64-bit). A kernel that copies with TMA names a map in args and declares it in "
    '"tensor_maps": {"<arg>": {"tensor": "<tensor name>", "box": [<elements per dim, innermost first>], '
    '"swizzle": 0|32|64|128}}; the harness encodes the map over that tensor and passes it by value (the parameter '
    "is const __grid_constant__ CUtensorMap)."
)
"""What every role that writes a kernel is told about the reply's form (the prompts include it)."""


@dataclass(frozen=True)
class KernelReply:
    source: str
    plan: LaunchPlan
    prose: str
    """The reply's text outside the fenced blocks: the model's own summary of what it did."""


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of each fenced block, in order."""
    return [(tag.lower(), body) for tag, body in FENCE.findall(text)]


def parse_kernel(text: str, card: OperatorCard) -> KernelReply:
    """The kernel and its plan; Malformed saying what to fix."""
    blocks = fenced_blocks(text)
    cuda = [body for tag, body in blocks if tag in CUDA_TAGS]
    plans = [body for tag, body in blocks if tag in JSON_TAGS]
    if len(cuda) != 1:
        raise Malformed(f"the reply has {len(cuda)} ```cuda blocks; give exactly one, holding the whole kernel")
    if len(plans) != 1:
        raise Malformed(f"the reply has {len(plans)} ```json blocks; give exactly one, holding the launch plan")
    try:
        plan = LaunchPlan.model_validate_json(plans[0])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the plan"
        raise Malformed(f"the launch plan is not valid: {where}: {first['msg']}") from None
    try:
        resolve(plan, card)
    except (ExprError, KeyError) as exc:
        raise Malformed(f"the launch plan does not fit the card: {exc}") from None
    source = cuda[0]
    if not re.search(rf"__global__[^;{{]*\b{re.escape(plan.entry)}\s*\(", source):
        raise Malformed(f"the plan's entry {plan.entry!r} is not a __global__ function of the kernel source")
    prose = FENCE.sub("", text).strip()
    return KernelReply(source=source, plan=plan, prose=prose)
