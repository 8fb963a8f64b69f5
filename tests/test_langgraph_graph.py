"""A real LangGraph ``StateGraph`` over ``MessagesState`` on ``ZidaneSaver``, side by side
with LangGraph's ``InMemorySaver``: 30 runs on one thread (a fake chat model that calls
a tool, then answers), then the state, the history, time travel and ``update_state``.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("langgraph", reason="extra `langgraph` not installed")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    create_checkpoint,
    empty_checkpoint,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import INTERRUPT
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from odd_values import any_text, any_value

from zidane_actors.actors import Session
from zidane_actors.errors import ValidationError
from zidane_actors.integrations._langgraph_messages import (
    copy_message,
    is_message_turn,
    message_to_turn,
    turn_to_message,
)
from zidane_actors.integrations.langgraph import ZidaneSaver, session_id_of, thread_id_of
from zidane_actors.portal import start_host
from zidane_actors.portal._api import host_opener

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


_ARGS = st.dictionaries(any_text, any_value, max_size=2)


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["human", "ai", "tool", "system"]),
    content=any_text
    | st.lists(
        any_text | st.fixed_dictionaries({"type": st.just("text"), "text": any_text}), max_size=3
    ),
    extra=_ARGS,
    more=st.fixed_dictionaries(
        {},
        optional={
            "name": any_text,
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {"name": any_text, "args": _ARGS, "id": any_text, "type": st.just("tool_call")}
                ),
                max_size=2,
            ),
            "usage_metadata": st.fixed_dictionaries(
                {
                    "input_tokens": st.integers(0, 10**6),
                    "output_tokens": st.integers(0, 10**6),
                    "total_tokens": st.integers(0, 10**6),
                }
            ),
            "status": st.sampled_from(["success", "error"]),
            "artifact": any_value,
        },
    ),
)
def test_a_message_turn_gives_back_the_serializers_bytes(
    kind: str, content: Any, extra: dict[str, Any], more: dict[str, Any]
) -> None:
    """Whatever a message holds, the message its turn gives back is written by LangGraph's
    serializer byte for byte as the original is (or the turn keeps those bytes whole)."""
    serde = JsonPlusSerializer()
    made: dict[str, Any] = {"content": content, "id": "m-1", "additional_kwargs": extra}
    made["name"] = more.get("name")
    try:
        if kind == "tool":
            tool = {k: more[k] for k in ("status", "artifact") if k in more}
            message: BaseMessage = ToolMessage(tool_call_id="c-1", **made, **tool)
        elif kind == "ai":
            ai = {k: more[k] for k in ("tool_calls", "usage_metadata") if k in more}
            message = AIMessage(response_metadata=dict(extra), **made, **ai)
        else:
            message = (HumanMessage if kind == "human" else SystemMessage)(**made)
        written = serde.dumps_typed(message)
    except Exception:  # a message LangChain or the serializer refuses: no saver stores it
        assume(False)
    turn, back = message_to_turn(message, serde, turn_id="t-1", created_at=1)
    given_back = back if back is not None else turn_to_message(turn, serde)
    assert serde.dumps_typed(given_back) == written


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


def test_copies_handed_out_are_deep_and_exact() -> None:
    """A read hands out copies of the index's messages: equal, serialized to the same
    bytes, and changing one (nested values too) leaves the kept message as it was."""
    kept = AIMessage(
        "x",
        id="ai-1",
        tool_calls=[{"name": "f", "args": {"a": [1, {"b": 2}]}, "id": "c1"}],
        additional_kwargs={"raw": b"\x00", "t": (1, 2)},
        usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
    )
    with ZidaneSaver(store="memory:") as saver:
        copied = copy_message(kept)
        assert copied == kept and _same(saver, copied, kept)
        assert copied.model_fields_set == kept.model_fields_set
        copied.tool_calls[0]["args"]["a"][1]["b"] = 3
        copied.additional_kwargs["raw"] = b"\x01"
        assert kept.tool_calls[0]["args"]["a"][1]["b"] == 2
        assert kept.additional_kwargs["raw"] == b"\x00"


def test_messages_changed_in_place_are_stored_as_they_are_now() -> None:
    """A message of the list changed in place after it was stored (a nested value, a
    field, its extras) is stored again as it now is, whether the list repeats the last
    one or not (shorter, in another order); each checkpoint reads back the messages it
    was put with."""
    human = HumanMessage("hi", id="h-1")
    call = AIMessage("", id="ai-1", tool_calls=[{"name": "f", "args": {"a": [1]}, "id": "c1"}])
    config: RunnableConfig = {"configurable": {"thread_id": "t-changed", "checkpoint_ns": ""}}
    changes = [
        lambda: None,
        lambda: call.tool_calls[0]["args"]["a"].append(2),
        lambda: None,
        lambda: setattr(human, "content", "hello"),
        lambda: setattr(call, "extra_field", {"x": 1}),
        lambda: call.tool_calls[0]["args"]["a"].pop(),
    ]
    lists = [[human, call]] * len(changes) + [[call], [call, human], [human, call]]
    changes += [lambda: None, lambda: setattr(human, "name", "ada"), lambda: None]
    with ZidaneSaver(store="memory:") as saver:
        each = (change() or list(listed) for change, listed in zip(changes, lists, strict=True))
        for got, messages in _put_and_read_back(saver, config, each):
            assert _same(saver, got, messages)


def _put_and_read_back(
    saver: ZidaneSaver, config: RunnableConfig, lists: Iterable[list[BaseMessage]]
) -> list[tuple[list[BaseMessage], list[BaseMessage]]]:
    """Put a checkpoint of each list of messages (taken one at a time), then read each
    back: what it reads back with a copy of what it was put with."""
    checkpoint = empty_checkpoint()
    put: list[tuple[RunnableConfig, list[BaseMessage]]] = []
    for step, listed in enumerate(lists):
        checkpoint = create_checkpoint(checkpoint, None, step)
        checkpoint["channel_values"] = {"messages": listed}
        checkpoint["channel_versions"] = {"messages": step + 1}
        config = saver.put(config, checkpoint, {"step": step}, {"messages": step + 1})
        put.append((config, copy.deepcopy(listed)))
    out = []
    for stored, messages in put:
        back = saver.get_tuple(stored)
        assert back is not None
        out.append((back.checkpoint["channel_values"]["messages"], messages))
    return out


def test_messages_equal_by_python_but_not_as_json_are_kept_apart() -> None:
    """A message replaced (same id) by one Python calls equal that is another JSON value
    (``1``, ``1.0`` and ``True``; ``0.0`` and ``-0.0``; the same keys in another order)
    is stored as the new value: each checkpoint reads back exactly what it was put with."""
    values: list[dict[str, Any]] = [
        {"n": 1, "flag": True, "z": 0.0, "a": 1, "b": 2},
        {"n": 1.0, "flag": True, "z": 0.0, "a": 1, "b": 2},
        {"n": 1.0, "flag": 1, "z": 0.0, "a": 1, "b": 2},
        {"n": 1.0, "flag": 1, "z": -0.0, "a": 1, "b": 2},
        {"n": 1.0, "flag": 1, "z": -0.0, "b": 2, "a": 1},
        {"n": True, "flag": 1, "z": -0.0, "b": 2, "a": 1},
    ]
    config: RunnableConfig = {"configurable": {"thread_id": "t-json-equal", "checkpoint_ns": ""}}
    lists: list[list[BaseMessage]] = [
        [HumanMessage("hi", id="h-1"), AIMessage("ok", id="ai-1", additional_kwargs=dict(v))]
        for v in values * 2
    ]
    with ZidaneSaver(store="memory:") as saver:
        for got, messages in _put_and_read_back(saver, config, lists):
            assert _same(saver, got, messages)
            assert repr(got[1].additional_kwargs) == repr(messages[1].additional_kwargs)


def _counted_appends(patch: pytest.MonkeyPatch) -> list[int]:
    """How many turns each ``Session.append_turns`` from now on holds, in order."""
    appends: list[int] = []
    real_append = Session.append_turns

    async def counted(self: Session, turns: Any, options: Any = None) -> None:
        listed = list(turns)
        appends.append(len(listed))
        await real_append(self, listed, options)

    patch.setattr(Session, "append_turns", counted)
    return appends


def test_writes_share_the_next_checkpoint_append(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes for the latest checkpoint and the next checkpoint, handed over together
    (as LangGraph does), are stored by one append; both read back."""
    appends = _counted_appends(monkeypatch)
    config: RunnableConfig = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    first, second, human, answer = _two_checkpoints()

    async def main(saver: ZidaneSaver) -> None:
        ops = saver._ops
        async with host_opener("memory:")() as host:
            put1 = saver._put_args(config, first, {"step": 0, "run_id": "r1"}, {"messages": 1})
            await ops.put(host, *put1)
            stored = saver._put_answer(put1[0], put1[1])
            writes = saver._writes_args(stored, [("messages", answer)], "task-1", "")
            put2 = saver._put_args(stored, second, {"step": 1, "run_id": "r1"}, {"messages": 2})
            appends.clear()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(ops.put_writes, host, *writes))
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(functools.partial(ops.put, host, *put2))
            assert appends == [3]  # the answer's turn, the writes record, the checkpoint
            raw = await ops.get(host, "t1", "", None)
            assert raw is not None
            back = saver._tuple(raw)
            assert back.checkpoint["id"] == second["id"]
            assert back.checkpoint["channel_values"]["messages"] == [human, answer]
            raw = await ops.get(host, "t1", "", first["id"])
            assert raw is not None
            assert saver._tuple(raw).pending_writes == [("task-1", "messages", answer)]

    with ZidaneSaver(store="memory:") as saver:
        trio.run(main, saver, clock=trio.testing.MockClock())


def _two_checkpoints() -> tuple[Checkpoint, Checkpoint, HumanMessage, AIMessage]:
    human = HumanMessage("hi", id="h-1")
    answer = AIMessage("hello", id="ai-1")
    first = empty_checkpoint()
    first["channel_values"] = {"messages": [human]}
    first["channel_versions"] = {"messages": 1}
    second = create_checkpoint(first, None, 1)
    second["channel_values"] = {"messages": [human, answer]}
    second["channel_versions"] = {"messages": 2}
    return first, second, human, answer


def test_async_writes_ride_with_the_next_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """``aput_writes`` for the latest checkpoint waits for the next ``aput`` and is stored
    in its append (one portal call, one append); cancelled while it waits, it is never
    stored; when no checkpoint comes, it is stored alone."""
    from zidane_actors.integrations import _langgraph_pairing

    appends = _counted_appends(monkeypatch)
    first, second, human, answer = _two_checkpoints()
    config: RunnableConfig = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}

    async def main() -> None:
        async with ZidaneSaver(store="memory:") as saver:
            stored = await saver.aput(config, first, {"step": 0, "run_id": "r1"}, {"messages": 1})
            monkeypatch.setattr(_langgraph_pairing, "NEXT_CHECKPOINT_WAIT", 60.0)
            appends.clear()
            cancelled = asyncio.create_task(saver.aput_writes(stored, [("x", 1)], "task-0"))
            writes = asyncio.create_task(saver.aput_writes(stored, [("messages", answer)], "t-1"))
            await asyncio.sleep(0.05)
            assert not writes.done() and not cancelled.done()  # held for the next checkpoint
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            await saver.aput(stored, second, {"step": 1, "run_id": "r1"}, {"messages": 2})
            await writes
            assert appends == [3]  # the answer's turn, the writes record, the checkpoint
            back = await saver.aget_tuple(stored)
            assert back is not None
            assert back.pending_writes == [("t-1", "messages", answer)]
            latest = await saver.aget_tuple(config)
            assert latest is not None
            assert latest.checkpoint["channel_values"]["messages"] == [human, answer]

            # Never held: an interrupt (the run stops there), an older checkpoint's writes.
            appends.clear()
            after = saver._put_answer("t1", {"ns": "", "checkpoint": second})
            await asyncio.wait_for(saver.aput_writes(after, [(INTERRUPT, "why")], "t-2"), 30)
            await asyncio.wait_for(saver.aput_writes(stored, [("z", 3)], "t-3"), 30)
            assert appends == [1, 1]

            # No checkpoint follows: the writes go alone once the wait is over.
            monkeypatch.setattr(_langgraph_pairing, "NEXT_CHECKPOINT_WAIT", 0.01)
            appends.clear()
            await saver.aput_writes(after, [("y", 2)], "task-2")
            assert appends == [1]
            back = await saver.aget_tuple(after)
            assert back is not None
            assert back.pending_writes == [("t-2", INTERRUPT, "why"), ("task-2", "y", 2)]

    asyncio.run(main())
