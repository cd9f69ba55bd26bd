"""A run's LLM calls: recording each one, its totals (what the money and token budgets count), the calls behind a
node (the conversation view), and how each model fared as a kernel writer (the router and `kernelforge runs`)."""

from __future__ import annotations

import sqlite3

from kernelforge_tui.store.database import Database
from kernelforge_tui.vocabulary.llm import LlmCall, LlmTotals, ModelRecord
from kernelforge_tui.vocabulary.nodes import MEASURED

_FIRST_COLUMNS = (
    "node, child, role, provider, model, prompt, prompt_sha256, reply, reply_sha256, input_tokens, output_tokens,"
    " cost_nanousd, latency_s, first_token_s, attempts, outcome, error, at"
)
_CACHE_COLUMNS = ("cache_write_tokens", "cache_read_tokens", "estimated")
_COLUMNS = f"{_FIRST_COLUMNS}, {', '.join(_CACHE_COLUMNS)}"
LLM_SCHEMA = 4
"""The first schema with LLM calls: an older run (opened read-only) has none."""
CACHE_SCHEMA = 5
"""The first schema with cached tokens and estimates: a call of an older run has neither."""


def _read_columns(schema_version: int) -> str:
    """The columns read back: an older run's calls read as calls with no cached tokens and no estimate."""
    if schema_version >= CACHE_SCHEMA:
        return _COLUMNS
    return f"{_FIRST_COLUMNS}, {', '.join(f'0 AS {column}' for column in _CACHE_COLUMNS)}"


class LlmQueries(Database):
    """RunStore's LLM call queries."""

    def record_llm_call(self, call: LlmCall) -> LlmCall:
        """Store a call; the call as stored (with its id)."""
        with self._tx() as c:
            cursor = c.execute(
                f"INSERT INTO llm_calls ({_COLUMNS}) VALUES ({','.join('?' * 21)})",
                (
                    call.node_id,
                    call.child_id,
                    call.role,
                    call.provider,
                    call.model,
                    call.prompt,
                    call.prompt_sha256,
                    call.reply,
                    call.reply_sha256,
                    call.input_tokens,
                    call.output_tokens,
                    call.cost_nanousd,
                    call.latency_s,
                    call.first_token_s,
                    call.attempts,
                    call.outcome,
                    call.error,
                    call.at,
                    call.cache_write_tokens,
                    call.cache_read_tokens,
                    call.estimated,
                ),
            )
        return call.model_copy(update={"id": cursor.lastrowid})

    def llm_calls(self, node_id: int | None = None) -> list[LlmCall]:
        """Every call of the run, or those that wrote node `node_id` or worked on it, in the order they were made."""
        if self._version() < LLM_SCHEMA:
            return []
        columns = _read_columns(self.schema_version)
        if node_id is None:
            rows = self._read(f"SELECT id, {columns} FROM llm_calls ORDER BY id")
        else:
            rows = self._read(
                f"SELECT id, {columns} FROM llm_calls WHERE child = ? OR node = ? ORDER BY id", (node_id, node_id)
            )
        return [_call(r) for r in rows]

    def llm_totals(self) -> LlmTotals:
        if self._version() < LLM_SCHEMA:
            return LlmTotals()
        row = self._read(
            "SELECT COUNT(*) AS calls, COALESCE(SUM(input_tokens), 0) AS tin, COALESCE(SUM(output_tokens), 0) AS tout,"
            " COALESCE(SUM(cost_nanousd), 0) AS cost FROM llm_calls"
        )[0]
        return LlmTotals(
            calls=row["calls"], input_tokens=row["tin"], output_tokens=row["tout"], cost_nanousd=row["cost"]
        )

    def model_records(self) -> list[ModelRecord]:
        """Per (provider, model): calls and cost of every role, what its coder and debugger calls cost, and of the
        kernels they wrote, how many reached the tree, how many were proven correct, and the best speedup among
        them."""
        if self._version() < LLM_SCHEMA:
            return []
        run = self._read("SELECT card_name, family FROM run")[0]
        measured = ",".join(f"'{status}'" for status in sorted(MEASURED))
        rows = self._read(
            "SELECT provider, model, COUNT(*) AS calls, SUM(cost_nanousd) AS cost,"
            " SUM(CASE WHEN role IN ('coder', 'debugger') THEN cost_nanousd ELSE 0 END) AS writing,"
            " (SELECT COUNT(DISTINCT n.id) FROM llm_calls k JOIN nodes n ON n.id = k.child"
            "   WHERE k.provider = c.provider AND k.model = c.model AND k.role IN ('coder', 'debugger')) AS kernels,"
            " (SELECT COUNT(DISTINCT n.id) FROM llm_calls k JOIN nodes n ON n.id = k.child"
            "   WHERE k.provider = c.provider AND k.model = c.model AND k.role IN ('coder', 'debugger')"
            f"   AND n.status IN ({measured})) AS correct,"
            " (SELECT MAX(n.speedup) FROM llm_calls k JOIN nodes n ON n.id = k.child"
            "   WHERE k.provider = c.provider AND k.model = c.model AND k.role IN ('coder', 'debugger')"
            f"   AND n.status IN ({measured})) AS best"
            " FROM llm_calls c GROUP BY provider, model ORDER BY provider, model"
        )
        return [
            ModelRecord(
                provider=r["provider"],
                model=r["model"],
                family=run["family"],
                card=run["card_name"],
                calls=r["calls"],
                kernels=r["kernels"],
                correct=r["correct"],
                best_speedup=r["best"],
                cost_nanousd=r["cost"] or 0,
                writing_cost_nanousd=r["writing"] or 0,
            )
            for r in rows
        ]


def _call(r: sqlite3.Row) -> LlmCall:
    return LlmCall(
        id=r["id"],
        node_id=r["node"],
        child_id=r["child"],
        role=r["role"],
        provider=r["provider"],
        model=r["model"],
        prompt=r["prompt"],
        prompt_sha256=r["prompt_sha256"],
        reply=r["reply"],
        reply_sha256=r["reply_sha256"],
        input_tokens=r["input_tokens"],
        output_tokens=r["output_tokens"],
        cost_nanousd=r["cost_nanousd"],
        latency_s=r["latency_s"],
        first_token_s=r["first_token_s"],
        attempts=r["attempts"],
        outcome=r["outcome"],
        error=r["error"],
        at=r["at"],
        cache_write_tokens=r["cache_write_tokens"],
        cache_read_tokens=r["cache_read_tokens"],
        estimated=bool(r["estimated"]),
    )
