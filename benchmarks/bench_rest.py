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
   cheapest request (``GET /capabilities``), and the CPU each side spends
   per request (server: its process; client: this one) next to the floor
   of the HTTP stack itself: a bare ASGI app on hypercorn answering 204
   to the same 50 bare httpx clients posting the same bodies.
3. The same 50 sessions in one session host over ONE remote store: the
   host's store actor batches the sessions' writes and sends each batch
   as one ``POST /writes`` (one transaction on the server), against the
   embedded host.

Run: ``python benchmarks/bench_rest.py [--history N] [--samples N] [--clients N] [--appends N]``
(about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import httpx
import msgspec
import trio

from zidane_actors.actors import SessionHost, open_session_host
from zidane_actors.model import SessionData, SessionTurn, TextBlock
from zidane_actors.stores import create_remote_store, open_sqlite_store

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

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
    """``zidane-actors serve`` on a free loopback port (or, with ``bare``, the bare app)."""

    def __init__(self, db: Path | None, *, bare: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZIDANE_ACTORS_")}
        argv = [sys.executable, "-m", "zidane_actors.cli", "serve", "--store", f"sqlite:{db}"]
        argv += ["--port", "0"]
        if bare:
            argv = [sys.executable, __file__, "--bare-server"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = line.removeprefix("listening on ").strip()

    def cpu(self) -> float:
        """CPU seconds (user + system) the server process has used."""
        with open(f"/proc/{self.proc.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)


async def bare_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The floor of the HTTP stack: read the whole body, answer 204."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def serve_bare() -> None:
    """Serve :func:`bare_app` on hypercorn's trio worker, as the real server is configured."""
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from hypercorn.typing import Framework

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(cast("Framework", bare_app), config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(run)
        print(f"listening on {urls[0]}", flush=True)


@dataclass
class Cpu:
    """Requests per second and CPU microseconds per request on each side."""

    rate: float
    server_us: float
    client_us: float


async def measured(server: Server, requests: int, run: Awaitable[float]) -> Cpu:
    """``run``'s rate, with the CPU both processes spent on it per request."""
    server_cpu, client_cpu = server.cpu(), time.process_time()
    rate = await run
    return Cpu(
        rate,
        (server.cpu() - server_cpu) / requests * 1e6,
        (time.process_time() - client_cpu) / requests * 1e6,
    )


async def bare_throughput(url: str, clients: int, appends: int) -> float:
    """Requests per second of bare httpx clients posting one-turn append bodies at once."""
    bodies = [msgspec.json.encode({"turns": [turn(f"c{i}", 0)]}) for i in range(clients)]
    headers = {"content-type": "application/json"}
    tls = ssl.create_default_context()  # one for all, as the remote store shares one
    async with contextlib.AsyncExitStack() as stack:
        http = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=url, verify=tls))
            for _ in range(clients)
        ]

        async def writer(i: int) -> None:
            for _ in range(appends):
                answer = await http[i].post(
                    f"/sessions/c{i}/turns", content=bodies[i], headers=headers
                )
                assert answer.status_code == 204

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(clients):
                nursery.start_soon(writer, i)
        return clients * appends / (time.perf_counter() - start)


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


async def create_sessions(url: str, clients: int) -> None:
    """The sessions ``c0`` ... of :func:`rest_throughput`."""
    async with create_remote_store(url) as remote:
        for i in range(clients):
            await remote.save(SessionData(id=f"c{i}", created_at=1, updated_at=1))


async def host_writers(host: SessionHost, prefix: str, clients: int, appends: int) -> float:
    """Turns per second of ``clients`` sessions of ``host`` appending one turn at a time."""
    sessions = [await host.create_session(id=f"{prefix}{i}") for i in range(clients)]

    async def writer(i: int) -> None:
        for n in range(appends):
            await sessions[i].append_turns([turn(f"{prefix}{i}", n)])

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(clients):
            nursery.start_soon(writer, i)
    return clients * appends / (time.perf_counter() - start)


async def host_throughput(url: str, clients: int, appends: int) -> float:
    """Turns per second of the writers on one session host over one remote store."""
    async with create_remote_store(url) as remote, open_session_host(remote) as host:
        rate = await host_writers(host, "h", clients, appends)
        assert len(await remote.get_turns("h0")) == appends
    return rate


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
        return await host_writers(host, "c", clients, appends)


async def main(history: int, samples: int, clients: int, appends: int) -> None:
    n = clients * appends
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
            await create_sessions(server.url, clients)
            rest = await measured(server, n, rest_throughput(server.url, clients, appends))
            caps = await measured(server, n, http_floor(server.url, clients, appends))
            hosted = await host_throughput(server.url, clients, appends)
        finally:
            server.stop()
        bare_server = Server(None, bare=True)
        try:
            bare = await measured(
                bare_server, n, bare_throughput(bare_server.url, clients, appends)
            )
        finally:
            bare_server.stop()
        embedded = await embedded_throughput(Path(tmp) / "embedded.db", clients, appends)
    share = rest.rate / embedded
    verdict = "met" if share >= THROUGHPUT_TARGET else "NOT met"
    print(f"2. {clients} writers x {appends} one-turn appends, at once")
    print(f"   embedded host:      {embedded:9.0f} turns/s (baseline)")
    print(f"   {clients} remote clients: {rest.rate:9.0f} turns/s  {share:.0%} of the embedded")
    print(f"   target >= {THROUGHPUT_TARGET:.0%}: {verdict}")
    print("   CPU per request        requests/s  server us  client us")
    for name, cpu in (
        ("append (POST turns)", rest),
        ("GET /capabilities", caps),
        ("floor: bare app+httpx", bare),
    ):
        print(f"   {name:22} {cpu.rate:9.0f}  {cpu.server_us:9.0f}  {cpu.client_us:9.0f}")
    print(
        f"   appends cost {rest.server_us / bare.server_us:.1f}x the floor on the server, "
        f"{rest.client_us / bare.client_us:.1f}x on the client"
    )
    hosted_share = hosted / embedded
    verdict = "met" if hosted_share >= THROUGHPUT_TARGET else "NOT met"
    print("3. the same writers in one host over one remote store (POST /writes batches)")
    print(f"   {hosted:9.0f} turns/s  {hosted_share:.0%} of the embedded; target >= 50%: {verdict}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--appends", type=int, default=40)
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        trio.run(serve_bare)
    else:
        trio.run(main, args.history, args.samples, args.clients, args.appends)
