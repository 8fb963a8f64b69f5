"""The session list page of the session browser (filters, rows, pager)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ..model import SessionMetaRow
from ._html import Html, Node, el
from ._ui_common import (
    _badge,
    _clip,
    _cost,
    _count,
    _query,
    _session_link,
    _tab_page,
    _table,
    _when,
    session_title,
    shown_status,
)
from ._ui_reshape import lineage_mark
from ._ui_runs import RunTotals, failure_mark

__all__ = [
    "SessionsPage",
    "filter_form",
    "render_sessions",
]

# -- the session list ---------------------------------------------------------


@attrs.frozen
class SessionsPage:
    """One page of the session list and the filters that made it."""

    rows: tuple[SessionMetaRow, ...]
    has_next: bool
    page: int
    params: Mapping[str, str]
    now: int
    """Epoch ms the page is judged at (a ``running`` whose owner is gone shows as stale)."""
    scanned: int | None = None
    """Set when a filtered scan stopped after this many sessions, short of the page."""
    total: int | None = None
    """How many sessions match (from ``search_meta``); ``None`` when the store cannot count."""
    total_exact: bool = True
    """False when more than ``total`` match (the store stopped counting there)."""
    total_at_most: bool = False
    """``total`` is an upper bound: it holds scope sessions the list leaves out, not yet read."""
    page_size: int = 50
    totals: Mapping[str, RunTotals | None] = attrs.field(factory=dict)
    """The run totals of listed sessions (tokens, cost, failed runs), by id."""
    summary_query: str = ""
    """The list's filters as a query string, for its summary page link."""


def _list_url(params: Mapping[str, str], **changes: str | None) -> str:
    merged = {**params, **changes}
    query = _query({k: v for k, v in merged.items() if v is not None})
    return "/ui/" + (f"?{query}" if query else "")


def _choice(name: str, label: str, options: Sequence[tuple[str, str]], chosen: str | None) -> Html:
    return el(
        "label",
        None,
        label,
        el(
            "select",
            {"name": name},
            [el("option", {"value": v, "selected": v == chosen}, text) for v, text in options],
        ),
    )


def _check(name: str, label: str, params: Mapping[str, str]) -> Html:
    return el(
        "label",
        {"class": "check"},
        el("input", {"type": "checkbox", "name": name, "value": "1", "checked": name in params}),
        label,
    )


def filter_form(
    params: Mapping[str, str],
    statuses: Sequence[str],
    *,
    searchable: bool = False,
    action: str = "/ui/",
) -> Html:
    """The list's filters, sent to ``action`` (the list, or the summary over it)."""

    def field(name: str, label: str, placeholder: str, kind: str = "text") -> Html:
        return el(
            "label",
            None,
            label,
            el(
                "input",
                {
                    "type": "search" if name == "q" else kind,
                    "name": name,
                    "value": params.get(name, ""),
                    "placeholder": placeholder,
                },
            ),
        )

    status = params.get("status")
    return el(
        "form",
        {"class": "filters", "method": "get", "action": action, "role": "search"},
        field(
            "q", "Search", "words in messages, tools, titles, ids" if searchable else "title or id"
        ),
        field("agent", "Agent", "agent id"),
        field("project", "Project", "project root"),
        _check("untagged", "untagged only", params),
        el(
            "label",
            None,
            "Status",
            el(
                "select",
                {"name": "status"},
                el("option", {"value": ""}, "any"),
                [el("option", {"value": s, "selected": s == status}, s) for s in statuses],
            ),
        ),
        _choice(
            "dates",
            "Dates",
            [("updated", "updated"), ("created", "created")],
            params.get("dates", "updated"),
        ),
        field("from", "from", "YYYY-MM-DD", "date"),
        field("to", "to", "YYYY-MM-DD", "date"),
        _check("failed", "with failed runs", params),
        _check("scopes", "scope sessions too", params),
        _choice(
            "sort",
            "Sort",
            [("updated", "newest updated"), ("created", "newest created")],
            params.get("sort", "updated"),
        )
        if searchable and action == "/ui/"
        else None,
        el("button", {"type": "submit"}, "Filter"),
        el("a", {"href": action, "class": "clear"}, "Clear"),
    )


def _title_cell(sid: str, title: Node, mark: Node = None) -> Html:
    """A listed session's first cell: ``title`` linking to its page, its id (and ``mark``) below."""
    return el(
        "td", {"class": "title"}, _session_link(sid, title), el("div", {"class": "sid"}, sid, mark)
    )


def _corrupt_row(row: SessionMetaRow) -> Html:
    """A listed session whose stored header does not decode: named, marked, explained."""
    return el(
        "tr",
        {"class": "session-row corrupt", "data-session-id": row.id},
        _title_cell(row.id, el("span", {"class": "muted"}, "(unreadable)")),
        el("td", {"colspan": "2", "class": "wide corrupt-reason"}, _clip(row.corrupt or "", 300)),
        el("td", None, el("span", {"class": "badge status-error"}, "corrupt")),
        el("td", {"class": "num wide"}, "–"),
        el("td", {"class": "num wide"}, "–"),
        el("td", {"class": "num"}, "–"),
        el("td", {"class": "num"}, "–"),
        el("td", None, _when(row.updated_at)),
    )


def _session_row(
    row: SessionMetaRow, params: Mapping[str, str], now: int, totals: RunTotals | None
) -> Html:
    if row.corrupt is not None:
        return _corrupt_row(row)
    title = session_title(row.metadata, row.first_user_turn)
    agent: Node = (
        el("a", {"href": _list_url(params, agent=row.agent_id, page=None)}, row.agent_id)
        if row.agent_id is not None
        else "–"
    )
    project: Node
    if row.project_root is None:
        project = el(
            "a",
            {"href": _list_url(params, project=None, untagged="1", page=None), "class": "muted"},
            "untagged",
        )
    else:
        project = el(
            "a",
            {"href": _list_url(params, project=row.project_root, untagged=None, page=None)},
            row.project_root,
        )
    return el(
        "tr",
        {"class": "session-row", "data-session-id": row.id},
        _title_cell(
            row.id, title or el("span", {"class": "muted"}, "(untitled)"), lineage_mark(row)
        ),
        el("td", {"class": "wide"}, agent),
        el("td", {"class": "wide"}, project),
        el("td", None, _badge(shown_status(row, now)), " ", failure_mark(totals)),
        el("td", {"class": "num wide"}, _count(row.turn_count)),
        el("td", {"class": "num wide"}, _count(row.run_count)),
        el("td", {"class": "num tokens"}, _count(totals.tokens if totals else None)),
        el("td", {"class": "num cost"}, _cost(totals.cost if totals else None)),
        el("td", None, _when(row.updated_at)),
    )


def _page_numbers(current: int, last: int) -> list[int | None]:
    """Pages to link: the first, the last and two either side of ``current``; ``None`` is a gap."""
    shown = sorted({1, last, *range(max(1, current - 2), min(last, current + 2) + 1)})
    out: list[int | None] = []
    for n in shown:
        if out and n - (out[-1] or 0) > 1:
            out.append(None)
        out.append(n)
    return out


def _pager(page: SessionsPage) -> Html:
    prev = (
        el("a", {"href": _list_url(page.params, page=str(page.page - 1)), "rel": "prev"}, "← Newer")
        if page.page > 1
        else None
    )
    nxt = (
        el("a", {"href": _list_url(page.params, page=str(page.page + 1)), "rel": "next"}, "Older →")
        if page.has_next
        else None
    )
    if page.total is None:
        return el("nav", {"class": "pager"}, prev, el("span", None, f"Page {page.page}"), nxt)
    last = max(1, -(-page.total // page.page_size), page.page)
    numbers: list[Node] = []
    for n in _page_numbers(page.page, last):
        if n is None:
            numbers.append(el("span", {"class": "gap"}, "…"))
        elif n == page.page:
            numbers.append(el("span", {"class": "current", "aria-current": "page"}, str(n)))
        else:
            numbers.append(
                el(
                    "a",
                    {"href": _list_url(page.params, page=str(n)), "class": "page-number"},
                    str(n),
                )
            )
    if not page.total_exact and not page.total_at_most:
        numbers.append(el("span", {"class": "gap"}, "…"))
    count = f"{page.total:,}{'' if page.total_exact else '+'} session"
    count += "" if page.total == 1 and page.total_exact else "s"
    if page.total_at_most:
        count = f"at most {page.total:,} sessions"
    return el(
        "nav",
        {"class": "pager"},
        prev,
        el("span", {"class": "pages"}, numbers),
        nxt,
        el("span", {"class": "total"}, count),
    )


def render_sessions(
    page: SessionsPage, statuses: Sequence[str], *, searchable: bool = False
) -> Html:
    """The session list: filters, one page of rows, page links (numbered when counted)."""
    head = [
        "Title",
        "Agent",
        "Project",
        "Status",
        "Turns",
        "Runs",
        "Tokens",
        "Cost",
        "Updated (UTC)",
    ]
    wide = {"Agent", "Project", "Turns", "Runs"}  # left out on a narrow screen
    numeric = {"Turns", "Runs", "Tokens", "Cost"}

    def header(h: str) -> Html:
        classes = [c for c, on in (("wide", h in wide), ("num", h in numeric)) if on]
        return el("th", {"class": " ".join(classes) or None}, h)

    body: Node
    if page.rows:
        body = _table(
            {"class": "sessions"},
            [header(h) for h in head],
            [_session_row(r, page.params, page.now, page.totals.get(r.id)) for r in page.rows],
        )
    else:
        body = el("p", {"class": "empty"}, "No sessions match.")
    more: Node = None
    if page.scanned is not None:
        further = str(page.scanned * 4)
        more = el(
            "p",
            {"class": "scan-limit"},
            f"Searched the {page.scanned:,} most recently updated sessions only. ",
            el("a", {"href": _list_url(page.params, scan=further)}, f"Search {further} sessions"),
        )
    return _tab_page(
        "sessions",
        "Sessions",
        filter_form(page.params, statuses, searchable=searchable),
        el(
            "p",
            {"class": "summary-link"},
            el(
                "a",
                {"href": "/ui/summary" + (f"?{page.summary_query}" if page.summary_query else "")},
                "Summary of these sessions (runs, failures, tokens, cost per agent and day)",
            ),
        ),
        body,
        more,
        _pager(page),
    )
