"""``ZidaneConversationStore`` answers as pydantic-ai's ``InMemoryConversationStore``.

Seeded random programs (saves of real agent runs with tool calls, loads with
limits, edited and serialized histories, branches, forks, scopes, titles and
metadata, stale saves, deletes) run on both stores side by side; every answer
(conversations, entries, records, exceptions with their text) must be equal,
entry ids, revisions and times compared by their order of first appearance.
Memory and SQLite always, PostgreSQL when one answers, the REST server for a
few programs.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import io
import itertools
import json
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from _pg import DSN, fresh_database
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.conversation import Conversation, ConversationTypeAdapter
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from test_server_e2e import ServerProcess

from zidane_actors.actors import SessionHost
from zidane_actors.errors import ActorClosed, ValidationError
from zidane_actors.integrations import _pydantic_ai_store, _shared
from zidane_actors.integrations.pydantic_ai import ZidaneConversationStore, turns_to_messages
from zidane_actors.model import SessionData
from zidane_actors.stores import fork_session

SLOTS = ("c0", "c1", "odd id/ü", "f0", "f1")
"""The conversations a program names (the third is no safe session id; forks go to the last two)."""

SCOPES = (None, "alice", "bob")
UNSET = "unset"


def _tested() -> Agent[None, str]:
    agent: Agent[None, str] = Agent(TestModel(), name="tested")

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    return agent


def _scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One tool call, then an answer naming what the tool returned."""
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(p.part_kind == "tool-return" for p in last.parts):
        return ModelResponse(parts=[TextPart(f"done after {len(messages)} messages")])
    return ModelResponse(parts=[ToolCallPart("shout", {"text": "hey"}, tool_call_id="call-1")])


def _function() -> Agent[None, str]:
    agent: Agent[None, str] = Agent(FunctionModel(_scripted), name="scripted")

    @agent.tool_plain
    def shout(text: str) -> str:
        return text.upper()

    return agent


def _approving() -> Agent[None, str | DeferredToolRequests]:
    """A run that pauses on a call needing approval: the record keeps the request."""
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        TestModel(), output_type=[str, DeferredToolRequests], name="approving"
    )

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        return f"deleted {path}"

    return agent


AGENTS: tuple[Agent[None, Any], ...] = (_tested(), _function(), _approving())


# -- answers, with ids in their order of first appearance -------------------------------


class Canon:
    """One store's ids, revisions and times as tokens in order of first appearance."""

    def __init__(self) -> None:
        self.tokens: dict[Any, str] = {}
        self.counts: dict[str, Iterator[int]] = {}

    def __call__(self, value: Any, kind: str = "E") -> str | None:
        """``value``'s token: ``E``, ``R`` or ``T`` (entry, revision, time) and its rank."""
        if value is None:
            return None
        if value not in self.tokens:
            count = self.counts.setdefault(kind, itertools.count())
            self.tokens[value] = f"{kind}{next(count)}"
        return self.tokens[value]

    def real(self, token: str) -> str:
        """The id a token stands for (an unknown one stands for itself)."""
        found = [value for value, tok in self.tokens.items() if tok == token]
        return str(found[0]) if found else token

    def text(self, message: str) -> str:
        for value, token in self.tokens.items():
            if isinstance(value, str):
                message = message.replace(value, token)
        return message


def record_answer(canon: Canon, record: ConversationRecord) -> tuple[Any, ...]:
    return (
        record.conversation_id,
        canon(record.head_id),
        record.usage,
        record.deferred_tool_requests,
        record.scope,
        record.forked_from,
        canon(record.forked_at),
        record.title,
        record.metadata,
        [canon(tip) for tip in record.branches],
        canon(record.revision, "R"),
        canon(record.updated_at, "T"),
        record.format_version,
    )


def conversation_answer(canon: Canon, conversation: Conversation | None) -> Any:
    if conversation is None:
        return None
    return (
        conversation.messages,
        conversation.usage,
        conversation.conversation_id,
        conversation.deferred_tool_requests,
        canon(conversation.revision, "R"),
        conversation.new_message_index,
    )


def records_answer(canon: Canon, records: list[ConversationRecord]) -> list[tuple[Any, ...]]:
    return [record_answer(canon, record) for record in records]


def entries_answer(canon: Canon, entries: list[ConversationEntry] | None) -> Any:
    if entries is None:
        return None
    return [(canon(e.id), canon(e.parent_id), e.message, e.kind) for e in entries]


# -- programs ------------------------------------------------------------------------

slot = st.integers(0, 2)
any_slot = st.integers(0, len(SLOTS) - 1)
hand = st.integers(0, 1)  # two client copies per conversation, so one can go stale
scope = st.sampled_from([*SCOPES, None, None])  # mostly none, so most calls find theirs
limit = st.one_of(st.none(), st.integers(-1, 6))
point = (
    st.one_of(  # (at, from_entry): one of them mostly; from_entry a token seen, or a missing one
        st.tuples(st.integers(0, 6), st.none()),
        st.tuples(st.none(), st.integers(0, 12)),
        st.tuples(st.one_of(st.none(), st.integers(-1, 9)), st.one_of(st.none(), st.just(99))),
    )
)
title = st.sampled_from([UNSET, None, "Trip", "Groceries"])
expected_title = st.sampled_from([UNSET, UNSET, UNSET, None, "Trip"])
metadata = st.sampled_from([UNSET, None, {"model": "test"}, {"tags": ["a", 1, None, 2.5]}])

RUNS = st.one_of(
    st.tuples(st.just("run"), slot, hand, st.integers(0, 2), scope, st.text("ab ", max_size=3)),
    st.tuples(st.just("run"), slot, hand, st.integers(0, 1), st.just(None), st.just("go")),
)
OPS = st.one_of(
    RUNS,
    RUNS,
    st.tuples(st.just("load"), any_slot, hand, limit, scope),
    st.tuples(st.just("entries"), slot, limit, scope),
    st.tuples(st.just("edit"), slot, hand, st.integers(0, 6)),
    st.tuples(st.just("serialized"), slot, hand),
    st.tuples(st.just("branch"), any_slot, hand, point, st.booleans(), scope),
    st.tuples(st.just("branch"), slot, st.just(0), point, st.just(True), st.just(None)),
    st.tuples(st.just("load"), slot, st.just(0), st.just(None), st.just(None)),
    st.tuples(st.just("fork"), any_slot, any_slot, hand, point, scope, scope),
    st.tuples(st.just("fork"), slot, st.integers(3, 4), hand, point, scope, st.just(None)),
    st.tuples(st.just("list"), scope, limit),
    st.tuples(st.just("update"), any_slot, title, metadata, expected_title, scope),
    st.tuples(st.just("delete"), any_slot, scope),
)
OPENING = [
    ("run", 0, 0, 0, None, "go"),
    ("run", 1, 0, 1, "alice", "go"),
    ("run", 2, 0, 0, None, ""),
]
"""Every program starts with three saved conversations (tool calls in each)."""
PROGRAMS = st.builds(
    lambda first, then: [*OPENING, *first, *then],
    st.lists(RUNS, min_size=1, max_size=4),
    st.lists(OPS, min_size=4, max_size=24),
)


Key = tuple[int, int]
"""A handle's slot and copy."""


@dataclasses.dataclass
class Side:
    """One store as a client program drives it."""

    store: ConversationStore
    canon: Canon = dataclasses.field(default_factory=Canon)
    handles: dict[Key, Conversation | None] = dataclasses.field(default_factory=dict)

    def handle(self, key: Key) -> Conversation:
        return self.handles.get(key) or Conversation(conversation_id=SLOTS[key[0]])

    def entry(self, token: int | None) -> str | None:
        return None if token is None else self.canon.real(f"E{token}")

    async def answer(
        self, call: Awaitable[Any], shown: Callable[[Canon, Any], Any], keep: Key | None = None
    ) -> Any:
        """``answer(self, call)``, its value as ``shown`` tells (and kept as the handle at
        ``keep``) where it is one."""
        got = await answer(self, call)
        if got[0] == "ok":
            if keep is not None:
                self.handles[keep] = got[1]
            got = ("ok", shown(self.canon, got[1]))
        return got

    async def save(self, saving: Any, key: Key, held: Conversation, **options: Any) -> Any:
        """What saving ``saving`` (a run's result or a conversation) answers; once saved,
        ``held`` is the handle at ``key``."""
        saved = await answer(self, self.store.save(saving, **options))
        if saved[0] == "ok":
            self.handles[key] = held
            saved = ("ok", entries_answer(self.canon, saved[1]))
        return saved


async def answer(side: Side, call: Awaitable[Any]) -> Any:
    """``await call``'s answer, or its exception as type and text."""
    try:
        return ("ok", await call)
    except Exception as exc:
        return ("error", type(exc).__name__, side.canon.text(str(exc)))


async def run_op(op: tuple[Any, ...], lead: Side, follow: Side) -> None:
    """``op`` on both stores (the lead first); their answers must be equal."""
    kind = op[0]
    answers = []
    if kind == "run":
        _, at, copy_of, agent_at, save_scope, prompt = op
        key = (at, copy_of)
        agent = AGENTS[agent_at]
        before = lead.handle(key)
        runs = [
            await answer(side, agent.run(prompt or "hi", conversation=held))
            for side, held in ((lead, before), (follow, follow.handle(key)))
        ]
        if runs[0][0] == "error" or runs[1][0] == "error":  # a history the agent refuses
            assert runs[0] == runs[1], op
            return
        led, followed = runs[0][1], runs[1][1]
        start = led.conversation.new_message_index
        assert followed.conversation.new_message_index == start
        start = len(before.messages) if start is None else start
        assert followed.conversation.messages[:start] == led.conversation.messages[:start]
        # The same run for both: its new messages (times, ids) are the lead's.
        followed.all_messages()[start:] = copy.deepcopy(led.all_messages()[start:])
        assert followed.conversation.messages == led.conversation.messages
        for side, result in ((lead, led), (follow, followed)):
            saved = await side.save(result, key, result.conversation, scope=save_scope)
            answers.append((saved, conversation_answer(side.canon, result.conversation)))
    elif kind == "edit":
        _, at, copy_of, keep = op
        key = (at, copy_of)
        base = lead.handles.get(key)
        if base is None or follow.handles.get(key) is None:
            return
        prompt = ModelRequest.user_text_prompt(f"edited at {keep}")
        for side in (lead, follow):
            held = side.handle(key)
            edited = Conversation(
                messages=[*held.messages[:keep], copy.deepcopy(prompt)],
                usage=held.usage,
                conversation_id=held.conversation_id,
                revision=held.revision,
            )
            saved = await side.save(edited, key, edited)
            answers.append((saved, conversation_answer(side.canon, edited)))
    elif kind == "serialized":
        _, at, copy_of = op
        key = (at, copy_of)
        for side in (lead, follow):
            held = side.handle(key)
            again = ConversationTypeAdapter.validate_json(ConversationTypeAdapter.dump_json(held))
            answers.append(await side.save(again, key, again))
    elif kind == "load":
        _, at, copy_of, most, where = op
        for side in (lead, follow):
            loading = side.store.load(SLOTS[at], limit=most, scope=where)
            answers.append(await side.answer(loading, conversation_answer, (at, copy_of)))
    elif kind == "entries":
        _, at, most, where = op
        for side in (lead, follow):
            loading = side.store.load_entries(SLOTS[at], limit=most, scope=where)
            answers.append(await side.answer(loading, entries_answer))
    elif kind == "branch":
        _, at, copy_of, (keep, token), stale_free, where = op
        for side in (lead, follow):
            loaded = side.handles.get((at, copy_of))
            revision = loaded.revision if loaded is not None and stale_free else None
            branching = side.store.branch(
                SLOTS[at],
                at=keep,
                from_entry=side.entry(token),
                expected_revision=revision,
                scope=where,
            )
            answers.append(await side.answer(branching, conversation_answer, (at, copy_of)))
    elif kind == "fork":
        _, source, target, copy_of, (keep, token), where, source_scope = op
        for side in (lead, follow):
            forking = side.store.fork(
                SLOTS[source],
                at=keep,
                from_entry=side.entry(token),
                new_conversation_id=SLOTS[target],
                scope=where,
                source_scope=source_scope,
            )
            answers.append(await side.answer(forking, conversation_answer, (target, copy_of)))
    elif kind == "list":
        _, where, most = op
        for side in (lead, follow):
            listing = side.store.list_conversations(scope=where, limit=most)
            answers.append(await side.answer(listing, records_answer))
    elif kind == "update":
        _, at, new_title, new_metadata, expected_title, where = op
        given: dict[str, Any] = {}
        for name, value in (
            ("title", new_title),
            ("metadata", new_metadata),
            ("expected_title", expected_title),
        ):
            if value != UNSET:
                given[name] = copy.deepcopy(value)
        for side in (lead, follow):
            updating = side.store.update(SLOTS[at], scope=where, **given)
            answers.append(await side.answer(updating, record_answer))
    elif kind == "delete":
        _, at, where = op
        for side in (lead, follow):
            answers.append(await answer(side, side.store.delete(SLOTS[at], scope=where)))
    assert answers[0] == answers[1], op
    if (
        answers and currently_in_test_context()
    ):  # what programs reach (--hypothesis-show-statistics)
        outcome = answers[0][0] if kind in ("run", "edit") else answers[0]
        event(f"{kind}: {outcome[0] if outcome[0] == 'ok' else outcome[1]}")
    # Every record, as both stores hold it now.
    listed = [
        [record_answer(side.canon, r) for r in await side.store.list_conversations()]
        for side in (lead, follow)
    ]
    assert listed[0] == listed[1], op


async def run_program(url: str, program: list[tuple[Any, ...]]) -> None:
    async with ZidaneConversationStore(store=url) as store:
        for leftover in await store.list_conversations():  # a shared server or database
            await store.delete(leftover.conversation_id)
        lead, follow = Side(InMemoryConversationStore()), Side(store)
        try:
            for op in program:
                await run_op(op, lead, follow)
        finally:
            for record in await store.list_conversations():
                await store.delete(record.conversation_id)


def check(url: str, program: list[tuple[Any, ...]]) -> None:
    asyncio.run(run_program(url, program))


FAST = settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FAST
@given(PROGRAMS)
def test_memory_store_answers_as_pydantic_ai(program: list[tuple[Any, ...]]) -> None:
    check("memory:", program)


@settings(FAST, max_examples=20)
@given(PROGRAMS)
def test_sqlite_store_answers_as_pydantic_ai(
    tmp_path: Path, program: list[tuple[Any, ...]]
) -> None:
    check(f"sqlite:{tmp_path / 'conversations.db'}", program)


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    try:
        psycopg.connect(DSN, connect_timeout=2).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {DSN}: {exc}")
    with fresh_database("test_pai") as url:
        yield url


@settings(FAST, max_examples=10)
@given(PROGRAMS)
def test_postgres_store_answers_as_pydantic_ai(
    postgres_url: str, program: list[tuple[Any, ...]]
) -> None:
    check(postgres_url, program)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess("memory") as process:
        yield process


@settings(FAST, max_examples=5)
@given(PROGRAMS)
def test_remote_store_answers_as_pydantic_ai(
    server: ServerProcess, program: list[tuple[Any, ...]]
) -> None:
    check(server.url, program)


# -- the zidane side ---------------------------------------------------------------


async def _load(host: SessionHost, session_id: str) -> SessionData | None:
    data: SessionData | None = await cast(Any, host.store).load(session_id)
    return data


async def stored_document(store: ZidaneConversationStore, session_id: str) -> SessionData:
    """The session as the store holds it (what the browser shows), read through the
    store's own portal (a host's session view drops a repeated tool call id)."""
    data = await store._call(_load, session_id)
    assert data is not None
    return data


async def saved_twice(store: ZidaneConversationStore) -> Conversation:
    """Conversation ``trip`` after two runs with tool calls, saved after each; titled."""
    conversation = Conversation(conversation_id="trip")
    for prompt in ("one", "two"):
        result = await AGENTS[0].run(prompt, conversation=conversation)
        await store.save(result)
        conversation = result.conversation
    await store.update("trip", title="Trip")
    loaded = await store.load("trip")
    assert loaded is not None
    return loaded


def test_a_conversation_is_a_readable_zidane_session(tmp_path: Path) -> None:
    """Its messages are the session's turns, its runs the session's runs, its title shown."""
    url = f"sqlite:{tmp_path / 'conversations.db'}"

    async def main() -> None:
        async with ZidaneConversationStore(store=url) as store:
            loaded = await saved_twice(store)
            session = await stored_document(store, "pydantic-ai:trip")
            assert turns_to_messages(session.turns) == loaded.messages
            assert session.metadata["title"] == "Trip"
            responses = [m for m in loaded.messages if isinstance(m, ModelResponse)]
            run_ids = list(dict.fromkeys(m.run_id for m in loaded.messages))
            assert [run.id for run in session.runs] == run_ids
            assert sum(run.tokens_in or 0 for run in session.runs) == sum(
                m.usage.input_tokens for m in responses
            )
            assert all(run.status == "completed" for run in session.runs)

    asyncio.run(main())


def test_forks_outlive_their_source_and_entries_read_from_a_fresh_store(tmp_path: Path) -> None:
    """A branch's left history stays in the session; a fork reads whole after its source
    is deleted; a store object that never saw an entry finds it by id."""
    url = f"sqlite:{tmp_path / 'conversations.db'}"

    async def main() -> None:
        async with ZidaneConversationStore(store=url) as store:
            loaded = await saved_twice(store)
            await store.fork("trip", at=3, new_conversation_id="side")
            branched = await store.branch("trip", at=2, expected_revision=loaded.revision)
            assert branched.messages == loaded.messages[:2]
            session = await stored_document(store, "pydantic-ai:trip")
            assert turns_to_messages(session.turns) == loaded.messages  # nothing dropped
            fork = await stored_document(store, "pydantic-ai:side")
            assert "forkedFrom" in fork.metadata  # the store's fork: the browser links it
            await store.delete("trip")
            side = await store.load("side")
            assert side is not None and side.messages == loaded.messages[:3]
            entries = await store.load_entries("side")
            assert entries is not None
        async with ZidaneConversationStore(store=url) as fresh:
            assert await fresh.read_entry(entries[-1].id) == entries[-1]
            assert await fresh.read_history(entries[-1].id, limit=2) == entries[-2:]
            with pytest.raises(LookupError):
                await fresh.read_entry("no-such-entry")

    asyncio.run(main())


def test_file_stores_are_refused_and_a_closed_store_answers_closed() -> None:
    with pytest.raises(ValidationError) as refused:
        ZidaneConversationStore(store="file:somewhere")
    assert refused.value.path == "store"

    async def main() -> None:
        store = ZidaneConversationStore(store="memory:")
        await store.aclose()
        await store.aclose()  # once is enough; twice is harmless
        with pytest.raises(ActorClosed):
            await store.load("trip")

    asyncio.run(main())


def test_metadata_without_a_json_form_is_refused() -> None:
    async def main() -> None:
        async with ZidaneConversationStore(store="memory:") as store:
            await saved_twice(store)
            with pytest.raises(ValidationError):
                await store.update("trip", metadata={"when": {1, 2}})
            record = await store.read_record("trip")
            assert record is not None and record.metadata is None

    asyncio.run(main())


def test_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/integrations.md's conversation store example, as written, twice."""
    monkeypatch.chdir(tmp_path)
    doc = (Path(__file__).resolve().parent.parent / "docs" / "integrations.md").read_text("utf-8")
    section = doc.split("\n### Conversations: `ZidaneConversationStore`\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            for _ in range(2):
                exec(compile(code, "docs/integrations.md", "exec"), {"__name__": "__main__"})
    finally:
        _shared.close_all()
    assert out.getvalue() == "Booked. Trip to Lyon\n" * 2


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_concurrent_saves_of_one_revision_one_wins(kind: str, tmp_path: Path) -> None:
    """Saves continuing the same revision at once, through two store objects: one is
    stored, every other raises ``ConversationConflict``, and the loser's messages are
    not left in the session."""
    url = "memory:" if kind == "memory" else f"sqlite:{tmp_path / 'conversations.db'}"

    async def main() -> None:
        async with (
            ZidaneConversationStore(store=url) as one,
            ZidaneConversationStore(store=url) as two,
        ):
            await saved_twice(one)
            for round_ in range(4):
                results = []
                for store, prompt in ((one, f"left {round_}"), (two, f"right {round_}")):
                    loaded = await store.load("trip")
                    assert loaded is not None
                    results.append(await AGENTS[round_ % 2].run(prompt, conversation=loaded))
                saves = await asyncio.gather(
                    one.save(results[0]), two.save(results[1]), return_exceptions=True
                )
                lost = [s for s in saves if isinstance(s, BaseException)]
                assert len(lost) == 1 and type(lost[0]).__name__ == "ConversationConflict"
                winner = results[0] if not isinstance(saves[0], BaseException) else results[1]
                loaded = await one.load("trip")
                assert loaded is not None
                assert loaded.messages == winner.conversation.messages
                session = await stored_document(one, "pydantic-ai:trip")
                assert turns_to_messages(session.turns) == loaded.messages  # not the loser's

    asyncio.run(main())


@pytest.mark.parametrize("tail", [1, 3, 64])
def test_limited_loads_read_the_session_end(tail: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load with a limit reads the session's last turns, further back while the history
    reaches there (a window may begin inside a message's turns): the same messages as the
    in-memory store's, after branches and a system prompt (a message of two turns)."""
    monkeypatch.setattr(_pydantic_ai_store, "TAIL", tail)
    agent: Agent[None, str] = Agent(TestModel(), system_prompt="Be brief.")

    async def main() -> None:
        async with ZidaneConversationStore(store="memory:") as store:
            sides = [Side(InMemoryConversationStore()), Side(store)]
            for round_ in range(6):
                await run_op(("run", 0, 0, 0, None, f"p{round_}"), *sides)
                if round_ % 2:
                    await run_op(("branch", 0, 0, (round_, None), True, None), *sides)
            await run_op(("run", 1, 0, 0, None, "other"), *sides)
            for side in sides:
                side.handles[(1, 0)] = await side.store.load("c1")
            first = await agent.run("hello", conversation=Conversation(conversation_id=SLOTS[2]))
            for side in sides:
                await side.store.save(copy.deepcopy(first.conversation))
            for at in range(3):
                for most in range(0, 24, 3):
                    await run_op(("load", at, 1, most, None), *sides)
                    await run_op(("entries", at, most, None), *sides)

    asyncio.run(main())


RACER = """
import asyncio, json, sys
from pydantic_ai import Agent
from pydantic_ai.conversation_store import ConversationConflict
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import UsageLimits
from zidane_actors.integrations.pydantic_ai import ZidaneConversationStore

async def main(url, name, rounds):
    agent = Agent(TestModel(call_tools=[]))
    won = []
    async with ZidaneConversationStore(store=url) as store:
        for i in range(rounds):
            loaded = await store.load("race")
            prompt = f"{name} {i}"
            result = await agent.run(
                prompt, conversation=loaded, usage_limits=UsageLimits(request_limit=None)
            )
            try:
                await store.save(result)
            except ConversationConflict:
                continue
            won.append(prompt)
    print(json.dumps(won))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def test_saves_from_racing_processes_keep_one_history(tmp_path: Path) -> None:
    """Processes saving one conversation at once: every save that returned is in the
    history, in the order they were stored, and no refused save left messages behind."""
    url = f"sqlite:{tmp_path / 'conversations.db'}"

    async def first() -> None:
        async with ZidaneConversationStore(store=url) as store:
            await store.save(
                await AGENTS[0].run("start", conversation=Conversation(conversation_id="race"))
            )

    asyncio.run(first())
    _shared.close_all()
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, url, name, "8"], stdout=subprocess.PIPE, text=True
        )
        for name in ("left", "right", "middle")
    ]
    won = {p for racer in racers for p in json.loads(racer.communicate(timeout=120)[0])}
    assert all(racer.returncode == 0 for racer in racers)
    assert won  # how many of the 24 lost depends on the timing

    async def check_history() -> None:
        async with ZidaneConversationStore(store=url) as store:
            loaded = await store.load("race")
            assert loaded is not None
            prompts = [
                part.content
                for message in loaded.messages
                if isinstance(message, ModelRequest)
                for part in message.parts
                if part.part_kind == "user-prompt"
            ]
            assert prompts[0] == "start" and set(prompts[1:]) == won
            assert len(prompts) == len(won) + 1
            session = await stored_document(store, "pydantic-ai:race")
            assert turns_to_messages(session.turns) == loaded.messages

    asyncio.run(check_history())


async def _fork_only(host: SessionHost, source: str, new: str) -> None:
    await fork_session(host.store, source, new, at=None, created_at=0)


def test_a_fork_without_its_record_is_no_conversation() -> None:
    """A fork whose maker stopped before writing its record holds its source's: it is
    neither listed nor loaded, and its id is not taken over (deleting it frees it)."""

    async def main() -> None:
        async with ZidaneConversationStore(store="memory:") as store:
            await saved_twice(store)
            await store._call(_fork_only, "pydantic-ai:trip", "pydantic-ai:half")
            listed = [record.conversation_id for record in await store.list_conversations()]
            assert listed == ["trip"]
            assert await store.load("half") is None
            with pytest.raises(ConversationConflict):
                await store.fork("trip", new_conversation_id="half")

    asyncio.run(main())


def test_the_browser_shows_a_conversation(tmp_path: Path) -> None:
    """The session browser's pages of a stored conversation: its title in the list, its
    prompts and answers on its page."""
    url = f"sqlite:{tmp_path / 'conversations.db'}"

    async def store_one() -> None:
        async with ZidaneConversationStore(store=url) as store:
            await saved_twice(store)

    asyncio.run(store_one())
    _shared.close_all()
    with ServerProcess(url) as server:
        listing = urllib.request.urlopen(f"{server.url}/ui/fragments/sessions", timeout=30)
        assert "Trip" in listing.read().decode()
        page = urllib.request.urlopen(
            f"{server.url}/ui/fragments/sessions/pydantic-ai:trip", timeout=30
        )
        text = page.read().decode()
        assert page.status == 200
        for shown in ('class="prompt">one<', 'class="prompt">two<', 'data-call-id="pyd_ai_tool'):
            assert shown in text  # its runs' prompts, the tool call
