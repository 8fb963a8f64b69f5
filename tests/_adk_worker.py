"""A process with its own ``ZidaneSessionService``, taking commands from its parent.

Usage: ``python tests/_adk_worker.py URL``. Each stdin line is a JSON command,
each answer one JSON line on stdout: ``{"op": "appends", ...}`` runs
:func:`appends` and answers its result; ``{"op": "events", ...}`` answers
the ids of a session's events as read; end of input ends the process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types

from zidane_actors.integrations.adk import ZidaneSessionService


async def appends(
    service: ZidaneSessionService,
    *,
    app: str,
    user: str,
    sid: str,
    tag: str,
    n: int,
    scoped: bool = False,
) -> dict[str, Any]:
    """``n`` events appended to one session, each on a fresh read, again when stale.

    Answers each acknowledged event's id with the number of events its
    writer read before appending it, and how many appends were refused as
    stale. With ``scoped`` each event also sets ``user:TAG-I`` and ``app:TAG-I``,
    and ``user:last`` and ``app:last`` (keys every writer sets) to ``[TAG, I]``.
    """
    done: list[tuple[str, int]] = []
    stale = 0
    for i in range(n):
        delta: dict[str, Any] = {}
        if scoped:
            delta = {f"user:{tag}-{i}": i, f"app:{tag}-{i}": i, "user:last": [tag, i]}
            delta["app:last"] = [tag, i]
        while True:
            session = await service.get_session(app_name=app, user_id=user, session_id=sid)
            assert session is not None
            event = Event(
                invocation_id=f"{tag}-{i}",
                author="user",
                content=types.Content(role="user", parts=[types.Part(text=f"{tag}-{i}")]),
                actions=EventActions(state_delta=delta),
            )
            seen = len(session.events)
            try:
                await service.append_event(session, event)
            except StaleSessionError:
                stale += 1
                continue
            done.append((event.id, seen))
            break
    return {"done": done, "stale": stale}


async def main(url: str) -> None:
    loop = asyncio.get_running_loop()
    async with ZidaneSessionService(store=url) as service:
        print(json.dumps({"ready": True}), flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            op = command.pop("op")
            if op == "appends":
                answer = await appends(service, **command)
            else:
                session = await service.get_session(**command)
                answer = {"events": None if session is None else [e.id for e in session.events]}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
