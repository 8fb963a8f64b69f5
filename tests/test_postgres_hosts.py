"""Several processes (hosts) on one PostgreSQL store: claims have one winner, appends lose nothing.

Each host is a ``tests/_pg_worker.py`` subprocess with its own connection. The
hosts start together (racing the schema migration), then receive the same
command with a shared start time, so their calls reach the server at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
import psycopg
import pytest
import trio
from psycopg import sql
from test_postgres_store import DSN, admin, fresh_schema, session

from zidane_actors.model import Schedule
from zidane_actors.stores import PostgresStore, StoreWrite, open_postgres_store
from zidane_actors.stores.postgres._schema import SCHEMA_VERSION

HOSTS = 4
ROUNDS = 8
WORKER = Path(__file__).with_name("_pg_worker.py")


class Host:
    """One worker process, spoken to in JSON lines (blocking pipes, used from threads)."""

    def __init__(self, schema: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), DSN, schema],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = 0

    def wait_ready(self) -> None:
        self.pid = self.read()["ready"]

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    def write(self, cmd: dict[str, Any]) -> None:
        stdin, _ = self._pipes()
        stdin.write(json.dumps(cmd) + "\n")
        stdin.flush()

    def read(self) -> dict[str, Any]:
        _, stdout = self._pipes()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()}")
        reply: dict[str, Any] = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.write({"op": "quit"})
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    with fresh_schema() as name:
        yield name


@pytest.fixture(scope="module")
def hosts(schema: str) -> Iterator[list[Host]]:
    started: list[Host] = []
    try:
        started.extend(Host(schema) for _ in range(HOSTS))
        for host in started:
            host.wait_ready()
        yield started
    finally:
        for host in started:
            host.close()


@pytest.fixture
async def store(schema: str) -> AsyncIterator[PostgresStore]:
    async with open_postgres_store(DSN, schema=schema, pool_size=2) as opened:
        yield opened


async def everyone(hosts: list[Host], **cmd: Any) -> list[dict[str, Any]]:
    """Send ``cmd`` (plus ``worker``: the host's index) to every host with a shared start
    time; their replies, in host order."""
    at = time.time() + 0.1
    replies: list[dict[str, Any]] = [{} for _ in hosts]

    def ask(i: int) -> dict[str, Any]:
        hosts[i].write({**cmd, "worker": i, "at": at})
        return hosts[i].read()

    async def collect(i: int) -> None:
        replies[i] = await trio.to_thread.run_sync(ask, i)

    async with trio.open_nursery() as nursery:
        for i in range(len(hosts)):
            nursery.start_soon(collect, i)
    return replies


async def test_hosts_migrated_the_schema_once(schema: str, hosts: list[Host]) -> None:
    assert admin(schema, "SELECT version FROM schema_version ORDER BY version") == [
        (v,) for v in range(1, SCHEMA_VERSION + 1)
    ]
    assert len({h.pid for h in hosts}) == HOSTS


async def test_claim_run_has_one_winner_per_round(hosts: list[Host], store: PostgresStore) -> None:
    await store.save(session("claimed"))
    epochs = []
    for _ in range(ROUNDS):
        replies = await everyone(hosts, op="claim_run", session="claimed")
        winners = [h.pid for h, r in zip(hosts, replies, strict=True) if r["claimed"]]
        assert len(winners) == 1, replies
        meta = await store.get_meta("claimed")
        assert meta is not None and meta.status == "running"
        assert meta.run_owner is not None and meta.run_owner.pid == winners[0]
        epochs.append(await store.run_epoch("claimed"))
        await store.update_status("claimed", "idle")
    assert epochs == list(range(1, ROUNDS + 1))


async def test_claim_schedule_fire_has_one_winner_per_due_time(
    hosts: list[Host], store: PostgresStore
) -> None:
    due = 1_000_000
    schedule = Schedule(
        id="every-second",
        prompt="tick",
        enabled=True,
        created_at=1,
        updated_at=1,
        next_fire_at=due,
        interval_ms=1_000,
    )
    await store.save_schedule(schedule)
    for _ in range(ROUNDS):
        replies = await everyone(hosts, op="fire", schedule=schedule.id, due=due, next=due + 1_000)
        assert sum(r["won"] for r in replies) == 1, replies
        due += 1_000
    # A due time already taken, and a disabled schedule, have no winner at all.
    replies = await everyone(hosts, op="fire", schedule=schedule.id, due=due - 1_000, next=due)
    assert not any(r["won"] for r in replies)
    await store.save_schedule(msgspec.structs.replace(schedule, enabled=False, next_fire_at=due))
    replies = await everyone(hosts, op="fire", schedule=schedule.id, due=due, next=due + 1_000)
    assert not any(r["won"] for r in replies)
    [stored] = await store.list_schedules()
    assert stored.next_fire_at == due


@pytest.mark.parametrize("batched", [False, True], ids=["direct", "group-commit"])
async def test_concurrent_appends_lose_and_duplicate_nothing(
    schema: str, hosts: list[Host], store: PostgresStore, batched: bool
) -> None:
    count, batch, sid = 60, 5, f"appended-{batched}"
    await store.save(session(sid))
    replies = await everyone(
        hosts, op="append", session=sid, count=count, batch=batch, batched=batched
    )
    assert all(r["appended"] == count for r in replies)
    ids = [t.id for t in await store.get_turns(sid)]
    batches = count // batch
    assert len(ids) == len(set(ids)) == HOSTS * count + batches
    assert {i for i in ids if i.startswith("shared-")} == {f"shared-{k}" for k in range(batches)}
    for w in range(len(hosts)):
        own = [i for i in ids if i.startswith(f"w{w}-")]
        assert own == [f"w{w}-{i}" for i in range(count)]
    seqs = admin(schema, "SELECT seq FROM turns WHERE session_id = %s ORDER BY seq", (sid,))
    assert [s for (s,) in seqs] == list(range(len(ids)))
    meta = await store.get_meta(sid)
    assert meta is not None and meta.turn_count == meta.user_message_count == len(ids)


async def test_extension_state_set_by_every_host_at_once_keeps_every_key(
    hosts: list[Host], store: PostgresStore
) -> None:
    """Each write lands over the rev it was computed from; a loser computes it again."""
    count, sid = 12, "extension-race"
    await store.save(session(sid))
    replies = await everyone(hosts, op="extension_state", session=sid, count=count)
    assert all(r["set"] == count for r in replies)
    data = await store.load(sid)
    assert data is not None
    want = {f"w{w}-{i}": i for w in range(len(hosts)) for i in range(count)}
    assert data.metadata["extensions"] == {"race": want}


async def _blocked_by(blocker: psycopg.Connection[Any], count: int) -> None:
    """Return once ``count`` backends wait, directly or not, on ``blocker``'s transaction."""
    pid = blocker.info.backend_pid
    with psycopg.connect(DSN, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock'"
            ).fetchall()
            chain = {pid}
            while grown := {p for p, by in rows if p not in chain and chain & set(by)}:
                chain |= grown
            if len(chain) > count:
                return
            await trio.sleep(0.01)


async def test_batches_writing_two_sessions_in_opposite_orders_wait_instead_of_deadlocking(
    schema: str,
) -> None:
    """A batch locks its sessions in id order first: no batch then holds one session while
    waiting for another that a second batch holds (a deadlock, rolled back after a second)."""
    async with (
        open_postgres_store(DSN, schema=schema, pool_size=1) as one,
        open_postgres_store(DSN, schema=schema, pool_size=1) as two,
    ):
        for sid in ("lock-a", "lock-b"):
            await one.save(session(sid))
        writes = {
            name: [StoreWrite("patch_meta", (sid, {name: 1})) for sid in order]
            for name, order in (("one", ("lock-a", "lock-b")), ("two", ("lock-b", "lock-a")))
        }
        with psycopg.connect(DSN) as blocker:  # holds lock-a until both batches wait
            blocker.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            blocker.execute("SELECT 1 FROM sessions WHERE id = 'lock-a' FOR UPDATE")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one.apply_writes, writes["one"])
                await _blocked_by(blocker, 1)
                nursery.start_soon(two.apply_writes, writes["two"])
                await _blocked_by(blocker, 2)
                blocker.commit()
        assert one.statistics().retries == two.statistics().retries == 0
        for sid in ("lock-a", "lock-b"):
            meta = await one.get_meta(sid)
            assert meta is not None and meta.metadata == {"one": 1, "two": 1}
