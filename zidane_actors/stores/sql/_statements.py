"""The statements both SQL stores run, written once with ``?`` marks.

Each store holds one :class:`SharedSQL` rendered in its :class:`~._dialect.Dialect`
at import, so a statement costs no formatting when it runs.
"""

from __future__ import annotations

from typing import Final

from ._dialect import Dialect

__all__ = ["SharedSQL"]

# -- sessions --------------------------------------------------------------------------------------

_REV: Final = "SELECT rev FROM sessions WHERE id = ?"
_DELETE_SESSION: Final = "DELETE FROM sessions WHERE id = ?"
_LIST_IDS: Final = "SELECT s.id FROM sessions s"
_HELD: Final = "SELECT 1 FROM sessions WHERE id = ?"

# -- turns -----------------------------------------------------------------------------------------

_DELETE_TURNS_FROM: Final = "DELETE FROM turns WHERE session_id = ? AND seq >= ?"

# -- runs ------------------------------------------------------------------------------------------

_UPDATE_RUN: Final = "UPDATE runs SET body = ? WHERE session_id = ? AND id = ?"
_DELETE_RUNS: Final = "DELETE FROM runs WHERE session_id = ?"

# -- send requests ---------------------------------------------------------------------------------

_DELETE_SEND: Final = "DELETE FROM send_requests WHERE session_id = ? AND request_id = ?"
_DELETE_SENDS: Final = "DELETE FROM send_requests WHERE session_id = ?"


class SharedSQL:
    """The shared statements in one dialect's spelling."""

    __slots__ = (
        "delete_runs",
        "delete_send",
        "delete_sends",
        "delete_session",
        "delete_turns_from",
        "held_for_send",
        "list_ids",
        "rev",
        "update_run",
    )

    def __init__(self, dialect: Dialect) -> None:
        sql = dialect.sql
        self.rev = sql(_REV)
        self.delete_session = sql(_DELETE_SESSION)
        self.delete_turns_from = sql(_DELETE_TURNS_FROM)
        self.list_ids = _LIST_IDS
        self.held_for_send = sql(_HELD) + dialect.key_share
        self.update_run = sql(_UPDATE_RUN)
        self.delete_runs = sql(_DELETE_RUNS)
        self.delete_send = sql(_DELETE_SEND)
        self.delete_sends = sql(_DELETE_SENDS)
