"""The README's portal, openai-agents and pydantic-ai examples, and docs/integrations.md's
google-adk example, run as written."""

from __future__ import annotations

import pathlib
import re

import pytest

from zidane_actors.integrations import _shared

ROOT = pathlib.Path(__file__).resolve().parent.parent

EXPECTED = {
    "From asyncio and blocking code": "1\n2\n",
    "openai-agents": "Green. 3\n",
    "pydantic-ai": "Hi again! 2\n",
}


def section_example(title: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example is not None, f"README section {title!r} has no python example"
    return example.group(1)


@pytest.mark.parametrize("title", list(EXPECTED))
def test_readme_integration_example_runs(
    title: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code = section_example(title)
    try:
        for _ in range(2):  # re-runnable: the second run prints what the first did
            exec(compile(code, f"README.md#{title}", "exec"), {"__name__": "__main__"})
    finally:
        _shared.close_all()
    out, err = capsys.readouterr()
    assert out == EXPECTED[title] * 2
    assert err == ""  # clean output: no warnings, no trace-export notice


def test_docs_google_adk_example_runs(
    capsys: pytest.CaptureFixture[str],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("google.adk", reason="google-adk is not installed (extra `adk`)")
    monkeypatch.chdir(tmp_path)
    title = "google-adk: `ZidaneSessionService`"
    doc = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    section = doc.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    examples = re.findall(r"```python\n(.*?)```", section, re.S)
    code = examples[-1]  # the first block is the signature
    try:
        for _ in range(2):  # re-runnable
            exec(compile(code, f"docs/integrations.md#{title}", "exec"), {"__name__": "__main__"})
    finally:
        _shared.close_all()
    assert capsys.readouterr().out == "Sunny in Paris.\nSunny in Paris. 4\n" * 2
