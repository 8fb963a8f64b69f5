"""ZidaneSession's branches side by side with openai-agents' ``AdvancedSQLiteSession``.

Seeded random programs of item adds, pops, branch creations (from a turn
number, from content, valid or not, named or not, names reused), switches
(to known, empty and unknown branches) and reads run on both sessions; every
answer (``get_items``, ``get_conversation_turns``, ``find_turns_by_content``,
``list_branches``, the ``ValueError`` texts) must be equal. Times are left
out (SQLite's ``CURRENT_TIMESTAMP`` seconds against zidane's turn times),
and an auto-generated branch id's epoch seconds are compared as a
placeholder. The zidane store must also still hold every item ever added.
"""

from __future__ import annotations

import asyncio
import functools
import random
import re
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from _pg import fresh_database
from agents import Agent, Runner, function_tool
from agents.extensions.memory import AdvancedSQLiteSession
from agents.testing import ScriptedModel, assistant_message, function_call
from test_server_e2e import ServerProcess

from zidane_actors.actors import Session
from zidane_actors.integrations._responses import items_of_turn
from zidane_actors.integrations.openai_agents import ZidaneSession
from zidane_actors.model import SessionTurn, TextBlock
from zidane_actors.portal import start_host

Step = tuple[Any, ...]
SEEDS = range(24)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def said(text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{text}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def called(n: int) -> list[dict[str, Any]]:
    call = {
        "type": "function_call",
        "call_id": f"call_{n}",
        "name": "lookup",
        "arguments": f'{{"n": {n}}}',
    }
    return [call, {"type": "function_call_output", "call_id": f"call_{n}", "output": f"r{n}"}]


def program(seed: int) -> list[Step]:
    """A seeded program of steps, written for both sessions alike."""
    rng = random.Random(seed)
    steps: list[Step] = []
    names = ["main"]
    for serial in range(1, rng.randint(16, 28)):
        roll = rng.random() if serial > 3 else 0.0
        if roll < 0.35:
            items: list[dict[str, Any]] = [user(f"Question {serial} about Paris")]
            if rng.random() < 0.4:
                items += called(serial)
            items.append(said(f"answer{serial}"))
            steps.append(("add", items))
        elif roll < 0.4:
            steps.append(("add", [user(f"Lone {serial}")]))
        elif roll < 0.47:
            steps.append(("pop",))
        elif roll < 0.64:
            name = rng.choice([None, f"b{serial}", f"b{serial}", rng.choice(names), " "])
            steps.append(("branch", rng.choice([0, 1, 1, 2, 2, 3, 4, 9]), name))
            if name is not None and name.strip():
                names.append(name)
        elif roll < 0.68:
            steps.append(("branch_content", rng.choice(["paris", "Lone", "nowhere"]), None))
        elif roll < 0.82:
            steps.append(("switch", rng.choice([*names, "unknown"])))
        elif roll < 0.88:
            steps.append(("turns", rng.choice([None, *names])))
        elif roll < 0.92:
            steps.append(("find", rng.choice(["PARIS", "lone 1", "question"]), None))
        else:
            steps.append(("list",))
        steps.append(("items",))
    steps.append(("list",))
    return steps


_STAMP = re.compile(r"(branch_from_turn_\d+)_\d+")


def _stable(value: Any) -> Any:
    """``value`` with an auto-generated branch id's epoch seconds replaced."""
    if isinstance(value, str):
        return _STAMP.sub(r"\1_<t>", value)
    if isinstance(value, list | tuple):
        return type(value)(_stable(v) for v in value)
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items()}
    return value


def _rows(rows: list[dict[str, Any]], drop: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != drop} for row in rows]


async def step(session: Any, what: Step) -> Any:
    """One step's answer: what it returned, or the ``ValueError`` it raised."""
    kind, *args = what
    try:
        if kind == "add":
            await session.add_items(args[0])
            return None
        if kind == "pop":
            return await session.pop_item()
        if kind == "branch":
            return await session.create_branch_from_turn(*args)
        if kind == "branch_content":
            return await session.create_branch_from_content(*args)
        if kind == "switch":
            return await session.switch_to_branch(*args)
        if kind == "turns":
            return _rows(await session.get_conversation_turns(*args), "timestamp")
        if kind == "find":
            return _rows(await session.find_turns_by_content(*args), "timestamp")
        if kind == "list":
            rows = _rows(await session.list_branches(), "created_at")
            return sorted(rows, key=lambda row: row["branch_id"])
        return await session.get_items()
    except ValueError as exc:
        return ("ValueError", str(exc))


async def play(session: Any, steps: list[Step]) -> list[Any]:
    return [_stable(await step(session, s)) for s in steps]


def peer() -> AdvancedSQLiteSession:
    return AdvancedSQLiteSession(session_id="conv", create_tables=True)


Walk = Callable[[Any], Coroutine[Any, Any, Any]]


def both(walk: Walk, store: str = "memory:", session_id: str = "conv") -> tuple[Any, Any]:
    """What ``walk`` answered over ``AdvancedSQLiteSession``, then over ``ZidaneSession``."""
    reference = peer()
    try:
        want = asyncio.run(walk(reference))
    finally:
        reference.close()
    with ZidaneSession(session_id, store=store) as session:
        return want, asyncio.run(walk(session))


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with fresh_database("test_agents_branches") as url:
        yield url


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """A memory-backed server process for the remote store (started on first use)."""
    with ServerProcess("memory") as process:
        yield process


@pytest.fixture(params=["memory", "sqlite", "postgres", "remote"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres")
        return url
    if request.param == "remote":
        return str(request.getfixturevalue("server").url)
    return "memory:" if request.param == "memory" else f"sqlite:{tmp_path / 'zidane.db'}"


def _every_item(store: str, session_id: str) -> list[Any]:
    """Every item the store holds for the session: its own turns' and its archives'."""
    with start_host(store) as host:
        session = host.load_session(session_id)
        assert session is not None
        held = [i for t in session.turns for i in items_of_turn(t)]
        for branch in session.branches:
            archive = host.load_session(branch.session_id)
            assert archive is not None
            held += [i for t in archive.turns for i in items_of_turn(t)]
    return held


@pytest.mark.parametrize("seed", SEEDS)
def test_branch_programs_answer_as_advanced_sqlite_session(seed: int, store: str) -> None:
    steps = program(seed)
    session_id = f"conv-{seed}"  # one database (one server) holds every seed's session
    want, got = both(functools.partial(play, steps=steps), store, session_id)
    for k, (s, a, b) in enumerate(zip(steps, want, got, strict=True)):
        assert a == b, (k, s)
    if store != "memory:":  # the store kept every item added but those popped
        held = _every_item(store, session_id)
        popped = [answer for s, answer in zip(steps, want, strict=True) if s[0] == "pop"]
        for item in (i for s in steps if s[0] == "add" for i in s[1] if i not in popped):
            assert item in held, item


# -- walks through one session, and what the zidane store holds ------------------------------


async def _walk(session: Any) -> list[Any]:
    out: list[Any] = []
    for n in (1, 2, 3):
        await session.add_items([user(f"Question {n}"), *called(n), said(f"answer{n}")])
    out.append(await session.create_branch_from_turn(2, "alt"))
    out.append(await session.get_items())
    await session.add_items([user("Question 2, asked again"), said("answer2b")])
    out.append(_rows(await session.get_conversation_turns(), "timestamp"))
    await session.switch_to_branch("main")
    out.append(await session.get_items())
    out.append(_rows(await session.get_conversation_turns("alt"), "timestamp"))
    out.append(await session.create_branch_from_content("question 3", "third"))
    await session.switch_to_branch("alt")
    out.append(await session.get_items())
    out.append(sorted(_rows(await session.list_branches(), "created_at"), key=str))
    return out


def test_a_walk_through_branches_answers_as_advanced_sqlite_session(tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'zidane.db'}"
    want, got = both(_walk, store)
    assert got == want
    assert [row["branch_id"] for row in want[-1]] == ["alt", "main", "third"]
    # The zidane side: the session holds alt; main and third are archives it lists.
    with start_host(store) as host:
        stored = host.load_session("conv")
        assert stored is not None
        names = stored.metadata["openaiBranches"]
        assert names["current"]["branchId"] == "alt"
        assert names["used"] == ["main", "alt", "third"]
        archives = {b.session_id: host.load_session(b.session_id) for b in stored.branches}
        assert all(a is not None and a.metadata["branchOf"] == "conv" for a in archives.values())
        shown = {sid: n["branchId"] for sid, n in names["archives"].items() if n is not None}
        assert sorted(shown.values()) == ["main", "third"]

    # A new instance (another process alike) reads the names back from the store.
    async def again() -> list[Any]:
        with ZidaneSession("conv", store=store) as session:
            await session.switch_to_branch("third")
            return [await session.get_items(), _rows(await session.list_branches(), "created_at")]

    items, listed = asyncio.run(again())
    assert [i.get("content") for i in items if i.get("role") == "user"] == [
        "Question 1",
        "Question 2",
    ]
    assert [row["branch_id"] for row in listed if row["is_current"]] == ["third"]


def test_a_branch_made_through_the_session_api_is_listed_by_its_archive_id() -> None:
    """An archive the names map does not know (another door's, or a crash before its name
    was written) is listed, read and switched to under its session id."""

    async def main() -> tuple[str, list[Any], list[Any]]:
        with ZidaneSession("other-door", store="memory:") as session:
            await session.add_items([user("one"), said("a1"), user("two"), said("a2")])
            handle = await session._call(session._session, False)

            async def branch(shared: Any) -> str:
                entry = await handle.branch(handle.turns[1].id)
                return str(entry.session_id)

            archive_id = await session._call(branch)
            listed = _rows(await session.list_branches(), "created_at")
            await session.switch_to_branch(archive_id)
            return archive_id, listed, await session.get_items()

    archive_id, listed, items = asyncio.run(main())
    assert {row["branch_id"]: row["message_count"] for row in listed} == {
        "main": 2,
        archive_id: 4,
    }
    assert [i.get("content") for i in items if i.get("role") == "user"] == ["one", "two"]


def test_clear_session_empties_the_current_branch_only() -> None:
    """The one step that differs: ``AdvancedSQLiteSession.clear_session`` deletes every
    branch; here it empties the current one and every other stays listed."""

    async def main(session: Any) -> list[Any]:
        await session.add_items([user("one"), said("a1"), user("two"), said("a2")])
        await session.create_branch_from_turn(2, "alt")
        await session.clear_session()
        return [await session.get_items(), _rows(await session.list_branches(), "created_at")]

    want, got = both(main)
    assert want == [[], []]
    main_row = {"branch_id": "main", "message_count": 4, "user_turns": 2, "is_current": False}
    assert got == [[], [main_row]]


def test_a_turn_inside_a_compaction_summary_cannot_be_branched_from() -> None:
    async def main() -> list[Any]:
        with ZidaneSession("compacted", store="memory:") as session:
            await session.add_items([user("one"), said("a1"), user("two"), said("a2")])
            await session._atomic_replace_items([user("summary of one and two"), said("ok")])
            await session.add_items([user("three"), said("a3")])
            out: list[Any] = [_rows(await session.get_conversation_turns(), "timestamp")]
            try:
                await session.create_branch_from_turn(1)
            except ValueError as exc:
                out.append(str(exc))
            out.append(await session.create_branch_from_turn(2, "after"))
            out.append(await session.get_items())
            return out

    turns, refused, name, items = asyncio.run(main())
    assert [t["content"] for t in turns] == ["summary of one and two", "three"]
    assert refused.startswith("Turn 1 cannot be branched from")
    assert name == "after"
    assert items == [user("summary of one and two"), said("ok")]


def test_switching_back_after_a_pop_into_the_shared_turn_keeps_each_branch_whole() -> None:
    """The branch point's own turn changed since (an item popped from it): the branch
    switched to comes back whole, as it was, not joined to the changed turn."""

    async def main(session: Any) -> list[Any]:
        await session.add_items([user("one"), said("x"), said("y")])
        await session.add_items([user("two"), said("a2")])
        await session.create_branch_from_turn(2, "alt")
        out = [await session.pop_item()]
        await session.add_items([user("two again"), said("a2b")])
        await session.switch_to_branch("main")
        out.append(await session.get_items())
        await session.switch_to_branch("alt")
        out.append(await session.get_items())
        return out

    want, got = both(main)
    assert got == want


def test_a_branch_that_loses_a_race_is_made_again_over_the_winners_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another host appends between the door's read and its branch: the branch, refused
    (nothing written), is made again over what is stored then, the late turn included."""
    url = f"sqlite:{tmp_path / 'zidane.db'}"
    original = Session.branch
    raced: list[str] = []

    with start_host(url) as other, ZidaneSession("conv", store=url) as session:

        async def branch(self: Session, at: str) -> Any:
            if not raced:  # once: the other host's write lands first
                raced.append(at)
                theirs = other.load_session("conv")
                assert theirs is not None
                late = SessionTurn(
                    id="late", role="user", content=(TextBlock("late"),), created_at=1
                )
                theirs.append_turns([late])
            return await original(self, at)

        monkeypatch.setattr(Session, "branch", branch)

        async def main() -> list[Any]:
            await session.add_items([user("one"), said("a1"), user("two"), said("a2")])
            name = await session.create_branch_from_turn(2, "alt")
            items = await session.get_items()
            listed = _rows(await session.list_branches(), "created_at")
            return [name, items, sorted(listed, key=str)]

        name, items, listed = asyncio.run(main())
    assert raced and name == "alt"
    assert items == [user("one"), said("a1")]
    assert {row["branch_id"]: row["message_count"] for row in listed} == {"alt": 2, "main": 5}


def test_runner_calls_over_branches_send_the_model_what_advanced_sqlite_session_sends() -> None:
    """Runner calls with a tool, a branch from turn 2, a switch back: the model is sent
    the same inputs, and the session answers the same items, over both sessions."""

    def weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}."

    async def walk(session: Any) -> list[Any]:
        model = ScriptedModel(
            [
                [function_call("weather", {"city": "Paris"}, call_id="c1")],
                [assistant_message("Sunny in Paris.")],
                [assistant_message("You asked about Paris.")],
                [assistant_message("Oslo, then.")],
                [assistant_message("Back on the main line.")],
            ]
        )
        agent = Agent(name="forecaster", model=model, tools=[function_tool(weather)])
        await Runner.run(agent, "Weather in Paris?", session=session)
        await Runner.run(agent, "What did I ask?", session=session)
        branch = await session.create_branch_from_turn(2, "alt")
        await Runner.run(agent, "And in Oslo?", session=session)
        await session.switch_to_branch("main")
        await Runner.run(agent, "Thanks.", session=session)
        sent = [call.input for call in model.calls]
        return [branch, sent, await session.get_items(), await session.get_items(limit=3)]

    want, got = both(walk)
    assert got == want
    last_sent = [i.get("content") for i in want[1][-1] if i.get("role") == "user"]
    assert last_sent == ["Weather in Paris?", "What did I ask?", "Thanks."]


def test_branch_operations_on_a_session_never_written_make_nothing() -> None:
    async def walk(session: Any) -> list[Any]:
        return [
            await step(session, ("branch", 1, None)),
            await step(session, ("switch", "main")),
            await step(session, ("turns", None)),
            await step(session, ("list",)),
            await session.get_items(),
        ]

    want, got = both(walk)
    assert got == want
    assert want[0] == ("ValueError", "Turn 1 does not contain a user message in branch 'main'")

    async def stored() -> Any:
        with ZidaneSession("conv", store="memory:") as session:
            await walk(session)
            return await session._call(session._session, False)

    assert asyncio.run(stored()) is None


def test_a_listing_counts_an_archive_again_once_another_writer_moved_it(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'zidane.db'}"

    async def listing(session: ZidaneSession) -> dict[str, int]:
        rows = await session.list_branches()
        return {row["branch_id"]: row["message_count"] for row in rows}

    with ZidaneSession("conv", store=url) as session:

        async def made() -> tuple[dict[str, int], dict[str, int], str]:
            await session.add_items([user("one"), said("a1"), user("two"), said("a2")])
            await session.create_branch_from_turn(2, "alt")
            first, again = await listing(session), await listing(session)  # the second counted
            handle = await session._call(session._session, False)
            return first, again, handle.branches[0].session_id

        first, again, archive_id = asyncio.run(made())
        assert first == again == {"main": 4, "alt": 2}
        with start_host(url) as other:
            archive = other.load_session(archive_id)
            assert archive is not None
            late = SessionTurn(id="late", role="user", content=(TextBlock("late"),), created_at=1)
            archive.append_turns([late])
        assert asyncio.run(listing(session)) == {"main": 5, "alt": 2}
