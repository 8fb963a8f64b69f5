"""Reshaped histories on a session page: compaction folds, forks and left branches.

A compaction marker folds the turns it summarized: the page shows "N turns
summarized", the summary turns, and the original turns one click away (a
``<details>`` for those on the page, a link for those on earlier pages).
Folds are planned from the page's own turns: a marker whose ``through`` lies
before the page (and was not read) still folds, its count unknown.

A fork's page links to its source and the turn it was forked at; a source's
page lists its forks when the store can (``list_forks``); a session's page
lists the branches it left (its ``zidaneBranches``), and a branch's page
links back to the session that left it. Every value comes from stored
metadata another writer may have set: each is read by shape, ids are
checked before they become links, and text is escaped by :func:`el`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Final

import attrs

from ..errors import InvalidNameError, RemoteStoreError, UnsupportedOperationError
from ..model import (
    BRANCH_OF_KEY,
    Branch,
    ForkedFrom,
    SessionMetaRow,
    SessionTurn,
    branches_of,
    forked_from,
    validate_id,
)
from ..model._compaction import Compaction, compaction_of
from ._html import Html, Node, el, ui_path
from ._ui_common import _count, _query, _table, _when, session_title

__all__ = [
    "Fold",
    "Lineage",
    "fold_head",
    "folded",
    "lineage_mark",
    "page_folds",
    "read_lineage",
    "render_lineage",
    "turn_link",
]

FORKS_SHOWN: Final = 100
"""Most forks and left branches one page lists (it says how many more there are)."""


def turn_link(session_id: str, turn_id: str) -> str:
    """The page of ``session_id`` that holds turn ``turn_id`` (``?turn=``: found when opened)."""
    return f"{ui_path('sessions', session_id)}?{_query({'turn': turn_id})}"


# -- compaction folds -----------------------------------------------------------


@attrs.frozen
class Fold:
    """One compaction marker on the page and the turns it summarized."""

    index: int
    """The marker's turn index."""
    marker: SessionTurn
    compaction: Compaction
    through: int | None
    """The index of its ``through`` turn; ``None`` when that turn lies before the page
    and was not read (the count is then unknown)."""

    @property
    def summarized(self) -> int | None:
        """How many turns the summary stands for (every turn through ``through``)."""
        return None if self.through is None else self.through + 1


def page_folds(
    turns: Sequence[tuple[int, SessionTurn]],
    read: Iterable[tuple[int, SessionTurn]],
    *,
    whole: bool,
) -> dict[int, Fold]:
    """The folds of the markers among ``turns`` (index, turn), by marker index.

    ``read`` is every turn read with its index (the page's, or the whole
    session's), looked through only when a marker is on the page; ``whole``
    says it holds every turn before the page's. A marker folds when its
    ``through`` is an earlier turn; one whose ``through`` is not among those
    read folds with an unknown count, unless ``whole`` (then its ``through``
    is gone: it stays an ordinary turn, as for the model).
    """
    markers = [(i, t, c) for i, t in turns if (c := compaction_of(t)) is not None]
    if not markers:
        return {}
    positions = {turn.id: i for i, turn in read}
    folds: dict[int, Fold] = {}
    for index, turn, found in markers:
        through = positions.get(found.through)
        if through is None and whole:
            continue
        if through is not None and through >= index:
            continue
        folds[index] = Fold(index, turn, found, through)
    return folds


def folded(
    turns: Sequence[tuple[int, SessionTurn]],
    folds: Mapping[int, Fold],
    turn: Callable[[int, SessionTurn], Node],
    block: Callable[[Fold, Sequence[Node] | None], Node],
) -> list[Node]:
    """``turns`` drawn by ``turn``, those a fold summarized inside its ``block``.

    Every fold covers the turns from the first up to its ``through``, so
    folds nest: the one reaching furthest is outermost. ``block`` gets the
    drawn turns of the fold on this page, or ``None`` when they all lie
    before it.
    """
    order = sorted(folds.values(), key=lambda f: (-1 if f.through is None else f.through, f.index))

    def walk(entries: Sequence[tuple[int, SessionTurn]], rest: list[Fold]) -> list[Node]:
        if not rest:
            return [turn(i, t) for i, t in entries]
        outer, inner = rest[-1], rest[:-1]
        cut = -1 if outer.through is None else outer.through
        inside = [e for e in entries if e[0] <= cut]
        if not inside:
            return [block(outer, None), *walk(entries, inner)]
        return [block(outer, walk(inside, inner)), *walk(entries[len(inside) :], [])]

    return walk(turns, order)


# -- forks and branches ----------------------------------------------------------


@attrs.frozen
class Lineage:
    """What a session page says of the session's forks and branches."""

    session_id: str
    forked_from: ForkedFrom | None = None
    branch_of: str | None = None
    forks: tuple[str, ...] | None = None
    """Direct forks (left branches aside); ``None`` when the store cannot list them."""
    fork_count: int = 0
    branches: tuple[Branch, ...] = ()
    branch_count: int = 0
    rows: Mapping[str, SessionMetaRow | None] = attrs.field(factory=dict)
    """The rows of the sessions it names that were read (``None``: not in the store)."""

    @property
    def empty(self) -> bool:
        return (
            self.forked_from is None
            and self.branch_of is None
            and not self.forks
            and not self.branches
        )


async def read_lineage(
    meta: SessionMetaRow,
    row_of: Callable[[str], Awaitable[SessionMetaRow | None]],
    list_forks: Callable[[str], Awaitable[list[str]]] | None,
) -> Lineage:
    """``meta``'s lineage: its metadata read, the rows of its source and of the session that
    left it (one read each), and its direct forks when the store lists them."""
    origin = forked_from(meta.metadata)
    branch_of = meta.metadata.get(BRANCH_OF_KEY)
    if not isinstance(branch_of, str):
        branch_of = None
    branches = branches_of(meta.metadata)
    rows: dict[str, SessionMetaRow | None] = {}
    for sid in (origin.session_id if origin else None, branch_of):
        if sid is not None and sid not in rows and _is_id(sid):
            rows[sid] = await row_of(sid)
    forks: list[str] | None = None
    if list_forks is not None:
        try:
            listed = await list_forks(meta.id)
        except UnsupportedOperationError:  # a remote store whose server's store cannot
            listed = None
        except RemoteStoreError as exc:  # ... or a server from before forks (no such route)
            if exc.status != 404:
                raise
            listed = None
        if listed is not None:
            left = {b.session_id for b in branches}
            forks = [f for f in listed if isinstance(f, str) and f not in left]
    return Lineage(
        session_id=meta.id,
        forked_from=origin,
        branch_of=branch_of,
        forks=None if forks is None else tuple(forks[:FORKS_SHOWN]),
        fork_count=len(forks or ()),
        branches=tuple(branches[:FORKS_SHOWN]),
        branch_count=len(branches),
        rows=rows,
    )


def _is_id(value: str) -> bool:
    """Whether ``value`` is a safe id (one a link may name; metadata may hold anything)."""
    try:
        validate_id(value, what="id")
    except InvalidNameError:
        return False
    return True


def _session(sid: str, rows: Mapping[str, SessionMetaRow | None]) -> Node:
    """A link to session ``sid``: its title and id, or its id and "no longer stored"."""
    if not _is_id(sid):
        return el("code", None, sid)
    if sid in rows and rows[sid] is None:
        return [el("code", None, sid), el("span", {"class": "muted gone"}, " (no longer stored)")]
    row = rows.get(sid)
    title = session_title(row.metadata, row.first_user_turn) if row is not None else ""
    return el(
        "a",
        {"href": ui_path("sessions", sid), "class": "session-link"},
        [el("strong", None, title), " "] if title else None,
        el("code", None, sid),
    )


def lineage_mark(row: SessionMetaRow) -> Node:
    """What a listed session's id line adds: the session it is a branch or a fork of."""
    branch_of = row.metadata.get(BRANCH_OF_KEY)
    if isinstance(branch_of, str):
        return el("span", {"class": "lineage-mark"}, f" · ↶ branch left by {branch_of}")
    origin = forked_from(row.metadata)
    if origin is not None:
        return el("span", {"class": "lineage-mark"}, f" · ↱ fork of {origin.session_id}")
    return None


def _turn_a(sid: str, turn_id: str) -> Html:
    if not (_is_id(sid) and _is_id(turn_id)):
        return el("code", None, turn_id)
    return el("a", {"href": turn_link(sid, turn_id), "class": "turn-link"}, turn_id)


def _at_turn(sid: str, turn_id: str | None) -> Node:
    return None if turn_id is None else [" at turn ", _turn_a(sid, turn_id)]


def _more(shown: int, total: int, what: str) -> Node:
    if total <= shown:
        return None
    return el("p", {"class": "muted"}, f"and {total - shown:,} more {what} not listed")


def render_lineage(lineage: Lineage) -> Html | None:
    """The session page's "Forks and branches" section (nothing when it has none)."""
    if lineage.empty:
        return None
    lines: list[Node] = []
    origin = lineage.forked_from
    if lineage.branch_of is not None:
        row = lineage.rows.get(lineage.branch_of)
        listed = branches_of(row.metadata) if row is not None else ()
        entry = next((b for b in listed if b.session_id == lineage.session_id), None)
        lines.append(
            el(
                "p",
                {"class": "branch-of"},
                "↶ A branch left by ",
                _session(lineage.branch_of, lineage.rows),
                [" when it went back to turn ", _turn_a(lineage.branch_of, entry.turn_id)]
                if entry is not None
                else None,
                ".",
            )
        )
    if origin is not None and origin.session_id != lineage.branch_of:
        lines.append(
            el(
                "p",
                {"class": "forked-from"},
                "↱ Forked from ",
                _session(origin.session_id, lineage.rows),
                _at_turn(origin.session_id, origin.turn_id),
                ", ",
                _when(origin.forked_at, zone=True),
                ".",
            )
        )
    if lineage.forks:
        lines.append(
            el(
                "div",
                {"class": "forks"},
                el("h3", None, f"Forks ({lineage.fork_count:,})"),
                el(
                    "ul",
                    {"class": "fork-list"},
                    [el("li", {"data-session-id": f}, _session(f, {})) for f in lineage.forks],
                ),
                _more(len(lineage.forks), lineage.fork_count, "forks"),
            )
        )
    if lineage.branches:
        lines.append(_branch_table(lineage))
    return el("section", {"class": "lineage"}, el("h2", None, "Forks and branches"), lines)


def _branch_table(lineage: Lineage) -> Html:
    rows: list[Node] = []
    for b in lineage.branches:
        rows.append(
            el(
                "tr",
                {"class": "branch", "data-session-id": b.session_id},
                el("td", None, _session(b.session_id, {})),
                el("td", {"class": "num"}, _count(b.turns)),
                el("td", None, _turn_a(lineage.session_id, b.turn_id)),
                el("td", {"class": "wide"}, _when(b.created_at)),
            )
        )
    return el(
        "div",
        {"class": "branches"},
        el("h3", None, f"Left branches ({lineage.branch_count:,})"),
        el(
            "p",
            {"class": "muted"},
            "Turns this session left behind when it went back to an earlier turn, each kept "
            "as a session of its own.",
        ),
        _table(
            {"class": "branch-table"},
            [
                el("th", None, "Branch"),
                el("th", {"class": "num"}, "Turns"),
                el("th", None, "Went back to"),
                el("th", {"class": "wide"}, "Left"),
            ],
            rows,
        ),
        _more(len(lineage.branches), lineage.branch_count, "branches"),
    )


def fold_head(fold: Fold) -> str:
    """What a fold's head says: how many turns its summary stands for."""
    if fold.summarized is None:
        return f"The turns through {fold.compaction.through} summarized"
    return f"{fold.summarized:,} turn{'s' if fold.summarized != 1 else ''} summarized"
