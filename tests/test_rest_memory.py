"""Many clients reading a huge session over REST keep a real server within its memory budget.

``GET /sessions/{id}``, ``/history`` and ``/turns`` read the whole session:
what they hold counts against the body budget (``--max-body-bytes-in-flight``)
as request bodies, answers and the browser's pages do, so concurrent reads
beyond it are answered 503 ``busy`` instead of each holding its own copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from test_server_e2e import ServerProcess
from test_ui_memory import BUDGET, TURN_CHARS, TURNS, _huge, _kib, _seed

from zidane_actors.model import SessionHistory, encode
from zidane_actors.server import ServerLimits, serve
from zidane_actors.stores import create_memory_store, create_remote_store, open_sqlite_store
from zidane_actors.stores.remote._bodies import HistoryState, history_rev

READS = 48
ROUTES = ("/sessions/huge", "/sessions/huge/history", "/sessions/huge/turns")


def _expected(route: str) -> bytes:
    """The exact answer of ``route`` for the seeded session."""
    data = _huge("huge", TURNS)
    if route.endswith("/history"):
        history = SessionHistory(turns=data.turns, runs=data.runs)
        return encode(HistoryState(history=history, rev=history_rev(history)))
    if route.endswith("/turns"):
        return encode(data.turns)
    return encode(data)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rest-memory") / "huge.db"
    trio.run(_seed, path)
    return path


@pytest.fixture
def server(seeded: Path) -> Iterator[ServerProcess]:
    limits = ["--max-body-bytes", str(BUDGET), "--max-body-bytes-in-flight", str(BUDGET)]
    server = ServerProcess(f"sqlite:{seeded}", args=limits)
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("route", ROUTES)
def test_concurrent_reads_of_a_huge_session_stay_within_the_budget(
    server: ServerProcess, route: str
) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    expected = _expected(route)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        warm = client.get(route.replace("huge", "small"))  # imports and caches: the baseline
        assert warm.status_code == 200, warm.text[:300]
        baseline = _kib(pid, "VmRSS")

        def read(_: int) -> httpx.Response:
            return client.get(route)

        with ThreadPoolExecutor(READS) as pool:
            answers = list(pool.map(read, range(READS)))
        peak = _kib(pid, "VmHWM")

        served = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 503]
        assert len(served) + len(refused) == READS, [a.status_code for a in answers]
        assert served, "at least the first read is served"
        for answer in served:  # the exact document, never a cut or mixed one
            assert answer.content == expected
        for answer in refused:  # the budget's answer, as for bodies and answers
            assert answer.json()["error"]["code"] == "busy"
            assert answer.headers["retry-after"] == "1"
        # The budget plus one read larger than it, each held a few times over
        # (the stored rows, the decoded session, its encoding) with room for the
        # allocator: far below the reads' copies (48 × 24 MB, each twice).
        bound_kib = 4 * (BUDGET + TURNS * TURN_CHARS) // 1024
        assert peak - baseline < bound_kib, (peak - baseline, bound_kib, len(served))

        alone = client.get(route)  # larger than the budget, but alone: still served
        assert alone.status_code == 200 and alone.content == expected


def test_the_store_holds_what_the_test_expects(seeded: Path) -> None:
    """The expected answers are built from the seeded value: check it reads back equal."""

    async def main() -> None:
        async with open_sqlite_store(seeded) as store:
            assert await store.load("huge") == _huge("huge", TURNS)

    trio.run(main)


async def test_a_remote_client_waits_out_a_busy_read_and_gets_the_document() -> None:
    """The remote store retries a read answered 503 ``busy`` after its ``Retry-After``."""
    store = create_memory_store()
    await store.save(_huge("s1", 1))  # one turn of 400 KB
    expected = await store.load("s1")
    budget = 1_000_000
    # A body announced at the whole budget and never sent holds all of it for 3 s.
    limits = ServerLimits(max_body_bytes=budget, max_body_bytes_in_flight=budget, body_timeout_s=3)
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(partial(serve, store, port=0, limits=limits))
        async with create_remote_store(url, retries=8) as remote:
            assert await remote.load("s1") == expected  # measured: later reads reserve first
            host = url.removeprefix("http://")
            held = await trio.open_tcp_stream("127.0.0.1", int(host.rsplit(":", 1)[1]))
            await held.send_all(
                f"PUT /sessions/s1 HTTP/1.1\r\nhost: {host}\r\n"
                f"content-type: application/json\r\ncontent-length: {budget}\r\n\r\n".encode()
            )
            with trio.fail_after(10):
                async with httpx.AsyncClient(base_url=url) as client:
                    status = 200
                    while status != 503:  # until the server has reserved the body
                        status = (await client.get("/sessions/s1")).status_code
            # Busy until the body times out, then served: one document, after retries.
            assert await remote.load("s1") == expected
            assert remote.statistics().retries >= 1
            await held.aclose()
        nursery.cancel_scope.cancel()
