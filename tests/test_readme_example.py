"""The README / docs/runtime.md example runs as written and prints the turn count."""

from __future__ import annotations

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "runtime.md"


def test_runtime_doc_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    example = re.search(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert example is not None, "docs/runtime.md has no python example"
    exec(compile(example.group(1), str(DOC), "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out == "1\n"
