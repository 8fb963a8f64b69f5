"""Lossless compaction: ``Session.compact``, ``to_messages`` and the ``model_view`` rule.

The rule is checked on hand-made histories; the session on every store
(memory, SQLite, file map, PostgreSQL, remote) against a reference model of its own
(random programs of appends and compactions: every turn ever appended is
still read in order, the model's view is the reference's, a reload shows the
same), and two hosts compacting one session at once: one wins, the other is
refused as stale with nothing lost.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from test_postgres_store import DSN, fresh_schema
from test_server_e2e import ServerProcess

from zidane_actors.actors import Session, create_session, open_session_host
from zidane_actors.errors import ConflictError, StaleSessionError, ValidationError
from zidane_actors.model import (
    COMPACTION_KEY,
    SessionHistory,
    SessionMessage,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    compaction_marker,
    compaction_of,
    model_view,
    with_compaction,
)
from zidane_actors.portal import open_host_async, start_host
from zidane_actors.stores import (
    SessionStore,
    create_file_map_store,
    create_memory_store,
    create_remote_store,
    open_directory_adapter,
    open_memory_store,
    open_postgres_store,
    open_sqlite_store,
)
from zidane_actors.wire import PairingRepair, orphaned_tool_result_marker, to_wire_messages

BACKENDS = ("memory", "sqlite", "file-map", "postgres", "remote")
"""Every store; "postgres" is skipped where none answers, "remote" is a memory-backed server."""


def t(turn_id: str, role: str = "user", text: str | None = None) -> SessionTurn:
    return SessionTurn(
        id=turn_id,
        role=role,  # type: ignore[arg-type]
        content=(TextBlock(text or f"text of {turn_id}"),),
        created_at=1_000,
    )


def ids(turns: Sequence[SessionTurn]) -> list[str]:
    return [turn.id for turn in turns]


def marker(through: str, summary: Sequence[SessionTurn], id: str) -> SessionTurn:
    return compaction_marker(summary, through=through, id=id, created_at=2_000)


# -- the rule ---------------------------------------------------------------------------------


def test_without_a_marker_the_view_is_the_history_itself() -> None:
    turns = (t("a"), t("b", "assistant"))
    assert model_view(turns) is turns


def test_the_view_is_the_summary_then_the_turns_after_through() -> None:
    turns = (t("a"), t("b", "assistant"), t("c"), marker("b", [t("s")], "m"), t("d", "assistant"))
    assert ids(model_view(turns)) == ["s", "c", "d"]
    assert compaction_of(turns[3]) is not None
    assert turns[3].role == "command" and COMPACTION_KEY in (turns[3].metadata or {})


def test_the_latest_compaction_wins_wherever_its_through_lies() -> None:
    base = (t("a"), t("b"), t("c"), marker("b", [t("s1")], "m1"), t("d"))
    later = (*base, marker("d", [t("s2")], "m2"), t("e"))
    assert ids(model_view(later)) == ["s2", "e"]
    # Through before the earlier one's: the turns that one summarized show again.
    earlier = (*base, marker("a", [t("s2")], "m2"), t("e"))
    assert ids(model_view(earlier)) == ["s2", "b", "c", "d", "e"]
    # Through the earlier marker itself: the turns after it.
    at_marker = (*base, marker("m1", [], "m2"))
    assert ids(model_view(at_marker)) == ["d"]


def test_a_marker_whose_through_is_gone_is_ignored() -> None:
    turns = (t("a"), t("b"), marker("b", [t("s1")], "m1"), t("c"), marker("x", [t("s2")], "m2"))
    assert ids(model_view(turns)) == ["s1", "c"]
    assert ids(model_view((t("a"), marker("x", [t("s")], "m")))) == ["a"]
    # A marker naming a later turn is no compaction of what came before it.
    assert ids(model_view((marker("a", [t("s")], "m"), t("a")))) == ["a"]


def test_only_a_command_turn_of_the_documented_shape_is_a_marker() -> None:
    made = marker("a", [t("s")], "m")
    as_user = msgspec.structs.replace(made, role="user")
    odd = msgspec.structs.replace(made, metadata={COMPACTION_KEY: {"through": 3}})
    assert compaction_of(as_user) is None and compaction_of(odd) is None
    assert ids(model_view((t("a"), as_user, odd))) == ["a", "m", "m"]


def test_a_marker_is_refused_located() -> None:
    with pytest.raises(ValidationError) as bad_id:
        marker("a", [t("bad/id")], "m")
    assert bad_id.value.path == "$.summary[0].id"
    with pytest.raises(ValidationError) as twice:
        marker("a", [t("s"), t("s")], "m")
    assert twice.value.path == "$.summary[1].id"
    with pytest.raises(ValidationError) as not_a_turn:
        compaction_marker([{"id": "s"}], through="a", id="m", created_at=1)  # type: ignore[list-item]
    assert not_a_turn.value.path == "$.summary[0]"
    with pytest.raises(ValidationError) as through:
        marker("../x", [], "m")
    assert through.value.path == "$.through"
    with pytest.raises(ValidationError) as missing:
        with_compaction(SessionHistory((t("a"),), ()), marker("b", [], "m"))
    assert missing.value.path == "$.through"


# -- the session ------------------------------------------------------------------------------


async def test_compact_keeps_every_turn_and_the_model_sees_the_summary() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        s = await host.create_session(id="s")
        await s.append_turns([t("a"), t("b", "assistant"), t("c"), t("d", "assistant")])
        made = await s.compact([t("s1", text="a summary")], through="b")
        await s.append_turns([t("e")])
        assert ids(s.turns) == ["a", "b", "c", "d", made.id, "e"]
        stored = await store.load("s")
        assert stored is not None and list(stored.turns) == list(s.turns)
        messages = await s.to_messages()
        assert [m.content[0] for m in messages] == [
            TextBlock("a summary"),
            TextBlock("text of c"),
            TextBlock("text of d"),
            TextBlock("text of e"),
        ]
        assert messages == await to_wire_messages(model_view(stored.turns))
    async with open_session_host(store) as other:
        again = await other.load_session("s")
        assert again is not None and await again.to_messages() == messages


async def test_a_compaction_through_no_turn_writes_nothing() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        s = await host.create_session(id="s")
        await s.append_turns([t("a")])
        rev = s.rev
        with pytest.raises(ValidationError) as missing:
            await s.compact([t("s1")], through="nope")
        assert missing.value.path == "$.through"
        with pytest.raises(ValidationError) as bad:
            await s.compact([t("s1"), t("s1")], through="a")
        assert bad.value.path == "$.summary[1].id"
        assert ids(s.turns) == ["a"] and s.rev == rev
        await s.set_turns([t("a"), t("b")])
        with pytest.raises(ConflictError):  # an unsaved replacement would drop the marker
            await s.compact([], through="a")
        stored = await store.load("s")
        assert stored is not None and ids(stored.turns) == ["a"]


async def test_a_session_without_a_store_compacts_in_memory() -> None:
    s = await create_session(id="s")
    await s.append_turns([t("a"), t("b")])
    await s.compact([t("s1")], through="a")
    assert ids(model_view(s.turns)) == ["s1", "b"] and len(s.turns) == 3


def test_the_blocking_and_asyncio_doors_compact() -> None:
    with start_host("memory:") as host:
        s = host.create_session(id="s")
        s.append_turns([t("a"), t("b")])
        made = s.compact([t("s1", text="sum")], through="a")
        assert ids(s.turns) == ["a", "b", made.id]
        assert [m.content[0] for m in s.to_messages()] == [TextBlock("sum"), TextBlock("text of b")]

    async def main() -> None:
        async with open_host_async("memory:") as host:
            s = await host.create_session(id="s")
            await s.append_turns([t("a"), t("b")])
            await s.compact([], through="b")
            assert await s.to_messages() == []

    asyncio.run(main())


def _call(call_id: str) -> SessionTurn:
    block = ToolCallBlock(id=call_id, name="look", input={"q": 1})
    return SessionTurn(id=f"call-{call_id}", role="assistant", content=(block,), created_at=1)


def _result(call_id: str) -> SessionTurn:
    block = ToolResultBlock(call_id=call_id, output="found")
    return SessionTurn(id=f"result-{call_id}", role="user", content=(block,), created_at=1)


async def test_a_tool_pair_across_the_boundary_is_repaired_as_any_broken_pair() -> None:
    async with open_session_host(create_memory_store()) as host:
        s = await host.create_session(id="s")
        await s.append_turns([t("a"), _call("k1"), _result("k1"), t("b", "assistant")])
        # The call is summarized, its result is not: the result is an orphan on the wire.
        await s.compact([t("s1")], through="call-k1")
        repairs: list[PairingRepair] = []
        messages = await s.to_messages(on_repair=repairs.append)
        assert [r.kind for r in repairs] == ["orphan-tool-result"]
        assert messages[1] == SessionMessage(
            role="user", content=(TextBlock(orphaned_tool_result_marker("k1")),)
        )
        # A summary that keeps the call pairs with the result after ``through``.
        await s.compact([t("s2"), _call("k1")], through="call-k1")
        repairs.clear()
        messages = await s.to_messages(on_repair=repairs.append)
        assert repairs == [] and messages[2].content == _result("k1").content
        # A summarized call whose result never came is closed as an interrupted one.
        await s.append_turns([_call("k2")])
        await s.compact([t("s3")], through="b")
        messages = await s.to_messages()
        assert isinstance(messages[-1].content[0], ToolResultBlock)
        assert messages[-1].content[0].is_error
        assert len(s.turns) == 8  # every turn, three markers


# -- every store: random programs against a reference -----------------------------------------


_PG_SCHEMA = f"test_compaction_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def pg_schema() -> Iterator[str]:
    with fresh_schema(_PG_SCHEMA) as schema:
        yield schema


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One memory-backed server process for the remote store (started on first use)."""
    with ServerProcess("memory") as process:
        yield process


def place(backend: str, request: pytest.FixtureRequest) -> str | None:
    """The PostgreSQL schema or the server URL ``backend`` is opened on."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_schema"))
    if backend == "remote":
        return str(request.getfixturevalue("server").url)
    return None


@asynccontextmanager
async def opened(backend: str, where: Path, schema: str | None) -> AsyncIterator[SessionStore]:
    """The store ``backend`` names, on ``where`` (a file or a directory) or ``schema``
    (PostgreSQL's schema, the remote store's server URL)."""
    async with AsyncExitStack() as stack:
        store: SessionStore
        if backend == "memory":
            store = await stack.enter_async_context(open_memory_store())
        elif backend == "sqlite":
            store = await stack.enter_async_context(open_sqlite_store(where / "s.db"))
        elif backend == "file-map":
            adapter = await stack.enter_async_context(open_directory_adapter(where / "map"))
            store = create_file_map_store(adapter)
            stack.push_async_callback(store.aclose)
        elif backend == "remote":
            assert schema is not None
            store = await stack.enter_async_context(create_remote_store(schema))
        else:
            assert schema is not None
            store = await stack.enter_async_context(open_postgres_store(DSN, schema=schema))
        yield store


Op = tuple[str, int, int]

ops = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.just(0)),
    st.tuples(st.just("compact"), st.integers(0, 1_000), st.integers(0, 2)),
    st.tuples(st.just("reload"), st.just(0), st.just(0)),
)


class Reference:
    """What the session must show: every turn appended, and the latest compaction's view."""

    def __init__(self) -> None:
        self.appended: list[str] = []  # every turn, markers included, in order
        self.markers: set[str] = set()
        self.view: list[str] = []  # the model's view, by turn id

    def append(self, turn_ids: list[str]) -> None:
        self.appended += turn_ids
        self.view += turn_ids

    def compact(self, through: str, summary: list[str], marker_id: str) -> None:
        after = self.appended[self.appended.index(through) + 1 :]
        self.view = [*summary, *(i for i in after if i not in self.markers)]
        self.appended.append(marker_id)
        self.markers.add(marker_id)


async def check(session: Session, store: SessionStore, ref: Reference, when: str) -> None:
    assert ids(session.turns) == ref.appended, f"{when}: memory lost or reordered a turn"
    stored = await store.get_turns(session.id)
    assert list(stored) == list(session.turns), f"{when}: the store differs from memory"
    assert ids(model_view(stored)) == ref.view, f"{when}: model_view is not the reference"
    messages = await session.to_messages()
    assert messages == await to_wire_messages([_turn_of(i) for i in ref.view]), when


def _turn_of(turn_id: str) -> SessionTurn:
    role = "assistant" if turn_id.endswith(("1", "3", "5", "7", "9")) else "user"
    return t(turn_id, role)


async def run_program(backend: str, program: list[Op], where: Path, schema: str | None) -> None:
    sid = f"s-{uuid.uuid4().hex[:10]}"
    ref = Reference()
    async with opened(backend, where, schema) as store:
        async with open_session_host(store) as host:
            s = await host.create_session(id=sid)
            for step, (kind, a, b) in enumerate(program):
                when = f"step {step} {kind}"
                if kind == "append":
                    made = [f"{sid}.{step}.{k}" for k in range(a)]
                    await s.append_turns([_turn_of(i) for i in made])
                    ref.append(made)
                elif kind == "compact":
                    candidates = ref.appended
                    if not candidates:
                        with pytest.raises(ValidationError):
                            await s.compact([], through="none")
                        continue
                    through = candidates[a % len(candidates)]
                    summary = [f"{sid}.{step}.sum{k}" for k in range(b)]
                    made_marker = await s.compact([_turn_of(i) for i in summary], through=through)
                    ref.compact(through, summary, made_marker.id)
                else:
                    async with open_session_host(store) as other:
                        again = await other.load_session(sid)
                        assert again is not None
                        await check(again, store, ref, f"{when}, by another host")
                await check(s, store, ref, when)
        async with open_session_host(store) as other:
            reloaded = await other.load_session(sid)
            assert reloaded is not None
            await check(reloaded, store, ref, "after a reload by another host")


programs = st.lists(ops, min_size=1, max_size=12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_programs_keep_every_turn_and_show_the_reference_view(
    backend: str, request: pytest.FixtureRequest
) -> None:
    schema = place(backend, request)

    @settings(max_examples=20 if backend == "postgres" else 30)
    @given(program=programs)
    def examples(program: list[Op]) -> None:
        with tempfile.TemporaryDirectory() as where:
            trio.run(run_program, backend, program, Path(where), schema)

    examples()


# -- two writers ------------------------------------------------------------------------------


@asynccontextmanager
async def two_stores(
    backend: str, where: Path, schema: str | None
) -> AsyncIterator[tuple[SessionStore, SessionStore]]:
    """Two stores over one storage (one object where the store must be alone on it)."""
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(opened(backend, where, schema))
        if backend in ("memory", "file-map"):
            yield first, first
        else:
            yield first, await stack.enter_async_context(opened(backend, where, schema))


@attrs.frozen
class Race:
    """Two hosts' sessions on one stored session, after each wrote at once: one won."""

    store_a: SessionStore
    store_b: SessionStore
    sid: str
    won: str
    """"a" or "b": whose write was stored."""
    outcome: object
    """What the winner's write answered."""
    loser: Session


@asynccontextmanager
async def two_hosts_at_once(
    backend: str,
    where: Path,
    schema: str | None,
    write: Callable[[str, Session, str], Awaitable[object]],
    at: dict[str, str],
) -> AsyncIterator[Race]:
    """Two hosts load one session of four turns, then each calls ``write(name, session,
    at[name])`` at once ("a", "b"): exactly one is refused as stale."""
    sid = f"s-{uuid.uuid4().hex[:10]}"
    async with AsyncExitStack() as stack:
        store_a, store_b = await stack.enter_async_context(two_stores(backend, where, schema))
        host_a = await stack.enter_async_context(open_session_host(store_a))
        host_b = await stack.enter_async_context(open_session_host(store_b))
        a = await host_a.create_session(id=sid)
        await a.append_turns([t("u0"), t("a1", "assistant"), t("u2"), t("a3", "assistant")])
        b = await host_b.load_session(sid)
        assert b is not None
        sessions = {"a": a, "b": b}
        outcomes: dict[str, object] = {}

        async def one(name: str) -> None:
            try:
                outcomes[name] = await write(name, sessions[name], at[name])
            except StaleSessionError as exc:
                outcomes[name] = exc

        async with trio.open_nursery() as nursery:
            for name in sessions:
                nursery.start_soon(one, name)
        won = [n for n, o in outcomes.items() if not isinstance(o, StaleSessionError)]
        lost = [n for n, o in outcomes.items() if isinstance(o, StaleSessionError)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        yield Race(store_a, store_b, sid, won[0], outcomes[won[0]], sessions[lost[0]])


@pytest.mark.parametrize("backend", BACKENDS)
async def test_two_hosts_compacting_at_once_one_wins_nothing_lost(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def compact(name: str, s: Session, through: str) -> SessionTurn:
        return await s.compact([t(f"sum-{name}")], through=through)

    at = {"a": "a1", "b": "a3"}
    async with two_hosts_at_once(backend, tmp_path, place(backend, request), compact, at) as race:
        store_a, store_b, sid, loser = race.store_a, race.store_b, race.sid, race.loser
        winner = race.outcome
        assert isinstance(winner, SessionTurn)
        stored = await store_a.get_turns(sid)
        assert ids(stored) == ["u0", "a1", "u2", "a3", winner.id], "nothing lost, one marker"
        assert list(loser.turns) == list(stored), "the refused host's memory is the store's"
        # The loser retries from what it sees now, and its compaction is the latest.
        retry = await loser.compact([t("sum-retry")], through="u2")
        assert ids(await store_a.get_turns(sid)) == [*ids(stored), retry.id]
        assert ids(model_view(await store_b.get_turns(sid))) == ["sum-retry", "a3"]
