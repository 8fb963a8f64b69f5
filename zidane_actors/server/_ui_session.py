"""One session's page of the session browser: transcript, runs, artifacts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import attrs
import msgspec

from ..model import (
    FileBlock,
    ImageBlock,
    NativeBlock,
    ReasoningBlock,
    SessionArtifact,
    SessionContentBlock,
    SessionMetaRow,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    call_input,
    parse_json,
    reasoning_text,
)
from ..wire import SYNTHETIC_TOOL_RESULT_PLACEHOLDER
from ._html import Html, Node, el, safe_image_src, safe_link, ui_fragment_path, ui_path
from ._markdown import render_markdown
from ._ui_common import (
    _badge,
    _clip,
    _cost,
    _count,
    _duration,
    _facts,
    _json_text,
    _mark,
    _nav,
    _query,
    _token,
    _when,
    session_title,
    shown_status,
)
from ._ui_reshape import Fold, fold_head, folded, page_folds

__all__ = [
    "SHOWN_CHARS",
    "SessionPage",
    "last_page_start",
    "long_text",
    "render_more",
    "render_session",
]

CHART_RUNS: Final = 60
_ORPHAN_MARKER: Final = "[Orphaned tool result removed:"
_HEALED_TURN_SUFFIX: Final = ".interrupted"

# -- one session --------------------------------------------------------------


@attrs.frozen
class SessionPage:
    """What one session page shows: header, one page of turns, runs, artifacts."""

    meta: SessionMetaRow
    turns: tuple[SessionTurn, ...]
    lookahead: tuple[SessionTurn, ...]
    start: int
    page_size: int
    runs: tuple[SessionRun, ...]
    artifacts: list[SessionArtifact] | None
    now: int
    """Epoch ms the page is judged at (a ``running`` whose owner is gone shows as stale)."""
    run_filter: str | None = None
    """Show only the turns of this run and its subagents (``?run=``)."""
    timeline: Html | None = None
    """The waterfall of one run's calls (the filtered run, else the newest)."""
    every: tuple[SessionTurn, ...] = ()
    """Every turn of the session when it was read whole (for the run timeline), else none."""
    lineage: Html | None = None
    """Its forks and branches (see :func:`render_lineage`)."""
    target: str | None = None
    """The id of the turn the page was opened at (``?turn=``), marked and scrolled to."""


def _image(block: ImageBlock | FileBlock, alt: str) -> Html | None:
    src = safe_image_src(block.media_type, block.data, block.url)
    if src is not None:
        return el("img", {"src": src, "alt": alt, "class": "inline-image"})
    if block.url is not None:
        link = safe_link(block.url)
        if link is not None:
            return el(
                "a",
                {"href": link, "rel": "noopener noreferrer nofollow", "target": "_blank"},
                f"external image: {_clip(block.url, 200)}",
            )
        return el("span", {"class": "muted"}, f"image URL not shown: {_clip(block.url, 200)}")
    if block.ref is not None:
        return el("span", {"class": "muted"}, f"image reference {block.ref}")
    return None


def _file(block: FileBlock) -> Html:
    label = block.name or "file"
    kind = f" ({block.media_type})" if block.media_type else ""
    parts: list[Node] = [el("div", {"class": "file-name"}, f"file {label}{kind}")]
    if block.media_type and block.media_type.lower().startswith("image/"):
        parts.append(_image(block, label))
    elif block.url is not None:
        link = safe_link(block.url)
        parts.append(
            el("a", {"href": link, "rel": "noopener noreferrer nofollow"}, block.url)
            if link
            else el("code", None, block.url)
        )
    if block.text is not None:
        parts.append(el("pre", None, block.text))
    if block.ref is not None:
        parts.append(el("div", {"class": "muted"}, f"reference {block.ref}"))
    return el("div", {"class": "block file"}, parts)


def _is_synthetic(text: str) -> bool:
    return text.startswith(SYNTHETIC_TOOL_RESULT_PLACEHOLDER)


SHOWN_CHARS: Final = 32_768
"""Most characters of one text, tool input or tool output a page sends; "show all" fetches more."""


@attrs.frozen
class _Where:
    """Where a block sits: its session, turn index and index in the turn (for "show all")."""

    session_id: str
    turn: int
    block: int
    summary: int | None = None
    """The index of the summary turn in the compaction marker at ``turn``, if it is one."""

    def more(self, **query: int) -> str:
        at = {} if self.summary is None else {"summary": self.summary}
        params = "&".join(f"{k}={v}" for k, v in {**at, "block": self.block, **query}.items())
        turn = ui_fragment_path("sessions", self.session_id, "turns", str(self.turn))
        return f"{turn}/more?{params}"


def _show_all(text: str, where: _Where | None, **query: int) -> Node:
    """A "show all" link for a text cut at :data:`SHOWN_CHARS`, or nothing."""
    if len(text) <= SHOWN_CHARS or where is None:
        return None
    rest = len(text) - SHOWN_CHARS
    return el(
        "a",
        {
            "class": "show-all",
            "href": "#",
            "data-more": where.more(**query, **{"from": SHOWN_CHARS}),
        },
        f"show all ({rest:,} more characters)",
    )


def _pretty_json(text: str) -> str:
    """``text`` indented when it is JSON and stays within :data:`SHOWN_CHARS`, else as is."""
    try:
        pretty = _json_text(parse_json(text))
    except (msgspec.DecodeError, RecursionError, TypeError):
        return text
    return pretty if len(pretty) <= SHOWN_CHARS else text


def _pre(text: str, where: _Where | None, cls: str | None = None, **query: int) -> Html:
    """Preformatted text, JSON pretty-printed when it is an object or array, capped."""
    if len(text) <= SHOWN_CHARS and text[:1] in ("{", "[") and text.rstrip()[-1:] in ("}", "]"):
        text = _pretty_json(text)
    return el(
        "div",
        {"class": "capped"},
        el("pre", {"class": cls} if cls else None, text[:SHOWN_CHARS]),
        _show_all(text, where, **query),
    )


def _text(text: str, where: _Where | None) -> Html:
    """A text block: Markdown, safely rendered; a long one shows its start and a link."""
    return el(
        "div",
        {"class": "markdown"},
        render_markdown(text[:SHOWN_CHARS]),
        _show_all(text, where),
    )


def long_text(turn: SessionTurn, block: int, *, part: int | None, tool_input: bool) -> str | None:
    """The whole text a capped view of ``turn.content[block]`` cut (``None``: none there)."""
    if block >= len(turn.content):
        return None
    found = turn.content[block]
    if isinstance(found, TextBlock) and part is None and not tool_input:
        return found.text
    if isinstance(found, ToolCallBlock) and tool_input:
        return _json_text(call_input(found))
    if isinstance(found, ToolResultBlock) and not tool_input:
        if part is None:
            return found.output if isinstance(found.output, str) else None
        if not isinstance(found.output, str) and part < len(found.output):
            piece = found.output[part]
            return piece.text if isinstance(piece, TextBlock) else None
    return None


def render_more(text: str, start: int, size: int, path: str, query: Mapping[str, str]) -> Html:
    """``text[start:start + size]`` as preformatted text, and a link to what follows."""
    end = start + size
    more: Node = None
    if end < len(text):
        more = el(
            "a",
            {
                "class": "show-all",
                "href": "#",
                "data-more": f"{path}?{_query({**query, 'from': end})}",
            },
            f"show more ({len(text) - end:,} more characters)",
        )
    return el("div", {"class": "more"}, el("pre", None, text[start:end]), more)


def _result_text(block: ToolResultBlock) -> str:
    if isinstance(block.output, str):
        return block.output
    return "".join(p.text or "" for p in block.output if isinstance(p, TextBlock | FileBlock))


def _tool_result(block: ToolResultBlock, where: _Where | None, *, standalone: bool) -> Html:
    text = _result_text(block)
    marks: list[Node] = []
    if _is_synthetic(text):
        marks.append(_mark("synthetic", "fabricated: no real result was recorded"))
    if text.startswith(_ORPHAN_MARKER):
        marks.append(_mark("healed", "replaced by the pairing heal"))
    if block.is_error:
        marks.append(_mark("error", "the tool reported an error"))
    body: list[Node] = []
    if isinstance(block.output, str):
        body.append(_pre(block.output, where))
    else:
        for p, part in enumerate(block.output):
            if isinstance(part, TextBlock):
                body.append(_pre(part.text, where, part=p))
            elif isinstance(part, ImageBlock):
                body.append(_image(part, "tool result image"))
            elif isinstance(part, NativeBlock):
                body.append(_native(part))
            else:
                body.append(_file(part))
    head = "result" if not standalone else f"result of call {block.call_id}"
    return el(
        "div",
        {
            "class": "block tool-result" + (" is-error" if block.is_error else ""),
            "data-call-id": block.call_id,
        },
        el("div", {"class": "block-head"}, f"↳ {head}", marks),
        body,
    )


def _name_and_id(name: str, id: str) -> list[Node]:
    """A call's or a run's name in bold, then its id, muted."""
    return [el("strong", None, name), " ", el("code", {"class": "muted"}, id)]


def _tool_call(
    block: ToolCallBlock,
    where: _Where | None,
    result: tuple[ToolResultBlock, _Where | None] | None,
    running: bool,
    started: Sequence[SessionRun] = (),
) -> Html:
    after: Node
    if result is not None:
        after = _tool_result(result[0], result[1], standalone=False)
    else:
        after = el(
            "div",
            {"class": "block tool-result pending"},
            "no result yet" if running else "no result on this page",
        )
    return el(
        "div",
        {"class": "block tool-call", "id": f"call-{block.id}", "data-call-id": block.id},
        el(
            "div",
            {"class": "block-head"},
            "call ",
            _name_and_id(block.name, block.id),
            [
                [" → ", el("a", {"href": f"#run-{run.id}", "class": "subrun"}, _run_name(run))]
                for run in started
            ],
        ),
        _pre(_json_text(call_input(block)), where, "tool-input", input=1),
        after,
    )


def _reasoning(block: ReasoningBlock) -> Html:
    summary = "Reasoning"
    text = reasoning_text(block)
    if block.redacted_data is not None and not text:
        summary = "Reasoning (redacted)"
    return el(
        "details",
        {"class": "block reasoning"},
        el("summary", None, summary),
        el("pre", None, text) if text else None,
    )


def _native(block: NativeBlock) -> Html:
    """A provider-native block (a server tool's call or result...): its kind, JSON collapsed."""
    kind = block.data.get("type")
    label = f"{block.provider} {kind}" if isinstance(kind, str) else block.provider
    return el(
        "details",
        {"class": "block native"},
        el("summary", None, f"Provider block: {label}"),
        el("pre", None, _json_text(block.data)),
    )


@attrs.frozen
class _Context:
    """What rendering one page's turns needs besides the turns."""

    results: Mapping[str, tuple[ToolResultBlock, _Where]]
    calls_here: set[str]
    running: bool
    runs: Mapping[str, SessionRun]
    started_by_call: Mapping[str, Sequence[SessionRun]]
    target: str | None = None


def _block(block: SessionContentBlock, where: _Where, ctx: _Context) -> Node:
    if isinstance(block, TextBlock):
        if block.text.startswith(_ORPHAN_MARKER):
            marks = _mark("healed", "replaced by the pairing heal")
            return el("div", {"class": "block text"}, marks, block.text)
        return el("div", {"class": "block text"}, _text(block.text, where))
    if isinstance(block, ToolCallBlock):
        started = ctx.started_by_call.get(block.id, ())
        return _tool_call(block, where, ctx.results.get(block.id), ctx.running, started)
    if isinstance(block, ToolResultBlock):
        if block.call_id in ctx.calls_here:
            return None  # shown under its call
        return _tool_result(block, where, standalone=True)
    if isinstance(block, ReasoningBlock):
        return _reasoning(block)
    if isinstance(block, ImageBlock):
        return el("div", {"class": "block image"}, _image(block, "image"))
    if isinstance(block, NativeBlock):
        return _native(block)
    return _file(block)


def _turn(turn: SessionTurn, where: _Where, ctx: _Context) -> Html:
    index = where.turn
    anchor = f"turn-{index}" if where.summary is None else f"turn-{index}-summary-{where.summary}"
    marks: list[Node] = []
    meta = turn.metadata or {}
    if turn.id.endswith(_HEALED_TURN_SUFFIX) or meta.get("synthetic") is True:
        marks.append(_mark("synthetic", "written by the runtime, not by the model or the user"))
    usage: Node = None
    if turn.usage is not None:
        u = turn.usage
        bits = [f"{_count(u.input)} in / {_count(u.output)} out"]
        if u.cost is not None:
            bits.append(_cost(u.cost))
        if u.model:
            bits.append(u.model)
        usage = el("span", {"class": "usage"}, " · ".join(bits))
    run: Node = None
    if turn.run_id is not None:
        owner = ctx.runs.get(turn.run_id)
        run = [
            el("a", {"href": f"#run-{turn.run_id}", "class": "run-link"}, f"run {turn.run_id}"),
            el("span", {"class": "agent"}, _run_name(owner)) if owner is not None else None,
        ]
    blocks = [_block(b, attrs.evolve(where, block=k), ctx) for k, b in enumerate(turn.content)]
    if turn.content and not any(b is not None for b in blocks) and not marks:
        # Only tool results, each shown under its call: an anchor, no empty card.
        return el("span", {"class": "turn-folded", "id": anchor, "data-turn-id": turn.id})
    cls = f"turn role-{_token(turn.role)}" + (" target" if turn.id == ctx.target else "")
    return el(
        "article",
        {"class": cls, "id": anchor, "data-turn-id": turn.id},
        el(
            "header",
            None,
            el("span", {"class": "role"}, turn.role),
            el(
                "span",
                {"class": "muted"},
                f"#{index + 1}" if where.summary is None else f"summary {where.summary + 1}",
            ),
            _when(turn.created_at),
            run,
            usage,
            marks,
        ),
        blocks,
    )


def last_page_start(total: int, size: int) -> int:
    """Index of the first turn of the last page when pages start at multiples of ``size``."""
    return max(0, (total - 1) // size * size) if total else 0


def _turn_pager(page: SessionPage) -> Html:
    total = page.meta.turn_count
    sid = page.meta.id
    size = page.page_size

    def link(start: int, label: str, rel: str) -> Html:
        return el("a", {"href": f"{ui_path('sessions', sid)}?from={start}", "rel": rel}, label)

    shown_to = page.start + len(page.turns)
    last_start = last_page_start(total, size)
    return el(
        "nav",
        {"class": "pager"},
        link(0, "⇤ First", "first") if page.start > 0 else None,
        link(max(0, page.start - size), "← Earlier", "prev") if page.start > 0 else None,
        el(
            "span",
            {"class": "range"},
            f"turns {page.start + 1 if page.turns else page.start}–{shown_to} of {total:,}",
        ),
        link(shown_to, "Later →", "next") if shown_to < total else None,
        link(last_start, "Last ⇥", "last")
        if shown_to < total and last_start > page.start
        else None,
    )


def _subtree(runs: Sequence[SessionRun], root: str) -> set[str]:
    """``root`` and every run below it (by ``parentRunId``), cycles ignored."""
    children: dict[str, list[str]] = {}
    for run in runs:
        if run.parent_run_id is not None:
            children.setdefault(run.parent_run_id, []).append(run.id)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _context(
    page: SessionPage,
    turns: Sequence[SessionTurn],
    where: Sequence[_Where],
    shown: int,
    running: bool,
) -> _Context:
    """What drawing ``turns`` needs: their results by call (``where`` each turn is),
    the calls of the first ``shown`` of them, the runs and what each call started."""
    results: dict[str, tuple[ToolResultBlock, _Where]] = {}
    for turn, at in zip(turns, where, strict=True):
        for k, block in enumerate(turn.content):
            if isinstance(block, ToolResultBlock):
                results.setdefault(block.call_id, (block, attrs.evolve(at, block=k)))
    started: dict[str, list[SessionRun]] = {}
    for run in page.runs:
        if run.parent_call_id is not None:
            started.setdefault(run.parent_call_id, []).append(run)
    return _Context(
        results=results,
        calls_here={b.id for t in turns[:shown] for b in t.content if isinstance(b, ToolCallBlock)},
        running=running,
        runs={r.id: r for r in page.runs},
        started_by_call=started,
        target=page.target,
    )


def _fold(page: SessionPage, fold: Fold, originals: Sequence[Node] | None, running: bool) -> Html:
    """A compaction's fold: its count, its summary turns, the original turns one click away."""
    sid = page.meta.id
    summary = fold.compaction.summary
    where = [_Where(sid, fold.index, 0, summary=j) for j in range(len(summary))]
    ctx = _context(page, summary, where, len(summary), running)
    summarized = fold.summarized
    before = page.start if summarized is None else min(page.start, summarized)
    label = "the original turns" if summarized is None else f"the {summarized:,} original turns"
    earlier: Node = None
    if before:
        earlier = el(
            "a",
            {"href": f"{ui_path('sessions', sid)}?from=0", "class": "fold-earlier"},
            f"turns 1–{before:,} are on earlier pages"
            if originals is not None
            else f"{label[0].upper()}{label[1:]}, on earlier pages →",
        )
    body: Node
    if originals is None:
        body = el("p", {"class": "fold-originals-link"}, earlier)
    else:
        body = el(
            "details",
            {"class": "fold-originals"},
            el("summary", None, f"Show {label}"),
            el("p", {"class": "fold-note"}, earlier) if earlier is not None else None,
            originals,
        )
    return el(
        "section",
        {"class": "fold", "id": f"fold-{fold.index}", "data-fold-of": fold.marker.id},
        el(
            "header",
            {"class": "fold-head"},
            el("strong", None, fold_head(fold)),
            el("span", {"class": "muted"}, " · compacted "),
            _when(fold.marker.created_at),
            el("span", {"class": "muted"}, " · "),
            el("a", {"href": f"#turn-{fold.index}"}, f"marker #{fold.index + 1}"),
        ),
        el(
            "div",
            {"class": "fold-summary"},
            el(
                "p",
                {"class": "fold-label"},
                f"What the model reads instead ({len(summary):,} summary "
                f"turn{'s' if len(summary) != 1 else ''}):",
            ),
            [_turn(t, w, ctx) for t, w in zip(summary, where, strict=True)],
        ),
        body,
    )


def _marker(index: int, turn: SessionTurn, fold: Fold) -> Html:
    """A compaction marker where it stands: a line pointing at its fold."""
    count = "" if fold.summarized is None else f" for turns 1–{fold.summarized:,}"
    return el(
        "div",
        {"class": "turn-compaction", "id": f"turn-{index}", "data-turn-id": turn.id},
        "⤴ Compaction recorded here (",
        el("span", {"class": "muted"}, f"#{index + 1}"),
        "): ",
        el("a", {"href": f"#fold-{index}"}, "its summary"),
        f" stands{count}.",
    )


def _transcript(page: SessionPage, running: bool) -> Html:
    sid = page.meta.id
    turns = (*page.turns, *page.lookahead)
    where = [_Where(sid, page.start + i, 0) for i in range(len(turns))]
    ctx = _context(page, turns, where, len(page.turns), running)
    shown = [(page.start + i, t) for i, t in enumerate(page.turns)]
    notice: Node = None
    if page.run_filter is not None:
        keep = _subtree(page.runs, page.run_filter)
        shown = [(i, t) for i, t in shown if t.run_id in keep]
        notice = el(
            "p",
            {"class": "run-filter-notice"},
            f"Showing the turns of run {page.run_filter} and its subagents on this page. ",
            el("a", {"href": f"{ui_path('sessions', sid)}?from={page.start}"}, "Show every turn"),
        )
    read = enumerate(page.every) if page.every else enumerate(page.turns, page.start)
    folds = page_folds(shown, read, whole=bool(page.every) or page.start == 0)
    return el(
        "section",
        {"class": "transcript"},
        el("h2", None, "Transcript"),
        notice,
        _turn_pager(page),
        folded(
            shown,
            folds,
            lambda i, t: (
                _marker(i, t, folds[i]) if i in folds else _turn(t, where[i - page.start], ctx)
            ),
            lambda fold, originals: _fold(page, fold, originals, running),
        ),
        el("p", {"class": "empty"}, "No turns on this page.") if not shown else None,
        _turn_pager(page) if len(shown) > 10 else None,
    )


def _run_tokens(run: SessionRun) -> tuple[int | None, int | None]:
    total = run.total_usage
    tin = run.tokens_in if run.tokens_in is not None else (total.input if total else None)
    tout = run.tokens_out if run.tokens_out is not None else (total.output if total else None)
    return tin, tout


def _run_cost(run: SessionRun) -> float | None:
    if run.cost is not None:
        return run.cost
    return run.total_usage.cost if run.total_usage is not None else None


def _run_duration(run: SessionRun) -> str:
    if run.ended_at is not None:
        return _duration(max(0, run.ended_at - run.started_at))
    if run.wall_ms is not None:
        return _duration(run.wall_ms)
    return "running" if run.status == "running" else "–"


def _run_name(run: SessionRun) -> str:
    if run.label:
        return run.label
    if run.agent is not None and run.agent.label:
        return run.agent.label
    return "subagent" if run.parent_run_id else "run"


def _run_item(
    sid: str,
    run: SessionRun,
    children: Mapping[str, list[SessionRun]],
    resumed_by: Mapping[str, list[SessionRun]],
    seen: set[str],
) -> Html:
    seen.add(run.id)
    tin, tout = _run_tokens(run)
    resume: list[Node] = []
    if run.resumed_from_run_id is not None:
        resume.append(
            el(
                "span",
                {"class": "resume"},
                "↻ resumes ",
                el("a", {"href": f"#run-{run.resumed_from_run_id}"}, run.resumed_from_run_id),
            )
        )
    for later in resumed_by.get(run.id, ()):
        resume.append(
            el(
                "span",
                {"class": "resume"},
                "→ resumed by ",
                el("a", {"href": f"#run-{later.id}"}, later.id),
            )
        )
    kids = [c for c in children.get(run.id, ()) if c.id not in seen]
    sub = (
        el("ul", None, [_run_item(sid, c, children, resumed_by, seen) for c in kids])
        if kids
        else None
    )
    return el(
        "li",
        {"class": "run", "id": f"run-{run.id}", "data-run-id": run.id},
        el(
            "div",
            {"class": "run-line"},
            _badge(run.status),
            _name_and_id(_run_name(run), run.id),
            el("span", {"class": "stat"}, _run_duration(run)),
            el("span", {"class": "stat tokens"}, f"{_count(tin)} in / {_count(tout)} out"),
            el("span", {"class": "stat cost"}, _cost(_run_cost(run))),
            el("span", {"class": "stat"}, f"{_count(run.turns)} turns") if run.turns else None,
            resume,
        ),
        el(
            "div",
            {"class": "run-links"},
            el(
                "a",
                {"href": f"#call-{run.parent_call_id}", "class": "parent-call"},
                f"started by call {run.parent_call_id}",
            )
            if run.parent_call_id
            else None,
            el(
                "a",
                {
                    "href": f"{ui_path('sessions', sid)}?{_query({'run': run.id})}",
                    "class": "run-filter",
                },
                "its turns",
            ),
        ),
        el("div", {"class": "prompt"}, _clip(run.prompt, 300)) if run.prompt else None,
        _run_error(run),
        sub,
    )


def _run_error(run: SessionRun) -> Html | None:
    """The run's error line and what its ``RunErrorDetail`` adds."""
    detail = run.error_detail
    if run.error is None and detail is None:
        return None
    facts: list[tuple[str, Node]] = []
    if detail is not None:
        facts = [
            (name, value)
            for name, value in (
                ("status", str(detail.status_code) if detail.status_code is not None else None),
                ("code", detail.code),
                ("message", detail.message),
                ("provider says", detail.provider_message),
                (
                    "retry after",
                    _duration(detail.retry_after_ms) if detail.retry_after_ms is not None else None,
                ),
                ("resets", _when(detail.reset_at, zone=True) if detail.reset_at else None),
            )
            if value
        ]
    return el(
        "div",
        {"class": "run-error"},
        run.error,
        _facts(facts) if facts else None,
    )


def _run_tree(sid: str, runs: Sequence[SessionRun]) -> Html:
    ordered = sorted(runs, key=lambda r: (r.started_at, r.id))
    ids = {r.id for r in ordered}
    children: dict[str, list[SessionRun]] = {}
    resumed_by: dict[str, list[SessionRun]] = {}
    roots: list[SessionRun] = []
    for run in ordered:
        if (
            run.parent_run_id is not None
            and run.parent_run_id in ids
            and run.parent_run_id != run.id
        ):
            children.setdefault(run.parent_run_id, []).append(run)
        else:
            roots.append(run)
        if run.resumed_from_run_id is not None:
            resumed_by.setdefault(run.resumed_from_run_id, []).append(run)
    seen: set[str] = set()
    items = [_run_item(sid, r, children, resumed_by, seen) for r in roots]
    # Runs caught in a parent cycle have no root: list them flat rather than lose them.
    items += [_run_item(sid, r, children, resumed_by, seen) for r in ordered if r.id not in seen]
    return el("ul", {"class": "run-tree"}, items)


def _totals(runs: Sequence[SessionRun]) -> Html | None:
    """The session's tokens and cost over all its runs (subagents included)."""
    if not runs:
        return None
    tokens = [_run_tokens(r) for r in runs]
    costs = [c for c in (_run_cost(r) for r in runs) if c is not None]
    tin = sum(t[0] or 0 for t in tokens)
    tout = sum(t[1] or 0 for t in tokens)
    return el(
        "p",
        {"class": "totals"},
        el("strong", None, "Session total: "),
        el("span", {"class": "key key-in"}),
        f" {tin:,} tokens in  ",
        el("span", {"class": "key key-out"}),
        f" {tout:,} tokens out  ",
        el("span", {"class": "key key-cost"}),
        f" {_cost(sum(costs)) if costs else '–'}",
        f" across {len(runs):,} runs",
    )


def _bar(cls: str, x: int, y: float, width: int, height: float) -> Html:
    """One bar of a chart: an SVG ``rect`` with its coordinates at two decimals."""
    return el(
        "rect",
        {"class": cls, "x": x, "y": f"{y:.2f}", "width": width, "height": f"{height:.2f}"},
    )


def _chart(runs: Sequence[SessionRun]) -> Html | None:
    """Bars of tokens (in + out, stacked) and cost per run, oldest first: inline SVG."""
    ordered = sorted(runs, key=lambda r: (r.started_at, r.id))[-CHART_RUNS:]
    if not ordered:
        return None
    tokens = [tuple(v or 0 for v in _run_tokens(r)) for r in ordered]
    costs = [_run_cost(r) or 0.0 for r in ordered]
    peak_tokens = max(a + b for a, b in tokens)
    peak_cost = max(costs)
    max_tokens = peak_tokens or 1  # the scale: all-zero bars stay flat
    max_cost = max(peak_cost, 0.0) or 1.0
    bar, gap, height, label_h = 18, 6, 80, 4
    width = max(len(ordered) * (bar + gap) + gap, 160)
    panels: list[Html] = []
    for kind, title in (("tokens", "tokens in / out"), ("cost", "cost (USD)")):
        shapes: list[Html] = []
        for i, run in enumerate(ordered):
            x = gap + i * (bar + gap)
            tip = f"{_run_name(run)} {run.id}: "
            if kind == "tokens":
                tin, tout = tokens[i]
                h_in = height * tin / max_tokens
                h_out = height * tout / max_tokens
                tip += f"{tin:,} in / {tout:,} out"
                bars = [
                    _bar("bar-in", x, height - h_in, bar, h_in),
                    _bar("bar-out", x, height - h_in - h_out, bar, h_out),
                ]
            else:
                h = height * max(costs[i], 0.0) / max_cost
                tip += _cost(_run_cost(run))
                bars = [_bar("bar-cost", x, height - h, bar, h)]
            shapes.append(el("g", {"data-run-id": run.id}, el("title", None, tip), bars))
        peak = f"max {peak_tokens:,}" if kind == "tokens" else f"max {_cost(peak_cost)}"
        if len(runs) > len(ordered):
            peak += f"; the last {len(ordered)} of {len(runs)} runs"
        panels.append(
            el(
                "figure",
                {"class": f"chart chart-{kind}"},
                el(
                    "svg",
                    {
                        "xmlns": "http://www.w3.org/2000/svg",
                        "viewBox": f"0 0 {width} {height + label_h}",
                        "width": width,
                        "height": height + label_h,
                        "role": "img",
                        "aria-label": f"{title} per run",
                    },
                    el("line", {"class": "axis", "x1": 0, "y1": height, "x2": width, "y2": height}),
                    shapes,
                ),
                el(
                    "figcaption",
                    None,
                    [
                        (el("span", {"class": f"key key-{k}"}), f" {k} ")
                        for k in (("in", "out") if kind == "tokens" else ())
                    ],
                    f"{title} per run ({peak})",
                ),
            )
        )
    return el("div", {"class": "charts"}, panels)


def _artifacts(artifacts: list[SessionArtifact] | None) -> Html:
    if artifacts is None:
        body: Node = el("p", {"class": "muted"}, "This store does not list artifacts.")
    elif not artifacts:
        body = el("p", {"class": "muted"}, "No artifacts.")
    else:
        rows = []
        for a in artifacts:
            link = safe_link(a.uri)
            target: Node = (
                el("a", {"href": link, "rel": "noopener noreferrer nofollow"}, a.label or a.uri)
                if link
                else el("span", None, a.label or a.uri)
            )
            rows.append(
                el(
                    "tr",
                    {"class": "artifact"},
                    el("td", None, el("code", None, a.kind)),
                    el("td", None, target),
                    el("td", None, el("code", {"class": "uri"}, a.uri)),
                    el("td", None, _when(a.updated_at)),
                )
            )
        body = el(
            "table",
            {"class": "artifacts"},
            el(
                "thead",
                None,
                el("tr", None, [el("th", None, h) for h in ("Kind", "Label", "URI", "Updated")]),
            ),
            el("tbody", None, rows),
        )
    return el("section", {"class": "artifacts"}, el("h2", None, "Artifacts"), body)


def render_session(page: SessionPage) -> Html:
    """One session: header, run tree and chart, one page of the transcript, artifacts."""
    meta = page.meta
    status = shown_status(meta, page.now)
    running = status == "running"
    title = session_title(meta.metadata, meta.first_user_turn) or meta.id
    owner = meta.run_owner
    facts: list[tuple[str, Node]] = [
        ("id", el("code", None, meta.id)),
        ("status", _badge(status)),
        ("agent", meta.agent_id or "–"),
        ("project", meta.project_root if meta.project_root is not None else "untagged"),
        ("created", _when(meta.created_at)),
        ("updated", _when(meta.updated_at)),
        ("turns", _count(meta.turn_count)),
        ("runs", _count(meta.run_count)),
    ]
    if owner is not None:
        facts.append(("run owner", f"{owner.host_id} pid {owner.pid}"))
    runs = el(
        "section",
        {"class": "runs"},
        el("h2", None, f"Runs ({len(page.runs)})"),
        _totals(page.runs),
        _chart(page.runs),
        _run_tree(meta.id, page.runs) if page.runs else el("p", {"class": "muted"}, "No runs."),
    )
    return el(
        "section",
        {
            "class": "page",
            "data-page": "session",
            "data-session-id": meta.id,
            "data-status": status,
            "data-poll": 2000 if running else None,
            "data-title": _clip(title, 80),
        },
        _nav(""),
        el("h1", None, title),
        _facts(facts),
        page.lineage,
        runs,
        page.timeline,
        _transcript(page, running),
        _artifacts(page.artifacts),
        el(
            "section",
            {"class": "metadata"},
            el("h2", None, "Metadata"),
            el("pre", None, _json_text(meta.metadata)),
        ),
    )
