"""The session browser over a large SQLite store, as ratios against raw store reads in the same run.

Seeds N sessions (default 100 000; one in 1 000 has status ``error``) into a
fresh SQLite file, then times each ``/ui/`` fragment through the ASGI app
(best of 3) against its baseline: the ``list_meta`` call of the same size for
the list pages, ``get_meta`` + ``get_turns`` for a session page. The ratio is
the browser's overhead (filtering, rendering, HTTP); the absolute times say
how the protocol's offset-free ``list_meta`` scales with the page number.

Run: ``python benchmarks/bench_ui.py [--sessions N]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Awaitable, Callable

import httpx
import trio

from zidane_actors.model import SessionData, SessionFilter, SessionTurn, TextBlock
from zidane_actors.server import create_app
from zidane_actors.stores import StoreWrite, open_sqlite_store


async def _best(fn: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return min(times)


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        async with open_sqlite_store(f"{directory}/ui.db") as store:
            start = time.perf_counter()
            for base in range(0, n, 2000):
                writes = [
                    StoreWrite(
                        "save",
                        (
                            SessionData(
                                id=f"s{i:07d}",
                                created_at=i,
                                updated_at=i,
                                status="error" if i % 1000 == 0 else "completed",
                                turns=(
                                    SessionTurn(
                                        id="t0",
                                        role="user",
                                        content=(TextBlock(text=f"task {i}"),),
                                        created_at=i,
                                    ),
                                ),
                            ),
                        ),
                    )
                    for i in range(base, min(base + 2000, n))
                ]
                for result in await store.apply_writes(writes):
                    result.unwrap()
            print(f"seeded {n:,} sessions in {time.perf_counter() - start:.1f} s")
            transport = httpx.ASGITransport(app=create_app(store), client=("127.0.0.1", 1))
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:

                async def page(url: str) -> None:
                    response = await client.get(url)
                    assert response.status_code == 200, response.text[:200]

                mid = f"s{n // 2:07d}"
                cases: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                    ("/ui/fragments/sessions", lambda: store.list_meta(SessionFilter(limit=51))),
                    (
                        "/ui/fragments/sessions?page=100",
                        lambda: store.list_meta(SessionFilter(limit=5001)),
                    ),
                    (
                        "/ui/fragments/sessions?page=1000",
                        lambda: store.list_meta(SessionFilter(limit=50001)),
                    ),
                    (
                        "/ui/fragments/sessions?status=error",
                        lambda: store.list_meta(SessionFilter(limit=20000)),
                    ),
                    (
                        "/ui/fragments/sessions?q=task+1",
                        lambda: store.list_meta(SessionFilter(limit=20000)),
                    ),
                    (f"/ui/fragments/sessions/{mid}", lambda: _session_reads(store, mid)),
                ]
                print(f"{'fragment':42} {'ui ms':>9} {'raw ms':>9} {'ratio':>6}")
                for url, raw in cases:
                    ui_s = await _best(lambda url=url: page(url))  # type: ignore[misc]
                    raw_s = await _best(raw)
                    print(f"{url:42} {ui_s * 1e3:9.1f} {raw_s * 1e3:9.1f} {ui_s / raw_s:6.2f}")


async def _session_reads(store: object, sid: str) -> None:
    await store.get_meta(sid)  # type: ignore[attr-defined]
    await store.get_turns(sid, 0, 108)  # type: ignore[attr-defined]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    trio.run(main, parser.parse_args().sessions)
