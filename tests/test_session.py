"""The Session handle: reads, mutations, save routing, runs, heals, listeners."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio
from store_contract import dead_pid

from zidane_actors.actors import (
    RunStats,
    create_session,
    load_session,
    open_session_host,
)
from zidane_actors.errors import (
    ConflictError,
    InvalidNameError,
    NoStoreError,
    SessionNotFoundError,
    ValidationError,
)
from zidane_actors.model import (
    AppendTurnsOptions,
    RunOwner,
    SaveMetaOptions,
    SessionArtifactInput,
    SessionData,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    host_id,
)
from zidane_actors.stores import MemoryStore, Revision, create_memory_store
from zidane_actors.wire import PairingDrop, interrupted_tool_result_output


def text_turn(
    tid: str, role: str = "user", text: str = "hi", run_id: str | None = None
) -> SessionTurn:
    return SessionTurn(
        id=tid,
        role=role,
        content=(TextBlock(text=text),),
        created_at=1,
        run_id=run_id,  # type: ignore[arg-type]
    )


class CallLog(MemoryStore):
    """A memory store logging its bulk ``save`` and ``save_meta`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []

    async def save(self, data: SessionData, *, expected_rev: int | None = None) -> Revision:
        self.calls.append(("save", len(data.turns)))
        return await super().save(data, expected_rev=expected_rev)

    async def save_meta(
        self,
        data: SessionData,
        options: SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision:
        self.calls.append(("save_meta", options.meta_keys if options is not None else None))
        return await super().save_meta(data, options, expected_rev=expected_rev)


class NoSaveMeta(CallLog):
    """Without ``save_meta``: every save is a bulk save."""

    save_meta = None  # type: ignore[assignment]


class NoMutateHistory(CallLog):
    """Without ``mutate_history``: the heal falls back to a guarded save."""

    mutate_history = None  # type: ignore[assignment]


async def test_create_append_save_load_roundtrip() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(agent_id="reviewer", metadata={"title": "t"})
        assert session.is_empty and session.agent_id == "reviewer"
        assert (await store.load(session.id)) is not None  # the header is saved at once
        await session.append_turns([text_turn("t1"), text_turn("t2", "assistant")])
        assert [t.id for t in session.turns] == ["t1", "t2"]
        await session.set_meta("color", "green")
        await session.save()
    async with open_session_host(store) as other:
        restored = await other.load_session(session.id)
        assert restored is not None
        assert [t.id for t in restored.turns] == ["t1", "t2"]
        assert restored.metadata == {"title": "t", "color": "green"}
        assert restored.to_json() == session.to_json()


async def test_create_validates_ids_and_refuses_existing_ones() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        with pytest.raises(InvalidNameError):
            await host.create_session(id="../etc")
        await host.create_session(id="s1")
        with pytest.raises(ConflictError):
            await host.create_session(id="s1")
    async with open_session_host(store) as host:
        with pytest.raises(ConflictError):
            await host.create_session(id="s1")  # held by the store


async def test_generate_session_id_is_used_when_the_store_has_it() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session()
        assert await store.load(session.id) is not None
        assert isinstance(await session.generate_turn_id(), str)


async def test_failed_store_write_leaves_memory_unchanged() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(id="gone")
        await session.append_turns([text_turn("a")])
        await store.delete("gone")
        with pytest.raises(SessionNotFoundError):
            await session.append_turns([text_turn("b")])
        assert [t.id for t in session.turns] == ["a"]
        with pytest.raises(ValidationError):
            await session.append_turns(["not a turn"])  # type: ignore[list-item]
        # the actor lives on
        await session.set_meta("k", 1)
        assert session.metadata["k"] == 1


async def test_save_routes_to_save_meta_with_changed_keys_unless_history_was_replaced() -> None:
    store = CallLog()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        store.calls.clear()
        await session.set_meta("a", 1)
        await session.set_meta("b", 2)
        await session.save()
        assert store.calls == [("save_meta", ("a", "b"))]
        await session.save()
        assert store.calls[-1] == ("save_meta", ())
        await session.set_turns([text_turn("x")])
        await session.save()
        assert store.calls[-1] == ("save", 1)
        await session.set_meta("c", 3)
        await session.save()
        assert store.calls[-1] == ("save_meta", ("c",))
        await session.set_runs([])
        await session.save()
        assert store.calls[-1] == ("save", 1)


async def test_save_uses_bulk_save_without_save_meta_and_needs_a_store() -> None:
    store = NoSaveMeta()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        store.calls.clear()
        await session.set_meta("a", 1)
        await session.save()
        await session.save_meta_keys(["a"])
        assert store.calls == [("save", 0), ("save", 0)]
    lonely = await create_session()
    with pytest.raises(NoStoreError):
        await lonely.save()
    with pytest.raises(NoStoreError):
        await lonely.save_meta_keys(["x"])


async def test_save_meta_never_deletes_turns_appended_by_another_writer() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        await session.append_turns([text_turn("mine")])
        await store.append_turns("s", [text_turn("theirs")])
        await session.set_meta("k", "v")
        await session.save()
    stored = await store.load("s")
    assert stored is not None and [t.id for t in stored.turns] == ["mine", "theirs"]
    assert stored.metadata == {"k": "v"}


async def test_save_meta_keys_persists_only_those_keys() -> None:
    store = CallLog()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        await session.set_meta("a", 1)
        await session.set_meta("b", 2)
        store.calls.clear()
        await session.save_meta_keys(["a"])
        assert store.calls == [("save_meta", ("a",))]
        stored = await store.load("s")
        assert stored is not None and stored.metadata == {"a": 1}
        await session.save()
        assert store.calls[-1] == ("save_meta", ("b",))


async def test_meta_listeners_run_in_order_and_unsubscribe() -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        seen: list[tuple[str, str, Any]] = []
        session.on_meta(lambda k, v: seen.append(("first", k, v)))
        stop = session.on_meta(lambda k, v: seen.append(("second", k, v)))
        before = session.updated_at
        await trio.sleep(0.002)
        await session.set_meta("title", "x", touch=False)
        assert session.updated_at == before
        stop()
        await session.set_meta("title", msgspec.UNSET)
        assert "title" not in session.metadata
    assert seen == [
        ("first", "title", "x"),
        ("second", "title", "x"),
        ("first", "title", msgspec.UNSET),
    ]


async def test_saved_listeners_are_awaited_in_order_and_a_failure_fails_save() -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        seen: list[str] = []

        async def slow() -> None:
            await trio.lowlevel.checkpoint()
            seen.append("async")

        session.on_saved(slow)
        session.on_saved(lambda: seen.append("sync"))  # type: ignore[arg-type,func-returns-value]
        await session.save()
        assert seen == ["async", "sync"]

        def fail() -> None:
            raise RuntimeError("listener broke")

        stop = session.on_saved(fail)
        session.on_saved(lambda: seen.append("skipped"))  # type: ignore[arg-type,func-returns-value]
        with pytest.raises(RuntimeError, match="listener broke"):
            await session.save()
        assert "skipped" not in seen
        stop()


async def test_metadata_is_read_only_and_values_are_copied() -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        value = {"nested": [1, 2]}
        await session.set_meta("k", value)
        value["nested"].append(3)
        assert session.metadata["k"] == {"nested": [1, 2]}
        with pytest.raises(TypeError):
            session.metadata["k"] = 1  # type: ignore[index]
        with pytest.raises(ValidationError):
            await session.set_meta("bad", object())


async def test_run_lifecycle_persists_through_update_run() -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        run = await session.start_run("r1", "do it", label="main", depth=0)
        assert run.status == "running" and session.runs[0].label == "main"
        with pytest.raises(ConflictError):
            await session.start_run("r1")
        usage = (TurnUsage(input=3, output=4, cache_read=1), TurnUsage(input=2, output=1))
        done = await session.complete_run("r1", RunStats(5, 5, 2, cost=0.5, turn_usage=usage))
        assert done.status == "completed" and done.tokens_in == 5 and done.cost == 0.5
        assert done.total_usage == TurnUsage(input=5, output=5, cache_read=1, cost=0.5)
        await session.start_run("r2")
        await session.abort_run("r2")
        await session.start_run("r3")
        await session.error_run("r3", "boom", RunStats(1, 0, 1))
        with pytest.raises(ValidationError):
            await session.complete_run("nope", RunStats(0, 0, 0))
        extra = SessionRun(id="r4", prompt="p", started_at=1, status="completed")
        await session.update_run(extra)
        await session.append_turns(
            [text_turn("t", run_id="r5")],
            AppendTurnsOptions(run=SessionRun(id="r5", prompt="", started_at=1, status="running")),
        )
    stored = await store.load("s")
    assert stored is not None
    assert [(r.id, r.status) for r in stored.runs] == [
        ("r1", "completed"),
        ("r2", "aborted"),
        ("r3", "error"),
        ("r4", "completed"),
        ("r5", "running"),
    ]
    assert stored.runs[2].error == "boom"
    assert stored.runs == session.runs


async def test_update_status_is_persisted_and_running_is_demoted_on_load() -> None:
    store = CallLog()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        await session.update_status("running")
        assert session.status == "running" and session.to_json().run_owner is not None
        with pytest.raises(ValidationError):
            await session.update_status("flying")  # type: ignore[arg-type]
    stored = await store.load("s")
    assert stored is not None and stored.status == "running"
    reader = await load_session(store, "s", persist_heal=False)
    assert reader is not None and reader.status == "idle"
    assert (await store.load("s")).status == "running"  # type: ignore[union-attr]
    loaded = await load_session(store, "s")
    assert loaded is not None and loaded.status == "idle"
    # This process still lives: its marker is not stale, so the load writes nothing.
    assert await store.load("s") == stored
    gone = RunOwner(host_id=host_id(), pid=dead_pid(), token="gone")
    await store.update_status("s", "running", owner=gone, preserve_updated_at=True)
    await load_session(store, "s")
    again = await store.load("s")
    assert again is not None and (again.status, again.run_owner) == ("idle", None)
    assert again.updated_at == stored.updated_at  # the demotion keeps updatedAt


async def test_load_missing_is_none_and_bad_ids_raise() -> None:
    store = create_memory_store()
    assert await load_session(store, "nope") is None
    with pytest.raises(InvalidNameError):
        await load_session(store, "a/b")
    async with open_session_host(store) as host:
        assert await host.load_session("nope") is None


def pairing_damaged() -> SessionData:
    call = ToolCallBlock(id="c1", name="grep")
    return SessionData(
        id="s",
        created_at=1,
        updated_at=1,
        turns=(
            text_turn("u1"),
            SessionTurn(id="a1", role="assistant", content=(call,), created_at=2),
            SessionTurn(
                id="u2",
                role="user",
                content=(ToolResultBlock(call_id="c1", output="ok"),),
                created_at=3,
            ),
            SessionTurn(
                id="u3",
                role="user",
                content=(ToolResultBlock(call_id="ghost", output="?"),),
                created_at=4,
            ),
        ),
    )


async def test_load_time_pairing_heal_is_persisted_with_a_bulk_save() -> None:
    store = CallLog()
    await MemoryStore.save(store, pairing_damaged())
    drops: list[PairingDrop] = []
    session = await load_session(store, "s", on_pairing_drop=drops.append)
    assert session is not None
    assert [t.id for t in session.turns] == ["u1", "a1", "u2"]
    assert {d.kind for d in drops} >= {"orphan-tool-result"}
    assert store.calls == [("save", 3)]
    stored = await store.load("s")
    assert stored is not None and [t.id for t in stored.turns] == ["u1", "a1", "u2"]


async def test_create_session_restores_data_with_the_pairing_heal() -> None:
    """The spec's ``CreateSessionOptions``: ``_data`` restores a session from its data (the
    ``id``/``agentId``/``metadata`` options are bypassed), healing its tool pairings in
    memory; ``onPairingDrop`` fires once per deletion, on that path only. Nothing is
    written at creation (``loadSession`` persists its heal; a restore arms the next save)."""
    store = CallLog()
    drops: list[PairingDrop] = []
    session = await create_session(
        store,
        id="other",
        agent_id="ignored",
        _data=pairing_damaged(),
        on_pairing_drop=drops.append,
    )
    assert (session.id, session.agent_id) == ("s", None)
    assert [t.id for t in session.turns] == ["u1", "a1", "u2"]
    assert [(d.kind, d.call_id) for d in drops] == [
        ("orphan-tool-result", "ghost"),
        ("empty-turn", None),
    ]
    assert store.calls == []
    fresh: list[PairingDrop] = []
    await create_session(store, id="new", on_pairing_drop=fresh.append)
    assert fresh == []  # fresh sessions never heal


async def test_host_create_session_restores_data_with_the_pairing_heal() -> None:
    drops: list[PairingDrop] = []
    async with open_session_host(MemoryStore()) as host:
        session = await host.create_session(
            _data=pairing_damaged(),
            on_pairing_drop=drops.append,
        )
        assert session.id == "s" and [t.id for t in session.turns] == ["u1", "a1", "u2"]
    assert {d.kind for d in drops} == {"orphan-tool-result", "empty-turn"}


async def test_unpersisted_load_heal_arms_the_next_save() -> None:
    store = CallLog()
    await MemoryStore.save(store, pairing_damaged())
    session = await load_session(store, "s", persist_heal=False)
    assert session is not None and len(session.turns) == 3
    assert store.calls == []
    assert len((await store.load("s")).turns) == 4  # type: ignore[union-attr]
    await session.save()
    assert store.calls == [("save", 3)]
    await session.save()
    assert store.calls[-1] == ("save_meta", ())


def interrupted() -> SessionData:
    return SessionData(
        id="s",
        created_at=1,
        updated_at=1,
        turns=(
            text_turn("u1", run_id="r"),
            SessionTurn(
                id="a1",
                role="assistant",
                content=(ToolCallBlock(id="c1", name="bash"), ToolCallBlock(id="c2", name="grep")),
                created_at=2,
                run_id="r",
            ),
            SessionTurn(
                id="u2",
                role="user",
                content=(ToolResultBlock(call_id="c1", output="ok"),),
                created_at=3,
                run_id="r",
            ),
            SessionTurn(
                id="a2",
                role="assistant",
                content=(ToolCallBlock(id="c3", name="edit"),),
                created_at=4,
                run_id="r",
            ),
        ),
    )


@pytest.mark.parametrize("with_mutate", [True, False])
async def test_heal_interrupted_tool_calls_closes_open_calls_and_persists(
    with_mutate: bool,
) -> None:
    store = CallLog() if with_mutate else NoMutateHistory()
    await MemoryStore.save(store, interrupted())
    async with open_session_host(store) as host:
        session = await host.load_session("s")
        assert session is not None
        assert await session.heal_interrupted_tool_calls() is True
        ids = [t.id for t in session.turns]
        assert ids == ["u1", "a1", "u2", "a2", "a2.interrupted"]
        u2 = session.turns[2].content
        assert [b.call_id for b in u2 if isinstance(b, ToolResultBlock)] == ["c1", "c2"]
        closing = session.turns[4].content[0]
        assert isinstance(closing, ToolResultBlock) and closing.is_error
        assert closing.output == interrupted_tool_result_output("edit")
        assert await session.heal_interrupted_tool_calls() is False
        stored = await store.load("s")
        assert stored is not None and stored.turns == session.turns
        assert all(name != "save" for name, _ in store.calls[1:]) or not with_mutate


async def test_heal_without_mutate_history_skips_persist_when_turns_moved() -> None:
    store = NoMutateHistory()
    await MemoryStore.save(store, interrupted())
    async with open_session_host(store) as host:
        session = await host.load_session("s")
        assert session is not None
        await store.append_turns("s", [text_turn("elsewhere")])
        assert await session.heal_interrupted_tool_calls() is True
        assert len(session.turns) == 5
        stored = await store.load("s")
        assert stored is not None and len(stored.turns) == 5
        assert stored.turns[-1].id == "elsewhere"  # the other writer's turn survived


async def test_artifacts_roundtrip_and_degrade_without_store_support() -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session(project_root="/repo")
        art = await session.add_artifact(
            SessionArtifactInput(kind="pull_request", uri="https://x/1", label="PR 1"),
            run_id="r1",
        )
        assert art is not None and art.project_root == "/repo" and art.run_id == "r1"
        listed = await session.list_artifacts(kind="pull_request")
        assert [a.uri for a in listed] == ["https://x/1"]
        assert await session.list_artifacts(kind="commit") == ()
    lonely = await create_session()
    assert await lonely.add_artifact(SessionArtifactInput(kind="k", uri="u", label="l")) is None
    assert await lonely.list_artifacts() == ()


async def test_to_messages_repairs_pairing_without_touching_turns() -> None:
    store = create_memory_store()
    await store.save(interrupted())
    session = await load_session(store, "s")
    assert session is not None
    messages = await session.to_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert len(session.turns) == 4


async def test_standalone_session_without_store_works_in_memory() -> None:
    session = await create_session(metadata={"a": 1}, project_root="/p")
    assert session.store is None and session.project_root == "/p"
    await session.append_turns([text_turn("t")])
    await session.start_run("r")
    await session.update_status("running")
    await session.set_agent_id("agent")
    assert session.agent_id == "agent" and session.status == "running"
    assert not session.is_empty and session.runs[0].id == "r"
    assert "Session" in repr(session)


async def test_nowait_forms_enqueue_and_reply_later() -> None:
    async with open_session_host(create_memory_store(), mailbox_size=4) as host:
        session = await host.create_session()
        replies = [session.set_meta_nowait(f"m{i}", i) for i in range(4)]
        with pytest.raises(trio.WouldBlock):  # queued behind the mailbox: no direct path
            session.append_turns_nowait([text_turn("t")])
        for reply in replies:
            await reply.wait()
        replies = [session.append_turns_nowait([text_turn(f"t{i}")]) for i in range(4)]
        for reply in replies:
            await reply.wait()
        await session.set_meta_nowait("k", 1).wait()
        await session.start_run_nowait("r").wait()
        await session.complete_run_nowait("r", RunStats(1, 1, 1)).wait()
        await session.update_status_nowait("completed").wait()
        assert [t.id for t in session.turns] == ["t0", "t1", "t2", "t3"]
        assert session.metadata["k"] == 1 and session.status == "completed"


async def test_standalone_actor_stops_when_idle_and_restarts_in_order() -> None:
    session = await create_session(create_memory_store())
    await session.append_turns([text_turn("a")])
    assert session._actor is None  # stopped and dropped: no task left behind
    replies = [session.append_turns_nowait([text_turn(f"b{i}")]) for i in range(5)]
    for reply in replies:
        await reply.wait()
    assert [t.id for t in session.turns] == ["a", "b0", "b1", "b2", "b3", "b4"]
    stored = await session.store.load(session.id)  # type: ignore[union-attr]
    assert stored is not None and stored.turns == session.turns


def lane_history(second_depth: int) -> SessionData:
    def pair(run_id: str, n: int) -> tuple[SessionTurn, SessionTurn]:
        return (
            SessionTurn(
                id=f"a{n}",
                role="assistant",
                content=(ToolCallBlock(id="call_0", name="ls"),),
                created_at=n,
                run_id=run_id,
            ),
            SessionTurn(
                id=f"t{n}",
                role="user",
                content=(ToolResultBlock(call_id="call_0", output="ok"),),
                created_at=n,
                run_id=run_id,
            ),
        )

    return SessionData(
        id="s",
        created_at=1,
        updated_at=1,
        turns=(*pair("r1", 1), *pair("r2", 2)),
        runs=(
            SessionRun(id="r1", prompt="", started_at=1, status="completed", depth=0),
            SessionRun(id="r2", prompt="", started_at=2, status="completed", depth=second_depth),
        ),
    )


@pytest.mark.parametrize(("depth", "kept"), [(0, ["a1", "t1"]), (1, ["a1", "t1", "a2", "t2"])])
async def test_load_heal_lanes_follow_run_topology(depth: int, kept: list[str]) -> None:
    store = create_memory_store()
    await store.save(lane_history(depth))
    session = await load_session(store, "s", persist_heal=False)
    assert session is not None
    # depth-0 runs share the main view: the reused id is a duplicate there; a
    # sub-agent (depth 1) has its own view, where the same id is legitimate.
    assert [t.id for t in session.turns] == kept


async def test_a_raising_meta_listener_fails_the_call_but_the_write_stands() -> None:
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        seen: list[str] = []

        def broken(key: str, value: Any) -> None:
            raise RuntimeError("listener broke")

        session.on_meta(broken)
        session.on_meta(lambda k, v: seen.append(k))
        with pytest.raises(RuntimeError, match="listener broke"):
            await session.set_meta("k", 1)
        assert session.metadata["k"] == 1 and seen == []
        await session.save()  # the actor lives on, and the key is saved
        stored = await session.store.load(session.id)  # type: ignore[union-attr]
        assert stored is not None and stored.metadata == {"k": 1}


async def test_memory_cannot_be_changed_through_the_callers_values() -> None:
    """What was appended, and what ``turns``/``metadata`` hand out, is the session's own."""
    store = create_memory_store()
    tool_input: dict[str, Any] = {"path": "a.txt", "flags": ["r"]}
    call = SessionTurn(
        id="t1",
        role="assistant",
        content=(ToolCallBlock(id="c1", name="read", input=tool_input),),
        created_at=1,
        metadata={"k": {"n": 1}},
    )
    async with open_session_host(store) as host:
        session = await host.create_session(metadata={"deep": {"x": [1]}})
        await session.append_turns([call])
        tool_input["path"] = "changed"
        tool_input["flags"].append("w")
        (held,) = session.turns
        block = held.content[0]
        assert isinstance(block, ToolCallBlock)
        assert block.input == {"path": "a.txt", "flags": ["r"]}
        with pytest.raises(TypeError):
            block.input["path"] = "x"  # type: ignore[index]
        with pytest.raises(TypeError):
            block.input["flags"].append("x")  # type: ignore[index]
        with pytest.raises(TypeError):
            session.metadata["deep"]["x"].append(2)
        messages = await session.to_messages()
        sent = messages[0].content[0]
        assert isinstance(sent, ToolCallBlock) and sent.input == {"path": "a.txt", "flags": ["r"]}
        await session.save()
    stored = await store.load(session.id)
    assert stored is not None and stored.turns == (call_as_written(),)
    assert stored.metadata == {"deep": {"x": [1]}}


async def test_empty_objects_and_arrays_in_memory_refuse_changes_too() -> None:
    """Empty ones are shared by every session: a change to one would reach them all."""
    turn = SessionTurn(id="t1", role="user", content=(), created_at=1, metadata={"o": {}, "a": []})
    async with open_session_host(create_memory_store()) as host:
        first, second = await host.create_session(), await host.create_session()
        await first.append_turns([turn])
        await second.append_turns([turn])
        for session in (first, second):
            held = session.turns[0].metadata
            assert held == {"o": {}, "a": []}
            with pytest.raises(TypeError):
                held["o"]["x"] = 1
            with pytest.raises(TypeError):
                held["a"].append(1)
            assert dict(held["o"]) == {} and list(held["a"]) == []
        assert second.turns[0].metadata == {"o": {}, "a": []}


def call_as_written() -> SessionTurn:
    return SessionTurn(
        id="t1",
        role="assistant",
        content=(ToolCallBlock(id="c1", name="read", input={"path": "a.txt", "flags": ["r"]}),),
        created_at=1,
        metadata={"k": {"n": 1}},
    )


async def test_dict_content_blocks_are_read_as_blocks_or_refused() -> None:
    """A dict given as a block: memory holds what the store holds (the block), never the dict."""
    async with open_session_host(create_memory_store()) as host:
        session = await host.create_session()
        raw = SessionTurn(
            id="t1",
            role="user",
            content=[{"type": "text", "text": "hi"}],  # type: ignore[arg-type]
            created_at=1,
        )
        await session.append_turns([raw])
        assert session.turns[0].content == (TextBlock("hi"),)
        (message,) = await session.to_messages()
        assert message.content == (TextBlock("hi"),)
        bad = msgspec.structs.replace(raw, id="t2", content=[{"type": "nope"}])
        with pytest.raises(ValidationError, match=r"\$\.turns\[0\]\.content\[0\]"):
            await session.append_turns([bad])
        with pytest.raises(ValidationError):
            await session.set_turns([bad])
        assert [t.id for t in session.turns] == ["t1"]
