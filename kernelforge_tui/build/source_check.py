"""Static checks on untrusted candidate CUDA source, before nvcc sees it: the one entry point, `check_source`.

Why: a candidate is device code only. The harness launches it from a LaunchPlan and looks its entry
point up by name in the cubin, so the source must not launch kernels, create host-side work, read
arbitrary files, or hide its entry point behind C++ name mangling. Each finding has a line and column a
coder (person or LLM) can act on.

The parts, each with one job:
- `token_guard`: the text (size, encoding) and the preprocessor guard over the tokens nvcc's preprocessor
  would read (`cuda_tokens`): allowed directives and headers, no token pasting, no forbidden names;
- `source_policy`: the lists that guard applies (headers, directives, forbidden names and API families);
- `tree_check`: tree-sitter (on the spliced text) finds the entry point, host-only functions, placement new
  and syntax errors; `param_check` compares the entry's parameters with the plan;
- `source_problem`: the finding, and where it is in the original text.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernelforge_tui.build.cuda_syntax import parse_cuda
from kernelforge_tui.build.cuda_tokens import HASH, LexError, logical_source, tokenize
from kernelforge_tui.build.source_policy import DEFAULT_ALLOWED_INCLUDES, MAX_SOURCE_BYTES
from kernelforge_tui.build.source_problem import SourceProblem, Where
from kernelforge_tui.build.token_guard import check_text, check_tokens
from kernelforge_tui.build.tree_check import check_entry, scan_tree
from kernelforge_tui.cards.plan import ResolvedArg


def check_source(
    source: str,
    entry: str,
    allowed_includes: frozenset[str] = DEFAULT_ALLOWED_INCLUDES,
    args: Sequence[ResolvedArg] | None = None,
    max_bytes: int = MAX_SOURCE_BYTES,
) -> list[SourceProblem]:
    """All problems in `source`, in source order; only severity "error" ones should block a build.

    With `args` (the resolved launch plan's arguments), the entry's parameters must match them in count,
    pointer versus scalar, and scalar type. Unreadable text (too big, not UTF-8, NUL) is one problem alone.
    """
    if (text_problem := check_text(source, max_bytes)) is not None:
        return [text_problem]
    logical = logical_source(source)
    where = Where(logical)
    try:
        tokens = tokenize(logical)
    except LexError as exc:
        return [where.problem(exc.offset, "source-text", exc.message)]
    scan = scan_tree(parse_cuda(where.data).root_node, where)
    problems = [
        *scan.problems,
        *check_tokens(tokens, where, allowed_includes, scan.placement_news),
        *check_entry(scan.definitions, entry, args, where),
    ]
    return sorted(problems, key=lambda p: (p.line, p.column))


def included_headers(source: str) -> list[str]:
    """The `<name>` of every `#include <name>` line, as nvcc's preprocessor reads them (splices and comments applied);
    empty for text the tokenizer refuses (the check reports that). The build adds CUTLASS's flags by it."""
    try:
        tokens = tokenize(logical_source(source))
    except LexError:
        return []
    return [
        tokens[k + 2].text[1:-1]
        for k in range(len(tokens) - 2)
        if tokens[k].first
        and tokens[k].text in HASH
        and tokens[k + 1].text == "include"
        and tokens[k + 2].kind == "header"
        and tokens[k + 2].text.startswith("<")
    ]
