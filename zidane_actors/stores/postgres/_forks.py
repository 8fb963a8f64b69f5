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
    SessionTurn,
    check_fork_id,
    preview,
    validate_id,
)
from .._protocol import Revision, stale
from .._validate import checked_int
from ..sql import POSTGRES
from ..sql._forks import (
    ForkPlan,
    RowRange,
    TurnRow,
    forks_candidates,
    forks_named,
    left_out,
    link_fork,
    no_turn,
)
from ._base import PostgresBase
from ._rows import _checked_data, _Cursor, _decode, _json, seen_scalar

__all__ = ["PostgresForks"]


def decode_turns(session_id: str, rows: Sequence[TurnRow]) -> tuple[SessionTurn, ...]:
    """Turn rows (``seq, id, role, body``: the body is the whole turn) decoded."""
    key = f"(session_id={preview(session_id)}) seq "
    return tuple(_decode(body, SessionTurn, "turns", f"{key}{seq}") for seq, _, _, body in rows)


_HEAD = f"""
SELECT s.created_at, s.updated_at, s.status, s.agent_id, s.project_root, s.metadata, s.rev,
    s.turn_count, s.user_turn_count, EXISTS (SELECT FROM sessions WHERE id = %(new)s),
    (SELECT array_agg(ARRAY[g.session_id, g.lo::text, g.hi::text] ORDER BY g.lo)
        FROM fork_ranges(s.id) g WHERE EXISTS (SELECT FROM forks WHERE session_id = s.id)),
    a.seq,
    {seen_scalar("s.id", "SELECT count(*) FROM {turns} v WHERE role = 'user' AND seq > a.seq")},
    {seen_scalar("s.id", "SELECT body FROM {turns} v WHERE seq = coalesce(a.seq, s.turn_count-1)")},
    nextval('revs')
FROM sessions s LEFT JOIN LATERAL
    (SELECT {seen_scalar("s.id", "SELECT seq FROM {turns} v WHERE id = %(at)s")} AS seq) a ON true
WHERE s.id = %(source)s FOR SHARE OF s
"""
"""Everything a fork reads, in one statement locking the source's row (``FOR SHARE``, until
commit: no write rewriting the turns the fork shares runs before its link is seen): the
source's header, whether the new id is taken, the row ranges it sees when it shares some,
the seq of turn ``at``, the user turns after it, the last kept turn, the fork's ``rev``."""


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

    One round trip reads (:data:`_HEAD`, ``BEGIN`` sent with it), one writes and commits
    (the transaction pipelined: nothing written is waited for); whatever the history's
    length, ``at`` or not. The runs are copied by the server, without those only left-out
    turns belong to (``left_out``: index probes).
    """
    validate_id(source_id)
    check_fork_id(new_id)
    # Planned once per connection (a generic plan, prepared at once): its custom plans
    # cost a few ms of planning each, more than the fork's own work.
    cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    cur.execute(
        _HEAD,
        {"new": new_id, "at": at if isinstance(at, str) else None, "source": source_id},
        prepare=True,
    )
    head = cur.fetchone()
    if head is None:
        raise SessionNotFoundError(f"no session {preview(source_id)} to fork")
    if expected_rev is not None and int(head[6]) != expected_rev:
        raise stale(source_id, expected_rev, int(head[6]))
    checked_int(created_at, "createdAt")
    count = int(head[7])
    bound = count
    if at is not None:
        if head[11] is None:
            no_turn(at)
        bound = int(head[11]) + 1
    if head[9]:
        raise _taken(new_id)
    ranges: tuple[RowRange, ...] = (RowRange(source_id, 0, None),)
    if head[10] is not None:
        ranges = tuple(
            RowRange(sid, int(lo), None if hi is None else int(hi)) for sid, lo, hi in head[10]
        )
    last = decode_turns(source_id, [(bound - 1, "", "", head[13])]) if bound else ()
    plan = ForkPlan(ranges, bound, count, int(head[12] or 0), last)
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
    fork = _checked_data(plan.header(source, new_id, created_at))
    rev = int(head[14])
    _write_fork(cur, fork, plan, rev, int(head[8]) - plan.users_left, source_id)
    link_fork(cur, POSTGRES, plan, source_id, new_id)
    return Revision(0, rev)


def _taken(new_id: str) -> ConflictError:
    return ConflictError(f"the store already holds a session {preview(new_id)}")


def _write_fork(
    cur: _Cursor, fork: SessionData, plan: ForkPlan, rev: int, users: int, source_id: str
) -> None:
    """Insert the fork's header (at ``rev``) and the source's runs it keeps."""
    cur.execute(
        "INSERT INTO sessions (id, created_at, updated_at, status, agent_id, project_root,"
        " metadata, turn_count, user_turn_count, rev)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
            rev,
        ),
    )
    dropped, params = "", list[Any]()
    if plan.bound < plan.count:
        condition, params = left_out(plan, POSTGRES, "r.id")
        dropped = f" AND NOT ({condition})"
    cur.execute(
        POSTGRES.sql(
            "INSERT INTO runs (session_id, id, seq, body)"
            " SELECT CAST(? AS TEXT), r.id, row_number() OVER (ORDER BY r.seq) - 1, r.body"
            f" FROM runs r WHERE r.session_id = ?{dropped}"
        ),
        [fork.id, source_id, *params],
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
            pipelined=True,
        )
        return revision

    async def list_forks(self, source_id: str) -> builtins.list[str]:
        """The ids of the sessions whose ``forkedFrom`` names ``source_id``, sorted."""
        found: builtins.list[str] = await self._read(lambda cur: _list_forks(cur, source_id))
        return found
