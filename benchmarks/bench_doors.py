"""Every door into a session store, against its baseline measured in the same run.

Each row compares one way in (asyncio through ``portal.open_host_async``,
blocking threads through ``portal.start_host``, ...) with a baseline: the trio
host itself (``open_session_host`` over the same store URL, defaults) or the
peer a user would pick instead (openai-agents' ``SQLiteSession``). Turns are
realistic (1-4 KB of JSON, ``_realistic.py``); every commit is durable (the
SQLite store's defaults: WAL, ``synchronous=FULL``, on a file).

Rounds alternate the variants' order; each ratio is printed as the median over
rounds with its spread (min-max). Throughput variants each run in a fresh
interpreter (a heap holding only their own imports); the one-session latency
variants run side by side in one process, their appends interleaved one by
one so a burst of disk contention lands on all of them alike.

A row is one function returning its :class:`Row` lines; add one to ``ROWS``.

Run: ``.venv/bin/python benchmarks/bench_doors.py [--quick] [--rounds N] [--only ROW]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import attrs
import trio
from _realistic import step_turn, turn_item

from zidane_actors.actors import open_session_host
from zidane_actors.model import SessionTurn
from zidane_actors.portal import open_host_async, start_host
from zidane_actors.stores._url import open_store_url


@attrs.frozen
class Row:
    """One line of the table: a door, what is measured, and its ratios over rounds."""

    door: str
    measure: str
    ratios: list[float]
    target: str
    met: bool | None  # None: no target
    detail: str = ""

    def line(self) -> str:
        med = statistics.median(self.ratios)
        spread = f"{min(self.ratios):.2f}-{max(self.ratios):.2f}"
        verdict = "" if self.met is None else ("met" if self.met else "NOT met")
        return (
            f"| {self.door} | {self.measure} | {med:.2f}x ({spread}) | {self.target} | {verdict} |"
            f" {self.detail} |"
        )


def have(module: str) -> bool:
    """Whether ``module`` is installed (found, not imported: this process stays lean)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def turns_for(session: int, appends: int) -> list[SessionTurn]:
    return [step_turn(session, i) for i in range(appends)]


class Clock:
    """Wall and process CPU time over a block."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def result(self, appends: int) -> dict[str, float]:
        return {"per_s": appends / self.wall, "cpu_us": self.cpu / appends * 1e6}


# -- throughput variants (each in a fresh interpreter) ------------------------------------------


def trio_host_many(db: Path, sessions: int, appends: int) -> dict[str, float]:
    """``sessions`` trio tasks on the trio host, each appending ``appends`` turns in turn."""
    work = [turns_for(s, appends) for s in range(sessions)]

    async def main() -> dict[str, float]:
        async with open_store_url(f"sqlite:{db}") as store, open_session_host(store) as host:
            handles = [await host.create_session(id=f"s{s}") for s in range(sessions)]

            async def one(s: int) -> None:
                for turn in work[s]:
                    await handles[s].append_turns([turn])

            with Clock() as clock:
                async with trio.open_nursery() as nursery:
                    for s in range(sessions):
                        nursery.start_soon(one, s)
            assert handles[-1].turns == tuple(work[-1])
        return clock.result(sessions * appends)

    return trio.run(main)


def asyncio_many(db: Path, sessions: int, appends: int) -> dict[str, float]:
    """``sessions`` asyncio tasks through ``open_host_async``, each appending in turn."""
    work = [turns_for(s, appends) for s in range(sessions)]

    async def main() -> dict[str, float]:
        async with open_host_async(f"sqlite:{db}") as host:
            handles = [await host.create_session(id=f"s{s}") for s in range(sessions)]

            async def one(s: int) -> None:
                for turn in work[s]:
                    await handles[s].append_turns([turn])

            with Clock() as clock:
                await asyncio.gather(*(one(s) for s in range(sessions)))
            assert handles[-1].turns == tuple(work[-1])
        return clock.result(sessions * appends)

    return asyncio.run(main())


def threads_many(db: Path, sessions: int, appends: int) -> dict[str, float]:
    """``sessions`` threads through ``start_host``, each appending in turn."""
    work = [turns_for(s, appends) for s in range(sessions)]
    with start_host(f"sqlite:{db}") as host:
        handles = [host.create_session(id=f"s{s}") for s in range(sessions)]
        go = threading.Barrier(sessions + 1)

        def one(s: int) -> None:
            go.wait()
            for turn in work[s]:
                handles[s].append_turns([turn])

        threads = [threading.Thread(target=one, args=(s,)) for s in range(sessions)]
        for thread in threads:
            thread.start()
        with Clock() as clock:
            go.wait()
            for thread in threads:
                thread.join()
        assert handles[-1].turns == tuple(work[-1])
    return clock.result(sessions * appends)


VARIANTS: dict[str, Callable[[Path, int, int], dict[str, float]]] = {
    "trio-host": trio_host_many,
    "asyncio": asyncio_many,
    "threads": threads_many,
}


def in_own_process(variant: str, db: Path, sessions: int, appends: int) -> dict[str, float]:
    done = subprocess.run(
        [
            *(sys.executable, __file__, "--variant", variant, "--db", str(db)),
            *("--sessions", str(sessions), "--appends", str(appends)),
        ],
        capture_output=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{variant} failed:\n{done.stderr.decode()}")
    result: dict[str, float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


def compare(
    tmp: Path, rounds: int, baseline: str, candidate: str, sessions: int, appends: int
) -> tuple[list[float], dict[str, list[dict[str, float]]]]:
    """Throughput of ``candidate`` over ``baseline`` per round, alternating which goes first."""
    runs: dict[str, list[dict[str, float]]] = {baseline: [], candidate: []}
    for r in range(rounds):
        order = [baseline, candidate] if r % 2 == 0 else [candidate, baseline]
        for name in order:
            db = tmp / f"{candidate}-vs-{baseline}-{name}-{sessions}-{r}.db"
            runs[name].append(in_own_process(name, db, sessions, appends))
    ratios = [c["per_s"] / b["per_s"] for b, c in zip(runs[baseline], runs[candidate], strict=True)]
    return ratios, runs


def detail(runs: dict[str, list[dict[str, float]]], names: dict[str, str]) -> str:
    parts = []
    for key, label in names.items():
        per_s = statistics.median(r["per_s"] for r in runs[key])
        cpu = statistics.median(r["cpu_us"] for r in runs[key])
        parts.append(f"{label} {per_s:,.0f}/s, {cpu:.0f} µs CPU/append")
    return "; ".join(parts)


# -- one session, p50 latency (the variants side by side in this process) -----------------------


class AsyncioThread:
    """An asyncio loop in a thread of its own; coroutines are timed inside it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def timed(append: Callable[[], Coroutine[Any, Any, Any]]) -> float:
    start = time.perf_counter()
    await append()
    return time.perf_counter() - start


async def latency_round(tmp: Path, r: int, appends: int) -> dict[str, float]:
    """p50 of one durable append through each door; appends interleaved one by one."""
    turns = turns_for(0, appends)
    side = AsyncioThread()
    portal_host = side.run(_enter(open_host_async(f"sqlite:{tmp / f'lat-async-{r}.db'}")))
    portal_session = side.run(portal_host[1].create_session(id="s0"))
    agents = None
    if have("agents"):
        from agents.memory import SQLiteSession

        agents = SQLiteSession("s0", tmp / f"lat-agents-{r}.db")
    samples: dict[str, list[float]] = {"trio-host": [], "asyncio": []}
    if agents is not None:
        samples["openai-agents"] = []
    async with (
        open_store_url(f"sqlite:{tmp / f'lat-trio-{r}.db'}") as store,
        open_session_host(store) as host,
    ):
        session = await host.create_session(id="s0")
        for i, turn in enumerate(turns):
            item = turn_item(turn)
            steps: dict[str, Callable[[], Any]] = {
                "trio-host": lambda turn=turn: timed(lambda: session.append_turns([turn])),
                "asyncio": lambda turn=turn: trio.to_thread.run_sync(
                    side.run, timed(lambda: portal_session.append_turns([turn]))
                ),
            }
            if agents is not None:
                steps["openai-agents"] = lambda item=item: trio.to_thread.run_sync(
                    side.run, timed(lambda: agents.add_items([item]))
                )
            names = list(steps)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                samples[name].append(await steps[name]())
    side.run(_exit(portal_host[0]))
    if agents is not None:
        agents.close()
    side.close()
    return {name: statistics.median(values) for name, values in samples.items()}


async def _enter(cm: Any) -> tuple[Any, Any]:
    return cm, await cm.__aenter__()


async def _exit(cm: Any) -> None:
    await cm.__aexit__(None, None, None)


# -- the rows -----------------------------------------------------------------------------------


def row_asyncio_one_session(tmp: Path, rounds: int, quick: bool) -> list[Row]:
    """open_host_async, one session: p50 per durable append vs the trio host and openai-agents."""
    appends = 60 if quick else 200
    found = [trio.run(latency_round, tmp, r, appends) for r in range(rounds)]
    p50 = {name: statistics.median(f[name] for f in found) * 1e3 for name in found[0]}
    vs_trio = [f["asyncio"] / f["trio-host"] for f in found]
    rows = [
        Row(
            "`open_host_async`",
            f"one session, p50 per durable append ({appends} appends/round)",
            vs_trio,
            "≤ 1.1x the trio host",
            statistics.median(vs_trio) <= 1.1,
            f"{p50['asyncio']:.3f} ms vs {p50['trio-host']:.3f} ms",
        )
    ]
    if "openai-agents" in p50:
        vs_agents = [f["asyncio"] / f["openai-agents"] for f in found]
        rows.append(
            Row(
                "`open_host_async`",
                "one session, p50 per durable append",
                vs_agents,
                "≤ 1.0x openai-agents `SQLiteSession` from asyncio",
                statistics.median(vs_agents) <= 1.0,
                f"{p50['asyncio']:.3f} ms vs {p50['openai-agents']:.3f} ms",
            )
        )
    return rows


def row_asyncio_throughput(tmp: Path, rounds: int, quick: bool) -> list[Row]:
    """open_host_async throughput at 100 and 1000 sessions vs the trio host."""
    rows = []
    for sessions, appends in ((100, 30), (1000, 3)):
        if quick:
            appends = max(3, appends // 3)
        ratios, runs = compare(tmp, rounds, "trio-host", "asyncio", sessions, appends)
        rows.append(
            Row(
                "`open_host_async`",
                f"throughput, {sessions} sessions x {appends} appends",
                ratios,
                "≥ 0.8x the trio host",
                statistics.median(ratios) >= 0.8,
                detail(runs, {"asyncio": "asyncio", "trio-host": "trio host"}),
            )
        )
    return rows


def row_blocking_threads(tmp: Path, rounds: int, quick: bool) -> list[Row]:
    """start_host with 100 threads vs the trio host with 100 tasks."""
    appends = 10 if quick else 30
    ratios, runs = compare(tmp, rounds, "trio-host", "threads", 100, appends)
    return [
        Row(
            "`start_host`",
            f"throughput, 100 threads x {appends} appends",
            ratios,
            "≥ 0.7x the trio host",
            statistics.median(ratios) >= 0.7,
            detail(runs, {"threads": "threads", "trio-host": "trio host"}),
        )
    ]


ROWS: dict[str, Callable[[Path, int, bool], list[Row]]] = {
    "asyncio-latency": row_asyncio_one_session,
    "asyncio-throughput": row_asyncio_throughput,
    "threads": row_blocking_threads,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer appends and 2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per row (default 5)")
    parser.add_argument("--only", action="append", default=[], choices=list(ROWS))
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--appends", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant is not None:
        print(json.dumps(VARIANTS[args.variant](args.db, args.sessions, args.appends)))
        return
    rounds = args.rounds or (2 if args.quick else 5)
    if not have("agents"):
        print("openai-agents not installed (pip install '.[bench]'): its rows are skipped")
    print("| door | measure | ratio: median (min-max) | target | verdict | figures (medians) |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as name:
        for key, row in ROWS.items():
            if args.only and key not in args.only:
                continue
            for line in row(Path(name), rounds, args.quick):
                print(line.line(), flush=True)


if __name__ == "__main__":
    main()
