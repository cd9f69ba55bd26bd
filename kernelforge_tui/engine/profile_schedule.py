"""Which nodes the search profiles with Nsight Compute, in what order, and how often.

The candidates that matter are profiled by a task of their own, never in the way of evaluation: the
card's baseline and each new best, each node faster than its parent, and any node a person asks for
(`ProfileNode`, queued first). On a GPU the profile holds that GPU's lane (ncu's replays would disturb a
timing), while proposals and builds go on. At most `max_pending` automatic profiles wait (a new best
takes the place of a waiting one; others are skipped), and automatic profiling holds a lane at most
`max_share` of the time while the search runs. A typed profiling error (ncu missing, not permitted,
unsupported, a timeout; or a backend that cannot profile, such as the simulated one) is logged once and
ends automatic profiling for the run; so do `PROFILE_FAILURES_IN_A_ROW` candidate-specific failures.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from enum import IntEnum

from kernelforge_tui.config import ProfileSettings
from kernelforge_tui.engine.backend import EvaluationBackend, ProfilingBackend
from kernelforge_tui.engine.events import EventBus
from kernelforge_tui.engine.scoring import Scorer
from kernelforge_tui.engine.tree import Tree
from kernelforge_tui.gpu.ncu.run import ProfileError, ProfileFailed, ProfilingUnavailable
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.events import LogLevel
from kernelforge_tui.vocabulary.nodes import NodeStatus

PROFILE_FAILURES_IN_A_ROW = 3
"""Automatic profiling also stops after this many candidate-specific failures in a row (kind "failed")."""


class ProfileReason(IntEnum):
    """Why a node is profiled; the lower, the sooner (a person's request first)."""

    ASKED = 0
    NEW_BEST = 1
    BEATS_PARENT = 2


class ProfileScheduler:
    """The profile queue and the task that works it, one profile at a time, beside the pipeline."""

    def __init__(
        self,
        backend: EvaluationBackend,
        store: RunStore,
        tree: Tree,
        bus: EventBus,
        scorer: Scorer,
        settings: ProfileSettings,
        running: asyncio.Event,
        wake: asyncio.Event,
    ) -> None:
        """`running`: cleared while the search is paused; `wake`: set when a profile ends (the driver waits)."""
        self.backend = backend
        self.store = store
        self.tree = tree
        self.bus = bus
        self.scorer = scorer
        self.settings = settings
        self.running = running
        self.wake = wake
        self.profiled: set[int] = set()
        """Nodes with a saved profile (restored from the store on a resume)."""
        self.auto = True
        """False once a profiling error ended automatic profiling for this run (ProfileNode still tries)."""
        self.searching = True
        """False once the search stops proposing: the share limit is lifted for the profiles still waiting."""
        self.dropped = False
        """A Stop command: the profiles still waiting are not run."""
        self._queue: asyncio.PriorityQueue[tuple[int, int, int]] = asyncio.PriorityQueue()
        self._waiting: dict[int, ProfileReason] = {}
        """Queued node -> why; an entry evicted from here is skipped when it leaves the queue."""
        self._seq = itertools.count()
        self._current: int | None = None
        self._failures = 0
        self._next_at = 0.0

    @property
    def pending(self) -> bool:
        """Profiles queued or running that a finishing run still waits for (not after a Stop command)."""
        return not self.dropped and (bool(self._waiting) or self._current is not None)

    def waiting(self) -> list[int]:
        """The nodes whose profile waits, oldest first."""
        return list(self._waiting)

    def request(self, node_id: int, reason: ProfileReason) -> bool:
        """Queue a profile; automatic ones only while enabled, not twice, and at most `max_pending` waiting."""
        if node_id in self._waiting or node_id == self._current:
            return False
        if reason != ProfileReason.ASKED:
            if not self.auto or node_id in self.profiled:
                return False
            if len(self._waiting) >= self.settings.max_pending and not self._evict_for(reason):
                self.bus.log(
                    f"node {node_id} not profiled: {len(self._waiting)} profiles already wait "
                    "(profile settings: max_pending)",
                    "debug",
                    node_id,
                )
                return False
        self._waiting[node_id] = reason
        self._queue.put_nowait((reason, next(self._seq), node_id))
        return True

    def _evict_for(self, reason: ProfileReason) -> bool:
        """Make room for a new best: drop a waiting profile of a node that only beat its parent, else the
        oldest waiting former best (it is no longer the best). Profiles a person asked for stay."""
        if reason != ProfileReason.NEW_BEST:
            return False
        for worse in (ProfileReason.BEATS_PARENT, ProfileReason.NEW_BEST):
            for node_id, queued in self._waiting.items():  # insertion order: oldest first
                if queued == worse:
                    del self._waiting[node_id]
                    self.bus.log(
                        f"node {node_id}'s profile dropped for a new best (profile settings: max_pending)",
                        "debug",
                        node_id,
                    )
                    return True
        return False

    async def run(self) -> None:
        """Profile the queued nodes one at a time (the backend holds a GPU lane for each)."""
        while True:
            await self.running.wait()
            reason, _, node_id = await self._queue.get()
            if self._waiting.get(node_id) != reason:
                continue  # evicted to make room for a new best
            asked = reason == ProfileReason.ASKED
            if not asked:
                if not self.auto:
                    self._waiting.pop(node_id, None)
                    self.wake.set()
                    continue
                delay = self._next_at - time.monotonic()
                if delay > 0 and self.searching:  # a lane at most max_share of the time while searching
                    await asyncio.sleep(delay)
            self._waiting.pop(node_id, None)
            self._current = node_id
            try:
                await self._profile(node_id, asked)
            finally:
                self._current = None
                self.wake.set()

    async def _profile(self, node_id: int, asked: bool) -> None:
        source, plan = self.store.node_source(node_id)
        latency = self.store.node(node_id).latency_us
        try:
            if not isinstance(self.backend, ProfilingBackend):
                raise ProfilingUnavailable(f"the {getattr(self.backend, 'name', 'evaluation')} backend cannot profile")
            profiled = await self.backend.profile(source, plan, latency)
        except ProfileError as exc:
            self._failed(node_id, exc, asked)
            return
        except Exception as exc:  # a broken backend must not end the run
            self._failed(node_id, ProfileFailed(f"{type(exc).__name__}: {exc}"), asked)
            return
        # The lane was held for ncu's run only (waiting for the lane does not count against the share).
        share = self.settings.max_share
        self._next_at = time.monotonic() + profiled.profile.seconds * (1 - share) / share
        self._failures = 0
        self.store.save_profile(node_id, profiled)
        self.profiled.add(node_id)
        node = self.tree[node_id]
        if node.status == NodeStatus.TIMED:
            node.status = NodeStatus.PROFILED
            self.store.set_status(node_id, NodeStatus.PROFILED)
        for changed in sorted(self.scorer.rescore(node_id) | {node_id}):
            self.bus.changed(changed)
        self.bus.log(
            f"profiled node {node_id} in {profiled.profile.seconds:.1f} s: {profiled.hardware.summary()}",
            node_id=node_id,
        )

    def _failed(self, node_id: int, exc: ProfileError, asked: bool) -> None:
        """Log a profiling error; one that is not about this candidate ends automatic profiling, once."""
        self._failures += 1
        general = exc.kind != "failed" or self._failures >= PROFILE_FAILURES_IN_A_ROW
        if general and self.auto:
            self.auto = False
            level: LogLevel = "info" if exc.kind == "unavailable" else "warning"
            self.bus.log(
                f"node {node_id} not profiled: {exc}; automatic profiling is off for this run "
                "(ProfileNode still tries)",
                level,
                node_id,
            )
        elif asked or not general:
            self.bus.log(f"node {node_id} not profiled: {exc}", "warning", node_id)
