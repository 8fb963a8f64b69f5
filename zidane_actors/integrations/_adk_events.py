"""ADK events ⇄ zidane turns for ``integrations.adk``: ids, state folding, readable turns."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Final, cast

import pydantic
from google.adk.events.event import Event
from google.adk.sessions.state import State
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from ..actors import Session
from ..errors import InvalidNameError, ValidationError
from ..model import (
    ReasoningBlock,
    SessionContentBlock,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    check_json,
    encode,
    has_lone_surrogate,
    key_segment,
    parse_json,
    preview,
    validate_id,
)
from ._adk_runs import RUN_PREFIX, control_event

EVENT_KEY: Final = "adkEvent"
"""Turn metadata key of the whole ADK event, in ``Event.model_dump(mode="json", by_alias=True)``."""


CHECKPOINT_EVERY: Final = 16
"""Turns after which the session-scoped state is stored again (readers fold the rest)."""

BLOCK_REF: Final = "zidaneBlock"
"""A stored event's stand-in for a part its turn's block ``index`` holds exactly."""

_SCOPES: Final = (State.APP_PREFIX, State.USER_PREFIX, State.TEMP_PREFIX)
_EVENTS: Final = TypeAdapter(list[Event])
_STALE: Final = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)

# -- ids ---------------------------------------------------------------------


def _zidane_id(kind: str, *parts: str) -> str:
    """The zidane id of an ADK session or scope: readable when safe, else a digest.

    ``adk:APP:USER:ID`` when no part holds a ``:`` and the whole is a safe id,
    else ``adk=SHA256`` of the parts (a different prefix, so the two forms
    never meet). Loads check the stored names, so a digest collision or a
    foreign session under the id reads as no session.
    """
    if all(parts) and not any(":" in part for part in parts):
        readable = ":".join((kind, *parts))
        try:
            return validate_id(readable)
        except InvalidNameError:
            pass
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    return f"{kind}={digest}"


@functools.lru_cache(maxsize=65_536)
def _session_id(app_name: str, user_id: str, session_id: str) -> str:
    return _zidane_id("adk", app_name, user_id, session_id)


@functools.lru_cache(maxsize=65_536)
def _app_scope_id(app_name: str) -> str:
    return _zidane_id("adk-app", app_name)


@functools.lru_cache(maxsize=65_536)
def _user_scope_id(app_name: str, user_id: str) -> str:
    return _zidane_id("adk-user", app_name, user_id)


# -- state -------------------------------------------------------------------


def _split_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(app, user, session)`` deltas, prefixes removed; ``temp:`` keys dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    session: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            session[key] = value
    return app, user, session


def _json_state(state: Mapping[str, Any], where: str) -> dict[str, Any]:
    """State as JSON data, as ADK's database service stores it; refused when it has none.

    Checked whole before anything is written, so a session is never created
    with only part of its state (its ``app:``/``user:`` keys are stored apart).
    """
    try:
        data = cast(dict[str, Any], to_jsonable_python(dict(state)))
    except Exception as exc:
        raise ValidationError(f"state has a value with no JSON form: {exc}", path=where) from exc
    check_json(data, what="state", path=where, depth=1)  # a metadata value where it is stored
    return data


def _event_json(event: Event) -> dict[str, Any]:
    """The event in ADK's JSON form, refused when that would not read back as the event.

    pydantic writes a float JSON cannot hold (``NaN``, an infinity) as
    ``null``, and a dict key holding a lone surrogate with U+FFFD in its
    place: such an event is refused at the value's place, as is one with no
    JSON form at all (nested too deep).
    """
    try:
        data = event.model_dump(mode="json", exclude_none=True, by_alias=True)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValidationError(f"the event has no JSON form: {exc}", path="$") from None
    raw = encode(data)
    if b"null" in raw or _REPLACEMENT in raw:  # the caller's, or written for one of those
        _check_exact(event.model_dump(exclude_none=True, by_alias=True), "$")
    return data


_REPLACEMENT: Final = "\ufffd".encode()


def _check_exact(value: Any, path: str) -> None:
    """Refuse what ADK's JSON form of ``value`` (Python-mode data) would not keep as it is."""
    if type(value) is float:
        if not math.isfinite(value):
            raise ValidationError(f"{value} has no exact JSON form", path=path)
    elif isinstance(value, dict):
        for key, item in value.items():
            step = key_segment(key) if isinstance(key, str) else f"[{preview(key)}]"
            if isinstance(key, str) and has_lone_surrogate(key):
                raise ValidationError(
                    "this key holds a lone surrogate, which ADK's JSON form replaces",
                    path=path + step,
                )
            _check_exact(item, path + step)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_exact(item, f"{path}[{index}]")


def _events_of(raw: bytes) -> list[Event]:
    """The events ``_read`` answered (a lone surrogate escape only pydantic's parser refuses)."""
    try:
        return _EVENTS.validate_json(raw)
    except pydantic.ValidationError as exc:
        if not any(error["type"] == "json_invalid" for error in exc.errors()):
            raise
        return _EVENTS.validate_python(parse_json(raw))


def _fold(state: dict[str, Any], turns: Iterable[SessionTurn]) -> dict[str, Any]:
    """``state`` with the session-scoped deltas of the events in ``turns`` applied."""
    for turn in turns:
        event = turn.metadata.get(EVENT_KEY) if turn.metadata else None
        actions = event.get("actions") if isinstance(event, dict) else None
        delta = actions.get("stateDelta") if isinstance(actions, dict) else None
        if delta:
            for key, value in delta.items():
                if not key.startswith(_SCOPES):
                    state[key] = value
    return state


def _turns(session: Session) -> tuple[SessionTurn, ...]:
    """The session's turns as memory holds them: this door only reads them (and encodes
    what it hands out), so it needs no frozen copy of each new turn."""
    return session._memory().turns


def _meta(session: Session) -> Mapping[str, Any]:
    """The session's metadata as memory holds it (read, never handed out: the state made
    from it is encoded, or written through the session, which copies it)."""
    return session._memory().metadata


def _runs(session: Session) -> tuple[SessionRun, ...]:
    """The session's runs as memory holds them (read, never handed out; the records made
    from them are written through the session, which checks them)."""
    return session._memory().runs


def _session_state(session: Session) -> dict[str, Any]:
    """The stored session-scoped state: the checkpoint, then any later event's delta."""
    meta = _meta(session)
    base = dict(cast(dict[str, Any], meta.get("adkState") or {}))
    folded = cast(int, meta.get("adkStateTurns") or 0)
    turns = _turns(session)
    return _fold(base, turns[folded:]) if folded < len(turns) else base


def _merged(app: Mapping[str, Any], user: Mapping[str, Any], session: dict[str, Any]) -> bytes:
    merged = dict(session)
    for key, value in app.items():
        merged[State.APP_PREFIX + key] = value
    for key, value in user.items():
        merged[State.USER_PREFIX + key] = value
    return encode(merged)  # a private copy for the caller's loop


# -- events as turns ---------------------------------------------------------


def _readable(
    data: Mapping[str, Any],
) -> tuple[str, list[SessionContentBlock], TurnUsage | None, dict[int, int]]:
    """The turn role, readable blocks and usage of an event in its JSON form.

    A rewind or an events compaction is a ``command`` turn saying so (see
    :func:`~zidane_actors.integrations._adk_runs.control_event`).

    The last answer maps each part a block holds exactly (gives back as is)
    to that block's index: those parts are stored once, in the block.
    """
    content = data.get("content") or {}
    role = content.get("role")
    if role is None:
        role = "user" if data.get("author") == "user" else "model"
    blocks: list[SessionContentBlock] = []
    exact: dict[int, int] = {}
    for i, part in enumerate(content.get("parts") or ()):
        if "functionCall" in part:
            call = part["functionCall"]
            args = call.get("args")
            if call.get("id") and call.get("name") and isinstance(args, dict | None):
                if part.keys() == {"functionCall"} and call.keys() == {"id", "name", "args"}:
                    exact[i] = len(blocks)
                blocks.append(ToolCallBlock(id=call["id"], name=call["name"], input=args or {}))
            else:
                blocks.append(TextBlock(text=f"{call.get('name')}({_compact(args)})"))
        elif "functionResponse" in part:
            reply = part["functionResponse"]
            response = reply.get("response")
            output = response if isinstance(response, str) else _compact(response)
            if reply.get("id"):
                if (
                    part.keys() == {"functionResponse"}
                    and reply.keys() == {"id", "name", "response"}
                    and isinstance(reply["name"], str)
                    and isinstance(response, dict)
                ):
                    exact[i] = len(blocks)
                failed = isinstance(response, dict) and list(response) == ["error"]
                blocks.append(
                    ToolResultBlock(
                        call_id=reply["id"], output=output, is_error=failed, name=reply.get("name")
                    )
                )
            else:
                blocks.append(TextBlock(text=f"{reply.get('name')} → {output}"))
        elif isinstance(part.get("text"), str):
            if part.get("thought"):
                if part.keys() == {"text", "thought"} and part["thought"] is True:
                    exact[i] = len(blocks)
                blocks.append(ReasoningBlock(text=part["text"]))
            else:
                if part.keys() == {"text"}:
                    exact[i] = len(blocks)
                blocks.append(TextBlock(text=part["text"]))
    control = control_event(data)
    if control is not None:  # a rewind or a compaction: never sent to a model as it is
        return "command", [TextBlock(text=control)], None, {}
    usage = None
    counts = data.get("usageMetadata")
    if role == "model" and isinstance(counts, dict):
        usage = TurnUsage(
            input=counts.get("promptTokenCount") or 0,
            output=(counts.get("candidatesTokenCount") or 0)
            + (counts.get("thoughtsTokenCount") or 0),
            cache_read=counts.get("cachedContentTokenCount"),
            model=data.get("modelVersion"),
        )
    return ("assistant" if role == "model" else "user"), blocks, usage, exact


def _with_parts(data: dict[str, Any], parts: list[Any]) -> dict[str, Any]:
    return {**data, "content": {**data["content"], "parts": parts}}


def _stored_once(data: dict[str, Any], exact: Mapping[int, int]) -> dict[str, Any]:
    """``data`` with each part a block holds exactly replaced by ``{"zidaneBlock": index}``."""
    if not exact:
        return data
    parts = list(data["content"]["parts"])
    for i, j in exact.items():
        parts[i] = {BLOCK_REF: j}
    return _with_parts(data, parts)


def _event_of(turn: SessionTurn) -> dict[str, Any] | None:
    """The stored ADK event of a turn, parts kept in its blocks put back."""
    event = turn.metadata.get(EVENT_KEY) if turn.metadata else None
    if not isinstance(event, dict):
        return None
    content = event.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not parts or not any(BLOCK_REF in part for part in parts):
        return event
    back = (_part_of(turn.content, p[BLOCK_REF]) if BLOCK_REF in p else p for p in parts)
    return _with_parts(event, [part for part in back if part is not None])


def _part_of(blocks: tuple[SessionContentBlock, ...], index: Any) -> dict[str, Any] | None:
    """The ADK part a block stands for (``None`` when the turn no longer has it)."""
    block = blocks[index] if isinstance(index, int) and 0 <= index < len(blocks) else None
    if isinstance(block, TextBlock):
        return {"text": block.text}
    if isinstance(block, ReasoningBlock):
        return {"text": block.text, "thought": True}
    if isinstance(block, ToolCallBlock):
        return {"functionCall": {"id": block.id, "name": block.name, "args": block.input}}
    if isinstance(block, ToolResultBlock) and isinstance(block.output, str):
        response = json.loads(block.output)
        return {"functionResponse": {"id": block.call_id, "name": block.name, "response": response}}
    return None


def _compact(value: Any) -> str:
    """Compact JSON text of an event's JSON-mode value (read back with ``json.loads``)."""
    return encode(value).decode()


class _Pairing:
    """The tool-call ids a session's turns hold, to keep every stored pairing valid.

    The store's load-time heal drops a repeated call id and a result with no
    call in the latest assistant turn; a block that would be dropped is
    stored as text instead, so no event's turn is ever healed away.
    """

    def __init__(self, turns: tuple[SessionTurn, ...]) -> None:
        self.count = 0
        self.last_id: str | None = None
        self.seen: set[str] = set()
        self.latest: set[str] = set()
        self.extend(turns)

    def fits(self, turns: tuple[SessionTurn, ...]) -> bool:
        return self.count == len(turns) and (not turns or turns[-1].id == self.last_id)

    def extend(self, turns: Iterable[SessionTurn]) -> None:
        for turn in turns:
            self.count += 1
            self.last_id = turn.id
            if turn.run_id is not None and not turn.run_id.startswith(RUN_PREFIX):
                continue  # another lane: its ids never meet ours (this door's runs have no depth)
            calls = {b.id for b in turn.content if isinstance(b, ToolCallBlock)}
            self.seen |= calls
            if turn.role == "assistant":
                self.latest = calls

    def checked(self, blocks: list[SessionContentBlock]) -> tuple[SessionContentBlock, ...]:
        out: list[SessionContentBlock] = []
        calls: set[str] = set()
        results: set[str] = set()
        for block in blocks:
            if isinstance(block, ToolCallBlock):
                if block.id in self.seen or block.id in calls:
                    block = TextBlock(text=f"{block.name}({_compact(block.input)})")
                else:
                    calls.add(block.id)
            elif isinstance(block, ToolResultBlock):
                if block.call_id in results or block.call_id not in self.latest:
                    block = TextBlock(text=f"{block.name or block.call_id} → {block.output}")
                else:
                    results.add(block.call_id)
            out.append(block)
        return tuple(out)


_pairings: weakref.WeakKeyDictionary[Session, _Pairing] = weakref.WeakKeyDictionary()


def _pairing_for(session: Session) -> _Pairing:
    pairing = _pairings.get(session)
    if pairing is None or not pairing.fits(_turns(session)):
        pairing = _pairings[session] = _Pairing(_turns(session))
    return pairing


def _marker(session: Session) -> str:
    """The stored revision a loaded ADK session carries (its stale-write check)."""
    turns = _turns(session)
    return f"{session.created_at}:{len(turns)}:{turns[-1].id if turns else ''}"


def _turn_id(session: Session) -> str:
    """The id of the turn appended after the session's current last turn.

    Derived from the place (turn count and last turn id), so two writers
    appending at one place give one id: the store's unique-id rule lets the
    first in and refuses the other (``ConflictError``, nothing written),
    which makes the stale check and the append one atomic step in every store.
    """
    turns = _turns(session)
    place = f"{session.id}\n{len(turns)}\n{turns[-1].id if turns else ''}"
    return "adk-" + hashlib.sha256(place.encode()).hexdigest()[:32]


def _last_event(session: Session) -> dict[str, Any] | None:
    for turn in reversed(_turns(session)):
        event = turn.metadata.get(EVENT_KEY) if turn.metadata else None
        if isinstance(event, dict):
            return event
    return None


def _last_update(session: Session) -> float:
    event = _last_event(session)
    if event is not None:
        return cast(float, event.get("timestamp", 0.0))
    return cast(float, _meta(session).get("adkCreateTime") or session.created_at / 1000)
