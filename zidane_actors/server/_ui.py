"""The read-only session browser under ``/ui/``: routes and store reads.

The pages are a static shell (``/ui/``, ``/ui/sessions/{id}``,
``/ui/schedules``) plus the bundled JS and CSS; they hold no data, so they
are served without the bearer token. The script fetches the page's content
as a server-rendered HTML fragment from ``/ui/fragments/...`` with the
``Authorization`` header (the token it asked for once and keeps in
``sessionStorage``); fragments are guarded exactly like the JSON API.

Reads stay bounded per request: the list asks ``list_meta`` for
``offset + page + 1`` rows (growing the limit geometrically, up to a scan
cap, only while a status or text filter rejects rows), and a transcript page
is one ``get_turns(from, limit)`` call, or one ``load`` when the session has
runs (the protocol has no runs-only read). What a session page or a "show
all" reads counts against the server's body budget until the page is built
(see :class:`ReadBudget`): many views of a huge session at once are answered
503 ``busy`` beyond it, as bodies and answers are.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, Final

import attrs
import msgspec
from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import CorruptDataError, UnsupportedOperationError, ValidationError
from ..model import (
    ArtifactFilter,
    Schedule,
    ScheduleFire,
    SessionArtifact,
    SessionFilter,
    SessionMetaRow,
    SessionRun,
    SessionSearch,
    SessionSearchPage,
    SessionTurn,
    is_scope_session_id,
    preview,
    session_meta_row,
    validate_id,
)
from ..model._codec import encode_checked
from ..model._compaction import compaction_of
from ..stores import SessionStore, store_capabilities
from ..stores._validate import now_ms
from ._errors import ApiError
from ._html import Html
from ._limits import ReadBudget
from ._query import query_params
from ._ui_common import _query, render_error, session_title, shown_status
from ._ui_list import SessionsPage, filter_form, render_sessions
from ._ui_reshape import read_lineage, render_lineage
from ._ui_runs import RunTotals, Summary, render_summary, render_timeline, run_totals
from ._ui_schedules import render_schedules
from ._ui_session import SessionPage, last_page_start, long_text, render_more, render_session

__all__ = ["CONTENT_SECURITY_POLICY", "is_public_ui_path", "ui_routes"]

LIST_PAGE_SIZE: Final = 50
TURN_PAGE_SIZE: Final = 100
MORE_CHARS: Final = 1_000_000
"""Most characters of a long text one "show all" request sends (it links to the rest)."""
PAIRING_LOOKAHEAD: Final = 8
"""Turns read past a transcript page to find results of its last calls."""
ARTIFACTS_SHOWN: Final = 200
FIRES_SHOWN: Final = 10
STATUSES: Final = ("idle", "running", "stale", "completed", "error")
"""Statuses the list filters by; ``stale`` is a stored ``running`` whose owner is gone."""
DEFAULT_SCAN: Final = 20_000
"""Most sessions one filtered list request reads (status and title search filter the rows)."""
COUNT_LIMIT: Final = 10_000
"""Matches a ``search_meta`` list counts exactly; past it the page says "10,000+"."""
SORTS: Final = ("updated", "created")
RUN_SCAN: Final = 1_000
"""Most sessions one list request reads the runs of to find failed ones (``scan`` raises it)."""
SUMMARY_SESSIONS: Final = 500
"""Most sessions (the most recently updated that match) the summary page reads the runs of."""
SEARCH_BATCH: Final = 1_000
"""Most rows one ``search_meta`` call of a filtered list asks for."""
FIND_BATCH: Final = 1_000
"""Turns one ``get_turns`` call reads while finding the page of a turn (``?turn=``)."""

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS: Final = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
_STATIC: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_log = logging.getLogger("zidane_actors.server")

ErrorOf = Callable[[Exception, str | None], tuple[int, str]]
Keep = Callable[[SessionMetaRow], Awaitable[bool]]


_PUBLIC_PATH: Final = re.compile(
    r"/|/favicon\.ico|/ui/?|/ui/schedules|/ui/summary|/ui/sessions/[^/]+|/ui/static/[^/]+"
)


def is_public_ui_path(path: str) -> bool:
    """Whether ``path`` is a data-free page shell or asset (served without the token)."""
    return _PUBLIC_PATH.fullmatch(path) is not None


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("_ui_static", name).read_bytes()


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _html_response(body: str | bytes, status: int = 200) -> Response:
    if isinstance(body, str):  # a lone surrogate (text JavaScript clipped) is shown as U+FFFD
        body = _LONE_SURROGATE.sub("\ufffd", body).encode()
    return Response(
        body, status_code=status, media_type="text/html; charset=utf-8", headers=_SECURITY_HEADERS
    )


class _BadQuery(Exception):
    """A query parameter the page cannot use (answered 400 with the message)."""


def _param(request: Request, name: str, max_len: int = 500) -> str | None:
    raw = query_params(request).get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > max_len:
        raise _BadQuery(f"query parameter {name!r} is longer than {max_len} characters")
    return raw


def _path_count(raw: str, what: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        raise _BadQuery(f"{what} must be a non-negative integer")
    return int(raw)


def _param_count(request: Request, name: str, default: int, minimum: int) -> int:
    raw = query_params(request).get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12 or int(raw) < minimum:
        raise _BadQuery(f"query parameter {name!r} must be an integer ≥ {minimum}")
    return int(raw)


def _param_day(request: Request, name: str) -> datetime | None:
    raw = _param(request, name, 10)
    if raw is None:
        return None
    try:
        return datetime.strptime(raw, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise _BadQuery(f"query parameter {name!r} must be a date, YYYY-MM-DD") from None


def _ms(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp() * 1000)


@attrs.frozen
class ListQuery:
    """The session list's filters, order and page, parsed from the query string.

    ``start`` and ``end`` bound the ``dates`` field (``created`` or
    ``updated``) in epoch ms, ``end`` exclusive: the ``to`` date's whole day
    is in the range.
    """

    q: str | None = None
    agent: str | None = None
    project: str | None = None
    untagged: bool = False
    status: str | None = None
    failed: bool = False
    """Only sessions holding a failed run (their runs are read: see ``RUN_SCAN``)."""
    scopes: bool = False
    """Also list frameworks' internal scope sessions (left out by default)."""
    page: int = 1
    sort: str = "updated"
    dates: str = "updated"
    start: int | None = None
    end: int | None = None

    @classmethod
    def parse(cls, request: Request) -> ListQuery:
        status = _param(request, "status")
        if status is not None and status not in STATUSES:
            raise _BadQuery(f"status must be one of {', '.join(STATUSES)}")
        untagged = _param(request, "untagged")
        project = _param(request, "project", 4096)
        if untagged is not None and project is not None:
            raise _BadQuery("give a project root or untagged, not both")
        sort = _param(request, "sort") or "updated"
        dates = _param(request, "dates") or "updated"
        if sort not in SORTS or dates not in SORTS:
            raise _BadQuery(f"sort and dates must be one of {', '.join(SORTS)}")
        start, last = _param_day(request, "from"), _param_day(request, "to")
        if start is not None and last is not None and last < start:
            raise _BadQuery("the 'to' date is before the 'from' date")
        return cls(
            q=_param(request, "q"),
            agent=_param(request, "agent"),
            project=project,
            untagged=untagged is not None,
            status=status,
            failed=_param(request, "failed") is not None,
            scopes=_param(request, "scopes") is not None,
            page=_param_count(request, "page", 1, 1),
            sort=sort,
            dates=dates,
            start=_ms(start),
            end=_ms(None if last is None else last + timedelta(days=1)),
        )

    def _root(self) -> str | msgspec.UnsetType | None:
        if self.untagged:
            return None
        return UNSET if self.project is None else self.project

    def store_filter(self) -> SessionFilter:
        return SessionFilter(agent_id=self.agent, project_root=self._root())

    def search(self, offset: int, limit: int) -> SessionSearch:
        """The ``search_meta`` query of this page: every filter goes to the store."""
        created = self.dates == "created"
        return SessionSearch(
            text=self.q,
            agent_id=self.agent,
            project_root=self._root(),
            status="running" if self.status == "stale" else self.status,  # type: ignore[arg-type]
            order=self.sort,  # type: ignore[arg-type]
            limit=limit,
            offset=offset,
            count_limit=COUNT_LIMIT,
            created_from=self.start if created else None,
            created_to=self.end if created else None,
            updated_from=None if created else self.start,
            updated_to=None if created else self.end,
        )

    def shows(self, row: SessionMetaRow, now: int) -> bool:
        """The filters of a page's rows no store applies: scope sessions, running or stale."""
        if not self.scopes and is_scope_session_id(row.id):
            return False
        if self.status in ("running", "stale"):
            return shown_status(row, now) == self.status
        return True

    def keeps(self, row: SessionMetaRow, now: int) -> bool:
        """The filters ``list_meta`` cannot apply: status, dates and the title search."""
        if not self.shows(row, now):
            return False
        stored = self.status not in (None, "running", "stale")
        if stored and (row.status or "idle") != self.status:
            return False
        if self.start is not None or self.end is not None:
            at = row.created_at if self.dates == "created" else row.updated_at
            if at is None or (self.start is not None and at < self.start):
                return False
            if self.end is not None and at >= self.end:
                return False
        if self.q is not None:
            needle = self.q.casefold()
            title = session_title(row.metadata, row.first_user_turn)
            if needle not in title.casefold() and needle not in row.id.casefold():
                return False
        return True

    @property
    def row_filtered(self) -> bool:
        """Whether rows that ``search_meta`` answers are filtered further (see ``shows``)."""
        return not self.scopes or self.failed or self.status in ("running", "stale")

    @property
    def only_scopes_hidden(self) -> bool:
        """Whether scope sessions are the only rows left out of what ``search_meta`` answers."""
        return not self.scopes and not self.failed and self.status not in ("running", "stale")

    @property
    def post_filtered(self) -> bool:
        return (
            self.row_filtered
            or self.status is not None
            or self.q is not None
            or self.start is not None
            or self.end is not None
        )

    def params(self, request: Request) -> dict[str, str]:
        """The query parameters that make this list (for its links), page aside."""
        raw = {
            **self.filter_params(request),
            "sort": None if self.sort == "updated" else self.sort,
            "scan": query_params(request).get("scan") if self.post_filtered else None,
        }
        return {k: v for k, v in raw.items() if v is not None}

    def filter_params(self, request: Request) -> dict[str, str]:
        """This list's filters alone (what the summary page keeps), order and scan aside."""
        raw = {
            "q": self.q,
            "agent": self.agent,
            "project": self.project,
            "untagged": "1" if self.untagged else None,
            "status": self.status,
            "failed": "1" if self.failed else None,
            "scopes": "1" if self.scopes else None,
            "dates": None if self.dates == "updated" else self.dates,
            "from": _param(request, "from", 10),
            "to": _param(request, "to", 10),
        }
        return {k: v for k, v in raw.items() if v is not None}


@attrs.define(eq=False)
class _Reader:
    """The store reads behind the pages (each one bounded, see the module doc)."""

    store: SessionStore
    capabilities: frozenset[str]

    def _has(self, name: str) -> bool:
        return name in self.capabilities

    async def scan(
        self, filter: SessionFilter, keep: Keep, want: int, cap: int
    ) -> tuple[list[SessionMetaRow], bool]:
        """Up to ``want`` rows that ``keep`` accepts, in ``list_meta`` order.

        The answer says whether the scan stopped at ``cap`` rows read before
        finding ``want`` matches or reaching the end. The protocol has no
        offset, so each ``list_meta`` batch (``want`` rows, then ×4) re-reads
        the earlier rows (ids already seen are skipped). A store without
        ``list_meta`` is read as ``list`` ids, then one ``get_meta`` (or
        ``load``) per id.
        """
        matched: list[SessionMetaRow] = []
        if not self._has("list_meta"):
            ids = await self.store.list(filter)
            for sid in ids[:cap]:
                row = await self.meta(sid)
                if row is not None and await keep(row):
                    matched.append(row)
                    if len(matched) >= want:
                        return matched, False
            return matched, len(ids) > cap
        list_meta = self.store.list_meta  # type: ignore[attr-defined]
        seen: set[str] = set()
        limit = min(want, cap)
        while True:
            rows: list[SessionMetaRow] = await list_meta(
                msgspec.structs.replace(filter, limit=limit)
            )
            for row in rows:
                if row.id not in seen:
                    seen.add(row.id)
                    if await keep(row):
                        matched.append(row)
                        if len(matched) >= want:
                            return matched, False
            if len(rows) < limit:
                return matched, False
            if limit >= cap:
                return matched, True
            limit = min(limit * 4, cap)

    async def search(self, search: SessionSearch) -> SessionSearchPage | None:
        """``search_meta``'s answer; ``None`` when the store cannot search (a remote
        store's server may lack it: then it says so, and the list falls back)."""
        if not self._has("search_meta"):
            return None
        try:
            found: SessionSearchPage = await self.store.search_meta(search)  # type: ignore[attr-defined]
        except UnsupportedOperationError:
            return None
        return found

    async def search_scan(
        self, search: SessionSearch, keep: Keep, want: int, cap: int
    ) -> _Scanned | None:
        """Up to ``want`` rows of ``search`` that ``keep`` accepts, reading at most ``cap``.

        ``search_meta`` pages from offset 0 (``want`` rows, then ×4, at most
        ``SEARCH_BATCH`` a call); ``None`` when the store cannot search.
        """
        matched: list[SessionMetaRow] = []
        offset = 0
        limit = min(want, cap, SEARCH_BATCH)
        while True:
            found = await self.search(msgspec.structs.replace(search, offset=offset, limit=limit))
            if found is None:
                return None
            for row in found.rows:
                if not await keep(row):
                    continue
                matched.append(row)
                if len(matched) >= want:
                    return _Scanned(matched, False, False)
            offset += len(found.rows)
            if len(found.rows) < limit:
                return _Scanned(matched, False, True)
            if offset >= cap:
                return _Scanned(matched, True, False)
            limit = min(limit * 4, cap - offset, SEARCH_BATCH)

    async def meta(self, sid: str) -> SessionMetaRow | None:
        if self._has("get_meta"):
            row: SessionMetaRow | None = await self.store.get_meta(sid)  # type: ignore[attr-defined]
            return row
        data = await self.store.load(sid)
        return None if data is None else session_meta_row(data)

    async def page(
        self, meta: SessionMetaRow, start: int, limit: int
    ) -> tuple[list[SessionTurn], tuple[SessionRun, ...], int, tuple[SessionTurn, ...]]:
        """Turns ``start`` to ``start + limit``, the runs, the JSON bytes read for them,
        and every turn read (the whole session when it has runs, for the run timeline).

        The protocol has no runs-only read: a session with runs is one
        ``load`` (its turns sliced from it), one without is one ``get_turns``.
        """
        if meta.run_count == 0:
            turns: list[SessionTurn] = await self.store.get_turns(meta.id, start, limit)
            return turns, (), _json_size(turns), ()
        data = await self.store.load(meta.id)
        if data is None:
            return [], (), 0, ()
        read = _json_size(data.turns) + _json_size(data.runs)
        return list(data.turns[start : start + limit]), data.runs, read, data.turns

    async def find_turn(self, meta: SessionMetaRow, turn_id: str, reads: ReadBudget) -> int | None:
        """The index of turn ``turn_id``: ``get_turns`` batches from the first, each counted
        in ``reads`` and let go before the next (one batch held at a time)."""
        for start in range(0, meta.turn_count, FIND_BATCH):
            async with reads.hold(("find", meta.id, start)) as held:
                batch: list[SessionTurn] = await self.store.get_turns(meta.id, start, FIND_BATCH)
                held.add(_json_size(batch))
                found = next((k for k, t in enumerate(batch) if t.id == turn_id), None)
                if found is not None:
                    return start + found
                if len(batch) < FIND_BATCH:
                    break
        return None

    async def lineage(self, meta: SessionMetaRow) -> Html | None:
        """The page's "Forks and branches": metadata, source rows, the store's forks."""
        list_forks = self.store.list_forks if self._has("list_forks") else None  # type: ignore[attr-defined]
        found = await read_lineage(meta, self.meta, list_forks)
        return render_lineage(found)

    async def artifacts(self, sid: str) -> list[SessionArtifact] | None:
        if not self._has("list_artifacts"):
            return None
        found: list[SessionArtifact] = await self.store.list_artifacts(  # type: ignore[attr-defined]
            ArtifactFilter(session_id=sid, limit=ARTIFACTS_SHOWN)
        )
        return found

    async def schedules(self) -> list[tuple[Schedule, list[ScheduleFire]]] | None:
        if not self._has("list_schedules"):
            return None
        found: list[Schedule] = await self.store.list_schedules()  # type: ignore[attr-defined]
        out = []
        for schedule in found:
            fires: list[ScheduleFire] = []
            if self._has("list_schedule_fires"):
                fires = await self.store.list_schedule_fires(  # type: ignore[attr-defined]
                    schedule.id, FIRES_SHOWN
                )
            elif schedule.last_fire is not None:
                fires = [schedule.last_fire]
            out.append((schedule, fires))
        return out


@attrs.frozen
class _Listed:
    """One page of the session list as read: its rows and what the pager says."""

    rows: Sequence[SessionMetaRow]
    has_next: bool
    searched: bool
    """``search_meta`` answered (the list can sort and count)."""
    scanned: int | None = None
    total: int | None = None
    total_exact: bool = True
    total_at_most: bool = False


@attrs.frozen
class _Scanned:
    """What a filtered ``search_meta`` scan found: rows, and how far it read."""

    rows: list[SessionMetaRow]
    truncated: bool
    """It stopped at its cap, short of ``want`` rows and of the end."""
    complete: bool
    """It read every match of the search."""


def _json_size(values: Iterable[object]) -> int:
    """The JSON bytes of ``values``, one at a time (a measure that holds no copy)."""
    return sum(len(encode_checked(value)) for value in values)


@attrs.define(eq=False)
class _Ui:
    """The fragment handlers."""

    reader: _Reader
    error_of: ErrorOf
    reads: ReadBudget
    clock: Callable[[], int] = now_ms
    """Epoch ms a page is judged at: the stores' clock, as the run-claim rule reads it."""

    async def _runs(self, row: SessionMetaRow) -> tuple[SessionRun, ...] | None:
        """``row``'s runs: one ``load`` (no runs-only read), counted in the read budget;
        ``None`` when the session does not decode (a list names it, never fails for it)."""
        if row.run_count == 0:
            return ()
        if row.corrupt is not None:
            return None
        async with self.reads.hold(("page", row.id, 0)) as held:
            try:
                data = await self.reader.store.load(row.id)
            except CorruptDataError:
                return None
            if data is None:
                return ()
            held.add(_json_size(data.turns) + _json_size(data.runs))
            return data.runs

    async def _list(
        self,
        query: ListQuery,
        request: Request,
        totals: dict[str, RunTotals | None],
        size: int = LIST_PAGE_SIZE,
        *,
        whole: bool = False,
    ) -> _Listed:
        """The list page's rows: ``search_meta`` when it answers, else ``list_meta`` scans.

        Filters no store applies (running or stale, failed runs) read the matches
        from the first one, up to the scan cap; ``totals`` keeps the run totals
        read on the way. Scope sessions alone are left out of the store's own page
        (which may then show fewer rows), unless ``whole``: ``size`` rows that show.
        """
        now = self.clock()
        skip = (query.page - 1) * size
        want = skip + size + 1

        async def failed(row: SessionMetaRow) -> bool:
            if row.id not in totals:
                totals[row.id] = run_totals(await self._runs(row))
            return (totals[row.id] or RunTotals()).failed > 0

        async def shows(row: SessionMetaRow) -> bool:
            return query.shows(row, now) and (not query.failed or await failed(row))

        async def keeps(row: SessionMetaRow) -> bool:
            return query.keeps(row, now) and (not query.failed or await failed(row))

        default = RUN_SCAN if query.failed else DEFAULT_SCAN
        cap = max(_param_count(request, "scan", default, 1), want)
        if not query.row_filtered or (query.only_scopes_hidden and not whole):
            # Reading every match before the page would cost its offset.
            found = await self.reader.search(query.search(skip, size))
            if found is not None:
                more = skip + size < found.total or not found.total_exact
                rows = [row for row in found.rows if query.shows(row, now)]
                return _Listed(
                    rows=rows,
                    has_next=len(found.rows) == size and more,
                    searched=True,
                    total=found.total,
                    total_exact=found.total_exact,
                    total_at_most=query.only_scopes_hidden,
                )
        if query.row_filtered:
            scanned = await self.reader.search_scan(query.search(0, 1), shows, want, cap)
            if scanned is not None:
                listed = _Listed(
                    rows=scanned.rows[skip : skip + size],
                    has_next=len(scanned.rows) > skip + size,
                    searched=True,
                    scanned=cap if scanned.truncated else None,
                )
                if scanned.complete:
                    return attrs.evolve(listed, total=len(scanned.rows))
                return listed
        if query.sort != "updated":
            raise _BadQuery("this store lists sessions by update time only (no search_meta)")
        if not query.post_filtered:
            cap = want
        matched, truncated = await self.reader.scan(query.store_filter(), keeps, want, cap)
        return _Listed(
            rows=matched[skip : skip + size],
            has_next=len(matched) > skip + size,
            searched=False,
            scanned=cap if truncated and query.post_filtered else None,
        )

    async def sessions(self, request: Request) -> Html:
        query = ListQuery.parse(request)
        totals: dict[str, RunTotals | None] = {}
        listed = await self._list(query, request, totals)
        for row in listed.rows:  # the tokens, cost and failure columns
            if row.id not in totals:
                totals[row.id] = run_totals(await self._runs(row))
        page = SessionsPage(
            rows=tuple(listed.rows),
            has_next=listed.has_next,
            page=query.page,
            params=query.params(request),
            now=self.clock(),
            scanned=listed.scanned,
            total=listed.total,
            total_exact=listed.total_exact,
            total_at_most=listed.total_at_most,
            page_size=LIST_PAGE_SIZE,
            totals=totals,
            summary_query=_query(query.filter_params(request)),
        )
        return render_sessions(page, STATUSES, searchable=listed.searched)

    async def summary(self, request: Request) -> Html:
        """Runs, failures, tokens and cost per agent and per day over the filtered sessions.

        It reads the runs of at most ``SUMMARY_SESSIONS`` sessions (the most
        recently updated that match), one session at a time in the read budget.
        """
        query = attrs.evolve(ListQuery.parse(request), page=1)
        listed = await self._list(query, request, {}, size=SUMMARY_SESSIONS, whole=True)
        summary = Summary()
        for row in listed.rows:  # one session's runs held at a time
            summary.add(row, await self._runs(row))
        more = listed.has_next or listed.scanned is not None
        params = query.filter_params(request)
        list_url = "/ui/" + (f"?{_query(params)}" if params else "")
        return render_summary(
            summary,
            read=len(listed.rows),
            matched=listed.total if listed.total_exact and not listed.total_at_most else None,
            more=more,
            filters=filter_form(params, STATUSES, searchable=listed.searched, action="/ui/summary"),
            list_url=list_url,
        )

    async def session(self, request: Request) -> Html | tuple[int, Html]:
        sid = validate_id(request.path_params["sessionId"], what="session id")
        start = _param_count(request, "from", 0, 0)
        meta = await self.reader.meta(sid)
        if meta is None:
            return 404, render_error(404, f"No session {preview(sid)} in this store.")
        now = self.clock()
        target = _param(request, "turn")
        if target is not None:
            validate_id(target, what="turn id")
            index = await self.reader.find_turn(meta, target, self.reads)
            if index is None:
                return 404, render_error(404, f"Session {preview(sid)} has no turn {target}.")
            start = index // TURN_PAGE_SIZE * TURN_PAGE_SIZE
        elif "from" not in query_params(request) and shown_status(meta, now) == "running":
            start = last_page_start(meta.turn_count, TURN_PAGE_SIZE)  # follow the newest turns
        lineage = await self.reader.lineage(meta)
        async with self.reads.hold(("page", sid, start)) as held:
            turns, runs, read, every = await self.reader.page(
                meta, start, TURN_PAGE_SIZE + PAIRING_LOOKAHEAD
            )
            held.add(read)
            run_filter = _param(request, "run")
            shown = next((r for r in runs if r.id == run_filter), None)
            if shown is None and runs:  # the newest run
                shown = max(runs, key=lambda r: (r.started_at, r.id))
            artifacts = await self.reader.artifacts(sid)
            held.add(_json_size(artifacts or ()))
            page = SessionPage(
                meta=meta,
                turns=tuple(turns[:TURN_PAGE_SIZE]),
                lookahead=tuple(turns[TURN_PAGE_SIZE:]),
                start=start,
                page_size=TURN_PAGE_SIZE,
                runs=runs,
                artifacts=artifacts,
                now=now,
                run_filter=run_filter,
                timeline=render_timeline(shown, every, len(runs)) if runs else None,
                every=every,
                lineage=lineage,
                target=target,
            )
            return render_session(page)

    async def more(self, request: Request) -> Html | tuple[int, Html]:
        """The next piece of one long text (a block's, a tool input's or output's)."""
        sid = validate_id(request.path_params["sessionId"], what="session id")
        index = _path_count(request.path_params["index"], "turn index")
        start = _param_count(request, "from", 0, 0)
        block = _param_count(request, "block", 0, 0)
        part = _param_count(request, "part", -1, 0) if "part" in query_params(request) else None
        async with self.reads.hold(("turn", sid, index)) as held:
            found: list[SessionTurn] = await self.reader.store.get_turns(sid, index, 1)
            held.add(_json_size(found))
            if not found:
                return 404, render_error(404, f"Session {preview(sid)} has no turn #{index + 1}.")
            turn = found[0]
            if "summary" in query_params(request):  # a summary turn of a compaction marker
                summary = _param_count(request, "summary", 0, 0)
                compaction = compaction_of(turn)
                if compaction is None or summary >= len(compaction.summary):
                    raise _BadQuery("no such summary turn at that turn")
                turn = compaction.summary[summary]
            text = long_text(turn, block, part=part, tool_input="input" in query_params(request))
            if text is None:
                raise _BadQuery("no text at that block of the turn")
            query = dict(query_params(request))
            return render_more(text, start, MORE_CHARS, request.url.path, query)

    async def schedules(self, request: Request) -> Html:
        return render_schedules(await self.reader.schedules())

    def fragment(self, handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                result = await handler(request)
            except (_BadQuery, ValidationError) as exc:
                return _html_response(render_error(400, str(exc)), 400)
            except ApiError as exc:  # the body budget is spent: 503 busy, as for answers
                return exc.response()
            except Exception as exc:
                status, message = self.error_of(exc, request.path_params.get("sessionId"))
                if status >= 500 and status != 503:  # 503: the store is down, and says so
                    _log.exception("GET %s failed", request.url.path)
                return _html_response(render_error(status, message), status)
            if isinstance(result, tuple):
                return _html_response(result[1], result[0])
            return _html_response(result)

        return endpoint


def ui_routes(store: SessionStore, error_of: ErrorOf, reads: ReadBudget) -> list[Route]:
    """The ``/ui`` routes over ``store``; ``error_of`` maps an exception to (status, message);
    session pages count their reads in ``reads``."""
    ui = _Ui(reader=_Reader(store, store_capabilities(store)), error_of=error_of, reads=reads)
    shell = _asset("shell.html")

    async def page(request: Request) -> Response:
        return _html_response(shell)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(_asset(name), media_type=_STATIC[name], headers=_SECURITY_HEADERS)

    async def home(request: Request) -> Response:
        return Response(status_code=308, headers={"location": "/ui/"})

    async def favicon(request: Request) -> Response:
        return Response(status_code=308, headers={"location": "/ui/static/favicon.svg"})

    get = ["GET"]
    return [
        Route("/", home, methods=get),
        Route("/favicon.ico", favicon, methods=get),
        Route("/ui", home, methods=get),
        Route("/ui/", page, methods=get),
        Route("/ui/sessions/{sessionId}", page, methods=get),
        Route("/ui/schedules", page, methods=get),
        Route("/ui/summary", page, methods=get),
        Route("/ui/static/{name}", static, methods=get),
        Route("/ui/fragments/sessions", ui.fragment(ui.sessions), methods=get),
        Route("/ui/fragments/sessions/{sessionId}", ui.fragment(ui.session), methods=get),
        Route(
            "/ui/fragments/sessions/{sessionId}/turns/{index}/more",
            ui.fragment(ui.more),
            methods=get,
        ),
        Route("/ui/fragments/schedules", ui.fragment(ui.schedules), methods=get),
        Route("/ui/fragments/summary", ui.fragment(ui.summary), methods=get),
    ]
