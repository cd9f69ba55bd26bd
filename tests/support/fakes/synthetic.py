"""A deterministic synthetic run: the TUI's tests, snapshots and benchmark use it, with no engine.

It behaves like a search seen through a `RunSource`: a tree of softmax-like candidates that differ in
block size and vector width, measurements for the timed ones, a profile for a few, and an echo of every
command as the engine would answer it (a state change, a flag on the node, a new child, a log line).
Each blocking read records the thread it ran on, so a test can check the app keeps them off its loop.
"""

from __future__ import annotations

import math
import random
import tempfile
import threading
from collections import deque
from pathlib import Path

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.engine.takeaway import KERNEL_FILE, PLAN_FILE, SUMMARY_FILE, plan_toml
from kernelforge_tui.engine.view import RunHeader, Snapshot
from kernelforge_tui.errors import BadInput
from kernelforge_tui.gpu.ncu import hardware
from kernelforge_tui.gpu.ncu.csv_report import section_of
from kernelforge_tui.tui.source import NodeSource, ProfileRead
from kernelforge_tui.vocabulary.commands import (
    AddHint,
    BanSubtree,
    EngineCommand,
    ExpandNode,
    InjectKernel,
    MarkExport,
    Pause,
    PinSubtree,
    ProfileNode,
    Resume,
    Stop,
)
from kernelforge_tui.vocabulary.evaluation import BuildResult, EvalResult, Evaluation, PtxasStats, Timing
from kernelforge_tui.vocabulary.events import (
    BestImproved,
    BudgetUsed,
    EngineEvent,
    LogLine,
    NodeAdded,
    NodeChanged,
    SearchState,
    StateChanged,
)
from kernelforge_tui.vocabulary.nodes import NodeView
from kernelforge_tui.vocabulary.profiles import Metric, NodeProfile, ProfileReport, Unit
from kernelforge_tui.vocabulary.rewards import Reward, RewardTerm
from kernelforge_tui.vocabulary.runs import ClusterStatus

T0 = 1_700_000_000.0
BASELINE_US = 412.0
FAILURES = ("compile", "mismatch", "launch", "timeout", "cheat")

KERNEL = """#include <cuda_bf16.h>

// Row softmax: one block per row, {vec}-wide loads, block-wide max and sum.
__global__ void __launch_bounds__({block}) softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {{
  __shared__ float red[{warps}];
  const int row = blockIdx.x;
  const float* in = x + (size_t)row * cols;
  float m = -INFINITY;
  for (int i = threadIdx.x * {vec}; i < cols; i += blockDim.x * {vec}) {{
{loads}
  }}
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  float s = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += __expf(in[i] - m);{unroll}
  y[(size_t)row * cols + threadIdx.x] = s;
}}
"""


def kernel_source(block: int, vec: int, unroll: bool) -> str:
    loads = "\n".join(f"    m = fmaxf(m, in[i + {k}]);" for k in range(vec))
    return KERNEL.format(
        block=block, vec=vec, warps=max(1, block // 32), loads=loads, unroll="\n  #pragma unroll 4" if unroll else ""
    )


PLAN = LaunchPlan(entry="softmax_rows", grid=["rows"], block=[256], args=["x", "y", "cols"])


class SyntheticSource:
    """An in-memory `RunSource` with `nodes` nodes; `grow()` adds more as a live search would."""

    in_process = False

    def __init__(
        self,
        nodes: int = 40,
        seed: int = 7,
        steerable: bool = True,
        state: SearchState = "running",
        run_dir: Path | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.run_dir = run_dir or Path(tempfile.gettempdir()) / "kernelforge-synthetic" / "r-2311-softmax"
        """Where the run would live: exported kernels go into `kernels/` beside it."""
        self.written: list[Path] = []
        self.nodes: dict[int, NodeView] = {}
        self.params: dict[int, tuple[int, int, bool]] = {}
        self.children: dict[int, list[int]] = {}
        self.sources: dict[int, str] = {}
        self.pending: deque[EngineEvent] = deque()
        self.sent: list[EngineCommand] = []
        self.read_threads: list[threading.Thread] = []
        """The thread each blocking read (snapshot, source, evaluation, profile) ran on."""
        self.steerable = steerable
        self.header = RunHeader(
            run_id="r-2311-softmax",
            card_name="softmax_f32_4096x32768",
            gpu_name="NVIDIA H200",
            backend="templates",
            state=state,
            started_at=T0,
        )
        self.clock = T0
        self.best: NodeView | None = None
        self.logs: list[LogLine] = []
        self.closed = False
        self._root()
        for _ in range(nodes - 1):
            self._new_node()
        self.budget = BudgetUsed(
            at=self.clock,
            iterations=len(self.nodes),
            max_iterations=500,
            elapsed_s=754.0,
            max_seconds=3600.0,
            gpu_seconds=212.0,
            candidates_per_minute=18.4,
        )

    # -- generation -----------------------------------------------------------------------------

    def _tick(self) -> float:
        self.clock += 1.5
        return self.clock

    def _root(self) -> None:
        node = NodeView(
            id=1,
            parent_id=None,
            status="timed",
            mutation="template: row softmax",
            proposer="templates",
            latency_us=BASELINE_US,
            speedup=1.0,
            ceiling_share=0.31,
            visits=12,
            value=0.0,
            created_at=T0,
        )
        self.nodes[1], self.params[1] = node, (128, 1, False)
        self.sources[1] = kernel_source(128, 1, False)

    def _new_node(self, parent_id: int | None = None) -> NodeView:
        rng = self.rng
        node_id = len(self.nodes) + 1
        ids = list(self.nodes)
        if parent_id is None:
            # Prefer good nodes as parents, the way selection would (a bushy tree, not a chain).
            sample = self.rng.sample(ids, k=min(4, len(ids)))
            parent_id = max(sample, key=lambda i: (self.nodes[i].speedup or 0) - 0.02 * len(self.children.get(i, ())))
        parent = self.nodes[parent_id]
        block, vec, unroll = self.params[parent_id]
        change = rng.choice(("block", "vec", "unroll"))
        if change == "block":
            new = rng.choice([b for b in (64, 128, 256, 512, 1024) if b != block])
            mutation, block = f"block {block} -> {new}", new
        elif change == "vec":
            new = rng.choice([v for v in (1, 2, 4, 8) if v != vec])
            mutation, vec = f"vector width {vec} -> {new}", new
        else:
            mutation, unroll = ("unroll 4" if not unroll else "no unroll"), not unroll
        at = self._tick()
        if rng.random() < 0.18:
            kind = rng.choice(FAILURES)
            reason = {
                "compile": 'candidate.cu(9): error: identifier "in4" is undefined\n    m = fmaxf(m, in4.x);',
                "mismatch": "set 'fresh-1': 1834 of 134217728 elements off, worst error 3.1x tolerance",
                "launch": "an illegal memory access was encountered",
                "timeout": "no answer within 30 s",
                "cheat": "measured bandwidth 5.9 TB/s is over the copy ceiling",
            }[kind]
            node = NodeView(
                id=node_id,
                parent_id=parent_id,
                status="failed",
                failure=kind,
                reason=reason,
                mutation=mutation,
                proposer="templates",
                visits=1,
                value=-1.0,
                created_at=at,
            )
        else:
            base = parent.speedup or 1.0
            speedup = round(max(0.3, base * rng.uniform(0.82, 1.22)), 3)
            status = "profiled" if rng.random() < 0.15 else "timed"
            node = NodeView(
                id=node_id,
                parent_id=parent_id,
                status=status,
                mutation=mutation,
                proposer="templates",
                latency_us=round(BASELINE_US / speedup, 2),
                speedup=speedup,
                ceiling_share=round(min(0.97, 0.31 * speedup), 3),
                visits=rng.randint(1, 9),
                value=round(speedup - 1, 3),
                created_at=at,
            )
        self.nodes[node_id], self.params[node_id] = node, (block, vec, unroll)
        self.children.setdefault(parent_id, []).append(node_id)
        self.sources[node_id] = kernel_source(block, vec, unroll)
        if (
            node.speedup is not None
            and node.status != "failed"
            and (self.best is None or node.speedup > (self.best.speedup or 0))
        ):
            self.best = node
        return node

    def grow(self, count: int, changes: int = 0) -> None:
        """Queue `count` new nodes (and `changes` visit updates on existing ones), as events."""
        for _ in range(count):
            before = self.best
            node = self._new_node()
            self.pending.append(NodeAdded(at=self.clock, node=node))
            if self.best is not before and self.best is not None:
                best = self.best
                self.pending.append(
                    BestImproved(
                        at=self.clock, node_id=best.id, speedup=best.speedup or 1.0, latency_us=best.latency_us or 0.0
                    )
                )
        ids = list(self.nodes)
        for _ in range(changes):
            node_id = self.rng.choice(ids)
            node = self.nodes[node_id].model_copy(update={"visits": self.nodes[node_id].visits + 1})
            self.nodes[node_id] = node
            self.pending.append(NodeChanged(at=self.clock, node=node))
        self.pending.append(self.budget.model_copy(update={"iterations": len(self.nodes), "at": self.clock}))

    def _emit(self, event: EngineEvent) -> None:
        self.pending.append(event)

    # -- RunSource ------------------------------------------------------------------------------

    @property
    def can_steer(self) -> bool:
        return self.steerable and not self.closed

    def _reading(self) -> None:
        self.read_threads.append(threading.current_thread())

    def snapshot(self) -> Snapshot:
        self._reading()
        header = self.header.model_copy()
        if self.best is not None:
            header.best_node_id, header.best_speedup = self.best.id, self.best.speedup
        logs = [
            LogLine(at=T0 + 1, text="search started: templates proposer, budget 500 iterations, 60 min"),
            LogLine(at=T0 + 2, text="baseline 412.00 us (p10-p90 409.8-415.1, 120 reps)", node_id=1),
            LogLine(
                at=T0 + 9,
                level="error",
                node_id=4,
                text='compile failed: candidate.cu(9): error: identifier "in4" is undefined\n    m = fmaxf(m, in4.x);',
            ),
            LogLine(at=T0 + 12, text="templates tried: vector width 1 -> 4 on #1 (wider loads)", node_id=2),
        ]
        return Snapshot(header=header, nodes=list(self.nodes.values()), budget=self.budget, logs=logs)

    async def poll_events(self, limit: int = 5000) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        while self.pending and len(out) < limit:
            out.append(self.pending.popleft())
        return out

    async def send(self, command: EngineCommand) -> None:
        self.sent.append(command)
        at = self._tick()
        if isinstance(command, Pause):
            self._emit(StateChanged(at=at, state="paused", reason="paused from the TUI"))
        elif isinstance(command, Resume):
            self._emit(StateChanged(at=at, state="running"))
        elif isinstance(command, Stop):
            self._emit(StateChanged(at=at, state="stopping"))
        elif isinstance(command, BanSubtree | PinSubtree | MarkExport):
            field = {"ban": "banned", "pin": "pinned", "export": "export"}[command.kind]
            value = getattr(command, field)
            node = self.nodes[command.node_id].model_copy(update={field: value})
            self.nodes[node.id] = node
            self._emit(NodeChanged(at=at, node=node))
        elif isinstance(command, ExpandNode):
            self._emit(LogLine(at=at, text=f"expanding #{command.node_id} next", node_id=command.node_id))
        elif isinstance(command, ProfileNode):
            self._emit(LogLine(at=at, text=f"profiling #{command.node_id} next", node_id=command.node_id))
        elif isinstance(command, AddHint):
            self._emit(LogLine(at=at, text=f"hint recorded: {command.text}", node_id=command.node_id))
        elif isinstance(command, InjectKernel):
            node_id = len(self.nodes) + 1
            node = NodeView(
                id=node_id,
                parent_id=command.parent_id,
                status="proposed",
                mutation=command.note,
                proposer="human",
                created_at=at,
            )
            self.nodes[node_id] = node
            self.params[node_id] = self.params[command.parent_id]
            self.sources[node_id] = command.source
            self._emit(NodeAdded(at=at, node=node))

    async def run(self) -> None:
        return None

    def cluster_status(self) -> ClusterStatus | None:
        return None

    def measured_on(self) -> dict[str, int]:
        self._reading()
        return {}

    async def close(self) -> None:
        self.closed = True

    def node_source(self, node_id: int) -> NodeSource | None:
        self._reading()
        found = self.sources.get(node_id)
        return (found, PLAN) if found is not None else None

    def evaluation(self, node_id: int) -> Evaluation | None:
        self._reading()
        node = self.nodes.get(node_id)
        if node is None or node.status == "proposed":
            return None
        block, vec, unroll = self.params[node_id]
        regs = 18 + 4 * vec + (8 if unroll else 0) + block // 128
        build = BuildResult(
            ok=node.failure != "compile",
            key=f"k{node_id}",
            seconds=0.25,
            ptxas={
                "softmax_rows": PtxasStats(
                    registers=regs, shared_bytes=4 * max(1, block // 32), spill_store_bytes=8 if regs > 48 else 0
                )
            },
        )
        if node.status == "failed" or node.latency_us is None:
            return Evaluation(ok=False, failure=node.failure, reason=node.reason, build=build)
        median = node.latency_us
        result = EvalResult(
            ok=True,
            speedup=node.speedup,
            deterministic=True,
            candidate=Timing(
                median_us=median, p10_us=round(median * 0.985, 2), p90_us=round(median * 1.02, 2), cv=0.011, reps=120
            ),
            baseline=Timing(median_us=BASELINE_US, p10_us=409.8, p90_us=415.1, cv=0.009, reps=120),
        )
        return Evaluation(ok=True, build=build, result=result, ceiling_share=node.ceiling_share)

    def reward(self, node_id: int) -> Reward | None:
        """Terms as the engine's reward names them: the speedup's, and for a profiled node the DRAM bytes'."""
        self._reading()
        node = self.nodes.get(node_id)
        if node is None or node.status == "proposed":
            return None
        if node.status == "failed":
            term = RewardTerm(name="failure", value=-1.0, explanation=f"{node.failure}: {node.reason}")
            return Reward(total=-1.0, terms=[term], explanation=f"failed ({node.failure})")
        speedup = node.speedup or 1.0
        terms = [
            RewardTerm(
                name="speedup",
                value=math.log(speedup),
                explanation=f"{speedup:.2f}x over the baseline: 1 x ln({speedup:.3f})",
            )
        ]
        words = [f"{speedup:.2f}x over the baseline"]
        parent = self.nodes.get(node.parent_id) if node.parent_id is not None else None
        if parent is not None and parent.speedup:
            words = [f"{speedup / parent.speedup:.2f}x the parent's speed"]
        if node.status == "profiled":
            terms.append(RewardTerm(name="dram_bytes", value=0.12, explanation="DRAM bytes -11% (56.6 -> 50.3 MB)"))
            words.append(f"memory-bound at {100 * (node.ceiling_share or 0):.0f}% of peak")
        head = ", ".join(words[:-1])
        explanation = f"{head}: {words[-1]}" if head else words[-1]
        return Reward(total=sum(t.value for t in terms), terms=terms, explanation=explanation)

    def kernel_dir(self, node_id: int) -> Path:
        return self.run_dir.parent / "kernels" / f"{self.run_dir.name}-node-{node_id}"

    def write_kernel(self, node_id: int, out_dir: Path) -> Path:
        """The three files `engine.takeaway.write_kernel` writes (the summary short: there is no store)."""
        self._reading()
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / KERNEL_FILE).write_text(self.sources[node_id])
            (out_dir / PLAN_FILE).write_text(plan_toml(PLAN))
            (out_dir / SUMMARY_FILE).write_text(f"# {self.header.card_name}: node {node_id}\n")
        except OSError as exc:
            raise BadInput(f"cannot write the kernel into {out_dir} ({exc.strerror}): pick another directory") from None
        self.written.append(out_dir)
        return out_dir

    def profile(self, node_id: int) -> ProfileRead | None:
        self._reading()
        node = self.nodes.get(node_id)
        if node is None or node.status != "profiled":
            return None
        share = node.ceiling_share or 0.0
        values: dict[str, tuple[float, Unit]] = {
            hardware.SM_THROUGHPUT: (round(40 * share, 1), "percent"),
            hardware.MEMORY_THROUGHPUT: (round(100 * share, 1), "percent"),
            hardware.DRAM_THROUGHPUT[0]: (round(100 * share, 1), "percent"),
            hardware.DRAM_BYTES: (50_331_648.0, "bytes"),
            hardware.L2_HIT: (12.5, "percent"),
            hardware.DURATION: ((node.latency_us or 100.0) * 1e-6, "seconds"),
        }
        report = ProfileReport(
            kernel="softmax_kernel",
            metrics={
                name: Metric(name=name, section=section_of(name), value=value, unit=unit)
                for name, (value, unit) in values.items()
            },
        )
        return ProfileRead(
            profile=NodeProfile(profile=report, hardware=hardware.analyse(report, counted_bytes=50_331_648))
        )
