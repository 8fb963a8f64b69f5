"""Sessions written through the integrations, opened in the session browser (headless Chromium).

An openai-agents ``Runner`` conversation with a handoff and a pydantic-ai run
with a ``ModelRetry`` are stored in one SQLite file by the integrations
themselves, served by a real ``zidane-actors serve``: the browser shows each
run tree with its agents and tokens, and the failed or refused tool call
marked as an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server_e2e import ServerProcess
from test_ui_browser import _open, browser  # noqa: F401  (the module's browser fixture)

from zidane_actors.integrations import _shared

pytestmark = pytest.mark.skipif(
    not (Path("/usr/bin/chromedriver").exists() and Path("/usr/bin/chromium").exists()),
    reason="needs the Debian packages chromium and chromium-driver (.ci/run installs them)",
)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from agents import RunConfig, Runner
    from test_openai_agents import triage_to_billing
    from test_pydantic_ai import retrying_agent

    from zidane_actors.integrations.openai_agents import ZidaneSession
    from zidane_actors.integrations.pydantic_ai import append_messages_sync
    from zidane_actors.portal import start_host

    db = tmp_path_factory.mktemp("integrations-ui") / "sessions.db"
    session = ZidaneSession("agents-handoff", store=f"sqlite:{db}")
    config = RunConfig(tool_error_formatter=session.tool_error_formatter)
    Runner.run_sync(
        triage_to_billing(failing=True),
        "Weather?",
        session=session,
        hooks=session.hooks,
        run_config=config,
    )
    session.close()
    _shared.close_all()
    with start_host(f"sqlite:{db}") as host:
        chat = host.create_session(id="pydantic-retry")
        result = retrying_agent().run_sync("What does the note say?")
        append_messages_sync(chat, result.new_messages(), agent="notes")
    proc = ServerProcess(f"sqlite:{db}")
    proc.start()
    yield proc
    proc.stop()


def test_an_openai_agents_handoff_shows_as_a_run_tree(
    browser: WebDriver,  # noqa: F811
    server: ServerProcess,
) -> None:
    _open(browser, f"{server.url}/ui/sessions/agents-handoff", "session")
    tree = browser.find_element(By.CSS_SELECTOR, "ul.run-tree")
    (root,) = tree.find_elements(By.XPATH, "./li")
    (child,) = root.find_elements(By.XPATH, "./ul/li")
    root_line = root.find_element(By.CSS_SELECTOR, ".run-line").text
    child_line = child.find_element(By.CSS_SELECTOR, ".run-line").text
    assert "triage" in root_line and "completed" in root_line and "30 in / 7 out" in root_line
    assert "billing" in child_line and "110 in / 12 out" in child_line
    usages = [u.text for u in browser.find_elements(By.CSS_SELECTOR, ".usage")]
    assert [u.split(" · ")[0] for u in usages] == [
        "10 in / 3 out",
        "20 in / 4 out",
        "50 in / 7 out",
        "60 in / 5 out",
    ]
    found = browser.find_element(By.CSS_SELECTOR, ".tool-call[data-call-id=c2] .tool-result")
    assert "sunny in Paris" in found.text
    assert "is-error" not in str(found.get_attribute("class"))
    failed = browser.find_element(By.CSS_SELECTOR, ".tool-call[data-call-id=c3] .tool-result")
    assert "is-error" in str(failed.get_attribute("class"))
    assert "An error occurred while running the tool" in failed.text


def test_a_pydantic_ai_retry_shows_its_run_and_the_error(
    browser: WebDriver,  # noqa: F811
    server: ServerProcess,
) -> None:
    root = _open(browser, f"{server.url}/ui/sessions/pydantic-retry", "session")
    (run,) = browser.find_elements(By.CSS_SELECTOR, "ul.run-tree > li")
    line = run.find_element(By.CSS_SELECTOR, ".run-line").text
    assert "notes" in line and "completed" in line and "406 in / 40 out" in line
    refused = browser.find_element(By.CSS_SELECTOR, ".tool-call[data-call-id=c1] .tool-result")
    assert "is-error" in str(refused.get_attribute("class"))
    assert "too vague" in refused.text
    found = browser.find_element(By.CSS_SELECTOR, ".tool-call[data-call-id=c2] .tool-result")
    assert "is-error" not in str(found.get_attribute("class"))
    assert "Answer from the notes." in root.text  # the system prompt
    assert "not a draft, please" in root.text  # the validator's feedback
