"""The SQLite session store: the embedded default, safe for many processes on one file.

Every operation runs on one ``sqlite3`` connection owned by one worker
thread for the store's whole life (``_thread.WorkerThread``: FIFO, a caller
cancelled before its job is taken withdraws it), inside one
transaction: ``BEGIN IMMEDIATE`` for writes (so two processes never both
read-then-write), a deferred ``BEGIN`` for reads (a consistent WAL
snapshot). ``SQLITE_BUSY`` waits ``busy_timeout_ms`` inside SQLite, then is
retried with backoff; only an exhausted retry budget surfaces, as
:class:`~zidane_actors.errors.StoreUnavailableError`.
"""

from __future__ import annotations

import builtins
import functools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, TypeAlias, TypeVar, cast

import attrs
import msgspec
import outcome
import trio
from msgspec import UNSET

from ..errors import (
    ConflictError,
    CorruptDataError,
    SessionNotFoundError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnsupportedOperationError,
    ValidationError,
)
from ..model import (
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
    check_model,
    check_unique_turn_ids,
    corrupt_meta_row,
    current_run_owner,
    decode,
    decoder,
    encode,
    extra_json,
    filter_artifacts,
    fresh_turns,
    merge_artifact,
    merge_session_metadata,
    new_id,
    normalize_artifact,
    parse_json,
    patch_metadata,
    preview,
    run_claim_blocked,
    search_words,
    select_artifact_evictions,
    send_request_evictions,
    snapshot_status,
    validate_id,
    validate_request_id,
)
from ..model._checked import CheckedTurns
from ..model._codec import encode_checked
from ._protocol import (
    WRITE_METHODS,
    HistoryMutation,
    MutateResult,
    Revision,
    RevisionSink,
    RunClaim,
    StoreWrite,
    TurnsMutation,
    stale,
)
from ._sqlite_schema import SEARCH_CATCH_UP, migrate, refuse_foreign
from ._thread import WorkerThread, start_worker_thread
from ._validate import (
    check_artifact_filter_ids,
    check_artifact_ids,
    check_fire_ids,
    checked,
    checked_header,
    checked_int,
    checked_status,
    warn_mutate_turns,
)
from .sql import SQLITE, SharedSQL, search_header_sql, session_filter_sql

__all__ = ["Durability", "SQLiteStore", "SQLiteStoreStatistics", "open_sqlite_store"]

T = TypeVar("T")

Durability: TypeAlias = Literal["full", "normal", "off"]
"""How hard a commit is pushed to disk (``PRAGMA synchronous`` under WAL).

- ``"full"``: every commit fsyncs the WAL; an acknowledged write survives a
  process crash and a power loss.
- ``"normal"``: survives a process crash (``kill -9``); a power loss or OS
  crash may drop the last commits, never corrupting the file.
- ``"off"``: no fsync; survives a process crash only; a power loss or OS
  crash may drop recent commits or corrupt the database.
"""

_SQL: Final = SharedSQL(SQLITE)

_SYNCHRONOUS: Final = {"full": "FULL", "normal": "NORMAL", "off": "OFF"}
_BUSY_CODES: Final = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED
_CORRUPT_CODES: Final = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB

_Conn: TypeAlias = sqlite3.Connection

_AppendPlan: TypeAlias = tuple[str, list[tuple[str, str, str, bytes]], SessionRun | None]

_BUMP: Final = "UPDATE sessions SET rev = rev + 1, updated_at = ? WHERE id = ?"
# The next seq is read per row, so rows inserted by one executemany follow each other.
# A turn id the session holds already is skipped here; the caller compares its row.
_APPEND_TURN: Final = (
    "INSERT INTO turns (session_id, seq, id, role, body) VALUES"
    " (?1, (SELECT COALESCE(MAX(seq), -1) + 1 FROM turns WHERE session_id = ?1), ?2, ?3, ?4)"
    " ON CONFLICT (session_id, id) DO NOTHING"
)


def _primary_code(exc: sqlite3.Error) -> int:
    """The primary result code of ``exc`` (``SQLITE_BUSY`` for ``SQLITE_BUSY_RECOVERY``…)."""
    return int(getattr(exc, "sqlite_errorcode", 0)) & 0xFF


def _now() -> int:
    return time.time_ns() // 1_000_000


_TURN: Final = decoder(SessionTurn)
_METADATA: Final = decoder(dict[str, Any])
# The connection's page cache (KiB, negative): loads of long sessions re-read
# their pages from it rather than through the OS (SQLite's default is 2 MiB).
_CACHE_KIB: Final = 65_536


class _Busy(Exception):
    """Internal: the database stayed locked past the busy timeout."""


@attrs.frozen
class SQLiteStoreStatistics:
    """Counters of one open store (``SQLiteStore.statistics()``)."""

    path: str
    transactions: int
    busy_retries: int
    tasks_waiting: int


def _decode_row(raw: bytes | str, type_: type[T], table: str, session_id: str, where: str) -> T:
    try:
        value: T = (_TURN if type_ is SessionTurn else decoder(cast(Hashable, type_))).decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        reason = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise CorruptDataError(
            f"table {table}: row of session {preview(session_id)}"
            f" at {where} does not decode: {reason}"
        ) from None
    return value


# A turn row holds the turn's id and role in its columns only: its body is the rest of
# the turn's JSON, ``{"content":…}`` (schema v9). A body that starts with the id is a whole
# turn: a row written before v9, or a turn whose JSON does not start with its id and role.
_WHOLE: Final = b'{"id":'
_json_text: Final = msgspec.json.Encoder().encode


def _row_body(body: bytes, turn_id: str, role: str) -> bytes:
    """The body a row stores for the turn whose JSON is ``body``: without its id and role."""
    head = b'{"id":%s,"role":%s,' % (_json_text(turn_id), _json_text(role))
    return b"{" + body[len(head) :] if body.startswith(head) else body


def _turn_json(turn_id: str, role: str, body: bytes | str) -> bytes:
    """The whole JSON of the turn a row holds (a body given as text is read as UTF-8)."""
    if type(body) is not bytes:  # another program's value: text is read, anything else refused
        body = body.encode() if isinstance(body, str) else b""
    if body.startswith(_WHOLE):
        return body
    return b'{"id":%s,"role":%s,%s' % (_json_text(turn_id), _json_text(role), body[1:])


def _decode_turns(
    session_id: str, rows: Sequence[tuple[int, str, str, bytes]]
) -> tuple[SessionTurn, ...]:
    """Decode turn rows (``seq, id, role, body``); name a bad row's seq.

    Each body is decoded as its own document, so a row holding two
    (``{...},{...}``) is refused rather than read as two turns.
    """
    decode_turn = _TURN.decode
    try:
        return tuple(
            [
                decode_turn(body if body.startswith(_WHOLE) else _turn_json(tid, role, body))
                for _, tid, role, body in rows
            ]
        )
    except (
        msgspec.ValidationError,
        msgspec.DecodeError,
        RecursionError,
        TypeError,
        AttributeError,
    ):
        pass
    return tuple(
        _decode_row(_turn_json(tid, role, body), SessionTurn, "turns", session_id, f"seq {seq}")
        for seq, tid, role, body in rows
    )


def _decode_metadata(raw: str, session_id: str) -> dict[str, Any]:
    if raw == "{}":
        return {}
    try:  # the decoder held, not looked up: this runs for every row list_meta answers
        metadata: dict[str, Any] = _METADATA.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return _decode_row(raw, dict[str, Any], "sessions", session_id, "column metadata")
    return metadata


def _decode_extra(raw: str | None, session_id: str) -> ExtraFields | None:
    if raw is None:
        return None
    return ExtraFields(
        _decode_row(raw.encode(), dict[str, Any], "sessions", session_id, "column extra")
    )


def _decode_owner(raw: str | None, session_id: str) -> RunOwner | None:
    if raw is None:
        return None
    return _decode_row(raw.encode(), RunOwner, "sessions", session_id, "column run_owner")


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    if not isinstance(metadata, Mapping):
        raise ValidationError("session metadata must be a mapping with string keys")
    kept = {k: v for k, v in metadata.items() if v is not UNSET}
    check_json(kept, what="session metadata", path="$.metadata")
    try:
        return encode_checked(kept).decode()
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"session metadata is not JSON-serializable: {exc}") from None


def _valid_body(value: object, type_: type[T], what: str, path: str = "$") -> bytes:
    """``value`` encoded, after checking it decodes back as ``type_`` (constraints, tags)."""
    if type(value) is not type_ and not isinstance(value, type_):
        raise ValidationError(f"{what} must be a {type_.__name__}, got {type(value).__name__}")
    check_model(value, what=what, path=path)
    try:
        body = encode_checked(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"{what} is not JSON-serializable: {exc}") from None
    decode(body, type_, what=what)
    return body


def _valid_header(data: object) -> SessionData:
    """``data`` with its header fields checked (turns and runs are checked one by one)."""
    data = checked_header(data)
    metadata = parse_json(_metadata_json(data.metadata))
    header = msgspec.structs.replace(data, metadata=metadata, turns=(), runs=())
    _valid_body(header, SessionData, "session data")
    return data


def _turn_rows_of(
    turns: object, start: int, where: str = "$"
) -> builtins.list[tuple[int, str, str, bytes]]:
    """Validated ``(seq, id, role, body)`` rows for ``turns`` numbered from ``start``.

    ``where`` locates ``turns`` in the caller's argument (``$.turns`` in a save).
    Turn ids must be distinct (``check_unique_turn_ids``). A ``CheckedTurns``
    was checked already: its rows take its bodies.
    """
    if type(turns) is CheckedTurns:
        pairs = enumerate(zip(turns, turns.bodies, strict=True), start)
        return [(seq, t.id, t.role, body) for seq, (t, body) in pairs]
    # Lists and tuples first: the Sequence ABC check is slow on this hot path.
    if not isinstance(turns, (list, tuple)) and (
        isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence)
    ):
        raise ValidationError(
            f"turns must be a sequence of SessionTurn, got {type(turns).__name__}"
        )
    rows = []
    for i, turn in enumerate(turns):
        body = _valid_body(turn, SessionTurn, f"turn {i}", f"{where}[{i}]")
        validate_id(turn.id, what=f"turn id at $[{i}]")
        rows.append((start + i, turn.id, turn.role, body))
    check_unique_turn_ids(cast(Sequence[SessionTurn], turns), path=where)
    return rows


def _run_body(run: object) -> bytes:
    body = _valid_body(run, SessionRun, "run")
    assert isinstance(run, SessionRun)
    validate_id(run.id, what="run id")
    return body


def _owner_json(owner: RunOwner) -> str:
    return _valid_body(owner, RunOwner, "run owner").decode()


def _session_id(value: object) -> str:
    return validate_id(value, what="session id")


class SQLiteStore:
    """A :class:`~zidane_actors.stores.FullSessionStore` on one SQLite file.

    Create it with :func:`open_sqlite_store`. Besides the protocol it offers
    :meth:`run_epoch` (the lease epoch ``claim_run`` bumps),
    :meth:`apply_writes` (group commit) and :meth:`statistics`.
    """

    def __init__(
        self, path: str | os.PathLike[str], worker: WorkerThread[_Conn], *, busy_retries: int
    ) -> None:
        self._path = os.fspath(path)
        self._worker = worker
        self._busy_retries = busy_retries
        self._transactions = 0
        self._busy_retry_count = 0

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    def statistics(self) -> SQLiteStoreStatistics:
        """Transaction and retry counters, and tasks queued for the connection."""
        return SQLiteStoreStatistics(
            path=self._path,
            transactions=self._transactions,
            busy_retries=self._busy_retry_count,
            tasks_waiting=self._worker.jobs_waiting,
        )

    # -- plumbing -----------------------------------------------------------------

    def _in_transaction(self, fn: Callable[[_Conn], T], write: bool, conn: _Conn) -> T:
        """``fn(conn)`` in one transaction; runs in the connection's thread."""
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        self._transactions += 1
        return result

    def _translate(self, exc: sqlite3.Error) -> Exception:
        code = _primary_code(exc)
        if code in _BUSY_CODES or "locked" in str(exc):
            return _Busy(str(exc))
        if code in _CORRUPT_CODES:
            return CorruptDataError(f"SQLite database {self._path} is corrupt: {exc}")
        if "malformed JSON" in str(exc):  # a JSON function met a stored value it cannot read
            return CorruptDataError(f"SQLite database {self._path} holds bad JSON: {exc}")
        return StoreError(f"SQLite database {self._path}: {exc}")

    async def _run(self, fn: Callable[[_Conn], T], *, write: bool) -> T:
        delay = 0.01
        job = functools.partial(self._in_transaction, fn, write)
        for attempt in range(self._busy_retries + 1):
            try:
                return await self._worker.run(job)
            except _Busy as exc:
                if attempt == self._busy_retries:
                    raise StoreUnavailableError(
                        f"SQLite database {self._path} stayed locked after "
                        f"{self._busy_retries} retries: {exc}"
                    ) from None
                self._busy_retry_count += 1
            await trio.sleep(delay)
            delay = min(delay * 2, 0.5)
        raise AssertionError("unreachable")

    async def _read(self, fn: Callable[[_Conn], T]) -> T:
        return await self._run(fn, write=False)

    async def _write(self, fn: Callable[[_Conn], T]) -> T:
        return await self._run(fn, write=True)

    async def aclose(self) -> None:
        """Close the connection; later calls raise ``StoreClosedError``. Idempotent.

        Calls still queued for the connection fail with ``StoreClosedError``
        (nothing of them applied); the one in hand finishes first.
        """
        await self._worker.aclose()

    # -- shared row helpers (run inside a transaction) -----------------------------

    @staticmethod
    def _header(conn: _Conn, session_id: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = conn.execute(
            "SELECT agent_id, project_root, status, metadata, created_at, updated_at,"
            " run_owner, run_epoch, rev, extra FROM sessions WHERE id = ?",
            (session_id,),
        ).fetchone()
        return row

    @staticmethod
    def _turn_rows(conn: _Conn, session_id: str) -> builtins.list[tuple[int, str, str, bytes]]:
        return conn.execute(
            "SELECT seq, id, role, body FROM turns WHERE session_id = ? ORDER BY seq",
            (session_id,),
        ).fetchall()

    @staticmethod
    def _runs(conn: _Conn, session_id: str) -> tuple[SessionRun, ...]:
        rows = conn.execute(
            "SELECT id, body FROM runs WHERE session_id = ? ORDER BY position", (session_id,)
        ).fetchall()
        return tuple(
            _decode_row(body, SessionRun, "runs", session_id, f"run {preview(run_id)}")
            for run_id, body in rows
        )

    @staticmethod
    def _rev(conn: _Conn, session_id: str) -> int:
        """The session's ``rev``, ``0`` when it does not exist."""
        row = conn.execute(_SQL.rev, (session_id,)).fetchone()
        return 0 if row is None else int(row[0])

    def _versioned(
        self, conn: _Conn, session_id: str, expected_rev: int | None, write: Callable[[], object]
    ) -> Revision:
        """``write()`` if the session is at ``expected_rev`` (when given); its revision."""
        before = self._rev(conn, session_id)
        if expected_rev is not None and before != expected_rev:
            raise stale(session_id, expected_rev, before)
        write()
        return Revision(before, self._rev(conn, session_id))

    @staticmethod
    def _bump(conn: _Conn, session_id: str, *, updated_at: int | None) -> None:
        if updated_at is None:
            conn.execute("UPDATE sessions SET rev = rev + 1 WHERE id = ?", (session_id,))
        else:
            conn.execute(
                "UPDATE sessions SET rev = rev + 1, updated_at = ? WHERE id = ?",
                (updated_at, session_id),
            )

    @staticmethod
    def _append_rows(
        conn: _Conn, session_id: str, rows: Sequence[tuple[int, str, str, bytes]]
    ) -> None:
        conn.executemany(
            "INSERT INTO turns (session_id, seq, id, role, body) VALUES (?, ?, ?, ?, ?)",
            [
                (session_id, seq, tid, role, _row_body(body, tid, role))
                for seq, tid, role, body in rows
            ],
        )

    @staticmethod
    def _upsert_run(conn: _Conn, session_id: str, run: SessionRun) -> None:
        body = _run_body(run)
        updated = conn.execute(
            _SQL.update_run,
            (body, session_id, run.id),
        ).rowcount
        if not updated:
            conn.execute(
                "INSERT INTO runs (session_id, id, position, body) VALUES (?, ?,"
                " (SELECT COALESCE(MAX(position), -1) + 1 FROM runs WHERE session_id = ?), ?)",
                (session_id, run.id, session_id, body),
            )

    @staticmethod
    def _replace_runs(conn: _Conn, session_id: str, runs: Sequence[SessionRun]) -> None:
        conn.execute(_SQL.delete_runs, (session_id,))
        conn.executemany(
            "INSERT INTO runs (session_id, id, position, body) VALUES (?, ?, ?, ?)",
            [(session_id, r.id, i, _run_body(r)) for i, r in enumerate(runs)],
        )

    def _write_header(self, conn: _Conn, data: SessionData, metadata: Mapping[str, Any]) -> None:
        stored = conn.execute(
            "SELECT status, run_owner FROM sessions WHERE id = ?", (data.id,)
        ).fetchone()
        stored_status = stored[0] if stored else None
        stored_owner = _decode_owner(stored[1], data.id) if stored else None
        status, owner = snapshot_status(stored_status, stored_owner, data.status)
        conn.execute(
            "INSERT INTO sessions (id, agent_id, project_root, status, metadata, created_at,"
            " updated_at, run_owner, extra, rev)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT rev + 1 FROM rev_floor))"
            " ON CONFLICT (id) DO UPDATE SET agent_id = excluded.agent_id,"
            " project_root = excluded.project_root, status = excluded.status,"
            " metadata = excluded.metadata, created_at = excluded.created_at,"
            " updated_at = excluded.updated_at, run_owner = excluded.run_owner,"
            " extra = excluded.extra, rev = sessions.rev + 1",
            (
                data.id,
                data.agent_id,
                data.project_root,
                status,
                _metadata_json(metadata),
                data.created_at,
                data.updated_at,
                None if owner is None else _owner_json(owner),
                extra_json(data.extra_fields),
            ),
        )

    # -- required methods ---------------------------------------------------------

    async def load(self, session_id: str) -> SessionData | None:
        """The whole session (header, turns, runs), or ``None``."""
        loaded = await self.load_versioned(session_id)
        return None if loaded is None else loaded[0]

    async def load_versioned(self, session_id: str) -> tuple[SessionData, int] | None:
        """The whole session and its ``rev``, read in one transaction; ``None`` when absent."""
        return await self._read(self._load_op(session_id))

    def _load_op(self, session_id: str) -> Callable[[_Conn], tuple[SessionData, int] | None]:
        _session_id(session_id)

        def op(conn: _Conn) -> tuple[SessionData, int] | None:
            head = self._header(conn, session_id)
            if head is None:
                return None
            (
                agent_id,
                project_root,
                status,
                metadata,
                created_at,
                updated_at,
                owner,
                _,
                rev,
                extra,
            ) = head
            data = SessionData(
                id=session_id,
                created_at=created_at,
                updated_at=updated_at,
                status=status,
                metadata=_decode_metadata(metadata, session_id),
                turns=_decode_turns(session_id, self._turn_rows(conn, session_id)),
                runs=self._runs(conn, session_id),
                agent_id=agent_id,
                project_root=project_root,
                run_owner=_decode_owner(owner, session_id),
                extra_fields=_decode_extra(extra, session_id),
            )
            return data, int(rev)

        return op

    async def get_rev(self, session_id: str) -> int | None:
        """The session's ``rev`` (one indexed read), or ``None`` when absent."""
        return await self._read(self._get_rev_op(session_id))

    def _get_rev_op(self, session_id: str) -> Callable[[_Conn], int | None]:
        _session_id(session_id)

        def op(conn: _Conn) -> int | None:
            rev = self._rev(conn, session_id)
            return rev or None

        return op

    def _op_save(
        self, conn: _Conn, data: SessionData, *, expected_rev: int | None = None
    ) -> Revision:
        data = _valid_header(data)
        rows = _turn_rows_of(data.turns, 0, "$.turns")

        def write() -> None:
            self._write_header(conn, data, data.metadata)
            conn.execute("DELETE FROM turns WHERE session_id = ?", (data.id,))
            self._append_rows(conn, data.id, rows)
            self._replace_runs(conn, data.id, data.runs)

        return self._versioned(conn, data.id, expected_rev, write)

    async def save(self, data: SessionData, *, expected_rev: int | None = None) -> Revision:
        """Create or overwrite the whole document (turns and runs replaced).

        With ``expected_rev``, only while the stored ``rev`` is that one.
        """
        return await self._write(lambda conn: self._op_save(conn, data, expected_rev=expected_rev))

    @staticmethod
    def _append_plan(
        session_id: str, turns: Sequence[SessionTurn], options: AppendTurnsOptions | None = None
    ) -> _AppendPlan:
        """The validated ``(session id, insert parameters, run)`` of one append."""
        _session_id(session_id)
        values = [
            (session_id, tid, role, _row_body(body, tid, role))
            for _, tid, role, body in _turn_rows_of(turns, 0)
        ]
        run = None
        if options is not None:
            _valid_body(options, AppendTurnsOptions, "append options")
            run = options.run
        return session_id, values, run

    def _missing(self, session_id: str) -> SessionNotFoundError:
        return SessionNotFoundError(
            f"cannot append turns: SQLite store {self._path} has no session {preview(session_id)}"
        )

    def _op_append_turns(
        self,
        conn: _Conn,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> Revision:
        session_id, values, run = self._append_plan(session_id, turns, options)
        if values:
            try:
                added = conn.executemany(_APPEND_TURN, values).rowcount
            except sqlite3.IntegrityError:  # the foreign key: no such session
                raise self._missing(session_id) from None
            if added != len(values):
                self._check_retried(conn, session_id, values)
            if not added and run is None:  # every turn was stored already: a retried append
                rev = self._rev(conn, session_id)
                return Revision(rev, rev)
        elif run is None:
            rev = self._rev(conn, session_id)
            if rev:
                return Revision(rev, rev)
            raise self._missing(session_id)
        bumped = conn.execute(_BUMP + " RETURNING rev", (_now(), session_id)).fetchone()
        if bumped is None:
            raise self._missing(session_id)
        if run is not None:
            self._upsert_run(conn, session_id, run)
        return Revision(bumped[0] - 1, bumped[0])

    @staticmethod
    def _check_retried(
        conn: _Conn, session_id: str, values: Sequence[tuple[str, str, str, bytes]]
    ) -> None:
        """Raise ``ConflictError`` if a skipped turn id is stored with other content.

        Reads only the rows of the appended ids (index lookups), and only when
        the insert skipped some: a retried append costs nothing more.
        """
        held = {}
        for _, tid, role, body in values:
            stored_role, stored = conn.execute(
                "SELECT role, body FROM turns WHERE session_id = ? AND id = ?", (session_id, tid)
            ).fetchone()
            theirs = _turn_json(tid, stored_role, stored)
            if theirs != _turn_json(tid, role, body):
                held[tid] = _decode_row(
                    theirs, SessionTurn, "turns", session_id, f"id {preview(tid)}"
                )
        if held:
            incoming = [
                _decode_row(_turn_json(*v[1:]), SessionTurn, "turns", session_id, "")
                for v in values
            ]
            fresh_turns(session_id, incoming, held)

    def _bulk_append(self, conn: _Conn, plans: Sequence[_AppendPlan]) -> builtins.list[Revision]:
        """Consecutive appends of turns (no run) in two ``executemany`` statements.

        Equivalent to applying them one by one: each session's turns keep their
        order (each row's ``seq`` follows the rows inserted before it). Raises
        when a session is missing or a turn id is stored already (a retry or a
        conflict), so the caller redoes the writes one by one.
        """
        now = _now()
        sids = sorted({p[0] for p in plans})
        revs = dict(
            conn.execute(
                f"SELECT id, rev FROM sessions WHERE id IN ({', '.join('?' * len(sids))})", sids
            ).fetchall()
        )
        if conn.executemany(_BUMP, [(now, p[0]) for p in plans]).rowcount != len(plans):
            raise SessionNotFoundError("an appended-to session is missing")
        values = [v for p in plans for v in p[1]]
        if conn.executemany(_APPEND_TURN, values).rowcount != len(values):
            raise ConflictError("a batched append repeats a stored turn id")
        revisions = []
        for sid, _, _ in plans:  # each append bumped its session's rev by one, in order
            revs[sid] += 1
            revisions.append(Revision(revs[sid] - 1, revs[sid]))
        return revisions

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> Revision:
        """Append turns in O(1) of the history; ``options.run`` is upserted in the same commit."""
        return await self._write(
            lambda conn: self._op_append_turns(conn, session_id, turns, options)
        )

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """Turns ``from_`` (0-based) onward, at most ``limit``, oldest first."""
        return await self._read(self._get_turns_op(session_id, from_, limit))

    def _get_turns_op(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> Callable[[_Conn], builtins.list[SessionTurn]]:
        _session_id(session_id)
        checked_int(from_, "from_")
        if limit is not None:
            checked_int(limit, "limit")

        def op(conn: _Conn) -> builtins.list[SessionTurn]:
            rows = conn.execute(
                "SELECT seq, id, role, body FROM turns WHERE session_id = ? AND seq >= ?"
                " ORDER BY seq LIMIT ?",
                (session_id, from_, -1 if limit is None else limit),
            ).fetchall()
            return list(_decode_turns(session_id, rows))

        return op

    def _op_update_run(
        self,
        conn: _Conn,
        session_id: str,
        run: SessionRun,
        options: UpdateRunOptions | None = None,
    ) -> Revision:
        _session_id(session_id)
        _run_body(run)
        if options is not None:
            _valid_body(options, UpdateRunOptions, "update run options")
        before = self._rev(conn, session_id)
        if not before:
            return Revision(0, 0)
        self._upsert_run(conn, session_id, run)
        self._bump(conn, session_id, updated_at=_now())
        return Revision(before, before + 1)

    async def update_run(
        self, session_id: str, run: SessionRun, options: UpdateRunOptions | None = None
    ) -> Revision:
        """Upsert one run record; an unknown session is a no-op (no ghost header)."""
        return await self._write(lambda conn: self._op_update_run(conn, session_id, run, options))

    def _op_update_status(
        self,
        conn: _Conn,
        session_id: str,
        status: SessionStatus,
        *,
        owner: RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> Revision:
        _session_id(session_id)
        checked_status(status)
        owner = (owner or current_run_owner()) if status == "running" else None
        row = conn.execute(
            "UPDATE sessions SET status = ?, run_owner = ?, rev = rev + 1,"
            " updated_at = CASE WHEN ? THEN updated_at ELSE ? END WHERE id = ? RETURNING rev",
            (
                status,
                None if owner is None else _owner_json(owner),
                preserve_updated_at,
                _now(),
                session_id,
            ),
        ).fetchone()
        return Revision(0, 0) if row is None else Revision(row[0] - 1, row[0])

    async def update_status(
        self,
        session_id: str,
        status: SessionStatus,
        *,
        owner: RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> Revision:
        """Set the status (``running`` records ``owner``); unknown ids are a no-op."""
        return await self._write(
            lambda conn: self._op_update_status(
                conn, session_id, status, owner=owner, preserve_updated_at=preserve_updated_at
            )
        )

    def _op_delete(self, conn: _Conn, session_id: str) -> None:
        _session_id(session_id)
        # Remember the last rev, so a session re-created with this id continues past it.
        conn.execute(
            "UPDATE rev_floor SET rev = MAX(rev, (SELECT rev FROM sessions WHERE id = ?))"
            " WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?)",
            (session_id, session_id),
        )
        conn.execute(_SQL.delete_session, (session_id,))
        conn.execute(_SQL.delete_sends, (session_id,))

    async def delete(self, session_id: str) -> None:
        """Delete a session with its turns, runs, artifacts and send-request ids."""
        await self._write(lambda conn: self._op_delete(conn, session_id))

    @staticmethod
    def _where(filter: SessionFilter | None) -> tuple[str, builtins.list[Any], str]:
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        limit = ""
        if filter is not None:
            _valid_body(filter, SessionFilter, "session filter")
            clauses, params = session_filter_sql(filter, SQLITE.placeholder)
            if filter.limit is not None:
                limit = f" LIMIT {int(filter.limit)}"
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return where, params, limit

    async def list(self, filter: SessionFilter | None = None) -> builtins.list[str]:
        """Session ids, most recently updated first."""
        where, params, limit = self._where(filter)

        def op(conn: _Conn) -> builtins.list[str]:
            rows = conn.execute(
                f"{_SQL.list_ids}{where} ORDER BY s.updated_at DESC, s.id{limit}",
                params,
            ).fetchall()
            return [r[0] for r in rows]

        return await self._read(op)

    # -- header reads ---------------------------------------------------------------

    # The counts and the first user turn's seq are kept in the row by triggers
    # (schema v4), so a listed session costs one turn lookup at most: its first user
    # turn, joined when the metadata holds no title.
    _META_SELECT: Final = (
        "SELECT s.id, s.agent_id, s.project_root, s.status, s.metadata, s.created_at,"
        " s.updated_at, s.run_owner, s.rev, s.turn_count, s.user_turn_count, s.run_count,"
        " s.artifact_count, t.id, t.role, t.body FROM sessions s"
        " LEFT JOIN turns t ON t.session_id = s.id AND t.seq = CASE"
        " WHEN NOT json_valid(s.metadata) THEN NULL"
        " WHEN json_type(s.metadata, '$.title') IS NULL THEN s.first_user_seq END"
    )

    @staticmethod
    def _meta_row(row: tuple[Any, ...]) -> SessionMetaRow:
        (sid, agent_id, project_root, status, metadata, created_at, updated_at, owner, rev,
         turns, users, runs, artifacts, first_id, first_role, first_body) = row  # fmt: skip
        first = None
        if first_body is not None:
            first_json = _turn_json(first_id, first_role, first_body)
            first = _decode_row(first_json, SessionTurn, "turns", sid, "its first user turn")
        return SessionMetaRow(
            id=sid,
            metadata=_decode_metadata(metadata, sid),
            run_count=runs,
            turn_count=turns,
            updated_at=updated_at,
            user_message_count=users,
            agent_id=agent_id,
            artifact_count=artifacts,
            created_at=created_at,
            first_user_turn=first,
            project_root=project_root,
            rev=rev,
            run_owner=_decode_owner(owner, sid),
            status=status,
        )

    @classmethod
    def _listed_row(cls, row: tuple[Any, ...]) -> SessionMetaRow:
        """``_meta_row``, or the row naming a session whose header does not decode."""
        try:
            return cls._meta_row(row)
        except CorruptDataError as exc:
            return corrupt_meta_row(row[0], row[6], exc)

    async def get_meta(self, session_id: str) -> SessionMetaRow | None:
        """One header row with its counts, without reading the turns."""
        return await self._read(self._get_meta_op(session_id))

    def _get_meta_op(self, session_id: str) -> Callable[[_Conn], SessionMetaRow | None]:
        _session_id(session_id)

        def op(conn: _Conn) -> SessionMetaRow | None:
            row = conn.execute(f"{self._META_SELECT} WHERE s.id = ?", (session_id,)).fetchone()
            return None if row is None else self._meta_row(row)

        return op

    async def list_meta(self, filter: SessionFilter | None = None) -> builtins.list[SessionMetaRow]:
        """Header rows with SQL aggregates, most recently updated first, in one query."""
        where, params, limit = self._where(filter)

        def op(conn: _Conn) -> builtins.list[SessionMetaRow]:
            rows = conn.execute(
                f"{self._META_SELECT}{where} ORDER BY s.updated_at DESC, s.id{limit}", params
            ).fetchall()
            return [self._listed_row(r) for r in rows]

        return await self._read(op)

    @staticmethod
    def _search_where(search: SessionSearch) -> tuple[str, builtins.list[Any]]:
        """The WHERE clause of ``search`` over ``sessions s``: words through the FTS5 index."""
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        words = search_words(search.text or "")
        if words:
            # Each word is a prefix of a word somewhere in the session: one index lookup per
            # word, the session ids intersected. Words are letters and digits only.
            hits = " INTERSECT ".join(
                "SELECT session_id FROM search WHERE search MATCH ?" for _ in words
            )
            clauses.append(f"s.id IN ({hits})")
            params.extend(f'text : "{w}"*' for w in words)
        header, values = search_header_sql(search, SQLITE.placeholder)
        clauses += header
        params += values
        return (f" WHERE {' AND '.join(clauses)}" if clauses else ""), params

    async def search_meta(self, search: SessionSearch) -> SessionSearchPage:
        """Sessions matching ``search`` (words found in the FTS5 index), one page and a count.

        The count stops at ``countLimit + 1`` matches, so it costs at most that many rows.
        A search for words first indexes the turns written since the last one (in its
        own transaction: appends only queue their turns), so it sees every stored turn.
        """
        _valid_body(search, SessionSearch, "session search")
        where, params = self._search_where(search)
        order = "s.created_at" if search.order == "created" else "s.updated_at"
        words = bool(search_words(search.text or ""))

        def op(conn: _Conn) -> SessionSearchPage:
            if words:
                for statement in SEARCH_CATCH_UP:
                    conn.execute(statement)
            rows = conn.execute(
                f"{self._META_SELECT}{where} ORDER BY {order} DESC, s.id LIMIT ? OFFSET ?",
                [*params, search.limit, search.offset],
            ).fetchall()
            (found,) = conn.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM sessions s{where} LIMIT ?)",
                [*params, search.count_limit + 1],
            ).fetchone()
            return SessionSearchPage(
                rows=tuple(self._listed_row(r) for r in rows),
                total=min(found, search.count_limit),
                total_exact=found <= search.count_limit,
            )

        return await (self._write(op) if words else self._read(op))

    async def run_epoch(self, session_id: str) -> int | None:
        """The session's lease epoch (bumped by every successful ``claim_run``), or ``None``."""
        _session_id(session_id)

        def op(conn: _Conn) -> int | None:
            row = conn.execute(_SQL.run_epoch, (session_id,)).fetchone()
            return None if row is None else int(row[0])

        return await self._read(op)

    # -- header writes ---------------------------------------------------------------

    def _op_save_meta(
        self,
        conn: _Conn,
        data: SessionData,
        options: SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision:
        data = _valid_header(data)
        return self._versioned(
            conn, data.id, expected_rev, lambda: self._save_meta_checked(conn, data, options)
        )

    def _save_meta_checked(
        self, conn: _Conn, data: SessionData, options: SaveMetaOptions | None
    ) -> None:
        for run in data.runs:
            _run_body(run)
        keys = None
        if options is not None:
            keys = decode(
                _valid_body(options, SaveMetaOptions, "save_meta options"), SaveMetaOptions
            ).meta_keys
        stored = conn.execute("SELECT metadata FROM sessions WHERE id = ?", (data.id,)).fetchone()
        metadata = merge_session_metadata(
            None if stored is None else _decode_metadata(stored[0], data.id), data.metadata, keys
        )
        self._write_header(conn, data, metadata)
        for run in data.runs:
            self._upsert_run(conn, data.id, run)

    async def save_meta(
        self,
        data: SessionData,
        options: SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision:
        """Write the header (``metaKeys`` merge) and upsert the snapshot's runs; turns untouched."""
        return await self._write(
            lambda conn: self._op_save_meta(conn, data, options, expected_rev=expected_rev)
        )

    def _op_patch_meta(
        self, conn: _Conn, session_id: str, patch: Mapping[str, JsonValue]
    ) -> Revision:
        return self._versioned(
            conn, session_id, None, lambda: self._patch_meta_checked(conn, session_id, patch)
        )

    def _patch_meta_checked(
        self, conn: _Conn, session_id: str, patch: Mapping[str, JsonValue]
    ) -> None:
        _session_id(session_id)
        if not isinstance(patch, Mapping):
            raise ValidationError(f"metadata patch must be a mapping, got {type(patch).__name__}")
        _metadata_json(patch)
        stored = conn.execute(
            "SELECT metadata FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if stored is None:
            return
        merged = patch_metadata(_decode_metadata(stored[0], session_id), patch)
        conn.execute(
            "UPDATE sessions SET metadata = ?, rev = rev + 1 WHERE id = ?",
            (_metadata_json(merged), session_id),
        )

    async def patch_meta(self, session_id: str, patch: Mapping[str, JsonValue]) -> Revision:
        """Merge ``patch`` into the metadata; status and ``updatedAt`` stay; unknown ids no-op."""
        return await self._write(lambda conn: self._op_patch_meta(conn, session_id, patch))

    async def claim_run(
        self, session_id: str, *, stale_at: int, owner: RunOwner | None = None
    ) -> RunClaim:
        """Set ``running`` in one IMMEDIATE transaction unless a live owner holds it.

        A successful claim records ``owner`` (default: this process), stamps
        ``updatedAt`` and bumps ``run_epoch``; an unknown id is claimed
        without writing a row.
        """
        _session_id(session_id)
        checked_int(stale_at, "stale_at")
        claimer_json = _owner_json(owner or current_run_owner())

        def op(conn: _Conn) -> RunClaim:
            row = conn.execute(
                "SELECT status, run_owner, updated_at FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None:
                return RunClaim(claimed=True)
            status, stored_owner, updated_at = row
            now = _now()
            if run_claim_blocked(
                status, _decode_owner(stored_owner, session_id), updated_at, stale_at, now
            ):
                return RunClaim(claimed=False)
            conn.execute(
                "UPDATE sessions SET status = 'running', run_owner = ?, updated_at = ?,"
                " run_epoch = run_epoch + 1, rev = rev + 1 WHERE id = ?",
                (claimer_json, now, session_id),
            )
            return RunClaim(claimed=True, previous=status)

        return await self._write(op)

    async def demote_stale_run(self, session_id: str, *, stale_at: int, now: int) -> bool:
        """Write a load's stale-running demotion in one IMMEDIATE transaction, if still stale.

        The marker is re-read under the write lock and judged by
        ``run_claim_blocked``; the update also names the ``run_epoch`` it read,
        so a marker claimed since is never overwritten. ``updatedAt`` is kept.
        """
        _session_id(session_id)
        checked_int(stale_at, "stale_at")
        checked_int(now, "now")

        def op(conn: _Conn) -> bool:
            row = conn.execute(
                "SELECT status, run_owner, updated_at, run_epoch FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
            if row is None:
                return False
            status, owner, updated_at, epoch = row
            if run_claim_blocked(
                status, _decode_owner(owner, session_id), updated_at, stale_at, now
            ):
                return False
            running = [r for r in self._runs(conn, session_id) if r.status == "running"]
            if status != "running" and not running:
                return False
            conn.execute(
                "UPDATE sessions SET status = CASE WHEN status = 'running' THEN 'idle'"
                " ELSE status END, run_owner = CASE WHEN status = 'running' THEN NULL"
                " ELSE run_owner END, rev = rev + 1 WHERE id = ? AND run_epoch = ?",
                (session_id, epoch),
            )
            conn.executemany(
                _SQL.update_run,
                [
                    (encode(msgspec.structs.replace(r, status="aborted")), session_id, r.id)
                    for r in running
                ],
            )
            return True

        return await self._write(op)

    # -- history edits -------------------------------------------------------------------

    def _mutate(
        self,
        session_id: str,
        edit: Callable[[tuple[SessionTurn, ...], tuple[SessionRun, ...]], SessionHistory | None],
        expected_rev: int | None,
    ) -> Callable[[_Conn], tuple[MutateResult, Revision]]:
        def op(conn: _Conn) -> tuple[MutateResult, Revision]:
            before = self._rev(conn, session_id)
            if expected_rev is not None and before != expected_rev:
                raise stale(session_id, expected_rev, before)
            result = edit_stored(conn)
            return result, Revision(before, self._rev(conn, session_id))

        def edit_stored(conn: _Conn) -> MutateResult:
            if self._header(conn, session_id) is None:
                return "no-session"
            rows = self._turn_rows(conn, session_id)
            turns = _decode_turns(session_id, rows)
            runs = self._runs(conn, session_id)
            result = edit(turns, runs)
            if result is None:
                return "unchanged"
            if not isinstance(result, SessionHistory):
                raise ValidationError(
                    "a history mutation must return a SessionHistory or None, "
                    f"got {type(result).__name__}"
                )
            if result.turns is not turns:
                new_rows = _turn_rows_of(result.turns, 0, "$.turns")
                keep = 0
                for (_, tid, role, old), (_, *new) in zip(rows, new_rows, strict=False):
                    if [tid, role, _turn_json(tid, role, old)] != new:
                        break  # another id, role or turn: rewritten from here on
                    keep += 1
                conn.execute(
                    "DELETE FROM turns WHERE session_id = ? AND seq >= ?", (session_id, keep)
                )
                self._append_rows(conn, session_id, new_rows[keep:])
            if result.runs is not runs and result.runs != runs:
                self._replace_runs(conn, session_id, result.runs)
            self._bump(conn, session_id, updated_at=_now())
            return "ok"

        return op

    async def mutate_history(
        self,
        session_id: str,
        mutate: HistoryMutation,
        *,
        expected_rev: int | None = None,
        on_revision: RevisionSink | None = None,
    ) -> MutateResult:
        """Read, edit (``mutate`` runs in the store's thread) and write back in one transaction.

        With ``expected_rev``, only while the stored ``rev`` is that one.
        """
        _session_id(session_id)

        def edit(
            turns: tuple[SessionTurn, ...], runs: tuple[SessionRun, ...]
        ) -> SessionHistory | None:
            return mutate(SessionHistory(turns=turns, runs=runs))

        return self._told(
            await self._write(self._mutate(session_id, edit, expected_rev)), on_revision
        )

    @staticmethod
    def _told(
        done: tuple[MutateResult, Revision], on_revision: RevisionSink | None
    ) -> MutateResult:
        result, revision = done
        if on_revision is not None and revision.before:
            on_revision(revision)
        return result

    async def mutate_turns(
        self,
        session_id: str,
        mutate: TurnsMutation,
        *,
        expected_rev: int | None = None,
        on_revision: RevisionSink | None = None,
    ) -> MutateResult:
        """Deprecated turns-only form of :meth:`mutate_history` (runs untouched)."""
        warn_mutate_turns()
        _session_id(session_id)

        def edit(
            turns: tuple[SessionTurn, ...], runs: tuple[SessionRun, ...]
        ) -> SessionHistory | None:
            result = mutate(turns)
            return None if result is None else SessionHistory(turns=tuple(result), runs=runs)

        return self._told(
            await self._write(self._mutate(session_id, edit, expected_rev)), on_revision
        )

    # -- artifacts -------------------------------------------------------------------------

    @staticmethod
    def _artifacts(conn: _Conn, session_id: str) -> builtins.list[SessionArtifact]:
        rows = conn.execute(
            "SELECT id, body FROM artifacts WHERE session_id = ? ORDER BY rowid", (session_id,)
        ).fetchall()
        return [
            _decode_row(body, SessionArtifact, "artifacts", session_id, f"artifact {preview(aid)}")
            for aid, body in rows
        ]

    def _op_upsert_artifact(self, conn: _Conn, artifact: SessionArtifact) -> SessionArtifact | None:
        body = _valid_body(artifact, SessionArtifact, "artifact")
        normalized = normalize_artifact(artifact)
        if normalized is not artifact:
            artifact, body = normalized, encode(normalized)
        check_artifact_ids(artifact)
        sid = artifact.session_id
        if self._header(conn, sid) is None:
            return None
        row = conn.execute(
            "SELECT id, body FROM artifacts WHERE session_id = ? AND kind = ? AND uri = ?",
            (sid, artifact.kind, artifact.uri),
        ).fetchone()
        if row is not None:
            existing = _decode_row(
                row[1], SessionArtifact, "artifacts", sid, f"artifact {preview(row[0])}"
            )
            stored = merge_artifact(existing, artifact)
            conn.execute(
                "UPDATE artifacts SET body = ? WHERE session_id = ? AND id = ?",
                (encode(stored), sid, existing.id),
            )
        else:
            held = conn.execute(
                "SELECT body FROM artifacts WHERE session_id = ? AND id = ?", (sid, artifact.id)
            ).fetchone()
            if held is not None:
                where = f"artifact {preview(artifact.id)}"
                holder = _decode_row(held[0], SessionArtifact, "artifacts", sid, where)
                check_artifact_id_free(artifact, holder)
            stored = artifact
            evict = select_artifact_evictions(self._artifacts(conn, sid))
            conn.executemany(
                "DELETE FROM artifacts WHERE session_id = ? AND id = ?",
                [(sid, aid) for aid in evict],
            )
            conn.execute(
                "INSERT INTO artifacts (session_id, id, kind, uri, body) VALUES (?, ?, ?, ?, ?)",
                (sid, artifact.id, artifact.kind, artifact.uri, body),
            )
        self._bump(conn, sid, updated_at=None)
        return stored

    async def upsert_artifact(self, artifact: SessionArtifact) -> SessionArtifact | None:
        """Upsert on ``(sessionId, kind, uri)`` (``merge_artifact``), evicting past the cap."""
        return await self._write(lambda conn: self._op_upsert_artifact(conn, artifact))

    def _op_delete_artifact(self, conn: _Conn, session_id: str, artifact_id: str) -> None:
        _session_id(session_id)
        validate_id(artifact_id, what="artifact id")
        if conn.execute(
            "DELETE FROM artifacts WHERE session_id = ? AND id = ?", (session_id, artifact_id)
        ).rowcount:
            self._bump(conn, session_id, updated_at=None)

    async def delete_artifact(self, session_id: str, artifact_id: str) -> None:
        """Remove one artifact; unknown ids are a no-op."""
        await self._write(lambda conn: self._op_delete_artifact(conn, session_id, artifact_id))

    async def list_artifacts(
        self, filter: ArtifactFilter | None = None
    ) -> builtins.list[SessionArtifact]:
        """Artifacts, newest ``updatedAt`` first, filtered (``filter_artifacts``)."""
        if filter is not None:
            _valid_body(filter, ArtifactFilter, "artifact filter")
        check_artifact_filter_ids(filter)

        def op(conn: _Conn) -> builtins.list[SessionArtifact]:
            if filter is not None and filter.session_id is not None:
                return filter_artifacts(self._artifacts(conn, filter.session_id), filter)
            rows = conn.execute("SELECT session_id, id, body FROM artifacts").fetchall()
            return filter_artifacts(
                (
                    _decode_row(body, SessionArtifact, "artifacts", sid, f"artifact {preview(aid)}")
                    for sid, aid, body in rows
                ),
                filter,
            )

        return await self._read(op)

    # -- send requests ------------------------------------------------------------------------

    @staticmethod
    def _send_record(row: tuple[Any, ...], session_id: str) -> SendRequestRecord:
        request_id, fingerprint, created_at, result = row
        value: Any = UNSET
        if result is not None:
            value = _decode_row(
                result, object, "send_requests", session_id, f"request {preview(request_id)}"
            )
        return SendRequestRecord(
            request_id=request_id, fingerprint=fingerprint, created_at=created_at, result=value
        )

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> SendRequestClaim:
        """Claim ``request_id`` in one insert-or-detect step, keeping the newest ids per session."""
        _session_id(session_id)
        validate_request_id(request_id, what="send request id")
        if not isinstance(fingerprint, str):
            raise ValidationError(f"fingerprint must be a string, got {type(fingerprint).__name__}")

        def op(conn: _Conn) -> SendRequestClaim:
            self._held_for_send(conn, session_id)
            rows = conn.execute(
                "SELECT request_id, fingerprint, created_at, result FROM send_requests"
                " WHERE session_id = ?",
                (session_id,),
            ).fetchall()
            records = [self._send_record(r, session_id) for r in rows]
            for record in records:
                if record.request_id == request_id:
                    return SendRequestClaim(claimed=False, record=record)
            conn.executemany(
                _SQL.delete_send,
                [(session_id, rid) for rid in send_request_evictions(records)],
            )
            conn.execute(
                "INSERT INTO send_requests (session_id, request_id, fingerprint, created_at)"
                " VALUES (?, ?, ?, ?)",
                (session_id, request_id, fingerprint, _now()),
            )
            return SendRequestClaim(claimed=True)

        return await self._write(op)

    def _held_for_send(self, conn: _Conn, session_id: str) -> None:
        """Refuse a send request of a session this store does not hold (checked in the write's
        transaction): a session created later under that id would inherit the claim."""
        if conn.execute(_SQL.held_for_send, (session_id,)).fetchone() is None:
            raise SessionNotFoundError(
                f"cannot claim a send request: SQLite store {self._path} has no session"
                f" {preview(session_id)} (save the session first)"
            )

    async def find_send_request(self, session_id: str, request_id: str) -> SendRequestRecord | None:
        """The record holding ``request_id``, without claiming it."""
        _session_id(session_id)
        validate_request_id(request_id, what="send request id")

        def op(conn: _Conn) -> SendRequestRecord | None:
            row = conn.execute(
                "SELECT request_id, fingerprint, created_at, result FROM send_requests"
                " WHERE session_id = ? AND request_id = ?",
                (session_id, request_id),
            ).fetchone()
            return None if row is None else self._send_record(row, session_id)

        return await self._read(op)

    def _op_settle_send_request(
        self, conn: _Conn, session_id: str, request_id: str, result: JsonValue
    ) -> None:
        _session_id(session_id)
        validate_request_id(request_id, what="send request id")
        check_json(result, what="send result")
        try:
            encoded = encode(result)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValidationError(f"send result is not JSON-serializable: {exc}") from None
        if result is None:
            conn.execute(
                _SQL.delete_send,
                (session_id, request_id),
            )
        else:
            conn.execute(
                _SQL.settle_send,
                (encoded, session_id, request_id),
            )

    async def settle_send_request(
        self, session_id: str, request_id: str, result: JsonValue
    ) -> None:
        """Store the send's result; ``None`` drops the claim; unknown ids are a no-op."""
        await self._write(
            lambda conn: self._op_settle_send_request(conn, session_id, request_id, result)
        )

    async def list_send_requests(self, session_id: str) -> builtins.list[SendRequestRecord]:
        """Every request id the session holds, oldest claim first (for copies and exports)."""
        _session_id(session_id)

        def op(conn: _Conn) -> builtins.list[SendRequestRecord]:
            rows = conn.execute(
                _SQL.list_sends,
                (session_id,),
            ).fetchall()
            return [self._send_record(r, session_id) for r in rows]

        return await self._read(op)

    async def put_send_request(self, session_id: str, record: SendRequestRecord) -> None:
        """Store ``record`` exactly as given (a copy or an import), replacing its id's record."""
        _session_id(session_id)
        record = checked(record, SendRequestRecord, "send request")
        validate_request_id(record.request_id, what="send request id")
        result = None if record.result is UNSET else encode(record.result)

        def op(conn: _Conn) -> None:
            self._held_for_send(conn, session_id)
            conn.execute(
                _SQL.delete_send,
                (session_id, record.request_id),
            )
            rows = conn.execute(
                "SELECT request_id, fingerprint, created_at, result FROM send_requests"
                " WHERE session_id = ?",
                (session_id,),
            ).fetchall()
            records = [self._send_record(r, session_id) for r in rows]
            conn.executemany(
                _SQL.delete_send,
                [(session_id, rid) for rid in send_request_evictions(records)],
            )
            conn.execute(
                _SQL.put_send,
                (session_id, record.request_id, record.fingerprint, record.created_at, result),
            )

        await self._write(op)

    # -- schedules -------------------------------------------------------------------------------

    @staticmethod
    def _fire(body: bytes, schedule_id: str) -> ScheduleFire:
        return _decode_row(body, ScheduleFire, "schedule_fires", schedule_id, "a fire")

    async def save_schedule(self, schedule: Schedule, *, keep_next_fire_at: bool = False) -> None:
        """Create or replace a schedule; ``keep_next_fire_at`` keeps a stored ``nextFireAt``."""
        _valid_body(schedule, Schedule, "schedule")
        validate_id(schedule.id, what="schedule id")
        body = encode(msgspec.structs.replace(schedule, last_fire=None, next_fire_at=None))

        def op(conn: _Conn) -> None:
            conn.execute(
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

    async def list_schedules(self) -> builtins.list[Schedule]:
        """Every schedule with its newest fire, oldest first."""

        def op(conn: _Conn) -> builtins.list[Schedule]:
            rows = conn.execute(
                "SELECT s.id, s.next_fire_at, s.body, (SELECT f.body FROM schedule_fires f"
                " WHERE f.schedule_id = s.id ORDER BY f.fired_at DESC, f.rowid DESC LIMIT 1)"
                " FROM schedules s ORDER BY s.created_at, s.id"
            ).fetchall()
            return [
                msgspec.structs.replace(
                    _decode_row(body, Schedule, "schedules", sid, "its row"),
                    next_fire_at=next_fire_at,
                    last_fire=None if fire is None else self._fire(fire, sid),
                )
                for sid, next_fire_at, body, fire in rows
            ]

        return await self._read(op)

    async def delete_schedule(self, id: str) -> bool:
        """Remove a schedule and its fires; ``False`` when it was gone."""
        validate_id(id, what="schedule id")

        def op(conn: _Conn) -> bool:
            conn.execute(_SQL.delete_fires, (id,))
            return conn.execute("DELETE FROM schedules WHERE id = ?", (id,)).rowcount > 0

        return await self._write(op)

    async def claim_schedule_fire(self, id: str, due_at: int, next: int | None) -> bool:
        """Move ``nextFireAt`` from ``due_at`` to ``next`` if still due: once across processes."""
        validate_id(id, what="schedule id")
        checked_int(due_at, "due_at")
        if next is not None:
            checked_int(next, "next")

        def op(conn: _Conn) -> bool:
            return (
                conn.execute(
                    "UPDATE schedules SET next_fire_at = ?"
                    " WHERE id = ? AND enabled AND next_fire_at = ?",
                    (next, id, due_at),
                ).rowcount
                == 1
            )

        return await self._write(op)

    async def record_schedule_fire(self, fire: ScheduleFire) -> None:
        """Store a fire, keeping the newest ``FIRE_HISTORY`` of its schedule."""

        body = _valid_body(fire, ScheduleFire, "schedule fire")
        check_fire_ids(fire)

        def op(conn: _Conn) -> None:
            if not conn.execute(_SQL.schedule_exists, (fire.schedule_id,)).fetchone():
                return
            conn.execute(
                _SQL.delete_fire,
                (fire.schedule_id, fire.id),
            )
            conn.execute(
                _SQL.insert_fire,
                (fire.schedule_id, fire.id, fire.fired_at, body),
            )
            conn.execute(
                "DELETE FROM schedule_fires WHERE schedule_id = ? AND rowid NOT IN"
                " (SELECT rowid FROM schedule_fires WHERE schedule_id = ?"
                "  ORDER BY fired_at DESC, rowid DESC LIMIT ?)",
                (fire.schedule_id, fire.schedule_id, FIRE_HISTORY),
            )

        await self._write(op)

    async def list_schedule_fires(
        self, schedule_id: str, limit: int
    ) -> builtins.list[ScheduleFire]:
        """A schedule's fires, newest first."""
        validate_id(schedule_id, what="schedule id")
        checked_int(limit, "limit")

        def op(conn: _Conn) -> builtins.list[ScheduleFire]:
            rows = conn.execute(
                "SELECT body FROM schedule_fires WHERE schedule_id = ?"
                " ORDER BY fired_at DESC, rowid DESC LIMIT ?",
                (schedule_id, limit),
            ).fetchall()
            return [self._fire(r[0], schedule_id) for r in rows]

        return await self._read(op)

    # -- ids ------------------------------------------------------------------------------------

    async def generate_session_id(self) -> str:
        """A new random session id."""
        return new_id()

    async def generate_turn_id(self) -> str:
        """A new random turn id."""
        return new_id()

    # -- group commit ---------------------------------------------------------------------------

    def _write_op(self, write: StoreWrite) -> Callable[..., Any] | None:
        """The ``_op_*`` applying ``write``, or ``None`` when it is not a batchable write."""
        if not isinstance(write, StoreWrite) or write.method not in WRITE_METHODS:
            return None
        op: Callable[..., Any] = getattr(self, f"_op_{write.method}")
        return op

    @staticmethod
    def _refusal(write: object) -> outcome.Error:
        name = getattr(write, "method", type(write).__name__)
        return outcome.Error(
            UnsupportedOperationError(f"{preview(name)} is not a batchable store write")
        )

    def _in_savepoint(self, conn: _Conn, fn: Callable[[], T]) -> outcome.Outcome[T]:
        """``fn()`` inside a SAVEPOINT: rolled back alone when it raises, its error answered.

        A busy database or a transaction SQLite itself aborted is raised instead:
        the whole transaction must be retried or failed.
        """
        conn.execute("SAVEPOINT w")
        try:
            result: outcome.Outcome[T] = outcome.Value(fn())
        except sqlite3.Error as exc:
            translated = self._translate(exc)
            if isinstance(translated, _Busy) or not conn.in_transaction:
                raise
            conn.execute("ROLLBACK TO w")
            result = outcome.Error(translated)
        except Exception as exc:
            conn.execute("ROLLBACK TO w")
            result = outcome.Error(exc)
        conn.execute("RELEASE w")
        return result

    async def _apply_one(
        self, write: StoreWrite, fn: Callable[..., Any] | None
    ) -> outcome.Outcome[Any]:
        """A lone write in its own transaction, no SAVEPOINT: its failure rolls it all back."""
        if fn is None:
            return self._refusal(write)
        try:
            return outcome.Value(
                await self._write(lambda conn: fn(conn, *write.args, **write.kwargs))
            )
        except Exception as exc:
            return outcome.Error(exc)

    def _read_op(self, read: StoreWrite) -> Callable[[_Conn], Any] | None:
        """The op of one read ``apply_reads`` can make in its transaction (``None``: it can't)."""
        method = read.method
        if method == "get_meta":
            return self._get_meta_op(*read.args, **read.kwargs)
        if method == "get_rev":
            return self._get_rev_op(*read.args, **read.kwargs)
        if method == "get_turns":
            return self._get_turns_op(*read.args, **read.kwargs)
        if method == "load_versioned":
            return self._load_op(*read.args, **read.kwargs)
        if method == "load":
            op = self._load_op(*read.args, **read.kwargs)
            return lambda conn: None if (loaded := op(conn)) is None else loaded[0]
        return None

    def _each(
        self, ops: Sequence[Callable[[_Conn], Any]], conn: _Conn
    ) -> builtins.list[outcome.Outcome[Any]]:
        """Run ``ops`` in the open transaction: one outcome each (a busy database fails all)."""
        answers: builtins.list[outcome.Outcome[Any]] = []
        for op in ops:
            try:
                answers.append(outcome.Value(op(conn)))
            except sqlite3.Error as exc:
                error = self._translate(exc)
                if isinstance(error, _Busy):
                    raise  # the whole transaction is tried again
                answers.append(outcome.Error(error))
            except Exception as exc:
                answers.append(outcome.Error(exc))
        return answers

    async def apply_reads(self, reads: Sequence[StoreWrite]) -> builtins.list[outcome.Outcome[Any]]:
        """Make ``reads`` (calls of ``READ_METHODS``); one outcome per read, in order.

        The header, rev, turn and whole-session reads run in ONE read transaction,
        so they see one snapshot and reach the connection's thread together;
        other reads are made one by one after them (reads do not depend on
        each other's order).
        """
        results: builtins.list[outcome.Outcome[Any] | None] = [None] * len(reads)
        placed: builtins.list[int] = []
        ops: builtins.list[Callable[[_Conn], Any]] = []
        for index, read in enumerate(reads):
            try:
                op = self._read_op(read)
            except Exception as exc:  # the arguments are refused: the read's own error
                results[index] = outcome.Error(exc)
                continue
            if op is not None:
                placed.append(index)
                ops.append(op)
        if ops:
            try:
                answers = await self._read(functools.partial(self._each, ops))
            except Exception as exc:
                answers = [outcome.Error(exc) for _ in ops]
            for index, answer in zip(placed, answers, strict=True):
                results[index] = answer
        for index, read in enumerate(reads):
            if results[index] is None:
                method = getattr(self, read.method)
                results[index] = await outcome.acapture(method, *read.args, **read.kwargs)
        return cast(builtins.list[outcome.Outcome[Any]], results)

    async def apply_writes(
        self, writes: Sequence[StoreWrite]
    ) -> builtins.list[outcome.Outcome[Any]]:
        """Apply ``writes`` in order in ONE transaction.

        The batch is tried under one SAVEPOINT; if any write raises, that attempt
        is rolled back and the batch reruns with a SAVEPOINT per write, so a
        failing write is rolled back alone and answered ``outcome.Error``. A
        failed commit answers every write with that error. A lone write needs
        no SAVEPOINT: its failure rolls back the whole transaction.
        """
        if not writes:
            return []
        fns = [self._write_op(w) for w in writes]
        if len(writes) == 1:
            return [await self._apply_one(writes[0], fns[0])]

        def all_at_once(conn: _Conn) -> builtins.list[Any]:
            # Runs of plain appends (turns, no run) share two executemany statements.
            results: builtins.list[Any] = []
            plans: builtins.list[_AppendPlan] = []
            for fn, w in zip(fns, writes, strict=True):
                assert fn is not None
                if w.method == "append_turns" and not w.kwargs:
                    plan = self._append_plan(*w.args)
                    if plan[1] and plan[2] is None:
                        plans.append(plan)
                        continue
                if plans:
                    results += self._bulk_append(conn, plans)
                    plans = []
                results.append(fn(conn, *w.args, **w.kwargs))
            if plans:
                results += self._bulk_append(conn, plans)
            return results

        def op(conn: _Conn) -> builtins.list[outcome.Outcome[Any]]:
            # The common case: every write succeeds, and one savepoint covers them all.
            if all(fn is not None for fn in fns):
                batch = self._in_savepoint(conn, lambda: all_at_once(conn))
                if type(batch) is outcome.Value:
                    return [outcome.Value(v) for v in batch.value]
            # A write failed (or was refused up front): one savepoint per write.
            return [
                self._refusal(w)
                if fn is None
                else self._in_savepoint(conn, functools.partial(fn, conn, *w.args, **w.kwargs))
                for w, fn in zip(writes, fns, strict=True)
            ]

        try:
            return await self._write(op)
        except StoreError as exc:
            return [outcome.Error(exc) for _ in writes]


def _prepare(conn: _Conn, path: str, durability: Durability, deadline: float) -> None:
    """Check, switch to WAL and migrate the file ``conn`` opened, until ``deadline`` if busy.

    Two processes opening one new file at once race for the switch to WAL,
    which SQLite answers "database is locked" at once, without its busy
    handler: the loser tries again (each step is idempotent) rather than fail.
    """
    delay = 0.005
    while True:
        try:
            refuse_foreign(conn, path)  # before WAL: another program's file stays untouched
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal" and path != ":memory:":
                raise StoreError(f"SQLite database {path} cannot use WAL (journal_mode is {mode})")
            conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[durability]}")
            conn.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn, path)
            return
        except sqlite3.OperationalError as exc:
            busy = _primary_code(exc) in _BUSY_CODES
            if not busy or time.monotonic() + delay > deadline:
                raise
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        time.sleep(delay)  # in the connection's own thread, before it serves anything
        delay = min(delay * 2, 0.1)


def _connect(path: str, durability: Durability, busy_timeout_ms: int) -> _Conn:
    try:
        conn = sqlite3.connect(
            path,
            timeout=busy_timeout_ms / 1000,
            isolation_level=None,
        )
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"cannot open SQLite database {path}: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        _prepare(conn, path, durability, time.monotonic() + busy_timeout_ms / 1000)
    except sqlite3.DatabaseError as exc:
        conn.close()
        code = _primary_code(exc)
        if code in _CORRUPT_CODES:
            raise CorruptDataError(f"{path} is not a usable SQLite database: {exc}") from exc
        if code in _BUSY_CODES:
            raise StoreUnavailableError(f"SQLite database {path} is locked: {exc}") from exc
        raise StoreError(f"cannot open SQLite database {path}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


@asynccontextmanager
async def open_sqlite_store(
    path: str | os.PathLike[str],
    *,
    durability: Durability = "full",
    busy_timeout_ms: int = 5_000,
    busy_retries: int = 8,
) -> AsyncIterator[SQLiteStore]:
    """Open (creating and migrating as needed) the SQLite store at ``path``; close on exit.

    ``durability`` picks ``PRAGMA synchronous`` (see :data:`Durability`).
    ``busy_timeout_ms`` is how long one attempt waits on another process's
    lock; ``busy_retries`` more attempts follow, with backoff, before
    :class:`~zidane_actors.errors.StoreUnavailableError`.
    """
    if durability not in _SYNCHRONOUS:
        raise ValidationError(
            f"durability must be one of full/normal/off, got {preview(durability)}"
        )
    if busy_timeout_ms < 0 or busy_retries < 0:
        raise ValidationError("busy_timeout_ms and busy_retries must be >= 0")
    fspath = os.fspath(path)
    worker = await start_worker_thread(
        f"sqlite {fspath}",
        functools.partial(_connect, fspath, durability, busy_timeout_ms),
        _Conn.close,
        lambda: StoreClosedError(f"SQLite store {fspath} is closed"),
    )
    store = SQLiteStore(fspath, worker, busy_retries=busy_retries)
    try:
        yield store
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()
