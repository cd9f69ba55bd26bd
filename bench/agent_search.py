"""GPU check (not a test): the agent team's search on a real card with real evaluation, the models scripted.

A loopback HTTP server (tests/support/fakes/llm_server.py, the one the tests use) speaks the Anthropic protocol and
answers each role from a script of real kernels for softmax over bf16 [4096 x 32768]: two pooled models write first
kernels (one block per row, 1024 and 512 threads), the planner names strategies, the coder writes them (one of them does
not compile and goes to the debugger), the judge scores them, and an analyst reads each profiled node's classified ncu
report. Everything else is the product as a user runs it: the engine, nvcc, the GPU worker's checks and timing, ncu
profiles, the store. Prints and writes (to --out) a JSON summary: the tree, the calls per role, tokens and cost.

    python bench/agent_search.py --out DIR [--card softmax_bf16_4096x32768] [--iters 12] [--simulate]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelforge_tui.config import LlmSettings, Settings, checked_settings  # noqa: E402
from kernelforge_tui.engine.budget import Budget  # noqa: E402
from kernelforge_tui.engine.setup import RunOptions, prepare_run  # noqa: E402
from kernelforge_tui.store import RunStore  # noqa: E402
from tests.support.fakes.agent_replies import KERNEL, Script, kernel, strategy, verdict  # noqa: E402
from tests.support.fakes.llm_server import LlmServer  # noqa: E402

WRITER, SECOND = "claude-sonnet-4-5", "claude-haiku-4-5"


def variant(block: int, maxv: int, bounds: str = "1024") -> str:
    """The example one-block-per-row kernel with `maxv` 16-byte vectors per thread held in registers."""
    return KERNEL.replace("#define MAXV 4", f"#define MAXV {maxv}").replace(
        "__launch_bounds__(1024)", f"__launch_bounds__({bounds})"
    )


def plan(block: int) -> dict[str, object]:
    return {"entry": "softmax_block_row_bf16", "grid": ["rows"], "block": [block], "args": ["x", "y", "rows", "cols"]}


def script() -> Script:
    broken = variant(256, 16, "256").replace("softmax_block_row_bf16(const", "softmax_block_row_bf16(const const int")
    coded = [
        kernel("512 threads, 8 vectors each in registers.", variant(512, 8, "512"), plan(512)),
        kernel("256 threads, 16 vectors each.", broken, plan(256)),
        kernel("1024 threads, two blocks per SM allowed.", variant(1024, 4, "1024, 2"), plan(1024)),
        kernel("768 threads, online pass for the long rows.", variant(768, 4, "768"), plan(768)),
        kernel("128 threads, 32 vectors each.", variant(128, 32, "128"), plan(128)),
        kernel("1024 threads, 8 vectors each (half idle).", variant(1024, 8, "1024"), plan(1024)),
    ]
    return Script(
        {
            f"first@{WRITER}": [kernel("One block per row, 1024 threads.", variant(1024, 4), plan(1024))],
            f"first@{SECOND}": [kernel("One block per row, 512 threads.", variant(512, 8, "512"), plan(512))],
            "analyst": ["Memory-bandwidth-bound near the copy roof: only launch shape and tails are left."] * 20,
            "planner": [strategy(f"Strategy {i}: vary the launch shape") for i in range(20)],
            "coder": coded * 3,
            "judge": [verdict(0.7, "targets the bandwidth roof")] * 20,
            "debugger": [kernel("Removed the stray `const int`.", variant(256, 16, "256"), plan(256))] * 3,
        }
    )


def llm(url: str) -> LlmSettings:
    return LlmSettings.model_validate(
        {
            "providers": [{"name": "scripted", "protocol": "anthropic", "base_url": url, "api_key_env": None}],
            "models": [
                {"name": "writer", "provider": "scripted", "model": WRITER},
                {"name": "second", "provider": "scripted", "model": SECOND},
            ],
            "roles": {"analyst": "second", "planner": "writer", "coder": ["writer", "second"], "judge": "second"},
            "agents": {"pool_size": 2, "expansions": 2},
        }
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--card", default="softmax_bf16_4096x32768")
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--simulate", action="store_true", help="no GPU: check the script and the builds only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    replies = script()
    with LlmServer(responder=replies) as server:
        settings = checked_settings(Settings, llm=llm(server.url))
        options = RunOptions(
            budget=Budget(max_iterations=args.iters), proposer="agents", simulate=args.simulate, root=args.out / "runs"
        )
        search = prepare_run(ROOT / "examples" / "cards" / args.card, settings, options)
        info = await search.run()
        search.store.close()
    with RunStore.open(info.run_dir, readonly=True) as store:
        calls = store.llm_calls()
        totals = store.llm_totals()
        nodes = [
            {
                "id": n.id,
                "parent": n.parent_id,
                "proposer": n.proposer,
                "mutation": n.mutation[:80],
                "status": n.status,
                "failure": n.failure,
                "speedup": n.speedup,
                "ceiling_share": n.ceiling_share,
                "profiled": n.profiled,
                "repair_of": store.node_record(n.id).repair_of,
                "judge": store.node_record(n.id).judge_score,
            }
            for n in store.nodes()
        ]
    summary = {
        "card": args.card,
        "backend": info.backend,
        "gpu": info.gpu_name,
        "reason": info.reason,
        "best_node": info.best_node_id,
        "best_speedup": info.best_speedup,
        "best_speedup_interval": info.best_speedup_interval,
        "best_ceiling_share": info.best_ceiling_share,
        "calls_by_role": dict(Counter(c.role for c in calls)),
        "outcomes": dict(Counter(c.outcome for c in calls)),
        "tokens": totals.tokens,
        "cost_usd": totals.cost_usd,
        "nodes": nodes,
        "unused_replies": replies.left(),
    }
    text = json.dumps(summary, indent=2)
    (args.out / "agent_search.json").write_text(text)
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
