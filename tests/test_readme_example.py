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


def test_the_embedded_default_loads_no_other_stores_driver(tmp_path: pathlib.Path) -> None:
    # psycopg and httpx are loaded by the first use of the PostgreSQL or remote store's
    # names, never by a program on the SQLite default; those names stay the same objects.
    import subprocess
    import sys

    script = """
import sys
import trio
import zidane_actors
from zidane_actors import open_session_host, open_sqlite_store
from zidane_actors.portal import start_host

async def main():
    async with open_sqlite_store("s.db") as store, open_session_host(store) as host:
        await host.create_session(id="one")

trio.run(main)
with start_host("sqlite:p.db") as host:
    host.create_session(id="two")
assert not {"psycopg", "httpx"} & set(sys.modules), sorted({"psycopg", "httpx"} & set(sys.modules))
from zidane_actors.stores import postgres, remote
assert zidane_actors.open_postgres_store is postgres.open_postgres_store
assert zidane_actors.stores.RemoteStore is remote.RemoteStore
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
