"""``Runner.rewind_async`` and events compaction over ``ZidaneSessionService``, side by side.

Each program runs a real ``Runner`` over a scripted model, once over
``ZidaneSessionService`` (SQLite, memory and PostgreSQL stores) and once over ADK's own
``DatabaseSessionService`` (``sqlite+aiosqlite`` in ``tmp_path``), with ADK's
id and clock providers seeded so both runs make the same ids and timestamps.
Everything each service answers afterwards (the events whole, the merged
state, the ``user:`` state, the listing, what the model was sent) must be
equal, and so must what a new service instance reads back from the store.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _pg import fresh_database

pytest.importorskip("google.adk", reason="google-adk is not installed (extra `adk`)")
pytest.importorskip("sqlalchemy", reason="sqlalchemy[asyncio] is not installed")
pytest.importorskip("aiosqlite", reason="aiosqlite is not installed")

from google.adk.agents import LlmAgent
from google.adk.apps.app import App, EventsCompactionConfig
from google.adk.apps.llm_event_summarizer import LlmEventSummarizer
from google.adk.artifacts import InMemoryArtifactService
from google.adk.errors._invocation_not_found_error import InvocationNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions, EventCompaction
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.platform import time as platform_time
from google.adk.platform import uuid as platform_uuid
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.adk.tools import ToolContext
from google.genai import types
from test_adk import ScriptedModel

from zidane_actors.integrations.adk import ZidaneSessionService
from zidane_actors.model import TextBlock
from zidane_actors.portal import start_host

KINDS = ("zidane-sqlite", "zidane-memory", "zidane-postgres", "adk-database")
T0 = 1_700_000_000.0
APP, USER, SID = "notes", "ada", "s1"

Program = Callable[["Harness"], Awaitable[None]]


def usage(prompt: int) -> types.GenerateContentResponseUsageMetadata:
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=prompt, candidates_token_count=7, total_token_count=prompt + 7
    )


def call(name: str, **args: Any) -> LlmResponse:
    part = types.Part(function_call=types.FunctionCall(name=name, args=args))
    return LlmResponse(
        content=types.Content(role="model", parts=[part]),
        usage_metadata=usage(90),
        model_version="scripted-1",
    )


def answer(text: str) -> LlmResponse:
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=text)]),
        usage_metadata=usage(110),
        model_version="scripted-1",
    )


async def note(topic: str, tool_context: ToolContext) -> dict[str, str]:
    """Note a topic in every state scope (the session's, the user's, the app's) and as an
    artifact (a new version each time)."""
    tool_context.state["topic"] = topic
    tool_context.state[f"seen_{topic}"] = True
    tool_context.state["user:last_topic"] = topic
    tool_context.state["app:notes"] = tool_context.state.get("app:notes", 0) + 1
    tool_context.state["temp:scratch"] = topic
    await tool_context.save_artifact("topic.txt", types.Part(text=topic))
    return {"noted": topic}


def question(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def _service(kind: str, base: Path, postgres: str) -> BaseSessionService:
    if kind == "zidane-sqlite":
        return ZidaneSessionService(store=f"sqlite:{base / 'zidane.db'}")
    if kind == "zidane-postgres":
        return ZidaneSessionService(store=postgres)
    if kind == "zidane-memory":
        return ZidaneSessionService(store="memory:")
    return DatabaseSessionService(f"sqlite+aiosqlite:///{base / 'adk.db'}")


async def _close(service: BaseSessionService) -> None:
    if isinstance(service, ZidaneSessionService):
        await service.aclose()
    elif isinstance(service, DatabaseSessionService):
        await service.close()


def _event(event: Event) -> dict[str, Any]:
    return event.model_dump(mode="json", exclude_none=True, by_alias=True)


class Harness:
    """One service, a runner over it, and the answers written down as data."""

    def __init__(self, service: BaseSessionService, script: list[LlmResponse]) -> None:
        self.service = service
        self.model = ScriptedModel(script=script)
        self.summarizer = ScriptedModel(script=[])
        self.answers: list[Any] = []
        self.invocations: list[str] = []
        self.config: EventsCompactionConfig | None = None
        self.artifacts = InMemoryArtifactService()

    def runner(self) -> Runner:
        agent = LlmAgent(name="noter", model=self.model, tools=[note], output_key="last_answer")
        app = App(name=APP, root_agent=agent, events_compaction_config=self.config)
        return Runner(app=app, session_service=self.service, artifact_service=self.artifacts)

    async def ask(self, text: str) -> None:
        """One invocation; its yielded events are written down and its id kept."""
        runner = self.runner()
        yielded = [
            e
            async for e in runner.run_async(
                user_id=USER, session_id=SID, new_message=question(text)
            )
        ]
        await runner.close()
        self.invocations.append(yielded[0].invocation_id)
        self.answers.append(("yielded", [_event(e) for e in yielded]))

    async def rewind(self, invocation: str) -> None:
        runner = self.runner()
        await runner.rewind_async(
            user_id=USER, session_id=SID, rewind_before_invocation_id=invocation
        )
        await runner.close()

    async def look(self) -> None:
        """Write down the session whole, the user's state and the app's listing."""
        session = await self.service.get_session(app_name=APP, user_id=USER, session_id=SID)
        assert session is not None
        self.answers.append(("events", [_event(e) for e in session.events]))
        self.answers.append(("state", session.state))
        user = await self.service.get_user_state(app_name=APP, user_id=USER)
        self.answers.append(("user", user))
        listed = await self.service.list_sessions(app_name=APP, user_id=USER)
        self.answers.append(("listed", [(s.id, s.state) for s in listed.sessions]))


def _contents(request: LlmRequest) -> list[Any]:
    return [c.model_dump(mode="json", exclude_none=True) for c in request.contents]


def _answers(program: Program, script: Callable[[], list[LlmResponse]], tmp_path: Path) -> Any:
    """What each service answered to ``program``, and what a new instance reads back."""

    async def one(kind: str, postgres: str) -> list[Any]:
        base = tmp_path / kind
        base.mkdir()
        service = _service(kind, base, postgres)
        ids = itertools.count()
        ticks = itertools.count()
        try:
            await service.create_session(
                app_name=APP,
                user_id=USER,
                session_id=SID,
                state={"topic": "none", "user:name": "Ada", "app:notes": 0},
            )
            # Seeded after the create (DatabaseSessionService reads the clock there).
            platform_uuid.set_id_provider(lambda: f"id-{next(ids)}")
            platform_time.set_time_provider(lambda: T0 + next(ticks) / 4)
            harness = Harness(service, script())
            await program(harness)
            for name, model in (("sent", harness.model), ("summarized", harness.summarizer)):
                harness.answers.append((name, [_contents(r) for r in model.requests]))
            await harness.look()
            answers = harness.answers
        finally:
            platform_uuid.reset_id_provider()
            platform_time.reset_time_provider()
            await _close(service)
        if kind != "zidane-memory":  # the store alone, through a new service instance
            again = _service(kind, base, postgres)
            try:
                reread = Harness(again, [])
                await reread.look()
                answers.append(("reread", reread.answers))
            finally:
                await _close(again)
        return answers

    with fresh_database("test_adk_rewind") as postgres:
        return {kind: asyncio.run(one(kind, postgres)) for kind in KINDS}


def _same_as_database(
    program: Program, script: Callable[[], list[LlmResponse]], tmp_path: Path
) -> list[Any]:
    answers = _answers(program, script, tmp_path)
    peer = answers["adk-database"]
    assert answers["zidane-sqlite"] == peer
    assert answers["zidane-postgres"] == peer
    assert answers["zidane-memory"] == peer[:-1]  # no store left to read back
    # What the store kept reads back, through a new instance, as the last look saw it.
    assert peer[-1] == ("reread", peer[-5:-1])
    return peer


def _events(answers: list[Any]) -> list[dict[str, Any]]:
    return next(a[1] for a in reversed(answers) if a[0] == "events")


# -- rewind -----------------------------------------------------------------------------


def _three_then_rewind_script() -> list[LlmResponse]:
    return [
        call("note", topic="paris"),
        answer("Noted Paris."),
        call("note", topic="rome"),
        answer("Noted Rome."),
        answer("You asked about Rome."),
        call("note", topic="oslo"),
        answer("Noted Oslo."),
    ]


async def _three_then_rewind(h: Harness) -> None:
    await h.ask("Note Paris.")
    await h.ask("Note Rome.")
    await h.ask("What did I ask?")
    await h.look()
    await h.rewind(h.invocations[1])  # back to before "Note Rome."
    await h.look()
    await h.ask("Note Oslo.")  # continues from the rewound history


def test_rewind_gives_the_database_services_events_and_state(tmp_path: Path) -> None:
    answers = _same_as_database(_three_then_rewind, _three_then_rewind_script, tmp_path)
    events = _events(answers)
    rewinds = [e for e in events if e.get("actions", {}).get("rewindBeforeInvocationId")]
    assert len(rewinds) == 1 and rewinds[0]["author"] == "user"
    # The rewind event's delta undoes the session keys "Note Rome." and later set (a
    # key added after the rewind point is set to None, as ADK writes it) and leaves
    # the user: and app: scopes alone.
    delta = rewinds[0]["actions"]["stateDelta"]
    assert delta == {"topic": "paris", "seen_rome": None, "last_answer": "Noted Paris."}
    # The artifact "Note Rome." saved (version 1) is rewound: version 0 saved again as 2.
    assert rewinds[0]["actions"]["artifactDelta"] == {"topic.txt": 2}
    state = next(a[1] for a in reversed(answers) if a[0] == "state")
    assert state["topic"] == "oslo" and state["seen_rome"] is None
    assert state["user:last_topic"] == "oslo" and state["app:notes"] == 3
    # After the rewind the model saw only what came before "Note Rome.", then the new question.
    sent = next(a[1] for a in answers if a[0] == "sent")
    last = [part.get("text") for c in sent[-2] for part in c["parts"]]
    assert "Note Paris." in last and "Note Oslo." in last
    assert "Note Rome." not in last and "What did I ask?" not in last


def _rewind_twice_script() -> list[LlmResponse]:
    return [
        answer("One."),
        answer("Two."),
        answer("Two again."),
        answer("Three."),
        answer("Fresh start."),
    ]


async def _rewind_twice(h: Harness) -> None:
    await h.ask("First.")
    await h.ask("Second.")
    await h.rewind(h.invocations[1])
    await h.ask("Second, again.")
    await h.ask("Third.")
    await h.rewind(h.invocations[0])  # past the first rewind: to the very start
    await h.look()
    await h.ask("Begin anew.")


def test_rewinds_over_rewinds_to_the_start(tmp_path: Path) -> None:
    answers = _same_as_database(_rewind_twice, _rewind_twice_script, tmp_path)
    state = next(a[1] for a in answers if a[0] == "state")
    # ADK replays deltas only: a key the session was created with is not in any
    # event's delta, so a rewind to the start sets it to None too.
    assert state["last_answer"] is None and state["topic"] is None
    sent = next(a[1] for a in answers if a[0] == "sent")
    assert [c["role"] for c in sent[-1]] == ["user"]  # nothing before "Begin anew." is live


def test_rewind_to_an_unknown_invocation_raises_and_writes_nothing(tmp_path: Path) -> None:
    async def program(h: Harness) -> None:
        await h.ask("First.")
        try:
            await h.rewind("no-such-invocation")
        except InvocationNotFoundError as exc:
            h.answers.append(("raised", type(exc).__name__))

    answers = _same_as_database(program, lambda: [answer("One.")], tmp_path)
    assert ("raised", "InvocationNotFoundError") in answers
    assert len(_events(answers)) == 2


# -- events compaction ------------------------------------------------------------------


def _compacting_script() -> list[LlmResponse]:
    return [
        call("note", topic="paris"),
        answer("Noted Paris."),
        answer("Two."),
        answer("Three."),
        answer("Four."),
        answer("After the rewind."),
    ]


def _summary(text: str) -> LlmResponse:
    thought = types.Part(text="what mattered", thought=True)
    content = types.Content(role="model", parts=[thought, types.Part(text=text)])
    return LlmResponse(content=content, usage_metadata=usage(300))


async def _compacting(h: Harness) -> None:
    h.summarizer.script = [
        _summary("Ada noted Paris; then 2."),
        _summary("Up to 4 — résumé ✓."),
        _summary("After the rewind."),
    ]
    h.config = EventsCompactionConfig(
        summarizer=LlmEventSummarizer(llm=h.summarizer), compaction_interval=2, overlap_size=1
    )
    for text in ("Note Paris.", "Two?", "Three?", "Four?"):
        await h.ask(text)
    await h.look()
    await h.rewind(h.invocations[3])
    await h.ask("Go on.")


def test_runner_compaction_events_are_kept_exactly(tmp_path: Path) -> None:
    answers = _same_as_database(_compacting, _compacting_script, tmp_path)
    events = _events(answers)
    compactions = [e["actions"]["compaction"] for e in events if "compaction" in e["actions"]]
    # Interval 2, overlap 1: after invocations 2 and 4, then (the rewind dropped
    # invocation 4 and its compaction) after invocations 3 and 5.
    assert len(compactions) == 3
    parts = compactions[1]["compactedContent"]["parts"]
    assert parts == [{"text": "what mattered", "thought": True}, {"text": "Up to 4 — résumé ✓."}]
    assert compactions[0]["startTimestamp"] < compactions[1]["startTimestamp"]
    assert compactions[1]["startTimestamp"] == compactions[2]["startTimestamp"]
    # The last prompt starts from the first summary: the second was rewound away.
    sent = next(a[1] for a in answers if a[0] == "sent")
    assert "Ada noted Paris" in str(sent[-1]) and "Up to 4" not in str(sent[-1])
    summarized = next(a[1] for a in answers if a[0] == "summarized")
    assert len(summarized) == 3
    # The zidane side: each rewind and compaction is a command turn saying so, of no run
    # (not an invocation that never ended); every invocation's run completed.
    with start_host(f"sqlite:{tmp_path / 'zidane-sqlite' / 'zidane.db'}") as host:
        stored = host.load_session(f"adk:{APP}:{USER}:{SID}")
        assert stored is not None
    control = [t for t in stored.turns if t.role == "command"]
    said = [b.text for t in control for b in t.content if isinstance(b, TextBlock)]
    assert [text.split(" compacted: ")[-1] for text in said] == [
        "Ada noted Paris; then 2.",
        "Up to 4 — résumé ✓.",
        f"Rewound to before invocation {_invocations(answers)[3]}.",
        "After the rewind.",
    ]
    assert all(t.run_id is None for t in control)
    assert [(r.prompt, r.status) for r in stored.runs] == [
        (text, "completed") for text in ("Note Paris.", "Two?", "Three?", "Four?", "Go on.")
    ]


def _invocations(answers: list[Any]) -> list[str]:
    """The invocation ids of the events each ``ask`` yielded, in order."""
    return [a[1][0]["invocationId"] for a in answers if a[0] == "yielded"]


def _compaction_event(n: int, start: float, end: float) -> Event:
    summary = types.Content(
        role="model",
        parts=[
            types.Part(text=f"Summary {n}: naïve café, 𝄞, \u2028 and 0.1 + 0.2."),
            types.Part(function_call=types.FunctionCall(id=f"c{n}", name="note", args={"x": 1.5})),
            types.Part(
                function_response=types.FunctionResponse(
                    id=f"c{n}", name="note", response={"ok": [1, None, {"deep": "yes"}]}
                )
            ),
        ],
    )
    return Event(
        id=f"compaction-{n}",
        invocation_id=f"compaction-inv-{n}",
        author="user",
        timestamp=end + 0.5,
        actions=EventActions(
            compaction=EventCompaction(
                start_timestamp=start, end_timestamp=end, compacted_content=summary
            ),
            state_delta={"compacted": n},
        ),
        usage_metadata=usage(512),
    )


def test_appended_compaction_events_read_back_exactly(tmp_path: Path) -> None:
    appended: list[Event] = []

    async def program(h: Harness) -> None:
        await h.ask("First.")
        await h.ask("Second.")
        session = await h.service.get_session(app_name=APP, user_id=USER, session_id=SID)
        assert session is not None
        first, last = session.events[0].timestamp, session.events[-1].timestamp
        event = _compaction_event(1, first, last)
        appended.append(event.model_copy(deep=True))
        await h.service.append_event(session, event)
        await h.ask("Third.")  # the model is sent the summary in place of the first two

    answers = _same_as_database(
        program, lambda: [answer("One."), answer("Two."), answer("Three.")], tmp_path
    )
    stored = [e for e in _events(answers) if "compaction" in e["actions"]]
    assert stored == [_event(appended[0])]
    sent = next(a[1] for a in answers if a[0] == "sent")
    assert "Summary 1" in str(sent[-1]) and "First." not in str(sent[-1])


# -- seeded programs --------------------------------------------------------------------------


def _seeded(seed: int) -> tuple[Program, Callable[[], list[LlmResponse]]]:
    """A seeded program of invocations (some calling the tool), rewinds to any earlier
    invocation, looks and, for some seeds, sliding-window compaction; and its model script."""
    rng = random.Random(seed)
    steps: list[tuple[str, Any]] = []
    script: list[LlmResponse] = []
    asked = 0
    for n in range(rng.randint(4, 7)):
        if asked and rng.random() < 0.3:
            steps.append(("rewind", rng.randrange(asked)))
        else:
            if rng.random() < 0.5:
                script.append(call("note", topic=rng.choice(["paris", "rome", "oslo", "lima"])))
            script.append(answer(f"Answer {n}."))
            steps.append(("ask", f"Question {n}?"))
            asked += 1
        if rng.random() < 0.3:
            steps.append(("look", None))
    overlap = rng.choice([None, 0, 1])  # None: no compaction

    async def program(h: Harness) -> None:
        if overlap is not None:
            h.summarizer.script = [_summary(f"Summary {k}.") for k in range(10)]
            h.config = EventsCompactionConfig(
                summarizer=LlmEventSummarizer(llm=h.summarizer),
                compaction_interval=2,
                overlap_size=overlap,
            )
        for kind, arg in steps:
            if kind == "ask":
                await h.ask(arg)
            elif kind == "rewind":
                await h.rewind(h.invocations[arg])
            else:
                await h.look()

    # Fresh copies for each service: ADK writes the function call ids into the response.
    return program, lambda: [response.model_copy(deep=True) for response in script]


@pytest.mark.parametrize("seed", range(6))
def test_seeded_programs_of_invocations_and_rewinds(seed: int, tmp_path: Path) -> None:
    program, script = _seeded(seed)
    answers = _same_as_database(program, script, tmp_path)
    assert any(a[0] == "yielded" for a in answers)
