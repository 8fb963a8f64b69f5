"""Operation histories of several processes on shared sessions, and their checker.

A history is a list of :class:`Event` values, written one JSON object a line by
:class:`Recorder`: every operation is an ``invoke`` event followed by its
completion, ``ok`` (applied, with the answer), ``fail`` (definitely not applied)
or ``info`` (unknown: it may or may not have been applied). Event times are
``time.monotonic_ns()``, one clock for every process of the machine, so the
real-time order of operations in different processes is known.

:func:`check` judges a history the way Jepsen's Elle judges its list-append
workload, extended with removals from the end. A session's turns are a list of
unique elements (turn ids) that only ever changes by appending elements at the
end and removing the last one; elements never move and are never re-added.
The operations (``f``):

- ``append``: value ``[x, ...]``, appended at the end (unconditional).
- ``read``: ok value ``[x, ...]``, the session's turns seen from ``source``
  (``store``: a read of the store; ``load``: a host's view right after
  ``load_session``, optionally with ``store_before``/``rev_before`` and
  ``store_after``/``rev_after``, store reads taken just before and after;
  ``append``: a host's view right after its append returned).
  A ``read`` of the store may also say what else it saw: ``rev`` (the store's
  ``rev``), ``agent_id`` and ``metadata``.
- ``rewrite``: value ``{"from": [...], "to": [...]}``, a write of the whole
  list computed from the view ``from`` (``set_turns`` + ``save``, a pop): it
  must apply only when the store holds exactly ``from``. With ``"rev": r``
  and ``"rev_at": t``: the store's ``rev`` read right after the view was
  taken, that read ending at ``t`` (the view reflects ``r`` or an older rev),
  so it must apply only while the store is still at ``r``.
- ``save``: value ``{"from": [...]}``, a save of a view whose turns did not
  change (only metadata did). It may apply over a stale view (a header save
  folds in what others wrote) but must leave the turns as the store holds
  them: what it erased shows as ``lost-append``, what it brought back as
  ``read-after-removal`` in later reads. With ``"meta": n``: it sets the
  metadata key named after its process to ``n``.
- ``agent``: value ``{"agent": a}``, ``set_agent_id(a)`` + ``save``; ``patch``:
  value ``{"key": k, "meta": n}``, ``patch_meta`` of one key. Each value is
  written once: these set *fields* (``agent_id``, ``metadata.KEY``).
- ``pop``: ok value the removed element (``None``: nothing to remove); it must
  remove the element that is last at that moment.
- ``claim`` (ok value ``True``/``False``) and ``release``: a run claim and its end.

The anomalies found (``Anomaly.kind``):

- ``duplicate-elements``: a read (or the final state) holds an element twice.
- ``garbage-read``: a read holds an element no one ever appended.
- ``aborted-read``: a read holds an element whose append definitely failed.
- ``future-read``: a read holds an element appended only after the read ended.
- ``incompatible-order``: two reads, or a read and the real-time order of two
  appends, disagree on the order of two elements (a cycle in the order).
- ``non-prefix-read``: a read misses an element that precedes one it holds
  and that no removal had taken away: while a session is only appended to,
  every read is a prefix of every later read.
- ``stale-read``: a read misses an element that was visible (acknowledged, or
  seen by a read) before the read began and that no removal could have taken.
- ``read-after-removal``: a read holds an element whose removal was
  acknowledged before the read began.
- ``lost-append``: an acknowledged append (or one a read saw) is missing from
  the final state and no removal that saw it took it away.
- ``double-removal``: two acknowledged removals took the same element.
- ``stale-write``: an acknowledged conditional write was computed from a view
  that was not the store at that moment (a ``rewrite``'s ``from`` misses or
  holds what the store did not, a pop took an element that was not last, or
  a ``rewrite`` computed from ``rev`` r began after the store was seen past r:
  a read answered a later rev, or an append or rewrite began after r was read
  and was acknowledged).
- ``lost-field``: a read of a field (the stored agent id or a metadata key)
  that began after a write of value v was acknowledged holds another value,
  and no write of that value may have come after v's (its write was
  acknowledged before v's began, or no one wrote it): a change a caller was
  told is saved was undone. (Holding a value whose write definitely failed is
  an ``aborted-read``; one no one wrote, a ``garbage-read``.)
- ``view-mismatch``: a ``load`` view differs from the store although the store's
  ``rev`` was the same before and after the load.
- ``double-claim``: two processes held a run claim of one session at once.
- ``bad-rewrite``: a ``rewrite`` whose ``to`` is not ``from`` with elements removed
  from its end and new ones appended (a malformed history).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import json
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["Anomaly", "Event", "Op", "Recorder", "check", "load_events", "pair"]

_END = 2**63  # the completion time of an operation that never completed


@dataclass(frozen=True)
class Event:
    """One line of a history."""

    process: str
    index: int
    """The operation's number in its process (an invoke and its completion share it)."""
    type: str
    """``invoke``, ``ok``, ``fail`` or ``info``."""
    f: str
    session: str
    value: Any = None
    time: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "process": self.process,
                "index": self.index,
                "type": self.type,
                "f": self.f,
                "session": self.session,
                "value": self.value,
                "time": self.time,
                **self.extra,
            }
        )

    @classmethod
    def from_json(cls, line: str) -> Event:
        raw = json.loads(line)
        keys = ("process", "index", "type", "f", "session", "value", "time")
        core = {key: raw.pop(key) for key in keys if key in raw}
        return cls(**core, extra=raw)


@dataclass(frozen=True)
class Op:
    """An invocation paired with its completion."""

    process: str
    index: int
    f: str
    session: str
    type: str
    """How it completed: ``ok``, ``fail`` or ``info`` (``info`` also when it never did)."""
    value: Any
    """The completion's value (the invocation's when the completion has none)."""
    invoked: int
    completed: int
    extra: Mapping[str, Any]

    def __str__(self) -> str:
        return f"{self.process}#{self.index} {self.f} {self.session} {self.type} {self.value!r}"


@dataclass(frozen=True)
class Anomaly:
    kind: str
    session: str
    detail: str


class Recorder:
    """Writes one process's events to a JSONL stream as they happen."""

    def __init__(self, process: str, out: TextIO, *, clock: Any = time.monotonic_ns) -> None:
        self.process = process
        self._out = out
        self._clock = clock
        self._next = 0
        self._open: dict[int, tuple[str, str]] = {}
        self.invoked: dict[int, int] = {}
        """Each operation's invocation time."""

    def now(self) -> int:
        """The recorder's clock now (the time of an event recorded now)."""
        when: int = self._clock()
        return when

    def _write(self, event: Event) -> None:
        self._out.write(event.to_json() + "\n")
        self._out.flush()

    def invoke(
        self, f: str, session: str, value: Any = None, *, at: int | None = None, **extra: Any
    ) -> int:
        """Record an invocation (at ``at``: when an earlier call began it); its index."""
        index = self._next
        self._next += 1
        self._open[index] = (f, session)
        when = self._clock() if at is None else at
        self.invoked[index] = when
        self._write(Event(self.process, index, "invoke", f, session, value, when, extra))
        return index

    def complete(self, index: int, type: str, value: Any = None, **extra: Any) -> None:
        f, session = self._open.pop(index)
        self._write(Event(self.process, index, type, f, session, value, self._clock(), extra))

    def ok(self, index: int, value: Any = None, **extra: Any) -> None:
        self.complete(index, "ok", value, **extra)

    def fail(self, index: int, value: Any = None, **extra: Any) -> None:
        self.complete(index, "fail", value, **extra)

    def info(self, index: int, value: Any = None, **extra: Any) -> None:
        self.complete(index, "info", value, **extra)


def load_events(paths: Iterable[Path]) -> list[Event]:
    """Every event of the JSONL files at ``paths`` (a torn last line is dropped)."""
    events: list[Event] = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                events.append(Event.from_json(line))
            except json.JSONDecodeError:
                continue
    return events


def pair(events: Iterable[Event]) -> list[Op]:
    """The operations of a history; an invocation with no completion is ``info``."""
    invokes: dict[tuple[str, int], Event] = {}
    done: dict[tuple[str, int], Event] = {}
    for event in events:
        key = (event.process, event.index)
        if event.type == "invoke":
            invokes[key] = event
        else:
            done[key] = event
    ops: list[Op] = []
    for key, inv in invokes.items():
        end = done.get(key)
        ops.append(
            Op(
                process=inv.process,
                index=inv.index,
                f=inv.f,
                session=inv.session,
                type="info" if end is None else end.type,
                value=inv.value if end is None or end.value is None else end.value,
                invoked=inv.time,
                completed=_END if end is None else end.time,
                extra={**inv.extra, **({} if end is None else end.extra)},
            )
        )
    ops.sort(key=lambda op: (op.invoked, op.process, op.index))
    return ops


@dataclass
class _Read:
    """A list the session held at some moment in ``[start, end]``."""

    elements: Sequence[str]
    start: int
    end: int
    op: Op | None
    what: str
    stale_kind: str = "stale-read"
    held: set[str] = field(default_factory=set)


@dataclass
class _Removal:
    element: str | None
    """``None``: an indeterminate pop, element unknown."""
    op: Op


def check(
    events: Iterable[Event],
    final: Mapping[str, Sequence[str]] | None = None,
    *,
    final_fields: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Anomaly]:
    """Every anomaly of the history (empty when it is consistent).

    ``final`` maps a session to the elements the store holds once every process
    stopped, ``final_fields`` to its fields then (``{"agent_id": ...}``); both are
    checked as reads taken after everything else.
    """
    ops = pair(events)
    end = max((max(op.invoked, op.completed % _END) for op in ops), default=0) + 1
    by_session: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_session[op.session].append(op)
    for session in final or {}:
        by_session.setdefault(session, [])
    anomalies: list[Anomaly] = []
    for session, session_ops in sorted(by_session.items()):
        last = None if final is None else final.get(session)
        anomalies.extend(_check_session(session, session_ops, last, end))
        anomalies.extend(_check_revs(session, session_ops))
        fields = None if final_fields is None else final_fields.get(session)
        anomalies.extend(_check_fields(session, session_ops, fields, end))
        anomalies.extend(_check_claims(session, session_ops))
    return anomalies


def _check_session(
    session: str, ops: list[Op], final: Sequence[str] | None, end: int
) -> list[Anomaly]:
    found: list[Anomaly] = []

    def report(kind: str, detail: str) -> None:
        found.append(Anomaly(kind, session, detail))

    appends: dict[str, Op] = {}
    for op in ops:
        if op.f == "append":
            added = list(op.value)
        elif op.f == "rewrite":
            added = [x for x in op.value["to"] if x not in op.value["from"]]
        else:
            continue
        for x in added:
            if x not in appends or appends[x].type == "fail":
                appends[x] = op

    reads: list[_Read] = []
    removals: list[_Removal] = []
    for op in ops:
        if op.type != "ok" and not (op.type == "info" and op.f in ("rewrite", "pop")):
            continue
        if op.f == "read":
            reads.append(_Read(op.value, op.invoked, op.completed, op, str(op)))
            rev = op.extra.get("rev_before")
            if rev is not None and rev == op.extra.get("rev_after"):
                store = op.extra.get("store_before")
                if store is not None and list(op.value) != list(store):
                    report("view-mismatch", f"{op}: the store held {store!r} at rev {rev}")
        elif op.f == "rewrite":
            base, to = op.value["from"], op.value["to"]
            if op.type == "ok":
                # Applied only if the store held ``from``: a read during the write.
                reads.append(_Read(base, op.invoked, op.completed, op, str(op), "stale-write"))
            removals.extend(_Removal(x, op) for x in base if x not in to)
            kept = [x for x in to if x in base]
            if list(to[: len(kept)]) != list(base[: len(kept)]):
                report("bad-rewrite", f"{op} does more than remove from and append to the end")
        elif op.f == "pop" and (op.type == "info" or op.value is not None):
            removals.append(_Removal(op.value if op.type == "ok" else None, op))
    if final is not None:
        reads.append(_Read(final, end, end, None, "the final state"))

    # Each read on its own. Reads by end: the elements appended before a read's end accumulate.
    appended = set(appends)  # set & set walks the smaller one, set & dict the dict
    failed = {x for x, op in appends.items() if op.type == "fail"}
    by_invoke = sorted(appends, key=lambda x: appends[x].invoked)
    begun: set[str] = set()
    k = 0
    for read in sorted(reads, key=lambda r: r.end):
        while k < len(by_invoke) and appends[by_invoke[k]].invoked <= read.end:
            begun.add(by_invoke[k])
            k += 1
        held = read.held = set(read.elements)
        if len(held) != len(read.elements):
            counts = collections.Counter(read.elements)
            for x in sorted(x for x, n in counts.items() if n > 1):
                report("duplicate-elements", f"{read.what} holds {x!r} {counts[x]} times")
        for x in sorted(held.difference(appends)):
            report("garbage-read", f"{read.what} holds {x!r}, never appended")
        for x in sorted(held & failed):
            report("aborted-read", f"{read.what} holds {x!r}, whose append failed: {appends[x]}")
        for x in sorted((held & appended).difference(begun)):
            report("future-read", f"{read.what} holds {x!r}, appended later by {appends[x]}")

    # The order of elements: consecutive pairs of every read, and appends in real-time order.
    elements = sorted(appends, key=lambda x: (appends[x].invoked, x))
    bit = {x: i for i, x in enumerate(elements)}
    pairs: set[tuple[str, str]] = set()
    for read in reads:
        pairs.update(itertools.pairwise(read.elements))
    preds: dict[str, set[str]] = {x: set() for x in elements}
    for a, b in pairs:
        if a != b and a in bit and b in bit:
            preds[b].add(a)
    acked = [x for x in elements if appends[x].type != "fail"]
    _real_time_edges(acked, appends, preds)
    ancestors = _ancestors(elements, preds)
    if ancestors is None:
        cycle = _cycle(elements, preds)
        report("incompatible-order", f"the reads and appends order {' < '.join(cycle)}")
        return found

    removal_of: dict[str, list[_Removal]] = defaultdict(list)
    unknown_pops = [r for r in removals if r.element is None]
    for removal in removals:
        if removal.element is not None:
            removal_of[removal.element].append(removal)

    # The earliest moment each element may have been removed (an indeterminate pop may
    # have taken any element).
    any_pop = min((r.op.invoked for r in unknown_pops), default=_END)
    first_removal = {x: any_pop for x in elements}
    for x, rs in removal_of.items():
        if x in first_removal:
            first_removal[x] = min(any_pop, *(r.op.invoked for r in rs))

    def removed_before(x: str, t: int) -> bool:
        return first_removal.get(x, any_pop) < t

    # When each element was first visible: its acknowledgement, or the end of a read holding it.
    visible: dict[str, int] = {}
    for x, op in appends.items():
        if op.type == "ok":
            visible[x] = op.completed
    for read in reads:
        if read.op is None or read.stale_kind != "stale-read":
            continue
        for x in read.elements:
            if x in bit and read.end < visible.get(x, _END):
                visible[x] = read.end

    # No gaps: what precedes an element read was read too, unless removed. Reads by
    # end, so the elements possibly removed before each read's end only accumulate.
    by_removal = sorted(elements, key=lambda x: first_removal[x])
    removed_mask = 0
    removed: set[str] = set()
    k = 0
    for read in sorted(reads, key=lambda r: r.end):
        while k < len(by_removal) and first_removal[by_removal[k]] < read.end:
            removed_mask |= 1 << bit[by_removal[k]]
            removed.add(by_removal[k])
            k += 1
        last = next((x for x in reversed(read.elements) if x in bit), None)
        if last is None:
            continue
        # The read's own pairs are edges: every other element it holds precedes its last
        # one, so it has no gap when it holds all of the last one's unremoved ancestors.
        before = ancestors[bit[last]] & ~removed_mask
        held = (read.held & appended).difference(removed)
        held.discard(last)
        if before.bit_count() == len(held):
            continue
        kind = "non-prefix-read" if read.stale_kind == "stale-read" else read.stale_kind
        for i in _bits(before):
            if elements[i] not in read.held:
                report(kind, f"{read.what} misses {elements[i]!r}, which precedes what it holds")

    # Real time: what was visible before a read began is in it, unless possibly removed
    # by its end (the final state's misses are lost appends, below). Reads by start; an
    # element leaves the candidates once it may have been removed before a read began.
    # And what was removed before a read began is not in it.
    by_visible = sorted(visible, key=lambda x: visible[x])
    by_removal = sorted(visible, key=lambda x: first_removal[x])
    removed_at = {
        x: min(r.op.completed for r in rs if r.op.type == "ok")
        for x, rs in removal_of.items()
        if any(r.op.type == "ok" for r in rs)
    }
    by_removed = sorted(removed_at, key=lambda x: removed_at[x])
    candidates: set[str] = set()
    gone: set[str] = set()
    k = j = g = 0
    for read in sorted(reads, key=lambda r: r.start):
        while g < len(by_removed) and removed_at[by_removed[g]] < read.start:
            gone.add(by_removed[g])
            g += 1
        for x in sorted(read.held & gone):
            report(
                "read-after-removal", f"{read.what} holds {x!r}, removed by {removal_of[x][0].op}"
            )
        if read.op is None:
            continue
        while k < len(by_visible) and visible[by_visible[k]] < read.start:
            candidates.add(by_visible[k])
            k += 1
        while j < len(by_removal) and first_removal[by_removal[j]] < read.start:
            candidates.discard(by_removal[j])
            j += 1
        for x in sorted(candidates - read.held, key=lambda x: visible[x]):
            if not removed_before(x, read.end):
                report(read.stale_kind, f"{read.what} misses {x!r}, visible since before it began")

    # Removals.
    for x, rs in removal_of.items():
        done = [r for r in rs if r.op.type == "ok"]
        if len(done) > 1:
            report("double-removal", f"{x!r} removed by {done[0].op} and {done[1].op}")
    for removal in removals:
        x, op = removal.element, removal.op
        if op.f != "pop" or op.type != "ok" or x is None:
            continue
        # A pop takes the last element: nothing certainly after it was in the store.
        for y, t in visible.items():
            if (
                y != x
                and ancestors[bit[y]] >> bit[x] & 1
                and t < op.invoked
                and not removed_before(y, op.completed)
            ):
                report("stale-write", f"{op} took {x!r} while {y!r} followed it")
    if final is not None:
        in_final = set(final)
        unexplained = len(unknown_pops)
        for x in acked:
            if x in visible and x not in in_final and x not in removal_of:
                if unexplained:
                    unexplained -= 1
                    continue
                report("lost-append", f"{appends[x]} is missing from the final state")
    return found


def _real_time_edges(
    acked: list[str], appends: Mapping[str, Op], preds: dict[str, set[str]]
) -> None:
    """Order appends by real time: x before y when x's append completed before y's began.

    Only the latest such x (those no other one followed in real time) are linked to
    y; the rest follow by transitivity. Appends overlap only as much as processes
    run at once, so this adds a few edges per element.
    """
    by_done = sorted(acked, key=lambda x: appends[x].completed)
    frontier: list[str] = []
    latest_start = -1
    k = 0
    for y in sorted(acked, key=lambda x: appends[x].invoked):
        began = appends[y].invoked
        grew = False
        while k < len(by_done) and appends[by_done[k]].completed < began:
            x = by_done[k]
            k += 1
            latest_start = max(latest_start, appends[x].invoked)
            frontier.append(x)
            grew = True
        if grew:
            frontier = [x for x in frontier if appends[x].completed >= latest_start]
        for x in frontier:
            if appends[x] is not appends[y]:
                preds[y].add(x)


def _ancestors(elements: list[str], preds: Mapping[str, set[str]]) -> list[int] | None:
    """Each element's transitive predecessors as a bit set (``None`` on a cycle)."""
    index = {x: i for i, x in enumerate(elements)}
    pending = {x: len(preds[x]) for x in elements}
    succs: dict[str, list[str]] = defaultdict(list)
    for x in elements:
        for p in preds[x]:
            succs[p].append(x)
    ready = [x for x in elements if pending[x] == 0]
    result = [0] * len(elements)
    visited = 0
    while ready:
        x = ready.pop()
        visited += 1
        mask = 0
        for p in preds[x]:
            mask |= result[index[p]] | (1 << index[p])
        result[index[x]] = mask
        for s in succs[x]:
            pending[s] -= 1
            if pending[s] == 0:
                ready.append(s)
    return result if visited == len(elements) else None


def _cycle(elements: list[str], preds: Mapping[str, set[str]]) -> list[str]:
    """One cycle of the order, for the report."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(x: str) -> list[str] | None:
        state[x] = 1
        stack.append(x)
        for p in sorted(preds[x]):
            if state.get(p) == 1:
                return [*stack[stack.index(p) :], p][::-1]
            if p not in state and (found := visit(p)) is not None:
                return found
        stack.pop()
        state[x] = 2
        return None

    for x in elements:
        if x not in state and (found := visit(x)) is not None:
            return found
    return []


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _check_revs(session: str, ops: list[Op]) -> list[Anomaly]:
    """``stale-write``: rewrites computed from ``rev`` r, acknowledged after the store passed r.

    ``rev`` only grows, so once a read answered a rev above r, or an append or a
    rewrite that began after r was read was acknowledged (each writes, moving
    the rev on), the store can never hold r again and must refuse the write.
    """
    seen: list[tuple[int, int, Op]] = []  # (when it was known, rev, by what)
    moved: list[tuple[int, int, Op]] = []  # (acknowledged, began, the write)
    for op in ops:
        if op.type != "ok":
            continue
        if op.f == "read":
            # A load's rev_before was read before it began, its rev_after before it ended.
            for key, at in (("rev", op.completed), ("rev_before", op.invoked)):
                rev = op.extra.get(key)
                if isinstance(rev, int):
                    seen.append((at, rev, op))
            rev = op.extra.get("rev_after")
            if isinstance(rev, int):
                seen.append((op.completed, rev, op))
        elif op.f == "append" or (op.f == "rewrite" and op.value["from"] != op.value["to"]):
            moved.append((op.completed, op.invoked, op))
    seen.sort(key=lambda s: s[0])
    moved.sort(key=lambda m: m[0])
    # Prefix maxima: the highest rev known, the latest begun write acknowledged, by each time.
    highest: list[tuple[int, Op]] = []
    for _, rev, op in seen:
        highest.append(max(highest[-1], (rev, op), key=lambda h: h[0]) if highest else (rev, op))
    latest: list[tuple[int, Op]] = []
    for _, began, op in moved:
        latest.append(max(latest[-1], (began, op), key=lambda h: h[0]) if latest else (began, op))
    seen_at = [s[0] for s in seen]
    moved_at = [m[0] for m in moved]
    found: list[Anomaly] = []
    for op in ops:
        if op.f != "rewrite" or op.type != "ok" or not isinstance(op.value.get("rev"), int):
            continue
        rev, rev_at = op.value["rev"], op.value.get("rev_at")
        k = bisect.bisect_left(seen_at, op.invoked)
        if k and highest[k - 1][0] > rev:
            later, by = highest[k - 1]
            found.append(
                Anomaly(
                    "stale-write",
                    session,
                    f"{op} was computed from rev {rev}, and {by} saw rev {later} before it began",
                )
            )
            continue
        k = bisect.bisect_left(moved_at, op.invoked)
        if isinstance(rev_at, int) and k and latest[k - 1][0] > rev_at:
            by = latest[k - 1][1]
            found.append(
                Anomaly(
                    "stale-write",
                    session,
                    f"{op} was computed from rev {rev}, and {by} wrote after that rev was "
                    "read and was acknowledged before it began",
                )
            )
    return found


def _field_write(op: Op) -> tuple[str, Any] | None:
    """The field an operation sets and the value it sets, if it sets one."""
    value = op.value if isinstance(op.value, dict) else {}
    if op.f == "agent" and "agent" in value:
        return "agent_id", value["agent"]
    if op.f == "save" and "meta" in value:
        return f"metadata.{op.process}", value["meta"]
    if op.f == "patch" and "meta" in value:
        return f"metadata.{value['key']}", value["meta"]
    return None


def _check_fields(
    session: str, ops: list[Op], final: Mapping[str, Any] | None, end: int
) -> list[Anomaly]:
    """``lost-field`` (and aborted or garbage reads) of fields set by ``agent``/``save``/``patch``.

    Each value of a field is written once. A read that began after a write of v
    was acknowledged may hold v or the value of a write that may have come
    after it: one not acknowledged before v's write began (nor definitely
    failed), begun before the read ended. ``None`` (no value) was never written.
    """
    writes: dict[str, list[Op]] = defaultdict(list)
    writer: dict[tuple[str, Any], Op] = {}
    for op in ops:
        written = _field_write(op)
        if written is not None:
            writes[written[0]].append(op)
            writer[written] = op
    if not writes:
        return []
    observed: list[tuple[str, Any, int, int, str]] = []  # field, value, start, end, what
    for op in ops:
        if op.f != "read" or op.type != "ok":
            continue
        if "agent_id" in op.extra and "agent_id" in writes:
            observed.append(("agent_id", op.extra["agent_id"], op.invoked, op.completed, str(op)))
        metadata = op.extra.get("metadata")
        if isinstance(metadata, dict):
            for name in writes:
                if name.startswith("metadata."):
                    key = name.removeprefix("metadata.")
                    observed.append((name, metadata.get(key), op.invoked, op.completed, str(op)))
    for name, value in (final or {}).items():
        if name in writes:
            observed.append((name, value, end, end, "the final state"))
    found: list[Anomaly] = []
    lost: set[tuple[str, int, str]] = set()  # each acknowledged write reported once
    for name, value, start, stop, what in sorted(observed, key=lambda o: o[2]):
        by = writer.get((name, value))
        if by is None and value is not None:
            found.append(
                Anomaly("garbage-read", session, f"{what} holds {name} {value!r}, never written")
            )
            continue
        if by is not None and by.type == "fail":
            found.append(
                Anomaly(
                    "aborted-read",
                    session,
                    f"{what} holds {name} {value!r}, whose write failed: {by}",
                )
            )
            continue
        for acked in writes[name]:
            if acked.type != "ok" or acked.completed >= start or acked is by:
                continue
            which = (name, acked.index, acked.process)
            if which in lost:
                continue
            if (
                by is not None
                and by.invoked < stop
                and (by.type == "info" or by.completed > acked.invoked)
            ):
                continue  # by may have come after acked
            lost.add(which)
            was = "no value" if value is None else f"{value!r}, written by {by}"
            found.append(
                Anomaly(
                    "lost-field",
                    session,
                    f"{acked} was acknowledged, then {what} holds {name} {was}",
                )
            )
    return found


def _check_claims(session: str, ops: list[Op]) -> list[Anomaly]:
    """Run claims held by two processes at once (definitely, by real time)."""
    held: list[tuple[int, int, Op]] = []
    releases: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f == "release":
            releases[op.process].append(op)
    for op in ops:
        if op.f == "claim" and op.type == "ok" and op.value is True:
            after = [r for r in releases[op.process] if r.invoked > op.completed]
            until = min((r.invoked for r in after), default=_END)
            held.append((op.completed, until, op))
    held.sort(key=lambda h: h[0])
    found: list[Anomaly] = []
    for i, (start, until, op) in enumerate(held):
        for other_start, other_until, other in held[i + 1 :]:
            if other_start >= until:
                break
            if other.process != op.process and start < other_until:
                found.append(Anomaly("double-claim", session, f"{op} and {other} overlap"))
    return found
