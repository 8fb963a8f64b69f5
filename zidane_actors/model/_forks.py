"""Forks and branches: a conversation copied from a point, or continued from an earlier turn.

A *fork* is a new session whose history is its source's up to a turn. It is
an ordinary document: its metadata records where it came from,
``metadata["forkedFrom"] = {"sessionId", "turnId", "forkedAt"}``
(``turnId``: its last kept turn, ``null`` when it kept none), so a reader
unaware of forks reads a whole, self-contained session. :func:`fork_document`
is the one rule every store answers as.

A *branch* continues a session from an earlier turn without losing the turns
after it: they stay in an *archive* session (a fork of the session's head,
whose metadata also says ``"branchOf": <session id>``), listed on the session
under ``metadata["zidaneBranches"]``. :func:`branch_history` and
:func:`restored_history` are the history edits of branching and restoring.

Artifacts and send-request ids are not part of a fork: they stay with the
session that recorded them (a fork records its own from then on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from ..errors import InvalidNameError, ValidationError
from ._codec import convert_or_none, to_builtins
from ._ids import validate_id
from ._preview import preview
from ._turn_ids import check_unique_turn_ids
from ._types import EpochMs, JsonValue, SessionData, SessionHistory, SessionRun, SessionTurn

__all__ = [
    "BRANCHES_KEY",
    "BRANCH_OF_KEY",
    "FORKED_FROM_KEY",
    "Branch",
    "ForkedFrom",
    "branch_entry",
    "branch_history",
    "branches_of",
    "check_fork_id",
    "fork_document",
    "forked_from",
    "restored_history",
    "turn_index",
]

FORKED_FROM_KEY: Final = "forkedFrom"
"""The session metadata key of a fork's origin."""

BRANCHES_KEY: Final = "zidaneBranches"
"""The session metadata key listing the archives of the branches a session left."""

BRANCH_OF_KEY: Final = "branchOf"
"""The metadata key of an archive session: the id of the session whose branch it keeps."""

_NOT_INHERITED: Final = frozenset({FORKED_FROM_KEY, BRANCHES_KEY, BRANCH_OF_KEY})
"""Metadata a fork never takes from its source: its own origin, and the source's archives
(they belong to the source, which deletes them with itself)."""


class ForkedFrom(msgspec.Struct, frozen=True, rename="camel"):
    """Where a fork came from: its source, the last turn it kept (``None``: none), when."""

    session_id: str
    turn_id: str | None
    forked_at: EpochMs


class Branch(msgspec.Struct, frozen=True, rename="camel"):
    """One listed branch: the archive session keeping it, the turn the session continued
    from, when, and how many turns the session left there."""

    session_id: str
    turn_id: str
    created_at: EpochMs
    turns: int


def forked_from(session: SessionData | Mapping[str, Any]) -> ForkedFrom | None:
    """The origin a session (or its metadata) records; ``None`` when it is no fork (or the
    entry is malformed)."""
    metadata = session.metadata if isinstance(session, SessionData) else session
    return convert_or_none(metadata.get(FORKED_FROM_KEY), ForkedFrom)


def branches_of(metadata: Mapping[str, Any]) -> tuple[Branch, ...]:
    """The branches listed in a session's metadata, in listing order (malformed entries
    passed over: the list is metadata any writer may have touched)."""
    value = metadata.get(BRANCHES_KEY)
    if not isinstance(value, list):
        return ()
    return tuple(
        branch for entry in value if (branch := convert_or_none(entry, Branch)) is not None
    )


def branch_entry(branch: Branch) -> dict[str, JsonValue]:
    """``branch`` as the JSON entry of the :data:`BRANCHES_KEY` list."""
    entry: dict[str, JsonValue] = to_builtins(branch)
    return entry


def turn_index(turns: Sequence[SessionTurn], turn_id: str, *, path: str = "$.at") -> int:
    """The index of the turn ``turn_id`` names; :class:`ValidationError` at ``path`` when none."""
    if not isinstance(turn_id, str):
        raise ValidationError(
            f"a turn id must be a string, got {type(turn_id).__name__}", path=path
        )
    for i, turn in enumerate(turns):
        if turn.id == turn_id:
            return i
    raise ValidationError(f"{preview(turn_id)} names no turn of the session", path=path)


def _kept_runs(
    runs: Sequence[SessionRun], kept: Sequence[SessionTurn], left: Sequence[SessionTurn]
) -> tuple[SessionRun, ...]:
    """``runs`` without those only ``left`` turns belong to (a run holding no turn stays)."""
    if not left:
        return tuple(runs)
    kept_ids = {t.run_id for t in kept}
    left_ids = {t.run_id for t in left} - kept_ids
    return tuple(run for run in runs if run.id not in left_ids)


def check_fork_id(new_id: object) -> str:
    """``new_id`` if it is a safe session id, else :class:`InvalidNameError` at ``$.id``.

    A fork's arguments are checked before anything is read: both ids first
    (the source's as any session id), then the source, its rev, ``at``, the
    new id's being free.
    """
    try:
        return validate_id(new_id)
    except InvalidNameError as exc:
        raise InvalidNameError(str(exc), path="$.id") from None


def fork_document(
    source: SessionData, *, new_id: str, at: str | None, created_at: int
) -> SessionData:
    """The fork of ``source`` named ``new_id``, made at ``created_at``: the whole document.

    Its turns are the source's up to and including ``at`` (all when ``None``;
    ``at`` naming no turn is a :class:`ValidationError` at ``$.at``); its runs
    the source's except those only left-out turns belong to; status ``idle``
    with no run owner; the source's agent, project and metadata, except the
    source's own origin and branch list, with :data:`FORKED_FROM_KEY` saying
    where it came from. Artifacts and send-request ids stay with the source.
    """
    check_fork_id(new_id)
    turns = source.turns
    if at is not None:
        turns = turns[: turn_index(turns, at) + 1]
    metadata = {k: v for k, v in source.metadata.items() if k not in _NOT_INHERITED}
    origin = ForkedFrom(source.id, turns[-1].id if turns else None, created_at)
    metadata[FORKED_FROM_KEY] = to_builtins(origin)
    return SessionData(
        id=new_id,
        created_at=created_at,
        updated_at=created_at,
        status="idle",
        metadata=metadata,
        turns=turns,
        runs=_kept_runs(source.runs, turns, source.turns[len(turns) :]),
        agent_id=source.agent_id,
        project_root=source.project_root,
    )


def branch_history(history: SessionHistory, at: str) -> SessionHistory:
    """``history`` continued from turn ``at``: the turns after it (and the runs only they
    belong to) left out. :class:`ValidationError` at ``$.at`` when ``at`` names no turn."""
    k = turn_index(history.turns, at) + 1
    kept, left = history.turns[:k], history.turns[k:]
    return SessionHistory(kept, _kept_runs(history.runs, kept, left))


def restored_history(history: SessionHistory, archive: SessionHistory, at: str) -> SessionHistory:
    """``history`` with its turns after ``at`` replaced by ``archive``'s turns after ``at``.

    The runs: those the history keeps (see :func:`branch_history`), then the
    archive's runs that restored turns belong to and the history lacks.
    :class:`ValidationError` at ``$.at`` when ``at`` names no turn of either.
    """
    head = branch_history(history, at)
    back = archive.turns[turn_index(archive.turns, at) + 1 :]
    held = {run.id for run in head.runs}
    wanted = {t.run_id for t in back}
    runs = (*head.runs, *(r for r in archive.runs if r.id in wanted and r.id not in held))
    turns = (*head.turns, *back)
    check_unique_turn_ids(turns, path="$.turns")
    return SessionHistory(turns, runs)
