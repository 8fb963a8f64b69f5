"""A real LangGraph ``StateGraph`` over ``MessagesState`` on ``ZidaneSaver``, side by side
with LangGraph's ``InMemorySaver``: 30 runs on one thread (a fake chat model that calls
a tool, then answers), then the state, the history, time travel and ``update_state``.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="extra `langgraph` not installed")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from zidane_actors.errors import ValidationError
from zidane_actors.integrations._langgraph_messages import is_message_turn
from zidane_actors.integrations.langgraph import ZidaneSaver, session_id_of, thread_id_of
from zidane_actors.portal import start_host

RUNS = 30


def _script() -> Iterator[AIMessage]:
    """A tool call (ids repeat every three runs, as a scripted model's do), then an answer."""
    for n in itertools.count():
        yield AIMessage(
            "",
            id=f"ai-{n}-call",
            tool_calls=[{"name": "weather", "args": {"city": f"C{n}"}, "id": f"call_{n % 3}"}],
            usage_metadata={"input_tokens": 10 + n, "output_tokens": 5, "total_tokens": 15 + n},
            response_metadata={"model_name": "fake"},
        )
        yield AIMessage(
            f"It is sunny in C{n}.",
            id=f"ai-{n}-answer",
            usage_metadata={"input_tokens": 20, "output_tokens": 7, "total_tokens": 27},
        )


def _graph(saver: Any) -> CompiledStateGraph[Any, Any, Any, Any]:
    model = GenericFakeChatModel(messages=_script())

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def tools(state: MessagesState) -> dict[str, list[BaseMessage]]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        return {
            "messages": [
                ToolMessage(
                    f"sunny in {call['args']['city']}",
                    tool_call_id=call["id"] or "",
                    name=call["name"],
                    id=f"tool-{last.id}-{i}",
                    artifact={"source": "fake"},
                )
                for i, call in enumerate(last.tool_calls)
            ]
        }

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


class _Recording(ZidaneSaver):
    """Keeps a deep copy of every checkpoint put, to check it reads back exactly."""

    puts: list[tuple[RunnableConfig, Checkpoint, CheckpointMetadata]]

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        stored = super().put(config, checkpoint, metadata, new_versions)
        self.puts.append((stored, copy.deepcopy(checkpoint), copy.deepcopy(metadata)))
        return stored


def _same(saver: ZidaneSaver, a: Any, b: Any) -> bool:
    """Equal as LangGraph's serializer writes them (the bytes, not only ``==``)."""
    return saver.serde.dumps_typed(a) == saver.serde.dumps_typed(b)


def _state_key(snapshot: Any) -> tuple[Any, ...]:
    md = {k: v for k, v in snapshot.metadata.items() if k not in ("parents",)}
    return (snapshot.values, snapshot.next, md, len(snapshot.tasks))


def test_thirty_runs_side_by_side(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'graph.db'}"
    config: RunnableConfig = {"configurable": {"thread_id": "weather-1"}}
    with _Recording(store=url) as saver:
        saver.puts = []
        ours, ref = _graph(saver), _graph(InMemorySaver())
        for i in range(RUNS):
            question = {"messages": [HumanMessage(f"Weather {i}?", id=f"h-{i}")]}
            a = ours.invoke(question, config)
            b = ref.invoke(question, config)
            assert a == b
        assert len(a["messages"]) == 4 * RUNS

        # Every checkpoint reads back exactly as it was put.
        assert len(saver.puts) == 5 * RUNS
        for stored, checkpoint, metadata in saver.puts:
            back = saver.get_tuple(stored)
            assert back is not None
            assert _same(saver, back.checkpoint, checkpoint)
            assert back.metadata == metadata

        # State and the whole history, as the official in-memory saver answers them.
        assert _state_key(ours.get_state(config)) == _state_key(ref.get_state(config))
        ours_history = list(ours.get_state_history(config))
        ref_history = list(ref.get_state_history(config))
        assert len(ours_history) == len(ref_history) == 5 * RUNS
        assert [_state_key(s) for s in ours_history] == [_state_key(s) for s in ref_history]

        # Time travel: replay from the checkpoint before a tool call ran (next: tools).
        at = next(i for i, s in enumerate(ours_history) if s.next == ("tools",) and i > 20)
        assert ref_history[at].next == ("tools",)
        replayed = ours.invoke(None, ours_history[at].config)
        assert replayed == ref.invoke(None, ref_history[at].config)
        # ... and fork it with new input.
        fork = {"messages": [HumanMessage("And tomorrow?", id="h-fork")]}
        assert ours.invoke(fork, ours_history[at + 3].config) == ref.invoke(
            fork, ref_history[at + 3].config
        )

        # update_state, then one more run.
        edit = {"messages": [AIMessage("Edited by hand.", id="ai-edit")]}
        ours.update_state(config, edit)
        ref.update_state(config, edit)
        last = {"messages": [HumanMessage("Thanks!", id="h-last")]}
        assert ours.invoke(last, config) == ref.invoke(last, config)
        assert _state_key(ours.get_state(config)) == _state_key(ref.get_state(config))
        assert [_state_key(s) for s in ours.get_state_history(config)] == [
            _state_key(s) for s in ref.get_state_history(config)
        ]
        produced = {m.id for s in ref.get_state_history(config) for m in s.values["messages"]}

    # Every message is one turn, stored once; each graph run is a run record.
    with start_host(url) as host:
        session = host.load_session("weather-1")
        assert session is not None
        turns = [t for t in session.turns if is_message_turn(t)]
        ids = [t.id for t in turns]
        assert len(ids) == len(set(ids)) == len(produced)
        assert set(ids) == produced
        answers = [t for t in turns if t.id.endswith("-answer")]
        assert answers and all(t.usage is not None and t.usage.output == 7 for t in answers)
        assert [t.role for t in turns[:4]] == ["user", "assistant", "user", "assistant"]
        runs = session.runs
        assert len(runs) >= RUNS
        assert runs[0].prompt == "Weather 0?"
        assert runs[0].tokens_in == 10 + 20 and runs[0].turns == 4
        assert all(t.run_id in {r.id for r in runs} for t in turns)


def test_async_run_and_lossless_messages(tmp_path: Path) -> None:
    """``ainvoke`` on the async methods; odd messages (list content, other classes,
    values JSON cannot hold) read back byte for byte."""
    odd: list[BaseMessage] = [
        HumanMessage(
            [
                "look",
                {"type": "text", "text": "at"},
                {"type": "image_url", "image_url": {"url": "x"}},
            ],
            id="h-odd",
            name="ada",
        ),
        AIMessage("nan", id="ai-nan", additional_kwargs={"x": float("nan"), "b": b"\x00"}),
        ToolMessage("boom", tool_call_id="call_x", status="error", id="t-err"),
    ]

    async def main() -> None:
        async with ZidaneSaver(store=f"sqlite:{tmp_path / 'async.db'}") as saver:
            graph = _graph(saver)
            config: RunnableConfig = {"configurable": {"thread_id": "a/b c"}}
            await graph.aupdate_state(config, {"messages": odd})
            for i in range(3):
                await graph.ainvoke({"messages": [HumanMessage(f"q{i}", id=f"h{i}")]}, config)
            state = await graph.aget_state(config)
            assert _same(saver, state.values["messages"][:3], odd)
            history = [s async for s in graph.aget_state_history(config)]
            assert len(history) == 1 + 3 * 5

    asyncio.run(main())
    sid = session_id_of("a/b c")
    assert sid.startswith("lg=") and thread_id_of(sid, {}) == "a/b c"


def test_bad_input_is_refused_located() -> None:
    with ZidaneSaver(store="memory:") as saver:
        with pytest.raises(ValidationError) as caught:
            saver.get_tuple({"configurable": {}})
        assert caught.value.path == "$.configurable.thread_id"
        with pytest.raises(ValidationError):
            saver.prune(["t"], strategy="everything")
        with pytest.raises(ValidationError):
            saver.put_writes({"configurable": {"thread_id": "t"}}, [("x", 1)], "task")
    with pytest.raises(ValidationError):
        ZidaneSaver(store="file:/tmp/somewhere")


def test_blob_helpers_round_trip() -> None:
    raw = base64.b64encode(b"abc").decode()
    assert base64.b64decode(raw) == b"abc"
