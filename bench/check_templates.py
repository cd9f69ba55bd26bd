"""GPU check (not a test): every template seed, and a few mutations of each, through the real evaluator.

Correctness of the template library can only be proven on a GPU; this runs the seeds of each example
card (and `--mutations` children of each seed) through the same checks as the search and prints a
table: pass/fail, failure kind, time and speedup over the card's baseline.

    python bench/check_templates.py [--cards vector_add_f32 softmax_bf16_small ...] [--mutations 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import load_card
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.backend import make_builder
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.proposers.base import ParentInfo, Proposal, ProposalContext
from kernelforge_tui.proposers.templates import TemplateProposer

ROOT = Path(__file__).resolve().parent.parent
CARDS = ROOT / "examples" / "cards"


async def check_card(name: str, mutations: int, builder: Builder) -> list[dict[str, object]]:
    settings = load_settings()
    card = load_card(CARDS / name)
    evaluator = Evaluator(card, builder, settings, require_gpu()[0])
    await evaluator.start()
    proposer = TemplateProposer(seed=0)
    proposals: list[Proposal] = list(proposer.seeds(card))
    for seed in list(proposals):
        parent = ParentInfo(id=0, source=seed.source, plan=seed.plan, params=seed.params)
        ctx = ProposalContext(card=card.spec, card_dir=card.root, parent=parent)
        proposals += await proposer.propose(ctx, mutations)
    rows = []
    for proposal in proposals:
        evaluation = await evaluator.evaluate(proposal.source, proposal.plan)
        result = evaluation.result
        rows.append({
            "card": name,
            "params": proposal.params,
            "ok": evaluation.ok,
            "failure": evaluation.failure,
            "reason": evaluation.reason[:160],
            "median_us": result.candidate.median_us if result and result.candidate else None,
            "speedup": evaluation.speedup,
            "ceiling_share": evaluation.ceiling_share,
        })  # fmt: skip
    await evaluator.close()
    return rows


async def main_async(cards: list[str], mutations: int) -> list[dict[str, object]]:
    builder = make_builder(load_settings(), require_gpu()[0].arch)
    rows: list[dict[str, object]] = []
    for name in cards:
        rows += await check_card(name, mutations, builder)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cards", nargs="*", default=sorted(p.name for p in CARDS.iterdir() if p.is_dir()))
    parser.add_argument("--mutations", type=int, default=2)
    args = parser.parse_args()
    rows = asyncio.run(main_async(args.cards, args.mutations))
    if out := os.environ.get("OUT"):
        Path(out, "check_templates.json").write_text(json.dumps(rows, indent=2))
    passed = sum(1 for r in rows if r["ok"])
    for r in rows:
        status = "pass" if r["ok"] else f"FAIL {r['failure']}: {r['reason']}"
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        print(f"{r['card']:<28} {speed:>9}  {status}  {json.dumps(r['params'])}")
    print(f"{passed}/{len(rows)} template kernels correct")


if __name__ == "__main__":
    main()
