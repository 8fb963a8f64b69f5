"""Schema of the SQLite store and its ``PRAGMA user_version`` migrations.

``MIGRATIONS[i]`` upgrades a database from version ``i`` to ``i + 1``; a
database is at version ``len(MIGRATIONS)`` once opened. A file written by a
newer version of the library is refused rather than guessed at.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ..errors import StoreError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

_V1: Final = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    agent_id TEXT,
    project_root TEXT,
    status TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    run_owner TEXT,
    run_epoch INTEGER NOT NULL DEFAULT 0,
    rev INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX sessions_by_updated ON sessions (updated_at DESC, id);
CREATE TABLE turns (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    role TEXT NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE INDEX turns_by_role ON turns (session_id, role, seq);
CREATE TABLE runs (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    position INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, id)
) WITHOUT ROWID;
CREATE INDEX runs_by_position ON runs (session_id, position);
CREATE TABLE artifacts (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    body BLOB NOT NULL,
    UNIQUE (session_id, kind, uri),
    UNIQUE (session_id, id)
);
CREATE TABLE send_requests (
    session_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    result BLOB,
    PRIMARY KEY (session_id, request_id)
) WITHOUT ROWID;
CREATE TABLE schedules (
    id TEXT PRIMARY KEY,
    enabled INTEGER NOT NULL,
    next_fire_at INTEGER,
    created_at INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE schedule_fires (
    schedule_id TEXT NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    fired_at INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX schedule_fires_by_time ON schedule_fires (schedule_id, fired_at DESC);
"""

# v2: turns in insertion (rowid) order, found through a unique (session_id, seq)
# index. Clustered by session (v1), a commit appending one turn to each of many
# sessions rewrote a page per session, so its cost grew with their histories;
# in rowid order the bodies go to the end of the table and only small index
# entries land between a session's older rows.
_V2: Final = """
CREATE TABLE turns_v2 (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    role TEXT NOT NULL,
    body BLOB NOT NULL
);
INSERT INTO turns_v2 (session_id, seq, id, role, body)
    SELECT session_id, seq, id, role, body FROM turns ORDER BY session_id, seq;
DROP TABLE turns;
ALTER TABLE turns_v2 RENAME TO turns;
CREATE UNIQUE INDEX turns_by_session ON turns (session_id, seq);
CREATE INDEX turns_by_role ON turns (session_id, role, seq);
"""

MIGRATIONS: Final[tuple[str, ...]] = (_V1, _V2)
"""SQL scripts; ``MIGRATIONS[i]`` takes a database from version ``i`` to ``i + 1``."""

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The ``user_version`` this library writes and reads."""


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _refuse_foreign(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a database at ``user_version`` 0 that already holds tables: not ours to migrate."""
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            " ORDER BY name"
        )
    ]
    if tables:
        listed = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
        raise StoreError(
            f"SQLite database {path} holds tables ({listed}) but no zidane_actors schema "
            "(user_version 0): it belongs to another program, so it is not migrated; "
            "open a new file instead"
        )


def migrate(conn: sqlite3.Connection, path: str, migrations: tuple[str, ...] = MIGRATIONS) -> int:
    """Bring ``conn`` up to ``len(migrations)``, one transaction per step; the final version.

    Raises :class:`~zidane_actors.errors.StoreError` for a database written by a
    newer library (its ``user_version`` is past what ``migrations`` knows) and
    for a foreign one (``user_version`` 0 with tables already in it).
    """
    target = len(migrations)
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > target:
            raise StoreError(
                f"SQLite database {path} has schema version {version}, newer than the "
                f"{target} this version of zidane_actors supports; upgrade zidane_actors"
            )
        if version == 0:
            _refuse_foreign(conn, path)
        while version < target:
            for statement in _statements(migrations[version]):
                conn.execute(statement)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return version
