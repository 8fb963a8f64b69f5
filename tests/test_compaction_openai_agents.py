"""openai-agents' compaction session over ZidaneSession, side by side with SQLiteSession.

``OpenAIResponsesCompactionSession`` wraps each session with a scripted
``responses.compact`` (no network). After the same steps both answer the same
``get_items()``; ZidaneSession compacts losslessly, so every item the
compaction replaced is still in the zidane session's stored turns.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from agents import SQLiteSession
from agents.memory import OpenAIResponsesCompactionSession
from agents.run_internal.items import digest_input_item

from zidane_actors.integrations._responses import items_of_turn
from zidane_actors.integrations.openai_agents import ZidaneSession
from zidane_actors.model import SessionTurn, compaction_of, model_view
from zidane_actors.stores import open_sqlite_store


class ScriptedCompaction:
    """A stand-in for ``AsyncOpenAI``: ``responses.compact`` answers a summary of its input."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.responses = self

    async def compact(self, **request: Any) -> Any:
        self.requests.append(request)
        given = request.get("input")
        of = f"{len(given)} items" if given is not None else request["previous_response_id"]
        n = len(self.requests)
        output = [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": f"summary {n} of {of}"}
            ]},
            {"type": "compaction", "id": f"cmp_{n}", "encrypted_content": f"opaque-{n}"},
        ]  # fmt: skip
        return SimpleNamespace(output=output, usage=None)


def msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


def call(call_id: str) -> list[dict[str, Any]]:
    return [
        {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": f"found {call_id}"},
    ]


def exchange(k: int) -> list[dict[str, Any]]:
    return [msg("user", f"question {k}"), *call(f"c{k}"), msg("assistant", f"answer {k}")]


def wrapped(kind: str, directory: Path) -> tuple[OpenAIResponsesCompactionSession, Any]:
    if kind == "sqlite":
        inner: Any = SQLiteSession("conv", directory / "agents.db")
    else:
        inner = ZidaneSession("conv", store=f"sqlite:{directory / 'zidane.db'}")
    outer = OpenAIResponsesCompactionSession(
        "conv",
        inner,
        client=ScriptedCompaction(),  # type: ignore[arg-type]
        should_trigger_compaction=lambda _: True,
    )
    return outer, inner


def stored_turns(directory: Path) -> list[SessionTurn]:
    async def read() -> list[SessionTurn]:
        async with open_sqlite_store(directory / "zidane.db") as store:
            return list(await store.get_turns("conv"))

    return trio.run(read)


def every_item(turns: list[SessionTurn]) -> list[dict[str, Any]]:
    """The items of every stored turn (markers aside), in order: what was ever added."""
    return [item for turn in turns if compaction_of(turn) is None for item in items_of_turn(turn)]


def automatic(model_items: list[dict[str, Any]]) -> Any:
    """The run context the Runner passes after a model exchange that sent ``model_items``."""
    digests = tuple(digest_input_item(item) for item in model_items)
    return SimpleNamespace(
        _session_compaction_is_automatic=True, _session_compaction_model_exchange=(digests, None)
    )


async def steps(session: OpenAIResponsesCompactionSession) -> list[Any]:
    """One program of adds, compactions (manual, automatic whole and suffix) and pops.

    Answers every ``get_items`` read along the way.
    """
    seen: list[Any] = []

    async def look() -> None:
        seen.append(await session.get_items())
        seen.append([await session.get_items(limit=n) for n in (1, 2, 5)])

    await session.add_items(exchange(1) + exchange(2))
    await look()
    await session.run_compaction({"force": True})  # manual: the whole history
    await look()
    await session.add_items(exchange(3))
    await look()
    # Automatic, after an exchange that sent the whole stored history: replaced whole.
    await session.run_compaction(wrapper=automatic(await session.get_items()))
    await look()
    await session.add_items(exchange(4) + exchange(5))
    # Automatic, after an exchange that sent only the newest items: the suffix from its
    # first user message is replaced, the older items kept.
    newest = (await session.get_items())[-5:]
    await session.run_compaction(wrapper=automatic(newest))
    await look()
    for _ in range(3):  # pops reach into the summary
        seen.append(await session.pop_item())
        await look()
    await session.add_items([msg("user", "after the pops"), msg("assistant", "ok")])
    seen.append(await session.pop_item())  # an item after the compaction
    await look()
    return seen


def test_the_compaction_session_answers_as_over_sqlite_and_keeps_every_item(
    tmp_path: Path,
) -> None:
    answers = {}
    for kind in ("sqlite", "zidane"):
        (tmp_path / kind).mkdir()
        outer, inner = wrapped(kind, tmp_path / kind)
        try:
            answers[kind] = asyncio.run(steps(outer))
        finally:
            inner.close()
        assert len(outer.client.requests) == 3  # type: ignore[attr-defined]
    assert json.dumps(answers["zidane"]) == json.dumps(answers["sqlite"])
    # The suffix compaction replaced the newest exchange only, the older items kept.
    after_suffix = answers["zidane"][8]
    assert after_suffix[2:6] == exchange(4)
    assert after_suffix[6]["content"][0]["text"] == "summary 3 of 4 items"

    turns = stored_turns(tmp_path / "zidane")
    ever = [*exchange(1), *exchange(2), *exchange(3), *exchange(4), *exchange(5)]
    assert every_item(turns)[: len(ever)] == ever, "every replaced item is still stored"
    assert sum(compaction_of(t) is not None for t in turns) == 3  # a pop edits the summary
    view = [item for turn in model_view(turns) for item in items_of_turn(turn)]
    assert json.dumps(view) == json.dumps(answers["sqlite"][-2])


def test_replacing_an_empty_session_and_refused_items_write_nothing_lost(tmp_path: Path) -> None:
    outer, inner = wrapped("zidane", tmp_path)

    async def main() -> None:
        # Nothing stored yet: the replacement is simply the items.
        assert await inner._atomic_replace_items([msg("user", "hello")])
        assert await outer.get_items() == [msg("user", "hello")]
        with pytest.raises(TypeError):  # WireTypeError, as SQLiteSession's json.dumps
            await inner._atomic_replace_items([{"role": "user", "content": {1, 2}}])
        assert await outer.get_items() == [msg("user", "hello")]
        # A suffix replaced after the history changed is refused (False), as SQLite's.
        snapshot = await inner._get_compaction_snapshot(10)
        await outer.add_items([msg("assistant", "meanwhile")])
        assert not await snapshot.replace_suffix(0, [msg("user", "summary")])
        assert await outer.get_items() == [msg("user", "hello"), msg("assistant", "meanwhile")]

    try:
        asyncio.run(main())
    finally:
        inner.close()
    assert every_item(stored_turns(tmp_path)) == [
        msg("user", "hello"),
        msg("assistant", "meanwhile"),
    ]


def test_a_session_read_before_opening_shows_the_compacted_view(tmp_path: Path) -> None:
    """``get_items(limit)`` of a session this process has not opened reads the newest turns
    only; ``get_items()`` the model's view (``load_model_view``)."""
    outer, inner = wrapped("zidane", tmp_path)
    asyncio.run(outer.add_items(exchange(1) + exchange(2)))
    asyncio.run(outer.run_compaction({"force": True}))
    asyncio.run(outer.add_items(exchange(3)))
    expected = asyncio.run(outer.get_items())
    inner.close()
    for limit in (None, 1, 3, 6, 50):
        fresh = ZidaneSession("conv", store=f"sqlite:{tmp_path / 'zidane.db'}")
        try:
            newest = expected if limit is None else expected[-limit:]
            assert asyncio.run(fresh.get_items(limit=limit)) == newest
        finally:
            fresh.close()


def test_the_runner_compacts_automatically_as_over_sqlite(tmp_path: Path) -> None:
    """Runner calls with compaction after every turn: same items, same model inputs."""
    from agents import Agent, Runner
    from agents.testing import ScriptedModel, assistant_message, function_call
    from agents.tool import function_tool

    @function_tool
    def weather(city: str) -> str:
        """The weather in ``city``."""
        return f"sunny in {city}"

    answers = {}
    for kind in ("sqlite", "zidane"):
        (tmp_path / kind).mkdir()
        outer, inner = wrapped(kind, tmp_path / kind)
        model = ScriptedModel(
            [
                [assistant_message("Noted: green.")],
                [function_call("weather", {"city": "Paris"}, call_id="call_1")],
                [assistant_message("It is sunny in Paris.")],
                [assistant_message("Green, and sunny.")],
            ]
        )
        agent = Agent(name="assistant", model=model, tools=[weather])

        async def main(agent: Agent[Any] = agent, outer: Any = outer) -> list[Any]:
            seen = []
            for prompt in ("My colour is green.", "Weather in Paris?", "Sum it up."):
                await Runner.run(agent, prompt, session=outer)
                seen.append(await outer.get_items())
            return seen

        try:
            answers[kind] = (asyncio.run(main()), [call.input for call in model.calls])
        finally:
            inner.close()
        assert outer.client.requests, "the Runner compacted"  # type: ignore[attr-defined]
    assert json.dumps(answers["zidane"]) == json.dumps(answers["sqlite"])
    turns = stored_turns(tmp_path / "zidane")
    kept = [item.get("content") for item in every_item(turns) if item.get("role") == "user"]
    assert kept[:3] == ["My colour is green.", "Weather in Paris?", "Sum it up."]
