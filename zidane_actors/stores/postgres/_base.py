"""The PostgreSQL store's plumbing (pool, retries, pipelining, LISTEN) and session writes."""

from __future__ import annotations

import builtins
import functools
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, ClassVar

import attrs
import outcome
import psycopg
import trio
from psycopg import errors as pg_errors
from psycopg.abc import Params

from ... import model
from ...errors import (
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnsupportedOperationError,
)
from ...model import SessionArtifact, SessionData, SessionTurn, validate_id
from .._protocol import (
    Revision,
    StoreWrite,
    stale,
)
from .._validate import (
    check_turn_slice,
)
from ..sql import POSTGRES, Dialect
from ._conn import (
    _QUIET,
    ChangeListener,
    PostgresStoreStatistics,
    _ChangeFeed,
    _Conn,
    _connection_lost,
    _IdlePool,
    _Outages,
    _reusable,
    run_statement,
)
from ._reads import (
    _AGG,
    _decode_list,
    _session_where,
)
from ._rows import (
    _BACKOFF_S,
    _SQL,
    _TRANSIENT,
    T,
    _Connection,
    _Cursor,
    _extra,
    _map_error,
    _SlowPath,
    seen_scalar,
)
from ._writes import (
    _WRITES,
    _append_one,
    _append_turns,
    _appended_one,
    _checked_append,
    _create,
    _first_row,
    _metadata,
    _owner,
    _pipelined_writes,
    _save,
    _write_fn,
)

__all__ = ["PostgresBase"]


@attrs.define(eq=False)
class PostgresBase:
    """A :class:`~zidane_actors.stores.FullSessionStore` and ``BatchingStore`` on PostgreSQL.

    Build it with :func:`open_postgres_store`. Beyond the protocol it offers
    :meth:`run_epoch`, the fencing token every successful :meth:`claim_run`
    increments.
    """

    _schema: str
    _writer: _Conn
    _pool: builtins.list[_Conn]
    _idle: _IdlePool
    _max_retries: int
    _outages: _Outages
    _closed: bool = False
    _writes: int = 0
    """Writes this store ran (its background indexer's aside: it looks after each)."""
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

    def _transact(
        self,
        conn: _Conn,
        op: Callable[[_Cursor], T],
        idempotent: bool,
        pipelined: bool = False,
        autocommit: bool = False,
        failed: BaseException | None = None,
    ) -> T:
        """Run ``op`` in one transaction, retrying transient failures a bounded number of times.

        Serialization failures and deadlocks roll back, so they are always
        retried; a lost connection is retried when ``op`` is idempotent or
        never started (``BEGIN`` failed). A connection that failed, or that an
        error left inside a transaction or in pipeline mode, is discarded: the
        next attempt (or operation) opens a fresh one. ``pipelined``: the transaction runs
        in pipeline mode (``BEGIN`` sent with the first statement, ``COMMIT`` with the
        writes ``op`` leaves unanswered), for an ``op`` reading once, then writing.
        ``autocommit``: ``op`` runs outside a transaction (no ``BEGIN`` and ``COMMIT``
        round trips): a single statement, its own transaction, or reads. ``failed``: the
        first attempt was made already (in the trio thread, :meth:`_statement`) and failed
        with it; these are the retries.
        """
        with _QUIET.active():
            self._check_open()  # again: the store may have closed while this waited for ``conn``
            last = failed
            for attempt in range(0 if failed is None else 1, self._max_retries + 1):
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
                    with (
                        raw.pipeline() if pipelined else nullcontext(),
                        nullcontext() if autocommit else raw.transaction(),
                        raw.cursor() as cur,
                    ):
                        started = True
                        result = op(cur)
                    self._outages.answered(conn)
                    return result
                except psycopg.Error as exc:
                    last = self._retryable(conn, raw, exc)
                    if started and not idempotent and not isinstance(exc, _TRANSIENT):
                        self._outages.gave_up()
                        raise StoreUnavailableError(
                            f"PostgreSQL connection lost during a non-idempotent write"
                            f" (its outcome is unknown): {exc}"
                        ) from exc
                finally:
                    conn.discard_unless_reusable()
            self._outages.gave_up()
            raise StoreUnavailableError(
                f"PostgreSQL unavailable after {self._max_retries + 1} attempts: {last}"
            ) from last

    def _retryable(self, conn: _Conn, raw: _Connection, exc: psycopg.Error) -> psycopg.Error:
        """``exc``, when the operation may be made again: a transient failure (rolled
        back), or a lost connection (discarded, the outage counted). Any other failure
        raises the store's error for it."""
        if isinstance(exc, _TRANSIENT):
            return exc
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and _connection_lost(
            raw, exc
        ):
            conn.discard()
            self._outages.lost(conn, exc)
            return exc
        raise _map_error(exc) from None

    async def _batch(self, op: Callable[[_Cursor], T]) -> T:
        """Run a batch of writes on the batch connection (batches lock many rows: one at a
        time, so they cannot deadlock one another)."""
        self._check_open()
        return await trio.to_thread.run_sync(
            self._transact, self._writer, op, True, limiter=self._writer.limiter
        )

    async def _write(
        self,
        op: Callable[[_Cursor], T],
        *,
        idempotent: bool = True,
        pipelined: bool = False,
    ) -> T:
        """Run one write on any idle pooled connection (it locks at most one session row)."""
        self._check_open()
        async with self._pooled() as conn:
            return await trio.to_thread.run_sync(
                self._transact, conn, op, idempotent, pipelined, limiter=conn.limiter
            )

    async def _statement(self, query: str, params: Params, *, write: bool = True) -> Any:
        """The first row of one statement (a single append, a create, or a revision read:
        ``write=False``) run as its own transaction on an idle pooled connection; a unique
        violation (a statement failing wrote nothing) raises ``_SlowPath``.

        On an open connection its socket is awaited in the trio thread: the lone caller
        pays no round trip through a worker thread. A connection to open again, and the
        retries of a transient failure, go through :meth:`_transact` in a worker thread.
        Either way the statement holds the connection's limiter, as a worker thread
        does: with ``pool_size=1`` the pooled connection is the batch connection too.
        """
        self._check_open()
        if write:
            self._writes += 1
        async with self._pooled() as conn:
            limiter = conn.limiter
            try:
                limiter.acquire_nowait()
            except trio.WouldBlock:  # a batch holds it (``pool_size=1``)
                await limiter.acquire()
            failed: psycopg.Error | None = None
            try:
                self._check_open()  # again: the store may have closed while this waited
                raw = conn.raw
                if raw is not None and _reusable(raw):
                    with trio.CancelScope(shield=True):  # as a worker thread's: never left midway
                        try:
                            row = await run_statement(conn.statement_cursor(raw), query, params)
                        except pg_errors.UniqueViolation:
                            raise _SlowPath from None
                        except psycopg.Error as exc:
                            failed = self._retryable(conn, raw, exc)
                        else:
                            self._outages.answered(conn)
                            return row
                        finally:
                            conn.discard_unless_reusable()
            finally:
                limiter.release()
            transact = functools.partial(self._transact, autocommit=True, failed=failed)
            op = functools.partial(_first_row, query, params)
            return await trio.to_thread.run_sync(transact, conn, op, True, limiter=conn.limiter)

    def _pooled(self) -> AbstractAsyncContextManager[_Conn]:
        return self._idle.use()

    async def _read(self, op: Callable[[_Cursor], T]) -> T:
        """Run a read-only ``op`` on any idle pooled connection, outside a transaction:
        at read committed each statement sees its own snapshot inside one as well, so
        ``BEGIN`` and ``COMMIT`` would only add two round trips."""
        self._check_open()
        async with self._pooled() as conn:
            transact = functools.partial(self._transact, autocommit=True)
            return await trio.to_thread.run_sync(transact, conn, op, True, limiter=conn.limiter)

    # The shared SQL (``..sql``) runs its steps through these.
    _dialect: ClassVar[Dialect] = POSTGRES

    async def _sql_read(self, op: Callable[[Any], T]) -> T:
        return await self._read(op)

    async def _sql_write(self, op: Callable[[Any], T], *, idempotent: bool = True) -> T:
        return await self._write(op, idempotent=idempotent)

    def _sql_step(self, method: str) -> Callable[..., Any]:
        return _WRITES[method]

    def statistics(self) -> PostgresStoreStatistics:
        """Pool size, idle pooled connections, retries made, reconnects and feed resyncs so far."""
        conns = [self._writer, *(c for c in self._pool if c is not self._writer)]
        return PostgresStoreStatistics(
            schema=self._schema,
            connections=len(conns),
            idle_pooled=len(self._idle),
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
                f" {seen_scalar('s.id', f'SELECT {_AGG} FROM {{turns}} v')},"
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
                runs=_decode_list(cur, row[8], model.SessionRun, "runs", session_id),
                extra_fields=None if row[10] is None else _extra(row[10], session_id),
            )
            return data, int(row[9])

        return await self._read(op)

    async def get_rev(self, session_id: str) -> int | None:
        """The session's ``rev`` (one indexed read), or ``None`` when absent."""
        validate_id(session_id)
        row = await self._statement(_SQL.rev, (session_id,), write=False)
        return None if row is None else int(row[0])

    async def save(self, data: SessionData, *, expected_rev: int | None = None) -> Revision:
        """Create or overwrite the whole document (turns and runs replaced).

        With ``expected_rev``, only while the stored ``rev`` is that one. A session
        created (``expected_rev=0``) with no history yet is one statement.
        """
        create = _create(data) if expected_rev == 0 else None
        if create is None:
            return await self._write(lambda cur: _save(cur, data, expected_rev=expected_rev))
        row = await self._statement(*create)
        if row is None:
            raise stale(data.id, 0, await self.get_rev(data.id))
        return Revision(0, int(row[0]))

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: model.AppendTurnsOptions | None = None,
    ) -> Revision:
        """Append turns; a stored identical turn is skipped (a retry), a different one conflicts.

        Turns and their run go in one statement; if one of their ids is stored
        already (a retry, a conflict, a concurrent append), or the session is a
        fork, or another write of the session committed while the statement
        waited for its row, the append reruns in two steps that compare the
        stored rows.
        """
        unique, run = _checked_append(session_id, turns, options)
        if unique or run is not None:
            try:
                row = await self._statement(*_append_one(session_id, unique, run))
                return _appended_one(row, session_id)
            except _SlowPath:
                pass
        return await self._write(lambda cur: _append_turns(cur, session_id, turns, options))

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """Turns ``from_``… (at most ``limit``), oldest first; ``[]`` for an unknown id."""
        check_turn_slice(session_id, from_, limit)

        def op(cur: _Cursor) -> builtins.list[SessionTurn]:
            cur.execute(
                "SELECT "
                + seen_scalar(
                    "%(sid)s",
                    f"SELECT {_AGG} FROM (SELECT seq, body FROM {{turns}} v"
                    " WHERE seq >= %(from)s ORDER BY seq LIMIT %(limit)s) t",
                ),
                {"sid": session_id, "from": from_, "limit": limit},
            )
            row = cur.fetchone()
            return list(
                _decode_list(cur, row[0] if row else None, SessionTurn, "turns", session_id)
            )

        return await self._read(op)

    async def list(self, filter: model.SessionFilter | None = None) -> builtins.list[str]:
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

        The sessions it writes are locked first, in id order, so batches of
        several processes wait for one another instead of deadlocking (a
        deadlock is rolled back only after PostgreSQL's ``deadlock_timeout``).
        The batch first runs without savepoints, each run of appends as
        one statement (retries skipped, appends to unknown sessions failing
        alone) and other writes pipelined; if any other write fails, or a turn
        id is stored with other text, that attempt is rolled back and the batch
        reruns with each write in its own savepoint.
        """

        def fast(cur: _Cursor) -> builtins.list[outcome.Outcome[Any]]:
            _lock_in_order(cur, writes)
            return _pipelined_writes(cur.connection, writes)

        def savepoints(cur: _Cursor) -> builtins.list[outcome.Outcome[Any]]:
            _lock_in_order(cur, writes)
            conn = cur.connection
            results: builtins.list[outcome.Outcome[Any]] = []
            for write in writes:
                try:
                    fn = _write_fn(write)
                except UnsupportedOperationError as exc:
                    results.append(outcome.Error(exc))
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


def _lock_in_order(cur: _Cursor, writes: Sequence[StoreWrite]) -> None:
    """Take the advisory lock of each session ``writes`` write, in id order (when several).

    A batch then never holds one session's lock while waiting for another's
    that a batch of another process holds (rows locked while written, a
    creation's lock), so batches wait for one another instead of deadlocking.
    """
    ids: set[str] = set()
    for write in writes:
        first = write.args[0] if write.args else next(iter(write.kwargs.values()), None)
        if isinstance(first, SessionArtifact):
            first = first.session_id
        elif isinstance(first, SessionData):
            first = first.id
        if isinstance(first, str):
            ids.add(first)
    if len(ids) > 1:  # the lock a creation takes (``_versioned``): held already then
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(id, 0)) FROM unnest(%s::text[]) id",
            (sorted(ids),),
        )
