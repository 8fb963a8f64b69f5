"""Runs across the session browser and ``sessions list``, in process.

Failed runs found from the list, tokens and cost columns, scope sessions
left out unless asked for, one stale-run rule for the browser and the CLI,
a run's timeline from its turns' stored times, and the summary page.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from zidane_actors.cli import main
from zidane_actors.model import (
    ExtraFields,
    RunOwner,
    SessionData,
    SessionRun,
    SessionRunAgent,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    is_scope_session_id,
    shown_session_status,
)
from zidane_actors.server import _ui as ui
from zidane_actors.server import create_app
from zidane_actors.server._ui_runs import recorded_spans, render_timeline, run_spans
from zidane_actors.stores import SessionStore, open_memory_store, open_sqlite_store

T0 = 1_750_000_000_000
DAY = 86_400_000
FILLERS = 60
ELSEWHERE = RunOwner(host_id="another-host", pid=1, token="t")


def _run(
    rid: str, status: Any, agent: str, tokens: tuple[int, int], cost: float, at: int
) -> SessionRun:
    return SessionRun(
        id=rid,
        prompt="go",
        started_at=at,
        ended_at=at + 2500,
        status=status,
        agent=SessionRunAgent(id=agent, label=agent.title()),
        tokens_in=tokens[0],
        tokens_out=tokens[1],
        cost=cost,
        error="RateLimitError: 429" if status == "error" else None,
    )


def _timed_turns(rid: str, at: int) -> tuple[SessionTurn, ...]:
    """A run's turns: the prompt, a model call of 1.2 s asking for ``ls``, the tool's 0.5 s,
    then a model call of 0.8 s."""
    return (
        SessionTurn(
            id=f"{rid}-u",
            role="user",
            content=(TextBlock(text="list it"),),
            created_at=at,
            run_id=rid,
        ),
        SessionTurn(
            id=f"{rid}-a1",
            role="assistant",
            content=(ToolCallBlock(id=f"{rid}-c", name="ls", input={}),),
            created_at=at + 1200,
            run_id=rid,
            usage=TurnUsage(input=7, output=3, model="m-1"),
        ),
        SessionTurn(
            id=f"{rid}-r",
            role="user",
            content=(ToolResultBlock(call_id=f"{rid}-c", output="a b", is_error=True),),
            created_at=at + 1700,
            run_id=rid,
        ),
        SessionTurn(
            id=f"{rid}-a2",
            role="assistant",
            content=(TextBlock(text="done"),),
            created_at=at + 2500,
            run_id=rid,
        ),
    )


def _sessions() -> list[SessionData]:
    out = [
        SessionData(
            id=f"f{i:02d}", created_at=T0, updated_at=T0 + i, metadata={"title": f"filler {i}"}
        )
        for i in range(FILLERS)
    ]
    runs = {
        "ok-1": (_run("r1", "completed", "alpha", (100, 50), 0.01, T0 + DAY),),
        "bad-1": (_run("r1", "error", "beta", (10, 5), 0.002, T0 + DAY),),
        "bad-2": (
            _run("r1", "completed", "alpha", (1, 1), 0.001, T0),
            _run("r2", "error", "alpha", (2, 2), 0.001, T0 + DAY),
        ),
    }
    for n, (sid, rs) in enumerate(runs.items()):
        turns = tuple(t for r in rs for t in _timed_turns(r.id, r.started_at))
        out.append(
            SessionData(
                id=sid,
                created_at=T0,
                updated_at=T0 + 1000 + n,
                status="idle",
                turns=turns,
                runs=rs,
                metadata={"title": sid},
            )
        )
    for n, sid in enumerate(("adk-app:shop", "adk-user:shop:u1", "adk-user=" + "0" * 64)):
        out.append(SessionData(id=sid, created_at=T0, updated_at=T0 + 2000 + n))
    return out


async def _seed(store: SessionStore) -> None:
    for data in _sessions():
        await store.save(data)
    await store.save(SessionData(id="stale-1", created_at=T0, updated_at=T0 + 500))
    await store.update_status("stale-1", "running", owner=ELSEWHERE, preserve_updated_at=True)


class _ListOnly:
    """A store without ``search_meta`` (the list scans ``list_meta``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "search_meta":
            raise AttributeError(name)
        return getattr(self.inner, name)


class _CountingLoads:
    """A store that records the sessions it loads whole."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.loads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def load(self, sid: str) -> Any:
        self.loads.append(sid)
        return await self.inner.load(sid)


@asynccontextmanager
async def _sqlite() -> AsyncIterator[SessionStore]:
    with tempfile.TemporaryDirectory() as tmp:
        async with open_sqlite_store(Path(tmp) / "s.db") as store:
            yield store


@asynccontextmanager
async def _list_only() -> AsyncIterator[SessionStore]:
    async with open_memory_store() as store:
        yield _ListOnly(store)  # type: ignore[misc]


STORES: dict[str, Callable[[], AbstractAsyncContextManager[SessionStore]]] = {
    "memory": open_memory_store,
    "sqlite": _sqlite,
    "list_meta": _list_only,
}


@asynccontextmanager
async def _client(store: SessionStore) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(store), client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client


def _ids(text: str) -> list[str]:
    return re.findall(r'class="session-row[^"]*" data-session-id="([^"]+)"', text)


def _row(text: str, sid: str) -> str:
    return text.split(f'data-session-id="{sid}"', 1)[1].split("</tr>", 1)[0]


def test_the_model_rules() -> None:
    assert shown_session_status(None, None, T0, T0) == "idle"
    assert shown_session_status("error", None, T0, T0) == "error"
    assert shown_session_status("running", ELSEWHERE, T0, T0 + 60_000) == "running"
    assert shown_session_status("running", ELSEWHERE, T0, T0 + 11 * 60_000) == "stale"
    assert is_scope_session_id("adk-app:shop") and is_scope_session_id("adk-user=ab")
    assert not is_scope_session_id("adk:shop:u1:s1") and not is_scope_session_id("adk-apps")


@pytest.mark.parametrize("name", list(STORES))
async def test_the_list_finds_failed_and_stale_sessions_and_leaves_scopes_out(name: str) -> None:
    async with STORES[name]() as store:
        await _seed(store)
        async with _client(store) as client:
            everything = FILLERS + 4  # fillers, three with runs, one stale
            page1 = (await client.get("/ui/fragments/sessions")).text
            page2 = (await client.get("/ui/fragments/sessions?page=2")).text
            listed = _ids(page1) + _ids(page2)
            assert len(listed) == everything and not any(map(is_scope_session_id, listed))
            assert len(set(listed)) == everything
            if name != "list_meta":  # the store's count, scope sessions included: a bound
                assert f"at most {everything + 3} sessions" in page1 + page2  # 3 scope ones
            shown = (await client.get("/ui/fragments/sessions?scopes=1")).text
            assert {"adk-app:shop", "adk-user:shop:u1"} <= set(_ids(shown))
            # Sessions holding a failed run, whatever their status (idle here).
            r = await client.get("/ui/fragments/sessions?failed=1")
            assert _ids(r.text) == ["bad-2", "bad-1"]
            assert "✕ 1" in _row(r.text, "bad-1") and 'class="failed-mark' not in _row(
                page1, "ok-1"
            )
            assert _ids((await client.get("/ui/fragments/sessions?status=error")).text) == []
            # Stale: stored running, owner gone, the same rule as the CLI.
            r = await client.get("/ui/fragments/sessions?status=stale")
            assert _ids(r.text) == ["stale-1"] and "stale (owner gone)" in r.text
            r = await client.get("/ui/fragments/sessions?status=running")
            assert _ids(r.text) == []
            # Tokens and cost columns, from the run records.
            ok = _row(page1, "ok-1")
            assert 'tokens">150<' in ok and 'cost">$0.0100<' in ok
            assert 'tokens">6<' in _row(page1, "bad-2") and 'cost">$0.0020<' in _row(page1, "bad-2")
            assert 'tokens">0<' in _row(page1, "f59") and 'cost">–<' in _row(page1, "f59")


async def test_a_bounded_failed_scan_says_so_and_offers_more() -> None:
    async with open_memory_store() as store:
        bad = next(d for d in _sessions() if d.id == "bad-1")
        await store.save(msgspec.structs.replace(bad, updated_at=T0))
        for i in range(60):  # newer, without runs
            await store.save(SessionData(id=f"n{i:02d}", created_at=T0, updated_at=T0 + 10 + i))
        async with _client(store) as client:
            r = await client.get("/ui/fragments/sessions?failed=1&scan=51")
            assert _ids(r.text) == [] and "Searched the 51 most recently updated" in r.text
            assert "failed=1&amp;scan=204" in r.text
            r = await client.get("/ui/fragments/sessions?failed=1&scan=204")
            assert _ids(r.text) == ["bad-1"] and "1 session<" in r.text


async def test_the_session_page_draws_its_runs_timeline() -> None:
    async with open_memory_store() as store:
        await _seed(store)
        async with _client(store) as client:
            page = (await client.get("/ui/fragments/sessions/bad-2")).text
            timeline = page.split('<section class="timeline">', 1)[1].split("</section>", 1)[0]
            assert 'data-run-id="r2"' in timeline  # the newest run
            rows = re.findall(r'<tr class="span ([^"]+)">(.*?)</tr>', timeline)
            assert [cls for cls, _ in rows] == ["span-model", "span-tool span-failed", "span-model"]
            cells = [re.findall(r'class="num">([^<]+)<', body) for _, body in rows]
            assert cells == [["+0 ms", "1.2 s"], ["+1.2 s", "500 ms"], ["+1.7 s", "800 ms"]]
            assert "Times of its turns." in timeline
            assert "m-1" in rows[0][1] and "ls" in rows[1][1]
            bars = re.findall(r'<rect class="bar" x="([\d.]+)" y="1" width="([\d.]+)"', timeline)
            assert bars == [("0.0", "480.0"), ("480.0", "200.0"), ("680.0", "320.0")]
            first = (await client.get("/ui/fragments/sessions/bad-2?run=r1")).text
            assert '<table class="waterfall" data-run-id="r1"' in first
            assert (
                '<section class="timeline">'
                not in (await client.get("/ui/fragments/sessions/f01")).text
            )


def test_a_run_keeping_its_call_times_is_drawn_from_them() -> None:
    """Two tools run side by side: the turns cannot show it, the recorded times do."""
    at = T0 + 5
    calls = [
        {"kind": "tool", "name": "slow", "startedAt": at + 40, "durationMs": 60, "callId": "c2"},
        {"kind": "model", "name": "m-1", "startedAt": at, "durationMs": 40.5},
        {"kind": "tool", "name": "fast", "startedAt": at + 40, "durationMs": 2.25, "failed": True},
        {"kind": "model", "name": "m-1", "startedAt": at + 100, "durationMs": 20},
        {"kind": "thought", "name": "x", "startedAt": at, "durationMs": 1},  # not a call kind
        {"kind": "tool", "name": "bad", "startedAt": at, "durationMs": -1},  # not a duration
        "junk",
    ]
    run = msgspec.structs.replace(
        _run("r9", "completed", "alpha", (1, 1), 0.0, at),
        ended_at=at + 120,
        extra_fields=ExtraFields({"callTimes": calls}),
    )
    spans = run_spans(run, _timed_turns("r9", at))
    assert [(s.kind, s.label, s.start - at, s.end - at, s.failed) for s in spans] == [
        ("model", "m-1", 0, 40.5, False),
        ("tool", "slow", 40, 100, False),
        ("tool", "fast", 40, 42.25, True),
        ("model", "m-1", 100, 120, False),
    ]
    html = str(render_timeline(run, (), 1))
    cells = re.findall(r'<td class="num">([^<]+)<', html)
    assert cells == ["+0 ms", "40 ms", "+40 ms", "60 ms", "+40 ms", "2.2 ms", "+100 ms", "20 ms"]
    assert "Times as its framework measured each call." in html
    assert recorded_spans(msgspec.structs.replace(run, extra_fields=None)) is None


async def test_the_summary_tallies_runs_per_agent_and_day_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with open_memory_store() as store:
        await _seed(store)
        async with _client(store) as client:
            r = await client.get("/ui/fragments/summary")
            assert r.status_code == 200 and 'data-page="summary"' in r.text
            agents = dict(re.findall(r'data-key="([^"]+)">(.*?)</tr>', r.text.split("Per day")[0]))
            nums = {k: re.findall(r">([^<>]+)</td>", v)[1:] for k, v in agents.items()}
            assert nums == {
                "alpha": ["3", "1", "156", "$0.0120"],
                "beta": ["1", "1", "15", "$0.0020"],
            }
            days = re.findall(r'data-key="(\d{4}-\d\d-\d\d)"', r.text)
            assert days == ["2025-06-16", "2025-06-15"]
            assert "4 runs, 2 failed" in r.text and "every session that matches" in r.text
            r = await client.get("/ui/fragments/summary?agent=none-such")
            assert "Summarised 0 sessions" in r.text
    async with open_memory_store() as inner:
        await _seed(inner)
        store = _CountingLoads(inner)
        async with _client(store) as client:  # type: ignore[arg-type]
            monkeypatch.setattr(ui, "SUMMARY_SESSIONS", 3)
            r = await client.get("/ui/fragments/summary")
            assert "Summarised 3 sessions: the 3 most recently updated" in r.text
            assert "bounded number of sessions" in r.text
            assert store.loads == ["bad-2", "bad-1", "ok-1"]  # one at a time, only those


async def _seed_file(path: Path) -> None:
    async with open_sqlite_store(path) as store:
        await _seed(store)


def test_sessions_list_shows_stale_and_leaves_scopes_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trio.run(_seed_file, tmp_path / "s.db")
    url = f"sqlite:{tmp_path / 's.db'}"
    capsys.readouterr()
    assert main(["sessions", "list", "--store", url, "--limit", "5"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows] == ["bad-2", "bad-1", "ok-1", "stale-1", "f59"]
    assert rows[3][1] == "stale"
    assert main(["sessions", "list", "--store", url, "--scopes", "--limit", "3"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert ids == ["adk-user=" + "0" * 64, "adk-user:shop:u1", "adk-app:shop"]
