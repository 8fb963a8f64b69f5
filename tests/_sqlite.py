"""SQLite files as an older release left them, and what every file is once opened now."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from zidane_actors.stores.sqlite._schema import MIGRATIONS, SCHEMA_VERSION, migrate

TURN_INDEXES = {"turns_by_session", "turns_by_id", "turns_commands", "turns_runs", "turns_user"}
"""The indexes of ``turns`` at the current schema."""


def old_file(db: Path, version: int, sessions: str) -> sqlite3.Connection:
    """A file at schema ``version`` holding the ``sessions`` rows (SQL values), left open."""
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, str(db), MIGRATIONS[:version]) == version
    conn.execute(
        f"INSERT INTO sessions (id, status, metadata, created_at, updated_at) VALUES {sessions}"
    )
    return conn


def assert_current(conn: sqlite3.Connection) -> None:
    """``conn``'s file is at the current schema (16), with every index of ``turns``."""
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 16
    assert {r[1] for r in conn.execute("PRAGMA index_list(turns)")} == TURN_INDEXES
