"""Several hosts in real processes on shared sessions: the recorded history must be consistent.

Three worker processes (``tests/_history_worker.py``) each open a host on one
store and run a seeded random program (load, append, read, rewrite, pop,
metadata save, the openai-agents integration's pop, run claims, eviction) on
three shared sessions, starting together. Their histories are merged and
checked by ``tests/_history.py`` (Elle's list-append rules, extended with
pops): every acknowledged turn is in the store exactly once and in order, each
read (of the store, of a host's view after ``load_session`` or after an
append) is a state the store held during it, no write computed from a stale
view was applied, and run claims never overlap. The programs are seeded; the
interleaving is the operating system's, so a failure names the anomalies found
and the run's seed.

The refreshed variants keep each host's held sessions refreshed while the
programs use them (another task of the host loads them; on PostgreSQL the
store also listens for other writers' changes) and add writes computed from
a view taken before awaits (checked against the ``rev`` the view reflects)
and agent id changes (no change a caller was told is saved may be undone:
``lost-field``).

``benchmarks/soak_history.py`` runs the same harness longer.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from _history import Anomaly, Event, check
from _history_worker import HistoryRun, run_processes
from _pg import fresh_database

from zidane_actors.actors import open_session_host
from zidane_actors.model import RunOwner, SessionData
from zidane_actors.stores import open_sqlite_store

PROCESSES = 3
STEPS = 80
SEED = 21


def summary(anomalies: list[Anomaly], run: HistoryRun) -> str:
    kinds = collections.Counter(a.kind for a in anomalies)
    lines = [f"seed {SEED}: {dict(kinds)}"]
    shown: collections.Counter[str] = collections.Counter()
    for anomaly in anomalies:
        shown[anomaly.kind] += 1
        if shown[anomaly.kind] <= 3:
            lines.append(f"  {anomaly.kind} [{anomaly.session}] {anomaly.detail}")
    lines.extend(f"  lost-meta {line}" for line in run.meta_rollbacks())
    return "\n".join(lines)


def assert_consistent(run: HistoryRun, *, refreshed: bool = False) -> None:
    anomalies = run.anomalies()
    if anomalies or run.meta_rollbacks():
        pytest.fail(summary(anomalies, run), pytrace=False)
    # The programs did what they were drawn to do (the check was not vacuous).
    done = collections.Counter(e.f for e in run.events if e.type == "ok")
    assert done["append"] and done["read"] and done["rewrite"] and done["claim"], done
    if refreshed:
        late = [e for e in run.events if e.f == "rewrite" and "rev" in (e.value or {})]
        assert late and done["refresh"] and done["agent"] and done["patch"], done


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database (its default schema is as fresh), dropped afterwards."""
    with fresh_database("test_history") as url:
        yield url


def test_one_host_alone_is_consistent(tmp_path: Path) -> None:
    # The control: one host (without the integration, a second host) has one view.
    run = run_processes(
        f"sqlite:{tmp_path / 'alone.db'}",
        tmp_path,
        processes=1,
        steps=2 * STEPS,
        seed=SEED,
        skip=("zpop",),
    )
    assert_consistent(run)


def test_sqlite_file_shared_by_three_hosts(tmp_path: Path) -> None:
    run = run_processes(
        f"sqlite:{tmp_path / 'shared.db'}",
        tmp_path,
        processes=PROCESSES,
        steps=STEPS,
        seed=SEED,
    )
    assert_consistent(run)


def test_postgres_database_shared_by_three_hosts(tmp_path: Path, pg_database: str) -> None:
    run = run_processes(pg_database, tmp_path, processes=PROCESSES, steps=STEPS, seed=SEED)
    assert_consistent(run)


def test_sqlite_file_shared_by_three_refreshed_hosts(tmp_path: Path) -> None:
    # Another task of each host loads its sessions while the program uses them.
    run = run_processes(
        f"sqlite:{tmp_path / 'shared.db'}",
        tmp_path,
        processes=PROCESSES,
        steps=STEPS,
        seed=SEED,
        options=("refresh",),
    )
    assert_consistent(run, refreshed=True)


def test_postgres_database_shared_by_three_listening_hosts(
    tmp_path: Path, pg_database: str
) -> None:
    # listen=True: each host refreshes its held sessions when another writer moves them.
    run = run_processes(
        pg_database,
        tmp_path,
        processes=PROCESSES,
        steps=STEPS,
        seed=SEED,
        options=("listen", "refresh"),
    )
    assert_consistent(run, refreshed=True)


class Ops:
    """A hand-made history of the new checks' operations."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def op(
        self, process: str, f: str, start: int, end: int, value: object = None, **extra: object
    ) -> Ops:
        index = len(self.events)
        kind = extra.pop("type", "ok")
        self.events.append(Event(process, index, "invoke", f, "s", value, start))
        self.events.append(Event(process, index, str(kind), f, "s", None, end, extra))
        return self

    def kinds(self, final: Mapping[str, object] | None = None) -> list[str]:
        """The anomalies' kinds, ``final`` the session's fields at the end."""
        fields = None if final is None else {"s": final}
        return sorted(a.kind for a in check(self.events, final_fields=fields))


def test_checker_a_rewrite_from_a_rev_the_store_passed_is_a_stale_write() -> None:
    def history() -> Ops:
        return Ops().op("p0", "append", 0, 5, ["a"]).op("p1", "read", 10, 12, ["a"], rev=5)

    fresh = {"from": ["a"], "to": ["a", "b"], "rev": 5, "rev_at": 12}
    assert history().op("p1", "rewrite", 20, 25, fresh).kinds() == []
    # The store answered rev 6 (a patch, say: the turns alike) before the write began.
    seen = history().op("p2", "read", 14, 16, ["a"], rev=6)
    assert seen.op("p1", "rewrite", 20, 25, fresh).kinds() == ["stale-write"]
    # An append began after rev 5 was read and was acknowledged before the write began
    # (the turns alone cannot tell: the view holds what it appended).
    later = {**fresh, "from": ["a", "c"], "to": ["a", "c", "b"]}
    moved = history().op("p2", "append", 13, 15, ["c"])
    assert moved.op("p1", "rewrite", 20, 25, later).kinds() == ["stale-write"]
    # An append concurrent with reading rev 5 may have come before it.
    maybe = history().op("p2", "append", 11, 15, ["c"])
    assert maybe.op("p1", "rewrite", 20, 25, later).kinds() == []


def test_checker_a_caller_change_undone_is_a_lost_field() -> None:
    def history() -> Ops:
        h = Ops().op("p0", "agent", 0, 5, {"agent": "p0-1"})
        return h.op("p1", "agent", 10, 15, {"agent": "p1-1"})

    final = {"agent_id": "p1-1"}
    assert history().op("p2", "read", 20, 21, [], agent_id="p1-1").kinds(final) == []
    # Back to the older value, or to none, after p1-1 was acknowledged.
    older = history().op("p2", "read", 20, 21, [], agent_id="p0-1")
    assert older.kinds(final) == ["lost-field"]
    assert history().kinds({"agent_id": None}) == ["lost-field", "lost-field"]
    # Writes that overlap may land in either order.
    both = Ops().op("p0", "agent", 0, 10, {"agent": "p0-1"})
    both.op("p1", "agent", 5, 15, {"agent": "p1-1"})
    assert both.kinds({"agent_id": "p0-1"}) == both.kinds({"agent_id": "p1-1"}) == []
    # A value whose write failed, or that no one wrote.
    failed = history().op("p2", "agent", 16, 18, {"agent": "p2-1"}, type="fail")
    assert failed.kinds({"agent_id": "p2-1"}) == ["aborted-read"]
    assert history().kinds({"agent_id": "zz"}) == ["garbage-read"]
    # Metadata keys are fields too: the key named after a saving process, a patched key.
    meta = Ops().op("p0", "save", 0, 5, {"from": [], "meta": 2})
    meta.op("p0", "patch", 6, 8, {"key": "p0.patch", "meta": 1})
    meta.op("p1", "read", 10, 11, [], metadata={"p0": 2, "p0.patch": 1})
    assert meta.kinds() == []
    meta.op("p1", "read", 12, 13, [], metadata={"p0": 2})
    assert meta.kinds() == ["lost-field"]


async def test_a_save_keeps_another_hosts_run_claim(tmp_path: Path) -> None:
    # What the "hold" step finds (double-claim): a host loads a session while a
    # host elsewhere runs it, saves a metadata change, and the run marker is gone,
    # so a third claim wins while the first run still works.
    elsewhere = RunOwner(host_id="elsewhere", pid=1, token="t")
    async with open_sqlite_store(tmp_path / "s.db") as store, open_session_host(store) as host:
        await store.save(SessionData(id="s", created_at=1, updated_at=1))
        assert (await store.claim_run("s", stale_at=0, owner=elsewhere)).claimed
        session = await host.load_session("s")
        assert session is not None
        await session.set_meta("k", 1)
        await session.save()
        stored = await store.load("s")
        assert stored is not None
        assert (stored.status, stored.run_owner) == ("running", elsewhere)
        assert not (await store.claim_run("s", stale_at=0)).claimed
