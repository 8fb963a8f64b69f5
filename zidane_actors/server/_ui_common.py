"""Pieces every page of the session browser shares: dates, counts, badges, the nav."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlencode

from ..model import (
    SessionMetaRow,
    SessionTurn,
    TextBlock,
    encode,
    parse_json,
    shown_session_status,
)
from ._html import AttrValue, Html, Node, el, ui_path

__all__ = [
    "render_error",
    "session_title",
    "shown_status",
]


TITLE_CHARS: Final = 120


def session_title(metadata: Mapping[str, Any], first_user: SessionTurn | None) -> str:
    """``metadata.title``, else the first user turn's text on one line (may be empty)."""
    title = metadata.get("title")
    if isinstance(title, str) and title.strip():
        return title
    if first_user is not None:
        text = " ".join(b.text for b in first_user.content if isinstance(b, TextBlock))
        return " ".join(text.split())[:TITLE_CHARS]
    return ""


# -- small pieces -------------------------------------------------------------


def _when(ms: int | None, *, zone: bool = False) -> Html:
    """An epoch-ms time in UTC; ``zone`` says so where no column header does."""
    if ms is None:
        return Html("–")
    try:
        at = datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return el("span", None, str(ms))
    shown = at.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if zone else "")
    return el("time", {"datetime": at.isoformat()}, shown)


def _count(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def _cost(value: float | None) -> str:
    return "–" if value is None else f"${value:,.4f}"


def _duration(ms: float | None) -> str:
    if ms is None:
        return "–"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def shown_status(row: SessionMetaRow, now: int) -> str:
    """The status a reader should see: a stored ``running`` whose owner is gone is ``stale``
    (the model's one rule, :func:`~zidane_actors.model.shown_session_status`)."""
    return shown_session_status(row.status, row.run_owner, row.updated_at, now)


def _badge(status: str | None) -> Html:
    value = status or "idle"
    if value == "stale":
        title = "stored as running, but its owner is gone (the process exited or stopped writing)"
        return el("span", {"class": "badge status-stale", "title": title}, "stale (owner gone)")
    return el("span", {"class": f"badge status-{_token(value)}"}, value)


def _mark(text: str, title: str) -> Html:
    return el("span", {"class": "badge mark", "title": title}, text)


def _token(value: str) -> str:
    """``value`` reduced to a CSS class fragment."""
    return "".join(c if c.isascii() and c.isalnum() else "-" for c in value)[:40]


def _json_text(value: object) -> str:
    return json.dumps(parse_json(encode(value)), indent=2, ensure_ascii=False)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _session_link(sid: str, text: Node = None) -> Html:
    return el("a", {"href": ui_path("sessions", sid)}, text if text is not None else sid)


def _nav(current: str) -> Html:
    links = [
        ("sessions", "/ui/", "Sessions"),
        ("summary", "/ui/summary", "Summary"),
        ("schedules", "/ui/schedules", "Schedules"),
    ]
    return el(
        "nav",
        {"class": "tabs"},
        [
            el("a", {"href": href, "aria-current": "page" if key == current else None}, label)
            for key, href, label in links
        ],
    )


def render_error(status: int, message: str) -> Html:
    """An error fragment (the page shows it in place of the content)."""
    return el(
        "section",
        {"class": "page error", "data-status": status},
        _nav(""),
        el("h1", None, f"Error {status}"),
        el("p", None, message),
    )


def _query(params: Mapping[str, object]) -> str:
    """A URL query; a lone surrogate (a stored agent id may hold one) as its UTF-8 bytes."""
    return urlencode(params, errors="surrogatepass")


def _tab_page(name: str, title: str, *children: Node) -> Html:
    """A page under one of the nav's tabs: the nav (``name`` current), its title, ``children``."""
    return el(
        "section",
        {"class": "page", "data-page": name, "data-title": title},
        _nav(name),
        el("h1", None, title),
        *children,
    )


def _table(attrs: Mapping[str, AttrValue], head: Node, rows: Node) -> Html:
    """A table of one header row (``head``, its cells) and then ``rows``."""
    return el("table", attrs, el("thead", None, el("tr", None, head)), el("tbody", None, rows))


def _facts(items: Iterable[tuple[str, Node]]) -> Html:
    return el("dl", {"class": "facts"}, [(el("dt", None, k), el("dd", None, v)) for k, v in items])
