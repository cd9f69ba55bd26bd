"""Host check (not a test, no GPU): how long a card's sets take to make before the GPU worker can upload them.

The worker makes every set of a loaded card on the host (the card's own, the fresh draws, the stress sets, each
with its reference outputs) before the search can evaluate anything. This times the worker's makers one after
another and side by side (`make_side_by_side`), and prints both, with the peak host memory of the process.

    python bench/card_sets.py CARD_DIR [--fresh 2] [--at-once N] [--out results.json]

A 1 GB card to try it on: `kernelforge capture bench/vs_torch_models.py --entry silu_mul --kwarg
'shape=[16384,11008]' --device cpu -o /tmp/silu_mul` (its card is the directory inside).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelforge_tui.cards import load_card  # noqa: E402
from kernelforge_tui.cards.directory import available_memory, make_side_by_side, side_by_side  # noqa: E402
from kernelforge_tui.gpu.worker import host_makers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("card", type=Path)
    parser.add_argument("--fresh", type=int, default=2, help="fresh sets, as the worker's default settings draw")
    parser.add_argument("--at-once", type=int, help="sets made at once (default: as many as the worker would make)")
    parser.add_argument("--out", type=Path, help="also write the numbers here as JSON")
    args = parser.parse_args()
    card = load_card(args.card)
    makers = [make for _, make in host_makers(card, args.fresh, fresh_seed=1000)]
    started = time.perf_counter()
    for make in makers:
        make()
    one_after_another = time.perf_counter() - started
    started = time.perf_counter()
    make_side_by_side(makers, card.spec.set_bytes(), args.at_once)
    at_once = time.perf_counter() - started
    result = {
        "card": card.spec.name,
        "set_mb": card.spec.set_bytes() / 1e6,
        "sets": len(makers),
        "cpus": os.cpu_count(),
        "at_once": args.at_once or side_by_side(len(makers), card.spec.set_bytes(), available_memory()),
        "one_after_another_s": round(one_after_another, 1),
        "side_by_side_s": round(at_once, 1),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 1),
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
