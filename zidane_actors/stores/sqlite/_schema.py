"""Schema of the SQLite store and its ``PRAGMA user_version`` migrations.

``MIGRATIONS[i]`` upgrades a database from version ``i`` to ``i + 1``; a
database is at version ``len(MIGRATIONS)`` once opened. A file written by a
newer version of the library is refused rather than guessed at.
"""

from __future__ import annotations

import sqlite3
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Final, TypeAlias

from ...errors import MigrationWarning, StoreError
from ...model import (
    ID_MAX_LENGTH,
    encode,
    index_words,
    parse_json,
    stored_header_text,
    stored_turn_text,
)
from .._indexer import INDEX_STEP_SECONDS
from ..sql import SQLITE
from ..sql._forks import FORKED_FROM, has_forks, heirs, ranges_of, ranges_select

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "index_pending",
    "index_step",
    "migrate",
    "refuse_foreign",
]

Migration: TypeAlias = str | Callable[[sqlite3.Connection], None]
"""One migration step: an SQL script, or a function run on the connection."""

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


def _merge_duplicate_turns(conn: sqlite3.Connection) -> None:
    """Make turn ids unique per session without losing a turn (schema v3).

    Within a session, the first row holding an id keeps it. A later row with
    the same id and the same body as an earlier one is a duplicate append
    and is removed; one with another body keeps its content under a new id,
    ``<id>.dup<seq>`` (its old position, so the rename is deterministic;
    ``-<n>`` is added in the unlikely case that id is taken too). Affected
    sessions get their ``seq`` renumbered densely, in the same order. A
    :class:`~zidane_actors.errors.MigrationWarning` reports what changed.
    """
    sessions = [
        row[0]
        for row in conn.execute(
            "SELECT DISTINCT session_id FROM turns GROUP BY session_id, id HAVING COUNT(*) > 1"
        )
    ]
    removed = renamed = 0
    for session_id in sessions:
        rows = conn.execute(
            "SELECT rowid, seq, id, body FROM turns WHERE session_id = ? ORDER BY seq",
            (session_id,),
        ).fetchall()
        used = {row[2] for row in rows}
        bodies: dict[str, set[bytes]] = {}
        for rowid, seq, turn_id, body in rows:
            seen = bodies.setdefault(turn_id, set())
            if not seen:
                seen.add(body)
            elif body in seen:
                conn.execute("DELETE FROM turns WHERE rowid = ?", (rowid,))
                removed += 1
            else:
                seen.add(body)
                new_id = _renamed(turn_id, seq, used)
                used.add(new_id)
                turn = parse_json(body)
                turn["id"] = new_id
                conn.execute(
                    "UPDATE turns SET id = ?, body = ? WHERE rowid = ?",
                    (new_id, encode(turn), rowid),
                )
                renamed += 1
        # Dense seqs again, order kept (negated first, so no step collides).
        order = conn.execute(
            "SELECT rowid FROM turns WHERE session_id = ? ORDER BY seq", (session_id,)
        ).fetchall()
        conn.execute("UPDATE turns SET seq = -1 - seq WHERE session_id = ?", (session_id,))
        conn.executemany(
            "UPDATE turns SET seq = ? WHERE rowid = ?", [(i, r[0]) for i, r in enumerate(order)]
        )
    if sessions:
        warnings.warn(
            f"SQLite schema v3: turn ids are unique per session now; in {len(sessions)}"
            f" session(s) {removed} identical duplicate turn(s) were removed and"
            f" {renamed} turn(s) reusing an id with other content were renamed"
            " <id>.dup<position>",
            MigrationWarning,
            stacklevel=2,
        )


def _renamed(turn_id: str, seq: int, used: set[str]) -> str:
    suffix = f".dup{seq}"
    base = turn_id[: ID_MAX_LENGTH - len(suffix) - 12] + suffix
    candidate, n = base, 0
    while candidate in used:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


# v3: turn ids unique per session (existing duplicates merged first), and the
# highest rev of any deleted session, so a re-created id continues past it.
_V3: Final[tuple[Migration, ...]] = (
    _merge_duplicate_turns,
    """
CREATE UNIQUE INDEX turns_by_id ON turns (session_id, id);
CREATE TABLE rev_floor (rev INTEGER NOT NULL);
INSERT INTO rev_floor (rev) VALUES (0);
""",
)

# v4: what list_meta derives from a session's children, kept in its row. The
# counts of turns, user turns, runs and artifacts, and the seq of the first
# user turn, were four correlated COUNTs and an ordered lookup per listed
# session; they are computed once here, then kept by triggers in the
# transaction of every statement that inserts, deletes or re-keys a child row,
# whatever code path issues it. (No statement may use REPLACE on these tables:
# its deletes fire no trigger while recursive_triggers is off.)
_V4: Final = """
ALTER TABLE sessions ADD COLUMN turn_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN user_turn_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN run_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN artifact_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN first_user_seq INTEGER;
UPDATE sessions SET
    turn_count = (SELECT COUNT(*) FROM turns t WHERE t.session_id = sessions.id),
    user_turn_count = (SELECT COUNT(*) FROM turns t
        WHERE t.session_id = sessions.id AND t.role = 'user'),
    run_count = (SELECT COUNT(*) FROM runs r WHERE r.session_id = sessions.id),
    artifact_count = (SELECT COUNT(*) FROM artifacts a WHERE a.session_id = sessions.id),
    first_user_seq = (SELECT MIN(t.seq) FROM turns t
        WHERE t.session_id = sessions.id AND t.role = 'user');
CREATE TRIGGER turns_counted AFTER INSERT ON turns BEGIN
    UPDATE sessions SET turn_count = turn_count + 1,
        user_turn_count = user_turn_count + (NEW.role = 'user'),
        first_user_seq = CASE WHEN NEW.role = 'user'
            AND (first_user_seq IS NULL OR NEW.seq < first_user_seq)
            THEN NEW.seq ELSE first_user_seq END
    WHERE id = NEW.session_id;
END;
CREATE TRIGGER turns_uncounted AFTER DELETE ON turns BEGIN
    UPDATE sessions SET turn_count = turn_count - 1,
        user_turn_count = user_turn_count - (OLD.role = 'user'),
        first_user_seq = CASE WHEN first_user_seq = OLD.seq
            THEN (SELECT MIN(t.seq) FROM turns t
                WHERE t.session_id = OLD.session_id AND t.role = 'user')
            ELSE first_user_seq END
    WHERE id = OLD.session_id;
END;
CREATE TRIGGER turns_rekeyed AFTER UPDATE OF session_id, seq, role ON turns BEGIN
    UPDATE sessions SET turn_count = turn_count - 1,
        user_turn_count = user_turn_count - (OLD.role = 'user'),
        first_user_seq = (SELECT MIN(t.seq) FROM turns t
            WHERE t.session_id = OLD.session_id AND t.role = 'user')
    WHERE id = OLD.session_id;
    UPDATE sessions SET turn_count = turn_count + 1,
        user_turn_count = user_turn_count + (NEW.role = 'user'),
        first_user_seq = (SELECT MIN(t.seq) FROM turns t
            WHERE t.session_id = NEW.session_id AND t.role = 'user')
    WHERE id = NEW.session_id;
END;
CREATE TRIGGER runs_counted AFTER INSERT ON runs BEGIN
    UPDATE sessions SET run_count = run_count + 1 WHERE id = NEW.session_id;
END;
CREATE TRIGGER runs_uncounted AFTER DELETE ON runs BEGIN
    UPDATE sessions SET run_count = run_count - 1 WHERE id = OLD.session_id;
END;
CREATE TRIGGER runs_rekeyed AFTER UPDATE OF session_id ON runs BEGIN
    UPDATE sessions SET run_count = run_count - 1 WHERE id = OLD.session_id;
    UPDATE sessions SET run_count = run_count + 1 WHERE id = NEW.session_id;
END;
CREATE TRIGGER artifacts_counted AFTER INSERT ON artifacts BEGIN
    UPDATE sessions SET artifact_count = artifact_count + 1 WHERE id = NEW.session_id;
END;
CREATE TRIGGER artifacts_uncounted AFTER DELETE ON artifacts BEGIN
    UPDATE sessions SET artifact_count = artifact_count - 1 WHERE id = OLD.session_id;
END;
CREATE TRIGGER artifacts_rekeyed AFTER UPDATE OF session_id ON artifacts BEGIN
    UPDATE sessions SET artifact_count = artifact_count - 1 WHERE id = OLD.session_id;
    UPDATE sessions SET artifact_count = artifact_count + 1 WHERE id = NEW.session_id;
END;
"""

# v5: no (session_id, role, seq) index. Only the triggers' first-user-turn
# lookups read it, and each append paid for its entry. When the first user turn
# is deleted, the next one is found by a range scan of (session_id, seq) past
# it (no user turn precedes it); a re-keyed row, which no store method issues,
# rescans its session's turns from the lowest seq to the first user one.
_V5: Final = """
DROP INDEX turns_by_role;
DROP TRIGGER turns_uncounted;
CREATE TRIGGER turns_uncounted AFTER DELETE ON turns BEGIN
    UPDATE sessions SET turn_count = turn_count - 1,
        user_turn_count = user_turn_count - (OLD.role = 'user'),
        first_user_seq = CASE WHEN first_user_seq = OLD.seq
            THEN (SELECT MIN(t.seq) FROM turns t
                WHERE t.session_id = OLD.session_id AND t.seq > OLD.seq AND t.role = 'user')
            ELSE first_user_seq END
    WHERE id = OLD.session_id;
END;
"""

# v6: the session fields a document holds that this version does not know
# (``SessionData.extra_fields``), as a JSON object; NULL when there are none.
_V6: Final = """
ALTER TABLE sessions ADD COLUMN extra TEXT;
"""


def _turn_text(body: str) -> str:
    """SQL: the searchable text of the turn whose JSON is ``body`` (its text blocks and the
    tool names it holds, as ``turn_search_text``); empty for a body that is not JSON."""
    doc = f"CAST({body} AS TEXT)"
    return (
        "coalesce((SELECT group_concat(json_extract(b.value, CASE json_extract(b.value, '$.type')"
        " WHEN 'text' THEN '$.text' ELSE '$.name' END), ' ')"
        f" FROM json_each(CASE WHEN json_valid({doc}) THEN {doc} ELSE '{{}}' END, '$.content') b"
        " WHERE json_extract(b.value, '$.type') IN ('text', 'tool_call', 'tool_result')), '')"
    )


def _session_text(id_: str, metadata: str) -> str:
    """SQL: the searchable text of a session's header: its id and its string ``title``."""
    return (
        f"{id_} || ' ' || coalesce(CASE WHEN json_valid({metadata})"
        f" AND json_type({metadata}, '$.title') = 'text'"
        f" THEN json_extract({metadata}, '$.title') END, '')"
    )


# v7: full-text search (FTS5). One document per turn (rowid = the turn's rowid)
# and one per session header (rowid = minus the session's rowid), each holding its
# session id; triggers keep the index exact in the transaction of every statement
# that inserts, deletes or rewrites a turn or a header, whatever code path issues
# it, and the existing rows are indexed here. Plus an index for the newest-created
# order of search_meta.
_V7: Final = f"""
CREATE VIRTUAL TABLE search USING fts5(
    session_id UNINDEXED, text, tokenize = 'unicode61 remove_diacritics 0'
);
INSERT INTO search (rowid, session_id, text)
    SELECT rowid, session_id, {_turn_text("body")} FROM turns;
INSERT INTO search (rowid, session_id, text)
    SELECT -rowid, id, {_session_text("id", "metadata")} FROM sessions;
CREATE TRIGGER turns_indexed AFTER INSERT ON turns BEGIN
    INSERT INTO search (rowid, session_id, text)
        VALUES (NEW.rowid, NEW.session_id, {_turn_text("NEW.body")});
END;
CREATE TRIGGER turns_unindexed AFTER DELETE ON turns BEGIN
    DELETE FROM search WHERE rowid = OLD.rowid;
END;
CREATE TRIGGER turns_reindexed AFTER UPDATE OF session_id, body ON turns BEGIN
    DELETE FROM search WHERE rowid = OLD.rowid;
    INSERT INTO search (rowid, session_id, text)
        VALUES (NEW.rowid, NEW.session_id, {_turn_text("NEW.body")});
END;
CREATE TRIGGER sessions_indexed AFTER INSERT ON sessions BEGIN
    INSERT INTO search (rowid, session_id, text)
        VALUES (-NEW.rowid, NEW.id, {_session_text("NEW.id", "NEW.metadata")});
END;
CREATE TRIGGER sessions_unindexed AFTER DELETE ON sessions BEGIN
    DELETE FROM search WHERE rowid = -OLD.rowid;
END;
CREATE TRIGGER sessions_reindexed AFTER UPDATE OF id, metadata ON sessions
    WHEN {_session_text("OLD.id", "OLD.metadata")} IS NOT {_session_text("NEW.id", "NEW.metadata")}
BEGIN
    DELETE FROM search WHERE rowid = -OLD.rowid;
    INSERT INTO search (rowid, session_id, text)
        VALUES (-NEW.rowid, NEW.id, {_session_text("NEW.id", "NEW.metadata")});
END;
CREATE INDEX sessions_by_created ON sessions (created_at DESC, id);
"""

# v8: turns are indexed for search when a search runs, not when they are written.
# Tokenizing a turn costs an append 60-100 us of CPU (5-8x the rest of its INSERT);
# the insert trigger now only queues the turn's rowid in search_pending, and
# search_meta indexes the queue (index_pending since v10) in its own transaction before it
# reads. The index plus the queue always cover exactly the stored turns: a deleted
# turn leaves both, a rewritten one leaves the index and is queued again.
_V8: Final = """
CREATE TABLE search_pending (turn INTEGER PRIMARY KEY);
DROP TRIGGER turns_indexed;
CREATE TRIGGER turns_indexed AFTER INSERT ON turns BEGIN
    INSERT INTO search_pending (turn) VALUES (NEW.rowid);
END;
DROP TRIGGER turns_unindexed;
CREATE TRIGGER turns_unindexed AFTER DELETE ON turns BEGIN
    DELETE FROM search WHERE rowid = OLD.rowid;
    DELETE FROM search_pending WHERE turn = OLD.rowid;
END;
DROP TRIGGER turns_reindexed;
CREATE TRIGGER turns_reindexed AFTER UPDATE OF session_id, body ON turns BEGIN
    DELETE FROM search WHERE rowid = OLD.rowid;
    INSERT OR IGNORE INTO search_pending (turn) VALUES (NEW.rowid);
END;
"""

# v9: a turn row's body leaves out the turn's id and role, which its columns hold: the
# body is ``{"content":…}``, the rest of the turn's JSON, and reads put the two back in
# front. Rows written before stay whole (a body starting with ``{"id":``) and are read
# as they are, so nothing is rewritten; the version only keeps older libraries, which
# would read such a body as a turn without an id, from opening the file.
_V9: Final = ""


def _queue(key: str) -> str:
    """SQL: queue ``key`` for the index once (not ``OR IGNORE``: inside a trigger an
    upsert's own conflict clause would override it)."""
    return (
        f"INSERT INTO search_pending (turn) SELECT {key}"
        f" WHERE NOT EXISTS (SELECT 1 FROM search_pending WHERE turn = {key});"
    )


# v10: one search rule for every store. The index holds the words the model computes
# (``index_words``: NFKC, case folded, split and cut in Python), joined by spaces, so
# no SQLite tokenizer decides what a word is: ``ascii`` only splits them at the spaces
# (every non-ASCII character is part of a token; ASCII words are already lower case).
# Headers are queued too (rowid = minus the session's rowid) and indexed with the
# turns; every stored turn and header is queued here, so its words are re-derived.
_V10: Final = f"""
DROP TRIGGER turns_unindexed;
DROP TRIGGER turns_reindexed;
DROP TRIGGER sessions_indexed;
DROP TRIGGER sessions_unindexed;
DROP TRIGGER sessions_reindexed;
DROP TABLE search;
CREATE VIRTUAL TABLE search USING fts5(session_id UNINDEXED, words, tokenize = 'ascii');
CREATE TRIGGER turns_unindexed AFTER DELETE ON turns BEGIN
    DELETE FROM search WHERE rowid = OLD.rowid;
    DELETE FROM search_pending WHERE turn = OLD.rowid;
END;
CREATE TRIGGER turns_reindexed AFTER UPDATE OF session_id, body ON turns BEGIN
    DELETE FROM search WHERE rowid = OLD.rowid;
    {_queue("NEW.rowid")}
END;
CREATE TRIGGER sessions_indexed AFTER INSERT ON sessions BEGIN
    {_queue("-NEW.rowid")}
END;
CREATE TRIGGER sessions_unindexed AFTER DELETE ON sessions BEGIN
    DELETE FROM search WHERE rowid = -OLD.rowid;
    DELETE FROM search_pending WHERE turn = -OLD.rowid;
END;
CREATE TRIGGER sessions_reindexed AFTER UPDATE OF id, metadata ON sessions
    WHEN {_session_text("OLD.id", "OLD.metadata")} IS NOT {_session_text("NEW.id", "NEW.metadata")}
BEGIN
    DELETE FROM search WHERE rowid = -OLD.rowid;
    {_queue("-NEW.rowid")}
END;
INSERT OR IGNORE INTO search_pending (turn) SELECT rowid FROM turns;
INSERT OR IGNORE INTO search_pending (turn) SELECT -rowid FROM sessions;
"""


def _stale_words(key: str, session: str) -> str:
    """SQL: mark ``session`` stale once when the document ``key`` is indexed (its words are
    in ``session_words``); to run before the document is deleted."""
    return (
        f"INSERT INTO search_stale (session_id) SELECT {session}"
        f" WHERE EXISTS (SELECT 1 FROM search WHERE rowid = {key})"
        f" AND NOT EXISTS (SELECT 1 FROM search_stale WHERE session_id = {session});"
    )


# v11: a search reads the words of each session, not of each turn, so a word every
# session holds costs a row per session rather than one per turn. ``session_words`` holds
# each word of a session's indexed documents (its header and turns) once; indexing a
# document adds its words. A document deleted or replaced after it was indexed marks its
# session stale (``search_stale``), and indexing rebuilds a stale session's words from
# its documents in ``search``, which keeps them. Every session with an indexed document
# starts stale here, so its words are derived by the next step or search.
_V11: Final = f"""
CREATE TABLE session_words (
    word TEXT NOT NULL,
    session_id TEXT NOT NULL,
    PRIMARY KEY (word, session_id)
) WITHOUT ROWID;
CREATE INDEX session_words_of ON session_words (session_id);
CREATE TABLE search_stale (session_id TEXT PRIMARY KEY) WITHOUT ROWID;
DROP TRIGGER turns_unindexed;
DROP TRIGGER turns_reindexed;
DROP TRIGGER sessions_unindexed;
DROP TRIGGER sessions_reindexed;
CREATE TRIGGER turns_unindexed AFTER DELETE ON turns BEGIN
    {_stale_words("OLD.rowid", "OLD.session_id")}
    DELETE FROM search WHERE rowid = OLD.rowid;
    DELETE FROM search_pending WHERE turn = OLD.rowid;
END;
CREATE TRIGGER turns_reindexed AFTER UPDATE OF session_id, body ON turns BEGIN
    {_stale_words("OLD.rowid", "OLD.session_id")}
    DELETE FROM search WHERE rowid = OLD.rowid;
    {_queue("NEW.rowid")}
END;
CREATE TRIGGER sessions_unindexed AFTER DELETE ON sessions BEGIN
    {_stale_words("-OLD.rowid", "OLD.id")}
    DELETE FROM search WHERE rowid = -OLD.rowid;
    DELETE FROM search_pending WHERE turn = -OLD.rowid;
END;
CREATE TRIGGER sessions_reindexed AFTER UPDATE OF id, metadata ON sessions
    WHEN {_session_text("OLD.id", "OLD.metadata")} IS NOT {_session_text("NEW.id", "NEW.metadata")}
BEGIN
    {_stale_words("-OLD.rowid", "OLD.id")}
    DELETE FROM search WHERE rowid = -OLD.rowid;
    {_queue("-NEW.rowid")}
END;
INSERT INTO search_stale (session_id) SELECT DISTINCT session_id FROM search;
"""


# v12: forks share their source's turns (``..sql._forks``). A fork's row here names the
# session it shares from and how many of that session's visible turns it sees; its own
# turns continue at ``seq = bound``. Its counts (turn_count...) count what it sees.
_V12: Final = """
CREATE TABLE forks (
    session_id TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    parent_id TEXT NOT NULL,
    bound INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX forks_of ON forks (parent_id, session_id);
"""


# v13: the ``command`` rows of each session, newest first, without reading the others: the
# model's view (``load_model_view``) starts from the latest compaction marker among them.
_V13: Final = """
CREATE INDEX turns_commands ON turns (session_id, seq) WHERE role = 'command';
"""


def _may_have_words(body: str) -> str:
    """SQL: whether the turn row ``body`` may hold search words: its JSON spells the type of
    a text or tool block, or holds an escape that could spell one. A row without any (a
    turn of native data, images or reasoning only) has no words, so it is never queued."""
    return (
        "("
        + " OR ".join(
            f"instr(CAST({body} AS BLOB), CAST('{marker}' AS BLOB)) > 0"
            for marker in ('"text"', '"tool_call"', '"tool_result"', "\\u")
        )
        + ")"
    )


# v14: only a turn that may hold words is queued (``_may_have_words``): indexing the others
# cost every append a queue row and the indexer a step for no words at all. Their queue
# rows go; the index, and so every search, is the same (such a row indexes no words).
_V14: Final = f"""
DROP TRIGGER turns_indexed;
CREATE TRIGGER turns_indexed AFTER INSERT ON turns WHEN {_may_have_words("NEW.body")} BEGIN
    INSERT INTO search_pending (turn) VALUES (NEW.rowid);
END;
DROP TRIGGER turns_reindexed;
CREATE TRIGGER turns_reindexed AFTER UPDATE OF session_id, body ON turns BEGIN
    {_stale_words("OLD.rowid", "OLD.session_id")}
    DELETE FROM search WHERE rowid = OLD.rowid;
    INSERT INTO search_pending (turn) SELECT NEW.rowid WHERE {_may_have_words("NEW.body")}
        AND NOT EXISTS (SELECT 1 FROM search_pending WHERE turn = NEW.rowid);
END;
DELETE FROM search_pending WHERE turn > 0
    AND turn IN (SELECT rowid FROM turns WHERE NOT {_may_have_words("body")});
"""


_RUN_IN_BODY: Final = (
    "CASE WHEN instr(body, '\"runId\"') > 0 AND json_valid(CAST(body AS TEXT))"
    " THEN json_extract(CAST(body AS TEXT), '$.runId') END"
)
"""SQL: the ``runId`` of a turn row's JSON (NULL when it does not spell one or does not
parse): what v15 indexed, and what v16 keeps in the ``run_id`` column."""

# v15: the index of each turn's run (a fork leaving turns out finds the runs only they belong
# to without reading them), of each session's user turns (it counts those it leaves out from
# the index) and of each fork's source (``list_forks`` reads no other header); a row whose
# JSON does not parse indexes no run or source (``_RUN_IN_BODY``, ``FORKED_FROM``).
_V15: Final = f"""
CREATE INDEX turns_runs ON turns (session_id, ({_RUN_IN_BODY}), seq);
CREATE INDEX turns_user ON turns (session_id, seq) WHERE role = 'user';
CREATE INDEX sessions_forked_from ON sessions ({FORKED_FROM["sqlite"][0]})
    WHERE {FORKED_FROM["sqlite"][1]};
"""


# v16: a turn row's run id is a column (``RUN_OF``) its writes fill from the turn they
# encoded, indexed where it is set: v15's index parsed every inserted body twice (about a
# third of an insert's cost). The column takes each stored row's ``_RUN_IN_BODY`` once here
# (no type: the values are kept as the JSON held them); every search by run is the same.
_V16: Final = f"""
ALTER TABLE turns ADD COLUMN run_id;
UPDATE turns SET run_id = {_RUN_IN_BODY} WHERE instr(body, '"runId"') > 0;
DROP INDEX turns_runs;
CREATE INDEX turns_runs ON turns (session_id, run_id, seq) WHERE run_id IS NOT NULL;
"""


def _rebuild_stale(conn: sqlite3.Connection, limit: int) -> int:
    """Rebuild the words of the stale sessions (at most ``limit``, all when negative) from
    their indexed documents; the number rebuilt."""
    stale = [r[0] for r in conn.execute("SELECT session_id FROM search_stale LIMIT ?", (limit,))]
    for session_id in stale:
        words: set[str] = set()
        turns, params = ranges_select(
            ranges_of(conn, SQLITE, session_id), "seq, rowid AS key", SQLITE
        )
        for (text,) in conn.execute(
            "SELECT f.words FROM sessions s JOIN search f ON f.rowid = -s.rowid WHERE s.id = ?"
            f" UNION ALL SELECT f.words FROM ({turns}) t JOIN search f ON f.rowid = t.key",
            (session_id, *params),
        ):
            words.update(text.split())
        conn.execute("DELETE FROM session_words WHERE session_id = ?", (session_id,))
        conn.executemany(
            "INSERT INTO session_words (word, session_id) VALUES (?, ?)",
            [(w, session_id) for w in sorted(words)],
        )
        conn.execute("DELETE FROM search_stale WHERE session_id = ?", (session_id,))
    return len(stale)


def index_pending(conn: sqlite3.Connection, limit: int = -1) -> int:
    """Index the queued turns and headers and rebuild the stale sessions' words (at most
    ``limit`` of each, all when negative), oldest first; the number done. Runs in the
    caller's write transaction.

    The words are the model's (``index_words`` of ``stored_turn_text`` or
    ``stored_header_text``): a row that no longer decodes gives the words it can.
    """
    rebuilt = _rebuild_stale(conn, limit)
    rows = conn.execute(
        "SELECT p.turn, t.session_id, t.seq, t.body, s.id, s.metadata FROM search_pending p"
        " LEFT JOIN turns t ON p.turn > 0 AND t.rowid = p.turn"
        " LEFT JOIN sessions s ON p.turn < 0 AND s.rowid = -p.turn"
        " ORDER BY p.turn LIMIT ?",
        (limit,),
    ).fetchall()
    documents = []
    readers: dict[tuple[str, int], list[str]] = {}  # a turn's words go to the forks seeing it
    forked: dict[str, bool] = {}
    for key, turn_session, seq, body, session_id, metadata in rows:
        if turn_session is not None:
            text = stored_turn_text(body)
            documents.append((key, turn_session, " ".join(index_words([text]))))
            if turn_session not in forked:
                forked[turn_session] = has_forks(conn, SQLITE, turn_session)
            found = heirs(conn, SQLITE, turn_session, seq) if forked[turn_session] else []
            readers[turn_session, key] = [turn_session, *found]
        elif session_id is not None:
            text = stored_header_text(session_id, metadata)
            documents.append((key, session_id, " ".join(index_words([text]))))
            readers[session_id, key] = [session_id]
    conn.executemany("INSERT INTO search (rowid, session_id, words) VALUES (?, ?, ?)", documents)
    conn.executemany(
        "INSERT OR IGNORE INTO session_words (word, session_id) VALUES (?, ?)",
        sorted(
            {
                (w, reader)
                for key, sid, words in documents
                for reader in readers[sid, key]
                for w in words.split()
            }
        ),
    )
    conn.executemany("DELETE FROM search_pending WHERE turn = ?", [(r[0],) for r in rows])
    return rebuilt + len(rows)


_CHUNK: Final = 16
"""Rows (and stale sessions) one ``index_pending`` call of :func:`index_step` does."""


def index_step(conn: sqlite3.Connection, seconds: float = INDEX_STEP_SECONDS) -> bool:
    """Index queued rows for about ``seconds`` at most (one step of the background indexer,
    in the caller's write transaction); whether rows are left."""
    deadline = time.monotonic() + seconds
    while index_pending(conn, _CHUNK) >= _CHUNK:
        if time.monotonic() >= deadline:
            return True
    return False


MIGRATIONS: Final[tuple[Migration | tuple[Migration, ...], ...]] = (
    _V1,
    _V2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _V8,
    _V9,
    _V10,
    _V11,
    _V12,
    _V13,
    _V14,
    _V15,
    _V16,
)
"""``MIGRATIONS[i]`` takes a database from version ``i`` to ``i + 1``: SQL scripts and
Python steps (functions of the connection), run in order in one transaction."""

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The ``user_version`` this library writes and reads."""


_REV_FLOOR_VERSION: Final = 3
"""The version that started recording the revs of deleted sessions (``rev_floor``)."""


def _lift_rev_floor(conn: sqlite3.Connection) -> None:
    """Put the floor past any rev a session deleted before v3 can have reached.

    Those revs were not recorded; each was at most the number of writes to
    its session, far under the clock in milliseconds, so a session re-created
    under an old id still gets a higher rev than any copy of it.
    """
    conn.execute("UPDATE rev_floor SET rev = MAX(rev, ?)", (time.time_ns() // 1_000_000,))


def _statements(script: str) -> list[str]:
    """The statements of ``script``: split at each ``;`` that ends one (not inside a trigger)."""
    statements: list[str] = []
    pending = ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\n;"):
                statements.append(pending.strip())
            pending = ""
    if pending.strip(" \t\n;"):
        statements.append(pending)  # unterminated: executed so that SQLite names the error
    return statements


def _run_step(conn: sqlite3.Connection, step: Migration | Sequence[Migration]) -> None:
    if isinstance(step, str):
        for statement in _statements(step):
            conn.execute(statement)
    elif callable(step):
        step(conn)
    else:
        for part in step:
            _run_step(conn, part)


# The tables every zidane_actors schema version has had since v1.
_OUR_TABLES: Final = frozenset(
    {"sessions", "turns", "runs", "artifacts", "send_requests", "schedules", "schedule_fires"}
)


def refuse_foreign(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a database another program wrote, by reading it only (the file is not touched).

    Foreign: tables at ``user_version`` 0, or a ``user_version`` this library
    uses without the tables its schema has.
    """
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            " ORDER BY name"
        )
    ]
    if version == 0 and tables:
        listed = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
        raise StoreError(
            f"SQLite database {path} holds tables ({listed}) but no zidane_actors schema "
            "(user_version 0): it belongs to another program, so it is not migrated; "
            "open a new file instead"
        )
    missing = sorted(_OUR_TABLES - set(tables))
    if 0 < version <= len(MIGRATIONS) and missing:
        raise StoreError(
            f"SQLite database {path} has user_version {version} but not the zidane_actors "
            f"tables ({', '.join(missing)} missing): it belongs to another program, so it "
            "is not opened; open a new file instead"
        )


def migrate(
    conn: sqlite3.Connection,
    path: str,
    migrations: Sequence[Migration | Sequence[Migration]] = MIGRATIONS,
) -> int:
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
            refuse_foreign(conn, path)
        start = version
        while version < target:
            _run_step(conn, migrations[version])
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")
        if migrations is MIGRATIONS and 0 < start < _REV_FLOOR_VERSION:
            _lift_rev_floor(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return version
