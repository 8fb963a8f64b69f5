"""Schedules and their fires, written once for both SQL stores."""

from __future__ import annotations

import builtins
import functools
from typing import Any, Final, TypeVar

import msgspec

from ...model import FIRE_HISTORY, Schedule, ScheduleFire, preview, validate_id
from .._validate import check_fire_ids, checked, checked_int
from ._codec import decode_row
from ._dialect import Dialect
from ._hooks import SQLHooks

__all__ = ["SQLSchedules"]

T = TypeVar("T")


class _Statements:
    """The schedule statements in one dialect."""

    def __init__(self, d: Dialect) -> None:
        sql, seq = d.sql, d.order_column
        self.save = sql(
            "INSERT INTO schedules (id, enabled, next_fire_at, created_at, body)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
            " enabled = excluded.enabled, created_at = excluded.created_at,"
            " body = excluded.body, next_fire_at = CASE WHEN ? THEN"
            " schedules.next_fire_at ELSE excluded.next_fire_at END"
        )
        self.list = (
            "SELECT s.id, s.next_fire_at, s.body, (SELECT f.body FROM schedule_fires f"
            f" WHERE f.schedule_id = s.id ORDER BY f.fired_at DESC, f.{seq} DESC LIMIT 1)"
            f" FROM schedules s ORDER BY s.created_at, s.id{d.text_order}"
        )
        self.delete = sql("DELETE FROM schedules WHERE id = ?")
        self.delete_fires = sql("DELETE FROM schedule_fires WHERE schedule_id = ?")
        self.claim = sql(
            "UPDATE schedules SET next_fire_at = ? WHERE id = ? AND enabled AND next_fire_at = ?"
        )
        self.exists = sql("SELECT 1 FROM schedules WHERE id = ?")
        self.delete_fire = sql("DELETE FROM schedule_fires WHERE schedule_id = ? AND id = ?")
        self.insert_fire = sql(
            "INSERT INTO schedule_fires (schedule_id, id, fired_at, body) VALUES (?, ?, ?, ?)"
        )
        self.trim_fires = sql(
            f"DELETE FROM schedule_fires WHERE schedule_id = ? AND {seq} NOT IN"
            f" (SELECT {seq} FROM schedule_fires WHERE schedule_id = ?"
            f" ORDER BY fired_at DESC, {seq} DESC LIMIT ?)"
        )
        self.list_fires = sql(
            "SELECT body, id FROM schedule_fires WHERE schedule_id = ?"
            f" ORDER BY fired_at DESC, {seq} DESC LIMIT ?"
        )


_statements: Final = functools.cache(_Statements)
"""The statements in a dialect, rendered once."""


def _fire(raw: bytes | str, schedule_id: str, fire_id: str | None = None) -> ScheduleFire:
    key = f"schedule_id={preview(schedule_id)}"
    if fire_id is not None:
        key = f"({key}, id={preview(fire_id)})"
    return decode_row(raw, ScheduleFire, "schedule_fires", key)


class SQLSchedules(SQLHooks):
    """The schedule methods of a SQL store (``save_schedule`` … ``list_schedule_fires``).

    The store names its :class:`Dialect` and runs each step, a function of a
    cursor-like ``db`` (``db.execute(sql, params)`` answers rows and ``rowcount``),
    in one read or write transaction of its own.
    """

    __slots__ = ()

    async def save_schedule(self, schedule: Schedule, *, keep_next_fire_at: bool = False) -> None:
        """Create or replace a schedule; ``keep_next_fire_at`` keeps a stored ``nextFireAt``."""
        schedule = checked(schedule, Schedule, "schedule")
        validate_id(schedule.id, what="schedule id")
        body = self._dialect.encode(
            msgspec.structs.replace(schedule, last_fire=None, next_fire_at=None)
        )
        params = (
            schedule.id,
            schedule.enabled,
            schedule.next_fire_at,
            schedule.created_at,
            body,
            keep_next_fire_at,
        )
        sql = _statements(self._dialect).save
        await self._sql_write(lambda db: db.execute(sql, params))

    async def list_schedules(self) -> builtins.list[Schedule]:
        """Every schedule with its newest fire, oldest first."""
        sql = _statements(self._dialect).list

        def op(db: Any) -> builtins.list[Schedule]:
            return [
                msgspec.structs.replace(
                    decode_row(body, Schedule, "schedules", f"id={preview(sid)}"),
                    next_fire_at=next_fire_at,
                    last_fire=None if fire is None else _fire(fire, sid),
                )
                for sid, next_fire_at, body, fire in db.execute(sql, ()).fetchall()
            ]

        return await self._sql_read(op)

    async def delete_schedule(self, id: str) -> bool:
        """Remove a schedule and its fires; ``False`` when it was gone."""
        validate_id(id, what="schedule id")
        sql = _statements(self._dialect)

        def op(db: Any) -> bool:
            db.execute(sql.delete_fires, (id,))
            return bool(db.execute(sql.delete, (id,)).rowcount > 0)

        return await self._sql_write(op, idempotent=False)

    async def claim_schedule_fire(self, id: str, due_at: int, next: int | None) -> bool:
        """Move ``nextFireAt`` from ``due_at`` to ``next`` if still due: one winner across hosts."""
        validate_id(id, what="schedule id")
        checked_int(due_at, "due_at")
        if next is not None:
            checked_int(next, "next")
        sql = _statements(self._dialect).claim
        return await self._sql_write(
            lambda db: bool(db.execute(sql, (next, id, due_at)).rowcount == 1), idempotent=False
        )

    async def record_schedule_fire(self, fire: ScheduleFire) -> None:
        """Store a fire, keeping the newest ``FIRE_HISTORY`` of its schedule."""
        fire = checked(fire, ScheduleFire, "schedule fire")
        check_fire_ids(fire)
        body = self._dialect.encode(fire)
        sql = _statements(self._dialect)
        sid = fire.schedule_id

        def op(db: Any) -> None:
            if db.execute(sql.exists, (sid,)).fetchone() is None:
                return
            db.execute(sql.delete_fire, (sid, fire.id))
            db.execute(sql.insert_fire, (sid, fire.id, fire.fired_at, body))
            db.execute(sql.trim_fires, (sid, sid, FIRE_HISTORY))

        await self._sql_write(op)

    async def list_schedule_fires(
        self, schedule_id: str, limit: int
    ) -> builtins.list[ScheduleFire]:
        """A schedule's fires, newest first."""
        validate_id(schedule_id, what="schedule id")
        count = checked_int(limit, "limit")
        sql = _statements(self._dialect).list_fires

        def op(db: Any) -> builtins.list[ScheduleFire]:
            rows = db.execute(sql, (schedule_id, count)).fetchall()
            return [_fire(body, schedule_id, fid) for body, fid in rows]

        return await self._sql_read(op)
