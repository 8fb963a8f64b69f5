"""Peak memory of a real server while many clients read one huge session at once.

Seeds a fresh SQLite file with one session of ``--mb`` MB (turns of ``--turn-kb`` KB
of text, one run, so the page needs the session's runs as well as a page of its
turns), starts ``zidane-actors serve`` on it with ``--max-body-bytes-in-flight``
set to ``--budget-mb``, sends ``--views`` GETs of ``--route`` at once and
prints how many were served, how many got the budget's 503, and the
server's peak RSS (``VmHWM``) before and after them. ``--route ui`` (the
default) is the session page's fragment, as the browser's script fetches
it; ``session``, ``history`` and ``turns`` are the REST reads of the whole
session (``GET /sessions/{id}``, ``/history``, ``/turns``).

With ``--small N`` it seeds ``N`` small sessions instead (two turns of
``--turn-kb`` KB) and times ``--views`` clients reading each of them once
(reads the server never measured) then once more (measured): reads of many
small sessions must not wait behind each other.

Run: ``python benchmarks/bench_ui_memory.py [--route ui] [--mb 40] [--views 48] [--budget-mb 128]``
or ``python benchmarks/bench_ui_memory.py --route session --small 2000``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import trio

from zidane_actors.model import SessionData, SessionRun, SessionTurn, TextBlock
from zidane_actors.stores import open_sqlite_store


def huge_session(sid: str, mb: float, turn_kb: int = 10) -> SessionData:
    """A session of about ``mb`` MB: turns of ``turn_kb`` KB of text, one run."""
    turns = tuple(
        SessionTurn(
            id=f"t{i}",
            role="user" if i % 2 == 0 else "assistant",
            content=(TextBlock(text=f"{i} " + "x" * (turn_kb * 1000)),),
            created_at=i,
            run_id="r1",
        )
        for i in range(round(mb * 1000 / turn_kb))
    )
    run = SessionRun(id="r1", prompt="go", started_at=0, status="completed")
    return SessionData(id=sid, created_at=0, updated_at=1, turns=turns, runs=(run,))


async def seed(path: str, sid: str, mb: int, turn_kb: int) -> None:
    """Write the huge session straight through the store."""
    async with open_sqlite_store(path) as store:
        await store.save(huge_session(sid, mb, turn_kb))


async def seed_small(path: str, sessions: int, turn_kb: int) -> None:
    """Write ``sessions`` sessions of two turns of ``turn_kb`` KB: ``s0``, ``s1``, ..."""
    async with open_sqlite_store(path) as store:
        for i in range(sessions):
            await store.save(huge_session(f"s{i}", 2 * turn_kb / 1000, turn_kb))


def peak_kib(pid: int) -> dict[str, int]:
    """``VmHWM`` and ``VmRSS`` of ``pid`` in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        fields = dict(line.split(":", 1) for line in status)
    return {name: int(fields[name].split()[0]) for name in ("VmHWM", "VmRSS")}


def start_server(path: str, budget: int) -> tuple[subprocess.Popen[str], str]:
    """``zidane-actors serve`` on ``path`` with a body budget of ``budget`` bytes."""
    argv = [sys.executable, "-m", "zidane_actors.cli", "serve", "--store", f"sqlite:{path}"]
    argv += ["--port", "0", "--max-body-bytes-in-flight", str(budget)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZIDANE_ACTORS_")}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, line.removeprefix("listening on ").strip()


ROUTES = {
    "ui": "/ui/fragments/sessions/{}",
    "session": "/sessions/{}",
    "history": "/sessions/{}/history",
    "turns": "/sessions/{}/turns",
}
"""The paths ``--route`` names."""


def view_all(url: str, paths: list[str], views: int) -> Counter[int]:
    """GETs of ``paths``, ``views`` at once; their statuses."""
    with httpx.Client(base_url=url, timeout=120) as client:

        def view(path: str) -> int:
            return client.get(path).status_code

        with ThreadPoolExecutor(views) as pool:
            return Counter(pool.map(view, paths))


def read_small(args: argparse.Namespace, directory: str) -> None:
    """Time reading ``--small`` sessions, each once unmeasured, then once measured."""
    path = f"{directory}/small.db"
    trio.run(seed_small, path, args.small, args.turn_kb)
    proc, url = start_server(path, args.budget_mb * 1_000_000)
    paths = [ROUTES[args.route].format(f"s{i}") for i in range(args.small)]
    try:
        for which in ("first reads", "measured reads"):
            start = time.perf_counter()
            statuses = view_all(url, paths, args.views)
            took = time.perf_counter() - start
            print(
                f"{which}: {args.small} small sessions' {args.route}, {args.views} at once: "
                f"statuses {dict(sorted(statuses.items()))} in {took:.2f} s "
                f"({args.small / took:.0f}/s)"
            )
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", choices=sorted(ROUTES), default="ui")
    parser.add_argument("--mb", type=int, default=40)
    parser.add_argument("--views", type=int, default=48)
    parser.add_argument("--budget-mb", type=int, default=128)
    parser.add_argument("--turn-kb", type=int, default=10)
    parser.add_argument("--small", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        if args.small:
            read_small(args, directory)
            return
        path = f"{directory}/huge.db"
        trio.run(seed, path, "huge", args.mb, args.turn_kb)
        proc, url = start_server(path, args.budget_mb * 1_000_000)
        try:
            before = peak_kib(proc.pid)
            start = time.perf_counter()
            statuses = view_all(url, [ROUTES[args.route].format("huge")] * args.views, args.views)
            took = time.perf_counter() - start
            after = peak_kib(proc.pid)
        finally:
            proc.kill()
            proc.wait()
    print(
        f"{args.views} GETs of {args.route} of a {args.mb} MB session, "
        f"budget {args.budget_mb} MB: "
        f"statuses {dict(sorted(statuses.items()))} in {took:.1f} s; "
        f"peak RSS {before['VmHWM'] / 1024:.0f} MiB before, {after['VmHWM'] / 1024:.0f} MiB after"
    )


if __name__ == "__main__":
    main()
