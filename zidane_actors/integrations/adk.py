"""google-adk sessions stored as zidane sessions: ``ZidaneSessionService``.

``ZidaneSessionService`` is a ``google.adk.sessions.BaseSessionService`` over
any zidane store URL. Each ADK session is one zidane session whose turns are
its events: readable content (text, reasoning, function calls and responses
as ``tool_call``/``tool_result`` blocks, token usage) for the session
browser and the message converters, with the whole ADK event kept in the
turn's ``metadata.adkEvent`` (ADK's own JSON form), so an event reads back
equal to what was appended. Session-scoped state lives in the session's
metadata; ``app:`` and ``user:`` state, shared across sessions, live in one
zidane session per app and per user; ``temp:`` state is never stored.
Every service and integration of one store URL shares one portal (one trio
thread, one host, one store) per process, and any number of processes may
serve the same sessions: every call checks the store's revision, appends are
refused atomically when another writer took their place, and scope state is
merged by conditional read-modify-writes. Requires the ``adk`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import math
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, Self, TypeVar, cast

import attrs
import msgspec
import outcome
import pydantic
import trio
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session as AdkSession
from google.adk.sessions.state import State
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from .._nursery import open_service_nursery
from ..actors import Session, SessionHost
from ..actors._contention import STALE_ATTEMPTS, back_off
from ..errors import ActorClosed, ConflictError, InvalidNameError, ValidationError
from ..errors import SessionNotFoundError as ZidaneNotFound
from ..errors import StaleSessionError as StoreStaleError
from ..model import (
    JsonValue,
    ReasoningBlock,
    SaveMetaOptions,
    SessionContentBlock,
    SessionFilter,
    SessionHistory,
    SessionMetaRow,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    check_json,
    encode,
    has_lone_surrogate,
    key_segment,
    new_id,
    parse_json,
    preview,
    validate_id,
)
from ..portal._thread import wait_future
from ..stores._protocol import FullSessionStore, StoreWrite, VersionedStore, store_capabilities
from . import _shared

__all__ = ["DEFAULT_STORE", "ZidaneSessionService"]

DEFAULT_STORE: Final = "sqlite:zidane-sessions.db"

EVENT_KEY: Final = "adkEvent"
"""Turn metadata key of the whole ADK event, in ``Event.model_dump(mode="json", by_alias=True)``."""

T = TypeVar("T")

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

_locks: weakref.WeakKeyDictionary[Session, trio.Lock] = weakref.WeakKeyDictionary()


def _lock_for(session: Session) -> trio.Lock:
    # Only ever called in the trio thread that owns ``session``.
    lock = _locks.get(session)
    if lock is None:
        lock = _locks[session] = trio.Lock()
    return lock


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


def _session_state(session: Session) -> dict[str, Any]:
    """The stored session-scoped state: the checkpoint, then any later event's delta."""
    meta = session.metadata
    base = dict(cast(dict[str, Any], meta.get("adkState") or {}))
    folded = cast(int, meta.get("adkStateTurns") or 0)
    turns = session.turns
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
            if turn.run_id is not None:
                continue  # another lane: its ids never meet ours
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
    if pairing is None or not pairing.fits(session.turns):
        pairing = _pairings[session] = _Pairing(session.turns)
    return pairing


def _marker(session: Session) -> str:
    """The stored revision a loaded ADK session carries (its stale-write check)."""
    turns = session.turns
    return f"{session.created_at}:{len(turns)}:{turns[-1].id if turns else ''}"


def _turn_id(session: Session) -> str:
    """The id of the turn appended after the session's current last turn.

    Derived from the place (turn count and last turn id), so two writers
    appending at one place give one id: the store's unique-id rule lets the
    first in and refuses the other (``ConflictError``, nothing written),
    which makes the stale check and the append one atomic step in every store.
    """
    turns = session.turns
    place = f"{session.id}\n{len(turns)}\n{turns[-1].id if turns else ''}"
    return "adk-" + hashlib.sha256(place.encode()).hexdigest()[:32]


def _last_event(session: Session) -> dict[str, Any] | None:
    for turn in reversed(session.turns):
        event = turn.metadata.get(EVENT_KEY) if turn.metadata else None
        if isinstance(event, dict):
            return event
    return None


def _last_update(session: Session) -> float:
    event = _last_event(session)
    if event is not None:
        return cast(float, event.get("timestamp", 0.0))
    return cast(float, session.metadata.get("adkCreateTime") or session.created_at / 1000)


class ZidaneSessionService(BaseSessionService):
    """A google-adk session service kept in a zidane store.

    ``store`` is a store URL as the CLI takes it (``sqlite:PATH``, ``memory:``,
    ``postgres://…``, ``http(s)://…``; not ``file:DIR``, which holds a single
    session: :class:`~zidane_actors.errors.ValidationError`). Services and
    integrations of one URL share one portal; :meth:`aclose` (or ``async
    with``) releases this service's share, and the last release closes the
    store. Whatever is left open is closed at interpreter exit.

    As ADK's ``DatabaseSessionService``: ``append_event`` raises
    ``StaleSessionError`` when the session was appended to since it was
    read (by any process), creating an existing id raises
    ``AlreadyExistsError``, and appending to a missing session
    ``SessionNotFoundError``.
    """

    def __init__(self, *, store: str = DEFAULT_STORE) -> None:
        if store.startswith("file:"):
            raise ValidationError(
                "a file: store holds one zidane session; an ADK service keeps one per ADK"
                " session and more for app: and user: state (use sqlite:PATH, postgres://…"
                " or http(s)://…)",
                path="store",
            )
        self.store_url = store
        self._shared: _shared.SharedPortal | None = _shared.acquire(store)
        self._append_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def __repr__(self) -> str:
        return f"ZidaneSessionService(store={self.store_url!r})"

    # -- lifetime ---------------------------------------------------------------

    async def aclose(self) -> None:
        """Release this service's share of the portal (the last share closes the store)."""
        shared, self._shared = self._shared, None
        if shared is not None:
            stopped = _shared.release(shared)
            if stopped is not None:
                await wait_future(stopped)
                _drop_closed_hosts()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(host, *args)`` in the portal's trio thread.

        The portal hands calls made together to the trio thread in one wave and
        their answers back in one delivery per wave. A call accepted by the
        trio side runs to its verdict even when its caller is cancelled
        meanwhile (then ``CancelledError`` is raised).
        """
        shared = self._open()
        await wait_future(shared.ready)
        return await shared.portal.call_async(fn, shared.portal.host, *args)

    def _open(self) -> _shared.SharedPortal:
        return _shared.held(self._shared, self)

    # -- BaseSessionService -----------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AdkSession:
        """A new session; ``app:`` and ``user:`` keys of ``state`` go to their scopes."""
        sid = session_id if session_id is not None else new_id()
        app, user, own = _split_state(_json_state(state or {}, "$.state"))
        now = time.time()
        answer = await self._call(_create, app_name, user_id, sid, own, app, user, now)
        if answer is None:
            raise AlreadyExistsError(f"Session with id {sid} already exists.")
        merged, marker = answer
        session = AdkSession(
            id=sid,
            app_name=app_name,
            user_id=user_id,
            state=parse_json(merged),
            last_update_time=now,
        )
        session._storage_update_marker = marker
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> AdkSession | None:
        """The session with its merged state, and its events as ``config`` limits them."""
        recent = config.num_recent_events if config is not None else None
        after = config.after_timestamp if config is not None else None
        answer = await self._call(_read, app_name, user_id, session_id, recent, after)
        if answer is None:
            return None
        merged, events, last_update, marker = answer
        session = AdkSession(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=parse_json(merged),
            events=_events_of(events),
            last_update_time=last_update,
        )
        session._storage_update_marker = marker
        return session

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The app's sessions (one user's, or every user's), oldest update first, no events."""
        rows = await self._call(_list, app_name, user_id)
        sessions = [
            AdkSession(
                id=sid,
                app_name=app_name,
                user_id=user,
                state=parse_json(merged),
                last_update_time=last_update,
            )
            for sid, user, merged, last_update in rows
        ]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session and its events (its ``app:``/``user:`` state stays)."""
        await self._call(_delete, app_name, user_id, session_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, keys without the prefix."""
        state = await self._call(_user_state, app_name, user_id)
        return cast(dict[str, Any], parse_json(state))

    async def append_event(self, session: AdkSession, event: Event) -> Event:
        """Store ``event`` as a turn and apply its state delta, then append it to ``session``.

        A partial event is answered untouched; ``temp:`` state reaches
        ``session.state`` but is never stored. Appends to one session from
        this service are serialized, so parallel branches sharing one
        ``Session`` object never see each other as stale.
        """
        self._open()  # a closed service refuses even an event it would not store
        if event.partial:
            return event
        key = _session_id(session.app_name, session.user_id, session.id)
        lock = self._append_locks.get(key)
        if lock is None:
            lock = self._append_locks[key] = asyncio.Lock()
        async with lock:
            self._apply_temp_state(session, event)
            event = self._trim_temp_delta_state(event)
            data = _event_json(event)
            role, blocks, usage, exact = _readable(data)
            delta = cast(dict[str, Any], data.get("actions", {}).get("stateDelta") or {})
            app, user, own = _split_state(delta)
            last_id = session.events[-1].id if session.events else None
            marker = await self._call(
                _append,
                session.app_name,
                session.user_id,
                session.id,
                _Append(data, exact, role, blocks, usage, own, app, user),
                (session._storage_update_marker, session.last_update_time, last_id),
            )
            session._storage_update_marker = marker
            session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)


@attrs.frozen
class _Append:
    """What ``append_event`` hands the trio side: the event as data, turn parts, deltas."""

    data: dict[str, Any]
    exact: dict[int, int]  # part index -> the block holding it exactly
    role: str
    blocks: list[SessionContentBlock]
    usage: TurnUsage | None
    own: dict[str, Any]
    app: dict[str, Any]
    user: dict[str, Any]


# -- the trio side -------------------------------------------------------------

KEEP_HANDLES: Final = 10_000
"""Session handles kept per host, newest use last, so reads find them without the store."""

_kept: weakref.WeakKeyDictionary[SessionHost, OrderedDict[str, Session]] = (
    weakref.WeakKeyDictionary()
)


def _drop_closed_hosts() -> None:
    """Forget the handles of closed hosts.

    A kept session holds its host, so ``_kept``'s weak keys alone would
    never let a closed host (and every session it kept) go: its entry is
    dropped here, by the service that closed it or when another host starts
    keeping handles.
    """
    for host in list(_kept):
        try:
            host.check_open()
        except ActorClosed:
            del _kept[host]


def _keep(host: SessionHost, session: Session | None) -> Session | None:
    """``session``, kept alive (the host holds idle sessions only weakly)."""
    if session is not None:
        kept = _kept.get(host)
        if kept is None:
            _drop_closed_hosts()
            kept = _kept[host] = OrderedDict()
        kept[session.id] = session
        kept.move_to_end(session.id)
        if len(kept) > KEEP_HANDLES:
            kept.popitem(last=False)
    return session


async def _load(host: SessionHost, zid: str) -> Session | None:
    session = await host.load_session(zid)
    kept = _kept.get(host)
    if session is None and kept is not None:
        kept.pop(zid, None)
    return _keep(host, session)


def _held(host: SessionHost, zid: str) -> Session | None:
    """The session handle this host holds for ``zid`` (as of its last read), if any."""
    kept = _kept.get(host)
    session = kept.get(zid) if kept is not None else None
    if kept is not None and session is not None:
        kept.move_to_end(zid)
    return session


async def _adk_session(
    host: SessionHost, app_name: str, user_id: str, session_id: str
) -> Session | None:
    """The zidane session of an ADK session, ``None`` when missing or not this one."""
    session = await _load(host, _session_id(app_name, user_id, session_id))
    if session is None:
        return None
    meta = session.metadata
    if (
        meta.get("adkApp") != app_name
        or meta.get("adkUser") != user_id
        or meta.get("adkSessionId") != session_id
    ):
        return None
    return session


_host_capabilities: weakref.WeakKeyDictionary[SessionHost, frozenset[str]] = (
    weakref.WeakKeyDictionary()
)


def _capabilities(host: SessionHost) -> frozenset[str]:
    caps = _host_capabilities.get(host)
    if caps is None:
        caps = _host_capabilities[host] = store_capabilities(host.store)
    return caps


async def _scope_state(host: SessionHost, zid: str, key: str) -> dict[str, Any]:
    """A scope's state as the store holds it now (one indexed read, never a cached copy)."""
    store = cast(FullSessionStore, host.store)
    if "get_meta" in _capabilities(host):
        row = await store.get_meta(zid)
        meta: Mapping[str, Any] | None = row.metadata if row is not None else None
    else:
        data = await store.load(zid)
        meta = data.metadata if data is not None else None
    return _state_in(meta, key)


def _state_in(meta: Mapping[str, Any] | None, key: str) -> dict[str, Any]:
    state = meta.get(key) if meta is not None else None
    return cast(dict[str, Any], state) if isinstance(state, dict) else {}


async def _settle(
    verdicts: dict[str, outcome.Outcome[Any]],
    name: str,
    fn: Callable[..., Awaitable[Any]],
    *args: Any,
) -> None:
    """``verdicts[name]`` = the outcome of ``await fn(*args)``, for a task of a nursery.

    Its error is kept to be raised as itself, never wrapped in a group by the
    nursery; a cancellation goes through.
    """
    try:
        verdicts[name] = outcome.Value(await fn(*args))
    except Exception as exc:
        verdicts[name] = outcome.Error(exc)


async def _scopes(
    host: SessionHost, app_name: str, user_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``app:`` and ``user:`` state of an ADK session, as stored now (read at once)."""
    app_id, user_id_ = _app_scope_id(app_name), _user_scope_id(app_name, user_id)
    if "get_meta" in _capabilities(host):  # both reads queued together: one wave
        rows = await host.store.call_together(
            [StoreWrite("get_meta", (app_id,)), StoreWrite("get_meta", (user_id_,))]
        )
        app_row, user_row = (cast(SessionMetaRow | None, row.unwrap()) for row in rows)
        return (
            _state_in(app_row.metadata if app_row is not None else None, "adkAppState"),
            _state_in(user_row.metadata if user_row is not None else None, "adkUserState"),
        )
    return (
        await _scope_state(host, app_id, "adkAppState"),
        await _scope_state(host, user_id_, "adkUserState"),
    )


async def _update_scopes(
    host: SessionHost, app_name: str, user_id: str, app: dict[str, Any], user: dict[str, Any]
) -> None:
    """Apply ``app:`` and ``user:`` deltas to their scope sessions, both writes at once.

    Each write runs to its end whatever the other's fate; the first error is raised.
    """
    verdicts: dict[str, outcome.Outcome[None]] = {}
    async with trio.open_nursery() as nursery:
        if app:
            names: dict[str, JsonValue] = {"adkApp": app_name}
            zid = _app_scope_id(app_name)
            nursery.start_soon(
                _settle, verdicts, "app", _update_state, host, zid, names, "adkAppState", app
            )
        if user:
            names = {"adkApp": app_name, "adkUser": user_id}
            zid = _user_scope_id(app_name, user_id)
            nursery.start_soon(
                _settle, verdicts, "user", _update_state, host, zid, names, "adkUserState", user
            )
    for verdict in verdicts.values():
        verdict.unwrap()


@attrs.define
class _ScopeWrites:
    """One scope's pending deltas, written by one merged write at a time."""

    lock: trio.Lock = attrs.field(factory=trio.Lock)
    pending: list[dict[str, Any]] = attrs.field(factory=list)
    queued: int = 0
    written: int = 0


_scope_writes: weakref.WeakKeyDictionary[SessionHost, dict[str, _ScopeWrites]] = (
    weakref.WeakKeyDictionary()
)


async def _update_state(
    host: SessionHost, zid: str, names: dict[str, JsonValue], key: str, delta: dict[str, Any]
) -> None:
    """Merge ``delta`` into the scope ``zid``'s stored state; returns once a write holds it.

    The deltas that arrive while a write is under way are merged into the
    next one (one commit for many concurrent updates).
    """
    by_scope = _scope_writes.get(host)
    if by_scope is None:
        by_scope = _scope_writes[host] = {}
    writes = by_scope.get(zid)
    if writes is None:
        writes = by_scope[zid] = _ScopeWrites()
    writes.pending.append(delta)
    writes.queued += 1
    mine = writes.queued
    try:
        async with writes.lock:
            if writes.written >= mine:
                return  # an earlier write held this delta
            batch, writes.pending = writes.pending, []
            upto = writes.queued
            merged: dict[str, Any] = {}
            for one in batch:
                merged.update(one)
            try:
                await _merge_state(host, zid, names, key, merged)
            except BaseException:
                # The other callers' deltas go back for the waiters behind this one.
                writes.pending[:0] = [one for one in batch if one is not delta]
                raise
            writes.written = upto
    finally:
        idle = not writes.pending and not writes.lock.locked()
        if idle and writes.lock.statistics().tasks_waiting == 0 and by_scope.get(zid) is writes:
            del by_scope[zid]  # nobody uses it: one entry per scope in use, not per scope ever


async def _merge_state(
    host: SessionHost, zid: str, names: dict[str, JsonValue], key: str, delta: dict[str, Any]
) -> None:
    """``metadata[key] |= delta`` in the store, atomically against other processes.

    Read with its ``rev``, merged, and saved only while the store still
    holds that ``rev``; when another writer got there first the merge is
    made again on what it stored, so no writer's keys are lost. A missing
    scope session is created holding ``delta``.
    """
    store = cast(FullSessionStore, host.store)
    versioned = cast(VersionedStore, store)
    for attempt in range(STALE_ATTEMPTS):
        got = await versioned.load_versioned(zid)
        if got is None:
            try:
                await host.create_session(id=zid, metadata={**names, key: delta})
            except ConflictError:
                continue  # created meanwhile: merge into it at once
            return
        data, rev = got
        current = data.metadata.get(key)
        merged = {**(current if isinstance(current, dict) else {}), **delta}
        metadata = {**data.metadata, key: merged}
        try:
            await store.save_meta(  # type: ignore[call-arg]  # a VersionedStore's keyword
                msgspec.structs.replace(data, metadata=metadata),
                SaveMetaOptions(meta_keys=(key,)),
                expected_rev=rev,
            )
        except StoreStaleError:
            if attempt == STALE_ATTEMPTS - 1:
                raise
            await back_off(attempt)
        else:
            return
    raise ConflictError(
        f"scope session {preview(zid)} could not be written: {STALE_ATTEMPTS} races lost"
    )


async def _checkpoint(session: Session, state: dict[str, Any], count: int) -> None:
    """Store the session-scoped state folded over the first ``count`` turns."""
    await session.set_meta("adkState", state)
    await session.set_meta("adkStateTurns", count)
    await session.save_meta_keys(["adkState", "adkStateTurns"])


async def _create(
    host: SessionHost,
    app_name: str,
    user_id: str,
    session_id: str,
    own: dict[str, Any],
    app: dict[str, Any],
    user: dict[str, Any],
    now: float,
) -> tuple[bytes, str] | None:
    metadata: dict[str, JsonValue] = {
        "adkApp": app_name,
        "adkUser": user_id,
        "adkSessionId": session_id,
        "adkState": own,
        "adkStateTurns": 0,
        "adkCreateTime": now,
    }
    try:
        session = await host.create_session(
            id=_session_id(app_name, user_id, session_id), agent_id=app_name, metadata=metadata
        )
    except ConflictError:
        return None
    _keep(host, session)
    await _update_scopes(host, app_name, user_id, app, user)
    return _merged(*await _scopes(host, app_name, user_id), own), _marker(session)


async def _read(
    host: SessionHost,
    app_name: str,
    user_id: str,
    session_id: str,
    recent: int | None,
    after: float | None,
) -> tuple[bytes, bytes, float, str] | None:
    scopes: dict[str, outcome.Outcome[tuple[dict[str, Any], dict[str, Any]]]] = {}
    async with open_service_nursery() as nursery:  # the three reads at once
        nursery.start_soon(_settle, scopes, "scopes", _scopes, host, app_name, user_id)
        session = await _adk_session(host, app_name, user_id, session_id)
    if session is None:
        return None
    events: list[Any] = []
    if recent != 0:
        for turn in session.turns:
            event = turn.metadata.get(EVENT_KEY) if turn.metadata else None
            if isinstance(event, dict) and (after is None or event.get("timestamp", 0) >= after):
                events.append(_event_of(turn))
        if recent is not None:
            events = events[-recent:]
    merged = _merged(*scopes["scopes"].unwrap(), _session_state(session))
    return merged, encode(events), _last_update(session), _marker(session)


async def _list(
    host: SessionHost, app_name: str, user_id: str | None
) -> list[tuple[str, str, bytes, float]]:
    store = cast(FullSessionStore, host.store)
    found: list[tuple[str, Mapping[str, Any], int]] = []
    if "list_meta" in _capabilities(host):
        for row in await store.list_meta(SessionFilter(agent_id=app_name)):
            found.append((row.id, row.metadata, row.turn_count))
    else:
        for zid in await store.list(SessionFilter(agent_id=app_name)):
            data = await store.load(zid)
            if data is not None:
                found.append((zid, data.metadata, len(data.turns)))
    app_state = await _scope_state(host, _app_scope_id(app_name), "adkAppState")
    user_states: dict[str, dict[str, Any]] = {}
    rows: list[tuple[str, str, bytes, float]] = []
    for zid, meta, count in found:
        session_id, user = meta.get("adkSessionId"), meta.get("adkUser")
        if not isinstance(session_id, str) or not isinstance(user, str):
            continue
        if user_id not in (None, user) or _session_id(app_name, user, session_id) != zid:
            continue
        if user not in user_states:
            scope = _user_scope_id(app_name, user)
            user_states[user] = await _scope_state(host, scope, "adkUserState")
        # The state checkpoint, then the deltas of the turns after it; the last turn's time.
        folded = cast(int, meta.get("adkStateTurns") or 0)
        state = dict(cast(dict[str, Any], meta.get("adkState") or {}))
        last_update = cast(float, meta.get("adkCreateTime") or 0.0)
        if count:
            start = min(folded, count - 1)
            tail = await store.get_turns(zid, start)
            _fold(state, tail[folded - start :])
            for turn in reversed(tail):
                event = turn.metadata.get(EVENT_KEY) if turn.metadata else None
                if isinstance(event, dict):
                    last_update = cast(float, event.get("timestamp", last_update))
                    break
        rows.append((session_id, user, _merged(app_state, user_states[user], state), last_update))
    return rows


async def _delete(host: SessionHost, app_name: str, user_id: str, session_id: str) -> None:
    session = await _adk_session(host, app_name, user_id, session_id)
    if session is not None:
        _kept[host].pop(session.id, None)
        await host.delete_session(session.id)


async def _user_state(host: SessionHost, app_name: str, user_id: str) -> bytes:
    state = await _scope_state(host, _user_scope_id(app_name, user_id), "adkUserState")
    return encode(state)


def _placed(session: Session, turn_id: str, before: tuple[int, int, str | None]) -> bool:
    """Whether the session holds ``turn_id`` right after the turns it held ``before``."""
    created_at, count, last_id = before
    turns = session.turns
    return (
        session.created_at == created_at
        and len(turns) > count
        and turns[count].id == turn_id
        and (count == 0 or turns[count - 1].id == last_id)
    )


def _without(turn_id: str, history: SessionHistory) -> SessionHistory | None:
    """``history`` without the turn ``turn_id`` (``None``: it holds no such turn)."""
    turns = tuple(turn for turn in history.turns if turn.id != turn_id)
    if len(turns) == len(history.turns):
        return None
    return msgspec.structs.replace(history, turns=turns)


async def _append(
    host: SessionHost,
    app_name: str,
    user_id: str,
    session_id: str,
    append: _Append,
    seen: tuple[str | None, float, str | None],
) -> str:
    marker, last_update, last_event_id = seen
    # A session read through this service appends over the handle it was read from,
    # without reading the store first: when the caller's read is still this handle's
    # view, the append itself finds out whether another writer came in between (below).
    session = _held(host, _session_id(app_name, user_id, session_id))
    if session is None or marker is None or marker != _marker(session):
        session = await _adk_session(host, app_name, user_id, session_id)
        if session is None:
            raise SessionNotFoundError(f"Session {session_id} not found.")
    async with _lock_for(session):
        if marker is not None:
            if marker != _marker(session):
                raise StaleSessionError(_STALE)
        elif _last_update(session) > last_update:
            # A session object not read through this service: stale unless its last
            # event is the stored last event, as ADK's database service judges it.
            stored = _last_event(session)
            if (stored.get("id") if stored is not None else None) != last_event_id:
                raise StaleSessionError(_STALE)
        turns = session.turns
        before = (session.created_at, len(turns), turns[-1].id if turns else None)
        pairing = _pairing_for(session)
        content = pairing.checked(append.blocks)
        # A block the pairing rule turned into text no longer holds its part exactly.
        exact = {i: j for i, j in append.exact.items() if content[j] is append.blocks[j]}
        turn = SessionTurn(
            id=_turn_id(session),
            role="assistant" if append.role == "assistant" else "user",
            content=content,
            created_at=max(int(append.data.get("timestamp", 0) * 1000), 0),
            usage=append.usage,
            metadata={EVENT_KEY: _stored_once(append.data, exact)},
        )
        # The turn and, when one is due, a state checkpoint of the turns before it (valid
        # whether or not the turn lands): written at once, so they share the store's commits.
        verdicts: dict[str, outcome.Outcome[None]] = {}
        folded = cast(int, session.metadata.get("adkStateTurns") or 0)
        if len(session.turns) - folded >= CHECKPOINT_EVERY:
            state = _session_state(session)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_settle, verdicts, "turn", session.append_turns, [turn])
                nursery.start_soon(
                    _settle, verdicts, "checkpoint", _checkpoint, session, state, len(turns)
                )
        else:
            await _settle(verdicts, "turn", session.append_turns, [turn])
        try:
            verdicts["turn"].unwrap()
        except ZidaneNotFound as exc:
            raise SessionNotFoundError(f"Session {session_id} not found.") from exc
        except ConflictError as exc:
            # Another writer appended a turn at this turn's place first (its id is the
            # place's): nothing was written, as ADK's database service refuses it.
            raise StaleSessionError(_STALE) from exc
        if not _placed(session, turn.id, before):
            # Another writer (not through this service: an edit, a delete and re-create)
            # got in between: the turn does not follow what the caller read. Take it out
            # again, in one atomic step of the store, and refuse the event.
            await session.mutate_history(functools.partial(_without, turn.id))
            raise StaleSessionError(_STALE)
        pairing.extend([turn])
        # A checkpoint that lost to another writer or a deleted session is simply due
        # again with the next event: readers fold the events after the stored one.
        with contextlib.suppress(ConflictError, ZidaneNotFound):
            verdicts.get("checkpoint", outcome.Value(None)).unwrap()
        # The scope deltas once the event is stored: a crash in between leaves them
        # unapplied, never applied for an event that was refused.
        if append.app or append.user:
            await _update_scopes(host, app_name, user_id, append.app, append.user)
        return _marker(session)
