"""Stored rows read back as models: nodes in brief (NodeView) and in full (NodeRecord), speedup intervals, JSON
records (rewards, evaluations), and the first problem of one that no longer validates."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.vocabulary.identity import Identity, SourceIdentity, TemplateIdentity
from kernelforge_tui.vocabulary.nodes import NodeRecord, NodeView
from kernelforge_tui.vocabulary.rewards import Reward

M = TypeVar("M", bound=BaseModel)
IDENTITY: TypeAdapter[TemplateIdentity | SourceIdentity] = TypeAdapter(Identity)


def view_columns(schema_version: int) -> str:
    """The columns of a NodeView, for a file of this schema; a run of schema 1 (readonly) has no rewards."""
    reward = (
        "json_extract(reward_json, '$.total') AS reward_total,"
        " json_extract(reward_json, '$.explanation') AS reward_note"
        if schema_version >= 2
        else "NULL AS reward_total, NULL AS reward_note"
    )
    interval = "speedup_low, speedup_high" if schema_version >= 3 else "NULL AS speedup_low, NULL AS speedup_high"
    return (
        "id, parent, status, failure, reason, mutation, proposer, latency, speedup, ceiling_share, visits, value,"
        " banned, pinned, export, created_at,"
        " EXISTS (SELECT 1 FROM profiles p WHERE p.node = nodes.id) AS profiled, " + reward + ", " + interval
    )


def as_view(r: sqlite3.Row) -> NodeView:
    """A row of `view_columns`."""
    return NodeView(
        **_node_fields(r),
        speedup_interval=interval(r),
        visits=r["visits"],
        value=r["value"],
        created_at=r["created_at"],
        profiled=bool(r["profiled"]),
        reward_total=r["reward_total"],
        reward_note=r["reward_note"] or "",
    )


def as_record(r: sqlite3.Row) -> NodeRecord:
    """A whole `nodes` row with `last_m`, the id of its latest measurement."""
    return NodeRecord(
        **_node_fields(r),
        params=json.loads(r["params"]),
        source=r["source"],
        plan=LaunchPlan.model_validate_json(r["plan"]),
        hints=json.loads(r["hints"]),
        attempts=r["attempts"],
        last_measurement=r["last_m"],
        reward=parsed_or_none(Reward, r["reward_json"]) if "reward_json" in r.keys() else None,  # noqa: SIM118 (Row: keys)
        repair_of=r["repair_of"] if "repair_of" in r.keys() else None,  # noqa: SIM118 (Row: keys)
        judge_score=r["judge_score"] if "judge_score" in r.keys() else None,  # noqa: SIM118 (Row: keys)
        identity=stored_identity(r["identity"]) if "identity" in r.keys() else None,  # noqa: SIM118 (Row: keys)
    )


def stored_identity(text: str | None) -> TemplateIdentity | SourceIdentity | None:
    """A node's stored identity, or None where there is none (stored before schema 6) or it no longer parses."""
    if text is None:
        return None
    try:
        return IDENTITY.validate_json(text)
    except ValidationError:
        return None


def _node_fields(r: sqlite3.Row) -> dict[str, Any]:
    """The fields a NodeView and a NodeRecord share, from their columns."""
    return {
        "id": r["id"],
        "parent_id": r["parent"],
        "status": r["status"],
        "failure": r["failure"],
        "reason": r["reason"],
        "mutation": r["mutation"],
        "proposer": r["proposer"],
        "latency_us": r["latency"],
        "speedup": r["speedup"],
        "ceiling_share": r["ceiling_share"],
        "banned": bool(r["banned"]),
        "pinned": bool(r["pinned"]),
        "export": bool(r["export"]),
    }


def interval(r: sqlite3.Row) -> tuple[float, float] | None:
    """The speedup's interval from `speedup_low` and `speedup_high`, or None where either is missing."""
    low, high = r["speedup_low"], r["speedup_high"]
    return (low, high) if low is not None and high is not None else None


def parsed_or_none(model: type[M], text: str | None) -> M | None:
    """A stored record (a reward, an evaluation) as `model`, or None where there is none or it no longer parses
    (an older format)."""
    if text is None:
        return None
    try:
        return model.model_validate_json(text)
    except ValidationError:
        return None


def first_problem(exc: ValidationError) -> str:
    """The first thing a stored record got wrong, as `where: what` (just `what` at the top level)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])
