"""Properties of sessions on a host: reload == memory, isolation, save_meta, crashes, claims."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.actors import RunStats, Session, open_session_host
from zidane_actors.errors import ActorClosed, ActorCrashed
from zidane_actors.model import (
    AppendTurnsOptions,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    demote_stale_running_status,
)
from zidane_actors.stores import (
    WRITE_METHODS,
    MemoryStore,
    SessionStore,
    StoreWrite,
    create_memory_store,
    open_sqlite_store,
)

Op = tuple[Any, ...]

ops = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("tool"), st.booleans()),
    st.tuples(
        st.just("meta"), st.sampled_from(["a", "b", "c"]), st.one_of(st.integers(), st.just(None))
    ),
    st.tuples(st.just("unmeta"), st.sampled_from(["a", "b", "c"])),
    st.tuples(st.just("save")),
    st.tuples(st.just("save_keys"), st.lists(st.sampled_from(["a", "b", "c"]), max_size=2)),
    st.tuples(st.just("run"), st.sampled_from(["complete", "abort", "error", "open"])),
    st.tuples(st.just("status"), st.sampled_from(["idle", "completed", "error"])),
    st.tuples(st.just("agent"), st.sampled_from(["x", "y"])),
    st.tuples(st.just("set_turns"), st.integers(0, 3)),
    st.tuples(st.just("set_runs"), st.integers(0, 2)),
    st.tuples(st.just("heal")),
)
programs = st.lists(ops, min_size=1, max_size=14)


def text_turn(tid: str, role: str = "user") -> SessionTurn:
    return SessionTurn(id=tid, role=role, content=(TextBlock(text=tid),), created_at=1)  # type: ignore[arg-type]


async def run_program(session: Session, program: Sequence[Op]) -> None:
    """Apply ``program`` to ``session``; ids are derived from the session id and step."""
    for step, op in enumerate(program):
        tag = f"{session.id}-{step}"
        kind = op[0]
        if kind == "append":
            turns = [text_turn(f"{tag}-{k}") for k in range(op[1])]
            options = None
            if op[2]:
                run = msgspec.structs.replace(
                    (await session.start_run(f"{tag}-r")), status="completed"
                )
                options = AppendTurnsOptions(run=run)
            await session.append_turns(turns, options)
        elif kind == "tool":
            call = ToolCallBlock(id=f"{tag}-c", name="bash")
            turns = [SessionTurn(id=f"{tag}-a", role="assistant", content=(call,), created_at=2)]
            if op[1]:
                result = ToolResultBlock(call_id=call.id, output="ok")
                turns.append(
                    SessionTurn(id=f"{tag}-u", role="user", content=(result,), created_at=3)
                )
            await session.append_turns(turns)
        elif kind == "meta":
            await session.set_meta(op[1], op[2], touch=step % 2 == 0)
        elif kind == "unmeta":
            await session.set_meta(op[1], msgspec.UNSET)
        elif kind == "save":
            await session.save()
        elif kind == "save_keys":
            await session.save_meta_keys(op[1])
        elif kind == "run":
            await session.start_run(f"{tag}-run", "go")
            if op[1] == "complete":
                await session.complete_run(f"{tag}-run", RunStats(1, 2, 1))
            elif op[1] == "abort":
                await session.abort_run(f"{tag}-run")
            elif op[1] == "error":
                await session.error_run(f"{tag}-run", "bad", RunStats(0, 0, 0))
        elif kind == "status":
            await session.update_status(op[1])
        elif kind == "agent":
            await session.set_agent_id(op[1])
        elif kind == "set_turns":
            await session.set_turns(session.turns[: op[1]])
        elif kind == "set_runs":
            await session.set_runs(session.runs[: op[1]])
        elif kind == "heal":
            await session.heal_interrupted_tool_calls()
        if step % 3 == 0:
            await trio.lowlevel.checkpoint()


def expected_on_reload(session: Session) -> Any:
    return demote_stale_running_status(session.to_json())


class NowOrQueued(MemoryStore):
    """A memory store that makes a write at once (``apply_nowait``) or refuses to
    (``trio.WouldBlock``), as ``draw`` says each time: both ways must agree."""

    def __init__(self, draw: random.Random) -> None:
        super().__init__()
        self._draw = draw
        self.made_at_once = 0

    def apply_nowait(self, call: StoreWrite) -> Any:
        if call.method not in WRITE_METHODS or self._draw.random() < 0.3:
            raise trio.WouldBlock
        self.made_at_once += 1
        return self._apply_write(call)


async def reload_equals_memory(
    store: SessionStore, programs: list[list[Op]], max_live: int
) -> None:
    """Run ``programs`` at once, one session each: each reloads exactly as its memory,
    holding only its own turns, and no more actors were live than the cap."""
    async with open_session_host(store, max_live_sessions=max_live) as host:
        sessions = [await host.create_session(id=f"s{i}") for i in range(len(programs))]
        async with trio.open_nursery() as nursery:
            for session, program in zip(sessions, programs, strict=True):
                nursery.start_soon(run_program, session, program)
        for session in sessions:
            await session.save()
        assert host.statistics().live_actors <= max_live
    async with open_session_host(store) as other:
        for session in sessions:
            reloaded = await other.load_session(session.id)
            assert reloaded is not None
            assert reloaded.to_json() == expected_on_reload(session)
            own = {t.id.split("-")[0] for t in reloaded.turns}
            assert own <= {session.id}


@settings(max_examples=30)
@given(
    program_list=st.lists(programs, min_size=1, max_size=4),
    max_live=st.integers(1, 3),
    _random=st.random_module(),
)
async def test_reload_equals_memory_and_sessions_do_not_interfere(
    program_list: list[list[Op]], max_live: int, _random: object
) -> None:
    await reload_equals_memory(create_memory_store(), program_list, max_live)


@settings(max_examples=30)
@given(
    program_list=st.lists(programs, min_size=1, max_size=4),
    max_live=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
async def test_calls_made_at_once_or_queued_reload_as_memory(
    program_list: list[list[Op]], max_live: int, seed: int
) -> None:
    """A store call made at once in the caller's task (the store actor idle) or through
    the mailbox, at random: every session's writes keep their order either way."""
    await reload_equals_memory(NowOrQueued(random.Random(seed)), program_list, max_live)


@settings(max_examples=8, deadline=None)
@given(program_list=st.lists(programs, min_size=1, max_size=3), max_live=st.integers(1, 3))
async def test_sqlite_sessions_reload_as_memory(
    program_list: list[list[Op]], max_live: int
) -> None:
    """The same on SQLite, whose lone calls run in the trio thread when all is idle."""
    with tempfile.TemporaryDirectory() as tmp:
        async with open_sqlite_store(Path(tmp) / "s.db") as store:
            await reload_equals_memory(store, program_list, max_live)


@settings(max_examples=30)
@given(
    steps=st.lists(
        st.sampled_from(["mine", "theirs", "meta_save", "keys_save"]), min_size=1, max_size=16
    ),
    _random=st.random_module(),
)
async def test_save_meta_never_deletes_turns(steps: list[str], _random: object) -> None:
    store = create_memory_store()
    appended: list[str] = []
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")

        async def other_writer(ids: list[str]) -> None:
            for tid in ids:
                await trio.lowlevel.checkpoint()
                await store.append_turns("s", [text_turn(tid)])
                appended.append(tid)

        theirs = [f"theirs-{i}" for i, s in enumerate(steps) if s == "theirs"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_writer, theirs)
            for i, step in enumerate(steps):
                if step == "mine":
                    await session.append_turns([text_turn(f"mine-{i}")])
                    appended.append(f"mine-{i}")
                elif step == "meta_save":
                    await session.set_meta("k", i)
                    await session.save()
                elif step == "keys_save":
                    await session.set_meta("j", i)
                    await session.save_meta_keys(["j"])
    stored = await store.load("s")
    assert stored is not None
    assert sorted(t.id for t in stored.turns) == sorted(appended)


class CrashOn(MemoryStore):
    """A memory store (not batching) raising :class:`Fatal` on a turn with id ``crash``."""

    apply_writes = None  # type: ignore[assignment]

    async def append_turns(self, session_id: str, turns: Any, options: Any = None) -> Any:
        if any(t.id == "crash" for t in turns):
            raise Fatal(session_id)
        return await super().append_turns(session_id, turns, options)


class Fatal(BaseException):
    """Not an ``Exception``: it crashes the session actor that meets it."""


@settings(max_examples=25)
@given(
    program_list=st.lists(programs, min_size=2, max_size=4),
    victim_step=st.integers(0, 6),
    _random=st.random_module(),
)
async def test_a_crash_never_affects_other_sessions(
    program_list: list[list[Op]], victim_step: int, _random: object
) -> None:
    store = CrashOn()
    crashed: list[str] = []
    async with open_session_host(store, on_crash=lambda sid, exc: crashed.append(sid)) as host:
        sessions = [await host.create_session(id=f"s{i}") for i in range(len(program_list))]
        victim, others = sessions[0], sessions[1:]
        outcome: dict[str, BaseException] = {}

        async def victim_program() -> None:
            await run_program(victim, program_list[0][:victim_step])
            pending = victim.set_meta_nowait("queued", 1)
            try:
                await victim.append_turns([text_turn("crash")])
            except ActorCrashed as exc:
                outcome["crash"] = exc
            try:
                await pending.wait()
            except ActorCrashed as exc:  # queued behind the crash
                outcome["pending"] = exc
            try:
                await victim.set_meta("later", 1)
            except ActorClosed as exc:
                outcome["later"] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(victim_program)
            for session, program in zip(others, program_list[1:], strict=True):
                nursery.start_soon(run_program, session, program)
        assert isinstance(outcome["crash"].__cause__, Fatal)
        assert "later" in outcome
        assert crashed == ["s0"] and host.statistics().crashes == 1
        for session in others:
            await session.save()
    for session in others:
        stored = await store.load(session.id)
        assert stored is not None
        assert demote_stale_running_status(stored) == expected_on_reload(session)


@settings(max_examples=25)
@given(claimants=st.integers(2, 8), prior=st.sampled_from(["idle", "completed", "error"]))
async def test_at_most_one_live_run_owner_per_session(claimants: int, prior: str) -> None:
    store = create_memory_store()
    async with open_session_host(store) as host:
        session = await host.create_session(id="s")
        await session.update_status(prior)  # type: ignore[arg-type]
        claims: list[bool] = []
        stale_at = session.updated_at - 60_000

        async def claim() -> None:
            claim_run = host.store.claim_run  # forwarded because the store has it
            result = await claim_run("s", stale_at=stale_at)
            claims.append(result.claimed)

        async with trio.open_nursery() as nursery:
            for _ in range(claimants):
                nursery.start_soon(claim)
    assert claims.count(True) == 1
    stored = await store.load("s")
    assert stored is not None and stored.status == "running" and stored.run_owner is not None


async def test_claims_race_across_store_and_store_actor() -> None:
    count = 3
    store = create_memory_store()
    async with open_session_host(store) as host:
        await host.create_session(id="s")
        results: list[bool] = []

        async def direct() -> None:
            results.append((await store.claim_run("s", stale_at=0)).claimed)

        async def through_actor() -> None:
            results.append((await host.store.claim_run("s", stale_at=0)).claimed)

        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(direct)
                nursery.start_soon(through_actor)
    assert results.count(True) == 1
