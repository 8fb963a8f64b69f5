"""What the browser shows of runs across pages: row totals, a run's timeline, the summary.

Everything here is computed from what the stores keep: run records
(status, tokens, cost, ``startedAt``/``endedAt``, and ``callTimes``: each
model and tool call's start and duration as its framework timed them, which
the doors record) and the ``createdAt`` of each turn. A run without
``callTimes`` is drawn from its turns: a model call spans from the turn
before its answer to the answer, a tool call from the answer that asked for
it to the turn holding its result. Those are the times the turns carry (the
framework's message timestamps for pydantic-ai, else when each was
stored): close to, never shorter than, the call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

import attrs

from ..model import SessionMetaRow, SessionRun, SessionTurn, ToolCallBlock, ToolResultBlock
from ._html import Html, Node, el
from ._ui_common import _cost, _count, _duration, _tab_page, _table, _token
from ._ui_session import _run_cost, _run_name, _run_tokens

__all__ = [
    "RunTotals",
    "Summary",
    "render_summary",
    "render_timeline",
    "run_totals",
]

TIMELINE_SPANS: Final = 200
"""Most calls one run's timeline draws (the first ones, in order)."""

CALL_TIMES: Final = "callTimes"
"""The run record's key for its calls' own times (``integrations._shared.CALL_TIMES_KEY``)."""


def is_failed_run(run: SessionRun) -> bool:
    """A run that ended in an error (``aborted`` is a stop, not a failure)."""
    return run.status == "error"


@attrs.define
class RunTotals:
    """Runs, failed runs, tokens (in + out) and cost (``None``: none recorded) of some
    runs: one session's (a list row) or one agent's or day's (the summary)."""

    runs: int = 0
    failed: int = 0
    tokens: int = 0
    cost: float | None = None

    def add(self, run: SessionRun) -> None:
        self.runs += 1
        self.failed += is_failed_run(run)
        tin, tout = _run_tokens(run)
        self.tokens += (tin or 0) + (tout or 0)
        spent = _run_cost(run)
        if spent is not None:
            self.cost = (self.cost or 0.0) + spent


def run_totals(runs: Iterable[SessionRun] | None) -> RunTotals | None:
    """The totals of ``runs``, subagents included (as the session page's total counts);
    ``None`` for runs that could not be read."""
    if runs is None:
        return None
    totals = RunTotals()
    for run in runs:
        totals.add(run)
    return totals


def failure_mark(totals: RunTotals | None) -> Html | None:
    """A list row's mark for a session holding failed runs."""
    if totals is None or not totals.failed:
        return None
    runs = "run" if totals.failed == 1 else "runs"
    return el(
        "span",
        {"class": "badge status-error failed-mark", "title": f"{totals.failed} failed {runs}"},
        f"✕ {totals.failed}",
    )


# -- one run's timeline -------------------------------------------------------


@attrs.frozen
class Span:
    """One call of a run: its kind, label, and start and end in epoch ms."""

    kind: str
    label: str
    start: float
    end: float
    failed: bool = False


def _ms(value: object) -> float | None:
    """A finite, non-negative number of ms (epoch or length), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def recorded_spans(run: SessionRun) -> list[Span] | None:
    """The calls ``run`` keeps under ``callTimes``, in start order (``None``: it keeps none).

    Entries that are not ``{kind: "model"|"tool", name, startedAt, durationMs}``
    are left out: the key is additional, and written by more than one door.
    """
    held = run.extra_fields.get(CALL_TIMES) if run.extra_fields else None
    if not isinstance(held, Sequence) or isinstance(held, str) or not held:
        return None
    spans: list[Span] = []
    for call in held:
        if not isinstance(call, Mapping):
            continue
        kind, name = call.get("kind"), call.get("name")
        start, took = _ms(call.get("startedAt")), _ms(call.get("durationMs"))
        if kind in ("model", "tool") and isinstance(name, str) and None not in (start, took):
            assert start is not None and took is not None
            spans.append(Span(kind, name, start, start + took, call.get("failed") is True))
    return sorted(spans, key=lambda s: s.start)


def _run_end(run: SessionRun) -> int | None:
    """When ``run`` ended: ``endedAt``, else its start plus ``wallMs``."""
    if run.ended_at is not None or run.wall_ms is None:
        return run.ended_at
    return run.started_at + int(run.wall_ms)


def run_spans(run: SessionRun, turns: Iterable[SessionTurn]) -> list[Span]:
    """The model and tool calls of ``run``: as its framework timed them, else from its turns."""
    recorded = recorded_spans(run)
    if recorded is not None:
        return recorded
    mine = [t for t in turns if t.run_id == run.id]
    results: dict[str, tuple[int, bool]] = {}
    for turn in mine:
        for block in turn.content:
            if isinstance(block, ToolResultBlock):
                results.setdefault(block.call_id, (turn.created_at, bool(block.is_error)))
    spans: list[Span] = []
    before = run.started_at
    for turn in mine:
        if turn.role == "assistant":
            model = turn.usage.model if turn.usage is not None else None
            spans.append(Span("model", model or "model call", before, turn.created_at))
            for block in turn.content:
                if isinstance(block, ToolCallBlock):
                    done, failed = results.get(block.id, (None, False))
                    end = done if done is not None else _run_end(run) or turn.created_at
                    spans.append(Span("tool", block.name, turn.created_at, end, failed))
        before = max(before, turn.created_at)
    return spans


def _span_ms(ms: float) -> str:
    """A call's start or length: ms below a second (calls are often that short)."""
    if ms >= 1000:
        return _duration(ms)
    return f"{ms:.1f} ms" if 0 < ms < 10 else f"{ms:.0f} ms"


def render_timeline(run: SessionRun | None, turns: Sequence[SessionTurn], runs: int) -> Html:
    """A waterfall of ``run``'s calls: one bar per call, placed by its start and length."""
    head = el("h2", None, "Timeline")
    if run is None:
        return el("section", {"class": "timeline"}, head, el("p", {"class": "muted"}, "No runs."))
    spans = run_spans(run, turns)
    shown = spans[:TIMELINE_SPANS]
    ended = _run_end(run)
    ends = [s.end for s in shown] + [ended or run.started_at]
    t0 = min([run.started_at, *(s.start for s in shown)])
    width = max(max(ends) - t0, 1)
    rows: list[Html] = []
    for span in shown:
        x = 1000 * (span.start - t0) / width
        w = max(1000 * (span.end - span.start) / width, 2.0)
        kind = f"span-{span.kind}" + (" span-failed" if span.failed else "")
        rows.append(
            el(
                "tr",
                {"class": f"span {kind}"},
                el(
                    "td",
                    {"class": "span-name"},
                    el("span", {"class": "kind"}, span.kind),
                    " ",
                    span.label,
                ),
                el("td", {"class": "num"}, f"+{_span_ms(span.start - t0)}"),
                el("td", {"class": "num"}, _span_ms(max(0.0, span.end - span.start))),
                el(
                    "td",
                    {"class": "span-bar"},
                    el(
                        "svg",
                        {
                            "xmlns": "http://www.w3.org/2000/svg",
                            "viewBox": "0 0 1000 10",
                            "preserveAspectRatio": "none",
                            "role": "img",
                            "aria-label": f"{span.label}: {_span_ms(span.end - span.start)}",
                        },
                        el(
                            "rect",
                            {
                                "class": "bar",
                                "x": f"{x:.1f}",
                                "y": 1,
                                "width": f"{w:.1f}",
                                "height": 8,
                            },
                        ),
                    ),
                ),
            )
        )
    note = f"Run {run.id} ({_run_name(run)}, {run.status}"
    note += f", {_span_ms(ended - run.started_at)})." if ended is not None else ")."
    measured = recorded_spans(run) is not None
    note += " Times as its framework measured each call." if measured else " Times of its turns."
    if runs > 1:
        note += " A run's “its turns” link shows its own."
    if len(spans) > len(shown):
        note += f" The first {len(shown)} of {len(spans)} calls."
    body: Node
    if rows:
        body = _table(
            {"class": "waterfall", "data-run-id": run.id},
            [
                el("th", None, "Call"),
                [el("th", {"class": "num"}, h) for h in ("Start", "Duration")],
                el("th", None),
            ],
            rows,
        )
    else:
        body = el("p", {"class": "muted"}, "No model or tool calls stored for this run.")
    return el("section", {"class": "timeline"}, head, el("p", {"class": "muted"}, note), body)


# -- the summary over sessions ------------------------------------------------


@attrs.define
class Summary:
    """The tallies per agent and per day (UTC) of the runs of the sessions read."""

    sessions: int = 0
    failed_sessions: int = 0
    unreadable: int = 0
    """Sessions whose runs did not decode (left out of the tallies)."""
    total: RunTotals = attrs.field(factory=RunTotals)
    agents: dict[str, RunTotals] = attrs.field(factory=dict)
    days: dict[str, RunTotals] = attrs.field(factory=dict)

    def add(self, row: SessionMetaRow, runs: Sequence[SessionRun] | None) -> None:
        self.sessions += 1
        if runs is None:
            self.unreadable += 1
            return
        self.failed_sessions += any(is_failed_run(r) for r in runs)
        for run in runs:
            agent = run.agent.id if run.agent is not None else row.agent_id
            day = datetime.fromtimestamp(run.started_at / 1000, UTC).strftime("%Y-%m-%d")
            for tally in (self.total, self.agents.setdefault(agent or "–", RunTotals())):
                tally.add(run)
            self.days.setdefault(day, RunTotals()).add(run)


def _tally_table(cls: str, key: str, tallies: Mapping[str, RunTotals], order: list[str]) -> Html:
    return _table(
        {"class": f"summary {cls}"},
        [
            el("th", None, key),
            [el("th", {"class": "num"}, h) for h in ("Runs", "Failed", "Tokens", "Cost")],
        ],
        [
            el(
                "tr",
                {"data-key": _token(name)},
                el("td", None, name),
                el("td", {"class": "num"}, _count(t.runs)),
                el("td", {"class": "num failed" if t.failed else "num"}, _count(t.failed)),
                el("td", {"class": "num"}, _count(t.tokens)),
                el("td", {"class": "num"}, _cost(t.cost)),
            )
            for name in order
            for t in (tallies[name],)
        ],
    )


def render_summary(
    summary: Summary, *, read: int, matched: int | None, more: bool, filters: Node, list_url: str
) -> Html:
    """The summary page: totals, then tallies per agent and per day, and how much was read."""
    total = summary.total
    scope = f"Summarised {summary.sessions:,} session{'' if summary.sessions == 1 else 's'}"
    if more:
        scope += f": the {read:,} most recently updated that match"
        scope += f" (of {matched:,})" if matched is not None else ""
        scope += "; the summary reads a bounded number of sessions."
    else:
        scope += ", every session that matches."
    if summary.unreadable:
        scope += f" {summary.unreadable:,} of them do not decode and are left out."
    agents = sorted(summary.agents, key=lambda a: (-summary.agents[a].runs, a))
    days = sorted(summary.days, reverse=True)
    return _tab_page(
        "summary",
        "Summary",
        filters,
        el(
            "p",
            {"class": "summary-scope muted"},
            scope,
            " ",
            el("a", {"href": list_url}, "List them"),
        ),
        el(
            "p",
            {"class": "totals"},
            el("strong", None, "Total: "),
            f"{total.runs:,} runs, {total.failed:,} failed",
            f" (in {summary.failed_sessions:,} sessions),",
            f" {total.tokens:,} tokens, {_cost(total.cost)}",
        ),
        el("h2", None, "Per agent"),
        _tally_table("per-agent", "Agent", summary.agents, agents)
        if agents
        else el("p", {"class": "muted"}, "No runs."),
        el("h2", None, "Per day (UTC, by run start)"),
        _tally_table("per-day", "Day", summary.days, days)
        if days
        else el("p", {"class": "muted"}, "No runs."),
    )
