"""``upsert_runs``: each incoming run replaces its id's record in place or is appended, the
order of the others kept, whichever path (one run, or several) computes it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from zidane_actors.model import SessionRun, upsert_runs

_IDS = st.sampled_from([f"r{i}" for i in range(12)])


def _run(run_id: str, n: int) -> SessionRun:
    return SessionRun(id=run_id, prompt=f"p{n}", started_at=n, status="running")


def _reference(
    stored: tuple[SessionRun, ...], incoming: list[SessionRun]
) -> tuple[SessionRun, ...]:
    out = list(stored)
    for run in incoming:
        at = next((i for i in range(len(out) - 1, -1, -1) if out[i].id == run.id), None)
        if at is None:
            out.append(run)
        else:
            out[at] = run
    return tuple(out)


@given(st.lists(_IDS, unique=True), st.lists(_IDS, min_size=1, max_size=4))
def test_each_run_replaces_its_record_or_is_appended(stored_ids: list[str], ids: list[str]) -> None:
    stored = tuple(_run(rid, i) for i, rid in enumerate(stored_ids))
    incoming = [_run(rid, 100 + i) for i, rid in enumerate(ids)]
    assert upsert_runs(stored, incoming) == _reference(stored, incoming)
    one_by_one = stored
    for run in incoming:
        one_by_one = upsert_runs(one_by_one, (run,))
    assert one_by_one == _reference(stored, incoming)
