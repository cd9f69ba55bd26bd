"""A value over SQLite's size limit for one string or blob: one clear line, nothing stored, the run still whole
(SQLite's limit is lowered on the test's connection: its default is a GB)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.store import RunStore
from kernelforge_tui.store.errors import StoreError
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.nodes import NodeOutcome, NodeStatus
from tests.engine.test_search import make_card, toy_kernel

LIMIT = 64 << 10


def test_a_node_too_big_for_sqlite_is_a_clear_error_and_the_run_stays_whole(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run", make_card(tmp_path / "card"), "simulated", "none", RunSettings())
    store._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, LIMIT)
    k = toy_kernel(128, 1)
    with pytest.raises(StoreError) as huge_source:
        store.add_node(None, k.source + "//" + "x" * LIMIT, k.plan)
    node = store.add_node(None, k.source, k.plan)
    huge = Evaluation(ok=False, failure="mismatch", reason="x" * LIMIT)
    with pytest.raises(StoreError) as huge_evaluation:
        store.finish_node(node.id, huge, NodeOutcome(status=NodeStatus.FAILED, failure="mismatch"), {})
    for refused in (huge_source, huge_evaluation):
        message = str(refused.value)
        assert "string or blob too big" in message and "the file is not damaged" in message
        assert "limits.reply_bytes" in message and "is damaged" not in message
        assert str(tmp_path / "run" / "run.sqlite") in message
    assert [(n.id, n.status) for n in store.nodes()] == [(node.id, NodeStatus.PROPOSED)]  # both writes rolled back
    assert store.evaluation(node.id) is None
    store.verify()
    store.close()
