"""ZidaneSessionService: google-adk's Runner over zidane stores, and ADK's session-service rules.

The rule tests run against ADK's own InMemorySessionService and
DatabaseSessionService too, so each rule is checked where ADK defines it.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from odd_values import any_text, any_value

pytest.importorskip("google.adk", reason="google-adk is not installed (extra `adk`)")

from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService, InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session as AdkSession
from google.genai import types

from zidane_actors.actors import Session, SessionHost
from zidane_actors.errors import ActorClosed, ValidationError
from zidane_actors.integrations import _shared
from zidane_actors.integrations._adk_events import _app_scope_id, _user_scope_id
from zidane_actors.integrations.adk import ZidaneSessionService
from zidane_actors.model import SessionData, TextBlock, ToolCallBlock, ToolResultBlock
from zidane_actors.portal import start_host
from zidane_actors.stores import open_sqlite_store
from zidane_actors.wire import drop_invalid_tool_pairings

ServiceFactory = Callable[[], BaseSessionService]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def close(service: BaseSessionService) -> None:
    if isinstance(service, ZidaneSessionService):
        await service.aclose()
    elif hasattr(service, "close"):
        await service.close()


def _database(path: Path) -> BaseSessionService:
    pytest.importorskip("sqlalchemy", reason="sqlalchemy[asyncio] is not installed")
    from google.adk.sessions.database_session_service import DatabaseSessionService

    return DatabaseSessionService(f"sqlite+aiosqlite:///{path}")


KINDS = ["zidane-sqlite", "zidane-memory", "adk-memory", "adk-database"]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(kind: str, tmp_path: Path) -> Iterator[ServiceFactory]:
    """A factory of services of one kind over one database (new instances share it)."""

    def factory() -> BaseSessionService:
        if kind == "zidane-sqlite":
            return ZidaneSessionService(store=f"sqlite:{tmp_path / 'adk.db'}")
        if kind == "zidane-memory":
            return ZidaneSessionService(store="memory:")
        if kind == "adk-memory":
            return InMemorySessionService()
        return _database(tmp_path / "adk-database.db")

    yield factory


def persistent(kind: str) -> bool:
    return kind in ("zidane-sqlite", "zidane-memory", "adk-database")


def user_says(text: str, **fields: Any) -> Event:
    return Event(
        invocation_id="inv",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        **fields,
    )


def with_delta(delta: dict[str, Any], **fields: Any) -> Event:
    return Event(
        invocation_id="inv", author="user", actions=EventActions(state_delta=delta), **fields
    )


def scenario(make: ServiceFactory, body: Callable[[BaseSessionService], Any]) -> Any:
    async def main() -> Any:
        service = make()
        try:
            return await body(service)
        finally:
            await close(service)

    return run(main())


# -- the rules ADK's session services follow ---------------------------------------


def test_a_missing_session_reads_as_none(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        assert await service.get_session(app_name="app", user_id="u", session_id="nope") is None

    scenario(make, body)


def test_create_get_delete_and_create_again(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        before = time.time()
        created = await service.create_session(app_name="app", user_id="u", state={"k": "v"})
        assert created.id and created.app_name == "app" and created.user_id == "u"
        assert created.state == {"k": "v"} and created.events == []
        assert before <= created.last_update_time <= time.time()
        got = await service.get_session(app_name="app", user_id="u", session_id=created.id)
        assert got == created
        await service.delete_session(app_name="app", user_id="u", session_id=created.id)
        assert await service.get_session(app_name="app", user_id="u", session_id=created.id) is None
        again = await service.create_session(app_name="app", user_id="u", session_id=created.id)
        assert again.state == {}
        got = await service.get_session(app_name="app", user_id="u", session_id=created.id)
        assert got is not None and got.events == []
        await service.delete_session(app_name="app", user_id="u", session_id="never-created")

    scenario(make, body)


def test_an_existing_id_cannot_be_created_twice(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        await service.create_session(app_name="app", user_id="u", session_id="s")
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name="app", user_id="u", session_id="s")
        # Another user (or app) may use the same session id.
        await service.create_session(app_name="app", user_id="v", session_id="s")
        await service.create_session(app_name="other", user_id="u", session_id="s")

    scenario(make, body)


def test_list_one_users_sessions_or_every_users(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        for user, sid in [("u1", "a"), ("u1", "b"), ("u2", "c")]:
            await service.create_session(
                app_name="app", user_id=user, session_id=sid, state={"k": f"v-{sid}"}
            )
        await service.create_session(app_name="elsewhere", user_id="u1", session_id="z")
        mine = (await service.list_sessions(app_name="app", user_id="u1")).sessions
        assert sorted(s.id for s in mine) == ["a", "b"]
        everyone = (await service.list_sessions(app_name="app")).sessions
        assert sorted((s.user_id, s.id) for s in everyone) == [
            ("u1", "a"),
            ("u1", "b"),
            ("u2", "c"),
        ]
        assert all(s.state == {"k": f"v-{s.id}"} and s.events == [] for s in everyone)
        updates = [s.last_update_time for s in everyone]
        assert updates == sorted(updates)
        assert (await service.list_sessions(app_name="app", user_id="nobody")).sessions == []
        assert (await service.list_sessions(app_name="no-such-app")).sessions == []

    scenario(make, body)


def test_list_shows_state_and_order_after_appends(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        first = await service.create_session(app_name="app", user_id="u", session_id="first")
        second = await service.create_session(app_name="app", user_id="u", session_id="second")
        await service.append_event(second, with_delta({"k": 2}, timestamp=time.time() + 5))
        await service.append_event(first, with_delta({"k": 1}, timestamp=time.time() + 10))
        await service.append_event(first, user_says("no state here", timestamp=time.time() + 11))
        listed = (await service.list_sessions(app_name="app", user_id="u")).sessions
        assert [(s.id, s.state) for s in listed] == [("second", {"k": 2}), ("first", {"k": 1})]
        assert listed[1].last_update_time == first.last_update_time

    scenario(make, body)


def test_app_state_is_shared_by_every_user_of_the_app(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        s1 = await service.create_session(
            app_name="app", user_id="u1", session_id="s1", state={"app:k1": "v1"}
        )
        await service.append_event(s1, with_delta({"app:k2": "v2"}))
        s2 = await service.create_session(app_name="app", user_id="u2", session_id="s2")
        assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
        got = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert got is not None and got.state == {"app:k1": "v1", "app:k2": "v2"}
        other = await service.create_session(app_name="other", user_id="u1", session_id="s3")
        assert other.state == {}

    scenario(make, body)


def test_user_state_is_shared_only_by_that_users_sessions(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        s1 = await service.create_session(
            app_name="app", user_id="u1", session_id="s1", state={"user:k1": "v1"}
        )
        await service.append_event(s1, with_delta({"user:k2": "v2"}))
        s1b = await service.create_session(app_name="app", user_id="u1", session_id="s1b")
        assert s1b.state == {"user:k1": "v1", "user:k2": "v2"}
        s2 = await service.create_session(app_name="app", user_id="u2", session_id="s2")
        assert s2.state == {}
        if isinstance(service, ZidaneSessionService | InMemorySessionService):
            assert await service.get_user_state(app_name="app", user_id="u1") == {
                "k1": "v1",
                "k2": "v2",
            }
            assert await service.get_user_state(app_name="app", user_id="u2") == {}

    scenario(make, body)


def test_session_state_stays_in_its_session(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        s1 = await service.create_session(
            app_name="app", user_id="u1", session_id="s1", state={"sk1": "v1"}
        )
        await service.append_event(s1, with_delta({"sk2": "v2"}))
        assert s1.state == {"sk1": "v1", "sk2": "v2"}
        got = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert got is not None and got.state == {"sk1": "v1", "sk2": "v2"}
        s1b = await service.create_session(app_name="app", user_id="u1", session_id="s1b")
        assert s1b.state == {}

    scenario(make, body)


def test_temp_state_reaches_the_live_session_but_is_never_stored(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(
            app_name="app", user_id="u", session_id="s", state={"temp:t0": 0}
        )
        assert "temp:t0" not in session.state
        await service.append_event(session, with_delta({"temp:k1": "v1", "sk": "v2"}))
        assert session.state["temp:k1"] == "v1"  # for later agents of this invocation
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None and got.state == {"sk": "v2"}
        assert got.events[0].actions.state_delta == {"sk": "v2"}

    scenario(make, body)


def test_sessions_are_scoped_by_app_and_user(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        s1 = await service.create_session(app_name="app", user_id="u1", session_id="same")
        await service.append_event(s1, user_says("from u1"))
        await service.create_session(app_name="app", user_id="u2", session_id="same")
        got = await service.get_session(app_name="app", user_id="u2", session_id="same")
        assert got is not None and got.user_id == "u2" and got.events == []
        await service.delete_session(app_name="app", user_id="u2", session_id="same")
        got = await service.get_session(app_name="app", user_id="u1", session_id="same")
        assert got is not None and len(got.events) == 1

    scenario(make, body)


def test_bytes_and_rich_fields_read_back_equal(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u")
        picture = types.Content(
            role="user",
            parts=[
                types.Part.from_bytes(data=b"\x00\x01\xfe\xffimage", mime_type="image/png"),
                types.Part(text="what is this?"),
            ],
        )
        grounding = types.GroundingMetadata(
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"\x00blob")
        )
        await service.append_event(
            session,
            Event(invocation_id="i", author="user", content=picture, grounding_metadata=grounding),
        )
        full = Event(
            invocation_id="i",
            author="agent",
            content=types.Content(role="model", parts=[types.Part(text="a picture")]),
            turn_complete=True,
            partial=False,
            actions=EventActions(
                artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True
            ),
            long_running_tool_ids={"tool1", "tool2"},
            error_code="error_code",
            error_message="error_message",
            interrupted=True,
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2
            ),
            citation_metadata=types.CitationMetadata(),
            custom_metadata={"custom_key": ["custom", {"value": 1.5}]},
            input_transcription=types.Transcription(text="in", finished=True),
            output_transcription=types.Transcription(text="out", finished=True),
        )
        await service.append_event(session, full)
        got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
        assert got is not None
        assert got.events[0].content == picture
        assert got.events[0].grounding_metadata == grounding
        assert got == session

    scenario(make, body)


def test_tool_values_of_every_json_kind_read_back_equal(make: ServiceFactory) -> None:
    """A function call's args and its response, held as JSON text in the turn, come back equal."""
    values: dict[str, Any] = {
        "floats": [1.5, -0.0, 1e16, 1.0000000000000002e-300, 123456789.125],
        "ints": [0, -1, 2**63 - 1, 2**70, -(2**64)],
        "text": 'é ✓ 𝄞 \u2028 \x00 \t " \\ /',
        "nested": {"a": [{"b": None, "c": True}, []], "": {}},
    }
    call = types.FunctionCall(id="c1", name="probe", args=values)
    reply = types.FunctionResponse(id="c1", name="probe", response={"result": values})
    odd = types.FunctionResponse(id="c2", name="probe", response={"result": 1, "extra": values})

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u")
        for role, part in (
            ("model", types.Part(function_call=call)),
            ("user", types.Part(function_response=reply)),
            ("user", types.Part(function_response=odd)),
        ):
            content = types.Content(role=role, parts=[part])
            await service.append_event(session, Event(author="agent", content=content))
        got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
        assert got is not None and got == session
        assert got.events[1].content.parts[0].function_response.response == {"result": values}

    scenario(make, body)


def test_last_update_time_follows_the_event(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u")
        later = session.last_update_time + 10
        await service.append_event(session, user_says("hi", timestamp=later))
        assert session.last_update_time == pytest.approx(later, abs=1e-6)
        got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
        assert got is not None and got.last_update_time == pytest.approx(later, abs=1e-6)

    scenario(make, body)


def test_event_limits_and_after_timestamp(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u")
        for i in range(1, 6):
            await service.append_event(session, user_says(f"m{i}", timestamp=float(i)))

        async def stamps(**config: Any) -> list[float]:
            got = await service.get_session(
                app_name="app",
                user_id="u",
                session_id=session.id,
                config=GetSessionConfig(**config) if config else None,
            )
            assert got is not None
            return [e.timestamp for e in got.events]

        assert await stamps() == [1, 2, 3, 4, 5]
        assert await stamps(num_recent_events=3) == [3, 4, 5]
        assert await stamps(num_recent_events=0) == []
        assert await stamps(num_recent_events=50) == [1, 2, 3, 4, 5]
        assert await stamps(after_timestamp=4.0) == [4, 5]
        assert await stamps(after_timestamp=50.0) == []
        assert await stamps(after_timestamp=2.0, num_recent_events=3) == [3, 4, 5]
        assert await stamps(after_timestamp=4.0, num_recent_events=3) == [4, 5]
        with pytest.raises(ValueError):
            GetSessionConfig(num_recent_events=-1)

    scenario(make, body)


def test_partial_events_are_not_stored(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u")
        event = user_says("stream chunk", partial=True)
        assert await service.append_event(session, event) is event
        assert session.events == []
        got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
        assert got is not None and got.events == []

    scenario(make, body)


def test_appending_to_a_deleted_session_fails(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u")
        await service.delete_session(app_name="app", user_id="u", session_id=session.id)
        with pytest.raises(ValueError, match="not found"):
            await service.append_event(session, user_says("anyone?"))

    scenario(make, body)


def test_a_stale_session_cannot_append(make: ServiceFactory, kind: str) -> None:
    if kind == "adk-memory":
        pytest.skip("ADK's in-memory service has no stale check")

    async def body(service: BaseSessionService) -> None:
        now = time.time()
        original = await service.create_session(app_name="app", user_id="u")
        await service.append_event(original, with_delta({"sk1": "v1"}, timestamp=now + 1))
        fresh = await service.get_session(app_name="app", user_id="u", session_id=original.id)
        assert fresh is not None
        await service.append_event(fresh, with_delta({"sk2": "v2"}, timestamp=now + 2))
        with pytest.raises(StaleSessionError):
            await service.append_event(original, with_delta({"sk3": "v3"}, timestamp=now + 3))
        # A session built by hand (no revision marker) is judged by its last event.
        by_hand = AdkSession(
            id=original.id,
            app_name="app",
            user_id="u",
            events=list(original.events),
            last_update_time=original.last_update_time,
        )
        with pytest.raises(StaleSessionError):
            await service.append_event(by_hand, with_delta({"sk3": "v3"}, timestamp=now + 3))
        current = AdkSession(
            id=original.id,
            app_name="app",
            user_id="u",
            events=list(fresh.events),
            last_update_time=fresh.last_update_time,
        )
        await service.append_event(current, with_delta({"sk3": "v3"}, timestamp=now + 3))
        final = await service.get_session(app_name="app", user_id="u", session_id=original.id)
        assert final is not None
        assert final.state == {"sk1": "v1", "sk2": "v2", "sk3": "v3"}
        assert [e.timestamp for e in final.events] == [now + 1, now + 2, now + 3]

    scenario(make, body)


def test_parallel_appends_to_one_session_object_all_land(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u")
        events = [with_delta({f"k{i}": i}, timestamp=time.time() + i) for i in range(8)]
        await asyncio.gather(*(service.append_event(session, e) for e in events))
        got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
        assert got is not None
        assert [e.id for e in got.events] == [e.id for e in session.events]
        assert got.state == {f"k{i}": i for i in range(8)}

    scenario(make, body)


def test_state_over_many_events_reads_the_same_from_get_and_list(make: ServiceFactory) -> None:
    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(
            app_name="app", user_id="u", session_id="long", state={"n": -1, "keep": "me"}
        )
        for i in range(40):
            delta = {"n": i, f"k{i % 7}": [i]} if i % 3 else {}
            await service.append_event(session, with_delta(delta, timestamp=float(i + 1)))
        want = {"n": 38, "keep": "me", **{f"k{i % 7}": [i] for i in range(40) if i % 3}}
        assert session.state == want
        got = await service.get_session(app_name="app", user_id="u", session_id="long")
        assert got is not None and got.state == want and len(got.events) == 40
        (listed,) = (await service.list_sessions(app_name="app", user_id="u")).sessions
        assert listed.state == want and listed.last_update_time == 40.0

    scenario(make, body)


def test_concurrent_user_and_app_deltas_from_many_sessions_all_land(
    make: ServiceFactory, kind: str
) -> None:
    if kind == "adk-database":
        pytest.skip("ADK's database service loses concurrent scope updates on SQLite (no row lock)")

    async def body(service: BaseSessionService) -> None:
        sessions = [
            await service.create_session(app_name="app", user_id="u", session_id=f"s{i}")
            for i in range(12)
        ]
        await asyncio.gather(
            *(
                service.append_event(s, with_delta({f"user:u{i}": i, f"app:a{i}": i, "own": i}))
                for i, s in enumerate(sessions)
            )
        )
        got = await service.get_session(app_name="app", user_id="u", session_id="s3")
        assert got is not None
        assert got.state == {
            "own": 3,
            **{f"user:u{i}": i for i in range(12)},
            **{f"app:a{i}": i for i in range(12)},
        }

    scenario(make, body)


def test_a_new_service_instance_reads_what_an_earlier_one_stored(
    make: ServiceFactory, kind: str
) -> None:
    if kind in ("zidane-memory", "adk-memory"):
        pytest.skip("a memory store ends with its last service")

    async def write(service: BaseSessionService) -> AdkSession:
        session = await service.create_session(
            app_name="app", user_id="u", state={"app:a": 1, "user:b": 2, "c": 3}
        )
        await service.append_event(session, user_says("kept", actions=EventActions()))
        await service.append_event(session, with_delta({"c": 4, "user:b": 5}))
        return session

    written = scenario(make, write)

    async def read(service: BaseSessionService) -> None:
        got = await service.get_session(app_name="app", user_id="u", session_id=written.id)
        assert got == written
        assert got is not None and got.state == {"app:a": 1, "user:b": 5, "c": 4}

    scenario(make, read)


def test_scope_state_stored_whole_reads_back_and_takes_new_keys(tmp_path: Path) -> None:
    """Scope state written whole under ``adkAppState``/``adkUserState`` still reads back;
    a key written later wins over it."""
    path = tmp_path / "adk.db"
    whole = {
        _app_scope_id("app"): {"adkApp": "app", "adkAppState": {"a": 1, "b": {"x": 1}}},
        _user_scope_id("app", "u"): {"adkApp": "app", "adkUser": "u", "adkUserState": {"c": 1}},
    }

    async def write_whole() -> None:
        async with open_sqlite_store(path) as store:
            for zid, metadata in whole.items():
                await store.save(SessionData(id=zid, created_at=1, updated_at=1, metadata=metadata))

    trio.run(write_whole)

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        assert session.state == {"app:a": 1, "app:b": {"x": 1}, "user:c": 1}
        await service.append_event(session, with_delta({"app:b": None, "user:d": [2]}))
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert got.state == {"app:a": 1, "app:b": None, "user:c": 1, "user:d": [2]}
        assert await service.get_user_state(app_name="app", user_id="u") == {"c": 1, "d": [2]}

    scenario(lambda: ZidaneSessionService(store=f"sqlite:{path}"), body)


# -- ADK's Runner over the zidane stores --------------------------------------------


class ScriptedModel(BaseLlm):
    """A model that answers from a script and records what it was sent."""

    model: str = "scripted-1"
    script: list[LlmResponse]
    requests: list[LlmRequest] = pydantic.Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncIterator[LlmResponse]:
        self.requests.append(llm_request)
        yield self.script.pop(0)


def weather(city: str) -> dict[str, str]:
    """The weather in a city."""
    return {"city": city, "sky": "sunny", "celsius": "21"}


def call(name: str, **args: Any) -> LlmResponse:
    return LlmResponse(
        content=types.Content(
            role="model", parts=[types.Part(function_call=types.FunctionCall(name=name, args=args))]
        ),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=120, candidates_token_count=12, total_token_count=132
        ),
        model_version="scripted-1",
    )


def answer(text: str) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def question(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


@pytest.mark.parametrize("store", ["sqlite", "memory"])
def test_runner_with_a_tool_call_over_the_service(store: str, tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'runner.db'}" if store == "sqlite" else "memory:"

    async def main() -> None:
        service = ZidaneSessionService(store=url)
        model = ScriptedModel(
            script=[
                call("weather", city="Paris"),
                answer("It is sunny in Paris, 21 °C."),
                answer("You asked about Paris."),
            ]
        )
        agent = LlmAgent(name="forecaster", model=model, tools=[weather], output_key="last_answer")
        runner = Runner(app_name="weather", agent=agent, session_service=service)
        session = await service.create_session(
            app_name="weather", user_id="ada", state={"user:units": "metric"}
        )
        first = [
            e
            async for e in runner.run_async(
                user_id="ada", session_id=session.id, new_message=question("Weather in Paris?")
            )
        ]
        second = [
            e
            async for e in runner.run_async(
                user_id="ada", session_id=session.id, new_message=question("What did I ask?")
            )
        ]
        # The second run's model call saw the whole first conversation.
        sent = model.requests[-1].contents
        assert [c.role for c in sent] == ["user", "model", "user", "model", "user"]
        assert sent[1].parts is not None and sent[1].parts[0].function_call is not None
        assert sent[2].parts is not None and sent[2].parts[0].function_response is not None

        got = await service.get_session(app_name="weather", user_id="ada", session_id=session.id)
        assert got is not None
        stored = [e for e in got.events if e.author != "user"]
        assert stored == first + second  # every event reads back equal to the one yielded
        assert got.state == {"user:units": "metric", "last_answer": "You asked about Paris."}
        assert [e.author for e in got.events] == ["user", *["forecaster"] * 3, "user", "forecaster"]
        await runner.close()

        # The zidane side: readable turns the session browser shows.
        zid = f"adk:weather:ada:{session.id}"
        stored_session = await service._call(_load, zid)
        turns = stored_session.turns
        assert [t.role for t in turns] == ["user", "assistant"] * 3
        (tool_call,) = turns[1].content
        assert isinstance(tool_call, ToolCallBlock)
        assert (tool_call.name, tool_call.input) == ("weather", {"city": "Paris"})
        (tool_result,) = turns[2].content
        assert isinstance(tool_result, ToolResultBlock) and tool_result.call_id == tool_call.id
        assert '"sky":"sunny"' in str(tool_result.output) and not tool_result.is_error
        assert turns[3].content == (TextBlock(text="It is sunny in Paris, 21 °C."),)
        assert turns[1].usage is not None and turns[1].usage.input == 120
        assert turns[1].usage.model == "scripted-1"
        assert drop_invalid_tool_pairings(turns) is turns
        # Each text, call and response is stored once: in its block, not again in adkEvent.
        for turn in turns:
            parts = turn.metadata["adkEvent"]["content"]["parts"]
            assert parts == [{"zidaneBlock": i} for i in range(len(turn.content))]
        assert stored_session.agent_id == "forecaster"  # its agent (the app name before)
        await service.aclose()

    run(main())
    if store == "sqlite":
        with start_host(url) as host:
            loaded = host.load_session(f"adk:weather:ada:{_only_session(url)}")
            assert loaded is not None and len(loaded.turns) == 6


async def _load(host: Any, zid: str) -> Any:
    return await host.load_session(zid)


def _only_session(url: str) -> str:
    async def main() -> str:
        async with ZidaneSessionService(store=url) as service:
            (session,) = (await service.list_sessions(app_name="weather", user_id="ada")).sessions
            return session.id

    return str(run(main()))


def test_unpaired_tool_blocks_are_stored_as_text_so_no_event_is_healed_away(
    tmp_path: Path,
) -> None:
    url = f"sqlite:{tmp_path / 'pairing.db'}"

    def response(call_id: str) -> Event:
        reply = types.FunctionResponse(id=call_id, name="weather", response={"sky": "grey"})
        return Event(
            invocation_id="i",
            author="agent",
            content=types.Content(role="user", parts=[types.Part(function_response=reply)]),
        )

    def calling(call_id: str) -> Event:
        fc = types.FunctionCall(id=call_id, name="weather", args={"city": "Oslo"})
        return Event(
            invocation_id="i",
            author="agent",
            content=types.Content(role="model", parts=[types.Part(function_call=fc)]),
        )

    async def main() -> AdkSession:
        async with ZidaneSessionService(store=url) as service:
            session = await service.create_session(app_name="app", user_id="u", session_id="s")
            for event in [
                user_says("hi"),
                response("orphan"),  # no call before it
                calling("c1"),
                response("c1"),
                calling("c1"),  # a repeated call id
                response("c1"),
            ]:
                await service.append_event(session, event)
            return session

    written = run(main())
    with start_host(url) as host:
        loaded = host.load_session("adk:app:u:s")
        assert loaded is not None and len(loaded.turns) == 6
        kinds = [type(t.content[0]).__name__ for t in loaded.turns]
        assert kinds == [
            "TextBlock",
            "TextBlock",
            "ToolCallBlock",
            "ToolResultBlock",
            "TextBlock",
            "TextBlock",
        ]
        assert loaded.turns[1].content[0] == TextBlock(text='weather → {"sky":"grey"}')

    async def reread() -> None:
        async with ZidaneSessionService(store=url) as service:
            got = await service.get_session(app_name="app", user_id="u", session_id="s")
            assert got == written

    run(reread())


@pytest.mark.parametrize(
    ("app", "user", "sid"),
    [("a:b", "c", "d"), ("a", "b:c", "d"), ("app", "user", "x/../y"), ("é", "", "..")],
)
def test_any_names_are_kept_apart(app: str, user: str, sid: str) -> None:
    async def main() -> None:
        async with ZidaneSessionService(store="memory:") as service:
            session = await service.create_session(app_name=app, user_id=user, session_id=sid)
            await service.append_event(session, user_says(f"{app}|{user}|{sid}"))
            neighbour = await service.create_session(app_name="a", user_id="b", session_id="c:d")
            got = await service.get_session(app_name=app, user_id=user, session_id=sid)
            assert got == session and got != neighbour
            listed = (await service.list_sessions(app_name=app, user_id=user)).sessions
            assert [s.id for s in listed] == [sid]

    run(main())


def test_state_without_a_json_form_is_refused_with_its_place() -> None:
    async def main() -> None:
        async with ZidaneSessionService(store="memory:") as service:
            with pytest.raises(ValidationError) as caught:
                await service.create_session(app_name="app", user_id="u", state={"f": object()})
            assert caught.value.path == "$.state"

    run(main())


def test_a_single_session_file_store_is_refused_before_anything_opens(tmp_path: Path) -> None:
    # A file: store holds one zidane session: the second ADK session, or any app:/user:
    # state, could never be stored there.
    with pytest.raises(ValidationError, match="file: store holds one zidane session") as caught:
        ZidaneSessionService(store=f"file:{tmp_path / 'one'}")
    assert caught.value.path == "store"
    assert not (tmp_path / "one").exists()


def test_a_closed_service_refuses_calls() -> None:
    async def main() -> None:
        service = ZidaneSessionService(store="memory:")
        await service.aclose()
        await service.aclose()  # idempotent
        held = AdkSession(id="s", app_name="app", user_id="u")
        calls = [
            service.create_session(app_name="app", user_id="u"),
            service.get_session(app_name="app", user_id="u", session_id="s"),
            service.list_sessions(app_name="app"),
            service.delete_session(app_name="app", user_id="u", session_id="s"),
            service.get_user_state(app_name="app", user_id="u"),
            service.append_event(held, Event(author="user")),
            service.append_event(held, Event(author="user", partial=True)),
        ]
        for call in calls:  # a partial event too, though it would not be stored
            with pytest.raises(ActorClosed, match="closed"):
                await call

    run(main())


@pytest.mark.parametrize("last", ["service", "another share"])
def test_a_closed_service_frees_its_host_and_every_session_it_kept(
    tmp_path: Path, last: str
) -> None:
    """A kept handle holds its host: closing must let both go (no growth per service)."""
    url = f"sqlite:{tmp_path / 'adk.db'}"

    async def main() -> tuple[weakref.ref[SessionHost], weakref.ref[Session]]:
        other = _shared.acquire(url)  # another integration's share of the same portal
        service = ZidaneSessionService(store=url)
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        await service.append_event(session, user_says("hello"))
        assert (await service.get_session(app_name="app", user_id="u", session_id="s")) is not None
        host = other.portal.host
        zid = next(s for s in host._sessions.values() if s.metadata.get("adkSessionId") == "s")
        refs = weakref.ref(host), weakref.ref(zid)
        if last == "service":
            _shared.release(other)
            await service.aclose()
        else:
            await service.aclose()
            stopped = _shared.release(other)
            assert stopped is not None
            stopped.result()
            # the next service to keep handles drops the closed host's
            async with ZidaneSessionService(store="memory:") as again:
                await again.create_session(app_name="app", user_id="u")
        return refs

    host, zid = run(main())
    gc.collect()
    assert host() is None
    assert zid() is None


# -- values JSON carries exactly, and those it cannot ------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _called(args: dict[str, Any], name: str = "f") -> Event:
    call = types.FunctionCall(id="c1", name=name, args=args)
    return Event(
        invocation_id="inv",
        author="coder",
        content=types.Content(role="model", parts=[types.Part(function_call=call)]),
    )


NOT_EXACT = {
    "NaN in session state": (with_delta({"k": float("nan")}), "$.actions.stateDelta.k"),
    "infinity in user state": (with_delta({"user:k": float("-inf")}), "$.actions.stateDelta"),
    "NaN timestamp": (user_says("hi", timestamp=float("nan")), "$.timestamp"),
    "infinity in call args": (_called({"x": [1.5, float("inf")]}), "$.content.parts[0]"),
    "a lone surrogate in a key": (_called({"q\udfff": 1}), "$.content.parts[0]"),
    "a lone surrogate in a state key": (with_delta({"app:\ud800": 1}), "$.actions.stateDelta"),
    "args deeper than pydantic dumps": (_called(_nested(400)), "$"),
    "args deeper than a store keeps": (_called(_nested(140)), "$.turns[0]"),
}


@pytest.mark.parametrize("case", list(NOT_EXACT))
def test_an_event_json_would_alter_is_refused_at_its_place_and_nothing_is_stored(
    tmp_path: Path, case: str
) -> None:
    # pydantic's JSON form writes NaN and infinities as null and a key's lone surrogate
    # as U+FFFD: stored, the event would read back altered. Refused before any write.
    event, place = NOT_EXACT[case]

    async def main() -> None:
        async with ZidaneSessionService(store=f"sqlite:{tmp_path / 'adk.db'}") as service:
            state = {"k": 1, "user:k": 2, "app:k": 3}
            session = await service.create_session(app_name="app", user_id="u", state=state)
            with pytest.raises(ValidationError) as caught:
                await service.append_event(session, event)
            assert caught.value.path is not None and caught.value.path.startswith(place)
            assert session.events == []
            got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
            assert got is not None and got.events == [] and got.state == state
            assert await service.get_user_state(app_name="app", user_id="u") == {"k": 2}
            await service.append_event(got, user_says("still writable"))

    run(main())


def test_lone_surrogates_and_nul_characters_read_back_exactly_everywhere(tmp_path: Path) -> None:
    # Python strings, and ADK's database service, keep them; JSON keeps them as escapes.
    odd = "a\x00b\ud800c\udfff"
    state = {"k": odd, "user:k": [odd], "app:k": {"v": odd}}
    events = [
        user_says(odd),
        _called({"query": odd, "list": [odd]}, name="search"),
        Event(
            invocation_id="inv",
            author="coder",
            content=types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            id="c1", name="search", response={"result": odd}
                        )
                    )
                ],
            ),
            actions=EventActions(state_delta={"k2": odd, "user:k2": odd, "app:k2": odd}),
        ),
        Event(
            invocation_id="inv",
            author="coder",
            content=types.Content(role="model", parts=[types.Part(text=odd, thought=True)]),
        ),
    ]

    async def main() -> None:
        async with ZidaneSessionService(store=f"sqlite:{tmp_path / 'adk.db'}") as service:
            session = await service.create_session(app_name="app", user_id="u", state=state)
            assert session.state == state
            for event in events:
                await service.append_event(session, event)
            got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
            assert got is not None and got == session
            assert [e.model_dump() for e in got.events] == [e.model_dump() for e in events]
            want = {**state, "k2": odd, "user:k2": odd, "app:k2": odd}
            assert got.state == want
            (listed,) = (await service.list_sessions(app_name="app", user_id="u")).sessions
            assert listed.state == want
            user = await service.get_user_state(app_name="app", user_id="u")
            assert user == {"k": [odd], "k2": odd}

    run(main())


def test_state_that_cannot_be_stored_creates_no_session() -> None:
    # The session's own state and its app:/user: state are written apart: all are checked
    # before any of them is.
    async def main() -> None:
        async with ZidaneSessionService(store="memory:") as service:
            for state, place in [
                ({"k": 1, "user:k": _nested(140)}, '$.state["user:k"]'),
                ({"app:k": float("nan")}, '$.state["app:k"]'),
            ]:
                with pytest.raises(ValidationError) as caught:
                    await service.create_session(
                        app_name="app", user_id="u", session_id="s", state=state
                    )
                assert caught.value.path is not None and caught.value.path.startswith(place)
                assert (
                    await service.get_session(app_name="app", user_id="u", session_id="s") is None
                )
            assert await service.get_user_state(app_name="app", user_id="u") == {}

    run(main())


@settings(max_examples=60)
@given(key=any_text, value=any_value, depth=st.sampled_from([0, 1, 140]))
@example(key="k\ud800", value=1, depth=0)
@example(key="k", value=[float("nan"), "v\udfff\x00"], depth=0)
@example(key="k", value={"a": float("-inf")}, depth=1)
@example(key="k", value=[], depth=140)
def test_any_value_in_an_event_reads_back_exactly_or_is_refused_with_nothing_written(
    key: str, value: Any, depth: int
) -> None:
    for _ in range(depth):
        value = [value]
    delta = {f"k{key}": value}
    event = _called({key: value, "n": 1})
    event.actions = EventActions(state_delta=delta)

    async def main() -> None:
        async with ZidaneSessionService(store="memory:") as service:
            session = await service.create_session(app_name="app", user_id="u")
            try:
                await service.append_event(session, event)
            except ValidationError:
                stored = await service.get_session(
                    app_name="app", user_id="u", session_id=session.id
                )
                assert stored is not None and stored.events == [] and stored.state == {}
                return
            got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
            assert got is not None and len(got.events) == 1
            assert got.events[0].model_dump() == event.model_dump()
            assert got.state == delta

    run(main())
