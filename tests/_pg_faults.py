"""PostgreSQL under faults: writers through a session host while the server ends their sessions.

Shared by ``tests/test_postgres_faults.py`` and ``benchmarks/soak_postgres_faults.py``:

- :class:`PrivateCluster`: a throwaway PostgreSQL cluster (``initdb`` in a temporary
  directory, its own port, trust auth) that a test may stop and restart; the shared
  cluster on :5432 is never touched.
- :func:`write_until`: one writer per session appending through an ``open_session_host``
  over the store (so the store actor groups the appends into ``apply_writes`` batches),
  recording every acknowledged and every failed append in a :class:`Ledger`.
- :func:`check_store`: every acknowledged append is stored exactly once and in order.

Run as ``python tests/_pg_faults.py DSN SCHEMA SESSIONS``, it is one writer process of the
soak: it writes until its stdin closes, then prints its ledger as JSON.
"""

from __future__ import annotations

import collections
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import psycopg
import trio

from zidane_actors.actors import Session, open_session_host
from zidane_actors.errors import StoreUnavailableError
from zidane_actors.model import SessionTurn, TextBlock
from zidane_actors.stores import open_postgres_store


def turn(turn_id: str) -> SessionTurn:
    return SessionTurn(
        id=turn_id, role="user", content=(TextBlock(text=f"text of {turn_id}"),), created_at=1
    )


@attrs.define
class Ledger:
    """What the writers were told: per session, the turn ids in the order they were sent."""

    attempted: dict[str, list[str]] = attrs.field(factory=dict)
    acknowledged: dict[str, list[str]] = attrs.field(factory=dict)
    failures: collections.Counter[str] = attrs.field(factory=collections.Counter)
    """Failed appends by exception type."""
    messages: collections.Counter[str] = attrs.field(factory=collections.Counter)
    """Failed appends by the first line of their message (what the caller saw)."""
    answered: trio.Event = attrs.field(factory=trio.Event)
    """Set (and replaced) whenever an append is answered."""

    @property
    def acks(self) -> int:
        return sum(map(len, self.acknowledged.values()))

    @property
    def events(self) -> int:
        """Appends answered so far, either way."""
        return self.acks + sum(self.failures.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "attempted": self.attempted,
            "acknowledged": self.acknowledged,
            "failures": dict(self.failures),
            "messages": dict(self.messages),
        }

    def merge(self, other: dict[str, Any]) -> None:
        self.attempted.update(other["attempted"])
        self.acknowledged.update(other["acknowledged"])
        self.failures.update(other["failures"])
        self.messages.update(other["messages"])


async def append_once(session: Session, turn_id: str, ledger: Ledger) -> bool:
    """Append one turn, recording the outcome; ``StoreUnavailableError`` is the expected failure."""
    ledger.attempted.setdefault(session.id, []).append(turn_id)
    acknowledged = False
    try:
        await session.append_turns([turn(turn_id)])
        acknowledged = True
    except StoreUnavailableError as exc:
        ledger.failures[type(exc).__name__] += 1
        ledger.messages[str(exc).splitlines()[0][:120]] += 1
    if acknowledged:
        ledger.acknowledged.setdefault(session.id, []).append(turn_id)
    ledger.answered.set()
    ledger.answered = trio.Event()
    return acknowledged


async def write_until(session: Session, stop: trio.Event, ledger: Ledger) -> None:
    """Append ``{session}:{n}`` turns, one at a time, until ``stop`` is set."""
    n = 0
    while not stop.is_set():
        n += 1
        await append_once(session, f"{session.id}:{n}", ledger)


async def wait_for_events(ledger: Ledger, at_least: int) -> None:
    """Return once the writers answered ``at_least`` appends in all."""
    while ledger.events < at_least:
        await ledger.answered.wait()


def stored_turns(dsn: str, schema: str) -> dict[str, list[str]]:
    """Every session's stored turn ids in stored order, read from outside the store."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            psycopg.sql.SQL("SELECT session_id, id FROM {}.turns ORDER BY session_id, seq").format(
                psycopg.sql.Identifier(schema)
            )
        ).fetchall()
    stored: dict[str, list[str]] = {}
    for sid, tid in rows:
        stored.setdefault(sid, []).append(tid)
    return stored


def check_store(stored: dict[str, list[str]], ledger: Ledger) -> int:
    """Assert the store against the ledger; answer how many failed appends were stored anyway.

    Per session: no turn id twice, nothing that was never sent, turns in the
    order they were sent, and every acknowledged one present. A failed append
    may be stored (its commit may have reached the server before the answer
    was lost), never twice.
    """
    landed_anyway = 0
    for sid, attempted in ledger.attempted.items():
        got = stored.get(sid, [])
        assert len(got) == len(set(got)), f"{sid}: a turn is stored twice"
        position = {tid: i for i, tid in enumerate(attempted)}
        unknown = [tid for tid in got if tid not in position]
        assert not unknown, f"{sid}: stored turns never sent: {unknown[:5]}"
        order = [position[tid] for tid in got]
        assert order == sorted(order), f"{sid}: stored out of order"
        acked = ledger.acknowledged.get(sid, [])
        missing = sorted(set(acked) - set(got), key=position.__getitem__)
        assert not missing, f"{sid}: {len(missing)} acknowledged turns lost, first {missing[:5]}"
        landed_anyway += len(got) - len(acked)
    assert set(stored) <= set(ledger.attempted), "turns stored for sessions never written"
    return landed_anyway


def kill_backends(admin: psycopg.Connection[Any], schema: str, wait_ms: int = 0) -> int:
    """Terminate every server session of the store on ``schema`` (named after it); with
    ``wait_ms``, each is gone when this returns (else it may still be ending)."""
    rows = admin.execute(
        "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity"
        " WHERE pid <> pg_backend_pid() AND application_name = %s",
        (wait_ms, f"zidane_actors:{schema}"),
    ).fetchall()
    return len(rows)


# -- a private cluster ---------------------------------------------------------------------------


def postgres_bin() -> Path | None:
    """The directory of PostgreSQL's server programs (``initdb``, ``pg_ctl``), if installed."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True
    )
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    found = shutil.which("pg_ctl")
    return Path(found).parent if found and shutil.which("initdb") else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateCluster:
    """A PostgreSQL cluster of our own on 127.0.0.1 (trust auth), deleted by :meth:`destroy`.

    Run as the ``postgres`` user when this process is root (the server refuses
    to run as root), else as this user.
    """

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="zidane-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run(
            "initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"
        )

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, program: str, *args: object) -> None:
        subprocess.run(
            [*self._as, str(self.bindir / program), *map(str, args)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.root,
        )

    def start(self) -> None:
        # fsync off: a stopped server keeps the page cache (only the machine could lose it);
        # synchronous_commit stays on, so an immediate stop loses no acknowledged commit.
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            " -c fsync=off -c full_page_writes=off -c max_connections=40"
            " -c shared_buffers=16MB"
        )
        self._run("pg_ctl", "-D", self.data, "-l", self.root / "log", "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` ends every session, ``immediate`` is a crash."""
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def private_cluster(bindir: Path) -> Iterator[PrivateCluster]:
    cluster = PrivateCluster(bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


# -- one writer process of the soak -------------------------------------------------------------


async def final_round(sessions: Sequence[Session], ledger: Ledger, tag: str) -> int:
    """One more append per session, all at once (one batch or a few): how many failed."""
    failed = 0

    async def last(session: Session) -> None:
        nonlocal failed
        failed += not await append_once(session, f"{session.id}:{tag}", ledger)

    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(last, session)
    return failed


async def _worker(dsn: str, schema: str, sessions: Sequence[str]) -> None:
    ledger = Ledger()
    stop = trio.Event()
    async with (
        open_postgres_store(dsn, schema=schema) as store,
        open_session_host(store) as host,
    ):
        handles = [await host.create_session(id=sid) for sid in sessions]
        async with trio.open_nursery() as nursery:
            for session in handles:
                nursery.start_soon(write_until, session, stop, ledger)
            print(json.dumps({"ready": os.getpid()}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)  # until the soak closes our stdin
            stop.set()
        failed_after = await final_round(handles, ledger, "after")
        stats = attrs.asdict(store.statistics())
        batches = host.statistics().store.batches
    report = {"ledger": ledger.to_json(), "failed_after": failed_after, "store": stats}
    print(json.dumps({**report, "batches": batches}), flush=True)


if __name__ == "__main__":
    trio.run(_worker, sys.argv[1], sys.argv[2], sys.argv[3].split(","))
