"""The PostgreSQL store's connections: reconnects, outages, the LISTEN change feed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, TypeAlias

import attrs
import psycopg
import trio
from psycopg import sql
from psycopg.abc import Params
from psycopg.conninfo import conninfo_to_dict
from psycopg.waiting import Ready, Wait

from ._rows import (
    _SERVER_GONE,
    _Connection,
    _Cursor,
    _log,
)

__all__ = ["CHANGES_CHANNEL", "ChangeListener", "PostgresStoreStatistics"]

# ---------------------------------------------------------------------------
# Connections


def _connection_lost(raw: _Connection, exc: psycopg.Error) -> bool:
    """Whether ``exc`` ended the server session (rather than failing one statement on it).

    libpq's own failures carry no SQLSTATE (a dead socket, a connection left
    in pipeline mode); class 08 is a connection exception.
    """
    state = exc.sqlstate
    return raw.closed or state is None or state.startswith("08") or state in _SERVER_GONE


async def run_statement(cur: _Cursor, query: str, params: Params) -> Any:
    """The first row of ``query`` run with ``cur`` (autocommit: its own transaction), its
    socket awaited in the trio thread instead of a worker thread blocking on it.

    It drives psycopg's own protocol generator (what ``Cursor.execute`` hands its
    blocking wait), so preparing, adapting and errors are exactly psycopg's. Run it
    shielded: stopped midway, the connection is left mid-protocol (no longer reusable).
    """
    gen = cur._execute_gen(query, params, prepare=True)  # a hot statement: prepared at once
    fileno = cur.connection.fileno()
    try:
        wait = next(gen)
        while True:
            if wait == Wait.R:
                await trio.lowlevel.wait_readable(fileno)
                wait = gen.send(Ready.R)
            else:  # the query not flushed yet: the socket writable, or an answer to read
                wait = gen.send(await _writable_or_readable(fileno))
    except StopIteration:
        pass
    return cur.fetchone()


async def _writable_or_readable(fileno: int) -> Ready:
    ready: list[Ready] = []
    async with trio.open_nursery() as nursery:

        async def wait_for(event: Callable[[int], Awaitable[None]], answer: Ready) -> None:
            await event(fileno)
            ready.append(answer)
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait_for, trio.lowlevel.wait_writable, Ready.W)
        nursery.start_soon(wait_for, trio.lowlevel.wait_readable, Ready.R)
    return ready[0]


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
    next operation that succeeds on a connection opened since. Each is logged when it starts
    (``WARNING``) and when it ends (``INFO``), never once per operation. Shared by the
    store's connections (threads).
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

    def answered(self, conn: _Conn) -> None:
        """An operation on ``conn`` succeeded: the episode under way, if any, is over, once
        a connection opened since it began answers (a connection opened before may be a
        straggler the server going down still served)."""
        if self.since is None:  # the common case, without the lock
            return
        with self.lock:
            if self.since is None or conn.opened_in < self.count:
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
    statements: _Cursor | None = None
    """The cursor :func:`run_statement` uses on ``raw``: kept, it keeps psycopg's
    adapters for the parameters of the statement it ran last."""
    connected: bool = False
    reconnects: int = 0
    opened_in: int = 0
    """``outages.count`` when this connection began to connect."""

    def ensure(self) -> _Connection:
        if self.raw is not None and _reusable(self.raw):
            return self.raw
        self.discard()
        # The episode this connection belongs to is the one under way when it began to
        # connect: a connect that began before an outage and ended after another
        # connection noticed it reached the server going down, and dies of that outage.
        episode = self.outages.count
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
        self.opened_in = episode
        self.raw = raw
        return raw

    def statement_cursor(self, raw: _Connection) -> _Cursor:
        """The kept cursor of ``raw`` (this connection's open one) for :func:`run_statement`."""
        cur = self.statements
        if cur is None or cur.connection is not raw:
            cur = self.statements = raw.cursor()
        return cur

    def discard(self) -> None:
        self.statements = None
        if self.raw is not None:
            self.raw.close()
            self.raw = None

    def discard_unless_reusable(self) -> None:
        if self.raw is not None and not _reusable(self.raw):
            self.discard()


class _IdlePool:
    """The pooled connections not in use, the last one used taken first: a lone caller
    keeps to one connection (its server process warm, its statements prepared) instead of
    taking each in turn."""

    def __init__(self, conns: list[_Conn]) -> None:
        self._conns = list(conns)
        self._size = len(conns)
        self._free = trio.Semaphore(len(conns))

    def __len__(self) -> int:
        return len(self._conns)

    @property
    def in_use(self) -> int:
        """Connections in use right now."""
        return self._size - self._free.value

    @asynccontextmanager
    async def use(self) -> AsyncIterator[_Conn]:
        """An idle connection for the body, waiting for one (fairly) when all are in use.

        One free now is taken without a schedule point: what the body does with it
        (a statement) yields anyway.
        """
        try:
            self._free.acquire_nowait()
        except trio.WouldBlock:
            await self._free.acquire()
        conn = self._conns.pop()
        try:
            yield conn
        finally:
            self._conns.append(conn)
            self._free.release()


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
    listening: trio.Event = attrs.field(factory=trio.Event)
    """Set once the connection listens for the first time."""

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
                else:
                    trio.from_thread.run_sync(self.listening.set, trio_token=self.token)
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
