"""The store contract: one reusable test suite every ``SessionStore`` must pass.

A concrete suite subclasses :class:`StoreContract` and overrides
:meth:`StoreContract.open_storage`: an async context manager that creates
fresh, empty backing storage (a temp database, a schema, a server) and
yields an *opener*, a zero-argument callable returning an async context
manager that opens a store on that storage::

    class TestSqliteStore(StoreContract):
        required_capabilities = OPTIONAL_METHODS | {"apply_writes"}

        @asynccontextmanager
        async def open_storage(self) -> AsyncIterator[StoreOpener]:
            with tempfile.TemporaryDirectory() as tmp:
                yield lambda: open_sqlite_store(Path(tmp) / "sessions.db")

From it the suite derives the ``store`` fixture (a store on fresh storage)
and the ``reopen`` fixture (``store = await reopen()`` closes the current
store and opens a new one on the same storage: durability checks compare
what was written with what the new store reads). The hypothesis property
builds its own storage per example through ``open_storage`` (fixtures go
stale between examples).

Optional methods are tested when ``store_capabilities(store)`` has them and
skipped otherwise, unless ``required_capabilities`` names them: then a
missing method fails. ``apply_writes`` (group commit) counts as a capability
named ``"apply_writes"``. A store without ``rev`` in its meta rows sets
``keeps_rev = False``.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, ClassVar, cast

import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET
from msgspec.structs import replace

from zidane_actors.errors import (
    ConflictError,
    InvalidNameError,
    SessionNotFoundError,
    StaleSessionError,
    StoreClosedError,
    UnsupportedOperationError,
    ValidationError,
)
from zidane_actors.model import (
    ARTIFACTS_PER_SESSION_CAP,
    FIRE_HISTORY,
    ID_MAX_LENGTH,
    MAX_SEARCH_TEXT,
    MAX_SEARCH_WORD_LENGTH,
    MAX_SEARCH_WORDS,
    RUN_OWNER_HOLD_MS,
    SEND_REQUEST_HISTORY,
    AppendTurnsOptions,
    ArtifactFilter,
    DropPartials,
    ExtraFields,
    FileBlock,
    ImageBlock,
    PruneSteps,
    ReasoningBlock,
    RunErrorDetail,
    RunEstimate,
    RunOwner,
    RunUserWait,
    SaveMetaOptions,
    Schedule,
    ScheduleFire,
    SendRequestClaim,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionMetaRow,
    SessionRun,
    SessionRunAgent,
    SessionRunRetry,
    SessionSearch,
    SessionTurn,
    StoredRunBehavior,
    StoredRunOptions,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    UpdateRunOptions,
    current_run_owner,
    decode,
    encode,
    fork_document,
    host_id,
    search_page,
    validate_id,
)
from zidane_actors.model._checked import CheckedTurns, checked_turns
from zidane_actors.stores import (
    BatchingStore,
    MemoryStore,
    Revision,
    SessionStore,
    StoreWrite,
    fork_session,
    list_forks,
    store_capabilities,
)

__all__ = ["StoreContract", "StoreHarness", "StoreOpener"]

StoreOpener = Callable[[], AbstractAsyncContextManager[SessionStore]]
"""Opens a store on one backing storage; each call gives a store over the same data."""

Reopen = Callable[[], Awaitable[Any]]

BAD_IDS: tuple[object, ...] = ("../x", "", "a" * (ID_MAX_LENGTH + 1), "a/b", ".hidden", "x\n", 7)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- value builders ---------------------------------------------------------------------------


def make_turn(n: int, role: str = "user", *, run_id: str | None = None) -> SessionTurn:
    return SessionTurn(
        id=f"t{n}",
        role=role,  # type: ignore[arg-type]
        content=(TextBlock(f"turn {n} — ünïcödé 日本語 🎉"),),
        created_at=1_000 + n,
        run_id=run_id,
    )


def make_run(run_id: str, status: str = "completed", **fields: Any) -> SessionRun:
    return SessionRun(
        id=run_id,
        prompt=f"prompt of {run_id}",
        started_at=1_000,
        status=status,  # type: ignore[arg-type]
        **fields,
    )


def _bare_row(data: SessionData) -> SessionMetaRow:
    """A row naming ``data`` only (what a search compares is the order of the ids)."""
    return SessionMetaRow(
        id=data.id, metadata={}, run_count=0, turn_count=0, updated_at=0, user_message_count=0
    )


def make_session(session_id: str, **fields: Any) -> SessionData:
    fields.setdefault("created_at", 1_000)
    fields.setdefault("updated_at", 2_000)
    return SessionData(id=session_id, **fields)


def rich_turns() -> tuple[SessionTurn, ...]:
    """Turns using every content block type, usage and nested metadata."""
    return (
        SessionTurn(
            id="u1",
            role="user",
            content=(
                TextBlock("read /etc/hosts, s'il vous plaît — «日本語» 🎉"),
                ImageBlock(media_type="image/png", data="aGVsbG8="),
                FileBlock(url="https://example.com/a.pdf", name="a.pdf"),
            ),
            created_at=1_001,
            metadata={"source": {"kind": "tui", "tags": ["a", "b"], "n": 2.5, "ok": True}},
        ),
        SessionTurn(
            id="a1",
            role="assistant",
            content=(
                ReasoningBlock(text="thinking…", provider="anthropic", signature="c2ln"),
                ReasoningBlock(provider="anthropic", redacted_data="cmVk"),
                ToolCallBlock(id="call_1", name="read", input={"path": "/etc/hosts", "n": [1]}),
            ),
            created_at=1_002,
            run_id="r1",
            usage=TurnUsage(input=10, output=20, cache_read=5, cost=0.25, model="m-1"),
        ),
        SessionTurn(
            id="tr1",
            role="user",
            content=(
                ToolResultBlock(
                    call_id="call_1",
                    output=(TextBlock("127.0.0.1 localhost"), ImageBlock(ref="blob:1")),
                    is_error=False,
                    name="read",
                ),
                ToolResultBlock(call_id="call_2", output="boom", is_error=True),
                FileBlock(text="plain document", name="notes.txt"),
            ),
            created_at=1_003,
            run_id="r1",
        ),
        SessionTurn(id="c1", role="command", content=(TextBlock("/compact"),), created_at=1_004),
    )


def rich_run() -> SessionRun:
    """A run record with every nested field filled."""
    return make_run(
        "r1",
        "error",
        agent=SessionRunAgent(id="coder", label="Coder"),
        cost=0.5,
        depth=0,
        ended_at=3_000,
        error="rate limited",
        error_detail=RunErrorDetail(message="429", status_code=429, retry_after_ms=1500.0),
        estimate=RunEstimate(at=1_100, high_ms=9.5, initial_ms=3.0, revisions=1, total_ms=4.0),
        label="main",
        loop_turn=2,
        options=StoredRunOptions(
            behavior=StoredRunBehavior(max_turns=3, retry={"attempts": 2}),
            model=("m-1", {"id": "m-2", "weight": 1}),
            thinking="high",
        ),
        stream_retries=(
            SessionRunRetry(attempt=1, delay_ms=10.0, max_attempts=3, message="x", turn_id="a1"),
        ),
        tokens_in=10,
        tokens_out=20,
        total_usage=TurnUsage(input=10, output=20),
        turns=2,
        turn_usage=(TurnUsage(input=10, output=20, turn_id="a1"),),
        user_wait=RunUserWait(ms=12.0),
        wall_ms=2000.5,
    )


def make_artifact(
    artifact_id: str,
    session_id: str = "s1",
    *,
    kind: str = "pull_request",
    uri: str | None = None,
    created_at: int = 1_000,
    updated_at: int | None = None,
    **fields: Any,
) -> SessionArtifact:
    return SessionArtifact(
        id=artifact_id,
        session_id=session_id,
        kind=kind,
        uri=uri or f"https://example.com/{kind}/{artifact_id}",
        label=fields.pop("label", f"artifact {artifact_id}"),
        created_at=created_at,
        updated_at=created_at if updated_at is None else updated_at,
        **fields,
    )


def make_schedule(schedule_id: str, **fields: Any) -> Schedule:
    fields.setdefault("enabled", True)
    fields.setdefault("created_at", 1_000)
    fields.setdefault("updated_at", 1_000)
    fields.setdefault("interval_ms", 60_000)
    return Schedule(id=schedule_id, prompt=f"run {schedule_id}", **fields)


def make_fire(fire_id: str, schedule_id: str, fired_at: int, **fields: Any) -> ScheduleFire:
    fields.setdefault("status", "ok")
    return ScheduleFire(
        id=fire_id, schedule_id=schedule_id, due_at=fired_at, fired_at=fired_at, **fields
    )


def dead_pid() -> int:
    """A pid no process on this host can have (above the kernel's ``pid_max``)."""
    with open("/proc/sys/kernel/pid_max", encoding="ascii") as f:
        return int(f.read()) + 1


# A session as another writer (a newer zidane, JavaScript) writes it: fields this version does
# not know at every level, lone UTF-16 surrogates as JSON.stringify writes them, explicit values
# and integral numbers in number fields. Every store must read it back as written.
FOREIGN_TURN = (
    '{"id":"f1","role":"assistant","createdAt":1001,"parentTurnId":"t0",'
    '"content":[{"type":"text","text":"clipped \\ud83d","citations":[{"n":1}]},'
    '{"type":"tool_call","id":"c1","name":"lookup","future":true},'
    '{"type":"tool_result","callId":"c1","output":"ok","isError":false},'
    '{"type":"reasoning","signature":"sig"}],'
    '"usage":{"input":1,"output":2,"cost":12000,"reasoningTokens":7},'
    '"metadata":{"label":"\\udc00 low","\\ud800key":1}}'
)
FOREIGN_RUN = (
    '{"id":"r1","prompt":"p \\ud83d","startedAt":1000,"status":"completed","wallMs":12000,'
    '"userWait":{"ms":1500},"agent":{"id":"a","label":"A","avatar":"x"},"budget":{"usd":1},'
    '"totalUsage":{"input":3,"output":4,"cost":2}}'
)
FOREIGN_ARTIFACT = (
    '{"id":"a1","sessionId":"s1","kind":"pull_request","uri":"https://example.com/pr/1",'
    '"label":"PR \\ud83d","createdAt":1000,"updatedAt":1000,"reviewers":["x"]}'
)


def foreign_turn(n: int) -> str:
    return FOREIGN_TURN.replace('"f1"', f'"f{n}"')


def json_doc(raw: str | bytes) -> Any:
    """A JSON document as builtins, lone surrogates included (to compare documents)."""
    return json.loads(raw)


class StoreHarness:
    """One backing storage and the store currently open on it (``reopen`` swaps it)."""

    def __init__(self, opener: StoreOpener) -> None:
        self._opener = opener
        self._current: AsyncExitStack | None = None

    async def reopen(self) -> SessionStore:
        """Close the current store (if any) and open a new one on the same storage."""
        if self._current is not None:
            await self._current.aclose()
            self._current = None
        stack = AsyncExitStack()
        store = await stack.enter_async_context(self._opener())
        self._current = stack
        return store

    async def aclose(self) -> None:
        if self._current is not None:
            await self._current.aclose()
            self._current = None


# -- the suite --------------------------------------------------------------------------------


class StoreContract:
    """Behaviour every ``SessionStore`` shares; subclass and override :meth:`open_storage`."""

    required_capabilities: ClassVar[frozenset[str]] = frozenset()
    """Optional methods (and ``"apply_writes"``) this store must have: missing ones fail."""

    keeps_rev: ClassVar[bool] = True
    """Whether meta rows carry a ``rev`` change counter."""

    def open_storage(self) -> AbstractAsyncContextManager[StoreOpener]:
        """Fresh, empty backing storage, yielding an opener of stores on it."""
        pytest.fail(f"{type(self).__name__} must override open_storage()")

    @pytest.fixture
    async def harness(self) -> AsyncIterator[StoreHarness]:
        async with self.open_storage() as opener:
            harness = StoreHarness(opener)
            try:
                yield harness
            finally:
                await harness.aclose()

    @pytest.fixture
    async def store(self, harness: StoreHarness) -> SessionStore:
        return await harness.reopen()

    @pytest.fixture
    def reopen(self, harness: StoreHarness) -> Reopen:
        return harness.reopen

    def need(self, store: object, *names: str) -> Any:
        """``store`` typed as having ``names``; skip (or fail, when required) if it lacks one."""
        caps = set(store_capabilities(store))
        if isinstance(store, BatchingStore):
            caps.add("apply_writes")
        missing = sorted(set(names) - caps)
        if missing:
            required = sorted(set(missing) & self.required_capabilities)
            if required:
                pytest.fail(f"store lacks required capabilities {required}")
            pytest.skip(f"store lacks optional {missing}")
        return store

    # -- capabilities -----------------------------------------------------------------------

    async def test_required_capabilities_present(self, store: SessionStore) -> None:
        assert isinstance(store, SessionStore)
        caps = set(store_capabilities(store))
        if isinstance(store, BatchingStore):
            caps.add("apply_writes")
        assert self.required_capabilities <= caps, self.required_capabilities - caps

    # -- load / save ------------------------------------------------------------------------

    async def test_load_unknown_is_none(self, store: SessionStore) -> None:
        assert await store.load("nope") is None
        assert await store.list() == []

    async def test_save_load_roundtrip_every_field(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        data = make_session(
            "s1",
            status="completed",
            metadata={"title": "Ünïcode — 日本語 🎉", "model": {"id": "m", "n": [1, 2.5, None]}},
            turns=rich_turns(),
            runs=(rich_run(), make_run("r2", "aborted")),
            agent_id="coder",
            project_root="/home/me/proj",
        )
        await store.save(data)
        assert await store.load("s1") == data
        store = await reopen()
        assert await store.load("s1") == data
        assert await store.list() == ["s1"]

    async def test_foreign_documents_read_back_as_written(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        """Unknown fields, lone surrogates, explicit values and integral numbers: kept as written
        through save, append, update_run and reopen."""
        turns = [decode(foreign_turn(n), SessionTurn) for n in (1, 2)]
        run = decode(FOREIGN_RUN, SessionRun)
        extra = ExtraFields({"workspace": {"root": "/w"}, "label\ud83d": 12000})
        data = make_session(
            "s1", metadata={"t": "\ud83d"}, turns=(turns[0],), runs=(run,), extra_fields=extra
        )
        await store.save(data)
        await store.append_turns("s1", [turns[1]])
        await store.update_run("s1", replace(run, id="r2"))
        current: Any = store
        for reopened in (False, True):
            if reopened:
                current = await reopen()
            loaded = await current.load("s1")
            assert loaded is not None
            assert [json_doc(encode(t)) for t in loaded.turns] == [
                json_doc(foreign_turn(n)) for n in (1, 2)
            ]
            assert [json_doc(encode(r)) for r in loaded.runs] == [
                json_doc(FOREIGN_RUN),
                json_doc(FOREIGN_RUN.replace('"r1"', '"r2"')),
            ]
            assert loaded.metadata == {"t": "\ud83d"}
            assert loaded.extra_fields == extra
            assert json_doc(encode(loaded))["workspace"] == {"root": "/w"}
            assert [json_doc(encode(t)) for t in await current.get_turns("s1")] == [
                json_doc(foreign_turn(n)) for n in (1, 2)
            ]

    async def test_foreign_artifacts_read_back_as_written(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts")
        await store.save(make_session("s1"))
        await full.upsert_artifact(decode(FOREIGN_ARTIFACT, SessionArtifact))
        current: Any = full
        for reopened in (False, True):
            if reopened:
                current = await reopen()
            listed = await current.list_artifacts(ArtifactFilter(session_id="s1"))
            assert [json_doc(encode(a)) for a in listed] == [json_doc(FOREIGN_ARTIFACT)]

    async def test_lone_surrogates_in_metadata_and_ids_never_raise_unicode_errors(
        self, store: SessionStore
    ) -> None:
        """A lone surrogate is carried where a value is stored, refused (located) in an id."""
        await store.save(make_session("s1", metadata={"k\udfff": "v\ud800"}))
        loaded = await store.load("s1")
        assert loaded is not None and loaded.metadata == {"k\udfff": "v\ud800"}
        with pytest.raises(ValidationError):
            await store.save(make_session("s\ud800"))

    @pytest.mark.parametrize("odd", ["a\x00b", "a\ud800b"])
    async def test_header_text_a_database_column_cannot_hold_is_refused_everywhere(
        self, store: SessionStore, odd: str
    ) -> None:
        """NUL and lone surrogates in column text (``agentId``, ``projectRoot``, an artifact's
        ``kind``/``uri``/``projectRoot``): one located refusal in every store, nothing written."""
        writes: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("$.agentId", lambda: store.save(make_session("h1", agent_id=odd))),
            ("$.projectRoot", lambda: store.save(make_session("h1", project_root=odd))),
        ]
        full: Any = store
        if "save_meta" in store_capabilities(store):
            meta = make_session("h1", agent_id=odd)
            writes.append(("$.agentId", lambda: full.save_meta(meta, SaveMetaOptions())))
        for place, write in writes:
            with pytest.raises(ValidationError) as caught:
                await write()
            assert caught.value.path == place
            assert await store.load("h1") is None
        # No session holds such text, so a filter on it matches none (never an error).
        await store.save(make_session("h2", agent_id="a", project_root="/p"))
        for found in (SessionFilter(agent_id=odd), SessionFilter(project_root=odd)):
            assert await store.list(found) == []
            if "list_meta" in store_capabilities(store):
                assert await full.list_meta(found) == []
        if "search_meta" in store_capabilities(store):
            for search in (SessionSearch(agent_id=odd), SessionSearch(project_root=odd)):
                assert (await full.search_meta(search)).rows == ()
            assert (await full.search_meta(SessionSearch(text=odd))).rows == ()
        if {"upsert_artifact", "list_artifacts"} <= store_capabilities(store):
            await store.save(make_session("s1"))
            for place, fields in [
                ("$.kind", {"kind": odd}),
                ("$.uri", {"uri": odd}),
                ("$.projectRoot", {"project_root": odd}),
            ]:
                with pytest.raises(ValidationError) as caught:
                    await full.upsert_artifact(make_artifact("a1", **fields))
                assert caught.value.path == place
            assert await full.list_artifacts(ArtifactFilter(session_id="s1")) == []
            await full.upsert_artifact(make_artifact("a2", project_root="/p"))
            for field in ("kind", "uri", "project_root"):
                assert await full.list_artifacts(ArtifactFilter(**{field: odd})) == []

    async def test_save_empty_session(self, store: SessionStore) -> None:
        data = make_session("empty")
        await store.save(data)
        assert await store.load("empty") == data
        assert await store.get_turns("empty") == []

    async def test_save_huge_metadata(self, store: SessionStore, reopen: Reopen) -> None:
        metadata: dict[str, object] = {
            f"key-{i}-ключ": {"v": "x" * 1_000, "i": i} for i in range(300)
        }
        metadata["blob"] = "€" * 200_000
        data = make_session("big", metadata=metadata)
        await store.save(data)
        store = await reopen()
        loaded = await store.load("big")
        assert loaded is not None
        assert loaded.metadata == metadata

    async def test_save_overwrites_turns_and_runs(self, store: SessionStore) -> None:
        await store.save(
            make_session("s1", turns=(make_turn(1), make_turn(2)), runs=(make_run("r1"),))
        )
        replacement = make_session(
            "s1", updated_at=3_000, turns=(make_turn(9),), runs=(make_run("r9"),)
        )
        await store.save(replacement)
        assert await store.load("s1") == replacement

    async def test_save_never_moves_status_into_running(self, store: SessionStore) -> None:
        foreign = RunOwner(host_id="elsewhere", pid=1, token="t")
        await store.save(make_session("s1", status="running", run_owner=foreign))
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("idle", None)

        owner = RunOwner(host_id="elsewhere", pid=2, token="u")
        await store.update_status("s1", "running", owner=owner)
        await store.save(make_session("s1", status="running", turns=(make_turn(1),)))
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("running", owner)
        assert loaded.turns == (make_turn(1),)

        await store.save(make_session("s1", status="error", run_owner=owner))
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("error", None)

    async def test_returned_values_do_not_alias_the_store(self, store: SessionStore) -> None:
        data = make_session("s1", metadata={"todo": ["a"]}, turns=(make_turn(1),))
        await store.save(data)
        loaded = await store.load("s1")
        assert loaded is not None
        loaded.metadata["todo"].append("mutated")
        loaded.metadata["new"] = 1
        again = await store.load("s1")
        assert again is not None
        assert again.metadata == {"todo": ["a"]}

    # -- append_turns / get_turns -----------------------------------------------------------

    async def test_append_turns_in_order(self, store: SessionStore, reopen: Reopen) -> None:
        await store.save(make_session("s1", turns=(make_turn(1),)))
        before = now_ms()
        await store.append_turns("s1", [make_turn(2), make_turn(3, "assistant")])
        await store.append_turns("s1", (make_turn(4),))
        store = await reopen()
        loaded = await store.load("s1")
        assert loaded is not None
        assert [t.id for t in loaded.turns] == ["t1", "t2", "t3", "t4"]
        assert loaded.turns[2] == make_turn(3, "assistant")
        assert loaded.updated_at >= before

    async def test_append_rich_turns_roundtrip(self, store: SessionStore, reopen: Reopen) -> None:
        await store.save(make_session("s1"))
        await store.append_turns("s1", rich_turns())
        store = await reopen()
        assert tuple(await store.get_turns("s1")) == rich_turns()

    async def test_checked_turns_are_written_as_checked(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        """A ``CheckedTurns`` (what a session hands its store) is written from its bodies:
        a dict changed inside a turn after the check changes nothing stored."""
        await store.save(make_session("s1"))
        noted = replace(make_turn(1), metadata={"n": 1})
        carrier = checked_turns((noted, *rich_turns()))
        assert type(carrier) is CheckedTurns
        assert noted.metadata is not None and carrier[1].metadata is not None
        noted.metadata["n"] = math.nan
        # The carrier holds copies of what was checked, not the caller's values; a copy
        # changed after the check changes nothing stored either: its body is written.
        assert carrier[1].metadata is not noted.metadata
        carrier[1].metadata["source"]["tags"].append("late")
        await store.append_turns("s1", carrier)
        bodies = list(carrier.bodies)
        if "apply_writes" in store_capabilities(store):
            late = [replace(make_turn(n), metadata={"n": n}) for n in (2, 3)]
            batch = [checked_turns([turn]) for turn in late]
            for turn in late:
                assert turn.metadata is not None
                turn.metadata["n"] = {1, 2}
            full: Any = store
            results = await full.apply_writes(
                [StoreWrite("append_turns", ("s1", turns)) for turns in batch]
            )
            assert [r.unwrap() for r in results] == [None, None]
            bodies += [b for turns in batch for b in getattr(turns, "bodies", ())]
        store = await reopen()
        assert [encode(t) for t in await store.get_turns("s1")] == bodies

    async def test_a_tuple_posing_as_checked_turns_is_checked(self, store: SessionStore) -> None:
        class Posing(tuple):  # type: ignore[type-arg]
            bodies = (encode(make_turn(1)),)

        await store.save(make_session("s1"))
        with pytest.raises(ValidationError):
            await store.append_turns(
                "s1", Posing([replace(make_turn(1), metadata={"n": math.nan})])
            )
        assert await store.get_turns("s1") == []

    async def test_append_turns_to_unknown_session_raises(self, store: SessionStore) -> None:
        with pytest.raises(SessionNotFoundError):
            await store.append_turns("ghost", [make_turn(1)])
        assert await store.load("ghost") is None
        assert await store.list() == []

    async def test_append_empty_turns_is_a_no_op(self, store: SessionStore) -> None:
        data = make_session("s1", turns=(make_turn(1),))
        await store.save(data)
        await store.append_turns("s1", [])
        assert await store.load("s1") == data

    async def test_append_turns_upserts_run_in_same_write(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        await store.save(make_session("s1", runs=(make_run("r0"),)))
        started = make_run("r1", "running", loop_turn=0)
        await store.append_turns("s1", [make_turn(1, run_id="r1")], AppendTurnsOptions(run=started))
        progressed = make_run("r1", "running", loop_turn=1, wall_ms=50.0)
        await store.append_turns(
            "s1", [make_turn(2, "assistant", run_id="r1")], AppendTurnsOptions(run=progressed)
        )
        store = await reopen()
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.runs == (make_run("r0"), progressed)
        assert [t.id for t in loaded.turns] == ["t1", "t2"]

    # -- unique turn ids (one rule: zidane_actors.model.fresh_turns) --------------------------

    async def test_append_of_a_stored_identical_turn_is_a_retry(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        await store.save(make_session("s1", turns=(make_turn(1),)))
        await store.append_turns("s1", [make_turn(2)])
        before = await store.load("s1")
        rev = await _rev(store, "s1")
        await store.append_turns("s1", [make_turn(2)])  # the whole append again: a no-op
        await store.append_turns("s1", [make_turn(1), make_turn(2)])
        assert await store.load("s1") == before
        assert await _rev(store, "s1") == rev
        await store.append_turns("s1", [make_turn(2), make_turn(3)])  # partly retried
        store = await reopen()
        assert [t.id for t in await store.get_turns("s1")] == ["t1", "t2", "t3"]

    async def test_append_of_a_stored_id_with_other_content_conflicts(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        await store.save(make_session("s1", turns=(make_turn(1),)))
        before = await store.load("s1")
        other = replace(make_turn(1), role="assistant")
        with pytest.raises(ConflictError, match="t1"):
            await store.append_turns("s1", [other])
        with pytest.raises(ConflictError, match="t1"):
            await store.append_turns("s1", [make_turn(2), other])  # nothing of it written
        with pytest.raises(ConflictError, match="t1"):
            await store.append_turns("s1", [other], AppendTurnsOptions(run=make_run("r1")))
        store = await reopen()
        assert await store.load("s1") == before

    async def test_repeated_turn_ids_in_one_write_are_invalid(self, store: SessionStore) -> None:
        await store.save(make_session("s1", turns=(make_turn(1),)))
        before = await store.load("s1")
        with pytest.raises(ValidationError, match="t2"):
            await store.append_turns("s1", [make_turn(2), make_turn(2)])
        with pytest.raises(ValidationError, match="t2"):
            await store.save(make_session("s1", turns=(make_turn(2), make_turn(2, "assistant"))))
        with pytest.raises(ValidationError, match="t3"):
            await store.save(make_session("s9", turns=(make_turn(3), make_turn(3))))
        if "mutate_history" in store_capabilities(store):
            full: Any = store
            with pytest.raises(ValidationError, match="t1"):
                await full.mutate_history(
                    "s1", lambda h: SessionHistory(turns=h.turns * 2, runs=h.runs)
                )
        assert await store.load("s1") == before
        assert await store.load("s9") is None

    async def test_apply_writes_keeps_the_turn_id_rule(self, store: SessionStore) -> None:
        full = self.need(store, "apply_writes")
        await full.save(make_session("s1", turns=(make_turn(1),)))
        await full.save(make_session("s2"))
        other = replace(make_turn(1), role="assistant")
        results = await full.apply_writes(
            [
                StoreWrite("append_turns", ("s2", [make_turn(5)])),
                StoreWrite("append_turns", ("s1", [make_turn(1)])),
                StoreWrite("append_turns", ("s1", [other])),
                StoreWrite("append_turns", ("s1", [make_turn(2), make_turn(2)])),
                StoreWrite("append_turns", ("s1", [make_turn(3)])),
            ]
        )
        assert [type(getattr(r, "error", None)) for r in results] == [
            type(None),
            type(None),
            ConflictError,
            ValidationError,
            type(None),
        ]
        assert [t.id for t in await full.get_turns("s1")] == ["t1", "t3"]
        assert [t.id for t in await full.get_turns("s2")] == ["t5"]

    async def test_get_turns_slicing(self, store: SessionStore) -> None:
        turns = tuple(make_turn(i) for i in range(6))
        await store.save(make_session("s1", turns=turns))
        assert tuple(await store.get_turns("s1")) == turns
        assert tuple(await store.get_turns("s1", 2)) == turns[2:]
        assert tuple(await store.get_turns("s1", 2, 3)) == turns[2:5]
        assert tuple(await store.get_turns("s1", 4, 100)) == turns[4:]
        assert await store.get_turns("s1", 6) == []
        assert await store.get_turns("s1", 60, 2) == []
        assert await store.get_turns("s1", 0, 0) == []
        assert await store.get_turns("s1", 3, 0) == []
        assert await store.get_turns("ghost") == []
        with pytest.raises(ValidationError):
            await store.get_turns("s1", -1)
        with pytest.raises(ValidationError):
            await store.get_turns("s1", 0, -1)

    # -- update_run -------------------------------------------------------------------------

    async def test_update_run_upserts(self, store: SessionStore, reopen: Reopen) -> None:
        await store.save(make_session("s1", runs=(make_run("r1"), make_run("r2"))))
        await store.update_run("s1", make_run("r3", "running"))
        await store.update_run("s1", make_run("r1", "error", error="boom"))
        await store.update_run("s1", make_run("r3", "completed", ended_at=5_000))
        store = await reopen()
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.runs == (
            make_run("r1", "error", error="boom"),
            make_run("r2"),
            make_run("r3", "completed", ended_at=5_000),
        )

    async def test_update_run_unknown_session_writes_nothing(self, store: SessionStore) -> None:
        await store.update_run("ghost", make_run("r1"))
        assert await store.load("ghost") is None
        assert await store.list() == []

    # -- update_status ----------------------------------------------------------------------

    async def test_update_status_running_records_owner(self, store: SessionStore) -> None:
        await store.save(make_session("s1"))
        before = now_ms()
        await store.update_status("s1", "running")
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("running", current_run_owner())
        assert loaded.updated_at >= before

        owner = RunOwner(host_id="other-host", pid=42, token="abc", started_at=5)
        await store.update_status("s1", "running", owner=owner)
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.run_owner == owner

        await store.update_status("s1", "completed")
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("completed", None)

    async def test_update_status_preserve_updated_at(self, store: SessionStore) -> None:
        await store.save(make_session("s1", updated_at=2_000))
        await store.update_status("s1", "running", preserve_updated_at=True)
        await store.update_status("s1", "idle", preserve_updated_at=True)
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.updated_at) == ("idle", 2_000)
        await store.update_status("s1", "error")
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.status == "error"
        assert loaded.updated_at > 2_000

    async def test_update_status_unknown_session_writes_nothing(self, store: SessionStore) -> None:
        await store.update_status("ghost", "running")
        assert await store.load("ghost") is None
        assert await store.list() == []

    # -- delete -----------------------------------------------------------------------------

    async def test_delete(self, store: SessionStore, reopen: Reopen) -> None:
        await store.save(make_session("s1", turns=(make_turn(1),)))
        await store.save(make_session("s2"))
        await store.delete("s1")
        await store.delete("s1")
        await store.delete("never-existed")
        store = await reopen()
        assert await store.load("s1") is None
        assert await store.get_turns("s1") == []
        assert await store.list() == ["s2"]

    async def test_delete_drops_artifacts_and_send_requests(self, store: SessionStore) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts", "claim_send_request")
        await full.save(make_session("s1"))
        await full.upsert_artifact(make_artifact("a1", "s1"))
        await full.claim_send_request("s1", "req-1", "fp")
        await full.delete("s1")
        assert await full.list_artifacts() == []
        await full.save(make_session("s1"))
        assert await full.list_artifacts(ArtifactFilter(session_id="s1")) == []
        assert (await full.claim_send_request("s1", "req-1", "fp")).claimed

    # -- list -------------------------------------------------------------------------------

    async def test_list_newest_first_ties_by_id(self, store: SessionStore) -> None:
        for session_id, updated_at in [("b", 5), ("a", 5), ("c", 9), ("d", 1), ("e", 5)]:
            await store.save(make_session(session_id, created_at=0, updated_at=updated_at))
        assert await store.list() == ["c", "a", "b", "e", "d"]
        assert await store.list(SessionFilter(limit=2)) == ["c", "a"]
        assert await store.list(SessionFilter(limit=0)) == []
        # Ties by id in code point order (not a locale's): upper case first, "-" before "_".
        for session_id in ("a_1", "B", "a-1", "Z"):
            await store.save(make_session(session_id, created_at=0, updated_at=5))
        tied = ["B", "Z", "a", "a-1", "a_1", "b", "e"]
        assert await store.list() == ["c", *tied, "d"]
        if "list_meta" in store_capabilities(store):
            full: Any = store
            assert [r.id for r in await full.list_meta()] == ["c", *tied, "d"]

    async def test_list_filters(self, store: SessionStore) -> None:
        rows = [
            ("p1-a", "/p1", "agent-a", 10),
            ("p1-b", "/p1", "agent-b", 20),
            ("p2-a", "/p2", "agent-a", 30),
            ("none-a", None, "agent-a", 40),
            ("none-none", None, None, 50),
        ]
        for session_id, root, agent, updated_at in rows:
            await store.save(
                make_session(session_id, project_root=root, agent_id=agent, updated_at=updated_at)
            )
        every = ["none-none", "none-a", "p2-a", "p1-b", "p1-a"]
        assert await store.list() == every
        assert await store.list(SessionFilter()) == every
        assert await store.list(SessionFilter(project_root="/p1")) == ["p1-b", "p1-a"]
        assert await store.list(SessionFilter(project_root=None)) == ["none-none", "none-a"]
        assert await store.list(SessionFilter(agent_id="agent-a")) == ["none-a", "p2-a", "p1-a"]
        assert await store.list(SessionFilter(agent_id="agent-a", project_root="/p1")) == ["p1-a"]
        assert await store.list(SessionFilter(agent_id="agent-a", project_root=None)) == ["none-a"]
        assert await store.list(SessionFilter(agent_id="agent-a", limit=1)) == ["none-a"]
        assert await store.list(SessionFilter(project_root="/elsewhere")) == []

    # -- save_meta --------------------------------------------------------------------------

    async def test_save_meta_new_session_writes_header_and_runs_only(
        self, store: SessionStore
    ) -> None:
        full = self.need(store, "save_meta")
        snapshot = make_session(
            "s1", turns=(make_turn(1),), runs=(make_run("r1"),), agent_id="a", metadata={"k": 1}
        )
        await full.save_meta(snapshot)
        loaded = await full.load("s1")
        assert loaded == replace(snapshot, turns=())

    async def test_save_meta_never_deletes_turns_or_runs(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        full = self.need(store, "save_meta")
        await full.save(
            make_session(
                "s1", turns=(make_turn(1), make_turn(2)), runs=(make_run("r1"), make_run("r2"))
            )
        )
        await full.append_turns("s1", [make_turn(3)])
        stale = make_session(
            "s1",
            updated_at=7_000,
            status="completed",
            agent_id="agent-x",
            project_root="/p",
            metadata={"title": "T"},
            turns=(make_turn(1),),
            runs=(make_run("r2", "error"), make_run("r3")),
        )
        await full.save_meta(stale)
        full = await reopen()
        loaded = await full.load("s1")
        assert loaded is not None
        assert [t.id for t in loaded.turns] == ["t1", "t2", "t3"]
        assert loaded.runs == (make_run("r1"), make_run("r2", "error"), make_run("r3"))
        assert (loaded.updated_at, loaded.status, loaded.agent_id, loaded.project_root) == (
            7_000,
            "completed",
            "agent-x",
            "/p",
        )
        assert loaded.metadata == {"title": "T"}

    async def test_save_meta_meta_keys_merge(self, store: SessionStore) -> None:
        full = self.need(store, "save_meta")
        await full.save(make_session("s1", metadata={"a": 1, "b": 2, "c": 3, "d": 4}))
        snapshot = make_session("s1", metadata={"a": 10, "b": 99, "c": UNSET, "z": 26})
        await full.save_meta(snapshot, SaveMetaOptions(meta_keys=("a", "c", "d", "z")))
        loaded = await full.load("s1")
        assert loaded is not None
        assert loaded.metadata == {"a": 10, "b": 2, "z": 26}

        await full.save_meta(make_session("s1", metadata={"only": True, "gone": UNSET}))
        loaded = await full.load("s1")
        assert loaded is not None
        assert loaded.metadata == {"only": True}

    async def test_save_meta_running_snapshot_rule(self, store: SessionStore) -> None:
        full = self.need(store, "save_meta")
        await full.save_meta(make_session("s1", status="running"))
        loaded = await full.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("idle", None)

        owner = RunOwner(host_id="h", pid=3, token="x")
        await full.update_status("s1", "running", owner=owner)
        ignored = RunOwner(host_id="h", pid=4, token="y")
        await full.save_meta(make_session("s1", status="running", run_owner=ignored))
        loaded = await full.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("running", owner)

        await full.save_meta(make_session("s1", status="completed", run_owner=ignored))
        loaded = await full.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("completed", None)

    # -- get_meta / list_meta ---------------------------------------------------------------

    async def test_get_meta_row(self, store: SessionStore) -> None:
        full = self.need(store, "get_meta")
        assert await full.get_meta("ghost") is None
        turns = (make_turn(1, "system"), make_turn(2), make_turn(3, "assistant"), make_turn(4))
        data = make_session(
            "s1", turns=turns, runs=(make_run("r1"),), agent_id="a", project_root="/p"
        )
        await full.save(data)
        row = await full.get_meta("s1")
        assert row is not None
        assert (row.id, row.turn_count, row.run_count, row.user_message_count) == ("s1", 4, 1, 2)
        assert (row.updated_at, row.created_at, row.status) == (2_000, 1_000, "idle")
        assert (row.agent_id, row.project_root, row.run_owner) == ("a", "/p", None)
        assert row.first_user_turn == make_turn(2)
        assert row.metadata == {}
        if "upsert_artifact" in store_capabilities(store):
            assert row.artifact_count == 0
        if self.keeps_rev:
            assert row.rev is not None

        await full.save(replace(data, metadata={"title": "Named"}))
        row = await full.get_meta("s1")
        assert row is not None
        assert row.metadata == {"title": "Named"}

    async def test_rev_grows_with_every_write(self, store: SessionStore) -> None:
        full = self.need(store, "get_meta")
        if not self.keeps_rev:
            pytest.skip("this store keeps no rev counter")
        caps = store_capabilities(store)
        seen: list[int] = []

        async def bump() -> None:
            row = await full.get_meta("s1")
            assert row is not None
            assert row.rev is not None
            assert not seen or row.rev > seen[-1], (seen, row.rev)
            seen.append(row.rev)

        await full.save(make_session("s1"))
        await bump()
        await full.append_turns("s1", [make_turn(1)])
        await bump()
        await full.update_run("s1", make_run("r1"))
        await bump()
        await full.update_status("s1", "completed", preserve_updated_at=True)
        await bump()
        if "save_meta" in caps:
            await full.save_meta(make_session("s1", updated_at=1))
            await bump()
        if "patch_meta" in caps:
            await full.patch_meta("s1", {"k": "v"})
            await bump()
        if "claim_run" in caps:
            await full.claim_run("s1", stale_at=0)
            await bump()
        if "mutate_history" in caps:
            await full.mutate_history("s1", lambda h: SessionHistory(turns=(), runs=h.runs))
            await bump()
        if "upsert_artifact" in caps:
            await full.upsert_artifact(make_artifact("a1", "s1"))
            await bump()
        if "delete_artifact" in caps:
            await full.delete_artifact("s1", "a1")
            await bump()

    async def test_rev_grows_across_delete_and_recreate(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        full = self.need(store, "get_meta")
        if not self.keeps_rev:
            pytest.skip("this store keeps no rev counter")
        await full.save(make_session("s1"))
        await full.append_turns("s1", [make_turn(1)])
        await full.append_turns("s1", [make_turn(2)])
        last = await _rev(full, "s1")
        await full.delete("s1")
        await full.save(make_session("s1"))
        again = await _rev(full, "s1")
        assert again > last
        await full.delete("s1")
        if "save_meta" in store_capabilities(full):
            await full.save_meta(make_session("s1"))
            assert await _rev(full, "s1") > again

    async def test_versioned_writes_answer_revisions_and_refuse_stale_ones(
        self, store: SessionStore
    ) -> None:
        """A versioned store: reads with the rev, each write's revision, conditional writes."""
        full = self.need(store, "load_versioned", "get_rev", "get_meta")
        assert await full.load_versioned("s1") is None and await full.get_rev("s1") is None
        with pytest.raises(StaleSessionError):
            await full.save(make_session("s1"), expected_rev=5)  # absent: rev 0
        assert await full.get_rev("s1") is None  # nothing written
        created = await full.save(make_session("s1"), expected_rev=0)
        assert created.before == 0 and created.after == await full.get_rev("s1")
        with pytest.raises(ConflictError):  # a second create of the id loses
            await full.save(make_session("s1"), expected_rev=0)
        appended = await full.append_turns("s1", [make_turn(1)])
        assert (appended.before, appended.after) == (created.after, await full.get_rev("s1"))
        retried = await full.append_turns("s1", [make_turn(1)])  # nothing written
        assert retried.before == retried.after == appended.after
        loaded = await full.load_versioned("s1")
        assert loaded is not None and loaded[1] == appended.after
        assert [t.id for t in loaded[0].turns] == ["t1"]
        row = await full.get_meta("s1")
        assert row is not None and row.rev == appended.after
        ran = await full.update_run("s1", make_run("r1"))
        status = await full.update_status("s1", "completed", preserve_updated_at=True)
        assert ran.before == appended.after and status.before == ran.after
        with pytest.raises(StaleSessionError) as info:
            await full.save(make_session("s1"), expected_rev=appended.after)
        assert info.value.expected == appended.after
        assert [t.id for t in await full.get_turns("s1")] == ["t1"]  # the stale save wrote nothing
        caps = store_capabilities(full)
        if "save_meta" in caps:
            with pytest.raises(StaleSessionError):
                await full.save_meta(make_session("s1"), expected_rev=appended.after)
            meta = await full.save_meta(make_session("s1"), expected_rev=status.after)
            assert meta.before == status.after and meta.after == await full.get_rev("s1")
        if "mutate_history" in caps:
            told: list[Revision] = []
            current = await full.get_rev("s1")
            with pytest.raises(StaleSessionError):
                await full.mutate_history(
                    "s1", lambda h: SessionHistory(turns=(), runs=h.runs), expected_rev=1
                )
            assert (
                await full.mutate_history(
                    "s1",
                    lambda h: SessionHistory(turns=(), runs=h.runs),
                    expected_rev=current,
                    on_revision=told.append,
                )
                == "ok"
            )
            assert told == [Revision(current, await full.get_rev("s1"))]
            assert await full.get_turns("s1") == []

    async def test_list_meta_matches_list_and_get_meta(self, store: SessionStore) -> None:
        full = self.need(store, "list_meta", "get_meta")
        assert await full.list_meta() == []
        for i, (root, agent) in enumerate([("/p", "a"), (None, "a"), ("/p", "b"), (None, None)]):
            await full.save(
                make_session(
                    f"s{i}",
                    updated_at=100 + (i % 2),
                    project_root=root,
                    agent_id=agent,
                    turns=(make_turn(i),),
                )
            )
        filters = [
            None,
            SessionFilter(project_root="/p"),
            SessionFilter(project_root=None),
            SessionFilter(agent_id="a"),
            SessionFilter(agent_id="a", project_root=None),
            SessionFilter(limit=3),
            SessionFilter(limit=0),
        ]
        for session_filter in filters:
            rows = await full.list_meta(session_filter)
            assert [r.id for r in rows] == await full.list(session_filter)
            for row in rows:
                assert row == await full.get_meta(row.id)

    # -- search_meta ------------------------------------------------------------------------

    @staticmethod
    def search_turn(n: int, text: str, tool: str | None = None) -> SessionTurn:
        content: tuple[Any, ...] = (TextBlock(text),)
        if tool is not None:
            content += (ToolCallBlock(id=f"c{n}", name=tool, input={"q": "unindexedinput"}),)
        role = "user" if n % 2 == 0 else "assistant"
        return SessionTurn(id=f"t{n}", role=role, content=content, created_at=1_000 + n)

    async def check_search(self, store: Any, searches: list[SessionSearch]) -> None:
        """Each search answers what ``search_page`` answers over the loaded sessions."""
        sessions = [await store.load(sid) for sid in await store.list()]
        for search in searches:
            page = await store.search_meta(search)
            want = search_page(sessions, search, _bare_row)
            assert [r.id for r in page.rows] == [r.id for r in want.rows], search
            assert (page.total, page.total_exact) == (want.total, want.total_exact), search
            for row in page.rows:
                assert row == await store.get_meta(row.id)

    async def test_search_meta_words_filters_order_and_pages(self, store: SessionStore) -> None:
        full = self.need(store, "search_meta", "get_meta")
        texts = [
            ("Weather in Paris, please", "get_weather"),
            ("Deploy the frontend to staging", "run_shell"),
            ("Café crème et croissants", None),
            ("deployment failed: disk full", "read_file"),
        ]
        for i, (text, tool) in enumerate(texts):
            await full.save(
                make_session(
                    f"sess-{i}",
                    created_at=1_000 + 10 * (i % 3),
                    updated_at=5_000 - 100 * i,
                    agent_id="a" if i % 2 else "b",
                    project_root="/p" if i < 2 else None,
                    status="error" if i == 3 else "idle",
                    metadata={"title": "Quarterly report"} if i == 2 else {},
                    turns=(self.search_turn(0, "hello there"), self.search_turn(1, text, tool)),
                )
            )
        found = await full.search_meta(SessionSearch(text="PARIS"))
        assert [r.id for r in found.rows] == ["sess-0"] and found.total == 1 and found.total_exact
        assert [r.id for r in (await full.search_meta(SessionSearch(text="weath"))).rows] == [
            "sess-0"
        ]
        await self.check_search(
            full,
            [
                SessionSearch(),
                SessionSearch(text="deploy"),
                SessionSearch(text="deploy staging"),
                SessionSearch(text="deploy nowhere"),
                SessionSearch(text="get_weather"),
                SessionSearch(text="read"),
                SessionSearch(text="café"),
                SessionSearch(text="quarterly"),
                SessionSearch(text="sess 2"),
                SessionSearch(text="unindexedinput"),
                SessionSearch(text="hello", limit=2, offset=1),
                SessionSearch(text="hello", order="created"),
                SessionSearch(text="hello", count_limit=2),
                SessionSearch(text="  ,;  "),
                SessionSearch(agent_id="a"),
                SessionSearch(project_root=None),
                SessionSearch(project_root="/p", text="hello"),
                SessionSearch(status="error"),
                SessionSearch(created_from=1_010, created_to=1_020),
                SessionSearch(updated_from=4_800, updated_to=5_000, order="created"),
                SessionSearch(limit=0),
                SessionSearch(offset=10),
                SessionSearch(count_limit=0),
            ],
        )

    async def test_search_meta_text_is_bounded(self, store: SessionStore) -> None:
        """Search text up to the bound answers on every store; past it, a refusal at ``$.text``."""
        full = self.need(store, "search_meta", "get_meta")
        many = " ".join(f"k{i:02d}" for i in range(MAX_SEARCH_WORDS))
        longest = "é" * MAX_SEARCH_WORD_LENGTH
        turns = (self.search_turn(0, many), self.search_turn(1, f"a {longest} b"))
        await full.save(make_session("s", turns=turns))
        widest = ("k01 " * MAX_SEARCH_WORDS).ljust(MAX_SEARCH_TEXT)  # both bounds at once
        for text in (many, longest, widest, f"{many[:-3]}k99"):
            found = await full.search_meta(SessionSearch(text=text))
            assert [r.id for r in found.rows] == ([] if "k99" in text else ["s"])
        for text in (
            f"{many} k64",
            "x" + " " * MAX_SEARCH_TEXT,
            f"a {longest}é",
        ):
            with pytest.raises(ValidationError) as refused:
                await full.search_meta(SessionSearch(text=text))
            assert refused.value.path == "$.text"

    async def test_search_meta_index_follows_every_write(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        full = self.need(store, "search_meta", "get_meta")
        await full.save(make_session("s1", turns=(self.search_turn(0, "alpha beta"),)))

        async def hits(text: str) -> list[str]:
            return [r.id for r in (await full.search_meta(SessionSearch(text=text))).rows]

        assert await hits("alpha") == ["s1"]
        await full.append_turns("s1", [self.search_turn(1, "gamma", "lookup_tool")])
        assert await hits("gamma") == await hits("lookup") == ["s1"]
        await full.save(make_session("s1", turns=(self.search_turn(5, "delta"),)))
        assert await hits("alpha") == await hits("gamma") == []
        assert await hits("delta") == ["s1"]
        if "mutate_history" in store_capabilities(full):

            def rewrite(history: SessionHistory) -> SessionHistory:
                return SessionHistory(turns=(self.search_turn(7, "epsilon"),), runs=())

            assert await full.mutate_history("s1", rewrite) == "ok"
            assert await hits("delta") == []
            assert await hits("epsilon") == ["s1"]
        if "patch_meta" in store_capabilities(full):
            await full.patch_meta("s1", {"title": "Zeta title"})
            assert await hits("zeta") == ["s1"]
            await full.patch_meta("s1", {"title": UNSET})
            assert await hits("zeta") == []
        full = await reopen()
        await full.delete("s1")
        assert await hits("s1") == []
        await full.save(make_session("s1"))
        assert await hits("epsilon") == []

    # -- patch_meta -------------------------------------------------------------------------

    async def test_patch_meta(self, store: SessionStore, reopen: Reopen) -> None:
        full = self.need(store, "patch_meta")
        owner = RunOwner(host_id="h", pid=3, token="x")
        await full.save(make_session("s1", metadata={"a": 1, "b": 2}))
        await full.update_status("s1", "running", owner=owner, preserve_updated_at=True)
        await full.patch_meta("s1", {"b": UNSET, "c": {"deep": ["ü"]}, "a": 5})
        full = await reopen()
        loaded = await full.load("s1")
        assert loaded is not None
        assert loaded.metadata == {"a": 5, "c": {"deep": ["ü"]}}
        assert (loaded.status, loaded.run_owner, loaded.updated_at) == ("running", owner, 2_000)

    async def test_patch_meta_unknown_session_writes_nothing(self, store: SessionStore) -> None:
        full = self.need(store, "patch_meta")
        await full.patch_meta("ghost", {"a": 1})
        assert await full.load("ghost") is None
        assert await full.list() == []

    # -- demote_stale_run (the load-time demotion, written only when stale) -----------------

    async def test_demote_stale_run_keeps_a_live_marker(self, store: SessionStore) -> None:
        full = self.need(store, "demote_stale_run")
        foreign = RunOwner(host_id="elsewhere", pid=1, token="live")
        runs = (make_run("r0"), make_run("r1", "running"))
        await full.save(make_session("s1", runs=runs))
        await full.update_status("s1", "running", owner=foreign)
        before = await full.load("s1")
        assert before is not None
        now = now_ms()
        assert not await full.demote_stale_run("s1", stale_at=now - RUN_OWNER_HOLD_MS, now=now)
        assert await full.load("s1") == before
        # Judged at an injected clock past the horizon, the same marker is stale.
        later = before.updated_at + 2 * RUN_OWNER_HOLD_MS
        assert await full.demote_stale_run("s1", stale_at=later - RUN_OWNER_HOLD_MS, now=later)
        after = await full.load("s1")
        assert after is not None
        assert (after.status, after.run_owner, after.updated_at) == (
            "idle",
            None,
            before.updated_at,
        )
        assert after.runs == (make_run("r0"), make_run("r1", "aborted"))
        assert not await full.demote_stale_run("s1", stale_at=later, now=later)  # nothing left
        assert not await full.demote_stale_run("ghost", stale_at=later, now=later)
        assert await full.load("ghost") is None

    async def test_demote_stale_run_takes_a_dead_owners_marker(self, store: SessionStore) -> None:
        full = self.need(store, "demote_stale_run")
        dead = RunOwner(host_id=host_id(), pid=dead_pid(), token="gone")
        await full.save(make_session("s1", runs=(make_run("r1", "running"),)))
        await full.update_status("s1", "running", owner=dead, preserve_updated_at=True)
        now = now_ms()
        assert await full.demote_stale_run("s1", stale_at=now - RUN_OWNER_HOLD_MS, now=now)
        after = await full.load("s1")
        assert after is not None
        assert (after.status, after.run_owner, after.updated_at) == ("idle", None, 2_000)
        assert after.runs == (make_run("r1", "aborted"),)

    # -- claim_run --------------------------------------------------------------------------

    async def test_claim_run_unknown_id_claims_without_row(self, store: SessionStore) -> None:
        full = self.need(store, "claim_run")
        claim = await full.claim_run("ghost", stale_at=now_ms())
        assert claim.claimed
        assert await full.load("ghost") is None
        assert await full.list() == []

    async def test_claim_run_idle_session(self, store: SessionStore) -> None:
        full = self.need(store, "claim_run")
        await full.save(make_session("s1", status="completed"))
        before = now_ms()
        claim = await full.claim_run("s1", stale_at=before - 60_000)
        assert (claim.claimed, claim.previous) == (True, "completed")
        loaded = await full.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("running", current_run_owner())
        assert loaded.updated_at >= before

    async def test_claim_run_blocked_by_live_owner(self, store: SessionStore) -> None:
        full = self.need(store, "claim_run")
        await full.save(make_session("s1"))
        await full.update_status("s1", "running")
        held = await full.load("s1")
        other = RunOwner(host_id="other-host", pid=1, token="z")
        claim = await full.claim_run("s1", stale_at=now_ms() - 60_000, owner=other)
        assert not claim.claimed
        assert await full.load("s1") == held
        # Quiet past stale_at but within this host's hold window: still held.
        claim = await full.claim_run("s1", stale_at=now_ms() + 60_000, owner=other)
        assert not claim.claimed
        assert await full.load("s1") == held

    @pytest.mark.parametrize(
        "dead",
        [
            pytest.param(lambda: RunOwner(host_id=host_id(), pid=dead_pid(), token="t"), id="pid"),
            pytest.param(
                lambda: RunOwner(host_id=host_id(), pid=os.getpid(), token="other"), id="token"
            ),
        ],
    )
    async def test_claim_run_takes_over_dead_owner(
        self, store: SessionStore, dead: Callable[[], RunOwner]
    ) -> None:
        full = self.need(store, "claim_run")
        await full.save(make_session("s1"))
        await full.update_status("s1", "running", owner=dead())
        mine = RunOwner(host_id="claimer", pid=7, token="me")
        claim = await full.claim_run("s1", stale_at=now_ms() - 60_000, owner=mine)
        assert (claim.claimed, claim.previous) == (True, "running")
        loaded = await full.load("s1")
        assert loaded is not None
        assert (loaded.status, loaded.run_owner) == ("running", mine)

    async def test_claim_run_foreign_owner_fresh_vs_stale(self, store: SessionStore) -> None:
        full = self.need(store, "claim_run")
        foreign = RunOwner(host_id="another-machine", pid=1, token="f")
        await full.save(make_session("s1"))
        await full.update_status("s1", "running", owner=foreign)
        assert not (await full.claim_run("s1", stale_at=now_ms() - 60_000)).claimed
        claim = await full.claim_run("s1", stale_at=now_ms() + 1_000)
        assert (claim.claimed, claim.previous) == (True, "running")
        loaded = await full.load("s1")
        assert loaded is not None
        assert loaded.run_owner == current_run_owner()

    async def test_claim_run_own_host_past_hold_window(self, store: SessionStore) -> None:
        full = self.need(store, "claim_run")
        quiet_since = now_ms() - 2 * RUN_OWNER_HOLD_MS
        await full.save(make_session("s1", updated_at=quiet_since))
        await full.update_status("s1", "running", preserve_updated_at=True)
        claim = await full.claim_run("s1", stale_at=now_ms())
        assert (claim.claimed, claim.previous) == (True, "running")

    # -- mutate_history / mutate_turns ------------------------------------------------------

    async def test_mutate_history(self, store: SessionStore, reopen: Reopen) -> None:
        full = self.need(store, "mutate_history")
        assert await full.mutate_history("ghost", lambda h: h) == "no-session"
        assert await full.load("ghost") is None
        runs = (make_run("r1"), make_run("r2"))
        data = make_session("s1", turns=tuple(make_turn(i) for i in range(4)), runs=runs)
        await full.save(data)
        assert await full.mutate_history("s1", lambda h: None) == "unchanged"
        assert await full.load("s1") == data

        seen: list[SessionHistory] = []

        def drop_second(history: SessionHistory) -> SessionHistory:
            seen.append(history)
            return SessionHistory(turns=history.turns[:1] + history.turns[2:], runs=history.runs)

        assert await full.mutate_history("s1", drop_second) == "ok"
        assert seen == [SessionHistory(turns=data.turns, runs=runs)]

        def rewind(history: SessionHistory) -> SessionHistory:
            return SessionHistory(turns=history.turns[:1], runs=history.runs[:1])

        assert await full.mutate_history("s1", rewind) == "ok"
        full = await reopen()
        loaded = await full.load("s1")
        assert loaded is not None
        assert (loaded.turns, loaded.runs) == ((make_turn(0),), (make_run("r1"),))

    async def test_mutate_history_raising_writes_nothing(self, store: SessionStore) -> None:
        full = self.need(store, "mutate_history")
        data = make_session("s1", turns=(make_turn(1),), metadata={"m": [1]})
        await full.save(data)

        class Boom(Exception):
            pass

        def explode(history: SessionHistory) -> SessionHistory:
            raise Boom

        with pytest.raises(Boom):
            await full.mutate_history("s1", explode)
        assert await full.load("s1") == data

        def invalid(history: SessionHistory) -> SessionHistory:
            return SessionHistory(turns=({"id": "x"},), runs=())  # type: ignore[arg-type]

        with pytest.raises(ValidationError):
            await full.mutate_history("s1", invalid)
        assert await full.load("s1") == data

    async def test_mutate_turns(self, store: SessionStore) -> None:
        full = self.need(store, "mutate_turns")
        with pytest.warns(DeprecationWarning, match="mutate_history"):
            assert await full.mutate_turns("ghost", lambda t: t) == "no-session"
        data = make_session("s1", turns=(make_turn(1), make_turn(2)), runs=(make_run("r1"),))
        await full.save(data)
        with pytest.warns(DeprecationWarning):
            assert await full.mutate_turns("s1", lambda t: None) == "unchanged"
        with pytest.warns(DeprecationWarning):
            assert await full.mutate_turns("s1", lambda t: [*t, make_turn(3)][1:]) == "ok"
        loaded = await full.load("s1")
        assert loaded is not None
        assert (loaded.turns, loaded.runs) == ((make_turn(2), make_turn(3)), (make_run("r1"),))

        def explode(turns: tuple[SessionTurn, ...]) -> list[SessionTurn]:
            raise KeyError("x")

        with pytest.raises(KeyError), pytest.warns(DeprecationWarning):
            await full.mutate_turns("s1", explode)
        assert await full.load("s1") == loaded

    async def test_mutate_turns_is_deprecated(self, store: SessionStore) -> None:
        """``mutateTurns`` is deprecated in the spec: each store's ``mutate_turns`` says so
        with a ``DeprecationWarning`` pointing at its caller (``mutate_history`` stays quiet)."""
        full = self.need(store, "mutate_turns")
        await full.save(make_session("s1", turns=(make_turn(1),)))
        with pytest.warns(DeprecationWarning, match="use mutate_history") as caught:
            assert await full.mutate_turns("s1", lambda t: None) == "unchanged"
        assert [w.filename for w in caught] == [__file__]
        if "mutate_history" in store_capabilities(store):
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)
                assert await full.mutate_history("s1", lambda h: None) == "unchanged"

    # -- send requests ----------------------------------------------------------------------

    async def test_send_request_lifecycle(self, store: SessionStore, reopen: Reopen) -> None:
        full = self.need(store, "claim_send_request", "find_send_request", "settle_send_request")
        await full.save(make_session("s1"))
        assert await full.find_send_request("s1", "req-1") is None
        before = now_ms()
        assert (await full.claim_send_request("s1", "req-1", "fp-1")).claimed
        record = await full.find_send_request("s1", "req-1")
        assert record is not None
        assert (record.request_id, record.fingerprint, record.result) == ("req-1", "fp-1", UNSET)
        assert record.created_at >= before

        again = await full.claim_send_request("s1", "req-1", "fp-1")
        assert (again.claimed, again.record) == (False, record)
        mismatch = await full.claim_send_request("s1", "req-1", "fp-other")
        assert not mismatch.claimed
        assert mismatch.record is not None
        assert mismatch.record.fingerprint == "fp-1"
        # Ids are per session.
        await full.save(make_session("s2"))
        assert (await full.claim_send_request("s2", "req-1", "fp-2")).claimed

        result = {"turnId": "t9", "text": "ünï", "n": [1, 2.5]}
        await full.settle_send_request("s1", "req-1", result)
        full = await reopen()
        settled = await full.find_send_request("s1", "req-1")
        assert settled is not None
        assert (settled.fingerprint, settled.result) == ("fp-1", result)
        replay = await full.claim_send_request("s1", "req-1", "fp-1")
        assert (replay.claimed, replay.record) == (False, settled)

        await full.settle_send_request("s1", "req-1", None)
        assert await full.find_send_request("s1", "req-1") is None
        assert (await full.claim_send_request("s1", "req-1", "fp-3")).claimed

    async def test_send_requests_of_an_unknown_session_are_refused(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        """A claim (or a put) for a session the store does not hold is refused, writing
        nothing: a session created later under that id would inherit the claim, and a
        retry of its first send would be answered with a record it never made."""
        full = self.need(store, "claim_send_request", "find_send_request")
        caps = store_capabilities(store)
        with pytest.raises(SessionNotFoundError):
            await full.claim_send_request("later", "req-1", "fp")
        if "put_send_request" in caps:
            record = SendRequestRecord(request_id="req-2", fingerprint="fp", created_at=1_000)
            with pytest.raises(SessionNotFoundError):
                await full.put_send_request("later", record)
        full = await reopen()
        assert await full.load("later") is None
        await full.save(make_session("later"))
        assert await full.find_send_request("later", "req-1") is None
        assert await full.find_send_request("later", "req-2") is None
        assert (await full.claim_send_request("later", "req-1", "fp")).claimed
        await full.delete("later")
        with pytest.raises(SessionNotFoundError):  # deleted: unknown again
            await full.claim_send_request("later", "req-3", "fp")

    async def test_settle_unknown_request_is_a_no_op(self, store: SessionStore) -> None:
        full = self.need(store, "settle_send_request", "find_send_request")
        await full.save(make_session("s1"))
        await full.settle_send_request("s1", "never-claimed", {"x": 1})
        await full.settle_send_request("ghost", "never-claimed", None)
        assert await full.find_send_request("s1", "never-claimed") is None
        assert await full.load("ghost") is None

    async def test_send_request_history_bound(self, store: SessionStore) -> None:
        full = self.need(store, "claim_send_request", "find_send_request")
        await full.save(make_session("s1"))
        for i in range(SEND_REQUEST_HISTORY + 1):
            assert (await full.claim_send_request("s1", f"req-{i}", "fp")).claimed
        assert await full.find_send_request("s1", "req-0") is None
        for i in (1, SEND_REQUEST_HISTORY // 2, SEND_REQUEST_HISTORY):
            assert await full.find_send_request("s1", f"req-{i}") is not None

    async def test_send_requests_list_and_put_exactly(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        full = self.need(
            store,
            "claim_send_request",
            "list_send_requests",
            "put_send_request",
            "find_send_request",
        )
        await full.save(make_session("s1"))
        assert await full.list_send_requests("s1") == []
        copied = [
            SendRequestRecord(request_id="req-b", fingerprint="fp-b", created_at=1_000),
            SendRequestRecord(
                request_id="req-a", fingerprint="fp-a", created_at=2_000, result={"n": [1, 2.5]}
            ),
        ]
        for record in reversed(copied):
            await full.put_send_request("s1", record)
        full = await reopen()
        assert await full.list_send_requests("s1") == copied  # oldest claim first, exact
        assert await full.list_send_requests("s2") == []
        replaced = SendRequestRecord(
            request_id="req-b", fingerprint="fp-b", created_at=1_000, result=7
        )
        await full.put_send_request("s1", replaced)
        assert await full.find_send_request("s1", "req-b") == replaced
        again = await full.claim_send_request("s1", "req-a", "fp-a")
        assert (again.claimed, again.record) == (False, copied[1])  # a put record holds its id
        with pytest.raises(ValidationError):
            await full.put_send_request("s1", "not a record")  # type: ignore[arg-type]
        for i in range(SEND_REQUEST_HISTORY + 1):
            await full.put_send_request(
                "s1",
                SendRequestRecord(request_id=f"bulk-{i}", fingerprint="f", created_at=5_000 + i),
            )
        held = await full.list_send_requests("s1")
        assert (
            len(held) == SEND_REQUEST_HISTORY
            and held[-1].request_id == f"bulk-{SEND_REQUEST_HISTORY}"
        )

    # -- artifacts --------------------------------------------------------------------------

    async def test_upsert_artifact_unknown_session(self, store: SessionStore) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts")
        assert await full.upsert_artifact(make_artifact("a1", "ghost")) is None
        assert await full.list_artifacts() == []
        assert await full.load("ghost") is None

    async def test_upsert_artifact_merges_on_kind_and_uri(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts")
        await full.save(make_session("s1"))
        first = make_artifact(
            "a1",
            uri="https://example.com/pr/1",
            run_id="r1",
            turn_id="t1",
            meta={"number": 1, "title": "ünï"},
            created_at=1_000,
            updated_at=1_500,
        )
        assert await full.upsert_artifact(first) == first
        incoming = make_artifact(
            "a-new",
            uri="https://example.com/pr/1",
            label="renamed",
            run_id="r2",
            created_at=5_000,
            updated_at=1_200,
            project_root="/p",
        )
        merged = await full.upsert_artifact(incoming)
        expected = replace(first, label="renamed", project_root="/p")
        assert merged == expected
        full = await reopen()
        assert await full.list_artifacts() == [expected]

        newer = make_artifact("a-x", uri="https://example.com/pr/1", meta=None, updated_at=9_000)
        stored = await full.upsert_artifact(newer)
        assert stored is not None
        assert (stored.id, stored.meta, stored.updated_at) == ("a1", None, 9_000)

    async def test_list_artifacts_order_and_filters(self, store: SessionStore) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts")
        await full.save(make_session("s1"))
        await full.save(make_session("s2"))
        rows = [
            make_artifact("a1", "s1", kind="branch", created_at=100, project_root="/p"),
            make_artifact("a2", "s1", kind="pull_request", created_at=300),
            make_artifact("a3", "s2", kind="branch", created_at=200, project_root="/q"),
            make_artifact("a4", "s2", kind="commit", created_at=300, project_root="/p"),
        ]
        for row in rows:
            await full.upsert_artifact(row)
        a3 = rows[2]

        async def ids(f: ArtifactFilter | None = None) -> list[str]:
            return [a.id for a in await full.list_artifacts(f)]

        assert await ids() == ["a2", "a4", "a3", "a1"]
        assert await ids(ArtifactFilter(session_id="s1")) == ["a2", "a1"]
        assert await ids(ArtifactFilter(kind="branch")) == ["a3", "a1"]
        assert await ids(ArtifactFilter(kind="branch", uri=a3.uri)) == ["a3"]
        assert await ids(ArtifactFilter(since=200)) == ["a2", "a4", "a3"]
        assert await ids(ArtifactFilter(project_root="/p")) == ["a4", "a1"]
        assert await ids(ArtifactFilter(project_root=None)) == ["a2"]
        assert await ids(ArtifactFilter(project_root="/p", session_id="s2")) == ["a4"]
        assert await ids(ArtifactFilter(limit=2)) == ["a2", "a4"]
        assert await ids(ArtifactFilter(limit=0)) == []
        assert await ids(ArtifactFilter(session_id="ghost")) == []

    async def test_delete_artifact(self, store: SessionStore) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts", "delete_artifact")
        await full.save(make_session("s1"))
        await full.upsert_artifact(make_artifact("a1"))
        await full.upsert_artifact(make_artifact("a2"))
        await full.delete_artifact("s1", "a1")
        await full.delete_artifact("s1", "a1")
        await full.delete_artifact("s1", "unknown")
        await full.delete_artifact("ghost", "a2")
        assert [a.id for a in await full.list_artifacts()] == ["a2"]

    async def test_artifact_count_in_meta(self, store: SessionStore) -> None:
        full = self.need(store, "upsert_artifact", "get_meta")
        await full.save(make_session("s1"))
        await full.upsert_artifact(make_artifact("a1"))
        await full.upsert_artifact(make_artifact("a2"))
        await full.upsert_artifact(make_artifact("a3", uri=make_artifact("a1").uri))
        row = await full.get_meta("s1")
        assert row is not None
        assert row.artifact_count == 2

    async def test_upsert_artifact_refuses_an_id_held_by_another_kind_and_uri(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts")
        await full.save(make_session("s1"))
        await full.save(make_session("s2"))
        held = make_artifact("a1", kind="pull_request", uri="https://example.com/pr/1")
        assert await full.upsert_artifact(held) == held
        taker = make_artifact("a1", kind="branch", uri="git:repo#b")
        with pytest.raises(ConflictError, match=r"'a1'.*'pull_request'"):
            await full.upsert_artifact(taker)
        # The same id in another session is another artifact.
        other = make_artifact("a1", "s2", kind="branch", uri="git:repo#b")
        assert await full.upsert_artifact(other) == other
        full = await reopen()
        assert await full.list_artifacts(ArtifactFilter(session_id="s1")) == [held]

    async def test_upsert_artifact_id_conflict_at_the_cap_evicts_nothing(
        self, store: SessionStore
    ) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts")
        await full.save(make_session("s1"))
        # The oldest file would be evicted first: it is the one holding the id.
        await full.upsert_artifact(make_artifact("f0", kind="file", created_at=1))
        for i in range(ARTIFACTS_PER_SESSION_CAP - 1):
            await full.upsert_artifact(make_artifact(f"c{i}", kind="commit", created_at=10 + i))
        before = await full.list_artifacts()
        with pytest.raises(ConflictError):
            await full.upsert_artifact(make_artifact("f0", kind="commit", created_at=9_000))
        assert await full.list_artifacts() == before

    async def test_artifact_cap_evicts_files_first(self, store: SessionStore) -> None:
        full = self.need(store, "upsert_artifact", "list_artifacts")
        await full.save(make_session("s1"))
        cap = ARTIFACTS_PER_SESSION_CAP
        # Two old non-file rows, then files, then the rest: files go first, oldest first.
        await full.upsert_artifact(make_artifact("pr-old", kind="pull_request", created_at=1))
        await full.upsert_artifact(make_artifact("br-old", kind="branch", created_at=2))
        await full.upsert_artifact(make_artifact("file-b", kind="file", created_at=20))
        await full.upsert_artifact(make_artifact("file-a", kind="file", created_at=10))
        for i in range(cap - 4):
            await full.upsert_artifact(make_artifact(f"c{i}", kind="commit", created_at=100 + i))
        assert len(await full.list_artifacts()) == cap

        await full.upsert_artifact(make_artifact("n1", kind="commit", created_at=9_000))
        ids = {a.id for a in await full.list_artifacts()}
        assert len(ids) == cap
        assert "file-a" not in ids
        assert {"file-b", "pr-old", "br-old", "n1"} <= ids

        await full.upsert_artifact(make_artifact("n2", kind="commit", created_at=9_001))
        await full.upsert_artifact(make_artifact("n3", kind="commit", created_at=9_002))
        ids = {a.id for a in await full.list_artifacts()}
        assert len(ids) == cap
        assert "file-b" not in ids
        assert "pr-old" not in ids
        assert {"br-old", "n1", "n2", "n3"} <= ids

        # An upsert of an existing (kind, uri) evicts nothing.
        await full.upsert_artifact(
            make_artifact("dup", kind="commit", uri=make_artifact("c0", kind="commit").uri)
        )
        assert {a.id for a in await full.list_artifacts()} == ids

    # -- schedules --------------------------------------------------------------------------

    async def test_schedules(self, store: SessionStore, reopen: Reopen) -> None:
        full = self.need(
            store, "save_schedule", "list_schedules", "delete_schedule", "list_schedule_fires"
        )
        assert await full.list_schedules() == []
        late = make_schedule("late", created_at=500, next_fire_at=10_000, session_id="s1")
        early = make_schedule("early", created_at=100, cron="*/5 * * * *", interval_ms=None)
        await full.save_schedule(late)
        await full.save_schedule(early)
        fire = make_fire("f0", "late", 1)
        await full.save_schedule(replace(early, last_fire=fire, name="renamed"))
        full = await reopen()
        renamed = replace(early, name="renamed")
        assert await full.list_schedules() == [renamed, late]

        assert await full.delete_schedule("late")
        assert not await full.delete_schedule("late")
        assert await full.list_schedules() == [renamed]

    async def test_save_schedule_keep_next_fire_at(self, store: SessionStore) -> None:
        full = self.need(store, "save_schedule", "list_schedules")
        await full.save_schedule(make_schedule("s", next_fire_at=5_000))
        await full.save_schedule(
            make_schedule("s", next_fire_at=1, name="edited"), keep_next_fire_at=True
        )
        [kept] = await full.list_schedules()
        assert (kept.name, kept.next_fire_at) == ("edited", 5_000)
        await full.save_schedule(make_schedule("s", next_fire_at=7_000))
        [replaced] = await full.list_schedules()
        assert (replaced.name, replaced.next_fire_at) == (None, 7_000)
        # keep_next_fire_at on a new schedule stores the given value.
        await full.save_schedule(
            make_schedule("new", next_fire_at=3, created_at=2_000), keep_next_fire_at=True
        )
        assert [s.next_fire_at for s in await full.list_schedules()] == [7_000, 3]

    async def test_claim_schedule_fire(self, store: SessionStore) -> None:
        full = self.need(store, "save_schedule", "list_schedules", "claim_schedule_fire")
        await full.save_schedule(make_schedule("s", next_fire_at=1_000))
        assert not await full.claim_schedule_fire("s", 999, 2_000)
        assert await full.claim_schedule_fire("s", 1_000, 2_000)
        assert not await full.claim_schedule_fire("s", 1_000, 2_000)
        [schedule] = await full.list_schedules()
        assert schedule.next_fire_at == 2_000
        assert await full.claim_schedule_fire("s", 2_000, None)
        [schedule] = await full.list_schedules()
        assert schedule.next_fire_at is None
        assert not await full.claim_schedule_fire("ghost", 1_000, 2_000)
        await full.save_schedule(make_schedule("off", enabled=False, next_fire_at=1_000))
        assert not await full.claim_schedule_fire("off", 1_000, 2_000)

    async def test_schedule_fires(self, store: SessionStore, reopen: Reopen) -> None:
        full = self.need(
            store,
            "save_schedule",
            "list_schedules",
            "record_schedule_fire",
            "list_schedule_fires",
            "delete_schedule",
        )
        await full.save_schedule(make_schedule("s"))
        await full.save_schedule(make_schedule("t", created_at=2_000))
        await full.record_schedule_fire(make_fire("f1", "s", 100))
        await full.record_schedule_fire(
            make_fire("f3", "s", 300, status="error", error="boom", session_id="s1")
        )
        await full.record_schedule_fire(make_fire("f2", "s", 200, run_id="r1"))
        full = await reopen()
        fires = await full.list_schedule_fires("s", 10)
        assert [f.id for f in fires] == ["f3", "f2", "f1"]
        assert fires[0] == make_fire("f3", "s", 300, status="error", error="boom", session_id="s1")
        assert [f.id for f in await full.list_schedule_fires("s", 2)] == ["f3", "f2"]
        assert await full.list_schedule_fires("t", 10) == []
        schedules = await full.list_schedules()
        assert [(s.id, s.last_fire) for s in schedules] == [("s", fires[0]), ("t", None)]

        for i in range(FIRE_HISTORY + 5):
            await full.record_schedule_fire(make_fire(f"g{i}", "t", 1_000 + i))
        kept = await full.list_schedule_fires("t", FIRE_HISTORY + 10)
        assert len(kept) == FIRE_HISTORY
        assert kept[0].id == f"g{FIRE_HISTORY + 4}"
        assert kept[-1].id == "g5"

        assert await full.delete_schedule("t")
        assert await full.list_schedule_fires("t", 10) == []

    # -- ids --------------------------------------------------------------------------------

    async def test_generated_ids(self, store: SessionStore) -> None:
        full = self.need(store, "generate_session_id", "generate_turn_id")
        ids = {await full.generate_session_id() for _ in range(20)}
        ids |= {await full.generate_turn_id() for _ in range(20)}
        assert len(ids) == 40
        for value in ids:
            assert validate_id(value) == value

    # -- validation -------------------------------------------------------------------------

    @pytest.mark.parametrize("bad", BAD_IDS, ids=lambda v: repr(v)[:12])
    async def test_bad_session_ids_rejected(self, store: SessionStore, bad: Any) -> None:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.load(bad),
            lambda: store.append_turns(bad, [make_turn(1)]),
            lambda: store.get_turns(bad),
            lambda: store.update_run(bad, make_run("r1")),
            lambda: store.update_status(bad, "idle"),
            lambda: store.delete(bad),
        ]
        if isinstance(bad, str):
            calls.append(lambda: store.save(replace(make_session("x"), id=bad)))
        caps = store_capabilities(store)
        full: Any = store
        if "get_meta" in caps:
            calls.append(lambda: full.get_meta(bad))
        if "patch_meta" in caps:
            calls.append(lambda: full.patch_meta(bad, {}))
        if "claim_run" in caps:
            calls.append(lambda: full.claim_run(bad, stale_at=0))
        if "claim_send_request" in caps:
            calls.append(lambda: full.claim_send_request(bad, "r", "fp"))
            if not isinstance(bad, str) or not bad:  # a request id is not a path
                calls.append(lambda: full.claim_send_request("s1", bad, "fp"))
        if "delete_schedule" in caps:
            calls.append(lambda: full.delete_schedule(bad))
        for call in calls:
            with pytest.raises(InvalidNameError):
                await call()
        assert await store.list() == []

    async def test_request_ids_are_any_text(self, store: SessionStore) -> None:
        """Send request ids are idempotency keys, never paths: ``req#1``, ``a/b``, ``../x``."""
        full = self.need(store, "claim_send_request", "find_send_request", "settle_send_request")
        await store.save(make_session("s1"))
        odd = ("req#1", "req 1", "a/b", "../x", "ünï 🎉", "?q=1&x", "%2F", "r" * 1_000)
        for request_id in odd:
            claim = await full.claim_send_request("s1", request_id, "fp")
            assert claim.claimed, request_id
            await full.settle_send_request("s1", request_id, {"ok": request_id})
            record = await full.find_send_request("s1", request_id)
            assert record is not None and record.request_id == request_id
            assert record.result == {"ok": request_id}
        for bad in ("", "x\x00", "a\ud800", "r" * 1_001, 7):
            with pytest.raises(InvalidNameError):
                await full.claim_send_request("s1", bad, "fp")

    async def test_bad_nested_ids_rejected(self, store: SessionStore) -> None:
        with pytest.raises(InvalidNameError):
            await store.save(make_session("s1", runs=(make_run("../run"),)))
        with pytest.raises(InvalidNameError):
            await store.save(make_session("s1", turns=(replace(make_turn(1), id="a/b"),)))
        assert await store.load("s1") is None

    async def test_wrong_types_rejected(self, store: SessionStore) -> None:
        data = make_session("s1", turns=(make_turn(1),))
        await store.save(data)
        raw = msgspec.to_builtins(make_turn(2))
        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: store.save(msgspec.to_builtins(data)),
            lambda: store.append_turns("s1", [raw]),
            lambda: store.append_turns("s1", "t2"),  # type: ignore[arg-type]
            lambda: store.append_turns("s1", [replace(make_turn(2), created_at=-5)]),
            lambda: store.append_turns("s1", [replace(make_turn(2), role="robot")]),
            lambda: store.update_run("s1", msgspec.to_builtins(make_run("r1"))),
            lambda: store.update_run("s1", replace(make_run("r1"), status="weird")),
            lambda: store.update_status("s1", "bogus"),  # type: ignore[arg-type]
            lambda: store.save(replace(data, metadata={"x": object()})),
            lambda: store.save(replace(data, created_at="yesterday")),
            lambda: store.list({"limit": 3}),  # type: ignore[arg-type]
            lambda: store.list(SessionFilter(limit=-1)),
        ]
        for attempt in attempts:
            with pytest.raises(ValidationError):
                await attempt()
        assert await store.load("s1") == data

    async def test_a_run_whose_user_wait_lacks_ms_is_refused(self, store: SessionStore) -> None:
        """``userWait.ms`` is required: every write path refuses a run without it, located at
        its ``userWait``, and writes nothing."""
        # A struct cannot be built without ``ms``; ``replace`` skips the check, as a caller could.
        run = make_run("r1", user_wait=replace(RunUserWait(ms=1), ms=UNSET))
        data = make_session("s1", turns=(make_turn(1),))
        await store.save(data)
        writes: list[Callable[[], Awaitable[object]]] = [
            lambda: store.save(replace(data, runs=(run,))),
            lambda: store.update_run("s1", run),
            lambda: store.append_turns("s1", [make_turn(2)], AppendTurnsOptions(run=run)),
        ]
        if "save_meta" in store_capabilities(store):
            full: Any = store
            writes.append(lambda: full.save_meta(replace(data, runs=(run,))))
        for write in writes:
            with pytest.raises(ValidationError, match="`ms`") as caught:
                await write()
            assert (caught.value.path or "").endswith(".userWait"), caught.value.path
        assert await store.load("s1") == data

    async def test_wrong_types_rejected_by_optional_methods(self, store: SessionStore) -> None:
        caps = store_capabilities(store)
        full: Any = store
        await store.save(make_session("s1"))
        attempts: list[Callable[[], Awaitable[object]]] = []
        if "patch_meta" in caps:
            attempts.append(lambda: full.patch_meta("s1", ["not", "a", "mapping"]))
            attempts.append(lambda: full.patch_meta("s1", {"x": object()}))
        if "save_meta" in caps:
            attempts.append(lambda: full.save_meta({"id": "s1"}))
        if "upsert_artifact" in caps:
            attempts.append(lambda: full.upsert_artifact({"id": "a"}))
            attempts.append(lambda: full.upsert_artifact(replace(make_artifact("a"), uri="")))
        if "claim_send_request" in caps:
            attempts.append(lambda: full.claim_send_request("s1", "r", 42))
        if "save_schedule" in caps:
            attempts.append(lambda: full.save_schedule(make_schedule("x", interval_ms=0)))
        if "record_schedule_fire" in caps:
            attempts.append(
                lambda: full.record_schedule_fire(replace(make_fire("f", "x", 1), status="?"))
            )
        if "claim_run" in caps:
            attempts.append(lambda: full.claim_run("s1", stale_at="soon"))
        if not attempts:
            pytest.skip("store has none of the optional write methods")
        for attempt in attempts:
            with pytest.raises(ValidationError):
                await attempt()
        assert await store.load("s1") == make_session("s1")

    async def test_deep_values_where_text_or_numbers_are_due_get_bounded_messages(
        self, store: SessionStore
    ) -> None:
        """A value nested 3,000 deep where a status, a number or a key is due is refused with
        a bounded message naming it (``model.preview``), never a ``RecursionError``."""
        deep: Any = []
        deep_key: Any = ()
        for _ in range(3_000):
            deep, deep_key = [deep], (deep_key,)
        caps = store_capabilities(store)
        full: Any = store
        await store.save(make_session("s1"))
        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: store.update_status("s1", deep),
            lambda: store.get_turns("s1", deep),
        ]
        if "patch_meta" in caps:
            attempts.append(lambda: full.patch_meta("s1", {deep_key: 1}))
        if "claim_run" in caps:
            attempts.append(lambda: full.claim_run("s1", stale_at=deep))
        if "demote_stale_run" in caps:
            attempts.append(lambda: full.demote_stale_run("s1", stale_at=deep, now=1))
        for attempt in attempts:
            with pytest.raises(ValidationError) as caught:
                await attempt()
            assert len(str(caught.value)) < 400, str(caught.value)[:400]
        assert await store.load("s1") == make_session("s1")

    # -- close ------------------------------------------------------------------------------

    async def test_closed_store_refuses_calls(self, store: SessionStore) -> None:
        full = self.need(store, "aclose")
        await full.save(make_session("s1"))
        await full.aclose()
        await full.aclose()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: full.load("s1"),
            lambda: full.save(make_session("s2")),
            lambda: full.list(),
            lambda: full.append_turns("s1", [make_turn(1)]),
        ]
        for call in calls:
            with pytest.raises(StoreClosedError):
                await call()

    # -- concurrency ------------------------------------------------------------------------

    async def test_concurrent_appends_lose_nothing(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        await store.save(make_session("s1"))
        writers, per_writer = 4, 5

        async def writer(w: int) -> None:
            for i in range(per_writer):
                await store.append_turns("s1", [make_turn(w * 100 + i)])

        async with trio.open_nursery() as nursery:
            for w in range(writers):
                nursery.start_soon(writer, w)
        store = await reopen()
        ids = [t.id for t in await store.get_turns("s1")]
        assert len(ids) == writers * per_writer
        for w in range(writers):
            assert [i for i in ids if int(i[1:]) // 100 == w] == [
                f"t{w * 100 + i}" for i in range(per_writer)
            ]

    async def test_concurrent_claims_run_have_one_winner(self, store: SessionStore) -> None:
        full = self.need(store, "claim_run")
        await full.save(make_session("s1"))
        stale_at = now_ms() - 60_000
        claims: list[bool] = []

        async def claim(i: int) -> None:
            owner = RunOwner(host_id=f"host-{i}", pid=i + 1, token=f"tok-{i}")
            claims.append((await full.claim_run("s1", stale_at=stale_at, owner=owner)).claimed)

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(claim, i)
        assert sorted(claims) == [False] * 5 + [True]
        loaded = await full.load("s1")
        assert loaded is not None
        assert loaded.status == "running"
        assert loaded.run_owner is not None
        assert loaded.run_owner.host_id.startswith("host-")

    async def test_concurrent_send_claims_have_one_winner(self, store: SessionStore) -> None:
        full = self.need(store, "claim_send_request")
        await full.save(make_session("s1"))
        claims: list[bool] = []

        async def claim(i: int) -> None:
            claims.append((await full.claim_send_request("s1", "req", f"fp-{i}")).claimed)

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(claim, i)
        assert sorted(claims) == [False] * 5 + [True]

    async def test_concurrent_schedule_fire_claims_have_one_winner(
        self, store: SessionStore
    ) -> None:
        full = self.need(store, "save_schedule", "claim_schedule_fire")
        await full.save_schedule(make_schedule("s", next_fire_at=1_000))
        wins: list[bool] = []

        async def claim() -> None:
            wins.append(await full.claim_schedule_fire("s", 1_000, 2_000))

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(claim)
        assert sorted(wins) == [False] * 5 + [True]

    # -- options the store may ignore -------------------------------------------------------

    async def test_step_options_are_accepted(self, store: SessionStore) -> None:
        await store.save(make_session("s1"))
        await store.append_turns(
            "s1",
            [make_turn(1, run_id="r1")],
            AppendTurnsOptions(
                drop_partials=DropPartials(run_id="r1"),
                prune_steps=PruneSteps(run_id="r1", through_turn=1),
                run=make_run("r1", "running"),
            ),
        )
        await store.update_run(
            "s1", make_run("r1"), UpdateRunOptions(prune_steps=PruneSteps(run_id="r1"))
        )
        loaded = await store.load("s1")
        assert loaded is not None
        assert (loaded.turns, loaded.runs) == ((make_turn(1, run_id="r1"),), (make_run("r1"),))

    async def test_unset_metadata_values_are_not_stored(self, store: SessionStore) -> None:
        await store.save(make_session("s1", metadata={"keep": 1, "drop": UNSET}))
        loaded = await store.load("s1")
        assert loaded is not None
        assert loaded.metadata == {"keep": 1}

    # -- group commit -----------------------------------------------------------------------

    async def test_apply_writes_outcomes(self, store: SessionStore, reopen: Reopen) -> None:
        full = self.need(store, "apply_writes")
        writes = [
            StoreWrite("save", (make_session("s1"),)),
            StoreWrite("append_turns", ("s1", [make_turn(1)])),
            StoreWrite("append_turns", ("ghost", [make_turn(2)])),
            StoreWrite("update_run", ("s1", make_run("r1"))),
            StoreWrite("update_status", ("s1", "running"), {"preserve_updated_at": True}),
            StoreWrite("update_run", ("s1", {"not": "a run"})),
            StoreWrite("load", ("s1",)),
            StoreWrite("append_turns", ("s1", [make_turn(3)])),
            StoreWrite("save", (make_session("s2"),)),
        ]
        results = await full.apply_writes(writes)
        assert len(results) == len(writes)
        errors = {i: r.error for i, r in enumerate(results) if hasattr(r, "error")}
        assert set(errors) == {2, 5, 6}
        assert isinstance(errors[2], SessionNotFoundError)
        assert isinstance(errors[5], ValidationError)
        assert isinstance(errors[6], UnsupportedOperationError)
        full = await reopen()
        loaded = await full.load("s1")
        assert loaded is not None
        assert [t.id for t in loaded.turns] == ["t1", "t3"]
        assert loaded.runs == (make_run("r1"),)
        assert loaded.status == "running"
        assert await full.load("ghost") is None
        assert await full.load("s2") == make_session("s2")

    # -- durability of everything -----------------------------------------------------------

    async def test_reopen_keeps_every_kind_of_record(
        self, store: SessionStore, reopen: Reopen
    ) -> None:
        caps = store_capabilities(store)
        full: Any = store
        await full.save(make_session("s1", turns=rich_turns(), runs=(rich_run(),)))
        await full.update_status("s1", "running", owner=RunOwner(host_id="h", pid=1, token="t"))
        if "upsert_artifact" in caps:
            await full.upsert_artifact(make_artifact("a1", meta={"deep": [1, {"x": None}]}))
        if "claim_send_request" in caps:
            await full.claim_send_request("s1", "req", "fp")
        if "save_schedule" in caps:
            await full.save_schedule(make_schedule("sch", next_fire_at=5))
        if "record_schedule_fire" in caps:
            await full.record_schedule_fire(make_fire("f1", "sch", 4))

        async def snapshot(s: Any) -> list[object]:
            state: list[object] = [await s.load("s1"), await s.list()]
            if "get_meta" in caps:
                state.append(await s.get_meta("s1"))
            if "list_artifacts" in caps:
                state.append(await s.list_artifacts())
            if "find_send_request" in caps:
                state.append(await s.find_send_request("s1", "req"))
            if "list_schedules" in caps:
                state.append(await s.list_schedules())
            return state

        before = await snapshot(full)
        full = await reopen()
        assert await snapshot(full) == before

    # -- the differential property -----------------------------------------------------------

    session_ids: ClassVar[tuple[str, ...]] = ("s0", "s1", "s2")
    """Session ids programs use (a one-session store narrows it; others are retargeted)."""

    rev_survives_reopen: ClassVar[bool] = True
    """Whether a re-created id's ``rev`` continues past the deleted one across a reopen."""

    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    )
    @given(program=st.deferred(lambda: PROGRAMS))
    async def test_matches_reference_model(self, program: list[tuple[Any, ...]]) -> None:
        await self.check_reference_model(program)

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    )
    @given(program=st.deferred(lambda: FORK_PROGRAMS))
    async def test_forks_match_reference_model(self, program: list[tuple[Any, ...]]) -> None:
        await self.check_reference_model(program)

    async def check_reference_model(self, program: list[tuple[Any, ...]]) -> None:
        """Run ``program`` on this store and on a memory store; every answer must agree.

        Suites with another example budget call it from their own ``@given``.
        """
        program = [_retarget(op, self.session_ids) for op in program]
        async with self.open_storage() as opener:
            harness = StoreHarness(opener)
            try:
                store = await harness.reopen()
                diff = _Differential(store, MemoryStore(), self.session_ids, self.keeps_rev)
                for op in program:
                    if op[0] == "reopen":
                        diff.store = await harness.reopen()
                        if not self.rev_survives_reopen:
                            diff.revs.clear()
                        continue
                    await diff.step(op)
                await diff.compare_all()
                diff.store = await harness.reopen()
                if not self.rev_survives_reopen:
                    diff.revs.clear()
                await diff.compare_all()
            finally:
                await harness.aclose()

    # -- forks ------------------------------------------------------------------------------
    #
    # Through ``stores.fork_session`` / ``stores.list_forks``: the store's own methods when
    # it has them, the generic rule otherwise, so every store answers these.

    forks_in_store: ClassVar[bool] = True
    """Whether a fork can live in the same store (a file map holds one session: no)."""

    def need_forks(self) -> None:
        if not self.forks_in_store:
            pytest.skip("the store holds one session: its forks live in other stores")

    async def _forked_source(self, store: SessionStore) -> SessionData:
        turns = (
            make_turn(0),
            make_turn(1, "assistant", run_id="r1"),
            make_turn(2),
            make_turn(3, "assistant", run_id="r2"),
        )
        runs = (make_run("r1"), make_run("r2"), make_run("r3", "aborted"))
        data = make_session(
            "src",
            status="completed",
            metadata={"title": "forked words", "zidaneBranches": [], "deep": {"k": [1]}},
            turns=turns,
            runs=runs,
            agent_id="coder",
            project_root="/p",
        )
        await store.save(data)
        stored = await store.load("src")
        assert stored is not None
        return stored

    async def test_fork_whole_history(self, store: SessionStore, reopen: Reopen) -> None:
        self.need_forks()
        source = await self._forked_source(store)
        await fork_session(store, "src", "f1", at=None, created_at=5_000)
        expected = fork_document(source, new_id="f1", at=None, created_at=5_000)
        assert expected.metadata["forkedFrom"] == {
            "sessionId": "src",
            "turnId": "t3",
            "forkedAt": 5_000,
        }
        assert "zidaneBranches" not in expected.metadata
        for _ in range(2):
            assert await store.load("f1") == expected
            assert await store.get_turns("f1", 1, 2) == list(source.turns[1:3])
            assert await list_forks(store, "src") == ["f1"]
            assert await list_forks(store, "f1") == []
            if "get_meta" in store_capabilities(store):
                row = await cast(Any, store).get_meta("f1")
                assert (row.turn_count, row.run_count) == (4, 3)
            store = await reopen()
        assert await store.load("src") == source

    async def test_fork_at_turn_keeps_its_runs(self, store: SessionStore) -> None:
        self.need_forks()
        source = await self._forked_source(store)
        await fork_session(store, "src", "f1", at="t1", created_at=5_000)
        fork = await store.load("f1")
        assert fork == fork_document(source, new_id="f1", at="t1", created_at=5_000)
        assert fork is not None
        assert [t.id for t in fork.turns] == ["t0", "t1"]
        assert [r.id for r in fork.runs] == ["r1", "r3"]  # r2: only a left-out turn's
        assert (fork.status, fork.run_owner) == ("idle", None)
        await fork_session(store, "src", "f0", at="t0", created_at=5_000)
        empty = make_session("bare")
        await store.save(empty)
        await fork_session(store, "bare", "f2", at=None, created_at=5_000)
        bare = await store.load("f2")
        assert bare is not None
        assert bare.turns == () and bare.metadata["forkedFrom"]["turnId"] is None
        assert await list_forks(store, "src") == ["f0", "f1"]

    async def test_fork_is_independent(self, store: SessionStore) -> None:
        self.need_forks()
        await self._forked_source(store)
        await fork_session(store, "src", "f1", at="t2", created_at=5_000)
        await fork_session(store, "f1", "f2", at=None, created_at=6_000)
        before = await store.load("f1")
        await store.append_turns("src", [make_turn(7)])
        await store.append_turns("f1", [make_turn(8)])
        assert [t.id for t in (await store.get_turns("f1"))] == ["t0", "t1", "t2", "t8"]
        assert [t.id for t in (await store.get_turns("src"))][-1] == "t7"
        assert [t.id for t in (await store.get_turns("f2"))] == ["t0", "t1", "t2"]
        assert await list_forks(store, "f1") == ["f2"]
        await store.delete("src")
        assert before is not None
        after = await store.load("f1")
        assert after is not None and after.turns == (*before.turns, make_turn(8))
        assert await list_forks(store, "src") == ["f1"]  # the link stays: it is history
        await store.delete("f2")
        assert await list_forks(store, "f1") == []

    async def test_fork_refusals_write_nothing(self, store: SessionStore) -> None:
        self.need_forks()
        await self._forked_source(store)
        await store.save(make_session("taken", metadata={"x": 1}))
        taken = await store.load("taken")
        with pytest.raises(SessionNotFoundError):
            await fork_session(store, "ghost", "f1", at=None, created_at=5_000)
        with pytest.raises(ValidationError) as bad_at:
            await fork_session(store, "src", "f1", at="nope", created_at=5_000)
        assert bad_at.value.path == "$.at"
        with pytest.raises(InvalidNameError):
            await fork_session(store, "src", "../f", at=None, created_at=5_000)
        with pytest.raises(ConflictError) as conflict:
            await fork_session(store, "src", "taken", at=None, created_at=5_000)
        assert not isinstance(conflict.value, StaleSessionError)
        with pytest.raises(ConflictError):
            await fork_session(store, "src", "src", at=None, created_at=5_000)
        assert await store.load("taken") == taken
        assert await store.load("f1") is None
        assert await list_forks(store, "src") == []

    async def test_fork_at_expected_rev(self, store: SessionStore) -> None:
        self.need_forks()
        full = self.need(store, "load_versioned", "get_rev")
        await self._forked_source(store)
        rev = await full.get_rev("src")
        with pytest.raises(StaleSessionError):
            await fork_session(store, "src", "f1", at=None, created_at=5_000, expected_rev=rev + 1)
        assert await store.load("f1") is None
        revision = await fork_session(
            store, "src", "f1", at=None, created_at=5_000, expected_rev=rev
        )
        assert isinstance(revision, Revision) and revision.before == 0
        assert revision.after == await full.get_rev("f1")
        assert await full.get_rev("src") == rev  # a fork writes nothing to its source

    async def test_fork_leaves_artifacts_and_send_ids_with_its_source(
        self, store: SessionStore
    ) -> None:
        self.need_forks()
        full = self.need(store, "upsert_artifact", "list_artifacts", "claim_send_request")
        await self._forked_source(store)
        await full.upsert_artifact(make_artifact("a1", "src"))
        assert (await full.claim_send_request("src", "req-1", "fp")).claimed
        await fork_session(store, "src", "f1", at=None, created_at=5_000)
        assert await full.list_artifacts(ArtifactFilter(session_id="f1")) == []
        assert (await full.claim_send_request("f1", "req-1", "fp")).claimed
        assert len(await full.list_artifacts(ArtifactFilter(session_id="src"))) == 1

    async def test_fork_is_searched_whole(self, store: SessionStore) -> None:
        self.need_forks()
        full = self.need(store, "search_meta")
        await self._forked_source(store)
        await fork_session(store, "src", "f1", at="t1", created_at=5_000)
        await store.append_turns("src", [make_turn(9)])
        page = await full.search_meta(SessionSearch(text="turn 1"))
        assert sorted(row.id for row in page.rows) == ["f1", "src"]


# -- the differential program: every store against the memory store -----------------------------
#
# One drawn operation is a tuple: its name, then (for session methods) the session id.
# Turn ids come from a small pool with two contents each, so programs append stored ids
# again (retries), with other content (conflicts) and twice in one write; sessions are
# deleted and re-created; ids are sometimes invalid; run markers are written by live,
# foreign and dead owners and judged at the real clock and at an injected later one.

_BAD_ID = "../x"
_FORK_ID = "f0"
"""A fork's new id in programs (a store of one session forks into an id it holds instead)."""
_SESSION_IDS = st.sampled_from(["s0", "s0", "s1", "s2", _BAD_ID])
_RUN_IDS = st.sampled_from(["r0", "r1", "r2"])
_REQUEST_IDS = st.sampled_from(["q0", "q1"])
_AGENTS = st.sampled_from([None, "agent-a", "agent-b"])
_ROOTS = st.sampled_from([None, "/p", "/q"])
_STATUS = st.sampled_from(["idle", "running", "completed", "error"])
_META_KEYS = st.sampled_from(["title", "model", "ünï", "todo"])
_META_VALUES = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=5),
    st.lists(st.integers(0, 3), max_size=2),
)
_LIVE_ELSEWHERE = RunOwner(host_id="h1", pid=1, token="a")
_OWNERS = st.sampled_from(["this-process", "elsewhere", "dead"])
"""Run owners: this process (live, holding), another host (never known dead), a dead pid."""
_TURN = st.builds(
    lambda n, role: make_turn(n, role), st.integers(0, 5), st.sampled_from(["user", "assistant"])
)
_TURNS = st.lists(_TURN, max_size=3).map(tuple)
_RUN = st.builds(make_run, _RUN_IDS, st.sampled_from(["running", "completed", "aborted"]))
_RUNS = st.lists(_RUN, max_size=3, unique_by=lambda r: r.id).map(tuple)
_METADATA = st.dictionaries(_META_KEYS, _META_VALUES, max_size=3)
_SESSIONS = st.builds(
    make_session,
    _SESSION_IDS,
    updated_at=st.integers(1, 10),
    status=_STATUS,
    metadata=_METADATA,
    turns=_TURNS,
    runs=_RUNS,
    agent_id=_AGENTS,
    project_root=_ROOTS,
)
_FILTERS = st.none() | st.builds(
    SessionFilter,
    agent_id=_AGENTS,
    project_root=st.sampled_from([UNSET, None, "/p"]),
    limit=st.none() | st.integers(0, 3),
)
_ARTIFACT_SPOTS = st.sampled_from(
    [("pull_request", "https://example.com/pr/1"), ("branch", "git:r#b"), ("file", "file:///x")]
)
_ARTIFACT_IDS = st.sampled_from(["a0", "a1", "a2"])
_SCHEDULE_IDS = st.sampled_from(["k0", "k1"])

_FORK = st.tuples(
    st.just("fork"),
    _SESSION_IDS,
    st.sampled_from([_FORK_ID, _FORK_ID, "s1", _BAD_ID]),
    st.sampled_from([None, "t0", "t1", "t3", "absent"]),
    st.sampled_from([None, "current", "stale"]),
)

SESSION_OPERATIONS: list[st.SearchStrategy[tuple[Any, ...]]] = [
    st.tuples(st.just("save"), _SESSIONS),
    st.tuples(
        st.just("save_meta"),
        _SESSIONS,
        st.none() | st.lists(_META_KEYS, max_size=3, unique=True).map(tuple),
    ),
    st.tuples(
        st.just("append_turns"),
        _SESSION_IDS,
        _TURNS,
        st.none() | st.just(()) | _RUN.map(lambda run: (run,)),
    ),
    st.tuples(
        st.just("get_turns"), _SESSION_IDS, st.integers(-1, 4), st.none() | st.integers(-1, 3)
    ),
    st.tuples(st.just("load"), _SESSION_IDS),
    st.tuples(st.just("update_run"), _SESSION_IDS, _RUN),
    st.tuples(st.just("update_status"), _SESSION_IDS, _STATUS, _OWNERS, st.booleans()),
    st.tuples(
        st.just("patch_meta"),
        _SESSION_IDS,
        st.dictionaries(_META_KEYS, _META_VALUES | st.just(UNSET), max_size=2),
    ),
    st.tuples(
        st.just("mutate_history"),
        _SESSION_IDS,
        st.sampled_from(["drop_first", "repeat_first", "keep", "abort_runs", "raise"]),
    ),
    st.tuples(st.just("delete"), _SESSION_IDS),
    st.tuples(st.just("recreate"), _SESSION_IDS),
    _FORK,
    _FORK,  # drawn twice as often: most forks meet a taken id
    st.tuples(st.just("list_forks"), _SESSION_IDS),
    st.tuples(st.just("claim_run"), _SESSION_IDS, st.sampled_from(["guarded", "stale"]), _OWNERS),
    st.tuples(st.just("demote_stale_run"), _SESSION_IDS, st.sampled_from(["now", "later"])),
    st.tuples(st.just("get_meta"), _SESSION_IDS),
    st.tuples(st.just("list"), _FILTERS),
    st.tuples(st.just("list_meta"), _FILTERS),
    st.tuples(
        st.just("search_meta"),
        st.sampled_from(["turn", "TURN 1", "ünï", "日本", "s1", "s2 turn", "t", "absent", ""]),
    ),
    st.tuples(
        st.just("claim_send_request"), _SESSION_IDS, _REQUEST_IDS, st.sampled_from(["f0", "f1"])
    ),
    st.tuples(st.just("find_send_request"), _SESSION_IDS, _REQUEST_IDS),
    st.tuples(
        st.just("settle_send_request"),
        _SESSION_IDS,
        _REQUEST_IDS,
        st.sampled_from([None, {"turnId": "t"}, "done"]),
    ),
    st.tuples(
        st.just("upsert_artifact"),
        _SESSION_IDS,
        _ARTIFACT_SPOTS,
        st.sampled_from(["one", "two"]),
        st.integers(1, 5),
        st.sampled_from([UNSET, None, {"n": 1}]),
        _ARTIFACT_IDS,
    ),
    st.tuples(st.just("delete_artifact"), _SESSION_IDS, _ARTIFACT_IDS),
    st.tuples(
        st.just("list_artifacts"),
        st.none() | st.sampled_from(["s0", "s1"]),
        st.none() | st.sampled_from(["pull_request", "file"]),
    ),
    st.tuples(
        st.just("save_schedule"),
        _SCHEDULE_IDS,
        st.booleans(),
        st.none() | st.integers(1, 3),
        st.booleans(),
    ),
    st.tuples(st.just("list_schedules")),
    st.tuples(
        st.just("claim_schedule_fire"), _SCHEDULE_IDS, st.integers(1, 3), st.none() | st.just(9)
    ),
    st.tuples(
        st.just("record_schedule_fire"),
        _SCHEDULE_IDS,
        st.sampled_from(["f0", "f1"]),
        st.integers(1, 5),
    ),
    st.tuples(st.just("list_schedule_fires"), _SCHEDULE_IDS, st.integers(0, 3)),
    st.tuples(st.just("delete_schedule"), _SCHEDULE_IDS),
    st.tuples(st.just("generate_ids")),
    st.tuples(st.just("reopen")),
]
"""Every store method as drawn operations (a method the store lacks is left out)."""

VALUE_OPERATIONS: list[st.SearchStrategy[tuple[Any, ...]]] = []
"""Hook: operations carrying values a store must refuse or keep exactly (oversized,
non-JSON, deep nesting...). Append strategies of ``("append_turns", sid, turns, None)``
style tuples (any operation :func:`_call` knows); they join :data:`PROGRAMS`."""

_OPERATION: st.SearchStrategy[tuple[Any, ...]] = st.deferred(
    lambda: st.one_of(*SESSION_OPERATIONS, *VALUE_OPERATIONS)
)
"""One drawn operation."""

PROGRAMS = st.lists(_OPERATION, min_size=4, max_size=30).map(lambda ops: [*_SEEDS, *ops])
"""A program: a save of each session, then drawn operations."""

FORK_PROGRAMS = st.lists(
    st.one_of(
        _FORK,
        st.tuples(st.just("list_forks"), _SESSION_IDS),
        st.tuples(st.just("append_turns"), _SESSION_IDS, _TURNS, st.none()),
        st.tuples(st.just("mutate_history"), _SESSION_IDS, st.sampled_from(["drop_first"])),
        st.tuples(st.just("delete"), st.sampled_from(["s0", _FORK_ID])),
        st.tuples(st.just("load"), st.sampled_from(["s1", _FORK_ID])),
    ),
    min_size=2,
    max_size=12,
).map(lambda ops: [*_SEEDS, *ops])
"""A program of forks among appends, edits and deletes (after the seeds)."""

_SEEDS: list[tuple[Any, ...]] = [
    ("save", make_session(sid, updated_at=5, metadata={"title": sid}, turns=(make_turn(0),)))
    for sid in ("s0", "s1", "s2")
]

_NEEDS: dict[str, tuple[str, ...]] = {
    "patch_meta": ("patch_meta",),
    "mutate_history": ("mutate_history",),
    "claim_run": ("claim_run",),
    "demote_stale_run": ("demote_stale_run",),
    "get_meta": ("get_meta",),
    "list_meta": ("list_meta",),
    "search_meta": ("search_meta",),
    "claim_send_request": ("claim_send_request",),
    "find_send_request": ("find_send_request",),
    "settle_send_request": ("settle_send_request",),
    "upsert_artifact": ("upsert_artifact",),
    "delete_artifact": ("delete_artifact",),
    "list_artifacts": ("list_artifacts",),
    "save_schedule": ("save_schedule",),
    "list_schedules": ("list_schedules",),
    "claim_schedule_fire": ("claim_schedule_fire",),
    "record_schedule_fire": ("record_schedule_fire",),
    "list_schedule_fires": ("list_schedule_fires",),
    "delete_schedule": ("delete_schedule",),
    "generate_ids": ("generate_session_id", "generate_turn_id"),
}

_WRITES = frozenset(
    {
        "save",
        "save_meta",
        "append_turns",
        "update_run",
        "update_status",
        "patch_meta",
        "mutate_history",
        "delete",
        "recreate",
        "fork",
        "claim_run",
        "demote_stale_run",
        "upsert_artifact",
        "delete_artifact",
    }
)
"""Session writes: after each, the store's ``rev`` for that id is read (it never goes back)."""

_STAMPING = frozenset(
    {"append_turns", "update_run", "update_status", "claim_run", "mutate_history"}
)
"""Writes stamping ``updatedAt`` with the store's own clock (two stores' stamps differ)."""

_ERROR_KINDS: tuple[type[Exception], ...] = (
    InvalidNameError,
    ValidationError,
    ConflictError,
    SessionNotFoundError,
    StoreClosedError,
    UnsupportedOperationError,
)


class _Refused(Exception):
    """Raised by a drawn ``mutate_history`` callback: nothing may be written."""


def _retarget(op: tuple[Any, ...], session_ids: tuple[str, ...]) -> tuple[Any, ...]:
    """``op`` with valid session ids outside ``session_ids`` mapped to its first."""

    def fix(sid: Any) -> Any:
        return sid if sid in session_ids or sid == _BAD_ID or sid is None else session_ids[0]

    name = op[0]
    if name in ("save", "save_meta"):
        return (name, replace(op[1], id=fix(op[1].id)), *op[2:])
    if name == "list_artifacts":
        return (name, fix(op[1]), *op[2:])
    if name == "fork":
        new = op[2] if len(session_ids) > 1 else fix(op[2])
        return (name, fix(op[1]), new, *op[3:])
    if name in ("reopen", "list", "list_meta", "search_meta", "generate_ids") or "schedule" in name:
        return op
    return (name, fix(op[1]), *op[2:])


def _owner(kind: str) -> RunOwner:
    if kind == "this-process":
        return current_run_owner()
    if kind == "elsewhere":
        return _LIVE_ELSEWHERE
    return RunOwner(host_id=host_id(), pid=dead_pid(), token="gone")


def _history_edit(kind: str) -> Callable[[SessionHistory], SessionHistory | None]:
    def edit(history: SessionHistory) -> SessionHistory | None:
        if kind == "drop_first":
            return (
                SessionHistory(turns=history.turns[1:], runs=history.runs)
                if history.turns
                else None
            )
        if kind == "repeat_first":
            return SessionHistory(turns=history.turns + history.turns[:1], runs=history.runs)
        if kind == "abort_runs":
            runs = tuple(replace(r, status="aborted") for r in history.runs)
            return SessionHistory(turns=history.turns, runs=runs)
        if kind == "raise":
            raise _Refused
        return None

    return edit


async def _call(store: Any, op: tuple[Any, ...]) -> Any:
    """Carry out ``op`` on ``store``; its answer."""
    name, args = op[0], op[1:]
    if name == "save_meta" and "save_meta" not in store_capabilities(store):
        name = "save"
    if name == "save":
        return await store.save(args[0])
    if name == "save_meta":
        options = None if args[1] is None else SaveMetaOptions(meta_keys=args[1])
        return await store.save_meta(args[0], options)
    if name == "append_turns":
        options = (
            None if args[2] is None else AppendTurnsOptions(run=args[2][0] if args[2] else None)
        )
        return await store.append_turns(args[0], args[1], options)
    if name == "get_turns":
        return await store.get_turns(args[0], args[1], args[2])
    if name == "update_status":
        return await store.update_status(
            args[0], args[1], owner=_owner(args[2]), preserve_updated_at=args[3]
        )
    if name == "mutate_history":
        return await store.mutate_history(args[0], _history_edit(args[1]))
    if name == "claim_run":
        stale_at = 0 if args[1] == "guarded" else now_ms() + 86_400_000
        return await store.claim_run(args[0], stale_at=stale_at, owner=_owner(args[2]))
    if name == "demote_stale_run":
        now = now_ms() + (0 if args[1] == "now" else 2 * RUN_OWNER_HOLD_MS)
        return await store.demote_stale_run(args[0], stale_at=now - RUN_OWNER_HOLD_MS, now=now)
    if name == "upsert_artifact":
        session_id, (kind, uri), label, stamp, meta, artifact_id = args
        artifact = make_artifact(
            artifact_id, session_id, kind=kind, uri=uri, label=label,
            created_at=stamp, updated_at=stamp, meta=meta,
        )  # fmt: skip
        return await store.upsert_artifact(artifact)
    if name == "list_artifacts":
        return await store.list_artifacts(ArtifactFilter(session_id=args[0], kind=args[1]))
    if name == "search_meta":
        return await store.search_meta(SessionSearch(text=args[0], limit=1000))
    if name == "save_schedule":
        schedule_id, enabled, next_fire_at, keep = args
        schedule = make_schedule(schedule_id, enabled=enabled, next_fire_at=next_fire_at)
        return await store.save_schedule(schedule, keep_next_fire_at=keep)
    if name == "record_schedule_fire":
        schedule_id, fire_id, fired_at = args
        return await store.record_schedule_fire(make_fire(fire_id, schedule_id, fired_at))
    if name == "fork":  # the store's own fork or the generic rule: the same answers
        source, new, at, expecting = args
        expected = None  # each store's revs are its own: the source's as read now, or past it
        if expecting and source != _BAD_ID and "get_rev" in store_capabilities(store):
            expected = (await store.get_rev(source) or 0) + (expecting == "stale")
        return await fork_session(
            store, source, new, at=at, created_at=5_000, expected_rev=expected
        )
    if name == "list_forks":
        return await list_forks(store, args[0])
    if name == "recreate":  # delete and save again: rev must continue past the old one
        await store.delete(args[0])
        return await store.save(make_session(args[0], turns=(make_turn(0),)))
    if name == "generate_ids":
        return (
            validate_id(await store.generate_session_id()) != "",
            validate_id(await store.generate_turn_id()) != "",
        )
    method: Callable[..., Awaitable[Any]] = getattr(store, name)
    return await method(*args)


class _Differential:
    """One store and the memory store, driven by the same operations, compared each step."""

    def __init__(
        self, store: Any, reference: MemoryStore, session_ids: tuple[str, ...], keeps_rev: bool
    ) -> None:
        self.store = store
        self.reference = reference
        self.session_ids = session_ids
        self.keeps_rev = keeps_rev
        self.stamped: set[str] = set()
        self.revs: dict[str, int] = {}

    async def _outcome(self, store: Any, op: tuple[Any, ...]) -> tuple[str, Any]:
        try:
            return "value", await _call(store, op)
        except _Refused:
            return "error", "_Refused"
        except Exception as exc:
            kind = next((k.__name__ for k in _ERROR_KINDS if isinstance(exc, k)), repr(exc))
            return "error", kind

    async def step(self, op: tuple[Any, ...]) -> None:
        caps = store_capabilities(self.store)
        if not all(cap in caps for cap in _NEEDS.get(op[0], ())):
            return
        want = await self._outcome(self.reference, op)
        got = await self._outcome(self.store, op)
        if want[0] == "value":
            self._track(op)
        assert self._normal(op, got) == self._normal(op, want), op
        if want[0] == "value" and op[0] in ("list", "list_meta"):
            await self._check_order(op[1])
        if op[0] == "get_meta" and got[0] == "value" and got[1] is not None:
            self._check_rev(got[1].id, got[1].rev)
        elif op[0] in _WRITES and self.keeps_rev and "get_meta" in caps:
            target = op[1].id if op[0] in ("save", "save_meta") else op[1]
            if target in self.session_ids:
                row = await self.store.get_meta(target)
                if row is not None:
                    self._check_rev(target, row.rev)

    def _track(self, op: tuple[Any, ...]) -> None:
        name = op[0]
        if name in ("save", "save_meta"):
            self.stamped.discard(op[1].id)
        elif name == "fork":
            self.stamped.discard(op[2])
        elif name == "recreate":
            self.stamped.discard(op[1])
        elif name in _STAMPING:
            self.stamped.add(op[1])

    def _check_rev(self, session_id: str, rev: int | None) -> None:
        """``rev`` never goes back for one id, across delete and re-create."""
        if not self.keeps_rev:
            return
        assert rev is not None
        assert rev >= self.revs.get(session_id, rev), (session_id, self.revs, rev)
        self.revs[session_id] = rev

    def _normal(self, op: tuple[Any, ...], outcome: tuple[str, Any]) -> Any:
        """An answer without what legitimately differs between two stores."""
        kind, value = outcome
        if kind == "error":
            return outcome
        name = op[0]
        if name == "search_meta":  # the store's own clock orders stamped sessions
            return sorted(r.id for r in value.rows), value.total, value.total_exact
        if name in ("list", "list_meta"):
            ids = [v if isinstance(v, str) else v.id for v in value]
            rows = sorted(value, key=lambda v: v if isinstance(v, str) else v.id)
            cut = op[1] is not None and op[1].limit is not None
            # Ties and the store's own clock decide which rows a limit keeps.
            return ("cut", len(ids)) if cut else [self._plain(r) for r in rows]
        return self._plain(value)

    def _plain(self, value: Any) -> Any:
        if isinstance(value, Revision):  # rev numbers are each store's own
            return None
        if isinstance(value, SessionData):
            if value.id in self.stamped:
                value = replace(value, updated_at=0)
            return value
        if isinstance(value, SessionMetaRow):
            value = replace(value, rev=None)
            if "upsert_artifact" not in store_capabilities(self.store):
                value = replace(value, artifact_count=None)  # a store keeping no artifacts
            if value.id in self.stamped:
                value = replace(value, updated_at=0)
            return value
        if isinstance(value, SendRequestRecord):
            return replace(value, created_at=0)
        if isinstance(value, SendRequestClaim):
            record = None if value.record is None else replace(value.record, created_at=0)
            return replace(value, record=record)
        if isinstance(value, list):
            return [self._plain(v) for v in value]
        return value

    async def _check_order(self, filter: SessionFilter | None) -> None:
        """Listing order: ``updatedAt`` descending, ties by id ascending, by the store's stamps."""
        ids = await self.store.list(filter)
        stamps = []
        for session_id in ids:
            data = await self.store.load(session_id)
            assert data is not None, session_id
            stamps.append((-data.updated_at, session_id))
        assert stamps == sorted(stamps), stamps
        if "list_meta" in store_capabilities(self.store):
            assert [r.id for r in await self.store.list_meta(filter)] == ids

    async def compare_all(self) -> None:
        """Every read of every session (forks too), schedule and listing agrees."""
        forks = (_FORK_ID,) if len(self.session_ids) > 1 else ()
        for session_id in (*self.session_ids, *forks):
            await self.step(("load", session_id))
            await self.step(("get_turns", session_id, 0, None))
            await self.step(("get_turns", session_id, 1, 2))
            await self.step(("get_meta", session_id))
            for request_id in ("q0", "q1"):
                await self.step(("find_send_request", session_id, request_id))
            await self.step(("list_artifacts", session_id, None))
            await self.step(("list_forks", session_id))
        for filter in (
            None,
            SessionFilter(project_root=None),
            SessionFilter(agent_id="agent-a", project_root="/p"),
            SessionFilter(limit=2),
        ):
            await self.step(("list", filter))
            await self.step(("list_meta", filter))
        await self.step(("list_artifacts", None, None))
        await self.step(("list_schedules",))
        for schedule_id in ("k0", "k1"):
            await self.step(("list_schedule_fires", schedule_id, 5))


async def _rev(store: Any, session_id: str) -> int | None:
    """The session's ``rev`` (``None`` for stores without ``get_meta`` or a counter)."""
    if "get_meta" not in store_capabilities(store):
        return None
    row = await store.get_meta(session_id)
    assert row is not None
    rev: int | None = row.rev
    return rev
