"""The session browser's server side, in process: every store, escaping, headers, auth, paging.

The browser itself is exercised in tests/test_ui_browser.py; here the
fragments are fetched through httpx's ASGI transport on trio.
"""

from __future__ import annotations

import html.parser
import re
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import trio
from hypothesis import example, given
from hypothesis import strategies as st
from test_postgres_store import DSN, fresh_schema
from test_server_e2e import ServerProcess

from zidane_actors.errors import UnsupportedOperationError
from zidane_actors.model import (
    ImageBlock,
    Schedule,
    ScheduleFire,
    SessionArtifact,
    SessionData,
    SessionFilter,
    SessionMetaRow,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from zidane_actors.server import create_app
from zidane_actors.server._html import el, safe_image_src, safe_link
from zidane_actors.server._ui import CONTENT_SECURITY_POLICY
from zidane_actors.server._ui_session import SessionPage, render_session
from zidane_actors.stores import (
    SessionStore,
    create_file_map_store,
    create_remote_store,
    open_directory_adapter,
    open_memory_store,
    open_postgres_store,
    open_sqlite_store,
)

T0 = 1_750_000_000_000
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


@asynccontextmanager
async def _client(
    store: SessionStore, token: str | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(store, token=token), client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client


def _session(sid: str = "s1", **fields: Any) -> SessionData:
    turns = (
        SessionTurn(
            id="t1",
            role="user",
            content=(TextBlock(text="hi <b>there</b>"),),
            created_at=T0,
            run_id="r1",
        ),
        SessionTurn(
            id="t2",
            role="assistant",
            content=(ToolCallBlock(id="c1", name="ls", input={"dir": "/"}),),
            created_at=T0 + 1,
            run_id="r2",
        ),
        SessionTurn(
            id="t3",
            role="user",
            content=(ToolResultBlock(call_id="c1", output="etc"),),
            created_at=T0 + 2,
            run_id="r2",
        ),
    )
    runs = (
        SessionRun(
            id="r1",
            prompt="go",
            started_at=T0,
            ended_at=T0 + 9,
            status="completed",
            tokens_in=10,
            tokens_out=5,
            cost=0.5,
        ),
        SessionRun(
            id="r2",
            prompt="sub",
            started_at=T0 + 1,
            ended_at=T0 + 5,
            status="completed",
            parent_run_id="r1",
            depth=1,
            tokens_in=3,
            tokens_out=2,
        ),
    )
    base = {
        "id": sid,
        "created_at": T0,
        "updated_at": T0 + 10,
        "status": "completed",
        "metadata": {"title": "First"},
        "turns": turns,
        "runs": runs,
        "agent_id": "a",
        "project_root": "/p",
    }
    base.update(fields)
    return SessionData(**base)


StoreOpener = Callable[[], AbstractAsyncContextManager[Any]]


@asynccontextmanager
async def _file_map() -> AsyncIterator[Any]:
    with tempfile.TemporaryDirectory() as directory:
        async with open_directory_adapter(directory) as adapter:
            store = create_file_map_store(adapter)
            try:
                yield store
            finally:
                await store.aclose()


@asynccontextmanager
async def _sqlite() -> AsyncIterator[Any]:
    with tempfile.TemporaryDirectory() as directory:
        async with open_sqlite_store(f"{directory}/s.db") as store:
            yield store


@asynccontextmanager
async def _postgres() -> AsyncIterator[Any]:
    with fresh_schema() as schema:
        async with open_postgres_store(DSN, schema=schema, pool_size=2) as store:
            yield store


@asynccontextmanager
async def _remote() -> AsyncIterator[Any]:
    server = ServerProcess("memory")
    server.start()
    try:
        async with create_remote_store(server.url) as store:
            yield store
    finally:
        server.stop()


STORES: dict[str, StoreOpener] = {
    "memory": open_memory_store,
    "sqlite": _sqlite,
    "file-map": _file_map,
    "postgres": _postgres,
    "remote": _remote,
}


async def _pages(store: Any) -> list[str]:
    await store.save(_session())
    caps = set(dir(store))
    if "upsert_artifact" in caps:
        await store.upsert_artifact(
            SessionArtifact(
                id="a1",
                session_id="s1",
                kind="link",
                uri="https://x.invalid/a",
                label="A",
                created_at=T0,
                updated_at=T0,
            )
        )
    if "save_schedule" in caps:
        await store.save_schedule(
            Schedule(
                id="sch", prompt="p", enabled=True, created_at=T0, updated_at=T0, interval_ms=60_000
            )
        )
        await store.record_schedule_fire(
            ScheduleFire(id="f1", schedule_id="sch", due_at=T0, fired_at=T0 + 1, status="ok")
        )
    out = []
    async with _client(store) as client:
        for url in (
            "/ui/fragments/sessions",
            "/ui/fragments/sessions/s1?from=1",
            "/ui/fragments/sessions/s1",
            "/ui/fragments/schedules",
        ):
            r = await client.get(url)
            assert r.status_code == 200, (url, r.text)
            out.append(r.text)
    return out


@pytest.mark.parametrize("name", [n for n in STORES if n != "memory"])
async def test_every_store_renders_the_pages_of_the_reference_model(name: str) -> None:
    async with open_memory_store() as reference:
        expected = await _pages(reference)
    async with STORES[name]() as store:
        got = await _pages(store)
    if "list_artifacts" not in set(dir(store)):  # the file map keeps no artifacts or schedules
        assert "does not list artifacts" in got[2]
        assert "does not keep schedules" in got[3]
        cut = '<section class="artifacts">'
        got = [got[0], *(p.split(cut)[0] for p in got[1:3])]
        expected = [expected[0], *(p.split(cut)[0] for p in expected[1:3])]
    assert got == expected
    assert 'data-turn-id="t2"' in got[1] and 'data-turn-id="t1"' not in got[1]
    assert ">etc<" in got[1]  # the result of a call on the page, read past nothing


# -- escaping ---------------------------------------------------------------------


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@given(st.text(max_size=200), st.text(max_size=60))
def test_store_text_never_becomes_markup(text: str, attr: str) -> None:
    parser = _Tags()
    parser.feed(el("div", {"title": attr, "data-x": attr}, text, el("span", None, text)))
    parser.close()
    assert [t for t, _ in parser.tags] == ["div", "span"]
    assert parser.tags[0][1] == [("title", attr), ("data-x", attr)]
    assert "".join(parser.text) == text + text


@pytest.mark.parametrize(
    "uri",
    [
        "javascript:alert(1)",
        " JavaScript:alert(1)",
        "java\tscript:alert(1)",
        "vbscript:x",
        "data:text/html,<script>alert(1)</script>",
        "file:///etc/passwd",
        "//evil.example/x",
        "/relative",
        "https:///nohost",
        "http://ok.example/a b",
    ],
)
def test_unsafe_links_are_refused(uri: str) -> None:
    assert safe_link(uri) is None


def test_safe_links_and_images() -> None:
    assert safe_link("https://ok.example/a?b=1#c") == "https://ok.example/a?b=1#c"
    assert safe_link("mailto:a@b.example") == "mailto:a@b.example"
    assert safe_image_src("image/png", PNG, None) == f"data:image/png;base64,{PNG}"
    assert safe_image_src(None, None, f"data:image/png;base64,{PNG}") is not None
    assert safe_image_src("image/svg+xml", PNG, None) is None
    assert safe_image_src(None, None, "data:image/svg+xml;base64,PHN2Zz4=") is None
    assert safe_image_src("image/png", 'AAA" onerror="x', None) is None
    assert safe_image_src(None, None, "https://tracker.example/pixel.png") is None


@given(st.text(min_size=1, max_size=80))
@example('"><script>x()</script><img src=x onerror=y>')
@example("javascript:alert(1)")
def test_session_page_escapes_every_field(evil: str) -> None:
    turn = SessionTurn(
        id="t1",
        role="user",
        content=(
            TextBlock(text=evil),
            ImageBlock(url=f"javascript:{evil}"),
            ToolResultBlock(call_id=evil, output=evil, name=evil),
        ),
        created_at=T0,
        run_id=evil,
        metadata={evil: evil},
    )
    run = SessionRun(
        id=evil,
        prompt=evil,
        started_at=T0,
        status="error",
        label=evil,
        error=evil,
        parent_run_id=evil,
        resumed_from_run_id=evil,
    )
    meta = SessionMetaRow(
        id="s1",
        metadata={"title": evil, evil: evil},
        run_count=1,
        turn_count=1,
        updated_at=T0,
        user_message_count=1,
        agent_id=evil,
        project_root=evil,
    )
    art = SessionArtifact(
        id="a",
        session_id="s1",
        kind=evil,
        uri=f"javascript:{evil}",
        label=evil,
        created_at=T0,
        updated_at=T0,
    )
    page = render_session(
        SessionPage(
            meta=meta,
            turns=(turn,),
            lookahead=(),
            start=0,
            page_size=100,
            runs=(run,),
            artifacts=[art],
            now=T0,
        )
    )
    parser = _Tags()
    parser.feed(page)
    tags = {t for t, _ in parser.tags}
    assert "script" not in tags and "img" not in tags
    assert evil in "".join(parser.text) or not evil.strip()
    for _, attrs in parser.tags:
        for name, value in attrs:
            assert not name.startswith("on")
            if name in ("href", "src"):
                assert value is not None and value.startswith(("#", "/ui/", "https:")), value


# -- headers, auth, errors ----------------------------------------------------------


async def test_pages_carry_a_strict_csp_and_shells_need_no_token() -> None:
    async with open_memory_store() as store, _client(store, token="s3cr3t-9") as client:
        for url in (
            "/ui/",
            "/ui/sessions/anything",
            "/ui/schedules",
            "/ui/static/app.js",
            "/ui/static/app.css",
        ):
            r = await client.get(url)
            assert r.status_code == 200, url
            assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert r.headers["x-content-type-options"] == "nosniff"
            assert "s3cr3t-9" not in r.text
        assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
        assert (await client.get("/ui")).headers["location"] == "/ui/"
        assert (await client.get("/")).headers["location"] == "/ui/"
        assert (await client.get("/ui/static/../_app.py")).status_code == 401  # /ui/_app.py
        assert (await client.get("/ui/static/shell.html")).status_code == 404
        for url in (
            "/ui/fragments/sessions",
            "/ui/fragments/sessions/s1",
            "/ui/fragments/schedules",
        ):
            assert (await client.get(url)).status_code == 401
            wrong = await client.get(url, headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401
        for url in (
            "/ui/fragments",
            "/ui/fragments/",
            "/ui/sessions/a/b",
            "/ui/x",
            "/ui/static/",
            "/ui/sessions/",
            "/sessions",
        ):
            assert (await client.get(url)).status_code == 401, url
        r = await client.get("/ui/fragments/sessions", headers={"authorization": "Bearer s3cr3t-9"})
        assert r.status_code == 200
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/ui/fragments/sessions?page=0", 400),
        ("/ui/fragments/sessions?page=x", 400),
        ("/ui/fragments/sessions?status=bogus", 400),
        ("/ui/fragments/sessions?project=/p&untagged=1", 400),
        ("/ui/fragments/sessions?q=" + "x" * 501, 400),
        ("/ui/fragments/sessions/s1?from=-1", 400),
        ("/ui/fragments/sessions/..bad", 400),
        ("/ui/fragments/sessions/nope", 404),
    ],
)
async def test_bad_requests_answer_4xx_pages(url: str, status: int) -> None:
    async with open_memory_store() as store, _client(store) as client:
        r = await client.get(url)
        assert r.status_code == status
        assert r.headers["content-type"].startswith("text/html")
        assert f"Error {status}" in r.text


# -- paging cost -----------------------------------------------------------------


class _Counting:
    """A memory store whose ``list_meta`` records the limits it was asked for."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.limits: list[int | None] = []

    def __getattr__(self, name: str) -> Any:
        if name == "search_meta":  # the list's fallback: list_meta read in batches
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def list_meta(self, filter: SessionFilter | None = None) -> list[SessionMetaRow]:
        self.limits.append(filter.limit if filter else None)
        rows: list[SessionMetaRow] = await self.inner.list_meta(filter)
        return rows


async def test_list_reads_only_what_the_page_needs() -> None:
    async with open_memory_store() as inner:
        for i in range(400):
            await inner.save(
                SessionData(
                    id=f"s{i:03d}",
                    created_at=T0,
                    updated_at=T0 + i,
                    status="error" if i == 7 else "completed",
                )
            )
        store = _Counting(inner)
        async with _client(store) as client:  # type: ignore[arg-type]
            r = await client.get("/ui/fragments/sessions")
            assert store.limits == [51] and r.text.count('class="session-row"') == 50
            store.limits.clear()
            r = await client.get("/ui/fragments/sessions?page=3")
            assert store.limits == [151] and 'data-session-id="s299"' in r.text
            assert 'rel="next"' in r.text
            store.limits.clear()
            r = await client.get("/ui/fragments/sessions?page=8")
            assert store.limits == [401] and 'rel="next"' not in r.text
            assert r.text.count('class="session-row"') == 50
            store.limits.clear()
            # A status filter that keeps one row: geometric batches up to the whole list.
            r = await client.get("/ui/fragments/sessions?status=error")
            assert store.limits == [51, 204, 816]
            assert r.text.count('class="session-row"') == 1 and 'rel="next"' not in r.text
            assert "scan-limit" not in r.text
            store.limits.clear()
            # ... and stops at the scan cap, offering to search further.
            r = await client.get("/ui/fragments/sessions?status=error&scan=100")
            assert store.limits == [51, 100]
            assert 'class="session-row"' not in r.text
            assert "Searched the 100 most recently updated sessions only" in r.text
            assert 'href="/ui/?status=error&amp;scan=400"' in r.text
            store.limits.clear()
            r = await client.get("/ui/fragments/sessions?status=error&scan=400")
            assert store.limits == [51, 204, 400]
            assert 'data-session-id="s007"' in r.text


def _talk(sid: str, i: int, text: str, tool: str) -> SessionData:
    turns = (
        SessionTurn(id="u", role="user", content=(TextBlock(text=text),), created_at=T0),
        SessionTurn(
            id="a",
            role="assistant",
            content=(ToolCallBlock(id="c1", name=tool, input={}),),
            created_at=T0,
        ),
    )
    day = 86_400_000
    return SessionData(
        id=sid, created_at=T0 + day * (i % 7), updated_at=T0 + day * 10 + i, turns=turns
    )


@pytest.mark.parametrize("name", ["memory", "sqlite"])
async def test_the_list_searches_messages_and_tools_and_counts_pages(name: str) -> None:
    async with STORES[name]() as store:
        for i in range(120):
            tool = "get_weather" if i % 40 == 0 else "read_file"
            await store.save(_talk(f"s{i:03d}", i, f"message {i} about topic{i % 3}", tool))
        async with _client(store) as client:
            r = await client.get("/ui/fragments/sessions")
            assert r.text.count('class="session-row"') == 50
            assert "120 sessions" in r.text and 'href="/ui/?page=3"' in r.text
            r = await client.get("/ui/fragments/sessions?page=3")
            assert r.text.count('class="session-row"') == 20 and 'rel="next"' not in r.text
            assert 'aria-current="page">3<' in r.text
            r = await client.get("/ui/fragments/sessions?q=weather")
            rows = re.findall(r'data-session-id="([^"]+)"', r.text)
            assert rows == ["s080", "s040", "s000"] and "3 sessions" in r.text
            r = await client.get("/ui/fragments/sessions?q=TOPIC2+message")
            assert r.text.count('class="session-row"') == 40 and "40 sessions" in r.text
            r = await client.get("/ui/fragments/sessions?q=message+117")
            assert re.findall(r'data-session-id="([^"]+)"', r.text) == ["s117"]
            r = await client.get("/ui/fragments/sessions?sort=created&q=weather")
            assert re.findall(r'data-session-id="([^"]+)"', r.text) == ["s040", "s080", "s000"]
            # 2025-06-15 is T0's day: created that day, 0 or 7 days in.
            day0 = datetime.fromtimestamp(T0 / 1000, UTC).date()
            r = await client.get(f"/ui/fragments/sessions?dates=created&from={day0}&to={day0}")
            assert "18 sessions" in r.text
            r = await client.get(f"/ui/fragments/sessions?dates=created&to={day0}&from=2000-01-01")
            assert "18 sessions" in r.text
            r = await client.get("/ui/fragments/sessions?from=2999-01-01")
            assert "No sessions match." in r.text and "0 sessions" in r.text


class _SearchRefused:
    """A memory store whose ``search_meta`` is refused (a remote store whose server lacks it)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def search_meta(self, search: Any) -> Any:
        raise UnsupportedOperationError("the backing store does not implement search_meta")


async def test_a_refused_search_falls_back_to_listing() -> None:
    async with open_memory_store() as inner:
        for i in range(60):
            await inner.save(_session(f"s{i:02d}", updated_at=T0 + i, metadata={}))
        async with _client(_SearchRefused(inner)) as client:  # type: ignore[arg-type]
            r = await client.get("/ui/fragments/sessions?q=s05")
            assert r.status_code == 200 and 'data-session-id="s05"' in r.text
            assert r.text.count('class="session-row"') == 1 and " sessions</span>" not in r.text
            r = await client.get("/ui/fragments/sessions?sort=created")
            assert r.status_code == 400 and "update time only" in r.text


class _RequiredOnly:
    """A store with only the protocol's required methods (no ``list_meta``, ``get_meta``...)."""

    _REQUIRED = frozenset(
        {
            "load",
            "save",
            "append_turns",
            "get_turns",
            "update_run",
            "update_status",
            "delete",
            "list",
        }
    )

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name not in self._REQUIRED:
            raise AttributeError(name)
        return getattr(self.inner, name)


async def test_a_store_with_only_the_required_methods_is_browsable() -> None:
    async with open_memory_store() as inner:
        for i in range(60):
            await inner.save(_session(f"s{i:02d}", updated_at=T0 + i, metadata={}))
        async with open_memory_store() as ref_store:
            for i in range(60):
                await ref_store.save(_session(f"s{i:02d}", updated_at=T0 + i, metadata={}))
            # The reference lists through list_meta too (no search_meta: no count, no offset).
            async with _client(_Counting(ref_store)) as client:  # type: ignore[arg-type]
                expected = [
                    (await client.get(u)).text
                    for u in ("/ui/fragments/sessions?page=2&q=hi", "/ui/fragments/sessions/s07")
                ]
        async with _client(_RequiredOnly(inner)) as client:  # type: ignore[arg-type]
            got = [
                (await client.get(u)).text
                for u in ("/ui/fragments/sessions?page=2&q=hi", "/ui/fragments/sessions/s07")
            ]
            schedules = await client.get("/ui/fragments/schedules")
    assert got[0] == expected[0] and got[0].count('class="session-row"') == 10
    cut = '<section class="artifacts">'
    assert got[1].split(cut)[0] == expected[1].split(cut)[0]
    assert "does not list artifacts" in got[1]
    assert schedules.status_code == 200 and "does not keep schedules" in schedules.text


async def test_a_running_session_opens_on_its_newest_turns() -> None:
    async with open_memory_store() as store, _client(store) as client:
        turns = tuple(
            SessionTurn(
                id=f"t{i}", role="user", content=(TextBlock(text=f"m{i}"),), created_at=T0 + i
            )
            for i in range(250)
        )
        await store.save(SessionData(id="live", created_at=T0, updated_at=T0, turns=turns))
        r = await client.get("/ui/fragments/sessions/live")
        assert 'data-turn-id="t0"' in r.text and "data-poll" not in r.text
        await store.update_status("live", "running")  # owned by this (live) process
        r = await client.get("/ui/fragments/sessions/live")
        assert 'data-poll="2000"' in r.text
        assert 'id="turn-200"' in r.text and 'id="turn-249"' in r.text
        assert 'id="turn-199"' not in r.text
        assert "turns 201–250 of 250" in r.text
        r = await client.get("/ui/fragments/sessions/live?from=0")
        assert 'id="turn-0"' in r.text and 'id="turn-100"' not in r.text


async def test_without_a_token_every_ui_route_follows_the_loopback_rule() -> None:
    async with open_memory_store() as store:
        transport = httpx.ASGITransport(app=create_app(store), client=("192.0.2.7", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for url in ("/ui/", "/ui/static/app.js", "/ui/fragments/sessions"):
                assert (await client.get(url)).status_code == 403, url


def test_chart_scales_and_labels_honestly() -> None:
    def runs(n: int, cost: float | None) -> tuple[SessionRun, ...]:
        return tuple(
            SessionRun(
                id=f"r{i}",
                prompt="",
                started_at=T0 + i,
                status="completed",
                tokens_in=0,
                tokens_out=0,
                cost=cost,
            )
            for i in range(n)
        )

    meta = SessionMetaRow(
        id="s", metadata={}, run_count=1, turn_count=0, updated_at=T0, user_message_count=0
    )

    def page(r: tuple[SessionRun, ...]) -> str:
        return render_session(
            SessionPage(
                meta=meta,
                turns=(),
                lookahead=(),
                start=0,
                page_size=100,
                runs=r,
                artifacts=None,
                now=T0,
            )
        )

    flat = page(runs(2, 0.0))
    assert "(max 0)" in flat and "(max $0.0000)" in flat and 'height="0.00"' in flat
    assert 'height="-' not in page(runs(1, -2.0))
    many = page(runs(75, 1.0))
    assert "the last 60 of 75 runs" in many
    assert many.count('class="bar-cost"') == 60 and 'data-run-id="r74"' in many


async def test_a_bad_row_is_a_marked_entry_and_a_deep_row_a_named_corrupt_data_answer() -> None:
    import sqlite3

    with tempfile.TemporaryDirectory() as tmp:
        db = f"{tmp}/s.db"
        async with open_sqlite_store(db) as store:
            for sid in ("good", "bad", "deep"):
                await store.save(_session(sid))
        deep_input = '{"x":' * 980 + "1" + "}" * 980
        body = (
            '{"id":"t2","role":"assistant","content":[{"type":"tool_call","id":"c1",'
            f'"name":"ls","input":{deep_input}}}],"createdAt":1}}'
        )
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE sessions SET metadata = '{oops' WHERE id = 'bad'")
            conn.execute(
                "UPDATE turns SET body = ? WHERE session_id = 'deep' AND id = 't2'", (body,)
            )
        async with open_sqlite_store(db) as store, _client(store) as client:
            listing = await client.get("/session-meta")
            assert listing.status_code == 200, listing.text
            rows = {row["id"]: row for row in listing.json()}
            assert set(rows) == {"good", "bad", "deep"}
            assert "bad" in rows["bad"]["corrupt"] and "corrupt" not in rows["good"]
            page = await client.get("/ui/fragments/sessions")
            assert page.status_code == 200, page.text
            assert 'data-session-id="bad"' in page.text and ">corrupt<" in page.text
            for url in ("/sessions/deep", "/sessions/deep/turns", "/ui/fragments/sessions/deep"):
                answer = await client.get(url)
                assert answer.status_code == 500, url
                text = answer.text.replace("&#x27;", "'")
                assert "internal" not in text and "'deep'" in text, (url, text[:300])
                if not url.startswith("/ui"):
                    assert answer.json()["error"]["code"] == "corrupt_data"


async def test_every_answer_carries_the_security_headers() -> None:
    async with open_memory_store() as store:
        await store.save(_session())
        async with _client(store, token="t0k") as client:
            auth = {"authorization": "Bearer t0k"}
            answers = [
                await client.get("/session-meta", headers=auth),  # JSON
                await client.get("/sessions/nope", headers=auth),  # JSON 404
                await client.get("/no/such/route", headers=auth),  # routing 404
                await client.get("/ui/static/nope.js"),  # /ui 404
                await client.get("/session-meta"),  # 401
                await client.get("/"),  # redirect
                await client.get("/ui/fragments/sessions", headers=auth),
            ]
            for answer in answers:
                where = (answer.request.url.path, answer.status_code)
                assert answer.headers["x-content-type-options"] == "nosniff", where
                assert answer.headers["x-frame-options"] == "DENY", where
                assert "frame-ancestors 'none'" in answer.headers["content-security-policy"], where
            assert answers[-1].headers["content-security-policy"] == CONTENT_SECURITY_POLICY


async def test_favicon_is_served_without_a_token() -> None:
    async with open_memory_store() as store, _client(store, token="t0k") as client:
        icon = await client.get("/favicon.ico", follow_redirects=True)
        assert icon.status_code == 200
        assert icon.headers["content-type"] == "image/svg+xml"
        shell = await client.get("/ui/")
        assert 'rel="icon" href="/ui/static/favicon.svg"' in shell.text


def test_durations_and_schedule_times_read_naturally() -> None:
    from zidane_actors.server._ui_common import _duration
    from zidane_actors.server._ui_schedules import render_schedules

    assert _duration(15 * 60_000) == "15 min"
    assert _duration(15 * 60_000 + 5_000) == "15 min 5 s"
    assert _duration(2 * 3_600_000) == "2 h"
    assert _duration(2 * 3_600_000 + 60_000) == "2 h 1 min"
    schedule = Schedule(
        id="sch",
        prompt="p",
        enabled=True,
        created_at=T0,
        updated_at=T0,
        interval_ms=900_000,
        next_fire_at=T0,
    )
    page = str(render_schedules([(schedule, [])]))
    assert "every 15 min<" in page
    assert "UTC</time>" in page


async def test_a_running_session_whose_owner_is_gone_shows_as_stale_and_is_not_polled() -> None:
    import sys
    import time

    import trio

    from zidane_actors.model import RunOwner, current_run_owner, host_id

    dead_pid = await trio.lowlevel.open_process([sys.executable, "-c", "pass"])
    await dead_pid.wait()
    now = time.time_ns() // 1_000_000
    owners = {
        "live": (current_run_owner(), now),  # this process: alive
        "dead-here": (RunOwner(host_id=host_id(), pid=dead_pid.pid, token="x"), now),
        "quiet-elsewhere": (RunOwner(host_id="other-host", pid=1, token="y"), T0),
        "recent-elsewhere": (RunOwner(host_id="other-host", pid=1, token="z"), now),
    }
    async with open_memory_store() as store:
        for sid, (owner, updated_at) in owners.items():
            await store.save(_session(sid, updated_at=updated_at))
            await store.update_status(sid, "running", owner=owner, preserve_updated_at=True)
        async with _client(store) as client:
            listing = (await client.get("/ui/fragments/sessions")).text
            for sid, expected in (
                ("live", "running"),
                ("dead-here", "stale"),
                ("quiet-elsewhere", "stale"),
                ("recent-elsewhere", "running"),
            ):
                page = (await client.get(f"/ui/fragments/sessions/{sid}")).text
                assert f'data-status="{expected}"' in page, sid
                assert ("data-poll" in page) == (expected == "running"), sid
                row = listing.split(f'data-session-id="{sid}"', 1)[1].split("</tr>", 1)[0]
                shown = "stale (owner gone)" if expected == "stale" else "running"
                assert f">{shown}<" in row, (sid, row)


async def test_reading_markdown_pretty_json_capped_outputs_and_folded_result_cards() -> None:
    from zidane_actors.server._ui import MORE_CHARS
    from zidane_actors.server._ui_session import SHOWN_CHARS

    huge = "line of tool output\n" * 11_000  # 220 KB
    turns = (
        SessionTurn(
            id="u1",
            role="user",
            content=(TextBlock("## Plan\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<b>raw</b>"),),
            created_at=T0,
        ),
        SessionTurn(
            id="a1",
            role="assistant",
            content=(
                ToolCallBlock(id="c1", name="read", input={"path": "x"}),
                ToolCallBlock(id="c2", name="dump", input={}),
            ),
            created_at=T0,
        ),
        SessionTurn(
            id="u2",
            role="user",
            content=(
                ToolResultBlock(call_id="c1", output='{"ok":true,"items":[1,2]}'),
                ToolResultBlock(call_id="c2", output=huge),
            ),
            created_at=T0,
        ),
    )
    async with open_memory_store() as store:
        await store.save(SessionData(id="s", created_at=T0, updated_at=T0, turns=turns))
        async with _client(store) as client:
            page = (await client.get("/ui/fragments/sessions/s")).text
            assert "<h2>Plan</h2>" in page and "<table>" in page
            assert "&lt;b&gt;raw&lt;/b&gt;" in page and "<b>raw</b>" not in page
            assert "{\n  &quot;ok&quot;: true," in page  # a JSON result, pretty-printed
            assert len(page) < SHOWN_CHARS + 20_000  # the 220 KB output is not sent whole
            assert page.count('class="turn ') == 2  # the results-only card is folded away
            assert 'class="turn-folded"' in page and 'data-turn-id="u2"' in page
            more = page.split('data-more="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
            assert more.startswith("/ui/fragments/sessions/s/turns/2/more?block=1&from=")
            rest = (await client.get(more)).text
            assert len(huge) - SHOWN_CHARS < MORE_CHARS  # one more fetch brings the rest
            assert "show more" not in rest
            # The cut falls inside one line: every other line is on one side of it.
            assert page.count("line of tool output") + rest.count("line of tool output") == 10_999
            assert huge[SHOWN_CHARS : SHOWN_CHARS + 60] in rest
            bad = await client.get("/ui/fragments/sessions/s/turns/2/more?block=7")
            assert bad.status_code == 400
            missing = await client.get("/ui/fragments/sessions/s/turns/9/more?block=0")
            assert missing.status_code == 404


async def test_lone_surrogates_are_shown_as_replacement_characters() -> None:
    """Text JavaScript clipped mid-pair: the pages answer 200 with U+FFFD, never an error."""
    clipped = SessionTurn(
        id="t1",
        role="assistant",
        content=(
            TextBlock("cut \ud83d"),
            ToolCallBlock(id="c1", name="f\udc00", input={"q": "\ud800"}),
        ),
        created_at=1,
    )
    async with open_memory_store() as store:
        await store.save(
            SessionData(
                id="s1",
                created_at=1,
                updated_at=2,
                metadata={"title": "t \ud83d"},
                turns=(clipped,),
            )
        )
        async with _client(store) as client:
            for url in ("/ui/fragments/sessions", "/ui/fragments/sessions/s1"):
                r = await client.get(url)
                assert r.status_code == 200, (url, r.text)
                assert "\ufffd" in r.text


async def test_an_agent_id_another_writer_stored_with_a_lone_surrogate_is_listed_and_filtered() -> (
    None
):
    # Stores refuse one (a text column cannot hold it), but a document another writer
    # made may hold one: the list shows it, and its agent link filters by it as stored.
    with tempfile.TemporaryDirectory() as directory:
        document = '{"id":"s1","createdAt":1,"updatedAt":2,"agentId":"agent \\ud800"}'
        await trio.Path(directory, "meta.json").write_text(document, encoding="ascii")
        async with open_directory_adapter(directory) as adapter:
            store = create_file_map_store(adapter)
            async with _client(store) as client:
                listed = await client.get("/ui/fragments/sessions")
                assert listed.status_code == 200, listed.text
                found = set(re.findall(r'href="/ui/\?(agent=agent\+%ED%A0%80)"', listed.text))
                (query,) = found
                r = await client.get(f"/ui/fragments/sessions?{query}")
                assert r.status_code == 200 and "/ui/sessions/s1" in r.text, r.text
                r = await client.get("/ui/fragments/sessions?agent=agent")
                assert r.status_code == 200 and "/ui/sessions/s1" not in r.text, r.text
            await store.aclose()
