"""Tables of the PostgreSQL store and their migrations.

Each schema (PostgreSQL namespace) holds one store. Migrations run in one
transaction under an advisory lock keyed on the schema name, so hosts that
start at the same time apply them once, one after the other.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Final

import psycopg
from psycopg import sql

from ...errors import StoreError
from ...model import (
    COMPACTION_KEY,
    index_words,
    stored_header_text,
    stored_turn_text,
)
from .._indexer import INDEX_STEP_SECONDS
from ..sql import POSTGRES
from ..sql._forks import FORKED_FROM, RANGES, RUN_KEY_ROWS, RUN_OF, has_forks, heirs

__all__ = ["MARKERS", "SCHEMA_VERSION", "WORDS_SQL", "index_pending", "index_step", "migrate"]

_V1: Final = """
CREATE SEQUENCE revs;

CREATE TABLE sessions (
    id text PRIMARY KEY,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    status text NOT NULL CHECK (status IN ('error', 'running', 'completed', 'idle')),
    agent_id text,
    project_root text,
    metadata text NOT NULL,
    run_owner jsonb,
    run_epoch bigint NOT NULL DEFAULT 0,
    rev bigint NOT NULL DEFAULT nextval('revs'),
    turn_count bigint NOT NULL DEFAULT 0,
    user_turn_count bigint NOT NULL DEFAULT 0
);
CREATE INDEX sessions_recent ON sessions (updated_at DESC, id COLLATE "C");

CREATE TABLE turns (
    session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    id text NOT NULL,
    role text NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (session_id, seq),
    UNIQUE (session_id, id)
);
CREATE INDEX turns_user ON turns (session_id, seq) WHERE role = 'user';

CREATE TABLE runs (
    session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id text NOT NULL,
    seq bigint NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (session_id, id)
);
CREATE INDEX runs_order ON runs (session_id, seq);

CREATE TABLE artifacts (
    session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id text NOT NULL,
    kind text NOT NULL,
    uri text NOT NULL,
    project_root text,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    body text NOT NULL,
    PRIMARY KEY (session_id, id),
    UNIQUE (session_id, kind, uri)
);
CREATE INDEX artifacts_recent ON artifacts (updated_at DESC, id COLLATE "C");

CREATE TABLE send_requests (
    session_id text NOT NULL,
    request_id text NOT NULL,
    fingerprint text NOT NULL,
    created_at bigint NOT NULL,
    result text,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (session_id, request_id)
);

CREATE TABLE schedules (
    id text PRIMARY KEY,
    enabled boolean NOT NULL,
    next_fire_at bigint,
    created_at bigint NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    body text NOT NULL
);

CREATE TABLE schedule_fires (
    schedule_id text NOT NULL,
    id text NOT NULL,
    fired_at bigint NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    body text NOT NULL,
    PRIMARY KEY (schedule_id, id)
);
CREATE INDEX schedule_fires_recent ON schedule_fires (schedule_id, fired_at DESC, seq DESC);
"""

# v2: the session fields a document holds that this version does not know
# (``SessionData.extra_fields``), as a JSON object; NULL when there are none.
_V2: Final = "ALTER TABLE sessions ADD COLUMN extra text"

# v3: full-text search. Each turn and each session header holds a tsvector of its
# words (the letters-and-digits runs, lower-cased, of a turn's text blocks and tool
# names, of a header's id and string title), kept by BEFORE triggers on every
# statement that writes the row, whatever code path issues it, and found through
# GIN indexes; existing rows are filled here. A row whose JSON the server cannot
# read (a NUL or lone-surrogate escape) gets no words instead of being refused.
_V3: Final = r"""
CREATE FUNCTION search_words(text text) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT array_to_tsvector(array_remove(
        regexp_split_to_array(lower(coalesce(text, '')), '[^[:alnum:]]+'), ''))
$$;

CREATE FUNCTION turn_words(body text) RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN search_words((
        SELECT string_agg(
            CASE b ->> 'type' WHEN 'text' THEN b ->> 'text' ELSE b ->> 'name' END, ' ')
        FROM json_array_elements(CASE json_typeof(body::json -> 'content')
            WHEN 'array' THEN body::json -> 'content' ELSE '[]' END) b
        WHERE b ->> 'type' IN ('text', 'tool_call', 'tool_result')));
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

CREATE FUNCTION header_words(id text, metadata text) RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN search_words(id || ' ' || coalesce(CASE json_typeof(metadata::json -> 'title')
        WHEN 'string' THEN metadata::json ->> 'title' END, ''));
EXCEPTION WHEN others THEN
    RETURN search_words(id);
END
$$;

CREATE FUNCTION turns_set_words() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.words := turn_words(NEW.body);
    RETURN NEW;
END
$$;

CREATE FUNCTION sessions_set_words() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.words := header_words(NEW.id, NEW.metadata);
    RETURN NEW;
END
$$;

ALTER TABLE turns ADD COLUMN words tsvector;
ALTER TABLE sessions ADD COLUMN words tsvector;
UPDATE turns SET words = turn_words(body);
UPDATE sessions SET words = header_words(id, metadata);
CREATE TRIGGER turns_words BEFORE INSERT OR UPDATE OF body ON turns
    FOR EACH ROW EXECUTE FUNCTION turns_set_words();
CREATE TRIGGER sessions_words BEFORE INSERT OR UPDATE OF id, metadata ON sessions
    FOR EACH ROW EXECUTE FUNCTION sessions_set_words();
CREATE INDEX turns_by_words ON turns USING gin (words);
CREATE INDEX sessions_by_words ON sessions USING gin (words);
CREATE INDEX sessions_created ON sessions (created_at DESC, id COLLATE "C");
"""

# v4: a turn's words are computed when a search runs, not when the turn is written.
# The v3 trigger cost every inserted turn 180-240 us of server time (4-5x the rest of
# its INSERT). Now an inserted turn's words stay NULL (found through a partial index),
# a rewritten body sets them back to NULL, and search_meta fills the NULL ones
# (index_pending since v5) in a transaction of its own just before it reads; turn_words answers an
# empty tsvector, never NULL, for a body the server cannot read, so NULL only ever
# means "not yet computed".
_V4: Final = r"""
CREATE OR REPLACE FUNCTION turn_words(body text) RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce(search_words((
        SELECT string_agg(
            CASE b ->> 'type' WHEN 'text' THEN b ->> 'text' ELSE b ->> 'name' END, ' ')
        FROM json_array_elements(CASE json_typeof(body::json -> 'content')
            WHEN 'array' THEN body::json -> 'content' ELSE '[]' END) b
        WHERE b ->> 'type' IN ('text', 'tool_call', 'tool_result'))), ''::tsvector);
EXCEPTION WHEN others THEN
    RETURN ''::tsvector;
END
$$;

CREATE FUNCTION turns_unset_words() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.words := NULL;
    RETURN NEW;
END
$$;

DROP TRIGGER turns_words ON turns;
CREATE TRIGGER turns_words BEFORE UPDATE OF body ON turns
    FOR EACH ROW EXECUTE FUNCTION turns_unset_words();
CREATE INDEX turns_without_words ON turns (session_id, seq) WHERE words IS NULL;
"""

# v5: one search rule for every store. A turn's and a header's words are the model's
# (``index_words``: NFKC, case folded, split and cut in Python), stored as-is with
# array_to_tsvector, so no server regex or lower() decides what a word is. A header's
# words are computed like a turn's now: an insert, or a write changing its id or
# metadata, sets them to NULL and the next search fills them. A tsvector holds at most
# 1 MB of words: the words of a turn or header past that go to more_words, in parts,
# dropped with the row or when its body or header changes. Every stored row's words
# are re-derived (set to NULL here, filled by the next search).
_V5: Final = r"""
DROP TRIGGER sessions_words ON sessions;
DROP FUNCTION sessions_set_words();
DROP FUNCTION header_words(text, text);
DROP FUNCTION turn_words(text);
DROP FUNCTION search_words(text);

CREATE TABLE more_words (
    session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE ON UPDATE CASCADE,
    seq bigint,
    words tsvector NOT NULL,
    FOREIGN KEY (session_id, seq) REFERENCES turns (session_id, seq)
        ON DELETE CASCADE ON UPDATE CASCADE
);
CREATE INDEX more_words_of ON more_words (session_id, seq);
CREATE INDEX more_words_by_words ON more_words USING gin (words);

CREATE OR REPLACE FUNCTION turns_unset_words() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.words := NULL;
    DELETE FROM more_words WHERE session_id = OLD.session_id AND seq = OLD.seq;
    RETURN NEW;
END
$$;

CREATE FUNCTION sessions_unset_words() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.words := NULL;
    ELSIF NEW.id IS DISTINCT FROM OLD.id OR NEW.metadata IS DISTINCT FROM OLD.metadata THEN
        NEW.words := NULL;
        DELETE FROM more_words WHERE session_id = OLD.id AND seq IS NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sessions_words BEFORE INSERT OR UPDATE OF id, metadata ON sessions
    FOR EACH ROW EXECUTE FUNCTION sessions_unset_words();
CREATE INDEX sessions_without_words ON sessions (id) WHERE words IS NULL;
UPDATE turns SET words = NULL;
UPDATE sessions SET words = NULL;
"""

_PART_BYTES: Final = 512 * 1024
"""The most bytes of words one tsvector is given (PostgreSQL's bound is 1 MB)."""


def _parts(words: list[str]) -> list[str]:
    """``words`` as space-joined parts of at most :data:`_PART_BYTES` bytes (one at least)."""
    parts: list[str] = []
    part: list[str] = []
    size = 0
    for word in words:
        length = len(word.encode()) + 1
        if part and size + length > _PART_BYTES:
            parts.append(" ".join(part))
            part, size = [], 0
        part.append(word)
        size += length
    parts.append(" ".join(part))
    return parts


_TSVECTOR: Final = "array_to_tsvector(string_to_array(v.w, ' '))"


WORDS_SQL: Final = """
queued AS (
    INSERT INTO words_pending (session_id, seq)
    SELECT session_id, seq FROM added WHERE position('"text"' IN body) > 0
        OR position('"tool_call"' IN body) > 0 OR position('"tool_result"' IN body) > 0
)"""
"""A ``WITH`` item queueing the rows an ``added`` item inserted (``RETURNING session_id,
seq, body``) that may hold words: a text or tool block (this library writes a block's
type as it is, no escape). The indexer computes their words in the background into
``more_words`` (v10), so neither the write nor a later update of the row pays for them."""


def index_pending(cur: psycopg.Cursor[Any], limit: int | None = None) -> int:
    """Add the words of the turns queued in ``words_pending`` to ``session_words``, and
    fill the words of the turns and headers that have none (at most ``limit`` of each);
    the number done. Run in a transaction of its own.

    The words are the model's (``index_words`` of ``stored_turn_text`` or
    ``stored_header_text``). It never waits for a writer's row locks (a row being
    written right now is left to the next call), so it can neither deadlock with
    writers nor make them wait longer than its own statements. It first rebuilds the
    words of stale sessions (at most ``limit``), counted in its answer.
    """
    rebuilt = _rebuild_stale(cur, limit)
    cur.execute(  # the queued rows: their words go to more_words, their queue rows taken
        "DELETE FROM words_pending q USING (SELECT q.session_id, q.seq, t.body"
        " FROM words_pending q JOIN turns t ON t.session_id = q.session_id AND t.seq = q.seq"
        " LIMIT %s FOR UPDATE OF q SKIP LOCKED FOR NO KEY UPDATE OF t SKIP LOCKED) d"
        " WHERE q.session_id = d.session_id AND q.seq = d.seq"
        " RETURNING d.session_id, d.seq, d.body",
        (limit,),
    )
    queued = [
        (str(sid), int(seq), _parts(index_words([stored_turn_text(body)])))
        for sid, seq, body in cur.fetchall()
    ]
    cur.execute(
        "SELECT session_id, seq, body FROM turns WHERE words IS NULL LIMIT %s"
        " FOR NO KEY UPDATE SKIP LOCKED",
        (limit,),
    )
    turns = [
        (str(sid), int(seq), _parts(index_words([stored_turn_text(body)])))
        for sid, seq, body in cur.fetchall()
    ]
    cur.execute(
        "SELECT id, metadata FROM sessions WHERE words IS NULL LIMIT %s"
        " FOR NO KEY UPDATE SKIP LOCKED",
        (limit,),
    )
    headers = [
        (str(sid), None, _parts(index_words([stored_header_text(sid, metadata)])))
        for sid, metadata in cur.fetchall()
    ]
    if turns:
        cur.execute(
            f"UPDATE turns t SET words = {_TSVECTOR}"
            " FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS v(sid, seq, w)"
            " WHERE t.session_id = v.sid AND t.seq = v.seq",
            [[r[0] for r in turns], [r[1] for r in turns], [r[2][0] for r in turns]],
        )
    if headers:
        cur.execute(
            f"UPDATE sessions s SET words = {_TSVECTOR}"
            " FROM unnest(%s::text[], %s::text[]) AS v(sid, w) WHERE s.id = v.sid",
            [[r[0] for r in headers], [r[2][0] for r in headers]],
        )
    more = [(sid, seq, part) for sid, seq, parts in turns + headers for part in parts[1:]]
    more += [(sid, seq, part) for sid, seq, parts in queued for part in parts if part]
    if more:
        cur.execute(
            f"INSERT INTO more_words (session_id, seq, words) SELECT v.sid, v.seq, {_TSVECTOR}"
            " FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS v(sid, seq, w)",
            [[r[0] for r in more], [r[1] for r in more], [r[2] for r in more]],
        )
    filled = turns + queued
    readers = {(sid, seq): [sid] for sid, seq, _ in filled + headers}
    for sid in {sid for sid, _, _ in filled}:
        if has_forks(cur, POSTGRES, sid):
            for _, seq, _ in (t for t in filled if t[0] == sid):
                readers[sid, seq] += heirs(cur, POSTGRES, sid, seq)
    pairs = sorted(
        {
            (w, reader)
            for sid, seq, parts in filled + headers
            for reader in readers[sid, seq]
            for p in parts
            for w in p.split()
        }
    )
    if pairs:
        cur.execute(
            "INSERT INTO session_words (word, session_id)"
            " SELECT * FROM unnest(%s::text[], %s::text[]) ON CONFLICT DO NOTHING",
            [[p[0] for p in pairs], [p[1] for p in pairs]],
        )
    return rebuilt + len(queued) + len(turns) + len(headers)


# v6: a search reads the words of each session, not of each turn, so a word every
# session holds costs a row per session rather than one per turn (773 ms for such a word
# over 100 000 turns before, reading every matching turn's row). ``session_words`` holds
# each word of a session's header and turns once (``"C"`` order: a prefix is a range);
# filling a row's words adds them. A turn or header whose words were filled and are then
# deleted or replaced marks its session stale (``search_stale``), and the next step
# rebuilds that session's words from its rows' ``words``. The GIN indexes go: nothing
# reads them. Every session with filled words starts stale here.
_V6: Final = r"""
CREATE TABLE session_words (
    word text COLLATE "C" NOT NULL,
    session_id text NOT NULL,
    PRIMARY KEY (word, session_id)
);
CREATE INDEX session_words_of ON session_words (session_id);
CREATE TABLE search_stale (session_id text PRIMARY KEY);

CREATE FUNCTION turns_stale() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO search_stale (session_id) VALUES (OLD.session_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE FUNCTION sessions_stale() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR NEW.words IS NULL THEN
        INSERT INTO search_stale (session_id) VALUES (OLD.id) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER turns_stale AFTER DELETE OR UPDATE OF session_id, body ON turns
    FOR EACH ROW WHEN (OLD.words IS NOT NULL) EXECUTE FUNCTION turns_stale();
CREATE TRIGGER sessions_stale AFTER DELETE OR UPDATE OF id, metadata ON sessions
    FOR EACH ROW WHEN (OLD.words IS NOT NULL) EXECUTE FUNCTION sessions_stale();
DROP INDEX turns_by_words;
DROP INDEX sessions_by_words;
DROP INDEX more_words_by_words;
INSERT INTO search_stale (session_id)
    SELECT session_id FROM turns WHERE words IS NOT NULL
    UNION SELECT id FROM sessions WHERE words IS NOT NULL;
"""


# v7: the ``command`` rows of each session, newest first, without reading the others: the
# model's view (``load_model_view``) starts from the latest compaction marker among them.
_V7: Final = "CREATE INDEX turns_commands ON turns (session_id, seq) WHERE role = 'command'"


# v8: forks share their source's turns (``..sql._forks``). A fork's row here names the
# session it shares from and how many of that session's visible turns it sees; its own
# turns continue at ``seq = bound`` (its ``turn_count`` counts what it sees).
# ``fork_ranges(session)`` answers the row ranges a session sees (the shared rule), for
# reads to join in the statement that reads the turns.
_V8: Final = f"""
CREATE TABLE forks (
    session_id text PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    parent_id text NOT NULL,
    bound bigint NOT NULL
);
CREATE INDEX forks_of ON forks (parent_id, session_id COLLATE "C");
CREATE FUNCTION fork_ranges(text) RETURNS TABLE (session_id text, lo bigint, hi bigint)
LANGUAGE sql STABLE AS $$ {RANGES.replace("?", "$1")} $$;
"""


# v9: the index of each turn's run (a fork leaving turns out finds the runs only they belong
# to without reading them) and of each fork's source (``list_forks`` reads no other header).
# ``json_member(text, path...)``: the member at ``path`` of a JSON text, NULL when the text
# does not parse (a stored row any writer may have broken never fails a write).
_V9: Final = f"""
CREATE FUNCTION json_member(text, VARIADIC text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN $1::jsonb #>> $2;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;
CREATE INDEX turns_runs ON turns (session_id, ({RUN_OF["postgres"][0]}), seq)
    WHERE {RUN_OF["postgres"][1]};
CREATE INDEX sessions_forked_from ON sessions (({FORKED_FROM["postgres"][0]}))
    WHERE {FORKED_FROM["postgres"][1]};
"""


def _seen(table: str) -> str:
    """SQL: the rows of ``table`` (alias ``v``) the stale sessions ``x.sid`` see."""
    return (
        "unnest(%(s)s::text[]) x (sid) CROSS JOIN LATERAL fork_ranges(x.sid) r"
        f" JOIN {table} v ON v.session_id = r.session_id AND v.seq >= r.lo"
        " AND (r.hi IS NULL OR v.seq < r.hi)"
    )


def _rebuild_stale(cur: psycopg.Cursor[Any], limit: int | None) -> int:
    """Rebuild the words of the stale sessions (at most ``limit``) from their rows'
    ``words``; the number rebuilt. A session another step is rebuilding is skipped.

    The marks are taken first: a writer marking a session again meanwhile waits for
    this transaction, then marks it anew, so a turn deleted after the words were read
    is never left in them.
    """
    cur.execute(
        "DELETE FROM search_stale WHERE session_id IN (SELECT session_id FROM search_stale"
        " LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING session_id",
        (limit,),
    )
    stale = sorted(str(r[0]) for r in cur.fetchall())
    # A session's words come from the rows it sees, its forks' shared ones included.
    if stale:
        cur.execute("DELETE FROM session_words WHERE session_id = ANY(%s)", (stale,))
        cur.execute(
            "INSERT INTO session_words (word, session_id)"
            " SELECT DISTINCT w, d.sid FROM ("
            f" SELECT x.sid, v.words FROM {_seen('turns')}"
            " UNION ALL SELECT id, words FROM sessions WHERE id = ANY(%(s)s)"
            f" UNION ALL SELECT x.sid, v.words FROM {_seen('more_words')}"
            " UNION ALL SELECT session_id, words FROM more_words"
            " WHERE session_id = ANY(%(s)s) AND seq IS NULL"
            ") d (sid, words), unnest(tsvector_to_array(d.words)) w"
            " ORDER BY 1, 2 ON CONFLICT DO NOTHING",
            {"s": stale},
        )
    return len(stale)


_CHUNK: Final = 25
"""Turns (and headers) one ``index_pending`` call of :func:`index_step` fills."""


def index_step(cur: psycopg.Cursor[Any], seconds: float = INDEX_STEP_SECONDS) -> bool:
    """Fill words for about ``seconds`` at most (one step of the background indexer, in
    the caller's transaction); whether rows may be left."""
    deadline = time.monotonic() + seconds
    while index_pending(cur, _CHUNK) >= _CHUNK:
        if time.monotonic() >= deadline:
            return True
    return False


# v10: nothing updates a turn's row to fill its words (an update copied the whole row and
# each of its index entries: twice the bytes). A turn is written with empty ``words`` and,
# when it may hold words (``WORDS_SQL``), queued here; the indexer computes them in the
# background into ``more_words`` and ``session_words``, so the write pays for one small
# row, not for its words. A deleted turn leaves the queue.
_V10: Final = """
CREATE TABLE words_pending (
    session_id text NOT NULL,
    seq bigint NOT NULL,
    PRIMARY KEY (session_id, seq),
    FOREIGN KEY (session_id, seq) REFERENCES turns (session_id, seq)
        ON DELETE CASCADE ON UPDATE CASCADE
);
"""


MARKERS: Final = f"role = 'command' AND strpos(body, '\"{COMPACTION_KEY}\"') > 0"
"""The turn rows that may be compaction markers (a ``command`` turn whose metadata spells
:data:`~zidane_actors.model.COMPACTION_KEY`: this library writes a key as it is, no escape),
the condition of ``turns_commands`` since v11; a query naming it reads that index. A row it
holds may still be no marker (the model's ``compaction_of`` decides)."""


# v11: two turn indexes a fraction of the bytes. ``turns_runs`` keys a run's rows by
# ``seq / n`` (``RUN_KEY_ROWS``), so B-tree deduplication stores a key once for up to n rows
# (``seq`` made every key unique: none was deduplicated). ``turns_commands`` holds the rows
# that may be compaction markers (:data:`MARKERS`), not every ``command`` row: a door's own
# records (LangGraph's checkpoints and writes) are most of those.
_V11: Final = f"""
DROP INDEX turns_runs;
CREATE INDEX turns_runs ON turns
    (session_id, ({RUN_OF["postgres"][0]}), (seq / {RUN_KEY_ROWS["postgres"]}))
    WHERE {RUN_OF["postgres"][1]};
DROP INDEX turns_commands;
CREATE INDEX turns_commands ON turns (session_id, seq) WHERE {MARKERS};
"""


_MIGRATIONS: Final = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11)

SCHEMA_VERSION: Final = len(_MIGRATIONS)
"""The schema version this code writes; a newer stored version is refused."""


def _lock_key(schema: str) -> int:
    digest = hashlib.blake2b(f"zidane_actors:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def migrate(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int:
    """Create or upgrade ``schema`` to :data:`SCHEMA_VERSION`; answer the version found.

    ``conn`` must be in autocommit mode with ``search_path`` set to ``schema``.
    """
    with conn.transaction(), conn.cursor() as cur:
        # Safe without a flush: the migration is one transaction and reruns if lost,
        # and the store's first durable commit flushes the WAL before it.
        cur.execute("SET LOCAL synchronous_commit = off")
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(schema),))
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        cur.execute(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur.execute("SELECT coalesce(max(version), 0) FROM schema_version")
        row = cur.fetchone()
        found = int(str(row[0])) if row is not None else 0
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"PostgreSQL schema {schema!r} is at version {found}, newer than the"
                f" version {SCHEMA_VERSION} this zidane_actors knows: upgrade zidane_actors"
            )
        for version in range(found + 1, SCHEMA_VERSION + 1):
            cur.execute(_MIGRATIONS[version - 1])
            cur.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
    return found
