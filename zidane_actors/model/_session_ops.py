"""Pure rules over session data that every store and the runtime share."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

import msgspec
from msgspec import UNSET

from ._types import RunOwner, SessionData, SessionFilter, SessionMetaRow, SessionRun, SessionStatus

__all__ = [
    "corrupt_meta_row",
    "demote_stale_running_status",
    "is_scope_session_id",
    "matches_session_filter",
    "merge_session_metadata",
    "patch_metadata",
    "resume_chain_run_ids",
    "session_meta_row",
    "snapshot_status",
    "upsert_runs",
]


def merge_session_metadata(
    stored: Mapping[str, Any] | None,
    incoming: Mapping[str, Any],
    keys: Sequence[str] | None,
) -> dict[str, Any]:
    """The metadata a ``save_meta`` should store.

    Without ``keys``: ``incoming`` wholesale. With ``keys``: ``stored`` with
    just those keys taken from ``incoming``. A key named in ``keys`` that is
    absent from ``incoming`` or maps to ``msgspec.UNSET`` is removed (Python's
    stand-in for an ``undefined`` value).
    """
    if keys is None or stored is None:
        return {k: v for k, v in incoming.items() if v is not UNSET}
    merged = dict(stored)
    for key in keys:
        value = incoming.get(key, UNSET)
        if value is UNSET:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def patch_metadata(stored: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``stored`` with ``patch`` merged in; a ``msgspec.UNSET`` value removes its key."""
    return merge_session_metadata(stored, patch, tuple(patch))


def demote_stale_running_status(
    data: SessionData,
    *,
    own_runs: Collection[str] = (),
    own_owner: RunOwner | None = None,
) -> SessionData:
    """Demote a persisted ``running`` session to ``idle`` and ``running`` runs to ``aborted``.

    A persisted ``running`` is stale in a view of the session: the run that
    set it lives in another process. A session that already holds memory
    keeps what is its own: the runs in ``own_runs`` (it started them and
    still shows them running) and a ``running`` status whose owner is
    ``own_owner`` (it set it itself). Values are frozen, so the demoted copy
    is returned (``data`` itself when nothing was demoted).
    """
    runs = data.runs
    if any(r.status == "running" and r.id not in own_runs for r in runs):
        runs = tuple(
            msgspec.structs.replace(r, status="aborted")
            if r.status == "running" and r.id not in own_runs
            else r
            for r in runs
        )
    demote = data.status == "running" and (own_owner is None or data.run_owner != own_owner)
    if not demote and runs is data.runs:
        return data
    return msgspec.structs.replace(
        data,
        status="idle" if demote else data.status,
        run_owner=None if demote else data.run_owner,
        runs=runs,
    )


def resume_chain_run_ids(runs: Sequence[SessionRun], run_id: str) -> set[str]:
    """The transitive ``resumedFromRunId`` chain from ``run_id`` (inclusive), cycle-guarded."""
    by_id = {r.id: r for r in runs}
    chain: set[str] = set()
    current: str | None = run_id
    while current is not None and current not in chain:
        chain.add(current)
        run = by_id.get(current)
        current = run.resumed_from_run_id if run is not None else None
    return chain


def snapshot_status(
    stored_status: SessionStatus | None,
    stored_owner: RunOwner | None,
    snapshot: SessionStatus,
) -> tuple[SessionStatus, RunOwner | None]:
    """Status and owner a ``save``/``save_meta`` of ``snapshot`` writes.

    A snapshot never moves a session into ``running``: its ``running`` keeps
    the stored status (``idle`` for a new row) and owner; a settled status is
    written as given and clears the owner.
    """
    if snapshot == "running":
        return (stored_status or "idle"), stored_owner
    return snapshot, None


def upsert_runs(
    stored: Sequence[SessionRun], incoming: Sequence[SessionRun]
) -> tuple[SessionRun, ...]:
    """``stored`` with each ``incoming`` run replacing its id's record or appended."""
    if len(incoming) == 1:
        # The usual write, one run: looked for from the newest (a run ends soon after
        # it starts), without indexing every run of a long session.
        run = incoming[0]
        rid = run.id
        for i in range(len(stored) - 1, -1, -1):
            if stored[i].id == rid:
                return (*stored[:i], run, *stored[i + 1 :])
        return (*stored, run)
    index = {r.id: i for i, r in enumerate(stored)}
    merged = list(stored)
    for run in incoming:
        at = index.get(run.id)
        if at is None:
            index[run.id] = len(merged)
            merged.append(run)
        else:
            merged[at] = run
    return tuple(merged)


def matches_session_filter(
    agent_id: str | None, project_root: str | None, filter: SessionFilter | None
) -> bool:
    """Whether a session's header passes ``filter`` (``limit`` is not applied here)."""
    if filter is None:
        return True
    if filter.agent_id is not None and agent_id != filter.agent_id:
        return False
    return filter.project_root is UNSET or project_root == filter.project_root


def corrupt_meta_row(session_id: str, updated_at: int, error: Exception) -> SessionMetaRow:
    """The row a listing answers for a session whose stored header does not decode.

    One bad row (an older writer, another program, bit rot) must not make the
    whole listing fail: the session is listed, named, with ``corrupt`` saying
    what failed, and no other data.
    """
    return SessionMetaRow(
        id=session_id,
        metadata={},
        run_count=0,
        turn_count=0,
        updated_at=updated_at,
        user_message_count=0,
        corrupt=str(error),
    )


def session_meta_row(
    data: SessionData, *, artifact_count: int | None = None, rev: int | None = None
) -> SessionMetaRow:
    """The summary row of ``data`` (the first user turn only when no title is stored)."""
    first_user = None
    if "title" not in data.metadata:
        first_user = next((t for t in data.turns if t.role == "user"), None)
    return SessionMetaRow(
        id=data.id,
        metadata=dict(data.metadata),
        run_count=len(data.runs),
        turn_count=len(data.turns),
        updated_at=data.updated_at,
        user_message_count=sum(1 for t in data.turns if t.role == "user"),
        agent_id=data.agent_id,
        artifact_count=artifact_count,
        created_at=data.created_at,
        first_user_turn=first_user,
        project_root=data.project_root,
        rev=rev,
        run_owner=data.run_owner,
        status=data.status,
    )


SCOPE_SESSION_PREFIXES: Final = ("adk-app:", "adk-app=", "adk-user:", "adk-user=")
"""How the ids of google-adk's ``app:``/``user:`` scope sessions begin (readable or digest form)."""


def is_scope_session_id(session_id: str) -> bool:
    """Whether ``session_id`` names a framework's internal scope session, not a conversation.

    google-adk keeps ``app:`` and ``user:`` state in sessions of their own;
    conversation lists leave them out unless asked for.
    """
    return session_id.startswith(SCOPE_SESSION_PREFIXES)
