"""A session store on PostgreSQL, shared by many hosts.

psycopg 3's blocking API runs in worker threads (no trio-native driver
exists): every connection has its own ``CapacityLimiter(1)`` and no thread
is ever abandoned on cancel. Batches of writes (group commit) run on one
dedicated connection; reads and single writes take any idle connection of
the pool. Cross-host races (run claims,
schedule fires, send-request ids, appends) are settled by row locks and
conditional statements inside one transaction each.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, TypeAlias, TypeVar

import attrs
import msgspec
import outcome
import psycopg
import trio
from msgspec import UNSET
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .._nursery import open_service_nursery
from ..errors import (
    ConflictError,
    CorruptDataError,
    InvalidNameError,
    SessionNotFoundError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnsupportedOperationError,
    ValidationError,
    ZidaneActorsError,
)
from ..model import (
    ARTIFACTS_PER_SESSION_CAP,
    FIRE_HISTORY,
    AppendTurnsOptions,
    ArtifactFilter,
    ExtraFields,
    JsonValue,
    RunOwner,
    SaveMetaOptions,
    Schedule,
    ScheduleFire,
    SendRequestClaim,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionMetaRow,
    SessionRun,
    SessionSearch,
    SessionSearchPage,
    SessionStatus,
    SessionTurn,
    UpdateRunOptions,
    check_artifact_id_free,
    check_json,
    corrupt_meta_row,
    current_run_owner,
    decoder,
    encode_str,
    extra_json,
    filter_artifacts,
    fresh_turns,
    merge_artifact,
    merge_session_metadata,
    normalize_artifact,
    patch_metadata,
    preview,
    run_claim_blocked,
    search_words,
    select_artifact_evictions,
    send_request_evictions,
    snapshot_status,
    upsert_runs,
    validate_id,
    validate_request_id,
)
from ..model import SEND_REQUEST_HISTORY as _SEND_REQUEST_HISTORY
from ..model._checked import CheckedTurns
from ._postgres_schema import SEARCH_CATCH_UP, migrate
from ._protocol import (
    HistoryMutation,
    MutateResult,
    Revision,
    RevisionSink,
    RunClaim,
    StoreWrite,
    TurnsMutation,
    stale,
)
from ._validate import (
    check_artifact_filter_ids,
    check_artifact_ids,
    check_fire_ids,
    check_ids,
    checked,
    checked_header,
    checked_int,
    checked_items,
    checked_meta_patch,
    checked_status,
    now_ms,
    warn_mutate_turns,
)
from .sql import POSTGRES, SharedSQL, equal_sql, search_header_sql, session_filter_sql

__all__ = [
    "CHANGES_CHANNEL",
    "ChangeListener",
    "PostgresStore",
    "PostgresStoreStatistics",
    "open_postgres_store",
]

T = TypeVar("T")
_Cursor: TypeAlias = psycopg.Cursor[tuple[Any, ...]]
_Connection: TypeAlias = psycopg.Connection[tuple[Any, ...]]

_SQL: Final = SharedSQL(POSTGRES)
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TRANSIENT: Final = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)
_BACKOFF_S: Final = 0.05
_SERVER_GONE: Final = frozenset({"57P01", "57P02", "57P03"})
"""SQLSTATEs of a server session ended by the server: admin shutdown (``pg_terminate_backend``,
a fast stop), crash shutdown, and a server still starting."""
_log = logging.getLogger("zidane_actors.stores.postgres")


class _SlowPath(Exception):
    """A write of a savepoint-free batch failed: roll back and rerun with savepoints."""


def _json(value: object, what: str) -> str:
    try:
        return encode_str(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"{what} is not JSON-encodable: {exc}") from None


def _extra(text: str, session_id: str) -> ExtraFields:
    return ExtraFields(
        _decode(text, dict[str, Any], "sessions", f"{preview(session_id)} column extra")
    )


def _checked_data(data: object) -> SessionData:
    """``data`` validated; metadata keys mapped to ``UNSET`` are dropped (absent = removed)."""
    checked_header(data)
    assert isinstance(data, SessionData)
    metadata = {k: v for k, v in data.metadata.items() if v is not UNSET}
    return checked(msgspec.structs.replace(data, metadata=metadata), SessionData, "session data")


def _decode(text: str | None, type_: Any, table: str, key: str) -> Any:
    if text is None:
        raise CorruptDataError(f"{table} row {key} has no value where JSON was expected")
    try:
        return decoder(type_).decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        reason = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise CorruptDataError(f"{table} row {key} does not decode: {reason}") from None


def _map_error(exc: BaseException) -> BaseException:
    """A psycopg failure as the matching :mod:`zidane_actors.errors` exception."""
    if isinstance(exc, ZidaneActorsError) or not isinstance(exc, psycopg.Error):
        return exc
    diag = exc.diag.message_primary or str(exc)
    if isinstance(exc, psycopg.IntegrityError):
        mapped: ZidaneActorsError = ConflictError(f"PostgreSQL refused the write: {diag}")
    elif isinstance(exc, psycopg.DataError):
        mapped = ValidationError(f"PostgreSQL refused a value: {diag}")
    elif isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        mapped = StoreUnavailableError(f"PostgreSQL is unavailable: {diag}")
    else:
        mapped = StoreError(f"PostgreSQL error: {diag}")
    mapped.__cause__ = exc
    return mapped


# ---------------------------------------------------------------------------
# Row access (synchronous, inside one transaction on the given cursor)


def _lock_header(cur: _Cursor, session_id: str) -> tuple[Any, ...] | None:
    cur.execute(
        "SELECT status, run_owner::text, updated_at, metadata"
        " FROM sessions WHERE id = %s FOR UPDATE",
        (session_id,),
    )
    return cur.fetchone()


def _locked_rev(cur: _Cursor, session_id: str) -> int:
    """The session's ``rev`` with its row locked for this transaction; ``0`` when absent."""
    cur.execute("SELECT rev FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
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
        "INSERT INTO turns (session_id, seq, id, role, body)"
        " SELECT %s, s, i, r, b FROM unnest(%b::bigint[], %b::text[], %b::text[], %b::text[])"
        " AS u(s, i, r, b)",
        (
            session_id,
            list(range(start, start + len(turns))),
            [t.id for t in turns],
            [t.role for t in turns],
            bodies,
        ),
    )


def _upsert_runs(cur: _Cursor, session_id: str, runs: Sequence[SessionRun]) -> None:
    runs = upsert_runs((), runs)
    if not runs:
        return
    cur.execute(
        "INSERT INTO runs (session_id, id, seq, body)"
        " SELECT %s, i, (SELECT coalesce(max(seq), -1) FROM runs WHERE session_id = %s) + o, b"
        " FROM unnest(%b::text[], %b::text[]) WITH ORDINALITY AS u(i, b, o)"
        " ON CONFLICT (session_id, id) DO UPDATE SET body = excluded.body",
        (
            session_id,
            session_id,
            [r.id for r in runs],
            [_json(r, f"run {preview(r.id)}") for r in runs],
        ),
    )


_KEEP_PREFIX_SQL: Final = """
WITH new AS (
    SELECT u.o - 1 AS seq, u.i, u.r, u.h
    FROM unnest(%(ids)b::text[], %(roles)b::text[], %(hashes)b::bytea[])
        WITH ORDINALITY AS u(i, r, h, o)
), kept AS (
    SELECT coalesce(min(n.seq), %(count)s) AS n
    FROM new n LEFT JOIN turns t ON t.session_id = %(sid)s AND t.seq = n.seq
    WHERE t.seq IS NULL OR t.id <> n.i OR t.role <> n.r
        OR sha256(convert_to(t.body, 'UTF8')) <> n.h
), gone AS (
    DELETE FROM turns WHERE session_id = %(sid)s AND seq >= (SELECT n FROM kept)
)
SELECT n FROM kept
"""
"""Delete the stored turns from the first one the new list does not repeat; answer its seq.

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
    _insert_turns(cur, session_id, kept, turns[kept:], bodies[kept:])
    cur.execute(
        "UPDATE sessions SET turn_count = %s, user_turn_count = %s WHERE id = %s",
        (len(turns), sum(1 for t in turns if t.role == "user"), session_id),
    )


def _replace_runs(cur: _Cursor, session_id: str, runs: Sequence[SessionRun]) -> None:
    cur.execute(_SQL.delete_runs, (session_id,))
    _upsert_runs(cur, session_id, runs)


def _write_header(
    cur: _Cursor, data: SessionData, metadata: Mapping[str, Any], keys: Sequence[str] | None
) -> None:
    validate_id(data.id)
    stored = _lock_header(cur, data.id)
    stored_status = stored[0] if stored else None
    stored_owner = _owner(stored[1], data.id) if stored else None
    stored_meta = _metadata(stored[3], data.id) if stored else None
    status, owner = snapshot_status(stored_status, stored_owner, data.status)
    merged = merge_session_metadata(stored_meta, metadata, keys)
    cur.execute(
        "INSERT INTO sessions (id, created_at, updated_at, status, agent_id, project_root,"
        " metadata, run_owner, extra)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)"
        " ON CONFLICT (id) DO UPDATE SET created_at = excluded.created_at,"
        " updated_at = excluded.updated_at, status = excluded.status,"
        " agent_id = excluded.agent_id, project_root = excluded.project_root,"
        " metadata = excluded.metadata, run_owner = excluded.run_owner, extra = excluded.extra,"
        " rev = nextval('revs')",
        (
            data.id,
            data.created_at,
            data.updated_at,
            status,
            data.agent_id,
            data.project_root,
            _json(merged, f"metadata of session {preview(data.id)}"),
            None if owner is None else _json(owner, "run owner"),
            extra_json(data.extra_fields),
        ),
    )


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
    options: SaveMetaOptions | None = None,
    *,
    expected_rev: int | None = None,
) -> Revision:
    data = _checked_data(data)
    check_ids((), data.runs)
    keys = None
    if options is not None:
        keys = checked(options, SaveMetaOptions, "save_meta options").meta_keys

    def write() -> None:
        _write_header(cur, data, data.metadata, keys)
        _upsert_runs(cur, data.id, data.runs)

    return _versioned(cur, data.id, expected_rev, write)


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
    + """, added AS (
    INSERT INTO turns (session_id, seq, id, role, body)
    SELECT %(sid)s, %(start)s + n, i, r, b FROM fresh
    RETURNING role
)"""
    + _COUNT_ADDED
)
"""After the row lock and the stored-id check: insert at dense seqs, count them."""

_APPEND_ONE_SQL: Final = (
    "WITH head AS (SELECT turn_count, rev FROM sessions WHERE id = %(sid)s FOR UPDATE),"
    + _FRESH_TURNS
    + """, added AS (
    INSERT INTO turns (session_id, seq, id, role, body)
    SELECT %(sid)s, head.turn_count + n, i, r, b FROM fresh, head
    RETURNING role
)"""
    + _COUNT_ADDED
    + " RETURNING (SELECT rev FROM head), rev"
)
"""A single append (outside a batch) as one statement.

A turn id already stored (a retried append, or a conflicting one) fails
the unique constraint on ``(session_id, id)``, and the append then reruns on
the two-step path, which compares the stored rows (``fresh_turns``).
"""


def _checked_append(
    session_id: str, turns: Sequence[SessionTurn], options: AppendTurnsOptions | None = None
) -> tuple[list[SessionTurn], SessionRun | None]:
    """Validated copies of the turns (ids safe and distinct) and the run of an append."""
    validate_id(session_id)
    unchecked: tuple[SessionTurn, ...] = ()
    if type(turns) is CheckedTurns:  # checked already: copies decoded from its bodies
        valid = tuple(map(decoder(SessionTurn).decode, turns.bodies))
    else:
        valid = unchecked = checked_items(turns, SessionTurn, "turns")
    run = None
    if options is not None:
        run = checked(options, AppendTurnsOptions, "append options").run
    check_ids(unchecked, () if run is None else (run,))
    return list(valid), run


def _append_params(session_id: str, turns: Sequence[SessionTurn]) -> dict[str, Any]:
    return {
        "sid": session_id,
        "ids": [t.id for t in turns],
        "roles": [t.role for t in turns],
        "bodies": [_json(t, f"turn {preview(t.id)}") for t in turns],
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
    cur.execute("SELECT turn_count, rev FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
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
        "SELECT id, body FROM turns WHERE session_id = %s AND id = ANY(%s)",
        (session_id, [t.id for t in turns]),
    )
    return {
        tid: _decode(body, SessionTurn, "turns", f"id={preview(tid)}")
        for tid, body in cur.fetchall()
    }


def _append_one(cur: _Cursor, session_id: str, turns: Sequence[SessionTurn]) -> Revision:
    """Append already checked, distinct ``turns`` with :data:`_APPEND_ONE_SQL`."""
    try:
        cur.execute(_APPEND_ONE_SQL, _append_params(session_id, turns))
    except pg_errors.UniqueViolation:
        raise _SlowPath from None
    row = cur.fetchone()
    if row is None:
        raise SessionNotFoundError(f"cannot append turns to unknown session {preview(session_id)}")
    return Revision(int(row[0]), int(row[1]))


_LOCK_SESSIONS_SQL: Final = (
    'SELECT id, rev FROM sessions WHERE id = ANY(%b::text[]) ORDER BY id COLLATE "C" FOR UPDATE'
)
"""Lock the session rows of a run of appends, in one order for every host."""

_APPEND_BATCH_SQL: Final = """
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
    INSERT INTO turns (session_id, seq, id, role, body)
    SELECT sid, seq, i, r, b FROM fresh
    RETURNING session_id, role
), counted AS (
    SELECT session_id, count(*) AS n, count(*) FILTER (WHERE role = 'user') AS users
    FROM added GROUP BY session_id
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
``turn_count``; a turn id stored with the same text is skipped (a retry),
sessions gaining turns get their counters and ``rev`` bumped once (a run holds
one append per session, so each append's revision is exact). It answers how
many ids are stored with other text (the caller then reruns the batch on the
savepoint path, whose :func:`fresh_turns` compares the documents) and the
bumped sessions' new revs.
"""


@attrs.frozen
class _Append:
    """A batch's plain append (no run): its place, session and checked, distinct turns."""

    index: int
    session_id: str
    turns: Sequence[SessionTurn]


def _plain_append(
    index: int,
    session_id: str,
    turns: Sequence[SessionTurn],
    options: AppendTurnsOptions | None = None,
) -> _Append | None:
    """The append at ``index`` of a batch, checked; ``None`` when it also writes a run."""
    valid, run = _checked_append(session_id, turns, options)
    return None if run is not None else _Append(index, session_id, valid)


def _append_run(
    cur: _Cursor, run: Sequence[_Append], results: builtins.list[outcome.Outcome[Any] | None]
) -> None:
    """Apply ``run`` with :data:`_LOCK_SESSIONS_SQL` then :data:`_APPEND_BATCH_SQL`.

    The insert's snapshot is taken once the rows are locked, so it sees every
    turn committed to those sessions. Appends to unknown sessions fail alone.
    """
    cur.execute(_LOCK_SESSIONS_SQL, (sorted({a.session_id for a in run}),))
    found = {row[0]: int(row[1]) for row in cur.fetchall()}
    sids: builtins.list[str] = []
    ids: builtins.list[str] = []
    roles: builtins.list[str] = []
    bodies: builtins.list[str] = []
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
        for turn in append.turns:
            sids.append(append.session_id)
            ids.append(turn.id)
            roles.append(turn.role)
            bodies.append(_json(turn, f"turn {preview(turn.id)}"))
    if not ids:
        return
    cur.execute(
        _APPEND_BATCH_SQL,
        {"sids": sids, "ids": ids, "roles": roles, "bodies": bodies, "now": now_ms()},
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
    """Every write of a batch, in order; runs of plain appends as one statement each.

    Other writes are pipelined (sent without waiting for answers they do not
    read). A run ends before a write that is no plain append or that appends
    to a session the run appends to already (so each append's revision is
    exact). Any failure raises :class:`_SlowPath` (the caller rolls back and
    reruns the batch with savepoints), so every outcome here is a value or an
    append's :class:`SessionNotFoundError`.
    """
    results: builtins.list[outcome.Outcome[Any] | None] = []
    run: builtins.list[_Append] = []
    sessions: set[str] = set()
    try:
        with conn.pipeline(), conn.cursor() as cur:
            for index, write in enumerate(writes):
                fn = _WRITES.get(write.method) if isinstance(write, StoreWrite) else None
                if fn is None:
                    raise _SlowPath
                append = None
                if write.method == "append_turns":
                    append = _plain_append(index, *write.args, **write.kwargs)
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
    cur: _Cursor, session_id: str, run: SessionRun, options: UpdateRunOptions | None = None
) -> Revision:
    validate_id(session_id)
    run = checked(run, SessionRun, "run")
    check_ids((), (run,))
    if options is not None:
        checked(options, UpdateRunOptions, "update run options")
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
    status: SessionStatus,
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
    cur.execute(_SQL.delete_session, (session_id,))
    cur.execute(_SQL.delete_sends, (session_id,))


def _patch_meta(cur: _Cursor, session_id: str, patch: Mapping[str, JsonValue]) -> Revision:
    validate_id(session_id)
    patch = checked_meta_patch(patch)
    return _versioned(cur, session_id, None, lambda: _patch_locked(cur, session_id, patch))


def _patch_locked(cur: _Cursor, session_id: str, patch: Mapping[str, JsonValue]) -> None:
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
    if count is not None and count[0] + 1 > ARTIFACTS_PER_SESSION_CAP:
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


def _settle_send_request(cur: _Cursor, session_id: str, request_id: str, result: JsonValue) -> None:
    validate_id(session_id)
    validate_request_id(request_id, what="request id")
    check_json(result, what="send result")
    if result is None:
        cur.execute(
            _SQL.delete_send,
            (session_id, request_id),
        )
    else:
        cur.execute(
            _SQL.settle_send,
            (_json(result, "send result"), session_id, request_id),
        )


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

_META_SELECT: Final = (
    "SELECT s.id, s.metadata, s.created_at, s.updated_at, s.status, s.agent_id,"
    " s.project_root, s.run_owner::text, s.rev, s.turn_count, s.user_turn_count,"
    " (SELECT count(*) FROM runs r WHERE r.session_id = s.id),"
    " (SELECT count(*) FROM artifacts a WHERE a.session_id = s.id),"
    " (SELECT t.body FROM turns t WHERE t.session_id = s.id AND t.role = 'user'"
    "  ORDER BY t.seq LIMIT 1)"
    " FROM sessions s"
)


def _meta_row(row: tuple[Any, ...]) -> SessionMetaRow:
    session_id = row[0]
    metadata = _metadata(row[1], session_id)
    first_user = None
    if row[13] is not None and "title" not in metadata:
        first_user = _decode(
            row[13], SessionTurn, "turns", f"(session_id={preview(session_id)}) first"
        )
    return SessionMetaRow(
        id=session_id,
        metadata=metadata,
        run_count=row[11],
        turn_count=row[9],
        updated_at=row[3],
        user_message_count=row[10],
        agent_id=row[5],
        artifact_count=row[12],
        created_at=row[2],
        first_user_turn=first_user,
        project_root=row[6],
        rev=row[8],
        run_owner=_owner(row[7], session_id),
        status=row[4],
    )


def _listed_row(row: tuple[Any, ...]) -> SessionMetaRow:
    """``_meta_row``, or the row naming a session whose header does not decode."""
    try:
        return _meta_row(row)
    except CorruptDataError as exc:
        return corrupt_meta_row(row[0], row[3], exc)


def _session_where(filter: SessionFilter | None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if filter is not None:
        filter = checked(filter, SessionFilter, "session filter")
        clauses, params = session_filter_sql(filter, POSTGRES.placeholder)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    order = ' ORDER BY s.updated_at DESC, s.id COLLATE "C"'
    if filter is not None and filter.limit is not None:
        order += " LIMIT %s"
        params.append(filter.limit)
    return where + order, params


def _search_where(search: SessionSearch) -> tuple[str, list[Any]]:
    """The WHERE clause of ``search`` over ``sessions s``: words through the GIN indexes."""
    clauses: list[str] = []
    params: list[Any] = []
    words = search_words(search.text or "")
    if words:
        # Each word is a prefix of a word of the session's header or of one of its turns;
        # the session ids are intersected. Words are letters and digits only.
        hits = " INTERSECT ".join(
            "(SELECT t.session_id FROM turns t WHERE t.words @@ %s::tsquery"
            " UNION SELECT h.id FROM sessions h WHERE h.words @@ %s::tsquery)"
            for _ in words
        )
        clauses.append(f"s.id IN ({hits})")
        for word in words:
            params += [f"'{word}':*"] * 2
    header, values = search_header_sql(search, POSTGRES.placeholder)
    clauses += header
    params += values
    return (f" WHERE {' AND '.join(clauses)}" if clauses else ""), params


_AGG: Final = "count(*) || ':' || string_agg(body, ',' ORDER BY seq)"
"""Rows' JSON bodies joined by commas, after their count (``NULL`` for no rows)."""


def _decode_list(
    cur: _Cursor, text: str | None, type_: Any, table: str, session_id: str
) -> tuple[Any, ...]:
    """Decode ``table`` rows aggregated as ``"<count>:<body>,<body>…"`` (:data:`_AGG`).

    Names the bad row on failure. The count catches a row holding two
    documents (``{...},{...}``), which the joined array would read as two items.
    """
    if text is None:
        return ()
    count, _, bodies = text.partition(":")
    try:
        items: tuple[Any, ...] = decoder(tuple[type_, ...]).decode(f"[{bodies}]")
        if len(items) == int(count):
            return items
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    cur.execute(
        f"SELECT seq, body FROM {table} WHERE session_id = %s ORDER BY seq",
        (session_id,),
    )
    for seq, body in cur.fetchall():
        _decode(body, type_, table, f"(session_id={preview(session_id)}, seq={seq})")
    raise CorruptDataError(f"{table} rows of session {preview(session_id)} do not decode")


def _history(cur: _Cursor, session_id: str) -> SessionHistory:
    cur.execute(
        f"SELECT (SELECT {_AGG} FROM turns WHERE session_id = %s),"
        f" (SELECT {_AGG} FROM runs WHERE session_id = %s)",
        (session_id, session_id),
    )
    row = cur.fetchone()
    assert row is not None
    return SessionHistory(
        turns=_decode_list(cur, row[0], SessionTurn, "turns", session_id),
        runs=_decode_list(cur, row[1], SessionRun, "runs", session_id),
    )


def _mutate(
    cur: _Cursor, session_id: str, mutate: HistoryMutation, *, runs_too: bool
) -> MutateResult:
    validate_id(session_id)
    if _lock_header(cur, session_id) is None:
        return "no-session"
    history = _history(cur, session_id)
    result = mutate(history)
    if result is None:
        return "unchanged"
    if not isinstance(result, SessionHistory):
        raise ValidationError(
            "mutate_history callback must return a SessionHistory or None,"
            f" got {type(result).__name__}"
        )
    turns = checked_items(result.turns, SessionTurn, "history turns")
    runs = history.runs
    if runs_too and result.runs != history.runs:
        runs = checked_items(result.runs, SessionRun, "history runs")
    check_ids(turns, runs)
    if turns != history.turns:
        _replace_turns(cur, session_id, turns)
    if runs is not history.runs:
        _replace_runs(cur, session_id, runs)
    cur.execute(
        "UPDATE sessions SET updated_at = %s, rev = nextval('revs') WHERE id = %s",
        (now_ms(), session_id),
    )
    return "ok"


def _send_record(request_id: str, row: tuple[Any, ...], session_id: str) -> SendRequestRecord:
    result: Any = UNSET
    if row[2] is not None:
        result = _decode(
            row[2],
            Any,
            "send_requests",
            f"(session_id={preview(session_id)}, request_id={preview(request_id)})",
        )
    return SendRequestRecord(
        request_id=request_id, fingerprint=row[0], created_at=row[1], result=result
    )


def _schedule(row: tuple[Any, ...]) -> Schedule:
    schedule: Schedule = _decode(row[0], Schedule, "schedules", f"id={preview(row[1])}")
    last_fire = None
    if row[3] is not None:
        last_fire = _decode(
            row[3], ScheduleFire, "schedule_fires", f"schedule_id={preview(row[1])}"
        )
    return msgspec.structs.replace(schedule, next_fire_at=row[2], last_fire=last_fire)


# ---------------------------------------------------------------------------
# Connections


def _connection_lost(raw: _Connection, exc: psycopg.Error) -> bool:
    """Whether ``exc`` ended the server session (rather than failing one statement on it).

    libpq's own failures carry no SQLSTATE (a dead socket, a connection left
    in pipeline mode); class 08 is a connection exception.
    """
    state = exc.sqlstate
    return raw.closed or state is None or state.startswith("08") or state in _SERVER_GONE


def _reusable(raw: _Connection) -> bool:
    """Open, outside any transaction and out of pipeline mode: safe for the next operation."""
    pgconn = raw.pgconn
    return (
        not raw.closed
        and pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
        and pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )


class _QuietPsycopg(logging.Filter):
    """Drops psycopg's ``error ignored …`` warnings on threads running a store transaction.

    psycopg writes one whenever the rollback or pipeline exit that follows a
    lost connection fails too: one per failed operation, on top of the error
    the store handles. The store logs each outage once instead (:class:`_Outages`).
    """

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    @contextmanager
    def active(self) -> Iterator[None]:
        self._local.active = True
        try:
            yield
        finally:
            self._local.active = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            getattr(self._local, "active", False) and str(record.msg).startswith("error ignored")
        )


_QUIET: Final = _QuietPsycopg()


def _quiet_psycopg() -> None:
    for name in ("psycopg", "psycopg.transaction"):
        logging.getLogger(name).addFilter(_QUIET)  # once: ``addFilter`` skips a filter it has


@attrs.define
class _Outages:
    """A store's failure episodes: from the first lost connection (or failed connect) to the
    next operation that succeeds. Each is logged when it starts (``WARNING``) and when it
    ends (``INFO``), never once per operation. Shared by the store's connections (threads).
    """

    schema: str
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    count: int = 0
    since: float | None = None
    failed: int = 0

    def lost(self, conn: _Conn | None, exc: BaseException) -> None:
        """A connection failed (``conn``: one that had connected; ``None``: a connect).

        A connection opened before the latest episode began dies of that
        episode (a restart ends every server session, each noticed on its
        next use): no new episode.
        """
        with self.lock:
            if self.since is not None or (conn is not None and conn.opened_in < self.count):
                return
            self.count += 1
            self.since = time.monotonic()
            self.failed = 0
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _log.warning(
            "PostgreSQL store %r: server unavailable (%s); reconnecting on demand,"
            " not logged again until it answers",
            self.schema,
            reason,
        )

    def gave_up(self) -> None:
        """An operation failed with ``StoreUnavailableError`` during the current episode."""
        with self.lock:
            self.failed += 1

    def answered(self) -> None:
        """An operation succeeded: the episode under way, if any, is over."""
        if self.since is None:  # the common case, without the lock
            return
        with self.lock:
            if self.since is None:
                return
            down, failed = time.monotonic() - self.since, self.failed
            self.since = None
        _log.info(
            "PostgreSQL store %r: the server answers again after %.2f s"
            " (%d operations failed meanwhile)",
            self.schema,
            down,
            failed,
        )


@attrs.define
class _Conn:
    """One database connection, reconnected on demand, used by one thread at a time.

    A connection is reused only while :func:`_reusable`; any other is closed
    and replaced on next use.
    """

    dsn: str
    schema: str
    connect_timeout: float
    outages: _Outages
    limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))
    raw: _Connection | None = None
    connected: bool = False
    reconnects: int = 0
    opened_in: int = 0
    """``outages.count`` when this connection was opened."""

    def ensure(self) -> _Connection:
        if self.raw is not None and _reusable(self.raw):
            return self.raw
        self.discard()
        options: dict[str, Any] = {"connect_timeout": max(1, round(self.connect_timeout))}
        if "application_name" not in conninfo_to_dict(self.dsn):
            options["application_name"] = f"zidane_actors:{self.schema}"
        raw: _Connection = psycopg.connect(self.dsn, autocommit=True, **options)
        try:
            raw.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        except BaseException:
            raw.close()
            raise
        if self.connected:
            self.reconnects += 1
        self.connected = True
        self.opened_in = self.outages.count
        self.raw = raw
        return raw

    def discard(self) -> None:
        if self.raw is not None:
            self.raw.close()
            self.raw = None

    def discard_unless_reusable(self) -> None:
        if self.raw is not None and not _reusable(self.raw):
            self.discard()


CHANGES_CHANNEL: Final = "zidane_sessions"
"""The ``LISTEN`` channel of session changes: payload ``"<schema> <session id> <rev>"``.

``rev`` is ``0`` for a deleted session.
"""

_NOTIFY_SQL: Final = """
SELECT pg_advisory_xact_lock(hashtextextended('zidane_actors.notify.' || current_schema(), 0));
CREATE OR REPLACE FUNCTION notify_session_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('zidane_sessions', TG_TABLE_SCHEMA || ' ' || OLD.id || ' 0');
    ELSE
        PERFORM pg_notify('zidane_sessions', TG_TABLE_SCHEMA || ' ' || NEW.id || ' ' || NEW.rev);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER sessions_notify AFTER INSERT OR DELETE OR UPDATE OF rev ON sessions
    FOR EACH ROW EXECUTE FUNCTION notify_session_change();
"""
"""Make every change of a session's ``rev`` notify :data:`CHANGES_CHANNEL` (idempotent)."""

ChangeListener: TypeAlias = Callable[[str, int], None]
"""Told ``(session_id, rev)`` when another writer changed a session (``rev`` ``0``: deleted).

Changes made while the listening connection was down are never told: its
subscriber's ``on_resync`` is called instead once it listens again.
"""


@attrs.define(eq=False)
class _ChangeFeed:
    """A connection listening on :data:`CHANGES_CHANNEL`, telling listeners in the trio thread.

    Notifications are a hint: one sent while the connection was down is never
    replayed. So once a lost connection listens again, subscribers are told to
    resync (check the ``rev`` of what they hold), and readers keep checking
    ``rev`` themselves.
    """

    conn: _Conn
    token: trio.lowlevel.TrioToken
    listeners: dict[object, ChangeListener] = attrs.field(factory=dict)
    resync_listeners: dict[object, Callable[[], None]] = attrs.field(factory=dict)
    stopped: bool = False
    delivered: int = 0
    resyncs: int = 0
    """Times the connection listened again after a loss (each told subscribers to resync)."""

    def _deliver(self, payload: str) -> None:
        schema, _, rest = payload.partition(" ")
        session_id, _, rev = rest.partition(" ")
        if schema != self.conn.schema or not rev.isdigit():
            return
        self.delivered += 1
        for listener in list(self.listeners.values()):
            try:
                listener(session_id, int(rev))
            except Exception:
                _log.exception("a session change listener failed")

    def _resync(self) -> None:
        self.resyncs += 1
        for on_resync in list(self.resync_listeners.values()):
            try:
                on_resync()
            except Exception:
                _log.exception("a session change resync listener failed")

    def run(self) -> None:
        """Listen until :attr:`stopped` (runs in a worker thread; reconnects after a loss).

        Every ``LISTEN`` but the first follows a loss: subscribers resync once
        it is in place, so a change committed after that point is told and one
        committed before it is found by their ``rev`` checks.
        """
        listened = False
        while not self.stopped:
            try:
                raw = self.conn.ensure()
                raw.execute(f"LISTEN {CHANGES_CHANNEL}")
                if listened:
                    trio.from_thread.run_sync(self._resync, trio_token=self.token)
                listened = True
                while not self.stopped:
                    for note in raw.notifies(timeout=0.2):
                        trio.from_thread.run_sync(
                            self._deliver, note.payload, trio_token=self.token
                        )
            except (psycopg.OperationalError, psycopg.InterfaceError):
                self.conn.discard()
                time.sleep(0.2)  # the server is away: try again shortly
            except trio.RunFinishedError:
                return
        self.conn.discard()


@attrs.frozen
class PostgresStoreStatistics:
    """What :meth:`PostgresStore.statistics` reports."""

    schema: str
    connections: int
    idle_pooled: int
    retries: int
    reconnects: int
    batch_fallbacks: int
    """Batches rerun with savepoints because a write of the pipelined attempt failed."""
    outages: int
    """Failure episodes so far: from a lost connection to the next operation that succeeds."""
    resyncs: int
    """Times the change feed (``listen=True``) listened again after losing its connection,
    each telling subscribers to resync."""


@attrs.define(eq=False)
class PostgresStore:
    """A :class:`~zidane_actors.stores.FullSessionStore` and ``BatchingStore`` on PostgreSQL.

    Build it with :func:`open_postgres_store`. Beyond the protocol it offers
    :meth:`run_epoch`, the fencing token every successful :meth:`claim_run`
    increments.
    """

    _schema: str
    _writer: _Conn
    _pool: builtins.list[_Conn]
    _idle_send: trio.MemorySendChannel[_Conn]
    _idle_recv: trio.MemoryReceiveChannel[_Conn]
    _max_retries: int
    _outages: _Outages
    _closed: bool = False
    _retries: int = 0
    _fallbacks: int = 0
    _feed: _ChangeFeed | None = None

    def subscribe_changes(
        self, listener: ChangeListener, *, on_resync: Callable[[], None] | None = None
    ) -> Callable[[], None]:
        """Call ``listener(session_id, rev)`` in the trio thread for each session change.

        Only a store opened with ``listen=True`` reports anything (changes of
        every writer of the schema, this store's own included). It is a hint
        that makes caches refresh sooner, never a guarantee: a notification
        sent while the listening connection was down is lost. So once that
        connection listens again, ``on_resync()`` is called in the trio thread:
        the subscriber re-checks the ``rev`` of what it holds. Exceptions of
        either callback are logged. Answers the unsubscribe function.
        """
        token = object()
        feed = self._feed
        if feed is not None:
            feed.listeners[token] = listener
            if on_resync is not None:
                feed.resync_listeners[token] = on_resync

        def unsubscribe() -> None:
            if feed is not None:
                feed.listeners.pop(token, None)
                feed.resync_listeners.pop(token, None)

        return unsubscribe

    # -- plumbing --------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"PostgreSQL store on schema {self._schema!r} is closed")

    def _transact(self, conn: _Conn, op: Callable[[_Cursor], T], idempotent: bool) -> T:
        """Run ``op`` in one transaction, retrying transient failures a bounded number of times.

        Serialization failures and deadlocks roll back, so they are always
        retried; a lost connection is retried when ``op`` is idempotent or
        never started (``BEGIN`` failed). A connection that failed, or that an
        error left inside a transaction or in pipeline mode, is discarded: the
        next attempt (or operation) opens a fresh one.
        """
        with _QUIET.active():
            return self._attempts(conn, op, idempotent)

    def _attempts(self, conn: _Conn, op: Callable[[_Cursor], T], idempotent: bool) -> T:
        self._check_open()  # again: the store may have closed while this waited for ``conn``
        last: BaseException | None = None
        for attempt in range(self._max_retries + 1):
            if attempt:
                self._retries += 1
                time.sleep(_BACKOFF_S * 2 ** (attempt - 1))
            try:
                raw = conn.ensure()
            except psycopg.OperationalError as exc:
                self._outages.lost(None, exc)
                last = exc
                continue
            started = False
            try:
                with raw.transaction(), raw.cursor() as cur:
                    started = True
                    result = op(cur)
                self._outages.answered()
                return result
            except _TRANSIENT as exc:
                last = exc
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if not _connection_lost(raw, exc):
                    raise _map_error(exc) from None
                conn.discard()
                self._outages.lost(conn, exc)
                if started and not idempotent:
                    self._outages.gave_up()
                    raise StoreUnavailableError(
                        f"PostgreSQL connection lost during a non-idempotent write"
                        f" (its outcome is unknown): {exc}"
                    ) from exc
                last = exc
            except psycopg.Error as exc:
                raise _map_error(exc) from None
            finally:
                conn.discard_unless_reusable()
        self._outages.gave_up()
        raise StoreUnavailableError(
            f"PostgreSQL unavailable after {self._max_retries + 1} attempts: {last}"
        ) from last

    async def _batch(self, op: Callable[[_Cursor], T]) -> T:
        """Run a batch of writes on the batch connection (batches lock many rows: one at a
        time, so they cannot deadlock one another)."""
        self._check_open()
        return await trio.to_thread.run_sync(
            self._transact, self._writer, op, True, limiter=self._writer.limiter
        )

    async def _write(self, op: Callable[[_Cursor], T], *, idempotent: bool = True) -> T:
        """Run one write on any idle pooled connection (it locks at most one session row)."""
        self._check_open()
        async with self._pooled() as conn:
            return await trio.to_thread.run_sync(
                self._transact, conn, op, idempotent, limiter=conn.limiter
            )

    @asynccontextmanager
    async def _pooled(self) -> AsyncIterator[_Conn]:
        conn = await self._idle_recv.receive()
        try:
            yield conn
        finally:
            self._idle_send.send_nowait(conn)

    async def _read(self, op: Callable[[_Cursor], T]) -> T:
        self._check_open()
        async with self._pooled() as conn:
            return await trio.to_thread.run_sync(
                self._transact, conn, op, True, limiter=conn.limiter
            )

    def statistics(self) -> PostgresStoreStatistics:
        """Pool size, idle pooled connections, retries made, reconnects and feed resyncs so far."""
        conns = [self._writer, *(c for c in self._pool if c is not self._writer)]
        return PostgresStoreStatistics(
            schema=self._schema,
            connections=len(conns),
            idle_pooled=self._idle_send.statistics().current_buffer_used,
            retries=self._retries,
            reconnects=sum(c.reconnects for c in conns),
            batch_fallbacks=self._fallbacks,
            outages=self._outages.count,
            resyncs=self._feed.resyncs if self._feed is not None else 0,
        )

    async def aclose(self) -> None:
        """Close every connection once its current operation finished. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in {id(c): c for c in [self._writer, *self._pool]}.values():
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(conn.discard, limiter=conn.limiter)

    # -- required methods ------------------------------------------------

    async def load(self, session_id: str) -> SessionData | None:
        """The whole session in one statement (a consistent snapshot), or ``None``."""
        loaded = await self.load_versioned(session_id)
        return None if loaded is None else loaded[0]

    async def load_versioned(self, session_id: str) -> tuple[SessionData, int] | None:
        """The whole session and its ``rev`` in one statement, or ``None``."""
        validate_id(session_id)

        def op(cur: _Cursor) -> tuple[SessionData, int] | None:
            cur.execute(
                "SELECT created_at, updated_at, status, agent_id, project_root, metadata,"
                " run_owner::text,"
                f" (SELECT {_AGG} FROM turns WHERE session_id = s.id),"
                f" (SELECT {_AGG} FROM runs WHERE session_id = s.id), rev, extra"
                " FROM sessions s WHERE id = %s",
                (session_id,),
            )
            row = cur.fetchone()
            if row is None:
                return None
            data = SessionData(
                id=session_id,
                created_at=row[0],
                updated_at=row[1],
                status=row[2],
                agent_id=row[3],
                project_root=row[4],
                metadata=_metadata(row[5], session_id),
                run_owner=_owner(row[6], session_id),
                turns=_decode_list(cur, row[7], SessionTurn, "turns", session_id),
                runs=_decode_list(cur, row[8], SessionRun, "runs", session_id),
                extra_fields=None if row[10] is None else _extra(row[10], session_id),
            )
            return data, int(row[9])

        return await self._read(op)

    async def get_rev(self, session_id: str) -> int | None:
        """The session's ``rev`` (one indexed read), or ``None`` when absent."""
        validate_id(session_id)

        def op(cur: _Cursor) -> int | None:
            cur.execute(_SQL.rev, (session_id,))
            row = cur.fetchone()
            return None if row is None else int(row[0])

        return await self._read(op)

    async def save(self, data: SessionData, *, expected_rev: int | None = None) -> Revision:
        """Create or overwrite the whole document (turns and runs replaced).

        With ``expected_rev``, only while the stored ``rev`` is that one.
        """
        return await self._write(lambda cur: _save(cur, data, expected_rev=expected_rev))

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> Revision:
        """Append turns; a stored identical turn is skipped (a retry), a different one conflicts.

        Turns without a run go in one statement; if one of their ids is stored
        already (a retry, a conflict, a concurrent append), the append reruns in
        two steps that compare the stored rows.
        """
        unique, run = _checked_append(session_id, turns, options)
        if unique and run is None:
            try:
                return await self._write(lambda cur: _append_one(cur, session_id, unique))
            except _SlowPath:
                pass
        return await self._write(lambda cur: _append_turns(cur, session_id, turns, options))

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """Turns ``from_``… (at most ``limit``), oldest first; ``[]`` for an unknown id."""
        validate_id(session_id)
        checked_int(from_, "from_")
        if limit is not None:
            checked_int(limit, "limit")

        def op(cur: _Cursor) -> builtins.list[SessionTurn]:
            cur.execute(
                f"SELECT {_AGG} FROM (SELECT seq, body FROM turns"
                " WHERE session_id = %s AND seq >= %s ORDER BY seq LIMIT %s) t",
                (session_id, from_, limit),
            )
            row = cur.fetchone()
            return list(
                _decode_list(cur, row[0] if row else None, SessionTurn, "turns", session_id)
            )

        return await self._read(op)

    async def update_run(
        self, session_id: str, run: SessionRun, options: UpdateRunOptions | None = None
    ) -> Revision:
        """Upsert one run record; an unknown session id is a no-op."""
        return await self._write(lambda cur: _update_run(cur, session_id, run, options))

    async def update_status(
        self,
        session_id: str,
        status: SessionStatus,
        *,
        owner: RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> Revision:
        """Set the status; ``running`` records ``owner`` (default: this process)."""
        return await self._write(
            lambda cur: _update_status(
                cur, session_id, status, owner=owner, preserve_updated_at=preserve_updated_at
            )
        )

    async def delete(self, session_id: str) -> None:
        """Delete a session with its turns, runs, artifacts and send-request ids."""
        await self._write(lambda cur: _delete(cur, session_id))

    async def list(self, filter: SessionFilter | None = None) -> builtins.list[str]:
        """Session ids, most recently updated first, filtered."""
        tail, params = _session_where(filter)

        def op(cur: _Cursor) -> builtins.list[str]:
            cur.execute(_SQL.list_ids + tail, params)
            return [row[0] for row in cur.fetchall()]

        return await self._read(op)

    # -- batching --------------------------------------------------------

    async def apply_writes(
        self, writes: Sequence[StoreWrite]
    ) -> builtins.list[outcome.Outcome[Any]]:
        """Apply ``writes`` in one transaction, in order; a failing write fails alone.

        The batch first runs without savepoints, each run of plain appends as
        one statement (retries skipped, appends to unknown sessions failing
        alone) and other writes pipelined; if any other write fails, or a turn
        id is stored with other text, that attempt is rolled back and the batch
        reruns with each write in its own savepoint.
        """

        def fast(cur: _Cursor) -> builtins.list[outcome.Outcome[Any]]:
            return _pipelined_writes(cur.connection, writes)

        def savepoints(cur: _Cursor) -> builtins.list[outcome.Outcome[Any]]:
            conn = cur.connection
            results: builtins.list[outcome.Outcome[Any]] = []
            for write in writes:
                fn = _WRITES.get(write.method) if isinstance(write, StoreWrite) else None
                if fn is None:
                    results.append(
                        outcome.Error(
                            UnsupportedOperationError(
                                f"{preview(getattr(write, 'method', type(write).__name__))}"
                                " is not a batchable write"
                            )
                        )
                    )
                    continue
                try:
                    with conn.transaction():
                        value = fn(cur, *write.args, **write.kwargs)
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    raise
                except Exception as exc:
                    results.append(outcome.Error(_map_error(exc)))
                else:
                    results.append(outcome.Value(value))
            return results

        try:
            try:
                return await self._batch(fast)
            except _SlowPath:
                self._fallbacks += 1
                return await self._batch(savepoints)
        except StoreError as exc:
            return [outcome.Error(exc) for _ in writes]

    # -- optional methods ------------------------------------------------

    async def run_epoch(self, session_id: str) -> int | None:
        """The session's lease epoch (bumped by every claim), or ``None`` for an unknown id.

        A run holder passes it along with its writes so a later claimant can
        fence off a holder that lost its claim.
        """
        validate_id(session_id)

        def op(cur: _Cursor) -> int | None:
            cur.execute(_SQL.run_epoch, (session_id,))
            row = cur.fetchone()
            return None if row is None else int(row[0])

        return await self._read(op)

    async def claim_run(
        self, session_id: str, *, stale_at: int, owner: RunOwner | None = None
    ) -> RunClaim:
        """Set ``running`` under a row lock unless a live owner holds it; bumps ``run_epoch``."""
        validate_id(session_id)
        checked_int(stale_at, "stale_at")
        claimant = current_run_owner() if owner is None else checked(owner, RunOwner, "run owner")

        def op(cur: _Cursor) -> RunClaim:
            header = _lock_header(cur, session_id)
            if header is None:
                return RunClaim(claimed=True)
            status, owner_text, updated_at = header[0], header[1], header[2]
            now = now_ms()
            stored_owner = _owner(owner_text, session_id)
            if run_claim_blocked(status, stored_owner, updated_at, stale_at, now):
                return RunClaim(claimed=False)
            cur.execute(
                "UPDATE sessions SET status = 'running', run_owner = %s::jsonb, updated_at = %s,"
                " run_epoch = run_epoch + 1, rev = nextval('revs') WHERE id = %s",
                (_json(claimant, "run owner"), now, session_id),
            )
            return RunClaim(claimed=True, previous=status)

        return await self._write(op, idempotent=False)

    async def demote_stale_run(self, session_id: str, *, stale_at: int, now: int) -> bool:
        """Write a load's stale-running demotion under the row lock, only if still stale.

        The marker is re-read with ``FOR UPDATE`` and judged by
        ``run_claim_blocked``; the update also names the ``run_epoch`` it read,
        so a marker claimed since is never overwritten. ``updatedAt`` is kept.
        """
        validate_id(session_id)
        checked_int(stale_at, "stale_at")
        checked_int(now, "now")

        def op(cur: _Cursor) -> bool:
            cur.execute(
                "SELECT status, run_owner::text, updated_at, run_epoch"
                " FROM sessions WHERE id = %s FOR UPDATE",
                (session_id,),
            )
            row = cur.fetchone()
            if row is None:
                return False
            status, owner_text, updated_at, epoch = row
            if run_claim_blocked(status, _owner(owner_text, session_id), updated_at, stale_at, now):
                return False
            cur.execute("SELECT id, body FROM runs WHERE session_id = %s", (session_id,))
            runs = [
                _decode(body, SessionRun, "runs", f"id={preview(rid)}")
                for rid, body in cur.fetchall()
            ]
            running = [r for r in runs if r.status == "running"]
            if status != "running" and not running:
                return False
            cur.execute(
                "UPDATE sessions SET status = CASE WHEN status = 'running' THEN 'idle'"
                " ELSE status END, run_owner = CASE WHEN status = 'running' THEN NULL"
                " ELSE run_owner END, rev = nextval('revs') WHERE id = %s AND run_epoch = %s",
                (session_id, epoch),
            )
            if running:
                cur.executemany(
                    _SQL.update_run,
                    [
                        (
                            _json(msgspec.structs.replace(r, status="aborted"), "run"),
                            session_id,
                            r.id,
                        )
                        for r in running
                    ],
                )
            return True

        return await self._write(op)

    async def claim_schedule_fire(self, id: str, due_at: int, next: int | None) -> bool:
        """Move ``nextFireAt`` from ``due_at`` to ``next`` if enabled: one winner across hosts."""
        validate_id(id, what="schedule id")
        checked_int(due_at, "due_at")
        if next is not None:
            checked_int(next, "next")

        def op(cur: _Cursor) -> bool:
            cur.execute(
                "UPDATE schedules SET next_fire_at = %s"
                " WHERE id = %s AND enabled AND next_fire_at = %s RETURNING 1",
                (next, id, due_at),
            )
            return cur.fetchone() is not None

        return await self._write(op, idempotent=False)

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> SendRequestClaim:
        """Insert the request id or answer the record holding it; keeps the newest ids only.

        The session must exist (:class:`SessionNotFoundError`).
        """
        validate_id(session_id)
        validate_request_id(request_id, what="request id")
        if not isinstance(fingerprint, str):
            raise ValidationError(f"fingerprint must be a string, got {type(fingerprint).__name__}")

        def op(cur: _Cursor) -> SendRequestClaim:
            _held_for_send(cur, session_id)
            cur.execute(
                "INSERT INTO send_requests (session_id, request_id, fingerprint, created_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING seq",
                (session_id, request_id, fingerprint, now_ms()),
            )
            inserted = cur.fetchone()
            if inserted is None:
                cur.execute(
                    "SELECT fingerprint, created_at, result FROM send_requests"
                    " WHERE session_id = %s AND request_id = %s",
                    (session_id, request_id),
                )
                row = cur.fetchone()
                assert row is not None
                return SendRequestClaim(
                    claimed=False, record=_send_record(request_id, row, session_id)
                )
            cur.execute("SELECT count(*) FROM send_requests WHERE session_id = %s", (session_id,))
            count = cur.fetchone()
            if count is not None and count[0] > _SEND_REQUEST_HISTORY:
                cur.execute(
                    "SELECT request_id, fingerprint, created_at FROM send_requests"
                    " WHERE session_id = %s AND seq <> %s ORDER BY seq",
                    (session_id, inserted[0]),
                )
                others = [
                    SendRequestRecord(request_id=r[0], fingerprint=r[1], created_at=r[2])
                    for r in cur.fetchall()
                ]
                cur.execute(
                    "DELETE FROM send_requests WHERE session_id = %s AND request_id = ANY(%s)",
                    (session_id, send_request_evictions(others)),
                )
            return SendRequestClaim(claimed=True)

        return await self._write(op, idempotent=False)

    async def find_send_request(self, session_id: str, request_id: str) -> SendRequestRecord | None:
        """The record of a claimed request id, or ``None``."""
        validate_id(session_id)
        validate_request_id(request_id, what="request id")

        def op(cur: _Cursor) -> SendRequestRecord | None:
            cur.execute(
                "SELECT fingerprint, created_at, result FROM send_requests"
                " WHERE session_id = %s AND request_id = %s",
                (session_id, request_id),
            )
            row = cur.fetchone()
            return None if row is None else _send_record(request_id, row, session_id)

        return await self._read(op)

    async def settle_send_request(
        self, session_id: str, request_id: str, result: JsonValue
    ) -> None:
        """Store a claimed send's result; ``None`` drops the claim; unknown ids are a no-op."""
        await self._write(lambda cur: _settle_send_request(cur, session_id, request_id, result))

    async def list_send_requests(self, session_id: str) -> builtins.list[SendRequestRecord]:
        """Every request id the session holds, oldest claim first (for copies and exports)."""
        validate_id(session_id)

        def op(cur: _Cursor) -> builtins.list[SendRequestRecord]:
            cur.execute(
                _SQL.list_sends,
                (session_id,),
            )
            return [_send_record(row[0], row[1:], session_id) for row in cur.fetchall()]

        return await self._read(op)

    async def put_send_request(self, session_id: str, record: SendRequestRecord) -> None:
        """Store ``record`` exactly as given (a copy or an import), replacing its id's record."""
        validate_id(session_id)
        record = checked(record, SendRequestRecord, "send request")
        validate_request_id(record.request_id, what="send request id")
        result = None if record.result is UNSET else _json(record.result, "send result")

        def op(cur: _Cursor) -> None:
            _held_for_send(cur, session_id)
            cur.execute(
                _SQL.delete_send,
                (session_id, record.request_id),
            )
            cur.execute(
                "SELECT request_id, fingerprint, created_at FROM send_requests"
                " WHERE session_id = %s ORDER BY seq",
                (session_id,),
            )
            others = [
                SendRequestRecord(request_id=r[0], fingerprint=r[1], created_at=r[2])
                for r in cur.fetchall()
            ]
            cur.execute(
                "DELETE FROM send_requests WHERE session_id = %s AND request_id = ANY(%s)",
                (session_id, send_request_evictions(others)),
            )
            cur.execute(
                _SQL.put_send,
                (session_id, record.request_id, record.fingerprint, record.created_at, result),
            )

        await self._write(op, idempotent=False)

    async def generate_session_id(self) -> str:
        """A UUID from the server's ``gen_random_uuid()``."""
        return await self._read(_gen_uuid)

    async def generate_turn_id(self) -> str:
        """A UUID from the server's ``gen_random_uuid()``."""
        return await self._read(_gen_uuid)

    async def get_meta(self, session_id: str) -> SessionMetaRow | None:
        """One session's summary row, answered from the header and indexes."""
        validate_id(session_id)

        def op(cur: _Cursor) -> SessionMetaRow | None:
            cur.execute(_META_SELECT + " WHERE s.id = %s", (session_id,))
            row = cur.fetchone()
            return None if row is None else _meta_row(row)

        return await self._read(op)

    async def list_meta(self, filter: SessionFilter | None = None) -> builtins.list[SessionMetaRow]:
        """Session summaries, most recently updated first, in one query."""
        tail, params = _session_where(filter)

        def op(cur: _Cursor) -> builtins.list[SessionMetaRow]:
            cur.execute(_META_SELECT + tail, params)
            return [_listed_row(row) for row in cur.fetchall()]

        return await self._read(op)

    async def search_meta(self, search: SessionSearch) -> SessionSearchPage:
        """Sessions matching ``search`` (words found through GIN indexes), a page and a count.

        The count stops at ``countLimit + 1`` matches, so it costs at most that many rows.
        A search for words first computes the words of the turns written since the last
        one (writes leave them to it), so it finds every turn stored before it began,
        but for one being rewritten or deleted at that very moment.
        """
        search = checked(search, SessionSearch, "session search")
        where, params = _search_where(search)
        order = "s.created_at" if search.order == "created" else "s.updated_at"
        words = bool(search_words(search.text or ""))

        def op(cur: _Cursor) -> SessionSearchPage:
            # The page's ids first, so the per-row subqueries run for its rows only.
            cur.execute(
                f"{_META_SELECT} WHERE s.id IN (SELECT s.id FROM sessions s{where}"
                f' ORDER BY {order} DESC, s.id COLLATE "C" LIMIT %s OFFSET %s)'
                f' ORDER BY {order} DESC, s.id COLLATE "C"',
                [*params, search.limit, search.offset],
            )
            rows = tuple(_listed_row(row) for row in cur.fetchall())
            cur.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM sessions s{where} LIMIT %s) m",
                [*params, search.count_limit + 1],
            )
            counted = cur.fetchone()
            found = int(counted[0]) if counted is not None else 0
            return SessionSearchPage(
                rows=rows,
                total=min(found, search.count_limit),
                total_exact=found <= search.count_limit,
            )

        if words:
            await self._write(lambda cur: cur.execute(SEARCH_CATCH_UP))
        return await self._read(op)

    async def save_meta(
        self,
        data: SessionData,
        options: SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision:
        """Persist the header and upsert the snapshot's runs; turns are never touched."""
        return await self._write(
            lambda cur: _save_meta(cur, data, options, expected_rev=expected_rev)
        )

    async def patch_meta(self, session_id: str, patch: Mapping[str, JsonValue]) -> Revision:
        """Merge ``patch`` into stored metadata under a row lock; unknown ids are a no-op."""
        return await self._write(lambda cur: _patch_meta(cur, session_id, patch))

    async def _mutate_versioned(
        self,
        session_id: str,
        mutate: HistoryMutation,
        *,
        runs_too: bool,
        expected_rev: int | None,
        on_revision: RevisionSink | None,
    ) -> MutateResult:
        result: list[MutateResult] = []

        def op(cur: _Cursor) -> Revision:
            result[:] = [_mutate(cur, session_id, mutate, runs_too=runs_too)]
            return Revision(0, 0)

        revision = await self._write(
            lambda cur: _versioned(cur, session_id, expected_rev, lambda: op(cur)),
            idempotent=False,
        )
        if on_revision is not None and revision.before:
            on_revision(revision)
        return result[0]

    async def mutate_history(
        self,
        session_id: str,
        mutate: HistoryMutation,
        *,
        expected_rev: int | None = None,
        on_revision: RevisionSink | None = None,
    ) -> MutateResult:
        """Read, rewrite and store turns and runs in one transaction holding the row lock.

        With ``expected_rev``, only while the stored ``rev`` is that one.
        """
        return await self._mutate_versioned(
            session_id, mutate, runs_too=True, expected_rev=expected_rev, on_revision=on_revision
        )

    async def mutate_turns(
        self,
        session_id: str,
        mutate: TurnsMutation,
        *,
        expected_rev: int | None = None,
        on_revision: RevisionSink | None = None,
    ) -> MutateResult:
        """Deprecated turns-only form of :meth:`mutate_history`."""
        warn_mutate_turns()

        def on_history(history: SessionHistory) -> SessionHistory | None:
            turns = mutate(history.turns)
            if turns is None:
                return None
            return SessionHistory(
                turns=checked_items(turns, SessionTurn, "turns"), runs=history.runs
            )

        return await self._mutate_versioned(
            session_id,
            on_history,
            runs_too=False,
            expected_rev=expected_rev,
            on_revision=on_revision,
        )

    async def upsert_artifact(self, artifact: SessionArtifact) -> SessionArtifact | None:
        """Upsert on ``(sessionId, kind, uri)``; unknown sessions answer ``None``."""
        return await self._write(lambda cur: _upsert_artifact(cur, artifact))

    async def delete_artifact(self, session_id: str, artifact_id: str) -> None:
        """Remove one artifact; unknown ids are a no-op."""
        await self._write(lambda cur: _delete_artifact(cur, session_id, artifact_id))

    async def list_artifacts(
        self, filter: ArtifactFilter | None = None
    ) -> builtins.list[SessionArtifact]:
        """Artifacts, newest first, filtered in SQL and ordered like ``filter_artifacts``."""
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        if filter is not None:
            filter = checked(filter, ArtifactFilter, "artifact filter")
            check_artifact_filter_ids(filter)
            for column, value in (
                ("session_id", filter.session_id),
                ("kind", filter.kind),
                ("uri", filter.uri),
            ):
                equal_sql(clauses, params, column, value, POSTGRES.placeholder)
            if filter.since is not None:
                clauses.append("updated_at >= %s")
                params.append(filter.since)
            if filter.project_root is None:
                clauses.append("project_root IS NULL")
            else:
                equal_sql(
                    clauses, params, "project_root", filter.project_root, POSTGRES.placeholder
                )
        query = "SELECT body, session_id, id FROM artifacts"
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        query += ' ORDER BY updated_at DESC, id COLLATE "C"'
        if filter is not None and filter.limit is not None:
            query += " LIMIT %s"
            params.append(filter.limit)

        def op(cur: _Cursor) -> builtins.list[SessionArtifact]:
            cur.execute(query, params)
            return filter_artifacts((_artifact_row(row) for row in cur.fetchall()), filter)

        return await self._read(op)

    async def save_schedule(self, schedule: Schedule, *, keep_next_fire_at: bool = False) -> None:
        """Create or replace a schedule; ``keep_next_fire_at`` keeps a stored ``nextFireAt``."""
        schedule = checked(schedule, Schedule, "schedule")
        validate_id(schedule.id, what="schedule id")
        body = _json(msgspec.structs.replace(schedule, last_fire=None), "schedule")

        def op(cur: _Cursor) -> None:
            cur.execute(
                _SQL.save_schedule,
                (
                    schedule.id,
                    schedule.enabled,
                    schedule.next_fire_at,
                    schedule.created_at,
                    body,
                    keep_next_fire_at,
                ),
            )

        await self._write(op)

    async def delete_schedule(self, id: str) -> bool:
        """Remove a schedule and its fires; ``False`` when it was gone."""
        validate_id(id, what="schedule id")

        def op(cur: _Cursor) -> bool:
            cur.execute("DELETE FROM schedules WHERE id = %s RETURNING 1", (id,))
            found = cur.fetchone() is not None
            cur.execute(_SQL.delete_fires, (id,))
            return found

        return await self._write(op, idempotent=False)

    async def list_schedules(self) -> builtins.list[Schedule]:
        """Every schedule with its newest fire, oldest first."""

        def op(cur: _Cursor) -> builtins.list[Schedule]:
            cur.execute(
                "SELECT s.body, s.id, s.next_fire_at, (SELECT f.body FROM schedule_fires f"
                " WHERE f.schedule_id = s.id ORDER BY f.fired_at DESC, f.seq DESC LIMIT 1)"
                ' FROM schedules s ORDER BY s.created_at, s.id COLLATE "C"'
            )
            return [_schedule(row) for row in cur.fetchall()]

        return await self._read(op)

    async def record_schedule_fire(self, fire: ScheduleFire) -> None:
        """Store a fire, keeping the newest ``FIRE_HISTORY`` per schedule."""
        fire = checked(fire, ScheduleFire, "schedule fire")
        check_fire_ids(fire)
        body = _json(fire, "schedule fire")

        def op(cur: _Cursor) -> None:
            cur.execute(_SQL.schedule_exists, (fire.schedule_id,))
            if cur.fetchone() is None:
                return
            cur.execute(
                _SQL.delete_fire,
                (fire.schedule_id, fire.id),
            )
            cur.execute(
                _SQL.insert_fire,
                (fire.schedule_id, fire.id, fire.fired_at, body),
            )
            cur.execute(
                "DELETE FROM schedule_fires WHERE schedule_id = %s AND seq IN"
                " (SELECT seq FROM schedule_fires WHERE schedule_id = %s"
                "  ORDER BY fired_at DESC, seq DESC OFFSET %s)",
                (fire.schedule_id, fire.schedule_id, FIRE_HISTORY),
            )

        await self._write(op)

    async def list_schedule_fires(
        self, schedule_id: str, limit: int
    ) -> builtins.list[ScheduleFire]:
        """A schedule's fires, newest first."""
        validate_id(schedule_id, what="schedule id")
        count = checked_int(limit, "limit")

        def op(cur: _Cursor) -> builtins.list[ScheduleFire]:
            cur.execute(
                "SELECT body, id FROM schedule_fires WHERE schedule_id = %s"
                " ORDER BY fired_at DESC, seq DESC LIMIT %s",
                (schedule_id, count),
            )
            return [
                _decode(
                    row[0],
                    ScheduleFire,
                    "schedule_fires",
                    f"(schedule_id={preview(schedule_id)}, id={preview(row[1])})",
                )
                for row in cur.fetchall()
            ]

        return await self._read(op)


def _gen_uuid(cur: _Cursor) -> str:
    cur.execute("SELECT gen_random_uuid()::text")
    row = cur.fetchone()
    assert row is not None
    return str(row[0])


@contextmanager
def _opened(conns: Sequence[_Conn]) -> Iterator[None]:
    try:
        yield
    except BaseException:
        for conn in conns:
            conn.discard()
        raise


def _connect_all(conns: Sequence[_Conn], migrate_on: _Conn) -> None:
    with _opened(conns):
        try:
            for conn in conns:
                conn.ensure()
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
        raw = migrate_on.ensure()
        try:
            migrate(raw, migrate_on.schema)
        except psycopg.Error as exc:
            raise _map_error(exc) from None


@asynccontextmanager
async def open_postgres_store(
    dsn: str,
    *,
    schema: str = "zidane",
    pool_size: int = 4,
    connect_timeout: float = 10.0,
    retries: int = 3,
    listen: bool = False,
) -> AsyncIterator[PostgresStore]:
    """Open (creating or migrating) the store held in PostgreSQL schema ``schema``.

    ``pool_size`` connections are opened: one for batches of writes
    (:meth:`PostgresStore.apply_writes`), the rest for reads and single
    writes (with ``pool_size=1`` everything shares one connection). Transient failures are
    retried ``retries`` times for operations that are safe to repeat, then
    raise :class:`~zidane_actors.errors.StoreUnavailableError`. The store is
    closed on exit.

    ``listen=True`` installs a trigger that notifies :data:`CHANGES_CHANNEL`
    on every session change (every writer of the schema pays a ``NOTIFY``
    per write from then on) and opens one more connection listening to it,
    so :meth:`PostgresStore.subscribe_changes` reports other hosts' writes
    (a host refreshes its cached sessions with it); when that connection is
    lost it reconnects and tells subscribers to resync.
    """
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise InvalidNameError(f"schema name {preview(schema)} must match [a-z_][a-z0-9_]{{0,62}}")
    if type(pool_size) is not int or pool_size < 1:
        raise ValidationError(f"pool_size must be an integer >= 1, got {preview(pool_size)}")
    if type(retries) is not int or retries < 0:
        raise ValidationError(f"retries must be an integer >= 0, got {preview(retries)}")
    _quiet_psycopg()
    outages = _Outages(schema)
    writer = _Conn(dsn, schema, connect_timeout, outages)
    pooled = [_Conn(dsn, schema, connect_timeout, outages) for _ in range(pool_size - 1)] or [
        writer
    ]
    conns = [writer, *(c for c in pooled if c is not writer)]
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(_connect_all, conns, writer)
    idle_send, idle_recv = trio.open_memory_channel[_Conn](len(pooled))
    for conn in pooled:
        idle_send.send_nowait(conn)
    store = PostgresStore(
        schema=schema,
        writer=writer,
        pool=pooled,
        idle_send=idle_send,
        idle_recv=idle_recv,
        max_retries=retries,
        outages=outages,
    )
    if not listen:
        try:
            yield store
        finally:
            await store.aclose()
        return
    feed = _ChangeFeed(
        _Conn(dsn, schema, connect_timeout, _Outages(schema)), trio.lowlevel.current_trio_token()
    )
    try:
        await store._write(lambda cur: cur.execute(_NOTIFY_SQL.encode()), idempotent=True)
        store._feed = feed
        async with open_service_nursery() as nursery:
            nursery.start_soon(functools.partial(trio.to_thread.run_sync, feed.run))
            try:
                yield store
            finally:
                feed.stopped = True
    finally:
        await store.aclose()
