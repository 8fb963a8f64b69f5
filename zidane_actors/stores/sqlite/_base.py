"""The SQLite store's plumbing (one worker thread, busy retries) and session writes."""

from __future__ import annotations

import builtins
import functools
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeAlias, cast

import trio

from ... import model
from ...errors import (
    ConflictError,
    CorruptDataError,
    SessionNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from ...model import (
    AppendTurnsOptions,
    SessionData,
    SessionRun,
    SessionTurn,
    current_run_owner,
    extra_json,
    fresh_turns,
    preview,
    snapshot_status,
)
from .._protocol import (
    Revision,
    stale,
)
from .._thread import WorkerThread
from .._validate import (
    check_turn_slice,
    checked_status,
)
from ..sql import SQLITE, Dialect
from ..sql._forks import fork_sql, ranges_of, recount, share_less, shared_turns, unshare
from ..sql._forks import visible_rows as _visible_rows
from . import _rows
from ._rows import _SQL, T, _Conn, _decode_row, _now, _run_body, _session_id, _turn_json

__all__ = ["SQLiteBase", "turn_rows"]


_Row: TypeAlias = tuple[int, str, str, bytes, str | None]
"""A turn row to write: ``seq, id, role, body`` (the turn's whole JSON) and its run id."""


def turn_rows(turns: object, where: str = "$") -> builtins.list[_Row]:
    """``_rows._turn_rows_of(turns, 0, where)`` (validated rows), each with its turn's run
    id: the ``run_id`` column (schema v16), known here rather than read from the body."""
    rows = _rows._turn_rows_of(turns, 0, where)
    ran = cast(Sequence[SessionTurn], turns)
    return [(*row, turn.run_id) for row, turn in zip(rows, ran, strict=True)]


class _BusyHere(Exception):
    """A job run in the trio thread found the database locked (nothing applied)."""


def _begin_write(conn: _rows._Conn) -> None:
    conn.execute("BEGIN IMMEDIATE")


def _begin_read(conn: _rows._Conn) -> None:
    conn.execute("BEGIN")


class SQLiteBase:
    """A :class:`~zidane_actors.stores.FullSessionStore` on one SQLite file.

    Create it with :func:`open_sqlite_store`. Besides the protocol it offers
    :meth:`run_epoch` (the lease epoch ``claim_run`` bumps),
    :meth:`apply_writes` (group commit) and :meth:`statistics`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        worker: WorkerThread[_Conn],
        *,
        busy_timeout_ms: int,
        busy_retries: int,
    ) -> None:
        self._path = os.fspath(path)
        self._worker = worker
        self._busy_timeout_ms = busy_timeout_ms
        # Whether the connection's busy timeout is ``busy_timeout_ms`` (else 0, as a job
        # in the trio thread leaves it). Only the job holding the connection reads it.
        self._waits_for_locks = True
        self._busy_retries = busy_retries
        self._transactions = 0
        self._transactions_here = 0
        self._busy_retry_count = 0

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    def statistics(self) -> _rows.SQLiteStoreStatistics:
        """Transaction and retry counters, and tasks queued for the connection."""
        return _rows.SQLiteStoreStatistics(
            path=self._path,
            transactions=self._transactions,
            busy_retries=self._busy_retry_count,
            tasks_waiting=self._worker.jobs_waiting,
            transactions_here=self._transactions_here,
        )

    # -- plumbing -----------------------------------------------------------------

    def _in_transaction(self, fn: Callable[[_Conn], T], write: bool, conn: _Conn) -> T:
        """``fn(conn)`` in one transaction; runs in the connection's thread."""
        try:
            result = _rows._transaction(conn, fn, _begin_write if write else _begin_read)
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        self._transactions += 1
        return result

    def _translate(self, exc: sqlite3.Error) -> Exception:
        code = _rows._primary_code(exc)
        if code in _rows._BUSY_CODES or "locked" in str(exc):
            return _rows._Busy(str(exc))
        if code in _rows._CORRUPT_CODES:
            return CorruptDataError(f"SQLite database {self._path} is corrupt: {exc}")
        if "malformed JSON" in str(exc):  # a JSON function met a stored value it cannot read
            return CorruptDataError(f"SQLite database {self._path} holds bad JSON: {exc}")
        return StoreError(f"SQLite database {self._path}: {exc}")

    def _in_thread(self, fn: Callable[[_Conn], T], write: bool, conn: _Conn) -> T:
        """``fn(conn)`` in one transaction in the connection's thread, which waits for
        another connection's lock up to the busy timeout."""
        if not self._waits_for_locks:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            self._waits_for_locks = True
        return self._in_transaction(fn, write, conn)

    def _in_trio_thread(self, fn: Callable[[_Conn], T], write: bool, conn: _Conn) -> T:
        """``fn(conn)`` in one transaction in the trio thread, which never waits for
        another connection's lock: a busy database raises ``_BusyHere`` at once (nothing
        applied), and the job goes to the connection's thread, which waits as usual.

        The busy timeout is switched only when the thread last ran a job: lone writes one
        after another switch nothing.
        """
        if self._waits_for_locks:
            conn.execute("PRAGMA busy_timeout = 0")
            self._waits_for_locks = False
        try:
            result = self._in_transaction(fn, write, conn)
        except _rows._Busy:
            raise _BusyHere from None
        self._transactions_here += 1
        return result

    async def _attempt(self, job: Callable[[_Conn], T], here: Callable[[_Conn], T] | None) -> T:
        try:
            return await self._worker.run(job, here=here)
        except _BusyHere:
            return await self._worker.run(job)

    async def _run(self, fn: Callable[[_Conn], T], *, write: bool, here: bool = False) -> T:
        """``fn(conn)`` in one transaction, retried while the database is busy.

        ``here``: a lone write, or a read of one row, may run in the trio thread
        when the connection and the run are idle (``WorkerThread.run``'s ``here=``).
        """
        delay = 0.01
        job = functools.partial(self._in_thread, fn, write)
        job_here = functools.partial(self._in_trio_thread, fn, write) if here else None
        for attempt in range(self._busy_retries + 1):
            try:
                return await self._attempt(job, job_here)
            except _rows._Busy as exc:
                if attempt == self._busy_retries:
                    raise StoreUnavailableError(
                        f"SQLite database {self._path} stayed locked after "
                        f"{self._busy_retries} retries: {exc}"
                    ) from None
                self._busy_retry_count += 1
            await trio.sleep(delay)
            delay = min(delay * 2, 0.5)
        raise AssertionError("unreachable")

    def _run_nowait(self, fn: Callable[[_Conn], T], *, write: bool) -> T:
        """``fn(conn)`` in one transaction in the trio thread now, as ``_run``'s ``here``
        would run it, or ``trio.WouldBlock`` with nothing applied: the connection or the
        run busy, or the database locked by another connection."""
        try:
            return self._worker.run_nowait(functools.partial(self._in_trio_thread, fn, write))
        except _BusyHere:
            raise trio.WouldBlock from None

    async def _read(self, fn: Callable[[_Conn], T]) -> T:
        return await self._run(fn, write=False)

    async def _write(self, fn: Callable[[_Conn], T]) -> T:
        return await self._run(fn, write=True)

    # The shared SQL (``..sql``) runs its steps through these: a write holds the database lock.
    _dialect: ClassVar[Dialect] = SQLITE

    async def _sql_read(self, op: Callable[[Any], T]) -> T:
        return await self._run(op, write=False)

    async def _sql_write(self, op: Callable[[Any], T], *, idempotent: bool = True) -> T:
        return await self._run(op, write=True, here=True)

    def _sql_step(self, method: str) -> Callable[..., Any]:
        step: Callable[..., Any] = getattr(self, f"_op_{method}")
        return step

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
        """The rows of every turn the session sees, its forked-from ones included."""
        return _visible_rows(conn, SQLITE, ranges_of(conn, SQLITE, session_id))

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
    def _append_rows(conn: _Conn, session_id: str, rows: Sequence[_Row]) -> None:
        conn.executemany(
            "INSERT INTO turns (session_id, seq, id, role, body, run_id) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (session_id, seq, tid, role, _rows._row_body(body, tid, role), run_id)
                for seq, tid, role, body, run_id in rows
            ],
        )

    def _rewrite_turns(
        self,
        conn: _Conn,
        session_id: str,
        old: Sequence[tuple[int, str, str, bytes]],
        new: Sequence[_Row],
    ) -> None:
        """Replace the turns the session sees (``old``) with ``new``, writing only from the
        first one ``new`` does not repeat (a row's run id follows from its turn); its forks
        seeing the turns from there get them first, and a fork's own view shares less."""
        keep = 0
        for (_, tid, role, body), (_, *turn, _) in zip(old, new, strict=False):
            if [tid, role, _turn_json(tid, role, body)] != turn:
                break  # another id, role or turn: rewritten from here on
            keep += 1
        if keep == len(old) == len(new):
            return
        unshare(conn, SQLITE, session_id, keep)  # forks seeing the old turns keep them
        shared = share_less(conn, SQLITE, session_id, keep)
        conn.execute(_SQL.delete_turns_from, (session_id, keep))
        self._append_rows(conn, session_id, new[keep:])
        if shared:  # its counts counted the turns it no longer shares
            recount(conn, SQLITE, session_id)

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
        stored_owner = _rows._decode_owner(stored[1], data.id) if stored else None
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
                _rows._metadata_json(metadata),
                data.created_at,
                data.updated_at,
                None if owner is None else _rows._owner_json(owner),
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
                metadata=_rows._decode_metadata(metadata, session_id),
                turns=_rows._session_turns(conn, session_id),
                runs=self._runs(conn, session_id),
                agent_id=agent_id,
                project_root=project_root,
                run_owner=_rows._decode_owner(owner, session_id),
                extra_fields=_rows._decode_extra(extra, session_id),
            )
            return data, int(rev)

        return op

    async def get_rev(self, session_id: str) -> int | None:
        """The session's ``rev`` (one indexed read), or ``None`` when absent."""
        return await self._run(self._get_rev_op(session_id), write=False, here=True)

    def _get_rev_op(self, session_id: str) -> Callable[[_Conn], int | None]:
        _session_id(session_id)

        def op(conn: _Conn) -> int | None:
            rev = self._rev(conn, session_id)
            return rev or None

        return op

    def _op_save(
        self, conn: _Conn, data: SessionData, *, expected_rev: int | None = None
    ) -> Revision:
        data = _rows._valid_header(data)
        rows = turn_rows(data.turns, "$.turns")

        def write() -> None:
            self._write_header(conn, data, data.metadata)
            self._rewrite_turns(conn, data.id, self._turn_rows(conn, data.id), rows)
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
    ) -> _rows._AppendPlan:
        """The validated ``(session id, turn parameters, run parameters)`` of one append."""
        _session_id(session_id)
        values = [
            (session_id, tid, role, _rows._row_body(body, tid, role), run_id)
            for _, tid, role, body, run_id in turn_rows(turns)
        ]
        run = None
        if options is not None:
            checked = _rows._options_run_body(options)
            if checked is not None:
                run = (session_id, *checked)
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
        return self._apply_plan(conn, self._append_plan(session_id, turns, options))

    def _apply_plan(self, conn: _Conn, plan: _rows._AppendPlan) -> Revision:
        """One append (its plan made): a retried one without a run writes nothing."""
        session_id, values, run = plan
        if run is not None:
            return self._append_with_run(conn, session_id, values, run)
        if values and conn.execute(fork_sql(SQLITE).link_of, (session_id,)).fetchone():
            values = self._unshared_values(conn, session_id, values)
        if values:
            try:
                added = conn.executemany(_rows._APPEND_TURN, values).rowcount
            except sqlite3.IntegrityError:  # the foreign key: no such session
                raise self._missing(session_id) from None
            if added != len(values):
                self._check_retried(conn, session_id, values)
            if not added:  # every turn was stored already: a retried append
                rev = self._rev(conn, session_id)
                return Revision(rev, rev)
        else:
            rev = self._rev(conn, session_id)
            if rev:
                return Revision(rev, rev)
            raise self._missing(session_id)
        bumped = conn.execute(_rows._BUMP + " RETURNING rev", (_now(), session_id)).fetchone()
        if bumped is None:
            raise self._missing(session_id)
        return Revision(bumped[0] - 1, bumped[0])

    def _append_with_run(
        self,
        conn: _Conn,
        session_id: str,
        values: builtins.list[_rows._TurnValues],
        run: _rows._RunValues,
    ) -> Revision:
        """An append upserting a run: it bumps the rev even when every turn is stored, so
        the bump comes first and says whether the session is a fork (three statements, as
        many as a plain append)."""
        bumped = conn.execute(_rows._BUMP_FORKED, (_now(), session_id, session_id)).fetchone()
        if bumped is None:
            raise self._missing(session_id)
        rev, forked = bumped
        if values and forked:
            values = self._unshared_values(conn, session_id, values)
        if values:
            added = conn.executemany(_rows._APPEND_TURN, values).rowcount
            if added != len(values):
                self._check_retried(conn, session_id, values)
        conn.execute(_rows._UPSERT_RUN, run)
        return Revision(rev - 1, rev)

    @classmethod
    def _check_retried(
        cls, conn: _Conn, session_id: str, values: Sequence[_rows._TurnValues]
    ) -> None:
        """Raise ``ConflictError`` if a skipped turn id is stored with other content.

        Reads only the rows of the appended ids (index lookups), and only when
        the insert skipped some: a retried append costs nothing more.
        """
        stored = {
            v[1]: conn.execute(
                "SELECT role, body FROM turns WHERE session_id = ? AND id = ?", (session_id, v[1])
            ).fetchone()
            for v in values
        }
        cls._check_same(session_id, values, stored)

    @classmethod
    def _unshared_values(
        cls, conn: _Conn, session_id: str, values: Sequence[_rows._TurnValues]
    ) -> builtins.list[_rows._TurnValues]:
        """``values`` without the turns a fork sees already in the rows it shares (a retried
        append); ``ConflictError`` when one of those ids holds other content there."""
        rows = shared_turns(conn, SQLITE, session_id, [v[1] for v in values])
        shared = {tid: (role, body) for _, tid, role, body in rows.values()}
        if shared:
            cls._check_same(session_id, [v for v in values if v[1] in shared], shared)
        return [v for v in values if v[1] not in shared]

    @staticmethod
    def _check_same(
        session_id: str,
        values: Sequence[_rows._TurnValues],
        stored: Mapping[str, tuple[str, bytes]],
    ) -> None:
        """Raise ``ConflictError`` if a turn of ``values`` is ``stored`` with other content."""
        held = {}
        for _, tid, role, body, _ in values:
            stored_role, stored_body = stored[tid]
            theirs = _turn_json(tid, stored_role, stored_body)
            if theirs != _turn_json(tid, role, body):
                held[tid] = _decode_row(
                    theirs, SessionTurn, "turns", session_id, f"id {preview(tid)}"
                )
        if held:
            incoming = [
                _decode_row(_turn_json(*v[1:4]), SessionTurn, "turns", session_id, "")
                for v in values
            ]
            fresh_turns(session_id, incoming, held)

    def _bulk_append(
        self, conn: _Conn, plans: Sequence[_rows._AppendPlan]
    ) -> builtins.list[Revision]:
        """Consecutive appends in two ``executemany`` statements (three with runs).

        Equivalent to applying them one by one: each session's turns keep their
        order (each row's ``seq`` follows the rows inserted before it), and its runs
        are upserted in order after them (runs and turns are numbered apart); a
        fork's appends, which check the turn ids it shares, are applied one by one
        (sessions are written apart). Raises when a session is missing or a turn id
        is stored already (a retry or a conflict), so the caller redoes the writes
        one by one.
        """
        now = _now()
        sids = sorted({p[0] for p in plans})
        marks = ", ".join("?" * len(sids))
        forks = {
            r[0]
            for r in conn.execute(
                f"SELECT session_id FROM forks WHERE session_id IN ({marks})", sids
            )
        }
        if forks:
            alone = {i: self._apply_plan(conn, p) for i, p in enumerate(plans) if p[0] in forks}
            rest = [p for p in plans if p[0] not in forks]
            together = iter(self._bulk_append(conn, rest) if rest else [])
            return [alone[i] if i in alone else next(together) for i in range(len(plans))]
        revs = dict(
            conn.execute(
                f"SELECT id, rev FROM sessions WHERE id IN ({', '.join('?' * len(sids))})", sids
            ).fetchall()
        )
        if conn.executemany(_rows._BUMP, [(now, p[0]) for p in plans]).rowcount != len(plans):
            raise SessionNotFoundError("an appended-to session is missing")
        values = [v for p in plans for v in p[1]]
        if values and conn.executemany(_rows._APPEND_TURN, values).rowcount != len(values):
            raise ConflictError("a batched append repeats a stored turn id")
        runs = [p[2] for p in plans if p[2] is not None]
        if runs:
            conn.executemany(_rows._UPSERT_RUN, runs)
        revisions = []
        for sid, _, _ in plans:  # each append bumped its session's rev by one, in order
            revs[sid] += 1
            revisions.append(Revision(revs[sid] - 1, revs[sid]))
        return revisions

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """Turns ``from_`` (0-based) onward, at most ``limit``, oldest first."""
        return await self._read(self._get_turns_op(session_id, from_, limit))

    def _get_turns_op(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> Callable[[_Conn], builtins.list[SessionTurn]]:
        check_turn_slice(session_id, from_, limit)

        def op(conn: _Conn) -> builtins.list[SessionTurn]:
            rows = _visible_rows(conn, SQLITE, ranges_of(conn, SQLITE, session_id), from_, limit)
            return list(_rows._decode_turns(session_id, rows))

        return op

    async def load_model_view(self, session_id: str) -> builtins.list[SessionTurn] | None:
        """``model_view`` of the stored turns, reading none a compaction summarized; ``None``
        when absent. One read transaction (``_rows._model_view``)."""
        return await self._read(self._model_view_op(session_id))

    def _model_view_op(
        self, session_id: str
    ) -> Callable[[_Conn], builtins.list[SessionTurn] | None]:
        _session_id(session_id)

        def op(conn: _Conn) -> builtins.list[SessionTurn] | None:
            if conn.execute(_SQL.rev, (session_id,)).fetchone() is None:
                return None
            if conn.execute(fork_sql(SQLITE).link_of, (session_id,)).fetchone() is not None:
                # A fork: its turns span the rows it shares (read whole, then the rule).
                turns = _rows._session_turns(conn, session_id)
                return list(model.model_view(turns))
            return _rows._model_view(conn, session_id)

        return op

    def _op_update_run(
        self,
        conn: _Conn,
        session_id: str,
        run: SessionRun,
        options: model.UpdateRunOptions | None = None,
    ) -> Revision:
        _session_id(session_id)
        body = _run_body(run)
        if options is not None:
            _rows._valid_body(options, model.UpdateRunOptions, "update run options")
        bumped = conn.execute(_rows._BUMP + " RETURNING rev", (_now(), session_id)).fetchone()
        if bumped is None:  # no such session: nothing written
            return Revision(0, 0)
        conn.execute(_rows._UPSERT_RUN, (session_id, run.id, body))
        return Revision(bumped[0] - 1, bumped[0])

    def _op_update_status(
        self,
        conn: _Conn,
        session_id: str,
        status: model.SessionStatus,
        *,
        owner: model.RunOwner | None = None,
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
                None if owner is None else _rows._owner_json(owner),
                preserve_updated_at,
                _now(),
                session_id,
            ),
        ).fetchone()
        return Revision(0, 0) if row is None else Revision(row[0] - 1, row[0])

    def _op_delete(self, conn: _Conn, session_id: str) -> None:
        _session_id(session_id)
        # Remember the last rev, so a session re-created with this id continues past it.
        conn.execute(
            "UPDATE rev_floor SET rev = MAX(rev, (SELECT rev FROM sessions WHERE id = ?))"
            " WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?)",
            (session_id, session_id),
        )
        unshare(conn, SQLITE, session_id)  # its forks keep what they see
        conn.execute(_SQL.delete_session, (session_id,))
        conn.execute(_SQL.delete_sends, (session_id,))
