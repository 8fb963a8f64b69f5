"""REST appends, as ratios against baselines measured in the same run.

A real ``zidane-actors serve`` process on 127.0.0.1 over a SQLite file, and
remote stores (httpx) in this process.

1. Append latency against history length: one client appends one turn at a
   time, alternately to a session holding 10,000 turns and to one that
   started empty; the ratio of the medians. Target <= 1.2x (an append must
   not read the history).
2. Throughput: 50 remote clients, each appending one turn at a time to its
   own session, all at once, against the embedded path (a session host over
   its own SQLite file in this process, the same sessions and turns).
   Target >= 50% of the embedded items/s (group commit through the
   server's store actor). For scale, the same clients' rate of the
   cheapest request (``GET /capabilities``): what HTTP itself costs here.

Run: ``python benchmarks/bench_rest.py [--history N] [--samples N] [--clients N] [--appends N]``
(about a minute).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from zidane_actors.actors import open_session_host
from zidane_actors.model import SessionData, SessionTurn, TextBlock
from zidane_actors.stores import create_remote_store, open_sqlite_store

LATENCY_TARGET = 1.2
THROUGHPUT_TARGET = 0.5
TEXT = "lorem ipsum dolor sit amet " * 40  # about 1 KB per turn


def turn(session_id: str, n: int) -> SessionTurn:
    return SessionTurn(
        id=f"{session_id}-{n}",
        role="user" if n % 2 == 0 else "assistant",
        content=(TextBlock(text=f"{n} {TEXT}"),),
        created_at=1_700_000_000_000 + n,
    )


class Server:
    """``zidane-actors serve`` on a free loopback port."""

    def __init__(self, db: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZIDANE_ACTORS_")}
        argv = [sys.executable, "-m", "zidane_actors.cli", "serve", "--store", f"sqlite:{db}"]
        self.proc = subprocess.Popen(
            [*argv, "--port", "0"], stdout=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = line.removeprefix("listening on ").strip()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)


async def latency(url: str, history: int, samples: int) -> tuple[float, float]:
    """Median seconds per one-turn append at ``history`` turns and from an empty start."""
    async with create_remote_store(url) as remote:
        await remote.save(
            SessionData(
                id="long",
                created_at=1,
                updated_at=1,
                turns=tuple(turn("long", n) for n in range(history)),
            )
        )
        await remote.save(SessionData(id="short", created_at=1, updated_at=1))
        long_times, short_times = [], []
        for n in range(samples):
            for sid, times, at in (("long", long_times, history), ("short", short_times, 0)):
                start = time.perf_counter()
                await remote.append_turns(sid, [turn(sid, at + n)])
                times.append(time.perf_counter() - start)
        stored = await remote.get_turns("long", history)
        assert len(stored) == samples
    return statistics.median(long_times), statistics.median(short_times)


async def rest_throughput(url: str, clients: int, appends: int) -> float:
    """Turns per second of ``clients`` remote stores appending at once."""
    remotes = [create_remote_store(url) for _ in range(clients)]
    for i, remote in enumerate(remotes):
        await remote.save(SessionData(id=f"c{i}", created_at=1, updated_at=1))

    async def writer(i: int) -> None:
        for n in range(appends):
            await remotes[i].append_turns(f"c{i}", [turn(f"c{i}", n)])

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(clients):
            nursery.start_soon(writer, i)
    elapsed = time.perf_counter() - start
    assert len(await remotes[0].get_turns("c0")) == appends
    for remote in remotes:
        await remote.aclose()
    return clients * appends / elapsed


async def http_floor(url: str, clients: int, requests: int) -> float:
    """Requests per second of ``clients`` remote stores asking for the capabilities."""
    remotes = [create_remote_store(url) for _ in range(clients)]

    async def asker(i: int) -> None:
        for _ in range(requests):
            await remotes[i].capabilities()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(clients):
            nursery.start_soon(asker, i)
    elapsed = time.perf_counter() - start
    for remote in remotes:
        await remote.aclose()
    return clients * requests / elapsed


async def embedded_throughput(db: Path, clients: int, appends: int) -> float:
    """Turns per second of the same writers on a session host in this process."""
    async with open_sqlite_store(db) as store, open_session_host(store) as host:
        sessions = [await host.create_session(id=f"c{i}") for i in range(clients)]

        async def writer(i: int) -> None:
            for n in range(appends):
                await sessions[i].append_turns([turn(f"c{i}", n)])

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(clients):
                nursery.start_soon(writer, i)
        elapsed = time.perf_counter() - start
    return clients * appends / elapsed


async def main(history: int, samples: int, clients: int, appends: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "served.db")
        try:
            long, short = await latency(server.url, history, samples)
            ratio = long / short
            verdict = "met" if ratio <= LATENCY_TARGET else "NOT met"
            print(f"1. one-turn append, median of {samples}, one client")
            print(f"   empty session:      {short * 1000:7.2f} ms (baseline)")
            print(f"   {history} turns:        {long * 1000:7.2f} ms  ratio {ratio:.2f}x")
            print(f"   target <= {LATENCY_TARGET:.1f}x: {verdict}")
            rest = await rest_throughput(server.url, clients, appends)
            floor = await http_floor(server.url, clients, appends)
        finally:
            server.stop()
        embedded = await embedded_throughput(Path(tmp) / "embedded.db", clients, appends)
    share = rest / embedded
    verdict = "met" if share >= THROUGHPUT_TARGET else "NOT met"
    print(f"2. {clients} writers x {appends} one-turn appends, at once")
    print(f"   embedded host:      {embedded:9.0f} turns/s (baseline)")
    print(f"   {clients} remote clients: {rest:9.0f} turns/s  {share:.0%} of the embedded")
    print(f"   target >= {THROUGHPUT_TARGET:.0%}: {verdict}")
    print(
        f"   for scale, GET /capabilities: {floor:9.0f} requests/s "
        f"(appends reach {rest / floor:.0%} of it)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--appends", type=int, default=40)
    args = parser.parse_args()
    trio.run(main, args.history, args.samples, args.clients, args.appends)
