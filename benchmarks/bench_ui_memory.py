"""Peak memory of a real server while many browsers view one huge session at once.

Seeds a fresh SQLite file with one session of ``--mb`` MB (turns of ``--turn-kb`` KB
of text, one run, so the page needs the session's runs as well as a page of its
turns), starts ``zidane-actors serve`` on it with ``--max-body-bytes-in-flight``
set to ``--budget-mb``, opens ``--views`` session pages at once (their
fragments, as the browser's script fetches them) and prints how many
rendered, how many got the budget's 503, and the server's peak RSS
(``VmHWM``) before and after the views.

Run: ``python benchmarks/bench_ui_memory.py [--mb 40] [--views 48] [--budget-mb 128]``.
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


def huge_session(sid: str, mb: int, turn_kb: int = 10) -> SessionData:
    """A session of about ``mb`` MB: turns of ``turn_kb`` KB of text, one run."""
    turns = tuple(
        SessionTurn(
            id=f"t{i}",
            role="user" if i % 2 == 0 else "assistant",
            content=(TextBlock(text=f"{i} " + "x" * (turn_kb * 1000)),),
            created_at=i,
            run_id="r1",
        )
        for i in range(mb * 1000 // turn_kb)
    )
    run = SessionRun(id="r1", prompt="go", started_at=0, status="completed")
    return SessionData(id=sid, created_at=0, updated_at=1, turns=turns, runs=(run,))


async def seed(path: str, sid: str, mb: int, turn_kb: int) -> None:
    """Write the huge session straight through the store."""
    async with open_sqlite_store(path) as store:
        await store.save(huge_session(sid, mb, turn_kb))


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


def view_all(url: str, sid: str, views: int) -> Counter[int]:
    """``views`` concurrent GETs of the session's page fragment; their statuses."""
    with httpx.Client(base_url=url, timeout=120) as client:

        def view(_: int) -> int:
            return client.get(f"/ui/fragments/sessions/{sid}").status_code

        with ThreadPoolExecutor(views) as pool:
            return Counter(pool.map(view, range(views)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=40)
    parser.add_argument("--views", type=int, default=48)
    parser.add_argument("--budget-mb", type=int, default=128)
    parser.add_argument("--turn-kb", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/huge.db"
        trio.run(seed, path, "huge", args.mb, args.turn_kb)
        proc, url = start_server(path, args.budget_mb * 1_000_000)
        try:
            before = peak_kib(proc.pid)
            start = time.perf_counter()
            statuses = view_all(url, "huge", args.views)
            took = time.perf_counter() - start
            after = peak_kib(proc.pid)
        finally:
            proc.kill()
            proc.wait()
    print(
        f"{args.views} views of a {args.mb} MB session, budget {args.budget_mb} MB: "
        f"statuses {dict(sorted(statuses.items()))} in {took:.1f} s; "
        f"peak RSS {before['VmHWM'] / 1024:.0f} MiB before, {after['VmHWM'] / 1024:.0f} MiB after"
    )


if __name__ == "__main__":
    main()
