"""The SQLite store: artifacts, send requests, schedules and batched writes on top."""

from __future__ import annotations

import builtins
import functools
import sqlite3
from collections.abc import Callable, Sequence, Sized
from typing import Any, Final, cast

import outcome
import trio

from ... import model
from ...errors import (
    SessionNotFoundError,
    StoreError,
)
from ...model import (
    SendRequestClaim,
    SessionArtifact,
    check_artifact_id_free,
    encode,
    filter_artifacts,
    merge_artifact,
    new_id,
    normalize_artifact,
    preview,
    select_artifact_evictions,
    send_request_evictions,
    validate_id,
)
from .._edits import TurnsEdits
from .._protocol import WRITE_METHODS, Revision, StoreWrite, write_step
from .._validate import (
    check_artifact_filter_ids,
    check_artifact_ids,
    check_send_claim,
)
from ..sql import (
    SQLITE,
    SQLClaims,
    SQLSchedules,
    SQLSendRequests,
    SQLWrites,
    send_record,
    settle_send_request,
)
from ._forks import SQLiteForks
from ._meta import SQLiteMeta
from ._rows import (
    _SQL,
    T,
    _AppendPlan,
    _Busy,
    _Conn,
    _decode_row,
    _now,
    _session_id,
    _valid_body,
)

__all__ = ["SQLiteStore"]

_HERE_TURNS: Final = 64
"""The most turns a lone append may write from the trio thread."""


def _few(turns: object) -> bool:
    """Whether an append of ``turns`` is small enough to run in the trio thread."""
    return isinstance(turns, Sized) and len(turns) <= _HERE_TURNS


def _small(write: StoreWrite) -> bool:
    """Whether a lone ``write`` is small enough to run in the trio thread: a whole
    session saved or deleted may be any number of rows."""
    if write.method == "append_turns":
        return len(write.args) > 1 and _few(write.args[1])
    return write.method not in ("save", "delete")


class SQLiteStore(
    SQLiteForks, SQLiteMeta, SQLSchedules, SQLSendRequests, TurnsEdits, SQLWrites, SQLClaims
):
    """A :class:`~zidane_actors.stores.FullSessionStore` on one SQLite file.

    Create it with :func:`open_sqlite_store`. Besides the protocol it offers
    :meth:`run_epoch` (the lease epoch ``claim_run`` bumps),
    :meth:`apply_writes` (group commit) and :meth:`statistics`.
    """

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[model.SessionTurn],
        options: model.AppendTurnsOptions | None = None,
    ) -> Revision:
        """Append turns (incremental); ``options.run`` is upserted in the same write.

        A lone append of up to ``_HERE_TURNS`` turns may run in the trio thread
        (see ``SQLiteBase._run``); a bigger one, an import, always goes to the
        connection's thread, which never holds the run loop.
        """
        return await self._run(
            lambda conn: self._op_append_turns(conn, session_id, turns, options),
            write=True,
            here=_few(turns),
        )

    async def delete(self, session_id: str) -> None:
        """Delete a session (and its artifacts and send-request ids).

        Always in the connection's thread: its rows may be many.
        """
        await self._run(lambda conn: self._op_delete(conn, session_id), write=True)

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

    def _op_delete_artifact(self, conn: _Conn, session_id: str, artifact_id: str) -> None:
        _session_id(session_id)
        validate_id(artifact_id, what="artifact id")
        if conn.execute(
            "DELETE FROM artifacts WHERE session_id = ? AND id = ?", (session_id, artifact_id)
        ).rowcount:
            self._bump(conn, session_id, updated_at=None)

    async def list_artifacts(
        self, filter: model.ArtifactFilter | None = None
    ) -> builtins.list[SessionArtifact]:
        """Artifacts, newest ``updatedAt`` first, filtered (``filter_artifacts``)."""
        if filter is not None:
            _valid_body(filter, model.ArtifactFilter, "artifact filter")
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

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> SendRequestClaim:
        """Claim ``request_id`` in one insert-or-detect step, keeping the newest ids per session."""
        check_send_claim(session_id, request_id, fingerprint)

        def op(conn: _Conn) -> SendRequestClaim:
            self._sql_held_for_send(conn, session_id)
            rows = conn.execute(
                "SELECT request_id, fingerprint, created_at, result FROM send_requests"
                " WHERE session_id = ?",
                (session_id,),
            ).fetchall()
            records = [send_record(r, session_id) for r in rows]
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

    def _sql_held_for_send(self, conn: _Conn, session_id: str) -> None:
        """Refuse a send request of a session this store does not hold (checked in the write's
        transaction): a session created later under that id would inherit the claim."""
        if conn.execute(_SQL.held_for_send, (session_id,)).fetchone() is None:
            raise SessionNotFoundError(
                f"cannot claim a send request: SQLite store {self._path} has no session"
                f" {preview(session_id)} (save the session first)"
            )

    def _op_settle_send_request(
        self, conn: _Conn, session_id: str, request_id: str, result: model.JsonValue
    ) -> None:
        settle_send_request(SQLITE, conn, session_id, request_id, result)

    # -- ids ------------------------------------------------------------------------------------

    async def generate_session_id(self) -> str:
        """A new random session id."""
        return new_id()

    async def generate_turn_id(self) -> str:
        """A new random turn id."""
        return new_id()

    # -- group commit ---------------------------------------------------------------------------

    def _write_op(self, write: StoreWrite) -> outcome.Outcome[Callable[..., Any]]:
        """The ``_op_*`` applying ``write``, or the refusal of a write no batch takes."""
        return outcome.capture(write_step, write, self._sql_step)

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
        self, write: StoreWrite, found: outcome.Outcome[Callable[..., Any]]
    ) -> outcome.Outcome[Any]:
        """A lone write in its own transaction, no SAVEPOINT: its failure rolls it all back."""
        if isinstance(found, outcome.Error):
            return found
        fn = found.unwrap()
        try:
            return outcome.Value(
                await self._run(
                    lambda conn: fn(conn, *write.args, **write.kwargs),
                    write=True,
                    here=_small(write),
                )
            )
        except Exception as exc:
            return outcome.Error(exc)

    def apply_nowait(self, call: StoreWrite) -> Any:
        """Make one small store call now, in the trio thread, or raise ``trio.WouldBlock``
        (nothing done) when it would have to wait.

        It does exactly what awaiting the call would (a write as one ``apply_writes``
        write, ``get_rev`` and ``get_meta`` as themselves), without waiting: only while
        the connection's thread and the run are idle (see ``WorkerThread.run_nowait``)
        and no other connection holds the database. A whole session saved or deleted,
        an import of many turns, and other reads always wait. A caller that is handed
        the answer owes the run loop a checkpoint.
        """
        if call.method in ("get_rev", "get_meta"):
            read = self._read_op(call)
            assert read is not None
            return self._run_nowait(read, write=False)
        if call.method not in WRITE_METHODS or not _small(call):
            raise trio.WouldBlock
        fn = self._write_op(call).unwrap()
        return self._run_nowait(lambda conn: fn(conn, *call.args, **call.kwargs), write=True)

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
        if method == "load_model_view":
            return self._model_view_op(*read.args, **read.kwargs)
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
        found = [self._write_op(w) for w in writes]
        if len(writes) == 1:
            return [await self._apply_one(writes[0], found[0])]
        fns = [f.value for f in found if isinstance(f, outcome.Value)]

        def all_at_once(conn: _Conn) -> builtins.list[Any]:
            # Runs of appends (of turns, or with a run) share their executemany statements.
            results: builtins.list[Any] = []
            plans: builtins.list[_AppendPlan] = []
            for fn, w in zip(fns, writes, strict=True):
                if w.method == "append_turns" and not w.kwargs:
                    plan = self._append_plan(*w.args)
                    if plan[1] or plan[2] is not None:
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
            if len(fns) == len(writes):
                batch = self._in_savepoint(conn, lambda: all_at_once(conn))
                if type(batch) is outcome.Value:
                    return [outcome.Value(v) for v in batch.value]
            # A write failed (or was refused up front): one savepoint per write.
            answers: builtins.list[outcome.Outcome[Any]] = []
            for w, f in zip(writes, found, strict=True):
                if isinstance(f, outcome.Value):
                    step = functools.partial(f.value, conn, *w.args, **w.kwargs)
                    answers.append(self._in_savepoint(conn, step))
                else:
                    answers.append(f)  # the refusal (the same on every attempt)
            return answers

        try:
            return await self._write(op)
        except StoreError as exc:
            return [outcome.Error(exc) for _ in writes]
