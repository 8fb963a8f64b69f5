"""The schedules page of the session browser."""

from __future__ import annotations

from ..model import Schedule, ScheduleFire
from ._html import Html, Node, el, ui_path
from ._ui_common import _badge, _clip, _duration, _facts, _session_link, _tab_page, _when

__all__ = [
    "render_schedules",
]

# -- schedules ----------------------------------------------------------------


def _every(s: Schedule) -> str:
    if s.cron:
        return f"cron {s.cron}" + (f" ({s.timezone})" if s.timezone else "")
    if s.interval_ms:
        return f"every {_duration(s.interval_ms)}"
    return "once"


def _fire(fire: ScheduleFire) -> Html:
    return el(
        "li",
        {"class": "fire"},
        _badge(fire.status),
        " fired ",
        _when(fire.fired_at, zone=True),
        " (due ",
        _when(fire.due_at, zone=True),
        ")",
        [" · ", _session_link(fire.session_id)] if fire.session_id else None,
        [
            " · ",
            el(
                "a",
                {"href": f"{ui_path('sessions', fire.session_id)}#run-{fire.run_id}"},
                f"run {fire.run_id}",
            ),
        ]
        if fire.session_id and fire.run_id
        else None,
        el("span", {"class": "run-error"}, f" {fire.error}") if fire.error else None,
    )


def render_schedules(schedules: list[tuple[Schedule, list[ScheduleFire]]] | None) -> Html:
    """Every schedule with its recent fires, newest first."""
    body: Node
    if schedules is None:
        body = el("p", {"class": "muted"}, "This store does not keep schedules.")
    elif not schedules:
        body = el("p", {"class": "empty"}, "No schedules.")
    else:
        body = [
            el(
                "article",
                {"class": "schedule", "data-schedule-id": s.id},
                el(
                    "h2",
                    None,
                    s.name or s.id,
                    " ",
                    el("span", {"class": "badge"}, "enabled" if s.enabled else "disabled"),
                ),
                _facts(
                    [
                        ("id", el("code", None, s.id)),
                        ("when", _every(s)),
                        ("next fire", _when(s.next_fire_at, zone=True)),
                        ("agent", s.agent_id or "–"),
                        (
                            "session",
                            _session_link(s.session_id) if s.session_id else "new each time",
                        ),
                        ("prompt", _clip(s.prompt, 300)),
                    ]
                ),
                el("h3", None, "Recent fires"),
                el("ul", {"class": "fires"}, [_fire(f) for f in fires])
                if fires
                else el("p", {"class": "muted"}, "Never fired."),
            )
            for s, fires in schedules
        ]
    return _tab_page(
        "schedules",
        "Schedules",
        body,
    )
