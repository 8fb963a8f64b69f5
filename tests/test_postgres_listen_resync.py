"""A PostgreSQL change feed that lost its connection resyncs: nothing committed meanwhile is missed.

PostgreSQL never replays a notification sent while the listening connection
was down, so once the feed listens again its subscribers are told to resync:
a host re-checks the rev of every session it holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio
from test_postgres_store import DSN, admin, fresh_schema, session, turn

from zidane_actors.actors import open_session_host
from zidane_actors.stores import open_postgres_store
from zidane_actors.stores.postgres._conn import _Conn

DEADLINE_S = 10.0
"""Bounds a stuck test: never a claim about how fast anything is."""


async def eventually(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` until it holds; fail after :data:`DEADLINE_S`."""
    deadline = trio.current_time() + DEADLINE_S
    while not check():
        if trio.current_time() > deadline:
            pytest.fail(f"waited {DEADLINE_S} s for {what}")
        await trio.sleep(0.05)


def kill_listener(schema: str) -> int:
    """Terminate the store's ``LISTEN`` connection (its last statement): how many ended."""
    return len(
        admin(
            schema,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s"
            " AND query LIKE 'LISTEN%%'",
            (f"zidane_actors:{schema}",),
        )
    )


def listening(schema: str) -> bool:
    rows = admin(
        schema,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = %s AND query LIKE 'LISTEN%%'",
        (f"zidane_actors:{schema}",),
    )
    return bool(rows[0][0])


async def test_a_change_committed_while_the_feed_was_down_reaches_the_holding_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another writer appends while the feed's connection is down (held down until the append
    committed): the host's held session shows the turn anyway, without a ``load_session``."""
    with fresh_schema() as schema:
        async with (
            open_postgres_store(DSN, schema=schema, listen=True) as store,
            open_postgres_store(DSN, schema=schema) as other,
            open_session_host(store) as host,
        ):
            feed = store._feed
            assert feed is not None
            lost, may_reconnect = threading.Event(), threading.Event()
            ensure = _Conn.ensure

            def gated_ensure(conn: _Conn) -> Any:
                """The feed's reconnect waits until the test's append committed."""
                if conn is feed.conn and conn.connected and conn.raw is None:
                    lost.set()
                    may_reconnect.wait(DEADLINE_S)
                return ensure(conn)

            monkeypatch.setattr(_Conn, "ensure", gated_ensure)
            try:
                await other.save(session("s1", turns=(turn(0),)))
                held = await host.load_session("s1")
                assert held is not None
                await eventually(lambda: listening(schema), "the feed to listen")
                assert kill_listener(schema) == 1
                # The feed notices at its next wait for notifications, not at its next query.
                await eventually(lost.is_set, "the feed to notice its connection died")
                await other.append_turns("s1", [turn(1, "assistant")])
            finally:
                may_reconnect.set()
            await eventually(
                lambda: [t.id for t in held.turns] == ["t0", "t1"],
                "the held session to show the turn appended while the feed was down",
            )
            assert store.statistics().resyncs == 1


def test_a_terminated_listening_connection_fails_its_wait_for_notifications() -> None:
    """What the feed relies on to notice a loss: ``notifies`` raises, it does not wait on."""
    with psycopg.connect(DSN, autocommit=True) as raw:
        raw.execute("LISTEN zidane_resync_probe")
        with psycopg.connect(DSN, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (raw.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            for _ in range(round(DEADLINE_S / 0.2)):
                list(raw.notifies(timeout=0.2))
