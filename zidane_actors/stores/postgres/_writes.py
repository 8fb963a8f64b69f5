"""The PostgreSQL store's writes, each a synchronous step on one transaction's cursor."""

from __future__ import annotations

import builtins
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import outcome
import psycopg
from psycopg import errors as pg_errors
from psycopg.abc import Params

from ... import model
from ...errors import (
    SessionNotFoundError,
)
from ...model import (
    AppendTurnsOptions,
    RunOwner,
    SessionArtifact,
    SessionData,
    SessionRun,
    SessionTurn,
    check_artifact_id_free,
    current_run_owner,
    extra_json,
    fresh_turns,
    merge_artifact,
    merge_session_metadata,
    normalize_artifact,
    patch_metadata,
    preview,
    select_artifact_evictions,
    snapshot_status,
    upsert_runs,
    validate_id,
)
from ...model._checked import CheckedTurns
from .._protocol import WRITE_METHODS, Revision, StoreWrite, stale, write_step
from .._validate import (
    check_artifact_ids,
    check_ids,
    checked,
    checked_append,
    checked_meta_patch,
    checked_status,
    now_ms,
)
from ..sql import POSTGRES, settle_send_request
from ..sql._forks import share_less, unshare
from ._rows import (
    _SQL,
    BigintArray,
    TextArray,
    _checked_data,
    _Connection,
    _Cursor,
    _decode,
    _json,
    _SlowPath,
    visible_turns,
)
from ._schema import WORDS_SQL

__all__ = []

# ---------------------------------------------------------------------------
# Row access (synchronous, inside one transaction on the given cursor)


_NO_KEY: Final = "FOR NO KEY UPDATE"
"""How a write locks its session's row: it never changes the id, so the key-share locks of
rows referring to it (the indexer's ``more_words``) neither wait for it nor hold it up."""


def _lock_header(cur: _Cursor, session_id: str) -> tuple[Any, ...] | None:
    cur.execute(
        "SELECT status, run_owner::text, updated_at, metadata"
        f" FROM sessions WHERE id = %s {_NO_KEY}",
        (session_id,),
    )
    return cur.fetchone()


def _locked_rev(cur: _Cursor, session_id: str, lock: str = _NO_KEY) -> int:
    """The session's ``rev`` with its row locked for this transaction; ``0`` when absent."""
    cur.execute(f"SELECT rev FROM sessions WHERE id = %s {lock}", (session_id,))
    row = cur.fetchone()
    return 0 if row is None else int(row[0])


def _versioned(
    cur: _Cursor, session_id: str, expected_rev: int | None, write: Callable[[], object]
) -> Revision:
    """``write()`` if the session is at ``expected_rev`` (when given); its revision.

    The row lock holds the rev until commit. A session expected absent
    (``0``) takes a transaction-scoped advisory lock on its id first, so
    two hosts creating one id at once are serialized and the second fails.
    """
    validate_id(session_id)
    before = _locked_rev(cur, session_id)
    if before == 0 and expected_rev == 0:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (session_id,))
        before = _locked_rev(cur, session_id)
    if expected_rev is not None and before != expected_rev:
        raise stale(session_id, expected_rev, before)
    write()
    cur.execute(_SQL.rev, (session_id,))
    row = cur.fetchone()
    return Revision(before, 0 if row is None else int(row[0]))


def _owner(text: str | None, session_id: str) -> RunOwner | None:
    if text is None:
        return None
    owner: RunOwner = _decode(text, RunOwner, "sessions", f"id={preview(session_id)} run_owner")
    return owner


def _metadata(text: str, session_id: str) -> dict[str, Any]:
    value: dict[str, Any] = _decode(
        text, dict[str, Any], "sessions", f"id={preview(session_id)} metadata"
    )
    return value


def _insert_turns(
    cur: _Cursor, session_id: str, start: int, turns: Sequence[SessionTurn], bodies: Sequence[str]
) -> None:
    """Insert ``turns`` (encoded as ``bodies``) at seq ``start``…."""
    if not turns:
        return
    cur.execute(
        "WITH added AS (INSERT INTO turns (session_id, seq, id, role, body, words)"
        f" SELECT %s, s, i, r, b, {_WORDS} FROM unnest(%b::bigint[], %b::text[], %b::text[],"
        " %b::text[]) AS u(s, i, r, b) RETURNING session_id, seq, body)," + WORDS_SQL + " SELECT",
        (
            session_id,
            list(range(start, start + len(turns))),
            [t.id for t in turns],
            [t.role for t in turns],
            bodies,
        ),
    )


_UPSERT_RUNS: Final = """
INSERT INTO runs (session_id, id, seq, body)
SELECT u.s, u.i, (SELECT coalesce(max(seq), -1) FROM runs r WHERE r.session_id = u.s) + u.n, u.b
FROM unnest(%(run_sids)b::text[], %(run_ids)b::text[], %(run_bodies)b::text[],
    %(run_nums)b::bigint[]) AS u(s, i, b, n) {only}
ON CONFLICT (session_id, id) DO UPDATE SET body = excluded.body
RETURNING session_id"""
"""Upsert runs (``_runs_params``): a new one goes after its session's others, a stored one
keeps its place. ``{only}``: a ``WHERE`` clause, or nothing."""


def _runs_params(runs: Sequence[tuple[str, SessionRun]]) -> dict[str, Any]:
    """The parameters of :data:`_UPSERT_RUNS` for ``(session id, run)`` pairs (one run id
    once per session): each new run numbered on after its session's stored ones."""
    counted: dict[str, int] = {}
    run_nums = []
    for sid, _ in runs:
        counted[sid] = counted.get(sid, 0) + 1
        run_nums.append(counted[sid])
    return {
        "run_sids": TextArray(sid for sid, _ in runs),
        "run_ids": TextArray(r.id for _, r in runs),
        "run_bodies": TextArray(_json(r, f"run {preview(r.id)}") for _, r in runs),
        "run_nums": BigintArray(run_nums),
    }


def _upsert_runs(cur: _Cursor, session_id: str, runs: Sequence[SessionRun]) -> None:
    runs = upsert_runs((), runs)
    if runs:
        cur.execute(_UPSERT_RUNS.format(only=""), _runs_params([(session_id, r) for r in runs]))


_KEEP_PREFIX_SQL: Final = (
    """
WITH new AS (
    SELECT u.o - 1 AS seq, u.i, u.r, u.h
    FROM unnest(%(ids)b::text[], %(roles)b::text[], %(hashes)b::bytea[])
        WITH ORDINALITY AS u(i, r, h, o)
), seen AS """
    + visible_turns("%(sid)s")
    + """
SELECT coalesce(min(n.seq), %(count)s) AS n
FROM new n LEFT JOIN seen t ON t.seq = n.seq
WHERE t.seq IS NULL OR t.id <> n.i OR t.role <> n.r
    OR sha256(convert_to(t.body, 'UTF8')) <> n.h
"""
)
"""The seq of the first turn the session sees that the new list does not repeat.

Stored rows are compared by id, role and the SHA-256 of their text, so only
digests travel, and a row is kept only when its text is exactly the new one.
"""


def _replace_turns(cur: _Cursor, session_id: str, turns: Sequence[SessionTurn]) -> None:
    """Replace every turn (ids already checked unique by ``check_ids``).

    The stored prefix the new list repeats stays as it is: a save that only
    changes the header, or adds turns, writes no stored turn again.
    """
    bodies = [_json(t, f"turn {preview(t.id)}") for t in turns]
    cur.execute(
        _KEEP_PREFIX_SQL,
        {
            "sid": session_id,
            "ids": [t.id for t in turns],
            "roles": [t.role for t in turns],
            "hashes": [hashlib.sha256(b.encode()).digest() for b in bodies],
            "count": len(turns),
        },
    )
    row = cur.fetchone()
    assert row is not None
    kept = int(row[0])
    unshare(cur, POSTGRES, session_id, kept)  # forks seeing the turns from there keep them
    share_less(cur, POSTGRES, session_id, kept)
    cur.execute(_SQL.delete_turns_from, (session_id, kept))
    _insert_turns(cur, session_id, kept, turns[kept:], bodies[kept:])
    cur.execute(
        "UPDATE sessions SET turn_count = %s, user_turn_count = %s WHERE id = %s",
        (len(turns), sum(1 for t in turns if t.role == "user"), session_id),
    )


def _replace_runs(cur: _Cursor, session_id: str, runs: Sequence[SessionRun]) -> None:
    cur.execute(_SQL.delete_runs, (session_id,))
    _upsert_runs(cur, session_id, runs)


_INSERT_HEADER: Final = (
    "INSERT INTO sessions (id, created_at, updated_at, status, agent_id, project_root,"
    " metadata, run_owner, extra)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)"
)


def _header_params(
    data: SessionData, stored: Any, metadata: Mapping[str, Any], keys: Sequence[str] | None
) -> tuple[Any, ...]:
    """The columns of ``data``'s header row, merged with the ``stored`` row (``None``: none)."""
    stored_status = stored[0] if stored else None
    stored_owner = _owner(stored[1], data.id) if stored else None
    stored_meta = _metadata(stored[3], data.id) if stored else None
    status, owner = snapshot_status(stored_status, stored_owner, data.status)
    merged = merge_session_metadata(stored_meta, metadata, keys)
    return (
        data.id,
        data.created_at,
        data.updated_at,
        status,
        data.agent_id,
        data.project_root,
        _json(merged, f"metadata of session {preview(data.id)}"),
        None if owner is None else _json(owner, "run owner"),
        extra_json(data.extra_fields),
    )


def _write_header(
    cur: _Cursor, data: SessionData, metadata: Mapping[str, Any], keys: Sequence[str] | None
) -> None:
    validate_id(data.id)
    stored = _lock_header(cur, data.id)
    cur.execute(
        _INSERT_HEADER + " ON CONFLICT (id) DO UPDATE SET created_at = excluded.created_at,"
        " updated_at = excluded.updated_at, status = excluded.status,"
        " agent_id = excluded.agent_id, project_root = excluded.project_root,"
        " metadata = excluded.metadata, run_owner = excluded.run_owner, extra = excluded.extra,"
        " rev = nextval('revs')",
        _header_params(data, stored, metadata, keys),
    )


_CREATE_SQL: Final = _INSERT_HEADER + " ON CONFLICT (id) DO NOTHING RETURNING rev"
"""A session with no turns and no runs created if absent, in one statement: the primary
key decides a race of two creators (the second finds the row and writes nothing)."""


def _create(data: SessionData) -> tuple[str, tuple[Any, ...]] | None:
    """The statement creating ``data`` (checked) when it holds no history, else ``None``."""
    data = _checked_data(data)
    if data.turns or data.runs:
        return None
    return _CREATE_SQL, _header_params(data, None, data.metadata, None)


def _save(cur: _Cursor, data: SessionData, *, expected_rev: int | None = None) -> Revision:
    data = _checked_data(data)
    check_ids(data.turns, data.runs)

    def write() -> None:
        _write_header(cur, data, data.metadata, None)
        _replace_turns(cur, data.id, data.turns)
        _replace_runs(cur, data.id, data.runs)

    return _versioned(cur, data.id, expected_rev, write)


def _save_meta(
    cur: _Cursor,
    data: SessionData,
    options: model.SaveMetaOptions | None = None,
    *,
    expected_rev: int | None = None,
) -> Revision:
    data = _checked_data(data)
    check_ids((), data.runs)
    keys = None
    if options is not None:
        keys = checked(options, model.SaveMetaOptions, "save_meta options").meta_keys

    def write() -> None:
        _write_header(cur, data, data.metadata, keys)
        _upsert_runs(cur, data.id, data.runs)

    return _versioned(cur, data.id, expected_rev, write)


_WORDS: Final = "''::tsvector"
"""A new row's ``words``: none yet, so nothing updates the row to fill them (``WORDS_SQL``
queues it for the indexer instead)."""

_FRESH_TURNS: Final = """
fresh AS (
    SELECT u.i, u.r, u.b, row_number() OVER (ORDER BY u.o) - 1 AS n
    FROM unnest(%(ids)b::text[], %(roles)b::text[], %(bodies)b::text[])
        WITH ORDINALITY AS u(i, r, b, o)
)"""
_COUNT_ADDED: Final = """
UPDATE sessions SET
    turn_count = turn_count + (SELECT count(*) FROM added),
    user_turn_count = user_turn_count + (SELECT count(*) FROM added WHERE role = 'user'),
    updated_at = %(now)s, rev = nextval('revs')
WHERE id = %(sid)s
"""

_APPEND_SQL: Final = (
    "WITH"
    + _FRESH_TURNS
    + f""", added AS (
    INSERT INTO turns (session_id, seq, id, role, body, words)
    SELECT %(sid)s, %(start)s + n, i, r, b, {_WORDS} FROM fresh
    RETURNING session_id, seq, role, body
),"""
    + WORDS_SQL
    + _COUNT_ADDED
)
"""After the row lock and the stored-id check: insert at dense seqs, count them."""

_HEAD: Final = (
    "SELECT turn_count, rev FROM sessions WHERE id = %(sid)s"
    " AND NOT EXISTS (SELECT FROM forks WHERE session_id = %(sid)s) FOR NO KEY UPDATE"
)
"""The session's row, locked (``turn_count`` and ``rev`` the latest committed), unless a
fork's (whose shared turns hold ids too: the two-step path checks them)."""


def _append_one_sql(head: str, run: str) -> str:
    """A single append's statement: ``head`` the locked row, ``run`` a ``WITH`` item
    writing the run (or nothing). Without a head it writes nothing, so it can run as its
    own transaction. It answers the head's ``rev`` (none: a fork, or a stale snapshot),
    the new ``rev``, and whether the session exists."""
    return (
        f"WITH head AS ({head}),"
        + _FRESH_TURNS
        + f""", added AS (
    INSERT INTO turns (session_id, seq, id, role, body, words)
    SELECT %(sid)s, head.turn_count + n, i, r, b, {_WORDS} FROM fresh, head
    RETURNING session_id, seq, role, body
),"""
        + WORDS_SQL
        + run
        + ", bumped AS ("
        + _COUNT_ADDED
        + """ AND EXISTS (SELECT FROM head) RETURNING rev)
SELECT (SELECT rev FROM head), (SELECT rev FROM bumped),
    EXISTS (SELECT FROM sessions WHERE id = %(sid)s)"""
    )


_APPEND_ONE_SQL: Final = _append_one_sql(_HEAD, "")
"""A single append (outside a batch) as one statement.

A turn id already stored (a retried append, or a conflicting one) fails
the unique constraint on ``(session_id, id)``, and the append then reruns on
the two-step path, which compares the stored rows (``fresh_turns``); so does an
append to a fork (whose shared turns hold ids too).
"""

_APPEND_ONE_RUN_SQL: Final = _append_one_sql(
    f"SELECT * FROM ({_HEAD}) h WHERE rev = (SELECT rev FROM sessions WHERE id = %(sid)s)",
    ", ran AS (" + _UPSERT_RUNS.format(only="WHERE EXISTS (SELECT FROM head)") + ")",
)
"""A single append with a run as one statement: :data:`_APPEND_ONE_SQL` that also upserts
the run, the session bumped once.

The run's place is read in the statement's snapshot, so the row must not have
changed between that snapshot and its lock: else (a write of another host
committed meanwhile) there is no head and the append reruns on the two-step path.
"""


def _checked_append(
    session_id: str, turns: Sequence[SessionTurn], options: AppendTurnsOptions | None = None
) -> tuple[Sequence[SessionTurn], SessionRun | None]:
    """Validated copies of the turns (ids safe and distinct) and the run of an append.

    A ``CheckedTurns`` (checked and encoded once) is kept as it is: its
    bodies are what the append writes (:func:`_turn_bodies`).
    """
    validate_id(session_id)
    if type(turns) is CheckedTurns:
        return turns, checked_append((), options)[1]
    valid, run = checked_append(turns, options)
    return list(valid), run


def _turn_bodies(turns: Sequence[SessionTurn]) -> TextArray:
    """The JSON of each turn: a ``CheckedTurns``' own bodies, else each turn encoded."""
    if type(turns) is CheckedTurns:
        return TextArray(body.decode() for body in turns.bodies)
    return TextArray(_json(t, f"turn {preview(t.id)}") for t in turns)


def _append_params(session_id: str, turns: Sequence[SessionTurn]) -> dict[str, Any]:
    return {
        "sid": session_id,
        "ids": TextArray(t.id for t in turns),
        "roles": TextArray(t.role for t in turns),
        "bodies": _turn_bodies(turns),
        "now": now_ms(),
    }


def _append_turns(
    cur: _Cursor,
    session_id: str,
    turns: Sequence[SessionTurn],
    options: AppendTurnsOptions | None = None,
) -> Revision:
    valid, run = _checked_append(session_id, turns, options)
    # The row lock serializes appends to one session across hosts; the next
    # statement's snapshot then sees every turn committed before it.
    cur.execute(f"SELECT turn_count, rev FROM sessions WHERE id = %s {_NO_KEY}", (session_id,))
    header = cur.fetchone()
    if header is None:
        raise SessionNotFoundError(f"cannot append turns to unknown session {preview(session_id)}")
    before = int(header[1])
    unique = valid and list(fresh_turns(session_id, valid, _stored_turns(cur, session_id, valid)))
    if not unique and run is None:
        return Revision(before, before)
    if unique:
        cur.execute(_APPEND_SQL, {**_append_params(session_id, unique), "start": header[0]})
    if run is not None:
        _upsert_runs(cur, session_id, (run,))
        cur.execute(
            "UPDATE sessions SET updated_at = %s, rev = nextval('revs') WHERE id = %s",
            (now_ms(), session_id),
        )
    cur.execute(_SQL.rev, (session_id,))
    row = cur.fetchone()
    assert row is not None
    return Revision(before, int(row[0]))


def _stored_turns(
    cur: _Cursor, session_id: str, turns: Sequence[SessionTurn]
) -> dict[str, SessionTurn]:
    """The stored turns holding one of ``turns``' ids (index lookups, not the history)."""
    cur.execute(
        f"SELECT id, body FROM {visible_turns('%(sid)s')} v WHERE id = ANY(%(ids)s)",
        {"sid": session_id, "ids": [t.id for t in turns]},
    )
    return {
        tid: _decode(body, SessionTurn, "turns", f"id={preview(tid)}")
        for tid, body in cur.fetchall()
    }


def _append_one(
    session_id: str, turns: Sequence[SessionTurn], run: SessionRun | None
) -> tuple[str, dict[str, Any]]:
    """The statement and parameters of an append of already checked, distinct ``turns``
    (and ``run``) as one statement: it may run as its own transaction, as it writes
    nothing unless it answers a revision (:func:`_appended_one`)."""
    params = _append_params(session_id, turns)
    if run is None:
        return _APPEND_ONE_SQL, params
    params.update(_runs_params([(session_id, run)]))
    return _APPEND_ONE_RUN_SQL, params


def _appended_one(row: Any, session_id: str) -> Revision:
    """The revision :func:`_append_one`'s statement answered; ``_SlowPath`` when it wrote
    nothing (a fork, a stale snapshot): the append then runs in two steps."""
    assert row is not None
    if not row[2]:
        raise SessionNotFoundError(f"cannot append turns to unknown session {preview(session_id)}")
    if row[0] is None:
        raise _SlowPath
    return Revision(int(row[0]), int(row[1]))


def _first_row(query: str, params: Params, cur: _Cursor) -> Any:
    """The first row ``query`` answers; ``_SlowPath`` on a unique violation (a statement
    failing wrote nothing: the caller reruns the write in the steps that compare rows)."""
    try:
        return cur.execute(query, params).fetchone()
    except pg_errors.UniqueViolation:
        raise _SlowPath from None


_LOCK_SESSIONS_SQL: Final = (
    f'SELECT id, rev FROM sessions WHERE id = ANY(%b::text[]) ORDER BY id COLLATE "C" {_NO_KEY}'
)
"""Lock the session rows of a run of appends, in one order for every host."""

_APPEND_BATCH_SQL: Final = f"""
WITH input AS (
    SELECT u.sid, u.i, u.r, u.b, u.o
    FROM unnest(%(sids)b::text[], %(ids)b::text[], %(roles)b::text[], %(bodies)b::text[])
        WITH ORDINALITY AS u(sid, i, r, b, o)
), stored AS (
    SELECT u.o, t.body = u.b AS same
    FROM input u JOIN turns t ON t.session_id = u.sid AND t.id = u.i
), fresh AS (
    SELECT u.sid, u.i, u.r, u.b,
        s.turn_count + row_number() OVER (PARTITION BY u.sid COLLATE "C" ORDER BY u.o) - 1 AS seq
    FROM input u JOIN sessions s ON s.id = u.sid
    WHERE NOT EXISTS (SELECT FROM stored WHERE stored.o = u.o)
), added AS (
    INSERT INTO turns (session_id, seq, id, role, body, words)
    SELECT sid, seq, i, r, b, {_WORDS} FROM fresh
    RETURNING session_id, seq, role, body
),{WORDS_SQL}, ran AS ({_UPSERT_RUNS.format(only="")}
), counted AS (
    SELECT session_id, count(seq) AS n, count(*) FILTER (WHERE role = 'user') AS users
    FROM (SELECT session_id, seq, role FROM added UNION ALL SELECT session_id, NULL, NULL FROM ran)
        AS c GROUP BY session_id
), bumped AS (
    UPDATE sessions s SET turn_count = s.turn_count + c.n,
        user_turn_count = s.user_turn_count + c.users, updated_at = %(now)s, rev = nextval('revs')
    FROM counted c WHERE s.id = c.session_id
    RETURNING s.id, s.rev
)
SELECT (SELECT count(*) FROM stored WHERE NOT same),
    (SELECT array_agg(id) FROM bumped), (SELECT array_agg(rev) FROM bumped)
"""
"""A run of appends (sessions locked, no session id + turn id twice) as one statement.

Rows come in write order, each session's turns numbered on from its
``turn_count``; a turn id stored with the same text is skipped (a retry); the
appends' runs are upserted (:data:`_UPSERT_RUNS`); sessions gaining turns or a
run get their counters and ``rev`` bumped once (a run holds one append per
session, so each append's revision is exact). It answers how
many ids are stored with other text (the caller then reruns the batch on the
savepoint path, whose :func:`fresh_turns` compares the documents) and the
bumped sessions' new revs.
"""


@attrs.frozen
class _Append:
    """A batch's append: its place, session, checked distinct turns and run."""

    index: int
    session_id: str
    turns: Sequence[SessionTurn]
    run: SessionRun | None


def _batch_append(
    index: int,
    session_id: str,
    turns: Sequence[SessionTurn],
    options: AppendTurnsOptions | None = None,
) -> _Append:
    """The append at ``index`` of a batch, checked."""
    return _Append(index, session_id, *_checked_append(session_id, turns, options))


def _append_run(
    cur: _Cursor, run: Sequence[_Append], results: builtins.list[outcome.Outcome[Any] | None]
) -> None:
    """Apply ``run`` with :data:`_LOCK_SESSIONS_SQL` then :data:`_APPEND_BATCH_SQL`.

    The insert's snapshot is taken once the rows are locked, so it sees every
    turn committed to those sessions. Appends to unknown sessions fail alone.
    """
    cur.execute(_LOCK_SESSIONS_SQL, (sorted({a.session_id for a in run}),))
    found = {row[0]: int(row[1]) for row in cur.fetchall()}
    cur.execute("SELECT FROM forks WHERE session_id = ANY(%s) LIMIT 1", (list(found),))
    if cur.fetchone() is not None:  # a fork's shared turn ids are checked one append at a time
        raise _SlowPath
    sids, ids, roles, bodies = TextArray(), TextArray(), TextArray(), TextArray()
    runs: builtins.list[tuple[str, SessionRun]] = []
    for append in run:
        if append.session_id not in found:
            results[append.index] = outcome.Error(
                SessionNotFoundError(
                    f"cannot append turns to unknown session {preview(append.session_id)}"
                )
            )
            continue
        rev = found[append.session_id]
        results[append.index] = outcome.Value(Revision(rev, rev))  # until the bump says more
        if append.run is not None:
            runs.append((append.session_id, append.run))
        for turn in append.turns:
            sids.append(append.session_id)
            ids.append(turn.id)
            roles.append(turn.role)
        bodies.extend(_turn_bodies(append.turns))
    if not ids and not runs:
        return
    cur.execute(
        _APPEND_BATCH_SQL,
        {
            "sids": sids,
            "ids": ids,
            "roles": roles,
            "bodies": bodies,
            "now": now_ms(),
            **_runs_params(runs),
        },
    )
    answer = cur.fetchone()
    if answer is None or answer[0]:
        raise _SlowPath
    bumped = dict(zip(answer[1] or (), answer[2] or (), strict=True))
    for append in run:
        if append.session_id in bumped:
            results[append.index] = outcome.Value(
                Revision(found[append.session_id], int(bumped[append.session_id]))
            )


def _pipelined_writes(
    conn: _Connection, writes: Sequence[StoreWrite]
) -> builtins.list[outcome.Outcome[Any]]:
    """Every write of a batch, in order; runs of appends as one statement each.

    Other writes are pipelined (sent without waiting for answers they do not
    read). A run ends before a write that is no append or that appends to a
    session the run appends to already (so each append's revision is exact).
    Any failure raises :class:`_SlowPath` (the caller rolls back and reruns the
    batch with savepoints), so every outcome here is a value or an append's
    :class:`SessionNotFoundError`.
    """
    results: builtins.list[outcome.Outcome[Any] | None] = []
    run: builtins.list[_Append] = []
    sessions: set[str] = set()
    try:
        with conn.pipeline(), conn.cursor() as cur:
            for index, write in enumerate(writes):
                fn = _write_fn(write)  # a refused write raises: the savepoint path answers it
                append = None
                if write.method == "append_turns":
                    append = _batch_append(index, *write.args, **write.kwargs)
                if run and (append is None or append.session_id in sessions):
                    _append_run(cur, run, results)
                    run.clear()
                    sessions.clear()
                if append is not None:
                    run.append(append)
                    sessions.add(append.session_id)
                    results.append(None)
                else:
                    results.append(outcome.Value(fn(cur, *write.args, **write.kwargs)))
            if run:
                _append_run(cur, run, results)
    except (psycopg.OperationalError, psycopg.InterfaceError):
        raise
    except Exception:
        raise _SlowPath from None
    done = [r for r in results if r is not None]
    assert len(done) == len(writes)
    return done


def _update_run(
    cur: _Cursor, session_id: str, run: SessionRun, options: model.UpdateRunOptions | None = None
) -> Revision:
    validate_id(session_id)
    run = checked(run, SessionRun, "run")
    check_ids((), (run,))
    if options is not None:
        checked(options, model.UpdateRunOptions, "update run options")
    before = _locked_rev(cur, session_id)
    if not before:
        return Revision(0, 0)
    cur.execute(
        "UPDATE sessions SET updated_at = %s, rev = nextval('revs') WHERE id = %s RETURNING rev",
        (now_ms(), session_id),
    )
    row = cur.fetchone()
    _upsert_runs(cur, session_id, (run,))
    return Revision(before, before if row is None else int(row[0]))


def _update_status(
    cur: _Cursor,
    session_id: str,
    status: model.SessionStatus,
    *,
    owner: RunOwner | None = None,
    preserve_updated_at: bool = False,
) -> Revision:
    validate_id(session_id)
    checked_status(status)
    if owner is not None:
        owner = checked(owner, RunOwner, "run owner")
    if status == "running":
        owner_json: str | None = _json(owner or current_run_owner(), "run owner")
    else:
        owner_json = None
    before = _locked_rev(cur, session_id)
    if not before:
        return Revision(0, 0)
    cur.execute(
        "UPDATE sessions SET status = %s, run_owner = %s::jsonb, rev = nextval('revs'),"
        " updated_at = CASE WHEN %s THEN updated_at ELSE %s END WHERE id = %s RETURNING rev",
        (status, owner_json, preserve_updated_at, now_ms(), session_id),
    )
    row = cur.fetchone()
    return Revision(before, before if row is None else int(row[0]))


def _held_for_send(cur: _Cursor, session_id: str) -> None:
    """Refuse a send request of a session the store does not hold.

    The header row is key-share locked until the write commits, so a delete
    running meanwhile waits, then drops the new record with the session.
    """
    cur.execute(_SQL.held_for_send, (session_id,))
    if cur.fetchone() is None:
        raise SessionNotFoundError(
            f"cannot claim a send request of unknown session {preview(session_id)}"
            " (save the session first)"
        )


def _delete(cur: _Cursor, session_id: str) -> None:
    validate_id(session_id)
    if _locked_rev(cur, session_id, "FOR UPDATE"):  # a fork being made of it is committed or waits
        unshare(cur, POSTGRES, session_id)  # its forks keep what they see
    cur.execute(_SQL.delete_session, (session_id,))
    cur.execute(_SQL.delete_sends, (session_id,))


def _patch_meta(cur: _Cursor, session_id: str, patch: Mapping[str, model.JsonValue]) -> Revision:
    validate_id(session_id)
    patch = checked_meta_patch(patch)
    return _versioned(cur, session_id, None, lambda: _patch_locked(cur, session_id, patch))


def _patch_locked(cur: _Cursor, session_id: str, patch: Mapping[str, model.JsonValue]) -> None:
    header = _lock_header(cur, session_id)
    if header is None:
        return
    merged = patch_metadata(_metadata(header[3], session_id), patch)
    cur.execute(
        "UPDATE sessions SET metadata = %s, rev = nextval('revs') WHERE id = %s",
        (_json(merged, f"metadata of session {preview(session_id)}"), session_id),
    )


def _artifact_row(row: tuple[Any, ...]) -> SessionArtifact:
    artifact: SessionArtifact = _decode(
        row[0],
        SessionArtifact,
        "artifacts",
        f"(session_id={preview(row[1])}, id={preview(row[2])})",
    )
    return artifact


def _touch(cur: _Cursor, session_id: str) -> None:
    cur.execute("UPDATE sessions SET rev = nextval('revs') WHERE id = %s", (session_id,))


def _upsert_artifact(cur: _Cursor, artifact: SessionArtifact) -> SessionArtifact | None:
    artifact = normalize_artifact(checked(artifact, SessionArtifact, "artifact"))
    check_artifact_ids(artifact)
    if _lock_header(cur, artifact.session_id) is None:
        return None
    cur.execute(
        "SELECT body, session_id, id FROM artifacts"
        " WHERE session_id = %s AND kind = %s AND uri = %s",
        (artifact.session_id, artifact.kind, artifact.uri),
    )
    found = cur.fetchone()
    if found is not None:
        stored = merge_artifact(_artifact_row(found), artifact)
        cur.execute(
            "UPDATE artifacts SET body = %s, updated_at = %s, project_root = %s"
            " WHERE session_id = %s AND id = %s",
            (
                _json(stored, "artifact"),
                stored.updated_at,
                stored.project_root,
                stored.session_id,
                stored.id,
            ),
        )
        _touch(cur, stored.session_id)
        return stored
    cur.execute(
        "SELECT body, session_id, id FROM artifacts WHERE session_id = %s AND id = %s",
        (artifact.session_id, artifact.id),
    )
    held = cur.fetchone()
    check_artifact_id_free(artifact, None if held is None else _artifact_row(held))
    cur.execute("SELECT count(*) FROM artifacts WHERE session_id = %s", (artifact.session_id,))
    count = cur.fetchone()
    evict: list[str] = []
    if count is not None and count[0] + 1 > model.ARTIFACTS_PER_SESSION_CAP:
        cur.execute(
            "SELECT body, session_id, id FROM artifacts WHERE session_id = %s ORDER BY seq",
            (artifact.session_id,),
        )
        evict = select_artifact_evictions([_artifact_row(row) for row in cur.fetchall()])
    if evict:
        cur.execute(
            "DELETE FROM artifacts WHERE session_id = %s AND id = ANY(%s)",
            (artifact.session_id, evict),
        )
    cur.execute(
        "INSERT INTO artifacts"
        " (session_id, id, kind, uri, project_root, created_at, updated_at, body)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (
            artifact.session_id,
            artifact.id,
            artifact.kind,
            artifact.uri,
            artifact.project_root,
            artifact.created_at,
            artifact.updated_at,
            _json(artifact, "artifact"),
        ),
    )
    _touch(cur, artifact.session_id)
    return artifact


def _delete_artifact(cur: _Cursor, session_id: str, artifact_id: str) -> None:
    validate_id(session_id)
    validate_id(artifact_id, what="artifact id")
    cur.execute(
        "DELETE FROM artifacts WHERE session_id = %s AND id = %s RETURNING 1",
        (session_id, artifact_id),
    )
    if cur.fetchone() is not None:
        _touch(cur, session_id)


_settle_send_request: Final = functools.partial(settle_send_request, POSTGRES)


_WRITES: Final[Mapping[str, Callable[..., Any]]] = {
    "append_turns": _append_turns,
    "delete": _delete,
    "delete_artifact": _delete_artifact,
    "patch_meta": _patch_meta,
    "save": _save,
    "save_meta": _save_meta,
    "settle_send_request": _settle_send_request,
    "update_run": _update_run,
    "update_status": _update_status,
    "upsert_artifact": _upsert_artifact,
}
"""The step applying each batchable write: ``step(cur, *args, **kwargs)``."""
if _WRITES.keys() != WRITE_METHODS:  # the one table of batchable writes is WRITE_METHODS
    raise ImportError(f"PostgreSQL write steps {sorted(_WRITES)} differ from WRITE_METHODS")


def _write_fn(write: object) -> Callable[..., Any]:
    """The step applying ``write``; UnsupportedOperationError for a write no batch takes."""
    return write_step(write, _WRITES.__getitem__)
