"""Opening a SQLite store: connect, switch to WAL, migrate, start its worker thread."""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ...errors import (
    CorruptDataError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    ValidationError,
)
from ...model import (
    preview,
)
from .._thread import start_worker_thread
from ._rows import (
    _BUSY_CODES,
    _CACHE_KIB,
    _CORRUPT_CODES,
    _SYNCHRONOUS,
    Durability,
    _Conn,
    _primary_code,
)
from ._schema import migrate, refuse_foreign
from ._store import SQLiteStore

__all__ = ["open_sqlite_store"]


def _prepare(conn: _Conn, path: str, durability: Durability, deadline: float) -> None:
    """Check, switch to WAL and migrate the file ``conn`` opened, until ``deadline`` if busy.

    Two processes opening one new file at once race for the switch to WAL,
    which SQLite answers "database is locked" at once, without its busy
    handler: the loser tries again (each step is idempotent) rather than fail.
    """
    delay = 0.005
    while True:
        try:
            # Before WAL (another program's file stays untouched), and in one read
            # snapshot: a process migrating the new file at once commits its tables and
            # its user_version together, never one between the two reads.
            conn.execute("BEGIN")
            refuse_foreign(conn, path)
            conn.execute("COMMIT")
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
            check_same_thread=False,  # the trio thread may run a job while the worker idles
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
    store = SQLiteStore(fspath, worker, busy_timeout_ms=busy_timeout_ms, busy_retries=busy_retries)
    indexer = store._start_indexer()
    try:
        yield store
    finally:
        indexer.cancel()
        with trio.CancelScope(shield=True):
            await store.aclose()
