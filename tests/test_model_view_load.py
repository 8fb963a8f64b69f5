"""``load_model_view``: the model's view read from the latest compaction, on every store.

Random histories holding markers of every kind (valid, a ``through`` naming no
turn, naming a later turn, several markers, a ``through`` before an earlier
marker's, marker-shaped turns that are no marker) are stored on each store
(memory, SQLite, file map, PostgreSQL, remote through a real server process);
the store's read, the host's and the doors' answer exactly
``model_view`` of the stored turns.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from test_compaction import BACKENDS, marker, opened, pg_schema, place, server, t
from test_postgres_store import DSN

from zidane_actors.actors import open_session_host
from zidane_actors.errors import ValidationError
from zidane_actors.model import COMPACTION_KEY, SessionData, SessionTurn, model_view
from zidane_actors.portal import open_host_async, start_host
from zidane_actors.stores import (
    SessionStore,
    StoreWrite,
    open_postgres_store,
    store_capabilities,
)
from zidane_actors.stores._model_view import read_model_view

__all__ = ["pg_schema", "server"]  # the fixtures test_compaction defines, used here

NATIVE = ("memory", "sqlite", "postgres", "remote")
"""The stores that read the view themselves (the file map is loaded whole)."""

# One step of a history: a turn of a role, a marker through an earlier turn (or a
# dangling or later id), or a turn shaped like a marker that is none.
Step = tuple[str, int, int]

steps = st.one_of(
    st.tuples(st.sampled_from(["user", "assistant", "command", "system"]), st.just(0), st.just(0)),
    st.tuples(st.just("marker"), st.integers(0, 1_000), st.integers(0, 3)),
    st.tuples(st.just("dangling"), st.just(0), st.integers(0, 2)),
    st.tuples(st.just("later"), st.integers(1, 4), st.integers(0, 2)),
    st.tuples(st.just("odd"), st.integers(0, 2), st.just(0)),
)


def history(sid: str, program: list[Step]) -> tuple[SessionTurn, ...]:
    """The turns ``program`` describes (ids unique within the session)."""
    turns: list[SessionTurn] = []
    for i, (kind, a, b) in enumerate(program):
        tid = f"{sid}.{i}"
        summary = [t(f"{tid}.s{k}", "assistant" if k % 2 else "user") for k in range(b)]
        if kind == "marker":
            through = turns[a % len(turns)].id if turns else f"{sid}.none"
            turns.append(marker(through, summary, tid))
        elif kind == "dangling":
            turns.append(marker(f"{sid}.gone", summary, tid))
        elif kind == "later":  # names a turn this history writes after the marker
            turns.append(marker(f"{sid}.{i + a}", summary, tid))
        elif kind == "odd":  # the key without the documented shape, or on another role
            made = marker(turns[-1].id if turns else tid, summary, tid)
            if a == 0:
                made = msgspec.structs.replace(made, role="user")
            else:
                shape = {"through": 3} if a == 1 else ["not", "a", "mapping"]
                made = msgspec.structs.replace(made, metadata={COMPACTION_KEY: shape})
            turns.append(made)
        else:
            turns.append(t(tid, kind))
    return tuple(turns)


async def check_every_read(store: SessionStore, sid: str) -> None:
    loaded = await store.load(sid)
    assert loaded is not None
    expected = list(model_view(loaded.turns))
    assert await read_model_view(store, sid) == expected, "the store's read"
    async with open_session_host(store) as host:
        assert await host.load_model_view(sid) == expected, "the host's read"
        opened_session = await host.load_session(sid)
        assert opened_session is not None
        assert await host.load_model_view(sid) == expected, "with the session open"


async def store_and_check(
    backend: str, where: Path, schema: str | None, programs: list[list[Step]]
) -> None:
    async with opened(backend, where, schema) as store:
        assert ("load_model_view" in store_capabilities(store)) == (backend in NATIVE)
        for k, program in enumerate(programs):
            sid = f"v-{uuid.uuid4().hex[:8]}-{k}"
            turns = history(sid, program)
            if k % 2:  # written by appends, one turn at a time
                await store.save(SessionData(id=sid, created_at=1, updated_at=1))
                for turn in turns:
                    await store.append_turns(sid, [turn])
            else:
                await store.save(SessionData(id=sid, created_at=1, updated_at=1, turns=turns))
            await check_every_read(store, sid)
            await store.delete(sid)  # the file map holds one session at a time
        assert await read_model_view(store, "absent") is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_store_read_is_model_view_of_the_stored_turns(
    backend: str, request: pytest.FixtureRequest
) -> None:
    schema = place(backend, request)

    @settings(max_examples=15 if backend in ("postgres", "remote") else 30, deadline=None)
    @given(programs=st.lists(st.lists(steps, max_size=14), min_size=1, max_size=3))
    def examples(programs: list[list[Step]]) -> None:
        with tempfile.TemporaryDirectory() as where:
            trio.run(store_and_check, backend, Path(where), schema, programs)

    examples()


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_made_histories(backend: str, request: pytest.FixtureRequest) -> None:
    """The cases by name: each answers ``model_view`` of its turns (checked by hand too)."""
    schema = place(backend, request)
    a, b, c, d, e = (t("a"), t("b", "assistant"), t("c"), t("d", "assistant"), t("e"))
    cases = {
        "empty": ((), []),
        "plain": ((a, b), ["a", "b"]),
        "valid": ((a, b, marker("a", [t("s")], "m"), c), ["s", "b", "c"]),
        "dangling": ((a, b, marker("x", [t("s")], "m"), c), ["a", "b", "c"]),
        "latest wins": (
            (a, b, marker("a", [t("s1")], "m1"), c, marker("c", [t("s2")], "m2"), d),
            ["s2", "d"],
        ),
        "through before an earlier marker's": (
            (a, b, c, marker("c", [t("s1")], "m1"), d, marker("a", [t("s2")], "m2"), e),
            ["s2", "b", "c", "d", "e"],
        ),
        "latest dangling, earlier valid": (
            (a, b, marker("a", [t("s1")], "m1"), c, marker("x", [], "m2"), d),
            ["s1", "b", "c", "d"],
        ),
        "through a later turn": ((a, marker("c", [t("s")], "m"), c), ["a", "c"]),
        "the marker pages of commands back": (
            (
                a,
                b,
                marker("a", [t("s")], "m"),
                *(t(f"k{i}", "command") for i in range(20)),
                *(marker("x", [], f"d{i}") for i in range(20)),
                c,
            ),
            ["s", "b", *(f"k{i}" for i in range(20)), "c"],
        ),
        "through the earlier marker": (
            (a, b, marker("a", [t("s1")], "m1"), c, marker("m1", [], "m2")),
            ["c"],
        ),
    }

    async def main(where: Path) -> None:
        async with opened(backend, where, schema) as store:
            for k, (name, (turns, view)) in enumerate(cases.items()):
                sid = f"h-{uuid.uuid4().hex[:8]}-{k}"
                await store.save(SessionData(id=sid, created_at=1, updated_at=1, turns=turns))
                got = await read_model_view(store, sid)
                assert got is not None and [turn.id for turn in got] == view, name
                await check_every_read(store, sid)
                await store.delete(sid)

    with tempfile.TemporaryDirectory() as where:
        trio.run(main, Path(where))


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_views_read_in_one_wave_answer_each_its_own(backend: str, tmp_path: Path) -> None:
    """Reads queued together go to the store at once (SQLite: ``apply_reads``, one snapshot)."""
    a, b, c = t("a"), t("b", "assistant"), t("c")
    histories = {
        "plain": (a, b),
        "compacted": (a, b, marker("a", [t("s")], "m"), c),
        "dangling": (a, marker("x", [], "m")),
    }
    async with opened(backend, tmp_path, None) as store, open_session_host(store) as host:
        for sid, turns in histories.items():
            await store.save(SessionData(id=sid, created_at=1, updated_at=1, turns=turns))
        calls = [StoreWrite("load_model_view", (sid,)) for sid in [*histories, "absent"]]
        calls.append(StoreWrite("load_model_view", ("bad/id",)))
        answers = await host.store.call_together(calls)
        assert host.statistics().store.read_waves == 1
        views = [answer.unwrap() for answer in answers[:4]]
        assert views == [list(model_view(turns)) for turns in histories.values()] + [None]
        with pytest.raises(ValidationError):
            answers[4].unwrap()


class _WriteAfterFirst:
    """A cursor that has ``write`` run (from the trio loop) after its first statement."""

    def __init__(self, cur: Any, write: Callable[[], Awaitable[object]]) -> None:
        self.cur, self.write, self.statements = cur, write, 0

    def execute(self, *args: Any) -> None:
        self.cur.execute(*args)
        self.statements += 1
        if self.statements == 1:
            trio.from_thread.run(self.write)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cur, name)


async def test_postgres_reads_again_when_a_write_lands_between_its_statements(
    pg_schema: str,
) -> None:
    """Each statement of the PostgreSQL read sees its own snapshot: a write between them
    (which moves the rev) makes that read answer "again", and the store's read the new view."""
    from zidane_actors.stores.postgres import _reads

    a, b, c = t("a"), t("b", "assistant"), t("c")
    sid = f"w-{uuid.uuid4().hex[:8]}"
    async with open_postgres_store(DSN, schema=pg_schema) as store:
        turns = (a, b, marker("a", [t("s")], "m"), c)
        await store.save(SessionData(id=sid, created_at=1, updated_at=1, turns=turns))

        async def write() -> None:
            await store.append_turns(sid, [t("d", "assistant")])

        read = await store._read(lambda cur: _reads._model_view(_WriteAfterFirst(cur, write), sid))
        assert read is False
        view = await store.load_model_view(sid)
        assert view is not None and [turn.id for turn in view] == ["s", "b", "c", "d"]


def test_the_blocking_and_asyncio_doors_load_the_model_view() -> None:
    with start_host("memory:") as host:
        s = host.create_session(id="s")
        s.append_turns([t("a"), t("b")])
        made = s.compact([t("s1")], through="a")
        view = host.load_model_view("s")
        assert view is not None and [turn.id for turn in view] == ["s1", "b"]
        assert host.load_model_view("absent") is None
        assert made.id not in [turn.id for turn in view]

    async def main() -> None:
        async with open_host_async("memory:") as host:
            s = await host.create_session(id="s")
            await s.append_turns([t("a"), t("b")])
            await s.compact([], through="b")
            assert await host.load_model_view("s") == []

    asyncio.run(main())
