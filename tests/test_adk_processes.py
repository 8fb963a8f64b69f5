"""ZidaneSessionService across processes: every process sees the others' events and state.

This process and two worker processes (``tests/_adk_worker.py``), each with
its own ``ZidaneSessionService`` (its own portal, host and store
connection), share one SQLite file, then one fresh PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _pg import fresh_database

pytest.importorskip("google.adk", reason="google-adk is not installed (extra `adk`)")

import msgspec
import trio
from _adk_worker import appends
from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.adk.sessions.session import Session as AdkSession
from google.genai import types

from zidane_actors.integrations.adk import ZidaneSessionService
from zidane_actors.model import SessionTurn, TextBlock
from zidane_actors.stores import open_sqlite_store

HERE = Path(__file__).parent


class Worker:
    """A worker process serving one command at a time (see ``_adk_worker.py``)."""

    def __init__(self, url: str) -> None:
        paths = [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "_adk_worker.py"), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.read() == {"ready": True}

    def read(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"worker exited with {self.process.wait()}"
        return json.loads(line)

    def ask_now(self, **command: Any) -> Any:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self.read()

    async def ask(self, **command: Any) -> Any:
        return await asyncio.to_thread(self.ask_now, **command)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One SQLite file, or one fresh PostgreSQL database dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:{tmp_path_factory.mktemp('adk') / 'shared.db'}"
        return
    with fresh_database("test_adk") as url:
        yield url


@pytest.fixture(scope="module")
def workers(url: str) -> Iterator[tuple[Worker, Worker]]:
    """Two worker processes over ``url`` (each test uses its own app name)."""
    started: list[Worker] = []
    try:
        started.append(Worker(url))
        started.append(Worker(url))
        yield started[0], started[1]
    finally:
        for worker in started:
            worker.close()


def said(text: str) -> Event:
    return Event(
        invocation_id="inv",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
    )


def test_another_process_appends_are_seen_and_make_held_sessions_stale(
    url: str, workers: tuple[Worker, Worker]
) -> None:
    other, _ = workers
    names = {"app_name": "seen", "user_id": "u", "session_id": "s"}

    async def main() -> None:
        async with ZidaneSessionService(store=url) as service:
            created = await service.create_session(**names)
            await service.append_event(created, said("here"))
            held = await service.get_session(**names)
            assert held is not None
            answer = await other.ask(op="appends", app="seen", user="u", sid="s", tag="there", n=1)
            ((theirs, seen),) = answer["done"]
            assert seen == 1 and answer["stale"] == 0  # it read this process's event

            got = await service.get_session(**names)
            assert got is not None
            assert [e.id for e in got.events] == [created.events[0].id, theirs]
            # Both sessions this process held were read before the other process appended.
            for stale in (held, created):
                with pytest.raises(StaleSessionError):
                    await service.append_event(stale, said("late"))
            by_hand = AdkSession(
                id="s",
                app_name="seen",
                user_id="u",
                events=list(held.events),
                last_update_time=held.last_update_time,
            )
            with pytest.raises(StaleSessionError):
                await service.append_event(by_hand, said("late"))
            await service.append_event(got, said("on the fresh read"))
            listed = (await service.list_sessions(app_name="seen", user_id="u")).sessions
            assert listed[0].last_update_time == got.last_update_time
            answer = await other.ask(op="events", **names)
            assert answer["events"] == [e.id for e in got.events]

    asyncio.run(main())


def test_racing_appends_from_three_processes_form_one_chain(
    url: str, workers: tuple[Worker, Worker]
) -> None:
    """Each acknowledged event is stored once, right after the events its writer read."""
    one, two = workers
    where = {"app": "race", "user": "u", "sid": "s"}

    async def main() -> None:
        async with ZidaneSessionService(store=url) as service:
            await service.create_session(app_name="race", user_id="u", session_id="s")
            results = await asyncio.gather(
                appends(service, **where, tag="here", n=12),
                one.ask(op="appends", **where, tag="one", n=12),
                two.ask(op="appends", **where, tag="two", n=12),
            )
            got = await service.get_session(app_name="race", user_id="u", session_id="s")
            assert got is not None
            stored = [e.id for e in got.events]
            acknowledged = [tuple(done) for result in results for done in result["done"]]
            assert sorted(stored) == sorted(event_id for event_id, _ in acknowledged)
            for event_id, seen in acknowledged:
                assert stored.index(event_id) == seen  # appended over what it read, or refused
            texts = {e.content.parts[0].text for e in got.events if e.content and e.content.parts}
            assert texts == {f"{tag}-{i}" for tag in ("here", "one", "two") for i in range(12)}

    asyncio.run(main())


def test_scope_state_written_by_three_processes_keeps_every_key(
    url: str, workers: tuple[Worker, Worker]
) -> None:
    one, two = workers

    async def main() -> None:
        async with ZidaneSessionService(store=url) as service:
            for sid in ("here", "one", "two"):
                await service.create_session(app_name="scopes", user_id="u", session_id=sid)
            await asyncio.gather(
                appends(service, app="scopes", user="u", sid="here", tag="here", n=10, scoped=True),
                *(
                    worker.ask(
                        op="appends", app="scopes", user="u", sid=tag, tag=tag, n=10, scoped=True
                    )
                    for worker, tag in ((one, "one"), (two, "two"))
                ),
            )
            # Every process's keys, and on the keys they all set one writer's last value.
            want = {f"{tag}-{i}": i for tag in ("here", "one", "two") for i in range(10)}
            lasts = [[tag, 9] for tag in ("here", "one", "two")]
            user = await service.get_user_state(app_name="scopes", user_id="u")
            assert user.pop("last") in lasts and user == want
            got = await service.get_session(app_name="scopes", user_id="u", session_id="one")
            assert got is not None
            state = dict(got.state)
            assert state.pop("user:last") in lasts and state.pop("app:last") in lasts
            assert state == {
                **{f"user:{key}": value for key, value in want.items()},
                **{f"app:{key}": value for key, value in want.items()},
            }

    asyncio.run(main())


def test_a_turn_written_past_the_service_makes_the_next_append_stale(tmp_path: Path) -> None:
    """Another writer (a second store object on the file, not the service) gets in between."""
    path = tmp_path / "shared.db"
    zid = "adk:app:u:s"

    async def foreign_append() -> None:
        async with open_sqlite_store(path) as store:
            text = (TextBlock(text="hi"),)
            turn = SessionTurn(id="foreign", role="user", content=text, created_at=1)
            await store.append_turns(zid, [turn])

    async def delete_and_create_again() -> None:
        async with open_sqlite_store(path) as store:
            data = await store.load(zid)
            assert data is not None
            await store.delete(zid)
            await store.save(msgspec.structs.replace(data, created_at=data.created_at + 1))

    async def stored_ids() -> list[str]:
        async with open_sqlite_store(path) as store:
            return [t.id for t in await store.get_turns(zid)]

    async def main() -> None:
        async with ZidaneSessionService(store=f"sqlite:{path}") as service:
            names = {"app_name": "app", "user_id": "u", "session_id": "s"}
            created = await service.create_session(**names)
            await service.append_event(created, said("first"))
            await asyncio.to_thread(trio.run, foreign_append)
            with pytest.raises(StaleSessionError):
                await service.append_event(created, said("over a stale view"))
            assert (await asyncio.to_thread(trio.run, stored_ids))[1:] == ["foreign"]
            fresh = await service.get_session(**names)
            assert fresh is not None and [e.id for e in fresh.events] == [created.events[0].id]
            await service.append_event(fresh, said("second"))

            await asyncio.to_thread(trio.run, delete_and_create_again)
            with pytest.raises(StaleSessionError):
                await service.append_event(fresh, said("into the new session"))
            again = await service.get_session(**names)
            assert again is not None and [e.id for e in again.events] == [
                e.id for e in fresh.events
            ]
            await service.append_event(again, said("third"))
            got = await service.get_session(**names)
            assert got is not None
            assert [
                e.content.parts[0].text for e in got.events if e.content and e.content.parts
            ] == [
                "first",
                "second",
                "third",
            ]

    asyncio.run(main())
