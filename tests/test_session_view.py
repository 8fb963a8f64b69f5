"""A session's unsaved changes are intents, applied over the store's current state.

The rule (docs: DESIGN.md, "Many processes and hosts"): header fields set
(the agent id), metadata keys set or removed, and a bulk history replacement
(``set_turns``/``set_runs``) together with the rev of the view it was
computed from. A save applies them over what the store holds now:

* a field a caller set is never dropped by a fold, and needs no rev;
* a history replacement is conditional on the rev of *its* view: a refresh
  landing in between never moves that base (a list built from
  ``session.turns`` is judged against the view its turn objects came from; a
  list built by hand against the rev current when ``set_turns`` was called);
* the session's own acknowledged writes advance the rev it expects;
* a refused write leaves memory equal to the store, and the next save works;
* every path that shows another process's state (a load, the fold after an
  append, a PostgreSQL push) shows a live ``running`` marker demoted, as a
  fresh load does, while the store keeps what the claim rule says.

(And ``RunUserWait`` requires ``ms``: built or decoded without it, it is refused.)

Every test runs on every store it applies to. Two hosts stand for two
processes: each over its own store object where the store allows it (two
SQLite connections on one file, two PostgreSQL stores on one schema, two
remote clients of one real server process); the memory store lives in one
process and the file map has one writer per directory, so there both hosts
share one store object. Clocks are injected; the only waits are bounded polls
for a PostgreSQL notification (and for a refresh to be queued).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import msgspec
import pytest
import trio
import trio.testing
from store_contract import dead_pid
from test_postgres_store import DSN, fresh_schema
from test_server_e2e import ServerProcess

from zidane_actors.actors import RunStats, Session, SessionHost, open_session_host
from zidane_actors.errors import StaleSessionError, ValidationError
from zidane_actors.model import (
    RUN_OWNER_HOLD_MS,
    RunOwner,
    RunUserWait,
    SessionArtifactInput,
    SessionData,
    SessionHistory,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    decode,
    encode,
    host_id,
)
from zidane_actors.stores import (
    FullSessionStore,
    SessionStore,
    create_file_map_store,
    create_remote_store,
    open_directory_adapter,
    open_memory_store,
    open_postgres_store,
    open_sqlite_store,
    store_capabilities,
)

BACKENDS = ("memory", "sqlite", "file-map", "remote", "postgres")
"""Every store; ids containing "postgres" are skipped where no PostgreSQL answers."""

START_MS = 1_700_000_000_000
"""Where the injected clocks start (epoch ms)."""


# -- the rig: two hosts ("processes") over one backing storage ------------------------------


class ManualClock:
    """A clock that answers ``now`` until a test moves it."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@dataclass
class Rig:
    """Host A over ``store_a`` and host B over ``store_b``, both on one storage."""

    backend: str
    store_a: SessionStore
    store_b: SessionStore
    host_a: SessionHost
    host_b: SessionHost
    clock: ManualClock

    def full(self, store: SessionStore) -> FullSessionStore:
        return cast(FullSessionStore, store)

    def has(self, capability: str) -> bool:
        return capability in store_capabilities(self.store_a)


class RigOpener(Protocol):
    def __call__(
        self, backend: str, *, listen: bool = False
    ) -> AbstractAsyncContextManager[Rig]: ...


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One memory-backed server process for the remote store (started on first use)."""
    with ServerProcess("memory") as process:
        yield process


@pytest.fixture
def open_rig(request: pytest.FixtureRequest, tmp_path: Path) -> RigOpener:
    """Opens a :class:`Rig` on fresh storage; ``listen`` opens host B's PostgreSQL store
    with ``listen=True`` (change notifications)."""

    @asynccontextmanager
    async def opener(backend: str, *, listen: bool = False) -> AsyncIterator[Rig]:
        clock = ManualClock(START_MS)
        async with AsyncExitStack() as stack:
            store_a: SessionStore
            store_b: SessionStore
            if backend == "memory":
                store_a = store_b = await stack.enter_async_context(open_memory_store())
            elif backend == "file-map":  # one writer per directory: one store object
                adapter = await stack.enter_async_context(open_directory_adapter(tmp_path / "m"))
                file_map = create_file_map_store(adapter)
                stack.push_async_callback(file_map.aclose)
                store_a = store_b = file_map
            elif backend == "sqlite":
                path = tmp_path / "sessions.db"
                store_a = await stack.enter_async_context(open_sqlite_store(path))
                store_b = await stack.enter_async_context(open_sqlite_store(path))
            elif backend == "postgres":
                schema = stack.enter_context(fresh_schema())
                store_a = await stack.enter_async_context(open_postgres_store(DSN, schema=schema))
                store_b = await stack.enter_async_context(
                    open_postgres_store(DSN, schema=schema, listen=listen)
                )
            elif backend == "remote":
                url = cast(ServerProcess, request.getfixturevalue("server")).url
                store_a = await stack.enter_async_context(create_remote_store(url))
                store_b = await stack.enter_async_context(create_remote_store(url))
            else:  # pragma: no cover - a typo in a parametrization
                raise AssertionError(f"unknown backend {backend!r}")
            assert not listen or backend == "postgres", "only PostgreSQL pushes changes"
            host_a = await stack.enter_async_context(open_session_host(store_a, clock=clock))
            host_b = await stack.enter_async_context(open_session_host(store_b, clock=clock))
            yield Rig(backend, store_a, store_b, host_a, host_b, clock)

    return opener


def backends(*, without: Sequence[str] = ()) -> list[Any]:
    return [pytest.param(b, id=b) for b in BACKENDS if b not in without]


# -- values and reads ------------------------------------------------------------------------


def t(turn_id: str, role: str = "user") -> SessionTurn:
    """A turn; two calls with one id give distinct, equal objects."""
    return SessionTurn(
        id=turn_id,
        role=role,  # type: ignore[arg-type]
        content=(TextBlock(f"text of {turn_id} — ünï"),),
        created_at=1_000,
    )


def ids(turns: Sequence[SessionTurn]) -> list[str]:
    return [turn.id for turn in turns]


def new_id() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


async def stored(store: SessionStore, sid: str) -> SessionData:
    data = await store.load(sid)
    assert data is not None, f"the store lost session {sid!r}"
    return data


async def started(host: SessionHost, sid: str) -> Session:
    """A session created by ``host`` holding one saved turn ``u0``."""
    session = await host.create_session(id=sid, agent_id="old")
    await session.append_turns([t("u0")])
    return session


async def held_by(host: SessionHost, sid: str) -> Session:
    session = await host.load_session(sid)
    assert session is not None, f"host could not load {sid!r}"
    return session


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` (bounded: 30 s stop a stuck test; never a timing claim)."""
    for _ in range(3000):
        if condition():
            return
        await trio.sleep(0.01)
    pytest.fail(f"never saw {what}")


async def assert_memory_is_store(session: Session, store: SessionStore, when: str) -> None:
    data = await stored(store, session.id)
    assert ids(session.turns) == ids(data.turns), (
        f"{when}: memory turns {ids(session.turns)} differ from the store's {ids(data.turns)}"
    )
    assert list(session.turns) == list(data.turns), f"{when}: turn contents differ from the store"
    assert dict(session.metadata) == data.metadata, (
        f"{when}: memory metadata {dict(session.metadata)} differs from the store's {data.metadata}"
    )
    assert session.agent_id == data.agent_id, (
        f"{when}: memory agent id {session.agent_id!r} differs from the store's {data.agent_id!r}"
    )


async def refused_then_retry_works(
    rig: Rig, b: Session, sid: str, kept: list[str], *, what: str
) -> None:
    """``b.save()`` is refused as stale, nothing lost; memory is the store; a retry works."""
    with pytest.raises(StaleSessionError):
        await b.save()
    data = await stored(rig.store_a, sid)
    assert ids(data.turns) == kept, (
        f"{what}: the refused save must write nothing, the store holds {ids(data.turns)}"
    )
    await assert_memory_is_store(b, rig.store_a, f"{what}, after the refused save")
    await b.set_turns([*b.turns, t("b1")])  # computed from the fresh view
    await b.save()
    data = await stored(rig.store_a, sid)
    assert ids(data.turns) == [*kept, "b1"] == ids(b.turns), (
        f"{what}: the retry from the fresh view must land, the store holds {ids(data.turns)}"
    )


# -- 1. a bulk save computed from a view that a refresh replaced is stale ---------------------


REFRESHES = [
    *(pytest.param(b, "load", id=f"{b}-load") for b in BACKENDS),
    pytest.param("postgres", "listen", id="postgres-listen"),
]


@pytest.mark.parametrize(("backend", "refresh"), REFRESHES)
async def test_a_bulk_save_from_a_view_read_before_a_refresh_is_refused(
    open_rig: RigOpener, backend: str, refresh: str
) -> None:
    """B reads its view, A appends ``a1``, B is refreshed (a load, or a PostgreSQL push),
    then B saves ``view + [b1]``: computed from a view without ``a1``, it is stale."""
    sid = new_id()
    async with open_rig(backend, listen=refresh == "listen") as rig:
        a = await started(rig.host_a, sid)
        b = await held_by(rig.host_b, sid)
        view = list(b.turns)
        await a.append_turns([t("a1", "assistant")])  # acknowledged
        if refresh == "load":
            assert await rig.host_b.load_session(sid) is b, "the cached handle is answered"
        else:
            await until(lambda: ids(b.turns) == ["u0", "a1"], "the push refresh B's memory")
        assert ids(b.turns) == ["u0", "a1"], f"the refresh must show a1, B shows {ids(b.turns)}"
        await b.set_turns([*view, t("b1")])
        await refused_then_retry_works(rig, b, sid, ["u0", "a1"], what="view read before a1")


@pytest.mark.parametrize("backend", backends())
async def test_a_bulk_edit_read_right_after_a_load_with_a_refresh_queued_is_judged_by_its_view(
    open_rig: RigOpener, backend: str
) -> None:
    """``set_turns(list(b.turns) + [b1])`` read right after a load was issued (its refresh
    queued in B's actor, not yet applied) is judged against the view it was read from."""
    sid = new_id()
    async with open_rig(backend) as rig:
        a = await started(rig.host_a, sid)
        b = await held_by(rig.host_b, sid)
        await a.append_turns([t("a1", "assistant")])
        before = rig.host_b.statistics().started
        loaded = trio.Event()

        async def load() -> None:
            await rig.host_b.load_session(sid)
            loaded.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(load)
            view = list(b.turns)  # no checkpoint since the load was issued: B's old view
            assert ids(view) == ["u0"], f"read before any refresh, got {ids(view)}"
            # Let the load reach B's actor (its refresh queued) before the edit is sent:
            # bounded, and the verdict asserted below is the same in every interleaving.
            for _ in range(10_000):
                if rig.host_b.statistics().started > before or loaded.is_set():
                    break
                await trio.lowlevel.checkpoint()
            await b.set_turns([*view, t("b1")])
        await refused_then_retry_works(rig, b, sid, ["u0", "a1"], what="view read before a1")


@pytest.mark.parametrize("backend", backends())
async def test_a_hand_built_history_is_refused_when_a_refresh_lands_before_the_save(
    open_rig: RigOpener, backend: str
) -> None:
    """Turns built by hand (equal to the stored ones, not taken from ``b.turns``) are
    conditional on the rev current at ``set_turns``: a refresh before ``save`` refuses it."""
    sid = new_id()
    async with open_rig(backend) as rig:
        a = await started(rig.host_a, sid)
        b = await held_by(rig.host_b, sid)
        hand = [t("u0"), t("b1")]
        assert hand[0] == b.turns[0] and hand[0] is not b.turns[0], "built by hand, equal"
        await b.set_turns(hand)
        await a.append_turns([t("a1", "assistant")])
        assert await rig.host_b.load_session(sid) is b, "the refresh lands before the save"
        with pytest.raises(StaleSessionError):
            await b.save()
        data = await stored(rig.store_a, sid)
        assert ids(data.turns) == ["u0", "a1"], f"a1 must stay, the store holds {data.turns}"
        await assert_memory_is_store(b, rig.store_a, "after the refused hand-built save")
        await b.set_turns([*b.turns, t("b1")])
        await b.save()
        assert ids((await stored(rig.store_a, sid)).turns) == ["u0", "a1", "b1"] == ids(b.turns)


@pytest.mark.parametrize("backend", backends())
async def test_a_hand_built_history_with_no_write_in_between_is_saved(
    open_rig: RigOpener, backend: str
) -> None:
    """The control of the above: nobody wrote since ``set_turns``, so the save lands."""
    sid = new_id()
    async with open_rig(backend) as rig:
        await started(rig.host_a, sid)
        b = await held_by(rig.host_b, sid)
        await b.set_turns([t("u0"), t("b1")])
        assert await rig.host_b.load_session(sid) is b  # a refresh with nothing new
        await b.save()
        data = await stored(rig.store_a, sid)
        assert ids(data.turns) == ["u0", "b1"] == ids(b.turns), f"store holds {data.turns}"


# -- 2. a caller's own field is never dropped by a fold ---------------------------------------


MOVERS = ("another-append", "another-patch-meta", "own-artifact")
FIELD_CASES = [
    pytest.param(b, m, id=f"{b}-{m}")
    for b in BACKENDS
    for m in MOVERS
    if not (b == "file-map" and m == "own-artifact")  # the file map keeps no artifacts
]


@pytest.mark.parametrize(("backend", "mover"), FIELD_CASES)
async def test_an_agent_id_and_a_meta_key_set_before_the_store_moved_are_saved(
    open_rig: RigOpener, backend: str, mover: str
) -> None:
    """``set_agent_id("new")`` and ``set_meta("k", "v")``, then the store moves (another
    writer's append or ``patch_meta``, or this session's own ``add_artifact``), then
    ``save()``: both land and stay in memory, and the move is kept."""
    sid = new_id()
    async with open_rig(backend) as rig:
        a = await started(rig.host_a, sid)
        b = await held_by(rig.host_b, sid)
        await b.set_agent_id("new")
        await b.set_meta("k", "v")
        if mover == "another-append":
            await a.append_turns([t("a1", "assistant")])
        elif mover == "another-patch-meta":
            assert rig.has("patch_meta"), f"{backend} has patch_meta"
            await rig.full(rig.store_a).patch_meta(sid, {"other": "x"})
        else:
            artifact = await b.add_artifact(
                SessionArtifactInput(kind="pull_request", uri="https://example.com/1", label="PR")
            )
            assert artifact is not None, f"{backend} keeps artifacts"
        await b.save()
        data = await stored(rig.store_a, sid)
        assert data.agent_id == "new", f"the store's agent id is {data.agent_id!r} after {mover}"
        assert b.agent_id == "new", f"memory's agent id is {b.agent_id!r} after {mover}"
        assert data.metadata.get("k") == "v", f"store metadata {data.metadata} lost k"
        assert b.metadata.get("k") == "v", f"memory metadata {dict(b.metadata)} lost k"
        if mover == "another-append":
            assert ids(data.turns) == ["u0", "a1"] == ids(b.turns), "a1 kept and folded in"
        if mover == "another-patch-meta":
            assert data.metadata.get("other") == "x", f"patch lost: {data.metadata}"
            assert b.metadata.get("other") == "x", "the patched key is folded in"
        await assert_memory_is_store(b, rig.store_a, f"after the save over {mover}")


@pytest.mark.parametrize("backend", backends())
async def test_an_agent_id_set_after_the_store_moved_is_saved(
    open_rig: RigOpener, backend: str
) -> None:
    """The same intent recorded after another writer moved the store (B not told yet)."""
    sid = new_id()
    async with open_rig(backend) as rig:
        a = await started(rig.host_a, sid)
        b = await held_by(rig.host_b, sid)
        await a.append_turns([t("a1", "assistant")])
        await b.set_agent_id("new")
        await b.save()
        data = await stored(rig.store_a, sid)
        assert (data.agent_id, b.agent_id) == ("new", "new"), (
            f"store {data.agent_id!r}, memory {b.agent_id!r}: the set agent id was dropped"
        )
        assert ids(data.turns) == ["u0", "a1"] == ids(b.turns)


# -- 3. the session's own acknowledged writes never make its next save stale ------------------


async def own_artifact(s: Session) -> None:
    made = await s.add_artifact(
        SessionArtifactInput(kind="pull_request", uri="https://example.com/pr/7", label="PR 7")
    )
    assert made is not None, "the store keeps artifacts"


async def own_append(s: Session) -> None:
    await s.append_turns([t("o1", "assistant")])


async def own_status(s: Session) -> None:
    await s.update_status("completed")


async def own_run(s: Session) -> None:
    await s.start_run("r1", "go")
    await s.complete_run("r1", RunStats(tokens_in=1, tokens_out=2, turns=1))


async def own_update_run(s: Session) -> None:
    await s.update_run(SessionRun(id="r2", prompt="p", started_at=START_MS, status="completed"))


async def own_meta_save(s: Session) -> None:
    await s.set_meta("plan", {"step": 1})
    await s.save()


async def own_mutate_history(s: Session) -> None:
    def add(history: SessionHistory) -> SessionHistory:
        return SessionHistory((*history.turns, t("m1", "assistant")), history.runs)

    assert await s.mutate_history(add) == "ok"


async def own_heal(s: Session) -> None:
    call = SessionTurn(
        id="c1",
        role="assistant",
        content=(ToolCallBlock(id="call_1", name="read", input={"path": "/x"}),),
        created_at=1_001,
    )
    await s.append_turns([call])
    assert await s.heal_interrupted_tool_calls(), "the open call was closed"


OWN_WRITES: dict[str, Callable[[Session], Awaitable[None]]] = {
    "add_artifact": own_artifact,
    "append_turns": own_append,
    "update_status": own_status,
    "start_and_complete_run": own_run,
    "update_run": own_update_run,
    "set_meta_and_save": own_meta_save,
    "mutate_history": own_mutate_history,
    "heal_interrupted_tool_calls": own_heal,
}
OWN_CASES = [
    pytest.param(b, w, id=f"{b}-{w}")
    for b in BACKENDS
    for w in OWN_WRITES
    if not (b == "file-map" and w == "add_artifact")  # the file map keeps no artifacts
]


@pytest.mark.parametrize(("backend", "write"), OWN_CASES)
async def test_the_sessions_own_write_never_makes_its_next_bulk_save_stale(
    open_rig: RigOpener, backend: str, write: str
) -> None:
    """With no other writer: an own write, then ``set_turns([... , x])`` and ``save()``."""
    sid = new_id()
    async with open_rig(backend) as rig:
        s = await started(rig.host_a, sid)
        await OWN_WRITES[write](s)
        before = ids(s.turns)
        await s.set_turns([*s.turns, t("x")])
        await s.save()  # must not raise StaleSessionError
        data = await stored(rig.store_a, sid)
        assert ids(data.turns) == [*before, "x"] == ids(s.turns), (
            f"after {write}: the store holds {ids(data.turns)}, memory {ids(s.turns)}"
        )


# -- 4. every path that shows another process's state shows a live marker demoted -------------


OWNERS: dict[str, Callable[[], RunOwner]] = {
    # Another host: never known dead, so the marker holds by the claim rule.
    "elsewhere-dead-pid": lambda: RunOwner(host_id="elsewhere", pid=dead_pid(), token="t"),
    "elsewhere-live-pid": lambda: RunOwner(host_id="another-host", pid=os.getpid(), token="t"),
    # This host with its pid gone: known dead, so the marker is stale by the claim rule.
    "here-dead-pid": lambda: RunOwner(host_id=host_id(), pid=dead_pid(), token="gone"),
}
PATHS = ("load", "append-fold")
DEMOTION_CASES = [
    *(pytest.param(b, o, p, id=f"{b}-{o}-{p}") for b in BACKENDS for o in OWNERS for p in PATHS),
    *(pytest.param("postgres", o, "listen", id=f"postgres-{o}-listen") for o in OWNERS),
]


async def claim_elsewhere(rig: Rig, sid: str, owner: RunOwner) -> None:
    """Another process claims the session's run and starts run ``r1`` (store writes only)."""
    other = rig.full(rig.store_a)
    if rig.has("claim_run"):
        claim = await other.claim_run(sid, stale_at=rig.clock.now - RUN_OWNER_HOLD_MS, owner=owner)
        assert claim.claimed, "the idle session is claimed"
    else:  # the file map has no claim_run: the marker a claim writes
        await other.update_status(sid, "running", owner=owner)
    await other.update_run(
        sid, SessionRun(id="r1", prompt="go", started_at=rig.clock.now, status="running")
    )
    data = await stored(rig.store_a, sid)
    assert (data.status, data.run_owner) == ("running", owner), "the claim is stored"
    rig.clock.now = data.updated_at + 1_000  # within the marker's horizon


def shown(session: Session) -> tuple[Any, ...]:
    data = session.to_json()
    return data.status, data.run_owner, data.runs


@pytest.mark.parametrize(("backend", "owner_kind", "path"), DEMOTION_CASES)
async def test_another_processes_running_marker_is_shown_demoted_on_every_path(
    open_rig: RigOpener, backend: str, owner_kind: str, path: str
) -> None:
    """H holds an idle session; another process claims its run. H's cached load, the fold
    after H's append, and a PostgreSQL push show ``idle`` and ``r1`` aborted, as a fresh
    host's load does; a live owner's marker stays in the store, even across H's save."""
    sid = new_id()
    owner = OWNERS[owner_kind]()
    live = owner_kind != "here-dead-pid"
    async with open_rig(backend, listen=path == "listen") as rig:
        await rig.store_a.save(
            SessionData(id=sid, created_at=START_MS, updated_at=START_MS, turns=(t("u0"),))
        )
        h = await held_by(rig.host_b, sid)
        assert h.status == "idle" and not h.runs, "H loaded the session while idle"
        await claim_elsewhere(rig, sid, owner)
        if path == "load":
            assert await rig.host_b.load_session(sid) is h, "the cached handle is answered"
        elif path == "append-fold":
            await h.append_turns([t("h1")])  # the store says another writer wrote: a fold
        else:
            await until(lambda: any(r.id == "r1" for r in h.runs), "the push refresh H")
        status, run_owner, runs = shown(h)
        assert (status, run_owner) == ("idle", None), (
            f"{path}: H must show the marker demoted, it shows {status!r} owned by {run_owner}"
        )
        assert [(r.id, r.status) for r in runs] == [("r1", "aborted")], (
            f"{path}: H must show r1 aborted, it shows {[(r.id, r.status) for r in runs]}"
        )
        if live:
            data = await stored(rig.store_a, sid)
            assert (data.status, data.run_owner) == ("running", owner), (
                f"{path}: a live owner's marker must stay in the store, it holds "
                f"{data.status!r} owned by {data.run_owner}"
            )
            assert [r.status for r in data.runs] == ["running"], "the stored run stays running"
        # A save of this session writes its own keys and never clears another's marker.
        await h.set_meta("note", "read while it ran")
        await h.save()
        data = await stored(rig.store_a, sid)
        assert data.metadata.get("note") == "read while it ran", "H's own key is saved"
        if live:
            assert (data.status, data.run_owner) == ("running", owner), (
                f"H's save cleared the live owner's marker: {data.status!r}, {data.run_owner}"
            )
            assert [r.status for r in data.runs] == ["running"], "H's save settled r1"
            if rig.has("claim_run"):
                third = RunOwner(host_id="third-host", pid=1, token="third")
                claim = await rig.full(rig.store_a).claim_run(
                    sid, stale_at=rig.clock.now - RUN_OWNER_HOLD_MS, owner=third
                )
                assert not claim.claimed, "the live owner's marker still holds"
        # A fresh host (another process loading now) shows what H shows.
        async with open_session_host(rig.store_a, clock=rig.clock) as fresh_host:
            fresh = await held_by(fresh_host, sid)
            assert shown(fresh) == shown(h), (
                f"{path}: H shows {shown(h)}, a fresh host's load shows {shown(fresh)}"
            )
            assert list(fresh.turns) == list(h.turns), "H's turns are the store's"


# -- 5. a refused bulk save wedges nothing ---------------------------------------------------


@pytest.mark.parametrize("backend", backends())
async def test_a_refused_bulk_save_leaves_memory_equal_to_the_store(
    open_rig: RigOpener, backend: str
) -> None:
    """``set_turns([good, bad id])``: refused up front (located, memory unchanged) or by
    ``save()`` (memory rolled back); either way the session works on afterwards."""
    sid = new_id()
    async with open_rig(backend) as rig:
        s = await started(rig.host_a, sid)
        before = list(s.turns)
        bad = SessionTurn(id="bad id!", role="user", content=(TextBlock("bad"),), created_at=1)
        try:
            await s.set_turns([t("g1"), bad])
        except ValidationError as exc:  # InvalidNameError included
            assert exc.path is not None and exc.path.startswith("$.turns[1]"), (
                f"the refusal must locate the bad turn ($.turns[1]…), got path {exc.path!r}"
            )
            assert list(s.turns) == before, "a refused set_turns changes no memory"
        else:
            with pytest.raises(ValidationError):
                await s.save()
        await assert_memory_is_store(s, rig.store_a, "after the refused bulk edit")
        assert ids(s.turns) == ["u0"], f"memory shows {ids(s.turns)}"
        await s.set_meta("k", 1)
        await s.save()  # not wedged
        data = await stored(rig.store_a, sid)
        assert data.metadata.get("k") == 1 and ids(data.turns) == ["u0"], f"store: {data}"
        again = await held_by(rig.host_a, sid)
        await assert_memory_is_store(again, rig.store_a, "the host's answer after the refusal")


# -- 7. RunUserWait requires ms ----------------------------------------------------------------


def test_run_user_wait_requires_ms() -> None:
    make: Any = RunUserWait
    with pytest.raises(TypeError):
        make(since=5)
    wait = RunUserWait(ms=3, since=5)
    assert decode(encode(wait), RunUserWait) == wait, "a full userWait round-trips"


RUN_WITHOUT_MS = (
    b'{"id":"r1","prompt":"p","startedAt":1000,"status":"running","userWait":{"since":5}}'
)


@pytest.mark.parametrize(
    ("document", "type_", "where"),
    [
        pytest.param(RUN_WITHOUT_MS, SessionRun, "$.userWait", id="run"),
        pytest.param(
            b'{"id":"s","createdAt":1,"updatedAt":2,"runs":[' + RUN_WITHOUT_MS + b"]}",
            SessionData,
            "$.runs[0].userWait",
            id="session",
        ),
    ],
)
def test_a_stored_user_wait_without_ms_is_refused_located(
    document: bytes, type_: type[Any], where: str
) -> None:
    with pytest.raises(ValidationError) as info:
        decode(document, type_)
    path = info.value.path
    assert path is not None and path.startswith(where), f"expected a path at {where}, got {path!r}"
    assert "ms" in str(info.value), f"the error must name the missing ms: {info.value}"


def test_a_stored_user_wait_with_ms_decodes() -> None:
    document = RUN_WITHOUT_MS.replace(b'{"since":5}', b'{"ms":12,"since":5}')
    run = decode(document, SessionRun)
    assert run.user_wait == RunUserWait(ms=12, since=5)
    assert msgspec.json.decode(encode(run))["userWait"] == {"ms": 12, "since": 5}


# -- the same rule, for histories a caller keeps and for runs --------------------------------


@pytest.mark.parametrize("backend", backends())
async def test_a_history_the_caller_keeps_and_saves_again_and_again_is_never_stale_alone(
    open_rig: RigOpener, backend: str
) -> None:
    # A common loop: keep a list, append to it, set_turns + save each time. The
    # session's own saves move the rev; none of them makes the next one stale.
    async with open_rig(backend) as rig:
        sid = new_id()
        a = await started(rig.host_a, sid)
        history = list(a.turns)
        for n in range(4):
            history.append(t(f"k{n}"))
            await a.set_turns(history)
            await a.save()
        assert ids((await stored(rig.store_b, sid)).turns) == ["u0", "k0", "k1", "k2", "k3"]
        await assert_memory_is_store(a, rig.store_b, "after the loop")


@pytest.mark.parametrize("backend", backends())
async def test_a_history_the_caller_kept_across_another_writers_append_is_refused(
    open_rig: RigOpener, backend: str
) -> None:
    async with open_rig(backend) as rig:
        sid = new_id()
        a = await started(rig.host_a, sid)
        history = list(a.turns)
        history.append(t("k0"))
        await a.set_turns(history)
        await a.save()
        await (await held_by(rig.host_b, sid)).append_turns([t("x1")])
        await rig.host_a.load_session(sid)  # the other writer's turn reaches memory
        assert ids(a.turns) == ["u0", "k0", "x1"]
        history.append(t("k1"))  # built from the view before x1
        await a.set_turns(history)
        with pytest.raises(StaleSessionError):
            await a.save()
        assert ids((await stored(rig.store_b, sid)).turns) == ["u0", "k0", "x1"]
        await assert_memory_is_store(a, rig.store_b, "after the refused save")


@pytest.mark.parametrize("backend", backends())
async def test_a_view_read_before_another_writers_metadata_save_is_refused_after_a_refresh(
    open_rig: RigOpener, backend: str
) -> None:
    # Any change of the stored document starts a new view, not only a history change:
    # the bulk save writes the whole document.
    async with open_rig(backend) as rig:
        sid = new_id()
        a = await started(rig.host_a, sid)
        view = list(a.turns)
        b = await held_by(rig.host_b, sid)
        await b.set_meta("theirs", 1)
        await b.save()
        await rig.host_a.load_session(sid)
        assert a.metadata == {"theirs": 1}
        await a.set_turns([*view, t("a1")])
        with pytest.raises(StaleSessionError):
            await a.save()
        data = await stored(rig.store_b, sid)
        assert (ids(data.turns), data.metadata) == (["u0"], {"theirs": 1})


@pytest.mark.parametrize("backend", backends())
async def test_runs_whose_ids_repeat_or_no_store_can_hold_are_refused_up_front(
    open_rig: RigOpener, backend: str
) -> None:
    async with open_rig(backend) as rig:
        sid = new_id()
        a = await started(rig.host_a, sid)
        run = SessionRun(id="r1", prompt="p", started_at=1, status="completed")
        with pytest.raises(ValidationError) as repeated:
            await a.set_runs([run, run])
        assert repeated.value.path == "$.runs[1].id"
        with pytest.raises(ValidationError) as unsafe:
            await a.set_runs([msgspec.structs.replace(run, id="bad id!")])
        assert unsafe.value.path == "$.runs[0].id"
        assert a.runs == ()
        await a.set_meta("k", 1)
        await a.save()  # nothing refused was kept
        await assert_memory_is_store(a, rig.store_b, "after the refused set_runs")


@pytest.mark.parametrize("backend", backends())
async def test_an_empty_view_read_before_a_refresh_is_refused(
    open_rig: RigOpener, backend: str
) -> None:
    # An empty list carries no turn to tell its view by: it belongs to the last view
    # the session handed out, here the empty one read before the refresh.
    async with open_rig(backend) as rig:
        sid = new_id()
        await rig.host_a.create_session(id=sid)
        b = await held_by(rig.host_b, sid)
        view = list(b.turns)
        assert view == []
        await (await held_by(rig.host_a, sid)).append_turns([t("a1")])
        await rig.host_b.load_session(sid)
        await b.set_turns([*view, t("b1")])
        await refused_then_retry_works(rig, b, sid, ["a1"], what="an empty view")


@pytest.mark.parametrize("backend", backends())
async def test_a_view_is_stale_after_another_writer_moved_the_store_and_back(
    open_rig: RigOpener, backend: str
) -> None:
    # Another writer appends and removes a turn: the turns read the same, the rev
    # moved. A save computed from before is still refused (the store's rule is the rev).
    async with open_rig(backend) as rig:
        sid = new_id()
        a = await started(rig.host_a, sid)
        b = await held_by(rig.host_b, sid)
        view = list(b.turns)
        await a.append_turns([t("x1")])
        await a.set_turns(list(a.turns)[:-1])
        await a.save()
        await rig.host_b.load_session(sid)
        assert ids(b.turns) == ["u0"]
        await b.set_turns([*view, t("b1")])
        await refused_then_retry_works(rig, b, sid, ["u0"], what="a moved-and-back store")


async def test_a_load_that_begins_after_a_write_sees_it_though_an_earlier_load_is_reading() -> None:
    # Concurrent loads of one id share a read; one that began after an acknowledged
    # write must not be answered a read made before it.
    async with open_memory_store() as store, open_session_host(store) as host:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        reading, release = trio.Event(), trio.Event()
        original = store.load_versioned

        async def slow_first_read(session_id: str) -> tuple[SessionData, int] | None:
            found = await original(session_id)
            if not reading.is_set():
                reading.set()
                await release.wait()
            return found

        store.load_versioned = slow_first_read  # type: ignore[method-assign]
        loaded: list[Session | None] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _load_into(host, loaded))
            await reading.wait()  # the first load has read the store: no turns
            await store.append_turns("s", [t("w1")])  # acknowledged
            later: list[Session | None] = []
            nursery.start_soon(lambda: _load_into(host, later))
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert later[0] is not None
        assert ids(later[0].turns) == ["w1"], "a load begun after the write missed it"


async def _load_into(host: SessionHost, into: list[Session | None]) -> None:
    into.append(await host.load_session("s"))


@pytest.mark.parametrize("backend", backends())
async def test_a_restored_session_saves_whole_over_the_rev_it_was_restored_at(
    open_rig: RigOpener, backend: str
) -> None:
    # create_session(_data=...) writes nothing; its next save writes the document whole,
    # conditional on the store's rev at the restore.
    async with open_rig(backend) as rig:
        sid = new_id()
        a = await started(rig.host_a, sid)
        data = msgspec.structs.replace(a.to_json(), agent_id="restored")
        b = await rig.host_b.create_session(_data=data)
        assert ids(b.turns) == ["u0"]
        await b.save()  # nobody wrote since the restore
        assert (await stored(rig.store_a, sid)).agent_id == "restored"
        await rig.host_b.delete_session(sid)
        await rig.store_a.save(data)  # back in the store, as another writer put it
        c = await rig.host_b.create_session(_data=data)
        await rig.store_a.append_turns(sid, [t("x1")])  # another writer, after the restore
        with pytest.raises(StaleSessionError):
            await c.save()
        assert ids((await stored(rig.store_a, sid)).turns) == ["u0", "x1"]
