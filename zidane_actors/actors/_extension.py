"""Extension state: small JSON values extensions keep in a session's metadata.

Values live at ``metadata["extensions"][extension][key]``
(:data:`EXTENSION_STATE_METADATA_KEY`). The session an extension works on is
bound per task with :func:`with_extension_session` (a ``contextvars``
binding, so concurrent trio tasks never see each other's session).
"""

from __future__ import annotations

import contextvars
import inspect
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TypeVar, overload

import msgspec

from ..errors import ExtensionStateError, StaleSessionError
from ..model import JsonValue, check_json, encode, parse_json, preview
from ._contention import STALE_ATTEMPTS, back_off
from ._session import Session

__all__ = [
    "EXTENSION_KEY_PATTERN",
    "EXTENSION_NAME_PATTERN",
    "EXTENSION_STATE_ITEM_MAX_BYTES",
    "EXTENSION_STATE_METADATA_KEY",
    "EXTENSION_STATE_TOTAL_MAX_BYTES",
    "bind_extension_session",
    "current_extension_session",
    "delete_extension_session_state",
    "get_extension_session_state",
    "set_extension_session_state",
    "with_extension_session",
]

T = TypeVar("T")

EXTENSION_STATE_METADATA_KEY: Final = "extensions"
"""The metadata key holding every extension's namespace."""

EXTENSION_STATE_ITEM_MAX_BYTES: Final = 16 * 1024
"""Largest JSON encoding of one stored value, in bytes."""

EXTENSION_STATE_TOTAL_MAX_BYTES: Final = 64 * 1024
"""Largest JSON encoding of all extension state of one session, in bytes."""

EXTENSION_NAME_PATTERN: Final = r"[a-z0-9][a-z0-9_.-]{0,63}"
"""Safe extension names: lowercase letters, digits, ``_ . -``, 1-64 characters."""

EXTENSION_KEY_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
"""Safe keys: letters, digits, ``_ . -``, 1-128 characters, not starting with a symbol."""

_NAME = re.compile(EXTENSION_NAME_PATTERN)
_KEY = re.compile(EXTENSION_KEY_PATTERN)

_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "zidane_actors.extension_session", default=None
)


def current_extension_session() -> Session | None:
    """The session bound for the current task, or ``None``."""
    return _current.get()


@contextmanager
def bind_extension_session(session: Session | None) -> Iterator[Session | None]:
    """Bind ``session`` (``None`` clears the binding) for the ``with`` body."""
    token = _current.set(session)
    try:
        yield session
    finally:
        _current.reset(token)


async def _bound(session: Session | None, awaitable: Awaitable[T]) -> T:
    with bind_extension_session(session):
        return await awaitable


@overload
def with_extension_session(
    session: Session | None, fn: Callable[[], Awaitable[T]]
) -> Awaitable[T]: ...
@overload
def with_extension_session(session: Session | None, fn: Callable[[], T]) -> T: ...
def with_extension_session(session: Session | None, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` with ``session`` bound; for an async ``fn``, answer an awaitable that is.

    The binding covers ``fn``'s whole run, including tasks it spawns, and no
    other task: the caller's own binding is restored afterwards.
    """
    if inspect.iscoroutinefunction(fn):
        return _bound(session, fn())
    with bind_extension_session(session):
        result = fn()
    if inspect.isawaitable(result):
        return _bound(session, result)
    return result


def _safe(extension: object, key: object) -> bool:
    return (
        isinstance(extension, str)
        and isinstance(key, str)
        and _NAME.fullmatch(extension) is not None
        and _KEY.fullmatch(key) is not None
    )


def _check_names(extension: object, key: object) -> None:
    if not isinstance(extension, str) or _NAME.fullmatch(extension) is None:
        raise ExtensionStateError(
            f"extension name {preview(extension)} does not match {EXTENSION_NAME_PATTERN}"
        )
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise ExtensionStateError(f"key {preview(key)} of extension {preview(extension)} is unsafe")


def _namespaces(metadata: Mapping[str, Any]) -> dict[str, Any]:
    state = metadata.get(EXTENSION_STATE_METADATA_KEY)
    return state if isinstance(state, dict) else {}


async def _read_modify_write(session: Session, update: Callable[[Any], Any]) -> None:
    """Apply ``update`` to the extension state and save it over the rev it was computed from.

    A save that lost to another writer refreshed the session: the update is
    computed again from the stored state, so no other writer's state is lost.
    """
    for attempt in range(STALE_ATTEMPTS):
        await session._update_meta(EXTENSION_STATE_METADATA_KEY, update)
        if session.store is None:
            return
        try:
            # Not retried as is: the value was computed from the state memory held.
            full = await session._save((EXTENSION_STATE_METADATA_KEY,), retry=False)
        except StaleSessionError:
            if attempt == STALE_ATTEMPTS - 1:
                raise
            await back_off(attempt)
        else:
            if full:  # a store without save_meta: it was a save()
                await session._run_saved_listeners()
            return


def get_extension_session_state(
    session: Session | None, extension: str, key: str
) -> JsonValue | None:
    """A copy of the stored value; ``None`` when absent, without a session, or for unsafe names."""
    if session is None or not _safe(extension, key):
        return None
    namespace = _namespaces(session.metadata).get(extension)
    if not isinstance(namespace, dict) or key not in namespace:
        return None
    return parse_json(encode(namespace[key]))


async def set_extension_session_state(
    session: Session | None, extension: str, key: str, value: JsonValue
) -> None:
    """Store a copy of ``value`` and save it (``save_meta_keys``) when the session has a store.

    Raises :class:`ExtensionStateError` for an unsafe name, a non-JSON value,
    a value over :data:`EXTENSION_STATE_ITEM_MAX_BYTES` or state over
    :data:`EXTENSION_STATE_TOTAL_MAX_BYTES`. Nothing happens without a session.
    """
    if session is None:
        return
    _check_names(extension, key)
    check_json(
        value,
        what=f"{extension}.{key}: value",
        path=f'$.metadata.{EXTENSION_STATE_METADATA_KEY}["{extension}"]["{key}"]',
        depth=3,
        error=ExtensionStateError,
    )
    try:
        encoded = encode(value)
    except (TypeError, msgspec.EncodeError) as exc:
        raise ExtensionStateError(f"{extension}.{key}: value is not JSON: {exc}") from None
    if len(encoded) > EXTENSION_STATE_ITEM_MAX_BYTES:
        raise ExtensionStateError(
            f"{extension}.{key}: value is {len(encoded)} bytes as JSON, "
            f"over the {EXTENSION_STATE_ITEM_MAX_BYTES}-byte limit"
        )
    copy = parse_json(encoded)

    def update(current: Any) -> Any:
        state = dict(current) if isinstance(current, dict) else {}
        namespace = state.get(extension)
        state[extension] = {**(namespace if isinstance(namespace, dict) else {}), key: copy}
        total = len(encode(state))
        if total > EXTENSION_STATE_TOTAL_MAX_BYTES:
            raise ExtensionStateError(
                f"{extension}.{key}: extension state would be {total} bytes as JSON, "
                f"over the {EXTENSION_STATE_TOTAL_MAX_BYTES}-byte limit"
            )
        return state

    await _read_modify_write(session, update)


async def delete_extension_session_state(session: Session | None, extension: str, key: str) -> None:
    """Remove one value and save when the session has a store; a no-op when it is absent."""
    if session is None or not _safe(extension, key):
        return
    namespace = _namespaces(session.metadata).get(extension)
    if not isinstance(namespace, dict) or key not in namespace:
        return

    def update(current: Any) -> Any:
        state = dict(current) if isinstance(current, dict) else {}
        remaining = {k: v for k, v in state.get(extension, {}).items() if k != key}
        if remaining:
            state[extension] = remaining
        else:
            state.pop(extension, None)
        return state if state else msgspec.UNSET

    await _read_modify_write(session, update)
