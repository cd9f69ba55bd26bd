"""The schema of a run's database: its migrations and the version a file records."""

from __future__ import annotations

import sqlite3

MIGRATIONS: list[str] = [
    # 1: the first schema.
    """
    CREATE TABLE run (
        id TEXT PRIMARY KEY,
        card_name TEXT NOT NULL,
        family TEXT NOT NULL,
        card_json TEXT NOT NULL,
        card_dir TEXT NOT NULL,
        backend TEXT NOT NULL,
        gpu_name TEXT NOT NULL,
        settings_json TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        active_seconds REAL NOT NULL DEFAULT 0,
        pid INTEGER,
        host TEXT
    );
    CREATE TABLE nodes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        parent INTEGER REFERENCES nodes(id),
        status TEXT NOT NULL,
        failure TEXT,
        reason TEXT NOT NULL DEFAULT '',
        mutation TEXT NOT NULL DEFAULT '',
        proposer TEXT NOT NULL DEFAULT '',
        params TEXT NOT NULL DEFAULT '{}',
        source TEXT NOT NULL,
        plan TEXT NOT NULL,
        latency REAL,
        speedup REAL,
        ceiling_share REAL,
        visits INTEGER NOT NULL DEFAULT 0,
        value REAL NOT NULL DEFAULT 0,
        banned INTEGER NOT NULL DEFAULT 0,
        pinned INTEGER NOT NULL DEFAULT 0,
        export INTEGER NOT NULL DEFAULT 0,
        hints TEXT NOT NULL DEFAULT '[]',
        attempts INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX nodes_parent ON nodes(parent);
    CREATE TABLE measurements (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node INTEGER NOT NULL REFERENCES nodes(id),
        evaluation TEXT NOT NULL,
        gpu_seconds REAL NOT NULL DEFAULT 0,
        at REAL NOT NULL
    );
    CREATE INDEX measurements_node ON measurements(node);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        json TEXT NOT NULL
    );
    CREATE TABLE commands (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        json TEXT NOT NULL,
        applied INTEGER NOT NULL DEFAULT 0,
        at REAL NOT NULL
    );
    CREATE TABLE profiles (
        node INTEGER PRIMARY KEY REFERENCES nodes(id),
        json TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 2: the reward of each node with every term (engine.reward.Reward as JSON).
    """
    ALTER TABLE nodes ADD COLUMN reward_json TEXT;
    """,
    # 3: each speedup's 95% interval, and the best as promoted (beyond the noise, engine.promotion).
    """
    ALTER TABLE nodes ADD COLUMN speedup_low REAL;
    ALTER TABLE nodes ADD COLUMN speedup_high REAL;
    ALTER TABLE run ADD COLUMN best_node INTEGER REFERENCES nodes(id);
    """,
    # 4: LLM calls (vocabulary.llm.LlmCall), and on each node the failed node it repairs and the judge's score.
    """
    CREATE TABLE llm_calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node INTEGER REFERENCES nodes(id),
        child INTEGER REFERENCES nodes(id),
        role TEXT NOT NULL,
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        prompt TEXT,
        prompt_sha256 TEXT NOT NULL,
        reply TEXT,
        reply_sha256 TEXT NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_nanousd INTEGER NOT NULL,
        latency_s REAL NOT NULL,
        first_token_s REAL,
        attempts INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        error TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX llm_calls_node ON llm_calls(node);
    CREATE INDEX llm_calls_child ON llm_calls(child);
    ALTER TABLE nodes ADD COLUMN repair_of INTEGER REFERENCES nodes(id);
    ALTER TABLE nodes ADD COLUMN judge_score REAL;
    """,
    # 5: each call's cached input tokens (priced apart) and whether its tokens are an estimate.
    """
    ALTER TABLE llm_calls ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE llm_calls ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE llm_calls ADD COLUMN estimated INTEGER NOT NULL DEFAULT 0;
    """,
    # 6: each node's candidate identity (vocabulary.identity: a template's name, version and params, or the digest of
    # its source and plan) as JSON; NULL in the nodes stored before it (the engine derives theirs on resume).
    """
    ALTER TABLE nodes ADD COLUMN identity TEXT;
    """,
]
"""Migration i (0-based) takes the schema from version i to i + 1. Append; never edit a released one."""

SCHEMA_VERSION = len(MIGRATIONS)


def stored_version(conn: sqlite3.Connection) -> int:
    """The schema version the file records; 0 for a file that holds no kernelforge schema."""
    if not conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchall():
        return 0
    found = conn.execute("SELECT version FROM schema_version").fetchall()
    return int(found[0][0]) if found else 0


def migrate(conn: sqlite3.Connection) -> None:
    """Take the file's schema to SCHEMA_VERSION, inside the caller's write transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    for script in MIGRATIONS[stored_version(conn) :]:
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute("DELETE FROM schema_version")
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
