"""Phase A: the adopt seed through the real evaluator, with and without the baseline interleaved."""
import asyncio, os, sys, tempfile
from pathlib import Path
sys.path.insert(0, os.getcwd())
from kernelforge_tui.config import Settings
from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task

parent = Path(os.environ.get("CARDS", "/tmp/cards"))
card = cards.write(task("spmv_csr"), "float32", 2**26, parent, beyond=True)
print("card", card.root, flush=True)
seeds = TemplateProposer().seeds(card)
pick = [s for s in seeds if s.params.get("strategy") in ("adopt", "stream")][:1] + [s for s in seeds if s.params.get("strategy") == "stream"][:1]
for s in pick: print("seed", s.params)
settings = Settings.model_validate({"eval": {"fresh_seeds": 1, "timeout_s": 60.0}})

async def main():
    ev = Evaluator(card, Builder(arch="sm_90"), settings, require_gpu()[0])
    await ev.start()
    try:
        for label in ("with baseline", "no baseline", "with baseline"):
            base = ev.baseline
            if label == "no baseline": ev.baseline = None
            for s in pick:
                for _ in range(2):
                    e = await ev.evaluate(s.source, s.plan)
                    r = e.result
                    c = r.candidate if r else None
                    b = r.baseline if r else None
                    print(f"{label:14s} {s.params['strategy']:7s} ok={e.ok} {e.reason[:200]} cand {c.median_us if c else float('nan'):.1f} reps {c.reps if c else 0} cv {c.cv if c else 0:.4f} base {b.median_us if b else float('nan'):.1f}", flush=True)
            ev.baseline = base
    finally:
        await ev.close()
asyncio.run(main())
