"""Opening a PostgreSQL store: connect, migrate, start its pool and change feed."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import psycopg
import trio

from ..._nursery import open_service_nursery
from ...errors import (
    InvalidNameError,
    StoreUnavailableError,
    ValidationError,
)
from ...model import (
    preview,
)
from ._conn import (
    _NOTIFY_SQL,
    _ChangeFeed,
    _Conn,
    _IdlePool,
    _Outages,
    _quiet_psycopg,
)
from ._rows import (
    _SCHEMA_NAME,
    _map_error,
)
from ._schema import migrate
from ._store import PostgresStore

__all__ = ["open_postgres_store"]


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
    (a host refreshes its cached sessions with it); the store is answered once
    it listens (waiting at most ``connect_timeout``), so a change committed
    after that is told. When that connection is lost it reconnects and tells
    subscribers to resync.
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
    store = PostgresStore(
        schema=schema,
        writer=writer,
        pool=pooled,
        idle=_IdlePool(pooled),
        max_retries=retries,
        outages=outages,
    )
    indexer = store._start_indexer()
    if not listen:
        try:
            yield store
        finally:
            indexer.cancel()
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
            # Every change committed once the store is answered is told: the feed listens
            # first (a notification sent before its LISTEN would be lost, with no resync).
            with trio.move_on_after(connect_timeout):
                await feed.listening.wait()
            try:
                yield store
            finally:
                feed.stopped = True
    finally:
        indexer.cancel()
        await store.aclose()
