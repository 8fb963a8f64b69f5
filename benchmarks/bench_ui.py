"""The session browser over a large SQLite store, as ratios against store reads in the same run.

Seeds N sessions (default 100 000) into a fresh SQLite file: each a user turn
(``task <i>``, plus ``incident`` in one session in 1 000), an assistant turn
calling a tool (``get_weather`` in one in 10, else ``read_file``) and its
result; one in 1 000 has status ``error``. Then times each ``/ui/`` fragment
through the ASGI app (best of 3) against the ``search_meta`` call it makes
(the ratio is the browser's overhead: rendering, HTTP), and that call against
a plain first page, ``list_meta`` of 51 rows (the ratio is what the search,
filter, offset and count cost). A session page is timed against its
``get_meta`` + ``get_turns``.

Run: ``python benchmarks/bench_ui.py [--sessions N]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

from zidane_actors.model import (
    SessionData,
    SessionFilter,
    SessionSearch,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from zidane_actors.server import create_app
from zidane_actors.stores import StoreWrite, open_sqlite_store

DAY = 86_400_000


async def _best(fn: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _session(i: int) -> SessionData:
    tool = "get_weather" if i % 10 == 0 else "read_file"
    words = f"task {i} " + ("incident on the payment service" if i % 1000 == 7 else "please")
    turns = (
        SessionTurn(id="t0", role="user", content=(TextBlock(text=words),), created_at=i),
        SessionTurn(
            id="t1",
            role="assistant",
            content=(
                TextBlock(text="Let me look."),
                ToolCallBlock(id="c1", name=tool, input={"arg": i}),
            ),
            created_at=i,
        ),
        SessionTurn(
            id="t2",
            role="user",
            content=(ToolResultBlock(call_id="c1", output=f"result {i}", name=tool),),
            created_at=i,
        ),
    )
    at = i * 60_000  # one a minute: 10 000 sessions span a week
    return SessionData(
        id=f"s{i:07d}",
        created_at=at,
        updated_at=at + (i % 97) * 1000,
        status="error" if i % 1000 == 0 else "completed",
        turns=turns,
    )


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        async with open_sqlite_store(f"{directory}/ui.db") as store:
            start = time.perf_counter()
            for base in range(0, n, 2000):
                writes = [
                    StoreWrite("save", (_session(i),)) for i in range(base, min(base + 2000, n))
                ]
                for result in await store.apply_writes(writes):
                    result.unwrap()
            print(f"seeded {n:,} sessions in {time.perf_counter() - start:.1f} s")
            transport = httpx.ASGITransport(app=create_app(store), client=("127.0.0.1", 1))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1"
            ) as client:

                async def page(url: str) -> None:
                    response = await client.get(url)
                    assert response.status_code == 200, response.text[:200]

                def search(**fields: Any) -> Callable[[], Awaitable[object]]:
                    query = SessionSearch(limit=50, count_limit=10_000, **fields)
                    return lambda: store.search_meta(query)

                last = max(1, n // 50)
                cases: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                    ("/ui/fragments/sessions", search()),
                    (f"/ui/fragments/sessions?page={last}", search(offset=(last - 1) * 50)),
                    ("/ui/fragments/sessions?status=error", search(status="error")),
                    ("/ui/fragments/sessions?q=incident", search(text="incident")),
                    ("/ui/fragments/sessions?q=get_weather", search(text="get_weather")),
                    ("/ui/fragments/sessions?q=task+123", search(text="task 123")),
                    ("/ui/fragments/sessions?q=task", search(text="task")),
                    ("/ui/fragments/sessions?q=look", search(text="look")),
                    ("/ui/fragments/sessions?sort=created", search(order="created")),
                    (
                        "/ui/fragments/sessions?dates=created&from=1970-01-02&to=1970-01-02",
                        search(created_from=DAY, created_to=2 * DAY),
                    ),
                ]
                plain = await _best(lambda: store.list_meta(SessionFilter(limit=51)))
                print(f"baseline: list_meta of 51 rows {plain * 1e3:.1f} ms")
                print(
                    f"{'fragment':70} {'ui ms':>7} {'search ms':>9} {'ui/search':>9}"
                    f" {'search/base':>11}"
                )
                for url, raw in cases:
                    ui_s = await _best(lambda url=url: page(url))  # type: ignore[misc]
                    raw_s = await _best(raw)
                    print(
                        f"{url:70} {ui_s * 1e3:7.1f} {raw_s * 1e3:9.1f} {ui_s / raw_s:9.2f}"
                        f" {raw_s / plain:11.1f}"
                    )
                mid = f"s{n // 2:07d}"
                ui_s = await _best(lambda: page(f"/ui/fragments/sessions/{mid}"))
                raw_s = await _best(lambda: _session_reads(store, mid))
                print(f"{'/ui/fragments/sessions/' + mid:70} {ui_s * 1e3:7.1f} {raw_s * 1e3:9.1f}")


async def _session_reads(store: object, sid: str) -> None:
    await store.get_meta(sid)  # type: ignore[attr-defined]
    await store.get_turns(sid, 0, 108)  # type: ignore[attr-defined]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    trio.run(main, parser.parse_args().sessions)
