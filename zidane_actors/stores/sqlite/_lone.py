"""A write run in the trio thread (``WorkerThread.run``'s ``here``), never waiting there.

It is made only when the connection's thread is idle; it must not wait on
another connection's write lock (up to the busy timeout), which would stall
every task of the trio thread. So it runs with no busy timeout: a lock held
elsewhere fails it at once, rolled back (nothing done), and the write runs in
the connection's thread instead, waiting as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .._thread import RunElsewhere
from ._rows import _Busy, _Conn

__all__ = ["without_waiting"]

T = TypeVar("T")


def without_waiting(job: Callable[[_Conn], T], conn: _Conn) -> T:
    """``job(conn)`` with no busy timeout; :class:`RunElsewhere` where it would wait."""
    (timeout,) = conn.execute("PRAGMA busy_timeout").fetchone()
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        return job(conn)
    except _Busy:  # rolled back by its transaction: nothing was done
        raise RunElsewhere from None
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout)}")
