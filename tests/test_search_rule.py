"""One search rule for every store: the same words, folded and split alike, found alike.

Each store's ``search_meta`` must answer what the memory store (``search_page``, the
reference) answers: for text from every Unicode category, combining marks, mixed case,
tokens longer than a database's bound on one word, and turns holding megabytes of words.
"""

from __future__ import annotations

import sqlite3
import tempfile
import unicodedata
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import (
    AsyncExitStack,
    asynccontextmanager,
    closing,
    contextmanager,
    nullcontext,
)
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from _pg import DSN, schema_at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from zidane_actors.errors import ValidationError
from zidane_actors.model import (
    MAX_SEARCH_WORD_LENGTH,
    SessionData,
    SessionSearch,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    encode,
    encode_str,
    search_words,
)
from zidane_actors.server import serve
from zidane_actors.stores import (
    create_file_map_store,
    create_remote_store,
    open_memory_store,
    open_postgres_store,
    open_sqlite_store,
)
from zidane_actors.stores.sqlite import _schema as sqlite_schema

KINDS = ("sqlite", "pg", "file_map", "remote")
"""The stores compared with the memory store (``pg``: PostgreSQL, skipped where none runs)."""


class _Files:
    """A file map kept in memory (the file-map store's host adapter)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    async def get(self) -> dict[str, str]:
        await trio.lowlevel.checkpoint()
        return dict(self.files)

    async def save(self, files: dict[str, str]) -> None:
        await trio.lowlevel.checkpoint()
        self.files = dict(files)

    async def delete(self) -> None:
        await trio.lowlevel.checkpoint()
        self.files = {}


@contextmanager
def fresh_schema() -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex[:16]}"
    try:
        yield name
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@asynccontextmanager
async def stores(kind: str, sessions: list[SessionData]) -> AsyncIterator[list[tuple[Any, Any]]]:
    """Pairs of (memory store, ``kind`` store) holding ``sessions``: one pair, or one per
    session for the file map (it holds one session)."""
    groups = [[s] for s in sessions] if kind == "file_map" else [sessions]
    schemas = fresh_schema() if kind == "pg" else nullcontext("")
    with tempfile.TemporaryDirectory() as tmp, schemas as schema:
        async with AsyncExitStack() as stack:
            pairs: list[tuple[Any, Any]] = []
            for i, group in enumerate(groups):
                memory = await stack.enter_async_context(open_memory_store())
                if kind == "sqlite":
                    other: Any = await stack.enter_async_context(
                        open_sqlite_store(Path(tmp) / f"{i}.db")
                    )
                elif kind == "pg":
                    other = await stack.enter_async_context(
                        open_postgres_store(DSN, schema=schema, pool_size=1)
                    )
                elif kind == "remote":  # the REST server over SQLite, and its client
                    served = await stack.enter_async_context(
                        open_sqlite_store(Path(tmp) / f"{i}.db")
                    )
                    nursery = await stack.enter_async_context(trio.open_nursery())
                    stack.callback(nursery.cancel_scope.cancel)
                    url = await nursery.start(partial(serve, served, port=0))
                    other = await stack.enter_async_context(create_remote_store(url))
                else:
                    other = create_file_map_store(_Files())
                    stack.push_async_callback(other.aclose)
                for data in group:
                    await memory.save(data)
                    await other.save(data)
                pairs.append((memory, other))
            yield pairs


async def answers(store: Any, text: str) -> list[str]:
    return [r.id for r in (await store.search_meta(SessionSearch(text=text, limit=1000))).rows]


async def assert_same(kind: str, sessions: list[SessionData], queries: list[str]) -> None:
    """Each query answers on ``kind`` what it answers on the memory store."""
    async with stores(kind, sessions) as pairs:
        for memory, other in pairs:
            for text in queries:
                assert await answers(other, text) == await answers(memory, text), (kind, text)


def turn(i: int, *texts: str, tool: str | None = None) -> SessionTurn:
    content: tuple[Any, ...] = tuple(TextBlock(t) for t in texts)
    if tool is not None:
        content += (ToolCallBlock(id=f"c{i}", name=tool, input={}),)
    return SessionTurn(id=f"t{i}", role="user", created_at=1_000 + i, content=content)


def session(session_id: str, *turns: SessionTurn, title: str | None = None) -> SessionData:
    metadata = {} if title is None else {"title": title}
    return SessionData(
        id=session_id, created_at=1_000, updated_at=2_000, metadata=metadata, turns=turns
    )


# -- the rule ------------------------------------------------------------------------------


def test_words_are_folded_and_split_by_one_rule() -> None:
    """NFKC, case folded: a word matches itself however it is written; marks stay in it."""
    assert search_words("İstanbul") == search_words("İSTANBUL") == ["i̇stanbul"]
    assert search_words("ΣΊΣΥΦΟΣ") == search_words("Σίσυφος") == ["σίσυφοσ"]
    assert search_words("O\u0308l") == search_words("öl") == search_words("ÖL") == ["öl"]
    assert search_words("Straße ﬁne") == ["strasse", "fine"]
    assert search_words("हिन्दी get_weather") == ["हिन्दी", "get", "weather"]


# -- every store agrees with the memory store ------------------------------------------------

TRICKY = [
    session("a", turn(0, "Meet in İstanbul")),
    session("b", turn(0, "ΣΊΣΥΦΟΣ pushes"), title="Mythen"),
    session("c", turn(0, "Ein O\u0308lfass"), turn(1, "x", tool="Run_Öl")),
    session("d", turn(0, "ﬁne Straße"), title="ΌΣΟΣ"),
]
TRICKY_QUERIES = [
    "İstanbul",
    "i̇stanbul",
    "istanbul",
    "ΣΊΣΥΦΟΣ",
    "σίσυφος",
    "Σίσυφ",
    "ὅσος",
    "όσος",
    "öl",
    "O\u0308l",
    "ÖLFASS",
    "run_öl",
    "fine",
    "FI",
    "strasse",
    "STRAẞE",
    "mythen ΣΊΣΥΦΟΣ",
]


@pytest.mark.parametrize("kind", KINDS)
async def test_tricky_words_answer_as_the_memory_store(kind: str) -> None:
    async with stores(kind, TRICKY) as pairs:
        for memory, other in pairs:
            for text in TRICKY_QUERIES:
                assert await answers(other, text) == await answers(memory, text), text
    async with stores("sqlite" if kind == "file_map" else kind, TRICKY) as [(_, other)]:
        assert await answers(other, "İstanbul") == ["a"]
        assert await answers(other, "ΣΊΣΥΦΟΣ") == await answers(other, "σίσυφος") == ["b"]
        assert await answers(other, "öl") == await answers(other, "O\u0308l") == ["c"]


LONG = "aGVsbG8" * 600  # a 4,200-character base64-like token
URL = "https://example.com/download?token=" + "x9" * 1_500


@pytest.mark.parametrize("kind", KINDS)
async def test_a_turn_with_a_long_token_keeps_every_word_findable(kind: str) -> None:
    """A token past PostgreSQL's 2,047-byte word bound: its turn's other words, the token
    itself (any prefix a query can hold) and the URL's words are all found."""
    sessions = [session("a", turn(0, f"before {LONG} after"), turn(1, URL)), session("b")]
    queries = [
        "before",
        "after",
        "before after",
        LONG[:MAX_SEARCH_WORD_LENGTH],
        LONG[:10],
        "example download",
        ("x9" * 50)[:MAX_SEARCH_WORD_LENGTH],
        LONG[1:MAX_SEARCH_WORD_LENGTH],
    ]
    await assert_same(kind, sessions, queries)
    async with stores(kind, sessions) as [*_, (_, other)]:
        if kind != "file_map":
            for text in queries[:-1]:
                assert await answers(other, text) == ["a"], text


@pytest.mark.parametrize("kind", ("sqlite", "pg"))
async def test_a_turn_holding_megabytes_of_words_keeps_every_word_findable(kind: str) -> None:
    """Past PostgreSQL's 1 MB bound on one tsvector: every word still found."""
    words = [f"w{i:07d}q" for i in range(150_000)]  # 1.5 MB of distinct words
    sessions = [session("a", turn(0, " ".join(words)), title="Big"), session("b")]
    queries = [words[0], words[75_000], words[-1], "big " + words[-1], "w0149999"]
    await assert_same(kind, sessions, queries)
    async with stores(kind, sessions) as [(_, other)]:
        for text in queries:
            assert await answers(other, text) == ["a"], text


# -- property: random text through every store -----------------------------------------------

_ANY = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
_MARKS = st.characters(categories=("Mn", "Mc", "Me"))
_PIECES = st.one_of(
    st.text(_ANY, max_size=12),
    st.builds(
        lambda a, m: a + m, st.text(_ANY, min_size=1, max_size=3), st.text(_MARKS, max_size=3)
    ),
    st.sampled_from(["İstanbul", "ΣΊΣΥΦΟΣ", "O\u0308l", "öl", "ß", "ﬁ", "ǅ", "Ⅻ", "①", "ſ"]),
    st.builds(lambda c, n: c * n, st.sampled_from("aZ9é日"), st.integers(90, 2_500)),
)
_TEXT = st.lists(_PIECES, max_size=6).map(" ".join)


def _variant(text: str, how: int) -> str:
    return [
        text,
        text.upper(),
        text.lower(),
        text.swapcase(),
        unicodedata.normalize("NFD", text),
        unicodedata.normalize("NFKD", text),
    ][how]


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[SessionData], list[str]]:
    sessions = []
    texts: list[str] = []
    for sid in ("s0", "s1", "s2"):
        bodies = draw(st.lists(_TEXT, max_size=3))
        title = draw(st.none() | _TEXT)
        texts += bodies + ([title] if title else [])
        sessions.append(session(sid, *(turn(i, b) for i, b in enumerate(bodies)), title=title))
    queries = draw(st.lists(_TEXT, max_size=2))
    for _ in range(draw(st.integers(1, 5))):
        if texts:
            text = draw(st.sampled_from(texts))
            start = draw(st.integers(0, len(text)))
            end = draw(st.integers(start, min(len(text), start + 120)))
            queries.append(_variant(text[start:end], draw(st.integers(0, 5))))
    valid = []
    for query in queries:
        try:
            SessionSearch(text=query)
        except ValidationError:
            continue
        valid.append(query)
    return sessions, valid


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_case())
async def test_random_text_answers_as_the_memory_store(
    kind: str, case: tuple[list[SessionData], list[str]]
) -> None:
    await assert_same(kind, *case)


# -- migration: the words of a database written by the previous schema -----------------------


async def test_sqlite_file_of_the_previous_schema_is_searched_by_the_rule(tmp_path: Path) -> None:
    """A v9 file (its index made by SQLite's tokenizer) re-derives every turn's and header's
    words on open, keeps every row, and answers as the memory store."""
    db = tmp_path / "v9.db"
    previous = sqlite_schema.MIGRATIONS[:9]
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        sqlite_schema.migrate(conn, str(db), previous)
        conn.execute(
            "INSERT INTO sessions (id, status, metadata, created_at, updated_at) VALUES"
            " ('a', 'idle', '{\"title\":\"ΣΊΣΥΦΟΣ\"}', 1, 2), ('b', 'idle', '{}', 1, 3)"
        )
        rows = [("a", 0, turn(0, "Meet in İstanbul")), ("b", 0, turn(0, "Ein O\u0308lfass"))]
        for sid, seq, t in rows:
            conn.execute(
                "INSERT INTO turns (session_id, seq, id, role, body) VALUES (?, ?, ?, ?, ?)",
                (sid, seq, t.id, t.role, encode(t)),
            )
        conn.execute("INSERT INTO turns VALUES ('b', 1, 'bad', 'user', X'7b7b')")
    async with open_sqlite_store(db) as store:
        assert await answers(store, "İstanbul") == ["a"]
        assert await answers(store, "σίσυφος") == ["a"]
        assert await answers(store, "ölfass") == ["b"]
        assert [t.id for t in await store.get_turns("a")] == ["t0"]
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (sqlite_schema.SCHEMA_VERSION,)
        assert conn.execute("SELECT count(*) FROM turns").fetchone() == (3,)


async def test_postgres_schema_of_the_previous_version_is_searched_by_the_rule() -> None:
    """A schema at the previous version (words made by the server's regex and lower())
    re-derives every turn's and header's words, keeps every row, and answers by the rule."""
    with schema_at(4) as (schema, conn):
        conn.execute(
            "INSERT INTO sessions (id, created_at, updated_at, status, metadata) VALUES"
            " ('a', 1, 2, 'idle', '{\"title\":\"ΣΊΣΥΦΟΣ\"}'), ('b', 1, 3, 'idle', '{}')"
        )
        rows = [("a", 0, turn(0, "Meet in İstanbul")), ("b", 0, turn(0, f"x {LONG} y"))]
        for sid, seq, t in rows:
            conn.execute(
                "INSERT INTO turns (session_id, seq, id, role, body) VALUES (%s, %s, %s, %s, %s)",
                (sid, seq, t.id, t.role, encode_str(t)),
            )
        conn.execute("UPDATE turns SET words = turn_words(body)")
        async with open_postgres_store(DSN, schema=schema, pool_size=1) as store:
            assert await answers(store, "İstanbul") == ["a"]
            assert await answers(store, "ΣΊΣΥΦΟΣ") == ["a"]
            assert await answers(store, "y") == await answers(store, LONG[:50]) == ["b"]
            assert [t.id for t in await store.get_turns("b")] == ["t0"]
