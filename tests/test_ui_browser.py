"""The session browser in a real headless Chromium against a real ``zidane-actors serve``.

One SQLite file is seeded once per module and served by two processes (one
without a token, one with); one browser serves every test. Waits are
explicit DOM conditions, never sleeps.
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from test_server_e2e import ServerProcess

from zidane_actors.model import (
    ImageBlock,
    ReasoningBlock,
    RunErrorDetail,
    Schedule,
    ScheduleFire,
    SessionArtifact,
    SessionData,
    SessionRun,
    SessionRunAgent,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    encode,
)
from zidane_actors.stores import open_sqlite_store
from zidane_actors.wire import interrupted_tool_result_output

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
TOKEN = "br0wser-t0ken"
WAIT_S = 30
T0 = 1_750_000_000_000
LIST_SESSIONS = 120
LONG_TURNS = 10_000
XSS_TEXT = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>"\'&'
# A 4x4 red PNG.
RED_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAEElEQVR4nGP4z8AARwzEcQCukw/x0F8jngAAAABJ"
    "RU5ErkJggg=="
)

pytestmark = pytest.mark.skipif(
    not (Path(CHROMEDRIVER).exists() and Path(CHROMIUM).exists())
    and not os.environ.get("ZIDANE_REQUIRE_CHROMIUM"),
    reason="needs the Debian packages chromium and chromium-driver (.ci/run installs them)",
)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


def _text(n: int, text: str, role: str = "user", **fields: Any) -> SessionTurn:
    return SessionTurn(
        id=f"t{n}", role=role, content=(TextBlock(text=text),), created_at=T0 + n, **fields
    )  # type: ignore[arg-type]


def _tree_session() -> tuple[SessionData, list[SessionArtifact]]:
    runs = (
        SessionRun(
            id="r-root",
            prompt="Plan the release",
            started_at=T0,
            ended_at=T0 + 65_000,
            status="completed",
            tokens_in=12_000,
            tokens_out=3_000,
            cost=0.42,
            agent=SessionRunAgent(id="lead", label="Lead"),
        ),
        SessionRun(
            id="r-sub1",
            prompt="Search the changelog",
            started_at=T0 + 1_000,
            ended_at=T0 + 5_000,
            status="aborted",
            parent_run_id="r-root",
            parent_call_id="call-grep",
            depth=1,
            label="searcher",
            tokens_in=4_000,
            tokens_out=500,
            cost=0.05,
        ),
        SessionRun(
            id="r-sub1b",
            prompt="Search the changelog (resumed)",
            started_at=T0 + 6_000,
            ended_at=T0 + 9_000,
            status="completed",
            parent_run_id="r-root",
            resumed_from_run_id="r-sub1",
            depth=1,
            label="searcher",
            tokens_in=2_500,
            tokens_out=900,
            cost=0.03,
        ),
        SessionRun(
            id="r-sub2",
            prompt="Write the notes",
            started_at=T0 + 10_000,
            ended_at=T0 + 30_000,
            status="error",
            error="rate limited",
            error_detail=RunErrorDetail(status_code=429, code="rate_limit_error"),
            parent_run_id="r-root",
            depth=1,
            label="writer",
            tokens_in=7_000,
            tokens_out=2_200,
            cost=0.11,
        ),
    )
    turns = (
        _text(1, "Please plan the 2.0 release", run_id="r-root"),
        SessionTurn(
            id="t2",
            role="assistant",
            content=(
                ReasoningBlock(text="secret chain of thought"),
                TextBlock(text="Let me look at the changelog."),
                ToolCallBlock(id="call-grep", name="grep", input={"pattern": "BREAKING"}),
                ToolCallBlock(id="call-open", name="open_file", input={"path": "NOTES.md"}),
            ),
            created_at=T0 + 2,
            run_id="r-root",
        ),
        SessionTurn(
            id="t3",
            role="user",
            content=(
                ToolResultBlock(call_id="call-grep", output="3 matches: BREAKING-1"),
                ToolResultBlock(
                    call_id="call-open",
                    output=interrupted_tool_result_output("open_file"),
                    is_error=True,
                ),
            ),
            created_at=T0 + 3,
            run_id="r-root",
        ),
        SessionTurn(
            id="t4",
            role="assistant",
            content=(
                TextBlock(text="Here is the chart you asked for:"),
                ImageBlock(media_type="image/png", data=RED_PNG),
            ),
            created_at=T0 + 4,
            run_id="r-root",
        ),
        _text(5, "The changelog lists 3 breaking changes.", role="assistant", run_id="r-sub1"),
    )
    data = SessionData(
        id="tree",
        created_at=T0,
        updated_at=T0 + 2_010,
        status="completed",
        metadata={"title": "Release planning", "model": "test-model"},
        turns=turns,
        runs=runs,
        agent_id="lead",
        project_root="/work/release",
    )
    artifacts = [
        SessionArtifact(
            id="a1",
            session_id="tree",
            kind="link",
            uri="https://example.invalid/notes",
            label="Release notes",
            created_at=T0,
            updated_at=T0,
        ),
        SessionArtifact(
            id="a2",
            session_id="tree",
            kind="file",
            uri="javascript:window.__xss=3",
            label="evil link",
            created_at=T0,
            updated_at=T0 + 1,
        ),
    ]
    return data, artifacts


async def _seed(path: Path) -> None:
    async with open_sqlite_store(str(path)) as store:
        for i in range(LIST_SESSIONS):
            agent = "agent-a" if i % 2 == 0 else "agent-b"
            project = ("/proj/one", "/proj/two", None)[i % 3]
            status = "completed" if i % 5 else "error"
            await store.save(
                SessionData(
                    id=f"s{i:03d}",
                    created_at=T0 + i,
                    updated_at=T0 + 1_000 + i,
                    status=status,
                    turns=(_text(0, f"Report number {i:03d} please"),),
                    agent_id=agent,
                    project_root=project,
                )
            )
        tree, artifacts = _tree_session()
        await store.save(tree)
        for artifact in artifacts:
            await store.upsert_artifact(artifact)
        await store.save(
            SessionData(
                id="xss",
                created_at=T0,
                updated_at=T0 + 2_011,
                metadata={"title": XSS_TEXT},
                turns=(_text(1, XSS_TEXT),),
                agent_id=XSS_TEXT,
                project_root=XSS_TEXT,
            )
        )
        await store.save(
            SessionData(
                id="long",
                created_at=T0,
                updated_at=T0 + 2_012,
                metadata={"title": "A very long session"},
                turns=tuple(
                    _text(n, f"message {n}", role="user" if n % 2 == 0 else "assistant")
                    for n in range(LONG_TURNS)
                ),
            )
        )
        await store.save(
            SessionData(
                id="live",
                created_at=T0,
                updated_at=T0 + 2_013,
                status="running",
                metadata={"title": "Live session"},
                turns=(_text(1, "first live message"),),
            )
        )
        await store.save_schedule(
            Schedule(
                id="nightly",
                name="Nightly digest",
                prompt="Summarise the day",
                enabled=True,
                created_at=T0,
                updated_at=T0,
                interval_ms=86_400_000,
                next_fire_at=T0 + 86_400_000,
                session_id="tree",
            )
        )
        for k in range(3):
            await store.record_schedule_fire(
                ScheduleFire(
                    id=f"f{k}",
                    schedule_id="nightly",
                    due_at=T0 + k * 1000,
                    fired_at=T0 + k * 1000 + 5,
                    status="error" if k == 1 else "ok",
                    session_id="tree",
                    error="provider down" if k == 1 else None,
                )
            )


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ui") / "sessions.db"
    trio.run(_seed, path)
    return path


@pytest.fixture(scope="module")
def server(db: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(f"sqlite:{db}")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def token_server(db: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(f"sqlite:{db}", token=TOKEN)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must never download anything
    profile = tmp_path_factory.mktemp("chromium-profile")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1600",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _until(driver: WebDriver, condition: Callable[[WebDriver], Any]) -> Any:
    return WebDriverWait(driver, WAIT_S).until(condition)


def _open(driver: WebDriver, url: str, page: str) -> WebElement:
    """Navigate and wait for the fragment of ``page`` to be shown."""
    driver.get(url)
    return _shown(driver, page)


def _shown(driver: WebDriver, page: str) -> WebElement:
    def ready(d: WebDriver) -> WebElement | bool:
        if d.find_element(By.TAG_NAME, "body").get_attribute("data-state") != "ready":
            return False
        roots = d.find_elements(By.CSS_SELECTOR, f"#app > [data-page='{page}']")
        return roots[0] if roots else False

    root: WebElement = _until(driver, ready)
    return root


def _session_ids(driver: WebDriver) -> list[str]:
    return [
        str(row.get_attribute("data-session-id"))
        for row in driver.find_elements(By.CSS_SELECTOR, "tr.session-row")
    ]


def _newest_first(ids: list[str]) -> list[str]:
    return sorted(ids, key=lambda i: -int(i[1:]))


# -- the list -------------------------------------------------------------------


def test_list_newest_first_and_paged(browser: WebDriver, server: ServerProcess) -> None:
    _open(browser, f"{server.url}/ui/", "sessions")
    ids = _session_ids(browser)
    assert len(ids) == 50
    assert ids[:4] == ["live", "long", "xss", "tree"]  # most recently updated first
    assert ids[4:] == [f"s{i:03d}" for i in range(119, 73, -1)]
    first_row = browser.find_element(By.CSS_SELECTOR, "tr.session-row")
    assert "Live session" in first_row.text
    tree_row = browser.find_element(By.CSS_SELECTOR, "tr[data-session-id=tree]").text
    assert "Release planning" in tree_row and "lead" in tree_row and "/work/release" in tree_row
    assert "completed" in tree_row and "2025-06-15 15:06:42" in tree_row

    browser.find_element(By.CSS_SELECTOR, "a[rel=next]").click()
    _until(browser, lambda d: "page=2" in d.current_url)
    _shown(browser, "sessions")
    assert _session_ids(browser) == [f"s{i:03d}" for i in range(73, 23, -1)]
    browser.find_element(By.CSS_SELECTOR, "a[rel=next]").click()
    _until(browser, lambda d: "page=3" in d.current_url)
    _shown(browser, "sessions")
    assert _session_ids(browser) == [f"s{i:03d}" for i in range(23, -1, -1)]
    assert not browser.find_elements(By.CSS_SELECTOR, "a[rel=next]")
    browser.find_element(By.CSS_SELECTOR, "a[rel=prev]").click()
    _until(browser, lambda d: "page=2" in d.current_url)
    _shown(browser, "sessions")
    assert _session_ids(browser)[0] == "s073"


def test_list_filters_and_search(browser: WebDriver, server: ServerProcess) -> None:
    _open(browser, f"{server.url}/ui/", "sessions")
    browser.find_element(By.NAME, "agent").send_keys("agent-b")
    Select(browser.find_element(By.NAME, "status")).select_by_value("error")
    browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    _until(browser, lambda d: "status=error" in d.current_url)
    _shown(browser, "sessions")
    expected = [f"s{i:03d}" for i in range(LIST_SESSIONS) if i % 2 == 1 and i % 5 == 0]
    assert _session_ids(browser) == _newest_first(expected)
    assert browser.find_element(By.NAME, "agent").get_attribute("value") == "agent-b"

    _open(browser, f"{server.url}/ui/?untagged=1&agent=agent-a", "sessions")
    expected = [f"s{i:03d}" for i in range(LIST_SESSIONS) if i % 3 == 2 and i % 2 == 0]
    assert _session_ids(browser) == _newest_first(expected)
    assert browser.find_element(By.NAME, "untagged").is_selected()

    _open(browser, f"{server.url}/ui/?project=/proj/two", "sessions")
    expected = [f"s{i:03d}" for i in range(LIST_SESSIONS) if i % 3 == 1]
    assert _session_ids(browser) == _newest_first(expected)

    _open(browser, f"{server.url}/ui/", "sessions")
    browser.find_element(By.NAME, "q").send_keys("number 10")
    browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    _until(browser, lambda d: "q=number" in d.current_url)
    _shown(browser, "sessions")
    assert _session_ids(browser) == _newest_first([f"s{i:03d}" for i in range(100, 110)])

    _open(browser, f"{server.url}/ui/?q=RELEASE+plan", "sessions")
    assert _session_ids(browser) == ["tree"]  # case-insensitive, on the stored title


def test_search_finds_message_text_and_page_numbers_navigate(
    browser: WebDriver, server: ServerProcess
) -> None:
    _open(browser, f"{server.url}/ui/", "sessions")
    pager = browser.find_element(By.CSS_SELECTOR, "nav.pager")
    assert f"{LIST_SESSIONS + 4} sessions" in pager.text
    assert pager.find_element(By.CSS_SELECTOR, "[aria-current=page]").text == "1"
    pager.find_element(By.LINK_TEXT, "3").click()
    _until(browser, lambda d: "page=3" in d.current_url)
    _shown(browser, "sessions")
    assert _session_ids(browser) == [f"s{i:03d}" for i in range(23, -1, -1)]
    browser.find_element(By.CSS_SELECTOR, "nav.pager").find_element(By.LINK_TEXT, "2").click()
    _until(browser, lambda d: "page=2" in d.current_url)
    _shown(browser, "sessions")
    assert _session_ids(browser)[0] == "s073"

    # A word of an assistant turn (not the title), then a tool name.
    _open(browser, f"{server.url}/ui/", "sessions")
    browser.find_element(By.NAME, "q").send_keys("Changelog")
    browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    _until(browser, lambda d: "q=Changelog" in d.current_url)
    _shown(browser, "sessions")
    assert _session_ids(browser) == ["tree"]
    assert "1 session" in browser.find_element(By.CSS_SELECTOR, "nav.pager").text
    _open(browser, f"{server.url}/ui/?q=open_file", "sessions")
    assert _session_ids(browser) == ["tree"]
    _open(browser, f"{server.url}/ui/?q=report+please&sort=created", "sessions")
    assert _session_ids(browser)[:2] == ["s119", "s118"]


# -- one session ----------------------------------------------------------------


def test_session_run_tree_chart_and_tool_results(browser: WebDriver, server: ServerProcess) -> None:
    _open(browser, f"{server.url}/ui/", "sessions")
    browser.find_element(By.CSS_SELECTOR, "tr[data-session-id=tree] td.title a").click()
    root = _shown(browser, "session")
    assert root.get_attribute("data-session-id") == "tree"
    assert browser.title.startswith("Release planning")

    tree = browser.find_element(By.CSS_SELECTOR, "ul.run-tree")
    top = tree.find_elements(By.XPATH, "./li")
    assert [li.get_attribute("data-run-id") for li in top] == ["r-root"]
    children = top[0].find_elements(By.XPATH, "./ul/li")
    assert [li.get_attribute("data-run-id") for li in children] == ["r-sub1", "r-sub1b", "r-sub2"]
    sub1b = browser.find_element(By.ID, "run-r-sub1b")
    assert "resumes r-sub1" in sub1b.text
    assert "completed" in sub1b.text and "2,500 in / 900 out" in sub1b.text
    assert "$0.0300" in sub1b.text
    assert "resumed by r-sub1b" in browser.find_element(By.ID, "run-r-sub1").text
    sub2 = browser.find_element(By.ID, "run-r-sub2")
    assert "error" in sub2.text and "rate limited" in sub2.text and "20.0 s" in sub2.text
    assert "1 min 5 s" in browser.find_element(By.ID, "run-r-root").text

    bars = browser.find_elements(By.CSS_SELECTOR, ".chart-tokens g[data-run-id]")
    assert [b.get_attribute("data-run-id") for b in bars] == [
        "r-root",
        "r-sub1",
        "r-sub1b",
        "r-sub2",
    ]
    heights = [
        float(str(r.get_attribute("height")))
        for r in browser.find_elements(By.CSS_SELECTOR, ".chart-cost rect.bar-cost")
    ]
    assert heights[0] == max(heights) and heights[2] < heights[1] < heights[3]

    grep = browser.find_element(By.CSS_SELECTOR, ".tool-call[data-call-id=call-grep]")
    assert "grep" in grep.text and "BREAKING" in grep.text
    result = grep.find_element(By.CSS_SELECTOR, ".tool-result")
    assert "3 matches: BREAKING-1" in result.text
    opened = browser.find_element(By.CSS_SELECTOR, ".tool-call[data-call-id=call-open]")
    synthetic = opened.find_element(By.CSS_SELECTOR, ".tool-result")
    assert "synthetic" in synthetic.text and "is-error" in str(synthetic.get_attribute("class"))
    # The results' own turn does not repeat them.
    t3 = browser.find_element(By.CSS_SELECTOR, "[data-turn-id=t3]")
    assert not t3.find_elements(By.CSS_SELECTOR, ".tool-result")

    reasoning = browser.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert reasoning.get_attribute("open") is None
    assert not browser.find_element(By.CSS_SELECTOR, "details.reasoning pre").is_displayed()
    reasoning.find_element(By.TAG_NAME, "summary").click()
    _until(
        browser, lambda d: d.find_element(By.CSS_SELECTOR, "details.reasoning pre").is_displayed()
    )

    image = browser.find_element(By.CSS_SELECTOR, "img.inline-image")
    _until(browser, lambda d: d.execute_script("return arguments[0].naturalWidth", image) == 4)

    artifacts = browser.find_elements(By.CSS_SELECTOR, "tr.artifact")
    assert len(artifacts) == 2
    link = browser.find_element(By.LINK_TEXT, "Release notes")
    assert link.get_attribute("href") == "https://example.invalid/notes"
    assert not browser.find_elements(By.LINK_TEXT, "evil link")  # javascript: is never a link
    assert "test-model" in browser.find_element(By.CSS_SELECTOR, "section.metadata").text

    # Structure: who answered, what started whom, totals, errors in full.
    totals = browser.find_element(By.CSS_SELECTOR, "p.totals").text
    assert "25,500 tokens in" in totals and "6,600 tokens out" in totals and "$0.6100" in totals
    assert "429" in sub2.text and "rate_limit_error" in sub2.text
    t5 = browser.find_element(By.CSS_SELECTOR, "[data-turn-id=t5]")
    assert "searcher" in t5.find_element(By.CSS_SELECTOR, "header").text
    assert "Lead" in browser.find_element(By.CSS_SELECTOR, "[data-turn-id=t2] header").text
    grep.find_element(By.CSS_SELECTOR, "a.subrun").click()
    _until(browser, lambda d: d.current_url.endswith("#run-r-sub1"))
    sub1 = browser.find_element(By.ID, "run-r-sub1")
    sub1.find_element(By.CSS_SELECTOR, "a.parent-call").click()
    _until(browser, lambda d: d.current_url.endswith("#call-call-grep"))
    sub1.find_element(By.CSS_SELECTOR, "a.run-filter").click()
    _until(browser, lambda d: "run=r-sub1" in d.current_url)
    _shown(browser, "session")
    shown = [
        t.get_attribute("data-turn-id")
        for t in browser.find_elements(By.CSS_SELECTOR, "article.turn")
    ]
    assert shown == ["t5"]


def test_a_page_of_a_10k_turn_session(browser: WebDriver, server: ServerProcess) -> None:
    _open(browser, f"{server.url}/ui/sessions/long?from=5000", "session")
    turns = browser.find_elements(By.CSS_SELECTOR, "article.turn")
    assert len(turns) == 100
    assert turns[0].get_attribute("data-turn-id") == "t5000"
    assert "message 5000" in turns[0].text and "#5001" in turns[0].text
    assert turns[-1].get_attribute("data-turn-id") == "t5099"
    assert "turns 5001–5100 of 10,000" in browser.find_element(By.CSS_SELECTOR, ".pager").text
    browser.find_element(By.CSS_SELECTOR, ".pager a[rel=next]").click()
    _until(browser, lambda d: "from=5100" in d.current_url)
    _shown(browser, "session")
    first = browser.find_element(By.CSS_SELECTOR, "article.turn")
    assert first.get_attribute("data-turn-id") == "t5100"
    browser.find_element(By.CSS_SELECTOR, ".pager a[rel=last]").click()
    _until(browser, lambda d: "from=9900" in d.current_url)
    _shown(browser, "session")
    turns = browser.find_elements(By.CSS_SELECTOR, "article.turn")
    assert turns[-1].get_attribute("data-turn-id") == "t9999"
    assert not browser.find_elements(By.CSS_SELECTOR, ".pager a[rel=next]")


def test_xss_in_store_content_renders_as_text(browser: WebDriver, server: ServerProcess) -> None:
    browser.get_log("browser")  # drop earlier messages
    _open(browser, f"{server.url}/ui/?q=onerror", "sessions")
    assert _session_ids(browser) == ["xss"]
    row = browser.find_element(By.CSS_SELECTOR, "tr[data-session-id=xss]")
    links = row.find_elements(By.TAG_NAME, "a")
    assert [a.text for a in links] == [XSS_TEXT] * 3  # title, agent and project links
    # The agent link filters by the text as it is (query-encoded into the URL).
    links[1].click()
    _until(browser, lambda d: "agent=" in d.current_url)
    _shown(browser, "sessions")
    assert _session_ids(browser) == ["xss"]
    assert browser.find_element(By.NAME, "agent").get_attribute("value") == XSS_TEXT
    browser.find_element(By.CSS_SELECTOR, "tr[data-session-id=xss] td.title a").click()
    _shown(browser, "session")
    text = browser.find_element(By.CSS_SELECTOR, "[data-turn-id=t1] .block.text")
    assert text.text == XSS_TEXT
    assert browser.find_element(By.TAG_NAME, "h1").text == XSS_TEXT
    app = browser.find_element(By.ID, "app")
    assert not app.find_elements(By.CSS_SELECTOR, "script, img[src=x]")
    assert browser.execute_script("return window.__xss === undefined")
    # Nothing even tried to run (a blocked attempt would log a CSP violation).
    assert not [m for m in browser.get_log("browser") if "Content Security Policy" in m["message"]]


def test_running_session_refreshes_as_turns_arrive(
    browser: WebDriver, server: ServerProcess
) -> None:
    with httpx.Client(base_url=server.url) as client:
        # Owned by the live server process, so no reader demotes it as stale.
        assert client.put("/sessions/live/status", json={"status": "running"}).status_code == 204
        browser.set_window_size(1280, 500)
        root = _open(browser, f"{server.url}/ui/sessions/live", "session")
        assert root.get_attribute("data-status") == "running"
        assert root.get_attribute("data-poll")
        turn = _text(2, "a turn that arrived later", role="assistant")
        r = client.post(
            "/sessions/live/turns",
            content=b'{"turns": [' + encode(turn) + b"]}",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 204
        _until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-turn-id=t2]"))
        assert "a turn that arrived later" in browser.find_element(By.ID, "app").text
        newest = browser.find_element(By.CSS_SELECTOR, "[data-turn-id=t2]")
        # A live tail: the newest turn is scrolled into view (the page is taller than this).
        assert browser.execute_script(
            "var r = arguments[0].getBoundingClientRect();"
            "return document.documentElement.scrollHeight > innerHeight"
            " && r.bottom <= innerHeight + 1 && r.bottom > 0;",
            newest,
        )
        r = client.put("/sessions/live/status", json={"status": "completed"})
        assert r.status_code == 204
    _until(
        browser,
        lambda d: (
            d.find_element(By.CSS_SELECTOR, "#app > [data-page=session]").get_attribute(
                "data-status"
            )
            == "completed"
        ),
    )
    assert (
        browser.find_element(By.CSS_SELECTOR, "#app > section").get_attribute("data-poll") is None
    )
    browser.set_window_size(1280, 1600)


def test_schedules_page(browser: WebDriver, server: ServerProcess) -> None:
    _open(browser, f"{server.url}/ui/", "sessions")
    browser.find_element(By.LINK_TEXT, "Schedules").click()
    _shown(browser, "schedules")
    schedule = browser.find_element(By.CSS_SELECTOR, "[data-schedule-id=nightly]")
    assert "Nightly digest" in schedule.text and "every 24 h\n" in schedule.text
    assert "next fire\n2025-06-16 15:06:40 UTC" in schedule.text
    fires = schedule.find_elements(By.CSS_SELECTOR, "li.fire")
    assert len(fires) == 3
    assert "provider down" in fires[1].text  # newest first: f2, f1, f0


# -- token mode -------------------------------------------------------------------


def test_token_mode_asks_once_and_keeps_it_out_of_urls(
    browser: WebDriver, token_server: ServerProcess
) -> None:
    browser.get(f"{token_server.url}/ui/")
    field = _until(browser, lambda d: d.find_elements(By.ID, "token-input"))[0]
    field.send_keys(TOKEN)
    field.submit()
    _shown(browser, "sessions")
    assert len(_session_ids(browser)) == 50
    browser.find_element(By.CSS_SELECTOR, "tr[data-session-id=tree] td.title a").click()
    _shown(browser, "session")  # no second prompt: the token is in sessionStorage
    browser.find_element(By.LINK_TEXT, "Schedules").click()
    _shown(browser, "schedules")
    assert TOKEN not in browser.current_url
    assert browser.execute_script("return sessionStorage.length") == 1
    # The data routes still refuse a request without the header.
    assert httpx.get(f"{token_server.url}/ui/fragments/sessions").status_code == 401

    # "Forget token" drops it: the next page asks again.
    browser.find_element(By.ID, "forget-token").click()
    _until(browser, lambda d: d.find_elements(By.ID, "token-input"))
    assert browser.execute_script("return sessionStorage.length") == 0
    assert not browser.find_elements(By.ID, "forget-token")

    browser.execute_script("sessionStorage.setItem('zidane-actors.token', 'wrong')")
    browser.get(f"{token_server.url}/ui/sessions/tree")
    _until(browser, lambda d: d.find_elements(By.ID, "token-input"))
    assert "refused" in browser.find_element(By.CSS_SELECTOR, ".token-form").text


# -- screenshot -----------------------------------------------------------------


def _png_pixels(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """Width, height, bytes per pixel and unfiltered rows of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6) and header[12] == 0  # no interlace
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[x] = (line[x] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def test_session_page_screenshot(
    browser: WebDriver, server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    browser.set_window_size(1280, 1400)
    _open(browser, f"{server.url}/ui/sessions/tree", "session")
    img = browser.find_element(By.CSS_SELECTOR, "img.inline-image")
    _until(browser, lambda d: d.execute_script("return arguments[0].complete", img))
    path = Path(os.environ.get("ZIDANE_UI_SCREENSHOT_DIR") or tmp_path_factory.mktemp("shots"))
    shot = path / "session-page.png"
    assert browser.save_screenshot(str(shot))
    width, height, bpp, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == tuple(browser.execute_script("return [innerWidth, innerHeight]"))
    colours = {row[x : x + 3] for row in rows[::7] for x in range(0, width * bpp, bpp * 5)}
    assert len(colours) > 20, "the screenshot is (nearly) blank"
    # The status badges, the chart's bars and the dark text are all on screen.
    assert any(c[0] < 60 and c[1] < 60 and c[2] < 60 for c in colours)


def test_narrow_window_keeps_titles_readable(browser: WebDriver, server: ServerProcess) -> None:
    browser.set_window_size(480, 900)
    try:
        _open(browser, f"{server.url}/ui/", "sessions")
        title = browser.find_element(By.CSS_SELECTOR, "tr[data-session-id=tree] td.title")
        assert title.size["width"] >= 140, title.size  # not a few letters wide
        agent = browser.find_element(By.CSS_SELECTOR, "tr[data-session-id=tree] td.wide")
        assert not agent.is_displayed()
        page_width = browser.execute_script("return document.documentElement.scrollWidth")
        assert page_width <= 480 + 2, page_width  # no sideways scrolling
        errors = [
            e
            for e in browser.get_log("browser")
            if "favicon" in e["message"] and "404" in e["message"]
        ]
        assert errors == []
    finally:
        browser.set_window_size(1280, 1600)


def test_markdown_and_show_all_in_place(browser: WebDriver, server: ServerProcess) -> None:
    long_output = "".join(f"output line {n:05d}\n" for n in range(4_000))  # ~76 KB
    reading = SessionData(
        id="reading",
        created_at=T0,
        updated_at=T0,
        turns=(
            _text(
                0,
                "## Plan\n\n1. read the **log**\n2. answer\n\n`code` and [a link](https://example.com)",
            ),
            SessionTurn(
                id="t1",
                role="assistant",
                content=(ToolCallBlock(id="c1", name="cat", input={"path": "log"}),),
                created_at=T0 + 1,
            ),
            SessionTurn(
                id="t2",
                role="user",
                content=(ToolResultBlock(call_id="c1", output=long_output),),
                created_at=T0 + 2,
            ),
        ),
    )
    with httpx.Client(base_url=server.url) as client:
        put = client.put(
            "/sessions/reading",
            content=encode(reading),
            headers={"content-type": "application/json"},
        )
        assert put.status_code in (200, 204), (put.status_code, put.text)
        try:
            root = _open(browser, f"{server.url}/ui/sessions/reading", "session")
            heading = root.find_element(By.CSS_SELECTOR, ".markdown h2")
            assert heading.text == "Plan"
            link = root.find_element(By.CSS_SELECTOR, ".markdown a")
            assert link.get_attribute("rel") == "noopener noreferrer nofollow"
            assert not root.find_elements(By.CSS_SELECTOR, "[data-turn-id=t2].turn")  # folded
            app = browser.find_element(By.ID, "app")
            assert "output line 03999" not in app.text
            root.find_element(By.CSS_SELECTOR, "a.show-all").click()
            _until(browser, lambda d: "output line 03999" in d.find_element(By.ID, "app").text)
            assert not browser.find_elements(By.CSS_SELECTOR, "a.show-all")
        finally:
            assert client.delete("/sessions/reading").status_code == 204
