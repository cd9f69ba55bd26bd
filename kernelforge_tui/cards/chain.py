"""A chain card's record of the aten calls its kernel stands for: the overloads in the order they ran and where each
argument comes from (a card input, an earlier call's result, or a scalar the call passed).

Why on the card: a chain's kernel replaces several calls at once, which only a pass over a whole graph can do (the
compile path matches the record against an FX graph's nodes: docs/guides/capture.md, "Fused chains"), and the card
must say what it stands for without the capture it came from. Argument paths are the dispatcher's (`args[1]`,
`kwargs.alpha`), which are also an FX node's `args` and `kwargs` when make_fx traces without decompositions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernelforge_tui.cards.errors import FieldProblem

ArgKind = Literal["input", "step", "scalar", "none", "float", "dtype", "device", "layout", "memory_format"]
"""input: a card input (`input`); step: result `out` of step `step`; scalar: a number, bool, string or flat list
(`value`); none: None; float: a non-finite float ("inf", "-inf", "nan" as `value`); dtype, device, layout,
memory_format: torch's name without `torch.` (`value`)."""
ChainValue = bool | int | float | str | list[bool | int | float | str]


class ChainArg(BaseModel):
    """One argument of a chain step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    """`args[0]`-style for a positional argument, `kwargs.NAME` for a keyword one."""
    kind: ArgKind
    input: str | None = None
    step: int | None = None
    out: int = 0
    value: ChainValue | None = None

    @model_validator(mode="after")
    def _complete(self) -> ChainArg:
        if self.kind == "input" and self.input is None:
            raise FieldProblem("input", "an input argument names no card input", "give the card input's name")
        if self.kind == "step" and self.step is None:
            raise FieldProblem("step", "a step argument names no earlier step", "give the step's index")
        if self.kind not in ("input", "step", "none") and self.value is None:
            raise FieldProblem("value", f"a {self.kind} argument without its value", "give the value the call passed")
        return self


class ChainStep(BaseModel):
    """One aten call of the chain."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: str
    """The overload as torch names it (`str` of an OpOverload, as capture records it): `aten.add.Tensor`."""
    args: list[ChainArg]
    results: int = Field(default=1, ge=1)
    """How many results the call returns: more than one is a tuple, whose items an FX graph reads through getitem."""


class Chain(BaseModel):
    """The calls of a fused chain, in order; the card's outputs are results of some of them, and every other result
    is read by the chain's own later calls only (nothing outside the chain sees it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str
    """What the chain is: residual_layer_norm, residual_rms_norm, bias_gelu, scale_mask_softmax, silu_mul, ..."""
    steps: list[ChainStep] = Field(min_length=2)
    outputs: dict[str, tuple[int, int]]
    """Card output -> (step, result index)."""
    rounded: bool = False
    """The card's reference rounds every call's result to the card's dtype, as eager PyTorch does (it had to, to
    agree with the captured outputs); False: it keeps intermediates exact (float64), and so should a kernel."""

    @model_validator(mode="after")
    def _wired(self) -> Chain:
        for k, step in enumerate(self.steps):
            for arg in step.args:
                if arg.kind == "step" and not (arg.step is not None and 0 <= arg.step < k):
                    raise FieldProblem(
                        f"steps[{k}].{arg.path}",
                        f"reads step {arg.step}, which is not an earlier step",
                        "fix the wiring",
                    )
                if arg.kind == "step" and arg.step is not None and arg.out >= self.steps[arg.step].results:
                    raise FieldProblem(
                        f"steps[{k}].{arg.path}",
                        f"reads result {arg.out} of step {arg.step}, which returns {self.steps[arg.step].results}",
                        "fix the wiring",
                    )
        for name, (index, out) in self.outputs.items():
            if not (0 <= index < len(self.steps) and 0 <= out < self.steps[index].results):
                raise FieldProblem(f"outputs.{name}", f"({index}, {out}) is no step's result", "fix the wiring")
        return self

    def input_names(self) -> list[str]:
        """The card inputs the calls read, in the order they are first read."""
        names = [a.input for s in self.steps for a in s.args if a.kind == "input" and a.input is not None]
        return list(dict.fromkeys(names))

    def value(self, op: str, path: str) -> ChainValue | None:
        """The scalar the first call of overload `op` passed at `path` (`args[4]`, `kwargs.eps`), or None."""
        for step in self.steps:
            if step.op == op:
                return next((a.value for a in step.args if a.path == path), None)
        return None

    def describe(self) -> str:
        """`aten.add.Tensor -> aten.native_layer_norm.default`."""
        return " -> ".join(s.op for s in self.steps)
