"""Forks on any store: the store's own ``fork_session`` / ``list_forks``, or the generic one.

The generic fork reads the source in one snapshot (``load_versioned``) and
creates the fork with :func:`~zidane_actors.model.fork_document` as a save
conditional on the new id being absent: the same answers a native fork
gives, at the cost of a copy. :func:`fork_into` writes the fork to another
store (a file-map store holds one session: its forks live in other maps).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from ..errors import (
    ConflictError,
    SessionNotFoundError,
    StaleSessionError,
    UnsupportedOperationError,
)
from ..model import (
    SessionData,
    check_fork_id,
    fork_document,
    forked_from,
    preview,
    validate_id,
)
from ._protocol import (
    FullSessionStore,
    Revision,
    SessionStore,
    VersionedStore,
    is_versioned,
    stale,
    store_capabilities,
)

__all__ = ["fork_into", "fork_session", "list_forks"]


async def fork_session(
    store: SessionStore,
    source_id: str,
    new_id: str,
    *,
    at: str | None,
    created_at: int,
    expected_rev: int | None = None,
) -> Revision | None:
    """``store.fork_session`` when the store has it, else :func:`fork_into` the same store.

    Both ids are checked first, whichever store answers (see ``check_fork_id``).
    """
    validate_id(source_id)
    check_fork_id(new_id)
    if "fork_session" in store_capabilities(store):
        return await cast(FullSessionStore, store).fork_session(
            source_id, new_id, at=at, created_at=created_at, expected_rev=expected_rev
        )
    return await fork_into(
        store, store, source_id, new_id, at=at, created_at=created_at, expected_rev=expected_rev
    )


async def fork_into(
    source: SessionStore,
    target: SessionStore,
    source_id: str,
    new_id: str,
    *,
    at: str | None,
    created_at: int,
    expected_rev: int | None = None,
) -> Revision | None:
    """Create in ``target`` the fork of ``source``'s session ``source_id`` (generic rule).

    Errors as ``fork_session``'s: :class:`SessionNotFoundError` without a
    source, :class:`StaleSessionError` when its rev is not ``expected_rev``,
    :class:`ConflictError` when ``target`` holds ``new_id``. ``expected_rev``
    needs a versioned source (else :class:`UnsupportedOperationError`).
    """
    validate_id(source_id)
    check_fork_id(new_id)
    data, rev = await _snapshot(source, source_id, versioned=expected_rev is not None)
    if expected_rev is not None and rev != expected_rev:
        raise stale(source_id, expected_rev, rev)
    fork = fork_document(data, new_id=new_id, at=at, created_at=created_at)
    return await _create(target, fork)


async def _snapshot(
    store: SessionStore, session_id: str, *, versioned: bool
) -> tuple[SessionData, int | None]:
    caps = store_capabilities(store)
    if is_versioned(caps):
        found = await cast(VersionedStore, store).load_versioned(session_id)
        if found is None:
            raise _not_found(session_id)
        return found
    if versioned:
        raise UnsupportedOperationError("a fork at an expected rev needs a versioned store")
    data = await store.load(session_id)
    if data is None:
        raise _not_found(session_id)
    return data, None


async def _create(store: SessionStore, data: SessionData) -> Revision | None:
    """Save ``data`` only while ``store`` holds no session of its id (else ConflictError)."""
    caps = store_capabilities(store)
    if is_versioned(caps):
        if await cast(VersionedStore, store).get_rev(data.id) is not None:
            raise _taken(data.id)
        try:
            return await store.save(data, expected_rev=0)  # type: ignore[call-arg]
        except StaleSessionError:
            raise _taken(data.id) from None
    if await store.load(data.id) is not None:
        raise _taken(data.id)
    return await store.save(data)


def _not_found(session_id: str) -> SessionNotFoundError:
    return SessionNotFoundError(f"no session {preview(session_id)} to fork")


def _taken(session_id: str) -> ConflictError:
    return ConflictError(f"the store already holds a session {preview(session_id)}")


async def list_forks(store: SessionStore, source_id: str) -> list[str]:
    """``store.list_forks`` when the store has it, else found by reading every header."""
    validate_id(source_id)
    caps = store_capabilities(store)
    if "list_forks" in caps:
        return await cast(FullSessionStore, store).list_forks(source_id)
    found: list[str] = []
    if "list_meta" in caps:
        for row in await cast(FullSessionStore, store).list_meta():
            if _names(row.metadata, source_id):
                found.append(row.id)
    else:
        for session_id in await store.list():
            data = await store.load(session_id)
            if data is not None and _names(data.metadata, source_id):
                found.append(session_id)
    return sorted(found)


def _names(metadata: Mapping[str, Any], source_id: str) -> bool:
    origin = forked_from(metadata)
    return origin is not None and origin.session_id == source_id
