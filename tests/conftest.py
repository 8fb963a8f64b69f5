"""Shared pytest configuration for the zidane_actors test suite."""

import os
import socket
from collections.abc import Generator

import pytest
from _pg import HOST, PORT
from _pytest.outcomes import OutcomeException
from hypothesis import settings

# The machine is shared and loaded: time budgets are the benchmarks' business, not the tests'.
# Every run draws the same examples (derandomize), so a red CI is a real regression, never
# a new random draw; `HYPOTHESIS_PROFILE=explore` searches afresh (and replays what it found).
settings.register_profile("zidane", deadline=None, derandomize=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "zidane"))


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Keep the reason of a skip or xfail raised inside a trio test.

    pytest-trio re-raises such an outcome as a bare ``pytest.skip()`` /
    ``pytest.xfail()`` from inside the trio run's exception group, so the
    summary would say only "Skipped"; the original outcome is in its context.
    """
    try:
        return (yield)
    except OutcomeException as exc:
        original = exc.__context__
        while isinstance(original, BaseExceptionGroup) and len(original.exceptions) == 1:
            original = original.exceptions[0]
        if not exc.msg and type(original) is type(exc):
            raise original from None
        raise


def _postgres_answers() -> bool:
    try:
        socket.create_connection((HOST, PORT), timeout=1).close()
    except OSError:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the PostgreSQL tests, saying why, where no PostgreSQL answers (see ``_pg.py``).

    ``ZIDANE_REQUIRE_POSTGRES=1`` (set by ``.ci/run``) makes them run, and fail, instead.
    """
    if os.environ.get("ZIDANE_REQUIRE_POSTGRES") or _postgres_answers():
        return
    skip = pytest.mark.skip(reason=f"no PostgreSQL answers on {HOST}:{PORT} (see the README)")
    for item in items:
        where = item.nodeid.lower()
        if "postgres" in where or "_pg" in where or "[pg" in where:
            item.add_marker(skip)
