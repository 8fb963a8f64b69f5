"""Run claims and the stale-run demotion, written once for both SQL stores.

A claim reads the run marker and writes it in one write transaction: SQLite's
holds the database lock, PostgreSQL's locks the header row (``FOR UPDATE``).
"""

from __future__ import annotations

import functools
from typing import Any, Final

import msgspec

from ...model import (
    RunOwner,
    SessionRun,
    current_run_owner,
    encode_str,
    preview,
    run_claim_blocked,
    validate_id,
)
from .._protocol import RunClaim
from .._validate import checked, checked_int, now_ms
from ._codec import decode_row
from ._dialect import Dialect
from ._hooks import SQLHooks

__all__ = ["SQLClaims"]


class _Statements:
    def __init__(self, d: Dialect) -> None:
        sql = d.sql
        self.marker = sql(
            f"SELECT status, run_owner{d.json_column}, updated_at, run_epoch"
            f" FROM sessions WHERE id = ?{d.lock}"
        )
        self.claim = sql(
            f"UPDATE sessions SET status = 'running', run_owner = {d.json_param},"
            f" updated_at = ?, run_epoch = run_epoch + 1, rev = {d.next_rev} WHERE id = ?"
        )
        self.demote = sql(
            "UPDATE sessions SET status = CASE WHEN status = 'running' THEN 'idle'"
            " ELSE status END, run_owner = CASE WHEN status = 'running' THEN NULL"
            f" ELSE run_owner END, rev = {d.next_rev} WHERE id = ? AND run_epoch = ?"
        )
        self.runs = sql("SELECT id, body FROM runs WHERE session_id = ?")
        self.abort_run = sql("UPDATE runs SET body = ? WHERE session_id = ? AND id = ?")
        self.epoch = sql("SELECT run_epoch FROM sessions WHERE id = ?")


_statements: Final = functools.cache(_Statements)
"""The statements in a dialect, rendered once."""


def _owner(raw: str | bytes | None, session_id: str) -> RunOwner | None:
    if raw is None:
        return None
    return decode_row(raw, RunOwner, "sessions", f"id={preview(session_id)} run_owner")


class SQLClaims(SQLHooks):
    """``claim_run``, ``demote_stale_run`` and ``run_epoch`` of a SQL store."""

    __slots__ = ()

    async def run_epoch(self, session_id: str) -> int | None:
        """The session's lease epoch (bumped by every successful claim), or ``None`` for an
        unknown id.

        A run holder passes it along with its writes so a later claimant can
        fence off a holder that lost its claim.
        """
        validate_id(session_id)
        sql = _statements(self._dialect).epoch

        def op(db: Any) -> int | None:
            row = db.execute(sql, (session_id,)).fetchone()
            return None if row is None else int(row[0])

        return await self._sql_read(op)

    async def claim_run(
        self, session_id: str, *, stale_at: int, owner: RunOwner | None = None
    ) -> RunClaim:
        """Set ``running`` unless a live owner holds it, in one write transaction.

        A successful claim records ``owner`` (default: this process), stamps
        ``updatedAt`` and bumps ``run_epoch``; an unknown id is claimed
        without writing a row.
        """
        validate_id(session_id)
        checked_int(stale_at, "stale_at")
        claimant = current_run_owner() if owner is None else checked(owner, RunOwner, "run owner")
        claimant_json = encode_str(claimant)
        sql = _statements(self._dialect)

        def op(db: Any) -> RunClaim:
            row = db.execute(sql.marker, (session_id,)).fetchone()
            if row is None:
                return RunClaim(claimed=True)
            status, stored_owner, updated_at, _ = row
            now = now_ms()
            if run_claim_blocked(
                status, _owner(stored_owner, session_id), updated_at, stale_at, now
            ):
                return RunClaim(claimed=False)
            db.execute(sql.claim, (claimant_json, now, session_id))
            return RunClaim(claimed=True, previous=status)

        return await self._sql_write(op, idempotent=False)

    async def demote_stale_run(self, session_id: str, *, stale_at: int, now: int) -> bool:
        """Write a load's stale-running demotion in one write transaction, if still stale.

        The marker is re-read under the write's lock and judged by
        ``run_claim_blocked``; the update also names the ``run_epoch`` it read,
        so a marker claimed since is never overwritten. ``updatedAt`` is kept.
        """
        validate_id(session_id)
        checked_int(stale_at, "stale_at")
        checked_int(now, "now")
        d = self._dialect
        sql = _statements(d)

        def op(db: Any) -> bool:
            row = db.execute(sql.marker, (session_id,)).fetchone()
            if row is None:
                return False
            status, owner, updated_at, epoch = row
            if run_claim_blocked(status, _owner(owner, session_id), updated_at, stale_at, now):
                return False
            runs = [
                decode_row(body, SessionRun, "runs", f"id={preview(rid)}")
                for rid, body in db.execute(sql.runs, (session_id,)).fetchall()
            ]
            running = [r for r in runs if r.status == "running"]
            if status != "running" and not running:
                return False
            db.execute(sql.demote, (session_id, epoch))
            for run in running:
                body = d.encode(msgspec.structs.replace(run, status="aborted"))
                db.execute(sql.abort_run, (body, session_id, run.id))
            return True

        return await self._sql_write(op)
