"""The README and docs/runtime.md examples run as written and print the turn count."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("doc", ["README.md", "docs/runtime.md"])
def test_doc_example_runs(
    doc: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = ROOT / doc
    example = re.search(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    assert example is not None, f"{doc} has no python example"
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # re-runnable
        exec(compile(example.group(1), str(path), "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out == "1\n" * 2
