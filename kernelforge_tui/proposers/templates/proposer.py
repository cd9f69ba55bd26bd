"""The offline proposer: seeds from each family's template, then mutations of one or two parameters.

Why this order of preference: a hint from the person steering names what to try, so it goes first;
then single-parameter steps to neighbouring values (small moves that a tree search can chain), spread
over different parameters; then jumps and two-parameter moves. Exact repeats of tried or failed
children are never offered, and changes that already failed from this parent are offered last.
Randomness only breaks ties and comes from a generator seeded by (seed, card, parent params).

A profiled parent's bottleneck class picks the moves tried first after the hints: those along the template's
levers for that class (a memory-bandwidth-bound parent gets wider accesses and fewer passes, a latency-bound one
more parallelism and loads in flight, a compute-bound one fast math where the card's tolerance allows), the
nearest step of every lever before the next step of any; the mutation says why. Without a profile the order is the
plain one above.

It says what it understood: `read_hint` names the parameters and values a hint set (or that it understood
nothing, listing the card's parameters), `cannot_serve` says why a card has no template (its family is not
in the library, or the card does not follow the template's naming), and `coverage` how much of the card's space a
run has tried, so the search can tell the person.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections.abc import Sequence
from functools import partial
from typing import Any

from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.proposers.base import Proposal, ProposalContext, SpaceCoverage
from kernelforge_tui.proposers.templates.attention import AttentionTemplate
from kernelforge_tui.proposers.templates.attention_mma import AttentionMmaTemplate
from kernelforge_tui.proposers.templates.chains import CHAIN_TEMPLATES
from kernelforge_tui.proposers.templates.common import (
    Lever,
    P,
    Params,
    Space,
    Template,
    TemplateParams,
    changes,
    describe,
)
from kernelforge_tui.proposers.templates.conv_igemm import ConvIgemmTemplate
from kernelforge_tui.proposers.templates.conv_sm90 import ConvSm90Template
from kernelforge_tui.proposers.templates.convolution import ConvolutionTemplate
from kernelforge_tui.proposers.templates.copy import CopyTemplate
from kernelforge_tui.proposers.templates.elementwise import ElementwiseTemplate
from kernelforge_tui.proposers.templates.gemm_sm90 import GemmSm90Template
from kernelforge_tui.proposers.templates.gemv import GemvTemplate
from kernelforge_tui.proposers.templates.group_norm import GroupNormTemplate
from kernelforge_tui.proposers.templates.matmul import MatmulTemplate
from kernelforge_tui.proposers.templates.matrix_power import MatrixPowerTemplate
from kernelforge_tui.proposers.templates.pooling import PoolingTemplate
from kernelforge_tui.proposers.templates.reduction import ReductionTemplate, RowReductionTemplate
from kernelforge_tui.proposers.templates.row_reductions import RowTemplate
from kernelforge_tui.proposers.templates.scan import ScanTemplate
from kernelforge_tui.proposers.templates.sparse import SparseTemplate
from kernelforge_tui.proposers.templates.stencil import StencilTemplate
from kernelforge_tui.vocabulary.nodes import ParamValue
from kernelforge_tui.vocabulary.profiles import CLASS_NAMES, Bottleneck

TEMPLATES: tuple[Template[Any], ...] = (
    *CHAIN_TEMPLATES,  # before the single ops' templates: a chain card is never served as one of its calls
    ElementwiseTemplate(),
    RowTemplate(),
    GroupNormTemplate(),
    PoolingTemplate(),
    StencilTemplate(),
    ConvolutionTemplate(),
    ConvSm90Template(),  # before CUTLASS 2.x's: Hopper's wgmma, where the card's geometry allows it
    ConvIgemmTemplate(),
    AttentionMmaTemplate(),  # before the CUDA-core one: bf16 and fp16 suite attention goes to tensor cores
    AttentionTemplate(),
    ScanTemplate(),
    ReductionTemplate(),
    RowReductionTemplate(),
    SparseTemplate(),
    MatmulTemplate(),
    MatrixPowerTemplate(),
    GemmSm90Template(),
    GemvTemplate(),
    CopyTemplate(),
)
_HINT = re.compile(r"([A-Za-z_]+)\s*(?:=|:|->|to)\s*([A-Za-z0-9_.]+)")
COUNT_CAP = 16384
"""Combinations of a space checked at most when a run ends (about a second); a larger space (matmul's, CSR SpMV's,
the 2D stencil's) is counted over its first combinations only, so its count is a lower bound and says "at least"."""


def template_for(card: OperatorCard) -> Template[Any] | None:
    """The template serving the card's family, if it can serve this card."""
    for template in TEMPLATES:
        if card.family in template.families and template.unsupported(card) is None:
            return template
    return None


def _values(values: tuple[ParamValue, ...]) -> str:
    """A parameter's values for a log line: all of a few, the ends of many."""
    shown = [str(v) for v in values]
    return ", ".join(shown if len(shown) <= 6 else [*shown[:3], "...", shown[-1]])


def _key(params: dict[str, ParamValue]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in params.items()))


def _distance(values: tuple[ParamValue, ...], old: ParamValue, new: ParamValue) -> int:
    """Steps between two values of one parameter (values are ordered so that neighbours are small moves)."""
    return abs(values.index(new) - values.index(old))


def _pulled(levers: tuple[Lever, ...], space: Space, parent: Params, candidate: Params) -> list[tuple[int, Lever]]:
    """The levers the move from parent to candidate pulls, each with how many steps it moves its parameter; none
    when it moves one of them the wrong way (a wider access paid for with one pass more is no bandwidth move)."""
    moved = [lever for lever in levers if candidate[lever.param] != parent[lever.param]]
    steps = [(_distance(space[lever.param], parent[lever.param], candidate[lever.param]), lever) for lever in moved]
    pulled = all(lever.pulled(space[lever.param], parent[lever.param], candidate[lever.param]) for lever in moved)
    return steps if pulled else []


def _hint_targets(hints: list[str], space: dict[str, tuple[ParamValue, ...]]) -> tuple[dict[str, str], set[str]]:
    """(param -> wanted value) from `name=value`, `name value` (a value the param takes) and bare value words, and
    params merely named."""
    wanted: dict[str, str] = {}
    named: set[str] = set()
    for hint in hints:
        for name, value in _HINT.findall(hint):
            if name in space:
                wanted.setdefault(name, value)
        words = re.findall(r"[A-Za-z0-9_.]+", hint)
        for name, value in itertools.pairwise(words):
            if name in space and value in {str(v) for v in space[name]}:
                wanted.setdefault(name, value)
        for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", hint):
            if word in space:
                named.add(word)
            for param, values in space.items():
                if word in {str(v) for v in values if isinstance(v, str)}:
                    wanted.setdefault(param, word)
    return wanted, named


class TemplateProposer:
    """Proposer over the built-in templates; deterministic for a given `seed`."""

    name = "templates"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def cannot_serve(self, card: OperatorCard) -> str | None:
        """Why no template serves the card (with what to do instead), or None when one does."""
        if template_for(card) is not None:
            return None
        serving = [t for t in TEMPLATES if card.family in t.families]
        if not serving:
            known = ", ".join(sorted({f for t in TEMPLATES for f in t.families}))
            return (
                f"has no template for family {card.family} (the templates cover {known}): use --proposer agents "
                "(the LLM team), or write a template in kernelforge_tui/proposers/templates/"
            )
        why = "; ".join(filter(None, (t.unsupported(card) for t in serving)))
        return (
            f"cannot serve card {card.name} with the {card.family} template ({why}): use --proposer agents (the LLM "
            "team), or make the card what the template's reason asks where that is a naming or layout convention"
        )

    def read_hint(self, card: OperatorCard, text: str) -> str:
        """The parameters and values the hint sets for the card's template, or that it understood nothing."""
        template = template_for(card)
        if template is None:
            return f"nothing to act on: the template library {self.cannot_serve(card)}"
        space = template.space(card)
        wanted, named = _hint_targets([text], space)
        usable = {k: v for k, v in wanted.items() if v in {str(x) for x in space[k]}}
        said: list[str] = []
        if usable:
            values = ", ".join(f"{k}={v}" for k, v in usable.items())
            said.append(f"read {values}: tried first among the next children of this node and its subtree")
        moved = [k for k in space if k in named and k not in usable]
        if moved:
            said.append(f"named {', '.join(moved)}: changes to it are tried first")
        unusable = {k: v for k, v in wanted.items() if k not in usable}
        said += [f"{k}={v} is not a value {k} takes ({_values(space[k])})" for k, v in unusable.items()]
        if said:
            return "; ".join(said)
        params = "; ".join(f"{k} ({_values(values)})" for k, values in space.items())
        return (
            f"understood nothing in it: the templates act on PARAM=VALUE or a value's name; this card's parameters "
            f"are {params}"
        )

    def seeds(self, card: Card | OperatorCard) -> list[Proposal]:
        spec = card.spec if isinstance(card, Card) else card
        template = template_for(spec)
        if template is None:
            return []
        proposals: list[Proposal] = []
        seen: set[tuple[tuple[str, str], ...]] = set()
        for raw in template.seed_params(spec):
            params = self._nearest_valid(template, spec, raw)
            if params is None or _key(params.as_dict()) in seen:
                continue
            seen.add(_key(params.as_dict()))
            proposals.append(self._proposal(template, spec, params, f"seed: {describe(params.as_dict())}"))
        return proposals

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        card = ctx.card
        template = template_for(card)
        if template is None or n <= 0:
            return []
        tried = {_key(p) for p in ctx.tried_children_params} | {_key(f.params) for f in ctx.failed_siblings}
        typed_parent = template.valid(card, ctx.parent.params)
        if typed_parent is None:  # hand-written or LLM-written parent: start the template over
            fresh = [p for p in self.seeds(card) if _key(p.params) not in tried and not ctx.tried_candidate(p)]
            return fresh[:n]
        parent = typed_parent.as_dict()
        tried.add(_key(parent))
        rng = random.Random(self._rng_seed(card, parent))
        space = template.space(card)
        wanted, named = _hint_targets(ctx.hints, space)
        failed_moves = {
            (k, str(v)) for f in ctx.failed_siblings for k, v in f.params.items() if str(parent.get(k)) != str(v)
        }

        singles: dict[str, list[Params]] = {}
        for name, values in space.items():
            order = sorted((v for v in values if v != parent[name]), key=lambda v: _distance(values, parent[name], v))
            singles[name] = [{**parent, name: v} for v in order]
        nearest = {name: moves[0][name] for name, moves in singles.items() if moves}
        pairs = [{**parent, a: nearest[a], b: nearest[b]} for a, b in itertools.combinations(nearest, 2)]
        rng.shuffle(pairs)

        # Round-robin over parameters in a seeded order, nearest values first, then pairs.
        names = list(space)
        rng.shuffle(names)
        ladder = [c for column in itertools.zip_longest(*(singles[k] for k in names)) for c in column if c is not None]

        profile = ctx.parent.profile
        bottleneck: Bottleneck | None = profile.hardware.bottleneck if profile is not None else None
        levers = template.levers_of(card, bottleneck) if bottleneck is not None else ()

        def rank(item: tuple[Params, TemplateParams | None]) -> tuple[int, int, int, int, bool, int]:
            candidate, typed = item
            params = None if typed is None else typed.as_dict()
            moved = {k: str(v) for k, v in candidate.items() if v != parent[k]}
            hinted = sum(wanted.get(k) == v for k, v in moved.items()) * 2 + len(set(moved) & named)
            failed = sum((k, v) in failed_moves for k, v in moved.items())
            # Along the levers of the parent's class first, as the move will be made (canonical): every lever's
            # nearest step (in the levers' order), then the next steps, a pair after the single moves of its step;
            # then a lever with another parameter.
            if params is None or not (pulls := _pulled(levers, space, parent, params)):
                return (-hinted, failed, 2, 0, False, 0)
            steps, lever = min((steps, levers.index(lever)) for steps, lever in pulls)
            changed = sum(v != parent[k] for k, v in params.items())
            return (-hinted, failed, int(len(pulls) < changed), steps, changed > 1, lever)

        candidates = [(candidate, template.valid(card, candidate)) for candidate in ladder + pairs]
        ordered = sorted(candidates, key=rank)  # stable: keeps the ladder order within a rank
        proposals: list[Proposal] = []
        for _, typed in ordered:
            if typed is None or _key(params := typed.as_dict()) in tried:
                continue
            tried.add(_key(params))
            mutation = changes(parent, params)
            if bottleneck is not None and (pulls := _pulled(levers, space, parent, params)):
                why = "; ".join(dict.fromkeys(lever.why for _, lever in pulls))
                mutation += f" ({CLASS_NAMES[bottleneck]} parent: {why})"
            proposal = self._proposal(template, card, typed, mutation)
            if ctx.tried_candidate(proposal):
                continue
            proposals.append(proposal)
            if len(proposals) == n:
                break
        return proposals

    def coverage(self, card: OperatorCard, tried: Sequence[dict[str, ParamValue]]) -> SpaceCoverage | None:
        """How many of the card's valid template configurations the tried params cover (None without a template)."""
        template = template_for(card)
        if template is None:
            return None
        valid, counted_all = template.count_valid(card, COUNT_CAP)
        covered = {_key(p.as_dict()) for p in (template.valid(card, t) for t in tried) if p is not None}
        return SpaceCoverage(
            space=f"the {self.name}' space for this card",
            tried=len(covered),
            valid=max(valid, len(covered)),
            counted_all=counted_all,
        )

    def _rng_seed(self, card: OperatorCard, params: Params) -> int:
        text = repr((self.seed, card.name, _key(params)))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")

    def _nearest_valid(self, template: Template[P], card: OperatorCard, params: Params) -> P | None:
        """The params if valid, else the first valid one or two-parameter change (smaller values first)."""
        valid = template.valid(card, params)
        if valid is not None:
            return valid
        space = template.space(card)
        for count in (1, 2):
            for names in itertools.combinations(space, count):
                options = [sorted(space[k], key=partial(_distance, space[k], params[k])) for k in names]
                for values in itertools.product(*options):
                    valid = template.valid(card, {**params, **dict(zip(names, values, strict=True))})
                    if valid is not None:
                        return valid
        return None

    def _proposal(self, template: Template[P], card: OperatorCard, params: P, mutation: str) -> Proposal:
        source, plan = template.render(card, params)
        identity = template.identity(params)
        return Proposal(
            source=source, plan=plan, mutation=mutation, proposer=self.name, params=params.as_dict(), identity=identity
        )
