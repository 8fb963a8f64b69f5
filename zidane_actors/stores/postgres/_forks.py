"""The PostgreSQL store's forks: rows shared with the source (the rule is ``..sql._forks``).

Reads see a fork's turns through ``_rows.visible_turns`` (``fork_ranges``, schema v8)
inside the one statement that reads them, so a read stays one consistent snapshot.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from ...errors import ConflictError, SessionNotFoundError
from ...model import (
    SessionData,
    SessionRun,
    SessionTurn,
    check_fork_id,
    preview,
    validate_id,
)
from .._protocol import Revision, stale
from ..sql import POSTGRES
from ..sql._forks import (
    ForkPlan,
    TurnRow,
    forks_candidates,
    forks_named,
    kept_runs,
    link_fork,
    plan_fork,
)
from ._base import PostgresBase
from ._reads import _AGG, _decode_list
from ._rows import _checked_data, _Cursor, _decode, _json

__all__ = ["PostgresForks"]


def decode_turns(session_id: str, rows: Sequence[TurnRow]) -> tuple[SessionTurn, ...]:
    """Turn rows (``seq, id, role, body``: the body is the whole turn) decoded."""
    key = f"(session_id={preview(session_id)}) seq "
    return tuple(_decode(body, SessionTurn, "turns", f"{key}{seq}") for seq, _, _, body in rows)


def _fork(
    cur: _Cursor,
    source_id: str,
    new_id: str,
    *,
    at: str | None,
    created_at: int,
    expected_rev: int | None = None,
) -> Revision:
    """Create ``new_id`` as the fork of ``source_id``: a header, its runs, one link row.

    The source's row is locked (``FOR SHARE``) until commit: no write rewriting the
    turns the fork shares can run before the link is seen. Three round trips for a
    whole fork of a session sharing nothing: the source's header, runs and last turn
    (and whether ``new_id`` is taken), the writes (pipelined), the commit; with ``at``
    or a shared source, the plan's reads between.
    """
    validate_id(source_id)
    check_fork_id(new_id)
    cur.execute(
        "SELECT created_at, updated_at, status, agent_id, project_root, metadata, rev,"
        f" turn_count, user_turn_count, (SELECT {_AGG} FROM runs WHERE session_id = s.id),"
        " EXISTS (SELECT FROM forks WHERE session_id = s.id),"
        " EXISTS (SELECT FROM sessions WHERE id = %s),"
        " (SELECT body FROM turns WHERE session_id = s.id AND seq = s.turn_count - 1)"
        " FROM sessions s WHERE id = %s FOR SHARE OF s",
        (new_id, source_id),
    )
    head = cur.fetchone()
    if head is None:
        raise SessionNotFoundError(f"no session {preview(source_id)} to fork")
    if expected_rev is not None and int(head[6]) != expected_rev:
        raise stale(source_id, expected_rev, int(head[6]))
    # Its last turn is its own last row when it shares none (else read by the plan).
    count = int(head[7])
    last = None
    if not head[10] and head[12] is not None:
        last = decode_turns(source_id, [(count - 1, "", "", head[12])])
    plan = plan_fork(
        cur, POSTGRES, source_id, count, at, created_at, decode_turns, shares=head[10], last=last
    )
    source = SessionData(
        id=source_id,
        created_at=head[0],
        updated_at=head[1],
        status=head[2],
        agent_id=head[3],
        project_root=head[4],
        metadata=_decode(head[5], dict[str, Any], "sessions", f"id={preview(source_id)}"),
        turns=(),
        runs=(),
    )
    if head[11]:
        raise _taken(new_id)
    fork = _checked_data(plan.header(source, new_id, created_at))
    runs = _decode_list(cur, head[9], SessionRun, "runs", source_id)
    kept = kept_runs(cur, POSTGRES, plan, runs)
    with cur.connection.pipeline(), cur.connection.cursor() as header:
        _write_fork(header, cur, fork, plan, int(head[8]) - plan.users_left, kept)
        link_fork(cur, POSTGRES, plan, source_id, new_id)
        made = header.fetchone()
    if made is None:  # made meanwhile by another writer: everything here rolls back
        raise _taken(new_id)
    return Revision(0, int(made[0]))


def _taken(new_id: str) -> ConflictError:
    return ConflictError(f"the store already holds a session {preview(new_id)}")


def _write_fork(
    header: _Cursor,
    cur: _Cursor,
    fork: SessionData,
    plan: ForkPlan,
    users: int,
    runs: Sequence[SessionRun],
) -> None:
    """Insert the fork's header (its rev answered through ``header``) and its ``runs``."""
    header.execute(
        "INSERT INTO sessions (id, created_at, updated_at, status, agent_id, project_root,"
        " metadata, turn_count, user_turn_count) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (id) DO NOTHING RETURNING rev",
        (
            fork.id,
            fork.created_at,
            fork.updated_at,
            fork.status,
            fork.agent_id,
            fork.project_root,
            _json(fork.metadata, f"metadata of session {preview(fork.id)}"),
            plan.bound,
            users,
        ),
    )
    if runs:
        cur.execute(
            "INSERT INTO runs (session_id, id, seq, body)"
            " SELECT %s, i, o - 1, b FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY"
            " AS u(i, b, o)",
            (fork.id, [r.id for r in runs], [_json(r, f"run {preview(r.id)}") for r in runs]),
        )


def _list_forks(cur: _Cursor, source_id: str) -> builtins.list[str]:
    """The sessions whose metadata's ``forkedFrom`` names ``source_id`` (as the memory
    store reads it), sorted."""
    validate_id(source_id)
    cur.execute(forks_candidates(POSTGRES), (source_id,))
    return forks_named(
        source_id,
        (
            (sid, _decode(metadata, dict[str, Any], "sessions", f"id={preview(sid)}"))
            for sid, metadata in cur.fetchall()
        ),
    )


class PostgresForks(PostgresBase):
    """``fork_session`` and ``list_forks`` of the PostgreSQL store."""

    async def fork_session(
        self,
        source_id: str,
        new_id: str,
        *,
        at: str | None,
        created_at: int,
        expected_rev: int | None = None,
    ) -> Revision | None:
        """Create ``new_id`` as :func:`~zidane_actors.model.fork_document` of ``source_id``
        in one transaction whose cost does not grow with the history (see ``..sql._forks``)."""
        revision: Revision = await self._write(
            lambda cur: _fork(
                cur, source_id, new_id, at=at, created_at=created_at, expected_rev=expected_rev
            ),
            idempotent=False,
        )
        return revision

    async def list_forks(self, source_id: str) -> builtins.list[str]:
        """The ids of the sessions whose ``forkedFrom`` names ``source_id``, sorted."""
        found: builtins.list[str] = await self._read(lambda cur: _list_forks(cur, source_id))
        return found
