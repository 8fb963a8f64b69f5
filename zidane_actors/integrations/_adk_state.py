"""``app:``/``user:`` scope state for ``integrations.adk``: one metadata entry per state key."""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import attrs
import outcome
import trio

from ..actors import SessionHost
from ..errors import ConflictError
from ..model import (
    JsonValue,
    SessionMetaRow,
)
from ..stores._protocol import FullSessionStore, StoreWrite, store_capabilities
from ._adk_events import (
    _app_scope_id,
    _user_scope_id,
)

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
    """The state the entries ``KEY:NAME`` of ``meta`` hold, over a whole ``meta[KEY]``.

    ``meta[KEY]`` holds the state as written before its keys had entries
    of their own; an entry is written later, so it wins.
    """
    if not meta:
        return {}
    whole = meta.get(key)
    state = dict(whole) if isinstance(whole, dict) else {}
    prefix = f"{key}:"
    for name, value in meta.items():
        if name.startswith(prefix):
            state[name[len(prefix) :]] = value
    return state


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
    """``delta`` merged into the scope ``zid``'s state in the store, key by key, atomically.

    Each state key is a metadata entry of its own (``KEY:NAME``), so a delta
    is one ``patch_meta``: the store sets those entries in one atomic step
    and other processes' keys stay as they are, with nothing read first and
    no retry (the last writer of a key wins). A missing scope session is
    created holding the delta.
    """
    patch: dict[str, JsonValue] = {f"{key}:{name}": value for name, value in delta.items()}
    store = cast(FullSessionStore, host.store)
    rev = await store.patch_meta(zid, patch)
    if rev is not None and rev.after != 0:
        return
    try:
        await host.create_session(id=zid, metadata={**names, **patch})
    except ConflictError:  # created meanwhile: merged into it
        await store.patch_meta(zid, patch)
