"""Operator cards: what an operator is, its reference data, and how a kernel for it is launched."""

from kernelforge_tui.cards.directory import Card, draw_inputs, load_card, save_card
from kernelforge_tui.cards.errors import CardError
from kernelforge_tui.cards.expr import ExprError
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard, OutputSpec, TensorSpec, Tolerance
from kernelforge_tui.cards.plan import ResolvedLaunch, load_plan, plan_for_kernel, resolve

__all__ = [
    "Card",
    "CardError",
    "ExprError",
    "LaunchPlan",
    "OperatorCard",
    "OutputSpec",
    "ResolvedLaunch",
    "TensorSpec",
    "Tolerance",
    "draw_inputs",
    "load_card",
    "load_plan",
    "plan_for_kernel",
    "resolve",
    "save_card",
]
