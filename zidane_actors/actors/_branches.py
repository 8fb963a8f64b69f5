"""Branches of a session: continue it from an earlier turn, keeping the turns it leaves.

A branch is two writes, made in this order. First the session's head as the
store holds it, at the rev its memory reflects, is forked into an *archive*
session (``branchOf`` in its metadata). Then the session's history is cut
after the branch point and the archive listed under
:data:`~zidane_actors.model.BRANCHES_KEY`, as one save conditional on that
same rev. When another writer moved the session in between, the save is
refused, the archive is deleted, memory takes the store's state and
:class:`~zidane_actors.errors.StaleSessionError` is raised: one of two hosts
branching at once wins, and no archive of the loser stays behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import attrs
import msgspec

from ..errors import (
    ConflictError,
    NoStoreError,
    SessionNotFoundError,
    StaleSessionError,
    ValidationError,
)
from ..model import (
    BRANCH_OF_KEY,
    BRANCHES_KEY,
    Branch,
    SessionData,
    SessionHistory,
    branch_entry,
    branch_history,
    branches_of,
    new_id,
    preview,
    restored_history,
    turn_index,
    validate_id,
)
from ..stores._forks import fork_session
from ..stores._protocol import (
    FullSessionStore,
    SessionStore,
    VersionedStore,
    is_versioned,
    stale,
    store_capabilities,
)
from ._commands import _SessionCommand

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["delete_archives", "generated_session_id", "stored_metadata"]


async def generated_session_id(store: SessionStore | None, caps: frozenset[str]) -> str:
    """A new session id: the store's ``generate_session_id`` when it has one, else a UUID4."""
    if store is not None and "generate_session_id" in caps:
        return await cast(FullSessionStore, store).generate_session_id()
    return new_id()


@attrs.frozen(eq=False)
class _Branch(_SessionCommand[Branch]):
    at: str

    async def apply(self, session: Session) -> Branch:
        return await _branch(session, self.at)


@attrs.frozen(eq=False)
class _RestoreBranch(_SessionCommand[Branch | None]):
    branch_session_id: str

    async def apply(self, session: Session) -> Branch | None:
        return await _restore(session, self.branch_session_id)


async def _head(session: Session) -> tuple[SessionStore, SessionData, int | None]:
    """The session as the store holds it, at the rev memory reflects (else folded, stale)."""
    store = session._store
    if store is None:
        raise NoStoreError(f"session {session.id!r} has no store to branch in")
    if session._bulk:
        raise ConflictError(f"session {session.id!r} holds an unsaved set_turns: save it first")
    if session._stale:  # an own write moved the rev by a step it did not say: fold it in
        await session._fold()
    found: tuple[SessionData, int | None] | None
    if is_versioned(session._caps):
        found = await cast(VersionedStore, store).load_versioned(session.id)
        expected = session._rev
        if found is not None and expected is not None and found[1] != expected:
            await session._fold()
            raise stale(session.id, expected, found[1])
    else:
        data = await store.load(session.id)
        found = None if data is None else (data, None)
    if found is None:
        raise SessionNotFoundError(f"session {session.id!r} is not in the store")
    return store, found[0], found[1]


async def _archive(session: Session, store: SessionStore, rev: int | None, now: int) -> str:
    """Fork the stored head into a new archive session naming ``session``; its id."""
    archive_id = await generated_session_id(store, session._caps)
    try:
        await fork_session(store, session.id, archive_id, at=None, created_at=now, expected_rev=rev)
    except StaleSessionError:  # another writer moved the session since it was read
        await session._fold()
        raise
    mark = {BRANCH_OF_KEY: session.id}
    try:
        if "patch_meta" in session._caps:
            await cast(FullSessionStore, store).patch_meta(archive_id, mark)
        else:
            fork = await store.load(archive_id)
            assert fork is not None  # just created, and nobody else knows its id
            await store.save(msgspec.structs.replace(fork, metadata={**fork.metadata, **mark}))
    except BaseException:
        await store.delete(archive_id)
        raise
    return archive_id


async def _replace(
    session: Session,
    store: SessionStore,
    rev: int | None,
    head: SessionData,
    history: SessionHistory,
    listed: Callable[[list[Any]], list[Any]],
    made: str | None,
    now: int,
) -> None:
    """Save ``head`` with ``history`` and its branch list edited by ``listed``, at ``rev``.

    Refused (another writer moved the session): the archive ``made`` is
    deleted, memory folds the store's state in, and the error propagates.
    """
    held = head.metadata.get(BRANCHES_KEY)
    entries = listed(list(held) if isinstance(held, list) else [])
    data = msgspec.structs.replace(
        head,
        turns=history.turns,
        runs=history.runs,
        metadata={**head.metadata, BRANCHES_KEY: entries},
        updated_at=now,
    )
    try:
        if rev is None:
            await store.save(data)
        else:
            await store.save(data, expected_rev=rev)  # type: ignore[call-arg]
    except BaseException as exc:
        if made is not None:
            await store.delete(made)
        if isinstance(exc, StaleSessionError):
            await session._fold()
        raise
    await _take_stored(session)


async def _take_stored(session: Session) -> None:
    """Memory becomes the store's state (unsaved metadata keys kept), as after any edit."""
    if session._rev is not None:
        session._stale = True
        await session._fold()
        return
    assert session._store is not None
    stored = await session._store.load(session.id)
    if stored is not None:
        metadata = {**stored.metadata}
        for key in session._changed:
            if key in session._data.metadata:
                metadata[key] = session._data.metadata[key]
        session._commit(msgspec.structs.replace(stored, metadata=metadata))


async def _branch(session: Session, at: str) -> Branch:
    turn_index(session._data.turns, at)  # located, nothing sent
    store, head, rev = await _head(session)
    k = turn_index(head.turns, at)
    now = session._now()
    archive_id = await _archive(session, store, rev, now)
    entry = Branch(archive_id, at, now, len(head.turns) - k - 1)
    cut = branch_history(SessionHistory(head.turns, head.runs), at)
    await _replace(
        session,
        store,
        rev,
        head,
        cut,
        lambda entries: [*entries, branch_entry(entry)],
        archive_id,
        now,
    )
    return entry


async def _restore(session: Session, branch_session_id: str) -> Branch | None:
    validate_id(branch_session_id, what="branch session id")
    store, head, rev = await _head(session)
    listed = [b for b in branches_of(head.metadata) if b.session_id == branch_session_id]
    if not listed:
        raise ValidationError(
            f"{preview(branch_session_id)} is no branch of session {preview(session.id)}",
            path="$.branchSessionId",
        )
    at = listed[-1].turn_id
    archive = await store.load(branch_session_id)
    if archive is None:
        raise SessionNotFoundError(f"the branch session {branch_session_id!r} is not in the store")
    history = SessionHistory(head.turns, head.runs)
    restored = restored_history(history, SessionHistory(archive.turns, archive.runs), at)
    if restored.turns == head.turns:  # its turns are the session's already: nothing to do
        return None
    left = len(head.turns) - turn_index(head.turns, at) - 1
    now = session._now()
    entry = None
    made = None
    if left:
        made = await _archive(session, store, rev, now)
        entry = Branch(made, at, now, left)
    await _replace(
        session,
        store,
        rev,
        head,
        restored,
        lambda entries: entries if entry is None else [*entries, branch_entry(entry)],
        made,
        now,
    )
    return entry


async def delete_archives(store: SessionStore, session_id: str, listed: tuple[Branch, ...]) -> None:
    """Delete the ``listed`` archives of ``session_id`` (its branches go with it).

    Only a session whose ``branchOf`` names ``session_id`` is deleted: the list
    is metadata, and a listed id naming any other session leaves it alone.
    """
    for entry in listed:
        metadata = await stored_metadata(store, entry.session_id)
        if metadata is not None and metadata.get(BRANCH_OF_KEY) == session_id:
            await store.delete(entry.session_id)


async def stored_metadata(store: SessionStore, session_id: str) -> dict[str, Any] | None:
    """A stored session's metadata (its header row when the store has ``get_meta``)."""
    if "get_meta" in store_capabilities(store):
        row = await cast(FullSessionStore, store).get_meta(session_id)
        return None if row is None else row.metadata
    data = await store.load(session_id)
    return None if data is None else data.metadata
