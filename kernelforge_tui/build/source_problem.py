"""What the source check reports: a finding with its rule and its place in the candidate source.

Why apart: the token guard (`token_guard`) and the syntax-tree checks (`tree_check`, `param_check`) all report
findings the same way, at a line and column of the original text, which the source has lost by the time they
look at it (splices and comments are gone, tree-sitter counts bytes). `Where` maps both kinds of offset back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from tree_sitter import Node

from kernelforge_tui.build.cuda_tokens import Logical

Rule = Literal[
    "source-text",
    "directive-not-allowed",
    "include-not-allowed",
    "token-paste",
    "entry-missing",
    "entry-not-global",
    "entry-not-extern-c",
    "plan-mismatch",
    "host-launch",
    "forbidden-call",
    "host-function",
    "syntax-error",
]
Severity = Literal["error", "warning"]


class SourceProblem(BaseModel):
    """One finding, placed at a 1-based line and column of the candidate source."""

    line: int
    column: int
    rule: Rule
    severity: Severity = "error"
    message: str


class Where:
    """Places logical-text offsets (tokens) and tree-sitter byte offsets in the original source."""

    def __init__(self, logical: Logical) -> None:
        self.logical = logical
        self.data = logical.text.encode("utf-8")
        self.ascii = len(self.data) == len(logical.text)

    def char(self, byte: int) -> int:
        return byte if self.ascii else len(self.data[:byte].decode("utf-8", "replace"))

    def problem(self, offset: int, rule: Rule, message: str, severity: Severity = "error") -> SourceProblem:
        line, column = self.logical.position(offset)
        return SourceProblem(line=line, column=column, rule=rule, severity=severity, message=message)

    def node_problem(self, node: Node, rule: Rule, message: str, severity: Severity = "error") -> SourceProblem:
        return self.problem(self.char(node.start_byte), rule, message, severity)
