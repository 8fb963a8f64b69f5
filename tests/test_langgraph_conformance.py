"""LangGraph's own checkpointer conformance suite against ``ZidaneSaver``.

``langgraph-checkpoint-conformance`` (PyPI) detects the capabilities a saver
implements (base: put, put_writes, get_tuple, list, delete_thread; extended:
copy_thread, delete_for_runs, prune) and runs its tests for each. Every
capability must be detected and pass, on memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from _pg import fresh_database

pytest.importorskip("langgraph.checkpoint.conformance", reason="extra `test` not installed")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from zidane_actors.integrations.langgraph import ZidaneSaver


@pytest.fixture(scope="module", params=["memory", "sqlite", "postgres"])
def store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A fresh store of each kind: ``memory:``, a new SQLite file, a new PostgreSQL database."""
    if request.param == "memory":
        yield "memory:"
        return
    if request.param == "sqlite":
        path: Path = tmp_path_factory.mktemp("langgraph") / "conformance.db"
        yield f"sqlite:{path}"
        return
    with fresh_database("test_lg") as url:
        yield url


def test_conformance_every_capability(store_url: str) -> None:
    """All eight capabilities detected, every test of each passing."""

    @checkpointer_test(name=f"ZidaneSaver {store_url.split(':')[0]}")
    async def saver() -> AsyncIterator[ZidaneSaver]:
        async with ZidaneSaver(store=store_url) as opened:
            yield opened

    report = asyncio.run(validate(saver))
    detected = {name for name, result in report.results.items() if result.detected}
    assert detected == {c.value for c in ALL_CAPABILITIES}
    failures = {
        name: result.failures for name, result in report.results.items() if not result.passed
    }
    assert not failures, failures
    assert report.passed_all()
    assert report.conformance_level() == "FULL"
    counts = {name: result.tests_passed for name, result in report.results.items()}
    assert all(count > 0 for count in counts.values()), counts
