"""The history checker on small hand-made histories: consistent ones pass, each anomaly is found."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from _history import Event, Recorder, check, load_events, pair


class History:
    """A hand-made history: each ``op`` is an invocation at ``start`` completing at ``end``."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._next: dict[str, int] = defaultdict(int)

    def op(
        self,
        process: str,
        f: str,
        start: int,
        end: int | None,
        value: Any = None,
        *,
        type: str = "ok",
        session: str = "s",
        **extra: Any,
    ) -> History:
        index = self._next[process]
        self._next[process] += 1
        invoked = value if f in ("append", "rewrite", "save") else None
        self.events.append(Event(process, index, "invoke", f, session, invoked, start))
        if end is not None:
            self.events.append(Event(process, index, type, f, session, value, end, extra))
        return self

    def kinds(self, final: dict[str, list[str]] | None = None) -> set[str]:
        return {anomaly.kind for anomaly in check(self.events, final)}


def appended(*elements: str) -> History:
    """``elements`` appended one after another by process ``p0``, each acknowledged."""
    h = History()
    for i, x in enumerate(elements):
        h.op("p0", "append", 10 * i, 10 * i + 5, [x])
    return h


# -- histories that must pass --------------------------------------------------


def test_serial_appends_and_reads() -> None:
    h = appended("a", "b")
    h.op("p1", "read", 30, 35, ["a", "b"], source="store")
    assert h.kinds({"s": ["a", "b"]}) == set()


def test_concurrent_appends_in_either_order() -> None:
    for order in (["a", "b"], ["b", "a"]):
        h = History()
        h.op("p0", "append", 0, 10, ["a"]).op("p1", "append", 1, 9, ["b"])
        h.op("p2", "read", 2, 3, order[:1]).op("p2", "read", 20, 21, order)
        assert h.kinds({"s": order}) == set(), order


def test_a_read_concurrent_with_an_append_may_miss_it() -> None:
    h = appended("a")
    h.op("p1", "append", 20, 30, ["b"]).op("p2", "read", 21, 22, ["a"])
    assert h.kinds({"s": ["a", "b"]}) == set()


def test_a_fresh_rewrite_pops_and_later_reads_lack_the_element() -> None:
    h = appended("a", "b")
    h.op("p1", "rewrite", 30, 35, {"from": ["a", "b"], "to": ["a"]})
    h.op("p2", "append", 40, 45, ["c"]).op("p2", "read", 50, 55, ["a", "c"])
    assert h.kinds({"s": ["a", "c"]}) == set()


def test_a_rewrite_that_appends_is_an_append() -> None:
    h = appended("a")
    h.op("p1", "rewrite", 20, 25, {"from": ["a"], "to": ["a", "r"]})
    h.op("p2", "read", 30, 35, ["a", "r"])
    assert h.kinds({"s": ["a", "r"]}) == set()


def test_a_stale_rewrite_that_failed_is_fine() -> None:
    h = appended("a", "b")
    h.op("p1", "rewrite", 30, 35, {"from": ["a"], "to": ["a", "x"]}, type="fail")
    assert h.kinds({"s": ["a", "b"]}) == set()


def test_pops_take_the_last_element() -> None:
    h = appended("a", "b")
    h.op("p1", "pop", 20, 25, "b").op("p2", "pop", 30, 35, "a").op("p1", "pop", 40, 45, None)
    h.op("p2", "read", 50, 55, [])
    assert h.kinds({"s": []}) == set()


def test_indeterminate_appends_appear_at_most_once() -> None:
    h = appended("a")
    h.op("p1", "append", 20, 25, ["x"], type="info").op("p1", "append", 30, None, ["y"])
    assert h.kinds({"s": ["a", "x"]}) == set()
    assert h.kinds({"s": ["a"]}) == set()


def test_an_indeterminate_pop_may_explain_one_missing_element() -> None:
    h = appended("a", "b")
    h.op("p1", "pop", 20, None)
    assert h.kinds({"s": ["a"]}) == set()
    assert h.kinds({"s": []}) == {"lost-append"}


def test_a_load_view_equal_to_an_unchanged_store() -> None:
    h = appended("a")
    h.op("p1", "read", 20, 25, ["a"], source="load", rev_before=3, rev_after=3, store_before=["a"])
    assert h.kinds({"s": ["a"]}) == set()


def test_claims_taken_in_turn() -> None:
    h = History()
    h.op("p0", "claim", 0, 5, True).op("p1", "claim", 6, 7, False).op("p0", "release", 10, 12)
    h.op("p1", "claim", 13, 15, True).op("p1", "release", 20, 21)
    assert h.kinds() == set()


def test_sessions_are_checked_apart() -> None:
    h = appended("a")
    h.op("p1", "append", 20, 25, ["b"], session="t").op("p1", "read", 30, 35, ["b"], session="t")
    assert h.kinds({"s": ["a"], "t": ["b"]}) == set()


# -- each anomaly ----------------------------------------------------------------


def test_duplicate_elements() -> None:
    assert appended("a").kinds({"s": ["a", "a"]}) == {"duplicate-elements"}


def test_garbage_read() -> None:
    h = appended("a").op("p1", "read", 20, 25, ["a", "zz"])
    assert h.kinds({"s": ["a"]}) == {"garbage-read"}


def test_aborted_read() -> None:
    h = appended("a").op("p1", "append", 20, 25, ["x"], type="fail")
    assert h.kinds({"s": ["a", "x"]}) == {"aborted-read"}


def test_a_failed_rewrite_leaves_no_element() -> None:
    h = appended("a")
    h.op("p1", "rewrite", 20, 25, {"from": ["a"], "to": ["a", "r"]}, type="fail")
    assert h.kinds({"s": ["a", "r"]}) == {"aborted-read"}


def test_future_read() -> None:
    h = appended("a").op("p1", "read", 6, 8, ["a", "b"]).op("p0", "append", 20, 25, ["b"])
    assert "future-read" in h.kinds({"s": ["a", "b"]})


def test_incompatible_order_between_reads() -> None:
    h = History()
    h.op("p0", "append", 0, 10, ["a"]).op("p1", "append", 0, 10, ["b"])
    h.op("p2", "read", 20, 25, ["a", "b"]).op("p2", "read", 30, 35, ["b", "a"])
    assert h.kinds() == {"incompatible-order"}


def test_incompatible_order_against_real_time() -> None:
    h = appended("a", "b")  # b appended after a was acknowledged
    assert h.kinds({"s": ["b", "a"]}) == {"incompatible-order"}


@pytest.mark.parametrize(
    "windows",
    [
        [(0, 10), (20, 30), (40, 50)],  # a < b < c: a before c only through b
        [(0, 10), (5, 30), (20, 40)],  # a < c; b overlaps both
    ],
)
def test_incompatible_order_against_transitive_real_time(windows: list[tuple[int, int]]) -> None:
    h = History()
    for process, x, (start, end) in zip(("p0", "p1", "p2"), "abc", windows, strict=True):
        h.op(process, "append", start, end, [x])
    h.op("p3", "read", 60, 65, ["c", "a"])
    assert "incompatible-order" in h.kinds()


def test_non_prefix_read() -> None:
    # A host's memory ['u0', 'b1'] while the store holds ['u0', 'a1', 'b1'].
    h = History()
    h.op("p0", "append", 0, 5, ["u0"]).op("p1", "append", 6, 14, ["a1"])
    h.op("p2", "append", 7, 12, ["b1"]).op("p2", "read", 13, 14, ["u0", "b1"], source="append")
    assert h.kinds({"s": ["u0", "a1", "b1"]}) == {"non-prefix-read"}


def test_stale_read() -> None:
    # A host serves its cached ['u0'] after a1 was acknowledged elsewhere.
    h = appended("u0").op("p1", "append", 20, 25, ["a1"])
    h.op("p2", "read", 30, 35, ["u0"], source="load")
    assert h.kinds({"s": ["u0", "a1"]}) == {"stale-read"}


def test_stale_read_after_another_read() -> None:
    h = History()
    h.op("p0", "append", 0, 100, ["a"], type="info").op("p1", "read", 10, 20, ["a"])
    h.op("p2", "read", 30, 40, [])
    assert h.kinds() == {"stale-read"}


def test_read_after_removal() -> None:
    h = appended("a", "b").op("p1", "pop", 20, 25, "b").op("p2", "read", 30, 35, ["a", "b"])
    assert h.kinds({"s": ["a"]}) == {"read-after-removal"}


def test_lost_append() -> None:
    assert appended("a", "b").kinds({"s": ["a"]}) == {"lost-append"}


def test_lost_append_never_read() -> None:
    h = History()
    h.op("p0", "append", 0, 10, ["a"]).op("p1", "append", 0, 10, ["b"])
    anomalies = check(h.events, {"s": ["b"]})
    assert {a.kind for a in anomalies} == {"lost-append"}
    assert any("'a'" in a.detail for a in anomalies if a.kind == "lost-append")


def test_double_removal() -> None:
    # Two integrations' pops, each from its own cached view, both take b.
    h = appended("a", "b").op("p1", "pop", 20, 25, "b").op("p2", "pop", 21, 26, "b")
    assert h.kinds({"s": ["a"]}) == {"double-removal"}


def test_stale_write_erasing_an_acknowledged_append() -> None:
    # The example: A rewrites [u0, a1, a2] from a view that lacks b2.
    h = appended("u0", "a1").op("p1", "append", 20, 25, ["b2"])
    h.op("p0", "rewrite", 30, 35, {"from": ["u0", "a1"], "to": ["u0", "a1", "a2"]})
    kinds = {"stale-write", "lost-append", "non-prefix-read"}
    assert h.kinds({"s": ["u0", "a1", "a2"]}) == kinds


def test_stale_write_concurrent_with_the_append_it_erases() -> None:
    # Real time cannot tell; the final state does: b2 vanished and no one saw it removed.
    h = appended("u0").op("p1", "append", 20, 30, ["b2"])
    h.op("p0", "rewrite", 21, 29, {"from": ["u0"], "to": ["u0", "a2"]})
    assert h.kinds({"s": ["u0", "a2"]}) == {"lost-append"}


def test_stale_write_resurrecting_a_removed_element() -> None:
    h = appended("a", "b").op("p1", "pop", 20, 25, "b")
    h.op("p0", "rewrite", 30, 35, {"from": ["a", "b"], "to": ["a", "b", "c"]})
    assert h.kinds({"s": ["a", "b", "c"]}) == {"read-after-removal"}


def test_stale_pop_takes_an_element_that_was_not_last() -> None:
    h = appended("a", "b").op("p1", "pop", 20, 25, "a")
    assert h.kinds({"s": ["b"]}) == {"stale-write"}


def test_a_header_save_from_a_stale_view_keeps_the_turns() -> None:
    h = appended("a", "b").op("p1", "save", 20, 25, {"from": ["a"]})
    assert h.kinds({"s": ["a", "b"]}) == set()


def test_a_save_that_erases_turns_its_view_lacked() -> None:
    h = appended("a", "b").op("p1", "save", 20, 25, {"from": ["a"]})
    h.op("p2", "read", 30, 35, ["a"])
    assert h.kinds({"s": ["a"]}) == {"lost-append", "stale-read"}


def test_view_mismatch() -> None:
    h = appended("a")
    h.op("p1", "read", 2, 25, [], source="load", rev_before=3, rev_after=3, store_before=["a"])
    assert h.kinds({"s": ["a"]}) == {"view-mismatch"}


def test_double_claim() -> None:
    h = History()
    h.op("p0", "claim", 0, 5, True).op("p1", "claim", 6, 7, True)
    h.op("p0", "release", 10, 12).op("p1", "release", 13, 14)
    assert h.kinds() == {"double-claim"}


def test_bad_rewrite() -> None:
    h = appended("a", "b")
    h.op("p1", "rewrite", 20, 25, {"from": ["a", "b"], "to": ["b"]})
    assert "bad-rewrite" in h.kinds({"s": ["b"]})


# -- recording -------------------------------------------------------------------


def test_recorder_round_trip(tmp_path: Path) -> None:
    ticks = iter(range(100))
    out = io.StringIO()
    recorder = Recorder("p0", out, clock=lambda: next(ticks))
    i = recorder.invoke("append", "s", ["a"])
    recorder.ok(i, ["a"])
    j = recorder.invoke("read", "s", source="store")
    recorder.ok(j, ["a"])
    recorder.invoke("append", "s", ["b"])  # never completes
    path = tmp_path / "p0.jsonl"
    path.write_text(out.getvalue() + '{"process": "p0", "ind')  # a torn last line
    events = load_events([path])
    ops = pair(events)
    assert [(op.f, op.type, op.value) for op in ops] == [
        ("append", "ok", ["a"]),
        ("read", "ok", ["a"]),
        ("append", "info", ["b"]),
    ]
    assert ops[1].extra == {"source": "store"}
    assert check(events, {"s": ["a"]}) == []


@pytest.mark.parametrize("final", [["a", "b"], ["a"]])
def test_an_unfinished_append_may_or_may_not_land(final: list[str]) -> None:
    h = appended("a").op("p1", "append", 20, None, ["b"])
    assert h.kinds({"s": final}) == set()
