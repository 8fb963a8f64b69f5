"""ADK invocations as zidane run records, folded event by event (pure, no I/O).

An invocation is one run whose agent is the first agent that authored an
event of it; each other agent of the invocation (a transfer, a sub-agent of
a workflow) gets a run of its own naming the first as its ``parentRunId``.
They continue one conversation, so they carry no ``depth``: every run of an
ADK session stays in the session's main view. A run ends ``completed`` with
a final response and ``error`` with an error event (``CODE: message``; ADK
appends one for a model or tool exception, its type as the code). What
appends no event is seen by :class:`~zidane_actors.integrations.adk.ZidaneSessionService`'s
``plugin`` only (an exception escaping the Runner, a caller that stops
reading: ``error`` or ``aborted``); without it such a run is ended
``aborted`` when the next invocation of the session begins.

Each run keeps its calls' times (``callTimes``) from ADK's own timestamps:
a model response event is stamped when its model call begins and stored
when it answered; a function response event is stamped when its tools
are done, which began once the model call that asked for them answered.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from ..model import RunStatus, SessionRun, SessionRunAgent, StoredRunOptions, TurnUsage
from ._shared import CALL_TIMES_KEY, CallTime, with_calls, with_trace
from ._usage import total

RUN_PREFIX: Final = "adk-run-"
"""The prefix of the ids of the runs this door records."""

UNKNOWN_END: Final = (
    "ended without a final response (the session service cannot see how; pass"
    " ZidaneSessionService.plugin to the Runner to record failures)"
)
NO_FINAL: Final = "the invocation ended without a final response"
SUMMARY_CHARS: Final = 200
"""How much of a compaction's summary its turn shows (the whole is in the stored event)."""


def run_id(invocation_id: str, author: str = "") -> str:
    """The run of an invocation (``author`` empty) or of one more agent of it."""
    digest = hashlib.sha256(json.dumps([invocation_id, author]).encode()).hexdigest()
    return RUN_PREFIX + digest[:32]


def invocation_runs(runs: Iterable[SessionRun], invocation_id: str) -> list[SessionRun]:
    """The runs of one invocation: its own, then those of its other agents."""
    root = run_id(invocation_id)
    return [r for r in runs if r.id == root or r.parent_run_id == root]


def ended(run: SessionRun, status: RunStatus, at: int, error: str | None) -> SessionRun:
    """``run`` ended with ``status`` at ``at`` (epoch ms)."""
    return msgspec.structs.replace(
        run,
        status=status,
        ended_at=at,
        error=error,
        wall_ms=float(max(at - run.started_at, 0)),
    )


def _agent(name: str) -> SessionRunAgent:
    return SessionRunAgent(id=name, label=name)


def _prompt(data: Mapping[str, Any]) -> str:
    content = data.get("content") or {}
    for part in content.get("parts") or ():
        if isinstance(part.get("text"), str) and not part.get("thought"):
            return str(part["text"])
    return ""


def _with_usage(run: SessionRun, usage: TurnUsage, turn_id: str) -> SessionRun:
    usages = (*(run.turn_usage or ()), msgspec.structs.replace(usage, turn_id=turn_id))
    summed = total(usages)
    models = [u.model for u in usages if u.model]
    return msgspec.structs.replace(
        run,
        turn_usage=usages,
        total_usage=summed,
        tokens_in=summed.input,
        tokens_out=summed.output,
        cost=summed.cost,
        options=StoredRunOptions(model=models[-1]) if models else run.options,
    )


def _of_invocation(runs: Sequence[SessionRun], root: str) -> list[SessionRun]:
    """The runs of the invocation whose run is ``root``, looked up from the newest.

    The current invocation's runs are the newest: found without reading the
    others (an event costs the same in the 1000th invocation as in the first).
    """
    found: list[SessionRun] = []
    for run in reversed(runs):
        found.append(run)
        if run.id == root:
            return found
        if run.parent_run_id != root:
            break
    return [r for r in runs if r.id == root or r.parent_run_id == root]  # an older one, or none


def _parts(data: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    content = data.get("content") or {}
    found = [part.get(kind) for part in content.get("parts") or () if isinstance(part, dict)]
    return [f for f in found if isinstance(f, dict)]


def _last_answer(run: SessionRun) -> int | None:
    """When the newest model call of ``run`` answered (epoch ms)."""
    held = run.extra_fields.get(CALL_TIMES_KEY) if run.extra_fields else None
    calls: list[Any] = held if isinstance(held, list) else []
    for call in reversed(calls):
        if isinstance(call, dict) and call.get("kind") == "model":
            return int(call["startedAt"] + call["durationMs"])
    return None


def _timed(run: SessionRun, data: Mapping[str, Any], at: int, now: int, model: str) -> SessionRun:
    """``run`` with the calls an agent's event shows, timed."""
    responses = _parts(data, "functionResponse")
    if not responses:
        if (data.get("content") or {}).get("role") != "model":
            return run
        return with_calls(run, [CallTime("model", model, at, float(now - at))])
    began = _last_answer(run)
    if began is None or began > at:
        return run
    calls = [
        CallTime(
            "tool",
            str(response.get("name") or "tool"),
            began,
            float(at - began),
            response.get("id") if isinstance(response.get("id"), str) else None,
            failed=isinstance(response.get("response"), dict) and "error" in response["response"],
        )
        for response in responses
    ]
    return with_calls(run, calls)


def control_event(data: Mapping[str, Any]) -> str | None:
    """What an event of ADK's own bookkeeping says, or ``None`` for any other event.

    A rewind (``Runner.rewind_async``) and an events compaction each append an
    event with no content under an invocation id of its own: they belong to no
    invocation, so they make no run (a run would only ever end ``aborted``).
    """
    content = data.get("content") or {}
    actions = data.get("actions") or {}
    if content.get("parts") or not isinstance(actions, Mapping):
        return None
    rewound = actions.get("rewindBeforeInvocationId")
    if isinstance(rewound, str) and rewound:
        return f"Rewound to before invocation {rewound}."
    compaction = actions.get("compaction")
    if isinstance(compaction, Mapping):
        start, end = compaction.get("startTimestamp"), compaction.get("endTimestamp")
        summary = _prompt({"content": compaction.get("compactedContent")})
        cut = summary if len(summary) <= SUMMARY_CHARS else summary[:SUMMARY_CHARS] + "…"
        return f"Events from {start} to {end} compacted: {cut}"
    return None


def event_runs(
    runs: Sequence[SessionRun],
    data: Mapping[str, Any],
    *,
    turn_id: str,
    at: int,
    usage: TurnUsage | None,
    final: bool,
    error: str | None,
    trace: dict[str, str] | None,
    now: int | None = None,
) -> tuple[str | None, list[SessionRun]]:
    """The run of an event's turn, and the records its write carries (that run first).

    ``runs`` are the session's; ``data`` the event in ADK's JSON form,
    stored as the turn ``turn_id`` at ``at`` (epoch ms); ``final`` and
    ``error`` say whether it is a final response or an error event;
    ``now`` is when it is stored (epoch ms, the clock's by default).
    ``(None, [])`` for an event of no invocation, and for a rewind or an
    events compaction (:func:`control_event`).
    """
    invocation = data.get("invocationId")
    if not isinstance(invocation, str) or not invocation or control_event(data) is not None:
        return None, []
    author = data.get("author") if isinstance(data.get("author"), str) else None
    by_id = {r.id: r for r in _of_invocation(runs, run_id(invocation))}
    changed: dict[str, SessionRun] = {}
    root = by_id.get(run_id(invocation))
    if root is None:
        # A new invocation: an earlier one still running is over, how is unknown here.
        for old in runs:
            if old.status == "running" and old.id.startswith(RUN_PREFIX):
                changed[old.id] = ended(old, "aborted", at, UNKNOWN_END)
        prompt = _prompt(data) if author == "user" else ""
        root = with_trace(
            SessionRun(id=run_id(invocation), prompt=prompt, started_at=at, status="running"), trace
        )
    if author is None or author == "user":
        run = root
    elif root.agent is None or root.agent.id == author:
        run = root = msgspec.structs.replace(root, agent=root.agent or _agent(author))
    else:
        changed[root.id] = root
        child = run_id(invocation, author)
        run = by_id.get(child) or with_trace(
            SessionRun(
                id=child,
                prompt=root.prompt,
                started_at=at,
                status="running",
                agent=_agent(author),
                parent_run_id=root.id,
            ),
            trace,
        )
    if author not in (None, "user"):
        run = msgspec.structs.replace(run, turns=(run.turns or 0) + 1)
        if usage is not None:
            run = _with_usage(run, usage, turn_id)
        stored = time.time_ns() // 1_000_000 if now is None else now
        model = (usage.model if usage is not None else None) or str(author)
        run = _timed(run, data, at, max(stored, at), model)
    if run.status != "running" and not (final or error):
        run = msgspec.structs.replace(run, status="running", ended_at=None, error=None)
    changed[run.id] = run
    if final or error:
        # The invocation is over: its runs still running end with this event.
        status: RunStatus = "error" if error else "completed"
        for other in invocation_runs({**by_id, **changed}.values(), invocation):
            other = changed.get(other.id, other)
            if other.status == "running":
                changed[other.id] = ended(other, status, at, error)
    first = changed.pop(run.id)
    return run.id, [first, *changed.values()]
