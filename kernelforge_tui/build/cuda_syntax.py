"""The one tree-sitter CUDA grammar, shared by the source check and the TUI's highlighting.

Why one place: building the Language loads the grammar's shared library; both users must parse the same
way. Parsers are made per call because a tree-sitter Parser is not safe to share between threads (the
build stage checks sources in worker threads).
"""

from __future__ import annotations

from functools import cache

import tree_sitter_cuda
from tree_sitter import Language, Node, Parser, Tree


@cache
def cuda_language() -> Language:
    """The tree-sitter-cuda Language, built once."""
    return Language(tree_sitter_cuda.language())


def parse_cuda(source: bytes) -> Tree:
    """Parse UTF-8 CUDA source with a fresh parser."""
    return Parser(cuda_language()).parse(source)


def node_text(node: Node) -> str:
    """A node's source text (undecodable bytes replaced)."""
    return node.text.decode("utf-8", "replace") if node.text is not None else ""
