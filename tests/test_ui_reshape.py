"""Reshaped histories in the session browser, in process: compaction folds, forks, branches.

A compaction shows as a fold ("N turns summarized", the summary turns, the
original turns one click away) planned from the page's own reads; a fork
links to its source and the turn, its source lists it; a session lists the
branches it left and each branch links back. The browser itself is
tests/test_ui_reshape_browser.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from test_ui import STORES, _client, _Tags

from zidane_actors.actors import open_session_host
from zidane_actors.errors import RemoteStoreError, UnsupportedOperationError
from zidane_actors.model import (
    BRANCH_OF_KEY,
    BRANCHES_KEY,
    COMPACTION_KEY,
    FORKED_FROM_KEY,
    SessionData,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    compaction_marker,
    to_builtins,
)
from zidane_actors.stores import fork_session, open_memory_store, store_capabilities

T0 = 1_750_000_000_000
EVIL = '<img src=x onerror="window.__xss=1"><script>alert(1)</script>"\'&'


def _say(i: int, text: str | None = None, role: str = "user", **fields: Any) -> SessionTurn:
    return SessionTurn(
        id=f"t{i}",
        role=role,
        content=(TextBlock(text=text if text is not None else f"original {i}"),),
        created_at=T0 + i,
        **fields,
    )


def _summary(*texts: str) -> list[SessionTurn]:
    return [
        SessionTurn(
            id=f"s{j}",
            role="assistant" if j % 2 else "user",
            content=(TextBlock(text=text),),
            created_at=T0,
        )
        for j, text in enumerate(texts)
    ]


def _marker(index: int, through: str, summary: Sequence[SessionTurn]) -> SessionTurn:
    return compaction_marker(summary, through=through, id=f"m{index}", created_at=T0 + index)


def compacted(
    sid: str, total: int, marks: dict[int, tuple[str, Sequence[SessionTurn]]], **fields: Any
) -> SessionData:
    """``total`` turns ``t{i}``; at each index of ``marks`` a marker (through, summary)."""
    turns = [
        _marker(i, *marks[i]) if i in marks else _say(i, role="user" if i % 2 == 0 else "assistant")
        for i in range(total)
    ]
    return SessionData(id=sid, created_at=T0, updated_at=T0 + total, turns=tuple(turns), **fields)


class _Reads:
    """A store that records its ``get_turns`` and ``load`` calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get_turns(self, sid: str, start: int, limit: int) -> list[SessionTurn]:
        self.calls.append(("get_turns", start, limit))
        turns: list[SessionTurn] = await self.inner.get_turns(sid, start, limit)
        return turns

    async def load(self, sid: str) -> SessionData | None:
        self.calls.append(("load",))
        data: SessionData | None = await self.inner.load(sid)
        return data


def _between(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def _turn_ids(fragment: str) -> list[str]:
    return re.findall(r'data-turn-id="([^"]+)"', fragment)


# -- compaction folds --------------------------------------------------------------


async def test_a_fold_shows_the_count_the_summary_and_the_originals_behind_one_click() -> None:
    summary = _summary("What was asked so far?", "The user planned a release in 30 turns.")
    data = compacted("c", 40, {32: ("t29", summary)})
    async with open_memory_store() as store, _client(store) as client:
        await store.save(data)
        page = (await client.get("/ui/fragments/sessions/c")).text
    fold = _between(page, '<section class="fold"', '<div class="turn-compaction"')
    assert 'id="fold-32"' in fold and 'data-fold-of="m32"' in fold
    assert "<strong>30 turns summarized</strong>" in fold
    assert "The user planned a release in 30 turns." in fold
    assert 'id="turn-32-summary-1"' in fold
    originals = _between(fold, '<details class="fold-originals">', "</details></section>")
    assert "<summary>Show the 30 original turns</summary>" in originals
    assert _turn_ids(originals) == [f"t{i}" for i in range(30)]
    assert "earlier pages" not in fold  # every original is on this page
    after = page[page.index('<div class="turn-compaction"') :]
    assert 'href="#fold-32"' in after and "stands for turns 1–30." in after
    # Turns after through, before the marker, stay in the open.
    between = page[page.index("</details></section>") : page.index('<div class="turn-compaction"')]
    assert _turn_ids(between) == ["t30", "t31"]
    assert _turn_ids(after) == ["m32", *[f"t{i}" for i in range(33, 40)]]


async def test_a_paged_fold_reads_one_page_and_links_to_the_earlier_originals() -> None:
    summary = _summary("recap please", "recap")
    async with open_memory_store() as inner:
        await inner.save(compacted("c", 260, {240: ("t229", summary)}))
        await inner.save(compacted("far", 260, {240: ("t150", summary)}))
        store = _Reads(inner)
        async with _client(store) as client:  # type: ignore[arg-type]
            page = (await client.get("/ui/fragments/sessions/c?from=200")).text
            assert store.calls == [("get_turns", 200, 108)]  # the page and its lookahead only
            assert "<strong>230 turns summarized</strong>" in page
            originals = _between(page, '<details class="fold-originals">', "</details>")
            assert _turn_ids(originals) == [f"t{i}" for i in range(200, 230)]
            assert 'href="/ui/sessions/c?from=0"' in originals
            assert "turns 1–200 are on earlier pages" in originals
            first = (await client.get("/ui/fragments/sessions/c")).text
            assert 'class="fold"' not in first  # its marker is on a later page

            store.calls.clear()
            page = (await client.get("/ui/fragments/sessions/far?from=200")).text
            assert store.calls == [("get_turns", 200, 108)]
            fold = _between(page, '<section class="fold"', "</section>")
            assert "<strong>The turns through t150 summarized</strong>" in fold
            assert "<details" not in fold.split('class="fold-summary"')[0]
            assert "The original turns, on earlier pages →" in fold
            assert _turn_ids(page.split("</section>", 2)[-1])[0] == "t200"


async def test_a_session_read_whole_counts_exactly_and_skips_a_marker_whose_through_is_gone() -> (
    None
):
    summary = _summary("recap")
    run = SessionRun(id="r1", prompt="go", started_at=T0, status="completed")
    data = compacted("c", 260, {240: ("t150", summary), 250: ("gone", summary)}, runs=(run,))
    async with open_memory_store() as store, _client(store) as client:
        await store.save(data)
        page = (await client.get("/ui/fragments/sessions/c?from=200")).text
    assert "<strong>151 turns summarized</strong>" in page
    assert "The 151 original turns, on earlier pages →" in page
    assert page.count('class="fold"') == 1
    assert 'class="turn role-command"' in page  # the marker naming no turn: an ordinary turn


async def test_nested_compactions_fold_inside_each_other() -> None:
    first, second = _summary("first recap"), _summary("second recap")
    data = compacted("n", 30, {10: ("t5", first), 20: ("t15", second)})
    async with open_memory_store() as store, _client(store) as client:
        await store.save(data)
        page = (await client.get("/ui/fragments/sessions/n")).text
    outer = page.index('id="fold-20"')
    inner = page.index('id="fold-10"')
    assert outer < inner < page.index('data-turn-id="t0"')
    assert "16 turns summarized" in page and "6 turns summarized" in page
    # The later summary is outermost; the earlier fold and its marker are among its originals.
    details = page.index('<details class="fold-originals">', outer)
    assert details < inner < page.index('id="turn-10"') < page.index('id="turn-15"')
    assert page.index('id="turn-20"') > page.index('id="turn-15"')


async def test_summary_turns_pair_their_calls_and_show_all_reads_the_marker() -> None:
    long = "L" * 40_000
    summary = [
        SessionTurn(
            id="s0",
            role="assistant",
            content=(ToolCallBlock(id="c9", name="grep", input={"q": "x"}),),
            created_at=T0,
        ),
        SessionTurn(
            id="s1",
            role="user",
            content=(ToolResultBlock(call_id="c9", output="found it"),),
            created_at=T0,
        ),
        SessionTurn(id="s2", role="assistant", content=(TextBlock(text=long),), created_at=T0),
    ]
    data = compacted("c", 6, {4: ("t2", summary)})
    async with open_memory_store() as store, _client(store) as client:
        await store.save(data)
        page = (await client.get("/ui/fragments/sessions/c")).text
        card = _between(page, 'id="call-c9"', "</article>")
        assert "found it" in card  # the result under its call, within the summary
        more = re.search(r'data-more="([^"]+summary=2[^"]*)"', page)
        assert more is not None
        url = more[1].replace("&amp;", "&")
        got = await client.get(url)
        assert got.status_code == 200 and "L" * 1000 in got.text
        bad = await client.get(url.replace("summary=2", "summary=9"))
        assert bad.status_code == 400
        bad = await client.get(url.replace("turns/4/", "turns/3/"))
        assert bad.status_code == 400  # no marker there


# -- ?turn= -----------------------------------------------------------------------


async def test_a_turn_link_opens_the_page_holding_it_marked() -> None:
    async with open_memory_store() as inner:
        await inner.save(compacted("c", 2_500, {}))
        store = _Reads(inner)
        async with _client(store) as client:  # type: ignore[arg-type]
            page = (await client.get("/ui/fragments/sessions/c?turn=t1234")).text
            assert "turns 1201–1300 of 2,500" in page
            assert 'class="turn role-assistant target" id="turn-1233"' not in page
            assert re.search(r'class="turn role-\w+ target" id="turn-1234"', page)
            # Found in batches of 1,000, then the page read.
            assert store.calls == [
                ("get_turns", 0, 1_000),
                ("get_turns", 1_000, 1_000),
                ("get_turns", 1_200, 108),
            ]
            missing = await client.get("/ui/fragments/sessions/c?turn=nope")
            assert missing.status_code == 404 and "has no turn nope" in missing.text


@pytest.mark.parametrize(
    "query",
    ["turn=..bad", "turn=a%2Fb", "turn=" + "x" * 501, "turn=%3Cscript%3E"],
)
async def test_a_bad_turn_query_answers_400(query: str) -> None:
    async with open_memory_store() as store, _client(store) as client:
        await store.save(compacted("c", 3, {}))
        r = await client.get(f"/ui/fragments/sessions/c?{query}")
        assert r.status_code == 400 and "Error 400" in r.text


# -- forks and branches -------------------------------------------------------------


async def _lineage_store(store: Any, evil: str = "") -> None:
    await store.save(
        SessionData(
            id="src",
            created_at=T0,
            updated_at=T0,
            turns=tuple(_say(i) for i in range(5)),
            metadata={"title": f"The source{evil}"},
        )
    )
    await fork_session(store, "src", "fork-a", at="t2", created_at=T0 + 50)
    await fork_session(store, "src", "fork-b", at=None, created_at=T0 + 60)
    await fork_session(store, "fork-a", "fork-a-a", at="t1", created_at=T0 + 70)


def _lineage(page: str) -> str:
    return _between(page, '<section class="lineage">', "</section>")


async def test_a_fork_links_to_its_source_and_the_source_lists_its_forks() -> None:
    async with open_memory_store() as store, _client(store) as client:
        await _lineage_store(store)
        source = _lineage((await client.get("/ui/fragments/sessions/src")).text)
        assert "Forks (2)" in source
        assert re.findall(r'<li data-session-id="([^"]+)"', source) == ["fork-a", "fork-b"]
        assert 'href="/ui/sessions/fork-a"' in source
        fork = _lineage((await client.get("/ui/fragments/sessions/fork-a")).text)
        assert "↱ Forked from" in fork
        assert 'href="/ui/sessions/src"' in fork and "<strong>The source</strong>" in fork
        assert 'href="/ui/sessions/src?turn=t2"' in fork
        assert "Forks (1)" in fork and 'data-session-id="fork-a-a"' in fork
        # The turn link opens the source's page at that turn.
        at = (await client.get("/ui/fragments/sessions/src?turn=t2")).text
        assert re.search(r'class="turn role-\w+ target" id="turn-2"', at)
        await store.delete("src")
        fork = _lineage((await client.get("/ui/fragments/sessions/fork-a")).text)
        assert "<code>src</code>" in fork and "(no longer stored)" in fork
        assert 'href="/ui/sessions/src"' not in fork
        plain = (await client.get("/ui/fragments/sessions/fork-a-a")).text
        assert "Forks (" not in plain


class _NoForks:
    """A store without ``list_forks``, or whose ``list_forks`` refuses (``refusal``)."""

    def __init__(self, inner: Any, refusal: Exception | None = None) -> None:
        self.inner = inner
        self.refusal = refusal

    def __getattr__(self, name: str) -> Any:
        if name == "list_forks" and self.refusal is None:
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def _refuse(self, source_id: str) -> list[str]:
        assert self.refusal is not None
        raise self.refusal


@pytest.mark.parametrize(
    "refusal",
    [
        None,
        UnsupportedOperationError("the server's store cannot list forks"),
        RemoteStoreError("GET /sessions/src/forks: not found", status=404, code="not_found"),
    ],
)
async def test_a_store_that_cannot_list_forks_shows_none(refusal: Exception | None) -> None:
    async with open_memory_store() as inner:
        await _lineage_store(inner)
        store = _NoForks(inner, refusal)
        if refusal is not None:
            store.list_forks = store._refuse  # type: ignore[attr-defined]
        async with _client(store) as client:  # type: ignore[arg-type]
            source = await client.get("/ui/fragments/sessions/src")
            fork = (await client.get("/ui/fragments/sessions/fork-a")).text
    assert source.status_code == 200 and 'class="lineage"' not in source.text
    assert "↱ Forked from" in fork and "Forks (" not in fork


def _branched(sid: str, evil: str = "") -> list[SessionData]:
    """``sid`` went back to t1 twice; each left branch kept as an archive."""
    archives = [
        SessionData(
            id=f"{sid}-left{k}",
            created_at=T0 + 100 * k,
            updated_at=T0 + 100 * k,
            turns=tuple(_say(i, f"left {k} turn {i}{evil}") for i in range(4 + k)),
            metadata={
                FORKED_FROM_KEY: {
                    "sessionId": sid,
                    "turnId": f"t{3 + k}",
                    "forkedAt": T0 + 100 * k,
                },
                BRANCH_OF_KEY: sid,
            },
        )
        for k in (1, 2)
    ]
    head = SessionData(
        id=sid,
        created_at=T0,
        updated_at=T0 + 300,
        turns=tuple(_say(i) for i in range(3)),
        metadata={
            "title": f"Went back{evil}",
            BRANCHES_KEY: [
                {"sessionId": a.id, "turnId": "t1", "createdAt": a.created_at, "turns": k + 2}
                for k, a in enumerate(archives, 1)
            ],
        },
    )
    return [head, *archives]


async def test_a_session_lists_its_left_branches_and_each_links_back() -> None:
    async with open_memory_store() as store, _client(store) as client:
        for data in _branched("b"):
            await store.save(data)
        page = (await client.get("/ui/fragments/sessions/b")).text
        section = _lineage(page)
        assert "Left branches (2)" in section and "Forks (" not in section  # archives not forks
        rows = re.findall(r'<tr class="branch" data-session-id="([^"]+)"', section)
        assert rows == ["b-left1", "b-left2"]
        assert 'href="/ui/sessions/b-left1"' in section
        assert 'href="/ui/sessions/b?turn=t1"' in section
        left = _lineage((await client.get("/ui/fragments/sessions/b-left2")).text)
        assert "↶ A branch left by" in left and 'href="/ui/sessions/b"' in left
        assert "<strong>Went back</strong>" in left
        assert 'href="/ui/sessions/b?turn=t1"' in left
        assert "↱ Forked from" not in left  # its origin is the session that left it


async def test_hostile_lineage_and_summaries_stay_text() -> None:
    hostile_meta = {
        FORKED_FROM_KEY: {"sessionId": EVIL, "turnId": EVIL, "forkedAt": T0},
        BRANCH_OF_KEY: EVIL,
        BRANCHES_KEY: [
            {"sessionId": EVIL, "turnId": EVIL, "createdAt": T0, "turns": 1},
            {"sessionId": 7, "turnId": None},
            "junk",
        ],
    }
    data = compacted("evil", 6, {4: ("t2", _summary(EVIL, EVIL))}, metadata=hostile_meta)
    raw = SessionTurn(  # a marker another writer stored: no id is checked there
        id="raw",
        role="command",
        content=(TextBlock(EVIL),),
        created_at=T0,
        metadata={COMPACTION_KEY: {"through": EVIL, "summary": [to_builtins(_say(9, EVIL))]}},
    )
    data = msgspec.structs.replace(data, turns=(*data.turns, raw))
    async with open_memory_store() as store, _client(store) as client:
        await store.save(data)
        for data in _branched("b", EVIL):
            await store.save(data)
        pages = [
            (await client.get(f"/ui/fragments/sessions/{sid}")).text
            for sid in ("evil", "b", "b-left1")
        ]
    for page in pages:
        parser = _Tags()
        parser.feed(page)
        tags = {tag for tag, _ in parser.tags}
        assert not tags & {"script", "img"}, tags
        assert not [a for _, attrs in parser.tags for a, _ in attrs if a.startswith("on")]
        assert EVIL in "".join(parser.text)
    assert "Left branches (1)" in pages[0]  # the malformed entries passed over
    # The raw marker's through names no turn before it (all read): an ordinary turn.
    assert pages[0].count('<section class="fold"') == 1 and 'data-turn-id="raw"' in pages[0]
    assert "?turn=" not in _lineage(pages[0])  # no link names an id that is no id
    assert 'href="/ui/sessions/b?turn=t1"' in pages[2]


@pytest.mark.parametrize("name", ["sqlite", "postgres", "remote"])
async def test_every_store_shows_folds_and_lineage_as_the_memory_store(name: str) -> None:
    async def pages(store: Any) -> list[str]:
        await _lineage_store(store)
        await store.save(compacted("c", 40, {32: ("t29", _summary("recap"))}))
        for data in _branched("b"):
            await store.save(data)
        async with _client(store) as client:
            return [
                (await client.get(f"/ui/fragments/sessions/{sid}")).text
                for sid in ("src", "fork-a", "c", "b", "b-left1")
            ]

    async with open_memory_store() as reference:
        expected = await pages(reference)
    async with STORES[name]() as store:
        got = await pages(store)
    if "list_forks" not in store_capabilities(store):  # then no page lists forks
        assert not any("Forks (" in p for p in got)
        forks = re.compile(
            r'<div class="forks">.*?</div>|<section class="lineage"><h2>[^<]*</h2></section>'
        )
        expected = [forks.sub("", forks.sub("", p)) for p in expected]
    cut = '<section class="artifacts">'
    assert [p.split(cut)[0] for p in got] == [p.split(cut)[0] for p in expected]


async def test_what_the_host_writes_shows_as_written() -> None:
    """Compaction, fork and branch through the session API, then the pages."""
    async with open_memory_store() as store, open_session_host(store) as host:
        s = await host.create_session(id="live", metadata={"title": "Live"})
        await s.append_turns(
            [_say(i, role="user" if i % 2 == 0 else "assistant") for i in range(6)]
        )
        await s.compact(_summary("recap of four"), through="t3")
        await s.append_turns([_say(7), _say(8, role="assistant")])
        fork = await host.fork_session("live", at="t8", id="live-fork")
        left = await s.branch("t7")
        async with _client(store) as client:
            page = (await client.get("/ui/fragments/sessions/live")).text
            forked = (await client.get(f"/ui/fragments/sessions/{fork.id}")).text
            archive = (await client.get(f"/ui/fragments/sessions/{left.session_id}")).text
            listed = (await client.get("/ui/fragments/sessions")).text
    assert "<strong>4 turns summarized</strong>" in page and "recap of four" in page
    assert _turn_ids(_between(page, '<details class="fold-originals">', "</details>")) == [
        "t0",
        "t1",
        "t2",
        "t3",
    ]
    section = _lineage(page)
    assert "Left branches (1)" in section and f'data-session-id="{left.session_id}"' in section
    assert 'href="/ui/sessions/live?turn=t7"' in section
    assert 'data-session-id="live-fork"' in section and "Forks (1)" in section
    assert "↱ Forked from" in forked and 'href="/ui/sessions/live?turn=t8"' in forked
    assert "4 turns summarized" in forked  # the fork keeps the marker, and so the fold
    assert "↶ A branch left by" in archive and 'href="/ui/sessions/live?turn=t7"' in archive
    # The list says which sessions are forks and which keep a left branch.
    rows = dict(re.findall(r'data-session-id="([^"]+)">(.*?)</tr>', listed))
    assert "↱ fork of live" in rows["live-fork"]
    assert "↶ branch left by live" in rows[left.session_id]
    assert "lineage-mark" not in rows["live"]
