"""The trio side of ``integrations.adk``: session handles, create, read, list, delete, append."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, cast

import attrs
import msgspec
import outcome
import trio
from google.adk.errors import StaleSessionError
from google.adk.errors.session_not_found_error import SessionNotFoundError

from .._nursery import open_service_nursery
from ..actors import Session, SessionHost
from ..errors import ActorClosed, ConflictError
from ..errors import SessionNotFoundError as ZidaneNotFound
from ..model import (
    AppendTurnsOptions,
    JsonValue,
    RunStatus,
    SessionContentBlock,
    SessionFilter,
    SessionHistory,
    SessionTurn,
    TurnRole,
    TurnUsage,
    encode,
    is_column_text,
)
from ..model._turn_ids import same_json
from ..stores._protocol import FullSessionStore
from ._adk_events import (
    _STALE,
    CHECKPOINT_EVERY,
    EVENT_KEY,
    _app_scope_id,
    _event_of,
    _fold,
    _last_event,
    _last_update,
    _marker,
    _merged,
    _meta,
    _pairing_for,
    _runs,
    _session_id,
    _session_state,
    _stored_once,
    _turn_id,
    _turns,
    _user_scope_id,
)
from ._adk_runs import ended, event_runs, invocation_runs
from ._adk_state import (
    _capabilities,
    _merge_state,
    _scope_state,
    _scopes,
    _settle,
    _update_scopes,
)
from ._shared import SessionLocks


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
    final: bool = False  # a final response: its invocation is over
    error: str | None = None  # an error event's code and message
    trace: dict[str, str] | None = None  # the OpenTelemetry span it was appended in


# -- the trio side -------------------------------------------------------------

_ROLES: Final[dict[str, TurnRole]] = {"assistant": "assistant", "command": "command"}
"""The turn roles ``_readable`` names besides ``user``."""

_lock_for: Final = SessionLocks()
"""Each ADK session's lock for its appends (in the trio thread)."""

AGENTS_KEY: Final = "adkAgents"
"""The app scope session's ``{agent: true}`` of the agents its sessions are named after."""

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
    meta = _meta(session)
    if (
        meta.get("adkApp") != app_name
        or meta.get("adkUser") != user_id
        or meta.get("adkSessionId") != session_id
    ):
        return None
    return session


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
        for turn in _turns(session):
            event = turn.metadata.get(EVENT_KEY) if turn.metadata else None
            if isinstance(event, dict) and (after is None or event.get("timestamp", 0) >= after):
                events.append(_event_of(turn))
        if recent is not None:
            events = events[-recent:]
    merged = _merged(*scopes["scopes"].unwrap(), _session_state(session))
    return merged, encode(events), _last_update(session), _marker(session)


async def _name_agent(host: SessionHost, session: Session, app_name: str, agent: str) -> None:
    """Name the session after its first agent (ADK's root agent; the app name until then).

    The agent goes in the app's list (``adkAgents``) first, so that
    ``list_sessions`` finds the session by its ``agentId`` at every moment.
    """
    if session.agent_id != app_name or agent in ("user", app_name) or not is_column_text(agent):
        return
    known = await _scope_state(host, _app_scope_id(app_name), AGENTS_KEY)
    if agent not in known:
        await _merge_state(
            host, _app_scope_id(app_name), {"adkApp": app_name}, AGENTS_KEY, {agent: True}
        )
    await session.set_agent_id(agent)
    await session.save_meta_keys(())


async def _list(
    host: SessionHost, app_name: str, user_id: str | None
) -> list[tuple[str, str, bytes, float]]:
    store = cast(FullSessionStore, host.store)
    found: dict[str, tuple[Mapping[str, Any], int]] = {}
    agents = [app_name, *await _scope_state(host, _app_scope_id(app_name), AGENTS_KEY)]
    for agent in dict.fromkeys(agents):  # the app's sessions, each named after the app or an agent
        if "list_meta" in _capabilities(host):
            for row in await store.list_meta(SessionFilter(agent_id=agent)):
                found[row.id] = (row.metadata, row.turn_count)
        else:
            for zid in await store.list(SessionFilter(agent_id=agent)):
                data = await store.load(zid)
                if data is not None:
                    found[zid] = (data.metadata, len(data.turns))
    app_state = await _scope_state(host, _app_scope_id(app_name), "adkAppState")
    user_states: dict[str, dict[str, Any]] = {}
    rows: list[tuple[str, str, bytes, float]] = []
    for zid, (meta, count) in found.items():
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


def _holds(session: Session, data: dict[str, Any]) -> bool:
    """Whether ``session`` already stores the event ``data`` (same id, same JSON: ``==``
    would take a ``1.0`` for a ``1``, and the read back would answer the stored one)."""
    event_id = data.get("id")
    for turn in reversed(_turns(session)):
        stored = turn.metadata.get(EVENT_KEY) if turn.metadata else None
        if (
            isinstance(stored, dict)
            and stored.get("id") == event_id
            and same_json(_event_of(turn), data)
        ):
            return True
    return False


def _placed(session: Session, turn_id: str, before: tuple[int, int, str | None]) -> bool:
    """Whether the session holds ``turn_id`` right after the turns it held ``before``."""
    created_at, count, last_id = before
    turns = _turns(session)
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
) -> str | None:
    """Store the event; its session's new marker (``None``: an equal event was stored)."""
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
        if _holds(session, append.data):
            # The same event again (a retry): stored once, as ADK's in-memory service does.
            return None
        turns = _turns(session)
        before = (session.created_at, len(turns), turns[-1].id if turns else None)
        pairing = _pairing_for(session)
        content = pairing.checked(append.blocks)
        # A block the pairing rule turned into text no longer holds its part exactly.
        exact = {i: j for i, j in append.exact.items() if content[j] is append.blocks[j]}
        turn_id, at = _turn_id(session), max(int(append.data.get("timestamp", 0) * 1000), 0)
        run_id, records = event_runs(
            _runs(session),
            append.data,
            turn_id=turn_id,
            at=at,
            usage=append.usage,
            final=append.final,
            error=append.error,
            trace=append.trace,
        )
        turn = SessionTurn(
            id=turn_id,
            role=_ROLES.get(append.role, "user"),
            content=content,
            created_at=at,
            usage=append.usage,
            run_id=run_id,
            metadata={EVENT_KEY: _stored_once(append.data, exact)},
        )
        options = AppendTurnsOptions(run=records[0]) if records else None
        # The turn and, when one is due, a state checkpoint of the turns before it (valid
        # whether or not the turn lands): written at once, so they share the store's commits.
        verdicts: dict[str, outcome.Outcome[None]] = {}
        folded = cast(int, _meta(session).get("adkStateTurns") or 0)
        if len(_turns(session)) - folded >= CHECKPOINT_EVERY:
            state = _session_state(session)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_settle, verdicts, "turn", session.append_turns, [turn], options)
                nursery.start_soon(
                    _settle, verdicts, "checkpoint", _checkpoint, session, state, len(turns)
                )
        else:
            await _settle(verdicts, "turn", session.append_turns, [turn], options)
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
        for record in records[1:]:  # the runs this event ended or named besides its own
            await session.update_run(record)
        author = append.data.get("author")
        if isinstance(author, str):
            with contextlib.suppress(ConflictError, ZidaneNotFound):  # due again next event
                await _name_agent(host, session, app_name, author)
        if append.own:
            # The state shown with its keys as soon as an event changes it.
            with contextlib.suppress(ConflictError, ZidaneNotFound):
                await _checkpoint(session, _session_state(session), len(_turns(session)))
        # A checkpoint that lost to another writer or a deleted session is simply due
        # again with the next event: readers fold the events after the stored one.
        with contextlib.suppress(ConflictError, ZidaneNotFound):
            verdicts.get("checkpoint", outcome.Value(None)).unwrap()
        # The scope deltas once the event is stored: a crash in between leaves them
        # unapplied, never applied for an event that was refused.
        if append.app or append.user:
            await _update_scopes(host, app_name, user_id, append.app, append.user)
        return _marker(session)


async def _end_invocation(
    host: SessionHost,
    app_name: str,
    user_id: str,
    session_id: str,
    invocation_id: str,
    status: RunStatus,
    error: str | None,
    at: int,
) -> None:
    """End the runs of an invocation still running as ``status`` (the plugin's word)."""
    session = await _adk_session(host, app_name, user_id, session_id)
    if session is None:
        return
    async with _lock_for(session):
        for run in invocation_runs(_runs(session), invocation_id):
            if run.status == "running":
                await session.update_run(ended(run, status, at, error))
