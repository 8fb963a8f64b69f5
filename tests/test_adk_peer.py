"""ZidaneSessionService side by side with ADK's own session services.

Each scenario below covers a behaviour google-adk's own session-service unit
tests check. It runs against ``ZidaneSessionService`` (SQLite and memory
stores) and against ADK's ``InMemorySessionService`` and
``DatabaseSessionService`` (``sqlite+aiosqlite`` in ``tmp_path``), each
writing down what it answered (ids, events, state, exception types). The
zidane answers must equal ADK's. Where ADK's own two services disagree, the
zidane service answers as ``DatabaseSessionService`` does (it is persistent);
the differences that remain are listed, and tested, at the end of this file and
in docs/integrations.md ("Differences from ADK's own services").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="google-adk is not installed (extra `adk`)")
pytest.importorskip("sqlalchemy", reason="sqlalchemy[asyncio] is not installed")
pytest.importorskip("aiosqlite", reason="aiosqlite is not installed")

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import BaseSessionService, InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.adk.sessions.session import Session as AdkSession
from google.genai import types

from zidane_actors.integrations.adk import ZidaneSessionService

Transcript = list[Any]
Scenario = Callable[[BaseSessionService, Transcript], Awaitable[None]]

ZIDANE = ("zidane-sqlite", "zidane-memory")
ADK = ("adk-memory", "adk-database")

T0 = 1_700_000_000.0  # event timestamps the scenarios set (ADK's own tests set theirs too)


def _service(kind: str, tmp_path: Path) -> BaseSessionService:
    if kind == "zidane-sqlite":
        return ZidaneSessionService(store=f"sqlite:{tmp_path / 'zidane.db'}")
    if kind == "zidane-memory":
        return ZidaneSessionService(store="memory:")
    if kind == "adk-memory":
        return InMemorySessionService()
    return DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}")


async def _close(service: BaseSessionService) -> None:
    if isinstance(service, ZidaneSessionService):
        await service.aclose()
    elif isinstance(service, DatabaseSessionService):
        await service.close()


def _answers(scenario: Scenario, tmp_path: Path) -> dict[str, Transcript]:
    """What each of the four services answered to ``scenario``."""

    async def one(kind: str) -> Transcript:
        base = tmp_path / kind
        base.mkdir()
        service = _service(kind, base)
        transcript: Transcript = []
        try:
            await scenario(service, transcript)
        finally:
            await _close(service)
        return transcript

    return {kind: asyncio.run(one(kind)) for kind in ZIDANE + ADK}


def _same_as_adk(scenario: Scenario, tmp_path: Path) -> None:
    answers = _answers(scenario, tmp_path)
    assert answers["adk-memory"] == answers["adk-database"]  # ADK agrees with itself here
    for kind in ZIDANE:
        assert answers[kind] == answers["adk-database"], kind


def _same_as_database(scenario: Scenario, tmp_path: Path) -> dict[str, Transcript]:
    answers = _answers(scenario, tmp_path)
    for kind in ZIDANE:
        assert answers[kind] == answers["adk-database"], kind
    return answers


# -- what a transcript holds ----------------------------------------------------------


def _event(event: Event) -> dict[str, Any]:
    return event.model_dump(mode="json", exclude_none=True)


def _session(session: AdkSession | None) -> Any:
    """A session as data: names, state, events (its generated id and update time aside)."""
    if session is None:
        return None
    return {
        "app": session.app_name,
        "user": session.user_id,
        "state": session.state,
        "events": [_event(e) for e in session.events],
    }


async def _outcome(call: Awaitable[Any]) -> Any:
    """``call``'s answer, or the type of what it raised (ADK's exception types)."""
    try:
        return await call
    except Exception as exc:  # the type is the answer compared
        return f"raised {type(exc).__name__}"


def says(text: str, n: int, *, author: str = "user", **fields: Any) -> Event:
    role = "user" if author == "user" else "model"
    fields.setdefault("timestamp", T0 + n)
    return Event(
        id=f"e{n}",
        invocation_id=f"inv{n}",
        author=author,
        content=types.Content(role=role, parts=[types.Part(text=text)]),
        **fields,
    )


def delta(state: dict[str, Any], n: int, **fields: Any) -> Event:
    return Event(
        id=f"e{n}",
        invocation_id=f"inv{n}",
        author="agent",
        timestamp=T0 + n,
        actions=EventActions(state_delta=state),
        **fields,
    )


# -- create, get, list, delete ---------------------------------------------------------


async def _create_without_and_with_id(service: BaseSessionService, out: Transcript) -> None:
    before = time.time()
    made = await service.create_session(app_name="app", user_id="u", state={"k": 1})
    out.append((bool(made.id), isinstance(made.id, str), _session(made)))
    out.append(before <= made.last_update_time <= time.time())
    got = await service.get_session(app_name="app", user_id="u", session_id=made.id)
    assert got is not None
    out.append((got.id == made.id, _session(got)))
    other = await service.create_session(app_name="app", user_id="u")
    out.append(other.id != made.id)
    named = await service.create_session(app_name="app", user_id="u", session_id="s1")
    out.append((named.id, _session(named)))
    got = await service.get_session(app_name="app", user_id="u", session_id="s1")
    out.append((got.id if got else None, _session(got)))


async def _duplicate_id(service: BaseSessionService, out: Transcript) -> None:
    await service.create_session(app_name="app", user_id="u", session_id="s", state={"a": 1})
    out.append(
        await _outcome(
            service.create_session(app_name="app", user_id="u", session_id="s", state={"a": 2})
        )
    )
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    out.append(_session(got))  # the first session is untouched
    # The same id under another user or app is another session.
    for app, user in (("app", "v"), ("other", "u")):
        made = await service.create_session(app_name=app, user_id=user, session_id="s")
        out.append((made.id, _session(made)))


async def _missing_sessions(service: BaseSessionService, out: Transcript) -> None:
    await service.create_session(app_name="app", user_id="u", session_id="s")
    for app, user, sid in (("app", "u", "nope"), ("app", "v", "s"), ("other", "u", "s")):
        out.append(_session(await service.get_session(app_name=app, user_id=user, session_id=sid)))
    config = GetSessionConfig(num_recent_events=1)
    out.append(
        _session(
            await service.get_session(app_name="app", user_id="u", session_id="x", config=config)
        )
    )


async def _list_by_app_and_user(service: BaseSessionService, out: Transcript) -> None:
    for user, sid in (("u", "a"), ("u", "b"), ("v", "c")):
        session = await service.create_session(
            app_name="app", user_id=user, session_id=sid, state={"who": sid}
        )
        await service.append_event(session, says(f"hi {sid}", 1))
    await service.create_session(app_name="other", user_id="u", session_id="d")
    scopes: list[tuple[str, str | None]] = [
        ("app", "u"),
        ("app", "v"),
        ("app", None),
        ("other", "u"),
        ("none", None),
    ]
    for app, who in scopes:
        listed = await service.list_sessions(app_name=app, user_id=who)
        out.append(
            sorted((s.id, s.user_id, s.app_name, s.state, s.events) for s in listed.sessions)
        )
    out.append((await service.list_sessions(app_name="app", user_id="w")).sessions)


async def _delete(service: BaseSessionService, out: Transcript) -> None:
    for sid in ("a", "b"):
        session = await service.create_session(app_name="app", user_id="u", session_id=sid)
        await service.append_event(session, delta({"user:k": sid, "app:k": sid, "k": sid}, 1))
    await service.delete_session(app_name="app", user_id="u", session_id="a")
    out.append(_session(await service.get_session(app_name="app", user_id="u", session_id="a")))
    listed = await service.list_sessions(app_name="app", user_id="u")
    out.append([(s.id, s.state) for s in listed.sessions])
    # Deleting what is not there is no error.
    out.append(await _outcome(service.delete_session(app_name="app", user_id="u", session_id="a")))
    out.append(await _outcome(service.delete_session(app_name="no", user_id="u", session_id="x")))
    # The id can be created again, fresh; app: and user: state stay.
    again = await service.create_session(app_name="app", user_id="u", session_id="a")
    out.append(_session(again))
    out.append(await service.get_user_state(app_name="app", user_id="u"))


@pytest.mark.parametrize(
    "scenario",
    [_create_without_and_with_id, _duplicate_id, _missing_sessions, _list_by_app_and_user, _delete],
)
def test_create_get_list_delete(scenario: Scenario, tmp_path: Path) -> None:
    _same_as_adk(scenario, tmp_path)


# -- events: GetSessionConfig, ordering, partial events, tools, timestamps -------------------


async def _get_session_config(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    for n in range(1, 6):
        await service.append_event(session, says(f"m{n}", n))
    configs = [
        GetSessionConfig(),
        GetSessionConfig(num_recent_events=0),
        GetSessionConfig(num_recent_events=2),
        GetSessionConfig(num_recent_events=5),
        GetSessionConfig(num_recent_events=9),
        GetSessionConfig(after_timestamp=T0 + 3),  # inclusive
        GetSessionConfig(after_timestamp=T0 + 3.5),
        GetSessionConfig(after_timestamp=T0 + 99),
        GetSessionConfig(after_timestamp=T0 - 99),
        GetSessionConfig(num_recent_events=2, after_timestamp=T0 + 2),
        GetSessionConfig(num_recent_events=4, after_timestamp=T0 + 4),
    ]
    for config in configs:
        got = await service.get_session(app_name="app", user_id="u", session_id="s", config=config)
        assert got is not None
        out.append([e.id for e in got.events])
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    out.append([_event(e) for e in got.events] == [_event(e) for e in session.events])


async def _ordering_and_ids(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    given = [says("one", 1), says("two", 2, author="agent"), Event(author="user", timestamp=T0 + 3)]
    for event in given:
        answer = await service.append_event(session, event)
        out.append((answer is event, answer.id == event.id, bool(answer.id)))
    out.append([e.id for e in session.events] == [e.id for e in given])
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    out.append([e.id for e in got.events] == [e.id for e in given])
    out.append(_session(got) == _session(session))
    out.append(got.events == session.events)


async def _partial_events(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    partial = says("typing", 1, partial=True, actions=EventActions(state_delta={"k": 1}))
    answer = await service.append_event(session, partial)
    out.append((answer is partial, _session(session)))
    await service.append_event(session, says("done", 2))
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    out.append(_session(got))


async def _function_calls(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    call = types.FunctionCall(id="c1", name="weather", args={"city": "Paris", "n": [1, 2.5]})
    reply = types.FunctionResponse(id="c1", name="weather", response={"sky": "sunny"})
    events = [
        says("weather?", 1),
        Event(
            id="e2",
            invocation_id="inv",
            author="agent",
            timestamp=T0 + 2,
            content=types.Content(
                role="model",
                parts=[types.Part(text="let me see"), types.Part(function_call=call)],
            ),
            long_running_tool_ids={"c1"},
        ),
        Event(
            id="e3",
            invocation_id="inv",
            author="agent",
            timestamp=T0 + 3,
            content=types.Content(role="user", parts=[types.Part(function_response=reply)]),
        ),
        says("Sunny.", 4, author="agent"),
    ]
    for event in events:
        await service.append_event(session, event)
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    out.append(_session(got))
    out.append([e.get_function_calls() for e in got.events])
    out.append([e.get_function_responses() for e in got.events])
    out.append(got.events == events)


async def _timestamps(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    created = session.last_update_time
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    out.append(abs(got.last_update_time - created) < 1e-3)
    now = time.time() + 5  # after the creation time, as a live event's is
    await service.append_event(session, says("later", 1, timestamp=now))
    out.append(abs(session.last_update_time - now) < 1e-3)
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    out.append((abs(got.last_update_time - now) < 1e-3, got.events[0].timestamp == now))
    listed = await service.list_sessions(app_name="app", user_id="u")
    out.append([abs(s.last_update_time - now) < 1e-3 for s in listed.sessions])


@pytest.mark.parametrize(
    "scenario",
    [_get_session_config, _ordering_and_ids, _partial_events, _function_calls, _timestamps],
)
def test_events(scenario: Scenario, tmp_path: Path) -> None:
    _same_as_adk(scenario, tmp_path)


# -- state: session, user:, app:, temp: --------------------------------------------------


async def _state_deltas(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(
        app_name="app", user_id="u", session_id="s", state={"k": 0, "user:u0": 0, "app:a0": 0}
    )
    out.append(_session(session))
    event = delta({"k": 1, "new": [1, {"x": None}], "user:u1": 1, "app:a1": 1, "temp:t": 1}, 1)
    answer = await service.append_event(session, event)
    out.append((answer is event, answer.actions.state_delta))  # temp: trimmed from the event
    out.append(session.state)  # the live session holds temp:, as ADK's base service puts it
    await service.append_event(session, delta({"k": 2, "user:u1": 2, "temp:t": 2}, 2))
    out.append(session.state)
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    out.append(_session(got))  # temp: is never stored
    out.append(await service.get_user_state(app_name="app", user_id="u"))
    out.append(await service.get_user_state(app_name="app", user_id="nobody"))


async def _state_across_sessions(service: BaseSessionService, out: Transcript) -> None:
    a = await service.create_session(app_name="app", user_id="u", session_id="a")
    b = await service.create_session(app_name="app", user_id="u", session_id="b")
    c = await service.create_session(app_name="app", user_id="v", session_id="c")
    d = await service.create_session(app_name="other", user_id="u", session_id="d")
    await service.append_event(a, delta({"own": "a", "user:name": "ada", "app:mode": "x"}, 1))
    await service.append_event(c, delta({"own": "c", "user:name": "vic", "app:size": 3}, 2))
    # A state key created with a scope prefix reaches that scope too.
    await service.create_session(
        app_name="app", user_id="u", session_id="e", state={"user:lang": "fr", "app:v": 1}
    )
    for session in (a, b, c, d):
        got = await service.get_session(
            app_name=session.app_name, user_id=session.user_id, session_id=session.id
        )
        out.append(_session(got))
    out.append(_session(b))  # a session object already read does not change by itself
    for app in ("app", "other"):
        listed = await service.list_sessions(app_name=app)
        out.append(sorted((s.id, s.user_id, sorted(s.state.items())) for s in listed.sessions))


async def _removing_and_overwriting_state(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(
        app_name="app", user_id="u", session_id="s", state={"k": {"deep": 1}, "gone": 1}
    )
    await service.append_event(session, delta({"k": {"other": 2}, "gone": None}, 1))
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    out.append(_session(got))
    await service.append_event(session, delta({}, 2))
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    out.append(_session(got))


async def _overwriting_scope_state(service: BaseSessionService, out: Transcript) -> None:
    """A scope key is replaced whole (never merged into), ``None`` is a value, others stay."""
    state = {"app:k": {"deep": 1}, "user:k": [1], "app:kept": 1, "user:kept": 1}
    a = await service.create_session(app_name="app", user_id="u", session_id="a", state=state)
    b = await service.create_session(app_name="app", user_id="u", session_id="b")
    await service.append_event(a, delta({"app:k": {"other": 2}, "user:k": None}, 1))
    await service.append_event(b, delta({"app:k": None, "user:k": {"x": []}, "user:new": ""}, 2))
    for sid in ("a", "b"):
        out.append(_session(await service.get_session(app_name="app", user_id="u", session_id=sid)))
    out.append(await service.get_user_state(app_name="app", user_id="u"))


async def _appending_to_a_missing_session(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await service.delete_session(app_name="app", user_id="u", session_id="s")
    out.append(await _outcome(service.append_event(session, says("hello?", 1))))
    ghost = AdkSession(id="ghost", app_name="app", user_id="u", last_update_time=T0)
    out.append(await _outcome(service.append_event(ghost, says("hello?", 1))))
    out.append(_session(await service.get_session(app_name="app", user_id="u", session_id="s")))


@pytest.mark.parametrize(
    "scenario",
    [
        _state_deltas,
        _state_across_sessions,
        _removing_and_overwriting_state,
        _overwriting_scope_state,
        _appending_to_a_missing_session,
    ],
)
def test_state(scenario: Scenario, tmp_path: Path) -> None:
    _same_as_adk(scenario, tmp_path)


# -- where ADK's two services disagree, and the zidane service's choice ----------------------


def _same_as_in_memory(scenario: Scenario, tmp_path: Path) -> dict[str, Transcript]:
    answers = _answers(scenario, tmp_path)
    for kind in ZIDANE:
        assert answers[kind] == answers["adk-memory"], kind
    return answers


async def _ids_as_given(service: BaseSessionService, out: Transcript) -> None:
    for sid in (" s ", ""):
        made = await _outcome(service.create_session(app_name="app", user_id="u", session_id=sid))
        out.append(made if isinstance(made, str) else made.id == sid)
    for sid in ("s", " s ", ""):
        got = await service.get_session(app_name="app", user_id="u", session_id=sid)
        out.append(got.id if got is not None else None)


def test_session_ids_are_kept_as_given_as_the_database_service_does(tmp_path: Path) -> None:
    """ADK's in-memory service strips an id's spaces and takes ``""`` as "no id"."""
    answers = _same_as_database(_ids_as_given, tmp_path)
    assert answers["adk-database"] == [True, True, None, " s ", ""]
    assert answers["adk-memory"] != answers["adk-database"]


async def _stale_object(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    earlier = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert earlier is not None
    await service.append_event(session, says("a", 1, timestamp=time.time() + 1))
    answer = await _outcome(service.append_event(earlier, says("b", 2, timestamp=time.time() + 2)))
    out.append(answer if isinstance(answer, str) else answer.id)
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    out.append([e.id for e in got.events])


def test_a_stale_session_object_is_refused_as_the_database_service_does(tmp_path: Path) -> None:
    """ADK's in-memory service stores an event appended over an outdated read."""
    answers = _same_as_database(_stale_object, tmp_path)
    assert answers["adk-database"] == ["raised StaleSessionError", ["e1"]]
    assert answers["adk-memory"] == ["e2", ["e1", "e2"]]


async def _event_order(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    for n, at in ((3, 5), (1, 5), (2, 2)):  # timestamps out of order, and a tie
        await service.append_event(session, says("x", n, timestamp=T0 + at))
    configs = [
        None,
        GetSessionConfig(num_recent_events=2),
        GetSessionConfig(after_timestamp=T0 + 3),
    ]
    for config in configs:
        got = await service.get_session(app_name="app", user_id="u", session_id="s", config=config)
        assert got is not None
        out.append([e.id for e in got.events])


def test_events_read_back_in_append_order(tmp_path: Path) -> None:
    """As ADK's in-memory service; its database service orders events by timestamp (a tie
    by descending id). With timestamps out of order, ``after_timestamp`` keeps every event
    at or after it (the in-memory service only the run of them at the end)."""
    answers = _answers(_event_order, tmp_path)
    assert answers["adk-memory"] == [["e3", "e1", "e2"], ["e1", "e2"], []]
    assert answers["adk-database"] == [["e2", "e1", "e3"], ["e1", "e3"], ["e1", "e3"]]
    for kind in ZIDANE:
        assert answers[kind] == [["e3", "e1", "e2"], ["e1", "e2"], ["e3", "e1"]], kind


async def _equal_to_python_only(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    for value in (1, 1.0, True):  # one id, values pydantic's == takes as equal
        event = says("x", 1, actions=EventActions(state_delta={"n": value}))
        answer = await _outcome(service.append_event(session, event))
        out.append(answer if isinstance(answer, str) else answer is event)
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    out.append([repr(e.actions.state_delta["n"]) for e in got.events])


def test_an_event_equal_only_to_python_is_stored_as_given(tmp_path: Path) -> None:
    """ADK's in-memory service takes a ``1.0`` or ``True`` for the stored ``1`` (pydantic's
    ``==``) and keeps the one event; the zidane services store each, read back as given."""
    answers = _answers(_equal_to_python_only, tmp_path)
    assert answers["adk-memory"][-1] == ["1"]
    for kind in ZIDANE:
        assert answers[kind] == [True, True, True, ["1", "1.0", "True"]], kind


async def _same_event_again(service: BaseSessionService, out: Transcript) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    first = says("x", 1, actions=EventActions(state_delta={"n": 1}))
    await service.append_event(session, first)
    for event in (first, says("x", 1, actions=EventActions(state_delta={"n": 1}))):
        answer = await _outcome(service.append_event(session, event))
        out.append(answer if isinstance(answer, str) else answer is event)
    out.append([e.id for e in session.events])
    reread = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert reread is not None
    answer = await _outcome(service.append_event(reread, says("x", 1, actions=first.actions)))
    out.append(answer if isinstance(answer, str) else len(reread.events))
    other = says("y", 1)  # the same id, another event
    answer = await _outcome(service.append_event(reread, other))
    out.append(answer if isinstance(answer, str) else answer is other)
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    out.append(_session(got))


def test_an_event_stored_already_is_not_stored_again(tmp_path: Path) -> None:
    """As ADK's in-memory service; its database service raises SQLAlchemy's IntegrityError
    for any event id the session holds, equal event or not."""
    answers = _same_as_in_memory(_same_event_again, tmp_path)
    assert answers["adk-memory"][:4] == [True, True, ["e1"], 1]
    assert [e["id"] for e in answers["adk-memory"][-1]["events"]] == ["e1", "e1"]
    assert answers["adk-database"][:2] == ["raised IntegrityError"] * 2
