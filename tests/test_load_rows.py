"""What a load of the SQL stores makes of odd stored rows (the rows read in one pass).

Each row is its own document: one holding two is corrupt, named by its seq;
a field a newer writer added is kept; a row nested past
``MAX_STORED_JSON_DEPTH`` is corrupt, even beside long text, and one at the
limit loads. The same rows are written into SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from test_postgres_store import admin, fresh_schema

from zidane_actors.errors import CorruptDataError
from zidane_actors.model import (
    MAX_STORED_JSON_DEPTH,
    SessionData,
    SessionRun,
    SessionTurn,
    TextBlock,
    encode,
)
from zidane_actors.stores import SessionStore, open_postgres_store, open_sqlite_store

_LONG = "x" * 3000
_TURNS = tuple(
    SessionTurn(
        id=f"t{i}", role="user", content=(TextBlock(_LONG if i % 2 else "a"),), created_at=i
    )
    for i in range(4)
)
_RUN = SessionRun(id="r", prompt="p", started_at=1, status="running")

Opener = Callable[[], Any]
Rewrite = Callable[[str, int, bytes], None]
"""Set the body of a row: table, seq (``runs``: the one run), the row's whole JSON."""


@asynccontextmanager
async def _sqlite(tmp_path: Path) -> AsyncIterator[tuple[Opener, Rewrite]]:
    path = tmp_path / "s.db"

    def rewrite(table: str, seq: int, body: bytes) -> None:
        where = "seq = ?" if table == "turns" else "? >= 0"
        with sqlite3.connect(path) as conn:
            conn.execute(f"UPDATE {table} SET body = ? WHERE {where}", (body, seq))

    yield (lambda: open_sqlite_store(path)), rewrite


@asynccontextmanager
async def _postgres(tmp_path: Path) -> AsyncIterator[tuple[Opener, Rewrite]]:
    from _pg import DSN

    with fresh_schema() as schema:

        def rewrite(table: str, seq: int, body: bytes) -> None:
            where = "seq = %s" if table == "turns" else "%s >= 0"
            admin(schema, f"UPDATE {table} SET body = %s WHERE {where}", (body.decode(), seq))

        yield (lambda: open_postgres_store(DSN, schema=schema, pool_size=1)), rewrite


_STORES = pytest.mark.parametrize("stores", [_sqlite, _postgres], ids=["sqlite", "postgres"])


async def _saved(opener: Opener) -> None:
    store: SessionStore
    async with opener() as store:
        await store.save(
            SessionData(id="s", created_at=1, updated_at=1, turns=_TURNS, runs=(_RUN,))
        )


def _nest(levels: int) -> str:
    return "[" * levels + "]" * levels


@_STORES
async def test_a_row_holding_two_documents_is_corrupt(tmp_path: Path, stores: Any) -> None:
    async with stores(tmp_path) as (opener, rewrite):
        await _saved(opener)
        rewrite("turns", 2, encode(_TURNS[2]) + b"," + encode(_TURNS[3]))
        async with opener() as store:
            with pytest.raises(CorruptDataError, match=r"turns.*seq[ =]2"):
                await store.load("s")


@_STORES
async def test_a_newer_writers_field_is_kept(tmp_path: Path, stores: Any) -> None:
    async with stores(tmp_path) as (opener, rewrite):
        await _saved(opener)
        rewrite("turns", 1, encode(_TURNS[1])[:-1] + b',"parentTurnId":"t0"}')
        rewrite("runs", 0, encode(_RUN)[:-1] + b',"later":{"a":[1]}}')
        async with opener() as store:
            loaded = await store.load("s")
        assert loaded is not None
        assert loaded.turns[1].extra_fields == {"parentTurnId": "t0"}
        assert loaded.runs[0].extra_fields == {"later": {"a": [1]}}
        assert loaded.turns[:1] + loaded.turns[2:] == _TURNS[:1] + _TURNS[2:]


@_STORES
@pytest.mark.parametrize("corrupt", [False, True])
@pytest.mark.parametrize("table", ["turns", "runs"])
async def test_a_row_nested_past_the_limit_is_corrupt(
    tmp_path: Path, stores: Any, corrupt: bool, table: str
) -> None:
    # a turn: turn, content, block, providerData around the arrays; a run: the run alone
    if table == "turns":
        nest = _nest(MAX_STORED_JSON_DEPTH - 4 + corrupt)
        body = f'{{"id":"t1","role":"user","content":[{{"type":"text","text":"{_LONG}",'
        body += f'"providerData":{{"x":{nest}}}}}],"createdAt":1}}'
    else:
        nest = _nest(MAX_STORED_JSON_DEPTH - 1 + corrupt)
        body = encode(_RUN)[:-1].decode() + f',"later":{nest}}}'
    async with stores(tmp_path) as (opener, rewrite):
        await _saved(opener)
        rewrite(table, 1 if table == "turns" else 0, body.encode())
        async with opener() as store:
            if corrupt:
                with pytest.raises(CorruptDataError, match=f"{table}.*MAX_STORED_JSON_DEPTH"):
                    await store.load("s")
            else:
                loaded = await store.load("s")
                assert loaded is not None and len(loaded.turns) == len(_TURNS)
