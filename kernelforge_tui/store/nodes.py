"""A run's nodes: adding them, their outcomes and statistics, reading them back in brief or in full, and the
measurements and profiles saved on them."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.store.database import Database
from kernelforge_tui.store.errors import UnknownNode, UnreadableRecord
from kernelforge_tui.store.records import as_record, as_view, first_problem, parsed_or_none, view_columns
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.identity import SourceIdentity, TemplateIdentity, canonical_json, source_identity
from kernelforge_tui.vocabulary.nodes import NodeOutcome, NodeRecord, NodeStats, NodeStatus, NodeView, ParamValue
from kernelforge_tui.vocabulary.profiles import NodeProfile
from kernelforge_tui.vocabulary.rewards import Reward


class NodeQueries(Database):
    """RunStore's node and profile queries."""

    def add_node(
        self,
        parent_id: int | None,
        source: str,
        plan: LaunchPlan,
        mutation: str = "",
        proposer: str = "",
        params: dict[str, ParamValue] | None = None,
        *,
        repair_of: int | None = None,
        judge_score: float | None = None,
        llm_calls: Sequence[int] = (),
        identity: TemplateIdentity | SourceIdentity | None = None,
    ) -> NodeView:
        """A new node, proposed (not yet built nor measured); the LLM calls that wrote it are linked to it. Its
        `identity` is by default its source and plan's (vocabulary/identity.py)."""
        now = time.time()
        known = identity if identity is not None else source_identity(source, plan)
        with self._tx() as c:
            cursor = c.execute(
                "INSERT INTO nodes (parent, status, mutation, proposer, params, source, plan, created_at, updated_at,"
                " repair_of, judge_score, identity) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    parent_id,
                    NodeStatus.PROPOSED,
                    mutation,
                    proposer,
                    json.dumps(params or {}),
                    source,
                    plan.model_dump_json(),
                    now,
                    now,
                    repair_of,
                    judge_score,
                    canonical_json(known),
                ),
            )
            node_id = cursor.lastrowid
            assert node_id is not None
            _link(c, node_id, llm_calls)
        return self.node(node_id)

    def link_llm_calls(self, node_id: int, llm_calls: Sequence[int]) -> None:
        """Link calls to a node already in the run: they wrote a candidate identical to it (dropped as such)."""
        with self._tx() as c:
            _link(c, node_id, llm_calls)

    def _set(self, node_id: int, sql: str, *values: object) -> NodeView:
        """One node's columns (`sql`: the assignments, written here, never from input); returns the new view."""
        with self._tx() as c:
            c.execute(f"UPDATE nodes SET {sql}, updated_at = ? WHERE id = ?", (*values, time.time(), node_id))
        return self.node(node_id)

    def set_status(self, node_id: int, status: NodeStatus) -> NodeView:
        """A step on the way (built, or profiled after it was timed); outcomes go through `finish_node`."""
        return self._set(node_id, "status = ?", status)

    def queue_node(self, node_id: int, attempts: int) -> NodeView:
        """The node handed to the pipeline (again, on a resume): proposed, and how many times it was handed."""
        return self._set(node_id, "status = ?, attempts = ?", NodeStatus.PROPOSED, attempts)

    def set_hints(self, node_id: int, hints: Sequence[str]) -> NodeView:
        return self._set(node_id, "hints = ?", json.dumps(list(hints)))

    def set_banned(self, node_id: int, banned: bool) -> NodeView:
        return self._set(node_id, "banned = ?", banned)

    def set_pinned(self, node_id: int, pinned: bool) -> NodeView:
        return self._set(node_id, "pinned = ?", pinned)

    def set_export(self, node_id: int, export: bool) -> NodeView:
        return self._set(node_id, "export = ?", export)

    def set_identities(self, identities: Mapping[int, TemplateIdentity | SourceIdentity]) -> None:
        """The identities of nodes stored without one (before schema 6), in one transaction."""
        with self._tx() as c:
            c.executemany(
                "UPDATE nodes SET identity = ? WHERE id = ? AND identity IS NULL",
                [(canonical_json(identity), node_id) for node_id, identity in identities.items()],
            )

    def finish_node(
        self, node_id: int, evaluation: Evaluation, outcome: NodeOutcome, stats: Mapping[int, NodeStats]
    ) -> None:
        """A node's outcome, its measurement and the statistics it moved (its ancestors'), in one transaction.

        The build's log and diagnostics are stored bounded, whatever made them: a huge one would not fit a row."""
        if evaluation.build is not None:
            evaluation = evaluation.model_copy(update={"build": evaluation.build.bounded()})
        gpu_seconds = evaluation.result.gpu_seconds if evaluation.result else 0.0
        reward = outcome.reward.model_dump_json() if outcome.reward is not None else None
        now = time.time()
        with self._tx() as c:
            c.execute(
                "INSERT INTO measurements (node, evaluation, gpu_seconds, at) VALUES (?,?,?,?)",
                (node_id, evaluation.model_dump_json(), gpu_seconds, now),
            )
            c.execute(
                "UPDATE nodes SET status = ?, failure = ?, reason = ?, latency = ?, speedup = ?, speedup_low = ?,"
                " speedup_high = ?, ceiling_share = ?, reward_json = ?, updated_at = ? WHERE id = ?",
                (
                    outcome.status,
                    outcome.failure,
                    outcome.reason,
                    outcome.latency_us,
                    outcome.speedup,
                    *(outcome.speedup_interval or (None, None)),
                    outcome.ceiling_share,
                    reward,
                    now,
                    node_id,
                ),
            )
            if outcome.best:
                c.execute("UPDATE run SET best_node = ?", (node_id,))
            self._save_stats(c, stats)

    def save_rewards(self, rewards: Mapping[int, Reward], stats: Mapping[int, NodeStats]) -> None:
        """New rewards (a profile arrived and rescored nodes) and the statistics they moved, in one transaction."""
        now = time.time()
        with self._tx() as c:
            for node_id, reward in rewards.items():
                c.execute(
                    "UPDATE nodes SET reward_json = ?, updated_at = ? WHERE id = ?",
                    (reward.model_dump_json(), now, node_id),
                )
            self._save_stats(c, stats)

    @staticmethod
    def _save_stats(c: sqlite3.Connection, stats: Mapping[int, NodeStats]) -> None:
        for node_id, s in stats.items():
            c.execute("UPDATE nodes SET visits = ?, value = ? WHERE id = ?", (s.visits, s.value, node_id))

    def nodes(self) -> list[NodeView]:
        """Every node, in id order (a parent always comes before its children)."""
        return [as_view(r) for r in self._read(f"SELECT {view_columns(self.schema_version)} FROM nodes ORDER BY id")]

    def node(self, node_id: int) -> NodeView:
        rows = self._read(f"SELECT {view_columns(self.schema_version)} FROM nodes WHERE id = ?", (node_id,))
        if not rows:
            raise self._unknown(node_id)
        return as_view(rows[0])

    def _unknown(self, node_id: int) -> UnknownNode:
        return UnknownNode(f"no node {node_id} in run {self.run_dir.name}")

    def node_source(self, node_id: int) -> tuple[str, LaunchPlan]:
        rows = self._read("SELECT source, plan FROM nodes WHERE id = ?", (node_id,))
        if not rows:
            raise self._unknown(node_id)
        return rows[0]["source"], LaunchPlan.model_validate_json(rows[0]["plan"])

    _RECORDS = "SELECT n.*, (SELECT MAX(m.id) FROM measurements m WHERE m.node = n.id) AS last_m FROM nodes n"

    def node_records(self) -> list[NodeRecord]:
        """Every node in full, in id order, with the id of its latest measurement."""
        return [as_record(r) for r in self._read(self._RECORDS + " ORDER BY id")]

    def node_record(self, node_id: int) -> NodeRecord:
        """One node in full: source, plan, params, hints and its reward with every term."""
        rows = self._read(self._RECORDS + " WHERE n.id = ?", (node_id,))
        if not rows:
            raise self._unknown(node_id)
        return as_record(rows[0])

    def evaluation(self, node_id: int) -> Evaluation | None:
        """The node's latest whole Evaluation (build, checks, timing), or None before it was measured."""
        rows = self._read("SELECT evaluation FROM measurements WHERE node = ? ORDER BY id DESC LIMIT 1", (node_id,))
        return parsed_or_none(Evaluation, rows[0]["evaluation"]) if rows else None

    def measured_on(self) -> dict[str, int]:
        """How many evaluations each GPU measured (`Evaluation.measured_on` -> count), most first: the GPUs of a run
        on several, or on a cluster. Evaluations without the label (old runs, failures before a GPU) and damaged
        rows are not counted. One query: the label is read out of the stored JSON by SQLite."""
        rows = self._read(
            "SELECT label, COUNT(*) AS n FROM (SELECT CASE WHEN json_valid(evaluation)"
            " THEN json_extract(evaluation, '$.measured_on') END AS label FROM measurements)"
            " WHERE label IS NOT NULL GROUP BY label ORDER BY n DESC, label"
        )
        return {str(r["label"]): int(r["n"]) for r in rows}

    # ---- profiles -----------------------------------------------------------------------------------

    def save_profile(self, node_id: int, profile: NodeProfile) -> None:
        """The node's profile (a newer one replaces it)."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO profiles (node, json, at) VALUES (?, ?, ?)"
                " ON CONFLICT(node) DO UPDATE SET json = excluded.json, at = excluded.at",
                (node_id, profile.model_dump_json(), time.time()),
            )

    def profile(self, node_id: int) -> NodeProfile | None:
        """The node's saved profile, or None; UnreadableRecord when it no longer reads as a NodeProfile."""
        rows = self._read("SELECT json FROM profiles WHERE node = ?", (node_id,))
        if not rows:
            return None
        try:
            return NodeProfile.model_validate_json(rows[0]["json"])
        except ValidationError as exc:
            raise UnreadableRecord(
                f"node {node_id}'s profile does not read as a profile of this kernelforge: "
                f"{exc.error_count()} problem(s), first {first_problem(exc)}"
            ) from None

    def profiled_ids(self) -> set[int]:
        """The nodes with a saved profile."""
        return {int(r["node"]) for r in self._read("SELECT node FROM profiles")}


def _link(c: sqlite3.Connection, node_id: int, llm_calls: Sequence[int]) -> None:
    c.executemany("UPDATE llm_calls SET child = ? WHERE id = ?", [(node_id, call) for call in llm_calls])
