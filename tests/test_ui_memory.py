"""Many browsers viewing a huge session at once keep a real server within its memory budget.

A session page reads a page of turns, or the whole session when it has
runs: those reads count against the body budget (``--max-body-bytes-in-flight``)
as request bodies and answers do, so concurrent views beyond it are answered
503 ``busy`` instead of each holding its own copy of the session.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing
from test_server_e2e import ServerProcess

from zidane_actors.model import SessionData, SessionRun, SessionTurn, TextBlock
from zidane_actors.server._errors import ApiError
from zidane_actors.server._limits import BodyBudget, ReadBudget
from zidane_actors.stores import open_sqlite_store

MB = 1_000_000
BUDGET = 16 * MB
"""The server's body budget: smaller than the session, so one view at a time fits."""
TURN_CHARS = 400_000
TURNS = 60
"""60 turns of 400 KB: a 24 MB session, every page of which reads 24 MB."""
VIEWS = 24


def _huge(sid: str, turns: int) -> SessionData:
    run = SessionRun(id="r1", prompt="go", started_at=0, status="completed")
    return SessionData(
        id=sid,
        created_at=0,
        updated_at=1,
        turns=tuple(
            SessionTurn(
                id=f"t{i}",
                role="user" if i % 2 == 0 else "assistant",
                content=(TextBlock(text=f"turn {i} " + "x" * TURN_CHARS),),
                created_at=i,
                run_id="r1",
            )
            for i in range(turns)
        ),
        runs=(run,),
    )


async def _seed(path: Path) -> None:
    async with open_sqlite_store(path) as store:
        await store.save(_huge("huge", TURNS))
        await store.save(_huge("small", 2))


def _kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    path = tmp_path / "huge.db"
    trio.run(_seed, path)
    limits = ["--max-body-bytes", str(BUDGET), "--max-body-bytes-in-flight", str(BUDGET)]
    server = ServerProcess(f"sqlite:{path}", args=limits)
    server.start()
    yield server
    server.stop()


def test_concurrent_views_of_a_huge_session_stay_within_the_budget(
    server: ServerProcess,
) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    with httpx.Client(base_url=server.url, timeout=120) as client:
        warm = client.get("/ui/fragments/sessions/small")  # imports and caches: the baseline
        assert warm.status_code == 200, warm.text[:300]
        baseline = _kib(pid, "VmRSS")

        def view(_: int) -> httpx.Response:
            return client.get("/ui/fragments/sessions/huge")

        with ThreadPoolExecutor(VIEWS) as pool:
            answers = list(pool.map(view, range(VIEWS)))
        peak = _kib(pid, "VmHWM")

        rendered = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 503]
        assert len(rendered) + len(refused) == VIEWS, [a.status_code for a in answers]
        assert rendered, "at least the first view renders"
        for answer in rendered:
            assert 'data-session-id="huge"' in answer.text
        for answer in refused:  # the budget's answer, as for bodies and answers
            assert answer.json()["error"]["code"] == "busy"
            assert answer.headers["retry-after"] == "1"
        # The budget plus one read not yet measured, each held about twice (the
        # stored JSON and the decoded turns) with room for the allocator: far
        # below the views' copies (24 × 24 MB).
        bound_kib = 4 * (BUDGET + TURNS * TURN_CHARS) // 1024
        assert peak - baseline < bound_kib, (peak - baseline, bound_kib, len(rendered))

        alone = client.get("/ui/fragments/sessions/huge")  # larger than the budget, but alone
        assert alone.status_code == 200
        more = client.get("/ui/fragments/sessions/huge/turns/59/more?block=0&from=32768")
        assert more.status_code == 200 and "x" * (TURN_CHARS - 32_768) in more.text


async def test_a_measured_read_reserves_first_and_unmeasured_keys_go_side_by_side() -> None:
    budget = BodyBudget(100)
    reads = ReadBudget(budget)
    async with reads.hold("a") as held:
        held.add(60)  # measured as read: counted without the check
        assert budget.held == 60
    assert budget.held == 0
    async with reads.hold("a"):
        assert budget.held == 60  # reserved before reading
        with pytest.raises(ApiError) as refused:
            async with reads.hold("a"):
                pass
        assert (refused.value.status, refused.value.code) == (503, "busy")
        assert refused.value.headers == {"retry-after": "1"}
    async with reads.hold("huge") as held:
        held.add(150)
    async with reads.hold("huge"):  # larger than the whole budget: goes alone
        assert budget.held == 150
    order: list[str] = []

    async def unmeasured(key: str, size: int = 1) -> None:
        async with reads.hold(key) as held:
            order.append(f"+{key}")
            await trio.lowlevel.checkpoint()
            held.add(size)
            order.append(f"-{key}")

    async with trio.open_nursery() as nursery:  # different keys: side by side
        nursery.start_soon(unmeasured, "x")
        nursery.start_soon(unmeasured, "y")
    assert sorted(order[:2]) == ["+x", "+y"], order
    assert budget.held == 0


async def test_first_reads_of_one_key_wait_for_its_measure_and_few_keys_go_unmeasured() -> None:
    budget = BodyBudget(100)
    reads = ReadBudget(budget, unmeasured=2)
    order: list[str] = []
    gates = {"a1": trio.Event(), "b": trio.Event()}

    async def read(name: str, key: str, size: int) -> None:
        try:
            async with reads.hold(key) as held:
                order.append(f"+{name}")
                if name in gates:
                    await gates[name].wait()
                else:
                    await trio.lowlevel.checkpoint()
                held.add(size)
                order.append(f"-{name}")
        except ApiError as exc:
            order.append(f"{name}:{exc.code}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, "a1", "a", 60)  # measures a, until its gate opens
        await trio.testing.wait_all_tasks_blocked()
        for name in ("a2", "a3"):  # wait for a's measure, then reserve it: one fits
            nursery.start_soon(read, name, "a", 60)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(read, "b", "b", 1)  # another key: the second unmeasured slot
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(read, "c", "c", 1)  # a third: waits for a slot
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["+a1", "+b"]
        gates["b"].set()
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["+a1", "+b", "-b", "+c", "-c"]
        gates["a1"].set()
    assert order[5] == "-a1"
    assert sorted(order[6:]) in (["+a2", "-a2", "a3:busy"], ["+a3", "-a3", "a2:busy"]), order
    assert budget.held == 0
