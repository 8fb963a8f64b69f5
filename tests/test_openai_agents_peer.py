"""ZidaneSession side by side with openai-agents' own SQLiteSession.

Every behaviour openai-agents' session tests check through the ``Session``
protocol (order, ``limit``, ``pop_item``, ``clear_session``, sessions sharing
one database, concurrent writers, use after close, refused items) runs here
against both sessions, each on a database of its own in ``tmp_path``, with
the same expected answers and exception types. The differences that remain
are tested last, each as the documented choice it is
(docs/integrations.md, "Differences from SQLiteSession").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from agents import SQLiteSession
from agents.memory import Session, SessionSettings

from zidane_actors.errors import InvalidNameError, WireFormatError, WireTypeError
from zidane_actors.integrations.openai_agents import ZidaneSession

Kind = Literal["sqlite", "zidane"]
Opener = Callable[..., Session]
KINDS: tuple[Kind, ...] = ("sqlite", "zidane")


def open_session(
    kind: Kind, directory: Path, session_id: str, settings: SessionSettings | None
) -> Session:
    if kind == "sqlite":
        return SQLiteSession(session_id, directory / "agents.db", session_settings=settings)
    return ZidaneSession(
        session_id, store=f"sqlite:{directory / 'zidane.db'}", session_settings=settings
    )


def close(session: Session) -> None:
    assert isinstance(session, SQLiteSession | ZidaneSession)
    session.close()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    kind: Kind = request.param
    return kind


@pytest.fixture
def make(kind: Kind, tmp_path: Path) -> Iterator[Opener]:
    """Opens sessions of ``kind`` on one database of this test; closes them all after."""
    opened: list[Session] = []

    def factory(session_id: str = "conv", settings: SessionSettings | None = None) -> Session:
        session = open_session(kind, tmp_path, session_id, settings)
        opened.append(session)
        return session

    yield factory
    for session in opened:
        close(session)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def msg(role: str, text: str) -> Any:
    return {"role": role, "content": text}


def texts(items: list[Any]) -> list[Any]:
    return [item.get("content") for item in items]


CONVERSATION: list[Any] = [
    msg("user", "Message 1"),
    msg("assistant", "Response 1"),
    msg("user", "Message 2"),
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": 2}'},
    {"type": "function_call_output", "call_id": "c1", "output": "found"},
    msg("assistant", "Response 2"),
]


# -- order and limit ------------------------------------------------------------------


def test_items_come_back_in_the_order_added_over_several_calls(make: Opener) -> None:
    session = make()

    async def main() -> None:
        assert await session.get_items() == []
        await session.add_items(CONVERSATION[:1])
        await session.add_items(CONVERSATION[1:4])
        await session.add_items(CONVERSATION[4:])
        assert await session.get_items() == CONVERSATION

    run(main())


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, CONVERSATION),
        (0, []),
        (1, CONVERSATION[-1:]),
        (2, CONVERSATION[-2:]),
        (4, CONVERSATION[-4:]),
        (6, CONVERSATION),
        (10, CONVERSATION),  # more than there are: all of them
        (-1, CONVERSATION),  # negative: all, as SQLite's LIMIT -1
        (-5, CONVERSATION),
    ],
)
def test_get_items_limit_answers_the_newest_oldest_first(
    make: Opener, limit: int | None, expected: list[Any]
) -> None:
    session = make()

    async def main() -> None:
        await session.add_items(CONVERSATION)
        assert await session.get_items(limit=limit) == expected
        assert await session.get_items(limit=limit) == expected  # reading changes nothing

    run(main())


def test_limit_of_an_empty_or_unknown_session_answers_nothing(make: Opener) -> None:
    session = make("never-written")

    async def main() -> None:
        for limit in (None, 0, 3, -1):
            assert await session.get_items(limit=limit) == []

    run(main())


def test_the_settings_limit_applies_unless_a_limit_is_given(make: Opener) -> None:
    session = make(settings=SessionSettings(limit=2))

    async def main() -> None:
        await session.add_items(CONVERSATION)
        assert await session.get_items() == CONVERSATION[-2:]
        assert await session.get_items(limit=3) == CONVERSATION[-3:]
        assert await session.get_items(limit=0) == []

    run(main())


# -- pop_item and clear_session ---------------------------------------------------------


def test_pop_item_on_an_empty_session_answers_none_and_keeps_answering_none(
    make: Opener,
) -> None:
    session = make()

    async def main() -> None:
        assert await session.pop_item() is None
        assert await session.pop_item() is None
        assert await session.get_items() == []

    run(main())


def test_repeated_pop_item_removes_newest_first_down_to_empty(make: Opener) -> None:
    session = make()

    async def main() -> None:
        await session.add_items(CONVERSATION)
        for n in range(len(CONVERSATION), 0, -1):
            assert await session.pop_item() == CONVERSATION[n - 1]
            assert await session.get_items() == CONVERSATION[: n - 1]
        assert await session.pop_item() is None
        await session.add_items([msg("user", "again")])  # usable after emptied by pops
        assert await session.get_items() == [msg("user", "again")]

    run(main())


def test_concurrent_pops_each_take_a_different_item(make: Opener) -> None:
    session = make()

    async def main() -> None:
        await session.add_items(CONVERSATION[:4])
        popped = await asyncio.gather(*(session.pop_item() for _ in range(6)))
        taken = [item for item in popped if item is not None]
        assert popped.count(None) == 2
        assert sorted(map(repr, taken)) == sorted(map(repr, CONVERSATION[:4]))
        assert await session.get_items() == []

    run(main())


def test_clear_session_empties_it_and_it_can_be_written_again(make: Opener) -> None:
    session = make()

    async def main() -> None:
        await session.clear_session()  # clearing what was never written is fine
        await session.add_items(CONVERSATION)
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.get_items(limit=2) == []
        assert await session.pop_item() is None
        await session.clear_session()  # twice too
        await session.add_items([msg("user", "after")])
        assert await session.get_items() == [msg("user", "after")]

    run(main())


# -- several sessions in one database -------------------------------------------------


def test_sessions_of_one_database_are_isolated(make: Opener) -> None:
    one, two, three = make("one"), make("two"), make("three")

    async def main() -> None:
        await one.add_items([msg("user", "one-1")])
        await two.add_items([msg("user", "two-1")])
        await one.add_items([msg("assistant", "one-2")])
        await two.add_items([msg("assistant", "two-2")])
        await three.add_items([msg("user", "three-1")])
        assert texts(await one.get_items()) == ["one-1", "one-2"]
        assert texts(await two.get_items()) == ["two-1", "two-2"]
        assert texts(await two.get_items(limit=1)) == ["two-2"]
        assert await one.pop_item() == msg("assistant", "one-2")
        assert texts(await two.get_items()) == ["two-1", "two-2"]
        await two.clear_session()
        assert texts(await one.get_items()) == ["one-1"]
        assert await two.get_items() == []
        assert texts(await three.get_items()) == ["three-1"]

    run(main())


def test_a_second_instance_of_a_session_id_sees_the_same_items(make: Opener) -> None:
    first, second = make("shared"), make("shared")

    async def main() -> None:
        await first.add_items(CONVERSATION[:2])
        assert await second.get_items() == CONVERSATION[:2]
        await second.add_items(CONVERSATION[2:3])
        assert await first.get_items() == CONVERSATION[:3]
        assert await first.pop_item() == CONVERSATION[2]
        assert await second.get_items() == CONVERSATION[:2]

    run(main())


def test_items_outlive_the_instance_that_wrote_them(make: Opener) -> None:
    writer = make("durable")
    run(writer.add_items(CONVERSATION))
    close(writer)
    assert run(make("durable").get_items()) == CONVERSATION


# -- concurrent writers ---------------------------------------------------------------


def assert_batches_whole(got: list[Any], batches: list[list[dict[str, Any]]]) -> None:
    contents = texts(got)
    assert sorted(contents) == sorted(item["content"] for batch in batches for item in batch)
    for batch in batches:
        start = contents.index(batch[0]["content"])
        assert contents[start : start + len(batch)] == texts(batch)


def test_concurrent_add_items_from_tasks_keep_every_call_whole(make: Opener) -> None:
    session = make()
    batches = [[msg("user", f"{b}-{i}") for i in range(3)] for b in range(8)]

    async def main() -> None:
        await asyncio.gather(*(session.add_items(batch) for batch in batches))
        assert_batches_whole(await session.get_items(), batches)

    run(main())


def test_concurrent_add_items_from_tasks_on_two_sessions(make: Opener) -> None:
    one, two = make("one"), make("two")

    async def main() -> None:
        await asyncio.gather(
            *(one.add_items([msg("user", f"one-{i}")]) for i in range(5)),
            *(two.add_items([msg("user", f"two-{i}")]) for i in range(5)),
        )
        assert sorted(texts(await one.get_items())) == [f"one-{i}" for i in range(5)]
        assert sorted(texts(await two.get_items())) == [f"two-{i}" for i in range(5)]

    run(main())


def test_concurrent_add_items_from_threads_each_with_its_own_loop(make: Opener) -> None:
    session = make()
    items = [msg("user", f"Message {i}") for i in range(10)]

    def add(item: Any) -> None:
        asyncio.run(session.add_items([item]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, items))
    assert sorted(texts(run(session.get_items()))) == sorted(texts(items))


def test_unicode_and_sql_looking_text_round_trip(make: Opener) -> None:
    items = [
        msg("user", "こんにちは"),
        msg("assistant", "😊👍 Привет"),
        msg("user", "O'Reilly"),
        msg("assistant", "Robert'); DROP TABLE students;--"),
        msg("user", '"SELECT * FROM users WHERE name = "admin";"'),
    ]
    session = make()

    async def main() -> None:
        await session.add_items(items)
        assert await session.get_items() == items

    run(main())


# -- use after close --------------------------------------------------------------------


def test_every_call_on_a_closed_session_raises_runtime_error(make: Opener) -> None:
    session = make("closing")
    run(session.add_items([msg("user", "kept")]))
    close(session)
    calls: list[Callable[[], Coroutine[Any, Any, Any]]] = [
        session.get_items,
        lambda: session.get_items(limit=1),
        session.pop_item,
        session.clear_session,
        lambda: session.add_items([msg("user", "late")]),
        lambda: session.add_items([]),  # no shortcut before the check
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="is closed"):
            run(call())
    close(session)  # closing again is fine
    assert run(make("closing").get_items()) == [msg("user", "kept")]  # nothing was lost


# -- refused items ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"role": "user", "content": object()}, r"\$\[1\]\.content\)"),
        ({"role": "user", "content": "x", "extra": {"b": b"raw"}}, r"\$\[1\]\.extra\.b\)"),
        ({"role": "user", "content": [{1, 2}]}, r"\$\[1\]\.content\[0\]\)"),
        ({"role": "user", "content": "x", "k": {(1, 2): "tuple key"}}, r"\$\[1\]\.k\)"),
    ],
    ids=["object", "bytes", "set", "tuple-key"],
)
def test_a_value_json_cannot_carry_raises_type_error_and_writes_nothing(
    make: Opener, kind: Kind, bad: Any, where: str
) -> None:
    session = make()

    async def main() -> None:
        await session.add_items([msg("user", "before")])
        with pytest.raises(TypeError) as raised:
            await session.add_items([msg("user", "ok"), bad])
        if kind == "zidane":  # also the library's located error
            assert isinstance(raised.value, WireTypeError)  # a WireFormatError too
            assert raised.match(where)
        assert await session.get_items() == [msg("user", "before")]
        await session.add_items([msg("user", "after")])
        assert texts(await session.get_items()) == ["before", "after"]

    run(main())


def test_a_value_json_cannot_carry_wins_over_other_faults_as_json_dumps_finds_it(
    make: Opener,
) -> None:
    session = make()
    # The first item alone is refused by ZidaneSession (not an object); the second holds
    # a value json.dumps refuses: a TypeError from both, as SQLiteSession raises it.
    items: list[Any] = ["not an object", {"role": "user", "content": object()}]
    with pytest.raises(TypeError):
        run(session.add_items(items))
    assert run(session.get_items()) == []


def test_a_circular_item_raises_value_error_and_writes_nothing(make: Opener) -> None:
    item: Any = {"role": "user", "content": "x"}
    item["self"] = item
    session = make()
    with pytest.raises(ValueError):
        run(session.add_items([item]))
    assert run(session.get_items()) == []


# -- what differs, on purpose (docs/integrations.md) -------------------------------------


def both(tmp_path: Path, session_id: str = "conv") -> tuple[SQLiteSession, ZidaneSession]:
    sqlite = open_session("sqlite", tmp_path, session_id, None)
    zidane = open_session("zidane", tmp_path, session_id, None)
    assert isinstance(sqlite, SQLiteSession) and isinstance(zidane, ZidaneSession)
    return sqlite, zidane


@pytest.mark.parametrize(
    ("bad", "error", "where"),
    [
        ("not an item", WireFormatError, r"\$\[1\]\)"),
        (None, WireFormatError, r"\$\[1\]\)"),
        ({"role": "user", "content": 5}, WireFormatError, r"\$\[1\]\.content\)"),
        (
            {"type": "function_call", "name": "f", "arguments": "{}"},
            WireFormatError,
            r"\$\[1\]\.call_id\)",
        ),
        ({"role": "user", "content": "x", "n": math.nan}, WireFormatError, r"\$\[1\]\.n\)"),
        ({"role": "user", "content": "x", 1: "int key"}, WireTypeError, r"\$\[1\]\)"),
    ],
    ids=["string", "null", "content-number", "no-call-id", "nan", "int-key"],
)
def test_items_sqlite_stores_as_json_are_refused_by_zidane(
    tmp_path: Path, bad: Any, error: type[WireFormatError], where: str
) -> None:
    sqlite, zidane = both(tmp_path)

    async def main() -> None:
        await sqlite.add_items([msg("user", "ok"), bad])
        assert len(await sqlite.get_items()) == 2
        with pytest.raises(error, match=where):
            await zidane.add_items([msg("user", "ok"), bad])
        assert await zidane.get_items() == []

    try:
        run(main())
    finally:
        sqlite.close()
        zidane.close()


def test_the_closed_error_names_the_session_and_is_an_actor_closed(tmp_path: Path) -> None:
    from zidane_actors.errors import ActorClosed

    sqlite, zidane = both(tmp_path, "named")
    sqlite.close()
    zidane.close()
    with pytest.raises(RuntimeError, match=r"^SQLiteSession is closed$"):
        run(sqlite.get_items())
    with pytest.raises(
        ActorClosed, match=r"^ZidaneSession\('named', store='sqlite:.*'\) is closed$"
    ):
        run(zidane.get_items())


def test_unsafe_session_ids_are_refused_by_zidane_only(tmp_path: Path) -> None:
    sqlite = SQLiteSession("../escape", tmp_path / "agents.db")
    sqlite.close()
    with pytest.raises(InvalidNameError):
        ZidaneSession("../escape", store=f"sqlite:{tmp_path / 'zidane.db'}")


def test_memory_is_one_store_per_process_not_one_per_instance() -> None:
    async def main() -> None:
        a, b = SQLiteSession("same"), SQLiteSession("same")  # ":memory:": a database each
        await a.add_items([msg("user", "hi")])
        assert await b.get_items() == []
        a.close()
        b.close()
        async with (
            ZidaneSession("peer-memory", store="memory:") as x,
            ZidaneSession("peer-memory", store="memory:") as y,
        ):
            await x.add_items([msg("user", "hi")])
            assert await y.get_items() == [msg("user", "hi")]
        async with ZidaneSession("peer-memory", store="memory:") as z:
            assert await z.get_items() == []  # the last close dropped the store

    run(main())
