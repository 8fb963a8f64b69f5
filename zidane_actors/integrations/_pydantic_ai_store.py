"""pydantic-ai's ``ConversationStore`` kept in a zidane store: ``ZidaneConversationStore``.

Each conversation is one zidane session (``pydantic-ai:ID``, or
``pydantic-ai=SHA256`` of an id that is not a safe session id). Its turns
are the log of every entry the conversation ever stored, oldest first, each
message as the pydantic-ai door stores it (neutral content, the rest kept
beside it, losslessly) with ``metadata.pydanticAiEntry`` = ``{"id",
"parentId"}`` naming its entry; its runs are the agent runs of those
messages, with their usage. Its record (head, usage, deferred tool
requests, scope, branches, fork origin, title, metadata, revision) is the
session's ``metadata.pydanticAiConversation``, and its title also
``metadata.title``, for the session browser and search.

A save appends, a branch moves the head: the history a conversation leaves
stays in its session. A fork's session is the store's fork of its source's
session through the fork's head (shared on the SQL stores; its entries keep
their ids: the fork and its source share them as the contract sees them),
so every conversation's session reads whole in the browser, and deleting
the source leaves every fork whole.

Every write is conditional on the session's ``rev`` (re-read and re-checked
when another writer came in between). A save that extends a stored
conversation appends its turns, then writes the record while it is still
the revision the save continues (its cost does not grow with the
conversation); creating, branching and forking write record and turns in
one step; a delete first empties the record conditionally, then deletes the
session.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeVar, cast

import msgspec
import pydantic
import trio
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationDetails,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)

from ..actors import SessionHost
from ..actors._contention import STALE_ATTEMPTS, back_off
from ..errors import (
    ConflictError,
    InvalidNameError,
    StaleSessionError,
    UnsupportedOperationError,
    ValidationError,
    ZidaneActorsError,
)
from ..model import (
    AppendTurnsOptions,
    SaveMetaOptions,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionMetaRow,
    SessionRun,
    SessionTurn,
    encode,
    new_id,
    parse_json,
    validate_id,
)
from ..portal._thread import wait_future
from ..stores._forks import fork_session
from ..stores._protocol import (
    FullSessionStore,
    Revision,
    VersionedStore,
    is_versioned,
    store_capabilities,
)
from . import _shared

__all__ = ["ENTRY_KEY", "RECORD_KEY", "ZidaneConversationStore"]

RECORD_KEY: Final = "pydanticAiConversation"
"""The session metadata key of a conversation's record (``null`` while it is being deleted)."""

ENTRY_KEY: Final = "pydanticAiEntry"
"""The turn metadata key naming the entry a turn stores: ``{"id", "parentId"}``."""

CONVERSATION_AGENT: Final = "pydantic-ai"
"""The ``agentId`` of conversation sessions, which lists them in one filtered read."""

KEEP_PLACES: Final = 65_536
"""Entry locations (entry id → session id) a store object remembers, newest use last."""

_RECORD: Final = pydantic.TypeAdapter(ConversationRecord)
_ANY: Final = pydantic.TypeAdapter(Any)
_CAMEL: Final = {
    "conversation_id": "conversationId",
    "head_id": "headId",
    "deferred_tool_requests": "deferredToolRequests",
    "forked_from": "forkedFrom",
    "forked_at": "forkedAt",
    "updated_at": "updatedAt",
    "format_version": "formatVersion",
}
_SNAKE: Final = {camel: snake for snake, camel in _CAMEL.items()}

T = TypeVar("T")


# -- records and entries as stored ----------------------------------------------


def conversation_session_id(conversation_id: str) -> str:
    """The zidane session id of a conversation: readable when safe, else a digest.

    ``pydantic-ai:ID`` when that is a safe id, else ``pydantic-ai=SHA256``
    (a different prefix, so the two forms never meet). Reads check the
    stored ``conversationId``, so a foreign session under the id is no
    conversation.
    """
    try:
        return validate_id(f"{CONVERSATION_AGENT}:{conversation_id}")
    except InvalidNameError:
        digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{CONVERSATION_AGENT}={digest}"


def _dump_record(record: ConversationRecord) -> dict[str, Any]:
    try:
        dumped = _RECORD.dump_python(record, mode="json")
    except (ValueError, TypeError) as exc:
        raise ValidationError(
            f"the conversation record has no JSON form: {exc}", path="$"
        ) from None
    return {_CAMEL.get(key, key): value for key, value in dumped.items()}


def _check_exact(details: ConversationDetails) -> None:
    """Refuse a title or metadata that JSON would not give back as it is."""
    from .pydantic_ai import _first_difference  # the door imports this module

    for key, value in details.items():
        try:
            back = parse_json(encode(_ANY.dump_python(value, mode="json")))
        except (ValueError, TypeError) as exc:
            raise ValidationError(f"this value has no JSON form: {exc}", path=f"$.{key}") from None
        where = _first_difference(value, back, f"$.{key}")
        if where is not None:
            raise ValidationError("this value has no exact JSON form", path=where)


def _load_record(data: Mapping[str, Any]) -> ConversationRecord:
    thawed = cast(dict[str, Any], parse_json(encode(data)))
    return _RECORD.validate_python({_SNAKE.get(key, key): value for key, value in thawed.items()})


_Held: TypeAlias = tuple[str | None, list[SessionTurn]]
"""An entry as a session holds it: its parent's id and its turns."""


class _Foreign:
    """A session under a conversation's id that holds no conversation (another writer's)."""


FOREIGN: Final = _Foreign()


def _record_in(
    meta: Mapping[str, Any] | None, conversation_id: str
) -> ConversationRecord | _Foreign | None:
    """The record in a session's metadata; ``None`` when there is none to keep (no
    session, or deleted)."""
    if meta is None:
        return None
    if RECORD_KEY not in meta:
        return FOREIGN
    stored = meta[RECORD_KEY]
    if stored is None:
        return None
    if not isinstance(stored, Mapping) or stored.get("conversationId") != conversation_id:
        return FOREIGN
    return _load_record(stored)


def _entry_of(turn: SessionTurn) -> tuple[str, str | None] | None:
    tag = turn.metadata.get(ENTRY_KEY) if turn.metadata else None
    if not isinstance(tag, Mapping) or not isinstance(tag.get("id"), str):
        return None
    parent = tag.get("parentId")
    return tag["id"], parent if isinstance(parent, str) else None


def _entries_in(turns: Sequence[SessionTurn]) -> dict[str, _Held]:
    """The entries a session's turns store: id → (parent id, its consecutive turns)."""
    entries: dict[str, _Held] = {}
    current: list[SessionTurn] | None = None
    current_id: str | None = None
    for turn in turns:
        tag = _entry_of(turn)
        if tag is not None and current is not None and tag[0] == current_id:
            current.append(turn)
            continue
        current = current_id = None
        if tag is not None and tag[0] not in entries:
            current, current_id = [turn], tag[0]
            entries[current_id] = (tag[1], current)
    return entries


def _chain(
    entries: Mapping[str, _Held],
    head_id: str | None,
    limit: int | None,
) -> list[str] | None:
    """The entry ids up to ``head_id`` (its last ``limit``); ``None`` when one is missing."""
    chain: list[str] = []
    entry_id = head_id
    while entry_id is not None and (limit is None or len(chain) < limit):
        held = entries.get(entry_id)
        if held is None:
            return None
        chain.append(entry_id)
        entry_id = held[0]
    chain.reverse()
    return chain


def _entry(entry_id: str, held: _Held) -> ConversationEntry:
    from .pydantic_ai import turns_to_messages  # the door imports this module

    messages = turns_to_messages(held[1])
    if len(messages) != 1:
        raise ValidationError(
            f"the turns of entry {entry_id!r} hold {len(messages)} messages, not one",
            path=f"$.turns[?(@.metadata.{ENTRY_KEY}.id)]",
        )
    return ConversationEntry(id=entry_id, parent_id=held[0], message=messages[0])


def _tagged_turns(entries: Sequence[ConversationEntry]) -> list[SessionTurn]:
    """The turns storing ``entries``, each naming its entry."""
    from .pydantic_ai import messages_to_turns  # the door imports this module

    turns: list[SessionTurn] = []
    for index, entry in enumerate(entries):
        try:
            made = messages_to_turns([entry.message])
        except ValidationError as exc:
            where = f"$.new_entries[{index}].message{(exc.path or '$[0]')[4:]}"
            raise ValidationError(str(exc).split(" (at ")[0], path=where) from None
        tag = {ENTRY_KEY: {"id": entry.id, "parentId": entry.parent_id}}
        turns.extend(
            msgspec.structs.replace(turn, metadata={**(turn.metadata or {}), **tag})
            for turn in made
        )
    return turns


def _copies(turns: Sequence[SessionTurn]) -> list[SessionTurn]:
    """``turns`` under new turn ids, for another session."""
    return [msgspec.structs.replace(turn, id=new_id()) for turn in turns]


def _with_runs(known: Sequence[SessionRun], turns: Sequence[SessionTurn]) -> tuple[SessionRun, ...]:
    """``known`` with the runs ``turns`` make or extend, in place or appended."""
    from .pydantic_ai import runs_of_turns  # the door imports this module

    made = {run.id: run for run in runs_of_turns(turns, known)}
    kept = [made.pop(run.id, run) for run in known]
    return (*kept, *made.values())


# -- the trio side -------------------------------------------------------------------


def _store(host: SessionHost) -> FullSessionStore:
    if not is_versioned(store_capabilities(host.store)):
        raise UnsupportedOperationError(
            "a pydantic-ai conversation store needs a store with conditional writes"
            " (sqlite:, postgresql://, memory: or http(s)://)"
        )
    return cast(FullSessionStore, host.store)


async def _versioned(host: SessionHost, sid: str) -> tuple[SessionData | None, int]:
    got = await cast(VersionedStore, _store(host)).load_versioned(sid)
    return (None, 0) if got is None else got


async def _read_meta(host: SessionHost, sid: str) -> Mapping[str, Any] | None:
    """A session's metadata (one indexed read where the store has one)."""
    store = _store(host)
    if "get_meta" in store_capabilities(host.store):
        row = await store.get_meta(sid)
        return None if row is None else row.metadata
    data = await store.load(sid)
    return None if data is None else data.metadata


async def _list_meta(host: SessionHost) -> list[tuple[str, Mapping[str, Any], int]]:
    """The id, metadata and creation time of every conversation session."""
    store = _store(host)
    wanted = SessionFilter(agent_id=CONVERSATION_AGENT)
    if "list_meta" in store_capabilities(host.store):
        rows = await store.list_meta(wanted)
        return [(row.id, row.metadata, row.created_at or 0) for row in rows]
    found: list[tuple[str, Mapping[str, Any], int]] = []
    for sid in await store.list(wanted):
        data = await store.load(sid)
        if data is not None:
            found.append((sid, data.metadata, data.created_at))
    return found


async def _turns(
    host: SessionHost, sid: str | None, entry_id: str
) -> tuple[str, tuple[SessionTurn, ...]] | None:
    """A session holding ``entry_id`` and its turns: ``sid`` first, else every conversation's."""
    store = _store(host)
    if sid is not None:
        data = await store.load(sid)
        if data is not None and entry_id in _entries_in(data.turns):
            return sid, data.turns
    for other in await store.list(SessionFilter(agent_id=CONVERSATION_AGENT)):
        if other == sid:
            continue
        data = await store.load(other)
        if data is not None and entry_id in _entries_in(data.turns):
            return other, data.turns
    return None


TAIL: Final = 64
"""Turns a limited history read takes from a session's end first (four times more each
time the history reaches further back)."""


async def _tail(
    host: SessionHost, sid: str, head_id: str, limit: int
) -> tuple[SessionTurn, ...] | None:
    """The last turns of ``sid`` that hold the ``limit`` entries up to ``head_id`` (a
    history's recent part, without reading the whole session); ``None`` when the store
    cannot read a session's end, or the session does not hold ``head_id``."""
    store = _store(host)
    caps = store_capabilities(host.store)
    if "get_meta" not in caps:
        return None
    row = await store.get_meta(sid)
    if row is None:
        return None
    window = max(TAIL, 4 * limit)
    while True:
        start = max(row.turn_count - window, 0)
        turns = tuple(await store.get_turns(sid, start))
        skip = 0
        if start > 0 and turns:  # the first entry may have begun before the window: left out
            first = _entry_of(turns[0])
            while skip < len(turns) and _entry_of(turns[skip]) == first:
                skip += 1
        turns = turns[skip:]
        entries = _entries_in(turns)
        if head_id not in entries and start == 0:
            return None
        if _chain(entries, head_id, limit) is not None or start == 0:
            return turns
        window *= 4


async def _put(
    host: SessionHost,
    sid: str,
    data: SessionData | None,
    rev: int,
    record: ConversationRecord,
    adding: Sequence[SessionTurn],
) -> None:
    """Store ``record`` and the turns it adds, if the session is still at ``rev``."""
    store = _store(host)
    now = time.time_ns() // 1_000_000
    meta: dict[str, Any] = {RECORD_KEY: _dump_record(record), "title": record.title}
    if data is None:
        fresh = SessionData(
            id=sid,
            created_at=now,
            updated_at=now,
            metadata={k: v for k, v in meta.items() if v is not None},
            turns=tuple(adding),
            runs=_with_runs((), adding),
            agent_id=CONVERSATION_AGENT,
        )
        await store.save(fresh, expected_rev=rev)  # type: ignore[call-arg]  # a VersionedStore's keyword
        return
    metadata = {**data.metadata, **meta}
    if record.title is None:
        del metadata["title"]
    if adding:
        grown = msgspec.structs.replace(
            data,
            metadata=metadata,
            updated_at=now,
            turns=(*data.turns, *adding),
            runs=_with_runs(data.runs, adding),
        )
        await store.save(grown, expected_rev=rev)  # type: ignore[call-arg]
        return
    header = msgspec.structs.replace(data, metadata=metadata, updated_at=now)
    await store.save_meta(  # type: ignore[call-arg]
        header, SaveMetaOptions(meta_keys=(RECORD_KEY, "title")), expected_rev=rev
    )


def _header(
    row: SessionMetaRow, record: ConversationRecord, runs: Sequence[SessionRun]
) -> SessionData:
    """A ``save_meta`` snapshot of a listed session, holding ``record`` and upserting ``runs``."""
    metadata: dict[str, Any] = {**row.metadata, RECORD_KEY: _dump_record(record)}
    metadata["title"] = record.title
    if record.title is None:
        del metadata["title"]
    return SessionData(
        id=row.id,
        created_at=row.created_at or row.updated_at,
        updated_at=time.time_ns() // 1_000_000,
        status=row.status or "idle",
        metadata=metadata,
        runs=tuple(runs),
        agent_id=row.agent_id,
        project_root=row.project_root,
        run_owner=row.run_owner,
    )


async def _take_out(host: SessionHost, sid: str, turns: Sequence[SessionTurn]) -> None:
    """Remove ``turns`` again (appended where another writer came first), best effort:
    left in, they are entries no record reaches."""
    ids = {turn.id for turn in turns}

    def without(history: SessionHistory) -> SessionHistory | None:
        kept = tuple(turn for turn in history.turns if turn.id not in ids)
        if len(kept) == len(history.turns):
            return None
        return msgspec.structs.replace(history, turns=kept)

    with contextlib.suppress(ZidaneActorsError):
        await _store(host).mutate_history(sid, without)


_writing: weakref.WeakKeyDictionary[SessionHost, dict[str, trio.Lock]] = weakref.WeakKeyDictionary()
"""Per host, the lock of each conversation being written: a process writes one at a time."""


async def _one_at_a_time(
    host: SessionHost, conversation_id: str, write: Callable[..., Awaitable[T]], *args: Any
) -> T:
    """``await write(host, *args)`` while no other write of this conversation runs here.

    Writers in other processes are told apart by the store's conditional writes.
    """
    locks = _writing.setdefault(host, {})
    lock = locks.setdefault(conversation_id, trio.Lock())
    try:
        async with lock:
            return await write(host, *args)
    finally:
        if lock.statistics().tasks_waiting == 0 and not lock.locked():
            locks.pop(conversation_id, None)


async def _append(
    host: SessionHost,
    record: ConversationRecord,
    adding: Sequence[SessionTurn],
    expected_revision: str | None,
) -> bool:
    """A save that appends to a stored conversation, without rewriting its session:
    the turns (refused when another writer came in between), then the record, while the
    stored one is still ``expected_revision``. ``False``: there is no stored record to
    append to (the whole write decides)."""
    store = _store(host)
    if "get_meta" not in store_capabilities(host.store):
        return False
    cid = record.conversation_id
    sid = conversation_session_id(cid)
    from .pydantic_ai import runs_of_turns  # the door imports this module

    runs = runs_of_turns(adding)
    for attempt in range(STALE_ATTEMPTS):
        row = await store.get_meta(sid)
        stored = _record_in(None if row is None else row.metadata, cid)
        if row is None or row.rev is None or not isinstance(stored, ConversationRecord):
            return False
        if stored.revision != expected_revision:
            raise ConversationConflict(cid)
        options = AppendTurnsOptions(run=runs[0]) if runs else None
        answer = cast(Revision, await store.append_turns(sid, adding, options))
        if answer.before == row.rev:
            break
        await _take_out(host, sid, adding)  # another writer came first: read again
        await back_off(attempt)
    else:
        raise ConversationConflict(cid)
    rev = answer.after
    for attempt in range(STALE_ATTEMPTS):
        kept = dataclasses.replace(record, title=stored.title, metadata=stored.metadata)
        try:
            await store.save_meta(  # type: ignore[call-arg]  # a VersionedStore's keyword
                _header(row, kept, runs[1:]),
                SaveMetaOptions(meta_keys=(RECORD_KEY, "title")),
                expected_rev=rev,
            )
        except StaleSessionError:
            # Another writer came in between: the record is written only while it is
            # still the one this save continues (an update of its title keeps it).
            row = await store.get_meta(sid)
            stored = _record_in(None if row is None else row.metadata, cid)
            if row is None or row.rev is None or not isinstance(stored, ConversationRecord):
                raise ConversationConflict(cid) from None
            if stored.revision != expected_revision:
                await _take_out(host, sid, adding)
                raise ConversationConflict(cid) from None
            rev = row.rev
            await back_off(attempt)
            continue
        return True
    raise ConversationConflict(cid)


async def _write_record(
    host: SessionHost,
    record: ConversationRecord,
    adding: Sequence[SessionTurn],
    new_ids: frozenset[str],
    expected_revision: str | None,
) -> str:
    """``write_record`` in the store; the session it wrote."""
    cid = record.conversation_id
    sid = conversation_session_id(cid)
    if (
        adding
        and record.head_id in new_ids
        and await _append(host, record, adding, expected_revision)
    ):
        return sid
    for attempt in range(STALE_ATTEMPTS):
        data, rev = await _versioned(host, sid)
        stored = _record_in(None if data is None else data.metadata, cid)
        if isinstance(stored, _Foreign):
            raise ConversationConflict(cid)
        if (stored.revision if stored is not None else None) != expected_revision:
            raise ConversationConflict(cid)
        held = _entries_in(data.turns) if data is not None and stored is not None else {}
        turns = list(adding)
        head = record.head_id
        if head is not None and head not in held and head not in new_ids:
            # A fork's head, in its source: the fork's session starts with the history it
            # keeps, shared with its source where the store can (else copied).
            if data is None and not turns and await _fork_shared(host, sid, record):
                return sid
            kept = await _kept_turns(host, record.forked_from, head)
            if kept is None:
                raise ConversationConflict(cid)
            turns[:0] = [t for t in kept if (_entry_of(t) or ("",))[0] not in held]
        if stored is not None:
            record = dataclasses.replace(record, title=stored.title, metadata=stored.metadata)
        try:
            await _put(host, sid, data if stored is not None else None, rev, record, turns)
        except StaleSessionError:
            await back_off(attempt)
            continue
        return sid
    raise ConversationConflict(cid)


async def _fork_shared(host: SessionHost, sid: str, record: ConversationRecord) -> bool:
    """Make ``sid`` the store's fork of the source's session through the fork's head
    (its history shared on the SQL stores), then write ``record`` in it; ``False`` when
    the store cannot (the caller copies the history instead)."""
    store = _store(host)
    if record.forked_from is None or record.head_id is None:
        return False
    if "get_meta" not in store_capabilities(host.store):
        return False
    source, rev = await _versioned(host, conversation_session_id(record.forked_from))
    entries = _entries_in(source.turns) if source is not None else {}
    if source is None or _chain(entries, record.head_id, None) is None:
        return False
    through = entries[record.head_id][1][-1].id
    now = time.time_ns() // 1_000_000
    try:
        await fork_session(store, source.id, sid, at=through, created_at=now, expected_rev=rev)
    except StaleSessionError:
        return False  # the source changed meanwhile: copied from what it holds now
    except ConflictError:
        raise ConversationConflict(record.conversation_id) from None  # the id is taken
    row = await store.get_meta(sid)
    if row is None or row.rev is None:
        raise ConversationConflict(record.conversation_id)
    try:
        await store.save_meta(  # type: ignore[call-arg]  # a VersionedStore's keyword
            _header(row, record, ()),
            SaveMetaOptions(meta_keys=(RECORD_KEY, "title")),
            expected_rev=row.rev,
        )
    except StaleSessionError:
        raise ConversationConflict(record.conversation_id) from None
    return True


async def _kept_turns(host: SessionHost, source: str | None, head: str) -> list[SessionTurn] | None:
    """Copies of the turns of the history up to ``head`` in conversation ``source``."""
    if source is None:
        return None
    found = await _turns(host, conversation_session_id(source), head)
    if found is None:
        return None
    entries = _entries_in(found[1])
    chain = _chain(entries, head, None)
    if chain is None:
        return None
    return _copies([turn for entry_id in chain for turn in entries[entry_id][1]])


async def _write_details(
    host: SessionHost,
    conversation_id: str,
    details: ConversationDetails,
    expected_revision: str,
    expected: ConversationDetails,
) -> ConversationRecord:
    sid = conversation_session_id(conversation_id)
    data, rev = await _versioned(host, sid)
    stored = _record_in(None if data is None else data.metadata, conversation_id)
    if not isinstance(stored, ConversationRecord) or stored.revision != expected_revision:
        raise ConversationConflict(conversation_id)
    if any(getattr(stored, key) != value for key, value in expected.items()):
        raise ConversationConflict(conversation_id)
    changed = dataclasses.replace(stored, **details)
    try:
        await _put(host, sid, data, rev, changed, ())
    except StaleSessionError:
        raise ConversationConflict(conversation_id) from None  # read again by ``update``
    return changed


async def _delete_record(host: SessionHost, conversation_id: str, expected_revision: str) -> None:
    store = _store(host)
    sid = conversation_session_id(conversation_id)
    data, rev = await _versioned(host, sid)
    stored = _record_in(None if data is None else data.metadata, conversation_id)
    if data is None or not isinstance(stored, ConversationRecord):
        raise ConversationConflict(conversation_id)
    if stored.revision != expected_revision:
        raise ConversationConflict(conversation_id)
    emptied = msgspec.structs.replace(data, metadata={**data.metadata, RECORD_KEY: None})
    try:
        answer = await store.save_meta(  # type: ignore[call-arg]
            emptied, SaveMetaOptions(meta_keys=(RECORD_KEY,)), expected_rev=rev
        )
    except StaleSessionError:
        raise ConversationConflict(conversation_id) from None  # read again by ``delete``
    after = answer.after if answer is not None else None
    if after is None or await cast(VersionedStore, store).get_rev(sid) == after:
        await store.delete(sid)


# -- the asyncio side ------------------------------------------------------------------


class ZidaneConversationStore(ConversationStore, _shared.AsyncShare):
    """A pydantic-ai ``ConversationStore`` kept in a zidane store.

    ``store`` is a store URL as the CLI takes it (``sqlite:PATH``, ``memory:``,
    ``postgresql://…``, ``http(s)://…``; not ``file:DIR``, which holds a
    single session: :class:`~zidane_actors.errors.ValidationError`). Stores
    and integrations of one URL share one portal; :meth:`aclose` (or ``async
    with``) releases this store's share, and the last release closes it.

    Answers as pydantic-ai's ``InMemoryConversationStore``: ``save``,
    ``load``, ``branch``, ``fork``, ``list_conversations``, ``update`` and
    ``delete`` give the same conversations, records and errors. A title or
    metadata must have a JSON form (:class:`~zidane_actors.errors.ValidationError`).
    ``delete`` deletes the conversation's session; the entries a fork
    kept are its own session's.
    """

    def __init__(self, *, store: str = _shared.DEFAULT_STORE) -> None:
        if store.startswith("file:"):
            raise ValidationError(
                "a file: store holds one zidane session; a conversation store keeps one per"
                " conversation (use sqlite:PATH, postgresql://…, memory: or http(s)://…)",
                path="store",
            )
        self.store_url = store
        self._shared: _shared.SharedPortal | None = _shared.acquire(store)
        self._places: collections.OrderedDict[str, str] = collections.OrderedDict()

    def __repr__(self) -> str:
        return f"ZidaneConversationStore(store={self.store_url!r})"

    async def aclose(self) -> None:
        """Release this store's share of the portal (the last share closes the store)."""
        await self._let_go_async()

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        shared = self._open()
        await wait_future(shared.ready)
        return await shared.portal.call_async(fn, shared.portal.host, *args)

    def _place(self, sid: str, entry_ids: Sequence[str | None]) -> None:
        """Remember that session ``sid`` holds ``entry_ids`` (where to read them first)."""
        for entry_id in entry_ids:
            if entry_id is not None:
                self._places[entry_id] = sid
                self._places.move_to_end(entry_id)
        while len(self._places) > KEEP_PLACES:
            self._places.popitem(last=False)

    # -- ConversationStore ------------------------------------------------------------

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        sid = conversation_session_id(conversation_id)
        meta = await self._call(_read_meta, sid)
        stored = meta.get(RECORD_KEY) if meta is not None else None
        if not isinstance(stored, Mapping) or stored.get("conversationId") != conversation_id:
            return None
        record = _load_record(stored)
        self._place(sid, [record.head_id, *record.branches])
        return record

    async def read_records(
        self, *, scope: str | None = None, limit: int | None = None
    ) -> Sequence[ConversationRecord]:
        found: list[tuple[ConversationRecord, int]] = []
        for sid, meta, created_at in await self._call(_list_meta):
            stored = meta.get(RECORD_KEY)
            if not isinstance(stored, Mapping):
                continue
            record = _load_record(stored)
            # A fork being made holds its source's record until it gets its own.
            mine = conversation_session_id(record.conversation_id) == sid
            if mine and (scope is None or record.scope == scope):
                found.append((record, created_at))
        found.sort(key=lambda pair: (pair[0].updated_at, -pair[1]), reverse=True)
        return [record for record, _ in found[:limit]]

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        _dump_record(record)  # a record with no JSON form is refused before any write
        adding = _tagged_turns(new_entries)
        new_ids = frozenset(entry.id for entry in new_entries)
        sid = await self._call(
            _one_at_a_time,
            record.conversation_id,
            _write_record,
            record,
            adding,
            new_ids,
            expected_revision,
        )
        self._place(sid, [*new_ids, record.head_id])

    async def write_details(
        self,
        conversation_id: str,
        details: ConversationDetails,
        *,
        expected_revision: str,
        expected: ConversationDetails | None = None,
    ) -> ConversationRecord:
        _check_exact(details)
        return await self._call(
            _one_at_a_time,
            conversation_id,
            _write_details,
            conversation_id,
            dict(details),
            expected_revision,
            dict(expected or {}),
        )

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        await self._call(
            _one_at_a_time, conversation_id, _delete_record, conversation_id, expected_revision
        )

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        entries = await self._entries_with(entry_id)
        return _entry(entry_id, entries[entry_id])

    async def read_history(
        self, head_id: str | None, *, limit: int | None = None
    ) -> list[ConversationEntry]:
        """The history up to ``head_id`` in one read of the session holding it."""
        if head_id is None or limit == 0:
            return []
        entries = await self._entries_with(head_id, limit)
        chain = _chain(entries, head_id, limit)
        if chain is None:
            raise KeyError(head_id)  # a session that lost part of its log
        return [_entry(entry_id, entries[entry_id]) for entry_id in chain]

    async def _entries_with(self, entry_id: str, limit: int | None = None) -> dict[str, _Held]:
        """The entries of a session holding ``entry_id``: only its last turns when they
        hold the ``limit`` entries up to it."""
        sid = self._places.get(entry_id)
        if sid is not None and limit is not None:
            tail = await self._call(_tail, sid, entry_id, limit)
            if tail is not None:
                return _entries_in(tail)
        found = await self._call(_turns, sid, entry_id)
        if found is None:
            self._places.pop(entry_id, None)
            raise KeyError(entry_id)
        sid, turns = found
        entries = _entries_in(turns)
        self._place(sid, list(entries))
        return entries
