"""``ZidaneSession``'s branches, as openai-agents' ``AdvancedSQLiteSession`` names them.

A branch of an ``AdvancedSQLiteSession`` is a named list of items sharing a
prefix with the branch it was made from; one branch is current. Here the
current branch is the zidane session itself and every other one is kept in
a branch archive the session lists (``Session.branch``): creating a branch
from user turn ``n`` continues the session from the turn before that user
message, the items it leaves kept in a new archive; switching to a branch
brings that archive's turns back (``Session.restore_branch``), the current
branch's kept in another archive. No item is ever deleted.

The names live in the session's metadata, in one key:
``metadata["openaiBranches"] = {"current": {"branchId", "createdAt"},
"archives": {<archive session id>: {"branchId", "createdAt"} | null},
"used": [<every name given>]}`` (``null``: that archive's branch was
brought back, so the session itself holds it). A listed archive the map
does not know (a crash between a branch and the write of its name, or a
branch made through another door) is named by its session id. Turns are
numbered as ``AdvancedSQLiteSession`` numbers them: the ``n``-th user
message (an item whose ``role`` is ``"user"``) of the branch's items, from 1.
"""

from __future__ import annotations

import datetime
import json
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar, cast

import attrs
import trio

from ..actors import Session
from ..actors._contention import STALE_ATTEMPTS, back_off
from ..errors import StaleSessionError
from ..model import SessionHistory, SessionTurn, model_view
from ..stores._protocol import VersionedStore, is_versioned, store_capabilities
from . import _shared
from ._responses import items_of_turn

__all__ = ["BRANCHES_META_KEY", "MAIN", "BranchOps"]

BRANCHES_META_KEY: Final = "openaiBranches"
"""The session metadata key naming its branches (see the module docstring)."""

MAIN: Final = "main"
"""The name of a session's first branch."""

PREVIEW_CHARS: Final = 100
"""``get_conversation_turns``' preview length, as ``AdvancedSQLiteSession``'s."""

T = TypeVar("T")


@attrs.frozen
class UserTurn:
    """One user message of a branch's items: its number, its content, where it is stored."""

    number: int
    content: Any
    created_at: int
    index: int | None  # the index of the stored turn it begins (None: not a turn's first item)
    at: int  # the index of its turn in the model's view


@attrs.frozen
class Named:
    """A branch as the names map holds it."""

    branch_id: str
    created_at: int


class _Door(Protocol):
    """What the branch operations use of ``ZidaneSession``."""

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    async def _session(self, shared: _shared.SharedPortal, create: bool) -> Session | None: ...

    def _writes(self, session: Session) -> trio.Lock: ...


# -- reading a branch ---------------------------------------------------------------------


def user_turns(turns: Sequence[SessionTurn]) -> list[UserTurn]:
    """The user messages of the items ``turns`` stand for to the model, numbered from 1.

    ``index`` is the stored turn's index in ``turns`` when the message is the
    first item of a turn after the latest compaction's ``through`` (a turn the
    session can be continued from the turn before); else ``None``.
    """
    view = model_view(turns)
    stored = {id(turn): i for i, turn in enumerate(turns)}
    found: list[UserTurn] = []
    for at, turn in enumerate(view):
        for k, item in enumerate(items_of_turn(turn)):
            if not _is_user(item):
                continue
            index = stored.get(id(turn)) if k == 0 else None
            content = item.get("content", "")
            found.append(UserTurn(len(found) + 1, content, turn.created_at, index, at))
    return found


def has_items(turns: Sequence[SessionTurn]) -> bool:
    """Whether the model sees any item of ``turns`` (converting no more turns than needed)."""
    return any(items_of_turn(turn) for turn in model_view(turns))


def item_counts(turns: Sequence[SessionTurn]) -> tuple[int, int]:
    """How many items the model sees of ``turns``, and how many of them are user messages."""
    items = _items(turns)
    return len(items), sum(1 for item in items if _is_user(item))


def preview(content: Any, limit: int | None = None) -> str:
    """A user message's content as text, cut at ``limit`` (``AdvancedSQLiteSession``'s)."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return text[:limit] + "..." if limit is not None and len(text) > limit else text


def stamp(ms: int) -> str:
    """An epoch-ms time as SQLite's ``CURRENT_TIMESTAMP`` writes it (UTC, seconds)."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def turn_row(turn: UserTurn, limit: int | None) -> dict[str, Any]:
    """A user turn as ``get_conversation_turns`` answers it."""
    return {
        "turn": turn.number,
        "content": preview(turn.content, limit),
        "full_content": turn.content,
        "timestamp": stamp(turn.created_at),
        "can_branch": True,
    }


def matches(turn: UserTurn, pattern: re.Pattern[str]) -> bool:
    """Whether a user message's text holds ``pattern`` (its text parts, for a list)."""
    content = turn.content
    if isinstance(content, str):
        return pattern.search(content) is not None
    parts = content if isinstance(content, list) else []
    return any(
        isinstance(p, dict) and pattern.search(str(p.get("text", ""))) is not None for p in parts
    )


# -- the names map --------------------------------------------------------------------------


@attrs.frozen
class Names:
    """The branch names a session's metadata holds.

    ``archives`` maps a listed archive's session id to the branch it keeps,
    or to ``None`` once that branch was brought back (the archive stays
    listed, its branch is the session's own again); ``used`` holds every
    name ever given, reserved as ``AdvancedSQLiteSession`` reserves them.
    """

    current: Named
    archives: dict[str, Named | None]
    used: tuple[str, ...]

    def entry(self) -> dict[str, Any]:
        return {
            "current": _named_entry(self.current),
            "archives": {
                sid: None if n is None else _named_entry(n) for sid, n in self.archives.items()
            },
            "used": list(self.used),
        }


def _named_entry(named: Named) -> dict[str, Any]:
    return {"branchId": named.branch_id, "createdAt": named.created_at}


def _named(value: Any) -> Named | None:
    if isinstance(value, Mapping):
        name, at = value.get("branchId"), value.get("createdAt")
        if isinstance(name, str) and isinstance(at, int):
            return Named(name, at)
    return None


def names_of(session: Session) -> Names:
    """The names in the session's metadata (``main``, made with the session, when none)."""
    value = session.metadata.get(BRANCHES_META_KEY)
    value = value if isinstance(value, Mapping) else {}
    current = _named(value.get("current")) or Named(MAIN, session.created_at)
    archives: dict[str, Named | None] = {}
    held = value.get("archives")
    if isinstance(held, Mapping):
        archives = {sid: _named(entry) for sid, entry in held.items()}
    used = value.get("used")
    words = tuple(n for n in used if isinstance(n, str)) if isinstance(used, list) else ()
    return Names(current, archives, words)


def listed(session: Session, names: Names) -> dict[str, Named]:
    """The session's branch archives by session id, each with its branch's name.

    An archive the names map does not know (left by a crash before its name
    was written, or made through another door) is named by its session id;
    one whose branch was brought back is left out.
    """
    found: dict[str, Named] = {}
    for branch in session.branches:
        if branch.session_id not in names.archives:
            found[branch.session_id] = Named(branch.session_id, branch.created_at)
        else:
            named = names.archives[branch.session_id]
            if named is not None:
                found[branch.session_id] = named
    return found


async def _save_names(session: Session, names: Names) -> None:
    await session.set_meta(BRANCHES_META_KEY, names.entry())
    await session.save_meta_keys([BRANCHES_META_KEY])


# -- the operations -------------------------------------------------------------------------


class BranchOps:
    """``AdvancedSQLiteSession``'s branch operations on a ``ZidaneSession`` (a mixin).

    Each answers as ``AdvancedSQLiteSession`` does after the same steps: the
    same branch ids, ``get_items`` of the current branch, turns, listings and
    ``ValueError``s (see docs/integrations.md for where they differ).
    """

    async def get_conversation_turns(
        self: _Door, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The branch's user turns (the current branch's when ``None``), numbered from 1.

        Each a dict: ``turn``, ``content`` (a 100-character preview),
        ``full_content``, ``timestamp`` (UTC, ``YYYY-MM-DD HH:MM:SS``),
        ``can_branch`` (always ``True``).
        """
        turns = await self._call(_branch_turns, self, branch_id)
        return [turn_row(turn, PREVIEW_CHARS) for turn in user_turns(turns)]

    async def find_turns_by_content(
        self: _Door, search_term: str, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The branch's user turns whose text holds ``search_term`` (ASCII letters in any case)."""
        pattern = re.compile(re.escape(search_term), re.IGNORECASE | re.ASCII)
        turns = await self._call(_branch_turns, self, branch_id)
        return [turn_row(t, None) for t in user_turns(turns) if matches(t, pattern)]

    async def create_branch_from_turn(
        self: _Door, turn_number: int, branch_name: str | None = None
    ) -> str:
        """Continue the session from before user turn ``turn_number``, as a new current branch.

        The items from that user message on stay, as the branch they were,
        in an archive the session lists. Answers the new branch's id:
        ``branch_name``, or ``branch_from_turn_N_<epoch seconds>`` (with
        ``_2``, ``_3``… when taken). ``ValueError`` when the branch has no
        such user turn, when ``branch_name`` is blank or already used in
        this session, or when that turn cannot be continued from (it shares
        a stored turn with the items before it, or lies inside a
        compaction's summary).
        """
        if branch_name is not None and not branch_name.strip():
            raise ValueError("Branch name cannot be empty")
        return await self._call(_retried, _create, self, turn_number, branch_name)

    async def create_branch_from_content(
        self: _Door, search_term: str, branch_name: str | None = None
    ) -> str:
        """:meth:`create_branch_from_turn` at the first user turn holding ``search_term``."""
        found = await BranchOps.find_turns_by_content(self, search_term)
        if not found:
            raise ValueError(f"No user turns found containing '{search_term}'")
        return await BranchOps.create_branch_from_turn(self, found[0]["turn"], branch_name)

    async def switch_to_branch(self: _Door, branch_id: str) -> None:
        """Make ``branch_id`` the current branch: its items are what ``get_items`` answers.

        The current branch's items stay, in an archive the session lists.
        ``ValueError`` when no branch of that id holds an item.
        """
        await self._call(_retried, _switch, self, branch_id)

    async def list_branches(self: _Door) -> list[dict[str, Any]]:
        """The branches holding items, oldest first.

        Each a dict: ``branch_id``, ``message_count`` (items),
        ``user_turns``, ``is_current``, ``created_at`` (when the branch was
        made; the session's creation for ``main``).
        """
        return await self._call(_list, self)


async def _branch_turns(
    shared: _shared.SharedPortal, door: _Door, branch_id: str | None
) -> Sequence[SessionTurn]:
    """The stored turns of the branch ``branch_id`` (the current one when ``None``; of an
    archive, only the model's view of them)."""
    session = await door._session(shared, False)
    if session is None:
        return ()
    names = names_of(session)
    if branch_id is None or branch_id == names.current.branch_id:
        return session.turns
    for sid, named in listed(session, names).items():
        if named.branch_id == branch_id:
            return await shared.portal.host.load_model_view(sid) or ()
    return ()


async def _retried(
    shared: _shared.SharedPortal, op: Callable[..., Awaitable[T]], door: _Door, *args: Any
) -> T:
    """``op``, made again over the store's state while another writer got in first.

    Its first write (``Session.branch``/``restore_branch``) is conditional on
    the rev the session was read at: a refusal wrote nothing.
    """
    for attempt in range(STALE_ATTEMPTS - 1):
        try:
            return await op(shared, door, *args)
        except StaleSessionError:
            await back_off(attempt)
    return await op(shared, door, *args)


def _new_name(taken: set[str], turn_number: int) -> str:
    base = f"branch_from_turn_{turn_number}_{int(time.time())}"
    name, suffix = base, 1
    while name in taken:
        suffix += 1
        name = f"{base}_{suffix}"
    return name


def _cleared(history: SessionHistory) -> SessionHistory | None:
    return SessionHistory((), history.runs) if history.turns else None


async def _create(
    shared: _shared.SharedPortal, door: _Door, turn_number: int, branch_name: str | None
) -> str:
    session = await door._session(shared, False)
    if session is None:  # nothing stored yet: no turn, and nothing made
        raise _no_turn(turn_number, MAIN)
    async with door._writes(session):
        names = names_of(session)
        current = names.current
        wanted = next((t for t in user_turns(session.turns) if t.number == turn_number), None)
        if wanted is None:
            raise _no_turn(turn_number, current.branch_id)
        taken = {MAIN, current.branch_id, *names.used}
        taken |= {n.branch_id for n in listed(session, names).values()}
        if branch_name is not None and branch_name in taken:
            raise ValueError(
                f"Branch ID '{branch_name}' has already been used. Choose a new branch ID."
            )
        index = wanted.index
        # Continuing before it must leave exactly the view before it (no marker after it
        # that the view of the turns before it would lose).
        view = model_view(session.turns)
        if index is None or list(model_view(session.turns[:index])) != list(view[: wanted.at]):
            raise ValueError(
                f"Turn {turn_number} cannot be branched from: its user message does not begin"
                " a stored turn the session can be continued before"
            )
        name = branch_name if branch_name is not None else _new_name(taken, turn_number)
        # Continued from the turn before the message; from its own turn, then emptied,
        # when it is the first (the archive holds every turn either way).
        left = await session.branch(session.turns[max(index - 1, 0)].id)
        if index == 0:
            await session.mutate_history(_cleared)
        archives = {**names.archives, left.session_id: current}
        now = int(time.time() * 1000)
        used = tuple(dict.fromkeys((*names.used, current.branch_id, name)))
        await _save_names(session, Names(Named(name, now), archives, used))
        return name


def _no_turn(turn_number: int, branch_id: str) -> ValueError:
    return ValueError(f"Turn {turn_number} does not contain a user message in branch '{branch_id}'")


def _missing(branch_id: str) -> ValueError:
    return ValueError(f"Branch '{branch_id}' does not exist")


async def _switch(shared: _shared.SharedPortal, door: _Door, branch_id: str) -> None:
    session = await door._session(shared, False)
    if session is None:
        raise _missing(branch_id)
    async with door._writes(session):
        names = names_of(session)
        if branch_id == names.current.branch_id:
            if not has_items(session.turns):
                raise _missing(branch_id)
            return
        found = [(sid, n) for sid, n in listed(session, names).items() if n.branch_id == branch_id]
        archive = None if not found else await shared.portal.host.load_session(found[-1][0])
        if archive is None or not has_items(archive.turns):
            raise _missing(branch_id)
        sid, named = found[-1]
        archives = dict(names.archives)
        entry = next(b for b in reversed(session.branches) if b.session_id == sid)
        held = [t.id for t in session.turns]
        k = held.index(entry.turn_id) if entry.turn_id in held[:-1] else -1
        if k >= 0 and session.turns[: k + 1] == archive.turns[: k + 1]:
            # The session still holds the turns the branch left it at, as they were, and
            # turns after them: those become a branch, the archive's after them come back.
            left = await session.restore_branch(sid)
            assert left is not None
            archives[left.session_id] = names.current
        else:
            # Not continued from there (an item popped since, the session cleared, nothing
            # added): the whole current branch is archived, when it holds any turn, and
            # the session takes the archive's history whole.
            if held:
                left = await session.branch(held[-1])
                archives[left.session_id] = names.current
            history = SessionHistory(archive.turns, archive.runs)
            await session.mutate_history(lambda _: history)
        archives[sid] = None
        await _save_names(session, Names(named, archives, names.used))


_counted: weakref.WeakKeyDictionary[object, OrderedDict[tuple[str, int], tuple[int, int]]] = (
    weakref.WeakKeyDictionary()
)
"""Per store: an archive's item and user message counts, by its session id and rev."""

KEEP_COUNTS: Final = 4096
"""Archive counts kept per store, the newest use last."""


async def _archive_counts(shared: _shared.SharedPortal, sid: str) -> tuple[int, int] | None:
    """How many items an archive holds and how many are user messages (``None``: gone).

    An archive is written once, so on a versioned store its counts are kept
    by its rev and only read again once another writer moved it.
    """
    host = shared.portal.host
    store = host.store
    kept: OrderedDict[tuple[str, int], tuple[int, int]] | None = None
    rev = None
    if is_versioned(store_capabilities(store)):
        rev = await cast(VersionedStore, store).get_rev(sid)
        if rev is None:
            return None
        kept = _counted.setdefault(store, OrderedDict())
        counts = kept.get((sid, rev))
        if counts is not None:
            kept.move_to_end((sid, rev))
            return counts
    view = await host.load_model_view(sid)  # the archive not opened
    if view is None:
        return None
    counts = item_counts(view)
    if kept is not None and rev is not None:
        kept[(sid, rev)] = counts
        if len(kept) > KEEP_COUNTS:
            kept.popitem(last=False)
    return counts


async def _list(shared: _shared.SharedPortal, door: _Door) -> list[dict[str, Any]]:
    session = await door._session(shared, False)
    if session is None:
        return []
    names = names_of(session)
    found = [(names.current, item_counts(session.turns), True)]
    for sid, named in listed(session, names).items():
        counts = await _archive_counts(shared, sid)
        if counts is not None:
            found.append((named, counts, False))
    rows = []
    for named, (count, users), is_current in sorted(
        found, key=lambda f: (f[0].created_at, f[0].branch_id)
    ):
        if count:
            rows.append(
                {
                    "branch_id": named.branch_id,
                    "message_count": count,
                    "user_turns": users,
                    "is_current": is_current,
                    "created_at": stamp(named.created_at),
                }
            )
    return rows


def _items(turns: Sequence[SessionTurn]) -> list[Any]:
    """The items the model sees of ``turns``."""
    return [item for turn in model_view(turns) for item in items_of_turn(turn)]


def _is_user(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "user"
