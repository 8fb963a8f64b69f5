"""Runs in a real headless Chromium against a real ``zidane-actors serve``.

The store of tests/test_ui_runs.py (sessions holding failed runs, scope
sessions, a stale one) in a SQLite file, plus one run the openai-agents
door recorded (its calls timed by the SDK's hooks); the browser and its helpers are
tests/test_ui_browser.py's. Screenshots at 1400 and 420 px go to
``$ZIDANE_UI_SCREENSHOT_DIR`` when set (else a temporary directory).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from test_server_e2e import ServerProcess
from test_ui_browser import _open, _png_pixels, _session_ids, _until, browser, pytestmark
from test_ui_runs import _seed

from zidane_actors.stores import open_sqlite_store

from selenium.webdriver.common.by import By  # isort: skip
from selenium.webdriver.remote.webdriver import WebDriver  # isort: skip

__all__ = ["browser", "pytestmark"]  # the fixture and the Chromium skip, shared

WIDTHS = (1400, 420)


async def _seed_file(path: Path) -> None:
    async with open_sqlite_store(str(path)) as store:
        await _seed(store)


def _door_run(path: Path) -> None:
    """A real Runner call through the openai-agents door: model, failing tool, model."""
    agents = pytest.importorskip("agents")
    from agents.testing import ScriptedModel, assistant_message, function_call

    from zidane_actors.integrations.openai_agents import ZidaneSession

    @agents.function_tool
    def forecast(city: str) -> str:
        """A tool whose backend is down."""
        raise ConnectionError(f"no forecast for {city}")

    model = ScriptedModel(
        [[function_call("forecast", {"city": "Oslo"}, call_id="c1")], [assistant_message("Sorry.")]]
    )
    agent = agents.Agent(name="weather", model=model, tools=[forecast])
    agents.set_tracing_disabled(True)
    with ZidaneSession("door-1", store=f"sqlite:{path}") as session:
        session.run_sync(agent, "Weather in Oslo?")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    path = tmp_path_factory.mktemp("ui-runs") / "sessions.db"
    trio.run(_seed_file, path)
    _door_run(path)
    proc = ServerProcess(f"sqlite:{path}")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get("ZIDANE_UI_SCREENSHOT_DIR") or tmp_path_factory.mktemp("shots"))


@pytest.fixture(params=WIDTHS)
def width(browser: WebDriver, request: pytest.FixtureRequest) -> Iterator[int]:
    """The window's width for one test (each of ``WIDTHS``), set back afterwards."""
    browser.set_window_size(request.param, 1000)
    yield request.param
    browser.set_window_size(1280, 1600)


def _shot(driver: WebDriver, path: Path) -> None:
    """Save a screenshot, check it is not blank, and that the page never scrolls sideways."""
    assert driver.save_screenshot(str(path))
    width, _, bpp, rows = _png_pixels(path.read_bytes())
    colours = {row[x : x + 3] for row in rows[::7] for x in range(0, width * bpp, bpp * 5)}
    assert len(colours) > 10, f"{path.name} is (nearly) blank"
    scroll = driver.execute_script("return document.documentElement.scrollWidth")
    assert scroll <= width + 2, (path.name, scroll, width)


def test_failed_sessions_tokens_and_cost_in_the_list(
    browser: WebDriver, server: ServerProcess, shots: Path, width: int
) -> None:
    _open(browser, f"{server.url}/ui/", "sessions")
    ids = _session_ids(browser)
    assert ids[:5] == ["door-1", "bad-2", "bad-1", "ok-1", "stale-1"]
    assert not [i for i in ids if i.startswith("adk-")]  # scope sessions left out
    ok = browser.find_element(By.CSS_SELECTOR, "tr[data-session-id='ok-1']")
    assert ok.find_element(By.CSS_SELECTOR, "td.tokens").text == "150"
    assert ok.find_element(By.CSS_SELECTOR, "td.cost").text == "$0.0100"
    assert ok.find_element(By.CSS_SELECTOR, "td.cost").is_displayed()
    stale = browser.find_element(By.CSS_SELECTOR, "tr[data-session-id='stale-1']")
    assert "stale (owner gone)" in stale.text
    _shot(browser, shots / f"runs-list-{width}.png")

    browser.find_element(By.NAME, "failed").click()
    browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    _until(browser, lambda d: "failed=1" in d.current_url)
    _open(browser, browser.current_url, "sessions")
    assert _session_ids(browser) == ["bad-2", "bad-1"]
    mark = browser.find_element(By.CSS_SELECTOR, "tr[data-session-id='bad-1'] .failed-mark")
    assert mark.is_displayed() and mark.text == "✕ 1"
    _shot(browser, shots / f"runs-list-failed-{width}.png")

    _open(browser, f"{server.url}/ui/?scopes=1", "sessions")
    assert {"adk-app:shop", "adk-user:shop:u1"} <= set(_session_ids(browser))


def test_the_timeline_and_the_summary_render(
    browser: WebDriver, server: ServerProcess, shots: Path, width: int
) -> None:
    _open(browser, f"{server.url}/ui/sessions/bad-2", "session")
    rows = browser.find_elements(By.CSS_SELECTOR, "table.waterfall tr.span")
    assert [r.get_attribute("class") for r in rows] == [
        "span span-model",
        "span span-tool span-failed",
        "span span-model",
    ]
    bars = browser.find_elements(By.CSS_SELECTOR, "table.waterfall rect.bar")
    widths = [b.rect["width"] for b in bars]
    assert all(w > 0 for w in widths) and widths[0] > widths[1], widths  # 1.2 s > 0.5 s
    assert rows[1].find_elements(By.TAG_NAME, "td")[2].text == "500 ms"
    timeline = browser.find_element(By.CSS_SELECTOR, "section.timeline")
    browser.execute_script("arguments[0].scrollIntoView()", timeline)
    _shot(browser, shots / f"runs-timeline-{width}.png")

    # A run the door recorded: each call drawn at its own start, for its own length.
    _open(browser, f"{server.url}/ui/sessions/door-1", "session")
    timeline = browser.find_element(By.CSS_SELECTOR, "section.timeline")
    assert "Times as its framework measured each call." in timeline.text
    rows = browser.find_elements(By.CSS_SELECTOR, "table.waterfall tr.span")
    assert [r.get_attribute("class") for r in rows] == [
        "span span-model",
        "span span-tool span-failed",
        "span span-model",
    ]
    assert "forecast" in rows[1].text and rows[1].text.count(" ms") == 2
    starts = [b.rect["x"] for b in browser.find_elements(By.CSS_SELECTOR, "rect.bar")]
    assert starts == sorted(starts) and starts[0] < starts[2], starts
    browser.execute_script("arguments[0].scrollIntoView()", timeline)
    _shot(browser, shots / f"runs-timeline-door-{width}.png")

    _open(browser, f"{server.url}/ui/", "sessions")
    browser.find_element(By.CSS_SELECTOR, ".summary-link a").click()
    _until(browser, lambda d: "/ui/summary" in d.current_url)
    _open(browser, browser.current_url, "summary")
    agents = browser.find_elements(By.CSS_SELECTOR, "table.per-agent tbody tr")
    names = [r.find_element(By.TAG_NAME, "td").text for r in agents]
    assert names == ["alpha", "beta", "weather"]
    cells = [td.text for td in agents[0].find_elements(By.TAG_NAME, "td")]
    assert cells == ["alpha", "3", "1", "156", "$0.0120"]
    days = browser.find_elements(By.CSS_SELECTOR, "table.per-day tbody tr")
    assert len(days) == 3  # the door's run is today's
    assert (
        "every session that matches" in browser.find_element(By.CSS_SELECTOR, ".summary-scope").text
    )
    _shot(browser, shots / f"runs-summary-{width}.png")
