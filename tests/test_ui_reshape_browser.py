"""Folds, forks and branches in a real headless Chromium against a real ``zidane-actors serve``.

The documents of tests/test_ui_reshape.py in a SQLite file; the browser and
its helpers are tests/test_ui_browser.py's. Screenshots at 1400 and 420 px go
to ``$ZIDANE_UI_SCREENSHOT_DIR`` when set (else a temporary directory).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from test_server_e2e import ServerProcess
from test_ui_browser import _open, _until, browser, pytestmark
from test_ui_reshape import T0, _branched, _lineage_store, _summary, compacted
from test_ui_runs_browser import _shot, shots, width

from zidane_actors.model import SessionTurn, TextBlock
from zidane_actors.stores import open_sqlite_store, store_capabilities

from selenium.webdriver.common.by import By  # isort: skip
from selenium.webdriver.remote.webdriver import WebDriver  # isort: skip

__all__ = ["browser", "pytestmark", "shots", "width"]  # the fixtures and the Chromium skip, shared

RECAP = (
    "**Recap.** The user asked for a release plan; we agreed on:\n\n"
    "1. freeze on Friday\n2. notes by Monday\n3. ship on Tuesday"
)


async def _seed_file(path: Path) -> bool:
    async with open_sqlite_store(str(path)) as store:
        summary = [
            *_summary("Where are we with the release?"),
            SessionTurn(id="s1", role="assistant", content=(TextBlock(RECAP),), created_at=T0),
        ]
        await store.save(compacted("compacted", 60, {52: ("t49", summary)}))
        await _lineage_store(store)
        for data in _branched("b"):
            await store.save(data)
        await store.save(compacted("long", 260, {}, metadata={"title": "A long one"}))
        nested = {10: ("t5", _summary("first recap")), 20: ("t15", _summary("second recap"))}
        await store.save(compacted("nested", 24, nested))
        paged = {230: ("t219", _summary("recap of 220 turns"))}
        await store.save(compacted("paged", 240, paged))
        return "list_forks" in store_capabilities(store)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, bool]]:
    path = tmp_path_factory.mktemp("ui-reshape") / "sessions.db"
    lists_forks = trio.run(_seed_file, path)
    proc = ServerProcess(f"sqlite:{path}")
    proc.start()
    yield proc, lists_forks
    proc.stop()


def _turn(driver: WebDriver, turn_id: str) -> object:
    return driver.find_element(By.CSS_SELECTOR, f"[data-turn-id='{turn_id}']")


def test_a_compaction_folds_its_turns_behind_one_click(
    browser: WebDriver, server: tuple[ServerProcess, bool], shots: Path, width: int
) -> None:
    proc, _ = server
    _open(browser, f"{proc.url}/ui/sessions/compacted", "session")
    fold = browser.find_element(By.CSS_SELECTOR, "section.fold")
    head = fold.find_element(By.CSS_SELECTOR, ".fold-head")
    assert "50 turns summarized" in head.text
    summary = fold.find_elements(By.CSS_SELECTOR, ".fold-summary article.turn")
    assert len(summary) == 2 and all(card.is_displayed() for card in summary)
    assert summary[1].find_element(By.TAG_NAME, "ol").is_displayed()  # Markdown drawn
    first = browser.find_element(By.ID, "turn-0")
    assert not first.is_displayed()  # folded away
    assert browser.find_element(By.ID, "turn-50").is_displayed()  # kept, after through
    browser.execute_script("arguments[0].scrollIntoView()", fold)
    _shot(browser, shots / f"reshape-fold-{width}.png")

    fold.find_element(By.CSS_SELECTOR, "details.fold-originals > summary").click()
    _until(browser, lambda d: d.find_element(By.ID, "turn-0").is_displayed())
    assert browser.find_element(By.ID, "turn-49").is_displayed()
    _shot(browser, shots / f"reshape-fold-open-{width}.png")

    # The marker's line leads back to its fold.
    marker = browser.find_element(By.ID, "turn-52")
    assert "stands for turns 1–50" in marker.text
    browser.execute_script("arguments[0].scrollIntoView()", marker)
    marker.find_element(By.CSS_SELECTOR, "a[href='#fold-52']").click()
    _until(browser, lambda d: d.execute_script("return location.hash") == "#fold-52")


def test_a_turn_link_opens_its_page_and_the_fold_hiding_it(
    browser: WebDriver, server: tuple[ServerProcess, bool]
) -> None:
    proc, _ = server
    _open(browser, f"{proc.url}/ui/sessions/compacted?turn=t7", "session")
    target = browser.find_element(By.CSS_SELECTOR, ".turn.target")
    assert target.get_attribute("data-turn-id") == "t7"
    _until(browser, lambda d: target.is_displayed())  # its fold opened
    inside = browser.execute_script(
        "var r = arguments[0].getBoundingClientRect(); return r.top > -2 && r.top < innerHeight",
        target,
    )
    assert inside, browser.execute_script(
        "return [arguments[0].getBoundingClientRect().top, scrollY, innerHeight]", target
    )
    _open(browser, f"{proc.url}/ui/sessions/long?turn=t234", "session")
    assert "turns 201–260 of 260" in browser.find_element(By.CSS_SELECTOR, ".pager").text
    assert browser.find_element(By.CSS_SELECTOR, ".turn.target").get_attribute("id") == "turn-234"


def test_forks_link_both_ways_and_branches_are_reachable(
    browser: WebDriver, server: tuple[ServerProcess, bool], shots: Path, width: int
) -> None:
    proc, lists_forks = server
    _open(browser, f"{proc.url}/ui/sessions/fork-a", "session")
    lineage = browser.find_element(By.CSS_SELECTOR, "section.lineage")
    assert "Forked from" in lineage.text and "The source" in lineage.text
    _shot(browser, shots / f"reshape-fork-{width}.png")
    lineage.find_element(By.CSS_SELECTOR, ".forked-from a.turn-link").click()
    _until(browser, lambda d: "turn=t2" in d.current_url)
    _open(browser, browser.current_url, "session")
    assert browser.find_element(By.CSS_SELECTOR, ".turn.target").get_attribute("id") == ("turn-2")
    if lists_forks:
        forks = browser.find_elements(By.CSS_SELECTOR, "section.lineage .fork-list li")
        assert [f.get_attribute("data-session-id") for f in forks] == ["fork-a", "fork-b"]
        forks[1].find_element(By.TAG_NAME, "a").click()
        _until(browser, lambda d: d.current_url.endswith("/ui/sessions/fork-b"))

    _open(browser, f"{proc.url}/ui/sessions/b", "session")
    rows = browser.find_elements(By.CSS_SELECTOR, "table.branch-table tr.branch")
    assert [r.get_attribute("data-session-id") for r in rows] == ["b-left1", "b-left2"]
    assert all(r.is_displayed() for r in rows)
    _shot(browser, shots / f"reshape-branches-{width}.png")
    rows[0].find_element(By.CSS_SELECTOR, "a[href='/ui/sessions/b-left1']").click()
    _until(browser, lambda d: d.current_url.endswith("/ui/sessions/b-left1"))
    _open(browser, browser.current_url, "session")
    back = browser.find_element(By.CSS_SELECTOR, "section.lineage .branch-of")
    assert "A branch left by" in back.text and "went back to turn t1" in back.text
    back.find_element(By.CSS_SELECTOR, "a.session-link").click()
    _until(browser, lambda d: d.current_url.endswith("/ui/sessions/b"))

    _open(browser, f"{proc.url}/ui/", "sessions")
    row = browser.find_element(By.CSS_SELECTOR, "tr[data-session-id='b-left1']")
    assert "↶ branch left by b" in row.find_element(By.CSS_SELECTOR, ".sid").text
    _shot(browser, shots / f"reshape-list-{width}.png")


def test_nested_and_paged_folds(
    browser: WebDriver, server: tuple[ServerProcess, bool], shots: Path, width: int
) -> None:
    proc, _ = server
    _open(browser, f"{proc.url}/ui/sessions/nested", "session")
    outer = browser.find_element(By.ID, "fold-20")
    inner = browser.find_element(By.ID, "fold-10")
    assert not inner.is_displayed()  # among the outer fold's originals
    outer.find_element(By.CSS_SELECTOR, "details.fold-originals > summary").click()
    _until(browser, lambda d: inner.is_displayed())
    assert "6 turns summarized" in inner.text and not _turn(browser, "t0").is_displayed()
    browser.execute_script("arguments[0].scrollIntoView()", outer)
    _shot(browser, shots / f"reshape-nested-{width}.png")

    _open(browser, f"{proc.url}/ui/sessions/paged?from=200", "session")
    fold = browser.find_element(By.CSS_SELECTOR, "section.fold")
    assert "220 turns summarized" in fold.text
    fold.find_element(By.CSS_SELECTOR, "details.fold-originals > summary").click()
    earlier = fold.find_element(By.CSS_SELECTOR, "a.fold-earlier")
    _until(browser, lambda d: earlier.is_displayed())
    assert earlier.text == "turns 1–200 are on earlier pages"
    browser.execute_script("arguments[0].scrollIntoView()", fold)
    _shot(browser, shots / f"reshape-paged-{width}.png")
    earlier.click()
    _until(browser, lambda d: d.current_url.endswith("/ui/sessions/paged?from=0"))
